#!/usr/bin/env python
"""Step 3 of 3: pretrain a masked language model from scratch on TFRecord shards, on TPU, GPU or CPU.

The shards come from prepare_tfrecord_shards.py and the tokenizer from train_unigram.py. Masking happens
in tf.data with TF ops (dynamic: new masks every epoch for training, fixed masks for evaluation), the model
is a transformers TF masked LM (RoBERTa by default) trained with model.fit, and the result is saved with
its tokenizer so that `pipeline("fill-mask", model=output_dir)` works from the folder alone.

    # TPU VM (TPUStrategy; data, checkpoints and output may live on GCS)
    python run_mlm.py --train_dataset gs://my-bucket/shards/train --eval_dataset gs://my-bucket/shards/validation \
        --tokenizer tokenizer --output_dir gs://my-bucket/roberta-base-from-scratch \
        --per_replica_batch_size 32 --num_epochs 10 --bfloat16

    # GPU box (mirrored over all visible GPUs) or a laptop CPU (default strategy): add --no_tpu
    python run_mlm.py --no_tpu --train_dataset shards/train --eval_dataset shards/validation \
        --tokenizer tokenizer --output_dir model \
        --config_overrides hidden_size=256,num_hidden_layers=4,num_attention_heads=4,intermediate_size=1024

The LM head runs at the masked positions only (`--mlm_head sparse`, the default): with a small model and an
8k-32k vocabulary the vocabulary projection is most of the arithmetic, and only ~15% of positions carry a
label. The loss is the same as with full logits, and the saved model is a standard transformers masked LM.

Metrics count the masked positions only: `loss` is the masked-LM cross-entropy, `masked_accuracy` is top-1
accuracy over every position with a label, `mask_token_accuracy` over the positions whose input was [MASK]
(the fill-mask task), and `top_token_share` the share of those predictions taken by the most predicted
token (near 1: the model has collapsed onto one answer). Each epoch ends with the same metrics on the
evaluation shards, prefixed `val_`, and `val_perplexity = exp(val_loss)`.
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # keep TF's start-up chatter out of the training log

MANIFEST_NAME = "manifest.json"
FEATURE_NAME = "input_ids"
FINISHED_RUN_FILES = ("config.json", "tf_model.h5")
MANIFEST_KEYS = ("max_length", "records", "vocab_size", "shards")


class UsageError(Exception):
    """A mistake in the user's input: reported as one line, without a traceback."""


