"""Counting run_mlm.py's optimizer steps: through the epochs, and in fit() calls of fixed shape."""


def steps_in_epochs(total_steps, steps_per_epoch):
    """'1,500 steps = 2.31 epochs of 650 steps': how far a run's steps take it through the data."""
    epochs = total_steps / steps_per_epoch
    count = (
        f"{epochs:.0f} epoch{'s' if epochs != 1 else ''}"
        if epochs.is_integer()
        else f"{epochs:.2f} epochs"
    )
    return f"{total_steps:,} steps = {count} of {steps_per_epoch:,} steps"


def fit_segments(start_step, total_steps, steps_per_epoch, phase_end=0):
    """The fit() calls that run optimizer steps start_step .. total_steps, as (first step, epoch,
    epochs, steps).

    fit() counts in epochs of equal length, and with --steps_per_execution > 1 a callback can only
    stop it between executions, so a run that starts or ends mid-epoch (a resumed run, a
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
