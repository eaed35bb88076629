#!/usr/bin/env python
"""Step 3 of 4: pretrain a masked language model on TFRecord shards (TPU, GPU, CPU), from scratch
or onward from a published model.

Shards from prepare_tfrecord_shards.py, tokenizer from train_unigram.py (or the model's own);
masking in tf.data; a transformers TF masked LM (RoBERTa by default) fit with Keras, its LM head at
the masked positions only. The saved folder loads with `pipeline("fill-mask", model=output_dir)`.

    # One TPU VM: v4-8, v5litepod-8, v5p-8, v6e-8 (TPUStrategy; data and output may be on GCS)
    python run_mlm.py --train_dataset gs://my-bucket/shards/train \
        --eval_dataset gs://my-bucket/shards/validation --tokenizer tokenizer \
        --output_dir gs://my-bucket/roberta-base --per_replica_batch_size 32 --bfloat16

    # GPUs (mirrored) or a laptop CPU: add --no_tpu. GPU clusters: README.md.
    python run_mlm.py --no_tpu --train_dataset shards/train --tokenizer tokenizer \
        --output_dir model --config_overrides hidden_size=256,num_hidden_layers=4

    # Continued pretraining: roberta-base's weights and tokenizer, on shards made with that
    # tokenizer (prepare_tfrecord_shards.py --tokenizer_name_or_path roberta-base)
    python run_mlm.py --model_name_or_path roberta-base \
        --train_dataset gs://my-bucket/domain/train \
        --eval_dataset gs://my-bucket/domain/validation --output_dir gs://my-bucket/roberta-domain

Rerun the command after an interruption: it resumes. This file holds the settings and their checks,
which never load TensorFlow; main() then imports the engine in one place: the data and masking
(mlm_pipeline/masked_lm_data.py), the model and its trainer (masked_lm_model.py), the run around
fit() (training_run.py). The plumbing is in mlm_pipeline/; the Hub pusher, the PyTorch copy and the
parent's loader are imported only when their flags ask.
"""

import dataclasses
import functools
from typing import Optional

from mlm_pipeline import hardware, hub, mixture, model_folder, tf_startup, tpu_runtime, tpu_slice
from mlm_pipeline.errors import (
    UsageError,
    exit_on_usage_error,
    fraction_below_one,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
)
from mlm_pipeline.settings import parse_command_line, setting

# The settings, each declared once: a field of its group, with its flag's help, type and default.
# The command line is built from the groups (parse_args), and each group travels whole to the code
# that reads it. A resumed run must share the masking and the optimizer (they shape its batches and
# updates); the model card shows them and the speed settings. Each group checks its own settings,
# and Settings the rules across groups, as the command line is read: before any work.


@dataclasses.dataclass(frozen=True)
class Data:
    """The shards to train and evaluate on, and the tokenizer that wrote them."""

    train_dataset: tuple = setting(
        "Folder of training shards written by prepare_tfrecord_shards.py (local or gs://); several "
        "folders: a mixture, each sequence drawn from one of them (--train_weights, "
        "--mixture_alpha).",
        required=True,
        several=True,
    )
    train_weights: Optional[tuple] = setting(
        "With several --train_dataset folders: draw each sequence from folder i with probability "
        "Wi (normalised), e.g. 0.7 0.3.",
        type=positive_float,
        several=True,
    )
    mixture_alpha: float = setting(
        "With several --train_dataset folders and no --train_weights: draw from each in proportion "
        "to its sequences to this power (1: by size; 0.3: flatter, as XLM-R; 0: all alike).",
        1.0,
        type=non_negative_float,
    )
    eval_dataset: Optional[tuple] = setting(
        "Folder of evaluation shards, scored at the end of every epoch, or every --eval_steps "
        "steps (local or gs://); several: each PATH or NAME=PATH, each scored and logged under its "
        "name, the first one the run's val_loss.",
        several=True,
    )
    tokenizer: Optional[str] = setting(
        "The shards' tokenizer: a folder or a Hub id; with --model_name_or_path, that model's "
        "own when not given."
    )
    max_length: Optional[int] = setting(
        "Tokens a sequence. Should match the setting used in prepare_tfrecord_shards.py "
        "(--max_length): checked against the shards' manifest; the shards' own when not given.",
        type=positive_int,
    )

    def __post_init__(self):
        mixture.check_mixture_flags(self.train_dataset, self.train_weights, self.mixture_alpha)
        mixture.evaluation_sets(self.eval_dataset)  # each NAME=PATH well formed, no name twice


