"""Corpora as people keep them: the same text as plain text, JSON lines, CSV and Parquet files, the
text formats also gzip-, zstd- or bzip2-compressed, gives steps 1 and 2 the same tokenizer and the
same shards, byte for byte, in one process and as an Apache Beam pipeline, from local files and from
a Cloud Storage emulator (tests/gcs_emulator.py). Beam reads a file that cannot be entered midway
once, however many blocks it has. Bad files (cut short, a line that is not JSON, no
text column, a glob of several formats, a Parquet file that is not one) are refused in one line that
names the file, and leave nothing behind.
"""

import bz2
import collections
import csv
import gzip
import io
import json
import os

import pytest
import zstandard
from gcs_emulator import GcsEmulator
from helpers import (
    MAX_LENGTH,
    VOCAB_SIZE,
    assert_same_files,
    files_in,
    flags,
    make_corpus_lines,
    run_command,
    subprocess_env,
)
from refusals import refused, script_in_process

import prepare_tfrecord_shards as prepare
import train_unigram
from mlm_pipeline import beam_pipeline

BUCKET = "corpus-formats"
# The session's corpus (conftest.py: 420 lines of seed 0, the tokenizer_dir fixture's), cut into
# three files of different lengths, so that blocks of ROWS_PER_BLOCK rows end inside files and a
# block never spans two; LIMIT ends the split inside the last file.
PART_ROWS = (150, 170, 100)
ROWS_PER_BLOCK = 37
LIMIT = 400
PARQUET_ROW_GROUP = 40  # blocks start inside row groups, and past whole ones


def json_lines(lines):
    """JSON lines as a tokenizer corpus usually comes: other fields beside the text, a blank row of
    the plain text as a null text, and a blank line at the end, which is no row."""
    rows = [{"id": index, "text": line or None, "url": "x"} for index, line in enumerate(lines)]
    return ("".join(json.dumps(row) + "\n" for row in rows) + "\n").encode()


def json_array(lines):
    """One JSON array of objects over several lines, as a .json file may hold instead of JSON
    lines."""
    rows = [{"id": index, "text": line or None} for index, line in enumerate(lines)]
    return json.dumps(rows, indent=1).encode()


def csv_bytes(lines):
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(["id", "text"])
    writer.writerows(enumerate(lines))
    return text.getvalue().encode()


