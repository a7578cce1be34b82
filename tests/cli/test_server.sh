#!/bin/sh
# strata serve: the official openai npm client (tests/server/openai_test.mjs)
# and raw-socket / HTTP checks (tests/server/http_checks.py) against servers
# on a random tiny model, on random free ports of 127.0.0.1.
# Prints "server: N passed, N failed". If the openai package cannot be
# installed (no network, no npm) the Node part is skipped with a SKIP line on
# stderr; the HTTP checks still run.
BUILD=${BUILD:-build}
STRATA=${STRATA:-$BUILD/strata}
PYTHON=${PYTHON:-python3}
NPM_DIR=$BUILD/server-npm
tmp=$(mktemp -d)
pids=""
cleanup() {
    for p in $pids; do kill "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $1" >&2; }

# start_server LOG ARGS...: starts strata serve --port 0, waits (bounded) for
# "ready", sets PORT and PID.
start_server() {
    log=$1; shift
    "$STRATA" serve -m "$tmp/tiny.gguf" --port 0 "$@" 2>"$log" &
    PID=$!
    pids="$pids $PID"
    PORT=""
    i=0
    while [ $i -lt 100 ]; do
        if grep -q 'ready on' "$log" 2>/dev/null; then
            PORT=$(sed -n 's/.*ready on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -n 1)
            break
        fi
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1; i=$((i + 1))
    done
    [ -n "$PORT" ]
}

# unit checks of the request parsing and response building (server_api.c)
CC=${CC:-cc}
SANF=""   # a sanitizer build of the library (make asan) needs the same flags to link
nm "$BUILD/libstrata.a" 2>/dev/null | grep -q __asan_ && SANF="-fsanitize=address,undefined -fno-omit-frame-pointer"
nm "$BUILD/libstrata.a" 2>/dev/null | grep -q __tsan_ && SANF="-fsanitize=thread"
if $CC $SANF -std=c11 -D_GNU_SOURCE -Isrc -Iapps/server -Iapps/eval tests/server/test_server_api.c apps/server/server_api.c \
        apps/eval/toolcall.c "$BUILD/libstrata.a" -lpcre2-8 -luring -lcjson -lm -lpthread -o "$tmp/test_server_api" \
        2>"$tmp/unit.log" && "$tmp/test_server_api" >"$tmp/unit.out" 2>&1; then
    pass=$((pass + $(grep -c '^PASS ' "$tmp/unit.out"))); f=$(grep -c '^FAIL ' "$tmp/unit.out")
    fail=$((fail + f)); grep '^FAIL ' "$tmp/unit.out" >&2
    grep -q '^UNIT_DONE' "$tmp/unit.out" || bad "server_api unit test did not finish"
else
    bad "server_api unit test did not build or crashed"; tail -n 20 "$tmp/unit.log" "$tmp/unit.out" >&2
fi

"$STRATA" mkmodel --preset tiny --ctx 4096 -o "$tmp/tiny.gguf" >/dev/null 2>&1 || { echo "server: 0 passed, 1 failed"; exit 1; }

# 503 while loading: a FIFO as the model keeps engine_open waiting in open()
# with the HTTP server already up; opening the other end lets it fail (a FIFO
# is not a regular file) and the server exits 1.
mkfifo "$tmp/fifo.gguf"
"$STRATA" serve -m "$tmp/fifo.gguf" --port 0 -t 1 2>"$tmp/l.log" &
PID_L=$!
PORT_L=""; i=0
while [ -z "$PORT_L" ] && [ $i -lt 50 ]; do
    sleep 0.1; i=$((i + 1))
    PORT_L=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/l.log" | head -n 1)
done
code=$(curl -s -o "$tmp/l.json" -w '%{http_code}' --max-time 5 "http://127.0.0.1:$PORT_L/health")
{ [ "$code" = 503 ] && grep -q 'Loading model' "$tmp/l.json"; } && ok || bad "/health while loading: $code"
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$PORT_L/v1/models")
[ "$code" = 503 ] && ok || bad "/v1/models while loading: $code"
timeout 5 sh -c ": > '$tmp/fifo.gguf'"
i=0; while kill -0 "$PID_L" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
kill "$PID_L" 2>/dev/null
wait "$PID_L"; rc=$?
[ $rc = 1 ] && ok || bad "server on a FIFO exited $rc, not 1"

KEY=sk-test-$$
if start_server "$tmp/a.log" -t 1 -c 1024 --api-key "$KEY" --queue 4 --max-body 64K --idle-timeout 3; then
    ok; PORT_A=$PORT; PID_A=$PID
else
    bad "server A did not start"; cat "$tmp/a.log" >&2
    echo "server: $pass passed, $((fail + 1)) failed"; exit 1
fi
REPLY='<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris"}}
</tool_call>'
if start_server "$tmp/b.log" -t 1 -c 1024 --debug-reply "$REPLY"; then ok; PORT_B=$PORT; PID_B=$PID; else bad "server B did not start"; fi
if start_server "$tmp/c.log" -t 1 -c 1024 --debug-token-delay 20 --timeout 2 --queue 1; then ok; PORT_C=$PORT; PID_C=$PID; else bad "server C did not start"; fi

# curl: the basics
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "http://127.0.0.1:$PORT_A/health")
[ "$code" = 200 ] && ok || bad "curl /health: $code"
out=$(curl -s --max-time 20 -H "Authorization: Bearer $KEY" "http://127.0.0.1:$PORT_A/v1/chat/completions" \
      -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}')
