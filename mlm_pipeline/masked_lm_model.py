"""run_mlm.py's model: where its weights start (`Scratch`, or pretrained_model.Parent), the masked
LM and the Keras model that trains it (`MaskedLMTrainer`: its LM head at the masked positions only,
gradients accumulated when asked), AdamW and its schedule, and the fit() calls that run exactly the
run's steps (`fit_exact_steps`).

Where the weights start, the run's "origin", is one of two objects with the same face, so that the
run never asks which it has:

- `name`: --model_name_or_path as given, None from scratch (what run_settings.json records);
- `hub_id`: the Hub id of the model continued (the model card's base_model), else None;
- `branch`: the parent checkpoint a branch starts from (branching.ParentCheckpoint: its step and
  learning rate), else None;
- `evaluates_first`: whether the run evaluates before its first step (a parent: where it stands on
  this text; random weights: nothing worth scoring);
- `tokenizer`: the model's own tokenizer (None from scratch: --tokenizer is required then);
- `check_continuation(tokenizer, tokenizer_flag, max_length)`: what the shards must share with it;
- `config_for(tokenizer, max_length)`: the transformers config of the masked LM to train;
- `masked_lm(config)`: that masked LM, built in the strategy's scope, its weights random (drawn from
  the seed) or the parent's;
- `card_tag` and `card_origin(text)`: what the model card says of where the weights started.

`Scratch` lives here; `Parent` in pretrained_model.py, imported only for --model_name_or_path;
`Branch` in branching.py, only for --branch_from.
"""

import types

import tensorflow as tf
import tf_keras
from transformers import TFAutoModelForMaskedLM, create_optimizer

from . import architecture, metrics, model_folder, segments, tf_startup, training_logs
from .contract import FEATURE_NAME


class Scratch:
    """A masked LM pretrained from random weights: the architecture of the Model settings
    (`model`: RoBERTa-base's unless --pretrained_model_config, with --config_overrides) with the
    tokenizer's size and special ids. The face every origin shares is in this module's docstring."""

    name = None
    hub_id = None
    branch = None  # no parent checkpoint: the run's own schedule from step 0
    evaluates_first = False
    tokenizer = None
    card_tag = "pretrained-from-scratch"

    def __init__(self, model):
        self.model = model

    def check_continuation(self, tokenizer, tokenizer_flag, max_length):
        """Nothing to continue: any tokenizer and length make a vocabulary and positions of their
        own."""

    def config_for(self, tokenizer, max_length):
        """The architecture with the tokenizer's ids and size, and room for `max_length`
        positions."""
        model = self.model
        config = architecture.load_config(
            model.pretrained_model_config, model.config_overrides, model.trust_remote_code
        )
        architecture.fit_to_tokenizer(config, tokenizer, max_length)  # its ids, size, positions
        return config

    def masked_lm(self, config):
        """Random weights, drawn from the global seed (build_model sets it)."""
        return TFAutoModelForMaskedLM.from_config(config)

    def card_origin(self, text):
        return "pretrained from scratch (random initial weights, no checkpoint of another model)"


def origin_of(model, output_dir=None):
    """Where the run's weights start, from the Model settings: a pretrained_model.Parent for
    --model_name_or_path (the published model to continue, its config and tokenizer, checked with
    --config_overrides before any work), a branching.Branch for --branch_from (the checkpoint and
    its run's settings read before anything is written in `output_dir`, the run's --output_dir),
    else Scratch."""
    if model.branch_from:
        from . import branching  # only for --branch_from

        parent = branching.read_parent(model.branch_from, output_dir)
        return branching.Branch(parent, model.config_overrides)
    if not model.model_name_or_path:
        return Scratch(model)
    from .pretrained_model import Parent  # only for continued pretraining

    return Parent(model.model_name_or_path, model.config_overrides, model.trust_remote_code)


def build_config(origin, tokenizer, max_length, pytorch_export=True):
    """The config of the masked LM to train: from scratch, the architecture fitted to the tokenizer
    and `max_length`; continued, the parent's as it is, but for dropout (`origin.config_for`). With
    `pytorch_export`, a config the PyTorch copy cannot be written for is refused now, not after
    training."""
    config = origin.config_for(tokenizer, max_length)
    if pytorch_export:
        model_folder.check_pytorch_copy(config)
    return config


