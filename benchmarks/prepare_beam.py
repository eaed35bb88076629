#!/usr/bin/env python
"""prepare_tfrecord_shards.py as an Apache Beam pipeline (--runner DirectRunner) against the single
process.

    python benchmarks/prepare_beam.py --train_file <wikitext-2>/wiki.train.tokens \
        --tokenizer <tokenizer>

(<tokenizer>: train_unigram.py --train_file <wikitext-2>/wiki.train.tokens --vocab_size 8000
--output_dir ...) Every run is `python prepare_tfrecord_shards.py ...` in a subprocess of its own,
with an empty datasets cache, on corpora made in a temporary folder from --train_file:

- Corpora: the file concatenated 1x and --scales times (default 4x and 20x), each cut at line
  boundaries into --parts files (default 2) read through a glob ('corpus-x20/part-*.txt'). Every run
  passes the same --rows_per_block; its default here is the file's rows / --parts (WikiText-2 train:
  36,718 / 2 = 18,359), so that each part of an Nx corpus is exactly N blocks of equal size. The
  script's default of 100,000 rows would make one block of each file, too few to share between
  workers; and the DirectRunner deals the blocks to its workers in turn, once, so with unequal
  blocks (20,000 rows: 4x gives each worker 4 blocks, but one 80,000 rows and the other 67,000) the
  busier worker sets the wall time.
- Three ways on each corpus: "single" (no --runner, the default --num_proc: one tokenizing thread
  per core), "beam 2 workers" (--runner DirectRunner --direct_num_workers 2 --direct_running_mode
  multi_processing) and "beam 1 worker, pinned" (the same with --direct_num_workers 1, the whole
  process tree under `taskset -c --pinned_core`: one core). Each run's wall time, CPU time (its own
  and its children's), and the peak resident memory (VmHWM) of every process in its tree, read from
  /proc every --sample_every seconds while it runs: the launcher and each Beam worker
  (`apache_beam.runners.worker.sdk_worker_main`), with each one's CPU time and when the first worker
  appeared. Every Beam output folder is compared, file by file and byte by byte, with the single
  run's on the same corpus.
- Throughput: MB of input text (10^6 bytes) per second, raw (the whole command, imports and start-up
  included) and steady: the slope between the two largest corpora, (size2 - size1) / (wall2 -
  wall1), which cancels the fixed start-up cost (imports of TensorFlow and Beam, the tokenizer
  loaded, the workers started); the intercept is that fixed cost. Per core: the pinned worker's
  steady rate, and the 2 workers' steady rate / 2; their ratio is the scaling from one worker to
  two.
- The machine's ceiling for that ratio: the tokenizer alone (packing.encode_texts on the file's
  lines, no Beam, imports excluded), one process pinned to one core, then two at once pinned to the
  two cores.
- Streaming: the single process reading a stand-in for a Hub dataset: a local folder of
  data/train-0000K-of-0000N.jsonl files, one copy of --train_file each as {"text": line} rows,
  passed as --dataset_name (--dataset_config default), 1x and --streaming_scale times (default 10x),
  with and without --streaming, each with HF_HOME and HF_DATASETS_CACHE in an empty folder and
  HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set: peak RSS and what HF_HOME holds after the run.
- --profile: the index pass's rate (beam_pipeline.index_file) and cProfile of one worker's work on
  one block (beam_pipeline.PackBlock, as a worker calls it), in a process of its own.

The machine is shared, so before each run the benchmark waits (at most --quiet_wait seconds) for it
to be quiet, and reports for each run the cores that other processes used meanwhile ("other jobs").
Rounds (--rounds, default 2) repeat the runs of one corpus back to back in rotating order, and each
way's figures are from its fastest round, the one least disturbed (as machine.fastest_time); peak
RSS is the largest of the rounds. The libraries are imported once, untimed, before the first run, so
that no run pays for reading them from disk. Prints the machine first, then markdown tables (the
default invocation takes about 15 minutes on 2 idle cores).
"""

