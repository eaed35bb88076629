#!/usr/bin/env python
"""Step 2 of 3: tokenize a text split, pack it into fixed-length sequences and write TFRecord shards.

Each non-blank line (a document or paragraph) is tokenized as `[CLS] tokens [SEP]`; the documents of the
whole split are concatenated in order and cut into `--max_length` sequences, so a sequence may start or end
in the middle of a document and the [SEP] marks where one document ends and the next begins. Nothing is
padded: only the split's final remainder, shorter than one sequence, is dropped. This is the packing that
RoBERTa calls FULL-SENTENCES.

    # local files
    python prepare_tfrecord_shards.py --train_file corpus/train.txt --split train \
        --tokenizer_name_or_path tokenizer --max_length 128 --output_dir shards
    python prepare_tfrecord_shards.py --validation_file corpus/validation.txt --split validation \
        --tokenizer_name_or_path tokenizer --max_length 128 --output_dir shards

    # WikiText-103 from the Hub, straight to a GCS bucket (as on a TPU VM)
    python prepare_tfrecord_shards.py --split train --tokenizer_name_or_path my-user/my-tokenizer \
        --max_length 128 --output_dir gs://my-bucket/wikitext-103

Output, for each split:
    <output_dir>/<split>/<split>-00000-<records>.tfrecord   one tf.train.Example per sequence,
                                                            feature "input_ids": int64 x max_length
    <output_dir>/<split>/manifest.json                      written last: a split without it is unfinished

Next step: run_mlm.py --train_dataset <output_dir>/train --eval_dataset <output_dir>/validation.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # keep TF's start-up chatter out of the log

LOCAL_FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
SPLITS = ("train", "validation", "test")
MANIFEST_NAME = "manifest.json"
FEATURE_NAME = "input_ids"
PACKING = (
    "each non-blank line is tokenized as [CLS] tokens [SEP]; lines are concatenated in order and cut into "
    "max_length sequences; only the final remainder is dropped"
)


class UsageError(Exception):
    """A mistake in the user's input: reported as one line, without a traceback."""


class OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv=None):
    parser = OneLineErrorParser(description="Tokenize a split and write it as TFRecord shards of packed sequences.")
    data = parser.add_argument_group("data (the Hub by default, or local files)")
    data.add_argument("--dataset_name", default="wikitext", help="Hub dataset id (default: wikitext).")
    data.add_argument("--dataset_config", default="wikitext-103-raw-v1", help="Hub dataset configuration.")
    data.add_argument("--train_file", help="Local train split: .txt, .json/.jsonl, .csv or .parquet.")
    data.add_argument("--validation_file", help="Local validation split, same formats.")
    data.add_argument("--test_file", help="Local test split, same formats.")
    data.add_argument("--split", default="train", help=f"Which split to write: one of {', '.join(SPLITS)}.")
    data.add_argument("--text_column", default="text", help="Column that holds the text (default: text).")
    data.add_argument("--limit", type=int, help="Use only the first LIMIT rows of the split.")
    data.add_argument(
        "--trust_remote_code", action="store_true", help="Allow code from Hub repositories (off by default)."
    )
    tokens = parser.add_argument_group("tokenization")
    tokens.add_argument("--tokenizer_name_or_path", required=True, help="Tokenizer folder or Hub id.")
    tokens.add_argument("--max_length", type=int, default=128, help="Tokens per sequence (default: 128).")
    tokens.add_argument("--batch_size", type=int, default=1000, help="Lines tokenized per call (default: 1000).")
    tokens.add_argument("--num_proc", type=int, default=1, help="Processes that tokenize in parallel.")
    output = parser.add_argument_group("output")
    output.add_argument("--output_dir", required=True, help="Local folder or gs://bucket/prefix.")
    output.add_argument("--shard_size", type=int, default=10000, help="Sequences per shard (default: 10000).")
    output.add_argument(
        "--overwrite_output_dir", action="store_true", help="Replace a split already written in --output_dir."
    )
    return parser.parse_args(argv)


def local_split_file(args):
    return {"train": args.train_file, "validation": args.validation_file, "test": args.test_file}[args.split]


def check_args(args):
    if args.split not in SPLITS:
        raise UsageError(f"--split {args.split!r} is not a split this script knows; use one of {', '.join(SPLITS)}.")
    for flag in ("max_length", "batch_size", "num_proc", "shard_size"):
        if getattr(args, flag) <= 0:
            raise UsageError(f"--{flag} {getattr(args, flag)} must be a positive number.")
    if args.max_length < 2:
        raise UsageError(f"--max_length {args.max_length} is too short for a sequence; use 128 or 512.")
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit {args.limit} must be a positive number of rows; leave it out to use them all.")
    local_files = [args.train_file, args.validation_file, args.test_file]
    if any(local_files):
        path = local_split_file(args)
        if path is None:
            raise UsageError(
                f"--split {args.split} was asked for, but only other local splits were given; "
                f"pass --{args.split}_file."
            )
        if not os.path.isfile(path):
            raise UsageError(f"--{args.split}_file {path} does not exist; pass a path to a text corpus file.")
        if os.path.getsize(path) == 0:
            raise UsageError(f"--{args.split}_file {path} is empty; pass a file with text in it.")
        extension = os.path.splitext(path)[1].lower()
        if extension not in LOCAL_FILE_BUILDERS:
            raise UsageError(
                f"--{args.split}_file {path} has extension {extension!r}; use one of {sorted(LOCAL_FILE_BUILDERS)}."
            )


