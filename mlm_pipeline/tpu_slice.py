"""A TPU pod slice (more than one host): trained from its worker 0 by the route Google documents and
runs for TensorFlow, and recognised when a script is started on one of its hosts as if the host
were a TPU VM of its own.

Google's route (its "TPU software versions" page names `tpu-vm-tf-X.Y.Z-pod-pjrt` images for
multi-host slices; GoogleCloudPlatform/ml-auto-solutions runs TensorFlow 2.18 this way on v4-32,
v5e-16 and v5p-32 in dags/solutions_team/solutionsteam_tf_release_supported.py) is one client and
many workers. Every host of the slice runs the image's TPU worker service (`tpu-runtime`, a gRPC
server), all at one TensorFlow version: Google's CI rewrites each host's service to the image
`grpc_tpu_worker:tf-X.Y.Z-pjrt` and installs the same X.Y.Z in the client
(dags/solutions_team/configs/tensorflow/common.py, `set_up_pjrt` and `install_tf`). The training
script runs once, on worker 0 only (xlml/apis/task.py runs a pod's model command on worker 0), with
TPU_NAME set to the slice, TPU_LOAD_LIBRARY=0 and none of PJRT's variables (common.py,
`export_env_variables`): the client leaves the chips to the workers' service.
`TPUClusterResolver(tpu=SLICE, zone=..., project=...)` finds the hosts through the Cloud TPU API
with the cloud-tpu-client package (tensorflow/python/distribute/cluster_resolver/tpu/
tpu_cluster_resolver.py). Each host reads its own share of the data and the checkpoints are written
from the hosts, so data and output are on Cloud Storage. A client whose TensorFlow differs from its
workers' fails at initialize_tpu_system (tensorflow/tensorflow#40622).

tpu_runtime.prepare_runtime() calls the checks here. None of this has run on a TPU: no TPU was at
hand.
"""

import dataclasses
import importlib.util
import os
import re
import threading
import urllib.request
from importlib import metadata

from .errors import UsageError, first_line

LOCAL = "local"
# The Compute Engine metadata server's attributes of this VM, as JAX reads them
# (jax/_src/clusters/cloud_tpu_cluster.py: the host from GCE_METADATA_IP, else
# metadata.google.internal; the header Metadata-Flavor: Google). A test points this elsewhere.
METADATA_URL = (
    f"http://{os.environ.get('GCE_METADATA_IP', 'metadata.google.internal')}"
    "/computeMetadata/v1/instance/attributes"
)
# Seconds the metadata server has to answer. JAX waits up to a minute a try because it must find
# its cluster; here a server that does not answer at once only means no slice is seen, and the run
# goes on as on one host: a machine that is no TPU VM never waits.
METADATA_TIMEOUT = 3
# Seconds the Cloud TPU API has to describe the slice before the run is refused, not left waiting.
API_TIMEOUT = 120
# The unit of the TPU worker service on each host of a slice; Google's CI rewrites its image to
# grpc_tpu_worker:tf-X.Y.Z-pjrt (common.py, set_up_pjrt). A test points this elsewhere.
TPU_RUNTIME_SERVICE = "/etc/systemd/system/tpu-runtime.service"
POD_ROUTE = 'Google\'s pod route (README.md, "Several hosts")'
LIST_SLICES = "gcloud compute tpus tpu-vm list --zone ZONE"


def is_named_slice(tpu_name):
    """Whether --tpu_name names a slice for the Cloud TPU API, rather than this VM's own TPU."""
    return tpu_name != LOCAL


def check_paths_reach_the_hosts(tpu_name, paths):
    """With a slice's --tpu_name, every path in `paths` ({flag: path}, None when not given) must
    be on Cloud Storage. The slice's hosts run the TensorFlow ops that read the shards (one input
    pipeline a host) and write checkpoints and logs (once connected to the cluster, TensorFlow
    runs ops on its first worker by default: experimental_connect_to_cluster's
    make_master_device_default, tensorflow/python/eager/remote.py), inside each host's TPU worker
    service, which cannot reach a folder of the machine the script runs on. run_mlm.py passes its
    shards and output; run_classifier.py reads its examples and saves its model in the client
    process, and passes none."""
    if not tpu_name or "://" in tpu_name or not is_named_slice(tpu_name):
        return  # not a slice: check_single_host says what is wrong with the name
    for flag, path in paths.items():
        if path and not path.startswith("gs://"):
            raise UsageError(
                f"{flag} {path} is a path on this machine, which the hosts of slice {tpu_name} "
                "cannot reach (they read the shards and write the checkpoints themselves): give "
                f"a gs:// path, as {POD_ROUTE} does, or train on one host with --tpu_name local."
            )


