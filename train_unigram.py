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

Next step: prepare_tfrecord_shards.py --tokenizer_name_or_path <output_dir>.
"""

import bisect
import collections
import heapq
import itertools
import json
import os

from mlm_pipeline import cards, contract, corpus, hub, hub_datasets, storage, tf_startup
from mlm_pipeline.errors import OneLineErrorParser, UsageError, exit_on_usage_error, positive_int

# <pad> must be id 1: transformers' TF RoBERTa numbers positions from a padding index fixed at 1
# (PyTorch: pad_token_id), so any other id would shift positions between the two frameworks.
SPECIAL_TOKENS = ["[CLS]", "<pad>", "[SEP]", "<unk>", "[MASK]"]
SCORE_DECIMALS = 6
REQUIRED_CHAR_SCORE_STEP = 1e-4  # the Unigram trainer's spacing between the rare characters it adds
SPACE_MARKER = "▁"  # Metaspace's stand-in for the space before a word
# UnigramTrainer options (its defaults: 2 EM iterations before each pruning, which keeps 3/4 of the
# pieces). A frequent whole word ("▁and") starts far less likely than its spelling "▁" + "and" (a
# candidate scores by how many distinct words hold it, a character by how often it occurs); EM needs
# ~5 iterations on WikiText-2, one more per 10x the text, to lift it past that, or it is pruned. So
# 8 leave room for ~100x WikiText-2; halving the pieces at each pruning pays for them.
EM_ITERATIONS_PER_PRUNING = 8
SHRINKING_FACTOR = 0.5
WORD_END_EXAMPLES_PER_PIECE = 1 / 4  # the most frequent words given one, per vocabulary piece
WORD_COUNT_STRIDE = 4  # words counted in every 4th batch: enough to rank the frequent ones


def parse_args(argv=None):
    parser = OneLineErrorParser(description="Train a Unigram tokenizer for masked-LM pretraining.")
    data = corpus.add_corpus_flags(parser, splits=["train"])
    data.add_argument(
        "--batch_size",
        type=positive_int,
        default=1000,
        help="How many rows the trainer is handed at a time (default: 1000).",
    )
    add = parser.add_argument_group("tokenizer").add_argument
    add(
        "--vocab_size",
        type=int,
        default=32000,
        help="How many pieces the vocabulary holds, the special tokens included (default: 32000).",
    )
    add(
        "--lowercase",
        action="store_true",
        help="Lower-case all text before it is split into pieces, in training and in every later "
        "use of the tokenizer (for tasks whose text is lower-cased, such as GLUE's SST-2).",
    )
    add(
        "--split_hyphens",
        action="store_true",
        help="Read a hyphen inside a word as a word of its own (straight-faced as "
        "straight - faced, WikiText's role @-@ playing as role - playing), in training and in "
        "every later use.",
    )
    add("--output_dir", required=True, help="The local folder to save the tokenizer to.")
    add(
        "--overwrite_output_dir",
        action="store_true",
        help="Replace a tokenizer already saved in --output_dir.",
    )
    add = parser.add_argument_group("Hub").add_argument
    add(
        "--push_to_hub",
        "--export_to_hub",
        action="store_true",
        help="Also push the tokenizer to the Hub, with a short README.md.",
    )
    add(
        "--hub_model_id",
        help="The Hub repository to push to, e.g. my-user/my-tokenizer: created (or found) before "
        "training starts.",
    )
    add(
        "--hub_private",
        action="store_true",
        help="Make the Hub repository private, if it is created by this run.",
    )
    return parser.parse_args(argv)


def check_args(args):
    if args.vocab_size <= len(SPECIAL_TOKENS):
        raise UsageError(
            f"--vocab_size {args.vocab_size} leaves no room beside the {len(SPECIAL_TOKENS)} "
            f"special tokens {SPECIAL_TOKENS}; use at least {len(SPECIAL_TOKENS) + 1} (thousands "
            "in practice)."
        )
    if args.push_to_hub and not args.hub_model_id:
        raise UsageError("--push_to_hub needs --hub_model_id (e.g. my-user/my-tokenizer).")
    if args.hub_private and not args.push_to_hub:
        raise UsageError("--hub_private only applies with --push_to_hub.")
    if args.push_to_hub:
        hub.check_hub_model_id(args.hub_model_id, example="my-user/my-tokenizer")
    # the local file system would take gs://x for a folder named "gs:"
    if storage.is_remote(args.output_dir):
        raise UsageError(
            f"--output_dir {args.output_dir} is not a local folder; train_unigram.py saves the "
            "tokenizer locally (the next steps load it from a folder or the Hub): pass a local "
            "path, and copy the folder wherever needed."
        )
    storage.check_local_output_dir(args.output_dir)
    existing = os.path.exists(os.path.join(args.output_dir, contract.TOKENIZER_FILE))
    if existing and not args.overwrite_output_dir:
        raise UsageError(
            f"--output_dir {args.output_dir} already holds a tokenizer; "
            "pass --overwrite_output_dir to replace it, or choose another folder."
        )
    storage.check_gcs_paths({"--train_file": args.train_file})  # in seconds, not minutes of retries
    return None if args.train_file is None else corpus.input_files(args.train_file, "--train_file")


def corpus_rows(args, files, source):
    """The first --limit texts (all without it): files streamed one after another in any format
    corpus.file_rows reads (no Arrow cache to build: training starts at once), a Hub dataset through
    datasets; a reading error is one line too."""
    if files is not None:
        rows = (text for path in files for text in corpus.file_rows(path, args.text_column))
    else:
        dataset = hub_datasets.load_split(
            "train",
            args.dataset_name,
            args.dataset_config,
            trust_remote_code=args.trust_remote_code,
            streaming=args.streaming,
        )
        rows = corpus.dataset_column(dataset, args.text_column, args.batch_size)
    return itertools.islice(corpus.reading_errors_as_usage_errors(rows, source), args.limit)


def training_batches(rows, batch_size, vocab_size, counts, normalize):
    """Batches of the non-blank texts (blank ones carry no tokens and would only skew piece counts),
    then word-end examples of the most frequent words (see word_end_examples); `counts` says how
    many rows and texts were read. The words are counted as `normalize` (the normalizer) gives
    them."""
    word_counts = collections.Counter()
    for index, batch in enumerate(corpus.text_batches(corpus.counted(rows, counts), batch_size)):
        counts["texts"] += len(batch)
        if index % WORD_COUNT_STRIDE == 0:
            for text in batch:
                word_counts.update(normalize(text).split())
        yield batch
    yield word_end_examples(word_counts, int(vocab_size * WORD_END_EXAMPLES_PER_PIECE))  # maybe []


def word_end_examples(word_counts, how_many):
    """The `how_many` most frequent words that start no longer word, each with a "▁" after: "▁and▁".

    The Unigram trainer takes its candidate pieces from a suffix array over the distinct words, each
    ended by a separator, and drops every candidate that runs into one. So a string that only ever
    ends a word ("▁and", "▁,") is never a candidate, and is spelled "▁" + "and": on WikiText-2, 18%
    of all tokens were a bare "▁". One example with something after the word makes it a candidate
    ("▁the" is one already: "▁then" goes on), and one more occurrence changes no count that matters.
    """
    words = sorted(word_counts)

    def starts_a_longer_word(word):
        # the longer words that start with `word` sort right after it
        following = bisect.bisect_right(words, word)
        return following < len(words) and words[following].startswith(word)

    frequent = heapq.nsmallest(how_many, word_counts.items(), key=lambda item: (-item[1], item[0]))
    return sorted(word + SPACE_MARKER for word, _ in frequent if not starts_a_longer_word(word))


def build_tokenizer(lowercase=False, split_hyphens=False):
    """The tokenizer as saved: NFKC (then hyphens split and lower case, if asked), stripped,
    Metaspace pre-tokenizer and decoder, no pieces."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokenizer = Tokenizer(models.Unigram())
    # NFKC folds look-alike code points (full-width letters, ligatures) so they share pieces. Spaces
    # at either end of a text (or by a special token) separate no words: each would be a bare "▁".
    # Lower-casing spends no pieces on capitals ("The", "the"): on lower-cased text, such as
    # SST-2's, a cased vocabulary's capitalised pieces are never used.
    steps = [normalizers.NFKC()]
    if split_hyphens:
        # A Metaspace vocabulary spells a word that follows a hyphen ("faced" in "straight-faced")
        # with the pieces of a word's middle, rarer than the word's own "▁faced"; WikiText writes
        # the hyphen as " @-@ ", a word of its own. Both become " - ", so that every word is read
        # as itself, however the text wrote the hyphen ("--", a dash, stays as it is).
        steps.append(normalizers.Replace(" @-@ ", " - "))
        steps.append(normalizers.Replace(Regex(r"(?<=[^\s-])-(?=[^\s-])"), " - "))
    if lowercase:
        steps.append(normalizers.Lowercase())
    tokenizer.normalizer = normalizers.Sequence(steps + [normalizers.Strip()])
    metaspace = dict(replacement=SPACE_MARKER, prepend_scheme="always")
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(**metaspace)
    tokenizer.decoder = decoders.Metaspace(**metaspace)
    return tokenizer