def first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv=None):
    parser = OneLineErrorParser(description="Pretrain a masked language model from scratch on TFRecord shards.")
    data = parser.add_argument_group("data")
    data.add_argument("--train_dataset", required=True, help="Folder of train shards (local or gs://).")
    data.add_argument("--eval_dataset", help="Folder of evaluation shards (local or gs://); optional.")
    data.add_argument("--tokenizer", required=True, help="Tokenizer folder or Hub id (from train_unigram.py).")
    data.add_argument("--max_length", type=int, help="Sequence length; must equal the shards' (default: theirs).")
    data.add_argument("--mlm_probability", type=float, default=0.15, help="Share of tokens masked (default: 0.15).")
    data.add_argument("--shuffle_buffer_size", type=int, default=2**16, help="Sequences in the shuffle buffer.")
    model = parser.add_argument_group("model")
    model.add_argument(
        "--pretrained_model_config",
        help="Config to start from: Hub id, local folder or local JSON file; only the config is used, never "
        "weights. Default: RoBERTa-base's architecture (transformers' RobertaConfig()).",
    )
    model.add_argument(
        "--config_overrides",
        help="Comma-separated config changes, e.g. hidden_size=256,num_hidden_layers=4,num_attention_heads=4",
    )
    model.add_argument("--trust_remote_code", action="store_true", help="Allow code from Hub repositories.")
    training = parser.add_argument_group("training")
    training.add_argument("--output_dir", required=True, help="Where the model and tokenizer are saved.")
    training.add_argument("--overwrite_output_dir", action="store_true", help="Replace a finished run there.")
    training.add_argument("--per_replica_batch_size", type=int, default=8, help="Sequences per replica per step.")
    training.add_argument("--num_epochs", type=int, default=1, help="Passes over the train shards (default: 1).")
    training.add_argument("--max_steps", type=int, help="Stop after this many optimizer steps in all.")
    training.add_argument("--learning_rate", type=float, default=1e-4, help="Peak learning rate (default: 1e-4).")
    training.add_argument("--weight_decay_rate", type=float, default=0.01, help="AdamW decay (default: 0.01).")
    training.add_argument("--warmup_ratio", type=float, default=0.05, help="Share of steps for warmup.")
    training.add_argument("--seed", type=int, default=42, help="Seed for shuffling, masking and initialisation.")
    training.add_argument(
        "--mlm_head",
        choices=("sparse", "full"),
        default="sparse",
        help="sparse (default): run the LM head and loss at the masked positions only, the same loss for far "
        "less work; full: vocabulary logits at every position, as transformers computes them.",
    )
    training.add_argument("--bfloat16", action="store_true", help="Mixed bfloat16 precision (TPU, recent GPUs).")
    training.add_argument("--jit_compile", action="store_true", help="Compile the train step with XLA.")
    training.add_argument("--steps_per_execution", type=int, default=1, help="Steps per tf.function call.")
    training.add_argument("--hub_model_id", help="Push the model and tokenizer to this Hub repository.")
    hardware = parser.add_argument_group("hardware")
    hardware.add_argument("--tpu_name", default="local", help="TPU name; 'local' on a TPU VM (default).")
    hardware.add_argument("--tpu_zone", help="Zone of a TPU node, when not on a TPU VM.")
    hardware.add_argument("--gcp_project", help="GCP project of a TPU node, when not on a TPU VM.")
    hardware.add_argument("--no_tpu", action="store_true", help="Train on the GPUs, or the CPU when there are none.")
    hardware.add_argument(
        "--cpu_replicas",
        type=int,
        default=1,
        help="With --no_tpu and no GPU: split the CPU into this many replicas and mirror across them, to "
        "rehearse the multi-replica path a TPU takes (default: 1).",
    )
    return parser.parse_args(argv)


def check_args(args):
    positive = ("per_replica_batch_size", "num_epochs", "shuffle_buffer_size", "steps_per_execution", "cpu_replicas")
    for flag in positive:
        if getattr(args, flag) <= 0:
            raise UsageError(f"--{flag} {getattr(args, flag)} must be a positive number.")
    if args.max_steps is not None and args.max_steps <= 0:
        raise UsageError(f"--max_steps {args.max_steps} must be positive; leave it out to train --num_epochs.")
    if args.max_length is not None and args.max_length <= 1:
        raise UsageError(f"--max_length {args.max_length} must be more than 1.")
    if not 0.0 < args.mlm_probability < 1.0:
        raise UsageError(f"--mlm_probability {args.mlm_probability} must lie between 0 and 1 (0.15 is usual).")
    if not 0.0 <= args.warmup_ratio < 1.0:
        raise UsageError(f"--warmup_ratio {args.warmup_ratio} must lie in [0, 1).")
    if args.learning_rate <= 0 or args.weight_decay_rate < 0:
        raise UsageError("--learning_rate must be positive and --weight_decay_rate not negative.")
    if args.cpu_replicas > 1 and not args.no_tpu:
        raise UsageError(f"--cpu_replicas {args.cpu_replicas} only applies with --no_tpu.")
    if args.cpu_replicas > 1 and args.jit_compile:
        raise UsageError(
            f"--jit_compile cannot be combined with --cpu_replicas {args.cpu_replicas}: XLA on the CPU cannot "
            "reach variables placed on another logical device; run the two checks separately."
        )


# ---------------------------------------------------------------------------------------------------------
# Hardware


