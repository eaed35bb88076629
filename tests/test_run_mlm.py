import json
import math
import re

import numpy as np
import pytest
from conftest import MAX_LENGTH

import run_mlm
from mlm_pipeline import contract

BATCH_SIZE = 8
MAX_STEPS = 5


def train(shards_dir, tokenizer_dir, output_dir, *extra, eval_split=True):
    argv = [
        "--no_tpu",
        "--train_dataset",
        str(shards_dir / "train"),
        "--tokenizer",
        str(tokenizer_dir),
        "--output_dir",
        str(output_dir),
        "--seed",
        "0",
    ]
    if eval_split:
        argv += ["--eval_dataset", str(shards_dir / "validation")]
    return run_mlm.main(run_mlm.parse_args(argv + [str(arg) for arg in extra]))


@pytest.fixture(scope="module")
def run(shards_dir, tokenizer_dir, tiny_model, tmp_path_factory):
    """The whole chain: the session's train_unigram.py tokenizer and shards, then run_mlm.py on them."""
    output_dir = tmp_path_factory.mktemp("model")
    model, logs = train(
        shards_dir,
        tokenizer_dir,
        output_dir,
        "--config_overrides",
        tiny_model,
        "--per_replica_batch_size",
        BATCH_SIZE,
        "--max_steps",
        MAX_STEPS,
    )
    return model, logs, output_dir


def steps_per_epoch(shards_dir, read_manifest, batch_size):
    return read_manifest(shards_dir / "train")["records"] // batch_size


def test_output_dir_holds_model_and_tokenizer(run):
    _, _, output_dir = run
    names = {path.name for path in output_dir.iterdir()}
    assert {
        "config.json",
        "tf_model.h5",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    } <= names


def test_saved_config_follows_the_tokenizer(run, tokenizer):
    _, _, output_dir = run
    config = json.loads((output_dir / "config.json").read_text())
    assert config["model_type"] == "roberta"
    assert config["vocab_size"] == len(tokenizer)
    assert config["pad_token_id"] == tokenizer.pad_token_id
    assert (
        config["bos_token_id"] == tokenizer.cls_token_id
        and config["eos_token_id"] == tokenizer.sep_token_id
    )
    assert config["max_position_embeddings"] >= MAX_LENGTH + tokenizer.pad_token_id + 1
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (
        32,
        1,
        2,
    )
    assert config["intermediate_size"] == 64


def test_saved_folder_reloads_model_and_tokenizer(run, tokenizer):
    from transformers import AutoTokenizer, TFAutoModelForMaskedLM

    model, _, output_dir = run
    saved_tokenizer = AutoTokenizer.from_pretrained(str(output_dir))
    assert saved_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert saved_tokenizer.mask_token_id == tokenizer.mask_token_id
    # so pipelines truncate to what positions allow
    assert saved_tokenizer.model_max_length == MAX_LENGTH

    reloaded = TFAutoModelForMaskedLM.from_pretrained(str(output_dir))
    inputs = saved_tokenizer(["the [MASK] crossed the old bridge"], return_tensors="tf")
    np.testing.assert_allclose(
        reloaded(inputs).logits.numpy(),
        model.masked_lm(inputs, training=False).logits.numpy(),
        rtol=1e-5,
        atol=1e-5,
    )


def test_fill_mask_pipeline_loads_from_the_folder(run, tokenizer):
    from transformers import pipeline

    _, _, output_dir = run
    fill_mask = pipeline("fill-mask", model=str(output_dir), dtype=None)
    predictions = fill_mask("the river [MASK] the city.", top_k=5)
    assert len(predictions) == 5
    scores = [prediction["score"] for prediction in predictions]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1 + 1e-6
    for prediction in predictions:
        assert 0 <= prediction["token"] < len(tokenizer)
        assert "[MASK]" not in prediction["sequence"]
        assert prediction["sequence"].startswith("the river") and prediction["sequence"].endswith(
            "the city."
        )


