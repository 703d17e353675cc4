"""x's layouts on the GPU: the kernels for strided rows and for per-head rows (build.X_LAYOUTS)
against the compact kernels on the same values, and against what a caller runs otherwise: torch
eager on the same view, torch.compile on it, or x.contiguous() and then tvmnorm.

    python bench/x_layouts.py --out $OUT [--tokens 16384,1,8,64] [--rounds 2]

Cases (bf16, tokens x ...):
- q and k of Qwen3-8B's fused qkv per head (32 q heads, 8 kv heads, head_dim 128: qkv rows of
  6144, q[..., :4096].view(tokens, 32, 128)), RMSNorm: the QK-norm input of vLLM and SGLang,
  rows tokens x heads at two strides ("heads");
- the first 4096 columns of those qkv rows, RMSNorm and LayerNorm ("strided").
Each forward (y) and backward (dx, dweight through autograd.grad on a kept graph) is checked
against float64 on fresh random data (the qkv around the part NaN, so a read past it shows) and
timed with triton's do_bench (L2 flushed), rounds in turn, each impl at its fastest round.
Bytes counted as the bench's: forward 2*M*H*size, backward 3*M*H*size (M rows of H); frac is
GB/s over the copy ceiling measured in the same run. Writes x-layouts.json.
"""
from __future__ import annotations

import json
import pathlib

import torch
import torch.nn.functional as F

import tvmnorm.torch as tn
from tvmnorm.bench import Timer, copy_roofline, probe_meta, probe_parser
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


def impls(norm: str, hidden: int):
    """name -> (x, w, b) -> y: the impls, each with its own x (the view, or a compact copy)."""
    eps = 1e-6 if norm == "rmsnorm" else 1e-5
    ours = (lambda x, w, b: tn.rms_norm(x, w, eps)) if norm == "rmsnorm" else \
        (lambda x, w, b: tn.layer_norm(x, w, b, eps))
    eager = (lambda x, w, b: F.rms_norm(x, (hidden,), w, eps)) if norm == "rmsnorm" else \
        (lambda x, w, b: F.layer_norm(x, (hidden,), w, b, eps))
    return {"tvmnorm": ours, "tvmnorm_on_compact_copy": ours, "tvmnorm_after_contiguous": lambda x, w, b: ours(
        x.contiguous(), w, b), "torch_eager": eager, "torch_compile": torch.compile(eager, dynamic=False)}


def reference(norm: str, x, w, b, dy):
    """float64 y, dx, dw."""
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    h = x.shape[-1]
    y = F.rms_norm(xr, (h,), wr, 1e-6) if norm == "rmsnorm" else F.layer_norm(xr, (h,), wr, b.double(), 1e-5)
    dx, dw = torch.autograd.grad(y, (xr, wr), dy.double())
    return y.detach(), dx, dw


def max_err(got, want) -> float:
    """max |got - want| / (1 + |want|): NaN (a read outside x's elements) stays NaN."""
    return float(((got.double() - want).abs() / (1 + want.abs())).max())


def run_case(norm, part, tokens, timer, copy_gbps, rounds, gen, log) -> list:
    x = qkv_part(tokens, part, gen)
    hidden = x.shape[-1]
    w = (1 + 0.3 * torch.randn(hidden, generator=gen, device="cuda")).to(torch.bfloat16)
    b = (0.3 * torch.randn(hidden, generator=gen, device="cuda")).to(torch.bfloat16)
    dy = torch.randn(x.shape, generator=gen, device="cuda").to(torch.bfloat16)
    y_ref, dx_ref, dw_ref = reference(norm, x, w, b, dy)
    compact = x.contiguous()
    rows, size = x.numel() // hidden, x.element_size()
    groups = _host.row_groups(x, hidden)
    layout = "compact" if x.is_contiguous() else "strided" if len(groups) < 2 else "heads"
    out = []
    for name, fn in impls(norm, hidden).items():
        xi = (compact if name == "tvmnorm_on_compact_copy" else x).detach().requires_grad_()
        wi = w.detach().requires_grad_()
        y = fn(xi, wi, b)
        dx, dw = torch.autograd.grad(y, (xi, wi), dy, retain_graph=True)
        errs = {"y": max_err(y, y_ref), "dx": max_err(dx, dx_ref), "dw": max_err(dw, dw_ref)}
        rec = {"norm": norm, "part": part, "layout": layout, "tokens": tokens, "rows": rows, "hidden": hidden,
               "x_strides": list(x.stride()), "impl": name, "max_err": errs,
               "ok": all(e == e and e < 0.05 for e in errs.values())}
        fwd = lambda: fn(xi, wi, b)  # noqa: E731
        bwd = lambda: torch.autograd.grad(y, (xi, wi), dy, retain_graph=True)  # noqa: E731
        for stage, call, nbytes in (("fwd", fwd, 2 * rows * hidden * size), ("bwd", bwd, 3 * rows * hidden * size)):
            us = min(timer([call])[0] for _ in range(rounds))
            gbps = nbytes / (us * 1e-6) / 1e9
            out.append({**rec, "stage": stage, "us": us, "gbps": gbps, "frac": gbps / copy_gbps})
            log(f"{norm:9s} {part:4s} {layout:7s} tokens={tokens:5d} rows={rows:6d} {stage} {name:25s} "
                f"{us:9.2f} us  frac {gbps / copy_gbps:.3f}  {'ok' if rec['ok'] else 'WRONG'} {errs}")
    if layout != "compact":
        used = {k.origin for tag, k in _host._KERNELS.items() if tag[-1] == layout and tag[5] == hidden}
        for r in out:
            r["tvmnorm_kernels"] = sorted(used)
    return out


def main():
    ap = probe_parser()
    ap.add_argument("--tokens", default="16384,1,8,64")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    timer = Timer("cuda", warmup_ms=25, rep_ms=100)
    roof = copy_roofline("cuda", timer)
    gen = torch.Generator(device="cuda").manual_seed(0)
    records = []
    cases = [("rmsnorm", "q"), ("rmsnorm", "k"), ("rmsnorm", "rows"), ("layernorm", "rows")]
    for tokens in map(int, args.tokens.split(",")):
        for norm, part in cases:
            records += run_case(norm, part, tokens, timer, roof["copy_gbps"], args.rounds, gen, print)
    result = {"meta": {**probe_meta(roof["copy_gbps"]), **roof, "what": __doc__.split("\n\n")[0]},
              "records": records}
    path = pathlib.Path(args.out) / "x-layouts.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}; {sum(not r['ok'] for r in records)} records not ok")


if __name__ == "__main__":
    main()