def build_strategy(args):
    """TPUStrategy unless --no_tpu; otherwise mirrored over the visible GPUs, or the default strategy on CPU."""
    import tensorflow as tf

    if not args.no_tpu:
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
                tpu=args.tpu_name, zone=args.tpu_zone, project=args.gcp_project
            )
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, RuntimeError, tf.errors.OpError) as error:
            reason = str(error).strip().split(". ")[0] or type(error).__name__  # TF's first sentence says it
            raise UsageError(
                f"no TPU found for --tpu_name {args.tpu_name} ({reason}); pass --no_tpu to train on GPUs or the CPU."
            ) from None
        return tf.distribute.TPUStrategy(resolver)

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return tf.distribute.MirroredStrategy()  # every visible GPU; narrow with CUDA_VISIBLE_DEVICES
    if args.cpu_replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * args.cpu_replicas
            )
        except RuntimeError:
            raise UsageError(
                f"--cpu_replicas {args.cpu_replicas} must take effect before TensorFlow starts; "
                "call run_mlm.py in a fresh process."
            ) from None
        return tf.distribute.MirroredStrategy([device.name for device in tf.config.list_logical_devices("CPU")])
    return tf.distribute.get_strategy()


# ---------------------------------------------------------------------------------------------------------
# Data: manifests, shards, masking


def read_manifest(folder, flag):
    import tensorflow as tf

    folder = folder.rstrip("/")
    path = f"{folder}/{MANIFEST_NAME}"
    if not tf.io.gfile.isdir(folder):
        raise UsageError(f"{flag} {folder} does not exist; pass a folder written by prepare_tfrecord_shards.py.")
    if not tf.io.gfile.exists(path):
        splits = [s for s in ("train", "validation", "test") if tf.io.gfile.exists(f"{folder}/{s}/{MANIFEST_NAME}")]
        hint = f" (did you mean {folder}/{splits[0]}?)" if splits else ""
        raise UsageError(
            f"{flag} {folder} has no {MANIFEST_NAME}, so it is not a finished split{hint}; "
            "run prepare_tfrecord_shards.py to completion first."
        )
    try:
        with tf.io.gfile.GFile(path) as file:
            manifest = json.load(file)
        missing_keys = [key for key in MANIFEST_KEYS if key not in manifest]
        files = [f"{folder}/{shard['file']}" for shard in manifest.get("shards", [])]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        missing_keys, files = [f"unreadable ({type(error).__name__}: {error})"], []
    if missing_keys:
        raise UsageError(
            f"{flag} {folder}: {MANIFEST_NAME} is not one prepare_tfrecord_shards.py wrote (missing or bad: "
            f"{', '.join(missing_keys)}); rerun it."
        )
    missing = [path for path in files if not tf.io.gfile.exists(path)]
    if not files or missing:
        raise UsageError(
            f"{flag} {folder}: no shards found ({len(missing)} of {len(files)} listed in {MANIFEST_NAME} are "
            "missing); rerun prepare_tfrecord_shards.py."
        )
    manifest["files"] = files
    return manifest


def check_data(args, tokenizer, train_manifest, eval_manifest):
    """Flags, tokenizer and shards must agree before anything expensive happens."""
    manifests = {"--train_dataset": train_manifest, "--eval_dataset": eval_manifest}
    for flag, manifest in manifests.items():
        if manifest is None:
            continue
        if args.max_length is not None and manifest["max_length"] != args.max_length:
            raise UsageError(
                f"--max_length {args.max_length} differs from the {manifest['max_length']} of the shards in {flag}; "
                f"pass --max_length {manifest['max_length']} or rewrite the shards."
            )
        if manifest["vocab_size"] != len(tokenizer):
            raise UsageError(
                f"the shards in {flag} were written with a tokenizer of {manifest['vocab_size']} tokens, but "
                f"--tokenizer {args.tokenizer} has {len(tokenizer)}; pass the tokenizer the shards were made with."
            )
    if eval_manifest is not None and eval_manifest["max_length"] != train_manifest["max_length"]:
        raise UsageError(
            f"train shards have max_length {train_manifest['max_length']} but eval shards have "
            f"{eval_manifest['max_length']}; write both with the same --max_length."
        )


