"""What every benchmark prints first: the machine it ran on, and (for training) the machine's matmul
ceiling.

Figures from one run are only compared with figures from the same run: the machines these benchmarks
run on are shared and noisy, so a ratio measured side by side is what carries over.
"""

import os
import platform
import time


def describe_machine():
    """One line: CPU model, core count, memory, Python and the key library versions."""
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(
                line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    memory = ""
    try:
        with open("/proc/meminfo") as meminfo:
            kib = int(next(line.split()[1] for line in meminfo if line.startswith("MemTotal")))
        memory = f", {kib / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    versions = []
    for name in ("tensorflow", "transformers", "tokenizers"):
        try:
            versions.append(f"{name} {__import__(name).__version__}")
        except ImportError:
            pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{model}, {cores} cores{memory}; Python {platform.python_version()}, {', '.join(versions)}"
    )


def fastest_time(function, repeats):
    """The shortest wall time of `repeats` calls, in seconds: what the machine can do when nothing
    interferes."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_ceiling(dtype="float32", sizes=(1024, 2048, 4096), repeats=5):
    """The best FLOP/s TensorFlow reaches on a square matmul here (the fastest of `repeats` calls,
    not the median): the denominator of MFU."""
    import tensorflow as tf

    best = 0.0
    for size in sizes:
        a = tf.random.normal([size, size], dtype=tf.float32)
        b = tf.random.normal([size, size], dtype=tf.float32)
        a, b = tf.cast(a, dtype), tf.cast(b, dtype)
        multiply = tf.function(lambda: tf.reduce_sum(tf.cast(tf.matmul(a, b)[:1, :1], tf.float32)))
        multiply()  # trace and warm up
        seconds = fastest_time(lambda: multiply().numpy(), repeats)
        best = max(best, 2 * size**3 / seconds)
    return best
