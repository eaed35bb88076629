"""The training recipe's parts: whole-word masking, the sequence-length warmup, gradient
accumulation, and the optimizer flags (clipping, Adam's betas and epsilon)."""

import functools
import re

import numpy as np
import pytest
from helpers import MAX_LENGTH, kill_when, run_command, start_script
from refusals import refused, script_in_process
from test_masking import (
    MASK_ID,
    SPECIAL_IDS,
    VOCAB,
    dataset_options,
    dense_labels,
    mask_sparse,
    random_batch,
    within_binomial,
)
from test_resume import latest_checkpoint_step, load_weights, training_args

import run_mlm
from mlm_pipeline import contract, segments, training_logs, whole_words

NO_DROPOUT = ",hidden_dropout_prob=0,attention_probs_dropout_prob=0"

# --------------------------------------------------------------------------------------------------
# Whole-word masking


def vocabulary_with_words(seed):
    """word_starts for the ids of test_masking's random batches: about 60% of the ordinary pieces
    begin a word."""
    rng = np.random.default_rng(seed)
    starts = rng.random(VOCAB) < 0.6
    starts[SPECIAL_IDS] = True
    return starts


def words_of(row, starts):
    """Each position's word number, as the masking defines words: a word-start piece and the pieces
    after it that continue it; special tokens, the piece after one, and the first piece always begin
    a word."""
    special = np.isin(row, SPECIAL_IDS)
    begins = starts[row] | special | np.concatenate([[True], special[:-1]])
    return np.cumsum(begins) - 1


def check_whole_words(batch, starts, chosen, mlm_probability):
    """Assert that `chosen` [batch, length] takes whole words only, no special token, within each
    row's budget; return how many words of several pieces it took (the whole-word check had pieces
    to split)."""
    budget = np.round(mlm_probability * (~np.isin(batch, SPECIAL_IDS)).sum(axis=1))
    assert (chosen.sum(axis=1) <= budget).all()
    assert not chosen[np.isin(batch, SPECIAL_IDS)].any()
    multi_piece_words = 0
    for row, row_chosen in zip(batch, chosen):
        words, ordinary = words_of(row, starts), ~np.isin(row, SPECIAL_IDS)
        for word in np.unique(words[row_chosen]):
            members = (words == word) & ordinary
            assert row_chosen[members].all(), "a word was chosen in part"
            multi_piece_words += members.sum() > 1
    return multi_piece_words


def mask_whole_words(input_ids, starts, seed=(1, 2), mlm_probability=0.15, jit_compile=False):
    return mask_sparse(input_ids, seed, mlm_probability, starts=starts, jit_compile=jit_compile)


@pytest.mark.parametrize("mlm_probability", [0.15, 0.4])
def test_whole_words_are_chosen_whole_and_within_the_budget(mlm_probability):
    starts = vocabulary_with_words(seed=0)
    batch = random_batch(seed=3)
    masked, positions, labels = mask_whole_words(batch, starts, mlm_probability=mlm_probability)
    chosen = dense_labels(batch.shape, positions, labels) != -100
    assert check_whole_words(batch, starts, chosen, mlm_probability) > 1000
    budget = np.round(mlm_probability * (~np.isin(batch, SPECIAL_IDS)).sum(axis=1))
    # words fill the budget but for the last one that did not fit
    assert chosen.sum() >= 0.85 * budget.sum()


def test_whole_word_masking_keeps_the_80_10_10_rule_per_piece():
    starts = vocabulary_with_words(seed=1)
    counts = np.zeros(3, dtype=int)
    for seed in range(4):  # many batches, each with its own masks
        batch = random_batch(seed=10 + seed)
        masked, positions, labels = mask_whole_words(batch, starts, seed=(seed, 7))
        chosen = dense_labels(batch.shape, positions, labels) != -100
        counts += [
            (chosen & (masked == MASK_ID)).sum(),
            (chosen & (masked == batch)).sum(),
            (chosen & (masked != MASK_ID) & (masked != batch)).sum(),
        ]
    trials, replacements = counts.sum(), VOCAB - len(SPECIAL_IDS)
    assert within_binomial(counts[0], trials, 0.8)
    assert within_binomial(counts[1], trials, 0.1 + 0.1 / replacements)
    assert within_binomial(counts[2], trials, 0.1 * (1 - 1 / replacements))


