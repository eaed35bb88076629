"""The TPU's start-up (mlm_pipeline/tpu_runtime.py), offline, on TPU machines made of files.

A script asking for a TPU must have PJRT's variables in its environment when TensorFlow is first
imported, and none under --no_tpu; a machine whose TPU cannot start must give one line, before
TensorFlow loads and before anything is written. Each case runs the script in a subprocess through
tests/fake_tpu_machine.py: a folder stands for the PCI devices Linux lists, a file for libtpu's
lock, a folder for the libtpu package, and the first `import tensorflow` is recorded instead of
done (a run that reached it without its line would end there, with status 0). No TPU is needed,
and none was at hand: what a real TPU does past these checks is not tested here.
"""

import json
import os
import re
import signal
import subprocess
import sys

import pytest
from helpers import REPO, documented_python, fake_tensorflow, subprocess_env
from refusals import refused

from mlm_pipeline import storage, tf_startup, tpu_runtime

# The least each script needs to reach its start-up (what follows is never reached here).
COMMANDS = {
    "run_mlm.py": ["--train_dataset", "shards/train", "--tokenizer", "tokenizer"],
    "run_classifier.py": ["--model_name_or_path", "model"],
}
V6E = "0x006f"
TPU7X = "0x0076"
# Devices every Google Cloud VM has, a TPU or not: Google's virtual NIC (gVNIC) and an Intel bridge.
OTHER_DEVICES = [("0x1ae0", "0x0042"), ("0x8086", "0x7192")]


def pci_devices(folder, chips, device_id):
    """A folder laid out as /sys/bus/pci/devices: the machine's other devices, and `chips` TPU
    chips of Google's vendor id with `device_id`."""
    devices = [*OTHER_DEVICES, *[("0x1ae0", device_id)] * chips]
    for index, (vendor, device) in enumerate(devices):
        address = folder / f"0000:00:{index + 4:02x}.0"
        address.mkdir(parents=True)
        (address / "vendor").write_text(vendor + "\n")
        (address / "device").write_text(device + "\n")
    return folder


@pytest.fixture
def machine(tmp_path):
    """A TPU VM with 8 v6e chips and the TPU set's libtpu package, its TPU free; the test changes
    what it needs. Returns (environment for the subprocess, the fake libtpu.so)."""
    packages = tmp_path / "packages"
    (packages / "libtpu").mkdir(parents=True)
    (packages / "libtpu" / "__init__.py").write_text("")
    library = packages / "libtpu" / "libtpu.so"
    library.write_bytes(b"not a shared library")
    env = subprocess_env()
    for name in (*tpu_runtime.PLUGIN_VARIABLES, "TF_XLA_FLAGS", "TPU_LOAD_LIBRARY"):
        env.pop(name, None)
    env.update(
        FAKE_PCI_DEVICES=str(pci_devices(tmp_path / "pci", 8, V6E)),
        FAKE_LIBTPU_LOCK_FILE=str(tmp_path / "libtpu_lockfile"),
        PYTHONPATH=str(packages),
        RECORD_TENSORFLOW_IMPORT=str(tmp_path / "tensorflow_import.json"),
        # where TensorFlow's held-back start-up log goes: a start ended at its import keeps it
        TMPDIR=str(tmp_path),
    )
    return env, library


def run_on(env, script, *args):
    command = [sys.executable, str(REPO / "tests" / "fake_tpu_machine.py"), script]
    command += [*COMMANDS[script], *map(str, args)]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def environment_at_import(env, script, *args):
    """The variables that decide how TensorFlow starts, as they stood when the script first
    imported it."""
    result = run_on(env, script, *args)
    record = env["RECORD_TENSORFLOW_IMPORT"]
    assert result.returncode == 0 and os.path.exists(record), result.stderr[-3000:]
    with open(record) as file:
        return json.load(file)


@pytest.mark.parametrize("script", sorted(COMMANDS))
def test_pjrt_variables_are_set_before_tensorflow_is_imported(machine, tmp_path, script):
    env, library = machine
    env["TF_XLA_FLAGS"] = "--tf_xla_auto_jit=2"  # the user's own flag stays
    seen = environment_at_import(env, script, "--output_dir", tmp_path / "out")
    assert seen == {
        "PJRT_DEVICE": "TPU",
        "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
        "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": str(library),
        "TF_XLA_FLAGS": "--tf_xla_auto_jit=2 --tf_mlir_enable_mlir_bridge=true",
    }
    assert not (tmp_path / "out").exists()


