#!/usr/bin/env python3
"""check_agree: strata vs the PyTorch model (and the float64 oracle) on held-out text, at F32.

    python3 tools/train/check_agree.py MODEL_F32.gguf RUN_DIR DATA_DIR [--oracle]

RUN_DIR: train.py's output (agree_logits.npy: float32 PyTorch logits of the agreement
sequences, computed with the bf16-rounded weights the F32 GGUF holds; manifest.json names
the rows). DATA_DIR: make_corpus.py's output (agree_ids.npy, agree_off.npy). strata's
logits come from build/tests/dump_logits. Prints top-1 agreement and KL(torch || strata);
with --oracle also the float64 numpy reference (tests/ref/qwen3moe_ref.py) vs both.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def kl(p_logits, q_logits):
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(-1)


def strata_logits(model, ids):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "l.bin")
        subprocess.run([os.path.join(ROOT, "build", "tests", "dump_logits"), model, out,
                        ",".join(str(int(i)) for i in ids)], check=True, capture_output=True)
        b = open(out, "rb").read()
    n, v = np.frombuffer(b[:8], "<i4")
    return np.frombuffer(b[8:], "<f4").reshape(n, v)


def main(argv):
    model, run, data = argv[1], argv[2], argv[3]
    oracle = "--oracle" in argv
    man = json.load(open(os.path.join(run, "manifest.json")))
    tl = np.load(os.path.join(run, "agree_logits.npy"))
    ids = np.load(os.path.join(data, "agree_ids.npy"))
    off = np.load(os.path.join(data, "agree_off.npy"))
    if oracle:
        sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
        import qwen3moe_ref
        ref = qwen3moe_ref.Model(model)
    r0 = 0
    tot = {"n": 0, "top1": 0, "kl": [], "o_top1": 0, "o_kl": [], "o_n": 0}
    for a in man["agree_rows"]:
        s = ids[off[a["seq"]]:off[a["seq"] + 1]]
        st = strata_logits(model, s)[a["first_row"]:a["first_row"] + a["n_rows"]]
        pt = tl[r0:r0 + a["n_rows"]]
        r0 += a["n_rows"]
        k = kl(pt, st)
        t1 = int((pt.argmax(-1) == st.argmax(-1)).sum())
        line = "seq %d (%d tokens, last %d rows): top-1 %d/%d, KL(torch||strata) mean %.3g max %.3g, max|dlogit| %.3g" % (
            a["seq"], a["n_tokens"], a["n_rows"], t1, a["n_rows"], k.mean(), k.max(), np.abs(pt - st).max())
        tot["n"] += a["n_rows"]
        tot["top1"] += t1
        tot["kl"] += list(k)
        if oracle and a["n_tokens"] <= 1100:
            o = ref.forward(s)[a["first_row"]:a["first_row"] + a["n_rows"]]
            ko = kl(o, st)
            t1o = int((o.argmax(-1) == st.argmax(-1)).sum())
            line += "; oracle vs strata top-1 %d/%d KL mean %.3g; oracle vs torch top-1 %d" % (
                t1o, a["n_rows"], ko.mean(), int((o.argmax(-1) == pt.argmax(-1)).sum()))
            tot["o_top1"] += t1o
            tot["o_kl"] += list(ko)
            tot["o_n"] += a["n_rows"]
        print(line, flush=True)
    print("TOTAL: %d positions, top-1 agreement %.2f%%, KL(torch||strata) mean %.3g, max %.3g" % (
        tot["n"], 100 * tot["top1"] / tot["n"], np.mean(tot["kl"]), np.max(tot["kl"])))
    if tot["o_n"]:
        print("ORACLE: %d positions, strata top-1 agreement %.2f%%, KL(oracle||strata) mean %.3g, max %.3g" % (
            tot["o_n"], 100 * tot["o_top1"] / tot["o_n"], np.mean(tot["o_kl"]), np.max(tot["o_kl"])))


if __name__ == "__main__":
    main(sys.argv)
