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

Metrics: `loss` is the model's masked-LM cross-entropy (over masked positions only), `masked_accuracy`
counts masked positions only, and each epoch ends with `val_loss` and `val_perplexity = exp(val_loss)`.
"""

import argparse
import json
import math
import os
import sys
import tempfile

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


def mask_tokens(input_ids, seed, mlm_probability, mask_token_id, special_ids, replacement_ids):
    """BERT masking in TF ops, stateless so the same seed always gives the same masks.

    Of the non-special tokens (everything but the tokenizer's special tokens, <unk> included: predicting
    "unknown" teaches nothing), `mlm_probability` are chosen; of those 80% become [MASK], 10% a random
    non-special token and 10% stay as they are. Labels are the original ids at chosen positions, -100
    elsewhere (the transformers loss skips -100).
    """
    import tensorflow as tf

    choose_seed, action_seed, random_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    shape = tf.shape(input_ids)
    is_special = tf.reduce_any(tf.equal(input_ids[..., None], special_ids), axis=-1)
    chosen = (tf.random.stateless_uniform(shape, choose_seed) < mlm_probability) & ~is_special
    action = tf.random.stateless_uniform(shape, action_seed)
    to_mask = chosen & (action < 0.8)
    to_random = chosen & (action >= 0.8) & (action < 0.9)
    random_index = tf.random.stateless_uniform(
        shape, random_seed, maxval=tf.shape(replacement_ids, out_type=tf.int32)[0], dtype=tf.int32
    )
    random_tokens = tf.gather(replacement_ids, random_index)
    masked_ids = tf.where(to_mask, mask_token_id, tf.where(to_random, random_tokens, input_ids))
    labels = tf.where(chosen, input_ids, -100)
    return masked_ids, labels


def build_dataset(files, tokenizer, args, max_length, global_batch_size, training):
    """Shards -> shuffled, batched, parsed and masked batches of ({"input_ids"}, labels), static shapes."""
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
        masked_ids, labels = mask_tokens(
            input_ids, seed, args.mlm_probability, mask_token_id, special_ids, replacement_ids
        )
        return {FEATURE_NAME: masked_ids}, labels

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


def masked_accuracy_metric():
    import tensorflow as tf
    import tf_keras

    class MaskedAccuracy(tf_keras.metrics.Metric):
        """Top-1 accuracy over the masked positions only (labels != -100)."""

        def __init__(self, name="masked_accuracy", **kwargs):
            super().__init__(name=name, **kwargs)
            self.correct = self.add_weight(name="correct", initializer="zeros", dtype=tf.float32)
            self.total = self.add_weight(name="total", initializer="zeros", dtype=tf.float32)

        def update_state(self, y_true, y_pred, sample_weight=None):
            y_true = tf.cast(y_true, tf.int32)
            scored = tf.not_equal(y_true, -100)
            predictions = tf.argmax(y_pred, axis=-1, output_type=tf.int32)
            hits = tf.logical_and(scored, tf.equal(predictions, y_true))
            self.correct.assign_add(tf.reduce_sum(tf.cast(hits, tf.float32)))
            self.total.assign_add(tf.reduce_sum(tf.cast(scored, tf.float32)))

        def result(self):
            return tf.math.divide_no_nan(self.correct, self.total)

        def reset_state(self):
            self.correct.assign(0.0)
            self.total.assign(0.0)

    return MaskedAccuracy()


def build_model(config, args, total_steps, strategy):
    from transformers import TFAutoModelForMaskedLM, create_optimizer

    with strategy.scope():
        model = TFAutoModelForMaskedLM.from_config(config)
        model(model.dummy_inputs)  # build the weights inside the strategy scope
        optimizer, _ = create_optimizer(
            init_lr=args.learning_rate,
            num_train_steps=total_steps,
            num_warmup_steps=int(args.warmup_ratio * total_steps),
            weight_decay_rate=args.weight_decay_rate,
        )
        # No loss: the model computes its own masked-LM loss from the labels.
        model.compile(
            optimizer=optimizer,
            metrics=[masked_accuracy_metric()],
            jit_compile=args.jit_compile,
            steps_per_execution=args.steps_per_execution,
        )
    return model


# ---------------------------------------------------------------------------------------------------------
# Training loop helpers


def training_callbacks(args, tokenizer):
    import tf_keras

    class Perplexity(tf_keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if logs is not None and "val_loss" in logs:
                logs["val_perplexity"] = math.exp(min(logs["val_loss"], 50.0))  # capped: exp(50) is noise already

    callbacks = [Perplexity()]
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
    model = build_model(config, args, total_steps, strategy)
    print(
        f"Training {type(model).__name__} ({model.count_params():,} parameters) on "
        f"{strategy.num_replicas_in_sync} replica(s) of {type(strategy).__name__}: {total_steps} steps of "
        f"{global_batch_size} x {max_length} tokens; {train_manifest['records']} train sequences."
    )
    history = fit_exact_steps(
        model,
        train_dataset,
        steps_per_epoch,
        total_steps,
        validation_data=eval_dataset,
        validation_steps=eval_steps or None,
        callbacks=callbacks,
        verbose=1 if sys.stdout.isatty() else 2,  # a progress bar on a terminal, one line per epoch in a log
    )
    tokenizer.model_max_length = max_length  # the longest input the position table accepts
    save(model, tokenizer, args.output_dir)
    print(f"Saved the model and tokenizer to {args.output_dir} after {int(model.optimizer.iterations.numpy())} steps.")
    return model, history


if __name__ == "__main__":
    arguments = parse_args()
    try:
        main(arguments)
    except UsageError as error:
        sys.exit(f"run_mlm.py: error: {error}")
