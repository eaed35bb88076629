"""run_mlm.py's PyTorch copy (model.safetensors), loaded the way a user of transformers 5 would load
it.

Each exported model type is trained for a few steps by run_mlm.main(); then one subprocess in the
transformers 5 virtualenv (.venv-transformers5, installed by `bash run_tests.sh` from
requirements-export-test.txt) loads every folder with AutoModelForMaskedLM and pipeline("fill-mask")
(tests/transformers5_fill_mask.py), and its logits and top tokens are compared with the TF model's.
Another loads each copy as a sequence classifier (tests/transformers5_classifier_start.py): the
weights it takes from the masked LM are the ones run_classifier.py's TF classifier starts from.
"""

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    INSTALL_HINT,
    REPO,
    TINY_MODEL,
    TRANSFORMERS5_PYTHON,
    flags,
    mlm_flags,
    require_transformers5,
    run_in_transformers5,
)
from packaging.markers import Marker

import run_mlm
from mlm_pipeline import contract, model_folder

TRANSFORMERS5_REQUIREMENTS = REPO / "requirements-export-test.txt"
TRANSFORMERS5_SCRIPT = REPO / "tests" / "transformers5_fill_mask.py"
CLASSIFIER_START_SCRIPT = REPO / "tests" / "transformers5_classifier_start.py"

MODEL_TYPES = ("roberta", "roberta-prelayernorm", "bert", "xlm-roberta", "modernbert")
# ModernBERT (written here in TF) with global and local layers both, its window of 8 tokens shorter
# than the shards' sequences, so the copy is held to both kinds of attention.
MODERNBERT_MODEL = (
    "hidden_size=32,num_hidden_layers=4,num_attention_heads=2,intermediate_size=64,"
    "global_attn_every_n_layers=3,local_attention=8,local_rope_theta=1000"
)
# Padded to the longest, so the comparison also covers padding (RoBERTa
# numbers positions around it).
SENTENCES = [
    "The [MASK] crossed the old bridge.",
    "In the morning the young teacher wrote a long [MASK] to the famous painter of the northern "
    "city.",
    "Children [MASK] in the garden.",
]
TOP_K = 5
# Float32 on both sides, different kernels: observed differences are ~1e-6.
RTOL, ATOL = 1e-4, 1e-4


def train(shards_dir, tokenizer_dir, output_dir, *extra, max_steps=8):
    argv = mlm_flags(
        shards_dir / "train",
        tokenizer_dir,
        output_dir,
        *extra,
        per_replica_batch_size=8,
        max_steps=max_steps,
        learning_rate="2e-3",  # a few steps away from the uniform guesses of a fresh model
        seed=0,
    )
    return run_mlm.main(run_mlm.parse_args(argv))


def config_file(folder, model_type, **fields):
    """A --pretrained_model_config JSON naming the model type; the sizes come from
    --config_overrides."""
    path = Path(folder) / f"{model_type}.json"
    path.write_text(json.dumps({"model_type": model_type, **fields}))
    return path


@pytest.fixture(scope="module")
def trained(shards_dir, tokenizer_dir, tmp_path_factory):
    """{model type: (the trained TF masked LM, its saved folder)}, each trained by
    run_mlm.main()."""
    configs = tmp_path_factory.mktemp("configs")
    models = {}
    for model_type in MODEL_TYPES:
        output_dir = tmp_path_factory.mktemp(model_type)
        extra = [
            "--config_overrides",
            MODERNBERT_MODEL if model_type == "modernbert" else TINY_MODEL,
        ]
        if model_type != "roberta":  # RoBERTa is run_mlm.py's default
            extra += ["--pretrained_model_config", config_file(configs, model_type)]
        trainer, _ = train(shards_dir, tokenizer_dir, output_dir, *extra)
        models[model_type] = (trainer.masked_lm, output_dir)
    return models


def pinned_version(package):
    """The version requirements-export-test.txt pins `package` at for this Python (a line may hold
    an environment marker: `transformers==5.20.2; python_version < "3.11"`)."""
    text = TRANSFORMERS5_REQUIREMENTS.read_text()
    for version, marker in re.findall(rf"^{package}==([^\s;]+)(?:\s*;\s*([^#\n]+))?", text, re.M):
        if not marker or Marker(marker.strip()).evaluate():
            return version
    raise AssertionError(f"requirements-export-test.txt pins no {package} for this Python")


@pytest.fixture(scope="module")
def transformers5_python():
    """The transformers 5 virtualenv's python, checked before any model is trained for it (the tests
    that use `transformers5` name it before the fixtures that train, so pytest sets it up first)."""
    return require_transformers5()


