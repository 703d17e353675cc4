"""Residual add + norm on the GPU: tvmnorm.torch.rms_norm_add / layer_norm_add (the forward one
fwd_add kernel that writes h beside y; the backward one bwd_add kernel that adds h's gradient
into dx) against
what a caller runs otherwise: tvmnorm's plain norm on x + residual (its backward, then autograd's
add), torch eager and torch.compile on ``h = x + residual; y = norm(h)``, and Liger's fused add +
RMSNorm (LigerFusedAddRMSNorm: the add inside its forward kernel).

    [TVMNORM_LIBRARY=DIR] python bench/add_norm.py --out $OUT [--hidden 2048,4096,7168,8192] [--tokens 16384]

bf16, tokens x hidden. Each impl's forward (under no_grad) and backward (autograd.grad of (y, h)
for random dy and dh, on a graph kept from one forward: every impl through autograd alike) is
checked against float64 on fresh random data and timed with triton's do_bench (L2 flushed),
rounds in turn over the impls, each at its fastest round. Bytes counted as a fused kernel's
least: forward 4*M*H*size (read x and residual, write h and y), backward 4*M*H*size (read dy,
dh and h, write dx); frac is GB/s over the copy ceiling measured in the same run. Writes
add-norm.json.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import tvmnorm.torch as tn
from tvmnorm.bench import probe_parser, relative_max_error, start_cuda_probe, time_in_rounds, write_probe


def liger_add_rms_norm(hidden: int, w, eps: float):
    """Liger's fused add + RMSNorm module with weight ``w``, or None where Liger lacks it."""
    try:
        from liger_kernel.transformers.fused_add_rms_norm import LigerFusedAddRMSNorm
    except ImportError:
        return None
    m = LigerFusedAddRMSNorm(hidden, eps=eps).to(device=w.device, dtype=w.dtype)
    with torch.no_grad():
        m.weight.copy_(w)

    def call(x, r, w, b):
        return m(x, r)
    call.weight = m.weight  # the weight whose gradient it computes: its own
    return call


def impls(norm: str, hidden: int, w) -> dict:
    """name -> (x, residual, weight, bias) -> (y, h)."""
    import torch._dynamo
    torch._dynamo.reset()  # one compile per shape (the recompile limit would fall back to eager)
    rms = norm == "rmsnorm"
    eps = 1e-6 if rms else 1e-5

    def eager(x, r, w, b):
        h = x + r
        return (F.rms_norm(h, (hidden,), w, eps) if rms else F.layer_norm(h, (hidden,), w, b, eps)), h

    def plain(x, r, w, b):
        h = x + r
        return (tn.rms_norm(h, w, eps) if rms else tn.layer_norm(h, w, b, eps)), h
    out = {"tvmnorm": (lambda x, r, w, b: tn.rms_norm_add(x, r, w, eps)) if rms else
           (lambda x, r, w, b: tn.layer_norm_add(x, r, w, b, eps)),
           "tvmnorm_norm_of_sum": plain, "torch_eager": eager,
           "torch_compile": torch.compile(eager, dynamic=False)}
    liger = liger_add_rms_norm(hidden, w, eps) if rms else None
    if liger is not None:
        out["liger"] = liger
    return out


def reference(norm: str, x, r, w, b, dy, dh) -> dict:
    """float64 y, h, dx (= dresidual), dw of the norm of h = x + residual rounded to x's dtype,
    as every impl rounds it (against the exact sum, h's rounding alone moved every impl's dw by
    up to 0.6 at 16384 rows)."""
    h = (x + r).double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    hidden = x.shape[-1]
    y = F.rms_norm(h, (hidden,), wr, 1e-6) if norm == "rmsnorm" else F.layer_norm(h, (hidden,), wr, b.double(), 1e-5)
    dh_norm, dw = torch.autograd.grad(y, (h, wr), dy.double())
    return {"y": y.detach(), "h": h.detach(), "dx": dh_norm + dh.double(), "dw": dw}


def run_case(norm, hidden, tokens, timer, copy_gbps, rounds, gen, log) -> list:
    def fresh(scale=1.0, shift=0.0):
        return (shift + scale * torch.randn(tokens, hidden, generator=gen, device="cuda")).to(torch.bfloat16)
    x, r, dy, dh = fresh(1.0, 0.5), fresh(2.0), fresh(), fresh()
    w = (1 + 0.3 * torch.randn(hidden, generator=gen, device="cuda")).to(torch.bfloat16)
    b = (0.3 * torch.randn(hidden, generator=gen, device="cuda")).to(torch.bfloat16)
    want = reference(norm, x, r, w, b, dy, dh)
    todo, checked = {}, {}
    for name, fn in impls(norm, hidden, w).items():
        xi, ri, wi = (t.detach().requires_grad_() for t in (x, r, w))
        bi = b.detach().requires_grad_()
        wi = getattr(fn, "weight", wi)
        y, h = fn(xi, ri, wi, bi)
        grads = torch.autograd.grad((y, h), (xi, ri, wi), (dy, dh), retain_graph=True)
        with torch.no_grad():
            y0, h0 = fn(x, r, w, b)
        got = {"y": y0, "h": h0, "dx": grads[0], "dresidual": grads[1], "dw": grads[2]}
        errs = {k: relative_max_error(v, want["dx" if k == "dresidual" else k]) for k, v in got.items()}
        checked[name] = errs
        todo[(name, "fwd")] = torch.no_grad()(lambda fn=fn: fn(x, r, w, b))
        todo[(name, "bwd")] = lambda y=y, h=h, ins=(xi, ri, wi): torch.autograd.grad((y, h), ins, (dy, dh),
                                                                                     retain_graph=True)
    best = time_in_rounds(todo, timer, rounds)
    out = []
    nbytes = 4 * tokens * hidden * x.element_size()
    for (name, stage), us in best.items():
        gbps, errs = nbytes / (us * 1e-6) / 1e9, checked[name]
        ok = all(e == e and e < 0.05 for e in errs.values())
        out.append({"norm": norm, "hidden": hidden, "tokens": tokens, "impl": name, "stage": stage, "us": us,
                    "gbps": gbps, "frac": gbps / copy_gbps, "max_err": errs, "ok": ok})
        log(f"{norm:9s} {hidden:5d} tokens={tokens:5d} {stage} {name:20s} {us:9.2f} us  frac {gbps / copy_gbps:.3f}  "
            f"{'ok' if ok else 'WRONG'} {errs}")
    from tvmnorm.torch import _host
    kernels = sorted({f"{tag[1]}:{k.origin}" for tag, k in _host._KERNELS.items() if tag[0] == norm and tag[5] == hidden})
    for rec in out:
        rec["tvmnorm_kernels"] = kernels  # stage:origin of the kernels tvmnorm's impls ran
    log(f"  tvmnorm kernels: {kernels}")
    return out


def main():
    ap = probe_parser()
    ap.set_defaults(hidden="2048,4096,7168,8192")
    ap.add_argument("--tokens", default="16384")
    ap.add_argument("--rounds", type=int, default=2)
    args, timer, roof, gen = start_cuda_probe(ap)
    records = []
    for tokens in map(int, args.tokens.split(",")):
        for norm in args.norms.split(","):
            for hidden in map(int, args.hidden.split(",")):
                records += run_case(norm, hidden, tokens, timer, roof["copy_gbps"], args.rounds, gen, print)
    write_probe(args.out, "add-norm.json", roof, records, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    main()
