#!/bin/sh
# Link test_cuda, test_cuda_layer and test_cuda_model of a checkout (already
# built with `make BUILD=build/cu cuda`) with cudart, liburing, pcre2 and
# microhttpd static, into OUT, stripped: the device image lacks the CPU
# library's build dependencies, so its binaries are built here and carried
# (device `run` with carry=[OUT]). Static libcjson does not exist and
# libmicrohttpd.a needs gnutls for the CLI, so only the tests are linked.
#
# Usage: sh bench/cuda/link_static.sh TREE OUT
#   TREE  a checkout (this one: .; a base revision for bench/cuda/ab.sh:
#         git worktree add /tmp/base REV && make -C /tmp/base BUILD=build/cu cuda)
#   OUT   a folder, e.g. build/prebuilt/bin (build/ is ignored: carry it)
#   BD    (environment) the tree's build folder, default build/cu (a trace
#         build: BD=build/trace, bench/cuda/trace.sh)
set -e
BD=${BD:-build/cu}
T=${1:?usage: link_static.sh TREE OUT}
O=${2:?usage: link_static.sh TREE OUT}
mkdir -p "$O"
O=$(cd "$O" && pwd)
cd "$T"
CF="-std=c11 -O2 -g -Wall -Wextra -Wpointer-arith -Wvla -D_GNU_SOURCE -Isrc -Iapps/cli -Iapps/eval -pthread -Itests"
LIBS="$BD/cuda/libstrata_cuda.a $BD/libstrata.a -pthread -L${CUDA_HOME:-/usr/local/cuda}/lib64 -Wl,-Bstatic -lcudart_static -lpcre2-8 -luring -lmicrohttpd -Wl,-Bdynamic -lcjson -ldl -lrt -lpthread -lstdc++ -lm"
for t in test_cuda test_cuda_layer test_cuda_model; do
    cc $CF -o "$O/$t" "tests/cuda/$t.c" $LIBS
    strip "$O/$t"
done
ls -la "$O"
