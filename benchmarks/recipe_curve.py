"""Tokens to accuracy: run run_mlm.py once and evaluate it every --eval_every optimizer steps on the
same masks.

    python benchmarks/recipe_curve.py --eval_every 250 --output_json runs/warmup.json -- \
        --no_tpu --train_dataset wt2/shards/train --eval_dataset wt2/shards/validation --tokenizer wt2/tokenizer \
        --output_dir runs/warmup --max_steps 5000 --per_replica_batch_size 32 --short_sequence_length 32

Everything after `--` goes to run_mlm.py unchanged. Every `--eval_every` steps, and at the end, the
model is scored on all of --eval_dataset, masked as run_mlm.py masks its evaluation data: 15% of the
tokens, with the same seed, so every run of the recipe table is scored on the very same positions
whatever it trained with (whole words, short pieces). The table gives the tokens seen when accuracy
at [MASK] first reaches 0.10, 0.20 and 0.30; tokens carry over to other hardware, minutes do not.
Minutes count training only: the time of these extra evaluations is taken out (run_mlm.py's own
epoch-end evaluations stay in, as in a user's run).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# run_mlm.py lives at the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import describe_machine  # noqa: E402

import run_mlm  # noqa: E402
from mlm_pipeline import checkpoints, hosts  # noqa: E402

THRESHOLDS = (0.10, 0.20, 0.30)


def curve_callback(eval_every, total_steps, tokens_per_step, evaluation, points):
    """A Keras callback that scores the model every `eval_every` steps and at the last, on
    `evaluation` = [dataset, steps]; the clock starts with the first fit() call (run_mlm.py may make
    several)."""
    import tf_keras

    class Curve(tf_keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            if hasattr(self, "scorer"):
                return
            self.started, self.evaluating = time.perf_counter(), 0.0
            # A scorer of its own, sharing the weights: the trainer's metrics keep their running
            # sums.
            masked_lm = self.model.masked_lm
            self.scorer = run_mlm.masked_lm_trainer(
                masked_lm, "sparse", masked_lm.config.mask_token_id
            )
            self.scorer.compile()

        def on_train_batch_end(self, batch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            if step % eval_every == 0 or step == total_steps:
                self.score(step)

        def score(self, step):
            began = time.perf_counter()
            minutes = (began - self.started - self.evaluating) / 60
            dataset, steps = evaluation
            figures = self.scorer.evaluate(dataset, steps=steps, verbose=0, return_dict=True)
            self.evaluating += time.perf_counter() - began
            points.append(
                {
                    "step": step,
                    "tokens": step * tokens_per_step,
                    "minutes": round(minutes, 2),
                    "loss": figures["loss"],
                    "mask_token_accuracy": figures["mask_token_accuracy"],
                    "top_token_share": figures["top_token_share"],
                }
            )
            print(
                f"[curve] step {step}: {points[-1]['tokens']:,} tokens, {minutes:.1f} min, acc at "
                f"[MASK] {figures['mask_token_accuracy']:.3f}, top share "
                f"{figures['top_token_share']:.2f}, loss {figures['loss']:.3f}",
                flush=True,
            )

    return Curve()


def first_reached(points, threshold):
    return next((point for point in points if point["mask_token_accuracy"] >= threshold), None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--eval_every", type=int, default=250, help="Optimizer steps between evaluations."
    )
    parser.add_argument("--output_json", help="Write the curve here too.")
    own, run_mlm_argv = (
        parser.parse_args(sys.argv[1 : sys.argv.index("--")]),
        sys.argv[sys.argv.index("--") + 1 :],
    )
    args = run_mlm.parse_args(run_mlm_argv)
    print(f"Machine: {describe_machine()}")
    print("Command: python run_mlm.py " + " ".join(run_mlm_argv), flush=True)

    points, evaluation = [], []
    distribute, fit_callbacks = hosts.distribute, checkpoints.fit_callbacks

    # the run's own evaluation data, masks included
    def distribute_and_keep_evaluation(*positional, **named):
        plan = distribute(*positional, **named)
        evaluation[:] = plan[2:]
        return plan

    def with_curve(
        output_dir, save_steps, logging_steps, chief, pusher, manager, total_steps, tokens_per_step
    ):
        callbacks = fit_callbacks(
            output_dir,
            save_steps,
            logging_steps,
            chief,
            pusher,
            manager,
            total_steps,
            tokens_per_step,
        )
        return callbacks + [
            curve_callback(own.eval_every, total_steps, tokens_per_step, evaluation, points)
        ]

    hosts.distribute, checkpoints.fit_callbacks = distribute_and_keep_evaluation, with_curve
    run_mlm.main(args)

    print("\n| step | tokens | minutes | val loss | accuracy at [MASK] | top token share |")
    print("|---:|---:|---:|---:|---:|---:|")
    for point in points:
        print(
            f"| {point['step']:,} | {point['tokens'] / 1e6:.1f} M | {point['minutes']:.1f} | "
            f"{point['loss']:.3f} | {point['mask_token_accuracy']:.3f} | "
            f"{point['top_token_share']:.2f} |"
        )
    reached = []
    for threshold in THRESHOLDS:
        point = first_reached(points, threshold)
        reached.append(
            f"{point['tokens'] / 1e6:.1f} M ({point['minutes']:.1f} min)"
            if point
            else "not reached"
        )
    print(
        "\nTokens seen when accuracy at [MASK] first reached "
        + ", ".join(f"{threshold:.2f}: {text}" for threshold, text in zip(THRESHOLDS, reached))
    )
    if own.output_json:
        Path(own.output_json).write_text(
            json.dumps({"command": run_mlm_argv, "points": points}, indent=1)
        )


if __name__ == "__main__":
    main()
