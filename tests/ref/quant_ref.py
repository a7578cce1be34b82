"""quant_ref: numpy ports of ggml's simple reference quantizers, the activation
quantization ggml-cpu applies before a quantized dot, and random valid blocks.

Written from the descriptions of ggml-quants.c quantize_row_*_ref (facts, not
code): every step is done in float32 exactly as the C code orders it, so the
bytes produced are bit-identical to ggml's for the types ported here:
F16, BF16, Q8_0, Q8_1, Q8_K, Q4_0, Q4_1, Q5_0, Q5_1. (The K-quant weight
quantizers search for scales iteratively and are not ported: tests check
strata's with error bounds instead.)

Activation emulation (FORMATS.md section 4, "CPU matmul numerics"): ggml-cpu
quantizes the float32 activations of a matmul to the weight type's vec_dot_type
(Q4_0/Q5_0/Q8_0 -> Q8_0, Q4_1/Q5_1 -> Q8_1, K-quants -> Q8_K, F16 -> F16, BF16 ->
BF16, F32 stays F32) and then computes an integer/half dot. That dot equals
sum(dequant(w) * dequant(a)) up to float rounding, except for Q4_1/Q5_1 whose
min term uses Q8_1's fp16-rounded s = fp16(d * sum(q)) (see act_dot_correction).
"""

import numpy as np

from gguf_ref import GGML_TYPES

F32 = np.float32


def _round_away(x):
    """C roundf(): round half away from zero, for float32 inputs (exact in f64)."""
    x = x.astype(np.float64)
    return np.trunc(x + np.copysign(0.5, x))


def _signed_absmax(x):
    """Per row: (amax, the first element whose |x| is strictly the largest).
    x: (nb, blck) float32."""
    ax = np.abs(x)
    idx = np.argmax(ax, axis=1)          # first occurrence of the max
    rows = np.arange(x.shape[0])
    return ax[rows, idx], x[rows, idx]


def _f16_bytes(v):
    return v.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _recip(d):
    """ggml's `d ? 1.0f/d : 0.0f`, in float32."""
    with np.errstate(divide="ignore"):
        r = F32(1.0) / d
    return np.where(d != 0, r, F32(0)).astype(F32)


