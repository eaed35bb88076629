"""--preflight's projection against the real run: run_mlm.py's command measured with --preflight,
then run to its end, and the two times set side by side.

    python benchmarks/preflight_projection.py -- --no_tpu --train_dataset lc4000/shards/train \
        --eval_dataset lc4000/shards/validation --tokenizer lc4000/tokenizer \
        --output_dir lc4000/model --max_steps 12600 ...

Everything after `--` goes to run_mlm.py unchanged: first with --preflight added (`main()` returns
its report), then as given, in the same process, timed from `main()`'s call to its return (the
checks, the model's build, every step, evaluation, checkpoint and log, the save); the start of
Python and TensorFlow, common to both, is left out. A Keras callback also times the real run's
steps as the preflight times its own (the time between the ends of two of fit()'s executions), so
a second table shows the median step of each phase (the sequence-length warmup's, the full
length's) in both, and the real run's mean step: the projection counts every step at the median, so
a machine whose share of its host varies (stalls lift the mean, not the median) runs longer than
projected. The output folder must not hold a
finished model (the real run would refuse it).
"""

import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run_mlm.py's folder

from machine import describe_machine, markdown_table  # noqa: E402

import run_mlm  # noqa: E402
from mlm_pipeline.errors import OneLineErrorParser, exit_on_usage_error  # noqa: E402


def parse_args(argv=None):
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_mlm_flags", nargs="+", help="run_mlm.py's flags, after --.")
    return parser.parse_args(argv)


def training_clock(steps_per_execution):
    """A Keras callback that keeps each training step's seconds in `.seconds`, as (optimizer step,
    seconds): the time between the ends of two of fit()'s executions within an epoch (an epoch's
    first execution, after an evaluation or a fit() call's compile, is left out)."""
    import tf_keras

    class TrainingClock(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds, self.step, self.previous = [], 0, None

        def on_epoch_begin(self, epoch, logs=None):
            self.previous = None

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self.previous is not None:
                self.seconds.append((self.step, (now - self.previous) / steps_per_execution))
            self.previous, self.step = now, self.step + steps_per_execution

    return TrainingClock()


def step_seconds(clock, first, end):
    """The median and the mean of the real run's steps `first` .. `end` - 1 (None, None without
    any): on a shared machine the stalls lift the mean far above the median."""
    seconds = [value for step, value in clock.seconds if first <= step < end]
    if not seconds:
        return None, None
    return statistics.median(seconds), statistics.mean(seconds)


def main(args):
    print(describe_machine())
    flags = args.run_mlm_flags
    started = time.perf_counter()
    report = run_mlm.main(run_mlm.parse_args([*flags, "--preflight"]))
    preflight_minutes = (time.perf_counter() - started) / 60

    clock = training_clock(run_mlm.parse_args(flags).speed.steps_per_execution)
    started = time.perf_counter()
    run_mlm.main(run_mlm.parse_args(flags), callbacks=[clock])
    real_minutes = (time.perf_counter() - started) / 60

    projected = report.projected_seconds / 60
    first_step = 0
    rows = []
    for phase, timing in report.phases:
        median, mean = step_seconds(clock, first_step, first_step + phase.steps)
        first_step += phase.steps
        rows.append(
            [phase.name, f"{phase.steps:,}", f"{timing.median:.4f}", seconds(median), seconds(mean)]
        )
    print()
    steps = sum(phase.steps for phase, _ in report.phases)
    header = ["", "steps", "preflight minutes", "projected minutes", "real minutes"]
    minutes = [preflight_minutes, projected, real_minutes]
    row = ["the whole run", f"{steps:,}", *(f"{value:.2f}" for value in minutes)]
    print(
        markdown_table(
            [*header, "real / projected"], [[*row, f"**{real_minutes / projected:.2f}x**"]]
        )
    )
    print()
    header = ["phase", "steps", "preflight: median s a step", "real run: median", "real: mean"]
    print(markdown_table(header, rows))


def seconds(value):
    return "—" if value is None else f"{value:.4f}"


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "preflight_projection.py")
