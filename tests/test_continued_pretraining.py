"""run_mlm.py --model_name_or_path: continued pretraining of a published masked LM on your text.

A tiny parent of each tokenizer family (tests/parent_models.py: byte-level BPE as roberta-base,
WordPiece as bert-base-uncased, SentencePiece as xlm-roberta-base, byte-level BPE with [CLS] and
[SEP] as answerdotai/ModernBERT-base) is saved as on the Hub; step 2 makes shards with its
tokenizer; run_mlm.main() continues it. The run starts from the parent's weights, evaluates before
its first step, and writes the PyTorch copy and a card that names the parent; the roberta and
ModernBERT runs are stopped after their first checkpoint and resume from it (not from the parent)
to the exact step count. The ModernBERT parent is made and saved by transformers 5 (one subprocess
for the module, which also scores it): its evaluation before the first step here is the loss
transformers 5 gives the same masked batches, from a folder and from a cached Hub id. What cannot
go together is refused in one line, with nothing written.
"""

import csv
import json
import os
import shutil

import numpy as np
import pytest
from helpers import MAX_LENGTH, flags
from parent_models import (
    FAMILIES,
    TOKENIZER_FAMILIES,
    cache_as_hub_model,
    config_of,
    family_tokenizer,
    modernbert_build,
    run_transformers5,
    save_parent,
)
from refusals import refused, script_in_process

import prepare_tfrecord_shards as prepare
import run_mlm
from mlm_pipeline import contract, pretrained_model, pytorch_weights, whole_words
from mlm_pipeline.errors import UsageError

# Word markers of each family's vocabulary: where a word starts, or (WordPiece) goes on.
WORD_MARKERS = {"roberta": "Ġ", "bert": "##", "xlm-roberta": "▁", "modernbert": "Ġ", "mmbert": "▁"}
# run_mlm.py's evaluation before the first step against transformers 5's loss on the same batches
BASELINE_TOLERANCE = 1e-4


def texts_of(corpus):
    return [line for line in corpus["train"].read_text().splitlines() if line.strip()]


def make_shards(tokenizer_name, corpus, output_dir, max_length=MAX_LENGTH):
    for split in ("train", "validation"):
        argv = flags(
            **{f"{split}_file": corpus[split]},
            split=split,
            tokenizer_name_or_path=tokenizer_name,
            max_length=max_length,
            shard_size=40,
            output_dir=output_dir,
        )
        prepare.main(prepare.parse_args(argv))
    return output_dir


def continue_flags(parent, shards, output_dir, *extra, **named):
    """run_mlm.py's flags to continue `parent` on `shards` for 4 steps, evaluated every 2."""
    defaults = dict(
        no_tpu=True,
        model_name_or_path=parent,
        train_dataset=shards / "train",
        eval_dataset=shards / "validation",
        output_dir=output_dir,
        per_replica_batch_size=4,
        max_steps=4,
        eval_steps=2,
        learning_rate="1e-2",
    )
    return [*flags(**{**defaults, **named}), *map(str, extra)]


def evaluation_batches(argv):
    """The masked evaluation batches run_mlm.main(argv) scores, as numpy ("input_ids" and
    "labels", [batches, batch, length], labels -100 where nothing is predicted): build_dataset as
    its evaluation's input plan calls it (one host, one replica), its masking settings."""
    import tensorflow as tf
    from transformers import AutoTokenizer

    from mlm_pipeline import hosts, masked_lm_data, shard_checks

    args = run_mlm.parse_args(argv)
    data, parent = args.data, args.model.model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(parent)
    named = contract.NamedTokenizer(tokenizer, parent, "its tokenizer")
    manifests = shard_checks.read_training_manifests(
        data.train_dataset[0], data.eval_dataset[0], named
    )
    batch_size = args.speed.per_replica_batch_size
    plans = hosts.input_plans(tf.distribute.get_strategy(), manifests, batch_size)
    host = plans[1].pipeline_input(tf.distribute.InputContext())
    dataset = masked_lm_data.build_dataset(
        host.files,
        host.batch_size,
        training=False,
        tokenizer=tokenizer,
        max_length=manifests[0]["max_length"],
        masking=args.masking,
        batches_per_epoch=host.batches_per_epoch,
        pipeline=host.pipeline,
    )
    inputs, labels = [], []
    for features, slot_labels in dataset:
        positions, slot_labels = features["masked_positions"].numpy(), slot_labels.numpy()
        full = np.full(features[contract.FEATURE_NAME].shape, -100, np.int64)
        for row, column in zip(*np.nonzero(slot_labels != -100), strict=True):
            full[row, positions[row, column]] = slot_labels[row, column]
        inputs.append(features[contract.FEATURE_NAME].numpy())
        labels.append(full)
    assert len(inputs) == plans[1].steps_per_epoch  # every batch run_mlm.py scores
    return {"input_ids": np.stack(inputs), "labels": np.stack(labels)}


