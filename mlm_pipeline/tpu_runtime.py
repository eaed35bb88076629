"""The TPU runtime: TensorFlow's TPU build started on a TPU VM by the route Google documents for
TPU v4, v5e, v5p and v6e (PJRT), or one line that says why it cannot start, before TensorFlow is
imported and before anything is written.

TensorFlow drives a current TPU through libtpu's PJRT plugin, which it loads while it is imported
(tensorflow/__init__.py reads TF_PLUGGABLE_DEVICE_LIBRARY_PATH), so the variables that ask for it
must be set before the first `import tensorflow`. Both scripts therefore call `prepare_runtime()`
once, first thing in main(), before they import their engine; hosts.build_strategy() then starts
the TPU (hosts.tpu_strategy). This module is part of the scripts' front: it imports TensorFlow in
one place alone, import_tensorflow(), once PJRT's variables are set. The variables (their names:
tf_startup.PJRT_VARIABLES) and their values follow the public record that requirements-tpu.txt
follows: keras-team/keras-rs sets them to run its TensorFlow tests on a v6e
(.github/workflows/actions.yml), and keras-io's examples/keras_rs/distributed_embedding_tf.py (v5p,
v6e) sets them before importing TensorFlow.

What would otherwise cost minutes of silence, or a page of TensorFlow's log, is checked first, in a
fraction of a second, from files Linux keeps: whether a TPU is attached at all (its PCI devices, as
JAX's jax/_src/hardware_utils.py finds them), whether it is one TensorFlow can drive (not TPU7x:
Google's TPU7x page says TensorFlow is not supported there), whether libtpu is installed, and
whether another process holds the TPU (libtpu's lock file), and whether this VM is one host of a
multi-host slice (its metadata server, tpu_slice.py), which --tpu_name local cannot start.

A multi-host slice is trained by Google's route for TensorFlow on a pod (tpu_slice.py): the script
runs once, on the slice's worker 0, with `--tpu_name SLICE`; this process is then the client of the
TPU workers every host runs, so it sets TPU_LOAD_LIBRARY=0 and none of PJRT's variables, checks that
the workers run its TensorFlow, and resolves the slice through the Cloud TPU API. None of this has
run on a TPU: no TPU was at hand.
"""

import fcntl
import importlib.metadata
import importlib.util
import os
import sys

from packaging.version import InvalidVersion, Version

from . import tpu_slice
from .errors import UsageError, tf_error_text
from .hardware import asks_for_tpu
from .tf_startup import PJRT_VARIABLES, keep_off_the_tpu, tensorflow_startup_log_held_back

# Where Linux lists PCI devices, each a folder with `vendor` and `device` files (a test points this
# at a folder of its own).
PCI_DEVICES = "/sys/bus/pci/devices"
# Google's PCI vendor id and its TPU chips' device ids, as JAX's hardware_utils.py lists them.
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_CHIPS = {"0x005e": "v4", "0x0062": "v5p", "0x0063": "v5e", "0x006f": "v6e"}
# TPU chips this runtime does not start: TPU7x, where Google supports JAX and PyTorch but not
# TensorFlow, and v3, older than the generations this pipeline is set up for.
OTHER_TPU_CHIPS = {"0x0076": "TPU7x (Ironwood)", "0x0027": "TPU v3"}
# The file libtpu locks for as long as a process holds the TPU (TryAcquireTpuLock in
# openxla/xla's xla/stream_executor/tpu/tpu_initialize_util.cc); a test points this elsewhere.
LIBTPU_LOCK_FILE = "/tmp/libtpu_lockfile"
# The TPU VMs this pipeline starts TensorFlow on, as gcloud names their accelerator types.
SINGLE_HOST_TYPES = "v4-8, v5litepod-8, v5p-8 or v6e-8"
# TensorFlow's MLIR bridge, which keras-rs and keras-io turn on for TPUs under PJRT.
MLIR_BRIDGE_FLAG = "--tf_mlir_enable_mlir_bridge=true"
# The libtpu release each TPU set installs with its TensorFlow's TPU build, as tensorflow_tpu's own
# requirement pins it: requirements-tpu.txt (tensorflow_tpu 2.19.1 asks for libtpu==0.0.10, on
# PyPI) and requirements-tpu-google.txt (2.18.0 asks for libtpu==2.18.0, on Google's index only).
# tests/test_tpu_sets.py checks that both files agree with it.
PINNED_LIBTPU = {"2.19.1": "0.0.10", "2.18.0": "2.18.0"}
NO_TPU_ADVICE = "pass --no_tpu to train on the GPUs or the CPU"
FULL_LOG_ADVICE = "TF_CPP_MIN_LOG_LEVEL=0 shows TensorFlow's whole log"


