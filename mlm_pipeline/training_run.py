"""What run_mlm.py's run does around fit(), on the chief and on the other workers: the output
folder made ready, resuming, the callbacks (checkpoints, logs, Hub snapshots), and the run's end.

One process writes (the chief: the only process there is, or worker 0 of a cluster); the others
train in lockstep and keep their hands off the output folder. run_mlm.py saves the model itself
(`save_pretrained`), between `fit()` and `TrainingRun.finish()`.
"""

import dataclasses
import functools
import time
from typing import Optional

from . import checkpoints, hosts, model_card, segments, training_logs


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The run's steps: `total_steps` optimizer steps over `plan` (the train split's
    hosts.InputPlan), the first `phase_end` on the sequence-length warmup's pieces; `evaluation`,
    the line that says what each evaluation scores (None: no evaluation split)."""

    plan: object
    total_steps: int
    phase_end: int = 0
    evaluation: Optional[str] = None


class TrainingRun:
    """Made once the model is built (a parent that cannot be loaded is refused before the output
    folder is touched). The Hub repository is opened first (an unusable Hub stops the run now),
    then the chief starts the output folder afresh or checks that its checkpoints belong to this
    run (checkpoints.resume_settings()), and every worker waits for it.

    `settings`: run_mlm.py's Settings, read group by group: the steps say when to evaluate,
    checkpoint and log, the output where the model goes and whether to push it to the Hub; a
    resumed run must share the masking and the optimizer, and the card shows them with the rest.
    `schedule`: the run's steps (Schedule); `tokenizer`, a contract.NamedTokenizer; `manifests`,
    the train and evaluation shards' (the second may be None); `save_model(folder, masked_lm)`
    writes the model files of a Hub snapshot; `parent`, the pretrained_model.Parent continued
    (None: from scratch).
    """

    def __init__(
        self, settings, strategy, schedule, config, tokenizer, manifests, save_model, parent
    ):
        steps, output = settings.steps, settings.output
        self.strategy, self.plan, self.steps = strategy, schedule.plan, steps
        self.output_dir, self.total_steps = output.output_dir, schedule.total_steps
        self.steps_per_evaluation = steps.steps_per_evaluation(self.plan.steps_per_epoch)
        self.phase_end, self.evaluation = schedule.phase_end, schedule.evaluation
        self.max_length = manifests[0]["max_length"]
        self.tokens_per_step = self.plan.global_batch_size * self.max_length
        # card(trainer, metrics): the model card after the steps `trainer` has taken so far
        self.card = functools.partial(
            model_card.model_card,
            settings,
            config,
            tokenizer,
            manifests,
            schedule,
            base_model=parent and parent.hub_id,
        )
        self.chief = hosts.is_chief(strategy)
        self.pusher = None
        if output.hub_model_id and self.chief:
            # In place of transformers' PushToHubCallback, which clones the Hub repository with
            # git into the output folder (never a gs:// one) and pushes from there: HubPusher
            # uploads over HTTP from a background thread, whatever folder the model is in.
            from . import hub_pusher  # only for --hub_model_id

            self.pusher = hub_pusher.HubPusher(
                output.hub_model_id,
                output.hub_private,
                output.output_dir,
                save_model,
                self.card,
                output.hub_push_timeout,
            )
        if self.chief:
            recorded = checkpoints.resume_settings(
                settings, config, manifests[0], self.plan.global_batch_size, self.total_steps
            )
            checkpoints.prepare_output_dir(
                output.output_dir, output.overwrite_output_dir, recorded, self.plan
            )
        # nobody reads the checkpoints while the chief may still be clearing them
        hosts.wait_for_every_worker(strategy)
        self.parent = parent
        self.started = time.perf_counter()

    def resume(self, masked_lm, optimizer):
        """The optimizer step to start at: that of the newest checkpoint in the output folder, or 0.

        A worker that is not the chief saves its checkpoints (it may take part in collective ops)
        into a scratch folder of its own, removed at the end."""
        self.manager, self.start_step = checkpoints.restore_checkpoint(
            self.output_dir,
            masked_lm,
            optimizer,
            keep=self.steps.save_total_limit,
            chief=self.chief,
        )
        replicas, batch = self.plan.replicas, self.plan.global_batch_size
        per_replica = f"{self.plan.per_replica_batch_size:,} a replica"
        if self.plan.accumulation_steps > 1:  # --gradient_accumulation_steps multiplies the batch
            per_replica += f" x {self.plan.accumulation_steps} accumulated"
        print(
            f"Training {type(masked_lm).__name__} ({masked_lm.count_params():,} parameters) on "
            f"{replicas} replica{'s' if replicas > 1 else ''} of {type(self.strategy).__name__}: "
            f"a global batch of {batch:,} sequences ({per_replica}) x "
            f"{self.max_length} tokens = {self.tokens_per_step:,} tokens a step."
        )
        if self.start_step:
            checkpoint, step = self.manager.latest_checkpoint, self.start_step
            print(f"Resuming from {checkpoint} at step {step} of {self.total_steps}.")
        print(
            segments.schedule_line(
                self.start_step,
                self.total_steps,
                self.plan.steps_per_epoch,
                self.steps_per_evaluation,
                phase_end=self.phase_end,
                evaluates=self.evaluation is not None,
            )
        )
        if self.evaluation:
            print(self.evaluation)
        if not self.chief:
            self.manager = checkpoints.scratch_manager(self.manager)
        return self.start_step

    def evaluate_parent(self, trainer, eval_dataset, eval_batches):
        """Continued pretraining, started afresh with an evaluation split: the evaluation before
        the first step, where the parent stands on this text. Printed; on the chief, the row of
        step 0 in training_log.csv and TensorBoard's eval scalars at step 0. Nothing otherwise."""
        if not (self.parent and eval_dataset and self.start_step == 0):
            return
        logs = trainer.evaluate(eval_dataset, steps=eval_batches, return_dict=True, verbose=0)
        logs = {f"val_{name}": float(value) for name, value in logs.items()}
        logs["val_perplexity"] = training_logs.perplexity(logs["val_loss"])
        print(
            f"Before the first step: eval loss {logs['val_loss']:.4f}, perplexity "
            f"{logs['val_perplexity']:.2f}, accuracy at [MASK] "
            f"{logs['val_mask_token_accuracy']:.4f}."
        )
        if self.chief:
            training_logs.write_baseline(self.output_dir, logs)

    def callbacks(self):
        """fit()'s callbacks besides the steps.

        A checkpoint every --save_steps optimizer steps and at every fit() epoch end (an epoch of
        the data, or --eval_steps steps: where the evaluation comes); TensorBoard scalars every
        --logging_steps steps and after each fit() epoch. On the chief alone: each fit() epoch as a
        row of training_log.csv, written once its checkpoint is saved, and a Hub snapshot pushed in
        the background.
        """
        # the epoch summary first: it completes the epoch's logs the others read
        callbacks = [training_logs.EpochSummary()] if self.chief else []
        if self.pusher is not None:
            from .hub_pusher import PushAtEpochEnd  # imported with the pusher

            callbacks.append(PushAtEpochEnd(self.pusher, self.total_steps))
        callbacks.append(
            training_logs.TensorBoardScalars(
                self.output_dir, self.steps.logging_steps, self.tokens_per_step, self.chief
            )
        )
        training_log = training_logs.training_log_path(self.output_dir) if self.chief else None
        callbacks.append(
            checkpoints.SaveCheckpoints(
                self.manager, self.steps.save_steps, training_log, self.plan.steps_per_epoch
            )
        )
        return callbacks

    def finish(self, trainer, logs):
        """After fit() and the chief's save: the card and curves beside the model, a summary line,
        the final Hub push; a worker removes its scratch checkpoints. Returns the final logs."""
        import tensorflow as tf

        steps = int(trainer.optimizer.iterations.numpy())
        if not self.chief:
            tf.io.gfile.rmtree(self.manager.directory)
            print(f"Worker done after {steps} steps; the chief saves the model.")
            return logs
        # a run resumed at its last step trained no epoch: it reports the last one logged
        logs = logs or training_logs.last_logged_epoch(
            training_logs.training_log_path(self.output_dir)
        )
        final_card = self.card(trainer, {key: values[-1] for key, values in logs.items()})
        model_card.add_card_and_curves(self.output_dir, final_card)
        minutes = (time.perf_counter() - self.started) / 60
        summary = training_logs.summary_line(steps, self.tokens_per_step, logs, minutes)
        print(summary + (f" (resumed at step {self.start_step})" if self.start_step else ""))
        if self.pusher is not None:
            self.pusher.push_final(trainer, final_card, f"Final model: {steps} steps")
        return logs
