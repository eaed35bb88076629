"""The TPU's start-up (mlm_pipeline/tpu_runtime.py), offline, on TPU machines made of files.

A script asking for a TPU must have PJRT's variables in its environment when TensorFlow is first
imported, and none under --no_tpu; a machine whose TPU cannot start must give one line, before
TensorFlow loads and before anything is written. Each case runs the script in a subprocess through
tests/fake_tpu_machine.py: a folder stands for the PCI devices Linux lists, a file for libtpu's
lock, a folder for the libtpu package, a server on 127.0.0.1 for the VM's metadata server, a fake
cloud_tpu_client package for the Cloud TPU API, and the first `import tensorflow` is recorded
instead of done (a run that reached it without its line would end there, with status 0). No TPU is
needed, and none was at hand: what a real TPU, or a pod slice, does past these checks is not tested
here.
"""

import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import REPO, documented_python, fake_tensorflow, subprocess_env
from refusals import refused

from mlm_pipeline import hardware, storage, tf_startup, tpu_runtime, tpu_slice
from mlm_pipeline.errors import UsageError

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


# The TPU set's TensorFlow (requirements-tpu.txt) and the libtpu it pins.
TENSORFLOW_TPU = "2.19.1"
LIBTPU = tpu_runtime.PINNED_LIBTPU[TENSORFLOW_TPU]


def distribution(packages, name, version):
    """An installed distribution's record, as pip leaves it in site-packages (what
    importlib.metadata reads); a record of the same name is replaced."""
    for old in packages.glob(f"{name}-*.dist-info"):
        shutil.rmtree(old)
    record = packages / f"{name}-{version}.dist-info"
    record.mkdir(parents=True)
    (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


class MetadataServer(http.server.ThreadingHTTPServer):
    """The metadata server of a TPU VM, on 127.0.0.1: `answers` {attribute: text} as Compute
    Engine gives them to a request with the header Metadata-Flavor: Google, 404 otherwise;
    `requests`, the attributes asked for."""

    def __init__(self, answers):
        super().__init__(("127.0.0.1", 0), MetadataHandler)
        self.answers, self.requests = answers, []
        self.url = (
            f"http://127.0.0.1:{self.server_address[1]}/computeMetadata/v1/instance/attributes"
        )


class MetadataHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        key = self.path.rsplit("/", 1)[-1]
        self.server.requests.append(key)
        answer = self.server.answers.get(key)
        if self.headers.get("Metadata-Flavor") != "Google" or answer is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, *arguments):  # no request log on the test's output
        pass


# A single-host TPU VM's metadata: one host in worker-network-endpoints (name:id:address).
ONE_HOST = {
    "worker-network-endpoints": "t1v-n-5a1b-w-0:t1v-n-5a1b-w-0:10.130.0.2",
    "agent-worker-number": "0",
    "accelerator-type": "v6e-8",
}


@pytest.fixture
def metadata():
    """The VM's metadata server, answering as a single-host TPU VM's; the test changes answers."""
    server = MetadataServer(dict(ONE_HOST))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture
def machine(tmp_path, metadata):
    """A TPU VM with 8 v6e chips and the TPU set's tensorflow_tpu and libtpu packages, its TPU
    free, one host by its metadata server; the test changes what it needs. Returns (environment
    for the subprocess, the fake libtpu.so)."""
    packages = tmp_path / "packages"
    (packages / "libtpu").mkdir(parents=True)
    (packages / "libtpu" / "__init__.py").write_text("")
    library = packages / "libtpu" / "libtpu.so"
    library.write_bytes(b"not a shared library")
    distribution(packages, "libtpu", LIBTPU)
    distribution(packages, "tensorflow_tpu", TENSORFLOW_TPU)
    env = subprocess_env()
    for name in (
        *tf_startup.PJRT_VARIABLES,
        "TF_XLA_FLAGS",
        "TPU_LOAD_LIBRARY",
        *SLICE_VARIABLES,
    ):
        env.pop(name, None)
    env.update(
        FAKE_PCI_DEVICES=str(pci_devices(tmp_path / "pci", 8, V6E)),
        FAKE_LIBTPU_LOCK_FILE=str(tmp_path / "libtpu_lockfile"),
        FAKE_METADATA_URL=metadata.url,
        FAKE_TPU_RUNTIME_SERVICE=str(tmp_path / "tpu-runtime.service"),  # none unless written
        PYTHONPATH=str(packages),
        RECORD_TENSORFLOW_IMPORT=str(tmp_path / "tensorflow_import.json"),
        # where TensorFlow's held-back start-up log goes: a start ended at its import keeps it
        TMPDIR=str(tmp_path),
    )
    return env, library


