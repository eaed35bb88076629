"""Where a training step's time goes: TensorFlow's profiler over a few steps, summed by kind of op.

    python benchmarks/profile_step.py --config small --variants full sparse sparse+xla --steps 5
    python benchmarks/profile_step.py --config tiny --variants sparse

Each variant is built exactly as benchmarks/training_speed.py builds it (run_mlm.py's own functions,
random masked batches kept in memory), warmed up, then profiled with `tf.profiler.experimental` for
`--steps` steps of `fit()`. The profile (an XSpace protobuf, the file TensorBoard's profile tab
reads) is summed here by op type, each op's own time only (time in ops it calls is theirs), and
printed per step next to the wall time of the step. The matmul rows are set against the matmul FLOPs
the step needs, which tells whether the matmuls themselves are slow or the time goes elsewhere
(memory-bound ops, the optimizer, gathers, copies). The raw profile stays in --profile_dir for
TensorBoard (`pip install xprof`, then `tensorboard --logdir`).
"""

import argparse
import collections
import os
import re
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# run_mlm.py lives at the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import describe_machine, matmul_ceiling  # noqa: E402
from training_speed import (
    CONFIGS,
    VARIANTS,
    build_variant,
    masked_batches,
    training_flops_per_sequence,
)  # noqa: E402

import run_mlm  # noqa: E402

# A TensorFlow op appears in the host trace as "<op name>:<op type>"; under XLA each compiled
# HLO op runs as a thunk named "<HLO name>.<number>" ("MatMul.188", "loop_add_fusion.3"),
# which is grouped by that name.
TF_OP = re.compile(r"^[^:\s]+:(?P<type>[A-Za-z_][A-Za-z0-9_]*)$")
XLA_OP = re.compile(r"^(?P<type>[A-Za-z_][A-Za-z0-9_\-]*)\.\d+$|^(?P<fusion>[a-z_]+_fusion)$")
MATMUL_PREFIXES = (
    "MatMul",
    "_FusedMatMul",
    "BatchMatMul",
    "_MklMatMul",
    "_MklFusedMatMul",
    "_MklBatchMatMul",
    "dot",
)


def op_type(name):
    """The op type of a trace event, or None for the runtime's own events (executors, Python,
    waits)."""
    match = TF_OP.match(name) or XLA_OP.match(name)
    if match is None:
        return None
    groups = match.groupdict()
    return groups.get("type") or groups.get("fusion")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="small", choices=list(CONFIGS))
    parser.add_argument("--variants", nargs="+", default=["full", "sparse"], choices=list(VARIANTS))
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--mlm_probability", type=float, default=0.15)
    parser.add_argument("--steps", type=int, default=5, help="Steps profiled per variant.")
    parser.add_argument("--top", type=int, default=15, help="Op types listed per variant.")
    parser.add_argument(
        "--profile_dir", help="Keep the raw profiles here (default: a temporary folder)."
    )
    return parser.parse_args()


def self_times(xspace_path):
    """{op type: seconds of its own time} over every host thread of one profile."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(xspace_path).read_bytes())
    totals = collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        names = {key: metadata.name for key, metadata in plane.event_metadata.items()}
        for line in plane.lines:
            # Events of one thread nest like a call stack: an op's own time is its
            # span minus its children's.
            stack = []  # [end, op type or None, time of its children so far, its duration]
            for event in sorted(
                line.events, key=lambda event: (event.offset_ps, -event.duration_ps)
            ):
                start, end = event.offset_ps, event.offset_ps + event.duration_ps
                while stack and stack[-1][0] <= start:
                    finished = stack.pop()
                    if finished[1]:
                        totals[finished[1]] += finished[3] - finished[2]
                if stack:
                    stack[-1][2] += event.duration_ps
                stack.append([end, op_type(names.get(event.metadata_id, "")), 0, event.duration_ps])
            for finished in stack:
                if finished[1]:
                    totals[finished[1]] += finished[3] - finished[2]
    return {kind: picoseconds / 1e12 for kind, picoseconds in totals.items()}


def profile_variant(model, dataset, steps, folder):
    import tensorflow as tf

    # trace and warm up outside the profile
    model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0)
    tf.profiler.experimental.start(str(folder))
    start = time.perf_counter()
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
    seconds = time.perf_counter() - start
    tf.profiler.experimental.stop()
    (xspace,) = Path(folder).rglob("*.xplane.pb")
    return seconds / steps, {kind: total / steps for kind, total in self_times(xspace).items()}


def main():
    args = parse_args()
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    print(f"Machine: {describe_machine()}")
    ceiling = matmul_ceiling("float32")
    print(f"Matmul ceiling (TensorFlow, square matmuls): {ceiling / 1e9:.0f} GFLOP/s float32")
    config_values = CONFIGS[args.config]
    batches = masked_batches(
        args.batch_size, args.max_length, args.mlm_probability, config_values["vocab_size"]
    )
    predictions = run_mlm.max_predictions(args.max_length, args.mlm_probability)
    root = Path(args.profile_dir or tempfile.mkdtemp(prefix="profile_step_"))
    for variant in args.variants:
        model, dataset = build_variant(variant, config_values, batches, args.max_length)
        step, ops = profile_variant(model, dataset, args.steps, root / variant.replace("+", "_"))
        head_positions = predictions if variant.startswith("sparse") else args.max_length
        flops = args.batch_size * training_flops_per_sequence(
            config_values, args.max_length, head_positions
        )
        matmul = sum(
            seconds for kind, seconds in ops.items() if kind.startswith(MATMUL_PREFIXES)
        ) or float("nan")
        in_ops = sum(ops.values())
        print(
            f"\n## {args.config}, {variant}: {step * 1000:.0f} ms/step (profiled), "
            f"{flops / 1e9:.1f} GFLOP/step"
        )
        print(
            f"Time in TensorFlow ops {in_ops * 1000:.0f} ms/step ({in_ops / step:.0%} of the step; "
            f"over 100% means ops ran side by side); matmuls {matmul * 1000:.0f} ms = "
            f"{flops / matmul / 1e9:.0f} GFLOP/s while they run ({flops / matmul / ceiling:.0%} of "
            f"the ceiling); outside matmuls {(in_ops - matmul) * 1000:.0f} ms."
        )
        print("\n| op type | ms/step | share of op time |\n|---|---:|---:|")
        for kind, seconds in sorted(ops.items(), key=lambda item: -item[1])[: args.top]:
            print(f"| {kind} | {seconds * 1000:.1f} | {seconds / in_ops:.1%} |")
    print(f"\nRaw profiles: {root}")


if __name__ == "__main__":
    main()
