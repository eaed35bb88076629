"""run_mlm.py's checks of the shards it is given, before anything expensive happens: each split's
manifest read back, every shard looked up at once, each one whole and holding the tokenizer's ids;
and, during training, a shard found corrupt named in one line.

The names and keys these checks read are the file contract's (contract.py). The shards are read
through TensorFlow (tf.io.gfile on local disks and gs:// alike, tf.data for the records), so this
module is part of the engine, imported after the TPU's start-up.
"""

import contextlib
import json
import posixpath
from concurrent.futures import ThreadPoolExecutor

import tensorflow as tf

from .contract import (
    FEATURE_NAME,
    MANIFEST_KEYS,
    MANIFEST_NAME,
    SPLITS,
    record_features,
    vocabulary_fingerprint,
)
from .errors import UsageError, tf_error_text


def read_manifest(folder, flag):
    """A finished split's manifest, with "files": the full path of every shard it lists, and
    "sizes": each one's size in bytes, looked up once (all at once), which also checks that each is
    present."""
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
    return sum(1 for _ in tf.data.TFRecordDataset(path))


def find_corrupt_shard(files):
    """The first shard that cannot be read to its end: TF's corruption error does not name the
    file."""
    for path in files:
        try:
            count_records(path)
        except tf.errors.DataLossError:
            return path
    return None


def read_training_manifests(train_dataset, eval_dataset, named_tokenizer):
    """run_mlm.py's train and evaluation manifests (the second None without --eval_dataset), checked
    before anything expensive happens: each agrees with the tokenizer (a contract.NamedTokenizer:
    the tokenizer, its name and the words that name it as the user gave it), the two agree with
    each other, and every shard is whole."""
    tokenizer, tokenizer_name, tokenizer_flag = (
        named_tokenizer.tokenizer,
        named_tokenizer.name,
        named_tokenizer.flag,
    )
    manifests = {"--train_dataset": read_manifest(train_dataset, "--train_dataset")}
    if eval_dataset:
        manifests["--eval_dataset"] = read_manifest(eval_dataset, "--eval_dataset")
    fingerprint = vocabulary_fingerprint(tokenizer)
    for flag, manifest in manifests.items():
        check_vocabulary(manifest, flag, fingerprint, tokenizer_name, tokenizer_flag)
        check_vocabulary_size(manifest, flag, len(tokenizer), tokenizer_flag)
    train, evaluation = manifests["--train_dataset"], manifests.get("--eval_dataset")
    if evaluation is not None and evaluation["max_length"] != train["max_length"]:
        raise UsageError(
            f"train shards have max_length {train['max_length']} but eval shards have "
            f"{evaluation['max_length']}; write both with the same --max_length."
        )
    for flag, manifest in manifests.items():
        check_shards(manifest, flag, len(tokenizer))
    return train, evaluation


def check_vocabulary_size(manifest, flag, size, tokenizer_flag):
    """The shards of `flag` were written with a tokenizer of `size` tokens, the one
    `tokenizer_flag` names."""
    if manifest["vocab_size"] != size:
        raise UsageError(
            f"the shards in {flag} were written with a tokenizer of {manifest['vocab_size']} "
            f"tokens, but {tokenizer_flag} has {size}; pass the tokenizer the shards were made "
            "with."
        )


def read_evaluation_manifests(evaluation_sets, train_manifest, named_tokenizer):
    """The manifests of several --eval_dataset sets (mixture.EvaluationSet each), in order, each
    checked as read_training_manifests checks the one evaluation split: written with this
    tokenizer (a contract.NamedTokenizer), at the training shards' length (`train_manifest`'s),
    every shard whole. A set that does not match is refused in one line that names it."""
    tokenizer = named_tokenizer.tokenizer
    fingerprint = vocabulary_fingerprint(tokenizer)
    flags = [f"--eval_dataset ({evaluation_set.name})" for evaluation_set in evaluation_sets]
    manifests = []
    for evaluation_set, flag in zip(evaluation_sets, flags):
        manifest = read_manifest(evaluation_set.path, flag)
        check_vocabulary(manifest, flag, fingerprint, named_tokenizer.name, named_tokenizer.flag)
        check_vocabulary_size(manifest, flag, len(tokenizer), named_tokenizer.flag)
        if manifest["max_length"] != train_manifest["max_length"]:
            raise UsageError(
                f"{flag} {evaluation_set.path} has shards of max_length "
                f"{manifest['max_length']} but the train shards have "
                f"{train_manifest['max_length']}; rewrite it with prepare_tfrecord_shards.py "
                f"--max_length {train_manifest['max_length']}, as the training shards."
            )
        manifests.append(manifest)
    for flag, manifest in zip(flags, manifests):  # the costly look at every shard, last
        check_shards(manifest, flag, len(tokenizer))
    return manifests


