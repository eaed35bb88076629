"""A quiet start: TensorFlow's C++ start-up log is held back unless start-up fails.

TensorFlow's libraries print a page while they load and look for devices (oneDNN notices, CUDA
probing, a `cuInit` error on a machine without a GPU). Those lines go straight to the process's
stderr whatever TF_CPP_MIN_LOG_LEVEL says, and they read like errors. The scripts load TensorFlow
inside `tensorflow_startup_log_held_back()`, which keeps them in a temporary file and shows them
only when start-up fails for a reason other than the user's input. TF_CPP_MIN_LOG_LEVEL=0 shows them
always. `stderr_held_back()` is that holder for any block.
"""

import functools
import logging
import os
import re
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


@contextmanager
def tensorflow_startup_log_held_back():
    """Hold TensorFlow's start-up log back for the block; show it if the block fails (not for a
    UsageError, which is the user's mistake and reported alone). The block gets a HeldLog."""
    with stderr_held_back(active=os.environ.get("TF_CPP_MIN_LOG_LEVEL") != "0") as log:
        yield log


@contextmanager
def stderr_held_back(active=True):
    """Send file descriptor 2 (what C++ libraries and child processes print to) to a temporary file
    for the block, and replay it if the block fails for a reason other than a UsageError. Beam's
    launcher holds back its local worker processes' tracebacks this way too (beam_launcher). The
    block gets a HeldLog, to read what was held so far (tpu_runtime puts TensorFlow's reason for a
    TPU that does not start in its one line)."""
    if not active:
        yield HeldLog(None)
        return
    sys.stderr.flush()
    stderr_copy = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield HeldLog(held)
        except UsageError:
            raise
        except BaseException:
            sys.stderr.flush()
            held.seek(0)
            os.write(stderr_copy, held.read())
            raise
        finally:
            sys.stderr.flush()
            os.dup2(stderr_copy, 2)
            os.close(stderr_copy)


# A line of TensorFlow's C++ log at level ERROR or FATAL: "E1128 14:50:33.051744   123 file.cc:95]
# message" (absl's format) or "2026-11-28 14:50:33.051744: E tensorflow/.../file.cc:95] message".
LOGGED_ERROR = re.compile(r"^(?:[EF]\d{4} \S+\s+\d+|\S+ \S+: [EF]) [^\]\s]+\] (.+)$")


class HeldLog:
    """What a stderr_held_back() block has held back so far (nothing when it holds nothing)."""

    def __init__(self, file):
        self.file = file

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
