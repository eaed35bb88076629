import re

import pytest

import prepare_tfrecord_shards as prepare
from conftest import MAX_LENGTH, SHARD_SIZE, make_corpus_lines, read_lines, write_lines

SHARD_NAME = re.compile(r"^(?P<split>train|validation|test)-(?P<index>\d{5})-(?P<count>\d+)\.tfrecord$")


def run_prepare(train_file, tokenizer_dir, output_dir, *extra, split="train", max_length=MAX_LENGTH):
    argv = [
        f"--{split}_file", str(train_file),
        "--split", split,
        "--tokenizer_name_or_path", str(tokenizer_dir),
        "--max_length", str(max_length),
        "--output_dir", str(output_dir),
    ]  # fmt: skip
    return prepare.main(prepare.parse_args(argv + [str(arg) for arg in extra]))


def expected_sequences(tokenizer, path, max_length):
    """The packing, computed independently: `[CLS] line [SEP]` for each non-blank line, all concatenated,
    cut into max_length pieces, only the final remainder dropped."""
    stream = []
    for line in read_lines(path):
        if line.strip():
            stream.extend(tokenizer(line)["input_ids"])
    full = len(stream) // max_length * max_length
    return [stream[start : start + max_length] for start in range(0, full, max_length)], len(stream) - full


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
        assert match["split"] == split and int(match["index"]) == index
        records = read_records([path])
        assert int(match["count"]) == len(records) == manifest["shards"][index]["records"]
        assert all(len(record) == MAX_LENGTH for record in records)


def test_manifest_agrees_with_the_shards(shards_dir, tokenizer_dir, tokenizer, corpus, read_manifest, read_records):
    split_dir = shards_dir / "train"
    manifest = read_manifest(split_dir)
    records = all_records(split_dir, manifest, read_records)
    assert manifest["split"] == "train"
    assert manifest["max_length"] == MAX_LENGTH
    assert manifest["records"] == len(records) == sum(shard["records"] for shard in manifest["shards"])
    assert manifest["tokens"] == manifest["records"] * manifest["max_length"] == sum(map(len, records))
    assert manifest["vocab_size"] == len(tokenizer)
    assert manifest["tokenizer"] == str(tokenizer_dir)
    assert manifest["features"] == {"input_ids": {"dtype": "int64", "shape": [MAX_LENGTH]}}
    ids = manifest["special_token_ids"]
    for name in ("cls", "sep", "pad", "unk", "mask"):
        assert ids[name] == getattr(tokenizer, f"{name}_token_id")
    assert manifest["documents"] == sum(1 for line in read_lines(corpus["train"]) if line.strip())
    assert max(max(record) for record in records) < manifest["vocab_size"]


@pytest.mark.parametrize("split", ["train", "validation"])
def test_records_are_the_packed_token_stream(shards_dir, tokenizer, corpus, read_manifest, read_records, split):
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
    assert manifest["shards"] == [{"file": f"train-00000-{records}.tfrecord", "records": records}]
    assert [path.name for path in shard_files(tmp_path / "train")] == [f"train-00000-{records}.tfrecord"]
    expected = all_records(shards_dir / "train", read_manifest(shards_dir / "train"), read_records)
    assert read_records(shard_files(tmp_path / "train")) == expected


def test_no_temporary_files_remain(shards_dir):
    leftovers = [path for path in shards_dir.rglob("*") if path.name.endswith(".tmp") or path.name.startswith(".")]
    assert leftovers == []
    assert sorted(path.name for path in shards_dir.iterdir()) == ["train", "validation"]


def test_num_proc_2_gives_identical_shards(shards_dir, tokenizer_dir, corpus, tmp_path):
    manifest = run_prepare(corpus["train"], tokenizer_dir, tmp_path, "--num_proc", 2, "--shard_size", SHARD_SIZE)
    reference = shards_dir / "train"
    assert [path.name for path in shard_files(tmp_path / "train")] == [path.name for path in shard_files(reference)]
    for path in shard_files(reference):
        assert (tmp_path / "train" / path.name).read_bytes() == path.read_bytes(), path.name
    assert manifest["records"] == sum(shard["records"] for shard in manifest["shards"])


