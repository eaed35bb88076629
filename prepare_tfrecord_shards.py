#!/usr/bin/env python
"""Step 2 of 4: tokenize a text split, pack it into fixed-length sequences, write TFRecord shards.

Each non-blank line (a document or paragraph) is tokenized as `[CLS] tokens [SEP]`. The split is
read in blocks of --rows_per_block input rows (blank ones count too; a block never spans two input
files), and each block is packed on its own: its documents are concatenated in order and cut into
--max_length sequences (which may start or end mid-document; a [SEP] ends each document). Nothing is
padded: only each block's final remainder is dropped (RoBERTa's FULL-SENTENCES packing).

    # local files (a glob over many works too: --train_file 'corpus/part-*.txt')
    python prepare_tfrecord_shards.py --train_file corpus/train.txt --split train \
        --tokenizer_name_or_path tokenizer --max_length 128 --output_dir shards
    python prepare_tfrecord_shards.py --validation_file corpus/validation.txt --split validation \
        --tokenizer_name_or_path tokenizer --max_length 128 --output_dir shards

    # C4 as it is kept: gzip-compressed JSON lines in a bucket (.csv, .parquet, .zst likewise)
    python prepare_tfrecord_shards.py --train_file 'gs://my-bucket/c4/en/c4-train.*.json.gz' \
        --split train --tokenizer_name_or_path tokenizer --output_dir gs://my-bucket/c4-shards

    # WikiText-103 from the Hub, streamed (no download into the cache), straight to a GCS bucket
    python prepare_tfrecord_shards.py --split train --tokenizer_name_or_path my-user/my-tokenizer \
        --streaming --max_length 128 --output_dir gs://my-bucket/wikitext-103

    # past one machine: the same step as an Apache Beam pipeline, here on every core of this one; on
    # Dataflow, see README.md ("Several hosts, and Apache Beam") and mlm_pipeline/beam_pipeline.py
    python prepare_tfrecord_shards.py --train_file 'gs://my-bucket/corpus/*.txt' --split train \
        --tokenizer_name_or_path gs://my-bucket/tokenizer --output_dir gs://my-bucket/shards \
        --runner DirectRunner --direct_num_workers 0 --direct_running_mode multi_processing

Output: <output_dir>/<split>/<split>-<block>-<shard>-<records>.tfrecord, one tf.train.Example per
sequence (shard_writing.tf_example: "input_ids", int64 x max_length), then manifest.json, written
last: without it the split is unfinished, and the same command writes it again. Memory stays flat:
--num_proc threads tokenize while the main thread packs and writes. A block's sequences depend on
its rows alone, so the Beam pipeline (--runner, after `pip install -r requirements-beam.txt`) packs
blocks on many workers at once and writes the same files, byte for byte.

This script is the front: its settings, and the checks made before any work (paths, Apache Beam,
the tokenizer), none of which loads TensorFlow. main() then imports the engine,
mlm_pipeline/shard_writing.py, which reads, tokenizes, packs and writes.

Next step: run_mlm.py --train_dataset <output_dir>/train --eval_dataset <output_dir>/validation.
"""

import dataclasses
import os
from typing import Optional

from mlm_pipeline import beam_launcher, contract, corpus, split_folder, storage
from mlm_pipeline.errors import UsageError, exit_on_usage_error, first_line, positive_int
from mlm_pipeline.settings import parse_command_line, passed_on, setting
from mlm_pipeline.tf_startup import keep_off_the_tpu, tensorflow_startup_log_held_back

# Large enough that the tokens dropped at block ends do not matter (under max_length per 100,000
# rows), small enough that a corpus of a few million rows already spreads over several Beam workers.
DEFAULT_ROWS_PER_BLOCK = 100_000


def available_cores():
    """The cores this process may run on (its CPU affinity): maybe fewer than the machine has."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# The settings, each declared once: a field of its group, with its flag's help, type and default
# (mlm_pipeline/settings.py). Each group checks its own rules as the command line is read; the
# paths, the tokenizer and Apache Beam are checked in main, before any work.


@dataclasses.dataclass(frozen=True)
class Data(corpus.Corpus):
    """The split to write, and where its text comes from: local or gs:// files, or a Hub dataset
    (the default)."""

    train_file: Optional[str] = corpus.split_file_setting("train")
    validation_file: Optional[str] = corpus.split_file_setting("validation")
    test_file: Optional[str] = corpus.split_file_setting("test")
    split: str = setting(f"Which split to write: one of {', '.join(contract.SPLITS)}.", "train")

    def __post_init__(self):
        if self.split not in contract.SPLITS:
            splits = ", ".join(contract.SPLITS)
            raise UsageError(
                f"--split {self.split!r} is not a split this script knows; use one of {splits}."
            )
        files = [self.train_file, self.validation_file, self.test_file]
        if any(files) and self.split_file(self.split) is None:
            raise UsageError(
                f"--split {self.split} was asked for, but only other local splits were given; "
                f"pass --{self.split}_file."
            )


@dataclasses.dataclass(frozen=True)
class Tokenization:
    """The tokenizer, and the sequences it cuts the text into."""

    tokenizer_name_or_path: str = setting(
        "The tokenizer: train_unigram.py's folder (local or gs://) or a Hub id.", required=True
    )
    max_length: int = setting("How many tokens each sequence holds.", 128, type=positive_int)
    batch_size: int = setting(
        "How many lines the tokenizer is handed at a time.", 1000, type=positive_int
    )
    num_proc: Optional[int] = setting(
        f"How many threads tokenize; the {available_cores()} cores this process may use when not "
        "given.",
        type=positive_int,
    )

    def __post_init__(self):
        if self.max_length < 2:
            raise UsageError(
                f"--max_length {self.max_length} is too short for a sequence; use 128 or 512."
            )

    @property
    def threads(self):
        """How many threads tokenize: --num_proc, else the cores this process may use."""
        return self.num_proc or available_cores()


@dataclasses.dataclass(frozen=True)
class Output:
    """Where the split's shards go, and how they are cut into files and blocks."""

    output_dir: str = setting(
        "A local folder or gs://bucket/prefix; the split goes into its <split>/ folder.",
        required=True,
    )
    shard_size: int = setting(
        "How many sequences each shard file holds, at most.", 10000, type=positive_int
    )
    overwrite_output_dir: bool = setting(
        "Replace a finished split of the same name in --output_dir.", False
    )
    rows_per_block: int = setting(
        "How many input rows, blank ones included, are packed together: each block drops its last "
        "partial sequence, and blocks are what Beam's workers share out.",
        DEFAULT_ROWS_PER_BLOCK,
        type=positive_int,
    )


