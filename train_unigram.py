#!/usr/bin/env python
"""Step 1 of 3: train a Unigram tokenizer for masked-language-model pretraining.

The tokenizer is trained with 🤗 tokenizers on a text corpus, then saved as a transformers tokenizer
directory that `AutoTokenizer.from_pretrained(output_dir)` loads as a fast tokenizer with the
[CLS] / [SEP] / <unk> / <pad> / [MASK] special tokens set. Optionally it is pushed to the Hub.

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
import json
import os
import sys

SPECIAL_TOKENS = ["[CLS]", "[SEP]", "<unk>", "<pad>", "[MASK]"]
SCORE_DECIMALS = 6
REQUIRED_CHAR_SCORE_STEP = 1e-4  # the Unigram trainer's spacing between the rare characters it adds
LOCAL_FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


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
    hub.add_argument("--hub_model_id", help="Hub repository to push to, e.g. my-user/my-tokenizer.")
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
    if args.train_file is not None:
        if not os.path.isfile(args.train_file):
            raise UsageError(f"--train_file {args.train_file} does not exist; pass a path to a text corpus file.")
        if os.path.getsize(args.train_file) == 0:
            raise UsageError(f"--train_file {args.train_file} is empty; pass a file with text in it.")
        extension = os.path.splitext(args.train_file)[1].lower()
        if extension not in LOCAL_FILE_BUILDERS:
            raise UsageError(
                f"--train_file {args.train_file} has extension {extension!r}; "
                f"use one of {sorted(LOCAL_FILE_BUILDERS)}."
            )
    if os.path.exists(os.path.join(args.output_dir, "tokenizer.json")) and not args.overwrite_output_dir:
        raise UsageError(
            f"--output_dir {args.output_dir} already holds a tokenizer; "
            "pass --overwrite_output_dir to replace it, or choose another folder."
        )


def describe_source(args):
    return args.train_file or f"{args.dataset_name}/{args.dataset_config}"


def load_corpus(args):
    """The training split as a datasets.Dataset, from a local file or the Hub."""
    import datasets

    try:
        if args.train_file is not None:
            builder = LOCAL_FILE_BUILDERS[os.path.splitext(args.train_file)[1].lower()]
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
    if args.limit is not None:
        dataset = dataset.select(range(min(args.limit, len(dataset))))
    return dataset


def first_line(error):
    """A library error on one line: its own first line, and the root cause's when that differs."""

    def describe(exception):
        text = str(exception).strip()
        return f"{type(exception).__name__}: {text.splitlines()[0]}" if text else type(exception).__name__

    root = error
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__
    return describe(error) if root is error else f"{describe(error)} ({describe(root)})"


def iterate_text(dataset, text_column, batch_size):
    """Batches of non-blank texts: blank lines carry no tokens and would only skew piece counts."""
    for batch in dataset.iter(batch_size=batch_size):
        texts = [text for text in batch[text_column] if text is not None and text.strip()]
        if texts:
            yield texts


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokenizer = Tokenizer(models.Unigram())
    # NFKC folds look-alike code points (full-width letters, ligatures) so they share pieces.
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tokenizer


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


def train_tokenizer(args, dataset):
    from tokenizers import AddedToken, Tokenizer, processors, trainers

    tokenizer = build_tokenizer()
    trainer = trainers.UnigramTrainer(
        vocab_size=args.vocab_size, special_tokens=SPECIAL_TOKENS, unk_token="<unk>", show_progress=True
    )
    tokenizer.train_from_iterator(
        iterate_text(dataset, args.text_column, args.batch_size), trainer=trainer, length=len(dataset)
    )
    if tokenizer.get_vocab_size() <= len(SPECIAL_TOKENS):
        raise UsageError(
            f"the corpus {describe_source(args)} has no non-blank text to learn from; check it and --text_column."
        )

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


def main(args):
    check_args(args)
    dataset = load_corpus(args)
    print(f"Training a Unigram tokenizer of {args.vocab_size} pieces on {len(dataset)} rows.")
    tokenizer = wrap_for_transformers(train_tokenizer(args, dataset))
    tokenizer.save_pretrained(args.output_dir)
    print(f"Saved the tokenizer ({len(tokenizer)} tokens) to {args.output_dir}")
    if args.push_to_hub:
        try:
            tokenizer.push_to_hub(args.hub_model_id)
        except Exception as error:  # network, credentials, permissions: the local copy is complete anyway
            raise UsageError(
                f"the tokenizer is saved in {args.output_dir}, but pushing it to --hub_model_id "
                f"{args.hub_model_id} failed: {first_line(error)}; check `huggingface-cli login` and the id."
            ) from None
        print(f"Pushed the tokenizer to the Hub as {args.hub_model_id}")
    return tokenizer


if __name__ == "__main__":
    arguments = parse_args()
    try:
        main(arguments)
    except UsageError as error:
        sys.exit(f"train_unigram.py: error: {error}")
