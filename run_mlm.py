#!/usr/bin/env python
"""Step 3 of 3: pretrain a masked language model from scratch on TFRecord shards, on TPU, GPU or CPU.

The shards come from prepare_tfrecord_shards.py and the tokenizer from train_unigram.py. Masking happens
in tf.data with TF ops (dynamic: new masks every epoch for training, fixed masks for evaluation), the model
is a transformers TF masked LM (RoBERTa by default) trained with model.fit, and the result is saved with
its tokenizer so that `pipeline("fill-mask", model=output_dir)` works from the folder alone. A PyTorch copy,
written without torch, goes to output_dir/pytorch, a folder that transformers 5 loads as it is
(`pipeline("fill-mask", model=f"{output_dir}/pytorch")`); --no_pytorch_export skips it.

    # TPU VM (TPUStrategy; data, checkpoints and output may live on GCS)
    python run_mlm.py --train_dataset gs://my-bucket/shards/train --eval_dataset gs://my-bucket/shards/validation \
        --tokenizer tokenizer --output_dir gs://my-bucket/roberta-base-from-scratch \
        --per_replica_batch_size 32 --num_epochs 10 --bfloat16

    # GPU box (mirrored over all visible GPUs) or a laptop CPU (default strategy): add --no_tpu
    python run_mlm.py --no_tpu --train_dataset shards/train --eval_dataset shards/validation \
        --tokenizer tokenizer --output_dir model \
        --config_overrides hidden_size=256,num_hidden_layers=4,num_attention_heads=4,intermediate_size=1024

    # TPU pod slice: once, on the slice's first worker, naming the slice
    python run_mlm.py --tpu_name my-v4-32 --train_dataset gs://my-bucket/shards/train ...

    # GPU cluster (MultiWorkerMirroredStrategy): the same command on every machine, each with its own task
    TF_CONFIG='{"cluster": {"worker": ["10.0.0.1:12345", "10.0.0.2:12345"]}, "task": {"type": "worker", "index": 0}}' \
        python run_mlm.py --multi_worker --train_dataset gs://my-bucket/shards/train ...

Several hosts: each host's input pipeline reads shard files of its own (files p, p+P, ... of P hosts), so a
split needs at least as many shard files as hosts. Worker 0 (or the chief) alone writes.

Preemption: a checkpoint goes to <output_dir>/checkpoints every --save_steps optimizer steps and at every
epoch end. After an interruption, run the same command again: it resumes from the newest checkpoint with
the same optimizer state, schedule position and data stream, and still stops at the requested step.

The LM head runs at the masked positions only (`--mlm_head sparse`, the default): with a small model and an
8k-32k vocabulary the vocabulary projection is most of the arithmetic, and only ~15% of positions carry a
label. The loss is the same as with full logits, and the saved model is a standard transformers masked LM.

Metrics count the masked positions only: `loss` is the masked-LM cross-entropy, `masked_accuracy` is top-1
accuracy over every position with a label, `mask_token_accuracy` over the positions whose input was [MASK]
(the fill-mask task), and `top_token_share` the share of those predictions taken by the most predicted
token (near 1: the model has collapsed onto one answer). Each epoch ends with the same metrics on the
evaluation shards, prefixed `val_`, and `val_perplexity = exp(val_loss)`. They go to TensorBoard
(`tensorboard --logdir <output_dir>/logs`) with the learning rate and tokens per second; the run ends with
<output_dir>/training_curves.png and a one-line summary.
"""

import argparse
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # keep TF's start-up chatter out of the training log

MANIFEST_NAME = "manifest.json"
FEATURE_NAME = "input_ids"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# TF models whose embeddings assume the pad token is id 1 (their padding_idx is hard-coded).
FIXED_PADDING_INDEX_MODELS = ("roberta", "roberta-prelayernorm", "xlm-roberta", "camembert", "longformer", "mpnet")
FINISHED_RUN_MARKER = "config.json"  # save() writes it last: a folder holding it holds a finished model
CHECKPOINT_DIR = "checkpoints"
RUN_SETTINGS_NAME = "run_settings.json"
TRAINING_LOG_NAME = "training_log.csv"
TENSORBOARD_DIR = "logs"  # `tensorboard --logdir <output_dir>/logs`
CURVES_NAME = "training_curves.png"
MANIFEST_KEYS = ("max_length", "records", "vocab_size", "shards")


class UsageError(Exception):
    """A mistake in the user's input: reported as one line, without a traceback."""


@contextmanager
def tensorflow_startup_log_held_back():
    """Hold back the log TensorFlow's C++ libraries print while they load and find devices (oneDNN, CUDA).

    Those lines go straight to the process's stderr whatever TF_CPP_MIN_LOG_LEVEL says, and on a machine
    without a GPU they read like errors. They are kept in a temporary file and shown only if start-up fails
    for a reason other than the user's input; TF_CPP_MIN_LOG_LEVEL=0 shows them always.
    """
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0":
        yield
        return
    sys.stderr.flush()
    stderr_copy = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except UsageError:
            raise
        except BaseException:
            sys.stderr.flush()
            held.seek(0)
            os.write(stderr_copy, held.read())
            raise
        finally:
            sys.stderr.flush()
            os.dup2(stderr_copy, 2)
            os.close(stderr_copy)


def first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def tf_error_text(error):
    """TF's own words from an op error, without the function and op names it wraps them in."""
    text = re.sub(r"\{\{function_node [^}]*\}\}|\[Op:[^\]]*\].*$", "", first_line(error)).strip()
    return text or type(error).__name__


class OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv=None):
    parser = OneLineErrorParser(description="Pretrain a masked language model from scratch on TFRecord shards.")
    data = parser.add_argument_group("data")
    data.add_argument("--train_dataset", required=True, help="Folder of train shards (local or gs://).")
    data.add_argument("--eval_dataset", help="Folder of evaluation shards (local or gs://); optional.")
    data.add_argument("--tokenizer", required=True, help="Tokenizer folder or Hub id (from train_unigram.py).")
    data.add_argument("--max_length", type=int, help="Sequence length; must equal the shards' (default: theirs).")
    data.add_argument("--mlm_probability", type=float, default=0.15, help="Share of tokens masked (default: 0.15).")
    data.add_argument(
        "--shuffle_buffer_size", type=int, default=2**16, help="Sequences shuffled together, a block at a time."
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--pretrained_model_config",
        help="Config to start from: Hub id, local folder or local JSON file; only the config is used, never "
        "weights. Default: RoBERTa-base's architecture (transformers' RobertaConfig()).",
    )
    model.add_argument(
        "--config_overrides",
        help="Comma-separated config changes, e.g. hidden_size=256,num_hidden_layers=4,num_attention_heads=4",
    )
    model.add_argument("--trust_remote_code", action="store_true", help="Allow code from Hub repositories.")
    training = parser.add_argument_group("training")
    training.add_argument("--output_dir", required=True, help="Where the model and tokenizer are saved.")
    training.add_argument("--overwrite_output_dir", action="store_true", help="Replace a finished run there.")
    training.add_argument(
        "--no_pytorch_export",
        action="store_true",
        help="Save the TF weights only. By default --output_dir also gets model.safetensors, a PyTorch copy that "
        "transformers 5 (which has no TF models) and PyTorch load; written for roberta, roberta-prelayernorm "
        "and bert configs, other model types need this flag.",
    )
    training.add_argument("--per_replica_batch_size", type=int, default=8, help="Sequences per replica per step.")
    training.add_argument("--num_epochs", type=int, default=1, help="Passes over the train shards (default: 1).")
    training.add_argument("--max_steps", type=int, help="Stop after this many optimizer steps in all.")
    training.add_argument("--learning_rate", type=float, default=1e-4, help="Peak learning rate (default: 1e-4).")
    training.add_argument("--weight_decay_rate", type=float, default=0.01, help="AdamW decay (default: 0.01).")
    training.add_argument("--warmup_ratio", type=float, default=0.05, help="Share of steps for warmup.")
    training.add_argument("--seed", type=int, default=42, help="Seed for shuffling, masking and initialisation.")
    training.add_argument(
        "--mlm_head",
        choices=("sparse", "full"),
        default="sparse",
        help="sparse (default): run the LM head and loss at the masked positions only, the same loss for far "
        "less work; full: vocabulary logits at every position, as transformers computes them.",
    )
    training.add_argument("--bfloat16", action="store_true", help="Mixed bfloat16 precision (TPU, recent GPUs).")
    training.add_argument("--jit_compile", action="store_true", help="Compile the train step with XLA.")
    training.add_argument("--steps_per_execution", type=int, default=1, help="Steps per tf.function call.")
    training.add_argument(
        "--save_steps",
        type=int,
        default=1000,
        help="Checkpoint every this many optimizer steps, and at every epoch end (0: epoch ends only). Rerunning "
        "the same command after an interruption resumes from the newest checkpoint (default: 1000).",
    )
    training.add_argument("--save_total_limit", type=int, default=3, help="Checkpoints kept (default: 3).")
    training.add_argument(
        "--logging_steps",
        type=int,
        default=50,
        help="Write the training loss, accuracies, learning rate and tokens/s to TensorBoard (<output_dir>/logs) "
        "every this many optimizer steps (default: 50); evaluation is logged after every epoch.",
    )
    training.add_argument(
        "--hub_model_id",
        help="Push the model, its tokenizer and a model card to this Hub repository (namespace/name), over HTTP: "
        "no git or git-lfs needed; the token comes from `hf auth login` or HF_TOKEN. The repository is created "
        "(or found) before training. A snapshot is pushed at the end of every epoch, uploaded in the background "
        "while training goes on (skipped if the previous push is still uploading); the final model is pushed at "
        "the end, and the run waits for that push.",
    )
    training.add_argument(
        "--hub_private", action="store_true", help="Create the --hub_model_id repository as private (if it is new)."
    )
    hardware = parser.add_argument_group("hardware")
    hardware.add_argument("--tpu_name", default="local", help="TPU name; 'local' on a TPU VM (default).")
    hardware.add_argument("--tpu_zone", help="Zone of a TPU node, when not on a TPU VM.")
    hardware.add_argument("--gcp_project", help="GCP project of a TPU node, when not on a TPU VM.")
    hardware.add_argument("--no_tpu", action="store_true", help="Train on the GPUs, or the CPU when there are none.")
    hardware.add_argument(
        "--multi_worker",
        action="store_true",
        help="Train across machines with MultiWorkerMirroredStrategy (GPU clusters): every machine runs this same "
        "command with its own TF_CONFIG, and worker 0 (or the chief) alone writes. Implies --no_tpu.",
    )
    hardware.add_argument(
        "--cpu_replicas",
        type=int,
        default=1,
        help="With --no_tpu and no GPU: split the CPU into this many replicas and mirror across them, to "
        "rehearse the multi-replica path a TPU takes (default: 1).",
    )
    return parser.parse_args(argv)


