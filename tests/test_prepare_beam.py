"""prepare_tfrecord_shards.py --runner: the Apache Beam pipeline writes, byte for byte, what one
process writes, whatever the block layout and the runner's settings; a pipeline that fails midway
leaves no manifest.json, and the same command run again replaces its leftovers. Also the reading
both paths share: the lines of a text file and where each block of them starts.

Beam runs here on the DirectRunner (mlm_pipeline.beam_launcher runs it on Beam's FnApiRunner, in
this process or in worker processes), offline. The single process writes its records with
TensorFlow (tf.train.Example, tf.io.TFRecordWriter) and Beam's workers with the package's own
encoder, so the same bytes from both hold that encoder to TensorFlow's.

Apache Beam is an install of its own (requirements-beam.txt): without it, --runner is refused in one
line that says how to install it, and the step runs as before without --runner.
"""

import gzip
import io
import json
import os
import random

import pytest
from helpers import (
    assert_same_files,
    files_in,
    kill_when,
    make_corpus_lines,
    prepare_flags,
    run_command,
    start_script,
    subprocess_env,
)
from refusals import refused

import prepare_tfrecord_shards as prepare
from mlm_pipeline import beam_pipeline, corpus

IN_PROCESS = ["--runner", "DirectRunner"]
TWO_PROCESSES = [
    *IN_PROCESS,
    "--direct_num_workers",
    2,
    "--direct_running_mode",
    "multi_processing",
]


def run_in_process(argv):
    return prepare.main(prepare.parse_args([str(arg) for arg in argv]))


def prepare_argv(pattern, tokenizer_dir, output_dir, *extra):
    source = {"train": pattern}
    return [*prepare_flags(source, tokenizer_dir, "train", output_dir, shard_size=30), *extra]


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory):
    """Three text files with every kind of line break, blank lines and a last line without a break;
    named so that their sorted order (the order they are read in) is not the order they were written
    in."""
    folder = tmp_path_factory.mktemp("beam_corpus")
    breaks = ["\n", "\n", "\r\n", "\r"]
    rng = random.Random(4)
    for name, count, seed in (
        ("part-b.txt", 260, 11),
        ("part-a.txt", 170, 12),
        ("part-c.txt", 90, 13),
    ):
        lines = make_corpus_lines(count, seed)
        text = "".join(line + rng.choice(breaks) for line in lines[:-1]) + lines[-1]
        (folder / name).write_bytes(text.encode("utf-8"))
    return folder


# (what the layout shows, --rows_per_block and the other flags)
LAYOUTS = {
    "many blocks per file": ["--rows_per_block", 37],
    "one block per file, --limit inside the second file": ["--rows_per_block", 400, "--limit", 300],
}


@pytest.fixture(scope="module")
def single_process(corpus_files, tokenizer_dir, tmp_path_factory):
    """What one process writes for each layout."""
    written = {}
    for layout, extra in LAYOUTS.items():
        output_dir = tmp_path_factory.mktemp("single")
        run_in_process(prepare_argv(corpus_files / "part-*.txt", tokenizer_dir, output_dir, *extra))
        written[layout] = files_in(output_dir)
    return written


@pytest.mark.parametrize(
    "runner", [IN_PROCESS, TWO_PROCESSES], ids=["in process", "two worker processes"]
)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_beam_writes_what_the_single_process_writes(
    corpus_files, tokenizer_dir, single_process, read_manifest, tmp_path, layout, runner
):
    run_in_process(
        prepare_argv(
            corpus_files / "part-*.txt", tokenizer_dir, tmp_path, *LAYOUTS[layout], *runner
        )
    )
    assert_same_files(files_in(tmp_path), single_process[layout])
    manifest = read_manifest(tmp_path / "train")
    assert manifest["blocks"] >= 2 and len(manifest["shards"]) > 3, (
        "the layout should spread over workers"
    )


def test_blocks_start_afresh_in_each_file(corpus_files, single_process):
    """One block per file at --rows_per_block 400: a block never spans two files, and --limit cut
    the second."""
    manifest = single_process["one block per file, --limit inside the second file"][
        "train/manifest.json"
    ]
    assert b'"blocks": 2,' in manifest and b'"rows": 300,' in manifest


