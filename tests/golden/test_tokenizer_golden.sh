#!/bin/sh
# Golden tokenizer ids: strata tokenize against ids committed in
# tests/golden/tokenizer_ids.tsv (written by the independent Python reference
# bpe_ref.py, see README.md). The vocabularies are rebuilt into $BUILD by
# make_vocab.py (deterministic; checked against vocab.sha256); the goldens are
# never rebuilt here, so a change on either side fails a test.
# Each (case, vocabulary, flags) run is one test. Prints
# "tokenizer_golden: N passed, N failed".
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
STRATA=${STRATA:-$BUILD/strata}
dir=$BUILD/golden
vocab=$dir/vocab
work=$dir/cases
rm -rf "$work"
if ! "$PYTHON" tests/golden/make_vocab.py --out "$vocab"; then
    echo "tokenizer_golden: 0 passed, 1 failed"
    exit 1
fi
if ! "$PYTHON" tests/golden/bpe_ref.py plan "$vocab" "$work"; then
    echo "tokenizer_golden: 0 passed, 1 failed"
    exit 1
fi
passed=0
failed=0
tab=$(printf '\t')
while IFS="$tab" read -r idx key v flags want; do
    [ "$flags" = "-" ] && flags=
    # shellcheck disable=SC2086  # flags is a word list
    "$STRATA" tokenize -m "$vocab/$v.gguf" -f "$work/$idx.txt" --ids --no-escape $flags \
        >"$work/$idx.out" 2>"$work/$idx.err"
    got=
    read -r got <"$work/$idx.out"    # a builtin: no fork per test
    if [ "$got" = "$want" ]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        if [ "$failed" -le 20 ]; then
            echo "FAIL $key ($v$flags): want $want" >&2
            echo "                    got  $got $(head -c 200 "$work/$idx.err")" >&2
        fi
    fi
done < "$work/plan.tsv"

# The command line itself: llama-tokenize's output forms, escapes, exit codes.
check() { # name, expected, actual
    if [ "$2" = "$3" ]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        printf 'FAIL cli %s:\n  want %s\n  got  %s\n' "$1" "$2" "$3" >&2
    fi
}
q=$vocab/qwen2.gguf
check "listing" "$(printf '  1382 -> %s\n   849 -> %s' "'Hello'" "' world'")" \
    "$("$STRATA" tokenize -m "$q" -p 'Hello world' 2>&1)"
check "escapes on by default" "$("$STRATA" tokenize -m "$q" -p "$(printf 'a\nb')" --ids)" \
    "$("$STRATA" tokenize -m "$q" -p 'a\nb' --ids)"
check "--no-escape" "[64, 1338, 65]" "$("$STRATA" tokenize -m "$q" -p 'a\nb' --ids --no-escape)"
check "--show-count" "$(printf '[1382, 849]\nTotal number of tokens: 2')" \
    "$("$STRATA" tokenize -m "$q" -p 'Hello world' --ids --show-count)"
check "--stdin" "[1382, 849]" "$(printf 'Hello world' | "$STRATA" tokenize -m "$q" --stdin --ids)"
check "control shown in listing" "  3258 -> '<|im_end|>'" "$("$STRATA" tokenize -m "$q" -p '<|im_end|>')"
"$STRATA" tokenize -p x >/dev/null 2>"$work/e1"; check "no model: exit 2" 2 $?
check "no model: one line" "strata tokenize: a model is required (-m FILE)" "$(cat "$work/e1")"
"$STRATA" tokenize -m "$q" >/dev/null 2>&1; check "no prompt: exit 2" 2 $?
"$STRATA" tokenize -m "$q" -p a -f b >/dev/null 2>&1; check "two prompts: exit 2" 2 $?
"$STRATA" tokenize -m "$q" -p a --bogus >/dev/null 2>&1; check "unknown flag: exit 2" 2 $?
"$STRATA" tokenize -m "$q" -p >/dev/null 2>&1; check "missing value: exit 2" 2 $?
"$STRATA" tokenize -m "$work/none.gguf" -p a >/dev/null 2>"$work/e2"; check "missing file: exit 1" 1 $?
check "missing file: one line" 1 "$(wc -l < "$work/e2" | tr -d ' ')"
"$STRATA" tokenize -m "$work/plan.tsv" -p a >/dev/null 2>&1; check "not a GGUF: exit 1" 1 $?
"$STRATA" tokenize -m "$vocab/nopre.gguf" -p hi --ids >/dev/null 2>"$work/e3"; check "missing pre: exit 0" 0 $?
check "missing pre: warning on stderr" 1 "$(grep -c 'warning: missing pre-tokenizer' "$work/e3")"
"$STRATA" tokenize --help >/dev/null 2>&1; check "--help: exit 0" 0 $?

echo "tokenizer_golden: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
