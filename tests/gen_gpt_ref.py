#!/usr/bin/python3
# Reference-data generator for MoE-GPT (forward, backward, 10 AdamW steps).
#
# What it does: for each case below it draws the model's parameters and a
# batch with a seeded torch.Generator, rounds them to float32, and computes
# everything in float64 PyTorch from the definition in docs/model.md,
# independently of libmoe:
#   x = wte[tokens] + wpe[:S]; per block (pre-LN):
#     x = x + proj(causal_attention(ln1(x)))
#     x = x + ffn(ln2(x))   (MoE layer of docs/moe-layer.md, or a dense GELU FFN)
#   logits = lnf(x) wte^T (tied head)
#   objective = sum of CE over targets != -1 / (number of such targets)
#               + sum over MoE layers of aux_loss_coef * aux + z_loss_coef * z
# Gradients come from autograd (no hand-written backward). Then 10 training
# steps: learning rate of step t by the schedule of docs/model.md (linear
# warm-up, cosine to min_lr), the gradients scaled by min(1, clip / global L2
# norm), torch.optim.AdamW with weight decay on the weight matrices only. The
# cross-entropy of each step's forward (the same batch every step) is stored.
#
# Routing robustness: libmoe routes in float32 and its parameters drift from
# the float64 ones over the steps, so a draw is rejected (and the next seed
# tried) when, at ANY of the 10 steps, in any MoE layer, for some token two
# adjacent ranks among the K+1 largest gate probabilities are closer than
# ROUTE_REL_GAP relative to the larger (this decides which experts are chosen
# and their order, which sets the GShard slots and so the dropped set).
#
# How to run (Debian's interpreter, which has torch 1.13 and numpy):
#     /usr/bin/python3 tests/gen_gpt_ref.py tests/data
# The output is deterministic. The files (format: tests/data/README.md, the
# MOEREF format of gen_layer_ref.py, whose writer is reused) are committed; the
# C test (tests/test_gpt_torch.c) needs neither Python nor torch.

import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_layer_ref import DT_F32, DT_I32, capacity_of, f32, route, write_ref  # noqa: E402

ROUTE_REL_GAP = 1e-3
MAX_TRIES = 2000
STEPS = 10
GATE_SCALE = 4.0

# name, config, optimizer, seed
CASES = [
    dict(name="moe1_dropless_renorm", V=256, S=8, L=2, NH=2, M=16, moe_every=1, Hd=24,
         E=4, K=2, H=32, f=0.0, renorm=1, aux=0.01, zl=0.001, B=3, seed=100),
    dict(name="moe2_capacity_drop", V=256, S=8, L=2, NH=2, M=16, moe_every=2, Hd=40,
         E=4, K=2, H=32, f=0.75, renorm=0, aux=0.01, zl=0.0, B=3, seed=200, want_drop=True),
]
OPTIM = dict(lr=1e-2, min_lr=1e-3, warmup=3, total=STEPS, beta1=0.9, beta2=0.95, eps=1e-8,
             wd=0.1, clip=1.0)
LN_EPS = 1e-5


def is_moe(c, block):
    return c["moe_every"] > 0 and (block + 1) % c["moe_every"] == 0


