"""run_mlm.py's finished model folder: written so that an interruption never leaves one that looks
finished.

A folder counts as finished once it holds config.json (`contract.FINISHED_RUN_MARKER`). The model
files are written into a staging folder (`staging()`) and published file by file, config.json last;
`add_card_and_curves()` then writes the model card and the curves PNG beside them.
"""

import contextlib
import os
import shutil
import tempfile

from . import model_card, storage, training_logs
from .contract import CURVES_NAME, FINISHED_RUN_MARKER, TENSORBOARD_DIR


@contextlib.contextmanager
def staging(output_dir):
    """A local folder to save the model into; on leaving the block its files are published to
    `output_dir` (local or gs://), config.json last.

    save_pretrained() writes through the local filesystem, so everything goes to a staging folder
    first (inside a local output folder; a temporary one for gs://) and is then published file by
    file. Each file appears whole: a rename within one filesystem is atomic, and a GCS object exists
    only once fully uploaded. If the block fails, nothing is published.
    """
    import tensorflow as tf

    output_dir = output_dir.rstrip("/")
    local = not storage.is_remote(output_dir)
    tf.io.gfile.makedirs(output_dir)
    with tempfile.TemporaryDirectory(
        dir=output_dir if local else None, prefix=".saving-"
    ) as folder:
        yield folder
        config_last = sorted(
            os.listdir(folder), key=lambda name: (name == FINISHED_RUN_MARKER, name)
        )
        for name in config_last:
            source, target = os.path.join(folder, name), f"{output_dir}/{name}"
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


def add_card_and_curves(output_dir, card_text):
    """Beside the saved model: its card (README.md: data, settings, results) and
    training_curves.png, the loss and the accuracy at [MASK] against the step, drawn from the
    TensorBoard scalars."""
    model_card.write_model_card(card_text, output_dir)
    output_dir = output_dir.rstrip("/")
    training_logs.plot_curves(f"{output_dir}/{TENSORBOARD_DIR}", f"{output_dir}/{CURVES_NAME}")
    print(
        f"Saved the model and tokenizer to {output_dir}, the curves to {output_dir}/{CURVES_NAME}."
    )
