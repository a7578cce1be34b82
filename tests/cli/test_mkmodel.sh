#!/bin/sh
# `strata mkmodel` end to end: the tiny preset is under 1 MB, deterministic
# for a seed, opens with `strata inspect`, `strata tokenize` and the
# independent Python reader (tests/ref/gguf_ref.py); the route-skew report
# reaches the asked exponent; bad flags exit 2 with one line
# "strata mkmodel: ..."; an unwritable path exits 1.
# Env: STRATA (the binary), PYTHON. Prints "mkmodel_cli: N passed, N failed".
STRATA=${STRATA:-build/strata}
PYTHON=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*" >&2; }

# usage NAME ARGS...: must exit 2 with exactly one line "strata mkmodel: ..."
# (a usage text may follow it only for unknown options / missing -o).
usage() {
    name=$1; shift
    "$STRATA" mkmodel "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ "$rc" -ne 2 ]; then bad "$name: exit $rc, want 2: $(head -c 200 "$tmp/err")"; return; fi
    if ! head -n 1 "$tmp/err" | grep -q '^strata mkmodel: '; then bad "$name: first stderr line: $(head -n 1 "$tmp/err")"; return; fi
    if [ -s "$tmp/out" ]; then bad "$name: output on stdout"; return; fi
    ok
}

M="$tmp/tiny.gguf"
if "$STRATA" mkmodel -o "$M" --preset tiny --seed 1 >"$tmp/rep" 2>"$tmp/err"; then ok; else bad "tiny: exit $?: $(cat "$tmp/err")"; fi
size=$(wc -c <"$M" 2>/dev/null || echo 0)
if [ "$size" -gt 100000 ] && [ "$size" -lt 1000000 ]; then ok; else bad "tiny size $size"; fi
if grep -q "^mkmodel: wrote $M" "$tmp/rep" && grep -q "GB/s written" "$tmp/rep" && grep -q "in 27 tensors" "$tmp/rep"; then ok
else bad "report: $(cat "$tmp/rep")"; fi

# determinism
"$STRATA" mkmodel -q -o "$tmp/b.gguf" --seed 1 -t 1 >"$tmp/out" 2>&1
if cmp -s "$M" "$tmp/b.gguf"; then ok; else bad "same seed, different bytes"; fi
if [ ! -s "$tmp/out" ]; then ok; else bad "-q printed: $(cat "$tmp/out")"; fi
"$STRATA" mkmodel -q -o "$tmp/c.gguf" --seed 2
if ! cmp -s "$M" "$tmp/c.gguf"; then ok; else bad "seeds 1 and 2 give the same file"; fi
rm -f "$tmp/b.gguf" "$tmp/c.gguf"

# readers
if "$STRATA" inspect "$M" >"$tmp/ins" 2>"$tmp/err"; then
    if grep -q qwen3moe "$tmp/ins" && grep -q "ffn_down_exps" "$tmp/ins"; then ok; else bad "inspect output"; fi
else
    bad "inspect: $(cat "$tmp/err")"
fi
if "$STRATA" tokenize -m "$M" -p "Hello world <think>" --ids >"$tmp/ids" 2>"$tmp/err" && grep -q '^\[' "$tmp/ids"; then ok
else bad "tokenize: $(cat "$tmp/err")"; fi
if "$PYTHON" -c "import numpy" 2>/dev/null; then
    if "$PYTHON" - "$M" >"$tmp/py" 2>&1 <<'EOF'
import sys
sys.path.insert(0, "tests/ref")
import gguf_ref
g = gguf_ref.GGUFFile(sys.argv[1])
m = g.metadata
assert m["general.architecture"] == "qwen3moe"
assert m["qwen3moe.block_count"] == 2 and m["qwen3moe.expert_count"] == 8
assert len(m["tokenizer.ggml.tokens"]) == 512 == g.tensors["token_embd.weight"].ne[1]
assert list(g.tensors)[-1] == "output.weight"
x = g.array("blk.0.ffn_down_exps.weight")
assert x.shape == (8, 64, 32) and abs(float(x.std()) - 32 ** -0.5 / 2 ** 0.5) < 0.02, x.std()
print("ok")
EOF
    then ok; else bad "gguf_ref: $(cat "$tmp/py")"; fi
