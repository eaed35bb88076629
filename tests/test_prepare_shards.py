import itertools
import json
import os
import random
import re
import shutil
import time

import pytest
from helpers import (
    MAX_LENGTH,
    SHARD_SIZE,
    dataset_files,
    flags,
    make_corpus_lines,
    prepare_flags,
    read_lines,
    write_hub_layout,
    write_lines,
)
from refusals import PREPARE, case, refused, refused_command

import prepare_tfrecord_shards as prepare
from mlm_pipeline import corpus, packing


@pytest.fixture
def shard_writing():
    """The script's engine (mlm_pipeline/shard_writing.py), imported by the test that needs it: it
    loads TensorFlow and transformers, which must wait until conftest.py has moved the caches."""
    from mlm_pipeline import shard_writing

    return shard_writing


SHARD_NAME = re.compile(
    r"^(?P<split>train|validation|test)-(?P<block>\d{5})-(?P<index>\d{5})-(?P<count>\d+)\.tfrecord$"
)


def run_prepare(
    train_file, tokenizer_dir, output_dir, *extra, split="train", max_length=MAX_LENGTH
):
    sizes = dict(max_length=max_length, shard_size=None)
    argv = prepare_flags({split: train_file}, tokenizer_dir, split, output_dir, **sizes)
    return prepare.main(prepare.parse_args(argv + [str(arg) for arg in extra]))


def expected_sequences(tokenizer, path, max_length):
    """The packing, computed independently: `[CLS] line [SEP]` for each non-blank line, all
    concatenated, cut into max_length pieces, only the final remainder dropped."""
    stream = []
    for line in read_lines(path):
        if line.strip():
            stream.extend(tokenizer(line)["input_ids"])
    full = len(stream) // max_length * max_length
    return [stream[start : start + max_length] for start in range(0, full, max_length)], len(
        stream
    ) - full


def shard_files(split_dir):
    return sorted(path for path in split_dir.iterdir() if path.suffix == ".tfrecord")


def all_records(split_dir, manifest, read_records, max_length=MAX_LENGTH):
    return read_records([split_dir / shard["file"] for shard in manifest["shards"]], max_length)


@pytest.mark.parametrize("split", ["train", "validation"])
def test_shard_names_and_counts(shards_dir, read_manifest, read_records, split):
    split_dir = shards_dir / split
    manifest = read_manifest(split_dir)
    files = shard_files(split_dir)
    assert files, "no shards written"
    assert [shard["file"] for shard in manifest["shards"]] == [path.name for path in files]
    for index, path in enumerate(files):
        match = SHARD_NAME.match(path.name)
        assert match, path.name
        # The fixture splits are smaller than one block of --rows_per_block rows: all
        # their shards are block 0's.
        assert match["split"] == split and int(match["block"]) == 0 and int(match["index"]) == index
        records = read_records([path])
        assert int(match["count"]) == len(records) == manifest["shards"][index]["records"]
        # what training checks for truncation
        assert manifest["shards"][index]["bytes"] == path.stat().st_size
        assert all(len(record) == MAX_LENGTH for record in records)


def test_manifest_agrees_with_the_shards(
    shards_dir, tokenizer_dir, tokenizer, corpus, read_manifest, read_records
):
    split_dir = shards_dir / "train"
    manifest = read_manifest(split_dir)
    records = all_records(split_dir, manifest, read_records)
    assert manifest["split"] == "train"
    assert manifest["max_length"] == MAX_LENGTH
    assert (
        manifest["records"] == len(records) == sum(shard["records"] for shard in manifest["shards"])
    )
    assert (
        manifest["tokens"] == manifest["records"] * manifest["max_length"] == sum(map(len, records))
    )
    assert manifest["vocab_size"] == len(tokenizer)
    assert manifest["tokenizer"] == str(tokenizer_dir)
    assert manifest["features"] == {"input_ids": {"dtype": "int64", "shape": [MAX_LENGTH]}}
    ids = manifest["special_token_ids"]
    for name in ("cls", "sep", "pad", "unk", "mask"):
        assert ids[name] == getattr(tokenizer, f"{name}_token_id")
    assert manifest["documents"] == sum(1 for line in read_lines(corpus["train"]) if line.strip())
    # Smaller than one block of the default --rows_per_block: packed as one
    # stream, as before blocks existed.
    assert manifest["rows"] == len(read_lines(corpus["train"])) < manifest["rows_per_block"]
    assert manifest["blocks"] == 1
    assert max(max(record) for record in records) < manifest["vocab_size"]


