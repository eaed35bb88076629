"""run_classifier.py's PyTorch copy (pytorch/model.safetensors), loaded the way a user of
transformers 5 would load it.

For each exported model type, run_classifier.main() fine-tunes a tiny classifier for a few steps
(from random weights, --from_scratch: the copy is written from the TF classifier whatever its
weights started from, and the pretrained path is test_run_classifier.py's) on the session's
labelled task. Then one subprocess in the transformers 5 virtualenv (.venv-transformers5)
loads every copy with AutoModelForSequenceClassification and pipeline("text-classification")
(tests/transformers5_text_classification.py): the weights all load, the head is the TF one's
(labels, problem type, pooling), the logits and labels match the TF classifier's on a padded
batch, and the accuracy on the evaluation examples is the one run_classifier.py reported.
"""

import json

import numpy as np
import pytest
from helpers import REPO, TINY_MODEL, flags, require_transformers5, run_in_transformers5

import run_classifier
from mlm_pipeline import architecture, contract
from mlm_pipeline.errors import UsageError

TRANSFORMERS5_SCRIPT = REPO / "tests" / "transformers5_text_classification.py"

MODEL_TYPES = ("roberta", "roberta-prelayernorm", "bert", "xlm-roberta", "modernbert")
# ModernBERT with global and local layers both, its window of 8 tokens shorter than the sentences,
# and the mean over the tokens as the pooling (not the default "cls"), so the copy's config must
# carry it and its padding must be left out as in TF.
MODERNBERT_MODEL = (
    "hidden_size=32,num_hidden_layers=4,num_attention_heads=2,intermediate_size=64,"
    "global_attn_every_n_layers=3,local_attention=8,classifier_pooling=mean"
)
# The tiny model, its weights drawn wider than transformers' 0.02: a few steps from 0.02 leave a
# classifier whose logits hardly depend on the text (about 0.01, the same label for every example),
# which would hold the copy to little.
SPREAD_MODEL = f"{TINY_MODEL},initializer_range=0.2"
MAX_LENGTH = 32  # tokens the classifiers are trained on: the session tokenizer's sentences fit
# Padded to the longest, so the comparison also covers padding.
SENTENCES = [
    "The bright garden of the old city.",
    "In the morning the young teacher wrote a long letter to the famous painter of the dark "
    "northern island.",
    "Heavy stone.",
]
# Float32 on both sides, different kernels: observed differences are ~1e-6.
RTOL, ATOL = 1e-4, 1e-4
# What transformers builds the head from (classifier_pooling: ModernBERT's alone).
HEAD_FIELDS = ("num_labels", "id2label", "label2id", "problem_type", "classifier_pooling")


def architecture_folder(folder, model_type, tokenizer, overrides=TINY_MODEL):
    """What run_classifier.py --from_scratch reads: a config.json of `model_type` (sizes from
    `overrides`) fitted to the tokenizer, as run_mlm.py builds it, and the tokenizer."""
    folder.mkdir()
    source = folder / "source.json"
    source.write_text(json.dumps({"model_type": model_type}))
    config = architecture.load_config(str(source), overrides)
    architecture.fit_to_tokenizer(config, tokenizer, MAX_LENGTH)
    source.unlink()
    config.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def fine_tune(model, output_dir, labelled, *extra):
    """run_classifier.main() from random weights: 8 steps of 16 examples, every batch of
    MAX_LENGTH tokens, at a peak learning rate high enough for the answers to differ by example."""
    argv = flags(
        no_tpu=True,
        model_name_or_path=model,
        output_dir=output_dir,
        from_scratch=True,
        train_file=labelled["train"],
        validation_file=labelled["validation"],
        limit=64,
        per_replica_batch_size=16,
        num_epochs=2,
        learning_rate="1e-2",
        max_length=MAX_LENGTH,
        pad_to_max_length=True,
        seed=0,
    )
    return run_classifier.main(run_classifier.parse_args([*argv, *map(str, extra)]))


@pytest.fixture(scope="module")
def transformers5_python():
    """The transformers 5 virtualenv's python, checked before any classifier is trained for it."""
    return require_transformers5()


@pytest.fixture(scope="module")
def trained(labelled, tokenizer, tmp_path_factory):
    """{model type: (its saved classifier's folder, the scores run_classifier.main() returned)}."""
    folder = tmp_path_factory.mktemp("classifiers")
    classifiers = {}
    for model_type in MODEL_TYPES:
        overrides = MODERNBERT_MODEL if model_type == "modernbert" else SPREAD_MODEL
        model = architecture_folder(folder / model_type, model_type, tokenizer, overrides)
        output_dir = folder / f"{model_type}-classifier"
        classifiers[model_type] = (output_dir, fine_tune(model, output_dir, labelled))
    return classifiers


def validation_rows(labelled):
    lines = labelled["validation"].read_text(encoding="utf-8").splitlines()[1:]
    return [(text, int(label)) for text, label in (line.split("\t") for line in lines)]


