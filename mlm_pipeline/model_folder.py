"""The folder of a finished model, run_mlm.py's and run_classifier.py's: refused before any work
when it holds one already, and written so that an interruption never leaves one that looks
finished.

A folder counts as finished once it holds config.json (`contract.FINISHED_RUN_MARKER`). The model
files are written into a staging folder (`staging()`) and published file by file, config.json last.

The output check is part of the scripts' front, run before TensorFlow loads: it imports TensorFlow
only to look a gs:// folder up (a local one is looked up with os.path).
"""

import os

from . import storage, tf_startup
from .contract import FINISHED_RUN_MARKER
from .errors import UsageError
from .storage import check_local_output_dir, is_remote


def check_output(output, inputs, write_probe=True):
    """Before any work, one line for a path that cannot work: the gs:// ones among `inputs` (each
    flag's path, None when not given) and `output.output_dir` probed (storage.check_gcs_paths),
    then the output folder checked (check_output_dir). `output`: the group holding output_dir and
    overwrite_output_dir (run_mlm.py's Output, run_classifier.py's Training). Without
    `write_probe` (--preflight, which writes nothing) a gs:// output is looked up, not written."""
    paths = {**inputs, "--output_dir": output.output_dir}
    storage.check_gcs_paths(paths, writable=["--output_dir"] if write_probe else [])
    check_output_dir(output.output_dir, output.overwrite_output_dir)


def check_output_dir(output_dir, overwrite_output_dir):
    """A finished model is only replaced on request (prepare_output_dir() does it, once all input
    checks pass).

    A local --output_dir that cannot be created or written is refused here, before any work (a gs://
    one was written to and cleaned up by storage.check_gcs_paths already).
    """
    marker = f"{output_dir.rstrip('/')}/{FINISHED_RUN_MARKER}"
    if is_remote(output_dir):
        finished = remote_file_exists(marker)
    else:
        check_local_output_dir(output_dir)
        finished = os.path.exists(marker)
    if finished and not overwrite_output_dir:
        raise UsageError(
            f"--output_dir {output_dir} already holds a trained model ({FINISHED_RUN_MARKER}); "
            "pass --overwrite_output_dir to replace it, or choose another folder."
        )


def remote_file_exists(path):
    """Whether a gs:// file exists, asked through TensorFlow's file system: the one lookup of the
    front that needs TensorFlow, loaded here (after tpu_runtime.prepare_runtime) with its start-up
    log shown only if it fails."""
    with tf_startup.tensorflow_startup_log_held_back():
        import tensorflow as tf

        return tf.io.gfile.exists(path)


def staging(output_dir):
    """A local folder to save the model into; on leaving the block its files are published to
    `output_dir` (local or gs://), config.json last (storage.staged_folder). save_pretrained()
    writes through the local file system, so everything goes to a staging folder first. If the
    block fails, nothing is published.
    """
    return storage.staged_folder(output_dir, last=FINISHED_RUN_MARKER)


def check_pytorch_copy(config, masked_lm=True):
    """A config whose PyTorch copy cannot be written (pytorch_weights.py) refused now, not after
    training: a masked LM's, or with `masked_lm` False a classifier's."""
    from . import pytorch_weights  # only for the PyTorch copy

    pytorch_weights.check_pytorch_export(config, masked_lm=masked_lm)


def save_model(folder, model, tokenizer, max_length, pytorch_export=True):
    """A model folder: config.json and tf_model.h5, the tokenizer (its model_max_length the length
    the model was trained on: pipelines cut longer texts to it), and unless `pytorch_export` is
    False the pytorch/ copy that transformers 5 loads (pytorch_weights.py). run_mlm.py's Hub
    snapshots are written by this too."""
    model.save_pretrained(folder)
    tokenizer.model_max_length = max_length
    tokenizer.save_pretrained(folder)
    if pytorch_export:
        from . import pytorch_weights  # only for the PyTorch copy

        pytorch_weights.write_pytorch_copy(model, tokenizer, folder)
