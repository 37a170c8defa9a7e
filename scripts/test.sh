#!/usr/bin/env bash
# The whole test suite: set up .venv with the test extras, install the Debian libraries Qt needs
# when they are missing, run pytest. Extra arguments go to pytest.
set -euo pipefail
export WORKBENCH_EXTRAS="test"
source "$(dirname "${BASH_SOURCE[0]}")/setup-env.sh"
# the Debian libraries Qt needs for offscreen widgets and pyqtgraph
install_debs libglib2.0-0 libgl1 libxkbcommon0 libegl1 libfontconfig1 libdbus-1-3
export QT_QPA_PLATFORM="${QT_QPA_PLATFORM:-offscreen}"
cd "$ROOT"
exec python -m pytest "$@"
