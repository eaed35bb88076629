"""How far the two neighbouring tokens alone get on the fill-mask task: a counting baseline for the
quality table.

    python benchmarks/neighbour_baseline.py --train_dataset shards/train \
        --eval_dataset shards/validation

From prepare_tfrecord_shards.py's training shards it counts unigrams and bigrams
(add-`--smoothing`), then scores every ordinary token of the evaluation shards as if it were masked,
knowing only its left and right neighbours: P(token | left, right) is proportional to P(token |
left) x P(right | token). Printed: top-1 accuracy and cross-entropy of that, and of the unigram
answer (no context at all). The neighbours are the true ones, never masked themselves, so this
slightly flatters the counts next to a model evaluated with 15% of its tokens masked. A masked-LM
that has learnt to read its neighbours should reach these figures; one still below the unigram row's
accuracy predicts from corpus frequencies alone.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# mlm_pipeline/ lives at the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import describe_machine, markdown_table, shard_sequences  # noqa: E402

from mlm_pipeline import tf_startup  # noqa: E402
from mlm_pipeline.errors import OneLineErrorParser, exit_on_usage_error  # noqa: E402


def parse_args(argv=None):
    parser = OneLineErrorParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--train_dataset", required=True, help="A prepare_tfrecord_shards.py output folder."
    )
    parser.add_argument(
        "--eval_dataset", required=True, help="The same, for the split that is scored."
    )
    parser.add_argument("--smoothing", type=float, default=0.1, help="Added to every bigram count.")
    parser.add_argument(
        "--chunk", type=int, default=2048, help="Positions scored at once (memory: chunk x vocab)."
    )
    return parser.parse_args(argv)


def main(args):
    import numpy as np

    print(f"Machine: {describe_machine()}")
    with tf_startup.tensorflow_startup_log_held_back():  # shown only if TensorFlow fails to start
        import tensorflow as tf

        tf.config.list_physical_devices()  # the device probing that logs (cuInit without a GPU)

    train, manifest = shard_sequences(args.train_dataset, "--train_dataset")
    evaluation, _ = shard_sequences(args.eval_dataset, "--eval_dataset")
    vocab = manifest["vocab_size"]
    special = np.array(sorted(set(manifest["special_token_ids"].values())))

    stream = train.reshape(-1)
    unigram = np.bincount(stream, minlength=vocab).astype(np.float64) + 1.0
    bigram = np.full((vocab, vocab), args.smoothing, dtype=np.float32)
    np.add.at(bigram, (stream[:-1], stream[1:]), 1.0)
    log_next = np.log(bigram / bigram.sum(axis=1, keepdims=True))  # log P(next | previous)
    log_next_transposed = np.ascontiguousarray(log_next.T)  # row r: log P(r | m) for every m

    rows, columns = np.nonzero(~np.isin(evaluation[:, 1:-1], special))
    columns += 1  # scored positions have a neighbour on each side inside the sequence
    middle = evaluation[rows, columns]
    left, right = evaluation[rows, columns - 1], evaluation[rows, columns + 1]

    correct, nats = 0, 0.0
    for start in range(0, len(middle), args.chunk):
        part = slice(start, start + args.chunk)
        # log P(m | left) + log P(right | m)
        scores = log_next[left[part]] + log_next_transposed[right[part]]
        scores[:, special] = -np.inf  # the task never asks for a special token
        top = scores.max(axis=1, keepdims=True)
        log_normaliser = top[:, 0] + np.log(np.exp(scores - top).sum(axis=1))
        nats += float((log_normaliser - scores[np.arange(len(scores)), middle[part]]).sum())
        correct += int((scores.argmax(axis=1) == middle[part]).sum())

    unigram[special] = 0
    probabilities = unigram / unigram.sum()
    unigram_nats = float(-np.log(probabilities[middle]).mean())
    unigram_accuracy = float((middle == probabilities.argmax()).mean())
    print(
        f"Scored {len(middle):,} evaluation tokens with counts from {len(stream):,} training "
        "tokens.\n"
    )
    rows = [
        ["none (unigram: always the most frequent token)", unigram_accuracy, unigram_nats],
        ["left and right neighbour (bigram counts)", correct / len(middle), nats / len(middle)],
    ]
    rows = [[context, f"{accuracy:.3f}", f"{entropy:.3f}"] for context, accuracy, entropy in rows]
    print(markdown_table(["context", "accuracy", "cross-entropy (nats)"], rows))


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "neighbour_baseline.py")
