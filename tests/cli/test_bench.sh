#!/bin/sh
# test_bench: `strata bench` (llama-bench's tests and columns) and the
# bench/roofline probe, on a generated tiny model and the shipped model.
#   - md: llama-bench's header columns plus strata's, one row per test;
#     -p 0 / -n 0 skip a kind; comma lists multiply the rows;
#   - json parses (python3 json.load) with the fields, one object per test;
#     csv has a header and one line per test;
#   - --arena: the MB/tok column and stream_mb_per_token are filled;
#   - usage errors exit 2 and runtime errors (missing or non-GGUF model)
#     exit 1, each with a one-line "strata bench: ..." message;
#   - roofline --size 64M --quick prints the three metrics, -o json parses.
# Prints "bench: N passed, N failed". Env: STRATA, BUILD, PYTHON.
STRATA=${STRATA:-build/strata}
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
ROOF=$BUILD/bench/roofline
SHIPPED=models/strata-ops-moe.gguf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

ok()  { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
check() { d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }
# exits WANT DESC CMD...: exit status WANT; stdout in $tmp/out, stderr in $tmp/err
exits() {
    want=$1; d=$2; shift 2
    timeout 60 "$@" >"$tmp/out" 2>"$tmp/err"
    got=$?
    if [ "$got" -eq "$want" ]; then ok; else bad "$d (exit $got, wanted $want)"; sed 's/^/    /' "$tmp/err" | tail -n 5 >&2; fi
}
has() { grep -q -- "$2" "$1"; }
# rows FILE: markdown data rows (table lines after the separator)
rows() { grep -c '^| qwen3moe' "$1"; }

T=$tmp/tiny.gguf
$STRATA mkmodel --preset tiny -q -o "$T" >/dev/null 2>&1 || { echo "bench: 0 passed, 1 failed"; exit 1; }

# ==== md ====
exits 0 "md on the tiny model" $STRATA bench -m "$T" -p 16 -n 4 -r 2
for col in model size params backend threads n_batch arena test 't/s' 'GB/s' 'MB/tok' lookups; do
    check "md header has '$col'" has "$tmp/out" "| $col "
done
check "md: one row per test (pp16, tg4)" test "$(rows "$tmp/out")" -eq 2
check "md: pp16 row" has "$tmp/out" ' pp16 |'
check "md: tg4 row" has "$tmp/out" ' tg4 |'
check "md: t/s is mean ± stddev" has "$tmp/out" '[0-9] ± [0-9]'
check "md: resident arena" has "$tmp/out" ' resident |'
check "md: pp lookups vs uniform" grep -q 'pp16 |.*([0-9.]*x) |' "$tmp/out"
check "md: nothing on stderr" test ! -s "$tmp/err"

exits 0 "-p 0 skips pp" $STRATA bench -m "$T" -p 0 -n 4 -r 1
check "-p 0: one tg row, no pp row" test "$(rows "$tmp/out")" -eq 1 -a "$(grep -c ' pp' "$tmp/out")" -eq 0
exits 0 "-n 0 skips tg" $STRATA bench -m "$T" -p 8 -n 0 -r 1 --no-warmup
check "-n 0: one pp row" test "$(rows "$tmp/out")" -eq 1 -a "$(grep -c ' tg' "$tmp/out")" -eq 0
exits 0 "comma lists and repeated flags" $STRATA bench -m "$T" -p 8,16 -n 0 -t 1 -t 2 -b 4 -r 1
check "lists: 2 pp x 2 thread counts = 4 rows" test "$(rows "$tmp/out")" -eq 4
check "lists: threads 1 and 2, n_batch 4" grep -q '|  *1 |  *4 |' "$tmp/out"

# ==== json ====
exits 0 "json" $STRATA bench -m "$T" -p 16 -n 4 -r 3 -o json
check "json parses, fields and samples" "$PYTHON" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert isinstance(d, list) and len(d) == 2, d
assert [r["test"] for r in d] == ["pp16", "tg4"]
for r in d:
    for k in ("model_filename", "model_type", "model_size", "model_n_params", "backends", "n_batch", "n_threads",
              "arena", "n_prompt", "n_gen", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts",
              "weight_bytes_per_token", "weight_gbs", "expert_lookups_per_chunk", "expert_lookups_uniform_per_chunk",
              "expert_gops", "stream_mb_per_token"):
        assert k in r, k
    assert len(r["samples_ns"]) == 3 and r["avg_ts"] > 0 and r["weight_bytes_per_token"] > 0
    assert r["arena"] == "resident" and r["stream_mb_per_token"] is None
    for k in ("gpu_h2d_bytes_per_token", "gpu_h2d_gbs", "gpu_arena_hits", "gpu_arena_misses", "gpu_prefetched",
              "gpu_prefetch_used"):
        assert k in r and r[k] is None, (k, r.get(k))   # no GPU arena: null
assert d[0]["n_prompt"] == 16 and d[0]["n_gen"] == 0 and d[1]["n_gen"] == 4
assert d[0]["expert_lookups_per_chunk"] > 0 and d[0]["expert_lookups_uniform_per_chunk"] > 0
' "$tmp/out"

exits 0 "-o md -oe json" $STRATA bench -m "$T" -p 8 -n 2 -r 1 -oe json
check "-oe json: md on stdout, json on stderr" "$PYTHON" -c '
import json, sys
assert open(sys.argv[1]).read().startswith("| model")
d = json.load(open(sys.argv[2]))
assert [r["test"] for r in d] == ["pp8", "tg2"], d
' "$tmp/out" "$tmp/err"

# ==== csv ====
exits 0 "csv" $STRATA bench -m "$T" -p 16 -n 4 -r 1 -o csv
check "csv header" grep -q '^model_filename,model_type,model_size,model_n_params,backends,n_batch' "$tmp/out"
check "csv: header + one line per test" test "$(wc -l <"$tmp/out")" -eq 3
check "csv parses with the same columns" "$PYTHON" -c '
import csv, sys
r = list(csv.DictReader(open(sys.argv[1])))
assert len(r) == 2 and r[0]["test"] == "pp16" and float(r[1]["avg_ts"]) > 0, r
' "$tmp/out"

# ==== streaming ====
exits 0 "--arena 0 (every lookup read)" $STRATA bench -m "$T" -p 16 -n 4 -r 1 --arena 0 --io pread
check "--arena: MB/tok filled (not '-')" grep -q 'tg4 |  *[0-9.]* ± [0-9.]* |  *[0-9.]* |  *[0-9][0-9.]* |' "$tmp/out"
exits 0 "--arena json" $STRATA bench -m "$T" -p 16 -n 4 -r 1 --arena 80K -o json
check "--arena json: stream_mb_per_token > 0" "$PYTHON" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert all(r["stream_mb_per_token"] is not None and r["stream_mb_per_token"] > 0 for r in d), d
assert all(r["arena"] != "resident" for r in d)
' "$tmp/out"

# ==== the shipped model ====
if [ -f "$SHIPPED" ]; then
    exits 0 "shipped model" $STRATA bench -m "$SHIPPED" -p 32 -n 4 -r 1
    check "shipped: 2 rows" test "$(rows "$tmp/out")" -eq 2
    check "shipped: model column" has "$tmp/out" 'qwen3moe 8L 64x4'
    exits 0 "two models as a comma list" $STRATA bench -m "$T,$SHIPPED" -p 8 -n 0 -r 1 -o json
    check "two models: one row each" "$PYTHON" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d) == 2 and d[0]["model_filename"] != d[1]["model_filename"]
