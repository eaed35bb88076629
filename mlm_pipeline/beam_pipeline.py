"""prepare_tfrecord_shards.py --runner NAME: the data step as an Apache Beam pipeline, for corpora
past one machine.

    # one machine, every core: Beam's DirectRunner with one worker process per core
    python prepare_tfrecord_shards.py --train_file 'corpus/*.txt' --split train \
        --tokenizer_name_or_path tokenizer --output_dir shards \
        --runner DirectRunner --direct_num_workers 0 --direct_running_mode multi_processing

    # Google Cloud Dataflow: README.md, "Several hosts, and Apache Beam", has the whole command,
    # docs/reference.md how the pipeline works

The pipeline writes what the single process writes, byte for byte, manifest included, and reads
each input file a fixed number of times whatever its size, its format and --rows_per_block:
1. Index: each input file's rows are counted, and it is noted where each of its blocks of
   --rows_per_block rows will be read from. Plain text has its line breaks counted (block_starts,
   at memory speed, far above tokenizing), each block's byte offset noted; a Parquet file's row
   count is in its footer, and a block is read from the row group that holds its first row. A
   file that cannot be entered midway (compressed, JSON lines, a JSON array, CSV) is read through
   once, here, by one worker, and each block's rows are written, as they are read, to a staged
   file of its own in the split's folder (stage_blocks); that pass also counts the rows and finds
   a bad line before any packing.
2. Number: the files' blocks are numbered in file order, as the single process numbers them, and
   --limit cuts the rows past it.
3. Pack: each block is read (plain text from its byte offset, Parquet from its row group, a staged
   block from its staged file), tokenized, packed and written as its own shards
   (packing.pack_block), on whichever worker the runner hands it to.
4. Manifest: the blocks' summaries are gathered, the staged files removed, and manifest.json is
   written, last.
So plain text is read twice (counted, then packed), Parquet once (its footer aside), and any other
file once, however many blocks it has, where reading each block from the file's start would cost a
file of K blocks about K^2/2 reads. Uncompressed JSON lines are staged too rather than entered at a
byte offset: a row there is a non-blank line, and a .json file may be one JSON array, so one way
serves every file that is not plain text or Parquet.

Why staged files rather than handing a block's rows on as Beam elements: every element that
crosses a Reshuffle or GroupByKey is held by the runner (in the DirectRunner's memory, in Dataflow's
shuffle), so a file's rows would be held whole before any block is packed. A staged file is
written a batch of rows at a time through Beam's FileSystems, so memory stays flat however large
the file, it works on gs:// as on a local folder, and only its path crosses workers. It is JSON
lines, one row's text a line (JSON null for a row without one): a text may hold line breaks, which
JSON escapes. The staged files are named so that no shard pattern matches them
(split_folder.staged_path), are removed just before manifest.json is written (so a finished split
never holds one), and are cleared with a killed or failed run's shards (split_folder), so that a
rerun stages afresh rather than trust a killed run's files.

There is no GroupByKey of the sequences (tensorflow-datasets' BeamWriter groups records by shard): a
shard never holds two blocks' sequences here, so the worker that packs a block writes its shards
itself, and only the blocks' small summaries cross workers. Nothing a runner chooses can change the
output: a block, the unit of work, is fixed by the input and the flags alone, and a retried block
(or a retried staging of a file) writes the same files again.

This module is what the workers run. Workers need apache-beam, tokenizers, numpy and google-crc32c,
and this package (setup.py), and read Parquet and zstd with pyarrow and zstandard, which come with
apache-beam: no TensorFlow, no transformers. Each loads the tokenizer itself, from a
folder (local, or gs:// for Dataflow) or a Hub id, and checks it against the fingerprint of the one
the launcher loaded. The launcher's side, the checks before any work, the runner and the errors, is
in beam_launcher.py.
"""

import contextlib
import enum
import itertools
import json
import os
from typing import NamedTuple, Optional

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from . import corpus, packing, split_folder, storage
from .contract import MANIFEST_NAME, TOKENIZER_FILE
from .errors import UsageError


