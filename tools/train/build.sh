#!/bin/sh
# tools/train/build.sh: rebuild strata-ops-moe from scratch (run from the repository root).
#
#   sh tools/train/build.sh prepare        # here (CPU): skeleton, corpus, eval sets, .train_data/config.json
#   (device) python3 tools/train/train.py .train_data $OUT --seconds 420     # GPU, PyTorch; carry .train_data
#   sh tools/train/build.sh export RUN     # here: RUN = train.py's output dir -> models/strata-ops-moe.gguf
#
# Needs: build/strata (make), /usr/bin/python3 with numpy and regex, Debian's bible-kjv and wamerican.
set -eu
W=${W:-/tmp/strata-train}
PY=${PY:-python3}
mkdir -p "$W"
SHAPE="--layers 8 --experts 64 --experts-used 4 --embd 256 --ff-exp 64 --heads 4 --heads-kv 2 --head-dim 64 --vocab 4096 --ctx 2048"
case "${1:-}" in
prepare)
    # the corpus's Debian sources (offline: the Debian mirror only)
    if [ ! -d /usr/share/bible-kjv ] && ! dpkg -s bible-kjv >/dev/null 2>&1 || ! dpkg -s wamerican >/dev/null 2>&1; then
        apt-get install -y -q bible-kjv wamerican >/dev/null || { echo "build.sh: cannot install bible-kjv wamerican" >&2; exit 1; }
    fi
    build/strata mkmodel -o "$W/skeleton.gguf" --preset tiny $SHAPE --type f32 -q
    $PY tools/train/make_corpus.py "$W/skeleton.gguf" .train_data --n-chat 80000
    $PY - "$W/skeleton.gguf" <<'EOF'
import json, sys
sys.path.insert(0, "tests/ref")
import gguf_ref
m = gguf_ref.GGUFFile(sys.argv[1]).metadata
a = "qwen3moe."
c = {"n_vocab": len(m["tokenizer.ggml.tokens"]), "n_embd": m[a + "embedding_length"], "n_layer": m[a + "block_count"],
     "n_head": m[a + "attention.head_count"], "n_head_kv": m[a + "attention.head_count_kv"],
     "head_dim": m[a + "attention.key_length"], "n_expert": m[a + "expert_count"],
     "n_expert_used": m[a + "expert_used_count"], "n_ff_exp": m[a + "expert_feed_forward_length"],
     "eps": float(m[a + "attention.layer_norm_rms_epsilon"]), "rope_base": float(m[a + "rope.freq_base"]),
     "seq_len": 1024, "batch": 64, "lr": 2e-3, "aux_coef": 0.01, "w_other": 0.1, "agree_rows": 300}
json.dump(c, open(".train_data/config.json", "w"), indent=1)
print(c)
EOF
    ;;
export)
    RUN=$2
    $PY tools/train/export_gguf.py "$W/skeleton.gguf" "$RUN" "$W/strata-ops-moe-f32.gguf"
    mkdir -p models
    build/strata quantize "$W/strata-ops-moe-f32.gguf" models/strata-ops-moe.gguf Q4_K_M
    ;;
*)
    echo "usage: sh tools/train/build.sh prepare | export RUN_DIR" >&2
    exit 2
    ;;
esac
