#!/bin/sh
# llama.cpp parity: strata against the real llama.cpp, the prebuilt shared
# libraries of the npm package @node-llama-cpp/linux-x64 (version pinned by
# tests/llama/package-lock.json; see tests/llama/README.md).
#
# Installs the package with `npm ci` into $BUILD/llama/npm (once; again only
# when the lockfile changes), builds the C helpers of tests/llama into
# $BUILD/llama, then runs tests/llama/parity.py: quantizers, tokenization,
# logits and greedy generation, each check one test. Prints
# "llama_parity: N passed, N failed".
#
# Skips cleanly (exit 0, "llama_parity: 0 passed, 0 failed", a SKIP line on
# stderr) when npm is missing, the registry cannot be reached, the package
# does not install on this platform (it is Linux x86-64 glibc only) or its
# libraries do not load here (e.g. a CPU without AVX2).
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
STRATA=${STRATA:-$BUILD/strata}
CC=${CC:-cc}
export BUILD PYTHON STRATA
dir=$BUILD/llama
npmdir=$dir/npm
lib=$npmdir/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64

skip() {
    echo "SKIP llama_parity: $*" >&2
    echo "llama_parity: 0 passed, 0 failed"
    exit 0
}
fail() {
    echo "FAIL llama_parity: $*" >&2
    echo "llama_parity: 0 passed, 1 failed"
    exit 1
}

mkdir -p "$npmdir" || fail "cannot create $npmdir"

# ---- the pinned llama.cpp (npm ci from the committed lockfile, cached) ----
if ! cmp -s tests/llama/package-lock.json "$npmdir/package-lock.json" || [ ! -f "$lib/libllama.v0.5.0.so" ]; then
    command -v npm >/dev/null 2>&1 || skip "npm not found (install Node.js >= 20 to run the llama.cpp oracle)"
    rm -rf "$npmdir/node_modules" "$npmdir/package-lock.json"
    cp tests/llama/package.json tests/llama/package-lock.json "$npmdir/" || fail "cannot copy the package files"
    to=
    command -v timeout >/dev/null 2>&1 && to="timeout 300"
    if ! (cd "$npmdir" && $to npm ci --ignore-scripts --no-audit --no-fund --cache ../npm-cache \
            --fetch-retries 1 --fetch-timeout 60000 >../npm.log 2>&1); then
        rm -f "$npmdir/package-lock.json"   # retried next run
        skip "npm ci failed (no registry access?): $(tail -n 3 "$dir/npm.log" | tr '\n' ' ')"
    fi
    # The package is an optional dependency: npm ci succeeds without it when it
    # cannot be fetched or does not fit this platform (Linux x86-64 glibc only).
    if [ ! -f "$lib/libllama.v0.5.0.so" ]; then
        rm -f "$npmdir/package-lock.json"   # retried next run
        skip "@node-llama-cpp/linux-x64 was not installed (no registry access, or not Linux x86-64 glibc; see $dir/npm.log)"
    fi
fi

# ---- helpers ----
cflags="-std=c11 -O2 -Wall -Wextra -D_GNU_SOURCE"
# `make asan` runs this suite with BUILD=build/asan: the helpers that link
# libstrata.a must be built with the sanitizers too. The llama.cpp libraries
# are not instrumented, so leak reports from them are off.
if nm "$BUILD/libstrata.a" 2>/dev/null | grep -q __asan_report; then
    cflags="$cflags -fsanitize=address,undefined -fno-omit-frame-pointer"
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
    export ASAN_OPTIONS
fi
build_tool() { # name, extra args...
    out=$dir/$1; src=tests/llama/$1.c; shift
    if [ ! -x "$out" ] || [ "$src" -nt "$out" ] || [ "$BUILD/libstrata.a" -nt "$out" ]; then
        # shellcheck disable=SC2086  # cflags is a word list
        $CC $cflags -o "$out" "$src" "$@" || fail "cannot build $out"
    fi
}
build_tool llama_oracle -ldl
build_tool ggml_quant_check -Isrc "$BUILD/libstrata.a" -ldl -lm -lpthread
build_tool strata_pieces -Isrc "$BUILD/libstrata.a" -lpcre2-8 -luring -lm -lpthread

# ---- does the library load and match the transcribed ABI here? ----
"$dir/llama_oracle" --lib "$lib" info >"$dir/info.txt" 2>&1
rc=$?
[ $rc -eq 3 ] && skip "llama.cpp does not load here: $(tail -n 1 "$dir/info.txt")"
[ $rc -eq 0 ] || fail "llama_oracle info exited $rc: $(tail -n 3 "$dir/info.txt")"
head -n 1 "$dir/info.txt"

LLAMA_LIB=$lib exec "$PYTHON" tests/llama/parity.py
