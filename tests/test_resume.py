"""Preemption: checkpoints every --save_steps, and the same command run again resumes where the run
stopped."""

import json
import re

import numpy as np
import pytest
from helpers import TINY_MODEL, kill_when, run_command, start_script, tiny_run_flags
from refusals import refused, script_in_process

import run_mlm
from mlm_pipeline import contract, segments

BATCH_SIZE = 8
SAVE_STEPS = 5
# so reruns can match to the last bit
NO_DROPOUT = ",hidden_dropout_prob=0,attention_probs_dropout_prob=0"


def training_args(shards_dir, tokenizer_dir, output_dir, *extra):
    return tiny_run_flags(
        shards_dir,
        tokenizer_dir,
        output_dir,
        *extra,
        config_overrides=TINY_MODEL + NO_DROPOUT,
        per_replica_batch_size=BATCH_SIZE,
        save_steps=SAVE_STEPS,
        shuffle_buffer_size=64,
        seed=0,
    )


def latest_checkpoint_step(output_dir):
    state = output_dir / contract.CHECKPOINT_DIR / "checkpoint"
    match = (
        re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', state.read_text(), re.M)
        if state.exists()
        else None
    )
    return int(match.group(1)) if match else None


def load_weights(folder):
    from transformers import TFAutoModelForMaskedLM

    # tf_model.h5: transformers 4.57's TF loader fails on the PyTorch copy
    # (model.safetensors) beside it.
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
    calls = segments.fit_segments(start, total, per_epoch)
    assert calls == expected
    step = start
    for first_step, epoch, epochs, steps in calls:
        assert first_step == step and epoch == first_step // per_epoch
        # no fit() epoch crosses an epoch of the data
        assert steps <= per_epoch - first_step % per_epoch
        step += epochs * steps
    assert step == total


def test_a_killed_run_resumes_and_ends_where_an_uninterrupted_run_ends(
    shards_dir, tokenizer_dir, read_manifest, tmp_path
):
    per_epoch = read_manifest(shards_dir / "train")["records"] // BATCH_SIZE
    # --max_steps beyond the one epoch of --num_epochs' default: the kill lands in the first epoch,
    # the run repeats the data and ends inside the second.
    total = per_epoch + 7
    interrupted, uninterrupted = tmp_path / "interrupted", tmp_path / "uninterrupted"

    # SIGKILL, no warning, as soon as the first step checkpoint exists.
    args = training_args(shards_dir, tokenizer_dir, interrupted, "--max_steps", total)
    process = start_script("run_mlm.py", *args)
    kill_when(process, lambda: latest_checkpoint_step(interrupted) is not None, "checkpoint")
    saved_step = latest_checkpoint_step(interrupted)
    assert SAVE_STEPS <= saved_step < total
    assert not (interrupted / "config.json").exists()  # not a finished model

    rerun = run_command("run_mlm.py", *args)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    # It went back to the newest checkpoint, so at most one save interval of work was lost.
    assert f"ckpt-{saved_step} at step {saved_step} of {total}." in rerun.stdout, rerun.stdout
    assert f"Finished: {total:,} steps" in rerun.stdout
    assert latest_checkpoint_step(interrupted) == total

    # The curve file holds every epoch once: the interrupted epoch is logged
    # when the resumed run ends it.
    log = (interrupted / contract.TRAINING_LOG_NAME).read_text().splitlines()
    assert [row.split(",")[0] for row in log[1:]] == ["0", "1"]

    run_mlm.main(
        run_mlm.parse_args(
            training_args(shards_dir, tokenizer_dir, uninterrupted, "--max_steps", total)
        )
    )
    # Same weights, optimizer state, schedule position and data stream: the resumed
    # run ends on the same model.
    for resumed, straight in zip(load_weights(interrupted), load_weights(uninterrupted)):
        np.testing.assert_allclose(resumed, straight, rtol=1e-4, atol=1e-6)

    from transformers import pipeline

    fill_mask = pipeline("fill-mask", model=str(interrupted), dtype=None)
    predictions = fill_mask("the river [MASK] the city.", top_k=3)
    assert len(predictions) == 3


def test_a_rerun_with_other_settings_is_refused_and_overwrite_starts_afresh(
    shards_dir, tokenizer_dir, tmp_path
):
    output_dir = tmp_path / "run"
    first = training_args(shards_dir, tokenizer_dir, output_dir, "--max_steps", 12)
    other = training_args(
        shards_dir, tokenizer_dir, output_dir, "--max_steps", 12, "--learning_rate", "3e-4"
    )
    run_mlm.main(run_mlm.parse_args(first))
    (output_dir / "config.json").unlink()  # as if the run had been killed before its final save
    checkpoints = sorted(path.name for path in (output_dir / contract.CHECKPOINT_DIR).iterdir())

    result = script_in_process("run_mlm.py", *other)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "learning_rate" in result.stderr and "--overwrite_output_dir" in result.stderr
    assert (
        sorted(path.name for path in (output_dir / contract.CHECKPOINT_DIR).iterdir())
        == checkpoints
    )

    _, logs = run_mlm.main(run_mlm.parse_args(other + ["--overwrite_output_dir"]))
    assert logs["step"] == [12]  # started from step 0, not resumed from 12
    settings = json.loads(
        (output_dir / contract.CHECKPOINT_DIR / contract.RUN_SETTINGS_NAME).read_text()
    )
    assert settings["learning_rate"] == 3e-4


