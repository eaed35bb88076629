"""A mixture of training folders (--train_dataset A B, drawn by --train_weights or
--mixture_alpha): the weights' arithmetic, the folders checked against each other, the stream drawn
statelessly (a resumed run rebuilds it, the draws follow the weights, each folder repeats on its
own), one folder's batches as they always were, several hosts, Beam's shards, and what the run
says: shares and passes printed, carded and recorded."""

import dataclasses
import json
import types

import numpy as np
import pytest
from helpers import (
    MAX_LENGTH,
    TINY_MODEL,
    flags,
    kill_when,
    prepare_flags,
    run_command,
    start_script,
)
from refusals import refused, script_in_process
from test_masking import dataset_options
from test_resume import NO_DROPOUT, latest_checkpoint_step, load_weights

import run_mlm
from mlm_pipeline import contract, mixture
from mlm_pipeline.errors import UsageError

BATCH_SIZE = 8


# --------------------------------------------------------------------------------------------------
# The front: weights and passes, no TensorFlow.


def test_weights_are_normalised_and_alpha_flattens_the_sizes():
    assert mixture.mixture_weights([100, 300], weights=[7, 3]) == pytest.approx((0.7, 0.3))
    assert mixture.mixture_weights([100, 300], weights=[0.2, 0.2]) == pytest.approx((0.5, 0.5))
    # alpha 1: by size, as if the folders were one; 0: all alike; 0.5: by the square root
    assert mixture.mixture_weights([100, 300]) == pytest.approx((0.25, 0.75))
    assert mixture.mixture_weights([100, 300], alpha=0.0) == pytest.approx((0.5, 0.5))
    assert mixture.mixture_weights([100, 400], alpha=0.5) == pytest.approx((1 / 3, 2 / 3))
    # the weights win over alpha when both are given
    assert mixture.mixture_weights([100, 300], [1, 1], alpha=0.3) == pytest.approx((0.5, 0.5))


def test_shares_and_passes_follow_the_weights_and_a_repeated_source_is_named():
    weights = mixture.mixture_weights([1000, 50], weights=[0.9, 0.1])
    assert mixture.expected_sequences(weights, 4000) == pytest.approx((3600, 400))
    assert mixture.passes(weights, [1000, 50], 4000) == pytest.approx((3.6, 8.0))
    manifests = ({"records": 1000}, {"records": 50})
    lines = mixture.mixture_lines(mixture.Mixture(("big", "small"), manifests, weights), 500, 8)
    assert "4,000 sequences (500 steps x 8)" in lines[0]
    assert lines[1] == "  big: 90.0% of the sequences, about 3,600 = 3.60 passes over its 1,000"
    assert lines[2] == "  small: 10.0% of the sequences, about 400 = 8.00 passes over its 50"
    assert mixture.passes_text(0.004321) == "0.0043"  # a short run over a large folder
    # only the folder gone through more than REPEATED_PASSES times
    assert len(lines) == 4 and lines[3].startswith("small is repeated 8.0 times, more than 4")


def test_a_weight_for_each_folder_or_one_line(tmp_path):
    folders = ("a", "b", "c")
    with pytest.raises(UsageError, match=r"^--train_weights 0.7 0.3 gives 2 weight\(s\) for 3 "):
        mixture.check_mixture_flags(folders, (0.7, 0.3), 1.0)
    argv = ["--train_dataset", "a", "b", "--train_weights", "1", "2", "3", "--tokenizer", "t"]
    result = script_in_process("run_mlm.py", *argv, "--output_dir", tmp_path / "out")
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "gives 3 weight(s) for 2 --train_dataset folder(s)" in result.stderr


# --------------------------------------------------------------------------------------------------
# Folders to mix: the session's train shards, a smaller one of other text, and two that do not fit.


@pytest.fixture(scope="module")
def small_shards(corpus, tokenizer_dir, tmp_path_factory):
    """A second folder of train shards, of the validation text: fewer sequences, three files."""
    import prepare_tfrecord_shards as prepare

    output_dir = tmp_path_factory.mktemp("small_shards")
    corpus = {"train": corpus["validation"]}
    argv = prepare_flags(corpus, tokenizer_dir, "train", output_dir, shard_size=30)
    prepare.main(prepare.parse_args(argv))
    return output_dir / "train"