@pytest.fixture(scope="module")
def modernbert(corpus, tmp_path_factory):
    """A ModernBERT parent made and saved by transformers 5, shards made with its tokenizer, and
    the loss transformers 5 gives the masked evaluation batches continue_flags()' run scores (one
    subprocess): (folder, shards, transformers 5's report, its mean loss over the batches)."""
    folder = tmp_path_factory.mktemp("modernbert")
    parent = folder / "parent"
    tokenizer = family_tokenizer("modernbert", texts_of(corpus))
    tokenizer.save_pretrained(parent)  # step 2 needs the tokenizer alone
    shards = make_shards(parent, corpus, folder / "shards")
    batches = folder / "evaluation_batches.npz"
    np.savez(batches, **evaluation_batches(continue_flags(parent, shards, folder / "unused")))
    request = {
        "build": [modernbert_build(parent, tokenizer)],
        "losses": [{"folder": str(parent), "batches": str(batches)}],
    }
    report = run_transformers5(request, folder / "transformers5", "the ModernBERT parent")
    return parent, shards, report, float(np.mean(report["losses"][str(parent)]))


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, corpus, tmp_path_factory):
    """(family, its parent's folder, the parent TF model (None for ModernBERT: transformers 5's),
    shards made with its tokenizer)."""
    if request.param == "modernbert":
        parent, shards, _, _ = request.getfixturevalue("modernbert")
        return request.param, parent, None, shards
    folder = tmp_path_factory.mktemp(request.param)
    parent = folder / "parent"
    model = save_parent(request.param, texts_of(corpus), parent)
    shards = make_shards(parent, corpus, folder / "shards")
    return request.param, parent, model, shards


def weights_of(model):
    return [weight.numpy() for weight in model.weights]


def parent_weights(name, parent, parent_model):
    """The parent's weights as starting_weights() gives them: its TF model's, or (ModernBERT) the
    tensors of the model.safetensors transformers 5 saved, by PyTorch name."""
    if parent_model is not None:
        return weights_of(parent_model)
    from safetensors.numpy import load_file

    return load_file(str(parent / "model.safetensors"))


def starting_weights(name, model):
    """A TF masked LM's weights, in order; a ModernBERT's by PyTorch name, as its parent's file
    holds them (tied weights once)."""
    return pytorch_weights.pytorch_state_dict(model) if name == "modernbert" else weights_of(model)


def assert_same_weights(found, expected):
    if isinstance(expected, dict):
        assert sorted(found) == sorted(expected)
        found, expected = [found[key] for key in expected], list(expected.values())
    for one, other in zip(found, expected, strict=True):
        np.testing.assert_array_equal(one, other)


class StopAfterFirstEvaluation(Exception):
    pass