def test_whole_word_masking_compiles_with_xla_and_is_stateless():
    starts = vocabulary_with_words(seed=2)
    batch = random_batch(seed=5, shape=(64, 128))
    compiled = mask_whole_words(batch, starts, jit_compile=True)
    # XLA may draw other random numbers than TF's own kernels, but as deterministically, and with
    # the same rules.
    for first, again in zip(compiled, mask_whole_words(batch, starts, jit_compile=True)):
        np.testing.assert_array_equal(first, again)
    masked, positions, labels = compiled
    chosen = dense_labels(batch.shape, positions, labels) != -100
    assert check_whole_words(batch, starts, chosen, 0.15) > 0
    assert not np.array_equal(positions, mask_whole_words(batch, starts, seed=(9, 9))[1])


def shard_files(split_dir, read_manifest):
    return [str(split_dir / shard["file"]) for shard in read_manifest(split_dir)["shards"]]


class Vocabulary:
    def __init__(self, pieces):
        self.pieces = pieces

    def __len__(self):
        return len(self.pieces)

    def convert_ids_to_tokens(self, ids):
        return [self.pieces[i] for i in ids]


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        # SentencePiece
        (["<s>", "▁the", "ing", "▁cat", ",", "▁"], [False, True, False, True, False, True]),
        # WordPiece
        (["[CLS]", "the", "##ing", "cat", "##s", ","], [True, True, False, True, False, True]),
        # byte-level BPE
        (["<s>", "Ġthe", "ing", "Ġcat", ",", "Ġ"], [False, True, False, True, False, True]),
    ],
)
def test_word_starts_are_read_from_the_vocabulary_markers(pieces, expected):
    assert whole_words.word_start_table(Vocabulary(pieces)) == expected


