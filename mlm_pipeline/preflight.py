"""--preflight: a run measured before it starts. The script builds what the run would (strategy,
data, model, optimizer), then, instead of training, hands the compiled model here: a few of the
run's steps are run by fit() itself, timed by a callback, and one report says on what hardware, how
long the compile and a step take, what memory a replica held where the device reports it, the model
FLOPs a second (on a TPU or GPU, their share of the chips' bf16 peak), and how long the whole
process will take. Nothing is written to the run's places: the scripts return before the output
folder, the checkpoints, the Hub or a bucket is touched; a checkpoint and the final save are timed
into a local temporary folder, removed at once.

A batch that does not fit (TensorFlow's ResourceExhaustedError, XLA's out-of-memory report, or a
peak above the device's memory) is one line that says what to lower, through UsageError.

Memory is stated only where it was measured. On the CPU it is the process's peak resident memory. On
a GPU, tf.config.experimental.get_memory_info's peak: TensorFlow's allocator. Under PJRT a TPU
replica is a pluggable device whose allocator keeps no statistics (get_memory_info raises), so the
report says so, and what stands in for it: the step compiled and ran at this batch. The compiled
program's own memory is out of reach from TensorFlow's Python API: its one window on a compiled
program, tf.function's experimental_get_compiler_ir, returns the program's text only (the stages
`hlo` to `optimized_hlo_dot`, tensorflow/python/types/core.py), and only for a function marked
jit_compile=True (polymorphic_function.py raises otherwise), which Keras' train function under
TPUStrategy is not. XLA's own figures come when it refuses a program: its out-of-memory error
("Ran out of memory in memory space hbm. Used 49.34G of 32.00G hbm. Exceeded hbm capacity by
17.34G.", openxla/xla docs/errors/error_1000.md) becomes the one-line refusal, both figures given.

The projection is the whole process: its start (from the process's start to the first fit(), as the
kernel counts it), the run's steps of each shape (`Phase`: the sequence-length warmup's pieces, the
full length) at the mean of the timed steps, each shape's first steps (trace, compile, the input
pipeline's start) once, each later fit() call's restart of the input pipeline, its evaluations at
their cadence, its checkpoints (one timed, counted as the run makes them), and the final save with
its PyTorch copy (run_mlm.py's curves too). Logs, Hub pushes and the process's exit are not counted.
benchmarks/preflight_projection.py sets the projection against the real process's wall-clock.
"""

import dataclasses
import functools
import importlib.metadata
import os
import platform
import re
import shutil
import statistics
import tempfile
import time
import warnings

import tensorflow as tf
import tf_keras

from . import segments, tpu_runtime, training_logs
from .errors import UsageError, tf_error_text
from .hardware import machine_memory, peak_resident_bytes

# fit()'s executions run untimed first (the first traces and compiles), then the timed ones: their
# mean, not their median, is what a long run pays, stalls included.
WARMUP_EXECUTIONS = 2
TIMED_STEPS = 100
# A second fit() call on the same shape: its first execution, less a step, is what each later call
# of the run pays to restart the input pipeline (the compiled step is reused).
RESTART_EXECUTIONS = 3

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

# The bf16 peak of one replica's chip, in FLOPs a second, as its maker publishes it: the dense
# (not the "with sparsity") figure. TPUs: Google's system architecture pages, "Peak compute per
# chip (bf16)" (docs.cloud.google.com/tpu/docs/v4: "275 teraflops (bf16 or int8)"; /v5e: "197
# TFLOPs"; /v5p: "459 TFLOPs"; /v6e: "918 TFLOPs").
TPU_BF16_PEAK = {"v4": 275e12, "v5e": 197e12, "v5p": 459e12, "v6e": 918e12}
# GPUs, by a piece of the name TensorFlow gives the device, from NVIDIA's data sheets, which give
# the Tensor Core BF16 figure with sparsity beside (or instead of) the dense one; the dense one is
# half. A100 data sheet (SXM and PCIe): "BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS*", * with
# sparsity. H100 data sheet, H100 SXM: "BF16 Tensor Core 1,979 teraFLOPS*", * with sparsity
# (TensorFlow names it "NVIDIA H100 80GB HBM3"; the PCIe and NVL parts, slower, are left out). L4
# data sheet: "BF16 Tensor Core 242 teraFLOPS*", * with sparsity. A GPU named by none of them has
# an unknown peak.
GPU_BF16_PEAK = {"A100": 312e12, "H100 80GB HBM3": 1979e12 / 2, "L4": 242e12 / 2}

