"""ModernBERT at long sequences: a tiny ModernBERT's training step (forward, backward, an SGD
update) at each length, the same tokens a step (batch x length constant), seconds and peak memory,
in TF (mlm_pipeline/modernbert.py) and in transformers 5's PyTorch ModernBERT (sdpa attention, CPU);
then the attention's two paths timed against each other, which set the lengths where
modernbert.py switches from the dense path to the memory-linear one.

    python benchmarks/modernbert_long.py --lengths 512 1024 2048 4096 8192 --tokens 8192

Each length runs in a fresh child process per side, so each peak (the kernel's count of the child's
resident memory, which sees TensorFlow's allocations that tracemalloc does not) is that step's and
the imports' alone; "above imports" subtracts the peak reached before the model was made. The count
is the child's own high-water mark (VmHWM), not ru_maxrss: a child's ru_maxrss starts at its
parent's peak, and this script's parent has imported TensorFlow, which takes more than torch's.
"TF tensors at their peak" is TensorFlow's allocator's own count, from get_memory_info: the most its
tensors held at once (weights, the activations kept for the backward pass, gradients), without the
runtime around them. PyTorch keeps no such count on the CPU.
The PyTorch side runs in .venv-transformers5 (transformers 5 has no TF models), built from the same
config: hidden 128, 2 heads of 64, 3 layers (global, local, local), window 128, GeGLU 256 wide, a
1,024-token vocabulary, the loss at every position. Times are the median of --steps steps after one
that traces. "local layer" times one local layer's step (attention and MLP, forward and backward)
alone, the median of --local_steps: its milliseconds per 1,000 tokens should stay flat with the
length.

The switch table times one layer's attention alone (forward and backward) on each path at each
length, the same tokens each: where the memory-linear path becomes as fast as the dense one.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # mlm_pipeline, in the parent and in both children
CONFIG = {
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_hidden_layers": 3,
    "global_attn_every_n_layers": 3,
    "local_attention": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "cls_token_id": 1,
    "sep_token_id": 2,
}


def config_fields(length, layers):
    """The config both sides build their model from: CONFIG with `layers` layers, `length`
    positions."""
    return {**CONFIG, "num_hidden_layers": layers, "max_position_embeddings": length}


def peak_mib():
    """This process's own peak resident memory so far, in MiB: the preflight's count, which leaves
    out the parent's peak that ru_maxrss would include."""
    from mlm_pipeline.hardware import peak_resident_bytes

    return peak_resident_bytes() / 2**20


def random_ids(batch, length):
    import numpy as np

    return np.random.default_rng(0).integers(3, CONFIG["vocab_size"], [batch, length])


