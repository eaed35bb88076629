"""A model published with PyTorch weights only (model.safetensors), read into a transformers TF
model without torch: the other direction of pytorch_export.py.

Most models on the Hub today carry PyTorch safetensors, many no TF weights at all. transformers
4.57's TF loader would read such a file through its PyTorch bridge, which fails on safetensors
(its bug, not to be fixed: transformers 5 drops TF), and a `pytorch_model.bin` needs torch itself.
Here each TF weight is named as PyTorch names it, by the mapping transformers' own converters use
(`convert_tf_weight_name_to_pt_weight_name`, as pytorch_export.py writes the copy), looked up in
the safetensors file(s) as numpy arrays, transposed where Keras stores a Dense kernel (in, out)
and torch a Linear weight (out, in), and assigned.
"""

import contextlib
import json

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
    from safetensors import safe_open
    from transformers.modeling_tf_pytorch_utils import (
        TransposeType,
        convert_tf_weight_name_to_pt_weight_name,
    )

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


def stored_names(pt_name):
    """The names a weight may be stored under: today's, then the legacy gamma/beta of a layer
    norm."""
    names = [pt_name]
    for suffix, legacy in LEGACY_NAMES.items():
        if "LayerNorm" in pt_name and pt_name.endswith(suffix):
            names.append(pt_name[: -len(suffix)] + legacy)
    return names
