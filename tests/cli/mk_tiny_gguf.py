#!/usr/bin/env python3
"""mk_tiny_gguf: write a tiny qwen3moe GGUF (f32 or f16 weights) with the
Python standard library only, plus deliberately broken variants, for
tests/cli/test_run.sh. `strata mkmodel` makes the real test models; this
script exists for the broken files (wrong architecture, missing tensor,
wrong shape, truncated data) and as a fallback while mkmodel is absent.

    mk_tiny_gguf.py OUT.gguf [--seed N] [--type f32|f16] [--tied]
                    [--arch NAME] [--drop TENSOR] [--bad-shape TENSOR]
                    [--truncate BYTES] [--layers N]

Layout follows GGUF v3 as llama.cpp writes it: KV pairs, tensor infos with
offsets sum(PAD(bytes, 32)), zero padding, data. The vocabulary is GPT-2
byte-level BPE (pre-tokenizer qwen2): 256 byte tokens, a few merges and the
ChatML specials; the chat template is ChatML.
"""

import random
import struct
import sys

ALIGN = 32
GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STR, GGUF_ARR = 4, 5, 6, 7, 8, 9

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def byte_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def vocab():
    b2u = byte_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    types = [1] * 256
    merges = []
    text = "the cat sat on the mat and the dog ran to the hat then the man ate the jam"
    words = [[b2u[c] for c in (" " + w if i else w).encode()] for i, w in enumerate(text.split())]
    for _ in range(24):   # a few rounds of byte-pair merging over the text
        pairs = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + 1
        if not pairs:
            break
        (a, b), _c = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(a + " " + b)
        tokens.append(a + b)
        types.append(1)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                i += 1
    for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        tokens.append(s)
        types.append(3)
    return tokens, types, merges


class Writer:
    def __init__(self):
        self.kv = []
        self.tensors = []

    def add(self, key, vtype, value):
        self.kv.append((key, vtype, value))

    def tensor(self, name, ne, data, ttype):
        self.tensors.append((name, ne, data, ttype))

    @staticmethod
    def s(x):
        b = x.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def value(self, vtype, v):
        if vtype == GGUF_U32:
            return struct.pack("<I", v)
        if vtype == GGUF_I32:
            return struct.pack("<i", v)
        if vtype == GGUF_F32:
            return struct.pack("<f", v)
        if vtype == GGUF_BOOL:
            return struct.pack("<B", 1 if v else 0)
        if vtype == GGUF_STR:
            return self.s(v)
        if vtype == GGUF_ARR:
            etype, items = v
            return struct.pack("<iQ", etype, len(items)) + b"".join(self.value(etype, x) for x in items)
        raise ValueError(vtype)

    def write(self, path, truncate=0):
        out = bytearray(b"GGUF")
        out += struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))
        for key, vtype, v in self.kv:
            out += self.s(key) + struct.pack("<i", vtype) + self.value(vtype, v)
        off = 0
        blobs = []
        for name, ne, data, ttype in self.tensors:
            out += self.s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<q", n) for n in ne)
            out += struct.pack("<iQ", ttype, off)
            blobs.append(data)
            off += (len(data) + ALIGN - 1) // ALIGN * ALIGN
        out += b"\0" * ((-len(out)) % ALIGN)
        for data in blobs:
            out += data + b"\0" * ((-len(data)) % ALIGN)
        if truncate:
            out = out[:len(out) - truncate]
        with open(path, "wb") as f:
            f.write(out)


