"""prepare_tfrecord_shards.py --runner NAME: the data step as an Apache Beam pipeline, for corpora
past one machine.

    # one machine, every core: Beam's DirectRunner with one worker process per core
    python prepare_tfrecord_shards.py --train_file 'corpus/*.txt' --split train \
        --tokenizer_name_or_path tokenizer --output_dir shards \
        --runner DirectRunner --direct_num_workers 0 --direct_running_mode multi_processing

    # Google Cloud Dataflow: README.md, "Past one machine: Apache Beam and
    # Dataflow", has the whole command

The pipeline writes what the single process writes, byte for byte, manifest included:
1. Index: each input file is read once and its line breaks counted (corpus.block_starts) to find
   where each block of --rows_per_block lines starts. Counting breaks runs at memory speed, far
   above tokenizing.
2. Number: the files' blocks are numbered in file order, as the single process numbers them, and
   --limit cuts the rows past it.
3. Pack: each block is read from its start, tokenized, packed and written as its own shards
   (packing.pack_block), on whichever worker the runner hands it to.
4. Manifest: the blocks' summaries are gathered and manifest.json is written, last.

There is no GroupByKey of the sequences (tensorflow-datasets' BeamWriter groups records by shard): a
shard never holds two blocks' sequences here, so the worker that packs a block writes its shards
itself, and only the blocks' small summaries cross workers. Nothing a runner chooses can change the
output: a block, the unit of work, is fixed by the input and the flags alone, and a retried block
writes the same files again.

Workers need apache-beam, tokenizers, numpy and google-crc32c, and this package (setup.py): no
TensorFlow, no transformers. Each loads the tokenizer itself, from a folder (local, or gs:// for
Dataflow) or a Hub id, and checks it against the fingerprint of the one the launcher loaded.
"""

import itertools
import logging
import os
import re
import sys
import tempfile

from . import corpus, packing, split_manifest
from .contract import MANIFEST_NAME, TOKENIZER_FILE
from .errors import UsageError
from .storage import temporary_path

DATAFLOW = "DataflowRunner"
# the folder holding mlm_pipeline/
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------------------------------------
# Checked by the launcher, before any work


def check_options(beam_argv, tokenizer, output_dir, inputs):
    """Refuse, in one line, pipeline options Beam does not know, a runner it cannot make, and a
    Dataflow job whose workers could not reach its files or import this package."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.runners.runner import create_runner

    quiet_beam()
    options = PipelineOptions(beam_argv)
    unknown = unknown_options(options)
    if unknown:
        raise UsageError(
            f"{unknown[0]} is neither a flag of this script nor a Beam pipeline option; check its "
            "spelling (see --help, and the Beam pipeline options in README.md)."
        )
    runner = options.view_as(StandardOptions).runner
    try:
        runner_class = type(create_runner(runner)).__name__
    except (ValueError, ImportError, AttributeError) as error:
        known = ", ".join(StandardOptions.KNOWN_RUNNER_NAMES)
        raise UsageError(
            f"--runner {runner} is not a Beam runner ({type(error).__name__}); use one of {known}."
        ) from None
    if runner_class == DATAFLOW:
        check_dataflow(options, tokenizer, output_dir, inputs)


def quiet_beam():
    """Beam logs its workers' warnings, and every failure with its traceback, before the launcher
    can report it in one line (or re-raise what is no UsageError, with its own traceback)."""
    logging.getLogger("apache_beam").setLevel(logging.CRITICAL)


def unknown_options(options):
    """The flags in `options` that no Beam PipelineOptions class defines."""
    known = options.get_all_options(retain_unknown_options=False)
    every = options.get_all_options(retain_unknown_options=True)
    return [f"--{name}" for name in every if name not in known]


def check_dataflow(options, tokenizer, output_dir, inputs):
    """Dataflow's workers are other machines: every path they read or write must be gs://, and they
    must be able to import this package."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions, SetupOptions, WorkerOptions

    cloud = options.view_as(GoogleCloudOptions)
    if not (cloud.temp_location or "").startswith("gs://"):
        raise UsageError(
            "--runner DataflowRunner needs --temp_location gs://BUCKET/tmp (where Dataflow stages "
            "files and keeps temporary ones); pass it, with --project and --region."
        )
    for flag, path in [("--output_dir", output_dir), *inputs]:
        if not path.startswith("gs://"):
            raise UsageError(
                f"{flag} {path} is on this machine, which Dataflow's workers cannot read or write; "
                "put it in Cloud Storage (gs://...) and pass that path."
            )
    if os.path.exists(tokenizer) or tokenizer.startswith((".", "/")):
        raise UsageError(
            f"--tokenizer_name_or_path {tokenizer} is a folder on this machine, which Dataflow's "
            f"workers cannot read; copy it to Cloud Storage (gsutil cp -r {tokenizer} "
            "gs://BUCKET/tokenizer) or push it to the Hub, and pass that."
        )
    setup = options.view_as(SetupOptions)
    if not (setup.setup_file or options.view_as(WorkerOptions).sdk_container_image):
        raise UsageError(
            "--runner DataflowRunner needs the workers to have this package: pass --setup_file "
            "./setup.py (or an --sdk_container_image with it installed)."
        )