# XLA's out-of-memory reports (openxla/xla docs/errors/error_1000.md): "Ran out of memory in memory
# space hbm. Used 49.34G of 32.00G hbm. Exceeded hbm capacity by 17.34G." at the end of a compile,
# and "Aborting compilation early because it's unlikely to have enough memory. Requires 3.84T, has
# 90.96G available." before it. The figures are kept as XLA prints them, units included.
XLA_SIZE = r"(\d+(?:\.\d+)?[KMGTP]?)"
XLA_OUT_OF_MEMORY = (
    re.compile(rf"Used {XLA_SIZE} of {XLA_SIZE} hbm"),
    re.compile(rf"Requires {XLA_SIZE}, has {XLA_SIZE} available"),
)


@dataclasses.dataclass
class Phase:
    """Steps of one shape: `dataset` the run's batches for them, `steps` how many the run takes,
    in `calls` fit() calls (each later one restarts the input pipeline: `rebuild()` gives its
    batches as the run builds them; None: the same `dataset` again)."""

    name: str
    dataset: object
    steps: int
    calls: int = 1
    rebuild: object = None


@dataclasses.dataclass
class Evaluation:
    """The run's evaluations: `dataset`, the `batches` each scores and how many (`count`);
    `other_batches`, the batches of each further validation set every evaluation also scores
    (run_mlm.py's --eval_dataset of several sets), counted at the pace `dataset`'s batches are
    timed at (the same model, batch and length), each set's evaluate() paying a restart."""

    dataset: object
    batches: int
    count: int
    other_batches: tuple = ()

    @property
    def sets(self):
        return 1 + len(self.other_batches)

    @property
    def batches_each(self):
        """The batches of one evaluation, every set's."""
        return self.batches + sum(self.other_batches)


@dataclasses.dataclass
class Timing:
    """What fit() or evaluate() took, in seconds: the first step (with its trace and compile), the
    mean of the timed ones and their standard deviation (`spread`), `extra` what the untimed first
    executions took beyond as many mean steps, and `restart` what a later call's first execution
    took beyond a mean step (the input pipeline's restart; 0 when not measured)."""

    first: float
    mean: float
    spread: float
    timed: int
    extra: float
    restart: float = 0.0


@dataclasses.dataclass
class Overheads:
    """What the run does besides its steps and evaluations, measured, in seconds (None: not
    measured). `start`: from the process's start to the first fit(); `checkpoint_first` and
    `checkpoint_each`: one checkpoint of the model and optimizer written, the first time and the
    next; `checkpoints`: how many the run writes; `final_save`: the model folder written at the end
    (save_pretrained, the tokenizer, the PyTorch copy unless --no_pytorch_export; run_mlm.py's
    curves too)."""

    start: float = None
    checkpoint_first: float = 0.0
    checkpoint_each: float = 0.0
    checkpoints: int = 0
    final_save: float = None

    @property
    def checkpoint_seconds(self):
        if not self.checkpoints:
            return 0.0
        return self.checkpoint_first + (self.checkpoints - 1) * self.checkpoint_each


