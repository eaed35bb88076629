"""The front works without TensorFlow: each script's `--help`, every one-line refusal of a bad flag
or of flags that cannot go together, and every module the scripts read before their engine, run
where TensorFlow and tf_keras cannot be imported.

The scripts import their engine (the modules with TensorFlow at the top) in main() only, after
tpu_runtime.prepare_runtime(): PJRT's variables must be set before TensorFlow's first import, and a
user's typo should not wait seconds for TensorFlow. Each case runs in a subprocess whose
sitecustomize.py (in a folder of the test's own, first on PYTHONPATH) puts a finder at the head of
sys.meta_path that raises ImportError for tensorflow and tf_keras: an import of either anywhere on
the way fails the case with its traceback.
"""

import json
import subprocess
import sys

import pytest
from helpers import REPO, subprocess_env
from refusals import refused

# Made unimportable in the front's subprocesses.
ENGINE_PACKAGES = ("tensorflow", "tf_keras")

SITECUSTOMIZE = f"""
import sys

BLOCKED = {ENGINE_PACKAGES!r}


class NoEngine:
    \"\"\"A meta-path finder that refuses TensorFlow and tf_keras, as if not installed.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is made unimportable for the front's test", name=name)
        return None


sys.meta_path.insert(0, NoEngine())
"""

SCRIPTS = ("train_unigram.py", "prepare_tfrecord_shards.py", "run_mlm.py", "run_classifier.py")

# The modules the scripts import before their engine: settings and their checks, the TPU's start-up,
# storage's path checks and probe (gcs_probe.py itself runs in the probe's child process, which
# loads TensorFlow), the output folder's check, the Hub's flag checks.
FRONT_MODULES = (
    "errors",
    "settings",
    "tf_startup",
    "hardware",
    "tpu_runtime",
    "tpu_slice",
    "storage",
    "model_folder",
    "hub",
    "segments",
    "contract",
    "cards",
    "corpus",
    "labelled_data",
    "hub_datasets",
)


@pytest.fixture(scope="module")
def front_env(tmp_path_factory):
    """The environment of a process where TensorFlow and tf_keras cannot be imported."""
    folder = tmp_path_factory.mktemp("no_tensorflow")
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = subprocess_env()
    env["PYTHONPATH"] = str(folder)
    return env


def run_front(env, *command, cwd=REPO):
    return subprocess.run(
        [sys.executable, *map(str, command)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("package", ENGINE_PACKAGES)
def test_the_engine_cannot_be_imported_there(front_env, package):
    """What the other tests rest on: in their processes, TensorFlow and tf_keras are not there."""
    result = run_front(front_env, "-c", f"import {package}")
    assert result.returncode == 1
    assert f"ImportError: {package} is made unimportable" in result.stderr


@pytest.mark.parametrize("module", FRONT_MODULES)
def test_a_front_module_imports_without_tensorflow(front_env, module):
    code = (
        f"import json, sys\nfrom mlm_pipeline import {module}\nprint(json.dumps(list(sys.modules)))"
    )
    result = run_front(front_env, "-c", code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not set(ENGINE_PACKAGES) & set(json.loads(result.stdout))


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_without_tensorflow(front_env, script):
    result = run_front(front_env, REPO / script, "--help")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("usage: ") and "--help" in result.stdout
    assert result.stderr == ""


# Bad input refused while the command line is read: (script, its arguments, what the one line
# names, the exit status: argparse's 2 for a flag's value or a missing flag, 1 for a rule the
# settings check). {out} is the test's own folder, which must stay as it was.
MLM = "--train_dataset shards/train --tokenizer tokenizer --output_dir {out}"
CLASSIFIER = "--model_name_or_path model --output_dir {out}"
UNIGRAM = "--train_file corpus.txt --output_dir {out}"
PREPARE = "--train_file corpus.txt --tokenizer_name_or_path tokenizer --output_dir {out}"
REFUSALS = [
    ("run_mlm.py", f"{MLM} --no_tpu --per_replica_batch_size 0", "--per_replica_batch_size", 2),
    ("run_mlm.py", "--tokenizer tokenizer --output_dir {out}", "--train_dataset", 2),
    ("run_mlm.py", f"{MLM} --cpu_replicas 2", "--cpu_replicas 2 splits this CPU", 1),
    (
        "run_mlm.py",
        f"{MLM} --no_tpu --cpu_replicas 2 --jit_compile",
        "--jit_compile cannot be combined with --cpu_replicas 2",
        1,
    ),
    (
        "run_mlm.py",
        "--train_dataset shards/train --no_tpu --output_dir {out}",
        "--tokenizer is needed to pretrain from scratch",
        1,
    ),
    (
        "run_mlm.py",
        f"{MLM} --no_tpu --max_eval_samples 8",
        "--max_eval_samples 8 limits the evaluation",
        1,
    ),
    ("run_mlm.py", f"{MLM} --tpu_zone us-east1-c", "--tpu_zone us-east1-c", 1),
    ("run_classifier.py", f"{CLASSIFIER} --gcp_project my-project", "--gcp_project my-project", 1),
    (
        "run_classifier.py",
        f"{CLASSIFIER} --no_tpu --per_replica_batch_size 0",
        "--per_replica_batch_size",
        2,
    ),
    ("run_classifier.py", "--model_name_or_path model --no_tpu", "--output_dir", 2),
    ("run_classifier.py", f"{CLASSIFIER} --no_tpu --warmup_ratio 1.5", "--warmup_ratio", 2),
    (
        "run_classifier.py",
        f"{CLASSIFIER} --no_tpu --train_file train.tsv",
        "--train_file needs its partner",
        1,
    ),
    ("run_classifier.py", f"{CLASSIFIER} --no_tpu --hub_private", "--hub_private needs", 1),
    ("train_unigram.py", f"{UNIGRAM} --batch_size 0", "--batch_size", 2),
    ("train_unigram.py", "--train_file corpus.txt", "--output_dir", 2),
    ("train_unigram.py", f"{UNIGRAM} --vocab_size 3", "--vocab_size 3 leaves no room", 1),
    ("train_unigram.py", f"{UNIGRAM} --hub_private", "--hub_private only applies", 1),
    ("train_unigram.py", f"{UNIGRAM} --push_to_hub", "--push_to_hub needs --hub_model_id", 1),
    ("prepare_tfrecord_shards.py", f"{PREPARE} --max_length 0", "--max_length", 2),
    (
        "prepare_tfrecord_shards.py",
        "--train_file corpus.txt --output_dir {out}",
        "--tokenizer_name_or_path",
        2,
    ),
    ("prepare_tfrecord_shards.py", f"{PREPARE} --split dev", "--split 'dev'", 1),
    (
        "prepare_tfrecord_shards.py",
        f"{PREPARE} --direct_num_workers 2",
        "Beam pipeline options need --runner",
        2,
    ),
]


@pytest.mark.parametrize(
    "script, arguments, needle, exit_code",
    REFUSALS,
    ids=[f"{script} {needle}" for script, _, needle, _ in REFUSALS],
)
def test_a_refusal_without_tensorflow(front_env, tmp_path, script, arguments, needle, exit_code):
    """One line, `<script>: error: ...`, naming what was wrong; its exit status; nothing written:
    refusals.refused's promises, with TensorFlow and tf_keras not there."""
    output = tmp_path / "out"
    refused(
        lambda name, *args: run_front(front_env, REPO / name, *args, cwd=tmp_path),
        script,
        arguments.format(out=output).split(),
        output,
        needle,
        exit_code=exit_code,
    )
