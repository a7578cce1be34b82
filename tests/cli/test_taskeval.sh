#!/bin/sh
# test_taskeval: `strata taskeval`. The scorer on hand-written outputs with
# hand-computed scores (--replay, no model), the paired comparison and its
# sign test, case-file and replay-file errors naming the line, and an end
# to end run on a tiny generated model with tests/eval/taskeval_cases.jsonl
# (random weights: the scores are near zero; the run must work and be
# deterministic). Prints "taskeval: N passed, N failed". Env: STRATA, PYTHON.
STRATA=${STRATA:-build/strata}
PYTHON=${PYTHON:-/usr/bin/python3}
CASES=tests/eval/taskeval_cases.jsonl
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
# has FILE TEXT: a fixed-string match
has() { grep -qF -- "$2" "$1" || { echo "    missing in $1: $2" >&2; return 1; }; }

# ==== canned outputs with known scores ====
# A: one of each failure kind. Per case (hand-computed):
#   weather   tagged, exact                        completed, score 1
#   order     bare JSON, include_items "false"     args 1/2 (id ok, boolean typed wrong), score 0.625
#   capital   answer after a <think> block          completed, score 1
#   alarm     2nd call unclosed                     malformed, 1 of 2 calls, args 2/4, score 0.125
#   tool-res  a call where an answer was expected   not well-formed (no text), wrong tool, score 0
#   yes-no    "Yes" for exact "yes"                 not completed, score 2/3
cat >"$tmp/a.jsonl" <<'EOF'
{"id": "weather", "output": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3, \"metric\": true}}\n</tool_call>"}
{"id": "order", "output": "{\"name\": \"get_order\", \"arguments\": {\"order_id\": \"A-1042\", \"include_items\": \"false\"}}"}
{"id": "capital", "output": "<think>\nNo search needed.\n</think>\n\nThe capital of France is Paris."}
{"id": "alarm-and-notify", "output": "<tool_call>\n{\"name\": \"set_alarm\", \"arguments\": {\"time\": \"07:30\", \"enabled\": true}}\n</tool_call>\n<tool_call>\n{\"name\": \"send_message\", \"arguments\": {\"user_id\": 42, \"text\": \"Your ala"}
{"id": "tool-result", "output": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"}
{"id": "yes-no", "output": "Yes"}
EOF
# B: every case completed, through the other accepted forms: a fenced bare
# call with "parameters", arguments as a JSON string, text before two calls
# with an extra argument the case allows.
cat >"$tmp/b.jsonl" <<'EOF'
{"id": "weather", "output": "```json\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3.0, \"metric\": true}}\n```"}
{"id": "order", "output": "<tool_call>{\"name\": \"get_order\", \"arguments\": \"{\\\"order_id\\\": \\\"A-1042\\\", \\\"include_items\\\": false}\"}</tool_call>"}
{"id": "capital", "output": "<think>\nNo search needed.\n</think>\n\nThe capital of France is Paris."}
{"id": "alarm-and-notify", "output": "I'll do both.\n<tool_call>\n{\"name\": \"set_alarm\", \"arguments\": {\"time\": \"07:30\", \"enabled\": true}}\n</tool_call>\n<tool_call>\n{\"name\": \"send_message\", \"arguments\": {\"user_id\": 42, \"text\": \"Your alarm is set for 07:30.\", \"priority\": \"high\"}}\n</tool_call>"}
{"id": "tool-result", "output": "It is 18 °C in Oslo right now."}
{"id": "yes-no", "output": "yes"}
EOF

exits 0 "replay A" $STRATA taskeval --replay "$tmp/a.jsonl" --cases $CASES --arm canned-a --json "$tmp/a.json"
cp "$tmp/out" "$tmp/a.out"
check "A totals" has "$tmp/a.out" "total (arm canned-a): well-formed 4/6, right tool 4/6, arguments exact 6/9 (strings 2/3, numbers 1/1, booleans 2/3, ids 1/2), completed 2/6 (calls 1/3, answers 1/3); mean case score 0.5694"
check "A weather row" has "$tmp/a.out" "| weather | get_weather | tagged | 1 | yes | yes | 3/3 | 1/1 | 1/1 | 1/1 | — | yes |"
check "A order row (bare, typed boolean)" has "$tmp/a.out" "| order | get_order | bare | 1 | yes | yes | 1/2 | — | — | 0/1 | 1/1 | no |"
check "A capital row (think block cut)" has "$tmp/a.out" "| capital | answer | none | 0 | yes | yes | — | — | — | — | — | yes |"
check "A alarm row (unclosed call)" has "$tmp/a.out" "| alarm-and-notify | set_alarm + | tagged | 1 (+bad) | no | no | 2/4 | 1/2 | — | 1/1 | 0/1 | no |"
check "A tool-result row (call for answer)" has "$tmp/a.out" "| tool-result | answer | tagged | 1 | no | no | — | — | — | — | — | no |"
check "A yes-no row (exact match)" has "$tmp/a.out" "| yes-no | answer | none | 0 | yes | yes | — | — | — | — | — | no |"
check "A note: typed boolean" has "$tmp/a.out" 'order: call 1 include_items: expected false (boolean), got "false" (string)'
check "A note: unclosed" has "$tmp/a.out" "alarm-and-notify: malformed call: tool_call 2: no closing </tool_call>"
check "A note: exact answer" has "$tmp/a.out" 'yes-no: answer does not equal "yes"'

exits 0 "replay B" $STRATA taskeval --replay "$tmp/b.jsonl" --cases $CASES --arm canned-b --json "$tmp/b.json"
check "B totals: all completed" has "$tmp/out" "total (arm canned-b): well-formed 6/6, right tool 6/6, arguments exact 9/9 (strings 3/3, numbers 1/1, booleans 3/3, ids 2/2), completed 6/6 (calls 3/3, answers 3/3); mean case score 1.0000"
check "B fenced bare call" has "$tmp/out" "| weather | get_weather | bare | 1 | yes | yes | 3/3 |"

exits 0 "rescore a --json result" $STRATA taskeval --replay "$tmp/a.json" --cases $CASES --arm canned-a
check "rescored totals equal" has "$tmp/out" "completed 2/6 (calls 1/3, answers 1/3); mean case score 0.5694"

# ==== parser edge cases (own cases; hand-computed) ====
#   p-array        bare JSON array of calls                 completed
#   p-json-answer  {"name": "Paris"} has no arguments: text  completed (answer contains Paris)
#   p-bad-json     tagged body missing a brace               malformed, score 0
#   p-think        a call inside <think> does not count      completed
#   p-truncated    bare call cut off                         malformed, score 0
#   p-typed        1 (number) for "1" (string)               not completed, score 0.5
cat >"$tmp/pc.jsonl" <<'EOF'
{"id": "p-array", "messages": [{"role": "user", "content": "x"}], "expected": {"calls": [{"name": "f", "arguments": {"x": 1}}]}}
{"id": "p-json-answer", "messages": [{"role": "user", "content": "x"}], "expected": {"answer": "Paris"}}
{"id": "p-bad-json", "messages": [{"role": "user", "content": "x"}], "expected": {"calls": [{"name": "f", "arguments": {"x": 1}}]}}
{"id": "p-think", "messages": [{"role": "user", "content": "x"}], "expected": {"calls": [{"name": "f", "arguments": {"x": 1}}]}}
{"id": "p-truncated", "messages": [{"role": "user", "content": "x"}], "expected": {"calls": [{"name": "f", "arguments": {"x": 1}}]}}
{"id": "p-typed", "messages": [{"role": "user", "content": "x"}], "expected": {"calls": [{"name": "f", "arguments": {"x": "1"}}]}}
EOF
cat >"$tmp/po.jsonl" <<'EOF'
{"id": "p-array", "output": "[{\"name\": \"f\", \"arguments\": {\"x\": 1}}]"}
{"id": "p-json-answer", "output": "{\"name\": \"Paris\"}"}
{"id": "p-bad-json", "output": "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}</tool_call>"}
{"id": "p-think", "output": "<think>maybe <tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call></think><tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>"}
{"id": "p-truncated", "output": "{\"name\": \"f\", \"arguments\": {\"x\": 1"}
{"id": "p-typed", "output": "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>"}
EOF
exits 0 "replay parser cases" $STRATA taskeval --replay "$tmp/po.jsonl" --cases "$tmp/pc.jsonl"
check "parser totals" has "$tmp/out" "well-formed 4/6, right tool 4/6, arguments exact 2/5 (strings 0/1, numbers 2/4, booleans 0/0, ids 0/0), completed 3/6 (calls 2/5, answers 1/1); mean case score 0.5833"
check "bare array" has "$tmp/out" "| p-array | f | bare | 1 | yes | yes | 1/1 |"
check "bad tagged JSON" has "$tmp/out" "p-bad-json: malformed call: tool_call 1: not valid JSON at byte 34"
check "think call ignored" has "$tmp/out" "| p-think | f | tagged | 1 | yes | yes | 1/1 | — | 1/1 | — | — | yes |"
check "truncated bare call" has "$tmp/out" "p-truncated: malformed call: bare JSON: not valid JSON"
check "typed mismatch" has "$tmp/out" 'p-typed: call 1 x: expected "1" (string), got 1 (number)'
check "call for an answer" has "$tmp/a.out" "tool-result: called get_weather, expected an answer"

# ==== --compare: 4 cases completed only in B, none only in A ====
exits 0 "compare A B" $STRATA taskeval --compare "$tmp/a.json" "$tmp/b.json"
check "compare header" has "$tmp/out" "A = arm canned-a"
check "compare sign test" has "$tmp/out" "completed: 4 better in B, 0 worse, 2 unchanged; exact two-sided sign test p = 0.125 (n = 4 discordant)"
check "compare score test" has "$tmp/out" "case score: 4 higher in B, 0 lower, 2 equal; exact two-sided sign test p = 0.125 (n = 4)"
check "compare lists a changed case" has "$tmp/out" "| yes-no | no | yes | 0.6667 | 1.0000 | completed in B only |"
check "compare lists output-only change" has "$tmp/out" "| weather | yes | yes | 1.0000 | 1.0000 | output differs, same score |"
check "compare omits unchanged" sh -c "! grep -q '^| capital ' '$tmp/out'"
exits 0 "compare B A" $STRATA taskeval --compare "$tmp/b.json" "$tmp/a.json"
check "reversed: 4 worse" has "$tmp/out" "completed: 0 better in B, 4 worse, 2 unchanged; exact two-sided sign test p = 0.125"
exits 0 "compare A A" $STRATA taskeval --compare "$tmp/a.json" "$tmp/a.json"
check "self compare: nothing changed" has "$tmp/out" "no case changed"
check "self compare: p = 1" has "$tmp/out" "sign test p = 1 (n = 0 discordant)"

# ==== errors ====
head -n 2 $CASES >"$tmp/bad.jsonl"
echo '{"id": "broken", "messages": [' >>"$tmp/bad.jsonl"
exits 1 "malformed JSONL line" $STRATA taskeval --replay "$tmp/a.jsonl" --cases "$tmp/bad.jsonl"
check "error names the line" has "$tmp/err" "bad.jsonl:3: not valid JSON at column"
check "error is one line" test "$(wc -l <"$tmp/err")" -eq 1
printf '%s\n\n%s\n' "$(head -n 1 $CASES)" '{"id": "x", "messages": [{"role": "user", "content": "hi"}]}' >"$tmp/bad2.jsonl"
exits 1 "case without expected" $STRATA taskeval --replay "$tmp/a.jsonl" --cases "$tmp/bad2.jsonl"
check "schema error names line 3" has "$tmp/err" 'bad2.jsonl:3: "expected" must be an object with "calls" or "answer"'
printf '%s\n%s\n' "$(head -n 1 $CASES)" "$(head -n 1 $CASES)" >"$tmp/dup.jsonl"
exits 1 "duplicate case id" $STRATA taskeval --replay "$tmp/a.jsonl" --cases "$tmp/dup.jsonl"
check "duplicate id named" has "$tmp/err" 'dup.jsonl:2: case id "weather" already used on line 1'
head -n 5 "$tmp/a.jsonl" >"$tmp/short.jsonl"
exits 1 "replay missing a case" $STRATA taskeval --replay "$tmp/short.jsonl" --cases $CASES
check "missing case named" has "$tmp/err" 'no output for case "yes-no"'
exits 2 "no case file" $STRATA taskeval --replay "$tmp/a.jsonl"
exits 2 "no model" $STRATA taskeval --cases $CASES
exits 2 "unknown option" $STRATA taskeval --cases $CASES --bogus
exits 1 "compare a non-result" $STRATA taskeval --compare "$tmp/a.jsonl" "$tmp/b.json"

# ==== end to end on a tiny generated model ====
M=$tmp/tiny.gguf
if $STRATA mkmodel --preset tiny -q -o "$M" >/dev/null 2>&1; then
    exits 0 "taskeval on tiny model" $STRATA taskeval -m "$M" --cases $CASES -n 12 -c 1024 --arm r1 --json "$tmp/r1.json"
    cp "$tmp/out" "$tmp/r1.out"
    check "six case rows" test "$(grep -c '^| [a-z]' "$tmp/r1.out")" -eq 7
    check "totals line" has "$tmp/r1.out" "total (arm r1): well-formed "
    check "tool prompt is strata's" has "$tmp/r1.out" "tool prompt strata"
    check "json result" "$PYTHON" -c "
import json, sys
r = json.load(open('$tmp/r1.json'))
assert r['arm'] == 'r1' and len(r['cases']) == 6, r.keys()
c = r['cases'][0]
assert c['prompt'].startswith('<|im_start|>system\nAvailable tools (JSON schemas), one per line:\n<tools>\n{\"type\": \"function\"'), c['prompt'][:80]
assert c['prompt'].endswith('<|im_end|>\n<|im_start|>assistant\n')
assert all(x['generated_tokens'] <= 12 for x in r['cases'])
assert r['totals']['cases'] == 6
"
    exits 0 "taskeval again (second arm)" $STRATA taskeval -m "$M" --cases $CASES -n 12 -c 1024 -t 1 --arm r2 --json "$tmp/r2.json"
    exits 0 "compare two runs" $STRATA taskeval --compare "$tmp/r1.json" "$tmp/r2.json"
    check "greedy runs are deterministic" has "$tmp/out" "no case changed"
    exits 1 "context too small" $STRATA taskeval -m "$M" --cases $CASES -n 4 -c 64
    check "context error names the case" has "$tmp/err" "case weather: the prompt is"
else
    bad "mkmodel --preset tiny"
fi

echo "taskeval: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
