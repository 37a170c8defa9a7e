#!/usr/bin/env bash
# The main job without a screen: set up .venv if needed, then run the headless demo.
# Extra arguments go to `workbench demo` (try --help).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-env.sh"
exec workbench demo "$@"
