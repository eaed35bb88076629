"""Hub pushes over HTTP, against the real huggingface_hub client and a fake Hub on a loopback port.

What arrives in which commit: train_unigram.py's tokenizer in one commit; run_mlm.py's snapshot at
an epoch end while training goes on, then the final model, tokenizer and model card. A Hub that
cannot be used stops run_mlm.py before the model is built, with one line. Most tests run the
scripts' main() in this process (connected to the fake Hub for the test); one runs run_mlm.py as a
command.
"""

import csv
import hashlib
import json
import threading
import time

import pytest
from fake_hub import FakeHub, connect_this_process, disconnect_this_process, use_fake_hub
from helpers import VOCAB_SIZE, flags, last_line, tiny_run_flags

import run_mlm
import train_unigram
from mlm_pipeline import contract
from mlm_pipeline.hub_pusher import HubPusher

TOKEN = "hf_fakeHubTokenForTheseTestsOnly"
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
MODEL_FILES = {"config.json", "tf_model.h5"}
BATCH_SIZE = 16
# a generous bound: the held upload is released by training progress, not by time
HOLD_LIMIT_SECONDS = 120


@pytest.fixture
def connect(monkeypatch):
    """connect(hub): this process's huggingface_hub talks to `hub`, online, with TOKEN, until the
    test ends."""
    yield lambda hub: connect_this_process(monkeypatch, hub)
    disconnect_this_process()


def run_mlm_argv(shards_dir, tokenizer_dir, output_dir, *extra):
    named = {"per_replica_batch_size": BATCH_SIZE, "save_steps": 0}
    return tiny_run_flags(shards_dir, tokenizer_dir, output_dir, *extra, **named)


def training_log_rows(output_dir):
    path = output_dir / contract.TRAINING_LOG_NAME
    if not path.exists():
        return []
    with path.open() as file:
        return list(csv.DictReader(file))


def test_train_unigram_pushes_the_tokenizer_and_a_card_in_one_commit(connect, corpus, tmp_path):
    output_dir = tmp_path / "tokenizer"
    with FakeHub(TOKEN) as hub:
        connect(hub)
        argv = flags(train_file=corpus["train"], vocab_size=VOCAB_SIZE, output_dir=output_dir)
        tokenizer = train_unigram.main(
            train_unigram.parse_args(
                argv + ["--push_to_hub", "--hub_model_id", "unigram", "--hub_private"]
            )
        )
    (commit,) = hub.commits("tester/unigram")  # a bare name lands in the token owner's namespace
    assert set(commit.files) == TOKENIZER_FILES | {"README.md"}
    for name in TOKENIZER_FILES:
        assert commit.files[name] == (output_dir / name).read_bytes(), name
    card = commit.files["README.md"].decode()
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert f"A Unigram tokenizer of {len(tokenizer):,} tokens" in card
    assert 'from_pretrained("tester/unigram")' in card
    # The corpus by its file name: its absolute path would tell the world who trained it where.
    assert (
        f"by `train_unigram.py` on {corpus['train'].name} (" in card
        and str(tmp_path.parent) not in card
    )
    assert hub.repos["tester/unigram"]["private"] is True
    assert hub.unrouted == [] and set(hub.authorizations) == {f"Bearer {TOKEN}"}


def test_train_unigram_meets_an_unusable_hub_before_training(connect, corpus, tmp_path, capsys):
    output_dir = tmp_path / "tokenizer"
    with FakeHub(TOKEN, fail_with=500) as hub:
        connect(hub)
        argv = ["--train_file", str(corpus["train"]), "--output_dir", str(output_dir)]
        with pytest.raises(train_unigram.UsageError) as failure:
            train_unigram.main(
                train_unigram.parse_args(
                    argv + ["--push_to_hub", "--hub_model_id", "tester/unigram"]
                )
            )
    message = str(failure.value)
    assert (
        "\n" not in message
        and "--hub_model_id tester/unigram (HTTP 500 Internal Server Error" in message
    )
    assert "Training" not in capsys.readouterr().out and not output_dir.exists()