def callback(on_train_begin=None, on_epoch_end=None):
    import tf_keras

    class Hook(tf_keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            if on_train_begin:
                on_train_begin(self.model)

        def on_epoch_end(self, epoch, logs=None):
            if on_epoch_end:
                on_epoch_end(self.model)

    return Hook()


def test_continued_run_starts_from_the_parent_and_resumes_its_own_checkpoint(
    family, tmp_path, capsys, request
):
    """Each family starts from its parent's exact weights and is evaluated at step 0. The roberta
    and ModernBERT runs are stopped after their first checkpoint and resumed; the bert and
    ModernBERT runs also change dropout, the one --config_overrides a parent takes. ModernBERT's
    evaluation at step 0 is transformers 5's loss for its parent on the same batches."""
    name, parent, parent_model, shards = family
    output_dir = tmp_path / "continued"
    overrides = {
        "bert": "hidden_dropout_prob=0,attention_probs_dropout_prob=0",
        "modernbert": "attention_dropout=0.1,mlp_dropout=0.1,embedding_dropout=0.1",
    }.get(name)
    argv = continue_flags(parent, shards, output_dir, config_overrides=overrides)
    resumes = name in ("roberta", "modernbert")
    seen = {}

    def stop(trainer):  # after the first evaluation's checkpoint (the run's callbacks come first)
        seen["checkpointed"] = starting_weights(name, trainer.masked_lm)
        raise StopAfterFirstEvaluation

    first = callback(
        on_train_begin=lambda trainer: seen.setdefault(
            "start", starting_weights(name, trainer.masked_lm)
        ),
        on_epoch_end=stop if resumes else None,
    )
    if resumes:
        with pytest.raises(StopAfterFirstEvaluation):
            run_mlm.main(run_mlm.parse_args(argv), callbacks=[first])
        assert not (output_dir / "config.json").exists()  # stopped: no finished model yet
        capsys.readouterr()
        resumed = callback(
            on_train_begin=lambda trainer: seen.setdefault(
                "resumed", starting_weights(name, trainer.masked_lm)
            )
        )
        trainer, _ = run_mlm.main(run_mlm.parse_args(argv), callbacks=[resumed])
        assert "Resuming from" in capsys.readouterr().out
        # the resumed run restored its own checkpoint, not the parent's weights
        assert_same_weights(seen["resumed"], seen["checkpointed"])
    else:
        trainer, _ = run_mlm.main(run_mlm.parse_args(argv), callbacks=[first])
    # every weight, the LM head's too
    assert_same_weights(seen["start"], parent_weights(name, parent, parent_model))
    assert int(trainer.optimizer.iterations.numpy()) == 4

    # the evaluation before the first step, then one every 2 steps, none twice
    rows = list(csv.DictReader((output_dir / "training_log.csv").open()))
    assert [int(row["step"]) for row in rows] == [0, 2, 4]
    assert rows[0]["loss"] == "" and float(rows[0]["val_loss"]) > 0
    assert float(rows[-1]["val_loss"]) != float(rows[0]["val_loss"])  # it trained
    if name == "modernbert":  # where transformers 5 has the parent on the same batches
        expected = request.getfixturevalue("modernbert")[3]
        assert abs(float(rows[0]["val_loss"]) - expected) <= BASELINE_TOLERANCE

    # a run like any other: the PyTorch copy, and a card that names the parent
    assert (output_dir / contract.PYTORCH_DIR / "model.safetensors").is_file()
    card = (output_dir / "README.md").read_text()
    assert "continued-pretraining" in card and f"pretrained further from `{parent.name}`" in card
    assert "base_model" not in card  # a folder, not a Hub id: no link the Hub could follow
    # what a rerun must match to resume: the parent as --model_name_or_path named it
    recorded = json.loads(
        (output_dir / contract.CHECKPOINT_DIR / contract.RUN_SETTINGS_NAME).read_text()
    )
    assert recorded["model_name_or_path"] == str(parent)
    saved, published = json.loads((output_dir / "config.json").read_text()), config_of(parent)
    assert saved["vocab_size"] == published["vocab_size"]
    assert saved["hidden_size"] == published["hidden_size"]
    for item in (overrides or "").split(","):
        if item:
            key, value = item.split("=")
            assert saved[key] == float(value)


def test_modernbert_saved_by_transformers5_is_a_parent_with_local_and_global_layers(modernbert):
    """The parent is what transformers 5 writes: model.safetensors, no TF weights, a config.json
    with layer_types and rope_parameters; its layers are global and local, its window shorter
    than the shards' sequences."""
    parent, _, report, _ = modernbert
    assert report["transformers_version"].startswith("5."), report["transformers_version"]
    assert (parent / "model.safetensors").is_file() and not list(parent.glob("tf_model*"))
    config = config_of(parent)
    assert config["transformers_version"].startswith("5.")
    assert {"layer_types", "rope_parameters"} <= set(config)
    reading = report["build"][str(parent)]
    assert set(reading["layer_types"]) == {"full_attention", "sliding_attention"}
    assert reading["local_attention"] < MAX_LENGTH
    assert len(report["losses"][str(parent)]) > 1


def test_modernbert_hub_id_continues_with_transformers5_loss(modernbert, tmp_path):
    """The same parent as a cached Hub id: the same evaluation at step 0, and a card whose
    base_model names it."""
    parent, shards, _, expected = modernbert
    cache_as_hub_model(parent, "tiny-org/modernbert", os.environ["HF_HUB_CACHE"])
    output_dir = tmp_path / "continued"
    argv = continue_flags(
        "tiny-org/modernbert", shards, output_dir, "--no_pytorch_export", max_steps=2
    )
    run_mlm.main(run_mlm.parse_args(argv))
    rows = list(csv.DictReader((output_dir / "training_log.csv").open()))
    assert [int(row["step"]) for row in rows] == [0, 2]
    assert abs(float(rows[0]["val_loss"]) - expected) <= BASELINE_TOLERANCE
    card = (output_dir / "README.md").read_text()
    assert "base_model: tiny-org/modernbert" in card


def test_the_length_guard_reads_each_familys_own_positions(family):
    """Shards exactly as long as the parent's positions are taken; one token longer is refused in
    one line that names them. RoBERTa and XLM-R number positions from the padding index (1) + 1, so
    their first two rows hold no position; BERT's table and ModernBERT's max_position_embeddings
    (rotary: no table) count from 0."""
    name, parent, _, _ = family
    model = pretrained_model.Parent(str(parent))
    table = config_of(parent)["max_position_embeddings"]
    positions = table - 2 if name in ("roberta", "xlm-roberta") else table
    assert positions >= MAX_LENGTH  # the parents hold the shards' sequences
    model.check_continuation(model.tokenizer, "its tokenizer", positions)
    with pytest.raises(UsageError) as refusal:
        model.check_continuation(model.tokenizer, "its tokenizer", positions + 1)
    message = str(refusal.value)
    assert "\n" not in message
    assert f"length, {positions + 1} tokens, is longer than the {positions} positions" in message
    assert f"prepare_tfrecord_shards.py --max_length {positions} or less" in message


def test_masking_fits_each_family(family):
    """Special tokens never chosen, the family's own mask token, whole words by its own markers."""
    name, parent, _, shards = family
    check_masking(name, parent, shards)


@pytest.fixture(scope="module")
def mmbert(corpus, tmp_path_factory):
    """mmBERT's kind of tokenizer (Gemma's) saved, and step 2's shards made with it."""
    folder = tmp_path_factory.mktemp("mmbert")
    family_tokenizer("mmbert", texts_of(corpus)).save_pretrained(folder / "tokenizer")
    return folder / "tokenizer", make_shards(folder / "tokenizer", corpus, folder / "shards")


def test_masking_fits_mmberts_tokenizer(mmbert):
    """Gemma's kind of vocabulary, whose words start with "▁", <bos> ... <eos> around them."""
    check_masking("mmbert", *mmbert)


def check_masking(name, tokenizer_folder, shards):
    from transformers import AutoTokenizer

    from mlm_pipeline import masked_lm_data

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder))
    starts = whole_words.word_start_table(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    marked = [index for index, piece in enumerate(pieces) if piece.startswith(WORD_MARKERS[name])]
    assert marked and all(starts[index] == (name != "bert") for index in marked)

    files = sorted(str(path) for path in (shards / "train").glob("*.tfrecord"))
    dataset = masked_lm_data.build_dataset(
        files,
        16,
        training=True,
        tokenizer=tokenizer,
        max_length=MAX_LENGTH,
        masking=run_mlm.Masking(
            seed=0,
            mlm_probability=0.2,
            train_mlm_probability=None,
            whole_word_masking=True,
            shuffle_buffer_size=64,
            short_sequence_length=None,
            short_sequence_ratio=0.5,
        ),
    )
    (features, labels) = next(iter(dataset))
    masked, positions, labels = (
        features["input_ids"].numpy(),
        features["masked_positions"].numpy(),
        labels.numpy(),
    )
    special = set(tokenizer.all_special_ids)
    used = labels != -100
    assert used.any()
    assert not np.isin(labels[used], list(special)).any()
    assert tokenizer.mask_token_id in masked  # <mask> or [MASK], the family's own id
    for row in range(len(labels)):
        chosen = set(positions[row][used[row]].tolist())
        original = masked[row].copy()
        original[positions[row][used[row]]] = labels[row][used[row]]
        for position in chosen:  # the next piece of a chosen word is chosen too
            after = position + 1
            if (
                after < MAX_LENGTH
                and original[after] not in special
                and not starts[original[after]]
            ):
                assert after in chosen, f"{name}: a word cut at position {after}"


def test_pytorch_only_parent_loads_the_same_weights_without_torch(corpus, tmp_path):
    """A folder with model.safetensors in PyTorch's names and layouts (most Hub models), local and
    as a cached Hub id, gives the TF masked LM its exact weights; a classifier its encoder's."""
    from transformers import TFAutoModelForMaskedLM, TFAutoModelForSequenceClassification

    tf_model = save_parent("roberta", texts_of(corpus), tmp_path / "tf")
    save_parent("roberta", texts_of(corpus), tmp_path / "pytorch", layout="pytorch")
    assert not list((tmp_path / "pytorch").glob("tf_model*"))
    # as if downloaded: the session's Hugging Face cache (conftest.py), offline
    cache_as_hub_model(tmp_path / "pytorch", "tiny-org/roberta-pt", os.environ["HF_HUB_CACHE"])
    for name in (str(tmp_path / "pytorch"), "tiny-org/roberta-pt"):
        parent = pretrained_model.PretrainedModel(name)
        loaded = pretrained_model.load_weights(
            TFAutoModelForMaskedLM, parent, parent.config, whole=True
        )
        for found, expected in zip(weights_of(loaded), weights_of(tf_model), strict=True):
            np.testing.assert_array_equal(found, expected)
    classifier = pretrained_model.load_weights(
        TFAutoModelForSequenceClassification, parent, parent.config
    )
    encoder = {w.name.split("/", 1)[1]: w.numpy() for w in classifier.roberta.weights}
    for weight in tf_model.roberta.weights:
        np.testing.assert_array_equal(encoder[weight.name.split("/", 1)[1]], weight.numpy())


# --- what cannot go together: one line each, before any work, nothing written


@pytest.fixture(scope="module")
def roberta(corpus, tmp_path_factory):
    """A roberta parent, shards made with its tokenizer, and broken variants of the parent."""
    folder = tmp_path_factory.mktemp("roberta_refusals")
    texts = texts_of(corpus)
    save_parent("roberta", texts, folder / "parent")
    save_parent("roberta", texts, folder / "base", layout="base")  # no masked-LM head
    shutil.copytree(folder / "parent", folder / "short")  # 8 positions: fewer than the shards'
    config = json.loads((folder / "short" / "config.json").read_text())
    (folder / "short" / "config.json").write_text(
        json.dumps({**config, "max_position_embeddings": 10})
    )
    shutil.copytree(folder / "parent", folder / "decoder")  # a model type with no masked LM
    (folder / "decoder" / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "vocab_size": 1000, "n_embd": 32, "n_layer": 1})
    )
    (folder / "unfinished" / "checkpoints").mkdir(parents=True)  # a run still training
    return folder, make_shards(folder / "parent", corpus, folder / "shards")


