#!/bin/sh
# test_stream: expert streaming end to end on small generated models.
#   - exactness: logits of a streamed run are byte-identical (cmp) to the
#     all-resident run for arena 0, the minimum arena (waves), small and
#     large arenas, read-ahead from either hidden state, LRU and LFU,
#     io_uring and pread, O_DIRECT and buffered, GGUF and sidecar, prompt
#     chunks and decode, on an f32 model, a skewed q4_K model and a Q4_K_M
#     model with two expert size classes;
#   - injected I/O faults: EIO/EOF end the evaluation with a message naming
#     layer, expert and offset (no hang), a retry on the same session gives
#     the exact logits, short and late reads and failed prefetches change
#     nothing;
#   - `strata run`/`chat`: same tokens, the memory line, the trace lines
#     (--trace and STRATA_TRACE=1), --report-json (consistent counters), the
#     warm fill from a profile, usage errors;
#   - memory: a model whose experts are 14x the arena runs with a peak RSS
#     within the printed plan + 24 MB (binary, libc, tokenizer tables, GGUF
#     header, thread stacks) and far below the model's size;
#   - the decode loop allocates nothing while streaming (--check-alloc).
# Prints "stream: N passed, N failed". Env: STRATA, BUILD, PYTHON.
STRATA=${STRATA:-build/strata}
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
DUMP=$BUILD/tests/dump_logits
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

