"""README's "A mixture, in phases", run as written, as tests/test_walkthrough.py runs the other
walkthroughs: its commands are read from the README, so the section cannot drift from the code.

The only changes are the ones a test on a CPU needs, each named below: the texts are small files
written here; later flags shrink the shards, the steps and the evaluation to test size (a later
flag wins in argparse); a run from random weights gets a tiny shape, a branch keeps its parent's
(it may not change it). ModernBERT-base's config is a tiny stand-in of its kind in the Hugging Face
cache (tests/parent_models.py), as in tests/test_walkthrough_modernbert.py. Whatever else a command
says (the mixture and its weights, the named validation sets, the decay kept and branched from, the
1 - sqrt shape, the longer length and RoPE theta) runs as the README says it.
"""

import csv
import json
import os

from helpers import TINY_MODEL, VOCAB_SIZE, make_corpus_lines, run_command, subprocess_env
from parent_models import cache_as_hub_model, save_parent
from test_walkthrough import walkthrough_commands

HEADING = "## A mixture, in phases"
# Test size: the README's 128-token shards at 32 tokens, its 512-token ones at 64 (longer still).
SHARD_LENGTH = {"128": 32, "512": 64}
STEPS = ["--max_steps", 12, "--eval_steps", 4, "--max_eval_samples", 16]
RUN_MLM = ["--per_replica_batch_size", 4, *STEPS]


def at_test_size(script, arguments):
    """What the test adds to one of the section's commands."""
    if script == "train_unigram.py":
        return ["--vocab_size", VOCAB_SIZE]
    if script == "prepare_tfrecord_shards.py":
        length = arguments[arguments.index("--max_length") + 1]
        return ["--max_length", SHARD_LENGTH[length], "--shard_size", 40]
    assert script == "run_mlm.py", script
    if "--branch_from" in arguments:  # the parent's shape: a branch may not change it
        return RUN_MLM
    overrides = arguments[arguments.index("--config_overrides") + 1]
    if "global_rope_theta" in overrides:  # ModernBERT: the README's small shape, its RoPE theta
        return RUN_MLM
    return [*RUN_MLM, "--config_overrides", TINY_MODEL]


def write_texts(folder):
    """A general text and a domain's, each with a held-out file, as the section describes them."""
    for name, seed in (("general", 11), ("domain", 12)):
        lines = [line for line in make_corpus_lines(600, seed=seed) if line.strip()]
        if name == "domain":  # another domain: the same words, read backwards
            lines = [" ".join(reversed(line.split())) for line in lines]
        for part, chosen in (("text", lines[:500]), ("heldout", lines[500:])):
            (folder / part).mkdir(exist_ok=True)
            (folder / part / f"{name}.txt").write_text("\n".join(chosen) + "\n", encoding="utf-8")
    return lines


def rows_of(path):
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def test_the_mixture_in_phases_walkthrough_runs_as_written(tmp_path):
    commands = walkthrough_commands(HEADING, every_block=True)
    assert [script for script, _ in commands] == [
        "train_unigram.py",
        *["prepare_tfrecord_shards.py"] * 4,
        "run_mlm.py",  # the stable phase on the mixture, its decay included
        "run_mlm.py",  # another decay, branched from where the first one started
        *["prepare_tfrecord_shards.py"] * 2,
        "run_mlm.py",  # ModernBERT at the short length
        "run_mlm.py",  # ModernBERT branched to the longer length
    ]
    documents = write_texts(tmp_path)
    save_parent("modernbert", documents, tmp_path / "stand-in")
    hub_id = "answerdotai/ModernBERT-base"
    cache_as_hub_model(tmp_path / "stand-in", hub_id, os.environ["HF_HUB_CACHE"])
    env = subprocess_env()
    printed = {}
    for script, arguments in commands:
        result = run_command(
            script, *arguments, *at_test_size(script, arguments), env=env, cwd=tmp_path
        )
        assert result.returncode == 0, f"{script} {arguments}: {result.stderr[-3000:]}"
        assert "Traceback" not in result.stderr
        if script == "run_mlm.py":
            printed[arguments[arguments.index("--output_dir") + 1]] = result.stdout

    # The stable phase: each folder's share and passes said as it starts, each set scored by name.
    assert "general/train: 80.0% of the sequences" in printed["stable"]
    assert "domain/train: 20.0% of the sequences" in printed["stable"]
    stable = rows_of(tmp_path / "stable" / "training_log.csv")
    assert [int(row["step"]) for row in stable] == [4, 8, 12]
    for row in stable:
        assert row["val_loss"] == row["val_general_loss"]  # the first set is val_loss's
        assert float(row["val_domain_loss"]) > 0 and row["val_domain_loss"] != row["val_loss"]
        assert 0 <= float(row["val_domain_mask_token_accuracy"]) <= 1
    # the decay of 12 x 0.25 steps starts at step 9: its checkpoint kept, whatever rotation did
    assert (tmp_path / "stable/checkpoints/decay_start/ckpt-9.index").is_file()
    card = (tmp_path / "stable" / "README.md").read_text(encoding="utf-8")
    assert "share of the sequences" in card and "`domain`" in card

    # The decay branched from it: step 9 on, 12 more steps, the card naming its parent checkpoint.
    branch = rows_of(tmp_path / "domain-decay" / "training_log.csv")
    assert int(branch[0]["step"]) > 9 and int(branch[-1]["step"]) == 9 + 12
    assert all("val_domain_loss" in row for row in branch)
    assert "stable/checkpoints/decay_start/ckpt-9" in (
        tmp_path / "domain-decay" / "README.md"
    ).read_text(encoding="utf-8")
    assert "Resuming" not in printed["domain-decay"]

    # ModernBERT: the branch reads 64-token shards from a 32-token run, at the larger RoPE theta.
    stable_config = json.loads((tmp_path / "mb-stable" / "config.json").read_text())
    long_config = json.loads((tmp_path / "mb-long" / "config.json").read_text())
    assert stable_config["model_type"] == long_config["model_type"] == "modernbert"
    assert stable_config["global_rope_theta"] == 10000
    assert long_config["global_rope_theta"] == 160000
    assert long_config["max_position_embeddings"] >= SHARD_LENGTH["512"]
    assert long_config["hidden_size"] == stable_config["hidden_size"]
    manifest = json.loads((tmp_path / "general-512" / "train" / "manifest.json").read_text())
    assert manifest["max_length"] == SHARD_LENGTH["512"]
    long_rows = rows_of(tmp_path / "mb-long" / "training_log.csv")
    assert int(long_rows[-1]["step"]) == 9 + 12