@pytest.fixture(scope="module")
def transformers5(transformers5_python, trained, tmp_path_factory):
    """{model type: what transformers 5 made of the folder}, from one subprocess in
    .venv-transformers5."""
    folder = tmp_path_factory.mktemp("transformers5")
    request, report = folder / "request.json", folder / "report.json"
    folders = {
        model_type: str(output_dir / contract.PYTORCH_DIR)
        for model_type, (_, output_dir) in trained.items()
    }
    request.write_text(json.dumps({"folders": folders, "sentences": SENTENCES, "top_k": TOP_K}))
    reports = run_in_transformers5(TRANSFORMERS5_SCRIPT, request, report, "the copies")
    expected = (pinned_version("transformers"), pinned_version("torch"))
    for found in reports.values():
        # 2.13.0+cpu is 2.13.0
        actual = (found["transformers_version"], found["torch_version"].split("+")[0])
        if actual != expected:
            pytest.fail(
                f"{TRANSFORMERS5_PYTHON.relative_to(REPO)} has {actual}, pinned: {expected}; "
                f"{INSTALL_HINT}."
            )
    return reports


@pytest.fixture(scope="module")
def tensorflow(trained):
    """{model type: the trained TF model's padded batch and logits for SENTENCES}, tokenized from
    its folder."""
    from transformers import AutoTokenizer

    results = {}
    for model_type, (masked_lm, output_dir) in trained.items():
        tokenizer = AutoTokenizer.from_pretrained(str(output_dir))
        batch = tokenizer(SENTENCES, padding=True, return_tensors="np")
        logits = masked_lm(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], training=False
        ).logits
        results[model_type] = {
            **batch,
            "logits": logits.numpy(),
            "mask_token_id": tokenizer.mask_token_id,
        }
    return results


def top_tokens(logits):
    return np.argsort(-logits, axis=-1)[..., :TOP_K]


def softmax(logits):
    exponentials = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exponentials / exponentials.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_transformers5_loads_every_weight(model_type, transformers5, trained):
    _, output_dir = trained[model_type]
    found = transformers5[model_type]
    architecture = json.loads((output_dir / "config.json").read_text())["architectures"][0]
    assert found["model_class"] == architecture  # e.g. RobertaForMaskedLM
    info = found["loading_info"]
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [], info
    assert info["mismatched_keys"] == [] and info["error_msgs"] == [], info
    # The file holds the word embeddings once; PyTorch must tie the decoder
    # to them, as TF shares them.
    assert found["shares_word_embeddings"]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_transformers5_logits_match_tensorflow(model_type, transformers5, tensorflow):
    expected, found = tensorflow[model_type], transformers5[model_type]
    # The same ids through both tokenizer versions, padding included, so the logits
    # compare position by position.
    assert found["input_ids"] == expected["input_ids"].tolist()
    assert found["attention_mask"] == expected["attention_mask"].tolist()
    assert 0 in expected["attention_mask"]  # some padding, whose positions RoBERTa numbers around
    attended = expected["attention_mask"].astype(bool)
    torch_logits = np.asarray(found["logits"], dtype=np.float32)
    np.testing.assert_allclose(
        torch_logits[attended], expected["logits"][attended], rtol=RTOL, atol=ATOL
    )
    masked = expected["input_ids"] == expected["mask_token_id"]
    assert masked.sum() == len(SENTENCES)
    np.testing.assert_array_equal(
        top_tokens(torch_logits[masked]), top_tokens(expected["logits"][masked])
    )


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_fill_mask_pipeline_matches_tensorflow(model_type, transformers5, tensorflow):
    expected = tensorflow[model_type]
    masked_logits = expected["logits"][expected["input_ids"] == expected["mask_token_id"]]
    for sentence, logits, guesses in zip(
        SENTENCES, masked_logits, transformers5[model_type]["pipeline"]
    ):
        top = top_tokens(logits)
        assert guesses["tokens"] == top.tolist(), sentence
        np.testing.assert_allclose(
            guesses["scores"], softmax(logits)[top], rtol=RTOL, atol=1e-6, err_msg=sentence
        )


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_copy_holds_pytorch_names_and_layouts(model_type, trained):
    from safetensors import safe_open
    from safetensors.numpy import load_file
    from transformers.modeling_tf_pytorch_utils import convert_tf_weight_name_to_pt_weight_name

    masked_lm, output_dir = trained[model_type]
    path = output_dir / contract.PYTORCH_DIR / contract.PYTORCH_WEIGHTS_NAME
    with safe_open(str(path), framework="numpy") as file:
        # what transformers reads to treat the tensors as PyTorch's
        assert file.metadata() == {"format": "pt"}
    tensors = load_file(str(path))
    # each weight once: no tied copy of the word embeddings
    assert len(tensors) == len(masked_lm.weights)
    assert not [name for name in tensors if ".decoder." in name]
    for weight in masked_lm.weights:
        name, _ = convert_tf_weight_name_to_pt_weight_name(
            weight.name, tf_weight_shape=weight.shape
        )
        kernel = weight.name.endswith("/kernel:0")  # Keras (in, out); torch Linear (out, in)
        np.testing.assert_array_equal(
            tensors[name], weight.numpy().T if kernel else weight.numpy(), err_msg=name
        )
        assert tensors[name].dtype == np.float32


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_tensorflow_pipeline_still_loads_the_folder_as_it_is(model_type, trained, tensorflow):
    """transformers 4.57's TF loader prefers a model.safetensors beside tf_model.h5 and fails on
    PyTorch-format files: with the copy in a folder of its own, the TF model loads by default and
    predicts as trained."""
    from transformers import pipeline

    _, output_dir = trained[model_type]
    assert not (output_dir / contract.PYTORCH_WEIGHTS_NAME).exists()
    fill_mask = pipeline("fill-mask", model=str(output_dir), dtype=None)
    expected = tensorflow[model_type]
    masked_logits = expected["logits"][expected["input_ids"] == expected["mask_token_id"]]
    for sentence, logits in zip(SENTENCES, masked_logits):
        guesses = fill_mask(sentence, top_k=TOP_K)
        assert [guess["token"] for guess in guesses] == top_tokens(logits).tolist(), sentence