def describe_source(args):
    return local_split_file(args) or f"{args.dataset_name}/{args.dataset_config}"


def load_split(args):
    """The requested split as a datasets.Dataset, from a local file or the Hub."""
    import datasets

    path = local_split_file(args)
    try:
        if path is not None:
            builder = LOCAL_FILE_BUILDERS[os.path.splitext(path)[1].lower()]
            dataset = datasets.load_dataset(builder, data_files={args.split: path}, split=args.split)
        else:  # only this split's files are fetched; an unknown split is named in the error
            extra = {"trust_remote_code": True} if args.trust_remote_code else {}
            dataset = datasets.load_dataset(args.dataset_name, args.dataset_config, split=args.split, **extra)
    except Exception as error:  # datasets raises many kinds; the user needs the source and the first reason
        raise UsageError(
            f"could not read {describe_source(args)}: {first_line(error)}; check the path or name."
        ) from None
    if args.text_column not in dataset.column_names:
        raise UsageError(
            f"--text_column {args.text_column!r} is not in the data, whose columns are {dataset.column_names}; "
            "pass the right --text_column."
        )
    if args.limit is not None:
        dataset = dataset.select(range(min(args.limit, len(dataset))))
    return dataset


def first_line(error):
    """A library error on one line: its own first line, and the root cause's when that differs."""

    def describe(exception):
        text = str(exception).strip()
        return f"{type(exception).__name__}: {text.splitlines()[0]}" if text else type(exception).__name__

    root = error
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__
    return describe(error) if root is error else f"{describe(error)} ({describe(root)})"


