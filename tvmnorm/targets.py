"""Compilation targets, as TVM JSON target dicts, and where each one's CUDA code is compiled.

Where CUDA code is compiled (decided on purpose):
- ``tvmnorm build --target cuda`` compiles the library ahead of time: TVM emits one ``.cu`` with
  the kernels and tvm-ffi host wrappers (the ``cuda_host`` path), and ``nvcc -shared`` turns it
  into a ``.so`` with SASS plus PTX of the arch (cuda_arch: this machine's GPU's, sm_90 on a
  machine without one). Loading it needs only ``tvm_ffi``: no NVRTC, no compiler at run time, no
  per-process compile delay.
- The default-schedule fallback is compiled just in time in the process that needs it (by nvcc
  as a library is, or by ``tvm.compile`` for NVRTC: runtime._cached_module) for this machine's
  GPU, and the result is cached on disk per arch, so the cost is paid once per key and machine.
"""
from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import importlib.metadata
import os
import pathlib
import re
import sys

KINDS = ("llvm", "cuda")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), not every core of the machine:
    tuning jobs that share a host are pinned to a slice of it (bench/h200_parallel.sh), and
    thread pools sized to the whole machine then oversubscribe it."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# The arch a machine without a GPU compiles CUDA kernels for: the H200's, which the committed
# records (schedules/cuda-sm_90.json) were tuned on.
DEFAULT_CUDA_ARCH = "sm_90"
# The oldest GPUs the kernels compile for: the schedules copy rows by cp.async and load them under
# L2 cache-policy hints (createpolicy), both sm_80's; below it TVM's lowering of the dx fails.
MIN_CUDA_ARCH = 80
# TVM's CUDA code declares the fp8 types only from sm_89 (__CUDA_ARCH__ >= 890), so an fp8-output
# kernel for an older GPU does not compile.
FP8_MIN_ARCH = 89


def arch_number(arch: str) -> int:
    """sm_90 -> 90, sm_90a -> 90."""
    m = re.fullmatch(r"sm_(\d+)[a-z]?", arch)
    if not m:
        raise ValueError(f"not a CUDA arch: {arch!r}")
    return int(m.group(1))


def checked_cuda_arch(arch: str, what: str, fp8: bool = False) -> str:
    """``arch`` if tvmnorm's CUDA kernels (of an fp8-output key, with ``fp8``) compile for it,
    else a ValueError that names ``what`` asked for it."""
    n = arch_number(arch)
    if n < MIN_CUDA_ARCH:
        raise ValueError(f"{what} is {arch}: tvmnorm's CUDA kernels need sm_{MIN_CUDA_ARCH} or newer "
                         f"(cp.async and L2 cache hints)")
    if fp8 and n < FP8_MIN_ARCH:
        raise ValueError(f"{what} is {arch}: fp8 output needs sm_{FP8_MIN_ARCH} or newer "
                         f"(TVM's CUDA code has no fp8 types below it)")
    return arch


def no_gpu_device_node() -> bool:
    """Linux without the NVIDIA driver's device nodes (or WSL's /dev/dxg): no GPU to ask, known
    without TVM, whose import (~4 s) was most of `tvmnorm list --records` on a CPU box."""
    return sys.platform.startswith("linux") and not glob.glob("/dev/nvidia[0-9]*") and not os.path.exists("/dev/dxg")


@functools.lru_cache(maxsize=None)
def _local_cuda_arch() -> str | None:
    if no_gpu_device_node():
        return None
    from ._tvm import cuda_device_arch
    return cuda_device_arch()


def cuda_arch(fp8: bool = False) -> str:
    """The arch CUDA kernels are compiled for: TVMNORM_CUDA_ARCH where set, else this machine's
    first GPU's (the default-kernel cache and a library built here then run on it: an sm_90
    build does not load on an A100 or an L40), else DEFAULT_CUDA_ARCH. The GPU is asked once a
    process, when a CUDA kernel or target is first wanted, not at import. ValueError where the
    kernels (with ``fp8``, an fp8-output key's) do not compile for that arch."""
    env = os.environ.get("TVMNORM_CUDA_ARCH")
    if env:
        return checked_cuda_arch(env, "TVMNORM_CUDA_ARCH", fp8)
    local = _local_cuda_arch()
    return checked_cuda_arch(local, "this machine's GPU", fp8) if local else DEFAULT_CUDA_ARCH


def cache_root() -> pathlib.Path:
    """Where tvmnorm keeps what it computed once for this machine: TVMNORM_CACHE, else
    ~/.cache/tvmnorm (the default kernels' cache, runtime.cache_dir, is a folder of it)."""
    return pathlib.Path(os.environ.get("TVMNORM_CACHE", pathlib.Path.home() / ".cache" / "tvmnorm"))


# cpuinfo's fields that tell one CPU from another for LLVM's name of it: LLVM names the host by
# its vendor, family and model, and by the features it finds (a VM may hide some)
_CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags")


def _host_cpu_file() -> pathlib.Path | None:
    """The file that keeps LLVM's name of this CPU (host_cpu), named for the CPU's cpuinfo
    fields and TVM's version; None where either is unknown (no /proc/cpuinfo, a TVM built from
    source), and the name is asked of TVM each process."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read().split("\n\n", 1)[0]
        tvm = importlib.metadata.version("apache-tvm")
    except (OSError, importlib.metadata.PackageNotFoundError):
        return None
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first.splitlines())}
    ident = "\n".join([tvm] + [f"{k}={fields.get(k, '')}" for k in _CPU_FIELDS])
    return cache_root() / "host-cpu" / f"{hashlib.sha256(ident.encode()).hexdigest()[:16]}.txt"


@functools.lru_cache(maxsize=None)
def host_cpu() -> str:
    """LLVM's name of this machine's CPU (the llvm target's mcpu; schedules/llvm-<cpu>.json).
    Asking TVM takes its import (~4 s, most of `tvmnorm list --records --target llvm`), so the
    answer is kept on disk for this CPU and TVM version (_host_cpu_file) and read from there
    after the first time; a file that is unreadable or not a CPU name is asked again."""
    path = _host_cpu_file()
    if path is not None:
        try:
            name = path.read_text().strip()
            if re.fullmatch(r"[A-Za-z0-9._-]+", name):
                return name
        except OSError:
            pass
    from ._tvm import llvm_system_cpu
    name = llvm_system_cpu()
    if path is not None:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:  # a cache that cannot be written costs the next process the import, nothing else
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(name + "\n")
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return name


def target_spec(kind: str, arch: str | None = None) -> dict:
    """The JSON target dict for a kind. llvm targets the host CPU (mcpu) so the fallback and
    the library use its vector units; cuda uses the H100/H200 tag, which also fills in the
    limits (threads per block, shared memory) that MetaSchedule's checks read."""
    if kind == "llvm":
        return {"kind": "llvm", "mcpu": arch or host_cpu(), "num-cores": max(1, os.cpu_count() or 1)}
    if kind == "cuda":
        return {"tag": "nvidia/nvidia-h100", "arch": checked_cuda_arch(arch, "the CUDA arch asked for") if arch
                else cuda_arch()}
    raise ValueError(f"target must be one of {KINDS}, got {kind!r}")


def arch_of(kind: str, arch: str | None = None) -> str:
    return arch or (host_cpu() if kind == "llvm" else cuda_arch())


def target_name(kind: str, arch: str | None = None) -> str:
    """File-name form, e.g. ``cuda-sm_90`` or ``llvm-znver5`` (schedules/<target-arch>.json)."""
    return f"{kind}-{arch_of(kind, arch)}"
