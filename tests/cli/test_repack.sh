#!/bin/sh
# `strata repack` and `strata profile` end to end, on two generated models:
# the tiny preset (f32 experts, 8 of them) and a q4_K one with 16 experts.
#
# repack: the summary line, the default name MODEL.experts and -o, no
# temporary left behind, same bytes whatever the path, and a Python checker
# (written below from the format in src/expert/sidecar.h, reading the GGUF
# with tests/ref/gguf_ref.py, sharing no code with the C side) that checks
# every header field, the meta hash and every blob against the GGUF slices.
# Errors: usage -> exit 2, missing/non-MoE model -> exit 1, nothing written.
#
# profile: the file is checked by a Python checker against profile.h's
# format; the totals must be exact (lookups = tokens x n_layer x k per
# phase), the lines every layer-expert once, ranked by the documented score;
# the same run twice, and with 1 and 2 threads, gives the same file.
# Skipped (counted as passes, with a note) while the engine lacks the
# routing observer.
# Env: STRATA, PYTHON. Prints "repack_cli: N passed, N failed".
STRATA=${STRATA:-build/strata}
PYTHON=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*" >&2; }

# expect_rc NAME RC CMD...: CMD exits with RC; stdout+stderr in $tmp/NAME.out
expect_rc() {
    n=$1; want=$2; shift 2
    "$@" >"$tmp/$n.out" 2>&1
    rc=$?
    if [ "$rc" -eq "$want" ]; then ok; else bad "$n: exit $rc, expected $want: $(head -c 400 "$tmp/$n.out")"; fi
}
contains() {
    if grep -qF -- "$2" "$tmp/$1.out"; then ok; else bad "$1: output lacks '$2': $(head -c 400 "$tmp/$1.out")"; fi
}

cat >"$tmp/check_sidecar.py" <<'EOF'
"""check_sidecar.py MODEL SIDECAR: verify a strata expert sidecar (format v1,
src/expert/sidecar.h) against its GGUF."""
import struct, sys
sys.path.insert(0, "tests/ref")
from gguf_ref import GGUFFile

def fnv(data, h=0xcbf29ce484222325):
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h