def check_cloud_tpu_client(tpu_name):
    """One line when cloud-tpu-client, which TPUClusterResolver uses to look the slice up in the
    Cloud TPU API, is not installed (TensorFlow's own fallback client needs the same Google API
    packages, which no other requirement set installs)."""
    if importlib.util.find_spec("cloud_tpu_client") is None:
        raise UsageError(
            f"--tpu_name {tpu_name} reaches the slice through the Cloud TPU API, whose client "
            "(the cloud-tpu-client package) is not installed: on worker 0, install the pod set as "
            "requirements-tpu-google.txt says (it has cloud-tpu-client), or train on one host with "
            "--tpu_name local."
        )


def check_workers_tensorflow(tpu_name, tpu_zone, gcp_project):
    """One line unless the slice's TPU workers run the TensorFlow installed here (X.Y.Z; a release
    candidate counts as its release, as Google's CI pairs 2.18.0rc2 with tf-2.18.0 workers): the
    slice's runtime version (tpu-vm-tf-X.Y.Z-pod-pjrt) says which, or, on a base image whose
    worker service was set as Google's CI sets it, that service's image on this host. A version
    that cannot be told is refused too: the route is followed only where it is known to hold."""
    distribution, installed = installed_tensorflow()
    client = release(installed) if installed else None
    runtime = slice_runtime_version(tpu_name, tpu_zone, gcp_project)
    worker, source = workers_release(runtime)
    if client is None or worker is None:
        raise UsageError(
            f"the TensorFlow of slice {tpu_name}'s TPU workers cannot be told (its runtime version "
            f"{runtime or 'is not given'}; this host's {TPU_RUNTIME_SERVICE} names no "
            f"grpc_tpu_worker:tf-X.Y.Z image), and it must be this client's {distribution} "
            f"{installed or '(not installed)'}: create the slice with --version "
            f"tpu-vm-tf-{client or 'X.Y.Z'}-pod-pjrt, as {POD_ROUTE} does, or train on one host "
            "with --tpu_name local."
        )
    if client != worker:
        raise UsageError(
            f"slice {tpu_name}'s TPU workers run TensorFlow {worker} ({source}), this client "
            f"{distribution} {installed}: the two must be the same release (tensorflow#40622); "
            f"install {distribution}=={worker} here, or create the slice with --version "
            f"tpu-vm-tf-{client}-pod-pjrt."
        )


def installed_tensorflow():
    """(distribution, version) of the TensorFlow installed here, read without importing it: the
    TPU build (tensorflow-tpu) when there, else tensorflow; the version None when neither is."""
    for distribution in ("tensorflow-tpu", "tensorflow"):
        try:
            return distribution, metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "tensorflow", None


def release(version):
    """'X.Y.Z' of a version string ('2.18.0rc2' -> '2.18.0'); None if it has none."""
    found = re.match(r"(\d+\.\d+\.\d+)", version)
    return found.group(1) if found else None


def workers_release(runtime):
    """(X.Y.Z the slice's TPU workers run, where that was read), or (None, None): from the
    runtime version (tpu-vm-tf-X.Y.Z[-pod][-pjrt], Google's naming), else from this host's TPU
    worker service (grpc_tpu_worker:tf-X.Y.Z-pjrt, as Google's CI sets it on every host)."""
    found = re.match(r"tpu-vm-tf-(\d+\.\d+\.\d+)", runtime or "")
    if found:
        return found.group(1), f"its runtime version {runtime}"
    try:
        with open(TPU_RUNTIME_SERVICE, encoding="utf-8") as file:
            service = file.read()
    except (OSError, UnicodeDecodeError):
        return None, None
    found = re.search(r"grpc_tpu_worker:tf-(\d+\.\d+\.\d+)", service)
    if found:
        return found.group(1), f"the image of this host's TPU worker service, {TPU_RUNTIME_SERVICE}"
    return None, None


