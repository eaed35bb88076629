"""run_mlm.py's finished model folder: written so that an interruption never leaves one that looks
finished.

A folder counts as finished once it holds config.json (`contract.FINISHED_RUN_MARKER`). `save()`
writes the model, its tokenizer and the PyTorch copy to a staging folder first and publishes them
file by file, config.json last; `publish()` adds the model card and the curves PNG. The Hub pushes
(hub.py) lay out their snapshots with the same `write_model_files()`.
"""

import os
import shutil
import tempfile

from . import model_card, storage, training_logs
from .contract import CURVES_NAME, FINISHED_RUN_MARKER, TENSORBOARD_DIR
from .pytorch_export import write_pytorch_copy


def write_model_files(folder, masked_lm, tokenizer, pytorch_export=True):
    """The model (config.json, tf_model.h5), its tokenizer and, unless told not to, the pytorch/ copy."""
    masked_lm.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if pytorch_export:  # what transformers 5 users load
        write_pytorch_copy(masked_lm, tokenizer, folder)


def save(masked_lm, tokenizer, output_dir, pytorch_export=True):
    """Write the model and tokenizer to `output_dir` (local or gs://), config.json last.

    save_pretrained() writes through the local filesystem, so everything goes to a staging folder
    first (inside a local output folder; a temporary one for gs://) and is then published file by
    file. Each file appears whole: a rename within one filesystem is atomic, and a GCS object exists
    only once fully uploaded.
    """
    import tensorflow as tf

    output_dir = output_dir.rstrip("/")
    local = not storage.is_remote(output_dir)
    tf.io.gfile.makedirs(output_dir)
    with tempfile.TemporaryDirectory(
        dir=output_dir if local else None, prefix=".saving-"
    ) as staging:
        write_model_files(staging, masked_lm, tokenizer, pytorch_export)
        for name in sorted(
            os.listdir(staging), key=lambda name: (name == FINISHED_RUN_MARKER, name)
        ):
            source, target = os.path.join(staging, name), f"{output_dir}/{name}"
            if local:
                if os.path.isdir(target):  # a PyTorch copy left by a run killed while it published
                    shutil.rmtree(target)
                os.replace(source, target)
            elif os.path.isdir(source):
                for inner in sorted(os.listdir(source)):
                    tf.io.gfile.makedirs(target)
                    tf.io.gfile.copy(
                        os.path.join(source, inner), f"{target}/{inner}", overwrite=True
                    )
            else:
                tf.io.gfile.copy(source, target, overwrite=True)


def publish(output_dir, masked_lm, tokenizer, card_text, pytorch_export=True):
    """On the chief, once training ends: the model saved, then beside it its card (README.md: data,
    settings, results) and training_curves.png, the loss and the accuracy at [MASK] against the
    step, drawn from the TensorBoard scalars."""
    save(masked_lm, tokenizer, output_dir, pytorch_export)
    model_card.write_model_card(card_text, output_dir)
    output_dir = output_dir.rstrip("/")
    training_logs.plot_curves(f"{output_dir}/{TENSORBOARD_DIR}", f"{output_dir}/{CURVES_NAME}")
    print(
        f"Saved the model and tokenizer to {output_dir}, the curves to {output_dir}/{CURVES_NAME}."
    )
