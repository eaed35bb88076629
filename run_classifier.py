#!/usr/bin/env python
"""Step 4 of 4: fine-tune the pretrained model on a text classification task and score it: did the
pretraining pay off?

Loads a run_mlm.py output folder (local, gs://, or a Hub id) as a transformers TF sequence
classifier, its encoder pretrained and a new classification head on top, and fine-tunes it with
Keras fit on a Hub dataset (GLUE's SST-2 by default) or local .tsv/.csv/.jsonl files. Every
example is cut to --max_length tokens; training batches hold examples of about one length, padded to
16, 32, 64... tokens, so short sentences cost short steps (on a TPU, or with --pad_to_max_length,
every batch is padded to --max_length: one shape, one compiled program). The saved
folder loads with `pipeline("text-classification", model=output_dir)`; its pytorch/ folder, the same
classifier in PyTorch's names, with transformers 5's `AutoModelForSequenceClassification`;
eval_results.json holds the validation scores, README.md the model card.

    # SST-2 from the Hub on a CPU or GPUs, with the model the quickstart pretrained
    python run_classifier.py --no_tpu --model_name_or_path quickstart_output/model \
        --output_dir sst2-classifier

    # the same architecture from random weights: what the pretraining added
    python run_classifier.py --no_tpu --model_name_or_path quickstart_output/model \
        --output_dir sst2-from-scratch --from_scratch

    # a pair task from local files, on a TPU VM
    python run_classifier.py --model_name_or_path gs://my-bucket/roberta-base \
        --train_file mrpc/train.tsv --validation_file mrpc/dev.tsv --text_column sentence1 \
        --text_pair_column sentence2 --output_dir gs://my-bucket/roberta-base-mrpc

The plumbing (reading and checking the data, the model folder, the card, the Hub) is in
mlm_pipeline/. This file is the front: its settings, their checks and the TPU's start-up import no
TensorFlow, so `--help` and a bad flag answer at once; main() crosses into the engine
(classifier_model.py: the batches, the model, its fit and scores) in one place, after
tpu_runtime.prepare_runtime().
"""

import dataclasses
import functools
from typing import Optional

from mlm_pipeline import hardware, hub, model_folder, tf_startup, tpu_runtime
from mlm_pipeline.errors import (
    UsageError,
    exit_on_usage_error,
    fraction_below_one,
    positive_float,
    positive_int,
)
from mlm_pipeline.settings import parse_command_line, setting

# Most SST-2 sentences fit in 64 tokens of a small Unigram vocabulary.
DEFAULT_MAX_LENGTH = 64

# The settings, each declared once: a field of its group, with its flag's help, type and default;
# the command line is built from the groups (parse_args).


@dataclasses.dataclass(frozen=True)
class Model:
    """The pretrained model to fine-tune."""

    model_name_or_path: str = setting(
        "the run_mlm.py output folder (local or gs://) or Hub id to start from", required=True
    )
    from_scratch: bool = setting(
        "train the same architecture from random weights instead (the baseline that shows what "
        "pretraining adds)",
        False,
    )


@dataclasses.dataclass(frozen=True)
class Data:
    """The labelled examples: a Hub dataset, or local files."""

    dataset_name: str = setting(
        "the Hub dataset whose train and validation splits are the task (GLUE's)", "nyu-mll/glue"
    )
    dataset_config: str = setting("the dataset's configuration, i.e. its task", "sst2")
    train_file: Optional[str] = setting(
        "a local .tsv, .csv or .jsonl file of training examples, with a header; instead of "
        "--dataset_name"
    )
    validation_file: Optional[str] = setting(
        "the local file of validation examples, with --train_file"
    )
    text_column: str = setting("the column that holds the text", "sentence")
    text_pair_column: Optional[str] = setting(
        "the column that holds the second text of pair tasks (MRPC, RTE: sentence2)"
    )
    label_column: str = setting("the column of integer labels 0..n-1", "label")
    limit: Optional[int] = setting("train on the first N training examples only", type=positive_int)
    max_length: Optional[int] = setting(
        f"tokens every example is cut or padded to; when not given, {DEFAULT_MAX_LENGTH} or the "
        "length the model was pretrained on if that is shorter",
        type=positive_int,
    )
    pad_to_max_length: bool = setting(
        "pad every training batch to --max_length (always on a TPU), instead of to the shortest "
        "of 16, 32, 64... tokens that holds its examples",
        False,
    )

    def __post_init__(self):
        if bool(self.train_file) != bool(self.validation_file):
            given = "--train_file" if self.train_file else "--validation_file"
            raise UsageError(
                f"{given} needs its partner: pass both --train_file and --validation_file (the "
                "score is measured on the validation file), or neither to read --dataset_name."
            )


