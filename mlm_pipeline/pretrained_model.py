"""The published model a run starts from: run_classifier.py's to fine-tune (`PretrainedModel`), and
run_mlm.py's to pretrain further (`Parent`, with every rule of continued pretraining). A run_mlm.py
output folder (local or gs://), a folder laid out as on the Hub, or a Hub id, checked with its
tokenizer before any data is read or any model built, and its weights loaded.

A finished run_mlm.py folder holds config.json (written last), tf_model.h5 and the tokenizer. A
folder without config.json is no model (a run still training has none yet); one whose tokenizer
has more tokens than the model's vocabulary, or no padding token, does not go with it; a sequence
longer than the model's position embeddings cannot be fed to it. Each is one line.

The weights: TF's own (tf_model.h5) when the model has them, else PyTorch safetensors read without
torch (pytorch_weights.py), else a pytorch_model.bin through torch, if it is installed.
"""

import importlib.util
import os
import tempfile

from . import architecture, contract, modernbert_config, pytorch_weights
from .cards import public_name
from .contract import (
    CHECKPOINT_DIR,
    FINISHED_RUN_MARKER,
    PYTORCH_WEIGHTS_INDEX_NAME,
    PYTORCH_WEIGHTS_NAME,
    TF_WEIGHTS_INDEX_NAME,
    TF_WEIGHTS_NAME,
    TOKENIZER_FILES,
    TORCH_WEIGHTS_NAME,
    WEIGHTS_NAMES,
)
from .errors import UsageError, first_line
from .storage import is_hub_id, is_remote

FLAG = "--model_name_or_path"


class PretrainedModel:
    """run_classifier.py --model_name_or_path `name`: `source`, what transformers loads (a gs://
    folder is copied to a local temporary folder first, removed when this object goes); `hub_id`,
    `name` when it is a Hub id (None for a folder); `config` and `tokenizer`; `positions`, the
    longest sequence the model's position embeddings take. `weights` False: its architecture alone
    is used, so a folder need not hold weights."""

    # what to do instead, for the model given: a Hub id, or a folder
    HINT_HUB = "pass another Hub id, or the --output_dir of a finished run_mlm.py run"
    HINT_FOLDER = "pass the --output_dir of a finished run_mlm.py run, or a Hub id"
    NO_WEIGHTS_HINT = "or pass --from_scratch to train its architecture from random weights"
    # a classifier needs no mask token; a parent of continued pretraining does (Parent)
    NEEDS_MASK_TOKEN = False

    def __init__(self, name, weights=True, trust_remote_code=False):
        self.name, self.source, self.hub_id = name, name, None
        if is_remote(name):
            self.local_copy = tempfile.TemporaryDirectory(prefix="pretrained-")
            contract.copy_folder_files(name, self.local_copy.name)
            self.source = self.local_copy.name
        if is_hub_id(self.source):
            self.hub_id = name
        elif os.path.isdir(self.source):
            self.check_folder(weights)
        else:
            raise UsageError(f"{FLAG} {name} is not a model folder; {self.HINT_FOLDER}.")
        self.hint = self.HINT_HUB if self.hub_id else self.HINT_FOLDER
        self.config = self.load_config(trust_remote_code)
        self.tokenizer = contract.load_tokenizer(
            self.source, FLAG, trust_remote_code, require_mlm_tokens=self.NEEDS_MASK_TOKEN
        )
        self.check_tokenizer()
        # RoBERTa's first rows come before its first position; BERT and ModernBERT have none such
        self.positions = architecture.longest_sequence(self.config)

    def check_folder(self, weights):
        files = set(os.listdir(self.source))
        if FINISHED_RUN_MARKER not in files:
            unfinished = ""
            if CHECKPOINT_DIR in files:
                unfinished = " (run_mlm.py writes it last: is that run still training?)"
            raise UsageError(
                f"{FLAG} {self.name} holds no {FINISHED_RUN_MARKER}, so it is not a model "
                f"folder{unfinished}; {self.HINT_FOLDER}."
            )
        if weights and not files & set(WEIGHTS_NAMES):
            raise UsageError(
                f"{FLAG} {self.name} holds {FINISHED_RUN_MARKER} but no weights "
                f"({', '.join(WEIGHTS_NAMES)}); {self.HINT_FOLDER}, {self.NO_WEIGHTS_HINT}."
            )
        if not files & set(TOKENIZER_FILES):
            raise UsageError(
                f"{FLAG} {self.name} holds a model but no tokenizer "
                f"({' or '.join(TOKENIZER_FILES)}); {self.HINT_FOLDER} (run_mlm.py saves the "
                "tokenizer beside the model)."
            )

    def load_config(self, trust_remote_code):
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(self.source, trust_remote_code=trust_remote_code)
        except Exception as error:  # transformers raises many kinds for what it cannot read
            raise UsageError(
                f"could not load the model config of {FLAG} {self.name}: {first_line(error)[:300]}"
            ) from None
        architecture.register_tf_family(config)  # ModernBERT's TF class, written here
        return config

    def check_tokenizer(self):
        """The tokenizer's ids must all have an embedding, and padding needs a padding token."""
        tokenizer, vocab_size = self.tokenizer, self.config.vocab_size
        if len(tokenizer) > vocab_size:
            raise UsageError(
                f"the tokenizer in {FLAG} {self.name} has {len(tokenizer):,} tokens but the "
                f"model's vocabulary (vocab_size in {FINISHED_RUN_MARKER}) {vocab_size:,}, so they "
                f"do not belong together; {self.hint}."
            )
        if tokenizer.pad_token_id is None:
            raise UsageError(
                f"the tokenizer in {FLAG} {self.name} has no padding token, which fixed-length "
                f"batches need; {self.hint}."
            )

    def check_max_length(self, max_length, default):
        """The sequence length to pad and cut to: `max_length`; when None, `default`, or less if the
        model has fewer positions or was pretrained on shorter sequences (run_mlm.py saves their
        length as the tokenizer's model_max_length): positions it never saw would start random."""
        if max_length is None:
            return min(default, self.positions, self.tokenizer.model_max_length)
        self.check_positions(f"--max_length {max_length}", max_length, "pass --max_length")
        return max_length

    def check_positions(self, what, length, remedy):
        """`what` (`length` tokens) must fit in the model's positions; `remedy` says how to make it
        shorter, up to the number of positions."""
        if length > self.positions:
            raise UsageError(
                f"{what} is longer than the {self.positions} positions of the model {self.name}; "
                f"{remedy} {self.positions} or less."
            )


