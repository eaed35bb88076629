"""Phases: the decay shapes (--decay_shape), the checkpoint where a warmup-stable-decay run starts
to decay (kept out of rotation's reach), and --branch_from, a run of its own from a checkpoint of
another: its weights, moments, step and learning rate, no second warmup, its own data, length and
decay, and a resume like any run's."""

import json
import types

import numpy as np
import pytest
from helpers import (
    MAX_LENGTH,
    TINY_MODEL,
    kill_when,
    mlm_flags,
    prepare_flags,
    run_command,
    start_script,
)
from refusals import refused, script_in_process
from test_resume import NO_DROPOUT, latest_checkpoint_step, load_weights, training_args
from test_run_mlm import (
    MODERNBERT_CONFIG,
)  # a tiny ModernBERT: global and local layers, a window of 8

import run_mlm
from mlm_pipeline import checkpoints, contract, segments

TOTAL = 20  # the run at once: 2 warmup steps, held, then the decay over its last 5 steps
DECAY_RATIO = 0.25
DECAY_START = TOTAL - segments.decay_steps(DECAY_RATIO, TOTAL)  # 15
LONGER = 2 * MAX_LENGTH  # a branch's longer context


def schedule(shape, decay_ratio=None, warmup_ratio=0.1, total=100, branch=None, peak=1.0):
    from mlm_pipeline import masked_lm_model

    optimizer = types.SimpleNamespace(
        learning_rate=peak, warmup_ratio=warmup_ratio, decay_ratio=decay_ratio, decay_shape=shape
    )
    return masked_lm_model.learning_rate_schedule(optimizer, total, branch)


def rates(schedule, steps):
    return [float(schedule(step)) for step in steps]


def test_one_minus_sqrt_decays_as_one_minus_the_root_of_the_progress():
    # warmup 10 steps, held to step 60, then 40 steps of decay
    wsd = schedule("1-sqrt", decay_ratio=0.4)
    expected = [0.5, 1.0, 1.0, 0.5, 1 - np.sqrt(0.75), 0.0]
    np.testing.assert_allclose(rates(wsd, [5, 10, 60, 70, 90, 100]), expected, atol=1e-6)
    # without --decay_ratio it decays from the warmup's end
    at_once = schedule("1-sqrt")
    expected = [1.0, 1 - np.sqrt(0.5), 0.0]
    np.testing.assert_allclose(rates(at_once, [10, 55, 100]), expected, atol=1e-6)
    # linear with --decay_ratio keeps its straight line
    np.testing.assert_allclose(rates(schedule("linear", 0.4), [70, 90]), [0.75, 0.25], atol=1e-6)


def test_linear_without_decay_ratio_is_still_create_optimizers_schedule():
    from transformers import create_optimizer

    from mlm_pipeline import masked_lm_model

    assert schedule("linear") is None  # build_model keeps create_optimizer's own
    record = {"learning_rate": 1e-3, "warmup_ratio": 0.1, "total_steps": 100}
    _, triangle = create_optimizer(1e-3, 100, 10)
    for step in (0, 3, 10, 57, 99, 100):
        assert masked_lm_model.recorded_learning_rate(record, step) == float(triangle(step))


def run(argv, callbacks=()):
    return run_mlm.main(run_mlm.parse_args([str(arg) for arg in argv]), callbacks)


def at_once_args(shards_dir, tokenizer_dir, output_dir, *extra):
    """The warmup-stable-decay run: evaluations every 7 steps and a checkpoint every 4, 3 steps an
    execution, the newest checkpoint kept alone: none of them falls on the decay's start."""
    return training_args(
        shards_dir,
        tokenizer_dir,
        output_dir,
        *flags_of(max_steps=TOTAL, warmup_ratio=0.1, decay_ratio=DECAY_RATIO, eval_steps=7),
        *flags_of(save_steps=4, save_total_limit=1, steps_per_execution=3),
        "--no_pytorch_export",
        *extra,
    )


def flags_of(**named):
    return [word for name, value in named.items() for word in (f"--{name}", str(value))]


def branch_args(shards_dir, tokenizer_dir, output_dir, parent, *extra):
    return training_args(
        shards_dir,
        tokenizer_dir,
        output_dir,
        "--branch_from",
        parent,
        "--no_pytorch_export",
        *extra,
    )