def load_tokenizer(name_or_path, trust_remote_code):
    from transformers import AutoTokenizer

    if not os.path.isdir(name_or_path) and (os.path.exists(name_or_path) or name_or_path.startswith((".", "/"))):
        raise UsageError(f"--tokenizer {name_or_path} is not a tokenizer folder; pass the output of train_unigram.py.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise UsageError(f"could not load the tokenizer {name_or_path!r}: {first_line(error)}") from None
    for name in ("mask", "pad"):
        if getattr(tokenizer, f"{name}_token_id") is None:
            raise UsageError(
                f"the tokenizer {name_or_path!r} has no {name} token, which masked-LM training needs; "
                "use a tokenizer from train_unigram.py."
            )
    return tokenizer


def max_predictions(max_length, mlm_probability):
    """Predictions per sequence: the masking below never chooses more, so shapes stay static for XLA/TPU."""
    return max(1, math.ceil(max_length * mlm_probability))


def mask_tokens(input_ids, seed, mlm_probability, mask_token_id, special_ids, replacement_ids):
    """BERT masking in TF ops, stateless so the same seed always gives the same masks.

    In each sequence, round(`mlm_probability` x its non-special tokens) positions are chosen at random
    (special tokens, <unk> included, never are: predicting "unknown" teaches nothing). Of the chosen
    positions 80% become [MASK], 10% a random non-special token and 10% stay as they are. An exact count
    per sequence, as in the original BERT, means at most `max_predictions()` positions, which is what lets
    the model score those positions alone.

    Returns the masked ids [batch, length], the chosen positions [batch, predictions] and their labels
    [batch, predictions]: the original ids, or -100 in slots beyond the sequence's count (the loss and the
    metrics skip -100, and the position of such a slot is 0, a harmless index).
    """
    import tensorflow as tf

    choose_seed, action_seed, random_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    shape = tf.shape(input_ids)
    length = input_ids.shape[-1]
    predictions = max_predictions(length, mlm_probability)
    maskable = ~tf.reduce_any(tf.equal(input_ids[..., None], special_ids), axis=-1)
    count = tf.cast(tf.round(mlm_probability * tf.reduce_sum(tf.cast(maskable, tf.float32), axis=-1)), tf.int32)

    # A random ranking of the maskable positions; the first `count` of each row are chosen.
    scores = tf.where(maskable, tf.random.stateless_uniform(shape, choose_seed), -1.0)
    _, ranked = tf.math.top_k(scores, k=predictions)
    used = tf.range(predictions)[None, :] < count[:, None]
    positions = tf.where(used, ranked, 0)
    labels = tf.where(used, tf.gather(input_ids, positions, batch_dims=1), -100)
    chosen = tf.reduce_any(tf.one_hot(positions, length, on_value=True, off_value=False) & used[..., None], axis=1)

    action = tf.random.stateless_uniform(shape, action_seed)
    to_mask = chosen & (action < 0.8)
    to_random = chosen & (action >= 0.8) & (action < 0.9)
    random_index = tf.random.stateless_uniform(
        shape, random_seed, maxval=tf.shape(replacement_ids, out_type=tf.int32)[0], dtype=tf.int32
    )
    random_tokens = tf.gather(replacement_ids, random_index)
    masked_ids = tf.where(to_mask, mask_token_id, tf.where(to_random, random_tokens, input_ids))
    return masked_ids, positions, labels


def build_dataset(files, tokenizer, args, max_length, global_batch_size, training):
    """Shards -> shuffled, batched, parsed, masked batches of ({"input_ids", "masked_positions"}, labels).

    Every shape is static: [batch, max_length] ids, [batch, max_predictions] positions and labels.
    """
    import tensorflow as tf

    special = set(tokenizer.all_special_ids)
    special_ids = tf.constant(sorted(special), dtype=tf.int32)
    replacement_ids = tf.constant([i for i in range(len(tokenizer)) if i not in special], dtype=tf.int32)
    mask_token_id = tf.constant(tokenizer.mask_token_id, dtype=tf.int32)

    dataset = tf.data.Dataset.from_tensor_slices(files)
    if training:
        dataset = dataset.shuffle(len(files), seed=args.seed)  # a new file order every epoch
    dataset = dataset.interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(len(files), 8),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if training:
        dataset = dataset.shuffle(args.shuffle_buffer_size, seed=args.seed)
    # Batch first, then parse the whole batch in one op: far cheaper than parsing records one by one.
    dataset = dataset.batch(global_batch_size, drop_remainder=True)
    features = {FEATURE_NAME: tf.io.FixedLenFeature([max_length], tf.int64)}

    def parse(serialized):
        return tf.cast(tf.io.parse_example(serialized, features)[FEATURE_NAME], tf.int32)

    dataset = dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    # One stateless seed per batch. Training seeds change every epoch (fresh masks, as in RoBERTa);
    # evaluation seeds repeat, so every epoch is scored on identical masks and the figures compare.
    seeds = tf.data.Dataset.random(seed=args.seed, rerandomize_each_iteration=training).batch(2)
    dataset = tf.data.Dataset.zip((dataset, seeds))

    def mask(input_ids, seed):
        masked_ids, positions, labels = mask_tokens(
            input_ids, seed, args.mlm_probability, mask_token_id, special_ids, replacement_ids
        )
        return {FEATURE_NAME: masked_ids, "masked_positions": positions}, labels

    dataset = dataset.map(mask, num_parallel_calls=tf.data.AUTOTUNE)
    if training:
        dataset = dataset.repeat()  # fit() counts steps; the stream continues across epochs
    return dataset.prefetch(tf.data.AUTOTUNE)


# ---------------------------------------------------------------------------------------------------------
# Model


def parse_config_overrides(text):
    overrides = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, separator, value = item.partition("=")
        if not separator:
            raise UsageError(f"--config_overrides item {item!r} is not key=value; e.g. hidden_size=256.")
        try:
            overrides[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key.strip()] = value
    return overrides


def build_config(args, tokenizer, max_length):
    """The architecture config, with every token id taken from the tokenizer."""
    from transformers import AutoConfig, RobertaConfig

    source = args.pretrained_model_config
    if source is None:
        config = RobertaConfig()
    else:
        if os.path.isfile(source) and not source.endswith(".json"):
            raise UsageError(f"--pretrained_model_config {source} is a file but not JSON; pass a config.json.")
        if not os.path.exists(source) and source.startswith((".", "/")):
            raise UsageError(f"--pretrained_model_config {source} does not exist; pass a config.json or a Hub id.")
        try:
            config = AutoConfig.from_pretrained(source, trust_remote_code=args.trust_remote_code)
        except (OSError, ValueError) as error:
            raise UsageError(f"could not load --pretrained_model_config {source}: {first_line(error)}") from None
    for key, value in parse_config_overrides(args.config_overrides).items():
        if not hasattr(config, key):
            raise UsageError(f"--config_overrides names {key!r}, which {type(config).__name__} does not have.")
        setattr(config, key, value)

    config.vocab_size = len(tokenizer)
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    config.eos_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    config.cls_token_id = tokenizer.cls_token_id
    config.sep_token_id = tokenizer.sep_token_id
    config.mask_token_id = tokenizer.mask_token_id
    # RoBERTa numbers positions from pad_token_id + 1, so the table needs max_length + pad + 1 rows;
    # other models need max_length. The larger bound serves both.
    needed_positions = max_length + tokenizer.pad_token_id + 1
    if config.max_position_embeddings < needed_positions:
        config.max_position_embeddings = needed_positions
    if config.hidden_size % config.num_attention_heads:
        raise UsageError(
            f"hidden_size {config.hidden_size} is not divisible by num_attention_heads "
            f"{config.num_attention_heads}; fix --config_overrides."
        )
    return config


def masked_lm_trainer(masked_lm, mlm_head, mask_token_id):
    """Wrap a transformers TF masked LM in a Keras model whose fit() scores the masked positions only.

    With `mlm_head="sparse"` the encoder's hidden states are gathered at the masked positions first, so
    the LM head (dense, layer norm and the vocabulary projection, most of a small model's arithmetic) runs
    on ~15% of the positions. With `"full"` the model computes logits everywhere, as transformers does,
    and they are gathered afterwards: same loss, the reference cost. Either way the weights trained are
    the wrapped model's own, so `masked_lm.save_pretrained()` writes a standard checkpoint.
    """
    import tensorflow as tf
    import tf_keras

    class PositionAccuracy(tf_keras.metrics.Metric):
        """Top-1 accuracy over the positions a boolean `scored` tensor selects."""

        def __init__(self, name, **kwargs):
            super().__init__(name=name, **kwargs)
            self.correct = self.add_weight(name="correct", initializer="zeros", dtype=tf.float32)
            self.total = self.add_weight(name="total", initializer="zeros", dtype=tf.float32)

        def update_state(self, labels, predictions, scored):
            hits = scored & tf.equal(predictions, labels)
            self.correct.assign_add(tf.reduce_sum(tf.cast(hits, tf.float32)))
            self.total.assign_add(tf.reduce_sum(tf.cast(scored, tf.float32)))

        def result(self):
            return tf.math.divide_no_nan(self.correct, self.total)

    class TopTokenShare(tf_keras.metrics.Metric):
        """Share of the predictions taken by the single most predicted token: near 1 means collapse."""

        def __init__(self, vocab_size, name="top_token_share", **kwargs):
            super().__init__(name=name, **kwargs)
            self.vocab_size = vocab_size
            self.counts = self.add_weight(name="counts", shape=(vocab_size,), initializer="zeros", dtype=tf.float32)

        def update_state(self, predictions, scored):
            ones = tf.cast(scored, tf.float32)
            # unsorted_segment_sum rather than bincount: it compiles with XLA, so it runs on TPU too.
            self.counts.assign_add(tf.math.unsorted_segment_sum(ones, predictions, self.vocab_size))

        def result(self):
            return tf.math.divide_no_nan(tf.reduce_max(self.counts), tf.reduce_sum(self.counts))

        def reset_state(self):
            self.counts.assign(tf.zeros_like(self.counts))

    class MaskedLMTrainer(tf_keras.Model):
        def __init__(self):
            super().__init__()
            self.masked_lm = masked_lm
            self.loss_tracker = tf_keras.metrics.Mean(name="loss")
            # All labelled positions (80% [MASK], 10% random, 10% unchanged), and [MASK] inputs alone:
            # the second is the fill-mask task the model is used for afterwards.
            self.masked_accuracy = PositionAccuracy("masked_accuracy")
            self.mask_token_accuracy = PositionAccuracy("mask_token_accuracy")
            self.top_token_share = TopTokenShare(masked_lm.config.vocab_size)

        @property
        def metrics(self):  # what fit() resets every epoch and reports
            return [self.loss_tracker, self.masked_accuracy, self.mask_token_accuracy, self.top_token_share]

        def masked_logits(self, features, training):
            positions = features["masked_positions"]
            if mlm_head == "sparse":
                encoder = getattr(self.masked_lm, self.masked_lm.base_model_prefix)
                hidden_states = encoder(input_ids=features[FEATURE_NAME], training=training)[0]
                logits = self.masked_lm.get_lm_head()(tf.gather(hidden_states, positions, batch_dims=1))
            else:
                logits = self.masked_lm(input_ids=features[FEATURE_NAME], training=training).logits
                logits = tf.gather(logits, positions, batch_dims=1)
            # Under mixed bfloat16 the logits arrive in bf16; softmax and loss need float32's range.
            return tf.cast(logits, tf.float32)

        def loss_and_metrics(self, features, labels, training):
            logits = self.masked_logits(features, training)
            scored = tf.not_equal(labels, -100)
            per_position = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.maximum(labels, 0), logits)
            weights = tf.cast(scored, tf.float32)
            loss = tf.reduce_sum(per_position * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)

            predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
            inputs_at_positions = tf.gather(features[FEATURE_NAME], features["masked_positions"], batch_dims=1)
            was_mask = scored & tf.equal(inputs_at_positions, mask_token_id)
            self.loss_tracker.update_state(loss)
            self.masked_accuracy.update_state(labels, predictions, scored)
            self.mask_token_accuracy.update_state(labels, predictions, was_mask)
            self.top_token_share.update_state(predictions, was_mask)
            return loss

        def train_step(self, data):
            features, labels = data
            with tf.GradientTape() as tape:
                loss = self.loss_and_metrics(features, labels, training=True)
                # Each replica's gradients are summed across replicas, so each contributes its share.
                replica_loss = loss / tf.distribute.get_strategy().num_replicas_in_sync
            self.optimizer.minimize(replica_loss, self.trainable_variables, tape=tape)
            return {metric.name: metric.result() for metric in self.metrics}

        def test_step(self, data):
            features, labels = data
            self.loss_and_metrics(features, labels, training=False)
            return {metric.name: metric.result() for metric in self.metrics}

        def call(self, features, training=False):
            return self.masked_logits(features, training)

        def save_pretrained(self, *args, **kwargs):  # callbacks such as PushToHubCallback save self.model
            return self.masked_lm.save_pretrained(*args, **kwargs)

    return MaskedLMTrainer()