# What each family's classifier makes anew (transformers 5's missing keys); every other weight is
# the masked LM's. BERT's masked LM has no pooler (transformers' BertForMaskedLM, TF and PyTorch, is
# built without one), so its pooler starts random too; RoBERTa's `classifier.dense` is not its
# `lm_head.dense`; ModernBERT's classifier takes the masked LM's `head` (dense and norm).
ROBERTA_HEAD = ["classifier.dense.bias", "classifier.dense.weight"]
ROBERTA_HEAD += ["classifier.out_proj.bias", "classifier.out_proj.weight"]
NEW_CLASSIFIER_WEIGHTS = {
    "roberta": ROBERTA_HEAD,
    "roberta-prelayernorm": ROBERTA_HEAD,
    "xlm-roberta": ROBERTA_HEAD,
    "bert": ["bert.pooler.dense.bias", "bert.pooler.dense.weight"]
    + ["classifier.bias", "classifier.weight"],
    "modernbert": ["classifier.bias", "classifier.weight"],
}


@pytest.fixture(scope="module")
def transformers5_classifiers(transformers5_python, trained, tmp_path_factory):
    """{model type: what transformers 5 builds from the masked LM's copy as
    AutoModelForSequenceClassification}, from one subprocess."""
    folder = tmp_path_factory.mktemp("transformers5_classifiers")
    request, report = folder / "request.json", folder / "report.json"
    folders = {
        model_type: str(output_dir / contract.PYTORCH_DIR)
        for model_type, (_, output_dir) in trained.items()
    }
    request.write_text(json.dumps({"folders": folders, "num_labels": 2}))
    return run_in_transformers5(
        CLASSIFIER_START_SCRIPT, request, report, "the copies as classifiers"
    )


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_classifier_starts_from_what_transformers5_loads(
    model_type, trained, transformers5_classifiers
):
    """run_classifier.py's TF classifier, built from the masked LM's TF weights, takes from it the
    very weights transformers 5 takes from the PyTorch copy, with the same values, and makes anew
    the ones transformers 5 makes anew. The masked LM trained 8 steps, so none of its weights is
    still what a new one starts at."""
    import tensorflow as tf
    from safetensors.numpy import load_file

    import run_classifier
    from mlm_pipeline import classifier_model, pretrained_model, pytorch_weights

    _, output_dir = trained[model_type]
    found = transformers5_classifiers[model_type]
    assert found["model_class"].endswith("ForSequenceClassification")
    assert found["missing_keys"] == NEW_CLASSIFIER_WEIGHTS[model_type]
    assert found["unexpected_keys"]  # the masked LM's own head, which a classifier leaves out
    loaded = sorted(set(found["weights"]) - set(found["missing_keys"]))

    classifier = classifier_model.build_classifier(
        pretrained_model.PretrainedModel(str(output_dir)),
        tf.distribute.get_strategy(),
        ["LABEL_0", "LABEL_1"],
        total_steps=10,
        from_scratch=False,
        training=run_classifier.Training(output_dir="unused", learning_rate=1e-3),
    )
    start = pytorch_weights.pytorch_state_dict(classifier)  # by PyTorch name
    assert sorted(start) == sorted(found["weights"])
    masked_lm = load_file(str(output_dir / contract.PYTORCH_DIR / contract.PYTORCH_WEIGHTS_NAME))
    taken = [
        name
        for name, value in sorted(start.items())
        if name in masked_lm and np.array_equal(value, masked_lm[name])
    ]
    assert taken == loaded
    for name in loaded:
        np.testing.assert_array_equal(start[name], np.asarray(found["weights"][name], np.float32))