@pytest.mark.parametrize("split", ["train", "validation"])
def test_records_are_the_packed_token_stream(
    shards_dir, tokenizer, corpus, read_manifest, read_records, split
):
    split_dir = shards_dir / split
    manifest = read_manifest(split_dir)
    expected, dropped = expected_sequences(tokenizer, corpus[split], MAX_LENGTH)
    assert len(expected) > 1
    assert all_records(split_dir, manifest, read_records) == expected
    assert manifest["dropped_tokens"] == dropped < MAX_LENGTH
    # No padding: documents run across sequence boundaries, so the pad id never appears.
    assert all(tokenizer.pad_token_id not in record for record in expected)


def test_shard_size_splits_the_records(shards_dir, read_manifest):
    manifest = read_manifest(shards_dir / "train")
    counts = [shard["records"] for shard in manifest["shards"]]
    assert manifest["records"] > 2 * SHARD_SIZE, "the fixture corpus should fill several shards"
    assert counts[:-1] == [SHARD_SIZE] * (len(counts) - 1)
    assert 0 < counts[-1] <= SHARD_SIZE
    assert len(counts) == -(-manifest["records"] // SHARD_SIZE)


def test_shard_size_dividing_the_records_exactly_leaves_no_empty_shard(
    shards_dir, tokenizer_dir, corpus, tmp_path, read_manifest, read_records
):
    records = read_manifest(shards_dir / "train")["records"]
    manifest = run_prepare(corpus["train"], tokenizer_dir, tmp_path, "--shard_size", records)
    only = shard_files(tmp_path / "train")[0]
    assert manifest["shards"] == [
        {
            "file": f"train-00000-00000-{records}.tfrecord",
            "records": records,
            "bytes": only.stat().st_size,
        }
    ]
    assert [path.name for path in shard_files(tmp_path / "train")] == [
        f"train-00000-00000-{records}.tfrecord"
    ]
    expected = all_records(shards_dir / "train", read_manifest(shards_dir / "train"), read_records)
    assert read_records(shard_files(tmp_path / "train")) == expected


def test_no_temporary_files_remain(shards_dir):
    leftovers = [
        path
        for path in shards_dir.rglob("*")
        if path.name.endswith(".tmp") or path.name.startswith(".")
    ]
    assert leftovers == []
    assert sorted(path.name for path in shards_dir.iterdir()) == ["train", "validation"]


@pytest.mark.parametrize("num_proc", [1, 2, 5])
def test_num_proc_gives_identical_shards(shards_dir, tokenizer_dir, corpus, tmp_path, num_proc):
    manifest = run_prepare(
        corpus["train"], tokenizer_dir, tmp_path, "--num_proc", num_proc, "--shard_size", SHARD_SIZE
    )
    reference = shards_dir / "train"
    assert [path.name for path in shard_files(tmp_path / "train")] == [
        path.name for path in shard_files(reference)
    ]
    for path in shard_files(reference):
        assert (tmp_path / "train" / path.name).read_bytes() == path.read_bytes(), path.name
    assert manifest["records"] == sum(shard["records"] for shard in manifest["shards"])


@pytest.mark.parametrize("batch_size", [1, 7, 100000])
def test_batch_size_does_not_change_the_records(
    shards_dir, tokenizer_dir, corpus, tmp_path, batch_size
):
    # 1: one line per call; 100000: the whole split in one call.
    run_prepare(
        corpus["train"],
        tokenizer_dir,
        tmp_path,
        "--batch_size",
        batch_size,
        "--shard_size",
        SHARD_SIZE,
    )
    reference = shards_dir / "train"
    assert [path.read_bytes() for path in shard_files(tmp_path / "train")] == [
        path.read_bytes() for path in shard_files(reference)
    ]


def test_limit_uses_only_the_first_rows(tokenizer_dir, tokenizer, corpus, tmp_path, read_records):
    head = write_lines(tmp_path / "head.txt", read_lines(corpus["train"])[:150])
    manifest = run_prepare(corpus["train"], tokenizer_dir, tmp_path / "out", "--limit", 150)
    expected, _ = expected_sequences(tokenizer, head, MAX_LENGTH)
    assert read_records(shard_files(tmp_path / "out" / "train")) == expected
    assert manifest["records"] == len(expected)


@pytest.mark.parametrize("name", ["wiki.train.raw", "wiki.train.tokens", "train"])
def test_plain_text_under_any_extension_is_read_as_text(
    shards_dir, tokenizer_dir, corpus, tmp_path, read_records, name
):
    """WikiText's own files (and a file with no extension) need no renaming to .txt: the same
    shards."""
    path = tmp_path / name
    path.write_bytes(corpus["train"].read_bytes())
    run_prepare(path, tokenizer_dir, tmp_path / "out", "--shard_size", SHARD_SIZE)
    written = [
        (tmp_path / "out" / "train" / item.name).read_bytes()
        for item in shard_files(shards_dir / "train")
    ]
    assert written == [item.read_bytes() for item in shard_files(shards_dir / "train")]


def test_jsonl_input_with_text_column(tokenizer_dir, tokenizer, tmp_path, read_records):
    lines = make_corpus_lines(80, seed=11)
    path = tmp_path / "validation.jsonl"
    rows = [{"body": line if line else None, "n": index} for index, line in enumerate(lines)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    manifest = run_prepare(
        path, tokenizer_dir, tmp_path / "out", "--text_column", "body", split="validation"
    )
    expected, _ = expected_sequences(
        tokenizer, write_lines(tmp_path / "same.txt", lines), MAX_LENGTH
    )
    assert read_records(shard_files(tmp_path / "out" / "validation")) == expected
    assert manifest["split"] == "validation" and manifest["source"] == str(path)
    assert manifest["documents"] == sum(1 for line in lines if line.strip())


def test_finished_split_is_refused_without_overwrite(
    shards_dir, tokenizer_dir, corpus, tmp_path, read_manifest, read_records
):
    first = run_prepare(corpus["train"], tokenizer_dir, tmp_path, "--shard_size", 40)
    split_dir = tmp_path / "train"
    before = {path.name: path.read_bytes() for path in split_dir.iterdir()}
    assert len(first["shards"]) > 1

    with pytest.raises(prepare.UsageError, match="--overwrite_output_dir"):
        run_prepare(corpus["train"], tokenizer_dir, tmp_path)
    assert {path.name: path.read_bytes() for path in split_dir.iterdir()} == before

    second = run_prepare(corpus["train"], tokenizer_dir, tmp_path, "--overwrite_output_dir")
    # The old shards are gone, not mixed with the new ones.
    assert [path.name for path in shard_files(split_dir)] == [
        shard["file"] for shard in second["shards"]
    ]
    assert len(second["shards"]) == 1
    assert read_manifest(split_dir) == second
    assert second["records"] == first["records"]
    reference = shards_dir / "train"
    assert read_records(shard_files(split_dir)) == read_records(shard_files(reference))


def test_splits_share_an_output_dir(shards_dir, read_manifest):
    train, validation = (
        read_manifest(shards_dir / "train"),
        read_manifest(shards_dir / "validation"),
    )
    assert train["split"] == "train" and validation["split"] == "validation"
    assert (
        train["vocab_size"] == validation["vocab_size"]
        and train["max_length"] == validation["max_length"]
    )
    assert all(name.startswith("validation-") for name in (s["file"] for s in validation["shards"]))


def test_too_little_text_for_one_sequence_leaves_nothing(tokenizer_dir, tmp_path):
    short = write_lines(tmp_path / "short.txt", ["the river", "", "the city"])
    with pytest.raises(prepare.UsageError, match="fewer than one sequence"):
        run_prepare(short, tokenizer_dir, tmp_path / "out")
    assert not list((tmp_path / "out").rglob("*.tfrecord"))
    assert not list((tmp_path / "out").rglob("manifest.json"))
    assert not [path for path in (tmp_path / "out").rglob("*") if path.name.endswith(".tmp")]


def test_dataset_name_path_selects_the_split(
    corpus, tokenizer_dir, tokenizer, read_manifest, read_records, tmp_path
):
    """--dataset_name goes through load_dataset(name, config, split): the route a Hub id takes. A
    local folder with train.txt and validation.txt is a dataset that route can load offline."""
    dataset_dir = tmp_path / "dataset"
    dataset_dir.mkdir()
    for split in ("train", "validation"):
        (dataset_dir / f"{split}.txt").write_bytes(corpus[split].read_bytes())
    argv = flags(
        dataset_name=dataset_dir,
        dataset_config="default",
        split="validation",
        tokenizer_name_or_path=tokenizer_dir,
        max_length=MAX_LENGTH,
        output_dir=tmp_path / "shards",
    )
    prepare.main(prepare.parse_args(argv))
    split_dir = tmp_path / "shards" / "validation"
    manifest = read_manifest(split_dir)
    expected, _ = expected_sequences(tokenizer, corpus["validation"], MAX_LENGTH)
    assert all_records(split_dir, manifest, read_records) == expected

    argv[argv.index("validation")] = "test"  # the folder has no test split
    with pytest.raises(prepare.UsageError, match=r"Unknown split \"test\""):
        prepare.main(prepare.parse_args(argv))
    assert not (tmp_path / "shards" / "test").exists()


# --------------------------------------------------------------------------------------------------
# The fast paths give exactly what the straightforward code gives; bad input
# midway leaves nothing behind


EDGE_IDS = [
    0,
    1,
    127,
    128,
    255,
    16383,
    16384,
    2**21 - 1,
    2**21,
    2**31 - 1,
    2**32,
    2**56 - 1,
    2**56,
    2**63 - 1,
]
EDGE_IDS += [-1, -2, -128, -(2**31), -(2**63)]


def rows_of_every_kind(max_length, seed):
    """Rows of small ids, of vocabulary-sized ids, of random ids of every varint size (1 to 10
    bytes, negative ones included), of edge values, and of the largest and the negative ids, whose
    long rows need multi-byte lengths at every level of the Example."""
    import numpy as np

    rng = np.random.default_rng(seed)
    shifts = rng.integers(0, 64, size=max_length)
    any_size = (
        rng.integers(-(2**63), 2**63 - 1, size=max_length, dtype=np.int64, endpoint=True) >> shifts
    )
    rows = [
        rng.integers(0, 128, size=max_length),
        rng.integers(0, 50000, size=max_length),
        any_size,
        np.resize(np.array(EDGE_IDS, dtype=np.int64), max_length),
        np.full(max_length, 2**63 - 1),
        np.full(max_length, -1),
    ]
    return np.stack(rows).astype(np.int64)


@pytest.mark.parametrize("max_length", [2, 3, 15, 128, 129, 1700])
def test_serialize_is_byte_identical_to_tf_train_example(max_length, shard_writing):
    """Beam's workers encode records without TensorFlow: the same bytes as the script's
    tf.train.Example, the record as the single process writes it."""
    rows = rows_of_every_kind(max_length, seed=max_length)
    expected = [shard_writing.tf_example(row).SerializeToString() for row in rows]
    assert packing.serialize_examples(rows) == expected


def test_serialize_of_no_rows_is_nothing():
    import numpy as np

    assert packing.serialize_examples(np.zeros((0, 128), dtype=np.int64)) == []


def test_tfrecord_bytes_are_what_tensorflows_writer_writes(tmp_path):
    """The shards are framed without TensorFlow (Beam's workers do not have it): length, checksums,
    record."""
    import tensorflow as tf

    records = packing.serialize_examples(rows_of_every_kind(129, seed=7)) + [b"", b"x" * 300]
    path = str(tmp_path / "reference.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    assert packing.tfrecord_bytes(records) == (tmp_path / "reference.tfrecord").read_bytes()


def test_plain_text_rows_match_the_datasets_text_builder(tmp_path):
    import datasets

    # \r\n and \r are line breaks (universal newlines); \x0b, \x1c, \x85,
    # \u2028 and friends are not.
    text = (
        "\ufeffbom\r\nwindows\rold mac\n\nform\x0bfeed"
        "\x0c\x1c\x1d\x1e\x85\u2028\u2029 end\n \t \nno newline"
    )
    path = tmp_path / "tricky.txt"
    path.write_bytes(text.encode("utf-8"))
    builder = datasets.load_dataset(
        "text", data_files={"train": str(path)}, split="train", streaming=True
    )
    assert list(corpus.file_rows(str(path))) == [row["text"] for row in builder]


def flat(lists):
    return [value for values in lists for value in values]


def test_batch_encoder_gives_the_tokenizers_ids(tokenizer, shard_writing):
    texts = [line for line in make_corpus_lines(60, seed=5) if line.strip()]
    texts += [
        "[MASK] and [CLS] inside the text [SEP]",
        "  leading spaces",
        "ｆｕｌｌ width",
        "long " * 700,
    ]
    texts += ["<unk> <pad>", "trailing spaces  "]
    encode = shard_writing.BatchEncoder(tokenizer)
    assert encode.direct
    ids = encode(texts)
    assert str(ids.dtype) == "int64"
    assert ids.tolist() == flat(tokenizer(texts)["input_ids"])


def test_batch_encoder_ignores_truncation_and_padding_set_on_the_tokenizer(
    tokenizer_dir, shard_writing
):
    """transformers turns a backend's own truncation and padding off for `tokenizer(texts)`; so must
    we."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.backend_tokenizer.enable_truncation(max_length=5)
    tokenizer.backend_tokenizer.enable_padding(length=64)
    texts = [line for line in make_corpus_lines(20, seed=6) if line.strip()]
    ids = shard_writing.BatchEncoder(tokenizer)(texts).tolist()
    assert tokenizer.backend_tokenizer.truncation is not None, "the user's tokenizer was changed"
    expected = tokenizer(texts)["input_ids"]
    assert ids == flat(expected)
    assert max(map(len, expected)) > 5 and 64 not in map(len, expected)


def test_batch_encoder_keeps_the_call_of_a_class_that_rewrites_the_text(
    tokenizer_dir, tokenizer, shard_writing
):
    from transformers import PreTrainedTokenizerFast

    class Shouting(PreTrainedTokenizerFast):
        def _batch_encode_plus(self, batch_text_or_text_pairs, *args, **kwargs):
            texts = [text.upper() for text in batch_text_or_text_pairs]
            return super()._batch_encode_plus(texts, *args, **kwargs)

    shouting = Shouting.from_pretrained(str(tokenizer_dir))
    texts = ["the river crossed the old city", "a small house"]
    encode = shard_writing.BatchEncoder(shouting)
    assert not encode.direct
    assert (
        encode(texts).tolist()
        == flat(shouting(texts)["input_ids"])
        != flat(tokenizer(texts)["input_ids"])
    )


def test_in_order_keeps_the_order_and_reads_only_a_few_batches_ahead(shard_writing):
    pulled = []

    def batches():
        for index in range(10000):
            pulled.append(index)
            yield index

    def slow_square(value):
        time.sleep(random.random() / 200)  # threads finish out of order
        return value * value

    results = shard_writing.in_order(slow_square, batches(), threads=3)
    assert list(itertools.islice(results, 20)) == [value * value for value in range(20)]
    assert len(pulled) <= 20 + 2 * 3 + 1
    results.close()


@pytest.mark.parametrize("previous", [None, "true"])
def test_the_tokenizer_parallelism_setting_is_restored(
    corpus, tokenizer_dir, tmp_path, monkeypatch, previous
):
    if previous is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", previous)
    run_prepare(corpus["validation"], tokenizer_dir, tmp_path, split="validation")
    assert os.environ.get("TOKENIZERS_PARALLELISM") == previous


def output_files(folder):
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())


def test_undecodable_line_midway_is_a_usage_error_and_leaves_nothing(
    corpus, tokenizer_dir, tmp_path
):
    path = tmp_path / "train.txt"
    good = corpus["train"].read_bytes()
    path.write_bytes(good + b"caf\xe9 in Latin-1\n" + good)  # far past the first shards
    output_dir = tmp_path / "out" / "new"
    bad_line = len(read_lines(corpus["train"])) + 1
    with pytest.raises(
        prepare.UsageError,
        match=rf"could not read .*: it is not UTF-8 text \(line {bad_line} holds the byte 0xe9\)",
    ):
        run_prepare(path, tokenizer_dir, output_dir, "--batch_size", 5, "--shard_size", 5)
    # Not even the folders it created for the shards remain.
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("problem", ["wrong text column", "blank lines", "too little text"])
def test_bad_input_leaves_the_split_it_would_overwrite(
    shards_dir, tokenizer_dir, corpus, tmp_path, problem
):
    """The old split is removed only when the first new record is ready to take its place."""
    shutil.copytree(shards_dir / "validation", tmp_path / "validation")
    before = {name: (tmp_path / name).read_bytes() for name in output_files(tmp_path)}
    source, extra = corpus["validation"], []
    if problem == "wrong text column":
        extra = ["--text_column", "body"]
    elif problem == "blank lines":
        source = write_lines(tmp_path.parent / f"{tmp_path.name}-blank.txt", ["", "  ", ""])
    else:
        source = write_lines(tmp_path.parent / f"{tmp_path.name}-short.txt", ["the river"])
    with pytest.raises(prepare.UsageError):
        run_prepare(
            source, tokenizer_dir, tmp_path, "--overwrite_output_dir", *extra, split="validation"
        )
    assert {name: (tmp_path / name).read_bytes() for name in output_files(tmp_path)} == before


def test_streaming_a_hub_dataset_writes_nothing_to_the_cache(
    corpus, tokenizer_dir, datasets_cache, read_manifest, tmp_path
):
    """--streaming reads the Hub dataset as it packs it (a local folder laid out as a Hub repository
    stands in for the Hub, through the same datasets code): the shards are those of the same rows as
    a text file, and nothing lands in the datasets cache, where the same run without --streaming
    converts the whole split."""
    lines = read_lines(corpus["validation"])
    hub = write_hub_layout(tmp_path / "dataset", [lines[:50], lines[50:]])
    streamed, downloaded, from_text = (
        tmp_path / "streamed",
        tmp_path / "downloaded",
        tmp_path / "text",
    )
    for output_dir, extra in ((streamed, ["--streaming"]), (downloaded, [])):
        argv = [*hub, "--tokenizer_name_or_path", tokenizer_dir, "--max_length", MAX_LENGTH, *extra]
        prepare.main(prepare.parse_args([str(arg) for arg in [*argv, "--output_dir", output_dir]]))
        if output_dir == streamed:
            assert dataset_files(datasets_cache) == []
    assert any(path.suffix == ".arrow" for path in dataset_files(datasets_cache))
    run_prepare(corpus["validation"], tokenizer_dir, from_text)
    for output_dir in (streamed, downloaded):
        assert (
            read_manifest(output_dir / "train")["shards"]
            == read_manifest(from_text / "train")["shards"]
        )
        for shard in shard_files(from_text / "train"):
            assert (output_dir / "train" / shard.name).read_bytes() == shard.read_bytes()


# --------------------------------------------------------------------------------------------------
# Bad input, as the user meets it: prepare_tfrecord_shards.py in a subprocess (tests/refusals.py)

BAD_FLAGS_AND_FILES = [
    case(
        "prepare: no tokenizer",
        "prepare_tfrecord_shards.py --output_dir {out}",
        "--tokenizer_name_or_path",
        exit_code=2,
    ),
    case(
        "prepare: --max_length 12.5",
        PREPARE + " --max_length 12.5",
        "--max_length",
        "'12.5'",
        exit_code=2,
    ),
    case(
        "prepare: --max_length -5",
        PREPARE + " --max_length -5",
        "--max_length: -5 must be a positive",
        exit_code=2,
    ),
    case(
        "prepare: --shard_size 0",
        PREPARE + " --shard_size 0",
        "--shard_size: 0 must be a positive",
        exit_code=2,
    ),
    case(
        "prepare: --batch_size -1",
        PREPARE + " --batch_size -1",
        "--batch_size: -1 must be a positive",
        exit_code=2,
    ),
    case(
        "prepare: --limit -3",
        PREPARE + " --limit -3",
        "--limit: -3 must be a positive",
        exit_code=2,
    ),
    case(
        "prepare: --num_proc 0",
        PREPARE + " --num_proc 0",
        "--num_proc: 0 must be a positive",
        exit_code=2,
    ),
    case("prepare: unknown split", PREPARE + " --split dev", "'dev'", "train, validation, test"),
    case(
        "prepare: split without its file",
        PREPARE + " --split validation",
        "--split validation",
        "--validation_file",
    ),
    case(
        "prepare: missing corpus",
        PREPARE + " --train_file {out}.txt",
        "--train_file {out}.txt",
        "does not exist",
    ),
    case(
        "prepare: corpus is a folder",
        PREPARE + " --train_file {corpus_folder}",
        "{corpus_folder}",
        "folder",
    ),
    case(
        "prepare: zero-byte corpus",
        PREPARE + " --train_file {zero_bytes}",
        "{zero_bytes}",
        "is empty",
    ),
    case(
        "prepare: .docx corpus",
        PREPARE + " --train_file {word_document}",
        "{word_document}",
        "'.docx'",
    ),
    case(
        "prepare: output under a file",
        PREPARE + " --output_dir {a_file}/shards",
        "{a_file}/shards",
        "file",
    ),
    case(
        "prepare: split folder is a file",
        PREPARE + " --output_dir {split_is_a_file}",
        "could not write",
        "{split_is_a_file}/train",
    ),
    case(
        "prepare: missing tokenizer",
        PREPARE + " --tokenizer_name_or_path {out}_tok",
        "{out}_tok",
        "not a tokenizer",
    ),
    case(
        "prepare: tokenizer is a file",
        PREPARE + " --tokenizer_name_or_path {corpus}",
        "{corpus}",
        "not a tokenizer",
    ),
    case(
        "prepare: tokenizer folder holds none",
        PREPARE + " --tokenizer_name_or_path {empty_folder}",
        "{empty_folder}",
        "tokenizer.json",
    ),
    case(
        "prepare: shards folder as tokenizer",
        PREPARE + " --tokenizer_name_or_path {shards}",
        "{shards}",
        "tokenizer.json",
    ),
    case(
        "prepare: blank corpus",
        PREPARE + " --train_file {blank_lines}",
        "{blank_lines}",
        "no non-blank text",
    ),
    case(
        "prepare: not UTF-8, after some shards",
        PREPARE + " --train_file {not_utf8} --batch_size 5 --shard_size 5",
        "{not_utf8}",
        "not UTF-8",
        "line {not_utf8_line}",
        "0xe9",
    ),
    case(
        "prepare: --rows_per_block 0",
        PREPARE + " --rows_per_block 0",
        "--rows_per_block: 0 must be a positive",
        exit_code=2,
    ),
    case(
        "prepare: a glob matching nothing",
        PREPARE + " --train_file {out}/*.txt",
        "{out}/*.txt",
        "matches no file",
    ),
    case(
        "prepare: unknown runner",
        PREPARE + " --runner NoSuchRunner",
        "--runner NoSuchRunner",
        "DirectRunner",
    ),
    case(
        "prepare: a Beam option without --runner",
        PREPARE + " --direct_num_workers 2",
        "--direct_num_workers 2",
        "--runner",
        exit_code=2,
    ),
]


@pytest.mark.parametrize("command, needles, exit_code", BAD_FLAGS_AND_FILES)
def test_bad_flag_or_file(run_script, bad_inputs, tmp_path, command, needles, exit_code):
    refused_command(run_script, bad_inputs, tmp_path, command, needles, exit_code)


def test_prepare_refuses_to_replace_a_finished_split(
    run_script, corpus, tokenizer_dir, shards_dir, tmp_path
):
    output_dir = tmp_path / "shards"
    shutil.copytree(shards_dir / "validation", output_dir / "validation")
    args = prepare_flags(corpus, tokenizer_dir, "validation", output_dir, shard_size=None)
    needles = (output_dir / "validation", "--overwrite_output_dir")
    refused(run_script, "prepare_tfrecord_shards.py", args, output_dir, *needles)
