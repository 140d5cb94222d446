#!/usr/bin/python3
# Reference-data generator for the libmoe MoE layer (forward and backward).
#
# What it does: for each case below it draws the layer's inputs (x, wg, w1, b1,
# w2, b2, dy) with a seeded torch.Generator, rounds them to float32, and then
# computes EVERYTHING in float64 with PyTorch autograd, following the
# definition in docs/moe-layer.md independently of libmoe:
#   gate linear -> softmax -> top-k (ties to the lower index) -> optional
#   renormalisation -> capacity C = ceil(((f*K)*T)/E) with GShard slot order ->
#   dispatch -> per-expert FFN (M -> H -> M, biases, GELU(erf) or ReLU) ->
#   combine; aux = E * sum_e f_e * P_e (f_e over all K choices, before
#   dropping); z = mean_t logsumexp(logits[t])^2.
# The gradients come from autograd on the objective
#   Lobj = sum(y * dy) + aux_loss_coef * aux + z_loss_coef * z
# (no hand-written backward). Results are stored as float32 (indices as int32)
# in tests/data/layer_<case>.bin.
#
# Routing robustness: libmoe routes in float32, so a draw is rejected (and the
# next seed tried) when, for some token, any two adjacent ranks among the K+1
# largest probabilities are closer than 1e-4 relative to the larger one (this
# covers the K-th vs (K+1)-th gap that decides WHICH experts are chosen, and
# also the gaps inside the top K that decide the choice ORDER, which matters
# for GShard slot order). For ReLU cases a draw is also rejected when some
# pre-activation of a kept row has |pre| < 1e-4 (a float32 sign flip there
# would change act'). Semantic properties of a case (drops happen, an expert
# is empty, ...) are asserted, not re-drawn.
#
# How to run (Debian's interpreter, which has torch 1.13 and numpy):
#     /usr/bin/python3 tests/gen_layer_ref.py tests/data
# The generated files are committed; the C test suite only reads them
# (tests/refio.c) and does NOT need torch or Python.
#
# ---------------------------------------------------------------------------
# Binary format (all little-endian, no padding; also in tests/data/README.md)
#
#   header (128 bytes):
#     char    magic[8]        = "MOEREF\0\0"
#     uint32  version         = 1
#     char    case_name[64]   NUL-padded
#     int32   T, M, H, E, K
#     int32   act             0 = gelu (erf), 1 = relu
#     int32   renormalize     0 / 1
#     int32   capacity        C, or -1 when dropless
#     float64 capacity_factor f (0 when dropless)
#     float32 aux_loss_coef, z_loss_coef
#     uint32  n_tensors
#   n_tensors records, each:
#     char    name[32]        NUL-padded
#     uint32  dtype           0 = float32, 1 = int32
#     uint32  ndim            1..4
#     int64   dims[4]         unused = 1
#     data                    row-major, prod(dims) elements of dtype
#   trailer:
#     uint32  crc32           zlib CRC-32 of every preceding byte of the file
#
#   tensors: x (T,M), wg (M,E), w1 (E,M,H), b1 (E,H), w2 (E,H,M), b2 (E,M),
#            dy (T,M), y (T,M), aux (1), z (1), expert (T,K) i32,
#            slot (T,K) i32 (-1 = dropped), weight (T,K), count (E) i32
#            (kept rows per expert), dx (T,M), dwg (M,E), dw1 (E,M,H),
#            db1 (E,H), dw2 (E,H,M), db2 (E,M)
# ---------------------------------------------------------------------------

import math
import os
import struct
import sys
import zlib

import numpy as np
import torch

MAGIC = b"MOEREF\0\0"
VERSION = 1
DT_F32, DT_I32 = 0, 1
ACT_GELU, ACT_RELU = 0, 1

ROUTE_REL_GAP = 1e-4   # min relative gap between adjacent ranks 0..K
RELU_MIN_PRE = 1e-4    # min |pre-activation| for ReLU cases
MAX_TRIES = 1000

AUX = 0.01
ZL = 0.001

