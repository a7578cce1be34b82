#!/bin/sh
# test_run: `strata run`, `strata chat` and build/tests/dump_logits on tiny
# qwen3moe models: determinism, flags, output contract, chunked prefill and
# split evaluation (bit-identical logits: the forward's numerics do not depend
# on chunking or threads, so the tolerance is 0), loader errors, the
# no-allocation decode loop, and (when numpy is there) the float64 oracle.
# Models come from `strata mkmodel --preset tiny` (f32 and q8_0); broken
# files from tests/cli/mk_tiny_gguf.py.
# Prints "run: N passed, N failed". Env: STRATA, BUILD, PYTHON.
STRATA=${STRATA:-build/strata}
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
DUMP=$BUILD/tests/dump_logits
MK="$PYTHON tests/cli/mk_tiny_gguf.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

ok()  { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
# check DESCRIPTION COMMAND...: passes when the command succeeds
check() { d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }
# exits CODE DESCRIPTION COMMAND...: passes when the command exits with CODE
exits() {
    want=$1; d=$2; shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"
    got=$?
    if [ "$got" -eq "$want" ]; then ok; else bad "$d (exit $got, wanted $want)"; sed 's/^/    /' "$tmp/err" >&2; fi
}
has() { grep -q -- "$2" "$1"; }

# ==== models ====
M=$tmp/tiny.gguf
MQ=$tmp/tiny_q8.gguf
if ! $STRATA mkmodel --preset tiny -q -o "$M" >/dev/null 2>&1; then
    $MK "$M" --seed 3 >/dev/null || { echo "run: 0 passed, 1 failed"; exit 1; }
fi
$STRATA mkmodel --preset tiny --type q8_0 --seed 5 -q -o "$MQ" >/dev/null 2>&1 || $MK "$MQ" --type f16 --tied --seed 5
$MK "$tmp/arch.gguf" --arch llama
$MK "$tmp/notensor.gguf" --drop blk.1.attn_k_norm.weight
$MK "$tmp/shape.gguf" --bad-shape blk.0.attn_q.weight
$MK "$tmp/trunc.gguf" --truncate 100

RUN="$STRATA run -m $M --temp 0"
PROMPT="The quick brown fox jumps over the lazy dog. Once upon a time"

# ==== greedy run: deterministic, -n, stdout contract, timing line ====
exits 0 "greedy run" $RUN -p "$PROMPT" -n 24 --ignore-eos
cp "$tmp/out" "$tmp/g1"; cp "$tmp/err" "$tmp/g1.err"
exits 0 "greedy run again" $RUN -p "$PROMPT" -n 24 --ignore-eos
check "greedy run is deterministic" cmp -s "$tmp/out" "$tmp/g1"
check "-n 24 generates 24 tokens" has "$tmp/g1.err" "generated 24 tokens"
check "stdout has no prompt echo" sh -c "! grep -q 'quick brown fox' '$tmp/g1'"
check "stdout has output" test -s "$tmp/g1"
check "timing line on stderr" has "$tmp/g1.err" "load .* ms, prompt [0-9]* tokens in .* tok/s), generated 24 tokens in .* tok/s)"
check "load summary on stderr" has "$tmp/g1.err" "qwen3moe: 2 layers"
check "stdout has no log lines" sh -c "! grep -q 'strata' '$tmp/g1'"
exits 0 "-n 0" $RUN -p "$PROMPT" -n 0
check "-n 0 generates nothing" sh -c "test ! -s '$tmp/out' && grep -q 'generated 0 tokens' '$tmp/err'"

# chunked prefill and threads give the same greedy tokens
exits 0 "run -b 3" $RUN -p "$PROMPT" -n 24 --ignore-eos -b 3
check "-b 3 gives the same tokens as one chunk" cmp -s "$tmp/out" "$tmp/g1"
exits 0 "run -t 1" $RUN -p "$PROMPT" -n 24 --ignore-eos -t 1
cp "$tmp/out" "$tmp/t1"
exits 0 "run -t 2" $RUN -p "$PROMPT" -n 24 --ignore-eos -t 2
check "-t 1 and -t 2 give the same tokens" cmp -s "$tmp/out" "$tmp/t1"
exits 0 "run -ctk f32 -ctv f32" $RUN -p "$PROMPT" -n 8 -ctk f32 -ctv f32
check "KV type in the summary" has "$tmp/err" "KV cache f32/f32"

# -f FILE and escapes: -p 'a\nb' is the file with a real newline
printf 'Once upon\na time' > "$tmp/prompt.txt"
exits 0 "run -f" $RUN -f "$tmp/prompt.txt" -n 12 --ignore-eos
cp "$tmp/out" "$tmp/f1"
exits 0 "run -p with \\n" $RUN -p 'Once upon\na time' -n 12 --ignore-eos
check "-p escapes match -f" cmp -s "$tmp/out" "$tmp/f1"

# sampling: same seed, same text
exits 0 "seeded run" $STRATA run -m "$M" -p "$PROMPT" -n 16 --ignore-eos -s 1234 --temp 1.0
cp "$tmp/out" "$tmp/s1"
exits 0 "seeded run again" $STRATA run -m "$M" -p "$PROMPT" -n 16 --ignore-eos -s 1234 --temp 1.0
check "same seed, same tokens" cmp -s "$tmp/out" "$tmp/s1"
check "sampler line names the seed" has "$tmp/err" "seed 1234"

# the context fills up: llama.cpp stops when n_past + 1 reaches n_ctx
exits 0 "run to a full context" $RUN -p "Hello" -c 16 -n 100 --ignore-eos
check "context full is reported" has "$tmp/err" "context full"
exits 1 "prompt longer than the context" $RUN -p "$PROMPT $PROMPT $PROMPT" -c 8

# quantized model (q8_0 from mkmodel) runs and is deterministic
exits 0 "q8_0 greedy run" $STRATA run -m "$MQ" -p "$PROMPT" -n 16 --temp 0 --ignore-eos
cp "$tmp/out" "$tmp/q1"
exits 0 "q8_0 greedy run -b 2 -t 1" $STRATA run -m "$MQ" -p "$PROMPT" -n 16 --temp 0 --ignore-eos -b 2 -t 1
check "q8_0: chunks and threads give the same tokens" cmp -s "$tmp/out" "$tmp/q1"

# ==== usage errors: exit 2, one line ====
exits 2 "unknown flag" $STRATA run -m "$M" -p hi --bogus
check "unknown flag message" has "$tmp/err" "^strata run: unknown option '--bogus'"
check "usage error is one line" test "$(wc -l < "$tmp/err")" -eq 1
exits 2 "bad -n" $STRATA run -m "$M" -p hi -n abc
exits 2 "bad -ctk" $STRATA run -m "$M" -p hi -ctk q8_0
# the GPU flags: build/strata has no GPU backend and says which build does
if [ "$($STRATA run --gpu -m "$M" -p hi -n 1 2>&1 >/dev/null | grep -c 'make cuda')" = 1 ]; then
    exits 2 "--gpu without a GPU backend" $STRATA run -m "$M" -p hi -n 1 --gpu
    check "--gpu error names the build" has "$tmp/err" "built without a GPU backend"
    exits 2 "-ngl 99 without a GPU backend" $STRATA bench -m "$M" -p 0 -n 1 -r 1 -ngl 99
    exits 0 "-ngl 0 is the CPU" $STRATA run -m "$M" -p hi -n 1 -ngl 0
fi
# (build/cuda/strata) --gpu with --arena is a usage error either way; with a
# GPU backend it points at --host-cache
exits 2 "--gpu with --arena" $STRATA run -m "$M" -p hi -n 1 --arena 1M --gpu
if ! grep -q "built without a GPU backend" "$tmp/err"; then
    check "--gpu with --arena points at --host-cache" has "$tmp/err" "the host-RAM tier under the GPU's expert arena is --host-cache SIZE"
fi
exits 2 "bad -ngl" $STRATA run -m "$M" -p hi -ngl x
# --gpu-arena: a size above 0, and only with a GPU backend
exits 2 "--gpu-arena 0" $STRATA run -m "$M" -p hi -n 1 --gpu-arena 0
check "--gpu-arena 0 names the flag" has "$tmp/err" "--gpu-arena needs a size above 0"
exits 2 "--gpu-arena without --gpu" $STRATA run -m "$M" -p hi -n 1 --gpu-arena 64M
check "--gpu-arena without --gpu says it needs --gpu" has "$tmp/err" "it needs --gpu"
# --host-cache: a size above 0, the host tier under --gpu --gpu-arena
exits 2 "--host-cache without --gpu" $STRATA run -m "$M" -p hi -n 1 --host-cache 1G
check "--host-cache without --gpu names the flag" has "$tmp/err" "^strata run: --host-cache is the host tier under the GPU's expert arena: it needs --gpu"
check "--host-cache usage error is one line" test "$(wc -l < "$tmp/err")" -eq 1
exits 2 "--host-cache 0" $STRATA run -m "$M" -p hi -n 1 --host-cache 0
check "--host-cache 0 names the flag" has "$tmp/err" "--host-cache needs a size above 0 (K/M/G suffixes), got '0'"
exits 2 "bad --host-cache" $STRATA run -m "$M" -p hi -n 1 --host-cache lots
check "bad --host-cache names the flag" has "$tmp/err" "--host-cache needs a size above 0"
exits 2 "--host-cache with --arena" $STRATA run -m "$M" -p hi -n 1 --arena 1M --host-cache 1G
check "--host-cache with --arena says they both size the store" has "$tmp/err" "--arena and --host-cache both size the expert store"
exits 2 "--host-cache with --gpu-arena, no --gpu" $STRATA run -m "$M" -p hi -n 1 --gpu-arena 64M --host-cache 1G
check "--host-cache with --gpu-arena still needs --gpu" has "$tmp/err" "it needs --gpu"
exits 2 "--host-cache in bench without --gpu" $STRATA bench -m "$M" -p 0 -n 1 -r 1 --host-cache 1G
check "bench: --host-cache needs --gpu" has "$tmp/err" "^strata bench: --host-cache is the host tier"
exits 0 "run --help lists --host-cache" $STRATA run --help
check "run --help: --host-cache" has "$tmp/out" "--host-cache SIZE .*with --gpu --gpu-arena: a pinned host-RAM tier"
exits 2 "bad --temp" $STRATA run -m "$M" -p hi --temp x
exits 2 "missing value" $STRATA run -m "$M" -p
exits 2 "no model" $STRATA run -p hi
exits 2 "no prompt" $STRATA run -m "$M"
exits 0 "--help" $STRATA run --help
exits 2 "chat rejects -p" $STRATA chat -m "$M" -p hi

# ==== runtime errors: exit 1, one line naming the problem ====
exits 1 "missing model file" $STRATA run -m "$tmp/nope.gguf" -p hi
check "missing model message" has "$tmp/err" "^strata run: .*nope.gguf"
exits 1 "wrong architecture" $STRATA run -m "$tmp/arch.gguf" -p hi
check "wrong architecture is named" has "$tmp/err" "^strata run: unsupported architecture 'llama'"
exits 1 "missing tensor" $STRATA run -m "$tmp/notensor.gguf" -p hi
check "missing tensor is named" has "$tmp/err" "^strata run: missing tensor blk.1.attn_k_norm.weight$"
exits 1 "wrong shape" $STRATA run -m "$tmp/shape.gguf" -p hi
check "wrong shape is named" has "$tmp/err" "^strata run: tensor blk.0.attn_q.weight: shape \[64, 32\] but expected \[64, 64\]$"
exits 1 "truncated file" $STRATA run -m "$tmp/trunc.gguf" -p hi
check "runtime error is one line" test "$(wc -l < "$tmp/err")" -eq 1

# ==== dump_logits: chunking, splitting, threads are bit-identical ====
IDS=5,17,200,3,99,14,300,22,7,8,9,10,11,400,401,402,12,0,1,2,3,4
exits 0 "dump_logits -b 64" $DUMP "$M" "$tmp/d64.bin" $IDS -b 64
exits 0 "dump_logits -b 1" $DUMP "$M" "$tmp/d1.bin" $IDS -b 1
check "logits -b 1 == -b 64 (bit-identical)" cmp -s "$tmp/d1.bin" "$tmp/d64.bin"
exits 0 "dump_logits -b 3 -t 1" $DUMP "$M" "$tmp/d3.bin" $IDS -b 3 -t 1
check "logits -b 3 -t 1 == -b 64" cmp -s "$tmp/d3.bin" "$tmp/d64.bin"
exits 0 "dump_logits --split 7" $DUMP "$M" "$tmp/ds.bin" $IDS --split 7
check "eval(a) then eval(b) == eval(a+b)" cmp -s "$tmp/ds.bin" "$tmp/d64.bin"
exits 0 "dump_logits q8_0 --split 10 -b 4" $DUMP "$MQ" "$tmp/qs.bin" $IDS --split 10 -b 4
exits 0 "dump_logits q8_0" $DUMP "$MQ" "$tmp/q.bin" $IDS
check "q8_0: split and chunked == one call" cmp -s "$tmp/qs.bin" "$tmp/q.bin"
check "dump size = 8 + 22 x n_vocab x 4" test "$(( ($(wc -c < "$tmp/d64.bin") - 8) % 88 ))" -eq 0
exits 0 "decode loop allocates nothing" $DUMP "$MQ" "$tmp/qa.bin" $IDS --check-alloc
exits 1 "dump_logits id out of range" $DUMP "$M" "$tmp/x.bin" 5,999999
check "out-of-range id is named" has "$tmp/err" "token id 999999"
exits 1 "dump_logits bad ids" $DUMP "$M" "$tmp/x.bin" 5,x

# float64 oracle (f32 weights, f32 KV): max |diff| <= 1e-4 * max |logit|
if $PYTHON -c "import numpy" 2>/dev/null; then
    exits 0 "dump_logits f32 KV" $DUMP "$M" "$tmp/o.bin" $IDS -ctk f32 -ctv f32
    exits 0 "float64 oracle" $PYTHON tests/ref/qwen3moe_ref.py "$M" "$IDS" "$tmp/o.npy"
    check "logits match the float64 oracle" $PYTHON -c "
import numpy as np, sys
b = open('$tmp/o.bin', 'rb').read()
n, v = np.frombuffer(b[:8], np.int32)
ours = np.frombuffer(b[8:], np.float32).reshape(n, v)
ref = np.load('$tmp/o.npy')
d = np.abs(ours - ref).max()
sys.exit(0 if d <= 1e-4 * np.abs(ref).max() else 1)"
fi

# ==== chat: piped stdin, KV reuse between turns ====
printf 'Hello there\nTell me more\n' > "$tmp/chat.txt"
exits 0 "chat with piped stdin" sh -c "$STRATA chat -m '$M' --temp 0 -n 8 < '$tmp/chat.txt'"
check "chat answered two turns" has "$tmp/err" "turn 2:"
check "chat turn 2 reuses the cache" sh -c "grep 'turn 2:' '$tmp/err' | grep -qv '(0 reused'"
exits 0 "chat with a named template and a system prompt" sh -c \
    "$STRATA chat -m '$M' --temp 0 -n 4 --chat-template chatml -sys 'Be brief.' < '$tmp/chat.txt'"
exits 1 "chat with an unknown template" sh -c "$STRATA chat -m '$M' --chat-template nosuch < '$tmp/chat.txt'"
exits 0 "chat with empty stdin" sh -c "$STRATA chat -m '$M' < /dev/null"
# the model file changes under a running session: the next evaluation refuses
cp "$M" "$tmp/touched.gguf"
exits 1 "model file modified while open" sh -c \
    "(echo hi; sleep 1; touch '$tmp/touched.gguf'; echo again) | $STRATA chat -m '$tmp/touched.gguf' --temp 0 -n 2"
check "modified model file is reported" has "$tmp/err" "model file was modified since it was opened"

echo "run: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
