"""Bad input, run as the user would: each script in a subprocess, with arguments.

Every case checks the same four promises (see `refused`): a non-zero exit; one line on stderr,
starting `<script>.py: error:` and naming the bad value; no traceback; and the output folder as it
was before (absent, or unchanged). Each distinct bad input is one test id; to list them:

    pytest tests/test_bad_input.py --collect-only -q

A few run_mlm.py checks that come after TensorFlow has loaded stay in-process: as subprocesses they
would each add a TensorFlow start-up and test nothing more. The last section holds the run_mlm.py
cases it does not answer yet.
"""

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import MAX_LENGTH, TINY_MODEL, VOCAB_SIZE, read_lines, write_lines

import run_mlm

# prepare_tfrecord_shards.py's progress bar, there when the problem showed only after some shards
# were written.
PROGRESS_BAR = re.compile(r"^Writing \w+ shards: ")
# Readable: a few lines of a terminal, paths included, not a library's dump of everything it knows.
READABLE_LENGTH = 600


def snapshot(path):
    """A folder's files and subfolders with their bytes, a file's bytes, or None when nothing is there."""
    if path.is_file():
        return path.read_bytes()
    if not path.exists():
        return None
    return {
        str(item.relative_to(path)): item.read_bytes() if item.is_file() else None
        for item in path.rglob("*")
    }


def refused(run_script, script, args, output, *needles, exit_code=1):
    """Run `script` with bad `args` and check the four promises; `output` is where it would write."""
    before = snapshot(output)
    result = run_script(script, *args)
    stderr = result.stderr
    assert result.returncode == exit_code, f"exit {result.returncode}; stderr: {stderr[-3000:]}"
    assert "Traceback" not in stderr, stderr[-3000:]
    # tqdm's carriage returns end lines too
    lines = [line for line in stderr.splitlines() if line.strip()]
    # TensorFlow's start-up log is held back by the scripts, so it must not show here either.
    lines = [line for line in lines if not PROGRESS_BAR.match(line)]
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: "), stderr[-3000:]
    assert len(lines[0]) <= READABLE_LENGTH, (
        f"{len(lines[0])} characters: {lines[0][:READABLE_LENGTH]}..."
    )
    for needle in needles:
        assert str(needle) in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert snapshot(output) == before, f"{output} was changed"
    return lines[0]


@pytest.fixture(scope="module")
def inputs(corpus, tokenizer_dir, shards_dir, tmp_path_factory):
    """Good and bad files the cases point at, by the names their commands use in {braces}."""
    folder = tmp_path_factory.mktemp("bad_inputs")
    good = corpus["train"].read_bytes()
    # a Latin-1 line after a whole corpus: found after shards are written
    not_utf8 = folder / "latin1.txt"
    not_utf8.write_bytes(good + "Un café au lait.\n".encode("latin-1") + good)
    zero_bytes = folder / "zero.txt"
    zero_bytes.write_bytes(b"")
    word_document = folder / "corpus.docx"
    word_document.write_bytes(good)
    a_file = folder / "a_file"
    a_file.write_text("a file where a folder should be\n")
    empty_folder = folder / "empty_folder"
    empty_folder.mkdir()
    split_is_a_file = folder / "split_is_a_file"  # an output folder whose train/ cannot be made
    split_is_a_file.mkdir()
    (split_is_a_file / "train").write_text("a file where the split's folder should be\n")
    return {
        "corpus": corpus["train"],
        "corpus_folder": corpus["train"].parent,
        "tokenizer": tokenizer_dir,
        "shards": shards_dir,
        "train_shards": shards_dir / "train",
        "not_utf8": not_utf8,
        "not_utf8_line": len(read_lines(corpus["train"])) + 1,
        "blank_lines": write_lines(folder / "blank.txt", ["", "   ", "", "\t", ""]),
        "zero_bytes": zero_bytes,
        "word_document": word_document,
        "a_file": a_file,
        "empty_folder": empty_folder,
        "split_is_a_file": split_is_a_file,
    }


# ---------------------------------------------------------------------------------------------------------
# Flags and input files: (command, what the error line must name, exit code). {out} is a fresh
# folder of the test's own; argparse exits 2, the scripts' own checks 1.

UNIGRAM = "train_unigram.py --train_file {corpus} --vocab_size 100 --output_dir {out}"
PREPARE = "prepare_tfrecord_shards.py --train_file {corpus} --tokenizer_name_or_path {tokenizer} --output_dir {out}"
PREPARE += f" --max_length {MAX_LENGTH}"
RUN_MLM = "run_mlm.py --no_tpu --train_dataset {train_shards} --tokenizer {tokenizer} --max_steps 1 --output_dir {out}"
RUN_MLM += f" --config_overrides {TINY_MODEL}"


