"""Nothing reaches the Hub unless asked, no Hub token is printed or saved, remote code stays off by default."""

import http.server
import threading

import pytest

import prepare_tfrecord_shards
import run_mlm
import train_unigram
from conftest import TINY_MODEL, VOCAB_SIZE

TOKEN = "hf_sentinelTokenThatMustNeverBeWrittenAnywhere"


@pytest.fixture
def fake_hub():
    """A loopback server standing in for the Hub: it answers 404 to everything and remembers each request."""
    requests = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def handle_one_request(self):
            super().handle_one_request()
            if self.requestline:
                requests.append(self.requestline)

        def do_GET(self):
            self.send_error(404)

        do_HEAD = do_POST = do_PUT = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", requests
    server.shutdown()


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        (train_unigram, ["--train_file", "t.txt", "--output_dir", "o"]),
        (prepare_tfrecord_shards, ["--train_file", "t.txt", "--tokenizer_name_or_path", "t", "--output_dir", "o"]),
        (run_mlm, ["--train_dataset", "d", "--tokenizer", "t", "--output_dir", "o"]),
    ],
)
def test_remote_code_is_off_unless_asked_for(module, argv):
    assert module.parse_args(argv).trust_remote_code is False
    assert module.parse_args(argv + ["--trust_remote_code"]).trust_remote_code is True


def test_the_pipeline_talks_to_no_hub_and_writes_no_token(run_script, corpus, fake_hub, tmp_path, monkeypatch):
    endpoint, requests = fake_hub
    # The subprocesses inherit these: a Hub at a loopback address that records every request, and a token.
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):  # conftest.py sets them
        monkeypatch.delenv(offline, raising=False)  # online, so a request the scripts make would show
    tokenizer, shards, model = tmp_path / "tokenizer", tmp_path / "shards", tmp_path / "model"
    steps = [
        ("train_unigram.py", "--train_file", corpus["train"], "--vocab_size", VOCAB_SIZE, "--output_dir", tokenizer),
        ("prepare_tfrecord_shards.py", "--train_file", corpus["train"], "--tokenizer_name_or_path", tokenizer,
         "--max_length", 32, "--output_dir", shards),
        ("run_mlm.py", "--no_tpu", "--train_dataset", shards / "train", "--tokenizer", tokenizer,
         "--output_dir", model, "--config_overrides", TINY_MODEL, "--per_replica_batch_size", 8, "--max_steps", 2),
    ]  # fmt: skip
    for script, *args in steps:
        result = run_script(script, *args)
        assert result.returncode == 0, result.stderr[-3000:]
        assert TOKEN not in result.stdout and TOKEN not in result.stderr, script
    assert requests == []  # no push was asked for, and everything else is local
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert any(path.name == "tf_model.h5" for path in written)
    for path in written:
        assert TOKEN.encode() not in path.read_bytes(), path

    # The fake Hub does see a push that was asked for, and the failure message does not echo the token.
    pushed = run_script(
        "train_unigram.py", "--train_file", corpus["train"], "--vocab_size", VOCAB_SIZE,
        "--output_dir", tmp_path / "pushed", "--push_to_hub", "--hub_model_id", "someone/tokenizer",
    )  # fmt: skip
    assert pushed.returncode == 1 and "pushing it to --hub_model_id someone/tokenizer failed" in pushed.stderr
    assert requests, "the push never reached the loopback Hub, so the check above proves nothing"
    assert TOKEN not in pushed.stdout and TOKEN not in pushed.stderr