@dataclasses.dataclass(frozen=True)
class Model:
    """The model to train: a published masked LM to continue, or an architecture to train from
    random weights."""

    model_name_or_path: Optional[str] = setting(
        "Continue pretraining this masked LM on your text: a Hub id (roberta-base, "
        "bert-base-uncased, xlm-roberta-base, ...) or a finished run_mlm.py folder (local or "
        "gs://). Its weights, LM head included, are the start; the optimizer starts afresh."
    )
    pretrained_model_config: Optional[str] = setting(
        "Architecture to train from random weights (Hub id, folder or config.json; never its "
        "weights); RoBERTa-base's when not given."
    )
    config_overrides: Optional[str] = setting(
        "Changes to the architecture, e.g. hidden_size=256,num_hidden_layers=4; with "
        "--model_name_or_path, dropout only."
    )
    trust_remote_code: bool = setting(
        "Allow the Python code of a Hub repository's tokenizer or config to run.", False
    )
    branch_from: Optional[str] = setting(
        "A phase of its own from a checkpoint of a run_mlm.py run (a ckpt-N path, or its "
        "checkpoints folder for the newest; local or gs://): its weights, optimizer moments, step "
        "and learning rate, then --max_steps more steps on this command's data, length, masking "
        "and decay (no second warmup)."
    )

    def __post_init__(self):
        if self.branch_from and (self.model_name_or_path or self.pretrained_model_config):
            other = (
                f"--model_name_or_path {self.model_name_or_path}"
                if self.model_name_or_path
                else f"--pretrained_model_config {self.pretrained_model_config}"
            )
            raise UsageError(
                f"--branch_from {self.branch_from} continues that checkpoint's run, its "
                f"architecture and weights, but {other} names another start; pass one of them."
            )
        if self.model_name_or_path and self.pretrained_model_config:
            raise UsageError(
                f"--model_name_or_path {self.model_name_or_path} continues that model, weights and "
                f"architecture, but --pretrained_model_config {self.pretrained_model_config} names "
                "an architecture to train from random weights; pass one of them."
            )


