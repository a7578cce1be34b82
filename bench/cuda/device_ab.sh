#!/bin/sh
# One device call that A/Bs builds and tests a candidate (issue 9), from a
# folder packed here by bench/cuda/pack.sh and carried (device run with
# carry=[build/prebuilt]; xz keeps it under the 64 MiB carry limit):
#   build/prebuilt/bin/*.xz   the candidate's test_cuda, test_cuda_layer,
#                             test_cuda_model (static, stripped, xz)
#   build/prebuilt/ab/N.xz    test_cuda_model builds named N
#   build/prebuilt/pairs      lines "OLD NEW ROUNDS [MODEL [FTYPE]]" (names
#                             in ab/): each a bench/cuda/ab.sh run
#                             (--bench-quick) on MODEL (default the
#                             benchmark's, which the first run generates
#                             when missing); a missing MODEL with an FTYPE
#                             is written first by test_cuda_model --mkmodel
#                             MODEL 30b-a3b FTYPE (e.g. Q4_K_M: a users'
#                             file's mix of types)
#   build/prebuilt/ab/tr-N.xz trace builds (pack.sh trace:N=TREE): each
#                             runs bench/cuda/trace.sh after the pairs,
#                             its table to $OUT/trace-N.log and stdout
#   build/prebuilt/ab/mv-N.xz test_cuda builds (pack.sh mvbench:N=TREE):
#                             each runs --bench after the traces, to
#                             $OUT/mvbench-N.log
#   build/prebuilt/steps      tests/cuda/device_run.sh's STEPS for the
#                             candidate after the pairs (bench, memcheck;
#                             none when the file is missing); no suites
#                             when build/prebuilt/bin is missing
# The pairs come first, each line with its elapsed seconds, so a call cut
# short by its time limit has its comparisons; logs go to $OUT (or
# ./device-out). The traces run on $TRACE_MODEL when set (else trace.sh's
# default). Usage (on the device): sh bench/cuda/device_ab.sh
cd "$(dirname "$0")/../.." || exit 1
B=build/prebuilt
OUT=${OUT:-device-out}
export OUT
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
if [ -f "$B/pairs" ]; then
    while read -r o n r m f; do
        [ -n "$o" ] || continue
        m=${m:-/tmp/strata-30b-a3b.gguf}
        if [ ! -f "$m" ] && [ -n "$f" ]; then
            /tmp/strata-ab/"$o" --mkmodel "$m" 30b-a3b "$f" >"$OUT/mkmodel-$f.log" 2>&1 || rc=1
            echo "mkmodel $m ($f): $(tail -n 1 "$OUT/mkmodel-$f.log")   [$(( $(date +%s) - S )) s]"
        fi
        l=$OUT/ab-$o-$n${f:+-$f}.log
        sh bench/cuda/ab.sh /tmp/strata-ab/"$o" /tmp/strata-ab/"$n" "$m" "${r:-2}" >"$l" 2>&1 || rc=1
        echo "$o -> $n${f:+ ($f)}: $(tail -n 1 "$l")   [$(( $(date +%s) - S )) s]"
    done <"$B/pairs"
fi
for t in /tmp/strata-ab/tr-*; do
    [ -x "$t" ] || continue
    n=$(basename "$t")
    T=$t sh bench/cuda/trace.sh $TRACE_MODEL >"$OUT/trace-${n#tr-}.log" 2>&1 || rc=1
    echo "${n#tr-} trace:   [$(( $(date +%s) - S )) s]"
    grep -E "^\| [0-9]|a layer [0-9]" "$OUT/trace-${n#tr-}.log" | cut -c1-100
done
for t in /tmp/strata-ab/mv-*; do
    [ -x "$t" ] || continue
    n=$(basename "$t")
    "$t" --bench >"$OUT/mvbench-${n#mv-}.log" 2>&1 || rc=1
    echo "${n#mv-} mvbench:   [$(( $(date +%s) - S )) s]"
    grep -E "^\| [a-zA-Z]|read probe" "$OUT/mvbench-${n#mv-}.log" | cut -c1-110
done
if [ -d "$B/bin" ]; then
    STEPS=$(cat "$B/steps" 2>/dev/null) sh tests/cuda/device_run.sh /tmp/strata-bin || rc=1
fi
echo "done [$(( $(date +%s) - S )) s]"
exit $rc