def build_model(config, args, total_steps, strategy, mask_token_id):
    """The masked LM and the trainer that fits it, with AdamW and its schedule, created in the strategy's scope."""
    from transformers import TFAutoModelForMaskedLM, create_optimizer

    with strategy.scope():
        masked_lm = TFAutoModelForMaskedLM.from_config(config)
        masked_lm(masked_lm.dummy_inputs)  # build the weights inside the strategy scope
        trainer = masked_lm_trainer(masked_lm, args.mlm_head, mask_token_id)
        optimizer, _ = create_optimizer(
            init_lr=args.learning_rate,
            num_train_steps=total_steps,
            num_warmup_steps=int(args.warmup_ratio * total_steps),
            weight_decay_rate=args.weight_decay_rate,
        )
        trainer.compile(
            optimizer=optimizer, jit_compile=args.jit_compile, steps_per_execution=args.steps_per_execution
        )
    return masked_lm, trainer


# ---------------------------------------------------------------------------------------------------------
# Training loop helpers


def training_callbacks(args, tokenizer):
    import tf_keras

    class EpochSummary(tf_keras.callbacks.Callback):
        """Adds val_perplexity and the wall time since training began to each epoch's logs."""

        start = None  # set once: fit_exact_steps may call fit() twice with the same callbacks

        def on_train_begin(self, logs=None):
            if self.start is None:
                self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            if logs is None:
                return
            if "val_loss" in logs:
                logs["val_perplexity"] = math.exp(min(logs["val_loss"], 50.0))  # capped: exp(50) is noise already
            logs["elapsed_minutes"] = (time.perf_counter() - self.start) / 60

    callbacks = [EpochSummary()]
    if args.hub_model_id:
        from transformers import PushToHubCallback

        # The callback works in a local git clone of the Hub repository; a gs:// output gets a local one.
        clone_dir = tempfile.mkdtemp(prefix="hub-") if args.output_dir.startswith("gs://") else args.output_dir
        try:
            callback = PushToHubCallback(output_dir=clone_dir, hub_model_id=args.hub_model_id, tokenizer=tokenizer)
        except Exception as error:  # network, credentials, git or git-lfs missing: all end here
            raise UsageError(
                f"could not set up pushing to --hub_model_id {args.hub_model_id}: {first_line(error)}; "
                "check the id, `huggingface-cli login` and that git-lfs is installed."
            ) from None
        callbacks.append(callback)
    return callbacks


