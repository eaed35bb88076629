"""Step 2's engine: the split tokenized in threads, packed block by block and written as TFRecord
shards, in this process or as an Apache Beam pipeline, into a split folder kept as split_folder.py's
rules say.

prepare_tfrecord_shards.py reads its settings, checks its paths and loads the tokenizer first (no
TensorFlow), then imports this module: TensorFlow loads here. The split is read in blocks of
--rows_per_block rows; --num_proc threads tokenize batches while the main thread packs each block
(packing.pack_block) and writes its shards, each whole, then manifest.json last. With --runner the
same blocks are packed on Beam's workers (beam_launcher, beam_pipeline), which need no TensorFlow.
"""

import collections
import itertools
import json
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager

import tensorflow as tf
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast

from . import beam_launcher, contract, corpus, hub_datasets, packing, split_folder
from .contract import MANIFEST_NAME
from .errors import UsageError
from .file_writes import write_then_rename, write_whole
from .storage import temporary_path

PACKING = (
    "each non-blank line is tokenized as [CLS] tokens [SEP]; the lines of each block of "
    "rows_per_block input rows are concatenated in order and cut into max_length sequences; only "
    "each block's final remainder is dropped"
)
# What the file system raises when it refuses a write: local (OSError) or TensorFlow's (gs://).
WRITE_ERRORS = (OSError, tf.errors.OpError)


def look_for_devices():
    """TensorFlow's search for devices, which logs too (cuInit): done inside the held-back start-up
    log, before any work."""
    tf.config.list_physical_devices()


# The split's folder while it is written (split_folder.py: the rules it keeps)


def check_split_dir(split_dir, split, overwrite):
    """Checked before any work: refusing after minutes of tokenizing would waste them."""
    if tf.io.gfile.exists(f"{split_dir}/{MANIFEST_NAME}") and not overwrite:
        raise UsageError(
            f"{split_dir} already holds a finished {split} split; "
            "pass --overwrite_output_dir to replace it, or choose another --output_dir."
        )


def missing_folders(folder):
    """`folder` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while folder and not tf.io.gfile.exists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    return missing


def clear_split_dir(split_dir):
    """Create the split's folder and delete what this run replaces: a finished split's manifest
    first (so that a folder interrupted halfway through no longer claims to hold one), a
    half-written one, then every shard."""
    tf.io.gfile.makedirs(split_dir)
    remove_if_present(f"{split_dir}/{MANIFEST_NAME}")
    # a run killed while writing it
    remove_if_present(temporary_path(f"{split_dir}/{MANIFEST_NAME}"))
    remove_shards(split_dir)


def remove_shards(split_dir):
    """Remove the shards, whole or half-written, and a Beam run's staged blocks."""
    for pattern in (*split_folder.SHARD_FILES, split_folder.STAGED_FILES):
        for path in tf.io.gfile.glob(f"{split_dir}/{pattern}"):
            remove_if_present(path)


def remove_run_output(split_dir, created_folders):
    """Undo a failed run: its shards, and the folders it created if they are empty."""
    remove_shards(split_dir)
    for folder in dict.fromkeys([split_dir, *created_folders]):
        if tf.io.gfile.exists(folder) and not tf.io.gfile.listdir(folder):
            tf.io.gfile.rmtree(folder)


def remove_if_present(path):
    """Remove a file that may be gone already."""
    try:
        tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
        pass


def write_manifest(split_dir, text):
    """Write manifest.json under a temporary name first, so that it appears whole or not at all."""
    write_whole(f"{split_dir}/{MANIFEST_NAME}", text)


# Reading: the split's rows as a stream, in blocks


def file_rows(data, batch_size, files):
    """The rows of each input file in turn, streamed in any format corpus.file_rows reads (a Hub
    dataset: its split, one stream)."""
    if files is None:
        dataset = hub_datasets.load_split(
            data.split,
            data.dataset_name,
            data.dataset_config,
            trust_remote_code=data.trust_remote_code,
            streaming=data.streaming,
        )
        yield corpus.dataset_column(dataset, data.text_column, batch_size)
    for path in files or ():
        yield corpus.file_rows(path, data.text_column)