def slice_runtime_version(tpu_name, tpu_zone, gcp_project):
    """The slice's runtime version as the Cloud TPU API gives it (cloud-tpu-client's
    `Client.runtime_version()`, the node's `tensorflowVersion`), None when the API gives none. A
    slice that cannot be looked up, or an API that does not answer within API_TIMEOUT seconds, is
    one line."""
    from cloud_tpu_client import client

    where = f"zone {tpu_zone or 'of this VM'}, project {gcp_project or 'of this VM'}"
    try:
        return answered_within(
            API_TIMEOUT,
            lambda: client.Client(
                tpu=tpu_name, zone=tpu_zone, project=gcp_project
            ).runtime_version(),
        )
    except TimeoutError:
        reason = f"no answer within {API_TIMEOUT} s"
    except Exception as error:  # the client wraps the API's errors in ValueError, not always
        reason = first_line(error)[:240].rstrip(".")
    raise UsageError(
        f"--tpu_name {tpu_name}: the Cloud TPU API did not describe the slice ({where}): {reason}; "
        f"check its name with `{LIST_SLICES}`, and give --tpu_zone and --gcp_project when it is "
        "not in this VM's zone and project."
    )


@dataclasses.dataclass(frozen=True)
class SliceHost:
    """This VM as a host of a multi-host slice: its worker number (None when not said), the
    slice's host count, and its accelerator type (None when not said)."""

    worker: object
    hosts: int
    accelerator_type: object


def check_not_a_slice_host():
    """One line, at once, when --tpu_name local runs on a host of a multi-host slice: PJRT's libtpu
    would wait for the other hosts, and every host started so would write the same output."""
    host = slice_host()
    if host is None:
        return
    which = f"worker {host.worker}" if host.worker is not None else "a host"
    kind = f" ({host.accelerator_type})" if host.accelerator_type else ""
    there = (
        "here"
        if host.worker == "0"
        else "on worker 0 (`gcloud compute tpus tpu-vm ssh SLICE --zone ZONE --worker=0`)"
    )
    raise UsageError(
        f"this VM is {which} of a {host.hosts}-host TPU slice{kind}, and --tpu_name local starts "
        f"one host's chips, which would wait for the other hosts: train the slice {there} with "
        f"--tpu_name and the slice's name (`{LIST_SLICES}`), by {POD_ROUTE}; or use a "
        "single-host TPU VM."
    )


def slice_host():
    """A SliceHost when this VM is one of several hosts of a slice, else None (one host, or no
    answer). GKE's TPU pods say it in TPU_WORKER_HOSTNAMES and TPU_WORKER_ID, and JAX then skips
    the metadata server, as it does under TPU_SKIP_MDS_QUERY; a TPU VM's metadata server says it in
    `worker-network-endpoints` (one 'name:id:address' a host, comma-separated),
    `agent-worker-number` and `accelerator-type` (jax/_src/clusters/cloud_tpu_cluster.py)."""
    hostnames = os.environ.get("TPU_WORKER_HOSTNAMES")
    if hostnames is not None:
        hosts = [name for name in hostnames.split(",") if name.strip()]
        worker = os.environ.get("TPU_WORKER_ID")
        return SliceHost(worker, len(hosts), None) if len(hosts) > 1 else None
    if os.environ.get("TPU_SKIP_MDS_QUERY") is not None:
        return None
    endpoints = instance_attribute("worker-network-endpoints")
    hosts = [endpoint for endpoint in (endpoints or "").split(",") if endpoint.strip()]
    if len(hosts) < 2:
        return None
    worker = instance_attribute("agent-worker-number")
    accelerator_type = instance_attribute("accelerator-type")
    return SliceHost(worker and worker.strip(), len(hosts), accelerator_type)


def instance_attribute(key):
    """The metadata server's attribute `key` of this VM, or None when it does not give it within
    METADATA_TIMEOUT seconds (no metadata server, no such attribute). Never through a proxy: the
    server is this VM's own."""

    def read():
        request = urllib.request.Request(
            f"{METADATA_URL}/{key}", headers={"Metadata-Flavor": "Google"}
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=METADATA_TIMEOUT) as response:
            return response.read().decode("utf-8", errors="replace").strip()

    try:
        return answered_within(METADATA_TIMEOUT, read) or None
    except Exception:  # no answer is no slice seen: the run goes on as on one host
        return None


def answered_within(seconds, function):
    """function()'s value when it returns within `seconds`, its exception when it raises, else
    TimeoutError. The time bounds what a socket's timeout leaves out (a name lookup); a call that
    has not returned is left to a daemon thread, which the process does not wait for."""
    outcome = {}

    def run():
        try:
            outcome["value"] = function()
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {seconds} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
