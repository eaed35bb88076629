"""Can the model learn to attend by position? A toy where nothing else tells the answer.

    python benchmarks/positional_toy.py --tokenizer tokenizer --model_type roberta --steps 750
    python benchmarks/positional_toy.py --tokenizer tokenizer --model_type roberta-prelayernorm \
        --steps 750

Each sequence counts upwards from a random start through 500 token ids (token i+1 = token i + 1,
wrapping around), so a masked token can only be told from its neighbours, by position. Batches are
masked exactly as run_mlm.py masks them and trained with run_mlm.py's own model, optimizer and
training step (sparse head, linear warmup and decay, no dropout). A model stuck predicting from
context-free statistics stays at chance, 1/500 accuracy at [MASK]; one that has learnt to attend by
position climbs towards 1. The tokenizer (any train_unigram.py output with at least 600 ids) only
supplies the special-token ids and the vocabulary size.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# run_mlm.py lives at the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import describe_machine  # noqa: E402

import run_mlm  # noqa: E402
from mlm_pipeline import contract  # noqa: E402

CYCLE, FIRST_ID, BATCH, LENGTH = 500, 100, 32, 128


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True, help="A train_unigram.py tokenizer folder.")
    parser.add_argument("--model_type", default="roberta", help="roberta or roberta-prelayernorm.")
    parser.add_argument("--steps", type=int, default=750)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--reports", type=int, default=5, help="Lines printed over the run.")
    parser.add_argument(
        "--config_overrides", default="", help="Passed to run_mlm.py, e.g. initializer_range=0.1."
    )
    return parser.parse_args()


def main():
    args = parse_args()
    import numpy as np
    import tensorflow as tf
    import tf_keras

    print(f"Machine: {describe_machine()}")
    tokenizer = contract.load_tokenizer(args.tokenizer, "--tokenizer", require_mlm_tokens=True)
    if len(tokenizer) < FIRST_ID + CYCLE:
        sys.exit(
            f"--tokenizer {args.tokenizer} has {len(tokenizer)} ids; the toy needs "
            f"{FIRST_ID + CYCLE}."
        )
    architecture = {
        "model_type": args.model_type,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 512,
        "hidden_dropout_prob": 0,
        "attention_probs_dropout_prob": 0,
    }
    with tempfile.TemporaryDirectory() as folder:
        config_path = Path(folder) / "config.json"
        config_path.write_text(json.dumps(architecture))
        flags = run_mlm.parse_args(
            [
                "--train_dataset",
                "unused",
                "--tokenizer",
                args.tokenizer,
                "--output_dir",
                "unused",
                "--no_tpu",
                "--pretrained_model_config",
                str(config_path),
                "--learning_rate",
                str(args.learning_rate),
                "--config_overrides",
                args.config_overrides,
            ]
        )
        tf_keras.utils.set_random_seed(0)
        config = run_mlm.build_config(
            tokenizer, LENGTH, **run_mlm.flag_values(flags, run_mlm.CONFIG_FLAGS)
        )
    _, trainer = run_mlm.build_model(
        config,
        tf.distribute.get_strategy(),
        tokenizer.mask_token_id,
        args.steps,
        **run_mlm.flag_values(flags, run_mlm.MODEL_FLAGS),
    )

    special = set(tokenizer.all_special_ids)
    special_ids = tf.constant(sorted(special), dtype=tf.int32)
    replacement_ids = tf.constant(
        [i for i in range(len(tokenizer)) if i not in special], dtype=tf.int32
    )
    starts = np.random.default_rng(0).integers(0, CYCLE, size=(args.steps, BATCH, 1))
    counting = (FIRST_ID + (starts + np.arange(LENGTH)) % CYCLE).astype(np.int32)

    def mask(step):
        masked, positions, labels = run_mlm.mask_tokens(
            tf.gather(counting, step),
            tf.stack([step, tf.constant(7, tf.int64)]),
            0.15,
            tokenizer.mask_token_id,
            special_ids,
            replacement_ids,
        )
        return {"input_ids": masked, "masked_positions": positions}, labels

    dataset = tf.data.Dataset.range(args.steps).map(mask).prefetch(tf.data.AUTOTUNE)
    per_report = args.steps // args.reports
    history = trainer.fit(dataset, epochs=args.reports, steps_per_epoch=per_report, verbose=0)
    print(
        f"{args.model_type} {args.config_overrides}, {args.steps} steps of {BATCH} x {LENGTH}, lr "
        f"{args.learning_rate}; chance = {1 / CYCLE}"
    )
    print("| after step | loss | accuracy at [MASK] |\n|---:|---:|---:|")
    for report, (loss, accuracy) in enumerate(
        zip(history.history["loss"], history.history["mask_token_accuracy"])
    ):
        print(f"| {(report + 1) * per_report} | {loss:.2f} | {accuracy:.3f} |")


if __name__ == "__main__":
    main()
