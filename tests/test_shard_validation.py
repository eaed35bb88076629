"""A shard damaged where the checks before training cannot see is named when training meets it.

(Damage they can see, truncation and foreign token ids, is in test_run_mlm.py.)
"""

import json
import shutil

import pytest
from helpers import last_line, tiny_run_flags


@pytest.fixture
def shards_copy(shards_dir, tmp_path):
    copy = tmp_path / "shards"
    shutil.copytree(shards_dir, copy)
    return copy


def first_shard(split_dir):
    manifest = json.loads((split_dir / "manifest.json").read_text())
    return split_dir / manifest["shards"][0]["file"], manifest


def train(run_script, shards, tokenizer_dir, output_dir):
    args = tiny_run_flags(shards, tokenizer_dir, output_dir, per_replica_batch_size=8, num_epochs=1)
    return run_script("run_mlm.py", *args)


def test_a_shard_corrupted_inside_is_named_when_training_reaches_it(
    run_script, shards_copy, tokenizer_dir, tmp_path
):
    shard, _ = first_shard(shards_copy / "train")
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    # same size, first record intact: only reading it all finds out
    data[middle : middle + 16] = b"\xff" * 16
    shard.write_bytes(bytes(data))
    result = train(run_script, shards_copy, tokenizer_dir, tmp_path / "out")
    assert result.returncode == 1, result.stdout[-2000:]
    assert "Traceback" not in result.stderr
    line = last_line(result.stderr)
    assert line.startswith("run_mlm.py: error: ") and str(shard) in line and "corrupt" in line, (
        result.stderr[-3000:]
    )
    assert not (tmp_path / "out" / "config.json").exists()


def test_the_checks_before_training_look_each_shard_up_once(shards_dir, tokenizer, monkeypatch):
    """On gs:// every lookup is a round trip: read_manifest and check_shards share one stat() per
    shard (made many at a time), and no shard is also asked whether it exists."""
    import tensorflow as tf

    from mlm_pipeline import contract, shard_checks

    looked_up = []
    stat, exists = tf.io.gfile.stat, tf.io.gfile.exists
    monkeypatch.setattr(tf.io.gfile, "stat", lambda path: looked_up.append(path) or stat(path))
    monkeypatch.setattr(tf.io.gfile, "exists", lambda path: looked_up.append(path) or exists(path))
    named = contract.NamedTokenizer(tokenizer, "tok", "--tokenizer tok")
    train, evaluation = shard_checks.read_training_manifests(
        str(shards_dir / "train"), str(shards_dir / "validation"), named
    )
    shards = [*train["files"], *evaluation["files"]]
    assert len(train["files"]) > 1
    assert sorted(path for path in looked_up if path.endswith(".tfrecord")) == sorted(shards)