def test_optimizer_ran_exactly_max_steps(run, shards_dir, read_manifest):
    model, logs, _ = run
    assert MAX_STEPS < steps_per_epoch(shards_dir, read_manifest, BATCH_SIZE)
    assert int(model.optimizer.iterations.numpy()) == MAX_STEPS
    assert len(logs["loss"]) == 1
    assert logs["step"] == [MAX_STEPS]


def test_history_has_masked_accuracy_and_perplexity(run):
    _, logs, _ = run
    accuracies = ("masked_accuracy", "mask_token_accuracy", "top_token_share")
    for key in (
        "loss",
        "val_loss",
        "val_perplexity",
        *accuracies,
        *(f"val_{name}" for name in accuracies),
    ):
        assert key in logs and len(logs[key]) == 1, key
    for name in accuracies:
        assert 0.0 <= logs[name][0] <= 1.0 and 0.0 <= logs[f"val_{name}"][0] <= 1.0, name
    assert logs["val_top_token_share"][0] > 0  # some predictions were counted
    assert math.isfinite(logs["val_loss"][0]) and logs["val_loss"][0] > 0
    assert logs["val_perplexity"][0] == pytest.approx(math.exp(logs["val_loss"][0]), rel=1e-6)
    # An untrained model over the vocabulary: loss near log(vocab), far from 0 and from exploding.
    assert logs["loss"][0] < 2 * math.log(run[0].masked_lm.config.vocab_size)


# case: (--num_epochs, --max_steps from the steps of an epoch (None: not given),
# --steps_per_execution)
STEP_CASES = {
    "two_epochs": (2, None, 1),
    "max_steps_below_an_epoch_overrides_num_epochs": (2, lambda per_epoch: 3, 1),
    "max_steps_of_exactly_one_epoch": (1, lambda per_epoch: per_epoch, 1),
    "max_steps_above_num_epochs_repeats_the_data": (1, lambda per_epoch: 2 * per_epoch + 3, 1),
    # the stop must land on --max_steps even when a tf.function call runs several steps
    "max_steps_with_steps_per_execution": (1, lambda per_epoch: per_epoch + 3, 4),
}


@pytest.mark.parametrize("case", STEP_CASES)
def test_step_counts(case, shards_dir, tokenizer_dir, tiny_model, read_manifest, tmp_path, capsys):
    """--max_steps is the number of optimizer steps, as in 🤗's Trainer: below, at or beyond --num_epochs."""
    batch_size = 16
    per_epoch = steps_per_epoch(shards_dir, read_manifest, batch_size)
    assert per_epoch > 4
    num_epochs, max_steps, steps_per_execution = STEP_CASES[case]
    total = max_steps(per_epoch) if max_steps else num_epochs * per_epoch
    extra = [
        "--num_epochs",
        num_epochs,
        "--per_replica_batch_size",
        batch_size,
        "--config_overrides",
        tiny_model,
        "--steps_per_execution",
        steps_per_execution,
    ] + (["--max_steps", total] if max_steps else [])
    model, logs = train(shards_dir, tokenizer_dir, tmp_path, *extra, eval_split=False)
    printed = capsys.readouterr().out

    assert int(model.optimizer.iterations.numpy()) == total
    epoch_ends = [*range(per_epoch, total, per_epoch), total]  # the last epoch may end part-way
    assert logs["step"] == epoch_ends
    log = (tmp_path / contract.TRAINING_LOG_NAME).read_text().splitlines()
    columns = log[0].split(",")
    rows = [dict(zip(columns, row.split(","))) for row in log[1:]]
    assert [(row["epoch"], row["step"]) for row in rows] == [
        (str(i), str(end)) for i, end in enumerate(epoch_ends)
    ]
    assert "val_loss" not in logs and "val_perplexity" not in logs
    # The learning rate decays to 0 at the last step; resuming is checked against the same count.
    schedule = model.optimizer.learning_rate
    assert (
        float(schedule(total)) == pytest.approx(0.0, abs=1e-12) and float(schedule(total - 1)) > 0
    )
    settings = json.loads(
        (tmp_path / contract.CHECKPOINT_DIR / contract.RUN_SETTINGS_NAME).read_text()
    )
    assert settings["total_steps"] == total
    plan = re.search(
        rf": {total:,} steps = ([\d.]+) epochs? of {per_epoch} steps, batches of {batch_size} x ",
        printed,
    )
    assert plan and float(plan.group(1)) == pytest.approx(total / per_epoch, abs=0.005), printed[
        :2000
    ]
    assert f"Finished: {total:,} steps" in printed
    assert (tmp_path / "tf_model.h5").is_file()


