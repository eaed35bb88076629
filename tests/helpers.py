"""What the tests share besides fixtures: the tiny corpus and model sizes, each script's flags, and
running a script as a user would (a subprocess, killed on cue for the crash tests). The fixtures
that build files once per session (corpus, tokenizer, shards) stay in conftest.py; a test module
imports these by name: `from helpers import mlm_flags, run_command`.
"""

import ast
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

VOCAB_SIZE = 400

MAX_LENGTH = 32

SHARD_SIZE = 100  # train shards: a few full ones and a smaller last one

TINY_MODEL = "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64"

_WORDS = """
the a of and to in is was for on that with as by at from it an be this which or are were has had
have not but all they their one more time new two first after other also some when into its only
than can then most about over under between before city river house garden school music story king
queen water light stone bridge market forest mountain island village road tower field summer winter
morning evening people children teacher farmer doctor writer painter sailor museum library harbour
window letter small large old young green quiet bright dark famous ancient northern southern long
short heavy narrow built opened wrote played walked found carried painted crossed visited described
followed remembered answered gathered
""".split()

_RARE = [
    "café",
    "naïve",
    "Zürich",
    "façade",
    "1984",
    "2023",
    "42",
    "—",
    "déjà",
    "jalapeño",
    "ｆｕｌｌ",
]


def _sentence(rng):
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 18))]
    if rng.random() < 0.15:
        words.insert(rng.randrange(len(words)), rng.choice(_RARE))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice([".", ".", ".", "!", "?", ";"])


# run_classifier.py's task in the tests: a word of one list or the other carries the label.
POSITIVE = ("bright", "famous", "quiet", "green", "young")
NEGATIVE = ("dark", "heavy", "narrow", "ancient", "old")
POSITIVE_SHARE = 0.6  # the majority class: 0.6 of the examples, which the classifier must beat


def make_corpus_lines(count, seed):
    """`count` lines of English-ish prose; some lines are empty or hold only whitespace."""
    rng = random.Random(seed)
    lines = []
    for index in range(count):
        if index % 9 == 4:
            lines.append("")
        elif index % 23 == 11:
            lines.append(" \t  ")
        else:
            lines.append(" ".join(_sentence(rng) for _ in range(rng.randint(1, 3))))
    return lines


def labelled_rows(count, seed):
    """`count` (sentence, label) pairs: a line of the test corpus without any of the label words,
    with one positive word (label 1) or one negative word (label 0) put in at random."""
    rng = random.Random(seed)
    lines = [line for line in make_corpus_lines(2 * count, seed) if line.strip()]
    rows = []
    for line in lines[:count]:
        label = int(rng.random() < POSITIVE_SHARE)
        words = [w for w in line.split() if w.strip(".!?;").lower() not in POSITIVE + NEGATIVE]
        words = words[:10]
        words.insert(rng.randrange(len(words) + 1), rng.choice(POSITIVE if label else NEGATIVE))
        rows.append((" ".join(words), label))
    return rows


def write_lines(path, lines):
    path = Path(path)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_tsv(path, rows, header=("sentence", "label")):
    """A labelled set in GLUE's .tsv layout: a header row, then one tab-separated row each."""
    return write_lines(path, ["\t".join(header), *("\t".join(map(str, row)) for row in rows)])


def read_lines(path):
    """The lines of a text file as the `text` dataset builder sees them (split on \\n only)."""
    text = Path(path).read_text(encoding="utf-8")
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")


def documented_python(path):
    """The Python a Markdown file of the repository shows: each ```python block whole, then each
    inline code span outside the blocks that parses as Python (`module.function(args)`)."""
    text = (REPO / path).read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.MULTILINE | re.DOTALL)
    spans = []
    for span in re.findall(r"`([^`\n]+)`", prose):
        try:
            ast.parse(span)
        except SyntaxError:
            continue
        spans.append(span)
    return blocks, spans


def fake_tensorflow(folder, source):
    """A stand-in `tensorflow` package, its __init__.py `source`, in `folder` (which goes first on
    PYTHONPATH): what a script does when TensorFlow's import crashes, or at the moment it imports
    it, without TensorFlow. Returns `folder`."""
    package = Path(folder) / "tensorflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(source)
    return Path(folder)


def subprocess_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ""  # only the virtualenv's packages
    return env


def script_command(script, *args):
    """The command line that runs a root script (or `-c` code) with this interpreter."""
    target = [script] if script == "-c" else [str(REPO / script)]
    return [sys.executable, *target, *[str(arg) for arg in args]]


def run_command(script, *args, env=None, timeout=600, cwd=REPO):
    """Run a root script as a subprocess (in the repo root, env = subprocess_env() unless given) to
    its end; returns the CompletedProcess, output captured as text."""
    env = subprocess_env() if env is None else env
    command = script_command(script, *args)
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def start_script(
    script, *args, env=None, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **popen
):
    """Start a root script as run_command does, without waiting: stdout discarded and stderr piped
    unless `stdout` and `stderr` say otherwise."""
    env = subprocess_env() if env is None else env
    command = script_command(script, *args)
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=stdout, stderr=stderr, text=True, **popen
    )


