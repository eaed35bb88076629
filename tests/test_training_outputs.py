"""What a user looks at after run_mlm.py: TensorBoard scalars, the curves PNG, the summary line, a
quiet log."""

import math
import os
import re
import tempfile

import pytest
from helpers import MAX_LENGTH, mlm_flags

import run_mlm
from mlm_pipeline import contract, tf_startup, training_logs
from mlm_pipeline.errors import UsageError

BATCH_SIZE = 8
LOGGING_STEPS = 6
EPOCHS = 2


@pytest.fixture(scope="module")
def run(shards_dir, tokenizer_dir, tiny_model, read_manifest, tmp_path_factory):
    """Two epochs of the tiny model, logging every LOGGING_STEPS steps; returns what main() returned
    and printed."""
    import io
    from contextlib import redirect_stdout

    output_dir = tmp_path_factory.mktemp("outputs")
    argv = [
        "--no_tpu",
        "--seed",
        "0",
        "--train_dataset",
        str(shards_dir / "train"),
        "--eval_dataset",
        str(shards_dir / "validation"),
        "--tokenizer",
        str(tokenizer_dir),
        "--output_dir",
        str(output_dir),
        "--config_overrides",
        tiny_model,
        "--per_replica_batch_size",
        str(BATCH_SIZE),
        "--num_epochs",
        str(EPOCHS),
        "--logging_steps",
        str(LOGGING_STEPS),
        "--warmup_ratio",
        "0.25",
    ]
    printed = io.StringIO()
    with redirect_stdout(printed):
        trainer, logs = run_mlm.main(run_mlm.parse_args(argv))
    steps_per_epoch = read_manifest(shards_dir / "train")["records"] // BATCH_SIZE
    assert steps_per_epoch % LOGGING_STEPS, (
        "the fixture should end each epoch between two logging points"
    )
    scalars = training_logs.read_scalars(str(output_dir / contract.TENSORBOARD_DIR))
    return {
        "trainer": trainer,
        "logs": logs,
        "printed": printed.getvalue(),
        "output_dir": output_dir,
        "steps_per_epoch": steps_per_epoch,
        "scalars": scalars,
    }


def test_training_scalars_every_logging_steps_and_at_each_epoch_end(run):
    per_epoch = run["steps_per_epoch"]
    epoch_ends = [per_epoch * (epoch + 1) for epoch in range(EPOCHS)]
    expected = sorted(
        set(range(LOGGING_STEPS, EPOCHS * per_epoch + 1, LOGGING_STEPS)) | set(epoch_ends)
    )
    for name in (
        "loss",
        "masked_accuracy",
        "mask_token_accuracy",
        "learning_rate",
        "tokens_per_second",
    ):
        assert sorted(run["scalars"][f"train/{name}"]) == expected, name
    assert all(value > 0 for value in run["scalars"]["train/tokens_per_second"].values())


def test_interval_losses_average_to_the_epoch_loss(run):
    """Each point is the mean over its own steps, so weighting them by their steps gives fit()'s
    epoch mean."""
    losses = sorted(run["scalars"]["train/loss"].items())
    per_epoch = run["steps_per_epoch"]
    for epoch in range(EPOCHS):
        start, end = epoch * per_epoch, (epoch + 1) * per_epoch
        total, previous = 0.0, start
        for step, loss in losses:
            if start < step <= end:
                total += loss * (step - previous)
                previous = step
        assert total / per_epoch == pytest.approx(run["logs"]["loss"][epoch], rel=1e-5)


def test_learning_rate_follows_the_warmup_and_decay(run):
    rates = run["scalars"]["train/learning_rate"]
    total = EPOCHS * run["steps_per_epoch"]
    warmup = int(0.25 * total)
    peak = run_mlm.parse_args(
        ["--train_dataset", "d", "--tokenizer", "t", "--output_dir", "o"]
    ).optimizer.learning_rate
    for step, rate in rates.items():
        expected = (
            peak * step / warmup if step < warmup else peak * (total - step) / (total - warmup)
        )
        assert rate == pytest.approx(expected, rel=1e-4, abs=1e-9), step


def test_evaluation_scalars_after_each_epoch(run):
    scalars, logs = run["scalars"], run["logs"]
    epoch_ends = [run["steps_per_epoch"] * (epoch + 1) for epoch in range(EPOCHS)]
    for name in ("loss", "perplexity", "masked_accuracy", "mask_token_accuracy", "top_token_share"):
        assert sorted(scalars[f"eval/{name}"]) == epoch_ends, name
        assert [scalars[f"eval/{name}"][step] for step in epoch_ends] == pytest.approx(
            logs[f"val_{name}"], rel=1e-6
        )
    for step in epoch_ends:
        assert scalars["eval/perplexity"][step] == pytest.approx(
            math.exp(scalars["eval/loss"][step]), rel=1e-5
        )


def test_curves_png_next_to_the_model(run):
    from PIL import Image

    path = run["output_dir"] / contract.CURVES_NAME
    with Image.open(path) as image:
        assert image.format == "PNG"
        width, height = image.size
        # Something was drawn: a blank canvas has a single colour.
        assert (
            width > 400
            and height > 200
            and len(image.convert("RGB").getcolors(maxcolors=1 << 20)) > 10
        )


