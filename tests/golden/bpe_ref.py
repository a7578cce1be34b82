#!/usr/bin/env python3
"""bpe_ref: an independent Python reference of llama.cpp's tokenizer, for the
golden token ids in tests/golden/.

It shares no code with src/tokenizer/ (which runs PCRE2 and priority queues):
it reads the GGUF itself, pre-tokenizes with the `regex` module the way
llama.cpp's generated Unicode tables see text (they were generated from that
very module), re-creates llama.cpp's "collapsed" std::regex path for the
pre-tokenizers that take it (deepseek-v3, gpt-4o, the default one), and runs
BPE / SentencePiece merging the slow, obvious way (rescan for the best pair,
merge it, repeat).

Facts carried over from llama.cpp (src/llama-vocab.cpp, src/unicode.cpp):
  * special tokens (CONTROL / USER_DEFINED / UNKNOWN) split the text one token
    at a time, longest text first; parse_special=False skips CONTROL/UNKNOWN;
  * invalid UTF-8 becomes U+FFFD per bad byte, overlong forms are re-encoded
    short, surrogates pass; (code points above U+10FFFF make llama.cpp throw;
    like strata we map the 4-byte sequence to one U+FFFD);
  * pre-tokenizer pieces are mapped byte-wise through GPT-2's byte table,
    BPE merges the lowest-rank adjacent pair (leftmost on ties); a final
    symbol that is not a token falls back to single raw bytes looked up as
    tokens, dropped when absent; ignore_merges (llama-bpe) tries the whole
    piece first;
  * SPM: spaces -> U+2581, a leading U+2581 before the first fragment and after
    each special token (add_space_prefix), merges by highest score (leftmost
    on ties), unknown symbols fall back to <0xXX> byte tokens;
  * BOS when add_special and tokenizer.ggml.add_bos_token (default: llama3 /
    SPM yes, others no); EOS likewise with add_eos_token.

Usage:
  bpe_ref.py encode VOCAB.gguf [--no-parse-special] [--no-bos] < text
  bpe_ref.py regen VOCAB_DIR        # rewrite tokenizer_ids.tsv and vocab.sha256
  bpe_ref.py plan VOCAB_DIR WORK    # used by test_tokenizer_golden.sh
The regen command is the only writer of the committed golden file; the test
never regenerates it (see tests/golden/README.md).
"""
import os
import struct
import sys

import regex

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------- GGUF ----

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_kv(path):
    """The metadata of a GGUF file as {key: value}; strings stay bytes."""
    data = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        s = data[pos:pos + n]
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et = take("<i")
            n = take("<Q")
            return [value(et) for _ in range(n)]
        return take(_SCALAR[t])

    assert data[:4] == b"GGUF", path
    pos = 4
    take("<I")
    take("<q")
    n_kv = take("<q")
    kv = {}
    for _ in range(n_kv):
        k = string().decode()
        kv[k] = value(take("<i"))
    return kv


# ------------------------------------------------------------- Unicode ----

def llama_cpts(b):
    """llama.cpp's unicode_cpts_from_utf8 (plus our choice above U+10FFFF)."""
    out = []
    i, n = 0, len(b)

    def cont(k):
        return (b[k] & 0xC0) == 0x80

    while i < n:
        c = b[i]
        if c < 0x80:
            out.append(c)
            i += 1
        elif not c & 0x40:
            out.append(0xFFFD)
            i += 1
        elif not c & 0x20:
            if i + 1 < n and cont(i + 1):
                out.append(((c & 0x1F) << 6) | (b[i + 1] & 0x3F))
                i += 2
            else:
                out.append(0xFFFD)
                i += 1
        elif not c & 0x10:
            if i + 2 < n and cont(i + 1) and cont(i + 2):
                out.append(((c & 0x0F) << 12) | ((b[i + 1] & 0x3F) << 6) | (b[i + 2] & 0x3F))
                i += 3
            else:
                out.append(0xFFFD)
                i += 1
        elif not c & 0x08:
            if i + 3 < n and cont(i + 1) and cont(i + 2) and cont(i + 3):
                cp = ((c & 7) << 18) | ((b[i + 1] & 0x3F) << 12) | ((b[i + 2] & 0x3F) << 6) | (b[i + 3] & 0x3F)
                out.append(cp if cp <= 0x10FFFF else 0xFFFD)
                i += 4
            else:
                out.append(0xFFFD)
                i += 1
        else:
            out.append(0xFFFD)
            i += 1
    return out