' "$tmp/out"
fi

# ==== errors ====
exits 0 "--help" $STRATA bench --help
check "--help lists -p -n -r -o" grep -q -- '--n-prompt' "$tmp/out"
for args in "-p abc" "-n -1" "-r 0" "-o xml" "--bogus" "-t" "-t 0" "-b 0" "-p 0 -n 0" "-p 1,,2" \
            "--read-ahead 2" "--arena 1X"; do
    # shellcheck disable=SC2086
    exits 2 "usage error: $args" $STRATA bench -m "$T" $args
    check "usage error '$args' has a message" grep -q '^strata bench: ' "$tmp/err"
done
exits 1 "missing model" $STRATA bench -m "$tmp/none.gguf"
check "missing model: message names the file" grep -q "strata bench: .*none.gguf" "$tmp/err"
check "missing model: no table" test ! -s "$tmp/out"
exits 1 "not a GGUF" $STRATA bench -m "$0"
check "not a GGUF: message" grep -q '^strata bench: .*GGUF' "$tmp/err"

# ==== bench/roofline ====
if [ ! -x "$ROOF" ]; then
    make --no-print-directory BUILD="$BUILD" "$ROOF" >"$tmp/make.log" 2>&1 || { bad "building $ROOF"; tail -n 5 "$tmp/make.log" >&2; }
fi
if [ -x "$ROOF" ]; then
    exits 0 "roofline --size 64M --quick" "$ROOF" --size 64M --quick -t 2
    if has "$tmp/out" "skipped"; then ok; else
        for m in "memory read" "int8 dot" "fp32 FMA"; do check "roofline prints '$m'" has "$tmp/out" "| $m"; done
        check "roofline: 1 and 2 thread columns" has "$tmp/out" '| 1 thread | 2 threads | unit |'
    fi
    exits 0 "roofline -o json" "$ROOF" --size 64M --quick -t 2 -o json
    check "roofline json parses, three figures per thread count" "$PYTHON" -c '
import json, sys
d = json.load(open(sys.argv[1]))
if "skipped" not in d:
    assert [r["threads"] for r in d["results"]] == [1, 2], d
    for r in d["results"]:
        for k in ("read_gbs", "int8_gops", "fp32_gflops"):
            assert r[k]["min"] <= r[k]["median"] <= r[k]["max"] and r[k]["median"] > 0, (k, r)
' "$tmp/out"
    exits 2 "roofline bad flag" "$ROOF" --size 1X
    check "roofline bad flag: message" grep -q '^roofline: ' "$tmp/err"
fi

# a policy that reads residency says so (not only in the -v summary)
exits 0 "a biased routing policy" $STRATA bench -m "$T" -p 16 -n 4 -r 1 --arena 128K --route 'decode=bias(body=1,bonus=1)'
check "bench says a biased run depends on residency" has "$tmp/err" "depends on expert residency"
exits 0 "exact routing" $STRATA bench -m "$T" -p 16 -n 4 -r 1 --arena 128K
check "an exact run does not" sh -c "! grep -q 'depends on expert residency' '$tmp/err'"
echo "bench: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
