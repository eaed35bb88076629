#!/usr/bin/env python
"""How long prepare_tfrecord_shards.py takes against the tokenizer floor, and how its peak memory
grows.

    python benchmarks/prepare_shards.py --train_file corpus/train.txt --tokenizer tokenizer \
        --repeats 5

Three measurements, each in a fresh subprocess so that no run warms the next one's caches or memory:

- floor: the same fast tokenizer encoding all of the file's non-blank lines in one batch call,
  `tokenizer(lines)` of transformers; the backend's `encode_batch(lines)` alone is reported beside
  it. Timed from the lines in memory and the tokenizer loaded to the ids returned.
- prepare: prepare_tfrecord_shards.py's main() end to end on the same file (reading, tokenizing,
  packing, serializing, writing the shards and manifest), with an empty datasets cache.
  Library imports are excluded from both timings: each child imports its libraries before its
  clock starts. Floor and prepare alternate, and the ratio is the median of the per-repeat ratios.
- memory: peak resident memory (ru_maxrss of the child) of the command-line run
  `python prepare_tfrecord_shards.py ...` on the file and on the file concatenated --scale times;
  this is the whole process, imports included, so its wall time is reported too.

Prints the machine and markdown tables. Other processes on the machine add noise; the load average
is shown.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREPARE_SCRIPT = os.path.join(REPO, "prepare_tfrecord_shards.py")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train_file", required=True, help="A .txt corpus, one document per line.")
    parser.add_argument(
        "--tokenizer", required=True, help="Tokenizer folder (train_unigram.py's --output_dir)."
    )
    parser.add_argument(
        "--max_length", type=int, default=128, help="Tokens per sequence (default: 128)."
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="Interleaved floor/prepare pairs (default: 5)."
    )
    parser.add_argument(
        "--scale", type=int, default=10, help="Corpus multiple for the memory run (default: 10)."
    )
    parser.add_argument(
        "--memory_repeats", type=int, default=1, help="Command-line runs per size (default: 1)."
    )
    parser.add_argument(
        "--num_proc", type=int, help="Passed to prepare_tfrecord_shards.py if given."
    )
    parser.add_argument(
        "--batch_size", type=int, help="Passed to prepare_tfrecord_shards.py if given."
    )
    parser.add_argument(
        "--prepare_script",
        default=PREPARE_SCRIPT,
        help="The script to measure (default: this repository's).",
    )
    parser.add_argument("--skip_memory", action="store_true", help="Only the timing table.")
    parser.add_argument("--child", choices=["floor", "prepare"], help=argparse.SUPPRESS)
    parser.add_argument("--output_dir", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# --------------------------------------------------------------------------------------------------
# Children: one measurement each, reported as a JSON line on stdout


def non_blank_lines(path):
    """The lines prepare_tfrecord_shards.py tokenizes: split on \\n (universal newlines), blank ones
    skipped."""
    with open(path, encoding="utf-8") as file:
        return [line for line in (raw.rstrip("\n") for raw in file) if line.strip()]


def cpu_seconds():
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)  # all threads of this process
    return usage.ru_utime + usage.ru_stime


def timed(function):
    cpu, start = cpu_seconds(), time.perf_counter()
    result = function()
    return result, time.perf_counter() - start, cpu_seconds() - cpu


def floor_child(args):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    lines = non_blank_lines(args.train_file)
    ids, wall, cpu = timed(lambda: tokenizer(lines)["input_ids"])
    tokens = sum(map(len, ids))
    del ids
    _, backend_wall, backend_cpu = timed(lambda: tokenizer.backend_tokenizer.encode_batch(lines))
    return {
        "wall": wall,
        "cpu": cpu,
        "backend_wall": backend_wall,
        "backend_cpu": backend_cpu,
        "lines": len(lines),
        "tokens": tokens,
    }


def load_script(path):
    import importlib.util

    # the script's own mlm_pipeline package, if any
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec = importlib.util.spec_from_file_location("prepare_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prepare_child(args):
    # Every library either version of the script may use is imported before the clock starts.
    import datasets  # noqa: F401
    import numpy  # noqa: F401
    import tensorflow  # noqa: F401
    import tqdm.auto  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401

    prepare = load_script(args.prepare_script)
    argv = prepare_argv(args, args.train_file, args.output_dir)
    manifest, wall, cpu = timed(lambda: prepare.main(prepare.parse_args(argv)))
    return {
        "wall": wall,
        "cpu": cpu,
        "records": manifest["records"],
        "dropped_tokens": manifest["dropped_tokens"],
    }


def prepare_argv(args, train_file, output_dir):
    argv = [
        "--train_file",
        train_file,
        "--split",
        "train",
        "--tokenizer_name_or_path",
        args.tokenizer,
    ]
    return argv + ["--output_dir", output_dir] + tuning_flags(args)


def tuning_flags(args):
    """The flags of prepare_tfrecord_shards.py that this benchmark sets."""
    flags = ["--max_length", str(args.max_length)]
    for flag in ("num_proc", "batch_size"):
        if getattr(args, flag) is not None:
            flags += [f"--{flag}", str(getattr(args, flag))]
    return flags


# --------------------------------------------------------------------------------------------------
# Parent: run the children, print the tables


def child_env(scratch):
    env = dict(os.environ)
    # nothing cached
    env["HF_DATASETS_CACHE"] = tempfile.mkdtemp(dir=scratch, prefix="datasets-cache-")
    env["HF_HUB_OFFLINE"] = "1"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def run_child(kind, args, scratch):
    output_dir = tempfile.mkdtemp(dir=scratch, prefix="shards-")
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        kind,
        "--output_dir",
        output_dir,
    ]
    command += forwarded_flags(args)
    result = subprocess.run(command, env=child_env(scratch), capture_output=True, text=True)
    shutil.rmtree(output_dir, ignore_errors=True)
    if result.returncode != 0:
        sys.exit(f"the {kind} run failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def forwarded_flags(args):
    flags = [
        "--train_file",
        args.train_file,
        "--tokenizer",
        args.tokenizer,
        "--prepare_script",
        args.prepare_script,
    ]
    return flags + tuning_flags(args)


def command_line_run(args, train_file, scratch):
    """Wall seconds and peak resident MiB of one `python prepare_tfrecord_shards.py ...` process."""
    output_dir = tempfile.mkdtemp(dir=scratch, prefix="shards-")
    command = [sys.executable, args.prepare_script, *prepare_argv(args, train_file, output_dir)]
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        env=child_env(scratch),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    shutil.rmtree(output_dir, ignore_errors=True)
    if process.returncode != 0:
        sys.exit(f"the command-line run failed:\n{stderr[-3000:]}")
    return wall, usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


def concatenated(path, times, scratch):
    target = os.path.join(scratch, f"corpus-x{times}.txt")
    with open(target, "wb") as out:
        for _ in range(times):
            with open(path, "rb") as source:
                shutil.copyfileobj(source, out)
    return target


def machine():
    model = "unknown"
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as file:
            model = next(
                (line.split(":", 1)[1].strip() for line in file if line.startswith("model name")),
                model,
            )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{os.cpu_count()} CPUs ({cores} usable), {model}; Python {platform.python_version()}"


def load_average():
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def median(values):
    return statistics.median(values)


def print_table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("|---" + "|---:" * (len(header) - 1) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def timing(args, scratch):
    """Interleaved floor and prepare runs; prints their table."""
    floors, prepares = [], []
    for repeat in range(args.repeats):
        # neither always goes first
        order = ("floor", "prepare") if repeat % 2 == 0 else ("prepare", "floor")
        results = {kind: run_child(kind, args, scratch) for kind in order}
        floors.append(results["floor"])
        prepares.append(results["prepare"])
        floor, prepare = results["floor"]["wall"], results["prepare"]["wall"]
        print(
            f"repeat {repeat + 1}: floor {floor:.2f} s, prepare {prepare:.2f} s, ratio "
            f"{prepare / floor:.2f}"
        )
    tokens, shards = floors[0]["tokens"], prepares[0]
    agree = (
        "the same as"
        if tokens == shards["records"] * args.max_length + shards["dropped_tokens"]
        else "NOT"
    )
    print(
        f"\n{floors[0]['lines']} non-blank lines, {tokens} tokens: {agree} the shards' "
        f"{shards['records']} records x {args.max_length} + {shards['dropped_tokens']} dropped. "
        "Library imports excluded from both.\n"
    )
    wall_ratio = median([p["wall"] / f["wall"] for f, p in zip(floors, prepares)])
    cpu_ratio = median([p["cpu"] / f["cpu"] for f, p in zip(floors, prepares)])

    def row(name, runs, key, ratio=""):
        walls, cpus = [run[f"{key}wall"] for run in runs], [run[f"{key}cpu"] for run in runs]
        spread = f"{min(walls):.2f}–{max(walls):.2f}"
        return [name, f"{median(walls):.2f}", spread, f"{median(cpus):.2f}", ratio]

    print_table(
        [
            "measurement",
            "median wall s",
            "min–max wall s",
            "median CPU s",
            "vs floor: wall (CPU), median of pairs",
        ],
        [
            row("floor: `tokenizer(lines)`, one batch call", floors, ""),
            row("backend `encode_batch(lines)` alone", floors, "backend_"),
            row(
                "prepare_tfrecord_shards.py main()",
                prepares,
                "",
                f"**{wall_ratio:.2f}×** ({cpu_ratio:.2f}×)",
            ),
        ],
    )


def memory(args, scratch):
    """Command-line runs on the corpus and on --scale copies of it; prints their table."""
    sizes = {1: args.train_file, args.scale: concatenated(args.train_file, args.scale, scratch)}
    runs = {
        times: [command_line_run(args, path, scratch) for _ in range(args.memory_repeats)]
        for times, path in sizes.items()
    }
    peak = {times: max(rss for _, rss in runs[times]) for times in sizes}
    rows = [
        [
            f"{times}×",
            f"{median([wall for wall, _ in runs[times]]):.2f}",
            f"{peak[times]:.0f}",
            f"{peak[times] / peak[1]:.2f}×",
        ]
        for times in sizes
    ]
    print_table(
        ["corpus", "command-line wall s (imports included)", "peak RSS MiB", "peak RSS vs 1×"], rows
    )


def main(args):
    if args.child:
        print(json.dumps(floor_child(args) if args.child == "floor" else prepare_child(args)))
        return
    # each repeat's line shows up as it ends, also through a pipe
    sys.stdout.reconfigure(line_buffering=True)
    args.train_file, args.tokenizer = (
        os.path.abspath(args.train_file),
        os.path.abspath(args.tokenizer),
    )
    script = os.path.abspath(args.prepare_script)
    args.prepare_script = script
    print(f"machine: {machine()}")
    print(
        f"script: {os.path.relpath(script, REPO) if script.startswith(REPO + os.sep) else script}"
    )
    print(f"corpus: {os.path.basename(args.train_file)}; flags: {' '.join(tuning_flags(args))}")
    print(f"load average at start: {load_average()}\n")
    with tempfile.TemporaryDirectory(prefix="prepare-benchmark-") as scratch:
        timing(args, scratch)
        if not args.skip_memory:
            print(f"\nload average before the memory runs: {load_average()}\n")
            memory(args, scratch)
    print(f"\nload average at the end: {load_average()}")


if __name__ == "__main__":
    main(parse_args())