def training_pre_tokenizer():
    """Metaspace as the trainer sees it: split at spaces only, so that a word-end example ("▁and▁")
    stays one word. On text it splits where Metaspace does (at each space, kept as the next word's
    "▁"); only a "▁" typed in the text itself stays inside a word here."""
    from tokenizers import pre_tokenizers

    at_spaces = pre_tokenizers.Split(" ", "merged_with_next")
    return pre_tokenizers.Sequence(
        [at_spaces, pre_tokenizers.Metaspace(SPACE_MARKER, "always", split=False)]
    )


def build_trainer(vocab_size, show_progress=True):
    from tokenizers import trainers

    options = dict(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, unk_token="<unk>")
    options.update(n_sub_iterations=EM_ITERATIONS_PER_PRUNING, shrinking_factor=SHRINKING_FACTOR)
    return trainers.UnigramTrainer(show_progress=show_progress, **options)


def canonical_vocabulary(tokenizer_json):
    """Fix the trainer's run-to-run wobble, so that one corpus always gives one byte-identical file.

    Two things vary between runs of the trainer. It sums log-probabilities in an order set by
    threads and hash maps, so a piece's score changes in the 15th digit. And it gives each rare
    character it must keep but did not learn the lowest score plus 0, 1e-4, 2e-4, ... in hash order.
    So: hand those steps to the characters in sorted order, round every score to six decimals, and
    order the pieces by (score, piece). The special tokens keep their ids at the front.
    """
    model = tokenizer_json["model"]
    vocab = [[piece, score] for piece, score in model["vocab"] if piece not in SPECIAL_TOKENS]
    lowest = min(score for _, score in vocab)

    def required_char_step(entry):
        piece, score = entry
        steps = (score - lowest) / REQUIRED_CHAR_SCORE_STEP
        return len(piece) == 1 and abs(steps - round(steps)) < 1e-6 and round(steps) < len(vocab)

    required = sorted(filter(required_char_step, vocab), key=lambda entry: entry[1])
    for entry, piece in zip(required, sorted(piece for piece, _ in required)):
        entry[0] = piece
    rest = [[piece, round(score, SCORE_DECIMALS)] for piece, score in vocab]
    rest.sort(key=lambda e: (-e[1], e[0]))
    model["vocab"] = [[token, 0.0] for token in SPECIAL_TOKENS] + rest
    model["unk_id"] = SPECIAL_TOKENS.index("<unk>")
    return tokenizer_json


