#!/usr/bin/env python3
"""llama_ref: llama-perplexity's arithmetic re-done in numpy, independently
of strata's C code, from a model's raw logits (build/tests/dump_logits), for
tests/cli/test_perplexity.sh and tests/cli/test_kld.sh.

Written from llama.cpp's tools/perplexity/perplexity.cpp (perplexity(),
kl_divergence(), the three log_softmax variants) and FORMATS.md section 6.
Where llama.cpp computes in float this script computes in float32, step by
step (every intermediate rounded, as C's float arithmetic does), and expf is
glibc's own (ctypes), so figures and base-file bytes are reproduced exactly,
not just closely. Sums run in position order (llama.cpp's worker threads
add in a varying order; the difference is far below the printed digits).

    llama_ref.py ppl   --strata S --dump D --model M --text T -c N [--chunks K] [--base OUT]
        prints llama-perplexity's "[1]p,[2]p,...," line and "Final estimate"
        line; with --base writes the base file by the format's rules.
    llama_ref.py kld   --dump D --model M --base FILE [--chunks K]
        prints the chunk table and statistics blocks of --kl-divergence.
    llama_ref.py tfkld REF.dump CAND.dump
        the figures `strata kld` prints, from the dumps' logits (float64).
    llama_ref.py tfcheck --dump D --model M DUMP
        checks a tfdump file against the format (docs/EVAL.md) and its logits
        against dump_logits on the same tokens, bit for bit; prints a summary.
    llama_ref.py set-add-bos IN.gguf OUT.gguf
        a copy of a GGUF whose tokenizer.ggml.add_bos_token is true.

Token ids come from `strata tokenize --ids --no-parse-special --no-escape`
(llama-perplexity tokenizes with BOS, parse_special off, escapes off); the
logits of a chunk from dump_logits on the chunk's ids with the first
replaced by BOS when the model adds one.
"""

import argparse
import ctypes
import ctypes.util
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
from gguf_ref import GGUFFile  # noqa: E402

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.expf.restype = ctypes.c_float
_libm.expf.argtypes = [ctypes.c_float]
f32 = np.float32


def expf(x):
    """glibc's expf of a float32 value, as a float32."""
    return f32(_libm.expf(float(x)))


def expf_vec(a):
    return np.array([_libm.expf(float(x)) for x in a], dtype=np.float32)


def seq_sum(a):
    """Sum in index order in float64 (C's `double s; s += x` loop)."""
    if len(a) == 0:
        return 0.0
    return float(np.add.accumulate(np.asarray(a, dtype=np.float64))[-1])


# ==== inputs ====

def model_bos(model):
    md = GGUFFile(model).metadata
    return bool(md.get("tokenizer.ggml.add_bos_token", False)), int(md.get("tokenizer.ggml.bos_token_id", -1))


def tokenize(strata, model, text_path):
    out = subprocess.run([strata, "tokenize", "-m", model, "-f", text_path, "--ids", "--no-parse-special",
                          "--no-escape"], check=True, capture_output=True, text=True).stdout.strip()
    return [int(x) for x in out.strip("[]").split(",") if x.strip()]


def dump_logits(dump, model, ids):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "l.bin")
        subprocess.run([dump, model, out, ",".join(str(i) for i in ids)], check=True, capture_output=True)
        with open(out, "rb") as f:
            n, v = struct.unpack("<ii", f.read(8))
            return np.frombuffer(f.read(), dtype="<f4").reshape(n, v).copy()


def chunk_logits(dump, model, tokens, c, n_ctx, add_bos, bos):
    ids = list(tokens[c * n_ctx:(c + 1) * n_ctx])
    if add_bos:
        ids[0] = bos
    # rows first .. n_ctx-2 are scored; the last token's row is not needed
    return dump_logits(dump, model, ids[:n_ctx - 1])


# ==== llama.cpp's per-token arithmetic ====

def nll_plain(l, tok):
    """perplexity() without a base file: double log-softmax of the token."""
    mx = l.max()
    s = seq_sum(expf_vec(l - mx))
    return -(float(f32(l[tok] - mx)) - math.log(s))


def nearest_int(x):
    v = (x.astype(np.float32) + f32(12582912.0)).astype(np.float32)
    return (v.view(np.int32) & 0x007fffff) - 0x00400000