fi

# quantized + skewed: the report shows the fitted exponent
if "$STRATA" mkmodel -o "$tmp/s.gguf" --embd 256 --ff-exp 256 --experts 64 --experts-used 4 --type q4_K \
        --route-skew 1 >"$tmp/rep" 2>"$tmp/err"; then
    ex=$(sed -n 's/.*fitted Zipf exponent \([0-9.]*\).*/\1/p' "$tmp/rep")
    if [ -n "$ex" ] && awk -v x="$ex" 'BEGIN { exit !(x > 0.8 && x < 1.2) }'; then ok; else bad "skew exponent '$ex': $(cat "$tmp/rep")"; fi
    if "$STRATA" inspect "$tmp/s.gguf" >/dev/null 2>&1; then ok; else bad "inspect skewed q4_K"; fi
else
    bad "skewed: $(cat "$tmp/err")"
fi
rm -f "$tmp/s.gguf"

# --ftype: llama-quantize's Q4_K_M types (16 layers, 16 experts: attn_v q6_K on 8 layers)
if "$STRATA" mkmodel -o "$tmp/f.gguf" --embd 256 --ff-exp 256 --head-dim 64 --layers 16 --experts 16 --ftype q4_k_m \
        >"$tmp/rep" 2>"$tmp/err"; then
    if grep -q "Q4_K_M as llama-quantize picks them" "$tmp/rep"; then ok; else bad "--ftype report: $(cat "$tmp/rep")"; fi
    "$STRATA" inspect "$tmp/f.gguf" >"$tmp/out" 2>&1
    nv=$(grep -c 'attn_v.weight *q6_K' "$tmp/out")
    if [ "$nv" -eq 8 ] && grep -q 'general.file_type .* 15$' "$tmp/out"; then ok
    else bad "--ftype q4_k_m: $nv q6_K attn_v, $(grep file_type "$tmp/out")"; fi
else
    bad "--ftype: $(cat "$tmp/err")"
fi
rm -f "$tmp/f.gguf"

# --help
if "$STRATA" mkmodel --help >"$tmp/out" 2>&1 && grep -q -- "--route-skew" "$tmp/out"; then ok; else bad "--help"; fi

# usage errors
usage no-output --preset tiny
usage unknown-flag -o "$tmp/x.gguf" --bogus
usage bad-preset -o "$tmp/x.gguf" --preset 7b
usage bad-type -o "$tmp/x.gguf" --type q9_9
usage unsupported-type -o "$tmp/x.gguf" --type-experts iq2_xxs
usage zero-layers -o "$tmp/x.gguf" --layers 0
usage nan-layers -o "$tmp/x.gguf" --layers abc
usage missing-value -o "$tmp/x.gguf" --experts
usage used-gt-experts -o "$tmp/x.gguf" --experts 4 --experts-used 5
usage heads-kv -o "$tmp/x.gguf" --heads 6 --heads-kv 4
usage small-vocab -o "$tmp/x.gguf" --vocab 100
usage bad-skew -o "$tmp/x.gguf" --route-skew -1
usage bad-seed -o "$tmp/x.gguf" --seed -5
usage bad-ftype -o "$tmp/x.gguf" --ftype Q7_K
usage ftype-and-type -o "$tmp/x.gguf" --ftype Q4_K_M --type-experts q8_0
if [ ! -e "$tmp/x.gguf" ]; then ok; else bad "a usage error left a file"; fi

# runtime error: unwritable path
"$STRATA" mkmodel -q -o "$tmp/no/such/dir/x.gguf" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q '^strata mkmodel: ' "$tmp/err"; then ok
else bad "unwritable: exit $rc: $(cat "$tmp/err")"; fi

echo "mkmodel_cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