def test_a_failed_pipeline_leaves_no_manifest_and_the_rerun_replaces_its_leftovers(
    corpus_files, tokenizer_dir, single_process, tmp_path
):
    """A line that is not UTF-8 deep in the second file fails one block on a worker: the launcher
    reports it in one line, and leaves neither manifest.json nor shards. Mended, the same command
    writes the whole split."""
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for path in corpus_files.iterdir():
        (inputs / path.name).write_bytes(path.read_bytes())
    good = (inputs / "part-b.txt").read_bytes()
    at = good.index(b"the", len(good) // 2)  # in a late block of the file
    (inputs / "part-b.txt").write_bytes(good[:at] + b"th\xe9" + good[at + 3 :])
    lines_before = good[:at].replace(b"\r\n", b"\n").replace(b"\r", b"\n").count(b"\n")
    output_dir = tmp_path / "shards"
    argv = prepare_argv(
        inputs / "part-*.txt", tokenizer_dir, output_dir, *LAYOUTS["many blocks per file"]
    )
    with pytest.raises(
        prepare.UsageError, match=rf"part-b.txt: it is not UTF-8 text \(line {lines_before + 1} "
    ):
        run_in_process(argv + TWO_PROCESSES)
    assert not output_dir.exists() or not any(output_dir.rglob("*")), (
        "a failed pipeline must leave nothing"
    )

    (inputs / "part-b.txt").write_bytes(good)
    (output_dir / "train").mkdir(parents=True, exist_ok=True)
    (output_dir / "train" / "train-00003-00000-30.tfrecord").write_bytes(
        b"a leftover of a failed pipeline"
    )
    # no --overwrite_output_dir: a folder without manifest.json is unfinished
    run_in_process(argv + IN_PROCESS)
    written = files_in(output_dir)
    written["train/manifest.json"] = written["train/manifest.json"].replace(
        bytes(inputs), bytes(corpus_files)
    )
    # the same but for the input's folder
    assert_same_files(written, single_process["many blocks per file"])


def test_a_pipeline_killed_midway_then_rerun_writes_the_whole_split(tokenizer_dir, tmp_path):
    """Killed (SIGKILL) once its first shards are in place, the pipeline leaves shards without
    manifest.json, which the next step refuses, and the staged blocks of its compressed input; the
    same command, run again, writes what an uninterrupted run writes, and nothing else."""
    long_corpus = tmp_path / "long.jsonl.gz"
    lines = make_corpus_lines(3000, seed=21)
    long_corpus.write_bytes(
        gzip.compress("".join(json.dumps({"text": line}) + "\n" for line in lines).encode())
    )
    extra = ["--rows_per_block", 100, "--shard_size", 5]
    uninterrupted = tmp_path / "uninterrupted"
    run_in_process(prepare_argv(long_corpus, tokenizer_dir, uninterrupted, *extra))
    output_dir = tmp_path / "shards"
    argv = [
        str(arg)
        for arg in prepare_argv(long_corpus, tokenizer_dir, output_dir, *extra, *TWO_PROCESSES)
    ]
    # killed while Beam's workers run, it keeps their held-back log in its temporary folder
    env = {**subprocess_env(), "TMPDIR": str(tmp_path)}
    script = start_script("prepare_tfrecord_shards.py", *argv, env=env, start_new_session=True)
    split_dir = output_dir / "train"

    def three_shards():
        return (
            split_dir.exists()
            and sum(name.endswith(".tfrecord") for name in os.listdir(split_dir)) >= 3
        )

    # the launcher and its worker processes
    kill_when(script, three_shards, "three shards", pause=0.005, group=True)
    left = os.listdir(split_dir)
    assert "manifest.json" not in left and len(left) < len(os.listdir(uninterrupted / "train"))
    # every block is staged before the first is packed, and they stay until the manifest
    assert sum(name.startswith(".staged-") for name in left) == 30, left

    # any runner writes the same files
    run_in_process([*argv[: argv.index("--runner")], *IN_PROCESS])
    assert_same_files(files_in(output_dir), files_in(uninterrupted))


# --------------------------------------------------------------------------------------------------
# The reading both paths share


def python_text_mode_lines(data):
    return [
        line.rstrip("\n")
        for line in io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline=None)
    ]


def lines_block_by_block(data, rows_per_block):
    starts, lines = beam_pipeline.block_starts(io.BytesIO(data), rows_per_block)
    ends = [*starts[1:], None]
    blocks = [
        list(corpus.text_lines(beam_pipeline.ByteRange(io.BytesIO(data), s, e), "text"))
        for s, e in zip(starts, ends)
    ]
    return blocks, lines


def test_text_lines_and_blocks_split_as_python_text_mode_does(monkeypatch):
    """Random bytes of line breaks (\\n, \\r\\n, lone \\r) and text, read in reads of 1 to 7 bytes
    (so a \\r\\n is cut between two reads): the lines are Python's, and the blocks hold them all,
    `rows_per_block` at a time."""
    rng = random.Random(0)
    pieces = [b"\n", b"\r", b"\r\n", b"a", b"b", b" ", "é".encode(), b""]
    for _ in range(1500):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randrange(30)))
        monkeypatch.setattr(corpus, "READ_BYTES", rng.randrange(1, 8))
        expected = python_text_mode_lines(data)
        assert list(corpus.text_lines(io.BytesIO(data), "text")) == expected, data
        rows_per_block = rng.randrange(1, 5)
        blocks, lines = lines_block_by_block(data, rows_per_block)
        assert (
            lines == len(expected) and [line for block in blocks for line in block] == expected
        ), data
        assert all(len(block) == rows_per_block for block in blocks[:-1]), data


