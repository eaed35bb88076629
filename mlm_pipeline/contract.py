"""The file contract between the four scripts: what each writes, under which names, and how the
next reads it.

    train_unigram.py --output_dir TOK
        -> TOK/tokenizer.json, tokenizer_config.json, special_tokens_map.json
    prepare_tfrecord_shards.py ... --output_dir SHARDS --split S
        -> SHARDS/S/<S>-<block>-<shard>-<records>.tfrecord (one tf.train.Example per sequence:
           "input_ids", int64 x max_length), then SHARDS/S/manifest.json
    run_mlm.py --train_dataset SHARDS/train --tokenizer TOK --output_dir MODEL
        -> MODEL/config.json (last), tf_model.h5, tokenizer files, pytorch/, README.md,
           training_log.csv, training_curves.png, logs/, checkpoints/

The writer (prepare) and the readers (run_mlm, the benchmarks, the tests) take every name and key
from here.
"""

import contextlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

from .errors import UsageError, first_line, tf_error_text

# --- train_unigram.py -> the tokenizer folder
# train_unigram.py writes it last: a folder holding it holds a whole tokenizer
TOKENIZER_FILE = "tokenizer.json"
# either one makes a folder a tokenizer's
TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json")

# --- prepare_tfrecord_shards.py -> a split's folder of shards
SPLITS = ("train", "validation", "test")
FEATURE_NAME = "input_ids"  # the one feature of every record: int64 x max_length token ids
MANIFEST_NAME = "manifest.json"  # written last: a split's folder without it is unfinished
# What a reader needs; each entry of "shards" holds "file", "records" and "bytes".
MANIFEST_KEYS = ("max_length", "records", "vocab_size", "shards")


def split_dir(output_dir, split):
    """Where prepare writes a split, and what run_mlm's --train_dataset / --eval_dataset then
    name."""
    return f"{output_dir.rstrip('/')}/{split}"


def shard_name(split, block, shard, records):
    """Names sort as the manifest lists the shards: by block, then by place in the block."""
    return f"{split}-{block:05d}-{shard:05d}-{records}.tfrecord"


def record_features(max_length):
    """The parsing spec of a record, for tf.io.parse_example."""
    import tensorflow as tf

    return {FEATURE_NAME: tf.io.FixedLenFeature([max_length], tf.int64)}


# --- run_mlm.py -> the model folder
FINISHED_RUN_MARKER = "config.json"  # saved last: a folder holding it holds a finished model
CHECKPOINT_DIR = "checkpoints"  # checkpoints of an unfinished run, and the settings they belong to
RUN_SETTINGS_NAME = "run_settings.json"
TRAINING_LOG_NAME = "training_log.csv"  # one row per epoch, across resumed runs
TENSORBOARD_DIR = "logs"  # `tensorboard --logdir <output_dir>/logs`
CURVES_NAME = "training_curves.png"
MODEL_CARD_NAME = "README.md"
PYTORCH_DIR = "pytorch"  # the PyTorch copy: a folder of its own that transformers 5 loads
PYTORCH_WEIGHTS_NAME = "model.safetensors"


def load_tokenizer(
    name_or_path, flag, trust_remote_code=False, require_fast=False, require_mlm_tokens=False
):
    """A tokenizer folder (train_unigram.py's --output_dir) or Hub id, loaded with AutoTokenizer.

    A local path that is no tokenizer folder is refused before transformers is even imported.
    `require_fast`: the Rust backend, which prepare encodes with. `require_mlm_tokens`: a mask and a
    pad token, which masked-LM training needs.
    """
    hint = "pass the --output_dir of train_unigram.py or a Hub id"
    # transformers reads local folders and the Hub: copy it here first
    if name_or_path.startswith("gs://"):
        with tempfile.TemporaryDirectory() as local_copy:
            copy_folder_files(name_or_path, local_copy)
            return load_tokenizer(
                local_copy, flag, trust_remote_code, require_fast, require_mlm_tokens
            )
    if os.path.isdir(name_or_path):
        if not any(os.path.isfile(os.path.join(name_or_path, name)) for name in TOKENIZER_FILES):
            raise UsageError(
                f"{flag} {name_or_path} holds no {' or '.join(TOKENIZER_FILES)}, so it is not a "
                f"tokenizer folder; {hint}."
            )
    elif os.path.exists(name_or_path) or name_or_path.startswith((".", "/")):
        raise UsageError(f"{flag} {name_or_path} is not a tokenizer folder; {hint}.")
    from transformers import AutoTokenizer  # only now: a wrong path is answered without loading it

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except Exception as error:  # transformers raises many kinds for files it cannot make sense of
        raise UsageError(
            f"could not load the tokenizer {name_or_path!r}: {first_line(error)[:300]}"
        ) from None
    if require_fast and not tokenizer.is_fast:
        raise UsageError(
            f"the tokenizer {name_or_path!r} is not a fast tokenizer; train one with "
            "train_unigram.py."
        )
    for name in ("mask", "pad") if require_mlm_tokens else ():
        if getattr(tokenizer, f"{name}_token_id") is None:
            raise UsageError(
                f"the tokenizer {name_or_path!r} has no {name} token, which masked-LM training "
                "needs; use a tokenizer from train_unigram.py."
            )
    return tokenizer


