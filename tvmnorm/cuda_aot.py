"""Ahead-of-time CUDA libraries: TVM's cuda_host source (kernels + tvm-ffi host wrappers), nvcc.

The library then loads with tvm_ffi alone, no compiler at run time. nvcc compiles one
translation unit on one core, and a catalog's .cu is large (the 72 bf16 keys of a verify run, with
their int32-row copies: 10 MB of source, ~3 minutes on the H200 host), so the kernels are cut into
about one .cu per core, compiled at once and linked into one .so. This module is outside the
kernel-source hash (build.source_hash): how a library is compiled does not change its kernels.
"""
from __future__ import annotations

import concurrent.futures
import os
import pathlib
import shutil
import subprocess
import tempfile

from .targets import arch_number, target_spec, usable_cores

# tvm-ffi's loader fills in the library context of a module; the generated source defines it,
# so a library of several translation units defines it in the first and declares it in the rest.
# TVM's CUDA preamble also defines a few bf16/fp16 helpers with external linkage (max, min,
# make_nv_bfloat164, ...), the same text in every unit: the link lets the first definition stand
# (--allow-multiple-definition); every kernel and host wrapper has its own symbol name.
_LIBRARY_CTX = "void* __tvm_ffi__library_ctx = NULL;"
_LIBRARY_CTX_DECL = "extern void* __tvm_ffi__library_ctx;"
# Fewest kernels per translation unit: below that nvcc's start-up outweighs the split.
_MIN_PER_UNIT = 4


def nvcc_path() -> str:
    """nvcc on PATH, else CUDA's default install location (which may not exist)."""
    return shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


def jit_nvcc() -> bool:
    """Whether the runtime's default-kernel cache compiles CUDA kernels as a library does
    (build_cuda_library: SASS, and programmatic dependent launch on sm_90+) rather than as TVM's
    CUDA module (CUDA source that NVRTC compiles when a process loads it, kernels launched
    plainly): where nvcc is found, unless TVMNORM_JIT_NVCC=0. On the H200 (bench/results/
    h200-run42/) the default keys' decode backward ran 1.10-1.17x faster so, the 16384-token one
    1.00-1.03x; a key's first compile took 6.8-14.2 s against 3.1-9.4 s, a later process's first
    call 2.1-4.4 s against 1.9-3.8 s."""
    return os.environ.get("TVMNORM_JIT_NVCC", "1") != "0" and os.path.exists(nvcc_path())


def _run(cmd: list) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed ({' '.join(cmd[:3])} ...):\n{res.stderr[-4000:]}")


def pdl_enabled(arch: str) -> bool:
    """Whether a library for ``arch`` launches the kernels that follow another of its own in a
    call with programmatic dependent launch (_tvm.pdl_source): on sm_90+, unless TVMNORM_PDL=0
    (the same kernels launched plainly: the A/B)."""
    from ._tvm import PDL_MIN_ARCH
    return arch_number(arch) >= PDL_MIN_ARCH and os.environ.get("TVMNORM_PDL", "1") != "0"


def cuda_host_source(funcs: dict, arch: str) -> str:
    """TVM's cuda_host export of ``funcs`` (symbol -> scheduled PrimFunc): the kernels and their
    host launches as one CUDA C++ source, before unit_sources' changes to it."""
    from ._tvm import IRModule, compile_module, cuda_source_only, export_cuda_host, target
    spec = target(dict(target_spec("cuda", arch), host={"kind": "cuda_host"}))
    with cuda_source_only():
        return export_cuda_host(compile_module(IRModule(funcs), spec).mod)


def unit_sources(funcs: dict, arch: str, units: int) -> list:
    """The CUDA C++ of ``funcs`` (symbol -> scheduled PrimFunc) cut into at most ``units``
    translation units that link into one library."""
    from ._tvm import PDL_MIN_ARCH, pdl_source
    names = list(funcs)
    units = max(1, min(units, len(names) // _MIN_PER_UNIT or 1))
    sources = []
    for i in range(units):
        unit = {n: funcs[n] for n in names[i::units]}
        src = cuda_host_source(unit, arch)
        if arch_number(arch) >= PDL_MIN_ARCH:
            src = pdl_source(src, unit, launch=pdl_enabled(arch))
        if i:
            if src.count(_LIBRARY_CTX) != 1:
                raise RuntimeError("cannot split the CUDA library: the generated source does not define "
                                   f"{_LIBRARY_CTX!r} once (a TVM change?); build with one job "
                                   "(`tvmnorm build --jobs 1`)")
            src = src.replace(_LIBRARY_CTX, _LIBRARY_CTX_DECL)
        sources.append(src)
    return sources


def build_cuda_library(funcs: dict, arch: str, so_path, workdir, jobs: int | None = None) -> None:
    """Compile ``funcs`` into the shared library ``so_path`` with nvcc, in up to ``jobs``
    translation units at once (default: the usable cores); ``workdir`` takes the sources and
    objects."""
    import tvm_ffi.libinfo as ffi_info
    workdir = pathlib.Path(workdir)
    inc, libdir = ffi_info.find_include_path(), os.path.dirname(ffi_info.find_libtvm_ffi())
    sm = arch.replace("sm_", "")
    flags = ["-Xcompiler", "-fPIC", "-O3", "-std=c++17",
             "-gencode", f"arch=compute_{sm},code=sm_{sm}", "-gencode", f"arch=compute_{sm},code=compute_{sm}",
             "-I", inc, "-I", os.path.join(inc, "dlpack")]
    link = ["-L", libdir, "-ltvm_ffi", "-cudart", "static"]
    jobs = max(1, jobs or usable_cores())
    sources = unit_sources(funcs, arch, jobs)
    cus = [workdir / f"tvmnorm_kernels_{i}.cu" for i in range(len(sources))]
    for cu, src in zip(cus, sources):
        cu.write_text(src)
    if len(cus) == 1:
        _run([nvcc_path(), "-shared", *flags, str(cus[0]), "-o", str(so_path), *link])
        return
    objs = [cu.with_suffix(".o") for cu in cus]
    with concurrent.futures.ThreadPoolExecutor(len(cus)) as pool:
        for done in [pool.submit(_run, [nvcc_path(), "-c", *flags, str(cu), "-o", str(o)]) for cu, o in zip(cus, objs)]:
            done.result()
    _run([nvcc_path(), "-shared", "-Xcompiler", "-fPIC", "-Xlinker", "--allow-multiple-definition",
          *map(str, objs), "-o", str(so_path), *link])


def load_cuda_library(funcs: dict, arch: str, jobs: int | None = None):
    """``funcs`` (symbol -> scheduled PrimFunc) compiled by build_cuda_library in a temporary
    folder and loaded: the kernels a library would hold, for a probe that times them without
    building one (the file may go with its folder once mapped)."""
    from ._tvm import load_module
    with tempfile.TemporaryDirectory(prefix="tvmnorm-cuda-") as work:
        so = pathlib.Path(work) / "kernels.so"
        build_cuda_library(funcs, arch, so, work, jobs)
        return load_module(str(so))