def prepare_runtime(hardware):
    """Get this process ready for TensorFlow, before anything imports it.

    Called once, by the scripts' main(), before they import their engine. When the Hardware group
    asks for the TPU (hardware.asks_for_tpu): with a slice's --tpu_name, get this process ready
    as the slice's client (prepare_slice_client). Otherwise refuse in one line what cannot start
    (no TPU, a TPU TensorFlow cannot drive, a host of a multi-host slice, no libtpu, a TPU held by
    another process), set PJRT's variables (a value the user set is kept), then import TensorFlow,
    which loads libtpu's plugin.

    Without: TensorFlow's TPU build is kept off the TPU, as steps 1 and 2 keep it
    (tf_startup.keep_off_the_tpu() says why).
    """
    if not asks_for_tpu(hardware):
        keep_off_the_tpu()
        return
    check_single_host(hardware.tpu_name, hardware.tpu_zone, hardware.gcp_project)
    if tpu_slice.is_named_slice(hardware.tpu_name):
        prepare_slice_client(hardware)
        return
    if "tensorflow" in sys.modules:
        if not os.environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH"):
            raise UsageError(
                "TensorFlow was imported before the TPU runtime was set up, so it cannot load "
                "libtpu's PJRT plugin: call mlm_pipeline.tpu_runtime.prepare_runtime() before "
                "importing TensorFlow, or run the script in a fresh process."
            )
        return  # set up before TensorFlow was imported, as keras-rs's CI does
    check_tpu_attached()
    tpu_slice.check_not_a_slice_host()  # asked only of a machine with TPU chips: no wait elsewhere
    library = libtpu_library()
    check_libtpu(library)
    # libtpu's own off switch, which its PJRT plugin reads too (the tests and older advice set it)
    if os.environ.get("TPU_LOAD_LIBRARY") == "0":
        raise UsageError(
            "TPU_LOAD_LIBRARY=0 is set, which tells libtpu not to start the TPU; unset it "
            f"(`unset TPU_LOAD_LIBRARY`) to train on the TPU, or {NO_TPU_ADVICE}."
        )
    if not shares_the_tpu():
        check_tpu_free()
    os.environ.update(pjrt_variables(os.environ, library))
    import_tensorflow(library)


def check_single_host(tpu_name, tpu_zone, gcp_project):
    """Which TPU the flags ask for, refused in one line where it is none this runtime starts:
    'local' is the TPU of the VM the script runs on; another name, a pod slice trained from its
    worker 0 (prepare_slice_client), which --tpu_zone and --gcp_project place for the Cloud TPU
    API. An empty name (TensorFlow would look a TPU up by TPU_NAME or this VM's metadata) and a
    worker's grpc:// address (a TPU node's route, not followed here) are refused, and so are
    --tpu_zone and --gcp_project without a slice's name, which would place nothing."""
    if not tpu_name:
        raise UsageError(
            f"--tpu_name {tpu_name!r} names no TPU: pass --tpu_name local (the default) to train "
            f"on this VM's TPU ({SINGLE_HOST_TYPES}), or a pod slice's name to train the slice "
            f"from its worker 0, or {NO_TPU_ADVICE}."
        )
    if "://" in tpu_name:
        raise UsageError(
            f"--tpu_name {tpu_name} is a TPU worker's address, a TPU node's route, which this "
            "pipeline does not follow: pass --tpu_name local (the default) on a TPU VM, or a pod "
            f"slice's name on the slice's worker 0, or {NO_TPU_ADVICE}."
        )
    named = {"--tpu_zone": tpu_zone, "--gcp_project": gcp_project}
    given = [f"{flag} {value}" for flag, value in named.items() if value is not None]
    if given and not tpu_slice.is_named_slice(tpu_name):
        raise UsageError(
            f"{' '.join(given)} places a pod slice for the Cloud TPU API, which --tpu_name local "
            f"(the TPU of the VM this runs on: {SINGLE_HOST_TYPES}) does not use: drop "
            f"{' and '.join(flag for flag, value in named.items() if value is not None)}, or give "
            "the slice's name with --tpu_name."
        )


