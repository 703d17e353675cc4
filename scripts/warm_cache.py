"""Fill the default-kernel JIT cache ($TVMNORM_CACHE) ahead of time.

A key with no tuned kernel is compiled on first use (on CUDA by nvcc as a library's kernels
are, cuda_aot.jit_nvcc, ~5-15 s a key) and cached. On a GPU lease that time is the lease's: the
GPU pytest selection of 143 tests compiled for 200 s and ran 38. The cache is keyed by tvmnorm's
source hash and the TVM/tvm-ffi versions, so build it from the same tree and TVM as the machine
that loads it.

  python scripts/warm_cache.py --target cuda --out .device/tc --shapes all --stages bwd,bwd_add --dtypes bf16,fp32
  XZ_OPT=-9 tar cJf .device/tc.txz -C .device tc   # each .so holds a static cudart: xz keeps one
  # on the GPU machine: tar xJf .device/tc.txz -C .device && export TVMNORM_CACHE=$PWD/.device/tc
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import sys


def build_one(args):
    key, kind, layout, path = args
    from tvmnorm.build import key_funcs
    from tvmnorm.runtime import _cached_module
    # what the runtime's default-kernel cache holds for a key, int64 row kernels included, built
    # as the runtime builds its entries; the pool runs one key a core
    _cached_module(path, kind, lambda: key_funcs(key, kind, layout=layout), jobs=1)
    return path.stem


def main(argv=None) -> int:
    from tvmnorm.cli import add_key_args, keys_from_args
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=("llvm", "cuda"), default="cuda")
    p.add_argument("--out", required=True, help="the cache root (what $TVMNORM_CACHE will be)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--layouts", default="compact",
                   help="x's layouts to build each key for (build.X_LAYOUTS: compact,strided,heads); the default "
                        "schedule's kernels, which the runtime runs for a layout wherever no library record serves")
    add_key_args(p, stages_default="fwd,bwd,bwd_add")
    args = p.parse_args(argv)
    os.environ["TVMNORM_CACHE"] = str(pathlib.Path(args.out).resolve())
    from tvmnorm.build import X_LAYOUTS
    from tvmnorm.runtime import cache_dir, cache_path
    from tvmnorm.targets import target_name
    layouts = args.layouts.split(",")
    if not set(layouts) <= set(X_LAYOUTS):
        p.error(f"--layouts: {args.layouts!r}; each one of {', '.join(X_LAYOUTS)}")
    out = cache_dir() / target_name(args.target)
    out.mkdir(parents=True, exist_ok=True)
    entries = [(k, args.target, layout, cache_path(k, args.target, layout))
               for k in keys_from_args(args) for layout in layouts]
    jobs = [e for e in entries if not e[-1].exists()]
    with concurrent.futures.ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for name in pool.map(build_one, jobs):
            print(name, flush=True)
    print(f"{len(jobs)} built, {len(entries) - len(jobs)} already there -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