def test_run_mlm_pushes_epoch_snapshots_in_the_background_then_the_final_model(
    connect, shards_dir, tokenizer_dir, tokenizer, read_manifest, tmp_path, capsys
):
    output_dir = tmp_path / "model"
    held = {}

    def hold_the_first_commit_until_epoch_two_is_logged(repo_id, position):
        # The epoch-1 snapshot's commit stays unanswered until training has logged epoch 2. Were
        # pushes not in the background, training would wait for this answer and the two would wait
        # for each other.
        if position == 0:
            deadline = time.monotonic() + HOLD_LIMIT_SECONDS
            while len(training_log_rows(output_dir)) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            held["epochs logged on release"] = len(training_log_rows(output_dir))

    with FakeHub(TOKEN, before_commit=hold_the_first_commit_until_epoch_two_is_logged) as hub:
        connect(hub)
        argv = run_mlm_argv(
            shards_dir, tokenizer_dir, output_dir, "--num_epochs", 3, "--hub_model_id", "tester/mlm"
        )
        run_mlm.main(run_mlm.parse_args(argv))
    # epoch 2 ended while epoch 1's push was still uploading
    assert held == {"epochs logged on release": 2}

    # Epoch 1's snapshot, nothing at epoch 2 (its push was skipped: epoch 1's still
    # ran), then the final model.
    snapshot, final = hub.commits("tester/mlm")
    per_epoch = read_manifest(shards_dir / "train")["records"] // BATCH_SIZE
    assert f"Skipped the Hub push of step {2 * per_epoch}" in capsys.readouterr().out
    # The TF model, its tokenizer and card, and the PyTorch copy in a folder of its
    # own, as save() lays them out.
    names = {"config.json", *TOKENIZER_FILES, contract.PYTORCH_WEIGHTS_NAME}
    pytorch = {f"{contract.PYTORCH_DIR}/{name}" for name in names}
    published = MODEL_FILES | TOKENIZER_FILES | {"README.md"} | pytorch
    assert set(snapshot.files) == published and set(final.files) == published | {
        contract.CURVES_NAME
    }
    assert snapshot.message == f"Step {per_epoch} of {3 * per_epoch}"
    assert final.message.startswith("Final model:")
    assert "Training in progress" in snapshot.files["README.md"].decode()
    # two more epochs changed the weights
    assert snapshot.files["tf_model.h5"] != final.files["tf_model.h5"]

    # The final commit is the saved model: the same config, tokenizer and
    # card, and the same weights.
    for name in ("config.json", *TOKENIZER_FILES, "README.md", *pytorch, contract.CURVES_NAME):
        assert final.files[name] == (output_dir / name).read_bytes(), name
    pushed_weights = tmp_path / "pushed.h5"
    pushed_weights.write_bytes(final.files["tf_model.h5"])
    assert same_weights(pushed_weights, output_dir / "tf_model.h5")
    # LFS: not xet, not inline
    assert hashlib.sha256(final.files["tf_model.h5"]).hexdigest() in hub.lfs_uploads
    assert hub.unrouted == []

    # The card carries this run's numbers.
    card = final.files["README.md"].decode()
    last_epoch = training_log_rows(output_dir)[-1]
    steps = int(last_epoch["step"])
    train, validation = (
        read_manifest(shards_dir / "train"),
        read_manifest(shards_dir / "validation"),
    )
    metadata = (
        "---\nlibrary_name: transformers\npipeline_tag: fill-mask\n"
        "tags:\n- fill-mask\n- tensorflow\n"
    )
    assert card.startswith(metadata)
    assert "- pretrained-from-scratch\n" in card and "base_model" not in card
    assert "pretrained from scratch (random initial weights" in card
    recorded = (output_dir / contract.CHECKPOINT_DIR / contract.RUN_SETTINGS_NAME).read_text()
    assert json.loads(recorded)["model_name_or_path"] is None  # what a rerun must match
    assert "Training finished" in card
    assert (
        f"After {steps:,} steps, {steps * BATCH_SIZE * train['max_length']:,} tokens seen" in card
    )
    assert f"| {float(last_epoch['loss']):.4f} | {float(last_epoch['val_loss']):.4f} |" in card
    assert f"| {float(last_epoch['val_perplexity']):.2f} |" in card
    assert f"| {100 * float(last_epoch['val_mask_token_accuracy']):.2f}% |" in card
    assert f"| {train['records']:,} |" in card and f"| {validation['records']:,} |" in card
    assert f"{len(tokenizer):,} tokens in its vocabulary" in card and "| 1 / 32 / 2 |" in card
    assert 'pipeline("fill-mask", model="tester/mlm"' in card


