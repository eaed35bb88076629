"""gs:// paths end to end, offline: shards, training, checkpoints, resuming and the saved model on a Cloud Storage
emulator (tests/gcs_emulator.py).

Every script runs as a subprocess: TensorFlow's gs:// filesystem reads where to send requests from the
environment once per process, and this test process keeps its own untouched for the other tests.
"""

import json
import re
import signal
import subprocess
import sys
import time

import pytest

import run_mlm
from conftest import MAX_LENGTH, REPO, SHARD_SIZE, TINY_MODEL, subprocess_env
from gcs_emulator import GcsEmulator

BUCKET = "test-bucket"
BATCH_SIZE = 32  # few steps to an epoch, so the run crosses an epoch end soon
SAVE_STEPS = 5
SCRIPT_TIMEOUT = 300  # seconds; a run that hangs on Cloud Storage fails the test instead of the whole suite


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """A Cloud Storage emulator with one empty bucket, for this module's scripts to write to and read from."""
    emulator = GcsEmulator(tmp_path_factory.mktemp("gcs_emulator")).start()
    try:
        emulator.create_bucket(BUCKET)
        yield emulator
    finally:
        emulator.stop()


def script_command(script, *args):
    return [sys.executable, str(REPO / script), *[str(arg) for arg in args]]


def prepare_args(corpus, tokenizer_dir, split, output_dir):
    shard_size = SHARD_SIZE if split == "train" else 10000  # as the shards_dir fixture writes them
    return [
        f"--{split}_file", corpus[split],
        "--split", split,
        "--tokenizer_name_or_path", tokenizer_dir,
        "--max_length", MAX_LENGTH,
        "--shard_size", shard_size,
        "--output_dir", output_dir,
    ]  # fmt: skip


