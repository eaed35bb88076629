"""run_mlm.py's data: the shards checked against their tokenizer, read by one input pipeline per
host, shuffled and masked in tf.data, every shape static.

The masks are drawn in TF ops from stateless seeds (`mask_tokens`): the same seed gives the same
masks, so a resumed run rebuilds the very stream of batches it was killed in (`build_dataset`), and
the evaluation scores the same masked positions at every evaluation and in every run.
"""

import dataclasses
import functools
import itertools
import math

import tensorflow as tf

from . import contract, hosts, mixture, segments, shard_checks, whole_words
from .contract import FEATURE_NAME
from .errors import UsageError


def load_tokenizer(data, model, origin):
    """The shards' tokenizer, named as the user gave it (contract.NamedTokenizer): --tokenizer, else
    that of `origin` (masked_lm_model.Scratch or pretrained_model.Parent): only a parent has one,
    and the command line refuses a run from scratch without --tokenizer."""
    if data.tokenizer:
        tokenizer = contract.load_tokenizer(
            data.tokenizer, "--tokenizer", model.trust_remote_code, require_mlm_tokens=True
        )
        return contract.NamedTokenizer(tokenizer, data.tokenizer, f"--tokenizer {data.tokenizer}")
    name = model.model_name_or_path
    flag = f"the tokenizer of --model_name_or_path {name}"
    return contract.NamedTokenizer(origin.tokenizer, name, flag)


def read_shards(data, masking, tokenizer, origin):
    """The manifests of the train and evaluation shards (the second None without --eval_dataset;
    with several --eval_dataset sets, each set's in order after the train one) and their
    sequences' length, checked before any work against `tokenizer` (a contract.NamedTokenizer),
    --max_length, --whole_word_masking and what `origin` holds them to (a parent's vocabulary and
    positions)."""
    if masking.whole_word_masking:  # its vocabulary must say where words start
        whole_words.check_word_markers(tokenizer.tokenizer, tokenizer.flag)
    evaluation_sets = mixture.evaluation_sets(data.eval_dataset)
    # several sets are checked below, each refusal naming its set
    eval_dataset = evaluation_sets[0].path if len(evaluation_sets) == 1 else None
    manifests = shard_checks.read_training_manifests(data.train_dataset[0], eval_dataset, tokenizer)
    if len(evaluation_sets) > 1:
        evaluations = shard_checks.read_evaluation_manifests(
            evaluation_sets, manifests[0], tokenizer
        )
        manifests = (manifests[0], *evaluations)
    max_length = shard_checks.check_max_length(data.max_length, manifests[0], data.train_dataset[0])
    origin.check_continuation(tokenizer.tokenizer, tokenizer.flag, max_length)
    return manifests, max_length


def read_mixture(data, first_manifest, tokenizer):
    """The mixture.Mixture of several --train_dataset folders, each one's manifest read and checked
    as the first's was (`first_manifest`), and against it; its weights from --train_weights, else
    --mixture_alpha. None for one folder, which trains as it always has."""
    if len(data.train_dataset) == 1:
        return None
    manifests = shard_checks.read_mixture_manifests(data.train_dataset, first_manifest, tokenizer)
    records = [manifest["records"] for manifest in manifests]
    weights = mixture.mixture_weights(records, data.train_weights, data.mixture_alpha)
    folders = tuple(folder.rstrip("/") for folder in data.train_dataset)
    return mixture.Mixture(folders, tuple(manifests), weights)


def sequence_length_warmup(max_length, total_steps, masking):
    """(steps on short pieces, pieces per sequence): the sequence-length warmup's short phase, cut
    from the shards as they are (not the learning rate's --warmup_ratio). On short sequences a
    [MASK] gets more of the attention from its neighbours, and each position is trained by more
    sequences a step: a model learns to read its context sooner. BERT did 90% of its steps at 128
    tokens, then 512, from data written twice; here the phase follows from the step."""
    short = masking.short_sequence_length
    if short is None:
        return 0, 1
    if short >= max_length or max_length % short:
        raise UsageError(
            f"--short_sequence_length {short} must divide the shards' length {max_length} into "
            f"pieces (e.g. {max_length // 4}); or drop it to train at full length throughout."
        )
    short_steps, pieces = round(masking.short_sequence_ratio * total_steps), max_length // short
    print(
        f"Sequence-length warmup: steps 1-{short_steps:,} on {pieces} pieces of {short} tokens a "
        f"sequence, the rest at {max_length}."
    )
    return short_steps, pieces