def copy_folder_files(folder, destination):
    """Copy the files of a gs:// folder (not its subfolders) into a local folder."""
    import tensorflow as tf

    for name in tf.io.gfile.listdir(folder):
        if not name.endswith("/"):
            tf.io.gfile.copy(
                f"{folder.rstrip('/')}/{name}", os.path.join(destination, name), overwrite=True
            )


def read_manifest(folder, flag):
    """A finished split's manifest, with "files": the full path of every shard it lists, and
    "sizes": each one's size in bytes, looked up once (all at once), which also checks that each is
    present."""
    import tensorflow as tf

    folder = folder.rstrip("/")
    path = f"{folder}/{MANIFEST_NAME}"
    if not tf.io.gfile.isdir(folder):
        raise UsageError(
            f"{flag} {folder} does not exist; pass a folder written by prepare_tfrecord_shards.py."
        )
    if not tf.io.gfile.exists(path):
        splits = [s for s in SPLITS if tf.io.gfile.exists(f"{folder}/{s}/{MANIFEST_NAME}")]
        hint = f" (did you mean {folder}/{splits[0]}?)" if splits else ""
        todo = "run prepare_tfrecord_shards.py to completion first"
        raise UsageError(
            f"{flag} {folder} has no {MANIFEST_NAME}, so it is not a finished split{hint}; {todo}."
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
            f"{flag} {folder}: {MANIFEST_NAME} is not one prepare_tfrecord_shards.py wrote "
            f"(missing or bad: {', '.join(missing_keys)}); rerun it."
        )
    sizes = shard_sizes(files)
    missing = [path for path in files if sizes[path] is None]
    if not files or missing:
        raise UsageError(
            f"{flag} {folder}: no shards found ({len(missing)} of {len(files)} listed in "
            f"{MANIFEST_NAME} are missing); rerun prepare_tfrecord_shards.py."
        )
    manifest["files"], manifest["sizes"] = files, sizes
    return manifest


# Requests at once when every shard is looked at before training: on gs:// each is a round trip of
# tens of milliseconds, so 10,000 shards one after another would take minutes before the first step.
SHARD_LOOKUPS_AT_ONCE = 32


def shard_sizes(files):
    """{path: size in bytes, or None when missing}, one stat() per shard, SHARD_LOOKUPS_AT_ONCE at
    a time."""
    import tensorflow as tf

    def size(path):
        try:
            return tf.io.gfile.stat(path).length
        except tf.errors.NotFoundError:
            return None

    with ThreadPoolExecutor(max_workers=SHARD_LOOKUPS_AT_ONCE) as pool:
        return dict(zip(files, pool.map(size, files)))


def check_shards(manifest, flag, vocab_size):
    """Every shard is whole and holds this tokenizer's ids: checked cheaply, before anything is
    built, every shard at once (SHARD_LOOKUPS_AT_ONCE), reusing the sizes read_manifest looked up.

    A shard's size must be the one its manifest records (a truncated TFRecord file reads as a
    shorter one without any error, so nothing later would notice); manifests without sizes get their
    records counted instead. The first record of every shard must parse as max_length ids within the
    vocabulary.
    """
    features = record_features(manifest["max_length"])
    with ThreadPoolExecutor(max_workers=SHARD_LOOKUPS_AT_ONCE) as pool:
        checks = pool.map(
            lambda shard, path: check_shard(
                shard, path, manifest["sizes"][path], flag, features, vocab_size
            ),
            manifest["shards"],
            manifest["files"],
        )
        for _ in checks:  # in order: the first bad shard is the one reported
            pass


