#!/usr/bin/env python3
"""make_vocab: build small but real tokenizer-only GGUF files for the golden
tokenizer tests, deterministically (same bytes on every run and machine).

  make_vocab.py --out DIR [--hf]

writes into DIR:
  qwen2.gguf   byte-level BPE, pre "qwen2": the 256 byte symbols, merges
               learned by BPE training on tests/golden/corpus.txt (English,
               code, CJK, Greek, Cyrillic...), ChatML specials <|endoftext|>
               <|im_start|> <|im_end|> (CONTROL) and <think> </think>
               (USER_DEFINED), Qwen's ChatML tokenizer.chat_template
  llama3.gguf  byte-level BPE, pre "llama-bpe" (ignore_merges, BOS on), merges
               trained with the llama3 split (digits in threes), a few extra
               whole-word tokens that only ignore_merges reaches, Llama 3
               specials and chat template
  spm.gguf     SentencePiece ("llama" model, as Mixtral): <unk> <s> </s>, the
               256 <0xXX> byte tokens, pieces learned on U+2581-escaped text
               with scores (-merge index), Mixtral's [INST] chat template
  dsv3.gguf    qwen2.gguf's vocabulary with pre "deepseek-v3"
  gpt4o.gguf   qwen2.gguf's vocabulary with pre "gpt-4o"
  nopre.gguf   qwen2.gguf's vocabulary without tokenizer.ggml.pre (llama.cpp
               falls back to its "default" pre-tokenizer, with a warning)
and with --hf, next to qwen2.gguf and llama3.gguf, a HuggingFace
tokenizer.json (qwen2.tokenizer.json, llama3.tokenizer.json) describing the
same tokenizer, for checking with the `tokenizers` library elsewhere.

Standard library + `regex` only. The pre-tokenizer regexes come from
bpe_ref.py (the reference tokenizer), which is what splits text for training.
"""
import argparse
import heapq
import json
import os
import struct
import sys
from collections import Counter, defaultdict

import regex

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bpe_ref  # noqa: E402

T_NORMAL, T_UNKNOWN, T_CONTROL, T_USER, T_BYTE = 1, 2, 3, 4, 6

# ---------------------------------------------------------------- GGUF ----

GT_U32, GT_I32, GT_F32, GT_BOOL, GT_STR, GT_ARR = 4, 5, 6, 7, 8, 9


def _str(b):
    if isinstance(b, str):
        b = b.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _val(t, v):
    if t == GT_U32:
        return struct.pack("<I", v)
    if t == GT_I32:
        return struct.pack("<i", v)
    if t == GT_F32:
        return struct.pack("<f", v)
    if t == GT_BOOL:
        return struct.pack("<B", 1 if v else 0)
    if t == GT_STR:
        return _str(v)
    raise ValueError(t)


def write_gguf(path, kvs):
    """kvs: list of (key, type, value); arrays are (key, (GT_ARR, elem_type), list)."""
    out = bytearray(b"GGUF" + struct.pack("<Iqq", 3, 0, len(kvs)))
    for key, t, v in kvs:
        out += _str(key)
        if isinstance(t, tuple):
            et = t[1]
            out += struct.pack("<iiQ", GT_ARR, et, len(v))
            for x in v:
                out += _val(et, x)
        else:
            out += struct.pack("<i", t) + _val(t, v)
    out += b"\0" * (-len(out) % 32)   # pad to the default alignment: an empty data section
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(out)
    os.replace(tmp, path)


# ------------------------------------------------------------ training ----

def train_bpe(word_counts, n_merges, min_count=2):
    """Classic BPE training on {word (tuple of symbols): count}. Picks the most
    frequent adjacent pair, ties broken by the smallest pair (so the result
    is deterministic), merges it everywhere, repeats. Incremental: only words
    that contain the pair are touched."""
    words = [list(w) for w in word_counts]
    freq = [word_counts[w] for w in word_counts]
    counts = defaultdict(int)
    where = defaultdict(set)
    for wi, syms in enumerate(words):
        for a, b in zip(syms, syms[1:]):
            counts[(a, b)] += freq[wi]
            where[(a, b)].add(wi)
    heap = [(-c, p) for p, c in counts.items()]
    heapq.heapify(heap)
    merges = []
    while heap and len(merges) < n_merges:
        negc, pair = heapq.heappop(heap)
        c = counts.get(pair, 0)
        if c != -negc or c == 0:
            continue   # stale entry: the current count has its own entry
        if c < min_count:
            break
        merges.append(pair)
        new = pair[0] + pair[1]
        touched = set()
        for wi in sorted(where.pop(pair, ())):
            syms = words[wi]
            f = freq[wi]
            for a, b in zip(syms, syms[1:]):
                counts[(a, b)] -= f
                touched.add((a, b))
            out = []
            i = 0
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == pair[0] and syms[i + 1] == pair[1]:
                    out.append(new)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            words[wi] = out
            for a, b in zip(out, out[1:]):
                counts[(a, b)] += f
                where[(a, b)].add(wi)
                touched.add((a, b))
        counts.pop(pair, None)
        for p in touched:
            if p != pair and counts.get(p, 0) > 0:
                heapq.heappush(heap, (-counts[p], p))
    return merges