@dataclasses.dataclass
class Flops:
    """Model FLOPs of one training step at the run's main shape (`per_step`, None when unknown),
    what they count (`counts`), and the peak FLOPs a second of all the replicas together
    (`peak`, None when unknown; where it comes from: `peak_of`)."""

    per_step: float = None
    counts: str = "unknown for this model"
    peak: float = None
    peak_of: str = ""


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
    overheads: Overheads = dataclasses.field(default_factory=Overheads)
    flops: Flops = dataclasses.field(default_factory=Flops)

    @property
    def seconds_per_step(self):
        """The mean step at the run's main shape (its last phase: full length)."""
        return self.phases[-1][1].mean

    @property
    def tokens_per_second(self):
        if not self.tokens_per_sequence:
            return None
        return self.sequences_per_step * self.tokens_per_sequence / self.seconds_per_step

    @property
    def flops_per_second(self):
        """Model FLOPs a second at the main shape (None when the step's FLOPs are unknown)."""
        if self.flops.per_step is None:
            return None
        return self.flops.per_step / self.seconds_per_step

    @property
    def utilization(self):
        """Model FLOPs utilization: the FLOPs a second against the replicas' bf16 peak (None
        when either is unknown)."""
        if self.flops_per_second is None or not self.flops.peak:
            return None
        return self.flops_per_second / self.flops.peak

    @property
    def training_seconds(self):
        """Every phase's steps at its mean, its first executions' extra once, and each later fit()
        call's restart of the input pipeline."""
        return sum(
            phase.steps * timing.mean + timing.extra + (phase.calls - 1) * timing.restart
            for phase, timing in self.phases
            if phase.steps
        )

    @property
    def evaluation_seconds(self):
        """Every evaluation's batches at their mean, the first's extra (its compile) once, and each
        later one's restart of the input pipeline."""
        if self.evaluation is None or not self.evaluation.count:
            return 0.0
        timing, count = self.evaluation_timing, self.evaluation.count
        each = self.evaluation.batches_each * timing.mean
        calls = count * self.evaluation.sets  # one evaluate() a set at each evaluation
        return count * each + timing.extra + (calls - 1) * timing.restart

    @property
    def projected_seconds(self):
        """The whole process: its start, the training, the evaluations, the checkpoints and the
        final save."""
        overheads = self.overheads
        return (
            (overheads.start or 0.0)
            + self.training_seconds
            + self.evaluation_seconds
            + overheads.checkpoint_seconds
            + (overheads.final_save or 0.0)
        )

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
                f"{timing.mean:.4f} s a step (mean of {timing.timed}, ± {timing.spread:.4f}); "
                f"{phase.steps:,} steps in the run"
            )
        speed = f"  {self.sequences_per_step / self.seconds_per_step:,.0f} sequences a second"
        if self.tokens_per_second:
            speed += f", {self.tokens_per_second:,.0f} tokens a second"
        lines.append(speed + f" ({self.sequences_per_step:,} sequences a step)")
        lines.append(f"  model FLOPs: {self.flops_line()}")
        if self.evaluation is not None:
            timing, evaluation = self.evaluation_timing, self.evaluation
            each = f"{evaluation.batches:,} batches"
            if evaluation.other_batches:  # several validation sets, each scored every time
                batches = (evaluation.batches, *evaluation.other_batches)
                each = (
                    f"{evaluation.sets} validation sets, {evaluation.batches_each:,} batches "
                    f"({' + '.join(f'{count:,}' for count in batches)}), the first set's pace"
                )
            lines.append(
                f"  evaluation: first batch {timing.first:.1f} s (compile), then "
                f"{timing.mean:.4f} s a batch (mean of {timing.timed}, ± {timing.spread:.4f}); "
                f"{evaluation.count:,} evaluations of {each}"
            )
        lines.append(f"  peak memory: {self.memory.line()}")
        lines.extend(self.projection_lines())
        return lines

    def flops_line(self):
        """'1.2e+12 a step (...what they count...), 3.4e+12 a second: 41% of 8 x 918 TFLOPs
        (...)'; on the CPU, or with an unknown peak, the FLOPs a second alone."""
        flops = self.flops
        if flops.per_step is None:
            return f"{flops.counts}, so no FLOPs a second or utilization"
        line = f"{flops.per_step:.3g} a step ({flops.counts}), {self.flops_per_second:.3g} a second"
        if self.utilization is not None:
            return line + f": {self.utilization:.1%} of the peak ({flops.peak_of})"
        return line + (f"; utilization unknown ({flops.peak_of})" if flops.peak_of else "")

    def projection_lines(self):
        overheads = self.overheads
        minutes = self.projected_seconds / 60
        parts = [
            "start " + ("unknown" if overheads.start is None else f"{overheads.start / 60:,.2f}"),
            f"training {self.training_seconds / 60:,.2f}",
            f"evaluations {self.evaluation_seconds / 60:,.2f}",
            f"{overheads.checkpoints:,} checkpoints {overheads.checkpoint_seconds / 60:,.2f}",
            "final save "
            + (
                "not timed" if overheads.final_save is None else f"{overheads.final_save / 60:,.2f}"
            ),
        ]
        return [
            f"  projected run: {minutes:,.2f} minutes ({minutes / 60:,.2f} hours), the whole "
            f"process: {', '.join(parts)} (logs, Hub pushes and the exit not counted; the "
            "checkpoint and the save timed into a local temporary folder, removed)"
        ]


