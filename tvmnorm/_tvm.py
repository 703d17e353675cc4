"""The one module that imports TVM.

Everything else in tvmnorm reaches TVM through the names below, so a TVM upgrade (0.27 moved
`tir` to `tirx` and schedules to `s_tir`) is handled here, and `import tvmnorm` stays cheap
until a kernel is actually compiled.
"""
from __future__ import annotations

import contextlib
import functools
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


@functools.lru_cache(maxsize=None)
def register_sum_reducers(most: int = 16) -> None:
    """Let TVM's cross-thread reduction (and rfactor) match sums of 3..``most`` values: a tuple
    reduction is lowered to one allreduce only if its combiner is a registered reducer, and TVM
    matches sums of one or two values only. The dx kernel of grouped rows
    (compute.norms._group_sums) reduces P rows' sums at once and registers them when it builds
    one (once a process, inherited by forked build workers), so that importing tvmnorm changes
    nothing in TVM. The Python callbacks are kept in TVM's global function table too, which
    outlives the interpreter: held only by the reducer table, they were released after Python
    shut down ("double free" at every exit)."""
    def combine(x, y):
        return [a + b for a, b in zip(x, y)]

    def identity(values):
        return [tirx.const(0.0, v.ty) for v in values]
    tvm_ffi.register_global_func("tvmnorm.sum_reducer.combine", combine)
    tvm_ffi.register_global_func("tvmnorm.sum_reducer.identity", identity)
    register = tvm_ffi.get_global_func("s_tir.schedule.RegisterReducer")
    for n in range(3, most + 1):
        register(n, tvm_ffi.get_global_func("tvmnorm.sum_reducer.combine"),
                 tvm_ffi.get_global_func("tvmnorm.sum_reducer.identity"))


def target(spec: dict) -> "tvm.target.Target":
    return tvm.target.Target(spec)


_TENSOR_INTRIN = "tvm.s_tir.tensor_intrin"


@contextlib.contextmanager
def without_tensor_intrinsics():
    """Within the block, ``import tvm.s_tir.tensor_intrin`` finds an empty module. MetaSchedule's
    TuneContext imports it for the tensor-core schedule rules, and the import parses ~250
    TVMScript functions (14 s on a 2-core machine, most of a one-key search: 19.5 s -> 8.3 s for
    layernorm bwd 7168 in scripts/search_overhead.py); tvmnorm's design spaces use no built-in
    rule and no tensor intrinsic. The real module stays importable after the block, and one
    imported before it is used as is."""
    import sys
    import types
    stub = None
    if _TENSOR_INTRIN not in sys.modules:
        stub = sys.modules[_TENSOR_INTRIN] = types.ModuleType(_TENSOR_INTRIN)
    try:
        yield
    finally:
        if stub is not None and sys.modules.get(_TENSOR_INTRIN) is stub:
            del sys.modules[_TENSOR_INTRIN]


# StorageRewrite merges a per-row scalar stage's local buffer into the reduction result it
# reads, and after LowerThreadAllreduce that result is a *shared* buffer: every thread then does
# `red_result = rsqrt(red_result)` in place, racing with the threads still reading it (seen on
# the H200 as wrong rsigma for multi-warp rows). Our kernels allocate a handful of scalars, so
# nothing is lost by turning the pass off.
PASS_CONFIG = {"tirx.disable_storage_rewrite": True}


# A loop annotated with UNROLL_BY = k is unrolled k times (a rolled loop over k copies of its
# body, then the leftover iterations) just before TVM's UnrollLoop. TVM has no partial unroll, and
# the software-pipelined row walk of the fused dx kernel needs one: InjectSoftwarePipeline indexes
# the row registers' copies by the iteration modulo the stage count, which is a constant in each
# copy once the loop is unrolled by that count, while a fully unrolled walk let ptxas hoist every
# later row's loads (registers, spills: see sched/space.py STAGES).
UNROLL_BY = "tvmnorm.unroll_by"


