#!/usr/bin/env python3
"""make_corpus.py: write handcrafted GGUF files, valid and corrupt.

    make_corpus.py OUTDIR            corpus of bad (and a few good) files + OUTDIR/manifest.tsv
    make_corpus.py --seeds OUTDIR    small valid files, seeds for the GGUF fuzzer

manifest.tsv has one line per file: name <TAB> expected exit code of
`strata inspect` (0 or 1) <TAB> a substring the one-line error must contain
(empty for valid files). tests/cli/test_bad_gguf.sh runs it.

GGUF bytes are written here with struct, independently of the C writer,
following llama.cpp's layout (ggml/src/gguf.cpp): little-endian; "GGUF",
u32 version, i64 n_tensors, i64 n_kv, KV pairs (string key, i32 type, value),
tensor infos (string name, u32 n_dims, i64 ne[n_dims], i32 ggml type,
u64 offset), zero padding to the alignment, tensor data each padded to the
alignment. Standard library only.
"""
import os
import struct
import sys

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: '<B', I8: '<b', U16: '<H', I16: '<h', U32: '<I', I32: '<i', F32: '<f',
              BOOL: '<B', U64: '<Q', I64: '<q', F64: '<d'}

# ggml types used here: id -> (block size, bytes per block)
F32_T, F16_T, Q8_0_T, Q4_K_T = 0, 1, 8, 12
GGML = {F32_T: (1, 4), F16_T: (1, 2), Q8_0_T: (32, 34), Q4_K_T: (256, 144)}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack('<Q', len(b)) + b


def kv(key, typ, value):
    """One KV pair; value is a Python value for scalars/strings, or (elem_type, list) for arrays."""
    out = gstr(key) + struct.pack('<i', typ)
    return out + encode_value(typ, value)


def encode_value(typ, value):
    if typ == STR:
        return gstr(value)
    if typ == ARR:
        et, items = value
        out = struct.pack('<iQ', et, len(items))
        for it in items:
            out += encode_value(et, it)
        return out
    return struct.pack(SCALAR_FMT[typ], value)


def kv_raw(key, typ, payload):
    return gstr(key) + struct.pack('<i', typ) + payload


def nbytes(ggml_type, ne):
    blck, size = GGML[ggml_type]
    n = 1
    for d in ne:
        n *= d
    return n // blck * size


def pad(n, align):
    return (n + align - 1) // align * align


def tinfo(name, ne, ggml_type, offset, n_dims=None):
    nd = len(ne) if n_dims is None else n_dims
    out = gstr(name) + struct.pack('<I', nd)
    for d in ne:
        out += struct.pack('<q', d)
    return out + struct.pack('<iQ', ggml_type, offset)


def build(kvs, tensors, align=32, version=3, n_kv=None, n_tensors=None, data=True, raw_infos=None):
    """kvs: list of encoded KV bytes. tensors: list of (name, ne, type). Offsets
    follow llama.cpp's rule. raw_infos replaces the encoded tensor table."""
    head = b'GGUF' + struct.pack('<I', version)
    head += struct.pack('<q', len(tensors) if n_tensors is None else n_tensors)
    head += struct.pack('<q', len(kvs) if n_kv is None else n_kv)
    body = b''.join(kvs)
    off = 0
    infos = b''
    sizes = []
    for name, ne, typ in tensors:
        infos += tinfo(name, ne, typ, off)
        sizes.append(nbytes(typ, ne))
        off += pad(sizes[-1], align)
    if raw_infos is not None:
        infos = raw_infos
    out = head + body + infos
    if not data:
        return out
    if tensors:
        out += b'\0' * (pad(len(out), align) - len(out))
    for i, sz in enumerate(sizes):
        out += bytes((i * 31 + j) & 0xff for j in range(sz))
        out += b'\0' * (pad(sz, align) - sz)
    return out


# ==== Valid files ====

