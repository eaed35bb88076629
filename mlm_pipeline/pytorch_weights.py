"""A TF model's weights in PyTorch transformers' names and layouts, both ways, without torch: read
from a model published with PyTorch safetensors only, and written as the PyTorch copy of
run_mlm.py's masked LM and of run_classifier.py's classifier, <output_dir>/pytorch, a folder
transformers 5 loads as it is.

Most models on the Hub today carry PyTorch safetensors, many no TF weights at all. transformers
4.57's TF loader would read such a file through its PyTorch bridge, which fails on safetensors
(its bug, not to be fixed: transformers 5 drops TF), and a `pytorch_model.bin` needs torch itself.
transformers 5 has no TF models, so run_mlm.py and run_classifier.py also write their model as
model.safetensors beside the config and tokenizer. Both directions name each TF weight as PyTorch
names it, by the mapping transformers' own converters use
(`convert_tf_weight_name_to_pt_weight_name`), transposed where Keras stores a Dense kernel (in,
out) and torch a Linear weight (out, in). The same names match a tf_model.h5's weights to a model
where transformers' TF loader, which goes by layer, would leave them new
(`assign_tf_weights_by_pytorch_name()`).

`check_pytorch_export()` refuses, before training, a config whose copy would be unverified or
untied; a RoBERTa pad id other than 1, which would shift PyTorch's positions, is refused by
architecture.fit_to_tokenizer and asserted again when the copy is written.
"""

import contextlib
import copy
import json
import os

import h5py
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file
from transformers.modeling_tf_pytorch_utils import (
    TransposeType,
    convert_tf_weight_name_to_pt_weight_name,
)
from transformers.tf_utils import load_attributes_from_hdf5_group

from .architecture import check_padding_index
from .contract import PYTORCH_DIR, PYTORCH_WEIGHTS_NAME
from .errors import UsageError, first_line

# Older checkpoints (BERT's among them) name a layer norm's scale and shift gamma and beta.
LEGACY_NAMES = {".weight": ".gamma", ".bias": ".beta"}


def index_shards(index_path):
    """The names of the files a model.safetensors.index.json splits the weights into."""
    with open(index_path, encoding="utf-8") as file:
        return sorted(set(json.load(file)["weight_map"].values()))


def assign_pytorch_weights(model, files, name):
    """Set the weights of the built TF `model` from PyTorch-layout safetensors `files`. Returns the
    PyTorch names of the weights the files lack (left as they were: random); a weight of another
    shape, or a file that cannot be read, is one line naming `name`."""
    with contextlib.ExitStack() as stack:
        where = {}  # PyTorch name -> the open file that holds it
        try:
            for path in files:
                file = stack.enter_context(safe_open(path, framework="np"))
                where.update(dict.fromkeys(file.keys(), file))
        except Exception as error:  # safetensors raises its own kinds for a damaged file
            raise UsageError(
                f"could not read the weights of {name}: {first_line(error)[:300]}"
            ) from None
        missing, values = [], []
        for weight in model.weights:
            pt_name, transpose = convert_tf_weight_name_to_pt_weight_name(
                weight.name, tf_weight_shape=weight.shape
            )
            found = next((n for n in stored_names(pt_name) if n in where), None)
            if found is None:
                missing.append(pt_name)
                continue
            try:
                array = where[found].get_tensor(found)
            except Exception as error:  # bfloat16 has no numpy type, for one
                raise UsageError(
                    f"could not read the weight {found} of {name}: {first_line(error)[:200]}"
                ) from None
            if transpose is TransposeType.SIMPLE:
                array = array.T
            if tuple(array.shape) != tuple(weight.shape):
                raise UsageError(
                    f"the weight {found} of {name} has the shape {tuple(array.shape)}, but the "
                    f"model its config describes needs {tuple(weight.shape)}; the checkpoint and "
                    "its config.json do not belong together."
                )
            values.append((weight, array))
    for weight, array in values:  # all checked first: a refused checkpoint changes no weight
        weight.assign(array.astype(weight.dtype.as_numpy_dtype))
    return missing