# What else tells a process where its TPU is: GKE's slice variables, and the metadata server's host.
SLICE_VARIABLES = ("TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID", "TPU_SKIP_MDS_QUERY", "GCE_METADATA_IP")


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
    """A library of the user's own choosing (Google's recipes use the image's /lib/libtpu.so) is
    loaded as asked, with one warning that it is not the TPU set's."""
    env, library = machine
    image_library = tmp_path / "lib" / "libtpu.so"
    image_library.parent.mkdir()
    image_library.write_bytes(b"the image's libtpu")
    env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] = str(image_library)
    env["TF_XLA_FLAGS"] = "--tf_mlir_enable_mlir_bridge=false"  # the bridge, turned off
    result = run_on(env, "run_mlm.py", "--output_dir", tmp_path / "out")
    seen = json.loads(Path(env["RECORD_TENSORFLOW_IMPORT"]).read_text())
    assert seen["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == str(image_library)
    assert seen["TF_XLA_FLAGS"] == "--tf_mlir_enable_mlir_bridge=false"
    (warning,) = script_lines(result.stderr)
    assert warning.startswith("run_mlm.py: warning: TF_PLUGGABLE_DEVICE_LIBRARY_PATH=")
    assert str(image_library) in warning and str(library) in warning


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
def test_no_tpu_attached_is_one_line(machine, metadata, tmp_path, script):
    env, _ = machine
    env["FAKE_PCI_DEVICES"] = str(pci_devices(tmp_path / "no_tpu", 0, V6E))
    refused_on(env, tmp_path, script, "no TPU is attached to this machine", "--no_tpu")
    assert metadata.requests == []  # a machine without TPU chips never asks the metadata server


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
    "flags, needles",
    [
        (["--tpu_name", ""], ["--tpu_name ''", "names no TPU", "v6e-8"]),
        (["--tpu_name", "grpc://10.0.0.2:8470"], ["grpc://10.0.0.2:8470", "TPU node's route"]),
        (
            ["--tpu_zone", "us-central2-b", "--gcp_project", "p"],
            ["--tpu_zone us-central2-b --gcp_project p", "--tpu_name local", "v6e-8"],
        ),
    ],
)
def test_a_tpu_name_that_names_nothing_here_is_refused(machine, tmp_path, flags, needles):
    """No name, a TPU worker's address, or a zone and project for this VM's own TPU."""
    env, _ = machine
    refused_on(env, tmp_path, "run_classifier.py", *needles, args=flags)


# --------------------------------------------------------------------------------------------------
# A pod slice: trained from its worker 0 by Google's route (tpu_slice.py), or its host recognised.

SLICE = ["--tpu_name", "my-v5e-16", "--tpu_zone", "us-east1-c", "--gcp_project", "my-project"]
GCS_PATHS = ["--train_dataset", "gs://my-bucket/shards/train", "--output_dir", "gs://my-bucket/out"]
# The Cloud TPU API as cloud-tpu-client's Client gives it: each Client's arguments written to
# FAKE_CLOUD_TPU_RECORD, one JSON line each; the slice's runtime version from FAKE_RUNTIME_VERSION
# ("lookup fails": the client's error for a slice it cannot find).
FAKE_CLOUD_TPU_CLIENT = """import json, os


class Client:
    def __init__(self, tpu=None, zone=None, project=None, credentials="default", service=None,
                 discovery_url=None):
        with open(os.environ["FAKE_CLOUD_TPU_RECORD"], "a") as record:
            record.write(json.dumps({"tpu": tpu, "zone": zone, "project": project}) + "\\n")

    def runtime_version(self):
        version = os.environ.get("FAKE_RUNTIME_VERSION")
        if version == "lookup fails":
            raise ValueError("Could not lookup TPU metadata from name 'my-v5e-16'. Please "
                             "doublecheck the tpu argument in the TPUClusterResolver constructor.")
        return version
"""


def client_release():
    """X.Y.Z of the fake machine's TensorFlow (its tensorflow_tpu record), as the pod client reads
    it: tpu_slice.installed_tensorflow() takes the TPU build before the CPU build."""
    return tpu_slice.release(TENSORFLOW_TPU)


def another_release():
    """A TensorFlow release that is not the installed one."""
    return "2.18.0" if client_release() != "2.18.0" else "2.19.0"