def moe_file(version=3):
    """A small qwen3moe-like file: 2 layers, 4 experts, layer 0 in q8_0 and
    layer 1 in f16, so the expert blobs differ (3264 and 6144 bytes)."""
    kvs = [
        kv('general.architecture', STR, 'qwen3moe'),
        kv('general.name', STR, 'corpus moe'),
        kv('qwen3moe.block_count', U32, 2),
        kv('qwen3moe.expert_count', U32, 4),
        kv('qwen3moe.expert_used_count', U32, 2),
        kv('qwen3moe.embedding_length', U32, 32),
        kv('qwen3moe.attention.layer_norm_rms_epsilon', F32, 1e-6),
        kv('tokenizer.ggml.tokens', ARR, (STR, ['tok%d' % i for i in range(20)])),
        kv('tokenizer.ggml.scores', ARR, (F32, [float(-i) for i in range(20)])),
    ]
    tensors = [('token_embd.weight', [32, 20], F32_T), ('output_norm.weight', [32], F32_T)]
    for layer, typ in ((0, Q8_0_T), (1, F16_T)):
        tensors.append(('blk.%d.attn_norm.weight' % layer, [32], F32_T))
        tensors.append(('blk.%d.ffn_gate_inp.weight' % layer, [32, 4], F32_T))
        for part in ('gate', 'up', 'down'):
            tensors.append(('blk.%d.ffn_%s_exps.weight' % (layer, part), [32, 32, 4], typ))
    return build(kvs, tensors, version=version)


def all_types_file():
    kvs = [
        kv('general.architecture', STR, 'test'),
        kv('t.u8', U8, 200), kv('t.i8', I8, -100), kv('t.u16', U16, 60000), kv('t.i16', I16, -30000),
        kv('t.u32', U32, 4000000000), kv('t.i32', I32, -2000000000), kv('t.f32', F32, 0.5),
        kv('t.bool', BOOL, 1), kv('t.u64', U64, 2**63), kv('t.i64', I64, -2**62), kv('t.f64', F64, 0.1),
        kv('t.str', STR, 'hello\nworld'),
        kv('a.u8', ARR, (U8, [1, 2, 3])), kv('a.i16', ARR, (I16, [-1, 1])),
        kv('a.u64', ARR, (U64, [1, 2**64 - 1])), kv('a.f64', ARR, (F64, [1.5])),
        kv('a.bool', ARR, (BOOL, [1, 0])), kv('a.str', ARR, (STR, ['a', '', 'c'])),
        kv('a.empty', ARR, (I32, [])),
    ]
    return build(kvs, [('x.weight', [32, 2], Q8_0_T), ('y.weight', [3], F32_T)])


def small_file(align=32, version=3):
    kvs = [kv('general.architecture', STR, 'qwen3moe')]
    if align != 32:
        kvs.append(kv('general.alignment', U32, align))
    kvs.append(kv('qwen3moe.block_count', U32, 1))
    return build(kvs, [('a.weight', [4], F32_T), ('blk.0.ffn_up_exps.weight', [4, 2, 2], F32_T)],
                 align=align, version=version)


def no_tensor_file():
    return build([kv('general.architecture', STR, 'none'), kv('k', U32, 1)], [])


# ==== Corrupt files ====

def trunc_base():
    """Layout used for the truncation cases; returns (bytes, landmarks)."""
    kv0 = kv('general.architecture', STR, 'qwen3moe')
    kv1 = kv('general.name', STR, 'x' * 300)
    kv2 = kv('general.alignment', U32, 32)
    tensors = [('a.weight', [64], F32_T), ('b.weight', [64], F32_T)]
    data = build([kv0, kv1, kv2], tensors)
    kv1_off = 24 + len(kv0)
    marks = {
        'kv1_type': kv1_off + 8 + len('general.name'),
        'kv1_value': kv1_off + 8 + len('general.name') + 4 + 8,
    }
    table = 24 + len(kv0) + len(kv1) + len(kv2)
    t0 = len(tinfo('a.weight', [64], F32_T, 0))
    marks['t1_ne'] = table + t0 + 8 + len('b.weight') + 4
    table_end = table + t0 + len(tinfo('b.weight', [64], F32_T, 256))
    marks['table_end'] = table_end
    marks['data'] = pad(table_end, 32)
    return data, marks


