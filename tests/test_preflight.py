"""--preflight: a few of the run's own steps timed and the run projected, with nothing written; a
batch that does not fit is one line. In this process, on the session's tiny shards and model, but
for the gs:// case, which needs the emulator's environment in a process of its own."""

import statistics
import time
import types

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
    assert timing.first > timing.mean > 0 and timing.spread > 0
    assert report.tokens_per_second == pytest.approx(BATCH_SIZE * 32 / timing.mean)
    assert 0 < report.memory.peak < report.memory.capacity
    # the whole process: its start, every step at the mean, the compile once, the evaluations,
    # the checkpoints (one timed, counted as the run saves them) and the final save
    overheads = report.overheads
    assert overheads.start > 0 and overheads.checkpoint_first > 0 and overheads.final_save > 0
    assert overheads.checkpoints >= 1  # at least the last epoch's end
    training = REAL_STEPS * timing.mean + timing.extra + (phase.calls - 1) * timing.restart
    checkpoints = (
        overheads.checkpoint_first + (overheads.checkpoints - 1) * overheads.checkpoint_each
    )
    assert report.projected_seconds == pytest.approx(
        overheads.start + training + report.evaluation_seconds + checkpoints + overheads.final_save
    )
    assert report.evaluation_seconds > 0
    # the model's FLOPs, counted with the sparse head at its 5 slots (15% of 32 positions): on
    # the CPU a rate, no utilization
    assert "the LM head at 5 of 32 positions" in report.flops.counts
    assert f"x {BATCH_SIZE} sequences" in report.flops.counts and report.utilization is None
    assert report.flops_per_second == pytest.approx(report.flops.per_step / timing.mean)


