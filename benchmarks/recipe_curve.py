"""Tokens to accuracy: run run_mlm.py once and evaluate it every --eval_every optimizer steps on
the same masks.

    python benchmarks/recipe_curve.py --eval_every 250 --output_json runs/warmup.json -- \
        --no_tpu --train_dataset wt2/shards/train --eval_dataset wt2/shards/validation \
        --tokenizer wt2/tokenizer --output_dir runs/warmup --max_steps 5000 \
        --per_replica_batch_size 32 --short_sequence_length 32

Everything after `--` goes to run_mlm.py unchanged. Every `--eval_every` steps, and at the end, the
model is scored on all of --eval_dataset, masked as run_mlm.py masks its evaluation data: 15% of the
tokens, with the same seed, so every run of the recipe table is scored on the very same positions
whatever it trained with (whole words, short pieces). The table gives the tokens seen when accuracy
at [MASK] first reaches 0.10, 0.20 and 0.30; tokens carry over to other hardware, minutes do not.
Minutes count training only: the time of these extra evaluations is taken out (run_mlm.py's own
epoch-end evaluations stay in, as in a user's run). With --eval_every set to the steps of an epoch,
the table is the budget-to-accuracy curve epoch by epoch.
"""

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# run_mlm.py lives at the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import describe_machine, markdown_table  # noqa: E402

import run_mlm  # noqa: E402
from mlm_pipeline import contract, hosts, shard_checks  # noqa: E402
from mlm_pipeline.errors import OneLineErrorParser, UsageError, exit_on_usage_error  # noqa: E402

THRESHOLDS = (0.10, 0.20, 0.30)


def curve_callback(args, eval_every, points):
    """A Keras callback for run_mlm.main(args, callbacks=...) that scores the model every
    `eval_every` optimizer steps and at the last; the clock starts with the first fit() call
    (run_mlm.py may make several)."""
    import tf_keras

    from mlm_pipeline import masked_lm_data, masked_lm_model  # the engine: TensorFlow is loaded

    class Curve(tf_keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            if hasattr(self, "scorer"):
                return
            self.prepare(self.model.distribute_strategy)
            # A scorer of its own, sharing the weights: the trainer's
            # metrics keep their running sums.
            masked_lm = self.model.masked_lm
            self.scorer = masked_lm_model.MaskedLMTrainer(
                masked_lm, "sparse", masked_lm.config.mask_token_id
            )
            self.scorer.compile()
            self.started, self.evaluating = time.perf_counter(), 0.0

        def prepare(self, strategy):
            """The run's steps and tokens a step, and the evaluation data as run_mlm.main builds
            it: the same files, batches and masks, here in one input pipeline."""
            data, batch_size = args.data, args.speed.per_replica_batch_size
            tokenizer = contract.load_tokenizer(
                data.tokenizer, "--tokenizer", args.model.trust_remote_code
            )
            named = contract.NamedTokenizer(
                tokenizer, data.tokenizer, f"--tokenizer {data.tokenizer}"
            )
            manifests = shard_checks.read_training_manifests(
                data.train_dataset[0], data.eval_dataset[0], named
            )
            max_length = manifests[0]["max_length"]
            accumulation = args.speed.gradient_accumulation_steps  # tokens a step, as run_mlm.py
            train_plan, eval_plan = hosts.input_plans(strategy, manifests, batch_size, accumulation)
            self.total_steps = args.steps.total_steps(train_plan.steps_per_epoch)
            self.tokens_per_step = train_plan.global_batch_size * max_length
            # The run's evaluation: each replica's batch in turn from one pass of the files.
            self.eval_steps = eval_plan.steps_per_epoch * eval_plan.replicas
            self.eval_dataset = masked_lm_data.build_dataset(
                manifests[1]["files"],
                batch_size,
                training=False,
                tokenizer=tokenizer,
                max_length=max_length,
                masking=args.masking,
                batches_per_epoch=self.eval_steps,
            )

        def on_train_batch_end(self, batch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            if step % eval_every == 0 or step == self.total_steps:
                self.score(step)

        def score(self, step):
            began = time.perf_counter()
            minutes = (began - self.started - self.evaluating) / 60
            figures = self.scorer.evaluate(
                self.eval_dataset, steps=self.eval_steps, verbose=0, return_dict=True
            )
            self.evaluating += time.perf_counter() - began
            points.append(
                {
                    "step": step,
                    "tokens": step * self.tokens_per_step,
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


def main(argv):
    """argv: this script's flags, then after `--` run_mlm.py's."""
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--eval_every", type=int, default=250, help="Optimizer steps between evaluations."
    )
    parser.add_argument("--output_json", help="Write the curve here too.")
    split = argv.index("--") if "--" in argv else len(argv)
    own, run_mlm_argv = parser.parse_args(argv[:split]), argv[split + 1 :]
    args = run_mlm.parse_args(run_mlm_argv)
    if not args.data.eval_dataset:
        raise UsageError("the curve is scored on --eval_dataset: pass it among run_mlm.py's flags.")
    print(f"Machine: {describe_machine()}")
    print("Command: python run_mlm.py " + " ".join(run_mlm_argv), flush=True)

    points = []
    run_mlm.main(args, callbacks=[curve_callback(args, own.eval_every, points)])

    rows = [
        [
            f"{point['step']:,}",
            f"{point['tokens'] / 1e6:.1f} M",
            f"{point['minutes']:.1f}",
            f"{point['loss']:.3f}",
            f"{point['mask_token_accuracy']:.3f}",
            f"{point['top_token_share']:.2f}",
        ]
        for point in points
    ]
    header = ["step", "tokens", "minutes", "val loss", "accuracy at [MASK]", "top token share"]
    print("\n" + markdown_table(header, rows, text_columns=0))
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
    exit_on_usage_error(main, sys.argv[1:], "recipe_curve.py")
