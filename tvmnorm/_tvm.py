"""The one module that imports TVM.

Everything else in tvmnorm reaches TVM through the names below, so a TVM upgrade (0.27 moved
`tir` to `tirx` and schedules to `s_tir`) is handled here, and `import tvmnorm` stays cheap
until a kernel is actually compiled.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re

from .key import FP8, TVM_DTYPE  # noqa: E402 - no TVM import there
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


def _runtime_symbol(name: str, what: str):
    """A C symbol of TVM's runtime library that has no Python entry."""
    lib = getattr(tvm.base, "_LOADED_LIBS", {}).get("tvm_runtime")
    fn = getattr(lib, name, None) if lib is not None else None
    if fn is None:
        raise ImportError(f"tvmnorm needs TVM's runtime symbol {what}; install apache-tvm==0.27.0.post1")
    return fn


# TVM's CPU thread pool is not rebuilt in a forked child (TVM registers no atfork handler): the
# forking thread's pool keeps the parent's queues but none of its worker threads, and the child's
# first parallel kernel waited forever on them (a DataLoader worker, a multiprocessing fork,
# after the parent had run a CPU norm). In the child, TVM's concurrency is set to one, where its
# parallel launch runs the kernel on the calling thread and never reaches the pool: a forked
# child's CPU kernels run on one thread, as torch's DataLoader workers do. Rebuilding the pool
# instead (TVM's ResetThreadPool) joins the parent's threads, which the child does not have:
# run at the child's first kernel it aborted ("Invalid argument"), and run at every fork the
# tuner's forked builders timed out in CI.
_SET_MAX_CONCURRENCY = _runtime_symbol("_ZN3tvm7runtime9threading17SetMaxConcurrencyEi",
                                       "tvm::runtime::threading::SetMaxConcurrency(int)")
_SET_MAX_CONCURRENCY.argtypes, _SET_MAX_CONCURRENCY.restype = [ctypes.c_int], None
os.register_at_fork(after_in_child=functools.partial(_SET_MAX_CONCURRENCY, 1))

Schedule = s_tir.Schedule
ScheduleError = s_tir.ScheduleError
Trace = s_tir.Trace
IRModule = tvm.IRModule
PrimFunc = tirx.PrimFunc
SBlock, SBlockRealize = s_tir.stmt.SBlock, s_tir.stmt.SBlockRealize


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


def cuda_tune_context(mod) -> "ms.TuneContext":
    """A TuneContext of ``mod`` (an IRModule) on the CUDA target, one thread, made within
    without_tensor_intrinsics(): outside it, the context's import of the tensor intrinsics took
    80 s on a 2-core machine (TVMScript's prim_func calls inspect.stack() ~500 times, and
    inspect.getmodule scans every loaded module for each frozen importlib frame on the stack)."""
    from .targets import target_spec
    with without_tensor_intrinsics():
        return ms.TuneContext(mod=mod, target=target(target_spec("cuda")), num_threads=1)


# StorageRewrite merges a per-row scalar stage's local buffer into the reduction result it
# reads, and after LowerThreadAllreduce that result is a *shared* buffer: every thread then does
# `red_result = rsqrt(red_result)` in place, racing with the threads still reading it (seen on
# the H200 as wrong rsigma for multi-warp rows). Our kernels allocate a handful of scalars, so
# nothing is lost by turning the pass off.
# use_async_copy: a copy into shared memory in an asynchronous pipeline stage (the staged dx,
# sched.rows._cuda_row_shared) becomes cp.async; nothing else is marked asynchronous, and every
# other kernel's CUDA is the same with it
PASS_CONFIG = {"tirx.disable_storage_rewrite": True, "tirx.use_async_copy": True}


# TVM's CUDA codegen declares its cp.async helper with an int global offset, (void* dst, int
# dst_off, void* src, int src_off), and an int64 row kernel passes it int64 offsets: past 2^31
# elements they wrapped, and the staged dx of a call that large read out of bounds (illegal
# address on the H200, the twenty-eighth lease's test_cuda_call_past_int32_offsets_runs_the_int64_kernels).
# The helper becomes a template over the offset's type, so an int32 kernel instantiates it with
# int (the code it had) and an int64 kernel keeps its offsets whole. The shared-memory offset
# stays an int: a block's buffers are < 48 KB.
_CP_ASYNC_HELPER = re.compile(r"__forceinline__ __device__ void (ptx_cp_async\w*)"
                              r"\(void\* dst, int dst_off, void\* src, int src_off\)")


def _cp_async_wide_offsets(code: str) -> str:
    return _CP_ASYNC_HELPER.sub(r"template <typename SrcOff> __forceinline__ __device__ void \1"
                                r"(void* dst, int dst_off, void* src, SrcOff src_off)", code)


# Programmatic dependent launch (sm_90+). A kernel launched with the programmatic stream
# serialization attribute may start launching before the kernel ahead of it in the stream has
# finished, once that one's blocks have all exited (or run griddepcontrol.launch_dependents,
# which none of ours does), and its griddepcontrol.wait then blocks until that kernel has
# completed and its memory is visible. A library's kernel that runs after another of ours in one
# call (PDL_WAITS, compute.norms.pdl_waits: the backward's finalize and combine after its dx,
# the decode backward's wgrad after its dx, the fp8 forward after amax_zero) is launched so and
# waits at its entry, before any load or store: its launch overlaps the leader's last blocks and
# memory flush instead of following them. The first kernel of a call is launched plainly. On the
# H200 (bench/results/h200-run39/, same kernels launched plainly as the reference): the bf16
# backward 0.4-6.3% faster at 16384 tokens (layernorm 512 30.4 -> 29.0 us), the fp8 forward
# 0.8-7.3%, the decode backward 9-15%. Two other ways lost: leaders that let the follower
# launch at their entry (it then sat resident through the leader's last wave: layernorm
# backward 0.4-8% slower than plain), and every kernel launched so (a call's first kernel
# waited ~0.6 us longer behind the user's kernel: the forward at decode rows 4.4 -> 5.1 us).
PDL_MIN_ARCH = 90
PDL_WAITS = "tvmnorm.pdl_waits"
PDL_WAIT = 'asm volatile("griddepcontrol.wait;" ::: "memory");'
# The cuda_host export's launch of each kernel: a cudaLaunchConfig_t filled in, then its
# tvm_cuda_host_launch helper (the one cudaLaunchKernelEx).
_HOST_LAUNCH = re.compile(r"(  cuda_config\.stream = cuda_stream;\n)(  if \(::tvm_cuda_host_check\(tvm_cuda_host_launch\(::(\w+)_kernel, )")
_PDL_ATTR = ("  cudaLaunchAttribute cuda_pdl[1];\n"
             "  cuda_pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;\n"
             "  cuda_pdl[0].val.programmaticStreamSerializationAllowed = 1;\n"
             "  cuda_config.attrs = cuda_pdl;\n"
             "  cuda_config.numAttrs = 1;\n")


def pdl_source(src: str, funcs: dict, launch: bool = True) -> str:
    """The cuda_host export ``src`` of ``funcs`` (symbol -> PrimFunc) for sm_90+ with each kernel
    marked PDL_WAITS waiting at its entry and, with ``launch``, launched under programmatic
    stream serialization (False: the same kernels launched plainly, the A/B). Refuses a source it
    does not recognise rather than launch a kernel so that does not wait (it would read what the
    kernel ahead still writes)."""
    waits = {s for s, f in funcs.items() if f.attrs and PDL_WAITS in f.attrs and int(f.attrs[PDL_WAITS])}
    found, launched = set(), []

    def entry(m):
        found.add(m.group(1))
        return m.group(0) + (f"  {PDL_WAIT}\n" if m.group(1) in waits else "")

    def attr(m):
        launched.append(m.group(3))
        return m.group(1) + (_PDL_ATTR if launch and m.group(3) in waits else "") + m.group(2)
    src = re.sub(r"__global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)_kernel\([^)]*\) \{\n", entry, src)
    src = _HOST_LAUNCH.sub(attr, src)
    if found != set(funcs) or sorted(launched) != sorted(funcs) or src.count("cudaLaunchKernelEx(") != 1:
        raise RuntimeError("cannot add programmatic dependent launch: the cuda_host source is not the "
                           f"expected form ({len(found & set(funcs))} of {len(funcs)} kernels found, "
                           f"{len(launched)} launches); a TVM change? build with TVMNORM_PDL=0")
    return src