ok()  { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
check() { d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }
exits() {
    want=$1; d=$2; shift 2
    timeout 60 "$@" >"$tmp/out" 2>"$tmp/err"
    got=$?
    if [ "$got" -eq "$want" ]; then ok; else bad "$d (exit $got, wanted $want)"; sed 's/^/    /' "$tmp/err" | tail -n 5 >&2; fi
}
has() { grep -q -- "$2" "$1"; }

# ==== models ====
T=$tmp/tiny.gguf      # f32, 2 layers x 8 experts
S=$tmp/skew.gguf      # q4_K mix, 4 layers x 32 experts, skewed routing (14 MB of experts)
Q=$tmp/q4km.gguf      # Q4_K_M: q6_K down in some layers -> 2 expert size classes
L=$tmp/large.gguf     # the small preset cut to 4 layers: 113 MB of experts
$STRATA mkmodel --preset tiny -q -o "$T" >/dev/null 2>&1 || { echo "stream: 0 passed, 1 failed"; exit 1; }
$STRATA mkmodel --preset small --layers 4 --experts 32 --embd 256 --ff-exp 256 --route-skew 1.0 --seed 2 -q \
    -o "$S" >/dev/null 2>&1
$STRATA mkmodel --preset small --layers 6 --experts 8 --embd 256 --ff-exp 128 --type f16 -q -o "$tmp/f16.gguf" >/dev/null 2>&1
$STRATA quantize "$tmp/f16.gguf" "$Q" Q4_K_M >/dev/null 2>&1
$STRATA mkmodel --preset small --layers 4 -q -o "$L" >/dev/null 2>&1
for m in "$S" "$Q" "$L"; do check "model $m generated" test -s "$m"; done

IDS=$(seq -s, 7 3 130)     # 42 tokens
IDS_D=$(seq -s, 7 5 100)   # 19 tokens, for decode runs
IDS_T=$(seq -s, 3 2 60)

# same NAME MODEL IDS ARGS...: streamed logits == the reference's, byte for byte
same() {
    d=$1; m=$2; ids=$3; ref=$4; shift 4
    if timeout 60 "$DUMP" "$m" "$tmp/got.bin" "$ids" "$@" 2>"$tmp/err" && cmp -s "$ref" "$tmp/got.bin"; then ok
    else bad "$d: streamed logits differ from resident ($*)"; tail -n 3 "$tmp/err" >&2; fi
    rm -f "$tmp/got.bin"
}

# ==== exactness ====
"$DUMP" "$T" "$tmp/t_ref.bin" "$IDS_T" -b 8
for a in "--arena 0 --read-ahead 2 --io pread" "--arena 1M --read-ahead 8 --evict lfu"; do
    same "tiny" "$T" "$IDS_T" "$tmp/t_ref.bin" -b 8 $a
done

"$DUMP" "$S" "$tmp/s_ref.bin" "$IDS" -b 16
"$DUMP" "$S" "$tmp/d_ref.bin" "$IDS_D" --decode
"$DUMP" "$S" "$tmp/d_one.bin" "$IDS_D"
check "decode logits == prompt logits (resident)" cmp -s "$tmp/d_ref.bin" "$tmp/d_one.bin"
# (most variants read buffered, from the page cache, to keep the suite fast;
# O_DIRECT has its own variants: its slots hold aligned ranges around the parts)
for a in "--arena 0 --read-ahead 8 --io pread --io-threads 2 --no-direct" \
         "--arena 250K" \
         "--arena 250K --read-ahead 4 --evict lfu --no-direct" \
         "--arena 1500K --read-ahead 8" \
         "--arena 1500K --read-ahead 8 --read-ahead-from input --io pread --no-direct" \
         "--arena 1500K --evict lfu --no-direct --io-depth 1" \
         "--arena 64M --read-ahead 6 --no-direct"; do
    same "skew prompt" "$S" "$IDS" "$tmp/s_ref.bin" -b 16 $a
    same "skew decode" "$S" "$IDS_D" "$tmp/d_ref.bin" --decode $a
done

"$DUMP" "$Q" "$tmp/q_ref.bin" "$IDS" -b 32
"$DUMP" "$Q" "$tmp/qd_ref.bin" "$IDS_D"
for a in "--arena 0 --read-ahead 2" "--arena 600K --evict lfu --io pread --no-direct"; do
    same "Q4_K_M prompt" "$Q" "$IDS" "$tmp/q_ref.bin" -b 32 $a
    same "Q4_K_M decode" "$Q" "$IDS_D" "$tmp/qd_ref.bin" --decode $a
done
$STRATA run -m "$Q" -p hi -n 1 --arena 2M >/dev/null 2>"$tmp/qerr"
check "Q4_K_M has 2 expert size classes" has "$tmp/qerr" "slots in 2 size classes"

# the sidecar: found by itself, exact, one read per expert
$STRATA repack "$S" >/dev/null 2>&1
check "repack wrote the sidecar" test -s "$S.experts"
same "sidecar" "$S" "$IDS" "$tmp/s_ref.bin" -b 16 --arena 1500K --read-ahead 8
$STRATA run -m "$S" -p hi -n 1 --arena 1500K >/dev/null 2>"$tmp/serr"
check "sidecar is used" has "$tmp/serr" "from sidecar $S.experts"
same "sidecar, pread, decode" "$S" "$IDS_D" "$tmp/d_ref.bin" --decode --arena 0 --io pread
same "GGUF with a sidecar present" "$S" "$IDS" "$tmp/s_ref.bin" -b 16 --arena 1500K --no-sidecar

# ==== injected faults ====
exits 1 "EIO ends the evaluation" "$DUMP" "$S" "$tmp/f.bin" "$IDS" --arena 1500K --fault eio:5
check "EIO message names layer, expert and offset" \
    grep -q "cannot read expert [0-9]* of layer [0-9]* from .*: Input/output error at file offset [0-9]*" "$tmp/err"
exits 1 "EOF ends the evaluation" "$DUMP" "$S" "$tmp/f.bin" "$IDS" --arena 0 --io pread --fault eof:9
check "EOF message" has "$tmp/err" "unexpected end of file at file offset"
exits 1 "every read failing: an error, no hang" "$DUMP" "$S" "$tmp/f.bin" "$IDS_D" --decode --arena 1500K --read-ahead 8 \
    --fault eio:1,every=1
for io in uring pread; do
    same "EIO then retry on the same session ($io)" "$S" "$IDS" "$tmp/s_ref.bin" -b 16 --arena 1500K --read-ahead 4 \
        --io $io --fault eio:3 --retry
    check "the failed evaluation was reported ($io)" has "$tmp/err" "eval failed: cannot read expert"
    same "short reads ($io)" "$S" "$IDS" "$tmp/s_ref.bin" -b 16 --arena 1500K --io $io --fault short:1,every=2
    same "late reads ($io)" "$S" "$IDS_D" "$tmp/d_ref.bin" --decode --arena 1500K --read-ahead 8 --io $io --no-direct \
        --fault late:2:40,count=3,every=50
    same "every prefetch failing ($io)" "$S" "$IDS_D" "$tmp/d_ref.bin" --decode --arena 1500K --read-ahead 8 --io $io \
        --no-direct --fault eio:1,every=1,prefetch
done
same "decode error then retry" "$S" "$IDS_D" "$tmp/d_ref.bin" --decode --arena 0 --read-ahead 8 --no-direct \
    --fault eio:40,demand --retry

# ==== no allocation in the streamed decode loop ====
exits 0 "no allocations while streaming (uring)" "$DUMP" "$S" "$tmp/a.bin" "$IDS_D" --arena 1500K --read-ahead 8 --check-alloc
exits 0 "no allocations while streaming (pread, arena 0)" "$DUMP" "$S" "$tmp/a.bin" "$IDS_D" --arena 0 --io pread --read-ahead 4 \
    --check-alloc

# ==== strata run / chat ====
P="The quick brown fox jumps over the lazy dog. Once upon a time"
exits 0 "resident run" $STRATA run -m "$S" -p "$P" -n 24 --ignore-eos --temp 0
cp "$tmp/out" "$tmp/run_ref"
exits 0 "streamed run" $STRATA run -m "$S" -p "$P" -n 24 --ignore-eos --temp 0 --arena 1500K --read-ahead 8 --trace \
    --report-json "$tmp/rep.json"
check "streamed run gives the same tokens" cmp -s "$tmp/out" "$tmp/run_ref"
check "memory line" has "$tmp/err" "^strata: memory: non-expert weights .* (read into memory), expert arena .*, KV cache .* and forward scratch .* per session: .* with one session"
check "init line" has "$tmp/err" "^strata: expert arena [0-9.]* [MkG]B, [0-9]* slots in 1 size class, no warm fill; 1 I/O thread, read-ahead top 8"
check "prompt trace line" grep -qE "^expert stream prompts 1 chunks: [0-9]+ distinct lookups \([0-9.]+ per layer\), in the arena [0-9.]+, streamed ahead [0-9.]+, missed [0-9.]+; [0-9]+ streamed in \([0-9.]+ MB/chunk, [0-9]+ reads\); host [0-9.]+ ms per chunk, of it waiting [0-9.]+ ms" "$tmp/err"
check "decode trace line" grep -qE "^expert stream decode 23 tokens: .* MB/token, .* ms per token, of it waiting .*read-ahead precision [0-9.]+ coverage [0-9.]+" "$tmp/err"
check "report json" "$PYTHON" - "$tmp/rep.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
st = r["stream"]
assert r["ok"] and r["memory"]["arena"] > 0 and st["config"]["read_ahead"] == 8
for name in ("prompt", "decode"):
    p = st["phases"][name]
    assert p["hits"] + p["ahead"] + p["misses"] == p["lookups"] > 0, name
    assert sum(p["layer_lookups"]) == p["lookups"], name
    assert p["bytes"] > 0 or p["misses"] + p["ahead"] == 0, name
    chunks = [c for c in st["chunks"] if c["phase"] == name]
    assert len(chunks) == p["chunks"], name
    assert sum(c["lookups"] for c in chunks) == p["lookups"], name
assert st["phases"]["decode"]["chunks"] == 23 and st["phases"]["prompt"]["chunks"] == 1
assert r["timings"]["generated_tokens"] == 24
EOF
# a streamed prompt in several chunks reads each expert it needs at most
# once per chunk (no read-ahead: every read is a demand of that chunk)
for a in 1500K 0; do
    exits 0 "streamed prompt in chunks (arena $a)" $STRATA run -m "$S" -p "$P" -n 1 --temp 0 -b 5 --arena $a \
        --report-json "$tmp/rep_b.json"
    check "each needed expert read at most once per chunk (arena $a)" "$PYTHON" - "$tmp/rep_b.json" <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))["stream"]
