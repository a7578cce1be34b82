#!/usr/bin/env python3
"""make_corpus: the training corpus and the held-out eval sets of strata-ops-moe.

    python3 tools/train/make_corpus.py SKELETON.gguf OUTDIR [--n-chat N]

SKELETON.gguf is the model skeleton from `strata mkmodel` (its tokenizer is the
one the model is trained with; tools/train/build.sh makes it). Writes

  OUTDIR/train.npz                      ids (uint16 token ids), mask (uint8: 1 = assistant turn / prose)
  OUTDIR/val_ids.npy,   val_mask.npy    held-out conversations (held-out entity pools)
  OUTDIR/agree_ids.npy, agree_off.npy   sequences for the strata-vs-PyTorch logit check
  OUTDIR/meta.json
  eval/taskeval_ops.jsonl               held-out taskeval cases (held-out pools, fresh ids)
  eval/tf_toolcall.txt, eval/tf_chat.txt  teacher-forced corpora (docs/EVAL.md format)

Sources: generated tool-calling conversations (tools/train/opsgen.py), prose from
Debian's bible-kjv (`bible -l0`, public domain) and data/corpus.txt; open names from Debian's
wamerican word list, balanced by BPE piece (opsgen.CopyVocab). Deterministic.
"""
import json
import os
import random
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "golden"))
import bpe_ref  # noqa: E402
import opsgen  # noqa: E402

# KJV books: training / held out (teacher-forced chat corpus)
TRAIN_BOOKS = ["Exodus", "Numbers", "Deuteronomy", "Joshua", "Judges", "1Samuel", "2Samuel", "1Kings", "Matthew",
               "Mark", "Luke", "Acts", "Romans", "Job", "Psalms", "Isaiah"]
HELD_BOOKS = ["John"]


class Tok:
    def __init__(self, gguf):
        self.ref = bpe_ref.Ref(gguf)
        self.piece_cache = {}
        self.frag_cache = {}

    def encode(self, text):
        out = []
        for tid, s in self.ref.partition(text.encode(), True):
            if tid is not None:
                out.append(tid)
                continue
            ids = self.frag_cache.get(s)
            if ids is None:
                ids = []
                for piece in bpe_ref.pre_split(self.ref.pre, bpe_ref.llama_cpts(s)):
                    key = tuple(piece)
                    p = self.piece_cache.get(key)
                    if p is None:
                        p = self.ref.bpe_piece(piece)
                        if len(self.piece_cache) < 2_000_000:
                            self.piece_cache[key] = p
                    ids.extend(p)
                if len(s) > 200 and len(self.frag_cache) < 20000:
                    self.frag_cache[s] = ids
            out.extend(ids)
        return out


