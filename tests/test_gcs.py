"""gs:// paths end to end, offline: shards, training, checkpoints, resuming and the saved model on a
Cloud Storage emulator (tests/gcs_emulator.py), and one clear line, soon, when Cloud Storage cannot
be reached.

Every script runs as a subprocess: TensorFlow's gs:// filesystem reads where to send requests from
the environment once per process, and this test process keeps its own untouched for the other tests.
"""

import json
import re
import socket
import subprocess

import pytest
from gcs_emulator import GcsEmulator
from helpers import (
    MAX_LENGTH,
    TINY_MODEL,
    flags,
    kill_when,
    mlm_flags,
    prepare_flags,
    run_command,
    start_script,
    subprocess_env,
)

from mlm_pipeline import contract, gcs_probe, storage

BUCKET = "test-bucket"
BATCH_SIZE = 32  # few steps to an epoch, so the run crosses an epoch end soon
SAVE_STEPS = 5
# seconds; a run that hangs on Cloud Storage fails the test instead of the whole suite
SCRIPT_TIMEOUT = 300
# Generous next to the few seconds the probe takes, far below the minutes
# TensorFlow's own retries would take.
UNREACHABLE_TIMEOUT = 120


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """A Cloud Storage emulator with one empty bucket, for this module's scripts to write to and
    read from."""
    emulator = GcsEmulator(tmp_path_factory.mktemp("gcs_emulator")).start()
    try:
        emulator.create_bucket(BUCKET)
        yield emulator
    finally:
        emulator.stop()


def run_on(gcs, script, *args, timeout=SCRIPT_TIMEOUT, proxy_url=None):
    """Run a root script whose gs:// paths lead to the emulator (through `proxy_url`, if given)."""
    env = gcs.env(base=subprocess_env(), proxy_url=proxy_url)
    return run_command(script, *args, env=env, timeout=timeout)


def training_args(tokenizer_dir, output_dir, *extra):
    return mlm_flags(
        f"gs://{BUCKET}/shards/train",
        tokenizer_dir,
        output_dir,
        *extra,
        eval_dataset=f"gs://{BUCKET}/shards/validation",
        config_overrides=TINY_MODEL,
        per_replica_batch_size=BATCH_SIZE,
        save_steps=SAVE_STEPS,
        shuffle_buffer_size=64,
    )


@pytest.fixture(scope="module")
def gcs_shards(gcs, corpus, tokenizer_dir):
    """gs://test-bucket/shards/{train,validation}, written by prepare_tfrecord_shards.py (both
    splits at once)."""
    env = gcs.env(base=subprocess_env())
    output_dir = f"gs://{BUCKET}/shards"
    processes = {
        split: start_script(
            "prepare_tfrecord_shards.py",
            *prepare_flags(corpus, tokenizer_dir, split, output_dir),
            env=env,
            stdout=subprocess.PIPE,
        )
        for split in ("train", "validation")
    }
    for split, process in processes.items():
        stdout, stderr = process.communicate(timeout=SCRIPT_TIMEOUT)
        assert process.returncode == 0, stderr[-3000:]
        assert f"to {output_dir}/{split}" in stdout
    return "shards"


def test_prepare_writes_the_same_shards_to_gcs_as_to_a_local_folder(gcs, gcs_shards, shards_dir):
    local = {
        str(path.relative_to(shards_dir)): path.read_bytes()
        for path in sorted(shards_dir.rglob("*"))
        if path.is_file()
    }
    # Objects named like folders ("shards/train/") are how TensorFlow's
    # makedirs() marks folders on gs://.
    arrived = [
        name for name in gcs.list_objects(BUCKET, f"{gcs_shards}/") if not name.endswith("/")
    ]
    # Nothing else: no temporary shard or manifest left behind, and the manifest and
    # every shard byte for byte.
    assert sorted(name.removeprefix(f"{gcs_shards}/") for name in arrived) == sorted(local), arrived
    for name, content in local.items():
        assert gcs.download(BUCKET, f"{gcs_shards}/{name}") == content, name
    manifest = json.loads(local["train/manifest.json"])
    assert len(manifest["shards"]) > 1 and manifest["records"] == sum(
        shard["records"] for shard in manifest["shards"]
    )


