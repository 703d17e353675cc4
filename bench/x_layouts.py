"""x's layouts on the GPU: the kernels for strided rows and for per-head rows (build.X_LAYOUTS)
against the compact kernels on the same values, and against what a caller runs otherwise: torch
eager on the same view, torch.compile on it, or x.contiguous() and then tvmnorm.

    [TVMNORM_LIBRARY=DIR] python bench/x_layouts.py --out $OUT [--tokens 16384,64,8,1] [--rounds 2]

Cases (bf16, tokens x ...):
- q and k of Qwen3-8B's fused qkv per head (32 q heads, 8 kv heads, head_dim 128: qkv rows of
  6144, q[..., :4096].view(tokens, 32, 128)), RMSNorm: the QK-norm input of vLLM and SGLang,
  rows tokens x heads at two strides ("heads");
- the first 4096 columns of those qkv rows, RMSNorm and LayerNorm ("strided").
Each forward (y) and backward (dx, dweight) as ``calls`` makes them is checked against float64
on fresh random data (the qkv around the part NaN, so a read past it shows) and timed with
triton's do_bench (L2 flushed), rounds in turn over the impls, each at its fastest round.
Bytes counted as the bench's: forward 2*M*H*size, backward 3*M*H*size (M rows of H); frac is
GB/s over the copy ceiling measured in the same run. Writes x-layouts.json.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tvmnorm.bench import probe_parser, relative_max_error, start_cuda_probe, time_in_rounds, write_probe
from tvmnorm.torch import _host

QWEN3_8B = {"heads": 32, "kv_heads": 8, "head_dim": 128}


def qkv_part(tokens: int, part: str, gen) -> torch.Tensor:
    """The part of a fresh bf16 qkv [tokens, 6144] (NaN elsewhere): "q"/"k" per head, "rows" the
    first 4096 columns as rows."""
    h, kv, d = QWEN3_8B["heads"], QWEN3_8B["kv_heads"], QWEN3_8B["head_dim"]
    qkv = torch.full((tokens, (h + 2 * kv) * d), float("nan"), dtype=torch.bfloat16, device="cuda")
    start, n = (h * d, kv) if part == "k" else (0, h)
    values = torch.randn(tokens, n * d, generator=gen, device="cuda") * (0.5 + torch.rand(tokens, 1, generator=gen,
                                                                                           device="cuda")) + 1.0
    qkv[:, start:start + n * d] = values.to(torch.bfloat16)
    x = qkv[:, start:start + n * d]
    return x if part == "rows" else x.view(tokens, n, d)


def calls(norm: str, x, compact, w, b, dy) -> dict:
    """(impl, stage) -> (call, its outputs): the forward under no_grad (inference's call, as
    QK-norm runs in serving) and the backward as the bench times each impl: tvmnorm's host
    functions (the autograd node's body: the kernels, no graph) on x in place, on its compact
    copy, and x.contiguous() then the forward (what a caller pays for a copy); the peers through
    autograd.grad on a graph kept from one forward."""
    import torch._dynamo
    torch._dynamo.reset()  # one compile per shape (the recompile limit would fall back to eager)
    hidden, rms = x.shape[-1], norm == "rmsnorm"
    eps = 1e-6 if rms else 1e-5
    fwd = (lambda x: _host.rms_fwd(x, w, eps, False, x.dtype)) if rms else \
        (lambda x: _host.ln_fwd(x, w, b, eps, False, x.dtype))
    bwd = (lambda x, st: _host.rms_bwd(dy, x, st[1], w, False)) if rms else \
        (lambda x, st: _host.ln_bwd(dy, x, st[1], st[2], w, False))
    eager = (lambda x, w, b: F.rms_norm(x, (hidden,), w, eps)) if rms else \
        (lambda x, w, b: F.layer_norm(x, (hidden,), w, b, eps))
    out = {}
    for name, xi in (("tvmnorm", x), ("tvmnorm_on_compact_copy", compact)):
        stats = fwd(xi)
        out[(name, "fwd")] = lambda xi=xi: fwd(xi)[0]
        out[(name, "bwd")] = lambda xi=xi, stats=stats: bwd(xi, stats)[:2]
    out[("tvmnorm_after_contiguous", "fwd")] = lambda: fwd(x.contiguous())[0]
    for name, fn in (("torch_eager", eager), ("torch_compile", torch.compile(eager, dynamic=False))):
        xi, wi = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = fn(xi, wi, b)
        out[(name, "fwd")] = torch.no_grad()(lambda fn=fn: fn(x, w, b))
        out[(name, "bwd")] = lambda y=y, xi=xi, wi=wi: torch.autograd.grad(y, (xi, wi), dy, retain_graph=True)
    return out


def reference(norm: str, x, w, b, dy):
    """float64 y, dx, dw."""
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    h = x.shape[-1]
    y = F.rms_norm(xr, (h,), wr, 1e-6) if norm == "rmsnorm" else F.layer_norm(xr, (h,), wr, b.double(), 1e-5)
    dx, dw = torch.autograd.grad(y, (xr, wr), dy.double())
    return y.detach(), dx, dw


def run_case(norm, part, tokens, timer, copy_gbps, rounds, gen, log) -> list:
    x = qkv_part(tokens, part, gen)
    hidden = x.shape[-1]
    w = (1 + 0.3 * torch.randn(hidden, generator=gen, device="cuda")).to(torch.bfloat16)
    b = (0.3 * torch.randn(hidden, generator=gen, device="cuda")).to(torch.bfloat16)
    dy = torch.randn(x.shape, generator=gen, device="cuda").to(torch.bfloat16)
    want = dict(zip(("y", "dx", "dw"), reference(norm, x, w, b, dy)))
    rows, size = x.numel() // hidden, x.element_size()
    groups = _host.row_groups(x, hidden)
    layout = "compact" if x.is_contiguous() else "strided" if len(groups) < 2 else "heads"
    case = {"norm": norm, "part": part, "layout": layout, "tokens": tokens, "rows": rows, "hidden": hidden,
            "x_strides": list(x.stride())}
    todo = calls(norm, x, x.contiguous(), w, b, dy)
    checked = {}
    for (name, stage), call in todo.items():  # every call once (compiles, warms) and checked
        got = call()
        got = dict(zip(("dx", "dw"), got)) if stage == "bwd" else {"y": got}
        checked[(name, stage)] = {k: relative_max_error(v, want[k]) for k, v in got.items()}
    best = time_in_rounds(todo, timer, rounds)
    out = []
    for (name, stage), us in best.items():
        nbytes = (2 if stage == "fwd" else 3) * rows * hidden * size
        gbps, errs = nbytes / (us * 1e-6) / 1e9, checked[(name, stage)]
        ok = all(e == e and e < 0.05 for e in errs.values())
        out.append({**case, "impl": name, "stage": stage, "us": us, "gbps": gbps, "frac": gbps / copy_gbps,
                    "max_err": errs, "ok": ok})
        log(f"{norm:9s} {part:4s} {layout:7s} tokens={tokens:5d} rows={rows:6d} {stage} {name:25s} "
            f"{us:9.2f} us  frac {gbps / copy_gbps:.3f}  {'ok' if ok else 'WRONG'} {errs}")
    used = sorted({k.origin for tag, k in _host._KERNELS.items() if tag[-1] == layout and tag[5] == hidden})
    for r in out:
        r["tvmnorm_kernels"] = used
    return out


def main():
    ap = probe_parser()
    ap.add_argument("--tokens", default="16384,64,8,1")
    ap.add_argument("--rounds", type=int, default=2)
    args, timer, roof, gen = start_cuda_probe(ap)
    records = []
    cases = [("rmsnorm", "q"), ("rmsnorm", "k"), ("rmsnorm", "rows"), ("layernorm", "rows")]
    for tokens in map(int, args.tokens.split(",")):
        for norm, part in cases:
            records += run_case(norm, part, tokens, timer, roof["copy_gbps"], args.rounds, gen, print)
    from tvmnorm.runtime import REGISTRY
    lib = REGISTRY.library("cuda")  # $TVMNORM_LIBRARY: tuned compact kernels, and records for the layouts
    write_probe(args.out, "x-layouts.json", roof, records, __doc__.split("\n\n")[0],
                library=str(lib.path) if lib is not None else None)


if __name__ == "__main__":
    main()
