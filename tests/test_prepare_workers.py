"""Several workers write one split: N worker processes and one merge leave byte for byte what a single run leaves.

The fixture corpus is cut into blocks of ROWS_PER_BLOCK rows, so that it has several blocks and each of the two
workers several of them. The single run and most worker runs call main() in this process (the code a command
runs, without another TensorFlow start-up); the workers that must run at once, or be killed, are subprocesses.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import prepare_tfrecord_shards as prepare
from conftest import MAX_LENGTH, REPO, SHARD_SIZE, read_lines, subprocess_env

ROWS_PER_BLOCK = 50  # the fixture's 420 train rows make 9 blocks: 5 for worker 0, 4 for worker 1
BLOCK_SHARD_SIZE = 20  # a block fills a shard or two and ends with a shorter one
PARTS = ["manifest-00000-of-00002.json", "manifest-00001-of-00002.json"]

# Runs `python script args...` after arranging for SIGKILL at the `count`-th `event`: "shard renamed" (a shard
# gets its final name) or "part removed" (the merge removes a part after writing manifest.json).
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


rename, remove = tf.io.gfile.rename, tf.io.gfile.remove


def renaming(source, target, overwrite=False):
    rename(source, target, overwrite=overwrite)
    if target.endswith(".tfrecord"):
        reached("shard renamed")


def removing(path):
    remove(path)
    if os.path.basename(path).startswith("manifest-"):
        reached("part removed")


tf.io.gfile.rename, tf.io.gfile.remove = renaming, removing
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
"""


def prepare_argv(train_file, tokenizer_dir, output_dir, *extra, rows_per_block=ROWS_PER_BLOCK):
    return [
        "--train_file", train_file,
        "--tokenizer_name_or_path", tokenizer_dir,
        "--max_length", MAX_LENGTH,
        "--rows_per_block", rows_per_block,
        "--shard_size", BLOCK_SHARD_SIZE,
        "--output_dir", output_dir,
        *extra,
    ]  # fmt: skip


def worker_argv(corpus, tokenizer_dir, output_dir, index, *extra, **options):
    return prepare_argv(corpus["train"], tokenizer_dir, output_dir, "--num_workers", 2, "--worker_index", index,
                        *extra, **options)  # fmt: skip


def merge_argv(output_dir):
    return ["--merge", "--num_workers", 2, "--output_dir", output_dir]


def run_in_process(argv):
    return prepare.main(prepare.parse_args([str(arg) for arg in argv]))


def script_command(argv, event=None, count=None):
    """The command that runs the script with `argv`; with an event, one that SIGKILLs itself at it."""
    launcher = [sys.executable] if event is None else [sys.executable, "-c", KILLING_LAUNCHER, event, str(count)]
    return launcher + ["prepare_tfrecord_shards.py", *[str(arg) for arg in argv]]


