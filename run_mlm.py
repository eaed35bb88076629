#!/usr/bin/env python
"""Step 3 of 3: pretrain a masked language model from scratch on TFRecord shards, on TPU, GPU or
CPU.

Shards from prepare_tfrecord_shards.py, tokenizer from train_unigram.py; masking in tf.data with TF
ops; a transformers TF masked LM (RoBERTa by default), its LM head run at the masked positions only,
fit with Keras. The saved folder loads with `pipeline("fill-mask", model=output_dir)`, its pytorch/
copy with transformers 5.

    # TPU VM (TPUStrategy; data, checkpoints and output may live on GCS)
    python run_mlm.py --train_dataset gs://my-bucket/shards/train --eval_dataset gs://my-bucket/shards/validation \
        --tokenizer tokenizer --output_dir gs://my-bucket/roberta-base-from-scratch \
        --per_replica_batch_size 32 --num_epochs 10 --bfloat16

    # GPU box (mirrored over all visible GPUs) or a laptop CPU (default strategy): add --no_tpu
    python run_mlm.py --no_tpu --train_dataset shards/train --eval_dataset shards/validation \
        --tokenizer tokenizer --output_dir model \
        --config_overrides hidden_size=256,num_hidden_layers=4,num_attention_heads=4,intermediate_size=1024

    # TPU pod slice: once, on the slice's first worker, naming the slice
    python run_mlm.py --tpu_name my-v4-32 --train_dataset gs://my-bucket/shards/train ...

    # GPU cluster (MultiWorkerMirroredStrategy): the same command on every machine, each with its
    # own task
    TF_CONFIG='{"cluster": {"worker": ["10.0.0.1:12345", "10.0.0.2:12345"]}, "task": {"type": "worker", "index": 0}}' \
        python run_mlm.py --multi_worker --train_dataset gs://my-bucket/shards/train ...

After an interruption, run the same command again: it resumes from its newest checkpoint. README.md
lists what a run leaves in --output_dir; the plumbing (hosts, checkpoints, logs, export, Hub) is in
mlm_pipeline/.
"""

import functools
import json
import math
import os
import sys
import time

from mlm_pipeline import (
    checkpoints,
    contract,
    hosts,
    hub,
    model_card,
    model_folder,
    storage,
    tf_startup,
    training_logs,
)
from mlm_pipeline.contract import FEATURE_NAME
from mlm_pipeline.errors import (
    OneLineErrorParser,
    UsageError,
    exit_on_usage_error,
    first_line,
    non_negative_int,
    positive_int,
)
from mlm_pipeline.pytorch_export import check_padding_index, check_pytorch_export

# Flags that shape the batches and the optimizer: a checkpoint's step means something else under
# other values, so a resumed run must have the same (--gradient_accumulation_steps may change: the
# same steps, less memory).
RESUME_SETTINGS = (
    "seed",
    "learning_rate",
    "mlm_probability",
    "whole_word_masking",
    "shuffle_buffer_size",
    "warmup_ratio",
    "weight_decay_rate",
    "max_grad_norm",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "short_sequence_length",
    "short_sequence_ratio",
)
# and those above
CARD_SETTINGS = ("per_replica_batch_size", "gradient_accumulation_steps", "mlm_head", "bfloat16")
CARD_PATHS = ("hub_model_id", "output_dir", "train_dataset", "eval_dataset", "tokenizer")


