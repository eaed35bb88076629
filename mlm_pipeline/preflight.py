"""--preflight: a run measured before it starts. The script builds what the run would (strategy,
data, model, optimizer), then, instead of training, hands the compiled model here: a few of the
run's steps are run by fit() itself, timed by a callback, and one report says on what hardware, how
long the compile and a step take, how much memory a replica held at its peak against what it has,
and how long the whole run will take. Nothing is written: the scripts return before the output
folder, the checkpoints, the Hub or a bucket is touched.

A batch that does not fit (TensorFlow's ResourceExhaustedError, or a peak above the device's
memory) is one line that says what to lower, through UsageError.

The projection is the run's steps of each shape (`Phase`: the sequence-length warmup's pieces, the
full length) at the median of the timed steps, each shape's first step (trace, compile, the input
pipeline's start) once, and its evaluations at their cadence, each batch at the median of a timed
evaluation. Checkpoints, logs and each fit() call's restart of the input pipeline are not counted:
benchmarks/preflight_projection.py sets the projection against the real run.
"""

import dataclasses
import importlib.metadata
import os
import platform
import resource
import statistics
import sys
import time

from . import segments, tpu_runtime
from .errors import UsageError, tf_error_text

# fit()'s executions run untimed first (the first traces and compiles), then the timed ones.
WARMUP_EXECUTIONS = 2
TIMED_STEPS = 20

# The high-bandwidth memory of one TensorFlow replica, by TPU generation, as Google's system
# architecture pages give it (docs.cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e), for when
# tf.config.experimental.get_memory_info() gives no limit (it documents only 'current' and
# 'peak'). From v4 on, TensorFlow drives a chip as one device (v4 and v5p join its two TensorCores),
# so a replica holds the chip's memory.
TPU_MEMORY_BYTES = {
    "v4": 32 * 2**30,  # "HBM2 capacity and bandwidth: 32 GiB"
    "v5e": 16 * 10**9,  # "HBM capacity per chip: 16 GB"
    "v5p": 95 * 10**9,  # "HBM2e capacity and bandwidth: 95 GB"
    "v6e": 32 * 10**9,  # "HBM capacity per chip: 32 GB"
}


@dataclasses.dataclass
class Phase:
    """Steps of one shape: `dataset` the run's batches for them, `steps` how many the run takes."""

    name: str
    dataset: object
    steps: int


@dataclasses.dataclass
class Evaluation:
    """The run's evaluations: `dataset`, the `batches` each scores and how many (`count`)."""

    dataset: object
    batches: int
    count: int


@dataclasses.dataclass
class Timing:
    """What fit() or evaluate() took: the first step (with its trace and compile) and the median
    of the timed ones, in seconds."""

    first: float
    median: float
    timed: int


@dataclasses.dataclass
class Report:
    """What --preflight measured and projects; `lines()` is what it prints."""

    hardware: dict
    phases: list  # [(Phase, Timing)]
    evaluation: Evaluation
    evaluation_timing: Timing
    sequences_per_step: int
    tokens_per_sequence: int
    memory: "Memory"

    @property
    def seconds_per_step(self):
        """The median step at the run's main shape (its last phase: full length)."""
        return self.phases[-1][1].median

    @property
    def tokens_per_second(self):
        if not self.tokens_per_sequence:
            return None
        return self.sequences_per_step * self.tokens_per_sequence / self.seconds_per_step

    @property
    def projected_seconds(self):
        """The whole run: every phase's steps at its median, its first step's extra once, and
        every evaluation's batches at theirs, plus the evaluation's first compile."""
        training = sum(
            phase.steps * timing.median + (timing.first - timing.median)
            for phase, timing in self.phases
            if phase.steps
        )
        return training + self.evaluation_seconds

    @property
    def evaluation_seconds(self):
        if self.evaluation is None or not self.evaluation.count:
            return 0.0
        timing = self.evaluation_timing
        each = self.evaluation.batches * timing.median
        return self.evaluation.count * each + (timing.first - timing.median)

    def lines(self):
        hardware = self.hardware
        replicas = hardware["replicas"]
        lines = [
            "Preflight (nothing written): "
            f"{hardware['strategy']}, {replicas} replica{'s' if replicas > 1 else ''} of "
            f"{hardware['device']} ({hardware['device_kind']}); TensorFlow "
            f"{hardware['tensorflow']}, libtpu {hardware['libtpu']}; {hardware['pjrt']}."
        ]
        for phase, timing in self.phases:
            lines.append(
                f"  {phase.name}: first step {timing.first:.1f} s (compile), then "
                f"{timing.median:.4f} s a step (median of {timing.timed}); "
                f"{phase.steps:,} steps in the run"
            )
        speed = f"  {self.sequences_per_step / self.seconds_per_step:,.0f} sequences a second"
        if self.tokens_per_second:
            speed += f", {self.tokens_per_second:,.0f} tokens a second"
        lines.append(speed + f" ({self.sequences_per_step:,} sequences a step)")
        if self.evaluation is not None:
            timing = self.evaluation_timing
            lines.append(
                f"  evaluation: first batch {timing.first:.1f} s (compile), then "
                f"{timing.median:.4f} s a batch (median of {timing.timed}); "
                f"{self.evaluation.count:,} evaluations of {self.evaluation.batches:,} batches"
            )
        lines.append(f"  peak memory: {self.memory.line()}")
        minutes = self.projected_seconds / 60
        lines.append(
            f"  projected run: {minutes:,.1f} minutes ({minutes / 60:,.2f} hours): training "
            f"{(self.projected_seconds - self.evaluation_seconds) / 60:,.1f}, evaluations "
            f"{self.evaluation_seconds / 60:,.1f} (checkpoints and logs not counted)"
        )
        return lines


