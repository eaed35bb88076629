"""run_mlm.py --eval_dataset NAME=PATH ...: several validation sets, each scored at every
evaluation and logged under its name (training_log.csv, TensorBoard, the card, the curves, the
summary line), the first one the run's val_loss; a parent's evaluation before the first step
scores every set; a set that does not match the training shards is refused in one line naming it;
--preflight counts every set's batches. One set: tests/test_training_outputs.py and
tests/test_eval_steps.py hold its outputs unchanged.
"""

import csv
import json

import pytest
from helpers import MAX_LENGTH, labelled_rows, prepare_flags, tiny_run_flags, write_lines
from parent_models import save_parent
from refusals import refused, script_in_process

import prepare_tfrecord_shards as prepare
import run_mlm
from mlm_pipeline import checkpoints, contract, preflight, training_logs

BATCH_SIZE = 8
STEPS, EVAL_STEPS = 6, 3


def write_shards(text_file, tokenizer, output_dir, max_length=MAX_LENGTH):
    """A validation split of `text_file`'s lines, made with `tokenizer`; its folder."""
    argv = prepare_flags(
        {"validation": text_file}, tokenizer, "validation", output_dir, max_length=max_length
    )
    prepare.main(prepare.parse_args(argv))
    return output_dir / "validation"


def domain_text(folder):
    """Other text than the corpus's: the classifier's short labelled sentences."""
    return write_lines(folder / "domain.txt", [text for text, _ in labelled_rows(300, seed=3)])


@pytest.fixture(scope="module")
def domain(tokenizer_dir, tmp_path_factory):
    """A validation set of other text, made with the session's tokenizer."""
    folder = tmp_path_factory.mktemp("domain")
    return write_shards(domain_text(folder), tokenizer_dir, folder / "shards")


def run_flags(shards_dir, tokenizer_dir, output_dir, *sets, **named):
    named = dict(
        per_replica_batch_size=BATCH_SIZE,
        max_steps=STEPS,
        eval_steps=EVAL_STEPS,
        no_pytorch_export=True,
        **named,
    )
    argv = tiny_run_flags(shards_dir, tokenizer_dir, output_dir, "--eval_dataset", *sets, **named)
    return [str(word) for word in argv]


def read_log(output_dir):
    with open(output_dir / contract.TRAINING_LOG_NAME) as file:
        return list(csv.DictReader(file))


@pytest.fixture(scope="module")
def two_sets(shards_dir, tokenizer_dir, domain, tmp_path_factory):
    """The same tiny run evaluated on the corpus's validation split and the domain set, and on the
    domain set alone: (output folder of both, of the domain alone, what the first printed)."""
    import io
    from contextlib import redirect_stdout

    folder = tmp_path_factory.mktemp("two_sets")
    general = shards_dir / "validation"
    printed = io.StringIO()
    with redirect_stdout(printed):
        # the two checkpoints of its two evaluations averaged: each model scored on each set
        argv = run_flags(
            shards_dir,
            tokenizer_dir,
            folder / "both",
            f"general={general}",
            f"domain={domain}",
            average_last=2,
        )
        run_mlm.main(run_mlm.parse_args(argv))
    alone = run_flags(shards_dir, tokenizer_dir, folder / "alone", domain)
    run_mlm.main(run_mlm.parse_args(alone))
    return folder / "both", folder / "alone", printed.getvalue()