def test_run_mlm_pushes_a_snapshot_at_each_evaluation_of_eval_steps(
    connect, shards_dir, tokenizer_dir, tmp_path
):
    import tf_keras

    total, eval_steps = 10, 4
    with FakeHub(TOKEN) as hub:
        connect(hub)

        class WaitForEachPush(tf_keras.callbacks.Callback):
            # after the pusher's callback: the snapshot lands before training goes on, so that no
            # push is skipped for a slow upload
            def on_epoch_end(self, epoch, logs=None):
                step = int(self.model.optimizer.iterations.numpy())
                deadline = time.monotonic() + HOLD_LIMIT_SECONDS
                while step < total and len(hub.commits("tester/mlm")) < step // eval_steps:
                    assert time.monotonic() < deadline, f"no snapshot of step {step}"
                    time.sleep(0.05)

        argv = run_mlm_argv(
            shards_dir,
            tokenizer_dir,
            tmp_path,
            *("--max_steps", total, "--eval_steps", eval_steps, "--no_pytorch_export"),
            *("--hub_model_id", "tester/mlm"),
        )
        run_mlm.main(run_mlm.parse_args(argv), callbacks=[WaitForEachPush()])
    # a snapshot after each evaluation but the last, which the final model covers
    messages = [commit.message for commit in hub.commits("tester/mlm")]
    assert messages[:-1] == ["Step 4 of 10", "Step 8 of 10"]
    assert messages[-1].startswith("Final model:")
    assert [int(row["step"]) for row in training_log_rows(tmp_path)] == [4, 8, 10]


def test_the_model_card_names_local_folders_by_their_base_names_only(
    shards_dir, tokenizer_dir, tmp_path
):
    # Every local path here is absolute, under the test session's temporary folder; a card is meant
    # to be published, so none of them may reach it, whether as shard folders, tokenizer, the corpus
    # the shards were made from (their manifests' source) or, with no --hub_model_id, the model in
    # the usage snippet.
    output_dir = tmp_path / "model"
    run_mlm.main(
        run_mlm.parse_args(run_mlm_argv(shards_dir, tokenizer_dir, output_dir, "--max_steps", 2))
    )
    card = (output_dir / contract.MODEL_CARD_NAME).read_text()
    session_folder = str(tmp_path.parent)  # holds tmp_path and every session fixture's folder
    assert session_folder not in card
    assert (
        "| train | `train` | train.txt |" in card
        and "| evaluation | `validation` | validation.txt |" in card
    )
    assert f"Tokenizer: `{tokenizer_dir.name}`" in card
    assert (
        'pipeline("fill-mask", model="model",' in card
        and 'from_pretrained("model", subfolder=' in card
    )


def same_weights(first, second):
    import h5py
    import numpy as np

    def arrays(path):
        found = {}

        def keep(name, item):
            if isinstance(item, h5py.Dataset):
                found[name] = item[()]

        with h5py.File(path, "r") as file:
            file.visititems(keep)
        return found

    left, right = arrays(first), arrays(second)
    return left.keys() == right.keys() and all(
        np.array_equal(left[name], right[name]) for name in left
    )


