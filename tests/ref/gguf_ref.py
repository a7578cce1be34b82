"""gguf_ref: an independent GGUF v2/v3 reader (struct + numpy.memmap).

Part of the float64 oracle in tests/ref/. It shares no code with strata's C
reader (src/gguf): it is written from the format description in
/work/shared/reference/FORMATS.md section 2, so a bug in one is unlikely to be
mirrored in the other.

Layout (little-endian):
    "GGUF" | u32 version (2 or 3) | i64 n_tensors | i64 n_kv
    n_kv      x (string key, i32 value_type, value)
    n_tensors x (string name, u32 n_dims, i64 ne[n_dims], i32 ggml_type, u64 offset)
    zero padding to `general.alignment` (default 32) | data blob
A string is u64 length + bytes (no NUL). An array is i32 elem_type, u64 n,
then n elements (nested arrays rejected). Tensor offsets are relative to the
start of the data blob and, as llama.cpp's loader requires, equal the running
sum of the previous tensors' sizes each padded to the alignment.

Usage:
    g = GGUFFile(path)
    g.metadata["qwen3moe.block_count"]      # python scalars, str, lists or numpy arrays
    g.tensors["blk.0.attn_q.weight"]        # TensorInfo(name, ne, type, offset, nbytes, ...)
    g.raw("blk.0.attn_q.weight")            # np.uint8 view of the exact bytes (memmap)
    g.array("output_norm.weight")           # float64, numpy shape = reversed(ne), dequantized
"""

import struct
import sys
from collections import OrderedDict, namedtuple

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types.
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)

_SCALAR = {  # value type -> (struct format, numpy dtype)
    T_U8: ("<B", "<u1"), T_I8: ("<b", "<i1"), T_U16: ("<H", "<u2"), T_I16: ("<h", "<i2"),
    T_U32: ("<I", "<u4"), T_I32: ("<i", "<i4"), T_F32: ("<f", "<f4"), T_BOOL: ("<?", "<u1"),
    T_U64: ("<Q", "<u8"), T_I64: ("<q", "<i8"), T_F64: ("<d", "<f8"),
}

# ggml tensor types this oracle knows: id -> (name, elements per block, bytes per block).
# (ggml/include/ggml.h ids; sizes from ggml-common.h block structs.)
GGML_TYPES = {
    0: ("f32", 1, 4),
    1: ("f16", 1, 2),
    2: ("q4_0", 32, 18),
    3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22),
    7: ("q5_1", 32, 24),
    8: ("q8_0", 32, 34),
    9: ("q8_1", 32, 36),
    10: ("q2_K", 256, 84),
    11: ("q3_K", 256, 110),
    12: ("q4_K", 256, 144),
    13: ("q5_K", 256, 176),
    14: ("q6_K", 256, 210),
    15: ("q8_K", 256, 292),
    24: ("i8", 1, 1),
    25: ("i16", 1, 2),
    26: ("i32", 1, 4),
    27: ("i64", 1, 8),
    28: ("f64", 1, 8),
    30: ("bf16", 1, 2),
}
TYPE_BY_NAME = {v[0].lower(): k for k, v in GGML_TYPES.items()}


def type_id(name_or_id):
    """ggml type id from a name ("q4_K", case-insensitive) or an id."""
    if isinstance(name_or_id, int):
        return name_or_id
    return TYPE_BY_NAME[name_or_id.lower()]


def type_name(tid):
    return GGML_TYPES[tid][0] if tid in GGML_TYPES else "type%d" % tid


def row_bytes(tid, n):
    """Bytes of a row of n elements of type tid."""
    _, blck, size = GGML_TYPES[tid]
    if n % blck:
        raise ValueError("%d elements is not a multiple of %s's block size %d" % (n, type_name(tid), blck))
    return n // blck * size


def pad(x, align):
    return (x + align - 1) // align * align


TensorInfo = namedtuple("TensorInfo", "name ne type offset nbytes data_offset")
# ne: tuple, ne[0] innermost. offset: relative to the data blob. data_offset: absolute.


class GGUFError(Exception):
    pass


class _Cursor:
    """Bounds-checked little-endian reader over a bytes-like object."""

    def __init__(self, buf):
        self.buf = buf
        self.pos = 0

    def take(self, n, what):
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError("truncated file reading %s at byte %d" % (what, self.pos))
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, fmt, what):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what):
        n = self.scalar("<Q", what + " length")
        return bytes(self.take(n, what)).decode("utf-8", errors="surrogateescape")