def build_model(config, strategy, tokenizer, total_steps, settings, origin):
    """The masked LM and its trainer (MaskedLMTrainer, scoring the tokenizer's mask token), with
    AdamW and its schedule over `total_steps` (settings.optimizer), made in the strategy's scope
    and compiled for fit() as settings.speed says. The masked LM starts from random weights drawn
    from settings.masking's seed, or from those of a parent (`origin.masked_lm`)."""
    optimizer, speed = settings.optimizer, settings.speed
    tf_keras.utils.set_random_seed(settings.masking.seed)  # the initial weights, dropout
    tf_startup.hide_transformers_tf_deprecation()
    if speed.bfloat16:
        tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")  # before any layer is built
    with strategy.scope():
        # from_config, from_pretrained, or the parent's PyTorch weights read without torch
        masked_lm = origin.masked_lm(config)
        masked_lm(masked_lm.dummy_inputs)  # build the weights inside the strategy scope
        trainer = MaskedLMTrainer(
            masked_lm, speed.mlm_head, tokenizer.mask_token_id, speed.gradient_accumulation_steps
        )
        # AdamW, linear warmup then decay to 0, none on biases and layer norms; every replica's
        # gradients clipped together.
        warmup_steps = segments.warmup_steps(optimizer.warmup_ratio, total_steps)
        adamw, _ = create_optimizer(
            optimizer.learning_rate,
            total_steps,
            warmup_steps,
            weight_decay_rate=optimizer.weight_decay_rate,
            adam_beta1=optimizer.adam_beta1,
            adam_beta2=optimizer.adam_beta2,
            adam_epsilon=optimizer.adam_epsilon,
            adam_global_clipnorm=optimizer.max_grad_norm or None,
        )
        schedule = learning_rate_schedule(optimizer, total_steps, origin.branch)
        if schedule is not None:  # warmup-stable-decay, 1 - sqrt, or a branch's
            adamw.learning_rate = schedule
        trainer.compile(
            adamw, jit_compile=speed.jit_compile, steps_per_execution=speed.steps_per_execution
        )
    return masked_lm, trainer


def masked_count(labels):
    """The batch's masked positions (at least 1): the loss is their mean."""
    return tf.maximum(tf.reduce_sum(tf.cast(tf.not_equal(labels, -100), tf.float32)), 1.0)


class MaskedLMTrainer(tf_keras.Model):
    """A transformers TF masked LM wrapped in a Keras model whose fit() scores the masked positions.

    `mlm_head="sparse"` gathers the encoder's states at the masked positions first, so the LM head
    (most of a small model's arithmetic) runs on ~15% of them; "full": logits everywhere, the same
    loss at transformers' cost. `masked_lm.save_pretrained()` then writes a standard checkpoint.
    The metrics (metrics.py) count masked positions only; `mask_token_accuracy` is the fill-mask
    task (inputs that were `mask_token_id`, [MASK]), `top_token_share` near 1 means a collapsed
    model. `accumulation_steps` N > 1: each step accumulates N batches' gradients
    (accumulated_gradients)."""

    def __init__(self, masked_lm, mlm_head, mask_token_id, accumulation_steps=1):
        super().__init__()
        self.masked_lm = masked_lm
        self.mlm_head, self.mask_token_id = mlm_head, mask_token_id
        self.accumulation_steps = accumulation_steps
        self.loss_tracker = tf_keras.metrics.Mean(name="loss")
        self.masked_accuracy = metrics.PositionAccuracy("masked_accuracy")
        self.mask_token_accuracy = metrics.PositionAccuracy("mask_token_accuracy")
        self.top_token_share = metrics.TopTokenShare(masked_lm.config.vocab_size)

    @property
    def metrics(self):  # what fit() resets every epoch and reports
        accuracies = [self.masked_accuracy, self.mask_token_accuracy, self.top_token_share]
        return [self.loss_tracker, *accuracies]

    def call(self, features, training=False):
        """Logits [batch, predictions, vocabulary] at the masked positions."""
        positions = features["masked_positions"]
        if self.mlm_head == "sparse":
            encoder = getattr(self.masked_lm, self.masked_lm.base_model_prefix)
            hidden_states = encoder(input_ids=features[FEATURE_NAME], training=training)[0]
            hidden_states = tf.gather(hidden_states, positions, batch_dims=1)
            logits = self.masked_lm.get_lm_head()(hidden_states)
        else:
            logits = self.masked_lm(input_ids=features[FEATURE_NAME], training=training).logits
            logits = tf.gather(logits, positions, batch_dims=1)
        # Under mixed bfloat16 the logits arrive in bf16; softmax and loss need float32's range.
        return tf.cast(logits, tf.float32)

    def summed_loss_and_metrics(self, features, labels, training):
        """The cross-entropy summed over the masked positions; the accuracies updated."""
        logits = self.call(features, training)
        scored = tf.not_equal(labels, -100)  # -100: a slot beyond the sequence's count
        per_position = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.maximum(labels, 0), logits)
        predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
        inputs = tf.gather(features[FEATURE_NAME], features["masked_positions"], batch_dims=1)
        was_mask = scored & tf.equal(inputs, self.mask_token_id)
        self.masked_accuracy.update_state(labels, predictions, scored)
        self.mask_token_accuracy.update_state(labels, predictions, was_mask)
        self.top_token_share.update_state(predictions, was_mask)
        return tf.reduce_sum(tf.where(scored, per_position, 0.0))

    # The models are TF ops under Python control flow on Python values only, so AutoGraph's
    # rewrite of every layer's call adds nothing but time: about 5 seconds of each run's start
    # on a CPU. The steps run as written, and so do the layers they call.
    @tf.autograph.experimental.do_not_convert
    def train_step(self, data):
        """One optimizer step on the mean loss over the batch's masked positions (with
        accumulation, over all the N batches the replica accumulates)."""
        features, labels = data
        count = masked_count(labels)
        # Each replica's gradients are summed across replicas, so each contributes its share.
        scale = 1.0 / (count * tf.distribute.get_strategy().num_replicas_in_sync)
        if self.accumulation_steps == 1:
            with tf.GradientTape() as tape:
                loss_sum = self.summed_loss_and_metrics(features, labels, training=True)
                scaled_loss = loss_sum * scale
            self.optimizer.minimize(scaled_loss, self.trainable_variables, tape=tape)
        else:
            loss_sum, gradients = accumulated_gradients(
                self, features, labels, self.accumulation_steps, scale
            )
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        self.loss_tracker.update_state(loss_sum / count)
        return {metric.name: metric.result() for metric in self.metrics}

    @tf.autograph.experimental.do_not_convert
    def test_step(self, data):
        features, labels = data
        loss_sum = self.summed_loss_and_metrics(features, labels, training=False)
        self.loss_tracker.update_state(loss_sum / masked_count(labels))
        return {metric.name: metric.result() for metric in self.metrics}