@pytest.fixture(scope="module")
def at_once(shards_dir, tokenizer_dir, tmp_path_factory):
    """The run at once, and its learning-rate schedule."""
    output_dir = tmp_path_factory.mktemp("at-once")
    # a position table no longer than its shards (RoBERTa's own is 512 rows)
    table = f"{TINY_MODEL}{NO_DROPOUT},max_position_embeddings={MAX_LENGTH + 2}"
    args = at_once_args(shards_dir, tokenizer_dir, output_dir, "--config_overrides", table)
    trainer, _ = run(args)
    return output_dir, trainer.optimizer.learning_rate


def checkpoint_tensors(prefix):
    """Every variable a checkpoint holds but its save counter, by name."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(prefix))
    names = [
        name
        for name in reader.get_variable_to_shape_map()
        if name.endswith("/.ATTRIBUTES/VARIABLE_VALUE") and not name.startswith("save_counter")
    ]
    return {name: reader.get_tensor(name) for name in names}


def test_a_decay_run_keeps_the_checkpoint_where_its_decay_starts(at_once):
    output_dir, _ = at_once
    folder = output_dir / contract.CHECKPOINT_DIR
    kept = folder / checkpoints.DECAY_START_DIR
    assert latest_checkpoint_step(output_dir) == TOTAL
    assert sorted(path.name for path in folder.glob("ckpt-*.index")) == [f"ckpt-{TOTAL}.index"]
    assert sorted(path.name for path in kept.glob("ckpt-*.index")) == [f"ckpt-{DECAY_START}.index"]
    step = checkpoint_tensors(kept / f"ckpt-{DECAY_START}")[
        "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE"
    ]
    assert int(step) == DECAY_START
    recorded = (folder / contract.RUN_SETTINGS_NAME).read_text()
    assert (kept / contract.RUN_SETTINGS_NAME).read_text() == recorded
    assert "decay_shape" not in json.loads(recorded)  # a linear run's record stays as it was
    # no evaluation was added for it: every 7 steps, and the last
    assert logged_steps(output_dir) == [7, 14, TOTAL]


def logged_steps(output_dir):
    """The step of each row of training_log.csv."""
    rows = (output_dir / contract.TRAINING_LOG_NAME).read_text().splitlines()
    step_column = rows[0].split(",").index("step")
    return [int(float(row.split(",")[step_column])) for row in rows[1:]]


def restored_state(trainer_states):
    """A callback that saves the trainer's model and optimizer as they are when fit() begins."""
    import tensorflow as tf
    import tf_keras

    class Capture(tf_keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            if not trainer_states:
                checkpoint = tf.train.Checkpoint(
                    model=self.model.masked_lm, optimizer=self.model.optimizer
                )
                trainer_states.append(checkpoint.write(str(trainer_states_folder[0])))

    trainer_states_folder = []
    return Capture(), trainer_states_folder


def test_a_decay_branch_starts_where_the_run_was_and_decays_as_the_run_at_once(
    at_once, shards_dir, tokenizer_dir, tmp_path
):
    at_once_dir, at_once_schedule = at_once
    parent = at_once_dir / contract.CHECKPOINT_DIR / checkpoints.DECAY_START_DIR
    output_dir = tmp_path / "decay"
    states = []
    capture, folder = restored_state(states)
    folder.append(tmp_path / "restored" / "state")
    args = branch_args(
        shards_dir, tokenizer_dir, output_dir, parent, "--max_steps", TOTAL - DECAY_START
    )
    trainer, _ = run([*args, "--decay_ratio", 1], [capture])

    # weights, Adam's moments and step, as the checkpoint holds them, before the first step
    expected = checkpoint_tensors(parent / f"ckpt-{DECAY_START}")
    restored = checkpoint_tensors(states[0])
    assert sorted(restored) == sorted(expected)
    moments = [name for name in expected if "/.OPTIMIZER_SLOT/optimizer/" in name]
    assert len(moments) == 2 * len(trainer.trainable_variables)  # Adam's m and v of each weight
    for name, value in expected.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)

    # its rates are the tail of the run at once: the parent's at the step, no warmup, down to 0
    branch_schedule = trainer.optimizer.learning_rate
    steps = range(DECAY_START, TOTAL + 1)
    assert rates(branch_schedule, steps) == rates(at_once_schedule, steps)
    assert float(branch_schedule(DECAY_START)) == float(at_once_schedule(DECAY_START)) > 0
    assert float(branch_schedule(TOTAL)) == 0.0
    assert int(trainer.optimizer.iterations.numpy()) == TOTAL

    # its steps continue the parent's; the card names the parent checkpoint and its step
    assert logged_steps(output_dir) == [TOTAL]
    assert latest_checkpoint_step(output_dir) == TOTAL
    card = (output_dir / contract.MODEL_CARD_NAME).read_text()
    assert f"checkpoints/decay_start/ckpt-{DECAY_START}` at step {DECAY_START}" in card
    recorded = json.loads((output_dir / contract.CHECKPOINT_DIR / "run_settings.json").read_text())
    assert recorded["branch_step"] == DECAY_START and recorded["total_steps"] == TOTAL

    # On its parent's own shards, batch, seed and masking, it reads on in the parent's stream: the
    # very batches of the run at once, so it ends on the run at once's weights and moments, to
    # float32's rounding (not bit for bit: the two ran their steps in other compiled calls).
    ours = checkpoint_tensors(output_dir / contract.CHECKPOINT_DIR / f"ckpt-{TOTAL}")
    theirs = checkpoint_tensors(at_once_dir / contract.CHECKPOINT_DIR / f"ckpt-{TOTAL}")
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, rtol=1e-5, atol=1e-9, err_msg=name)


