"""The training scripts on their hardware and on several hosts: the strategy (tpu_runtime.py
gets the process ready for the TPU, tpu_strategy() here starts it), which process writes, which
shard files each host reads, and when all wait.

Part of the engine: TensorFlow is imported at the top, so the scripts import this module only after
tpu_runtime.prepare_runtime() (hardware.py holds the settings it is built from).

TPUStrategy runs one input pipeline per host; a GPU cluster under MultiWorkerMirroredStrategy
runs one process per machine, each told its place by TF_CONFIG. Every host reads whole shard files
of its own, so no two read the same sequence and none need coordinate; one process alone (the chief)
writes the output.
"""

import dataclasses
import json
import os

import tensorflow as tf

from .errors import UsageError
from .hardware import asks_for_tpu
from .tf_startup import tensorflow_startup_log_held_back
from .tpu_runtime import FULL_LOG_ADVICE, NO_TPU_ADVICE, tensorflow_reason

TF_CONFIG_EXAMPLE = (
    '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
    '"task": {"type": "worker", "index": 0}}'
)


def multi_worker_resolver():
    """The cluster from TF_CONFIG, checked: a worker that guesses its place would wait forever for
    the others."""
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


def build_strategy(hardware):
    """The strategy of both training scripts, from their Hardware group: TPUStrategy unless
    --no_tpu (or run_mlm.py's --multi_worker); without a TPU, mirrored over a cluster, the GPUs or
    split CPUs, or the default strategy on one CPU (strategy_without_tpu). run_classifier.py's
    group has no cluster and no CPU split: its multi_worker is False, its cpu_replicas 1. TF's
    start-up log is shown only if this fails. On a TPU, tpu_strategy (tpu_runtime.prepare_runtime
    has made the process ready for it)."""
    if asks_for_tpu(hardware):
        return tpu_strategy(hardware)
    with tensorflow_startup_log_held_back():
        return strategy_without_tpu(hardware.multi_worker, hardware.cpu_replicas)


def tpu_strategy(hardware):
    """A TPUStrategy over the TPU VM's chips, or a pod slice's, by the route of TensorFlow's guide
    "Use TPUs" and Google's Cloud TPU TensorFlow pages: the resolver ('local': the TPU attached to
    this VM; a slice's name: its hosts, looked up in the Cloud TPU API in --tpu_zone and
    --gcp_project, this VM's when not given), connected to (nothing to do for 'local'), the TPU
    system initialized, the strategy. A TPU that does not start is one line with TensorFlow's own
    reason, from its held-back log if its error says too little."""
    with tensorflow_startup_log_held_back() as log:
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
                tpu=hardware.tpu_name, zone=hardware.tpu_zone, project=hardware.gcp_project
            )
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            return tf.distribute.TPUStrategy(resolver)
        except (ValueError, RuntimeError, tf.errors.OpError) as error:
            raise UsageError(
                f"the TPU did not start ({tensorflow_reason(error, log)}); "
                f"{log.named(FULL_LOG_ADVICE)}, or {NO_TPU_ADVICE}."
            ) from None


def strategy_without_tpu(multi_worker=False, cpu_replicas=1):
    """MultiWorkerMirroredStrategy over a cluster of machines (each told its place by TF_CONFIG),
    MirroredStrategy over every visible GPU (narrow with CUDA_VISIBLE_DEVICES) or over
    `cpu_replicas` logical CPUs (to rehearse a TPU's replicas), else the default strategy."""
    if multi_worker:
        return tf.distribute.MultiWorkerMirroredStrategy(multi_worker_resolver())
    if tf.config.list_physical_devices("GPU"):
        return tf.distribute.MirroredStrategy()
    if cpu_replicas > 1:
        return tf.distribute.MirroredStrategy(logical_cpus(cpu_replicas))
    return tf.distribute.get_strategy()


def is_chief(strategy):
    """Whether this process writes: the chief of a cluster (worker 0 when there is no chief), or the
    only process there is. The other workers train in lockstep and keep their hands off the output.
    """
    return strategy.extended.should_checkpoint


