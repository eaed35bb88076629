#!/usr/bin/env python
"""Step 2's speed and memory: prepare_tfrecord_shards.py against the tokenizer floor, its record
encoder against tf.train.Example, and whole command-line runs, Apache Beam's included.

    python benchmarks/prepare_shards.py --train_file wt2/train.txt --tokenizer wt2/tokenizer \
        --repeats 5 --scales 1 4 20

Three parts:

1. Floor: in this process, alternating, --repeats times: the same fast tokenizer encoding all of
   the file's non-blank lines in one batch call (`tokenizer(lines)` of transformers), and
   prepare_tfrecord_shards.py's main() on the file (read, tokenize in threads, pack, serialize,
   write the shards and manifest). Libraries are imported and the file read once, untimed, first;
   the ratio is the median of the per-repeat ratios.
2. Records: the sequences main() just wrote, serialized again by the package's encoder
   (mlm_pipeline.packing.serialize_examples: numpy, no TensorFlow, so Beam's workers run it too)
   and by `tf.train.Example` row by row, the textbook way; the two must give the same bytes.
3. Runs: `python prepare_tfrecord_shards.py ...` as a user runs it, each in a process of its own
   with an empty Hugging Face cache, for every --ways on the file repeated --scales times (cut into
   --parts files read through a glob; the hub ways read a local folder laid out as a Hub dataset,
   one JSON Lines file per copy). psutil samples the process tree every --sample_every seconds for
   the peak resident memory of the launcher and of each Beam worker. Each output is compared byte
   for byte with that of the first way of its kind on the same corpus. With two scales or more:
   each way's steady rate, the slope between the two largest corpora, which cancels the fixed
   start-up cost (imports, workers started); and how its peak memory grows with the corpus.

The Beam ways need Apache Beam (`pip install -r requirements-beam.txt`). "beam 1 worker, pinned"
runs its whole process tree on one core, so 2 workers against it is the scaling from one core to
two. Rounds (--rounds) run the ways of one corpus in rotating order; times are from each way's
fastest round, the least disturbed one, and memory the largest of the rounds.
"""

import contextlib
import filecmp
import importlib.util
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

import psutil
from machine import (
    check_paths_exist,
    describe_machine,
    load_average,
    markdown_table,
    shard_sequences,
)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # prepare_tfrecord_shards.py and mlm_pipeline/
from mlm_pipeline.errors import OneLineErrorParser, exit_on_usage_error  # noqa: E402

BEAM = ["--runner", "DirectRunner", "--direct_running_mode", "multi_processing"]
PINNED = "beam 1 worker, pinned"
WAYS = {  # name: (what it reads, its flags)
    "single": ("text", []),
    "beam 2 workers": ("text", [*BEAM, "--direct_num_workers", "2"]),
    PINNED: ("text", [*BEAM, "--direct_num_workers", "1"]),
    "hub, streaming": ("hub", ["--streaming"]),
    "hub, cached": ("hub", []),
}
BEAM_WORKER = "apache_beam.runners.worker.sdk_worker_main"


def parse_args(argv=None):
    parser = OneLineErrorParser(description=__doc__.splitlines()[1])
    parser.add_argument("--train_file", required=True, help="A text corpus, one document a line.")
    parser.add_argument(
        "--tokenizer", required=True, help="Tokenizer folder (train_unigram.py's --output_dir)."
    )
    parser.add_argument(
        "--max_length", type=int, default=128, help="Tokens a sequence (default: 128)."
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="Floor and prepare pairs timed (default: 5)."
    )
    parser.add_argument(
        "--ways",
        nargs="*",
        default=list(WAYS),
        choices=list(WAYS),
        help="Command-line runs on each corpus (default: all); none: parts 1 and 2 alone.",
    )
    parser.add_argument(
        "--scales",
        type=int,
        nargs="+",
        default=[1, 4, 20],
        help="Copies of --train_file in each corpus of the runs (default: 1 4 20).",
    )
    parser.add_argument(
        "--parts", type=int, default=2, help="Files each text corpus is cut into (default: 2)."
    )
    parser.add_argument(
        "--rows_per_block",
        type=int,
        help="Passed to every run (default: --train_file's rows / --parts, so that each part of "
        "an Nx corpus is N blocks of the same size, for Beam's workers to share evenly).",
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="Runs of each way on each corpus (default: 2)."
    )
    parser.add_argument(
        "--pinned_core", type=int, default=0, help="The core of the pinned way (default: 0)."
    )
    parser.add_argument(
        "--sample_every",
        type=float,
        default=0.1,
        help="Seconds between samples of a run's memory (default: 0.1).",
    )
    return parser.parse_args(argv)


