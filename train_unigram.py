#!/usr/bin/env python
"""Step 1 of 3: train a Unigram tokenizer for masked-language-model pretraining.

The tokenizer is trained with 🤗 tokenizers on a text corpus, then saved as a transformers tokenizer
directory that `AutoTokenizer.from_pretrained(output_dir)` loads as a fast tokenizer with the
[CLS] / <pad> / [SEP] / <unk> / [MASK] special tokens set (ids 0-4). Optionally it is pushed to the Hub.

    # WikiText-103 from the Hub (the default corpus)
    python train_unigram.py --vocab_size 32000 --output_dir tokenizer

    # local files: .txt (one document per line), .json/.jsonl, .csv or .parquet
    python train_unigram.py --train_file corpus/train.txt --vocab_size 8000 --output_dir tokenizer

    # also push it to the Hub (needs `huggingface-cli login` or HF_TOKEN)
    python train_unigram.py --vocab_size 32000 --output_dir tokenizer \
        --push_to_hub --hub_model_id my-user/my-unigram-tokenizer

Next step: prepare_tfrecord_shards.py --tokenizer_name_or_path <output_dir>.
"""

import argparse
import bisect
import collections
import heapq
import itertools
import json
import os
import sys
import tempfile

# <pad> must be id 1: transformers' TF RoBERTa numbers positions from a padding index fixed at 1 (PyTorch
# takes it from pad_token_id), so any other id would shift positions between the two frameworks.
SPECIAL_TOKENS = ["[CLS]", "<pad>", "[SEP]", "<unk>", "[MASK]"]
SCORE_DECIMALS = 6
REQUIRED_CHAR_SCORE_STEP = 1e-4  # the Unigram trainer's spacing between the rare characters it adds
LOCAL_FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
SPACE_MARKER = "▁"  # Metaspace's stand-in for the space before a word
# UnigramTrainer options; its defaults are 2 EM iterations before each pruning, which keeps 3/4 of the pieces.
# A frequent whole word such as "▁and" starts training far less likely than its spelling "▁" + "and" (the
# trainer scores a candidate by how many distinct words contain it, a character by how often it occurs), and
# EM needs about 5 iterations on WikiText-2, one more per 10x the text, to lift it past its spelling; pruned
# before that, it is gone. By that rule 8 leave room for ~100x WikiText-2; halving the pieces at each pruning
# pays for them.
EM_ITERATIONS_PER_PRUNING = 8
SHRINKING_FACTOR = 0.5
# The most frequent words that get a word-end example (see word_end_examples), per piece of the vocabulary.
WORD_END_EXAMPLES_PER_PIECE = 1 / 4
WORD_COUNT_STRIDE = 4  # words are counted in every 4th batch: enough to rank the frequent ones, at 1/4 the cost


class UsageError(Exception):
    """A mistake in the user's input: reported as one line, without a traceback."""


class OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv=None):
    parser = OneLineErrorParser(description="Train a Unigram tokenizer for masked-LM pretraining.")
    data = parser.add_argument_group("data (the Hub by default, or a local file)")
    data.add_argument("--dataset_name", default="wikitext", help="Hub dataset id (default: wikitext).")
    data.add_argument("--dataset_config", default="wikitext-103-raw-v1", help="Hub dataset configuration.")
    data.add_argument("--train_file", help="Local .txt, .json/.jsonl, .csv or .parquet file; replaces the Hub dataset.")
    data.add_argument("--text_column", default="text", help="Column that holds the text (default: text).")
    data.add_argument("--limit", type=int, help="Use only the first LIMIT rows of the corpus.")
    data.add_argument("--batch_size", type=int, default=1000, help="Rows handed to the trainer at a time.")
    data.add_argument(
        "--trust_remote_code", action="store_true", help="Allow code from the Hub dataset repository (off by default)."
    )
    model = parser.add_argument_group("tokenizer")
    model.add_argument("--vocab_size", type=int, default=32000, help="Vocabulary size, special tokens included.")
    model.add_argument("--output_dir", required=True, help="Folder to save the tokenizer to.")
    model.add_argument(
        "--overwrite_output_dir", action="store_true", help="Replace a tokenizer already saved in --output_dir."
    )
    hub = parser.add_argument_group("Hub")
    hub.add_argument(
        "--push_to_hub", "--export_to_hub", dest="push_to_hub", action="store_true", help="Also push to the Hub."
    )
    hub.add_argument(
        "--hub_model_id",
        help="Hub repository to push to, e.g. my-user/my-tokenizer: created (or found) before training, then one "
        "commit over HTTP (no git needed) with the tokenizer files and a short README.md.",
    )
    hub.add_argument("--hub_private", action="store_true", help="Create the repository as private (if it is new).")
    return parser.parse_args(argv)