def check_args(args):
    positive = (
        "per_replica_batch_size", "num_epochs", "shuffle_buffer_size", "steps_per_execution", "cpu_replicas",
        "save_total_limit", "logging_steps",
    )  # fmt: skip
    for flag in positive:
        if getattr(args, flag) <= 0:
            raise UsageError(f"--{flag} {getattr(args, flag)} must be a positive number.")
    if args.max_steps is not None and args.max_steps <= 0:
        raise UsageError(f"--max_steps {args.max_steps} must be positive; leave it out to train --num_epochs.")
    if args.save_steps < 0:
        raise UsageError(f"--save_steps {args.save_steps} must be 0 (epoch ends only) or positive.")
    if args.max_length is not None and args.max_length <= 1:
        raise UsageError(f"--max_length {args.max_length} must be more than 1.")
    if not 0.0 < args.mlm_probability < 1.0:
        raise UsageError(f"--mlm_probability {args.mlm_probability} must lie between 0 and 1 (0.15 is usual).")
    if not 0.0 <= args.warmup_ratio < 1.0:
        raise UsageError(f"--warmup_ratio {args.warmup_ratio} must lie in [0, 1).")
    if args.learning_rate <= 0 or args.weight_decay_rate < 0:
        raise UsageError("--learning_rate must be positive and --weight_decay_rate not negative.")
    if args.multi_worker:
        args.no_tpu = True
    if args.cpu_replicas > 1 and args.multi_worker:
        raise UsageError(f"--cpu_replicas {args.cpu_replicas} splits one machine; it cannot be combined with --multi_worker.")
    if args.cpu_replicas > 1 and not args.no_tpu:
        raise UsageError(f"--cpu_replicas {args.cpu_replicas} only applies with --no_tpu.")
    if args.cpu_replicas > 1 and args.jit_compile:
        raise UsageError(
            f"--jit_compile cannot be combined with --cpu_replicas {args.cpu_replicas}: XLA on the CPU cannot "
            "reach variables placed on another logical device; run the two checks separately."
        )
    if args.hub_private and not args.hub_model_id:
        raise UsageError("--hub_private needs --hub_model_id (e.g. my-user/my-model).")
    if args.hub_model_id is not None:
        check_hub_model_id(args.hub_model_id)


# ---------------------------------------------------------------------------------------------------------
# Cloud Storage: can every gs:// path be reached at all?

GCS_PROBE_SECONDS = 60  # a bound on the whole probe: starting Python and TensorFlow, then a request per path
# Run by a child process: report the first gs:// path (argv) that TensorFlow cannot look up, or whose bucket
# does not exist (TensorFlow's makedirs() asks about a missing bucket again and again, without end). Reading
# a bucket's own metadata takes a right that reading and writing its objects does not: if that is refused,
# the bucket is taken to exist.
GCS_PROBE_CODE = """
import json, sys
import tensorflow as tf
def report(path, error, message):
    print(json.dumps({"path": path, "error": error, "message": message}))
    sys.exit()
for path in sys.argv[1:]:
    try:
        tf.io.gfile.exists(path)
    except tf.errors.OpError as error:
        report(path, type(error).__name__, str(error))
    bucket = "/".join(path.split("/")[:3])
    try:
        if not tf.io.gfile.exists(bucket):
            report(path, "NoSuchBucket", bucket)
    except tf.errors.OpError:
        pass
"""
GCS_PROBE_ENV = {
    # A few quick retries and short timeouts instead of TensorFlow's minutes of them, for the probe only.
    "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
    "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "500000",
    "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "2000000",
    "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": "10",
    "GCS_REQUEST_IDLE_TIMEOUT_SECS": "10",
    "GCS_METADATA_REQUEST_TIMEOUT_SECS": "10",
    # The probe needs no accelerator: leave the TPU (which one process at a time may hold) and the GPUs alone.
    "TPU_LOAD_LIBRARY": "0",
    "CUDA_VISIBLE_DEVICES": "",
    "TF_CPP_MIN_LOG_LEVEL": "3",
}


def check_gcs_paths(paths):
    """Refuse, in one line and within about a minute, a gs:// path that cannot be reached (no network, no access).

    TensorFlow retries a failed Cloud Storage request for over three minutes (GCS_RETRY_CONFIG_MAX_RETRIES: 10
    by default, backing off up to 32 s), then fails with a libcurl error code. That patience is what a long run
    needs to ride out a passing outage, so it stays; but TensorFlow reads those settings once per process,
    so they cannot be lowered for a first check alone. A short-lived child process with few retries and
    short timeouts therefore looks up every path once, before any work, and this process keeps the defaults.
    """
    import subprocess

    flags = {path: flag for flag, path in paths.items() if path and path.startswith("gs://")}
    if not flags:
        return
    first = next(iter(flags))
    command = [sys.executable, "-c", GCS_PROBE_CODE, *flags]
    advice = "check the network (and HTTPS_PROXY, if you use a proxy), or use a local path"
    try:
        probe = subprocess.run(
            command, env={**os.environ, **GCS_PROBE_ENV}, capture_output=True, text=True, timeout=GCS_PROBE_SECONDS
        )
    except subprocess.TimeoutExpired:
        raise UsageError(
            f"{flags[first]} {first}: Cloud Storage did not answer within {GCS_PROBE_SECONDS} s; {advice}."
        ) from None
    try:
        failure = json.loads(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 and probe.stdout else None
    except ValueError:
        failure = None
    if failure is None:
        return  # every path answered; or the probe itself broke, and then the run meets the same trouble itself
    where = f"{flags[failure['path']]} {failure['path']}"
    if failure["error"] == "NoSuchBucket":
        raise UsageError(f"{where}: the bucket {failure['message']} does not exist; check the name, or create it.")
    reason = gcs_failure_reason(failure["message"])
    if failure["error"] in ("PermissionDeniedError", "UnauthenticatedError") or re.search(r"code 40[13]\b", reason):
        raise UsageError(
            f"{where}: Cloud Storage refused access ({reason}); sign in with `gcloud auth application-default "
            "login` or set GOOGLE_APPLICATION_CREDENTIALS to the key of an account that may use the bucket."
        )
    raise UsageError(f"{where}: Cloud Storage cannot be reached ({reason}); {advice}.")


def gcs_failure_reason(message):
    """TensorFlow's error for a failed request, shortened to what went wrong (libcurl's words, not its code)."""
    text = message.strip().splitlines()[0] if message.strip() else "no details"
    text = re.sub(r"^All \d+ retry attempts failed\. The last failure: ", "", text)
    details = re.search(r"error details: (.+)", text)
    if details:
        return details.group(1).strip()
    text = re.sub(r"libcurl code \d+ meaning '([^']*)'", r"\1", text)
    text = re.sub(r" with body .*", "", text)  # an HTTP error's body is a page of JSON; its code says enough
    return re.sub(r"^Error executing an HTTP request: ", "", text).strip()[:200]


# ---------------------------------------------------------------------------------------------------------
# Hardware


def build_strategy(args):
    """TPUStrategy unless --no_tpu; otherwise mirrored over the visible GPUs, or the default strategy on CPU."""
    import tensorflow as tf

    if args.multi_worker:
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=multi_worker_resolver())
    if not args.no_tpu:
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
                tpu=args.tpu_name, zone=args.tpu_zone, project=args.gcp_project
            )
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, RuntimeError, tf.errors.OpError) as error:
            reason = str(error).strip().split(". ")[0] or type(error).__name__  # TF's first sentence says it
            raise UsageError(
                f"no TPU found for --tpu_name {args.tpu_name} ({reason}); pass --no_tpu to train on GPUs or the CPU."
            ) from None
        return tf.distribute.TPUStrategy(resolver)

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return tf.distribute.MirroredStrategy()  # every visible GPU; narrow with CUDA_VISIBLE_DEVICES
    if args.cpu_replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * args.cpu_replicas
            )
        except RuntimeError:
            raise UsageError(
                f"--cpu_replicas {args.cpu_replicas} must take effect before TensorFlow starts; "
                "call run_mlm.py in a fresh process."
            ) from None
        return tf.distribute.MirroredStrategy([device.name for device in tf.config.list_logical_devices("CPU")])
    return tf.distribute.get_strategy()


# ---------------------------------------------------------------------------------------------------------
# Data: manifests, shards, masking


def multi_worker_resolver():
    """The cluster from TF_CONFIG, checked: a worker that guesses its place would wait forever for the others."""
    import tensorflow as tf

    text = os.environ.get("TF_CONFIG")
    example = '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}'
    if not text:
        raise UsageError(f"--multi_worker needs TF_CONFIG on every machine, e.g. TF_CONFIG='{example}'.")
    try:
        config = json.loads(text)
        task_type, task_index = config["task"]["type"], int(config["task"]["index"])
        addresses = config["cluster"][task_type]
        if not 0 <= task_index < len(addresses):
            raise IndexError(f"task index {task_index} with {len(addresses)} {task_type} addresses")
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise UsageError(
            f"TF_CONFIG {text!r} does not say which task of which cluster this is ({type(error).__name__}: "
            f"{error}); set it like '{example}'."
        ) from None
    return tf.distribute.cluster_resolver.TFConfigClusterResolver()


