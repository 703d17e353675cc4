"""Whether every point of the fused backward's CUDA design space passes MetaSchedule's
VerifyGPUCode, which the search no longer applies to those points (tune._postprocs): each
structural variant at each chunk-lane count and full_chunks value, built as the space builds it
(min_blocks and the stream hint change neither the launch nor the shared memory). No GPU needed.

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
    from tvmnorm._tvm import IRModule, Schedule, ms, target, without_tensor_intrinsics
    from tvmnorm.sched.rows import CudaRowConfig, schedule_rows_cuda
    from tvmnorm.sched.space import FULL_CHUNKS, fused_cuda_variants, fused_lanes
    from tvmnorm.targets import target_spec
    from tvmnorm.tune import tune_rows, tuning_func
    tgt, points, refused, t0 = target(target_spec("cuda")), 0, 0, time.time()
    for dtype, norm, hidden in itertools.product(args.dtypes.split(","), args.norms.split(","),
                                                 (int(h) for h in args.hidden.split(","))):
        key = NormKey(norm=norm, stage=args.stage, hidden_size=hidden, itype=dtype, wtype=dtype, otype=dtype)
        func = tuning_func(key, "dx", tune_rows(key, "cuda"), "cuda", args.chunk_rows)
        with without_tensor_intrinsics():  # TuneContext would parse the tensor intrinsics it never uses here
            ctx = ms.TuneContext(mod=IRModule({"main": func}), target=tgt, num_threads=1)
        verify = ms.postproc.VerifyGPUCode()
        verify._initialize_with_tune_context(ctx)
        for fused in fused_cuda_variants(key):
            threads, vec, prefetch, stages, weights, staged = fused
            for lanes, full in itertools.product(fused_lanes(fused), FULL_CHUNKS):
                sch = Schedule(func)
                schedule_rows_cuda(None, CudaRowConfig(threads=threads, rows=lanes, vec=vec, prefetch=prefetch,
                                                       stages=stages, chunk_weights=weights, staged=staged,
                                                       full_chunks=full), sch=sch)
                points += 1
                if not verify.apply(sch):
                    refused += 1
                    print(f"refused: {key.name} {fused} lanes {lanes} full_chunks {full}", flush=True)
    print(f"{points} points, {refused} refused by VerifyGPUCode, {time.time() - t0:.0f} s")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
