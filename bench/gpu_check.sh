#!/usr/bin/env bash
# One GPU check: builds the C kernels in place, reports what the fused CUDA kernels do (bench/cuda_diag.py), runs
# the CUDA-marked tests and the GPU benchmarks
# (fake-quant forward and forward+backward, calibration, sensitivity, export), and prints one table
# (also written to $OUT/gpu_table.txt when OUT is set). Every step has its own timeout, capped by what
# is left of an overall budget (CHECK_BUDGET_S, default 470 s), so one hang cannot eat the others' time.
# Without a CUDA device it still builds the kernels and then reports every GPU step as "no GPU: skipped".
#
# Run from the repository root of a working tree (not pip-installed). Wheels carried in .whl/ (see
# bench/gpu_wheels.sh: sqlite-utils and its pure-Python dependencies) are installed to /tmp/site first.
# No Qt is needed: tests/app is left out.
#
#   bench/gpu_check.sh            (PYTHON=python3 by default)
set -u
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
BUDGET="${CHECK_BUDGET_S:-470}"
STARTED=$(date +%s)
LOGS=$(mktemp -d /tmp/gpu_check.XXXXXX)
TABLE="$LOGS/table.txt"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/gpu_check_inductor}"  # tests warm the benches

add_row() { printf '| %-22s | %-52s | %-70s | %-24s |\n' "$1" "$2" "$3" "$4" >> "$TABLE"; }

left() { echo $(( BUDGET - ($(date +%s) - STARTED) )); }

# run_step NAME LIMIT_S COMMAND...: rows the command prints as ROW|step|case|value|target go to the table;
# a timeout or a failure becomes a row of its own (with the log's last line), never a silent gap.
run_step() {
    local name=$1 limit=$2; shift 2
    local remaining; remaining=$(left)
    if (( remaining < 10 )); then add_row "$name" "-" "not run: the ${BUDGET} s budget is spent" ""; return; fi
    (( limit > remaining )) && limit=$remaining
    local log="$LOGS/${name// /_}.log" begin=$(date +%s) rc=0
    timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1 || rc=$?
    local took=$(( $(date +%s) - begin ))
    grep '^ROW|' "$log" | while IFS='|' read -r _ step case value target; do add_row "$step" "$case" "$value" "$target"; done
    if (( rc == 124 || rc == 137 )); then
        add_row "$name" "-" "TIMEOUT after ${limit} s" ""
    elif (( rc != 0 )); then
        add_row "$name" "-" "FAILED (exit $rc, ${took} s): $(grep -v '^ROW|' "$log" | grep -v '^\s*$' | tail -1 | cut -c1-60)" ""
    fi
    echo "[gpu_check] $name: exit $rc in ${took} s (log $log)" >&2
}

# 1. carried wheels, then this tree first on the path
export PYTHONPATH="$PWD"
if compgen -G ".whl/*.whl" > /dev/null; then
    if "$PY" -m pip install -q --upgrade --no-index --no-deps --target /tmp/site .whl/*.whl > "$LOGS/wheels.log" 2>&1; then
        export PYTHONPATH="/tmp/site:$PWD"
    else
        add_row "wheels" "-" "FAILED: $(tail -1 "$LOGS/wheels.log" | cut -c1-60)" ""
    fi
fi

# 2. the C kernels, in place (setuptools; a direct compiler call where setuptools is missing)
build_kernels() {
    "$PY" setup.py build_ext --inplace -q && return 0
    echo "setup.py failed; compiling directly" >&2
    local include suffix
    include=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])') || return 1
    suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') || return 1
    cc -O3 -fno-math-errno -ffp-contract=off -shared -fPIC -pthread -I"$include" workbench/quant/csrc/*.c \
        -o "workbench/quant/_cpu_kernels$suffix"
}
begin=$(date +%s)
if timeout 90 bash -c "$(declare -f build_kernels); PY='$PY' build_kernels" > "$LOGS/build.log" 2>&1; then
    build="built in $(( $(date +%s) - begin )) s"
else
    build="FAILED: $(tail -1 "$LOGS/build.log" | cut -c1-50)"
fi
backend=$("$PY" -c 'import workbench.quant.kernels.fake_quant as k; print(k.backend_name())' 2>/dev/null || echo "import failed")
add_row "build" "C kernels (CPU)" "$build; backend $backend" "c-avx2"

# 3. the machine
gpu=$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>/dev/null)
torch_version=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "no torch")
add_row "machine" "torch $torch_version" "${gpu:-no CUDA device}; $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)" ""

# the CUDA-marked tests; the summary line becomes the row (collection errors of modules needing what this
# machine lacks do not stop the others)
cuda_tests() {
    "$PY" -m pytest -q -m cuda -p no:cacheprovider --ignore=tests/app --continue-on-collection-errors tests
    local rc=$?
    echo "ROW|CUDA tests|pytest -m cuda (tests/app left out: no Qt)|$(grep -v '^\s*$' "$LOGS/CUDA_tests.log" | tail -1 | cut -c1-70)|all pass"
    return $rc
}

# GPU_CHECK_DEVICE=cpu runs the benchmark steps on the CPU: a dry run of this script on a machine without a GPU
device="${GPU_CHECK_DEVICE:-cuda}"
if [[ -z "$gpu" && "$device" == "cuda" ]]; then
    for name in "cuda diag" "CUDA tests" "fake-quant" "calibration" "sensitivity" "export"; do add_row "$name" "-" "no GPU: skipped" ""; done
else
    export -f cuda_tests && export PY LOGS
    # first: which path each fused kernel takes, its bits against the CPU, its speed (warms Inductor's cache)
    run_step "cuda diag" 100 "$PY" bench/cuda_diag.py --device "$device" --budget-s 80
    run_step "CUDA tests" 150 bash -c cuda_tests
    run_step "fake-quant" 60 "$PY" bench/gpu_bench.py fake-quant --device "$device" --repeats 7
    run_step "calibration" 50 "$PY" bench/gpu_bench.py calibration --device "$device" --repeats 3
    run_step "sensitivity" 80 "$PY" bench/gpu_bench.py sensitivity --device "$device" --repeats 1
    run_step "export" 90 "$PY" bench/gpu_bench.py export --device "$device" --repeats 1
fi

{
    echo "GPU check: $(date -u '+%Y-%m-%d %H:%M UTC'), $(( $(date +%s) - STARTED )) s in all (budget ${BUDGET} s)"
    printf '| %-22s | %-52s | %-70s | %-24s |\n' "step" "case" "result" "target"
    printf '|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..24})" "$(printf -- '-%.0s' {1..54})" \
        "$(printf -- '-%.0s' {1..72})" "$(printf -- '-%.0s' {1..26})"
    cat "$TABLE"
} > "$LOGS/final.txt"
cat "$LOGS/final.txt"
if [[ -n "${OUT:-}" ]]; then
    mkdir -p "$OUT" && cp "$LOGS/final.txt" "$OUT/gpu_table.txt" && cp -r "$LOGS" "$OUT/gpu_check_logs" 2>/dev/null
fi
exit 0