@dataclasses.dataclass(frozen=True)
class Masking:
    """What each training batch holds, drawn from the seed: the shuffle, the masks, the
    sequence-length warmup."""

    seed: int = setting("Seed of the shuffles, the masks and the initial weights.", 42, type=int)
    mlm_probability: float = setting(
        "Share of each sequence's tokens masked (in training too, unless --train_mlm_probability).",
        0.15,
        type=probability,
    )
    train_mlm_probability: Optional[float] = setting(
        "Share masked in training alone, e.g. 0.3; evaluation keeps --mlm_probability.",
        type=probability,
    )
    whole_word_masking: bool = setting(
        "In training, mask every piece of a chosen word, never part of one.", False
    )
    shuffle_buffer_size: int = setting(
        "Training sequences shuffled together: the shards are read in blocks this long.",
        2**16,
        type=positive_int,
    )
    short_sequence_length: Optional[int] = setting(
        "Sequence-length warmup: train the first steps on pieces of this many tokens, cut from "
        "the shards' sequences.",
        type=positive_int,
    )
    short_sequence_ratio: float = setting(
        "Share of the steps trained on those pieces (with --short_sequence_length).",
        0.5,
        type=probability,
    )

    @property
    def train_probability(self):
        """The share masked in training: --train_mlm_probability, else --mlm_probability."""
        return self.train_mlm_probability or self.mlm_probability


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """AdamW and its learning-rate schedule."""

    learning_rate: float = setting("Peak learning rate.", 1e-4, type=positive_float)
    weight_decay_rate: float = setting(
        "AdamW's weight decay (none on biases and layer norms).", 0.01, type=non_negative_float
    )
    warmup_ratio: float = setting(
        "Share of the steps over which the learning rate rises to its peak.",
        0.05,
        type=fraction_below_one,
    )
    decay_ratio: Optional[float] = setting(
        "Hold the peak, then decay to 0 over this last share of the steps; when not given, the "
        "decay starts right after the warmup. The checkpoint where the decay starts is kept in "
        "OUTPUT_DIR/checkpoints/decay_start, for --branch_from.",
        type=positive_float,
    )
    decay_shape: str = setting(
        "The decay's curve from the peak to 0: linear, or 1-sqrt (1 - sqrt of the decay's "
        "progress, ModernBERT's and Ettin's: lower sooner, the last steps gentler).",
        "linear",
        choices=("linear", "1-sqrt"),
    )
    max_grad_norm: float = setting(
        "Clip the gradients of all replicas together to this global norm; 0: no clipping.",
        0.0,
        type=non_negative_float,
    )
    adam_beta1: float = setting(
        "Adam's beta1: how slowly the running mean of the gradients forgets.",
        0.9,
        type=fraction_below_one,
    )
    adam_beta2: float = setting(
        "Adam's beta2: how slowly the running mean of their squares forgets.",
        0.999,
        type=fraction_below_one,
    )
    adam_epsilon: float = setting(
        "Adam's epsilon, added to the denominator of every update.", 1e-8, type=positive_float
    )

    def check_decay(self, branch_from):
        """The decay follows the warmup; a branch has no warmup, so it may decay over all its
        steps (--decay_ratio 1)."""
        if branch_from:
            if self.decay_ratio is not None and self.decay_ratio > 1.0:
                raise UsageError(
                    f"--decay_ratio {self.decay_ratio} must lie in (0, 1] in a branch: the share "
                    "of its --max_steps over which it decays (1: all of them)."
                )
        elif self.decay_ratio is not None and self.decay_ratio > 1.0 - self.warmup_ratio:
            raise UsageError(
                f"--decay_ratio {self.decay_ratio} must lie in (0, 1 - --warmup_ratio] with "
                f"--warmup_ratio {self.warmup_ratio}: "
                "the decay follows the warmup (e.g. 0.25)."
            )


@dataclasses.dataclass(frozen=True)
class Speed:
    """How each step runs on the hardware: the same updates at another cost (but for the batch)."""

    per_replica_batch_size: int = setting(
        "Sequences of each replica's batch (a TPU core, a GPU, a CPU split); a step takes "
        "--gradient_accumulation_steps batches.",
        8,
        type=positive_int,
    )
    gradient_accumulation_steps: int = setting(
        "Accumulate the gradients of this many batches of --per_replica_batch_size on each "
        "replica before each optimizer step, as transformers' Trainer does: a global batch of "
        "replicas x per-replica batch x this, one batch's activations in memory at a time.",
        1,
        type=positive_int,
    )
    mlm_head: str = setting(
        "Run the LM head at the masked positions only (sparse) or everywhere (full): the same "
        "loss, more work.",
        "sparse",
        choices=("sparse", "full"),
    )
    bfloat16: bool = setting(
        "Mixed precision: compute in bfloat16, keep the weights in float32 (TPUs, recent GPUs).",
        False,
    )
    jit_compile: bool = setting("Compile the training step with XLA.", False)
    steps_per_execution: int = setting(
        "Steps run by one call to the device: more hide the host's overhead (TPUs).",
        1,
        type=positive_int,
    )