@dataclasses.dataclass
class Memory:
    """The peak bytes of a replica (`peak`; what they count: `peak_of`) against what it has
    (`capacity`, None when unknown; where that comes from: `capacity_of`)."""

    peak: int
    capacity: int
    peak_of: str
    capacity_of: str

    def fits(self):
        return not self.capacity or self.peak <= self.capacity

    def line(self):
        """'0.91 GiB (the process's peak resident memory) of 23.5 GiB (the machine's
        RAM): 5%'."""
        peak = f"{self.peak / 2**30:.2f} GiB ({self.peak_of})"
        if not self.capacity:
            return f"{peak}; {self.capacity_of}"
        share = self.peak / self.capacity
        return f"{peak} of {self.capacity / 2**30:.1f} GiB ({self.capacity_of}): {share:.0%}"


def preflight(
    trainer,
    phases,
    *,
    evaluation=None,
    sequences_per_step,
    tokens_per_sequence=None,
    steps_per_execution=1,
    advice,
):
    """Run a few of fit()'s steps of each of `phases` (Phase), and of evaluate()'s batches of
    `evaluation` (Evaluation, or None), on `trainer` compiled as the run compiles it; print the
    report and return it (Report). `advice`: what to lower when the batch does not fit
    (`lower_the_batch()`), said in one line through UsageError."""
    strategy = trainer.distribute_strategy
    hardware = describe_hardware(strategy)
    timings = []
    try:
        for phase in phases:
            timings.append((phase, time_fit(trainer, phase.dataset, steps_per_execution)))
        evaluation_timing = None
        if evaluation is not None:
            evaluation_timing = time_evaluation(trainer, evaluation.dataset, evaluation.batches)
    except Exception as error:
        if not out_of_memory(error):
            raise
        raise UsageError(
            f"the batch does not fit on {hardware['device']} ({hardware['device_kind']}): "
            f"{tf_error_text(error)[:200]}; {advice}."
        ) from None
    memory = peak_memory(strategy, hardware)
    if not memory.fits():
        raise UsageError(
            f"the batch does not fit: its peak of {memory.peak / 2**30:.1f} GiB a replica is "
            f"more than the {memory.capacity / 2**30:.1f} GiB of {hardware['device_kind']} "
            f"({memory.capacity_of}); {advice}."
        )
    report = Report(
        hardware,
        timings,
        evaluation,
        evaluation_timing,
        sequences_per_step,
        tokens_per_sequence,
        memory,
    )
    print("\n".join(report.lines()))
    return report


def out_of_memory(error):
    """Whether `error` says a device ran out of memory: TensorFlow's ResourceExhaustedError, or an
    XLA error carrying the status RESOURCE_EXHAUSTED (a TPU program too large to compile)."""
    import tensorflow as tf

    if isinstance(error, tf.errors.ResourceExhaustedError):
        return True
    return isinstance(error, tf.errors.OpError) and "RESOURCE_EXHAUSTED" in str(error)


