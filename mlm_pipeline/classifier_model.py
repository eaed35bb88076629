"""run_classifier.py's engine: the labelled examples as token ids and batches, the pretrained
encoder with a new classification head, its fit and its scores.

TensorFlow, tf_keras and transformers are imported at the top: run_classifier.py imports this module
only after tpu_runtime.prepare_runtime() has made the process ready for the TPU (or kept it off it).

Every example is cut to the run's length; training batches hold examples of about one length,
padded to 16, 32, 64... tokens, so short sentences cost short steps (on a TPU, or with
--pad_to_max_length, every batch is padded to the run's length: one shape, one compiled program).
"""

import dataclasses
import time
from typing import Optional

import numpy as np
import tensorflow as tf
import tf_keras
from transformers import TFAutoModelForSequenceClassification, create_optimizer

from . import labelled_data, segments, tf_startup, training_logs
from .errors import UsageError
from .labelled_data import LabelledSplit
from .pretrained_model import load_weights


@dataclasses.dataclass(frozen=True)
class ClassifierData:
    """The task's examples ready to train on: the `train` and `validation` LabelledSplits and the
    `label_names`; `global_batch_size` examples a step (every replica's), `steps_per_epoch` whole
    batches an epoch; the lengths training batches are padded to (`bucket_lengths`, None: all to
    `max_length`); the batches of both splits (build_dataset)."""

    train: LabelledSplit
    validation: LabelledSplit
    label_names: list
    max_length: int
    global_batch_size: int
    bucket_lengths: Optional[list]
    steps_per_epoch: int
    train_dataset: tf.data.Dataset
    eval_dataset: tf.data.Dataset

    @property
    def eval_batches(self):
        """The validation split's batches, the last one filled up to a whole batch."""
        return -(-len(self.validation) // self.global_batch_size)

    @property
    def padded_lengths(self):
        """The lengths training batches are padded to, as "16, 32 or 64"."""
        lengths = self.bucket_lengths or [self.max_length]
        return " or ".join(filter(None, [", ".join(map(str, lengths[:-1])), str(lengths[-1])]))

    def majority_share(self):
        """The validation accuracy of answering the training split's most frequent label
        everywhere: the baseline the classifier must beat."""
        most_frequent = max(range(len(self.label_names)), key=self.train.labels.count)
        return self.validation.majority_share(most_frequent)


def classifier_data(data, training, pretrained, strategy, max_length):
    """The ClassifierData of run_classifier.py's Data group `data`: the texts and labels read and
    checked (labelled_data.py), their token ids of `max_length` (the `pretrained` model's
    tokenizer), batches of the Training group's per-replica batch on every replica of `strategy`.
    Every random draw is seeded first (training.seed: the shuffling, the new head's weights,
    dropout). A batch larger than the data is refused in one line."""
    tf_keras.utils.set_random_seed(training.seed)
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
    return ClassifierData(
        train=train,
        validation=validation,
        label_names=label_names,
        max_length=max_length,
        global_batch_size=global_batch_size,
        bucket_lengths=bucket_lengths,
        steps_per_epoch=steps_per_epoch,
        train_dataset=build_dataset(
            train_features,
            train.labels,
            global_batch_size,
            training=True,
            seed=training.seed,
            bucket_lengths=bucket_lengths,
        ),
        eval_dataset=build_dataset(
            eval_features, validation.labels, global_batch_size, training=False, seed=training.seed
        ),
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
    examples = np.bincount(bucket_of_each(features, bucket_lengths), minlength=len(bucket_lengths))
    return examples // batch_size


def bucket_of_each(features, bucket_lengths):
    """Each example's bucket: the index of the shortest bucket length that holds its tokens."""
    return np.searchsorted(bucket_lengths, features["attention_mask"].sum(axis=1), side="left")


def build_dataset(features, labels, batch_size, training, seed, bucket_lengths=None):
    """Batches of (features, labels). Training: shuffled anew every epoch, whole batches only; with
    `bucket_lengths`, each batch is drawn from the examples of one bucket and cut to its length
    (SST-2's training sentences average 18 tokens: padding them all to 64 would spend most of every
    step on padding). Evaluation: every example once, in order, in one shape; the last batch is
    filled up with copies of the last example, each of weight 0, so it counts nothing."""
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
    tf_startup.hide_transformers_tf_deprecation()
    config = pretrained.config
    config.num_labels = len(label_names)  # also resets id2label, so that comes after
    config.id2label = dict(enumerate(label_names))
    config.label2id = {label: index for index, label in enumerate(label_names)}
    config.problem_type = "single_label_classification"
    if training.dropout is not None:  # the head's dropout follows hidden_dropout_prob
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = training.dropout
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


def fit(classifier, task, num_epochs, callbacks=()):
    """Fine-tune for `num_epochs` on the task's (ClassifierData's) training batches, scored on its
    validation batches after every epoch, with `callbacks` besides; the minutes it took."""
    started = time.perf_counter()
    classifier.fit(
        task.train_dataset,
        epochs=num_epochs,
        validation_data=task.eval_dataset,
        callbacks=list(callbacks),
        verbose=training_logs.progress_verbosity(),
    )
    return (time.perf_counter() - started) / 60


def evaluate(classifier, task, pair_task):
    """{"accuracy": ...} on the task's validation examples (the filler of the last batch left out),
    and "f1" of label 1 for two-class pair tasks, as GLUE reports MRPC and QQP."""
    validation = task.validation
    logits = classifier.predict(task.eval_dataset, verbose=0)["logits"][: len(validation)]
    predicted, labels = np.argmax(logits, axis=-1), np.asarray(validation.labels)
    scores = {"accuracy": float(np.mean(predicted == labels))}
    if pair_task and len(task.label_names) == 2:
        true_positives = float(np.sum((predicted == 1) & (labels == 1)))
        predicted_or_true = float(np.sum(predicted == 1) + np.sum(labels == 1))
        scores["f1"] = 2 * true_positives / predicted_or_true if predicted_or_true else 0.0
    return scores
