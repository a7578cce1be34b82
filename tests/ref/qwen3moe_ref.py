"""qwen3moe_ref: the qwen3moe forward pass in float64, the spec in code.

Written from FORMATS.md section 3 (llama.cpp src/models/qwen3moe.cpp and
llama-graph.cpp build_moe_ffn); no code is shared with strata.

    python3 tests/ref/qwen3moe_ref.py MODEL IDS OUT.npy [--act-quant] [--kv f16]
        IDS: comma- or space-separated token ids (or @FILE with them)
        OUT.npy: logits [n_tokens, n_vocab] float64 (row i = after token i,
        positions 0..n-1, no BOS added)

By default every weight is dequantized exactly and everything is computed in
float64: the "true" model the file describes. Two options emulate what
llama.cpp's CPU backend does on purpose, so that a float32 engine that follows
it can be compared with a tight tolerance:
  act_quant: activations entering a matmul are rounded to float32 and
             quantized to the weight type's vec_dot_type (quant_ref.py), and
             RoPE angles and RMSNorm are computed in float32 as ggml does
             (rope_angles, rms_norm_ggml).
  kv="f16":  K and V are rounded to fp16 when stored in the KV cache.

Shapes: a GGUF weight with ne = {in, out} is read as a numpy (out, in)
matrix W and applied as x @ W.T; experts ne = {in, out, n_expert} are
(n_expert, out, in).
"""

import math
import sys

import numpy as np

from gguf_ref import GGUFFile
from dequant_ref import block_mins
from quant_ref import (DOT_TYPE, act_quant_dequant, act_dot_correction, act_near_boundary,
                       act_scale_near_boundary, nudge_across)


