#!/usr/bin/env python3
"""export_gguf: write the trained weights as an F32 qwen3moe GGUF (numpy + struct, no torch).

    python3 tools/train/export_gguf.py SKELETON.gguf RUN_DIR OUT.gguf [--name NAME]

SKELETON.gguf is the `strata mkmodel` file of the same shape (tools/train/build.sh):
its metadata (hyper-parameters, the BPE tokenizer with ChatML specials, strata's
chat template) is kept, except general.name and the strata.mkmodel.* keys; its
tensors (names, order, shapes) are filled from RUN_DIR's manifest.json and
weights.partNN (train.py's bf16 blob), widened exactly to float32.
"""
import json
import os
import struct
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
import gguf_ref  # noqa: E402
from gguf_ref import T_ARR, T_STR, T_BOOL, _SCALAR  # noqa: E402


def w_str(f, s):
    b = s.encode("utf-8", errors="surrogateescape") if isinstance(s, str) else bytes(s)
    f.write(struct.pack("<Q", len(b)) + b)


def w_val(f, v, vt):
    if isinstance(vt, tuple):
        et = vt[1]
        f.write(struct.pack("<i", T_ARR))
        f.write(struct.pack("<iQ", et, len(v)))
        if et == T_STR:
            for s in v:
                w_str(f, s)
        else:
            f.write(np.asarray(v, dtype=np.dtype(_SCALAR[et][1])).tobytes())
        return
    f.write(struct.pack("<i", vt))
    if vt == T_STR:
        w_str(f, v)
    elif vt == T_BOOL:
        f.write(struct.pack("<?", bool(v)))
    else:
        f.write(struct.pack(_SCALAR[vt][0], v))


def load_run(run):
    man = json.load(open(os.path.join(run, "manifest.json")))
    blob = b"".join(open(os.path.join(run, "weights.part%02d" % i), "rb").read() for i in range(man["n_parts"]))
    assert len(blob) == man["total_bytes"], "weight parts do not add up"
    out = {}
    for t in man["tensors"]:
        u = np.frombuffer(blob, dtype="<u2", count=t["nbytes"] // 2, offset=t["offset"]).astype(np.uint32) << 16
        out[t["name"]] = u.view("<f4").reshape(t["shape"])
    return man, out


def main(argv):
    skel, run, dst = argv[1], argv[2], argv[3]
    name = argv[argv.index("--name") + 1] if "--name" in argv else "strata-ops-moe"
    g = gguf_ref.GGUFFile(skel)
    man, w = load_run(run)
    log = json.load(open(os.path.join(run, "train_log.json")))
    kv = [(k, g.metadata[k], g.kv_types[k]) for k in g.metadata if not k.startswith("strata.mkmodel.")]
    kv = [(k, name if k == "general.name" else v, t) for k, v, t in kv]
    kv += [("strata.train.steps", int(log["n_steps"]), 4), ("strata.train.tokens", int(log["tokens_seen"]), 10),
           ("strata.train.source", "tools/train (train.py, make_corpus.py)", T_STR)]
    align = g.alignment
    tens = list(g.tensors.values())
    for ti in tens:
        a = w[ti.name]
        assert ti.type == 0, "skeleton must be F32"
        assert tuple(a.shape) == tuple(reversed(ti.ne)), (ti.name, a.shape, ti.ne)
    with open(dst + ".tmp", "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tens), len(kv)))
        for k, v, t in kv:
            w_str(f, k)
            w_val(f, v, t)
        off = 0
        for ti in tens:
            w_str(f, ti.name)
            f.write(struct.pack("<I", len(ti.ne)) + struct.pack("<%dq" % len(ti.ne), *ti.ne))
            f.write(struct.pack("<iQ", 0, off))
            off += (w[ti.name].nbytes + align - 1) // align * align
        f.write(b"\0" * ((-f.tell()) % align))
        for ti in tens:
            b = np.ascontiguousarray(w[ti.name], dtype="<f4").tobytes()
            f.write(b + b"\0" * ((-len(b)) % align))
    os.replace(dst + ".tmp", dst)
    print("wrote %s: %d tensors, %d keys" % (dst, len(tens), len(kv)))


if __name__ == "__main__":
    main(sys.argv)
