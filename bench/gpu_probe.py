"""Forward row-schedule points on the GPU: the library's forward kernel (tuned or default) against
points of the tuned space, above all the row of x kept in registers (``keep_row``) or loaded again
by each stage, each checked against float64 on the same fresh random data (outputs poisoned with
NaN first) and timed with triton's do_bench (L2 flushed) at the catalog's training rows, as a
fraction of the copy ceiling of the same run.

    TVMNORM_LIBRARY=... python bench/gpu_probe.py --out $OUT [--hidden 128,7168,8192] [--norms rmsnorm]

Points per key: the default rule's config (sched.default.fwd_cuda_heuristic) with keep_row as it
sets it and flipped, the earlier rule (cuda_row_heuristic: x loaded by each stage), and every kept
variant of the space (sched.space.fwd_kept_variants) with the rows per block cuda_row_heuristic
gives its thread count. Writes probe.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

import torch

from tvmnorm import NormKey
from tvmnorm.bench import Timer, copy_roofline
from tvmnorm.reference import fwd as reference_fwd
from tvmnorm.runtime import REGISTRY, variant_kernel
from tvmnorm.sched.default import cuda_row_heuristic, fwd_cuda_heuristic
from tvmnorm.sched.space import fwd_kept_variants
from tvmnorm.shapes import hidden_sizes, train_rows


# the bench's timer (triton's do_bench, median, L2 flushed before each call) and copy ceiling
TIMER = Timer("cuda", warmup_ms=25, rep_ms=100)


def us(fn):
    return TIMER([fn])[0]


def points(key: NormKey) -> dict:
    """name -> CudaRowConfig: the default rule's, with keep_row flipped, the earlier rule's, and
    the kept variants."""
    base = fwd_cuda_heuristic(key.hidden_size, 2)
    earlier = cuda_row_heuristic(key.hidden_size, 2)
    out = {"default": base, "default-flipped": dataclasses.replace(base, keep_row=not base.keep_row),
           "loaded-per-stage": earlier}
    for threads, vec in fwd_kept_variants(key):
        rows = cuda_row_heuristic(threads * vec, 2).rows if threads < 128 else 1
        out[f"{threads}x{rows}v{vec}+keep"] = dataclasses.replace(base, threads=threads, rows=rows, vec=vec,
                                                                  keep_row=True)
    return out


def point_kernel(key: NormKey, cfg):
    return variant_kernel(key, "cuda", cfg)._f["fwd"]


def measure(norm: str, h: int, ceiling: float, deadline: float) -> dict:
    key = NormKey(norm=norm, hidden_size=h)
    rows = train_rows(h)
    x = torch.randn(rows, h, device="cuda").bfloat16()
    gamma = (torch.rand(h, device="cuda") + 0.5).bfloat16()
    beta = [torch.randn(h, device="cuda").bfloat16()] if norm == "layernorm" else []
    stats = [torch.empty(rows, device="cuda") for _ in range(2 if beta else 1)]
    y = torch.empty_like(x)
    ref = torch.from_numpy(reference_fwd(norm, x.cpu(), gamma.cpu(), *[b.cpu() for b in beta])["y"]).cuda()
    scale = float(ref.abs().max())
    eps = 1e-5 if beta else 1e-6
    nbytes = 2 * rows * h * 2

    def run(call):
        y.fill_(float("nan"))
        call()
        err = float((y.double() - ref).abs().max()) / scale  # NaN left anywhere stays NaN
        t = us(call)
        return {"us": t, "frac": nbytes / t / 1e3 / ceiling, "rel_err": err}

    lib = REGISTRY.get(key, "cuda")
    r = {"norm": norm, "hidden": h, "rows": rows, "library": lib.origin,
         "points": {"library": run(lambda: lib(x, gamma, *beta, y, *stats, eps=eps))}}
    for name, cfg in points(key).items():
        if time.time() > deadline:
            break
        f = point_kernel(key, cfg)
        r["points"][name] = run(lambda: f(x, gamma, *beta, y, *stats, eps))
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--hidden", default=",".join(map(str, hidden_sizes())))
    ap.add_argument("--norms", default="rmsnorm,layernorm")
    ap.add_argument("--seconds", type=float, default=240, help="stop starting new points after this")
    args = ap.parse_args()
    deadline = time.time() + args.seconds
    ceiling = copy_roofline("cuda", TIMER)["copy_gbps"]
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    out = []
    for norm in args.norms.split(","):
        for h in (int(v) for v in args.hidden.split(",")):
            if time.time() > deadline:
                break
            r = measure(norm, h, ceiling, deadline)
            out.append(r)
            print(f"{norm:9s} H={h:5d} " + "  ".join(
                f"{k} {v['us']:.1f} ({v['frac']:.3f}, err {v['rel_err']:.0e})" for k, v in r["points"].items()),
                flush=True)
    from tvmnorm._tvm import FFI_VERSION, TVM_VERSION
    from tvmnorm.build import source_hash
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "tvm": TVM_VERSION, "tvm_ffi": FFI_VERSION, "tvmnorm_source_hash": source_hash(),
            "copy_gbps": ceiling}
    pathlib.Path(args.out, "probe.json").write_text(json.dumps({"meta": meta, "results": out}, indent=1))


if __name__ == "__main__":
    main()
