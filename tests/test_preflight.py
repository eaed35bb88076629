"""--preflight: a few of the run's own steps timed and the run projected, with nothing written; a
batch that does not fit is one line. In this process, on the session's tiny shards and model, but
for the gs:// case, which needs the emulator's environment in a process of its own."""

import statistics

import pytest
from fake_hub import FakeHub, connect_this_process, disconnect_this_process
from gcs_emulator import GcsEmulator
from helpers import run_command, subprocess_env, tiny_run_flags
from refusals import script_in_process

import run_classifier
import run_mlm
from mlm_pipeline import preflight

BATCH_SIZE = 8
TOKEN = "hf_fakeHubTokenForTheseTestsOnly"
REAL_STEPS = 80  # enough timed steps that a median is not noise


def run_flags(shards_dir, tokenizer_dir, output_dir, *extra, **named):
    named = {"per_replica_batch_size": BATCH_SIZE, "no_pytorch_export": True, **named}
    argv = tiny_run_flags(shards_dir, tokenizer_dir, output_dir, *extra, **named)
    return [str(word) for word in argv]


def training_clock():
    """A Keras callback that keeps the seconds between the ends of two training steps of one
    epoch (an epoch's first step, after a compile or an evaluation, is left out)."""
    import time

    import tf_keras

    class TrainingClock(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds, self.previous = [], None

        def on_epoch_begin(self, epoch, logs=None):
            self.previous = None

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self.previous is not None:
                self.seconds.append(now - self.previous)
            self.previous = now

    return TrainingClock()


@pytest.fixture(scope="module")
def preflight_and_real_run(shards_dir, tokenizer_dir, tmp_path_factory):
    """The same command measured with --preflight, then run for real with a clock on its steps:
    (the preflight's report, the real run's step seconds, its output folder, the preflight's)."""
    folder = tmp_path_factory.mktemp("preflight")
    argv = run_flags(shards_dir, tokenizer_dir, folder / "model", max_steps=REAL_STEPS)
    preflight_output = folder / "preflight_model"
    report = run_mlm.main(
        run_mlm.parse_args(
            run_flags(
                shards_dir, tokenizer_dir, preflight_output, "--preflight", max_steps=REAL_STEPS
            )
        )
    )
    clock = training_clock()
    run_mlm.main(run_mlm.parse_args(argv), callbacks=[clock])
    return report, clock.seconds, folder / "model", preflight_output


def test_preflight_writes_nothing_and_reports_the_run(preflight_and_real_run, capsys):
    report, _, _, output_dir = preflight_and_real_run
    assert not output_dir.exists()
    hardware = report.hardware
    assert (hardware["device"], hardware["replicas"]) == ("CPU", 1)
    assert hardware["tensorflow"] and hardware["pjrt"].startswith("no PJRT")
    ((phase, timing),) = report.phases  # no sequence-length warmup: one shape
    assert phase.steps == REAL_STEPS and timing.timed >= preflight.TIMED_STEPS
    assert timing.first > timing.median > 0
    assert report.tokens_per_second == pytest.approx(BATCH_SIZE * 32 / timing.median)
    assert 0 < report.memory.peak < report.memory.capacity
    # every step at the median, the compile once, and the evaluations
    training = REAL_STEPS * timing.median + timing.first - timing.median
    assert report.projected_seconds == pytest.approx(training + report.evaluation_seconds)
    assert report.evaluation_seconds > 0


def test_preflight_step_is_within_2x_of_the_real_runs(preflight_and_real_run):
    report, real_seconds, _, _ = preflight_and_real_run
    assert len(real_seconds) > REAL_STEPS // 2
    ratio = report.seconds_per_step / statistics.median(real_seconds)
    assert 0.5 < ratio < 2, ratio


@pytest.fixture
def hub(monkeypatch):
    """A stand-in Hub this process talks to, online, until the test ends."""
    with FakeHub(TOKEN) as hub:
        connect_this_process(monkeypatch, hub)
        yield hub
    disconnect_this_process()


def test_preflight_counts_the_evaluations_and_the_warmups_phase(
    shards_dir, tokenizer_dir, tmp_path, capsys, hub
):
    argv = run_flags(
        shards_dir,
        tokenizer_dir,
        tmp_path / "model",
        "--preflight",
        max_steps=30,
        eval_steps=10,
        short_sequence_length=8,
        short_sequence_ratio=0.5,
        hub_model_id="user/model",
    )
    report = run_mlm.main(run_mlm.parse_args(argv))
    assert not (tmp_path / "model").exists() and hub.requests == []
    assert [(phase.name, phase.steps) for phase, _ in report.phases] == [
        ("the warmup's 8-token pieces", 15),
        ("full length", 15),
    ]
    # every 10 steps, and where the warmup ends (step 15)
    assert report.evaluation.count == 4
    printed = capsys.readouterr().out
    for needle in ("Preflight (nothing written)", "a step (median of", "peak memory", "projected"):
        assert needle in printed


def test_a_batch_that_runs_out_of_memory_is_one_line(
    shards_dir, tokenizer_dir, tmp_path, monkeypatch
):
    import tensorflow as tf
    import tf_keras

    def out_of_memory(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")

    monkeypatch.setattr(tf_keras.Model, "fit", out_of_memory)
    argv = run_flags(shards_dir, tokenizer_dir, tmp_path / "model", "--preflight")
    result = script_in_process("run_mlm.py", *argv, "--gradient_accumulation_steps", 2)
    assert result.returncode == 1
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith("run_mlm.py: error: the batch does not fit")
    assert "OOM when allocating tensor" in line
    assert f"lower --per_replica_batch_size {BATCH_SIZE}" in line
    assert "lower the shards' --max_length 32" in line
    # --gradient_accumulation_steps multiplies the batch: half a replica's, twice accumulated
    same_batch = (
        f"halve --per_replica_batch_size to {BATCH_SIZE // 2} and double "
        "--gradient_accumulation_steps to 4: the same global batch."
    )
    assert line.endswith(same_batch), line
    assert not (tmp_path / "model").exists()


def test_the_preflight_counts_the_accumulated_batches_in_a_step(
    shards_dir, tokenizer_dir, tmp_path, capsys
):
    argv = run_flags(shards_dir, tokenizer_dir, tmp_path / "model", "--preflight", max_steps=10)
    report = run_mlm.main(run_mlm.parse_args(argv + ["--gradient_accumulation_steps", "2"]))
    assert report.sequences_per_step == 2 * BATCH_SIZE  # one replica, 2 batches of 8
    assert f"({2 * BATCH_SIZE} sequences a step)" in capsys.readouterr().out
    assert not (tmp_path / "model").exists()


def test_a_peak_above_the_memory_is_one_line(shards_dir, tokenizer_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "machine_memory", lambda: 2**20)  # 1 MiB of RAM
    argv = run_flags(shards_dir, tokenizer_dir, tmp_path / "model", "--preflight")
    result = script_in_process("run_mlm.py", *argv)
    assert result.returncode == 1
    line = result.stderr.strip()
    assert "\n" not in line
    assert "the batch does not fit: its peak of" in line and "0.0 GiB of" in line
    assert "Preflight" not in result.stdout  # no report that reads as a go-ahead
    assert not (tmp_path / "model").exists()


def test_classifier_preflight_writes_nothing(preflight_and_real_run, labelled, tmp_path, hub):
    _, _, pretrained, _ = preflight_and_real_run
    output_dir = tmp_path / "classifier"
    argv = ["--no_tpu", "--model_name_or_path", pretrained, "--output_dir", output_dir]
    argv += ["--hub_model_id", "user/classifier"]
    argv += ["--train_file", labelled["train"], "--validation_file", labelled["validation"]]
    argv += ["--per_replica_batch_size", 8, "--num_epochs", 3, "--pad_to_max_length"]
    report = run_classifier.main(run_classifier.parse_args([*map(str, argv), "--preflight"]))
    assert not output_dir.exists() and hub.requests == []  # no repository opened
    ((phase, timing),) = report.phases
    assert phase.steps == 3 * (800 // 8) and timing.median > 0
    # after each epoch, and the final scores: 100 examples in batches of 8
    assert (report.evaluation.count, report.evaluation.batches) == (4, 13)
    assert report.tokens_per_second > 0  # one length: every batch's tokens are known


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    emulator = GcsEmulator(tmp_path_factory.mktemp("gcs_emulator")).start()
    try:
        emulator.create_bucket("preflight-bucket")
        yield emulator
    finally:
        emulator.stop()


def test_preflight_to_a_bucket_writes_nothing_there(gcs, shards_dir, tokenizer_dir):
    # through a proxy that refuses every write: a single one would fail the run
    read_only = gcs.start_proxy(refuse_writes_with=403)
    output_dir = "gs://preflight-bucket/model"
    argv = run_flags(shards_dir, tokenizer_dir, output_dir, "--preflight", max_steps=10)
    result = run_command(
        "run_mlm.py", *argv, env=gcs.env(base=subprocess_env(), proxy_url=read_only)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "projected run" in result.stdout
    assert gcs.list_objects("preflight-bucket") == {}
