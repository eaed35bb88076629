"""The average of a run's last K checkpoints against its last step alone: one run_mlm.py run, its
kept checkpoints averaged K at a time and scored as the run scores its evaluations.

    python benchmarks/average_checkpoints.py --last 1 2 4 8 --output_json seed42.json -- \
        --no_tpu --train_dataset wt2/shards/train --eval_dataset wt2/shards/validation \
        --tokenizer wt2/tokenizer --output_dir runs/seed42 --max_steps 1500 --save_steps 75 \
        --save_total_limit 8 --average_last 8

Everything after `--` is run_mlm.py's command. When its --output_dir holds no finished model yet,
the run is made first (resumed, if it was interrupted); a finished one is scored as it is. For each
K of --last, the model's weights become the mean of the newest K checkpoints in
<output_dir>/checkpoints (K = 1: the last step alone) and are scored on --eval_dataset at the run's
own fixed masks and batches (--max_eval_samples included): the figures run_mlm.py prints for its
evaluations. The run must keep at least the largest K (--save_total_limit, or --average_last).
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# run_mlm.py lives at the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import describe_machine, markdown_table  # noqa: E402

import run_mlm  # noqa: E402
from mlm_pipeline import contract  # noqa: E402
from mlm_pipeline.errors import OneLineErrorParser, UsageError, exit_on_usage_error  # noqa: E402


def run_evaluation(args, trainer=None):
    """The run's evaluation data, built as run_mlm.main builds it (the same files, batches and
    masks), and a scorer of the model: `trainer`, the run's own when it ran in this process, else
    one of the finished model in --output_dir."""
    from transformers import TFAutoModelForMaskedLM

    from mlm_pipeline import hosts, masked_lm_data, masked_lm_model  # the engine: TensorFlow

    origin = masked_lm_model.origin_of(args.model)
    strategy = trainer.distribute_strategy if trainer else hosts.build_strategy(args.hardware)
    named_tokenizer = masked_lm_data.load_tokenizer(args.data, args.model, origin)
    manifests, max_length = masked_lm_data.read_shards(
        args.data, args.masking, named_tokenizer, origin
    )
    speed = args.speed
    _, eval_plan = hosts.input_plans(
        strategy, manifests, speed.per_replica_batch_size, speed.gradient_accumulation_steps
    )
    evaluation = masked_lm_data.evaluation_data(  # the first --eval_dataset set: val_loss's
        strategy,
        eval_plan,
        manifests[1:],
        named_tokenizer.tokenizer,
        max_length,
        args.masking,
        args.steps.max_eval_samples,
        args.data.eval_dataset,
    )
    if trainer is None:
        with strategy.scope():
            masked_lm = TFAutoModelForMaskedLM.from_pretrained(args.output.output_dir)
            trainer = masked_lm_model.MaskedLMTrainer(
                masked_lm, speed.mlm_head, masked_lm.config.mask_token_id
            )
            trainer.compile()
    return trainer, evaluation


def main(argv):
    """argv: this script's flags, then after `--` run_mlm.py's."""
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--last",
        type=int,
        nargs="+",
        default=[1, 2, 4, 8],
        help="How many of the newest checkpoints to average, each a row (1: the last step alone).",
    )
    parser.add_argument("--output_json", help="Write the rows here too.")
    split = argv.index("--") if "--" in argv else len(argv)
    own, run_mlm_argv = parser.parse_args(argv[:split]), argv[split + 1 :]
    args = run_mlm.parse_args(run_mlm_argv)
    if not args.data.eval_dataset:
        raise UsageError("the averages are scored on --eval_dataset: pass it to run_mlm.py.")
    largest = max(own.last)
    if min(own.last) < 1 or largest > max(
        args.steps.save_total_limit, args.output.average_last or 0
    ):
        raise UsageError(
            f"--last {' '.join(map(str, own.last))} needs the run to keep {largest} checkpoints, "
            "each K at least 1: pass run_mlm.py --save_total_limit "
            f"{largest} (or --average_last {largest})."
        )
    print(f"Machine: {describe_machine()}")
    print("Command: python run_mlm.py " + " ".join(run_mlm_argv), flush=True)
    output_dir, trainer = args.output.output_dir, None
    if not os.path.exists(os.path.join(output_dir, contract.FINISHED_RUN_MARKER)):
        trainer, _ = run_mlm.main(args)

    from mlm_pipeline import averaging, checkpoints  # the engine: TensorFlow is loaded

    scorer, evaluation = run_evaluation(args, trainer)
    folder = checkpoints.checkpoint_dir(output_dir)
    rows = []
    for count in own.last:
        paths = averaging.last_checkpoints(folder, count)
        if len(paths) < count:
            raise UsageError(f"{folder} keeps {len(paths)} checkpoints, fewer than --last {count}.")
        averaging.average_into(scorer.masked_lm, paths)
        figures = averaging.evaluate(scorer, evaluation)
        steps = [averaging.step_of(path) for path in paths]
        rows.append({"last": count, "steps": steps, **figures})
        print(f"[average] last {count}: {figures}", flush=True)
    table = [
        [
            f"{row['last']}",
            f"{row['steps'][0]:,}-{row['steps'][-1]:,}",
            f"{row['loss']:.4f}",
            f"{row['mask_token_accuracy']:.4f}",
        ]
        for row in rows
    ]
    header = ["checkpoints averaged", "steps", "val loss", "accuracy at [MASK]"]
    print("\n" + markdown_table(header, table, text_columns=2))
    if own.output_json:
        Path(own.output_json).write_text(
            json.dumps({"command": run_mlm_argv, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    exit_on_usage_error(main, sys.argv[1:], "average_checkpoints.py")