@pytest.fixture
def cloud_tpu_api(machine, tmp_path):
    """The machine, with the fake cloud_tpu_client installed and the slice's image at this
    TensorFlow; returns (env, the file the Client calls are recorded in)."""
    env, _ = machine
    package = tmp_path / "packages" / "cloud_tpu_client"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "client.py").write_text(FAKE_CLOUD_TPU_CLIENT)
    record = tmp_path / "cloud_tpu_calls.jsonl"
    env.update(
        FAKE_CLOUD_TPU_RECORD=str(record),
        FAKE_RUNTIME_VERSION=f"tpu-vm-tf-{client_release()}-pod-pjrt",
    )
    return env, record


@pytest.mark.parametrize("script", sorted(COMMANDS))
def test_a_pod_client_leaves_the_chips_to_the_workers(cloud_tpu_api, metadata, tmp_path, script):
    """--tpu_name SLICE: the client imports TensorFlow with TPU_LOAD_LIBRARY=0 and none of PJRT's
    variables (even those left in the environment), after the Cloud TPU API was asked for the
    slice in the zone and project given; it does not ask the metadata server whether this VM is a
    slice's host, and needs no libtpu."""
    env, record = cloud_tpu_api
    env.update(PJRT_DEVICE="TPU", TF_PLUGGABLE_DEVICE_LIBRARY_PATH="/lib/libtpu.so")
    env["HIDE_LIBTPU"] = "1"
    paths = GCS_PATHS if script == "run_mlm.py" else ["--output_dir", tmp_path / "out"]
    seen = environment_at_import(env, script, *SLICE, *paths)
    assert seen == {"TPU_LOAD_LIBRARY": "0", "TF_XLA_FLAGS": "--tf_mlir_enable_mlir_bridge=true"}
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert calls == [{"tpu": "my-v5e-16", "zone": "us-east1-c", "project": "my-project"}]
    assert metadata.requests == []


def test_readmes_pod_command_passes_the_command_line_checks():
    """The command README gives for worker 0 of a slice is one the local-path check lets through."""
    import run_mlm

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("**A TPU pod slice**", 1)[1].split("\n**", 1)[0]
    command = re.search(r"python run_mlm\.py (.+?)\n *```", section, re.DOTALL).group(1)
    settings = run_mlm.parse_args(command.replace("\\\n", " ").split())
    assert settings.hardware.tpu_name == "my-slice"
    assert settings.data.train_dataset[0].startswith("gs://")


def test_the_resolver_is_given_the_slice_its_zone_and_project(monkeypatch):
    """hosts.tpu_strategy's TPUClusterResolver, spied: the slice's name, zone and project; a slice
    it cannot resolve is one line with the resolver's reason."""
    import tensorflow as tf

    from mlm_pipeline import hosts

    asked = []

    class Resolver:
        def __init__(self, **arguments):
            asked.append(arguments)
            raise ValueError("Could not lookup TPU metadata from name 'my-v5e-16'.")

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", Resolver)
    slice_hardware = hardware.Hardware(
        tpu_name="my-v5e-16", tpu_zone="us-east1-c", gcp_project="my-project"
    )
    with pytest.raises(UsageError, match="Could not lookup TPU metadata from name 'my-v5e-16'"):
        hosts.tpu_strategy(slice_hardware)
    assert asked == [{"tpu": "my-v5e-16", "zone": "us-east1-c", "project": "my-project"}]


def test_a_pod_client_asked_again_after_tensorflow_loaded(monkeypatch):
    """prepare_runtime() asked again once TensorFlow is loaded (a notebook's second cell): with the
    client's environment it asks the Cloud TPU API no second time; with PJRT's variables,
    TensorFlow was loaded the wrong way, and that is one line."""
    import tensorflow  # noqa: F401

    monkeypatch.setattr(tpu_slice, "check_cloud_tpu_client", lambda tpu_name: None)
    monkeypatch.setattr(tpu_slice, "check_workers_tensorflow", pytest.fail)
    for name in tf_startup.PJRT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TPU_LOAD_LIBRARY", "0")
    slice_hardware = hardware.Hardware(tpu_name="my-v5e-16")
    tpu_runtime.prepare_runtime(slice_hardware)
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    with pytest.raises(UsageError, match="TensorFlow was imported before this process was set up"):
        tpu_runtime.prepare_runtime(slice_hardware)