def test_summary_line_says_how_the_run_ended(run):
    logs, steps = run["logs"], EPOCHS * run["steps_per_epoch"]
    last = run["printed"].strip().splitlines()[-1]
    expected = (
        f"Finished: {steps:,} steps, {steps * BATCH_SIZE * MAX_LENGTH:,} tokens seen, "
        f"eval loss {logs['val_loss'][-1]:.4f}, perplexity {logs['val_perplexity'][-1]:.2f}, "
        f"masked accuracy {logs['val_masked_accuracy'][-1]:.4f}, "
        f"accuracy at [MASK] {logs['val_mask_token_accuracy'][-1]:.4f}, wall time "
    )
    assert last.startswith(expected), last
    assert re.fullmatch(r"\d+\.\d min\.", last[len(expected) :]), last


def test_a_step_written_again_keeps_its_newer_value(tmp_path):
    """A resumed run repeats the steps after its last checkpoint: the curves keep the repeat."""
    import tensorflow as tf

    # the older run wrote steps 1-3, the resumed one 2-3
    for value, first_step in ((1.0, 1), (2.0, 2)):
        folder = tmp_path / str(value)
        writer = tf.summary.create_file_writer(str(folder))
        with writer.as_default():
            for step in range(first_step, 4):
                tf.summary.scalar("train/loss", value, step=step)
        writer.close()
        (written,) = folder.iterdir()
        parts = written.name.split(".")
        # written a second apart: the second file is the newer one
        parts[3] = str(1000 + int(value))
        written.rename(tmp_path / ".".join(parts))
    assert training_logs.read_scalars(str(tmp_path))["train/loss"] == {1: 1.0, 2: 2.0, 3: 2.0}


def test_tensorflow_startup_log_is_shown_only_when_startup_fails(capfd, monkeypatch, tmp_path):
    """The scripts load TensorFlow inside tf_startup.tensorflow_startup_log_held_back()."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where a failed start keeps its log
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    with tf_startup.tensorflow_startup_log_held_back():
        os.write(2, b"I0000 start-up chatter\n")
    assert capfd.readouterr().err == ""
    with pytest.raises(UsageError):
        with tf_startup.tensorflow_startup_log_held_back():
            os.write(2, b"I0000 start-up chatter\n")
            raise UsageError("the user's mistake: reported alone")
    assert capfd.readouterr().err == ""
    with pytest.raises(RuntimeError):
        with tf_startup.tensorflow_startup_log_held_back():
            os.write(2, b"E0000 the reason start-up failed\n")
            raise RuntimeError("failed")
    assert "the reason start-up failed" in capfd.readouterr().err
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # asked for everything
    with tf_startup.tensorflow_startup_log_held_back():
        os.write(2, b"I0000 start-up chatter\n")
    assert "start-up chatter" in capfd.readouterr().err


def test_a_whole_run_prints_no_tensorflow_log(
    run_script, shards_dir, tokenizer_dir, tiny_model, tmp_path, monkeypatch
):
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL")  # as a user runs it
    args = mlm_flags(
        shards_dir / "train", tokenizer_dir, tmp_path / "model", config_overrides=tiny_model
    )
    result = run_script("run_mlm.py", *args, "--max_steps", 2)
    assert result.returncode == 0, result.stderr[-3000:]
    tensorflow_log = re.compile(
        r"^(WARNING: All log messages before absl|[IWEF]\d{4} \d\d:\d\d:)", re.MULTILINE
    )
    assert not tensorflow_log.search(result.stderr), result.stderr[-3000:]
    assert "TensorFlow and JAX classes are deprecated" not in result.stderr + result.stdout


@pytest.mark.parametrize("script", ["train_unigram.py", "prepare_tfrecord_shards.py", "run_mlm.py"])
def test_help_is_complete_and_loads_no_heavy_library(script):
    """--help must answer at once: it may not load TensorFlow, transformers or datasets, and every
    flag says what it does."""
    from helpers import REPO, run_command

    probe = (
        f"import runpy, sys\nsys.argv = [{script!r}, '--help']\ntry:\n    "
        f"runpy.run_path({str(REPO / script)!r}, run_name='__main__')\nexcept SystemExit:\n    "
        "pass\nheavy = "
        "sorted({'tensorflow', 'tf_keras', 'transformers', 'datasets', 'tokenizers'} & "
        "set(sys.modules))\nprint('LOADED', heavy)\n"
    )
    result = run_command("-c", probe)
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stdout, result.stdout[-500:]
    flags = re.findall(r"^  (--\w+)(.*)$", result.stdout, re.MULTILINE)
    assert len(flags) > 5
    # argparse puts the help text on the flag's line or indents it on the next one; a flag without
    # either is followed directly by the next flag.
    lines = result.stdout.splitlines()
    for index, line in enumerate(lines):
        if re.match(r"^  --\w+", line) and not re.search(r"\s{2,}\S", line.strip()[2:]):
            following = lines[index + 1] if index + 1 < len(lines) else ""
            assert following.startswith(" " * 10) and following.strip(), (
                f"{script}: {line.strip()} has no help"
            )
