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
mlm_pipeline/.
"""

import dataclasses
import functools
import time
from typing import Optional

from mlm_pipeline import (
    classifier_folder,
    hosts,
    hub,
    labelled_data,
    model_folder,
    preflight,
    segments,
    tf_startup,
    tpu_runtime,
    training_logs,
)
from mlm_pipeline.errors import (
    UsageError,
    exit_on_usage_error,
    fraction_below_one,
    positive_float,
    positive_int,
)
from mlm_pipeline.pretrained_model import PretrainedModel, load_weights
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
    hardware: hosts.Hardware


def parse_args(argv=None):
    """The command line as Settings; a flag or a rule broken is refused in one line."""
    return parse_command_line(
        Settings,
        argv,
        prog="run_classifier.py",
        description="Fine-tune a pretrained masked language model on a text classification task.",
    )


def encode(tokenizer, split, max_length, with_token_types):
    """The split's texts (and pairs) as token ids, each example cut to `max_length` tokens and
    padded to it. Token type ids only for models that have more than one type (BERT): RoBERTa's
    single type would be out of range for the second text of a pair."""
    encoded = tokenizer(
        split.texts,
        split.pairs,
        max_length=max_length,
        truncation=True,
        padding="max_length",
        return_token_type_ids=with_token_types,  # a tokenizer may not give them unasked (RoBERTa's)
        return_tensors="np",
    )
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if with_token_types else [])
    return {name: encoded[name] for name in names}


def length_buckets(max_length):
    """The lengths a training batch is padded to: 16, 32, 64... below `max_length`, then it."""
    lengths = [16]
    while lengths[-1] < max_length:
        lengths.append(lengths[-1] * 2)
    return lengths[:-1] + [max_length]


def steps_per_epoch_of(features, batch_size, bucket_lengths=None):
    """Whole batches an epoch: of all examples, or of each bucket's."""
    if bucket_lengths is None:
        return len(features["input_ids"]) // batch_size
    return int(batches_per_bucket(features, batch_size, bucket_lengths).sum())


def batches_per_bucket(features, batch_size, bucket_lengths):
    """Each bucket's whole batches an epoch (the rest of its examples is left over)."""
    import numpy as np

    examples = np.bincount(bucket_of_each(features, bucket_lengths), minlength=len(bucket_lengths))
    return examples // batch_size


def bucket_of_each(features, bucket_lengths):
    """Each example's bucket: the index of the shortest bucket length that holds its tokens."""
    import numpy as np

    return np.searchsorted(bucket_lengths, features["attention_mask"].sum(axis=1), side="left")


