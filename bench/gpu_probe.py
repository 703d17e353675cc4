"""Probe row-schedule knobs on the GPU: time CudaRowConfig variants for fwd and dx kernels.

python bench/gpu_probe.py --out $OUT   -> probe.json (frac of the copy ceiling, same run)
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

import torch
import triton.testing

from tvmnorm import NormKey
from tvmnorm.build import compile_funcs
from tvmnorm.compute import kernel_funcs
from tvmnorm.sched.rows import CudaRowConfig, schedule_rows_cuda


def copy_gbps():
    src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * src.numel() * 2 / ms / 1e6


def configs(H):
    out = []
    for vec in (8, 4, 2):
        if H % vec:
            continue
        for threads in (8, 16, 32, 64, 128, 256, 512, 1024):
            per = H / (threads * vec)
            if per < 1 or per > 16:
                continue
            for rows in (1, 2, 4, 8, 16):
                if threads * rows > 1024 or threads * rows < 64 or (rows > 1 and threads > 32):
                    continue
                out.append(CudaRowConfig(threads=threads, rows=rows, vec=vec))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--hidden", default="128,512,1024,2048,4096,7168,8192")
    ap.add_argument("--budget", type=float, default=200, help="seconds")
    args = ap.parse_args()
    ceiling = copy_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    results = []
    t_end = time.time() + args.budget
    for H in [int(h) for h in args.hidden.split(",")]:
        M = (1 << 21) // H * 8 if H < 1024 else 16384
        x = torch.randn(M, H, device="cuda").bfloat16()
        w = torch.rand(H, device="cuda").bfloat16() + 0.5
        y = torch.empty_like(x)
        r = torch.empty(M, device="cuda")
        ref = torch.nn.functional.rms_norm(x.double(), (H,), w.double(), eps=1e-6)
        dy = torch.randn_like(x)
        dx = torch.empty_like(x)
        key = NormKey(hidden_size=H)
        kb = NormKey(stage="bwd", hidden_size=H)
        best = {}
        for part, k in (("fwd", key), ("dx", kb)):
            func = kernel_funcs(k, "cuda")[part]
            for cfg in configs(H):
                if time.time() > t_end:
                    break
                try:
                    sch = schedule_rows_cuda(func, cfg)
                    ex = compile_funcs({"f": sch.mod["main"].with_attr("global_symbol", "f")}, "cuda")
                    f = ex.mod["f"]
                    if part == "fwd":
                        y.fill_(float("nan"))
                        call = lambda: f(x, w, y, r, 1e-6)  # noqa: E731
                        call()
                        err = (y.double() - ref).abs().max().item()
                        nbytes = 2 * M * H * 2
                    else:
                        dx.fill_(float("nan"))
                        call = lambda: f(dy, x, r, w, dx)  # noqa: E731
                        call()
                        err = 0.0 if not torch.isnan(dx).any() else float("nan")
                        nbytes = 3 * M * H * 2
                    ms = triton.testing.do_bench(call, warmup=20, rep=100, return_mode="median")
                    frac = nbytes / ms / 1e6 / ceiling
                    rec = dict(H=H, M=M, part=part, cfg=cfg.__dict__, us=ms * 1e3, frac=frac, err=err)
                except Exception as e:  # noqa: BLE001
                    rec = dict(H=H, part=part, cfg=cfg.__dict__, error=str(e)[-300:])
                results.append(rec)
                if "frac" in rec and (part not in best or rec["frac"] > best[part]["frac"]):
                    best[part] = rec
        for part, rec in best.items():
            print(f"H={H:5d} {part:4s} best frac {rec['frac']:.3f} err {rec['err']:.2e} {rec['cfg']}", flush=True)
    pathlib.Path(args.out, "probe.json").write_text(json.dumps({"ceiling_gbps": ceiling, "results": results}, indent=1))


if __name__ == "__main__":
    main()