def timed(function):
    """The wall and CPU seconds (every thread of this process) that function() takes."""
    wall, cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - wall, time.process_time() - cpu


# --------------------------------------------------------------------------------------------------
# 1 and 2: in this process


def floor_against_prepare(args, scratch):
    """Part 1; returns the split folder that prepare wrote, for part 2."""
    from transformers import AutoTokenizer

    import prepare_tfrecord_shards as prepare

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    with open(args.train_file, encoding="utf-8") as file:
        lines = [line.rstrip("\n") for line in file if line.strip()]

    def floor():
        return tokenizer(lines)["input_ids"]

    def prepare_once():
        output_dir = tempfile.mkdtemp(dir=scratch)
        argv = ["--train_file", args.train_file, "--tokenizer_name_or_path", args.tokenizer]
        argv += ["--max_length", str(args.max_length), "--output_dir", output_dir]
        with contextlib.redirect_stdout(io.StringIO()):  # its summary line
            return prepare.main(prepare.parse_args(argv)), output_dir

    manifest, output_dir = prepare_once()  # untimed: TensorFlow imported, the file read once
    tokens = sum(map(len, floor()))
    times = {"floor": [], "prepare": []}
    for repeat in range(args.repeats):
        order = ("floor", "prepare") if repeat % 2 == 0 else ("prepare", "floor")  # neither first
        for name in order:
            times[name].append(timed(floor if name == "floor" else prepare_once))
    written = manifest["records"] * args.max_length + manifest["dropped_tokens"]
    print(
        f"{len(lines):,} non-blank lines, {tokens:,} tokens: "
        f"{'the same as' if written == tokens else 'NOT the same as'} the shards' "
        f"{manifest['records']:,} records x {args.max_length} + {manifest['dropped_tokens']:,} "
        "dropped. Imports excluded.\n"
    )
    median, rows = statistics.median, []
    labels = {"floor": "floor: `tokenizer(lines)`", "prepare": "prepare_tfrecord_shards.py main()"}
    for name, label in labels.items():
        walls, cpus = zip(*times[name])
        spread = f"{min(walls):.2f}–{max(walls):.2f}"
        rows.append([label, f"{median(walls):.2f}", spread, f"{median(cpus):.2f}"])
    print(markdown_table(["measurement", "median wall s", "min–max wall s", "median CPU s"], rows))
    pairs = list(zip(times["prepare"], times["floor"]))
    wall_ratio = median(mine[0] / floor[0] for mine, floor in pairs)
    cpu_ratio = median(mine[1] / floor[1] for mine, floor in pairs)
    print(
        f"\nprepare / floor: **{wall_ratio:.2f}x** in wall time, {cpu_ratio:.2f}x in CPU time "
        f"(median of {args.repeats} pairs)"
    )
    return os.path.join(output_dir, "train")