def test_beam_reads_a_glob_in_the_bucket_and_writes_there_what_one_local_process_writes(
    gcs, corpus, tokenizer_dir, tmp_path
):
    """prepare --runner on gs:// paths, as on Dataflow (here Beam's DirectRunner, two worker
    processes): the workers list, seek into and read the corpus's objects and write the shards and
    manifest.json with Beam's own Cloud Storage client; the launcher checks and clears the split
    with TensorFlow's. The single process reads the same glob of objects (with TensorFlow's client),
    and both write the same bytes."""
    lines = corpus["train"].read_bytes().splitlines(keepends=True)
    third = len(lines) // 3
    for name, data in {
        "part-1.txt": b"".join(lines[:third]),
        "part-0.txt": b"".join(lines[third:]),
    }.items():
        gcs.upload(BUCKET, f"corpus/{name}", data)
    common = flags(
        train_file=f"gs://{BUCKET}/corpus/part-*.txt",
        tokenizer_name_or_path=tokenizer_dir,
        max_length=MAX_LENGTH,
        shard_size=40,
        rows_per_block=60,
    )
    local = run_on(gcs, "prepare_tfrecord_shards.py", *common, "--output_dir", tmp_path / "local")
    assert local.returncode == 0, local.stderr[-3000:]
    beam = flags(
        runner="DirectRunner", direct_num_workers=2, direct_running_mode="multi_processing"
    )
    written = run_on(
        gcs, "prepare_tfrecord_shards.py", *common, "--output_dir", f"gs://{BUCKET}/beam", *beam
    )
    assert written.returncode == 0, written.stderr[-3000:]
    assert written.stderr.strip() == "", "Beam's and TensorFlow's logs are held back"

    local_files = [path for path in (tmp_path / "local").rglob("*") if path.is_file()]
    expected = {
        str(path.relative_to(tmp_path / "local")): path.read_bytes() for path in local_files
    }
    arrived = [name for name in gcs.list_objects(BUCKET, "beam/") if not name.endswith("/")]
    assert sorted(name.removeprefix("beam/") for name in arrived) == sorted(expected)
    for name, content in expected.items():
        assert gcs.download(BUCKET, f"beam/{name}") == content, name
    assert json.loads(expected["train/manifest.json"])["blocks"] > 2


def latest_checkpoint_step(gcs, run):
    """The step of the newest checkpoint the `checkpoint` state object names, or None before the
    first."""
    name = f"{run}/{contract.CHECKPOINT_DIR}/checkpoint"
    if name not in gcs.list_objects(BUCKET, name):
        return None
    match = re.search(
        r'^model_checkpoint_path: "ckpt-(\d+)"', gcs.download(BUCKET, name).decode(), re.M
    )
    return int(match.group(1)) if match else None


def kill_once_in_bucket(process, gcs, name):
    """SIGKILL, no warning, as soon as the object `name` has arrived in the bucket."""
    kill_when(
        process,
        lambda: name in gcs.list_objects(BUCKET, name),
        f"{name} in the bucket",
        timeout=SCRIPT_TIMEOUT,
        pause=0.05,
    )