# The defaults fine-tune BENCHMARKS.md's small CPU models on SST-2 in 2.5 minutes on 2 cores:
# 2 epochs of 32 examples a batch at a peak of 3e-4 through the first token's head, no dropout
# but the pretrained config's. On SST-2's validation split (BENCHMARKS.md) they beat peaks of
# 1e-4, 2e-4 and 1e-3, dropout 0.1, one or three epochs, 128 tokens, and a head on the mean of
# the token states, and tie batches of 16 and peaks of 5e-4 and 7e-4. A base-size model wants a
# lower peak (BERT: 2e-5 to 5e-5) and its dropout of 0.1.
@dataclasses.dataclass(frozen=True)
class Training:
    """How to fine-tune, and where the classifier goes."""

    output_dir: str = setting("where the classifier is saved (local or gs://)", required=True)
    overwrite_output_dir: bool = setting("replace a classifier already saved there", False)
    per_replica_batch_size: int = setting(
        "examples each replica takes a step", 32, type=positive_int
    )
    num_epochs: int = setting("passes over the training examples", 2, type=positive_int)
    preflight: bool = setting(
        "before a long run: build everything, time a few steps after the compile, and print the "
        "hardware, seconds a step, peak memory and the run's projected time; write nothing",
        False,
    )
    learning_rate: float = setting("the peak learning rate", 3e-4, type=positive_float)
    warmup_ratio: float = setting(
        "the share of the steps over which the learning rate rises to its peak (it then falls "
        "linearly to 0)",
        0.1,
        type=fraction_below_one,
    )
    dropout: Optional[float] = setting(
        "the dropout rate in the encoder and the new head while fine-tuning; when not given, the "
        "pretrained config's (BENCHMARKS.md's CPU recipe pretrains with none)",
        type=fraction_below_one,
    )
    seed: int = setting("seed of the new head's weights and the shuffling", 42, type=int)
    hub_model_id: Optional[str] = setting(
        "also push the classifier to this Hub repository (namespace/name)"
    )
    hub_private: bool = setting("create the --hub_model_id repository private", False)
    no_pytorch_export: bool = setting(
        "skip the pytorch/ copy of the classifier that transformers 5 loads", False
    )

    def __post_init__(self):
        hub.check_hub_flags(self.hub_model_id, self.hub_private, "my-user/roberta-sst2")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every group of run_classifier.py's settings, named as its --help group."""

    model: Model
    data: Data
    training: Training
    hardware: hardware.Hardware


def parse_args(argv=None):
    """The command line as Settings; a flag or a rule broken is refused in one line."""
    return parse_command_line(
        Settings,
        argv,
        prog="run_classifier.py",
        description="Fine-tune a pretrained masked language model on a text classification task.",
    )


def check_before_work(settings):
    """Before any work, one line for what cannot work: the gs:// paths probed, the output folder
    (model_folder.py), the Hub repository opened (created if need be) for --hub_model_id; its id,
    or None without a push (or under --preflight, which writes nothing)."""
    model, training = settings.model, settings.training
    inputs = {"--model_name_or_path": model.model_name_or_path}
    model_folder.check_output(training, inputs, write_probe=not training.preflight)
    if training.hub_model_id and not training.preflight:  # an unusable Hub stops the run now
        return hub.open_repository(training.hub_model_id, training.hub_private, "--hub_model_id")
    return None


