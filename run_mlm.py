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

Rerun the command after an interruption: it resumes. The plumbing is in mlm_pipeline/; the Hub
pusher, the PyTorch copy and the parent's loader are imported only when their flags ask.
"""

import dataclasses
import functools
import math
from typing import Optional

from mlm_pipeline import (
    architecture,
    contract,
    hardware,
    hosts,
    hub,
    metrics,
    model_folder,
    preflight,
    segments,
    shard_checks,
    tf_startup,
    tpu_runtime,
    tpu_slice,
    training_logs,
    training_run,
    whole_words,
)
from mlm_pipeline.contract import FEATURE_NAME
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

    train_dataset: str = setting(
        "Folder of training shards written by prepare_tfrecord_shards.py (local or gs://).",
        required=True,
    )
    eval_dataset: Optional[str] = setting(
        "Folder of evaluation shards, scored at the end of every epoch, or every --eval_steps "
        "steps (local or gs://)."
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

    def __post_init__(self):
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
        "decay starts right after the warmup.",
        type=positive_float,
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

    def __post_init__(self):
        if self.decay_ratio is not None and self.decay_ratio > 1.0 - self.warmup_ratio:
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
        hardware.check_hardware_flags(self.hardware, self.speed.jit_compile)
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
            paths = {"--train_dataset": self.data.train_dataset}
            paths["--eval_dataset"] = self.data.eval_dataset
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
    inputs = {"--train_dataset": data.train_dataset, "--eval_dataset": data.eval_dataset}
    inputs["--model_name_or_path"] = settings.model.model_name_or_path
    model_folder.check_output(output, inputs, write_probe=not settings.steps.preflight)


def load_parent(model):
    """--model_name_or_path: the published model to continue, its config and tokenizer (its weights
    come with the model); checked, with --config_overrides, before any work. None without it."""
    if not model.model_name_or_path:
        return None
    from mlm_pipeline.pretrained_model import Parent  # only for continued pretraining

    return Parent(model.model_name_or_path, model.config_overrides, model.trust_remote_code)


def load_tokenizer(data, model, parent):
    """The shards' tokenizer, named as the user gave it (contract.NamedTokenizer): --tokenizer, else
    the parent's own."""
    if data.tokenizer:
        tokenizer = contract.load_tokenizer(
            data.tokenizer, "--tokenizer", model.trust_remote_code, require_mlm_tokens=True
        )
        return contract.NamedTokenizer(tokenizer, data.tokenizer, f"--tokenizer {data.tokenizer}")
    name = model.model_name_or_path
    flag = f"the tokenizer of --model_name_or_path {name}"
    return contract.NamedTokenizer(parent.tokenizer, name, flag)


def read_shards(data, masking, tokenizer, parent):
    """The manifests of the train and evaluation shards (the second None without --eval_dataset)
    and their sequences' length, checked before any work against `tokenizer` (a
    contract.NamedTokenizer), --max_length, --whole_word_masking and the parent's vocabulary and
    positions."""
    if masking.whole_word_masking:  # its vocabulary must say where words start
        whole_words.check_word_markers(tokenizer.tokenizer, tokenizer.flag)
    manifests = shard_checks.read_training_manifests(
        data.train_dataset, data.eval_dataset, tokenizer
    )
    max_length = shard_checks.check_max_length(data.max_length, manifests[0], data.train_dataset)
    if parent:  # its vocabulary and positions must hold the shards'
        parent.check_continuation(tokenizer.tokenizer, tokenizer.flag, max_length)
    return manifests, max_length


def sequence_length_warmup(max_length, total_steps, masking):
    """(steps on short pieces, pieces per sequence): the sequence-length warmup's short phase, cut
    from the shards as they are (not the learning rate's --warmup_ratio). On short sequences a
    [MASK] gets more of the attention from its neighbours, and each position is trained by more
    sequences a step: a model learns to read its context sooner. BERT did 90% of its steps at 128
    tokens, then 512, from data written twice; here the phase follows from the step."""
    short = masking.short_sequence_length
    if short is None:
        return 0, 1
    if short >= max_length or max_length % short:
        raise UsageError(
            f"--short_sequence_length {short} must divide the shards' length {max_length} into "
            f"pieces (e.g. {max_length // 4}); or drop it to train at full length throughout."
        )
    short_steps, pieces = round(masking.short_sequence_ratio * total_steps), max_length // short
    print(
        f"Sequence-length warmup: steps 1-{short_steps:,} on {pieces} pieces of {short} tokens a "
        f"sequence, the rest at {max_length}."
    )
    return short_steps, pieces


