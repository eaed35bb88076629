"""Reading a corpus: local or gs:// files (one, or a glob over many), or a Hub dataset, as a stream
of texts.

train_unigram.py and prepare_tfrecord_shards.py declare their corpus flags as a `Corpus` group (a
--<split>_file field for each split they read added by `split_file_setting`) and read their input
through here, so both accept the same files and refuse bad ones in the same words.
A file is read by its extension: plain text, whatever its extension (.txt, WikiText's .raw or
.tokens, none), one document per line (split exactly as datasets' "text" builder splits it); JSON
lines (.jsonl, .json: one object per line, or one JSON array of them, read whole), CSV and Parquet
by --text_column. The text formats may be compressed (.gz, .zst, .bz2: corpus.jsonl.gz,
c4-train.00000-of-01024.json.gz, part-0.txt.zst), and are decompressed as they are read. Every
format but a JSON array is read as a stream, one file after another, from local disk or gs://, so
memory stays flat however large the corpus; Hub datasets go through datasets, which can stream one
rather than download it.

Both paths of prepare_tfrecord_shards.py read files through `file_rows`, the single process with
`open_binary` (local files, TensorFlow's gs://), Beam's workers with Beam's own file systems, so the
two see the same rows. Reading errors that only show midway (bad encoding, a line that is not JSON,
a compressed file cut short) become one line that names the file and, where there is one, the line.
Nothing here needs TensorFlow but gs:// reading in one process.
"""

import bz2
import csv
import dataclasses
import glob
import gzip
import io
import itertools
import json
import os
import zlib
from contextlib import closing, contextmanager
from typing import Optional

from . import storage
from .errors import UsageError, first_line, positive_int
from .settings import setting
from .tf_startup import tensorflow_startup_log_held_back

# What a file holds, by its extension (the one before a compression extension): one of these
# formats, or plain text, one document per line (.txt, WikiText's .raw and .tokens, none...).
FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
FORMAT_NAMES = {"text": "plain text", "json": "JSON lines", "csv": "CSV", "parquet": "Parquet"}
# Compressed text, decompressed as it is read: the last extension says how.
COMPRESSIONS = {".gz": "gzip", ".bz2": "bzip2", ".zst": "zstd", ".zstd": "zstd"}
# Files that are not text but would partly decode as text: refused by name, not read as garbage.
NOT_TEXT = (
    ".xz",
    ".lzma",
    ".zip",
    ".tar",
    ".tgz",
    ".7z",
    ".docx",
    ".doc",
    ".odt",
    ".pdf",
    ".xlsx",
    ".arrow",
)
ACCEPTED = (
    "plain text (one document per line), .jsonl/.json (JSON lines, or one JSON array), .csv or "
    ".parquet, the text formats also compressed (.gz, .zst, .bz2)"
)


DEFAULT_DATASET = "wikitext"
DEFAULT_DATASET_CONFIG = "wikitext-103-raw-v1"


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Local or gs:// files, or a Hub dataset (the default), and how to read them."""

    dataset_name: str = setting(
        "The Hub dataset to read when no file is given, or a local folder laid out as one.",
        DEFAULT_DATASET,
    )
    dataset_config: str = setting("Which configuration of the Hub dataset.", DEFAULT_DATASET_CONFIG)
    text_column: str = setting(
        "The column that holds the text in a Hub dataset, or in JSON lines, CSV or Parquet files.",
        "text",
    )
    limit: Optional[int] = setting(
        "Read only the first LIMIT rows of the split.", type=positive_int
    )
    streaming: bool = setting(
        "Read the Hub dataset as a stream instead of downloading the whole split into the datasets "
        "cache first: nothing is written to the cache, so a corpus larger than the disk will do "
        "(with --limit, only its first rows are read). Files (--train_file...) are always read as "
        "a stream.",
        False,
    )
    trust_remote_code: bool = setting(
        "Let a Hub repository run the code it ships to load its dataset or tokenizer; only for "
        "repositories you trust.",
        False,
    )

    def split_file(self, split):
        """The --<split>_file given (a path or a glob), or None: the split comes from the Hub."""
        return getattr(self, f"{split}_file", None)

    def source(self, split):
        """The split's source as the run names it: its file or glob as given, else the Hub
        dataset/config."""
        return self.split_file(split) or f"{self.dataset_name}/{self.dataset_config}"


