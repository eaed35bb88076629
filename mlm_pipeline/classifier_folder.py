"""What run_classifier.py writes beside the classifier, and where: the model card (README.md: the
task, the data, the score against the majority-class baseline, the pretrained model it came from),
eval_results.json, the replacement of an earlier classifier, and the Hub push (the pytorch/ copy
included, in a folder of its own as in run_mlm.py's pushes).

The folder itself is published by `model_folder.staging()`, config.json last. Local paths are named
by `cards.public_name()`, as in run_mlm.py's card: a card is meant to be public. The score also
goes into the card's metadata (model-index) when the data is a Hub dataset, so the Hub shows it on
the model's page.

Part of run_classifier.py's engine (TensorFlow's file system reads and writes gs:// folders):
imported once TensorFlow may load.
"""

import json
import os
import shutil
import tempfile

import tensorflow as tf

from . import contract, hub, model_folder
from .cards import metadata_block, model_name, public_name
from .contract import FINISHED_RUN_MARKER, MODEL_CARD_NAME, PYTORCH_DIR
from .storage import is_hub_id, is_remote

EVAL_RESULTS_NAME = "eval_results.json"


# The card's outline; each of its fields is filled by the function of the same name.
CARD = """\
{front_matter}

# {title}

{introduction}

## Usage

{usage}

## Data

{data}

## Results

{results}

## Training

{training}
"""

# Loading the classifier {id}, with transformers 4.x and TF; {example} classifies a text (a pair).
USAGE = """\
```python
from transformers import pipeline

classifier = pipeline("text-classification", model="{id}", framework="tf", dtype=None)
{example}
```"""

# The same with transformers 5 and PyTorch, from the copy in {pytorch_dir}/.
USAGE_TRANSFORMERS5 = """

With transformers 5 and PyTorch, the copy in `{pytorch_dir}/`:

```python
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

model = AutoModelForSequenceClassification.from_pretrained("{id}", subfolder="{pytorch_dir}")
tokenizer = AutoTokenizer.from_pretrained("{id}", subfolder="{pytorch_dir}")
classifier = pipeline("text-classification", model=model, tokenizer=tokenizer)
{example}
```"""


def classifier_card(
    classifier,
    settings,
    *,
    train,
    validation,
    label_names,
    scores,
    majority,
    max_length,
    global_batch_size,
    steps,
    minutes,
):
    """The card's text. `classifier`: the fitted TF model; `settings`: run_classifier.py's
    Settings (the model it started from, the data, the training group); `train`, `validation`: the
    LabelledSplits; `scores`: {"accuracy": ..., maybe "f1"} on `validation`; `majority`: the
    accuracy of answering the training split's most frequent label everywhere; then the run's
    sequence length, global batch, optimizer steps and minutes of fine-tuning."""
    model, data, training = settings.model, settings.data, settings.training
    name = model_name(training.hub_model_id, training.output_dir)
    dataset = None if data.train_file else (data.dataset_name, data.dataset_config)
    example = 'print(classifier("A text to classify."))'
    if train.pairs is not None:
        example = 'print(classifier({"text": "A first text.", "text_pair": "Its partner."}))'
    return CARD.format(
        front_matter=front_matter(classifier.config, model, dataset, scores, name),
        title=name,
        introduction=introduction(classifier, label_names, model),
        usage=usage(name, example, pytorch_copy=not training.no_pytorch_export),
        data=data_line(dataset, train, validation),
        results=results(scores, validation, majority),
        training=training_table(training, max_length, global_batch_size, steps, minutes),
    )


def front_matter(config, model, dataset, scores, name):
    """The metadata block; for a Hub dataset the scores too (model-index: the Hub shows them on the
    model's page), and the pretrained model's Hub id as base_model."""
    metadata = dict(
        library_name="transformers",
        pipeline_tag="text-classification",
        tags=["text-classification", "tensorflow", config.model_type],
        metrics=list(scores),
    )
    if dataset is not None and is_hub_id(dataset[0]):
        from huggingface_hub import EvalResult

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
    if not model.from_scratch and is_hub_id(model.model_name_or_path):
        metadata["base_model"] = model.model_name_or_path
    return metadata_block(**metadata)


def introduction(classifier, label_names, model):
    """What the classifier is, and where its weights started."""
    start = public_name(model.model_name_or_path)
    if model.from_scratch:
        origin = (
            f"from random weights (`--from_scratch`): the architecture of `{start}`, none of its "
            "weights. It is the baseline that shows what pretraining adds"
        )
    else:
        origin = f"from the masked language model `{start}` (pretrained by `run_mlm.py`)"
    labels = ", ".join(f"{index}: `{label}`" for index, label in enumerate(label_names))
    return (
        f"A {classifier.config.model_type} text classifier ({classifier.count_params():,} "
        f"parameters, {len(label_names)} labels: {labels}), fine-tuned by `run_classifier.py` "
        f"with Keras `fit` {origin}."
    )


