"""The file contract between the four scripts: what each writes, under which names, and how the
next reads it.

    train_unigram.py --output_dir TOK
        -> TOK/tokenizer.json, tokenizer_config.json, special_tokens_map.json
    prepare_tfrecord_shards.py ... --output_dir SHARDS --split S
        -> SHARDS/S/<S>-<block>-<shard>-<records>.tfrecord (one tf.train.Example per sequence:
           "input_ids", int64 x max_length), then SHARDS/S/manifest.json
    run_mlm.py --train_dataset SHARDS/train --tokenizer TOK --output_dir MODEL
        -> MODEL/config.json (last), tf_model.h5, tokenizer files, pytorch/, README.md,
           training_log.csv, training_curves.png, logs/, checkpoints/ (--average_last: the
           average of the last checkpoints, and last_step/ the last step's own model folder)

The writer (prepare) and the readers (run_mlm, the benchmarks, the tests) take every name and key
from here; run_mlm.py checks the shards it reads with shard_checks.py.
"""

import dataclasses
import hashlib
import json
import os
import tempfile
import weakref

from .errors import UsageError, first_line
from .storage import is_local_path, is_remote

# --- train_unigram.py -> the tokenizer folder
# train_unigram.py writes it last: a folder holding it holds a whole tokenizer
TOKENIZER_FILE = "tokenizer.json"
# either one makes a folder a tokenizer's
TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json")
# train_unigram.py's special tokens, at ids 0-4. <pad> must be id 1: transformers' TF RoBERTa
# numbers positions from a padding index fixed at 1 (PyTorch: pad_token_id), so any other id would
# shift positions between the two frameworks.
SPECIAL_TOKENS = ["[CLS]", "<pad>", "[SEP]", "<unk>", "[MASK]"]

# --- prepare_tfrecord_shards.py -> a split's folder of shards
SPLITS = ("train", "validation", "test")
FEATURE_NAME = "input_ids"  # the one feature of every record: int64 x max_length token ids
MANIFEST_NAME = "manifest.json"  # written last: a split's folder without it is unfinished
# What a reader needs; each entry of "shards" holds "file", "records" and "bytes".
MANIFEST_KEYS = ("max_length", "records", "vocab_size", "shards")


def vocabulary_fingerprint(tokenizer):
    """A short hash of what every id means (the vocabulary, added tokens included): shards and a
    tokenizer with the same fingerprint agree on every id, whatever folder or Hub id each came
    from. The manifest records the shards' ("vocabulary"); run_mlm.py checks its tokenizer's. Kept
    for each tokenizer object while its size stays, as a large vocabulary takes a while to hash."""
    size, fingerprint = _fingerprints.get(tokenizer, (None, None))
    if size != len(tokenizer):
        pieces = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
        fingerprint = hashlib.sha256(json.dumps(pieces, ensure_ascii=False).encode()).hexdigest()
        size, fingerprint = len(tokenizer), fingerprint[:16]
        _fingerprints[tokenizer] = size, fingerprint
    return fingerprint


_fingerprints = weakref.WeakKeyDictionary()  # tokenizer -> (its size, its fingerprint)


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
LAST_STEP_DIR = "last_step"  # --average_last: the last step's own model, beside the average

# --- a published model's weights, as transformers names them (run_mlm.py writes the first and, in
# PYTORCH_DIR, the third); a folder may hold any of them, preferred in this order
TF_WEIGHTS_NAME = "tf_model.h5"
TF_WEIGHTS_INDEX_NAME = "tf_model.h5.index.json"  # a TF checkpoint cut into several files
PYTORCH_WEIGHTS_NAME = "model.safetensors"
PYTORCH_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
TORCH_WEIGHTS_NAME = "pytorch_model.bin"  # PyTorch's pickled weights: read only through torch
WEIGHTS_NAMES = (
    TF_WEIGHTS_NAME,
    TF_WEIGHTS_INDEX_NAME,
    PYTORCH_WEIGHTS_NAME,
    PYTORCH_WEIGHTS_INDEX_NAME,
    TORCH_WEIGHTS_NAME,
)
# TF models whose embeddings assume the pad token is id 1 (their padding_idx is hard-coded).
FIXED_PADDING_INDEX_MODELS = (
    "roberta",
    "roberta-prelayernorm",
    "xlm-roberta",
    "camembert",
    "longformer",
    "mpnet",
)


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
    if is_remote(name_or_path):
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
    elif is_local_path(name_or_path):
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


@dataclasses.dataclass(frozen=True)
class NamedTokenizer:
    """A loaded tokenizer with the name the user gave it: `name`, the folder or Hub id (the card
    shows it, a remake command names it), and `flag`, the words a refusal names it by
    ("--tokenizer NAME", or "the tokenizer of --model_name_or_path NAME")."""

    tokenizer: object
    name: str
    flag: str


def copy_folder_files(folder, destination):
    """Copy the files of a gs:// folder (not its subfolders) into a local folder."""
    import tensorflow as tf

    for name in tf.io.gfile.listdir(folder):
        if not name.endswith("/"):
            tf.io.gfile.copy(
                f"{folder.rstrip('/')}/{name}", os.path.join(destination, name), overwrite=True
            )