@pytest.fixture(scope="module")
def transformers5(transformers5_python, trained, labelled, tmp_path_factory):
    """{model type: what transformers 5 made of the copy}, from one subprocess."""
    folder = tmp_path_factory.mktemp("transformers5")
    request, report = folder / "request.json", folder / "report.json"
    rows = validation_rows(labelled)
    folders = {
        model_type: str(output_dir / contract.PYTORCH_DIR)
        for model_type, (output_dir, _) in trained.items()
    }
    evaluation = {"texts": [text for text, _ in rows], "labels": [label for _, label in rows]}
    request.write_text(json.dumps({"folders": folders, "sentences": SENTENCES, "eval": evaluation}))
    return run_in_transformers5(TRANSFORMERS5_SCRIPT, request, report, "the copies")


@pytest.fixture(scope="module")
def tensorflow(trained):
    """{model type: the saved TF classifier's head fields (HEAD_FIELDS, as JSON has them), and its
    padded batch and logits for SENTENCES}."""
    from transformers import AutoConfig, AutoTokenizer, TFAutoModelForSequenceClassification

    results = {}
    for model_type, (output_dir, _) in trained.items():
        config = AutoConfig.from_pretrained(str(output_dir))
        architecture.register_tf_family(config)  # ModernBERT's TF classes
        classifier = TFAutoModelForSequenceClassification.from_pretrained(str(output_dir))
        tokenizer = AutoTokenizer.from_pretrained(str(output_dir))
        batch = tokenizer(SENTENCES, padding=True, return_tensors="np")
        logits = classifier(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], training=False
        ).logits
        head = {name: getattr(classifier.config, name, None) for name in HEAD_FIELDS}
        head["id2label"] = {str(index): label for index, label in head["id2label"].items()}
        head["architectures"] = config.architectures  # as saved, e.g. ["BertFor..."]
        results[model_type] = {"config": head, **batch, "logits": logits.numpy()}
    return results


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_transformers5_builds_the_same_head_with_every_weight(
    model_type, transformers5, tensorflow
):
    found, config = transformers5[model_type], tensorflow[model_type]["config"]
    assert found["model_class"] == config["architectures"][0]  # e.g. BertForSequenceClassification
    info = found["loading_info"]
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [], info
    assert info["mismatched_keys"] == [] and info["error_msgs"] == [], info
    head = found["config"]
    assert head == {name: config[name] for name in HEAD_FIELDS}
    assert head["num_labels"] == 2 and head["problem_type"] == "single_label_classification"
    assert head["id2label"] == {"0": "LABEL_0", "1": "LABEL_1"}
    if model_type == "modernbert":
        assert head["classifier_pooling"] == "mean"


def softmax(logits):
    exponentials = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exponentials / exponentials.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_transformers5_logits_and_labels_match_tensorflow(model_type, transformers5, tensorflow):
    expected, found = tensorflow[model_type], transformers5[model_type]
    # The same ids through both tokenizer versions, padding included.
    assert found["input_ids"] == expected["input_ids"].tolist()
    assert found["attention_mask"] == expected["attention_mask"].tolist()
    assert 0 in expected["attention_mask"]  # some padding, which the logits must not see
    torch_logits = np.asarray(found["logits"], dtype=np.float32)
    np.testing.assert_allclose(torch_logits, expected["logits"], rtol=RTOL, atol=ATOL)
    labels = expected["config"]["id2label"]
    predicted = [labels[str(index)] for index in expected["logits"].argmax(axis=-1)]
    assert [labels[str(index)] for index in torch_logits.argmax(axis=-1)] == predicted
    # pipeline("text-classification"): every label's score is the TF classifier's softmax
    for sentence, scores, probabilities in zip(
        SENTENCES, found["pipeline_scores"], softmax(expected["logits"])
    ):
        assert max(scores, key=scores.get) == predicted[SENTENCES.index(sentence)], sentence
        np.testing.assert_allclose(
            [scores[labels[str(index)]] for index in range(len(labels))],
            probabilities,
            rtol=RTOL,
            atol=1e-6,
            err_msg=sentence,
        )


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_transformers5_scores_what_run_classifier_reported(model_type, transformers5, trained):
    output_dir, scores = trained[model_type]
    assert json.loads((output_dir / "eval_results.json").read_text()) == scores
    found = transformers5[model_type]
    assert found["eval_accuracy"] == scores["accuracy"]
    assert 0 < sum(found["eval_predictions"]) < len(found["eval_predictions"])  # both labels


def test_an_unexported_model_type_is_refused_before_training(labelled, tokenizer, tmp_path):
    """ELECTRA has a TF classifier but no PyTorch copy here: one line that names the way out,
    before anything is written."""
    electra = architecture_folder(tmp_path / "electra", "electra", tokenizer)
    output_dir = tmp_path / "classifier"
    with pytest.raises(UsageError) as refusal:
        fine_tune(electra, output_dir, labelled)
    message = str(refusal.value)  # what `run_classifier.py: error: ` precedes on the command line
    assert "\n" not in message and "not electra" in message and "--no_pytorch_export" in message
    assert not output_dir.exists()