def test_each_set_has_columns_of_its_own_with_its_own_figures(two_sets):
    both, alone, _ = two_sets
    rows, domain_alone = read_log(both), read_log(alone)
    assert [row["step"] for row in rows] == ["3", "6"]
    for name in ("general", "domain"):
        for figure in ("loss", "mask_token_accuracy"):
            assert all(row[f"val_{name}_{figure}"] for row in rows), (name, figure)
    for row, alone_row in zip(rows, domain_alone, strict=True):
        # the first set is the one val_loss means
        assert float(row["val_general_loss"]) == pytest.approx(float(row["val_loss"]), rel=1e-6)
        assert float(row["val_general_mask_token_accuracy"]) == pytest.approx(
            float(row["val_mask_token_accuracy"]), rel=1e-6
        )
        # the second set's figures are those of the same run evaluated on it alone
        assert float(row["val_domain_loss"]) != pytest.approx(float(row["val_loss"]), rel=1e-3)
        assert float(row["val_domain_loss"]) == pytest.approx(
            float(alone_row["val_loss"]), rel=1e-5
        )
        assert float(row["val_domain_mask_token_accuracy"]) == pytest.approx(
            float(alone_row["val_mask_token_accuracy"]), rel=1e-5
        )
    # the run on one set logs no named column
    assert not [name for name in domain_alone[0] if name.startswith("val_domain")]


def test_each_set_is_in_tensorboard_the_checkpoints_row_the_card_and_the_summary(two_sets):
    both, _, printed = two_sets
    rows = read_log(both)
    scalars = training_logs.read_scalars(str(both / contract.TENSORBOARD_DIR))
    for name in ("general", "domain"):
        for figure in ("loss", "mask_token_accuracy"):
            values = scalars[f"eval/{name}_{figure}"]
            assert sorted(values) == [3, 6]
            assert [values[step] for step in (3, 6)] == pytest.approx(
                [float(row[f"val_{name}_{figure}"]) for row in rows], rel=1e-6
            )
    # the copy of the last row saved before its checkpoint, which a resumed run writes
    saved = json.loads((both / contract.CHECKPOINT_DIR / checkpoints.EPOCH_ROW_NAME).read_text())
    assert saved["step"] == STEPS
    assert saved["logs"]["val_domain_loss"] == pytest.approx(float(rows[-1]["val_domain_loss"]))
    card = (both / contract.MODEL_CARD_NAME).read_text()
    for name in ("general", "domain"):
        loss = float(rows[-1][f"val_{name}_loss"])
        accuracy = 100 * float(rows[-1][f"val_{name}_mask_token_accuracy"])
        assert f"| `{name}` | {loss:.4f} | {accuracy:.2f}% |" in card
        assert f"| evaluation ({name}) |" in card
        # --average_last: the last step's model scored on each set as its last evaluation was
        assert f"| last step (`last_step/`), `{name}` | {loss:.4f} | {accuracy:.2f}% |" in card
        assert f"| average of 2 checkpoints (this folder), `{name}` |" in card
    assert (both / contract.CURVES_NAME).stat().st_size > 0
    assert "Each evaluation scores 2 validation sets, val_loss the first's:" in printed
    summary = printed.strip().splitlines()[-1]
    assert f"domain eval loss {float(rows[-1]['val_domain_loss']):.4f}" in summary, summary


def test_the_curves_draw_a_line_for_each_set(two_sets, tmp_path):
    """The curves of several sets are not those drawn with the first set alone."""
    both, _, _ = two_sets
    log_dir = str(both / contract.TENSORBOARD_DIR)
    training_logs.plot_curves(log_dir, str(tmp_path / "one.png"))
    training_logs.plot_curves(log_dir, str(tmp_path / "each.png"), ("general", "domain"))
    assert (tmp_path / "each.png").read_bytes() == (both / contract.CURVES_NAME).read_bytes()
    assert (tmp_path / "each.png").read_bytes() != (tmp_path / "one.png").read_bytes()