def test_a_failed_final_push_is_one_line_and_the_model_stays_saved(
    connect, shards_dir, tokenizer_dir, tmp_path
):
    output_dir = tmp_path / "model"
    with FakeHub(TOKEN, fail_with=500, fail_when=lambda request: "/commit/" in request) as hub:
        connect(hub)
        argv = run_mlm_argv(
            shards_dir, tokenizer_dir, output_dir, "--max_steps", 2, "--hub_model_id", "tester/mlm"
        )
        with pytest.raises(run_mlm.UsageError) as failure:
            run_mlm.main(run_mlm.parse_args(argv))
    message = str(failure.value)
    assert "\n" not in message and message.startswith(
        f"the model is saved in {output_dir}, but pushing it"
    )
    assert "HTTP 500" in message and "hf upload tester/mlm" in message
    assert {"tf_model.h5", "config.json", "README.md"} <= {
        path.name for path in output_dir.iterdir()
    }
    assert hub.commits("tester/mlm") == []


# seconds: --hub_push_timeout for the stuck pushes below, ample for a tiny model's files to reach
# the held commit on loopback; the held push is the only one that waits on it
PUSH_TIMEOUT = 5


@pytest.mark.parametrize(
    ("extra", "what_happened"),
    [
        (["--max_steps", 2], f"did not finish within {PUSH_TIMEOUT} s"),
        (
            ["--num_epochs", 2],
            f"did not start: an epoch's snapshot was still uploading after {PUSH_TIMEOUT} s",
        ),
    ],
    ids=["final-push-stuck", "epoch-snapshot-stuck"],
)
def test_a_stuck_final_push_gives_up_in_one_line_and_the_model_stays_saved(
    run_script, shards_dir, tokenizer_dir, tmp_path, monkeypatch, extra, what_happened
):
    output_dir = tmp_path / "model"
    reached, released, returned = threading.Event(), threading.Event(), threading.Event()

    def hold_the_first_commit(repo_id, position):
        # The first commit (the final model's with one epoch, epoch 1's snapshot with two) gets no
        # answer until the test has seen the run end: the upload is stuck, as on a link that stalls.
        # The bound only keeps a broken test from hanging; a run that waited for the answer would
        # end well after it, pushed.
        if position == 0:
            reached.set()
            released.wait(HOLD_LIMIT_SECONDS)
            returned.set()

    with FakeHub(TOKEN, before_commit=hold_the_first_commit) as hub:
        use_fake_hub(monkeypatch, hub)
        argv = run_mlm_argv(
            shards_dir,
            tokenizer_dir,
            output_dir,
            *extra,
            "--hub_model_id",
            "tester/mlm",
            "--hub_push_timeout",
            PUSH_TIMEOUT,
        )
        try:
            result = run_script("run_mlm.py", *argv)
            # The run ended while its upload was still held: it did not wait for it, and the
            # upload's daemon thread did not keep the process alive.
            assert reached.is_set() and not returned.is_set()
        finally:
            released.set()
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert last_line(result.stderr) == (
        f"run_mlm.py: error: the model is saved in {output_dir}, but pushing it to --hub_model_id "
        f"tester/mlm {what_happened} (--hub_push_timeout); push it later with `hf upload "
        f"tester/mlm {output_dir} --exclude 'checkpoints/*'`."
    )
    # the abandoned upload says nothing after that line
    assert "warning: the Hub push" not in result.stderr
    assert "Pushed" not in result.stdout
    # The model is complete: what a run saves, config.json (written last) included.
    saved = {str(path.relative_to(output_dir)) for path in output_dir.rglob("*") if path.is_file()}
    model = MODEL_FILES | TOKENIZER_FILES | {contract.MODEL_CARD_NAME, contract.CURVES_NAME}
    assert model | {f"{contract.PYTORCH_DIR}/{contract.PYTORCH_WEIGHTS_NAME}"} <= saved, saved


def hub_pusher_args(repo_id):
    argv = flags(train_dataset="d", tokenizer="t", output_dir="o", hub_model_id=repo_id)
    return run_mlm.parse_args(argv)