def check_args(args):
    if args.vocab_size <= len(SPECIAL_TOKENS):
        raise UsageError(
            f"--vocab_size {args.vocab_size} leaves no room beside the {len(SPECIAL_TOKENS)} special tokens "
            f"{SPECIAL_TOKENS}; use at least {len(SPECIAL_TOKENS) + 1} (thousands in practice)."
        )
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit {args.limit} must be a positive number of rows; leave it out to use them all.")
    if args.batch_size <= 0:
        raise UsageError(f"--batch_size {args.batch_size} must be positive.")
    if args.push_to_hub and not args.hub_model_id:
        raise UsageError("--push_to_hub needs --hub_model_id (e.g. my-user/my-tokenizer).")
    if args.hub_private and not args.push_to_hub:
        raise UsageError("--hub_private only applies with --push_to_hub.")
    if args.push_to_hub:
        check_hub_model_id(args.hub_model_id)
    if args.train_file is not None:
        if os.path.isdir(args.train_file):
            raise UsageError(f"--train_file {args.train_file} is a folder; pass a path to a text corpus file.")
        if not os.path.isfile(args.train_file):
            raise UsageError(f"--train_file {args.train_file} does not exist; pass a path to a text corpus file.")
        if os.path.getsize(args.train_file) == 0:
            raise UsageError(f"--train_file {args.train_file} is empty; pass a file with text in it.")
        extension = local_extension(args.train_file)
        if extension not in LOCAL_FILE_BUILDERS:
            raise UsageError(
                f"--train_file {args.train_file} has extension {extension!r}; "
                f"use one of {sorted(LOCAL_FILE_BUILDERS)}."
            )
    check_output_location(args.output_dir)
    if os.path.exists(os.path.join(args.output_dir, "tokenizer.json")) and not args.overwrite_output_dir:
        raise UsageError(
            f"--output_dir {args.output_dir} already holds a tokenizer; "
            "pass --overwrite_output_dir to replace it, or choose another folder."
        )


