"""The folder of a finished model, run_mlm.py's and run_classifier.py's: refused before any work
when it holds one already, and written so that an interruption never leaves one that looks
finished.

A folder counts as finished once it holds config.json (`contract.FINISHED_RUN_MARKER`). The model
files are written into a staging folder (`staging()`) and published file by file, config.json last.
"""

from . import storage
from .contract import FINISHED_RUN_MARKER
from .errors import UsageError
from .storage import check_local_output_dir, is_remote


def check_output_dir(output_dir, overwrite_output_dir):
    """A finished model is only replaced on request (prepare_output_dir() does it, once all input
    checks pass).

    A local --output_dir that cannot be created or written is refused here, before any work (a gs://
    one was written to and cleaned up by storage.check_gcs_paths already).
    """
    import tensorflow as tf

    if not is_remote(output_dir):
        check_local_output_dir(output_dir)
    if (
        tf.io.gfile.exists(f"{output_dir.rstrip('/')}/{FINISHED_RUN_MARKER}")
        and not overwrite_output_dir
    ):
        raise UsageError(
            f"--output_dir {output_dir} already holds a trained model ({FINISHED_RUN_MARKER}); "
            "pass --overwrite_output_dir to replace it, or choose another folder."
        )


def staging(output_dir):
    """A local folder to save the model into; on leaving the block its files are published to
    `output_dir` (local or gs://), config.json last (storage.staged_folder). save_pretrained()
    writes through the local file system, so everything goes to a staging folder first. If the
    block fails, nothing is published.
    """
    return storage.staged_folder(output_dir, last=FINISHED_RUN_MARKER)