def _install_cuda_postproc():
    """Registers TVM's CUDA source hook (tvm_callback_cuda_postproc, called on every generated
    CUDA module, the NVRTC and the nvcc paths alike) with _cp_async_wide_offsets, after any hook
    registered before."""
    name = "tvm_callback_cuda_postproc"
    before = tvm_ffi.get_global_func(name, allow_missing=True)

    def postproc(code, tgt):
        return _cp_async_wide_offsets(str(before(code, tgt)) if before is not None else str(code))
    tvm_ffi.register_global_func(name, postproc, override=True)


_install_cuda_postproc()


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


# A loop annotated with FULL_CHUNK (the fused dx kernel's walk over the rows of its chunk) runs
# in two versions: when every row of the walk is below the row count, a copy of the loop with
# no row guard, and the guarded loop otherwise (the last chunk of a launch). Each stage of a row
# carries its own guard (a block predicate, or the partial sum's if_then_else) on every element,
# and nvcc does not reuse a value across two if-blocks of the same condition: the walk converted
# each bf16 element of dy and x to fp32, and computed xhat and dy*gamma, once per stage that
# reads them. Without the guards nvcc computes them once (ptxas: layernorm 8192's dx record,
# 1344 -> 896 instructions; under Nsight Compute Liger's kernel ran half of ours' instructions
# for the same bytes, bench/results/h200-probes-13/).
FULL_CHUNK = "tvmnorm.full_chunk"


def _conjuncts(cond) -> list:
    return _conjuncts(cond.a) + _conjuncts(cond.b) if isinstance(cond, tirx.And) else [cond]


# A tuning candidate's static row count (tune.tuning_func sets it): its row guards compare with
# this constant where the library's compare with the symbolic n, so that _full_chunks versions
# a candidate's walk as it versions the library's. Without it a static-row candidate kept one
# guarded walk: the tuner timed full_chunks points without their unguarded copy, which the
# library then ran (layernorm bwd 7168, T = 64: 272 us as a candidate with no spills; 379 us
# in the library, whose two copies spill under the point's register cap).
STATIC_ROWS_ATTR = "tvmnorm.static_rows"
# ...and the names of its row operands (its arguments whose extent is the row count's): _row_buffers
ROW_OPERANDS_ATTR = "tvmnorm.row_operands"


def _same_count(a, b) -> bool:
    """Whether row counts ``a`` and ``b`` (a Var, or a static count as an IntImm or int) agree."""
    value = lambda c: c.value if isinstance(c, tirx.IntImm) else c  # noqa: E731
    return a.same_as(b) if isinstance(a, tirx.Var) or isinstance(b, tirx.Var) else value(a) == value(b)


def _row_counts(func) -> list:
    """The row counts of ``func``'s guards: its symbolic shapes, or its static row count."""
    static = [int(func.attrs[STATIC_ROWS_ATTR])] if func.attrs is not None and STATIC_ROWS_ATTR in func.attrs else []
    return _free_vars(func) + static


def _is_row_guard(cond, row_counts) -> bool:
    return isinstance(cond, tirx.LT) and any(_same_count(cond.b, v) for v in row_counts)


def _and(conds):
    """The conjunction of ``conds``, or None for none."""
    out = None
    for c in conds:
        out = c if out is None else tirx.And(out, c)
    return out


def _less_guards(cond, dropped):
    """``cond`` less the terms ``dropped`` says are guards to drop, or None where nothing is left."""
    return _and(c for c in _conjuncts(cond) if not dropped(c))


def _same_way(a, b):
    """How a sum moves whose terms move ``a`` and ``b`` ways (_grows_with's values)."""
    if a is None or b is None:
        return None
    return b if a == 0 else a if b in (0, a) else None


def _grows_with(expr, n):
    """How ``expr`` moves as the row count ``n`` grows, the other variables fixed: 1 never down,
    -1 never up, 0 free of n, None not known (any other use of n)."""
    if isinstance(expr, tirx.Var):
        return 1 if expr.same_as(n) else 0
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm)):
        return 0
    if isinstance(expr, tirx.Cast):
        return _grows_with(expr.value, n)
    if isinstance(expr, (tirx.Add, tirx.Sub, tirx.Min, tirx.Max)):
        a, b = _grows_with(expr.a, n), _grows_with(expr.b, n)
        return _same_way(a, -b if isinstance(expr, tirx.Sub) and b is not None else b)
    if isinstance(expr, tirx.Mul):
        for c, other in ((expr.a, expr.b), (expr.b, expr.a)):
            if isinstance(c, tirx.IntImm):
                g = _grows_with(other, n)
                return None if g is None else 0 if c.value == 0 else g if c.value > 0 else -g
    if isinstance(expr, (tirx.FloorDiv, tirx.Div)) and isinstance(expr.b, tirx.IntImm) and expr.b.value > 0:
        return _grows_with(expr.a, n)
    return None if _uses(expr, [n]) else 0


def _implied_by(tests, loops, threads):
    """Whether a guard term holds wherever ``tests`` do (each ``last row < n``: every row of the
    walk is below its count), as a chunk lane's ``lane < ceil(n / T)`` does: a term ``a < b``
    (or ``<=``) that only comes truer as a tested n grows (a never up, b never down with n) and
    is proven at the least n the tests admit, for every value of the walk's loops (``loops``)
    and of the block's threads (``threads``: (var, extent)) and any of the loops around it. A
    static row count's candidate never has these terms (TVM's simplifier proves them, the
    count being a constant); the library's kernel had them, inside the unguarded copy."""
    from tvm import sym
    least = [(w.b, w.a + 1) for w in tests if isinstance(w.b, tirx.Var)]
    analyzer = sym.Analyzer()
    for lp in loops:
        analyzer.bind(lp.loop_var, tvm.ir.Range.from_min_extent(lp.min, lp.extent))
    for v, e in threads:
        analyzer.bind(v, tvm.ir.Range.from_min_extent(tirx.const(0, e.ty), e))

    def holds(term) -> bool:
        if not isinstance(term, (tirx.LT, tirx.LE)):
            return False
        counts = [(n, m) for n, m in least if _uses(term, [n])]
        if not counts or any(_grows_with(term.a, n) not in (0, -1) or _grows_with(term.b, n) not in (0, 1)
                             for n, _ in counts):
            return False
        at_least = tvm_ffi.structural_map(term, [(tirx.Var, lambda v: next((m for n, m in counts if n.same_as(v)), v))])
        return bool(analyzer.can_prove(at_least))
    return holds


def _walk(stmt, types, fn):
    def visit(node):
        fn(node)
        return node
    tvm_ffi.structural_map(stmt, [(types, visit)])


def _marked(func, key) -> list:
    """The loops of ``func`` annotated with ``key``."""
    loops = []
    _walk(func.body, tirx.For, lambda loop: loops.append(loop) if key in loop.annotations else None)
    return loops


def _is_if_then_else(node) -> bool:
    return getattr(node, "op", None) is not None and getattr(node.op, "name", "") == "prim.if_then_else"


def _condition(node):
    if isinstance(node, (tirx.IfThenElse, tirx.Select)):
        return node.condition
    return node.args[0] if _is_if_then_else(node) else None


def _row_guards_of(stmt, row_counts) -> list:
    """The row guards (``row < n``, n a row count of the function) in the conditions of every
    if, if_then_else and select in ``stmt`` (alone, or one term of an and)."""
    found = []

    def note(node):
        cond = _condition(node)
        if cond is not None:
            found.extend(c for c in _conjuncts(cond) if _is_row_guard(c, row_counts))
    _walk(stmt, (tirx.IfThenElse, tirx.Select, tvm.ir.Call), note)
    return found


def _unit_free(loop):
    """``loop``'s body where it runs once and carries no other annotation (the unit loop that
    holds the annotations of a thread-bound loop once TVM lifts the binding): annotated, TVM
    would have kept it."""
    if isinstance(loop.extent, tirx.IntImm) and loop.extent.value == 1 and not loop.annotations:
        return _substitute(loop.body, loop.loop_var, loop.min)
    return loop