def is_chief(strategy):
    """Whether this process writes: the chief of a multi-worker cluster (worker 0 when there is no chief), or
    the only process there is. The other workers train in lockstep and keep their hands off the output."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type or not resolver.cluster_spec().as_dict():
        return True
    if resolver.task_type == "chief":
        return True
    return resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in resolver.cluster_spec().as_dict()


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

    Every pipeline reads whole files, so the hosts never read the same sequence and need not coordinate.
    They must take the same number of steps, so an epoch lasts as long as the pipeline with the fewest
    sequences has whole batches; the others leave their surplus for that epoch (a different surplus each
    epoch, as their files are reshuffled). Shards of equal size, as prepare_tfrecord_shards.py writes them
    (all but the last), keep that surplus small.
    """
    files, records = manifest["files"], [shard["records"] for shard in manifest["shards"]]
    if len(files) < pipelines:
        raise UsageError(
            f"{flag} has {len(files)} shard file(s), but {pipelines} hosts read the data and each needs at least "
            f"one of its own; rerun prepare_tfrecord_shards.py with a smaller --shard_size to write at least "
            f"{pipelines} shards (a multiple of {pipelines} spreads them evenly)."
        )
    pipeline_files = [files[index::pipelines] for index in range(pipelines)]
    steps = min(sum(records[index::pipelines]) // per_pipeline_batch for index in range(pipelines))
    return pipeline_files, steps


def read_manifest(folder, flag):
    import tensorflow as tf

    folder = folder.rstrip("/")
    path = f"{folder}/{MANIFEST_NAME}"
    if not tf.io.gfile.isdir(folder):
        raise UsageError(f"{flag} {folder} does not exist; pass a folder written by prepare_tfrecord_shards.py.")
    if not tf.io.gfile.exists(path):
        splits = [s for s in ("train", "validation", "test") if tf.io.gfile.exists(f"{folder}/{s}/{MANIFEST_NAME}")]
        hint = f" (did you mean {folder}/{splits[0]}?)" if splits else ""
        todo = "run prepare_tfrecord_shards.py to completion first"
        if tf.io.gfile.glob(f"{folder}/manifest-*-of-*.json"):  # parts of several workers, not yet merged
            todo = "its workers' parts are not merged yet: run prepare_tfrecord_shards.py --merge first"
        raise UsageError(f"{flag} {folder} has no {MANIFEST_NAME}, so it is not a finished split{hint}; {todo}.")
    try:
        with tf.io.gfile.GFile(path) as file:
            manifest = json.load(file)
        missing_keys = [key for key in MANIFEST_KEYS if key not in manifest]
        files = [f"{folder}/{shard['file']}" for shard in manifest.get("shards", [])]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        missing_keys, files = [f"unreadable ({type(error).__name__}: {error})"], []
    if missing_keys:
        raise UsageError(
            f"{flag} {folder}: {MANIFEST_NAME} is not one prepare_tfrecord_shards.py wrote (missing or bad: "
            f"{', '.join(missing_keys)}); rerun it."
        )
    missing = [path for path in files if not tf.io.gfile.exists(path)]
    if not files or missing:
        raise UsageError(
            f"{flag} {folder}: no shards found ({len(missing)} of {len(files)} listed in {MANIFEST_NAME} are "
            "missing); rerun prepare_tfrecord_shards.py."
        )
    manifest["files"] = files
    return manifest


def check_data(args, tokenizer, train_manifest, eval_manifest):
    """Flags, tokenizer and shards must agree before anything expensive happens."""
    manifests = {"--train_dataset": train_manifest, "--eval_dataset": eval_manifest}
    for flag, manifest in manifests.items():
        if manifest is None:
            continue
        if args.max_length is not None and manifest["max_length"] != args.max_length:
            raise UsageError(
                f"--max_length {args.max_length} differs from the {manifest['max_length']} of the shards in {flag}; "
                f"pass --max_length {manifest['max_length']} or rewrite the shards."
            )
        if manifest["vocab_size"] != len(tokenizer):
            raise UsageError(
                f"the shards in {flag} were written with a tokenizer of {manifest['vocab_size']} tokens, but "
                f"--tokenizer {args.tokenizer} has {len(tokenizer)}; pass the tokenizer the shards were made with."
            )
    if eval_manifest is not None and eval_manifest["max_length"] != train_manifest["max_length"]:
        raise UsageError(
            f"train shards have max_length {train_manifest['max_length']} but eval shards have "
            f"{eval_manifest['max_length']}; write both with the same --max_length."
        )
    for flag, manifest in manifests.items():
        if manifest is not None:
            check_shards(manifest, flag, len(tokenizer))


def check_shards(manifest, flag, vocab_size):
    """Every shard is whole and holds this tokenizer's ids: checked cheaply, before anything is built.

    A shard's size must be the one its manifest records (a truncated TFRecord file reads as a shorter
    one without any error, so nothing later would notice); manifests without sizes get their records
    counted instead. The first record of every shard must parse as max_length ids within the vocabulary.
    """
    import tensorflow as tf

    features = {FEATURE_NAME: tf.io.FixedLenFeature([manifest["max_length"]], tf.int64)}
    for shard, path in zip(manifest["shards"], manifest["files"]):
        try:
            if "bytes" in shard:
                found, expected, unit = tf.io.gfile.stat(path).length, shard["bytes"], "bytes"
            else:
                found = count_records(path)  # manifests from before sizes were recorded
                expected, unit = shard["records"], "records"
            if found != expected:
                raise UsageError(
                    f"{flag}: shard {path} has {found} {unit} but {MANIFEST_NAME} lists {expected}, so it is truncated "
                    "or was changed; rerun prepare_tfrecord_shards.py."
                )
            first = next(iter(tf.data.TFRecordDataset(path).take(1)))
            ids = tf.io.parse_single_example(first, features)[FEATURE_NAME].numpy()
        except (tf.errors.OpError, StopIteration) as error:
            raise UsageError(
                f"{flag}: shard {path} is unreadable ({tf_error_text(error) if str(error) else 'no records'}); "
                "rerun prepare_tfrecord_shards.py."
            ) from None
        if ids.min() < 0 or ids.max() >= vocab_size:
            raise UsageError(
                f"{flag}: shard {path} holds token id {ids.max() if ids.max() >= vocab_size else ids.min()}, outside "
                f"the tokenizer's {vocab_size} ids; pass the tokenizer the shards were made with."
            )


def count_records(path):
    """Read a shard to its end; a corrupt one raises tf.errors.DataLossError."""
    import tensorflow as tf

    return sum(1 for _ in tf.data.TFRecordDataset(path))


def find_corrupt_shard(files):
    """The first shard that cannot be read to its end: TF's corruption error does not name the file."""
    import tensorflow as tf

    for path in files:
        try:
            count_records(path)
        except tf.errors.DataLossError:
            return path
    return None


def load_tokenizer(name_or_path, trust_remote_code):
    if os.path.isdir(name_or_path):
        if not any(os.path.isfile(os.path.join(name_or_path, name)) for name in TOKENIZER_FILES):
            raise UsageError(
                f"--tokenizer {name_or_path} holds no {' or '.join(TOKENIZER_FILES)}, so it is not a tokenizer "
                "folder; pass the --output_dir of train_unigram.py or a Hub id."
            )
    elif os.path.exists(name_or_path) or name_or_path.startswith((".", "/")):
        raise UsageError(f"--tokenizer {name_or_path} is not a tokenizer folder; pass the output of train_unigram.py.")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except Exception as error:  # transformers raises many kinds for files it cannot make sense of
        raise UsageError(f"could not load the tokenizer {name_or_path!r}: {first_line(error)[:300]}") from None
    for name in ("mask", "pad"):
        if getattr(tokenizer, f"{name}_token_id") is None:
            raise UsageError(
                f"the tokenizer {name_or_path!r} has no {name} token, which masked-LM training needs; "
                "use a tokenizer from train_unigram.py."
            )
    return tokenizer


def max_predictions(max_length, mlm_probability):
    """Predictions per sequence: the masking below never chooses more, so shapes stay static for XLA/TPU."""
    return max(1, math.ceil(max_length * mlm_probability))


def mask_tokens(input_ids, seed, mlm_probability, mask_token_id, special_ids, replacement_ids):
    """BERT masking in TF ops, stateless so the same seed always gives the same masks.

    In each sequence, round(`mlm_probability` x its non-special tokens) positions are chosen at random
    (special tokens, <unk> included, never are: predicting "unknown" teaches nothing). Of the chosen
    positions 80% become [MASK], 10% a random non-special token and 10% stay as they are. An exact count
    per sequence, as in the original BERT, means at most `max_predictions()` positions, which is what lets
    the model score those positions alone.

    Returns the masked ids [batch, length], the chosen positions [batch, predictions] and their labels
    [batch, predictions]: the original ids, or -100 in slots beyond the sequence's count (the loss and the
    metrics skip -100, and the position of such a slot is 0, a harmless index).
    """
    import tensorflow as tf

    choose_seed, action_seed, random_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    shape = tf.shape(input_ids)
    length = input_ids.shape[-1]
    predictions = max_predictions(length, mlm_probability)
    maskable = ~tf.reduce_any(tf.equal(input_ids[..., None], special_ids), axis=-1)
    count = tf.cast(tf.round(mlm_probability * tf.reduce_sum(tf.cast(maskable, tf.float32), axis=-1)), tf.int32)

    # A random ranking of the maskable positions; the first `count` of each row are chosen.
    scores = tf.where(maskable, tf.random.stateless_uniform(shape, choose_seed), -1.0)
    _, ranked = tf.math.top_k(scores, k=predictions)
    used = tf.range(predictions)[None, :] < count[:, None]
    positions = tf.where(used, ranked, 0)
    labels = tf.where(used, tf.gather(input_ids, positions, batch_dims=1), -100)
    chosen = tf.reduce_any(tf.one_hot(positions, length, on_value=True, off_value=False) & used[..., None], axis=1)

    action = tf.random.stateless_uniform(shape, action_seed)
    to_mask = chosen & (action < 0.8)
    to_random = chosen & (action >= 0.8) & (action < 0.9)
    random_index = tf.random.stateless_uniform(
        shape, random_seed, maxval=tf.shape(replacement_ids, out_type=tf.int32)[0], dtype=tf.int32
    )
    random_tokens = tf.gather(replacement_ids, random_index)
    masked_ids = tf.where(to_mask, mask_token_id, tf.where(to_random, random_tokens, input_ids))
    return masked_ids, positions, labels


def build_dataset(
    files, tokenizer, args, max_length, batch_size, training, start_epoch=0, start_batch=0, batches_per_epoch=None,
    pipeline=0,
):  # fmt: skip
    """Shards -> shuffled, batched, parsed, masked batches of ({"input_ids", "masked_positions"}, labels).

    Every shape is static: [batch, max_length] ids, [batch, max_predictions] positions and labels. `files`
    are this input pipeline's own shards; each epoch yields at most `batches_per_epoch` batches, so that all
    the hosts of a cluster take the same number of steps.

    Training data is an endless stream of epochs, and everything random in it is stateless: epoch e reads
    the shards in an order drawn from (seed, e), shuffles them in blocks of --shuffle_buffer_size records,
    each permuted with a seed drawn from (seed, e, block), and masks its batch i with a seed drawn from
    (seed, e, i). So the masks change every epoch, as in RoBERTa, yet any point of the stream can be rebuilt
    from (`start_epoch`, `start_batch`) alone: that is how a resumed run continues where it stopped, and the
    batches it skips are read but neither parsed nor masked. Evaluation data is one pass in file order with
    the same masks every time, so every epoch is scored on identical inputs and the figures compare.
    """
    import tensorflow as tf

    special = set(tokenizer.all_special_ids)
    special_ids = tf.constant(sorted(special), dtype=tf.int32)
    replacement_ids = tf.constant([i for i in range(len(tokenizer)) if i not in special], dtype=tf.int32)
    mask_token_id = tf.constant(tokenizer.mask_token_id, dtype=tf.int32)
    files = tf.constant(files)
    base_seed = tf.constant([args.seed, 1 if training else 2], dtype=tf.int64)  # train and eval draws differ
    if pipeline:  # each host draws its own shuffles and masks; host 0 draws those of a single-host run
        base_seed = tf.random.experimental.stateless_fold_in(base_seed, pipeline)

    def seed_for(*numbers):
        seed = base_seed
        for number in numbers:
            seed = tf.random.experimental.stateless_fold_in(seed, number)
        return seed

    def epoch_batches(epoch):
        order = tf.random.experimental.stateless_shuffle(files, seed_for(epoch, -1)) if training else files
        records = tf.data.Dataset.from_tensor_slices(order).interleave(
            tf.data.TFRecordDataset,
            cycle_length=min(len(files), 8),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        if training:
            blocks = records.batch(args.shuffle_buffer_size).enumerate()
            records = blocks.flat_map(
                lambda block, serialized: tf.data.Dataset.from_tensor_slices(
                    tf.random.experimental.stateless_shuffle(serialized, seed_for(epoch, block))
                )
            )
        batches = records.batch(batch_size, drop_remainder=True)
        if batches_per_epoch is not None:
            batches = batches.take(batches_per_epoch)
        batches = batches.enumerate()
        return batches.map(lambda index, batch: (epoch, index, batch))

    if training:
        epochs = tf.data.Dataset.counter(start_epoch)
    else:
        epochs = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64))
    dataset = epochs.flat_map(epoch_batches)  # fit() counts the steps, so the training stream may be endless
    if start_batch:
        dataset = dataset.skip(start_batch)
    features = {FEATURE_NAME: tf.io.FixedLenFeature([max_length], tf.int64)}

    def parse_and_mask(epoch, index, serialized):
        # Parsing a whole batch in one op is far cheaper than parsing records one by one.
        input_ids = tf.cast(tf.io.parse_example(serialized, features)[FEATURE_NAME], tf.int32)
        masked_ids, positions, labels = mask_tokens(
            input_ids, seed_for(epoch, index), args.mlm_probability, mask_token_id, special_ids, replacement_ids
        )
        return {FEATURE_NAME: masked_ids, "masked_positions": positions}, labels

    dataset = dataset.map(parse_and_mask, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


# ---------------------------------------------------------------------------------------------------------
# Model


def parse_config_overrides(text):
    overrides = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, separator, value = item.partition("=")
        if not separator:
            raise UsageError(f"--config_overrides item {item!r} is not key=value; e.g. hidden_size=256.")
        try:
            overrides[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key.strip()] = value
    return overrides


def build_config(args, tokenizer, max_length):
    """The architecture config, with every token id taken from the tokenizer."""
    from transformers import AutoConfig, RobertaConfig

    source = args.pretrained_model_config
    if source is None:
        config = RobertaConfig()
    else:
        if os.path.isfile(source) and not source.endswith(".json"):
            raise UsageError(f"--pretrained_model_config {source} is a file but not JSON; pass a config.json.")
        if not os.path.exists(source) and source.startswith((".", "/")):
            raise UsageError(f"--pretrained_model_config {source} does not exist; pass a config.json or a Hub id.")
        try:
            config = AutoConfig.from_pretrained(source, trust_remote_code=args.trust_remote_code)
        except (OSError, ValueError) as error:
            raise UsageError(f"could not load --pretrained_model_config {source}: {first_line(error)}") from None
    for key, value in parse_config_overrides(args.config_overrides).items():
        if not hasattr(config, key):
            raise UsageError(f"--config_overrides names {key!r}, which {type(config).__name__} does not have.")
        setattr(config, key, value)

    config.vocab_size = len(tokenizer)
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    config.eos_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    config.cls_token_id = tokenizer.cls_token_id
    config.sep_token_id = tokenizer.sep_token_id
    config.mask_token_id = tokenizer.mask_token_id
    if config.model_type in FIXED_PADDING_INDEX_MODELS and tokenizer.pad_token_id != 1:
        raise UsageError(
            f"the tokenizer's pad token {tokenizer.pad_token!r} has id {tokenizer.pad_token_id}, but transformers' "
            f"TF {config.model_type} numbers positions from a padding index fixed at 1 (its PyTorch twin uses "
            "pad_token_id), so the model would differ between frameworks; retrain the tokenizer with "
            "train_unigram.py, which puts <pad> at id 1."
        )
    # RoBERTa numbers positions from pad_token_id + 1, so the table needs max_length + pad + 1 rows;
    # other models need max_length. The larger bound serves both.
    needed_positions = max_length + tokenizer.pad_token_id + 1
    if config.max_position_embeddings < needed_positions:
        config.max_position_embeddings = needed_positions
    if config.hidden_size % config.num_attention_heads:
        raise UsageError(
            f"hidden_size {config.hidden_size} is not divisible by num_attention_heads "
            f"{config.num_attention_heads}; fix --config_overrides."
        )
    return config


def masked_lm_trainer(masked_lm, mlm_head, mask_token_id):
    """Wrap a transformers TF masked LM in a Keras model whose fit() scores the masked positions only.

    With `mlm_head="sparse"` the encoder's hidden states are gathered at the masked positions first, so
    the LM head (dense, layer norm and the vocabulary projection, most of a small model's arithmetic) runs
    on ~15% of the positions. With `"full"` the model computes logits everywhere, as transformers does,
    and they are gathered afterwards: same loss, the reference cost. Either way the weights trained are
    the wrapped model's own, so `masked_lm.save_pretrained()` writes a standard checkpoint.
    """
    import tensorflow as tf
    import tf_keras

    class PositionAccuracy(tf_keras.metrics.Metric):
        """Top-1 accuracy over the positions a boolean `scored` tensor selects."""

        def __init__(self, name, **kwargs):
            super().__init__(name=name, **kwargs)
            self.correct = self.add_weight(name="correct", initializer="zeros", dtype=tf.float32)
            self.total = self.add_weight(name="total", initializer="zeros", dtype=tf.float32)

        def update_state(self, labels, predictions, scored):
            hits = scored & tf.equal(predictions, labels)
            self.correct.assign_add(tf.reduce_sum(tf.cast(hits, tf.float32)))
            self.total.assign_add(tf.reduce_sum(tf.cast(scored, tf.float32)))

        def result(self):
            return tf.math.divide_no_nan(self.correct, self.total)

    class TopTokenShare(tf_keras.metrics.Metric):
        """Share of the predictions taken by the single most predicted token: near 1 means collapse."""

        def __init__(self, vocab_size, name="top_token_share", **kwargs):
            super().__init__(name=name, **kwargs)
            self.vocab_size = vocab_size
            self.counts = self.add_weight(name="counts", shape=(vocab_size,), initializer="zeros", dtype=tf.float32)

        def update_state(self, predictions, scored):
            ones = tf.cast(scored, tf.float32)
            # unsorted_segment_sum rather than bincount: it compiles with XLA, so it runs on TPU too.
            self.counts.assign_add(tf.math.unsorted_segment_sum(ones, predictions, self.vocab_size))

        def result(self):
            return tf.math.divide_no_nan(tf.reduce_max(self.counts), tf.reduce_sum(self.counts))

        def reset_state(self):
            self.counts.assign(tf.zeros_like(self.counts))

    class MaskedLMTrainer(tf_keras.Model):
        def __init__(self):
            super().__init__()
            self.masked_lm = masked_lm
            self.loss_tracker = tf_keras.metrics.Mean(name="loss")
            # All labelled positions (80% [MASK], 10% random, 10% unchanged), and [MASK] inputs alone:
            # the second is the fill-mask task the model is used for afterwards.
            self.masked_accuracy = PositionAccuracy("masked_accuracy")
            self.mask_token_accuracy = PositionAccuracy("mask_token_accuracy")
            self.top_token_share = TopTokenShare(masked_lm.config.vocab_size)

        @property
        def metrics(self):  # what fit() resets every epoch and reports
            return [self.loss_tracker, self.masked_accuracy, self.mask_token_accuracy, self.top_token_share]

        def masked_logits(self, features, training):
            positions = features["masked_positions"]
            if mlm_head == "sparse":
                encoder = getattr(self.masked_lm, self.masked_lm.base_model_prefix)
                hidden_states = encoder(input_ids=features[FEATURE_NAME], training=training)[0]
                logits = self.masked_lm.get_lm_head()(tf.gather(hidden_states, positions, batch_dims=1))
            else:
                logits = self.masked_lm(input_ids=features[FEATURE_NAME], training=training).logits
                logits = tf.gather(logits, positions, batch_dims=1)
            # Under mixed bfloat16 the logits arrive in bf16; softmax and loss need float32's range.
            return tf.cast(logits, tf.float32)

        def loss_and_metrics(self, features, labels, training):
            logits = self.masked_logits(features, training)
            scored = tf.not_equal(labels, -100)
            per_position = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.maximum(labels, 0), logits)
            weights = tf.cast(scored, tf.float32)
            loss = tf.reduce_sum(per_position * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)

            predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
            inputs_at_positions = tf.gather(features[FEATURE_NAME], features["masked_positions"], batch_dims=1)
            was_mask = scored & tf.equal(inputs_at_positions, mask_token_id)
            self.loss_tracker.update_state(loss)
            self.masked_accuracy.update_state(labels, predictions, scored)
            self.mask_token_accuracy.update_state(labels, predictions, was_mask)
            self.top_token_share.update_state(predictions, was_mask)
            return loss

        def train_step(self, data):
            features, labels = data
            with tf.GradientTape() as tape:
                loss = self.loss_and_metrics(features, labels, training=True)
                # Each replica's gradients are summed across replicas, so each contributes its share.
                replica_loss = loss / tf.distribute.get_strategy().num_replicas_in_sync
            self.optimizer.minimize(replica_loss, self.trainable_variables, tape=tape)
            return {metric.name: metric.result() for metric in self.metrics}

        def test_step(self, data):
            features, labels = data
            self.loss_and_metrics(features, labels, training=False)
            return {metric.name: metric.result() for metric in self.metrics}

        def call(self, features, training=False):
            return self.masked_logits(features, training)

        def save_pretrained(self, *args, **kwargs):  # the Hub pushes save self.model
            return self.masked_lm.save_pretrained(*args, **kwargs)

    return MaskedLMTrainer()


