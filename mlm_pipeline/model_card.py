"""run_mlm.py's model card (README.md): what the model is, its data, its settings and its results;
written beside the saved model with the training curves at the end, and pushed with every Hub
snapshot.

CARD below is the card's outline; each of its fields is filled by the function of the same name.
The metadata block and the public names of the folders the run used come from cards.py.
"""

from . import mixture, segments, training_logs
from .cards import metadata_block, model_name, public_name
from .contract import CURVES_NAME, LAST_STEP_DIR, MODEL_CARD_NAME, PYTORCH_DIR, TENSORBOARD_DIR
from .file_writes import write_whole
from .storage import is_remote

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
    settings, config, tokenizer, manifests, schedule, trainer, metrics, *, origin, averaged=None
):
    """run_mlm.py's model card (README.md): what the model is, its data, its settings and its
    results so far.

    `settings`: run_mlm.py's Settings, the card's settings read from its groups (where the model
    goes, what it was trained from, the masking, optimizer and speed); `tokenizer` a
    contract.NamedTokenizer; `manifests`: the train and evaluation manifests (the second may be
    None; with several --eval_dataset sets, each set's in order); `schedule` the run's
    training_run.Schedule; `trainer` the fitted model (its optimizer counts the steps taken, in
    this process or before a resume) and `metrics` the figures of the latest epoch as fit() logs
    them: loss, masked_accuracy, ... and their val_ twins (val_<name>_loss, ... of several sets).
    `origin`: where the weights started (masked_lm_model.Scratch or pretrained_model.Parent): its
    card tag, its words for the introduction, and its Hub id, the Hub's link to the model continued
    (None for a model pretrained from scratch or continued from a folder). `averaged`: what
    --average_last did (averaging.Averaged), when the model is the average of the last checkpoints.
    """
    data, output = settings.data, settings.output
    train_manifest, eval_manifest = manifests[0], manifests[1]
    steps = int(trainer.optimizer.iterations.numpy())
    max_length = train_manifest["max_length"]
    global_batch_size = schedule.plan.global_batch_size
    mask = tokenizer.tokenizer.mask_token
    return CARD.format(
        front_matter=front_matter(config, origin),
        title=model_name(output.hub_model_id, output.output_dir),
        introduction=introduction(
            config,
            trainer.masked_lm.count_params(),
            origin.card_origin(training_text(train_manifest, data, schedule.plan.mixture)),
        ),
        status=status(steps, total_steps=schedule.total_steps),
        usage=usage(output.hub_model_id or public_name(output.output_dir), mask),
        training_data=training_data(manifests, data, tokenizer, schedule),
        training_procedure=training_procedure(
            config, mask, global_batch_size, max_length, schedule, settings, origin.branch
        ),
        results=results(metrics, steps, steps * global_batch_size * max_length, mask)
        + validation_sets(metrics, data, mask)
        + averaged_checkpoints(averaged, mask),
        evaluation_note=evaluation_note(eval_manifest),
    )


def front_matter(config, origin):
    """The metadata block: a fill-mask model, continued or pretrained from scratch (`origin`'s
    tag), linked on the Hub to the model it continues (its Hub id)."""
    tags = ["fill-mask", "tensorflow", "masked-language-modeling", config.model_type]
    return metadata_block(
        library_name="transformers",
        pipeline_tag="fill-mask",
        tags=[*tags, origin.card_tag],
        base_model=origin.hub_id,
    )


def training_text(train_manifest, data, mixture_of=None):
    """The text the model was trained on: the shards' source, else their folder; a mixture's,
    each folder's (`mixture_of`, a mixture.Mixture)."""
    if mixture_of is not None:
        texts = [
            f"`{public_name(manifest.get('source')) or public_name(folder)}`"
            for folder, manifest in zip(mixture_of.folders, mixture_of.manifests)
        ]
        return "a mixture of " + ", ".join(texts)
    return public_name(train_manifest.get("source")) or public_name(data.train_dataset[0])


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


