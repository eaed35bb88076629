"""README's "Your corpus on a TPU VM" and "Continue pretraining a model on your text", run as
written: their commands are read from the README, so the walkthroughs cannot drift from the code.

The only changes are the ones a test on a CPU needs, each named below: the bucket is a Cloud Storage
emulator's; later flags shrink the corpus, the tokenizer and the model to test size and put the run
on the CPU (a later flag wins in argparse); and step 4 reads a tiny labelled set in SST-2's layout
instead of SST-2 from the Hub. The second walkthrough's roberta-base is a tiny stand-in of
the same kind (tests/parent_models.py), put into the Hugging Face cache as if downloaded, which the
scripts read offline through the same code as the Hub. Whatever else a command says (gs:// globs of
.jsonl.gz files, --text_column, --eval_steps, --max_eval_samples, --bfloat16, gradient accumulation,
where each step writes) runs as the README says it.
"""

import csv
import gzip
import io
import json
import os
import re
import shlex

import pytest
from gcs_emulator import GcsEmulator
from helpers import (
    REPO,
    TINY_MODEL,
    VOCAB_SIZE,
    make_corpus_lines,
    run_command,
    subprocess_env,
    write_tsv,
)
from parent_models import cache_as_hub_model, save_parent

BUCKET = "walkthrough-bucket"
HEADING = "## Your corpus on a TPU VM"
CONTINUE_HEADING = "## Continue pretraining a model on your text"

# What a CPU test adds to each script's command, after the README's own flags.
TEST_SIZE = {
    "train_unigram.py": ["--vocab_size", VOCAB_SIZE],
    "prepare_tfrecord_shards.py": ["--max_length", 32, "--shard_size", 40],
    "run_mlm.py": [
        "--no_tpu",
        "--config_overrides",
        TINY_MODEL,
        "--per_replica_batch_size",
        4,
        "--max_steps",
        12,
        "--eval_steps",
        4,
        "--max_eval_samples",
        16,
        "--no_pytorch_export",
    ],
    # the classifier's PyTorch copy is held to transformers 5 in tests/test_classifier_export.py
    "run_classifier.py": ["--no_tpu", "--max_length", 32, "--num_epochs", 1, "--no_pytorch_export"],
}


def walkthrough_commands(heading=HEADING, every_block=False):
    """[(script, [arguments])] of the README section's shell block (`every_block`: of each of its
    shell blocks, in order), continuation lines joined and comments dropped."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert heading in readme, f"README.md has no section {heading!r}"
    section = readme.split(heading, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    block = "".join(blocks) if every_block else blocks[0]
    commands = []
    for command in block.replace("\\\n", " ").splitlines():
        if command.strip() and not command.lstrip().startswith("#"):
            words = shlex.split(command)
            assert words[0] == "python", f"not a python command: {command}"
            commands.append((words[1], words[2:]))
    return commands


def jsonl_gz(documents):
    rows = (json.dumps({"id": index, "text": text}) for index, text in enumerate(documents))
    return gzip.compress("".join(row + "\n" for row in rows).encode("utf-8"))


def upload_domain_corpus(gcs, seed):
    """The domain text both continued walkthroughs read, as their sections describe it: JSON lines,
    gzip-compressed, in gs://BUCKET/domain/ with a held-out file in domain-heldout/. Returns the
    documents."""
    documents = [line for line in make_corpus_lines(500, seed=seed) if line.strip()]
    for part in range(2):
        gcs.upload(BUCKET, f"domain/part-{part:05d}.jsonl.gz", jsonl_gz(documents[part::3]))
    gcs.upload(BUCKET, "domain-heldout/part-00000.jsonl.gz", jsonl_gz(documents[2::3]))
    return documents


def without_config_overrides(words):
    """A continued model keeps its own shape: the test-size words but --config_overrides."""
    at = words.index("--config_overrides")
    return words[:at] + words[at + 2 :]


def labelled_set(folder, documents):
    """SST-2's layout, for step 4: train.tsv and dev.tsv of short phrases labelled 0 or 1."""
    labelled = [(" ".join(line.split()[:8]), index % 2) for index, line in enumerate(documents)]
    train_tsv = write_tsv(folder / "train.tsv", labelled[:300])
    dev_tsv = write_tsv(folder / "dev.tsv", labelled[300:360])
    return ["--train_file", train_tsv, "--validation_file", dev_tsv]


def run_walkthrough(commands, test_size, env, folder):
    for script, arguments in commands:
        arguments = [word.replace("gs://BUCKET", f"gs://{BUCKET}") for word in arguments]
        result = run_command(script, *arguments, *test_size[script], env=env, cwd=folder)
        assert result.returncode == 0, f"{script}: {result.stderr[-3000:]}"
        assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    emulator = GcsEmulator(tmp_path_factory.mktemp("gcs_emulator")).start()
    try:
        emulator.create_bucket(BUCKET)
        yield emulator
    finally:
        emulator.stop()