def prepare_slice_client(hardware):
    """This process as the client of a pod slice's TPU workers, by Google's route (tpu_slice.py):
    cloud-tpu-client there, TPU_LOAD_LIBRARY=0 and none of PJRT's variables (a value the user
    left in the environment is removed: it would make this process start worker 0's chips, which
    the worker service holds), the MLIR bridge on as Google's CI turns it on for pods, the
    workers' TensorFlow the same as this one's; then TensorFlow imported, loading no TPU."""
    tpu_slice.check_cloud_tpu_client(hardware.tpu_name)
    if "tensorflow" in sys.modules:
        if os.environ.get("TPU_LOAD_LIBRARY") != "0" or any(map(os.environ.get, PJRT_VARIABLES)):
            raise UsageError(
                "TensorFlow was imported before this process was set up as the slice's client: "
                "call mlm_pipeline.tpu_runtime.prepare_runtime() before importing TensorFlow, or "
                "run the script in a fresh process."
            )
        return  # set up already, before TensorFlow was imported (a notebook asking again)
    for name in PJRT_VARIABLES:
        os.environ.pop(name, None)
    os.environ["TPU_LOAD_LIBRARY"] = "0"  # common.py's export_env_variables, for a pod
    os.environ["TF_XLA_FLAGS"] = with_mlir_bridge(os.environ.get("TF_XLA_FLAGS", ""))
    tpu_slice.check_workers_tensorflow(hardware.tpu_name, hardware.tpu_zone, hardware.gcp_project)
    import_tensorflow()  # no plugin to load: its log is shown if the import fails


def attached_tpu_chips():
    """{PCI device id: number of chips} of the TPU chips attached to this machine."""
    chips = {}
    try:
        devices = sorted(os.listdir(PCI_DEVICES))
    except OSError:
        return chips
    for device in devices:
        vendor, device_id = (read_word(PCI_DEVICES, device, name) for name in ("vendor", "device"))
        if vendor == GOOGLE_PCI_VENDOR and device_id in {**TPU_CHIPS, **OTHER_TPU_CHIPS}:
            chips[device_id] = chips.get(device_id, 0) + 1
    return chips


def read_word(*path):
    try:
        with open(os.path.join(*path), encoding="ascii") as file:
            return file.read().strip().lower()
    except (OSError, UnicodeDecodeError):
        return None


def check_tpu_attached():
    """One line, within a fraction of a second, when there is no TPU here that TensorFlow can
    drive: without this check, libtpu asks the TPU metadata server for minutes before failing."""
    chips = attached_tpu_chips()
    if any(device_id in TPU_CHIPS for device_id in chips):
        return
    for device_id in chips:
        why = (
            "TensorFlow does not run there (Google's TPU7x page: JAX and PyTorch only)"
            if device_id == "0x0076"
            else "this pipeline starts v4, v5e, v5p and v6e only"
        )
        raise UsageError(
            f"this machine's TPU chips are {OTHER_TPU_CHIPS[device_id]}: {why}; use a "
            f"{SINGLE_HOST_TYPES} TPU VM, or {NO_TPU_ADVICE}."
        )
    raise UsageError(
        f"no TPU is attached to this machine (no TPU chip among its PCI devices, {PCI_DEVICES}); "
        f"{NO_TPU_ADVICE}."
    )


def libtpu_library():
    """The path of libtpu.so in the installed `libtpu` package, found without importing it (its
    import sets TPU_LIBRARY_PATH) nor TensorFlow; a missing one is refused in one line."""
    spec = importlib.util.find_spec("libtpu")
    folders = (spec.submodule_search_locations or []) if spec else []
    libraries = [os.path.join(folder, "libtpu.so") for folder in folders]
    library = next((path for path in libraries if os.path.isfile(path)), None)
    if library is None:
        raise UsageError(
            "libtpu is not installed in this Python environment, so TensorFlow cannot drive the "
            "TPU (requirements.txt installs TensorFlow's CPU build): install the TPU set into a "
            "fresh virtualenv, `pip install --no-deps -r requirements-tpu.txt`, or "
            f"{NO_TPU_ADVICE}."
        )
    return library