def _without(loop, key, body=None):
    """``loop`` (with ``body``) less the annotation ``key``."""
    annotations = {a: v for a, v in loop.annotations.items() if a != key}
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, loop.body if body is None else body,
                    loop.thread_binding, annotations, loop.step, loop.span)


# A kernel with a loop annotated STREAM_LOADS (the schedule marks the loop over a block's rows)
# loads its rows (the 2-D operands: x, and the backward's dy and dz) with a cache hint: 1 with
# ld.global.cs, which the L2 evicts first, and 2 also stores its rows so (st.global.cs); 3 with
# an L2 evict_last policy (createpolicy, ld.global.L2::cache_hint), which keeps them. The weights
# keep the default policy: every row reads them again. torch.compile's forward at rmsnorm
# 4096-8192 reads x twice, first L2 evict_last and then evict-first (LDG.E.EF in its SASS: what
# 1 came from); its PTX (bench/results/h200-run24/triton/) gave 3, which took rmsnorm 8192's
# record from 133.3 to 129.7 us on the H200 and its 7168 one from 118.8 to 130.8 (its
# L1::evict_last made no difference to ours): so the tuner decides. 4 is torch.compile's pair:
# evict_last, and evict_first for a row's last read where a kernel reads it more than once (a
# probe's: a kept row is read once, and 4 is 3 there). TVM's schedules have no
# cache policy; its PTX builder (T.ptx) writes the instruction, on the 8- and 16-byte register
# vectors of the row.
STREAM_LOADS = "tvmnorm.stream_loads"
STREAM_MODES = {0: "no hint", 1: "rows loaded evict-first (ld.global.cs)",
                2: "rows loaded and stored evict-first", 3: "rows loaded with an L2 evict_last policy",
                4: "rows loaded with an L2 evict_last policy, the last of several reads evict_first"}


def _ptx_words(buf, first, count: int, elem_bytes: int):
    """A uint32 view of local ``buf`` and ``count`` of its words from element ``first``."""
    from tvm import sym
    words = tirx.decl_buffer((buf.shape[0] * elem_bytes // 4,), "uint32", name=f"{buf.name}_u32", data=buf.data,
                             scope=buf.scope())
    base = sym.Analyzer().simplify(first * elem_bytes // 4)
    return words, [tirx.BufferLoad(words, [base + i]) for i in range(count)]


_LOAD = tvm.ir.expr.TensorLoad  # what tirx.BufferLoad builds


def _unit_ramp(indices):
    """The one stride-1 Ramp of a vector access's indices, or None."""
    if len(indices) == 1 and isinstance(indices[0], tirx.Ramp) and isinstance(indices[0].stride, tirx.IntImm) \
            and indices[0].stride.value == 1:
        return indices[0]
    return None


def _stream_store(store, row_buffers, mode: int, last_read: bool = False):
    """``store`` as a PTX load with STREAM_LOADS ``mode``'s cache hint (a row's 8 or 16 bytes
    from global memory into registers; in mode 4 evict_last, or evict_first for ``last_read``)
    or, in mode 2, a streaming PTX store (the other way), or ``store`` itself where it is
    neither."""
    from tvm.backend.cuda.ptx.engine import PTXNamespace
    value = store.value
    if not isinstance(value, _LOAD) or getattr(store, "predicate", None) is not None \
            or getattr(value, "predicate", None) is not None:
        return store
    load = value.source.scope() == "global"
    glob, local = (value.source, store.buffer) if load else (store.buffer, value.source)
    g_idx, l_idx = (_unit_ramp(value.indices), _unit_ramp(store.indices))[::1 if load else -1]
    if g_idx is None or l_idx is None or (not load and mode != 2) or glob.scope() != "global" \
            or local.scope() != "local" or not any(glob.same_as(b) for b in row_buffers):
        return store
    elem = tvm.DataType(str(glob.dtype)).bits // 8
    size = int(g_idx.lanes) * elem
    if size not in (8, 16):
        return store
    view, words = _ptx_words(local, l_idx.base, size // 4, elem)
    addr = tirx.address_of(tirx.BufferLoad(glob, [g_idx.base]))
    ptx = PTXNamespace()
    vec, declared = f"v{size // 4}.u32", tirx.DeclBuffer(view, data=local.data)
    if not load:
        return tirx.SeqStmt([declared, tirx.Evaluate(ptx[f"st.global.cs.{vec}"](addr, *words))])
    if mode in (1, 2):
        return tirx.SeqStmt([declared, tirx.Evaluate(ptx[f"ld.global.cs.{vec}"](*words, addr))])
    if mode == 0:  # _strided_rows: no hint, only an address the CUDA code generator need not prove aligned
        return tirx.SeqStmt([declared, tirx.Evaluate(ptx[f"ld.global.{vec}"](*words, addr))])
    # a policy register a load, as Triton writes it: ptxas makes one of them
    policy = tirx.decl_buffer((1,), "uint64", name="row_policy", scope="local")
    held = tirx.BufferLoad(policy, [0])
    priority = "evict_first" if last_read else "evict_last"
    return tirx.SeqStmt([tirx.AllocBuffer(policy),
                         tirx.Evaluate(ptx[f"createpolicy.fractional.L2::{priority}.b64"](held)), declared,
                         tirx.Evaluate(ptx[f"ld.global.L2::cache_hint.{vec}"](*words, addr, held))])


def _uses(expr, variables) -> bool:
    found = []
    _walk(expr, tirx.Var, lambda v: found.append(v) if any(v.same_as(u) for u in variables) else None)
    return bool(found)


def _accessed_buffers(stmt) -> list:
    """The buffers ``stmt`` loads from or stores to, once an access."""
    accessed = []
    _walk(stmt, (_LOAD, tirx.BufferStore),
          lambda node: accessed.append(node.buffer if isinstance(node, tirx.BufferStore) else node.source))
    return accessed


def _buffer_names(stmt, kind) -> set:
    """The names of the buffers ``stmt`` stores to (``kind`` tirx.BufferStore) or loads from (_LOAD)."""
    names = set()
    if kind is tirx.BufferStore:
        _walk(stmt, tirx.BufferStore, lambda node: names.add(node.buffer.name))
    else:
        _walk(stmt, _LOAD, lambda node: names.add(node.source.name))
    return names


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmnorm.StreamLoads")
def _stream_loads(func, _mod, _ctx):
    """The kernel's row loads (and stores) with the cache hint that the STREAM_LOADS of its
    loops names (one mode a kernel, on each loop the schedule marked): all of them, a software
    pipeline's prologue and epilogue too, which lie outside the annotated walk."""
    marked = _marked(func, STREAM_LOADS)
    if not marked:
        return func
    modes = {int(loop.annotations[STREAM_LOADS]) for loop in marked}
    if len(modes) != 1 or not modes <= set(STREAM_MODES):
        raise ValueError(f"{func.attrs.get('global_symbol')}: stream modes {sorted(modes)} in one kernel; "
                         f"one of {sorted(STREAM_MODES)} expected")
    (mode,) = modes
    body = tvm_ffi.structural_map(func.body, [(tirx.For, lambda loop: _unit_free(_without(loop, STREAM_LOADS))
                                               if STREAM_LOADS in loop.annotations else loop)])
    if not mode:
        return func.with_body(body)
    rows = _row_buffers(func, body)
    if mode == 4:
        body = tvm_ffi.structural_map(body, [(tirx.SeqStmt, lambda seq: _last_reads(seq, rows))])
    return func.with_body(tvm_ffi.structural_map(body, [(tirx.BufferStore,
                                                         lambda st: _stream_store(st, rows, mode))]))


# A function whose x is a buffer of symbolic strides (with_x_layout): TVM's CUDA code generator
# writes a vector load as one only where it proves the address a multiple of the vector, which
# i * x_row_stride + j is not, and otherwise builds the vector element by element (and fails: it
# has no name for a bf16 vector). The call checks the strides instead (the torch layer: a row's
# bytes a multiple of the widest vector), so these loads are written as PTX loads.
STRIDED_ROWS = "tvmnorm.strided_rows"
# The operand whose rows may be strided: x, which a caller may hand over as a slice of a wider
# tensor (x[..., :hidden] of [..., width]). The kernels' other row operands are outputs they
# allocate, or dy, which the torch layer makes compact (autograd's layouts vary).
STRIDED_OPERAND = "x"


def with_x_layout(func, layout: str):
    """The scheduled ``func`` with its STRIDED_OPERAND parameter the buffer of ``layout``
    (build.X_LAYOUTS) and marked STRIDED_ROWS, or ``func`` itself for "compact" or where it has
    no such operand. Applied to the schedule's result, so that every schedule sees the compact
    [rows, hidden] x it was written for: "strided" changes only the buffer's strides (x[i, j]
    flattens to i * x_row_stride + j), "heads" every access to x (row i is (i // x_heads, i %
    x_heads): a division a row, not an element, as the row index is invariant over the columns
    the vector loads run along) and its row count, which the call must give as x_tokens *
    x_heads (checked on the host, before the launch)."""
    old = next((b for b in func.params if b.name == STRIDED_OPERAND), None)
    if layout == "compact" or old is None:
        return func
    # each stride in its dimension's index dtype, as the call's argument check binds them (int32
    # rows in the int32-row kernels, int64 columns in the CUDA kernels of int64 rows)
    rows, hidden = old.shape
    rdt, unit = str(rows.ty), tirx.const(1, str(hidden.ty))
    name = STRIDED_OPERAND
    if layout == "strided":
        new = tirx.decl_buffer(old.shape, old.dtype, name, strides=[tirx.Var(f"{name}_row_stride", rdt), unit])
        body = tvm_ffi.structural_map(func.body, [(type(old), lambda v: new if v.same_as(old) else v)])
    else:
        tokens, heads = tirx.Var(f"{name}_tokens", rdt), tirx.Var(f"{name}_heads", rdt)
        new = tirx.decl_buffer([tokens, heads, hidden], old.dtype, name,
                               strides=[tirx.Var(f"{name}_token_stride", rdt), tirx.Var(f"{name}_head_stride", rdt), unit])
        body = tvm_ffi.structural_map(func.body, [(_LOAD, lambda load: _head_load(load, old, new)),
                                                  (tvm.tirx.stmt.TensorRegion, lambda r: _head_region(r, old, new))])
        # checked before the root block's loops: on the host, ahead of any launch. The arguments
        # in the FFI constructor's order (condition, kind, message); the Python class names its
        # first two the other way round and passes them through as they come
        check = tirx.AssertStmt(tokens * heads == rows, tvm.ir.StringImm("ValueError"),
                                [tvm.ir.StringImm(f"{name}: tokens x heads must be the rows of the other operands")])
        root = body.block
        body = SBlockRealize(body.iter_values, body.predicate,
                             SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                                    tirx.SeqStmt([check, root.body]), root.init, root.alloc_buffers,
                                    root.match_buffers, root.annotations))
    return PrimFunc([new if b.same_as(old) else b for b in func.params], body, func.ret_type,
                    func.attrs).with_attr(STRIDED_ROWS, 1)


def _head_rows(i, new):
    # C's division: a row index and a head count are never negative, and floordiv's sign cases
    # would be code for each load (the simplifier cannot bound a variable's sign)
    heads = new.shape[1]
    return [tirx.truncdiv(i, heads), tirx.truncmod(i, heads)]


def _head_load(load, old, new):
    if not load.source.same_as(old):
        return load
    i, j = load.indices
    return tirx.BufferLoad(new, [*_head_rows(i, new), j])


def _head_region(region, old, new):
    """A block's region of x as the heads buffer's: one row's exactly, several rows' as all of
    them (a (token, head) range of rows is no box)."""
    if not region.source.same_as(old):
        return region
    i, j = region.region
    if isinstance(i.extent, tirx.IntImm) and i.extent.value == 1:
        rows = [tvm.ir.Range.from_min_extent(r, 1) for r in _head_rows(i.min, new)]
    else:
        rows = [tvm.ir.Range.from_min_extent(tirx.const(0, str(d.ty)), d) for d in new.shape[:2]]
    return tirx.BufferRegion(new, [*rows, j])


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmnorm.StridedRows")
def _strided_rows(func, _mod, _ctx):
    target = func.attrs.get("target") if func.attrs is not None else None
    if func.attrs is None or STRIDED_ROWS not in func.attrs or target is None or target.kind.name != "cuda":
        return func
    rows = [b for b in _accessed_buffers(func.body) if b.scope() == "global" and b.name == STRIDED_OPERAND]
    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.BufferStore,
                                                              lambda st: _stream_store(st, rows, 0))]))