def param_specs(c):
    """(name, shape, kind) in the model's table order (docs/model.md)."""
    V, S, M, Hd, E, H = c["V"], c["S"], c["M"], c["Hd"], c["E"], c["H"]
    out = [("wte", (V, M), "w"), ("wpe", (S, M), "w")]
    for l in range(c["L"]):
        p = f"h{l}."
        out += [(p + "ln1.g", (M,), "g"), (p + "ln1.b", (M,), "b"),
                (p + "attn.w_qkv", (M, 3 * M), "w"), (p + "attn.b_qkv", (3 * M,), "b"),
                (p + "attn.w_proj", (M, M), "w"), (p + "attn.b_proj", (M,), "b"),
                (p + "ln2.g", (M,), "g"), (p + "ln2.b", (M,), "b")]
        if is_moe(c, l):
            out += [(p + "moe.wg", (M, E), "wg"), (p + "moe.w1", (E, M, H), "w1"),
                    (p + "moe.b1", (E, H), "b"), (p + "moe.w2", (E, H, M), "w2"),
                    (p + "moe.b2", (E, M), "b")]
        else:
            out += [(p + "ffn.w_fc", (M, Hd), "w"), (p + "ffn.b_fc", (Hd,), "b"),
                    (p + "ffn.w_fc2", (Hd, M), "w"), (p + "ffn.b_fc2", (M,), "b")]
    out += [("lnf.g", (M,), "g"), ("lnf.b", (M,), "b")]
    return out


def decays(name):
    """Weight decay applies to the weight matrices (not biases, LN, expert biases)."""
    leaf = name.split(".")[-1]
    return leaf in ("wte", "wpe", "w_qkv", "w_proj", "w_fc", "w_fc2", "wg", "w1", "w2")


def draw(c, seed):
    g = torch.Generator().manual_seed(seed)
    M, H = c["M"], c["H"]

    def u(shape, lo, hi):
        return torch.rand(*shape, generator=g, dtype=torch.float32) * (hi - lo) + lo

    def n(shape, std):
        return torch.randn(*shape, generator=g, dtype=torch.float32) * std

    params = {}
    for name, shape, kind in param_specs(c):
        if kind == "w":
            t = n(shape, 0.2)
        elif kind == "g":
            t = 1.0 + u(shape, -0.2, 0.2)
        elif kind == "b":
            t = u(shape, -0.1, 0.1)
        elif kind == "wg":
            t = u(shape, -1.0, 1.0) * (GATE_SCALE / math.sqrt(M))
        elif kind == "w1":
            t = u(shape, -1.0, 1.0) / math.sqrt(M)
        elif kind == "w2":
            t = u(shape, -1.0, 1.0) / math.sqrt(H)
        params[name] = t.contiguous()
    B, S, V = c["B"], c["S"], c["V"]
    seq = torch.randint(0, V, (B, S + 1), generator=g, dtype=torch.int64)
    tokens = seq[:, :-1].contiguous()
    targets = seq[:, 1:].clone()
    targets[1, 2] = -1  # an ignored position
    return params, tokens, targets


# ---- the model (float64) --------------------------------------------------------------


def moe_layer(c, x, wg, w1, b1, w2, b2):
    """docs/moe-layer.md on x (T, M). Returns y, aux, z, dropped, min routing gap."""
    T, M = x.shape
    E, K = c["E"], c["K"]
    C = capacity_of(c["f"], K, T, E)
    logits = x @ wg
    probs = torch.softmax(logits, dim=1)
    expert, slot, count, gap = route(probs.detach().numpy(), K, C)
    p = torch.gather(probs, 1, torch.from_numpy(expert))
    weight = p / p.sum(dim=1, keepdim=True) if c["renorm"] else p
    y = torch.zeros(T, M, dtype=torch.float64)
    for e in range(E):
        rows = sorted((int(slot[t, k]), t, k) for k in range(K) for t in range(T)
                      if expert[t, k] == e and slot[t, k] >= 0)
        if not rows:
            continue
        ts = torch.tensor([r[1] for r in rows], dtype=torch.long)
        ks = torch.tensor([r[2] for r in rows], dtype=torch.long)
        h = F.gelu(x[ts] @ w1[e] + b1[e])
        ye = h @ w2[e] + b2[e]
        y = y.index_add(0, ts, weight[ts, ks].unsqueeze(1) * ye)
    fe = torch.from_numpy(np.bincount(expert.reshape(-1), minlength=E).astype(np.float64)
                          / (T * K))
    aux = E * (fe * probs.mean(dim=0)).sum()
    lse = torch.logsumexp(logits, dim=1)
    z = (lse * lse).mean()
    return y, aux, z, int((slot < 0).sum()), gap


