"""Nothing reaches the Hub unless asked, no Hub token is printed or saved, remote code stays off by
default."""

import pytest
from fake_hub import FakeHub, use_fake_hub
from helpers import TINY_MODEL, VOCAB_SIZE, flags, mlm_flags

import prepare_tfrecord_shards
import run_mlm
import train_unigram

TOKEN = "hf_sentinelTokenThatMustNeverBeWrittenAnywhere"


@pytest.fixture
def fake_hub():
    """A loopback stand-in for the Hub (tests/fake_hub.py) that accepts TOKEN and records every
    request."""
    with FakeHub(TOKEN) as hub:
        yield hub


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        (train_unigram, ["--train_file", "t.txt", "--output_dir", "o"]),
        (
            prepare_tfrecord_shards,
            ["--train_file", "t.txt", "--tokenizer_name_or_path", "t", "--output_dir", "o"],
        ),
        (run_mlm, ["--train_dataset", "d", "--tokenizer", "t", "--output_dir", "o"]),
    ],
)
def test_remote_code_is_off_unless_asked_for(module, argv):
    def trust_remote_code(settings):  # run_mlm.py's is in its Model group, steps 1-2's in Data
        return (getattr(settings, "model", None) or settings.data).trust_remote_code

    assert trust_remote_code(module.parse_args(argv)) is False
    assert trust_remote_code(module.parse_args(argv + ["--trust_remote_code"])) is True


def test_the_pipeline_talks_to_no_hub_and_writes_no_token(
    run_script, corpus, fake_hub, tmp_path, monkeypatch
):
    # The subprocesses inherit a Hub at a loopback address that records every request, a token, and
    # online mode (conftest.py sets offline mode), so a request the scripts make would show.
    use_fake_hub(monkeypatch, fake_hub)
    tokenizer, shards, model = tmp_path / "tokenizer", tmp_path / "shards", tmp_path / "model"
    unigram = flags(train_file=corpus["train"], vocab_size=VOCAB_SIZE)
    steps = [
        ("train_unigram.py", *unigram, "--output_dir", tokenizer),
        (
            "prepare_tfrecord_shards.py",
            *flags(train_file=corpus["train"], tokenizer_name_or_path=tokenizer, max_length=32),
            *flags(output_dir=shards),
        ),
        (
            "run_mlm.py",
            *mlm_flags(shards / "train", tokenizer, model, config_overrides=TINY_MODEL),
            *flags(per_replica_batch_size=8, max_steps=2),
        ),
    ]
    for script, *args in steps:
        result = run_script(script, *args)
        assert result.returncode == 0, result.stderr[-3000:]
        assert TOKEN not in result.stdout and TOKEN not in result.stderr, script
    assert fake_hub.requests == []  # no push was asked for, and everything else is local
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert any(path.name == "tf_model.h5" for path in written)
    for path in written:
        assert TOKEN.encode() not in path.read_bytes(), path

    # A push that was asked for reaches the fake Hub, which sees the token in the Authorization
    # header only: not in the output, nor in a pushed file.
    pushed = run_script(
        "train_unigram.py",
        *unigram,
        *flags(output_dir=tmp_path / "pushed", push_to_hub=True, hub_model_id="tester/tokenizer"),
    )
    assert pushed.returncode == 0, pushed.stderr[-3000:]
    (commit,) = fake_hub.commits("tester/tokenizer")
    assert set(fake_hub.authorizations) == {f"Bearer {TOKEN}"}
    assert TOKEN not in pushed.stdout and TOKEN not in pushed.stderr
    for name, content in commit.files.items():
        assert TOKEN.encode() not in content, name