def test_a_parents_evaluation_before_the_first_step_scores_every_set(corpus, tmp_path, capsys):
    texts = [line for line in corpus["train"].read_text().splitlines() if line.strip()]
    parent = tmp_path / "parent"
    save_parent("roberta", texts, parent)
    shards = tmp_path / "shards"
    for split in ("train", "validation"):
        prepare.main(
            prepare.parse_args(prepare_flags(corpus, parent, split, shards, shard_size=40))
        )
    domain = write_shards(domain_text(tmp_path), parent, tmp_path / "domain")
    output_dir = tmp_path / "continued"
    argv = [
        *("--no_tpu", "--model_name_or_path", parent, "--train_dataset", shards / "train"),
        *("--eval_dataset", f"general={shards / 'validation'}", f"domain={domain}"),
        *("--output_dir", output_dir, "--per_replica_batch_size", 4, "--max_steps", 2),
        "--no_pytorch_export",
    ]
    run_mlm.main(run_mlm.parse_args([str(word) for word in argv]))
    first = read_log(output_dir)[0]
    assert first["step"] == "0"
    assert float(first["val_general_loss"]) == pytest.approx(float(first["val_loss"]), rel=1e-6)
    # the parent knows neither text: its losses are close, but each set's own
    assert first["val_domain_loss"] != first["val_general_loss"]
    printed = capsys.readouterr().out
    line = next(text for text in printed.splitlines() if text.startswith("Before the first step,"))
    assert f"general: eval loss {float(first['val_general_loss']):.4f}" in line
    assert f"domain: eval loss {float(first['val_domain_loss']):.4f}" in line
    scalars = training_logs.read_scalars(str(output_dir / contract.TENSORBOARD_DIR))
    assert scalars["eval/domain_loss"][0] == pytest.approx(float(first["val_domain_loss"]))


def test_a_set_of_another_length_is_refused_in_one_line_naming_it(
    shards_dir, tokenizer_dir, corpus, tmp_path
):
    short = write_shards(corpus["validation"], tokenizer_dir, tmp_path / "short", max_length=16)
    output_dir = tmp_path / "model"
    argv = run_flags(
        shards_dir,
        tokenizer_dir,
        output_dir,
        f"general={shards_dir / 'validation'}",
        f"short={short}",
    )
    refused(
        script_in_process,
        "run_mlm.py",
        argv,
        output_dir,
        "--eval_dataset (short)",
        "max_length 16",
        f"--max_length {MAX_LENGTH}",
    )


def test_the_preflight_counts_every_sets_batches(
    shards_dir, tokenizer_dir, domain, tmp_path, capsys
):
    """Each set's own batches, --max_eval_samples cutting each one: here the domain set (134
    sequences) to 12 batches of 8, the general one (87) whole."""
    general = shards_dir / "validation"
    max_eval_samples = 96
    argv = run_flags(
        shards_dir,
        tokenizer_dir,
        tmp_path / "model",
        f"general={general}",
        f"domain={domain}",
        "--preflight",
        max_eval_samples=max_eval_samples,
    )
    report = run_mlm.main(run_mlm.parse_args(argv))
    assert not (tmp_path / "model").exists()
    evaluation = report.evaluation

    def batches_of(folder):
        records = json.loads((folder / contract.MANIFEST_NAME).read_text())["records"]
        return min(records, max_eval_samples) // BATCH_SIZE

    assert evaluation.count == STEPS // EVAL_STEPS
    assert batches_of(general) != batches_of(domain)
    assert (evaluation.batches, evaluation.other_batches) == (
        batches_of(general),
        (batches_of(domain),),
    )
    batches = evaluation.batches + evaluation.other_batches[0]
    assert f"2 evaluations of 2 validation sets, {batches} batches" in capsys.readouterr().out


def test_the_projection_counts_each_sets_evaluate_call():
    """3 evaluations of two sets (10 + 5 batches): every batch at the mean, the compile once, and
    a restart for each of the 6 evaluate() calls but the first."""
    timing = preflight.Timing(first=3.0, mean=0.1, spread=0.0, timed=5, extra=2.0, restart=0.5)
    report = preflight.Report(
        hardware={},
        phases=[],
        evaluation=preflight.Evaluation(None, 10, 3, (5,)),
        evaluation_timing=timing,
        sequences_per_step=8,
        tokens_per_sequence=MAX_LENGTH,
        memory=None,
    )
    assert report.evaluation_seconds == pytest.approx(3 * 15 * 0.1 + 2.0 + 5 * 0.5)
    one_set = preflight.Evaluation(None, 10, 3)
    report.evaluation = one_set
    assert report.evaluation_seconds == pytest.approx(3 * 10 * 0.1 + 2.0 + 2 * 0.5)
