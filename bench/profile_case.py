"""One benchmark case's calls, for a profiler to watch (Nsight Compute: bench/h200_ncu.sh): the
case is the benchmark's own (tvmnorm.bench: the same inputs, implementations and library), so
what the profiler sees is what bench/h200.sh times.

    TVMNORM_LIBRARY=... python bench/profile_case.py --op layernorm_bwd --hidden 1024 --impl tvmnorm_tuned

Runs the case's first call (which compiles, for torch_compile and Liger), then ``--calls`` more;
ncu's --launch-skip picks a kernel of a later call.
"""
from __future__ import annotations

import argparse
import os
import types

import torch

from tvmnorm.bench import IMPLS, Context, make_cases, make_set


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", required=True, help="a tvmnorm.bench op, e.g. rmsnorm_bwd")
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--impl", default="tvmnorm_tuned", choices=list(IMPLS))
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--rows", default="train", help="train, or a token count")
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args()
    (case,) = make_cases(types.SimpleNamespace(ops=args.op, dtypes=args.dtype, hidden=str(args.hidden),
                                               shapes=None, rows=args.rows, fp8_format="fp8e4m3"))
    ctx = Context("cuda", os.environ.get("TVMNORM_LIBRARY"))
    s = make_set(case, "cuda", torch.Generator(device="cuda").manual_seed(0))
    call = IMPLS[args.impl](ctx, case, [s]).calls[0]
    for _ in range(1 + args.calls):
        call()
    torch.cuda.synchronize()
    print(f"{case.op} {case.dtype} H={case.hidden} M={case.rows} {args.impl}: {1 + args.calls} calls")


if __name__ == "__main__":
    main()