def run_killed(argv, event, count):
    return subprocess.run(
        script_command(argv, event, count), cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def files_in(folder):
    """Every file under `folder`, hidden ones included, as {relative path: bytes}."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def modification_times(folder):
    return {path.name: path.stat().st_mtime_ns for path in folder.rglob("*") if path.is_file()}


def assert_same_files(actual, expected):
    assert sorted(actual) == sorted(expected)
    different = [name for name in expected if actual[name] != expected[name]]
    assert different == [], f"these files differ from a single run's: {different}"


@pytest.fixture(scope="module")
def single_run(corpus, tokenizer_dir, tmp_path_factory):
    """The folder and files of one run over the whole split, with the same flags as the workers."""
    output_dir = tmp_path_factory.mktemp("single")
    manifest = run_in_process(prepare_argv(corpus["train"], tokenizer_dir, output_dir))
    rows = len(read_lines(corpus["train"]))
    assert manifest["rows"] == rows and manifest["blocks"] == -(-rows // ROWS_PER_BLOCK) >= 6, "too few blocks"
    return output_dir, files_in(output_dir)


@pytest.fixture(scope="module")
def two_parts(corpus, tokenizer_dir, tmp_path_factory):
    """A folder where both workers have written their parts, not yet merged; tests copy it before changing it."""
    output_dir = tmp_path_factory.mktemp("two_parts")
    for index in (0, 1):
        run_in_process(worker_argv(corpus, tokenizer_dir, output_dir, index))
    return output_dir


def copy_of(folder, tmp_path):
    shutil.copytree(folder, tmp_path / "shards")
    return tmp_path / "shards"


def test_two_worker_processes_and_a_merge_write_what_a_single_run_writes(
    corpus, tokenizer_dir, single_run, tmp_path, read_manifest
):
    output_dir = tmp_path / "shards"
    # Both at once, as on two machines; --num_proc changes nothing in the output, so each may choose its own.
    workers = [
        subprocess.Popen(
            script_command(worker_argv(corpus, tokenizer_dir, output_dir, index, "--num_proc", index + 1)),
            cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for index in (0, 1)
    ]
    outputs = [worker.communicate(timeout=300) for worker in workers]
    for worker, (stdout, stderr) in zip(workers, outputs):
        assert worker.returncode == 0, stderr[-3000:]
        assert f"--merge --num_workers 2 --split train --output_dir {output_dir}" in stdout
    split_dir = output_dir / "train"
    parts = [json.loads((split_dir / name).read_text()) for name in PARTS]
    assert not (split_dir / "manifest.json").exists(), "only the merge may write the manifest"
    blocks = read_manifest(single_run[0] / "train")["blocks"]
    for index, part in enumerate(parts):
        assert [block["block"] for block in part["blocks"]] == list(range(index, blocks, 2))

    merged = run_in_process(merge_argv(output_dir))
    assert_same_files(files_in(output_dir), single_run[1])  # the parts are gone, the shards and manifest the same
    assert merged == read_manifest(output_dir / "train") == read_manifest(single_run[0] / "train")


def packed_by_blocks(tokenizer, path, rows_per_block, max_length):
    """The packing, computed independently: the rows cut into blocks, and each block's non-blank rows tokenized,
    concatenated and cut into max_length pieces, its remainder dropped. Returns the sequences and dropped tokens."""
    rows = read_lines(path)
    sequences, dropped = [], 0
    for start in range(0, len(rows), rows_per_block):
        block = [row for row in rows[start : start + rows_per_block] if row.strip()]
        stream = [token for row in block for token in tokenizer(row)["input_ids"]]
        full = len(stream) // max_length * max_length
        sequences += [stream[offset : offset + max_length] for offset in range(0, full, max_length)]
        dropped += len(stream) - full
    return sequences, dropped


def test_each_block_is_packed_on_its_own(single_run, tokenizer, corpus, read_manifest, read_records):
    output_dir, files = single_run
    manifest = read_manifest(output_dir / "train")
    expected, dropped = packed_by_blocks(tokenizer, corpus["train"], ROWS_PER_BLOCK, MAX_LENGTH)
    assert read_records([output_dir / "train" / shard["file"] for shard in manifest["shards"]]) == expected
    assert manifest["dropped_tokens"] == dropped and manifest["records"] == len(expected)
    assert dropped < manifest["blocks"] * MAX_LENGTH  # at most one remainder per block
    # Shards sort by block, then by place in the block: the order the manifest lists them in.
    names = [shard["file"] for shard in manifest["shards"]]
    assert names == sorted(name.removeprefix("train/") for name in files if name.endswith(".tfrecord"))


def test_a_worker_tokenizes_only_the_rows_of_its_blocks(corpus, tokenizer_dir, tmp_path, monkeypatch):
    tokenized = []
    encode = prepare.BatchEncoder.__call__

    def recording(self, texts):
        tokenized.extend(texts)
        return encode(self, texts)

    monkeypatch.setattr(prepare.BatchEncoder, "__call__", recording)
    run_in_process(worker_argv(corpus, tokenizer_dir, tmp_path, 1, "--num_proc", 1))
    rows = read_lines(corpus["train"])
    its_rows = [row for start in range(ROWS_PER_BLOCK, len(rows), 2 * ROWS_PER_BLOCK)
                for row in rows[start : start + ROWS_PER_BLOCK]]  # fmt: skip
    assert tokenized == [row for row in its_rows if row.strip()]


def test_a_downloaded_split_is_shared_out_by_index_ranges(corpus, tokenizer_dir, tmp_path):
    """A Hub split (here a local dataset folder, loaded by the same call) is read by row index, not as a stream."""
    dataset_dir = tmp_path / "dataset"
    dataset_dir.mkdir()
    shutil.copy(corpus["train"], dataset_dir / "train.txt")

    def argv(output_dir, *extra):
        flags = prepare_argv(corpus["train"], tokenizer_dir, output_dir, "--limit", 400, *extra)
        return flags[2:] + ["--dataset_name", dataset_dir, "--dataset_config", "default"]  # no --train_file

    single = run_in_process(argv(tmp_path / "single"))
    assert single["rows"] == 400 and single["blocks"] == 400 // ROWS_PER_BLOCK
    for index in (0, 1):
        run_in_process(argv(tmp_path / "workers", "--num_workers", 2, "--worker_index", index))
    run_in_process(merge_argv(tmp_path / "workers"))
    assert_same_files(files_in(tmp_path / "workers"), files_in(tmp_path / "single"))


def test_a_worker_killed_midway_reruns_its_own_part_only(corpus, tokenizer_dir, single_run, tmp_path):
    output_dir = tmp_path / "shards"
    split_dir = output_dir / "train"
    run_in_process(worker_argv(corpus, tokenizer_dir, output_dir, 0))
    worker_0 = files_in(split_dir)
    written_at = modification_times(split_dir)

    killed = run_killed(worker_argv(corpus, tokenizer_dir, output_dir, 1), "shard renamed", 3)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    left = set(os.listdir(split_dir)) - set(worker_0)
    assert len([name for name in left if name.endswith(".tfrecord")]) == 3 and PARTS[1] not in left
    with pytest.raises(prepare.UsageError, match="lacks the part of worker 1 of 2 .*--worker_index 1"):
        run_in_process(merge_argv(output_dir))
    assert not (split_dir / "manifest.json").exists()

    run_in_process(worker_argv(corpus, tokenizer_dir, output_dir, 1))  # the same command, no flag needed
    assert {name: files_in(split_dir)[name] for name in worker_0} == worker_0
    assert {name: modification_times(split_dir)[name] for name in worker_0} == written_at, "worker 0's files rewritten"
    run_in_process(merge_argv(output_dir))
    assert_same_files(files_in(output_dir), single_run[1])


def test_a_worker_run_again_leaves_its_part_alone(corpus, tokenizer_dir, two_parts, single_run, tmp_path, capsys):
    output_dir = copy_of(two_parts, tmp_path)
    before, written_at = files_in(output_dir), modification_times(output_dir)
    part = run_in_process(worker_argv(corpus, tokenizer_dir, output_dir, 0))  # a scheduler's retry, say
    assert "written already" in capsys.readouterr().out
    assert part == json.loads(before[f"train/{PARTS[0]}"])
    assert files_in(output_dir) == before and modification_times(output_dir) == written_at

    run_in_process(worker_argv(corpus, tokenizer_dir, output_dir, 0, "--overwrite_output_dir"))
    assert modification_times(output_dir) != written_at  # written again ...
    assert files_in(output_dir) == before  # ... to the same bytes
    run_in_process(merge_argv(output_dir))
    assert_same_files(files_in(output_dir), single_run[1])


def test_a_merge_killed_while_removing_the_parts_is_finished_by_the_next(two_parts, single_run, tmp_path):
    output_dir = copy_of(two_parts, tmp_path)
    killed = run_killed(merge_argv(output_dir), "part removed", 1)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert (output_dir / "train" / "manifest.json").exists() and (output_dir / "train" / PARTS[1]).exists()
    run_in_process(merge_argv(output_dir))
    assert_same_files(files_in(output_dir), single_run[1])
    with pytest.raises(prepare.UsageError, match="already holds a finished train split and no parts"):
        run_in_process(merge_argv(output_dir))
    assert_same_files(files_in(output_dir), single_run[1])


def test_a_split_smaller_than_one_block_gives_the_second_worker_nothing(
    corpus, tokenizer_dir, shards_dir, tmp_path, capsys
):
    """With the default --rows_per_block the fixture split is one block: worker 1 writes an empty part, and the
    merge gives what the single run of the shared fixture wrote, manifest included."""
    argv = [
        "--train_file", corpus["train"],
        "--tokenizer_name_or_path", tokenizer_dir,
        "--max_length", MAX_LENGTH,
        "--shard_size", SHARD_SIZE,
        "--output_dir", tmp_path,
        "--num_workers", 2,
    ]  # fmt: skip
    for index in (0, 1):
        run_in_process(argv + ["--worker_index", index])
    assert "Worker 1 got no block" in capsys.readouterr().out
    assert json.loads((tmp_path / "train" / PARTS[1]).read_text())["blocks"] == []
    run_in_process(merge_argv(tmp_path))
    assert_same_files(files_in(tmp_path / "train"), files_in(shards_dir / "train"))


# ---------------------------------------------------------------------------------------------------------
# Refusals: parts missing, damaged or of other settings. Each leaves the folder as it was.


def test_the_merge_refuses_while_a_part_is_missing(corpus, tokenizer_dir, tmp_path):
    run_in_process(worker_argv(corpus, tokenizer_dir, tmp_path, 1))
    before = files_in(tmp_path)
    with pytest.raises(prepare.UsageError, match=r"lacks the part of worker 0 of 2 \(manifest-00000-of-00002.json"):
        run_in_process(merge_argv(tmp_path))
    assert files_in(tmp_path) == before


def test_the_merge_refuses_a_missing_or_unlisted_shard(two_parts, tmp_path):
    output_dir = copy_of(two_parts, tmp_path)
    split_dir = output_dir / "train"
    shard = json.loads((split_dir / PARTS[1]).read_text())["blocks"][0]["shards"][0]["file"]
    moved = tmp_path / shard
    (split_dir / shard).rename(moved)
    before = files_in(output_dir)
    with pytest.raises(prepare.UsageError, match=f"{shard}, listed in the part of worker 1, is missing"):
        run_in_process(merge_argv(output_dir))
    assert files_in(output_dir) == before

    moved.rename(split_dir / shard)
    stray = "train-00009-00000-20.tfrecord"  # block 9 does not exist: no part lists it
    shutil.copy(split_dir / shard, split_dir / stray)
    before = files_in(output_dir)
    with pytest.raises(prepare.UsageError, match=f"holds {stray}, which no part lists; rerun worker 1"):
        run_in_process(merge_argv(output_dir))
    assert files_in(output_dir) == before


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda part: part["settings"].update(rows_per_block=60), "worker 1 wrote with rows_per_block 60"),
        (lambda part: part["settings"].update(tokenizer_fingerprint="0" * 16), "tokenizer_fingerprint"),
        (lambda part: part.update(rows=part["rows"] - 1), r"worker 1 read \d+ rows of .*, worker 0 read"),
        (lambda part: part["blocks"].pop(), "does not hold the blocks of worker 1"),
    ],
    ids=["rows_per_block", "tokenizer", "rows read", "a block missing"],
)
def test_the_merge_refuses_parts_that_disagree(two_parts, tmp_path, change, named):
    output_dir = copy_of(two_parts, tmp_path)
    path = output_dir / "train" / PARTS[1]
    part = json.loads(path.read_text())
    change(part)
    path.write_text(json.dumps(part))
    before = files_in(output_dir)
    with pytest.raises(prepare.UsageError, match=named) as refusal:
        run_in_process(merge_argv(output_dir))
    assert "rerun worker 1" in str(refusal.value)
    assert files_in(output_dir) == before


def test_a_run_refuses_to_mix_with_parts_of_other_settings(corpus, tokenizer_dir, two_parts, tmp_path):
    output_dir = copy_of(two_parts, tmp_path)
    before = files_in(output_dir)
    other_blocks = worker_argv(corpus, tokenizer_dir, output_dir, 1, rows_per_block=60)
    with pytest.raises(prepare.UsageError, match="written with rows_per_block 50 where this run has 60"):
        run_in_process(other_blocks)
    single = prepare_argv(corpus["train"], tokenizer_dir, output_dir)
    with pytest.raises(prepare.UsageError, match=r"--num_workers 2, not a single run; .*--merge --num_workers 2"):
        run_in_process(single)
    assert files_in(output_dir) == before

    # --overwrite_output_dir replaces the other run: each worker clears its own blocks' files, whatever their
    # settings, so no shard of the older blocks survives the merge.
    run_in_process(other_blocks + ["--overwrite_output_dir"])
    assert not (output_dir / "train" / PARTS[0]).exists()
    run_in_process(worker_argv(corpus, tokenizer_dir, output_dir, 0, rows_per_block=60))
    run_in_process(merge_argv(output_dir))
    run_in_process(prepare_argv(corpus["train"], tokenizer_dir, tmp_path / "single", rows_per_block=60))
    assert_same_files(files_in(output_dir), files_in(tmp_path / "single"))
