"""Reading a corpus: local or gs:// files (one, or a glob over many), or a Hub dataset, as a stream
of texts.

train_unigram.py and prepare_tfrecord_shards.py declare their corpus flags (`add_corpus_flags`) and
read their input through here, so both accept the same files and refuse bad ones in the same words.
Plain text, whatever its extension (.txt, WikiText's .raw or .tokens, none), is read line by line
without datasets (one document per line, split exactly as datasets' "text" builder splits it), from
local disk or gs://; the tabular formats (.json/.jsonl, .csv, .parquet, local) and Hub datasets go
through datasets, which can stream a Hub dataset rather than download it. Reading errors that only
show midway (bad encoding, malformed JSON) become one line too. Nothing here needs TensorFlow but
gs:// reading in one process: the Beam workers of prepare_tfrecord_shards.py read text through here.
"""

import glob
import itertools
import os

import numpy as np

from . import storage
from .errors import UsageError, first_line, positive_int
from .tf_startup import tensorflow_startup_log_held_back

# Tabular formats, read by their datasets builder; any other file is plain text, one document per
# line (.txt, WikiText's .raw and .tokens, no extension at all...).
TABULAR_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
# Files that are not text but would partly decode as text: refused by name, not read as garbage.
NOT_TEXT = (
    ".gz",
    ".bz2",
    ".xz",
    ".zst",
    ".zip",
    ".tar",
    ".7z",
    ".docx",
    ".doc",
    ".odt",
    ".pdf",
    ".xlsx",
    ".arrow",
)


DEFAULT_DATASET = "wikitext"
DEFAULT_DATASET_CONFIG = "wikitext-103-raw-v1"


def add_corpus_flags(parser, splits):
    """Declare the flags that say where a corpus comes from, for both data scripts: a --<split>_file
    for each of `splits`, or a Hub dataset (WikiText-103 by default), and how to read it. Returns
    the argument group, for a script to add its own reading flags to."""
    data = parser.add_argument_group("data: local or gs:// files, or a Hub dataset (the default)")
    add = data.add_argument
    for split in splits:
        add(
            f"--{split}_file",
            help=f"The {split} split: a file, or a quoted glob over files read in sorted order "
            "('corpus/*.txt'), local or gs://. Plain text is one document per line under any "
            "extension; local .json/.jsonl, .csv and .parquet files are read by --text_column. "
            "Without it, the split comes from --dataset_name.",
        )
    add(
        "--dataset_name",
        default=DEFAULT_DATASET,
        help=f"The Hub dataset to read when no file is given, or a local folder laid out as one "
        f"(default: {DEFAULT_DATASET}).",
    )
    add(
        "--dataset_config",
        default=DEFAULT_DATASET_CONFIG,
        help=f"Which configuration of the Hub dataset (default: {DEFAULT_DATASET_CONFIG}).",
    )
    add(
        "--text_column",
        default="text",
        help="The column that holds the text in a dataset or a tabular file (default: text).",
    )
    add("--limit", type=positive_int, help="Read only the first LIMIT rows of the split.")
    add(
        "--streaming",
        action="store_true",
        help="Read the dataset as a stream instead of downloading the whole split into the "
        "datasets cache first: nothing is written to the cache, so a corpus larger than the disk "
        "will do (with --limit, only its first rows are read). Plain text files are always read "
        "line by line.",
    )
    add(
        "--trust_remote_code",
        action="store_true",
        help="Let a Hub repository run the code it ships to load its dataset or tokenizer; only "
        "for repositories you trust.",
    )
    return data


def local_format(path):
    """The datasets builder that reads `path`: json, csv or parquet by extension, "text" for
    anything else."""
    return TABULAR_FORMATS.get(os.path.splitext(path)[1].lower(), "text")


def check_corpus_file(path, flag, in_glob=False):
    """A local corpus file must exist, hold something (a glob may match empty files), and not be a
    compressed or document format."""
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a folder; pass a path to a text corpus file.")
    if not os.path.isfile(path):
        raise UsageError(f"{flag} {path} does not exist; pass a path to a text corpus file.")
    if os.path.getsize(path) == 0 and not in_glob:
        raise UsageError(f"{flag} {path} is empty; pass a file with text in it.")
    check_not_binary(path, flag)