def attention(c, a, w_qkv, b_qkv):
    B, S, M = a.shape
    NH = c["NH"]
    hd = M // NH
    qkv = a @ w_qkv + b_qkv
    q, k, v = qkv.split(M, dim=2)
    q, k, v = (t.reshape(B, S, NH, hd).transpose(1, 2) for t in (q, k, v))  # (B, NH, S, hd)
    scores = q @ k.transpose(2, 3) / math.sqrt(hd)
    mask = torch.tril(torch.ones(S, S, dtype=torch.bool))
    scores = scores.masked_fill(~mask, float("-inf"))
    att = torch.softmax(scores, dim=3)
    return (att @ v).transpose(1, 2).reshape(B, S, M)


def forward(c, P, tokens, targets):
    """Returns logits (B,S,V), CE loss, objective, aux sum, z sum, dropped, min gap."""
    B, S = tokens.shape
    M = c["M"]
    x = P["wte"][tokens] + P["wpe"][:S]
    aux_sum = torch.zeros((), dtype=torch.float64)
    z_sum = torch.zeros((), dtype=torch.float64)
    dropped, gap = 0, math.inf
    for l in range(c["L"]):
        p = f"h{l}."
        a = F.layer_norm(x, (M,), P[p + "ln1.g"], P[p + "ln1.b"], LN_EPS)
        y = attention(c, a, P[p + "attn.w_qkv"], P[p + "attn.b_qkv"])
        x = x + y @ P[p + "attn.w_proj"] + P[p + "attn.b_proj"]
        h = F.layer_norm(x, (M,), P[p + "ln2.g"], P[p + "ln2.b"], LN_EPS)
        if is_moe(c, l):
            y, aux, z, dr, gp = moe_layer(c, h.reshape(B * S, M), P[p + "moe.wg"],
                                          P[p + "moe.w1"], P[p + "moe.b1"], P[p + "moe.w2"],
                                          P[p + "moe.b2"])
            x = x + y.reshape(B, S, M)
            aux_sum = aux_sum + aux
            z_sum = z_sum + z
            dropped += dr
            gap = min(gap, gp)
        else:
            f = F.gelu(h @ P[p + "ffn.w_fc"] + P[p + "ffn.b_fc"])
            x = x + f @ P[p + "ffn.w_fc2"] + P[p + "ffn.b_fc2"]
    x = F.layer_norm(x, (M,), P["lnf.g"], P["lnf.b"], LN_EPS)
    logits = x @ P["wte"].t()
    V = logits.shape[-1]
    ce_sum = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1,
                             reduction="sum")
    count = int((targets >= 0).sum())
    ce = ce_sum / count
    obj = ce + f32(c["aux"]) * aux_sum + f32(c["zl"]) * z_sum
    return logits, ce, obj, aux_sum, z_sum, dropped, gap


def lr_at(o, step):
    if o["warmup"] > 0 and step <= o["warmup"]:
        return o["lr"] * step / o["warmup"]
    if step >= o["total"]:
        return o["min_lr"]
    frac = (step - o["warmup"]) / (o["total"] - o["warmup"])
    return o["min_lr"] + 0.5 * (o["lr"] - o["min_lr"]) * (1.0 + math.cos(math.pi * frac))


