"""--eval_steps: a long run evaluates every N optimizer steps, whatever the passes over the data,
with its TensorBoard scalars, its row of training_log.csv and its checkpoint; a resumed run keeps
the cadence. --max_eval_samples: the first whole batches of the evaluation split. And the lines that
open a run: the batch, the tokens a step, an epoch's steps and when the first evaluation comes."""

import re

import pytest
from helpers import MAX_LENGTH
from test_resume import Interrupted, interrupt_at_checkpoint, training_args

import run_mlm
from mlm_pipeline import contract, segments, training_logs
from mlm_pipeline.errors import UsageError

BATCH_SIZE = 16
EVAL_STEPS = 6
# whole evaluation batches of BATCH_SIZE: 2, and 8 sequences left out
MAX_EVAL_SAMPLES = 2 * BATCH_SIZE + 8


def eval_steps_argv(shards_dir, tokenizer_dir, output_dir, total):
    return training_args(
        shards_dir,
        tokenizer_dir,
        output_dir,
        "--per_replica_batch_size",
        BATCH_SIZE,
        "--max_steps",
        total,
        "--eval_steps",
        EVAL_STEPS,
        "--max_eval_samples",
        MAX_EVAL_SAMPLES,
        "--save_steps",
        4,  # checkpoints between the evaluations too: a kill may land mid-interval
        "--no_pytorch_export",
    )