def usage(name, example, pytorch_copy):
    """USAGE, and USAGE_TRANSFORMERS5 when the folder holds the PyTorch copy."""
    text = USAGE.format(id=name, example=example)
    if pytorch_copy:
        text += USAGE_TRANSFORMERS5.format(id=name, example=example, pytorch_dir=PYTORCH_DIR)
    return text


def data_line(dataset, train, validation):
    """The examples trained and scored on: a Hub dataset's splits, a local dataset, or files."""
    data = f"`{public_name(train.source)}` and `{public_name(validation.source)}`"
    if dataset is not None and is_hub_id(dataset[0]):
        data = (
            f"the Hub dataset `{dataset[0]}` (config `{dataset[1]}`), splits train and validation"
        )
    elif dataset is not None:
        data = f"the dataset `{public_name(dataset[0])}` (config `{dataset[1]}`)"
    return (
        f"Trained on {data}: {len(train):,} training and {len(validation):,} validation examples"
        f"{', text pairs' if train.pairs is not None else ''}."
    )


def results(scores, validation, majority):
    """The validation scores, beside the majority-class baseline."""
    rows = "\n".join(f"| {metric} | {value:.4f} |" for metric, value in scores.items())
    return (
        f"On the {len(validation):,} validation examples (answering the training split's most "
        f"frequent label everywhere scores {majority:.4f}):\n\n"
        f"| metric | validation |\n|---|---|\n{rows}"
    )


def training_table(training, max_length, global_batch_size, steps, minutes):
    """The settings table: the Training group's, and the run's length, batch, steps and time."""
    rows = [
        f"| sequence length | {max_length} tokens (longer texts cut, shorter padded) |",
        f"| batch | {global_batch_size} examples |",
        f"| steps | {steps:,} ({training.num_epochs} epochs) |",
        f"| optimizer | AdamW, peak learning rate {training.learning_rate:g}, linear warmup "
        f"over {training.warmup_ratio:g} of the steps, then linear decay to 0 |",
        f"| seed | {training.seed} |",
        f"| time | {minutes:.1f} minutes of fine-tuning |",
    ]
    return "\n".join(["| setting | value |", "|---|---|", *rows])


def save_classifier(settings, classifier, tokenizer, task, scores, steps, minutes):
    """The fine-tuned `classifier`'s folder, as run_classifier.py's `settings` say, and its card's
    text (for the Hub push): `task`, its classifier_model.ClassifierData; `scores` on its
    validation split after `steps` optimizer steps, `minutes` of fine-tuning. Staged, then
    published with config.json last, so no half-written folder looks done (model_folder.staging):
    the model and its `tokenizer` (model_folder.save_model, with the pytorch/ copy unless
    --no_pytorch_export), the card and eval_results.json. An earlier classifier's config.json
    goes first (stop_looking_finished)."""
    output_dir, pytorch_export = (
        settings.training.output_dir,
        not settings.training.no_pytorch_export,
    )
    card_text = classifier_card(
        classifier,
        settings,
        train=task.train,
        validation=task.validation,
        label_names=task.label_names,
        scores=scores,
        majority=task.majority_share(),
        max_length=task.max_length,
        global_batch_size=task.global_batch_size,
        steps=steps,
        minutes=minutes,
    )
    stop_looking_finished(output_dir)
    with model_folder.staging(output_dir) as folder:
        model_folder.save_model(folder, classifier, tokenizer, task.max_length, pytorch_export)
        write_card_and_scores(folder, card_text, scores)
    saved = "its tokenizer, PyTorch copy," if pytorch_export else "its tokenizer,"
    print(f"Saved the classifier, {saved} card and eval_results.json to {output_dir}.")
    return card_text


def write_card_and_scores(folder, card_text, scores):
    """README.md and eval_results.json ({"accuracy": ..., ...}) into a local folder."""
    with open(f"{folder}/{MODEL_CARD_NAME}", "w", encoding="utf-8") as file:
        file.write(card_text)
    with open(f"{folder}/{EVAL_RESULTS_NAME}", "w", encoding="utf-8") as file:
        file.write(json.dumps(scores, indent=2) + "\n")


def stop_looking_finished(output_dir):
    """--overwrite_output_dir: the earlier classifier's config.json goes before any new file lands,
    so that the folder never holds the new weights under the old config."""
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