def build_model(config, args, total_steps, strategy, mask_token_id):
    """The masked LM and the trainer that fits it, with AdamW and its schedule, created in the strategy's scope."""
    from transformers import TFAutoModelForMaskedLM, create_optimizer

    # transformers 4.57 warns that its TF classes leave in v5; README.md says so once, the log needn't.
    logging.getLogger("transformers.modeling_tf_utils").addFilter(
        lambda record: "TensorFlow and JAX classes are deprecated" not in record.getMessage()
    )
    with strategy.scope():
        masked_lm = TFAutoModelForMaskedLM.from_config(config)
        masked_lm(masked_lm.dummy_inputs)  # build the weights inside the strategy scope
        trainer = masked_lm_trainer(masked_lm, args.mlm_head, mask_token_id)
        optimizer, _ = create_optimizer(
            init_lr=args.learning_rate,
            num_train_steps=total_steps,
            num_warmup_steps=int(args.warmup_ratio * total_steps),
            weight_decay_rate=args.weight_decay_rate,
        )
        trainer.compile(
            optimizer=optimizer, jit_compile=args.jit_compile, steps_per_execution=args.steps_per_execution
        )
    return masked_lm, trainer


# ---------------------------------------------------------------------------------------------------------
# Hub: the model card, and pushes over HTTP that never hold up training