chunks = [c for c in st["chunks"] if c["phase"] == "prompt"]
assert len(chunks) >= 3, len(chunks)
for c in chunks:
    assert c["lookups"] > 0 and c["streamed_in"] <= c["lookups"], c
    assert c["streamed_in"] == c["misses"], c
EOF
done
exits 0 "STRATA_TRACE=1" env STRATA_TRACE=1 $STRATA run -m "$S" -p "$P" -n 4 --temp 0 --arena 0
check "STRATA_TRACE=1 prints the trace" has "$tmp/err" "^expert stream decode 3 tokens"
exits 0 "--arena auto" $STRATA run -m "$S" -p "$P" -n 4 --temp 0 --arena auto --evict lfu
check "--arena auto sizes an arena" has "$tmp/err" "^strata: expert arena .*evict lfu"
printf 'hello there\nhow are you\n' > "$tmp/chat.txt"
exits 0 "chat streams" $STRATA chat -m "$S" -n 6 --temp 0 --arena 2M --read-ahead 4 --trace < "$tmp/chat.txt"
check "chat trace" has "$tmp/err" "^expert stream prompts 2 chunks"

# warm fill from a profile
printf 'The quick brown fox jumps over the lazy dog, and a small model counts its experts.\n%.0s' 1 2 3 4 5 6 > "$tmp/corpus.txt"
exits 0 "profile" $STRATA profile -m "$S" -f "$tmp/corpus.txt" -o "$tmp/s.prof" -c 32 -n 2 -q
exits 0 "run with --profile" $STRATA run -m "$S" -p "$P" -n 24 --ignore-eos --temp 0 --arena 1500K --profile "$tmp/s.prof" \
    --trace
