"""Quality per budget: run run_mlm.py once and tabulate the evaluation after every epoch against
wall time.

    python benchmarks/quality_budget.py --no_tpu --train_dataset shards/train \
        --eval_dataset shards/validation --tokenizer tokenizer --output_dir runs/budget \
        --num_epochs 6 --config_overrides \
        hidden_size=256,num_hidden_layers=4,num_attention_heads=4,intermediate_size=1024

Every argument goes to run_mlm.py unchanged (its defaults apply), so the table describes exactly the
command a user would run. Minutes are wall time since training began, evaluations included; accuracy
at [MASK] inputs is the fill-mask task, and the top token's share of those predictions shows
collapse (a model that answers one token everywhere scores that token's frequency, with a share near
1).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# run_mlm.py lives at the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import describe_machine  # noqa: E402

import run_mlm  # noqa: E402


def main(argv):
    print(f"Machine: {describe_machine()}")
    print("Command: python run_mlm.py " + " ".join(argv))
    trainer, logs = run_mlm.main(run_mlm.parse_args(argv))
    print(
        "\n| epoch | minutes | steps | val loss | masked accuracy | accuracy at [MASK] | top "
        "token share |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for epoch, minutes in enumerate(logs["elapsed_minutes"]):
        print(
            f"| {epoch + 1} | {minutes:.1f} | {logs['step'][epoch]} | "
            f"{logs['val_loss'][epoch]:.3f} | {logs['val_masked_accuracy'][epoch]:.3f} | "
            f"{logs['val_mask_token_accuracy'][epoch]:.3f} | "
            f"{logs['val_top_token_share'][epoch]:.2f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
