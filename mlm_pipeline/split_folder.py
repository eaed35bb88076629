"""A split's folder as prepare_tfrecord_shards.py writes it: the rules that keep a run killed at any
moment from leaving anything a later step could mistake for a finished split (shard_writing.py
checks, clears and writes the folder by them, with TensorFlow's file system); and the manifest.json
that marks it finished, what the run wrote and how it was cut. Nothing here needs TensorFlow: Beam's
workers, which have none, name their staged blocks and build the manifest through here too.

The folder (local or gs://) holds shards, `<split>-<block>-<shard>-<records>.tfrecord`, and, once
the split is finished, manifest.json. While a Beam pipeline runs it also holds staged blocks,
`.staged-<file>-<block>.jsonl` (beam_pipeline.py: the rows of a file that cannot be entered midway,
read once and handed on a block at a time), which the pipeline removes just before it writes
manifest.json. The rules:
- manifest.json is written last, under a temporary name first and then renamed, so it appears whole
  or not at all; without it the folder is unfinished, and run_mlm.py refuses it.
- A finished split is replaced only with --overwrite_output_dir. An unfinished one (shards without a
  manifest: a run that was killed, or a Beam pipeline that failed) is leftovers: the next run clears
  it.
- A run clears the folder just before its first shard (the Beam launcher: before the pipeline
  starts), so that input refused before then leaves an existing split untouched. A run that fails
  removes what it wrote. Clearing removes staged blocks too: they are never shards, and a rerun
  stages afresh rather than trust what a killed run left.

Both ways of running the step, one process or an Apache Beam pipeline (beam_pipeline), build the
manifest here from what each block gave (packing.pack_block), in block order, so the same input and
flags give the same manifest byte for byte whichever wrote it and however a runner spread the blocks
over its workers.
"""

import hashlib
import json

from .contract import FEATURE_NAME, vocabulary_fingerprint
from .errors import UsageError

SHARD_FILES = ("*.tfrecord", ".*.tfrecord.tmp")  # shards, and shards still being written
STAGED_FILES = ".staged-*.jsonl"  # a Beam run's staged blocks (staged_path)
SPECIAL_TOKENS = ("cls", "sep", "pad", "unk", "mask", "bos", "eos")  # their ids go in the manifest


# --- the folder while it is written (shard_writing.py writes it)


def staged_path(split_dir, file_number, block_in_file):
    """Where a Beam run stages one block of one input file (the file's number in the split, the
    block's in the file, both from 0): hidden, and named so that no shard pattern matches it."""
    return f"{split_dir}/.staged-{file_number:05d}-{block_in_file:05d}.jsonl"


# --- its manifest


def tokenizer_fingerprint(backend):
    """A short hash of a tokenizers.Tokenizer's whole definition: two tokenizers with one
    fingerprint give the same ids. A Beam worker loads the tokenizer itself and checks it against
    the launcher's."""
    return hashlib.sha256(backend.to_str().encode()).hexdigest()[:16]


def split_settings(
    tokenizer, tokenizer_name, split, source, max_length, rows_per_block, shard_size
):
    """What the manifest says of the run beside what the blocks gave: the tokenizer's size, the
    fingerprint of its vocabulary and its special ids (run_mlm.py checks them), where the text came
    from, and how it was cut."""
    return {
        "split": split,
        "source": source,
        "tokenizer": tokenizer_name,
        "vocab_size": len(tokenizer),
        "vocabulary": vocabulary_fingerprint(tokenizer),
        "special_token_ids": {
            name: getattr(tokenizer, f"{name}_token_id") for name in SPECIAL_TOKENS
        },
        "max_length": max_length,
        "rows_per_block": rows_per_block,
        "shard_size": shard_size,
    }


def split_manifest(blocks, rows, settings, packing):
    """The split's manifest from every block's summary (in any order: they are sorted here) and the
    number of input rows read. `packing` says in words how the sequences were cut. Refuses a split
    with no sequence."""
    blocks = sorted(blocks, key=lambda block: block["block"])
    shards = [shard for block in blocks for shard in block["shards"]]
    documents = sum(block["documents"] for block in blocks)
    dropped_tokens = sum(block["dropped_tokens"] for block in blocks)
    records = sum(shard["records"] for shard in shards)
    check_enough_text(settings, documents, records, dropped_tokens, len(blocks))
    max_length = settings["max_length"]
    return {
        "split": settings["split"],
        "max_length": max_length,
        "records": records,
        "tokens": records * max_length,
        "dropped_tokens": dropped_tokens,
        "documents": documents,
        "rows": rows,
        "rows_per_block": settings["rows_per_block"],
        "blocks": len(blocks),
        "packing": packing,
        "vocab_size": settings["vocab_size"],
        "vocabulary": settings["vocabulary"],
        "special_token_ids": settings["special_token_ids"],
        "tokenizer": settings["tokenizer"],
        "source": settings["source"],
        "features": {FEATURE_NAME: {"dtype": "int64", "shape": [max_length]}},
        "shards": shards,
    }


def manifest_text(manifest):
    return json.dumps(manifest, indent=2) + "\n"


def check_enough_text(settings, documents, records, dropped_tokens, blocks):
    split, source, max_length = settings["split"], settings["source"], settings["max_length"]
    if documents == 0:
        raise UsageError(
            f"the {split} split ({source}) has no non-blank text; check the input and "
            "--text_column."
        )
    if records == 0 and blocks == 1:
        raise UsageError(
            f"the {split} split ({source}) has {dropped_tokens} tokens, fewer than one sequence of "
            f"--max_length {max_length}; use more text or a smaller --max_length."
        )
    if records == 0:
        raise UsageError(
            f"the {split} split ({source}) has {dropped_tokens} tokens, but none of its {blocks} "
            f"blocks of --rows_per_block {settings['rows_per_block']} rows fills one sequence of "
            f"--max_length {max_length}; use a larger --rows_per_block, more text or a smaller "
            "--max_length."
        )


def print_summary(manifest, split_dir):
    """The line a run prints at its end."""
    at_block_ends = f" at the ends of {manifest['blocks']} blocks" if manifest["blocks"] > 1 else ""
    print(
        f"Wrote {manifest['records']} sequences of {manifest['max_length']} tokens "
        f"({manifest['tokens']} tokens, {manifest['dropped_tokens']} dropped{at_block_ends}) in "
        f"{len(manifest['shards'])} shards to {split_dir}"
    )
