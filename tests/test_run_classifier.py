"""Step 4, run_classifier.py, through the whole chain: the session's tokenizer and shards, a tiny
masked LM pretrained by run_mlm.py, then the classifier fine-tuned from it on a two-class set this
module writes, whose words carry the label. It must beat the majority class, save a folder that
pipeline("text-classification") loads, read a Hub dataset (a local folder laid out as GLUE is on
the Hub stands in for it), push to a Hub (a fake one on a loopback port), and refuse bad input in
one line without writing anything.
"""

import csv
import json
import shutil

import pytest
from fake_hub import FakeHub, connect_this_process, disconnect_this_process
from helpers import (
    POSITIVE_SHARE,
    files_in,
    flags,
    labelled_rows,
    make_corpus_lines,
    tiny_run_flags,
    write_tsv,
)
from refusals import refused, script_in_process

import run_classifier
import run_mlm
from mlm_pipeline import contract
from mlm_pipeline.errors import UsageError

TOKEN = "hf_fakeHubTokenForTheseTestsOnly"


@pytest.fixture(scope="module")
def pretrained(shards_dir, tokenizer_dir, tmp_path_factory):
    """A tiny masked LM pretrained by run_mlm.py on the session's shards (32 positions)."""
    output_dir = tmp_path_factory.mktemp("pretrained") / "model"
    argv = tiny_run_flags(
        shards_dir,
        tokenizer_dir,
        output_dir,
        max_steps=30,
        per_replica_batch_size=16,
        learning_rate=1e-3,
        no_pytorch_export=True,
    )
    run_mlm.main(run_mlm.parse_args([str(word) for word in argv]))
    return output_dir


def classifier_flags(model, output_dir, *extra, **named):
    """run_classifier.py's flags for a quick run on the CPU; `named` add to or replace them."""
    quick = dict(per_replica_batch_size=16, num_epochs=3, learning_rate=3e-3)
    named = {
        "no_tpu": True,
        "model_name_or_path": model,
        "output_dir": output_dir,
        **quick,
        **named,
    }
    return [*flags(**named), *[str(word) for word in extra]]


def run(*argv):
    return run_classifier.main(run_classifier.parse_args([str(word) for word in argv]))


def local_files(labelled):
    return ["--train_file", labelled["train"], "--validation_file", labelled["validation"]]


def pipeline_labels(output_dir, texts):
    from transformers import pipeline

    classify = pipeline("text-classification", model=str(output_dir), framework="tf", dtype=None)
    return [answer["label"] for answer in classify(texts)]


def dev_rows(labelled):
    lines = labelled["validation"].read_text(encoding="utf-8").splitlines()[1:]
    return [(text, int(label)) for text, label in (line.split("\t") for line in lines)]


def test_the_pretrained_chain_beats_the_majority_class(pretrained, labelled, tmp_path, capsys):
    output_dir = tmp_path / "classifier"
    scores = run(*classifier_flags(pretrained, output_dir), *local_files(labelled))
    rows = dev_rows(labelled)
    positive = sum(label for _, label in rows) / len(rows)
    assert scores["accuracy"] > max(positive, 1 - positive) + 0.2, scores
    assert set(scores) == {"accuracy"}  # F1 only for two-class pair tasks
    saved = json.loads((output_dir / "eval_results.json").read_text())
    assert saved == scores
    config = json.loads((output_dir / "config.json").read_text())
    pretrained_config = json.loads((pretrained / "config.json").read_text())
    assert config["hidden_dropout_prob"] == pretrained_config["hidden_dropout_prob"]  # no --dropout
    assert {"config.json", "tf_model.h5", "tokenizer.json", "README.md"} <= {
        path.name for path in output_dir.iterdir()
    }
    # the copy for transformers 5 (tests/test_classifier_export.py loads it there)
    assert {"config.json", "tokenizer.json", contract.PYTORCH_WEIGHTS_NAME} <= {
        path.name for path in (output_dir / contract.PYTORCH_DIR).iterdir()
    }
    assert not [path for path in output_dir.iterdir() if path.name.startswith(".")]
    card = (output_dir / "README.md").read_text()
    assert "pipeline_tag: text-classification" in card
    assert f"from the masked language model `{pretrained.name}`" in card
    assert f"| accuracy | {scores['accuracy']:.4f} |" in card
    assert 'from_pretrained("classifier", subfolder="pytorch")' in card
    assert str(tmp_path) not in card and str(pretrained.parent) not in card
    out = capsys.readouterr().out
    assert f"accuracy {scores['accuracy']:.4f} on 100 examples" in out
    assert "batches of 16 examples padded to 16 or 32 tokens" in out  # 32: the model's positions

    # The saved folder is a text-classification model as transformers' pipeline loads it: its
    # answers agree with the scores the run reported.
    labels = pipeline_labels(output_dir, [text for text, _ in rows])
    assert set(labels) <= {"LABEL_0", "LABEL_1"}
    right = sum(label == f"LABEL_{truth}" for label, (_, truth) in zip(labels, rows))
    assert abs(right / len(rows) - scores["accuracy"]) <= 0.02


