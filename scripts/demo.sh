#!/usr/bin/env bash
# The main job: set up .venv if needed, then run the demo on the built-in digits CNN.
#   bash scripts/demo.sh            headless: quantize, calibrate, compare FP32/INT8, export QDQ ONNX
#   bash scripts/demo.sh --gui      the desktop app with the demo project open, ready to calibrate
# Other arguments go to `workbench demo` (try --help) or, after --gui, to `workbench gui`.
set -euo pipefail
if [ "${1:-}" = "--gui" ]; then
    shift
    export WORKBENCH_EXTRAS="gui"
    source "$(dirname "${BASH_SOURCE[0]}")/setup-env.sh"
    # the Debian libraries Qt needs for a window and QtWebEngine (the graph tab); if a window still does not
    # open, QT_DEBUG_PLUGINS=1 names the library really missing (Qt's "xcb-cursor0 is needed" can mislead)
    # shellcheck disable=SC2086
    install_debs $QT_OFFSCREEN_DEBS $QT_WINDOW_DEBS $QT_WEBENGINE_DEBS
    if [ -z "${DISPLAY:-}" ] && [ -z "${WAYLAND_DISPLAY:-}" ] && [ -z "${QT_QPA_PLATFORM:-}" ]; then
        echo "error: no display to open a window on (DISPLAY is not set)." >&2
        echo "Run it on a desktop, under a virtual one (xvfb-run -a bash scripts/demo.sh --gui)," >&2
        echo "or run the headless demo: bash scripts/demo.sh" >&2
        exit 2
    fi
    exec workbench gui --demo "$@"
fi
source "$(dirname "${BASH_SOURCE[0]}")/setup-env.sh"
exec workbench demo "$@"