def corrupt_cases():
    cases = []   # (name, bytes, expected substring)

    def add(name, data, sub):
        cases.append((name, data, sub))

    good_kvs = [kv('general.architecture', STR, 'qwen3moe')]
    two = [('a.weight', [64], F32_T), ('b.weight', [64], F32_T)]

    base, m = trunc_base()
    add('empty', b'', 'truncated: magic')
    add('trunc_magic', base[:2], 'truncated: magic')
    add('trunc_header', base[:12], 'truncated: n_tensors')
    add('trunc_counts', base[:20], 'truncated: n_kv')
    add('trunc_mid_kv', base[:m['kv1_type'] + 2], "kv #1 'general.name': truncated: value type")
    add('trunc_mid_string', base[:m['kv1_value'] + 100], "kv #1 'general.name': truncated: value needs 300 bytes")
    add('trunc_mid_tensor_table', base[:m['t1_ne'] + 3], "tensor 'b.weight' (#1): truncated: ne")
    add('trunc_in_padding', base[:m['table_end'] + 1], 'beyond end of file')
    add('trunc_mid_data', base[:m['data'] + 256 + 100], "tensor 'b.weight' (#1): data [off")
    add('data_short', base[:m['data'] + 100], "tensor 'a.weight' (#0): data [off")

    ok = build(good_kvs, two)
    add('bad_magic', b'GGUX' + ok[4:], "bad magic 'GGUX'")
    add('version_1', ok[:4] + struct.pack('<I', 1) + ok[8:], 'version 1')
    add('version_4', ok[:4] + struct.pack('<I', 4) + ok[8:], 'version 4')
    add('version_0', ok[:4] + struct.pack('<I', 0) + ok[8:], 'version 0')
    add('version_byteswapped', ok[:4] + struct.pack('>I', 3) + ok[8:], 'byte order mismatch')
    add('n_kv_absurd', build(good_kvs, two, n_kv=2**62), 'n_kv 4611686018427387904')
    add('n_tensors_absurd', build(good_kvs, two, n_tensors=2**62), 'n_tensors 4611686018427387904')
    add('n_kv_negative', build(good_kvs, two, n_kv=-1), 'n_kv -1')
    add('n_kv_too_many', build(good_kvs, two, n_kv=1000), 'n_kv 1000 at byte offset 16 cannot fit')
    add('key_length_absurd', build([struct.pack('<Q', 2**62) + b'general'], two),
        'key length 4611686018427387904')
    add('string_length_absurd', build([kv_raw('general.name', STR, struct.pack('<Q', 2**62) + b'abc')], two),
        "kv #0 'general.name': value length 4611686018427387904")
    add('array_length_absurd',
        build([kv_raw('tokenizer.ggml.scores', ARR, struct.pack('<iQ', F32, 2**62) + b'\0' * 16)], two),
        'length 4611686018427387904')
    add('array_length_too_long',
        build([kv_raw('tokenizer.ggml.scores', ARR, struct.pack('<iQ', F32, 100000) + b'\0' * 16)], two),
        "kv #0 'tokenizer.ggml.scores': array of f32: length 100000")
    add('string_array_absurd',
        build([kv_raw('tokenizer.ggml.tokens', ARR, struct.pack('<iQ', STR, 2**61) + b'\0' * 16)], two),
        'array of string: length 2305843009213693952')
    add('nested_array', build([kv_raw('x.nested', ARR, struct.pack('<iQ', ARR, 1) + struct.pack('<iQ', U8, 1) + b'\1')],
                              two), 'nested array')
    add('bad_value_type', build([kv_raw('x.bad', 13, b'\0' * 8)], two), "kv #0 'x.bad': unknown value type 13")
    add('bad_value_type_negative', build([kv_raw('x.bad', -1, b'\0' * 8)], two), 'unknown value type -1')
    add('bad_array_elem_type', build([kv_raw('x.bad', ARR, struct.pack('<iQ', 99, 1) + b'\0' * 8)], two),
        'unknown array element type 99')
    add('empty_key', build([kv('', U32, 1)], two), 'empty key')
    add('duplicate_key', build([kv('general.architecture', STR, 'a'), kv('k', U8, 1),
                                kv('general.architecture', STR, 'b')], two),
        "kv #2 'general.architecture': duplicate key (first defined as kv #0)")
    add('duplicate_tensor', build(good_kvs, [('a.weight', [64], F32_T), ('a.weight', [64], F32_T)]),
        "tensor 'a.weight' (#1): duplicate tensor name")
    add('tensor_name_too_long', build(good_kvs, [('n' * 64, [64], F32_T)]), 'too long')

    def with_infos(infos, extra=4096):
        # header with a hand-made tensor table and enough data bytes after it
        return build(good_kvs, [], n_tensors=len(infos), raw_infos=b''.join(infos)) + b'\0' * extra

    add('n_dims_0', with_infos([tinfo('a.weight', [], F32_T, 0)]), "tensor 'a.weight' (#0): n_dims 0")
    add('n_dims_5', with_infos([tinfo('a.weight', [1, 1, 1, 1, 1], F32_T, 0)]), 'n_dims 5')
    add('ne_negative', with_infos([tinfo('a.weight', [4, -5], F32_T, 0)]), 'ne[1] = -5')
    add('ne_overflow', with_infos([tinfo('a.weight', [2**32, 2**32], F32_T, 0)]), 'overflows int64')
    add('bytes_overflow', with_infos([tinfo('a.weight', [2**62, 1], F32_T, 0)]), 'byte size of shape')
    add('ne0_not_block_multiple', with_infos([tinfo('a.weight', [100, 2], Q4_K_T, 0)]),
        "ne[0] = 100 is not a multiple of q4_K's block size 256")
    add('unknown_ggml_type', with_infos([tinfo('a.weight', [4], 77, 0)]), 'unknown ggml type id 77')
    add('removed_ggml_type_4', with_infos([tinfo('a.weight', [32], 4, 0)]), 'unknown ggml type id 4')
    add('offset_past_end', with_infos([tinfo('a.weight', [64], F32_T, 0), tinfo('b.weight', [64], F32_T, 2**40)]),
        "tensor 'b.weight' (#1): data [off")
    add('offset_overflow', with_infos([tinfo('a.weight', [64], F32_T, 2**64 - 32)]), 'overflows')
    add('offset_breaks_padding', with_infos([tinfo('a.weight', [64], F32_T, 0), tinfo('b.weight', [64], F32_T, 288)]),
        'breaks the padding rule: expected 256')
    add('offset_first_not_zero', with_infos([tinfo('a.weight', [64], F32_T, 32)]), 'breaks the padding rule: expected 0')
    add('offset_misaligned', with_infos([tinfo('a.weight', [64], F32_T, 0), tinfo('b.weight', [64], F32_T, 260)]),
        'misaligned')
    add('offset_overlap', with_infos([tinfo('a.weight', [64], F32_T, 0), tinfo('b.weight', [64], F32_T, 0)]),
        'breaks the padding rule: expected 256')

    def with_align(kvx):
        return build(good_kvs + [kvx], two)
    add('alignment_zero', with_align(kv('general.alignment', U32, 0)), 'alignment 0')
    add('alignment_not_pow2', with_align(kv('general.alignment', U32, 48)), 'alignment 48')
    add('alignment_wrong_type_str', with_align(kv('general.alignment', STR, '32')),
        "kv #1 'general.alignment': expected u32, got string at byte offset")
    add('alignment_wrong_type_u64', with_align(kv('general.alignment', U64, 32)), 'expected u32, got u64')
    add('alignment_array', with_align(kv('general.alignment', ARR, (U32, [32]))), 'expected u32, got array of u32')
    return cases


