#!/usr/bin/env python
"""Tokens per word on held-out text: train_unigram.py versus the reference setup and SentencePiece.

    python benchmarks/tokenizer_efficiency.py --train_file wiki.train.tokens \
        --validation_file wiki.valid.tokens --vocab_size 8000

Trains three Unigram tokenizers of --vocab_size pieces on --train_file, one after the other, in this
process:

  reference      the old train_unigram.py: 🤗 tokenizers' UnigramTrainer with its defaults, NFKC, a
                 plain Metaspace pre-tokenizer (prepend_scheme="always"), the five special tokens
  train_unigram  train_unigram.main() as it is now, whole (reading, training, canonicalizing,
                 saving)
  sentencepiece  the `sentencepiece` package's own trainer, model_type=unigram, its defaults
                 otherwise

then encodes every non-blank line of --validation_file (without [CLS]/[SEP]) and prints a markdown
table. Words are the whitespace-separated words of those lines; a bare "▁" is a token that is only
the space marker.

WikiText writes each rare word as the literal text "<unk>". The 🤗 tokenizers read it as their <unk>
special token, one token; SentencePiece spells it "<", "un", "k", ">" ("<" and ">" unknown to it)
after a bare "▁". So the table also counts with each literal "<unk>" as one token: the text between
them encoded on its own, as the 🤗 tokenizers do around a special token. Training times are wall
times on a possibly shared machine (the load average is printed), beside the CPU time of this
process (all threads: SentencePiece uses several, the 🤗 UnigramTrainer mostly one); libraries are
imported before any clock starts.
"""

import argparse
import collections
import contextlib
import itertools
import os
import sys
import tempfile
import time

# describe_machine() imports TensorFlow for its version
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# train_unigram.py's folder
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from machine import describe_machine  # noqa: E402

import train_unigram  # noqa: E402

SPACE_MARKER = "▁"
LITERAL_UNK = "<unk>"  # WikiText's stand-in for a rare word

# encode: a list of texts -> their token lists; is_unknown: token -> bool;
# clock: training (wall s, CPU s)
Trained = collections.namedtuple("Trained", "encode is_unknown clock")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_file", required=True, help="Training text, one document per line.")
    parser.add_argument(
        "--validation_file", required=True, help="Held-out text, one document per line."
    )
    parser.add_argument("--vocab_size", type=int, default=8000)
    args = parser.parse_args(argv)
    for flag in ("train_file", "validation_file"):
        if not os.path.isfile(getattr(args, flag)):
            parser.error(f"--{flag} {getattr(args, flag)} does not exist")
    return args


# --------------------------------------------------------------------------------------------------
# Helpers, shared with tokenizer_training.py


def as_txt(path, folder):
    """`path`, or a .txt link to it in `folder`: train_unigram.py reads a local text corpus from a
    .txt name."""
    if path.endswith(".txt"):
        return path
    link = os.path.join(folder, "corpus.txt")
    if not os.path.lexists(link):
        os.symlink(os.path.abspath(path), link)
    return link


@contextlib.contextmanager
def quiet():
    """Silence stdout and stderr at the file-descriptor level: the Rust progress bars write there
    directly."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 1)
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


@contextlib.contextmanager
def stopwatch():
    """Yields a list that holds (wall seconds, CPU seconds of this process, all its threads) once
    the block ends."""
    clock = []
    start, start_cpu = time.perf_counter(), time.process_time()
    yield clock
    clock += [time.perf_counter() - start, time.process_time() - start_cpu]


def load_average():
    return " / ".join(f"{value:.1f}" for value in os.getloadavg()) + " (1 / 5 / 15 min)"


def non_blank_lines(path):
    with open(path, encoding="utf-8") as file:
        return [line.rstrip("\n") for line in file if line.strip()]


# --------------------------------------------------------------------------------------------------
# The three trainers


def train_reference(train_file, vocab_size):
    """The old train_unigram.py's tokenizer and trainer, fed the non-blank lines in batches of
    1000."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPACE_MARKER, prepend_scheme="always"
    )
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE_MARKER, prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size,
        special_tokens=train_unigram.SPECIAL_TOKENS,
        unk_token="<unk>",
        show_progress=False,
    )
    with stopwatch() as clock:
        lines = non_blank_lines(train_file)
        tokenizer.train_from_iterator(
            (lines[i : i + 1000] for i in range(0, len(lines), 1000)), trainer=trainer
        )
    return Trained(hf_encoder(tokenizer), LITERAL_UNK.__eq__, clock)


