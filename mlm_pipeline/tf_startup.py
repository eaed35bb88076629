"""A quiet start: TensorFlow's C++ start-up log is held back unless start-up fails.

TensorFlow's libraries print a page while they load and look for devices (oneDNN notices, CUDA
probing, a `cuInit` error on a machine without a GPU). Those lines go straight to the process's
stderr whatever TF_CPP_MIN_LOG_LEVEL says, and they read like errors. The scripts load TensorFlow
inside `tensorflow_startup_log_held_back()`, which keeps them in a file of the temporary folder
(tensorflow-startup-PID-XXXX.log), removed when start-up succeeds. When start-up fails for a reason
other than the user's input, the log is shown, with the file's path; when the process dies during
start-up (a segfault, an abort), or start-up takes over a minute, the path is printed too.
TF_CPP_MIN_LOG_LEVEL=0 shows them always. `stderr_held_back()` is that holder for any block.
"""

import faulthandler
import functools
import logging
import os
import re
import subprocess
import sys
import tempfile
from contextlib import contextmanager

from .errors import UsageError

# TensorFlow's C++ log shows errors only, unless the user set it (before TensorFlow is imported).
# Its warnings during a run read like failures and are not: tf.data's autotuner, for one, logs
# "Optimization loop failed: CANCELLED" now and then when an iterator ends (at the end of an
# evaluation or of training) while it is tuning. TF_CPP_MIN_LOG_LEVEL=1 shows warnings again.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# tf.keras is tf_keras (Keras 2, which transformers' TF models are made of), as TensorFlow's
# release notes for 2.16 advise; TensorFlow then does not load Keras 3 (and matplotlib with it) at
# import, half a second of every script's start.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


@functools.lru_cache(maxsize=None)
def installed_as_tpu_build():
    """Whether TensorFlow is installed as the distribution "tensorflow-tpu" alone
    (requirements-tpu.txt)."""
    from importlib import metadata

    def installed(name):
        try:
            return metadata.version(name) is not None
        except metadata.PackageNotFoundError:
            return False

    return installed("tensorflow-tpu") and not installed("tensorflow")


# transformers 4.57 decides whether TensorFlow is there by the name of its distribution, and
# "tensorflow-tpu" is not among the names it knows: on a TPU VM it would refuse
# TFAutoModelForMaskedLM as if TensorFlow were missing. Its own switch, FORCE_TF_AVAILABLE, says
# TensorFlow is there; it must be set before transformers is imported.
if installed_as_tpu_build():
    os.environ.setdefault("FORCE_TF_AVAILABLE", "1")


# The variables that make TensorFlow load libtpu's PJRT plugin at import, as keras-rs's CI sets them
# (keras-team/keras-rs, .github/workflows/actions.yml): tpu_runtime.pjrt_variables() sets them for a
# run on the TPU, and whatever must not touch the TPU is started without them (a pod slice's client,
# storage.py's Cloud Storage probe). The one list of their names.
PJRT_VARIABLES = (
    "PJRT_DEVICE",
    "NEXT_PLUGGABLE_DEVICE_USE_C_API",
    "TF_PLUGGABLE_DEVICE_LIBRARY_PATH",
)


def keep_off_the_tpu():
    """Keep TensorFlow's TPU build off the TPU (TPU_LOAD_LIBRARY=0, unless set), in this process
    and the ones it starts (they inherit the environment: Beam's local workers), before TensorFlow
    is imported: steps 1 and 2 call it first thing in main(), as they never use the TPU. At import
    the TPU build would otherwise load libtpu by its older route, which takes the TPU away from
    other processes on a TPU VM (a step 3 started meanwhile would be refused) and, anywhere else,
    asks the TPU metadata server for minutes first. tpu_runtime.prepare_runtime() calls it for a
    training script that does not ask for the TPU."""
    os.environ.setdefault("TPU_LOAD_LIBRARY", "0")