def test_the_readme_walkthrough_runs_as_written(gcs, tmp_path):
    commands = walkthrough_commands()
    assert [script for script, _ in commands] == [
        "train_unigram.py",
        "prepare_tfrecord_shards.py",
        "prepare_tfrecord_shards.py",
        "run_mlm.py",
        "run_classifier.py",
    ]
    # The corpus as the section describes it: JSON lines, gzip-compressed, several files, with a
    # held-out file for validation.
    documents = [line for line in make_corpus_lines(700, seed=3) if line.strip()]
    for part in range(3):
        gcs.upload(BUCKET, f"corpus/part-{part:05d}.jsonl.gz", jsonl_gz(documents[part::4]))
    gcs.upload(BUCKET, "heldout/part-00000.jsonl.gz", jsonl_gz(documents[3::4]))
    test_size = {**TEST_SIZE}
    test_size["run_classifier.py"] = [
        *TEST_SIZE["run_classifier.py"],
        *labelled_set(tmp_path, documents),
    ]
    run_walkthrough(commands, test_size, gcs.env(base=subprocess_env()), tmp_path)

    # Step 1 wrote its tokenizer where step 2 and 3 look for it, beside the commands.
    assert (tmp_path / "tokenizer" / "tokenizer.json").is_file()
    shards = gcs.list_objects(BUCKET, "shards/")
    assert {"shards/train/manifest.json", "shards/validation/manifest.json"} <= set(shards)
    manifest = json.loads(gcs.download(BUCKET, "shards/train/manifest.json"))
    assert manifest["records"] > 0

    # Step 3 evaluated every --eval_steps steps: a row of training_log.csv at each.
    log = gcs.download(BUCKET, "roberta-base/training_log.csv").decode()
    rows = list(csv.DictReader(io.StringIO(log)))
    assert [int(row["step"]) for row in rows] == [4, 8, 12]
    assert all(float(row["val_loss"]) > 0 for row in rows)

    # Step 4 fine-tuned the pretrained model and scored it, in the bucket.
    scores = json.loads(gcs.download(BUCKET, "roberta-base-sst2/eval_results.json"))
    assert 0 <= scores["accuracy"] <= 1


def test_the_continued_pretraining_walkthrough_runs_as_written(gcs, tmp_path):
    commands = walkthrough_commands(CONTINUE_HEADING)
    assert [script for script, _ in commands] == [
        "prepare_tfrecord_shards.py",
        "prepare_tfrecord_shards.py",
        "run_mlm.py",
        "run_classifier.py",
    ]
    documents = upload_domain_corpus(gcs, seed=5)
    # roberta-base as a tiny model of its kind (byte-level BPE, <mask>, 32 positions), in the
    # session's Hugging Face cache (conftest.py: offline), where the scripts look it up
    parent = save_parent("roberta", documents, tmp_path / "stand-in")
    cache_as_hub_model(tmp_path / "stand-in", "roberta-base", os.environ["HF_HUB_CACHE"])
    test_size = {
        "prepare_tfrecord_shards.py": ["--max_length", 32, "--shard_size", 40],
        # no --config_overrides: the model's shape is roberta-base's (the stand-in's) own
        "run_mlm.py": without_config_overrides(TEST_SIZE["run_mlm.py"]),
        "run_classifier.py": [*TEST_SIZE["run_classifier.py"], *labelled_set(tmp_path, documents)],
    }
    run_walkthrough(commands, test_size, gcs.env(base=subprocess_env()), tmp_path)

    manifest = json.loads(gcs.download(BUCKET, "domain-shards/train/manifest.json"))
    assert manifest["tokenizer"] == "roberta-base"
    assert manifest["vocab_size"] == parent.config.vocab_size
    # before the first step, the stand-in as published; then every --eval_steps steps
    log = gcs.download(BUCKET, "roberta-domain/training_log.csv").decode()
    rows = list(csv.DictReader(io.StringIO(log)))
    assert [int(row["step"]) for row in rows] == [0, 4, 8, 12]
    card = gcs.download(BUCKET, "roberta-domain/README.md").decode()
    assert "base_model: roberta-base" in card
    config = json.loads(gcs.download(BUCKET, "roberta-domain/config.json"))
    assert config["hidden_size"] == parent.config.hidden_size  # the stand-in's shape, continued
    scores = json.loads(gcs.download(BUCKET, "roberta-domain-sst2/eval_results.json"))
    assert 0 <= scores["accuracy"] <= 1