def test_from_scratch_needs_no_weights_and_learns_the_task(pretrained, labelled, tmp_path, capsys):
    """--from_scratch takes the architecture alone: a folder without tf_model.h5 does; without the
    flag, that folder is refused. With --pad_to_max_length, every batch has the one length."""
    architecture = tmp_path / "architecture"
    shutil.copytree(pretrained, architecture, ignore=shutil.ignore_patterns("tf_model.h5"))
    output_dir = tmp_path / "from_scratch"
    with pytest.raises(UsageError, match="holds config.json but no weights"):
        run(*classifier_flags(architecture, output_dir), *local_files(labelled))
    assert not output_dir.exists()
    argv = classifier_flags(
        architecture, output_dir, from_scratch=True, dropout=0.05, pad_to_max_length=True
    )
    scores = run(*argv, *local_files(labelled))
    assert "batches of 16 examples padded to 32 tokens" in capsys.readouterr().out
    assert scores["accuracy"] > POSITIVE_SHARE + 0.1, scores
    config = json.loads((output_dir / "config.json").read_text())
    assert config["hidden_dropout_prob"] == config["attention_probs_dropout_prob"] == 0.05
    card = (output_dir / "README.md").read_text()
    assert "from random weights (`--from_scratch`)" in card


def test_training_batches_hold_one_bucket_each_cut_to_its_length():
    """Each training batch holds examples of one bucket, cut to its length with all their tokens
    kept; an epoch draws every example at most once, all but each bucket's last partial batch, in
    as many batches as the optimizer's schedule counts; the next epoch draws them in a new order."""
    import numpy as np

    from mlm_pipeline import classifier_model

    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 65, size=300)
    attention_mask = (np.arange(64)[None, :] < lengths[:, None]).astype(np.int64)
    features = {
        "input_ids": np.where(attention_mask == 1, rng.integers(5, 100, size=(300, 64)), 1),
        "attention_mask": attention_mask,
    }
    buckets = classifier_model.length_buckets(64)
    assert buckets == [16, 32, 64] and classifier_model.length_buckets(100) == [16, 32, 64, 100]
    assert classifier_model.length_buckets(16) == [16] and classifier_model.length_buckets(8) == [8]
    dataset = classifier_model.build_dataset(
        features, list(range(300)), 8, training=True, seed=0, bucket_lengths=buckets
    )
    steps = classifier_model.steps_per_epoch_of(features, 8, buckets)
    per_bucket = [
        np.sum((lengths > low) & (lengths <= high)) for low, high in zip([0, 16, 32], buckets)
    ]
    assert steps == sum(count // 8 for count in per_bucket) and dataset.cardinality() == steps
    orders = []
    for _ in range(2):
        drawn, cut_to = [], set()
        for batch, labels in dataset:
            length, indices = batch["input_ids"].shape[1], labels.numpy()
            cut_to.add(length)
            assert length == min(bucket for bucket in buckets if bucket >= lengths[indices].max())
            np.testing.assert_array_equal(
                batch["input_ids"], features["input_ids"][indices, :length]
            )
            np.testing.assert_array_equal(batch["attention_mask"], attention_mask[indices, :length])
            drawn.extend(indices)
        assert len(drawn) == len(set(drawn)) == 8 * steps and cut_to == set(buckets)
        orders.append(drawn)
    assert orders[0] != orders[1]

    one_shape = classifier_model.build_dataset(features, list(range(300)), 8, training=True, seed=0)
    assert {batch["input_ids"].shape[1] for batch, _ in one_shape} == {64}
    assert one_shape.cardinality() == classifier_model.steps_per_epoch_of(features, 8) == 37


def test_a_pair_task_from_csv_and_jsonl_is_scored_with_f1_too(pretrained, tmp_path):
    """--text_pair_column: the label word is in the second text. RoBERTa has one token type, so the
    tokenizer's type ids for the second text (1) must be left out, or they would be out of range;
    a two-class pair task also gets F1, as GLUE scores MRPC and QQP. With --no_pytorch_export, no
    copy for transformers 5."""

    def pairs(count, seed):
        firsts = [line for line in make_corpus_lines(count + 50, seed + 10) if line.strip()]
        return [
            {"sentence1": first, "sentence2": text, "label": label}
            for first, (text, label) in zip(firsts, labelled_rows(count, seed))
        ]

    train = tmp_path / "train.csv"
    with train.open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=["sentence1", "sentence2", "label"])
        writer.writeheader()
        writer.writerows(pairs(800, seed=0))
    validation = tmp_path / "dev.jsonl"
    validation.write_text("".join(json.dumps(row) + "\n" for row in pairs(100, seed=1)))
    output_dir = tmp_path / "classifier"
    argv = classifier_flags(
        pretrained,
        output_dir,
        text_column="sentence1",
        text_pair_column="sentence2",
        train_file=train,
        validation_file=validation,
        no_pytorch_export=True,
    )
    scores = run(*argv)
    assert set(scores) == {"accuracy", "f1"}
    assert scores["accuracy"] > POSITIVE_SHARE + 0.2 and scores["f1"] > 0.8, scores
    assert json.loads((output_dir / "eval_results.json").read_text()) == scores
    # --no_pytorch_export: the TF classifier alone, and a card that offers no copy
    assert not (output_dir / contract.PYTORCH_DIR).exists()
    assert "subfolder" not in (output_dir / "README.md").read_text()


