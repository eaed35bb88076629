"""run_mlm.py's finished model folder: written so that an interruption never leaves one that looks
finished.

A folder counts as finished once it holds config.json (`contract.FINISHED_RUN_MARKER`). The model
files are written into a staging folder (`staging()`) and published file by file, config.json last;
`add_card_and_curves()` then writes the model card and the curves PNG beside them.
"""

from . import model_card, storage, training_logs
from .contract import CURVES_NAME, FINISHED_RUN_MARKER, TENSORBOARD_DIR


def staging(output_dir):
    """A local folder to save the model into; on leaving the block its files are published to
    `output_dir` (local or gs://), config.json last (storage.staged_folder). save_pretrained()
    writes through the local file system, so everything goes to a staging folder first. If the
    block fails, nothing is published.
    """
    return storage.staged_folder(output_dir, last=FINISHED_RUN_MARKER)


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