echo "$out" | tail -n 2 | grep -q '^data: \[DONE\]' && ok || bad "curl SSE does not end in [DONE]: $out"

# the openai npm client
node_ok=0
if command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1; then
    mkdir -p "$NPM_DIR"
    cp tests/server/package.json tests/server/package-lock.json "$NPM_DIR"/
    if [ -d "$NPM_DIR/node_modules/openai" ] || timeout 180 npm ci --prefix "$NPM_DIR" --no-audit --no-fund >"$tmp/npm.log" 2>&1; then
        node_ok=1
    fi
fi
if [ $node_ok = 1 ]; then
    cp tests/server/openai_test.mjs "$NPM_DIR/openai_test.mjs"
    STRATA_URL=http://127.0.0.1:$PORT_A STRATA_DEBUG_URL=http://127.0.0.1:$PORT_B STRATA_KEY=$KEY \
        STRATA_MODEL_ID=tiny.gguf timeout 120 node "$NPM_DIR/openai_test.mjs" >"$tmp/node.out" 2>&1
    rc=$?
    p=$(grep -c '^PASS ' "$tmp/node.out"); f=$(grep -c '^FAIL ' "$tmp/node.out")
    pass=$((pass + p)); fail=$((fail + f))
    grep '^FAIL ' "$tmp/node.out" >&2
    if ! grep -q '^NODE_DONE' "$tmp/node.out"; then bad "node test did not finish (exit $rc)"; tail -n 20 "$tmp/node.out" >&2; fi
else
    echo "SKIP openai npm client tests: npm ci failed or npm missing (see $NPM_DIR)" >&2
fi

# raw sockets, concurrency, timeouts, cancellation, shutdown
timeout 300 "$PYTHON" tests/server/http_checks.py "$STRATA" "$tmp/tiny.gguf" "$PORT_A" "$KEY" "$PID_A" "$PORT_C" "$PID_C" \
    >"$tmp/py.out" 2>&1
rc=$?
p=$(grep -c '^PASS ' "$tmp/py.out"); f=$(grep -c '^FAIL ' "$tmp/py.out")
pass=$((pass + p)); fail=$((fail + f))
grep -E '^FAIL |^  rss' "$tmp/py.out" >&2
if ! grep -q '^PY_DONE' "$tmp/py.out"; then bad "http checks did not finish (exit $rc)"; tail -n 20 "$tmp/py.out" >&2; fi

# expert streaming (--arena): same greedy text as the resident server A, and
# the expert-stream counters in /metrics
if start_server "$tmp/d.log" -t 1 -c 1024 --arena 100K --read-ahead 1 --no-direct; then
    ok; PORT_D=$PORT; PID_D=$PID
    req='{"prompt":"The quick brown fox","max_tokens":32,"temperature":0}'
    curl -s --max-time 30 -H "Authorization: Bearer $KEY" "http://127.0.0.1:$PORT_A/v1/completions" -d "$req" >"$tmp/ra.json"
    curl -s --max-time 30 "http://127.0.0.1:$PORT_D/v1/completions" -d "$req" >"$tmp/rd.json"
    if "$PYTHON" -c 'import json,sys; a,b=(json.load(open(f))["choices"][0]["text"] for f in sys.argv[1:]); sys.exit(a!=b or not a)' \
            "$tmp/ra.json" "$tmp/rd.json"; then ok; else bad "streamed-experts server differs from resident: $(cat "$tmp/rd.json")"; fi
    curl -s --max-time 10 "http://127.0.0.1:$PORT_D/metrics" >"$tmp/metrics"
    if grep -qE '^strata_expert_stream_bytes_read_total\{phase="decode"\} [1-9]' "$tmp/metrics" &&
       grep -qE '^strata_expert_stream_misses_total\{phase="prompt"\} [0-9]' "$tmp/metrics" &&
       grep -qE '^strata_expert_stream_streaming 1' "$tmp/metrics"; then ok; else bad "expert-stream metrics missing"; fi
    if grep -qE '^strata_expert_arena_slots [1-9]' "$tmp/metrics" &&
       grep -qE '^strata_expert_arena_filled_slots [1-9]' "$tmp/metrics"; then ok; else bad "arena occupancy metrics missing"; fi
    kill -TERM "$PID_D"; wait "$PID_D" && ok || bad "server D exit status"
else
    bad "server D (--arena) did not start"; tail -n 5 "$tmp/d.log" >&2
fi

# server C got SIGTERM in the checks: it must exit 0
i=0; while kill -0 "$PID_C" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
wait "$PID_C"; rc=$?
[ $rc = 0 ] && ok || bad "server C exited $rc after SIGTERM"
# SIGINT on A and B: exit 0
for p in $PID_A $PID_B; do
    kill -INT "$p"
    i=0; while kill -0 "$p" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    wait "$p"; rc=$?
    [ $rc = 0 ] && ok || bad "server $p exited $rc after SIGINT"
done
pids=""
grep -q 'stopped' "$tmp/a.log" && ok || bad "server A did not log a clean stop"

echo "server: $pass passed, $fail failed"
[ $fail = 0 ]