def distributed_dataset(
    strategy, plan, training, tokenizer, max_length, masking, start_step=0, pieces=1
):
    """Every replica's masked batches from optimizer step `start_step` on: one input pipeline per
    host (build_dataset), each reading shard files of its own and batched for its own replicas
    (hosts.py's `plan`)."""

    def host_pipeline(context):
        host = plan.pipeline_input(context, start_step)  # its files, batch, place in the stream
        return build_dataset(
            **dataclasses.asdict(host),  # named as build_dataset's parameters
            training=training,
            tokenizer=tokenizer,
            max_length=max_length,
            masking=masking,
            pieces=pieces,
        )

    return strategy.distribute_datasets_from_function(host_pipeline)


def build_dataset(
    files,
    batch_size,
    training,
    *,
    tokenizer,
    max_length,
    masking,
    start_epoch=0,
    start_batch=0,
    batches_per_epoch=None,
    pipeline=0,
    pieces=1,
):
    """One host's input pipeline: shards -> shuffled, parsed, masked batches of ({"input_ids",
    "masked_positions"}, labels), every shape static. `masking`: the Masking settings. Training
    data is an endless stream of epochs (at most `batches_per_epoch` batches each: all hosts take
    the same steps), its randomness stateless: epoch e reads the shards in an order drawn from
    (seed, e), shuffles blocks of records with seeds from (seed, e, block) and masks batch i with
    (seed, e, i). The masks change every epoch, as in RoBERTa, yet a resumed run rebuilds the
    stream from (`start_epoch`, `start_batch`). Evaluation: one pass in file order, fixed masks,
    --mlm_probability even when training masks at --train_mlm_probability, so runs compare.
    `pieces` > 1: the sequence-length warmup's pieces."""
    import tensorflow as tf

    special = set(tokenizer.all_special_ids)
    special_ids = tf.constant(sorted(special), dtype=tf.int32)
    replacement_ids = tf.constant([i for i in range(len(tokenizer)) if i not in special])
    mask_token_id = tf.constant(tokenizer.mask_token_id, dtype=tf.int32)
    word_starts = None
    if training and masking.whole_word_masking:
        word_starts = tf.constant(whole_words.word_start_table(tokenizer))
    mlm_probability = masking.train_probability if training else masking.mlm_probability
    files = tf.constant(files)
    base_seed = tf.constant([masking.seed, 1 if training else 2], dtype=tf.int64)  # train, eval
    if pipeline:  # each host draws its own; host 0 draws those of a single-host run
        base_seed = tf.random.experimental.stateless_fold_in(base_seed, pipeline)

    def seed_for(*numbers):
        seed = base_seed
        for number in numbers:
            seed = tf.random.experimental.stateless_fold_in(seed, number)
        return seed

    def epoch_batches(epoch):
        order = files
        if training:
            order = tf.random.experimental.stateless_shuffle(files, seed_for(epoch, -1))
        records = tf.data.Dataset.from_tensor_slices(order).interleave(
            tf.data.TFRecordDataset,
            cycle_length=min(len(files), 8),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        if training:
            records = records.batch(masking.shuffle_buffer_size).enumerate()
            records = records.flat_map(
                lambda block, serialized: tf.data.Dataset.from_tensor_slices(
                    tf.random.experimental.stateless_shuffle(serialized, seed_for(epoch, block))
                )
            )
        batches = records.batch(batch_size, drop_remainder=True)
        if batches_per_epoch is not None:
            batches = batches.take(batches_per_epoch)
        return batches.enumerate().map(lambda index, batch: (epoch, index, batch))

    epochs = tf.data.Dataset.counter(start_epoch) if training else tf.data.Dataset.range(1)
    dataset = epochs.flat_map(epoch_batches)  # fit() counts the steps: the stream may be endless
    if start_batch:
        dataset = dataset.skip(start_batch)  # skipped batches are read, but not parsed or masked
    features = contract.record_features(max_length)

    def parse_and_mask(epoch, index, serialized):
        # Parsing a whole batch in one op is far cheaper than parsing records one by one.
        input_ids = tf.cast(tf.io.parse_example(serialized, features)[FEATURE_NAME], tf.int32)
        input_ids = tf.reshape(input_ids, [-1, max_length // pieces])  # masks drawn per piece
        masked_ids, positions, labels = mask_tokens(
            input_ids,
            seed_for(epoch, index),
            mlm_probability,
            mask_token_id=mask_token_id,
            special_ids=special_ids,
            replacement_ids=replacement_ids,
            word_starts=word_starts,
        )
        return {FEATURE_NAME: masked_ids, "masked_positions": positions}, labels

    dataset = dataset.map(parse_and_mask, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


def mask_tokens(
    input_ids, seed, mlm_probability, mask_token_id, special_ids, replacement_ids, word_starts=None
):
    """BERT masking in TF ops, stateless: the same seed gives the same masks. In each sequence,
    round(`mlm_probability` x its non-special tokens) positions are chosen at random (no special
    token, <unk> included); 80% become [MASK], 10% a random token, 10% stay. An exact count, as in
    BERT, means at most `max_predictions()` positions, which the model can score alone. Returns the
    masked ids [batch, length], the positions [batch, predictions] and their labels (-100 in slots
    beyond the count: skipped). With `word_starts`, whole words (whole_words.py)."""
    import tensorflow as tf

    seeds = tf.random.experimental.stateless_split(seed, 3)
    choose_seed, action_seed, random_seed = tf.unstack(seeds)
    shape = tf.shape(input_ids)
    length = input_ids.shape[-1]
    predictions = max_predictions(length, mlm_probability)
    maskable = ~tf.reduce_any(tf.equal(input_ids[..., None], special_ids), axis=-1)
    candidates = tf.reduce_sum(tf.cast(maskable, tf.float32), axis=-1)
    count = tf.cast(tf.round(mlm_probability * candidates), tf.int32)

    # A random ranking of the maskable positions; the first `count` of each row are chosen.
    noise = tf.random.stateless_uniform(shape, choose_seed)
    if word_starts is None:
        _, ranked = tf.math.top_k(tf.where(maskable, noise, -1.0), k=predictions)
        used = tf.range(predictions)[None, :] < count[:, None]
    else:
        ranked, used = whole_words.ranking(
            input_ids, maskable, noise, count, predictions, word_starts
        )
    positions = tf.where(used, ranked, 0)
    labels = tf.where(used, tf.gather(input_ids, positions, batch_dims=1), -100)
    one_hot = tf.one_hot(positions, length, on_value=True, off_value=False)
    chosen = tf.reduce_any(one_hot & used[..., None], axis=1)

    action = tf.random.stateless_uniform(shape, action_seed)
    to_mask = chosen & (action < 0.8)
    to_random = chosen & (action >= 0.8) & (action < 0.9)
    replacements = tf.size(replacement_ids)
    random_index = tf.random.stateless_uniform(
        shape, random_seed, maxval=replacements, dtype=tf.int32
    )
    random_tokens = tf.gather(replacement_ids, random_index)
    masked_ids = tf.where(to_mask, mask_token_id, tf.where(to_random, random_tokens, input_ids))
    return masked_ids, positions, labels


def max_predictions(max_length, mlm_probability):
    """Predictions a sequence: masking never chooses more, so shapes stay static (XLA, TPUs)."""
    return max(1, math.ceil(max_length * mlm_probability))


def evaluation_data(strategy, plan, manifest, tokenizer, max_length, masking, max_eval_samples):
    """The evaluation's batches on every replica (None without --eval_dataset), how many each
    evaluation scores (--max_eval_samples: the first whole ones only), and the line that says so."""
    if plan is None:
        return None, None, None
    batches, line = segments.evaluation_batches(
        plan.steps_per_epoch, manifest["records"], plan.global_batch_size, max_eval_samples
    )
    dataset = distributed_dataset(strategy, plan, False, tokenizer, max_length, masking)
    return dataset, batches, line


def build_config(tokenizer, max_length, model, parent=None, pytorch_export=True):
    """From scratch: the architecture (the Model settings: RoBERTa-base's unless
    --pretrained_model_config, with --config_overrides) with the tokenizer's size and special ids,
    and room for `max_length` positions. Continued (`parent`, a pretrained_model.Parent): the
    parent's config as it is, but for dropout. With `pytorch_export`, a config the PyTorch copy
    cannot be written for is refused now, not after training."""
    if parent is None:
        config = architecture.load_config(
            model.pretrained_model_config, model.config_overrides, model.trust_remote_code
        )
        architecture.fit_to_tokenizer(config, tokenizer, max_length)  # its ids, size, positions
    else:
        config = parent.config
    if pytorch_export:
        model_folder.check_pytorch_copy(config)
    return config


def build_model(config, strategy, tokenizer, total_steps, settings, parent=None):
    """The masked LM and its trainer (masked_lm_trainer, scoring the tokenizer's mask token), with
    AdamW and its schedule over `total_steps` (settings.optimizer), made in the strategy's scope
    and compiled for fit() as settings.speed says. The masked LM starts from random weights drawn
    from settings.masking's seed, or from those of `parent` (continued pretraining)."""
    import tf_keras
    from transformers import TFAutoModelForMaskedLM, create_optimizer

    optimizer, speed = settings.optimizer, settings.speed
    tf_keras.utils.set_random_seed(settings.masking.seed)  # the initial weights, dropout
    tf_startup.hide_transformers_tf_deprecation()
    if speed.bfloat16:
        tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")  # before any layer is built
    with strategy.scope():
        if parent is None:
            masked_lm = TFAutoModelForMaskedLM.from_config(config)
        else:  # from_pretrained, or the parent's PyTorch weights read without torch
            masked_lm = parent.load_masked_lm(TFAutoModelForMaskedLM)
        masked_lm(masked_lm.dummy_inputs)  # build the weights inside the strategy scope
        trainer = masked_lm_trainer(
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
        if optimizer.decay_ratio:  # warmup-stable-decay instead of the triangle
            decay_steps = max(1, round(optimizer.decay_ratio * total_steps))
            adamw.learning_rate = warmup_stable_decay(
                optimizer.learning_rate, total_steps, warmup_steps, decay_steps
            )
        trainer.compile(
            adamw, jit_compile=speed.jit_compile, steps_per_execution=speed.steps_per_execution
        )
    return masked_lm, trainer


def masked_lm_trainer(masked_lm, mlm_head, mask_token_id, accumulation_steps=1):
    """Wrap a transformers TF masked LM in a Keras model whose fit() scores the masked positions.

    `mlm_head="sparse"` gathers the encoder's states at the masked positions first, so the LM head
    (most of a small model's arithmetic) runs on ~15% of them; "full": logits everywhere, the same
    loss at transformers' cost. `masked_lm.save_pretrained()` then writes a standard checkpoint.
    The metrics (metrics.py) count masked positions only; `mask_token_accuracy` is the fill-mask
    task (inputs that were [MASK]), `top_token_share` near 1 means a collapsed model."""
    import tensorflow as tf
    import tf_keras

    def masked_count(labels):  # the batch's masked positions (at least 1): the loss is their mean
        return tf.maximum(tf.reduce_sum(tf.cast(tf.not_equal(labels, -100), tf.float32)), 1.0)

    class MaskedLMTrainer(tf_keras.Model):
        def __init__(self):
            super().__init__()
            self.masked_lm = masked_lm
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
            if mlm_head == "sparse":
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
            per_position = tf.nn.sparse_softmax_cross_entropy_with_logits(
                tf.maximum(labels, 0), logits
            )
            predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
            inputs = tf.gather(features[FEATURE_NAME], features["masked_positions"], batch_dims=1)
            was_mask = scored & tf.equal(inputs, mask_token_id)
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
            if accumulation_steps == 1:
                with tf.GradientTape() as tape:
                    loss_sum = self.summed_loss_and_metrics(features, labels, training=True)
                    scaled_loss = loss_sum * scale
                self.optimizer.minimize(scaled_loss, self.trainable_variables, tape=tape)
            else:
                loss_sum, gradients = accumulated_gradients(
                    self, features, labels, accumulation_steps, scale
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

    return MaskedLMTrainer()


def accumulated_gradients(trainer, features, labels, accumulation_steps, scale):
    """--gradient_accumulation_steps N: each replica's data holds N batches of
    --per_replica_batch_size B a step (hosts.InputPlan); their summed loss and gradients, one batch
    after the other in a while loop, one batch's activations at a time. Each is scaled by the
    `scale` of all N together: N batches of B give exactly the gradients of one batch of N x B."""
    import tensorflow as tf

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


def warmup_stable_decay(peak, total_steps, warmup_steps, decay_steps):
    """--decay_ratio: the rate rises linearly to `peak`, holds it, then falls linearly to 0 over the
    last `decay_steps` (all the steps after the warmup: the triangle). For a fixed budget, more
    steps at the peak; the decay still ends at 0."""
    import tensorflow as tf
    import tf_keras

    class WarmupStableDecay(tf_keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            step = tf.cast(step, tf.float32)
            rising = step / warmup_steps if warmup_steps else 1.0
            falling = (total_steps - step) / decay_steps
            return peak * tf.clip_by_value(tf.minimum(rising, falling), 0.0, 1.0)

    return WarmupStableDecay()


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


def main(settings, callbacks=()):
    """Pretrain as `settings` (parse_args()) say; `callbacks`: fit()'s besides the run's own."""
    tpu_runtime.prepare_runtime(settings.hardware)  # PJRT, before TensorFlow loads; or why not
    data, masking, steps, output = settings.data, settings.masking, settings.steps, settings.output
    check_paths(settings)  # a path or output folder that cannot work is one line, before any work
    parent = load_parent(settings.model)  # continued pretraining: the model to start from
    strategy = hosts.build_strategy(settings.hardware)

    # The data: shards checked against their tokenizer, read by one input pipeline per host.
    named_tokenizer = load_tokenizer(data, settings.model, parent)
    tokenizer = named_tokenizer.tokenizer
    manifests, max_length = read_shards(data, masking, named_tokenizer, parent)
    speed = settings.speed  # training accumulates --gradient_accumulation_steps batches a step
    train_plan, eval_plan = hosts.input_plans(
        strategy, manifests, speed.per_replica_batch_size, speed.gradient_accumulation_steps
    )
    total_steps = steps.total_steps(train_plan.steps_per_epoch)
    short_steps, pieces = sequence_length_warmup(max_length, total_steps, masking)

    def train_dataset_from(step):  # the warmup's first `short_steps` train on pieces
        step_pieces = pieces if step < short_steps else 1
        return distributed_dataset(
            strategy, train_plan, True, tokenizer, max_length, masking, step, step_pieces
        )

    eval_dataset, eval_batches, evaluation = evaluation_data(
        strategy, eval_plan, manifests[1], tokenizer, max_length, masking, steps.max_eval_samples
    )

    # The model, before the output folder is touched: a parent that cannot be loaded stops here.
    pytorch_export = not output.no_pytorch_export
    config = build_config(tokenizer, max_length, settings.model, parent, pytorch_export)
    masked_lm, trainer = build_model(config, strategy, tokenizer, total_steps, settings, parent)
    saving = dict(tokenizer=tokenizer, max_length=max_length, pytorch_export=pytorch_export)
    save = functools.partial(model_folder.save_model, **saving)
    schedule = training_run.Schedule(train_plan, total_steps, short_steps, evaluation)
    if steps.preflight:  # a few of fit()'s steps timed, the run projected, nothing written
        return preflight.preflight_masked_lm(
            trainer,
            settings,
            schedule,
            max_length,
            train_dataset_from,
            eval_dataset,
            eval_batches,
            save=save,  # the final save and the FLOPs of its LM head are counted too
            predictions=max_predictions(max_length, masking.train_probability),
        )
    run = training_run.TrainingRun(  # output folder and resume, logs, card, Hub pushes
        settings, strategy, schedule, config, named_tokenizer, manifests, save, parent
    )
    start_step = run.resume(masked_lm, trainer.optimizer)
    run.evaluate_parent(trainer, eval_dataset, eval_batches)  # where it stands on this text
    with shard_checks.corrupt_shards_named(manifests, output.output_dir):  # which one, what to do
        logs = fit_exact_steps(  # fit() in segments of fixed shapes: fit_exact_steps says why
            trainer,
            train_dataset_from,
            range(start_step, total_steps),
            steps.steps_per_evaluation(train_plan.steps_per_epoch),
            phase_end=short_steps,
            numbered=not steps.eval_steps,
            validation_data=eval_dataset,
            validation_steps=eval_batches,
            callbacks=run.callbacks() + list(callbacks),
        )
    if run.chief:  # one process writes the model: staged, then published with config.json last
        with model_folder.staging(output.output_dir) as folder:
            save(folder, masked_lm)
    return trainer, run.finish(trainer, logs)


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "run_mlm.py")