@dataclasses.dataclass(frozen=True)
class Steps:
    """How long to train, and when to evaluate, checkpoint and log; or measure a few steps and
    project the run (--preflight)."""

    num_epochs: int = setting(
        "Passes over the training shards (unless --max_steps).", 1, type=positive_int
    )
    max_steps: Optional[int] = setting(
        "Optimizer steps in all, in place of --num_epochs: may end mid-pass or repeat data.",
        type=positive_int,
    )
    eval_steps: Optional[int] = setting(
        "Evaluate every this many optimizer steps, whatever the epochs, and there write the "
        "TensorBoard and training_log.csv figures, a checkpoint and the Hub snapshot; when not "
        "given, at every epoch end.",
        type=positive_int,
    )
    max_eval_samples: Optional[int] = setting(
        "Score only the first this many sequences of --eval_dataset, in whole global batches (on "
        "several hosts, each host's first share); all of them when not given.",
        type=positive_int,
    )
    save_steps: int = setting(
        "Save a checkpoint every this many steps, and at every evaluation (every epoch end, or "
        "--eval_steps); 0: at evaluations only.",
        1000,
        type=non_negative_int,
    )
    save_total_limit: int = setting(
        "How many of the newest checkpoints to keep.", 3, type=positive_int
    )
    logging_steps: int = setting(
        "Write the training scalars to TensorBoard every this many steps.", 50, type=positive_int
    )
    preflight: bool = setting(
        "Before a long run: build everything, time a few steps after the compile, and print the "
        "hardware, seconds a step, peak memory and the run's projected time; write nothing.",
        False,
    )

    def total_steps(self, steps_per_epoch):
        """Optimizer steps in all: --max_steps, else --num_epochs passes of `steps_per_epoch`."""
        return self.max_steps or self.num_epochs * steps_per_epoch

    def steps_per_evaluation(self, steps_per_epoch):
        """Optimizer steps between evaluations: --eval_steps, else an epoch of the data."""
        return self.eval_steps or steps_per_epoch


@dataclasses.dataclass(frozen=True)
class Output:
    """Where the model goes: --output_dir, with its PyTorch copy, and the Hub."""

    output_dir: str = setting(
        "Where the model, its checkpoints and its logs go (local or gs://).", required=True
    )
    overwrite_output_dir: bool = setting(
        "Replace a finished model in --output_dir instead of refusing to.", False
    )
    no_pytorch_export: bool = setting(
        "Skip the pytorch/ copy of the model that transformers 5 loads.", False
    )
    hub_model_id: Optional[str] = setting(
        "Push snapshots and the model to this Hub repo (namespace/name)."
    )
    hub_private: bool = setting("Make a new --hub_model_id repo private.", False)
    hub_push_timeout: int = setting(
        "Seconds to wait, at most, for the final Hub push to upload.",
        hub.FINAL_PUSH_TIMEOUT,
        type=positive_int,
    )
    average_last: Optional[int] = setting(
        "Hand on the average of the weights of the run's last K checkpoints (the final one "
        "included), evaluated like it; the last step's own model is saved beside it, in "
        "last_step/. Keeps max(--save_total_limit, K) checkpoints.",
        type=positive_int,
    )

    def __post_init__(self):
        hub.check_hub_flags(self.hub_model_id, self.hub_private, "my-user/roberta-from-scratch")