def main(model, path):
    g = GGUFFile(model)
    s = open(path, "rb").read()
    errs = []
    def need(c, msg):
        if not c: errs.append(msg)
    (magic, ver, align, gsize, gfp, nl, nx, ioff, ibytes, doff, fbytes, mhash, shash) = \
        struct.unpack_from("<8sIIQQIIQQQQQQ", s, 0)
    L = g.metadata["qwen3moe.block_count"]; X = g.metadata["qwen3moe.expert_count"]
    need(magic == b"STRATAXP" and ver == 1 and align == 4096, "magic/version/align")
    import os
    need(gsize == os.path.getsize(model), "gguf size")
    need(nl == L and nx == X, "shape %d x %d vs %d x %d" % (nl, nx, L, X))
    need(ioff == 128 and ibytes == L * 48 + L * X * 40, "index geometry")
    need(doff % 4096 == 0 and doff >= ioff + ibytes, "data_off")
    need(fbytes == len(s) and fbytes % 4096 == 0, "file size")
    need(s[88:128] == bytes(40), "reserved")
    meta = bytearray(s[:ioff + ibytes]); meta[72:80] = bytes(8)
    need(fnv(meta) == mhash, "meta hash")
    parts = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
    # data sample hash: first and last min(4096, n) bytes of every expert tensor
    h = 0xcbf29ce484222325
    for l in range(L):
        for p in parts:
            raw = bytes(g.raw("blk.%d.%s.weight" % (l, p)))
            n = min(4096, len(raw))
            h = fnv(raw[:n], h); h = fnv(raw[len(raw) - n:], h)
    need(h == shash, "sample hash")
    off_expect = doff
    blobs = 0
    for l in range(L):
        raws = [bytes(g.raw("blk.%d.%s.weight" % (l, p))) for p in parts]
        slab = [len(r) // X for r in raws]
        for w in range(3):
            t, z, pb = struct.unpack_from("<IIQ", s, 128 + l * 48 + 16 * w)
            ti = g.tensors["blk.%d.%s.weight" % (l, parts[w])]
            need(t == ti.type and z == 0 and pb == slab[w], "layer %d part %d table" % (l, w))
        po = [0, 0, 0]
        for w in range(1, 3):
            po[w] = (po[w - 1] + slab[w - 1] + 63) // 64 * 64
        bb = po[2] + slab[2]
        for x in range(X):
            e = 128 + L * 48 + (l * X + x) * 40
            boff, bbytes, p0, p1, p2 = struct.unpack_from("<QQQQQ", s, e)
            need(boff == off_expect and bbytes == bb and [p0, p1, p2] == po, "entry %d/%d" % (l, x))
            blob = s[boff:boff + (bb + 4095) // 4096 * 4096]
            good = all(blob[po[w]:po[w] + slab[w]] == raws[w][x * slab[w]:(x + 1) * slab[w]] for w in range(3))
            pads = blob[slab[0]:po[1]] + blob[po[1] + slab[1]:po[2]] + blob[bb:]
            need(good, "blob %d/%d differs from the GGUF" % (l, x))
            need(pads == bytes(len(pads)), "blob %d/%d padding not zero" % (l, x))
            blobs += good
            off_expect = boff + len(blob)
    need(off_expect == fbytes, "blobs do not end the file")
    for m in errs[:10]: print("sidecar:", m)
    print("checked %d blobs" % blobs)
    return 1 if errs else 0

sys.exit(main(sys.argv[1], sys.argv[2]))
EOF

cat >"$tmp/check_profile.py" <<'EOF'
"""check_profile.py MODEL PROFILE: verify a strata profile (v1, src/expert/profile.h)."""
import re, sys
sys.path.insert(0, "tests/ref")
from gguf_ref import GGUFFile

def main(model, path):
    g = GGUFFile(model)
    L = g.metadata["qwen3moe.block_count"]; X = g.metadata["qwen3moe.expert_count"]
    K = g.metadata["qwen3moe.expert_used_count"]
    lines = [ln for ln in open(path).read().split("\n")[:-1] if not ln.startswith("#")]
    m = re.fullmatch(r"strata-profile 1 fp=([0-9a-f]{16}) gguf_size=(\d+) n_layer=(\d+) n_expert=(\d+) k=(\d+) "
                     r"prompt_tokens=(\d+) decode_tokens=(\d+) prompt_lookups=(\d+) decode_lookups=(\d+)", lines[0])
    if not m: print("bad header:", lines[0]); return 1
    import os
    _, size, nl, nx, k, pt, dt, pl, dl = [int(v) if i else v for i, v in enumerate(m.groups())]
    errs = []
    if (size, nl, nx, k) != (os.path.getsize(model), L, X, K): errs.append("model facts")
    if pl != pt * L * K: errs.append("prompt lookups %d != %d tokens x %d x %d" % (pl, pt, L, K))
    if dl != dt * L * K: errs.append("decode lookups %d != %d tokens x %d x %d" % (dl, dt, L, K))
    rows = [tuple(int(v) for v in ln.split(" ")) for ln in lines[1:]]
    if [r[0] for r in rows] != list(range(L * X)): errs.append("ranks")
    if sorted((r[1], r[2]) for r in rows) != [(l, x) for l in range(L) for x in range(X)]: errs.append("coverage")
    if sum(r[3] for r in rows) != pl or sum(r[4] for r in rows) != dl: errs.append("sums")
    score = lambda r: (r[3] / pl if pl else 0.0) + (r[4] / dl if dl else 0.0)
    if [(r[1], r[2]) for r in rows] != [(r[1], r[2]) for r in sorted(rows, key=lambda r: (-score(r), r[1], r[2]))]:
        errs.append("rank order")
    for e in errs: print("profile:", e)
    print("prompt %d tokens, decode %d tokens" % (pt, dt))
    return 1 if errs else 0

sys.exit(main(sys.argv[1], sys.argv[2]))
EOF

# Until the commands are registered in apps/cli/main.c there is nothing to test.
if ! "$STRATA" repack --help >/dev/null 2>&1; then
    echo "note: this strata has no 'repack' command yet; skipped" >&2
    echo "repack_cli: 0 passed, 0 failed"
    exit 0
fi

# ==== models ====
"$STRATA" mkmodel --preset tiny -o "$tmp/t.gguf" -q || { bad "mkmodel tiny"; }
"$STRATA" mkmodel --preset tiny --experts 16 --type-experts q4_K --embd 256 -o "$tmp/q.gguf" -q || bad "mkmodel q4"

# ==== repack ====
expect_rc repack_t 0 "$STRATA" repack "$tmp/t.gguf"
contains repack_t "repack: 16 blobs (2 layers x 8 experts)"
contains repack_t "-> '$tmp/t.gguf.experts'"
contains repack_t "GB/s)"
[ -f "$tmp/t.gguf.experts" ] && ok || bad "default sidecar name"
[ ! -e "$tmp/t.gguf.experts.tmp" ] && ok || bad "temporary left behind"
expect_rc check_t 0 "$PYTHON" "$tmp/check_sidecar.py" "$tmp/t.gguf" "$tmp/t.gguf.experts"
contains check_t "checked 16 blobs"

expect_rc repack_q 0 "$STRATA" repack "$tmp/q.gguf" -o "$tmp/q.side"
contains repack_q "repack: 32 blobs (2 layers x 16 experts)"
expect_rc check_q 0 "$PYTHON" "$tmp/check_sidecar.py" "$tmp/q.gguf" "$tmp/q.side"
contains check_q "checked 32 blobs"
expect_rc repack_q2 0 "$STRATA" repack -q "$tmp/q.gguf"
[ ! -s "$tmp/repack_q2.out" ] && ok || bad "-q is not quiet: $(cat "$tmp/repack_q2.out")"
cmp -s "$tmp/q.side" "$tmp/q.gguf.experts" && ok || bad "sidecar bytes depend on the output path"
# rewriting over an existing sidecar is fine (rename replaces it)
expect_rc repack_again 0 "$STRATA" repack -q "$tmp/q.gguf"
cmp -s "$tmp/q.side" "$tmp/q.gguf.experts" && ok || bad "rewritten sidecar differs"

# ==== repack errors ====
expect_rc repack_noarg 2 "$STRATA" repack
expect_rc repack_flag 2 "$STRATA" repack --bogus "$tmp/t.gguf"
expect_rc repack_two 2 "$STRATA" repack "$tmp/t.gguf" "$tmp/q.gguf"
expect_rc repack_help 0 "$STRATA" repack --help
contains repack_help "usage: strata repack MODEL"
expect_rc repack_missing 1 "$STRATA" repack "$tmp/none.gguf"
contains repack_missing "strata repack:"
[ ! -e "$tmp/none.gguf.experts" ] && [ ! -e "$tmp/none.gguf.experts.tmp" ] && ok || bad "files left for a missing model"
head -c 5000 /dev/urandom >"$tmp/junk.gguf"
expect_rc repack_junk 1 "$STRATA" repack "$tmp/junk.gguf"
[ ! -e "$tmp/junk.gguf.experts" ] && ok || bad "sidecar written for junk"
expect_rc repack_baddir 1 "$STRATA" repack "$tmp/t.gguf" -o "$tmp/no/such/dir/x"

# ==== profile ====
head -c 2500 data/corpus.txt >"$tmp/corpus.txt"
"$STRATA" profile -m "$tmp/t.gguf" -f "$tmp/corpus.txt" -o "$tmp/t.prof" -c 48 -n 4 >"$tmp/prof1.out" 2>&1
rc=$?
if grep -qF "no routing observer" "$tmp/prof1.out"; then
    echo "note: the engine has no routing observer yet; profile checks skipped" >&2
    ok
else
    [ "$rc" -eq 0 ] && ok || bad "profile: exit $rc: $(head -c 400 "$tmp/prof1.out")"
    contains prof1 "prompt +"
    expect_rc prof_check 0 "$PYTHON" "$tmp/check_profile.py" "$tmp/t.gguf" "$tmp/t.prof"
    "$STRATA" profile -m "$tmp/t.gguf" -f "$tmp/corpus.txt" -o "$tmp/t2.prof" -c 48 -n 4 -t 1 -q >/dev/null 2>&1
    cmp -s "$tmp/t.prof" "$tmp/t2.prof" && ok || bad "profile differs between runs / thread counts"
    expect_rc prof_q 0 "$STRATA" profile -m "$tmp/q.gguf" -f "$tmp/corpus.txt" -o "$tmp/q.prof" -c 64 -n 0 --max-prompts 3
    expect_rc prof_qcheck 0 "$PYTHON" "$tmp/check_profile.py" "$tmp/q.gguf" "$tmp/q.prof"
    contains prof_qcheck "decode 0 tokens"
    # streaming the experts while profiling counts the same routing
    expect_rc prof_stream 0 "$STRATA" profile -m "$tmp/t.gguf" -f "$tmp/corpus.txt" -o "$tmp/t3.prof" -c 48 -n 4 \
        --arena 0 -q
    cmp -s "$tmp/t.prof" "$tmp/t3.prof" && ok || bad "profile differs when streaming"
    [ ! -e "$tmp/q.prof.tmp" ] && ok || bad "profile temporary left behind"
fi
expect_rc prof_noargs 2 "$STRATA" profile -m "$tmp/t.gguf"
expect_rc prof_badn 2 "$STRATA" profile -m "$tmp/t.gguf" -f "$tmp/corpus.txt" -o "$tmp/x.prof" -n -1
expect_rc prof_flag 2 "$STRATA" profile --bogus
expect_rc prof_arena 2 "$STRATA" profile -m "$tmp/t.gguf" -f "$tmp/corpus.txt" -o "$tmp/x.prof" --arena lots
expect_rc prof_nocorpus 1 "$STRATA" profile -m "$tmp/t.gguf" -f "$tmp/none.txt" -o "$tmp/x.prof"
[ ! -e "$tmp/x.prof" ] && ok || bad "profile written after an error"

echo "repack_cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
