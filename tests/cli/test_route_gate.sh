#!/bin/sh
# test_route_gate: bench/route/gate.sh, the quality gate of a candidate
# default routing policy (docs/ROUTING.md, "The gate"), in its --quick mode
# on a generated model with skewed routing (3 layers x 16 experts, k 8):
#   - exact routing as the candidate FAILS the speed criterion (no gain)
#     with a clear message, passes task and KL (nothing changed), exit 1;
#   - a deliberately harmful arm (body 0: every slot from the biased ranking)
#     FAILS the KL criterion. A random-weight model's output hardly depends
#     on its experts (mean KL ~1e-3 nats for this arm, in an arena of 3/4 of
#     the experts), so the test scales the bound down to 1e-4: it checks the
#     mechanism and the parsing, not the bound's value;
#   - the parsers of the tools' outputs (routelib.py) on real and on canned
#     taskeval --compare text, the one-sided sign test, a malformed output;
#   - a bad spec is a usage error (exit 2).
# Prints "route_gate: N passed, N failed". Env: STRATA, PYTHON.
STRATA=${STRATA:-build/strata}
PYTHON=${PYTHON:-/usr/bin/python3}
[ -x "$PYTHON" ] || PYTHON=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
ok()  { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
check() { d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }
has() { grep -q -- "$2" "$1"; }

M=$tmp/skew.gguf
$STRATA mkmodel --preset small --layers 3 --experts 16 --embd 128 --ff-exp 64 --route-skew 1.0 --seed 4 -q \
    -o "$M" >/dev/null 2>&1 || { echo "route_gate: 0 passed, 1 failed"; exit 1; }
GATE="bench/route/gate.sh"
Q="--quick --cases tests/eval/taskeval_cases.jsonl --every 1 --n-predict 8 --gen 8"
export STRATA PYTHON GATE_QUIET=1

# ==== exact as the candidate: no gain ====
timeout 120 $GATE "$M" exact $Q --out "$tmp/g1" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "exact candidate: exit 1 (got $rc)" test "$rc" -eq 1
check "exact: policy named" has "$tmp/out" "^route gate: candidate exact$"
check "exact: says no speed can be gained" has "$tmp/out" "the candidate is exact routing: nothing can change, and no speed can be gained"
check "exact: task passes, parsed from taskeval --compare" \
    grep -q "^(a) task : completed exact 0/6, candidate 0/6; 0 discordant (0 better, 0 worse); one-sided exact sign test (candidate worse) p = 1, alpha 0.05; loss 0 vs margin 0 -> PASS$" "$tmp/out"
check "exact: KL 0 on both corpora and modes, parsed from kld --json" \
    grep -q "^(b) KL   : .*tf_chat_long.txt prompt 0.000000 .*tf_chat.txt prompt 0.000000 (top-1 [0-9]*/[0-9]*); tf_chat.txt decode 0.000000 .*tf_toolcall.txt decode 0.000000 (top-1 [0-9]*/[0-9]*); bound < 0.03 -> PASS$" "$tmp/out"
check "exact: speed FAILS with no gain, parsed from bench-ab" \
    grep -q "^(c) speed: request time exact/candidate median [0-9.]* .*over 2 pairs .*; slots changed by the candidate 0 -> FAIL: no gain: the candidate changed no routing, so any measured difference is noise$" "$tmp/out"
check "exact: verdict" has "$tmp/out" "^route gate: FAIL (c)$"

# ==== a harmful arm: KL over the (scaled) bound ====
HARM='prompt=bias(body=0,bonus=8); decode=bias(body=0,bonus=8)'
timeout 120 $GATE "$M" "$HARM" $Q --arena-frac 0.75 --kl-max 0.0001 --speed-min 100 --out "$tmp/g2" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "harmful candidate: exit 1 (got $rc)" test "$rc" -eq 1
check "harmful: canonical policy, reads residency" \
    has "$tmp/out" "^route gate: candidate prompt.chunk0=bias(body=0,bonus=8); prompt=bias(body=0,bonus=8); decode=bias(body=0,bonus=8) (reads residency)$"
check "harmful: KL criterion fails, naming the corpus and mode" \
    grep -q "^(b) KL   : .* OVER.*bound < 0.0001 -> FAIL: tf_[a-z_]*.txt ([a-z]* feeding) drifts [0-9.]* >= 0.0001$" "$tmp/out"
check "harmful: verdict lists b" grep -q "^route gate: FAIL (.*b.*)$" "$tmp/out"
check "harmful: speed fails against an unreachable bound" grep -q "^(c) speed: .*-> FAIL: median" "$tmp/out"

# ==== parsers on canned outputs ====
check "parsers: compare text, sign test, malformed input" "$PYTHON" - "$tmp/g1/compare.out" <<'EOF'
import sys
sys.path.insert(0, "bench/route")
import routelib as rl
real = rl.parse_compare(open(sys.argv[1]).read())
assert real["paired"] == 6 and real["discordant"] == 0 and real["p_two"] == 1, real
canned = """taskeval compare: A = arm exact (a.json), B = arm candidate (b.json)
240 paired cases; completed A 188/240, B 183/240
completed: 1 better in B, 6 worse, 233 unchanged; exact two-sided sign test p = 0.125 (n = 7 discordant)
case score: 2 higher in B, 7 lower, 231 equal; exact two-sided sign test p = 0.1797 (n = 9)
"""
c = rl.parse_compare(canned)
assert (c["done_a"], c["done_b"], c["better"], c["worse"]) == (188, 183, 1, 6), c
assert abs(rl.sign_test_two_sided(1, 7) - 0.125) < 1e-12
assert abs(rl.sign_test_worse(1, 6) - 8 / 128) < 1e-12      # P(X <= 1), X ~ Bin(7, 1/2)
assert rl.sign_test_worse(0, 5) == 1 / 32 and rl.sign_test_worse(3, 0) == 1.0
for broken in (canned.replace("completed: 1 better", "completed: 2 better"), canned.replace("case score", "score")):
    try:
        rl.parse_compare(broken)
    except rl.ParseError:
        pass
    else:
        raise AssertionError("accepted: " + broken)
assert rl.span([1.2, 0.9, 1.0]) == (1.0, 0.9, 1.2)
EOF
check "parsers: bench-ab results" "$PYTHON" -c '
import sys; sys.path.insert(0, "bench/route")
import routelib as rl
p = rl.parse_abbench(sys.argv[1])
assert len(p) == 2 and all(x["request_speedup"] > 0 for x in p), p
' "$tmp/g2/ab/results.json"

# ==== usage errors ====
timeout 30 $GATE "$M" 'prompt=bias(body=1)' $Q --out "$tmp/g3" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "bad spec: exit 2 (got $rc)" test "$rc" -eq 2
check "bad spec: the route error is shown" has "$tmp/err" "bias needs bonus=X"
timeout 30 $GATE "$M" exact --bogus >"$tmp/out" 2>"$tmp/err"
check "unknown option: exit 2" test $? -eq 2

echo "route_gate: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
