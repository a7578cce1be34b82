#!/bin/sh
# test_perplexity: `strata perplexity` against llama-perplexity's arithmetic
# re-done independently in numpy (tests/eval/llama_ref.py) from the model's
# raw logits (build/tests/dump_logits): the running [i]ppl line and the
# Final estimate, the base file byte for byte, the --kl-divergence chunk
# table and statistics blocks as text, on generated models (f32, an
# add_bos variant, a q4_K-experts variant). Then the committed base file
# tests/eval/tiny_base.bin (llama_ref.py's, from `mkmodel --preset tiny`
# on tests/eval/ppl_text.txt, -c 64 --chunks 2) read back, self-scoring,
# and every refusal: short text, foreign vocabulary, context, truncated or
# padded or foreign files, usage.
# Regenerate the fixture (only when the tiny model's logits change):
#   python3 tests/eval/llama_ref.py ppl --strata build/strata --dump build/tests/dump_logits \
#     --model TINY.gguf --text tests/eval/ppl_text.txt -c 64 --chunks 2 --base tests/eval/tiny_base.bin
# Prints "perplexity: N passed, N failed". Env: STRATA, BUILD, PYTHON.
STRATA=${STRATA:-build/strata}
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
DUMP=$BUILD/tests/dump_logits
REF="$PYTHON tests/eval/llama_ref.py"
TEXT=tests/eval/ppl_text.txt
FIXTURE=tests/eval/tiny_base.bin
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

