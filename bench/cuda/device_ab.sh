#!/bin/sh
# One device call that tests a candidate and A/Bs builds (issue 9), from a
# folder packed here by bench/cuda/pack.sh and carried (device run with
# carry=[build/prebuilt]; xz keeps it under the 64 MiB carry limit):
#   build/prebuilt/bin/*.xz   the candidate's test_cuda, test_cuda_layer,
#                             test_cuda_model (static, stripped, xz)
#   build/prebuilt/ab/N.xz    test_cuda_model builds named N
#   build/prebuilt/pairs      lines "OLD NEW ROUNDS" (names in ab/): each an
#                             bench/cuda/ab.sh run (--bench-quick)
#   build/prebuilt/steps      words: bench (the candidate's full --bench),
#                             memcheck (compute-sanitizer on test_cuda)
# Logs go to $OUT (or ./device-out); a line each to stdout with the elapsed
# seconds, so a call cut short by its time limit still says how far it got.
# Usage (on the device): sh bench/cuda/device_ab.sh
cd "$(dirname "$0")/../.." || exit 1
B=build/prebuilt
OUT=${OUT:-device-out}
mkdir -p "$OUT" /tmp/strata-bin /tmp/strata-ab
unxz_to() {
    if command -v xz >/dev/null; then xz -dc "$1" >"$2"
    else python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' "$1" "$2"; fi
    chmod +x "$2"
}
for f in "$B"/bin/*.xz; do [ -f "$f" ] && unxz_to "$f" /tmp/strata-bin/"$(basename "$f" .xz)"; done
for f in "$B"/ab/*.xz; do [ -f "$f" ] && unxz_to "$f" /tmp/strata-ab/"$(basename "$f" .xz)"; done
S=$(date +%s)
rc=0
for t in test_cuda test_cuda_layer test_cuda_model; do
    [ -x /tmp/strata-bin/$t ] || continue
    /tmp/strata-bin/$t >"$OUT/$t.log" 2>&1 || rc=1
    echo "$t: $(tail -n 1 "$OUT/$t.log")"
    grep -h "FAIL\|DIFFER" "$OUT/$t.log" | head -n 5
done
echo "tests [$(( $(date +%s) - S )) s]"
M=/tmp/strata-30b-a3b.gguf
if [ -s "$B/pairs" ] && [ ! -f "$M" ]; then
    g=$(ls /tmp/strata-ab/* /tmp/strata-bin/test_cuda_model 2>/dev/null | head -n 1)
    "$g" --bench-quick "$M" >"$OUT/gen.log" 2>&1 || "$g" --bench "$M" >"$OUT/gen.log" 2>&1
fi
if [ -f "$B/pairs" ]; then
    while read -r o n r; do
        [ -n "$o" ] || continue
        sh bench/cuda/ab.sh /tmp/strata-ab/"$o" /tmp/strata-ab/"$n" "$M" "${r:-2}" >"$OUT/ab-$o-$n.log" 2>&1 || rc=1
        echo "$o -> $n: $(tail -n 1 "$OUT/ab-$o-$n.log")   [$(( $(date +%s) - S )) s]"
    done <"$B/pairs"
fi
if grep -qw bench "$B/steps" 2>/dev/null; then
    /tmp/strata-bin/test_cuda_model --bench >"$OUT/bench.log" 2>&1 || rc=1
    grep "^bench:" "$OUT/bench.log" | grep -v "arena\|copy from"
    echo "bench [$(( $(date +%s) - S )) s]"
fi
if grep -qw memcheck "$B/steps" 2>/dev/null && command -v compute-sanitizer >/dev/null; then
    timeout 200 compute-sanitizer --tool memcheck /tmp/strata-bin/test_cuda >"$OUT/memcheck.log" 2>&1
    echo "memcheck exit $?: $(tail -n 2 "$OUT/memcheck.log" | tr '\n' ' ')"
fi
echo "done [$(( $(date +%s) - S )) s]"
exit $rc
