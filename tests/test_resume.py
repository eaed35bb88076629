"""Preemption: checkpoints every --save_steps, and the same command run again resumes where the run stopped."""

import json
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import run_mlm
from conftest import REPO, TINY_MODEL, subprocess_env
from mlm_pipeline import checkpoints, contract

BATCH_SIZE = 8
SAVE_STEPS = 5
NO_DROPOUT = ",hidden_dropout_prob=0,attention_probs_dropout_prob=0"  # so reruns can match to the last bit


def training_args(shards_dir, tokenizer_dir, output_dir, *extra):
    args = [
        "--no_tpu",
        "--train_dataset", shards_dir / "train",
        "--eval_dataset", shards_dir / "validation",
        "--tokenizer", tokenizer_dir,
        "--output_dir", output_dir,
        "--config_overrides", TINY_MODEL + NO_DROPOUT,
        "--per_replica_batch_size", BATCH_SIZE,
        "--save_steps", SAVE_STEPS,
        "--shuffle_buffer_size", 64,
        "--seed", 0,
        *extra,
    ]  # fmt: skip
    return [str(arg) for arg in args]


def latest_checkpoint_step(output_dir):
    state = output_dir / contract.CHECKPOINT_DIR / "checkpoint"
    match = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', state.read_text(), re.M) if state.exists() else None
    return int(match.group(1)) if match else None


def load_weights(folder):
    from transformers import TFAutoModelForMaskedLM

    # tf_model.h5: transformers 4.57's TF loader fails on the PyTorch copy (model.safetensors) beside it.
    model = TFAutoModelForMaskedLM.from_pretrained(str(folder))
    return [weight.numpy() for weight in model.weights]


@pytest.mark.parametrize(
    ("start", "total", "per_epoch", "expected"),
    [
        (0, 30, 10, [(0, 0, 3, 10)]),
        (0, 25, 10, [(0, 0, 2, 10), (20, 2, 1, 5)]),
        (7, 30, 10, [(7, 0, 1, 3), (10, 1, 2, 10)]),
        (7, 9, 10, [(7, 0, 1, 2)]),
        (13, 25, 10, [(13, 1, 1, 7), (20, 2, 1, 5)]),
        (30, 30, 10, []),
    ],
)
def test_fit_segments_cover_exactly_the_remaining_steps(start, total, per_epoch, expected):
    segments = checkpoints.fit_segments(start, total, per_epoch)
    assert segments == expected
    step = start
    for first_step, epoch, epochs, steps in segments:
        assert first_step == step and epoch == first_step // per_epoch
        assert steps <= per_epoch - first_step % per_epoch  # no fit() epoch crosses an epoch of the data
        step += epochs * steps
    assert step == total


def test_a_killed_run_resumes_and_ends_where_an_uninterrupted_run_ends(
    shards_dir, tokenizer_dir, read_manifest, tmp_path
):
    per_epoch = read_manifest(shards_dir / "train")["records"] // BATCH_SIZE
    total = per_epoch + 7  # the kill lands in the first epoch; the run ends inside the second
    interrupted, uninterrupted = tmp_path / "interrupted", tmp_path / "uninterrupted"
    command = [sys.executable, str(REPO / "run_mlm.py")]

    # SIGKILL, no warning, as soon as the first step checkpoint exists.
    args = training_args(shards_dir, tokenizer_dir, interrupted, "--num_epochs", 2, "--max_steps", total)
    process = subprocess.Popen(command + args, cwd=REPO, env=subprocess_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while latest_checkpoint_step(interrupted) is None:
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stderr.close()
    saved_step = latest_checkpoint_step(interrupted)
    assert SAVE_STEPS <= saved_step < total
    assert not (interrupted / "config.json").exists()  # not a finished model

    rerun = subprocess.run(command + args, cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    # It went back to the newest checkpoint, so at most one save interval of work was lost.
    assert f"ckpt-{saved_step} at step {saved_step} of {total}." in rerun.stdout, rerun.stdout
    assert f"Finished: {total:,} steps" in rerun.stdout
    assert latest_checkpoint_step(interrupted) == total

    # The curve file holds every epoch once: the interrupted epoch is logged when the resumed run ends it.
    log = (interrupted / contract.TRAINING_LOG_NAME).read_text().splitlines()
    assert [row.split(",")[0] for row in log[1:]] == ["0", "1"]

    run_mlm.main(run_mlm.parse_args(training_args(shards_dir, tokenizer_dir, uninterrupted, "--num_epochs", 2, "--max_steps", total)))
    # Same weights, optimizer state, schedule position and data stream: the resumed run ends on the same model.
    for resumed, straight in zip(load_weights(interrupted), load_weights(uninterrupted)):
        np.testing.assert_allclose(resumed, straight, rtol=1e-4, atol=1e-6)

    from transformers import pipeline

    fill_mask = pipeline("fill-mask", model=str(interrupted), dtype=None)
    predictions = fill_mask("the river [MASK] the city.", top_k=3)
    assert len(predictions) == 3


def test_a_rerun_with_other_settings_is_refused_and_overwrite_starts_afresh(
    run_script, shards_dir, tokenizer_dir, tmp_path
):
    output_dir = tmp_path / "run"
    first = training_args(shards_dir, tokenizer_dir, output_dir, "--max_steps", 12)
    other = training_args(shards_dir, tokenizer_dir, output_dir, "--max_steps", 12, "--learning_rate", "3e-4")
    run_mlm.main(run_mlm.parse_args(first))
    (output_dir / "config.json").unlink()  # as if the run had been killed before its final save
    checkpoints = sorted(path.name for path in (output_dir / contract.CHECKPOINT_DIR).iterdir())

    result = run_script("run_mlm.py", *other)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "learning_rate" in result.stderr and "--overwrite_output_dir" in result.stderr
    assert sorted(path.name for path in (output_dir / contract.CHECKPOINT_DIR).iterdir()) == checkpoints

    _, logs = run_mlm.main(run_mlm.parse_args(other + ["--overwrite_output_dir"]))
    assert logs["step"] == [12]  # started from step 0, not resumed from 12
    settings = json.loads((output_dir / contract.CHECKPOINT_DIR / contract.RUN_SETTINGS_NAME).read_text())
    assert settings["learning_rate"] == 3e-4