import argparse
import filecmp
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from machine import describe_machine

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREPARE_SCRIPT = os.path.join(REPO, "prepare_tfrecord_shards.py")
BEAM_WORKER = "apache_beam.runners.worker.sdk_worker_main"
WAYS = ("single", "beam 2 workers", "beam 1 worker, pinned")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--train_file",
        required=True,
        help="A text corpus, one document per line (WikiText-2 train).",
    )
    parser.add_argument(
        "--tokenizer", required=True, help="Tokenizer folder (train_unigram.py's --output_dir)."
    )
    parser.add_argument(
        "--scales",
        type=int,
        nargs="+",
        default=[4, 20],
        help="Corpus multiples timed (default: 4 20); 1x is "
        "always run too, for memory. The two largest give the steady rate.",
    )
    parser.add_argument(
        "--parts", type=int, default=2, help="Files each corpus is cut into (default: 2)."
    )
    parser.add_argument(
        "--rows_per_block",
        type=int,
        help="Passed to every run (default: --train_file's rows / --parts: blocks of equal size).",
    )
    parser.add_argument(
        "--max_length", type=int, default=128, help="Passed to every run (default: 128)."
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="Runs of each way on each corpus (default: 2)."
    )
    parser.add_argument(
        "--pinned_core", type=int, default=0, help="The core of the pinned run (default: 0)."
    )
    parser.add_argument(
        "--sample_every", type=float, default=0.2, help="Seconds between /proc samples (0.2)."
    )
    parser.add_argument(
        "--quiet_wait",
        type=float,
        default=20,
        help="Before each run, wait up to this many seconds for the "
        "machine to be quiet (other jobs under 0.15 of a core for a second; default: 20).",
    )
    parser.add_argument(
        "--streaming_scale", type=int, default=10, help="The larger streamed corpus (default: 10)."
    )
    parser.add_argument(
        "--skip_streaming", action="store_true", help="Leave out the streaming runs."
    )
    parser.add_argument(
        "--skip_beam", action="store_true", help="Leave out the Beam and single runs."
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="Also time the index pass and profile one worker's block (cProfile).",
    )
    parser.add_argument(
        "--prepare_script",
        default=PREPARE_SCRIPT,
        help="The script to measure (this repository's).",
    )
    parser.add_argument(
        "--keep", help="Keep the corpora and outputs in this folder (default: a temporary one)."
    )
    parser.add_argument(
        "--ceiling_passes",
        type=int,
        default=2,
        help="Passes over --train_file of each process in the machine's "
        "two-core ceiling (default: 2); 0 leaves it out.",
    )
    parser.add_argument(
        "--profile_child", nargs=2, metavar=("CORPUS", "OUTPUT_DIR"), help=argparse.SUPPRESS
    )
    parser.add_argument("--ceiling_child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# --------------------------------------------------------------------------------------------------
# Corpora


def write_corpus(train_file, times, parts, folder):
    """`times` copies of train_file, one after the other, cut at line boundaries into `parts` files
    of about the same number of lines: folder/part-00-of-02.txt, ... Returns the glob over them and
    the bytes."""
    os.makedirs(folder, exist_ok=True)
    with open(train_file, "rb") as file:
        lines = file.read().splitlines(keepends=True)
    if lines and not lines[-1].endswith((b"\n", b"\r")):
        lines[-1] += b"\n"  # so that copies do not run into each other
    total = len(lines) * times
    for part in range(parts):
        first, last = total * part // parts, total * (part + 1) // parts
        with open(os.path.join(folder, f"part-{part:02d}-of-{parts:02d}.txt"), "wb") as out:
            index = first
            while index < last:  # whole copies at once where possible
                offset = index % len(lines)
                take = min(len(lines) - offset, last - index)
                out.writelines(lines[offset : offset + take])
                index += take
    return os.path.join(folder, "part-*.txt"), len(b"".join(lines)) * times


def write_hub_folder(train_file, times, folder):
    """A folder that datasets resolves like a Hub dataset repository:
    data/train-0000K-of-0000N.jsonl, each one copy of train_file as {"text": line} rows (lines split
    as prepare_tfrecord_shards.py splits them)."""
    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    with open(train_file, encoding="utf-8", newline=None) as file:
        rows = "".join(json.dumps({"text": line.rstrip("\n")}) + "\n" for line in file)
    for part in range(times):
        with open(
            os.path.join(folder, "data", f"train-{part:05d}-of-{times:05d}.jsonl"),
            "w",
            encoding="utf-8",
        ) as out:
            out.write(rows)
    return folder


# --------------------------------------------------------------------------------------------------
# One measured run: a command in a subprocess, its process tree sampled from /proc


def read_proc(pid, name):
    try:
        with open(f"/proc/{pid}/{name}", "rb") as file:
            return file.read()
    except OSError:  # gone, or not ours to read
        return None


def stat_fields(pid):
    """/proc/<pid>/stat from its third field (state) on: after the command name, which may hold
    spaces."""
    stat = read_proc(pid, "stat")
    return stat[stat.rfind(b")") + 2 :].split() if stat else None


def process_tree(root):
    """The pids of `root` and all its descendants, from each process's parent in
    /proc/<pid>/stat."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat_fields(entry)
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    tree, queue = [], [root]
    while queue:
        pid = queue.pop()
        tree.append(pid)
        queue.extend(children.get(pid, ()))
    return tree


def vm_hwm_kib(pid):
    """The process's peak resident set size so far (VmHWM), in KiB, or None if it is gone."""
    status = read_proc(pid, "status")
    for line in (status or b"").splitlines():
        if line.startswith(b"VmHWM:"):
            return int(line.split()[1])
    return None


def role(pid, root):
    if pid == root:
        return "launcher"
    argv = (read_proc(pid, "cmdline") or b"").decode(errors="replace").split("\0")
    # not the `/bin/sh -c` that starts one
    if BEAM_WORKER in argv and "python" in os.path.basename(argv[0]):
        return "beam worker"
    return os.path.basename(argv[0]) or f"pid {pid}"


def cpu_seconds(pid):
    """The process's user + system CPU time so far, in seconds."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def busy_seconds():
    """CPU seconds the whole machine has spent busy since it booted, all cores together (from
    /proc/stat: everything but idle and iowait; steal counts as busy, since the host ran something
    else)."""
    with open("/proc/stat") as file:
        ticks = [int(value) for value in file.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(limit, threshold=0.15):
    """Wait, at most `limit` seconds, until the machine has been busy for less than `threshold` of a
    core over one second: other jobs share it, and a run that starts beside one of them measures
    both. Returns the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit:
        busy = busy_seconds()
        time.sleep(1.0)
        if busy_seconds() - busy < threshold:
            break
    return time.perf_counter() - start


def measured_run(command, env, sample_every, quiet_wait=0):
    """Run `command` (after waiting up to `quiet_wait` seconds for the machine to be quiet); returns
    its wall seconds, CPU seconds (its own and its waited-for children's), the cores other processes
    used meanwhile on average, when its first Beam worker appeared, and {pid: (role, peak RSS MiB,
    CPU seconds)} for every process of its tree seen while it ran (CPU seconds as last sampled, so a
    little short of the total for a process that worked until it ended)."""
    waited = wait_for_quiet(quiet_wait)
    with tempfile.TemporaryFile() as log:
        start, busy = time.perf_counter(), busy_seconds()
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        peaks, roles, cpus, first_worker = {}, {}, {}, None
        while True:
            for pid in process_tree(process.pid):
                kib = vm_hwm_kib(pid)
                if kib is None:
                    continue
                if roles.get(pid) not in ("launcher", "beam worker"):
                    now = role(pid, process.pid)
                    # forked but not yet exec'd, it showed the launcher's memory
                    if now != roles.get(pid):
                        roles[pid], peaks[pid] = now, 0
                    if now == "beam worker" and first_worker is None:
                        first_worker = time.perf_counter() - start
                peaks[pid] = max(peaks[pid], kib)
                cpus[pid] = cpu_seconds(pid)
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(sample_every)
        wall = time.perf_counter() - start
        cpu = usage.ru_utime + usage.ru_stime
        others = max(0.0, busy_seconds() - busy - cpu) / wall
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            log.seek(0)
            output = log.read().decode(errors="replace")[-3000:]
            sys.exit(f"this run failed:\n{' '.join(command)}\n{output}")
    processes = {pid: (roles[pid], peaks[pid] / 1024, cpus[pid]) for pid in peaks}
    return {
        "wall": wall,
        "cpu": cpu,
        "others": others,
        "waited": waited,
        "first_worker": first_worker,
        "processes": processes,
    }


def fresh_env(scratch, **extra):
    env = dict(os.environ)
    hf_home = tempfile.mkdtemp(dir=scratch, prefix="hf-home-")
    env.update(
        HF_HOME=hf_home, HF_DATASETS_CACHE=os.path.join(hf_home, "datasets"), HF_HUB_OFFLINE="1"
    )
    env.update(HF_DATASETS_OFFLINE="1", TF_CPP_MIN_LOG_LEVEL="2", TQDM_DISABLE="1", **extra)
    return env, hf_home


def prepare_command(args, source, output_dir, way=None):
    command = [sys.executable, args.prepare_script, *source, "--split", "train"]
    command += ["--tokenizer_name_or_path", args.tokenizer, "--output_dir", output_dir]
    command += ["--max_length", str(args.max_length), "--rows_per_block", str(args.rows_per_block)]
    if way is not None and way != "single":
        workers = "1" if way == "beam 1 worker, pinned" else "2"
        command += ["--runner", "DirectRunner", "--direct_num_workers", workers]
        command += ["--direct_running_mode", "multi_processing"]
    if way == "beam 1 worker, pinned":
        command = ["taskset", "-c", str(args.pinned_core), *command]
    return command


def same_files(first, second):
    """Whether two folders hold the same files (relative paths) with the same bytes."""

    def listing(folder):
        return sorted(
            os.path.relpath(os.path.join(root, name), folder)
            for root, _, names in os.walk(folder)
            for name in names
        )

    files = listing(first)
    if files != listing(second):
        return False
    return all(
        filecmp.cmp(os.path.join(first, name), os.path.join(second, name), shallow=False)
        for name in files
    )


def folder_bytes(folder):
    """Bytes and file count of everything under `folder`."""
    sizes = [
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(folder)
        for name in names
    ]
    return sum(sizes), len(sizes)


# --------------------------------------------------------------------------------------------------
# The sections


def load_average():
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def print_table(header, rows, text_columns=1):
    """A markdown table; the first `text_columns` columns left-aligned, the others right-aligned."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * text_columns + "---:|" * (len(header) - text_columns))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def mib(value):
    return f"{value:,.0f}"


def beam_runs(args, scratch):
    """Every way on every corpus, --rounds times; returns {(times, way): [run, ...]} and the corpus
    sizes."""
    sizes, runs = {}, {}
    for times in sorted({1, *args.scales}):
        folder = os.path.join(scratch, f"corpus-x{times}")
        pattern, sizes[times] = write_corpus(args.train_file, times, args.parts, folder)
        print(
            f"corpus {times}x: {args.parts} files, {sizes[times] / 1e6:.1f} MB; load average "
            f"{load_average()}"
        )
        for round_ in range(args.rounds):
            ways = WAYS[round_ % len(WAYS) :] + WAYS[: round_ % len(WAYS)]  # none always goes first
            outputs = {}
            for way in ways:
                output_dir = os.path.join(scratch, f"out-x{times}-{WAYS.index(way)}")
                env, hf_home = fresh_env(scratch)
                command = prepare_command(args, ["--train_file", pattern], output_dir, way)
                run = measured_run(command, env, args.sample_every, args.quiet_wait)
                shutil.rmtree(hf_home, ignore_errors=True)
                outputs[way] = output_dir
                runs.setdefault((times, way), []).append(run)
                print(f"  round {round_ + 1}, {describe_run(way, run)}")
            for way in WAYS[1:]:
                runs[(times, way)][-1]["identical"] = same_files(outputs["single"], outputs[way])
            for output_dir in outputs.values():
                shutil.rmtree(output_dir, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return runs, sizes


def describe_run(way, run):
    workers = ", ".join(f"{peak:.0f} MiB {cpu:.1f} s" for _, peak, cpu in worker_list(run))
    first = (
        f", first worker at {run['first_worker']:.1f} s" if run["first_worker"] is not None else ""
    )
    return (
        f"{way}: {run['wall']:.1f} s wall, {run['cpu']:.1f} s CPU, other jobs {run['others']:.2f} "
        f"cores (waited {run['waited']:.0f} s for quiet){first}; launcher {launcher_peak(run):.0f} "
        "MiB" + (f"; workers (peak RSS, CPU) {workers}" if workers else "")
    )


def launcher_peak(run):
    return next(peak for name, peak, _ in run["processes"].values() if name == "launcher")


def worker_peaks(run):
    return [peak for name, peak, _ in run["processes"].values() if name == "beam worker"]


def worker_cpus(run):
    return [cpu for name, _, cpu in run["processes"].values() if name == "beam worker"]


def worker_list(run):
    return sorted(process for process in run["processes"].values() if process[0] == "beam worker")


def fastest(runs):
    """The round that took the least wall time: the one least disturbed by other jobs
    (machine.fastest_time)."""
    return min(runs, key=lambda run: run["wall"])


CORES = {"single": 2, "beam 2 workers": 2, "beam 1 worker, pinned": 1}


def work_cpu(run):
    """The CPU seconds that did the work: the Beam workers' (as last sampled), or the single
    process's."""
    return sum(worker_cpus(run)) if worker_cpus(run) else run["cpu"]


def beam_tables(args, runs, sizes):
    scales = sorted(sizes)
    print(
        f"\nEach way's fastest of {args.rounds} rounds (MiB: VmHWM sampled from /proc, the largest "
        "of the rounds; CPU s: the whole process tree; workers' CPU s as last sampled; other "
        "jobs: the cores the rest of the machine used meanwhile, on average):\n"
    )
    rows = []
    for times in scales:
        for way in WAYS:
            group = runs[(times, way)]
            run = fastest(group)
            workers = [
                max(worker_list(other)[i][1] for other in group)
                for i in range(len(worker_list(run)))
            ]
            same = all(other.get("identical") for other in group)
            identical = "—" if way == "single" else ("yes" if same else "**NO**")
            first = "—" if run["first_worker"] is None else f"{run['first_worker']:.1f}"
            rows.append(
                [
                    f"{times}x ({sizes[times] / 1e6:.0f} MB)",
                    way,
                    f"{run['wall']:.1f}",
                    f"{sizes[times] / 1e6 / run['wall']:.2f}",
                    f"{run['cpu']:.1f}",
                    ", ".join(f"{cpu:.1f}" for cpu in sorted(worker_cpus(run))) or "—",
                    first,
                    f"{run['others']:.2f}",
                    mib(max(launcher_peak(other) for other in group)),
                    ", ".join(mib(peak) for peak in workers) or "—",
                    identical,
                ]
            )
    print_table(
        [
            "corpus",
            "way",
            "wall s",
            "raw MB/s",
            "CPU s",
            "workers' CPU s",
            "first worker at s",
            "other jobs, cores",
            "launcher peak RSS MiB",
            "workers' peak RSS MiB",
            "byte-identical to single",
        ],
        rows,
        text_columns=2,
    )

    small, large = scales[-2], scales[-1]
    extra = (sizes[large] - sizes[small]) / 1e6
    print(
        f"\nSteady rates: slopes from {small}x to {large}x ({extra:.0f} MB more), of the fastest "
        "rounds; fixed cost: the intercept at size 0. Work CPU: the Beam workers' CPU seconds "
        "(single: the process's).\n"
    )
    steady, rows = {}, []
    for way in WAYS:
        run = {times: fastest(runs[(times, way)]) for times in (small, large)}
        rate = extra / (run[large]["wall"] - run[small]["wall"])
        fixed = run[large]["wall"] - sizes[large] / 1e6 / rate
        cpu_rate = extra / (work_cpu(run[large]) - work_cpu(run[small]))
        steady[way] = rate
        rows.append(
            [
                way,
                str(CORES[way]),
                f"{sizes[large] / 1e6 / run[large]['wall'] / CORES[way]:.2f}",
                f"{rate:.2f}",
                f"**{rate / CORES[way]:.2f}**",
                f"{fixed:.1f}",
                f"{cpu_rate:.2f}",
            ]
        )
    print_table(
        [
            "way",
            "cores",
            f"raw MB/s per core at {large}x",
            "steady MB/s",
            "steady MB/s per core",
            "fixed cost s",
            "steady MB per work-CPU s",
        ],
        rows,
    )
    ratio = steady["beam 2 workers"] / steady["beam 1 worker, pinned"]
    print(f"\nScaling, steady rate of 2 workers / 1 pinned worker: **{ratio:.2f}x** (goal >= 1.7x)")
    raw = {way: sizes[large] / fastest(runs[(large, way)])["wall"] for way in WAYS}
    print(
        f"Scaling, raw rate at {large}x: "
        f"{raw['beam 2 workers'] / raw['beam 1 worker, pinned']:.2f}x"
    )
    print(
        "Beam 2 workers / the single process: steady rate "
        f"{steady['beam 2 workers'] / steady['single']:.2f}x, raw rate at {large}x "
        f"{raw['beam 2 workers'] / raw['single']:.2f}x"
    )

    print(
        "\nPeak RSS against 1x, the largest of the rounds (Beam: the largest worker; single: the "
        "process):\n"
    )
    rows = []
    for way in WAYS:
        key = launcher_peak if way == "single" else (lambda run: max(worker_peaks(run)))
        peaks = {times: max(key(run) for run in runs[(times, way)]) for times in scales}
        rows.append(
            [way, *(f"{mib(peaks[times])} ({peaks[times] / peaks[1]:.2f}x)" for times in scales)]
        )
    print_table(["way", *(f"{times}x: MiB (vs 1x)" for times in scales)], rows)


def streaming_runs(args, scratch):
    print(f"\nStreaming a Hub-like local folder; load average {load_average()}\n")
    rows = []
    for times in sorted({1, args.streaming_scale}):
        folder = write_hub_folder(args.train_file, times, os.path.join(scratch, f"hub-x{times}"))
        input_bytes, input_files = folder_bytes(folder)
        outputs = {}
        for streaming in (True, False):
            output_dir = os.path.join(scratch, f"out-hub-x{times}-{streaming}")
            source = ["--dataset_name", folder, "--dataset_config", "default"] + [
                "--streaming"
            ] * streaming
            env, hf_home = fresh_env(scratch)
            run = measured_run(
                prepare_command(args, source, output_dir), env, args.sample_every, args.quiet_wait
            )
            cache_bytes, cache_files = folder_bytes(hf_home)
            shutil.rmtree(hf_home, ignore_errors=True)
            outputs[streaming] = output_dir
            rows.append(
                [
                    f"{times}x ({input_files} files, {input_bytes / 1e6:.0f} MB of JSON Lines)",
                    "yes" if streaming else "no",
                    f"{run['wall']:.1f}",
                    f"{run['others']:.2f}",
                    mib(launcher_peak(run)),
                    f"{cache_bytes / 1e6:.1f} MB in {cache_files} files",
                ]
            )
            print(
                f"  {times}x, {describe_run('streaming' if streaming else 'not streaming', run)}; "
                f"cache {cache_bytes / 1e6:.1f} MB in {cache_files} files"
            )
        rows[-1].append("yes" if same_files(outputs[True], outputs[False]) else "**NO**")
        rows[-2].append("—")
        for output_dir in outputs.values():
            shutil.rmtree(output_dir, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    print()
    print_table(
        [
            "corpus",
            "--streaming",
            "wall s",
            "other jobs, cores",
            "peak RSS MiB",
            "HF_HOME after the run",
            "output byte-identical to streaming",
        ],
        rows,
        text_columns=2,
    )


# --------------------------------------------------------------------------------------------------
# The machine's own ceiling: the tokenizer alone, one process on one core against two on two cores


def ceiling_child(args):
    """Encode --train_file's non-blank lines in batches as a worker does (packing.encode_texts, the
    Rust pool off), --ceiling_passes times; prints the wall and CPU seconds of that alone, imports
    and reading excluded."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    sys.path.insert(0, REPO)  # mlm_pipeline lives at the repository root
    from mlm_pipeline import contract, corpus, packing

    backend = packing.batch_backend(
        Tokenizer.from_file(os.path.join(args.tokenizer, contract.TOKENIZER_FILE))
    )
    with open(args.train_file, "rb") as file:
        batches = list(packing.text_batches(corpus.text_lines(file, args.train_file), 1000))
    cpu, start = time.process_time(), time.perf_counter()
    for _ in range(args.ceiling_passes):
        for texts in batches:
            packing.encode_texts(backend, texts)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(
        json.dumps(
            {
                "wall": wall,
                "cpu": cpu,
                "bytes": os.path.getsize(args.train_file) * args.ceiling_passes,
            }
        )
    )


def ceiling(args):
    """One tokenizing process pinned to one core, then two at once pinned to two cores, --rounds
    times: the scaling this machine gives this work with no Beam at all."""
    print(
        f"\nThe machine's two-core ceiling: the tokenizer alone ({args.ceiling_passes} passes over "
        f"--train_file per process); load average {load_average()}\n"
    )
    command = [sys.executable, os.path.abspath(__file__), "--train_file", args.train_file]
    command += [
        "--tokenizer",
        args.tokenizer,
        "--ceiling_passes",
        str(args.ceiling_passes),
        "--ceiling_child",
    ]

    def together(cores):
        """MB/s of `cores` processes at once, one pinned to each core; their results; other jobs'
        cores."""
        wait_for_quiet(args.quiet_wait)
        start, busy, ours = time.perf_counter(), busy_seconds(), children_cpu()
        processes = [
            subprocess.Popen(
                ["taskset", "-c", str(core), *command], stdout=subprocess.PIPE, text=True
            )
            for core in cores
        ]
        results = [
            json.loads(process.communicate()[0].strip().splitlines()[-1]) for process in processes
        ]
        others = max(0.0, busy_seconds() - busy - (children_cpu() - ours)) / (
            time.perf_counter() - start
        )
        rate = (
            sum(result["bytes"] for result in results)
            / max(result["wall"] for result in results)
            / 1e6
        )
        return rate, results, others

    rounds, rows = [], []
    for round_ in range(args.rounds):
        alone, (one,), others_alone = together([args.pinned_core])
        pair, two, others_pair = together([0, 1])
        rounds.append((alone, pair))
        rows.append(
            [
                str(round_ + 1),
                f"{alone:.2f}",
                f"{one['cpu'] / one['wall']:.2f}",
                f"{others_alone:.2f}",
                f"{pair:.2f}",
                ", ".join(f"{result['cpu'] / result['wall']:.2f}" for result in two),
                f"{others_pair:.2f}",
                f"{pair / alone:.2f}x",
            ]
        )
    print_table(
        [
            "round",
            "1 process, MB/s",
            "its CPU s / wall s",
            "other jobs, cores",
            "2 processes, MB/s together",
            "their CPU s / wall s",
            "other jobs, cores",
            "2 / 1",
        ],
        rows,
    )
    best = max(pair for _, pair in rounds) / max(alone for alone, _ in rounds)
    print(
        f"\nCeiling for 2 workers / 1 worker on this machine: **{best:.2f}x** (fastest rounds), "
        f"{statistics.median(pair / alone for alone, pair in rounds):.2f}x (median of the rounds' "
        "ratios)"
    )


def children_cpu():
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------------------------------
# --profile: one block as a Beam worker packs it


def profile_child(args):
    import cProfile
    import io
    import pstats

    from tokenizers import Tokenizer

    sys.path.insert(0, REPO)  # mlm_pipeline lives at the repository root
    from mlm_pipeline import beam_pipeline, contract, packing, split_manifest

    corpus_file, output_dir = args.profile_child
    backend = packing.batch_backend(
        Tokenizer.from_file(os.path.join(args.tokenizer, contract.TOKENIZER_FILE))
    )
    fingerprint = split_manifest.tokenizer_fingerprint(backend)
    settings = {"split": "train", "shard_size": 10000, "max_length": args.max_length}
    os.makedirs(output_dir, exist_ok=True)
    pack = beam_pipeline.PackBlock(args.tokenizer, False, fingerprint, output_dir, settings, 1000)
    # Beam's file system imported, untimed
    beam_pipeline.index_file((0, corpus_file), args.rows_per_block)
    index_start = time.perf_counter()
    # the index pass, which reads every input file once before any block is packed
    for _ in range(5):
        _, path, starts, lines = beam_pipeline.index_file((0, corpus_file), args.rows_per_block)
    index_rate = 5 * os.path.getsize(corpus_file) / 1e6 / (time.perf_counter() - index_start)
    spec = next(beam_pipeline.number_blocks([(0, path, starts, lines)], args.rows_per_block, None))
    pack(spec)  # the tokenizer loaded, as a worker does once, before the block it profiles
    spec = (1, *spec[1:])
    size = (spec[3] or os.path.getsize(path)) - spec[2]
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    pack(spec)
    profiler.disable()
    wall = time.perf_counter() - start
    print(
        f"index pass (beam_pipeline.index_file, the file in the page cache): {index_rate:.0f} MB/s"
    )
    print(
        f"one block of {spec[5]:,} rows ({size / 1e6:.2f} MB): {wall:.2f} s under cProfile, "
        f"{size / 1e6 / wall:.2f} MB/s"
    )
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
    print(text.getvalue())


def profile(args, scratch):
    corpus_file = os.path.join(scratch, "profile-corpus.txt")
    shutil.copyfile(args.train_file, corpus_file)
    command = [sys.executable, os.path.abspath(__file__), "--train_file", args.train_file]
    command += ["--tokenizer", args.tokenizer]
    command += ["--rows_per_block", str(args.rows_per_block), "--max_length", str(args.max_length)]
    command += ["--profile_child", corpus_file, os.path.join(scratch, "profile-out")]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    wait_for_quiet(args.quiet_wait)
    print(
        "\ncProfile of one block as a Beam worker packs it (beam_pipeline.PackBlock), load "
        f"{load_average()}:\n"
    )
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    print(result.stdout if result.returncode == 0 else result.stderr[-3000:])


def main(args):
    if args.profile_child:
        profile_child(args)
        return
    if args.ceiling_child:
        ceiling_child(args)
        return
    sys.stdout.reconfigure(line_buffering=True)
    args.train_file, args.tokenizer = (
        os.path.abspath(args.train_file),
        os.path.abspath(args.tokenizer),
    )
    args.prepare_script = os.path.abspath(args.prepare_script)
    if args.rows_per_block is None:
        with open(args.train_file, "rb") as file:
            args.rows_per_block = max(1, len(file.read().splitlines()) // args.parts)
    print(f"machine: {describe_machine()}")
    print(
        f"apache-beam {__import__('apache_beam').__version__}, datasets "
        f"{__import__('datasets').__version__}"
    )
    print(
        f"flags of every run: --max_length {args.max_length} --rows_per_block "
        f"{args.rows_per_block}; corpora in {args.parts} files each; rounds {args.rounds}"
    )
    print(f"load average at start: {load_average()}\n")
    start = time.perf_counter()
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    scratch = args.keep or tempfile.mkdtemp(prefix="prepare-beam-benchmark-")
    # The libraries read once from disk before anything is timed, so that the
    # first run does not pay for it.
    subprocess.run(
        [sys.executable, "-c", "import apache_beam, datasets, tensorflow, transformers"], check=True
    )
    try:
        if not args.skip_beam:
            runs, sizes = beam_runs(args, scratch)
            beam_tables(args, runs, sizes)
        if args.ceiling_passes:
            ceiling(args)
        if not args.skip_streaming:
            streaming_runs(args, scratch)
        if args.profile:
            profile(args, scratch)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"\nload average at the end: {load_average()}; the whole benchmark took "
        f"{time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main(parse_args())
