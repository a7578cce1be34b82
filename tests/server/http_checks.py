"""strata serve: raw-socket and curl-level checks (no third-party modules).

usage: http_checks.py STRATA MODEL PORT KEY SERVER_PID SLOW_PORT SLOW_PID
  PORT/KEY: the main server (--api-key KEY --queue 4 --max-body 64K -t 1 -c 256)
  SLOW_PORT: a server with --debug-token-delay 20 --timeout 2 --queue 1
Prints "PASS name" / "FAIL name: why"; every socket has a timeout and every
loop a bound."""
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

STRATA, MODEL, PORT, KEY, PID, SLOW_PORT, SLOW_PID = sys.argv[1:8]
PORT, SLOW_PORT = int(PORT), int(SLOW_PORT)
AUTH = {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}
failed = 0


def check(name, fn):
    global failed
    try:
        fn()
        print("PASS " + name, flush=True)
    except Exception as e:  # noqa: BLE001
        failed += 1
        print("FAIL %s: %r" % (name, e), flush=True)


def request(method, path, body=None, headers=None, port=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port or PORT, timeout=timeout)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    c.request(method, path, body=data, headers=AUTH if headers is None else headers)
    r = c.getresponse()
    out = (r.status, dict(r.getheaders()), r.read())
    c.close()
    return out


def jtext(raw):
    """Decoded JSON text field as bytes again (U+FFFD stays as its UTF-8)."""
    return raw


def raw_exchange(payload, port=None, timeout=10, pieces=None, delay=0.0):
    s = socket.create_connection(("127.0.0.1", port or PORT), timeout=timeout)
    try:
        if pieces:
            for i in range(0, len(payload), pieces):
                s.sendall(payload[i:i + pieces])
                time.sleep(delay)
        else:
            s.sendall(payload)
        chunks = []
        deadline = time.time() + timeout
        while time.time() < deadline:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
            if b"\r\n\r\n" in b"".join(chunks) and b"Content-Length" in b"".join(chunks):
                head, _, rest = b"".join(chunks).partition(b"\r\n\r\n")
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        if len(rest) >= int(line.split(b":")[1]):
                            return b"".join(chunks)
        return b"".join(chunks)
    finally:
        s.close()


def rss_kb(pid):
    with open("/proc/%s/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def strata_run(prompt, n):
    r = subprocess.run([STRATA, "run", "-m", MODEL, "-p", prompt, "-n", str(n), "--temp", "0", "-t", "1", "-c", "1024",
                        "--no-escape"], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout.decode("utf-8", "replace")


def completion(prompt, n, port=None):
    st, _, body = request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0}, port=port)
    assert st == 200, (st, body)
    return json.loads(body)


def t_health():
    st, _, body = request("GET", "/health", headers={})
    assert st == 200 and json.loads(body)["status"] == "ok", (st, body)


def t_greedy_equals_run():
    for prompt, n in (("The quick brown fox", 24), ("The quick brown fox jumps over", 24), ("The quick brown fox", 24),
                      ("Hello", 40)):
        r = completion(prompt, n)
        want = strata_run(prompt, n)
        assert r["choices"][0]["text"] == want, (prompt, r["choices"][0]["text"], want)
    # the repeated prompt came from the KV cache
    r = completion("Hello", 40)
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, r["usage"]


