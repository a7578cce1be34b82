#!/bin/sh
# test_abbench: `strata bench-ab` on a tiny generated model. Two real arms
# (-t 1 vs -t 2, streaming with --arena 0 so the stream counters exist),
# 1 warm-up round and 3 pairs: the per-pair table in the seed report's
# layout, the A,B / B,A alternation, the median and range wording, the
# generated-output comparison, the provenance in results.json, the kept
# logs and the HTML picture; the stderr fallback without --report-json; a
# failing arm fails the benchmark and keeps its log; usage errors.
# Prints "abbench: N passed, N failed". Env: STRATA, PYTHON.
STRATA=${STRATA:-build/strata}
PYTHON=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

ok()  { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
check() { d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }
exits() {
    want=$1; d=$2; shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"
    got=$?
    if [ "$got" -eq "$want" ]; then ok; else bad "$d (exit $got, wanted $want)"; sed 's/^/    /' "$tmp/err" >&2; fi
}
has() { grep -qF -- "$2" "$1" || { echo "    missing in $1: $2" >&2; return 1; }; }

M=$tmp/tiny.gguf
if ! $STRATA mkmodel --preset tiny -q -o "$M" >/dev/null 2>&1; then
    echo "abbench: 0 passed, 1 failed"; exit 1
fi
P="The quick brown fox jumps over the lazy dog"
AB="$tmp/ab"

# ==== two arms, 1 warm-up + 3 pairs ====
STRATA_ABTEST=1 exits 0 "bench-ab -t 1 vs -t 2" $STRATA bench-ab -o "$AB" --arm-a '-t 1 --arena 0' --arm-b '-t 2 --arena 0' \
    --name-a t1 --name-b t2 --env-b STRATA_ABTEST_B=yes --warmup 1 --pairs 3 --html "$tmp/ab.html" \
    -- run -m "$M" -p "$P" -n 6 --temp 0
cp "$tmp/out" "$tmp/ab.out"
check "header" has "$tmp/ab.out" "paired A/B: baseline A = t1, candidate B = t2"
check "command printed quoted" has "$tmp/ab.out" "command: strata run -m $M -p 'The quick brown fox jumps over the lazy dog' -n 6 --temp 0"
check "table header (seed layout)" has "$tmp/ab.out" "| pair | arm | ran | end-to-end prefill excluding init ms | tok/s | candidate/baseline end-to-end ratio | chunk-only ms | candidate/baseline chunk-only ratio | prompt bytes read | candidate/baseline bytes ratio |"
check "six pair rows" test "$(grep -cE '^\| [123] \| t[12] \| (1st|2nd) \| [0-9.]+ \| [0-9.]+ \| ' "$tmp/ab.out")" -eq 6
check "pair 1 ran A first" grep -qE '^\| 1 \| t1 \| 1st \|' "$tmp/ab.out"
check "pair 2 ran B first" grep -qE '^\| 2 \| t2 \| 1st \|' "$tmp/ab.out"
check "pair 3 ran A first" grep -qE '^\| 3 \| t1 \| 1st \|' "$tmp/ab.out"
check "baseline rows have no ratio" grep -qE '^\| 1 \| t1 \| 1st \| [0-9.]+ \| [0-9.]+ \| — \| [0-9.]+ \| — \| [0-9]+ \| — \|$' "$tmp/ab.out"
check "candidate rows have ratios" grep -qE '^\| 1 \| t2 \| 2nd \| [0-9.]+ \| [0-9.]+ \| [0-9]\.[0-9]{6} \| [0-9.]+ \| [0-9]\.[0-9]{6} \| [0-9]+ \| 1\.000000 \|$' "$tmp/ab.out"
check "median and range" grep -qE '^median paired end-to-end prefill excluding init ratio = [0-9]\.[0-9]{6} \([+-][0-9.]+% latency\); observed range [0-9.]+\.\.[0-9.]+\. median paired chunk-only ratio = ' "$tmp/ab.out"
check "range is not a CI" has "$tmp/ab.out" "ranges are descriptive min..max, not a 95% confidence interval; n=3 does not support a strong CI claim."
check "pairs each way" grep -qE '(all 3 pairs (faster|slower|equal)|[0-3] of 3 pairs faster, [0-3] slower, [0-3] equal)\.' "$tmp/ab.out"
check "bytes ratio (same experts read)" has "$tmp/ab.out" "median paired prompt bytes ratio = 1.000000 (+0.00%); observed range 1.000000..1.000000; all 3 pairs equal."
check "threads do not change the output" has "$tmp/ab.out" "generated output (stdout bytes): A and B equal in 3/3 pairs."
check "warm-up stated" has "$tmp/ab.out" "1 warm-up round (A then B) discarded; 3 pairs, order A,B in odd pairs and B,A in even pairs"
grep -v '^logs, report.md' "$tmp/ab.out" >"$tmp/ab.report"
check "report.md is the printed report" cmp -s "$AB/report.md" "$tmp/ab.report"
check "8 runs' logs kept" test "$(ls "$AB"/*.stderr | wc -l)" -eq 8 -a "$(ls "$AB"/*.report.json | wc -l)" -eq 8 -a "$(ls "$AB"/*.stdout | wc -l)" -eq 8
check "warm-up logs kept" test -s "$AB/warmup1-B.stderr"
check "html picture" sh -c "grep -q '<svg' '$tmp/ab.html' && grep -q 'median ' '$tmp/ab.html' && grep -c '<circle' '$tmp/ab.html' | grep -qx 9"
SUM=$(command -v sha256sum || true)
check "results.json provenance" "$PYTHON" -c "
import json, os, subprocess, sys
r = json.load(open('$AB/results.json'))
p = r['provenance']
assert r['ok'] is True and r['warmup'] == 1 and r['pairs'] == 3 and r['order'] == 'alternate'
assert p['argv'][:2] == ['strata', 'bench-ab'] and '--arm-b' in p['argv'], p['argv']
assert p['env'].get('STRATA_ABTEST') == '1', p['env']
b = p['arms']['B']
assert b['env_set'] == {'STRATA_ABTEST_B': 'yes'}, b['env_set']
assert b['strata_env'].get('STRATA_ABTEST_B') == 'yes' and b['strata_env'].get('STRATA_ABTEST') == '1'
assert 'STRATA_ABTEST_B' not in p['arms']['A']['strata_env']
assert b['command'][1:4] == ['run', '-m', '$M'] and b['command'][-4:] == ['--arena', '0', '--report-json', 'FILE'], b['command']
assert len(b['binary_sha256']) == 64 and b['binary_sha256'] == p['arms']['A']['binary_sha256']
if '$SUM':
    want = subprocess.run(['$SUM', b['binary']], capture_output=True, text=True).stdout.split()[0]
    assert b['binary_sha256'] == want, (b['binary_sha256'], want)
    want = subprocess.run(['$SUM', '$M'], capture_output=True, text=True).stdout.split()[0]
    assert p['models'][0]['header_sha256'] == want
m = p['models'][0]
assert m['path'] == '$M' and m['size'] == os.path.getsize('$M') and m['header_bytes'] == m['size']
assert 'commit' in p['git'] and p['cpu'] and p['kernel'].startswith('Linux') and p['date'].endswith('Z')
assert len(r['runs']) == 8 and all(x['exit_code'] == 0 for x in r['runs'])
assert [x['run'] for x in r['runs']][2:6] == ['pair1-A', 'pair1-B', 'pair2-B', 'pair2-A']
assert all(x['metrics']['prompt_bytes'] > 0 and x['metrics']['chunk_ms'] > 0 for x in r['runs'])
assert len(r['pair_results']) == 3 and r['pair_results'][1]['order'] == 'B,A'
assert all(x['output_equal'] is True for x in r['pair_results'])
s = r['summary']
assert s['prefill_ratio']['n'] == 3 and s['prefill_ratio']['min'] <= s['prefill_ratio']['median'] <= s['prefill_ratio']['max']
assert s['bytes_ratio']['median'] == 1 and s['pairs_faster'] + s['pairs_slower'] + s['pairs_equal'] == 3
"

# ==== no --report-json: the stderr timing line; not streaming: n/a ====
exits 0 "stderr fallback, --order ab" $STRATA bench-ab -o "$tmp/ab2" --arm-b '-t 2' --warmup 0 --pairs 2 --order ab \
    --no-report-json -- run -m "$M" -p "$P" -n 2 --temp 0
check "arm with no args is A" has "$tmp/out" "baseline A = A, candidate B = -t 2"
check "always A,B" sh -c "! grep -qE '^\| [12] \| A \| 2nd' '$tmp/out'"
check "n/a without stream counters" grep -qE '^\| 1 \| -t 2 \| 2nd \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| n/a \| n/a \| n/a \| n/a \|$' "$tmp/out"
check "bytes ratio n/a" has "$tmp/out" "prompt bytes ratio n/a"
check "no report files" sh -c "! ls '$tmp/ab2'/*.report.json >/dev/null 2>&1"

# ==== a failing arm fails the benchmark and keeps its log ====
exits 1 "failing arm" $STRATA bench-ab -o "$tmp/ab3" --arm-b '--no-such-flag' --pairs 2 -- run -m "$M" -p "$P" -n 2 --temp 0
check "failure names run, arm, status and log" has "$tmp/err" "strata bench-ab: warmup1-B (arm --no-such-flag) exited with status 2; logs kept in $tmp/ab3/warmup1-B.stderr"
check "failure is the last stderr line" sh -c "tail -n 1 '$tmp/err' | grep -q 'exited with status 2'"
check "failed run's log kept" has "$tmp/ab3/warmup1-B.stderr" "unknown option '--no-such-flag'"
check "results.json records the failure" "$PYTHON" -c "
import json
r = json.load(open('$tmp/ab3/results.json'))
assert r['ok'] is False and r['failed_run']['run'] == 'warmup1-B', r.get('failed_run')
assert [(x['run'], x['exit_code']) for x in r['runs']] == [('warmup1-A', 0), ('warmup1-B', 2)]
"
exits 1 "missing model fails in the first run" $STRATA bench-ab -o "$tmp/ab4" --warmup 0 --pairs 1 -- run -m "$tmp/none.gguf" -p x
check "exit status 1 kept" has "$tmp/err" "pair1-A (arm A) exited with status 1"

printf '#!/bin/sh\nexec sleep 3\n' >"$tmp/slow.sh"
chmod +x "$tmp/slow.sh"
exits 1 "a run past --timeout" $STRATA bench-ab -o "$tmp/ab6" --bin "$tmp/slow.sh" --timeout 1 --warmup 0 --pairs 1 -- run
check "timeout named" has "$tmp/err" "pair1-A (arm A) ran past --timeout 1 s (killed by SIGALRM)"

# ==== usage ====
exits 2 "no -o" $STRATA bench-ab -- run -m "$M" -p x
exits 2 "no command" $STRATA bench-ab -o "$tmp/ab5"
exits 2 "bad order" $STRATA bench-ab -o "$tmp/ab5" --order ba -- run -m "$M" -p x
exits 2 "unterminated quote" $STRATA bench-ab -o "$tmp/ab5" --arm-a "-p 'x" -- run -m "$M"
check "quote error names the arm" has "$tmp/err" "--arm-a: unterminated quote"
exits 2 "bad env" $STRATA bench-ab -o "$tmp/ab5" --env-a NOVALUE -- run -m "$M" -p x
exits 2 "binary after --" $STRATA bench-ab -o "$tmp/ab5" -- build/strata run -m "$M" -p x
check "binary after -- explained" has "$tmp/err" "after -- comes the strata subcommand"
exits 0 "help" $STRATA bench-ab --help

echo "abbench: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