def kill_when(process, ready, waiting_for, timeout=300, pause=0.01, group=False, log=None):
    """SIGKILL a start_script process, with no warning, as soon as `ready()` is true (its whole
    process group with `group`). Fails if it ends first (showing its stderr, or the file `log` that
    holds it) or if `waiting_for` does not come within `timeout` seconds."""
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            if process.poll() is not None:
                errors = Path(log).read_text() if log else process.stderr.read()
                raise AssertionError(f"it ended before {waiting_for}: {errors[-3000:]}")
            assert time.monotonic() < deadline, f"no {waiting_for} within {timeout} s"
            time.sleep(pause)
        if group:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
        if process.stderr:
            process.stderr.close()


def flags(**named):
    """Command-line flags as strings, `--name value` for each of `named` in order (`--name` alone
    for True; nothing for None or False)."""
    words = []
    for name, value in named.items():
        if value is True:
            words.append(f"--{name}")
        elif value is not None and value is not False:
            words += [f"--{name}", str(value)]
    return words


def mlm_flags(train_dataset, tokenizer, output_dir, *extra, **named):
    """run_mlm.py's flags, off TPU, for the given data, tokenizer and output folder; `named` flags
    and then `extra` words follow (a later flag wins)."""
    return [
        *flags(
            no_tpu=True,
            train_dataset=train_dataset,
            tokenizer=tokenizer,
            output_dir=output_dir,
            **named,
        ),
        *[str(word) for word in extra],
    ]


def prepare_flags(corpus, tokenizer_dir, split, output_dir, **named):
    """prepare_tfrecord_shards.py's flags for one split of `corpus` ({split: its file}), with the
    shard sizes the shards_dir fixture uses; `named` flags add to or replace these."""
    defaults = {
        f"{split}_file": corpus[split],
        "split": split,
        "tokenizer_name_or_path": tokenizer_dir,
        "max_length": MAX_LENGTH,
        "shard_size": SHARD_SIZE if split == "train" else 10000,
        "output_dir": output_dir,
    }
    return flags(**{**defaults, **named})


def tiny_run_flags(shards_dir, tokenizer_dir, output_dir, *extra, **named):
    """run_mlm.py's flags for the tiny model on shards_dir's train split, evaluated on its
    validation split; `named` flags add to or replace these, `extra` words follow."""
    named = {"eval_dataset": shards_dir / "validation", "config_overrides": TINY_MODEL, **named}
    return mlm_flags(shards_dir / "train", tokenizer_dir, output_dir, *extra, **named)


def files_in(folder):
    """Every file under `folder`, hidden ones included, as {relative path: bytes}."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def assert_same_files(actual, expected):
    """Two folders' files ({relative path: bytes}, as files_in gives them) are the same, byte for
    byte."""
    assert sorted(actual) == sorted(expected)
    different = [name for name in expected if actual[name] != expected[name]]
    assert different == [], f"these files differ from the expected ones: {different}"


def last_line(text):
    """The last non-empty line (tqdm's carriage returns count as line ends)."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def write_jsonl(path, lines):
    path.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines), encoding="utf-8")
    return path


def write_hub_layout(folder, parts):
    """A dataset repository laid out as on the Hub, data/train-0000i-of-0000n.jsonl: datasets
    loads a local folder given as --dataset_name through the same code as a Hub id, offline. A
    part is a list of texts, or a file's whole text. Returns the flags that name the dataset."""
    (folder / "data").mkdir(parents=True)
    for index, part in enumerate(parts):
        path = folder / "data" / f"train-{index:05d}-of-{len(parts):05d}.jsonl"
        if isinstance(part, list):
            write_jsonl(path, part)
        else:
            path.write_text(part, encoding="utf-8")
    return ["--dataset_name", folder, "--dataset_config", "default"]


def dataset_files(cache):
    """The files a load left in the datasets cache but lock files (a stream takes a lock only)."""
    files = Path(cache).rglob("*")
    return sorted(path for path in files if path.is_file() and path.suffix != ".lock")


# transformers 5 with PyTorch, in a virtualenv of its own (run_tests.sh installs it): the tests that
# load this pipeline's PyTorch copies there, or compare ModernBERT with transformers 5's own.
TRANSFORMERS5_PYTHON = REPO / ".venv-transformers5" / "bin" / "python"
INSTALL_HINT = (
    "run `bash run_tests.sh`, which installs requirements-export-test.txt into .venv-transformers5"
)


def require_transformers5():
    """The transformers 5 virtualenv's python; the test fails with the way to install it if it is
    missing."""
    if not TRANSFORMERS5_PYTHON.exists():
        import pytest

        pytest.fail(
            f"{TRANSFORMERS5_PYTHON.relative_to(REPO)} is missing: {INSTALL_HINT}.", pytrace=False
        )
    return TRANSFORMERS5_PYTHON


def run_in_transformers5(script, request, report, what):
    """Run `script` (a tests/transformers5_*.py) with the transformers 5 virtualenv's python on the
    JSON `request`; the test fails with the end of its stderr if it fails, else returns the JSON it
    wrote to `report`."""
    result = subprocess.run(
        [str(require_transformers5()), str(script), str(request), str(report)],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        import pytest

        stderr = result.stderr[-3000:]
        pytest.fail(f"transformers 5 failed on {what} ({INSTALL_HINT} if stale):\n{stderr}")
    return json.loads(Path(report).read_text())