def test_a_branch_from_where_the_rate_reached_0_is_refused(
    at_once, shards_dir, tokenizer_dir, tmp_path
):
    at_once_dir, _ = at_once
    parent = at_once_dir / contract.CHECKPOINT_DIR  # its newest: the run's end
    args = branch_args(shards_dir, tokenizer_dir, tmp_path / "late", parent, "--max_steps", 4)
    refused(script_in_process, "run_mlm.py", args, tmp_path / "late", "decayed to 0", "decay_start")


def test_a_resumed_branch_ends_where_an_uninterrupted_one_ends(
    at_once, shards_dir, tokenizer_dir, tmp_path
):
    at_once_dir, _ = at_once
    parent = (
        at_once_dir / contract.CHECKPOINT_DIR / checkpoints.DECAY_START_DIR / f"ckpt-{DECAY_START}"
    )
    interrupted, uninterrupted = tmp_path / "interrupted", tmp_path / "uninterrupted"
    extra = ("--max_steps", 12, "--decay_ratio", 0.5, "--save_steps", 2)
    args = branch_args(shards_dir, tokenizer_dir, interrupted, parent, *extra)
    process = start_script("run_mlm.py", *args)
    kill_when(process, lambda: latest_checkpoint_step(interrupted) is not None, "checkpoint")
    saved_step = latest_checkpoint_step(interrupted)
    assert DECAY_START < saved_step < DECAY_START + 12

    rerun = run_command("run_mlm.py", *args)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"ckpt-{saved_step} at step {saved_step} of {DECAY_START + 12}." in rerun.stdout
    # its own decay start (step 21) was kept, before or after the kill
    kept = interrupted / contract.CHECKPOINT_DIR / checkpoints.DECAY_START_DIR
    assert [path.name for path in kept.glob("ckpt-*.index")] == [f"ckpt-{DECAY_START + 6}.index"]
    run(branch_args(shards_dir, tokenizer_dir, uninterrupted, parent, *extra))
    for resumed, straight in zip(load_weights(interrupted), load_weights(uninterrupted)):
        np.testing.assert_allclose(resumed, straight, rtol=1e-4, atol=1e-6)


