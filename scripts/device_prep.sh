#!/usr/bin/env bash
# Before a GPU lease: build the default kernels that the GPU tests and the H200 bench load into
# a JIT cache with nvcc (scripts/warm_cache.py), and pack it as .device/tc.txz (~22 MB) to carry.
# On the GPU machine: mkdir -p /tmp/tvmnorm-cache && tar xJf .device/tc.txz -C /tmp/tvmnorm-cache
# --strip-components=1 (the cache bench/h200_tune.sh and h200_verify.sh use). About 30 minutes on 2
# cores for ~320 keys; keyed by the kernel sources' hash, so run it after the last kernel change.
set -euo pipefail
cd "$(dirname "$0")/.."
W=(python scripts/warm_cache.py --target cuda --out .device/tc --jobs "${JOBS:-$(nproc)}")
"${W[@]}" --shapes all --stages fwd,bwd,fwd_add --dtypes bf16             # bench: default impl
"${W[@]}" --shapes all --stages fwd --dtypes bf16 --fp8 fp8e4m3
"${W[@]}" --shapes all --stages fwd,bwd --dtypes fp16                      # bench: fp16's default impl
"${W[@]}" --hidden 1,7,128,1000,4095,4096,7168,8192 --stages fwd,bwd,bwd_add,fwd_add --dtypes bf16,fp16,fp32  # tests
"${W[@]}" --hidden 128,1000,4096,7168 --stages fwd --dtypes bf16 --fp8 fp8e5m2
"${W[@]}" --hidden 1,1000,4095 --stages fwd,bwd,bwd_add,fwd_add --dtypes bf16 --zero-centered-gamma
"${W[@]}" --hidden 65536 --stages fwd,bwd,bwd_add,fwd_add --dtypes bf16
"${W[@]}" --hidden 128,1000,4096,7168 --stages fwd,bwd --dtypes bf16 --layouts strided,heads  # layout tests
"${W[@]}" --hidden 1000,4096,7168 --stages fwd_add --dtypes bf16 --fp8 fp8e4m3          # add + norm, fp8 out
"${W[@]}" --hidden 7168 --stages fwd_add --dtypes bf16 --fp8 fp8e4m3 --layouts strided
# only the current sources' cache travels: an older tree's kernels never load (the cache is keyed
# by the source hash) and would double the carried archive
keep=$(TVMNORM_CACHE=.device/tc python -c "from tvmnorm.runtime import cache_dir; print(cache_dir().name)")
find .device/tc -mindepth 1 -maxdepth 1 ! -name "$keep" -exec rm -rf {} +
XZ_OPT="-9 -T0" tar cJf .device/tc.txz -C .device tc
ls -la .device/tc.txz