def zstd_frames(data):
    """Two zstd frames, as parallel compressors write them: both must be read."""
    half = data.index(b"\n", len(data) // 2) + 1
    compressor = zstandard.ZstdCompressor()
    return compressor.compress(data[:half]) + compressor.compress(data[half:])


def parquet_bytes(lines, text_column="text"):
    import pyarrow
    import pyarrow.parquet

    table = pyarrow.table({"id": list(range(len(lines))), text_column: lines})
    sink = io.BytesIO()
    pyarrow.parquet.write_table(table, sink, row_group_size=PARQUET_ROW_GROUP)
    return sink.getvalue()


def plain_text(lines):
    return "".join(line + "\n" for line in lines).encode()


# extension: the bytes of a file of that kind holding `lines`
WRITERS = {
    "txt": plain_text,
    "txt.gz": lambda lines: gzip.compress(plain_text(lines)),
    "jsonl": json_lines,
    "jsonl.gz": lambda lines: gzip.compress(json_lines(lines)),
    "jsonl.zst": lambda lines: zstd_frames(json_lines(lines)),
    "json.zst": lambda lines: zstd_frames(json_lines(lines)),
    "json": json_array,
    "csv": csv_bytes,
    "csv.gz": lambda lines: gzip.compress(csv_bytes(lines)),
    "csv.bz2": lambda lines: bz2.compress(csv_bytes(lines)),
    "parquet": parquet_bytes,
}
# What Beam's workers may enter midway: plain text at a byte offset, Parquet at a row group. Every
# other file has several blocks here (ROWS_PER_BLOCK), and must still be read once.
SEEKABLE = ("txt", "parquet")


def parts(lines):
    first, second, _ = PART_ROWS
    return [lines[:first], lines[first : first + second], lines[first + second :]]


@pytest.fixture(scope="module")
def corpus_parts(corpus, tmp_path_factory):
    """{extension: the folder holding part-0, part-1 and part-2 in that format}."""
    lines = corpus["train"].read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == sum(PART_ROWS)
    folders = {}
    for extension, write in WRITERS.items():
        folder = folders[extension] = tmp_path_factory.mktemp(extension.replace(".", "_"))
        for index, part in enumerate(parts(lines)):
            (folder / f"part-{index}.{extension}").write_bytes(write(part))
    return folders


def prepare_argv(pattern, tokenizer_dir, output_dir, *extra):
    return flags(
        train_file=pattern,
        tokenizer_name_or_path=tokenizer_dir,
        max_length=MAX_LENGTH,
        shard_size=30,
        rows_per_block=ROWS_PER_BLOCK,
        limit=LIMIT,
        output_dir=output_dir,
    ) + [str(word) for word in extra]


def shards_of(folder):
    """The split's files but manifest.json's "source" (the pattern given), which names the
    format."""
    written = files_in(folder)
    manifest = json.loads(written.pop("train/manifest.json"))
    rows, before = [], 0
    for part in PART_ROWS:  # blocks start afresh in each file
        rows.append(min(part, LIMIT - before))
        before += rows[-1]
    blocks = sum(-(-count // ROWS_PER_BLOCK) for count in rows)
    assert (manifest["rows"], manifest["blocks"]) == (LIMIT, blocks)
    del manifest["source"]
    return {**written, "manifest without its source": manifest}


@pytest.fixture(scope="module")
def plain_shards(corpus_parts, tokenizer_dir, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("plain_shards")
    pattern = corpus_parts["txt"] / "part-*.txt"
    prepare.main(prepare.parse_args(prepare_argv(pattern, tokenizer_dir, output_dir)))
    return shards_of(output_dir)


class CountedReads:
    """A file as Beam's workers open it, the bytes read from it added to `tally[path]`."""

    def __init__(self, file, path, tally):
        self.file, self.path, self.tally = file, path, tally

    def read(self, *size):
        data = self.file.read(*size)
        self.tally[self.path] += len(data)
        return data

    def __getattr__(self, name):  # seek, tell, close...: the file's own
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.file.close()


@pytest.fixture
def bytes_read(monkeypatch):
    """{path: bytes read from it} by the workers of an in-process Beam run."""
    tally, open_input = collections.Counter(), beam_pipeline.open_input
    monkeypatch.setattr(
        beam_pipeline, "open_input", lambda path: CountedReads(open_input(path), path, tally)
    )
    return tally


@pytest.mark.parametrize("extension", [name for name in WRITERS if name != "txt"])
def test_every_format_gives_the_tokenizer_and_the_shards_of_the_plain_text(
    corpus_parts, tokenizer_dir, plain_shards, bytes_read, tmp_path, extension
):
    pattern = str(corpus_parts[extension] / f"part-*.{extension}")
    unigram = flags(train_file=pattern, vocab_size=VOCAB_SIZE, output_dir=tmp_path / "tokenizer")
    train_unigram.main(train_unigram.parse_args(unigram))
    tokenizer = (tmp_path / "tokenizer" / "tokenizer.json").read_bytes()
    assert tokenizer == (tokenizer_dir / "tokenizer.json").read_bytes()

    for name, runner in (("single", []), ("beam", ["--runner", "DirectRunner"])):
        output_dir = tmp_path / name
        prepare.main(prepare.parse_args(prepare_argv(pattern, tokenizer_dir, output_dir, *runner)))
        assert_same_files(shards_of(output_dir), plain_shards)
    if extension not in SEEKABLE:  # a file of K blocks read from its start for each: K+1 times
        for path in sorted(corpus_parts[extension].iterdir()):
            size = os.path.getsize(path)
            assert 0 < bytes_read[str(path)] <= 2 * size, (
                f"Beam read {bytes_read[str(path)]} bytes of {path.name}, {size} bytes long"
            )


# --------------------------------------------------------------------------------------------------
# From Cloud Storage: steps 1 and 2 as subprocesses (their gs:// clients read the emulator's address
# from the environment), the shards written to a local folder to compare.


@pytest.fixture(scope="module")
def gcs(tmp_path_factory, corpus_parts):
    emulator = GcsEmulator(tmp_path_factory.mktemp("gcs_emulator")).start()
    try:
        emulator.create_bucket(BUCKET)
        for extension in {extension for extension, *_ in (case.values for case in FROM_THE_BUCKET)}:
            for path in sorted(corpus_parts[extension].iterdir()):
                emulator.upload(BUCKET, f"{extension}/{path.name}", path.read_bytes())
        yield emulator
    finally:
        emulator.stop()


TWO_WORKERS = flags(
    runner="DirectRunner", direct_num_workers=2, direct_running_mode="multi_processing"
)
# Each format from the bucket once, each way of reading gs:// once: TensorFlow's client in one
# process (a stream to decompress, a Parquet file to seek in) and Beam's on its workers.
FROM_THE_BUCKET = [
    pytest.param("jsonl.gz", "train_unigram.py", [], id="unigram, .jsonl.gz"),
    pytest.param("parquet", "prepare_tfrecord_shards.py", [], id="prepare, Parquet"),
    pytest.param("json.zst", "prepare_tfrecord_shards.py", TWO_WORKERS, id="Beam, .json.zst"),
    pytest.param(
        "parquet", "prepare_tfrecord_shards.py", ["--runner", "DirectRunner"], id="Beam, Parquet"
    ),
]


@pytest.mark.parametrize("extension, script, runner", FROM_THE_BUCKET)
def test_a_glob_in_a_bucket_gives_what_the_plain_text_gives(
    gcs, tokenizer_dir, plain_shards, tmp_path, extension, script, runner
):
    pattern = f"gs://{BUCKET}/{extension}/part-*.{extension}"
    output_dir = tmp_path / "out"
    if script == "train_unigram.py":
        argv = flags(train_file=pattern, vocab_size=VOCAB_SIZE, output_dir=output_dir)
    else:
        argv = prepare_argv(pattern, tokenizer_dir, output_dir, *runner)
    result = run_command(script, *argv, env=gcs.env(base=subprocess_env()), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    if script == "train_unigram.py":
        tokenizer = (output_dir / "tokenizer.json").read_bytes()
        assert tokenizer == (tokenizer_dir / "tokenizer.json").read_bytes()
    else:
        assert_same_files(shards_of(output_dir), plain_shards)


# --------------------------------------------------------------------------------------------------
# Bad files: one line, a non-zero exit, nothing written (tests/refusals.py)


def cut_short(data):
    return data[: len(data) * 2 // 3]


@pytest.fixture(scope="module")
def bad_files(corpus_parts, tmp_path_factory):
    """{name: a glob or file}, each bad in one way; the bad file last in its glob, so that the
    single process has written shards before it finds it."""
    folder = tmp_path_factory.mktemp("bad_files")
    lines = make_corpus_lines(150, seed=5)

    def glob_with_bad_last(name, extension, bad):
        (folder / name).mkdir()
        for path in corpus_parts[extension].glob("part-[01].*"):
            (folder / name / path.name).write_bytes(path.read_bytes())
        (folder / name / f"part-2.{extension}").write_bytes(bad)
        return folder / name / f"part-*.{extension}"

    not_json = json_lines(lines).split(b"\n")
    not_json[56] = b'{"text": "an unfinished quote}'
    mixed = folder / "mixed"
    mixed.mkdir()
    (mixed / "a.jsonl.gz").write_bytes(WRITERS["jsonl.gz"](lines))
    (mixed / "b.parquet").write_bytes(parquet_bytes(lines))
    return {
        "gz_cut_short": glob_with_bad_last(
            "gz_cut_short", "jsonl.gz", cut_short(WRITERS["jsonl.gz"](lines))
        ),
        "zst_cut_short": glob_with_bad_last(
            "zst_cut_short", "json.zst", cut_short(WRITERS["json.zst"](lines))
        ),
        "not_json": glob_with_bad_last("not_json", "jsonl.gz", gzip.compress(b"\n".join(not_json))),
        "no_text_column": glob_with_bad_last(
            "no_text_column", "parquet", parquet_bytes(lines, "body")
        ),
        "not_parquet": glob_with_bad_last(
            "not_parquet", "parquet", cut_short(parquet_bytes(lines))
        ),
        "mixed": mixed / "*",
    }


BAD_FILES = [
    pytest.param("gz_cut_short", ["part-2.jsonl.gz", "cut short", "gzip"], id="a .gz cut short"),
    pytest.param("zst_cut_short", ["part-2.json.zst", "cut short", "zstd"], id="a .zst cut short"),
    pytest.param("not_json", ["part-2.jsonl.gz", "line 57 is not JSON"], id="a line not JSON"),
    pytest.param(
        "no_text_column",
        ["part-2.parquet", "--text_column 'text'", "['id', 'body']"],
        id="no text column",
    ),
    pytest.param("not_parquet", ["part-2.parquet", "not a Parquet file"], id="not Parquet"),
    pytest.param(
        "mixed",
        ["a.jsonl.gz is JSON lines", "b.parquet is Parquet", "several formats"],
        id="a glob of two formats",
    ),
]


# In this process (script_in_process): the reading is the same code as in a subprocess; the Beam
# cases below, and the flag cases of test_prepare_shards.py, run as the user runs them.
@pytest.mark.parametrize("bad, needles", BAD_FILES)
def test_a_bad_file_is_refused_in_one_line_and_leaves_nothing(
    bad_files, tokenizer_dir, tmp_path, bad, needles
):
    argv = prepare_argv(bad_files[bad], tokenizer_dir, tmp_path / "out")
    refused(script_in_process, "prepare_tfrecord_shards.py", argv, tmp_path / "out", *needles)


# What Beam's workers find: in the index (a Parquet footer, a JSON line), or as they read (a gzip
# stream cut short is found only at its end).
BEAM_FINDS = ["a .gz cut short", "a line not JSON", "not Parquet"]


@pytest.mark.parametrize("bad, needles", [case for case in BAD_FILES if case.id in BEAM_FINDS])
def test_beam_refuses_a_bad_file_in_one_line_and_leaves_nothing(
    bad_files, tokenizer_dir, run_script, tmp_path, bad, needles
):
    argv = prepare_argv(bad_files[bad], tokenizer_dir, tmp_path / "out", "--runner", "DirectRunner")
    refused(run_script, "prepare_tfrecord_shards.py", argv, tmp_path / "out", *needles)


@pytest.mark.parametrize("bad, needles", BAD_FILES[1:3])
def test_train_unigram_refuses_a_bad_file_in_one_line(bad_files, tmp_path, bad, needles):
    argv = flags(train_file=bad_files[bad], vocab_size=VOCAB_SIZE, output_dir=tmp_path / "out")
    refused(script_in_process, "train_unigram.py", argv, tmp_path / "out", *needles)


def test_a_text_column_that_holds_no_text_is_refused_by_where_it_is(tmp_path):
    """A number where the text should be would otherwise fail deep in the tokenizer."""
    import pyarrow
    import pyarrow.parquet

    from mlm_pipeline import corpus

    json_file = tmp_path / "rows.jsonl"
    json_file.write_text('{"text": "fine"}\n\n["a list"]\n{"text": 5}\n')
    with pytest.raises(corpus.UsageError, match=r"rows.jsonl: line 3 is a JSON list"):
        list(corpus.file_rows(str(json_file)))
    json_file.write_text('{"text": "fine"}\n\n{"text": 5}\n')
    with pytest.raises(corpus.UsageError, match=r"'text' holds 5, not text, in line 3 of "):
        list(corpus.file_rows(str(json_file)))
    parquet_file = tmp_path / "rows.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"text": [1, 2]}), parquet_file)
    with pytest.raises(corpus.UsageError, match=r"'text' of .*rows.parquet holds int64, not text"):
        list(corpus.file_rows(str(parquet_file)))


def test_a_json_array_that_is_broken_or_holds_no_objects_is_refused_in_one_line(tmp_path):
    """A .json file that opens with [ is read as one array: its mistakes are named as such."""
    from mlm_pipeline import corpus

    array_file = tmp_path / "rows.json"
    array_file.write_text('[\n {"text": "fine"},\n {"text": "cut off"\n')
    with pytest.raises(corpus.UsageError, match=r"rows.json: it opens with \[ but is not a JSON"):
        list(corpus.file_rows(str(array_file)))
    array_file.write_text('[{"text": "fine"}, "a string"]')
    with pytest.raises(corpus.UsageError, match=r"item 2 of its array is a JSON str, not an"):
        list(corpus.file_rows(str(array_file)))
    array_file.write_text('[{"text": "fine"}, {"body": "elsewhere"}]')
    with pytest.raises(corpus.UsageError, match=r"'text' is not in item 2 of the array in "):
        list(corpus.file_rows(str(array_file)))
    array_file.write_text('\n[{"text": "one"},\n {"text": null}, {"text": "two"}]\n')
    assert list(corpus.file_rows(str(array_file))) == ["one", None, "two"]
