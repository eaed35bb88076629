import argparse
import dataclasses
import json
import math
import re
import shutil

import numpy as np
import pytest
from helpers import MAX_LENGTH, TINY_MODEL, VOCAB_SIZE, mlm_flags
from refusals import RUN_MLM, case, refused, refused_command, script_in_process

import run_mlm
from mlm_pipeline import contract, errors

BATCH_SIZE = 8
MAX_STEPS = 5


def train(shards_dir, tokenizer_dir, output_dir, *extra, eval_split=True):
    evaluation = shards_dir / "validation" if eval_split else None
    argv = mlm_flags(
        shards_dir / "train", tokenizer_dir, output_dir, seed=0, eval_dataset=evaluation
    )
    return run_in_process(*argv, *extra)


@pytest.fixture(scope="module")
def run(shards_dir, tokenizer_dir, tiny_model, tmp_path_factory):
    """The whole chain: the session's train_unigram.py tokenizer and shards, then run_mlm.py on
    them."""
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
        "--max_length",  # optional, as in 🤗's TF example: the shards' own length
        MAX_LENGTH,
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
    """--max_steps is the number of optimizer steps, as in 🤗's Trainer: below, at or beyond
    --num_epochs."""
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
    batch = f"a global batch of {batch_size} sequences ({batch_size} a replica) x {MAX_LENGTH} "
    assert f"{batch}tokens = {batch_size * MAX_LENGTH:,} tokens a step." in printed, printed[:2000]
    last = f" and after step {total}, the last" if total % per_epoch and len(epoch_ends) > 1 else ""
    plan = re.search(
        rf"^An epoch \(a pass over the data\) is {per_epoch} steps; {total:,} steps = ([\d.]+) "
        rf"epochs?; first row of training_log.csv after step {epoch_ends[0]}, then at each epoch "
        rf"end{last}\.$",
        printed,
        re.M,
    )
    assert plan and float(plan.group(1)) == pytest.approx(total / per_epoch, abs=0.005), printed[
        :2000
    ]
    assert f"Finished: {total:,} steps" in printed
    assert (tmp_path / "tf_model.h5").is_file()
    # One epoch count for the run, however many fit() calls it takes; Keras shows none for one.
    epochs = len(epoch_ends)
    numbered = [f"Epoch {epoch}/{epochs}" for epoch in range(1, epochs + 1)] if epochs > 1 else []
    assert re.findall(r"^Epoch \d+/\d+$", printed, re.M) == numbered
    steps_left = re.findall(r"^step ([\d,]+)/([\d,]+), ", printed, re.M)
    assert steps_left == [(f"{end:,}", f"{total:,}") for end in epoch_ends]


MASKED_LM_CLASSES = {
    "roberta": "TFRobertaForMaskedLM",
    "bert": "TFBertForMaskedLM",
    "modernbert": "TFModernBertForMaskedLM",
}
# The rows of the position table before the first position: RoBERTa's kin number positions from
# the padding index (1) + 1
POSITION_OFFSETS = {"roberta": 2, "xlm-roberta": 2, "bert": 0, "modernbert": 0}


@pytest.mark.parametrize("model_type", ["roberta", "bert", "modernbert"])
def test_config_from_a_local_json_file(model_type, shards_dir, tokenizer_dir, tokenizer, tmp_path):
    """The file's sizes, the overrides on top, the tokenizer's size and ids, and positions raised
    to what the shards need, no more: in config.json and in the PyTorch copy's."""
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
    assert type(model.masked_lm).__name__ == MASKED_LM_CLASSES[model_type]
    assert (saved["hidden_size"], saved["intermediate_size"], saved["num_hidden_layers"]) == (
        24,
        40,
        1,
    )
    assert saved["num_attention_heads"] == 2  # overrides apply on top of the file
    assert saved["vocab_size"] == len(tokenizer)
    assert saved["pad_token_id"] == tokenizer.pad_token_id
    positions = MAX_LENGTH + POSITION_OFFSETS[model_type]
    copy = json.loads((output_dir / contract.PYTORCH_DIR / "config.json").read_text())
    assert saved["max_position_embeddings"] == copy["max_position_embeddings"] == positions
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
    """Scoring only the masked positions changes the cost, not the maths: same losses, same
    weights."""
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
    """TF RoBERTa's positions assume <pad> is id 1; with another id, PyTorch would number them
    differently."""
    from transformers import AutoTokenizer

    from mlm_pipeline import masked_lm_model

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    argv = ["--train_dataset", "unused", "--tokenizer", "unused", "--output_dir", "unused"]
    model = run_mlm.parse_args(argv).model  # RoBERTa-base's config
    assert (
        masked_lm_model.build_config(
            masked_lm_model.Scratch(model), tokenizer, MAX_LENGTH
        ).pad_token_id
        == 1
    )
    tokenizer.pad_token = "[SEP]"
    with pytest.raises(run_mlm.UsageError, match=r"pad token '\[SEP\]' has id 2.*fixed at 1"):
        masked_lm_model.build_config(masked_lm_model.Scratch(model), tokenizer, MAX_LENGTH)


