#!/bin/sh
# bench/cpu.sh: issue 5's CPU-speed benchmark. In ONE run it measures the
# machine's limits (build/bench/roofline: read bandwidth, int8 maddubs peak,
# fp32 FMA peak; before and after the engine runs; the int8 limit is the
# 512-bit maddubs path where the CPU has AVX-512, which the Q4_K gemm then
# uses) and strata on a
# RAM-resident model (strata bench: decode tgN and prefill ppN per thread
# count), plus the Q4_K expert matmul kernel alone (build/bench/gemm) at the
# rows-per-expert a ppN chunk gives, and prints every figure as a fraction
# of the limit that binds it:
#   decode   weight bytes touched per token x tok/s / read bandwidth (memory bound)
#   prefill  routed-expert ops per token x tok/s / int8 peak (compute bound);
#            the whole prefill (attention, router, head included) is charged,
#            so this understates the expert matmuls themselves; then the same
#            ops over the wall time of the routed-expert jobs alone
#   kernel   Q4_K gemm GOPS at the chunk's mean rows per expert / int8 peak
#
# Usage: bench/cpu.sh MODEL [-t 1,2] [-p 512] [-n 32] [-r 3] [-o DIR]
#   MODEL should be RAM-resident (the page cache is warmed first) and large
#   enough that its weights do not fit in the caches, e.g.
#   strata mkmodel --preset 30b-a3b --layers 16 -o /work/big/30b-a3b-L16.gguf
# Writes DIR/roofline-{before,after}.json, DIR/bench.json, DIR/gemm.txt and
# DIR/summary.md (default DIR: build/bench/cpu). Needs `make bench`.
set -eu
BUILD=${BUILD:-build}
PY=${PYTHON:-/usr/bin/python3}
[ $# -ge 1 ] || { echo "usage: bench/cpu.sh MODEL [-t 1,2] [-p 512] [-n 32] [-r 3] [-o DIR]" >&2; exit 2; }
MODEL=$1; shift
T=1,2; P=512; N=32; R=3; OUT=$BUILD/bench/cpu
while [ $# -gt 0 ]; do
    case $1 in
    -t) T=$2; shift 2 ;;
    -p) P=$2; shift 2 ;;
    -n) N=$2; shift 2 ;;
    -r) R=$2; shift 2 ;;
    -o) OUT=$2; shift 2 ;;
    *) echo "bench/cpu.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -f "$MODEL" ] || { echo "bench/cpu.sh: no model file $MODEL" >&2; exit 1; }
for b in "$BUILD/strata" "$BUILD/bench/roofline" "$BUILD/bench/gemm"; do
    [ -x "$b" ] || { echo "bench/cpu.sh: $b missing: run make bench" >&2; exit 1; }
done
mkdir -p "$OUT"
TMAX=$(echo "$T" | tr ',' '\n' | sort -n | tail -n 1)

echo "bench/cpu: warming the page cache with $MODEL" >&2
cat "$MODEL" > /dev/null
echo "bench/cpu: roofline (before)" >&2
"$BUILD/bench/roofline" -t "$TMAX" --passes 5 -o json > "$OUT/roofline-before.json"
echo "bench/cpu: strata bench -p $P -n $N -t $T -r $R" >&2
"$BUILD/strata" bench -m "$MODEL" -p "$P" -n "$N" -t "$T" -r "$R" -o json > "$OUT/bench.json"
echo "bench/cpu: Q4_K gemm kernel" >&2
"$BUILD/bench/gemm" --type q4_K -o csv > "$OUT/gemm.txt"
echo "bench/cpu: roofline (after)" >&2
"$BUILD/bench/roofline" -t "$TMAX" --passes 5 -o json > "$OUT/roofline-after.json"

"$PY" - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import csv, io, json, statistics, sys
out = sys.argv[1]
roof = [json.load(open(f"{out}/roofline-{w}.json")) for w in ("before", "after")]
bench = json.load(open(f"{out}/bench.json"))

# the int8 limit: the 512-bit maddubs path where the CPU has AVX-512 (the
# engine's Q4_K gemm then uses 512-bit maddubs), else the 256-bit one
INT8 = "int8_avx512_gops" if all("int8_avx512_gops" in r for rf in roof for r in rf["results"]) else "int8_gops"
INT8_NAME = "int8 512-bit" if INT8 != "int8_gops" else "int8"