MODEL_CARD_NAME = "README.md"


def check_hub_model_id(repo_id):
    """A --hub_model_id the Hub would refuse is refused now, offline, before any work."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise UsageError(
            f"--hub_model_id {repo_id} is not a Hub repository id ({first_line(error)}); use namespace/name, "
            "e.g. my-user/roberta-from-scratch."
        ) from None


def hub_error_text(error):
    """A Hub failure in one line: the HTTP status and the server's own words when there was a response.

    huggingface_hub wraps a failed file upload in an error that names the file only; its cause holds the reason.
    """
    cause = error
    while cause is not None and getattr(cause, "response", None) is None:
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return first_line(error)
    response = cause.response
    words = (getattr(cause, "server_message", None) or "").strip()
    return f"HTTP {response.status_code} {response.reason}" + (f": {words.splitlines()[0]}" if words else "")


class HubPusher:
    """Pushes the run to a Hub repository with huggingface_hub's HTTP API (create_repo, upload_folder).

    No git clone and no git-lfs: every push is one commit of a snapshot folder holding the model
    (config.json, tf_model.h5), its tokenizer and the model card (README.md). The repository is created,
    or found, when the pusher is made, so a wrong id or a missing login stops the run before anything is
    built or written.

    During training, push_in_background() writes a snapshot to a local staging folder on the training
    thread (the weights must be read between steps) and uploads it from a worker thread while training
    goes on. While that upload runs, further requests are skipped rather than queued: a queue could grow
    without bound on a slow link, and only the newest weights matter. The worker is a daemon thread, so a
    stuck upload can never keep a failed run from exiting. push_final() lets a running upload finish (so it
    cannot land after the final model), then pushes the final model and waits for it.
    """

    def __init__(self, args, tokenizer, max_length, card):
        from huggingface_hub import HfApi, get_token
        from huggingface_hub.utils import disable_progress_bars

        self.args, self.tokenizer, self.max_length, self.card = args, tokenizer, max_length, card
        if get_token() is None:
            raise UsageError(
                f"--hub_model_id {args.hub_model_id} needs a Hub token with write access: run `hf auth login` "
                "or set HF_TOKEN, or leave out --hub_model_id."
            )
        self.api = HfApi()
        try:
            # private=None leaves an existing repository as it is and lets the namespace's default decide.
            repository = self.api.create_repo(args.hub_model_id, private=args.hub_private or None, exist_ok=True)
        except Exception as error:  # HTTP errors, no network, offline mode: all mean no push is possible
            raise UsageError(
                f"could not create or find the Hub repository --hub_model_id {args.hub_model_id} "
                f"({hub_error_text(error)}); check the id, that your token may write to its namespace "
                "(`hf auth whoami`), and the network."
            ) from None
        self.repo_id = repository.repo_id  # a bare name gets the token owner's namespace
        disable_progress_bars()  # upload bars from the worker thread would cut through Keras's progress lines
        self.upload = None  # the worker thread of the latest background push
        print(f"Pushing to the Hub repository {self.repo_id}: a snapshot at each epoch end, the final model last.")

    def uploading(self):
        return self.upload is not None and self.upload.is_alive()

    def write_snapshot(self, folder, trainer, card_text):
        """What a push publishes: the model, its tokenizer and the card, as save() lays them out."""
        self.tokenizer.model_max_length = self.max_length  # the longest input the position table accepts
        trainer.save_pretrained(folder)
        if not self.args.no_pytorch_export:  # what transformers 5 users on the Hub load
            write_pytorch_copy(trainer.masked_lm, self.tokenizer, folder)
        self.tokenizer.save_pretrained(folder)
        with open(os.path.join(folder, MODEL_CARD_NAME), "w", encoding="utf-8") as file:
            file.write(card_text)

    def push_in_background(self, trainer, metrics, message):
        """Start uploading a snapshot of `trainer`'s model unless the previous push still runs; True if started."""
        if self.uploading():
            return False
        staging = tempfile.TemporaryDirectory(prefix="hub-push-")  # removed at exit too, should the run fail
        self.write_snapshot(staging.name, trainer, self.card(trainer, metrics))
        self.upload = threading.Thread(target=self.upload_snapshot, args=(staging, message), daemon=True)
        self.upload.start()
        return True

    def upload_snapshot(self, staging, message):
        try:
            self.api.upload_folder(repo_id=self.repo_id, folder_path=staging.name, commit_message=message)
            print(f"Pushed to {self.repo_id}: {message}")
        except Exception as error:  # training goes on: the final push sends everything again
            print(
                f"run_mlm.py: warning: the Hub push '{message}' failed ({hub_error_text(error)}); training goes "
                "on, and the final model is pushed at the end.",
                file=sys.stderr,
            )
        finally:
            staging.cleanup()

    def push_final(self, trainer, card_text, message):
        """Push the final model and wait; a failure is one line, and the model stays saved in --output_dir."""
        import tensorflow as tf

        if self.uploading():
            print("Waiting for the previous Hub push to finish before pushing the final model.")
            self.upload.join()
        try:
            with tempfile.TemporaryDirectory(prefix="hub-push-") as staging:
                self.write_snapshot(staging, trainer, card_text)
                curves = f"{self.args.output_dir.rstrip('/')}/{CURVES_NAME}"
                if tf.io.gfile.exists(curves):  # the final push shows how training went
                    tf.io.gfile.copy(curves, os.path.join(staging, CURVES_NAME))
                commit = self.api.upload_folder(repo_id=self.repo_id, folder_path=staging, commit_message=message)
        except Exception as error:
            output_dir = self.args.output_dir
            local_copy = " (from a local copy)" if "://" in output_dir else ""
            raise UsageError(
                f"the model is saved in {output_dir}, but pushing it to --hub_model_id {self.repo_id} failed "
                f"({hub_error_text(error)}); push it later with `hf upload {self.repo_id} {output_dir} "
                f"--exclude 'checkpoints/*'`{local_copy}."
            ) from None
        print(f"Pushed the final model, its tokenizer and model card to the Hub: {commit.commit_url}")


def model_card(args, config, tokenizer, manifests, global_batch_size, planned_steps, trainer, metrics):
    """The model card (README.md): what the model is, its data, its settings and its results so far.

    `manifests` are the train and evaluation manifests (the second may be None), `planned_steps` the run's
    (total steps, steps per epoch), `trainer` the fitted model
    (its optimizer counts the steps taken, in this process or before a resume) and `metrics` the figures
    of the latest epoch as fit() logs them: loss, masked_accuracy, ... and their val_ twins.
    """
    train_manifest, eval_manifest = manifests
    total_steps, steps_per_epoch = planned_steps
    steps = int(trainer.optimizer.iterations.numpy())
    max_length = train_manifest["max_length"]
    warmup_steps = int(args.warmup_ratio * total_steps)
    name = args.hub_model_id or os.path.basename(args.output_dir.rstrip("/"))
    where = args.hub_model_id or args.output_dir
    mask = tokenizer.mask_token

    def number(key, digits=4):
        value = metrics.get(key)
        return "–" if value is None else f"{float(value):.{digits}f}"

    def percent(key):
        value = metrics.get(key)
        return "–" if value is None else f"{100 * float(value):.2f}%"

    train_perplexity = math.exp(min(float(metrics["loss"]), 50.0)) if "loss" in metrics else None
    if steps >= total_steps:
        status = f"Training finished after {steps:,} optimizer steps."
    else:
        status = (
            f"**Training in progress**: this snapshot was taken after step {steps:,} of {total_steps:,}. The "
            "weights and this card are replaced at every push, and by the final model at the end."
        )
    data_rows = [("train", args.train_dataset, train_manifest)]
    if eval_manifest is not None:
        data_rows.append(("evaluation", args.eval_dataset, eval_manifest))
    data_table = "\n".join(
        f"| {split} | `{folder}` | {manifest.get('source', '–')} | {manifest['records']:,} | "
        f"{manifest['records'] * manifest['max_length']:,} |"
        for split, folder, manifest in data_rows
    )
    evaluation_note = (
        "" if eval_manifest is not None else "\nNo evaluation shards were given, so there are no evaluation figures.\n"
    )
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: fill-mask",
        "tags:",
        "- fill-mask",
        "- tensorflow",
        "- masked-language-modeling",
        f"- {config.model_type}",
        "- pretrained-from-scratch",
        "---",
        "",
        f"# {name}",
        "",
        f"A {config.model_type} masked language model with {trainer.masked_lm.count_params():,} parameters, "
        "pretrained from scratch (random initial weights, no checkpoint of another model) by `run_mlm.py` with "
        "Keras `fit`: the last step of a TensorFlow pipeline whose first steps train a Unigram tokenizer "
        "(`train_unigram.py`) and pack text into TFRecord shards (`prepare_tfrecord_shards.py`). The weights "
        "are TensorFlow's (`tf_model.h5`, for transformers 4.x); `pytorch/` holds the same model for transformers 5 "
        "and PyTorch (`model.safetensors`) unless the run was told not to write it.",
        "",
        status,
        "",
        "## Usage",
        "",
        "```python",
        "from transformers import pipeline",
        "",
        f'fill_mask = pipeline("fill-mask", model="{where}", framework="tf", dtype=None)  # transformers 4.x, TF',
        f'print(fill_mask("The river runs under the old {mask} of the city."))',
        "```",
        "",
        "With transformers 5 and PyTorch:",
        "",
        "```python",
        "from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline",
        "",
        f'model = AutoModelForMaskedLM.from_pretrained("{where}", subfolder="{PYTORCH_DIR}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{where}", subfolder="{PYTORCH_DIR}")',
        'fill_mask = pipeline("fill-mask", model=model, tokenizer=tokenizer)',
        "```",
        "",
        "## Training data",
        "",
        "| split | shards | source | sequences | tokens |",
        "|---|---|---|---|---|",
        data_table,
        "",
        f"Each sequence holds {max_length} tokens, none of them padding. How the shards were packed, in their "
        f"manifest's words: {train_manifest.get('packing', 'not recorded')}. Tokenizer: `{args.tokenizer}`, "
        f"{len(tokenizer):,} tokens in its vocabulary.",
        "",
        "## Training procedure",
        "",
        "| setting | value |",
        "|---|---|",
        f"| architecture | {config.model_type} |",
        f"| layers / hidden size / attention heads | {config.num_hidden_layers} / {config.hidden_size} / "
        f"{config.num_attention_heads} |",
        f"| feed-forward size / position embeddings | {config.intermediate_size} / {config.max_position_embeddings} |",
        f"| batch | {global_batch_size} sequences of {max_length} tokens ({args.per_replica_batch_size} per replica, "
        f"{global_batch_size // args.per_replica_batch_size} replica(s)) |",
        f"| steps | {total_steps:,} ({steps_per_epoch:,} per epoch) |",
        f"| optimizer | AdamW, weight decay {args.weight_decay_rate} (not on biases and layer norms) |",
        f"| learning rate | peak {args.learning_rate:g}, linear warmup over {warmup_steps:,} steps "
        f"({args.warmup_ratio:g} of them), then linear decay to 0 |",
        f"| masking | {args.mlm_probability:.0%} of the non-special tokens of each sequence: 80% become "
        f"`{mask}`, 10% a random token, 10% stay; new masks every epoch |",
        f"| loss | cross-entropy at the masked positions ({args.mlm_head} LM head) |",
        f"| precision | {'mixed bfloat16' if args.bfloat16 else 'float32'} |",
        f"| seed | {args.seed} |",
        "",
        "## Results",
        "",
        f"After {steps:,} steps, {steps * global_batch_size * max_length:,} tokens seen. Train figures are the "
        "means over the last epoch; all of them count the masked positions only.",
        "",
        "| metric | train | evaluation |",
        "|---|---|---|",
        f"| masked-LM loss | {number('loss')} | {number('val_loss')} |",
        f"| perplexity | {'–' if train_perplexity is None else f'{train_perplexity:.2f}'} | "
        f"{number('val_perplexity', 2)} |",
        f"| masked accuracy (every labelled position) | {percent('masked_accuracy')} | "
        f"{percent('val_masked_accuracy')} |",
        f"| accuracy at `{mask}` | {percent('mask_token_accuracy')} | {percent('val_mask_token_accuracy')} |",
        evaluation_note,
    ]
    return "\n".join(lines)