def usage(where, mask):
    """USAGE for the model at `where` (a Hub id, a local folder's name or a gs:// path)."""
    copy_first = ""
    if is_remote(where):
        copy_first = f"# first: gsutil -m cp -r {where.rstrip('/')} .\n\n"
        where = where.rstrip("/").rsplit("/", 1)[-1]
    return USAGE.format(
        copy_first=copy_first,
        id=where,
        mask=mask,
        pytorch_dir=PYTORCH_DIR,
    )


def training_data(manifests, data, tokenizer, schedule):
    """The shards of each split, then how their sequences were made; a mixture's folders one row
    each, with its share of the sequences and the passes the run makes over it (mixture_data);
    several validation sets one row each, by name."""
    train_manifest = manifests[0]
    mixture_of = schedule.plan.mixture
    splits = [("train", data.train_dataset[0], train_manifest)]
    if mixture_of is not None:
        splits = [("train", *source) for source in zip(mixture_of.folders, mixture_of.manifests)]
    evaluation_sets = mixture.evaluation_sets(data.eval_dataset)
    if len(evaluation_sets) > 1:  # each validation set by its name
        splits += [
            (f"evaluation ({one.name})", one.path, manifest)
            for one, manifest in zip(evaluation_sets, manifests[1:])
        ]
    elif manifests[1] is not None:
        splits.append(("evaluation", evaluation_sets[0].path, manifests[1]))
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
        f"`{public_name(tokenizer.name)}`, {len(tokenizer.tokenizer):,} tokens in its vocabulary."
    )
    header = ["split", "shards", "source", "sequences", "tokens"]
    if mixture_of is not None:
        header, rows, repeated = mixture_data(header, rows, mixture_of, schedule)
        sequences = "\n\n".join([*repeated, sequences])
    table = markdown_table(header, rows)
    return f"{table}\n\n{sequences}"


def mixture_data(header, rows, mixture_of, schedule):
    """The training data table of a mixture: each folder's share of the sequences and its passes
    over it, in expectation (the folder of each sequence is drawn at random), "–" for the
    evaluation; and the lines naming the folders repeated more than mixture.REPEATED_PASSES
    times."""
    total = schedule.total_steps * schedule.plan.global_batch_size
    repeats = mixture.passes(mixture_of.weights, mixture_of.records, total)
    shares = [f"{weight:.1%}" for weight in mixture_of.weights]
    passes = [mixture.passes_text(repeat) for repeat in repeats]
    extra = list(zip(shares, passes)) + [("–", "–")] * (len(rows) - len(shares))
    rows = [[*row, *more] for row, more in zip(rows, extra)]
    header = [*header, "share of the sequences", "passes over it"]
    note = (
        f"The {len(mixture_of.folders)} training folders are a mixture: each of the run's "
        f"{total:,} sequences is drawn from one of them at random by its weight, so the shares "
        "and passes are expected values. An epoch of the mixture is as many sequences as its "
        "folders hold together."
    )
    folders = [f"`{public_name(folder)}`" for folder in mixture_of.folders]
    return header, rows, [note, *mixture.repeated_lines(folders, repeats)]


