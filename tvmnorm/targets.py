"""Compilation targets, as TVM JSON target dicts, and where each one's CUDA code is compiled.

Where CUDA code is compiled (decided on purpose):
- ``tvmnorm build --target cuda`` compiles the library ahead of time: TVM emits one ``.cu`` with
  the kernels and tvm-ffi host wrappers (the ``cuda_host`` path), and ``nvcc -shared`` turns it
  into a ``.so`` with sm_90 SASS plus compute_90 PTX. Loading it needs only ``tvm_ffi``: no
  NVRTC, no compiler at run time, no per-process compile delay.
- The default-schedule fallback is compiled just in time in the process that needs it
  (``tvm.compile``; NVRTC compiles the CUDA source when the module is first loaded) and the
  result is cached on disk, so the cost is paid once per key and machine.
"""
from __future__ import annotations

import functools
import os

KINDS = ("llvm", "cuda")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), not every core of the machine:
    tuning jobs that share a host are pinned to a slice of it (bench/h200_parallel.sh), and
    thread pools sized to the whole machine then oversubscribe it."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


CUDA_ARCH = os.environ.get("TVMNORM_CUDA_ARCH", "sm_90")


@functools.lru_cache(maxsize=None)
def host_cpu() -> str:
    from ._tvm import llvm_system_cpu
    return llvm_system_cpu()


def target_spec(kind: str, arch: str | None = None) -> dict:
    """The JSON target dict for a kind. llvm targets the host CPU (mcpu) so the fallback and
    the library use its vector units; cuda uses the H100/H200 tag, which also fills in the
    limits (threads per block, shared memory) that MetaSchedule's checks read."""
    if kind == "llvm":
        return {"kind": "llvm", "mcpu": arch or host_cpu(), "num-cores": max(1, os.cpu_count() or 1)}
    if kind == "cuda":
        return {"tag": "nvidia/nvidia-h100", "arch": arch or CUDA_ARCH}
    raise ValueError(f"target must be one of {KINDS}, got {kind!r}")


def arch_of(kind: str, arch: str | None = None) -> str:
    return arch or (host_cpu() if kind == "llvm" else CUDA_ARCH)


def target_name(kind: str, arch: str | None = None) -> str:
    """File-name form, e.g. ``cuda-sm_90`` or ``llvm-znver5`` (schedules/<target-arch>.json)."""
    return f"{kind}-{arch_of(kind, arch)}"
