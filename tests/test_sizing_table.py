"""README's "Sizing a run" table, computed through the code: each row's replicas, per-replica batch
and accumulation give, through run_mlm.py's flags and the input plan it trains from, the global
batch the row states. The table is read from README.md, so neither can drift from the other."""

import re
from dataclasses import dataclass

import pytest
from helpers import REPO

import run_mlm
from mlm_pipeline import hosts, preflight

HEADING = "### Sizing a run"


def sizing_rows():
    """The table under README's HEADING, as {column: cell} a row."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert HEADING in readme, f"README.md has no section {HEADING!r}"
    section = readme.split(HEADING, 1)[1].split("\n#", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip().strip("`") for cell in lines[0].strip("|").split("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert rows, "the sizing table has no rows"
    return [dict(zip(header, row)) for row in rows]


@dataclass
class StandInStrategy:
    """What an InputPlan reads of a strategy: its replicas (one input pipeline, as on one VM)."""

    num_replicas_in_sync: int


def manifest(records):
    return {"files": ["train-00000.tfrecord"], "shards": [{"records": records}], "records": records}


def train_plan(replicas, per_replica_batch_size, accumulation_steps):
    """The training split's InputPlan as run_mlm.py's main() makes it, from the row's flags read by
    its command line."""
    settings = run_mlm.parse_args(
        [
            "--train_dataset=shards/train",
            "--tokenizer=tokenizer",
            "--output_dir=model",
            f"--per_replica_batch_size={per_replica_batch_size}",
            f"--gradient_accumulation_steps={accumulation_steps}",
        ]
    )
    speed = settings.speed
    plan, _ = hosts.input_plans(
        StandInStrategy(replicas),
        [manifest(10**6), None],
        speed.per_replica_batch_size,
        speed.gradient_accumulation_steps,
    )
    return plan


@pytest.mark.parametrize("row", sizing_rows(), ids=lambda row: row["machine"])
def test_every_row_of_the_sizing_table_trains_the_global_batch_it_states(row):
    import tensorflow as tf

    replicas = int(re.match(r"\d+", row["replicas"]).group())
    per_replica = int(row["--per_replica_batch_size"])
    accumulation = int(row["--gradient_accumulation_steps"])
    plan = train_plan(replicas, per_replica, accumulation)
    assert plan.global_batch_size == int(row["global batch"].replace(",", ""))
    # what each replica's input pipeline batches: its accumulated batches, read as one
    context = tf.distribute.InputContext(1, 0, replicas)
    assert plan.pipeline_input(context).batch_size == per_replica * accumulation
    assert plan.steps_per_epoch == 10**6 // plan.global_batch_size

    # "If a batch does not fit, halve it and double the accumulation": the same global batch, as
    # the preflight's advice says
    advice = preflight.lower_the_batch(per_replica, 512, "--max_length", accumulation)
    halved, doubled = re.search(
        r"halve --per_replica_batch_size to (\d+) and double --gradient_accumulation_steps to "
        r"(\d+): the same global batch",
        advice,
    ).groups()
    assert (int(halved), int(doubled)) == (per_replica // 2, accumulation * 2)
    same = train_plan(replicas, int(halved), int(doubled))
    assert same.global_batch_size == plan.global_batch_size


def test_the_evaluation_keeps_batches_of_the_per_replica_batch_size():
    """Only training accumulates: the evaluation scores one batch a replica at a time."""
    train, evaluation = hosts.input_plans(
        StandInStrategy(4), [manifest(1000), manifest(100)], 8, accumulation_steps=2
    )
    assert (train.global_batch_size, train.steps_per_epoch) == (64, 15)
    assert (evaluation.global_batch_size, evaluation.steps_per_epoch) == (32, 3)


def test_a_global_batch_larger_than_the_data_names_the_accumulation():
    from mlm_pipeline.errors import UsageError

    with pytest.raises(UsageError) as refusal:
        hosts.InputPlan(StandInStrategy(4), manifest(100), "--train_dataset", 8, 4)
    assert str(refusal.value) == (
        "the global batch of 128 sequences (8 x 4 replicas x 4 accumulated) is larger than the "
        "100 train sequences of --train_dataset; lower --per_replica_batch_size or "
        "--gradient_accumulation_steps or add data."
    )


def test_each_host_reads_its_replicas_accumulated_batches(monkeypatch):
    """On two hosts of four replicas each, 2 batches of 4 accumulated: each host's pipeline batches
    8 sequences a replica, and an epoch lasts as long as its files give whole global batches."""
    import tensorflow as tf

    monkeypatch.setattr(hosts, "input_pipeline_count", lambda strategy: 2)
    two_files = {
        "files": ["train-00000.tfrecord", "train-00001.tfrecord"],
        "shards": [{"records": 1000}, {"records": 1000}],
        "records": 2000,
    }
    plan = hosts.InputPlan(StandInStrategy(8), two_files, "--train_dataset", 4, 2)
    assert plan.global_batch_size == 64 and plan.steps_per_epoch == 1000 // 32
    second_host = plan.pipeline_input(tf.distribute.InputContext(2, 1, 8), start_step=5)
    assert second_host.files == ["train-00001.tfrecord"] and second_host.batch_size == 8
    assert (second_host.batches_per_epoch, second_host.start_batch) == (31 * 4, 5 * 4)