def test_preflight_step_is_within_2x_of_the_real_runs(preflight_and_real_run):
    report, real_seconds, _, _ = preflight_and_real_run
    assert len(real_seconds) > REAL_STEPS // 2
    ratio = report.seconds_per_step / statistics.fmean(real_seconds)
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
    for needle in ("Preflight (nothing written)", "a step (mean of", "peak memory", "projected"):
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
    assert phase.steps == 3 * (800 // 8) and timing.mean > 0
    # its final save timed (the classifier saves no checkpoint), its FLOPs counted: one length
    assert report.overheads.final_save > 0 and report.overheads.checkpoints == 0
    assert report.flops.per_step > 0 and "LM head" not in report.flops.counts
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


def stand_in_strategy(replicas=1, device="TPU"):
    """What peak_memory() reads of a strategy: its replicas and their devices."""
    devices = [f"/job:localhost/replica:0/task:0/device:{device}:{i}" for i in range(replicas)]
    extended = types.SimpleNamespace(worker_devices=devices)
    return types.SimpleNamespace(num_replicas_in_sync=replicas, extended=extended)


def hardware_of(device, kind, replicas=1):
    """describe_hardware()'s answer for a device of this kind."""
    return {
        "strategy": "TPUStrategy" if device == "TPU" else "MirroredStrategy",
        "replicas": replicas,
        "device": device,
        "device_kind": kind,
        "tensorflow": "2.21.0",
        "libtpu": "not installed",
        "pjrt": "no PJRT (PJRT_DEVICE unset)",
    }


def test_a_tpu_that_reports_no_memory_is_said_so_never_a_share(monkeypatch):
    import tensorflow as tf

    def no_statistics(device):  # what a PJRT TPU replica's allocator answers
        raise ValueError("Allocator stats not available")

    monkeypatch.setattr(tf.config.experimental, "get_memory_info", no_statistics)
    memory = preflight.peak_memory(stand_in_strategy(8), hardware_of("TPU", "TPU v6e", 8))
    assert memory.peak is None and memory.fits()
    line = memory.line()
    assert line.startswith("not reported under PJRT") and "%" not in line and "GiB" not in line
    assert "the step compiled and ran at this batch" in line
    # the same with a device that is not a TPU, and with one that reports a peak of 0
    memory = preflight.peak_memory(stand_in_strategy(2, "GPU"), hardware_of("GPU", "NVIDIA L4"))
    assert memory.line().startswith("not reported by the device")
    monkeypatch.setattr(tf.config.experimental, "get_memory_info", lambda d: {"peak": 0})
    memory = preflight.peak_memory(stand_in_strategy(8), hardware_of("TPU", "TPU v6e", 8))
    assert memory.peak is None and "%" not in memory.line()


def test_a_reported_peak_says_it_counts_tensorflows_allocator(monkeypatch):
    import tensorflow as tf

    peaks = iter([2**30, 3 * 2**30])  # the largest replica's is shown
    monkeypatch.setattr(
        tf.config.experimental, "get_memory_info", lambda d: {"current": 0, "peak": next(peaks)}
    )
    memory = preflight.peak_memory(stand_in_strategy(2), hardware_of("TPU", "TPU v6e", 2))
    assert memory.peak == 3 * 2**30 and memory.capacity == 32 * 10**9
    assert memory.line() == (
        "3.00 GiB (the largest replica's peak in TensorFlow's allocator, get_memory_info) of "
        "29.8 GiB (a v6e chip's): 10%"
    )


def test_xlas_out_of_memory_report_is_one_line_with_both_figures(
    shards_dir, tokenizer_dir, tmp_path, monkeypatch
):
    import tensorflow as tf
    import tf_keras

    # XLA's wording (openxla/xla docs/errors/error_1000.md), over several lines as XLA prints it
    report = (
        "XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 49.34G of "
        "32.00G hbm. Exceeded hbm capacity by 17.34G.\\n\\nTotal hbm usage >= 49.59G:\\n"
    )

    def out_of_memory(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, report)

    monkeypatch.setattr(tf_keras.Model, "fit", out_of_memory)
    argv = run_flags(shards_dir, tokenizer_dir, tmp_path / "model", "--preflight")
    result = script_in_process("run_mlm.py", *argv)
    assert result.returncode == 1
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith("run_mlm.py: error: the batch does not fit on")
    assert "XLA's compiled step needs 49.34G of memory a replica, which has 32.00G" in line
    assert f"lower --per_replica_batch_size {BATCH_SIZE}" in line
    assert not (tmp_path / "model").exists()
    # the early abort's wording, in an error that carries the status only
    error = tf.errors.InternalError(
        None,
        None,
        "RESOURCE_EXHAUSTED: Compilation failure: Aborting compilation early because it's "
        "unlikely to have enough memory. Requires 3.84T, has 90.96G available.",
    )
    assert preflight.out_of_memory(error)
    line = preflight.out_of_memory_line(error, hardware_of("TPU", "TPU v5p"), "lower it")
    assert "needs 3.84T of memory a replica, which has 90.96G" in line


def test_the_projection_counts_the_whole_process():
    warmup = preflight.Phase("the warmup's 16-token pieces", None, 100, calls=2)
    full = preflight.Phase("full length", None, 300, calls=1)
    report = preflight.Report(
        hardware_of("CPU", "a CPU"),
        [
            (warmup, preflight.Timing(5.0, 0.1, 0.01, 50, extra=4.9, restart=0.5)),
            (full, preflight.Timing(2.0, 0.2, 0.02, 50, extra=1.8, restart=0.7)),
        ],
        preflight.Evaluation(None, 10, 3),
        preflight.Timing(1.0, 0.05, 0.0, 10, extra=0.95, restart=0.2),
        16,
        128,
        preflight.Memory(2**30, 2**34, "the process's peak", "the RAM"),
        preflight.Overheads(
            start=12.0, checkpoint_first=0.4, checkpoint_each=0.2, checkpoints=5, final_save=3.0
        ),
    )
    # by hand: warmup 100 x 0.1 + 4.9 + 1 restart x 0.5 = 15.4; full length 300 x 0.2 + 1.8 =
    # 61.8; evaluations 3 x 10 x 0.05 + 0.95 + 2 x 0.2 = 2.85; checkpoints 0.4 + 4 x 0.2 = 1.2
    assert report.training_seconds == pytest.approx(15.4 + 61.8)
    assert report.evaluation_seconds == pytest.approx(2.85)
    assert report.projected_seconds == pytest.approx(12 + 15.4 + 61.8 + 2.85 + 1.2 + 3)
    printed = "\n".join(report.lines())
    assert "then 0.2000 s a step (mean of 50, ± 0.0200); 300 steps in the run" in printed
    assert "projected run: 1.60 minutes" in printed  # 96.25 seconds
    assert "start 0.20, training 1.29, evaluations 0.05, 5 checkpoints 0.02" in printed
    # a start that could not be measured is said so, and counts nothing
    report.overheads = preflight.Overheads(start=None, final_save=None)
    assert report.projected_seconds == pytest.approx(15.4 + 61.8 + 2.85)
    assert "start unknown" in "\n".join(report.lines())
    assert "final save not timed" in "\n".join(report.lines())


def test_the_process_start_is_the_kernels():
    before = preflight.seconds_since_process_start()
    time.sleep(0.2)
    after = preflight.seconds_since_process_start()
    assert before > 0 and 0.1 < after - before < 1.0  # /proc's clocks tick every 10 ms


def test_checkpoints_are_counted_as_the_run_saves_them(
    shards_dir, tokenizer_dir, tmp_path, monkeypatch
):
    import tensorflow as tf

    saved = []
    save = tf.train.CheckpointManager.save

    def counted_save(manager, *args, **kwargs):
        saved.append(kwargs.get("checkpoint_number"))
        return save(manager, *args, **kwargs)

    monkeypatch.setattr(tf.train.CheckpointManager, "save", counted_save)
    argv = run_flags(
        shards_dir,
        tokenizer_dir,
        tmp_path / "model",
        max_steps=30,
        eval_steps=10,
        save_steps=7,
        steps_per_execution=2,
        short_sequence_length=8,
        short_sequence_ratio=0.5,
    )
    run_mlm.main(run_mlm.parse_args(argv))
    # by hand: fit() epochs end at 10, 15 (the warmup's end), 20 and 30; executions of 2 steps
    # cross a multiple of 7 at 8, 14, 22 and 28
    assert saved == [8, 10, 14, 15, 20, 22, 28, 30]
    assert preflight.checkpoint_count(30, 7, 10, phase_end=15, execution=2) == len(saved)
    assert preflight.checkpoint_count(30, 0, 10, phase_end=15, execution=2) == 4


def test_model_flops_and_their_utilization_by_hand():
    config = types.SimpleNamespace(
        model_type="roberta",
        hidden_size=128,
        num_hidden_layers=2,
        intermediate_size=512,
        vocab_size=4000,
    )
    flops, counts = preflight.training_flops(config, 128, 39)
    # layers: 2 x (4 x 128² + 2 x 128 x 512) = 393,216 weights, 6 FLOPs each a token; attention:
    # 12 x 2 x 128 x 128 a token; the head: 6 x (128² + 128 x 4,000) at 39 positions
    assert flops == 6 * 393_216 * 128 + 12 * 2 * 128 * 128 * 128 + 6 * 528_384 * 39
    assert "6 x 393,216 layer weights x 128 tokens" in counts
    assert preflight.training_flops(types.SimpleNamespace(model_type="modernbert"), 128, 39) is None

    # 8 v6e chips: 8 x 918 TFLOPs; a step of 3,672 TFLOPs a second is half of it
    hardware = hardware_of("TPU", "TPU v6e", 8)
    peak, peak_of = preflight.bf16_peak(hardware)
    assert peak == 8 * 918e12 and "918 TFLOPs" in peak_of
    phase = preflight.Phase("full length", None, 10)
    report = preflight.Report(
        hardware,
        [(phase, preflight.Timing(2.0, 0.5, 0.0, 50, extra=1.5))],
        None,
        None,
        256,
        512,
        preflight.Memory(None, None, "not reported under PJRT", ""),
        flops=preflight.Flops(1836e12, "a count", peak, peak_of),
    )
    assert report.utilization == pytest.approx(0.5)
    assert "a second: 50.0% of the peak (8 x 918 TFLOPs" in report.flops_line()
    # A GPU by its name: an A100's dense 312 TFLOPs; an L40S is in no table: unknown
    assert preflight.bf16_peak(hardware_of("GPU", "NVIDIA A100-SXM4-40GB", 2))[0] == 624e12
    peak, peak_of = preflight.bf16_peak(hardware_of("GPU", "NVIDIA L40S"))
    assert peak is None and "NVIDIA L40S" in peak_of
    report.hardware, report.flops.peak = hardware_of("GPU", "NVIDIA L40S"), None
    report.flops.peak_of = peak_of
    assert "utilization unknown" in report.flops_line()
    # the CPU: FLOPs a second only
    assert preflight.bf16_peak(hardware_of("CPU", "AMD EPYC")) == (None, "")
