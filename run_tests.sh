#!/usr/bin/env bash
# The test suite in one command, on CPU, offline: installs the pinned requirements (plus pytest) into .venv
# unless a virtualenv or conda env is active, then runs pytest. Extra arguments go to pytest.
#
#   bash run_tests.sh            # everything, a few minutes
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
"$python" -m pytest tests "$@"
