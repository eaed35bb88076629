"""What run_classifier.py writes beside the classifier, and where: the model card (README.md: the
task, the data, the score against the majority-class baseline, the pretrained model it came from),
eval_results.json, the replacement of an earlier classifier, and the Hub push (the pytorch/ copy
included, in a folder of its own as in run_mlm.py's pushes).

The folder itself is published by `model_folder.staging()`, config.json last. Local paths are named
by `cards.public_name()`, as in run_mlm.py's card: a card is meant to be public. The score also
goes into the card's metadata (model-index) when the data is a Hub dataset, so the Hub shows it on
the model's page.
"""

import json
import os
import shutil
import tempfile

from . import contract, hub
from .cards import metadata_block, public_name
from .contract import FINISHED_RUN_MARKER, MODEL_CARD_NAME, PYTORCH_DIR
from .storage import is_remote

EVAL_RESULTS_NAME = "eval_results.json"


def classifier_card(
    classifier,
    *,
    name,
    pretrained,
    from_scratch,
    dataset,
    train,
    validation,
    label_names,
    scores,
    majority,
    settings,
    pytorch_copy=True,
):
    """The card's text. `classifier`: the fitted TF model; `name`: what the usage snippet loads (a
    Hub id, or the output folder's name); `pretrained`: --model_name_or_path as given; `dataset`:
    (Hub id, config), or None for local files; `train`, `validation`: the LabelledSplits; `scores`:
    {"accuracy": ..., maybe "f1"} on `validation`; `majority`: the accuracy of answering the
    training split's most frequent label everywhere; `settings`: the training settings by name
    (max_length, global_batch_size, num_epochs, steps, learning_rate, warmup_ratio, seed,
    minutes); `pytorch_copy`: the folder holds the pytorch/ copy for transformers 5."""
    config = classifier.config
    start = public_name(pretrained)
    if from_scratch:
        origin = (
            f"from random weights (`--from_scratch`): the architecture of `{start}`, none of its "
            "weights. It is the baseline that shows what pretraining adds"
        )
    else:
        origin = f"from the masked language model `{start}` (pretrained by `run_mlm.py`)"
    data = f"`{public_name(train.source)}` and `{public_name(validation.source)}`"
    if dataset is not None:
        data = f"the dataset `{public_name(dataset[0])}` (config `{dataset[1]}`)"
    metadata = dict(
        library_name="transformers",
        pipeline_tag="text-classification",
        tags=["text-classification", "tensorflow", config.model_type],
        metrics=list(scores),
    )
    if dataset is not None and public_name(dataset[0]) == dataset[0]:  # a Hub id, not a folder
        from huggingface_hub import EvalResult

        data = (
            f"the Hub dataset `{dataset[0]}` (config `{dataset[1]}`), splits train and validation"
        )
        metadata.update(datasets=[dataset[0]], model_name=name)
        metadata["eval_results"] = [
            EvalResult(
                task_type="text-classification",
                dataset_type=dataset[0],
                dataset_name=f"{dataset[0]} {dataset[1]}",
                dataset_config=dataset[1],
                dataset_split="validation",
                metric_type=metric,
                metric_value=round(value, 4),
            )
            for metric, value in scores.items()
        ]
    if not from_scratch and public_name(pretrained) == pretrained and "://" not in pretrained:
        metadata["base_model"] = pretrained
    example = 'print(classifier("A text to classify."))'
    if train.pairs is not None:
        example = 'print(classifier({"text": "A first text.", "text_pair": "Its partner."}))'
    transformers5 = []
    if pytorch_copy:
        transformers5 = [
            "",
            f"With transformers 5 and PyTorch, the copy in `{PYTORCH_DIR}/`:",
            "",
            "```python",
            "from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline",
            "",
            f'model = AutoModelForSequenceClassification.from_pretrained("{name}", '
            f'subfolder="{PYTORCH_DIR}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{name}", subfolder="{PYTORCH_DIR}")',
            'classifier = pipeline("text-classification", model=model, tokenizer=tokenizer)',
            example,
            "```",
        ]
    score_rows = [f"| {metric} | {value:.4f} |" for metric, value in scores.items()]
    labels = ", ".join(f"{index}: `{label}`" for index, label in enumerate(label_names))
    lines = [
        metadata_block(**metadata),
        "",
        f"# {name}",
        "",
        f"A {config.model_type} text classifier ({classifier.count_params():,} parameters, "
        f"{len(label_names)} labels: {labels}), fine-tuned by `run_classifier.py` with Keras `fit` "
        f"{origin}.",
        "",
        "## Usage",
        "",
        "```python",
        "from transformers import pipeline",
        "",
        f'classifier = pipeline("text-classification", model="{name}", framework="tf", dtype=None)',
        example,
        "```",
        *transformers5,
        "",
        "## Data",
        "",
        f"Trained on {data}: {len(train):,} training and {len(validation):,} validation examples"
        f"{', text pairs' if train.pairs is not None else ''}.",
        "",
        "## Results",
        "",
        f"On the {len(validation):,} validation examples (answering the training split's most "
        f"frequent label everywhere scores {majority:.4f}):",
        "",
        "| metric | validation |",
        "|---|---|",
        *score_rows,
        "",
        "## Training",
        "",
        "| setting | value |",
        "|---|---|",
        f"| sequence length | {settings['max_length']} tokens (longer texts cut, shorter padded) |",
        f"| batch | {settings['global_batch_size']} examples |",
        f"| steps | {settings['steps']:,} ({settings['num_epochs']} epochs) |",
        f"| optimizer | AdamW, peak learning rate {settings['learning_rate']:g}, linear warmup "
        f"over {settings['warmup_ratio']:g} of the steps, then linear decay to 0 |",
        f"| seed | {settings['seed']} |",
        f"| time | {settings['minutes']:.1f} minutes of fine-tuning |",
        "",
    ]
    return "\n".join(lines)


