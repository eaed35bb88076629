"""TensorFlow's start-up (mlm_pipeline/tf_startup.py), offline: its log held back in a file of its
own, which a start that fails, crashes or is slow names, and which a start that succeeds leaves
behind nowhere; and steps 1 and 2, which keep TensorFlow's TPU build off the TPU.

The crashes and the environments run the real scripts in a subprocess, with a stand-in `tensorflow`
package first on PYTHONPATH (tests/helpers.py, fake_tensorflow): it aborts as a broken install does
at import, or records the environment it was imported in and ends the process there.
"""

import faulthandler
import json
import os
import re
import signal
import tempfile
import time
from pathlib import Path

import pytest
from helpers import fake_tensorflow, flags, mlm_flags, prepare_flags, run_command, subprocess_env

from mlm_pipeline import tf_startup
from mlm_pipeline.errors import UsageError

# What a TensorFlow that dies at import prints last (a FATAL line of its C++ log), then the abort.
ABORTING_TENSORFLOW = """
import os
os.write(2, b"F0000 00:00:1795877719.181763  14190 platform.cc:42] fake TensorFlow gives up\\n")
os.abort()
"""
# A TensorFlow import that records the variables it was imported with (one JSON line a process,
# the probes' child processes too) and ends the process there, status 0.
RECORDING_TENSORFLOW = """
import json, os, sys
with open(os.environ["RECORD_TENSORFLOW_IMPORTS"], "a") as record:
    variables = {"TPU_LOAD_LIBRARY": os.environ.get("TPU_LOAD_LIBRARY")}
    record.write(json.dumps({"argv": sys.argv, **variables}) + "\\n")
sys.stdout.flush()
os._exit(0)
"""
KEPT = re.compile(r"is kept in (\S+)$", re.MULTILINE)


@pytest.fixture
def temporary_folder(tmp_path, monkeypatch):
    """The temporary folder of this process (tempfile's), a test's own, empty."""
    folder = tmp_path / "temporary"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_a_start_that_succeeds_prints_nothing_and_leaves_no_file(temporary_folder, capfd):
    faulthandler_was_on = faulthandler.is_enabled()
    with tf_startup.tensorflow_startup_log_held_back() as log:
        os.write(2, b"I0000 start-up chatter\n")
        held = Path(log.path)
        assert held.parent == temporary_folder
        assert re.fullmatch(rf"tensorflow-startup-{os.getpid()}-\w+\.log", held.name)
        assert held.read_text() == log.text() == "I0000 start-up chatter\n"
    assert capfd.readouterr().err == ""
    assert list(temporary_folder.iterdir()) == []
    assert faulthandler.is_enabled() == faulthandler_was_on


def test_a_failed_start_shows_its_log_and_keeps_the_file(temporary_folder, capfd):
    with pytest.raises(RuntimeError):
        with tf_startup.tensorflow_startup_log_held_back() as log:
            os.write(2, b"E0000 the reason start-up failed\n")
            raise RuntimeError("failed")
    assert capfd.readouterr().err == (
        "E0000 the reason start-up failed\n"
        f"TensorFlow's start-up log, shown above, is kept in {log.path}\n"
    )
    assert Path(log.path).read_text() == "E0000 the reason start-up failed\n"


def test_a_usage_error_keeps_the_file_only_when_its_line_names_it(temporary_folder, capfd):
    """The user's mistake is reported alone; a line that points at the log (tpu_runtime's, for a
    TPU that does not start) keeps it."""
    with pytest.raises(UsageError):
        with tf_startup.tensorflow_startup_log_held_back():
            os.write(2, b"I0000 start-up chatter\n")
            raise UsageError("the user's mistake")
    assert list(temporary_folder.iterdir()) == []
    with pytest.raises(UsageError) as raised:
        with tf_startup.tensorflow_startup_log_held_back() as log:
            os.write(2, b"E0000 why the TPU did not start\n")
            raise UsageError(f"the TPU did not start; {log.named('advice')}")
    assert (
        str(raised.value) == f"the TPU did not start; TensorFlow's start-up log: {log.path}; advice"
    )
    assert capfd.readouterr().err == ""
    assert Path(log.path).read_text() == "E0000 why the TPU did not start\n"


@pytest.mark.parametrize("pjrt_device, starting", [(None, "TensorFlow"), ("TPU", "the TPU")])
def test_a_slow_start_names_its_log_once_and_goes_on(
    temporary_folder, capfd, monkeypatch, pjrt_device, starting
):
    if pjrt_device is None:
        monkeypatch.delenv("PJRT_DEVICE", raising=False)
    else:
        monkeypatch.setenv("PJRT_DEVICE", pjrt_device)
    printed = ""
    with tf_startup.tensorflow_startup_log_held_back(patience=0.2) as log:
        os.write(2, b"I0000 waiting for the metadata server\n")
        message = f"still starting {starting} after 0.2 s; TensorFlow's log so far: {log.path}\n"
        deadline = time.monotonic() + 60
        while message not in printed and time.monotonic() < deadline:
            time.sleep(0.05)
            printed += capfd.readouterr().err
        time.sleep(0.5)  # more than the patience again: it is said once
    printed += capfd.readouterr().err
    assert printed == message
    assert list(temporary_folder.iterdir()) == []  # the start succeeded in the end