def record_encoders(args, split_dir):
    """Part 2: the package's encoder and tf.train.Example on the same sequences, alternating."""
    import tensorflow as tf

    from mlm_pipeline import contract, packing

    sequences, _ = shard_sequences(split_dir, "--train_file")

    def textbook(sequences):
        records = []
        for row in sequences:
            ids = tf.train.Feature(int64_list=tf.train.Int64List(value=row.tolist()))
            features = tf.train.Features(feature={contract.FEATURE_NAME: ids})
            records.append(tf.train.Example(features=features).SerializeToString())
        return records

    encoders = {"numpy (packing.serialize_examples)": packing.serialize_examples}
    encoders["tf.train.Example per row"] = textbook
    if len({tuple(encode(sequences)) for encode in encoders.values()}) != 1:
        sys.exit("the encoders give different bytes for the same sequences")
    seconds = {name: [] for name in encoders}
    for repeat in range(args.repeats):
        for name in list(encoders)[repeat % 2 :] + list(encoders)[: repeat % 2]:
            seconds[name].append(timeit.timeit(lambda: encoders[name](sequences), number=1))
    base = seconds["numpy (packing.serialize_examples)"]
    rows = []
    for name, times in seconds.items():
        ratio = statistics.median(mine / theirs for mine, theirs in zip(times, base))
        per_record = statistics.median(times) / len(sequences) * 1e6
        rows.append([name, f"{per_record:.2f}", f"{ratio:.2f}x"])
    print(f"\nThe {len(sequences):,} records serialized again, the same bytes both ways:\n")
    print(markdown_table(["encoder", "µs per record", "vs numpy (median of repeats)"], rows))


# --------------------------------------------------------------------------------------------------
# 3: command-line runs


def write_text_corpus(train_file, times, parts, folder):
    """`times` copies of train_file, one after the other, cut at line boundaries into `parts` files
    of about as many lines each; returns the glob over them."""
    os.makedirs(folder)
    text = Path(train_file).read_bytes()
    text += b"" if text.endswith(b"\n") else b"\n"  # so that copies do not run into each other
    lines = text.splitlines(keepends=True) * times
    for part in range(parts):
        first, last = len(lines) * part // parts, len(lines) * (part + 1) // parts
        Path(folder, f"part-{part:02d}.txt").write_bytes(b"".join(lines[first:last]))
    return os.path.join(folder, "part-*.txt")


def write_hub_folder(train_file, times, folder):
    """A folder that datasets reads as a Hub dataset repository: data/train-0000K-of-0000N.jsonl,
    each one copy of train_file as {"text": line} rows."""
    os.makedirs(os.path.join(folder, "data"))
    with open(train_file, encoding="utf-8") as file:
        rows = "".join(json.dumps({"text": line.rstrip("\n")}) + "\n" for line in file)
    for part in range(times):
        Path(folder, "data", f"train-{part:05d}-of-{times:05d}.jsonl").write_text(rows)
    return folder


def folder_bytes(folder):
    return sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())


def same_files(first, second):
    """Whether two folders hold the same files, byte for byte."""

    def names(folder):
        return sorted(
            str(path.relative_to(folder)) for path in Path(folder).rglob("*") if path.is_file()
        )

    if names(first) != names(second):
        return False
    _, different, errors = filecmp.cmpfiles(first, second, names(first), shallow=False)
    return not different and not errors


def sample(process, peaks):
    """Record the resident memory of `process` and of every process under it in `peaks`, {pid:
    [role, peak bytes]}."""
    try:
        members = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for member in members:
        try:
            with member.oneshot():
                rss, argv = member.memory_info().rss, member.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        worker = BEAM_WORKER in argv and "python" in os.path.basename(argv[0])  # not its /bin/sh
        role = "launcher" if member is process else "beam worker" if worker else "other"
        if peaks.get(member.pid, [role])[0] != role:  # forked, not yet exec'd: the launcher's RSS
            del peaks[member.pid]
        peak = peaks.setdefault(member.pid, [role, 0])
        peak[1] = max(peak[1], rss)


