"""run_mlm.py --branch_from: a phase of its own from a checkpoint of a run_mlm.py run, as
ModernBERT, Ettin and mmBERT train theirs (a stable phase, then a longer context, then the decay,
each started from the last one's checkpoint).

A branch starts from the checkpoint's weights, its optimizer's moments and its step: Adam's bias
correction goes on where it was, and the step numbers (TensorBoard, training_log.csv, checkpoints)
continue the parent's. Its learning rate starts at the one the parent's schedule had at that step,
read from the parent's run_settings.json, with no second warmup; it holds it, then decays to 0 over
the last --decay_ratio of the branch's own --max_steps (all of them without it). The data, the
length, the masking and the schedule are the branch command's own; the architecture is the
parent's, but for what a phase changes (`PHASE_OVERRIDES`).

`read_parent()` is the front: it finds the checkpoint and reads its run's settings before anything
is written (each thing wrong is one line). `Branch` is the run's origin, with the face of
masked_lm_model.Scratch (that module's docstring): it builds the parent's architecture and restores
the checkpoint into it (`restore()`).
"""

import dataclasses
import functools
import json

from . import architecture, modernbert_config, tf_startup
from .cards import public_name
from .contract import CHECKPOINT_DIR, RUN_SETTINGS_NAME
from .errors import UsageError, first_line

FLAG = "--branch_from"
# What a parent's run_settings.json must hold for a branch to continue it.
RECORD_KEYS = ("learning_rate", "warmup_ratio", "total_steps", "global_batch_size", "config")
# The optimizer's step count in a checkpoint of tf.train.Checkpoint(model=..., optimizer=...), as
# checkpoints.restore_checkpoint saves it: tf_keras' optimizer tracks it as "iter".
ITERATIONS_KEY = "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE"
# --config_overrides a phase may make: dropout in any family; a ModernBERT's length and RoPE bases
# (rotary positions: no table to grow), under transformers 4.57 ModernBertConfig's own names.
MODERNBERT_PHASE_KEYS = ("max_position_embeddings", "global_rope_theta", "local_rope_theta")


@dataclasses.dataclass(frozen=True)
class ParentCheckpoint:
    """The checkpoint a branch starts from: `name`, --branch_from as given; `prefix`, its ckpt-N
    path; `step`, the optimizer step it was saved at; `learning_rate`, the rate the parent's
    schedule had there; `settings`, the parent's run_settings.json."""

    name: str
    prefix: str
    step: int
    learning_rate: float
    settings: dict


def read_parent(branch_from, output_dir):
    """The ParentCheckpoint of --branch_from (a ckpt-N path, or a folder of checkpoints for its
    newest; local or gs://), read and checked before anything is written. A branch being resumed
    (its own checkpoints in `output_dir`, recorded from the same --branch_from) keeps the checkpoint
    it started from, even if the folder has a newer one since."""
    with tf_startup.tensorflow_startup_log_held_back():
        import tensorflow as tf

        from . import masked_lm_model

    own = own_record(tf, output_dir)
    if own.get("branch_from") == branch_from and own.get("branch_checkpoint"):
        prefix = own["branch_checkpoint"]
    elif tf.io.gfile.isdir(branch_from):
        prefix = tf.train.latest_checkpoint(branch_from)
        if prefix is None:
            raise UsageError(
                f"{FLAG} {branch_from} is a folder without a checkpoint; pass a run_mlm.py run's "
                f"{CHECKPOINT_DIR} folder (or its {CHECKPOINT_DIR}/decay_start), or one ckpt-N in "
                "it."
            )
    else:
        prefix = branch_from.rstrip("/")
        if not tf.io.gfile.exists(f"{prefix}.index"):
            raise UsageError(
                f"{FLAG} {branch_from} is no checkpoint (no {public_name(prefix)}.index); pass a "
                f"run_mlm.py run's ckpt-N path or its {CHECKPOINT_DIR} folder."
            )
    settings = parent_settings(tf, branch_from, prefix)
    if own.get("branch_checkpoint") == prefix and own.get("branch_step") is not None:
        step = own["branch_step"]  # the branch's record; the parent may have rotated it away
    else:
        step = checkpoint_step(tf, branch_from, prefix)
    learning_rate = masked_lm_model.recorded_learning_rate(settings, step)
    if learning_rate <= 0.0:
        raise UsageError(
            f"{FLAG} {branch_from} was saved at step {step:,}, where its run's learning rate had "
            "decayed to 0, so a branch could not learn; branch from an earlier checkpoint, e.g. "
            f"its {CHECKPOINT_DIR}/decay_start."
        )
    return ParentCheckpoint(branch_from, prefix, step, learning_rate, settings)


# The sequence-length warmup of a parent's first steps: a branch has none, and the parent's is over
# by the step it is branched at, so it does not tell two streams apart there.
WARMUP_KEYS = ("short_sequence_length", "short_sequence_ratio")


def from_its_beginning(train_dataset_from, first_step, step):
    """A branch's batches from optimizer step `step` on, its data started at its first step, its
    parent's `first_step`."""
    return train_dataset_from(step - first_step)