def split_file_setting(split):
    """The field of a --<split>_file flag, for a script's corpus group (a Corpus)."""
    return setting(
        f"The {split} split: a file, or a quoted glob over files read in sorted order "
        "('corpus/*.txt', 'gs://bucket/c4/*.json.gz'), local or gs://. Plain text is one document "
        "per line under any extension; .jsonl/.json (JSON lines, or one JSON array), .csv and "
        ".parquet files are read by --text_column; text formats may be compressed (.gz, .zst, "
        ".bz2). Without it, the split comes from --dataset_name."
    )


def extensions(path):
    """(the file name's last extension, the one before it when the last is a compression's, else
    ""), lower-cased: corpus.jsonl.gz gives (".gz", ".jsonl")."""
    stem, extension = os.path.splitext(path.rsplit("/", 1)[-1].lower())
    return extension, os.path.splitext(stem)[1] if extension in COMPRESSIONS else ""


def file_format(path):
    """What `path` holds, by its extension: "json", "csv", "parquet", or "text" for anything else.
    A compression extension is looked through (corpus.jsonl.gz: "json")."""
    extension, inner = extensions(path)
    return FORMATS.get(inner if extension in COMPRESSIONS else extension, "text")


def compression(path):
    """How `path` is compressed, by its last extension: "gzip", "bzip2", "zstd", or None."""
    return COMPRESSIONS.get(os.path.splitext(path.lower())[1])


def check_corpus_file(path, flag, in_glob=False):
    """A local corpus file must exist, hold something (a glob may match empty files), and be in a
    format this module reads."""
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a folder; pass a path to a text corpus file.")
    if not os.path.isfile(path):
        raise UsageError(f"{flag} {path} does not exist; pass a path to a text corpus file.")
    if os.path.getsize(path) == 0 and not in_glob:
        raise UsageError(f"{flag} {path} is empty; pass a file with text in it.")
    check_not_binary(path, flag)


def check_not_binary(path, flag):
    extension, inner = extensions(path)
    refused = extension if extension in NOT_TEXT else inner if inner in NOT_TEXT else None
    if refused:
        raise UsageError(
            f"{flag} {path} has extension {refused!r}, an archive or document format; pass "
            f"{ACCEPTED}."
        )
    if inner == ".parquet":
        raise UsageError(
            f"{flag} {path} is a compressed Parquet file; Parquet compresses its own columns, so "
            "pass the .parquet file itself."
        )


def check_text_column(text_column, columns, source="the data"):
    if text_column not in columns:
        raise UsageError(
            f"--text_column {text_column!r} is not in {source}, whose columns are {list(columns)}; "
            "pass the right --text_column."
        )


def input_files(pattern, flag):
    """The files a corpus flag names, in a stable order (sorted by path): one local file, or a glob
    over local or gs:// files (`corpus/*.txt`, `gs://bucket/corpus/part-*`). Each file is checked as
    check_corpus_file checks one; a glob that matches nothing is refused, and so is one that matches
    several formats."""
    remote = storage.is_remote(pattern)
    if not remote and not has_glob(pattern):
        check_corpus_file(pattern, flag)
        return [pattern]
    if remote:
        # TensorFlow lists gs://; its start-up log is noise here
        with tensorflow_startup_log_held_back():
            import tensorflow as tf

        matches = (
            tf.io.gfile.glob(pattern)
            if has_glob(pattern)
            else [pattern] * tf.io.gfile.exists(pattern)
        )
        files = [path for path in matches if not tf.io.gfile.isdir(path)]
    else:
        files = [path for path in glob.glob(pattern) if not os.path.isdir(path)]
    if not files:
        raise UsageError(
            f"{flag} {pattern} matches no file; check the path and the pattern (quote it in the "
            "shell)."
        )
    files.sort()
    formats = {}  # format: its first file
    for path in files:
        formats.setdefault(file_format(path), path)
    if len(formats) > 1:
        (first, one), (second, other) = list(formats.items())[:2]
        raise UsageError(
            f"{flag} {pattern} matches files of several formats ({one} is "
            f"{FORMAT_NAMES[first]}, {other} is {FORMAT_NAMES[second]}); narrow the pattern to "
            "files of one format."
        )
    for path in files:
        check_not_binary(path, flag) if remote else check_corpus_file(path, flag, in_glob=True)
    return files


def has_glob(path):
    return any(character in path for character in "*?[")


def open_binary(path):
    """A corpus file opened to read bytes as they are stored: a local path with open(), gs:// with
    TensorFlow's file system."""
    if storage.is_remote(path):
        import tensorflow as tf

        # a file as io knows one, which pyarrow needs to read Parquet
        return io.BufferedReader(Readable(tf.io.gfile.GFile(path, "rb")), buffer_size=READ_BYTES)
    return open(path, "rb")