def build(
    pipeline,
    files,
    *,
    settings,
    tokenizer,
    split_dir,
    batch_size,
    limit,
    text_column,
    packing_text,
):
    """The pipeline's steps, from the input files to manifest.json. `tokenizer` is the
    WorkerTokenizer every worker loads; `settings` are the split's (split_folder.split_settings);
    `text_column` is the column read from JSON lines, CSV and Parquet files."""
    rows_per_block = settings["rows_per_block"]
    pack = PackBlock(
        tokenizer,
        split_dir=split_dir,
        settings=settings,
        batch_size=batch_size,
        text_column=text_column,
    )
    return (
        pipeline
        | "Input files" >> beam.Create(list(enumerate(files)))
        | "Spread the files" >> beam.Reshuffle()
        | "Index each file's blocks, staging them where needed"
        >> beam.Map(index_file, rows_per_block, text_column, split_dir, limit)
        | "Gather the indexes" >> beam.combiners.ToList()
        | "Number the blocks" >> beam.FlatMap(number_blocks, rows_per_block, limit)
        # Without it, the runner may pack every block on the worker that numbered them.
        | "Spread the blocks" >> beam.Reshuffle()
        | "Tokenize, pack and write each block" >> beam.ParDo(pack)
        | "Gather the summaries" >> beam.combiners.ToList()
        | "Write manifest.json" >> beam.Map(write_manifest, split_dir, settings, packing_text)
    )


class Reading(enum.Enum):
    """The three ways the packing step reads a block, one for each kind of input file."""

    BYTE_RANGE = "a byte range of an uncompressed plain text file, from its first line's offset"
    STAGED = "the block's staged file, for a file that cannot be entered midway"
    ROW_GROUP = "a Parquet file, from the row group that holds the block's first row"


class FileIndex(NamedTuple):
    """What the index step found of one input file: its number in the split, its path, its rows,
    how its blocks are read, and where each of them is (`places`, one a block): a byte offset
    (Reading.BYTE_RANGE), a staged file (Reading.STAGED), or None (Reading.ROW_GROUP: the block's
    first row is where)."""

    number: int
    path: str
    rows: int
    reading: Reading
    places: list


class Block(NamedTuple):
    """One block: its number, its file, the number of its first row in the file (from 1), how many
    rows it has, how it is read, and what that reading needs: `start` and `end`, its bytes in the
    file (Reading.BYTE_RANGE; end None: to the file's end), or `staged`, its staged file
    (Reading.STAGED)."""

    block: int
    path: str
    first_line: int
    rows: int
    reading: Reading
    start: Optional[int] = None
    end: Optional[int] = None
    staged: Optional[str] = None