check "profile run gives the same tokens" cmp -s "$tmp/out" "$tmp/run_ref"
check "warm fill line" has "$tmp/err" "^strata: expert arena .* slots in 1 size class, [0-9]* experts read from the profile's top (128 ranked) in .* s (.* GB/s)"

# usage errors
exits 2 "bad --arena" $STRATA run -m "$S" -p hi --arena lots
exits 2 "streaming option without --arena" $STRATA run -m "$S" -p hi --read-ahead 4
check "streaming option message names --arena and --host-cache" has "$tmp/err" \
    "^strata run: the expert streaming options need --arena SIZE|auto|0 (or --host-cache SIZE with --gpu)$"
exits 2 "store option without --arena" $STRATA run -m "$S" -p hi --evict lfu
check "store option message names --arena and --host-cache" has "$tmp/err" \
    "the expert streaming options need --arena SIZE|auto|0 (or --host-cache SIZE with --gpu)"
exits 2 "--read-ahead-from without --arena" $STRATA bench -m "$S" -p 0 -n 1 -r 1 --read-ahead-from input
check "bench: --read-ahead-from needs --arena" has "$tmp/err" "need --arena SIZE|auto|0"
exits 2 "bad --evict" $STRATA run -m "$S" -p hi --arena 1M --evict fifo
exits 2 "bad --io" $STRATA run -m "$S" -p hi --arena 1M --io aio
exits 1 "arena below the minimum" $STRATA run -m "$S" -p hi --arena 100K
check "minimum arena message" has "$tmp/err" "below the minimum .* use --arena 0 to stream every lookup"

# ==== resident memory of a model 14x larger than its arena ====
printf '%s ' $(seq 1 60) > "$tmp/long.txt"
exits 0 "large model, 8M arena" $STRATA run -m "$L" -f "$tmp/long.txt" -n 16 --ignore-eos --temp 0 -c 1024 \
    --arena 8M --read-ahead 8 --report-json "$tmp/rss.json"
check "peak RSS within the plan + 24 MB and below half the model" "$PYTHON" - "$tmp/rss.json" "$L" <<'EOF'
import json, os, sys
r = json.load(open(sys.argv[1]))
m = r["memory"]
size = os.path.getsize(sys.argv[2])
experts = 113e6
assert m["arena"] * 10 < experts, m
ok = m["rss_peak"] <= m["planned_total"] + 24 * 2**20 and m["rss_peak"] < size / 2
if not ok:
    print("rss_peak %.1f MB, planned %.1f MB, model %.1f MB" % (m["rss_peak"] / 1e6, m["planned_total"] / 1e6, size / 1e6))
assert ok
EOF

echo "stream: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