@dataclasses.dataclass(frozen=True)
class Hardware(hardware.Hardware):
    """Where the steps run: a TPU, else GPUs, a cluster of machines or the CPU."""

    multi_worker: bool = setting("Train on the machines TF_CONFIG lists (implies --no_tpu).", False)
    cpu_replicas: int = setting(
        "Split the CPU into this many replicas, to rehearse a TPU's (with --no_tpu).",
        1,
        type=positive_int,
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every group of run_mlm.py's settings, named as its --help group, and the rules across
    groups."""

    data: Data
    model: Model
    masking: Masking
    optimizer: Optimizer
    speed: Speed
    steps: Steps
    output: Output
    hardware: Hardware

    def __post_init__(self):
        self.optimizer.check_decay(self.model.branch_from)
        hardware.check_hardware_flags(self.hardware, self.speed.jit_compile)
        branch_from = self.model.branch_from
        if branch_from and not self.data.tokenizer:
            raise UsageError(
                f"--tokenizer is needed with --branch_from {branch_from}: pass the tokenizer its "
                "run was trained with (the folder train_unigram.py wrote, or a Hub id)."
            )
        if branch_from and self.steps.preflight:
            raise UsageError(
                f"--preflight times a run from its first step, but --branch_from {branch_from} "
                "starts at its parent's step; preflight the parent's command (the same model, "
                "batch and length) instead."
            )
        if branch_from and self.masking.short_sequence_length:
            raise UsageError(
                f"--short_sequence_length {self.masking.short_sequence_length} is the sequence-"
                "length warmup of a run's first steps, but --branch_from "
                f"{branch_from} continues a trained model at its shards' length; leave it out."
            )
        if not self.model.model_name_or_path and not self.data.tokenizer:
            raise UsageError(
                "--tokenizer is needed to pretrain from scratch: pass the folder train_unigram.py "
                "wrote (or a Hub id), or --model_name_or_path to continue a published model with "
                "its own tokenizer."
            )
        if self.steps.max_eval_samples and not self.data.eval_dataset:
            raise UsageError(
                f"--max_eval_samples {self.steps.max_eval_samples} limits the evaluation, which "
                "needs --eval_dataset: give the evaluation shards, or drop --max_eval_samples."
            )
        if hardware.asks_for_tpu(self.hardware):  # a pod slice's hosts reach gs:// only
            paths = mixture.paths_given(self.data.train_dataset, self.data.eval_dataset)
            paths["--output_dir"] = self.output.output_dir
            tpu_slice.check_paths_reach_the_hosts(self.hardware.tpu_name, paths)


def parse_args(argv=None):
    """The command line as Settings; a flag or a rule broken is refused in one line."""
    return parse_command_line(
        Settings,
        argv,
        prog="run_mlm.py",
        description="Pretrain a masked language model on TFRecord shards, from scratch or from "
        "a published model.",
    )


def check_paths(settings):
    """The paths the run reads and writes, one line for any that cannot work, before any work: the
    gs:// ones probed, the output folder refused when it holds a finished model (model_folder.py).
    The flags' own rules were checked as the command line was read (Settings)."""
    data, output = settings.data, settings.output
    inputs = mixture.paths_given(data.train_dataset, data.eval_dataset)
    inputs["--model_name_or_path"] = settings.model.model_name_or_path
    model_folder.check_output(output, inputs, write_probe=not settings.steps.preflight)


def main(settings, callbacks=()):
    """Pretrain as `settings` (parse_args()) say; `callbacks`: fit()'s besides the run's own."""
    tpu_runtime.prepare_runtime(settings.hardware)  # PJRT, before TensorFlow loads; or why not
    data, masking, steps, output = settings.data, settings.masking, settings.steps, settings.output
    check_paths(settings)  # a path or output folder that cannot work is one line, before any work
    # The engine: TensorFlow loads here, after the front's checks (its start-up log held back).
    with tf_startup.tensorflow_startup_log_held_back():
        from mlm_pipeline import (
            averaging,
            checkpoints,
            hosts,
            masked_lm_data,
            masked_lm_model,
            preflight,
            training_run,
        )

    # TensorFlow's devices first: --cpu_replicas must take effect before anything runs an op
    strategy = hosts.build_strategy(settings.hardware)
    # from scratch, a published parent's weights, or a checkpoint of a run (--branch_from)
    origin = masked_lm_model.origin_of(settings.model, output.output_dir)

    # The data: shards checked against their tokenizer, read by one input pipeline per host.
    named_tokenizer = masked_lm_data.load_tokenizer(data, settings.model, origin)
    tokenizer = named_tokenizer.tokenizer
    manifests, max_length = masked_lm_data.read_shards(data, masking, named_tokenizer, origin)
    train_mixture = masked_lm_data.read_mixture(data, manifests[0], named_tokenizer)  # or None
    speed = settings.speed  # training accumulates --gradient_accumulation_steps batches a step
    train_plan, eval_plan = hosts.input_plans(
        strategy,
        manifests,
        speed.per_replica_batch_size,
        speed.gradient_accumulation_steps,
        train_mixture,
    )
    total_steps = steps.total_steps(train_plan.steps_per_epoch)
    short_steps, pieces = masked_lm_data.sequence_length_warmup(max_length, total_steps, masking)
    train_dataset_from = masked_lm_data.training_stream(  # the batches from a step on
        strategy, train_plan, tokenizer, max_length, masking, short_steps, pieces
    )
    first_step = 0
    if origin.branch is not None:  # a branch's steps count on from its parent's checkpoint
        first_step = origin.branch.step
        stream = checkpoints.stream_settings(
            masking, manifests[0], train_plan.global_batch_size, train_mixture
        )
        total_steps, train_dataset_from = origin.branch_stream(
            total_steps, train_dataset_from, stream
        )
    # --average_last K: a run that saves fewer than K checkpoints refused now
    averaging.check_enough_checkpoints(settings, train_plan, total_steps, short_steps, first_step)
    evaluation = masked_lm_data.evaluation_data(  # each --eval_dataset set, the first val_loss's
        strategy,
        eval_plan,
        manifests[1:],
        tokenizer,
        max_length,
        masking,
        steps.max_eval_samples,
        data.eval_dataset,
    )

    # The model, before the output folder is touched: a parent that cannot be loaded stops here.
    pytorch_export = not output.no_pytorch_export
    config = masked_lm_model.build_config(origin, tokenizer, max_length, pytorch_export)
    masked_lm, trainer = masked_lm_model.build_model(
        config, strategy, tokenizer, total_steps, settings, origin
    )
    saving = dict(tokenizer=tokenizer, max_length=max_length, pytorch_export=pytorch_export)
    save = functools.partial(model_folder.save_model, **saving)
    schedule = training_run.Schedule(train_plan, total_steps, short_steps, evaluation)
    if steps.preflight:  # a few of fit()'s steps timed, the run projected, nothing written
        predictions = masked_lm_data.max_predictions(max_length, masking.train_probability)
        return preflight.preflight_masked_lm(  # the final save and the LM head's FLOPs counted too
            trainer, settings, schedule, max_length, train_dataset_from, origin, save, predictions
        )
    run = training_run.TrainingRun(  # output folder and resume, logs, card, Hub pushes
        settings=settings,
        strategy=strategy,
        schedule=schedule,
        config=config,
        tokenizer=named_tokenizer,
        manifests=manifests,
        save_model=save,
        origin=origin,
    )
    # the folder ready, the checkpoint restored (a branch's parent's, when it has none of its own)
    started = run.start(masked_lm, trainer.optimizer, trainer.trainable_variables)
    run.evaluate_first(trainer, started)  # a parent: where it stands on this text
    logs = run.train(trainer, train_dataset_from, started, callbacks)  # fit(), in segments
    # --average_last: the last step's model put aside in last_step/, the average in its place
    averaged = run.average_checkpoints(trainer)
    if run.chief:  # one process writes the model: staged, then published with config.json last
        with model_folder.staging(output.output_dir) as folder:
            save(folder, masked_lm)
    return trainer, run.finish(trainer, logs, started, averaged)


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "run_mlm.py")
