"""Lease 49 probe, on the H200: times and checks the cubins of shared_sums_gen.py (the layernorm
backward's fused dx kernel with its dgamma/dbeta running sums in registers or in shared memory,
at one or two blocks an SM), launched through the driver API (ctypes, libcuda) on fresh random
bf16 inputs, 16384 rows. Every output is poisoned with NaN first; dx and the partial sums are
checked against float64; each point's variants against its first (registers, one block an SM:
bitwise, the same sums in the same order). Time: triton.testing.do_bench's median (L2 flushed each call); frac: 3*M*H*2 bytes / time
/ the copy ceiling measured in the same run.

    python shared_sums_probe.py DIR_WITH_CUBINS [--rows 16384]
"""
import argparse
import ctypes
import json
import pathlib

import torch
import triton

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--rows", type=int, default=16384)
args = ap.parse_args()
d = pathlib.Path(args.dir)
points = json.loads((d / "points.json").read_text())
torch.cuda.init()
torch.empty(1, device="cuda")
cu = ctypes.CDLL("libcuda.so.1")


def ok(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: CUDA driver error {rc}")


ok(cu.cuInit(0), "cuInit")
src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
dst = torch.empty_like(src)
copy_us = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200) * 1e3
copy_gbps = 2 * src.numel() * 2 / copy_us / 1e3
del src, dst
print(f"{torch.cuda.get_device_name()} copy {copy_gbps:.0f} GB/s", flush=True)

M = args.rows
g = torch.Generator(device="cuda").manual_seed(49)
results = []
for hidden in sorted({p["hidden"] for p in points}):
    x = torch.randn(M, hidden, device="cuda", generator=g).to(torch.bfloat16)
    dy = torch.randn(M, hidden, device="cuda", generator=g).to(torch.bfloat16)
    gamma = (1 + 0.5 * torch.randn(hidden, device="cuda", generator=g)).to(torch.bfloat16)
    xf = x.float()
    mu = xf.mean(1)
    rs = torch.rsqrt(xf.var(1, unbiased=False) + 1e-5)
    x64, dy64, g64 = x.double(), dy.double(), gamma.double()
    xhat = (x64 - mu.double()[:, None]) * rs.double()[:, None]
    dyg = dy64 * g64
    dx_ref = rs.double()[:, None] * (dyg - dyg.mean(1, keepdim=True) - xhat * (dyg * xhat).mean(1, keepdim=True))
    dgamma_ref, dbeta_ref = (dy64 * xhat).sum(0), dy64.sum(0)
    del x64, dy64, xhat, dyg
    first = {}
    for p in [q for q in points if q["hidden"] == hidden]:
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        data = (d / f"{p['tag']}.cubin").read_bytes()
        ok(cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(data)), "load " + p["tag"])
        ok(cu.cuModuleGetFunction(ctypes.byref(fn), mod, p["name"].encode()), "function")
        smem = p["smem"]
        if smem:
            ok(cu.cuFuncSetAttribute(fn, 8, smem), "max dynamic smem")  # 8: MAX_DYNAMIC_SHARED_SIZE_BYTES
        blocks = ctypes.c_int()
        ok(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), fn, p["threads"], smem), "occupancy")
        P = -(-M // p["chunk"])
        dx = torch.full((M, hidden), float("nan"), device="cuda", dtype=torch.bfloat16)
        part = torch.full((2, P, hidden), float("nan"), device="cuda", dtype=torch.float32)
        vals = [ctypes.c_void_p(t.data_ptr()) for t in (dx, dy, gamma, mu, part, rs, x)] + [ctypes.c_int64(P), ctypes.c_int64(M)]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])

        def launch():
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            ok(cu.cuLaunchKernel(fn, P, 1, 1, p["threads"], 1, 1, smem, stream, params, None), "launch")
        launch()
        torch.cuda.synchronize()
        err_dx = ((dx.double() - dx_ref).norm() / dx_ref.norm()).item()
        sums = part.double().sum(1)
        err_w = max(((sums[0] - dgamma_ref).norm() / dgamma_ref.norm()).item(),
                    ((sums[1] - dbeta_ref).norm() / dbeta_ref.norm()).item())
        nan = bool(dx.isnan().any() or part.isnan().any())
        same = None
        if p["point"] not in first:
            first[p["point"]] = (dx.clone(), part.clone())
        else:
            ref_dx, ref_part = first[p["point"]]
            same = bool(torch.equal(dx, ref_dx) and torch.equal(part, ref_part))
        us = triton.testing.do_bench(launch, warmup=25, rep=150) * 1e3
        us2 = triton.testing.do_bench(launch, warmup=25, rep=150) * 1e3
        us = min(us, us2)
        frac = 3 * M * hidden * 2 / us / 1e3 / copy_gbps
        good = not nan and err_dx < 1e-2 and err_w < 1e-3
        r = dict(p, rows=M, us=round(us, 2), frac=round(frac, 4), blocks_per_sm=blocks.value, err_dx=err_dx,
                 err_w=err_w, nan=nan, bitwise_same_as_first=same, ok=good, copy_gbps=round(copy_gbps, 1))
        results.append(r)
        print(f"{p['tag']:34s} regs {p['regs']:3d} spill {p['spill']:4d} blk/SM {blocks.value} {us:8.2f} us "
              f"frac {frac:.3f} dx {err_dx:.1e} w {err_w:.1e} nan {nan} same {same} {'ok' if good else 'BAD'}",
              flush=True)
        ok(cu.cuModuleUnload(mod), "unload")
        del dx, part
    del x, dy, first
    torch.cuda.empty_cache()
out = pathlib.Path(__import__("os").environ.get("OUT", "/tmp")) / "shared-sums.json"
out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "triton": triton.__version__, "copy_gbps": copy_gbps, "results": results}, indent=1))
