"""make_model: writes a small random qwen3moe GGUF with its own GGUF writer.

A second, independent model source for the oracle: strata must read GGUF
files it did not write itself (`strata mkmodel` is the first source). Weights
are Gaussian, quantized with quant_ref.py (ggml's exact reference quantizers
for F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0/Q5_1, simple valid packers for the K-quants).

    python3 tests/ref/make_model.py OUT.gguf [--seed N] [--type T]
        [--type-experts T] [--type-attn T] [--type-embd T] [--type-output T]
        [--type-router T] [--layers N] [--experts N] [--experts-used N]
        [--embd N] [--heads N] [--heads-kv N] [--head-dim N] [--ff-exp N]
        [--vocab N] [--tied] [--alignment N] [--fused-qkv] [--rope-base F]

Types default to f32 (`--type` sets all matrices; the specific flags win).
Norm weights are always f32, as llama.cpp writes them.
"""

import argparse
import struct
import sys

import numpy as np

from gguf_ref import GGML_TYPES, type_id, pad
from quant_ref import any_quantize

# GGUF value types (FORMATS.md section 2).
GT_U32, GT_I32, GT_F32, GT_BOOL, GT_STR, GT_ARR = 4, 5, 6, 7, 8, 9


class GGUFWriter:
    """Collects metadata and tensors, then writes a GGUF v3 file."""

    def __init__(self, alignment=32):
        self.kv = []        # (key, type, value[, elem_type])
        self.tensors = []   # (name, ne, ggml_type, bytes)
        self.alignment = alignment
        if alignment != 32:
            self.add("general.alignment", GT_U32, alignment)

    def add(self, key, vtype, value, elem_type=None):
        self.kv.append((key, vtype, value, elem_type))

    def add_tensor(self, name, ne, tid, data):
        data = np.asarray(data, np.uint8).reshape(-1)
        _, blck, size = GGML_TYPES[tid]
        n = int(np.prod(ne))
        assert ne[0] % blck == 0 and data.size == n // blck * size, name
        self.tensors.append((name, tuple(int(x) for x in ne), tid, data.tobytes()))

    @staticmethod
    def _str(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def _value(self, vtype, v, et):
        if vtype == GT_STR:
            return self._str(v)
        if vtype == GT_ARR:
            out = struct.pack("<iQ", et, len(v))
            if et == GT_STR:
                return out + b"".join(self._str(s) for s in v)
            fmt = {GT_I32: "<i", GT_U32: "<I", GT_F32: "<f", GT_BOOL: "<?"}[et]
            return out + b"".join(struct.pack(fmt, x) for x in v)
        fmt = {GT_U32: "<I", GT_I32: "<i", GT_F32: "<f", GT_BOOL: "<?"}[vtype]
        return struct.pack(fmt, v)

    def write(self, path):
        out = bytearray(b"GGUF" + struct.pack("<Iqq", 3, len(self.tensors), len(self.kv)))
        for key, vtype, v, et in self.kv:
            out += self._str(key) + struct.pack("<i", vtype) + self._value(vtype, v, et)
        off = 0
        for name, ne, tid, data in self.tensors:
            out += self._str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<q", x) for x in ne)
            out += struct.pack("<iQ", tid, off)
            off += pad(len(data), self.alignment)
        out += b"\0" * (pad(len(out), self.alignment) - len(out))
        for _, _, _, data in self.tensors:
            out += data + b"\0" * (pad(len(data), self.alignment) - len(data))
        with open(path, "wb") as f:
            f.write(out)


def _byte_unicode():
    """GPT-2's byte -> printable unicode char table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_vocab(n_vocab, rng):
    """A valid byte-level BPE vocabulary: 256 byte tokens, merged tokens from
    random merges of ASCII-ish tokens, and 3 control tokens at the end."""
    bu = _byte_unicode()
    tokens = [bu[b] for b in range(256)]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    seen = set(tokens)
    merges = []
    base = [bu[b] for b in range(ord("a"), ord("z") + 1)] + [bu[ord(" ")]]
    pool = list(base)
    while len(tokens) < n_vocab - len(specials):
        a, b = pool[rng.integers(len(pool))], pool[rng.integers(len(pool))]
        t = a + b
        if t in seen or len(t) > 8:
            continue
        seen.add(t)
        tokens.append(t)
        merges.append(a + " " + b)
        pool.append(t)
    tokens += specials
    types = [1] * (len(tokens) - len(specials)) + [3] * len(specials)
    return tokens, types, merges


def build(args):
    rng = np.random.default_rng(args.seed)
    E, H, Hkv, D = args.embd, args.heads, args.heads_kv, args.head_dim
    F, X, K, L, V = args.ff_exp, args.experts, args.experts_used, args.layers, args.vocab
    base = args.type or "f32"
    t_attn = type_id(args.type_attn or base)
    t_exp = type_id(args.type_experts or base)
    t_embd = type_id(args.type_embd or base)
    t_out = type_id(args.type_output or base)
    t_router = type_id(args.type_router or "f32")

    w = GGUFWriter(args.alignment)
    a = "qwen3moe"
    w.add("general.architecture", GT_STR, a)
    w.add("general.name", GT_STR, "oracle make_model seed %d" % args.seed)
    w.add("general.quantization_version", GT_U32, 2)
    w.add(a + ".context_length", GT_U32, 2048)
    w.add(a + ".embedding_length", GT_U32, E)
    w.add(a + ".block_count", GT_U32, L)
    w.add(a + ".feed_forward_length", GT_U32, F * K)
    w.add(a + ".attention.head_count", GT_U32, H)
    w.add(a + ".attention.head_count_kv", GT_U32, Hkv)
    w.add(a + ".attention.key_length", GT_U32, D)
    w.add(a + ".attention.value_length", GT_U32, D)
    w.add(a + ".attention.layer_norm_rms_epsilon", GT_F32, 1e-6)
    w.add(a + ".rope.freq_base", GT_F32, args.rope_base)
    w.add(a + ".expert_count", GT_U32, X)
    w.add(a + ".expert_used_count", GT_U32, K)
    w.add(a + ".expert_feed_forward_length", GT_U32, F)
    tokens, types, merges = make_vocab(V, rng)
    w.add("tokenizer.ggml.model", GT_STR, "gpt2")
    w.add("tokenizer.ggml.pre", GT_STR, "qwen2")
    w.add("tokenizer.ggml.tokens", GT_ARR, tokens, GT_STR)
    w.add("tokenizer.ggml.token_type", GT_ARR, types, GT_I32)
    w.add("tokenizer.ggml.merges", GT_ARR, merges, GT_STR)
    w.add("tokenizer.ggml.eos_token_id", GT_U32, V - 3)
    w.add("tokenizer.ggml.bos_token_id", GT_U32, V - 3)
    w.add("tokenizer.ggml.padding_token_id", GT_U32, V - 3)
    w.add("tokenizer.ggml.add_bos_token", GT_BOOL, False)

    def mat(name, ne, tid, std):
        x = (rng.standard_normal(int(np.prod(ne))) * std).astype(np.float32)
        w.add_tensor(name, ne, tid, any_quantize(tid, x))

    def norm(name, n):
        x = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        w.add_tensor(name, (n,), 0, x.view(np.uint8))

    mat("token_embd.weight", (E, V), t_embd, 1.0)
    norm("output_norm.weight", E)
    if not args.tied:
        mat("output.weight", (E, V), t_out, 2.0 / np.sqrt(E))
    for i in range(L):
        p = "blk.%d." % i
        norm(p + "attn_norm.weight", E)
        if args.fused_qkv:
            mat(p + "attn_qkv.weight", (E, (H + 2 * Hkv) * D), t_attn, 1.0 / np.sqrt(E))
        else:
            mat(p + "attn_q.weight", (E, H * D), t_attn, 1.0 / np.sqrt(E))
            mat(p + "attn_k.weight", (E, Hkv * D), t_attn, 1.0 / np.sqrt(E))
            mat(p + "attn_v.weight", (E, Hkv * D), t_attn, 1.0 / np.sqrt(E))
        norm(p + "attn_q_norm.weight", D)
        norm(p + "attn_k_norm.weight", D)
        mat(p + "attn_output.weight", (H * D, E), t_attn, 1.0 / np.sqrt(H * D))
        norm(p + "ffn_norm.weight", E)
        mat(p + "ffn_gate_inp.weight", (E, X), t_router, 2.0 / np.sqrt(E))
        mat(p + "ffn_gate_exps.weight", (E, F, X), t_exp, 1.0 / np.sqrt(E))
        mat(p + "ffn_up_exps.weight", (E, F, X), t_exp, 1.0 / np.sqrt(E))
        mat(p + "ffn_down_exps.weight", (F, E, X), t_exp, 1.0 / np.sqrt(F))
    return w


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=1)
    for t in ("type", "type-experts", "type-attn", "type-embd", "type-output", "type-router"):
        p.add_argument("--" + t)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--experts-used", type=int, default=2)
    p.add_argument("--embd", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--heads-kv", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--ff-exp", type=int, default=256)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--tied", action="store_true")
    p.add_argument("--alignment", type=int, default=32)
    p.add_argument("--fused-qkv", action="store_true")
    p.add_argument("--rope-base", type=float, default=1000000.0)
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv[1:])
    build(args).write(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