def lower_the_batch(per_replica_batch_size, max_length, max_length_flag, accumulation_steps=None):
    """What to lower when a batch does not fit, with the values given. With `accumulation_steps`
    (run_mlm.py's --gradient_accumulation_steps, which multiplies the global batch): half the
    batch a replica, twice the batches accumulated, the same global batch."""
    options = [f"lower --per_replica_batch_size {per_replica_batch_size}"]
    options.append(f"lower {max_length_flag} {max_length}")
    if accumulation_steps is not None and per_replica_batch_size % 2 == 0:
        options.append(
            f"halve --per_replica_batch_size to {per_replica_batch_size // 2} and double "
            f"--gradient_accumulation_steps to {accumulation_steps * 2}: the same global batch"
        )
    return ", or ".join([", ".join(options[:-1]), options[-1]] if len(options) > 1 else options)


def masked_lm_phases(train_dataset_from, short_steps, total_steps, short_sequence_length=None):
    """run_mlm.py's phases: the sequence-length warmup's first `short_steps` on pieces of
    `short_sequence_length` tokens (when it has any), then the full length."""
    phases = []
    if short_steps:
        pieces = f"the warmup's {short_sequence_length}-token pieces"
        phases.append(Phase(pieces, train_dataset_from(0), short_steps))
    phases.append(Phase("full length", train_dataset_from(short_steps), total_steps - short_steps))
    return phases


