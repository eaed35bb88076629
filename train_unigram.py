#!/usr/bin/env python
"""Step 1 of 4: train a Unigram tokenizer for masked-language-model pretraining.

Trained with 🤗 tokenizers on a text corpus, saved as a folder that AutoTokenizer loads as a fast
tokenizer (special tokens [CLS] <pad> [SEP] <unk> [MASK] at ids 0-4), optionally pushed to the Hub.

    # WikiText-103 from the Hub (the default corpus)
    python train_unigram.py --vocab_size 32000 --output_dir tokenizer

    # local files: plain text, one document per line, any extension (.txt, .raw, ...; gs:// too),
    # or .json/.jsonl, .csv, .parquet with a --text_column; a quoted glob reads many, sorted
    python train_unigram.py --train_file 'corpus/*.txt' --vocab_size 8000 --output_dir tokenizer

    # C4's first 2M rows, streamed rather than downloaded, pushed to the Hub (after `hf auth login`)
    python train_unigram.py --dataset_name allenai/c4 --dataset_config en --streaming \
        --limit 2000000 --output_dir tokenizer --push_to_hub --hub_model_id my-user/c4-unigram

A good vocabulary: NFKC, a Metaspace pre-tokenizer ("▁" starts a word), EM long enough before each
pruning for frequent whole words to beat their spelling, and word-end examples for the words the
trainer would never propose. A deterministic one: one corpus gives one byte-identical file.

This script is the front: its settings and the checks made before any work. main() then imports
the engine, mlm_pipeline/unigram_training.py (🤗 tokenizers and transformers; TensorFlow is loaded
only to list and read a gs:// corpus).

Next step: prepare_tfrecord_shards.py --tokenizer_name_or_path <output_dir>.
"""

import collections
import dataclasses
import itertools
import os
from typing import Optional

from mlm_pipeline import cards, contract, corpus, hub, hub_datasets, storage, tf_startup
from mlm_pipeline.contract import SPECIAL_TOKENS
from mlm_pipeline.errors import UsageError, exit_on_usage_error, positive_int
from mlm_pipeline.settings import parse_command_line, setting

# The settings, each declared once: a field of its group, with its flag's help, type and default
# (mlm_pipeline/settings.py). Each group checks its own rules as the command line is read; the
# paths are checked in check_paths, before any work.


@dataclasses.dataclass(frozen=True)
class Data(corpus.Corpus):
    """The text to learn from: local or gs:// files, or a Hub dataset (the default)."""

    train_file: Optional[str] = corpus.split_file_setting("train")
    batch_size: int = setting(
        "How many rows the trainer is handed at a time.", 1000, type=positive_int
    )


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """The vocabulary to learn, and how the tokenizer reads text."""

    vocab_size: int = setting(
        "How many pieces the vocabulary holds, the special tokens included.", 32000, type=int
    )
    lowercase: bool = setting(
        "Lower-case all text before it is split into pieces, in training and in every later use "
        "of the tokenizer (for tasks whose text is lower-cased, such as GLUE's SST-2).",
        False,
    )
    split_hyphens: bool = setting(
        "Read a hyphen inside a word as a word of its own (straight-faced as straight - faced, "
        "WikiText's role @-@ playing as role - playing), in training and in every later use.",
        False,
    )

    def __post_init__(self):
        if self.vocab_size <= len(SPECIAL_TOKENS):
            raise UsageError(
                f"--vocab_size {self.vocab_size} leaves no room beside the {len(SPECIAL_TOKENS)} "
                f"special tokens {SPECIAL_TOKENS}; use at least {len(SPECIAL_TOKENS) + 1} "
                "(thousands in practice)."
            )


@dataclasses.dataclass(frozen=True)
class Output:
    """Where the tokenizer is saved: a local folder."""

    output_dir: str = setting("The local folder to save the tokenizer to.", required=True)
    overwrite_output_dir: bool = setting(
        "Replace a tokenizer already saved in --output_dir.", False
    )

    def __post_init__(self):
        # the local file system would take gs://x for a folder named "gs:"
        if storage.is_remote(self.output_dir):
            raise UsageError(
                f"--output_dir {self.output_dir} is not a local folder; train_unigram.py saves the "
                "tokenizer locally (the next steps load it from a folder or the Hub): pass a local "
                "path, and copy the folder wherever needed."
            )


@dataclasses.dataclass(frozen=True)
class Hub:
    """Where to publish the tokenizer, if anywhere."""

    push_to_hub: bool = setting(
        "Also push the tokenizer to the Hub, with a short README.md.",
        False,
        aliases=["--export_to_hub"],
    )
    hub_model_id: Optional[str] = setting(
        "The Hub repository to push to, e.g. my-user/my-tokenizer: created (or found) before "
        "training starts."
    )
    hub_private: bool = setting(
        "Make the Hub repository private, if it is created by this run.", False
    )

    def __post_init__(self):
        if self.push_to_hub and not self.hub_model_id:
            raise UsageError("--push_to_hub needs --hub_model_id (e.g. my-user/my-tokenizer).")
        if self.hub_private and not self.push_to_hub:
            raise UsageError("--hub_private only applies with --push_to_hub.")
        if self.push_to_hub:
            hub.check_hub_model_id(self.hub_model_id, example="my-user/my-tokenizer")