def median_seconds(step, steps):
    """Run `step` once to trace it, then `steps` times; the median seconds."""
    step()
    seconds = []
    for _ in range(steps):
        began = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def tf_child(length, batch, steps, local_steps, layers):
    """{seconds, peak, imports, tensors} of the TF masked LM's training step, and the local
    layer's seconds."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import tf_keras
    from transformers import ModernBertConfig

    from mlm_pipeline import modernbert

    imports = peak_mib()
    config = ModernBertConfig(**config_fields(length, layers))
    model = modernbert.TFModernBertForMaskedLM(config)
    optimizer = tf_keras.optimizers.SGD(1e-3)
    ids = tf.constant(random_ids(batch, length), tf.int32)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(input_ids=ids, labels=ids, training=True).loss)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_weights), model.weights))

    seconds = median_seconds(lambda: train_step(), steps)
    peak = peak_mib()
    # TensorFlow's allocator's own peak: the tensors alone, without the runtime around them
    tensors = tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**20

    layer = modernbert.TFModernBertEncoderLayer(config, 1, modernbert.SLIDING_ATTENTION)
    rotary = modernbert.rotary_tables(config.local_rope_theta, 64, length)
    hidden = tf.random.normal([batch, length, config.hidden_size])
    mask = tf.ones([batch, length], tf.int32)
    layer(hidden, rotary, mask)

    @tf.function
    def local_step():
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            loss = tf.reduce_sum(layer(hidden, rotary, mask, training=True) ** 2)
        return tape.gradient(loss, [hidden, *layer.trainable_weights])

    local = median_seconds(lambda: local_step(), local_steps)
    return dict(seconds=seconds, peak=peak, imports=imports, tensors=tensors, local=local)


def torch_child(length, batch, steps, local_steps, layers):
    """{seconds, peak, imports} of transformers 5's ModernBertForMaskedLM's training step."""
    import torch
    from transformers import AutoModelForMaskedLM, ModernBertConfig

    imports = peak_mib()
    config = ModernBertConfig(**config_fields(length, layers))
    model = AutoModelForMaskedLM.from_config(config, attn_implementation="sdpa")
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = torch.tensor(random_ids(batch, length))
    mask = torch.ones_like(ids)

    def train_step():
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    seconds = median_seconds(train_step, steps)
    return {"seconds": seconds, "peak": peak_mib(), "imports": imports}


def switch_child(lengths, tokens, steps):
    """{length: {path: seconds}} of one layer's attention (forward and backward), each path."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from mlm_pipeline import modernbert

    half_window, heads = CONFIG["local_attention"] // 2, CONFIG["num_attention_heads"]
    found = {}
    for length in lengths:
        batch = max(tokens // length, 1)
        query, key, value = (tf.random.normal([batch, heads, length, 64]) for _ in range(3))
        mask = tf.ones([batch, length], tf.int32)

        def unchanged(probabilities):
            return probabilities

        paths = {
            "global dense": lambda q, k, v: modernbert.attend(
                q, k, v, modernbert.dense_bias(mask, length, None), unchanged
            ),
            "global chunks": lambda q, k, v: modernbert.global_attention_in_chunks(
                q, k, v, mask, 0.0, [0, 0], modernbert.GLOBAL_QUERY_CHUNK
            ),
            "local dense": lambda q, k, v: modernbert.attend(
                q, k, v, modernbert.dense_bias(mask, length, half_window), unchanged
            ),
            "local blocks": lambda q, k, v: modernbert.local_attention_in_blocks(
                q, k, v, mask, half_window, unchanged
            ),
        }
        found[length] = {}
        for name, path in paths.items():

            @tf.function
            def step(path=path):
                with tf.GradientTape() as tape:
                    tape.watch([query, key, value])
                    loss = tf.reduce_sum(path(query, key, value) ** 2)
                return tape.gradient(loss, [query, key, value])

            found[length][name] = median_seconds(lambda: step(), steps)
    return found


def run_child(python, *args):
    """A child process of this script; the JSON it prints."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    command = [str(python), str(Path(__file__).resolve()), *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--tokens", type=int, default=8192, help="Tokens a step: batch x length.")
    parser.add_argument(
        "--layers",
        type=int,
        default=CONFIG["num_hidden_layers"],
        help="The model's layers, every third global from the first (1: one global layer).",
    )
    parser.add_argument("--steps", type=int, default=3, help="Timed steps after the first.")
    parser.add_argument(
        "--local_steps",
        type=int,
        default=10,
        help="Timed steps of the local layer alone (short ones: more steps steady the median).",
    )
    parser.add_argument(
        "--switch_lengths",
        type=int,
        nargs="*",
        default=[128, 256, 512, 1024, 2048, 4096],
        help="Lengths of the switch table (one layer's attention on each path); none: no table.",
    )
    parser.add_argument(
        "--transformers5_python",
        default=str(REPO / ".venv-transformers5" / "bin" / "python"),
        help="The python of a virtualenv with transformers 5 and torch.",
    )
    parser.add_argument("--child", choices=["tf", "torch", "switch"], help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def check_args(args):
    from mlm_pipeline.errors import UsageError

    if args.layers < 1:
        raise UsageError(f"--layers {args.layers}: a model has at least one layer; pass 1 or more.")
    for length in args.lengths:
        if length <= 0 or args.tokens % length:
            raise UsageError(
                f"--tokens {args.tokens} is not a whole number of sequences of --lengths {length}; "
                "pass lengths that divide it."
            )
    if not os.path.exists(args.transformers5_python):
        raise UsageError(
            f"--transformers5_python {args.transformers5_python} does not exist; pass the python "
            "of a virtualenv with transformers 5 and torch (run_tests.sh makes one)."
        )


def main(args):
    check_args(args)  # before TensorFlow's import, whose start-up log would come before the line
    from machine import describe_machine, markdown_table

    from mlm_pipeline import modernbert

    print(describe_machine())
    print(
        f"Switch: the layers attend densely up to {modernbert.DENSE_ATTENTION_UP_TO} tokens; past "
        f"that a global chunk is {modernbert.GLOBAL_QUERY_CHUNK} queries.\n"
    )
    results = {}
    for length in args.lengths:
        flags = ["--length", length, "--tokens", args.tokens, "--steps", args.steps]
        flags += ["--local_steps", args.local_steps, "--layers", args.layers]
        results[length] = (
            run_child(sys.executable, "--child", "tf", *flags),
            run_child(args.transformers5_python, "--child", "torch", *flags),
        )
    rows = []
    for length, (tf_side, torch_side) in results.items():
        tf_step, torch_step = (side["peak"] - side["imports"] for side in (tf_side, torch_side))
        rows.append(
            [
                f"{length:,}",
                args.tokens // length,
                f"{tf_side['seconds']:.2f}",
                f"{torch_side['seconds']:.2f}",
                f"{tf_side['peak']:,.0f}",
                f"{tf_step:,.0f}",
                f"{tf_side['tensors']:,.0f}",
                f"{torch_side['peak']:,.0f}",
                f"{torch_step:,.0f}",
                f"{tf_side['peak'] / torch_side['peak']:.2f}x",
                f"{tf_step / torch_step:.2f}x" if torch_step > 0 else "–",
                f"{1000 * tf_side['local'] / args.tokens * 1000:.2f}",
            ]
        )
    header = [
        "length",
        "batch",
        "TF s a step",
        "transformers 5 s a step",
        "TF peak MiB",
        "above imports",
        "TF tensors at their peak",
        "transformers 5 peak MiB",
        "above imports",
        "TF / 5 peak",
        "TF / 5 above imports",
        "TF local layer ms a 1,000 tokens",
    ]
    print(markdown_table(header, rows))
    first, last = results[args.lengths[0]], results[args.lengths[-1]]
    print(
        f"\nPeak at {args.lengths[-1]:,} / at {args.lengths[0]:,}: "
        f"TF **{last[0]['peak'] / first[0]['peak']:.2f}x**, "
        f"transformers 5 {last[1]['peak'] / first[1]['peak']:.2f}x"
    )
    flat_from = args.lengths[1] if len(args.lengths) > 2 else args.lengths[0]
    local = results[args.lengths[-1]][0]["local"] / results[flat_from][0]["local"]
    print(
        f"TF local layer's time a token at {args.lengths[-1]:,} / at {flat_from:,}: "
        f"**{local:.2f}x**\n"
    )
    if not args.switch_lengths:
        return
    switch = run_child(
        sys.executable,
        "--child",
        "switch",
        "--lengths",
        *args.switch_lengths,
        "--tokens",
        args.tokens,
        "--steps",
        args.steps,
    )
    paths = ["global dense", "global chunks", "local dense", "local blocks"]
    rows = [
        [f"{int(length):,}", *(f"{1000 * seconds[path]:.1f}" for path in paths)]
        + [f"{seconds['global chunks'] / seconds['global dense']:.2f}x"]
        + [f"{seconds['local blocks'] / seconds['local dense']:.2f}x"]
        for length, seconds in switch.items()
    ]
    header = ["length", *(f"{path} ms" for path in paths), "chunks / dense", "blocks / dense"]
    print("One layer's attention, forward and backward, the same tokens at each length:")
    print(markdown_table(header, rows))


def child_main(args):
    if args.child == "switch":
        found = switch_child(args.lengths, args.tokens, args.steps)
    else:
        batch = args.tokens // args.length
        child = tf_child if args.child == "tf" else torch_child
        found = child(args.length, batch, args.steps, args.local_steps, args.layers)
    print(json.dumps(found))


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.child:
        child_main(arguments)
    else:
        from mlm_pipeline.errors import exit_on_usage_error

        exit_on_usage_error(main, arguments, "modernbert_long.py")
