#!/usr/bin/env bash
# The test suite in one command, on CPU, offline: installs the pinned requirements (plus pytest) into .venv
# unless a virtualenv or conda env is active, then runs pytest. Extra arguments go to pytest.
#
#   bash run_tests.sh            # everything, about 8 minutes on 2 cores
#   bash run_tests.sh -k masking # one part
set -euo pipefail
cd "$(dirname "$0")"

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
# minutes). Made from the same Python as the test suite's (3.11: the pins were resolved on it).
[ -x .venv-transformers5/bin/python ] || "$python" -m venv .venv-transformers5
.venv-transformers5/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-export-test.txt
"$python" -m pytest tests "$@"
