"""test_dequant: strata's quant kernels against the numpy oracle.

Run by tests/run.sh as `$PYTHON tests/ref/test_dequant.py` (env BUILD).
Prints `dequant: N passed, N failed` and exits non-zero on failure.

1. Oracle self-check: dequant_ref's vectorised decoders agree with a literal,
   loop-by-loop transliteration of ggml's dequantize_row_* on random blocks.
2. Dequantization: random-but-valid blocks of every type (random quant bytes,
   sane fp16 scales, plus edge cases: zero, subnormal and large scales) go
   through `quant_tool dequant` and dequant_ref; the float32 results must be
   bit-identical. Dequantization is exact arithmetic in both (see
   dequant_ref.py): the only exception would be NaN/Inf inputs, which these
   blocks avoid on purpose (a NaN's payload after conversion is not specified).
3. Quantization: strata's quantizers on Gaussian data and edge-case blocks,
   dequantized by the ORACLE (not by strata): relative RMS and max error
   bounds per type; for the types whose ggml reference quantizer is ported in
   quant_ref.py (F16 BF16 Q8_0 Q8_1 Q8_K Q4_0 Q4_1 Q5_0 Q5_1) the bytes must
   equal ggml's exactly.
3b. Activation quantization: `quant_tool actquant` (ggml-cpu's from_float:
   Q8_0/Q8_1 with x * (127/amax) and ties to even on x86, Q8_K, F16, BF16)
   must equal quant_ref's ports byte for byte, exact ties included.
4. Dot numerics: `quant_tool matmul` (scalar and best ISA) against the float64
   emulation of ggml-cpu (activations quantized to the dot type first):
   |diff| <= 2e-6 * sum|w*a| (float32 accumulation), and closer to the
   emulation than to the plain float64 dot for quantized dot types.
"""

import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_ref import GGML_TYPES, type_name  # noqa: E402
from dequant_ref import dequantize, block_mins  # noqa: E402
import quant_ref  # noqa: E402
from quant_ref import random_blocks, QUANTIZERS, act_quant_dequant, act_dot_correction  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
TOOL = os.path.join(BUILD, "tests", "quant_tool")
TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
         "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"]
EXTRA_DEQUANT = ["q8_1", "q8_K"]     # activation formats: dequant exists too
TID = {type_name(t): t for t in GGML_TYPES}

# Quantize->dequantize bounds on N(0,1) data: relative RMS error, and max
# |error| as a fraction of the block's absolute max (32-element blocks, or the
# 256-element super-block). RMS: plain round-to-nearest on the type's grid
# gives step/sqrt(12) (step = amax/127, amax/8, range/15, ...), about 60-70 %
# of these bounds; the K-quant figures allow for ggml's scale search doing no
# worse than a min/max grid. Max: half a step, except that Q4_0/Q5_0 put the
# signed max at -8/-16 of an asymmetric grid (-8..7, -16..15), so an element of
# the opposite sign and equal magnitude clamps a full step away: amax/8 and
# amax/16 (ggml does the same).
QUANT_BOUNDS = {  # type: (rel_rms, max_err / block amax)
    "f32": (0.0, 0.0), "f16": (3e-4, 5e-4), "bf16": (2.5e-3, 4e-3),
    "q8_0": (0.008, 0.0047), "q8_1": (0.008, 0.0047), "q8_K": (0.008, 0.0047),
    "q4_0": (0.12, 0.126), "q4_1": (0.11, 0.07), "q5_0": (0.06, 0.0626), "q5_1": (0.055, 0.035),
    "q2_K": (0.42, 0.6), "q3_K": (0.22, 0.3), "q4_K": (0.11, 0.12), "q5_K": (0.055, 0.06),
    "q6_K": (0.03, 0.035),
}

passed = failed = 0
report = []


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL %s %s" % (name, detail), file=sys.stderr)


def run_tool(*args):
    r = subprocess.run([TOOL] + [str(a) for a in args], capture_output=True, text=True)
    return r.returncode, r.stderr.strip()


# ---- 1. literal transliterations of ggml's dequantize_row_* (one block) -------

def _h(b, o):
    return float(np.frombuffer(bytes(b[o:o + 2]), "<f2")[0])