def t_chat_equals_strata_chat():
    st, _, body = request("POST", "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 20, "temperature": 0})
    assert st == 200, (st, body)
    got = json.loads(body)["choices"][0]["message"]["content"]
    r = subprocess.run([STRATA, "chat", "-m", MODEL, "-n", "20", "--temp", "0", "-t", "1", "-c", "1024"],
                       input=b"hi there\n", capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    want = r.stdout.decode("utf-8", "replace")
    assert want.endswith("\n")
    assert got == want[:-1], (got, want)


def t_errors():
    st, h, body = request("POST", "/v1/chat/completions", b"{not json", headers=AUTH)
    assert st == 400 and json.loads(body)["error"]["code"] == 400, (st, body)
    st, h, body = request("POST", "/v1/chat/completions", {"messages": []}, headers={})
    assert st == 401 and json.loads(body)["error"]["type"] == "authentication_error", (st, body)
    st, h, body = request("GET", "/v1/nothing")
    assert st == 404, st
    st, h, body = request("DELETE", "/v1/models")
    assert st == 405, st
    st, h, body = request("GET", "/metrics")
    assert st == 200 and b"strata_requests_total" in body and b"strata_tokens_predicted_total" in body, body[:200]
    st, h, body = request("GET", "/metrics", headers={})
    assert st == 401, st


def t_413():
    big = b'{"prompt":"' + b"a" * 100000 + b'"}'
    st, h, body = request("POST", "/v1/completions", big)
    assert st == 413 and json.loads(body)["error"]["code"] == 413, (st, body[:200])
    # chunked upload (no Content-Length): the limit holds while reading
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    c.putrequest("POST", "/v1/completions")
    for k, v in AUTH.items():
        c.putheader(k, v)
    c.putheader("Transfer-Encoding", "chunked")
    c.endheaders()
    for _ in range(20):
        part = b"a" * 8192
        c.send(b"%x\r\n%s\r\n" % (len(part), part))
    c.send(b"0\r\n\r\n")
    r = c.getresponse()
    assert r.status == 413, r.status
    r.read()
    c.close()
    t_health()


def t_malformed_http():
    for junk in (b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
                 b"\x00\x01\x02\xff\r\n\r\n", b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"b" * 100000 + b"\r\n\r\n"):
        out = raw_exchange(junk, timeout=10)  # closed (idle timeout 3 s) or a 4xx/5xx
        assert out == b"" or out.startswith(b"HTTP/1.") and out[9:10] in (b"4", b"5"), out[:100]
    t_health()


def t_slow_client():
    # a client that sends its request a few bytes at a time is served ...
    body = json.dumps({"prompt": "slow", "max_tokens": 4, "temperature": 0}).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
           b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)) + body
    # ... while another one stalls half-way through its headers
    stalled = socket.create_connection(("127.0.0.1", PORT), timeout=10)
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Len")
    t0 = time.time()
    out = raw_exchange(req, pieces=16, delay=0.03, timeout=20)
    assert out.startswith(b"HTTP/1.1 200"), out[:200]
    st, _, _ = request("GET", "/health", headers={})
    assert st == 200
    assert time.time() - t0 < 15
    stalled.close()


def t_concurrent():
    base = rss_kb(PID)
    rss = []
    for rnd in range(3):
        results = [None] * 20

        def one(i):
            try:
                st, h, body = request("POST", "/v1/chat/completions",
                                      {"messages": [{"role": "user", "content": "client %d" % i}], "max_tokens": 24,
                                       "stream": i % 2 == 1}, timeout=60)
                if st == 503:
                    assert h.get("Retry-After"), h
                elif st == 200 and i % 2 == 1:
                    assert body.rstrip().endswith(b"data: [DONE]"), body[-100:]
                results[i] = st
            except Exception as e:  # noqa: BLE001
                results[i] = repr(e)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert time.time() - t0 < 90
        assert all(r in (200, 503) for r in results), results
        assert results.count(200) >= 1, results
        rss.append(rss_kb(PID))
    t_health()
    # memory bounded: three rounds of 20 clients do not keep growing
    assert rss[2] - rss[0] < 16 * 1024, (base, rss)
    print("  rss kB: before %d, after rounds %s; 200s/503s last round: %d/%d" %
          (base, rss, results.count(200), results.count(503)), flush=True)


def metric(port, name):
    st, _, body = request("GET", "/metrics", headers={}, port=port)
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError("no metric " + name)