def train_ours(train_file, vocab_size, folder):
    argv = ["--train_file", as_txt(train_file, folder), "--vocab_size", str(vocab_size)]
    args = train_unigram.parse_args(argv + ["--output_dir", os.path.join(folder, "tokenizer")])
    with stopwatch() as clock, quiet():
        tokenizer = train_unigram.main(args)
    return Trained(hf_encoder(tokenizer.backend_tokenizer), LITERAL_UNK.__eq__, clock)


def train_sentencepiece(train_file, vocab_size, folder):
    import sentencepiece

    prefix = os.path.join(folder, "sentencepiece")
    with stopwatch() as clock:
        sentencepiece.SentencePieceTrainer.train(
            input=train_file,
            model_prefix=prefix,
            vocab_size=vocab_size,
            model_type="unigram",
            minloglevel=2,
        )
    processor = sentencepiece.SentencePieceProcessor(model_file=prefix + ".model")
    # an unknown character comes back as itself, not as "<unk>": its id tells
    unk_id = processor.unk_id()

    def encode(texts):
        return processor.encode(texts, out_type=str)

    return Trained(encode, lambda token: processor.piece_to_id(token) == unk_id, clock)


def hf_encoder(tokenizer):
    return lambda texts: [
        encoding.tokens for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)
    ]


# --------------------------------------------------------------------------------------------------
# Measuring


def measure(trained, lines, words):
    as_encoded = list(itertools.chain.from_iterable(trained.encode(lines)))
    as_one = list(itertools.chain.from_iterable(with_literal_unk_as_one(trained.encode, lines)))
    return {
        "tokens/word": len(as_encoded) / words,
        "tokens/word, <unk> as one": len(as_one) / words,
        "bare ▁": as_encoded.count(SPACE_MARKER) / len(as_encoded),
        "bare ▁, <unk> as one": as_one.count(SPACE_MARKER) / len(as_one),
        "unknown": sum(map(trained.is_unknown, as_encoded)) / len(as_encoded),
    }


def with_literal_unk_as_one(encode, lines):
    """Each line's tokens, the text around each literal "<unk>" encoded on its own and the literal
    one token."""
    pieces = iter(encode([piece for line in lines for piece in line.split(LITERAL_UNK)]))
    for line in lines:
        tokens = list(next(pieces))
        for _ in range(line.count(LITERAL_UNK)):
            tokens += [LITERAL_UNK] + list(next(pieces))
        yield tokens


def main(args):
    import sentencepiece
    import transformers  # noqa: F401  (train_unigram.main() imports it: here, before any clock starts)

    print(f"Machine: {describe_machine()}, sentencepiece {sentencepiece.__version__}")
    print(f"Load average before: {load_average()}")
    lines = non_blank_lines(args.validation_file)
    words = sum(len(line.split()) for line in lines)
    print(
        f"Validation: {len(lines)} non-blank lines, {words} words; vocabulary {args.vocab_size} "
        "pieces"
    )

    with tempfile.TemporaryDirectory() as folder:
        results = {
            "reference (UnigramTrainer defaults, plain Metaspace)": train_reference(
                args.train_file, args.vocab_size
            ),
            "train_unigram.py": train_ours(args.train_file, args.vocab_size, folder),
            "sentencepiece unigram (its defaults)": train_sentencepiece(
                args.train_file, args.vocab_size, folder
            ),
        }
    columns = [
        "tokens/word",
        "tokens/word, <unk> as one",
        "bare ▁",
        "bare ▁, <unk> as one",
        "unknown",
    ]
    print()
    print("| tokenizer | " + " | ".join(columns) + " | training wall s | training CPU s |")
    print("|---|" + "---:|" * (len(columns) + 2))
    for tokenizer, trained in results.items():
        stats = measure(trained, lines, words)
        cells = [
            f"{stats[name]:.3f}" if name.startswith("tokens") else f"{stats[name]:.1%}"
            for name in columns
        ]
        wall, cpu = trained.clock
        print(f"| {tokenizer} | " + " | ".join(cells) + f" | {wall:.1f} | {cpu:.1f} |")
    print(f"\nLoad average after: {load_average()}")


if __name__ == "__main__":
    main(parse_args())