def write_model_card(card_text, output_dir):
    import tensorflow as tf

    with tf.io.gfile.GFile(f"{output_dir.rstrip('/')}/{MODEL_CARD_NAME}", "w") as file:
        file.write(card_text)


# ---------------------------------------------------------------------------------------------------------
# Training loop helpers


def training_callbacks(args, hub=None, total_steps=None):
    import tf_keras

    class EpochSummary(tf_keras.callbacks.Callback):
        """Adds val_perplexity, the wall time since training began and the optimizer step to each epoch's logs."""

        start = None  # set once: fit_exact_steps may call fit() twice with the same callbacks

        def on_train_begin(self, logs=None):
            if self.start is None:
                self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            if logs is None:
                return
            if "val_loss" in logs:
                logs["val_perplexity"] = math.exp(min(logs["val_loss"], 50.0))  # capped: exp(50) is noise already
            logs["elapsed_minutes"] = (time.perf_counter() - self.start) / 60
            logs["step"] = int(self.model.optimizer.iterations.numpy())

    callbacks = [
        EpochSummary(),
        # One row per epoch, appended across resumed runs: the whole run's curve in one file.
        tf_keras.callbacks.CSVLogger(f"{args.output_dir.rstrip('/')}/{TRAINING_LOG_NAME}", append=True),
    ]
    if hub is not None:
        callbacks.append(hub_push_callback(hub, total_steps))
    return callbacks


def tensorboard_callback(args, tokens_per_step, writes=True):
    """TensorBoard scalars in <output_dir>/logs (local or gs://).

    Every --logging_steps steps: the training loss and accuracies over those steps alone, the learning rate
    and tokens per second; after every epoch, the evaluation metrics and perplexity. fit()'s metrics are
    running sums over the epoch, so two readings of their totals give the interval's exact figures. Like the
    checkpoint callback, it counts steps on the host and touches the device only when it writes.

    Reading a metric sums its copies across replicas, which across hosts is a collective operation every
    worker must join, so every worker runs this callback and only the chief (`writes`) keeps what it reads.
    """
    import tensorflow as tf
    import tf_keras

    class TensorBoardScalars(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True  # the per-batch logs are never read, so they need no conversion
            log_dir = f"{args.output_dir.rstrip('/')}/{TENSORBOARD_DIR}"
            self.writer = tf.summary.create_file_writer(log_dir) if writes else tf.summary.create_noop_writer()

        def totals(self):
            trainer = self.model
            pairs = {
                "loss": (trainer.loss_tracker.total, trainer.loss_tracker.count),
                "masked_accuracy": (trainer.masked_accuracy.correct, trainer.masked_accuracy.total),
                "mask_token_accuracy": (trainer.mask_token_accuracy.correct, trainer.mask_token_accuracy.total),
            }
            # read_value() sums a metric's per-replica copies when there are several replicas.
            return {name: (float(a.read_value()), float(b.read_value())) for name, (a, b) in pairs.items()}

        def learning_rate(self):
            rate = self.model.optimizer.learning_rate  # a schedule (warmup, then decay) or a fixed value
            if isinstance(rate, tf_keras.optimizers.schedules.LearningRateSchedule):
                rate = rate(self.model.optimizer.iterations)
            return float(rate)

        def write_interval(self, step):
            now, totals = time.perf_counter(), self.totals()
            with self.writer.as_default(step=step):
                for name, (numerator, denominator) in totals.items():
                    previous_numerator, previous_denominator = self.previous_totals[name]
                    if denominator > previous_denominator:
                        value = (numerator - previous_numerator) / (denominator - previous_denominator)
                        tf.summary.scalar(f"train/{name}", value)
                tf.summary.scalar("train/learning_rate", self.learning_rate())
                tf.summary.scalar(
                    "train/tokens_per_second", (step - self.logged_step) * tokens_per_step / (now - self.logged_time)
                )
            self.logged_step, self.logged_time, self.previous_totals = step, now, totals

        def on_epoch_begin(self, epoch, logs=None):
            # fit() has just reset the metrics: the sums start again from zero.
            self.epoch_start = self.logged_step = int(self.model.optimizer.iterations.numpy())
            self.logged_time = time.perf_counter()
            self.previous_totals = {name: (0.0, 0.0) for name in ("loss", "masked_accuracy", "mask_token_accuracy")}

        def on_train_batch_end(self, batch, logs=None):
            done = self.epoch_start + batch + 1
            last_of_epoch = batch + 1 == self.params["steps"]  # its sums are reset before the next epoch
            if last_of_epoch or done // args.logging_steps > self.logged_step // args.logging_steps:
                self.write_interval(done)

        def on_epoch_end(self, epoch, logs=None):
            with self.writer.as_default(step=self.logged_step):
                for name, value in (logs or {}).items():
                    if name.startswith("val_"):
                        tf.summary.scalar(f"eval/{name[len('val_'):]}", float(value))
            self.writer.flush()

    return TensorBoardScalars()


def read_scalars(log_dir):
    """{tag: {step: value}} from the TensorBoard files in `log_dir`; a step written twice (a resumed run
    repeats the steps after its last checkpoint) keeps the newer value."""
    import tensorflow as tf

    def written_at(path):  # events.out.tfevents.<unix time>.<host>...: the older file's values are replaced
        name = path.rsplit("/", 1)[-1]
        return int(name.split(".")[3]), name

    scalars = {}
    for path in sorted(tf.io.gfile.glob(f"{log_dir}/events.out.tfevents.*"), key=written_at):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return scalars


def plot_curves(log_dir, path):
    """Training and evaluation loss and accuracy at [MASK] against the step, as a PNG (local or gs://)."""
    import io

    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    import tensorflow as tf

    scalars = read_scalars(log_dir)
    figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(11, 4))
    for prefix, label, style in (("train", "training", "-"), ("eval", "evaluation", "o-")):
        for axes, name in ((loss_axes, "loss"), (accuracy_axes, "mask_token_accuracy")):
            points = sorted(scalars.get(f"{prefix}/{name}", {}).items())
            if points:
                axes.plot(*zip(*points), style, label=label)
    loss_axes.set(title="masked-LM loss", xlabel="optimizer step", ylabel="cross-entropy")
    accuracy_axes.set(title="accuracy at [MASK] inputs", xlabel="optimizer step", ylabel="top-1 accuracy")
    for axes in (loss_axes, accuracy_axes):
        axes.grid(alpha=0.3)
        axes.legend()
    figure.tight_layout()
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=100)
    plt.close(figure)
    with tf.io.gfile.GFile(path, "wb") as file:
        file.write(image.getvalue())


def summary_line(steps, tokens_per_step, logs, minutes):
    """One line that says how the run ended; the evaluation figures appear when there was evaluation data."""
    parts = [f"{steps:,} steps", f"{steps * tokens_per_step:,} tokens seen"]
    final = {name: values[-1] for name, values in logs.items() if values}
    if "val_loss" in final:
        parts += [
            f"eval loss {final['val_loss']:.4f}",
            f"perplexity {final['val_perplexity']:.2f}",
            f"masked accuracy {final['val_masked_accuracy']:.4f}",
            f"accuracy at [MASK] {final['val_mask_token_accuracy']:.4f}",
        ]
    elif "loss" in final:
        parts.append(f"train loss {final['loss']:.4f} (no --eval_dataset)")
    parts.append(f"wall time {minutes:.1f} min")
    return "Finished: " + ", ".join(parts) + "."


