"""Training speed: tokens per second and MFU of run_mlm.py's training step per variant, and its
input pipeline's sequences per second against them.

    python benchmarks/training_speed.py --train_dataset wt2/shards/train --tokenizer wt2/tokenizer \
        --rounds 3 --steps 10
    SMALL=hidden_size=256,num_hidden_layers=4,num_attention_heads=4,intermediate_size=1024
    python benchmarks/training_speed.py --train_dataset wt2/shards/train --tokenizer wt2/tokenizer \
        --config_overrides $SMALL

Every variant is run_mlm.py itself, `main(parse_args([...]), callbacks=[clock])` on the shards, for
--warmup_steps + --steps optimizer steps, with the variant's flags added:

    full          --mlm_head full: logits at every position, gathered at the masked ones
    sparse        run_mlm.py's default: the LM head runs at the masked positions only
    sparse+bf16   --bfloat16 (mixed precision; logits cast to float32 before the loss)
    sparse+xla    --jit_compile
    modernbert    the sparse step of a ModernBERT (mlm_pipeline/modernbert.py) of the same hidden
                  size, layers and heads, its GeGLU MLP 2/3 as wide as --config_overrides'
                  intermediate_size: the same parameters and matmul FLOPs a layer

The clock, a Keras callback, times each step from its start to its end; a round's figure is the
median of the steps after the warm-up (which trace and compile). Rounds run every variant in turn, a
fresh run each, and each figure is the median over rounds, so a slow spell of a shared machine hits
all variants alike. MFU = the FLOPs a variant's matmuls need per second (forward x 3 for training:
the backward pass costs twice the forward; the shape from the config.json the run saved) over the
float32 matmul ceiling measured at the start. The input pipeline is
mlm_pipeline/masked_lm_data.py's build_dataset training stream on the same shards, read alone (file
order, interleaved reads, block shuffle, batch, parse, mask, prefetch), set against the sequences
per second of the fastest variant: far above 1, training never waits for data.
"""

import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from machine import describe_machine, markdown_table, step_clock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run_mlm.py's folder
import run_mlm  # noqa: E402
from mlm_pipeline import contract, shard_checks, tf_startup  # noqa: E402
from mlm_pipeline.errors import OneLineErrorParser, exit_on_usage_error  # noqa: E402

TINY = "hidden_size=128,num_hidden_layers=2,num_attention_heads=2,intermediate_size=512"
VARIANTS = {
    "full": ["--mlm_head", "full"],
    "sparse": [],
    "sparse+bf16": ["--bfloat16"],
    "sparse+xla": ["--jit_compile"],
    "modernbert": [],  # its config: modernbert_flags()
}
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def modernbert_flags(config_overrides, folder):
    """run_mlm.py's flags for the modernbert variant: a ModernBERT config.json of its own, and the
    shape of `config_overrides` with the GeGLU MLP 2/3 as wide (its input projection is two
    matrices of that width), the other keys left out (RoBERTa's dropout names are not
    ModernBERT's)."""
    path = Path(folder, "modernbert.json")
    path.write_text(json.dumps({"model_type": "modernbert"}))
    shape = dict(item.split("=", 1) for item in config_overrides.split(","))
    shape = {key: value for key, value in shape.items() if key in SHAPE_KEYS}
    if "intermediate_size" in shape:
        shape["intermediate_size"] = str(round(2 * int(shape["intermediate_size"]) / 3))
    overrides = ",".join(f"{key}={value}" for key, value in shape.items())
    return ["--pretrained_model_config", str(path), "--config_overrides", overrides]


def parse_args(argv=None):
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_dataset", required=True, help="A train split of shards.")
    parser.add_argument("--tokenizer", required=True, help="The tokenizer of those shards.")
    parser.add_argument(
        "--config_overrides",
        default=TINY,
        help="run_mlm.py's --config_overrides: the model's shape (default: the tiny model).",
    )
    parser.add_argument(
        "--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), help="Run these."
    )
    parser.add_argument("--batch_size", type=int, default=32, help="Sequences a step (32).")
    parser.add_argument("--steps", type=int, default=10, help="Steps timed a round (10).")
    parser.add_argument(
        "--warmup_steps", type=int, default=3, help="Steps before the timed ones, untimed (3)."
    )
    parser.add_argument("--rounds", type=int, default=3, help="Rounds over the variants (3).")
    parser.add_argument(
        "--pipeline_batches", type=int, default=300, help="Batches the pipeline reads a round."
    )
    parser.add_argument(
        "--ceiling_sizes",
        type=int,
        nargs="+",
        default=[1024, 2048, 4096],
        help="Square matmuls timed for the FLOP/s ceiling (default: 1024 2048 4096).",
    )
    return parser.parse_args(argv)


def matmul_ceiling(sizes, repeats=5):
    """The best float32 FLOP/s TensorFlow reaches on a square matmul here (the fastest of
    `repeats` calls, not the median): the denominator of MFU."""
    import timeit

    import tensorflow as tf

    best = 0.0
    for size in sizes:
        a, b = tf.random.normal([size, size]), tf.random.normal([size, size])
        multiply = tf.function(lambda: tf.reduce_sum(tf.matmul(a, b)[:1, :1]))
        multiply()  # traced and warm
        seconds = min(timeit.repeat(lambda: multiply().numpy(), number=1, repeat=repeats))
        best = max(best, 2 * size**3 / seconds)
    return best


