"""The accuracy metrics of run_mlm.py's trainer: they count the masked positions only.

`PositionAccuracy` is top-1 accuracy over the positions a boolean mask selects (every labelled
position, or those whose input was [MASK]); `TopTokenShare` is the share of the predictions taken
by the most predicted token, near 1 when the model has collapsed onto one answer (the "answer 'the'
everywhere" plateau of a model early in training). The trainer makes them by name:
`PositionAccuracy("masked_accuracy")`, `TopTokenShare(vocab_size)`.
"""

import tensorflow as tf
import tf_keras


class PositionAccuracy(tf_keras.metrics.Metric):
    """A Keras metric named `name`: top-1 accuracy over the positions a boolean `scored` tensor
    selects."""

    def __init__(self, name, **kwargs):
        super().__init__(name=name, **kwargs)
        self.correct = self.add_weight(name="correct", initializer="zeros", dtype=tf.float32)
        self.total = self.add_weight(name="total", initializer="zeros", dtype=tf.float32)

    def update_state(self, labels, predictions, scored):
        hits = scored & tf.equal(predictions, labels)
        self.correct.assign_add(tf.reduce_sum(tf.cast(hits, tf.float32)))
        self.total.assign_add(tf.reduce_sum(tf.cast(scored, tf.float32)))

    def result(self):
        return tf.math.divide_no_nan(self.correct, self.total)


class TopTokenShare(tf_keras.metrics.Metric):
    """A Keras metric: the share of the predictions taken by the single most predicted token of a
    vocabulary of `vocab_size` tokens."""

    def __init__(self, vocab_size, **kwargs):
        super().__init__(name="top_token_share", **kwargs)
        self.vocab_size = vocab_size
        self.counts = self.add_weight(
            name="counts", shape=(vocab_size,), initializer="zeros", dtype=tf.float32
        )

    def update_state(self, predictions, scored):
        ones = tf.cast(scored, tf.float32)
        # unsorted_segment_sum rather than bincount: it compiles with XLA, so it runs on TPU too.
        self.counts.assign_add(tf.math.unsorted_segment_sum(ones, predictions, self.vocab_size))

    def result(self):
        return tf.math.divide_no_nan(tf.reduce_max(self.counts), tf.reduce_sum(self.counts))

    def reset_state(self):
        self.counts.assign(tf.zeros_like(self.counts))
