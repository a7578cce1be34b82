#!/bin/sh
# Where a decode token's time goes, kernel by kernel, in the chain as it
# runs (30b-a3b shape, all in VRAM; graph replays with programmatic
# dependent launch, nothing left out): test_cuda_model --bench-trace reads
# the chain trace (cuda_trace_begin: CTA 0 of every kernel stamps
# %globaltimer at entry and when its dependency wait returns) over 64
# greedy tokens and prints, for each launch of a layer, its share of the
# chain (the next kernel's release minus its own: the shares add up to the
# token) and its early start (how long its CTA 0 sat resident before its
# predecessor completed). Unlike stages.sh nothing is left out; unlike
# profile.sh nothing is serialised. Needs a trace build:
#   make BUILD=build/trace CUDA_TRACE=1 cuda
#   BD=build/trace sh bench/cuda/link_static.sh . /tmp/trace-bin   (static, to carry)
# Usage: T=/path/to/trace/test_cuda_model sh bench/cuda/trace.sh [MODEL]
M=${1:-/tmp/strata-30b-a3b.gguf}
T=${T:-build/trace/tests/test_cuda_model}
WHO=trace.sh . "$(dirname "$0")/model_bin.sh"
exec "$T" --bench-trace "$M"