def fit_exact_steps(model, train_dataset, steps_per_epoch, total_steps, **fit_kwargs):
    """Run exactly `total_steps` optimizer steps, evaluating after each pass over the train shards.

    fit() counts in epochs of equal length, and with --steps_per_execution > 1 a callback can only stop it
    between executions, so a --max_steps that ends mid-epoch would overshoot. Instead the whole passes run in
    one fit() call and the shorter last pass in a second one, which skips the batches already consumed so
    the data stream (order and masks) continues exactly where the first call stopped.
    """
    full_epochs, remainder = divmod(total_steps, steps_per_epoch)
    history = None
    if full_epochs:
        history = model.fit(train_dataset, epochs=full_epochs, steps_per_epoch=steps_per_epoch, **fit_kwargs)
    if remainder:
        earlier = history.history if history else {}
        history = model.fit(
            train_dataset.skip(full_epochs * steps_per_epoch),
            initial_epoch=full_epochs,
            epochs=full_epochs + 1,
            steps_per_epoch=remainder,
            **fit_kwargs,
        )
        for key, values in earlier.items():
            history.history[key] = values + history.history.get(key, [])
    return history


def check_output_dir(args):
    import tensorflow as tf

    finished = [name for name in FINISHED_RUN_FILES if tf.io.gfile.exists(f"{args.output_dir.rstrip('/')}/{name}")]
    if finished and not args.overwrite_output_dir:
        raise UsageError(
            f"--output_dir {args.output_dir} already holds a trained model ({', '.join(finished)}); "
            "pass --overwrite_output_dir to replace it, or choose another folder."
        )