def cpts_to_bytes(cpts):
    return "".join(map(chr, cpts)).encode("utf-8", "surrogatepass")


def bytes_to_unicode():
    """GPT-2's byte -> character table."""
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_ENC = bytes_to_unicode()

# ------------------------------------------------------ pre-tokenizers ----

CONTR = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# llama.cpp runs hand-written splitters for these two; they equal the regex
RE_QWEN2 = CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
RE_LLAMA3 = CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
RE_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# these go through llama.cpp's collapsed std::regex (written as llama-vocab.cpp has them)
RE_GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + CONTR + "?"
            r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + CONTR + "?"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_DS3_MAIN = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
               "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")

# a list of (mode, pattern): "unicode" = regex module on the text,
# "collapsed" = llama.cpp's one-byte-per-code-point text and rewritten regex,
# "wide" = the pattern on the text with non-ASCII whitespace made \v
PRE = {
    "qwen2": [("unicode", RE_QWEN2)],
    "llama3": [("unicode", RE_LLAMA3)],
    "gpt4o": [("collapsed", RE_GPT4O)],
    "deepseek3": [("collapsed", r"\p{N}{1,3}"), ("wide", "[一-龥぀-ゟ゠-ヿ]+"), ("collapsed", RE_DS3_MAIN)],
    "default": [("collapsed", r"[\p{P}\$\+<=>\^~\|]+"), ("unicode", RE_GPT2),
                ("collapsed", r"\p{N}+"), ("wide", "[0-9][0-9][0-9]")],
}
PRE_NAMES = {"qwen2": "qwen2", "llama-bpe": "llama3", "llama3": "llama3", "gpt-4o": "gpt4o",
             "deepseek-v3": "deepseek3", "default": "default"}

# llama.cpp's collapsed categories: the byte that stands for a code point
# >= 128, and the ASCII set each \p{X} adds back
_CAT_BYTE = {"N": 0xD1, "L": 0xD2, "P": 0xD3, "M": 0xD4, "S": 0xD5}
_CAT_ASCII = {"N": r"\x30-\x39", "L": r"\x41-\x5A\x61-\x7A",
              "P": r"\x21-\x23\x25-\x2A\x2C-\x2F\x3A-\x3B\x3F-\x40\x5B-\x5D\x5F\x7B\x7D",
              "M": "", "S": r"\x24\x2B\x3C-\x3E\x5E\x60\x7C"}   # no '~': llama.cpp's table lacks it
_PROBES = [(c, regex.compile(r"\p{%s}" % c)) for c in "NLPMS"]
_WS = regex.compile(r"\s")


def _collapse_cpt(cp):
    if cp < 128:
        return cp
    ch = chr(cp)
    if _WS.match(ch):
        return 0x0B
    for c, probe in _PROBES:
        if probe.match(ch):
            return _CAT_BYTE[c]
    return 0xD0


def _collapse_regex(expr):
    """llama.cpp's rewrite of \\p{X} into [byte + ASCII ranges] (bracketed
    unless already inside [...]), as a Python bytes pattern."""
    out = []
    inside = False
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch == "[" and (i == 0 or expr[i - 1] != "\\"):
            inside = True
            out.append("[")
        elif inside and ch == "]" and expr[i - 1] != "\\":
            inside = False
            out.append("]")
        elif expr.startswith("\\p{", i) and expr.find("}", i) != -1:
            j = expr.find("}", i)
            cat = expr[i + 3:j]
            cat = cat[0] if cat in ("Lu", "Ll", "Lt", "Lm", "Lo") else cat
            body = "\\x%02X" % _CAT_BYTE[cat] + _CAT_ASCII[cat]
            out.append(body if inside else "[" + body + "]")
            i = j
        else:
            out.append(ch)
        i += 1
    return regex.compile("".join(out).encode("latin-1"), regex.VERSION0)


_COMPILED = {}


def _compiled(mode, pattern):
    key = (mode, pattern)
    if key not in _COMPILED:
        if mode == "collapsed":
            _COMPILED[key] = _collapse_regex(pattern)
        else:
            _COMPILED[key] = regex.compile(pattern, regex.VERSION0)
    return _COMPILED[key]


