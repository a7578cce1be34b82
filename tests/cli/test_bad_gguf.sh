#!/bin/sh
# The corrupt-GGUF corpus against `strata inspect`: every bad file must give
# exit code 1 (never a signal), exactly one line on stderr naming the problem
# (the substring listed in the corpus manifest) and nothing on stdout; the
# valid files in the corpus must inspect fine. Plus usage errors (exit 2) and
# files that cannot be opened (exit 1).
# Env: STRATA (the binary), PYTHON (python3). Prints "bad_gguf: N passed, N failed".
STRATA=${STRATA:-build/strata}
PYTHON=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
bad() { fail=$((fail + 1)); echo "FAIL $*" >&2; }

# expect NAME CODE SUBSTRING -- ARGS...: run `strata inspect ARGS`, check the
# exit code, that stderr is one line containing SUBSTRING (code != 0) or empty
# (code 0), and that stdout is empty on errors.
expect() {
    name=$1; want=$2; sub=$3; shift 4
    "$STRATA" inspect "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    lines=$(wc -l <"$tmp/err")
    if [ "$rc" -ge 128 ]; then bad "$name: killed by signal $((rc - 128))"; return; fi
    if [ "$rc" -ne "$want" ]; then bad "$name: exit $rc, want $want: $(head -c 300 "$tmp/err")"; return; fi
    if [ "$want" -eq 0 ]; then
        if [ -s "$tmp/err" ]; then bad "$name: unexpected stderr: $(head -c 300 "$tmp/err")"; return; fi
        pass=$((pass + 1)); return
    fi
    if [ "$lines" -ne 1 ]; then bad "$name: $lines lines on stderr, want 1"; return; fi
    if ! grep -qF -- "$sub" "$tmp/err"; then bad "$name: stderr lacks '$sub': $(cat "$tmp/err")"; return; fi
    if ! grep -q '^strata inspect: ' "$tmp/err"; then bad "$name: stderr not 'strata inspect: ...'"; return; fi
    if [ -s "$tmp/out" ] && [ "$want" -eq 1 ]; then bad "$name: output on stdout despite the error"; return; fi
    pass=$((pass + 1))
}

if ! "$PYTHON" tests/corpus/make_corpus.py "$tmp/c" >"$tmp/py.log" 2>&1; then
    cat "$tmp/py.log" >&2
    echo "bad_gguf: 0 passed, 1 failed"
    exit 1
fi
tab=$(printf '\t')
n_cases=0
while IFS="$tab" read -r name code sub; do
    n_cases=$((n_cases + 1))
    expect "$name" "$code" "$sub" -- "$tmp/c/$name"
    if [ "$code" -eq 0 ] && ! grep -q '^summary:' "$tmp/out"; then bad "$name: no summary in the output"; fi
done <"$tmp/c/manifest.tsv"
[ "$n_cases" -ge 50 ] || bad "corpus has only $n_cases files"

# usage errors: exit 2, one line
expect no_args 2 "no model given" --
expect bad_flag 2 "unknown option '--bogus'" -- --bogus "$tmp/c/valid_moe.gguf"
expect max_array_zero 2 "--max-array" -- --max-array 0 "$tmp/c/valid_moe.gguf"
expect max_array_word 2 "--max-array" -- --max-array lots "$tmp/c/valid_moe.gguf"
expect max_array_missing 2 "needs a value" -- "$tmp/c/valid_moe.gguf" --max-array
expect two_models 2 "more than one model" -- "$tmp/c/valid_moe.gguf" "$tmp/c/valid_moe.gguf"
# files that cannot be read: exit 1
expect missing_file 1 "cannot open '$tmp/c/nope.gguf': No such file or directory" -- "$tmp/c/nope.gguf"
expect directory 1 "is not a regular file" -- "$tmp/c"
# flags that work
expect help 0 "" -- --help
grep -q '^usage: strata inspect' "$tmp/out" || bad "help: no usage on stdout"
expect model_flag 0 "" -- -m "$tmp/c/valid_moe.gguf" --no-tensors --max-array 3

echo "bad_gguf: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