def build_dataset(features, labels, batch_size, training, seed, bucket_lengths=None):
    """Batches of (features, labels). Training: shuffled anew every epoch, whole batches only; with
    `bucket_lengths`, each batch is drawn from the examples of one bucket and cut to its length
    (SST-2's training sentences average 18 tokens: padding them all to 64 would spend most of every
    step on padding). Evaluation: every example once, in order, in one shape; the last batch is
    filled up with copies of the last example, each of weight 0, so it counts nothing."""
    import numpy as np
    import tensorflow as tf

    labels = np.asarray(labels, dtype=np.int32)
    if training and bucket_lengths is not None:
        buckets = bucket_of_each(features, bucket_lengths).astype(np.int64)
        dataset = tf.data.Dataset.from_tensor_slices((features, labels, buckets))
        dataset = dataset.shuffle(len(labels), seed=seed, reshuffle_each_iteration=True)

        def cut_to_length(batch, batch_labels, batch_buckets):  # one bucket a batch
            length = tf.gather(bucket_lengths, batch_buckets[0])
            return {name: ids[:, :length] for name, ids in batch.items()}, batch_labels

        dataset = dataset.group_by_window(  # a window: `batch_size` examples of one bucket
            key_func=lambda example, label, bucket: bucket,
            reduce_func=lambda bucket, window: window.batch(batch_size, drop_remainder=True),
            window_size=batch_size,
        )
        # Its number of batches, known to fit() for its progress and checked as they are drawn.
        steps = steps_per_epoch_of(features, batch_size, bucket_lengths)
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(steps))
        return dataset.map(cut_to_length).prefetch(tf.data.AUTOTUNE)
    if training:
        dataset = tf.data.Dataset.from_tensor_slices((features, labels))
        dataset = dataset.shuffle(len(labels), seed=seed, reshuffle_each_iteration=True)
    else:
        filler = -len(labels) % batch_size
        weights = np.concatenate([np.ones(len(labels)), np.zeros(filler)]).astype(np.float32)
        features, labels = (
            {
                name: np.pad(ids, [(0, filler), (0, 0)], mode="edge")
                for name, ids in features.items()
            },
            np.pad(labels, [(0, filler)], mode="edge"),
        )
        dataset = tf.data.Dataset.from_tensor_slices((features, labels, weights))
    return dataset.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def build_classifier(pretrained, strategy, label_names, total_steps, from_scratch, training):
    """The pretrained encoder with a new classification head (or the same architecture from random
    weights, `from_scratch`), and AdamW as the Training group says (its peak, warmup and dropout),
    made in the strategy's scope, compiled with the cross-entropy of the head's logits."""
    dropout = training.dropout
    import tensorflow as tf
    import tf_keras
    from transformers import TFAutoModelForSequenceClassification, create_optimizer

    tf_startup.hide_transformers_tf_deprecation()
    config = pretrained.config
    config.num_labels = len(label_names)  # also resets id2label, so that comes after
    config.id2label = dict(enumerate(label_names))
    config.label2id = {label: index for index, label in enumerate(label_names)}
    config.problem_type = "single_label_classification"
    if dropout is not None:  # the head's dropout follows hidden_dropout_prob
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = dropout
    with strategy.scope():
        if from_scratch:
            classifier = TFAutoModelForSequenceClassification.from_config(config)
        else:
            classifier = load_weights(TFAutoModelForSequenceClassification, pretrained, config)
        classifier(classifier.dummy_inputs)  # build the weights inside the strategy's scope
        # BERT's fine-tuning schedule: linear warmup, then linear decay to 0; no weight decay on
        # biases and layer norms.
        optimizer, _ = create_optimizer(
            training.learning_rate,
            total_steps,
            segments.warmup_steps(training.warmup_ratio, total_steps),
            weight_decay_rate=0.01,
        )
        classifier.compile(
            optimizer,
            loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=[tf_keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )
    # The model is TF ops under Python control flow on Python values only, so AutoGraph's rewrite
    # of every layer's call adds nothing but seconds to the start: fit() and predict() run the steps
    # as written, and the layers they call.
    as_written = tf.autograph.experimental.do_not_convert
    classifier.train_step = as_written(classifier.train_step)
    classifier.test_step = as_written(classifier.test_step)
    classifier.predict_step = as_written(classifier.predict_step)
    return classifier


def lengths_in_words(lengths):
    """[16, 32, 64] as "16, 32 or 64"."""
    return " or ".join(filter(None, [", ".join(map(str, lengths[:-1])), str(lengths[-1])]))


def evaluate(classifier, dataset, validation, label_count, pair_task):
    """{"accuracy": ...} on the validation examples (the filler of the last batch left out), and
    "f1" of label 1 for two-class pair tasks, as GLUE reports MRPC and QQP."""
    import numpy as np

    logits = classifier.predict(dataset, verbose=0)["logits"][: len(validation)]
    predicted, labels = np.argmax(logits, axis=-1), np.asarray(validation.labels)
    scores = {"accuracy": float(np.mean(predicted == labels))}
    if pair_task and label_count == 2:
        true_positives = float(np.sum((predicted == 1) & (labels == 1)))
        predicted_or_true = float(np.sum(predicted == 1) + np.sum(labels == 1))
        scores["f1"] = 2 * true_positives / predicted_or_true if predicted_or_true else 0.0
    return scores


def main(settings, callbacks=()):
    """Fine-tune, evaluate and save as `settings` say (parse_args(): the command line's, its rules
    checked); returns the validation scores. `callbacks`: Keras callbacks for fit()
    (benchmarks/classifier_speed.py times the steps with one)."""
    tpu_runtime.prepare_runtime(settings.hardware)  # PJRT, before TensorFlow loads; or why not
    model, data, training = settings.model, settings.data, settings.training
    inputs = {"--model_name_or_path": model.model_name_or_path}
    model_folder.check_output(training, inputs, write_probe=not training.preflight)
    repo_id = None
    if training.hub_model_id and not training.preflight:  # an unusable Hub stops the run now
        repo_id = hub.open_repository(training.hub_model_id, training.hub_private, "--hub_model_id")
    strategy = hosts.build_strategy(settings.hardware)
    import tensorflow as tf
    import tf_keras

    # The pretrained folder: its config and tokenizer (the weights load with the model, below).
    pretrained = PretrainedModel(model.model_name_or_path, weights=not model.from_scratch)
    max_length = pretrained.check_max_length(data.max_length, DEFAULT_MAX_LENGTH)
    pytorch_export = not training.no_pytorch_export
    if pytorch_export:  # a copy that cannot be written is refused now, not after training
        model_folder.check_pytorch_copy(pretrained.config, masked_lm=False)

    tf_keras.utils.set_random_seed(training.seed)  # the shuffling, the new head's weights, dropout

    # The data: texts and labels, checked; token ids of one length; batches of one shape.
    train, validation, label_names = labelled_data.load_labelled_splits(data)
    global_batch_size = training.per_replica_batch_size * strategy.num_replicas_in_sync
    if len(train) < global_batch_size:
        raise UsageError(
            f"the batch of {global_batch_size} examples is larger than the {len(train)} training "
            "examples; lower --per_replica_batch_size or add data."
        )
    with_token_types = getattr(pretrained.config, "type_vocab_size", 1) > 1
    train_features = encode(pretrained.tokenizer, train, max_length, with_token_types)
    eval_features = encode(pretrained.tokenizer, validation, max_length, with_token_types)
    # A TPU compiles a program for each shape it meets, so there every batch has the one length.
    on_tpu = isinstance(strategy, tf.distribute.TPUStrategy)
    bucket_lengths = None if data.pad_to_max_length or on_tpu else length_buckets(max_length)
    steps_per_epoch = steps_per_epoch_of(train_features, global_batch_size, bucket_lengths)
    if steps_per_epoch == 0:
        raise UsageError(
            f"no length of {bucket_lengths} holds {global_batch_size} training examples, a batch: "
            "pass --pad_to_max_length, or lower --per_replica_batch_size."
        )
    train_dataset = build_dataset(
        train_features,
        train.labels,
        global_batch_size,
        training=True,
        seed=training.seed,
        bucket_lengths=bucket_lengths,
    )
    eval_dataset = build_dataset(
        eval_features, validation.labels, global_batch_size, training=False, seed=training.seed
    )

    # The model: the pretrained encoder and a new head, AdamW over every step of the run.
    total_steps = training.num_epochs * steps_per_epoch
    classifier = build_classifier(
        pretrained, strategy, label_names, total_steps, model.from_scratch, training
    )
    start = "random weights" if model.from_scratch else f"the pretrained {model.model_name_or_path}"
    print(
        f"Fine-tuning {type(classifier).__name__} ({classifier.count_params():,} parameters) from "
        f"{start} on {len(train):,} examples, {len(label_names)} labels: {training.num_epochs} "
        f"epochs of {steps_per_epoch:,} steps, batches of {global_batch_size} examples padded to "
        f"{lengths_in_words(bucket_lengths or [max_length])} tokens."
    )

    if training.preflight:  # a few of fit()'s steps timed, the run projected, nothing written
        eval_batches = -(-len(validation) // global_batch_size)  # padded to whole batches
        batches = (train_dataset, total_steps, eval_dataset, eval_batches)
        save = functools.partial(  # the final save, timed into a temporary folder
            model_folder.save_model,
            tokenizer=pretrained.tokenizer,
            max_length=max_length,
            pytorch_export=pytorch_export,
        )
        return preflight.preflight_classifier(
            classifier, training, batches, max_length, bucket_lengths, save
        )

    # Fit, scored on the validation split after every epoch; then the final scores.
    started = time.perf_counter()
    classifier.fit(
        train_dataset,
        epochs=training.num_epochs,
        validation_data=eval_dataset,
        callbacks=list(callbacks),
        verbose=training_logs.progress_verbosity(),
    )
    minutes = (time.perf_counter() - started) / 60
    scores = evaluate(
        classifier, eval_dataset, validation, len(label_names), data.text_pair_column is not None
    )
    most_frequent = max(range(len(label_names)), key=train.labels.count)
    majority = validation.majority_share(most_frequent)
    print(
        f"Validation: {', '.join(f'{name} {value:.4f}' for name, value in scores.items())} on "
        f"{len(validation):,} examples (the most frequent label everywhere: {majority:.4f}), "
        f"after {minutes:.1f} minutes of fine-tuning."
    )

    # Save: staged, then published with config.json last, so no half-written folder looks done.
    card_text = classifier_folder.classifier_card(
        classifier,
        settings,
        train=train,
        validation=validation,
        label_names=label_names,
        scores=scores,
        majority=majority,
        max_length=max_length,
        global_batch_size=global_batch_size,
        steps=total_steps,
        minutes=minutes,
    )
    classifier_folder.stop_looking_finished(training.output_dir)  # a replaced one's config.json
    with model_folder.staging(training.output_dir) as folder:
        model_folder.save_model(
            folder, classifier, pretrained.tokenizer, max_length, pytorch_export
        )
        classifier_folder.write_card_and_scores(folder, card_text, scores)
    saved = "its tokenizer, PyTorch copy," if pytorch_export else "its tokenizer,"
    print(f"Saved the classifier, {saved} card and eval_results.json to {training.output_dir}.")
    if repo_id is not None:
        classifier_folder.push_to_hub(repo_id, training.output_dir, card_text, scores)
    return scores


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "run_classifier.py")
