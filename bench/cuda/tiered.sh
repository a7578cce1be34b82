#!/bin/sh
# Tiered decode/prefill of the GPU forward (issue 9): a generated 80b-a3b
# model (48 layers x 512 experts, top-10, Q4_K experts, ~44 GB) held in host
# RAM, the GPU's expert arena at 10%, 25% and 50% of the expert bytes.
# Printed in one run (test_cuda_model --bench-tiered): the host-to-device
# copy bandwidth from page-locked memory (one 1 GiB copy and in pieces of
# an expert matrix: the miss path's ceiling) and from pageable memory; for
# each arena: decode and prefill tok/s, hit rate, MB copied a token, and
# GB/s as a fraction of the ceiling; misses from the page-locked file
# mapping with and without read-ahead, and through a host tier (the expert
# store holding every expert, page-locked).
#
# Usage: sh bench/cuda/tiered.sh [MODEL [host|ssd]]
#   host   only the host-tier arms (A/B runs of host-tier changes)
#   ssd    only the three-tier arm: GPU arena 10% over a 25% host tier over
#          the GGUF read with O_DIRECT (drop the page cache first for a cold
#          disk); prints the store's bulk read rate in the same run
#   MODEL  default /tmp/strata-80b-a3b.gguf; generated when missing
#          (strata mkmodel --preset 80b-a3b: ~44 GB of disk, a few minutes
#          on 16 cores). Needs about 2x the model in host RAM (page cache
#          plus the host tier) and the model's dense part plus half its
#          experts in VRAM.
# Binary: $T, else build/tests/test_cuda_model, else the carried static build
# build/prebuilt/test_cuda_model_static.
M=${1:-/tmp/strata-80b-a3b.gguf}
WHO=tiered.sh . "$(dirname "$0")/model_bin.sh"
if [ ! -f "$M" ] && [ -x build/strata ]; then
    build/strata mkmodel --preset 80b-a3b -q -o "$M" || echo "tiered.sh: strata mkmodel failed; the test generates it"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv 2>/dev/null
free -g | head -2
exec "$T" --bench-tiered "$M" ${2:+"$2"}