def t_timeout():
    t0 = time.time()
    st, _, body = request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1000, "temperature": 0, "ignore_eos": True},
                          headers={}, port=SLOW_PORT)
    dt = time.time() - t0
    r = json.loads(body)
    assert st == 200 and r["choices"][0]["finish_reason"] == "length", (st, body[:200])
    assert r["usage"]["completion_tokens"] < 200 and dt < 6, (r["usage"], dt)


def t_disconnect_cancels():
    before = metric(SLOW_PORT, "strata_tokens_predicted_total")
    s = socket.create_connection(("127.0.0.1", SLOW_PORT), timeout=10)
    body = json.dumps({"prompt": "x", "max_tokens": 90, "temperature": 0, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    time.sleep(0.2)
    s.close()
    time.sleep(0.6)  # the worker notices within ~100 ms and is free again
    t0 = time.time()
    st, _, b2 = request("POST", "/v1/completions", {"prompt": "y", "max_tokens": 2}, headers={}, port=SLOW_PORT)
    assert st == 200, st
    after = metric(SLOW_PORT, "strata_tokens_predicted_total")
    # 90 tokens at 20 ms would take 1.8 s; the cancelled one stopped early
    assert after - before < 60, (before, after)
    assert time.time() - t0 < 1.0


def t_queue_full():
    res = []

    def one():
        try:
            st, h, _ = request("POST", "/v1/completions", {"prompt": "q", "max_tokens": 30, "ignore_eos": True}, headers={}, port=SLOW_PORT)
            res.append((st, h.get("Retry-After")))
        except Exception as e:  # noqa: BLE001
            res.append((repr(e), None))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(30)
    sts = sorted(r[0] for r in res)
    assert sts.count(503) >= 1 and sts.count(200) >= 1 and all(s in (200, 503) for s in sts), res
    assert all(r[1] for r in res if r[0] == 503), res


def t_sigterm_finishes_in_flight():
    out = {}

    def one():
        try:
            out["r"] = request("POST", "/v1/completions", {"prompt": "z", "max_tokens": 40, "stream": True, "ignore_eos": True},
                               headers={}, port=SLOW_PORT, timeout=30)
        except Exception as e:  # noqa: BLE001
            out["r"] = repr(e)

    t = threading.Thread(target=one)
    t.start()
    for _ in range(100):  # until it is generating (bounded: 5 s)
        time.sleep(0.05)
        if metric(SLOW_PORT, "strata_requests_processing") >= 1:
            break
    os.kill(int(SLOW_PID), 15)
    t.join(30)
    assert isinstance(out.get("r"), tuple), out
    st, _, body = out["r"]
    assert st == 200 and body.rstrip().endswith(b"data: [DONE]"), out["r"]
    n = body.count(b'"text"')
    assert n >= 30, (n, body[-400:])   # the in-flight request ran to its end (40 tokens)
    # the server exits 0 (checked by the shell after wait); new connections are refused
    time.sleep(0.5)
    try:
        socket.create_connection(("127.0.0.1", SLOW_PORT), timeout=2).close()
        refused = False
    except OSError:
        refused = True
    assert refused


check("health", t_health)
check("greedy completions equal strata run (fresh and cached prompts)", t_greedy_equals_run)
check("greedy chat equals strata chat", t_chat_equals_strata_chat)
check("errors: 400 malformed JSON, 401, 404, 405, metrics", t_errors)
check("413 oversized body (Content-Length and chunked)", t_413)
check("malformed HTTP", t_malformed_http)
check("slow client and a stalled one", t_slow_client)
check("20 concurrent clients x3: each 200 or 503, memory bounded", t_concurrent)
check("per-request timeout", t_timeout)
check("client disconnect cancels generation", t_disconnect_cancels)
check("queue full: 503 with Retry-After", t_queue_full)
check("SIGTERM: in-flight request finishes, then exit", t_sigterm_finishes_in_flight)
print("PY_DONE failed=%d" % failed)
