"""The pretrained model run_classifier.py starts from: a run_mlm.py output folder (local or gs://)
or a Hub id, checked before any data is read or any model built.

A finished run_mlm.py folder holds config.json (written last), tf_model.h5 and the tokenizer. A
folder without config.json is no model (a run still training has none yet); one whose tokenizer
has more tokens than the model's vocabulary, or no padding token, does not go with it; a
`--max_length` longer than the model's position embeddings cannot be fed to it. Each is one line.
"""

import os
import tempfile

from . import contract
from .contract import FINISHED_RUN_MARKER, FIXED_PADDING_INDEX_MODELS, TOKENIZER_FILES
from .errors import UsageError, first_line
from .storage import is_remote

TF_WEIGHTS_NAME = "tf_model.h5"
FLAG = "--model_name_or_path"
HINT = "pass the --output_dir of a finished run_mlm.py run, or a Hub id"


class PretrainedModel:
    """`name` as given; `source`, what transformers loads (a gs:// folder is copied to a local
    temporary folder first, removed when this object goes); `config` and `tokenizer`; `positions`,
    the longest sequence the model's position embeddings take."""

    def __init__(self, name, weights=True, trust_remote_code=False):
        self.name, self.source = name, name
        if is_remote(name):
            self.local_copy = tempfile.TemporaryDirectory(prefix="pretrained-")
            contract.copy_folder_files(name, self.local_copy.name)
            self.source = self.local_copy.name
        if os.path.isdir(self.source):
            check_model_folder(self.source, name, weights)
        elif os.path.exists(self.source) or self.source.startswith((".", "/", "~")):
            raise UsageError(f"{FLAG} {name} is not a model folder; {HINT}.")
        self.config = load_config(self.source, name, trust_remote_code)
        self.tokenizer = contract.load_tokenizer(self.source, FLAG, trust_remote_code)
        check_tokenizer(self.tokenizer, self.config, name)
        self.positions = self.config.max_position_embeddings
        if self.config.model_type in FIXED_PADDING_INDEX_MODELS:
            # RoBERTa numbers positions from pad_token_id + 1: those first rows are never used.
            self.positions -= self.config.pad_token_id + 1

    def check_max_length(self, max_length, default):
        """The sequence length to pad and cut to: `max_length`; when None, `default`, or less if the
        model has fewer positions or was pretrained on shorter sequences (run_mlm.py saves their
        length as the tokenizer's model_max_length): positions it never saw would start random."""
        if max_length is None:
            return min(default, self.positions, self.tokenizer.model_max_length)
        if max_length > self.positions:
            raise UsageError(
                f"--max_length {max_length} is longer than the {self.positions} positions of the "
                f"model {self.name}; pass --max_length {self.positions} or less."
            )
        return max_length


def check_model_folder(folder, name, weights):
    files = set(os.listdir(folder))
    if FINISHED_RUN_MARKER not in files:
        unfinished = ""
        if contract.CHECKPOINT_DIR in files:
            unfinished = " (run_mlm.py writes it last: is that run still training?)"
        raise UsageError(
            f"{FLAG} {name} holds no {FINISHED_RUN_MARKER}, so it is not a model "
            f"folder{unfinished}; {HINT}."
        )
    if weights and TF_WEIGHTS_NAME not in files:
        raise UsageError(
            f"{FLAG} {name} holds {FINISHED_RUN_MARKER} but no TF weights ({TF_WEIGHTS_NAME}); "
            f"{HINT}, or pass --from_scratch to train its architecture from random weights."
        )
    if not files & set(TOKENIZER_FILES):
        raise UsageError(
            f"{FLAG} {name} holds a model but no tokenizer ({' or '.join(TOKENIZER_FILES)}); "
            f"{HINT} (run_mlm.py saves the tokenizer beside the model)."
        )


def load_config(source, name, trust_remote_code):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except Exception as error:  # transformers raises many kinds for what it cannot read
        raise UsageError(
            f"could not load the model config of {FLAG} {name}: {first_line(error)[:300]}"
        ) from None


def check_tokenizer(tokenizer, config, name):
    """The tokenizer's ids must all have an embedding, and padding needs a padding token."""
    if len(tokenizer) > config.vocab_size:
        raise UsageError(
            f"the tokenizer in {FLAG} {name} has {len(tokenizer):,} tokens but the model's "
            f"vocabulary (vocab_size in {FINISHED_RUN_MARKER}) {config.vocab_size:,}, so they do "
            "not belong together; pass a folder run_mlm.py wrote, which holds the tokenizer it "
            "trained with."
        )
    if tokenizer.pad_token_id is None:
        raise UsageError(
            f"the tokenizer in {FLAG} {name} has no padding token, which fixed-length batches "
            "need; use a tokenizer from train_unigram.py."
        )


def load_weights(classifier_class, pretrained, config):
    """`classifier_class` (a TFAutoModelFor... class) with the pretrained weights and `config`;
    the weights it lacks (the new head) start random. transformers' notices about the LM head left
    out and the head made anew are expected here, so they are not shown; a file that cannot be
    loaded is one line."""
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        return classifier_class.from_pretrained(pretrained.source, config=config)
    except Exception as error:
        raise UsageError(
            f"could not load the weights of {FLAG} {pretrained.name}: {first_line(error)[:300]}"
        ) from None
    finally:
        logging.set_verbosity(verbosity)