def fp32_to_bf16_bits(x):
    """ggml_compute_fp32_to_bf16: round to nearest even; NaN quieted."""
    u = np.asarray(x, F32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    r = np.where(nan, (u >> 16) | 64, r)
    return r.astype(np.uint16)


def quantize_q8_0(x):
    x = np.asarray(x, F32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = (amax / F32(127)).astype(F32)
    idv = _recip(d)
    q = _round_away((x * idv[:, None]).astype(F32)).astype(np.int8)
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1).reshape(-1)


def quantize_q8_1(x):
    x = np.asarray(x, F32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = (amax / F32(127)).astype(F32)
    idv = _recip(d)
    q = _round_away((x * idv[:, None]).astype(F32)).astype(np.int8)
    s = (q.astype(np.int64).sum(axis=1).astype(F32) * d).astype(F32)   # float32 sum*d
    return np.concatenate([_f16_bytes(d), _f16_bytes(s), q.view(np.uint8)], axis=1).reshape(-1)


def act_quantize_q8_0(x):
    """Q8_0 as ggml-cpu quantizes ACTIVATIONS on x86 (AVX2 quantize_row_q8_0):
    q = round-half-even(float32(x * float32(127/amax))), d = fp16(amax/127);
    amax == 0 gives q = 0. Differs from quantize_q8_0 (the weight/reference
    quantizer: x * (1/d), ties away from zero) only at near-ties."""
    x = np.asarray(x, F32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = (amax / F32(127)).astype(F32)
    with np.errstate(divide="ignore"):
        idv = np.where(amax != 0, F32(127) / np.where(amax != 0, amax, F32(1)), F32(0)).astype(F32)
    q = np.rint((x * idv[:, None]).astype(F32)).astype(np.int8)
    return q, d


def act_quantize_q8_0_bytes(x):
    q, d = act_quantize_q8_0(x)
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1).reshape(-1)


def act_quantize_q8_1_bytes(x):
    """Q8_1 activations on x86: as act_quantize_q8_0, plus s = fp16(d * sum(q))."""
    q, d = act_quantize_q8_0(x)
    s = (q.astype(np.int64).sum(axis=1).astype(F32) * d).astype(F32)
    return np.concatenate([_f16_bytes(d), _f16_bytes(s), q.view(np.uint8)], axis=1).reshape(-1)


def quantize_q8_K(x):
    x = np.asarray(x, F32).reshape(-1, 256)
    amax, mx = _signed_absmax(x)
    nz = amax != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(nz, F32(-127) / np.where(nz, mx, F32(1)), F32(0)).astype(F32)
    v = np.rint((x * iscale[:, None]).astype(F32).astype(np.float64))   # nearest_int: RNE
    q = np.minimum(127, v).astype(np.int8)
    q[~nz] = 0
    bsums = q.astype(np.int16).reshape(-1, 16, 16).sum(axis=2).astype("<i2")
    with np.errstate(divide="ignore"):
        d = np.where(nz, F32(1) / np.where(nz, iscale, F32(1)), F32(0)).astype("<f4")
    return np.concatenate([d.reshape(-1, 1).view(np.uint8), q.view(np.uint8),
                           bsums.view(np.uint8)], axis=1).reshape(-1)


def quantize_q4_0(x):
    x = np.asarray(x, F32).reshape(-1, 32)
    _, mx = _signed_absmax(x)
    d = (mx / F32(-8)).astype(F32)
    idv = _recip(d)
    v = ((x * idv[:, None]).astype(F32) + F32(8.5)).astype(F32)
    q = np.minimum(15, np.trunc(v.astype(np.float64))).astype(np.uint8)   # (int8_t) truncates
    qs = q[:, :16] | (q[:, 16:] << 4)
    return np.concatenate([_f16_bytes(d), qs], axis=1).reshape(-1)


def quantize_q4_1(x):
    x = np.asarray(x, F32).reshape(-1, 32)
    mn, mx = x.min(axis=1), x.max(axis=1)
    d = ((mx - mn) / F32(15)).astype(F32)
    idv = _recip(d)
    v = (((x - mn[:, None]).astype(F32) * idv[:, None]).astype(F32) + F32(0.5)).astype(F32)
    q = np.minimum(15, np.trunc(v.astype(np.float64))).astype(np.uint8)
    qs = q[:, :16] | (q[:, 16:] << 4)
    return np.concatenate([_f16_bytes(d), _f16_bytes(mn), qs], axis=1).reshape(-1)


def _qh_bytes(q):
    """5th bits of 32 quants -> little-endian u32 (bit j = element j)."""
    bits = ((q.astype(np.uint64) >> 4) & 1) << np.arange(32, dtype=np.uint64)
    return bits.sum(axis=1).astype("<u4").reshape(-1, 1).view(np.uint8)


def quantize_q5_0(x):
    x = np.asarray(x, F32).reshape(-1, 32)
    _, mx = _signed_absmax(x)
    d = (mx / F32(-16)).astype(F32)
    idv = _recip(d)
    v = ((x * idv[:, None]).astype(F32) + F32(16.5)).astype(F32)
    q = np.minimum(31, np.trunc(v.astype(np.float64))).astype(np.uint8)
    qs = (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)
    return np.concatenate([_f16_bytes(d), _qh_bytes(q), qs], axis=1).reshape(-1)


def quantize_q5_1(x):
    x = np.asarray(x, F32).reshape(-1, 32)
    mn, mx = x.min(axis=1), x.max(axis=1)
    d = ((mx - mn) / F32(31)).astype(F32)
    idv = _recip(d)
    v = (((x - mn[:, None]).astype(F32) * idv[:, None]).astype(F32) + F32(0.5)).astype(F32)
    q = np.trunc(v.astype(np.float64)).astype(np.uint8)      # (uint8_t), no clamp in ggml
    qs = (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)
    return np.concatenate([_f16_bytes(d), _f16_bytes(mn), _qh_bytes(q), qs], axis=1).reshape(-1)


def quantize_f16(x):
    return np.asarray(x, F32).astype("<f2").view(np.uint8)


def quantize_bf16(x):
    return fp32_to_bf16_bits(x).astype("<u2").view(np.uint8)


def quantize_f32(x):
    return np.asarray(x, "<f4").view(np.uint8)


QUANTIZERS = {  # ggml type id -> bit-exact port of quantize_row_*_ref
    0: quantize_f32, 1: quantize_f16, 30: quantize_bf16,
    2: quantize_q4_0, 3: quantize_q4_1, 6: quantize_q5_0, 7: quantize_q5_1,
    8: quantize_q8_0, 9: quantize_q8_1, 15: quantize_q8_K,
}

# Activation quantizers where ggml-cpu's x86 path differs from the reference
# (Q8_0 / Q8_1: scale 127/amax, round half to even). Q8_K is the same.
ACT_QUANTIZERS = {8: act_quantize_q8_0_bytes, 9: act_quantize_q8_1_bytes}

# ggml-cpu vec_dot_type of each weight type (ggml-cpu.c type_traits_cpu).
DOT_TYPE = {0: 0, 1: 1, 30: 30, 2: 8, 3: 9, 6: 8, 7: 9, 8: 8,
            10: 15, 11: 15, 12: 15, 13: 15, 14: 15}


# ---- activation emulation -----------------------------------------------------

def act_quant_raw(x, wtype, scale_flips=()):
    """Raw dot-type blocks of activations x (N, K) for weights of type wtype,
    as ggml-cpu quantizes them (x86). scale_flips: [(row, block, field)] with
    field "d" or "s" (Q8_0/Q8_1 only): round that block's fp16 scale d (or
    Q8_1's s) to the other fp16 neighbour of its exact float32 value, as an
    engine whose amax landed on the other side of an fp16 midpoint would."""
    x32 = np.asarray(x, F32).reshape(-1, np.asarray(x).shape[-1])
    dt = DOT_TYPE[wtype]
    raw = ACT_QUANTIZERS.get(dt, QUANTIZERS.get(dt))(x32.reshape(-1))
    if not scale_flips:
        return raw
    size = GGML_TYPES[dt][2]
    raw = raw.reshape(-1, size).copy()
    nb = x32.shape[1] // 32
    for r, b, field in scale_flips:
        xb = x32[r, 32 * b:32 * b + 32]
        d32 = F32(np.abs(xb).max() / F32(127))
        off = 0 if field == "d" else 2
        exact = d32 if field == "d" else F32(F32(raw[r * nb + b, 4:36].view(np.int8).astype(np.int64).sum()) * d32)
        cur = raw[r * nb + b, off:off + 2].view("<f2")[0]
        other = np.nextafter(cur, np.float16(np.inf) if exact > cur else np.float16(-np.inf))
        raw[r * nb + b, off:off + 2] = np.array([other], "<f2").view(np.uint8)
    return raw.reshape(-1)


def act_scale_near_boundary(x, wtype, limit):
    """Q8_0/Q8_1 blocks whose fp16 scale d (Q8_1: also s) sits within `limit`
    (relative) of an fp16 rounding midpoint: [(frag, row, block, field)]."""
    dt = DOT_TYPE[wtype]
    if dt not in (8, 9):
        return []
    x32 = np.asarray(x, F32).reshape(-1, np.asarray(x).shape[-1])
    raw = act_quant_raw(x32, wtype).reshape(x32.shape[0], -1, GGML_TYPES[dt][2])
    d32 = (np.abs(x32.reshape(x32.shape[0], -1, 32)).max(axis=2) / F32(127)).astype(F32)
    fields = [("d", d32)]
    if dt == 9:
        qsum = raw[:, :, 4:36].view(np.int8).astype(np.int64).sum(axis=2)
        fields.append(("s", (qsum.astype(F32) * d32).astype(F32)))
    out = []
    for field, v in fields:
        v64 = v.astype(np.float64)
        h = v.astype(np.float16)
        up = np.nextafter(h, np.float16(np.inf)).astype(np.float64)
        dn = np.nextafter(h, np.float16(-np.inf)).astype(np.float64)
        h64 = h.astype(np.float64)
        mid = np.where(v64 >= h64, (h64 + up) / 2, (h64 + dn) / 2)
        with np.errstate(divide="ignore", invalid="ignore"):
            frag = np.abs(v64 - mid) / np.abs(v64)
        frag[~np.isfinite(frag)] = np.inf
        r, b = np.nonzero(frag < limit)
        out += [(float(frag[i, j]), int(i), int(j), field) for i, j in zip(r, b)]
    return out


def act_quant_dequant(x, wtype, scale_flips=()):
    """Activations x (..., K) as ggml-cpu feeds them to a dot with weights of
    type wtype: rounded to float32, quantized to the dot type, dequantized.
    Returns float64 of the same shape."""
    from dequant_ref import dequantize
    x = np.asarray(x)
    dt = DOT_TYPE[wtype]
    x32 = x.astype(F32)
    if dt == 0:
        return x32.astype(np.float64)
    if scale_flips:
        raw = act_quant_raw(x32.reshape(-1, x.shape[-1]), wtype, scale_flips)
    else:
        raw = ACT_QUANTIZERS.get(dt, QUANTIZERS.get(dt))(x32.reshape(-1))
    return dequantize(dt, raw, x32.size).reshape(x.shape)


def act_dot_correction(x, wtype, w_mins, scale_flips=()):
    """Q4_1/Q5_1 x Q8_1: ggml's block dot is d_w*d_a*sum(q_w q_a) + m_w*s_a with
    s_a = fp16(d_a*sum(q_a)) (d_a the unrounded float32 scale), whereas
    sum(dequant(w)*dequant(a)) has m_w*fp16(d_a)*sum(q_a). Returns the
    difference as a (..., M) array to add to x_deq @ W.T.
    w_mins: (M, K/32) block mins of the weight rows."""
    x32 = np.asarray(x, F32).reshape(-1, x.shape[-1])
    raw = act_quant_raw(x32, wtype, scale_flips).reshape(-1, 36)
    d16 = np.ascontiguousarray(raw[:, 0:2]).view("<f2").astype(np.float64)[:, 0]
    s16 = np.ascontiguousarray(raw[:, 2:4]).view("<f2").astype(np.float64)[:, 0]
    qsum = raw[:, 4:36].view(np.int8).astype(np.float64).sum(axis=1)
    corr = (s16 - d16 * qsum).reshape(x32.shape[0], -1)       # (N, K/32)
    return (corr @ w_mins.T).reshape(x.shape[:-1] + (w_mins.shape[0],))


# ---- random valid blocks --------------------------------------------------------

# Byte offsets of the fp16 scale fields of each block type.
_F16_FIELDS = {2: [0], 3: [0, 2], 6: [0], 7: [0, 2], 8: [0], 9: [0, 2],
               10: [80, 82], 11: [108], 12: [0, 2], 13: [0, 2], 14: [208]}


def random_blocks(tid, nblocks, rng, scale=0.01, special=False):
    """nblocks random but valid blocks of type tid as (nblocks*type_size,) uint8.

    Quants are uniformly random bytes; fp16 scale fields are set to finite
    values of magnitude ~scale (random sign). With special=True some scales are
    0, fp16 subnormals or large, to cover edge cases. Plain float types get
    random finite values ~ N(0, scale)."""
    _, blck, size = GGML_TYPES[tid]
    if tid == 0:
        return (rng.standard_normal(nblocks) * scale).astype("<f4").view(np.uint8)
    if tid == 1:
        v = rng.standard_normal(nblocks) * scale
        if special:
            v[::7] = rng.choice([0.0, -0.0, 6.0e-8, -3.0e-6, 65504.0, 1e-5], size=v[::7].shape)
        return v.astype("<f2").view(np.uint8)
    if tid == 30:
        bits = rng.integers(0, 1 << 16, size=nblocks, dtype=np.uint32).astype(np.uint16)
        exp = (bits >> 7) & 0xFF
        bits = np.where(exp == 0xFF, bits & 0x807F, bits).astype("<u2")   # no inf/NaN
        return bits.view(np.uint8)
    b = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
    mags = scale * np.exp(rng.uniform(-1.5, 1.5, size=(nblocks, len(_F16_FIELDS.get(tid, [])))))
    sgn = np.where(rng.random(mags.shape) < 0.5, -1.0, 1.0)
    vals = mags * sgn
    if tid in (3, 7, 10, 12, 13):
        vals[:, -1] = mags[:, -1] * (1.0 if tid in (10, 12, 13) else -1.0)   # mins: usual sign
        if tid in (10, 12, 13):
            vals[:, 0] = mags[:, 0]
    if special:
        k = max(1, nblocks // 8)
        vals[:k] = rng.choice([0.0, 5.96e-8, 6.1e-5, -3.0e-7, 2.0, 60000.0], size=vals[:k].shape)
    for j, off in enumerate(_F16_FIELDS.get(tid, [])):
        b[:, off:off + 2] = vals[:, j].astype("<f2").reshape(-1, 1).view(np.uint8)
    if tid == 15:   # q8_K: f32 d, bsums consistent with qs
        d = (rng.uniform(0.5, 1.5, nblocks) * scale).astype("<f4")
        b[:, 0:4] = d.reshape(-1, 1).view(np.uint8)
        q = b[:, 4:260].view(np.int8).astype(np.int16)
        b[:, 260:292] = q.reshape(-1, 16, 16).sum(axis=2).astype("<i2").view(np.uint8)
    return b.reshape(-1)


# ---- simple K-quant packers (valid blocks, NOT ggml's scale search) -------------
#
# make_model.py uses these to write K-quant weights that represent Gaussian
# weights reasonably well. They pick plain min/max scales instead of ggml's
# iterative search, so their bytes differ from llama-quantize's; any valid
# block is a fine model weight, since the oracle dequantizes the same bytes.

def _safe_div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1), 0.0)


def _f16r(v):
    """Round to fp16 and back (float64)."""
    return np.asarray(v, np.float64).astype(np.float16).astype(np.float64)


def _pack_2bit_planes(q):
    """(nb, 256) values 0..3 -> (nb, 64) bytes (element 128n+32j+16h+l at bits
    2j of byte 32n+16h+l)."""
    q = q.astype(np.uint8).reshape(-1, 2, 4, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def _pack_k4_scales(sc, m):
    """Inverse of get_scale_min_k4: 8 6-bit (sc, m) -> 12 bytes."""
    sc = sc.astype(np.uint8)
    m = m.astype(np.uint8)
    s = np.zeros((sc.shape[0], 12), np.uint8)
    s[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    return s


def _pack_k4_quants(q):
    """(nb, 256) values 0..15 -> (nb, 128): byte 32g+l = elem 64g+l | elem 64g+32+l << 4."""
    q = q.astype(np.uint8).reshape(-1, 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)


def _affine_subblocks(x, sub, levels, sc_max):
    """Scale/min quantization with sub-blocks of `sub`, quants 0..levels, and
    sc/m stored as integers 0..sc_max times fp16 super-scales d, dmin."""
    xs = x.reshape(x.shape[0], -1, sub)
    mn = np.minimum(xs.min(axis=2), 0.0)
    scale = (xs.max(axis=2) - mn) / levels
    d = _f16r(scale.max(axis=1) / sc_max)
    dmin = _f16r((-mn).max(axis=1) / sc_max)
    sc = np.clip(np.ceil(_safe_div(scale, d[:, None]) - 1e-9), 0, sc_max)
    m = np.clip(np.ceil(_safe_div(-mn, dmin[:, None]) - 1e-9), 0, sc_max)
    step = (d[:, None] * sc)[:, :, None]
    off = (dmin[:, None] * m)[:, :, None]
    q = np.clip(np.rint(_safe_div(xs + off, step)), 0, levels).reshape(x.shape[0], -1)
    return d, dmin, sc, m, q


def simple_quantize_q4_K(x):
    x = np.asarray(x, np.float64).reshape(-1, 256)
    d, dmin, sc, m, q = _affine_subblocks(x, 32, 15, 63)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_k4_scales(sc, m),
                           _pack_k4_quants(q)], axis=1).reshape(-1)


def simple_quantize_q5_K(x):
    x = np.asarray(x, np.float64).reshape(-1, 256)
    d, dmin, sc, m, q = _affine_subblocks(x, 32, 31, 63)
    q = q.astype(np.uint8)
    hb = ((q >> 4) & 1).reshape(-1, 8, 32)                    # bit s of qh[l]
    qh = np.zeros((x.shape[0], 32), np.uint8)
    for s in range(8):
        qh |= hb[:, s] << s
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_k4_scales(sc, m), qh,
                           _pack_k4_quants(q & 15)], axis=1).reshape(-1)