def save(masked_lm, tokenizer, output_dir, pytorch_export=True):
    """As run_mlm.main() saves the model on the chief."""
    with model_folder.staging(output_dir) as folder:
        length = tokenizer.model_max_length  # as it is: the test only saves
        model_folder.save_model(folder, masked_lm, tokenizer, length, pytorch_export)


def test_copy_is_published_before_config_json(trained, tokenizer, tmp_path, monkeypatch):
    masked_lm, _ = trained["roberta"]
    published = []

    def replace(source, target):
        published.append(Path(target).name)
        return real_replace(source, target)

    real_replace = os.replace
    monkeypatch.setattr(os, "replace", replace)
    save(masked_lm, tokenizer, str(tmp_path / "with"))
    assert contract.PYTORCH_DIR in published and published[-1] == "config.json"
    copy = tmp_path / "with" / contract.PYTORCH_DIR
    assert {"config.json", "tokenizer.json", contract.PYTORCH_WEIGHTS_NAME} <= {
        path.name for path in copy.iterdir()
    }
    # replacing a saved model replaces its copy too
    save(masked_lm, tokenizer, str(tmp_path / "with"))
    assert copy.is_dir()
    published.clear()
    save(masked_lm, tokenizer, str(tmp_path / "without"), pytorch_export=False)
    assert contract.PYTORCH_DIR not in published and published[-1] == "config.json"
    assert not (tmp_path / "without" / contract.PYTORCH_DIR).exists()


def test_export_refuses_a_pad_id_other_than_1(tokenizer, tmp_path):
    """TF RoBERTa numbers positions from 1 whatever pad_token_id says; PyTorch would shift them:
    write nothing."""
    from transformers import RobertaConfig, TFAutoModelForMaskedLM

    sizes = dict(item.split("=") for item in TINY_MODEL.split(","))
    sizes = {key: int(value) for key, value in sizes.items()}
    config = RobertaConfig(vocab_size=len(tokenizer), pad_token_id=2, **sizes)
    masked_lm = TFAutoModelForMaskedLM.from_config(config)
    masked_lm(masked_lm.dummy_inputs)
    output_dir = tmp_path / "model"
    with pytest.raises(run_mlm.UsageError, match="has id 2.*--no_pytorch_export"):
        save(masked_lm, tokenizer, str(output_dir))
    assert list(output_dir.iterdir()) == []  # not even the TF weights: the staging folder is gone


def electra_flags(folder):
    """The tiny model as an ELECTRA, a model type with no PyTorch copy."""
    electra = config_file(folder, "electra", embedding_size=32)
    return flags(pretrained_model_config=electra, config_overrides=TINY_MODEL)


def test_unexported_model_type_is_refused_before_training(shards_dir, tokenizer_dir, tmp_path):
    output_dir = tmp_path / "model"
    electra = electra_flags(tmp_path)
    with pytest.raises(run_mlm.UsageError) as error:
        train(shards_dir, tokenizer_dir, output_dir, *electra)
    message = str(error.value)  # what `run_mlm.py: error: ` precedes on the command line
    assert "\n" not in message and "not electra" in message and "--no_pytorch_export" in message
    assert not output_dir.exists() or not any(output_dir.iterdir())


def test_no_pytorch_export_trains_any_model_type(shards_dir, tokenizer_dir, tmp_path):
    output_dir = tmp_path / "model"
    electra = electra_flags(tmp_path)
    trainer, _ = train(
        shards_dir, tokenizer_dir, output_dir, *electra, "--no_pytorch_export", max_steps=1
    )
    assert int(trainer.optimizer.iterations.numpy()) == 1
    assert (output_dir / "config.json").is_file() and (output_dir / "tf_model.h5").is_file()
    assert not (output_dir / contract.PYTORCH_DIR).exists()


def test_untied_word_embeddings_are_refused_before_training(shards_dir, tokenizer_dir, tmp_path):
    """TF ties the LM decoder to the word embeddings whatever the config says; PyTorch would not."""
    output_dir = tmp_path / "model"
    with pytest.raises(run_mlm.UsageError, match="tie_word_embeddings.*--no_pytorch_export"):
        train(
            shards_dir,
            tokenizer_dir,
            output_dir,
            "--config_overrides",
            f"{TINY_MODEL},tie_word_embeddings=false",
        )
    assert not output_dir.exists() or not any(output_dir.iterdir())
