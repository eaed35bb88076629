"""A root script run as `python SCRIPT ARGS...` runs it, on a TPU machine of the test's making, the
first `import tensorflow` optionally recorded instead of done:

    python tests/fake_tpu_machine.py SCRIPT ARGS...

SCRIPT is a root script's name, or the absolute path of any Python file (the reference's recipe).

What the machine is, from the environment (tests/test_tpu_runtime.py sets it):

    FAKE_PCI_DEVICES       a folder of PCI devices (`vendor` and `device` files), for the scripts'
                           look at /sys/bus/pci/devices (tpu_runtime.PCI_DEVICES)
    FAKE_LIBTPU_LOCK_FILE  the file that stands for libtpu's lock (tpu_runtime.LIBTPU_LOCK_FILE)
    HIDE_LIBTPU            if set, the `libtpu` package cannot be found, as without the TPU set
    FAKE_METADATA_URL      the metadata server's attributes of this VM (tpu_slice.METADATA_URL)
    FAKE_TPU_RUNTIME_SERVICE  the TPU worker service's unit file (tpu_slice.TPU_RUNTIME_SERVICE)
    HIDE_CLOUD_TPU_CLIENT  if set, the `cloud_tpu_client` package cannot be found
    RECORD_TENSORFLOW_IMPORT  if set, a file: when TensorFlow is first imported, the environment
                           variables that decide how it starts are written there as JSON, and the
                           process ends (status 0) before TensorFlow loads

A fake libtpu package (a folder holding libtpu/libtpu.so) goes on PYTHONPATH, and a fake
cloud_tpu_client package there stands for the Cloud TPU API.
"""

import importlib.abc
import json
import os
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What decides how TensorFlow starts: PJRT's variables, the MLIR bridge, the older route's switch.
RECORDED = (
    "PJRT_DEVICE",
    "NEXT_PLUGGABLE_DEVICE_USE_C_API",
    "TF_PLUGGABLE_DEVICE_LIBRARY_PATH",
    "TF_XLA_FLAGS",
    "TPU_LOAD_LIBRARY",
)


class TensorflowImportRecorder(importlib.abc.MetaPathFinder):
    """At the first `import tensorflow`, from anywhere: the variables written out, then the end."""

    def __init__(self, record):
        self.record = record

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow":
            variables = {key: os.environ[key] for key in RECORDED if key in os.environ}
            Path(self.record).write_text(json.dumps(variables))
            sys.stdout.flush()
            os._exit(0)  # at once: no handler of the script's may turn this into something else
        return None


def main():
    script, *args = sys.argv[1:]
    sys.path.insert(0, str(REPO))  # where `python SCRIPT` finds mlm_pipeline
    from mlm_pipeline import tpu_runtime, tpu_slice

    tpu_runtime.PCI_DEVICES = os.environ["FAKE_PCI_DEVICES"]
    tpu_runtime.LIBTPU_LOCK_FILE = os.environ["FAKE_LIBTPU_LOCK_FILE"]
    tpu_slice.METADATA_URL = os.environ["FAKE_METADATA_URL"]
    tpu_slice.TPU_RUNTIME_SERVICE = os.environ["FAKE_TPU_RUNTIME_SERVICE"]
    if os.environ.get("HIDE_LIBTPU"):
        sys.modules["libtpu"] = None  # importlib.util.find_spec("libtpu") is None now
    if os.environ.get("HIDE_CLOUD_TPU_CLIENT"):
        sys.modules["cloud_tpu_client"] = None
    if os.environ.get("RECORD_TENSORFLOW_IMPORT"):
        sys.meta_path.insert(0, TensorflowImportRecorder(os.environ["RECORD_TENSORFLOW_IMPORT"]))
    sys.argv = [str(REPO / script), *args]
    runpy.run_path(str(REPO / script), run_name="__main__")


if __name__ == "__main__":
    main()
