"""--whole_word_masking: run_mlm.py's masking choosing whole words, never part of one.

Training masks whole words (a word's pieces cannot then be read from its other pieces, the point
of it for larger models and longer training); evaluation keeps token masking, so runs compare.
"""

import functools

import tensorflow as tf

from .errors import UsageError

# "▁" begins a word in SentencePiece-style vocabularies (this project's, XLM-R's, Gemma's and so
# mmBERT's), "Ġ" in byte-level BPE (RoBERTa's, ModernBERT's); "##" continues one in WordPiece
MARKERS = ("▁", "Ġ", "##")


@functools.cache  # once per tokenizer
def pieces_and_marker(tokenizer):
    """The vocabulary's pieces, and the marker most of them carry (None: no piece carries one)."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    marker = max(MARKERS, key=lambda mark: sum(p.startswith(mark) for p in pieces))
    return pieces, marker if any(piece.startswith(marker) for piece in pieces) else None


def check_word_markers(tokenizer, tokenizer_flag):
    """--whole_word_masking with a tokenizer whose pieces say nothing of where words start is
    refused in one line, before any data is read; `tokenizer_flag` names the tokenizer."""
    if pieces_and_marker(tokenizer)[1] is None:
        raise UsageError(
            f"--whole_word_masking needs to see where words start, but {tokenizer_flag} marks no "
            "word in its vocabulary (no piece begins with ▁ or Ġ, none goes on a word with ##); "
            "leave out --whole_word_masking to mask single tokens, or use a tokenizer whose "
            "pieces mark words (train_unigram.py's, or a SentencePiece, byte-level BPE or "
            "WordPiece one)."
        )


@functools.cache  # once per tokenizer, not once per input pipeline and phase
def word_start_table(tokenizer):
    """[vocabulary] booleans: does this piece begin a word? From the vocabulary's own markers
    (MARKERS): "▁" or "Ġ" begins one, "##" continues one."""
    pieces, marker = pieces_and_marker(tokenizer)
    if marker is None:
        check_word_markers(tokenizer, "the tokenizer")
    return [piece.startswith(marker) != (marker == "##") for piece in pieces]


def ranking(input_ids, maskable, noise, count, predictions, word_starts):
    """--whole_word_masking: masked_lm_data.mask_tokens()'s ranking and used slots, by whole words.

    A word is a piece that begins one (`word_starts`, word_start_table() as a tensor) and the
    pieces after it that do not; a special token, or the first piece of a sequence cut from a
    longer text, always begins one. Every piece takes its word's draw of `noise`, so a word's
    pieces rank side by side (top_k keeps ties in order), and words are taken for as long as their
    pieces fit in the sequence's `count`: no word is ever partly chosen.
    """
    length = input_ids.shape[-1]
    follows_special = tf.pad(~maskable[:, :-1], [[0, 0], [1, 0]], constant_values=True)
    starts = tf.gather(word_starts, input_ids) | ~maskable | follows_special
    word = tf.cumsum(tf.cast(starts, tf.int32), axis=-1) - 1  # each position's word, from 0
    word_noise = tf.gather(noise, word, batch_dims=1)
    k = min(predictions + 1, length)
    _, ranked = tf.math.top_k(tf.where(maskable, word_noise, -1.0), k=k)
    ranked_word = tf.gather(word, ranked, batch_dims=1)
    word_ends = tf.pad(
        ranked_word[:, 1:] != ranked_word[:, :-1], [[0, 0], [0, 1]], constant_values=True
    )
    # The ranking up to its last word end within the count: whole words only, never over it.
    taken = tf.range(1, k + 1)[None, :]
    cutoff = tf.reduce_max(tf.where(word_ends & (taken <= count[:, None]), taken, 0), axis=-1)
    return ranked[:, :predictions], tf.range(predictions)[None, :] < cutoff[:, None]
