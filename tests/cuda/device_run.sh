#!/bin/sh
# The one-call device run of the CUDA backend (issue 9). The device image
# has nvcc but not the CPU library's build dependencies (liburing), so the
# binaries are built here and carried:
#   make BUILD=build/cu cuda && sh bench/cuda/link_static.sh . build/prebuilt/bin
#   device run: sh tests/cuda/device_run.sh   (carry: build/prebuilt/bin)
# Runs the three CUDA suites, then the steps named in $STEPS (default
# "bench memcheck"): bench, the decode bench (bench/cuda/decode.sh);
# memcheck, a compute-sanitizer memcheck of test_cuda; mvbench, test_cuda
# --bench (each matvec shape's GB/s against the read probe, weights hot in
# L2 where they fit: against the chain trace's share, what is not bytes).
# Logs to $OUT (or
# ./device-out). bench/cuda/device_ab.sh runs it after its A/B pairs.
# Usage: sh tests/cuda/device_run.sh [BIN]   (BIN default build/prebuilt/bin)
OUT=${OUT:-device-out}
BIN=${1:-build/prebuilt/bin}
STEPS=" ${STEPS-bench memcheck} "
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >"$OUT/smi.txt" 2>&1
cat "$OUT/smi.txt"
rc=0
for t in test_cuda test_cuda_layer test_cuda_model; do
    [ -x "$BIN/$t" ] || { echo "device_run: no $BIN/$t (build it: bench/cuda/link_static.sh)"; exit 1; }
    "$BIN/$t" >"$OUT/$t.log" 2>&1 || rc=1
    echo "$t: $(tail -n 1 "$OUT/$t.log")"
    grep -h "FAIL" "$OUT/$t.log" | head -n 5
done
case $STEPS in *" bench "*)
    T=$BIN/test_cuda_model sh bench/cuda/decode.sh >"$OUT/decode.log" 2>&1 || rc=1
    grep "^bench:" "$OUT/decode.log" | grep -v "arena\|copy from" ;;
esac
case $STEPS in *" mvbench "*)
    "$BIN/test_cuda" --bench >"$OUT/mvbench.log" 2>&1 || rc=1
    grep -iE "GB/s|probe" "$OUT/mvbench.log" | head -n 30 ;;
esac
case $STEPS in *" memcheck "*)
    if command -v compute-sanitizer >/dev/null; then
        timeout 150 compute-sanitizer --tool memcheck "$BIN/test_cuda" >"$OUT/memcheck.log" 2>&1
        echo "memcheck exit $?"; tail -n 3 "$OUT/memcheck.log"
    fi ;;
esac
exit $rc
