"""Fill the default-kernel JIT cache ($TVMNORM_CACHE) ahead of time.

A key with no tuned kernel is compiled on first use (NVRTC on CUDA, ~2-5 s a key, more for the
one-pass backward's unrolled kernels) and cached. On a GPU lease that time is the lease's: the
GPU pytest selection of 143 tests compiled for 200 s and ran 38. Built here instead, CUDA kernels
go through cuda_host + nvcc (they load with tvm_ffi alone). The cache is keyed by tvmnorm's source
hash and the TVM/tvm-ffi versions, so build it from the same tree and TVM as the machine that
loads it.

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
import tempfile


def build_one(args):
    key, kind, path = args
    from tvmnorm.build import compile_funcs, key_funcs
    from tvmnorm.cuda_aot import build_cuda_library
    funcs = key_funcs(key, kind)  # what the runtime's default-kernel cache holds for a key
    tmp_so = path.with_suffix(f".tmp{os.getpid()}.so")
    if kind == "cuda":
        with tempfile.TemporaryDirectory() as tmp:
            build_cuda_library(funcs, "sm_90", tmp_so, pathlib.Path(tmp), jobs=1)  # the pool runs one key a core
    else:
        compile_funcs(funcs, kind).export_library(str(tmp_so))
    os.replace(tmp_so, path)  # as the runtime writes its entries: never a half-written one
    return key.name


def main(argv=None) -> int:
    from tvmnorm.cli import add_key_args, keys_from_args
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=("llvm", "cuda"), default="cuda")
    p.add_argument("--out", required=True, help="the cache root (what $TVMNORM_CACHE will be)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    add_key_args(p, stages_default="fwd,bwd,bwd_add")
    args = p.parse_args(argv)
    os.environ["TVMNORM_CACHE"] = str(pathlib.Path(args.out).resolve())
    from tvmnorm.runtime import cache_dir
    from tvmnorm.targets import target_name
    out = cache_dir() / target_name(args.target)
    out.mkdir(parents=True, exist_ok=True)
    keys = keys_from_args(args)
    jobs = [(k, args.target, out / f"{k.name}.so") for k in keys if not (out / f"{k.name}.so").exists()]
    with concurrent.futures.ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for name in pool.map(build_one, jobs):
            print(name, flush=True)
    print(f"{len(jobs)} built, {len(keys) - len(jobs)} already there -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
