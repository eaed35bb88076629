"""run_mlm.py --model_name_or_path: continued pretraining of a published masked LM on your text.

A tiny parent of each tokenizer family (tests/parent_models.py: byte-level BPE as roberta-base,
WordPiece as bert-base-uncased, SentencePiece as xlm-roberta-base) is saved as on the Hub; step 2
makes shards with its tokenizer; run_mlm.main() continues it. The run starts from the parent's
weights, evaluates before its first step, and writes the PyTorch copy and a card that names the
parent; one run is stopped after its first checkpoint and resumes from that checkpoint (not from the
parent) to the exact step count. What cannot go together is refused in one line, with nothing
written.
"""

import csv
import json
import os
import shutil

import numpy as np
import pytest
from helpers import MAX_LENGTH, flags
from parent_models import FAMILIES, cache_as_hub_model, family_tokenizer, save_parent

import prepare_tfrecord_shards as prepare
import run_mlm
from mlm_pipeline import contract, pretrained_model, whole_words
from mlm_pipeline.errors import UsageError

# Word markers of each family's vocabulary: where a word starts, or (WordPiece) goes on.
WORD_MARKERS = {"roberta": "Ġ", "bert": "##", "xlm-roberta": "▁"}


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


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, corpus, tmp_path_factory):
    """(family, its parent's folder, the parent TF model, shards made with its tokenizer)."""
    folder = tmp_path_factory.mktemp(request.param)
    parent = folder / "parent"
    model = save_parent(request.param, texts_of(corpus), parent)
    shards = make_shards(parent, corpus, folder / "shards")
    return request.param, parent, model, shards


def weights_of(model):
    return [weight.numpy() for weight in model.weights]


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
    family, tmp_path, capsys
):
    """Each family starts from its parent's exact weights and is evaluated at step 0. The roberta
    run is stopped after its first checkpoint and resumed (resuming is the same for every family);
    the bert run also turns dropout off, the one --config_overrides a parent takes."""
    name, parent, parent_model, shards = family
    output_dir = tmp_path / "continued"
    overrides = "hidden_dropout_prob=0,attention_probs_dropout_prob=0" if name == "bert" else None
    argv = continue_flags(parent, shards, output_dir, config_overrides=overrides)
    seen = {}

    def stop(trainer):  # after the first evaluation's checkpoint (the run's callbacks come first)
        seen["checkpointed"] = weights_of(trainer.masked_lm)
        raise StopAfterFirstEvaluation

    first = callback(
        on_train_begin=lambda trainer: seen.setdefault("start", weights_of(trainer.masked_lm)),
        on_epoch_end=stop if name == "roberta" else None,
    )
    if name == "roberta":
        with pytest.raises(StopAfterFirstEvaluation):
            run_mlm.main(run_mlm.parse_args(argv), callbacks=[first])
        assert not (output_dir / "config.json").exists()  # stopped: no finished model yet
        capsys.readouterr()
        resumed = callback(
            on_train_begin=lambda trainer: seen.setdefault("resumed", weights_of(trainer.masked_lm))
        )
        trainer, _ = run_mlm.main(run_mlm.parse_args(argv), callbacks=[resumed])
        assert "Resuming from" in capsys.readouterr().out
        # the resumed run restored its own checkpoint, not the parent's weights
        for restored, saved in zip(seen["resumed"], seen["checkpointed"], strict=True):
            np.testing.assert_array_equal(restored, saved)
    else:
        trainer, _ = run_mlm.main(run_mlm.parse_args(argv), callbacks=[first])
    for started, published in zip(seen["start"], weights_of(parent_model), strict=True):
        np.testing.assert_array_equal(started, published)  # every weight, the LM head's too
    assert int(trainer.optimizer.iterations.numpy()) == 4

    # the evaluation before the first step, then one every 2 steps, none twice
    rows = list(csv.DictReader((output_dir / "training_log.csv").open()))
    assert [int(row["step"]) for row in rows] == [0, 2, 4]
    assert rows[0]["loss"] == "" and float(rows[0]["val_loss"]) > 0
    assert float(rows[-1]["val_loss"]) != float(rows[0]["val_loss"])  # it trained

    # a run like any other: the PyTorch copy, and a card that names the parent
    assert (output_dir / contract.PYTORCH_DIR / "model.safetensors").is_file()
    card = (output_dir / "README.md").read_text()
    assert "continued-pretraining" in card and f"pretrained further from `{parent.name}`" in card
    assert "base_model" not in card  # a folder, not a Hub id: no link the Hub could follow
    saved = json.loads((output_dir / "config.json").read_text())
    assert saved["vocab_size"] == parent_model.config.vocab_size
    assert saved["hidden_size"] == parent_model.config.hidden_size
    if overrides:
        assert saved["hidden_dropout_prob"] == saved["attention_probs_dropout_prob"] == 0


def test_masking_fits_each_family(family):
    """Special tokens never chosen, the family's own mask token, whole words by its own markers."""
    name, parent, _, shards = family
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(parent))
    starts = whole_words.word_start_table(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    marked = [index for index, piece in enumerate(pieces) if piece.startswith(WORD_MARKERS[name])]
    assert marked and all(starts[index] == (name != "bert") for index in marked)

    files = sorted(str(path) for path in (shards / "train").glob("*.tfrecord"))
    dataset = run_mlm.build_dataset(
        files,
        16,
        True,
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
            f"more than the 8 positions of --model_name_or_path {folder / 'short'}",
        ),
        "no masked LM": (
            continue_flags(folder / "decoder", shards, "OUT"),
            "is a gpt2 model, which has no TF masked-LM class",
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
]


@pytest.mark.parametrize("case", REFUSALS)
def test_what_cannot_go_together_is_one_line(
    case, roberta, tokenizer_dir, shards_dir, corpus, tmp_path
):
    folder, shards = roberta
    argv, expected = refusals(folder, shards, tokenizer_dir, shards_dir)[case]
    output_dir = tmp_path / "out"
    argv = [str(output_dir) if word == "OUT" else word for word in argv]
    expected = expected.replace("{}", str(corpus["train"]))
    with pytest.raises(UsageError) as error:
        run_mlm.main(run_mlm.parse_args(argv))
    message = str(error.value)
    assert "\n" not in message and expected in message
    assert not output_dir.exists() or not any(output_dir.rglob("*"))


def test_family_tokenizers_differ_in_fingerprint(corpus):
    """The shards' check rests on it: each family's vocabulary has a fingerprint of its own."""
    texts = texts_of(corpus)
    prints = {contract.vocabulary_fingerprint(family_tokenizer(f, texts)) for f in FAMILIES}
    assert len(prints) == len(FAMILIES)
