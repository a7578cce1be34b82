#!/bin/sh
# Pack build/prebuilt for bench/cuda/device_ab.sh: the candidate tree's
# three CUDA test binaries, and test_cuda_model of each named tree, linked
# static (bench/cuda/link_static.sh) and xz-compressed. Each tree must be
# built already (make BUILD=build/cu cuda; other revisions: git worktree add
# /tmp/x REV && make -C /tmp/x BUILD=build/cu cuda).
# Usage: sh bench/cuda/pack.sh CANDIDATE_TREE [NAME=TREE ...] [trace:NAME=TREE ...]
#                              [mvbench:NAME=TREE ...]
#   then write build/prebuilt/pairs ("OLD NEW ROUNDS" lines) and, if
#   wanted, build/prebuilt/steps ("bench memcheck").
#   trace:NAME=TREE packs TREE's trace build (make BUILD=build/trace
#   CUDA_TRACE=1 cuda there first) as ab/tr-NAME; device_ab.sh runs
#   bench/cuda/trace.sh with each after the pairs.
#   mvbench:NAME=TREE packs TREE's test_cuda as ab/mv-NAME; device_ab.sh
#   runs its --bench (every matvec shape's GB/s) after the traces, so two
#   trees' shapes are compared in one call.
# Example: sh bench/cuda/pack.sh . base=/tmp/base new=. trace:new=.
#          echo "base new 3" > build/prebuilt/pairs
set -e
C=${1:?usage: pack.sh CANDIDATE_TREE [NAME=TREE ...]}
shift
P=build/prebuilt
rm -rf "$P/bin" "$P/ab"
mkdir -p "$P/bin" "$P/ab"
T=$(mktemp -d)
sh bench/cuda/link_static.sh "$C" "$T/cand" >/dev/null
for t in test_cuda test_cuda_layer test_cuda_model; do xz -T2 -6 -c "$T/cand/$t" >"$P/bin/$t.xz"; done
for nt in "$@"; do
    n=${nt%%=*} t=${nt#*=} bd=build/cu bin=test_cuda_model
    case $n in
    trace:*) n=tr-${n#trace:} bd=build/trace ;;
    mvbench:*) n=mv-${n#mvbench:} bin=test_cuda ;;
    esac
    BD=$bd sh bench/cuda/link_static.sh "$t" "$T/$n" >/dev/null
    xz -T2 -6 -c "$T/$n/$bin" >"$P/ab/$n.xz"
done
rm -rf "$T"
du -sh "$P"
