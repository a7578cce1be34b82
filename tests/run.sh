#!/bin/sh
# The default test suite. Runs every C unit test binary (build/tests/test_*),
# then every script test (tests/cli/test_*.sh, tests/ref/test_*.py and
# tests/golden/test_*.sh). Each prints lines "suite: N passed, N failed";
# this script adds them up and ends with the closing line
#   N passed, N failed
# and exits non-zero if anything failed or a suite crashed.
# Usage: tests/run.sh [unit]     (BUILD and PYTHON come from the Makefile)
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
export BUILD PYTHON
STRATA=${STRATA:-$BUILD/strata}
export STRATA
mode=${1:-all}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0; failed=0

run_suite() { # name, command...
    name=$1; shift
    start=$(date +%s)
    "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    end=$(date +%s)
    lines=$(grep -E '^[A-Za-z0-9_./-]+: [0-9]+ passed, [0-9]+ failed' "$tmp/out")
    if [ -z "$lines" ]; then
        echo "CRASH $name (exit $rc, no summary line)"; sed 's/^/    /' "$tmp/err" | tail -n 20
        failed=$((failed + 1)); return
    fi
    p=$(echo "$lines" | sed -E 's/.*: ([0-9]+) passed.*/\1/' | awk '{s+=$1} END {print s}')
    f=$(echo "$lines" | sed -E 's/.*passed, ([0-9]+) failed.*/\1/' | awk '{s+=$1} END {print s}')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "CRASH $name exited $rc"; fi
    passed=$((passed + p)); failed=$((failed + f))
    if [ "$f" -ne 0 ]; then
        echo "FAIL  $name: $p passed, $f failed ($((end - start)) s)"
        sed 's/^/    /' "$tmp/err" | tail -n 40
        grep -v -E ': [0-9]+ passed, [0-9]+ failed' "$tmp/out" | sed 's/^/    /' | tail -n 20
    else
        echo "ok    $name: $p passed ($((end - start)) s)"
    fi
}

# This includes the CUDA suites, test_cuda and test_cuda_emu, whenever
# `make cuda` has built them (never built by `make`/`make test`, which stay
# free of nvcc); without a GPU test_cuda prints a skip and passes.
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    run_suite "$(basename "$t")" "$t"
done

if [ "$mode" = all ]; then
    for t in tests/cli/test_*.sh tests/golden/test_*.sh; do
        [ -f "$t" ] || continue
        run_suite "$t" sh "$t"
    done
    for t in tests/ref/test_*.py; do
        [ -f "$t" ] || continue
        run_suite "$t" "$PYTHON" "$t"
    done
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