# name, T, M, H, E, K, act, renormalize, capacity_factor, z_loss_coef, seed, extra
CASES = [
    dict(name="k1_gelu_e4_dropless", T=18, M=8, H=12, E=4, K=1, act=ACT_GELU,
         renorm=0, f=0.0, zl=0.0, seed=1000),
    dict(name="k2_gelu_e4_capacity_drop", T=24, M=8, H=16, E=4, K=2, act=ACT_GELU,
         renorm=0, f=0.75, zl=0.0, seed=2000, want="drop_second"),
    dict(name="k2_relu_e8_dropless", T=30, M=12, H=16, E=8, K=2, act=ACT_RELU,
         renorm=0, f=0.0, zl=0.0, seed=3000),
    dict(name="k1_relu_e8_capacity_drop", T=37, M=12, H=12, E=8, K=1, act=ACT_RELU,
         renorm=0, f=1.0, zl=0.0, seed=4000, want="drop"),
    dict(name="k2_gelu_e8_renorm_zloss", T=27, M=8, H=16, E=8, K=2, act=ACT_GELU,
         renorm=1, f=0.0, zl=ZL, seed=5000),
    dict(name="k2_relu_e4_empty_expert", T=21, M=8, H=12, E=4, K=2, act=ACT_RELU,
         renorm=0, f=0.0, zl=0.0, seed=6000, want="empty", empty_expert=2),
    dict(name="k2_gelu_e4_capacity_nodrop", T=20, M=12, H=12, E=4, K=2, act=ACT_GELU,
         renorm=0, f=1.75, zl=0.0, seed=7000, want="nodrop"),
    dict(name="k3_gelu_e8_renorm_capacity", T=33, M=12, H=16, E=8, K=3, act=ACT_GELU,
         renorm=1, f=0.8, zl=0.0, seed=8000, want="drop"),
]

GATE_SCALE = 4.0  # logits ~ O(1): routing neither uniform nor one-hot


def f32(v):
    """Python float rounded to float32, returned as a Python float."""
    return float(np.float32(v))


def capacity_of(f, K, T, E):
    if f <= 0.0:
        return -1
    return int(math.ceil(((f * K) * T) / E))  # double precision, this order


def draw(c, seed):
    """All inputs as float32 tensors (the stored values)."""
    g = torch.Generator().manual_seed(seed)
    T, M, H, E = c["T"], c["M"], c["H"], c["E"]

    def u(*shape, lo=-1.0, hi=1.0):
        return (torch.rand(*shape, generator=g, dtype=torch.float32) * (hi - lo) + lo)

    x = u(T, M)
    wg = u(M, E) * (GATE_SCALE / math.sqrt(M))
    w1 = u(E, M, H) * (1.0 / math.sqrt(M))
    b1 = u(E, H, lo=-0.1, hi=0.1)
    w2 = u(E, H, M) * (1.0 / math.sqrt(H))
    b2 = u(E, M, lo=-0.1, hi=0.1)
    dy = u(T, M)
    if "empty_expert" in c:
        x[:, 0] = 1.0                      # constant feature
        wg[0, c["empty_expert"]] = -8.0    # pushes that expert out of every top-K
    d = dict(x=x, wg=wg, w1=w1, b1=b1, w2=w2, b2=b2, dy=dy)
    for k, v in d.items():
        assert v.dtype == torch.float32
        d[k] = v.contiguous()
    return d


def route(probs, K, C):
    """Top-K per token (descending, ties to lower index) and GShard slots.

    probs: float64 numpy (T, E). Returns expert (T,K), slot (T,K), count (E),
    and the smallest relative gap (a - b) / a between adjacent ranks 0..K of
    any token (inf when there is no such pair): the routing is robust to
    float32 evaluation when it is >= ROUTE_REL_GAP."""
    T, E = probs.shape
    expert = np.zeros((T, K), dtype=np.int64)
    min_gap = math.inf
    for t in range(T):
        order = sorted(range(E), key=lambda e: (-probs[t, e], e))
        expert[t, :] = order[:K]
        for r in range(min(K, E - 1)):   # adjacent pairs (r, r+1)
            a, b = probs[t, order[r]], probs[t, order[r + 1]]
            min_gap = min(min_gap, (a - b) / a)
    slot = np.full((T, K), -1, dtype=np.int64)
    count = np.zeros(E, dtype=np.int64)
    for k in range(K):
        for t in range(T):
            e = expert[t, k]
            if C < 0 or count[e] < C:
                slot[t, k] = count[e]
                count[e] += 1
    return expert, slot, count, min_gap


def act_fn(act, pre):
    if act == ACT_GELU:
        return torch.nn.functional.gelu(pre)  # exact erf form (approximate='none')
    return torch.relu(pre)