def split_blocks(settings, files, tally):
    """(block index, the block's rows) for each block of --rows_per_block rows, in order: each file
    is cut into blocks of its own, numbered on from one file to the next, and --limit counts rows
    across the files (`tally["rows"]`). mlm_pipeline/beam_pipeline.py numbers a Beam run's blocks
    the same way."""
    data, rows_per_block = settings.data, settings.output.rows_per_block
    blocks = itertools.count()
    for rows in file_rows(data, settings.tokenization.batch_size, files):
        rows = corpus.reading_errors_as_usage_errors(rows, data.source(data.split))
        if data.limit is not None:
            rows = itertools.islice(rows, data.limit - tally["rows"])
        rows = corpus.counted(rows, tally)
        end = object()  # a row can be None, so the end of the stream needs a marker of its own
        while (first := next(rows, end)) is not end:
            block_rows = itertools.chain([first], itertools.islice(rows, rows_per_block - 1))
            yield next(blocks), block_rows
            collections.deque(block_rows, maxlen=0)  # the block's rest: the next starts after it
        if data.limit is not None and tally["rows"] >= data.limit:
            return


def block_batches(blocks, batch_size):
    """(block, texts) for each batch of up to `batch_size` non-blank texts of a block, then (block,
    None) once the block's rows are all read. A batch never holds texts of two blocks: each block is
    packed on its own."""
    for block, rows in blocks:
        for batch in corpus.text_batches(rows, batch_size):
            yield block, batch
        yield block, None


# Tokenizing: batches in parallel threads, results in order


class BatchEncoder:
    """texts -> their token ids, each text's `[CLS] ... [SEP]` concatenated into one int64 array:
    the same ids as `tokenizer(texts)["input_ids"]`, without building its per-text lists of ids,
    types and attention masks."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        # Direct: the class's batch call is PreTrainedTokenizerFast's own, which hands the texts
        # unchanged to the Rust backend. Some classes (CPM, for one) rewrite the text in Python
        # first; those keep their call.
        calls = ("__call__", "_call_one", "batch_encode_plus", "_batch_encode_plus")
        fast = PreTrainedTokenizerFast
        self.direct = all(getattr(type(tokenizer), call) is getattr(fast, call) for call in calls)
        if self.direct:  # the backend as transformers sets it for that call; Beam's workers too
            self.backend = packing.batch_backend(
                tokenizer.backend_tokenizer, tokenizer.split_special_tokens
            )

    def __call__(self, texts):
        if self.direct:
            return packing.encode_texts(self.backend, texts)
        return packing.concatenate_ids(self.tokenizer(texts, add_special_tokens=True)["input_ids"])


@contextmanager
def tokenizer_pool_off():
    """Turn off the Rust tokenizer's own thread pool (read at every call), so that each of our
    threads uses one core: --num_proc threads then use --num_proc cores, not --num_proc times all of
    them."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        del os.environ["TOKENIZERS_PARALLELISM"]
        if previous is not None:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def in_order(function, batches, threads):
    """function(batch) for each batch, computed in `threads` threads and yielded in order. Only a
    few batches are read ahead, so memory does not grow with the corpus."""
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tokenize")
    pending = collections.deque()
    try:
        for batch in batches:
            pending.append(pool.submit(function, batch))
            # Two batches a thread in line keep every thread busy while the main thread catches up.
            if len(pending) > 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(cancel_futures=True)


def token_id_batches(batches, tokenizer, threads):
    """(block, number of texts, their token ids as one int64 array) for each (block, texts) batch,
    in order; a block's end, (block, None), comes out as (block, None, None)."""
    encode = BatchEncoder(tokenizer)

    def encode_batch(batch):
        block, texts = batch
        return (block, None, None) if texts is None else (block, len(texts), encode(texts))

    if encode.direct:
        with tokenizer_pool_off():
            yield from in_order(encode_batch, batches, threads=threads)
    else:
        # transformers reconfigures the backend at every call, so calls must not overlap
        yield from in_order(encode_batch, batches, threads=1)


# Packing and writing: each block's sequences into shards of tf.train.Example records


def tf_example(sequence):
    """One record of a shard: a tf.train.Example with one feature, "input_ids", the sequence's
    max_length token ids. run_mlm.py parses it back with contract.record_features."""
    input_ids = tf.train.Feature(int64_list=tf.train.Int64List(value=sequence))
    features = tf.train.Features(feature={contract.FEATURE_NAME: input_ids})
    return tf.train.Example(features=features)