def accumulated_gradients(trainer, features, labels, accumulation_steps, scale):
    """--gradient_accumulation_steps N: each replica's data holds N batches of
    --per_replica_batch_size B a step (hosts.InputPlan); their summed loss and gradients, one batch
    after the other in a while loop, one batch's activations at a time. Each is scaled by the
    `scale` of all N together: N batches of B give exactly the gradients of one batch of N x B."""

    def split(tensor):  # fit() may trace a phase with unknown lengths: reshape dynamically
        return tf.reshape(
            tensor, tf.concat([[accumulation_steps, -1], tf.shape(tensor)[1:]], axis=0)
        )

    features, labels = tf.nest.map_structure(split, features), split(labels)
    weights = trainer.trainable_variables

    def accumulate(index, loss_sum, *gradients):
        with tf.GradientTape() as tape:
            batch_features = {name: tensor[index] for name, tensor in features.items()}
            batch_sum = trainer.summed_loss_and_metrics(batch_features, labels[index], True)
            scaled_loss = batch_sum * scale
        batch_gradients = tape.gradient(scaled_loss, weights)
        added = [total + tf.convert_to_tensor(g) for total, g in zip(gradients, batch_gradients)]
        return (index + 1, loss_sum + batch_sum, *added)

    zeros = [tf.zeros_like(weight) for weight in weights]
    _, loss_sum, *gradients = tf.while_loop(
        lambda index, *_: index < accumulation_steps,
        accumulate,
        (tf.constant(0), tf.constant(0.0), *zeros),
    )
    return loss_sum, gradients


def learning_rate_schedule(optimizer, total_steps, branch=None):
    """The schedule of the Optimizer settings `optimizer` over optimizer steps 0 .. `total_steps`,
    or None for create_optimizer's own (a linear warmup, then a linear decay to 0 at once), kept
    exactly as it was.

    --decay_ratio: WarmupStableDecay, decaying over its last share of the steps; --decay_shape
    1-sqrt without it: the same, decaying from the warmup's end. `branch` (a
    branching.ParentCheckpoint): a phase from a parent's step, no warmup, the parent's rate there
    held, then the decay over the last --decay_ratio of the branch's own steps (all of them without
    it)."""
    shape = optimizer.decay_shape
    if branch is not None:
        decay_steps = segments.decay_steps(optimizer.decay_ratio or 1.0, total_steps - branch.step)
        return WarmupStableDecay(branch.learning_rate, total_steps, 0, decay_steps, shape)
    warmup_steps = segments.warmup_steps(optimizer.warmup_ratio, total_steps)
    if optimizer.decay_ratio:
        decay_steps = segments.decay_steps(optimizer.decay_ratio, total_steps)
    elif shape != "linear":
        decay_steps = total_steps - warmup_steps
    else:
        return None
    return WarmupStableDecay(optimizer.learning_rate, total_steps, warmup_steps, decay_steps, shape)