def compute(c, inp):
    """float64 forward + autograd backward. Returns dict of results and flags."""
    T, M, H, E, K = c["T"], c["M"], c["H"], c["E"], c["K"]
    C = capacity_of(c["f"], K, T, E)
    aux_coef = f32(AUX)
    z_coef = f32(c["zl"])

    p64 = {k: v.to(torch.float64).clone().requires_grad_(k != "dy") for k, v in inp.items()}
    x, wg, w1, b1, w2, b2 = (p64[k] for k in ("x", "wg", "w1", "b1", "w2", "b2"))
    dy = p64["dy"]

    logits = x @ wg                                  # (T, E)
    probs = torch.softmax(logits, dim=1)             # (T, E)
    expert, slot, count, min_gap = route(probs.detach().numpy(), K, C)
    robust = min_gap >= ROUTE_REL_GAP

    ei = torch.from_numpy(expert)
    p = torch.gather(probs, 1, ei)                   # (T, K)
    if c["renorm"]:
        weight = p / p.sum(dim=1, keepdim=True)      # before any dropping
    else:
        weight = p

    y = torch.zeros(T, M, dtype=torch.float64)
    min_abs_pre = math.inf
    for e in range(E):
        # rows of expert e in slot order
        rows = [(int(slot[t, k]), t, k) for k in range(K) for t in range(T)
                if expert[t, k] == e and slot[t, k] >= 0]
        rows.sort()
        assert [r[0] for r in rows] == list(range(count[e]))
        if not rows:
            continue
        ts = torch.tensor([r[1] for r in rows], dtype=torch.long)
        ks = torch.tensor([r[2] for r in rows], dtype=torch.long)
        Xe = x[ts]                                   # dispatch (n_e, M)
        pre = Xe @ w1[e] + b1[e]                     # (n_e, H)
        min_abs_pre = min(min_abs_pre, float(pre.detach().abs().min()))
        h = act_fn(c["act"], pre)
        Ye = h @ w2[e] + b2[e]                       # (n_e, M)
        wk = weight[ts, ks].unsqueeze(1)             # (n_e, 1)
        y = y.index_add(0, ts, wk * Ye)              # combine

    # aux (Switch/GShard generalised to K): f_e over all K choices before dropping
    fe = torch.from_numpy(np.bincount(expert.reshape(-1), minlength=E).astype(np.float64) / (T * K))
    Pe = probs.mean(dim=0)
    aux = E * (fe * Pe).sum()
    lse = torch.logsumexp(logits, dim=1)
    z = (lse * lse).mean()

    lobj = (y * dy).sum() + aux_coef * aux + z_coef * z
    lobj.backward()

    if c["act"] == ACT_RELU and min_abs_pre < RELU_MIN_PRE:
        robust = False

    out = dict(
        y=y.detach(), aux=aux.detach().reshape(1), z=z.detach().reshape(1),
        expert=expert, slot=slot, count=count, weight=weight.detach(),
        dx=x.grad, dwg=wg.grad, dw1=w1.grad, db1=b1.grad, dw2=w2.grad, db2=b2.grad,
    )
    return out, C, robust


def check_case(c, out, C):
    """Assert the property a case exists to exercise."""
    slot, count, K, T = out["slot"], out["count"], c["K"], c["T"]
    dropped = int((slot < 0).sum())
    want = c.get("want")
    if C < 0:
        assert dropped == 0
    else:
        assert int(count.max()) <= C
    if want in ("drop", "drop_second"):
        assert dropped >= 1, f"{c['name']}: no choice dropped (C={C})"
    if want == "drop_second":
        n = sum(1 for t in range(T) if slot[t, 0] >= 0 and slot[t, 1] < 0)
        assert n >= 1, f"{c['name']}: no second choice dropped with its first kept"
    if want == "nodrop":
        assert C > 0 and dropped == 0, f"{c['name']}: {dropped} choices dropped (C={C})"
    if want == "empty":
        e = c["empty_expert"]
        assert int(count[e]) == 0, f"{c['name']}: expert {e} has count {count[e]}"
        assert not (out["expert"] == e).any()
    assert int(count.sum()) == T * K - dropped
    return dropped


def pack_str(s, n):
    b = s.encode("ascii")
    assert len(b) < n
    return b + b"\0" * (n - len(b))


def pack_tensor(name, arr, dtype):
    arr = np.ascontiguousarray(arr)
    shape = list(arr.shape)
    assert 1 <= len(shape) <= 4 and all(d >= 1 for d in shape), (name, shape)
    dims = shape + [1] * (4 - len(shape))
    hdr = pack_str(name, 32) + struct.pack("<II4q", dtype, len(shape), *dims)
    if dtype == DT_F32:
        data = arr.astype("<f4").tobytes()
    else:
        assert np.all(np.abs(arr) < 2**31)
        data = arr.astype("<i4").tobytes()
    return hdr + data