CRUDE_SPLIT = regex.compile(r" ?\S+|\s+")


def byte_level_words(text, pre_kind):
    """Count the byte-mapped pieces of text: those of the pre-tokenizer, plus
    those of a cruder whitespace split, so that the vocabulary also holds
    merges across the pre-tokenizer's boundaries (" 123", ".\n", " ~~"): a
    pre-tokenizer that cuts differently then yields different ids, which is
    what makes the golden ids sensitive to the splitting."""
    cpts = [ord(c) for c in text]
    c = Counter()
    pieces = [bpe_ref.cpts_to_bytes(p) for p in bpe_ref.pre_split(pre_kind, cpts)]
    pieces += [m.encode() for m in CRUDE_SPLIT.findall(text)]
    for piece in pieces:
        c[tuple(bpe_ref.BYTE_ENC[b] for b in piece)] += 1
    return c


def byte_symbols():
    """The 256 byte symbols in GPT-2's order (printable bytes first)."""
    enc = bpe_ref.BYTE_ENC
    order = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    order += [b for b in range(256) if b not in order]
    return [enc[b] for b in order]


def bpe_vocab(corpus, pre_kind, n_merges, extra_words=()):
    merges = train_bpe(byte_level_words(corpus, pre_kind), n_merges)
    tokens = byte_symbols()
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen:
            seen.add(a + b)
            tokens.append(a + b)
    for w in extra_words:
        mapped = "".join(bpe_ref.BYTE_ENC[b] for b in w.encode())
        if mapped not in seen:
            seen.add(mapped)
            tokens.append(mapped)
    return tokens, ["%s %s" % m for m in merges]


def spm_vocab(corpus, n_merges):
    """SentencePiece-style pieces: words are U+2581-prefixed runs, symbols are
    characters; scores are -(merge index), single characters (seen at least
    twice) come after the merged pieces. Rarer characters are left to the
    byte tokens."""
    wc = Counter()
    chars = Counter()
    for line in corpus.splitlines():
        s = "\u2581" + line.replace(" ", "\u2581")
        for w in regex.findall("\u2581[^\u2581]*|[^\u2581]+", s):
            wc[tuple(w)] += 1
            chars.update(w)
    merges = train_bpe(wc, n_merges)
    pieces, seen = [], set()
    for a, b in merges:
        if a + b not in seen:
            seen.add(a + b)
            pieces.append((a + b, -float(len(pieces))))
    base = -float(len(pieces) + 1)
    for i, (ch, n) in enumerate(sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))):
        if n >= 2 and ch not in seen:
            seen.add(ch)
            pieces.append((ch, base - i))
    return pieces


# -------------------------------------------------------- vocabularies ----

QWEN_TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] "
                 "+ '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
                 "{{- '<|im_start|>assistant\\n' }}{%- endif %}")
LLAMA3_TEMPLATE = ("{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
                   "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
                   "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
                   "{%- endif %}")
MIXTRAL_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}"
                    "{{ message['content'] + eos_token}}{% endif %}{% endfor %}")

QWEN_SPECIALS = [("<|endoftext|>", T_CONTROL), ("<|im_start|>", T_CONTROL), ("<|im_end|>", T_CONTROL),
                 ("<think>", T_USER), ("</think>", T_USER)]
LLAMA3_SPECIALS = [("<|begin_of_text|>", T_CONTROL), ("<|end_of_text|>", T_CONTROL),
                   ("<|start_header_id|>", T_CONTROL), ("<|end_header_id|>", T_CONTROL),
                   ("<|eot_id|>", T_CONTROL), ("<|python_tag|>", T_USER)]
# whole words that BPE merging does not produce but ignore_merges finds
LLAMA3_EXTRA = [" Hello", " tokenization", " perplexity", " supercalifragilisticexpialidocious", " HTTPServer",
                "Hello", " megabytes", " 12345"]


def tok_keys(tokens, types, merges=None):
    kv = [("tokenizer.ggml.tokens", (GT_ARR, GT_STR), tokens),
          ("tokenizer.ggml.token_type", (GT_ARR, GT_I32), types)]
    if merges is not None:
        kv.append(("tokenizer.ggml.merges", (GT_ARR, GT_STR), merges))
    return kv