def parse_args(argv=None):
    parser = OneLineErrorParser(
        description="Pretrain a masked language model from scratch on TFRecord shards."
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--train_dataset", required=True, help="Folder of train shards (local or gs://)."
    )
    data.add_argument(
        "--eval_dataset", help="Folder of evaluation shards (local or gs://); optional."
    )
    data.add_argument(
        "--tokenizer", required=True, help="Tokenizer folder or Hub id (from train_unigram.py)."
    )
    data.add_argument(
        "--max_length", type=int, help="Sequence length; must equal the shards' (default: theirs)."
    )
    data.add_argument(
        "--mlm_probability",
        type=float,
        default=0.15,
        help="Share of tokens masked (default: 0.15).",
    )
    data.add_argument(
        "--shuffle_buffer_size",
        type=positive_int,
        default=2**16,
        help="Sequences shuffled together.",
    )
    data.add_argument(
        "--whole_word_masking",
        action="store_true",
        help="Train on whole words masked: a word's pieces "
        "are chosen together (evaluation keeps token masking, so runs compare).",
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--pretrained_model_config",
        help="Config to start from: Hub id, local folder or JSON file; "
        "never weights. Default: RoBERTa-base's architecture (transformers' RobertaConfig()).",
    )
    model.add_argument(
        "--config_overrides",
        help="Comma-separated config changes, e.g. "
        "hidden_size=256,num_hidden_layers=4,num_attention_heads=4",
    )
    model.add_argument(
        "--trust_remote_code", action="store_true", help="Allow code from Hub repositories."
    )
    training = parser.add_argument_group("training")
    training.add_argument(
        "--output_dir", required=True, help="Where the model and tokenizer are saved."
    )
    training.add_argument(
        "--overwrite_output_dir", action="store_true", help="Replace a finished run there."
    )
    training.add_argument(
        "--no_pytorch_export",
        action="store_true",
        help="Save the TF weights only, without "
        "--output_dir/pytorch: a copy for transformers 5 (roberta, roberta-prelayernorm, bert).",
    )
    training.add_argument(
        "--per_replica_batch_size", type=positive_int, default=8, help="Sequences per replica."
    )
    training.add_argument(
        "--num_epochs",
        type=positive_int,
        default=1,
        help="Passes over the train shards (default: 1); --max_steps overrides it.",
    )
    training.add_argument(
        "--max_steps",
        type=positive_int,
        help="Optimizer steps to run in all, overriding "
        "--num_epochs: the data repeats as needed and the last epoch may end part-way.",
    )
    training.add_argument(
        "--learning_rate", type=float, default=1e-4, help="Peak learning rate (default: 1e-4)."
    )
    training.add_argument(
        "--weight_decay_rate", type=float, default=0.01, help="AdamW decay (default: 0.01)."
    )
    training.add_argument(
        "--warmup_ratio", type=float, default=0.05, help="Share of steps for warmup."
    )
    training.add_argument(
        "--max_grad_norm", type=float, default=0.0, help="Global gradient norm clip; 0: none."
    )
    training.add_argument(
        "--adam_beta1", type=float, default=0.9, help="Adam's beta1 (default: 0.9)."
    )
    training.add_argument(
        "--adam_beta2", type=float, default=0.999, help="Adam's beta2 (default: 0.999)."
    )
    training.add_argument(
        "--adam_epsilon", type=float, default=1e-8, help="Adam's epsilon (default: 1e-8)."
    )
    training.add_argument(
        "--short_sequence_length",
        type=positive_int,
        help="Sequence-length warmup: for the first "
        "--short_sequence_ratio of the steps, cut every sequence into pieces this long (it must "
        "divide the shards' length), with as many tokens a step; then train at full length.",
    )
    training.add_argument(
        "--short_sequence_ratio",
        type=float,
        default=0.5,
        help="Share of the steps at --short_sequence_length (default: 0.5).",
    )
    training.add_argument(
        "--gradient_accumulation_steps",
        type=positive_int,
        default=1,
        help="Split each replica's "
        "batch into this many micro-batches and add up their gradients: the same optimizer step in "
        "less memory (default: 1).",
    )
    training.add_argument(
        "--seed", type=int, default=42, help="Seed for shuffling, masking and initialisation."
    )
    training.add_argument(
        "--mlm_head",
        choices=("sparse", "full"),
        default="sparse",
        help="sparse (default): LM head "
        "at the masked positions only, the same loss for less work; full: logits everywhere.",
    )
    training.add_argument(
        "--bfloat16", action="store_true", help="Mixed bfloat16 precision (TPU, recent GPUs)."
    )
    training.add_argument(
        "--jit_compile", action="store_true", help="Compile the train step with XLA."
    )
    training.add_argument(
        "--steps_per_execution", type=positive_int, default=1, help="Steps per tf.function call."
    )
    training.add_argument(
        "--save_steps",
        type=non_negative_int,
        default=1000,
        help="Checkpoint every this many steps "
        "and at epoch ends (0: those only); rerun the command to resume (default: 1000).",
    )
    training.add_argument(
        "--save_total_limit", type=positive_int, default=3, help="Checkpoints kept (default: 3)."
    )
    training.add_argument(
        "--logging_steps",
        type=positive_int,
        default=50,
        help="Log training figures "
        "to TensorBoard (<output_dir>/logs) every this many steps; evaluation: each epoch.",
    )
    training.add_argument(
        "--hub_model_id",
        help="Push model, tokenizer and card to this Hub repository (namespace/"
        "name; `hf auth login` or HF_TOKEN): a snapshot at each epoch end, then the final one.",
    )
    training.add_argument(
        "--hub_private", action="store_true", help="Make the --hub_model_id repo private (if new)."
    )
    training.add_argument(
        "--hub_push_timeout",
        type=positive_int,
        default=hub.FINAL_PUSH_TIMEOUT,
        help="At the end, "
        "wait this long (s) for the Hub uploads, then exit saying how to push later (default: "
        "3600).",
    )
    hardware = parser.add_argument_group("hardware")
    hardware.add_argument(
        "--tpu_name", default="local", help="TPU name; 'local' on a TPU VM (default)."
    )
    hardware.add_argument("--tpu_zone", help="Zone of a TPU node, when not on a TPU VM.")
    hardware.add_argument("--gcp_project", help="GCP project of a TPU node, when not on a TPU VM.")
    hardware.add_argument(
        "--no_tpu", action="store_true", help="Train on the GPUs, or the CPU when there are none."
    )
    hardware.add_argument(
        "--multi_worker",
        action="store_true",
        help="MultiWorkerMirroredStrategy: every machine runs "
        "this command with its own TF_CONFIG; worker 0 (or the chief) writes. Implies --no_tpu.",
    )
    hardware.add_argument(
        "--cpu_replicas",
        type=positive_int,
        default=1,
        help="With --no_tpu and no GPU: split the "
        "CPU into this many mirrored replicas, to rehearse a TPU's multi-replica path (default: "
        "1).",
    )
    return parser.parse_args(argv)


def build_strategy(args):
    """TPUStrategy unless --no_tpu; otherwise mirrored over the visible GPUs, or the default strategy on CPU."""
    import tensorflow as tf

    if args.multi_worker:  # a cluster of machines, each told its place by TF_CONFIG
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=hosts.multi_worker_resolver()
        )
    if not args.no_tpu:
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
                tpu=args.tpu_name, zone=args.tpu_zone, project=args.gcp_project
            )
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, RuntimeError, tf.errors.OpError) as error:
            # TF's first sentence says it
            reason = str(error).strip().split(". ")[0] or type(error).__name__
            raise UsageError(
                f"no TPU found for --tpu_name {args.tpu_name} ({reason}); pass --no_tpu to train "
                "on GPUs or the CPU."
            ) from None
        return tf.distribute.TPUStrategy(resolver)
    if tf.config.list_physical_devices("GPU"):
        # every visible GPU; narrow with CUDA_VISIBLE_DEVICES
        return tf.distribute.MirroredStrategy()
    if args.cpu_replicas > 1:  # the CPU split into logical devices, to rehearse a TPU's replicas
        return tf.distribute.MirroredStrategy(hosts.logical_cpus(args.cpu_replicas))
    return tf.distribute.get_strategy()