def file_rows(path, text_column="text", open_raw=open_binary, skip=0):
    """The text of each row of a corpus file, local or gs:// (None where a row has none), in order:
    plain text line by line (blank lines are rows too), JSON lines one object a line (blank lines
    are not rows), CSV a record a row, Parquet row by row, `text_column` of each. Compressed files
    are decompressed as they are read. `open_raw(path)` opens the file's stored bytes: `open_binary`
    in one process, Beam's file systems on its workers. A Parquet file may start at row `skip`
    (Beam's block of it), skipping whole row groups without reading them; Beam reads the other
    formats by byte range or from staged blocks, so they always start at the first row."""
    kind = file_format(path)
    with errors_named(path), open_raw(path) as raw:
        if kind == "parquet":
            yield from parquet_rows(raw, path, text_column, skip)
            return
        with (
            decompressed(raw, path) as file,
            closing(ROW_READERS[kind](file, path, text_column)) as rows,
        ):
            yield from rows


@contextmanager
def errors_named(path):
    """What the file system or a decompressor raises while `path` is read, as one line."""
    try:
        yield
    except EOFError:  # what gzip, bz2 and ZstdReader raise for a file cut short
        raise UsageError(
            f"could not read {path}: it is cut short (its {compression(path)} data ends before "
            "the end of the stream); copy or download the file again."
        ) from None
    except (OSError, zlib.error, *zstd_errors()) as error:
        raise UsageError(f"could not read {path}: {first_line(error)}; check the file.") from None


@contextmanager
def decompressed(raw, path):
    """The bytes of `raw`, the stored file `path`, decompressed as `path`'s extension says."""
    kind = compression(path)
    if kind is None:
        yield raw
    elif kind == "gzip":
        with gzip.GzipFile(fileobj=raw, mode="rb") as file:
            yield file
    elif kind == "bzip2":
        with bz2.BZ2File(raw, mode="rb") as file:
            yield file
    else:
        yield io.BufferedReader(ZstdReader(raw), buffer_size=READ_BYTES)


def zstd_errors():
    try:
        import zstandard
    except ImportError:  # then no zstd file was opened
        return ()
    return (zstandard.ZstdError,)


# Compressed bytes a read: one read unpacks to this times the compression ratio (zstandard's
# decompressobj has no cap on its output), so small, for memory to stay small even for a file far
# more repetitive than text (some 4x: half a MB a read).
ZSTD_READ_BYTES = 1 << 17


class ZstdReader(io.RawIOBase):
    """A zstd file's decompressed bytes, frame after frame (zstd -T and pzstd write several), read
    as a file. zstandard's own stream_reader ends quietly where a file was cut short; here, as with
    gzip and bz2, that raises EOFError."""

    def __init__(self, raw):
        try:
            import zstandard
        except ImportError:
            raise UsageError(
                "reading .zst files needs the zstandard package, which is not installed; install "
                "it with `pip install -r requirements.txt`."
            ) from None
        super().__init__()
        self.raw, self.decompressors = raw, zstandard.ZstdDecompressor()
        self.decompressor, self.fed = self.decompressors.decompressobj(), False
        self.buffer, self.offset = memoryview(b""), 0  # decompressed bytes, and how far read

    def readable(self):
        return True

    def readinto(self, target):
        while self.offset == len(self.buffer):
            if self.decompressor.eof:  # a frame ended: the next, if any, needs a decompressor
                data = self.decompressor.unused_data or self.raw.read(ZSTD_READ_BYTES)
                if not data:
                    return 0
                self.decompressor = self.decompressors.decompressobj()
            else:
                data = self.raw.read(ZSTD_READ_BYTES)
                if not data:
                    if self.fed:
                        raise EOFError("the zstd data ends inside a frame")
                    return 0  # an empty file
            self.fed = True
            self.buffer, self.offset = memoryview(self.decompressor.decompress(data)), 0
        size = min(len(target), len(self.buffer) - self.offset)
        target[:size] = self.buffer[self.offset : self.offset + size]
        self.offset += size
        return size


def plain_text_rows(file, path, text_column):
    check_text_column(text_column, ["text"], source=path)
    yield from text_lines(file, path)


