"""Load run_classifier.py's PyTorch copies in transformers 5 with PyTorch and report what a user
would get.

Runs in .venv-transformers5 (transformers 5 has no TF models), started by
tests/test_classifier_export.py, which compares the report with the TF classifiers:

    .venv-transformers5/bin/python tests/transformers5_text_classification.py request report

request (JSON): {"folders": {name: folder}, "sentences": [text, ...], "eval": {"texts": [...],
"labels": [index, ...]}}. For each folder the report holds the versions, the class and loading info
of AutoModelForSequenceClassification.from_pretrained(), the config fields the head is built from,
the padded batch's input ids, attention mask and logits for the sentences, pipeline
("text-classification")'s scores of every label for them, and its answers and accuracy on the
evaluation examples.
"""

import sys

# the padded batch's ids, mask and logits, and the report file, as for the masked LMs (this folder
# is on the path: Python puts a script's own folder first)
from transformers5_fill_mask import batch_logits, write_reports

HEAD_FIELDS = ("num_labels", "id2label", "label2id", "problem_type", "classifier_pooling")


def load_model(folder):
    from transformers import AutoModelForSequenceClassification

    model, loading_info = AutoModelForSequenceClassification.from_pretrained(
        folder, output_loading_info=True
    )
    model.eval()  # from_pretrained does this already; the logits must be dropout-free
    # Sets of keys (and tuples for mismatched ones) as sorted lists of strings, for JSON.
    info = {key: sorted(str(item) for item in value) for key, value in loading_info.items()}
    return model, info


def pipeline_answers(folder, sentences, evaluation):
    """Every label's score for each sentence; the top label for each evaluation text (cut to the
    length the classifier was trained on, as run_classifier.py cuts them) and their accuracy."""
    from transformers import pipeline

    classify = pipeline("text-classification", model=folder)
    scores = [
        {answer["label"]: answer["score"] for answer in answers}
        for answers in classify(sentences, top_k=None)
    ]
    answers = classify(evaluation["texts"], truncation=True, batch_size=16)
    predicted = [classify.model.config.label2id[answer["label"]] for answer in answers]
    right = sum(guess == truth for guess, truth in zip(predicted, evaluation["labels"]))
    return {
        "pipeline_scores": scores,
        "eval_predictions": predicted,
        "eval_accuracy": right / len(predicted),
    }


def report(folder, sentences, evaluation):
    import torch
    import transformers

    model, loading_info = load_model(folder)
    return {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "model_class": type(model).__name__,
        "loading_info": loading_info,
        "config": {name: getattr(model.config, name, None) for name in HEAD_FIELDS},
        **batch_logits(model, folder, sentences),
        **pipeline_answers(folder, sentences, evaluation),
    }


def main(request_path, report_path):
    write_reports(
        request_path,
        report_path,
        lambda folder, request: report(folder, request["sentences"], request["eval"]),
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
