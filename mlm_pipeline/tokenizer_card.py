"""train_unigram.py's README.md card for the tokenizer it trains, pushed with it to the Hub."""

from .cards import metadata_block, public_name


def tokenizer_card(repo_id, tokenizer, special_tokens, source, counts):
    """A short README.md for a tokenizer trained by train_unigram.py on `source` (`counts`: rows
    and texts read)."""
    special = ", ".join(
        f"`{token}` ({tokenizer.convert_tokens_to_ids(token)})" for token in special_tokens
    )
    return "\n".join(
        [
            metadata_block(library_name="transformers", tags=["tokenizer", "unigram"]),
            "",
            f"# {repo_id}",
            "",
            f"A Unigram tokenizer of {len(tokenizer):,} tokens, trained from scratch with 🤗 "
            f"tokenizers by `train_unigram.py` on {public_name(source)} ({counts['texts']:,} "
            f"non-blank texts of {counts['rows']:,} rows), for masked-language-model pretraining.",
            "",
            "Text is NFKC-normalized and stripped, split at spaces by a Metaspace pre-tokenizer "
            "(`▁` marks the start of a word), and each text becomes `[CLS] tokens [SEP]`. Special "
            f"tokens (ids): {special}; `[MASK]` absorbs the space before it, as the word it stands "
            "for does.",
            "",
            "```python",
            "from transformers import AutoTokenizer",
            "",
            f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")',
            "```",
            "",
        ]
    )
