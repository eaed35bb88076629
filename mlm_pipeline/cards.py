"""What every README.md card the pipeline writes shares (the tokenizer's, the model's, the
classifier's): the metadata block at the top, and how a card names the folders a run used; and
train_unigram.py's card of the tokenizer it trains, the shortest of them (run_mlm.py's is in
model_card.py, run_classifier.py's in classifier_folder.py).

The metadata block (library, pipeline, tags) is written by huggingface_hub's ModelCardData, so it is
the YAML the Hub reads. A card is meant to be public, so the data, the tokenizer and the output
folder are named by `public_name()`, never by a local path.
"""

import os

from .storage import is_local_path, is_remote


def public_name(path):
    """How a card names a folder, file or repository the run used: a Hub id or a gs:// path as
    given, a local path by its base name alone.

    A local path such as /home/<user>/runs/... says who ran the pipeline where, and nothing a reader
    can open. A gs:// path stays: it names no machine nor user, and the bucket is one the user chose
    to train from (the card is written to --output_dir before any push, to be read there first). A
    Hub id and a relative local path look alike; the one that exists here, or that is absolute or
    starts with ~ or ., is taken as local (a card may also name a path from another machine: the
    source a manifest recorded).
    """
    if not path or is_remote(path):
        return path
    if is_local_path(path):
        # abspath: "." and "a/b/" name a folder
        return os.path.basename(os.path.abspath(os.path.expanduser(path)))
    return path


def model_name(hub_model_id, output_dir):
    """The title of a trained model's card (run_mlm.py's, run_classifier.py's): its Hub id, else
    its output folder's name."""
    return hub_model_id or os.path.basename(output_dir.rstrip("/"))


def metadata_block(**fields):
    """The card's front matter: `---`, the YAML of huggingface_hub.ModelCardData(**fields),
    `---`."""
    from huggingface_hub import ModelCardData

    return f"---\n{ModelCardData(**fields).to_yaml()}\n---"


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
