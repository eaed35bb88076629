"""run_mlm.py's numbers that argparse cannot check alone: each refused in one line that names the
flag and its value, before any work (the hardware flags are checked in hosts.py, the Hub's in
hub.py)."""

from .errors import UsageError


def check_training_numbers(
    max_length,
    mlm_probability,
    train_mlm_probability,
    short_sequence_ratio,
    warmup_ratio,
    decay_ratio,
    learning_rate,
    weight_decay_rate,
    max_grad_norm,
    adam_beta1,
    adam_beta2,
    adam_epsilon,
    per_replica_batch_size,
    gradient_accumulation_steps,
):
    if max_length is not None and max_length <= 1:
        raise UsageError(f"--max_length {max_length} must be more than 1.")
    if not 0.0 < mlm_probability < 1.0:
        raise UsageError(
            f"--mlm_probability {mlm_probability} must lie between 0 and 1 (0.15 is usual)."
        )
    if train_mlm_probability is not None and not 0.0 < train_mlm_probability < 1.0:
        raise UsageError(
            f"--train_mlm_probability {train_mlm_probability} must lie between 0 and 1 (e.g. 0.3)."
        )
    if decay_ratio is not None and not 0.0 < decay_ratio <= 1.0 - warmup_ratio:
        raise UsageError(
            f"--decay_ratio {decay_ratio} must lie in (0, 1 - --warmup_ratio]: the decay follows "
            "the warmup (e.g. 0.25)."
        )
    if not 0.0 < short_sequence_ratio < 1.0:
        raise UsageError(f"--short_sequence_ratio {short_sequence_ratio} must lie between 0 and 1.")
    if not 0.0 <= warmup_ratio < 1.0:
        raise UsageError(f"--warmup_ratio {warmup_ratio} must lie in [0, 1).")
    if learning_rate <= 0 or weight_decay_rate < 0 or max_grad_norm < 0:
        raise UsageError(
            "--learning_rate must be positive, --weight_decay_rate and --max_grad_norm not "
            "negative."
        )
    if not (0.0 <= adam_beta1 < 1.0 and 0.0 <= adam_beta2 < 1.0 and adam_epsilon > 0):
        raise UsageError(
            f"--adam_beta1 {adam_beta1} and --adam_beta2 {adam_beta2} must lie in [0, 1), "
            f"--adam_epsilon {adam_epsilon} above 0 (e.g. 0.9, 0.98, 1e-6)."
        )
    if per_replica_batch_size % gradient_accumulation_steps:
        raise UsageError(
            f"--gradient_accumulation_steps {gradient_accumulation_steps} must divide "
            f"--per_replica_batch_size {per_replica_batch_size} into equal micro-batches."
        )