def own_record(tf, output_dir):
    """The run_settings.json of the branch's own checkpoints in `output_dir` (a rerun resumes
    them), or {} when there are none."""
    folder = f"{output_dir.rstrip('/')}/{CHECKPOINT_DIR}"
    path = f"{folder}/{RUN_SETTINGS_NAME}"
    if not (tf.train.latest_checkpoint(folder) and tf.io.gfile.exists(path)):
        return {}
    try:
        with tf.io.gfile.GFile(path) as file:
            return json.load(file)
    except (ValueError, tf.errors.OpError):
        return {}  # prepare_output_dir says what is wrong with it


def parent_settings(tf, branch_from, prefix):
    """The run_settings.json beside the checkpoint `prefix`: what its step means (the schedule, the
    batch, the architecture); a checkpoint without one is not a run_mlm.py run's."""
    path = f"{prefix.rsplit('/', 1)[0]}/{RUN_SETTINGS_NAME}" if "/" in prefix else RUN_SETTINGS_NAME
    if not tf.io.gfile.exists(path):
        raise UsageError(
            f"{FLAG} {branch_from} has no {RUN_SETTINGS_NAME} beside it, so it is not a checkpoint "
            "of a run_mlm.py run (whose settings say what its step means); pass one from a run's "
            f"{CHECKPOINT_DIR} folder."
        )
    try:
        with tf.io.gfile.GFile(path) as file:
            settings = json.load(file)
    except (ValueError, tf.errors.OpError) as error:
        raise UsageError(f"could not read {path}: {first_line(error)}") from None
    missing = [key for key in RECORD_KEYS if key not in settings]
    if missing:
        raise UsageError(
            f"{path} lacks {', '.join(missing)}, so it is not the record of a run_mlm.py run; "
            f"pass a checkpoint from a run_mlm.py run's {CHECKPOINT_DIR} folder to {FLAG}."
        )
    return settings


