"""One benchmark case's calls, for a profiler to watch (Nsight Compute: bench/h200_ncu.sh): the
case is the benchmark's own (tvmnorm.bench: the same inputs, implementations and library), so
what the profiler sees is what bench/h200.sh times.

    TVMNORM_LIBRARY=... python bench/profile_case.py --op layernorm_bwd --hidden 1024 --impl tvmnorm_tuned

Runs the case's first call (which compiles, for torch_compile and Liger), then ``--calls`` more;
ncu's --launch-skip picks a kernel of a later call. With ``--kernels`` it needs no external
profiler: torch.profiler watches the later calls and each kernel's mean GPU time and count per
call are printed, with the call's time between CUDA events, so a slow call shows which launch
costs it (several hidden sizes and implementations in one process:
``--hidden 2048,7168 --impl tvmnorm_tuned,torch_eager --rows 256 --kernels``).
"""
from __future__ import annotations

import argparse
import os
import types

import torch

from tvmnorm.bench import IMPLS, Context, make_cases, make_set


def kernel_table(call, calls: int) -> list:
    """(kernel name, launches per call, mean GPU us) of ``calls`` calls under torch.profiler,
    slowest first, and the call's mean us between CUDA events (no L2 flush: back to back)."""
    from torch.profiler import ProfilerActivity, profile
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        call()
    end.record()
    torch.cuda.synchronize()
    wall = start.elapsed_time(end) * 1e3 / calls
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    rows = [(e.key, e.count / calls, e.device_time_total / e.count) for e in prof.key_averages()
            if str(e.device_type).endswith("CUDA") and e.device_time_total > 0 and e.count]
    return sorted(rows, key=lambda r: -r[1] * r[2]), wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", required=True, help="a tvmnorm.bench op, e.g. rmsnorm_bwd")
    ap.add_argument("--hidden", required=True, help="a hidden size, or several: 2048,7168")
    ap.add_argument("--impl", default="tvmnorm_tuned", help=f"one of {', '.join(IMPLS)}, or several: a,b")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--rows", default="train", help="train, or a token count")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--kernels", action="store_true", help="print each call's kernels and their GPU time")
    args = ap.parse_args()
    unknown = set(args.impl.split(",")) - set(IMPLS)
    if unknown:
        ap.error(f"unknown --impl {', '.join(sorted(unknown))}: one of {', '.join(IMPLS)}")
    ctx = Context("cuda", os.environ.get("TVMNORM_LIBRARY"))
    for hidden in args.hidden.split(","):
        (case,) = make_cases(types.SimpleNamespace(ops=args.op, dtypes=args.dtype, hidden=hidden,
                                                   shapes=None, rows=args.rows, fp8_format="fp8e4m3"))
        s = make_set(case, "cuda", torch.Generator(device="cuda").manual_seed(0))
        for impl in args.impl.split(","):
            call = IMPLS[impl](ctx, case, [s]).calls[0]
            for _ in range(1 + args.calls):
                call()
            torch.cuda.synchronize()
            print(f"{case.op} {case.dtype} H={case.hidden} M={case.rows} {impl}: {1 + args.calls} calls")
            if args.kernels:
                table, wall = kernel_table(call, max(args.calls, 20))
                print(f"  call {wall:7.1f} us between events; kernels per call:")
                for name, count, us in table:
                    print(f"  {us:7.1f} us x {count:4.1f}  {name[:110]}")


if __name__ == "__main__":
    main()