def training_stream(strategy, plan, tokenizer, max_length, masking, short_steps=0, pieces=1):
    """`train_dataset_from(step)`: every replica's training batches from optimizer step `step` on,
    the sequence-length warmup's first `short_steps` steps on `pieces` pieces a sequence."""

    def train_dataset_from(step):
        return distributed_dataset(
            strategy,
            plan,
            training=True,
            tokenizer=tokenizer,
            max_length=max_length,
            masking=masking,
            start_step=step,
            pieces=pieces if step < short_steps else 1,
        )

    return train_dataset_from


def distributed_dataset(
    strategy, plan, *, training, tokenizer, max_length, masking, start_step=0, pieces=1
):
    """Every replica's masked batches from optimizer step `start_step` on: one input pipeline per
    host (build_dataset; a mixture's training, build_mixture_dataset), each reading shard files of
    its own and batched for its own replicas (hosts.py's `plan`)."""

    def host_pipeline(context):
        host = plan.pipeline_input(context, start_step)  # its files, batch, place in the stream
        build = build_mixture_dataset if training and plan.mixture else build_dataset
        return build(
            **dataclasses.asdict(host),  # named as build_dataset's parameters
            training=training,
            tokenizer=tokenizer,
            max_length=max_length,
            masking=masking,
            pieces=pieces,
        )

    return strategy.distribute_datasets_from_function(host_pipeline)


