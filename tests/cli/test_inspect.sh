#!/bin/sh
# `strata inspect` on valid handcrafted files (tests/corpus/make_corpus.py):
# file facts, metadata values and abbreviation, the tensor table, the MoE
# summary (routed-expert bytes, largest/smallest expert blob and its layer),
# --no-tensors and --max-array.
# Env: STRATA, PYTHON. Prints "inspect: N passed, N failed".
STRATA=${STRATA:-build/strata}
PYTHON=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0

# has FILE NAME PATTERN: the output FILE has a line matching the fixed string PATTERN
has() {
    if grep -qF -- "$3" "$1"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $2: no line with '$3'" >&2; fi
}
hasnt() {
    if grep -qF -- "$3" "$1"; then fail=$((fail + 1)); echo "FAIL $2: unexpected '$3'" >&2; else pass=$((pass + 1)); fi
}
run() { # NAME ARGS...: run inspect, output in $tmp/NAME, must exit 0
    n=$1; shift
    "$STRATA" inspect "$@" >"$tmp/$n" 2>"$tmp/$n.err"
    rc=$?
    if [ "$rc" -eq 0 ] && [ ! -s "$tmp/$n.err" ]; then pass=$((pass + 1))
    else fail=$((fail + 1)); echo "FAIL $n: exit $rc: $(head -c 300 "$tmp/$n.err")" >&2; fi
}

if ! "$PYTHON" tests/corpus/make_corpus.py "$tmp/c" >"$tmp/py.log" 2>&1; then
    cat "$tmp/py.log" >&2
    echo "inspect: 0 passed, 1 failed"
    exit 1
fi
c=$tmp/c

run moe "$c/valid_moe.gguf"
o=$tmp/moe
has $o moe "version              3"
has $o moe "size                 43136 bytes (43.14 kB)"
has $o moe "alignment            32"
has $o moe "data offset          1536"
has $o moe "header               1532 bytes"
has $o moe "metadata (9 keys):"
has $o moe '"qwen3moe"'
has $o moe "qwen3moe.expert_count                      u32            4"
has $o moe "qwen3moe.attention.layer_norm_rms_epsilon  f32            1e-06"
has $o moe 'string[20]     ["tok0", "tok1", "tok2", "tok3", "tok4", "tok5", "tok6", "tok7", ... (20 total)]'
has $o moe "f32[20]        [0, -1, -2, -3, -4, -5, -6, -7, ... (20 total)]"
has $o moe "tensors (12):"
has $o moe "blk.0.ffn_up_exps.weight    q8_0    [32, 32, 4]           4352           9216"
has $o moe "blk.1.ffn_down_exps.weight  f16     [32, 32, 4]           8192          34944"
has $o moe "token_embd.weight           f32     [32, 20]              2560           1536"
has $o moe "architecture         qwen3moe"
has $o moe "layers               2"
has $o moe "experts              4 per layer, 2 used per token"
has $o moe "routed expert bytes  37632 (37.63 kB, 90.5%) in 6 tensors"
has $o moe "other bytes          3968 (3.97 kB, 9.5%)"
has $o moe "expert blob largest  6144 bytes (6.14 kB, layer 1)"
has $o moe "expert blob smallest 3264 bytes (3.26 kB, layer 0)"
# the fingerprint is stable from run to run
run moe2 "$c/valid_moe.gguf"
fp1=$(grep '^fingerprint' "$tmp/moe")
fp2=$(grep '^fingerprint' "$tmp/moe2")
if [ -n "$fp1" ] && [ "$fp1" = "$fp2" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL fingerprint '$fp1' vs '$fp2'" >&2; fi

run moe_short "$c/valid_moe.gguf" --no-tensors --max-array 2
o=$tmp/moe_short
has $o moe_short "tensors              12 (list skipped)"
hasnt $o moe_short "blk.0.ffn_up_exps.weight"
has $o moe_short '["tok0", "tok1", ... (20 total)]'
has $o moe_short "routed expert bytes  37632"
has $o moe_short "expert blob largest  6144 bytes (6.14 kB, layer 1)"

run moe_v2 "$c/valid_moe_v2.gguf" --max-array 100
has $tmp/moe_v2 moe_v2 "version              2"
has $tmp/moe_v2 moe_v2 '"tok19"]'
hasnt $tmp/moe_v2 moe_v2 "total)"

run types "$c/valid_all_types.gguf"
o=$tmp/types
has $o types "t.i8                  i8             -100"
has $o types "t.u64                 u64            9223372036854775808"
has $o types "t.i64                 i64            -4611686018427387904"
has $o types "t.f64                 f64            0.1"
has $o types "t.bool                bool           true"
has $o types 't.str                 string         "hello\nworld"'
has $o types "a.u64                 u64[2]         [1, 18446744073709551615]"
has $o types 'a.str                 string[3]      ["a", "", "c"]'
has $o types "a.bool                bool[2]        [true, false]"
has $o types "a.empty               i32[0]         []"
has $o types "experts              none (no <arch>.expert_count key)"
has $o types "expert blob          none"

run none "$c/valid_no_tensors.gguf"
has $tmp/none none "tensors (0):"
has $tmp/none none "routed expert bytes  0 (0 B, 0.0%) in 0 tensors"

run align "$c/valid_align64.gguf"
has $tmp/align align "alignment            64"
has $tmp/align align "general.alignment     u32            64"
has $tmp/align align "blk.0.ffn_up_exps.weight  f32     [4, 2, 2]"
has $tmp/align align "expert blob largest  32 bytes (32 B, layer 0)"

echo "inspect: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