def json_rows(file, path, text_column):
    """JSON lines: each non-blank line one object, whose `text_column` is the row's text. A file
    that opens with `[` is one JSON array of such objects instead, read whole (a JSON document has
    no line to stop at): fine for the small files people keep that way, while JSON lines stream."""
    lines, first = enumerate(text_lines(file, path), start=1), True
    for number, line in lines:
        if not line.strip():
            continue
        if number == 1:
            line = line.lstrip("\ufeff")
        if first and line.lstrip().startswith("["):
            text = "\n".join([line, *(rest for _, rest in lines)])
            yield from json_array_rows(text, path, text_column)
            return
        first = False
        try:
            row = json.loads(line)
        except ValueError as error:
            raise UsageError(
                f"could not read {path}: line {number} is not JSON ({error}); each line must be "
                "one JSON object (JSON lines)."
            ) from None
        if not isinstance(row, dict):
            raise UsageError(
                f"could not read {path}: line {number} is a JSON {type(row).__name__}, not an "
                "object; each line must be one JSON object (JSON lines)."
            )
        check_text_column(text_column, row, source=f"line {number} of {path}")
        yield checked_text(row[text_column], text_column, f"line {number} of {path}")


def json_array_rows(text, path, text_column):
    """The rows of a .json file that holds one JSON array of objects."""
    try:
        rows = json.loads(text)
    except ValueError as error:
        raise UsageError(
            f"could not read {path}: it opens with [ but is not a JSON array ({error}); a .json "
            "file holds JSON lines (one object a line) or one array of objects."
        ) from None
    for number, row in enumerate(rows, start=1):
        where = f"item {number} of the array in {path}"
        if not isinstance(row, dict):
            raise UsageError(
                f"could not read {path}: item {number} of its array is a JSON "
                f"{type(row).__name__}, not an object; each item must be one JSON object."
            )
        check_text_column(text_column, row, source=where)
        yield checked_text(row[text_column], text_column, where)


def csv_rows(file, path, text_column):
    """CSV with a header line (as datasets' "csv" builder reads it): each record's `text_column`.
    A record may span lines (a quoted field with line breaks in it)."""
    text = io.TextIOWrapper(Readable(file), encoding="utf-8-sig", newline="")
    reader = csv.reader(text)
    # A document may be longer than the csv module's default limit of 128 KiB a field.
    csv.field_size_limit(2**31 - 1)
    try:
        header = next(reader, None)
        if header is None:
            return
        check_text_column(text_column, header, source=path)
        column = header.index(text_column)
        for record in reader:
            if record:  # a blank line holds no record
                yield record[column] if column < len(record) else None
    except UnicodeDecodeError:
        raise UsageError(
            f"could not read {path}: it is not UTF-8 text (near line {reader.line_num + 1}); "
            "convert it to UTF-8 (e.g. iconv -f <its encoding> -t utf-8)."
        ) from None
    except csv.Error as error:
        raise UsageError(
            f"could not read {path}: line {reader.line_num} is not CSV ({error}); check the file."
        ) from None


class Readable(io.RawIOBase):
    """Any object with read(size) (TensorFlow's GFile, GzipFile...) as a raw stream that io's
    readers and writers accept; seekable when the object is."""

    def __init__(self, file):
        super().__init__()
        self.file = file

    def readable(self):
        return True

    def readinto(self, target):
        data = self.file.read(len(target))
        target[: len(data)] = data
        return len(data)

    def seekable(self):
        return hasattr(self.file, "seek")

    def seek(self, offset, whence=io.SEEK_SET):
        self.file.seek(offset, whence)
        return self.file.tell()

    def tell(self):
        return self.file.tell()

    def close(self):
        if hasattr(self.file, "close") and not self.closed:
            self.file.close()
        super().close()


def parquet_file(raw, path, text_column):
    """The Parquet file, once its footer is read and its `text_column` found to hold strings."""
    import pyarrow
    import pyarrow.parquet

    try:
        parquet = pyarrow.parquet.ParquetFile(raw)
    except (pyarrow.ArrowException, OSError) as error:
        raise UsageError(
            f"could not read {path}: it is not a Parquet file that can be read "
            f"({first_line(error)}); check the file, or write it again."
        ) from None
    schema = parquet.schema_arrow
    check_text_column(text_column, schema.names, source=path)
    kind = schema.field(text_column).type
    text_types = (pyarrow.types.is_string, pyarrow.types.is_large_string)
    if not any(is_text(kind) for is_text in (*text_types, pyarrow.types.is_string_view)):
        raise UsageError(
            f"--text_column {text_column!r} of {path} holds {kind}, not text; pass the column "
            "that holds the text."
        )
    return parquet


