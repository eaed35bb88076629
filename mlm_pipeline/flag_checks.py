"""run_mlm.py's flags that are wrong only together: each pair refused in one line that names both
and their values, before any work. A flag wrong on its own is refused by its argparse type
(errors.py); the hardware flags are checked in hosts.py, the Hub's in hub.py."""

from .errors import UsageError


def check_recipe_flags(
    *, warmup_ratio, decay_ratio, per_replica_batch_size, gradient_accumulation_steps
):
    """The learning-rate schedule's shares, and the micro-batches of gradient accumulation."""
    if decay_ratio is not None and decay_ratio > 1.0 - warmup_ratio:
        raise UsageError(
            f"--decay_ratio {decay_ratio} must lie in (0, 1 - --warmup_ratio] with --warmup_ratio "
            f"{warmup_ratio}: the decay follows the warmup (e.g. 0.25)."
        )
    if per_replica_batch_size % gradient_accumulation_steps:
        raise UsageError(
            f"--gradient_accumulation_steps {gradient_accumulation_steps} must divide "
            f"--per_replica_batch_size {per_replica_batch_size} into equal micro-batches."
        )