def assign_tf_weights_by_pytorch_name(model, layers, path, name):
    """Set the weights of the built TF `model`'s top-level `layers` (named) from the TF checkpoint
    `path` (a tf_model.h5) by PyTorch name, as transformers 5 loads a checkpoint. Returns the
    PyTorch names of those weights it lacks (left as they were: random); a weight of another shape
    is one line naming `name`.

    transformers' TF loader reads a tf_model.h5 by top-level layer: a layer takes the weights of
    the file's layer of the same name, or none. Where a family's masked LM and classifier group the
    same PyTorch weights under layers of different names, the classifier would start them random
    where transformers 5 loads them (ModernBERT's masked LM keeps its `head` in a layer `lm_head`,
    for its get_lm_head(); the classifier's is `head`). The layers the loader left new are matched
    here weight by weight, by the names transformers 5 goes by."""

    def pytorch_name(tf_name, shape):
        return convert_tf_weight_name_to_pt_weight_name(tf_name, tf_weight_shape=shape)[0]

    wanted = {}  # PyTorch name -> the model's weight
    for layer in model.layers:
        if layer.name in layers:
            wanted.update({pytorch_name(w.name, w.shape): w for w in layer.weights})
    values = []
    with h5py.File(path, "r") as file:
        for layer_name in load_attributes_from_hdf5_group(file, "layer_names"):
            group = file[layer_name]
            for weight_name in load_attributes_from_hdf5_group(group, "weight_names"):
                stored = group[weight_name]
                weight = wanted.pop(pytorch_name(weight_name, stored.shape), None)
                if weight is None:
                    continue
                if tuple(stored.shape) != tuple(weight.shape):
                    raise UsageError(
                        f"the weight {weight_name} of {name} has the shape {tuple(stored.shape)}, "
                        f"but the model its config describes needs {tuple(weight.shape)}; the "
                        "checkpoint and its config.json do not belong together."
                    )
                values.append((weight, np.asarray(stored)))
    for weight, array in values:  # all checked first: a refused checkpoint changes no weight
        weight.assign(array.astype(weight.dtype.as_numpy_dtype))
    return sorted(wanted)


def stored_names(pt_name):
    """The names a weight may be stored under: today's, then the legacy gamma/beta of a layer
    norm."""
    names = [pt_name]
    for suffix, legacy in LEGACY_NAMES.items():
        if "LayerNorm" in pt_name and pt_name.endswith(suffix):
            names.append(pt_name[: -len(suffix)] + legacy)
    return names


# --- written: the PyTorch copy of run_mlm.py's masked LM and run_classifier.py's classifier

# The model types whose PyTorch copy the tests load in transformers 5 and check against the TF
# model: the masked LM's (tests/test_pytorch_export.py) and the classifier's
# (tests/test_classifier_export.py). The name mapping is generic, but a type joins this list only
# once both tests cover it.
PYTORCH_EXPORT_MODEL_TYPES = (
    "roberta",
    "roberta-prelayernorm",
    "bert",
    "xlm-roberta",
    "modernbert",
)
# Of those, the ones whose TF class unties its decoder when the config says so (written here).
UNTIED_DECODER_MODEL_TYPES = ("modernbert",)