def test_a_value_the_user_set_is_kept(machine, tmp_path):
    env, _ = machine
    env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] = "/opt/libtpu.so"
    env["TF_XLA_FLAGS"] = "--tf_mlir_enable_mlir_bridge=false"  # the bridge, turned off
    seen = environment_at_import(env, "run_mlm.py", "--output_dir", tmp_path / "out")
    assert seen["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == "/opt/libtpu.so"
    assert seen["TF_XLA_FLAGS"] == "--tf_mlir_enable_mlir_bridge=false"


@pytest.mark.parametrize(
    "script, flag",
    [
        ("run_mlm.py", "--no_tpu"),
        ("run_mlm.py", "--multi_worker"),
        ("run_classifier.py", "--no_tpu"),
    ],
)
def test_no_tpu_sets_none_of_them(machine, tmp_path, script, flag):
    """On a TPU VM too: --no_tpu (and --multi_worker, which implies it) leaves PJRT unset and
    keeps TensorFlow's TPU build off the TPU."""
    env, _ = machine
    seen = environment_at_import(env, script, flag, "--output_dir", tmp_path / "out")
    assert seen == {"TPU_LOAD_LIBRARY": "0"}


def test_the_references_recipe_for_ones_own_code_starts_the_tpu_as_the_scripts_do(
    machine, tmp_path
):
    """docs/reference.md's recipe (tests/test_docs.py runs it off the TPU), run as it is on a TPU
    VM: PJRT's variables are set when TensorFlow is first imported."""
    env, library = machine
    blocks, _ = documented_python("docs/reference.md")
    (recipe,) = [block for block in blocks if "tpu_runtime.prepare_runtime" in block]
    (tmp_path / "recipe.py").write_text(recipe)
    command = [sys.executable, str(REPO / "tests" / "fake_tpu_machine.py"), tmp_path / "recipe.py"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(env["RECORD_TENSORFLOW_IMPORT"]) as file:
        assert json.load(file) == {
            "PJRT_DEVICE": "TPU",
            "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
            "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": str(library),
            "TF_XLA_FLAGS": "--tf_mlir_enable_mlir_bridge=true",
        }


def refused_on(env, tmp_path, script, *needles, args=()):
    """The script, asking for the TPU, refused as refusals.refused checks (one line, status 1, no
    traceback, nothing written), before TensorFlow was imported."""
    output = tmp_path / "out"
    line = refused(
        lambda *words: run_on(env, *words),
        script,
        [*args, "--output_dir", output],
        output,
        *needles,
    )
    assert not os.path.exists(env["RECORD_TENSORFLOW_IMPORT"])
    return line


@pytest.mark.parametrize("script", sorted(COMMANDS))
def test_no_tpu_attached_is_one_line(machine, tmp_path, script):
    env, _ = machine
    env["FAKE_PCI_DEVICES"] = str(pci_devices(tmp_path / "no_tpu", 0, V6E))
    refused_on(env, tmp_path, script, "no TPU is attached to this machine", "--no_tpu")


def test_tpu7x_is_named_as_one_tensorflow_cannot_drive(machine, tmp_path):
    env, _ = machine
    env["FAKE_PCI_DEVICES"] = str(pci_devices(tmp_path / "tpu7x", 4, TPU7X))
    refused_on(
        env, tmp_path, "run_mlm.py", "TPU7x (Ironwood)", "TensorFlow does not run", "--no_tpu"
    )


def test_missing_libtpu_points_at_the_tpu_set(machine, tmp_path):
    env, _ = machine
    env["HIDE_LIBTPU"] = "1"
    refused_on(
        env, tmp_path, "run_classifier.py", "libtpu is not installed", "requirements-tpu.txt"
    )


def test_a_tpu_held_by_another_process_names_it(machine, tmp_path):
    env, _ = machine
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_LOCK, env["FAKE_LIBTPU_LOCK_FILE"]],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        refused_on(env, tmp_path, "run_mlm.py", f"in use by process {holder.pid}", "HOLD_THE_LOCK")
        # told to share the TPU, libtpu skips its lock, and so does the check
        shared = {**env, "ALLOW_MULTIPLE_LIBTPU_LOAD": "true"}
        assert environment_at_import(shared, "run_mlm.py", "--output_dir", tmp_path / "out")
        os.remove(env["RECORD_TENSORFLOW_IMPORT"])
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # once the holder is gone, its stale lock file does not stop a run
    assert environment_at_import(env, "run_mlm.py", "--output_dir", tmp_path / "out")


# libtpu's lock as libtpu takes it (lockf on the file, held for the process's life)
HOLD_THE_LOCK = """HOLD_THE_LOCK = 1
import fcntl, os, sys, time
descriptor = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.lockf(descriptor, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(300)
"""


def test_libtpus_own_off_switch_is_named(machine, tmp_path):
    """libtpu reads TPU_LOAD_LIBRARY=0 (what the tests, and older advice, set) as "do not start"."""
    env, _ = machine
    env["TPU_LOAD_LIBRARY"] = "0"
    refused_on(env, tmp_path, "run_mlm.py", "TPU_LOAD_LIBRARY=0", "unset TPU_LOAD_LIBRARY")


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--tpu_name", "my-v4-32"], "--tpu_name my-v4-32"),
        (["--tpu_name", ""], "--tpu_name ''"),
        (["--tpu_zone", "us-central2-b", "--gcp_project", "p"], "--tpu_zone us-central2-b"),
    ],
)
def test_a_slice_or_node_by_name_is_refused(machine, tmp_path, flags, needle):
    env, _ = machine
    refused_on(env, tmp_path, "run_mlm.py", needle, "v6e-8", args=flags)


