"""run_mlm.py's Hub pushes during training: a snapshot at every evaluation, uploaded from a
background thread while training goes on, and the final model last (`HubPusher`).

The repository is opened, and failures put in one line, as hub.py does for every step.
"""

import os
import sys
import tempfile
import threading
import time

import tensorflow as tf
import tf_keras

from .contract import CURVES_NAME, MODEL_CARD_NAME
from .errors import UsageError
from .hub import FINAL_PUSH_TIMEOUT, hub_error_text, open_repository
from .storage import is_remote


class HubPusher:
    """Pushes run_mlm.py's model to a Hub repository: a snapshot at each evaluation, the final model
    last.

    Every push is one commit of a snapshot folder laid out as run_mlm.py saves the model:
    `save_model(folder, masked_lm)` writes the model files (run_mlm.py's save_model: the model, its
    tokenizer, the PyTorch copy), and `card(trainer, metrics)` the model card's text (`trainer`:
    run_mlm.py's Keras trainer, its model in `trainer.masked_lm`). The repository is created, or
    found, when the pusher is made, so a wrong id or a missing login stops the run before the
    output folder is touched or any step trained.

    During training, push_in_background() writes a snapshot to a local staging folder on the
    training thread (the weights must be read between steps) and uploads it from a worker thread
    while training goes on. While that upload runs, further requests are skipped rather than queued:
    a queue could grow without bound on a slow link, and only the newest weights matter. The worker
    is a daemon thread, so a stuck upload can never keep a failed run from exiting. push_final()
    lets a running upload finish (so it cannot land after the final model), then pushes the final
    model and waits for it, from a daemon thread too: the two waits together last `push_timeout`
    seconds at most, after which the run gives up in one line (the model is saved in `output_dir` by
    then) and can exit while the upload is still stuck.
    """

    def __init__(
        self,
        repo_id,
        private,
        output_dir,
        save_model,
        card,
        push_timeout=FINAL_PUSH_TIMEOUT,
    ):
        from huggingface_hub import HfApi
        from huggingface_hub.utils import disable_progress_bars

        self.repo_id = open_repository(repo_id, private, leave_out="--hub_model_id")
        self.api = HfApi()
        self.output_dir, self.save_model, self.card = output_dir, save_model, card
        self.push_timeout = push_timeout
        # set when push_final() stops waiting: an upload that ends after that stays silent
        self.given_up = False
        # upload bars from the worker thread would cut through Keras's progress lines
        disable_progress_bars()
        self.upload = None  # the worker thread of the latest background push
        print(
            f"Pushing to the Hub repository {self.repo_id}: a snapshot at each row of "
            "training_log.csv, the final model last."
        )

    def uploading(self):
        return self.upload is not None and self.upload.is_alive()

    def write_snapshot(self, folder, trainer, card_text):
        """What a push publishes: the model files as run_mlm.py saves them, and the card."""
        self.save_model(folder, trainer.masked_lm)
        with open(os.path.join(folder, MODEL_CARD_NAME), "w", encoding="utf-8") as file:
            file.write(card_text)

    def push_in_background(self, trainer, metrics, message):
        """Start uploading a snapshot of `trainer`'s model unless the previous push still runs; True
        if started."""
        if self.uploading():
            return False
        # removed at exit too, should the run fail
        staging = tempfile.TemporaryDirectory(prefix="hub-push-")
        self.write_snapshot(staging.name, trainer, self.card(trainer, metrics))
        self.upload = threading.Thread(
            target=self.upload_snapshot, args=(staging, message), daemon=True
        )
        self.upload.start()
        return True

    def upload_snapshot(self, staging, message):
        try:
            self.api.upload_folder(
                repo_id=self.repo_id, folder_path=staging.name, commit_message=message
            )
            if not self.given_up:
                print(f"Pushed to {self.repo_id}: {message}")
        except Exception as error:  # training goes on: the final push sends everything again
            # the run has said its last line (and may be removing the staging folder)
            if self.given_up:
                return
            print(
                f"run_mlm.py: warning: the Hub push '{message}' failed ({hub_error_text(error)}); "
                "training goes on, and the final model is pushed at the end.",
                file=sys.stderr,
            )
        finally:
            staging.cleanup()

    def push_final(self, trainer, card_text, message):
        """Push the final model and wait, `push_timeout` seconds at most; a failure or a push that
        does not end in time is one line, and the model stays saved in the output folder."""
        # the budget covers waiting for uploads, not writing the snapshot, which is local work
        waited = 0.0
        if self.uploading():
            print("Waiting for the previous Hub push to finish before pushing the final model.")
            started = time.monotonic()
            self.upload.join(self.push_timeout)
            waited = time.monotonic() - started
            # pushing the final model now could let the stuck snapshot land after it
            if self.upload.is_alive():
                raise self.give_up("did not start: an epoch's snapshot was still uploading after")
        # removed at exit too, should the upload stick
        staging = tempfile.TemporaryDirectory(prefix="hub-push-")
        try:
            self.write_snapshot(staging.name, trainer, card_text)
            curves = f"{self.output_dir.rstrip('/')}/{CURVES_NAME}"
            if tf.io.gfile.exists(curves):  # the final push shows how training went
                tf.io.gfile.copy(curves, os.path.join(staging.name, CURVES_NAME))
        except Exception as error:
            staging.cleanup()
            raise self.push_later(f"failed ({hub_error_text(error)})") from None
        outcome = {}

        def upload():
            try:
                outcome["commit"] = self.api.upload_folder(
                    repo_id=self.repo_id, folder_path=staging.name, commit_message=message
                )
            except Exception as error:
                outcome["error"] = error
            finally:
                staging.cleanup()

        # exit must not wait for it
        worker = threading.Thread(target=upload, name="hub-final-push", daemon=True)
        worker.start()
        worker.join(max(0.0, self.push_timeout - waited))
        if worker.is_alive():
            raise self.give_up("did not finish within")
        if "error" in outcome:
            raise self.push_later(f"failed ({hub_error_text(outcome['error'])})")
        print(
            "Pushed the final model, its tokenizer and model card to the Hub: "
            f"{outcome['commit'].commit_url}"
        )

    def give_up(self, what_happened):
        """Stop waiting for a stuck upload: its daemon thread is left to the exit, silent from now
        on."""
        self.given_up = True
        return self.push_later(f"{what_happened} {self.push_timeout} s (--hub_push_timeout)")

    def push_later(self, what_happened):
        """The one line for a final push that did not happen: the model is saved, and how to push
        it by hand."""
        local_copy = " (from a local copy)" if is_remote(self.output_dir) else ""
        return UsageError(
            f"the model is saved in {self.output_dir}, but pushing it to --hub_model_id "
            f"{self.repo_id} {what_happened}; push it later with `hf upload {self.repo_id} "
            f"{self.output_dir} --exclude 'checkpoints/*'`{local_copy}."
        )


class PushAtEpochEnd(tf_keras.callbacks.Callback):
    """A Keras callback that has `pusher` (a HubPusher) push a snapshot at each evaluation, in the
    background; none at the last (the step `total_steps`), which push_final() covers."""

    def __init__(self, pusher, total_steps):
        super().__init__()
        self.pusher, self.total_steps = pusher, total_steps

    def on_epoch_end(self, epoch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step >= self.total_steps:
            return
        # fit()'s epochs may be --eval_steps long: the step says where training is
        message = f"Step {step} of {self.total_steps}"
        if not self.pusher.push_in_background(self.model, dict(logs or {}), message):
            print(f"Skipped the Hub push of step {step}: the previous push is still uploading.")