def test_stderr_held_back_holds_nothing_when_inactive(temporary_folder, capfd):
    """TF_CPP_MIN_LOG_LEVEL=0 asks for TensorFlow's whole log as it comes."""
    with tf_startup.stderr_held_back(active=False) as log:
        os.write(2, b"I0000 shown at once\n")
    assert log.path is None and log.named("advice") == "advice"
    assert capfd.readouterr().err == "I0000 shown at once\n"
    assert list(temporary_folder.iterdir()) == []


def crash_command(script, corpus, tokenizer_dir, shards_dir, output):
    if script == "run_mlm.py":
        return mlm_flags(shards_dir / "train", tokenizer_dir, output)
    return prepare_flags(corpus, tokenizer_dir, "train", output)


@pytest.mark.parametrize("script", ["run_mlm.py", "prepare_tfrecord_shards.py"])
def test_an_abort_at_tensorflows_import_leaves_its_log_and_names_it(
    script, corpus, tokenizer_dir, shards_dir, tmp_path
):
    """The reported failures on TPU VMs are segfaults and aborts at import: the process dies, and
    the user is still told where TensorFlow's log is, which holds its last words and the Python
    traceback (faulthandler)."""
    env = subprocess_env()
    env["PYTHONPATH"] = str(fake_tensorflow(tmp_path / "packages", ABORTING_TENSORFLOW))
    env["TMPDIR"] = str(tmp_path / "temporary")
    os.mkdir(env["TMPDIR"])
    args = crash_command(script, corpus, tokenizer_dir, shards_dir, tmp_path / "out")
    result = run_command(script, *args, env=env)
    assert result.returncode == -signal.SIGABRT, result.stderr[-3000:]
    last_line = result.stderr.splitlines()[-1]
    assert last_line.startswith("the process ended during TensorFlow's start-up; ")
    (kept,) = KEPT.findall(last_line)
    assert Path(kept).parent == Path(env["TMPDIR"])
    log = Path(kept).read_text()
    assert "fake TensorFlow gives up" in log
    assert "Fatal Python error: Aborted" in log
    assert f'{script}", line' in log  # the script's frame, in faulthandler's traceback
    assert log in result.stderr  # replayed, above the line that names it


def test_with_the_whole_log_asked_for_an_abort_shows_its_traceback_at_once(
    corpus, tokenizer_dir, shards_dir, tmp_path
):
    """TF_CPP_MIN_LOG_LEVEL=0: nothing is held back, so no file; faulthandler's traceback follows
    TensorFlow's last words on stderr."""
    env = subprocess_env()
    env["PYTHONPATH"] = str(fake_tensorflow(tmp_path / "packages", ABORTING_TENSORFLOW))
    env["TMPDIR"] = str(tmp_path / "temporary")
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    os.mkdir(env["TMPDIR"])
    args = crash_command("run_mlm.py", corpus, tokenizer_dir, shards_dir, tmp_path / "out")
    result = run_command("run_mlm.py", *args, env=env)
    assert result.returncode == -signal.SIGABRT, result.stderr[-3000:]
    assert "fake TensorFlow gives up\nFatal Python error: Aborted" in result.stderr
    assert "is kept in" not in result.stderr
    assert os.listdir(env["TMPDIR"]) == []


@pytest.mark.parametrize(
    "script, args",
    [
        # gs://: the corpus is listed with TensorFlow, after its Cloud Storage probe (a child
        # process) has looked the path up
        ("train_unigram.py", flags(train_file="gs://bucket/corpus.txt", vocab_size=100)),
        ("prepare_tfrecord_shards.py", None),
    ],
)
def test_steps_1_and_2_import_tensorflow_off_the_tpu(script, args, corpus, tokenizer_dir, tmp_path):
    """On a TPU VM, TensorFlow's TPU build imported without TPU_LOAD_LIBRARY=0 takes the TPU: a
    step 3 started meanwhile would be refused."""
    env = subprocess_env()
    env.pop("TPU_LOAD_LIBRARY", None)
    env["PYTHONPATH"] = str(fake_tensorflow(tmp_path / "packages", RECORDING_TENSORFLOW))
    env["RECORD_TENSORFLOW_IMPORTS"] = str(tmp_path / "imports.jsonl")
    env["TMPDIR"] = str(tmp_path)
    if args is None:
        args = prepare_flags(corpus, tokenizer_dir, "train", tmp_path / "out")
    else:
        args = [*args, "--output_dir", tmp_path / "out"]
    result = run_command(script, *args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(env["RECORD_TENSORFLOW_IMPORTS"]) as record:
        imports = [json.loads(line) for line in record]
    assert any(entry["argv"][0].endswith(script) for entry in imports), imports
    assert [entry["TPU_LOAD_LIBRARY"] for entry in imports] == ["0"] * len(imports)