class SplitWriter:
    """Writes the split's shards, each whole (under a temporary name, then renamed). The folder is
    cleared of what this run replaces only when the first shard comes: until then a bad input
    leaves existing output untouched. Killed at any moment, it leaves a finished split or a folder
    without manifest.json, which the same command, run again, clears and writes afresh."""

    def __init__(self, split_dir):
        self.split_dir, self.started, self.created_folders = split_dir, False, []

    def start(self):
        if not self.started:
            self.created_folders = missing_folders(self.split_dir)
            clear_split_dir(self.split_dir)
            self.started = True

    def write_shard(self, path, sequences):
        """One shard: each sequence (a row of the 2-D array) as a tf.train.Example in a TFRecord
        file; returns its size in bytes."""
        self.start()
        with write_then_rename(path) as temporary, tf.io.TFRecordWriter(temporary) as file:
            for sequence in sequences:
                file.write(tf_example(sequence).SerializeToString())
        return tf.io.gfile.stat(path).length

    def discard(self):
        """Remove whatever this run wrote: a later step must never pick up a half-written split."""
        if self.started:
            remove_run_output(self.split_dir, self.created_folders)


def write_blocks(id_batches, writer, settings):
    """Pack each block on its own and write its shards (packing.pack_block: concatenate, cut,
    write); returns, for each block in order, what it gave."""
    summaries = []
    # The bar shows from the first sequence on (delay): input refused before then gets its error
    # line alone; closing it ends its line, so that an error found midway starts a line of its own.
    split, max_length = settings.data.split, settings.tokenization.max_length
    progress = tqdm(desc=f"Writing {split} shards", unit=" sequences", delay=1e-9)
    with closing(id_batches), progress:  # closing: stops the threads if writing fails
        for block, batches in itertools.groupby(id_batches, key=lambda batch: batch[0]):
            encoded = ((texts, ids) for _, texts, ids in batches if texts is not None)
            shards = packing.BlockShards(
                split_dir=writer.split_dir,
                split=split,
                block=block,
                shard_size=settings.output.shard_size,
                write_shard=writer.write_shard,
            )
            summary = packing.pack_block(block, encoded, max_length, shards, progress.update)
            summaries.append(summary)
    return summaries


def write_split(settings, files, tokenizer, split_settings, split_dir):
    """The split in this process: read, tokenize in threads, pack and write, then manifest.json."""
    tally = collections.Counter()
    tokenization = settings.tokenization
    batches = block_batches(split_blocks(settings, files, tally), tokenization.batch_size)
    writer = SplitWriter(split_dir)
    try:
        id_batches = token_id_batches(batches, tokenizer, tokenization.threads)
        blocks = write_blocks(id_batches, writer, settings)
        # Built, and a split without a single sequence refused, before the folder is cleared.
        manifest = split_folder.split_manifest(blocks, tally["rows"], split_settings, PACKING)
        writer.start()
        write_manifest(split_dir, split_folder.manifest_text(manifest))
    except BaseException:
        writer.discard()
        raise
    return manifest


def write_split_with_beam(settings, files, tokenizer, split_settings, split_dir):
    """The split as an Apache Beam pipeline on --runner (mlm_pipeline/beam_pipeline.py): the same
    blocks, packed by pack_block on the runner's workers, which load the tokenizer themselves."""
    data, name, beam = settings.data, settings.tokenization.tokenizer_name_or_path, settings.beam
    encoder = BatchEncoder(tokenizer)
    if not encoder.direct:
        raise UsageError(
            f"the tokenizer {name!r} ({type(tokenizer).__name__}) rewrites "
            "text before its Rust backend sees it, which Beam's workers cannot do; run without "
            "--runner."
        )
    workers_tokenizer = beam_launcher.worker_tokenizer(
        name,
        backend=encoder.backend,
        split_special_tokens=tokenizer.split_special_tokens,
    )
    inputs = f"{len(files)} input files"
    print(f"Writing the {data.split} split ({inputs}) as an Apache Beam pipeline on {beam.runner}")
    created_folders = missing_folders(split_dir)
    clear_split_dir(split_dir)  # before the workers start: they write at once
    try:
        beam_launcher.run(
            beam.beam_argv,
            files,
            tokenizer=workers_tokenizer,
            settings=split_settings,
            split_dir=split_dir,
            batch_size=settings.tokenization.batch_size,
            limit=data.limit,
            text_column=data.text_column,
            packing_text=PACKING,
        )
    except BaseException:
        remove_run_output(split_dir, created_folders)
        raise
    with tf.io.gfile.GFile(f"{split_dir}/{MANIFEST_NAME}") as file:
        return json.load(file)
