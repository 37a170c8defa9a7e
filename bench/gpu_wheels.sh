#!/usr/bin/env bash
# Downloads into .whl/ the wheels bench/gpu_check.sh needs on the GPU machine, which has no internet and
# lacks the project-file dependency (sqlite-utils) and a few of its pure-Python dependencies:
# cp312 manylinux x86_64 (the machine's /opt/torch/.venv). Run it here, then carry .whl/ with the tree
# (it is git-ignored). Packages the machine already has for pytest (pluggy, packaging) are left out on
# purpose: gpu_check.sh puts .whl's packages first on the path, and they must not shadow those.
#
#   bench/gpu_wheels.sh [PYTHON]      (default: the python on PATH; any version: pip downloads for cp312)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${1:-python3}"
PACKAGES=(sqlite-utils sqlite-fts4 click-default-group click tabulate python-dateutil tzdata six)
rm -rf .whl && mkdir -p .whl
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .whl "${PACKAGES[@]}"
# every wheel must be pure Python or cp312/manylinux x86_64, or it will not import there
for wheel in .whl/*.whl; do
    case "$(basename "$wheel")" in
        *-py3-none-any.whl|*-py2.py3-none-any.whl|*-cp312-*manylinux*x86_64*.whl) ;;
        *) echo "unexpected wheel for the GPU machine: $wheel" >&2; exit 1 ;;
    esac
done
ls -1 .whl