def _row_buffers(func, body) -> list:
    """The global buffers ``body`` accesses that hold rows. A row operand's extent depends on the
    row count and a weight's does not: in the library's kernels the count is a free variable; a
    tuning candidate's is a constant, so its function names its row operands (ROW_OPERANDS_ATTR,
    tune.tuning_func), the extents being no guide (at 1024 rows, a weight of 4096 is a multiple
    of the count). Until the thirtieth lease only the free variable counted, so no candidate the
    tuner measured carried its stream mode's cache hint: MetaSchedule timed modes 1, 3 and 4 as
    0 (rmsnorm fwd 7168 on the H200: a mode-1 candidate timed 115.5 us in the tune and ran 149.6
    in the library, whose hint it never saw)."""
    accessed = [b for b in _accessed_buffers(body) if b.scope() == "global"]
    named = func.attrs.get(ROW_OPERANDS_ATTR) if func.attrs is not None else None
    if named is not None:
        return [b for b in accessed if b.name in {str(n) for n in named}]
    free = _free_vars(func)
    return [b for b in accessed if any(_uses(d, free) for d in b.shape)]


def _last_reads(seq, rows):
    """STREAM_LOADS 4 on the stages of a row (``seq``'s statements): a row read by several of
    them is loaded evict_first by the last and evict_last by the others (torch.compile's forward
    at 4096-8192 reads x so, twice); the rest of the loads are left to the caller."""
    row_names = {b.name for b in rows}
    loads = [_buffer_names(child, _LOAD) & row_names for child in seq.seq]
    last = {}
    for i, names in enumerate(loads):
        for name in names:
            last.setdefault(name, []).append(i)
    final = {name: at[-1] for name, at in last.items() if len(at) > 1}
    if not final:
        return seq

    def child(i, stmt):
        ending = [b for b in rows if final.get(b.name) == i]
        if not ending:
            return stmt
        return tvm_ffi.structural_map(stmt, [(tirx.BufferStore, lambda st: _stream_store(st, ending, 4, True))])
    return tirx.SeqStmt([child(i, c) for i, c in enumerate(seq.seq)])


