"""run_mlm.py on several hosts: which process writes, which shard files each host reads, and when
all wait.

A TPU pod slice runs one input pipeline per host; a GPU cluster under MultiWorkerMirroredStrategy
runs one process per machine, each told its place by TF_CONFIG. Every host reads whole shard files
of its own, so no two read the same sequence and none need coordinate; one process alone (the chief)
writes the output.
"""

import json
import os

from .errors import UsageError

TF_CONFIG_EXAMPLE = '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}'


def multi_worker_resolver():
    """The cluster from TF_CONFIG, checked: a worker that guesses its place would wait forever for the others."""
    import tensorflow as tf

    text = os.environ.get("TF_CONFIG")
    if not text:
        raise UsageError(
            "--multi_worker needs TF_CONFIG on every machine, e.g. "
            f"TF_CONFIG='{TF_CONFIG_EXAMPLE}'."
        )
    try:
        config = json.loads(text)
        task_type, task_index = config["task"]["type"], int(config["task"]["index"])
        addresses = config["cluster"][task_type]
        if not 0 <= task_index < len(addresses):
            raise IndexError(f"task index {task_index} with {len(addresses)} {task_type} addresses")
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise UsageError(
            f"TF_CONFIG {text!r} does not say which task of which cluster this is "
            f"({type(error).__name__}: {error}); set it like '{TF_CONFIG_EXAMPLE}'."
        ) from None
    return tf.distribute.cluster_resolver.TFConfigClusterResolver()


def is_chief(strategy):
    """Whether this process writes: the chief of a cluster (worker 0 when there is no chief), or the
    only process there is. The other workers train in lockstep and keep their hands off the output.
    """
    return strategy.extended.should_checkpoint


def input_pipeline_count(strategy):
    """How many input pipelines read the data: one per host (a TPU pod slice's hosts, a cluster's workers)."""
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.TPUStrategy):
        return strategy.extended.num_hosts
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        spec = strategy.cluster_resolver.cluster_spec().as_dict()
        return sum(len(spec.get(task_type, [])) for task_type in ("chief", "worker"))
    return 1


def split_between_pipelines(manifest, flag, pipelines, per_pipeline_batch):
    """Each input pipeline's own shard files (every pipelines-th one), and the steps of one epoch.

    Every pipeline reads whole files, so the hosts never read the same sequence and need not
    coordinate. They must take the same number of steps, so an epoch lasts as long as the pipeline
    with the fewest sequences has whole batches; the others leave their surplus for that epoch (a
    different surplus each epoch, as their files are reshuffled). Shards of equal size, as
    prepare_tfrecord_shards.py writes them (all but the last), keep that surplus small.
    """
    files, records = manifest["files"], [shard["records"] for shard in manifest["shards"]]
    if len(files) < pipelines:
        raise UsageError(
            f"{flag} has {len(files)} shard file(s), but {pipelines} hosts read the data and each "
            "needs at least one of its own; rerun prepare_tfrecord_shards.py with a smaller "
            f"--shard_size to write at least {pipelines} shards (a multiple of {pipelines} spreads "
            "them evenly)."
        )
    pipeline_files = [files[index::pipelines] for index in range(pipelines)]
    steps = min(sum(records[index::pipelines]) // per_pipeline_batch for index in range(pipelines))
    return pipeline_files, steps


def wait_for_every_worker(strategy):
    """A barrier: an all-reduce that returns once every worker of the cluster has reached it."""
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        tf.function(strategy.run)(
            lambda: tf.distribute.get_replica_context().all_reduce("sum", tf.constant(1.0))
        )


def logical_cpus(count):
    """The CPU split into `count` logical devices (run_mlm.py's --cpu_replicas); their names."""
    import tensorflow as tf

    try:
        replicas = [tf.config.LogicalDeviceConfiguration()] * count
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0], replicas
        )
    except RuntimeError:
        raise UsageError(
            f"--cpu_replicas {count} must take effect before TensorFlow starts; call run_mlm.py in "
            "a fresh process."
        ) from None
    return [device.name for device in tf.config.list_logical_devices("CPU")]


def distribute(strategy, pipeline_dataset, train_manifest, eval_manifest, per_replica_batch_size):
    """The datasets of every host: each input pipeline reads shard files of its own and batches for
    the replicas of its host, through `strategy.distribute_datasets_from_function`.

    `pipeline_dataset(files=, batch_size=, training=, batches_per_epoch=, pipeline=, start_epoch=,
    start_batch=)` builds one pipeline's dataset (run_mlm.py's build_dataset). Returns the steps of
    an epoch, `train_dataset_from(step, **options)` (the training stream from that optimizer step
    on; `options` go to `pipeline_dataset` unchanged), the evaluation dataset and its steps (None
    and 0 without evaluation shards).
    """
    replicas = strategy.num_replicas_in_sync
    global_batch_size = per_replica_batch_size * replicas
    pipelines = input_pipeline_count(strategy)
    plans = {}
    splits = (
        ("train", "--train_dataset", train_manifest),
        ("eval", "--eval_dataset", eval_manifest),
    )
    for split, flag, manifest in splits:
        if manifest is None:
            continue
        plans[split] = split_between_pipelines(
            manifest, flag, pipelines, global_batch_size // pipelines
        )
        if plans[split][1] == 0:
            across = f" split between {pipelines} hosts" if pipelines > 1 else ""
            raise UsageError(
                f"the global batch of {global_batch_size} sequences ({per_replica_batch_size} x "
                f"{replicas} replicas) is larger than the {manifest['records']} {split} "
                f"sequences{across}; lower --per_replica_batch_size or add data."
            )

    def datasets(split, training, start_epoch=0, steps_into_epoch=0, **options):
        files, steps = plans[split]
        # each pipeline yields one batch per replica of its host per step
        per_pipeline = replicas // pipelines
        return strategy.distribute_datasets_from_function(
            lambda context: pipeline_dataset(
                files=files[context.input_pipeline_id],
                batch_size=context.get_per_replica_batch_size(global_batch_size),
                training=training,
                batches_per_epoch=steps * per_pipeline,
                pipeline=context.input_pipeline_id,
                start_epoch=start_epoch,
                start_batch=steps_into_epoch * per_pipeline,
                **options,
            )
        )

    def train_dataset_from(step, **options):
        return datasets("train", True, *divmod(step, plans["train"][1]), **options)

    evaluation = (datasets("eval", False), plans["eval"][1]) if "eval" in plans else (None, 0)
    return plans["train"][1], train_dataset_from, *evaluation