class Hparams:
    """qwen3moe hyperparameters from the GGUF keys, with llama.cpp's defaults."""

    def __init__(self, g):
        arch = g.get("general.architecture")
        if arch != "qwen3moe":
            raise ValueError("not a qwen3moe model: %r" % arch)

        def key(name, default=None, required=False):
            k = "qwen3moe." + name
            if k in g.metadata:
                return g.metadata[k]
            if required:
                raise ValueError("missing key " + k)
            return default

        def scalar(v, what):
            if isinstance(v, np.ndarray):   # per-layer array: must be uniform here
                if v.size == 0 or np.any(v != v[0]):
                    raise ValueError(what + ": per-layer values not supported by the oracle")
                return int(v[0])
            return v

        self.n_embd = int(key("embedding_length", required=True))
        self.n_layer = int(key("block_count", required=True))
        self.n_head = int(scalar(key("attention.head_count", required=True), "head_count"))
        self.n_head_kv = int(scalar(key("attention.head_count_kv", self.n_head), "head_count_kv"))
        self.head_dim = int(key("attention.key_length", self.n_embd // self.n_head))
        self.head_dim_v = int(key("attention.value_length", self.n_embd // self.n_head))
        self.eps = float(key("attention.layer_norm_rms_epsilon", required=True))
        self.rope_base = float(key("rope.freq_base", 10000.0))
        self.n_rot = int(key("rope.dimension_count", self.head_dim))
        self.n_expert = int(key("expert_count", 0))
        self.n_expert_used = int(key("expert_used_count", 0))
        n_ff = int(key("feed_forward_length", 0))
        ff_exp = int(key("expert_feed_forward_length", 0))
        self.n_ff_exp = ff_exp if ff_exp else (n_ff // self.n_expert_used if self.n_expert_used else 0)
        # Only linear RoPE scaling (freq_scale = 1/factor) is modelled here.
        self.freq_scale = 1.0
        rs_type = key("rope.scaling.type", "none")
        rs_factor = float(key("rope.scaling.factor", 0.0) or 0.0)
        if rs_type == "linear" and rs_factor:
            self.freq_scale = 1.0 / rs_factor
        elif rs_type not in ("none", "linear"):
            raise ValueError("rope scaling %r not modelled by the oracle" % rs_type)
        if self.n_expert <= 0 or self.n_expert_used <= 0:
            raise ValueError("qwen3moe needs expert_count and expert_used_count > 0")
        if self.head_dim != self.head_dim_v or self.n_rot != self.head_dim:
            raise ValueError("qwen3moe requires key_length == value_length == rope dims")


class Weights:
    """Dequantized float64 weights plus each matrix's ggml type (for act_quant)."""

    def __init__(self, g, hp):
        self.g = g
        self.types = {}
        self.cache = {}
        L = hp.n_layer
        self.tok_embd = self.mat("token_embd.weight")                 # (V, E)
        self.output_norm = self.mat("output_norm.weight")             # (E,)
        # output.weight is optional: absent => tied to token_embd.
        self.output_name = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
        self.output = self.mat(self.output_name)                      # (V, E)
        self.layers = []
        for i in range(L):
            p = "blk.%d." % i
            lw = {"attn_norm": self.mat(p + "attn_norm.weight"),
                  "q_norm": self.mat(p + "attn_q_norm.weight"),
                  "k_norm": self.mat(p + "attn_k_norm.weight"),
                  "wo": p + "attn_output.weight",
                  "ffn_norm": self.mat(p + "ffn_norm.weight"),
                  "router": p + "ffn_gate_inp.weight",
                  "gate": p + "ffn_gate_exps.weight",
                  "up": p + "ffn_up_exps.weight",
                  "down": p + "ffn_down_exps.weight"}
            if p + "attn_qkv.weight" in g.tensors:   # fused Q|K|V rows
                lw["qkv"] = p + "attn_qkv.weight"
            else:
                lw["wq"], lw["wk"], lw["wv"] = p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"
            self.layers.append(lw)
            for k in ("wo", "router", "gate", "up", "down", "qkv", "wq", "wk", "wv"):
                if k in lw:
                    self.mat(lw[k])

    def mat(self, name):
        if name not in self.cache:
            if name not in self.g.tensors:
                raise KeyError("missing tensor " + name)
            self.cache[name] = self.g.array(name)
            self.types[name] = self.g.tensors[name].type
        return self.cache[name]


def rms_norm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rms_norm_ggml(x, w, eps):
    """rms_norm as ggml-cpu computes it, in float32: squares in float32 summed
    in double, mean rounded to float32, scale = 1.0f/sqrtf(mean + eps), then
    (x * scale) * w. On grid-valued inputs (a quantized embedding row) many
    activations land exactly on a Q8 rounding tie, and which way they round
    then depends on these last bits; the emulated reference reproduces them."""
    f32 = np.float32
    x32 = np.asarray(x).astype(f32)
    sq = (x32 * x32).astype(np.float64)
    mean = (sq.sum(axis=-1, keepdims=True) / x32.shape[-1]).astype(f32)
    scale = (f32(1.0) / np.sqrt((mean + f32(eps)).astype(f32))).astype(f32)
    return ((x32 * scale).astype(f32) * np.asarray(w).astype(f32)).astype(np.float64)


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def rope_angles(pos, n_rot, base, freq_scale, ggml=False):
    """theta[t, i] = pos_t * freq_scale * base^(-2i/n_rot), i < n_rot/2.

    ggml=True reproduces how ggml-cpu forms the angle (ops.cpp rope cache): in
    float32, theta_scale = powf(base, -2.0f/n_rot), theta = (float)pos, then
    theta *= theta_scale once per pair. That drifts from the exact angle by up
    to ~1e-6 relative at the last pairs, enough to move an activation across a
    Q8 rounding boundary now and then, so the emulated reference uses it."""
    half = n_rot // 2
    if not ggml:
        i = np.arange(half, dtype=np.float64)
        return pos[:, None].astype(np.float64) * freq_scale * base ** (-2.0 * i / n_rot)
    f32 = np.float32
    # powf: glibc's is correctly rounded for these arguments; so is this.
    scale = f32(np.float64(f32(base)) ** np.float64(f32(-2.0) / f32(n_rot)))
    theta = np.empty((len(pos), half), dtype=f32)
    t = pos.astype(f32)
    for i in range(half):
        theta[:, i] = (f32(freq_scale) * t).astype(f32)
        t = (t * scale).astype(f32)
    return theta.astype(np.float64)


def rope_neox(x, theta, n_rot):
    """NEOX RoPE on x (T, H, D) with angles theta (T, n_rot/2): rotate the pair
    (x[i], x[i + n_rot/2]) by theta_i. Dims >= n_rot pass through."""
    half = n_rot // 2
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.copy()
    a, b = x[..., :half], x[..., half:n_rot]
    out[..., :half] = a * c - b * s
    out[..., half:n_rot] = a * s + b * c
    return out


class Model:
    def __init__(self, path, act_quant=False, kv="f32", dtype=np.float64):
        self.g = GGUFFile(path)
        self.hp = Hparams(self.g)
        self.w = Weights(self.g, self.hp)
        # dtype=np.float32 runs the same code in float32: not the oracle, but a
        # calibration of how far plain float32 rounding moves the logits.
        self.dtype = dtype
        if dtype != np.float64:
            for k in self.w.cache:
                self.w.cache[k] = self.w.cache[k].astype(dtype)
            for lw in self.w.layers:
                for k, v in lw.items():
                    if isinstance(v, np.ndarray):
                        lw[k] = v.astype(dtype)
            self.w.tok_embd = self.w.cache["token_embd.weight"]
            self.w.output_norm = self.w.cache["output_norm.weight"]
        self.act_quant = act_quant
        self.norm = rms_norm_ggml if act_quant else rms_norm
        self.kv = kv
        self._mins = {}
        self.n_vocab = self.w.tok_embd.shape[0]
        self.router_margin = []   # per layer (T,) gap prob[k-1] - prob[k] (routing near-ties)
        # Near-boundary bookkeeping (act_quant only), for explaining where a
        # float32 engine legitimately rounds differently (see test_oracle.py):
        #   events: {key: frag} for activations within `event_limit` of a
        #           rounding boundary, key = ("act", input, dot_type, pos, j);
        #           Q8_0/Q8_1 block scales near an fp16 midpoint,
        #           key = ("scale", input, dot_type, pos, block, "d" | "s");
        #           routing near-ties key = ("route", layer, pos), frag = margin.
        #   forced: keys to round the other way / routes to swap (rank k-1 <-> k).
        self.event_limit = 1e-4         # element roundings: distance / block amax
        self.scale_event_limit = 1e-6   # fp16 block scales d, s: relative distance
        self.events = {}
        self.forced = set()

    def linear(self, x, name, expert=None, akey=None):
        """y = x @ W.T for weight `name` (expert slab `expert` of a 3-D one).
        With act_quant, as ggml-cpu computes it (_ggml_linear); akey names the
        activation tensor x, quantized once for every matmul that reads it
        (Q/K/V; router, gate and up of all experts)."""
        W = self.w.cache[name]
        if expert is not None:
            W = W[expert]
        if not self.act_quant:
            return x @ W.T
        return self._ggml_linear(x, W, name, expert, akey)

    def _ggml_linear(self, x, W, name, expert, akey):
        """x rounded to float32 and quantized to the weight type's dot type,
        dequantized, then an exact dot; records activations near a rounding
        boundary (self.events) and applies forced roundings (self.forced)."""
        t = self.w.types[name]
        x32 = x.astype(np.float32)
        rows = self._rows if self._rows is not None else np.arange(x.shape[0])
        dt = DOT_TYPE[t]
        for key in self.forced:
            if key[0] == "act" and key[1] == akey and key[2] == dt:
                for r in np.flatnonzero(rows == key[3]):
                    nudged = nudge_across(x32[r], key[4], t)
                    if nudged is not None:
                        x32[r] = nudged
        if dt in (8, 9, 15):   # Q8 roundings only: fp16/bf16 ones are too dense to track
            for frag, r, j in act_near_boundary(x32, t, self.event_limit):
                k = ("act", akey, dt, int(rows[r]), j)
                self.events[k] = min(frag, self.events.get(k, np.inf))
            for frag, r, b, field in act_scale_near_boundary(x32, t, self.scale_event_limit):
                k = ("scale", akey, dt, int(rows[r]), b, field)
                self.events[k] = min(frag, self.events.get(k, np.inf))
        flips = [(int(r), key[4], key[5]) for key in self.forced
                 if key[0] == "scale" and key[1] == akey and key[2] == dt for r in np.flatnonzero(rows == key[3])]
        y = act_quant_dequant(x32, t, flips).astype(self.dtype) @ W.T
        if t in (3, 7):   # Q4_1 / Q5_1 x Q8_1 min-term rounding
            y = y + act_dot_correction(x32, t, self._block_mins(name, expert), flips).astype(self.dtype)
        return y

    def _block_mins(self, name, expert):
        key = (name, expert)
        if key not in self._mins:
            ti = self.g.tensors[name]
            n = int(np.prod(ti.ne))
            m = block_mins(ti.type, self.g.raw(name), n).reshape(tuple(reversed(ti.ne))[:-1] + (-1,))
            self._mins[key] = m if expert is None else m[expert]
        return self._mins[key]

    def attention(self, x, lw, pos, il):
        hp = self.hp
        T = x.shape[0]
        H, Hkv, D = hp.n_head, hp.n_head_kv, hp.head_dim
        if "qkv" in lw:
            qkv = self.linear(x, lw["qkv"], akey=("attn_in", il))
            q, k, v = np.split(qkv, [H * D, H * D + Hkv * D], axis=1)
        else:
            a = ("attn_in", il)
            q, k, v = (self.linear(x, lw[n], akey=a) for n in ("wq", "wk", "wv"))
        q = q.reshape(T, H, D)
        k = k.reshape(T, Hkv, D)
        v = v.reshape(T, Hkv, D)
        # Per-head RMSNorm of Q and K (weights {head_dim}), then RoPE.
        theta = rope_angles(pos, hp.n_rot, hp.rope_base, hp.freq_scale, ggml=self.act_quant)
        q = rope_neox(self.norm(q, lw["q_norm"], hp.eps), theta, hp.n_rot)
        k = rope_neox(self.norm(k, lw["k_norm"], hp.eps), theta, hp.n_rot)
        if self.kv == "f16":   # the KV cache stores fp16
            k = k.astype(np.float32).astype(np.float16).astype(self.dtype)
            v = v.astype(np.float32).astype(np.float16).astype(self.dtype)
        # Causal GQA attention: query head h reads kv head h // (H / Hkv).
        group = H // Hkv
        kh = np.repeat(k, group, axis=1)                    # (T, H, D)
        vh = np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, kh) * self.dtype(1.0 / math.sqrt(D))   # (H, Tq, Tk)
        mask = pos[None, :] > pos[:, None]                  # key position after query
        scores = np.where(mask[None], -np.inf, scores)
        p = softmax(scores, axis=-1)
        out = np.einsum("hts,shd->thd", p, vh).reshape(T, H * D)
        return self.linear(out, lw["wo"], akey=("attn_out", il))

    def moe(self, x, lw, il):
        """Softmax router, top-k, weights renormalised (qwen3moe: always), SwiGLU experts."""
        hp = self.hp
        k = hp.n_expert_used
        logits = self.linear(x, lw["router"], akey=("ffn_in", il))   # (T, n_expert)
        probs = softmax(logits, axis=-1)
        order = np.argsort(-probs, axis=-1, kind="stable")
        for key in self.forced:   # oracle diagnostics: swap the k-th and (k+1)-th choice
            if key[0] == "route" and key[1] == il and k < hp.n_expert:
                order[key[2], [k - 1, k]] = order[key[2], [k, k - 1]]
        sel = order[:, :k]                                   # (T, k)
        rows = np.arange(x.shape[0])[:, None]
        w = probs[rows, sel]
        w = w / np.maximum(w.sum(axis=-1, keepdims=True), self.dtype(6.103515625e-5))
        if k < hp.n_expert:
            srt = np.take_along_axis(probs, order, axis=-1)
            margin = np.abs(srt[:, k - 1] - srt[:, k])
            self.router_margin.append(margin)
            for t in np.flatnonzero(margin < self.event_limit):
                self.events[("route", il, int(t))] = float(margin[t])
        out = np.zeros_like(x)
        for e in np.unique(sel):
            t_idx, slot = np.nonzero(sel == e)
            xe = x[t_idx]
            self._rows = t_idx   # token positions of this expert's rows
            a = ("ffn_in", il)
            h = silu(self.linear(xe, lw["gate"], e, a)) * self.linear(xe, lw["up"], e, a)
            out[t_idx] += w[t_idx, slot][:, None] * self.linear(h, lw["down"], e, ("down", il, int(e)))
            self._rows = None
        return out

    def forward(self, ids):
        """Logits (T, n_vocab) float64 for tokens ids at positions 0..T-1."""
        hp = self.hp
        ids = np.asarray(ids, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise ValueError("token id out of range")
        pos = np.arange(len(ids))
        self.router_margin = []
        self.events = {}
        self._rows = None
        x = self.w.tok_embd[ids].copy()                      # (T, E)
        for il, lw in enumerate(self.w.layers):
            h = x + self.attention(self.norm(x, lw["attn_norm"], hp.eps), lw, pos, il)
            x = h + self.moe(self.norm(h, lw["ffn_norm"], hp.eps), lw, il)
        x = self.norm(x, self.w.output_norm, hp.eps)
        return self.linear(x, self.w.output_name, akey=("head",))


def parse_ids(s):
    if s.startswith("@"):
        with open(s[1:]) as f:
            s = f.read()
    return [int(t) for t in s.replace(",", " ").split()]


def main(argv):
    args, act_quant, kv = [], False, "f32"
    it = iter(argv[1:])
    for a in it:
        if a == "--act-quant":
            act_quant = True
        elif a == "--kv":
            kv = next(it, "f32")
        else:
            args.append(a)
    if len(args) != 3 or kv not in ("f32", "f16"):
        print("usage: qwen3moe_ref.py MODEL IDS OUT.npy [--act-quant] [--kv f16|f32]", file=sys.stderr)
        return 2
    m = Model(args[0], act_quant=act_quant, kv=kv)
    np.save(args[2], m.forward(parse_ids(args[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