def pre_split(kind, cpts):
    """Split a list of code points; returns a list of code-point lists."""
    offs = [(0, len(cpts))]
    text = "".join(map(chr, cpts))
    collapsed = None
    for mode, pattern in PRE[kind]:
        rx = _compiled(mode, pattern)
        if mode == "collapsed" and collapsed is None:
            collapsed = bytes(_collapse_cpt(c) for c in cpts)
        new = []
        for a, n in offs:
            if mode == "collapsed":
                subj = collapsed[a:a + n]
            elif mode == "wide":
                subj = "".join("\x0b" if c > 0x7F and _WS.match(chr(c)) else chr(c) for c in cpts[a:a + n])
            else:
                subj = text[a:a + n]
            prev = 0
            for m in rx.finditer(subj):
                if m.end() == m.start():
                    continue
                if m.start() > prev:
                    new.append((a + prev, m.start() - prev))
                new.append((a + m.start(), m.end() - m.start()))
                prev = m.end()
            if prev < n:
                new.append((a + prev, n - prev))
        offs = new
    return [cpts[a:a + n] for a, n in offs]


# ------------------------------------------------------------ tokenizer ----

EOG_TEXTS = ["<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
             "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
             "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
             "<｜end▁of▁sentence｜>", "[e~["]

T_UNKNOWN, T_CONTROL, T_USER = 2, 3, 4


class Ref:
    def __init__(self, path):
        kv = read_gguf_kv(path)
        self.model = kv["tokenizer.ggml.model"].decode()
        self.tokens = kv["tokenizer.ggml.tokens"]                    # list of bytes
        self.types = kv.get("tokenizer.ggml.token_type", [1] * len(self.tokens))
        self.types = list(self.types)
        self.scores = kv.get("tokenizer.ggml.scores", [0.0] * len(self.tokens))
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        n = len(self.tokens)
        if self.model == "gpt2":
            pre = kv.get("tokenizer.ggml.pre", b"default").decode()
            self.pre = PRE_NAMES[pre]
            self.ignore_merges = pre in ("llama-bpe", "llama3")
            add_bos = pre in ("llama-bpe", "llama3")
            bos = eos = 11
            self.ranks = {}
            for r, m in enumerate(kv["tokenizer.ggml.merges"]):
                s = m.decode("utf-8", "surrogateescape")
                k = s.find(" ", 1)
                if k > 0:
                    self.ranks.setdefault((s[:k], s[k + 1:]), r)
        else:
            assert self.model == "llama"
            self.pre = None
            self.ignore_merges = False
            add_bos = True
            bos, eos = 1, 2
        self.add_space_prefix = bool(kv.get("tokenizer.ggml.add_space_prefix", True))
        bos = bos if bos < n else -1
        eos = eos if eos < n else -1
        b = kv.get("tokenizer.ggml.bos_token_id")
        e = kv.get("tokenizer.ggml.eos_token_id")
        self.bos = b if b is not None and b < n else bos
        self.eos = e if e is not None and e < n else eos
        self.add_bos = bool(kv.get("tokenizer.ggml.add_bos_token", add_bos))
        self.add_eos = bool(kv.get("tokenizer.ggml.add_eos_token", False))
        # llama.cpp forces EOG-looking tokens to CONTROL (the subset our vocabularies can hit)
        for t in EOG_TEXTS:
            i = self.ids.get(t.encode())
            if i is not None and self.types[i] not in (T_CONTROL,):
                self.types[i] = T_CONTROL
        special = [i for i, ty in enumerate(self.types) if ty in (T_UNKNOWN, T_CONTROL, T_USER)]
        self.special = sorted(special, key=lambda i: (-len(self.tokens[i]), i))

    # llama.cpp's tokenizer_st_partition
    def partition(self, text, parse_special):
        frags = [(None, text)] if text else []
        for sid in self.special:
            if not parse_special and self.types[sid] in (T_CONTROL, T_UNKNOWN):
                continue
            st = self.tokens[sid]
            out = []
            for tid, s in frags:
                if tid is not None:
                    out.append((tid, s))
                    continue
                while True:
                    k = s.find(st)
                    if k < 0:
                        break
                    if k > 0:
                        out.append((None, s[:k]))
                    out.append((sid, st))
                    s = s[k + len(st):]
                if s:
                    out.append((None, s))
            frags = out
        return frags

    def bpe_piece(self, cpts):
        word = "".join(BYTE_ENC[b] for b in cpts_to_bytes(cpts))
        if self.ignore_merges and word.encode() in self.ids:
            return [self.ids[word.encode()]]
        syms = list(word)
        while len(syms) > 1:
            best = None
            for i in range(len(syms) - 1):
                r = self.ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            syms[i:i + 2] = [syms[i] + syms[i + 1]]
        out = []
        for s in syms:
            b = s.encode()
            if b in self.ids:
                out.append(self.ids[b])
            else:   # raw single bytes of the mapped text, kept only if they are tokens
                out.extend(self.ids[bytes([x])] for x in b if bytes([x]) in self.ids)
        return out

    def spm_text(self, raw):
        syms = []
        i = 0
        lens = [1] * 12 + [2, 2, 3, 4]
        while i < len(raw):
            n = min(lens[raw[i] >> 4], len(raw) - i)
            syms.append(raw[i:i + n])
            i += n
        while len(syms) > 1:
            best = None
            for i in range(len(syms) - 1):
                t = self.ids.get(syms[i] + syms[i + 1])
                if t is not None and (best is None or self.scores[t] > best[0]):
                    best = (self.scores[t], i)
            if best is None:
                break
            i = best[1]
            syms[i:i + 2] = [syms[i] + syms[i + 1]]
        out = []
        for s in syms:
            if s in self.ids:
                out.append(self.ids[s])
            else:
                for x in s:
                    t = self.ids.get(b"<0x%02X>" % x)
                    out.append(t if t is not None else self.ids[bytes([x])])
        return out

    def encode(self, text, add_special=True, parse_special=True):
        out = []
        if add_special and self.add_bos:
            out.append(self.bos)
        prev_special = True
        for tid, s in self.partition(text, parse_special):
            if tid is not None:
                out.append(tid)
                prev_special = True
                continue
            if self.model == "gpt2":
                for piece in pre_split(self.pre, llama_cpts(s)):
                    out.extend(self.bpe_piece(piece))
            else:
                if self.add_space_prefix and prev_special:
                    s = b" " + s
                out.extend(self.spm_text(s.replace(b" ", "\u2581".encode())))
            prev_special = False
        if add_special and self.add_eos:
            out.append(self.eos)
        return out