def case(name, command, *needles, exit_code=1):
    return pytest.param(command, needles, exit_code, id=name)


FLAG_CASES = [
    # train_unigram.py
    case(
        "unigram: no --output_dir",
        "train_unigram.py --train_file {corpus}",
        "--output_dir",
        exit_code=2,
    ),
    case(
        "unigram: --vocab_size 32k",
        UNIGRAM + " --vocab_size 32k",
        "--vocab_size",
        "'32k'",
        exit_code=2,
    ),
    case(
        "unigram: --vocab_size 3", UNIGRAM + " --vocab_size 3", "--vocab_size 3", "special tokens"
    ),
    case(
        "unigram: --limit -3",
        UNIGRAM + " --limit -3",
        "--limit: -3 must be a positive number",
        exit_code=2,
    ),
    case(
        "unigram: --batch_size -1",
        UNIGRAM + " --batch_size -1",
        "--batch_size: -1 must be",
        exit_code=2,
    ),
    case(
        "unigram: --push_to_hub alone",
        UNIGRAM + " --push_to_hub",
        "--push_to_hub",
        "--hub_model_id",
    ),
    case(
        "unigram: missing corpus",
        UNIGRAM + " --train_file {out}.txt",
        "--train_file {out}.txt",
        "does not exist",
    ),
    case(
        "unigram: corpus is a folder",
        UNIGRAM + " --train_file {corpus_folder}",
        "{corpus_folder}",
        "folder",
    ),
    case(
        "unigram: blank corpus",
        UNIGRAM + " --train_file {blank_lines}",
        "{blank_lines}",
        "no non-blank text",
    ),
    case(
        "unigram: zero-byte corpus",
        UNIGRAM + " --train_file {zero_bytes}",
        "{zero_bytes}",
        "is empty",
    ),
    case(
        "unigram: .docx corpus",
        UNIGRAM + " --train_file {word_document}",
        "{word_document}",
        "'.docx'",
    ),
    case(
        "unigram: not UTF-8",
        UNIGRAM + " --train_file {not_utf8}",
        "{not_utf8}",
        "not UTF-8",
        "line {not_utf8_line}",
        "0xe9",
    ),
    case(
        "unigram: output under a file",
        UNIGRAM + " --output_dir {a_file}/tokenizer",
        "{a_file}/tokenizer",
        "file",
    ),
    case(
        "unigram: output is a file",
        UNIGRAM + " --output_dir {a_file}",
        "--output_dir {a_file}",
        "is a file",
    ),
    # prepare_tfrecord_shards.py
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
    # run_mlm.py
    case(
        "run_mlm: no --train_dataset",
        "run_mlm.py --tokenizer {tokenizer} --output_dir {out}",
        "--train_dataset",
        exit_code=2,
    ),
    case(
        "run_mlm: --max_steps ten",
        RUN_MLM + " --max_steps ten",
        "--max_steps",
        "'ten'",
        exit_code=2,
    ),
    case(
        "run_mlm: --mlm_probability 1.5",
        RUN_MLM + " --mlm_probability 1.5",
        "--mlm_probability 1.5",
    ),
    case("run_mlm: --mlm_probability 0", RUN_MLM + " --mlm_probability 0", "--mlm_probability 0"),
    case(
        "run_mlm: --per_replica_batch_size -1",
        RUN_MLM + " --per_replica_batch_size -1",
        "--per_replica_batch_size: -1 must be a positive",
        exit_code=2,
    ),
    case("run_mlm: --max_length -5", RUN_MLM + " --max_length -5", "--max_length -5"),
    case(
        "run_mlm: --max_steps 0",
        RUN_MLM + " --max_steps 0",
        "--max_steps: 0 must be a positive",
        exit_code=2,
    ),
    case("run_mlm: --warmup_ratio 1", RUN_MLM + " --warmup_ratio 1", "--warmup_ratio 1"),
    case(
        "run_mlm: --jit_compile with replicas",
        RUN_MLM + " --jit_compile --cpu_replicas 2",
        "--jit_compile",
        "--cpu_replicas 2",
    ),
    case(
        "run_mlm: missing train shards",
        RUN_MLM + " --train_dataset {out}_shards",
        "--train_dataset {out}_shards",
    ),
    case(
        "run_mlm: parent of the splits",
        RUN_MLM + " --train_dataset {shards}",
        "{shards}",
        "manifest.json",
        "{shards}/train",
    ),
    case("run_mlm: missing tokenizer", RUN_MLM + " --tokenizer {out}_tok", "--tokenizer {out}_tok"),
    case(
        "run_mlm: --max_length unlike the shards'",
        RUN_MLM + f" --max_length {2 * MAX_LENGTH}",
        f"--max_length {2 * MAX_LENGTH}",
        f" {MAX_LENGTH} ",
    ),
]