def evaluation_batch_counter():
    """A Keras callback that counts the batches of each evaluation fit() runs."""
    import tf_keras

    class Counter(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.evaluations = []

        def on_test_begin(self, logs=None):
            self.evaluations.append(0)

        def on_test_batch_end(self, batch, logs=None):
            self.evaluations[-1] = batch + 1

    return Counter()


def csv_rows(output_dir):
    return training_logs.read_training_log(str(output_dir / contract.TRAINING_LOG_NAME))[1]


@pytest.fixture(scope="module")
def per_epoch(shards_dir, read_manifest):
    steps = read_manifest(shards_dir / "train")["records"] // BATCH_SIZE
    assert steps % EVAL_STEPS, "an evaluation interval should straddle the end of the first pass"
    return steps


@pytest.fixture(scope="module")
def straight_run(shards_dir, tokenizer_dir, per_epoch, tmp_path_factory):
    """An uninterrupted run past one pass over the data, its last interval a part one."""
    import io
    from contextlib import redirect_stdout

    output_dir = tmp_path_factory.mktemp("eval-steps")
    total = per_epoch + EVAL_STEPS + 2
    counter, printed = evaluation_batch_counter(), io.StringIO()
    with redirect_stdout(printed):
        _, logs = run_mlm.main(
            run_mlm.parse_args(eval_steps_argv(shards_dir, tokenizer_dir, output_dir, total)),
            callbacks=[counter],
        )
    evaluated = [*range(EVAL_STEPS, total, EVAL_STEPS), total]
    return {
        "output_dir": output_dir,
        "total": total,
        "evaluated": evaluated,
        "logs": logs,
        "printed": printed.getvalue(),
        "evaluation_batches": counter.evaluations,
    }


def test_a_row_and_evaluation_scalars_every_eval_steps_across_the_passes(straight_run, per_epoch):
    evaluated = straight_run["evaluated"]
    rows = csv_rows(straight_run["output_dir"])
    # the epoch column is the pass over the data each evaluated step trained on
    assert [(int(row["epoch"]), int(row["step"])) for row in rows] == [
        ((step - 1) // per_epoch, step) for step in evaluated
    ]
    assert {int(row["epoch"]) for row in rows} == {0, 1}
    scalars = training_logs.read_scalars(str(straight_run["output_dir"] / contract.TENSORBOARD_DIR))
    for name in ("loss", "perplexity", "mask_token_accuracy"):
        assert sorted(scalars[f"eval/{name}"]) == evaluated, name
    assert [scalars["eval/loss"][step] for step in evaluated] == pytest.approx(
        [float(row["val_loss"]) for row in rows], rel=1e-6
    )
    # the training scalars close each interval too: the interval's own figures
    assert set(evaluated) <= set(scalars["train/loss"])
    # the data's passes are not fit()'s epochs any more: no 'Epoch k/K' lines, a steps-left line
    # after each evaluation
    printed = straight_run["printed"]
    assert not re.search(r"^Epoch \d+/\d+$", printed, re.M)
    total = straight_run["total"]
    assert re.findall(r"^step (\d+)/(\d+), ", printed, re.M) == [
        (str(step), str(total)) for step in evaluated
    ]


def test_max_eval_samples_scores_the_first_whole_batches(straight_run, read_manifest, shards_dir):
    assert straight_run["evaluation_batches"] == [2] * len(straight_run["evaluated"])
    records = read_manifest(shards_dir / "validation")["records"]
    assert records > MAX_EVAL_SAMPLES
    assert (
        f"Each evaluation scores {2 * BATCH_SIZE} of the evaluation split's {records} sequences: "
        f"its first 2 batches of {BATCH_SIZE} (--max_eval_samples {MAX_EVAL_SAMPLES} rounded down "
        "to whole batches)." in straight_run["printed"]
    )


def test_the_first_lines_say_the_batch_the_epoch_and_the_first_evaluation(straight_run, per_epoch):
    lines = straight_run["printed"].splitlines()
    (training,) = [line for line in lines if line.startswith("Training ")]
    assert training.endswith(
        f" on 1 replica of _DefaultDistributionStrategy: a global batch of {BATCH_SIZE} sequences "
        f"({BATCH_SIZE} a replica) x {MAX_LENGTH} tokens = {BATCH_SIZE * MAX_LENGTH} tokens a "
        "step."
    ), training
    total = straight_run["total"]
    epochs = re.escape(f"{total / per_epoch:.2f}")
    schedule = (
        rf"^An epoch \(a pass over the data\) is {per_epoch} steps; {total} steps = {epochs} "
        rf"epochs; first evaluation after step {EVAL_STEPS}, then every {EVAL_STEPS} steps and "
        rf"after step {total}, the last\.$"
    )
    assert [line for line in lines if re.match(schedule, line)], lines[:10]
    # before the first step: the lines come ahead of any progress
    first_progress = next(index for index, line in enumerate(lines) if line.startswith("step "))
    assert lines.index(training) < first_progress


@pytest.mark.parametrize(
    ("interrupted_at", "resumed_at"),
    [
        # a --save_steps checkpoint between two evaluations: the next one stays on the cadence
        (16, 16),
        # an evaluation's checkpoint saved, the run killed before its row was written
        (2 * EVAL_STEPS, 2 * EVAL_STEPS),
    ],
)
def test_a_resumed_run_keeps_the_cadence_without_a_row_twice_or_missing(
    interrupted_at,
    resumed_at,
    straight_run,
    shards_dir,
    tokenizer_dir,
    tmp_path,
    monkeypatch,
    capsys,
):
    total = straight_run["total"]
    argv = eval_steps_argv(shards_dir, tokenizer_dir, tmp_path, total)
    interrupt_at_checkpoint(monkeypatch, interrupted_at, before=False)
    with pytest.raises(Interrupted):
        run_mlm.main(run_mlm.parse_args(argv))
    assert max(int(row["step"]) for row in csv_rows(tmp_path)) <= interrupted_at
    capsys.readouterr()

    run_mlm.main(run_mlm.parse_args(argv))
    printed = capsys.readouterr().out
    next_evaluation = (resumed_at // EVAL_STEPS + 1) * EVAL_STEPS
    assert f"at step {resumed_at} of {total}." in printed
    assert f"; next evaluation after step {next_evaluation}, then every {EVAL_STEPS} " in printed

    rows = csv_rows(tmp_path)
    evaluated = straight_run["evaluated"]
    assert [int(row["step"]) for row in rows] == evaluated
    # The same weights and data stream as the uninterrupted run: the same evaluation figures.
    straight = csv_rows(straight_run["output_dir"])
    assert [float(row["val_loss"]) for row in rows] == pytest.approx(
        [float(row["val_loss"]) for row in straight], rel=1e-4
    )
    scalars = training_logs.read_scalars(str(tmp_path / contract.TENSORBOARD_DIR))
    assert sorted(scalars["eval/loss"]) == evaluated


@pytest.mark.parametrize(
    ("start", "total", "per_epoch", "per_evaluation", "phase_end", "expected"),
    [
        (
            0,
            100_000,
            12_345,
            2_000,
            0,
            "An epoch (a pass over the data) is 12,345 steps; 100,000 steps = 8.10 epochs; first "
            "evaluation after step 2,000, then every 2,000 steps.",
        ),
        (
            4_500,
            100_000,
            12_345,
            2_000,
            0,
            "An epoch (a pass over the data) is 12,345 steps; 100,000 steps = 8.10 epochs; next "
            "evaluation after step 6,000, then every 2,000 steps.",
        ),
        (
            0,
            30,
            10,
            10,
            15,
            "An epoch (a pass over the data) is 10 steps; 30 steps = 3 epochs; first evaluation "
            "after step 10, then at each epoch end and after step 15 (the sequence-length "
            "warmup's end).",
        ),
        (
            0,
            105,
            40,
            10,
            35,
            "An epoch (a pass over the data) is 40 steps; 105 steps = 2.62 epochs; first "
            "evaluation after step 10, then every 10 steps, after step 35 (the sequence-length "
            "warmup's end) and after step 105, the last.",
        ),
        (
            30,
            30,
            10,
            4,
            0,
            "An epoch (a pass over the data) is 10 steps; 30 steps = 3 epochs; no step is left to "
            "train.",
        ),
    ],
)
def test_schedule_line(start, total, per_epoch, per_evaluation, phase_end, expected):
    line = segments.schedule_line(start, total, per_epoch, per_evaluation, phase_end=phase_end)
    assert line == expected


def test_evaluation_batches_round_down_and_refuse_less_than_a_batch():
    assert segments.evaluation_batches(19, 5_000, 256, None)[0] == 19
    assert segments.evaluation_batches(19, 5_000, 256, 1_000_000) == (
        19,
        "Each evaluation scores 4,864 of the evaluation split's 5,000 sequences: all its whole 19 "
        "batches of 256.",
    )
    assert segments.evaluation_batches(19, 5_000, 256, 768)[1].endswith("first 3 batches of 256.")
    with pytest.raises(UsageError, match=r"^--max_eval_samples 255 is less than one global batch"):
        segments.evaluation_batches(19, 5_000, 256, 255)