@dataclasses.dataclass
class Memory:
    """The peak bytes of a replica (`peak`, None when the device reports none; what they count, or
    why there are none: `peak_of`) against what it has (`capacity`, None when unknown; where that
    comes from: `capacity_of`)."""

    peak: int
    capacity: int
    peak_of: str
    capacity_of: str

    def fits(self):
        return self.peak is None or not self.capacity or self.peak <= self.capacity

    def line(self):
        """'0.91 GiB (the process's peak resident memory) of 23.5 GiB (the machine's RAM): 5%',
        or, where no device reports its memory, that, and what stands in for it."""
        if self.peak is None:
            return (
                f"{self.peak_of}; shown instead: the step compiled and ran at this batch, "
                "so it fits"
            )
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
    checkpoint=None,
    checkpoints=0,
    final_save=None,
    flops=None,
):
    """Run a few of fit()'s steps of each of `phases` (Phase), and of evaluate()'s batches of
    `evaluation` (Evaluation, or None), on `trainer` compiled as the run compiles it; time what the
    run does besides: `checkpoint` (the tf.train.Checkpoint it saves, `checkpoints` times; None:
    none) and `final_save(folder)` (the model folder it writes at its end; None: not timed), into a
    local temporary folder; print the report and return it (Report). `flops`: (the model FLOPs of
    one step at the main shape, what they count), or None when unknown. `advice`: what to lower
    when the batch does not fit (`lower_the_batch()`), said in one line through UsageError."""
    start = seconds_since_process_start()  # before the first fit(): the run's start ends there
    strategy = trainer.distribute_strategy
    hardware = describe_hardware(strategy)
    timings = []
    try:
        for phase in phases:
            restart = None  # a later call's batches, built as the run builds them
            if phase.calls > 1:
                restart = phase.rebuild or (lambda phase=phase: phase.dataset)
            timings.append((phase, time_fit(trainer, phase.dataset, steps_per_execution, restart)))
        evaluation_timing = None
        if evaluation is not None:
            evaluation_timing = time_evaluation(
                trainer,
                evaluation.dataset,
                evaluation.batches,
                restart=evaluation.count * evaluation.sets > 1,
            )
    except Exception as error:
        if not out_of_memory(error):
            raise
        raise UsageError(out_of_memory_line(error, hardware, advice)) from None
    memory = peak_memory(strategy, hardware)
    if not memory.fits():
        raise UsageError(
            f"the batch does not fit: its peak of {memory.peak / 2**30:.1f} GiB a replica is "
            f"more than the {memory.capacity / 2**30:.1f} GiB of {hardware['device_kind']} "
            f"({memory.capacity_of}); {advice}."
        )
    overheads = time_overheads(start, checkpoint, checkpoints, final_save)
    model_flops = Flops()
    if flops is not None:
        peak, peak_of = bf16_peak(hardware)
        model_flops = Flops(flops[0], flops[1], peak, peak_of)
    report = Report(
        hardware,
        timings,
        evaluation,
        evaluation_timing,
        sequences_per_step,
        tokens_per_sequence,
        memory,
        overheads,
        model_flops,
    )
    print("\n".join(report.lines()))
    return report


def out_of_memory(error):
    """Whether `error` says a device ran out of memory: TensorFlow's ResourceExhaustedError, or an
    XLA error carrying the status RESOURCE_EXHAUSTED (a TPU program too large to compile)."""
    if isinstance(error, tf.errors.ResourceExhaustedError):
        return True
    return isinstance(error, tf.errors.OpError) and "RESOURCE_EXHAUSTED" in str(error)