@pytest.mark.parametrize(
    "runtime, service, needles",
    [
        (
            "tpu-vm-tf-{other}-pod-pjrt",
            None,
            ["TensorFlow {other} (its runtime version tpu-vm-tf-{other}-pod-pjrt)", "{client}"],
        ),
        (
            "v2-alpha-tpuv5",
            "TF_DOCKER_URL=gcr.io/cloud-tpu-v2-images/grpc_tpu_worker:tf-{other}-pjrt",
            ["TensorFlow {other} (the image of this host's TPU worker service", "{client}"],
        ),
        (
            "v2-alpha-tpuv5",
            None,
            ["cannot be told", "v2-alpha-tpuv5", "--version tpu-vm-tf-{client}-pod-pjrt"],
        ),
    ],
    ids=["runtime version", "worker service", "neither"],
)
def test_workers_on_another_tensorflow_are_named(
    cloud_tpu_api, tmp_path, runtime, service, needles
):
    """Client and workers must run the same TensorFlow: the slice's runtime version, else the
    image Google's CI gives each host's worker service, says the workers'; neither is a refusal."""
    env, _ = cloud_tpu_api
    versions = {"other": another_release(), "client": client_release()}
    env["FAKE_RUNTIME_VERSION"] = runtime.format(**versions)
    if service:
        with open(env["FAKE_TPU_RUNTIME_SERVICE"], "w") as unit:
            unit.write(f'[Service]\nEnvironment="{service.format(**versions)}"\n')
    needles = [needle.format(**versions) for needle in needles]
    refused_on(env, tmp_path, "run_classifier.py", *needles, args=SLICE)


def test_a_slice_the_api_cannot_find_is_one_line(cloud_tpu_api, tmp_path):
    env, _ = cloud_tpu_api
    env["FAKE_RUNTIME_VERSION"] = "lookup fails"
    refused_on(
        env,
        tmp_path,
        "run_classifier.py",
        "the Cloud TPU API did not describe the slice (zone us-east1-c, project my-project)",
        "Could not lookup TPU metadata",
        "gcloud compute tpus tpu-vm list",
        args=SLICE,
    )


def test_a_pod_client_without_cloud_tpu_client_points_at_the_pod_set(cloud_tpu_api, tmp_path):
    env, _ = cloud_tpu_api
    env["HIDE_CLOUD_TPU_CLIENT"] = "1"
    refused_on(
        env,
        tmp_path,
        "run_classifier.py",
        "cloud-tpu-client",
        "requirements-tpu-google.txt",
        args=SLICE,
    )


@pytest.mark.parametrize(
    "paths, flag",
    [
        ([], "--train_dataset shards/train"),  # COMMANDS' local shards
        (["--train_dataset", "gs://my-bucket/shards/train"], "--output_dir"),  # refused_on's output
    ],
)
def test_a_slice_with_a_local_path_is_refused(cloud_tpu_api, tmp_path, paths, flag):
    """The slice's hosts read the shards and write the checkpoints: gs:// only, refused as the
    command line is read, before the Cloud TPU API is asked."""
    env, record = cloud_tpu_api
    refused_on(env, tmp_path, "run_mlm.py", flag, "cannot reach", "gs://", args=[*SLICE, *paths])
    assert not record.exists()


@pytest.mark.parametrize("worker, where", [("2", "on worker 0 (`gcloud"), ("0", "slice here")])
def test_a_host_of_a_multi_host_slice_is_told_the_pod_route(
    machine, metadata, tmp_path, worker, where
):
    """--tpu_name local on a host of a 4-host v5litepod-16, by its metadata server: one line, at
    once, instead of libtpu's wait for the other hosts."""
    env, _ = machine
    metadata.answers.update(
        {
            "worker-network-endpoints": ",".join(
                f"t1v-n-5a1b-w-{host}:t1v-n-5a1b-w-{host}:10.130.0.{host + 2}" for host in range(4)
            ),
            "agent-worker-number": worker,
            "accelerator-type": "v5litepod-16",
        }
    )
    refused_on(
        env,
        tmp_path,
        "run_mlm.py",
        f"this VM is worker {worker} of a 4-host TPU slice (v5litepod-16)",
        where,
        "--tpu_name and the slice's name",
        "README.md",
    )


def test_a_metadata_server_that_does_not_answer_is_not_waited_for(monkeypatch):
    """A server that takes the connection and never answers, and one that refuses it: no slice is
    seen, within the metadata timeout."""
    monkeypatch.setattr(tpu_slice, "METADATA_TIMEOUT", 0.5)
    for name in SLICE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as silent, socket.socket() as closed:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # connections queue, and nobody answers them
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        for server in (silent, closed):
            url = (
                f"http://127.0.0.1:{server.getsockname()[1]}/computeMetadata/v1/instance/attributes"
            )
            monkeypatch.setattr(tpu_slice, "METADATA_URL", url)
            started = time.monotonic()
            assert tpu_slice.slice_host() is None
            assert time.monotonic() - started < 1.5


