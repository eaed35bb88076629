"""Where the pipeline writes: a local folder or a gs:// prefix, checked before any work.

A local --output_dir that cannot be created or written is refused at once. A gs:// path is looked up
by `check_gcs_paths()` in a short-lived child process (gcs_probe.py), so that no network, no access
or a missing bucket is one line within a minute instead of TensorFlow's minutes of retries ending in
a libcurl code; an output prefix is also written to and deleted from there, so that an account that
may read but not write is refused before hours of training rather than at the first checkpoint.

Every file the steps hand on is written so that it is never seen half-written: one file through
`write_then_rename()` (a temporary name, then a rename), the files a library saves through
`staged_folder()` (a staging folder, then published file by file, the one that marks the folder
finished last).

Nothing here imports TensorFlow: the checks run before it loads (the probe's child loads its own).
The writes through TensorFlow's file system are in file_writes.py, an engine module; a gs://
staged folder reaches it only when it writes; the engine's modules write files whole through it.
"""

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from . import tf_startup
from .errors import UsageError

# the folder that holds this package: the probe's child process imports it from there
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the probe's module, run as `python -m`: it loads TensorFlow, which this process has not yet
GCS_PROBE_MODULE = f"{__package__}.gcs_probe"


def is_remote(path):
    """gs://... (or another URL TensorFlow's file system reads), as opposed to a local path."""
    return "://" in path


def bucket_of(path):
    """gs://BUCKET of a gs:// path (the probe looks it up; the probe's refusals name it)."""
    return "/".join(path.split("/")[:3])


def is_hub_id(name):
    """Whether `name`, given where a folder or a Hub id may go (--tokenizer, --model_name_or_path,
    --dataset_name), is a Hub id: neither remote nor a path on this machine (is_local_path)."""
    return not is_remote(name) and not is_local_path(name)


def is_local_path(name):
    """Whether `name`, given where a folder or a Hub id may go, means a path on this machine: a Hub
    id (namespace/name) and a relative folder look alike, so the one that exists here, or that
    starts with /, ~ or ., is taken as local; anything else is a Hub id (or a gs:// path)."""
    return not is_remote(name) and (os.path.exists(name) or name.startswith((".", "/", "~")))


def temporary_path(path):
    """The hidden file beside `path` that it is written as before a rename puts it in place."""
    folder, name = path.rsplit("/", 1) if "/" in path else (".", path)
    return f"{folder}/.{name}.tmp"


@contextlib.contextmanager
def write_then_rename(path, rename):
    """The name to write `path` under: a hidden temporary file beside it, renamed to `path` by
    `rename(source, target)` once the block ends without an error, so that nobody ever sees the file
    half-written (a rename is atomic on a local file system, and a Cloud Storage object appears only
    once complete). If the block fails, the temporary file is left for the caller's clean-up.

    `rename` is TensorFlow's in the single process (file_writes.write_then_rename), which renames
    local and gs:// files alike; Beam's workers, which have no TensorFlow, pass Beam's.
    """
    temporary = temporary_path(path)
    yield temporary
    rename(temporary, path)


@contextlib.contextmanager
def staged_folder(output_dir, last):
    """A local folder for a library to save files into (save_pretrained writes through the local
    file system); when the block ends without an error, its files are moved to `output_dir`, local
    or gs://, one by one and the file named `last` after all the others. That file is what marks
    the folder as finished, so an interruption never leaves one that looks finished. If the block
    fails, nothing is published.

    The staging folder sits inside a local `output_dir`, so each file is put in place by a rename,
    which is atomic; for gs:// it is a temporary folder, and each file is uploaded (an object exists
    only once whole) with TensorFlow's file system, loaded for a gs:// folder only: a local one, all
    train_unigram.py saves to, needs no TensorFlow.
    """
    local = not is_remote(output_dir)
    output_dir = output_dir.rstrip("/")
    if local:
        os.makedirs(output_dir, exist_ok=True)
        publish = publish_locally
    else:
        from . import file_writes  # TensorFlow's file system, for gs:// only

        file_writes.makedirs(output_dir)
        publish = file_writes.upload
    with tempfile.TemporaryDirectory(
        dir=output_dir if local else None, prefix=".saving-"
    ) as folder:
        yield folder
        last_of_all = sorted(os.listdir(folder), key=lambda name: (name == last, name))
        for name in last_of_all:
            publish(os.path.join(folder, name), f"{output_dir}/{name}")


def publish_locally(source, target):
    if os.path.isdir(target):  # a folder left by a run killed while it published
        shutil.rmtree(target)
    os.replace(source, target)