# --------------------------------------------------------------------------------------------------
# Bad input, as the user meets it: run_mlm.py in a subprocess (tests/refusals.py)

BAD_FLAGS_AND_FILES = [
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
        "--mlm_probability: 1.5 must lie strictly between 0 and 1",
        exit_code=2,
    ),
    case(
        "run_mlm: --mlm_probability 0",
        RUN_MLM + " --mlm_probability 0",
        "--mlm_probability: 0 must lie strictly between 0 and 1",
        exit_code=2,
    ),
    case(
        "run_mlm: --per_replica_batch_size -1",
        RUN_MLM + " --per_replica_batch_size -1",
        "--per_replica_batch_size: -1 must be a positive",
        exit_code=2,
    ),
    case(
        "run_mlm: --max_steps 0",
        RUN_MLM + " --max_steps 0",
        "--max_steps: 0 must be a positive",
        exit_code=2,
    ),
    case(
        "run_mlm: --warmup_ratio 1",
        RUN_MLM + " --warmup_ratio 1",
        "--warmup_ratio: 1 must be 0 or more and below 1",
        exit_code=2,
    ),
    case(
        "run_mlm: --train_mlm_probability 1",
        RUN_MLM + " --train_mlm_probability 1",
        "--train_mlm_probability: 1 must lie strictly between 0 and 1",
        exit_code=2,
    ),
    case(
        "run_mlm: --learning_rate nan",
        RUN_MLM + " --learning_rate nan",
        "--learning_rate: nan must be a finite number",
        exit_code=2,
    ),
    case(
        "run_mlm: --decay_ratio past the warmup",
        RUN_MLM + " --warmup_ratio 0.1 --decay_ratio 0.95",
        "--decay_ratio 0.95 must lie in (0, 1 - --warmup_ratio]",
    ),
    case(
        "run_mlm: --jit_compile with replicas",
        RUN_MLM + " --jit_compile --cpu_replicas 2",
        "--jit_compile",
        "--cpu_replicas 2",
    ),
    case(
        "run_mlm: --max_eval_samples without --eval_dataset",
        RUN_MLM + " --max_eval_samples 100",
        "--max_eval_samples 100",
        "--eval_dataset",
    ),
    case(
        "run_mlm: --max_eval_samples below one batch",
        RUN_MLM + " --eval_dataset {shards}/validation --max_eval_samples 5",
        "--max_eval_samples 5 is less than one global batch of 8 sequences",
    ),
    case(
        "run_mlm: --eval_steps 0",
        RUN_MLM + " --eval_steps 0",
        "--eval_steps: 0 must be a positive",
        exit_code=2,
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
    # the rules of the flags come before any path is probed: not "Cloud Storage cannot be reached"
    case(
        "run_mlm: a rule broken before the bucket probe",
        RUN_MLM
        + " --output_dir gs://no-such-bucket-here/model --warmup_ratio 0.5 --decay_ratio 0.7",
        "--decay_ratio 0.7 must lie in (0, 1 - --warmup_ratio] with --warmup_ratio 0.5",
    ),
    case(
        "run_mlm: --max_length other than the shards'",
        RUN_MLM + " --max_length 64",
        "--max_length 64 does not match",
        f"written with --max_length {MAX_LENGTH}",
        "prepare_tfrecord_shards.py --max_length 64",
    ),
]