def test_word_starts_of_this_projects_tokenizer(tokenizer):
    starts = whole_words.word_start_table(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    assert starts == [piece.startswith("▁") for piece in pieces]
    assert 0.3 < np.mean(starts) < 1.0  # both kinds exist in a real vocabulary


def test_evaluation_masks_stay_token_masks_with_whole_word_masking(
    shards_dir, read_manifest, tokenizer
):
    from mlm_pipeline import masked_lm_data

    files = shard_files(shards_dir / "validation", read_manifest)
    datasets = [
        masked_lm_data.build_dataset(
            files, 8, training=training, **dataset_options(tokenizer, whole_word_masking=flag)
        )
        for flag in (False, True)
        for training in (False, True)
    ]
    (eval_plain, train_plain), (eval_words, train_words) = datasets[:2], datasets[2:]
    first = [
        next(iter(dataset))[1].numpy()
        for dataset in (eval_plain, eval_words, train_plain, train_words)
    ]
    # evaluation: the same token masks, so runs compare
    np.testing.assert_array_equal(first[0], first[1])
    assert not np.array_equal(first[2], first[3])  # training: whole words


# --------------------------------------------------------------------------------------------------
# Sequence-length warmup


def test_warmup_pieces_are_the_sequences_cut_with_as_many_tokens_a_batch(
    shards_dir, read_manifest, tokenizer
):
    from mlm_pipeline import masked_lm_data

    files = shard_files(shards_dir / "train", read_manifest)
    options = dataset_options(tokenizer)
    whole = masked_lm_data.build_dataset(files, 8, training=True, **options)
    cut = masked_lm_data.build_dataset(files, 8, training=True, pieces=4, **options)
    features, labels = next(iter(cut))
    short = MAX_LENGTH // 4
    assert features["input_ids"].shape == (32, short)
    assert (
        labels.shape
        == features["masked_positions"].shape
        == (32, masked_lm_data.max_predictions(short, 0.15))
    )

    def originals(features, labels):
        masked = features["input_ids"].numpy()
        dense = dense_labels(masked.shape, features["masked_positions"].numpy(), labels.numpy())
        return np.where(dense != -100, dense, masked), dense != -100

    whole_ids, _ = originals(*next(iter(whole)))
    cut_ids, chosen = originals(features, labels)
    # the same records, in pieces
    np.testing.assert_array_equal(cut_ids.reshape(8, MAX_LENGTH), whole_ids)
    special = np.isin(cut_ids, tokenizer.all_special_ids)
    # per piece
    np.testing.assert_array_equal(chosen.sum(axis=1), np.round(0.15 * (~special).sum(axis=1)))


@pytest.mark.parametrize(
    ("start", "total", "per_epoch", "phase_end", "expected"),
    [
        (0, 30, 10, 15, [(0, 0, 1, 10), (10, 1, 1, 5), (15, 1, 1, 5), (20, 2, 1, 10)]),
        (0, 30, 10, 20, [(0, 0, 2, 10), (20, 2, 1, 10)]),
        (17, 30, 10, 15, [(17, 1, 1, 3), (20, 2, 1, 10)]),
        (3, 30, 10, 5, [(3, 0, 1, 2), (5, 0, 1, 5), (10, 1, 2, 10)]),
    ],
)
def test_fit_segments_end_at_the_warmup_phase_end(start, total, per_epoch, phase_end, expected):
    calls = segments.fit_segments(start, total, per_epoch, phase_end=phase_end)
    assert calls == expected
    for first_step, _, epochs, steps in calls:  # no fit() call runs across the phase end
        assert not first_step < phase_end < first_step + epochs * steps


def warmup_args(shards_dir, tokenizer_dir, output_dir, total, *extra):
    return training_args(
        shards_dir,
        tokenizer_dir,
        output_dir,
        "--max_steps",
        total,
        "--short_sequence_length",
        MAX_LENGTH // 4,
        "--short_sequence_ratio",
        0.5,
        # the rest of the CPU recipe, so that a killed run is shown to resume it exactly
        "--train_mlm_probability",
        0.3,
        "--decay_ratio",
        0.25,
        *extra,
    )


@pytest.fixture(scope="module")
def uninterrupted_warmup(shards_dir, tokenizer_dir, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("warmup-uninterrupted")
    total = 24  # 12 steps on pieces of 8 tokens, 12 at 32; checkpoints every 5 steps
    trainer, logs = run_mlm.main(
        run_mlm.parse_args(warmup_args(shards_dir, tokenizer_dir, output_dir, total))
    )
    return output_dir, total, logs


def kill_at_checkpoint(args, output_dir, step):
    """Start run_mlm.py with `args` and SIGKILL it once a checkpoint of `step` or later exists;
    that checkpoint's step."""

    def ready():
        return (latest_checkpoint_step(output_dir) or 0) >= step

    kill_when(start_script("run_mlm.py", *args), ready, f"checkpoint of step {step}")
    return latest_checkpoint_step(output_dir)


def test_warmup_survives_a_kill_in_either_phase(
    uninterrupted_warmup, shards_dir, tokenizer_dir, tmp_path
):
    straight, total, _ = uninterrupted_warmup
    short_steps = total // 2
    args = warmup_args(shards_dir, tokenizer_dir, tmp_path, total)
    # Killed in the short phase; the rerun resumes there, crosses the switch, and
    # is killed in the full phase.
    assert kill_at_checkpoint(args, tmp_path, 5) < short_steps
    saved = kill_at_checkpoint(args, tmp_path, short_steps + 3)
    assert short_steps < saved < total

    rerun = run_command("run_mlm.py", *args)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (
        f"at step {saved} of {total}." in rerun.stdout
        and f"Finished: {total:,} steps" in rerun.stdout
    )
    for resumed, uninterrupted in zip(load_weights(tmp_path), load_weights(straight)):
        np.testing.assert_allclose(resumed, uninterrupted, rtol=1e-4, atol=1e-6)


def test_warmup_evaluates_at_full_length_at_the_switch_and_the_end(uninterrupted_warmup):
    output_dir, total, logs = uninterrupted_warmup
    # an evaluation closes the short phase
    assert logs["step"][-1] == total and total // 2 in logs["step"]
    card = (output_dir / "README.md").read_text()
    assert "held, then linear decay to 0 over the last 0.25 of the steps" in card
    assert "30% of the non-special tokens" in card and "(evaluation: 15%, token by token)" in card
    assert all(np.isfinite(logs["val_loss"]))
    _, rows = training_logs.read_training_log(str(output_dir / contract.TRAINING_LOG_NAME))
    # a row for each evaluation, the switch's too, in the epoch of the data its step falls in
    assert [(row["epoch"], int(row["step"])) for row in rows] == [
        ("0", step) for step in logs["step"]
    ]


def test_a_warmup_run_prints_one_epoch_sequence_and_the_steps_left(
    shards_dir, tokenizer_dir, read_manifest, tmp_path, capsys
):
    """fit() is called once per side of the warmup's switch and per partial epoch, yet the epochs
    are numbered as one run with one total (the epoch the switch splits shows twice), and each
    epoch ends with the steps left and an estimate of their time."""
    batch_size = 16
    per_epoch = read_manifest(shards_dir / "train")["records"] // batch_size
    total = 2 * per_epoch + per_epoch // 2  # 3 epochs, the last one part-way
    switch = total // 2  # --short_sequence_ratio 0.5: inside the second epoch
    assert per_epoch < switch < 2 * per_epoch
    argv = warmup_args(
        shards_dir,
        tokenizer_dir,
        tmp_path,
        total,
        "--per_replica_batch_size",
        batch_size,
        "--save_steps",
        0,
        "--no_pytorch_export",
    )
    run_mlm.main(run_mlm.parse_args(argv))
    printed = capsys.readouterr().out

    assert re.findall(r"^Epoch \d+/\d+$", printed, re.M) == [
        "Epoch 1/3",
        "Epoch 2/3",
        "Epoch 2/3",
        "Epoch 3/3",
    ], printed[-3000:]
    epoch_ends = [per_epoch, switch, 2 * per_epoch, total]
    progress = re.findall(r"^step (\d+)/(\d+), (.*)$", printed, re.M)
    assert [(int(step), int(of)) for step, of, _ in progress] == [
        (end, total) for end in epoch_ends
    ]
    for (step, _, rest), end in zip(progress, epoch_ends):
        left = total - end
        expected = (
            rf"{left} to go, about \d+(\.\d)? (seconds|minutes|hours) left"
            if left
            else "none to go"
        )
        assert re.fullmatch(expected, rest), rest


def test_steps_left_line_estimates_from_the_pace_given():
    assert (
        training_logs.steps_left_line(1200, 2000, seconds_per_step=0.105)
        == "step 1,200/2,000, 800 to go, about 1.4 minutes left"
    )
    assert (
        training_logs.steps_left_line(10, 40, 1.5) == "step 10/40, 30 to go, about 45 seconds left"
    )
    assert training_logs.steps_left_line(0, 100_000, 0.36).endswith("about 10.0 hours left")
    assert training_logs.steps_left_line(40, 40, 1.5) == "step 40/40, none to go"


def test_warmup_and_accumulation_on_two_cpu_replicas(
    run_script, shards_dir, tokenizer_dir, tmp_path
):
    """Logical CPU devices can only be set up before TensorFlow starts, hence fresh processes."""
    results = {}
    # one batch of 8 a replica, and 2 batches of 4 accumulated: a global batch of 16 either way
    per_replica = {1: "8 a replica", 2: "4 a replica x 2 accumulated"}
    for steps in (1, 2):
        output_dir = tmp_path / f"accumulate-{steps}"
        result = run_script(
            "run_mlm.py",
            *warmup_args(
                shards_dir,
                tokenizer_dir,
                output_dir,
                6,
                "--cpu_replicas",
                2,
                "--per_replica_batch_size",
                8 // steps,
                "--gradient_accumulation_steps",
                steps,
                "--no_pytorch_export",
            ),
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        summary = (
            f"on 2 replicas of MirroredStrategy: a global batch of 16 sequences "
            f"({per_replica[steps]}) x {MAX_LENGTH} tokens = {16 * MAX_LENGTH} tokens a step."
        )
        assert summary in result.stdout, result.stdout
        assert "Finished: 6 steps" in result.stdout and "val_perplexity" in result.stdout
        assert (output_dir / "config.json").is_file() and (output_dir / "tokenizer.json").is_file()
        results[steps] = load_weights(output_dir)
    card = (output_dir / contract.MODEL_CARD_NAME).read_text(encoding="utf-8")
    batch_row = f"16 sequences of {MAX_LENGTH} tokens (4 per replica x 2 accumulated, 2 replica(s))"
    assert batch_row in card, card
    assert "2 batches of 4 per replica, one optimizer step" in card, card
    # 2 batches of 4 accumulated on each of two replicas: the optimizer steps of one batch of 8,
    # through both phases of the warmup.
    for accumulated, whole in zip(results[2], results[1]):
        np.testing.assert_allclose(accumulated, whole, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# Gradient accumulation and the optimizer flags


def train_steps(shards_dir, tokenizer_dir, output_dir, *extra):
    # adam_epsilon 1: Adam's first steps then scale with the gradient, so a
    # wrongly scaled sum would show.
    argv = training_args(
        shards_dir,
        tokenizer_dir,
        output_dir,
        "--max_steps",
        2,
        "--per_replica_batch_size",
        8,
        "--learning_rate",
        0.05,
        "--warmup_ratio",
        0,
        "--adam_epsilon",
        1,
        "--no_pytorch_export",
        *extra,
    )
    trainer, logs = run_mlm.main(run_mlm.parse_args(argv))
    return [weight.numpy() for weight in trainer.masked_lm.weights], logs


@pytest.fixture(scope="module")
def one_batch_of_eight(shards_dir, tokenizer_dir, tmp_path_factory):
    return train_steps(shards_dir, tokenizer_dir, tmp_path_factory.mktemp("batch-of-8"))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_four_accumulated_batches_of_two_give_the_step_of_one_batch_of_eight(
    jit_compile, one_batch_of_eight, shards_dir, tokenizer_dir, tmp_path
):
    """--gradient_accumulation_steps multiplies the batch (as transformers' Trainer): 4 batches of
    2 make the optimizer step, and the loss, of one batch of 8."""
    extra = ["--per_replica_batch_size", 2, "--gradient_accumulation_steps", 4]
    extra += ["--jit_compile"] if jit_compile else []
    weights, logs = train_steps(shards_dir, tokenizer_dir, tmp_path, *extra)
    whole_weights, whole_logs = one_batch_of_eight
    np.testing.assert_allclose(logs["loss"], whole_logs["loss"], rtol=1e-5)
    moved = 0
    for accumulated, whole, initial in zip(
        weights, whole_weights, initial_weights(shards_dir, tokenizer_dir)
    ):
        np.testing.assert_allclose(accumulated - initial, whole - initial, rtol=1e-3, atol=1e-7)
        moved += np.abs(whole - initial).max() > 1e-6
    assert moved > len(weights) // 2


def test_an_accumulation_that_does_not_divide_the_batch_is_taken(shards_dir, tokenizer_dir):
    """Each replica accumulates whole batches of --per_replica_batch_size: no split to divide."""
    argv = training_args(shards_dir, tokenizer_dir, "unused", "--gradient_accumulation_steps", 3)
    speed = run_mlm.parse_args([str(word) for word in argv]).speed
    assert (speed.per_replica_batch_size, speed.gradient_accumulation_steps) == (8, 3)


@functools.lru_cache(maxsize=1)
def initial_weights(shards_dir, tokenizer_dir):
    """The model's weights before the first step, as every run with --seed 0 starts (same
    config)."""
    import tf_keras
    from transformers import TFAutoModelForMaskedLM

    from mlm_pipeline import masked_lm_model

    tokenizer = contract.load_tokenizer(str(tokenizer_dir), "--tokenizer", require_mlm_tokens=True)
    args = run_mlm.parse_args(training_args(shards_dir, tokenizer_dir, "unused"))
    tf_keras.utils.set_random_seed(0)
    config = masked_lm_model.build_config(
        masked_lm_model.Scratch(args.model), tokenizer, MAX_LENGTH
    )
    masked_lm = TFAutoModelForMaskedLM.from_config(config)
    masked_lm(masked_lm.dummy_inputs)
    return [weight.numpy() for weight in masked_lm.weights]


def test_optimizer_flags_reach_the_optimizer_and_clipping_bounds_the_step(
    shards_dir, tokenizer_dir, tmp_path
):
    flags = ["--max_grad_norm", 1e-6, "--adam_beta1", 0.8, "--adam_beta2", 0.98]
    argv = training_args(
        shards_dir,
        tokenizer_dir,
        tmp_path / "clipped",
        "--max_steps",
        1,
        "--learning_rate",
        0.05,
        "--warmup_ratio",
        0,
        "--adam_epsilon",
        1,
        "--no_pytorch_export",
        *flags,
    )
    trainer, _ = run_mlm.main(run_mlm.parse_args(argv))
    optimizer = trainer.optimizer
    settings = [optimizer.global_clipnorm, optimizer.beta_1, optimizer.beta_2, optimizer.epsilon]
    np.testing.assert_allclose(
        [float(value) for value in settings], [1e-6, 0.8, 0.98, 1.0], rtol=1e-6
    )
    initial = initial_weights(shards_dir, tokenizer_dir)
    # With epsilon 1, the first Adam step moves each weight by about lr x (1 - beta1) x its
    # gradient: a global norm clipped to 1e-6 moves nothing by more than lr x 1e-6 (decay aside: lr
    # x 0.01 x |weight|).
    for weight, start in zip(trainer.masked_lm.weights, initial):
        moved = np.abs(weight.numpy() - start)
        assert (moved <= 0.05 * (1e-6 + 0.01 * np.abs(start)) + 1e-9).all(), weight.name


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (
            ["--short_sequence_length", 12],
            f"--short_sequence_length 12 must divide the shards' length {MAX_LENGTH}",
        ),
        (
            ["--short_sequence_length", MAX_LENGTH],
            f"--short_sequence_length {MAX_LENGTH} must divide",
        ),
        (
            ["--warmup_ratio", 0.5, "--decay_ratio", 0.6],
            "--decay_ratio 0.6 must lie in (0, 1 - --warmup_ratio] with --warmup_ratio 0.5",
        ),
    ],
)
def test_recipe_flags_that_cannot_go_together_are_refused_in_one_line(
    flags, needle, shards_dir, tokenizer_dir, tmp_path
):
    """Refused as the command line is read (the groups' rules), or once the shards' length is
    known (the sequence-length warmup's): either way one line, nothing written."""
    output_dir = tmp_path / "model"
    argv = training_args(shards_dir, tokenizer_dir, output_dir, *flags)
    refused(script_in_process, "run_mlm.py", argv, output_dir, needle)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (
            ["--short_sequence_length", 8, "--short_sequence_ratio", 1.0],
            "--short_sequence_ratio: 1.0 must lie strictly between 0 and 1",
        ),
        (["--adam_beta2", 1.0], "--adam_beta2: 1.0 must be 0 or more and below 1"),
        (["--adam_beta1", -0.1], "--adam_beta1: -0.1 must be 0 or more and below 1"),
        (["--adam_epsilon", 0], "--adam_epsilon: 0 must be a number above 0"),
        (["--learning_rate", -1e-4], "--learning_rate: -0.0001 must be a number above 0"),
        (["--max_grad_norm", -1], "--max_grad_norm: -1 must be 0 or a number above 0"),
        (["--weight_decay_rate", -0.01], "--weight_decay_rate: -0.01 must be 0 or a number"),
        (["--decay_ratio", 0], "--decay_ratio: 0 must be a number above 0"),
        (["--warmup_ratio", "inf"], "--warmup_ratio: inf must be a finite number"),
        (["--adam_epsilon", "tiny"], "--adam_epsilon: invalid float value: 'tiny'"),
    ],
)
def test_a_recipe_flag_out_of_its_range_is_refused_where_it_is_declared(
    flags, needle, shards_dir, tokenizer_dir, tmp_path, capsys
):
    """argparse refuses it with the type's one line (exit status 2), before any check or work."""
    argv = training_args(shards_dir, tokenizer_dir, tmp_path / "model", *flags)
    with pytest.raises(SystemExit) as refusal:
        run_mlm.parse_args([str(word) for word in argv])
    assert refusal.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"error: argument {needle}" in line, line
    assert not (tmp_path / "model").exists()


def test_warmup_stable_decay_holds_the_peak_then_decays_to_zero():
    from mlm_pipeline import masked_lm_model

    schedule = masked_lm_model.WarmupStableDecay(
        2.0, total_steps=100, warmup_steps=10, decay_steps=25
    )
    rates = {step: float(schedule(step)) for step in (0, 5, 10, 40, 75, 80, 95, 100)}
    expected = {0: 0.0, 5: 1.0, 10: 2.0, 40: 2.0, 75: 2.0, 80: 1.6, 95: 0.4, 100: 0.0}
    assert rates == pytest.approx(expected)


def test_warmup_stable_decay_over_every_step_after_the_warmup_is_create_optimizers_triangle():
    from transformers import create_optimizer

    from mlm_pipeline import masked_lm_model

    _, triangle = create_optimizer(1e-3, 200, 20)
    schedule = masked_lm_model.WarmupStableDecay(
        1e-3, total_steps=200, warmup_steps=20, decay_steps=180
    )
    steps = [0, 7, 20, 21, 100, 199, 200]
    expected = [float(triangle(s)) for s in steps]
    assert [float(schedule(s)) for s in steps] == pytest.approx(expected, rel=1e-5)
