"""README's "Reuse" section, taken at its word: the files it names for each step, or for a smoke
test in your own CI, copied into an empty folder without the rest of this repository, still run.

`tests/test_layout.py` checks the copy table against the imports; this file checks that the copies
work where nothing else of the repository is on the path.
"""

import re
import shutil
import subprocess
import sys

import pytest
from helpers import REPO


def readme_section(heading):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert heading in readme, f"README.md has no section {heading!r}"
    return readme.split(heading, 1)[1].split("\n#", 1)[0]


def copy_rows():
    """{script: [module file names]} from README's "What to copy for each step" table."""
    section = readme_section("### What to copy for each step")
    rows = {}
    for match in re.finditer(r"^\| \d \| `([\w.]+)` \| (.+?) \|", section, re.MULTILINE):
        script, modules = match.groups()
        rows[script] = re.findall(r"`(\w+\.py)`", modules)
    return rows


def copy_into(folder, names):
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, folder / name)


def isolated(command, folder):
    """Run with `folder` as the working directory and nothing of this repository importable (the
    test's own PYTHONPATH would reach back into it)."""
    env = {"PATH": "", "HOME": str(folder), "TF_CPP_MIN_LOG_LEVEL": "2", "TPU_LOAD_LIBRARY": "0"}
    return subprocess.run(
        command, cwd=folder, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize(
    "script",
    ["train_unigram.py", "prepare_tfrecord_shards.py", "run_mlm.py", "run_classifier.py"],
)
def test_each_step_runs_from_its_copy_list_alone(script, tmp_path):
    rows = copy_rows()
    assert script in rows, f"README's copy table has no row for {script}"
    copy_into(tmp_path, [script, *(f"mlm_pipeline/{name}" for name in rows[script])])
    result = isolated([sys.executable, script, "--help"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


def test_the_smoke_test_files_stand_alone(tmp_path):
    """The files README names for a user's CI, with the scripts and the package, collect the smoke
    test without anything else from tests/ (a missing helper would fail at import)."""
    section = readme_section("### A smoke test for your CI")
    named = re.findall(r"`((?:tests/)?[\w.]+\.(?:py|ini))`", section)
    assert "tests/test_smoke.py" in named
    scripts = [path.name for path in REPO.glob("*.py")]
    package = [f"mlm_pipeline/{path.name}" for path in (REPO / "mlm_pipeline").glob("*.py")]
    copy_into(tmp_path, [*named, *scripts, *package])
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    result = isolated([*command, "tests/test_smoke.py"], tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert re.search(r"\b[1-9]\d* tests? collected", result.stdout), result.stdout[-2000:]