def check_output_location(output_dir):
    """An --output_dir that cannot be created or written is refused now, not after training.

    So is a URL such as gs://bucket/tokenizer: this script saves with the local filesystem, which would take it
    for a folder named "gs:" in the working directory, and the next steps load a tokenizer from a local folder
    or the Hub anyway.
    """
    if "://" in output_dir:
        raise UsageError(
            f"--output_dir {output_dir} is not a local folder; train_unigram.py saves the tokenizer locally (the "
            "next steps load it from a folder or the Hub): pass a local path, and copy the folder wherever needed."
        )
    existing = os.path.abspath(output_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = "is a file" if existing == os.path.abspath(output_dir) else f"lies under the file {existing}"
        raise UsageError(f"--output_dir {output_dir} {where}, not a folder; choose a folder path.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(
            f"--output_dir {output_dir} cannot be written: {existing} is read-only; choose another folder."
        )


def describe_source(args):
    return args.train_file or f"{args.dataset_name}/{args.dataset_config}"


def corpus_rows(args):
    """The corpus's texts in order, the first --limit rows: a local .txt file read line by line (no Arrow cache
    to build, so training starts at once), anything else through datasets."""
    if args.train_file is not None and LOCAL_FILE_BUILDERS[local_extension(args.train_file)] == "text":
        rows = text_file_lines(args)
    else:
        rows = dataset_column(load_dataset(args), args)
    if args.limit is not None:
        rows = itertools.islice(rows, args.limit)
    return rows


def local_extension(path):
    return os.path.splitext(path)[1].lower()


def text_file_lines(args):
    """The lines of a .txt file exactly as datasets' "text" builder splits them: universal newlines (\\r\\n and \\r
    read as \\n), split on \\n only, without the line break."""
    if args.text_column != "text":
        raise UsageError(
            f"--text_column {args.text_column!r} is not in the corpus, whose columns are ['text']; "
            "pass the right --text_column."
        )

    def lines():
        try:
            with open(args.train_file, encoding="utf-8") as file:
                for line in file:
                    yield line.rstrip("\n")
        except UnicodeDecodeError as error:  # raised mid-training, so say which file and where
            where = where_not_utf8(args.train_file, error)
            raise UsageError(
                f"could not read {args.train_file}: it is not UTF-8 text (UnicodeDecodeError: {where}); "
                "convert it to UTF-8 (e.g. iconv -f <its encoding> -t utf-8)."
            ) from None
        except OSError as error:
            raise UsageError(f"could not read {describe_source(args)}: {first_line(error)}; check the file.") from None

    return lines()


def where_not_utf8(path, error):
    """Where `path` stops being UTF-8, as the user can find it: the line and its first bad byte. Text mode
    decodes ahead of the line it hands out, so the decoder's own position says little."""
    with open(path, "rb") as file:
        for number, raw in enumerate(file, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as line_error:
                return f"line {number} holds the byte {raw[line_error.start]:#04x}"
    return str(error)


def load_dataset(args):
    """The training split as a datasets.Dataset, from a local .json/.jsonl/.csv/.parquet file or the Hub."""
    import datasets

    try:
        if args.train_file is not None:
            builder = LOCAL_FILE_BUILDERS[local_extension(args.train_file)]
            dataset = datasets.load_dataset(builder, data_files={"train": args.train_file}, split="train")
        else:
            extra = {"trust_remote_code": True} if args.trust_remote_code else {}
            dataset = datasets.load_dataset(args.dataset_name, args.dataset_config, split="train", **extra)
    except Exception as error:  # datasets raises many kinds; the user needs the source and the first reason
        raise UsageError(
            f"could not read {describe_source(args)}: {first_line(error)}; check the path or name."
        ) from None
    if args.text_column not in dataset.column_names:
        raise UsageError(
            f"--text_column {args.text_column!r} is not in the corpus, whose columns are {dataset.column_names}; "
            "pass the right --text_column."
        )
    return dataset


def dataset_column(dataset, args):
    for batch in dataset.iter(batch_size=args.batch_size):
        yield from batch[args.text_column]


def first_line(error):
    """A library error on one line: its own first line, and the root cause's when that differs."""

    def describe(exception):
        text = str(exception).strip()
        return f"{type(exception).__name__}: {text.splitlines()[0]}" if text else type(exception).__name__

    root = error
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__
    return describe(error) if root is error else f"{describe(error)} ({describe(root)})"


def training_batches(rows, batch_size, vocab_size, counts):
    """Batches of the non-blank texts, then word-end examples of the most frequent words (see
    word_end_examples); `counts` says how many rows and texts were read."""
    word_counts = collections.Counter()
    for index, batch in enumerate(non_blank_batches(rows, batch_size, counts)):
        if index % WORD_COUNT_STRIDE == 0:
            for text in batch:
                word_counts.update(text.split())
        yield batch
    examples = word_end_examples(word_counts, int(vocab_size * WORD_END_EXAMPLES_PER_PIECE))
    if examples:
        yield examples


def non_blank_batches(rows, batch_size, counts):
    """Lists of up to `batch_size` texts; blank ones carry no tokens and would only skew piece counts."""
    batch = []
    for text in rows:
        counts["rows"] += 1
        if text is not None and text.strip():
            batch.append(text)
            counts["texts"] += 1
            if len(batch) == batch_size:
                yield batch
                batch = []
    if batch:
        yield batch


def word_end_examples(word_counts, how_many):
    """Of the `how_many` most frequent words, those that start no longer word, each once and followed by the
    next word's "▁": "▁and▁".

    The Unigram trainer takes its candidate pieces from a suffix array over the distinct words, each ended by a
    separator, and drops every candidate that runs into a separator. So a string that only ever ends a word
    -- a whole word that starts no longer word, like "▁and", "▁," or "▁also" -- is never a candidate, and
    the trainer has to spell it "▁" + "and": on WikiText-2, 18% of all tokens were a bare "▁". One example
    with something after the word makes it a candidate (a word like "▁the" is one already: "▁then" goes on
    after it), and one more occurrence of a frequent word changes no count that matters.
    """
    words = sorted(word_counts)

    def starts_a_longer_word(word):
        following = bisect.bisect_right(words, word)  # the longer words that start with `word` sort right after it
        return following < len(words) and words[following].startswith(word)

    frequent = heapq.nsmallest(how_many, word_counts.items(), key=lambda item: (-item[1], item[0]))
    return sorted(word + SPACE_MARKER for word, _ in frequent if not starts_a_longer_word(word))


def build_tokenizer():
    """The tokenizer as saved: NFKC, stripped, a Metaspace pre-tokenizer and decoder, an empty Unigram model."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokenizer = Tokenizer(models.Unigram())
    # NFKC folds look-alike code points (full-width letters, ligatures) so they share pieces. Spaces at either
    # end of a text (or next to a special token) separate no words: kept, each would be a bare "▁" token.
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Strip()])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE_MARKER, prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE_MARKER, prepend_scheme="always")
    return tokenizer


def training_pre_tokenizer():
    """Metaspace as the trainer sees it: split at spaces only, so that a word-end example ("▁and▁") stays one
    word. On text it splits where Metaspace does (at each space, kept as the next word's "▁"); only a "▁"
    typed in the text itself stays inside a word here."""
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(" ", "merged_with_next"),
            pre_tokenizers.Metaspace(replacement=SPACE_MARKER, prepend_scheme="always", split=False),
        ]
    )


def build_trainer(vocab_size, show_progress=True):
    from tokenizers import trainers

    return trainers.UnigramTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        unk_token="<unk>",
        n_sub_iterations=EM_ITERATIONS_PER_PRUNING,
        shrinking_factor=SHRINKING_FACTOR,
        show_progress=show_progress,
    )


def canonical_vocabulary(tokenizer_json):
    """Fix the trainer's run-to-run wobble, so that one corpus always gives one byte-identical file.

    Two things vary between runs of the trainer. It sums log-probabilities in an order set by threads and
    hash maps, so a piece's score changes in the 15th digit. And it gives each rare character it must keep
    but did not learn the lowest score plus 0, 1e-4, 2e-4, ... in hash order. So: hand those steps to the
    characters in sorted order, round every score to six decimals (far finer than segmentation notices),
    and order the pieces by (score, piece). The special tokens keep their ids at the front.
    """
    model = tokenizer_json["model"]
    vocab = [[piece, score] for piece, score in model["vocab"] if piece not in SPECIAL_TOKENS]
    lowest = min(score for _, score in vocab)

    def required_char_step(entry):
        piece, score = entry
        steps = (score - lowest) / REQUIRED_CHAR_SCORE_STEP
        return len(piece) == 1 and abs(steps - round(steps)) < 1e-6 and round(steps) < len(vocab)

    required = sorted((entry for entry in vocab if required_char_step(entry)), key=lambda entry: entry[1])
    for entry, piece in zip(required, sorted(piece for piece, _ in required)):
        entry[0] = piece
    rest = sorted(([piece, round(score, SCORE_DECIMALS)] for piece, score in vocab), key=lambda e: (-e[1], e[0]))
    head = [[token, 0.0] for token in SPECIAL_TOKENS]
    model["vocab"] = head + rest
    model["unk_id"] = SPECIAL_TOKENS.index("<unk>")
    return tokenizer_json


def train_tokenizer(args, rows, counts):
    from tokenizers import AddedToken, Tokenizer, processors

    tokenizer = build_tokenizer()
    saved_pre_tokenizer = tokenizer.pre_tokenizer
    tokenizer.pre_tokenizer = training_pre_tokenizer()
    batches = training_batches(rows, args.batch_size, args.vocab_size, counts)
    tokenizer.train_from_iterator(batches, trainer=build_trainer(args.vocab_size))
    if tokenizer.get_vocab_size() <= len(SPECIAL_TOKENS):
        raise UsageError(
            f"the corpus {describe_source(args)} has no non-blank text to learn from; check it and --text_column."
        )
    tokenizer.pre_tokenizer = saved_pre_tokenizer

    tokenizer = Tokenizer.from_str(json.dumps(canonical_vocabulary(json.loads(tokenizer.to_str()))))
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    # "the [MASK] of" must tokenize like "the capital of": the mask absorbs the space before it, as the
    # word piece it stands for ("▁capital") does.
    tokenizer.add_special_tokens([AddedToken("[MASK]", lstrip=True, special=True)])
    return tokenizer


def wrap_for_transformers(tokenizer):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        cls_token="[CLS]",
        sep_token="[SEP]",
        bos_token="[CLS]",
        eos_token="[SEP]",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="[MASK]",
    )


def save(tokenizer, output_dir):
    """Write the tokenizer folder so that an interruption never leaves one that looks finished; returns the
    names of the files written.

    Everything is written to a temporary folder beside the output, then moved in, tokenizer.json last: the
    folder counts as holding a tokenizer once it has tokenizer.json, and by then every other file is there.
    """
    os.makedirs(output_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output_dir, prefix=".saving-") as staging:
        tokenizer.save_pretrained(staging)
        names = sorted(os.listdir(staging), key=lambda name: (name == "tokenizer.json", name))
        for name in names:
            os.replace(os.path.join(staging, name), os.path.join(output_dir, name))  # atomic on one filesystem
    return names


# ---------------------------------------------------------------------------------------------------------
# Hub: one commit over HTTP (huggingface_hub's HfApi), no git


def check_hub_model_id(repo_id):
    """An id the Hub would refuse is refused now, offline, before any work."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise UsageError(
            f"--hub_model_id {repo_id} is not a Hub repository id ({str(error).strip()}); use namespace/name, "
            "e.g. my-user/my-tokenizer."
        ) from None


def hub_error_text(error):
    """A Hub failure in one line: the HTTP status and the server's own words when there was a response."""
    cause = error
    while cause is not None and getattr(cause, "response", None) is None:
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return first_line(error)
    response = cause.response
    words = (getattr(cause, "server_message", None) or "").strip()
    return f"HTTP {response.status_code} {response.reason}" + (f": {words.splitlines()[0]}" if words else "")


def open_hub_repository(args):
    """Create the --hub_model_id repository, or find it, before training: a Hub problem should cost no work.

    transformers' tokenizer.push_to_hub() would also commit over HTTP, but only after training, and it saves
    into a folder of the current directory named like the repository when there is one; this pushes the
    files save() wrote instead. Returns the full repository id (a bare name gets the token owner's namespace).
    """
    from huggingface_hub import HfApi, get_token

    if get_token() is None:
        raise UsageError(
            f"--push_to_hub needs a Hub token with write access: run `hf auth login` or set HF_TOKEN "
            f"(--hub_model_id {args.hub_model_id})."
        )
    try:
        repository = HfApi().create_repo(args.hub_model_id, private=args.hub_private or None, exist_ok=True)
    except Exception as error:  # HTTP errors, no network, offline mode: all mean no push is possible
        raise UsageError(
            f"could not create or find the Hub repository --hub_model_id {args.hub_model_id} "
            f"({hub_error_text(error)}); check the id, that your token may write to its namespace "
            "(`hf auth whoami`), and the network."
        ) from None
    return repository.repo_id


def tokenizer_card(args, repo_id, tokenizer, counts):
    """A short README.md for the tokenizer's repository."""
    special = ", ".join(f"`{token}` ({tokenizer.convert_tokens_to_ids(token)})" for token in SPECIAL_TOKENS)
    return "\n".join(
        [
            "---",
            "library_name: transformers",
            "tags:",
            "- tokenizer",
            "- unigram",
            "---",
            "",
            f"# {repo_id}",
            "",
            f"A Unigram tokenizer of {len(tokenizer):,} tokens, trained from scratch with 🤗 tokenizers by "
            f"`train_unigram.py` on {describe_source(args)} ({counts['texts']:,} non-blank texts of "
            f"{counts['rows']:,} rows), for masked-language-model pretraining.",
            "",
            "Text is NFKC-normalized and stripped, split at spaces by a Metaspace pre-tokenizer (`▁` marks the "
            "start of a word), and each text becomes `[CLS] tokens [SEP]`. Special tokens (ids): "
            f"{special}; `[MASK]` absorbs the space before it, as the word it stands for does.",
            "",
            "```python",
            "from transformers import AutoTokenizer",
            "",
            f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")',
            "```",
            "",
        ]
    )


def push_tokenizer(args, repo_id, tokenizer, names, counts):
    """One commit: the files save() wrote to --output_dir and the card."""
    from huggingface_hub import CommitOperationAdd, HfApi

    card = tokenizer_card(args, repo_id, tokenizer, counts)
    operations = [CommitOperationAdd(name, os.path.join(args.output_dir, name)) for name in names]
    operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card.encode("utf-8")))
    try:
        message = f"Unigram tokenizer, {len(tokenizer)} tokens"
        commit = HfApi().create_commit(repo_id, operations, commit_message=message)
    except Exception as error:  # network, credentials, permissions: the local copy is complete anyway
        raise UsageError(
            f"the tokenizer is saved in {args.output_dir}, but pushing it to --hub_model_id {repo_id} failed "
            f"({hub_error_text(error)}); push that folder later with `hf upload {repo_id} {args.output_dir}`."
        ) from None
    return commit


def main(args):
    check_args(args)
    repo_id = open_hub_repository(args) if args.push_to_hub else None
    rows = corpus_rows(args)
    print(f"Training a Unigram tokenizer of {args.vocab_size} pieces on {describe_source(args)}.")
    counts = collections.Counter()
    tokenizer = wrap_for_transformers(train_tokenizer(args, rows, counts))
    names = save(tokenizer, args.output_dir)
    print(
        f"Saved the tokenizer ({len(tokenizer)} tokens), learned from {counts['texts']} non-blank of "
        f"{counts['rows']} rows, to {args.output_dir}"
    )
    if repo_id is not None:
        commit = push_tokenizer(args, repo_id, tokenizer, names, counts)
        print(f"Pushed the tokenizer to the Hub: {commit.commit_url}")
    return tokenizer


if __name__ == "__main__":
    arguments = parse_args()
    try:
        main(arguments)
    except UsageError as error:
        sys.exit(f"train_unigram.py: error: {error}")
