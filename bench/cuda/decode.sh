#!/bin/sh
# Decode speed of the all-resident GPU forward (backend/cuda/cuda_model.h)
# on the Qwen3-30B-A3B shape: tok/s of 128 greedy tokens, the weight bytes
# a token reads x tok/s as GB/s, and the fraction of the device's read
# bandwidth measured in the same run (test_cuda_model --bench).
#
# Usage: sh bench/cuda/decode.sh [MODEL]
#   MODEL  default /tmp/strata-30b-a3b.gguf; when missing it is generated
#          (strata mkmodel --preset 30b-a3b, ~17 GB Q4_K experts: about a
#          minute on 16 cores; by the test binary itself if build/strata
#          cannot run, e.g. on a device image without liburing).
# Binary: $T, else build/tests/test_cuda_model, else the carried static build
# build/prebuilt/test_cuda_model_static.
M=${1:-/tmp/strata-30b-a3b.gguf}
WHO=decode.sh . "$(dirname "$0")/model_bin.sh"
if [ ! -f "$M" ] && [ -x build/strata ]; then
    build/strata mkmodel --preset 30b-a3b -q -o "$M" || echo "decode.sh: strata mkmodel failed; the test generates it"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>/dev/null
exec "$T" --bench "$M"