def test_an_undecodable_line_is_named_by_its_number():
    data = "first\r\nsecond\rthird\n".encode() + b"caf\xe9\n"
    with pytest.raises(
        corpus.UsageError, match=r"could not read part.txt: .*line 4 holds the byte 0xe9"
    ):
        list(corpus.text_lines(io.BytesIO(data), "part.txt"))


def test_a_glob_is_read_in_sorted_order_and_refused_when_it_matches_nothing(corpus_files):
    files = corpus.input_files(str(corpus_files / "part-*.txt"), "--train_file")
    assert [os.path.basename(path) for path in files] == ["part-a.txt", "part-b.txt", "part-c.txt"]
    with pytest.raises(corpus.UsageError, match=r"--train_file .*/nothing-\*\.txt matches no file"):
        corpus.input_files(str(corpus_files / "nothing-*.txt"), "--train_file")


# --------------------------------------------------------------------------------------------------
# Pipeline options refused before anything runs (in this process: Dataflow's runner takes
# seconds to import, once; tests/test_prepare_shards.py shows, with an unknown runner,
# that the refusal is one line)

DATAFLOW = [
    "--runner",
    "DataflowRunner",
    "--temp_location",
    "gs://bucket/tmp",
    "--setup_file",
    "./setup.py",
]
REMOTE = ["--train_file", "gs://bucket/corpus/*.txt", "--output_dir", "gs://bucket/shards"]
OPTION_CASES = [
    pytest.param(
        ["--runner", "DirectRunner", "--direct_num_wokers", 2],
        ["--direct_num_wokers", "spelling"],
        id="an option neither ours nor Beam's",
    ),
    pytest.param(
        ["--runner", "DataflowRunner", "--project", "p", "--region", "r"],
        ["DataflowRunner", "--temp_location gs://"],
        id="Dataflow without --temp_location",
    ),
    pytest.param(
        DATAFLOW, ["--output_dir {out}", "Cloud Storage"], id="Dataflow writing to this machine"
    ),
    pytest.param(
        [*DATAFLOW, *REMOTE],
        ["--tokenizer_name_or_path {tokenizer}", "gs://", "Hub"],
        id="Dataflow with a local tokenizer",
    ),
    pytest.param(
        [*DATAFLOW[:4], *REMOTE, "--tokenizer_name_or_path", "my-user/tok"],
        ["--setup_file ./setup.py"],
        id="Dataflow without this package",
    ),
    pytest.param(
        ["--runner", "DirectRunner", "--train_file", None],
        ["--runner", "wikitext/wikitext-103-raw-v1", "--train_file"],
        id="--runner with a Hub dataset",
    ),
]


@pytest.mark.parametrize("flags, needles", OPTION_CASES)
def test_pipeline_options_are_checked_before_any_work(
    corpus_files, tokenizer_dir, tmp_path, flags, needles
):
    argv = prepare_argv(corpus_files / "part-a.txt", tokenizer_dir, tmp_path / "out")
    for index in range(0, len(flags), 2):  # later flags replace earlier ones; None drops the flag
        flag, value = flags[index], flags[index + 1]
        if flag in argv:
            del argv[argv.index(flag) : argv.index(flag) + 2]
        if value is not None:
            argv += [flag, value]
    with pytest.raises(prepare.UsageError) as refusal:
        run_in_process(argv)
    for needle in needles:
        assert needle.format(out=tmp_path / "out", tokenizer=tokenizer_dir) in str(refusal.value)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------------
# Without Apache Beam installed (requirements.txt alone)

# Stands in for a missing package: found first on PYTHONPATH, it fails as a missing one does.
NO_BEAM = """raise ModuleNotFoundError("No module named 'apache_beam'", name="apache_beam")\n"""


def test_without_beam_runner_is_one_line_naming_the_install_and_the_step_runs_without_it(
    corpus_files, tokenizer_dir, single_process, tmp_path
):
    shadow = tmp_path / "no_beam"
    shadow.mkdir()
    (shadow / "apache_beam.py").write_text(NO_BEAM)
    env = {**subprocess_env(), "PYTHONPATH": str(shadow)}

    def run_without_beam(script, *args):
        return run_command(script, *args, env=env)

    extra = LAYOUTS["many blocks per file"]
    argv = prepare_argv(corpus_files / "part-*.txt", tokenizer_dir, tmp_path / "out", *extra)
    line = refused(
        run_without_beam,
        "prepare_tfrecord_shards.py",
        [*argv, *IN_PROCESS],
        tmp_path / "out",
        "--runner",
        "Apache Beam is not installed",
        "`pip install -r requirements-beam.txt`",
    )
    assert line.endswith("or run without --runner.")

    written = run_without_beam("prepare_tfrecord_shards.py", *argv)
    assert written.returncode == 0, written.stderr[-3000:]
    assert_same_files(files_in(tmp_path / "out"), single_process["many blocks per file"])