@dataclasses.dataclass(frozen=True)
class Settings:
    """All of a run's settings, by group."""

    data: Data
    tokenizer: Tokenizer
    output: Output
    hub: Hub


def parse_args(argv=None):
    """The command line as Settings; a flag or a rule broken is refused in one line."""
    return parse_command_line(
        Settings,
        argv,
        prog="train_unigram.py",
        description="Train a Unigram tokenizer for masked-LM pretraining.",
    )


def check_paths(settings):
    """The paths, before any work: the output folder writable and free (or
    --overwrite_output_dir), a gs:// corpus reachable, the corpus files there. Returns
    --train_file's files (None: a Hub dataset)."""
    data, output = settings.data, settings.output
    storage.check_local_output_dir(output.output_dir)
    existing = os.path.exists(os.path.join(output.output_dir, contract.TOKENIZER_FILE))
    if existing and not output.overwrite_output_dir:
        raise UsageError(
            f"--output_dir {output.output_dir} already holds a tokenizer; "
            "pass --overwrite_output_dir to replace it, or choose another folder."
        )
    storage.check_gcs_paths({"--train_file": data.train_file})  # in seconds, not minutes of retries
    return None if data.train_file is None else corpus.input_files(data.train_file, "--train_file")


def corpus_rows(data, files, source):
    """The first --limit texts (all without it): files streamed one after another in any format
    corpus.file_rows reads (no Arrow cache to build: training starts at once), a Hub dataset through
    datasets; a reading error is one line too."""
    if files is not None:
        rows = (text for path in files for text in corpus.file_rows(path, data.text_column))
    else:
        dataset = hub_datasets.load_split(
            "train",
            data.dataset_name,
            data.dataset_config,
            trust_remote_code=data.trust_remote_code,
            streaming=data.streaming,
        )
        rows = corpus.dataset_column(dataset, data.text_column, data.batch_size)
    return itertools.islice(corpus.reading_errors_as_usage_errors(rows, source), data.limit)


def save(tokenizer, output_dir):
    """Save the folder so that an interruption never leaves one that looks finished: through a
    staging folder, tokenizer.json (what marks a tokenizer folder) last. Returns the names."""
    with storage.staged_folder(output_dir, last=contract.TOKENIZER_FILE) as folder:
        tokenizer.save_pretrained(folder)
        names = sorted(os.listdir(folder))
    return names


def main(settings):
    """Train, save and maybe push the tokenizer as `settings` (parse_args()) say."""
    tf_startup.keep_off_the_tpu()  # before TensorFlow loads (a gs:// corpus is listed with it)
    files = check_paths(settings)  # bad input refused in one line; --train_file's files (None: Hub)
    data, vocabulary, output = settings.data, settings.tokenizer, settings.output
    # The Hub repository first: a bad id, a missing login or no network should cost no training.
    repo_id = None
    if settings.hub.push_to_hub:
        repo_id = hub.open_repository(
            settings.hub.hub_model_id, settings.hub.hub_private, "--push_to_hub"
        )
    # the engine: 🤗 tokenizers and transformers load here (TensorFlow only for a gs:// corpus)
    from mlm_pipeline import unigram_training

    source = data.source("train")  # a glob as given
    rows = corpus_rows(data, files, source)
    cased = "lower-cased" if vocabulary.lowercase else "cased"
    hyphens = ", hyphens split," if vocabulary.split_hyphens else ""
    pieces = f"{vocabulary.vocab_size} pieces"
    print(f"Training a {cased}{hyphens} Unigram tokenizer of {pieces} on {source}.")
    counts = collections.Counter()
    trained = unigram_training.train_tokenizer(
        rows,
        vocabulary.vocab_size,
        data.batch_size,
        counts,
        source,
        lowercase=vocabulary.lowercase,
        split_hyphens=vocabulary.split_hyphens,
    )
    tokenizer = unigram_training.wrap_for_transformers(trained)
    names = save(tokenizer, output.output_dir)
    learned = f"learned from {counts['texts']} non-blank of {counts['rows']} rows"
    print(f"Saved the tokenizer ({len(tokenizer)} tokens), {learned}, to {output.output_dir}")
    if repo_id is not None:
        card = cards.tokenizer_card(repo_id, tokenizer, SPECIAL_TOKENS, source, counts)
        message = f"Unigram tokenizer, {len(tokenizer)} tokens"
        commit = hub.push_folder_files(
            repo_id, output.output_dir, names, card, message, what="the tokenizer"
        )
        print(f"Pushed the tokenizer to the Hub: {commit.commit_url}")
    return tokenizer


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "train_unigram.py")