def write_card_and_scores(folder, card_text, scores):
    """README.md and eval_results.json ({"accuracy": ..., ...}) into a local folder."""
    with open(f"{folder}/{MODEL_CARD_NAME}", "w", encoding="utf-8") as file:
        file.write(card_text)
    with open(f"{folder}/{EVAL_RESULTS_NAME}", "w", encoding="utf-8") as file:
        file.write(json.dumps(scores, indent=2) + "\n")


def stop_looking_finished(output_dir):
    """--overwrite_output_dir: the earlier classifier's config.json goes before any new file lands,
    so that the folder never holds the new weights under the old config."""
    import tensorflow as tf

    marker = f"{output_dir.rstrip('/')}/{FINISHED_RUN_MARKER}"
    if tf.io.gfile.exists(marker):
        tf.io.gfile.remove(marker)


def push_to_hub(repo_id, output_dir, card_text, scores):
    """One commit of the saved folder's files to `repo_id` (opened before training). A gs://
    --output_dir is pushed from a local copy, which a failed push leaves in place: the one-line
    error names it and says how to push it later."""
    message = "Fine-tuned classifier: " + ", ".join(f"{k} {v:.4f}" for k, v in scores.items())
    folder = output_dir
    if is_remote(output_dir):
        folder = tempfile.mkdtemp(prefix="classifier-")
        copy_saved_folder(output_dir, folder)
    names = [name for name in files_to_push(folder) if name != MODEL_CARD_NAME]
    commit = hub.push_folder_files(repo_id, folder, names, card_text, message, "the classifier")
    if folder != output_dir:
        shutil.rmtree(folder)
    print(f"Pushed the saved classifier folder to the Hub: {commit.commit_url}")


def copy_saved_folder(output_dir, folder):
    """Copy the classifier saved in gs:// `output_dir`, its pytorch/ copy included, into the local
    `folder`."""
    import tensorflow as tf

    contract.copy_folder_files(output_dir, folder)
    pytorch_copy = f"{output_dir.rstrip('/')}/{PYTORCH_DIR}"
    if tf.io.gfile.isdir(pytorch_copy):
        os.makedirs(os.path.join(folder, PYTORCH_DIR))
        contract.copy_folder_files(pytorch_copy, os.path.join(folder, PYTORCH_DIR))


def files_to_push(folder):
    """The saved folder's files, then its pytorch/ copy's, as paths in the repository
    (`pytorch/model.safetensors`): the layout of run_mlm.py's pushes."""
    names = []
    for subfolder in ("", PYTORCH_DIR):
        where = os.path.join(folder, subfolder)
        if os.path.isdir(where):
            names += [
                f"{subfolder}/{name}".lstrip("/")
                for name in sorted(os.listdir(where))
                if os.path.isfile(os.path.join(where, name))
            ]
    return names