def save(model, tokenizer, output_dir):
    """save_pretrained() writes through the local filesystem; for gs:// write locally, then copy up."""
    import tensorflow as tf

    if not output_dir.startswith("gs://"):
        model.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
        return
    with tempfile.TemporaryDirectory() as local:
        model.save_pretrained(local)
        tokenizer.save_pretrained(local)
        tf.io.gfile.makedirs(output_dir)
        for name in sorted(os.listdir(local)):
            tf.io.gfile.copy(os.path.join(local, name), f"{output_dir.rstrip('/')}/{name}", overwrite=True)


def main(args):
    check_args(args)
    strategy = build_strategy(args)  # first: logical CPU replicas must be set before TF starts its runtime
    import tf_keras

    check_output_dir(args)
    tokenizer = load_tokenizer(args.tokenizer, args.trust_remote_code)
    train_manifest = read_manifest(args.train_dataset, "--train_dataset")
    eval_manifest = read_manifest(args.eval_dataset, "--eval_dataset") if args.eval_dataset else None
    check_data(args, tokenizer, train_manifest, eval_manifest)
    max_length = train_manifest["max_length"]

    global_batch_size = args.per_replica_batch_size * strategy.num_replicas_in_sync
    steps_per_epoch = train_manifest["records"] // global_batch_size
    if steps_per_epoch == 0:
        raise UsageError(
            f"the global batch of {global_batch_size} sequences ({args.per_replica_batch_size} x "
            f"{strategy.num_replicas_in_sync} replicas) is larger than the {train_manifest['records']} train "
            "sequences; lower --per_replica_batch_size or add data."
        )
    eval_steps = eval_manifest["records"] // global_batch_size if eval_manifest else 0
    if eval_manifest and eval_steps == 0:
        raise UsageError(
            f"the global batch of {global_batch_size} sequences is larger than the {eval_manifest['records']} "
            "eval sequences; lower --per_replica_batch_size or add evaluation data."
        )
    total_steps = args.num_epochs * steps_per_epoch
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)

    tf_keras.utils.set_random_seed(args.seed)
    if args.bfloat16:
        tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    config = build_config(args, tokenizer, max_length)
    train_dataset = build_dataset(
        train_manifest["files"], tokenizer, args, max_length, global_batch_size, training=True
    )
    eval_dataset = (
        build_dataset(eval_manifest["files"], tokenizer, args, max_length, global_batch_size, training=False)
        if eval_manifest
        else None
    )
    callbacks = training_callbacks(args, tokenizer)  # before the model: a Hub problem should fail fast
    masked_lm, trainer = build_model(config, args, total_steps, strategy, tokenizer.mask_token_id)
    print(
        f"Training {type(masked_lm).__name__} ({masked_lm.count_params():,} parameters, {args.mlm_head} LM head) on "
        f"{strategy.num_replicas_in_sync} replica(s) of {type(strategy).__name__}: {total_steps} steps of "
        f"{global_batch_size} x {max_length} tokens; {train_manifest['records']} train sequences."
    )
    history = fit_exact_steps(
        trainer,
        train_dataset,
        steps_per_epoch,
        total_steps,
        validation_data=eval_dataset,
        validation_steps=eval_steps or None,
        callbacks=callbacks,
        verbose=1 if sys.stdout.isatty() else 2,  # a progress bar on a terminal, one line per epoch in a log
    )
    tokenizer.model_max_length = max_length  # the longest input the position table accepts
    save(masked_lm, tokenizer, args.output_dir)
    steps = int(trainer.optimizer.iterations.numpy())
    print(f"Saved the model and tokenizer to {args.output_dir} after {steps} steps.")
    return trainer, history


if __name__ == "__main__":
    arguments = parse_args()
    try:
        main(arguments)
    except UsageError as error:
        sys.exit(f"run_mlm.py: error: {error}")