def train_tokenizer(
    rows, vocab_size, batch_size, counts, source, lowercase=False, split_hyphens=False
):
    """Train on the texts of `rows`, fix the vocabulary's order, add [CLS] ... [SEP] and [MASK]."""
    from tokenizers import AddedToken, Tokenizer, processors

    tokenizer = build_tokenizer(lowercase, split_hyphens)
    tokenizer.pre_tokenizer = training_pre_tokenizer()
    normalize = tokenizer.normalizer.normalize_str
    batches = training_batches(rows, batch_size, vocab_size, counts, normalize)
    tokenizer.train_from_iterator(batches, trainer=build_trainer(vocab_size))
    if tokenizer.get_vocab_size() <= len(SPECIAL_TOKENS):
        raise UsageError(
            f"the corpus {source} has no non-blank text to learn from; check it and --text_column."
        )
    tokenizer.pre_tokenizer = build_tokenizer().pre_tokenizer  # the one saved
    tokenizer = Tokenizer.from_str(json.dumps(canonical_vocabulary(json.loads(tokenizer.to_str()))))
    special = [(token, tokenizer.token_to_id(token)) for token in ("[CLS]", "[SEP]")]
    template = dict(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1")
    tokenizer.post_processor = processors.TemplateProcessing(special_tokens=special, **template)
    # "the [MASK] of" must tokenize like "the capital of": the mask absorbs the space before it, as
    # the word piece it stands for ("▁capital") does.
    tokenizer.add_special_tokens([AddedToken("[MASK]", lstrip=True, special=True)])
    return tokenizer


def wrap_for_transformers(tokenizer):
    from transformers import PreTrainedTokenizerFast

    names = dict(cls_token="[CLS]", sep_token="[SEP]", bos_token="[CLS]", eos_token="[SEP]")
    names.update(unk_token="<unk>", pad_token="<pad>", mask_token="[MASK]")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **names)