@pytest.mark.parametrize("command, needles, exit_code", FLAG_CASES)
def test_bad_flag_or_file(run_script, inputs, tmp_path, command, needles, exit_code):
    names = {**inputs, "out": tmp_path / "out"}
    script, *args = [word.format(**names) for word in command.split()]
    output = (
        Path(args[args.index("--output_dir") + 1]) if "--output_dir" in args else tmp_path / "out"
    )
    refused(
        run_script,
        script,
        args,
        output,
        *[needle.format(**names) for needle in needles],
        exit_code=exit_code,
    )


# ---------------------------------------------------------------------------------------------------------
# Output already there, and inputs that need building


def test_unigram_refuses_to_replace_a_tokenizer(run_script, corpus, tokenizer_dir, tmp_path):
    output_dir = tmp_path / "tokenizer"
    shutil.copytree(tokenizer_dir, output_dir)
    args = ["--train_file", corpus["validation"], "--vocab_size", 100, "--output_dir", output_dir]
    refused(run_script, "train_unigram.py", args, output_dir, output_dir, "--overwrite_output_dir")


def test_prepare_refuses_to_replace_a_finished_split(
    run_script, corpus, tokenizer_dir, shards_dir, tmp_path
):
    output_dir = tmp_path / "shards"
    shutil.copytree(shards_dir / "validation", output_dir / "validation")
    args = [
        "--validation_file",
        corpus["validation"],
        "--split",
        "validation",
        "--tokenizer_name_or_path",
        tokenizer_dir,
        "--max_length",
        MAX_LENGTH,
        "--output_dir",
        output_dir,
    ]
    needles = (output_dir / "validation", "--overwrite_output_dir")
    refused(run_script, "prepare_tfrecord_shards.py", args, output_dir, *needles)


def mlm_args(train_dataset, tokenizer, output_dir, *extra):
    return [
        "--no_tpu",
        "--train_dataset",
        train_dataset,
        "--tokenizer",
        tokenizer,
        "--output_dir",
        output_dir,
        "--config_overrides",
        TINY_MODEL,
        "--max_steps",
        1,
        *extra,
    ]


def test_run_mlm_refuses_to_replace_a_finished_run(run_script, shards_dir, tokenizer_dir, tmp_path):
    output_dir = tmp_path / "model"
    output_dir.mkdir()
    (output_dir / "config.json").write_text('{"model_type": "roberta"}\n')
    (output_dir / "tf_model.h5").write_bytes(b"finished weights")
    args = mlm_args(shards_dir / "train", tokenizer_dir, output_dir)
    refused(run_script, "run_mlm.py", args, output_dir, output_dir, "--overwrite_output_dir")


@pytest.fixture(scope="module")
def tokenizer_without_mask(tokenizer_dir, tmp_path_factory):
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("no_mask_tokenizer")
    for path in tokenizer_dir.iterdir():
        shutil.copy(path, folder / path.name)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        config = json.loads((folder / name).read_text())
        del config["mask_token"]
        (folder / name).write_text(json.dumps(config, indent=2))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer.mask_token_id is None and tokenizer.pad_token_id is not None
    return folder


def test_run_mlm_tokenizer_without_mask_token(
    run_script, shards_dir, tokenizer_without_mask, tmp_path
):
    output_dir = tmp_path / "model"
    args = mlm_args(shards_dir / "train", tokenizer_without_mask, output_dir)
    refused(run_script, "run_mlm.py", args, output_dir, tokenizer_without_mask, "mask")


def test_run_mlm_shards_from_another_tokenizer(run_script, shards_dir, tokenizer_dir, tmp_path):
    split_dir = tmp_path / "train"
    shutil.copytree(shards_dir / "train", split_dir)
    manifest = json.loads((split_dir / "manifest.json").read_text())
    manifest["vocab_size"] = VOCAB_SIZE * 10
    (split_dir / "manifest.json").write_text(json.dumps(manifest))
    output_dir = tmp_path / "model"
    args = mlm_args(split_dir, tokenizer_dir, output_dir)
    refused(run_script, "run_mlm.py", args, output_dir, VOCAB_SIZE * 10, "--tokenizer")


