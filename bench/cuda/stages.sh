#!/bin/sh
# Where a decode token's time goes in the real graph-replayed chain, with
# programmatic dependent launch's overlap (30b-a3b shape, all in VRAM):
# test_cuda_model --bench-stages leaves out each stage of the row's layers
# in turn (qkv, rope, attn, wo_quant, wo, ffn_norm, router, topk, gate_up,
# down_quant, down, combine: cuda_model_set_skip) and prints the token time
# each saves, medians of 3 alternating rounds. Unlike profile.sh (ncu,
# kernels serialised one at a time), this is the chain as it runs.
#
# Usage: sh bench/cuda/stages.sh [MODEL]   (MODEL and binary as decode.sh)
M=${1:-/tmp/strata-30b-a3b.gguf}
WHO=stages.sh . "$(dirname "$0")/model_bin.sh"
exec "$T" --bench-stages "$M"