def check_local_output_dir(output_dir, flag="--output_dir"):
    """The nearest existing folder of a local path must be a folder, and writable, so the path can
    be made."""
    existing = os.path.abspath(output_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = (
            "is a file"
            if existing == os.path.abspath(output_dir)
            else f"lies under the file {existing}"
        )
        raise UsageError(f"{flag} {output_dir} {where}, not a folder; choose a folder path.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(
            f"{flag} {output_dir} cannot be written: {existing} is read-only; choose another "
            "folder."
        )


# a bound on the whole probe: starting Python and TensorFlow, then a few requests per path
GCS_PROBE_SECONDS = 60
# the object written and deleted under an output prefix; dotted, as scratch
WRITE_PROBE_PREFIX = ".write-check-"
GCS_PROBE_ENV = {
    # A few quick retries and short timeouts instead of TensorFlow's minutes of them, for the probe.
    "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
    "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "500000",
    "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "2000000",
    "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": "10",
    "GCS_REQUEST_IDLE_TIMEOUT_SECS": "10",
    "GCS_METADATA_REQUEST_TIMEOUT_SECS": "10",
    # The probe needs no accelerator: it leaves the TPU (one process at a time holds it) and GPUs.
    "TPU_LOAD_LIBRARY": "0",
    "CUDA_VISIBLE_DEVICES": "",
    "TF_CPP_MIN_LOG_LEVEL": "3",
}
# Nor libtpu's PJRT plugin, which TensorFlow loads at import when these are set (tpu_runtime.py sets
# them for a run on the TPU, before this probe starts): the child is started without them.
GCS_PROBE_UNSET = tf_startup.PJRT_VARIABLES


def check_gcs_paths(paths, writable=()):
    """Refuse, in one line and within about a minute, a gs:// path that cannot be reached (no
    network, no access), or, for the flags named in `writable`, written to.

    `paths` maps each flag to its value (None and local paths are passed over). TensorFlow retries a
    failed Cloud Storage request for over three minutes (GCS_RETRY_CONFIG_MAX_RETRIES: 10 by
    default, backing off up to 32 s), then fails with a libcurl error code. That patience is what a
    long run needs to ride out a passing outage, so it stays; but TensorFlow reads those settings
    once per process, so they cannot be lowered for a first check alone. A short-lived child process
    with few retries and short timeouts therefore looks up every path once, before any work, and
    this process keeps the defaults. Looking up proves read access only: a prefix that the run will
    write to (`writable`) gets a small object created and deleted there too, since an account may
    read a bucket yet not write to it, and the run would find out only when it first saves, maybe
    hours later.
    """
    flags = {path: flag for flag, path in paths.items() if path and path.startswith("gs://")}
    if not flags:
        return
    first = next(iter(flags))
    modes = [("w:" if flags[path] in writable else "r:") + path for path in flags]
    command = [sys.executable, "-m", GCS_PROBE_MODULE, WRITE_PROBE_PREFIX, *modes]
    python_path = os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))
    environment = {name: value for name, value in os.environ.items() if name not in GCS_PROBE_UNSET}
    try:
        probe = subprocess.run(
            command,
            env={**environment, **GCS_PROBE_ENV, "PYTHONPATH": python_path},
            capture_output=True,
            text=True,
            timeout=GCS_PROBE_SECONDS,
        )
    except subprocess.TimeoutExpired:
        raise UsageError(
            f"{flags[first]} {first}: Cloud Storage did not answer within {GCS_PROBE_SECONDS} s; "
            f"{UNREACHABLE_ADVICE}."
        ) from None
    try:
        failure = (
            json.loads(probe.stdout.strip().splitlines()[-1])
            if probe.returncode == 0 and probe.stdout
            else None
        )
    except ValueError:
        failure = None
    # else every path answered; or the probe itself broke, and the run meets that itself
    if failure is not None:
        raise probe_failure(failure, flags[failure["path"]])


UNREACHABLE_ADVICE = "check the network (and HTTPS_PROXY, if you use a proxy), or use a local path"


def probe_failure(failure, flag):
    """The UsageError for what the probe reported: which step failed at `flag`'s path, why, and
    what to do."""
    path, step = failure["path"], failure["step"]
    where = f"{flag} {path}"
    if failure["error"] == "NoSuchBucket":
        return UsageError(
            f"{where}: the bucket {failure['message']} does not exist; check the name, or create "
            "it."
        )
    reason = gcs_failure_reason(failure["message"])
    refused = failure["error"] in ("PermissionDeniedError", "UnauthenticatedError")
    refused = refused or re.search(r"code 40[13]\b", reason)
    bucket = bucket_of(path)
    if step == "read" and refused:
        return UsageError(
            f"{where}: Cloud Storage refused access ({reason}); sign in with `gcloud auth "
            "application-default login` or set GOOGLE_APPLICATION_CREDENTIALS to the key of an "
            "account that may use the bucket."
        )
    if step == "read":
        return UsageError(
            f"{where}: Cloud Storage cannot be reached ({reason}); {UNREACHABLE_ADVICE}."
        )
    # The run writes there and also deletes and replaces what it wrote (old checkpoints, logs).
    rights = (
        f"{flag} must be writable: give the account permission to create and delete objects in "
        f"{bucket} (e.g. the role Storage Object User), or choose another {flag}"
    )
    if step == "create" and refused:
        return UsageError(
            f"{where}: Cloud Storage refused to create an object there ({reason}); {rights}."
        )
    if step == "delete" and refused:
        return UsageError(
            f"{where}: Cloud Storage let an object be created there but refused to delete it "
            f"({reason}); {rights}; then remove {failure['left']}."
        )
    return UsageError(
        f"{where}: writing a test object there failed ({reason}); check the network (and "
        f"HTTPS_PROXY, if you use a proxy), or choose another {flag}."
    )


def gcs_failure_reason(message):
    """TensorFlow's error for a failed request, shortened to what went wrong (libcurl's words, not
    its code)."""
    text = message.strip().splitlines()[0] if message.strip() else "no details"
    text = re.sub(r"^All \d+ retry attempts failed\. The last failure: ", "", text)
    details = re.search(r"error details: (.+)", text)
    if details:
        return details.group(1).strip()
    text = re.sub(r"libcurl code \d+ meaning '([^']*)'", r"\1", text)
    # an HTTP error's body is a page of JSON; its code says enough
    text = re.sub(r" with body .*", "", text)
    return re.sub(r"^Error executing an HTTP request: ", "", text).strip()[:200]