def training_procedure(
    config, mask, global_batch_size, max_length, schedule, settings, branch=None
):
    """The settings table: architecture, batch, steps, optimizer, schedule, masking; `branch`, a
    branch's parent checkpoint (branching.ParentCheckpoint), else None."""
    total_steps, steps_per_epoch = schedule.total_steps, schedule.plan.steps_per_epoch
    masking, speed, plan = settings.masking, settings.speed, schedule.plan
    per_replica, accumulation = plan.per_replica_batch_size, plan.accumulation_steps
    per_replica_text = f"{per_replica} per replica"
    if accumulation > 1:
        per_replica_text += f" x {accumulation} accumulated"
    rows = [
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
            f"{global_batch_size} sequences of {max_length} tokens ({per_replica_text}, "
            f"{plan.replicas} replica(s))",
        ],
        [
            "steps",
            f"{total_steps:,} = {total_steps / steps_per_epoch:.2f} epochs of "
            f"{steps_per_epoch:,} steps",
        ],
    ]
    if masking.short_sequence_length:
        rows.append(
            [
                "sequence-length warmup",
                f"the first {masking.short_sequence_ratio:g} of the steps on each sequence cut "
                f"into pieces of {masking.short_sequence_length} tokens, as many tokens a step",
            ]
        )
    if accumulation > 1:
        accumulated = f"{accumulation} batches of {per_replica} per replica, one optimizer step"
        rows.append(["gradient accumulation", accumulated])
    rows += [
        ["optimizer", optimizer(settings.optimizer)],
        ["learning rate", learning_rate(settings.optimizer, total_steps, branch)],
        ["masking", masking_row(masking, mask)],
        ["loss", f"cross-entropy at the masked positions ({speed.mlm_head} LM head)"],
        ["precision", "mixed bfloat16" if speed.bfloat16 else "float32"],
        ["seed", masking.seed],
    ]
    return markdown_table(["setting", "value"], rows)


def optimizer(settings):
    """The Optimizer group's AdamW."""
    adam = f"β1 {settings.adam_beta1:g}, β2 {settings.adam_beta2:g}, ε {settings.adam_epsilon:g}"
    clip = settings.max_grad_norm
    clipping = f"gradients clipped to global norm {clip:g}" if clip else "no clipping"
    return (
        f"AdamW ({adam}), weight decay {settings.weight_decay_rate} (not on biases and layer "
        f"norms), {clipping}"
    )


def learning_rate(settings, total_steps, branch=None):
    """Warmup, then a linear (or 1 - sqrt) decay to 0 (with --decay_ratio: after the peak is held);
    a branch: its parent's rate at its step, held, then the decay over its own steps."""
    shape = "linear" if settings.decay_shape == "linear" else "1 - sqrt"
    decay = f"{shape} decay to 0"
    if branch is not None:
        steps = total_steps - branch.step
        ratio = settings.decay_ratio or 1.0
        return (
            f"{branch.learning_rate:.4g}, the parent's at step {branch.step:,} (no warmup), held, "
            f"then {decay} over the last {ratio:g} of the branch's {steps:,} steps"
        )
    warmup = segments.warmup_steps(settings.warmup_ratio, total_steps)
    if settings.decay_ratio:
        decay = f"held, then {decay} over the last {settings.decay_ratio:g} of the steps"
    return (
        f"peak {settings.learning_rate:g}, linear warmup over {warmup:,} steps "
        f"({settings.warmup_ratio:g} of them), then {decay}"
    )


def masking_row(masking, mask):
    """The share masked in training (and in evaluation, when --train_mlm_probability differs)."""
    train_rate = masking.train_probability
    whole_words = ", chosen as whole words" if masking.whole_word_masking else ""
    evaluation = ""
    if train_rate != masking.mlm_probability:
        evaluation = f" (evaluation: {masking.mlm_probability:.0%}, token by token)"
    return (
        f"{train_rate:.0%} of the non-special tokens of each sequence{whole_words}: 80% become "
        f"`{mask}`, 10% a random token, 10% stay; new masks every epoch{evaluation}"
    )


def number(metrics, key, digits=4):
    """The figure `key` of `metrics` with `digits` decimals, "–" where missing."""
    value = metrics.get(key)
    return "–" if value is None else f"{float(value):.{digits}f}"


def percent(metrics, key):
    """The share `key` of `metrics` as a percentage, "–" where missing."""
    value = metrics.get(key)
    return "–" if value is None else f"{100 * float(value):.2f}%"


