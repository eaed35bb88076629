"""README's "ModernBERT" section, run as written, as tests/test_walkthrough.py runs the other
walkthroughs (and with its helpers): a file of its own, so that the suite's two workers share the
walkthroughs. ModernBERT-base is a tiny stand-in of its kind, made by transformers 5
(tests/parent_models.py) and put into the Hugging Face cache as if downloaded.
"""

import csv
import io
import json
import os

from helpers import subprocess_env
from parent_models import cache_as_hub_model, save_parent
from test_walkthrough import (  # noqa: F401 (gcs: the Cloud Storage emulator fixture)
    BUCKET,
    TEST_SIZE,
    gcs,
    labelled_set,
    run_walkthrough,
    upload_domain_corpus,
    walkthrough_commands,
    without_config_overrides,
)

MODERNBERT_HEADING = "## ModernBERT"


def test_the_modernbert_walkthrough_runs_as_written(gcs, tmp_path):  # noqa: F811 (the fixture)
    """ModernBERT-base as a tiny stand-in of its kind (transformers 5 made it: PyTorch safetensors,
    byte-level BPE with [MASK], local and global layers, 64 positions), in the Hugging Face cache:
    measured by the preflight, continued, then its architecture from random weights, then
    fine-tuned."""
    commands = walkthrough_commands(MODERNBERT_HEADING)
    assert [script for script, _ in commands] == [
        "prepare_tfrecord_shards.py",
        "prepare_tfrecord_shards.py",
        "run_mlm.py",  # the preflight, which writes nothing
        "run_mlm.py",
        "run_mlm.py",
        "run_classifier.py",
    ]
    documents = upload_domain_corpus(gcs, seed=7)
    save_parent("modernbert", documents, tmp_path / "stand-in")
    hub_id = "answerdotai/ModernBERT-base"
    cache_as_hub_model(tmp_path / "stand-in", hub_id, os.environ["HF_HUB_CACHE"])
    # The PyTorch copy stays on: transformers 5 loads it (tests/test_pytorch_export.py).
    run_mlm = [word for word in TEST_SIZE["run_mlm.py"] if word != "--no_pytorch_export"]
    test_size = {
        "prepare_tfrecord_shards.py": ["--max_length", 32, "--shard_size", 40],
        "run_mlm.py": without_config_overrides(run_mlm),
        "run_classifier.py": [*TEST_SIZE["run_classifier.py"], *labelled_set(tmp_path, documents)],
    }
    run_walkthrough(commands, test_size, gcs.env(base=subprocess_env()), tmp_path)

    manifest = json.loads(gcs.download(BUCKET, "mb-shards/train/manifest.json"))
    assert manifest["tokenizer"] == hub_id
    for run, first_step in (("modernbert-domain", 0), ("modernbert-scratch", 4)):
        log = gcs.download(BUCKET, f"{run}/training_log.csv").decode()
        rows = list(csv.DictReader(io.StringIO(log)))
        assert [int(row["step"]) for row in rows][0] == first_step  # step 0: the parent's figures
        config = json.loads(gcs.download(BUCKET, f"{run}/pytorch/config.json"))
        assert config["model_type"] == "modernbert"
        assert f"{run}/pytorch/model.safetensors" in gcs.list_objects(BUCKET, f"{run}/")
    card = gcs.download(BUCKET, "modernbert-domain/README.md").decode()
    assert f"base_model: {hub_id}" in card
    scores = json.loads(gcs.download(BUCKET, "modernbert-domain-sst2/eval_results.json"))
    assert 0 <= scores["accuracy"] <= 1