def encode_record(l, tok, nv):
    """One base-file record (nv uint16) and the float nll llama.cpp returns."""
    mx, mn = l.max(), l.min()
    lo = f32(mx - f32(16))
    mn = mn if mn > lo else lo
    s = seq_sum(expf_vec(l - mx))
    lse = f32(math.log(s))
    min_log_prob = f32(f32(mn - mx) - lse)
    scale = f32(f32(mx - mn) / f32(65535.0))
    rec = np.zeros(nv, dtype=np.uint16)
    rec[0:2] = np.frombuffer(struct.pack("<f", scale), dtype=np.uint16)
    rec[2:4] = np.frombuffer(struct.pack("<f", min_log_prob), dtype=np.uint16)
    if scale != 0:
        inv = f32(f32(1.0) / scale)
        q = nearest_int((inv * (l - mn).astype(np.float32)).astype(np.float32))
        q = np.where(l > mn, q, 0)
        rec[4:4 + len(l)] = (q & 0xffff).astype(np.uint16)
    nll = f32(f32(mx + lse) - l[tok])
    return rec, float(nll)


class Sums:
    def __init__(self):
        self.nll = self.nll2 = self.base = self.base2 = self.nb = 0.0
        self.kld = self.kld2 = self.pd = self.pd2 = self.pd4 = 0.0
        self.same = self.count = 0


def kld_token(l, rec, tok, k):
    imax = int(np.argmax(l))
    mx = l[imax]
    s = seq_sum(expf_vec(l - mx))
    lse = f32(math.log(s))
    scale = np.frombuffer(rec[0:2].tobytes(), dtype="<f4")[0]
    mlp = np.frombuffer(rec[2:4].tobytes(), dtype="<f4")[0]
    q = rec[4:4 + len(l)].astype(np.float32)
    nll = f32(f32(mx + lse) - l[tok])
    k.nll += float(nll)
    k.nll2 += float(f32(nll * nll))
    nll_base = f32(-f32(f32(scale * q[tok]) + mlp))
    k.base += float(nll_base)
    k.base2 += float(f32(nll_base * nll_base))
    k.nb += float(f32(nll * nll_base))
    mx2 = f32(mx + lse)
    plb = ((scale * q).astype(np.float32) + mlp).astype(np.float32)
    imax_base = int(np.argmax(plb))
    keep = plb > f32(-16.0)
    pb = expf_vec(plb[keep])
    d = ((plb[keep] - l[keep]).astype(np.float32) + mx2).astype(np.float32)
    total = seq_sum((pb * d).astype(np.float32))
    k.kld += total
    k.kld2 += total * total
    k.count += 1
    k.same += imax == imax_base
    p_diff = f32(expf(-nll) - expf(-nll_base))
    k.pd += float(p_diff)
    pd2 = float(f32(p_diff * p_diff))
    k.pd2 += pd2
    k.pd4 += pd2 * pd2
    return f32(total), p_diff


# ==== llama.cpp's statistics and printing ====

def mean_unc(s, s2, n):
    if n < 1:
        return 0.0, 0.0
    f = s / n
    df = s2 / n - f * f
    return f, (math.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0)


def cov(a, b, ab, n):
    if n < 10:
        return 0.0
    return (ab / n - (a / n) * (b / n)) / (n - 1)


def csqrt(x):
    return math.sqrt(x) if x >= 0 else float("nan")


def percentile(v, fraction):
    fr = f32(fraction)
    if fr <= 0:
        return v[0]
    if fr >= 1:
        return v[-1]
    p = f32(fr * f32(len(v) - 1))
    ip = int(p)
    p = f32(p - f32(ip))
    return f32(f32(f32(f32(1) - p) * v[ip]) + f32(p * v[min(ip + 1, len(v) - 1)]))