def step_clock():
    """A Keras callback that notes when each of fit()'s executions, and evaluate()'s batches, end:
    the time between two ends is all that fit() does for a step, the input pipeline included."""
    import tf_keras

    class StepClock(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.started = time.perf_counter()
            self.ends = []

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

        def on_test_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

    return StepClock()


def timing_of(clock, steps_per_end=1):
    """The first end's seconds from the start, and the median of the later ends' intervals after
    the warm-up (per step: an execution ends `steps_per_end` steps)."""
    ends = [clock.started, *clock.ends]
    intervals = [(later - earlier) / steps_per_end for earlier, later in zip(ends, ends[1:])]
    timed = intervals[WARMUP_EXECUTIONS:] or intervals[1:] or intervals
    return Timing(first=ends[1] - ends[0], median=statistics.median(timed), timed=len(timed))


def time_fit(trainer, dataset, steps_per_execution):
    """fit() for WARMUP_EXECUTIONS executions and then TIMED_STEPS steps or more, on `dataset`."""
    timed_executions = max(3, -(-TIMED_STEPS // steps_per_execution))
    steps = (WARMUP_EXECUTIONS + timed_executions) * steps_per_execution
    clock = step_clock()
    trainer.fit(dataset, epochs=1, steps_per_epoch=steps, callbacks=[clock], verbose=0)
    return timing_of(clock, steps_per_execution)


def time_evaluation(trainer, dataset, batches):
    """evaluate() on the first batches of `dataset` (all of them when there are few)."""
    clock = step_clock()
    steps = min(batches, WARMUP_EXECUTIONS + TIMED_STEPS)
    trainer.evaluate(dataset, steps=steps, callbacks=[clock], verbose=0)
    return timing_of(clock)


def describe_hardware(strategy):
    """The strategy, its replicas, the device they run on and its kind, TensorFlow's and libtpu's
    versions, and whether TensorFlow drives the TPU through PJRT."""
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.TPUStrategy):
        device, kind = "TPU", tpu_generation() or "unknown generation"
        kind = f"TPU {kind}" if kind[0] == "v" else kind
    elif tf.config.list_logical_devices("GPU"):
        device = "GPU"
        details = tf.config.experimental.get_device_details(
            tf.config.list_physical_devices("GPU")[0]
        )
        kind = details.get("device_name", "unknown GPU")
    else:
        device, kind = "CPU", cpu_model()
    pjrt = os.environ.get("PJRT_DEVICE")
    return {
        "strategy": type(strategy).__name__,
        "replicas": strategy.num_replicas_in_sync,
        "device": device,
        "device_kind": kind,
        "tensorflow": installed_version("tensorflow") or installed_version("tensorflow-tpu"),
        "libtpu": installed_version("libtpu") or "not installed",
        "pjrt": f"PJRT (PJRT_DEVICE={pjrt})" if pjrt else "no PJRT (PJRT_DEVICE unset)",
    }


def installed_version(distribution):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model():
    """The CPU's model name (Linux names it in /proc/cpuinfo only)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def tpu_generation():
    """The attached TPU's generation (v4, v5e, v5p, v6e), from its PCI devices (tpu_runtime.py);
    None when none is found."""
    chips = tpu_runtime.attached_tpu_chips()
    return next(
        (tpu_runtime.TPU_CHIPS[chip] for chip in chips if chip in tpu_runtime.TPU_CHIPS), None
    )


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


def peak_memory(strategy, hardware):
    """The Memory of a replica at its peak so far. On a TPU or GPU, the
    largest of the replicas' peaks (tf.config.experimental.get_memory_info), against its 'limit'
    when it gives one, or on a TPU the memory of its generation (TPU_MEMORY_BYTES). On the CPU,
    which keeps no such count, the process's peak resident memory (all its replicas together)
    against the machine's RAM."""
    import tensorflow as tf

    if hardware["device"] == "CPU":
        peak = peak_resident_bytes()
        peak_of = "the process's peak resident memory"
        if strategy.num_replicas_in_sync > 1:
            peak_of += f", its {strategy.num_replicas_in_sync} replicas together"
        return Memory(peak, machine_memory(), peak_of, "the machine's RAM")
    infos = []
    for device in strategy.extended.worker_devices:
        try:
            infos.append(tf.config.experimental.get_memory_info(device))
        except (ValueError, RuntimeError, tf.errors.OpError):
            continue
    peak = max((info["peak"] for info in infos), default=0)
    limit = max((info.get("limit", 0) for info in infos), default=0)
    peak_of = "the largest replica's peak, get_memory_info"
    if limit:
        return Memory(peak, limit, peak_of, "get_memory_info's limit")
    generation = hardware["device_kind"].removeprefix("TPU ")
    if hardware["device"] == "TPU" and generation in TPU_MEMORY_BYTES:
        return Memory(peak, TPU_MEMORY_BYTES[generation], peak_of, f"a {generation} chip's")
    return Memory(peak, None, peak_of, "the device's memory is unknown")


def preflight_masked_lm(
    trainer, settings, schedule, max_length, train_dataset_from, eval_dataset, eval_batches
):
    """run_mlm.py's preflight, from its Settings and training_run.Schedule, the shards' length,
    `train_dataset_from(step)` (the batches from an optimizer step on) and the evaluation's dataset
    (None without one) and the batches it scores."""
    masking, speed = settings.masking, settings.speed
    phases = masked_lm_phases(
        train_dataset_from, schedule.phase_end, schedule.total_steps, masking.short_sequence_length
    )
    run_evaluation = None
    if eval_dataset is not None:  # one at every fit() epoch end, and a parent's before step 1
        cadence = settings.steps.steps_per_evaluation(schedule.plan.steps_per_epoch)
        count = segments.evaluation_count(schedule.total_steps, cadence, schedule.phase_end)
        count += settings.model.model_name_or_path is not None  # continued pretraining
        run_evaluation = Evaluation(eval_dataset, eval_batches, count)
    advice = lower_the_batch(
        speed.per_replica_batch_size,
        max_length,
        "the shards' --max_length",
        speed.gradient_accumulation_steps,
    )
    return preflight(
        trainer,
        phases,
        evaluation=run_evaluation,
        sequences_per_step=schedule.plan.global_batch_size,
        tokens_per_sequence=max_length,
        steps_per_execution=speed.steps_per_execution,
        advice=advice,
    )


def preflight_classifier(classifier, training, batches, max_length, bucket_lengths):
    """run_classifier.py's preflight, from its Training group, `batches`: (the training batches,
    all the run's steps, the validation batches, how many: scored after each epoch and once more
    for the final scores), the examples' length and the lengths batches are padded to (None: all
    to `max_length`)."""
    train_dataset, total_steps, eval_dataset, eval_batches = batches
    replicas = classifier.distribute_strategy.num_replicas_in_sync
    return preflight(
        classifier,
        [Phase("fine-tuning", train_dataset, total_steps)],
        evaluation=Evaluation(eval_dataset, eval_batches, training.num_epochs + 1),
        sequences_per_step=training.per_replica_batch_size * replicas,
        tokens_per_sequence=max_length if bucket_lengths is None else None,
        advice=lower_the_batch(training.per_replica_batch_size, max_length, "--max_length"),
    )
