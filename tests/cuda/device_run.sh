#!/bin/bash
# The one-call device run of the CUDA slice (issue 9): build if the machine
# can, else use the binaries built here and carried (build/tests/test_cuda,
# build/prebuilt/test_cuda_static: same source, cudart linked statically),
# then the correctness suite, the bench and a memcheck pass. Logs go to
# $OUT (or ./device-out). Usage: sh tests/cuda/device_run.sh
# (MV_MODES="tile direct" sh tests/cuda/device_run.sh adds the A/B bench)
OUT=${OUT:-device-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >"$OUT/smi.txt" 2>&1
cat "$OUT/smi.txt"
T=""
if timeout 240 make -j16 BUILD=/tmp/dbuild cuda >"$OUT/build.log" 2>&1; then
    T=/tmp/dbuild/tests/test_cuda; echo "built on the device"
else
    echo "device build failed (see build.log tail):"; tail -n 5 "$OUT/build.log"
fi
for c in "$T" build/tests/test_cuda build/prebuilt/test_cuda_static; do
    [ -n "$c" ] && [ -x "$c" ] && "$c" --info </dev/null && { T=$c; break; }
    T=""
done
[ -n "$T" ] || { echo "no test binary starts"; exit 1; }
echo "using $T"
"$T" 2>&1 | tee "$OUT/test.log"
"$T" --bench 2>&1 | tee "$OUT/bench.log"
if command -v compute-sanitizer >/dev/null; then
    timeout 150 compute-sanitizer --tool memcheck "$T" >"$OUT/memcheck.log" 2>&1
    echo "memcheck exit $?"; tail -n 3 "$OUT/memcheck.log"
fi
