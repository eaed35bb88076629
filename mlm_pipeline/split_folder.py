"""A split's folder while prepare_tfrecord_shards.py writes it: whose files are whose, what a run may replace,
and clearing and writing it so that a run killed at any moment leaves nothing a later step could mistake.

The folder (local or gs://) holds shards, `<split>-<block>-<shard>-<records>.tfrecord`, and either the split's
manifest.json (finished) or the parts of workers still at work (see shard_workers). The rules:
- Every file belongs to one worker: a shard to the worker that packs its block (`worker_of`); a single run
  is worker 0 of 1. A worker clears only its own files, since the others may be writing theirs right then.
- Manifests and parts are written under a temporary name and renamed, so they appear whole or not at all;
  a run writes its manifest (a worker: its part) last, and removes it first.
- A finished split, or parts written with other settings, is replaced only with --overwrite_output_dir: the
  parts of two runs are refused rather than mixed. A worker whose part is written with the same settings
  has nothing to do (a scheduler's retry).
"""

import json
import os

from .contract import MANIFEST_NAME, PART_MANIFEST_PATTERN, part_name
from .errors import UsageError
from .storage import write_whole


def own_manifest_name(worker_index, num_workers):
    """The file a run writes last: manifest.json for a single run, its part for a worker."""
    return MANIFEST_NAME if num_workers == 1 else part_name(worker_index, num_workers)


def worker_of(file_name, num_workers):
    """The worker a shard or temporary shard file belongs to: the one that packs its block. A name without a
    block, as older versions of the script wrote them, belongs to worker 0."""
    temporary = file_name.startswith(".")
    fields = file_name.lstrip(".").split(".")[0].split("-")  # split, block, shard, and records unless temporary
    if len(fields) == (3 if temporary else 4) and all(field.isdigit() for field in fields[1:]):
        return int(fields[1]) % num_workers
    return 0


def read_parts(split_dir):
    """The parts in the split's folder: {file name: its content, or None when it is not a part the script
    wrote}."""
    import tensorflow as tf

    parts = {}
    for path in sorted(tf.io.gfile.glob(f"{split_dir}/{PART_MANIFEST_PATTERN}")):
        name = path.rsplit("/", 1)[-1]
        try:
            with tf.io.gfile.GFile(path) as file:
                part = json.load(file)
        except tf.errors.NotFoundError:  # just removed by a worker that replaces the parts of another run
            continue
        except ValueError:
            part = None
        is_part = isinstance(part, dict) and {"settings", "rows", "blocks"} <= part.keys()
        parts[name] = part if is_part and isinstance(part["settings"], dict) else None
    return parts


def first_difference(theirs, ours):
    """The first setting on which two runs differ, as (name, their value, our value), each value as JSON."""
    for key in [*ours, *(key for key in theirs if key not in ours)]:
        if theirs.get(key) != ours.get(key):
            return key, json.dumps(theirs.get(key)), json.dumps(ours.get(key))
    return None


def refusal_to_mix(split_dir, name, part, settings):
    """Why the part `name`, found in the split's folder, cannot sit beside this run's output, and what to do."""
    replace = "or pass --overwrite_output_dir to replace it"
    if part is None:
        return f"{split_dir}/{name} is not a part this script can read; remove it, {replace}."
    their_workers = part["settings"].get("num_workers")
    if their_workers != settings["num_workers"]:
        ours = "not a single run" if settings["num_workers"] == 1 else f"not {settings['num_workers']}"
        return (
            f"{split_dir} holds {name}, a part of a run with --num_workers {their_workers}, {ours}; finish that run "
            f"(its workers, then --merge --num_workers {their_workers}), {replace}."
        )
    key, theirs, ours = first_difference(part["settings"], settings)
    return (
        f"{split_dir} holds {name}, written with {key} {theirs} where this run has {ours}; give every worker the "
        f"same flags but --worker_index, {replace}."
    )


def check_split_dir(split_dir, settings, worker_index, overwrite):
    """Checked before any work. A finished split is replaced, and parts written with other settings are removed
    rather than mixed with this run's output, only with --overwrite_output_dir (`overwrite`). Returns, for a
    worker whose part is already written with these settings, that part (and says so); otherwise None."""
    import tensorflow as tf

    if tf.io.gfile.exists(f"{split_dir}/{MANIFEST_NAME}") and not overwrite:
        raise UsageError(
            f"{split_dir} already holds a finished {settings['split']} split; "
            "pass --overwrite_output_dir to replace it, or choose another --output_dir."
        )
    if overwrite:
        return None
    parts = read_parts(split_dir)
    for name, part in parts.items():
        if part is None or part["settings"] != settings:
            raise UsageError(refusal_to_mix(split_dir, name, part, settings))
    own_manifest = own_manifest_name(worker_index, settings["num_workers"])
    if own_manifest in parts:
        print(
            f"{split_dir}/{own_manifest} is written already, with these settings: nothing to do "
            "(--overwrite_output_dir writes it again)"
        )
    return parts.get(own_manifest)


def missing_folders(folder):
    """`folder` and those of its parents that do not exist yet, deepest first."""
    import tensorflow as tf

    missing = []
    while folder and not tf.io.gfile.exists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    return missing


def clear_split_dir(split_dir, settings, worker_index):
    """Create the split's folder and delete what this run replaces, and nothing else."""
    import tensorflow as tf

    tf.io.gfile.makedirs(split_dir)
    # The finished manifest first (there only with --overwrite_output_dir), so that a folder interrupted
    # halfway through this no longer claims to hold a finished split.
    remove_if_present(f"{split_dir}/{MANIFEST_NAME}")
    for name, part in read_parts(split_dir).items():
        if part is None or part["settings"] != settings:  # another run's: refused without --overwrite_output_dir
            remove_if_present(f"{split_dir}/{name}")
    remove_own_files(split_dir, worker_index, settings["num_workers"])


def remove_own_files(split_dir, worker_index, num_workers):
    """Delete this run's manifest (a worker's: its part) first, then the shards and temporary files of this
    worker's blocks. Other workers' files stay: they may be writing them at this very moment."""
    import tensorflow as tf

    own_manifest = own_manifest_name(worker_index, num_workers)
    for name in (own_manifest, f".{own_manifest}.tmp"):
        remove_if_present(f"{split_dir}/{name}")
    for pattern in ("*.tfrecord", ".*.tfrecord.tmp"):
        for path in tf.io.gfile.glob(f"{split_dir}/{pattern}"):
            if worker_of(path.rsplit("/", 1)[-1], num_workers) == worker_index:
                tf.io.gfile.remove(path)


def remove_run_output(split_dir, worker_index, num_workers, created_folders):
    """Undo a failed run: its own files, and (a single run only) the folders it created if they are empty.
    A later step must never pick up a half-written split or part."""
    import tensorflow as tf

    remove_own_files(split_dir, worker_index, num_workers)
    if num_workers > 1:  # other workers may be writing into the folder at this very moment
        return
    for folder in dict.fromkeys([split_dir, *created_folders]):
        if tf.io.gfile.exists(folder) and not tf.io.gfile.listdir(folder):
            tf.io.gfile.rmtree(folder)


def remove_if_present(path):
    """Remove a file that may be gone already: two workers may remove the same stale file at once."""
    import tensorflow as tf

    try:
        tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
        pass


def write_manifest(split_dir, name, manifest):
    """Write the manifest (or part) `name` under a temporary name first, so that it appears whole or not at all."""
    write_whole(f"{split_dir}/{name}", json.dumps(manifest, indent=2) + "\n")