def test_training_on_gcs_checkpoints_resumes_and_saves_a_loadable_model(
    gcs, gcs_shards, tokenizer_dir, tokenizer, tmp_path
):
    manifest = json.loads(gcs.download(BUCKET, f"{gcs_shards}/train/manifest.json"))
    per_epoch = manifest["records"] // BATCH_SIZE
    # the kill lands early in the second epoch; the run ends inside it
    total = per_epoch + SAVE_STEPS + 2
    run = "run"
    args = training_args(
        tokenizer_dir, f"gs://{BUCKET}/{run}", "--num_epochs", 2, "--max_steps", total
    )
    env = gcs.env(base=subprocess_env())

    process = start_script("run_mlm.py", *args, env=env)
    # Killed once the first epoch is over: its checkpoint and its row of the
    # training log are in the bucket.
    kill_once_in_bucket(process, gcs, f"{run}/{contract.TRAINING_LOG_NAME}")
    saved_step = latest_checkpoint_step(gcs, run)
    assert per_epoch <= saved_step < total
    assert f"{run}/config.json" not in gcs.list_objects(BUCKET, run)  # not a finished model

    # The same command again: it finds the checkpoint on gs://, resumes there and finishes.
    rerun = run_command("run_mlm.py", *args, env=env, timeout=SCRIPT_TIMEOUT)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    checkpoints = f"gs://{BUCKET}/{run}/{contract.CHECKPOINT_DIR}"
    assert (
        f"Resuming from {checkpoints}/ckpt-{saved_step} at step {saved_step} of {total}."
        in rerun.stdout
    )
    assert f"Finished: {total:,} steps" in rerun.stdout

    objects = gcs.list_objects(BUCKET, f"{run}/")
    names = {name.removeprefix(f"{run}/") for name in objects}
    model_files = {
        "config.json",
        "tf_model.h5",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }
    model_files |= {
        f"{contract.PYTORCH_DIR}/{name}"
        for name in ("config.json", "tokenizer.json", "model.safetensors")
    }
    model_files |= {contract.CURVES_NAME, "README.md"}
    assert model_files <= names, names
    assert all(objects[f"{run}/{name}"] > 0 for name in model_files)
    # no staging left
    assert not [name for name in names if ".saving-" in name or name.endswith(".tmp")], names
    assert latest_checkpoint_step(gcs, run) == total
    assert f"{contract.CHECKPOINT_DIR}/ckpt-{total}.index" in names
    assert f"{contract.CHECKPOINT_DIR}/{contract.RUN_SETTINGS_NAME}" in names
    # One row per epoch: the killed run wrote the first, its rerun appended the second (an append on
    # gs:// rewrites the whole object). its usage snippet loads a folder, not gs://
    card = gcs.download(BUCKET, f"{run}/README.md").decode()
    assert f"# first: gsutil -m cp -r gs://{BUCKET}/{run} ." in card and f'model="{run}"' in card
    assert f'"gs://{BUCKET}/{run}", ' not in card
    log = gcs.download(BUCKET, f"{run}/{contract.TRAINING_LOG_NAME}").decode().splitlines()
    assert [row.split(",")[0] for row in log[1:]] == ["0", "1"], log

    from transformers import pipeline

    fill_mask = pipeline(
        "fill-mask",
        model=str(gcs.download_folder(BUCKET, run, tmp_path / "downloaded")),
        dtype=None,
    )
    assert type(fill_mask.model).__name__ == "TFRobertaForMaskedLM"
    assert fill_mask.model.config.vocab_size == len(tokenizer) == len(fill_mask.tokenizer)
    assert len(fill_mask("the river [MASK] the city.", top_k=3)) == 3

    # A phase branched from one of its checkpoints in the bucket (--branch_from gs://...), into a
    # folder of its own: the checkpoint and its run's settings read from Cloud Storage.
    parent = f"{checkpoints}/ckpt-{saved_step}"
    branch_dir = tmp_path / "branch"
    args = training_args(tokenizer_dir, str(branch_dir), "--branch_from", parent, "--max_steps", 2)
    branch = run_command("run_mlm.py", *args, env=env, timeout=SCRIPT_TIMEOUT)
    assert branch.returncode == 0, branch.stderr[-3000:]
    assert f"Branching from {parent} at step {saved_step:,}" in branch.stdout
    assert f"Finished: {saved_step + 2:,} steps" in branch.stdout
    assert f"{run}/{contract.CHECKPOINT_DIR}/ckpt-{saved_step}" in (
        branch_dir / contract.MODEL_CARD_NAME
    ).read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------------------
# Cloud Storage out of reach: one line, within the probe's bound, whichever
# flag holds the gs:// path.


