"""run_mlm.py's model card (README.md): what the model is, its data, its settings and its results;
written beside the saved model with the training curves at the end, and pushed with every Hub
snapshot.

The metadata block and the public names of the folders the run used come from cards.py.
"""

import os

from . import training_logs
from .cards import metadata_block, public_name
from .contract import CURVES_NAME, MODEL_CARD_NAME, PYTORCH_DIR, TENSORBOARD_DIR
from .storage import is_remote


def model_card(
    config,
    tokenizer,
    manifests,
    global_batch_size,
    planned_steps,
    trainer,
    metrics,
    *,
    paths,
    recipe,
):
    """run_mlm.py's model card (README.md): what the model is, its data, its settings and its
    results so far.

    `manifests`: the train and evaluation manifests (the second may be None); `planned_steps` the
    run's (total steps, steps per epoch); `trainer` the fitted model (its optimizer counts the steps
    taken, in this process or before a resume) and `metrics` the figures of the latest epoch as
    fit() logs them: loss, masked_accuracy, ... and their val_ twins. `paths`: where the model goes
    (hub_model_id, output_dir) and what it was trained from (train_dataset, eval_dataset,
    tokenizer; model_name_or_path, the model it continues, and base_model, that model's Hub id,
    both None for a model pretrained from scratch). `recipe`: the training settings, by name, as
    the card reports them (learning_rate, warmup_ratio, max_grad_norm, adam_beta1/2,
    adam_epsilon, weight_decay_rate, mlm_probability, whole_word_masking, mlm_head, bfloat16, seed,
    per_replica_batch_size, gradient_accumulation_steps, short_sequence_length,
    short_sequence_ratio).
    """
    train_manifest, eval_manifest = manifests
    total_steps, steps_per_epoch = planned_steps
    steps = int(trainer.optimizer.iterations.numpy())
    max_length = train_manifest["max_length"]
    warmup_steps = int(recipe["warmup_ratio"] * total_steps)
    decay = "linear decay to 0"
    if recipe.get("decay_ratio"):
        decay = f"held, then {decay} over the last {recipe['decay_ratio']:g} of the steps"
    train_rate = recipe.get("train_mlm_probability") or recipe["mlm_probability"]
    evaluation = ""
    if train_rate != recipe["mlm_probability"]:
        evaluation = f" (evaluation: {recipe['mlm_probability']:.0%}, token by token)"
    clip, per_replica = recipe["max_grad_norm"], recipe["per_replica_batch_size"]
    clipping = f"gradients clipped to global norm {clip:g}" if clip else "no clipping"
    short_length, short_ratio = recipe["short_sequence_length"], recipe["short_sequence_ratio"]
    accumulation = recipe["gradient_accumulation_steps"]
    adam = f"β1 {recipe['adam_beta1']:g}, β2 {recipe['adam_beta2']:g}, ε {recipe['adam_epsilon']:g}"
    name = paths["hub_model_id"] or os.path.basename(paths["output_dir"].rstrip("/"))
    where = paths["hub_model_id"] or public_name(paths["output_dir"])
    copy_first = []
    # transformers loads Hub ids and local folders, not gs://: copy the folder here first
    if is_remote(where):
        copy_first = [f"# first: gsutil -m cp -r {where.rstrip('/')} .", ""]
        where = where.rstrip("/").rsplit("/", 1)[-1]
    mask = tokenizer.mask_token

    def number(key, digits=4):
        value = metrics.get(key)
        return "–" if value is None else f"{float(value):.{digits}f}"

    def percent(key):
        value = metrics.get(key)
        return "–" if value is None else f"{100 * float(value):.2f}%"

    train_perplexity = (
        training_logs.perplexity(float(metrics["loss"])) if "loss" in metrics else None
    )
    if steps >= total_steps:
        status = f"Training finished after {steps:,} optimizer steps."
    else:
        status = (
            f"**Training in progress**: this snapshot was taken after step {steps:,} of "
            f"{total_steps:,}. The weights and this card are replaced at every push, and by the "
            "final model at the end."
        )
    data_rows = [("train", paths["train_dataset"], train_manifest)]
    if eval_manifest is not None:
        data_rows.append(("evaluation", paths["eval_dataset"], eval_manifest))
    data_table = "\n".join(
        f"| {split} | `{public_name(folder)}` | {public_name(manifest.get('source')) or '–'} | "
        f"{manifest['records']:,} | {manifest['records'] * manifest['max_length']:,} |"
        for split, folder, manifest in data_rows
    )
    evaluation_note = (
        ""
        if eval_manifest is not None
        else "\nNo evaluation shards were given, so there are no evaluation figures.\n"
    )
    parent = paths.get("model_name_or_path")
    origin = "pretrained from scratch (random initial weights, no checkpoint of another model)"
    if parent:
        text = public_name(train_manifest.get("source")) or public_name(paths["train_dataset"])
        origin = (
            f"pretrained further from `{public_name(parent)}` (its weights, LM head included, "
            f"were the start) on the text of {text}"
        )
    tags = [
        "fill-mask",
        "tensorflow",
        "masked-language-modeling",
        config.model_type,
        "continued-pretraining" if parent else "pretrained-from-scratch",
    ]
    lines = [
        metadata_block(
            library_name="transformers",
            pipeline_tag="fill-mask",
            tags=tags,
            base_model=paths.get("base_model"),  # the Hub links a model to its parent by it
        ),
        "",
        f"# {name}",
        "",
        f"A {config.model_type} masked language model with {trainer.masked_lm.count_params():,} "
        f"parameters, {origin}, by `run_mlm.py` with Keras `fit`, on TFRecord shards packed by "
        "`prepare_tfrecord_shards.py`. The weights are TensorFlow's "
        "(`tf_model.h5`, for transformers 4.x); `pytorch/` holds the same model for "
        "transformers 5 and PyTorch (`model.safetensors`) unless the run was told not to write "
        "it.",
        "",
        status,
        "",
        "## Usage",
        "",
        "```python",
        *copy_first,
        "from transformers import pipeline",
        "",
        f'fill_mask = pipeline("fill-mask", model="{where}", framework="tf", dtype=None)  # '
        "transformers 4.x, TF",
        f'print(fill_mask("The river runs under the old {mask} of the city."))',
        "```",
        "",
        "With transformers 5 and PyTorch:",
        "",
        "```python",
        *copy_first,
        "from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline",
        "",
        f'model = AutoModelForMaskedLM.from_pretrained("{where}", subfolder="{PYTORCH_DIR}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{where}", subfolder="{PYTORCH_DIR}")',
        'fill_mask = pipeline("fill-mask", model=model, tokenizer=tokenizer)',
        "```",
        "",
        "## Training data",
        "",
        "| split | shards | source | sequences | tokens |",
        "|---|---|---|---|---|",
        data_table,
        "",
        f"Each sequence holds {max_length} tokens, none of them padding. How the shards were "
        f"packed, in their manifest's words: {train_manifest.get('packing', 'not recorded')}. "
        f"Tokenizer: `{public_name(paths['tokenizer'])}`, {len(tokenizer):,} tokens in its "
        "vocabulary.",
        "",
        "## Training procedure",
        "",
        "| setting | value |",
        "|---|---|",
        f"| architecture | {config.model_type} |",
        f"| layers / hidden size / attention heads | {config.num_hidden_layers} / "
        f"{config.hidden_size} / {config.num_attention_heads} |",
        f"| feed-forward size / position embeddings | {config.intermediate_size} / "
        f"{config.max_position_embeddings} |",
        f"| batch | {global_batch_size} sequences of {max_length} tokens ({per_replica} per "
        f"replica, {global_batch_size // per_replica} replica(s)) |",
        f"| steps | {total_steps:,} = {total_steps / steps_per_epoch:.2f} epochs of "
        f"{steps_per_epoch:,} steps |",
        *(
            [
                f"| sequence-length warmup | the first {short_ratio:g} of the steps on each "
                f"sequence cut into pieces of {short_length} tokens, as many tokens a step |"
            ]
            if short_length
            else []
        ),
        *(
            [f"| gradient accumulation | {accumulation} micro-batches a step |"]
            if accumulation > 1
            else []
        ),
        f"| optimizer | AdamW ({adam}), weight decay {recipe['weight_decay_rate']} (not on biases "
        f"and layer norms), {clipping} |",
        f"| learning rate | peak {recipe['learning_rate']:g}, linear warmup over {warmup_steps:,} "
        f"steps ({recipe['warmup_ratio']:g} of them), then {decay} |",
        f"| masking | {train_rate:.0%} of the non-special tokens of each "
        f"sequence{', chosen as whole words' if recipe['whole_word_masking'] else ''}: 80% become "
        f"`{mask}`, 10% a random token, 10% stay; new masks every epoch{evaluation} |",
        f"| loss | cross-entropy at the masked positions ({recipe['mlm_head']} LM head) |",
        f"| precision | {'mixed bfloat16' if recipe['bfloat16'] else 'float32'} |",
        f"| seed | {recipe['seed']} |",
        "",
        "## Results",
        "",
        f"After {steps:,} steps, {steps * global_batch_size * max_length:,} tokens seen. Train "
        "figures are the means over the steps of training_log.csv's last row; all of them "
        "count the masked positions only.",
        "",
        "| metric | train | evaluation |",
        "|---|---|---|",
        f"| masked-LM loss | {number('loss')} | {number('val_loss')} |",
        f"| perplexity | {'–' if train_perplexity is None else f'{train_perplexity:.2f}'} | "
        f"{number('val_perplexity', 2)} |",
        f"| masked accuracy (every labelled position) | {percent('masked_accuracy')} | "
        f"{percent('val_masked_accuracy')} |",
        f"| accuracy at `{mask}` | {percent('mask_token_accuracy')} | "
        f"{percent('val_mask_token_accuracy')} |",
        evaluation_note,
    ]
    return "\n".join(lines)


def write_model_card(card_text, output_dir):
    """<output_dir>/README.md (local or gs://)."""
    import tensorflow as tf

    with tf.io.gfile.GFile(f"{output_dir.rstrip('/')}/{MODEL_CARD_NAME}", "w") as file:
        file.write(card_text)


def add_card_and_curves(output_dir, card_text):
    """Beside the saved model: its card (README.md: data, settings, results) and
    training_curves.png, the loss and the accuracy at [MASK] against the step, drawn from the
    TensorBoard scalars."""
    write_model_card(card_text, output_dir)
    output_dir = output_dir.rstrip("/")
    training_logs.plot_curves(f"{output_dir}/{TENSORBOARD_DIR}", f"{output_dir}/{CURVES_NAME}")
    print(
        f"Saved the model and tokenizer to {output_dir}, the curves to {output_dir}/{CURVES_NAME}."
    )
