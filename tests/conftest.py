"""Shared fixtures: a tiny deterministic corpus, a tokenizer and TFRecord shards built once per
session. What tests share besides fixtures (sizes, flags, running a script) is in helpers.py.

Everything runs offline: nothing is fetched from the Hub, and the Hugging Face caches point into
pytest's temporary folder so that the tests never write into the user's cache.
"""

import atexit
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Before TensorFlow, transformers or datasets are imported anywhere (the root
# scripts import them lazily).
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
# TensorFlow's TPU build (requirements-tpu.txt) would otherwise ask the TPU
# metadata server for minutes first.
os.environ.setdefault("TPU_LOAD_LIBRARY", "0")


# helpers.py and the package's contract and tf_startup load the standard library only, so none
# of the libraries above is loaded yet; tf_startup also lets transformers see TensorFlow's TPU
# build (requirements-tpu.txt) in this process, as the scripts do in theirs.
from helpers import (  # noqa: E402
    MAX_LENGTH,
    TINY_MODEL,
    VOCAB_SIZE,
    flags,
    labelled_rows,
    make_corpus_lines,
    prepare_flags,
    read_lines,
    run_command,
    write_lines,
    write_tsv,
)

from mlm_pipeline import contract, tf_startup  # noqa: E402, F401

# The files that take longest, longest first (each file's total of its tests' durations, as pytest
# reports them). run_tests.sh hands whole files to one worker per core in this order
# (--no-loadscope-reorder): started last, one of these would leave the other worker idle for
# minutes at the end of the run.
LONGEST_FILES = (
    "test_benchmarks.py",
    "test_gcs.py",
    "test_run_mlm.py",
    "test_recipe.py",
    "test_corpus_formats.py",
    "test_walkthrough.py",
    "test_walkthrough_modernbert.py",
    "test_walkthrough_phases.py",
    "test_requirements.py",
    "test_hub.py",
    "test_resume.py",
    "test_smoke.py",
    "test_mixture.py",
    "test_preflight.py",
    "test_multi_worker.py",
    "test_branching.py",
    "test_pytorch_export.py",
    "test_modernbert.py",
    "test_prepare_shards.py",
    "test_run_classifier.py",
    "test_classifier_export.py",
    "test_prepare_crash.py",
    "test_continued_pretraining.py",
    "test_eval_steps.py",
    "test_validation_sets.py",
    "test_prepare_beam.py",
    "test_security.py",
)


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)

    items.sort(key=rank)  # a stable sort: within a file, and among the rest, the order stays