ok()  { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
check() { d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }
# exits CODE DESCRIPTION COMMAND...: passes when the command exits with CODE
exits() {
    want=$1; d=$2; shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"
    got=$?
    if [ "$got" -eq "$want" ]; then ok; else bad "$d (exit $got, wanted $want)"; sed 's/^/    /' "$tmp/err" >&2; fi
}
has() { grep -q -- "$2" "$1"; }
# same DESCRIPTION A B: files equal, else show the difference
same() {
    if cmp -s "$2" "$3"; then ok; else bad "$1"; diff "$2" "$3" | head -n 10 | sed 's/^/    /' >&2; fi
}
# one_line FILE: exactly one line on stderr (the error contract)
one_line() { [ "$(wc -l <"$1")" -eq 1 ]; }

if ! "$PYTHON" -c 'import numpy' 2>/dev/null; then
    echo "SKIP perplexity: numpy missing" >&2
    echo "perplexity: 0 passed, 0 failed"
    exit 0
fi

# ==== models ====
M=$tmp/tiny.gguf; MB=$tmp/tiny_bos.gguf; MV=$tmp/vocab600.gguf
MF=$tmp/wide.gguf; MQ=$tmp/wide_q4k.gguf
$STRATA mkmodel --preset tiny -q -o "$M" >/dev/null 2>&1 || { echo "perplexity: 0 passed, 1 failed"; exit 1; }
$REF set-add-bos "$M" "$MB"
$STRATA mkmodel --preset tiny --vocab 600 -q -o "$MV" >/dev/null 2>&1
$STRATA mkmodel --preset tiny --experts 16 --embd 256 -q -o "$MF" >/dev/null 2>&1
$STRATA mkmodel --preset tiny --experts 16 --embd 256 --type-experts q4_K -q -o "$MQ" >/dev/null 2>&1

PPL="$STRATA perplexity -t 2"

# ==== perplexity: [i]ppl and Final estimate, recomputed in numpy ====
exits 0 "perplexity -c 128" $PPL -m "$M" -f $TEXT -c 128 --chunks 4
cp "$tmp/out" "$tmp/s_plain"
check "stderr says what it computes" has "$tmp/err" "calculating perplexity over 4 chunks, n_ctx=128"
$REF ppl --strata "$STRATA" --dump "$DUMP" --model "$M" --text $TEXT -c 128 --chunks 4 >"$tmp/p_plain"
same "[i]ppl line and Final estimate equal numpy's" "$tmp/s_plain" "$tmp/p_plain"
check "running output has 4 values" grep -q '^\[1\][0-9.]*,\[2\][0-9.]*,\[3\][0-9.]*,\[4\][0-9.]*,$' "$tmp/s_plain"
check "Final estimate line" grep -q '^Final estimate: PPL = [0-9.]* +/- [0-9.]*$' "$tmp/s_plain"

# all chunks when --chunks is not given: floor(n_tokens / n_ctx)
exits 0 "perplexity, all chunks" $PPL -m "$M" -f $TEXT -c 256
n_tok=$($STRATA tokenize -m "$M" -f $TEXT --ids --no-parse-special --no-escape | tr ',' '\n' | wc -l)
check "n_chunk = floor(tokens / n_ctx)" grep -q "\[$((n_tok / 256))\][0-9.]*,$" "$tmp/out"

# ==== base file: byte for byte, and the printed figures ====
exits 0 "write a base file" $PPL -m "$M" -f $TEXT -c 128 --chunks 4 --kl-divergence-base "$tmp/s.base"
cp "$tmp/out" "$tmp/s_base_out"
$REF ppl --strata "$STRATA" --dump "$DUMP" --model "$M" --text $TEXT -c 128 --chunks 4 --base "$tmp/p.base" >"$tmp/p_base_out"
same "base file identical to numpy's by the format's rules" "$tmp/s.base" "$tmp/p.base"
same "figures while writing a base (float nll) equal numpy's" "$tmp/s_base_out" "$tmp/p_base_out"
check "base file size: 20 + 4*n_ctx*n_chunk + 2*nv*scored*n_chunk" \
    test "$(wc -c <"$tmp/s.base")" -eq $((20 + 4 * 128 * 4 + 2 * (512 + 4) * 63 * 4))
exits 0 "-b 7 -t 1 writes the same base" $STRATA perplexity -m "$M" -f $TEXT -c 128 --chunks 4 -b 7 -t 1 \
    --kl-divergence-base "$tmp/s7.base"
same "chunked evaluation: same base file" "$tmp/s.base" "$tmp/s7.base"

# a model that adds BOS: tokens[0] of each chunk evaluated as BOS, the file keeps the text's tokens
exits 0 "base file, add_bos model" $PPL -m "$MB" -f $TEXT -c 64 --chunks 5 --kl-divergence-base "$tmp/sb.base"
cp "$tmp/out" "$tmp/sb_out"
$REF ppl --strata "$STRATA" --dump "$DUMP" --model "$MB" --text $TEXT -c 64 --chunks 5 --base "$tmp/pb.base" >"$tmp/pb_out"
same "add_bos: base file identical to numpy's" "$tmp/sb.base" "$tmp/pb.base"
same "add_bos: figures equal numpy's" "$tmp/sb_out" "$tmp/pb_out"
check "add_bos: the file's first token is BOS (503)" \
    "$PYTHON" -c "import struct,sys; sys.exit(struct.unpack('<i', open('$tmp/sb.base','rb').read()[20:24])[0] != 503)"

# ==== --kl-divergence: q4_K experts against the f32 model's base ====
exits 0 "base of the f32 wide model" $PPL -m "$MF" -f $TEXT -c 128 --chunks 4 --kl-divergence-base "$tmp/w.base"
exits 0 "q4_K scored against it" $PPL -m "$MQ" --kl-divergence-base "$tmp/w.base" --kl-divergence
cp "$tmp/out" "$tmp/s_kld"
$REF kld --dump "$DUMP" --model "$MQ" --base "$tmp/w.base" >"$tmp/p_kld"
same "KLD chunk table and statistics blocks equal numpy's" "$tmp/s_kld" "$tmp/p_kld"
for block in "====== Perplexity statistics ======" "Cor(ln(PPL(Q)), ln(PPL(base)))" "Mean ln(PPL(Q)/PPL(base))" \
             "Mean PPL(Q)/PPL(base)" "Mean PPL(Q)-PPL(base)" "====== KL divergence statistics ======" "99.9%   KLD" \
             "Median  KLD" " 0.1%   KLD" "Minimum KLD" "====== Token probability statistics ======" "75.0%   Δp" \
             "25.0%   Δp" "RMS Δp    :" "Same top p:"; do
    check "KLD output has '$block'" has "$tmp/s_kld" "$block"
done
check "KLD: 4 chunk rows" test "$(grep -c '^   [1-4]    ' "$tmp/s_kld")" -eq 4
exits 0 "-c larger than the base's context" $PPL -m "$MQ" --kl-divergence-base "$tmp/w.base" --kl-divergence -c 256
same "-c 256 scores the same (chunks keep the base's n_ctx)" "$tmp/out" "$tmp/s_kld"
exits 0 "--chunks 1 with --kl-divergence" $PPL -m "$MQ" --kl-divergence-base "$tmp/w.base" --kl-divergence --chunks 1
check "--chunks 1: one row, no statistics under 100 tokens" sh -c "! grep -q 'statistics ======' '$tmp/out' && grep -q 'no summary statistics' '$tmp/err'"

# a model against its own base: only the base's 16-bit quantisation remains
exits 0 "self-scoring" $PPL -m "$MF" --kl-divergence-base "$tmp/w.base" --kl-divergence
check "self: Same top p 100%" has "$tmp/out" "^Same top p: 100.000 ± 0.000 %"
check "self: |KLD| < 1e-4 everywhere" "$PYTHON" -c "
import re,sys
t=open('$tmp/out').read()
v=[float(x) for x in re.findall(r'^(?:Maximum|Minimum) KLD: +(-?[0-9.]+)', t, re.M)]
sys.exit(not (len(v)==2 and max(abs(x) for x in v) < 1e-4))"
check "self: Cor 100%" has "$tmp/out" "^Cor(ln(PPL(Q)), ln(PPL(base))): 100.00%"

# ==== the committed fixture ====
exits 0 "fixture's context and chunks from strata" $PPL -m "$M" -f $TEXT -c 64 --chunks 2 --kl-divergence-base "$tmp/fx.base"
check "fixture header and tokens equal strata's (532 bytes)" \
    cmp -s -n 532 "$FIXTURE" "$tmp/fx.base"
check "fixture size by the format" test "$(wc -c <"$FIXTURE")" -eq $((20 + 4 * 64 * 2 + 2 * 516 * 31 * 2))
exits 0 "score the tiny model against the fixture" $PPL -m "$M" --kl-divergence-base "$FIXTURE" --kl-divergence
cp "$tmp/out" "$tmp/s_fx"
$REF kld --dump "$DUMP" --model "$M" --base "$FIXTURE" >"$tmp/p_fx"
same "fixture: chunk table equals numpy's" "$tmp/s_fx" "$tmp/p_fx"
check "fixture: Same top p 100% in both chunks" test "$(grep -c '100.000 ±  0.000 %$' "$tmp/s_fx")" -eq 2
check "fixture: |KLD| < 1e-4" "$PYTHON" -c "
import sys
r=[l.split() for l in open('$tmp/s_fx') if l[:4].strip().isdigit()]
sys.exit(not (len(r)==2 and all(abs(float(x[7]))<1e-4 for x in r)))"

# ==== refusals: one line, exit 1 (runtime) or 2 (usage) ====
head -c 300 $TEXT >"$tmp/short.txt"
exits 1 "text shorter than 2*n_ctx tokens" $PPL -m "$M" -f "$tmp/short.txt" -c 128
check "short text: message" has "$tmp/err" "tokenizes to only [0-9]* tokens; a context of 128 needs at least 256"
check "short text: one line" one_line "$tmp/err"
exits 1 "base from another vocabulary" $PPL -m "$MV" --kl-divergence-base "$tmp/w.base" --kl-divergence
check "vocabulary mismatch: message" has "$tmp/err" "has a vocabulary of 512 tokens, the model 600"
exits 1 "-c smaller than the base's context" $PPL -m "$MQ" --kl-divergence-base "$tmp/w.base" --kl-divergence -c 64
check "context mismatch: message" has "$tmp/err" "computed with a context of 128, larger than -c 64"
head -c 30000 "$tmp/w.base" >"$tmp/trunc.base"
exits 1 "truncated base file" $PPL -m "$MQ" --kl-divergence-base "$tmp/trunc.base" --kl-divergence
check "truncated: message" has "$tmp/err" "is truncated: 30000 bytes, but n_ctx 128, n_vocab 512 and 4 chunks make"
check "truncated: one line" one_line "$tmp/err"
head -c 12 "$tmp/w.base" >"$tmp/hdr.base"
exits 1 "base cut inside its header" $PPL -m "$MQ" --kl-divergence-base "$tmp/hdr.base" --kl-divergence
check "cut header: message" has "$tmp/err" "shorter than its 20-byte header"
cat "$tmp/w.base" $TEXT >"$tmp/long.base"
exits 1 "bytes after the last record" $PPL -m "$MQ" --kl-divergence-base "$tmp/long.base" --kl-divergence
check "padded: message" has "$tmp/err" "bytes after its last record"
"$PYTHON" - "$tmp/w.base" "$tmp/tok.base" "$tmp/rec.base" <<'EOF'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
t = bytearray(b); t[20 + 4 * 5:24 + 4 * 5] = struct.pack("<i", 9999)          # token 5
open(sys.argv[2], "wb").write(t)
r = bytearray(b); off = 20 + 4 * 128 * 4 + 2 * 516 * 63                      # chunk 2's first record
r[off:off + 4] = struct.pack("<f", float("nan"))
open(sys.argv[3], "wb").write(r)
EOF
exits 1 "token outside the vocabulary" $PPL -m "$MQ" --kl-divergence-base "$tmp/tok.base" --kl-divergence
check "bad token: message, one line" sh -c "grep -q 'token 5 is 9999, outside the vocabulary (512 tokens)' '$tmp/err' && [ \$(wc -l <'$tmp/err') -eq 1 ]"
exits 1 "record with a NaN scale" $PPL -m "$MQ" --kl-divergence-base "$tmp/rec.base" --kl-divergence
check "bad record: message" has "$tmp/err" "chunk 2, position 64: bad record (scale nan"
exits 1 "not a base file" $PPL -m "$MQ" --kl-divergence-base $TEXT --kl-divergence
check "no magic: message" has "$tmp/err" 'no "_logits_" magic'
exits 1 "missing base file" $PPL -m "$MQ" --kl-divergence-base "$tmp/none.base" --kl-divergence
exits 1 "base file cannot be created" $PPL -m "$M" -f $TEXT -c 128 --chunks 2 --kl-divergence-base "$tmp/no/such/dir/x"
exits 2 "no model" $PPL -f $TEXT
exits 2 "no text" $PPL -m "$M"
exits 2 "--kl-divergence without a base" $PPL -m "$M" --kl-divergence
exits 2 "-c 2" $PPL -m "$M" -f $TEXT -c 2
exits 2 "--chunks 0" $PPL -m "$M" -f $TEXT --chunks 0
exits 2 "unknown flag" $PPL -m "$M" -f $TEXT --bogus
check "usage error: one line" one_line "$tmp/err"
exits 0 "--help" $PPL --help
check "--help names --kl-divergence-base" has "$tmp/out" "kl-divergence-base"

echo "perplexity: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