def check_not_binary(path, flag):
    extension = os.path.splitext(path)[1].lower()
    if extension in NOT_TEXT:
        raise UsageError(
            f"{flag} {path} has extension {extension!r}, a compressed or document format; pass "
            "plain text (one document per line, any other extension) or one of "
            f"{sorted(TABULAR_FORMATS)}."
        )


def check_text_column(text_column, columns):
    if text_column not in columns:
        raise UsageError(
            f"--text_column {text_column!r} is not in the data, whose columns are {columns}; "
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
    formats = sorted({local_format(path) for path in files})
    if len(formats) > 1:
        raise UsageError(
            f"{flag} {pattern} matches files of several formats ({', '.join(formats)}); match one."
        )
    for path in files:
        check_not_binary(path, flag) if remote else check_corpus_file(path, flag, in_glob=True)
    if remote and formats != ["text"]:
        raise UsageError(
            f"{flag} {pattern}: gs:// corpora are read as plain text (one document per line, any "
            f"extension); copy {formats[0]} files to a local folder, or convert them to text."
        )
    return files


def has_glob(path):
    return any(character in path for character in "*?[")


def open_binary(path):
    """A corpus file opened to read bytes: a local path with open(), gs:// with TensorFlow's file
    system."""
    if storage.is_remote(path):
        import tensorflow as tf

        return tf.io.gfile.GFile(path, "rb")
    return open(path, "rb")


def text_file_lines(path, text_column="text"):
    """The lines of a local or gs:// text file, as datasets' "text" builder splits them (see
    text_lines). Its one column is "text"."""
    check_text_column(text_column, ["text"])
    try:
        with open_binary(path) as file:
            yield from text_lines(file, path)
    except OSError as error:
        raise UsageError(f"could not read {path}: {first_line(error)}; check the file.") from None


READ_BYTES = 1 << 22  # 4 MiB a read: few requests to Cloud Storage, little memory


def normalize_newlines(data):
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def text_lines(binary_file, source, first_line_number=1):
    """The lines of UTF-8 text read as bytes from `binary_file`, without their line breaks, split as
    Python's text mode and datasets' "text" builder split them: \n, \r\n and a lone \r each end a
    line, and a last line without a break counts. Both paths of prepare_tfrecord_shards.py read text
    through here, the Beam workers one block of a file at a time (block_starts says where each
    starts), the single process whole files, so the two see the same lines. `first_line_number`
    numbers the lines in an error message."""
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


def block_starts(binary_file, rows_per_block):
    """Where each block of `rows_per_block` lines of a text file starts, as byte offsets (the first
    is 0), and the file's line count, the lines counted as text_lines splits them. With these a Beam
    worker reads any block of a file by seeking to its start. Line breaks are found with numpy, at
    memory speed: this first pass over a file costs far less than tokenizing it."""
    starts, breaks, size, last_end, held = [0], 0, 0, 0, b""
    while True:
        chunk = binary_file.read(READ_BYTES)
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


def load_split(split, path, dataset_name, dataset_config, trust_remote_code=False, streaming=False):
    """A split as a datasets object: local files (a path, or the list input_files gives), or a Hub
    dataset's split. Without `streaming` it is downloaded to (or, for local files, converted into)
    the datasets cache first; with it, rows are read as they are used: nothing is copied to the
    cache and memory stays flat, whatever the corpus's size."""
    import datasets

    try:
        if path is not None:
            files = [path] if isinstance(path, str) else list(path)
            data_files = {split: files}
            return datasets.load_dataset(
                local_format(files[0]), data_files=data_files, split=split, streaming=streaming
            )
        # only this split's files are fetched
        extra = {"trust_remote_code": True} if trust_remote_code else {}
        return datasets.load_dataset(
            dataset_name, dataset_config, split=split, streaming=streaming, **extra
        )
    except Exception as error:
        # datasets raises many kinds; the user needs the source and the first reason
        raise UsageError(cannot_read(path or f"{dataset_name}/{dataset_config}", error)) from None


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