@pytest.fixture(scope="module")
def modernbert_variants(modernbert, tmp_path_factory):
    """Copies of the ModernBERT parent with one field of config.json changed: "short" 16 positions,
    fewer than the shards' 32; "odd" a local_attention of 7."""
    parent, shards, _, _ = modernbert
    folder = tmp_path_factory.mktemp("modernbert_refusals")
    for name, change in (
        ("short", {"max_position_embeddings": 16}),
        ("odd", {"local_attention": 7}),
    ):
        shutil.copytree(parent, folder / name)
        (folder / name / "config.json").write_text(json.dumps({**config_of(parent), **change}))
    return parent, shards, folder


def modernbert_refusals(parent, shards, variants, project_shards):
    return {
        "ModernBERT: shards of another tokenizer": (
            continue_flags(parent, project_shards, "OUT"),
            f"is not that of the tokenizer of --model_name_or_path {parent}",
        ),
        "ModernBERT: fewer positions": (
            continue_flags(variants / "short", shards, "OUT"),
            f"is longer than the 16 positions of the model {variants / 'short'}",
        ),
        "ModernBERT: a window override": (
            continue_flags(parent, shards, "OUT", config_overrides="local_attention=16"),
            "would change local_attention of the model",
        ),
        "ModernBERT: a layer pattern override": (
            continue_flags(
                parent, shards, "OUT", config_overrides="mlp_dropout=0,global_attn_every_n_layers=2"
            ),
            "would change global_attn_every_n_layers of the model",
        ),
        "ModernBERT: an odd window": (
            continue_flags(variants / "odd", shards, "OUT"),
            f"--model_name_or_path {variants / 'odd'} has an odd ModernBERT local_attention 7: "
            "its local layers attend local_attention // 2 = 3 tokens each side (as in "
            "transformers), just as with local_attention 6; it was trained as with "
            "local_attention 6: write that into its config.json",
        ),
    }


