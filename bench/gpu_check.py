"""H200 correctness of every stage against float64 torch references, and a schedule-knob probe.

Run on the GPU machine:  python bench/gpu_check.py --out $OUT
Writes h200-correctness.txt (every stage x dtype x hidden x rows) and probe.json (timings of
row-schedule configurations, as a fraction of the copy ceiling measured in the same run).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time
import warnings

import torch

import tvmnorm
from tvmnorm import NormKey, get_kernel
from tvmnorm.runtime import signature

TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
         "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}
TOL = {"bf16": 2e-2, "fp16": 4e-3, "fp32": 1e-4, "fp8e4m3": 1.3e-1, "fp8e5m2": 2.6e-1}
FP8_MAX = {"fp8e4m3": 448.0, "fp8e5m2": 57344.0}


def reference(key, t, eps):
    """float64 torch reference; returns dict name -> tensor."""
    x = t["x"].double()
    if key.stage == "fwd_add":
        h = t["x"] + t["residual"]  # torch's add rounds h; the norm is of that h
        x = h.double()
    g = t["gamma"].double() + (1.0 if key.zero_centered_gamma else 0.0)
    ln = key.norm == "layernorm"
    mu = x.mean(-1, keepdim=True) if ln else torch.zeros_like(x[:, :1])
    var = ((x - mu) ** 2).mean(-1, keepdim=True) if ln else (x * x).mean(-1, keepdim=True)
    rs = torch.rsqrt(var + eps)
    xhat = (x - mu) * rs
    out = {"rsigma": rs[:, 0]}
    if ln:
        out["mu"] = mu[:, 0]
    if key.stage == "fwd_add":
        out["h"] = x
    if key.forward:
        y = xhat * g + (t["beta"].double() if ln else 0)
        if key.fp8_out:
            out["amax"] = y.abs().max().reshape(1) if y.numel() else torch.zeros(1, dtype=torch.float64, device=y.device)
            m = FP8_MAX[key.otype]
            out["y"] = (y * t["scale"].double()).clamp(-m, m)
        else:
            out["y"] = y
        return out
    dy = t["dy"].double()
    dyg = dy * g
    c2 = (dyg * xhat).mean(-1, keepdim=True)
    c1 = dyg.mean(-1, keepdim=True) if ln else 0
    dx = rs * (dyg - c1 - xhat * c2)
    if key.stage == "bwd_add":
        dx = dx + t["dz"].double()
    out.update(dx=dx, dgamma=(dy * xhat).sum(0))
    if ln:
        out["dbeta"] = dy.sum(0)
    return out


def make_inputs(key, rows, dev, eps):
    H = key.hidden_size
    it, wt, ot = TORCH[key.itype], TORCH[key.wtype], TORCH[key.otype]
    t = {"x": (torch.randn(rows, H, device=dev) * 2 + 0.5).to(it),
         "gamma": (torch.rand(H, device=dev) + 0.5).to(wt), "beta": torch.randn(H, device=dev).to(wt),
         "scale": torch.tensor([0.7], device=dev)}
    if key.stage == "fwd_add":
        t["residual"] = (torch.randn(rows, H, device=dev) * 3 - 0.5).to(it)
    if not key.forward:
        # statistics as the forward kernel would have saved them (fp32)
        xf = t["x"].double()
        ln = key.norm == "layernorm"
        mu = xf.mean(-1) if ln else torch.zeros(rows, device=dev, dtype=torch.float64)
        var = ((xf - mu[:, None]) ** 2).mean(-1) if ln else (xf * xf).mean(-1)
        t["mu"], t["rsigma"] = mu.float(), torch.rsqrt(var + eps).float()
        t["dy"] = torch.randn(rows, H, device=dev).to(ot)
        t["dz"] = torch.randn(rows, H, device=dev).to(it)
    return t


def outputs(key, rows, dev):
    H = key.hidden_size
    nan = float("nan")
    o = {}
    for name in signature(key):
        if name == "y":
            o[name] = torch.full((rows, H), nan, device=dev).to(TORCH[key.otype])
        elif name == "h":
            o[name] = torch.full((rows, H), nan, device=dev).to(TORCH[key.itype])
        elif name == "dx":
            o[name] = torch.full((rows, H), nan, device=dev).to(TORCH[key.itype])
        elif name in ("mu", "rsigma") and key.forward:
            o[name] = torch.full((rows,), nan, device=dev)
        elif name in ("dgamma", "dbeta"):
            o[name] = torch.full((H,), nan, device=dev).to(TORCH[key.wtype])
        elif name == "amax":
            o[name] = torch.full((1,), nan, device=dev)
    return o


def check_key(key, rows, dev, log):
    eps = 1e-5
    t = make_inputs(key, rows, dev, eps)
    o = outputs(key, rows, dev)
    k = get_kernel(key, "cuda" if dev == "cuda" else "llvm")
    args = [o[n] if n in o else t[n] for n in signature(key)]
    k(*args, eps=eps) if key.forward else k(*args)
    if dev == "cuda":
        torch.cuda.synchronize()
    ref = reference(key, t, eps)
    worst, bad = 0.0, []
    for name, val in o.items():
        r = ref[name]
        v = val.double()
        if torch.isnan(v).any():
            bad.append(f"{name} has NaN (unwritten or race)")
            continue
        if name == "h":
            err, tol = float((v != r).sum()), 0.5  # elements off torch's add: none, bit for bit
        elif name == "y" and key.fp8_out:
            q = r.to(TORCH[key.otype]).double()  # reference quantisation
            err = ((v - q).abs() / (q.abs() + 1)).max().item() if v.numel() else 0.0
            tol = TOL[key.otype]
        else:
            scale = r.abs().max().item() + 1e-30 if r.numel() else 1
            err = ((v - r).abs().max().item() / scale) if v.numel() else 0.0
            tol = TOL[key.itype if name != "y" else key.otype]
            if name in ("mu", "rsigma", "amax"):
                tol = 1e-5
            if name in ("dgamma", "dbeta"):
                tol = max(TOL[key.wtype], TOL[key.itype])
        worst = max(worst, err / tol)
        if err > tol:
            bad.append(f"{name} rel err {err:.2e} > {tol:.0e}")
    status = "ok" if not bad else "FAIL " + "; ".join(bad)
    log(f"{key.norm:9s} {key.stage:7s} i={key.itype:5s} o={key.otype:8s} zc={int(key.zero_centered_gamma)} "
        f"H={key.hidden_size:5d} rows={rows:5d}  worst/tol={worst:.3f}  {status}")
    return not bad


def correctness(out, log):
    ok = fail = 0
    keys = []
    for norm in ("rmsnorm", "layernorm"):
        for stage in ("fwd", "bwd", "bwd_add", "fwd_add"):
            for dt in ("bf16", "fp16", "fp32"):
                for H in (128, 1000, 7168):
                    keys.append(NormKey(norm=norm, stage=stage, itype=dt, wtype=dt, otype=dt, hidden_size=H))
        for H in (128, 1000, 7168):
            keys.append(NormKey(norm=norm, stage="fwd", otype="fp8e4m3", hidden_size=H))
            keys.append(NormKey(norm=norm, stage="fwd", itype="bf16", wtype="fp32", otype="fp8e5m2", hidden_size=H))
            keys.append(NormKey(norm=norm, stage="fwd", hidden_size=H, zero_centered_gamma=True))
            keys.append(NormKey(norm=norm, stage="bwd", hidden_size=H, zero_centered_gamma=True))
    for key in keys:
        for rows in (1, 4097):
            try:
                good = check_key(key, rows, "cuda", log)
            except Exception as e:  # noqa: BLE001 - record and go on
                log(f"{key.name} rows={rows} ERROR {type(e).__name__}: {str(e)[-400:]}")
                good = False
            ok += good
            fail += not good
    # dgamma bitwise reproducibility
    key = NormKey(norm="layernorm", stage="bwd", hidden_size=7168)
    t = make_inputs(key, 4097, "cuda", 1e-5)
    res = []
    for _ in range(2):
        o = outputs(key, 4097, "cuda")
        get_kernel(key, "cuda")(*[o[n] if n in o else t[n] for n in signature(key)])
        res.append((o["dgamma"].clone(), o["dbeta"].clone()))
    same = all(torch.equal(a, b) for a, b in zip(*res))
    log(f"dgamma/dbeta bitwise equal across runs: {same}")
    log(f"SUMMARY: {ok} ok, {fail} failed, bitwise={same}")
    return fail == 0 and same


def check_library(log, dev, every=False):
    """Every tuned key (``every``: every key) of the loaded library (TVMNORM_LIBRARY) at awkward
    and training row counts: the check a tuned record must pass before it goes into schedules/.
    257 and 4097 rows end one row into a new chunk of the backward's partial sums."""
    from tvmnorm.runtime import REGISTRY
    lib = REGISTRY.library("cuda" if dev == "cuda" else "llvm")
    if lib is None:
        log("no tuned library loaded (set TVMNORM_LIBRARY)")
        return False
    ok = fail = 0
    for packed, entry in sorted(lib.kernels.items()):
        if entry["origin"] != "tuned" and not every:
            continue
        for rows in (1, 257, 4097, 16384):
            try:
                good = check_key(NormKey.unpack(packed), rows, dev, log)
            except Exception as e:  # noqa: BLE001 - record and go on
                log(f"{entry['name']} rows={rows} ERROR {type(e).__name__}: {str(e)[-400:]}")
                good = False
            ok += good
            fail += not good
    log(f"SUMMARY ({'every' if every else 'tuned'} key of library {lib.path}): {ok} ok, {fail} failed")
    return fail == 0 and ok > 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--tuned", action="store_true",
                    help="check every tuned key of the library in TVMNORM_LIBRARY instead of the default grid")
    ap.add_argument("--all", action="store_true", help="with --tuned: every key of the library, tuned or not")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore", tvmnorm.FallbackWarning)
    f = open(out / ("h200-tuned-correctness.txt" if args.tuned else "h200-correctness.txt"), "w")

    def log(s):
        print(s, flush=True)
        f.write(s + "\n")
        f.flush()
    import tvm, tvm_ffi
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    log(f"# device: {name}  torch {torch.__version__}  tvm {tvm.__version__}  "
        f"tvm-ffi {tvm_ffi.__version__}  cuda {torch.version.cuda}")
    what = "tuned library kernels" if args.tuned else "default-schedule kernels (JIT, NVRTC)"
    log(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  {what} vs float64 torch")
    t0 = time.time()
    good = check_library(log, args.device, args.all) if args.tuned else correctness(out, log)
    log(f"# took {time.time() - t0:.0f} s")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