def test_run_mlm_batch_larger_than_the_data(
    run_script, shards_dir, tokenizer_dir, read_manifest, tmp_path
):
    output_dir = tmp_path / "model"
    records = read_manifest(shards_dir / "train")["records"]
    args = mlm_args(
        shards_dir / "train", tokenizer_dir, output_dir, "--per_replica_batch_size", records + 1
    )
    refused(run_script, "run_mlm.py", args, output_dir, records + 1, records)


# ---------------------------------------------------------------------------------------------------------
# run_mlm.py in-process: checks that run after the tokenizer and manifests load (the CLI turns the
# same UsageError into the one line, as the subprocess cases above show)


def run_in_process(*argv):
    return run_mlm.main(run_mlm.parse_args([str(arg) for arg in argv]))


def assert_nothing_written(output_dir):
    assert not output_dir.exists() or not any(output_dir.iterdir())


def test_run_mlm_manifest_listing_missing_shards(shards_dir, tokenizer_dir, tmp_path):
    split_dir = tmp_path / "train"
    shutil.copytree(shards_dir / "train", split_dir)
    manifest = json.loads((split_dir / "manifest.json").read_text())
    (split_dir / manifest["shards"][0]["file"]).unlink()
    with pytest.raises(run_mlm.UsageError, match="no shards found|missing"):
        run_in_process(*mlm_args(split_dir, tokenizer_dir, tmp_path / "model"))
    assert_nothing_written(tmp_path / "model")


def test_run_mlm_unfinished_split_without_manifest(shards_dir, tokenizer_dir, tmp_path):
    split_dir = tmp_path / "train"
    shutil.copytree(shards_dir / "train", split_dir)
    (split_dir / "manifest.json").unlink()  # what an interrupted prepare_tfrecord_shards.py leaves
    with pytest.raises(run_mlm.UsageError, match="manifest.json"):
        run_in_process(*mlm_args(split_dir, tokenizer_dir, tmp_path / "model"))
    assert_nothing_written(tmp_path / "model")


@pytest.mark.parametrize(
    "content, named",
    [
        ('{"shards": [', "JSONDecodeError"),
        ('{"shards": []}', "max_length, records, vocab_size"),
        ("[1]", "list"),
    ],
)
def test_run_mlm_corrupt_manifest(shards_dir, tokenizer_dir, tmp_path, content, named):
    split_dir = tmp_path / "train"
    shutil.copytree(shards_dir / "train", split_dir)
    (split_dir / "manifest.json").write_text(content)
    with pytest.raises(
        run_mlm.UsageError, match="manifest.json is not one prepare_tfrecord_shards.py wrote"
    ) as error:
        run_in_process(*mlm_args(split_dir, tokenizer_dir, tmp_path / "model"))
    assert named in str(error.value)
    assert_nothing_written(tmp_path / "model")


def test_run_mlm_eval_batch_larger_than_the_eval_data(
    shards_dir, tokenizer_dir, read_manifest, tmp_path
):
    eval_records = read_manifest(shards_dir / "validation")["records"]
    assert read_manifest(shards_dir / "train")["records"] > eval_records
    with pytest.raises(run_mlm.UsageError, match=f"{eval_records} eval sequences"):
        run_in_process(
            *mlm_args(
                shards_dir / "train",
                tokenizer_dir,
                tmp_path / "model",
                "--eval_dataset",
                shards_dir / "validation",
                "--per_replica_batch_size",
                eval_records + 1,
            )
        )
    assert_nothing_written(tmp_path / "model")


def test_run_mlm_unknown_config_override(shards_dir, tokenizer_dir, tmp_path):
    args = mlm_args(shards_dir / "train", tokenizer_dir, tmp_path / "model")
    args[args.index("--config_overrides") + 1] = "hidden_size=32,no_such_field=3"
    with pytest.raises(run_mlm.UsageError, match="no_such_field"):
        run_in_process(*args)
    assert_nothing_written(tmp_path / "model")


# ---------------------------------------------------------------------------------------------------------
# run_mlm.py: damaged shards, found before training starts and named in the message


@pytest.fixture
def damaged_split(shards_dir, tmp_path):
    """A copy of the train split and the name of its second shard, for a test to damage."""
    split_dir = tmp_path / "train"
    shutil.copytree(shards_dir / "train", split_dir)
    manifest = json.loads((split_dir / "manifest.json").read_text())
    return split_dir, manifest["shards"][1]["file"]


