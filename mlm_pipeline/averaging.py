"""run_mlm.py --average_last K: the mean of the weights of the run's last K checkpoints (the final
step's included) as the model the run hands on, and the last step's own model kept beside it.

Averaging the last checkpoints of a run (LAWA, NeoBERT's merge) costs a read of K checkpoints and
one extra evaluation. Only the model's variables are averaged: the optimizer's moments belong to
the training that produced each checkpoint, and the handed-on model has none.

Which checkpoints a run saves is known before it trains (`checkpoint_steps`: every --save_steps
steps and at every evaluation, as checkpoints.SaveCheckpoints saves them), so a run too short to
have K is refused before any work (`check_enough_checkpoints`). The run keeps
max(--save_total_limit, K) checkpoints (`checkpoints_kept`), and the average is read back from
them at the end, so a run killed after its last step resumes there and averages the same ones.
"""

import dataclasses

import tensorflow as tf

from . import segments, validation_sets
from .contract import LAST_STEP_DIR
from .errors import UsageError


def checkpoints_kept(save_total_limit, average_last):
    """The checkpoints the run keeps: --save_total_limit, or K if more (--average_last K)."""
    return max(save_total_limit, average_last or 0)


def checkpoint_steps(
    total_steps, steps_per_evaluation, save_steps, steps_per_execution, phase_end=0, first_step=0
):
    """The steps at which a run from `first_step` (0; a branch's parent's step) saves its
    checkpoints, in order: at the end of every
    fit() epoch (segments.fit_segments: each evaluation), and inside one, the first step after each
    multiple of `save_steps` that an execution of `steps_per_execution` steps ends on
    (checkpoints.SaveCheckpoints)."""
    steps, saved = [], first_step
    for call_start, _, epochs, steps_per_call in segments.fit_segments(
        first_step, total_steps, steps_per_evaluation, phase_end
    ):
        for start in range(call_start, call_start + epochs * steps_per_call, steps_per_call):
            end = start + steps_per_call
            while save_steps:
                due = (saved // save_steps + 1) * save_steps
                done = start + -(-(due - start) // steps_per_execution) * steps_per_execution
                if done >= end:  # the epoch's end saves it, after the evaluation
                    break
                steps.append(done)
                saved = done
            steps.append(end)
            saved = end
    return steps


def check_enough_checkpoints(settings, plan, total_steps, phase_end, first_step=0):
    """--average_last K refused, before any work, when the run saves fewer than K checkpoints.
    `settings`: run_mlm.py's Settings; `plan`, the train split's hosts.InputPlan; `phase_end`, the
    sequence-length warmup's last step (0: none); `first_step`, a branch's parent's step."""
    average_last, steps = settings.output.average_last, settings.steps
    if not average_last:
        return
    saved = checkpoint_steps(
        total_steps,
        steps.steps_per_evaluation(plan.steps_per_epoch),
        steps.save_steps,
        settings.speed.steps_per_execution,
        phase_end,
        first_step,
    )
    if len(saved) < average_last:
        raise UsageError(
            f"--average_last {average_last} needs {average_last} checkpoints, but this run of "
            f"{total_steps:,} steps saves {len(saved)} (after steps "
            f"{', '.join(f'{step:,}' for step in saved)}: every --save_steps {steps.save_steps} "
            f"and at each evaluation); pass --average_last {len(saved)} or less, or a smaller "
            "--save_steps."
        )


def step_of(path):
    """The step a checkpoint of the run was saved at: its number (ckpt-<step>)."""
    return int(path.rsplit("-", 1)[1])


def last_checkpoints(folder, count):
    """The paths of the newest `count` checkpoints in `folder` (fewer if fewer are kept), oldest
    first."""
    state = tf.train.get_checkpoint_state(folder)
    paths = list(state.all_model_checkpoint_paths) if state else []
    return sorted(paths, key=step_of)[-count:]


def average_into(masked_lm, paths):
    """Set `masked_lm`'s variables to the mean of their values in the checkpoints at `paths`.

    Each checkpoint is restored in turn into the model alone (a tf.train.Checkpoint without the
    optimizer reads none of its moments) and summed on the host, in each variable's own dtype."""
    checkpoint = tf.train.Checkpoint(model=masked_lm)
    variables = masked_lm.weights
    sums = None
    for path in paths:
        checkpoint.restore(path).assert_existing_objects_matched().expect_partial()
        values = [variable.numpy() for variable in variables]
        sums = values if sums is None else [total + value for total, value in zip(sums, values)]
    for variable, total in zip(variables, sums):
        variable.assign(total / len(paths))


def evaluate(trainer, evaluation):
    """The evaluation split scored as every evaluation of the run scores it (fixed masks): loss and
    accuracy at [MASK]; None without an evaluation split. With several validation sets, the first
    set's (the one val_loss means), and under "sets" each set's by its name."""
    if evaluation is None:
        return None

    def scored(dataset, batches):
        logs = trainer.evaluate(dataset, steps=batches, return_dict=True, verbose=0)
        return {figure: float(logs[figure]) for figure in validation_sets.FIGURES}

    first = scored(evaluation.dataset, evaluation.batches)
    if not evaluation.sets:
        return first
    sets = {evaluation.sets[0].name: first}  # the first set is evaluation.dataset itself
    for evaluation_set in evaluation.sets[1:]:
        sets[evaluation_set.name] = scored(evaluation_set.dataset, evaluation_set.batches)
    return {**first, "sets": sets}


@dataclasses.dataclass(frozen=True)
class Averaged:
    """What --average_last did: `average_last` (K), the `steps` of the checkpoints averaged, and
    the evaluation figures of the `average` and of the `last_step` alone (evaluate(); None without
    an evaluation split)."""

    average_last: int
    steps: tuple
    average: dict = None
    last_step: dict = None

    def steps_text(self):
        """'1,350, 1,425 and 1,500'."""
        named = [f"{step:,}" for step in self.steps]
        return named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"

    def which(self):
        """'the last 4 checkpoints', or the ones there are when fewer were kept."""
        count = len(self.steps)
        if count < self.average_last:
            return (
                f"the {count} checkpoint{'s' if count > 1 else ''} there are (fewer than "
                f"--average_last {self.average_last}: the run kept no more)"
            )
        return f"the last {count} checkpoint{'s' if count > 1 else ''}"

    def line(self, output_dir):
        """The line printed once both are evaluated."""
        output_dir = output_dir.rstrip("/")
        line = f"Averaged the weights of {self.which()}, steps {self.steps_text()}"
        if self.average is None:
            line += " (no --eval_dataset: neither model is evaluated)"
        else:
            line += (
                f": eval loss {self.average['loss']:.4f}, accuracy at [MASK] "
                f"{self.average['mask_token_accuracy']:.4f}; the last step alone: eval loss "
                f"{self.last_step['loss']:.4f}, accuracy at [MASK] "
                f"{self.last_step['mask_token_accuracy']:.4f}"
            )
        return (
            f"{line}. The average is the model handed on, in {output_dir}; the last step's is in "
            f"{output_dir}/{LAST_STEP_DIR}."
        )
