"""Training speed: tokens per second and MFU of run_mlm.py's training step, per model size and
variant.

    python benchmarks/training_speed.py             # tiny and small, every variant (~10 min)
    python benchmarks/training_speed.py --configs tiny --rounds 3 --steps 10

Variants (each built with run_mlm.py's own functions, trained with fit() as run_mlm.py does):
    reference     transformers' own train step: logits at every position, the model's loss (no
                  metrics)
    full          run_mlm.py --mlm_head full: logits at every position, gathered at the masked ones
    sparse        run_mlm.py's default: the LM head runs at the masked positions only
    sparse+bf16   ... and --bfloat16 (mixed precision; logits cast to float32 before the loss)
    sparse+xla    ... and --jit_compile
The batches are random token ids, masked by run_mlm.mask_tokens once and kept in memory, so the
input pipeline is not measured here (benchmarks/input_pipeline.py does that).

Rounds run every variant in turn and each figure is the median over rounds, so a slow spell of the
machine hits all variants alike. MFU = the FLOPs each variant's matmuls need per second (forward x 3
for training: the backward pass costs twice the forward) over the fp32 matmul ceiling measured at
the start of the run.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# run_mlm.py lives at the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import describe_machine, matmul_ceiling  # noqa: E402

import run_mlm  # noqa: E402

CONFIGS = {
    "tiny": {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 512,
        "vocab_size": 8000,
    },
    "small": {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
        "vocab_size": 32000,
    },
}
VARIANTS = ("reference", "full", "sparse", "sparse+bf16", "sparse+xla")
SPECIAL_IDS = (0, 1, 2, 3, 4)  # [CLS] [SEP] <unk> <pad> [MASK], numbered as train_unigram.py does
PAD_ID, MASK_ID = 3, 4


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--mlm_probability", type=float, default=0.15)
    parser.add_argument(
        "--steps", type=int, default=20, help="Training steps timed per round and variant."
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="Rounds over all variants; medians are reported."
    )
    return parser.parse_args()


def training_flops_per_sequence(config, length, predicted_positions):
    """Matmul FLOPs of one training step per sequence: 3 x forward (multiply-add = 2 FLOPs)."""
    hidden, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    per_layer = (
        2 * length * (4 * hidden * hidden + 2 * hidden * inner) + 2 * 2 * length * length * hidden
    )
    head = 2 * predicted_positions * (hidden * hidden + hidden * vocab)
    return 3 * (config["num_hidden_layers"] * per_layer + head)


def masked_batches(batch_size, max_length, mlm_probability, vocab_size, count=8):
    """`count` distinct masked batches of random ordinary tokens, [SEP]-separated like packed
    documents."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    ids = rng.integers(len(SPECIAL_IDS), vocab_size, size=(count, batch_size, max_length))
    ids[rng.random(ids.shape) < 0.02] = 1
    batches = []
    for index, batch in enumerate(ids):
        masked, positions, labels = run_mlm.mask_tokens(
            tf.constant(batch, dtype=tf.int32),
            tf.constant([index, 0], dtype=tf.int64),
            mlm_probability,
            tf.constant(MASK_ID),
            tf.constant(SPECIAL_IDS, dtype=tf.int32),
            tf.range(len(SPECIAL_IDS), vocab_size, dtype=tf.int32),
        )
        batches.append((masked, positions, labels))
    return batches


def dense_labels(masked, positions, labels):
    """[batch, length] labels for transformers' own loss: the sparse labels scattered, -100
    elsewhere."""
    import numpy as np

    dense = np.full(masked.shape, -100, dtype=np.int32)
    rows, slots = np.nonzero(labels.numpy() != -100)
    dense[rows, positions.numpy()[rows, slots]] = labels.numpy()[rows, slots]
    return dense