def _full_chunk(loop, row_counts, threads=()):
    """``loop`` versioned as FULL_CHUNK says, or ``loop`` (without the annotation) where a guard
    is not a row index that grows with the loops around it: the guards then stay. ``threads``
    holds (threadIdx var, extent) of the kernel: the test takes each at its largest value, so
    that every thread of a block takes the same version (the walk's row sums hold barriers, which
    all of a block's threads must reach in the same code)."""
    from tvm import sym
    plain = _without(loop, FULL_CHUNK)
    loops = [loop]
    _walk(loop.body, tirx.For, loops.append)
    # (a Var's == builds an expression: no dict keyed by them)
    loop_vars = [lp.loop_var for lp in loops] + [v for v, _ in threads]
    last = [lp.min + lp.extent - 1 for lp in loops] + [e - 1 for _, e in threads]

    def at_last(v):
        return next((e for u, e in zip(loop_vars, last) if u.same_as(v)), v)
    analyzer = sym.Analyzer()
    whole = []
    for cond in _row_guards_of(loop.body, row_counts):
        coeffs = sym.detect_linear_equation(cond.a, loop_vars)
        if not coeffs or any(not isinstance(c, tirx.IntImm) or c.value < 0 for c in coeffs[:-1]):
            return _unit_free(plain)
        # the guard of the walk's last row (the largest index, as no coefficient is negative)
        bound = tirx.LT(tvm_ffi.structural_map(cond.a, [(tirx.Var, at_last)]), cond.b)
        if not any(tvm_ffi.structural_equal(bound, w) for w in whole):
            whole.append(bound)
    if not whole:
        return _unit_free(plain)
    # one test per row count: the guard of the largest row implies the others
    whole = [w for i, w in enumerate(whole)
             if not any(j != i and _same_count(v.b, w.b) and analyzer.can_prove(w.a <= v.a)
                        and (j < i or not analyzer.can_prove(v.a <= w.a)) for j, v in enumerate(whole))]

    # the unguarded copy drops the row guards, and the guards they imply (a chunk lane's)
    implied = _implied_by(whole, loops, threads)

    def dropped(term) -> bool:
        return _is_row_guard(term, row_counts) or implied(term)

    def unguarded_if(node):
        cond = _less_guards(node.condition, dropped)
        if cond is None:
            return node.then_case
        return node if cond.same_as(node.condition) else tirx.IfThenElse(cond, node.then_case, node.else_case)

    def unguarded_expr(node):
        cond = _condition(node)
        if cond is None:
            return node
        rest = _less_guards(cond, dropped)
        if rest is not None and rest.same_as(cond):
            return node
        if isinstance(node, tirx.Select):
            return node.true_value if rest is None else tirx.Select(rest, node.true_value, node.false_value)
        return node.args[1] if rest is None else tirx.if_then_else(rest, node.args[1], node.args[2])
    body = tvm_ffi.structural_map(plain.body, [(tirx.IfThenElse, unguarded_if),
                                               ((tirx.Select, tvm.ir.Call), unguarded_expr)])
    fast = _without(loop, FULL_CHUNK, body)
    # the copy defines its own loop variables, lets and buffers, so that TIR defines none twice
    # (ConvertSSA renames a definition nested in another, not one beside it)
    fast = s_tir.renew_defs(tirx.PrimFunc([], fast)).body
    test = analyzer.simplify(_and(whole))
    if any(b.scope().startswith("shared") for b in _accessed_buffers(loop.body)):
        # the staged dx's walk (sched.rows._cuda_row_shared) needs barriers between its shared
        # buffers' refills and reads, and ThreadSync refuses to put one under a condition it
        # cannot tell every thread of the block takes alike; this one is, by construction (each
        # thread index at its largest value), so it is marked as such
        test = tirx.call_intrin("bool", "tirx.tvm_thread_invariant", test)
    return tirx.IfThenElse(test, _unit_free(fast), _unit_free(plain))


def _free_vars(func) -> list:
    """The variables ``func``'s body uses and does not define (nor takes as a parameter): its
    symbolic shapes, such as the row count n."""
    defined, used = list(func.params), []

    def note(node):
        if isinstance(node, tirx.For):
            defined.append(node.loop_var)
        elif isinstance(node, (tirx.LetStmt, tirx.Let, tirx.Bind)):
            defined.append(node.var)
        elif isinstance(node, tirx.AttrStmt) and node.attr_key == "thread_extent":
            defined.append(node.node.var)
        elif isinstance(node, tirx.Var) and not any(node.same_as(u) for u in used):
            used.append(node)
    _walk(func.body, (tirx.For, tirx.LetStmt, tirx.Let, tirx.Bind, tirx.AttrStmt, tirx.Var), note)
    return [v for v in used if not any(v.same_as(d) for d in defined)]


def _block_threads(func) -> list:
    """(var, extent) of the kernel's threadIdx.x, .y, .z, in the order of a thread's linear
    index in its block (x fastest), each axis it launches."""
    threads = {}
    _walk(func.body, tirx.AttrStmt, lambda a: threads.setdefault(a.node.thread_tag, (a.node.var, a.value))
          if a.attr_key == "thread_extent" and a.node.thread_tag.startswith("threadIdx") else None)
    return [threads[t] for t in ("threadIdx.x", "threadIdx.y", "threadIdx.z") if t in threads]


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmnorm.FullChunk")
def _full_chunks(func, _mod, _ctx):
    if not _marked(func, FULL_CHUNK):
        return func
    row_counts = _row_counts(func)
    threads = _block_threads(func)

    def version(loop):
        if FULL_CHUNK not in loop.annotations:
            return loop
        return _full_chunk(loop, row_counts if int(loop.annotations[FULL_CHUNK]) else [], threads)
    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.For, version)]))


def _reads_cross_thread_result(expr) -> bool:
    found = []
    _walk(expr, _LOAD, lambda load: found.append(load) if load.source.name.startswith(CROSS_THREAD_PREFIX) else None)
    return bool(found)


# TVM's LowerCrossThreadReduction names the result of a reduction across threads so; it writes
# the result back under `threadIdx.x == 0` alone, without the predicate of the block it lowers.
CROSS_THREAD_PREFIX = "cross_thread_"


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmnorm.GuardReductionStores")
def _guard_reduction_stores(func, _mod, _ctx):
    """Each global 1-D store of a cross-thread reduction's result under ``index < extent``. The
    write-back TVM lowers drops the row guard of its block: the fp8 forward's per-row maxima
    (amax_row[n]), with several rows a block, wrote past the last row in the last block (rows
    ceil(n / R) * R - n of them; on a torch tensor inside its 512-byte rounding, by luck)."""
    def guard(store):
        if len(store.indices) != 1 or store.buffer.scope() != "global" or len(store.buffer.shape) != 1 \
                or not _reads_cross_thread_result(store.value):
            return store
        return tirx.IfThenElse(store.indices[0] < store.buffer.shape[0], store, None)
    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.BufferStore, guard)]))


# A CUDA fp8 forward that carries AMAX_FOLD (build.scheduled_funcs marks those that
# compute.norms.folds_amax) takes amax[1] in place of its per-row maxima output amax_row[n] and
# folds the rows' maxima into it, as TransformerEngine's fp8 forward does: the amax kernels
# after it, which read every row's maximum back, cost ~3-5 us a call on the H200
# (bench/results/h200-run22/fp8-probe.log). The runtime zeroes amax first (amax_zero). Each
# thread keeps what the schedule stored to amax_row in a register instead (0, the identity of a
# max of absolute values, where it stores none: threads that hold no row's maximum, rows past
# n); at the end of the kernel, which every thread of the block reaches, the block reduces the
# registers (a warp's by __reduce_max_sync, the warps' through shared memory) and one thread
# makes one atomic for the block, where its maximum is above amax as it stands. A non-negative
# float orders as its int32 bits: the atomic is atomicMax on the bits. Same-address atomics are
# served one at a time: one a warp (the reverted bde00a7) made QK-norm's 131072 of them 2.1x
# slower, and one a block, unconditional, made hidden 896-2048 ~5 us slower on the H200 (the
# fold's first probe, bench/results/h200-run23/), where ~16384 blocks finish in ~20 us; and
# the warp_sums forwards, whose every warp stores its row's maximum, could not fold per warp.
# The tuner's candidates keep amax_row (MetaSchedule allocates a kernel's arguments from its
# PrimFunc, which says amax_row[n]).
AMAX_FOLD = "tvmnorm.amax_fold"
AMAX_ROW = "amax_row"