# How long TensorFlow may take to start before the user is told where its log so far is: a TPU VM's
# start takes seconds when all is well; a minute means it waits on something (the TPU metadata
# server, a TPU held elsewhere, the other hosts of a slice or cluster).
STARTUP_PATIENCE_SECONDS = 60


@contextmanager
def tensorflow_startup_log_held_back(patience=STARTUP_PATIENCE_SECONDS):
    """Hold TensorFlow's start-up log back for the block, in a file of its own, removed when the
    block succeeds; show it and where it is kept if the block fails (not for a UsageError, which is
    the user's mistake and reported alone), and where it is if the process dies in the block or the
    block takes longer than `patience` seconds. The block gets a HeldLog."""
    # PJRT_DEVICE=TPU is set (tpu_runtime.prepare_runtime) when this start is the TPU's.
    starting = "the TPU" if os.environ.get("PJRT_DEVICE") == "TPU" else "TensorFlow"
    with stderr_held_back(
        active=os.environ.get("TF_CPP_MIN_LOG_LEVEL") != "0",
        name="tensorflow-startup",
        title="TensorFlow's start-up log",
        during="TensorFlow's start-up",
        patience=patience,
        slow=f"still starting {starting} after {patience:g} s; TensorFlow's log so far: {{path}}",
    ) as log:
        yield log


@contextmanager
def stderr_held_back(
    active=True,
    name="held-stderr",
    title="the held-back log",
    during="a block whose log was held back",
    patience=None,
    slow=None,
):
    """Send file descriptor 2 (what C++ libraries and child processes print to) to a file of its
    own for the block: a named file in the temporary folder (`<name>-<pid>-XXXX.log`; `title` names
    it in messages, `during` names what the block does), removed when the block succeeds. Beam's
    launcher holds back its local worker processes' tracebacks this way too (beam_launcher). The
    block gets a HeldLog, to read what was held so far (tpu_runtime puts TensorFlow's reason for a
    TPU that does not start in its one line, with the file's path).

    The file is kept, and its path told, whenever the block does not succeed:
    - a Python exception other than a UsageError: the log is replayed, then its path;
    - a UsageError: reported alone, the file kept only if its line names the file's path;
    - the process dies in the block (a segfault or an abort in C++ code, a kill): faulthandler
      writes the Python traceback of a fatal signal into the log, and a watcher process replays
      the log and tells its path (see watch_held_log);
    - the block lasts more than `patience` seconds: the watcher prints `slow` (its `{path}` filled
      in) once, and the block goes on.
    """
    if not active:
        with fatal_signal_tracebacks_to(2):  # the log is shown as it comes: the traceback too
            yield HeldLog(None)
        return
    sys.stderr.flush()
    descriptor, path = tempfile.mkstemp(prefix=f"{name}-{os.getpid()}-", suffix=".log")
    ended = f"the process ended during {during}; {title}, shown above, is kept in {path}"
    with os.fdopen(descriptor, "w+b") as held:
        watcher = watch_held_log(path, ended, patience, slow and slow.format(path=path))
        stderr_copy = os.dup(2)
        os.dup2(held.fileno(), 2)
        keep = True
        try:
            with fatal_signal_tracebacks_to(held):
                yield HeldLog(held, path, title)
            keep = False
        except UsageError as error:
            keep = path in str(error)
            raise
        except BaseException:
            sys.stderr.flush()
            held.seek(0)
            os.write(stderr_copy, held.read())
            os.write(stderr_copy, f"{title}, shown above, is kept in {path}\n".encode())
            raise
        finally:
            sys.stderr.flush()
            os.dup2(stderr_copy, 2)
            os.close(stderr_copy)
            release_watcher(watcher)
            if not keep:
                os.remove(path)


@contextmanager
def fatal_signal_tracebacks_to(file):
    """For the block, a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE) writes the Python
    traceback of every thread to `file` (a file or a descriptor) before the process dies
    (faulthandler); then faulthandler is as it was: off, or on to stderr, as -X faulthandler or
    PYTHONFAULTHANDLER turn it on."""
    was_on = faulthandler.is_enabled()
    faulthandler.enable(file=file, all_threads=True)
    try:
        yield
    finally:
        if was_on:
            faulthandler.enable(file=2, all_threads=True)
        else:
            faulthandler.disable()