def simple_quantize_q2_K(x):
    x = np.asarray(x, np.float64).reshape(-1, 256)
    d, dmin, sc, m, q = _affine_subblocks(x, 16, 3, 15)
    scales = (sc.astype(np.uint8) & 15) | (m.astype(np.uint8) << 4)
    return np.concatenate([scales, _pack_2bit_planes(q), _f16_bytes(d), _f16_bytes(dmin)],
                          axis=1).reshape(-1)


def _symmetric_subblocks(x, sub, qmin, qmax, sc_max):
    xs = x.reshape(x.shape[0], -1, sub)
    s = np.abs(xs).max(axis=2) / max(-qmin, qmax)
    d = _f16r(s.max(axis=1) / sc_max)
    sc = np.clip(np.ceil(_safe_div(s, d[:, None]) - 1e-9), 0, sc_max)
    step = (d[:, None] * sc)[:, :, None]
    q = np.clip(np.rint(_safe_div(xs, step)), qmin, qmax).reshape(x.shape[0], -1)
    return d, sc, q


def simple_quantize_q3_K(x):
    x = np.asarray(x, np.float64).reshape(-1, 256)
    d, sc, q = _symmetric_subblocks(x, 16, -4, 3, 31)
    u = (sc + 32).astype(np.uint8)                            # stored 6-bit scales
    s = np.zeros((x.shape[0], 12), np.uint8)
    s[:, 0:4] = (u[:, 0:4] & 15) | ((u[:, 8:12] & 15) << 4)
    s[:, 4:8] = (u[:, 4:8] & 15) | ((u[:, 12:16] & 15) << 4)
    for a in range(4):
        s[:, 8:12] |= ((u[:, 4 * a:4 * a + 4] >> 4) & 3) << (2 * a)
    q3 = (q + 4).astype(np.uint8)                             # 0..7: low 2 bits + high bit
    hbit = (q3 >> 2).reshape(-1, 2, 4, 32)                    # [n, j, 16h+l]
    hmask = np.zeros((x.shape[0], 32), np.uint8)
    for n in range(2):
        for j in range(4):
            hmask |= hbit[:, n, j] << (4 * n + j)
    return np.concatenate([hmask, _pack_2bit_planes(q3 & 3), s, _f16_bytes(d)], axis=1).reshape(-1)


