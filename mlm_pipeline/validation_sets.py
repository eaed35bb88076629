"""run_mlm.py's several validation sets (--eval_dataset NAME=PATH ...): every evaluation scores
each one, and each is logged under its name.

A continued model is watched on the domain's validation set beside the original one: what it
learns and what it forgets. fit() scores the first set (its `validation_data`, the one val_loss
means); `EvaluateEverySet` then scores the others at the same epoch end and adds every set's
figures to the epoch's logs as val_<name>_loss and val_<name>_mask_token_accuracy (the first set's
too, so that each set has columns of its own). Placed before the callbacks that read those logs,
it puts them in training_log.csv's row and its copy beside the checkpoint, and in TensorBoard's
eval/<name>_loss and eval/<name>_mask_token_accuracy. With one set nothing here runs.
"""

import tf_keras

# The figures logged for each set, as the trainer names them.
FIGURES = ("loss", "mask_token_accuracy")


def named_figures(name, figures):
    """{val_<name>_loss: ..., val_<name>_mask_token_accuracy: ...} of a set's `figures` (an
    evaluation's logs, as the trainer names them)."""
    return {f"val_{name}_{figure}": float(figures[figure]) for figure in FIGURES}


def evaluate_sets(trainer, sets, first_logs):
    """Every set's named figures (`sets`: masked_lm_data.NamedEvaluation each, the first included):
    the first set's from `first_logs` (val_loss, ... as fit() names them, already scored), each
    other one scored now by `trainer` on its own batches. Every worker of a cluster calls this
    together: an evaluation's sums are collective."""
    first = sets[0]
    logs = named_figures(first.name, {figure: first_logs[f"val_{figure}"] for figure in FIGURES})
    for evaluation_set in sets[1:]:
        figures = trainer.evaluate(
            evaluation_set.dataset, steps=evaluation_set.batches, return_dict=True, verbose=0
        )
        logs.update(named_figures(evaluation_set.name, figures))
    return logs


def figures_line(logs, names):
    """'wiki: eval loss 5.1234, accuracy at [MASK] 0.1234; sst2: ...': each set's figures."""
    return "; ".join(
        f"{name}: eval loss {logs[f'val_{name}_loss']:.4f}, accuracy at [MASK] "
        f"{logs[f'val_{name}_mask_token_accuracy']:.4f}"
        for name in names
    )


class EvaluateEverySet(tf_keras.callbacks.Callback):
    """A Keras callback that, at every fit() epoch end that evaluated (val_loss in its logs),
    scores the other validation sets of `sets` (masked_lm_data.NamedEvaluation each, the first
    fit()'s own) and adds every set's named figures to the epoch's logs. Every worker runs it."""

    def __init__(self, sets):
        super().__init__()
        self.sets = sets

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and "val_loss" in logs:
            logs.update(evaluate_sets(self.model, self.sets, logs))
