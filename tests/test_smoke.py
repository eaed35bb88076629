"""The smoke test to put in your own CI: the four scripts chained end to end, as a user runs them.

    bash run_tests.sh -m smoke   # about a minute on 2 CPU cores, the requirements installed
    bash run_tests.sh --tpu      # the same on TensorFlow's TPU build (requirements-tpu.txt), on CPU

A tiny corpus and model: a tokenizer, train and validation shards, then run_mlm.py on them once with
the train step compiled by XLA (--jit_compile, the path a TPU takes) and once mirrored over 2 CPU
replicas (--cpu_replicas 2, the multi-replica path); the saved model answers a fill-mask query, and
run_classifier.py fine-tunes it on a small labelled set into a model that answers a
text-classification query. It needs none of the session fixtures, so it builds and checks every
file the steps hand on.

TensorFlow's TPU build has no XLA compiler for the CPU, so there run_mlm.py must refuse
--jit_compile with --no_tpu in one line instead (on a TPU, TPUStrategy compiles the step itself).
"""

import json

import pytest
from helpers import TINY_MODEL, make_corpus_lines, write_lines, write_tsv

from mlm_pipeline import contract, tf_startup

pytestmark = pytest.mark.smoke

STEPS = 6


def succeeded(result):
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def chain(run_script, tmp_path_factory):
    """Steps 1 and 2 as a user runs them: {"tokenizer": folder, "shards": folder}."""
    folder = tmp_path_factory.mktemp("smoke")
    train = write_lines(folder / "train.txt", make_corpus_lines(420, seed=0))
    validation = write_lines(folder / "validation.txt", make_corpus_lines(110, seed=1))
    tokenizer, shards = folder / "tokenizer", folder / "shards"
    succeeded(
        run_script(
            "train_unigram.py",
            "--train_file",
            train,
            "--vocab_size",
            400,
            "--output_dir",
            tokenizer,
        )
    )
    assert (tokenizer / "tokenizer.json").is_file()
    for split, path in (("train", train), ("validation", validation)):
        succeeded(
            run_script(
                "prepare_tfrecord_shards.py",
                f"--{split}_file",
                path,
                "--split",
                split,
                "--tokenizer_name_or_path",
                tokenizer,
                "--max_length",
                32,
                "--shard_size",
                100,
                "--output_dir",
                shards,
            )
        )
        manifest = json.loads((shards / split / contract.MANIFEST_NAME).read_text())
        assert manifest["max_length"] == 32 and manifest["records"] > 0
    return {"tokenizer": tokenizer, "shards": shards}


def run_mlm(run_script, chain, output_dir, *hardware):
    return run_script(
        "run_mlm.py",
        "--no_tpu",
        *hardware,
        "--train_dataset",
        chain["shards"] / "train",
        "--eval_dataset",
        chain["shards"] / "validation",
        "--tokenizer",
        chain["tokenizer"],
        "--output_dir",
        output_dir,
        "--config_overrides",
        TINY_MODEL,
        "--per_replica_batch_size",
        4,
        "--max_steps",
        STEPS,
        "--learning_rate",
        1e-3,
    )


def check_trained(output, model):
    assert f"Finished: {STEPS} steps" in output, output[-2000:]
    assert "accuracy at [MASK]" in output
    assert (model / contract.FINISHED_RUN_MARKER).is_file() and (model / "tf_model.h5").is_file()
    from transformers import pipeline

    # dtype: no torch here
    fill_mask = pipeline("fill-mask", model=str(model), framework="tf", dtype=None)
    answers = fill_mask("The river crossed the old [MASK] of the city.")
    assert len(answers) == 5 and all(answer["token_str"] for answer in answers)


def fine_tune(run_script, model, folder):
    """Step 4 on the pretrained model: a few labelled sentences whose words carry the label."""
    words = (["bright", "quiet", "famous", "young"], ["dark", "heavy", "narrow", "old"])
    rows = [(f"the {words[i % 2][i % 4]} city and the river", i % 2) for i in range(64)]
    train = write_tsv(folder / "train.tsv", rows)
    validation = write_tsv(folder / "dev.tsv", rows[:16])
    classifier = folder / "classifier"
    output = succeeded(
        run_script(
            "run_classifier.py",
            "--no_tpu",
            "--model_name_or_path",
            model,
            "--train_file",
            train,
            "--validation_file",
            validation,
            "--max_length",
            16,
            "--per_replica_batch_size",
            16,
            "--num_epochs",
            1,
            "--output_dir",
            classifier,
        )
    )
    assert "Validation: accuracy" in output, output[-2000:]
    scores = json.loads((classifier / "eval_results.json").read_text())
    assert 0.0 <= scores["accuracy"] <= 1.0
    from transformers import pipeline

    classify = pipeline("text-classification", model=str(classifier), framework="tf", dtype=None)
    (answer,) = classify(["the bright city and the river"])
    assert answer["label"] in {"LABEL_0", "LABEL_1"} and 0.0 <= answer["score"] <= 1.0, answer


def test_two_cpu_replicas(run_script, chain, tmp_path):
    model = tmp_path / "model"
    check_trained(succeeded(run_mlm(run_script, chain, model, "--cpu_replicas", 2)), model)
    fine_tune(run_script, model, tmp_path)


def test_xla(run_script, chain, tmp_path):
    model = tmp_path / "model"
    result = run_mlm(run_script, chain, model, "--jit_compile")
    if not tf_startup.installed_as_tpu_build():
        check_trained(succeeded(result), model)
        return
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("run_mlm.py: error: --jit_compile with --no_tpu") and "TPU build" in line
    assert not model.exists()