def out_of_memory_line(error, hardware, advice):
    """The one line for a batch that ran out of memory: with XLA's two figures (what the compiled
    program needs, what a replica has) when its report is in the error, else TensorFlow's words."""
    where = f"{hardware['device']} ({hardware['device_kind']})"
    for pattern in XLA_OUT_OF_MEMORY:
        found = pattern.search(str(error))
        if found:
            needed, capacity = found.groups()
            return (
                f"the batch does not fit on {where}: XLA's compiled step needs {needed} of "
                f"memory a replica, which has {capacity} (XLA's out-of-memory report, in its "
                f"units: {found.group(0)}); {advice}."
            )
    return f"the batch does not fit on {where}: {tf_error_text(error)[:200]}; {advice}."


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


def masked_lm_phases(
    train_dataset_from, short_steps, total_steps, short_sequence_length=None, calls=(1, 1)
):
    """run_mlm.py's phases: the sequence-length warmup's first `short_steps` on pieces of
    `short_sequence_length` tokens (when it has any), then the full length; `calls`: the fit()
    calls of each (fit_calls())."""
    phases = []
    if short_steps:
        pieces = f"the warmup's {short_sequence_length}-token pieces"
        rebuild = functools.partial(train_dataset_from, 0)
        phases.append(Phase(pieces, rebuild(), short_steps, calls[0], rebuild))
    rebuild = functools.partial(train_dataset_from, short_steps)
    phases.append(Phase("full length", rebuild(), total_steps - short_steps, calls[1], rebuild))
    return phases


def fit_calls(total_steps, steps_per_evaluation, phase_end=0):
    """How many fit() calls a run from step 0 makes before `phase_end` (the sequence-length
    warmup's) and after it (segments.fit_segments)."""
    calls = segments.fit_segments(0, total_steps, steps_per_evaluation, phase_end)
    before = sum(first < phase_end for first, _, _, _ in calls)
    return before, len(calls) - before


