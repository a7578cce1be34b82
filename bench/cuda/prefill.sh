#!/bin/sh
# The prompt chunk's kernels on the device (issue 9): test_cuda (every
# grouped matmul, tensor-core or dp4a, memcmp-equal to the matvec) and
# test_cuda_layer's attention checks (cuda_attention_rows memcmp-equal to
# one-row calls) with its --bench-rows (k_attn_rows against the one-row
# launches), then a chunk of 192 and of 256 prompt rows on the benchmark's
# model and on a Q4_K_M file (generated here when missing), each timed with
# the default kernels and with the dp4a matmuls only, then the 192-row
# chunk with the one-row attention launches (test_cuda_model --profile-chunk
# MODEL ROWS 1 / 2: 3 alternating rounds, medians, logits compared), then
# where the 192-row chunk's GPU time goes, kernel by kernel (profile.sh
# MODEL chunk; needs ncu). Logs to $OUT (default ./prefill-out).
# Usage (on the device): sh bench/cuda/prefill.sh [TEST_CUDA_DIR]
#   TEST_CUDA_DIR holds test_cuda, test_cuda_layer and test_cuda_model (default build/tests,
#   else the binaries pack.sh carried, build/prebuilt/bin/*.xz, unpacked to
#   /tmp/strata-bin).
D=${1:-build/tests}
if [ ! -x "$D/test_cuda_model" ] && [ -f build/prebuilt/bin/test_cuda_model.xz ]; then
    D=/tmp/strata-bin
    mkdir -p "$D"
    for t in test_cuda test_cuda_layer test_cuda_model; do xz -dc "build/prebuilt/bin/$t.xz" >"$D/$t" && chmod +x "$D/$t"; done
fi
OUT=${OUT:-prefill-out}
mkdir -p "$OUT"
T=$D/test_cuda_model
export T
"$D/test_cuda" >"$OUT/test_cuda.log" 2>&1
grep -E "matmul|passed|FAIL" "$OUT/test_cuda.log" | tail -n 3
"$D/test_cuda_layer" attention >"$OUT/test_cuda_layer.log" 2>&1
grep -E "attention rows|first diff|passed|FAIL" "$OUT/test_cuda_layer.log" | tail -n 4
"$D/test_cuda_layer" --bench-rows 2>&1 | grep "^bench"
Q=/tmp/q4km.gguf
[ -f "$Q" ] || "$T" --mkmodel "$Q" 30b-a3b Q4_K_M | tail -n 1
for m in /tmp/strata-30b-a3b.gguf "$Q"; do
    for r in 192 256; do "$T" --profile-chunk "$m" "$r" 1 2>&1 | grep -E "^profile|rror"; done
    "$T" --profile-chunk "$m" 192 2 2>&1 | grep -E "^profile|rror"
done
for m in /tmp/strata-30b-a3b.gguf "$Q"; do
    n=$(basename "$m" .gguf)
    timeout 150 sh "$(dirname "$0")/profile.sh" "$m" chunk >"$OUT/prof-$n.log" 2>&1
    grep -E "^profile: [0-9]+ kernels|^\| k" "$OUT/prof-$n.log" | head -n 8
done
