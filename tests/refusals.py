"""Bad input, run as the user would: a script in a subprocess, with arguments, or in this process
through its command line's entry (script_in_process) where a subprocess would add only a start-up.
The machinery the bad-input tests of test_train_unigram.py, test_prepare_shards.py, test_run_mlm.py,
test_corpus_formats.py and test_tpu_runtime.py (a TPU that cannot start, on machines made of files)
share.

Every case checks the same four promises (see `refused`): a non-zero exit; one line on stderr,
starting `<script>.py: error:` and naming the bad value; no traceback; and the output folder as it
was before (absent, or unchanged). Each distinct bad input is one test id; to list them:

    pytest tests -k "bad_flag_or_file or refuses" --collect-only -q

The `bad_inputs` fixture (conftest.py) holds the good and bad files the cases point at.
"""

import contextlib
import importlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import MAX_LENGTH, TINY_MODEL

# prepare_tfrecord_shards.py's progress bar, there when the problem showed only
# after some shards were written.
PROGRESS_BAR = re.compile(r"^Writing \w+ shards: ")
# Readable: a few lines of a terminal, paths included, not a library's dump of everything it knows.
READABLE_LENGTH = 600
# pytest's temporary folder for a test: /tmp/pytest-of-USER/pytest-N/ (and popen-gwN/ under xdist)
PYTEST_FOLDER = re.compile(r"/\S*?/pytest-of-[^/]+/pytest-\d+/(?:popen-gw\d+/)?")


def snapshot(path):
    """A folder's files and subfolders with their bytes, a file's bytes, or None when nothing is
    there."""
    if path.is_file():
        return path.read_bytes()
    if not path.exists():
        return None
    return {
        str(item.relative_to(path)): item.read_bytes() if item.is_file() else None
        for item in path.rglob("*")
    }


def script_in_process(script, *args):
    """`script` as its `__main__` block runs it, in this process, its output captured: what
    `run_script` returns, without a process start-up and TensorFlow's (some seconds a case). For
    checks made after TensorFlow is loaded; the cases run as subprocesses show that the command
    line turns the same error into the same one line, and that TensorFlow's start-up log stays
    held back."""
    from mlm_pipeline.errors import exit_on_usage_error

    module = importlib.import_module(script.removesuffix(".py"))
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            exit_on_usage_error(module.main, module.parse_args([str(arg) for arg in args]), script)
            returncode = 0
        except SystemExit as exit:
            if isinstance(exit.code, str):  # sys.exit(message): Python prints it and exits 1
                print(exit.code, file=sys.stderr)
                returncode = 1
            else:  # argparse's exit 2, or sys.exit(None)
                returncode = exit.code or 0
    return subprocess.CompletedProcess(
        [script, *args], returncode, stdout.getvalue(), stderr.getvalue()
    )


def refused(run_script, script, args, output, *needles, exit_code=1):
    """Run `script` with bad `args` and check the four promises; `output` is where it would
    write."""
    before = snapshot(output)
    result = run_script(script, *args)
    stderr = result.stderr
    assert result.returncode == exit_code, f"exit {result.returncode}; stderr: {stderr[-3000:]}"
    assert "Traceback" not in stderr, stderr[-3000:]
    # tqdm's carriage returns end lines too
    lines = [line for line in stderr.splitlines() if line.strip()]
    # TensorFlow's start-up log is held back by the scripts, so it must not show here either.
    lines = [line for line in lines if not PROGRESS_BAR.match(line)]
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: "), stderr[-3000:]
    # measured with the test's own temporary folders cut to a user's short path: a message naming
    # five of them must not fail for the length of pytest's folder names
    measured = PYTEST_FOLDER.sub("/tmp/", lines[0])
    assert len(measured) <= READABLE_LENGTH, f"{len(measured)} characters: {measured}"
    for needle in needles:
        assert str(needle) in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert snapshot(output) == before, f"{output} was changed"
    return lines[0]


# --------------------------------------------------------------------------------------------------
# Flags and input files: (command, what the error line must name, exit code). {out} is a fresh
# folder of the test's own; argparse exits 2, the scripts' own checks 1.

UNIGRAM = "train_unigram.py --train_file {corpus} --vocab_size 100 --output_dir {out}"
PREPARE = "prepare_tfrecord_shards.py --train_file {corpus} --tokenizer_name_or_path {tokenizer}"
PREPARE += f" --output_dir {{out}} --max_length {MAX_LENGTH}"
RUN_MLM = "run_mlm.py --no_tpu --train_dataset {train_shards} --tokenizer {tokenizer}"
RUN_MLM += f" --max_steps 1 --output_dir {{out}} --config_overrides {TINY_MODEL}"


def case(name, command, *needles, exit_code=1):
    return pytest.param(command, needles, exit_code, id=name)


def refused_command(run_script, bad_inputs, tmp_path, command, needles, exit_code):
    """One case: `command` and `needles` with their {names} filled in from `bad_inputs` (and {out},
    a folder of the test's own), refused as `refused` checks."""
    names = {**bad_inputs, "out": tmp_path / "out"}
    script, *args = [word.format(**names) for word in command.split()]
    output = (
        Path(args[args.index("--output_dir") + 1]) if "--output_dir" in args else tmp_path / "out"
    )
    refused(
        run_script,
        script,
        args,
        output,
        *[needle.format(**names) for needle in needles],
        exit_code=exit_code,
    )