@dataclasses.dataclass(frozen=True)
class Beam:
    """Apache Beam: one split written by many workers."""

    runner: Optional[str] = setting(
        "Run the step as an Apache Beam pipeline on this runner: DirectRunner (this machine's "
        "cores), DataflowRunner, FlinkRunner, SparkRunner... The output is what a run without it "
        "writes. Needs `pip install -r requirements-beam.txt`."
    )
    beam_options: tuple = passed_on("Beam pipeline options", needs="runner")

    @property
    def beam_argv(self):
        """The pipeline's options as Beam reads them: --runner, then the flags handed on."""
        return ["--runner", self.runner, *self.beam_options] if self.runner else []


@dataclasses.dataclass(frozen=True)
class Settings:
    """All of a run's settings, by group."""

    data: Data
    tokenization: Tokenization
    output: Output
    beam: Beam


def parse_args(argv=None):
    """The command line as Settings; a flag or a rule broken is refused in one line."""
    return parse_command_line(
        Settings,
        argv,
        prog="prepare_tfrecord_shards.py",
        description="Tokenize a split and write it as TFRecord shards of packed sequences.",
        epilog="With --runner, every flag this script does not know goes to Apache Beam as a "
        "pipeline option (--direct_num_workers, --project, --region, --temp_location, "
        "--setup_file, ...).",
    )


def check_paths(settings):
    """Bad input is refused here, before any work, in one line that names the flag: Apache Beam
    and its options with --runner, the gs:// paths reachable (the output writable), a local output
    folder that can be made, the input files there. Returns the input files in the order they are
    read (None for a Hub dataset)."""
    data, output, tokenizer = settings.data, settings.output, settings.tokenization
    pattern, flag = data.split_file(data.split), f"--{data.split}_file"
    if settings.beam.runner:
        beam_launcher.require_beam()
        if pattern is None:
            raise UsageError(
                "--runner reads files, local or gs://, not a Hub dataset "
                f"({data.source(data.split)}); pass {flag} (a glob over the dataset's text files, "
                "e.g. in a bucket), or run without --runner and --streaming."
            )
        beam_launcher.check_options(
            settings.beam.beam_argv,
            tokenizer=tokenizer.tokenizer_name_or_path,
            output_dir=output.output_dir,
            inputs=[(flag, pattern)],
        )
    # Cloud Storage next, in seconds (listing an unreachable bucket takes TF minutes of retries)
    paths = {"--output_dir": output.output_dir, flag: pattern}
    paths["--tokenizer_name_or_path"] = tokenizer.tokenizer_name_or_path
    storage.check_gcs_paths(paths, writable=["--output_dir"])
    if not storage.is_remote(output.output_dir):
        storage.check_local_output_dir(output.output_dir)
    return corpus.input_files(pattern, flag) if pattern is not None else None


def main(settings):
    """Write the split as `settings` (parse_args()) say; returns its manifest."""
    keep_off_the_tpu()  # this step never uses the TPU, nor do its Beam workers; before TensorFlow
    files = check_paths(settings)
    data, tokenization, output = settings.data, settings.tokenization, settings.output
    # The tokenizer first: a wrong path is reported in a second, not after TensorFlow has loaded.
    name, flag = tokenization.tokenizer_name_or_path, "--tokenizer_name_or_path"
    tokenizer = contract.load_tokenizer(name, flag, data.trust_remote_code, require_fast=True)
    with tensorflow_startup_log_held_back():
        from mlm_pipeline import shard_writing  # the engine: TensorFlow loads here

        shard_writing.look_for_devices()
    split_settings = split_folder.split_settings(
        tokenizer,
        tokenizer_name=name,
        split=data.split,
        source=data.source(data.split),
        max_length=tokenization.max_length,
        rows_per_block=output.rows_per_block,
        shard_size=output.shard_size,
    )
    split_dir = contract.split_dir(output.output_dir, data.split)
    shard_writing.check_split_dir(split_dir, data.split, output.overwrite_output_dir)
    if settings.beam.runner:
        write = shard_writing.write_split_with_beam
    else:
        write = shard_writing.write_split
    try:
        manifest = write(settings, files, tokenizer, split_settings, split_dir)
    except shard_writing.WRITE_ERRORS as error:  # the file system refused a write
        raise UsageError(
            f"could not write the {data.split} split to {split_dir}: {first_line(error)}; "
            "check that --output_dir is writable and has room."
        ) from None
    split_folder.print_summary(manifest, split_dir)
    return manifest


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "prepare_tfrecord_shards.py")