# The watcher: a small Python process started beside the block, holding the read end of a pipe
# whose write end only this process has. Why a process: after SIGSEGV or an abort in C++ code
# (libtpu, a plugin, TensorFlow's own checks) this process runs no more Python, so no handler or
# thread of its own can tell the user anything, and faulthandler writes a traceback but nothing
# else; a thread would not fire either while a C++ call holds the GIL for minutes (a TPU start that
# waits). The pipe reads as closed once this process has ended, however it ended: the watcher then
# replays the log and names its file, on the stderr the block holds back (inherited as it starts).
# A block that finishes stops the watcher first (SIGKILL), so it never speaks then; it costs about
# a millisecond, and the block does not wait for it to start (`-I -S`: the standard library alone).
WATCHER = """
import os, select, signal, sys
path, ended, patience, slow = sys.argv[1:]
# Ctrl-C and Ctrl-\\ reach the whole process group: the block's process answers them
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGQUIT, signal.SIG_IGN)
timeout = float(patience) if patience else None
while not select.select([0], [], [], timeout)[0]:
    os.write(2, (slow + "\\n").encode())
    timeout = None
while os.read(0, 4096):  # nothing is written: this reads the pipe's end
    pass
with open(path, "rb") as log:
    os.write(2, log.read())
os.write(2, (ended + "\\n").encode())
"""


def watch_held_log(path, ended, patience=None, slow=None):
    """Start the watcher of a held-back log (WATCHER), or None if it cannot start."""
    command = [sys.executable, "-I", "-S", "-c", WATCHER, path, ended]
    try:
        return subprocess.Popen(
            [*command, str(patience or ""), slow or ""],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
        )
    except OSError:  # no watcher: the log is still held back and replayed on a Python exception
        return None


def release_watcher(watcher):
    """Stop the watcher of a block that has finished, before the pipe closes (it would speak)."""
    if watcher is None:
        return
    watcher.kill()
    watcher.wait()
    watcher.stdin.close()


# A line of TensorFlow's C++ log at level ERROR or FATAL: "E1128 14:50:33.051744   123 file.cc:95]
# message" (absl's format) or "2026-11-28 14:50:33.051744: E tensorflow/.../file.cc:95] message".
LOGGED_ERROR = re.compile(r"^(?:[EF]\d{4} \S+\s+\d+|\S+ \S+: [EF]) [^\]\s]+\] (.+)$")


class HeldLog:
    """What a stderr_held_back() block has held back so far (nothing when it holds nothing), and
    `path`, the file that holds it (None when nothing is held back)."""

    def __init__(self, file, path=None, title="the held-back log"):
        self.file = file
        self.path = path
        self.title = title

    def named(self, advice):
        """For a one-line error: the log's file, then `advice`; `advice` alone when nothing is held
        back. A UsageError whose line names the file keeps it (stderr_held_back)."""
        return f"{self.title}: {self.path}; {advice}" if self.path else advice

    def text(self):
        if self.file is None:
            return ""
        sys.stderr.flush()
        return os.pread(self.file.fileno(), os.fstat(self.file.fileno()).st_size, 0).decode(
            errors="replace"
        )

    def last_error_line(self):
        """The message of the last ERROR or FATAL line of TensorFlow's C++ log held back, if any."""
        found = [LOGGED_ERROR.match(line.strip()) for line in self.text().splitlines()]
        messages = [match.group(1).strip() for match in found if match]
        return messages[-1] if messages else None


def hide_transformers_tf_deprecation():
    """transformers 4.57 warns, once per model, that its TF classes leave in v5; the README says so
    once."""
    logging.getLogger("transformers.modeling_tf_utils").addFilter(
        lambda record: "TensorFlow and JAX classes are deprecated" not in record.getMessage()
    )