def test_gke_says_it_without_the_metadata_server(monkeypatch):
    """On GKE, TPU_WORKER_HOSTNAMES lists the slice's hosts (JAX's GkeTpuCluster reads it)."""
    monkeypatch.setattr(tpu_slice, "METADATA_URL", "http://127.0.0.1:9/never/asked")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "host-0,host-1")
    monkeypatch.setenv("TPU_WORKER_ID", "1")
    assert tpu_slice.slice_host() == tpu_slice.SliceHost("1", 2, None)
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "host-0")
    assert tpu_slice.slice_host() is None


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
    for name in tf_startup.PJRT_VARIABLES:
        monkeypatch.setenv(name, "set by the run")
    started = []

    def run(command, env, **options):
        started.append(env)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(storage.subprocess, "run", run)
    storage.check_gcs_paths({"--output_dir": "gs://bucket/model"}, writable=["--output_dir"])
    (env,) = started
    assert not set(tf_startup.PJRT_VARIABLES) & set(env)
    assert env["TPU_LOAD_LIBRARY"] == "0"


def outcome_on(env, tmp_path, script="run_mlm.py"):
    """('started', its stderr lines) when the script reached TensorFlow's import, ('refused',
    its line) when it was refused as refusals.refused checks."""
    output = tmp_path / "out"
    result = run_on(env, script, "--output_dir", output)
    if result.returncode == 0 and os.path.exists(env["RECORD_TENSORFLOW_IMPORT"]):
        return "started", script_lines(result.stderr)
    return "refused", [refused_on(env, tmp_path, script)]


def script_lines(stderr):
    """The lines a script printed before a recorded import. The fake import ends the process
    inside the start-up's hold, so tf_startup's watcher says the process ended there: that line is
    the fake's doing, not the script's."""
    ended = "the process ended during TensorFlow's start-up"
    return [line for line in stderr.splitlines() if not line.startswith(ended)]


@pytest.mark.parametrize(
    "tensorflow_tpu, libtpu, expected, needles",
    [
        # each TPU set as it installs: not a word
        (TENSORFLOW_TPU, LIBTPU, "started", []),
        ("2.18.0", "2.18.0", "started", []),
        # JAX's newer libtpu over the set's: the known failure
        (TENSORFLOW_TPU, "0.0.30", "refused", ["libtpu 0.0.30", f"pins libtpu {LIBTPU}"]),
        # an older one, or one without its record: may work, said once
        (TENSORFLOW_TPU, "0.0.9", "warning", ["libtpu 0.0.9", f"libtpu=={LIBTPU}"]),
        (TENSORFLOW_TPU, None, "warning", ["unknown version", f"libtpu=={LIBTPU}"]),
        ("2.18.0", LIBTPU, "warning", [f"libtpu {LIBTPU}", "libtpu==2.18.0"]),
        # a TensorFlow no set installs: its libtpu cannot be checked
        ("2.20.0", "0.0.17", "warning", ["tensorflow_tpu 2.20.0", "libtpu 0.0.17"]),
    ],
)
def test_the_libtpu_tensorflow_will_load_is_the_one_its_set_pins(
    machine, tmp_path, tensorflow_tpu, libtpu, expected, needles
):
    env, library = machine
    packages = Path(env["PYTHONPATH"])
    distribution(packages, "tensorflow_tpu", tensorflow_tpu)
    if libtpu is None:
        shutil.rmtree(packages / f"libtpu-{LIBTPU}.dist-info")
    else:
        distribution(packages, "libtpu", libtpu)
    outcome, lines = outcome_on(env, tmp_path)
    if expected == "refused":
        assert outcome == "refused" and str(library) in lines[0], lines
    elif expected == "warning":
        assert outcome == "started" and len(lines) == 1, lines
        assert lines[0].startswith("run_mlm.py: warning: "), lines
    else:
        assert (outcome, lines) == ("started", []), lines
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def test_a_library_path_naming_no_file_is_refused(machine, tmp_path):
    """TensorFlow's import would raise OSError for it (load_pluggable_device_library)."""
    env, library = machine
    env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] = str(tmp_path / "no" / "libtpu.so")
    refused_on(
        env,
        tmp_path,
        "run_classifier.py",
        f"TF_PLUGGABLE_DEVICE_LIBRARY_PATH={tmp_path / 'no' / 'libtpu.so'} names no file",
        "unset TF_PLUGGABLE_DEVICE_LIBRARY_PATH",
        str(library),
    )


def test_a_library_path_to_the_sets_own_libtpu_says_nothing(machine, tmp_path):
    """Set by the user as keras-rs's CI sets it, through a link: the same file, so no warning."""
    env, library = machine
    link = tmp_path / "libtpu-link.so"
    link.symlink_to(library)
    env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] = str(link)
    assert outcome_on(env, tmp_path) == ("started", [])
