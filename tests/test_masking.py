import dataclasses
import math

import numpy as np
import pytest
from helpers import MAX_LENGTH

import run_mlm

VOCAB = 1000
SPECIAL_IDS = [0, 1, 2, 3, 4]  # [CLS] [SEP] <unk> <pad> [MASK], as train_unigram.py numbers them
PAD_ID, MASK_ID = 3, 4
SIGMAS = 5  # tolerance, in binomial standard deviations


def within_binomial(count, trials, probability):
    sigma = math.sqrt(trials * probability * (1 - probability))
    return abs(count - trials * probability) <= SIGMAS * sigma


def random_batch(seed, shape=(512, 128)):
    """Random ordinary tokens with [CLS] / [SEP] / <unk> sprinkled in and padded tails, like real
    batches."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(len(SPECIAL_IDS), VOCAB, size=shape)
    sprinkled = rng.random(shape) < 0.08
    ids[sprinkled] = rng.choice([0, 1, 2], size=int(sprinkled.sum()))
    ids[:, 0] = 0
    for row, length in enumerate(rng.integers(shape[1] // 2, shape[1] + 1, size=shape[0])):
        ids[row, length:] = PAD_ID
    return ids.astype(np.int32)


def dense_labels(shape, positions, labels):
    """The [batch, length] labels (-100 where nothing is predicted) from the sparse positions and
    labels."""
    dense = np.full(shape, -100, dtype=np.int64)
    rows, slots = np.nonzero(labels != -100)
    dense[rows, positions[rows, slots]] = labels[rows, slots]
    return dense


def mask_sparse(input_ids, seed=(1, 2), mlm_probability=0.15, starts=None, jit_compile=False):
    """masked_lm_data.mask_tokens on a batch (whole words when `starts` marks where words start)."""
    import tensorflow as tf

    from mlm_pipeline import masked_lm_data

    function = (
        tf.function(masked_lm_data.mask_tokens, jit_compile=True)
        if jit_compile
        else masked_lm_data.mask_tokens
    )
    masked, positions, labels = function(
        tf.constant(input_ids),
        tf.constant(seed, dtype=tf.int64),
        mlm_probability,
        tf.constant(MASK_ID, dtype=tf.int32),
        tf.constant(SPECIAL_IDS, dtype=tf.int32),
        tf.constant(list(range(len(SPECIAL_IDS), VOCAB)), dtype=tf.int32),
        *([] if starts is None else [tf.constant(starts)]),
    )
    return masked.numpy(), positions.numpy(), labels.numpy()


def mask(input_ids, seed=(1, 2), mlm_probability=0.15):
    masked, positions, labels = mask_sparse(input_ids, seed, mlm_probability)
    return masked, dense_labels(input_ids.shape, positions, labels)


@pytest.fixture(scope="module")
def batch():
    return random_batch(seed=0)


@pytest.mark.parametrize("mlm_probability", [0.15, 0.4])
def test_chosen_rate_and_80_10_10_split(batch, mlm_probability):
    masked, labels = mask(batch, mlm_probability=mlm_probability)
    assert masked.shape == labels.shape == batch.shape
    candidates = ~np.isin(batch, SPECIAL_IDS)
    chosen = labels != -100
    # An exact count per sequence, as in the original BERT: round(p x the
    # sequence's ordinary tokens).
    np.testing.assert_array_equal(
        chosen.sum(axis=1), np.round(mlm_probability * candidates.sum(axis=1))
    )

    replacements = VOCAB - len(SPECIAL_IDS)
    to_mask = chosen & (masked == MASK_ID)
    kept = chosen & (masked == batch)
    randomised = chosen & (masked != MASK_ID) & (masked != batch)
    assert (to_mask | kept | randomised)[chosen].all()
    trials = int(chosen.sum())
    # A random replacement draws the original token 1 time in `replacements`: it then looks kept.
    assert within_binomial(to_mask.sum(), trials, 0.8)
    assert within_binomial(randomised.sum(), trials, 0.1 * (1 - 1 / replacements))
    assert within_binomial(kept.sum(), trials, 0.1 + 0.1 / replacements)


def test_special_tokens_and_padding_are_never_chosen(batch):
    masked, labels = mask(batch, mlm_probability=0.9)
    special = np.isin(batch, SPECIAL_IDS)
    assert special.sum() > 0 and (batch == PAD_ID).sum() > 0
    assert (labels[special] == -100).all()
    assert (masked[special] == batch[special]).all()
    assert (labels[~special] != -100).mean() > 0.8


def test_labels_are_the_originals_exactly_at_chosen_positions(batch):
    masked, labels = mask(batch)
    chosen = labels != -100
    assert (labels[chosen] == batch[chosen]).all()
    assert set(np.unique(labels[~chosen])) == {-100}
    assert (masked[~chosen] == batch[~chosen]).all()


def test_random_replacements_are_ordinary_tokens(batch):
    masked, labels = mask(batch, mlm_probability=0.5)
    chosen = labels != -100
    replaced = masked[chosen & (masked != MASK_ID) & (masked != batch)]
    assert replaced.size > 1000
    assert not np.isin(replaced, SPECIAL_IDS).any()
    assert replaced.min() >= len(SPECIAL_IDS) and replaced.max() < VOCAB
    # Drawn from the whole ordinary vocabulary, not a corner of it.
    assert len(np.unique(replaced)) > 0.5 * (VOCAB - len(SPECIAL_IDS))
    # Outside chosen positions no id changes, so [MASK] appears only where chosen.
    assert not (masked[~chosen] == MASK_ID).any()


@pytest.mark.parametrize("mlm_probability", [0.15, 0.4])
def test_sparse_positions_and_labels_have_static_shape_and_no_repeats(batch, mlm_probability):
    from mlm_pipeline import masked_lm_data

    masked, positions, labels = mask_sparse(batch, mlm_probability=mlm_probability)
    predictions = masked_lm_data.max_predictions(batch.shape[1], mlm_probability)
    assert positions.shape == labels.shape == (batch.shape[0], predictions)
    used = labels != -100
    assert used.sum(axis=1).max() <= predictions
    # Used slots come first; unused ones point at position 0 and carry -100, so nothing scores them.
    assert (np.diff(used.astype(int), axis=1) <= 0).all()
    assert (positions[~used] == 0).all()
    for row in range(batch.shape[0]):
        chosen_positions = positions[row][used[row]]
        assert len(set(chosen_positions)) == len(chosen_positions)
        np.testing.assert_array_equal(labels[row][used[row]], batch[row, chosen_positions])


def test_same_seed_same_masks_and_different_seed_different_masks(batch):
    first, first_labels = mask(batch, seed=(7, 8))
    again, again_labels = mask(batch, seed=(7, 8))
    other, other_labels = mask(batch, seed=(7, 9))
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first_labels, again_labels)
    assert (first_labels != other_labels).any()
    assert (first != other).any()


# --------------------------------------------------------------------------------------------------
# build_dataset on the fixture shards


def dataset_options(tokenizer, **masking):
    """build_dataset's named values as main() passes them for run_mlm.py's default flags, with a
    shuffle buffer of 1 unless `masking` (Masking settings by name) says otherwise."""
    argv = ["--train_dataset", "unused", "--tokenizer", "unused", "--output_dir", "unused"]
    defaults = run_mlm.parse_args(argv).masking
    masking = dataclasses.replace(defaults, **{"shuffle_buffer_size": 1, **masking})
    return dict(tokenizer=tokenizer, max_length=MAX_LENGTH, masking=masking)


def originals(masked, labels):
    return np.where(labels != -100, labels, masked)


def collect(dataset, batches=None):
    out = []
    for features, labels in dataset.take(batches) if batches else dataset:
        masked = features["input_ids"].numpy()
        out.append(
            (
                masked,
                dense_labels(masked.shape, features["masked_positions"].numpy(), labels.numpy()),
            )
        )
    return out


@pytest.fixture(scope="module")
def validation(shards_dir, read_manifest, read_records):
    split_dir = shards_dir / "validation"
    manifest = read_manifest(split_dir)
    files = [str(split_dir / shard["file"]) for shard in manifest["shards"]]
    return files, read_records(files)


def test_evaluation_batches_are_the_records_in_order_with_fixed_masks(validation, tokenizer):
    from mlm_pipeline import masked_lm_data

    files, records = validation
    batch_size = 8
    dataset = masked_lm_data.build_dataset(
        files, batch_size, training=False, **dataset_options(tokenizer)
    )
    features_spec, labels_spec = dataset.element_spec
    assert features_spec["input_ids"].shape.as_list() == [batch_size, MAX_LENGTH]
    predictions = masked_lm_data.max_predictions(MAX_LENGTH, 0.15)
    assert features_spec["masked_positions"].shape.as_list() == [batch_size, predictions]
    assert labels_spec.shape.as_list() == [batch_size, predictions]

    first_pass, second_pass = collect(dataset), collect(dataset)
    assert len(first_pass) == len(records) // batch_size  # the remainder is dropped
    for (masked, labels), (masked_again, labels_again) in zip(first_pass, second_pass):
        np.testing.assert_array_equal(masked, masked_again)
        np.testing.assert_array_equal(labels, labels_again)
    restored = np.concatenate([originals(masked, labels) for masked, labels in first_pass])
    np.testing.assert_array_equal(restored, np.array(records[: len(restored)]))

    chosen = np.concatenate([labels for _, labels in first_pass]) != -100
    special = np.isin(restored, tokenizer.all_special_ids)
    assert not chosen[special].any()
    np.testing.assert_array_equal(chosen.sum(axis=1), np.round(0.15 * (~special).sum(axis=1)))
    masked_ids = np.concatenate([masked for masked, _ in first_pass])
    changed = chosen & (masked_ids != restored) & (masked_ids != tokenizer.mask_token_id)
    assert not np.isin(masked_ids[changed], tokenizer.all_special_ids).any()
    assert masked_ids.max() < len(tokenizer)


def test_training_masks_change_from_one_epoch_to_the_next(validation, tokenizer):
    from mlm_pipeline import masked_lm_data

    files, records = validation
    # with one file and a buffer of 1 the order repeats, so only the masks can differ
    assert len(files) == 1
    batch_size = 8
    steps_per_epoch = len(records) // batch_size
    dataset = masked_lm_data.build_dataset(
        files, batch_size, training=True, **dataset_options(tokenizer)
    )
    batches = collect(dataset, 2 * steps_per_epoch)  # training data repeats forever
    assert len(batches) == 2 * steps_per_epoch
    first, second = batches[:steps_per_epoch], batches[steps_per_epoch:]
    for (masked, labels), (masked_again, labels_again) in zip(first, second):
        np.testing.assert_array_equal(
            originals(masked, labels), originals(masked_again, labels_again)
        )
    first_labels = np.concatenate([labels for _, labels in first])
    second_labels = np.concatenate([labels for _, labels in second])
    assert ((first_labels != -100) != (second_labels != -100)).any()
    # Within an epoch, batches get different seeds too.
    assert not np.array_equal(first[0][1] != -100, first[1][1] != -100)


def test_training_order_is_shuffled_but_reproducible(shards_dir, read_manifest, tokenizer):
    from mlm_pipeline import masked_lm_data

    split_dir = shards_dir / "train"
    files = [str(split_dir / shard["file"]) for shard in read_manifest(split_dir)["shards"]]
    options = dataset_options(tokenizer, shuffle_buffer_size=1000)

    def restored(dataset):
        return np.concatenate([originals(masked, labels) for masked, labels in collect(dataset, 6)])

    first = restored(masked_lm_data.build_dataset(files, 8, training=True, **options))
    again = restored(masked_lm_data.build_dataset(files, 8, training=True, **options))
    unshuffled = restored(masked_lm_data.build_dataset(files, 8, training=False, **options))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, unshuffled)


def test_training_masks_at_its_own_rate_and_evaluation_at_mlm_probability(validation, tokenizer):
    """--train_mlm_probability 0.4: training batches mask 40% of each sequence's tokens, while the
    evaluation batches keep --mlm_probability's 15%, the same positions as without the flag."""
    from mlm_pipeline import masked_lm_data

    files, _ = validation
    options = dataset_options(tokenizer, train_mlm_probability=0.4)

    def chosen_share(training, **overrides):
        dataset = masked_lm_data.build_dataset(
            files, 8, training=training, **{**options, **overrides}
        )
        masked, labels = collect(dataset, 1)[0]
        special = np.isin(originals(masked, labels), tokenizer.all_special_ids)
        chosen = (labels != -100).sum(axis=1)
        return chosen, np.round((~special).sum(axis=1) * np.array([0.4, 0.15])[:, None])

    chosen, (at_40, _) = chosen_share(True)
    np.testing.assert_array_equal(chosen, at_40)
    chosen, (_, at_15) = chosen_share(False)
    np.testing.assert_array_equal(chosen, at_15)
    plain = masked_lm_data.build_dataset(files, 8, training=False, **dataset_options(tokenizer))
    np.testing.assert_array_equal(
        collect(plain, 1)[0][1],
        collect(masked_lm_data.build_dataset(files, 8, training=False, **options), 1)[0][1],
    )