def input_pipeline_count(strategy):
    """How many input pipelines read the data: one per host (TPUStrategy's hosts, one on a TPU VM;
    a cluster's workers)."""
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
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        tf.function(strategy.run)(
            lambda: tf.distribute.get_replica_context().all_reduce("sum", tf.constant(1.0))
        )


def logical_cpus(count):
    """The CPU split into `count` logical devices (run_mlm.py's --cpu_replicas); their names."""
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


@dataclasses.dataclass(frozen=True)
class PipelineInput:
    """What one host's input pipeline reads, and from where: its own shard `files`, batched
    `batch_size` sequences at a time (one batch per replica of its host each step), at most
    `batches_per_epoch` batches an epoch (every host takes the same steps), its number `pipeline`
    (for random draws of its own), and where in the stream to start (`start_epoch`, the batches
    `start_batch` into it)."""

    files: list
    batch_size: int
    batches_per_epoch: int
    pipeline: int
    start_epoch: int
    start_batch: int


def global_batch_size(replicas, per_replica_batch_size, accumulation_steps=1):
    """The sequences of one optimizer step: every replica's `per_replica_batch_size`, times the
    `accumulation_steps` batches it accumulates (run_mlm.py's --gradient_accumulation_steps), as
    transformers' Trainer counts its total train batch size (trainer.py's
    `get_total_train_batch_size`: per-device batch x accumulation steps x data-parallel replicas).
    The one place the global batch is computed: the input plan, the log, the model card, the
    preflight and run_settings.json read it from the plan."""
    return replicas * per_replica_batch_size * accumulation_steps


class Batching:
    """How a plan batches, set by InputPlan and MixturePlan alike: the strategy's `replicas`, each
    one's `per_replica_batch_size` and the `accumulation_steps` it takes a step, the
    `global_batch_size` of a step (global_batch_size()), and the input `pipelines` (one a host)."""

    def __init__(self, strategy, per_replica_batch_size, accumulation_steps=1):
        self.replicas = strategy.num_replicas_in_sync
        self.per_replica_batch_size = per_replica_batch_size
        self.accumulation_steps = accumulation_steps
        self.global_batch_size = global_batch_size(
            self.replicas, per_replica_batch_size, accumulation_steps
        )
        self.pipelines = input_pipeline_count(strategy)


class InputPlan(Batching):
    """Which shard files each host's input pipeline reads, and how it batches, for one split.

    `steps_per_epoch`: the optimizer steps of one pass. `pipeline_input(context, start_step)`: the
    PipelineInput of the pipeline `strategy.distribute_datasets_from_function` builds for the
    `tf.distribute.InputContext` it hands over, starting at optimizer step `start_step`.
    `accumulation_steps` N (training with --gradient_accumulation_steps): each replica takes N
    batches of `per_replica_batch_size` a step, read as one batch N times larger that the train
    step splits (masked_lm_model.accumulated_gradients); the evaluation's plan keeps N = 1.
    """

    mixture = None  # one folder (MixturePlan: several)
    epoch_meaning = "a pass over the data"  # the schedule line's words for an epoch

    def __init__(self, strategy, manifest, flag, per_replica_batch_size, accumulation_steps=1):
        super().__init__(strategy, per_replica_batch_size, accumulation_steps)
        self.files, self.steps_per_epoch = split_between_pipelines(
            manifest, flag, self.pipelines, self.global_batch_size // self.pipelines
        )
        if self.steps_per_epoch == 0:
            across = f" split between {self.pipelines} hosts" if self.pipelines > 1 else ""
            split = "train" if flag == "--train_dataset" else "eval"
            accumulated = f" x {accumulation_steps} accumulated" if accumulation_steps > 1 else ""
            lower = "--per_replica_batch_size"
            if accumulation_steps > 1:
                lower += " or --gradient_accumulation_steps"
            raise UsageError(
                f"the global batch of {self.global_batch_size} sequences "
                f"({per_replica_batch_size} x {self.replicas} replicas{accumulated}) is larger "
                f"than the {manifest['records']} {split} sequences{across} of {flag}; lower "
                f"{lower} or add data."
            )

    def pipeline_input(self, context, start_step=0):
        # each pipeline yields one batch per replica of its host per step (N accumulated ones in
        # one: get_per_replica_batch_size divides the global batch by the replicas)
        per_pipeline = self.replicas // self.pipelines
        start_epoch, steps_into_epoch = divmod(start_step, self.steps_per_epoch)
        return PipelineInput(
            files=self.files[context.input_pipeline_id],
            batch_size=context.get_per_replica_batch_size(self.global_batch_size),
            batches_per_epoch=self.steps_per_epoch * per_pipeline,
            pipeline=context.input_pipeline_id,
            start_epoch=start_epoch,
            start_batch=steps_into_epoch * per_pipeline,
        )


