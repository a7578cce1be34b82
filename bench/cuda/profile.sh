#!/bin/sh
# Where a decode token's GPU time goes, kernel by kernel (30b-a3b shape, all
# in VRAM): ncu times every kernel of one prompt row and two greedy steps
# (test_cuda_model --profile: plain launches, one kernel at a time, caches
# and clocks left as they are), then the kernels are summed by name over
# the last greedy step: count, total and mean microseconds, share of the
# step. Serialised kernels lose the overlap of programmatic dependent
# launch, so the total exceeds the graph-replayed token (decode.sh); the
# shares say which kernels hold the time.
#
# With `chunk` (and optionally ROWS, default 192): the prompt chunk instead
# (test_cuda_model --profile-chunk: ROWS prompt rows in chunks; first, out
# of the profiler, its wall time with and without the tensor-core matmul),
# the kernels summed over the last eval (from its embedding lookup on),
# shares of that eval's serialised kernel time.
#
# Usage: sh bench/cuda/profile.sh [MODEL [chunk [ROWS]]]   (MODEL as decode.sh; needs ncu)
M=${1:-/tmp/strata-30b-a3b.gguf}
MODE=--profile; SEL=step; KB=function
[ "${2:-}" = chunk ] && { MODE=--profile-chunk; SEL=chunk; KB=demangled; }
WHO=profile.sh . "$(dirname "$0")/model_bin.sh"
command -v ncu >/dev/null || { echo "profile.sh: no ncu"; exit 1; }
# generates the model when missing, outside the profiler (chunk: and times it)
if [ $SEL = chunk ]; then "$T" $MODE "$M" ${3:-192} 1 || exit 1; else "$T" $MODE "$M" >/dev/null || exit 1; fi
CSV=${TMPDIR:-/tmp}/strata-profile.csv
ncu --cache-control none --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    --print-kernel-base $KB "$T" $MODE "$M" ${3:-192} >"$CSV" 2>/dev/null || { echo "profile.sh: ncu failed"; exit 1; }
python3 - "$CSV" "$SEL" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr, data = rows[0], rows[1:]
ki, vi = hdr.index("Kernel Name"), hdr.index("Metric Value")
# ns ("5,248") -> us; demangled names (chunk) cut to the template: "k_matmul_direct<12, true>"
ks = [(r[ki].split("(")[0].replace("void ", ""), float(r[vi].replace(",", "")) / 1e3) for r in data]
# the last greedy step: from the last argmax's predecessor run back to the previous argmax
if sys.argv[2] == "chunk":   # the second eval: from its embedding lookup on
    gr = [i for i, (k, _) in enumerate(ks) if "get_rows" in k]
    step = ks[gr[-1]:] if gr else ks
    what = "the last prompt eval"
    print("profile: the eval's first %d kernels in order (us):" % min(40, len(step)))
    for i, (k, t) in enumerate(step[:40]): print("  %2d %8.1f  %s" % (i, t, k))
else:
    am = [i for i, (k, _) in enumerate(ks) if "argmax" in k]
    step = ks[am[-2] + 1:am[-1] + 1] if len(am) >= 2 else ks
    what = "the last greedy step"
tot = sum(t for _, t in step)
agg = collections.OrderedDict()
for k, t in step:
    c, s = agg.get(k, (0, 0.0)); agg[k] = (c + 1, s + t)
print("profile: %d kernels in %s, %.1f us serialised" % (len(step), what, tot))
print("| kernel | launches | total us | mean us | share |")
print("|---|---:|---:|---:|---:|")
for k, (c, s) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print("| %s | %d | %.1f | %.2f | %.1f%% |" % (k, c, s, s / c, 100 * s / tot))
PY