def limit(threads, key):
    vals = [r[key]["median"] for rf in roof for r in rf["results"] if r["threads"] == threads]
    if not vals:   # roofline measured 1 and TMAX threads: use the nearest
        vals = [r[key]["median"] for rf in roof for r in rf["results"]]
    return statistics.median(vals), min(vals), max(vals)

print(f"# bench/cpu: {bench[0]['model_type']} ({bench[0]['model_size'] / 2**30:.2f} GiB), {roof[0]['cpu_model']}, "
      f"{roof[0]['cpus']} CPUs\n")
keys = ("read_gbs", "int8_gops") + (("int8_avx512_gops",) if INT8 != "int8_gops" else ()) + ("fp32_gflops",)
print("| threads | read GB/s | int8 GOPS | " + ("int8 512-bit GOPS | " if len(keys) == 4 else "")
      + "fp32 GFLOP/s |  (roofline medians, before / after) |")
print("|---:|" + "---|" * len(keys) + "---|")
for rf_t in sorted({r["threads"] for r in roof[0]["results"]}):
    cells = []
    for key in keys:
        cells.append(" / ".join(f"{r[key]['median']:.1f}" for rf in roof for r in rf["results"] if r["threads"] == rf_t))
    print(f"| {rf_t} | " + " | ".join(cells) + " | |")
print()
print("| test | threads | t/s | measured | limit | fraction | bound |")
print("|---|---:|---:|---|---|---:|---|")
for b in bench:
    t = b["n_threads"]
    if b["n_gen"] > 0:
        gbs = b["weight_bytes_per_token"] * b["avg_ts"] / 1e9
        lim, lo, hi = limit(t, "read_gbs")
        print(f"| {b['test']} | {t} | {b['avg_ts']:.2f} ± {b['stddev_ts']:.2f} | {b['weight_bytes_per_token'] / 1e6:.1f} MB/token "
              f"= {gbs:.2f} GB/s | read {lim:.1f} ({lo:.1f}..{hi:.1f}) GB/s | **{gbs / lim:.2f}** | memory read |")
    else:
        gops = b["expert_ops_per_token"] * b["avg_ts"] / 1e9
        lim, lo, hi = limit(t, INT8)
        print(f"| {b['test']} | {t} | {b['avg_ts']:.2f} ± {b['stddev_ts']:.2f} | {b['expert_ops_per_token'] / 1e9:.3f} G expert ops/token "
              f"= {gops:.1f} GOPS | {INT8_NAME} {lim:.0f} ({lo:.0f}..{hi:.0f}) GOPS | **{gops / lim:.2f}** | int8 compute (whole prefill) |")
        em = b["expert_matmul_gops"]
        print(f"| {b['test']} expert matmuls | {t} | | {em:.1f} GOPS in the expert jobs ({100 * b['expert_time_fraction']:.0f}% of the time) "
              f"| {INT8_NAME} {lim:.0f} GOPS | **{em / lim:.2f}** | int8 compute |")
pp = [b for b in bench if b["n_prompt"] > 0]
if pp:
    b = pp[0]
    print(f"\nppN chunk: {b['expert_lookups_per_chunk']:.0f} distinct layer-experts per chunk, "
          f"{b['expert_lookups_ratio']:.2f}x the uniform-routing expectation N(1-(1-k/N)^rows).")
# the kernel alone (single thread), from bench/gemm's csv
try:
    rows = list(csv.DictReader(io.StringIO(open(f"{out}/gemm.txt").read())))
    q4k = [r for r in rows if r.get("type") == "q4_K"]
    if q4k:
        lim, _, _ = limit(1, INT8)
        print("\nQ4_K gemm kernel, 1 thread (bench/gemm):\n")
        print("| K x rows | activation rows | GOPS dot loop | GOPS gemm | its own probe's peak | fraction of the roofline int8 peak |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in q4k:
            # the kernel the engine runs: the best ISA's gemm (AVX-VNNI or AVX-512) where the CPU has one
            g = float(r.get("vnni_gops") or 0) or float(r["gemm_gops"])
            print(f"| {r['k']} x {r['nw']} | {r['na']} | {float(r['dot_gops']):.1f} | {g:.1f} | {float(r['peak_gops']):.0f} | **{g / lim:.2f}** |")
except (OSError, KeyError, ValueError) as e:
    print(f"\n(bench/gemm output not parsed: {e})")
EOF