def isolate_hf_cache():
    """Point every Hugging Face cache into a temporary folder of this process, removed at its exit.
    The libraries read these variables once, when they load, and test modules load them as they are
    collected (the engine's modules import transformers at their top), so this runs as conftest.py
    itself loads, before any test module."""
    loaded = [
        name for name in ("huggingface_hub", "datasets", "transformers") if name in sys.modules
    ]
    assert not loaded, f"{loaded} were imported before the cache could be redirected"
    home = Path(tempfile.mkdtemp(prefix="pytest-hf-home-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    os.environ["HF_HOME"] = str(home)
    os.environ["HF_DATASETS_CACHE"] = str(home / "datasets")
    os.environ["HF_HUB_CACHE"] = str(home / "hub")
    return home


HF_HOME = isolate_hf_cache()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """train.txt and validation.txt of a small, deterministic corpus."""
    folder = tmp_path_factory.mktemp("corpus")
    return {
        "train": write_lines(folder / "train.txt", make_corpus_lines(420, seed=0)),
        "validation": write_lines(folder / "validation.txt", make_corpus_lines(110, seed=1)),
    }


@pytest.fixture(scope="session")
def tokenizer_dir(corpus, tmp_path_factory):
    import train_unigram

    output_dir = tmp_path_factory.mktemp("tokenizer")
    argv = flags(train_file=corpus["train"], vocab_size=VOCAB_SIZE, output_dir=output_dir)
    train_unigram.main(train_unigram.parse_args(argv))
    return output_dir


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.fixture(scope="session")
def shards_dir(corpus, tokenizer_dir, tmp_path_factory):
    """<dir>/train (several shards) and <dir>/validation (one shard), both of MAX_LENGTH tokens."""
    import prepare_tfrecord_shards as prepare

    output_dir = tmp_path_factory.mktemp("shards")
    for split in ("train", "validation"):
        prepare.main(prepare.parse_args(prepare_flags(corpus, tokenizer_dir, split, output_dir)))
    return output_dir


@pytest.fixture(scope="session")
def labelled(tmp_path_factory):
    """run_classifier.py's task: {"train": train.tsv, "validation": dev.tsv}, SST-2's layout
    (sentence, label), the label carried by a word (helpers.labelled_rows)."""
    folder = tmp_path_factory.mktemp("labelled")
    return {
        "train": write_tsv(folder / "train.tsv", labelled_rows(800, seed=0)),
        "validation": write_tsv(folder / "dev.tsv", labelled_rows(100, seed=1)),
    }


@pytest.fixture(scope="session")
def bad_inputs(corpus, tokenizer_dir, shards_dir, tmp_path_factory):
    """Good and bad files the bad-input cases (tests/refusals.py) point at, by the names their
    commands use in {braces}."""
    folder = tmp_path_factory.mktemp("bad_inputs")
    good = corpus["train"].read_bytes()
    # a Latin-1 line after a whole corpus: found after shards are written
    not_utf8 = folder / "latin1.txt"
    not_utf8.write_bytes(good + "Un café au lait.\n".encode("latin-1") + good)
    zero_bytes = folder / "zero.txt"
    zero_bytes.write_bytes(b"")
    word_document = folder / "corpus.docx"
    word_document.write_bytes(good)
    a_file = folder / "a_file"
    a_file.write_text("a file where a folder should be\n")
    empty_folder = folder / "empty_folder"
    empty_folder.mkdir()
    split_is_a_file = folder / "split_is_a_file"  # an output folder whose train/ cannot be made
    split_is_a_file.mkdir()
    (split_is_a_file / "train").write_text("a file where the split's folder should be\n")
    return {
        "corpus": corpus["train"],
        "corpus_folder": corpus["train"].parent,
        "tokenizer": tokenizer_dir,
        "shards": shards_dir,
        "train_shards": shards_dir / "train",
        "not_utf8": not_utf8,
        "not_utf8_line": len(read_lines(corpus["train"])) + 1,
        "blank_lines": write_lines(folder / "blank.txt", ["", "   ", "", "\t", ""]),
        "zero_bytes": zero_bytes,
        "word_document": word_document,
        "a_file": a_file,
        "empty_folder": empty_folder,
        "split_is_a_file": split_is_a_file,
    }


@pytest.fixture(scope="session")
def tiny_model():
    """--config_overrides for a model small enough to train in seconds on a CPU."""
    return TINY_MODEL


@pytest.fixture(scope="session")
def read_manifest():
    def read(split_dir):
        return json.loads((Path(split_dir) / contract.MANIFEST_NAME).read_text())

    return read


@pytest.fixture(scope="session")
def read_records():
    """All input_ids records of the given TFRecord files, in order, as a list of int lists (via
    tf.data)."""

    def read(files, max_length=MAX_LENGTH):
        import tensorflow as tf

        features = contract.record_features(max_length)
        dataset = tf.data.TFRecordDataset([str(path) for path in files])
        return [
            tf.io.parse_single_example(record, features)[contract.FEATURE_NAME].numpy().tolist()
            for record in dataset
        ]

    return read


@pytest.fixture(scope="session")
def run_script():
    """Run a root script as a subprocess (this interpreter, cwd = repo root); returns
    CompletedProcess."""
    return run_command


# --------------------------------------------------------------------------------------------------
# Hub datasets, offline: a local folder laid out as a Hub repository, and a
# datasets cache of a test's own


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    """An empty datasets cache of the test's own. datasets read HF_DATASETS_CACHE on import (as
    conftest.py's isolate_hf_cache set it), so it is changed where datasets keeps it."""
    import datasets

    cache = tmp_path / "datasets_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    return cache