def checkpoint_step(tf, branch_from, prefix):
    """The optimizer step the checkpoint `prefix` was saved at, read from it."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        return int(reader.get_tensor(ITERATIONS_KEY))
    except (ValueError, tf.errors.OpError) as error:
        raise UsageError(
            f"{FLAG} {branch_from} holds no optimizer step ({first_line(error)[:200]}), so it is "
            "not a checkpoint of a run_mlm.py run; pass one from a run's "
            f"{CHECKPOINT_DIR} folder."
        ) from None


def parent_config(parent, config_overrides):
    """The parent's architecture, as its run_settings.json records it, with the changes a phase may
    make (`config_overrides`): dropout; for ModernBERT a longer max_position_embeddings and other
    RoPE bases. Any other change would reshape the checkpoint's weights, and is refused; the
    parent's own values pass (the parent's command, reused)."""
    from transformers import AutoConfig

    recorded = dict(parent.settings["config"])
    config = AutoConfig.for_model(recorded.pop("model_type"), **recorded)
    allowed = MODERNBERT_PHASE_KEYS if config.model_type == "modernbert" else ()
    reshaping = [  # the parent's own value again changes nothing: its command may be reused
        key
        for key, value in architecture.overrides_items(config_overrides)
        if "dropout" not in key and key not in allowed and getattr(config, key, None) != value
    ]
    if reshaping:
        phase = (
            f"dropout, {', '.join(MODERNBERT_PHASE_KEYS)}"
            if allowed
            else "dropout (its learned position table cannot grow)"
        )
        raise UsageError(
            f"--config_overrides {config_overrides} would change {', '.join(reshaping)} of the "
            f"{config.model_type} model of {FLAG} {parent.name}, whose weights the branch starts "
            f"from; a branch may change {phase} only."
        )
    architecture.apply_overrides(config, config_overrides)
    architecture.register_tf_family(config)  # ModernBERT's TF class; both spellings agree
    return config


class Branch:
    """A run from a parent checkpoint (--branch_from): `branch`, its ParentCheckpoint; the
    architecture its run_settings.json records (`parent_config`); the weights, moments and step
    restored into the model by `restore()` once the run's output folder is ready (its own newer
    checkpoints win, as in any resumed run). The face every origin shares is in
    masked_lm_model.py's docstring."""

    name = None  # run_settings.json's model_name_or_path: the branch keys say where it starts
    hub_id = None
    evaluates_first = False  # the parent's own evaluations scored that checkpoint
    tokenizer = None  # --tokenizer is required: the one the parent's shards were made with
    card_tag = "branched-phase"

    def __init__(self, parent, config_overrides=None):
        self.branch = parent
        self.config = parent_config(parent, config_overrides)

    def check_continuation(self, tokenizer, tokenizer_flag, max_length):
        """The tokenizer must have the parent's vocabulary size and special ids (its embeddings are
        rows of its own); the shards' length must fit a learned position table (BERT, RoBERTa: it
        cannot grow), while a ModernBERT's rotary positions take any length."""
        config, name = self.config, self.branch.name
        ids = dict(mask_token_id=tokenizer.mask_token_id, pad_token_id=tokenizer.pad_token_id)
        differing = [key for key, value in ids.items() if getattr(config, key, value) != value]
        if len(tokenizer) != config.vocab_size or differing:
            raise UsageError(
                f"{tokenizer_flag} has {len(tokenizer):,} tokens (mask id {ids['mask_token_id']}, "
                f"pad id {ids['pad_token_id']}), but the model of {FLAG} {name} has "
                f"{config.vocab_size:,} (mask id {config.mask_token_id}, pad id "
                f"{config.pad_token_id}); pass the tokenizer its run was trained with, and shards "
                "made with it."
            )
        if config.model_type == "modernbert":
            return
        longest = architecture.longest_sequence(config)
        if max_length > longest:
            raise UsageError(
                f"the shards' length, {max_length} tokens, is longer than the {longest} positions "
                f"of the {config.model_type} model of {FLAG} {name}, whose learned position table "
                f"(max_position_embeddings {config.max_position_embeddings}) cannot grow in a "
                f"branch; remake the shards with prepare_tfrecord_shards.py --max_length {longest} "
                "or less, or train a longer context from scratch."
            )

    def config_for(self, tokenizer, max_length):
        """The parent's architecture (check_continuation() has checked the tokenizer); a
        ModernBERT's max_position_embeddings grown to the shards' length if they are longer."""
        config = self.config
        if config.model_type == "modernbert":
            config.max_position_embeddings = max(config.max_position_embeddings, max_length)
        modernbert_config.check_local_attention(
            config, f"the model of {FLAG} {self.branch.name}", "branch from another run"
        )
        return config

    def masked_lm(self, config):
        """The parent's architecture; its weights come from the checkpoint (`restore()`)."""
        from transformers import TFAutoModelForMaskedLM

        return TFAutoModelForMaskedLM.from_config(config)

    def restore(self, masked_lm, optimizer, variables, strategy):
        """The parent checkpoint's weights, optimizer moments and step, restored into `masked_lm`
        and `optimizer`; returns the step. The optimizer's variables (its moments for `variables`,
        the trainer's trainable ones) are made first, in the strategy's scope, so they take the
        checkpoint's values now rather than at the first step."""
        import tensorflow as tf

        # transformers' AdamWeightDecay is a tf_keras legacy optimizer, whose apply_gradients
        # makes its step, hyperparameters and moments with _create_all_weights(var_list)
        # (tf_keras/src/optimizers/legacy/optimizer_v2.py): the same call, before the first step.
        with strategy.scope(), tf.name_scope(optimizer._name):
            optimizer._create_all_weights(variables)
        checkpoint = tf.train.Checkpoint(model=masked_lm, optimizer=optimizer)
        try:
            checkpoint.restore(self.branch.prefix).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as error:
            raise UsageError(
                f"could not start from {FLAG} {self.branch.name}: {first_line(error)[:300]}; pass "
                "a checkpoint of a run_mlm.py run with this architecture."
            ) from None
        return int(optimizer.iterations.numpy())

    def branch_stream(self, total_steps, train_dataset_from, stream):
        """(the branch's last step, its batches from a step on): its --max_steps (`total_steps`)
        counted on from the parent's step. On its parent's own stream (`stream`, the branch's
        checkpoints.stream_settings: the same shards, length, batch, seed and masking as the
        parent's record), the branch reads on where its parent was, so a stable phase and its decay
        branch train the very batches of the same schedule run at once; on other data (a new
        mixture, a longer length), that data from its own beginning."""
        keys = (set(stream) | {"train_mixture"}) - set(WARMUP_KEYS)
        parent = self.branch
        first_step = parent.step
        if all(parent.settings.get(key) == stream.get(key) for key in keys):
            print(
                f"The branch reads on in its parent's stream of batches at step {first_step:,}: "
                "the same shards, length, batch, seed and masking."
            )
            return total_steps + first_step, train_dataset_from
        print(f"The branch reads its data from its beginning, from step {first_step:,} on.")
        return total_steps + first_step, functools.partial(
            from_its_beginning, train_dataset_from, first_step
        )

    def card_origin(self, text):
        """Where the weights started, for the model card: the parent checkpoint and its step."""
        branch = self.branch
        return (
            f"branched from the checkpoint `{checkpoint_name(branch.prefix)}` at step "
            f"{branch.step:,} (its weights, optimizer moments and step were the start, at the "
            f"learning rate its schedule had there, {branch.learning_rate:.4g}) and trained on the "
            f"text of {text}"
        )


def checkpoint_name(prefix):
    """How a card names a checkpoint: its run's folder (cards.public_name: a local one by its base
    name) and its place in it, e.g. my-run/checkpoints/decay_start/ckpt-1125."""
    run, separator, inside = prefix.rpartition(f"/{CHECKPOINT_DIR}/")
    if not separator:
        return public_name(prefix)
    return f"{public_name(run) or run}/{CHECKPOINT_DIR}/{inside}"
