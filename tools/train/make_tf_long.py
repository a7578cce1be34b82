#!/usr/bin/env python3
"""make_tf_long: the long-prompt teacher-forced chat corpus of strata-ops-moe.
    python3 tools/train/make_tf_long.py [WORDS]
Writes eval/tf_chat_long.txt (docs/EVAL.md format): a user asks to continue a
held-out prose passage (KJV John, never trained on: make_corpus.HELD_BOOKS)
whose given part is about WORDS words (default 700, several hundred prompt
rows), the targets are the next paragraph. Unlike eval/tf_chat.txt (a short
prompt), the prompt call here is long enough that routing policies which treat
the last N prompt rows exactly (exact-last=32) still route most of it biased,
so teacher-forced KL measures what the bias does to the rows that feed the
targets' context (bench/route/gate.sh --corpus). Deterministic: the first
paragraphs of John in order, nothing random.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_corpus  # noqa: E402  (bible(), HELD_BOOKS, ROOT)
import opsgen  # noqa: E402


def main(argv):
    words = int(argv[1]) if len(argv) > 1 else 700
    paras = make_corpus.bible(make_corpus.HELD_BOOKS[0])
    if len(paras) < 20:
        sys.exit("make_tf_long: too little prose (is Debian's bible-kjv installed?)")
    given, n = [], 0
    i = 0
    while n < words and i < len(paras) - 1:
        given.append(paras[i])
        n += len(paras[i].split())
        i += 1
    msgs = [{"role": "user", "content": "Please continue the text:\n\n" + "\n\n".join(given)}]
    prompt = "".join(s for s, _ in opsgen.render(msgs, None, True))
    ev = paras[i] + "<|im_end|>"
    path = os.path.join(make_corpus.ROOT, "eval", "tf_chat_long.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("Teacher-forced long-prompt chat corpus (held-out prose: KJV John, %d words given), from "
                "tools/train/make_tf_long.py.\n" % n)
        f.write("### prompt\n" + prompt + "\n### eval\n" + ev + "\n")
    print("%s: %d words given (%d paragraphs), target paragraph %d words" % (path, n, len(given),
                                                                              len(paras[i].split())))


if __name__ == "__main__":
    main(sys.argv)