@pytest.mark.parametrize("model_type", ["roberta", "bert"])
def test_config_from_a_local_json_file(model_type, shards_dir, tokenizer_dir, tokenizer, tmp_path):
    config_file = tmp_path / "my_config.json"
    config_file.write_text(
        json.dumps(
            {
                "model_type": model_type,
                "hidden_size": 24,
                "num_hidden_layers": 1,
                "num_attention_heads": 3,
                "intermediate_size": 40,
                "max_position_embeddings": 8,  # too short for MAX_LENGTH: must be raised
                "vocab_size": 7,  # wrong on purpose: the tokenizer decides
            }
        )
    )
    output_dir = tmp_path / "out"
    model, _ = train(
        shards_dir,
        tokenizer_dir,
        output_dir,
        "--pretrained_model_config",
        config_file,
        "--config_overrides",
        "num_attention_heads=2",
        "--per_replica_batch_size",
        BATCH_SIZE,
        "--max_steps",
        2,
        eval_split=False,
    )
    saved = json.loads((output_dir / "config.json").read_text())
    assert saved["model_type"] == model_type
    assert (
        type(model.masked_lm).__name__
        == {"roberta": "TFRobertaForMaskedLM", "bert": "TFBertForMaskedLM"}[model_type]
    )
    assert (saved["hidden_size"], saved["intermediate_size"], saved["num_hidden_layers"]) == (
        24,
        40,
        1,
    )
    assert saved["num_attention_heads"] == 2  # overrides apply on top of the file
    assert saved["vocab_size"] == len(tokenizer)
    assert saved["pad_token_id"] == tokenizer.pad_token_id
    assert saved["max_position_embeddings"] >= MAX_LENGTH + tokenizer.pad_token_id + 1
    assert int(model.optimizer.iterations.numpy()) == 2


def test_overwrite_output_dir_replaces_a_finished_run(
    shards_dir, tokenizer_dir, tiny_model, tmp_path
):
    common = ["--config_overrides", tiny_model, "--per_replica_batch_size", BATCH_SIZE]
    train(shards_dir, tokenizer_dir, tmp_path, *common, "--max_steps", 1, eval_split=False)
    first = (tmp_path / "tf_model.h5").read_bytes()
    with pytest.raises(run_mlm.UsageError, match="--overwrite_output_dir"):
        train(shards_dir, tokenizer_dir, tmp_path, *common, "--max_steps", 2, eval_split=False)
    assert (tmp_path / "tf_model.h5").read_bytes() == first
    assert (tmp_path / contract.PYTORCH_DIR).is_dir()
    model, _ = train(
        shards_dir,
        tokenizer_dir,
        tmp_path,
        *common,
        "--max_steps",
        2,
        "--overwrite_output_dir",
        "--no_pytorch_export",
        eval_split=False,
    )
    assert int(model.optimizer.iterations.numpy()) == 2
    assert (tmp_path / "tf_model.h5").read_bytes() != first
    # no PyTorch copy of the replaced model left behind
    assert not (tmp_path / contract.PYTORCH_DIR).exists()