def save(tokenizer, output_dir):
    """Save the folder so that an interruption never leaves one that looks finished: through a
    staging folder, tokenizer.json (what marks a tokenizer folder) last. Returns the names."""
    with storage.staged_folder(output_dir, last=contract.TOKENIZER_FILE) as folder:
        tokenizer.save_pretrained(folder)
        names = sorted(os.listdir(folder))
    return names


def main(args):
    tf_startup.keep_off_the_tpu()  # before TensorFlow loads (a gs:// corpus is listed with it)
    files = check_args(args)  # bad input refused in one line; --train_file's files (None: Hub)
    # The Hub repository first: a bad id, a missing login or no network should cost no training.
    repo_id = None
    if args.push_to_hub:
        repo_id = hub.open_repository(args.hub_model_id, args.hub_private, "--push_to_hub")
    source = args.train_file or f"{args.dataset_name}/{args.dataset_config}"  # a glob as given
    rows = corpus_rows(args, files, source)
    cased = "lower-cased" if args.lowercase else "cased"
    hyphens = ", hyphens split," if args.split_hyphens else ""
    print(f"Training a {cased}{hyphens} Unigram tokenizer of {args.vocab_size} pieces on {source}.")
    counts = collections.Counter()
    trained = train_tokenizer(
        rows,
        args.vocab_size,
        args.batch_size,
        counts,
        source,
        lowercase=args.lowercase,
        split_hyphens=args.split_hyphens,
    )
    tokenizer = wrap_for_transformers(trained)
    names = save(tokenizer, args.output_dir)
    learned = f"learned from {counts['texts']} non-blank of {counts['rows']} rows"
    print(f"Saved the tokenizer ({len(tokenizer)} tokens), {learned}, to {args.output_dir}")
    if repo_id is not None:
        card = cards.tokenizer_card(repo_id, tokenizer, SPECIAL_TOKENS, source, counts)
        message = f"Unigram tokenizer, {len(tokenizer)} tokens"
        commit = hub.push_folder_files(
            repo_id, args.output_dir, names, card, message, what="the tokenizer"
        )
        print(f"Pushed the tokenizer to the Hub: {commit.commit_url}")
    return tokenizer


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "train_unigram.py")
