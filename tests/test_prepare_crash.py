"""prepare_tfrecord_shards.py killed (SIGKILL) at any moment, then run again with the same command,
leaves exactly the files an uninterrupted run writes.

The kills come from inside the real script: a small launcher wraps TensorFlow's file writes (the
shards' records, the manifest's bytes), renames and removes, and the process sends itself SIGKILL at
the Nth such call. So each moment is hit
exactly, every time, which polling the folder from outside cannot promise when a shard takes a
millisecond to write. One test also kills from outside, as a user would, when the first shard
appears.

The reruns call main() in this process with the same arguments: the code a rerun runs, without
paying for another TensorFlow start-up.
"""

import os
import re
import signal

import pytest
from helpers import (
    assert_same_files,
    files_in,
    kill_when,
    make_corpus_lines,
    prepare_flags,
    run_command,
    start_script,
    write_lines,
)

import prepare_tfrecord_shards as prepare

SHARD_SIZE = 50  # the fixture corpus gives 7 shards of this size or less
SHARD_NAME = re.compile(r"^train-\d{5}-\d{5}-\d+\.tfrecord$")

# Runs a script like `python script args...`, after arranging for SIGKILL at the `count`-th `event`.
KILLING_LAUNCHER = r"""
import os, runpy, signal, sys

import tensorflow as tf

event, count, script, *args = sys.argv[1:]
seen = 0


def reached(name):
    global seen
    if name == event:
        seen += 1
        if seen == int(count):
            os.kill(os.getpid(), signal.SIGKILL)


class GFile(tf.io.gfile.GFile):
    def write(self, data):  # the manifest is written in one call: stop halfway through it
        half = len(data) // 2
        super().write(data[:half])
        self.flush()
        reached("half a file written")
        super().write(data[half:])


class TFRecordWriter(tf.io.TFRecordWriter):
    def write(self, record):  # a shard is written a record at a time
        super().write(record)
        self.flush()
        reached("record written")


def kind(path):
    return "manifest" if path.endswith("manifest.json") else "shard"


rename, remove = tf.io.gfile.rename, tf.io.gfile.remove


def renaming(source, target, overwrite=False):
    reached(f"before {kind(target)} rename")
    rename(source, target, overwrite=overwrite)
    reached(f"after {kind(target)} rename")


def removing(path):
    remove(path)
    reached("file removed")


tf.io.gfile.GFile, tf.io.TFRecordWriter = GFile, TFRecordWriter
tf.io.gfile.rename, tf.io.gfile.remove = renaming, removing
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
"""


def prepare_argv(train_file, tokenizer_dir, output_dir, shard_size=SHARD_SIZE):
    return prepare_flags(
        {"train": train_file}, tokenizer_dir, "train", output_dir, shard_size=shard_size
    )


def run_in_process(argv):
    return prepare.main(prepare.parse_args([str(arg) for arg in argv]))


def run_killed(event, count, argv):
    """Run the script with `argv` in a subprocess that SIGKILLs itself at the `count`-th `event`."""
    launcher = ["-c", KILLING_LAUNCHER, event, count, "prepare_tfrecord_shards.py"]
    return run_command(*launcher, *argv, timeout=300)


@pytest.fixture(scope="module")
def uninterrupted(corpus, tokenizer_dir, tmp_path_factory):
    """The files of an uninterrupted run of the command the tests kill (the output folder is not
    recorded in them, so any folder will do)."""
    output_dir = tmp_path_factory.mktemp("uninterrupted")
    run_in_process(prepare_argv(corpus["train"], tokenizer_dir, output_dir))
    files = files_in(output_dir)
    assert sum(1 for name in files if name.endswith(".tfrecord")) > 3, (
        "the corpus should fill several shards"
    )
    return files


def test_the_same_command_writes_the_same_bytes(corpus, tokenizer_dir, uninterrupted, tmp_path):
    run_in_process(prepare_argv(corpus["train"], tokenizer_dir, tmp_path))
    assert_same_files(files_in(tmp_path), uninterrupted)