@pytest.fixture(scope="module")
def longer_shards(corpus, tokenizer_dir, tmp_path_factory):
    """Training shards of the same text, twice the length: a phase with a longer context."""
    output_dir = tmp_path_factory.mktemp("longer")
    flags = prepare_flags(corpus, tokenizer_dir, "train", output_dir, max_length=LONGER)
    result = run_command("prepare_tfrecord_shards.py", *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    return output_dir / "train"


def test_a_modernbert_branch_trains_at_a_longer_length_with_a_larger_rope_theta(
    shards_dir, longer_shards, tokenizer_dir, tmp_path
):
    from transformers import AutoConfig

    config = tmp_path / "modernbert.json"
    config.write_text(json.dumps(MODERNBERT_CONFIG))
    stable = tmp_path / "stable"
    run(
        [
            *mlm_flags(shards_dir / "train", tokenizer_dir, stable, "--no_pytorch_export"),
            *flags_of(pretrained_model_config=config, max_steps=6, warmup_ratio=0.2),
            *flags_of(decay_ratio=0.5, per_replica_batch_size=4, shuffle_buffer_size=64),
        ]
    )
    parent = stable / contract.CHECKPOINT_DIR / checkpoints.DECAY_START_DIR  # step 3
    longer = tmp_path / "longer"
    trainer, _ = run(
        [
            *mlm_flags(longer_shards, tokenizer_dir, longer, "--no_pytorch_export"),
            *flags_of(branch_from=parent, max_steps=4, decay_ratio=0.5, decay_shape="1-sqrt"),
            *flags_of(config_overrides="global_rope_theta=320000", per_replica_batch_size=4),
        ]
    )
    saved = AutoConfig.from_pretrained(longer)
    assert saved.global_rope_theta == 320000
    assert saved.rope_parameters["full_attention"]["rope_theta"] == 320000  # transformers 5's
    assert saved.local_rope_theta == AutoConfig.from_pretrained(stable).local_rope_theta
    assert saved.max_position_embeddings >= LONGER
    assert json.loads((longer / "tokenizer_config.json").read_text())["model_max_length"] == LONGER
    # held at the parent's rate for 2 steps, then 1 - sqrt down to 0 over the last 2
    schedule = trainer.optimizer.learning_rate
    rate = float(schedule(3))
    expected = [rate, rate, rate, rate * (1 - np.sqrt(0.5)), 0.0]
    np.testing.assert_allclose(rates(schedule, range(3, 8)), expected, rtol=1e-6)
    assert int(trainer.optimizer.iterations.numpy()) == 7


def test_a_roberta_branch_longer_than_its_position_table_is_refused(
    at_once, longer_shards, tokenizer_dir, tmp_path
):
    parent = at_once[0] / contract.CHECKPOINT_DIR / checkpoints.DECAY_START_DIR
    output_dir = tmp_path / "longer"
    args = mlm_flags(longer_shards, tokenizer_dir, output_dir, branch_from=parent, max_steps=2)
    needles = (f"{LONGER} tokens", f"{MAX_LENGTH} positions", f"embeddings {MAX_LENGTH + 2}")
    refused(script_in_process, "run_mlm.py", args, output_dir, *needles, "--max_length 32")


def test_what_a_branch_cannot_start_from_is_one_line(at_once, shards_dir, tokenizer_dir, tmp_path):
    import tensorflow as tf

    output_dir = tmp_path / "out"
    parent = at_once[0] / contract.CHECKPOINT_DIR / checkpoints.DECAY_START_DIR
    other = tf.train.Checkpoint(weight=tf.Variable(1.0)).save(str(tmp_path / "other" / "ckpt"))
    no_tokenizer = ["--tokenizer", tokenizer_dir]
    cases = [  # (--branch_from, flags added, flags left out, what the line names)
        (parent, [], no_tokenizer, ["--tokenizer is needed with --branch_from"]),
        (parent, ["--short_sequence_length", 8], [], ["--short_sequence_length 8", "leave it"]),
        (parent, ["--preflight"], [], ["--preflight times a run from its first step"]),
        (tmp_path / "nothing", [], [], ["is no checkpoint", "ckpt-N"]),
        (other, [], [], ["no run_settings.json beside it", "not a checkpoint of a run_mlm.py"]),
        (parent, ["--config_overrides", "hidden_size=64"], [], ["would change hidden_size"]),
    ]
    for branch_from, added, left_out, needles in cases:
        args = mlm_flags(shards_dir / "train", tokenizer_dir, output_dir, *added)
        args = [*[word for word in args if word not in map(str, left_out)], "--branch_from"]
        refused(script_in_process, "run_mlm.py", [*args, branch_from], output_dir, *needles)