# --------------------------------------------------------------------------------------------------
# The pipeline's steps


def index_file(numbered_file, rows_per_block):
    """(file number, path) -> (file number, path, the byte offset where each of its blocks starts,
    lines)."""
    number, path = numbered_file
    with open_input(path) as file:
        starts, lines = corpus.block_starts(file, rows_per_block)
    return number, path, starts, lines


def number_blocks(indexes, rows_per_block, limit):
    """Every block of every file, numbered in file order, as (block, path, start, end, first line,
    rows): end None reads to the file's end. Past --limit rows, blocks are cut short, then left out.
    """
    block, rows_before = 0, 0
    for _, path, starts, lines in sorted(indexes):
        for index, start in enumerate(starts):
            rows = min(rows_per_block, lines - index * rows_per_block)
            if limit is not None:
                rows = min(rows, limit - rows_before)
                if rows <= 0:
                    return
            end = starts[index + 1] if index + 1 < len(starts) else None
            yield block, path, start, end, index * rows_per_block + 1, rows
            block, rows_before = block + 1, rows_before + rows


def open_input(path):
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def write_whole_file(temporary, final, data):
    """Write `data` under a temporary name, then rename it: the file appears complete or not at
    all."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(temporary, compression_type=CompressionTypes.UNCOMPRESSED) as file:
        file.write(data)
    FileSystems.rename([temporary], [final])


def load_backend(tokenizer, split_special_tokens, fingerprint):
    """The tokenizer as a worker loads it: tokenizer.json from its folder (local or gs://) or from
    the Hub, set up for batch calls, and checked to be the very tokenizer the launcher loaded."""
    from tokenizers import Tokenizer

    if "://" in tokenizer or os.path.isdir(tokenizer):
        with open_input(f"{tokenizer.rstrip('/')}/{TOKENIZER_FILE}") as file:
            backend = Tokenizer.from_str(file.read().decode("utf-8"))
    else:
        backend = Tokenizer.from_pretrained(tokenizer)
    backend = packing.batch_backend(backend, split_special_tokens)
    if split_manifest.tokenizer_fingerprint(backend) != fingerprint:
        raise UsageError(
            f"the tokenizer {tokenizer} that a worker loaded differs from the one the launcher "
            "loaded; make sure nothing rewrites it while the pipeline runs."
        )
    return backend


class PackBlock:
    """A block spec -> the block's summary (packing.pack_block) and its row count; its shards
    written."""

    def __init__(
        self, tokenizer, split_special_tokens, fingerprint, split_dir, settings, batch_size
    ):
        self.tokenizer, self.split_special_tokens, self.fingerprint = (
            tokenizer,
            split_special_tokens,
            fingerprint,
        )
        self.split_dir, self.settings, self.batch_size = split_dir, settings, batch_size
        self.backend = None

    def __call__(self, spec):
        # once per worker: loading it per block would cost more than small blocks
        if self.backend is None:
            # One core per worker process: the tokenizer's own thread pool would
            # make N workers use N x cores.
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
            self.backend = load_backend(self.tokenizer, self.split_special_tokens, self.fingerprint)
        block, path, start, end, first_line, rows = spec
        settings = self.settings
        with open_input(path) as file:
            lines = itertools.islice(
                corpus.text_lines(corpus.ByteRange(file, start, end), path, first_line), rows
            )
            encoded = (
                (len(texts), packing.encode_texts(self.backend, texts))
                for texts in packing.text_batches(lines, self.batch_size)
            )
            shards = packing.BlockShards(
                self.split_dir, settings["split"], block, settings["shard_size"], write_whole_file
            )
            summary = packing.pack_block(block, encoded, settings["max_length"], shards)
        return summary, rows


def write_manifest(packed, split_dir, settings, packing_text):
    """All blocks' (summary, rows) -> manifest.json, written last and whole."""
    manifest = split_manifest.split_manifest(
        [summary for summary, _ in packed], sum(rows for _, rows in packed), settings, packing_text
    )
    path = f"{split_dir}/{MANIFEST_NAME}"
    write_whole_file(temporary_path(path), path, split_manifest.manifest_text(manifest).encode())


# --------------------------------------------------------------------------------------------------
# Launching


def run(
    beam_argv,
    files,
    settings,
    tokenizer,
    tokenizer_fingerprint,
    split_special_tokens,
    split_dir,
    batch_size,
    limit,
    packing_text,
):
    """Build the pipeline and run it to its end. A failure anywhere (a worker, a bad line of input)
    raises, as a UsageError where the cause was one."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    options = PipelineOptions(beam_argv)
    runner = None
    local = options.view_as(StandardOptions).runner.lower() in ("directrunner", "direct")
    if local:
        # What the DirectRunner runs a batch pipeline on, named directly: the DirectRunner would
        # first try the PrismRunner, which downloads a binary at start-up, so an offline machine
        # would wait for it to fail.
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        runner = FnApiRunner()
        # Worker processes (--direct_running_mode multi_processing) import this package too,
        # and talk to this one over gRPC on loopback, which must not go through an
        # HTTPS_PROXY set for Cloud Storage.
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")])
        )
        os.environ["no_grpc_proxy"] = ",".join(
            filter(None, [os.environ.get("no_grpc_proxy"), "localhost,127.0.0.1"])
        )
        quiet_beam()
    else:
        # a remote runner's progress, and where to watch the job
        # (Dataflow's console link), are logged
        logging.getLogger().setLevel(logging.INFO)
    rows_per_block = settings["rows_per_block"]
    pack = PackBlock(
        tokenizer, split_special_tokens, tokenizer_fingerprint, split_dir, settings, batch_size
    )
    pipeline = beam.Pipeline(runner=runner, options=options)
    _ = (
        pipeline
        | "Input files" >> beam.Create(list(enumerate(files)))
        | "Spread the files" >> beam.Reshuffle()
        | "Index each file's blocks" >> beam.Map(index_file, rows_per_block)
        | "Gather the indexes" >> beam.combiners.ToList()
        | "Number the blocks" >> beam.FlatMap(number_blocks, rows_per_block, limit)
        # else the runner may pack them all where they were numbered
        | "Spread the blocks" >> beam.Reshuffle()
        | "Tokenize, pack and write each block" >> beam.Map(pack)
        | "Gather the summaries" >> beam.combiners.ToList()
        | "Write manifest.json" >> beam.Map(write_manifest, split_dir, settings, packing_text)
    )
    with WorkerStderrHeldBack(local) as workers_stderr:
        try:
            pipeline.run().wait_until_finish()
        except Exception as error:
            # the runner wraps what a worker raised; a UsageError's sentence is in its text
            found = re.search(r"UsageError: (.+)", str(error))
            if found:
                raise UsageError(found.group(1).strip()) from None
            workers_stderr.show()
            raise


class WorkerStderrHeldBack:
    """Beam's local worker processes print every failure's traceback to the stderr they share with
    this one, before the launcher can say what went wrong in one line. Held back in a file while the
    pipeline runs, it is shown only when the failure is unexpected (no UsageError)."""

    def __init__(self, active):
        self.active = active

    def __enter__(self):
        if self.active:
            sys.stderr.flush()
            self.saved, self.log = os.dup(2), tempfile.TemporaryFile()
            os.dup2(self.log.fileno(), 2)
        return self

    def show(self):
        if self.active:
            self.log.seek(0)
            os.write(self.saved, self.log.read()[-100_000:])

    def __exit__(self, *exception):
        if not self.active:
            return
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.log.close()
