"""The one module that imports TVM.

Everything else in tvmnorm reaches TVM through the names below, so a TVM upgrade (0.27 moved
`tir` to `tirx` and schedules to `s_tir`) is handled here, and `import tvmnorm` stays cheap
until a kernel is actually compiled.
"""
from __future__ import annotations

import contextlib
import os

from .targets import usable_cores  # noqa: E402 - no TVM import there

# TVM's CPU thread pool assumes two hardware threads per core on x86 and uses half of the
# logical CPUs; on machines without SMT (this VM, many cloud instances) that leaves cores idle:
# rmsnorm fwd fp32 H=4096 went from 4842 to 3618 us on 2 cores with all of them.
os.environ.setdefault("TVM_NUM_THREADS", str(usable_cores()))

import tvm  # noqa: E402
import tvm_ffi  # noqa: E402
from tvm import te, tirx  # noqa: F401,E402 - re-exported for compute/ and sched/
from tvm import s_tir  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: F401,E402 - re-exported for tune/measure

TVM_VERSION = tvm.__version__
FFI_VERSION = tvm_ffi.__version__

# apache-tvm-ffi 0.1.15.x segfaults in tvm.ir.save_json, which MetaSchedule's database uses.
_BAD_FFI_PREFIX = "0.1.15"
if FFI_VERSION.startswith(_BAD_FFI_PREFIX):
    raise ImportError(f"apache-tvm-ffi {FFI_VERSION} crashes MetaSchedule's JSON database; "
                      f"install apache-tvm-ffi==0.1.14.post0")

Schedule = s_tir.Schedule
ScheduleError = s_tir.ScheduleError
Trace = s_tir.Trace
IRModule = tvm.IRModule
PrimFunc = tirx.PrimFunc


def target(spec: dict) -> "tvm.target.Target":
    return tvm.target.Target(spec)


# StorageRewrite merges a per-row scalar stage's local buffer into the reduction result it
# reads, and after LowerThreadAllreduce that result is a *shared* buffer: every thread then does
# `red_result = rsqrt(red_result)` in place, racing with the threads still reading it (seen on
# the H200 as wrong rsigma for multi-warp rows). Our kernels allocate a handful of scalars, so
# nothing is lost by turning the pass off.
PASS_CONFIG = {"tirx.disable_storage_rewrite": True}


def compile_module(mod, tgt):
    with tvm.transform.PassContext(opt_level=3, config=PASS_CONFIG):
        return tvm.compile(mod, target=tgt)


def load_module(path: str):
    return tvm.runtime.load_module(path)


def empty(shape, dtype, device):
    return tvm.runtime.empty(shape, dtype, device)


def cuda_available() -> bool:
    try:
        return bool(tvm.runtime.enabled("cuda")) and tvm.cuda(0).exist
    except Exception:  # noqa: BLE001 - no driver means no CUDA, whatever the error
        return False


def llvm_system_cpu() -> str:
    from tvm.target import codegen
    return str(codegen.llvm_get_system_cpu())


def cuda_device_arch(device_id: int = 0) -> str | None:
    """sm_XY of the local GPU, or None without one."""
    if not cuda_available():
        return None
    major, minor = tvm.cuda(device_id).compute_version.split(".")
    return f"sm_{major}{minor}"


@contextlib.contextmanager
def cuda_source_only():
    """Compile CUDA targets without compiling their kernels to a binary.

    ``tvm.compile`` hands every CUDA module to ``tvm_callback_cuda_compile`` (NVRTC, ~2 s a
    module), and NVRTC asks the CUDA runtime for the device when no target is in scope: in a
    process forked from one that has initialised CUDA (the tuning builders) that call fails
    with cudaErrorInitializationError. The cuda_host export only reads the source back and
    nvcc compiles it, so the callback returns a placeholder instead. Restored on exit."""
    name = "tvm_callback_cuda_compile"
    import tvm.support.nvcc  # noqa: F401 - registers the callback; importing it later would undo ours
    original = tvm_ffi.get_global_func(name, allow_missing=True)
    if original is None:  # a TVM without the CUDA runtime keeps the source and never calls it
        yield
        return
    tvm_ffi.register_global_func(name, lambda *_: b"// source only: compiled by nvcc from the export",
                                 override=True)
    try:
        yield
    finally:
        tvm_ffi.register_global_func(name, original, override=True)


def export_cuda_host(mod) -> str:
    from tvm.backend.cuda import export_cuda_host as _export
    return _export(mod)