def build_dataset(
    files,
    batch_size,
    *,
    training,
    tokenizer,
    max_length,
    masking,
    start_epoch=0,
    start_batch=0,
    batches_per_epoch=None,
    pipeline=0,
    pieces=1,
):
    """One host's input pipeline: shards -> shuffled, parsed, masked batches of ({"input_ids",
    "masked_positions"}, labels), every shape static. `masking`: the Masking settings. Training
    data is an endless stream of epochs (at most `batches_per_epoch` batches each: all hosts take
    the same steps), its randomness stateless: epoch e reads the shards in an order drawn from
    (seed, e), shuffles blocks of records with seeds from (seed, e, block) and masks batch i with
    (seed, e, i). The masks change every epoch, as in RoBERTa, yet a resumed run rebuilds the
    stream from (`start_epoch`, `start_batch`). Evaluation: one pass in file order, fixed masks,
    --mlm_probability even when training masks at --train_mlm_probability, so runs compare.
    `pieces` > 1: the sequence-length warmup's pieces."""
    tables = token_tables(tokenizer, masking, training)
    mlm_probability = masking.train_probability if training else masking.mlm_probability
    files = tf.constant(files)
    base_seed = tf.constant([masking.seed, 1 if training else 2], dtype=tf.int64)  # train, eval
    if pipeline:  # each host draws its own; host 0 draws those of a single-host run
        base_seed = tf.random.experimental.stateless_fold_in(base_seed, pipeline)
    seed_for = functools.partial(folded_seed, base_seed)

    def epoch_batches(epoch):
        shuffle_buffer_size = masking.shuffle_buffer_size if training else None
        records = epoch_records(files, seed_for, epoch, shuffle_buffer_size)
        batches = records.batch(batch_size, drop_remainder=True)
        if batches_per_epoch is not None:
            batches = batches.take(batches_per_epoch)
        return batches.enumerate().map(lambda index, batch: (epoch, index, batch))

    epochs = tf.data.Dataset.counter(start_epoch) if training else tf.data.Dataset.range(1)
    dataset = epochs.flat_map(epoch_batches)  # fit() counts the steps: the stream may be endless
    if start_batch:
        dataset = dataset.skip(start_batch)  # skipped batches are read, but not parsed or masked
    mask = functools.partial(
        masked_batch,
        max_length=max_length,
        pieces=pieces,
        mlm_probability=mlm_probability,
        tables=tables,
    )

    def parse_and_mask(epoch, index, serialized):
        return mask(serialized, seed_for(epoch, index))

    dataset = dataset.map(parse_and_mask, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


# A mixture's stream draws from seeds of its own: [--seed, MIXTURE_STREAM], apart from one folder's
# training (1) and evaluation (2) streams. In it, the folder of each sequence is drawn from
# DRAWS, the masks of each batch from MASKS, and folder i's shuffles from FIRST_FOLDER + i.
MIXTURE_STREAM, DRAWS, MASKS, FIRST_FOLDER = 3, 0, 1, 2

# Sequences whose folders are drawn at once, from one seed: a resumed run counts the draws before
# its step chunk by chunk, so chunks of thousands keep that count to a fraction of a second.
DRAW_CHUNK = 4096


def build_mixture_dataset(
    files,
    records,
    weights,
    batch_size,
    *,
    training,
    tokenizer,
    max_length,
    masking,
    start_batch=0,
    pipeline=0,
    pieces=1,
):
    """One host's input pipeline of a mixture of training folders: for each folder, its `files`
    (its `records` sequences), an endless stream of its own epochs, read in an order and shuffled in
    blocks with stateless seeds as build_dataset does; each sequence of the mixed stream drawn from
    folder i with probability `weights`[i]. Sequence k's folder is drawn from the seed and k alone
    (mixture_draws, DRAW_CHUNK sequences a draw), so the stream from batch `start_batch` on is the
    tail of the stream from batch 0: each folder starts where the draws before that batch (counted
    again) left it. Batch b is masked with (seed, b);
    `pieces`: the sequence-length warmup's, as in build_dataset."""
    del training  # a mixture trains; the evaluation reads its folder with build_dataset
    tables = token_tables(tokenizer, masking, training=True)
    base_seed = tf.constant([masking.seed, MIXTURE_STREAM], dtype=tf.int64)
    if pipeline:  # each host draws its own
        base_seed = tf.random.experimental.stateless_fold_in(base_seed, pipeline)
    draw_seed = folded_seed(base_seed, DRAWS)
    chunk_draws = functools.partial(mixture_draws, draw_seed, weights)
    start_sequence = start_batch * batch_size
    drawn = draws_before(draw_seed, weights, start_sequence)
    streams = [
        folder_stream(
            folder_files,
            folder_records,
            folded_seed(base_seed, FIRST_FOLDER + number),
            drawn[number],
            masking.shuffle_buffer_size,
        )
        for number, (folder_files, folder_records) in enumerate(zip(files, records))
    ]
    start_chunk, into_chunk = divmod(start_sequence, DRAW_CHUNK)
    choices = tf.data.Dataset.counter(start_chunk).flat_map(
        lambda chunk: tf.data.Dataset.from_tensor_slices(chunk_draws(chunk))
    )
    mixed = tf.data.Dataset.choose_from_datasets(streams, choices.skip(into_chunk))
    batches = mixed.batch(batch_size, drop_remainder=True).enumerate(start=start_batch)
    mask_seed = folded_seed(base_seed, MASKS)
    mask = functools.partial(
        masked_batch,
        max_length=max_length,
        pieces=pieces,
        mlm_probability=masking.train_probability,
        tables=tables,
    )

    def parse_and_mask(index, serialized):
        return mask(serialized, folded_seed(mask_seed, index))

    dataset = batches.map(parse_and_mask, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


def mixture_draws(seed, weights, chunk):
    """The folder of each of the DRAW_CHUNK sequences of chunk `chunk` of a mixed stream, drawn
    from (`seed`, `chunk`): folder i with probability `weights`[i]."""
    bounds = tf.constant(list(itertools.accumulate(weights))[:-1], dtype=tf.float64)
    uniform = tf.random.stateless_uniform(
        [DRAW_CHUNK], folded_seed(seed, chunk), minval=0, maxval=1, dtype=tf.float64
    )
    return tf.searchsorted(bounds, uniform, side="right", out_type=tf.int64)


def draws_before(seed, weights, sequences):
    """How many of the first `sequences` of a mixed stream (mixture_draws from `seed` by
    `weights`) were drawn from each folder, as a vector of int64."""
    whole, rest = divmod(sequences, DRAW_CHUNK)
    folders = len(weights)

    def counted(draws):
        return tf.math.bincount(draws, minlength=folders, maxlength=folders, dtype=tf.int64)

    counts = tf.data.Dataset.range(whole).map(
        lambda chunk: counted(mixture_draws(seed, weights, chunk)),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    total = counts.reduce(tf.zeros([folders], tf.int64), lambda total, count: total + count)
    return total + counted(mixture_draws(seed, weights, tf.constant(whole, tf.int64))[:rest])


def folder_stream(files, records, seed, start, shuffle_buffer_size):
    """One folder's sequences as a mixture reads them, endless: epoch e reads `files` (holding
    `records` sequences) in an order drawn from (`seed`, e) and shuffles blocks of
    `shuffle_buffer_size` with seeds from (`seed`, e, block), as build_dataset's training does;
    from its `start`-th sequence on (a tensor)."""
    files = tf.constant(files)
    seed_for = functools.partial(folded_seed, seed)
    epochs = tf.data.Dataset.counter(start // records)
    one_epoch = functools.partial(
        epoch_records, files, seed_for, shuffle_buffer_size=shuffle_buffer_size
    )
    return epochs.flat_map(one_epoch).skip(start % records)


def epoch_records(files, seed_for, epoch, shuffle_buffer_size=None):
    """Epoch `epoch` of the serialized records of `files` (a tensor), read by up to 8 files at a
    time: with a `shuffle_buffer_size` (training), the files in an order drawn from
    seed_for(epoch, -1) and blocks of that many records shuffled with seeds from
    seed_for(epoch, block); without (evaluation), in file order."""
    order = files
    if shuffle_buffer_size:
        order = tf.random.experimental.stateless_shuffle(files, seed_for(epoch, -1))
    records = tf.data.Dataset.from_tensor_slices(order).interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(len(files), 8),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if shuffle_buffer_size:
        records = records.batch(shuffle_buffer_size).enumerate()
        records = records.flat_map(
            lambda block, serialized: tf.data.Dataset.from_tensor_slices(
                tf.random.experimental.stateless_shuffle(serialized, seed_for(epoch, block))
            )
        )
    return records


def masked_batch(serialized, seed, *, max_length, pieces, mlm_probability, tables):
    """A batch of serialized records parsed and masked with `seed` (mask_tokens, `tables` its
    token_tables): ({"input_ids", "masked_positions"}, labels), each sequence cut into `pieces` (the
    sequence-length warmup's) before its masks are drawn."""
    # Parsing a whole batch in one op is far cheaper than parsing records one by one.
    features = contract.record_features(max_length)
    input_ids = tf.cast(tf.io.parse_example(serialized, features)[FEATURE_NAME], tf.int32)
    input_ids = tf.reshape(input_ids, [-1, max_length // pieces])  # masks drawn per piece
    masked_ids, positions, labels = mask_tokens(input_ids, seed, mlm_probability, **tables)
    return {FEATURE_NAME: masked_ids, "masked_positions": positions}, labels


def folded_seed(seed, *numbers):
    """`seed` with each of `numbers` folded in: a stateless seed of its own for every draw."""
    for number in numbers:
        seed = tf.random.experimental.stateless_fold_in(seed, number)
    return seed


def token_tables(tokenizer, masking, training):
    """mask_tokens' ids, as tensors: the mask token, the special tokens never chosen, the tokens a
    chosen position may be replaced with, and in training with --whole_word_masking, where words
    start."""
    special = set(tokenizer.all_special_ids)
    word_starts = None
    if training and masking.whole_word_masking:
        word_starts = tf.constant(whole_words.word_start_table(tokenizer))
    return dict(
        mask_token_id=tf.constant(tokenizer.mask_token_id, dtype=tf.int32),
        special_ids=tf.constant(sorted(special), dtype=tf.int32),
        replacement_ids=tf.constant([i for i in range(len(tokenizer)) if i not in special]),
        word_starts=word_starts,
    )


def mask_tokens(
    input_ids, seed, mlm_probability, mask_token_id, special_ids, replacement_ids, word_starts=None
):
    """BERT masking in TF ops, stateless: the same seed gives the same masks. In each sequence,
    round(`mlm_probability` x its non-special tokens) positions are chosen at random (no special
    token, <unk> included); 80% become [MASK], 10% a random token, 10% stay. An exact count, as in
    BERT, means at most `max_predictions()` positions, which the model can score alone. Returns the
    masked ids [batch, length], the positions [batch, predictions] and their labels (-100 in slots
    beyond the count: skipped). With `word_starts`, whole words (whole_words.py)."""
    seeds = tf.random.experimental.stateless_split(seed, 3)
    choose_seed, action_seed, random_seed = tf.unstack(seeds)
    shape = tf.shape(input_ids)
    length = input_ids.shape[-1]
    predictions = max_predictions(length, mlm_probability)
    maskable = ~tf.reduce_any(tf.equal(input_ids[..., None], special_ids), axis=-1)
    candidates = tf.reduce_sum(tf.cast(maskable, tf.float32), axis=-1)
    count = tf.cast(tf.round(mlm_probability * candidates), tf.int32)

    # A random ranking of the maskable positions; the first `count` of each row are chosen.
    noise = tf.random.stateless_uniform(shape, choose_seed)
    if word_starts is None:
        _, ranked = tf.math.top_k(tf.where(maskable, noise, -1.0), k=predictions)
        used = tf.range(predictions)[None, :] < count[:, None]
    else:
        ranked, used = whole_words.ranking(
            input_ids, maskable, noise, count, predictions, word_starts
        )
    positions = tf.where(used, ranked, 0)
    labels = tf.where(used, tf.gather(input_ids, positions, batch_dims=1), -100)
    one_hot = tf.one_hot(positions, length, on_value=True, off_value=False)
    chosen = tf.reduce_any(one_hot & used[..., None], axis=1)

    action = tf.random.stateless_uniform(shape, action_seed)
    to_mask = chosen & (action < 0.8)
    to_random = chosen & (action >= 0.8) & (action < 0.9)
    replacements = tf.size(replacement_ids)
    random_index = tf.random.stateless_uniform(
        shape, random_seed, maxval=replacements, dtype=tf.int32
    )
    random_tokens = tf.gather(replacement_ids, random_index)
    masked_ids = tf.where(to_mask, mask_token_id, tf.where(to_random, random_tokens, input_ids))
    return masked_ids, positions, labels


def max_predictions(max_length, mlm_probability):
    """Predictions a sequence: masking never chooses more, so shapes stay static (XLA, TPUs)."""
    return max(1, math.ceil(max_length * mlm_probability))


@dataclasses.dataclass(frozen=True)
class NamedEvaluation:
    """One of several validation sets (--eval_dataset NAME=PATH ...) as every evaluation scores it:
    its `name`, its batches on every replica (`dataset`: one pass, fixed masks) and how many of
    them each evaluation scores (`batches`)."""

    name: str
    dataset: object
    batches: int


@dataclasses.dataclass(frozen=True)
class EvaluationData:
    """The evaluation split as every evaluation scores it: `dataset`, its batches on every replica
    (one pass, fixed masks); `batches`, how many of them each evaluation scores (--max_eval_samples:
    the first whole ones only); `line`, the sentence that says so, printed as the run starts.
    With several --eval_dataset sets, `dataset` and `batches` are the first set's, the one val_loss
    means, and `sets` holds every set (NamedEvaluation), the first included; () with one."""

    dataset: object
    batches: int
    line: str
    sets: tuple = ()

    @property
    def names(self):
        """The validation sets' names when there are several, in order; () with one."""
        return tuple(evaluation_set.name for evaluation_set in self.sets)


def evaluation_data(
    strategy, plan, manifests, tokenizer, max_length, masking, max_eval_samples, eval_dataset=None
):
    """The run's EvaluationData; None without --eval_dataset (`plan` None). `manifests`: each
    evaluation set's, in order (read_shards' after the train one); `eval_dataset`, the flag's
    folders, which name the sets when there are several."""
    if plan is None:
        return None

    def scored(plan, manifest):
        batches, line = segments.evaluation_batches(
            plan.steps_per_epoch, manifest["records"], plan.global_batch_size, max_eval_samples
        )
        dataset = distributed_dataset(
            strategy,
            plan,
            training=False,
            tokenizer=tokenizer,
            max_length=max_length,
            masking=masking,
        )
        return dataset, batches, line

    dataset, batches, line = scored(plan, manifests[0])
    named = mixture.evaluation_sets(eval_dataset)
    if len(named) < 2:
        return EvaluationData(dataset, batches, line)
    sets, lines = [NamedEvaluation(named[0].name, dataset, batches)], [line]
    for evaluation_set, manifest in zip(named[1:], manifests[1:], strict=True):
        flag = f"--eval_dataset ({evaluation_set.name})"  # its own plan: batches of the same size
        set_plan = hosts.InputPlan(strategy, manifest, flag, plan.per_replica_batch_size)
        set_dataset, set_batches, set_line = scored(set_plan, manifest)
        sets.append(NamedEvaluation(evaluation_set.name, set_dataset, set_batches))
        lines.append(set_line)
    line = f"Each evaluation scores {len(sets)} validation sets, val_loss the first's:" + "".join(
        f"\n  {one.name}: {text[0].lower()}{text[1:]}" for one, text in zip(sets, lines)
    )
    return EvaluationData(dataset, batches, line, tuple(sets))
