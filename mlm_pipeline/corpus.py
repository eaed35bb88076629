"""Reading a corpus: a local file (plain text, .json/.jsonl, .csv, .parquet) or a Hub dataset, as a stream of texts.

train_unigram.py and prepare_tfrecord_shards.py read their input through here, so both accept the same files
and refuse bad ones in the same words. Plain text, whatever its extension (.txt, WikiText's .raw or .tokens,
none), is read line by line without datasets (one document per line, split exactly as datasets' "text"
builder splits it); the tabular formats and Hub datasets go through datasets. Reading errors that only show
midway (bad encoding, malformed JSON) become one line too.
"""

import os

from .errors import UsageError, first_line

# Tabular formats, read by their datasets builder; any other file is plain text, one document per line
# (.txt, WikiText's .raw and .tokens, no extension at all...).
TABULAR_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
# Files that are not text but would partly decode as text: refused by name rather than read as garbage.
NOT_TEXT = (".gz", ".bz2", ".xz", ".zst", ".zip", ".tar", ".7z", ".docx", ".doc", ".odt", ".pdf", ".xlsx", ".arrow")


def local_format(path):
    """The datasets builder that reads `path`: json, csv or parquet by extension, "text" for anything else."""
    return TABULAR_FORMATS.get(os.path.splitext(path)[1].lower(), "text")


def check_corpus_file(path, flag):
    """A local corpus file must exist, hold something, and not be a compressed or document format."""
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a folder; pass a path to a text corpus file.")
    if not os.path.isfile(path):
        raise UsageError(f"{flag} {path} does not exist; pass a path to a text corpus file.")
    if os.path.getsize(path) == 0:
        raise UsageError(f"{flag} {path} is empty; pass a file with text in it.")
    extension = os.path.splitext(path)[1].lower()
    if extension in NOT_TEXT:
        raise UsageError(
            f"{flag} {path} has extension {extension!r}, a compressed or document format; pass plain text (one "
            f"document per line, any other extension) or one of {sorted(TABULAR_FORMATS)}."
        )


def check_text_column(text_column, columns):
    if text_column not in columns:
        raise UsageError(
            f"--text_column {text_column!r} is not in the data, whose columns are {columns}; "
            "pass the right --text_column."
        )


def text_file_lines(path, text_column="text"):
    """The lines of a text file exactly as datasets' "text" builder splits them: universal newlines (\\r\\n and
    \\r read as \\n), split on \\n only, without the line break. Its one column is "text"."""
    check_text_column(text_column, ["text"])
    try:
        with open(path, encoding="utf-8") as file:
            for line in file:
                yield line.rstrip("\n")
    except UnicodeDecodeError as error:  # found midway through, so say which file and where
        raise UsageError(
            f"could not read {path}: it is not UTF-8 text (UnicodeDecodeError: {where_not_utf8(path, error)}); "
            "convert it to UTF-8 (e.g. iconv -f <its encoding> -t utf-8)."
        ) from None
    except OSError as error:
        raise UsageError(f"could not read {path}: {first_line(error)}; check the file.") from None


def where_not_utf8(path, error):
    """Where `path` stops being UTF-8, as the user can find it: the line and its first bad byte. Text mode
    decodes ahead of the line it hands out, so the decoder's own position says little."""
    with open(path, "rb") as file:
        for number, raw in enumerate(file, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as line_error:
                return f"line {number} holds the byte {raw[line_error.start]:#04x}"
    return str(error)


def load_split(split, path, dataset_name, dataset_config, trust_remote_code=False, stream_local=True):
    """A split as a datasets object: a local file (streamed unless told otherwise, so memory stays flat and
    nothing is copied to the cache), or a Hub dataset's split, downloaded to the datasets cache."""
    import datasets

    try:
        if path is not None:
            data_files = {split: path}
            return datasets.load_dataset(local_format(path), data_files=data_files, split=split, streaming=stream_local)
        extra = {"trust_remote_code": True} if trust_remote_code else {}  # only this split's files are fetched
        return datasets.load_dataset(dataset_name, dataset_config, split=split, **extra)
    except Exception as error:  # datasets raises many kinds; the user needs the source and the first reason
        raise UsageError(cannot_read(path or f"{dataset_name}/{dataset_config}", error)) from None


def dataset_column(dataset, text_column, batch_size):
    """The `text_column` of every row, read in Arrow batches; a streamed dataset knows its columns only then."""
    for table in dataset.with_format("arrow").iter(batch_size=batch_size):
        check_text_column(text_column, table.column_names)
        yield from table.column(text_column).to_pylist()


def reading_errors_as_usage_errors(rows, source):
    """The rows; a streamed source fails while it is read (bad encoding, malformed JSON), not when opened."""
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