def build_variant(variant, config_values, batches, max_length):
    """A compiled model and an endless in-memory dataset in the format that model trains on."""
    import tensorflow as tf
    import tf_keras
    from transformers import RobertaConfig, TFAutoModelForMaskedLM, create_optimizer

    config = RobertaConfig(
        **config_values,
        pad_token_id=PAD_ID,
        bos_token_id=0,
        eos_token_id=1,
        max_position_embeddings=max_length + PAD_ID + 1,
    )
    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16" if "bf16" in variant else "float32")
    try:
        if variant == "reference":
            model = TFAutoModelForMaskedLM.from_config(config)
            model(model.dummy_inputs)
            optimizer, _ = create_optimizer(init_lr=1e-4, num_train_steps=10**6, num_warmup_steps=0)
            # no loss: the model's own, as the pipeline used to train
            model.compile(optimizer=optimizer)
            elements = [
                ({"input_ids": ids, "labels": dense_labels(ids, positions, labels)},)
                for ids, positions, labels in batches
            ]
        else:
            flags = run_mlm.parse_args(
                [
                    "--train_dataset",
                    "unused",
                    "--tokenizer",
                    "unused",
                    "--output_dir",
                    "unused",
                    "--mlm_head",
                    "full" if variant == "full" else "sparse",
                    "--learning_rate",
                    "1e-4",
                    "--warmup_ratio",
                    "0",
                    *(["--jit_compile"] if "xla" in variant else []),
                    *(["--bfloat16"] if "bf16" in variant else []),
                ]
            )  # (run_mlm.py's own flags; its defaults for the rest)
            _, model = run_mlm.build_model(
                config,
                tf.distribute.get_strategy(),
                MASK_ID,
                10**6,
                **run_mlm.flag_values(flags, run_mlm.MODEL_FLAGS),
            )
            elements = [
                ({"input_ids": ids, "masked_positions": positions}, labels)
                for ids, positions, labels in batches
            ]
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")
    # one leading axis of batches
    stacked = tf.nest.map_structure(lambda *tensors: tf.stack(tensors), *elements)
    return model, tf.data.Dataset.from_tensor_slices(stacked).cache().repeat().prefetch(2)


def seconds_per_step(model, dataset, steps):
    start = time.perf_counter()
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
    return (time.perf_counter() - start) / steps


def benchmark_config(name, args):
    """(variant, median seconds per step, FLOPs per step) for every variant of one config."""
    config_values = CONFIGS[name]
    batches = masked_batches(
        args.batch_size, args.max_length, args.mlm_probability, config_values["vocab_size"]
    )
    models = {
        variant: build_variant(variant, config_values, batches, args.max_length)
        for variant in args.variants
    }
    for model, dataset in models.values():  # trace, build the optimizer, warm the caches
        seconds_per_step(model, dataset, 3)
    times = {variant: [] for variant in models}
    for _ in range(args.rounds):
        for variant, (model, dataset) in models.items():
            times[variant].append(seconds_per_step(model, dataset, args.steps))

    predictions = run_mlm.max_predictions(args.max_length, args.mlm_probability)
    results = []
    for variant, samples in times.items():
        head_positions = predictions if variant.startswith("sparse") else args.max_length
        flops = args.batch_size * training_flops_per_sequence(
            config_values, args.max_length, head_positions
        )
        results.append((variant, statistics.median(samples), flops))
    return results


def main():
    args = parse_args()
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    print(f"Machine: {describe_machine()}")
    fp32_ceiling = matmul_ceiling("float32")
    bf16_ceiling = matmul_ceiling("bfloat16")
    print(
        f"Matmul ceiling (TensorFlow, square matmuls): {fp32_ceiling / 1e9:.0f} GFLOP/s float32, "
        f"{bf16_ceiling / 1e9:.0f} GFLOP/s bfloat16"
    )
    print(
        f"Batch {args.batch_size} x {args.max_length} tokens; median of {args.rounds} rounds of "
        f"{args.steps} steps\n"
    )
    print(
        "| config | variant | ms/step | tokens/s | vs full | GFLOP/step | GFLOP/s | MFU (fp32 "
        "ceiling) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    results = {name: benchmark_config(name, args) for name in args.configs}
    # Measured again at the end, and the higher figure kept: a busy spell at
    # the start must not lower it.
    fp32_ceiling = max(fp32_ceiling, matmul_ceiling("float32"))
    tokens = args.batch_size * args.max_length
    for name, rows in results.items():
        baseline = dict((variant, step) for variant, step, _ in rows).get("full")
        for variant, step, flops in rows:
            speedup = f"{baseline / step:.2f}x" if baseline else "-"
            print(
                f"| {name} | {variant} | {step * 1000:.0f} | {tokens / step:,.0f} | {speedup} | "
                f"{flops / 1e9:.1f} | {flops / step / 1e9:.0f} | "
                f"{100 * flops / step / fp32_ceiling:.0f}% |"
            )
    print(
        f"\nMFU uses a float32 ceiling of {fp32_ceiling / 1e9:.0f} GFLOP/s, the higher of two "
        "measurements."
    )


if __name__ == "__main__":
    main()