class GGUFFile:
    """A parsed GGUF file. Tensor data is memory-mapped, never copied up front."""

    def __init__(self, path, strict=True):
        self.path = path
        self.mm = np.memmap(path, dtype=np.uint8, mode="r")
        cur = _Cursor(self.mm)
        if bytes(cur.take(4, "magic")) != GGUF_MAGIC:
            raise GGUFError("%s: bad magic" % path)
        self.version = cur.scalar("<I", "version")
        if self.version & 0xFFFF == 0:
            raise GGUFError("version %#x: endianness mismatch" % self.version)
        if self.version not in (2, 3):
            raise GGUFError("unsupported GGUF version %d" % self.version)
        n_tensors = cur.scalar("<q", "n_tensors")
        n_kv = cur.scalar("<q", "n_kv")
        if n_tensors < 0 or n_kv < 0:
            raise GGUFError("negative counts")

        self.metadata = OrderedDict()
        self.kv_types = OrderedDict()  # key -> value type (arrays: (T_ARR, elem_type))
        for _ in range(n_kv):
            key = cur.string("key")
            vt = cur.scalar("<i", "value type of " + key)
            if key in self.metadata:
                raise GGUFError("duplicate key " + key)
            val, tdesc = self._read_value(cur, vt, key)
            self.metadata[key] = val
            self.kv_types[key] = tdesc

        self.alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in self.metadata:
            a = self.metadata["general.alignment"]
            if self.kv_types["general.alignment"] != T_U32 or a == 0 or a & (a - 1):
                raise GGUFError("general.alignment must be a u32 power of two")
            self.alignment = a

        infos = []
        for _ in range(n_tensors):
            name = cur.string("tensor name")
            n_dims = cur.scalar("<I", "n_dims of " + name)
            if not 1 <= n_dims <= 4:
                raise GGUFError("%s: n_dims %d" % (name, n_dims))
            ne = tuple(cur.scalar("<q", "ne of " + name) for _ in range(n_dims))
            t = cur.scalar("<i", "type of " + name)
            off = cur.scalar("<Q", "offset of " + name)
            if any(x < 0 for x in ne):
                raise GGUFError("%s: negative dim" % name)
            if t not in GGML_TYPES:
                raise GGUFError("%s: unknown ggml type %d" % (name, t))
            infos.append((name, ne, t, off))

        self.data_start = pad(cur.pos, self.alignment)
        self.tensors = OrderedDict()
        expect = 0
        for name, ne, t, off in infos:
            if name in self.tensors:
                raise GGUFError("duplicate tensor " + name)
            n = 1
            for x in ne:
                n *= x
            nbytes = row_bytes(t, ne[0]) * (n // ne[0]) if n else 0
            if off % self.alignment:
                raise GGUFError("%s: offset %d not aligned to %d" % (name, off, self.alignment))
            if strict and off != expect:
                raise GGUFError("%s: offset %d, llama.cpp expects %d" % (name, off, expect))
            expect = off + pad(nbytes, self.alignment)
            start = self.data_start + off
            if start + nbytes > len(self.mm):
                raise GGUFError("%s: data [%d, %d) past end of file (%d bytes)" %
                                (name, start, start + nbytes, len(self.mm)))
            self.tensors[name] = TensorInfo(name, ne, t, off, nbytes, start)

    @staticmethod
    def _read_value(cur, vt, key):
        if vt in _SCALAR:
            v = cur.scalar(_SCALAR[vt][0], key)
            return v, vt
        if vt == T_STR:
            return cur.string(key), vt
        if vt == T_ARR:
            et = cur.scalar("<i", "array type of " + key)
            n = cur.scalar("<Q", "array length of " + key)
            if et == T_ARR:
                raise GGUFError(key + ": nested arrays")
            if et == T_STR:
                return [cur.string(key) for _ in range(n)], (T_ARR, et)
            if et not in _SCALAR:
                raise GGUFError("%s: bad array element type %d" % (key, et))
            dt = np.dtype(_SCALAR[et][1])
            arr = np.frombuffer(bytes(cur.take(n * dt.itemsize, key)), dtype=dt)
            if et == T_BOOL:
                arr = arr.astype(bool)
            return arr, (T_ARR, et)
        raise GGUFError("%s: bad value type %d" % (key, vt))

    # ---- tensor access ----

    def raw(self, name):
        """The tensor's exact bytes as a read-only np.uint8 view."""
        ti = self.tensors[name]
        return self.mm[ti.data_offset:ti.data_offset + ti.nbytes]

    def array(self, name):
        """The tensor as float64 with numpy shape reversed(ne) (row-major: last axis = ne[0])."""
        from dequant_ref import dequantize  # local import: dequant_ref imports this module
        ti = self.tensors[name]
        n = 1
        for x in ti.ne:
            n *= x
        return dequantize(ti.type, self.raw(name), n).reshape(tuple(reversed(ti.ne)))

    def get(self, key, default=None):
        return self.metadata.get(key, default)


def _main(argv):
    """Debug dump: python3 gguf_ref.py FILE"""
    g = GGUFFile(argv[1])
    print("version %d, %d kv, %d tensors, alignment %d, data at %d" %
          (g.version, len(g.metadata), len(g.tensors), g.alignment, g.data_start))
    for k, v in g.metadata.items():
        s = repr(v)
        if len(s) > 80:
            s = s[:77] + "..."
        print("  %-50s %s" % (k, s))
    for ti in g.tensors.values():
        print("  %-40s %-6s %-24s off %d" % (ti.name, type_name(ti.type), ti.ne, ti.offset))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
