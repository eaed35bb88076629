"""Preemption: how close a run killed with SIGKILL and resumed comes to the same run left alone.

    python benchmarks/resume_curve.py --kill_after_step 100 --output_dir runs/resume -- \
        --no_tpu --train_dataset shards/train --eval_dataset shards/validation \
        --tokenizer tokenizer --num_epochs 2 --save_steps 50 --per_replica_batch_size 16 \
        --config_overrides \
        hidden_size=128,num_hidden_layers=2,num_attention_heads=2,intermediate_size=512

Everything after `--` goes to run_mlm.py unchanged. The script runs it twice into
`<output_dir>/uninterrupted` and `<output_dir>/interrupted`. The second run is killed (SIGKILL, no
warning) as soon as a checkpoint at or past --kill_after_step exists, and the same command is then
run again, which resumes it. It prints each epoch's losses from both runs' training_log.csv and the
largest difference between their final weights. With dropout in the model the two runs draw
different dropout masks after the resume, so they end close but not equal; with
`hidden_dropout_prob=0,attention_probs_dropout_prob=0` they should agree to float rounding.
"""

import argparse
import csv
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from machine import describe_machine  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True, help="Folder for the two runs.")
    parser.add_argument(
        "--kill_after_step", type=int, required=True, help="Kill once a checkpoint this far exists."
    )
    parser.add_argument(
        "run_mlm_args", nargs=argparse.REMAINDER, help="-- then run_mlm.py's flags."
    )
    args = parser.parse_args()
    args.run_mlm_args = [arg for arg in args.run_mlm_args if arg != "--"]
    return args


def latest_checkpoint_step(output_dir):
    state = output_dir / "checkpoints" / "checkpoint"
    match = (
        re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', state.read_text(), re.M)
        if state.exists()
        else None
    )
    return int(match.group(1)) if match else 0


def run(command):
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"run_mlm.py failed:\n{result.stderr[-3000:]}")
    return result.stdout


def run_killed_then_resumed(command, output_dir, kill_after_step):
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while latest_checkpoint_step(output_dir) < kill_after_step:
        if process.poll() is not None:
            sys.exit(
                f"the run ended before a checkpoint at step {kill_after_step}; lower "
                "--kill_after_step."
            )
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = latest_checkpoint_step(output_dir)
    stdout = run(command)
    resumed = re.search(r"at step (\d+) of", stdout)
    return killed_at, int(resumed.group(1)) if resumed else None


def read_log(output_dir):
    with open(output_dir / "training_log.csv") as file:
        return list(csv.DictReader(file))


def final_weights(output_dir):
    from transformers import TFAutoModelForMaskedLM

    # tf_model.h5: transformers 4.57's TF loader fails on the PyTorch copy
    # (model.safetensors) beside it.
    model = TFAutoModelForMaskedLM.from_pretrained(str(output_dir))
    return [weight.numpy() for weight in model.weights]


def main():
    args = parse_args()
    print(f"Machine: {describe_machine()}")
    print("Command: python run_mlm.py " + " ".join(args.run_mlm_args))
    base = Path(args.output_dir)
    straight, interrupted = base / "uninterrupted", base / "interrupted"
    command = [sys.executable, str(REPO / "run_mlm.py"), *args.run_mlm_args]
    run(command + ["--output_dir", str(straight)])
    killed_at, resumed_at = run_killed_then_resumed(
        command + ["--output_dir", str(interrupted)], interrupted, args.kill_after_step
    )
    print(
        f"Killed with the newest checkpoint at step {killed_at}; the rerun resumed at step "
        f"{resumed_at}."
    )

    print(
        "\n| epoch | loss (left alone) | loss (killed, resumed) | val loss (left alone) | val "
        "loss (killed, resumed) |"
    )
    print("|---:|---:|---:|---:|---:|")
    for row, other in zip(read_log(straight), read_log(interrupted)):
        print(
            f"| {int(row['epoch']) + 1} | {float(row['loss']):.5f} | {float(other['loss']):.5f} | "
            f"{float(row.get('val_loss', 'nan')):.5f} | {float(other.get('val_loss', 'nan')):.5f} |"
        )
    largest = max(
        abs(a - b).max() for a, b in zip(final_weights(straight), final_weights(interrupted))
    )
    print(f"\nLargest difference between the final weights: {largest:.3g}")


if __name__ == "__main__":
    main()