def hub_pusher(settings):
    """The pusher run_mlm.main() makes for these settings, before any model or tokenizer exists."""
    output = settings.output
    return HubPusher(
        output.hub_model_id,
        output.hub_private,
        output.output_dir,
        save_model=None,
        card=None,
    )


@pytest.mark.parametrize(
    ("hub_settings", "client_token", "repo_id", "expected"),
    [
        (
            {"fail_with": 500},
            TOKEN,
            "tester/mlm",
            "(HTTP 500 Internal Server Error: the fake Hub fails this request",
        ),
        ({}, TOKEN, "someone-else/mlm", "(HTTP 403 Forbidden: You don't have the rights"),
        (
            {},
            "hf_someOtherToken",
            "tester/mlm",
            "(HTTP 401 Unauthorized: Invalid username or password.",
        ),
    ],
    ids=["hub-failing", "namespace-not-writable", "token-refused"],
)
def test_a_hub_that_cannot_be_used_is_one_line_at_start(
    connect, monkeypatch, hub_settings, client_token, repo_id, expected
):
    with FakeHub(TOKEN, **hub_settings) as hub:
        connect(hub)
        monkeypatch.setenv("HF_TOKEN", client_token)
        with pytest.raises(run_mlm.UsageError) as failure:
            hub_pusher(hub_pusher_args(repo_id))
    message = str(failure.value)
    assert "\n" not in message and expected in message
    assert message.startswith(
        f"could not create or find the Hub repository --hub_model_id {repo_id} "
    )
    assert hub.requests[0] == "POST /api/repos/create" and hub.commits(repo_id) == []


def test_no_hub_token_is_one_line_before_any_request(connect, monkeypatch):
    with FakeHub(TOKEN) as hub:
        connect(hub)
        monkeypatch.delenv("HF_TOKEN")  # and conftest.py's HF_HOME holds no saved login
        with pytest.raises(
            run_mlm.UsageError, match=r"needs a Hub token with write access: run `hf auth login`"
        ):
            hub_pusher(hub_pusher_args("tester/mlm"))
    assert hub.requests == []


def test_run_mlm_stops_before_the_model_when_the_hub_fails(
    run_script, shards_dir, tokenizer_dir, tmp_path, monkeypatch
):
    output_dir = tmp_path / "model"
    with FakeHub(TOKEN, fail_with=500) as hub:
        use_fake_hub(monkeypatch, hub)
        argv = run_mlm_argv(shards_dir, tokenizer_dir, output_dir, "--hub_model_id", "tester/mlm")
        result = run_script("run_mlm.py", *argv)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    message = last_line(result.stderr)
    assert message.startswith(
        "run_mlm.py: error: could not create or find the Hub repository --hub_model_id "
    )
    assert "tester/mlm (HTTP 500 Internal Server Error" in message
    assert "Training" not in result.stdout  # stopped before the model was built
    assert not (output_dir / "checkpoints").exists()  # and before anything was written
    assert TOKEN not in result.stdout + result.stderr


def refused_as_read(argv, capsys):
    """The one line run_mlm.py's command line `argv` is refused with, as it is read (exit 1)."""
    with pytest.raises(SystemExit) as refusal:
        run_mlm.parse_args(argv)
    assert refusal.value.code == 1
    (line,) = capsys.readouterr().err.splitlines()
    return line


@pytest.mark.parametrize("repo_id", ["tester/has space", "a/b/c", "tester/double--dash"])
def test_a_malformed_hub_model_id_is_refused_before_any_work(repo_id, capsys):
    argv = flags(train_dataset="d", tokenizer="t", output_dir="o", hub_model_id=repo_id)
    line = refused_as_read(argv, capsys)
    assert line.startswith(
        f"run_mlm.py: error: --hub_model_id {repo_id} is not a Hub repository id"
    )


def test_hub_private_without_a_repository_is_refused(capsys):
    argv = ["--train_dataset", "d", "--tokenizer", "t", "--output_dir", "o", "--hub_private"]
    assert "--hub_private needs --hub_model_id" in refused_as_read(argv, capsys)