def parquet_rows(raw, path, text_column, skip):
    import pyarrow

    parquet = parquet_file(raw, path, text_column)
    metadata = parquet.metadata
    groups = [metadata.row_group(index).num_rows for index in range(metadata.num_row_groups)]
    first = 0
    while first < len(groups) and groups[first] <= skip:  # whole row groups skipped unread
        skip -= groups[first]
        first += 1
    batches = parquet.iter_batches(
        batch_size=PARQUET_BATCH, row_groups=list(range(first, len(groups))), columns=[text_column]
    )
    try:
        for batch in batches:
            texts = batch.column(0).to_pylist()
            yield from texts[skip:]
            skip = max(0, skip - len(texts))
    except (pyarrow.ArrowException, OSError) as error:
        raise UsageError(
            f"could not read {path}: {first_line(error)}; check the file, or write it again."
        ) from None


PARQUET_BATCH = 4096  # rows a read: a few MB of text


def checked_text(value, text_column, where):
    if value is not None and not isinstance(value, str):
        raise UsageError(
            f"--text_column {text_column!r} holds {json.dumps(value)[:40]}, not text, in {where}; "
            "pass the column that holds the text."
        )
    return value


ROW_READERS = {"text": plain_text_rows, "json": json_rows, "csv": csv_rows}


READ_BYTES = 1 << 22  # 4 MiB a read: few requests to Cloud Storage, little memory


def normalize_newlines(data):
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def text_lines(binary_file, source, first_line_number=1):
    """The lines of UTF-8 text read as bytes from `binary_file`, without their line breaks, split as
    Python's text mode and datasets' "text" builder split them: \n, \r\n and a lone \r each end a
    line, and a last line without a break counts. Both paths of prepare_tfrecord_shards.py read text
    through here, the Beam workers one block of a file at a time (beam_pipeline.block_starts says
    where each starts), the single process whole files, so the two see the same lines.
    `first_line_number` numbers the lines in an error message."""
    pending, number = b"", first_line_number
    while True:
        chunk = binary_file.read(READ_BYTES)
        if chunk:
            data = pending + chunk
            # a \r\n may be cut between two reads: wait for the next
            held = 1 if data.endswith(b"\r") else 0
            lines = normalize_newlines(data[: len(data) - held]).split(b"\n")
            pending = lines.pop() + data[len(data) - held :]  # the last line is not whole yet
        else:
            lines = normalize_newlines(pending).split(b"\n") if pending else []
            if lines and not lines[-1]:  # the file ends with a line break
                lines.pop()
        if lines:
            texts = decode_lines(b"\n".join(lines), source, number)
            number += len(texts)
            yield from texts
        if not chunk:
            return


def decode_lines(data, source, first_line_number):
    try:
        return data.decode("utf-8").split("\n")
    except UnicodeDecodeError as error:  # found midway through, so say which file and where
        line = first_line_number + data.count(b"\n", 0, error.start)
        raise UsageError(
            f"could not read {source}: it is not UTF-8 text (line {line} holds the byte "
            f"{data[error.start]:#04x}); convert it to UTF-8 (e.g. iconv -f <its encoding> -t "
            "utf-8)."
        ) from None


def counted(rows, tally):
    """The rows, unchanged; `tally["rows"]` (a collections.Counter) goes up by one as each passes,
    so that a script can say how many rows it read once it has read them."""
    for row in rows:
        tally["rows"] += 1
        yield row


def text_batches(rows, batch_size):
    """Lists of up to `batch_size` of the rows' non-blank texts (a row may be None, or blank: it
    has none)."""
    texts = (text for text in rows if text is not None and text.strip())
    while batch := list(itertools.islice(texts, batch_size)):
        yield batch


def dataset_column(dataset, text_column, batch_size):
    """The `text_column` of every row, read in Arrow batches; a streamed dataset knows its columns
    only then."""
    for table in dataset.with_format("arrow").iter(batch_size=batch_size):
        check_text_column(text_column, table.column_names)
        yield from table.column(text_column).to_pylist()


def reading_errors_as_usage_errors(rows, source):
    """The rows; a streamed source fails while it is read (bad encoding, malformed JSON), not when
    opened."""
    iterator = iter(rows)
    while True:
        try:
            row = next(iterator)
        except StopIteration:
            return
        except UsageError:
            raise
        except Exception as error:
            raise UsageError(cannot_read(source, error)) from None
        yield row


def cannot_read(source, error):
    return f"could not read {source}: {first_line(error)}; check the path or name."
