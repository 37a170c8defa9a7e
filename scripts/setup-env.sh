#!/usr/bin/env bash
# Sourced by demo.sh and test.sh: create .venv (once) and install Quant Workbench into it.
#   WORKBENCH_EXTRAS  extras to install, e.g. "test" (default: none)
#   PYTHON            interpreter to build the venv with (default: python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${WORKBENCH_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo "$@"; else return 1; fi
}

# Debian packages missing from this machine, out of the ones given
missing_debs() {
    command -v dpkg-query >/dev/null 2>&1 || return 0
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
    done
}

# shellcheck source=debian-packages.sh
source "$ROOT/scripts/debian-packages.sh"

apt_updated=0
install_debs() {
    local missing
    missing="$(missing_debs "$@")"
    [ -z "$missing" ] && return 0
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "note: not a Debian system; make sure these libraries are installed: $missing" >&2
        return 0
    fi
    echo "Installing Debian packages: $missing"
    if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq || true; apt_updated=1; fi
    # shellcheck disable=SC2086
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null \
        || echo "warning: could not install $missing (need root or sudo); Qt windows may not open" >&2
}

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "error: Quant Workbench needs Python 3.10 or newer ($PYTHON is $("$PYTHON" --version 2>&1))" >&2
    exit 2
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "Creating virtual environment in $VENV"
    if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
        # Debian's system Python ships venv separately
        install_debs python3-venv
        rm -rf "$VENV"
        "$PYTHON" -m venv "$VENV"
    fi
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# the CPU build of torch first, unless this environment already has a torch (a CUDA build, say)
if ! python -c 'import torch' >/dev/null 2>&1; then
    echo "Installing torch (CPU build pinned in packaging/constraints-cpu.txt)"
    python -m pip install -q -r "$ROOT/packaging/constraints-cpu.txt"
fi

spec="$ROOT"
if [ -n "${WORKBENCH_EXTRAS:-}" ]; then spec="$ROOT[$WORKBENCH_EXTRAS]"; fi
# keep the torch that is installed: extras such as transformers + timm otherwise pull a newer torch
# (a CUDA build of several GB). The CPU pin when it is ours, else the version already there.
constraints="$ROOT/packaging/constraints-cpu.txt"
installed_torch="$(python -c 'import torch; print(torch.__version__.split("+")[0])')"
if ! grep -qx "torch==$installed_torch" "$constraints"; then
    constraints="$(mktemp)"
    echo "torch==$installed_torch" > "$constraints"
fi
# An editable install follows the code by itself; it is redone only when what pip reads changes (the
# package metadata, the extras): a stamp in the venv holds their hash.
stamp="$VENV/.workbench-install-stamp-${WORKBENCH_EXTRAS:-base}"  # one per set of extras (demo, test)
wanted="$(python - "$ROOT" <<'PY'
import hashlib, pathlib, sys
digest = hashlib.sha256()
for name in ("pyproject.toml", "setup.py", "setup.cfg"):
    path = pathlib.Path(sys.argv[1]) / name
    digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"-") + b"\0")
print(digest.hexdigest())
PY
)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ] || ! python -c 'import workbench' >/dev/null 2>&1; then
    echo "Installing Quant Workbench${WORKBENCH_EXTRAS:+ with extras: $WORKBENCH_EXTRAS} (torch kept at $installed_torch)"
    python -m pip install -q -c "$constraints" -e "$spec"
    echo "$wanted" > "$stamp"
fi