def simple_quantize_q6_K(x):
    x = np.asarray(x, np.float64).reshape(-1, 256)
    d, sc, q = _symmetric_subblocks(x, 16, -32, 31, 127)
    q = (q + 32).astype(np.uint8).reshape(-1, 2, 4, 32)       # [half, k, l]
    lo, hi = q & 15, q >> 4
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2)
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.astype(np.int8).view(np.uint8),
                           _f16_bytes(d)], axis=1).reshape(-1)


SIMPLE_QUANTIZERS = {10: simple_quantize_q2_K, 11: simple_quantize_q3_K, 12: simple_quantize_q4_K,
                     13: simple_quantize_q5_K, 14: simple_quantize_q6_K}


def any_quantize(tid, x):
    """Bytes of type tid representing x: ggml's exact reference quantizer where
    ported, else the simple K-quant packer."""
    if tid in QUANTIZERS:
        return QUANTIZERS[tid](x)
    return SIMPLE_QUANTIZERS[tid](x)


def act_near_boundary(x, wtype, limit):
    """Activations that sit near a rounding boundary of their quantization.

    x: (N, K) float32 rows about to be quantized for weights of type wtype.
    Returns [(frag, row, j)] for elements with frag < limit, where frag is the
    distance from x[row, j] to the nearest rounding boundary divided by the
    row's (Q8: block's) absolute max. A float32 engine whose activations
    differ from the exact ones by ~1e-7 of their magnitude can round such an
    element to the other side; the oracle uses this to explain departures
    (test_oracle.py). F32 dots: nothing is rounded, []."""
    x32 = np.asarray(x, F32)
    dt = DOT_TYPE[wtype]
    if dt in (8, 9, 15):
        B = 256 if dt == 15 else 32
        xb = x32.reshape(x32.shape[0], -1, B)
        if dt == 15:
            _, mx = _signed_absmax(xb.reshape(-1, B))
            mx = mx.reshape(xb.shape[:2])
            with np.errstate(divide="ignore", invalid="ignore"):
                scale = np.where(mx != 0, F32(-127) / np.where(mx != 0, mx, F32(1)), F32(0)).astype(F32)
        else:   # x86 activation quantizer: x * (127/amax)
            amx = np.abs(xb).max(axis=2)
            with np.errstate(divide="ignore"):
                scale = np.where(amx != 0, F32(127) / np.where(amx != 0, amx, F32(1)), F32(0)).astype(F32)
        v = (xb * scale[..., None]).astype(F32).astype(np.float64)
        frag = (np.abs(np.abs(v - np.trunc(v)) - 0.5) / 127.0).reshape(x32.shape)   # q-units / 127
        frag[(scale == 0).repeat(B, axis=1).reshape(x32.shape)] = np.inf
    elif dt in (1, 30):
        bits = x32.view(np.uint32).astype(np.int64)
        ax = np.abs(x32.astype(np.float64))
        with np.errstate(divide="ignore"):
            e = np.floor(np.log2(np.where(ax > 0, ax, 1.0)))
        if dt == 30:
            frac, spacing = (bits & 0xFFFF) / 65536.0, 2.0 ** (e - 7)
        else:
            frac, spacing = (bits & 0x1FFF) / 8192.0, 2.0 ** (e - 10)
        amax = ax.max(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            frag = np.abs(frac - 0.5) * spacing / amax
        frag[(ax < 6.2e-5) | (amax == 0).repeat(x32.shape[1], axis=1)] = np.inf   # fp16 subnormals, zero rows
    else:
        return []
    r, j = np.nonzero(frag < limit)
    return list(zip(frag[r, j].tolist(), r.tolist(), j.tolist()))


def nudge_across(row, j, wtype):
    """row (K,) float32 with element j moved the least it takes to round to the
    other side of its nearest Q8 rounding boundary: the row an engine whose
    float32 arithmetic landed on the other side of it would quantize. Returns
    the new row, or None if that would change more than element j's quant."""
    row = np.array(row, F32)
    dt = DOT_TYPE[wtype]
    if dt not in (8, 9, 15):
        return None
    B = 256 if dt == 15 else 32
    b0 = j // B * B
    blk = row[b0:b0 + B].copy()
    jj = j - b0
    if dt == 15:
        _, mx = _signed_absmax(blk.reshape(1, B))
        scale = F32(-127) / mx[0] if mx[0] != 0 else F32(0)
    else:   # x86 activation quantizer: x * (127/amax)
        amax = np.abs(blk).max()
        scale = F32(127) / amax if amax != 0 else F32(0)
    if scale == 0:
        return None
    v = float(F32(blk[jj] * scale))
    boundary = np.floor(v) + 0.5                     # the .5 boundary nearest to v
    base = act_quant_dequant(blk, wtype)
    x0 = F32(boundary / float(scale))
    cands = [x0]
    for direction in (np.inf, -np.inf):
        x = x0
        for _ in range(4):
            x = np.nextafter(x, F32(direction))
            cands.append(x)
    for x in sorted(cands, key=lambda c: abs(float(c) - float(blk[jj]))):
        trial = blk.copy()
        trial[jj] = x
        q = act_quant_dequant(trial, wtype)
        diff = np.flatnonzero(q != base)
        if diff.tolist() == [jj]:
            out = row.copy()
            out[b0:b0 + B] = trial
            return out
    return None