class Parent(PretrainedModel):
    """run_mlm.py --model_name_or_path `name`: the masked LM continued pretraining starts from, with
    every rule of it, each refused in one line before the output folder is touched.

    `config`: the parent's own, as it is but for its dropout (`config_overrides` may change nothing
    else: any other key would reshape its weights or change what they mean, and is refused before
    the parent is even looked up). It must be a masked LM TF can build (a ModernBERT with an even
    local_attention, the window it attends in effect); `check_continuation()` then
    checks the tokenizer and shards a run pairs with it, and `masked_lm()` loads every weight, the
    LM head's included.

    A Parent is one of run_mlm.py's two origins, with the face of masked_lm_model.Scratch (random
    weights): `name` (recorded in run_settings.json), `hub_id` (the card's base_model, None for a
    folder), `branch` (None), `evaluates_first` (True: the run scores the parent before its first
    step), `tokenizer`, `check_continuation()`, `config_for()`, `masked_lm()`, `card_tag` and
    `card_origin()`; masked_lm_model.py's docstring describes each."""

    NO_WEIGHTS_HINT = (
        f"or leave out {FLAG} and pass it as --pretrained_model_config to train its architecture "
        "from random weights"
    )
    NEEDS_MASK_TOKEN = True
    branch = None  # its weights alone: the optimizer, the step and the schedule start afresh
    evaluates_first = True  # where the parent stands on this text, before the first step
    card_tag = "continued-pretraining"

    def __init__(self, name, config_overrides=None, trust_remote_code=False):
        reshaping = [
            key for key, _ in architecture.overrides_items(config_overrides) if "dropout" not in key
        ]
        if reshaping:
            raise UsageError(
                f"--config_overrides {config_overrides} would change {', '.join(reshaping)} of the "
                f"model {FLAG} {name}, whose weights continued pretraining starts from; only "
                "dropout may change (e.g. hidden_dropout_prob=0, or ModernBERT's "
                "attention_dropout=0), or leave out "
                f"{FLAG} to pretrain another shape from random weights."
            )
        super().__init__(name, weights=True, trust_remote_code=trust_remote_code)
        architecture.check_masked_lm(self.config, f"{FLAG} {name}", "pass a masked LM")
        modernbert_config.check_local_attention(
            self.config,
            f"{FLAG} {name}",
            "it was trained as with local_attention {even}: write that into its config.json "
            "(the same model) and pass that folder",
        )
        architecture.apply_overrides(self.config, config_overrides)
        self.config._name_or_path = name  # as given: what run_settings.json records

    def check_continuation(self, tokenizer, tokenizer_flag, max_length):
        """The tokenizer of the shards (`tokenizer_flag` names where it came from: --tokenizer, or
        this model's own) must mean by every id what the parent's does, since its embeddings are
        rows of its own (and so has the parent's mask token); the shards' `max_length` tokens must
        fit in the parent's positions."""
        fingerprint = contract.vocabulary_fingerprint
        if fingerprint(tokenizer) != fingerprint(self.tokenizer):
            raise UsageError(
                f"{tokenizer_flag} has a vocabulary other than that of {FLAG} {self.name}, whose "
                "embeddings are rows of its own; leave out --tokenizer to use the model's, and "
                "make the shards with it (prepare_tfrecord_shards.py --tokenizer_name_or_path "
                f"{self.name})."
            )
        self.check_positions(
            f"the shards' length, {max_length} tokens,",
            max_length,
            "remake the shards with prepare_tfrecord_shards.py --max_length",
        )

    def config_for(self, tokenizer, max_length):
        """The parent's config as it is, but for dropout: check_continuation() has checked the
        tokenizer and `max_length` against it."""
        return self.config

    def masked_lm(self, config):
        """The parent as a TF masked LM of `config` (its own), every weight its own: one it lacks
        (a base model's, or a head published apart) would start random, so it is refused."""
        from transformers import TFAutoModelForMaskedLM  # the parent's loader alone needs it here

        return load_weights(TFAutoModelForMaskedLM, self, config, whole=True)

    def card_origin(self, text):
        """Where the weights started, for the model card: this model, continued on `text`."""
        return (
            f"pretrained further from `{public_name(self.name)}` (its weights, LM head included, "
            f"were the start) on the text of {text}"
        )


