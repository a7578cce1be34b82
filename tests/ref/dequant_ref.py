"""dequant_ref: numpy dequantization of ggml block formats, producing float64.

Written from the block layouts (FORMATS.md section 4, ggml-common.h) and the
order of operations of ggml-quants.c dequantize_row_*; no code is shared with
strata. Every function is vectorised over blocks: `b` is a (n_blocks,
type_size) uint8 array and the result is (n_blocks, block_elems) float64.

Exactness. ggml dequantizes in float32, but every product it forms is exact
in float32 (an fp16 scale has 11 significant bits; the 4..8-bit integers it
multiplies add at most 12 more, < 24), so the only rounding ggml does is the
final subtraction/addition of a min term (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K). Here
the same value is computed exactly in float64 (every operand is a multiple of
2^-24 below 2^27, i.e. fits in 53 bits), so rounding our result to float32
gives ggml's float32 result bit for bit. The float64 values returned here are
the exact values before that final rounding.
"""

import numpy as np

from gguf_ref import GGML_TYPES, type_name


def _f16(b, off):
    """fp16 little-endian at byte `off` of every block -> (nb, 1) float64."""
    return np.ascontiguousarray(b[:, off:off + 2]).view("<f2").astype(np.float64)


def _f32(b, off):
    return np.ascontiguousarray(b[:, off:off + 4]).view("<f4").astype(np.float64)


def _nibbles(qs):
    """(nb, 16) bytes -> (nb, 32): low nibbles are elements 0..15, high 16..31."""
    return np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int64)


def _bits32(qh):
    """(nb, 4) bytes of a little-endian u32 -> (nb, 32) bits, bit j = element j."""
    u = np.ascontiguousarray(qh).view("<u4").astype(np.int64)  # (nb, 1)
    return (u >> np.arange(32)) & 1


# ---- 32-element blocks -------------------------------------------------------

def dq_q8_0(b):   # f16 d; i8 qs[32]
    return _f16(b, 0) * b[:, 2:34].view(np.int8).astype(np.float64)


def dq_q8_1(b):   # f16 d; f16 s (= d*sum(qs), unused here); i8 qs[32]
    return _f16(b, 0) * b[:, 4:36].view(np.int8).astype(np.float64)


def dq_q4_0(b):   # f16 d; u8 qs[16]: x[j] = d*(lo-8), x[j+16] = d*(hi-8)
    return _f16(b, 0) * (_nibbles(b[:, 2:18]) - 8)


def dq_q4_1(b):   # f16 d; f16 m; u8 qs[16]: x = d*q + m
    return _f16(b, 0) * _nibbles(b[:, 4:20]) + _f16(b, 2)


def dq_q5_0(b):   # f16 d; u8 qh[4]; u8 qs[16]: 5th bit of element j is bit j of qh
    q = _nibbles(b[:, 6:22]) | (_bits32(b[:, 2:6]) << 4)
    return _f16(b, 0) * (q - 16)


def dq_q5_1(b):   # f16 d; f16 m; u8 qh[4]; u8 qs[16]
    q = _nibbles(b[:, 8:24]) | (_bits32(b[:, 4:8]) << 4)
    return _f16(b, 0) * q + _f16(b, 2)


# ---- 256-element super-blocks ------------------------------------------------
#
# Q2_K and Q3_K share a layout of their 2-bit quants: qs[64] is two halves of 32
# bytes (n = 0, 1); in half n, bits 2j..2j+1 of byte 16h+l hold element
# 128n + 32j + 16h + l (j = 0..3, h = 0..1, l = 0..15), whose sub-block of 16 is
# is = 8n + 2j + h, i.e. simply element // 16.

def _q2_planes(qs):
    """(nb, 64) bytes -> (nb, 256) 2-bit values in element order."""
    q = qs.reshape(-1, 2, 1, 32).astype(np.int64)            # [nb, n, -, byte]
    shifts = (2 * np.arange(4)).reshape(1, 1, 4, 1)          # j
    return ((q >> shifts) & 3).reshape(-1, 256)              # [nb, n, j, 16h+l]


def dq_q2_K(b):   # u8 scales[16]; u8 qs[64]; f16 d; f16 dmin
    sc = b[:, 0:16].astype(np.int64)
    d, dmin = _f16(b, 80), _f16(b, 82)
    scale = np.repeat(d * (sc & 15), 16, axis=1)             # per element
    mins = np.repeat(dmin * (sc >> 4), 16, axis=1)
    return scale * _q2_planes(b[:, 16:80]) - mins


def _q3_scales(s):
    """Unpack Q3_K's 12 scale bytes into 16 6-bit values (0..63).

    Scale i = 4a + k (a = 0..3, k = 0..3): low 4 bits are the low nibble of
    s[k] (a=0), of s[4+k] (a=1), the high nibble of s[k] (a=2), of s[4+k]
    (a=3); the high 2 bits are bits 2a..2a+1 of s[8+k]."""
    s = s.astype(np.int64)
    lo = np.concatenate([s[:, 0:4] & 15, s[:, 4:8] & 15, s[:, 0:4] >> 4, s[:, 4:8] >> 4], axis=1)
    hi = np.concatenate([(s[:, 8:12] >> (2 * a)) & 3 for a in range(4)], axis=1)
    return lo | (hi << 4)


def dq_q3_K(b):   # u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d
    d = _f16(b, 108)
    sc = _q3_scales(b[:, 96:108]) - 32
    q = _q2_planes(b[:, 32:96])
    # High bit: element 128n + 32j + 16h + l uses bit (4n + j) of hmask[16h + l];
    # a CLEAR bit subtracts 4.
    hm = b[:, 0:32].astype(np.int64).reshape(-1, 1, 1, 32)   # [nb, -, -, 16h+l]
    bitpos = (4 * np.arange(2).reshape(1, 2, 1, 1) + np.arange(4).reshape(1, 1, 4, 1))
    high = ((hm >> bitpos) & 1).reshape(-1, 256)             # [nb, n, j, 16h+l]
    q = q - 4 * (1 - high)
    return np.repeat(d * sc, 16, axis=1) * q


