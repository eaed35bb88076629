"""Every benchmark script runs to its end at its smallest setting and prints its tables, figures
and all.

The scripts in benchmarks/ are found by their `__main__`, and each is run as a user runs it,
`python benchmarks/<name>.py <flags>`, on the session's tiny corpus, tokenizer and shards: a
benchmark that a change of the scripts or the package breaks fails here, not months later on a large
corpus. A script with no smallest setting below fails too, so a new benchmark comes with one.
Nothing here asserts a timing: only that the run ends, prints its rows with numbers where figures
belong, and holds what it checks itself (the same bytes, the same tokens).
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from refusals import refused

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
SCRIPTS = sorted(
    path.name
    for path in BENCHMARKS.glob("*.py")
    if re.search(r"^if __name__ == .__main__.:", path.read_text(encoding="utf-8"), re.M)
)
# a figure as the tables print it: 1,234 | 0.25 | 12.5% | 1.42x | **0.78x** | 0.0 M
FIGURE = re.compile(r"\**[\d,]*\.?\d+(e[-+]?\d+)?(%|x| M)?\**")


def smallest_settings(corpus, tokenizer_dir, shards_dir, tiny_model, pretrained, tmp_path):
    """{script: (its flags at its smallest setting, check(stdout) that asserts what it printed)}."""
    train, validation = shards_dir / "train", shards_dir / "validation"
    beam = importlib.util.find_spec("apache_beam") is not None
    run_mlm = ["--no_tpu", "--train_dataset", train, "--tokenizer", tokenizer_dir]
    run_mlm += ["--config_overrides", tiny_model, "--no_pytorch_export"]
    curve = tmp_path / "curve.json"

    def tokenizer_efficiency(output):
        assert_row(output, "train_unigram.py", figures=7)
        assert_row(output, "SentencePiece unigram (its defaults)", figures=7)

    def neighbour_baseline(output):
        assert_row(output, "none (unigram: always the most frequent token)", figures=2)
        assert_row(output, "left and right neighbour (bigram counts)", figures=2)

    def prepare_shards(output):
        assert "tokens: the same as the shards'" in output  # what the floor read, prepare wrote
        assert_row(output, "floor: `tokenizer(lines)`", figures=2)
        assert_row(output, "prepare_tfrecord_shards.py main()", figures=2)
        assert re.search(r"prepare / floor: \*\*[\d.]+x\*\*", output)
        assert_row(output, "numpy (packing.serialize_examples)", figures=2)
        assert_row(output, "tf.train.Example per row", figures=2)
        figures = r"\| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d,]+ \|"  # wall, MB/s, CPU, launcher RSS
        run = r"\| 1x \([\d.]+ MB\) \| {} " + figures + r" {} \| [\d.]+ \| {} \|"
        assert re.search(run.format("single", "—", "—"), output), output
        if beam:  # each worker's memory, and the same bytes as the single process
            workers, same = r"[\d,]+, [\d,]+", r"yes \(single\)"
            assert re.search(run.format("beam 2 workers", workers, same), output), output
        else:
            assert "Apache Beam is not installed" in output

    def corpus_formats(output):
        for extension in ("txt", "jsonl.gz"):  # files MB, wall, MB/s, CPU, peak RSS, same shards
            figures = r"\| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d,]+ \| yes \|"
            row = rf"\| 1x \([\d.]+ MB of text\) \| {re.escape(extension)} {figures}"
            assert re.search(row, output), output
        assert_row(output, "jsonl.gz", figures=3)  # peak RSS at 1x, at 2x, and their ratio

    def beam_big_files(output):
        for side in ("txt", "jsonl.gz"):  # MB, blocks, rows a block, wall, peak RSS, / txt
            assert_row(output, side, figures=6)

    def training_speed(output):
        for variant in ("sparse", "modernbert"):  # "vs full" needs the full variant too
            assert_row(output, variant, figures=5)
        assert re.search(r"Input pipeline alone: [\d,]+ sequences/s .* \*\*\d+x\*\*", output)

    def average_checkpoints(output):
        rows = {}
        for last in ("1", "2"):  # steps, then val loss and accuracy at [MASK]
            assert_row(output, last, figures=2)
            line = next(line for line in output.splitlines() if line.startswith(f"| {last} |"))
            rows[last] = line.split("|")[3].strip()
        # scored as the run scored its average of 2 and its last step
        assert f"eval loss {rows['2']}, accuracy" in output, output
        assert f"the last step alone: eval loss {rows['1']}," in output, output

    def recipe_curve(output):
        for step in ("2", "4"):
            assert_row(output, step, figures=5)
        assert "Tokens seen when accuracy at [MASK] first reached 0.10: " in output
        assert [point["step"] for point in json.loads(curve.read_text())["points"]] == [2, 4]

    def downstream(output):
        assert_row(output, "bag of words, logistic regression", figures=5)
        assert_row(output, "random weights", figures=5)
        # a pretrained row also has its pretraining's minutes and accuracy at [MASK]
        assert_row(output, "tiny pretrained", figures=7)

    def preflight_projection(output):
        assert "Preflight (nothing written)" in output
        # steps, the preflight's process, the projection and the real process in minutes, ratio
        assert_row(output, "the whole run", figures=5)
        assert_row(output, "full length", figures=4)  # steps, the means of both, the real median
        assert re.search(
            r"The projection's parts \(minutes\): start [\d.]+, training [\d.]+", output
        )
        assert re.search(
            r"The real process's parts \(minutes\): start \(to the first fit\(\)\) [\d.]+", output
        )

    def modernbert_long(output):
        # length, batch, both sides' seconds, peaks and memory above imports, TF's tensors, the
        # ratios of the peaks and of the memory above imports, local ms
        assert_row(output, "128", figures=11)
        assert re.search(r"Peak at 128 / at 128: TF \*\*[\d.]+x\*\*", output)
        assert_row(output, "64", figures=6)  # the switch: each path's ms and two ratios

    def classifier_speed(output):
        assert_row(output, "one length (--pad_to_max_length)", figures=4)
        assert_row(output, "length buckets", figures=4)

    return {
        "classifier_speed.py": (
            ["--train_file", pretrained["train"], "--validation_file", pretrained["validation"]]
            + ["--model", pretrained["model"], "--limit", 64, "--batch_size", 8]
            + ["--warmup_steps", 2, "--rounds", 1],
            classifier_speed,
        ),
        # run from the model's parent folder, the model named relative to it, as a user would
        "downstream.py": (
            ["--train_file", pretrained["train"], "--validation_file", pretrained["validation"]]
            + ["--from_scratch", "random weights=model"]
            + ["--model", "tiny pretrained=model", "--seeds", 0, "--bow_epochs", 1]
            + ["--", "--limit", 64, "--per_replica_batch_size", 8, "--num_epochs", 1],
            downstream,
            pretrained["model"].parent,
        ),
        "modernbert_long.py": (
            ["--lengths", 128, "--tokens", 128, "--steps", 1, "--local_steps", 1]
            + ["--switch_lengths", 64],
            modernbert_long,
        ),
        "tokenizer_efficiency.py": (
            ["--train_file", corpus["train"], "--validation_file", corpus["validation"]]
            + ["--vocab_size", 400],
            tokenizer_efficiency,
        ),
        "neighbour_baseline.py": (
            ["--train_dataset", train, "--eval_dataset", validation],
            neighbour_baseline,
        ),
        "prepare_shards.py": (
            ["--train_file", corpus["train"], "--tokenizer", tokenizer_dir, "--max_length", 32]
            + ["--repeats", 1, "--rounds", 1, "--scales", 1, "--ways", "single", "beam 2 workers"],
            prepare_shards,
        ),
        "corpus_formats.py": (
            ["--train_file", corpus["train"], "--tokenizer", tokenizer_dir, "--max_length", 32]
            + ["--scales", 1, 2, "--formats", "jsonl.gz", "--parts", 2, "--sample_every", 0.05],
            corpus_formats,
        ),
        "beam_big_files.py": (
            ["--train_file", corpus["train"], "--tokenizer", tokenizer_dir, "--max_length", 32]
            + ["--copies", 1, "--blocks", 3, "--formats", "jsonl.gz", "--workers", 1]
            + ["--rounds", 1],
            beam_big_files,
        ),
        "training_speed.py": (
            ["--train_dataset", train, "--tokenizer", tokenizer_dir]
            + ["--variants", "sparse", "modernbert"]
            + ["--config_overrides", tiny_model, "--batch_size", 4, "--steps", 2]
            + ["--warmup_steps", 1, "--rounds", 1, "--pipeline_batches", 4]
            + ["--ceiling_sizes", 64],
            training_speed,
        ),
        "preflight_projection.py": (
            ["--", *run_mlm, "--eval_dataset", validation, "--output_dir", tmp_path / "model"]
            + ["--max_steps", 30, "--per_replica_batch_size", 8],
            preflight_projection,
        ),
        "average_checkpoints.py": (
            ["--last", 1, 2, "--", *run_mlm, "--eval_dataset", validation]
            + ["--output_dir", tmp_path / "averaged", "--max_steps", 4, "--save_steps", 2]
            + ["--per_replica_batch_size", 8, "--average_last", 2],
            average_checkpoints,
        ),
        "recipe_curve.py": (
            ["--eval_every", 2, "--output_json", curve, "--", *run_mlm]
            + ["--eval_dataset", validation, "--output_dir", tmp_path / "model"]
            + ["--max_steps", 4, "--per_replica_batch_size", 8],
            recipe_curve,
        ),
    }


def assert_row(output, first_cell, figures):
    """A markdown table row that starts with `first_cell` is in `output`, and at least `figures` of
    its other cells are figures."""
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            numbers = [cell for cell in cells[1:] if FIGURE.fullmatch(cell)]
            assert len(numbers) >= figures, f"too few figures in {line!r}"
            return
    raise AssertionError(f"no table row {first_cell!r} in:\n{output}")


@pytest.fixture(scope="module")
def pretrained(corpus, tokenizer_dir, shards_dir, tiny_model, tmp_path_factory):
    """What benchmarks/downstream.py needs: a tiny masked LM from run_mlm.py (a few steps on the
    session's shards) and a labelled train and validation split in SST-2's layout (sentence, label;
    the label says whether the line holds "the": its accuracy is not what is tested)."""
    import run_mlm

    folder = tmp_path_factory.mktemp("downstream")
    flags = ["--no_tpu", "--train_dataset", shards_dir / "train", "--tokenizer", tokenizer_dir]
    flags += ["--output_dir", folder / "model", "--config_overrides", tiny_model]
    flags += ["--eval_dataset", shards_dir / "validation", "--max_steps", 2, "--no_pytorch_export"]
    run_mlm.main(run_mlm.parse_args([str(flag) for flag in flags]))
    labelled = {"model": folder / "model"}
    for split in ("train", "validation"):
        text = corpus[split].read_text(encoding="utf-8")
        lines = [line for line in text.splitlines() if line.strip()]
        rows = [f"{line}\t{int('the' in line.lower().split())}\n" for line in lines]
        labelled[split] = folder / f"{split}.tsv"
        labelled[split].write_text("sentence\tlabel\n" + "".join(rows), encoding="utf-8")
    return labelled


@pytest.fixture
def settings(corpus, tokenizer_dir, shards_dir, tiny_model, pretrained, tmp_path):
    return smallest_settings(corpus, tokenizer_dir, shards_dir, tiny_model, pretrained, tmp_path)


def test_benchmarks_are_found():
    assert "prepare_shards.py" in SCRIPTS and "machine.py" not in SCRIPTS


def test_every_smallest_setting_is_a_benchmark(settings):
    assert set(settings) <= set(SCRIPTS), "a smallest setting for a script that is gone"


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_runs_at_its_smallest_setting(script, settings):
    assert script in settings, (
        f"benchmarks/{script} has no smallest setting: add its flags and what its output must show "
        "to smallest_settings() in tests/test_benchmarks.py"
    )
    flags, check, *working_folder = settings[script]  # the repository unless it names one
    command = [sys.executable, str(BENCHMARKS / script), *map(str, flags)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    cwd = working_folder[0] if working_folder else REPO
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stderr[-3000:]}"
    check(result.stdout)


def run_benchmark(script, *args):
    """A benchmark run as a user runs it, for refusals.refused."""
    command = [sys.executable, str(BENCHMARKS / script), *map(str, args)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_downstream_refuses_a_training_file_that_is_not_utf8_in_one_line(tmp_path):
    # run_classifier.py's own refusal, through the package's reader: a benchmark answers bad input
    # as the step scripts do, one line and exit 1, not a traceback ending in the UsageError
    train, validation = tmp_path / "train.tsv", tmp_path / "validation.tsv"
    train.write_bytes("sentence\tlabel\nUn café au lait.\t1\n".encode("latin-1"))
    validation.write_text("sentence\tlabel\nA cup of tea.\t0\n", encoding="utf-8")
    args = ["--train_file", train, "--validation_file", validation, "--seeds", 0]
    output_dir = tmp_path / "classifiers"
    refused(
        run_benchmark,
        "downstream.py",
        [*args, "--output_dir", output_dir],
        output_dir,
        f"--train_file {train} is not UTF-8 text",
    )


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--layers", 0], "--layers 0: a model has at least one layer"),
        (["--tokens", 1000, "--lengths", 512], "--tokens 1000 is not a whole number of sequences"),
    ],
)
def test_modernbert_long_refuses_what_it_cannot_build_in_one_line(flags, needle, tmp_path):
    refused(run_benchmark, "modernbert_long.py", flags, tmp_path, needle)


def test_modernbert_long_counts_a_child_s_memory_without_its_parent_s():
    # a child's ru_maxrss starts at its parent's peak; the benchmark's parent holds TensorFlow, so
    # its children must count their own high-water mark, or a small step reads as its parent's size.
    # The count is the preflight's (hardware.peak_resident_bytes): a run started by a large
    # process must not read as that large either
    held = bytearray(b"\1") * (512 * 2**20)  # written, so resident in this process
    code = "from modernbert_long import peak_mib; print(peak_mib())"
    child = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True, check=True
    )
    assert len(held) and float(child.stdout) < 256, f"a bare child peaked at {child.stdout} MiB"