def measured_run(command, env, every, core=None):
    """Run `command` to its end (on `core` alone, if given). Returns its wall seconds, the CPU
    seconds of its whole tree (the kernel's count for waited-for children), and the peak RSS in MiB
    of its launcher and of each Beam worker, as psutil sampled them."""
    pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start, peaks = time.perf_counter(), {}
    with tempfile.TemporaryFile() as log:
        process = psutil.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin
        )
        while process.poll() is None:
            sample(process, peaks)
            time.sleep(every)
        wall = time.perf_counter() - start
        if process.returncode:
            log.seek(0)
            sys.exit(f"this run failed:\n{' '.join(command)}\n{log.read().decode()[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    launcher = max((peak for role, peak in peaks.values() if role == "launcher"), default=0)
    workers = sorted(peak / 2**20 for role, peak in peaks.values() if role == "beam worker")
    return {"wall": wall, "cpu": cpu, "launcher": launcher / 2**20, "workers": workers}


def run_command(args, way, inputs, rows_per_block, output_dir, scratch):
    """One measured run of prepare_tfrecord_shards.py, with a Hugging Face cache of its own: what
    that cache holds after the run is added as "cache", in bytes."""
    kind, flags = WAYS[way]
    command = [sys.executable, str(REPO / "prepare_tfrecord_shards.py"), *inputs[kind]]
    command += ["--split", "train", "--tokenizer_name_or_path", args.tokenizer]
    command += ["--max_length", str(args.max_length), "--rows_per_block", str(rows_per_block)]
    command += ["--output_dir", output_dir, *flags]
    hf_home = tempfile.mkdtemp(dir=scratch)
    env = dict(os.environ, HF_HOME=hf_home, HF_DATASETS_CACHE=os.path.join(hf_home, "datasets"))
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    core = args.pinned_core if way == PINNED else None
    run = measured_run(command, env, args.sample_every, core)
    run["cache"] = folder_bytes(hf_home)
    shutil.rmtree(hf_home)
    return run


def reference_way(way, ways):
    """The way whose output `way`'s must equal: the first of its kind."""
    return next(other for other in ways if WAYS[other][0] == WAYS[way][0])


def command_line_runs(args, scratch):
    """Part 3: every way on every corpus, --rounds times. Returns {(scale, way): [run, ...]} and
    {(scale, kind): input bytes}."""
    rows_per_block = args.rows_per_block
    if rows_per_block is None:
        rows = len(Path(args.train_file).read_bytes().splitlines())
        rows_per_block = max(1, rows // args.parts)
    print(f"\nCommand-line runs, each with --rows_per_block {rows_per_block}:")
    runs, sizes = {}, {}
    for scale in args.scales:
        inputs = {}
        for kind in {WAYS[way][0] for way in args.ways}:
            folder = os.path.join(scratch, f"{kind}-x{scale}")
            if kind == "text":
                pattern = write_text_corpus(args.train_file, scale, args.parts, folder)
                inputs[kind] = ["--train_file", pattern]
            else:
                write_hub_folder(args.train_file, scale, folder)
                inputs[kind] = ["--dataset_name", folder, "--dataset_config", "default"]
            sizes[(scale, kind)] = folder_bytes(folder)
        for round_ in range(args.rounds):
            shift, outputs = round_ % len(args.ways), {}
            for way in args.ways[shift:] + args.ways[:shift]:  # no way always goes first
                outputs[way] = os.path.join(scratch, f"out-{len(outputs)}")
                run = run_command(args, way, inputs, rows_per_block, outputs[way], scratch)
                runs.setdefault((scale, way), []).append(run)
                print(f"  {scale}x, round {round_ + 1}, {way}: {run['wall']:.1f} s", flush=True)
            for way in args.ways:
                reference = outputs[reference_way(way, args.ways)]
                runs[(scale, way)][-1]["same"] = same_files(reference, outputs[way])
            for folder in outputs.values():
                shutil.rmtree(folder)
        for kind in inputs:
            shutil.rmtree(os.path.join(scratch, f"{kind}-x{scale}"))
    return runs, sizes


def run_tables(args, runs, sizes):
    """The runs' table, then, from two scales on, the steady rates and the growth of memory."""
    rows = []
    for scale in args.scales:
        for way in args.ways:
            group = runs[(scale, way)]
            run = min(group, key=lambda run: run["wall"])  # the least disturbed round
            size = sizes[(scale, WAYS[way][0])] / 1e6
            reference = reference_way(way, args.ways)
            same = "—" if way == reference else "yes" if all(r["same"] for r in group) else "**NO**"
            workers = max((r["workers"] for r in group), key=lambda peaks: max(peaks, default=0))
            rows.append(
                [
                    f"{scale}x ({size:.1f} MB)",
                    way,
                    f"{run['wall']:.1f}",
                    f"{size / run['wall']:.2f}",
                    f"{run['cpu']:.1f}",
                    f"{max(r['launcher'] for r in group):,.0f}",
                    ", ".join(f"{peak:,.0f}" for peak in workers) or "—",
                    f"{max(r['cache'] for r in group) / 1e6:.1f}",
                    f"{same} ({reference})" if same != "—" else same,
                ]
            )
    header = ["corpus", "way", "wall s", "MB/s", "CPU s", "launcher peak RSS MiB"]
    header += ["workers' peak RSS MiB", "HF cache after, MB", "same bytes as"]
    print()
    print(markdown_table(header, rows, text_columns=2))
    if len(args.scales) < 2:
        return
    first, small, large = args.scales[0], *args.scales[-2:]
    rows, steady = [], {}
    for way in args.ways:
        kind = WAYS[way][0]
        wall = {scale: min(run["wall"] for run in runs[(scale, way)]) for scale in (small, large)}
        extra = (sizes[(large, kind)] - sizes[(small, kind)]) / 1e6
        steady[way] = extra / (wall[large] - wall[small]) if wall[large] > wall[small] else None
        cores = 1 if way == PINNED else len(psutil.Process().cpu_affinity())

        def peak(scale):  # the workers' peak for Beam (they do the work), else the process's
            return max(max(run["workers"], default=run["launcher"]) for run in runs[(scale, way)])

        rate = steady[way]
        if rate:  # the intercept at size 0 is the fixed cost
            fixed = wall[large] - sizes[(large, kind)] / 1e6 / rate
            figures = [f"{rate:.2f}", f"**{rate / cores:.2f}**", f"{fixed:.1f}"]
        else:  # the larger corpus was not slower: too small to tell
            figures = ["—"] * 3
        rows.append([way, cores, *figures, f"{peak(large) / peak(first):.2f}x"])
    header = ["way", "cores", "steady MB/s", "steady MB/s per core", "fixed cost s"]
    header.append(f"peak RSS {large}x / {first}x (Beam: its largest worker)")
    print(f"\nSteady rates, the slope from {small}x to {large}x:\n")
    print(markdown_table(header, rows))
    if steady.get("beam 2 workers") and steady.get(PINNED):
        scaling = steady["beam 2 workers"] / steady[PINNED]
        print(f"\nScaling, steady rate of 2 workers / 1 pinned worker: **{scaling:.2f}x**")


def main(args):
    check_paths_exist(args, "train_file", "tokenizer")
    args.train_file, args.tokenizer = map(os.path.abspath, (args.train_file, args.tokenizer))
    args.scales, args.ways = sorted(set(args.scales)), list(dict.fromkeys(args.ways))
    os.environ["TQDM_DISABLE"] = "1"  # no progress bars from prepare, in this process or its runs
    print(f"Machine: {describe_machine()}")
    size = os.path.getsize(args.train_file) / 1e6
    print(f"Corpus: {args.train_file} ({size:.1f} MB); --max_length {args.max_length}\n")
    if importlib.util.find_spec("apache_beam") is None:
        beam = [way for way in args.ways if "--runner" in WAYS[way][1]]
        if beam:
            print(
                f"Apache Beam is not installed, so {beam} are left out: to measure them, "
                "pip install -r requirements-beam.txt\n"
            )
        args.ways = [way for way in args.ways if way not in beam]
    with tempfile.TemporaryDirectory(prefix="prepare-benchmark-") as scratch:
        split_dir = floor_against_prepare(args, scratch)
        record_encoders(args, split_dir)
        if args.ways:
            run_tables(args, *command_line_runs(args, scratch))
    print(f"\nLoad average at the end: {load_average()}")


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "prepare_shards.py")
