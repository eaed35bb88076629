"""Load run_mlm.py's PyTorch copies of masked LMs as sequence classifiers in transformers 5 and
report which weights it takes from the masked LM and their values: where a classifier fine-tuned
in transformers 5 starts.

Runs in .venv-transformers5 (transformers 5 has no TF models), started by
tests/test_classifier_export.py, which compares the report with the TF classifier
run_classifier.py builds from the same masked LM:

    .venv-transformers5/bin/python tests/transformers5_classifier_start.py request report

request (JSON): {"folders": {name: folder}, "num_labels": n}. For each folder the report holds the
class AutoModelForSequenceClassification.from_pretrained() builds, the weights it reports missing
(made anew: the classifier's new head) and unexpected (the masked LM's, left out), and every weight
of its state dict as nested lists.
"""

import sys

# the report file, as for the masked LMs (this folder is on the path: Python puts a script's own
# folder first)
from transformers5_fill_mask import write_reports


def report(folder, num_labels):
    from transformers import AutoModelForSequenceClassification

    model, loading_info = AutoModelForSequenceClassification.from_pretrained(
        folder, num_labels=num_labels, output_loading_info=True
    )
    return {
        "model_class": type(model).__name__,
        "missing_keys": sorted(loading_info["missing_keys"]),
        "unexpected_keys": sorted(loading_info["unexpected_keys"]),
        "weights": {name: tensor.tolist() for name, tensor in model.state_dict().items()},
    }


def main(request_path, report_path):
    write_reports(
        request_path,
        report_path,
        lambda folder, request: report(folder, request["num_labels"]),
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
