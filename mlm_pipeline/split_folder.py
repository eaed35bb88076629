"""A split's folder while prepare_tfrecord_shards.py writes it: checked, cleared and written so that
a run killed at any moment leaves nothing a later step could mistake for a finished split.

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
"""

import os

from .contract import MANIFEST_NAME
from .errors import UsageError
from .storage import temporary_path, write_whole

SHARD_FILES = ("*.tfrecord", ".*.tfrecord.tmp")  # shards, and shards still being written
STAGED_FILES = ".staged-*.jsonl"  # a Beam run's staged blocks (staged_path)


def staged_path(split_dir, file_number, block_in_file):
    """Where a Beam run stages one block of one input file (the file's number in the split, the
    block's in the file, both from 0): hidden, and named so that no shard pattern matches it."""
    return f"{split_dir}/.staged-{file_number:05d}-{block_in_file:05d}.jsonl"


def check_split_dir(split_dir, split, overwrite):
    """Checked before any work: refusing after minutes of tokenizing would waste them."""
    import tensorflow as tf

    if tf.io.gfile.exists(f"{split_dir}/{MANIFEST_NAME}") and not overwrite:
        raise UsageError(
            f"{split_dir} already holds a finished {split} split; "
            "pass --overwrite_output_dir to replace it, or choose another --output_dir."
        )


def missing_folders(folder):
    """`folder` and those of its parents that do not exist yet, deepest first."""
    import tensorflow as tf

    missing = []
    while folder and not tf.io.gfile.exists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    return missing


def clear_split_dir(split_dir):
    """Create the split's folder and delete what this run replaces: a finished split's manifest
    first (so that a folder interrupted halfway through no longer claims to hold one), a
    half-written one, then every shard."""
    import tensorflow as tf

    tf.io.gfile.makedirs(split_dir)
    remove_if_present(f"{split_dir}/{MANIFEST_NAME}")
    # a run killed while writing it
    remove_if_present(temporary_path(f"{split_dir}/{MANIFEST_NAME}"))
    remove_shards(split_dir)


def remove_shards(split_dir):
    """Remove the shards, whole or half-written, and a Beam run's staged blocks."""
    import tensorflow as tf

    for pattern in (*SHARD_FILES, STAGED_FILES):
        for path in tf.io.gfile.glob(f"{split_dir}/{pattern}"):
            remove_if_present(path)


def remove_run_output(split_dir, created_folders):
    """Undo a failed run: its shards, and the folders it created if they are empty."""
    import tensorflow as tf

    remove_shards(split_dir)
    for folder in dict.fromkeys([split_dir, *created_folders]):
        if tf.io.gfile.exists(folder) and not tf.io.gfile.listdir(folder):
            tf.io.gfile.rmtree(folder)


def remove_if_present(path):
    """Remove a file that may be gone already."""
    import tensorflow as tf

    try:
        tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
        pass


def write_manifest(split_dir, text):
    """Write manifest.json under a temporary name first, so that it appears whole or not at all."""
    write_whole(f"{split_dir}/{MANIFEST_NAME}", text)