def refusals(folder, shards, tokenizer_dir, project_shards):
    parent = folder / "parent"
    return {
        "another architecture": (
            continue_flags(parent, shards, "OUT", pretrained_model_config="roberta-base"),
            "pass one of them",
        ),
        "a shape override": (
            continue_flags(parent, shards, "OUT", config_overrides="hidden_size=64"),
            "would change hidden_size",
        ),
        "another tokenizer": (
            continue_flags(parent, project_shards, "OUT", tokenizer=tokenizer_dir),
            f"--tokenizer {tokenizer_dir} has a vocabulary other than that of "
            f"--model_name_or_path {parent}",
        ),
        "shards of another tokenizer": (
            continue_flags(parent, project_shards, "OUT"),
            f"is not that of the tokenizer of --model_name_or_path {parent}, so their ids would "
            "mean other tokens; remake them with it: python prepare_tfrecord_shards.py "
            f"--train_file '{{}}' --split train --tokenizer_name_or_path {parent}",
        ),
        "no masked-LM head": (
            continue_flags(folder / "base", shards, "OUT"),
            "has no trained weights for lm_head",
        ),
        "fewer positions": (
            continue_flags(folder / "short", shards, "OUT"),
            f"is longer than the 8 positions of the model {folder / 'short'}",
        ),
        "no masked LM": (
            continue_flags(folder / "decoder", shards, "OUT"),
            "is a gpt2 model, which has no TF masked-LM class in transformers, so it cannot be "
            "pretrained here; pass a masked LM: roberta, bert, xlm-roberta, modernbert, or another "
            "family with a TF masked-LM class in transformers 4.57",
        ),
        "an unfinished run": (
            continue_flags(folder / "unfinished", shards, "OUT"),
            "is that run still training?",
        ),
        "a Hub id not in the cache": (
            continue_flags("tiny-org/not-downloaded", shards, "OUT"),
            "could not load the model config of --model_name_or_path tiny-org/not-downloaded",
        ),
    }