def main(argv):
    if len(argv) == 3 and argv[1] == '--seeds':
        out = argv[2]
        os.makedirs(out, exist_ok=True)
        seeds = {
            'small.gguf': small_file(),
            'small_v2.gguf': small_file(version=2),
            'align64.gguf': small_file(align=64),
            'align1.gguf': small_file(align=1),
            'no_tensors.gguf': no_tensor_file(),
            'all_types.gguf': all_types_file(),
        }
        for name, data in seeds.items():
            with open(os.path.join(out, name), 'wb') as f:
                f.write(data)
        return 0
    if len(argv) != 2 or argv[1].startswith('-'):
        sys.stderr.write('usage: make_corpus.py OUTDIR | --seeds OUTDIR\n')
        return 2
    out = argv[1]
    os.makedirs(out, exist_ok=True)
    rows = []
    valid = {
        'valid_moe.gguf': moe_file(),
        'valid_moe_v2.gguf': moe_file(version=2),
        'valid_all_types.gguf': all_types_file(),
        'valid_no_tensors.gguf': no_tensor_file(),
        'valid_align64.gguf': small_file(align=64),
    }
    for name, data in valid.items():
        with open(os.path.join(out, name), 'wb') as f:
            f.write(data)
        rows.append((name, 0, ''))
    for name, data, sub in corrupt_cases():
        fn = 'bad_%s.gguf' % name
        with open(os.path.join(out, fn), 'wb') as f:
            f.write(data)
        rows.append((fn, 1, sub))
    with open(os.path.join(out, 'manifest.tsv'), 'w') as f:
        for name, code, sub in rows:
            assert '\t' not in sub and '\n' not in sub
            f.write('%s\t%d\t%s\n' % (name, code, sub))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