def _k4_scale_min(s):
    """Q4_K/Q5_K: 12 bytes -> (sc[8], m[8]) 6-bit values (get_scale_min_k4)."""
    s = s.astype(np.int64)
    sc = np.empty((s.shape[0], 8), np.int64)
    m = np.empty((s.shape[0], 8), np.int64)
    sc[:, 0:4] = s[:, 0:4] & 63
    m[:, 0:4] = s[:, 4:8] & 63
    sc[:, 4:8] = (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)
    m[:, 4:8] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, m


def _k4_quants(qs):
    """(nb, 128) bytes -> (nb, 256): group g (64 values) = low nibbles of
    qs[32g..32g+31] then their high nibbles."""
    q = qs.reshape(-1, 4, 1, 32).astype(np.int64)
    return ((q >> np.array([0, 4]).reshape(1, 1, 2, 1)) & 15).reshape(-1, 256)


def dq_q4_K(b):   # f16 d; f16 dmin; u8 scales[12]; u8 qs[128]
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, m = _k4_scale_min(b[:, 4:16])
    q = _k4_quants(b[:, 16:144])
    return np.repeat(d * sc, 32, axis=1) * q - np.repeat(dmin * m, 32, axis=1)


def dq_q5_K(b):   # f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, m = _k4_scale_min(b[:, 4:16])
    q = _k4_quants(b[:, 48:176])
    # 5th bit of element 32s + l (sub-block s = 0..7) is bit s of qh[l].
    qh = b[:, 16:48].astype(np.int64).reshape(-1, 1, 32)
    high = ((qh >> np.arange(8).reshape(1, 8, 1)) & 1).reshape(-1, 256)
    return np.repeat(d * sc, 32, axis=1) * (q + 16 * high) - np.repeat(dmin * m, 32, axis=1)


def dq_q6_K(b):   # u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d
    d = _f16(b, 208)
    sc = b[:, 192:208].view(np.int8).astype(np.int64)
    ql = b[:, 0:128].astype(np.int64).reshape(-1, 2, 64)     # [nb, half, byte]
    qh = b[:, 128:192].astype(np.int64).reshape(-1, 2, 32)
    # Within half h, for l < 32 (element 128h + 32k + l, k = 0..3):
    #   k=0: ql[l] & 15,    qh bits 0-1;   k=1: ql[l+32] & 15, qh bits 2-3
    #   k=2: ql[l] >> 4,    qh bits 4-5;   k=3: ql[l+32] >> 4, qh bits 6-7
    lo = np.stack([ql[:, :, 0:32] & 15, ql[:, :, 32:64] & 15, ql[:, :, 0:32] >> 4, ql[:, :, 32:64] >> 4], axis=2)
    hi = np.stack([(qh >> (2 * k)) & 3 for k in range(4)], axis=2)
    q = (lo | (hi << 4)).reshape(-1, 256) - 32
    return np.repeat(d * sc, 16, axis=1) * q                # scale index = element // 16


def dq_q8_K(b):   # f32 d; i8 qs[256]; i16 bsums[16]
    return _f32(b, 0) * b[:, 4:260].view(np.int8).astype(np.float64)


_BLOCK_FNS = {
    2: dq_q4_0, 3: dq_q4_1, 6: dq_q5_0, 7: dq_q5_1, 8: dq_q8_0, 9: dq_q8_1,
    10: dq_q2_K, 11: dq_q3_K, 12: dq_q4_K, 13: dq_q5_K, 14: dq_q6_K, 15: dq_q8_K,
}

SUPPORTED = sorted([0, 1, 28, 30] + list(_BLOCK_FNS))


def bf16_to_f64(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def dequantize(tid, raw, n):
    """Dequantize n elements of ggml type `tid` from bytes `raw` (anything
    np.frombuffer / np.asarray gives uint8) -> 1-D float64 array of n."""
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if tid not in GGML_TYPES:
        raise ValueError("unknown ggml type %d" % tid)
    _, blck, size = GGML_TYPES[tid]
    if n % blck:
        raise ValueError("%d elements is not a multiple of %s's block size" % (n, type_name(tid)))
    nb = n // blck
    if raw.size < nb * size:
        raise ValueError("need %d bytes for %d %s elements, have %d" % (nb * size, n, type_name(tid), raw.size))
    raw = raw[:nb * size]
    if tid == 0:
        return np.frombuffer(raw.tobytes(), "<f4").astype(np.float64)
    if tid == 28:
        return np.frombuffer(raw.tobytes(), "<f8").astype(np.float64)
    if tid == 1:
        return np.frombuffer(raw.tobytes(), "<f2").astype(np.float64)
    if tid == 30:
        return bf16_to_f64(np.frombuffer(raw.tobytes(), "<u2"))
    if tid not in _BLOCK_FNS:
        raise ValueError("dequant_ref: no dequantizer for %s" % type_name(tid))
    return _BLOCK_FNS[tid](raw.reshape(nb, size)).reshape(-1)


def block_mins(tid, raw, n):
    """Q4_1/Q5_1 only: the per-block min m (fp16) as float64, shape (n/32,).
    The oracle needs it to emulate ggml's Q4_1 x Q8_1 dot, whose min term uses
    the activation block's fp16 sum s instead of d*sum(q)."""
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    _, blck, size = GGML_TYPES[tid]
    assert tid in (3, 7)
    return _f16(raw[:n // blck * size].reshape(-1, size), 2).reshape(-1)
