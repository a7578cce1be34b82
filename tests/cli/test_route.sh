#!/bin/sh
# test_route: routing policies from the command line (docs/ROUTING.md).
#   - a bad spec, by --route (usage error, exit 2) or by STRATA_ROUTE (exit 1),
#     names the bad part and its column; body above the model's k fails at
#     open; --route beats STRATA_ROUTE, which beats exact;
#   - reproducibility: a policy that never reads residency (exact, bonus 0,
#     body = k, every row under exact-last) gives logits byte-identical to
#     the all-resident exact run whatever the arena (0, small, large,
#     read-ahead), and the same greedy tokens from `strata run`;
#   - a biased policy says its routing depends on residency, still runs,
#     shows its counters (--trace, --report-json) and is recorded in the
#     tfdump header.
# Prints "route: N passed, N failed". Env: STRATA, BUILD.
STRATA=${STRATA:-build/strata}
BUILD=${BUILD:-build}
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
one_line() { [ "$(wc -l <"$1")" -eq 1 ]; }

# ==== models ====
T=$tmp/tiny.gguf    # f32, 2 layers x 8 experts, k 2, skewed routing
S=$tmp/skew.gguf    # 3 layers x 16 experts, k 4, skewed routing
$STRATA mkmodel --preset tiny --route-skew 1.0 -q -o "$T" >/dev/null 2>&1 || { echo "route: 0 passed, 1 failed"; exit 1; }
$STRATA mkmodel --preset small --layers 3 --experts 16 --embd 128 --ff-exp 64 --route-skew 1.0 --seed 4 -q \
    -o "$S" >/dev/null 2>&1
check "skewed model generated" test -s "$S"

RUN="$STRATA run -m $T --temp 0 -t 2"
P="the quick brown fox jumps over the lazy dog and runs far away from here"
BIAS='prompt.chunk0=exact; prompt=bias(body=1,bonus=0.85,exact-last=4); decode=bias(body=1,bonus=2)'

# ==== bad specs ====
exits 2 "--route with an unknown arm" $RUN -p "$P" -n 1 --route 'prompt.chunk0=exact; prompt=biass(body=1,bonus=1)'
check "flag error names the arm and its column" has "$tmp/err" "strata run: --route: route spec: unknown arm 'biass' at column 29"
check "flag error is one line" one_line "$tmp/err"
exits 2 "--route with a bad bonus" $RUN -p "$P" -n 1 --route 'prompt=bias(body=1,bonus=-1)'
check "bad bonus named" has "$tmp/err" "bonus needs a finite number >= 0, got '-1' at column 26"
exits 2 "--route with an empty spec" $RUN -p "$P" -n 1 --route ''
check "empty spec named" has "$tmp/err" "route spec: empty"
exits 2 "--route without a value" $RUN -p "$P" -n 1 --route
STRATA_ROUTE='prompt=bias(body=1,bonus=1' exits 1 "bad STRATA_ROUTE" $RUN -p "$P" -n 1
check "env error says STRATA_ROUTE and the column" \
    has "$tmp/err" "STRATA_ROUTE: route spec: expected ',' or ')' in bias(...), got at the end (column 27)"
check "env error is one line" one_line "$tmp/err"
exits 1 "body above k" $RUN -p "$P" -n 1 --route 'decode=bias(body=3,bonus=1)'
check "body above k named" has "$tmp/err" "decode: body=3 at column 18 is more than the model's 2 experts per token"
exits 2 "tfdump --route bad" $STRATA tfdump -m "$T" -f tests/eval/tf_corpus.txt -o "$tmp/x.dump" --route 'prompt=bias(body=1)'
check "tfdump names the missing bonus" has "$tmp/err" "bias needs bonus=X in 'bias(body=1)' at column 8"