def main(argv):
    args = argv[1:]
    opts = {"--seed": "1", "--type": "f32", "--arch": "qwen3moe", "--drop": None, "--bad-shape": None,
            "--truncate": "0", "--layers": "2"}
    flags = {"--tied": False}
    pos = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in opts:
            opts[a] = args[i + 1]
            i += 2
        elif a in flags:
            flags[a] = True
            i += 1
        else:
            pos.append(a)
            i += 1
    if len(pos) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    rng = random.Random(int(opts["--seed"]))
    ttype = {"f32": 0, "f16": 1}[opts["--type"]]
    L, E, H, HKV, D, X, K, F = int(opts["--layers"]), 64, 4, 2, 16, 8, 2, 32
    tokens, types, merges = vocab()
    V = len(tokens)
    arch = opts["--arch"]

    w = Writer()
    w.add("general.architecture", GGUF_STR, arch)
    w.add("general.name", GGUF_STR, "tiny test model")
    w.add(arch + ".block_count", GGUF_U32, L)
    w.add(arch + ".context_length", GGUF_U32, 256)
    w.add(arch + ".embedding_length", GGUF_U32, E)
    w.add(arch + ".feed_forward_length", GGUF_U32, 96)
    w.add(arch + ".attention.head_count", GGUF_U32, H)
    w.add(arch + ".attention.head_count_kv", GGUF_U32, HKV)
    w.add(arch + ".attention.key_length", GGUF_U32, D)
    w.add(arch + ".attention.value_length", GGUF_U32, D)
    w.add(arch + ".attention.layer_norm_rms_epsilon", GGUF_F32, 1e-6)
    w.add(arch + ".rope.freq_base", GGUF_F32, 1000000.0)
    w.add(arch + ".expert_count", GGUF_U32, X)
    w.add(arch + ".expert_used_count", GGUF_U32, K)
    w.add(arch + ".expert_feed_forward_length", GGUF_U32, F)
    w.add("tokenizer.ggml.model", GGUF_STR, "gpt2")
    w.add("tokenizer.ggml.pre", GGUF_STR, "qwen2")
    w.add("tokenizer.ggml.tokens", GGUF_ARR, (GGUF_STR, tokens))
    w.add("tokenizer.ggml.token_type", GGUF_ARR, (GGUF_I32, types))
    w.add("tokenizer.ggml.merges", GGUF_ARR, (GGUF_STR, merges))
    w.add("tokenizer.ggml.eos_token_id", GGUF_U32, tokens.index("<|endoftext|>"))
    w.add("tokenizer.ggml.bos_token_id", GGUF_U32, tokens.index("<|endoftext|>"))
    w.add("tokenizer.ggml.add_bos_token", GGUF_BOOL, False)
    w.add("tokenizer.chat_template", GGUF_STR, CHATML)

    def mat(name, ne, scale=None, norm=False):
        n = 1
        for x in ne:
            n *= x
        if norm:
            vals = [1.0 + rng.gauss(0.0, 0.05) for _ in range(n)]
            fmt, tt = "<%df" % n, 0
        else:
            s = scale if scale is not None else 1.0 / (ne[0] ** 0.5)
            vals = [rng.gauss(0.0, s) for _ in range(n)]
            fmt, tt = ("<%df" if ttype == 0 else "<%de") % n, ttype
        if name == opts["--drop"]:
            return
        if name == opts["--bad-shape"]:
            ne = [ne[0], ne[1] // 2] + list(ne[2:]) if len(ne) > 1 else [ne[0] // 2]
            vals = vals[:len(vals) // 2]
            fmt = fmt.replace(str(n), str(len(vals)))
        w.tensor(name, list(ne), struct.pack(fmt, *vals), tt)

    mat("token_embd.weight", [E, V], scale=1.0)
    mat("output_norm.weight", [E], norm=True)
    if not flags["--tied"]:
        mat("output.weight", [E, V])
    for l in range(L):
        p = "blk.%d." % l
        mat(p + "attn_norm.weight", [E], norm=True)
        mat(p + "attn_q.weight", [E, H * D])
        mat(p + "attn_k.weight", [E, HKV * D])
        mat(p + "attn_v.weight", [E, HKV * D])
        mat(p + "attn_output.weight", [H * D, E], scale=0.5 / (H * D) ** 0.5)
        mat(p + "attn_k_norm.weight", [D], norm=True)
        mat(p + "attn_q_norm.weight", [D], norm=True)
        mat(p + "ffn_norm.weight", [E], norm=True)
        mat(p + "ffn_gate_inp.weight", [E, X], scale=1.0)
        mat(p + "ffn_gate_exps.weight", [E, F, X])
        mat(p + "ffn_down_exps.weight", [F, E, X], scale=0.5 / F ** 0.5)
        mat(p + "ffn_up_exps.weight", [E, F, X])
    w.write(pos[0], truncate=int(opts["--truncate"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
