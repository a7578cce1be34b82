#!/usr/bin/env python3
"""train: train strata-ops-moe, a small qwen3moe model, on the GPU (PyTorch).

    python3 tools/train/train.py DATA_DIR OUT_DIR [--seconds S] [--smoke]

DATA_DIR holds make_corpus.py's output (train.npz, val_*.npy, agree_*.npy) and
config.json (the shape; tools/train/build.sh writes it from the skeleton GGUF).

The forward is exactly strata's / llama.cpp's qwen3moe (tests/ref/qwen3moe_ref.py):
RMSNorm (eps from the GGUF), per-head RMSNorm of Q and K before NEOX RoPE, causal
GQA attention scaled by 1/sqrt(head_dim), softmax router over all experts, top-k
selection, the k weights renormalised to sum 1, SwiGLU experts down(silu(gate x) * up x),
untied output head. The MoE is computed densely (every expert on every token as three
large matrix products, outputs of unselected experts weighted by 0): the same function
and the same gradients as a sparse dispatch, and far faster at this size. A Switch-style
load-balancing loss (n_expert * sum_i f_i P_i) keeps routing spread.

Writes to OUT_DIR:
  weights.partNN   the trained weights as one little-endian bf16 blob (split in parts < 16 MiB),
  manifest.json    tensor names (GGUF names), shapes (numpy order), offsets into the blob,
  agree_logits.npy float32 logits of the agreement sequences (computed in float32 with the
                   bf16-rounded weights, exactly the values the F32 GGUF holds), rows listed in manifest,
  train_log.json   loss curve and figures,
  loss.png         the loss curve.
"""
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)) * w


class Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.amp = True   # bf16 attention inputs (training); False: float32 everywhere
        V, E, L, H, Hk, D, X, Fe = (c[k] for k in ("n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv",
                                                   "head_dim", "n_expert", "n_ff_exp"))
        P = torch.nn.Parameter
        std = 0.02
        so = std / math.sqrt(2 * L)
        self.tok = P(torch.randn(V, E) * std)
        self.out = P(torch.randn(V, E) * std)
        self.onorm = P(torch.ones(E))
        self.layers = torch.nn.ModuleList()
        for _ in range(L):
            m = torch.nn.Module()
            m.anorm = P(torch.ones(E))
            m.wq = P(torch.randn(H * D, E) * std)
            m.wk = P(torch.randn(Hk * D, E) * std)
            m.wv = P(torch.randn(Hk * D, E) * std)
            m.wo = P(torch.randn(E, H * D) * so)
            m.qn = P(torch.ones(D))
            m.kn = P(torch.ones(D))
            m.fnorm = P(torch.ones(E))
            m.router = P(torch.randn(X, E) * std)
            m.gate = P(torch.randn(X, Fe, E) * std)
            m.up = P(torch.randn(X, Fe, E) * std)
            m.down = P(torch.randn(X, E, Fe) * so)
            self.layers.append(m)
        D2 = D // 2
        inv = c["rope_base"] ** (-torch.arange(0, D2, dtype=torch.float64) * 2 / D)
        self.register_buffer("inv_freq", inv, persistent=False)

    def rope(self, x, T):
        # x (B, h, T, D); NEOX: rotate (x[i], x[i + D/2]); angles in float64 then float32, as ggml
        pos = torch.arange(T, device=x.device, dtype=torch.float64)
        th = pos[:, None] * self.inv_freq[None, :]
        cos, sin = th.cos().float(), th.sin().float()
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def forward(self, ids, want_aux=True):
        c = self.c
        B, T = ids.shape
        H, Hk, D, X, K, Fe, eps = (c[k] for k in ("n_head", "n_head_kv", "head_dim", "n_expert", "n_expert_used",
                                                  "n_ff_exp", "eps"))
        x = self.tok[ids]
        aux = 0.0
        counts = []
        for m in self.layers:
            n = rms(x, m.anorm, eps)
            q = (n @ m.wq.t()).view(B, T, H, D)
            k = (n @ m.wk.t()).view(B, T, Hk, D)
            v = (n @ m.wv.t()).view(B, T, Hk, D)
            q = self.rope(rms(q, m.qn, eps).transpose(1, 2), T)
            k = self.rope(rms(k, m.kn, eps).transpose(1, 2), T)
            v = v.transpose(1, 2)
            dt = torch.bfloat16 if self.amp else torch.float32
            k = k.repeat_interleave(H // Hk, dim=1)   # q-head h reads kv-head h // (H / Hkv)
            v = v.repeat_interleave(H // Hk, dim=1)
            a = F.scaled_dot_product_attention(q.to(dt), k.to(dt), v.to(dt), is_causal=True,
                                               scale=1.0 / math.sqrt(D))
            x = x + a.transpose(1, 2).reshape(B, T, H * D) @ m.wo.t()
            n = rms(x, m.fnorm, eps).view(B * T, -1)
            with torch.autocast("cuda", enabled=False):   # routing in float32, as strata
                probs = torch.softmax(n.float() @ m.router.float().t(), dim=-1)
            w, sel = torch.topk(probs, K, dim=-1)
            w = w / torch.clamp(w.sum(-1, keepdim=True), min=6.103515625e-5)
            G = torch.zeros_like(probs).scatter(1, sel, w)                  # (N, X)
            g = n @ m.gate.reshape(X * Fe, -1).t()
            u = n @ m.up.reshape(X * Fe, -1).t()
            h = (F.silu(g) * u).view(-1, X, Fe) * G.to(g.dtype)[:, :, None]
            y = h.reshape(-1, X * Fe) @ m.down.permute(0, 2, 1).reshape(X * Fe, -1)
            x = x + y.view(B, T, -1)
            if want_aux:
                f = torch.zeros(X, device=ids.device).scatter_add(0, sel.reshape(-1),
                                                                  torch.ones(sel.numel(), device=ids.device))
                f = f / sel.numel()
                aux = aux + X * (f * probs.mean(0)).sum()
                counts.append(f.detach())
        x = rms(x, self.onorm, eps)
        return x @ self.out.t(), aux, counts

    # GGUF names, numpy-order shapes (= PyTorch shapes) of every weight
    def named_for_gguf(self):
        yield "token_embd.weight", self.tok
        yield "output_norm.weight", self.onorm
        yield "output.weight", self.out
        for i, m in enumerate(self.layers):
            p = "blk.%d." % i
            for n, t in (("attn_norm", m.anorm), ("attn_q", m.wq), ("attn_k", m.wk), ("attn_v", m.wv),
                         ("attn_output", m.wo), ("attn_q_norm", m.qn), ("attn_k_norm", m.kn),
                         ("ffn_norm", m.fnorm), ("ffn_gate_inp", m.router), ("ffn_gate_exps", m.gate),
                         ("ffn_up_exps", m.up), ("ffn_down_exps", m.down)):
                yield p + n + ".weight", t


def main(argv):
    data, out = argv[1], argv[2]
    secs = float(argv[argv.index("--seconds") + 1]) if "--seconds" in argv else 300.0
    smoke = "--smoke" in argv
    os.makedirs(out, exist_ok=True)
    c = json.load(open(os.path.join(data, "config.json")))
    dev = "cuda"
    torch.manual_seed(0)
    z = np.load(os.path.join(data, "train.npz"))
    tr_ids = torch.from_numpy(z["ids"].astype(np.int64))
    tr_mask = torch.from_numpy(z["mask"].astype(np.float32))
    va_ids = torch.from_numpy(np.load(os.path.join(data, "val_ids.npy")).astype(np.int64))
    va_mask = torch.from_numpy(np.load(os.path.join(data, "val_mask.npy")).astype(np.float32))
    T = c.get("seq_len", 1024)
    Bsz = 4 if smoke else c.get("batch", 64)
    w_other = c.get("w_other", 0.1)
    aux_coef = c.get("aux_coef", 0.01)
    model = Model(c).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print("params %.2fM, train tokens %d, val tokens %d" % (n_params / 1e6, len(tr_ids), len(va_ids)), flush=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    lr_max = c.get("lr", 2e-3)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=lr_max, betas=(0.9, 0.95), eps=1e-8, fused=True)
    g = torch.Generator().manual_seed(1)
    tr_ids_d, tr_mask_d = tr_ids.to(dev), tr_mask.to(dev)
    ar = torch.arange(T + 1, device=dev)

    def batch():
        st = torch.randint(0, len(tr_ids) - T - 1, (Bsz,), generator=g).to(dev)
        idx = st[:, None] + ar[None, :]
        x, m = tr_ids_d[idx], tr_mask_d[idx]
        return x[:, :-1], x[:, 1:], m[:, 1:]

    def lossf(logits, y, m):
        l = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
        wt = m.reshape(-1) + w_other * (1 - m.reshape(-1))
        return (l * wt).sum() / wt.sum(), (l * m.reshape(-1)).sum() / m.sum().clamp(min=1)

    @torch.no_grad()
    def evaluate(n_max=40):
        model.eval()
        tot, totm, n = 0.0, 0.0, 0
        for s in range(0, min(len(va_ids) - T - 1, n_max * T), T):
            x = va_ids[s:s + T + 1].to(dev)[None]
            m = va_mask[s:s + T + 1].to(dev)[None]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                lg, _, _ = model(x[:, :-1], want_aux=False)
            l = F.cross_entropy(lg.float()[0], x[0, 1:], reduction="none")
            tot += l.mean().item()
            totm += ((l * m[0, 1:]).sum() / m[0, 1:].sum().clamp(min=1)).item()
            n += 1
        model.train()
        return tot / max(n, 1), totm / max(n, 1)

    log = {"config": c, "params": n_params, "steps": [], "val": []}
    t0 = time.time()
    step = 0
    warm = 100
    while True:
        el = time.time() - t0
        if el > secs or (smoke and step >= 5):
            break
        frac = el / secs
        lr = lr_max * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        x, y, m = batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, aux, counts = model(x)
        loss, lm = lossf(logits, y, m)
        tot = loss + aux_coef * aux / c["n_layer"]
        opt.zero_grad(set_to_none=True)
        tot.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0:
            cmax = max(float(cc.max()) for cc in counts) * c["n_expert"]
            rec = {"step": step, "t": round(time.time() - t0, 1), "loss": round(loss.item(), 4),
                   "loss_assist": round(lm.item(), 4), "aux": round(float(aux) / c["n_layer"], 4), "lr": lr,
                   "gnorm": round(float(gn), 3), "max_load": round(cmax, 2), "tokens": (step + 1) * Bsz * T}
            log["steps"].append(rec)
            print(json.dumps(rec), flush=True)
        if step % 400 == 0 and step > 0:
            v = evaluate(10)
            log["val"].append({"step": step, "val_loss": v[0], "val_loss_assist": v[1]})
            print("val", step, v, flush=True)
        step += 1
    torch.cuda.synchronize()
    log["train_seconds"] = time.time() - t0
    log["n_steps"] = step
    log["tokens_seen"] = step * Bsz * T
    v = evaluate(60)
    log["final_val"] = {"val_loss": v[0], "val_loss_assist": v[1]}
    print("final val", v, "steps", step, flush=True)

    # ---- export: round to bf16, keep those values for the float32 agreement logits
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    man = {"dtype": "bf16", "tensors": []}
    blobs, off = [], 0
    for name, t in model.named_for_gguf():
        b = t.detach().to(torch.bfloat16).contiguous().view(torch.int16).cpu().numpy().tobytes()
        man["tensors"].append({"name": name, "shape": list(t.shape), "offset": off, "nbytes": len(b)})
        blobs.append(b)
        off += len(b)
    blob = b"".join(blobs)
    part = 15 * 1024 * 1024
    n_parts = 0
    for i in range(0, len(blob), part):
        with open(os.path.join(out, "weights.part%02d" % n_parts), "wb") as f:
            f.write(blob[i:i + part])
        n_parts += 1
    man["n_parts"], man["total_bytes"] = n_parts, len(blob)

    # agreement logits: float32 everywhere (no TF32), bf16-rounded weights
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    a_ids = np.load(os.path.join(data, "agree_ids.npy"))
    a_off = np.load(os.path.join(data, "agree_off.npy"))
    quota = c.get("agree_quota", [100, 73, 32, 32, 32, 32])   # last rows kept per sequence (~1.2 MB each 100)
    rows, sel_rows = [], []
    model.eval()
    model.amp = False
    with torch.no_grad():
        for i in range(len(a_off) - 1):
            ids = torch.from_numpy(a_ids[a_off[i]:a_off[i + 1]].astype(np.int64)).to(dev)[None]
            lg, _, _ = model(ids, want_aux=False)
            n = ids.shape[1]
            k = min(n, quota[i] if i < len(quota) else 0)
            if k == 0:
                continue
            rows.append(lg[0, n - k:].float().cpu().numpy())
            sel_rows.append({"seq": i, "first_row": n - k, "n_rows": k, "n_tokens": n})
    np.save(os.path.join(out, "agree_logits.npy"), np.concatenate(rows).astype(np.float32))
    man["agree_rows"] = sel_rows
    json.dump(man, open(os.path.join(out, "manifest.json"), "w"), indent=1)
    json.dump(log, open(os.path.join(out, "train_log.json"), "w"))

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        st = log["steps"]
        fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
        tk = [r["tokens"] / 1e6 for r in st]
        ax.plot(tk, [r["loss"] for r in st], label="train loss (weighted)")
        ax.plot(tk, [r["loss_assist"] for r in st], label="train loss, assistant turns + prose")
        if log["val"]:
            ax.plot([v["step"] * Bsz * T / 1e6 for v in log["val"]], [v["val_loss_assist"] for v in log["val"]],
                    "o-", label="held-out loss, assistant turns + prose")
        ax.set_xlabel("training tokens (millions)")
        ax.set_ylabel("cross-entropy (nats)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
        ax.set_title("strata-ops-moe: %.1fM params, %d steps" % (n_params / 1e6, step))
        fig.tight_layout()
        fig.savefig(os.path.join(out, "loss.png"))
    except Exception as e:  # noqa: BLE001
        print("plot failed:", e, flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv)
