"""prepare_tfrecord_shards.py --runner NAME: the data step as an Apache Beam pipeline, for corpora
past one machine.

    # one machine, every core: Beam's DirectRunner with one worker process per core
    python prepare_tfrecord_shards.py --train_file 'corpus/*.txt' --split train \
        --tokenizer_name_or_path tokenizer --output_dir shards \
        --runner DirectRunner --direct_num_workers 0 --direct_running_mode multi_processing

    # Google Cloud Dataflow: README.md, "Several hosts, and Apache Beam", has the whole command,
    # docs/reference.md how the pipeline works

The pipeline writes what the single process writes, byte for byte, manifest included:
1. Index: each input file's rows are counted, and for plain text where each block of
   --rows_per_block lines starts. Plain text has its line breaks counted (block_starts, at
   memory speed, far above tokenizing) with each block's byte offset; compressed text is counted
   the same way as it is decompressed; a Parquet file's row count is in its footer; JSON lines and
   CSV are read through (count_rows), which also finds a bad line before any packing.
2. Number: the files' blocks are numbered in file order, as the single process numbers them, and
   --limit cuts the rows past it.
3. Pack: each block is read, tokenized, packed and written as its own shards (packing.pack_block),
   on whichever worker the runner hands it to. A block of plain text is read from its byte offset;
   one of a file that cannot be entered midway (compressed, JSON lines, CSV) is read from the
   file's start, its first rows read and dropped (decompressing and parsing run far above
   tokenizing); one of a Parquet file from the row group that holds its first row.
4. Manifest: the blocks' summaries are gathered and manifest.json is written, last.

There is no GroupByKey of the sequences (tensorflow-datasets' BeamWriter groups records by shard): a
shard never holds two blocks' sequences here, so the worker that packs a block writes its shards
itself, and only the blocks' small summaries cross workers. Nothing a runner chooses can change the
output: a block, the unit of work, is fixed by the input and the flags alone, and a retried block
writes the same files again.

This module is what the workers run. Workers need apache-beam, tokenizers, numpy and google-crc32c,
and this package (setup.py), and read Parquet and zstd with pyarrow and zstandard, which come with
apache-beam: no TensorFlow, no transformers. Each loads the tokenizer itself, from a
folder (local, or gs:// for Dataflow) or a Hub id, and checks it against the fingerprint of the one
the launcher loaded. The launcher's side, the checks before any work, the runner and the errors, is
in beam_launcher.py.
"""

import contextlib
import itertools
import os
from typing import NamedTuple, Optional

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from . import corpus, packing, split_manifest, storage
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
    WorkerTokenizer every worker loads; `settings` are the split's (split_manifest.split_settings);
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
        | "Index each file's blocks" >> beam.Map(index_file, rows_per_block, text_column)
        | "Gather the indexes" >> beam.combiners.ToList()
        | "Number the blocks" >> beam.FlatMap(number_blocks, rows_per_block, limit)
        # Without it, the runner may pack every block on the worker that numbered them.
        | "Spread the blocks" >> beam.Reshuffle()
        | "Tokenize, pack and write each block" >> beam.ParDo(pack)
        | "Gather the summaries" >> beam.combiners.ToList()
        | "Write manifest.json" >> beam.Map(write_manifest, split_dir, settings, packing_text)
    )


class Block(NamedTuple):
    """Where one block lies: its number, its file, its byte range in a plain text file (end None: to
    the file's end; start None: a file read from its start, its first rows dropped), the number of
    its first row in the file (from 1), and how many rows it has."""

    block: int
    path: str
    start: Optional[int]
    end: Optional[int]
    first_line: int
    rows: int


def index_file(numbered_file, rows_per_block, text_column):
    """(file number, path) -> (file number, path, where each of its blocks starts, rows): a byte
    offset for each block of a plain text file, None for each block of any other."""
    number, path = numbered_file
    if corpus.file_format(path) == "text" and corpus.compression(path) is None:
        corpus.check_text_column(text_column, ["text"], source=path)
        with open_input(path) as file:
            starts, lines = block_starts(file, rows_per_block)
        return number, path, starts, lines
    rows = count_rows(path, text_column, open_input)
    return number, path, [None] * -(-rows // rows_per_block), rows


def number_blocks(indexes, rows_per_block, limit):
    """Every Block of every file, numbered in file order. Past --limit rows, blocks are cut short,
    then left out."""
    block, rows_before = 0, 0
    for _, path, starts, lines in sorted(indexes):
        for index, start in enumerate(starts):
            rows = min(rows_per_block, lines - index * rows_per_block)
            if limit is not None:
                rows = min(rows, limit - rows_before)
                if rows <= 0:
                    return
            end = starts[index + 1] if index + 1 < len(starts) else None
            first_line = index * rows_per_block + 1
            yield Block(block, path, start, end, first_line, rows)
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
        if block.start is None:
            skip = block.first_line - 1
            rows = corpus.file_rows(block.path, self.text_column, open_input, skip=skip)
            with contextlib.closing(rows):
                yield from itertools.islice(rows, block.rows)
            return
        with open_input(block.path) as file:
            text = ByteRange(file, block.start, block.end)
            lines = corpus.text_lines(text, block.path, block.first_line)
            yield from itertools.islice(lines, block.rows)


def load_backend(tokenizer):
    """The WorkerTokenizer loaded: tokenizer.json from its folder (local or gs://) or from the Hub,
    set up for batch calls, and checked to be the very tokenizer the launcher loaded."""
    from tokenizers import Tokenizer

    name = tokenizer.name
    if "://" in name or os.path.isdir(name):
        with open_input(f"{name.rstrip('/')}/{TOKENIZER_FILE}") as file:
            backend = Tokenizer.from_str(file.read().decode("utf-8"))
    else:
        backend = Tokenizer.from_pretrained(name)
    backend = packing.batch_backend(backend, tokenizer.split_special_tokens)
    if split_manifest.tokenizer_fingerprint(backend) != tokenizer.fingerprint:
        raise UsageError(
            f"the tokenizer {name} that a worker loaded differs from the one the launcher loaded; "
            "make sure nothing rewrites it while the pipeline runs."
        )
    return backend


def write_manifest(packed, split_dir, settings, packing_text):
    """All blocks' (summary, rows) -> manifest.json, written last and whole."""
    summaries, rows = [summary for summary, _ in packed], sum(rows for _, rows in packed)
    manifest = split_manifest.split_manifest(summaries, rows, settings, packing_text)
    write_whole(f"{split_dir}/{MANIFEST_NAME}", split_manifest.manifest_text(manifest).encode())


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


def count_rows(path, text_column="text", open_raw=corpus.open_binary):
    """How many rows file_rows gives for the file: from a Parquet file's footer, by counting line
    breaks in (decompressed) plain text, by reading JSON lines and CSV through."""
    kind = corpus.file_format(path)
    if kind == "parquet":
        with corpus.errors_named(path), open_raw(path) as raw:
            return corpus.parquet_file(raw, path, text_column).metadata.num_rows
    if kind == "text":
        corpus.check_text_column(text_column, ["text"], source=path)
        with (
            corpus.errors_named(path),
            open_raw(path) as raw,
            corpus.decompressed(raw, path) as file,
        ):
            return block_starts(file, 1)[1]
    return sum(1 for _ in corpus.file_rows(path, text_column, open_raw))


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