def write_case(path, c, inp, out, C):
    T, M, H, E, K = c["T"], c["M"], c["H"], c["E"], c["K"]
    tensors = [
        ("x", inp["x"].numpy(), DT_F32),
        ("wg", inp["wg"].numpy(), DT_F32),
        ("w1", inp["w1"].numpy(), DT_F32),
        ("b1", inp["b1"].numpy(), DT_F32),
        ("w2", inp["w2"].numpy(), DT_F32),
        ("b2", inp["b2"].numpy(), DT_F32),
        ("dy", inp["dy"].numpy(), DT_F32),
        ("y", out["y"].numpy(), DT_F32),
        ("aux", out["aux"].numpy(), DT_F32),
        ("z", out["z"].numpy(), DT_F32),
        ("expert", out["expert"], DT_I32),
        ("slot", out["slot"], DT_I32),
        ("weight", out["weight"].numpy(), DT_F32),
        ("count", out["count"], DT_I32),
        ("dx", out["dx"].numpy(), DT_F32),
        ("dwg", out["dwg"].numpy(), DT_F32),
        ("dw1", out["dw1"].numpy(), DT_F32),
        ("db1", out["db1"].numpy(), DT_F32),
        ("dw2", out["dw2"].numpy(), DT_F32),
        ("db2", out["db2"].numpy(), DT_F32),
    ]
    expect = {"x": (T, M), "wg": (M, E), "w1": (E, M, H), "b1": (E, H), "w2": (E, H, M),
              "b2": (E, M), "dy": (T, M), "y": (T, M), "aux": (1,), "z": (1,),
              "expert": (T, K), "slot": (T, K), "weight": (T, K), "count": (E,),
              "dx": (T, M), "dwg": (M, E), "dw1": (E, M, H), "db1": (E, H),
              "dw2": (E, H, M), "db2": (E, M)}
    for name, arr, _ in tensors:
        assert tuple(arr.shape) == expect[name], (name, arr.shape)
        assert np.all(np.isfinite(arr)), name
    # the stored float32 inputs are exactly the values the float64 run used
    for k in ("x", "wg", "w1", "b1", "w2", "b2", "dy"):
        assert inp[k].dtype == torch.float32

    return write_ref(path, c["name"], (T, M, H, E, K, c["act"], c["renorm"], C), c["f"], AUX,
                     c["zl"], tensors)


def write_ref(path, case_name, ints, f, aux_coef, z_coef, tensors):
    """Writes one MOEREF v1 file (format above): the 128-byte header with the
    eight ints T, M, H, E, K, act, renormalize, C, then the tensors
    [(name, array, dtype)], then the CRC-32. Returns the file size."""
    buf = bytearray()
    buf += MAGIC
    buf += struct.pack("<I", VERSION)
    buf += pack_str(case_name, 64)
    buf += struct.pack("<8i", *ints)
    buf += struct.pack("<d", float(f))
    buf += struct.pack("<ff", f32(aux_coef), f32(z_coef))
    buf += struct.pack("<I", len(tensors))
    assert len(buf) == 128
    for name, arr, dt in tensors:
        buf += pack_tensor(name, np.asarray(arr), dt)
    buf += struct.pack("<I", zlib.crc32(bytes(buf)) & 0xFFFFFFFF)
    with open(path, "wb") as fh:
        fh.write(bytes(buf))
    return len(buf)


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: /usr/bin/python3 tests/gen_layer_ref.py OUTDIR\n")
        return 2
    outdir = argv[1]
    os.makedirs(outdir, exist_ok=True)
    torch.set_grad_enabled(True)
    total = 0
    for c in CASES:
        for seed in range(c["seed"], c["seed"] + MAX_TRIES):
            inp = draw(c, seed)
            out, C, robust = compute(c, inp)
            if robust:
                break
        else:
            raise SystemExit(f"{c['name']}: no robust draw in {MAX_TRIES} seeds")
        dropped = check_case(c, out, C)
        path = os.path.join(outdir, f"layer_{c['name']}.bin")
        n = write_case(path, c, inp, out, C)
        total += n
        sl = out["slot"]
        later_only = sum(1 for t in range(c["T"]) for k in range(1, c["K"])
                         if sl[t, 0] >= 0 and sl[t, k] < 0)
        all_gone = int((sl < 0).all(axis=1).sum())
        print(f"{c['name']:28s} T={c['T']:2d} M={c['M']:2d} H={c['H']:2d} E={c['E']} "
              f"K={c['K']} f={c['f']:<4g} C={C:3d} seed={seed} dropped={dropped:2d}/"
              f"{c['T'] * c['K']} (first {int((sl[:, 0] < 0).sum())}, later-with-first-kept "
              f"{later_only}, all-dropped tokens {all_gone}) count={out['count'].tolist()} "
              f"bytes={n}")
    print(f"total {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
