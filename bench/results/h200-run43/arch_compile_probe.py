"""Compiles the default kernels (every part) of five keys for each arch named, with nvcc, no GPU:
`python bench/results/h200-run43/arch_compile_probe.py sm_80 sm_86 sm_89 sm_100 sm_120`
(fp8 output skipped below sm_89, where TVM's CUDA code has no fp8 types). arch-compile.log is
its output on the 2-core machine (nvcc 13.0)."""
import sys, tempfile, time, pathlib
from tvmnorm import NormKey
from tvmnorm.build import key_funcs
from tvmnorm.cuda_aot import build_cuda_library
keys = [NormKey(hidden_size=128), NormKey(norm="layernorm", hidden_size=1000, itype="fp16", wtype="fp16", otype="fp16"),
        NormKey(stage="bwd_add", hidden_size=4095), NormKey(norm="layernorm", stage="bwd", hidden_size=7168, itype="fp32", wtype="fp32", otype="fp32"),
        NormKey(hidden_size=4096, otype="fp8e4m3")]
for arch in sys.argv[1:]:
    for key in keys:
        if "fp8" in key.name and arch in ("sm_80", "sm_86"):
            continue
        t=time.time()
        with tempfile.TemporaryDirectory() as d:
            try:
                build_cuda_library(key_funcs(key, "cuda"), arch, pathlib.Path(d)/"k.so", pathlib.Path(d), 2)
                print(arch, key.name, "ok", round(time.time()-t,1), flush=True)
            except Exception as e:
                print(arch, key.name, "FAIL", str(e)[:800], flush=True)