def max_predictions(max_length, mlm_probability):
    """Predictions per sequence: the masking below never chooses more, so shapes stay static for XLA/TPU."""
    return max(1, math.ceil(max_length * mlm_probability))


@functools.cache  # once per tokenizer, not once per input pipeline and phase
def word_start_table(tokenizer):
    """[vocabulary] booleans: does this piece begin a word? From the vocabulary's own markers: "▁"
    begins one in SentencePiece-style vocabularies (this project's), "Ġ" in byte-level BPE; in
    WordPiece "##" continues one."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    marker = max(
        ("▁", "Ġ", "##"), key=lambda marker: sum(piece.startswith(marker) for piece in pieces)
    )
    if not any(piece.startswith(marker) for piece in pieces):
        raise UsageError(
            "--whole_word_masking needs a vocabulary that marks words (pieces with ▁, Ġ or ##)."
        )
    return [piece.startswith(marker) != (marker == "##") for piece in pieces]


def mask_tokens(
    input_ids, seed, mlm_probability, mask_token_id, special_ids, replacement_ids, word_starts=None
):
    """BERT masking in TF ops, stateless so the same seed always gives the same masks.

    In each sequence, round(`mlm_probability` x its non-special tokens) positions are chosen at
    random (never a special token, <unk> included: predicting "unknown" teaches nothing); 80% of
    them become [MASK], 10% a random non-special token, 10% stay. An exact count, as in the original
    BERT, means at most `max_predictions()` positions, which is what lets the model score those
    positions alone. Returns the masked ids [batch, length], the chosen positions [batch,
    predictions] and their labels: the original ids, or -100 in slots beyond the sequence's count
    (skipped by loss and metrics; their position is 0, harmless).

    With `word_starts` (word_start_table() as a tensor) whole words are chosen instead: a word is a
    piece that begins one and the pieces after it that do not (a special token, or the first piece
    of a sequence cut from a longer text, always begins one). Words are taken in a random order for
    as long as their pieces fit in the sequence's count, so no word is ever partly chosen; the
    80/10/10 rule still applies piece by piece.
    """
    import tensorflow as tf

    choose_seed, action_seed, random_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 3)
    )
    shape = tf.shape(input_ids)
    length = input_ids.shape[-1]
    predictions = max_predictions(length, mlm_probability)
    maskable = ~tf.reduce_any(tf.equal(input_ids[..., None], special_ids), axis=-1)
    count = tf.cast(
        tf.round(mlm_probability * tf.reduce_sum(tf.cast(maskable, tf.float32), axis=-1)), tf.int32
    )

    # A random ranking of the maskable positions; the first `count` of each row are chosen.
    noise = tf.random.stateless_uniform(shape, choose_seed)
    if word_starts is None:
        _, ranked = tf.math.top_k(tf.where(maskable, noise, -1.0), k=predictions)
        used = tf.range(predictions)[None, :] < count[:, None]
    # every piece takes its word's draw, so a word's pieces rank side by side (top_k keeps ties in
    # order)
    else:
        follows_special = tf.pad(~maskable[:, :-1], [[0, 0], [1, 0]], constant_values=True)
        starts = tf.gather(word_starts, input_ids) | ~maskable | follows_special
        # each position's word, numbered from 0
        word = tf.cumsum(tf.cast(starts, tf.int32), axis=-1) - 1
        word_noise = tf.gather(noise, word, batch_dims=1)
        _, ranked = tf.math.top_k(
            tf.where(maskable, word_noise, -1.0), k=min(predictions + 1, length)
        )
        ranked_word = tf.gather(word, ranked, batch_dims=1)
        word_ends = tf.pad(
            ranked_word[:, 1:] != ranked_word[:, :-1], [[0, 0], [0, 1]], constant_values=True
        )
        # Take the ranking up to its last word end within the count: whole words only, never over
        # the count.
        taken = tf.range(1, ranked.shape[-1] + 1)[None, :]
        cutoff = tf.reduce_max(tf.where(word_ends & (taken <= count[:, None]), taken, 0), axis=-1)
        ranked, used = ranked[:, :predictions], tf.range(predictions)[None, :] < cutoff[:, None]
    positions = tf.where(used, ranked, 0)
    labels = tf.where(used, tf.gather(input_ids, positions, batch_dims=1), -100)
    chosen = tf.reduce_any(
        tf.one_hot(positions, length, on_value=True, off_value=False) & used[..., None], axis=1
    )

    action = tf.random.stateless_uniform(shape, action_seed)
    to_mask = chosen & (action < 0.8)
    to_random = chosen & (action >= 0.8) & (action < 0.9)
    random_index = tf.random.stateless_uniform(
        shape, random_seed, maxval=tf.size(replacement_ids), dtype=tf.int32
    )
    random_tokens = tf.gather(replacement_ids, random_index)
    masked_ids = tf.where(to_mask, mask_token_id, tf.where(to_random, random_tokens, input_ids))
    return masked_ids, positions, labels


def build_dataset(
    files,
    tokenizer,
    args,
    max_length,
    batch_size,
    training,
    start_epoch=0,
    start_batch=0,
    batches_per_epoch=None,
    pipeline=0,
    pieces=1,
):
    """Shards -> shuffled, batched, parsed, masked batches of ({"input_ids", "masked_positions"},
    labels).

    Every shape is static. `files` are this input pipeline's own shards; each epoch yields at most
    `batches_per_epoch` batches, so that all the hosts of a cluster take the same number of steps.
    Training data is an endless stream of epochs, everything random in it stateless: epoch e reads
    the shards in an order drawn from (seed, e), shuffles them in blocks of --shuffle_buffer_size
    records, each permuted with a seed drawn from (seed, e, block), and masks its batch i with a
    seed drawn from (seed, e, i). So the masks change every epoch, as in RoBERTa, yet any point of
    the stream can be rebuilt from (`start_epoch`, `start_batch`) alone: that is how a resumed run
    continues where it stopped. Evaluation data is one pass in file order with the same masks every
    time, so the epochs' figures compare.

    `pieces` > 1 is the sequence-length warmup's phase: each sequence is cut into that many shorter
    ones, and the batch holds `pieces` times as many, so a step sees as many tokens as at full
    length.
    """
    import tensorflow as tf

    special = set(tokenizer.all_special_ids)
    special_ids = tf.constant(sorted(special), dtype=tf.int32)
    replacement_ids = tf.constant(
        [i for i in range(len(tokenizer)) if i not in special], dtype=tf.int32
    )
    mask_token_id = tf.constant(tokenizer.mask_token_id, dtype=tf.int32)
    word_starts = (
        tf.constant(word_start_table(tokenizer)) if training and args.whole_word_masking else None
    )
    files = tf.constant(files)
    # train and eval draws differ
    base_seed = tf.constant([args.seed, 1 if training else 2], dtype=tf.int64)
    # each host draws its own shuffles and masks; host 0 draws those of a single-host run
    if pipeline:
        base_seed = tf.random.experimental.stateless_fold_in(base_seed, pipeline)

    def seed_for(*numbers):
        seed = base_seed
        for number in numbers:
            seed = tf.random.experimental.stateless_fold_in(seed, number)
        return seed

    def epoch_batches(epoch):
        order = (
            tf.random.experimental.stateless_shuffle(files, seed_for(epoch, -1))
            if training
            else files
        )
        records = tf.data.Dataset.from_tensor_slices(order).interleave(
            tf.data.TFRecordDataset,
            cycle_length=min(len(files), 8),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        if training:
            blocks = records.batch(args.shuffle_buffer_size).enumerate()
            records = blocks.flat_map(
                lambda block, serialized: tf.data.Dataset.from_tensor_slices(
                    tf.random.experimental.stateless_shuffle(serialized, seed_for(epoch, block))
                )
            )
        batches = records.batch(batch_size, drop_remainder=True)
        if batches_per_epoch is not None:
            batches = batches.take(batches_per_epoch)
        return batches.enumerate().map(lambda index, batch: (epoch, index, batch))

    epochs = tf.data.Dataset.counter(start_epoch) if training else tf.data.Dataset.range(1)
    # fit() counts the steps, so the training stream may be endless
    dataset = epochs.flat_map(epoch_batches)
    if start_batch:
        # the batches skipped are read, but neither parsed nor masked
        dataset = dataset.skip(start_batch)
    features = contract.record_features(max_length)

    def parse_and_mask(epoch, index, serialized):
        # Parsing a whole batch in one op is far cheaper than parsing records one by one.
        input_ids = tf.cast(tf.io.parse_example(serialized, features)[FEATURE_NAME], tf.int32)
        # masks are then drawn per piece
        input_ids = tf.reshape(input_ids, [-1, max_length // pieces])
        masked_ids, positions, labels = mask_tokens(
            input_ids,
            seed_for(epoch, index),
            args.mlm_probability,
            mask_token_id,
            special_ids,
            replacement_ids,
            word_starts,
        )
        return {FEATURE_NAME: masked_ids, "masked_positions": positions}, labels

    return dataset.map(parse_and_mask, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
        tf.data.AUTOTUNE
    )


def build_config(args, tokenizer, max_length):
    """The architecture config (RoBERTa-base's unless --pretrained_model_config), with the tokenizer's ids."""
    from transformers import AutoConfig, RobertaConfig

    source = args.pretrained_model_config
    if source is not None and os.path.isfile(source) and not source.endswith(".json"):
        raise UsageError(
            f"--pretrained_model_config {source} is a file but not JSON; pass a config.json."
        )
    if source is not None and not os.path.exists(source) and source.startswith((".", "/")):
        raise UsageError(
            f"--pretrained_model_config {source} does not exist; pass a config.json or a Hub id."
        )
    try:
        # only the config is read, never weights: training starts from random ones
        trust = args.trust_remote_code
        config = (
            RobertaConfig()
            if source is None
            else AutoConfig.from_pretrained(source, trust_remote_code=trust)
        )
    except (OSError, ValueError) as error:
        raise UsageError(
            f"could not load --pretrained_model_config {source}: {first_line(error)}"
        ) from None
    for item in filter(None, (part.strip() for part in (args.config_overrides or "").split(","))):
        key, separator, value = item.partition("=")
        if not separator:
            raise UsageError(
                f"--config_overrides item {item!r} is not key=value; e.g. hidden_size=256."
            )
        if not hasattr(config, key.strip()):
            raise UsageError(
                f"--config_overrides names {key.strip()!r}, which {type(config).__name__} does not "
                "have."
            )
        try:
            value = json.loads(value)  # numbers, booleans, null; anything else stays a string
        except json.JSONDecodeError:
            pass
        setattr(config, key.strip(), value)

    config.vocab_size, config.pad_token_id = len(tokenizer), tokenizer.pad_token_id
    config.bos_token_id = (
        tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    )
    config.eos_token_id = (
        tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    )
    config.cls_token_id, config.sep_token_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    config.mask_token_id = tokenizer.mask_token_id
    check_padding_index(config.model_type, tokenizer.pad_token_id, tokenizer.pad_token)
    # RoBERTa numbers positions from pad_token_id + 1 (max_length + pad + 1 rows), others from 0:
    # both fit.
    config.max_position_embeddings = max(
        config.max_position_embeddings, max_length + tokenizer.pad_token_id + 1
    )
    if not args.no_pytorch_export:
        # a config the PyTorch copy cannot be written for is refused now, not at the end
        check_pytorch_export(config)
    if config.hidden_size % config.num_attention_heads:
        raise UsageError(
            f"hidden_size {config.hidden_size} is not divisible by num_attention_heads "
            f"{config.num_attention_heads}; fix --config_overrides."
        )
    return config


def masked_lm_trainer(masked_lm, mlm_head, mask_token_id, accumulation_steps=1):
    """Wrap a transformers TF masked LM in a Keras model whose fit() scores the masked positions
    only.

    With `mlm_head="sparse"` the encoder's hidden states are gathered at the masked positions first,
    so the LM head (dense, layer norm and the vocabulary projection, most of a small model's
    arithmetic) runs on ~15% of the positions. With "full" the model computes logits everywhere, as
    transformers does, and they are gathered afterwards: same loss, the reference cost. The weights
    trained are the wrapped model's own, so `masked_lm.save_pretrained()` writes a standard
    checkpoint.

    The metrics count the masked positions only: `masked_accuracy` is top-1 accuracy over every
    position with a label (80% [MASK], 10% random, 10% unchanged), `mask_token_accuracy` over those
    whose input was [MASK] (the fill-mask task), and `top_token_share` the share of those
    predictions taken by the most predicted token (near 1: the model has collapsed onto one answer).
    """
    import tensorflow as tf
    import tf_keras

    def masked_count(labels):  # the batch's masked positions (at least 1): the loss is their mean
        return tf.maximum(tf.reduce_sum(tf.cast(tf.not_equal(labels, -100), tf.float32)), 1.0)

    class MaskedLMTrainer(tf_keras.Model):
        def __init__(self):
            super().__init__()
            self.masked_lm = masked_lm
            self.loss_tracker = tf_keras.metrics.Mean(name="loss")
            self.masked_accuracy = training_logs.position_accuracy("masked_accuracy")
            self.mask_token_accuracy = training_logs.position_accuracy("mask_token_accuracy")
            self.top_token_share = training_logs.top_token_share(masked_lm.config.vocab_size)

        @property
        def metrics(self):  # what fit() resets every epoch and reports
            return [
                self.loss_tracker,
                self.masked_accuracy,
                self.mask_token_accuracy,
                self.top_token_share,
            ]

        def call(self, features, training=False):
            """Logits [batch, predictions, vocabulary] at the masked positions."""
            positions = features["masked_positions"]
            if mlm_head == "sparse":
                encoder = getattr(self.masked_lm, self.masked_lm.base_model_prefix)
                hidden_states = encoder(input_ids=features[FEATURE_NAME], training=training)[0]
                logits = self.masked_lm.get_lm_head()(
                    tf.gather(hidden_states, positions, batch_dims=1)
                )
            else:
                logits = self.masked_lm(input_ids=features[FEATURE_NAME], training=training).logits
                logits = tf.gather(logits, positions, batch_dims=1)
            # Under mixed bfloat16 the logits arrive in bf16; softmax and loss need float32's range.
            return tf.cast(logits, tf.float32)

        def summed_loss_and_metrics(self, features, labels, training):
            """The cross-entropy summed over the masked positions; the accuracies updated with them."""
            logits = self.call(features, training)
            # -100: a slot beyond the sequence's count of masked positions
            scored = tf.not_equal(labels, -100)
            per_position = tf.nn.sparse_softmax_cross_entropy_with_logits(
                tf.maximum(labels, 0), logits
            )

            predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
            inputs_at_positions = tf.gather(
                features[FEATURE_NAME], features["masked_positions"], batch_dims=1
            )
            was_mask = scored & tf.equal(inputs_at_positions, mask_token_id)
            self.masked_accuracy.update_state(labels, predictions, scored)
            self.mask_token_accuracy.update_state(labels, predictions, was_mask)
            self.top_token_share.update_state(predictions, was_mask)
            return tf.reduce_sum(tf.where(scored, per_position, 0.0))

        def train_step(self, data):
            """One optimizer step on the mean loss over the batch's masked positions, from N micro-batches."""
            features, labels = data
            count = masked_count(labels)
            # Each replica's gradients are summed across replicas, so each contributes its share.
            scale = 1.0 / (count * tf.distribute.get_strategy().num_replicas_in_sync)
            if accumulation_steps == 1:
                with tf.GradientTape() as tape:
                    loss_sum = self.summed_loss_and_metrics(features, labels, training=True)
                    scaled_loss = loss_sum * scale
                self.optimizer.minimize(scaled_loss, self.trainable_variables, tape=tape)
            # each micro-batch's sum over the whole batch's count: N x (B/N) gives B's gradients
            # exactly
            else:
                split = (
                    lambda tensor: tf.reshape(  # noqa: E731  (fit() may trace a phase with unknown lengths)
                        tensor, tf.concat([[accumulation_steps, -1], tf.shape(tensor)[1:]], axis=0)
                    )
                )
                features, labels = tf.nest.map_structure(split, features), split(labels)

                # a while loop: one micro-batch's activations at a time
                def accumulate(micro, loss_sum, *gradients):
                    with tf.GradientTape() as tape:
                        micro_features = {name: tensor[micro] for name, tensor in features.items()}
                        micro_sum = self.summed_loss_and_metrics(
                            micro_features, labels[micro], training=True
                        )
                        scaled_loss = micro_sum * scale
                    micro_gradients = tape.gradient(scaled_loss, self.trainable_variables)
                    return (
                        micro + 1,
                        loss_sum + micro_sum,
                        *[
                            total + tf.convert_to_tensor(gradient)
                            for total, gradient in zip(gradients, micro_gradients)
                        ],
                    )

                zeros = [tf.zeros_like(weight) for weight in self.trainable_variables]
                _, loss_sum, *gradients = tf.while_loop(
                    lambda micro, *_: micro < accumulation_steps,
                    accumulate,
                    (tf.constant(0), tf.constant(0.0), *zeros),
                )
                self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
            self.loss_tracker.update_state(loss_sum / count)
            return {metric.name: metric.result() for metric in self.metrics}

        def test_step(self, data):
            features, labels = data
            count = masked_count(labels)
            self.loss_tracker.update_state(
                self.summed_loss_and_metrics(features, labels, training=False) / count
            )
            return {metric.name: metric.result() for metric in self.metrics}

    return MaskedLMTrainer()


def build_model(config, args, total_steps, strategy, mask_token_id):
    """The masked LM and the trainer that fits it, with AdamW and its schedule, created in the strategy's scope."""
    import tf_keras
    from transformers import TFAutoModelForMaskedLM, create_optimizer

    tf_startup.hide_transformers_tf_deprecation()
    if args.bfloat16:
        tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")  # before any layer is built
    with strategy.scope():
        masked_lm = TFAutoModelForMaskedLM.from_config(config)
        masked_lm(masked_lm.dummy_inputs)  # build the weights inside the strategy scope
        trainer = masked_lm_trainer(
            masked_lm, args.mlm_head, mask_token_id, args.gradient_accumulation_steps
        )
        # AdamW, linear warmup then decay to 0, none on biases and layer norms; all replicas'
        # gradients clipped.
        optimizer, _ = create_optimizer(
            args.learning_rate,
            total_steps,
            int(args.warmup_ratio * total_steps),
            adam_beta1=args.adam_beta1,
            adam_beta2=args.adam_beta2,
            adam_epsilon=args.adam_epsilon,
            adam_global_clipnorm=args.max_grad_norm or None,
            weight_decay_rate=args.weight_decay_rate,
        )
        trainer.compile(
            optimizer=optimizer,
            jit_compile=args.jit_compile,
            steps_per_execution=args.steps_per_execution,
        )
    return masked_lm, trainer


def sequence_length_warmup(args, max_length, total_steps):
    """(steps on short pieces, pieces per sequence): the short phase, cut from the shards as they
    are.

    On short sequences a [MASK] gets more of the attention (spread evenly at first) from its
    neighbours, and each position's embedding is trained by more sequences a step: a model learns to
    read its context sooner. BERT did 90% of its steps at 128 tokens, then 512, from data written
    twice; here the phase follows from the step.
    """
    short = args.short_sequence_length
    if short is None:
        return 0, 1
    if short >= max_length or max_length % short:
        raise UsageError(
            f"--short_sequence_length {short} must divide the shards' length {max_length} into "
            f"pieces (e.g. {max_length // 4}); or drop it to train at full length throughout."
        )
    short_steps, pieces = round(args.short_sequence_ratio * total_steps), max_length // short
    print(
        f"Sequence-length warmup: steps 1-{short_steps:,} on {pieces} pieces of {short} tokens a "
        f"sequence, the rest at {max_length}."
    )
    return short_steps, pieces


def fit_exact_steps(
    model,
    train_dataset_from,
    start_step,
    total_steps,
    steps_per_epoch,
    short_phase=(0, 1),
    **fit_kwargs,
):
    """Run optimizer steps start_step .. total_steps with model.fit, evaluating at the end of every
    epoch.

    `train_dataset_from(step)` gives the training stream from that step on, so every fit() call
    continues the data (order and masks) exactly where the previous call, or the interrupted run,
    stopped. A run that starts or ends mid-epoch gets a fit() call of its own for that part
    (checkpoints.fit_segments says why), and so does each phase of the sequence-length warmup,
    `short_phase` (short_steps, pieces): each call's shapes are fixed.
    """
    logs, (short_steps, pieces) = {}, short_phase
    for first_step, epoch, epochs, steps in checkpoints.fit_segments(
        start_step, total_steps, steps_per_epoch, phase_end=short_steps
    ):
        dataset = train_dataset_from(first_step, pieces=pieces if first_step < short_steps else 1)
        history = model.fit(
            dataset, initial_epoch=epoch, epochs=epoch + epochs, steps_per_epoch=steps, **fit_kwargs
        )
        for key, values in history.history.items():
            logs[key] = logs.get(key, []) + values
    return logs


def check_args(args):
    """What argparse cannot check alone: ranges, and flags that go together or exclude each other."""
    if args.max_length is not None and args.max_length <= 1:
        raise UsageError(f"--max_length {args.max_length} must be more than 1.")
    if not 0.0 < args.mlm_probability < 1.0:
        raise UsageError(
            f"--mlm_probability {args.mlm_probability} must lie between 0 and 1 (0.15 is usual)."
        )
    if not 0.0 <= args.warmup_ratio < 1.0:
        raise UsageError(f"--warmup_ratio {args.warmup_ratio} must lie in [0, 1).")
    if args.learning_rate <= 0 or args.weight_decay_rate < 0 or args.max_grad_norm < 0:
        raise UsageError(
            "--learning_rate must be positive, --weight_decay_rate and --max_grad_norm not "
            "negative."
        )
    if not (
        0.0 <= args.adam_beta1 < 1.0 and 0.0 <= args.adam_beta2 < 1.0 and args.adam_epsilon > 0
    ):
        raise UsageError(
            f"--adam_beta1 {args.adam_beta1} and --adam_beta2 {args.adam_beta2} must lie in [0, "
            f"1), --adam_epsilon {args.adam_epsilon} above 0 (e.g. 0.9, 0.98, 1e-6)."
        )
    if not 0.0 < args.short_sequence_ratio < 1.0:
        raise UsageError(
            f"--short_sequence_ratio {args.short_sequence_ratio} must lie between 0 and 1."
        )
    if args.per_replica_batch_size % args.gradient_accumulation_steps:
        raise UsageError(
            f"--gradient_accumulation_steps {args.gradient_accumulation_steps} must divide "
            f"--per_replica_batch_size {args.per_replica_batch_size} into equal micro-batches."
        )
    args.no_tpu = args.no_tpu or args.multi_worker
    if args.cpu_replicas > 1 and args.multi_worker:
        raise UsageError(
            f"--cpu_replicas {args.cpu_replicas} splits one machine; it cannot go with "
            "--multi_worker."
        )
    if args.cpu_replicas > 1 and not args.no_tpu:
        raise UsageError(f"--cpu_replicas {args.cpu_replicas} only applies with --no_tpu.")
    if args.cpu_replicas > 1 and args.jit_compile:
        raise UsageError(
            f"--jit_compile cannot be combined with --cpu_replicas {args.cpu_replicas}: XLA on the "
            "CPU cannot reach variables placed on another logical device; run the two checks "
            "separately."
        )
    if args.jit_compile and args.no_tpu and tf_startup.installed_as_tpu_build():
        raise UsageError(
            "--jit_compile with --no_tpu needs XLA's CPU or GPU compiler, which TensorFlow's TPU "
            "build (tensorflow-tpu) leaves out; on a TPU drop --no_tpu (TPUStrategy compiles each "
            "step with XLA), or install requirements.txt to compile on the CPU."
        )
    if args.hub_private and not args.hub_model_id:
        raise UsageError("--hub_private needs --hub_model_id (e.g. my-user/my-model).")
    if args.hub_model_id is not None:
        hub.check_hub_model_id(args.hub_model_id, example="my-user/roberta-from-scratch")


def main(args):
    check_args(args)
    storage.check_gcs_paths(
        {
            "--train_dataset": args.train_dataset,
            "--eval_dataset": args.eval_dataset,
            # else one line, soon
            "--output_dir": args.output_dir,
        },
        writable=["--output_dir"],
    )
    with tf_startup.tensorflow_startup_log_held_back():
        # refused before the TPU's set-up
        checkpoints.check_output_dir(args.output_dir, args.overwrite_output_dir)
        # before anything runs: logical CPU replicas are set before TF's runtime
        strategy = build_strategy(args)
    import tensorflow as tf
    import tf_keras

    tokenizer = contract.load_tokenizer(
        args.tokenizer, "--tokenizer", args.trust_remote_code, require_mlm_tokens=True
    )
    # checked against flags and tokenizer
    train_manifest, eval_manifest = contract.read_training_manifests(
        args.train_dataset, args.eval_dataset, tokenizer, args.tokenizer, args.max_length
    )
    # the longest input the positions allow
    max_length = tokenizer.model_max_length = train_manifest["max_length"]
    # One input pipeline per host, each reading shard files of its own (hosts.py), built by
    # build_dataset().
    pipeline_dataset = functools.partial(
        build_dataset, tokenizer=tokenizer, args=args, max_length=max_length
    )
    steps_per_epoch, train_dataset_from, eval_dataset, eval_steps = hosts.distribute(
        strategy, pipeline_dataset, train_manifest, eval_manifest, args.per_replica_batch_size
    )
    # --max_steps may end mid-epoch
    total_steps = args.max_steps or args.num_epochs * steps_per_epoch
    # not the learning rate's warmup
    short_phase = sequence_length_warmup(args, max_length, total_steps)
    global_batch_size = args.per_replica_batch_size * strategy.num_replicas_in_sync

    tf_keras.utils.set_random_seed(args.seed)
    config = build_config(args, tokenizer, max_length)
    # the one process that writes; the other workers train in lockstep
    chief = hosts.is_chief(strategy)

    recipe, paths = (
        {flag: getattr(args, flag) for flag in flags} for flags in (RESUME_SETTINGS, CARD_PATHS)
    )
    # card(trainer, metrics): the model card after the steps `trainer` has taken so far
    card = functools.partial(
        model_card.model_card,
        config,
        tokenizer,
        (train_manifest, eval_manifest),
        global_batch_size,
        (total_steps, steps_per_epoch),
        paths=paths,
        recipe={**recipe, **{f: getattr(args, f) for f in CARD_SETTINGS}},
    )
    # Made first: an unusable Hub stops the run now. It replaces the 🤗 TPU example's
    # PushToHubCallback, which in transformers 4.57 clones the repository with git into --output_dir
    # (never gs://) and has hung at the end.
    pusher = (
        hub.HubPusher(
            args.hub_model_id,
            args.hub_private,
            args.output_dir,
            tokenizer,
            not args.no_pytorch_export,
            card,
            args.hub_push_timeout,
        )
        if args.hub_model_id and chief
        else None
    )
    # start afresh, or check that the checkpoints there are this run's (then training resumes)
    if chief:
        settings = checkpoints.run_settings(
            config, train_manifest, global_batch_size, total_steps, recipe
        )
        checkpoints.prepare_output_dir(args.output_dir, args.overwrite_output_dir, settings)
    # nobody reads the checkpoints while the chief may still be clearing them
    hosts.wait_for_every_worker(strategy)

    started = time.perf_counter()
    masked_lm, trainer = build_model(config, args, total_steps, strategy, tokenizer.mask_token_id)
    manager, start_step = checkpoints.restore_checkpoint(
        args.output_dir, masked_lm, trainer.optimizer, keep=args.save_total_limit, chief=chief
    )
    print(
        f"Training {type(masked_lm).__name__} ({masked_lm.count_params():,} parameters, "
        f"{args.mlm_head} LM head) on {strategy.num_replicas_in_sync} replica(s) of "
        f"{type(strategy).__name__}: "
        f"{training_logs.steps_in_epochs(total_steps, steps_per_epoch)}, batches of "
        f"{global_batch_size} x {max_length} tokens; {train_manifest['records']} train sequences."
    )
    if start_step:
        print(f"Resuming from {manager.latest_checkpoint} at step {start_step} of {total_steps}.")
    # every worker saves (it may take part in collective ops), into a scratch folder of its own
    if not chief:
        manager = checkpoints.scratch_manager(manager)
    tokens_per_step = global_batch_size * max_length
    try:
        logs = fit_exact_steps(
            trainer,
            train_dataset_from,
            start_step,
            total_steps,
            steps_per_epoch,
            short_phase,
            validation_data=eval_dataset,
            validation_steps=eval_steps or None,
            callbacks=checkpoints.fit_callbacks(
                args.output_dir,
                args.save_steps,
                args.logging_steps,
                chief,
                pusher,
                manager,
                total_steps,
                tokens_per_step,
            ),
            # a progress bar on a terminal, one line per epoch in a log
            verbose=1 if sys.stdout.isatty() else 2,
        )
    except tf.errors.DataLossError as error:
        raise contract.corrupt_shard_error(
            error, (train_manifest, eval_manifest), args.output_dir
        ) from None
    steps = int(trainer.optimizer.iterations.numpy())
    if not chief:
        tf.io.gfile.rmtree(manager.directory)
        print(f"Worker done after {steps} steps; the chief saves the model.")
        return trainer, logs
    # no step left
    logs = logs or training_logs.last_logged_epoch(training_logs.training_log_path(args.output_dir))
    final_card = card(trainer, {key: values[-1] for key, values in logs.items()})
    model_folder.publish(
        args.output_dir, masked_lm, tokenizer, final_card, not args.no_pytorch_export
    )
    summary = training_logs.summary_line(
        steps, tokens_per_step, logs, (time.perf_counter() - started) / 60
    )
    print(summary + (f" (resumed at step {start_step})" if start_step else ""))
    if pusher is not None:
        pusher.push_final(trainer, final_card, f"Final model: {steps} steps")
    return trainer, logs


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "run_mlm.py")