def hub_push_callback(hub, total_steps):
    import tf_keras

    class PushAtEpochEnd(tf_keras.callbacks.Callback):
        """Push a snapshot at each epoch end, in the background; none at the last, which the final push covers."""

        def on_epoch_end(self, epoch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            if step >= total_steps:
                return
            message = f"Epoch {epoch + 1}: step {step} of {total_steps}"
            if not hub.push_in_background(self.model, dict(logs or {}), message):
                print(f"Skipped the Hub push of epoch {epoch + 1}: the previous push is still uploading.")

    return PushAtEpochEnd()


def checkpoint_callback(args, manager):
    import tf_keras

    class SaveCheckpoints(tf_keras.callbacks.Callback):
        """A checkpoint every --save_steps optimizer steps and at the end of every epoch.

        The step is read from the device once per epoch and counted on the host in between: reading it
        after every batch would stall each step (on a TPU, each execution) until the device catches up.
        """

        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True  # the logs stay on the device too: nothing here reads them
            self.saved_step = None
            self.epoch_start = None

        def step(self):
            return int(self.model.optimizer.iterations.numpy())

        def save(self):
            self.saved_step = self.step()
            manager.save(checkpoint_number=self.saved_step)

        def on_train_begin(self, logs=None):
            if self.saved_step is None:
                self.saved_step = self.step()  # a resumed run starts from a saved step

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch_start = self.step()

        def on_train_batch_end(self, batch, logs=None):
            # `batch` is the index of the last step run in this epoch; with --steps_per_execution > 1 this
            # runs once per execution, so save on crossing a multiple of --save_steps.
            done = self.epoch_start + batch + 1
            if args.save_steps and done // args.save_steps > self.saved_step // args.save_steps:
                self.save()

        def on_epoch_end(self, epoch, logs=None):
            if self.step() != self.saved_step:
                self.save()

    return SaveCheckpoints()


def fit_segments(start_step, total_steps, steps_per_epoch):
    """The fit() calls that run optimizer steps start_step .. total_steps, as (first step, epoch, epochs, steps).

    fit() counts in epochs of equal length, and with --steps_per_execution > 1 a callback can only stop it
    between executions, so a run that starts or ends mid-epoch (a resumed run, a --max_steps) would
    overshoot. Instead a partial epoch gets a fit() call of its own and whole epochs share one.
    """
    segments, step = [], start_step
    while step < total_steps:
        epoch, offset = divmod(step, steps_per_epoch)
        if offset == 0 and total_steps - step >= steps_per_epoch:
            epochs = (total_steps - step) // steps_per_epoch
            segments.append((step, epoch, epochs, steps_per_epoch))
        else:
            segments.append((step, epoch, 1, min(steps_per_epoch - offset, total_steps - step)))
        step += segments[-1][2] * segments[-1][3]
    return segments


def fit_exact_steps(model, train_dataset_from, start_step, total_steps, steps_per_epoch, **fit_kwargs):
    """Run the optimizer steps start_step .. total_steps, evaluating at the end of every epoch.

    `train_dataset_from(step)` gives the training stream from that step on, so every fit() call continues
    the data (order and masks) exactly where the previous call, or the interrupted run, stopped.
    """
    logs = {}
    for first_step, epoch, epochs, steps in fit_segments(start_step, total_steps, steps_per_epoch):
        history = model.fit(
            train_dataset_from(first_step), initial_epoch=epoch, epochs=epoch + epochs, steps_per_epoch=steps, **fit_kwargs
        )
        for key, values in history.history.items():
            logs[key] = logs.get(key, []) + values
    return logs


def check_output_dir(args):
    """A finished model is only replaced on request (prepare_output_dir() does it, once all input checks pass).

    A local --output_dir that cannot be created or written is refused here, before any work; a gs:// one
    shows its permissions only when written to.
    """
    import tensorflow as tf

    output_dir = args.output_dir.rstrip("/")
    if "://" not in output_dir:
        existing = os.path.abspath(output_dir)
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            where = "is a file" if existing == os.path.abspath(output_dir) else f"lies under the file {existing}"
            raise UsageError(f"--output_dir {args.output_dir} {where}, not a folder; choose a folder path.")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UsageError(f"--output_dir {args.output_dir} cannot be written: {existing} is read-only.")
    if not tf.io.gfile.exists(f"{output_dir}/{FINISHED_RUN_MARKER}"):
        return
    if not args.overwrite_output_dir:
        raise UsageError(
            f"--output_dir {args.output_dir} already holds a trained model ({FINISHED_RUN_MARKER}); "
            "pass --overwrite_output_dir to replace it, or choose another folder."
        )


def run_settings(args, config, train_manifest, global_batch_size, total_steps):
    """What a checkpoint's step number means: resuming under other settings would continue another run."""
    architecture = {key: value for key, value in config.to_dict().items() if key != "transformers_version"}
    settings = {
        "train_records": train_manifest["records"],
        "max_length": train_manifest["max_length"],
        "global_batch_size": global_batch_size,
        "total_steps": total_steps,
        "seed": args.seed,
        "mlm_probability": args.mlm_probability,
        "shuffle_buffer_size": args.shuffle_buffer_size,
        "learning_rate": args.learning_rate,
        "warmup_ratio": args.warmup_ratio,
        "weight_decay_rate": args.weight_decay_rate,
        "config": architecture,
    }
    return json.loads(json.dumps(settings))  # as they read back from run_settings.json (JSON keys are strings)


def wait_for_every_worker(strategy):
    """A barrier: an all-reduce that returns once every worker of the cluster has reached it."""
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        tf.function(strategy.run)(lambda: tf.distribute.get_replica_context().all_reduce("sum", tf.constant(1.0)))


def checkpoint_dir(args):
    return f"{args.output_dir.rstrip('/')}/{CHECKPOINT_DIR}"


def prepare_output_dir(args, settings):
    """Start afresh, or check that the checkpoints there belong to this very run so they can be resumed.

    Replacing a finished run (--overwrite_output_dir) starts afresh: its checkpoints must not be resumed, and
    the folder must stop looking finished at once, so that an interruption of the new run is resumed when
    the same command runs again rather than refused. The settings of a new run are recorded next to its
    checkpoints; resuming under other settings would continue a different run, so it is refused.
    """
    import tensorflow as tf

    output_dir = args.output_dir.rstrip("/")
    folder = checkpoint_dir(args)
    path = f"{folder}/{RUN_SETTINGS_NAME}"

    def start_afresh():
        for name in (FINISHED_RUN_MARKER, TRAINING_LOG_NAME, CURVES_NAME, MODEL_CARD_NAME):
            if tf.io.gfile.exists(f"{output_dir}/{name}"):
                tf.io.gfile.remove(f"{output_dir}/{name}")
        # The PyTorch copy too: a run with --no_pytorch_export must not leave the replaced model's behind.
        for old_folder in (folder, f"{output_dir}/{TENSORBOARD_DIR}", f"{output_dir}/{PYTORCH_DIR}"):
            if tf.io.gfile.exists(old_folder):
                tf.io.gfile.rmtree(old_folder)

    if tf.io.gfile.exists(f"{output_dir}/{FINISHED_RUN_MARKER}"):  # check_output_dir() allowed replacing it
        start_afresh()
    if tf.train.latest_checkpoint(folder) and tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as file:
            saved = json.load(file)
        changed = sorted(key for key in settings.keys() | saved.keys() if settings.get(key) != saved.get(key))
        if not changed:
            return
        if not args.overwrite_output_dir:
            raise UsageError(
                f"--output_dir {args.output_dir} holds checkpoints of a run with other settings ({', '.join(changed)} "
                "differ), so resuming them would not continue that run; rerun its exact command, choose another "
                "folder, or pass --overwrite_output_dir to start afresh."
            )
        start_afresh()
    tf.io.gfile.makedirs(folder)
    temporary = f"{path}.tmp"
    with tf.io.gfile.GFile(temporary, "w") as file:
        file.write(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    tf.io.gfile.rename(temporary, path, overwrite=True)


def restore_checkpoint(args, masked_lm, optimizer):
    """Resume from the newest checkpoint in --output_dir, if any; returns its manager and the step to start at.

    A checkpoint holds the weights and the optimizer: its moments and its step count, which is also the
    learning-rate schedule's position and, through build_dataset(), the position in the data stream.
    """
    import tensorflow as tf

    checkpoint = tf.train.Checkpoint(model=masked_lm, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir(args), max_to_keep=args.save_total_limit)
    if manager.latest_checkpoint is None:
        return manager, 0
    try:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as error:
        raise UsageError(
            f"could not resume from {manager.latest_checkpoint}: {first_line(error)}; delete "
            f"{checkpoint_dir(args)} to start afresh."
        ) from None
    return manager, int(optimizer.iterations.numpy())


# The model types whose PyTorch copy tests/test_pytorch_export.py loads in transformers 5 and checks against the TF
# model. The name mapping is generic, but a type joins this list only once that test covers it.
PYTORCH_EXPORT_MODEL_TYPES = ("roberta", "roberta-prelayernorm", "bert")
PYTORCH_WEIGHTS_NAME = "model.safetensors"
PYTORCH_DIR = "pytorch"  # the PyTorch copy: a folder of its own that transformers 5 loads


def check_pytorch_export(args, config):
    """Refuse before training a config whose PyTorch copy would be unverified or a different model."""
    if args.no_pytorch_export:
        return
    if config.model_type not in PYTORCH_EXPORT_MODEL_TYPES:
        raise UsageError(
            f"the PyTorch copy ({PYTORCH_WEIGHTS_NAME}) is written for {', '.join(PYTORCH_EXPORT_MODEL_TYPES)} "
            f"models only, not {config.model_type}; pass --no_pytorch_export to save the TF weights alone."
        )
    if not config.tie_word_embeddings:
        raise UsageError(
            "the config sets tie_word_embeddings to false, but transformers' TF masked LMs share the word "
            "embeddings with the LM head whatever it says, and a PyTorch model built from that config would "
            "not; drop it from the config, or pass --no_pytorch_export."
        )


def pytorch_state_dict(masked_lm):
    """The TF masked LM's weights under PyTorch transformers' names and layouts, as numpy arrays.

    transformers' own TF-to-PyTorch mapping (the one behind from_pretrained(..., from_tf=True)) names each TF
    variable and says whether it is stored transposed: a Keras Dense kernel is (in, out), a torch Linear
    weight (out, in). Tied weights are written once, as PyTorch's save_pretrained writes them: the TF LM
    head reuses the word embeddings, and PyTorch ties its decoder to them (and the decoder's bias to the
    head's `bias`) when it loads, so the file holds e.g. `lm_head.bias` but no `lm_head.decoder.*`.
    """
    from transformers.modeling_tf_pytorch_utils import TransposeType, convert_tf_weight_name_to_pt_weight_name

    config = masked_lm.config
    # TF RoBERTa numbers positions from a padding index fixed at 1, PyTorch RoBERTa from pad_token_id: with
    # another id every position would shift in PyTorch. build_config() refuses it; never write such a copy.
    if config.model_type in FIXED_PADDING_INDEX_MODELS and config.pad_token_id != 1:
        raise UsageError(
            f"cannot write {PYTORCH_WEIGHTS_NAME}: pad_token_id is {config.pad_token_id}, but TF "
            f"{config.model_type} assumes 1, so PyTorch would number the positions differently; rerun with "
            "--no_pytorch_export to save the TF weights alone."
        )
    state_dict = {}
    for weight in masked_lm.weights:
        name, transpose = convert_tf_weight_name_to_pt_weight_name(weight.name, tf_weight_shape=weight.shape)
        if transpose not in (TransposeType.NO, TransposeType.SIMPLE):  # convolutions: no supported model has any
            raise ValueError(f"the TF weight {weight.name} needs a {transpose.value} transpose, not handled here")
        if name in state_dict:
            raise ValueError(f"two TF weights map to the PyTorch name {name}")
        array = weight.numpy()
        state_dict[name] = array.T.copy() if transpose is TransposeType.SIMPLE else array
    return state_dict


def write_pytorch_copy(masked_lm, tokenizer, folder):
    """<folder>/pytorch: config, tokenizer and model.safetensors with PyTorch names and layouts, a folder that
    transformers 5 loads as it is; no torch is needed here.

    A folder of its own, not beside tf_model.h5: transformers 4.57's TF loader prefers a model.safetensors it
    finds there, and fails on PyTorch-format files (its bug, not to be fixed), so the TF model would no longer
    load by default.
    """
    from safetensors.numpy import save_file

    copy = os.path.join(folder, PYTORCH_DIR)
    os.makedirs(copy, exist_ok=True)
    masked_lm.config.save_pretrained(copy)
    tokenizer.save_pretrained(copy)
    # "pt": the format transformers 5 loads.
    save_file(pytorch_state_dict(masked_lm), os.path.join(copy, PYTORCH_WEIGHTS_NAME), metadata={"format": "pt"})


def save(model, tokenizer, output_dir, pytorch_export=True):
    """Write the model and tokenizer so that an interruption can never leave a folder that looks finished.

    save_pretrained() writes through the local filesystem, so everything is written to a staging folder
    first (inside a local output folder; a temporary one for gs://) and then published file by file,
    config.json last: the folder counts as finished once it holds config.json, and by then every other
    file is complete. Each file appears whole: a rename within one filesystem is atomic, and a GCS object
    exists only once fully uploaded.
    """
    import tensorflow as tf

    output_dir = output_dir.rstrip("/")
    local = "://" not in output_dir
    tf.io.gfile.makedirs(output_dir)
    with tempfile.TemporaryDirectory(dir=output_dir if local else None, prefix=".saving-") as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if pytorch_export:  # staged like the rest, so it is published before config.json
            write_pytorch_copy(model, tokenizer, staging)
        for name in sorted(os.listdir(staging), key=lambda name: (name == FINISHED_RUN_MARKER, name)):
            source, target = os.path.join(staging, name), f"{output_dir}/{name}"
            if local:
                if os.path.isdir(target):  # a replaced run's PyTorch copy
                    shutil.rmtree(target)
                os.replace(source, target)
            elif os.path.isdir(source):
                for inner in sorted(os.listdir(source)):
                    tf.io.gfile.makedirs(target)
                    tf.io.gfile.copy(os.path.join(source, inner), f"{target}/{inner}", overwrite=True)
            else:
                tf.io.gfile.copy(source, target, overwrite=True)


def main(args):
    check_args(args)
    check_gcs_paths(
        {"--train_dataset": args.train_dataset, "--eval_dataset": args.eval_dataset, "--output_dir": args.output_dir}
    )
    with tensorflow_startup_log_held_back():
        strategy = build_strategy(args)  # first: logical CPU replicas must be set before TF starts its runtime
    import tensorflow as tf
    import tf_keras

    check_output_dir(args)
    tokenizer = load_tokenizer(args.tokenizer, args.trust_remote_code)
    train_manifest = read_manifest(args.train_dataset, "--train_dataset")
    eval_manifest = read_manifest(args.eval_dataset, "--eval_dataset") if args.eval_dataset else None
    check_data(args, tokenizer, train_manifest, eval_manifest)
    max_length = train_manifest["max_length"]

    global_batch_size = args.per_replica_batch_size * strategy.num_replicas_in_sync
    # One input pipeline per host, each with its own shard files, batching for the replicas of its host.
    pipelines = input_pipeline_count(strategy)
    per_pipeline_batch = global_batch_size // pipelines
    replicas_per_pipeline = strategy.num_replicas_in_sync // pipelines
    train_files, steps_per_epoch = split_between_pipelines(
        train_manifest, "--train_dataset", pipelines, per_pipeline_batch
    )
    if steps_per_epoch == 0:
        raise UsageError(
            f"the global batch of {global_batch_size} sequences ({args.per_replica_batch_size} x "
            f"{strategy.num_replicas_in_sync} replicas) is larger than the {train_manifest['records']} train "
            f"sequences{f' split between {pipelines} hosts' if pipelines > 1 else ''}; lower "
            "--per_replica_batch_size or add data."
        )
    eval_files, eval_steps = None, 0
    if eval_manifest:
        eval_files, eval_steps = split_between_pipelines(
            eval_manifest, "--eval_dataset", pipelines, per_pipeline_batch
        )
        if eval_steps == 0:
            raise UsageError(
                f"the global batch of {global_batch_size} sequences is larger than the {eval_manifest['records']} "
                "eval sequences; lower --per_replica_batch_size or add evaluation data."
            )
    total_steps = args.num_epochs * steps_per_epoch
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)

    tf_keras.utils.set_random_seed(args.seed)
    if args.bfloat16:
        tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    config = build_config(args, tokenizer, max_length)
    check_pytorch_export(args, config)
    chief = is_chief(strategy)

    def card(trainer, metrics):  # the model card of this run, once `trainer` has taken its steps so far
        manifests = (train_manifest, eval_manifest)
        planned_steps = (total_steps, steps_per_epoch)
        return model_card(args, config, tokenizer, manifests, global_batch_size, planned_steps, trainer, metrics)

    # Before anything is written or built: a Hub problem (bad id, no login, no network) should fail fast.
    hub = HubPusher(args, tokenizer, max_length, card) if args.hub_model_id and chief else None
    if chief:
        prepare_output_dir(args, run_settings(args, config, train_manifest, global_batch_size, total_steps))
    wait_for_every_worker(strategy)  # nobody reads the checkpoints while the chief may still be clearing them

    def train_dataset_from(step):
        """The training stream from optimizer step `step` on, each host reading its own shards."""
        epoch, batch = divmod(step, steps_per_epoch)

        def pipeline_dataset(context):
            return build_dataset(
                train_files[context.input_pipeline_id], tokenizer, args, max_length,
                context.get_per_replica_batch_size(global_batch_size), training=True, start_epoch=epoch,
                start_batch=batch * replicas_per_pipeline, batches_per_epoch=steps_per_epoch * replicas_per_pipeline,
                pipeline=context.input_pipeline_id,
            )  # fmt: skip

        return strategy.distribute_datasets_from_function(pipeline_dataset)

    def eval_pipeline_dataset(context):
        return build_dataset(
            eval_files[context.input_pipeline_id], tokenizer, args, max_length,
            context.get_per_replica_batch_size(global_batch_size), training=False,
            batches_per_epoch=eval_steps * replicas_per_pipeline, pipeline=context.input_pipeline_id,
        )  # fmt: skip

    eval_dataset = strategy.distribute_datasets_from_function(eval_pipeline_dataset) if eval_manifest else None
    started = time.perf_counter()
    callbacks = training_callbacks(args, hub, total_steps) if chief else []  # only the chief logs and pushes
    masked_lm, trainer = build_model(config, args, total_steps, strategy, tokenizer.mask_token_id)
    tokens_per_step = global_batch_size * max_length
    manager, start_step = restore_checkpoint(args, masked_lm, trainer.optimizer)
    print(
        f"Training {type(masked_lm).__name__} ({masked_lm.count_params():,} parameters, {args.mlm_head} LM head) on "
        f"{strategy.num_replicas_in_sync} replica(s) of {type(strategy).__name__}: {total_steps} steps of "
        f"{global_batch_size} x {max_length} tokens; {train_manifest['records']} train sequences."
    )
    if start_step:
        print(f"Resuming from {manager.latest_checkpoint} at step {start_step} of {total_steps}.")
    callbacks.append(tensorboard_callback(args, tokens_per_step, writes=chief))
    if not chief:
        # Saving a checkpoint may take part in the cluster's collective ops, so every worker saves; the
        # others write into a scratch folder of their own, deleted at the end.
        scratch = tempfile.mkdtemp(prefix="worker-checkpoints-")
        manager = tf.train.CheckpointManager(manager.checkpoint, scratch, max_to_keep=1)
    try:
        logs = fit_exact_steps(
            trainer,
            train_dataset_from,
            start_step,
            total_steps,
            steps_per_epoch,
            validation_data=eval_dataset,
            validation_steps=eval_steps or None,
            callbacks=callbacks + [checkpoint_callback(args, manager)],
            verbose=1 if sys.stdout.isatty() else 2,  # a progress bar on a terminal, one line per epoch in a log
        )
    except tf.errors.DataLossError as error:
        files = train_manifest["files"] + (eval_manifest["files"] if eval_manifest else [])
        corrupt = find_corrupt_shard(files) or "one of the shards"
        raise UsageError(
            f"{corrupt} is corrupt ({tf_error_text(error)}); rerun prepare_tfrecord_shards.py, "
            f"then this command: it resumes from the newest checkpoint in {args.output_dir}."
        ) from None
    steps = int(trainer.optimizer.iterations.numpy())
    if not chief:
        tf.io.gfile.rmtree(manager.directory)
        print(f"Worker done after {steps} steps; the chief saves the model.")
        return trainer, logs
    tokenizer.model_max_length = max_length  # the longest input the position table accepts
    save(masked_lm, tokenizer, args.output_dir, pytorch_export=not args.no_pytorch_export)
    final_card = card(trainer, {key: values[-1] for key, values in logs.items()})
    write_model_card(final_card, args.output_dir)
    output_dir = args.output_dir.rstrip("/")
    plot_curves(f"{output_dir}/{TENSORBOARD_DIR}", f"{output_dir}/{CURVES_NAME}")
    print(f"Saved the model and tokenizer to {args.output_dir}, the curves to {output_dir}/{CURVES_NAME}.")
    minutes = (time.perf_counter() - started) / 60
    print(summary_line(steps, tokens_per_step, logs, minutes) + (f" (resumed at step {start_step})" if start_step else ""))
    if hub is not None:
        hub.push_final(trainer, final_card, f"Final model: {steps} steps")
    return trainer, logs


if __name__ == "__main__":
    arguments = parse_args()
    try:
        main(arguments)
    except UsageError as error:
        sys.exit(f"run_mlm.py: error: {error}")
