"""--preflight's projection against the real run: run_mlm.py's command run with --preflight, then to
its end, each in a process of its own, and the projection set against the real process's
wall-clock.

    python benchmarks/preflight_projection.py -- --no_tpu --train_dataset lc4000/shards/train \
        --eval_dataset lc4000/shards/validation --tokenizer lc4000/tokenizer \
        --output_dir lc4000/model --max_steps 12600 ...

Everything after `--` goes to run_mlm.py unchanged: first with --preflight added, as `python
run_mlm.py ... --preflight`, whose report is printed and read; then as given, timed from the start
of its process to its exit, as a user's `time python run_mlm.py ...` would time it: Python's and
TensorFlow's start, the checks, the model's build, every step, evaluation, checkpoint and log, the
save and the PyTorch copy, and the exit. The projection counts the same whole process, so the two
should agree. The real run is started through this script (`--clock`), which calls run_mlm.py's
`main()` with a Keras callback that times its steps as the preflight times its own (the time
between the ends of two of fit()'s executions), so a second table shows each phase's mean step (the
sequence-length warmup's, the full length's) in both. The machine's load average is printed before
and after: other jobs on the same cores lengthen the real run, not the projection. The output
folder must not hold a finished model (the real run would refuse it).
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parent.parent  # run_mlm.py's folder
sys.path.insert(0, str(REPO))

from machine import describe_machine, load_average, markdown_table  # noqa: E402

from mlm_pipeline.errors import OneLineErrorParser, UsageError, exit_on_usage_error  # noqa: E402

# What the preflight's report says, as it prints it (mlm_pipeline/preflight.py, Report.lines()).
PHASE_LINE = re.compile(
    r"^  (.+?): first step .* then ([\d.]+) s a step \(mean of .*; ([\d,]+) steps in the run$", re.M
)
PROJECTED_LINE = re.compile(r"projected run: ([\d,.]+) minutes .*the whole process: (.*) \(logs")


def parse_args(argv=None):
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--clock",
        help="Run run_mlm.py's main() in this process with a clock on its steps, and write the "
        "steps' seconds to this JSON file (how the script starts the real run).",
    )
    parser.add_argument("run_mlm_flags", nargs="+", help="run_mlm.py's flags, after --.")
    return parser.parse_args(argv)


def training_clock(steps_per_execution):
    """A Keras callback that keeps each training step's seconds in `.seconds`, as (optimizer step,
    seconds): the time between the ends of two of fit()'s executions within an epoch (an epoch's
    first execution, after an evaluation or a fit() call's compile, is left out). It also notes
    the seconds since the process started (the kernel's count) when the first fit() call begins
    (`.first_fit`) and when the last one ends (`.last_fit_end`)."""
    import tf_keras

    from mlm_pipeline.preflight import seconds_since_process_start

    class TrainingClock(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds, self.step, self.previous = [], 0, None
            self.first_fit = self.last_fit_end = None

        def on_train_begin(self, logs=None):
            if self.first_fit is None:
                self.first_fit = seconds_since_process_start()

        def on_train_end(self, logs=None):
            self.last_fit_end = seconds_since_process_start()

        def on_epoch_begin(self, epoch, logs=None):
            self.previous = None

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self.previous is not None:
                self.seconds.append((self.step, (now - self.previous) / steps_per_execution))
            self.previous, self.step = now, self.step + steps_per_execution

    return TrainingClock()


def run_with_clock(flags, path):
    """The real run, in this process: run_mlm.py's main() with the clock; its steps' seconds and
    the process's times at the first fit(), after the last and at main()'s return, to `path`."""
    import run_mlm
    from mlm_pipeline.preflight import seconds_since_process_start

    settings = run_mlm.parse_args(flags)
    clock = training_clock(settings.speed.steps_per_execution)
    run_mlm.main(settings, callbacks=[clock])
    times = {"first_fit": clock.first_fit, "last_fit_end": clock.last_fit_end}
    times["main_returned"] = seconds_since_process_start()
    Path(path).write_text(json.dumps({"seconds": clock.seconds, "times": times}))


def step_seconds(seconds, first, end):
    """The mean and the median of the real run's steps `first` .. `end` - 1 (None, None without
    any)."""
    chosen = [value for step, value in seconds if first <= step < end]
    if not chosen:
        return None, None
    return statistics.fmean(chosen), statistics.median(chosen)


def timed_process(command):
    """Run `command`, its output shown; (seconds from its start to its exit, its stdout)."""
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    print(result.stdout, end="")
    if result.returncode:
        raise UsageError(f"{' '.join(map(str, command[:2]))} ... ended with {result.returncode}")
    return seconds, result.stdout


def main(args):
    if args.clock:
        return run_with_clock(args.run_mlm_flags, args.clock)
    print(describe_machine())
    flags = args.run_mlm_flags
    preflight_seconds, report = timed_process(
        [sys.executable, str(REPO / "run_mlm.py"), *flags, "--preflight"]
    )
    projection = PROJECTED_LINE.search(report)
    if projection is None:
        raise UsageError("the preflight printed no projection")
    projected = float(projection.group(1).replace(",", ""))
    with tempfile.TemporaryDirectory() as folder:
        clock_path = Path(folder) / "steps.json"
        command = [sys.executable, __file__, "--clock", str(clock_path), "--", *flags]
        real_seconds, _ = timed_process(command)
        clocked = json.loads(clock_path.read_text())
    seconds, times = clocked["seconds"], clocked["times"]
    real = real_seconds / 60
    print(f"Load average after the runs: {load_average()}")

    print()
    steps_in_run, rows = 0, []
    for name, mean, steps in PHASE_LINE.findall(report):
        steps = int(steps.replace(",", ""))
        real_mean, real_median = step_seconds(seconds, steps_in_run, steps_in_run + steps)
        steps_in_run += steps
        rows.append([name, f"{steps:,}", mean, seconds_cell(real_mean), seconds_cell(real_median)])
    header = ["", "steps", "preflight process minutes", "projected minutes", "real minutes"]
    row = [f"{steps_in_run:,}", f"{preflight_seconds / 60:.2f}", f"{projected:.2f}", f"{real:.2f}"]
    print(
        markdown_table(
            [*header, "real / projected"],
            [["the whole run", *row, f"**{real / projected:.2f}x**"]],
        )
    )
    print(f"\nThe projection's parts (minutes): {projection.group(2)}.")
    parts = {
        "start (to the first fit())": times["first_fit"],
        "the fit() calls (steps, evaluations, checkpoints)": times["last_fit_end"]
        - times["first_fit"],
        "after them (the save, the card and curves)": times["main_returned"]
        - times["last_fit_end"],
        "the exit (after main() returns)": real_seconds - times["main_returned"],
    }
    print(
        "The real process's parts (minutes): "
        + ", ".join(f"{name} {value / 60:.2f}" for name, value in parts.items())
        + ".\n"
    )
    header = ["phase", "steps", "preflight: mean s a step", "real run: mean", "real: median"]
    print(markdown_table(header, rows))


def seconds_cell(value):
    return "—" if value is None else f"{value:.4f}"


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "preflight_projection.py")