def check_pytorch_export(config, masked_lm=True):
    """Refuse before training a config whose PyTorch copy would be unverified or a different
    model. `masked_lm` False: a classifier, which has no LM decoder to tie."""
    if config.model_type not in PYTORCH_EXPORT_MODEL_TYPES:
        raise UsageError(
            f"the PyTorch copy ({PYTORCH_WEIGHTS_NAME}) is written for "
            f"{', '.join(PYTORCH_EXPORT_MODEL_TYPES)} models only, not {config.model_type}; pass "
            "--no_pytorch_export to save the TF weights alone."
        )
    # a published RoBERTa whose pad id is not 1 (run_mlm.py's own configs were checked already)
    check_padding_index(config.model_type, config.pad_token_id, remedy="pass --no_pytorch_export")
    untied = not config.tie_word_embeddings
    if masked_lm and untied and config.model_type not in UNTIED_DECODER_MODEL_TYPES:
        raise UsageError(
            "the config sets tie_word_embeddings to false, but transformers' TF masked LMs share "
            "the word embeddings with the LM head whatever it says, and a PyTorch model built "
            "from that config would not; drop it from the config, or pass --no_pytorch_export."
        )


def pytorch_state_dict(model):
    """The TF model's weights (a masked LM's, a classifier's) under PyTorch transformers' names and
    layouts, as numpy arrays.

    transformers' own TF-to-PyTorch mapping (the one behind from_pretrained(..., from_tf=True))
    names each TF variable and says whether it is stored transposed: a Keras Dense kernel is (in,
    out), a torch Linear weight (out, in). Tied weights are written once, as PyTorch's
    save_pretrained writes them: a TF LM head reuses the word embeddings, and PyTorch ties its
    decoder to them (and the decoder's bias to the head's `bias`) when it loads, so the file holds
    e.g. `lm_head.bias` but no `lm_head.decoder.*`. A classifier's head (BERT's pooler and
    `classifier`, RoBERTa's `classifier.dense` and `classifier.out_proj`, ModernBERT's `head` and
    `classifier`) is named as in its PyTorch twin, so nothing is left out or tied.
    """
    config = model.config
    # the config was refused before training already; never write such a copy
    check_padding_index(
        config.model_type, config.pad_token_id, remedy="rerun with --no_pytorch_export"
    )
    state_dict = {}
    for weight in model.weights:
        name, transpose = convert_tf_weight_name_to_pt_weight_name(
            weight.name, tf_weight_shape=weight.shape
        )
        # convolutions: no supported model has any
        if transpose not in (TransposeType.NO, TransposeType.SIMPLE):
            raise ValueError(
                f"the TF weight {weight.name} needs a {transpose.value} transpose, not handled here"
            )
        if name in state_dict:
            raise ValueError(f"two TF weights map to the PyTorch name {name}")
        array = weight.numpy()
        state_dict[name] = array.T.copy() if transpose is TransposeType.SIMPLE else array
    return state_dict


def pytorch_config(model):
    """A copy of the TF model's config that names the PyTorch class it holds (TFBertFor... ->
    BertFor...), as the TF save_pretrained() does; everything else (num_labels, id2label,
    problem_type, ModernBERT's classifier_pooling...) is what transformers 5 builds the same head
    from."""
    config = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__.removeprefix("TF")]
    return config


def write_pytorch_copy(model, tokenizer, folder):
    """<folder>/pytorch: config, tokenizer and model.safetensors of the TF `model` (a masked LM, a
    classifier) with PyTorch names and layouts, a folder that transformers 5 loads as it is with
    the auto class of the TF one (AutoModelForMaskedLM, AutoModelForSequenceClassification); no
    torch is needed here.

    A folder of its own, not beside tf_model.h5: transformers 4.57's TF loader prefers a
    model.safetensors it finds there, and fails on PyTorch-format files (its bug, not to be fixed),
    so the TF model would no longer load by default.
    """
    copy_folder = os.path.join(folder, PYTORCH_DIR)
    os.makedirs(copy_folder, exist_ok=True)
    pytorch_config(model).save_pretrained(copy_folder)
    tokenizer.save_pretrained(copy_folder)
    # "pt": the format transformers 5 loads.
    save_file(
        pytorch_state_dict(model),
        os.path.join(copy_folder, PYTORCH_WEIGHTS_NAME),
        metadata={"format": "pt"},
    )