REFUSALS = [
    "another architecture",
    "a shape override",
    "another tokenizer",
    "shards of another tokenizer",
    "no masked-LM head",
    "fewer positions",
    "no masked LM",
    "an unfinished run",
    "a Hub id not in the cache",
    "ModernBERT: shards of another tokenizer",
    "ModernBERT: fewer positions",
    "ModernBERT: a window override",
    "ModernBERT: a layer pattern override",
    "ModernBERT: an odd window",
]


@pytest.mark.parametrize("case", REFUSALS)
def test_what_cannot_go_together_is_one_line(
    case, roberta, modernbert_variants, tokenizer_dir, shards_dir, corpus, tmp_path
):
    """run_mlm.py's one line (refusals.refused: exit 1, no traceback, nothing written)."""
    folder, shards = roberta
    cases = {
        **refusals(folder, shards, tokenizer_dir, shards_dir),
        **modernbert_refusals(*modernbert_variants, project_shards=shards_dir),
    }
    argv, expected = cases[case]
    output_dir = tmp_path / "out"
    argv = [str(output_dir) if word == "OUT" else word for word in argv]
    expected = expected.replace("{}", str(corpus["train"]))
    refused(script_in_process, "run_mlm.py", argv, output_dir, expected)


def test_family_tokenizers_differ_in_fingerprint(corpus):
    """The shards' check rests on it: each family's vocabulary has a fingerprint of its own."""
    texts = texts_of(corpus)
    prints = {
        contract.vocabulary_fingerprint(family_tokenizer(f, texts)) for f in TOKENIZER_FAMILIES
    }
    assert len(prints) == len(TOKENIZER_FAMILIES)


def test_a_continued_preflight_counts_the_evaluation_before_the_first_step(roberta, tmp_path):
    """--preflight of continued pretraining projects the parent's evaluation before step 1 beside
    the run's own (4 steps evaluated every 2: 2), and writes nothing."""
    folder, shards = roberta
    output_dir = tmp_path / "continued"
    argv = continue_flags(folder / "parent", shards, output_dir, "--preflight")
    report = run_mlm.main(run_mlm.parse_args(argv))
    assert report.evaluation.count == 3
    argv = continue_flags(folder / "parent", shards, output_dir, "--preflight", eval_steps=4)
    assert run_mlm.main(run_mlm.parse_args(argv)).evaluation.count == 2
    assert not output_dir.exists()
