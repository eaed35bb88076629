"""Where the training scripts run, as their command line says: the Hardware group of settings, the
flags of it that cannot go together, and the one decision whether a run asks for the TPU.

This is the front of the scripts: read while the command line is parsed and before the TPU starts,
so it imports no TensorFlow (tpu_runtime.prepare_runtime must set PJRT's variables before the first
`import tensorflow`). hosts.py, the engine, builds the strategy from the same group.
"""

import dataclasses
import os
import resource
import sys
from typing import Optional

from .errors import UsageError
from .settings import setting
from .tf_startup import installed_as_tpu_build


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Where the steps run: the TPU of this TPU VM, else the GPUs or the CPU."""

    tpu_name: str = setting(
        "'local': the TPU of the TPU VM this runs on, one host (v4-8, v5litepod-8, v5p-8, v6e-8). "
        "A pod slice's name: train the slice from its worker 0, by Google's pod route (README: "
        "the slice's image at this TensorFlow, cloud-tpu-client, gs:// data and output).",
        "local",
    )
    tpu_zone: Optional[str] = setting(
        "The zone of the slice --tpu_name names, for the Cloud TPU API (default: this VM's)."
    )
    gcp_project: Optional[str] = setting(
        "The project of the slice --tpu_name names, for the Cloud TPU API (default: this VM's)."
    )
    no_tpu: bool = setting("Train on the GPUs, or the CPU when there are none.", False)
    # One machine, its CPU unsplit: class attributes, not flags, unless a script's group declares
    # them (run_mlm.py's --multi_worker and --cpu_replicas).
    multi_worker = False
    cpu_replicas = 1


def asks_for_tpu(hardware):
    """Whether a script's Hardware group asks for the TPU: not under --no_tpu, nor under
    run_mlm.py's --multi_worker (a GPU cluster). The one place this is decided: the checks below,
    tpu_runtime.prepare_runtime and hosts.build_strategy ask here."""
    return not (hardware.no_tpu or hardware.multi_worker)


def check_hardware_flags(hardware, jit_compile):
    """run_mlm.py's hardware flags (its Hardware group) that cannot go together, with each other or
    with --jit_compile, refused in one line before any work."""
    cpu_replicas = hardware.cpu_replicas
    off_the_tpu = not asks_for_tpu(hardware)
    if cpu_replicas > 1 and (hardware.multi_worker or not off_the_tpu):
        raise UsageError(f"--cpu_replicas {cpu_replicas} splits this CPU: it needs --no_tpu alone.")
    if cpu_replicas > 1 and jit_compile:
        raise UsageError(
            f"--jit_compile cannot be combined with --cpu_replicas {cpu_replicas}: XLA on the CPU "
            "cannot reach variables placed on another logical device; run the two separately."
        )
    if jit_compile and off_the_tpu and installed_as_tpu_build():
        raise UsageError(
            "--jit_compile with --no_tpu needs XLA's CPU or GPU compiler, which TensorFlow's TPU "
            "build (tensorflow-tpu) leaves out; on a TPU drop --no_tpu (TPUStrategy compiles each "
            "step with XLA), or install requirements.txt to compile on the CPU."
        )


# The machine's memory, read without TensorFlow: the preflight's count, and that of benchmarks'
# child processes whose environments have no TensorFlow (benchmarks/modernbert_long.py).


def machine_memory():
    """The machine's RAM in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def peak_resident_bytes():
    """This process's own peak resident memory so far, in bytes. On Linux the kernel's high-water
    mark of this program (VmHWM): ru_maxrss would also count the peak of the process that started
    it, which a child inherits across fork and exec (a run started from a notebook or a driver
    holding gigabytes would read as that large). Elsewhere ru_maxrss (bytes on macOS, KiB on the
    other systems)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # "VmHWM:   13552 kB"
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