# ==== precedence: --route > STRATA_ROUTE > exact ====
exits 0 "default run" $RUN -p "$P" -n 4
check "default is exact, reproducible" has "$tmp/err" "strata: routing exact (never reads residency: reproducible)"
STRATA_ROUTE="$BIAS" exits 0 "STRATA_ROUTE applies" $RUN -p "$P" -n 4
check "env policy printed" has "$tmp/err" "routing prompt.chunk0=exact; prompt=bias(body=1,bonus=0.85,exact-last=4); decode=bias(body=1,bonus=2); it depends on expert residency"
STRATA_ROUTE='prompt=nonsense' exits 0 "--route beats a bad STRATA_ROUTE" $RUN -p "$P" -n 4 --route exact
check "flag policy printed" has "$tmp/err" "strata: routing exact (never"
STRATA_ROUTE="$BIAS" exits 0 "--route beats STRATA_ROUTE" $RUN -p "$P" -n 4 --route 'prompt=bias(body=1,bonus=0)'
check "flag policy printed, canonical" \
    has "$tmp/err" "routing prompt.chunk0=bias(body=1,bonus=0); prompt=bias(body=1,bonus=0); decode=exact (never reads residency"
STRATA_ROUTE= exits 0 "empty STRATA_ROUTE is unset" $RUN -p "$P" -n 4
check "empty env: exact" has "$tmp/err" "strata: routing exact"
exits 0 "--help" $STRATA run --help
check "--help lists --route" has "$tmp/out" "--route SPEC"

# ==== reproducibility: no bonus, no residency, same bits whatever the arena ====
IDS=$(seq -s, 5 3 140)     # 46 tokens
NOBIAS='prompt.chunk0=bias(body=1,bonus=0,tail=8:0); prompt=bias(body=8,bonus=3); decode=bias(body=2,bonus=0)'
"$DUMP" "$S" "$tmp/ref.bin" "$IDS" -b 16 2>/dev/null
"$DUMP" "$S" "$tmp/ref_d.bin" "$IDS" --decode 2>/dev/null
check "reference dumps" test -s "$tmp/ref.bin" -a -s "$tmp/ref_d.bin"
n=0
for spec in exact "$NOBIAS" 'prompt=bias(body=1,bonus=5,exact-last=1000)'; do
    for a in "" "--arena 0" "--arena 150K --read-ahead 4" "--arena 300K --evict lfu" "--arena 4M --read-ahead 2"; do
        n=$((n + 1))
        if STRATA_ROUTE="$spec" timeout 60 "$DUMP" "$S" "$tmp/got.bin" "$IDS" -b 16 $a 2>"$tmp/err" &&
           cmp -s "$tmp/ref.bin" "$tmp/got.bin"; then ok
        else bad "logits differ: route '$spec', arena '$a'"; tail -n 3 "$tmp/err" >&2; fi
    done
    if STRATA_ROUTE="$spec" timeout 60 "$DUMP" "$S" "$tmp/got.bin" "$IDS" --decode --arena 150K 2>"$tmp/err" &&
       cmp -s "$tmp/ref_d.bin" "$tmp/got.bin"; then ok
    else bad "decode logits differ: route '$spec'"; fi
done
exits 0 "resident exact run" $STRATA run -m "$S" --temp 0 -t 2 -p "$P" -n 12 --ignore-eos
cp "$tmp/out" "$tmp/tok_ref"
for a in "--arena 0" "--arena 150K" "--arena 150K --read-ahead 4"; do
    exits 0 "no-bonus run $a" $STRATA run -m "$S" --temp 0 -t 2 -p "$P" -n 12 --ignore-eos $a --route "$NOBIAS" \
        --report-json "$tmp/r.json"
    check "same tokens as exact ($a)" cmp -s "$tmp/out" "$tmp/tok_ref"
    check "report: reads_residency false ($a)" grep -q '"route": {"policy": "prompt.chunk0=bias(body=1,bonus=0,tail=8:0); .*", "reads_residency": false' "$tmp/r.json"
done

# ==== a biased policy: says so, runs, counts, is recorded ====
# (an arena of about half the experts: the bias has resident experts to pick)
exits 0 "biased run" $STRATA run -m "$S" --temp 0 -t 2 -p "$P" -n 16 --ignore-eos --arena 1M -b 8 --route "$BIAS" \
    --trace --report-json "$tmp/b.json"
check "biased run says routing depends on residency" \
    has "$tmp/err" "it depends on expert residency (the arena's state and I/O timing): results are not reproducible bit for bit"