# -------------------------------------------------------------- goldens ----

def unescape_case(s):
    """Case text escapes: \\n \\r \\t \\\\ \\xHH (a raw byte) \\u{H..} (a code point)."""
    out = bytearray()
    i = 0
    while i < len(s):
        c = s[i]
        if c != "\\":
            out += c.encode()
            i += 1
            continue
        d = s[i + 1]
        if d in "nrt\\":
            out += {"n": b"\n", "r": b"\r", "t": b"\t", "\\": b"\\"}[d]
            i += 2
        elif d == "x":
            out.append(int(s[i + 2:i + 4], 16))
            i += 4
        elif d == "u":
            j = s.index("}", i)
            out += chr(int(s[i + 3:j], 16)).encode("utf-8", "surrogatepass")
            i = j + 1
        else:
            raise ValueError("bad escape in case text: " + s)
    return bytes(out)


def load_cases():
    cases = []
    for line in open(os.path.join(HERE, "cases.txt"), encoding="utf-8"):
        line = line.rstrip("\n")
        if not line or line.startswith("#"):
            continue
        name, _, text = line.partition("\t")
        cases.append((name, unescape_case(text)))
    return cases


# every vocabulary make_vocab.py builds, with the cases it runs
VOCABS = ["qwen2", "llama3", "spm", "dsv3", "gpt4o", "nopre"]
# llama.cpp's fallback pre-tokenizer (no tokenizer.ggml.pre) is no model we
# target: it runs on the cases that tell its four regexes apart
NOPRE_CASES = {"hello", "sentence", "digits_long", "digits_mixed", "digits_unicode", "spaces_many",
               "spaces_trailing", "tabs_spaces", "crlf", "newlines_spaces", "nbsp", "contractions",
               "contractions_upper", "punctuation_runs", "tilde", "symbols_math", "code_py", "json",
               "cjk_zh", "emoji_zwj", "invalid_truncated", "special_chatml", "long_text"}