def compute(c, params, tokens, targets):
    o = {k: (f32(v) if isinstance(v, float) else v) for k, v in OPTIM.items()}
    P = {k: v.to(torch.float64).clone().requires_grad_(True) for k, v in params.items()}
    names = [n for n, _, _ in param_specs(c)]
    opt = torch.optim.AdamW(
        [dict(params=[P[n] for n in names if decays(n)], weight_decay=o["wd"]),
         dict(params=[P[n] for n in names if not decays(n)], weight_decay=0.0)],
        lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    first = None
    losses, min_gap = [], math.inf
    for step in range(1, STEPS + 1):
        opt.zero_grad()
        logits, ce, obj, aux, z, dropped, gap = forward(c, P, tokens, targets)
        obj.backward()
        min_gap = min(min_gap, gap)
        losses.append(float(ce))
        if step == 1:
            first = dict(logits=logits.detach().clone(), loss=float(ce), aux=float(aux),
                         z=float(z), dropped=dropped,
                         grads={n: P[n].grad.detach().clone() for n in names})
        norm = math.sqrt(sum(float((P[n].grad ** 2).sum()) for n in names))
        scale = min(1.0, o["clip"] / norm) if o["clip"] > 0 else 1.0
        for n in names:
            P[n].grad.mul_(scale)
        for grp in opt.param_groups:
            grp["lr"] = lr_at(o, step)
        opt.step()
    return first, losses, min_gap


# ---- file ------------------------------------------------------------------------------


def write_case(path, c, params, tokens, targets, first, losses):
    B, S, V, M = c["B"], c["S"], c["V"], c["M"]
    T = B * S
    C = capacity_of(c["f"], c["K"], T, c["E"])
    o = OPTIM
    tensors = [
        ("config", np.array([V, S, c["L"], c["NH"], M, c["moe_every"], c["Hd"], B]), DT_I32),
        ("config_f", np.array([LN_EPS]), DT_F32),
        ("optim", np.array([o["lr"], o["min_lr"], o["warmup"], o["total"], o["beta1"],
                            o["beta2"], o["eps"], o["wd"], o["clip"], STEPS]), DT_F32),
        ("tokens", tokens.numpy(), DT_I32),
        ("targets", targets.numpy(), DT_I32),
    ]
    for name, shape, _ in param_specs(c):
        assert tuple(params[name].shape) == shape
        tensors.append((name, params[name].numpy(), DT_F32))
    tensors += [
        ("logits", first["logits"].numpy(), DT_F32),
        ("loss", np.array([first["loss"]]), DT_F32),
        ("aux", np.array([first["aux"]]), DT_F32),
        ("z", np.array([first["z"]]), DT_F32),
        ("dropped", np.array([first["dropped"]]), DT_I32),
    ]
    for name, _, _ in param_specs(c):
        tensors.append(("grad." + name, first["grads"][name].numpy(), DT_F32))
    tensors.append(("losses", np.array(losses), DT_F32))
    for name, arr, _ in tensors:
        assert np.all(np.isfinite(arr)), name
        assert len(name) < 32, name

    return write_ref(path, "gpt_" + c["name"], (T, M, c["H"], c["E"], c["K"], 0, c["renorm"], C),
                     c["f"], c["aux"], c["zl"], tensors)


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: /usr/bin/python3 tests/gen_gpt_ref.py OUTDIR\n")
        return 2
    outdir = argv[1]
    os.makedirs(outdir, exist_ok=True)
    torch.set_grad_enabled(True)
    total = 0
    for c in CASES:
        tries = 0
        for seed in range(c["seed"], c["seed"] + MAX_TRIES):
            tries += 1
            params, tokens, targets = draw(c, seed)
            first, losses, gap = compute(c, params, tokens, targets)
            if gap < ROUTE_REL_GAP:
                continue
            if c.get("want_drop") and first["dropped"] == 0:
                continue
            break
        else:
            raise SystemExit(f"{c['name']}: no robust draw in {MAX_TRIES} seeds")
        path = os.path.join(outdir, f"gpt_{c['name']}.bin")
        n = write_case(path, c, params, tokens, targets, first, losses)
        total += n
        print(f"{c['name']:24s} seed={seed} (tries {tries}) min gap={gap:.2e} "
              f"dropped={first['dropped']} loss={first['loss']:.6f} aux={first['aux']:.6f} "
              f"losses={' '.join(f'{x:.5f}' for x in losses)} bytes={n}")
    print(f"total {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