GLUE_CARD = """---
configs:
- config_name: {config}
  data_files:
{files}
dataset_info:
  config_name: {config}
  features:
  - name: sentence
    dtype: string
  - name: label
    dtype:
      class_label:
        names:
          '0': negative
          '1': positive
  - name: idx
    dtype: int32
---
"""


def write_glue_layout(folder, config, splits):
    """A dataset repository laid out as GLUE's is on the Hub (nyu-mll/glue): a README.md whose
    metadata names each config's files and features (the label a ClassLabel), and one parquet file
    a split under <config>/. datasets loads such a local folder through the same code as a Hub
    id."""
    import datasets

    (folder / config).mkdir(parents=True)
    for split, rows in splits.items():
        records = {
            "sentence": [text for text, _ in rows],
            "label": [label for _, label in rows],
            "idx": list(range(len(rows))),
        }
        datasets.Dataset.from_dict(records).to_parquet(
            str(folder / config / f"{split}-00000-of-00001.parquet")
        )
    files = "".join(f"  - split: {split}\n    path: {config}/{split}-*\n" for split in splits)
    (folder / "README.md").write_text(GLUE_CARD.format(config=config, files=files.rstrip("\n")))
    return folder


def test_a_hub_dataset_in_and_the_classifier_out_to_the_hub(
    pretrained, datasets_cache, monkeypatch, tmp_path
):
    """GLUE's layout (train, validation, and a test split whose labels are hidden as -1, never
    read): the label names come from its ClassLabel; --hub_model_id pushes the saved folder and
    its card in one commit."""
    train, validation = labelled_rows(800, seed=0), labelled_rows(100, seed=1)
    hidden = [(text, -1) for text, _ in labelled_rows(20, seed=2)]
    dataset = write_glue_layout(
        tmp_path / "glue", "sst2", {"train": train, "validation": validation, "test": hidden}
    )
    output_dir = tmp_path / "classifier"
    with FakeHub(TOKEN) as hub:
        connect_this_process(monkeypatch, hub)
        try:
            argv = classifier_flags(pretrained, output_dir, hub_model_id="tester/sst2")
            scores = run(*argv, "--dataset_name", dataset, "--dataset_config", "sst2")
        finally:
            disconnect_this_process()
    config = json.loads((output_dir / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert scores["accuracy"] > POSITIVE_SHARE + 0.2, scores
    (commit,) = hub.commits("tester/sst2")
    saved = files_in(output_dir)  # the pytorch/ copy's files as pytorch/<name>, as run_mlm pushes
    assert set(commit.files) == set(saved) and "pytorch/model.safetensors" in saved
    for name in set(saved) - {"README.md"}:
        assert commit.files[name] == saved[name], name
    card = commit.files["README.md"].decode()
    assert 'model="tester/sst2"' in card and "the dataset `glue` (config `sst2`)" in card
    assert str(tmp_path) not in card
    labels = pipeline_labels(output_dir, [text for text, _ in validation[:10]])
    assert set(labels) <= {"negative", "positive"}


# --------------------------------------------------------------------------------------------------
# Bad input: one line, before anything is written


@pytest.fixture(scope="module")
def bad_files(labelled, pretrained, tokenizer_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad_files")
    rows = labelled_rows(60, seed=3)
    mismatched = folder / "mismatched_model"
    shutil.copytree(pretrained, mismatched)
    config = json.loads((mismatched / "config.json").read_text())
    config["vocab_size"] = 100  # the tokenizer has more: ids the embeddings lack
    (mismatched / "config.json").write_text(json.dumps(config))
    return {
        **labelled,
        "model": pretrained,
        "tokenizer_only": tokenizer_dir,
        "mismatched_model": mismatched,
        "words_as_labels": write_tsv(
            folder / "words.tsv", [(text, "pos" if label else "neg") for text, label in rows]
        ),
        "labels_1_and_2": write_tsv(folder / "one_two.tsv", [(t, 1 + label) for t, label in rows]),
        "third_label": write_tsv(folder / "third.tsv", [(text, 2) for text, _ in rows[:5]]),
        "header_only": write_tsv(folder / "header.tsv", []),
        "one_label": write_tsv(folder / "one_label.tsv", [(text, 0) for text, _ in rows]),
        "short_and_long": write_tsv(  # 30 examples of 1 word, 30 of over 20: no bucket holds 40
            folder / "short_and_long.tsv",
            [(text.split()[0], label) for text, label in rows[:30]]
            + [(f"{text} {text}", label) for text, label in rows[30:]],
        ),
    }


TRAIN = "--train_file {train} --validation_file {validation}"
REFUSALS = {
    "a_folder_with_no_model": (
        "--model_name_or_path {tokenizer_only} " + TRAIN,
        ["holds no config.json"],
    ),
    "a_tokenizer_the_model_does_not_match": (
        "--model_name_or_path {mismatched_model} " + TRAIN,
        ["tokens but the model's vocabulary (vocab_size in config.json) 100"],
    ),
    "a_text_column_that_does_not_exist": (
        "--model_name_or_path {model} --text_column text " + TRAIN,
        ["no column 'text' (--text_column)", "sentence, label"],
    ),
    "a_label_column_that_does_not_exist": (
        "--model_name_or_path {model} --label_column polarity " + TRAIN,
        ["no column 'polarity' (--label_column)"],
    ),
    "a_pair_column_that_does_not_exist": (
        "--model_name_or_path {model} --text_pair_column sentence2 " + TRAIN,
        ["no column 'sentence2' (--text_pair_column)"],
    ),
    "labels_that_are_words": (
        "--model_name_or_path {model} --train_file {words_as_labels} "
        "--validation_file {validation}",
        ["words.tsv: the label of example 1", "not an integer"],
    ),
    "labels_not_numbered_from_0": (
        "--model_name_or_path {model} --train_file {labels_1_and_2} --validation_file {validation}",
        ["[1, 2]", "not the integers 0..n-1"],
    ),
    "a_validation_label_the_training_split_lacks": (
        "--model_name_or_path {model} --train_file {train} --validation_file {third_label}",
        ["label(s) [2]", "lacks"],
    ),
    "a_single_label": (
        "--model_name_or_path {model} --train_file {one_label} --validation_file {validation}",
        ["every example has label 0"],
    ),
    "max_length_beyond_the_positions": (
        "--model_name_or_path {model} --max_length 4096 " + TRAIN,
        ["--max_length 4096 is longer than the", "positions of the model"],
    ),
    "a_batch_no_length_fills": (
        "--model_name_or_path {model} --train_file {short_and_long} --validation_file "
        "{validation} --per_replica_batch_size 40",
        ["no length of [16, 32] holds 40 training examples", "--pad_to_max_length"],
    ),
    "an_empty_training_split": (
        "--model_name_or_path {model} --train_file {header_only} --validation_file {validation}",
        ["holds no examples"],
    ),
    "an_empty_validation_split": (
        "--model_name_or_path {model} --train_file {train} --validation_file {header_only}",
        ["holds no examples"],
    ),
    "a_train_file_without_its_validation_file": (
        "--model_name_or_path {model} --train_file {train}",
        ["--train_file needs its partner"],
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_bad_input_is_one_line_and_writes_nothing(bad_files, tmp_path, case):
    """Refused as the command line is read (a flag's rule) or once the input is looked at: one
    line, exit 1, nothing written."""
    command, needles = REFUSALS[case]
    output_dir = tmp_path / "classifier"
    argv = ["--no_tpu", "--output_dir", output_dir]
    argv += [word.format(**bad_files) for word in command.split()]
    refused(script_in_process, "run_classifier.py", argv, output_dir, *needles)


def test_a_refusal_as_the_user_sees_it(run_script, bad_files, tmp_path):
    """The same promise from the command line: exit 1, one line on stderr, no traceback."""
    output_dir = tmp_path / "classifier"
    result = run_script(
        "run_classifier.py",
        "--no_tpu",
        "--model_name_or_path",
        bad_files["tokenizer_only"],
        "--output_dir",
        output_dir,
        *local_files(bad_files),
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("run_classifier.py: error: --model_name_or_path ")
    assert not output_dir.exists()


def test_a_saved_classifier_is_replaced_only_on_request(pretrained, labelled, tmp_path):
    output_dir = tmp_path / "classifier"
    output_dir.mkdir()
    (output_dir / contract.FINISHED_RUN_MARKER).write_text("{}")
    with pytest.raises(UsageError, match="--overwrite_output_dir"):
        run(*classifier_flags(pretrained, output_dir), *local_files(labelled))
    assert [path.name for path in output_dir.iterdir()] == [contract.FINISHED_RUN_MARKER]