def recorded_learning_rate(record, step):
    """The learning rate a run had at optimizer step `step`, from its run_settings.json `record`
    (checkpoints.resume_settings): its schedule rebuilt as build_model built it, then read at
    `step` in the same float32 arithmetic. A record without decay_shape decayed linearly; one with
    branch_step was itself a branch."""
    optimizer = types.SimpleNamespace(
        learning_rate=record["learning_rate"],
        warmup_ratio=record["warmup_ratio"],
        decay_ratio=record.get("decay_ratio"),
        decay_shape=record.get("decay_shape", "linear"),
    )
    branch = None
    if record.get("branch_step") is not None:
        branch = types.SimpleNamespace(
            step=record["branch_step"], learning_rate=record["branch_learning_rate"]
        )
    total_steps = record["total_steps"]
    schedule = learning_rate_schedule(optimizer, total_steps, branch)
    if schedule is None:
        warmup_steps = segments.warmup_steps(optimizer.warmup_ratio, total_steps)
        _, schedule = create_optimizer(optimizer.learning_rate, total_steps, warmup_steps)
    return float(schedule(tf.constant(step, tf.int64)))


class WarmupStableDecay(tf_keras.optimizers.schedules.LearningRateSchedule):
    """--decay_ratio: the rate rises linearly to `peak`, holds it, then falls to 0 over the last
    `decay_steps` (all the steps after the warmup: the triangle). For a fixed budget, more steps at
    the peak; the decay still ends at 0.

    `shape` "linear": the rate is peak x the share of the decay left. "1-sqrt" (--decay_shape):
    peak x (1 - sqrt(progress)), progress the share of the decay done: the decay of ModernBERT's
    warmup-stable-decay ("trapezoidal") schedule (Warner et al., arXiv 2412.13663, section 2.2),
    which Ettin's decay phase reuses; the rate falls faster at first and the last steps are
    gentler. No warmup (`warmup_steps` 0): the peak from the first step, as in a branch."""

    def __init__(self, peak, total_steps, warmup_steps, decay_steps, shape="linear"):
        self.peak, self.total_steps = peak, total_steps
        self.warmup_steps, self.decay_steps = warmup_steps, decay_steps
        self.shape = shape

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        rising = step / self.warmup_steps if self.warmup_steps else 1.0
        falling = (self.total_steps - step) / self.decay_steps  # the share of the decay left
        if self.shape == "1-sqrt":
            progress = 1.0 - tf.clip_by_value(falling, 0.0, 1.0)
            falling = 1.0 - tf.sqrt(progress)
        return self.peak * tf.clip_by_value(tf.minimum(rising, falling), 0.0, 1.0)

    def get_config(self):
        return dict(
            peak=self.peak,
            total_steps=self.total_steps,
            warmup_steps=self.warmup_steps,
            decay_steps=self.decay_steps,
            shape=self.shape,
        )


def fit_exact_steps(
    trainer,
    train_dataset_from,
    steps_to_run,
    steps_per_epoch,
    *,
    phase_end=0,
    numbered=True,
    validation_data=None,
    validation_steps=None,
    callbacks=(),
):
    """Run the optimizer steps of `steps_to_run` with trainer.fit, evaluating at every epoch end.
    fit() counts in epochs of equal length and stops only between executions, so a run starting or
    ending mid-epoch (resumed, --max_steps) gets a fit() call for that part, as does each side of
    `phase_end` (the sequence-length warmup's switch): each call's shapes are fixed (segments.py).
    `train_dataset_from(step)` continues the data stream where the last call, or a killed run,
    stopped: an endless stream, so a fit() epoch of `steps_per_epoch` steps need not be a pass over
    the data (--eval_steps; then `numbered` False). The epochs are numbered as one run across the
    calls (training_logs.py)."""
    progress = training_logs.RunProgress(steps_to_run.stop, steps_per_epoch, numbered)
    logs = {}
    for first_step, epoch, epochs, steps_per_call in segments.fit_segments(
        steps_to_run.start, steps_to_run.stop, steps_per_epoch, phase_end=phase_end
    ):
        history = trainer.fit(
            train_dataset_from(first_step),
            initial_epoch=epoch,
            epochs=epoch + epochs,
            steps_per_epoch=steps_per_call,
            validation_data=validation_data,
            validation_steps=validation_steps,
            callbacks=[*callbacks, progress],  # last: it prints the logs the others completed
            verbose=training_logs.progress_verbosity(),
        )
        for key, values in history.history.items():
            logs[key] = logs.get(key, []) + values
    return logs