@pytest.mark.parametrize("command, needles, exit_code", BAD_FLAGS_AND_FILES)
def test_bad_flag_or_file(run_script, bad_inputs, tmp_path, command, needles, exit_code):
    refused_command(run_script, bad_inputs, tmp_path, command, needles, exit_code)


@pytest.mark.parametrize(
    ("number_type", "accepted", "refused", "needle"),
    [
        (errors.probability, ["0.15", "1e-3", "0.999"], ["0", "1", "-0.5"], "strictly between"),
        (errors.fraction_below_one, ["0", "0.5", "0.999"], ["1", "-0.1", "2"], "below 1"),
        (errors.positive_float, ["1e-8", "3"], ["0", "-1e-8"], "above 0"),
        (errors.non_negative_float, ["0", "1e-6", "5"], ["-1e-9", "-2"], "0 or a number above 0"),
    ],
)
def test_number_types_accept_their_range_and_refuse_the_rest_in_one_line(
    number_type, accepted, refused, needle
):
    for text in accepted:
        assert number_type(text) == float(text)
    for text in [*refused, "nan", "inf", "-inf"]:
        with pytest.raises(argparse.ArgumentTypeError) as refusal:
            number_type(text)
        message = str(refusal.value)
        assert message.startswith(f"{text} must ") and "\n" not in message
        if text in refused:
            assert needle in message, message
    with pytest.raises(ValueError):  # argparse's own "invalid float value: 'ten'"
        number_type("ten")
    assert number_type.__name__ == "float"


def mlm_args(train_dataset, tokenizer, output_dir, *extra):
    """A one-step run of the tiny model: the flags the bad-input cases start from."""
    return mlm_flags(
        train_dataset, tokenizer, output_dir, *extra, config_overrides=TINY_MODEL, max_steps=1
    )


def test_run_mlm_refuses_to_replace_a_finished_run(shards_dir, tokenizer_dir, tmp_path):
    output_dir = tmp_path / "model"
    output_dir.mkdir()
    (output_dir / "config.json").write_text('{"model_type": "roberta"}\n')
    (output_dir / "tf_model.h5").write_bytes(b"finished weights")
    args = mlm_args(shards_dir / "train", tokenizer_dir, output_dir)
    refused(script_in_process, "run_mlm.py", args, output_dir, output_dir, "--overwrite_output_dir")


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


def test_run_mlm_tokenizer_without_mask_token(shards_dir, tokenizer_without_mask, tmp_path):
    output_dir = tmp_path / "model"
    args = mlm_args(shards_dir / "train", tokenizer_without_mask, output_dir)
    refused(script_in_process, "run_mlm.py", args, output_dir, tokenizer_without_mask, "mask")


def test_run_mlm_shards_from_another_tokenizer(shards_dir, tokenizer_dir, tmp_path):
    split_dir = tmp_path / "train"
    shutil.copytree(shards_dir / "train", split_dir)
    manifest = json.loads((split_dir / "manifest.json").read_text())
    manifest["vocab_size"] = VOCAB_SIZE * 10
    (split_dir / "manifest.json").write_text(json.dumps(manifest))
    output_dir = tmp_path / "model"
    args = mlm_args(split_dir, tokenizer_dir, output_dir)
    refused(script_in_process, "run_mlm.py", args, output_dir, VOCAB_SIZE * 10, "--tokenizer")


def test_run_mlm_batch_larger_than_the_data(shards_dir, tokenizer_dir, read_manifest, tmp_path):
    output_dir = tmp_path / "model"
    records = read_manifest(shards_dir / "train")["records"]
    args = mlm_args(
        shards_dir / "train", tokenizer_dir, output_dir, "--per_replica_batch_size", records + 1
    )
    refused(script_in_process, "run_mlm.py", args, output_dir, records + 1, records)


# In-process: checks that run after the tokenizer and manifests load (the CLI turns the same
# UsageError into the one line, as the subprocess cases above show); as subprocesses they would
# each add a TensorFlow start-up and test nothing more.


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