def check_libtpu(library):
    """One line when the library TensorFlow will load is not the libtpu its TPU set pins: a path the
    user set in TF_PLUGGABLE_DEVICE_LIBRARY_PATH (Google's Vertex AI TPU recipe and older
    ml-auto-solutions tests point it at /lib/libtpu.so, a TensorFlow image's own), or another libtpu
    release in this environment (`pip install jax[tpu]` replaces the set's with JAX's, a newer
    one). A refusal where the combination is known to fail, a warning on stderr where it may work.

    Why a newer libtpu is refused: TensorFlow and libtpu talk through PJRT's C API, whose version
    each side is built with (xla/pjrt/pjrt_api.cc checks the plugin's against the framework's). A
    plugin older than the framework, within the API's compatibility window, is accepted; a newer
    one is what the public reports fail on. Kaggle/docker-python #1499 stopped installing
    tensorflow-tpu beside JAX's newer libtpu ("No TPU platform found"), where the same libtpu
    aborted torch_xla ("The plugin is likely built with a later version than the framework");
    jax-ml/jax #22416 and pytorch/xla #6949 show "Mismatched PJRT plugin PJRT API version" between
    a framework and a libtpu of other builds."""
    chosen = os.environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH")
    if chosen and not same_file(chosen, library):
        if not os.path.exists(chosen):
            # tensorflow/python/framework/load_library.py raises OSError at `import tensorflow`
            raise UsageError(
                f"TF_PLUGGABLE_DEVICE_LIBRARY_PATH={chosen} names no file, and TensorFlow would "
                "fail to import: unset it (`unset TF_PLUGGABLE_DEVICE_LIBRARY_PATH`) to use the "
                f"TPU set's libtpu ({library}), or {NO_TPU_ADVICE}."
            )
        warn(
            f"TF_PLUGGABLE_DEVICE_LIBRARY_PATH={chosen} is kept, so TensorFlow will load that "
            f"library, not the TPU set's libtpu ({library}); if the TPU does not start (\"No TPU "
            'platform found", "Mismatched PJRT plugin PJRT API version"), unset it.'
        )
        return
    tensorflow_version = distribution_version("tensorflow_tpu")
    libtpu_version = distribution_version("libtpu", os.path.dirname(os.path.dirname(library)))
    pinned = PINNED_LIBTPU.get(tensorflow_version)
    sets = ", ".join(f"tensorflow_tpu {tf} with libtpu {lib}" for tf, lib in PINNED_LIBTPU.items())
    if pinned is None:
        installed = (
            f"tensorflow_tpu {tensorflow_version}" if tensorflow_version else "no tensorflow_tpu"
        )
        warn(
            f"this environment has {installed}, which no TPU set of this pipeline installs "
            f"({sets}), so libtpu {libtpu_version or '(version unknown)'} is not checked against "
            "it; install requirements-tpu.txt into a fresh virtualenv if the TPU does not start."
        )
    elif libtpu_version != pinned:
        found = f"libtpu {libtpu_version}" if libtpu_version else "a libtpu of unknown version"
        problem = (
            f"this environment's libtpu ({library}) is {found}, but tensorflow_tpu "
            f"{tensorflow_version} pins libtpu {pinned}"
        )
        if newer(libtpu_version, pinned):
            raise UsageError(
                f"{problem}: a newer libtpu, as `pip install jax[tpu]` brings, speaks a newer "
                'PJRT API than this TensorFlow (the known road to "No TPU platform found"); '
                f"`pip install --no-deps libtpu=={pinned}` puts the TPU set's back (give JAX a "
                f"virtualenv of its own), or {NO_TPU_ADVICE}."
            )
        warn(f"{problem}; if the TPU does not start, `pip install --no-deps libtpu=={pinned}`.")


def same_file(path, other):
    try:
        return os.path.samefile(path, other)
    except OSError:
        return False


def distribution_version(name, folder=None):
    """The version of the installed distribution `name` (its dist-info, read without importing it),
    looked up in `folder` when given (where the package found was installed), else on sys.path;
    None when there is none."""
    found = importlib.metadata.distributions(name=name, path=[folder] if folder else sys.path)
    return next((distribution.version for distribution in found), None)


def newer(version, than):
    try:
        return version is not None and Version(version) > Version(than)
    except InvalidVersion:
        return False


def warn(message):
    """One line on stderr, as the scripts print their errors, for what may still work."""
    print(f"{os.path.basename(sys.argv[0])}: warning: {message}", file=sys.stderr, flush=True)


def shares_the_tpu():
    """Whether libtpu is told to skip its lock (TryAcquireTpuLock): forced to load, allowed to load
    in several processes, or given a part of the host's chips."""
    chips = os.environ.get("TPU_CHIPS_PER_PROCESS_BOUNDS") or os.environ.get(
        "TPU_CHIPS_PER_HOST_BOUNDS", ""
    )
    allowed = os.environ.get("ALLOW_MULTIPLE_LIBTPU_LOAD", "").lower() in ("1", "true")
    return os.environ.get("TPU_LOAD_LIBRARY") == "1" or allowed or chips not in ("", "2,2,1")