def test_a_run_from_before_accumulation_multiplied_the_batch_is_refused_with_the_flags_to_resume(
    shards_dir, tokenizer_dir, tmp_path
):
    """--gradient_accumulation_steps N used to split each replica's batch into N micro-batches:
    `--per_replica_batch_size 8 --gradient_accumulation_steps 2` trained 8 sequences a step on one
    replica, and its run_settings.json says so. The same command now trains 16: resuming is refused
    in one line that says why and gives the flags that continue the run at its own batch."""
    output_dir = tmp_path / "run"
    # what such a run recorded: the global batch of 8 without the accumulation (one batch of 8 a
    # step, the same stream of sequences), and no other key
    run_mlm.main(
        run_mlm.parse_args(training_args(shards_dir, tokenizer_dir, output_dir, "--max_steps", 4))
    )
    (output_dir / "config.json").unlink()  # as if the run had been killed before its final save
    record = output_dir / contract.CHECKPOINT_DIR / contract.RUN_SETTINGS_NAME
    assert json.loads(record.read_text())["global_batch_size"] == BATCH_SIZE
    old_command = training_args(
        shards_dir, tokenizer_dir, output_dir, "--max_steps", 4, "--gradient_accumulation_steps", 2
    )
    line = refused(
        script_in_process,
        "run_mlm.py",
        old_command,
        output_dir,
        "(global_batch_size differ)",
        "--gradient_accumulation_steps 2 now multiplies the batch, as in transformers' Trainer",
        f"{2 * BATCH_SIZE} sequences a step",
        f"trained {BATCH_SIZE};",
        "--overwrite_output_dir",
    )
    flags = line.split("its exact command with ", 1)[1].split(",", 1)[0].split()
    assert flags == ["--per_replica_batch_size", "4", "--gradient_accumulation_steps", "2"]

    # those flags resume it: the same global batch, from the step it reached
    result = script_in_process("run_mlm.py", *old_command, *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Resuming from {output_dir / contract.CHECKPOINT_DIR}" in result.stdout
    assert "a global batch of 8 sequences (4 a replica x 2 accumulated)" in result.stdout
    assert json.loads(record.read_text())["global_batch_size"] == BATCH_SIZE


class Interrupted(BaseException):
    """A stand-in for SIGKILL: a BaseException, so nothing on its way out of main() handles it."""


def interrupt_at_checkpoint(monkeypatch, step, before):
    """Make the saving of the checkpoint of `step` interrupt the run, `before` writing it or just
    after."""
    import tensorflow as tf

    save = tf.train.CheckpointManager.save

    def interrupting_save(manager, checkpoint_number=None, **kwargs):
        if checkpoint_number == step:
            # once: the rerun saves normally
            monkeypatch.setattr(tf.train.CheckpointManager, "save", save)
            if before:
                raise Interrupted
            save(manager, checkpoint_number=checkpoint_number, **kwargs)
            raise Interrupted
        return save(manager, checkpoint_number=checkpoint_number, **kwargs)

    monkeypatch.setattr(tf.train.CheckpointManager, "save", interrupting_save)


@pytest.mark.parametrize(
    ("save_steps", "interrupted_at", "before"),
    [
        # the epoch's last step is a multiple of --save_steps; its row not yet logged
        (5, "epoch_end", False),
        # the epoch's row is due once its checkpoint is saved: resumed from step 18
        (6, "epoch_end", True),
        # nothing left to train when resumed: the figures come from the log
        (5, "last_step", False),
    ],
)
def test_an_interrupted_run_logs_every_epoch_once_and_reports_its_figures(
    save_steps,
    interrupted_at,
    before,
    shards_dir,
    tokenizer_dir,
    read_manifest,
    tmp_path,
    monkeypatch,
    capsys,
):
    batch_size = 16
    per_epoch = read_manifest(shards_dir / "train")["records"] // batch_size
    total = per_epoch + 5  # beyond one epoch: two rows, the second for a part of an epoch
    assert per_epoch % 5 == 0 and per_epoch % 6 and total % 6
    argv = training_args(
        shards_dir,
        tokenizer_dir,
        tmp_path,
        "--max_steps",
        total,
        "--save_steps",
        save_steps,
        "--per_replica_batch_size",
        batch_size,
    )
    interrupt_at_checkpoint(
        monkeypatch, per_epoch if interrupted_at == "epoch_end" else total, before
    )
    with pytest.raises(Interrupted):
        run_mlm.main(run_mlm.parse_args(argv))
    assert not (tmp_path / "config.json").exists()

    trainer, _ = run_mlm.main(run_mlm.parse_args(argv))
    assert int(trainer.optimizer.iterations.numpy()) == total
    log = (tmp_path / contract.TRAINING_LOG_NAME).read_text().splitlines()
    columns = log[0].split(",")
    rows = [dict(zip(columns, row.split(","))) for row in log[1:]]
    assert [(row["epoch"], row["step"]) for row in rows] == [
        ("0", str(per_epoch)),
        ("1", str(total)),
    ], log
    assert all(row["val_loss"] and row["loss"] for row in rows), log

    # The card and the summary line show the last epoch's figures, whichever run trained it.
    last = rows[-1]
    results = (tmp_path / "README.md").read_text().split("## Results")[1]
    assert (
        f"| masked-LM loss | {float(last['loss']):.4f} | {float(last['val_loss']):.4f} |" in results
    ), results
    assert "–" not in results, results
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert (
        f"Finished: {total:,} steps" in summary
        and f"eval loss {float(last['val_loss']):.4f}" in summary
    ), summary
