"""Load run_mlm.py's saved folders in transformers 5 with PyTorch and report what a user would get.

Runs in .venv-transformers5 (transformers 5 has no TF models, so it cannot share the TF stack's
virtualenv), started by tests/test_pytorch_export.py, which compares the report with the TF model:

    .venv-transformers5/bin/python tests/transformers5_fill_mask.py request.json report.json

request.json: {"folders": {name: folder}, "sentences": [text with one [MASK], ...], "top_k": 5}. For
each folder the report holds the versions, the loading info of
AutoModelForMaskedLM.from_pretrained(), whether the LM decoder shares the word embeddings, the
padded batch's input ids, attention mask and logits, and the token ids pipeline("fill-mask") ranks
first for each sentence.
"""

import json
import sys


def load_model(folder):
    from transformers import AutoModelForMaskedLM

    model, loading_info = AutoModelForMaskedLM.from_pretrained(folder, output_loading_info=True)
    # from_pretrained does this already; the logits below must be dropout-free whatever it does
    model.eval()
    # Sets of keys (and tuples for mismatched ones) as sorted lists of strings, for JSON.
    info = {key: sorted(str(item) for item in value) for key, value in loading_info.items()}
    return model, info


def shares_word_embeddings(model):
    """True when the LM decoder's matrix is the word-embedding matrix itself, as in the TF model."""
    return (
        model.get_output_embeddings().weight.data_ptr()
        == model.get_input_embeddings().weight.data_ptr()
    )


def batch_logits(model, folder, sentences):
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return {
        "input_ids": batch["input_ids"].tolist(),
        "attention_mask": batch["attention_mask"].tolist(),
        "logits": logits.tolist(),
    }


def pipeline_top_tokens(folder, sentences, top_k):
    from transformers import pipeline

    fill_mask = pipeline("fill-mask", model=folder)
    return [
        {
            "tokens": [guess["token"] for guess in guesses],
            "scores": [guess["score"] for guess in guesses],
        }
        for guesses in (fill_mask(sentence, top_k=top_k) for sentence in sentences)
    ]


def report(folder, sentences, top_k):
    import torch
    import transformers

    model, loading_info = load_model(folder)
    return {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "model_class": type(model).__name__,
        "loading_info": loading_info,
        "shares_word_embeddings": shares_word_embeddings(model),
        **batch_logits(model, folder, sentences),
        "pipeline": pipeline_top_tokens(folder, sentences, top_k),
    }


def write_reports(request_path, report_path, report_on):
    """{name: report_on(folder, request)} for each of the request's "folders", written as JSON."""
    with open(request_path, encoding="utf-8") as file:
        request = json.load(file)
    reports = {name: report_on(folder, request) for name, folder in request["folders"].items()}
    with open(report_path, "w", encoding="utf-8") as file:
        json.dump(reports, file)


def main(request_path, report_path):
    write_reports(
        request_path,
        report_path,
        lambda folder, request: report(folder, request["sentences"], request["top_k"]),
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
