"""run_mlm.py's model card (README.md): what the model is, its data, its settings and its results;
written beside the saved model with the training curves at the end, and pushed with every Hub
snapshot.

CARD below is the card's outline; each of its fields is filled by the function of the same name.
The metadata block and the public names of the folders the run used come from cards.py.
"""

import os

from . import training_logs
from .cards import metadata_block, public_name
from .contract import CURVES_NAME, MODEL_CARD_NAME, PYTORCH_DIR, TENSORBOARD_DIR
from .storage import is_remote, write_whole

CARD = """\
{front_matter}

# {title}

{introduction}

{status}

## Usage

{usage}

## Training data

{training_data}

## Training procedure

{training_procedure}

## Results

{results}
{evaluation_note}"""

# The two ways to load the model {id}: a Hub id or a local folder. transformers loads no gs:// path:
# for a model there, {copy_first} is the command that copies its folder here first.
USAGE = """\
```python
{copy_first}from transformers import pipeline

fill_mask = pipeline("fill-mask", model="{id}", framework="tf", dtype=None)  # transformers 4.x, TF
print(fill_mask("The river runs under the old {mask} of the city."))
```

With transformers 5 and PyTorch:

```python
{copy_first}from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

model = AutoModelForMaskedLM.from_pretrained("{id}", subfolder="{pytorch_dir}")
tokenizer = AutoTokenizer.from_pretrained("{id}", subfolder="{pytorch_dir}")
fill_mask = pipeline("fill-mask", model=model, tokenizer=tokenizer)
```"""


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
    steps = int(trainer.optimizer.iterations.numpy())
    max_length = train_manifest["max_length"]
    parent = paths.get("model_name_or_path")
    return CARD.format(
        front_matter=front_matter(config, parent, paths.get("base_model")),
        title=paths["hub_model_id"] or os.path.basename(paths["output_dir"].rstrip("/")),
        introduction=introduction(
            config, trainer.masked_lm.count_params(), origin(parent, train_manifest, paths)
        ),
        status=status(steps, total_steps=planned_steps[0]),
        usage=usage(paths["hub_model_id"] or public_name(paths["output_dir"]), tokenizer),
        training_data=training_data(manifests, paths, tokenizer),
        training_procedure=training_procedure(
            config, tokenizer, global_batch_size, max_length, planned_steps, recipe
        ),
        results=results(metrics, steps, steps * global_batch_size * max_length, tokenizer),
        evaluation_note=evaluation_note(eval_manifest),
    )


def front_matter(config, parent, base_model):
    """The metadata block: a fill-mask model, continued or pretrained from scratch, linked on the
    Hub to the model it continues (`base_model`)."""
    tags = [
        "fill-mask",
        "tensorflow",
        "masked-language-modeling",
        config.model_type,
        "continued-pretraining" if parent else "pretrained-from-scratch",
    ]
    return metadata_block(
        library_name="transformers", pipeline_tag="fill-mask", tags=tags, base_model=base_model
    )


def origin(parent, train_manifest, paths):
    """Where the weights started: random, or the model continued and the text it continued on."""
    if not parent:
        return "pretrained from scratch (random initial weights, no checkpoint of another model)"
    text = public_name(train_manifest.get("source")) or public_name(paths["train_dataset"])
    return (
        f"pretrained further from `{public_name(parent)}` (its weights, LM head included, were the "
        f"start) on the text of {text}"
    )


def introduction(config, parameters, origin):
    return (
        f"A {config.model_type} masked language model with {parameters:,} parameters, {origin}, "
        "by `run_mlm.py` with Keras `fit`, on TFRecord shards packed by "
        "`prepare_tfrecord_shards.py`. The weights are TensorFlow's (`tf_model.h5`, for "
        "transformers 4.x); `pytorch/` holds the same model for transformers 5 and PyTorch "
        "(`model.safetensors`) unless the run was told not to write it."
    )


def status(steps, total_steps):
    """Finished, or a snapshot of a run still training."""
    if steps >= total_steps:
        return f"Training finished after {steps:,} optimizer steps."
    return (
        f"**Training in progress**: this snapshot was taken after step {steps:,} of "
        f"{total_steps:,}. The weights and this card are replaced at every push, and by the final "
        "model at the end."
    )


def usage(where, tokenizer):
    """USAGE for the model at `where` (a Hub id, a local folder's name or a gs:// path)."""
    copy_first = ""
    if is_remote(where):
        copy_first = f"# first: gsutil -m cp -r {where.rstrip('/')} .\n\n"
        where = where.rstrip("/").rsplit("/", 1)[-1]
    return USAGE.format(
        copy_first=copy_first,
        id=where,
        mask=tokenizer.mask_token,
        pytorch_dir=PYTORCH_DIR,
    )


def training_data(manifests, paths, tokenizer):
    """The shards of each split, then how their sequences were made."""
    train_manifest, eval_manifest = manifests
    splits = [("train", paths["train_dataset"], train_manifest)]
    if eval_manifest is not None:
        splits.append(("evaluation", paths["eval_dataset"], eval_manifest))
    rows = [
        [
            split,
            f"`{public_name(folder)}`",
            public_name(manifest.get("source")) or "–",
            f"{manifest['records']:,}",
            f"{manifest['records'] * manifest['max_length']:,}",
        ]
        for split, folder, manifest in splits
    ]
    sequences = (
        f"Each sequence holds {train_manifest['max_length']} tokens, none of them padding. How the "
        "shards were packed, in their manifest's words: "
        f"{train_manifest.get('packing', 'not recorded')}. Tokenizer: "
        f"`{public_name(paths['tokenizer'])}`, {len(tokenizer):,} tokens in its vocabulary."
    )
    table = markdown_table(["split", "shards", "source", "sequences", "tokens"], rows)
    return f"{table}\n\n{sequences}"