def _block_fold(func, acc, amax):
    """The statements that fold every thread's ``acc`` into ``amax`` with one atomic a block."""
    threads = _block_threads(func)
    linear, stride, count = None, None, 1
    for var, extent in threads:
        term = var if stride is None else var * stride
        linear = term if linear is None else linear + term
        stride = extent if stride is None else stride * extent
        count *= int(extent)
    ty = linear.ty
    warps = -(-count // 32)
    last = count - 32 * (warps - 1)  # threads of the last warp
    full, part = tirx.const(0xFFFFFFFF, "uint32"), tirx.const((1 << last) - 1 if last < 32 else 0xFFFFFFFF, "uint32")
    warp = tirx.floordiv(linear, tirx.const(32, ty))
    lane = tirx.floormod(linear, tirx.const(32, ty))
    first = linear == tirx.const(0, ty)
    bits = tirx.decl_buffer((1,), "int32", name="amax_bits", data=amax.data)
    top = tirx.Var("amax_warp", "int32")

    def atomic(value):
        # only above amax as it stands, read from L2 (__ldcg: no stale copy in L1): amax only
        # grows during the kernel, so a block at or below the value read cannot raise it, and
        # after the first blocks nearly every block skips its atomic
        address = tirx.address_of(tirx.BufferLoad(bits, [0]))
        return tirx.SeqStmt([tirx.DeclBuffer(bits, data=amax.data), tirx.IfThenElse(
            tirx.call_extern("int32", "__ldcg", address) < value,
            tirx.Evaluate(tirx.call_extern("int32", "atomicMax", address, value)), None)])
    mask = part if warps == 1 else full if last == 32 else tirx.Select(warp == warps - 1, part, full)
    reduce = tirx.Bind(top, tirx.call_extern("int32", "__reduce_max_sync", mask,
                                             tirx.reinterpret("int32", tirx.BufferLoad(acc, [0]))))
    if warps == 1:
        return [reduce, tirx.IfThenElse(first, atomic(top), None)]
    tops = tirx.decl_buffer((warps,), "int32", name="amax_warps", scope="shared")
    block = tirx.Var("amax_block", "int32")
    most = tirx.BufferLoad(tops, [0])
    for w in range(1, warps):
        most = tirx.Max(most, tirx.BufferLoad(tops, [w]))
    sync = tirx.Evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", "shared"))
    return [tirx.AllocBuffer(tops), reduce,
            tirx.IfThenElse(lane == tirx.const(0, ty), tirx.BufferStore(tops, top, [warp]), None), sync,
            tirx.IfThenElse(first, tirx.SeqStmt([tirx.Bind(block, most), atomic(block)]), None)]


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmnorm.AmaxFold")
def _amax_fold(func, _mod, _ctx):
    if AMAX_FOLD not in func.attrs:
        return func
    # buffers are variables of a buffer type here, named as declared: the parameter and the
    # flat view of it that the body declares are both amax_row
    amax = tirx.decl_buffer((1,), "float32", name="amax")
    acc = tirx.decl_buffer((1,), "float32", name="amax_fold", scope="local")
    stores = []

    def ours(buf):
        return buf.name == AMAX_ROW

    def store(node):
        if not ours(node.buffer):
            return node
        stores.append(node)
        return tirx.BufferStore(acc, node.value, [0])

    def load(node):
        return tirx.BufferLoad(acc, [0]) if ours(node.source) else node

    def decl(node):
        return tirx.Evaluate(0) if ours(node.buffer) else node
    body = tvm_ffi.structural_map(func.body, [(tirx.BufferStore, store), (_LOAD, load), (tirx.DeclBuffer, decl)])
    if not stores:
        raise RuntimeError(f"{func.attrs.get('global_symbol')}: no store of {AMAX_ROW} to fold into amax")
    innermost = []

    def wrap(attr):
        if attr.attr_key != "thread_extent":
            return attr
        nested = []
        _walk(attr.body, tirx.AttrStmt, lambda a: nested.append(a) if a.attr_key == "thread_extent" else None)
        if nested:
            return attr
        innermost.append(attr)
        start = [tirx.AllocBuffer(acc), tirx.BufferStore(acc, tirx.const(0.0, "float32"), [0])]
        return tirx.AttrStmt(attr.node, attr.attr_key, attr.value,
                             tirx.SeqStmt(start + [attr.body] + _block_fold(func, acc, amax)))
    body = tvm_ffi.structural_map(body, [(tirx.AttrStmt, wrap)])
    if len(innermost) != 1:
        raise RuntimeError(f"{func.attrs.get('global_symbol')}: {len(innermost)} innermost thread launches, not one")
    left = []
    _walk(body, tirx.Var, lambda v: left.append(v) if v.name == AMAX_ROW else None)
    if left:
        raise RuntimeError(f"{func.attrs.get('global_symbol')}: {AMAX_ROW} is still read after the fold")
    params = [amax if p.name == AMAX_ROW else p for p in func.params]
    return PrimFunc(params, body, func.ret_type, func.attrs)


# A CUDA forward that carries STATS_FIRST (build.scheduled_funcs marks those that
# compute.norms.stores_stats_first says) stores its per-row statistics (rsigma, LayerNorm's mu:
# one thread a row) as soon as they are computed instead of after the row's y. In the
# twenty-fourth lease's Nsight Compute samples of rmsnorm 7168 (bench/results/h200-run24/ncu/),
# the rsigma store came last, after the y stores, and its warp spent 3.4% of all the kernel's
# stall samples waiting there (the store's address register reused one that the y stores still
# read) while the block held its slot on the SM; torch.compile's forward stores no statistics.
# Storing first bought nothing measurable (twenty-fifth lease), so no forward carries it now.
STATS_FIRST = "tvmnorm.stats_first"


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmnorm.StatsFirst")
def _stats_first(func, _mod, _ctx):
    from .compute.norms import ROW_STAT_OPERANDS
    if STATS_FIRST not in func.attrs:
        return func
    found, moved = [], []

    def seq(node):
        children, before = list(node.seq), len(moved)
        for i in range(len(children)):
            written = _buffer_names(children[i], tirx.BufferStore)
            if not written or not written <= set(ROW_STAT_OPERANDS):
                continue
            # right after the last statement before it that writes what it reads (the row's
            # statistic in its register): nothing in between reads or writes the stored rows
            reads = _buffer_names(children[i], _LOAD)
            last = max((j for j in range(i) if _buffer_names(children[j], tirx.BufferStore) & reads), default=None)
            if last is None:
                continue
            found.append(children[i])
            if last == i - 1:
                continue
            between = children[last + 1:i]
            if any(_buffer_names(c, tirx.BufferStore) & written or _buffer_names(c, _LOAD) & written
                   for c in between):
                continue
            moved.append(children[i])
            children = children[:last + 1] + [children[i]] + between + children[i + 1:]
        return tirx.SeqStmt(children) if len(moved) > before else node
    body = tvm_ffi.structural_map(func.body, [(tirx.SeqStmt, seq)])
    if not found:
        raise RuntimeError(f"{func.attrs.get('global_symbol')}: no store of {'/'.join(ROW_STAT_OPERANDS)} after "
                           "the statistic it stores")
    return func.with_body(body) if moved else func


# The fused dx kernel's running sums (the weight-gradient partials in registers,
# sched.rows._cuda_partials) keep their reduction's init inside the walk over the chunk's rows:
# `if (t == 0) part[k] = 0` before each row's update of each sum (the partial block cannot be
# decompose_reduction'ed there: sched.rows._chunk_rows). nvcc does not peel the walk's first
# row: on the H200 layernorm bwd 8192's dx ran one FSEL (and its test) per running sum per row,
# 4.19M of them, 4% of its instructions (bench/results/h200-run34/ncu). A walk loop annotated
# HOIST_INITS = 1 (CudaRowConfig.hoist_inits) runs the init once before the walk instead: it
# stores a constant to registers that nothing reads before that first update. A knob, not a
# rule: on the H200 (bench/results/h200-run36/ab) the committed bf16 records ran 2-6.5% faster
# with it at layernorm 1536-7168 and rmsnorm 7168/8192, and 7.5% slower at layernorm 8192 (the
# same registers and no spills at both: nvcc's schedule of the walk differs).
HOIST_INITS = "tvmnorm.hoist_inits"


def _positive_sum_vars(expr):
    """The variables of ``expr`` where it is a sum of variables with positive integer
    coefficients (so 0 exactly where each of them is, over loops from 0), else None."""
    if isinstance(expr, tirx.Var):
        return [expr]
    if isinstance(expr, tirx.Add):
        a, b = _positive_sum_vars(expr.a), _positive_sum_vars(expr.b)
        return None if a is None or b is None else a + b
    if isinstance(expr, tirx.Mul):
        for v, c in ((expr.a, expr.b), (expr.b, expr.a)):
            if isinstance(c, tirx.IntImm) and c.value > 0:
                return _positive_sum_vars(v)
    return None


def _first_iteration_inits(stmt, loops, guards, found):
    """Append (node, enclosing loops, enclosing conditions) for each ``if (E == 0) buf[i] =
    constant`` reached from ``stmt`` through loops, statement lists and ifs without else."""
    if isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            _first_iteration_inits(s, loops, guards, found)
    elif isinstance(stmt, tirx.For):
        _first_iteration_inits(stmt.body, loops + [stmt], guards, found)
    elif not isinstance(stmt, tirx.IfThenElse) or stmt.else_case is not None:
        return
    elif isinstance(stmt.then_case, tirx.BufferStore) and isinstance(stmt.then_case.value, (tirx.FloatImm, tirx.IntImm)) \
            and isinstance(stmt.condition, tirx.EQ) and _is_zero(stmt.condition.b):
        found.append((stmt, loops, guards))
    else:
        _first_iteration_inits(stmt.then_case, loops, guards + [stmt.condition], found)


def _vars_of(exprs) -> list:
    found = []
    for e in exprs:
        _walk(e, tirx.Var, found.append)
    return found


def _hoisted_init(loop, node, loops, guards, allocated, bound):
    """The loop nest that runs ``node``'s store once for each element it initialises, before
    ``loop`` (which allocates the buffers ``allocated`` and binds the variables ``bound``); None where the store is not an init of ``loop``'s first iteration alone: its
    condition must be a positive sum of ``loop``'s variable and of enclosing loops' from 0, its
    buffer a register array allocated outside ``loop``, its indices and enclosing conditions
    functions of other enclosing loops of constant extents (and of what is fixed outside
    ``loop``: the thread)."""
    store = node.then_case
    first = _positive_sum_vars(node.condition.a)
    if first is None or not any(v.same_as(loop.loop_var) for v in first) or not _is_zero(loop.min):
        return None

    def loop_of(v):
        return next((lp for lp in loops if lp.loop_var.same_as(v)), None)
    if any(not v.same_as(loop.loop_var) and (loop_of(v) is None or not _is_zero(loop_of(v).min)) for v in first):
        return None
    if store.buffer.scope() != "local" or any(b.same_as(store.buffer) for b in allocated):
        return None
    used = _vars_of(store.indices)
    if any(loop_of(v) is None or any(v.same_as(f) for f in first) for v in used):
        return None
    nest = [lp for lp in loops if any(v.same_as(lp.loop_var) for v in used)]
    if any(not isinstance(lp.min, tirx.IntImm) or not isinstance(lp.extent, tirx.IntImm) for lp in nest):
        return None
    inner = [lp.loop_var for lp in nest]
    if any(any(v.same_as(b) for b in bound) and not any(v.same_as(i) for i in inner) for v in _vars_of(guards)):
        return None
    fresh = [(lp.loop_var, tirx.Var(lp.loop_var.name + "_init", lp.loop_var.ty)) for lp in nest]
    body = store if not guards else tirx.IfThenElse(_and(guards), store, None)
    body = tvm_ffi.structural_map(body, [(tirx.Var, lambda v: next((n for o, n in fresh if o.same_as(v)), v))])
    for lp, (_, var) in reversed(list(zip(nest, fresh))):
        body = tirx.For(var, lp.min, lp.extent, lp.kind, body, annotations=lp.annotations)
    return body


def _is_zero(expr) -> bool:
    return isinstance(expr, tirx.IntImm) and expr.value == 0


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmnorm.HoistSumInits")
def _hoist_sum_inits(func, _mod, _ctx):
    if not _marked(func, HOIST_INITS):
        return func

    def hoist(loop):
        if HOIST_INITS not in loop.annotations:
            return loop
        on = int(loop.annotations[HOIST_INITS])
        annotations = {a: v for a, v in loop.annotations.items() if a != HOIST_INITS}
        body, inits = loop.body, []
        if on:
            found, allocated, bound = [], [], [loop.loop_var]
            _first_iteration_inits(loop.body, [], [], found)
            _walk(loop.body, tirx.AllocBuffer, lambda a: allocated.append(a.buffer))
            _walk(loop.body, tirx.For, lambda f: bound.append(f.loop_var))
            _walk(loop.body, (tirx.Bind, tirx.LetStmt), lambda b: bound.append(b.var))
            inits = [(node, _hoisted_init(loop, node, loops, guards, allocated, bound))
                     for node, loops, guards in found]
            inits = [(node, nest) for node, nest in inits if nest is not None]
            if not inits:
                raise RuntimeError(f"{func.attrs.get('global_symbol')}: {HOIST_INITS} on a loop without the init "
                                   "of a running sum at its first iteration")
            hoisted = [node for node, _ in inits]
            body = tvm_ffi.structural_map(body, [(tirx.IfThenElse, lambda n: tirx.Evaluate(0) if any(
                n.same_as(h) for h in hoisted) else n)])
        walk = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, annotations,
                        loop.step, loop.span)
        return tirx.SeqStmt([nest for _, nest in inits] + [walk]) if inits else walk
    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.For, hoist)]))