def median(v):
    n = len(v)
    return f32(f32(0.5) * f32(v[n // 2] + v[n // 2 - 1])) if n % 2 == 0 else v[n // 2]


def F(spec, x):
    """printf-style number; NaN as glibc prints the default NaN that sqrt of a
    negative and inf*0 give on x86-64: "-nan"."""
    x = float(x)
    if math.isnan(x):
        w = spec[1:].split(".")[0]
        return "-nan".rjust(int(w) if w else 0)
    return spec % x


def chunk_row(i, k):
    lp, lpu = mean_unc(k.nll, k.nll2, k.count)
    ppl = math.exp(lp)
    lb, lbu = mean_unc(k.base, k.base2, k.count)
    c = cov(k.nll, k.base, k.nb, k.count)
    kl, klu = mean_unc(k.kld, k.kld2, k.count)
    mse, mseu = mean_unc(k.pd2, k.pd4, k.count)
    rms = math.sqrt(mse)
    rms_unc = 0.5 / rms * mseu if rms > 0 else float("nan")
    top = k.same / k.count
    return ("%4d" % i + "    " + F("%9.4f", ppl) + " ± " + F("%9.4f", ppl * lpu) +
            "    " + F("%10.5f", lp - lb) + " ± " + F("%10.5f", csqrt(lpu * lpu + lbu * lbu - 2.0 * c)) +
            "    " + F("%10.5f", kl) + " ± " + F("%10.5f", klu) +
            "    " + F("%6.3f", 100.0 * rms) + " ± " + F("%6.3f", 100.0 * rms_unc) + " %" +
            "    " + F("%6.3f", 100.0 * top) + " ± " + F("%6.3f", 100.0 * math.sqrt(top * (1 - top) / (k.count - 1))) +
            " %")


def summary(k, klds, pdiffs):
    kv = np.sort(np.array(klds, dtype=np.float32))
    pv = np.sort(np.array(pdiffs, dtype=np.float32))
    o = ["====== Perplexity statistics ======"]
    lp, lpu = mean_unc(k.nll, k.nll2, k.count)
    ppl, ppl_unc = math.exp(lp), math.exp(lp) * lpu
    o.append("Mean PPL(Q)                   : " + F("%10.6f", ppl) + " ± " + F("%10.6f", ppl_unc))
    lb, lbu = mean_unc(k.base, k.base2, k.count)
    pb, pb_unc = math.exp(lb), math.exp(lb) * lbu
    o.append("Mean PPL(base)                : " + F("%10.6f", pb) + " ± " + F("%10.6f", pb_unc))
    c = cov(k.nll, k.base, k.nb, k.count)
    cor = 100.0 * c / (lpu * lbu) if lpu * lbu != 0 else float("nan")
    o.append("Cor(ln(PPL(Q)), ln(PPL(base))): " + F("%6.2f", cor) + "%")
    r, ru = lp - lb, csqrt(lpu * lpu + lbu * lbu - 2.0 * c)
    o.append("Mean ln(PPL(Q)/PPL(base))     : " + F("%10.6f", r) + " ± " + F("%10.6f", ru))
    o.append("Mean PPL(Q)/PPL(base)         : " + F("%10.6f", math.exp(r)) + " ± " + F("%10.6f", math.exp(r) * ru))
    o.append("Mean PPL(Q)-PPL(base)         : " + F("%10.6f", ppl - pb) + " ± " +
             F("%10.6f", csqrt(ppl_unc * ppl_unc + pb_unc * pb_unc - 2.0 * ppl * pb * c)))
    o.append("")
    o.append("====== KL divergence statistics ======")
    kl, klu = mean_unc(k.kld, k.kld2, k.count)
    o.append("Mean    KLD: " + F("%10.6f", kl) + " ± " + F("%10.6f", klu))
    o.append("Maximum KLD: " + F("%10.6f", kv[-1]))
    for name, fr in (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900)):
        o.append(name + "   KLD: " + F("%10.6f", percentile(kv, fr)))
    o.append("Median  KLD: " + F("%10.6f", median(kv)))
    for name, fr in (("10.0%", 0.100), (" 5.0%", 0.050), (" 1.0%", 0.010), (" 0.1%", 0.001)):
        o.append(name + "   KLD: " + F("%10.6f", percentile(kv, fr)))
    o.append("Minimum KLD: " + F("%10.6f", kv[0]))
    o.append("")
    o.append("====== Token probability statistics ======")
    pd, pdu = mean_unc(k.pd, k.pd2, k.count)
    o.append("Mean    Δp: " + F("%6.3f", 100.0 * pd) + " ± " + F("%5.3f", 100.0 * pdu) + " %")
    o.append("Maximum Δp: " + F("%6.3f", 100.0 * float(pv[-1])) + "%")
    for name, fr in (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900), ("75.0%", 0.750)):
        o.append(name + "   Δp: " + F("%6.3f", 100.0 * float(percentile(pv, fr))) + "%")
    o.append("Median  Δp: " + F("%6.3f", 100.0 * float(median(pv))) + "%")
    for name, fr in (("25.0%", 0.250), ("10.0%", 0.100), (" 5.0%", 0.050), (" 1.0%", 0.010), (" 0.1%", 0.001)):
        o.append(name + "   Δp: " + F("%6.3f", 100.0 * float(percentile(pv, fr))) + "%")
    o.append("Minimum Δp: " + F("%6.3f", 100.0 * float(pv[0])) + "%")
    mse, mseu = mean_unc(k.pd2, k.pd4, k.count)
    rms = math.sqrt(mse)
    o.append("RMS Δp    : " + F("%6.3f", 100.0 * rms) + " ± " +
             F("%5.3f", 100.0 * (0.5 / rms * mseu if rms > 0 else float("nan"))) + " %")
    same = k.same / k.count
    o.append("Same top p: " + F("%6.3f", 100.0 * same) + " ± " +
             F("%5.3f", 100.0 * math.sqrt(same * (1.0 - same) / (k.count - 1))) + " %")
    return o


# ==== commands ====

def cmd_ppl(a):
    add_bos, bos = model_bos(a.model)
    tokens = tokenize(a.strata, a.model, a.text)
    n_ctx = a.c
    if len(tokens) < 2 * n_ctx:
        sys.exit("llama_ref: %d tokens, need %d" % (len(tokens), 2 * n_ctx))
    n_chunk = len(tokens) // n_ctx
    if a.chunks > 0:
        n_chunk = min(n_chunk, a.chunks)
    first = n_ctx // 2
    V = None
    nll = nll2 = 0.0
    count = 0
    line = []
    recs = []
    for c in range(n_chunk):
        L = chunk_logits(a.dump, a.model, tokens, c, n_ctx, add_bos, bos)
        V = L.shape[1]
        nv = 2 * ((V + 1) // 2) + 4
        for j in range(first, n_ctx - 1):
            tok = tokens[c * n_ctx + j + 1]
            if a.base:
                rec, v = encode_record(L[j], tok, nv)
                recs.append(rec)
            else:
                v = nll_plain(L[j], tok)
            nll += v
            nll2 += v * v
            count += 1
        line.append("[%d]%.4f," % (c + 1, math.exp(nll / count)))
    print("".join(line))
    nll2 /= count
    nll /= count
    ppl = math.exp(nll)
    nll2 -= nll * nll
    if nll2 > 0:
        print("Final estimate: PPL = %.4f +/- %.5f" % (ppl, math.sqrt(nll2 / (count - 1)) * ppl))
    if a.base:
        with open(a.base, "wb") as f:
            f.write(b"_logits_")
            f.write(struct.pack("<iii", n_ctx, V, n_chunk))
            f.write(np.array(tokens[:n_chunk * n_ctx], dtype="<i4").tobytes())
            for r in recs:
                f.write(r.astype("<u2").tobytes())


def read_base(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"_logits_", "no magic"
    n_ctx, V, n_chunk = struct.unpack("<Iii", data[8:20])
    off = 20
    tokens = np.frombuffer(data[off:off + 4 * n_ctx * n_chunk], dtype="<i4")
    off += 4 * n_ctx * n_chunk
    nv = 2 * ((V + 1) // 2) + 4
    ns = n_ctx - 1 - n_ctx // 2
    recs = np.frombuffer(data[off:], dtype="<u2")
    assert len(recs) == n_chunk * ns * nv, "size"
    return n_ctx, V, n_chunk, tokens, recs.reshape(n_chunk, ns, nv)


def cmd_kld(a):
    add_bos, bos = model_bos(a.model)
    n_ctx, V, n_chunk, tokens, recs = read_base(a.base)
    if a.chunks > 0:
        n_chunk = min(n_chunk, a.chunks)
    first = n_ctx // 2
    k = Sums()
    klds, pdiffs = [], []
    out = ["", "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS"
               "            Same top p"]
    for c in range(n_chunk):
        L = chunk_logits(a.dump, a.model, tokens, c, n_ctx, add_bos, bos)
        for r, j in enumerate(range(first, n_ctx - 1)):
            kv, pd = kld_token(L[j], recs[c, r], int(tokens[c * n_ctx + j + 1]), k)
            klds.append(kv)
            pdiffs.append(pd)
        out.append(chunk_row(c + 1, k))
    out.append("")
    if k.count >= 100:
        out += summary(k, klds, pdiffs)
    print("\n".join(out))


def read_dump(path):
    with open(path, "rb") as f:
        b = f.read()
    assert b[:8] == b"STRATATF"
    version, header, fp = struct.unpack("<IIQ", b[8:24])
    V, n_tok, n_prompt, n_eval, rn, dn, vb = struct.unpack("<iiiiIII", b[24:52])
    off = 52 + rn + dn
    toks = np.frombuffer(b[off:off + 4 * n_tok], dtype="<i4")
    off += 4 * n_tok
    pos = np.frombuffer(b[off:off + 4 * n_eval], dtype="<i4")
    off += 4 * n_eval
    pieces = []
    end = off + vb
    while off < end:
        (n,) = struct.unpack("<I", b[off:off + 4])
        pieces.append(b[off + 4:off + 4 + n])
        off += 4 + n
    assert off == header and len(pieces) == V
    logits = np.frombuffer(b[header:], dtype="<f4").reshape(n_eval, V)
    return dict(version=version, fp=fp, V=V, toks=toks, n_prompt=n_prompt, pos=pos, pieces=pieces,
                logits=logits, routing=b[52:52 + rn].decode())


def cmd_tfkld(a):
    r, c = read_dump(a.ref), read_dump(a.cand)
    lr = r["logits"].astype(np.float64)
    lc = c["logits"].astype(np.float64)
    lr = lr - (lr.max(1, keepdims=True) + np.log(np.exp(lr - lr.max(1, keepdims=True)).sum(1, keepdims=True)))
    lc = lc - (lc.max(1, keepdims=True) + np.log(np.exp(lc - lc.max(1, keepdims=True)).sum(1, keepdims=True)))
    kl = (np.exp(lr) * (lr - lc)).sum(1)
    tg = r["toks"][r["pos"]]
    idx = np.arange(len(tg))
    ppl_r = math.exp(-lr[idx, tg].mean())
    ppl_c = math.exp(-lc[idx, tg].mean())
    s = np.sort(kl)
    n = len(s)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])

    def q(fr):
        p = fr * (n - 1)
        ip = int(p)
        return s[-1] if ip + 1 >= n else s[ip] + (p - ip) * (s[ip + 1] - s[ip])
    agree = int((lr.argmax(1) == lc.argmax(1)).sum())
    tot = kl.sum()
    print("ppl_ref %.4f" % ppl_r)
    print("ppl_cand %.4f" % ppl_c)
    print("mean %.6f median %.6f p90 %.6f p99 %.6f max %.6f" % (kl.mean(), med, q(0.9), q(0.99), s[-1]))
    print("top1 %d/%d" % (agree, n))
    if tot > 0:
        print("share4 %.2f%% share8 %.2f%%" % (100 * s[::-1][:4].sum() / tot, 100 * s[::-1][:8].sum() / tot))
    for i in range(n):
        print("pos %d %d %d %d %.6f" % (r["pos"][i], tg[i], lr[i].argmax(), lc[i].argmax(), kl[i]))


def cmd_tfcheck(a):
    d = read_dump(a.file)
    with open(a.file, "rb") as f:
        b = f.read()
    V, n_tok, n_prompt, n_eval = d["V"], len(d["toks"]), d["n_prompt"], len(d["pos"])
    assert d["version"] == 1, "version"
    assert list(d["pos"]) == list(range(n_prompt, n_tok)), "positions are not n_prompt .. n_tokens-1"
    assert len(b) == struct.unpack("<I", b[12:16])[0] + 4 * n_eval * V, "file size"
    L = dump_logits(a.dump, a.model, list(d["toks"][:n_tok - 1]))
    want = L[n_prompt - 1:n_tok - 1]
    same = want.tobytes() == d["logits"].tobytes()
    print("n_vocab %d n_prompt %d n_eval %d routing %s fingerprint %016x logits %s" %
          (V, n_prompt, n_eval, d["routing"], d["fp"], "identical" if same else "DIFFER"))
    sys.exit(0 if same else 1)


def cmd_set_add_bos(a):
    data = bytearray(open(a.inp, "rb").read())
    key = b"tokenizer.ggml.add_bos_token"
    i = data.find(struct.pack("<Q", len(key)) + key)
    assert i >= 0, "no add_bos_token key"
    j = i + 8 + len(key)
    assert struct.unpack("<i", data[j:j + 4])[0] == 7, "add_bos_token is not a bool"
    data[j + 4] = 1
    open(a.out, "wb").write(bytes(data))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("ppl")
    p.add_argument("--strata", required=True)
    p.add_argument("--dump", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--text", required=True)
    p.add_argument("-c", type=int, required=True)
    p.add_argument("--chunks", type=int, default=-1)
    p.add_argument("--base")
    p = sub.add_parser("kld")
    p.add_argument("--dump", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--base", required=True)
    p.add_argument("--chunks", type=int, default=-1)
    p = sub.add_parser("tfkld")
    p.add_argument("ref")
    p.add_argument("cand")
    p = sub.add_parser("tfcheck")
    p.add_argument("--dump", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("file")
    p = sub.add_parser("set-add-bos")
    p.add_argument("inp")
    p.add_argument("out")
    a = ap.parse_args()
    {"ppl": cmd_ppl, "kld": cmd_kld, "tfkld": cmd_tfkld, "tfcheck": cmd_tfcheck, "set-add-bos": cmd_set_add_bos}[a.cmd](a)


if __name__ == "__main__":
    main()