@dataclasses.dataclass(frozen=True)
class MixtureInput:
    """What one host's input pipeline reads from a mixture of training folders: for each folder,
    its own shard `files` of it and the sequences `records` they hold; `weights`, each folder's
    probability of being drawn; `batch_size` sequences a batch; its number `pipeline` (for random
    draws of its own); and the batches of its stream already trained (`start_batch`)."""

    files: list
    records: list
    weights: tuple
    batch_size: int
    pipeline: int
    start_batch: int


class MixturePlan(Batching):
    """InputPlan's counterpart for a mixture of training folders (mixture.Mixture): each host reads
    shard files of its own of every folder (every pipelines-th one, as InputPlan splits a folder),
    draws each sequence from one folder by the weights, and runs through each folder again, on its
    own, whenever it has read it all; so every host's stream is endless and all take the same
    steps. An epoch of a mixture is as many sequences as its folders hold together:
    `steps_per_epoch` such global batches (when the run evaluates, and what --num_epochs counts).
    The attributes the run reads are InputPlan's."""

    def __init__(self, strategy, mixture, per_replica_batch_size, accumulation_steps=1):
        self.mixture = mixture
        super().__init__(strategy, per_replica_batch_size, accumulation_steps)
        self.epoch_meaning = (
            f"as many sequences as the {len(mixture.folders)} --train_dataset folders hold together"
        )
        self.files, self.records = [], []  # [folder][pipeline]
        for folder, manifest in zip(mixture.folders, mixture.manifests):
            flag = f"--train_dataset {folder.rstrip('/')}"
            files, _ = split_between_pipelines(manifest, flag, self.pipelines, 1)
            shard_records = [shard["records"] for shard in manifest["shards"]]
            self.files.append(files)
            self.records.append(
                [sum(shard_records[index :: self.pipelines]) for index in range(self.pipelines)]
            )
        self.steps_per_epoch = sum(mixture.records) // self.global_batch_size
        if self.steps_per_epoch == 0:
            raise UsageError(
                f"the global batch of {self.global_batch_size} sequences is larger than the "
                f"{sum(mixture.records)} sequences of the --train_dataset folders together; lower "
                "--per_replica_batch_size or add data."
            )

    def pipeline_input(self, context, start_step=0):
        """The MixtureInput of the pipeline `context` (a tf.distribute.InputContext) names, from
        optimizer step `start_step` on: each step, one batch per replica of its host."""
        per_pipeline = self.replicas // self.pipelines
        pipeline = context.input_pipeline_id
        return MixtureInput(
            files=[files[pipeline] for files in self.files],
            records=[records[pipeline] for records in self.records],
            weights=self.mixture.weights,
            batch_size=context.get_per_replica_batch_size(self.global_batch_size),
            pipeline=pipeline,
            start_batch=start_step * per_pipeline,
        )


def input_plans(strategy, manifests, per_replica_batch_size, accumulation_steps=1, mixture=None):
    """The InputPlans of the train and evaluation splits (None without evaluation shards); the
    training accumulates `accumulation_steps` batches a step, the evaluation scores one at a
    time. With a `mixture` (mixture.Mixture) of training folders, its MixturePlan trains."""
    flags = ("--train_dataset", "--eval_dataset")
    plans = [
        InputPlan(strategy, manifest, flag, per_replica_batch_size, accumulation)
        if manifest and not (flag == "--train_dataset" and mixture)
        else None
        for manifest, flag, accumulation in zip(manifests, flags, (accumulation_steps, 1))
    ]
    if mixture:
        plans[0] = MixturePlan(strategy, mixture, per_replica_batch_size, accumulation_steps)
    return plans
