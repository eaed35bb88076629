"""The README.md cards that go with what the pipeline publishes: the tokenizer's and the model's.

The metadata block at the top of each card (library, pipeline, tags) is written by huggingface_hub's
ModelCardData, so it is the YAML the Hub reads.
"""


def metadata_block(**fields):
    """The card's front matter: `---`, the YAML of huggingface_hub.ModelCardData(**fields), `---`."""
    from huggingface_hub import ModelCardData

    return f"---\n{ModelCardData(**fields).to_yaml()}\n---"


def tokenizer_card(repo_id, tokenizer, special_tokens, source, counts):
    """A short README.md for a tokenizer trained by train_unigram.py on `source` (`counts`: rows and texts read)."""
    special = ", ".join(f"`{token}` ({tokenizer.convert_tokens_to_ids(token)})" for token in special_tokens)
    return "\n".join(
        [
            metadata_block(library_name="transformers", tags=["tokenizer", "unigram"]),
            "",
            f"# {repo_id}",
            "",
            f"A Unigram tokenizer of {len(tokenizer):,} tokens, trained from scratch with 🤗 tokenizers by "
            f"`train_unigram.py` on {source} ({counts['texts']:,} non-blank texts of {counts['rows']:,} rows), for "
            "masked-language-model pretraining.",
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
