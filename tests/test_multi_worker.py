"""Several hosts: each input pipeline reads shard files of its own, and two worker processes on
loopback train in lockstep under MultiWorkerMirroredStrategy, seeing every training sequence once
per epoch, the chief alone writing."""

import json
import socket
import subprocess
import sys

import numpy as np
import pytest
from helpers import MAX_LENGTH, REPO, flags, subprocess_env

import run_mlm
from mlm_pipeline import contract, hosts

PER_REPLICA = 7
SHARD_SIZE = 161  # the session corpus's 322 train sequences make two equal shards: one per worker
EPOCHS = 2

# Runs run_mlm.main() as one worker of the cluster TF_CONFIG describes, then saves what the test
# compares: its final weights, and the sequences its input pipeline yields in epoch 0, rebuilt from
# the very arguments main() passed to build_dataset() (masked positions restored from their labels).
WORKER = """
import json, os, sys
import numpy as np
import run_mlm
from mlm_pipeline import masked_lm_data

calls = []
build_dataset = masked_lm_data.build_dataset
def recording_build_dataset(*args, **kwargs):
    calls.append((args, kwargs))
    return build_dataset(*args, **kwargs)
masked_lm_data.build_dataset = recording_build_dataset

trainer, _ = run_mlm.main(run_mlm.parse_args(json.loads(os.environ["WORKER_ARGV"])))
args, kwargs = next((args, kwargs) for args, kwargs in calls if kwargs["training"])
kwargs.update(start_epoch=0, start_batch=0)
sequences = []
for features, labels in build_dataset(*args, **kwargs).take(kwargs["batches_per_epoch"]):
    ids, labels = features["input_ids"].numpy(), labels.numpy()
    positions = features["masked_positions"].numpy()
    for row in range(len(ids)):
        scored = labels[row] != -100
        ids[row, positions[row][scored]] = labels[row][scored]
    sequences.append(ids)
weights = trainer.masked_lm.weights
weights = {f"weight_{index}": weight.numpy() for index, weight in enumerate(weights)}
np.savez(os.environ["WORKER_RESULT"], sequences=np.concatenate(sequences), **weights)
"""


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("localhost", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


@pytest.fixture(scope="module")
def equal_shards(corpus, tokenizer_dir, tmp_path_factory):
    import prepare_tfrecord_shards as prepare

    output_dir = tmp_path_factory.mktemp("equal_shards")
    argv = [
        "--train_file",
        str(corpus["train"]),
        "--split",
        "train",
        "--tokenizer_name_or_path",
        str(tokenizer_dir),
        "--max_length",
        str(MAX_LENGTH),
        "--shard_size",
        str(SHARD_SIZE),
        "--output_dir",
        str(output_dir),
    ]
    manifest = prepare.main(prepare.parse_args(argv))
    assert [shard["records"] for shard in manifest["shards"]] == [SHARD_SIZE, SHARD_SIZE]
    assert SHARD_SIZE % PER_REPLICA == 0
    return output_dir / "train"


@pytest.fixture(scope="module")
def cluster(equal_shards, shards_dir, tokenizer_dir, tiny_model, tmp_path_factory):
    """Two worker processes of one cluster on loopback, run to the end; their outputs and
    results."""
    folder = tmp_path_factory.mktemp("cluster")
    addresses = [f"localhost:{port}" for port in free_ports(2)]
    argv = flags(
        multi_worker=True,
        train_dataset=equal_shards,
        eval_dataset=equal_shards,
        tokenizer=tokenizer_dir,
        output_dir=folder / "model",
        seed=0,
        config_overrides=tiny_model,
        per_replica_batch_size=PER_REPLICA,
        num_epochs=EPOCHS,
        save_steps=10,
        average_last=2,  # every worker averages the chief's checkpoints and evaluates the average
    )
    workers = []
    for index in range(2):
        # each worker's temporary files, to check what it leaves behind
        scratch = folder / f"tmp{index}"
        scratch.mkdir()
        env = subprocess_env()
        env.update(
            PYTHONPATH=str(REPO),
            TMPDIR=str(scratch),
            WORKER_ARGV=json.dumps(argv),
            WORKER_RESULT=str(folder / f"worker{index}.npz"),
            TF_CONFIG=json.dumps(
                {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
            ),
        )
        log = open(folder / f"worker{index}.log", "w")
        workers.append(
            (
                subprocess.Popen(
                    [sys.executable, "-c", WORKER], cwd=folder, env=env, stdout=log, stderr=log
                ),
                log,
            )
        )
    for process, log in workers:
        process.wait(timeout=600)
        log.close()
    logs = [(folder / f"worker{index}.log").read_text() for index in range(2)]
    for (process, _), text in zip(workers, logs):
        assert process.returncode == 0, text[-3000:]
    results = [dict(np.load(folder / f"worker{index}.npz")) for index in range(2)]
    return {"folder": folder, "logs": logs, "results": results}


def test_the_workers_train_in_lockstep(cluster):
    first, second = cluster["results"]
    names = sorted(name for name in first if name.startswith("weight_"))
    assert names and names == sorted(name for name in second if name.startswith("weight_"))
    for name in names:
        np.testing.assert_array_equal(first[name], second[name])
    steps = EPOCHS * SHARD_SIZE // PER_REPLICA
    assert f"Finished: {steps:,} steps" in cluster["logs"][0]
    assert f"Worker done after {steps} steps" in cluster["logs"][1]
    # the weights compared are the average's, made alike on both (the chief's last two checkpoints)
    for log in cluster["logs"]:
        assert f"Averaged the weights of the last 2 checkpoints, steps 40 and {steps}:" in log


def test_together_the_workers_see_every_sequence_once_per_epoch(
    cluster, equal_shards, read_manifest, read_records
):
    files = [equal_shards / shard["file"] for shard in read_manifest(equal_shards)["shards"]]
    every_sequence = sorted(map(tuple, read_records(files)))
    first, second = (result["sequences"] for result in cluster["results"])
    assert len(first) == len(second) == SHARD_SIZE
    assert sorted(map(tuple, np.concatenate([first, second]).tolist())) == every_sequence
    # Each worker reads a shard file of its own.
    assert {tuple(row) for row in first.tolist()}.isdisjoint(tuple(row) for row in second.tolist())


def test_the_chief_alone_writes(cluster):
    folder = cluster["folder"]
    model = folder / "model"
    for name in (
        "config.json",
        "tf_model.h5",
        "tokenizer.json",
        contract.TRAINING_LOG_NAME,
        contract.CURVES_NAME,
    ):
        assert (model / name).is_file(), name
    checkpoints = sorted(path.name for path in (model / contract.CHECKPOINT_DIR).iterdir())
    assert "checkpoint" in checkpoints and any(name.startswith("ckpt-") for name in checkpoints)
    # one event file: the chief's
    assert len(list((model / contract.TENSORBOARD_DIR).iterdir())) == 1
    assert (model / contract.LAST_STEP_DIR / "config.json").is_file()  # --average_last
    # The other worker saved its checkpoints into a scratch folder of its own
    # and removed it at the end.
    assert list((folder / "tmp1").iterdir()) == []
    rows = (model / contract.TRAINING_LOG_NAME).read_text().strip().splitlines()
    assert len(rows) == 1 + EPOCHS  # a header and one row per epoch, written once


def test_more_hosts_than_shard_files_is_refused():
    manifest = {"files": ["a", "b", "c"], "shards": [{"records": 100}] * 3}
    with pytest.raises(run_mlm.UsageError, match="has 3 shard file.*4 hosts.*at least 4 shards"):
        hosts.split_between_pipelines(manifest, "--train_dataset", 4, 8)


def test_an_epoch_lasts_as_long_as_the_smallest_pipeline():
    manifest = {
        "files": ["a", "b", "c", "d", "e"],
        "shards": [{"records": count} for count in (100, 100, 100, 100, 30)],
    }
    files, steps = hosts.split_between_pipelines(manifest, "--train_dataset", 2, 8)
    assert files == [["a", "c", "e"], ["b", "d"]]
    assert steps == 200 // 8


@pytest.mark.parametrize(
    ("tf_config", "needle"),
    [(None, "--multi_worker needs TF_CONFIG"), ('{"cluster": {}}', "does not say which task")],
)
def test_multi_worker_needs_a_usable_tf_config(
    tf_config, needle, run_script, shards_dir, tokenizer_dir, monkeypatch, tmp_path
):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    if tf_config is not None:
        monkeypatch.setenv("TF_CONFIG", tf_config)
    args = flags(train_dataset=shards_dir / "train", tokenizer=tokenizer_dir)
    result = run_script("run_mlm.py", "--multi_worker", *args, "--output_dir", tmp_path / "model")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("run_mlm.py: error: ") and needle in result.stderr
    assert not (tmp_path / "model").exists()
