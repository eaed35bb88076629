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

import tensorflow as tf

from . import (
    averaging,
    checkpoints,
    hosts,
    masked_lm_model,
    mixture,
    model_card,
    model_folder,
    segments,
    shard_checks,
    training_logs,
    validation_sets,
)
from .contract import RUN_SETTINGS_NAME


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The run's steps: `total_steps` optimizer steps over `plan` (the train split's
    hosts.InputPlan), the first `phase_end` on the sequence-length warmup's pieces; `evaluation`,
    what each evaluation scores (masked_lm_data.EvaluationData; None: no evaluation split)."""

    plan: object
    total_steps: int
    phase_end: int = 0
    evaluation: Optional[object] = None


@dataclasses.dataclass(frozen=True)
class Started:
    """What TrainingRun.start() set up and learned: `start_step`, the optimizer step the run starts
    at (that of the newest checkpoint, or 0); `manager`, the tf.train.CheckpointManager that saves
    the next ones; `pusher`, the hub_pusher.HubPusher of --hub_model_id on the chief (else None);
    `clock`, time.perf_counter() when training began."""

    start_step: int
    manager: object
    pusher: object
    clock: float


class TrainingRun:
    """Made once the model is built (a parent that cannot be loaded is refused before the output
    folder is touched), by keyword; making it touches nothing. `start()` opens the Hub repository
    first (an unusable Hub stops the run now), then the chief starts the output folder afresh or
    checks that its checkpoints belong to this run (checkpoints.resume_settings()), every worker
    waits for it, and the newest checkpoint is restored; the other methods take what it returns.

    `settings`: run_mlm.py's Settings, read group by group: the steps say when to evaluate,
    checkpoint and log, the output where the model goes and whether to push it to the Hub; a
    resumed run must share the masking and the optimizer, and the card shows them with the rest.
    `schedule`: the run's steps (Schedule); `tokenizer`, a contract.NamedTokenizer; `manifests`,
    the train and evaluation shards' (the second may be None); `save_model(folder, masked_lm)`
    writes the model files of a Hub snapshot; `origin`, where the weights start
    (masked_lm_model.Scratch or pretrained_model.Parent).
    """

    def __init__(
        self, *, settings, strategy, schedule, config, tokenizer, manifests, save_model, origin
    ):
        self.settings, self.strategy, self.schedule = settings, strategy, schedule
        self.config, self.manifests, self.save_model = config, manifests, save_model
        self.origin = origin
        steps = settings.steps
        self.plan, self.steps = schedule.plan, steps
        self.output_dir, self.total_steps = settings.output.output_dir, schedule.total_steps
        self.steps_per_evaluation = steps.steps_per_evaluation(self.plan.steps_per_epoch)
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
            origin=origin,
        )
        self.chief = hosts.is_chief(strategy)

    def start(self, masked_lm, optimizer, variables=None):
        """The run's side effects before the first step, in order: the Hub repository opened, the
        output folder prepared on the chief, every worker waiting for it, the newest checkpoint
        restored into `masked_lm` and `optimizer` (resume; a branch's parent checkpoint when the
        folder has none, `variables` the trainer's trainable ones) and the run's lines printed.
        Returns what later methods need (Started)."""
        pusher = self.open_hub_repository()
        if self.chief:
            recorded = checkpoints.resume_settings(
                self.settings,
                self.origin,
                self.config,
                self.manifests[0],
                self.plan.global_batch_size,
                self.total_steps,
                self.plan.mixture,
            )
            output = self.settings.output
            checkpoints.prepare_output_dir(
                output.output_dir, output.overwrite_output_dir, recorded, self.plan
            )
        # nobody reads the checkpoints while the chief may still be clearing them
        hosts.wait_for_every_worker(self.strategy)
        clock = time.perf_counter()
        manager, start_step = self.resume(masked_lm, optimizer, variables)
        return Started(start_step, manager, pusher, clock)

    def open_hub_repository(self):
        """--hub_model_id, on the chief: the HubPusher of its snapshots (None otherwise)."""
        output = self.settings.output
        if not (output.hub_model_id and self.chief):
            return None
        # In place of transformers' PushToHubCallback, which clones the Hub repository with
        # git into the output folder (never a gs:// one) and pushes from there: HubPusher
        # uploads over HTTP from a background thread, whatever folder the model is in.
        from . import hub_pusher  # only for --hub_model_id

        return hub_pusher.HubPusher(
            output.hub_model_id,
            output.hub_private,
            output.output_dir,
            self.save_model,
            self.card,
            output.hub_push_timeout,
        )

    def resume(self, masked_lm, optimizer, variables=None):
        """(manager, step to start at): that of the newest checkpoint in the output folder, else
        that of a branch's parent checkpoint (restored; `variables`, the trainer's trainable ones),
        else 0.

        A worker that is not the chief saves its checkpoints (it may take part in collective ops)
        into a scratch folder of its own, removed at the end."""
        manager, start_step = checkpoints.restore_checkpoint(
            self.output_dir,
            masked_lm,
            optimizer,
            keep=averaging.checkpoints_kept(
                self.steps.save_total_limit, self.settings.output.average_last
            ),
            chief=self.chief,
        )
        branch = self.origin.branch
        if branch is not None and start_step == 0:  # a branch's own checkpoints win, as any run's
            start_step = self.origin.restore(masked_lm, optimizer, variables, self.strategy)
            print(
                f"Branching from {branch.name} at step {start_step:,}: its weights, optimizer "
                f"moments and step, at its learning rate there, {branch.learning_rate:.4g}; "
                f"{self.total_steps - start_step:,} steps to step {self.total_steps:,}."
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
        if start_step and manager.latest_checkpoint:
            print(
                f"Resuming from {manager.latest_checkpoint} at step {start_step} of "
                f"{self.total_steps}."
            )
        evaluation = self.schedule.evaluation
        print(
            segments.schedule_line(
                start_step,
                self.total_steps,
                self.plan.steps_per_epoch,
                self.steps_per_evaluation,
                phase_end=self.schedule.phase_end,
                evaluates=evaluation is not None,
                epoch=self.plan.epoch_meaning,
            )
        )
        if self.plan.mixture is not None:  # each folder's share and passes, in the log
            lines = mixture.mixture_lines(
                self.plan.mixture, self.total_steps, self.plan.global_batch_size
            )
            print("\n".join(lines))
        if evaluation is not None:
            print(evaluation.line)
        if not self.chief:
            manager = checkpoints.scratch_manager(manager)
        return manager, start_step

    def evaluate_first(self, trainer, started):
        """A start that evaluates first (a parent: where it stands on this text), started afresh
        with an evaluation split: the evaluation before the first step. Printed; on the chief, the
        row of step 0 in training_log.csv and TensorBoard's eval scalars at step 0; with several
        validation sets, every one. Nothing otherwise."""
        evaluation = self.schedule.evaluation
        if not (self.origin.evaluates_first and evaluation and started.start_step == 0):
            return
        logs = trainer.evaluate(
            evaluation.dataset, steps=evaluation.batches, return_dict=True, verbose=0
        )
        logs = {f"val_{name}": float(value) for name, value in logs.items()}
        logs["val_perplexity"] = training_logs.perplexity(logs["val_loss"])
        print(
            f"Before the first step: eval loss {logs['val_loss']:.4f}, perplexity "
            f"{logs['val_perplexity']:.2f}, accuracy at [MASK] "
            f"{logs['val_mask_token_accuracy']:.4f}."
        )
        if evaluation.sets:  # several validation sets: each one, by its name
            logs.update(validation_sets.evaluate_sets(trainer, evaluation.sets, logs))
            print(f"Before the first step, {validation_sets.figures_line(logs, evaluation.names)}.")
        if self.chief:
            training_logs.write_baseline(self.output_dir, logs)

    def train(self, trainer, train_dataset_from, started, callbacks=()):
        """The run's steps from where it `started`, in fit() calls of fixed shapes
        (masked_lm_model.fit_exact_steps says why), an evaluation at every fit() epoch end, with
        the run's callbacks and `callbacks`; a corrupt shard is named, with what to do. Returns
        fit()'s logs, joined across the calls."""
        evaluation, steps = self.schedule.evaluation, self.steps
        manifests = list(self.manifests)
        if self.plan.mixture is not None:  # the mixture's later folders may be the corrupt one
            manifests += self.plan.mixture.manifests[1:]
        with shard_checks.corrupt_shards_named(manifests, self.output_dir):
            return masked_lm_model.fit_exact_steps(
                trainer,
                train_dataset_from,
                range(started.start_step, self.total_steps),
                self.steps_per_evaluation,
                phase_end=self.schedule.phase_end,
                numbered=not steps.eval_steps,
                validation_data=evaluation and evaluation.dataset,
                validation_steps=evaluation and evaluation.batches,
                callbacks=self.callbacks(started) + list(callbacks),
            )

    def callbacks(self, started):
        """fit()'s callbacks besides the steps, once the run has `started` (Started).

        A checkpoint every --save_steps optimizer steps and at every fit() epoch end (an epoch of
        the data, or --eval_steps steps: where the evaluation comes); TensorBoard scalars every
        --logging_steps steps and after each fit() epoch. On the chief alone: each fit() epoch as a
        row of training_log.csv, written once its checkpoint is saved, and a Hub snapshot pushed in
        the background. With several validation sets, at every fit() epoch end the sets after the
        first are scored too (validation_sets.EvaluateEverySet), on every worker.
        """
        # the other validation sets first, on every worker (their evaluation is collective), then
        # the epoch summary: they complete the epoch's logs the others read
        evaluation = self.schedule.evaluation
        callbacks = []
        if evaluation is not None and evaluation.sets:
            callbacks.append(validation_sets.EvaluateEverySet(evaluation.sets))
        if self.chief:
            callbacks.append(training_logs.EpochSummary())
        if started.pusher is not None:
            from .hub_pusher import PushAtEpochEnd  # imported with the pusher

            callbacks.append(PushAtEpochEnd(started.pusher, self.total_steps))
        callbacks.append(
            training_logs.TensorBoardScalars(
                self.output_dir, self.steps.logging_steps, self.tokens_per_step, self.chief
            )
        )
        training_log = training_logs.training_log_path(self.output_dir) if self.chief else None
        callbacks.append(
            checkpoints.SaveCheckpoints(
                started.manager, self.steps.save_steps, training_log, self.plan.steps_per_epoch
            )
        )
        decay_start = self.decay_start()
        if decay_start is not None and started.start_step < decay_start:
            callbacks.append(self.save_decay_start(started.manager, decay_start))
        return callbacks

    def average_checkpoints(self, trainer):
        """--average_last K, after the last step (None without it): the last step's model saved in
        <output_dir>/last_step by the chief, then the mean of the weights of the run's newest K
        checkpoints put in its place in `trainer.masked_lm`, for run_mlm.py to save as the model
        the run hands on; both evaluated. Every worker reads the chief's checkpoints (as a resumed
        run does) and evaluates, which takes them all; returns what was done (averaging.Averaged).
        """
        average_last = self.settings.output.average_last
        if not average_last:
            return None
        hosts.wait_for_every_worker(self.strategy)  # the chief's last checkpoint is written
        paths = averaging.last_checkpoints(
            checkpoints.checkpoint_dir(self.output_dir), average_last
        )
        last_step = averaging.evaluate(trainer, self.schedule.evaluation)
        if self.chief:  # a model folder of its own, config.json last
            folder = f"{self.output_dir.rstrip('/')}/{averaging.LAST_STEP_DIR}"
            with model_folder.staging(folder) as staged:
                self.save_model(staged, trainer.masked_lm)
        averaging.average_into(trainer.masked_lm, paths)
        averaged = averaging.Averaged(
            average_last,
            tuple(averaging.step_of(path) for path in paths),
            average=averaging.evaluate(trainer, self.schedule.evaluation),
            last_step=last_step,
        )
        print(averaged.line(self.output_dir))
        return averaged

    def decay_start(self):
        """The step where a run with --decay_ratio starts to decay, if it comes after the run's
        first step (a branch's: its parent's); None otherwise."""
        branch = self.origin.branch
        first_step = branch.step if branch is not None else 0
        decay_ratio = self.settings.optimizer.decay_ratio
        step = segments.decay_start(decay_ratio, self.total_steps, first_step)
        return step if step is not None and step > first_step else None

    def save_decay_start(self, manager, decay_start):
        """The callback that keeps the checkpoint of `decay_start` out of rotation's reach
        (checkpoints.SaveDecayStart), with run_settings.json beside it; a worker that is not the
        chief saves it into its scratch folder (`manager`'s), removed at the end."""
        if self.chief:
            folder = checkpoints.decay_start_dir(self.output_dir)
            settings = f"{checkpoints.checkpoint_dir(self.output_dir)}/{RUN_SETTINGS_NAME}"
        else:
            folder, settings = f"{manager.directory}/{checkpoints.DECAY_START_DIR}", None
        keeper = tf.train.CheckpointManager(manager.checkpoint, folder, max_to_keep=None)
        return checkpoints.SaveDecayStart(keeper, decay_start, settings)

    def finish(self, trainer, logs, started, averaged=None):
        """After fit() and the chief's save: the card and curves beside the model, a summary line,
        the final Hub push; a worker removes its scratch checkpoints. Returns the final logs.
        `averaged`: what average_checkpoints() did, for the card (None: the last step's model)."""
        steps = int(trainer.optimizer.iterations.numpy())
        if not self.chief:
            tf.io.gfile.rmtree(started.manager.directory)
            print(f"Worker done after {steps} steps; the chief saves the model.")
            return logs
        # a run resumed at its last step trained no epoch: it reports the last one logged
        logs = logs or training_logs.last_logged_epoch(
            training_logs.training_log_path(self.output_dir)
        )
        metrics = {key: values[-1] for key, values in logs.items()}
        final_card = self.card(trainer, metrics, averaged=averaged)
        names = self.schedule.evaluation.names if self.schedule.evaluation else ()
        model_card.add_card_and_curves(self.output_dir, final_card, names)
        minutes = (time.perf_counter() - started.clock) / 60
        summary = training_logs.summary_line(steps, self.tokens_per_step, logs, minutes, names)
        resumed = f" (resumed at step {started.start_step})" if started.start_step else ""
        branch = self.origin.branch
        if branch is not None and started.start_step == branch.step:  # no checkpoint of its own
            resumed = f" (branched at step {branch.step})"
        print(summary + resumed)
        if started.pusher is not None:
            started.pusher.push_final(trainer, final_card, f"Final model: {steps} steps")
        return logs
