"""Counting optimizer steps: the learning rate's warmup (both training scripts); run_mlm.py's
through the epochs, between evaluations, and in fit() calls of fixed shape; and the lines that
tell the user, before training, how they add up."""

from .errors import UsageError


def warmup_steps(warmup_ratio, total_steps):
    """The learning rate's warmup, in optimizer steps: --warmup_ratio of `total_steps` (both
    training scripts, and run_mlm.py's model card)."""
    return int(warmup_ratio * total_steps)


def decay_steps(decay_ratio, steps):
    """The learning rate's decay, in optimizer steps: --decay_ratio of `steps` (at least one)."""
    return max(1, round(decay_ratio * steps))


def decay_start(decay_ratio, total_steps, first_step=0):
    """The optimizer step where the learning rate starts to decay, in a run of steps `first_step`
    (0; a branch's: its parent's step) .. `total_steps` with --decay_ratio; None without it."""
    if not decay_ratio:
        return None
    return total_steps - decay_steps(decay_ratio, total_steps - first_step)


def steps_in_epochs(total_steps, steps_per_epoch):
    """'1,500 steps = 2.31 epochs': how far a run's steps take it through the data."""
    epochs = total_steps / steps_per_epoch
    count = (
        f"{epochs:.0f} epoch{'s' if epochs != 1 else ''}"
        if epochs.is_integer()
        else f"{epochs:.2f} epochs"
    )
    return f"{total_steps:,} steps = {count}"


def schedule_line(
    start_step,
    total_steps,
    steps_per_epoch,
    steps_per_evaluation,
    *,
    phase_end=0,
    evaluates=True,
    epoch="a pass over the data",
):
    """'An epoch (a pass over the data) is 650 steps; 1,500 steps = 2.31 epochs; first evaluation
    after step 200, then every 200 steps.': the run's length, and when it first shows how it is
    doing (a resumed run: next). `steps_per_evaluation`: --eval_steps, or `steps_per_epoch` when
    the run evaluates at every epoch end; `evaluates` False (no evaluation split): the rows of
    training_log.csv come at the same steps. `epoch`: what an epoch is (a mixture's: as many
    sequences as its folders hold together)."""
    line = (
        f"An epoch ({epoch}) is {steps_per_epoch:,} steps; "
        f"{steps_in_epochs(total_steps, steps_per_epoch)}"
    )
    calls = fit_segments(start_step, total_steps, steps_per_evaluation, phase_end)
    if not calls:
        return f"{line}; no step is left to train."
    first_step, _, _, steps = calls[0]
    first = first_step + steps
    what = "evaluation" if evaluates else "row of training_log.csv"
    line += f"; {'first' if start_step == 0 else 'next'} {what} after step {first:,}, then "
    if steps_per_evaluation == steps_per_epoch:
        later = ["at each epoch end"]
    else:
        later = [f"every {steps_per_evaluation:,} steps"]
    if first < phase_end < total_steps and phase_end % steps_per_evaluation:
        later.append(f"after step {phase_end:,} (the sequence-length warmup's end)")
    if first < total_steps and total_steps % steps_per_evaluation:
        later.append(f"after step {total_steps:,}, the last")
    return (
        line + " and ".join([", ".join(later[:-1]), later[-1]] if len(later) > 1 else later) + "."
    )


def evaluation_batches(batches_in_split, sequences_in_split, global_batch_size, max_eval_samples):
    """The batches each evaluation scores, and a line that says how many sequences they hold: the
    evaluation split's whole batches, or with `max_eval_samples` (--max_eval_samples) its first
    batches, as many as that many sequences fill (rounded down: a batch is whole or left out)."""
    batches = batches_in_split
    if max_eval_samples is not None:
        batches = min(batches, max_eval_samples // global_batch_size)
        if batches == 0:
            raise UsageError(
                f"--max_eval_samples {max_eval_samples} is less than one global batch of "
                f"{global_batch_size} sequences; give {global_batch_size} or more, or leave it "
                "out to evaluate the whole split."
            )
    scored = batches * global_batch_size
    line = (
        f"Each evaluation scores {scored:,} of the evaluation split's {sequences_in_split:,} "
        f"sequences: {'its first' if batches < batches_in_split else 'all its whole'} "
        f"{batches:,} batch{'es' if batches != 1 else ''} of {global_batch_size}"
    )
    if batches < batches_in_split and scored < max_eval_samples:
        line += f" (--max_eval_samples {max_eval_samples:,} rounded down to whole batches)"
    return batches, line + "."


def fit_segments(start_step, total_steps, steps_per_epoch, phase_end=0):
    """The fit() calls that run optimizer steps start_step .. total_steps, as (first step, epoch,
    epochs, steps).

    fit() counts in epochs of equal length (`steps_per_epoch`: a pass over the data, or
    --eval_steps: each ends with an evaluation), and with --steps_per_execution > 1 a callback can
    only stop it between executions, so a run that starts or ends mid-epoch (a resumed run, a
    --max_steps) would overshoot. Instead a partial epoch gets a fit() call of its own and whole
    epochs share one. No call runs across `phase_end` (the end of the sequence-length warmup), where
    the shape of the batches changes: the epoch around it is fit in two calls, and each ends with an
    evaluation and a checkpoint.
    """
    segments, step = [], start_step
    while step < total_steps:
        end = phase_end if step < phase_end < total_steps else total_steps
        epoch, offset = divmod(step, steps_per_epoch)
        if offset == 0 and end - step >= steps_per_epoch:
            segments.append((step, epoch, (end - step) // steps_per_epoch, steps_per_epoch))
        else:
            segments.append((step, epoch, 1, min(steps_per_epoch - offset, end - step)))
        step += segments[-1][2] * segments[-1][3]
    return segments


def evaluation_count(total_steps, steps_per_evaluation, phase_end=0):
    """How many evaluations a run from step 0 makes: one at the end of every fit() epoch
    (fit_segments), whatever the calls."""
    calls = fit_segments(0, total_steps, steps_per_evaluation, phase_end)
    return sum(epochs for _, _, epochs, _ in calls)
