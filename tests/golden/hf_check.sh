#!/bin/sh
# Optional cross-check (not part of `make test`): the golden vocabularies,
# exported as HuggingFace tokenizer.json, tokenized by the real HuggingFace
# `tokenizers` library (its Node.js binding, npm package "tokenizers"), must
# give the same ids as bpe_ref.py -- hence as strata -- on every valid-UTF-8
# case of cases.txt, for the qwen2 and llama3 vocabularies.
#
#   (cd /some/dir && npm install tokenizers)     # once
#   HF_NODE_MODULES=/some/dir/node_modules sh tests/golden/hf_check.sh
#
# Prints "hf check: N same, N different". Invalid UTF-8 cases are skipped
# (JavaScript strings cannot hold them; HF and llama.cpp differ there anyway).
set -e
PYTHON=${PYTHON:-/usr/bin/python3}
dir=${TMPDIR:-/tmp}/strata_hf_check
mkdir -p "$dir"
"$PYTHON" tests/golden/make_vocab.py --out "$dir" --hf
"$PYTHON" - "$dir" <<'PY'
import json, sys
sys.path.insert(0, "tests/golden")
import bpe_ref
d = sys.argv[1]
out = []
for v in ("qwen2", "llama3"):
    ref = bpe_ref.Ref("%s/%s.gguf" % (d, v))
    for name, text in bpe_ref.load_cases():
        try:
            s = text.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if any(0xD800 <= ord(c) <= 0xDFFF for c in s):
            continue
        out.append({"vocab": v, "name": name, "text": s,
                    "ids": ref.encode(text, add_special=False, parse_special=True)})
json.dump(out, open("%s/cases.json" % d, "w"))
PY
NODE_PATH=${HF_NODE_MODULES:-$NODE_PATH} node - "$dir" <<'JS'
const { Tokenizer } = require('tokenizers');
const dir = process.argv[2];
const cases = require(dir + '/cases.json');
(async () => {
  const toks = {};
  for (const v of ['qwen2', 'llama3']) toks[v] = Tokenizer.fromFile(`${dir}/${v}.tokenizer.json`);
  let same = 0, diff = 0;
  for (const c of cases) {
    const enc = await toks[c.vocab].encode(c.text, null, { addSpecialTokens: false });
    const ids = Array.from(enc.getIds());
    if (JSON.stringify(ids) === JSON.stringify(c.ids)) same++;
    else { diff++; console.log(`DIFF ${c.vocab} ${c.name}\n  hf  ${JSON.stringify(ids)}\n  ref ${JSON.stringify(c.ids)}`); }
  }
  console.log(`hf check: ${same} same, ${diff} different`);
  process.exit(diff ? 1 : 0);
})();
JS