def test_jit_compile_on_the_default_cpu_strategy(shards_dir, tokenizer_dir, tiny_model, tmp_path):
    model, logs = train(
        shards_dir,
        tokenizer_dir,
        tmp_path,
        "--jit_compile",
        "--config_overrides",
        tiny_model,
        "--per_replica_batch_size",
        BATCH_SIZE,
        "--max_steps",
        2,
        eval_split=False,
    )
    assert model.jit_compile
    assert model.distribute_strategy.num_replicas_in_sync == 1
    assert int(model.optimizer.iterations.numpy()) == 2
    assert math.isfinite(logs["loss"][-1])
    assert (tmp_path / "config.json").is_file() and (tmp_path / "tf_model.h5").is_file()


def test_sparse_head_trains_the_same_model_as_full_logits(
    shards_dir, tokenizer_dir, tiny_model, tmp_path
):
    """Scoring only the masked positions changes the cost, not the maths: same losses, same weights."""
    common = [
        "--config_overrides",
        tiny_model,
        "--per_replica_batch_size",
        BATCH_SIZE,
        "--max_steps",
        6,
    ]
    runs = {}
    for head in ("sparse", "full"):
        runs[head] = train(shards_dir, tokenizer_dir, tmp_path / head, *common, "--mlm_head", head)
    (sparse, sparse_history), (full, full_history) = runs["sparse"], runs["full"]
    for key in ("loss", "val_loss", "masked_accuracy", "val_masked_accuracy"):
        np.testing.assert_allclose(sparse_history[key], full_history[key], rtol=1e-4, err_msg=key)
    for sparse_weight, full_weight in zip(sparse.masked_lm.weights, full.masked_lm.weights):
        np.testing.assert_allclose(sparse_weight.numpy(), full_weight.numpy(), rtol=1e-3, atol=1e-5)
    # The saved checkpoints are the same standard masked LM.
    assert json.loads((tmp_path / "sparse" / "config.json").read_text())["architectures"] == [
        "RobertaForMaskedLM"
    ]
    assert json.loads((tmp_path / "full" / "config.json").read_text())["architectures"] == [
        "RobertaForMaskedLM"
    ]


def test_bfloat16_computes_logits_and_loss_in_float32(
    shards_dir, tokenizer_dir, tiny_model, tmp_path
):
    import tensorflow as tf
    import tf_keras

    try:
        trainer, logs = train(
            shards_dir,
            tokenizer_dir,
            tmp_path,
            "--bfloat16",
            "--config_overrides",
            tiny_model,
            "--per_replica_batch_size",
            BATCH_SIZE,
            "--max_steps",
            2,
        )
        assert trainer.masked_lm.layers[0].compute_dtype == "bfloat16"
    finally:
        # the policy is global: later tests want fp32
        tf_keras.mixed_precision.set_global_policy("float32")
    features = {
        "input_ids": tf.constant([[0, 5, 4, 6, 1] * 4], dtype=tf.int32),
        "masked_positions": tf.constant([[2, 7]], dtype=tf.int32),
    }
    # The encoder ran in bfloat16, but the logits that reach softmax and the loss are float32.
    assert trainer(features).dtype == tf.float32
    assert math.isfinite(logs["val_loss"][0])


def test_roberta_refuses_a_pad_token_other_than_id_1(tokenizer_dir, tmp_path):
    """TF RoBERTa's positions assume <pad> is id 1; with another id, PyTorch would number them differently."""
    from transformers import AutoTokenizer

    args = run_mlm.parse_args(
        ["--train_dataset", "x", "--tokenizer", str(tokenizer_dir), "--output_dir", "x"]
    )
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    assert run_mlm.build_config(args, tokenizer, MAX_LENGTH).pad_token_id == 1
    tokenizer.pad_token = "[SEP]"
    with pytest.raises(run_mlm.UsageError, match=r"pad token '\[SEP\]' has id 2.*fixed at 1"):
        run_mlm.build_config(args, tokenizer, MAX_LENGTH)