_FP8_DTYPES = tuple(TVM_DTYPE[t] for t in FP8)


def _fp8_byte_store(store):
    """A store into an fp8 buffer of reinterpret(fp8, byte) as a store of the byte into a uint8
    view of the same memory (declared just before it); other stores as they are."""
    value, dtype = store.value, str(store.buffer.dtype)
    if dtype not in _FP8_DTYPES or not isinstance(value, tvm.ir.expr.Call) or value.op.name != "tirx.reinterpret":
        return store
    (byte,) = value.args
    if not str(byte.ty).startswith("uint8") or getattr(store, "predicate", None) is not None:
        return store
    buf = store.buffer
    view = tirx.decl_buffer(buf.shape, "uint8", buf.name + "_bytes", data=buf.data, strides=buf.strides,
                            elem_offset=buf.elem_offset, scope=buf.scope(), data_alignment=1,
                            offset_factor=buf.offset_factor)
    return tirx.SeqStmt([tirx.DeclBuffer(view, data=buf.data), tirx.BufferStore(view, byte, store.indices)])


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmnorm.Fp8ByteStores")
def _fp8_byte_stores(func, _mod, _ctx):
    """The llvm fp8 forward's y stores as byte stores (compute.norms._quantize computes the byte):
    stored as an fp8 value, FP8ComputeLegalize (which runs after this) would decode the byte to
    fp32 and encode it again. CUDA's fp8 stores are casts, which this leaves alone."""
    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.BufferStore, _fp8_byte_store)]))


def _install_unroll_by():
    """Run _stream_loads, _strided_rows, _guard_reduction_stores, _amax_fold, _stats_first,
    _hoist_sum_inits, _full_chunks, _unroll_annotated and _fp8_byte_stores first wherever the
    default TIR pipeline runs UnrollLoop (it looks the pass up on tirx.transform at each build).
    _stream_loads, _full_chunks and _unroll_annotated change only loops that carry STREAM_LOADS,
    FULL_CHUNK or UNROLL_BY; _amax_fold and _stats_first only functions that carry AMAX_FOLD or
    STATS_FIRST; _fp8_byte_stores only stores of a byte reinterpreted as fp8 (llvm's)."""
    original = tirx.transform.UnrollLoop
    if getattr(original, "tvmnorm_wrapped", False):
        return

    def unroll_loop():
        # the copies re-declare the body's buffers (and loop variables): ConvertSSA gives each
        # copy its own
        # the guards first: a whole block's copy (_full_chunks) drops them with the others
        return tvm.transform.Sequential([_stream_loads, _strided_rows, _guard_reduction_stores, _amax_fold, _stats_first,
                                         _hoist_sum_inits, _full_chunks, _unroll_annotated, _fp8_byte_stores,
                                         tirx.transform.ConvertSSA(),
                                         original()], name="tvmnorm.UnrollLoop")
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