def checkpoint_count(total_steps, save_steps, steps_per_evaluation, phase_end=0, execution=1):
    """How many checkpoints a run from step 0 saves, as checkpoints.SaveCheckpoints saves them:
    one at the end of every fit() epoch (where an evaluation comes), and one at the end of each
    other execution (of `execution` steps) that crosses a multiple of `save_steps` (0: none)."""
    count = 0
    for first, _, epochs, steps in segments.fit_segments(
        0, total_steps, steps_per_evaluation, phase_end
    ):
        for start in range(first, first + epochs * steps, steps):
            count += 1  # the epoch's end
            if not save_steps:
                continue
            multiples = range((start // save_steps + 1) * save_steps, start + steps, save_steps)
            ends = {start + min(-(-(m - start) // execution) * execution, steps) for m in multiples}
            count += len(ends - {start + steps})  # the epoch's last execution: saved at its end
    return count


class StepClock(tf_keras.callbacks.Callback):
    """A Keras callback that notes when each of fit()'s executions, and evaluate()'s batches, end:
    the time between two ends is all that fit() does for a step, the input pipeline included."""

    def __init__(self):
        super().__init__()
        self.started = time.perf_counter()
        self.ends = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())

    def on_test_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())


def intervals_of(clock, steps_per_end=1):
    """The seconds from the clock's start to its first end, then between ends, per step (an
    execution ends `steps_per_end` steps)."""
    ends = [clock.started, *clock.ends]
    return [(later - earlier) / steps_per_end for earlier, later in zip(ends, ends[1:])]


def timing_of(intervals, steps_per_end=1):
    """A Timing from `intervals_of()`: the first, and the mean and spread of those after the
    warm-up (with too few, of all but the first), and the warm-up's time beyond as many mean
    steps, counted in whole executions."""
    warmup = WARMUP_EXECUTIONS if len(intervals) > WARMUP_EXECUTIONS else 1
    timed = intervals[warmup:] or intervals
    mean = statistics.fmean(timed)
    spread = statistics.stdev(timed) if len(timed) > 1 else 0.0
    extra = sum(intervals[:warmup]) - warmup * mean
    return Timing(intervals[0], mean, spread, len(timed), extra * steps_per_end)


def time_fit(trainer, dataset, steps_per_execution, restart=None):
    """fit() for WARMUP_EXECUTIONS executions and then TIMED_STEPS steps or more, on `dataset`;
    with `restart` (a function that gives the batches of a later call), a second short fit() call:
    building its batches and its first execution beyond a mean one are what each later call of
    the run pays (the input pipeline's restart)."""
    timed_executions = max(3, -(-TIMED_STEPS // steps_per_execution))
    steps = (WARMUP_EXECUTIONS + timed_executions) * steps_per_execution
    clock = StepClock()
    trainer.fit(dataset, epochs=1, steps_per_epoch=steps, callbacks=[clock], verbose=0)
    timing = timing_of(intervals_of(clock, steps_per_execution), steps_per_execution)
    if restart is not None:
        started = time.perf_counter()
        dataset = restart()
        built = time.perf_counter() - started
        clock = StepClock()
        steps = RESTART_EXECUTIONS * steps_per_execution
        trainer.fit(dataset, epochs=1, steps_per_epoch=steps, callbacks=[clock], verbose=0)
        first = intervals_of(clock, steps_per_execution)[0]
        timing.restart = built + max(0.0, (first - timing.mean) * steps_per_execution)
    return timing


def time_evaluation(trainer, dataset, batches, restart=False):
    """evaluate() on the first batches of `dataset` (all of them when there are few); with
    `restart`, a second call on a few, whose first batch beyond a mean one is what each later
    evaluation pays."""
    clock = StepClock()
    steps = min(batches, WARMUP_EXECUTIONS + TIMED_STEPS)
    trainer.evaluate(dataset, steps=steps, callbacks=[clock], verbose=0)
    timing = timing_of(intervals_of(clock))
    if restart:
        clock = StepClock()
        trainer.evaluate(
            dataset, steps=min(batches, RESTART_EXECUTIONS), callbacks=[clock], verbose=0
        )
        timing.restart = max(0.0, intervals_of(clock)[0] - timing.mean)
    return timing


def timed(action):
    """The seconds `action()` takes."""
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def time_overheads(start, checkpoint, checkpoints, final_save):
    """Overheads: `start` as measured; one checkpoint of `checkpoint` (a tf.train.Checkpoint, or
    None) written twice (the first write builds what the later ones reuse), counted `checkpoints`
    times; `final_save(folder)` once. Into a local temporary folder, removed at once: nothing
    reaches the run's output, the Hub or a bucket."""
    overheads = Overheads(start=start)
    folder = tempfile.mkdtemp(prefix="preflight-")
    try:
        if checkpoint is not None and checkpoints:
            manager = tf.train.CheckpointManager(
                checkpoint, os.path.join(folder, "checkpoints"), max_to_keep=1
            )
            overheads.checkpoint_first = timed(manager.save)
            overheads.checkpoint_each = timed(manager.save)
            overheads.checkpoints = checkpoints
        if final_save is not None:
            overheads.final_save = timed(lambda: final_save(os.path.join(folder, "model")))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return overheads


def seconds_since_process_start():
    """Seconds since this process started, by the kernel's clock: /proc/self/stat's start time
    (field 22, clock ticks since boot) against /proc/uptime (seconds since boot). None where Linux's
    /proc is not there: the start is then unknown, not guessed."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # the name may hold spaces
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # fields[0] is field 3
        with open("/proc/uptime") as uptime:
            now = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, now - started)


def describe_hardware(strategy):
    """The strategy, its replicas, the device they run on and its kind, TensorFlow's and libtpu's
    versions, and whether TensorFlow drives the TPU through PJRT."""
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


def peak_memory(strategy, hardware):
    """The Memory of a replica at its peak so far. On the CPU, which keeps no count of its own, the
    process's peak resident memory (all its replicas together) against the machine's RAM. On a GPU
    or TPU, the largest of the replicas' peaks in TensorFlow's allocator
    (tf.config.experimental.get_memory_info), against its 'limit' when it gives one, or on a TPU
    the memory of its generation (TPU_MEMORY_BYTES). Where no replica reports a peak (a TPU under
    PJRT: get_memory_info raises "Allocator stats not available"), a Memory without one, that says
    so: never a peak of 0 that would read as fitting."""
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
    peak = max((info.get("peak", 0) for info in infos), default=0)
    if not peak:  # after the steps ran, a peak of 0 is no measurement either
        if hardware["device"] == "TPU":
            why = "a TPU replica's allocator keeps no statistics: get_memory_info raises"
            return Memory(None, None, f"not reported under PJRT ({why})", "")
        return Memory(None, None, "not reported by the device (get_memory_info gave none)", "")
    limit = max((info.get("limit", 0) for info in infos), default=0)
    peak_of = "the largest replica's peak in TensorFlow's allocator, get_memory_info"
    if limit:
        return Memory(peak, limit, peak_of, "get_memory_info's limit")
    generation = hardware["device_kind"].removeprefix("TPU ")
    if hardware["device"] == "TPU" and generation in TPU_MEMORY_BYTES:
        return Memory(peak, TPU_MEMORY_BYTES[generation], peak_of, f"a {generation} chip's")
    return Memory(peak, None, peak_of, "the device's memory is unknown")


def bf16_peak(hardware):
    """The bf16 peak FLOPs a second of all the replicas together, and where it comes from; (None,
    why) for a device not in the tables, and (None, "") on the CPU, which has no such figure."""
    replicas, kind = hardware["replicas"], hardware["device_kind"]
    if hardware["device"] == "TPU":
        generation = kind.removeprefix("TPU ")
        if generation in TPU_BF16_PEAK:
            each = TPU_BF16_PEAK[generation]
            return (
                replicas * each,
                f"{replicas} x {each / 1e12:g} TFLOPs, a {generation} chip's bf16",
            )
        return None, f"no published bf16 peak known here for {kind}"
    if hardware["device"] == "GPU":
        for name, each in GPU_BF16_PEAK.items():
            if re.search(rf"\b{re.escape(name)}\b", kind):
                return (
                    replicas * each,
                    f"{replicas} x {each / 1e12:g} TFLOPs, an {name}'s dense bf16",
                )
        return None, f"no published bf16 peak known here for {kind}"
    return None, ""


# The architectures whose FLOPs training_flops() counts: BERT's encoder, which RoBERTa and
# XLM-RoBERTa share.
BERT_LIKE = ("bert", "roberta", "xlm-roberta")


def training_flops(config, tokens, predictions):
    """The model FLOPs of one training sequence of `tokens` tokens through a BERT-like encoder and
    its LM head at `predictions` positions (0: no LM head), and what they count; None for another
    architecture. As PaLM counts them (Chowdhery et al., 2022, appendix B): 6 FLOPs per weight of
    the matrix multiplies per token (2 forward, 4 backward), plus the attention's own matrix
    multiplies, 12 x layers x hidden size x tokens per token (no causal mask here to halve them).
    The embeddings are lookups; biases, layer norms, softmax and GELU are left out, as there."""
    if getattr(config, "model_type", None) not in BERT_LIKE:
        return None
    hidden, layers = config.hidden_size, config.num_hidden_layers
    layer_weights = 4 * hidden * hidden + 2 * hidden * config.intermediate_size
    encoder = 6 * layers * layer_weights * tokens + 12 * layers * hidden * tokens * tokens
    head = 6 * (hidden * hidden + hidden * config.vocab_size) * predictions
    counts = (
        f"PaLM's count: 6 x {layers * layer_weights:,} layer weights x {tokens} tokens, the "
        f"attention's 12 x {layers} layers x {hidden} x {tokens}²"
    )
    if predictions:
        counts += f", the LM head at {predictions} of {tokens} positions"
    return encoder + head, counts


def preflight_masked_lm(
    trainer,
    settings,
    schedule,
    max_length,
    train_dataset_from,
    origin,
    save=None,
    predictions=None,
):
    """run_mlm.py's preflight, from its Settings and training_run.Schedule (its evaluation: the
    masked_lm_data.EvaluationData scored, None without one), the shards' length,
    `train_dataset_from(step)` (the batches from an optimizer step on) and where the weights start
    (`origin`: a parent is evaluated once more, before step 1). `save(folder, masked_lm)`: the
    run's final save, timed (None: not); `predictions`: the masked positions a training sequence
    holds, which a sparse LM head scores (None: the model's FLOPs are not counted)."""
    masking, speed, steps = settings.masking, settings.speed, settings.steps
    cadence = steps.steps_per_evaluation(schedule.plan.steps_per_epoch)
    total_steps, phase_end = schedule.total_steps, schedule.phase_end
    phases = masked_lm_phases(
        train_dataset_from,
        phase_end,
        total_steps,
        masking.short_sequence_length,
        fit_calls(total_steps, cadence, phase_end),
    )
    run_evaluation, evaluation = None, schedule.evaluation
    if evaluation is not None:  # one at every fit() epoch end, and a parent's before step 1
        count = segments.evaluation_count(total_steps, cadence, phase_end)
        count += origin.evaluates_first  # continued pretraining
        others = tuple(evaluation_set.batches for evaluation_set in evaluation.sets[1:])
        run_evaluation = Evaluation(evaluation.dataset, evaluation.batches, count, others)
    advice = lower_the_batch(
        speed.per_replica_batch_size,
        max_length,
        "the shards' --max_length",
        speed.gradient_accumulation_steps,
    )
    masked_lm, sequences = trainer.masked_lm, schedule.plan.global_batch_size
    flops = None
    if predictions is not None:
        scored = max_length if speed.mlm_head == "full" else predictions
        counted = training_flops(masked_lm.config, max_length, scored)
        if counted is not None:
            flops = (counted[0] * sequences, f"{counted[1]}; x {sequences:,} sequences")
    return preflight(
        trainer,
        phases,
        evaluation=run_evaluation,
        sequences_per_step=sequences,
        tokens_per_sequence=max_length,
        steps_per_execution=speed.steps_per_execution,
        advice=advice,
        checkpoint=tf.train.Checkpoint(model=masked_lm, optimizer=trainer.optimizer),
        checkpoints=checkpoint_count(
            total_steps, steps.save_steps, cadence, phase_end, speed.steps_per_execution
        ),
        final_save=None
        if save is None
        else functools.partial(masked_lm_final_save, save, masked_lm),
        flops=flops,
    )


def masked_lm_final_save(save, masked_lm, folder):
    """run_mlm.py's end: the model folder (`save(folder, masked_lm)`), then the card's curves,
    drawn here from an empty TensorBoard folder: the drawing (matplotlib's start, most of it) is
    the same."""
    save(folder, masked_lm)
    with warnings.catch_warnings():  # no scalars: matplotlib warns of an empty legend
        warnings.simplefilter("ignore")
        training_logs.plot_curves(os.path.join(folder, "logs"), os.path.join(folder, "curves.png"))


def preflight_classifier(classifier, training, batches, max_length, bucket_lengths, save=None):
    """run_classifier.py's preflight, from its Training group, `batches`: (the training batches,
    all the run's steps, the validation batches, how many: scored after each epoch and once more
    for the final scores), the examples' length and the lengths batches are padded to (None: all
    to `max_length`). `save(folder, classifier)`: the run's final save, timed (None: not). Its
    FLOPs are counted when every batch has one length (the classifier's head, one small layer at
    one position, left out)."""
    train_dataset, total_steps, eval_dataset, eval_batches = batches
    sequences = (
        training.per_replica_batch_size * classifier.distribute_strategy.num_replicas_in_sync
    )
    flops = None
    counted = None
    if bucket_lengths is None:
        counted = training_flops(getattr(classifier, "config", None), max_length, 0)
    if counted is not None:
        flops = (counted[0] * sequences, f"{counted[1]}; x {sequences:,} sequences")
    return preflight(
        classifier,
        [Phase("fine-tuning", train_dataset, total_steps)],
        evaluation=Evaluation(eval_dataset, eval_batches, training.num_epochs + 1),
        sequences_per_step=sequences,
        tokens_per_sequence=max_length if bucket_lengths is None else None,
        advice=lower_the_batch(training.per_replica_batch_size, max_length, "--max_length"),
        final_save=None if save is None else (lambda folder: save(folder, classifier)),
        flops=flops,
    )