def main(settings, callbacks=()):
    """Fine-tune, evaluate and save as `settings` say (parse_args(): the command line's, its rules
    checked); returns the validation scores. `callbacks`: Keras callbacks for fit()
    (benchmarks/classifier_speed.py times the steps with one)."""
    tpu_runtime.prepare_runtime(settings.hardware)  # PJRT, before TensorFlow loads; or why not
    model, data, training = settings.model, settings.data, settings.training
    repo_id = check_before_work(settings)
    with tf_startup.tensorflow_startup_log_held_back():  # TF's start-up log, shown if it fails
        # the engine: TensorFlow loads here
        from mlm_pipeline import (
            classifier_folder,
            classifier_model,
            hosts,
            preflight,
            pretrained_model,
        )
    strategy = hosts.build_strategy(settings.hardware)

    # The pretrained folder: its config and tokenizer (the weights load with the model, below).
    pretrained = pretrained_model.PretrainedModel(
        model.model_name_or_path, weights=not model.from_scratch
    )
    max_length = pretrained.check_max_length(data.max_length, DEFAULT_MAX_LENGTH)
    pytorch_export = not training.no_pytorch_export
    if pytorch_export:  # a copy that cannot be written is refused now, not after training
        model_folder.check_pytorch_copy(pretrained.config, masked_lm=False)

    # The data: texts and labels, checked; token ids of one length; batches of one shape.
    task = classifier_model.classifier_data(data, training, pretrained, strategy, max_length)

    # The model: the pretrained encoder and a new head, AdamW over every step of the run.
    total_steps = training.num_epochs * task.steps_per_epoch
    classifier = classifier_model.build_classifier(
        pretrained, strategy, task.label_names, total_steps, model.from_scratch, training
    )
    print(fine_tuning_line(classifier, settings, task))
    if training.preflight:  # a few of fit()'s steps timed, the run projected, nothing written
        batches = (task.train_dataset, total_steps, task.eval_dataset, task.eval_batches)
        save = functools.partial(  # the final save, timed into a temporary folder
            model_folder.save_model,
            tokenizer=pretrained.tokenizer,
            max_length=max_length,
            pytorch_export=pytorch_export,
        )
        return preflight.preflight_classifier(
            classifier, training, batches, max_length, task.bucket_lengths, save
        )

    # Fit, scored on the validation split after every epoch; then the final scores.
    minutes = classifier_model.fit(classifier, task, training.num_epochs, callbacks)
    scores = classifier_model.evaluate(classifier, task, data.text_pair_column is not None)
    print(validation_line(scores, task, minutes))

    # Save: staged, then published with config.json last, so no half-written folder looks done.
    card_text = classifier_folder.save_classifier(
        settings, classifier, pretrained.tokenizer, task, scores, total_steps, minutes
    )
    if repo_id is not None:
        classifier_folder.push_to_hub(repo_id, training.output_dir, card_text, scores)
    return scores


def fine_tuning_line(classifier, settings, task):
    """What the run is about to do: the model, where it starts, the data and its batches."""
    model, training = settings.model, settings.training
    start = "random weights" if model.from_scratch else f"the pretrained {model.model_name_or_path}"
    return (
        f"Fine-tuning {type(classifier).__name__} ({classifier.count_params():,} parameters) from "
        f"{start} on {len(task.train):,} examples, {len(task.label_names)} labels: "
        f"{training.num_epochs} epochs of {task.steps_per_epoch:,} steps, batches of "
        f"{task.global_batch_size} examples padded to {task.padded_lengths} tokens."
    )


def validation_line(scores, task, minutes):
    """The final scores, beside the majority-class baseline, and the minutes of fine-tuning."""
    majority = task.majority_share()
    return (
        f"Validation: {', '.join(f'{name} {value:.4f}' for name, value in scores.items())} on "
        f"{len(task.validation):,} examples (the most frequent label everywhere: {majority:.4f}), "
        f"after {minutes:.1f} minutes of fine-tuning."
    )


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "run_classifier.py")