def build(out_dir, hf):
    corpus = open(os.path.join(HERE, "corpus.txt"), encoding="utf-8", newline="").read()
    os.makedirs(out_dir, exist_ok=True)

    # (a) qwen2-style byte-level BPE, and the pre-tokenizer variants of it
    q_tokens, q_merges = bpe_vocab(corpus, "qwen2", 3000)
    q_types = [T_NORMAL] * len(q_tokens)
    for text, ty in QWEN_SPECIALS:
        q_tokens.append(text)
        q_types.append(ty)
    qid = {t: i for i, t in enumerate(q_tokens)}
    q_common = tok_keys(q_tokens, q_types, q_merges) + [
        ("tokenizer.ggml.bos_token_id", GT_U32, qid["<|endoftext|>"]),
        ("tokenizer.ggml.eos_token_id", GT_U32, qid["<|im_end|>"]),
        ("tokenizer.ggml.padding_token_id", GT_U32, qid["<|endoftext|>"]),
        ("tokenizer.ggml.add_bos_token", GT_BOOL, False),
        ("tokenizer.chat_template", GT_STR, QWEN_TEMPLATE),
    ]
    for name, pre in (("qwen2", "qwen2"), ("dsv3", "deepseek-v3"), ("gpt4o", "gpt-4o"), ("nopre", None)):
        kv = [("general.architecture", GT_STR, "qwen3moe"), ("general.name", GT_STR, "strata golden " + name),
              ("tokenizer.ggml.model", GT_STR, "gpt2")]
        if pre:
            kv.append(("tokenizer.ggml.pre", GT_STR, pre))
        write_gguf(os.path.join(out_dir, name + ".gguf"), kv + q_common)

    # (b) llama-bpe: llama3 split, ignore_merges, BOS
    l_tokens, l_merges = bpe_vocab(corpus, "llama3", 3000, LLAMA3_EXTRA)
    l_types = [T_NORMAL] * len(l_tokens)
    for text, ty in LLAMA3_SPECIALS:
        l_tokens.append(text)
        l_types.append(ty)
    lid = {t: i for i, t in enumerate(l_tokens)}
    write_gguf(os.path.join(out_dir, "llama3.gguf"), [
        ("general.architecture", GT_STR, "llama"), ("general.name", GT_STR, "strata golden llama3"),
        ("tokenizer.ggml.model", GT_STR, "gpt2"), ("tokenizer.ggml.pre", GT_STR, "llama-bpe")]
        + tok_keys(l_tokens, l_types, l_merges) + [
        ("tokenizer.ggml.bos_token_id", GT_U32, lid["<|begin_of_text|>"]),
        ("tokenizer.ggml.eos_token_id", GT_U32, lid["<|eot_id|>"]),
        ("tokenizer.ggml.add_bos_token", GT_BOOL, True),
        ("tokenizer.chat_template", GT_STR, LLAMA3_TEMPLATE),
    ])

    # (c) SentencePiece with scores and byte fallback
    pieces = spm_vocab(corpus, 1500)
    s_tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + [p for p, _ in pieces]
    s_types = [T_UNKNOWN, T_CONTROL, T_CONTROL] + [T_BYTE] * 256 + [T_NORMAL] * len(pieces)
    s_scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [s for _, s in pieces]
    write_gguf(os.path.join(out_dir, "spm.gguf"), [
        ("general.architecture", GT_STR, "llama"), ("general.name", GT_STR, "strata golden spm"),
        ("tokenizer.ggml.model", GT_STR, "llama"),
        ("tokenizer.ggml.tokens", (GT_ARR, GT_STR), s_tokens),
        ("tokenizer.ggml.scores", (GT_ARR, GT_F32), s_scores),
        ("tokenizer.ggml.token_type", (GT_ARR, GT_I32), s_types),
        ("tokenizer.ggml.bos_token_id", GT_U32, 1),
        ("tokenizer.ggml.eos_token_id", GT_U32, 2),
        ("tokenizer.ggml.unknown_token_id", GT_U32, 0),
        ("tokenizer.ggml.add_bos_token", GT_BOOL, True),
        ("tokenizer.ggml.add_eos_token", GT_BOOL, False),
        ("tokenizer.chat_template", GT_STR, MIXTRAL_TEMPLATE),
    ])

    if hf:
        write_hf(os.path.join(out_dir, "qwen2.tokenizer.json"), q_tokens, q_types, q_merges,
                 bpe_ref.RE_QWEN2, False)
        write_hf(os.path.join(out_dir, "llama3.tokenizer.json"), l_tokens, l_types, l_merges,
                 bpe_ref.RE_LLAMA3, True)
    return {"qwen2": len(q_tokens), "llama3": len(l_tokens), "spm": len(s_tokens)}


def write_hf(path, tokens, types, merges, pattern, ignore_merges):
    """A HuggingFace tokenizer.json for a byte-level BPE vocabulary: BPE model
    (vocab + merges), Split(regex, Isolated) + ByteLevel(use_regex=false)
    pre-tokenizer, ByteLevel decoder, the specials as added tokens."""
    normal = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == T_NORMAL}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": ty == T_CONTROL}
             for i, (t, ty) in enumerate(zip(tokens, types)) if ty != T_NORMAL]
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": normal, "merges": merges},
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for the .gguf files")
    ap.add_argument("--hf", action="store_true", help="also write HuggingFace tokenizer.json files")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    sizes = build(args.out, args.hf)
    if args.verbose:
        print(" ".join("%s=%d" % kv for kv in sizes.items()))


if __name__ == "__main__":
    main()