def prepared(corpus, tokenizer_dir, output_dir, **named):
    import prepare_tfrecord_shards as prepare

    argv = prepare_flags({"train": corpus["validation"]}, tokenizer_dir, "train", output_dir)
    prepare.main(prepare.parse_args([*argv, *flags(**named)]))
    return output_dir / "train"


def mixture_flags(folders, tokenizer_dir, output_dir, *extra, **named):
    return [
        "--no_tpu",
        "--train_dataset",
        *map(str, folders),
        *flags(tokenizer=tokenizer_dir, output_dir=output_dir, config_overrides=TINY_MODEL),
        *flags(**named),
        *map(str, extra),
    ]


def test_a_folder_of_another_length_or_tokenizer_is_refused_in_one_line(
    corpus, shards_dir, tokenizer_dir, tmp_path
):
    import train_unigram

    train = shards_dir / "train"
    shorter = prepared(corpus, tokenizer_dir, tmp_path / "short", max_length=MAX_LENGTH // 2)
    output_dir = tmp_path / "out"
    args = mixture_flags([train, shorter], tokenizer_dir, output_dir, max_steps=1)
    refused(script_in_process, "run_mlm.py", args, output_dir, shorter, MAX_LENGTH // 2, MAX_LENGTH)

    other_tokenizer = tmp_path / "other_tokenizer"  # as large, trained on other text
    argv = flags(train_file=corpus["validation"], vocab_size=400, output_dir=other_tokenizer)
    train_unigram.main(train_unigram.parse_args(argv))
    other = prepared(corpus, other_tokenizer, tmp_path / "other")
    manifests = [
        json.loads((folder / contract.MANIFEST_NAME).read_text()) for folder in (train, other)
    ]
    assert manifests[0]["vocabulary"] != manifests[1]["vocabulary"]
    args = mixture_flags([train, other], tokenizer_dir, output_dir, max_steps=1)
    line = refused(script_in_process, "run_mlm.py", args, output_dir, other, train)
    for manifest in manifests:
        assert manifest["vocabulary"] in line and repr(manifest["tokenizer"]) in line


# --------------------------------------------------------------------------------------------------
# The stream.


def restored(dataset, batches):
    """The sequences of a training stream's first `batches` batches, the masked positions given
    back their labels, as rows of MAX_LENGTH ids (pieces joined again)."""
    rows = []
    for features, labels in dataset.take(batches):
        ids, labels = features["input_ids"].numpy(), labels.numpy()
        positions = features["masked_positions"].numpy()
        for row in range(len(ids)):
            scored = labels[row] != -100
            ids[row, positions[row][scored]] = labels[row][scored]
        rows.append(ids.reshape(-1, MAX_LENGTH))
    return [tuple(row) for row in np.concatenate(rows).tolist()]


def batches_of(dataset, batches):
    return [
        (features["input_ids"].numpy(), features["masked_positions"].numpy(), labels.numpy())
        for features, labels in dataset.take(batches)
    ]


@pytest.fixture(scope="module")
def two_folders(shards_dir, small_shards, read_manifest, read_records):
    """The train shards and the small ones: each folder's files, sequences and their count."""
    folders = []
    for folder in (shards_dir / "train", small_shards):
        files = [str(folder / shard["file"]) for shard in read_manifest(folder)["shards"]]
        sequences = [tuple(row) for row in read_records(files)]
        shards = read_manifest(folder)["shards"]
        folders.append(
            {"files": files, "sequences": sequences, "records": len(sequences), "shards": shards}
        )
    return folders


def mixed_stream(folders, weights, tokenizer, start_batch=0, **named):
    from mlm_pipeline import masked_lm_data

    return masked_lm_data.build_mixture_dataset(
        [folder["files"] for folder in folders],
        [folder["records"] for folder in folders],
        weights,
        BATCH_SIZE,
        training=True,
        start_batch=start_batch,
        **dataset_options(tokenizer, shuffle_buffer_size=64),
        **named,
    )


# past the first DRAW_CHUNK sequences, and many passes over both folders
RESUMED_AT = 530


@pytest.mark.parametrize("pieces", [1, 4])
def test_the_stream_from_a_step_is_the_tail_of_the_stream_from_the_start(
    two_folders, tokenizer, pieces
):
    from mlm_pipeline import masked_lm_data

    assert RESUMED_AT * BATCH_SIZE > masked_lm_data.DRAW_CHUNK
    weights = (0.6, 0.4)
    whole = batches_of(mixed_stream(two_folders, weights, tokenizer, pieces=pieces), 540)
    resumed = mixed_stream(two_folders, weights, tokenizer, RESUMED_AT, pieces=pieces)
    tail = batches_of(resumed, 540 - RESUMED_AT)
    for expected, found in zip(whole[RESUMED_AT:], tail, strict=True):
        for expected_array, found_array in zip(expected, found):
            np.testing.assert_array_equal(found_array, expected_array)
    assert pieces == 1 or whole[0][0].shape == (BATCH_SIZE * pieces, MAX_LENGTH // pieces)


def test_the_draws_follow_the_weights_and_each_folder_repeats_on_its_own(two_folders, tokenizer):
    from mlm_pipeline import masked_lm_data

    weights = (0.8, 0.2)
    batches = 500
    sequences = restored(mixed_stream(two_folders, weights, tokenizer), batches)
    big, small = (set(folder["sequences"]) for folder in two_folders)
    assert big.isdisjoint(small)
    drawn_small = [sequence for sequence in sequences if sequence in small]
    assert len(drawn_small) + sum(sequence in big for sequence in sequences) == len(sequences)
    # the stream's folders are the draws masked_lm_data counts for a resumed run
    stream_seed = [dataset_options(tokenizer)["masking"].seed, masked_lm_data.MIXTURE_STREAM]
    seed = masked_lm_data.folded_seed(tf_constant(stream_seed), masked_lm_data.DRAWS)
    counts = masked_lm_data.draws_before(seed, weights, batches * BATCH_SIZE).numpy()
    assert counts.tolist() == [len(sequences) - len(drawn_small), len(drawn_small)]
    assert abs(len(drawn_small) / len(sequences) - 0.2) < 0.03  # 4,000 draws: 5 sigma
    # Each pass over the small folder yields each of its sequences once, whatever the other does.
    records = two_folders[1]["records"]
    passes = len(drawn_small) // records
    assert passes >= 5
    for number in range(passes):
        one_pass = drawn_small[number * records : (number + 1) * records]
        assert sorted(one_pass) == sorted(two_folders[1]["sequences"])
    # Over many sequences, three folders drawn by --mixture_alpha's weights.
    weights = mixture.mixture_weights([900, 90, 9], alpha=0.5)
    counts = masked_lm_data.draws_before(seed, weights, 200_000).numpy()
    np.testing.assert_allclose(counts / 200_000, weights, atol=0.005)
    assert counts.sum() == 200_000


def tf_constant(values):
    import tensorflow as tf

    return tf.constant(values, dtype=tf.int64)


def test_one_folder_trains_the_batches_it_always_did(
    shards_dir, tokenizer_dir, tokenizer, tmp_path
):
    """One --train_dataset folder is no mixture: its batches are build_dataset's, as before
    mixtures (tests/test_masking.py and test_multi_worker.py pin those)."""
    import tensorflow as tf

    from mlm_pipeline import hosts, masked_lm_data, shard_checks

    settings = run_mlm.parse_args(
        mixture_flags([shards_dir / "train"], tokenizer_dir, tmp_path, shuffle_buffer_size=64)
    )
    named = masked_lm_data.load_tokenizer(settings.data, settings.model, None)
    manifests = shard_checks.read_training_manifests(str(shards_dir / "train"), None, named)
    assert masked_lm_data.read_mixture(settings.data, manifests[0], named) is None
    strategy = tf.distribute.get_strategy()
    plan, _ = hosts.input_plans(strategy, manifests, BATCH_SIZE, 1, None)
    assert isinstance(plan, hosts.InputPlan) and plan.mixture is None
    stream = masked_lm_data.training_stream(strategy, plan, tokenizer, MAX_LENGTH, settings.masking)
    host = plan.pipeline_input(tf.distribute.InputContext(), 3)
    expected = masked_lm_data.build_dataset(
        **dataclasses.asdict(host),
        training=True,
        tokenizer=tokenizer,
        max_length=MAX_LENGTH,
        masking=settings.masking,
    )
    for found, wanted in zip(batches_of(stream(3), 5), batches_of(expected, 5), strict=True):
        for found_array, wanted_array in zip(found, wanted):
            np.testing.assert_array_equal(found_array, wanted_array)


def test_each_host_reads_files_of_its_own_of_every_folder(
    two_folders, tokenizer, read_records, monkeypatch
):
    """Two hosts, one replica each (hosts.MixturePlan as on a TPU pod or a GPU cluster): each
    pipeline reads every other shard file of each folder, and draws its own stream from them."""
    import tensorflow as tf

    from mlm_pipeline import hosts

    monkeypatch.setattr(hosts, "input_pipeline_count", lambda strategy: 2)
    keys = ("files", "records", "shards")
    manifests = tuple({key: folder[key] for key in keys} for folder in two_folders)
    weights = (0.5, 0.5)
    of_both = mixture.Mixture(("big", "small"), manifests, weights)
    plan = hosts.MixturePlan(types.SimpleNamespace(num_replicas_in_sync=2), of_both, BATCH_SIZE)
    assert plan.global_batch_size == 2 * BATCH_SIZE
    assert plan.steps_per_epoch == sum(f["records"] for f in two_folders) // (2 * BATCH_SIZE)
    hosts_input = [
        plan.pipeline_input(tf.distribute.InputContext(2, pipeline, 2), start_step=7)
        for pipeline in (0, 1)
    ]
    streams = []
    for pipeline, host in enumerate(hosts_input):
        assert host.batch_size == BATCH_SIZE and host.start_batch == 7
        assert host.pipeline == pipeline and host.weights == weights
        for number, folder in enumerate(two_folders):
            assert host.files[number] == folder["files"][pipeline::2]
        streams.append(set(restored(mixed_stream_of(host, tokenizer), 100)))
    for number, folder in enumerate(two_folders):
        own = [set(map(tuple, read_records(host.files[number]))) for host in hosts_input]
        assert own[0].isdisjoint(own[1])
        for stream, sequences in zip(streams, own):
            assert stream & set(folder["sequences"]) <= sequences
            assert stream & sequences  # every folder drawn from on each host


def mixed_stream_of(host, tokenizer):
    from mlm_pipeline import masked_lm_data

    return masked_lm_data.build_mixture_dataset(
        **dataclasses.asdict(host),
        training=True,
        **dataset_options(tokenizer, shuffle_buffer_size=64),
    )


# --------------------------------------------------------------------------------------------------
# Whole runs: what a mixture's run says and records; resumed exactly after a kill.


@pytest.fixture(scope="module")
def beam_shards(corpus, tokenizer_dir, tmp_path_factory):
    """Train shards of the validation text written by Beam (prepare_tfrecord_shards.py --runner
    DirectRunner, as tests/test_prepare_beam.py runs it)."""
    output_dir = tmp_path_factory.mktemp("beam_shards")
    return prepared(
        corpus, tokenizer_dir, output_dir, runner="DirectRunner", shard_size=40, rows_per_block=30
    )


def test_a_mixture_with_beam_shards_says_each_share_and_resumes_only_as_itself(
    shards_dir, beam_shards, tokenizer_dir, read_manifest, tmp_path, capsys
):
    train = shards_dir / "train"
    output_dir = tmp_path / "mixed"
    steps = 12
    args = mixture_flags(
        [train, beam_shards],
        tokenizer_dir,
        output_dir,
        "--train_weights",
        0.25,
        0.75,
        eval_dataset=shards_dir / "validation",
        per_replica_batch_size=BATCH_SIZE,
        max_steps=steps,
        eval_steps=6,
        no_pytorch_export=True,
    )
    run_mlm.main(run_mlm.parse_args(args))
    out = capsys.readouterr().out
    records = [read_manifest(folder)["records"] for folder in (train, beam_shards)]
    total = steps * BATCH_SIZE
    epoch = sum(records) // BATCH_SIZE
    together = "as many sequences as the 2 --train_dataset folders hold together"
    assert f"An epoch ({together}) is {epoch} steps" in out
    for folder, weight, held in zip((train, beam_shards), (0.25, 0.75), records):
        passes = weight * total / held
        assert (
            f"  {folder}: {weight:.1%} of the sequences, about {weight * total:,.0f} = "
            f"{passes:.2f} passes over its {held:,}"
        ) in out
    card = (output_dir / contract.MODEL_CARD_NAME).read_text()
    assert (
        "| split | shards | source | sequences | tokens | share of the sequences | passes over it |"
        in card
    )
    for weight, held in zip((0.25, 0.75), records):
        assert (
            f"| {held:,} | {held * MAX_LENGTH:,} | {weight:.1%} | {weight * total / held:.2f} |"
            in card
        )
    assert "An epoch of the mixture is as many sequences as its folders hold together." in card
    recorded = json.loads(
        (output_dir / contract.CHECKPOINT_DIR / contract.RUN_SETTINGS_NAME).read_text()
    )
    assert recorded["train_mixture"] == [
        {"folder": str(train), "records": records[0], "weight": 0.25},
        {"folder": str(beam_shards), "records": records[1], "weight": 0.75},
    ]
    # Resuming under other weights (or folders) would continue another run: refused. The model
    # folder is finished, so --overwrite_output_dir lets the check of its checkpoints speak.
    (output_dir / "config.json").unlink()
    other = [*args, "--train_weights", 0.5, 0.5]
    refused(script_in_process, "run_mlm.py", other, output_dir, "train_mixture differ")


def test_a_killed_mixture_resumes_and_ends_where_an_uninterrupted_one_ends(
    shards_dir, small_shards, tokenizer_dir, tmp_path
):
    """On two CPU replicas, accumulating two batches a step, the first steps on pieces: a
    mixture killed at its first checkpoint and run again ends on the same weights (to the
    rounding of the replicas' sums, as tests/test_resume.py allows)."""
    interrupted, uninterrupted = tmp_path / "interrupted", tmp_path / "uninterrupted"

    def args(output_dir):
        return mixture_flags(
            [shards_dir / "train", small_shards],
            tokenizer_dir,
            output_dir,
            "--config_overrides",
            TINY_MODEL + NO_DROPOUT,
            mixture_alpha=0.5,
            cpu_replicas=2,
            gradient_accumulation_steps=2,
            per_replica_batch_size=4,
            short_sequence_length=MAX_LENGTH // 4,
            short_sequence_ratio=0.25,
            shuffle_buffer_size=64,
            max_steps=16,
            save_steps=5,
            no_pytorch_export=True,
            seed=0,
        )

    process = start_script("run_mlm.py", *args(interrupted))
    kill_when(process, lambda: latest_checkpoint_step(interrupted) is not None, "checkpoint")
    saved_step = latest_checkpoint_step(interrupted)
    assert 0 < saved_step < 16  # the sequence-length warmup's end (step 4) or a --save_steps
    rerun = run_command("run_mlm.py", *args(interrupted))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"ckpt-{saved_step} at step {saved_step} of 16." in rerun.stdout, rerun.stdout
    straight = run_command("run_mlm.py", *args(uninterrupted))
    assert straight.returncode == 0, straight.stderr[-3000:]
    for resumed, whole in zip(load_weights(interrupted), load_weights(uninterrupted), strict=True):
        np.testing.assert_allclose(resumed, whole, rtol=1e-4, atol=1e-6)
