"""run_classifier.py's labelled data: a training and a validation split of texts (or text pairs)
with integer labels, from a Hub dataset or from local .tsv, .csv or .jsonl files.

Everything is read into memory and checked before any model is built: the columns exist, every
label is an integer of 0..n-1, the training split has every label the validation split has, and no
split is empty. Each mistake is one line that names the file or dataset, the column and the value.
A classification set fits in memory many times over (GLUE's largest, MNLI, is 393,000 pairs).
"""

import collections
import csv
import json
import os

from . import hub_datasets
from .errors import UsageError

LOCAL_FORMATS = (".tsv", ".csv", ".jsonl")


class LabelledSplit:
    """One split: `texts`, `pairs` (the second text of each example, or None), `labels` (ints) and
    `source`, how a message or the model card names where it came from."""

    def __init__(self, texts, pairs, labels, source):
        self.texts, self.pairs, self.labels, self.source = texts, pairs, labels, source

    def __len__(self):
        return len(self.labels)

    def majority_share(self, label):
        """The accuracy of answering `label` everywhere: the baseline a classifier must beat."""
        return self.labels.count(label) / len(self.labels)


def load_labelled_splits(data):
    """(train, validation, label names) as run_classifier.py's Data group `data` says: the two
    splits of local files when --train_file is given, else the "train" and "validation" splits of
    the Hub dataset (never "test": GLUE hides its test labels as -1). --limit: the first rows of the
    training split only. The label names are the dataset's own (a Hub dataset's ClassLabel:
    negative, positive), else LABEL_0, LABEL_1, ..."""
    text_column, text_pair_column = data.text_column, data.text_pair_column
    label_column, limit = data.label_column, data.limit
    columns = {"--text_column": text_column, "--label_column": label_column}
    if text_pair_column:
        columns["--text_pair_column"] = text_pair_column
    names = None
    if data.train_file:
        train = read_local_file(data.train_file, "--train_file", columns, limit)
        validation = read_local_file(data.validation_file, "--validation_file", columns)
    else:
        dataset = data.dataset_name, data.dataset_config
        train, names = read_hub_split(*dataset, "train", columns, limit)
        validation, _ = read_hub_split(*dataset, "validation", columns)
    splits = []
    for values, source in (train, validation):
        labels = integer_labels(values[label_column], label_column, source)
        pairs = values[text_pair_column] if text_pair_column else None
        splits.append(LabelledSplit(values[text_column], pairs, labels, source))
    count = check_labels(*splits, label_column)
    return (*splits, names or [f"LABEL_{label}" for label in range(count)])


def read_local_file(path, flag, columns, limit=None):
    """({column: its values}, `path`) for one .tsv (tab-separated, no quoting, as GLUE ships it),
    .csv or .jsonl file with a header (or keys) naming `columns`."""
    extension = os.path.splitext(path)[1].lower()
    if extension not in LOCAL_FORMATS:
        raise UsageError(
            f"{flag} {path} is not one of {', '.join(LOCAL_FORMATS)}; pass a labelled file in one "
            "of those formats (a header row naming the columns), or a Hub dataset with "
            "--dataset_name."
        )
    if not os.path.isfile(path):
        raise UsageError(f"{flag} {path} does not exist; pass a {extension} file.")
    try:
        with open(path, encoding="utf-8", newline="") as file:
            rows = list(rows_of(file, extension, path, limit))
    except UnicodeDecodeError as error:
        raise UsageError(
            f"{flag} {path} is not UTF-8 text ({error.reason} at byte {error.start}); convert it "
            "to UTF-8."
        ) from None
    if not rows:
        raise UsageError(f"{flag} {path} holds no examples; pass a file with at least one row.")
    return table(rows, columns, f"{flag} {path}"), path


def rows_of(file, extension, path, limit):
    """The rows of an open file as dicts, the first `limit` of them (all when None)."""
    if extension == ".jsonl":
        lines = (line for line in file if line.strip())
        rows = (json_row(line, number, path) for number, line in enumerate(lines, start=1))
    elif extension == ".tsv":
        rows = csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        rows = csv.DictReader(file)
    for number, row in enumerate(rows):
        if limit is not None and number >= limit:
            return
        yield row


def json_row(line, number, path):
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        row = error
    if not isinstance(row, dict):
        raise UsageError(
            f"{path}: example {number} is not a JSON object ({str(row)[:80]}); write one object "
            'a line, e.g. {"sentence": "...", "label": 1}.'
        )
    return row


def table(rows, columns, source):
    """{column: [value of each row]} for the `columns` ({flag: column}); a column that the data does
    not have is one line that lists those it has."""
    check_columns(columns, list(rows[0]), source)
    values = {column: [row.get(column) for row in rows] for column in columns.values()}
    for column in columns.values():
        if None in values[column]:
            number = values[column].index(None) + 1
            raise UsageError(
                f"{source}: example {number} has no value in column {column!r}; every example "
                "needs one."
            )
    return values


def check_columns(columns, present, source):
    for flag, column in columns.items():
        if column not in present:
            raise UsageError(
                f"{source} has no column {column!r} ({flag}); its columns are "
                f"{', '.join(map(str, present))}: pass the right {flag}."
            )


def read_hub_split(dataset_name, dataset_config, split, columns, limit=None):
    """({column: its values}, source) and the label names of a Hub dataset's split (None when its
    label column is not a ClassLabel), through the same datasets call as the other steps."""
    source = f"{dataset_name}/{dataset_config} {split}"
    dataset = hub_datasets.load_split(split, dataset_name, dataset_config)
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    if len(dataset) == 0:
        raise UsageError(f"the {source} split holds no examples; pass a dataset that has some.")
    check_columns(columns, dataset.column_names, source)
    names = getattr(dataset.features[columns["--label_column"]], "names", None)
    rows = dataset.select_columns(list(columns.values())).to_list()
    return (table(rows, columns, source), source), names


def integer_labels(values, label_column, source):
    """Each label as an int: ints, or the text of one in a .tsv or .csv file."""
    labels = []
    for number, value in enumerate(values, start=1):
        try:
            if isinstance(value, bool) or isinstance(value, float):
                raise ValueError
            labels.append(int(value))
        except (TypeError, ValueError):
            raise UsageError(
                f"{source}: the label of example {number} in column {label_column!r} is "
                f"{value!r}, not an integer; labels must be the integers 0..n-1 (map names to "
                "numbers first)."
            ) from None
    return labels


def check_labels(train, validation, label_column):
    """The number of labels n: the training split has each of 0..n-1, at least two, and the
    validation split none other."""
    counts = collections.Counter(train.labels)
    count = max(counts) + 1
    if min(counts) < 0 or len(counts) != count:
        raise UsageError(
            f"{train.source}: the labels in column {label_column!r} are {sorted(counts)[:12]}, "
            f"not the integers 0..n-1 each at least once; renumber them from 0."
        )
    if count < 2:
        raise UsageError(
            f"{train.source}: every example has label {train.labels[0]}, so there is nothing to "
            "learn; pass data with at least two labels (or a larger --limit)."
        )
    unknown = sorted(set(validation.labels) - set(counts))
    if unknown:
        hidden = " (GLUE marks the hidden labels of its test splits -1)" if -1 in unknown else ""
        raise UsageError(
            f"{validation.source} has label(s) {unknown[:12]} that the training split "
            f"{train.source} lacks{hidden}; the classifier can only learn labels it is trained on."
        )
    return count