# Damaged shards, found before training starts and named in the message


@pytest.fixture
def damaged_split(shards_dir, tmp_path):
    """A copy of the train split and the name of its second shard, for a test to damage."""
    split_dir = tmp_path / "train"
    shutil.copytree(shards_dir / "train", split_dir)
    manifest = json.loads((split_dir / "manifest.json").read_text())
    return split_dir, manifest["shards"][1]["file"]


def refused_naming(split_dir, tokenizer_dir, output_dir, *needles):
    """run_mlm.py on the damaged split is refused, naming `needles`."""
    args = mlm_args(split_dir, tokenizer_dir, output_dir)
    refused(script_in_process, "run_mlm.py", args, output_dir, *needles)


def test_run_mlm_shard_of_garbage_bytes(damaged_split, tokenizer_dir, tmp_path):
    split_dir, shard = damaged_split
    (split_dir / shard).write_bytes(bytes(range(256)) * 12)
    refused_naming(split_dir, tokenizer_dir, tmp_path / "model", shard)


def test_run_mlm_truncated_shard(damaged_split, tokenizer_dir, tmp_path):
    split_dir, shard = damaged_split
    data = (split_dir / shard).read_bytes()
    (split_dir / shard).write_bytes(data[: len(data) // 2])
    refused_naming(split_dir, tokenizer_dir, tmp_path / "model", shard)


def test_run_mlm_token_ids_outside_the_vocabulary(
    damaged_split, tokenizer_dir, tokenizer, tmp_path
):
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
    refused_naming(split_dir, tokenizer_dir, tmp_path / "model", shard, too_large)


def test_run_mlm_manifest_counts_disagree_with_the_shards(damaged_split, tokenizer_dir, tmp_path):
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
    refused_naming(split_dir, tokenizer_dir, tmp_path / "model", shard, listed)


# An output path that cannot be a folder, and a folder that is not a tokenizer


def test_run_mlm_output_under_a_file(shards_dir, tokenizer_dir, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("a file where a folder should be\n")
    output_dir = a_file / "model"
    args = mlm_args(shards_dir / "train", tokenizer_dir, output_dir)
    refused(script_in_process, "run_mlm.py", args, tmp_path, output_dir)


def test_run_mlm_refuses_an_unusable_output_dir_before_building_the_strategy(
    shards_dir, tokenizer_dir, tmp_path, monkeypatch
):
    """On a TPU VM, building the strategy initialises the TPU system: a bad --output_dir is
    refused first."""

    def no_strategy_yet(hardware):
        raise AssertionError("the strategy was built before --output_dir was checked")

    a_file = tmp_path / "a_file"
    a_file.write_text("a file where a folder should be\n")
    from mlm_pipeline import hosts

    monkeypatch.setattr(hosts, "build_strategy", no_strategy_yet)
    args = mlm_args(shards_dir / "train", tokenizer_dir, a_file / "model")
    with pytest.raises(run_mlm.UsageError, match="a_file"):
        run_in_process(*args)


def test_run_mlm_tokenizer_folder_without_a_tokenizer(shards_dir, tmp_path):
    empty = tmp_path / "tokenizer"
    empty.mkdir()
    output_dir = tmp_path / "model"
    args = mlm_args(shards_dir / "train", empty, output_dir)
    refused(script_in_process, "run_mlm.py", args, output_dir, empty)


def test_each_setting_is_a_flag_of_its_group_with_its_default_help_and_type(capsys):
    """The command line built from run_mlm.py's groups (mlm_pipeline/settings.py): each field a
    flag in the --help group of its group's name, with its default and help; a value given lands
    in its group, typed and range-checked by the field's type; a bool is a flag without a value."""
    argv = ["--train_dataset", "t", "--tokenizer", "k", "--output_dir", "o"]
    with pytest.raises(SystemExit):
        run_mlm.parse_args(["--help"])
    help_text = capsys.readouterr().out
    defaults = run_mlm.parse_args(argv)
    for group_field in dataclasses.fields(run_mlm.Settings):
        section = help_text.split(f"\n{group_field.name}:\n", 1)[1].split("\n\n", 2)[1]
        for field in dataclasses.fields(group_field.type):
            assert f"--{field.name}" in section, (group_field.name, field.name)
            if f"--{field.name}" not in argv:
                assert getattr(getattr(defaults, group_field.name), field.name) == field.default
    assert "Should match the setting used in" in help_text  # the 🤗 example's --max_length
    given = run_mlm.parse_args([*argv, "--learning_rate", "3e-4", "--bfloat16", "--max_steps", "9"])
    assert given.optimizer.learning_rate == 3e-4 and given.speed.bfloat16 is True
    assert given.steps.max_steps == 9 and given.data.train_dataset == ("t",)
    for wrong in (["--bfloat16", "True"], ["--max_steps", "0"], ["--mlm_head", "half"]):
        with pytest.raises(SystemExit) as refusal:
            run_mlm.parse_args([*argv, *wrong])
        assert refusal.value.code == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("run_mlm.py: error: ") and wrong[-1] in line, line


# --------------------------------------------------------------------------------------------------
# ModernBERT from scratch, and architectures or tokenizers run_mlm.py cannot train with: one line
# each, before any work (in this process: the subprocess cases above show the command line's part)

# A tiny ModernBERT's config.json, as --pretrained_model_config names it: global and local layers,
# a window of 8 (4 tokens each side), no special ids (so ModernBertConfig's: ModernBERT-base's)
MODERNBERT_CONFIG = {
    "model_type": "modernbert",
    "hidden_size": 32,
    "intermediate_size": 40,
    "num_attention_heads": 2,
    "num_hidden_layers": 4,
    "global_attn_every_n_layers": 3,
    "local_attention": 8,
}


def write_config(folder, **fields):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    return folder / "config.json"


def test_modernbert_from_scratch_takes_the_tokenizers_special_ids(tokenizer, tmp_path):
    """Step 1's Unigram tokenizer with a ModernBERT config: its vocabulary size and every special
    id (pad, cls, sep, mask, bos and eos) come from the tokenizer, not from
    ModernBERT-base's ids in ModernBertConfig's defaults, in the config the run saves and in the
    one its PyTorch copy writes for transformers 5."""
    from modernbert_config_files import transformers5_config_dict
    from transformers import ModernBertConfig

    from mlm_pipeline import masked_lm_model

    path = write_config(tmp_path, **MODERNBERT_CONFIG)
    argv = ["--train_dataset", "t", "--tokenizer", "k", "--output_dir", "o"]
    model = run_mlm.parse_args([*argv, "--pretrained_model_config", str(path)]).model
    config = masked_lm_model.build_config(masked_lm_model.Scratch(model), tokenizer, MAX_LENGTH)
    expected = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "cls_token_id": tokenizer.cls_token_id,
        "sep_token_id": tokenizer.sep_token_id,
        "mask_token_id": tokenizer.mask_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    defaults = ModernBertConfig()
    assert config.model_type == "modernbert"
    assert tokenizer.convert_ids_to_tokens([config.bos_token_id, config.eos_token_id]) == [
        "[CLS]",  # train_unigram.py's bos and eos are its [CLS] and [SEP]
        "[SEP]",
    ]
    for written in (config.to_dict(), transformers5_config_dict(config)):
        assert {key: written[key] for key in expected} == expected
    assert all(expected[key] != getattr(defaults, key, None) for key in expected)
    assert config.local_attention == 8 and config.num_hidden_layers == 4


def tokenizer_with_pad_id(pad_id):
    """A fast tokenizer whose [PAD] has id `pad_id`: a word-level vocabulary of that many words
    first (ModernBERT-base's [PAD] is 50283, after its vocabulary), then its special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocabulary = {f"word{index}": index for index in range(pad_id)}
    vocabulary.update({token: pad_id + index for index, token in enumerate(specials)})
    backend = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        **{f"{name}_token": f"[{name.upper()}]" for name in ("pad", "unk", "cls", "sep", "mask")},
    )


@pytest.mark.parametrize("pad_id", [1, 50283])
@pytest.mark.parametrize("model_type", list(POSITION_OFFSETS))
def test_config_positions_are_the_familys_own(model_type, pad_id, tmp_path):
    """From scratch, a config of fewer positions is raised to the shards' length plus the rows its
    family keeps before the first position (RoBERTa's and XLM-R's two, whatever the pad id
    elsewhere; BERT's and ModernBERT's none), and the length guard reads that length back; a pad
    id other than 1 is refused for the families that need it."""
    from mlm_pipeline import architecture

    max_length = 48
    source = write_config(tmp_path, model_type=model_type, max_position_embeddings=8)
    config = architecture.load_config(str(source))
    tokenizer = tokenizer_with_pad_id(pad_id)
    assert tokenizer.pad_token_id == pad_id
    if POSITION_OFFSETS[model_type] and pad_id != 1:
        with pytest.raises(errors.UsageError, match="numbers positions from a padding index fixed"):
            architecture.fit_to_tokenizer(config, tokenizer, max_length)
        return
    architecture.fit_to_tokenizer(config, tokenizer, max_length)
    assert config.pad_token_id == pad_id
    assert config.max_position_embeddings == max_length + POSITION_OFFSETS[model_type]
    assert architecture.longest_sequence(config) == max_length
    # a config with more positions keeps them
    source = write_config(tmp_path, model_type=model_type, max_position_embeddings=100)
    config = architecture.load_config(str(source))
    architecture.fit_to_tokenizer(config, tokenizer, max_length)
    assert config.max_position_embeddings == 100


def no_word_markers_tokenizer(corpus, folder):
    """A word-level tokenizer: whole words as ids, nothing in a piece says where a word starts."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordLevelTrainer(special_tokens=special)
    backend.train_from_iterator(corpus["train"].read_text().splitlines(), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    tokenizer.save_pretrained(folder)
    return folder


def architecture_refusals(tmp_path, corpus):
    """{case: (extra flags, what the line must say)}, for a tiny from-scratch run."""
    even = write_config(tmp_path / "modernbert", **MODERNBERT_CONFIG)
    odd = write_config(tmp_path / "odd", **{**MODERNBERT_CONFIG, "local_attention": 7})
    gpt2 = write_config(tmp_path / "gpt2", model_type="gpt2", n_embd=32, n_layer=1, n_head=2)
    return {
        "an odd ModernBERT window": (
            ["--pretrained_model_config", odd],
            [
                f"--pretrained_model_config {odd} with --config_overrides",
                "has an odd ModernBERT local_attention 7",
                "local_attention // 2 = 3 tokens each side",
                "just as with local_attention 6",
                "pass an even one: --config_overrides local_attention=6 (the same) or 8",
            ],
        ),
        "an odd ModernBERT window override": (
            ["--pretrained_model_config", even, "--config_overrides", "local_attention=9"],
            ["local_attention 9", "4 tokens each side", "local_attention=8 (the same) or 10"],
        ),
        "no masked LM": (
            ["--pretrained_model_config", gpt2, "--no_pytorch_export", "--config_overrides", ""],
            ["is a gpt2 model", "roberta, bert, xlm-roberta, modernbert, or another family"],
        ),
        "whole words of a tokenizer without word markers": (
            ["--whole_word_masking", "--tokenizer", "{words}"],
            [
                "--whole_word_masking needs to see where words start, but --tokenizer {words} "
                "marks no word",
                "leave out --whole_word_masking",
            ],
        ),
    }


@pytest.mark.parametrize(
    "case_name",
    [
        "an odd ModernBERT window",
        "an odd ModernBERT window override",
        "no masked LM",
        "whole words of a tokenizer without word markers",
    ],
)
def test_what_run_mlm_cannot_train_is_one_line(
    case_name, shards_dir, tokenizer_dir, corpus, tmp_path
):
    extra, needles = architecture_refusals(tmp_path, corpus)[case_name]
    words = str(tmp_path / "words")
    if "{words}" in str(extra):
        no_word_markers_tokenizer(corpus, words)
    extra = [str(word).replace("{words}", words) for word in extra]
    output_dir = tmp_path / "model"
    args = mlm_args(shards_dir / "train", tokenizer_dir, output_dir, *extra)
    needles = [needle.replace("{words}", words) for needle in needles]
    refused(script_in_process, "run_mlm.py", args, output_dir, *needles)