def test_run_mlm_shard_of_garbage_bytes(run_script, damaged_split, tokenizer_dir, tmp_path):
    split_dir, shard = damaged_split
    (split_dir / shard).write_bytes(bytes(range(256)) * 12)
    output_dir = tmp_path / "model"
    refused(
        run_script, "run_mlm.py", mlm_args(split_dir, tokenizer_dir, output_dir), output_dir, shard
    )


def test_run_mlm_truncated_shard(run_script, damaged_split, tokenizer_dir, tmp_path):
    split_dir, shard = damaged_split
    data = (split_dir / shard).read_bytes()
    (split_dir / shard).write_bytes(data[: len(data) // 2])
    output_dir = tmp_path / "model"
    refused(
        run_script, "run_mlm.py", mlm_args(split_dir, tokenizer_dir, output_dir), output_dir, shard
    )


def test_run_mlm_token_ids_outside_the_vocabulary(
    run_script, damaged_split, tokenizer_dir, tokenizer, tmp_path
):
    import numpy as np
    import tensorflow as tf

    from mlm_pipeline import packing

    split_dir, shard = damaged_split
    records = sum(1 for _ in tf.data.TFRecordDataset(str(split_dir / shard)))
    too_large = len(tokenizer) + 100  # as if written with a larger tokenizer
    with tf.io.TFRecordWriter(str(split_dir / shard)) as writer:
        for example in packing.serialize_examples(
            np.full((records, MAX_LENGTH), too_large, dtype=np.int64)
        ):
            writer.write(example)
    manifest = json.loads((split_dir / "manifest.json").read_text())
    # whole, as listed: only the ids are wrong
    manifest["shards"][1]["bytes"] = (split_dir / shard).stat().st_size
    (split_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    output_dir = tmp_path / "model"
    args = mlm_args(split_dir, tokenizer_dir, output_dir)
    refused(run_script, "run_mlm.py", args, output_dir, shard, too_large)


def test_run_mlm_manifest_counts_disagree_with_the_shards(
    run_script, damaged_split, tokenizer_dir, tmp_path
):
    split_dir, shard = damaged_split
    manifest = json.loads((split_dir / "manifest.json").read_text())
    for entry in manifest["shards"]:
        # a manifest from before sizes were recorded: the records are counted instead
        del entry["bytes"]
    # the file holds 50 records fewer than the manifest says
    listed = manifest["shards"][1]["records"] + 50
    manifest["shards"][1]["records"] = listed
    manifest["records"] += 50
    manifest["tokens"] = manifest["records"] * manifest["max_length"]
    (split_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    output_dir = tmp_path / "model"
    args = mlm_args(split_dir, tokenizer_dir, output_dir)
    refused(run_script, "run_mlm.py", args, output_dir, shard, listed)


# ---------------------------------------------------------------------------------------------------------
# run_mlm.py: an output path that cannot be a folder, and a folder that is not a tokenizer


def test_run_mlm_output_under_a_file(run_script, shards_dir, tokenizer_dir, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("a file where a folder should be\n")
    output_dir = a_file / "model"
    args = mlm_args(shards_dir / "train", tokenizer_dir, output_dir)
    refused(run_script, "run_mlm.py", args, tmp_path, output_dir)


def test_run_mlm_refuses_an_unusable_output_dir_before_building_the_strategy(
    shards_dir, tokenizer_dir, tmp_path, monkeypatch
):
    """On a TPU VM, building the strategy initialises the TPU system: a bad --output_dir is refused first."""

    def no_strategy_yet(args):
        raise AssertionError("the strategy was built before --output_dir was checked")

    a_file = tmp_path / "a_file"
    a_file.write_text("a file where a folder should be\n")
    monkeypatch.setattr(run_mlm, "build_strategy", no_strategy_yet)
    args = mlm_args(shards_dir / "train", tokenizer_dir, a_file / "model")
    with pytest.raises(run_mlm.UsageError, match="a_file"):
        run_mlm.main(run_mlm.parse_args([str(arg) for arg in args]))


def test_run_mlm_tokenizer_folder_without_a_tokenizer(run_script, shards_dir, tmp_path):
    empty = tmp_path / "tokenizer"
    empty.mkdir()
    output_dir = tmp_path / "model"
    args = mlm_args(shards_dir / "train", empty, output_dir)
    refused(run_script, "run_mlm.py", args, output_dir, empty)