def golden_runs():
    """(case name, text, vocab, parse_special, add_bos) for every golden test."""
    runs = []
    for name, text in load_cases():
        for v in VOCABS:
            if v == "nopre" and name not in NOPRE_CASES:
                continue
            runs.append((name, text, v, True, True))
            # the partition does not depend on the pre-tokenizer: the
            # no-parse-special runs use one vocabulary of each kind
            if name.startswith("special_") and v in ("qwen2", "llama3", "spm"):
                runs.append((name, text, v, False, True))
            if name in ("hello", "empty", "special_chatml") and v in ("llama3", "spm"):
                runs.append((name, text, v, True, False))
    return runs


def run_key(name, vocab, parse_special, add_bos):
    flags = ("" if parse_special else "nps") + ("" if add_bos else ",nobos")
    return "%s\t%s\t%s" % (name, vocab, flags.strip(",") or "-")


def vocab_hashes(vocab_dir):
    import hashlib
    return {v: hashlib.sha256(open(os.path.join(vocab_dir, v + ".gguf"), "rb").read()).hexdigest()
            for v in VOCABS}


def regen(vocab_dir):
    with open(os.path.join(HERE, "vocab.sha256"), "w") as f:
        for v, h in vocab_hashes(vocab_dir).items():
            f.write("%s  %s.gguf\n" % (h, v))
    refs = {v: Ref(os.path.join(vocab_dir, v + ".gguf")) for v in VOCABS}
    lines = ["# golden token ids: case, vocabulary, flags (nps = --no-parse-special, nobos = --no-bos), ids",
             "# written by: python3 tests/golden/bpe_ref.py regen DIR   (after make_vocab.py --out DIR)"]
    for name, text, v, ps, bos in golden_runs():
        ids = refs[v].encode(text, add_special=bos, parse_special=ps)
        lines.append(run_key(name, v, ps, bos) + "\t[" + ", ".join(map(str, ids)) + "]")
    with open(os.path.join(HERE, "tokenizer_ids.tsv"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %d golden lines" % (len(lines) - 2))


def plan(vocab_dir, work_dir):
    """For the test script: write each golden run's input to WORK/NNNN.txt and
    the run list to WORK/plan.tsv (index, key, vocabulary, extra flags,
    expected ids) from the committed goldens, without recomputing anything.
    Also checks the regenerated vocabularies against vocab.sha256. Prints the
    vocabulary checks' summary line."""
    os.makedirs(work_dir, exist_ok=True)
    golden = {}
    for line in open(os.path.join(HERE, "tokenizer_ids.tsv"), encoding="utf-8"):
        if line.startswith("#") or not line.strip():
            continue
        f = line.rstrip("\n").split("\t")
        golden["\t".join(f[:3])] = f[3]
    rows = []
    for i, (name, text, v, ps, bos) in enumerate(golden_runs()):
        with open(os.path.join(work_dir, "%04d.txt" % i), "wb") as fh:
            fh.write(text)
        key = run_key(name, v, ps, bos)
        flags = ("" if ps else " --no-parse-special") + ("" if bos else " --no-bos")
        rows.append("%04d\t%s\t%s\t%s\t%s" % (i, key.replace("\t", ":"), v, flags.strip() or "-",
                                               golden.get(key, "MISSING")))
    with open(os.path.join(work_dir, "plan.tsv"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(rows) + "\n")
    want = {}
    for line in open(os.path.join(HERE, "vocab.sha256")):
        h, name = line.split()
        want[name[:-len(".gguf")]] = h
    got = vocab_hashes(vocab_dir)
    bad = [v for v in VOCABS if want.get(v) != got[v]]
    for v in bad:
        sys.stderr.write("FAIL vocabulary %s.gguf differs from vocab.sha256 (make_vocab.py changed?)\n" % v)
    print("tokenizer_golden_vocab: %d passed, %d failed" % (len(VOCABS) - len(bad), len(bad)))


def main(argv):
    if len(argv) >= 2 and argv[1] == "regen":
        regen(argv[2])
    elif len(argv) >= 4 and argv[1] == "plan":
        plan(argv[2], argv[3])
    elif len(argv) >= 2 and argv[1] == "encode":
        ref = Ref(argv[2])
        text = sys.stdin.buffer.read()
        ids = ref.encode(text, add_special="--no-bos" not in argv, parse_special="--no-parse-special" not in argv)
        print("[" + ", ".join(map(str, ids)) + "]")
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