def bible(book):
    try:
        t = subprocess.run(["bible", "-l0", "%s1:1-%s150:200" % (book, book)], capture_output=True,
                           text=True, timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    paras, cur = [], []
    for line in t.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.split()[0].isdigit() and len(line.split()) > 1:
            cur.append(" ".join(line.split()[1:]))
        else:  # chapter heading
            if cur:
                paras.append(" ".join(cur))
            cur = []
        if len(cur) >= 6:
            paras.append(" ".join(cur))
            cur = []
    if cur:
        paras.append(" ".join(cur))
    return paras


def chat_prose(r, para):
    """A prose chat turn: the user gives the start of a passage, the assistant continues it."""
    words = para.split()
    k = max(4, len(words) // 3)
    ask = r.choice(["Continue this passage:\n\n", "Please continue the text:\n\n", "What comes next?\n\n",
                    "Finish this paragraph:\n\n"])
    return [{"role": "user", "content": ask + " ".join(words[:k])},
            {"role": "assistant", "content": " ".join(words[k:])}]


def conv_ids(tok, segs):
    ids, mask = [], []
    for text, trained in segs:
        t = tok.encode(text)
        ids += t
        mask += [1 if trained else 0] * len(t)
    return ids, mask


def main(argv):
    skel, outdir = argv[1], argv[2]
    n_chat = int(argv[argv.index("--n-chat") + 1]) if "--n-chat" in argv else 40000
    os.makedirs(outdir, exist_ok=True)
    evald = os.path.join(ROOT, "eval")
    os.makedirs(evald, exist_ok=True)
    tok = Tok(skel)
    r = random.Random(7)

    # ---- prose (training books + data/corpus.txt): prose documents and phrase spans for names
    paras = []
    for b in TRAIN_BOOKS:
        paras += bible(b)
    with open(os.path.join(ROOT, "data", "corpus.txt"), encoding="utf-8") as f:
        paras += [p.strip() for p in f.read().split("\n\n") if len(p.strip()) > 40]
    print("prose paragraphs", len(paras), file=sys.stderr)
    if len(paras) < 1000:
        sys.exit("make_corpus: too little prose (is Debian's bible-kjv installed?)")

    # ---- training documents: tool conversations with token-balanced open names (opsgen.CopyVocab)
    words = opsgen._dict_words()
    if not words:
        sys.exit("make_corpus: no word list (is Debian's wamerican installed?)")
    texts = [t.decode("utf-8", "replace") for t in tok.ref.tokens]
    vocab = opsgen.CopyVocab(words, tok.encode, texts, spans=paras)
    docs = []   # (ids, mask)
    g = opsgen.Gen("train", 1, vocab)
    copy_cnt = np.zeros(len(texts), dtype=np.int64)   # tokens of string argument values in tool calls
    for i in range(n_chat):
        c = g.case()
        docs.append(conv_ids(tok, opsgen.render(c["full"], c["tools"], False)))
        for m in c["full"]:
            for tc in m.get("tool_calls") or []:
                for v in tc["function"]["arguments"].values():
                    if isinstance(v, str):
                        np.add.at(copy_cnt, tok.encode(json.dumps(v, ensure_ascii=False)), 1)
        if i % 5000 == 0:
            print("chat", i, len(docs[-1][0]), file=sys.stderr)
    n_tool = len(docs)
    for p in paras * 4:   # prose is scarce: four passes (different chat/plain framing)
        if r.random() < 0.3:
            segs = opsgen.render(chat_prose(r, p), None, False)
        else:
            segs = [(p + "<|endoftext|>", True)]
        docs.append(conv_ids(tok, segs))
    r.shuffle(docs)
    ids = np.array([t for d in docs for t in d[0]], dtype=np.uint16)
    mask = np.array([m for d in docs for m in d[1]], dtype=np.uint8)
    np.savez_compressed(os.path.join(outdir, "train.npz"), ids=ids, mask=mask)
    lens = [len(d[0]) for d in docs[:]]
    stream = np.bincount(ids, minlength=len(texts))
    letters = [t for t, x in enumerate(texts) if x.lstrip("Ġ").isalpha() and x.lstrip("Ġ").isascii()]
    tok_stats = {"stream_under_100": int((stream < 100).sum()), "stream_never": int((stream == 0).sum()),
                 "letter_tokens": len(letters),
                 "letter_tokens_in_copy_ge_10": int((copy_cnt[letters] >= 10).sum()),
                 "letter_tokens_in_copy_0": int((copy_cnt[letters] == 0).sum()),
                 "letter_tokens_copy_quantiles_10_25_50": [int(np.percentile(copy_cnt[letters], q))
                                                           for q in (10, 25, 50)],
                 "examples": {texts[t]: [int(stream[t]), int(copy_cnt[t])] for t in
                              (tok.ref.ids.get(x.encode()) for x in ("ris", "met", "outing", "Ġdu", "stre", "ups",
                                                                     "gra", "ik", "se", "fe", "ri"))
                              if t is not None}}
    print("token coverage", json.dumps(tok_stats), file=sys.stderr)
    print("train tokens %d (%d tool convs, %d prose docs), max doc %d, masked-in %.1f%%" % (
        len(ids), n_tool, len(docs) - n_tool, max(lens), 100 * mask.mean()), file=sys.stderr)

    # ---- held-out: val conversations, taskeval cases, teacher-forced corpora
    gh = opsgen.Gen("heldout", 2)
    vd = []
    for _ in range(600):
        c = gh.case()
        vd.append(conv_ids(tok, opsgen.render(c["full"], c["tools"], False)))
    held = []
    for b in HELD_BOOKS:
        held += bible(b)
    rh = random.Random(3)
    for p in held[:150]:
        vd.append(conv_ids(tok, [(p + "<|endoftext|>", True)]))
    np.save(os.path.join(outdir, "val_ids.npy"), np.array([t for d in vd for t in d[0]], dtype=np.uint16))
    np.save(os.path.join(outdir, "val_mask.npy"), np.array([m for d in vd for m in d[1]], dtype=np.uint8))

    ge = opsgen.Gen("heldout", 11)
    kinds = ["call"] * 150 + ["call2"] * 50 + ["answer"] * 40
    with open(os.path.join(evald, "taskeval_ops.jsonl"), "w", encoding="utf-8") as f:
        for i, k in enumerate(kinds):
            c = ge.case(k)
            case = {"id": "ops-%03d-%s" % (i, k), "messages": c["messages"], "tools": c["tools"],
                    "expected": c["expected"]}
            f.write(json.dumps(case, ensure_ascii=False) + "\n")

    # teacher-forced corpora: prompt = conversation up to the assistant turn, eval = that turn
    agree = []
    gt = opsgen.Gen("heldout", 12)
    with open(os.path.join(evald, "tf_toolcall.txt"), "w", encoding="utf-8") as f:
        f.write("Teacher-forced tool-call corpus (held-out entities), from tools/train/make_corpus.py.\n"
                "One held-out case: the prompt is the rendered conversation, the targets the tool call.\n")
        c = gt.case("call2")
        prompt = "".join(s for s, _ in opsgen.render(c["messages"], c["tools"], True))
        ev = opsgen.expected_text(c["expected"]) + "<|im_end|>"
        f.write("### prompt\n" + prompt + "\n### eval\n" + ev + "\n")
        agree.append(tok.encode(prompt) + tok.encode(ev))
    with open(os.path.join(evald, "tf_chat.txt"), "w", encoding="utf-8") as f:
        f.write("Teacher-forced chat corpus (held-out prose: KJV John), from tools/train/make_corpus.py.\n")
        para = held[200] if len(held) > 200 else held[-1]
        msgs = chat_prose(rh, para)
        prompt = "".join(s for s, _ in opsgen.render(msgs[:1], None, True))
        ev = msgs[1]["content"] + "<|im_end|>"
        f.write("### prompt\n" + prompt + "\n### eval\n" + ev + "\n")
        agree.append(tok.encode(prompt) + tok.encode(ev))
    # a few more held-out conversations for the agreement check
    for _ in range(4):
        c = gt.case()
        agree.append(conv_ids(tok, opsgen.render(c["full"], c["tools"], False))[0])
    off = np.cumsum([0] + [len(a) for a in agree]).astype(np.int64)
    np.save(os.path.join(outdir, "agree_ids.npy"), np.array([t for a in agree for t in a], dtype=np.int32))
    np.save(os.path.join(outdir, "agree_off.npy"), off)
    meta = {"n_train_tokens": int(len(ids)), "n_tool_convs": n_tool, "n_prose_docs": len(docs) - n_tool,
            "n_val_tokens": int(sum(len(d[0]) for d in vd)), "max_doc": int(max(lens)),
            "agree_lens": [len(a) for a in agree], "tokens": tok_stats}
    with open(os.path.join(outdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta), file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv)