def read_mixture_manifests(folders, first, named_tokenizer):
    """The manifests of a mixture's --train_dataset `folders`, `first` (the first folder's, read and
    checked by read_training_manifests) and each later one's, checked as the first was and against
    it: the folders must share the tokenizer and the sequence length, since every batch mixes their
    sequences. A folder that does not is refused in one line that names it and both values."""
    tokenizer = named_tokenizer.tokenizer
    fingerprint = vocabulary_fingerprint(tokenizer)
    manifests = [first]
    for folder in folders[1:]:
        manifest = read_manifest(folder, "--train_dataset")
        check_same_shards(manifest, folder, first, folders[0])
        flag = f"--train_dataset {folder.rstrip('/')}"
        check_vocabulary(manifest, flag, fingerprint, named_tokenizer.name, named_tokenizer.flag)
        manifests.append(manifest)
    for folder, manifest in zip(folders[1:], manifests[1:]):
        check_shards(manifest, f"--train_dataset {folder.rstrip('/')}", len(tokenizer))
    return manifests


def check_same_shards(manifest, folder, first, first_folder):
    """A later --train_dataset folder of a mixture holds sequences of the first folder's length,
    written with its tokenizer (the same vocabulary; by its size alone in manifests from before
    the vocabulary was recorded)."""
    folder, first_folder = folder.rstrip("/"), first_folder.rstrip("/")
    if manifest["max_length"] != first["max_length"]:
        raise UsageError(
            f"--train_dataset {folder} holds sequences of {manifest['max_length']} tokens, but "
            f"{first_folder} of {first['max_length']}; a mixture's folders must share the length: "
            f"rewrite one with prepare_tfrecord_shards.py --max_length {first['max_length']}."
        )
    fingerprints = manifest.get("vocabulary"), first.get("vocabulary")
    differ = None not in fingerprints and fingerprints[0] != fingerprints[1]
    if differ or manifest["vocab_size"] != first["vocab_size"]:
        raise UsageError(
            f"--train_dataset {folder} was written with the tokenizer "
            f"{tokenizer_words(manifest)}, but {first_folder} with {tokenizer_words(first)}; a "
            "mixture's folders must share the tokenizer: rewrite one with "
            "prepare_tfrecord_shards.py --tokenizer_name_or_path and the other's tokenizer."
        )


def tokenizer_words(manifest):
    """A manifest's tokenizer as its manifest records it: name, vocabulary and size."""
    vocabulary = manifest.get("vocabulary")
    fingerprint = f"vocabulary {vocabulary}, " if vocabulary else ""
    return f"{manifest.get('tokenizer')!r} ({fingerprint}{manifest['vocab_size']:,} tokens)"


def check_max_length(max_length, train_manifest, train_dataset):
    """The shards' sequence length; run_mlm.py's --max_length, when given, must be it (the shards
    are read as sequences of the length their manifest records)."""
    shards_length = train_manifest["max_length"]
    if max_length is not None and max_length != shards_length:
        raise UsageError(
            f"--max_length {max_length} does not match the shards of --train_dataset "
            f"{train_dataset}, written with --max_length {shards_length}: pass --max_length "
            f"{shards_length} (or leave it out), or rewrite the shards with "
            f"prepare_tfrecord_shards.py --max_length {max_length}."
        )
    return shards_length


def check_vocabulary(manifest, flag, fingerprint, tokenizer_name, tokenizer_flag):
    """Shards whose ids mean other tokens than the tokenizer's (made with another tokenizer of the
    same size, say bert-base-uncased's for roberta-base) are refused with the command that remakes
    them. `fingerprint`: the tokenizer's (contract.vocabulary_fingerprint). Manifests from before
    the fingerprint was recorded are checked by size alone."""
    if manifest.get("vocabulary") in (None, fingerprint):
        return
    # the --output_dir the shards were written to: the folder of their split's folder
    folder = posixpath.dirname(posixpath.dirname(manifest["files"][0])) or "."
    split, source = manifest.get("split", "train"), manifest.get("source") or "YOUR_TEXT"
    raise UsageError(
        f"the shards in {flag} were made with the tokenizer {manifest.get('tokenizer')!r}, whose "
        f"vocabulary is not that of {tokenizer_flag}, so their ids would mean other "
        f"tokens; remake them with it: python prepare_tfrecord_shards.py --{split}_file "
        f"'{source}' --split {split} --tokenizer_name_or_path {tokenizer_name} --max_length "
        f"{manifest['max_length']} --output_dir {folder} --overwrite_output_dir"
    )


@contextlib.contextmanager
def corrupt_shards_named(manifests, output_dir):
    """Inside: a shard that training finds corrupt (TF's DataLossError, which does not say which)
    becomes a UsageError that names it and says what to do."""
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
