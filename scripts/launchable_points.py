"""Whether every point of the fused backward's CUDA design space passes MetaSchedule's
VerifyGPUCode, which the search no longer applies to those points (tune._postprocs;
tune.refused_fused_points checks each structural variant at each chunk-lane count and
full_chunks value). No GPU needed.

  python scripts/launchable_points.py --hidden 128,1000,4095,8192 --dtypes bf16,fp16 [--stage bwd_add]
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", required=True, help="hidden sizes, e.g. 128,1000,8192")
    p.add_argument("--dtypes", default="bf16", help="itype=wtype=otype for each, e.g. bf16,fp16")
    p.add_argument("--norms", default="rmsnorm,layernorm")
    p.add_argument("--stage", default="bwd", choices=("bwd", "bwd_add"))
    p.add_argument("--chunk-rows", type=int, default=32, help="the dx kernel's T")
    args = p.parse_args(argv)
    from tvmnorm import NormKey
    from tvmnorm.tune import refused_fused_points
    points, refused, t0 = 0, 0, time.time()
    for dtype, norm, hidden in itertools.product(args.dtypes.split(","), args.norms.split(","),
                                                 (int(h) for h in args.hidden.split(","))):
        key = NormKey(norm=norm, stage=args.stage, hidden_size=hidden, itype=dtype, wtype=dtype, otype=dtype)
        checked, bad = refused_fused_points(key, args.chunk_rows)
        points, refused = points + checked, refused + len(bad)
        for fused, lanes, full in bad:
            print(f"refused: {key.name} {fused} lanes {lanes} full_chunks {full}", flush=True)
    print(f"{points} points, {refused} refused by VerifyGPUCode, {time.time() - t0:.0f} s")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