def results(metrics, steps, tokens_seen, mask):
    """The latest figures, train and evaluation, over the masked positions ("–" where missing)."""
    train_perplexity = "–"
    if "loss" in metrics:
        train_perplexity = f"{training_logs.perplexity(float(metrics['loss'])):.2f}"
    rows = [
        ["masked-LM loss", number(metrics, "loss"), number(metrics, "val_loss")],
        ["perplexity", train_perplexity, number(metrics, "val_perplexity", 2)],
        [
            "masked accuracy (every labelled position)",
            percent(metrics, "masked_accuracy"),
            percent(metrics, "val_masked_accuracy"),
        ],
        [
            f"accuracy at `{mask}`",
            percent(metrics, "mask_token_accuracy"),
            percent(metrics, "val_mask_token_accuracy"),
        ],
    ]
    seen = (
        f"After {steps:,} steps, {tokens_seen:,} tokens seen. Train figures are the means over the "
        "steps of training_log.csv's last row; all of them count the masked positions only."
    )
    return f"{seen}\n\n{markdown_table(['metric', 'train', 'evaluation'], rows)}"


def validation_sets(metrics, data, mask):
    """With several --eval_dataset sets: a table of each set's latest figures, a row a set
    ("–" where missing); "" with one (the results table holds it)."""
    names = [one.name for one in mixture.evaluation_sets(data.eval_dataset)]
    if len(names) < 2:
        return ""
    rows = [
        [
            f"`{name}`",
            number(metrics, f"val_{name}_loss"),
            percent(metrics, f"val_{name}_mask_token_accuracy"),
        ]
        for name in names
    ]
    header = ["validation set", "masked-LM loss", f"accuracy at `{mask}`"]
    return (
        f"\n\nEach validation set at the latest evaluation; the evaluation column above is the "
        f"first set's, `{names[0]}`.\n\n{markdown_table(header, rows)}"
    )


def averaged_checkpoints(averaged, mask):
    """With --average_last: which model this folder holds (the average, not the last step's, whose
    figures the table above gives), the steps averaged, and both models' evaluation figures."""
    if averaged is None:
        return ""
    text = (
        f"\n\nThis folder holds the model the run hands on: the average of the weights of "
        f"{averaged.which()}, saved after steps {averaged.steps_text()} (`--average_last "
        f"{averaged.average_last}`). The last step's own model is in `{LAST_STEP_DIR}/`; the "
        "evaluation figures above are the last step's."
    )
    if averaged.average is None:
        return text + " Neither model was evaluated: no evaluation shards were given."

    def figures(logs):
        return [number(logs, "loss"), percent(logs, "mask_token_accuracy")]

    models = [
        (f"average of {len(averaged.steps)} checkpoints (this folder)", averaged.average),
        (f"last step (`{LAST_STEP_DIR}/`)", averaged.last_step),
    ]
    if "sets" in averaged.average:  # several validation sets: a row a model and set
        rows = [
            [f"{model}, `{name}`", *figures(logs["sets"][name])]
            for model, logs in models
            for name in logs["sets"]
        ]
    else:
        rows = [[model, *figures(logs)] for model, logs in models]
    table = markdown_table(["model", "eval masked-LM loss", f"eval accuracy at `{mask}`"], rows)
    return f"{text}\n\n{table}"


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


def add_card_and_curves(output_dir, card_text, names=()):
    """Beside the saved model: its card (README.md: data, settings, results) and
    training_curves.png, the loss and the accuracy at [MASK] against the step, drawn from the
    TensorBoard scalars (a line for each of several validation sets, `names`)."""
    write_model_card(card_text, output_dir)
    output_dir = output_dir.rstrip("/")
    curves = f"{output_dir}/{CURVES_NAME}"
    training_logs.plot_curves(f"{output_dir}/{TENSORBOARD_DIR}", curves, names)
    print(
        f"Saved the model and tokenizer to {output_dir}, the curves to {output_dir}/{CURVES_NAME}."
    )
