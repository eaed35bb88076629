"""Step 1's engine: a Unigram tokenizer trained with 🤗 tokenizers, its vocabulary made
deterministic, wrapped for transformers.

train_unigram.py reads its settings and checks them first (no TensorFlow, no transformers), then
imports this module. A good vocabulary: NFKC, a Metaspace pre-tokenizer ("▁" starts a word), EM long
enough before each pruning for frequent whole words to beat their spelling, and word-end examples
for the words the trainer would never propose. A deterministic one: one corpus gives one
byte-identical file.
"""

import bisect
import collections
import heapq
import json

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import PreTrainedTokenizerFast

from . import corpus
from .contract import SPECIAL_TOKENS
from .errors import UsageError

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
    at_spaces = pre_tokenizers.Split(" ", "merged_with_next")
    return pre_tokenizers.Sequence(
        [at_spaces, pre_tokenizers.Metaspace(SPACE_MARKER, "always", split=False)]
    )


def build_trainer(vocab_size, show_progress=True):
    """The Unigram trainer, with EM given the room to keep frequent whole words."""
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
    """The trained tokenizer as transformers loads it (AutoTokenizer), its special tokens named."""
    names = dict(cls_token="[CLS]", sep_token="[SEP]", bos_token="[CLS]", eos_token="[SEP]")
    names.update(unk_token="<unk>", pad_token="<pad>", mask_token="[MASK]")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **names)