def load_tokenizer(name_or_path, trust_remote_code):
    from transformers import AutoTokenizer

    if not os.path.isdir(name_or_path) and (os.path.exists(name_or_path) or name_or_path.startswith((".", "/"))):
        raise UsageError(
            f"--tokenizer_name_or_path {name_or_path} is not a tokenizer folder; "
            "pass the --output_dir of train_unigram.py or a Hub id."
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise UsageError(f"could not load the tokenizer {name_or_path!r}: {first_line(error)}") from None
    if not tokenizer.is_fast:
        raise UsageError(f"the tokenizer {name_or_path!r} is not a fast tokenizer; train one with train_unigram.py.")
    return tokenizer


def tokenize(dataset, tokenizer, args):
    """One row of token ids per non-blank line, each wrapped as [CLS] ... [SEP] by the tokenizer."""

    def encode(batch):
        texts = [text for text in batch[args.text_column] if text is not None and text.strip()]
        if not texts:  # the tokenizer refuses an empty batch
            return {FEATURE_NAME: []}
        return {FEATURE_NAME: tokenizer(texts, add_special_tokens=True)["input_ids"]}

    return dataset.map(
        encode,
        batched=True,
        batch_size=args.batch_size,
        num_proc=args.num_proc if args.num_proc > 1 else None,
        remove_columns=dataset.column_names,
        desc=f"Tokenizing {args.split}",
    )


def token_stream(tokenized, batch_size):
    """The split's token ids as a sequence of flat int64 arrays, read straight from Arrow (no Python lists)."""
    import numpy as np

    for table in tokenized.with_format("arrow").iter(batch_size=batch_size):
        yield table.column(FEATURE_NAME).combine_chunks().flatten().to_numpy().astype(np.int64, copy=False)


class ShardWriter:
    """Writes `<split>-<index>-<records>.tfrecord` files; each appears under its final name only when complete."""

    def __init__(self, split_dir, split, shard_size):
        self.split_dir, self.split, self.shard_size = split_dir, split, shard_size
        self.shards = []
        self.writer = None
        self.records_in_shard = 0

    def _temporary_path(self):
        return f"{self.split_dir}/.{self.split}-{len(self.shards):05d}.tfrecord.tmp"

    def write(self, example_bytes):
        import tensorflow as tf

        if self.writer is None:
            self.writer = tf.io.TFRecordWriter(self._temporary_path())
        self.writer.write(example_bytes)
        self.records_in_shard += 1
        if self.records_in_shard == self.shard_size:
            self.finish_shard()

    def finish_shard(self):
        import tensorflow as tf

        if self.writer is None:
            return
        self.writer.close()
        name = f"{self.split}-{len(self.shards):05d}-{self.records_in_shard}.tfrecord"
        tf.io.gfile.rename(self._temporary_path(), f"{self.split_dir}/{name}", overwrite=True)
        self.shards.append({"file": name, "records": self.records_in_shard})
        self.writer, self.records_in_shard = None, 0


def serialize(sequence):
    import tensorflow as tf

    feature = tf.train.Feature(int64_list=tf.train.Int64List(value=sequence))
    return tf.train.Example(features=tf.train.Features(feature={FEATURE_NAME: feature})).SerializeToString()


def check_split_dir(args):
    """The split's folder; refuses to replace a finished split unless --overwrite_output_dir."""
    import tensorflow as tf

    split_dir = f"{args.output_dir.rstrip('/')}/{args.split}"
    if tf.io.gfile.exists(f"{split_dir}/{MANIFEST_NAME}") and not args.overwrite_output_dir:
        raise UsageError(
            f"{split_dir} already holds a finished {args.split} split; "
            "pass --overwrite_output_dir to replace it, or choose another --output_dir."
        )
    return split_dir


def clear_split_dir(split_dir):
    """Create the split's folder, emptied of any earlier or unfinished output of this script."""
    import tensorflow as tf

    tf.io.gfile.makedirs(split_dir)
    remove_outputs(split_dir)


def remove_outputs(split_dir):
    """Delete the shards, temporary files and manifest this script writes, and nothing else."""
    import tensorflow as tf

    for pattern in ("*.tfrecord", ".*.tfrecord.tmp", MANIFEST_NAME):
        for path in tf.io.gfile.glob(f"{split_dir}/{pattern}"):
            tf.io.gfile.remove(path)


def write_manifest(split_dir, manifest):
    import tensorflow as tf

    temporary = f"{split_dir}/.{MANIFEST_NAME}.tmp"
    with tf.io.gfile.GFile(temporary, "w") as file:
        file.write(json.dumps(manifest, indent=2) + "\n")
    tf.io.gfile.rename(temporary, f"{split_dir}/{MANIFEST_NAME}", overwrite=True)


def special_token_ids(tokenizer):
    names = ("cls", "sep", "pad", "unk", "mask", "bos", "eos")
    return {name: getattr(tokenizer, f"{name}_token_id") for name in names}


def write_shards(args, tokenizer, tokenized, split_dir):
    import numpy as np
    from tqdm.auto import tqdm

    writer = ShardWriter(split_dir, args.split, args.shard_size)
    progress = tqdm(desc=f"Writing {args.split} shards", unit=" sequences")
    carry = np.zeros((0,), dtype=np.int64)  # tokens waiting for the next batch to fill a sequence
    for flat in token_stream(tokenized, args.batch_size):
        stream = np.concatenate([carry, flat])
        full = len(stream) // args.max_length * args.max_length
        carry = stream[full:]
        for sequence in stream[:full].reshape(-1, args.max_length):
            writer.write(serialize(sequence))
        progress.update(full // args.max_length)
    writer.finish_shard()
    progress.close()
    dropped_tokens = len(carry)
    records = sum(shard["records"] for shard in writer.shards)
    if records == 0:
        raise UsageError(
            f"the {args.split} split ({describe_source(args)}) has {dropped_tokens} tokens, fewer than one "
            f"sequence of --max_length {args.max_length}; use more text or a smaller --max_length."
        )
    return {
        "split": args.split,
        "max_length": args.max_length,
        "records": records,
        "tokens": records * args.max_length,
        "dropped_tokens": int(dropped_tokens),
        "documents": len(tokenized),
        "packing": PACKING,
        "vocab_size": len(tokenizer),
        "special_token_ids": special_token_ids(tokenizer),
        "tokenizer": args.tokenizer_name_or_path,
        "source": describe_source(args),
        "features": {FEATURE_NAME: {"dtype": "int64", "shape": [args.max_length]}},
        "shards": writer.shards,
    }


def main(args):
    check_args(args)
    import tensorflow as tf

    split_dir = check_split_dir(args)  # before tokenizing: refusing after minutes of work helps nobody
    tokenizer = load_tokenizer(args.tokenizer_name_or_path, args.trust_remote_code)
    dataset = load_split(args)
    tokenized = tokenize(dataset, tokenizer, args)
    if len(tokenized) == 0:
        raise UsageError(
            f"the {args.split} split ({describe_source(args)}) has no non-blank text; "
            "check the input and --text_column."
        )
    clear_split_dir(split_dir)
    try:
        manifest = write_shards(args, tokenizer, tokenized, split_dir)
        write_manifest(split_dir, manifest)
    except BaseException:
        remove_outputs(split_dir)  # a later step must never pick up a half-written split
        if not tf.io.gfile.listdir(split_dir):
            tf.io.gfile.rmtree(split_dir)
        raise
    print(
        f"Wrote {manifest['records']} sequences of {args.max_length} tokens ({manifest['tokens']} tokens, "
        f"{manifest['dropped_tokens']} dropped) in {len(manifest['shards'])} shards to {split_dir}"
    )
    return manifest


if __name__ == "__main__":
    arguments = parse_args()
    try:
        main(arguments)
    except UsageError as error:
        sys.exit(f"prepare_tfrecord_shards.py: error: {error}")