check "biased run generated" has "$tmp/err" "generated 16 tokens"
check "trace: decode arm line" has "$tmp/err" "^route decode=bias(body=1,bonus=2): [0-9]* rows over [0-9]* layer blocks, [0-9]* biased; distinct lookups [0-9]* (exact routing: [0-9]*, ratio [0-9.]*); slots changed [0-9]* of [0-9]*"
check "trace: chunk0 arm line (exact)" has "$tmp/err" "^route prompt.chunk0=exact: 16 rows over 2 layer blocks, 0 biased"
check "trace: the bias changed decode selections, all to resident experts" \
    grep -q "^route decode=.*slots changed \([1-9][0-9]*\) of [0-9]* ([0-9.]*), of them resident \1;" "$tmp/err"
check "trace: residency share" has "$tmp/err" "resident at routing time [0-9.]* of lookups (exact routing: [0-9.]*)"
check "report: route policy, reads residency" grep -q '"reads_residency": true' "$tmp/b.json"
check "report: arms" grep -q '"decode": {"arm": "bias(body=1,bonus=2)", "blocks": [1-9]' "$tmp/b.json"
if command -v python3 >/dev/null 2>&1; then
    check "report is valid JSON with consistent counters" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["route"]
for name, a in r["arms"].items():
    assert a["slots_changed_resident"] <= a["slots_changed"], name
    assert a["rows_biased"] <= a["rows"], name
    assert a["masked_resident"] <= a["masked_lookups"] <= a["lookups"], name
d = r["arms"]["decode"]
assert d["rows"] == d["blocks"] == d["rows_biased"] > 0 and d["masked_blocks"] == d["blocks"]
assert r["arms"]["prompt.chunk0"]["rows_biased"] == 0
' "$tmp/b.json"
    # per-arm store counters (issue 7 item 4): the arms split the phases exactly
    check "report: per-arm store counters add up to the phases" python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
arms, st = j["route"]["arms"], j["stream"]
for f in ("chunks", "rows", "lookups", "hits", "ahead", "misses", "reads", "bytes"):
    c0, pr, de = (arms[a]["stream"][f] for a in ("prompt.chunk0", "prompt", "decode"))
    assert c0 + pr == st["phases"]["prompt"][f], f
    assert de == st["phases"]["decode"][f], f
    for a in arms:
        assert st["arms"][a][f] == arms[a]["stream"][f], (a, f)
assert arms["prompt.chunk0"]["stream"]["chunks"] == 1 and arms["prompt"]["stream"]["chunks"] >= 1
assert arms["decode"]["stream"]["chunks"] == 15
for c in st["chunks"]:
    assert c["arm"] == ("decode" if c["phase"] == "decode" else "prompt.chunk0" if c["index"] == 0 else "prompt"), c
' "$tmp/b.json"
fi
check "trace: per-arm store counters" has "$tmp/err" "^route decode=.*; store: 15 chunks, [0-9]* lookups, in the arena [0-9]*, streamed ahead [0-9]*, missed [0-9]*, [0-9]* reads, [0-9.]* MB read$"
# resident (mmap): every expert resident, a bias lifts them all alike
exits 0 "biased run, all resident" $STRATA run -m "$S" --temp 0 -t 2 -p "$P" -n 12 --ignore-eos --route "$BIAS"
check "all-resident biased run says it depends on residency" has "$tmp/err" "depends on expert residency"
check "all-resident biased run: exact tokens" cmp -s "$tmp/out" "$tmp/tok_ref"
# chat and the eval tools take --route too
exits 0 "tfdump biased" $STRATA tfdump -t 2 -m "$S" -f tests/eval/tf_corpus.txt -o "$tmp/b.dump" --arena 100K --route "$BIAS"
check "tfdump header records the policy" has "$tmp/out" "routing prompt.chunk0=exact; prompt=bias(body=1,bonus=0.85,exact-last=4); decode=bias(body=1,bonus=2) (reads residency)"
check "dump holds the policy" grep -q "prompt=bias(body=1,bonus=0.85,exact-last=4)" "$tmp/b.dump"
exits 0 "tfdump exact" $STRATA tfdump -t 2 -m "$S" -f tests/eval/tf_corpus.txt -o "$tmp/e.dump"
check "exact dump says exact" has "$tmp/out" "routing exact;"
printf 'hello\n' | timeout 60 $STRATA chat -m "$T" --temp 0 -n 4 --route 'prompt=bias(body=1,bonus=1)' >"$tmp/out" 2>"$tmp/err"
check "chat takes --route" has "$tmp/err" "routing prompt.chunk0=bias(body=1,bonus=1); prompt=bias(body=1,bonus=1); decode=exact; it depends"

echo "route: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