def check_shard(shard, path, size, flag, features, vocab_size):
    import tensorflow as tf

    try:
        if "bytes" in shard:
            found, expected, unit = size, shard["bytes"], "bytes"
        else:
            found = count_records(path)  # manifests from before sizes were recorded
            expected, unit = shard["records"], "records"
        if found != expected:
            raise UsageError(
                f"{flag}: shard {path} has {found} {unit} but {MANIFEST_NAME} lists {expected}, so "
                "it is truncated or was changed; rerun prepare_tfrecord_shards.py."
            )
        first = next(iter(tf.data.TFRecordDataset(path).take(1)))
        ids = tf.io.parse_single_example(first, features)[FEATURE_NAME].numpy()
    except (tf.errors.OpError, StopIteration) as error:
        raise UsageError(
            f"{flag}: shard {path} is unreadable "
            f"({tf_error_text(error) if str(error) else 'no records'}); rerun "
            "prepare_tfrecord_shards.py."
        ) from None
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise UsageError(
            f"{flag}: shard {path} holds token id "
            f"{ids.max() if ids.max() >= vocab_size else ids.min()}, outside the tokenizer's "
            f"{vocab_size} ids; pass the tokenizer the shards were made with."
        )


def count_records(path):
    """Read a shard to its end; a corrupt one raises tf.errors.DataLossError."""
    import tensorflow as tf

    return sum(1 for _ in tf.data.TFRecordDataset(path))


def find_corrupt_shard(files):
    """The first shard that cannot be read to its end: TF's corruption error does not name the
    file."""
    import tensorflow as tf

    for path in files:
        try:
            count_records(path)
        except tf.errors.DataLossError:
            return path
    return None


def read_training_manifests(
    train_dataset, eval_dataset, tokenizer, tokenizer_name, max_length=None
):
    """run_mlm.py's train and evaluation manifests (the second None without --eval_dataset), checked
    before anything expensive happens: each agrees with --max_length (when given) and the tokenizer,
    the two agree with each other, and every shard is whole."""
    manifests = {"--train_dataset": read_manifest(train_dataset, "--train_dataset")}
    if eval_dataset:
        manifests["--eval_dataset"] = read_manifest(eval_dataset, "--eval_dataset")
    for flag, manifest in manifests.items():
        if max_length is not None and manifest["max_length"] != max_length:
            raise UsageError(
                f"--max_length {max_length} differs from the {manifest['max_length']} of the "
                f"shards in {flag}; pass --max_length {manifest['max_length']} or rewrite the "
                "shards."
            )
        if manifest["vocab_size"] != len(tokenizer):
            raise UsageError(
                f"the shards in {flag} were written with a tokenizer of {manifest['vocab_size']} "
                f"tokens, but --tokenizer {tokenizer_name} has {len(tokenizer)}; pass the "
                "tokenizer the shards were made with."
            )
    train, evaluation = manifests["--train_dataset"], manifests.get("--eval_dataset")
    if evaluation is not None and evaluation["max_length"] != train["max_length"]:
        raise UsageError(
            f"train shards have max_length {train['max_length']} but eval shards have "
            f"{evaluation['max_length']}; write both with the same --max_length."
        )
    for flag, manifest in manifests.items():
        check_shards(manifest, flag, len(tokenizer))
    return train, evaluation


@contextlib.contextmanager
def corrupt_shards_named(manifests, output_dir):
    """Inside: a shard that training finds corrupt (TF's DataLossError, which does not say which)
    becomes a UsageError that names it and says what to do."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.DataLossError as error:
        files = [name for manifest in manifests if manifest for name in manifest["files"]]
        corrupt = find_corrupt_shard(files)
        raise UsageError(
            f"{corrupt or 'one of the shards'} is corrupt ({tf_error_text(error)}); rerun "
            "prepare_tfrecord_shards.py, then run_mlm.py's command again: it resumes from the "
            f"newest checkpoint in {output_dir}."
        ) from None