def check_tpu_free():
    """One line when another process holds the TPU: libtpu locks LIBTPU_LOCK_FILE for as long as
    its process lives, and a second process cannot start the TPU. The lock is tried, not taken: a
    process's locks on a file go when it closes any descriptor of it, so this runs only before
    TensorFlow (whose libtpu takes the lock) is loaded."""
    try:
        descriptor = os.open(LIBTPU_LOCK_FILE, os.O_RDWR)
    except FileNotFoundError:
        return
    except PermissionError:
        raise UsageError(
            f"the TPU is held by another user's process ({LIBTPU_LOCK_FILE} is not yours to "
            "lock): `sudo lsof -w /dev/accel0 /dev/vfio/*` names it; wait for it to end (if none "
            f"holds the TPU, `sudo rm {LIBTPU_LOCK_FILE}`), or {NO_TPU_ADVICE}."
        ) from None
    try:
        fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = lock_holder(descriptor)
        raise UsageError(
            f"the TPU is in use by {holder}, which holds libtpu's lock {LIBTPU_LOCK_FILE}; wait "
            f"for it to end or stop it, then run this again, or {NO_TPU_ADVICE}."
        ) from None
    finally:
        os.close(descriptor)


def lock_holder(descriptor):
    """'process PID (its command line)' of the process holding the lock on the open file, from
    /proc/locks; 'another process' when Linux does not say."""
    status = os.fstat(descriptor)
    file_id = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}:{status.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii") as locks:
            rows = [line.split() for line in locks]
    except OSError:
        rows = []
    pids = [row[4] for row in rows if len(row) > 5 and row[1] == "POSIX" and row[5] == file_id]
    if not pids:
        return "another process"
    try:
        with open(f"/proc/{pids[0]}/cmdline", "rb") as file:
            command = " ".join(file.read().decode(errors="replace").replace("\0", " ").split())
    except OSError:
        command = ""
    return f"process {pids[0]} ({command[:120]})" if command else f"process {pids[0]}"


def pjrt_variables(environ, library):
    """The variables that make TensorFlow drive the TPU through libtpu's PJRT plugin, as keras-rs's
    CI and keras-io's example set them; a value the user set is kept, and the MLIR bridge is added
    to their TF_XLA_FLAGS unless they set it either way."""
    # PJRT_VARIABLES in their order: the TPU as PJRT's device, through its C API, libtpu's plugin
    wanted = dict(zip(PJRT_VARIABLES, ("TPU", "true", library)))
    variables = {name: environ.get(name) or value for name, value in wanted.items()}
    variables["TF_XLA_FLAGS"] = with_mlir_bridge(environ.get("TF_XLA_FLAGS", ""))
    return variables


def with_mlir_bridge(flags):
    """TF_XLA_FLAGS with TensorFlow's MLIR bridge turned on, unless they set it either way."""
    if "--tf_mlir_enable_mlir_bridge" in flags:
        return flags
    return f"{flags} {MLIR_BRIDGE_FLAG}".strip()


def import_tensorflow(library=None):
    """Import TensorFlow, which loads the plugin `library` now: a plugin that does not load is one
    line with TensorFlow's own reason, instead of a traceback from wherever TensorFlow is first
    imported. Without a `library` (a slice's client, which loads none), a failed import is shown
    with TensorFlow's start-up log. The one place the front imports TensorFlow: the TPU's start."""
    with tensorflow_startup_log_held_back() as log:
        try:
            import tensorflow  # noqa: F401
        except Exception as error:
            if library is None or not type(error).__module__.startswith("tensorflow"):
                raise  # not the plugin: a broken install, shown with TensorFlow's log
            raise UsageError(
                f"TensorFlow could not load libtpu's PJRT plugin {library} "
                f"({tensorflow_reason(error, log)}); reinstall requirements-tpu.txt into a fresh "
                f"virtualenv ({log.named(FULL_LOG_ADVICE)}), or {NO_TPU_ADVICE}."
            ) from None


def tensorflow_reason(error, log):
    """TensorFlow's reason on one line: its error's first line, and the last error line of its
    held-back log (where libtpu and PJRT say what went wrong) when that adds something."""
    reason = tf_error_text(error)
    logged = log.last_error_line()
    if logged and logged not in reason:
        reason = f"{reason}; its log: {logged}"
    return reason[:400]
