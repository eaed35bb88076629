"""--average_last K: the model handed on is the mean of the weights of the run's last K checkpoints,
the last step's own model is saved in last_step/, both are evaluated, printed and in the card; a run
killed before its final save resumes and finishes; a run that cannot have K checkpoints is
refused before any work."""

import re

import numpy as np
import pytest
from helpers import TINY_MODEL, tiny_run_flags
from refusals import refused, script_in_process

import run_mlm
from mlm_pipeline import averaging, contract, model_folder

NO_DROPOUT = ",hidden_dropout_prob=0,attention_probs_dropout_prob=0"
AVERAGE_LAST = 3


class Interrupted(BaseException):
    """A stand-in for SIGKILL: a BaseException, so nothing on its way out of main() handles it."""


def model_values_of_checkpoint(path):
    """A checkpoint's model variables, read by key from its files (the optimizer's left out)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(path))
    return {
        key: reader.get_tensor(key)
        for key, _ in tf.train.list_variables(str(path))
        if key.startswith("model/")
        and key.endswith("/.ATTRIBUTES/VARIABLE_VALUE")
        and ".OPTIMIZER_SLOT" not in key
    }


def model_values_of_folder(folder, scratch):
    """A saved model folder's weights (tf_model.h5), under the keys of a run's checkpoints."""
    import tensorflow as tf
    from transformers import TFAutoModelForMaskedLM

    model = TFAutoModelForMaskedLM.from_pretrained(str(folder))
    return model_values_of_checkpoint(tf.train.Checkpoint(model=model).write(str(scratch)))


def test_the_average_of_the_last_checkpoints_is_handed_on_after_a_kill_before_the_save(
    shards_dir, tokenizer_dir, tmp_path, monkeypatch, capsys
):
    output_dir = tmp_path / "run"
    total, eval_steps, save_steps, per_execution = 14, 5, 3, 2
    argv = tiny_run_flags(
        shards_dir,
        tokenizer_dir,
        output_dir,
        config_overrides=TINY_MODEL + NO_DROPOUT,
        per_replica_batch_size=8,
        max_steps=total,
        eval_steps=eval_steps,
        save_steps=save_steps,
        steps_per_execution=per_execution,
        save_total_limit=1,  # fewer than K: the run keeps K
        average_last=AVERAGE_LAST,
        seed=0,
    )

    # Killed once the average is made, as the model folder is written: nothing looks finished.
    save_model = model_folder.save_model

    def interrupting_save(folder, *args, **kwargs):
        if str(folder).startswith(f"{output_dir}/.saving-"):
            monkeypatch.setattr(model_folder, "save_model", save_model)
            raise Interrupted
        return save_model(folder, *args, **kwargs)

    monkeypatch.setattr(model_folder, "save_model", interrupting_save)
    with pytest.raises(Interrupted):
        run_mlm.main(run_mlm.parse_args(argv))
    assert not (output_dir / contract.FINISHED_RUN_MARKER).exists()
    capsys.readouterr()

    trainer, _ = run_mlm.main(run_mlm.parse_args(argv))  # resumed at its last step
    printed = capsys.readouterr().out
    assert f"at step {total} of {total}." in printed
    assert int(trainer.optimizer.iterations.numpy()) == total

    # the checkpoints the run saved, as predicted before it trained, the last K of them kept
    folder = output_dir / contract.CHECKPOINT_DIR
    kept = averaging.last_checkpoints(str(folder), 100)
    steps = averaging.checkpoint_steps(total, eval_steps, save_steps, per_execution)
    assert steps == [4, 5, 7, 9, 10, 12, 14]
    assert [averaging.step_of(path) for path in kept] == steps[-AVERAGE_LAST:]

    # the folder's model is the mean of the K checkpoints; last_step/ is the final one
    each = [model_values_of_checkpoint(path) for path in kept]
    averaged = model_values_of_folder(output_dir, tmp_path / "averaged")
    last_step = model_values_of_folder(output_dir / contract.LAST_STEP_DIR, tmp_path / "last")
    assert sorted(averaged) == sorted(each[0]) == sorted(last_step) and len(averaged) > 10
    differs = 0
    for key, value in averaged.items():
        mean = np.mean([values[key] for values in each], axis=0)
        np.testing.assert_allclose(value, mean, rtol=1e-5, atol=1e-7, err_msg=key)
        np.testing.assert_array_equal(last_step[key], each[-1][key], err_msg=key)
        differs += not np.allclose(value, each[-1][key])
    assert differs > 10  # the average is not the last step's model
    for name in (contract.FINISHED_RUN_MARKER, contract.TOKENIZER_FILE):
        assert (output_dir / contract.LAST_STEP_DIR / name).is_file()
    assert (output_dir / contract.LAST_STEP_DIR / contract.PYTORCH_DIR).is_dir()

    # both figures printed and in the card; the last step's are its last evaluation's
    line = next(line for line in printed.splitlines() if line.startswith("Averaged the weights"))
    figures = re.fullmatch(
        r"Averaged the weights of the last 3 checkpoints, steps 10, 12 and 14: eval loss "
        r"([\d.]+), accuracy at \[MASK\] ([\d.]+); the last step alone: eval loss ([\d.]+), "
        rf"accuracy at \[MASK\] ([\d.]+)\. The average is the model handed on, in {output_dir}; "
        rf"the last step's is in {output_dir}/last_step\.",
        line,
    )
    assert figures, line
    average_loss, average_accuracy, last_loss, last_accuracy = map(float, figures.groups())
    log = (output_dir / contract.TRAINING_LOG_NAME).read_text().splitlines()
    last_row = dict(zip(log[0].split(","), log[-1].split(",")))
    assert last_row["step"] == str(total)
    assert abs(float(last_row["val_loss"]) - last_loss) < 1e-4
    assert average_loss != last_loss
    card = (output_dir / contract.MODEL_CARD_NAME).read_text()
    assert (
        "the average of the weights of the last 3 checkpoints, saved after steps 10, 12 and 14"
        in (card)
    )
    assert (
        f"| average of 3 checkpoints (this folder) | {average_loss:.4f} | "
        f"{100 * average_accuracy:.2f}% |" in card
    ), card
    assert f"| last step (`last_step/`) | {last_loss:.4f} | {100 * last_accuracy:.2f}% |" in card


def test_more_checkpoints_than_the_run_saves_are_refused_before_any_work(
    shards_dir, tokenizer_dir, tmp_path
):
    output_dir = tmp_path / "run"
    argv = tiny_run_flags(
        shards_dir,
        tokenizer_dir,
        output_dir,
        max_steps=6,
        eval_steps=3,
        save_steps=0,
        average_last=3,
    )
    refused(
        script_in_process,
        "run_mlm.py",
        argv,
        output_dir,
        "--average_last 3 needs 3 checkpoints, but this run of 6 steps saves 2 (after steps 3, 6",
        "pass --average_last 2 or less, or a smaller --save_steps.",
    )