def load_weights(model_class, pretrained, config, whole=False):
    """`model_class` (a TFAutoModelFor... class) built from `config`, with the pretrained weights:
    TF's own when the model has them (transformers' `from_pretrained`), else its PyTorch ones. A
    weight loads when the checkpoint holds it under its PyTorch name, as in transformers 5,
    whichever file it comes from: the layers transformers' TF loader leaves new, since it matches
    a tf_model.h5 by layer name, are matched weight by weight (pytorch_weights.py; ModernBERT's
    classifier takes the masked LM's `head` so). The weights the checkpoint lacks start random: a
    classifier's new head. `whole`: the checkpoint must hold every weight, a masked LM's head
    included, or it is refused in one line. transformers' notices about layers left out or made
    anew are not shown; a file that cannot be loaded is one line."""
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        kind, files = weights_files(pretrained)
        if kind == "pytorch":
            model = model_class.from_config(config)
            model.build_in_name_scope()
            missing = pytorch_weights.assign_pytorch_weights(
                model, files, f"{FLAG} {pretrained.name}"
            )
        else:  # TF's own weights; or a pytorch_model.bin, which TF reads through torch
            model, loading = model_class.from_pretrained(
                pretrained.source,
                config=config,
                from_pt=kind == "torch",
                use_safetensors=False,  # transformers 4.57 TF fails on PyTorch safetensors
                output_loading_info=True,
            )
            missing = loading["missing_keys"]
            if kind == "tf" and files and missing:  # top-level layers the loader left new
                missing = pytorch_weights.assign_tf_weights_by_pytorch_name(
                    model, missing, files[0], f"{FLAG} {pretrained.name}"
                )
    except UsageError:
        raise
    except Exception as error:
        raise UsageError(
            f"could not load the weights of {FLAG} {pretrained.name}: {first_line(error)[:300]}"
        ) from None
    finally:
        logging.set_verbosity(verbosity)
    if whole and missing:
        raise UsageError(
            f"{FLAG} {pretrained.name} has no trained weights for {', '.join(missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''}: it is not a masked LM with its head (a base "
            "model, or one published without the head), and continued pretraining would start "
            "from a random head; pass a masked-LM checkpoint, or leave out --model_name_or_path "
            "to pretrain from random weights."
        )
    return model


def weights_files(pretrained):
    """("tf", [tf_model.h5] or None), ("pytorch", [safetensors files]) or ("torch", None): which
    weights the model has, in WEIGHTS_NAMES' order. A folder is listed; a Hub model's files are
    looked up (and downloaded, the chosen ones only) through transformers' cache. A TF checkpoint
    cut into several files gives None: transformers' loader matches those weight by weight."""
    if pretrained.hub_id is None:
        present = set(os.listdir(pretrained.source))

        def path(file_name):
            return os.path.join(pretrained.source, file_name) if file_name in present else None
    else:
        from transformers.utils import cached_file

        def path(file_name):
            return cached_file(
                pretrained.source, file_name, _raise_exceptions_for_missing_entries=False
            )

    tf_weights = path(TF_WEIGHTS_NAME)
    if tf_weights:
        return "tf", [tf_weights]
    if path(TF_WEIGHTS_INDEX_NAME):
        return "tf", None
    safetensors = path(PYTORCH_WEIGHTS_NAME)
    if safetensors:
        return "pytorch", [safetensors]
    index = path(PYTORCH_WEIGHTS_INDEX_NAME)
    if index:
        return "pytorch", [path(name) for name in pytorch_weights.index_shards(index)]
    if path(TORCH_WEIGHTS_NAME):
        if importlib.util.find_spec("torch") is not None:
            return "torch", None
        raise UsageError(
            f"{FLAG} {pretrained.name} has PyTorch weights only as {TORCH_WEIGHTS_NAME}, which "
            "TensorFlow reads through torch: pip install torch (its CPU build is enough), or pass "
            "a model with model.safetensors or tf_model.h5."
        )
    raise UsageError(
        f"{FLAG} {pretrained.name} has no weights ({', '.join(WEIGHTS_NAMES)}); {pretrained.hint}."
    )
