#!/usr/bin/env bash
# The whole test suite: set up .venv with the test extras, install the Debian libraries Qt needs
# when they are missing, run pytest. Extra arguments go to pytest.
set -euo pipefail
export WORKBENCH_EXTRAS="test"
source "$(dirname "${BASH_SOURCE[0]}")/setup-env.sh"
# the Debian libraries Qt needs for offscreen widgets and pyqtgraph, and QtWebEngine's for the graph tab's
# tests (without them those tests skip: a fresh machine would pass without testing the graph tab)
# shellcheck disable=SC2086
install_debs $QT_OFFSCREEN_DEBS $QT_WEBENGINE_DEBS
export QT_QPA_PLATFORM="${QT_QPA_PLATFORM:-offscreen}"
cd "$ROOT"
exec python -m pytest "$@"
