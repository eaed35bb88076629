#!/usr/bin/env bash
# The test suite in one command, on CPU: installs the pinned requirements, Apache Beam's included, and the
# test tools (requirements-test.txt) into .venv unless a virtualenv or conda env is active, then runs pytest.
# Offline but for tests/test_requirements.py, which asks the package index (-m "not network" skips it).
# Extra arguments go to pytest. README.md, "Two commands", says how long it takes.
#
#   bash run_tests.sh                 # everything, one pytest worker per core
#   bash run_tests.sh -m smoke        # the end-to-end smoke test alone, about a minute: the line for your CI
#   bash run_tests.sh --tpu           # the smoke test on TensorFlow's TPU build (requirements-tpu.txt, .venv-tpu)
#   bash run_tests.sh -k masking      # one part
set -euo pipefail
cd "$(dirname "$0")"

if [ "${1:-}" = "--tpu" ]; then
  shift
  # The TPU set must be installed without dependency resolution (see requirements-tpu.txt), so it gets a
  # virtualenv of its own; without a TPU, TensorFlow's TPU build runs on the CPU.
  [ -x .venv-tpu/bin/python ] || python3 -m venv .venv-tpu
  .venv-tpu/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-test-tpu.txt
  export TPU_LOAD_LIBRARY=0  # no TPU here: do not wait for the TPU metadata server
  # The smoke test alone: the other test files import test tools (the GCS emulator) this set does not carry.
  exec .venv-tpu/bin/python -m pytest tests/test_smoke.py "$@"
fi

if [ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]; then
  python=python
else
  [ -x .venv/bin/python ] || python3 -m venv .venv
  python=.venv/bin/python
fi
"$python" -m pip install --quiet --disable-pip-version-check -r requirements-test.txt

# transformers 5 with the CPU build of PyTorch, in a virtualenv of its own (it cannot share one with the TF
# stack, which needs transformers 4.57): tests/test_pytorch_export.py loads run_mlm.py's PyTorch copy there.
# torch is pinned exactly there, so pip takes a CPU wheel where one is offered (the first install takes a few
# minutes). Made from the same Python as the test suite's (3.10, 3.11 or 3.12: the pins install on each). The
# smoke test does not need it.
if [[ " $* " != *" -m smoke "* ]]; then
  [ -x .venv-transformers5/bin/python ] || "$python" -m venv .venv-transformers5
  .venv-transformers5/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-export-test.txt
fi
# Format and lint first (ruff.toml): a style slip fails in a second, not after the suite.
"$python" -m ruff format --check --quiet .
"$python" -m ruff check --quiet .
# One worker process per core (pytest-xdist), each test file on one of them, so a file's shared fixtures (the
# Cloud Storage emulator, a training run several tests read) are made once. Files are handed out longest
# first (tests/conftest.py); pytest-xdist would otherwise start the files with the most tests first, and
# a long file started last keeps one worker busy alone at the end.
"$python" -m pytest tests -n auto --dist loadfile --no-loadscope-reorder "$@"