def _substitute(stmt, var, value):
    return tvm_ffi.structural_map(stmt, [(tirx.Var, lambda v: value if v.same_as(var) else v)])


def _unroll_by(loop):
    k = int(loop.annotations[UNROLL_BY])
    n, start, var = int(loop.extent), loop.min, loop.loop_var
    dt = str(var.ty)
    annotations = {a: v for a, v in loop.annotations.items() if a != UNROLL_BY}
    outer = tirx.Var(f"{var.name}_o", dt)
    step = tirx.const(k, dt)
    stmts = []
    if n // k:
        body = tirx.SeqStmt([_substitute(loop.body, var, start + outer * step + tirx.const(j, dt)) for j in range(k)])
        stmts.append(tirx.For(outer, tirx.const(0, dt), tirx.const(n // k, dt), loop.kind, body,
                              annotations=annotations))
    stmts += [_substitute(loop.body, var, start + tirx.const(n // k * k + j, dt)) for j in range(n % k)]
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmnorm.UnrollBy")
def _unroll_annotated(func, _mod, _ctx):
    def unroll(loop):
        return _unroll_by(loop) if UNROLL_BY in loop.annotations else loop
    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.For, unroll)]))


def _install_unroll_by():
    """Run _unroll_annotated first wherever the default TIR pipeline runs UnrollLoop (it looks
    the pass up on tirx.transform at each build). It changes only loops that carry UNROLL_BY."""
    original = tirx.transform.UnrollLoop
    if getattr(original, "tvmnorm_wrapped", False):
        return

    def unroll_loop():
        # the copies re-declare the body's buffers: ConvertSSA gives each copy its own
        return tvm.transform.Sequential([_unroll_annotated, tirx.transform.ConvertSSA(), original()],
                                        name="tvmnorm.UnrollLoop")
    unroll_loop.tvmnorm_wrapped = True
    tirx.transform.UnrollLoop = unroll_loop


_install_unroll_by()


# A loop annotated with MIN_BLOCKS_PER_SM = k (a kernel's blockIdx.x loop) asks for a kernel of
# which k blocks fit on one SM at once: __launch_bounds__(threads, k), for which ptxas caps a
# thread's registers at 64K / (threads * k) and spills what does not fit. TVM's CUDA codegen
# prints that second argument from a statement inside the kernel (LAUNCH_BOUNDS_ATTR), which a
# schedule cannot write (it can only annotate loops): compile_module turns the annotation into
# that statement around the loop's body.
MIN_BLOCKS_PER_SM = "tvmnorm.min_blocks_per_sm"
LAUNCH_BOUNDS_ATTR = "tirx.launch_bounds_min_blocks_per_sm"


def _launch_bounds(mod):
    """``mod`` with every MIN_BLOCKS_PER_SM annotation made a LAUNCH_BOUNDS_ATTR statement;
    ``mod`` itself where there is none (a rebuilt module orders its kernels otherwise)."""
    marked = []

    def wrap(loop):
        if MIN_BLOCKS_PER_SM not in loop.annotations:
            return loop
        marked.append(loop)
        k = int(loop.annotations[MIN_BLOCKS_PER_SM])
        annotations = {a: v for a, v in loop.annotations.items() if a != MIN_BLOCKS_PER_SM}
        body = loop.body
        if k > 1:
            body = tirx.AttrStmt(tirx.const(0, "int32"), LAUNCH_BOUNDS_ATTR, tirx.const(k, "int32"), body)
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, annotations,
                        loop.step, loop.span)
    funcs = {gv: f.with_body(tvm_ffi.structural_map(f.body, [(tirx.For, wrap)])) if isinstance(f, PrimFunc) else f
             for gv, f in mod.functions_items()}
    return IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos) if marked else mod


def compile_module(mod, tgt):
    mod = _launch_bounds(mod)
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