def run_variant(args, variant, output_dir):
    """One run of run_mlm.py with the variant's flags: the median seconds of its timed steps, the
    config it saved and its flags."""
    import tf_keras

    argv = ["--no_tpu", "--train_dataset", args.train_dataset, "--tokenizer", args.tokenizer]
    argv += ["--output_dir", output_dir, "--config_overrides", args.config_overrides]
    argv += ["--per_replica_batch_size", str(args.batch_size), "--learning_rate", "1e-4"]
    argv += ["--max_steps", str(args.warmup_steps + args.steps), "--save_steps", "0"]
    argv += ["--no_pytorch_export", *VARIANTS[variant]]
    if variant == "modernbert":
        argv += modernbert_flags(args.config_overrides, Path(output_dir).parent)
    flags, clock = run_mlm.parse_args(argv), step_clock()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
            run_mlm.main(flags, callbacks=[clock])
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")  # --bfloat16 set it for the process
        tf_keras.backend.clear_session()
    config = json.loads(Path(output_dir, "config.json").read_text())
    return statistics.median(clock.seconds[args.warmup_steps :]), config, flags


def training_flops(config, length, predicted_positions):
    """Matmul FLOPs of one training step a sequence: 3 x forward (a multiply-add is 2 FLOPs)."""
    hidden, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    attention = 2 * 2 * length * length * hidden
    mlp_widths = 3 if config["model_type"] == "modernbert" else 2  # GeGLU: two matrices in, one out
    per_layer = 2 * length * (4 * hidden * hidden + mlp_widths * hidden * inner) + attention
    head = 2 * predicted_positions * (hidden * hidden + hidden * vocab)
    return 3 * (config["num_hidden_layers"] * per_layer + head)


def pipeline_stream(args, flags):
    """masked_lm_data.build_dataset's endless training stream on the shards, with run_mlm.py's
    defaults."""
    from mlm_pipeline import masked_lm_data  # TensorFlow: loaded by main() with its log held back

    tokenizer = contract.load_tokenizer(args.tokenizer, "--tokenizer", require_mlm_tokens=True)
    manifest = shard_checks.read_manifest(args.train_dataset, "--train_dataset")
    dataset = masked_lm_data.build_dataset(
        manifest["files"],
        args.batch_size,
        training=True,
        tokenizer=tokenizer,
        max_length=manifest["max_length"],
        masking=flags.masking,
    )
    return iter(dataset), manifest["max_length"]


def sequences_per_second(batches, count, batch_size):
    start = time.perf_counter()
    for _ in range(count):
        _, labels = next(batches)
        labels.numpy()  # the batch really exists on the host
    return count * batch_size / (time.perf_counter() - start)


def main(args):
    print(f"Machine: {describe_machine()}")
    with tf_startup.tensorflow_startup_log_held_back():  # shown only if TensorFlow fails to start
        import tensorflow as tf

        tf.config.list_physical_devices()  # the device probing that logs (cuInit without a GPU)
    import tf_keras

    from mlm_pipeline import masked_lm_data

    ceiling = matmul_ceiling(args.ceiling_sizes)
    print(f"Matmul ceiling (TensorFlow, square float32 matmuls): {ceiling / 1e9:.0f} GFLOP/s")
    seconds, configs, supplied = {variant: [] for variant in args.variants}, {}, []
    with tempfile.TemporaryDirectory(prefix="training-speed-") as scratch:
        for round_ in range(args.rounds):
            for variant in args.variants:
                output_dir = os.path.join(scratch, f"{round_}-{variant}")
                step, configs[variant], flags = run_variant(args, variant, output_dir)
                seconds[variant].append(step)
                print(f"round {round_ + 1}, {variant}: {step * 1000:.0f} ms/step", flush=True)
            if round_ == 0:
                batches, length = pipeline_stream(args, flags)
                sequences_per_second(batches, min(20, args.pipeline_batches), args.batch_size)
            supplied.append(sequences_per_second(batches, args.pipeline_batches, args.batch_size))
    tf_keras.backend.clear_session()

    print(
        f"\nBatch {args.batch_size} x {length} tokens, --config_overrides {args.config_overrides}; "
        f"median of {args.rounds} rounds of {args.steps} steps\n"
    )
    median = {variant: statistics.median(times) for variant, times in seconds.items()}
    predictions = masked_lm_data.max_predictions(length, flags.masking.train_probability)
    rows = []
    for variant, step in median.items():
        head_positions = length if variant == "full" else predictions
        flops = args.batch_size * training_flops(configs[variant], length, head_positions)
        speedup = f"{median['full'] / step:.2f}x" if "full" in median else "—"
        rows.append(
            [
                variant,
                f"{step * 1000:.0f}",
                f"{args.batch_size * length / step:,.0f}",
                speedup,
                f"{flops / 1e9:.2f}",
                f"{flops / step / 1e9:.0f}",
                f"{flops / step / ceiling:.0%}",
            ]
        )
    header = ["variant", "ms/step", "tokens/s", "vs full", "GFLOP/step", "GFLOP/s", "MFU"]
    print(markdown_table(header, rows))
    fastest = args.batch_size / min(median.values())
    supply = statistics.median(supplied)
    print(
        f"\nInput pipeline alone: {supply:,.0f} sequences/s against {fastest:,.0f} for the "
        f"fastest step: **{supply / fastest:.0f}x** (median of {args.rounds} rounds)"
    )


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "training_speed.py")