@pytest.mark.parametrize("batch_size", [1, 7])
def test_batch_size_does_not_change_the_records(shards_dir, tokenizer_dir, corpus, tmp_path, batch_size):
    # With --batch_size 1 every blank line is a batch of its own with no text left to tokenize.
    run_prepare(corpus["train"], tokenizer_dir, tmp_path, "--batch_size", batch_size, "--shard_size", SHARD_SIZE)
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


def test_jsonl_input_with_text_column(tokenizer_dir, tokenizer, tmp_path, read_records):
    import json

    lines = make_corpus_lines(80, seed=11)
    path = tmp_path / "validation.jsonl"
    rows = [{"body": line if line else None, "n": index} for index, line in enumerate(lines)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    manifest = run_prepare(path, tokenizer_dir, tmp_path / "out", "--text_column", "body", split="validation")
    expected, _ = expected_sequences(tokenizer, write_lines(tmp_path / "same.txt", lines), MAX_LENGTH)
    assert read_records(shard_files(tmp_path / "out" / "validation")) == expected
    assert manifest["split"] == "validation" and manifest["source"] == str(path)


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
    assert [path.name for path in shard_files(split_dir)] == [shard["file"] for shard in second["shards"]]
    assert len(second["shards"]) == 1
    assert read_manifest(split_dir) == second
    assert second["records"] == first["records"]
    reference = shards_dir / "train"
    assert read_records(shard_files(split_dir)) == read_records(shard_files(reference))


def test_splits_share_an_output_dir(shards_dir, read_manifest):
    train, validation = read_manifest(shards_dir / "train"), read_manifest(shards_dir / "validation")
    assert train["split"] == "train" and validation["split"] == "validation"
    assert train["vocab_size"] == validation["vocab_size"] and train["max_length"] == validation["max_length"]
    assert all(name.startswith("validation-") for name in (s["file"] for s in validation["shards"]))


def test_too_little_text_for_one_sequence_leaves_nothing(tokenizer_dir, tmp_path):
    short = write_lines(tmp_path / "short.txt", ["the river", "", "the city"])
    with pytest.raises(prepare.UsageError, match="fewer than one sequence"):
        run_prepare(short, tokenizer_dir, tmp_path / "out")
    assert not list((tmp_path / "out").rglob("*.tfrecord"))
    assert not list((tmp_path / "out").rglob("manifest.json"))
    assert not [path for path in (tmp_path / "out").rglob("*") if path.name.endswith(".tmp")]


def test_dataset_name_path_selects_the_split(corpus, tokenizer_dir, tokenizer, read_manifest, read_records, tmp_path):
    """--dataset_name goes through load_dataset(name, config, split): the route a Hub id takes. A local
    folder with train.txt and validation.txt is a dataset that route can load offline."""
    dataset_dir = tmp_path / "dataset"
    dataset_dir.mkdir()
    for split in ("train", "validation"):
        (dataset_dir / f"{split}.txt").write_bytes(corpus[split].read_bytes())
    argv = [
        "--dataset_name", str(dataset_dir),
        "--dataset_config", "default",
        "--split", "validation",
        "--tokenizer_name_or_path", str(tokenizer_dir),
        "--max_length", str(MAX_LENGTH),
        "--output_dir", str(tmp_path / "shards"),
    ]  # fmt: skip
    prepare.main(prepare.parse_args(argv))
    split_dir = tmp_path / "shards" / "validation"
    manifest = read_manifest(split_dir)
    expected, _ = expected_sequences(tokenizer, corpus["validation"], MAX_LENGTH)
    assert all_records(split_dir, manifest, read_records) == expected

    argv[argv.index("validation")] = "test"  # the folder has no test split
    with pytest.raises(prepare.UsageError, match=r"Unknown split \"test\""):
        prepare.main(prepare.parse_args(argv))
    assert not (tmp_path / "shards" / "test").exists()