def training_args(tokenizer_dir, output_dir, *extra):
    return [
        "--no_tpu",
        "--train_dataset", f"gs://{BUCKET}/shards/train",
        "--eval_dataset", f"gs://{BUCKET}/shards/validation",
        "--tokenizer", tokenizer_dir,
        "--output_dir", output_dir,
        "--config_overrides", TINY_MODEL,
        "--per_replica_batch_size", BATCH_SIZE,
        "--save_steps", SAVE_STEPS,
        "--shuffle_buffer_size", 64,
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def gcs_shards(gcs, corpus, tokenizer_dir):
    """gs://test-bucket/shards/{train,validation}, written by prepare_tfrecord_shards.py (both splits at once)."""
    env = gcs.env(base=subprocess_env())
    output_dir = f"gs://{BUCKET}/shards"
    commands = {
        split: script_command("prepare_tfrecord_shards.py", *prepare_args(corpus, tokenizer_dir, split, output_dir))
        for split in ("train", "validation")
    }
    processes = {
        split: subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for split, command in commands.items()
    }
    for split, process in processes.items():
        stdout, stderr = process.communicate(timeout=SCRIPT_TIMEOUT)
        assert process.returncode == 0, stderr[-3000:]
        assert f"to {output_dir}/{split}" in stdout
    return "shards"


def test_prepare_writes_the_same_shards_to_gcs_as_to_a_local_folder(gcs, gcs_shards, shards_dir):
    local = {
        str(path.relative_to(shards_dir)): path.read_bytes() for path in sorted(shards_dir.rglob("*")) if path.is_file()
    }
    # Objects named like folders ("shards/train/") are how TensorFlow's makedirs() marks folders on gs://.
    arrived = [name for name in gcs.list_objects(BUCKET, f"{gcs_shards}/") if not name.endswith("/")]
    # Nothing else: no temporary shard or manifest left behind, and the manifest and every shard byte for byte.
    assert sorted(name.removeprefix(f"{gcs_shards}/") for name in arrived) == sorted(local), arrived
    for name, content in local.items():
        assert gcs.download(BUCKET, f"{gcs_shards}/{name}") == content, name
    manifest = json.loads(local["train/manifest.json"])
    assert len(manifest["shards"]) > 1 and manifest["records"] == sum(shard["records"] for shard in manifest["shards"])


def latest_checkpoint_step(gcs, run):
    """The step of the newest checkpoint the `checkpoint` state object names, or None before the first."""
    name = f"{run}/{run_mlm.CHECKPOINT_DIR}/checkpoint"
    if name not in gcs.list_objects(BUCKET, name):
        return None
    match = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', gcs.download(BUCKET, name).decode(), re.M)
    return int(match.group(1)) if match else None


def kill_once_in_bucket(process, gcs, name):
    """SIGKILL, no warning, as soon as the object `name` has arrived in the bucket."""
    try:
        deadline = time.monotonic() + SCRIPT_TIMEOUT
        while name not in gcs.list_objects(BUCKET, name):
            assert process.poll() is None, process.stderr.read()[-3000:]
            assert time.monotonic() < deadline, f"no {name} in the bucket within {SCRIPT_TIMEOUT} s"
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
        process.stderr.close()


def test_training_on_gcs_checkpoints_resumes_and_saves_a_loadable_model(
    gcs, gcs_shards, tokenizer_dir, tokenizer, tmp_path
):
    manifest = json.loads(gcs.download(BUCKET, f"{gcs_shards}/train/manifest.json"))
    per_epoch = manifest["records"] // BATCH_SIZE
    total = per_epoch + SAVE_STEPS + 2  # the kill lands early in the second epoch; the run ends inside it
    run = "run"
    args = training_args(tokenizer_dir, f"gs://{BUCKET}/{run}", "--num_epochs", 2, "--max_steps", total)
    command, env = script_command("run_mlm.py", *args), gcs.env(base=subprocess_env())

    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # Killed once the first epoch is over: its checkpoint and its row of the training log are in the bucket.
    kill_once_in_bucket(process, gcs, f"{run}/{run_mlm.TRAINING_LOG_NAME}")
    saved_step = latest_checkpoint_step(gcs, run)
    assert per_epoch <= saved_step < total
    assert f"{run}/config.json" not in gcs.list_objects(BUCKET, run)  # not a finished model

    # The same command again: it finds the checkpoint on gs://, resumes there and finishes.
    rerun = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    checkpoints = f"gs://{BUCKET}/{run}/{run_mlm.CHECKPOINT_DIR}"
    assert f"Resuming from {checkpoints}/ckpt-{saved_step} at step {saved_step} of {total}." in rerun.stdout
    assert f"after {total} steps" in rerun.stdout

    objects = gcs.list_objects(BUCKET, f"{run}/")
    names = {name.removeprefix(f"{run}/") for name in objects}
    model_files = {"config.json", "tf_model.h5", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    assert model_files <= names, names
    assert all(objects[f"{run}/{name}"] > 0 for name in model_files)
    assert not [name for name in names if ".saving-" in name or name.endswith(".tmp")], names  # no staging left
    assert latest_checkpoint_step(gcs, run) == total
    assert f"{run_mlm.CHECKPOINT_DIR}/ckpt-{total}.index" in names
    assert f"{run_mlm.CHECKPOINT_DIR}/{run_mlm.RUN_SETTINGS_NAME}" in names
    # One row per epoch: the killed run wrote the first, its rerun appended the second (an append on gs://
    # rewrites the whole object).
    log = gcs.download(BUCKET, f"{run}/{run_mlm.TRAINING_LOG_NAME}").decode().splitlines()
    assert [row.split(",")[0] for row in log[1:]] == ["0", "1"], log

    from transformers import TFAutoModelForMaskedLM, pipeline

    local_copy = gcs.download_folder(BUCKET, run, tmp_path / "downloaded")
    model = TFAutoModelForMaskedLM.from_pretrained(str(local_copy))
    assert model.config.vocab_size == len(tokenizer)
    predictions = pipeline("fill-mask", model=str(local_copy), dtype=None)("the river [MASK] the city.", top_k=3)
    assert len(predictions) == 3