@pytest.fixture(scope="module")
def closed_port():
    """A loopback port that refuses connections: bound, so nothing else takes it, but not
    listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as unused:
        unused.bind(("127.0.0.1", 0))
        yield unused.getsockname()[1]


UNREACHABLE_CASES = [
    pytest.param(
        "prepare_tfrecord_shards.py",
        "--train_file {corpus} --tokenizer_name_or_path {tokenizer} --output_dir "
        "gs://{bucket}/unreachable",
        "--output_dir gs://{bucket}/unreachable",
        id="prepare --output_dir",
    ),
    pytest.param(
        "run_mlm.py",
        "--no_tpu --train_dataset gs://{bucket}/shards/train --tokenizer {tokenizer} --output_dir "
        "{out}",
        "--train_dataset gs://{bucket}/shards/train",
        id="run_mlm --train_dataset",
    ),
    pytest.param(
        "run_mlm.py",
        "--no_tpu --train_dataset {local_shards}/train --tokenizer {tokenizer} --output_dir "
        "gs://{bucket}/unreachable",
        "--output_dir gs://{bucket}/unreachable",
        id="run_mlm --output_dir",
    ),
]


def refused_in_one_line(result, script, *needles):
    assert result.returncode == 1, f"exit {result.returncode}; stderr: {result.stderr[-3000:]}"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: "), result.stderr[-3000:]
    assert "Traceback" not in lines[0] and "libcurl" not in lines[0], lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


@pytest.mark.parametrize("script, arguments, named", UNREACHABLE_CASES)
def test_unreachable_gcs_fails_fast_in_one_line(
    gcs, closed_port, script, arguments, named, corpus, tokenizer_dir, shards_dir, tmp_path
):
    names = {
        "bucket": BUCKET,
        "corpus": corpus["train"],
        "tokenizer": tokenizer_dir,
        "local_shards": shards_dir,
        "out": tmp_path / "out",
    }
    args = [word.format(**names) for word in arguments.split()]
    # No proxy listens there: every request TensorFlow makes fails at once, as with no network.
    # Without the probe, TensorFlow's retries would take minutes and end in a traceback
    # (UNREACHABLE_TIMEOUT catches that).
    result = run_on(
        gcs, script, *args, proxy_url=f"http://127.0.0.1:{closed_port}", timeout=UNREACHABLE_TIMEOUT
    )
    refused_in_one_line(
        result, script, named.format(**names), "cannot be reached", f"127.0.0.1 port {closed_port}"
    )
    assert not (tmp_path / "out").exists()
    assert not gcs.list_objects(BUCKET, "unreachable")


def test_gcs_refusing_access_is_named_with_what_to_do(gcs, shards_dir, tokenizer_dir, tmp_path):
    # Cloud Storage answers 401 to a request without valid credentials, 403 to
    # an account without rights.
    refusing_proxy = gcs.start_proxy(refuse_with=403)
    evaluation = f"gs://{BUCKET}/shards/validation"
    args = [
        "--no_tpu",
        "--train_dataset",
        shards_dir / "train",
        "--eval_dataset",
        evaluation,
        "--tokenizer",
        tokenizer_dir,
        "--output_dir",
        tmp_path / "out",
    ]
    result = run_on(gcs, "run_mlm.py", *args, proxy_url=refusing_proxy, timeout=UNREACHABLE_TIMEOUT)
    line = refused_in_one_line(
        result, "run_mlm.py", f"--eval_dataset {evaluation}", "refused access", "403"
    )
    assert "GOOGLE_APPLICATION_CREDENTIALS" in line
    assert not (tmp_path / "out").exists()


READ_ONLY_CASES = [
    pytest.param(
        "prepare_tfrecord_shards.py",
        "--train_file {corpus} --tokenizer_name_or_path {tokenizer} --output_dir {output_dir}",
        id="prepare",
    ),
    pytest.param(
        "run_mlm.py",
        "--no_tpu --train_dataset {local_shards}/train --tokenizer {tokenizer} --output_dir "
        "{output_dir}",
        id="run_mlm",
    ),
]


@pytest.mark.parametrize("script, arguments", READ_ONLY_CASES)
def test_an_output_that_may_be_read_but_not_written_is_refused_before_any_work(
    gcs, script, arguments, corpus, tokenizer_dir, shards_dir
):
    # An account that may read the bucket but not write to it: every lookup succeeds, every
    # upload or delete gets 403. Reading alone would let the run start, and fail at its
    # first save, maybe hours later.
    read_only_proxy = gcs.start_proxy(refuse_writes_with=403)
    output_dir = f"gs://{BUCKET}/read-only"
    names = dict(
        corpus=corpus["train"],
        tokenizer=tokenizer_dir,
        local_shards=shards_dir,
        output_dir=output_dir,
    )
    args = [word.format(**names) for word in arguments.split()]
    result = run_on(gcs, script, *args, proxy_url=read_only_proxy, timeout=UNREACHABLE_TIMEOUT)
    refused_in_one_line(
        result,
        script,
        f"--output_dir {output_dir}: Cloud Storage refused to create an object there",
        "403",
        f"permission to create and delete objects in gs://{BUCKET}",
        "or choose another --output_dir",
    )
    assert result.stdout == ""  # stopped before any work: no tokenizing, no "Training ..." line
    assert not gcs.list_objects(BUCKET, "read-only")


def test_a_missing_bucket_is_named_instead_of_waited_for(gcs, shards_dir, tokenizer_dir, tmp_path):
    # Without the probe this run would never end: TensorFlow's makedirs() asks
    # about the bucket over and over.
    output_dir = "gs://no-such-bucket/run"
    args = mlm_flags(shards_dir / "train", tokenizer_dir, output_dir)
    result = run_on(gcs, "run_mlm.py", *args, timeout=UNREACHABLE_TIMEOUT)
    refused_in_one_line(
        result, "run_mlm.py", f"--output_dir {output_dir}", "gs://no-such-bucket does not exist"
    )


def test_unigram_refuses_a_gcs_output_instead_of_writing_a_local_gs_folder(corpus, tmp_path):
    # Saved with the local filesystem, gs://bucket/tokenizer would become the folder
    # ./gs:/bucket/tokenizer.
    output_dir = "gs://bucket/tokenizer"
    args = ["--train_file", corpus["train"], "--vocab_size", 100, "--output_dir", output_dir]
    result = run_command("train_unigram.py", *args, cwd=tmp_path, timeout=120)
    refused_in_one_line(result, "train_unigram.py", f"--output_dir {output_dir}", "local")
    assert list(tmp_path.iterdir()) == []


# The probe itself (mlm_pipeline/gcs_probe.py), imported and run here on local paths, which
# TensorFlow's file system takes as it takes gs:// ones: what it prints is what storage.py reads.
# For a local path the probe's "bucket" is the path's first two folders.


def test_the_probe_passes_a_writable_folder_and_leaves_no_object_there(tmp_path, capsys):
    gcs_probe.main([storage.WRITE_PROBE_PREFIX, f"r:{tmp_path}", f"w:{tmp_path}"])
    assert capsys.readouterr().out == ""
    assert list(tmp_path.iterdir()) == []


def test_the_probe_reports_the_first_output_that_takes_no_object_in_one_json_line(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    unwritable = f"{blocker}/run"
    paths = [f"w:{tmp_path}", f"w:{unwritable}", "r:/no-such-folder/at-all/run"]
    gcs_probe.main([storage.WRITE_PROBE_PREFIX, *paths])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines  # the probe stops at the first failure
    failure = json.loads(lines[0])
    assert failure["path"] == unwritable and failure["step"] == "create", failure
    assert failure["error"].endswith("Error") and failure["left"] is None, failure
    error = str(storage.probe_failure(failure, "--output_dir"))
    assert error.startswith(f"--output_dir {unwritable}: writing a test object there failed (")


def test_the_probe_names_a_missing_bucket(capsys):
    gcs_probe.main([storage.WRITE_PROBE_PREFIX, "r:/no-such-folder/at-all/run"])
    failure = json.loads(capsys.readouterr().out)
    assert failure["step"] == "read" and failure["error"] == "NoSuchBucket", failure
    error = str(storage.probe_failure(failure, "--train_dataset"))
    assert "the bucket /no-such-folder/at-all does not exist" in error


def test_the_probe_names_the_object_a_refused_delete_left(tmp_path, monkeypatch):
    import tensorflow as tf

    def refuse(path):
        raise tf.errors.PermissionDeniedError(None, None, "403 Forbidden")

    monkeypatch.setattr(tf.io.gfile, "remove", refuse)
    failure = gcs_probe.first_failure([f"w:{tmp_path}"], storage.WRITE_PROBE_PREFIX)
    [left] = tmp_path.iterdir()
    assert left.name.startswith(storage.WRITE_PROBE_PREFIX)
    assert failure == {
        "path": str(tmp_path),
        "step": "delete",
        "error": "PermissionDeniedError",
        "message": "403 Forbidden",
        "left": str(left),
    }
    error = str(storage.probe_failure(failure, "--output_dir"))
    assert "refused to delete it (403 Forbidden)" in error and error.endswith(f"remove {left}.")