def loop_dequant(t, b):
    """One block b (bytes) -> list of floats, following ggml's loops literally."""
    y = []
    if t in ("q4_0", "q4_1"):
        d = _h(b, 0)
        m = _h(b, 2) if t == "q4_1" else 0.0
        qs = b[4:20] if t == "q4_1" else b[2:18]
        y = [0.0] * 32
        for j in range(16):
            lo, hi = qs[j] & 15, qs[j] >> 4
            y[j] = (lo - 8) * d if t == "q4_0" else lo * d + m
            y[j + 16] = (hi - 8) * d if t == "q4_0" else hi * d + m
        return y
    if t in ("q5_0", "q5_1"):
        d = _h(b, 0)
        o = 2 if t == "q5_0" else 4
        m = _h(b, 2) if t == "q5_1" else 0.0
        qh = int.from_bytes(bytes(b[o:o + 4]), "little")
        qs = b[o + 4:o + 20]
        y = [0.0] * 32
        for j in range(16):
            xh0 = ((qh >> j) << 4) & 0x10
            xh1 = (qh >> (j + 12)) & 0x10
            x0, x1 = (qs[j] & 15) | xh0, (qs[j] >> 4) | xh1
            if t == "q5_0":
                y[j], y[j + 16] = (x0 - 16) * d, (x1 - 16) * d
            else:
                y[j], y[j + 16] = x0 * d + m, x1 * d + m
        return y
    if t in ("q8_0", "q8_1"):
        d = _h(b, 0)
        o = 2 if t == "q8_0" else 4
        return [d * v for v in np.frombuffer(bytes(b[o:o + 32]), np.int8)]
    if t == "q8_K":
        d = float(np.frombuffer(bytes(b[0:4]), "<f4")[0])
        return [d * v for v in np.frombuffer(bytes(b[4:260]), np.int8)]
    if t == "q2_K":
        sc, qs, d, mn = b[0:16], b[16:80], _h(b, 80), _h(b, 82)
        is_ = 0
        for n in range(2):
            q = qs[32 * n:32 * n + 32]
            for shift in (0, 2, 4, 6):
                for half in (0, 16):
                    s = sc[is_]
                    is_ += 1
                    dl, ml = d * (s & 15), mn * (s >> 4)
                    y += [dl * ((q[l + half] >> shift) & 3) - ml for l in range(16)]
        return y
    if t == "q3_K":
        hm, qs, raw, d = b[0:32], b[32:96], bytes(b[96:108]), _h(b, 108)
        aux = [int.from_bytes(raw[4 * i:4 * i + 4], "little") for i in range(3)] + [0]
        k1, k2 = 0x03030303, 0x0F0F0F0F
        tmp = aux[2]
        aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4)
        aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4)
        aux[0] = (aux[0] & k2) | (((tmp >> 0) & k1) << 4)
        aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4)
        scales = np.frombuffer(b"".join(a.to_bytes(4, "little") for a in aux), np.int8)
        is_, m = 0, 1
        for n in range(2):
            q = qs[32 * n:32 * n + 32]
            for shift in (0, 2, 4, 6):
                for half in (0, 16):
                    dl = d * (int(scales[is_]) - 32)
                    is_ += 1
                    y += [dl * (((q[l + half] >> shift) & 3) - (0 if hm[l + half] & m else 4)) for l in range(16)]
                m <<= 1
        return y
    if t in ("q4_K", "q5_K"):
        d, mn, s = _h(b, 0), _h(b, 2), b[4:16]

        def gsm(j):
            if j < 4:
                return s[j] & 63, s[j + 4] & 63
            return (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)
        qh = b[16:48]
        ql = b[16:144] if t == "q4_K" else b[48:176]
        is_, u1, u2 = 0, 1, 2
        for j in range(0, 256, 64):
            q = ql[j // 2:j // 2 + 32]
            sc, m = gsm(is_)
            d1, m1 = d * sc, mn * m
            sc, m = gsm(is_ + 1)
            d2, m2 = d * sc, mn * m
            if t == "q4_K":
                y += [d1 * (q[l] & 15) - m1 for l in range(32)]
                y += [d2 * (q[l] >> 4) - m2 for l in range(32)]
            else:
                y += [d1 * ((q[l] & 15) + (16 if qh[l] & u1 else 0)) - m1 for l in range(32)]
                y += [d2 * ((q[l] >> 4) + (16 if qh[l] & u2 else 0)) - m2 for l in range(32)]
            is_ += 2
            u1 <<= 2
            u2 <<= 2
        return y
    if t == "q6_K":
        ql, qh, sc, d = b[0:128], b[128:192], np.frombuffer(bytes(b[192:208]), np.int8), _h(b, 208)
        y = [0.0] * 256
        for n in range(2):
            L, H, S = ql[64 * n:], qh[32 * n:], sc[8 * n:]
            for l in range(32):
                is_ = l // 16
                q1 = ((L[l] & 15) | (((H[l] >> 0) & 3) << 4)) - 32
                q2 = ((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4)) - 32
                q3 = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32
                q4 = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32
                y[128 * n + l] = d * S[is_] * q1
                y[128 * n + l + 32] = d * S[is_ + 2] * q2
                y[128 * n + l + 64] = d * S[is_ + 4] * q3
                y[128 * n + l + 96] = d * S[is_ + 6] * q4
        return y
    raise ValueError(t)


def self_check(rng):
    for t in [t for t in TYPES + EXTRA_DEQUANT if GGML_TYPES[TID[t]][1] > 1]:
        tid = TID[t]
        size = GGML_TYPES[tid][2]
        raw = random_blocks(tid, 6, rng, special=True)
        vec = dequantize(tid, raw, 6 * GGML_TYPES[tid][1])
        lp = np.concatenate([np.array(loop_dequant(t, raw[i * size:(i + 1) * size]), np.float64)
                             for i in range(6)])
        check("selfcheck_dequant_" + t, np.array_equal(vec, lp),
              "oracle vectorised != loop (first diff at %s)" % np.flatnonzero(vec != lp)[:3])
    # The ported quantizers invert their own dequantizers well.
    x = rng.standard_normal(256 * 16).astype(np.float32)
    for tid, fn in QUANTIZERS.items():
        y = dequantize(tid, fn(x), x.size)
        rel = np.sqrt(np.mean((y - x) ** 2) / np.mean(x.astype(np.float64) ** 2))
        check("selfcheck_quant_" + type_name(tid), rel < QUANT_BOUNDS[type_name(tid)][0] * 0.9 + 1e-12,
              "rel rms %.3g" % rel)


# ---- 2. dequantization: bit-exact ---------------------------------------------

def test_dequant(rng, tmp):
    for t in TYPES + EXTRA_DEQUANT:
        tid = TID[t]
        blck = GGML_TYPES[tid][1]
        nblocks = 2048 // blck * 8 if blck == 1 else 64
        raw = np.concatenate([random_blocks(tid, nblocks, rng, scale=0.02),
                              random_blocks(tid, nblocks, rng, scale=0.02, special=True)])
        n = 2 * nblocks * blck
        inp, out = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.f32")
        raw.tofile(inp)
        rc, err = run_tool("dequant", t, inp, out)
        if rc != 0:
            check("dequant_" + t, False, "quant_tool failed: " + err)
            continue
        got = np.fromfile(out, "<f4")
        want = dequantize(tid, raw, n).astype(np.float32)
        if got.size != n:
            check("dequant_" + t, False, "got %d values, want %d" % (got.size, n))
            continue
        bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
        check("dequant_" + t, bad.size == 0,
              "%d of %d values differ; first at %d (block %d): strata %r oracle %r" %
              (bad.size, n, bad[0], bad[0] // blck, got[bad[0]], want[bad[0]]) if bad.size else "")
        report.append("dequant %-5s %7d values, %d mismatches" % (t, n, bad.size))


# ---- 3. quantization ----------------------------------------------------------

def quant_inputs(rng, blck):
    """Gaussian rows plus edge-case blocks; returns float32 (n,) and n_special."""
    g = rng.standard_normal(256 * 64).astype(np.float32)
    B = max(blck, 32)
    special = [np.zeros(B), np.full(B, 0.75), np.full(B, -3.0),
               np.eye(1, B, B // 3).ravel() * 5.0,            # one spike
               rng.standard_normal(B) * 1e-6,                 # tiny scale (fp16 subnormal d)
               rng.standard_normal(B) * 1e3,
               np.linspace(-1, 2, B), rng.standard_normal(B) + 4.0,
               # exact ties for amax 127 grids (weights: ggml's _ref rounds half away from zero)
               np.tile([127.0, 18.5, -18.5, 20.5, 0.5, -0.5, 2.5, -3.5], B // 8)]
    sp = np.concatenate(special).astype(np.float32)
    pad = (-sp.size) % 256
    sp = np.concatenate([sp, np.zeros(pad, np.float32)])
    return np.concatenate([g, sp]), g.size


def test_quantize(rng, tmp):
    for t in TYPES + ["q8_1", "q8_K"]:
        tid = TID[t]
        blck = GGML_TYPES[tid][1]
        x, ng = quant_inputs(rng, blck)
        inp, out = os.path.join(tmp, "in.f32"), os.path.join(tmp, "out.bin")
        x.astype("<f4").tofile(inp)
        rc, err = run_tool("quantize", t, inp, out)
        if rc != 0:
            check("quantize_" + t, False, "quant_tool failed: " + err)
            continue
        raw = np.fromfile(out, np.uint8)
        want_bytes = x.size // blck * GGML_TYPES[tid][2]
        if raw.size != want_bytes:
            check("quantize_" + t, False, "%d bytes, want %d" % (raw.size, want_bytes))
            continue
        y = dequantize(tid, raw, x.size)
        xf = x.astype(np.float64)
        err_ = y - xf
        ok_finite = np.all(np.isfinite(y))
        rel = np.sqrt(np.mean(err_[:ng] ** 2) / np.mean(xf[:ng] ** 2))
        # max error per block, relative to the block's absmax (Gaussian part)
        B = max(blck, 32)
        amax = np.abs(xf[:ng]).reshape(-1, B).max(axis=1)
        emax = np.abs(err_[:ng]).reshape(-1, B).max(axis=1)
        mrel = float((emax / amax).max())
        # edge cases: all finite; zero blocks give exact zeros; each special
        # block's error is within its own amax (nothing blows up), plus, for
        # values ~1e-6 whose fp16 scales are subnormal (granularity 2^-24), up
        # to 2^-24 x 63 (6-bit sub-scale) x 32 (quant level) of scale rounding.
        sx, se = xf[ng:].reshape(-1, B), np.abs(err_[ng:]).reshape(-1, B)
        sp_ok = bool(np.all(se.max(axis=1) <= np.abs(sx).max(axis=1) * 1.01 + 2.0 ** -24 * 63 * 32))
        zero_ok = bool(np.all(y[ng:ng + B] == 0))
        rb, mb = QUANT_BOUNDS[t]
        ok = ok_finite and rel <= rb and mrel <= mb + 1e-12 and sp_ok and zero_ok
        check("quantize_bounds_" + t, ok, "finite %s rel_rms %.4g (<= %g) max/amax %.4g (<= %g) special %s zero %s"
              % (ok_finite, rel, rb, mrel, mb, sp_ok, zero_ok))
        line = "quantize %-5s rel_rms %.4f max/amax %.4f" % (t, rel, mrel)
        if tid in QUANTIZERS:
            mine = QUANTIZERS[tid](x)
            bad = np.flatnonzero(mine != raw)
            check("quantize_exact_" + t, bad.size == 0,
                  "%d bytes differ from ggml's reference quantizer; first at byte %d (block %d)"
                  % (bad.size, bad[0], bad[0] // GGML_TYPES[tid][2]) if bad.size else "")
            line += ", bytes == ggml ref: %s" % (bad.size == 0)
        report.append(line)


# ---- 3b. activation quantization (ggml-cpu's from_float) ---------------------

def test_act_quantize(rng, tmp):
    """act_quant of the dot types against the ports: Q8_0/Q8_1 as ggml-cpu's
    x86 from_float (x * (127/amax), round half to even), Q8_K/F16/BF16 as the
    reference. Gaussian rows, exact ties, zeros and edge-case blocks."""
    tie = np.array([127.0, 18.5, -18.5, 20.5, 0.5, -0.5, 2.5, -3.5] * 32, np.float32)
    for t in ("q8_0", "q8_1", "q8_K", "f16", "bf16"):
        tid = TID[t]
        blck = GGML_TYPES[tid][1]
        x, _ = quant_inputs(rng, blck)
        x = np.concatenate([x, tie, -tie]).astype(np.float32)
        want = quant_ref.ACT_QUANTIZERS.get(tid, QUANTIZERS[tid])(x)
        inp, out = os.path.join(tmp, "in.f32"), os.path.join(tmp, "out.bin")
        x.astype("<f4").tofile(inp)
        for isa in ("scalar", "best"):
            rc, err = run_tool("actquant", t, inp, out, isa)
            if rc != 0:
                check("actquant_%s_%s" % (t, isa), False, "quant_tool failed: " + err)
                continue
            got = np.fromfile(out, np.uint8)
            bad = np.flatnonzero(got != want) if got.size == want.size else np.arange(1)
            check("actquant_%s_%s" % (t, isa), bad.size == 0,
                  "%d bytes differ from ggml-cpu's activation quantizer; first at byte %d (block %d)"
                  % (bad.size, bad[0], bad[0] // GGML_TYPES[tid][2]) if bad.size else "")
            report.append("actquant %-5s %-6s bytes == ggml-cpu from_float: %s" % (t, isa, bad.size == 0))


# ---- 4. dot numerics ------------------------------------------------------------

def test_matmul(rng, tmp):
    K, M, N = 512, 24, 5
    for t in TYPES:
        tid = TID[t]
        blck = GGML_TYPES[tid][1]
        wraw = quant_ref.any_quantize(tid, (rng.standard_normal(M * K) * 0.05).astype(np.float32))
        W = dequantize(tid, wraw, M * K).reshape(M, K)
        X = (rng.standard_normal((N, K)) * np.exp(rng.uniform(-2, 2, (N, 1)))).astype(np.float32)
        X[0, ::7] = 0.0
        # Exact rounding ties: with amax 127 the Q8 scale is 1 (Q8_K: -1), so
        # x = k + 0.5 lands exactly between two quants; ggml-cpu's x86 Q8_0/Q8_1
        # and Q8_K activation quantizers round half to even (18.5 -> 18).
        tie = np.array([127.0, 18.5, -18.5, 20.5, 0.5, -0.5, 2.5, -3.5] * 4, np.float32)
        X[4] = np.tile(tie, K // 32)
        emul = act_quant_dequant(X, tid) @ W.T
        if tid in (3, 7):
            emul = emul + act_dot_correction(X, tid, block_mins(tid, wraw, M * K).reshape(M, -1))
        plain = X.astype(np.float64) @ W.T
        mag = np.abs(act_quant_dequant(X, tid)) @ np.abs(W).T     # sum |w a|
        wp, xp, op = (os.path.join(tmp, f) for f in ("w.bin", "x.f32", "o.f32"))
        wraw.tofile(wp)
        X.astype("<f4").tofile(xp)
        for isa in ("scalar", "best"):
            rc, err = run_tool("matmul", t, K, wp, xp, op, isa)
            if rc != 0:
                check("matmul_%s_%s" % (t, isa), False, "quant_tool failed: " + err)
                continue
            got = np.fromfile(op, "<f4").astype(np.float64).reshape(N, M)
            e_em = float((np.abs(got - emul) / mag).max())
            e_pl = float((np.abs(got - plain) / mag).max())
            ok = e_em <= 2e-6
            if quant_ref.DOT_TYPE[tid] not in (0, tid):   # activations quantized
                ok = ok and e_em < e_pl
            check("matmul_%s_%s" % (t, isa), ok,
                  "max |strata - emulation| / sum|wa| = %.3g (<= 2e-6); vs plain f64 %.3g" % (e_em, e_pl))
            report.append("matmul %-5s %-6s |d|/sum|wa|: vs ggml emulation %.2e, vs plain f64 %.2e"
                          % (t, isa, e_em, e_pl))


def main():
    rng = np.random.default_rng(1234)
    self_check(rng)
    if not os.access(TOOL, os.X_OK):
        check("quant_tool_exists", False, "%s not built" % TOOL)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            test_dequant(rng, tmp)
            test_quantize(rng, tmp)
            test_act_quantize(rng, tmp)
            test_matmul(rng, tmp)
    for line in report:
        print(line, file=sys.stderr)
    print("dequant: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
