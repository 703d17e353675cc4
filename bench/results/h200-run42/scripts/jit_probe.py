"""Lease 42: what a default (untuned) CUDA key costs a process, and what its backward runs at,
with the cache compiled by nvcc (cuda_aot.jit_nvcc, this tree) against TVM's CUDA module
(TVMNORM_JIT_NVCC=0: CUDA source that NVRTC compiles in every process that loads it).

For each key a fresh process asks the registry for the kernel and calls it once (the first
process compiles the cache entry, the next two load it), with an empty cache per mode."""
import json
import os
import subprocess
import sys
import time

CHILD = r'''
import sys, time, warnings
t0 = time.perf_counter()
import torch
import tvmnorm.torch as tt
warnings.simplefilter("ignore")
norm, stage, hidden = sys.argv[1], sys.argv[2], int(sys.argv[3])
x = torch.randn(64, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=stage != "fwd")
w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16, requires_grad=stage != "fwd")
t1 = time.perf_counter()
f = tt.rms_norm if norm == "rmsnorm" else (lambda x, w: tt.layer_norm(x, w, w))
y = f(x, w)
if stage != "fwd":
    y.backward(torch.randn_like(y))
torch.cuda.synchronize()
print(f"{t1 - t0:.3f} {time.perf_counter() - t1:.3f}")
'''


def main():
    out = {}
    keys = [("rmsnorm", "fwd", 2880), ("rmsnorm", "bwd", 2880), ("layernorm", "bwd", 2880), ("rmsnorm", "bwd", 6144)]
    for mode, env in (("nvcc", {"TVMNORM_JIT_NVCC": "1"}), ("nvrtc", {"TVMNORM_JIT_NVCC": "0"})):
        cache = f"/tmp/jit-{mode}"
        for norm, stage, hidden in keys:
            times = []
            for _ in range(3):
                r = subprocess.run([sys.executable, "-c", CHILD, norm, stage, str(hidden)], capture_output=True,
                                   text=True, env={**os.environ, **env, "TVMNORM_CACHE": cache}, timeout=300)
                if r.returncode:
                    print(mode, norm, stage, hidden, "FAILED", r.stderr[-1500:], flush=True)
                    break
                times.append(float(r.stdout.split()[-1]))
            out[f"{mode} {norm} {stage} {hidden}"] = times
            print(mode, norm, stage, hidden, "first call (compile or load + call), s:", times, flush=True)
    json.dump(out, open(os.path.join(sys.argv[1], "jit-probe.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