# SHARED_SUMS = 1 on a loop of the fused dx kernel (CudaRowConfig.shared_sums) keeps its running
# dgamma (and dbeta) sums in shared memory instead of registers. The layernorm dx holds 2 sums an
# element of its columns besides the rows it walks: at 8192 ptxas puts the 512-thread variants at
# 118-128 registers (one block an SM, 16 warps; the Nsight Compute reports found the walk bound by
# load latency at that occupancy), and capped at 64 registers for two blocks they spill 424-710
# bytes; with the sums in shared memory 512 x 8 with one row a group fits 64 registers without a
# spill (bench/results/h200-run49/). Each thread keeps its sums in slots of its own, sum k of thread t at
# k * threads + t (a warp's 32 accesses fall in 32 banks), so no thread ever reads another's slot
# and no barrier is needed; but TVM's ThreadSync cannot see that and put one between every pair
# of accesses when the buffer was given a shared scope in the schedule (twelfth lease). So the
# schedule keeps the sums "local" (``_cuda_partials``' per-thread layout), compile_module turns
# the annotation into the function attribute, and _shared_sums moves the buffer after ThreadSync
# has run. The scope is shared.dyn: 512 threads' sums at 8192 take 64 KB, over the 48 KB a block
# may hold statically (TVM's launch sets the kernel's dynamic shared memory limit).
SHARED_SUMS = "tvmnorm.shared_sums"
# the running sums' buffer (the cache_write of sched.rows.PART_BLOCK's "part")
SUMS_BUFFER = "part_local"


# A block may hold more than 48 KB of shared memory only by its dynamic allocation's opt-in, which
# TVM's launch makes where the dynamic bytes alone are 48 KB or more (cuda_module.cc); below that
# the static and dynamic bytes together must fit 48 KB. A staged layernorm 2048 dx with 16 KB of
# shared sums beside 32 KB of staged rows failed every launch with CUDA_ERROR_INVALID_VALUE on the
# H200 (bench/results/h200-run50/).
BLOCK_SHARED_BYTES = 48 * 1024
OPTIN_SHARED_BYTES = 227 * 1024
# What a kernel's allreduces may take (their scratch is allocated after _shared_sums runs)
ALLREDUCE_SHARED_BYTES = 1024


def shared_sums_problem(shared: tuple) -> str | None:
    """Why a kernel of (dynamic, static) shared memory bytes, its sums in shared memory
    (SHARED_SUMS), cannot launch; None where it can."""
    dynamic, static = shared
    if dynamic + static <= BLOCK_SHARED_BYTES or (dynamic >= BLOCK_SHARED_BYTES
                                                  and dynamic + static <= OPTIN_SHARED_BYTES):
        return None
    return (f"shared_sums takes {dynamic} bytes of dynamic shared memory beside {static} static: a block holds "
            f"more than {BLOCK_SHARED_BYTES} in all only where its dynamic bytes alone reach that "
            f"(the launch's opt-in), and {OPTIN_SHARED_BYTES} at most")


def _shared_bytes(body, scope: str) -> int:
    sizes = []

    def alloc(node):
        if node.buffer.scope() == scope:
            count = 1
            for extent in node.buffer.shape:
                count *= int(extent)
            sizes.append(count * node.buffer.dtype.itemsize)
    _walk(body, tirx.AllocBuffer, alloc)
    return sum(sizes)


def _loop_marks(mod):
    """``mod`` with every MIN_BLOCKS_PER_SM annotation made a LAUNCH_BOUNDS_ATTR statement and
    every SHARED_SUMS annotation a function attribute (kept where it is 1, dropped where 0);
    ``mod`` itself where there is neither (a rebuilt module orders its kernels otherwise)."""
    marked = []

    def unmark(func):
        shared = []

        def wrap(loop):
            if MIN_BLOCKS_PER_SM not in loop.annotations and SHARED_SUMS not in loop.annotations:
                return loop
            marked.append(loop)
            annotations = {a: v for a, v in loop.annotations.items() if a not in (MIN_BLOCKS_PER_SM, SHARED_SUMS)}
            body = loop.body
            if SHARED_SUMS in loop.annotations:
                shared.append(int(loop.annotations[SHARED_SUMS]))
            if MIN_BLOCKS_PER_SM in loop.annotations and int(loop.annotations[MIN_BLOCKS_PER_SM]) > 1:
                body = tirx.AttrStmt(tirx.const(0, "int32"), LAUNCH_BOUNDS_ATTR,
                                     tirx.const(int(loop.annotations[MIN_BLOCKS_PER_SM]), "int32"), body)
            return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, annotations,
                            loop.step, loop.span)
        func = func.with_body(tvm_ffi.structural_map(func.body, [(tirx.For, wrap)]))
        return func.with_attr(SHARED_SUMS, 1) if any(shared) else func
    funcs = {gv: unmark(f) if isinstance(f, PrimFunc) else f for gv, f in mod.functions_items()}
    return IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos) if marked else mod


def _thread_index(func):
    """(linear thread index within the block, threads a block) of ``func``'s kernel, from its
    threadIdx launches (x fastest)."""
    axes = {}

    def launch(attr):
        if attr.attr_key == "thread_extent" and attr.node.thread_tag.startswith("threadIdx."):
            axes[attr.node.thread_tag] = (attr.node.var, attr.value)
    _walk(func.body, tirx.AttrStmt, launch)
    index, count = None, None
    for tag in ("threadIdx.x", "threadIdx.y", "threadIdx.z"):
        if tag not in axes:
            continue
        var, extent = axes[tag]
        var = tirx.Cast("int64", var) if str(var.ty) != "int64" else var
        extent = tirx.const(int(extent), "int64")
        index = var if index is None else index + count * var
        count = extent if count is None else count * extent
    return index, count


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmnorm.SharedSums")
def _shared_sums(func, _mod, _ctx):
    if not func.attrs or SHARED_SUMS not in func.attrs:
        return func
    name = func.attrs.get("global_symbol")
    found = []
    _walk(func.body, tirx.AllocBuffer, lambda a: found.append(a.buffer) if a.buffer.name == SUMS_BUFFER else None)
    if len(found) != 1 or found[0].scope() != "local" or len(found[0].shape) != 1:
        raise RuntimeError(f"{name}: {SHARED_SUMS} on a kernel without one flat local {SUMS_BUFFER} buffer "
                           f"({[(b.scope(), list(b.shape)) for b in found]})")
    (old,), (tid, threads) = found, _thread_index(func)
    if tid is None:
        raise RuntimeError(f"{name}: {SHARED_SUMS} on a kernel that launches no threads")
    new = tirx.decl_buffer((old.shape[0] * int(threads),), old.dtype, SUMS_BUFFER + "_shared", scope="shared.dyn")

    def slot(indices):
        (i,) = indices
        return [i * tirx.const(int(threads), i.ty) + tirx.Cast(str(i.ty), tid)]

    def load(node):
        return tirx.BufferLoad(new, slot(node.indices)) if node.source.same_as(old) else node

    def store(node):
        return tirx.BufferStore(new, node.value, slot(node.indices)) if node.buffer.same_as(old) else node

    def alloc(node):
        return tirx.AllocBuffer(new) if node.buffer.same_as(old) else node
    body = tvm_ffi.structural_map(func.body, [(_LOAD, load), (tirx.BufferStore, store), (tirx.AllocBuffer, alloc)])
    left = []
    _walk(body, tirx.BufferStore, lambda n: left.append(n) if n.buffer.same_as(old) else None)
    _walk(body, _LOAD, lambda n: left.append(n) if n.source.same_as(old) else None)
    if left:
        raise RuntimeError(f"{name}: {len(left)} accesses of {SUMS_BUFFER} were not moved to shared memory")
    # a record's trace annotates the knob without the schedule's check (sched.rows.dx_shared_bytes)
    problem = shared_sums_problem((_shared_bytes(body, "shared.dyn"),
                                   _shared_bytes(body, "shared") + ALLREDUCE_SHARED_BYTES))
    if problem:
        raise ValueError(f"{name}: {problem}")
    return func.with_body(body)


def _install_shared_sums():
    """Run _shared_sums right after TVM's ThreadSync("shared.dyn") (the pipeline looks the pass up
    on s_tir.transform at each build), so that no barrier is planned for the moved sums."""
    from tvm import s_tir
    original = s_tir.transform.ThreadSync
    if getattr(original, "tvmnorm_wrapped", False):
        return

    def thread_sync(scope):
        sync = original(scope)
        return tvm.transform.Sequential([sync, _shared_sums], name="tvmnorm.ThreadSync") if scope == "shared.dyn" else sync
    thread_sync.tvmnorm_wrapped = True
    s_tir.transform.ThreadSync = thread_sync


_install_shared_sums()


def compile_module(mod, tgt):
    mod = _loop_marks(mod)
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
