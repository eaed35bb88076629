"""Bad input, run as the user would: one clear line on stderr, a non-zero exit, no traceback, no partial output."""

import json
import re
import shutil

import pytest

import run_mlm
from conftest import MAX_LENGTH, VOCAB_SIZE, last_line, write_lines

MODEL_FILES = ("config.json", "tf_model.h5", "tokenizer.json", "tokenizer_config.json")


def assert_one_line_error(result, script, *needles):
    stderr = result.stderr
    assert result.returncode != 0, f"exit 0; stdout: {result.stdout[-2000:]}"
    assert "Traceback" not in stderr, stderr[-3000:]
    line = last_line(stderr)
    assert line.startswith(f"{script}: error: "), stderr[-3000:]
    for needle in needles:
        assert str(needle) in line, f"{needle!r} not in {line!r}"
    assert result.returncode == 1


def assert_says_empty(line, corpus):
    """The message calls the corpus empty / without text (checked with the path cut out: it holds test names)."""
    words = line.replace(str(corpus), "<corpus>").lower()
    assert re.search(r"\bempty\b|no (non-blank )?text|no lines|nothing to", words), line


def written_files(folder):
    if not folder.exists():
        return []
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())


def snapshot(folder):
    return {path: path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture
def blank_corpus(tmp_path):
    return write_lines(tmp_path / "blank.txt", ["", "   ", "", "\t", ""])


@pytest.fixture
def zero_byte_corpus(tmp_path):
    path = tmp_path / "zero.txt"
    path.write_bytes(b"")
    return path


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


# ---------------------------------------------------------------------------------------------------------
# argparse: exit 2 and one line


@pytest.mark.parametrize(
    "script, args, missing",
    [
        ("train_unigram.py", ["--train_file", "corpus.txt"], "--output_dir"),
        ("prepare_tfrecord_shards.py", ["--output_dir", "out"], "--tokenizer_name_or_path"),
        ("run_mlm.py", ["--tokenizer", "tok", "--output_dir", "out"], "--train_dataset"),
    ],
)
def test_missing_required_flag_is_one_line(run_script, script, args, missing):
    result = run_script(script, *args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert missing in lines[0] and "error" in lines[0]


# ---------------------------------------------------------------------------------------------------------
# train_unigram.py


def test_train_unigram_missing_train_file(run_script, tmp_path):
    missing = tmp_path / "nowhere" / "corpus.txt"
    output_dir = tmp_path / "tokenizer"
    result = run_script("train_unigram.py", "--train_file", missing, "--vocab_size", 100, "--output_dir", output_dir)
    assert_one_line_error(result, "train_unigram.py", missing)
    assert not output_dir.exists()


@pytest.mark.parametrize("kind", ["blank_lines", "zero_bytes"])
def test_train_unigram_empty_corpus(run_script, tmp_path, blank_corpus, zero_byte_corpus, kind):
    corpus = blank_corpus if kind == "blank_lines" else zero_byte_corpus
    output_dir = tmp_path / "tokenizer"
    result = run_script("train_unigram.py", "--train_file", corpus, "--vocab_size", 100, "--output_dir", output_dir)
    assert_one_line_error(result, "train_unigram.py", corpus)
    assert_says_empty(last_line(result.stderr), corpus)
    assert written_files(output_dir) == []


def test_train_unigram_vocab_too_small_for_special_tokens(run_script, corpus, tmp_path):
    output_dir = tmp_path / "tokenizer"
    result = run_script(
        "train_unigram.py", "--train_file", corpus["train"], "--vocab_size", 3, "--output_dir", output_dir
    )
    assert_one_line_error(result, "train_unigram.py", "--vocab_size 3", "special tokens")
    assert not output_dir.exists()


def test_train_unigram_refuses_to_replace_a_tokenizer(run_script, corpus, tokenizer_dir, tmp_path):
    output_dir = tmp_path / "tokenizer"
    shutil.copytree(tokenizer_dir, output_dir)
    before = snapshot(output_dir)
    result = run_script(
        "train_unigram.py", "--train_file", corpus["validation"], "--vocab_size", 100, "--output_dir", output_dir
    )
    assert_one_line_error(result, "train_unigram.py", output_dir, "--overwrite_output_dir")
    assert snapshot(output_dir) == before


# ---------------------------------------------------------------------------------------------------------
# prepare_tfrecord_shards.py


def prepare_args(split_file, tokenizer, output_dir, split="train", max_length=MAX_LENGTH):
    return [
        f"--{split}_file", split_file,
        "--split", split,
        "--tokenizer_name_or_path", tokenizer,
        "--max_length", max_length,
        "--output_dir", output_dir,
    ]  # fmt: skip


def assert_no_shards(output_dir):
    leftovers = [name for name in written_files(output_dir) if name.endswith((".tfrecord", ".tmp", "manifest.json"))]
    assert leftovers == []


def test_prepare_missing_train_file(run_script, tokenizer_dir, tmp_path):
    missing = tmp_path / "corpus.txt"
    output_dir = tmp_path / "shards"
    result = run_script("prepare_tfrecord_shards.py", *prepare_args(missing, tokenizer_dir, output_dir))
    assert_one_line_error(result, "prepare_tfrecord_shards.py", "--train_file", missing)
    assert not output_dir.exists()


def test_prepare_missing_tokenizer_folder(run_script, corpus, tmp_path):
    missing = tmp_path / "no_tokenizer_here"
    output_dir = tmp_path / "shards"
    result = run_script("prepare_tfrecord_shards.py", *prepare_args(corpus["train"], missing, output_dir))
    assert_one_line_error(result, "prepare_tfrecord_shards.py", missing)
    assert not output_dir.exists()


@pytest.mark.parametrize("kind", ["blank_lines", "zero_bytes"])
def test_prepare_empty_corpus(run_script, tokenizer_dir, tmp_path, blank_corpus, zero_byte_corpus, kind):
    corpus = blank_corpus if kind == "blank_lines" else zero_byte_corpus
    output_dir = tmp_path / "shards"
    result = run_script("prepare_tfrecord_shards.py", *prepare_args(corpus, tokenizer_dir, output_dir))
    assert_one_line_error(result, "prepare_tfrecord_shards.py", corpus)
    assert_says_empty(last_line(result.stderr), corpus)
    assert_no_shards(output_dir)


def test_prepare_unknown_split(run_script, corpus, tokenizer_dir, tmp_path):
    output_dir = tmp_path / "shards"
    args = prepare_args(corpus["train"], tokenizer_dir, output_dir)
    args[args.index("--split") + 1] = "dev"
    result = run_script("prepare_tfrecord_shards.py", *args)
    assert_one_line_error(result, "prepare_tfrecord_shards.py", "dev", "train, validation, test")
    assert not output_dir.exists()


def test_prepare_refuses_to_replace_a_finished_split(run_script, corpus, tokenizer_dir, shards_dir, tmp_path):
    output_dir = tmp_path / "shards"
    shutil.copytree(shards_dir / "validation", output_dir / "validation")
    before = snapshot(output_dir)
    args = prepare_args(corpus["validation"], tokenizer_dir, output_dir, split="validation")
    result = run_script("prepare_tfrecord_shards.py", *args)
    assert_one_line_error(result, "prepare_tfrecord_shards.py", output_dir / "validation", "--overwrite_output_dir")
    assert snapshot(output_dir) == before


# ---------------------------------------------------------------------------------------------------------
# run_mlm.py (each subprocess pays for a TensorFlow import; the checks fail before any model is built)


def mlm_args(train_dataset, tokenizer, output_dir, *extra):
    return [
        "--no_tpu",
        "--train_dataset", train_dataset,
        "--tokenizer", tokenizer,
        "--output_dir", output_dir,
        "--config_overrides", "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64",
        "--max_steps", 1,
        *extra,
    ]  # fmt: skip


def assert_no_model(output_dir):
    assert not [name for name in written_files(output_dir) if name in MODEL_FILES]


def test_run_mlm_missing_train_dataset(run_script, tokenizer_dir, tmp_path):
    missing = tmp_path / "shards" / "train"
    output_dir = tmp_path / "model"
    result = run_script("run_mlm.py", *mlm_args(missing, tokenizer_dir, output_dir))
    assert_one_line_error(result, "run_mlm.py", "--train_dataset", missing)
    assert_no_model(output_dir)


def test_run_mlm_folder_without_manifest(run_script, tokenizer_dir, shards_dir, tmp_path):
    # The parent of the split folders: a likely slip, which the message should point out.
    output_dir = tmp_path / "model"
    result = run_script("run_mlm.py", *mlm_args(shards_dir, tokenizer_dir, output_dir))
    assert_one_line_error(result, "run_mlm.py", shards_dir, "manifest.json", f"{shards_dir}/train")
    assert_no_model(output_dir)


def test_run_mlm_missing_tokenizer_folder(run_script, shards_dir, tmp_path):
    missing = tmp_path / "tokenizer"
    output_dir = tmp_path / "model"
    result = run_script("run_mlm.py", *mlm_args(shards_dir / "train", missing, output_dir))
    assert_one_line_error(result, "run_mlm.py", "--tokenizer", missing)
    assert_no_model(output_dir)


def test_run_mlm_tokenizer_without_mask_token(run_script, shards_dir, tokenizer_without_mask, tmp_path):
    output_dir = tmp_path / "model"
    result = run_script("run_mlm.py", *mlm_args(shards_dir / "train", tokenizer_without_mask, output_dir))
    assert_one_line_error(result, "run_mlm.py", tokenizer_without_mask, "mask")
    assert_no_model(output_dir)


def test_run_mlm_max_length_differs_from_the_shards(run_script, shards_dir, tokenizer_dir, tmp_path):
    output_dir = tmp_path / "model"
    wrong = 2 * MAX_LENGTH
    result = run_script(
        "run_mlm.py", *mlm_args(shards_dir / "train", tokenizer_dir, output_dir, "--max_length", wrong)
    )
    assert_one_line_error(result, "run_mlm.py", f"--max_length {wrong}", str(MAX_LENGTH))
    assert_no_model(output_dir)


def test_run_mlm_batch_larger_than_the_data(run_script, shards_dir, tokenizer_dir, read_manifest, tmp_path):
    output_dir = tmp_path / "model"
    records = read_manifest(shards_dir / "train")["records"]
    batch = records + 1
    result = run_script(
        "run_mlm.py",
        *mlm_args(shards_dir / "train", tokenizer_dir, output_dir, "--per_replica_batch_size", batch),
    )
    assert_one_line_error(result, "run_mlm.py", str(batch), str(records))
    assert_no_model(output_dir)


def test_run_mlm_refuses_to_replace_a_finished_run(run_script, shards_dir, tokenizer_dir, tmp_path):
    output_dir = tmp_path / "model"
    output_dir.mkdir()
    (output_dir / "config.json").write_text('{"model_type": "roberta"}\n')
    (output_dir / "tf_model.h5").write_bytes(b"finished weights")
    before = snapshot(output_dir)
    result = run_script("run_mlm.py", *mlm_args(shards_dir / "train", tokenizer_dir, output_dir))
    assert_one_line_error(result, "run_mlm.py", output_dir, "--overwrite_output_dir")
    assert snapshot(output_dir) == before


def test_run_mlm_mlm_probability_out_of_range(run_script, shards_dir, tokenizer_dir, tmp_path):
    output_dir = tmp_path / "model"
    result = run_script(
        "run_mlm.py", *mlm_args(shards_dir / "train", tokenizer_dir, output_dir, "--mlm_probability", 1.5)
    )
    assert_one_line_error(result, "run_mlm.py", "--mlm_probability 1.5")
    assert_no_model(output_dir)


# ---------------------------------------------------------------------------------------------------------
# In-process checks (cheaper than a subprocess; the CLI turns the same UsageError into the one line)


def run_in_process(*argv):
    return run_mlm.main(run_mlm.parse_args([str(arg) for arg in argv]))


def test_run_mlm_manifest_listing_missing_shards(shards_dir, tokenizer_dir, tmp_path):
    split_dir = tmp_path / "train"
    shutil.copytree(shards_dir / "train", split_dir)
    manifest = json.loads((split_dir / "manifest.json").read_text())
    (split_dir / manifest["shards"][0]["file"]).unlink()
    with pytest.raises(run_mlm.UsageError, match="no shards found|missing"):
        run_in_process(*mlm_args(split_dir, tokenizer_dir, tmp_path / "model"))
    assert_no_model(tmp_path / "model")


def test_run_mlm_unfinished_split_without_manifest(shards_dir, tokenizer_dir, tmp_path):
    split_dir = tmp_path / "train"
    shutil.copytree(shards_dir / "train", split_dir)
    (split_dir / "manifest.json").unlink()  # what an interrupted prepare_tfrecord_shards.py leaves
    with pytest.raises(run_mlm.UsageError, match="manifest.json"):
        run_in_process(*mlm_args(split_dir, tokenizer_dir, tmp_path / "model"))
    assert_no_model(tmp_path / "model")


@pytest.mark.parametrize(
    "content, named",
    [('{"shards": [', "JSONDecodeError"), ('{"shards": []}', "max_length, records, vocab_size"), ("[1]", "list")],
)
def test_run_mlm_corrupt_manifest(shards_dir, tokenizer_dir, tmp_path, content, named):
    split_dir = tmp_path / "train"
    shutil.copytree(shards_dir / "train", split_dir)
    (split_dir / "manifest.json").write_text(content)
    with pytest.raises(run_mlm.UsageError, match="manifest.json is not one prepare_tfrecord_shards.py wrote") as error:
        run_in_process(*mlm_args(split_dir, tokenizer_dir, tmp_path / "model"))
    assert named in str(error.value)
    assert_no_model(tmp_path / "model")


def test_run_mlm_shards_from_another_tokenizer(shards_dir, tokenizer_dir, tmp_path):
    split_dir = tmp_path / "train"
    shutil.copytree(shards_dir / "train", split_dir)
    manifest = json.loads((split_dir / "manifest.json").read_text())
    manifest["vocab_size"] = VOCAB_SIZE * 10
    (split_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(run_mlm.UsageError, match=str(VOCAB_SIZE * 10)):
        run_in_process(*mlm_args(split_dir, tokenizer_dir, tmp_path / "model"))
    assert_no_model(tmp_path / "model")


def test_run_mlm_eval_batch_larger_than_the_eval_data(shards_dir, tokenizer_dir, read_manifest, tmp_path):
    eval_records = read_manifest(shards_dir / "validation")["records"]
    assert read_manifest(shards_dir / "train")["records"] > eval_records
    with pytest.raises(run_mlm.UsageError, match=f"{eval_records} eval sequences"):
        run_in_process(
            *mlm_args(
                shards_dir / "train", tokenizer_dir, tmp_path / "model",
                "--eval_dataset", shards_dir / "validation",
                "--per_replica_batch_size", eval_records + 1,
            )  # fmt: skip
        )
    assert_no_model(tmp_path / "model")


@pytest.mark.parametrize(
    "flag, value",
    [("--per_replica_batch_size", 0), ("--max_steps", 0), ("--warmup_ratio", 1.0), ("--mlm_probability", 0.0)],
)
def test_run_mlm_rejects_out_of_range_numbers(shards_dir, tokenizer_dir, tmp_path, flag, value):
    with pytest.raises(run_mlm.UsageError, match=f"{flag} {value}|{flag}"):
        run_in_process(*mlm_args(shards_dir / "train", tokenizer_dir, tmp_path / "model", flag, value))
    assert not (tmp_path / "model").exists()


def test_run_mlm_unknown_config_override(shards_dir, tokenizer_dir, tmp_path):
    args = mlm_args(shards_dir / "train", tokenizer_dir, tmp_path / "model")
    args[args.index("--config_overrides") + 1] = "hidden_size=32,no_such_field=3"
    with pytest.raises(run_mlm.UsageError, match="no_such_field"):
        run_in_process(*args)
    assert_no_model(tmp_path / "model")


def test_run_mlm_jit_compile_with_cpu_replicas_is_refused(shards_dir, tokenizer_dir, tmp_path):
    # XLA on the CPU cannot reach variables placed on another logical device.
    args = mlm_args(shards_dir / "train", tokenizer_dir, tmp_path / "model", "--jit_compile", "--cpu_replicas", 2)
    with pytest.raises(run_mlm.UsageError, match="--jit_compile.*--cpu_replicas 2"):
        run_in_process(*args)
    assert not (tmp_path / "model").exists()
