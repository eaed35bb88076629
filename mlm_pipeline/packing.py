"""A split's shards: token ids -> packed sequences -> shard files of tf.train.Example records.

prepare_tfrecord_shards.py writes a split in one process or as an Apache Beam pipeline
(mlm_pipeline/beam_pipeline.py); both pack every block through `pack_block` and gather its
sequences into shards through `BlockShards` here, so they cannot drift apart. They differ only in
how a shard file is written: the single process writes each record as a `tf.train.Example` with
TensorFlow (the script shows it); Beam's workers, which have no TensorFlow, encode the records and
frame the TFRecord file here with numpy and google-crc32c (`serialize_examples`, `tfrecord_bytes`),
byte for byte what TensorFlow writes (tests/test_prepare_shards.py and test_prepare_beam.py hold
them to it).

A block's shards are `<split>-<block>-<shard>-<records>.tfrecord` (contract.shard_name): a shard
never holds sequences of two blocks, so whoever packs a block writes all of its shards, and no
sequence ever has to travel to another worker to be written.
"""

import copy
import functools
import itertools
import struct

import numpy as np

from .contract import FEATURE_NAME, shard_name

# --------------------------------------------------------------------------------------------------
# Tokenizing


def batch_backend(backend, split_special_tokens=False):
    """A copy of a tokenizers.Tokenizer set up as transformers sets it for a batch call (no
    truncation, no padding), so that threads can share it without anybody reconfiguring it under
    them."""
    backend = copy.deepcopy(backend)
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = split_special_tokens
    return backend


def encode_texts(backend, texts):
    """Each text's `[CLS] ... [SEP]` ids, concatenated into one int64 array: the same ids as
    transformers' `tokenizer(texts)["input_ids"]`, without its per-text lists of ids, types and
    attention masks."""
    per_text = [
        encoding.ids for encoding in backend.encode_batch_fast(texts, add_special_tokens=True)
    ]
    return concatenate_ids(per_text)


def concatenate_ids(per_text):
    total = sum(map(len, per_text))
    return np.fromiter(itertools.chain.from_iterable(per_text), dtype=np.int64, count=total)


# --------------------------------------------------------------------------------------------------
# tf.train.Example records, encoded with numpy, for Beam's workers


def varint(value):
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited(field_number, length):
    """The tag and length that open a length-delimited protobuf field."""
    return varint(field_number << 3 | 2) + varint(length)


@functools.lru_cache(maxsize=None)
def example_prefix(values_size):
    """Every byte of a record before its packed ids: the tag and length of each level of
    Example{features: Features{feature: {"input_ids": Feature{int64_list: Int64List{value}}}}},
    inside out."""
    name = FEATURE_NAME.encode()
    prefix = length_delimited(1, values_size)  # Int64List.value, packed
    prefix = length_delimited(3, len(prefix) + values_size) + prefix  # Feature.int64_list
    key = length_delimited(1, len(name)) + name
    # the map entry: key, value
    prefix = key + length_delimited(2, len(prefix) + values_size) + prefix
    prefix = length_delimited(1, len(prefix) + values_size) + prefix  # Features.feature
    return length_delimited(1, len(prefix) + values_size) + prefix  # Example.features


def varints(values):
    """The varints of a 2-D uint64 array, concatenated row by row, and the byte count of each row:
    all 7-bit groups at once, the high bit set on every group but each value's last."""
    sizes = np.ones(values.shape, dtype=np.uint8)
    largest = int(values.max()) if values.size else 0
    for bits in range(7, 64, 7):
        if largest < 1 << bits:
            break
        sizes += values >= 1 << bits
    width = int(sizes.max()) if values.size else 1
    groups = np.empty(values.shape + (width,), dtype=np.uint8)
    present = np.empty(values.shape + (width,), dtype=bool)
    for k in range(width):
        groups[..., k] = (values >> np.uint64(7 * k)) & np.uint64(0x7F)
        present[..., k] = sizes > k
    groups[..., :-1] |= present[..., 1:].view(np.uint8) << 7
    return groups[present], sizes.sum(axis=1, dtype=np.int64)


def serialize_examples(sequences):
    """tf.train.Example bytes for each row of a 2-D int64 array, byte for byte what
    `tf.train.Example(...).SerializeToString()` gives (tests/test_prepare_shards.py checks it)."""
    values = np.ascontiguousarray(sequences, dtype=np.int64).view(np.uint64)
    packed, sizes = varints(values)
    packed = packed.tobytes()
    ends = np.cumsum(sizes).tolist()
    return [
        example_prefix(end - start) + packed[start:end] for start, end in zip([0, *ends[:-1]], ends)
    ]


# --------------------------------------------------------------------------------------------------
# TFRecord files


def masked_crc32c(data):
    """TFRecord's checksum: CRC-32C, rotated and offset so that a CRC of CRCs does not
    degenerate."""
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_bytes(records):
    """A TFRecord file holding `records`: each as its length (8 bytes), that length's checksum, the
    record, and the record's checksum, all little-endian: what tf.io.TFRecordWriter writes."""
    out = bytearray()
    for record in records:
        length = struct.pack("<Q", len(record))
        out += length + struct.pack("<I", masked_crc32c(length)) + record
        out += struct.pack("<I", masked_crc32c(record))
    return bytes(out)


class BlockShards:
    """One block's shards: its sequences gathered `shard_size` at a time, each shard written by
    `write_shard(path, sequences)`, which writes the 2-D array of sequences as a TFRecord file that
    appears complete or not at all, and returns its size in bytes."""

    def __init__(self, split_dir, split, block, shard_size, write_shard):
        self.split_dir, self.split, self.block = split_dir, split, block
        self.shard_size, self.write_shard = shard_size, write_shard
        self.pending, self.shards = [], []

    def add(self, sequences):
        for sequence in sequences:
            self.pending.append(sequence)
            if len(self.pending) == self.shard_size:
                self.flush()

    def flush(self):
        if not self.pending:
            return
        records = len(self.pending)
        name = shard_name(self.split, self.block, len(self.shards), records)
        size = self.write_shard(f"{self.split_dir}/{name}", np.stack(self.pending))
        # The size lets training check that every shard is whole with one stat() call: a truncated
        # TFRecord file reads as a shorter one without any error.
        self.shards.append({"file": name, "records": records, "bytes": size})
        self.pending = []


def pack_block(block, encoded_batches, max_length, shards, on_sequences=None):
    """Pack one block: its documents' ids are concatenated in order and cut into `max_length`
    sequences, written to `shards` (a BlockShards); only the block's final remainder, shorter than a
    sequence, is dropped. `encoded_batches` yields (number of texts, their ids as one int64 array).
    Returns what the block gave, as the split's manifest lists it."""
    # carry: the block's tokens waiting to fill a sequence
    carry, documents = np.zeros(0, dtype=np.int64), 0
    for texts_in_batch, ids in encoded_batches:
        documents += texts_in_batch
        stream = np.concatenate([carry, ids])
        full = len(stream) // max_length * max_length
        carry = stream[full:]
        sequences = stream[:full].reshape(-1, max_length)
        shards.add(sequences)
        if on_sequences is not None and len(sequences):
            on_sequences(len(sequences))
    shards.flush()
    return {
        "block": block,
        "documents": documents,
        "dropped_tokens": len(carry),
        "shards": shards.shards,
    }
