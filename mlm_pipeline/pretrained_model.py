"""The pretrained model a run starts from, run_mlm.py's (continued pretraining) and
run_classifier.py's (fine-tuning): a run_mlm.py output folder (local or gs://), a folder laid out as
on the Hub, or a Hub id, checked before any data is read or any model built, and its weights loaded.

A finished run_mlm.py folder holds config.json (written last), tf_model.h5 and the tokenizer. A
folder without config.json is no model (a run still training has none yet); one whose tokenizer
has more tokens than the model's vocabulary, or no padding token, does not go with it; a
`--max_length` longer than the model's position embeddings cannot be fed to it. Each is one line.

The weights: TF's own (tf_model.h5) when the model has them, else PyTorch safetensors read without
torch (pytorch_weights.py), else a pytorch_model.bin through torch, if it is installed.
"""

import importlib.util
import os
import tempfile

from . import contract, pytorch_weights
from .contract import FINISHED_RUN_MARKER, FIXED_PADDING_INDEX_MODELS, TOKENIZER_FILES
from .errors import UsageError, first_line
from .storage import is_remote

TF_WEIGHTS_NAME = "tf_model.h5"
TF_WEIGHTS_INDEX_NAME = "tf_model.h5.index.json"
TORCH_WEIGHTS_NAME = "pytorch_model.bin"
# What a folder may hold its weights in, in the order they are preferred.
WEIGHTS_NAMES = (
    TF_WEIGHTS_NAME,
    TF_WEIGHTS_INDEX_NAME,
    pytorch_weights.SAFETENSORS_NAME,
    pytorch_weights.SAFETENSORS_INDEX_NAME,
    TORCH_WEIGHTS_NAME,
)
FLAG = "--model_name_or_path"
HINT = "pass the --output_dir of a finished run_mlm.py run, or a Hub id"


class PretrainedModel:
    """`name` as given; `source`, what transformers loads (a gs:// folder is copied to a local
    temporary folder first, removed when this object goes); `hub_id`, `name` when it is a Hub id
    (None for a folder); `config` and `tokenizer`; `positions`, the longest sequence the model's
    position embeddings take."""

    def __init__(self, name, weights=True, trust_remote_code=False):
        self.name, self.source, self.hub_id = name, name, None
        if is_remote(name):
            self.local_copy = tempfile.TemporaryDirectory(prefix="pretrained-")
            contract.copy_folder_files(name, self.local_copy.name)
            self.source = self.local_copy.name
        if os.path.isdir(self.source):
            check_model_folder(self.source, name, weights)
        elif os.path.exists(self.source) or self.source.startswith((".", "/", "~")):
            raise UsageError(f"{FLAG} {name} is not a model folder; {HINT}.")
        else:
            self.hub_id = name
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
    if weights and not files & set(WEIGHTS_NAMES):
        raise UsageError(
            f"{FLAG} {name} holds {FINISHED_RUN_MARKER} but no weights "
            f"({', '.join(WEIGHTS_NAMES)}); {HINT}, or pass --from_scratch to train its "
            "architecture from random weights."
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


def check_continuation(parent, tokenizer, max_length):
    """run_mlm.py --model_name_or_path: the parent must be a masked LM TF can build, its tokenizer
    the shards' (a --tokenizer with another vocabulary would give its rows other meanings), and its
    positions must hold the shards' `max_length` tokens. Each refusal is one line, before the
    weights are loaded."""
    from transformers.models.auto.modeling_tf_auto import TF_MODEL_FOR_MASKED_LM_MAPPING_NAMES

    model_type = parent.config.model_type
    if model_type not in TF_MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        raise UsageError(
            f"{FLAG} {parent.name} is a {model_type} model, which has no TF masked-LM class in "
            "transformers, so it cannot be pretrained further here; pass a masked LM (e.g. "
            f"{', '.join(sorted(TF_MODEL_FOR_MASKED_LM_MAPPING_NAMES)[:8])}, ...)."
        )
    given = tokenizer is not parent.tokenizer  # --tokenizer named one
    if given and contract.vocabulary_fingerprint(tokenizer) != contract.vocabulary_fingerprint(
        parent.tokenizer
    ):
        raise UsageError(
            f"--tokenizer has a vocabulary other than that of {FLAG} {parent.name}, whose "
            "embeddings are rows of its own; leave out --tokenizer to use the model's, and make "
            "the shards with it (prepare_tfrecord_shards.py --tokenizer_name_or_path "
            f"{parent.name})."
        )
    if tokenizer.mask_token_id is None:
        raise UsageError(
            f"the tokenizer of {FLAG} {parent.name} has no mask token, so it is no masked LM's; "
            "pass a masked LM."
        )
    if max_length > parent.positions:
        raise UsageError(
            f"the shards hold sequences of {max_length} tokens, more than the {parent.positions} "
            f"positions of {FLAG} {parent.name}; remake them with prepare_tfrecord_shards.py "
            f"--max_length {parent.positions} or less."
        )


def load_weights(model_class, pretrained, config, whole=False):
    """`model_class` (a TFAutoModelFor... class) built from `config`, with the pretrained weights:
    TF's own when the model has them (transformers' `from_pretrained`), else its PyTorch ones. The
    weights the checkpoint lacks start random: a classifier's new head. `whole`: the checkpoint must
    hold every weight, a masked LM's head included, or it is refused in one line. transformers'
    notices about layers left out or made anew are not shown; a file that cannot be loaded is one
    line."""
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
    """("tf", None), ("pytorch", [safetensors files]) or ("torch", None): which weights the model
    has, in WEIGHTS_NAMES' order. A folder is listed; a Hub model's files are looked up (and
    downloaded, the chosen ones only) through transformers' cache."""
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

    if path(TF_WEIGHTS_NAME) or path(TF_WEIGHTS_INDEX_NAME):
        return "tf", None
    safetensors = path(pytorch_weights.SAFETENSORS_NAME)
    if safetensors:
        return "pytorch", [safetensors]
    index = path(pytorch_weights.SAFETENSORS_INDEX_NAME)
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
        f"{FLAG} {pretrained.name} has no weights ({', '.join(WEIGHTS_NAMES)}); {HINT}."
    )