def training_procedure(config, tokenizer, global_batch_size, max_length, planned_steps, recipe):
    """The settings table: architecture, batch, steps, optimizer, schedule, masking."""
    total_steps, steps_per_epoch = planned_steps
    per_replica = recipe["per_replica_batch_size"]
    short_length, accumulation = (
        recipe["short_sequence_length"],
        recipe["gradient_accumulation_steps"],
    )
    settings = [
        ["architecture", config.model_type],
        [
            "layers / hidden size / attention heads",
            f"{config.num_hidden_layers} / {config.hidden_size} / {config.num_attention_heads}",
        ],
        [
            "feed-forward size / position embeddings",
            f"{config.intermediate_size} / {config.max_position_embeddings}",
        ],
        [
            "batch",
            f"{global_batch_size} sequences of {max_length} tokens ({per_replica} per replica, "
            f"{global_batch_size // per_replica} replica(s))",
        ],
        [
            "steps",
            f"{total_steps:,} = {total_steps / steps_per_epoch:.2f} epochs of "
            f"{steps_per_epoch:,} steps",
        ],
    ]
    if short_length:
        settings.append(
            [
                "sequence-length warmup",
                f"the first {recipe['short_sequence_ratio']:g} of the steps on each sequence cut "
                f"into pieces of {short_length} tokens, as many tokens a step",
            ]
        )
    if accumulation > 1:
        settings.append(["gradient accumulation", f"{accumulation} micro-batches a step"])
    settings += [
        ["optimizer", optimizer(recipe)],
        ["learning rate", learning_rate(recipe, total_steps)],
        ["masking", masking(recipe, tokenizer.mask_token)],
        ["loss", f"cross-entropy at the masked positions ({recipe['mlm_head']} LM head)"],
        ["precision", "mixed bfloat16" if recipe["bfloat16"] else "float32"],
        ["seed", recipe["seed"]],
    ]
    return markdown_table(["setting", "value"], settings)


def optimizer(recipe):
    adam = f"β1 {recipe['adam_beta1']:g}, β2 {recipe['adam_beta2']:g}, ε {recipe['adam_epsilon']:g}"
    clip = recipe["max_grad_norm"]
    clipping = f"gradients clipped to global norm {clip:g}" if clip else "no clipping"
    return (
        f"AdamW ({adam}), weight decay {recipe['weight_decay_rate']} (not on biases and layer "
        f"norms), {clipping}"
    )


def learning_rate(recipe, total_steps):
    """Warmup, then a linear decay to 0 (with --decay_ratio: after the peak is held)."""
    warmup_steps = int(recipe["warmup_ratio"] * total_steps)
    decay = "linear decay to 0"
    if recipe.get("decay_ratio"):
        decay = f"held, then {decay} over the last {recipe['decay_ratio']:g} of the steps"
    return (
        f"peak {recipe['learning_rate']:g}, linear warmup over {warmup_steps:,} steps "
        f"({recipe['warmup_ratio']:g} of them), then {decay}"
    )


def masking(recipe, mask):
    """The share masked in training (and in evaluation, when --train_mlm_probability differs)."""
    train_rate = recipe.get("train_mlm_probability") or recipe["mlm_probability"]
    whole_words = ", chosen as whole words" if recipe["whole_word_masking"] else ""
    evaluation = ""
    if train_rate != recipe["mlm_probability"]:
        evaluation = f" (evaluation: {recipe['mlm_probability']:.0%}, token by token)"
    return (
        f"{train_rate:.0%} of the non-special tokens of each sequence{whole_words}: 80% become "
        f"`{mask}`, 10% a random token, 10% stay; new masks every epoch{evaluation}"
    )


def results(metrics, steps, tokens_seen, tokenizer):
    """The latest figures, train and evaluation, over the masked positions ("–" where missing)."""

    def number(key, digits=4):
        value = metrics.get(key)
        return "–" if value is None else f"{float(value):.{digits}f}"

    def percent(key):
        value = metrics.get(key)
        return "–" if value is None else f"{100 * float(value):.2f}%"

    train_perplexity = "–"
    if "loss" in metrics:
        train_perplexity = f"{training_logs.perplexity(float(metrics['loss'])):.2f}"
    mask = tokenizer.mask_token
    rows = [
        ["masked-LM loss", number("loss"), number("val_loss")],
        ["perplexity", train_perplexity, number("val_perplexity", 2)],
        [
            "masked accuracy (every labelled position)",
            percent("masked_accuracy"),
            percent("val_masked_accuracy"),
        ],
        [
            f"accuracy at `{mask}`",
            percent("mask_token_accuracy"),
            percent("val_mask_token_accuracy"),
        ],
    ]
    seen = (
        f"After {steps:,} steps, {tokens_seen:,} tokens seen. Train figures are the means over the "
        "steps of training_log.csv's last row; all of them count the masked positions only."
    )
    return f"{seen}\n\n{markdown_table(['metric', 'train', 'evaluation'], rows)}"


def evaluation_note(eval_manifest):
    if eval_manifest is not None:
        return ""
    return "\nNo evaluation shards were given, so there are no evaluation figures.\n"


def markdown_table(header, rows):
    """A Markdown table: the header, its rule, a line a row."""
    lines = ["| " + " | ".join(map(str, cells)) + " |" for cells in [header, *rows]]
    lines.insert(1, "|" + "---|" * len(header))
    return "\n".join(lines)


def write_model_card(card_text, output_dir):
    """<output_dir>/README.md (local or gs://), written whole."""
    write_whole(f"{output_dir.rstrip('/')}/{MODEL_CARD_NAME}", card_text)


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