# (what the kill interrupts, event, count, the files it leaves in train/ given an
# uninterrupted run's names)
KILL_POINTS = [
    (
        "halfway through the first shard",
        "record written",
        SHARD_SIZE // 2,
        lambda done: {f".train-00000-00000-{SHARD_SIZE}.tfrecord.tmp"},
    ),
    (
        "second shard written, not yet renamed",
        "before shard rename",
        2,
        lambda done: {
            f"train-00000-00000-{SHARD_SIZE}.tfrecord",
            f".train-00000-00001-{SHARD_SIZE}.tfrecord.tmp",
        },
    ),
    (
        "halfway through the manifest",
        "half a file written",
        1,
        lambda done: {name for name in done if SHARD_NAME.match(name)} | {".manifest.json.tmp"},
    ),
    (
        "manifest written, not yet renamed",
        "before manifest rename",
        1,
        lambda done: {name for name in done if SHARD_NAME.match(name)} | {".manifest.json.tmp"},
    ),
    ("manifest in place", "after manifest rename", 1, lambda done: set(done)),
]


@pytest.mark.parametrize(
    "moment, event, count, leftovers", KILL_POINTS, ids=[point[0] for point in KILL_POINTS]
)
def test_killed_then_rerun_writes_what_an_uninterrupted_run_writes(
    corpus, tokenizer_dir, uninterrupted, tmp_path, moment, event, count, leftovers
):
    output_dir = tmp_path / "shards"
    argv = prepare_argv(corpus["train"], tokenizer_dir, output_dir)
    killed = run_killed(event, count, argv)
    assert killed.returncode == -signal.SIGKILL, f"not killed {moment}: {killed.stderr[-3000:]}"
    done = [name.removeprefix("train/") for name in uninterrupted]
    assert set(os.listdir(output_dir / "train")) == leftovers(done)

    finished = (output_dir / "train" / "manifest.json").exists()
    if finished:  # the run had completed: a finished split is replaced only on request
        with pytest.raises(prepare.UsageError, match="--overwrite_output_dir"):
            run_in_process(argv)
    else:
        # an unfinished split is no finished one: the same command, without
        # --overwrite_output_dir, completes it
        run_in_process(argv)
    assert_same_files(files_in(output_dir), uninterrupted)


def test_killed_while_clearing_an_older_split_leaves_no_manifest(
    corpus, tokenizer_dir, uninterrupted, tmp_path
):
    """--overwrite_output_dir removes the older split's files one by one; killed halfway, the folder
    must not still look finished, with a manifest that lists shards no longer there."""
    output_dir = tmp_path / "shards"
    run_in_process(prepare_argv(corpus["train"], tokenizer_dir, output_dir, shard_size=40))
    older = set(os.listdir(output_dir / "train"))
    argv = prepare_argv(corpus["train"], tokenizer_dir, output_dir) + ["--overwrite_output_dir"]
    killed = run_killed("file removed", 2, argv)  # the older manifest, then one of its shards
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    left = set(os.listdir(output_dir / "train"))
    assert "manifest.json" not in left
    assert left < older and len(left) == len(older) - 2

    run_in_process(argv[:-1])  # an unfinished split needs no --overwrite_output_dir
    assert_same_files(files_in(output_dir), uninterrupted)


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory):
    """Enough text for hundreds of tiny shards: writing them takes long enough to kill the script
    midway."""
    return write_lines(
        tmp_path_factory.mktemp("long_corpus") / "train.txt", make_corpus_lines(6000, seed=3)
    )


def test_killed_from_outside_then_rerun_needs_no_overwrite_flag(
    long_corpus, tokenizer_dir, tmp_path
):
    argv = prepare_argv(long_corpus, tokenizer_dir, tmp_path / "shards", shard_size=10)
    run_in_process(
        prepare_argv(long_corpus, tokenizer_dir, tmp_path / "uninterrupted", shard_size=10)
    )
    uninterrupted = files_in(tmp_path / "uninterrupted")
    shards = sum(1 for name in uninterrupted if name.endswith(".tfrecord"))
    assert shards > 300, "writing should take long enough to kill the script midway"

    split_dir = tmp_path / "shards" / "train"
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as stderr_file:
        script = start_script("prepare_tfrecord_shards.py", *argv, stderr=stderr_file)

    def a_shard():
        return split_dir.exists() and any(SHARD_NAME.match(name) for name in os.listdir(split_dir))

    kill_when(script, a_shard, "shard", pause=0.001, log=stderr)
    assert script.returncode == -signal.SIGKILL
    written = [name for name in os.listdir(split_dir) if SHARD_NAME.match(name)]
    assert 1 <= len(written) < shards and "manifest.json" not in os.listdir(split_dir)

    run_in_process(argv)  # no --overwrite_output_dir
    assert_same_files(files_in(tmp_path / "shards"), uninterrupted)
