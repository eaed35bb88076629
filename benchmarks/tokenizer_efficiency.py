#!/usr/bin/env python
"""Tokens per word on held-out text, and training time: train_unigram.py against SentencePiece.

    pip install -r requirements-benchmarks.txt   # SentencePiece, for the comparison
    python benchmarks/tokenizer_efficiency.py --train_file wiki.train.tokens \
        --validation_file wiki.valid.tokens --vocab_size 8000

Trains two Unigram tokenizers of --vocab_size pieces on --train_file, one after the other, in this
process: train_unigram.py's whole main() (reading, training, canonicalizing, saving) and the
`sentencepiece` package's own trainer (model_type=unigram, its defaults otherwise). Then it encodes
every non-blank line of --validation_file (without [CLS]/[SEP]) and prints a markdown table. Words
are the whitespace-separated words of those lines; a bare "▁" is a token that is only the space
marker.

WikiText writes each rare word as the literal text "<unk>". train_unigram.py's tokenizer reads it as
its <unk> special token, one token; SentencePiece spells it "<", "un", "k", ">" after a bare "▁". So
the table also counts with each literal "<unk>" as one token: the text between them encoded on its
own, as the 🤗 tokenizers do around a special token. Training times are wall times (perf_counter) on
a possibly shared machine, beside the CPU time of this process (process_time: every thread, and
SentencePiece uses several); both libraries are imported before any clock starts.
"""

import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

from machine import describe_machine, load_average, markdown_table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # train_unigram.py's folder
import train_unigram  # noqa: E402
from mlm_pipeline.errors import OneLineErrorParser, exit_on_usage_error  # noqa: E402

SPACE_MARKER = "▁"
LITERAL_UNK = "<unk>"  # WikiText's stand-in for a rare word
COLUMNS = ["tokens/word", "tokens/word, <unk> as one", "bare ▁", "bare ▁, <unk> as one", "unknown"]


def parse_args(argv=None):
    parser = OneLineErrorParser(description=__doc__.splitlines()[1])
    parser.add_argument("--train_file", required=True, help="Training text, one document per line.")
    parser.add_argument(
        "--validation_file", required=True, help="Held-out text, one document per line."
    )
    parser.add_argument(
        "--vocab_size", type=int, default=8000, help="Pieces in each vocabulary (default: 8000)."
    )
    args = parser.parse_args(argv)
    for flag in ("train_file", "validation_file"):
        if not os.path.isfile(getattr(args, flag)):
            parser.error(f"--{flag} {getattr(args, flag)} does not exist")
    return args


def timed(train, *args):
    """train(*args)'s result, and the wall and CPU seconds it took."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = train(*args)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def train_ours(train_file, vocab_size, folder):
    """train_unigram.py's main(), whole; returns encode(texts) -> token lists and is_unknown."""
    output_dir = os.path.join(folder, "train_unigram")
    argv = ["--train_file", train_file, "--vocab_size", str(vocab_size), "--output_dir", output_dir]
    tokenizer = train_unigram.main(train_unigram.parse_args(argv)).backend_tokenizer

    def encode(texts):
        encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
        return [encoding.tokens for encoding in encodings]

    return encode, LITERAL_UNK.__eq__


def train_sentencepiece(train_file, vocab_size, folder):
    import sentencepiece

    prefix = os.path.join(folder, "sentencepiece")
    # hard_vocab_limit off: a corpus too small for --vocab_size pieces gets as many as it has
    sentencepiece.SentencePieceTrainer.train(
        input=train_file,
        model_prefix=prefix,
        vocab_size=vocab_size,
        model_type="unigram",
        hard_vocab_limit=False,
        minloglevel=2,
    )
    processor = sentencepiece.SentencePieceProcessor(model_file=prefix + ".model")
    unk_id = processor.unk_id()  # an unknown character comes back as itself: its id tells

    def encode(texts):
        return processor.encode(texts, out_type=str)

    return encode, lambda token: processor.piece_to_id(token) == unk_id


def with_literal_unk_as_one(encode, lines):
    """Each line's tokens, the text around each literal "<unk>" encoded on its own and the literal
    one token."""
    pieces = iter(encode([piece for line in lines for piece in line.split(LITERAL_UNK)]))
    for line in lines:
        tokens = list(next(pieces))
        for _ in range(line.count(LITERAL_UNK)):
            tokens += [LITERAL_UNK, *next(pieces)]
        yield tokens


def measure(encode, is_unknown, lines, words):
    as_encoded = list(itertools.chain.from_iterable(encode(lines)))
    as_one = list(itertools.chain.from_iterable(with_literal_unk_as_one(encode, lines)))
    figures = [
        len(as_encoded) / words,
        len(as_one) / words,
        as_encoded.count(SPACE_MARKER) / len(as_encoded),
        as_one.count(SPACE_MARKER) / len(as_one),
        sum(map(is_unknown, as_encoded)) / len(as_encoded),
    ]
    return [f"{figures[0]:.3f}", f"{figures[1]:.3f}", *(f"{share:.1%}" for share in figures[2:])]


def main(args):
    import sentencepiece
    import transformers  # noqa: F401  (train_unigram.main() imports it: here, before any clock)

    print(f"Machine: {describe_machine()}; sentencepiece {sentencepiece.__version__}")
    with open(args.validation_file, encoding="utf-8") as file:
        lines = [line.rstrip("\n") for line in file if line.strip()]
    words = sum(len(line.split()) for line in lines)
    print(f"Validation: {len(lines)} non-blank lines, {words} words; {args.vocab_size} pieces\n")

    rows = []
    trainers = {
        "train_unigram.py": train_ours,
        "SentencePiece unigram (its defaults)": train_sentencepiece,
    }
    with tempfile.TemporaryDirectory() as folder:
        for name, train in trainers.items():
            trained, wall, cpu = timed(train, args.train_file, args.vocab_size, folder)
            encode, is_unknown = trained
            figures = measure(encode, is_unknown, lines, words)
            rows.append([name, *figures, f"{wall:.1f}", f"{cpu:.1f}"])
    print(markdown_table(["tokenizer", *COLUMNS, "training wall s", "training CPU s"], rows))
    print(f"\nLoad average at the end: {load_average()}")


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "tokenizer_efficiency.py")