def index_file(numbered_file, rows_per_block, text_column, split_dir, limit):
    """(file number, path) -> its FileIndex. A file that cannot be entered midway is staged here,
    block by block, in its one reading (stage_blocks)."""
    number, path = numbered_file
    kind = corpus.file_format(path)
    if kind == "text" and corpus.compression(path) is None:
        corpus.check_text_column(text_column, ["text"], source=path)
        with open_input(path) as file:
            starts, lines = block_starts(file, rows_per_block)
        return FileIndex(number, path, lines, Reading.BYTE_RANGE, starts)
    if kind == "parquet":
        with corpus.errors_named(path), open_input(path) as raw:
            rows = corpus.parquet_file(raw, path, text_column).metadata.num_rows
        return FileIndex(number, path, rows, Reading.ROW_GROUP, [None] * -(-rows // rows_per_block))
    rows, staged = stage_blocks(numbered_file, rows_per_block, text_column, split_dir, limit)
    return FileIndex(number, path, rows, Reading.STAGED, staged)


def stage_blocks(numbered_file, rows_per_block, text_column, split_dir, limit):
    """Read a file that cannot be entered midway once, from its start, and write each block's rows
    to a staged file of its own as they are read (split_folder.staged_path; JSON lines, one row's
    text a line, null for none), a batch at a time. Returns the rows read and the staged files, in
    order. With --limit, no file can give the split more than `limit` rows, so none past them is
    read (nor, as in the single process, a bad line past them found)."""
    number, path = numbered_file
    rows = corpus.file_rows(path, text_column, open_input)
    with contextlib.closing(rows):
        rows = itertools.islice(rows, limit)  # limit None: every row
        staged, count, end = [], 0, object()  # a row can be None: the end needs a marker
        while (first := next(rows, end)) is not end:
            block_rows = itertools.chain([first], itertools.islice(rows, rows_per_block - 1))
            staged.append(split_folder.staged_path(split_dir, number, len(staged)))
            count += write_staged(staged[-1], block_rows)
    return count, staged


STAGED_BATCH = 1000  # rows a write to a staged file


def write_staged(path, rows):
    """The rows' texts as JSON lines; returns how many. Written again whole if a retry stages the
    file again; read only once every file is indexed, so never while half-written."""
    count = 0
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as file:
        while batch := list(itertools.islice(rows, STAGED_BATCH)):
            # json.dumps escapes line breaks, and any character but ASCII (a lone surrogate too), so
            # each text is one line of ASCII, read back exactly
            file.write("".join(json.dumps(text) + "\n" for text in batch).encode("ascii"))
            count += len(batch)
    return count


def staged_rows(path):
    """The texts of a staged block, as write_staged wrote them."""
    with open_input(path) as file:
        for line in corpus.text_lines(file, path):
            yield json.loads(line)


def remove_staged(split_dir):
    """Every staged block of the split, gone (once every block is packed)."""
    pattern = f"{split_dir}/{split_folder.STAGED_FILES}"
    paths = [meta.path for match in FileSystems.match([pattern]) for meta in match.metadata_list]
    if paths:
        FileSystems.delete(paths)


def number_blocks(indexes, rows_per_block, limit):
    """Every Block of every file, numbered in file order. Past --limit rows, blocks are cut short,
    then left out."""
    block, rows_before = 0, 0
    for index in sorted(indexes, key=lambda index: index.number):
        for number, place in enumerate(index.places):
            rows = min(rows_per_block, index.rows - number * rows_per_block)
            if limit is not None:
                rows = min(rows, limit - rows_before)
                if rows <= 0:
                    return
            first_line = number * rows_per_block + 1
            where = {}
            if index.reading is Reading.BYTE_RANGE:  # to the next block's start, or the file's end
                following = index.places[number + 1 : number + 2]
                where = {"start": place, "end": following[0] if following else None}
            elif index.reading is Reading.STAGED:
                where = {"staged": place}
            yield Block(block, index.path, first_line, rows, index.reading, **where)
            block, rows_before = block + 1, rows_before + rows


class WorkerTokenizer(NamedTuple):
    """The tokenizer as the workers load it: a folder (local or gs://) or a Hub id, whether special
    tokens' text is split as text, and the fingerprint the launcher's copy has."""

    name: str
    split_special_tokens: bool
    fingerprint: str


class PackBlock(beam.DoFn):
    """A Block -> the block's summary (packing.pack_block) and its row count; its shards
    written."""

    def __init__(self, tokenizer, *, split_dir, settings, batch_size, text_column):
        super().__init__()
        self.tokenizer, self.split_dir = tokenizer, split_dir
        self.settings, self.batch_size, self.text_column = settings, batch_size, text_column

    def setup(self):
        # One core a worker: the tokenizer's own thread pool would make N workers use N x the cores.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        self.backend = load_backend(self.tokenizer)

    def process(self, block):
        shards = packing.BlockShards(
            split_dir=self.split_dir,
            split=self.settings["split"],
            block=block.block,
            shard_size=self.settings["shard_size"],
            write_shard=write_shard,
        )
        with contextlib.closing(self.block_rows(block)) as rows:
            encoded = (
                (len(texts), packing.encode_texts(self.backend, texts))
                for texts in corpus.text_batches(rows, self.batch_size)
            )
            summary = packing.pack_block(block.block, encoded, self.settings["max_length"], shards)
        yield summary, block.rows

    def block_rows(self, block):
        """The texts of the block's rows, read as the single process reads them."""
        if block.reading is Reading.STAGED:
            yield from itertools.islice(staged_rows(block.staged), block.rows)
        elif block.reading is Reading.ROW_GROUP:  # corpus skips to the row group of the first row
            skip = block.first_line - 1
            rows = corpus.file_rows(block.path, self.text_column, open_input, skip=skip)
            with contextlib.closing(rows):
                yield from itertools.islice(rows, block.rows)
        else:  # Reading.BYTE_RANGE
            with open_input(block.path) as file:
                text = ByteRange(file, block.start, block.end)
                lines = corpus.text_lines(text, block.path, block.first_line)
                yield from itertools.islice(lines, block.rows)


def load_backend(tokenizer):
    """The WorkerTokenizer loaded: tokenizer.json from its folder (local or gs://) or from the Hub,
    set up for batch calls, and checked to be the very tokenizer the launcher loaded."""
    from tokenizers import Tokenizer

    name = tokenizer.name
    if not storage.is_hub_id(name):  # a folder, local or gs://
        with open_input(f"{name.rstrip('/')}/{TOKENIZER_FILE}") as file:
            backend = Tokenizer.from_str(file.read().decode("utf-8"))
    else:
        backend = Tokenizer.from_pretrained(name)
    backend = packing.batch_backend(backend, tokenizer.split_special_tokens)
    if split_folder.tokenizer_fingerprint(backend) != tokenizer.fingerprint:
        raise UsageError(
            f"the tokenizer {name} that a worker loaded differs from the one the launcher loaded; "
            "make sure nothing rewrites it while the pipeline runs."
        )
    return backend


def write_manifest(packed, split_dir, settings, packing_text):
    """All blocks' (summary, rows) -> manifest.json, written last and whole, once the staged
    blocks are removed: a finished split holds none."""
    summaries, rows = [summary for summary, _ in packed], sum(rows for _, rows in packed)
    manifest = split_folder.split_manifest(summaries, rows, settings, packing_text)
    remove_staged(split_dir)
    write_whole(f"{split_dir}/{MANIFEST_NAME}", split_folder.manifest_text(manifest).encode())


# Files, local or gs://, through Beam's file systems (the workers have no TensorFlow)


def open_input(path):
    """A file's bytes as stored: corpus.file_rows decompresses them as the single process does (and,
    unlike Beam's own decompression, refuses a file cut short)."""
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def write_shard(path, sequences):
    """A shard as TFRecord bytes encoded without TensorFlow (packing), written whole; returns its
    size."""
    data = packing.tfrecord_bytes(packing.serialize_examples(sequences))
    write_whole(path, data)
    return len(data)


def write_whole(path, data):
    with storage.write_then_rename(path, rename=rename) as temporary:
        with FileSystems.create(temporary, compression_type=CompressionTypes.UNCOMPRESSED) as file:
            file.write(data)


def rename(source, target):
    FileSystems.rename([source], [target])


# --- reading a file in blocks: what only the pipeline needs of a corpus file


def block_starts(binary_file, rows_per_block):
    """Where each block of `rows_per_block` lines of a text file starts, as byte offsets (the first
    is 0), and the file's line count, the lines counted as corpus.text_lines splits them. With
    these a Beam worker reads any block of a file by seeking to its start. Line breaks are found
    with numpy, at memory speed: this first pass over a file costs far less than tokenizing it."""
    starts, breaks, size, last_end, held = [0], 0, 0, 0, b""
    while True:
        chunk = binary_file.read(corpus.READ_BYTES)
        data = held + chunk
        base = size - len(held)
        size += len(chunk)
        # \r\n or a lone \r? the next read tells
        held = b"\r" if chunk and data.endswith(b"\r") else b""
        body = np.frombuffer(data, dtype=np.uint8)[: len(data) - len(held)]
        returns = np.flatnonzero(body == 13)
        lone_returns = returns[np.append(body[1:], 0)[returns] != 10]
        # the next line's start
        ends = np.sort(np.concatenate([np.flatnonzero(body == 10), lone_returns])) + base + 1
        # the break that ends a block's last line
        first = (rows_per_block - 1 - breaks) % rows_per_block
        starts.extend(ends[first::rows_per_block].tolist())
        breaks += len(ends)
        last_end = int(ends[-1]) if len(ends) else last_end
        if not chunk:
            break
    lines = breaks + (1 if size > last_end else 0)
    return starts[: -(-lines // rows_per_block)], lines


class ByteRange:
    """The bytes [start, end) of a seekable binary file (end None: to the file's end), read as a
    file: one block of a text file."""

    def __init__(self, binary_file, start, end=None):
        binary_file.seek(start)
        self.file, self.left = binary_file, float("inf") if end is None else end - start

    def read(self, size):
        data = self.file.read(int(min(size, self.left))) if self.left > 0 else b""
        self.left -= len(data)
        return data