def test_a_plugin_that_does_not_load_gives_tensorflows_reason(machine, tmp_path):
    """TensorFlow really imported, with a libtpu.so that is no library: TensorFlow's own error in
    the one line, not its traceback."""
    env, library = machine
    del env["RECORD_TENSORFLOW_IMPORT"]
    output = tmp_path / "out"
    line = refused(
        lambda *words: run_on(env, *words),
        "run_mlm.py",
        ["--output_dir", output],
        output,
        f"could not load libtpu's PJRT plugin {library}",
        "file too short",
    )
    assert "TF_CPP_MIN_LOG_LEVEL=0" in line
    # the line names TensorFlow's start-up log, kept for it
    (kept,) = re.findall(r"TensorFlow's start-up log: (\S+);", line)
    assert os.path.dirname(kept) == str(tmp_path)
    assert os.path.getsize(kept) > 0  # what TensorFlow printed as it loaded


def test_a_crash_at_tensorflows_import_names_its_log(machine, tmp_path):
    """TensorFlow's import loads libtpu's plugin; on a TPU VM the failures reported there are
    segfaults and aborts (tensorflow #82208, #90807): the process dies, and the user is told where
    TensorFlow's log is, with its last words and the Python traceback."""
    env, _ = machine
    del env["RECORD_TENSORFLOW_IMPORT"]
    fake_tensorflow(env["PYTHONPATH"], SEGFAULTING_TENSORFLOW)
    result = run_on(env, "run_mlm.py", "--output_dir", tmp_path / "out")
    assert result.returncode == -signal.SIGSEGV, result.stderr[-3000:]
    (kept,) = re.findall(
        r"^the process ended during TensorFlow's start-up; TensorFlow's start-up log, shown "
        r"above, is kept in (\S+)$",
        result.stderr,
        re.MULTILINE,
    )
    log = open(kept).read()
    assert "No TPU platform registered" in log and "Fatal Python error: Segmentation fault" in log
    assert "import_tensorflow" in log  # tpu_runtime's frame, in faulthandler's traceback
    assert not (tmp_path / "out").exists()


# A TensorFlow whose import dies as the reported ones do: a line of its log, then SIGSEGV.
SEGFAULTING_TENSORFLOW = """
import os, signal
os.write(2, b"E0000 00:00:1795877719.181763  14190 pjrt_api.cc:74] No TPU platform registered\\n")
os.kill(os.getpid(), signal.SIGSEGV)
"""


def test_tensorflows_reason_comes_with_the_last_error_of_its_held_back_log():
    """TensorFlow's error for a TPU that does not start says little; libtpu's log line says why."""
    log_lines = [
        "I0000 00:00:1795877719.177678   14190 port.cc:153] oneDNN custom operations are on.",
        "E0000 00:00:1795877719.181763   14190 pjrt_api.cc:74] Failed to open /dev/vfio/0",
        "2026-11-28 14:50:33.051744: E tensorflow/core/tpu/tpu_initializer.cc:95] No TPU found",
        "2026-11-28 14:50:33.051907: I tensorflow/core/tpu/tpu_initializer.cc:121] Retrying",
    ]
    with tf_startup.stderr_held_back() as log:
        os.write(2, ("\n".join(log_lines) + "\n").encode())
        reason = tpu_runtime.tensorflow_reason(RuntimeError("TPU system init failed"), log)
    assert reason == "TPU system init failed; its log: No TPU found"


def test_the_storage_probe_starts_without_the_plugin(monkeypatch):
    """The Cloud Storage probe's child imports TensorFlow: with libtpu's plugin it would take the
    TPU the run is about to start."""
    for name in tpu_runtime.PLUGIN_VARIABLES:
        monkeypatch.setenv(name, "set by the run")
    started = []

    def run(command, env, **options):
        started.append(env)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(storage.subprocess, "run", run)
    storage.check_gcs_paths({"--output_dir": "gs://bucket/model"}, writable=["--output_dir"])
    (env,) = started
    assert not set(tpu_runtime.PLUGIN_VARIABLES) & set(env)
    assert env["TPU_LOAD_LIBRARY"] == "0"
