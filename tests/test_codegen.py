"""Structural checks of the CUDA code the default rule generates (no GPU needed): the features
the H200 runs depend on, and the race that was found there staying fixed."""
from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import generated_cuda, has_nvcc, space_variant

from tvmnorm import NormKey
from tvmnorm.build import scheduled_funcs


def cuda_source(key: NormKey, row_config=None, group_rows: int = 1) -> str:
    """The key's CUDA source; ``row_config`` schedules its row kernel (a point of the space),
    ``group_rows`` is its dx kernel's rows per row reduction."""
    return generated_cuda(scheduled_funcs(key, "cuda", row_config=row_config, group_rows=group_rows))


def kernel(src: str, part: str) -> str:
    start = re.search(rf"__global__ void (__launch_bounds__\(\d+(, \d+)?\) )?\w+_{part}_kernel\([^)]*\) {{", src)
    assert start, f"no {part} kernel"
    return src[start.end():src.index("\n}\n", start.end())]


def test_row_kernel_uses_vector_loads_and_warp_allreduce():
    """The default forward (sched.default.fwd_cuda_heuristic) reads x in 8-byte vectors, once
    per element, into registers that both stages read, and writes y in 8-byte vectors; short
    rows take 16-byte vectors."""
    body = kernel(cuda_source(NormKey(hidden_size=4096)), "fwd")
    loads = re.findall(r"\*\((\w+)\*\)\(x_ptr", body)
    assert loads and set(loads) == {"nv_bfloat164"}, "x is not read with 8-byte loads"
    assert len(loads) == 4096 // (128 * 4), "x is read more than once"  # 128 threads x 4 elements
    assert "*(nv_bfloat164*)(y_ptr" in body, "y is not written with 8-byte stores"
    assert "__shfl_down_sync" in body
    short = kernel(cuda_source(NormKey(hidden_size=128)), "fwd")
    assert "*(uint4*)(x_ptr" in short and "*(uint4*)(y_ptr" in short
    # rsigma is stored by one thread of the row, after the value is in every thread's registers
    assert re.search(r"threadIdx\.x\) < (\(int64_t\))?1\)+ \{\s*rsigma_ptr\[", body)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_multi_warp_rows_do_not_update_the_allreduce_result_in_place(dtype):
    """On the H200, StorageRewrite folded rsigma into the shared allreduce result and every thread
    rewrote it in place while others still read it (wrong rsigma for 7168-wide rows)."""
    body = kernel(cuda_source(NormKey(hidden_size=7168, itype=dtype, wtype=dtype, otype=dtype)), "fwd")
    assert "red_result" in body, "expected a multi-warp allreduce at this width"
    assert not re.search(r"red_result_ptr\)\[0\] = rsqrtf", body)


def kernels_of(src: str) -> list:
    return re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", src)


@pytest.mark.parametrize("key", [NormKey(norm="layernorm", stage="bwd", hidden_size=1000),
                                 NormKey(stage="bwd_add", hidden_size=4096),
                                 NormKey(norm="layernorm", stage="bwd", hidden_size=7168)], ids=lambda k: k.name)
def test_cuda_bwd_keeps_the_partial_sums_in_registers(key):
    """CUDA runs the one-pass backward: dx (with the dgamma/dbeta partials of each
    chunk of rows), then finalize. Each thread's running sums are a small local array indexed
    only by constants (registers, not S*H floats of local memory as TVM laid them out before the
    layout transform), stored once after the row walk. No atomics anywhere."""
    src = cuda_source(key)
    names = sorted(set(kernels_of(src)))
    for part in ("dx", "finalize"):
        assert any(n.startswith(f"{key.name}_{part}_kernel") for n in names), (part, names)
    assert not any("wgrad" in n for n in names)
    assert "atomic" not in src
    body = kernel(src, "dx")
    s = key.column_sums
    size = re.search(r"float part_local_ptr\[(\d+)\];", body)
    # every per-thread register buffer (sums, prefetched rows of dy and x) is small and indexed
    # by constants only: an index with a variable would put it in local memory
    for name in ("part_local_ptr", "dy_local_ptr", "x_local_ptr"):
        n = re.search(rf" {name}\[(\d+)\];", body)
        assert n and int(n[1]) <= 8 * 64, (name, n)
        indices = re.findall(rf"\b{name}\[([^\]]*)\]", body)[1:]
        assert indices and all(re.fullmatch(r"(\(int64_t\))?\d+", i) for i in indices), (name, indices[:4])
    assert int(size[1]) % s == 0
    # the loads of dy and x are 16-byte vectors, issued once per element: the stages read them
    # from the registers, not from memory again
    assert len(re.findall(r"\(uint4\*\)\(dy_ptr", body)) == len(re.findall(r"dy_ptr\[|\(dy_ptr", body))
    # the partial row is written after the walk over the chunk's rows, never read back
    assert body.index("for (int64_t") < body.index("part_ptr[")
    assert not re.search(r"= [^;]*part_ptr\[", body)


ZEROED_SUM = re.compile(r"part_local_ptr\[(\d+)\] = 0x0p\+0f")
ZEROED_IN_WALK = re.compile(r"== \(?(int64_t)?\)?0\)+ \{\s*part_local_ptr")


@pytest.mark.parametrize("key,cfg,group", [
    (NormKey(norm="layernorm", stage="bwd", hidden_size=8192), dict(threads=512, vec=8, prefetch=2, full_chunks=1), 1),
    (NormKey(stage="bwd_add", hidden_size=1000), dict(threads=128, vec=8, prefetch=2, stages=2), 1),
    (NormKey(norm="layernorm", stage="bwd", hidden_size=2048), dict(threads=128, vec=8, prefetch=2, staged=1,
                                                                     stages=2), 1),
    (NormKey(norm="layernorm", stage="bwd", hidden_size=4096), dict(threads=512, vec=8, prefetch=2), 2)],
    ids=lambda v: getattr(v, "name", None))
def test_hoist_inits_zeroes_the_running_sums_once_before_the_walk(key, cfg, group):
    """hoist_inits (_tvm.HOIST_INITS): the partial sums' init runs before the walk over the
    chunk's rows, once per sum, not under `if (row == 0)` at each row's update (one FSEL per sum
    per row on the H200): every walk of the kernel (full_chunks' two copies, a pipelined walk's
    prologue and epilogue, grouped row sums) only adds to them. Without it (the default rule's
    and every record tuned before the knob) the init stays where TVM lowers it."""
    from tvmnorm.sched.rows import CudaRowConfig
    rows = max(1, 128 // cfg["threads"])
    inside = kernel(cuda_source(key, row_config=CudaRowConfig(rows=rows, **cfg), group_rows=group), "dx")
    assert ZEROED_IN_WALK.search(inside)
    body = kernel(cuda_source(key, row_config=CudaRowConfig(rows=rows, hoist_inits=1, **cfg), group_rows=group), "dx")
    zeroed = ZEROED_SUM.findall(body)
    size = int(re.search(r"float part_local_ptr\[(\d+)\];", body)[1])
    assert sorted(map(int, zeroed)) == list(range(size)), zeroed
    assert body.rindex("part_local_ptr[0] = 0x0p+0f") < body.index("for (")
    assert not ZEROED_IN_WALK.search(body)
    assert "hoist" not in body


def test_hoist_inits_is_a_dx_schedule():
    from tvmnorm.sched.rows import CudaRowConfig
    with pytest.raises(ValueError, match="hoist_inits must be 0 or 1"):
        CudaRowConfig(hoist_inits=2)
    with pytest.raises(ValueError, match="hoist_inits is a dx schedule"):
        cuda_source(NormKey(hidden_size=1024), row_config=CudaRowConfig(threads=128, vec=8, hoist_inits=1))


@pytest.mark.parametrize("key,cfg", [
    (NormKey(norm="layernorm", stage="bwd", hidden_size=8192), dict(threads=512, vec=8, min_blocks=2, full_chunks=1)),
    (NormKey(stage="bwd", hidden_size=4096), dict(threads=256, rows=2, vec=8, prefetch=2, hoist_inits=1)),
    (NormKey(norm="layernorm", stage="bwd", hidden_size=2048), dict(threads=128, vec=8, prefetch=1, stages=2,
                                                                    staged=True)),
    (NormKey(stage="bwd_add", hidden_size=4095, itype="fp16", wtype="fp16", otype="fp16"), dict(threads=1024, vec=1))])
def test_shared_sums_give_each_thread_its_own_slots_without_barriers(key, cfg):
    """shared_sums moves the dx kernel's running sums from registers (a local array) into dynamic
    shared memory, sum k of thread t at k * threads + t (t over every chunk lane of the block),
    with the same barriers as the kernel that keeps them in registers: the row sums' alone. Its
    launch asks for the bytes (above 48 KB the host sets the kernel's limit first)."""
    from tvmnorm.sched.rows import CudaRowConfig
    regs = kernel(cuda_source(key, row_config=CudaRowConfig(**cfg)), "dx")
    src = cuda_source(key, row_config=CudaRowConfig(shared_sums=1, **cfg))
    body = kernel(src, "dx")
    threads = cfg["threads"] * cfg.get("rows", 1)
    sums = int(re.search(r"float part_local_ptr\[(\d+)\]", regs).group(1))
    assert "part_local_ptr" not in body and f"float part_local_ptr[{sums}]" in regs
    assert re.search(r"extern __shared__ __align__\(\d+\) float part_local_shared_ptr\[\];", body)
    assert body.count("__syncthreads()") == regs.count("__syncthreads()")
    slots = set(re.findall(r"part_local_shared_ptr\[([^\]]+)\]", body))
    lane = rf"threadIdx\.y\)+ \* (\(int64_t\))?{cfg['threads']}\b"
    assert all("threadIdx.x" in i and ("rows" not in cfg or re.search(lane, i)) for i in slots), slots
    offsets = {int(m.group(1)) if (m := re.search(r" \+ \(int64_t\)(\d+)\)$| \+ (?:\(int64_t\))?(\d+)\)$", i)) and
               m.group(1) else int(m.group(2)) if m else 0 for i in slots}
    assert offsets == {k * threads for k in range(sums)}, sorted(offsets)


def test_shared_sums_that_cannot_launch_are_refused():
    """A block's shared memory past 48 KB needs the launch's opt-in, which comes only where the
    dynamic bytes alone reach 48 KB: a staged layernorm 2048 dx with 16 KB of sums beside 33 KB
    of staged rows and allreduce failed every launch on the H200 (CUDA_ERROR_INVALID_VALUE). The
    pass that moves the sums refuses it by name, whether a schedule or a record's trace asked for
    it; the space never draws it (its estimate, rows.dx_shared_bytes, is the same bytes)."""
    from tvmnorm.sched import rows, space
    key = NormKey(norm="layernorm", stage="bwd", hidden_size=2048)
    cfg = rows.CudaRowConfig(threads=128, vec=8, prefetch=2, stages=2, staged=True, shared_sums=1)
    assert rows.dx_shared_bytes(2, 2048, 2, cfg) == (16384, 33792)
    with pytest.raises(ValueError, match="shared_sums takes 16384 bytes of dynamic shared memory beside 33792"):
        cuda_source(key, row_config=cfg)
    assert space.shared_sums_choices(key, (128, 8, 2, 2, False, True)) == [0]
    assert space.shared_sums_choices(key, (128, 8, 1, 2, False, True)) == [0, 1]


@pytest.mark.parametrize("shared,fits", [((16384, 33792), False), ((16384, 32768), True), ((65536, 33792), True),
                                         ((49152, 1024), True), ((48128, 1024), True), ((48128, 2048), False),
                                         ((200 * 1024, 28 * 1024), False)])
def test_shared_sums_launch_rule(shared, fits):
    from tvmnorm._tvm import shared_sums_problem
    assert (shared_sums_problem(shared) is None) == fits


def test_shared_sums_are_a_dx_schedule():
    from tvmnorm.sched.rows import CudaRowConfig
    with pytest.raises(ValueError, match="shared_sums is a dx schedule"):
        cuda_source(NormKey(hidden_size=1024), row_config=CudaRowConfig(threads=128, vec=8, shared_sums=1))
    with pytest.raises(ValueError, match="shared_sums must be 0 or 1"):
        CudaRowConfig(shared_sums=2)


def test_finalize_splits_the_partials_over_lanes():
    """Many partials (QK-norm: 8192 at 524288 rows of 128) are summed by many threadIdx.y lanes
    per column (finalize_split) and a fixed-order tree, not one serial thread per column."""
    body = kernel(cuda_source(NormKey(stage="bwd", hidden_size=128)), "finalize")
    assert "threadIdx.y" in body and "red_buf" in body and "__syncthreads" in body
    assert "atomic" not in body
    # the store is done by one lane
    assert re.search(r"threadIdx\.y\) < \(int64_t\)1\)+ \{\s*dgamma_ptr\[", body)


@pytest.mark.parametrize("columns,lanes,unroll", [(32, 16, 4), (16, 32, 1), (8, 64, 2), (8, 128, 8)])
def test_finalize_split_variants_compile(columns, lanes, unroll):
    """bench/bwd_parts.py times finalize split other ways on the GPU: each split compiles to one
    block of columns x lanes threads for dgamma and dbeta together, with the partials reduced
    across its lanes, ``unroll`` guarded loads per step of a lane's walk, and no atomics."""
    from tvmnorm.compute.norms import finalize
    from tvmnorm.sched.default import _cuda_finalize
    func = finalize(NormKey(norm="layernorm", stage="bwd", hidden_size=1000), "cuda", "f")
    sch = _cuda_finalize(func, columns, lanes, unroll)
    src = generated_cuda({"f": sch.mod["main"].with_attr("global_symbol", "f").with_attr("tirx.is_scheduled", True)})
    bounds = re.findall(r"__global__ void __launch_bounds__\((\d+)\) \w+\([^)]*\) \{", src)
    assert bounds == [str(columns * lanes)]  # one kernel writes dgamma and dbeta
    assert "threadIdx.y" in src and "atomic" not in src
    walk = src[src.index("for ("):src.index("__syncthreads")]
    # each step of the walk: `unroll` guarded loads of each of the two partial rows
    assert len(re.findall(r"\+ part_ptr\[", walk)) == 2 * unroll
    assert len(re.findall(r"< p\)", walk)) == unroll


@pytest.mark.parametrize("hidden,columns,lanes", [(128, 8, 128), (1000, 8, 128), (2048, 8, 64), (4095, 16, 32),
                                                  (8192, 32, 16), (65536, 32, 16)])
def test_finalize_split_follows_the_hidden_size(hidden, columns, lanes):
    """The default finalize spreads narrow rows' columns over more blocks (8 columns a block up
    to hidden 2048) and wide rows' over fewer, with 512-1024 threads a block: the splits measured
    fastest on the H200."""
    body = cuda_source(NormKey(stage="bwd", hidden_size=hidden))
    bounds = re.findall(r"__global__ void __launch_bounds__\((\d+)\) \w+_finalize_kernel\([^)]*\) \{", body)
    assert bounds == [str(columns * lanes)]
    assert re.search(rf"blockIdx\.x\)+ \* (\(int64_t\))?{columns}\)", kernel(body, "finalize"))


def fp8_fwd_source(norm, hidden, cfg, fold: bool) -> str:
    """The CUDA source of an fp8 forward scheduled by ``cfg``, folding its rows' maxima into
    amax (_tvm.AMAX_FOLD, as every CUDA fp8 forward does: compute.norms.folds_amax) or writing
    them out to amax_row."""
    from tvmnorm._tvm import AMAX_FOLD
    funcs = scheduled_funcs(NormKey(norm=norm, hidden_size=hidden, otype="fp8e4m3"), "cuda", row_config=cfg,
                            parts=("fwd",))
    funcs = {n: f.with_attr(AMAX_FOLD, 1) if fold else f.without_attr(AMAX_FOLD) for n, f in funcs.items()}
    return generated_cuda(funcs)


FP8_ROW_POINTS = [(128, 8, 16, 8, False), (128, 4, 32, 8, True), (1000, 64, 4, 4, False), (4096, 256, 2, 8, True)]


@pytest.mark.parametrize("fold", (False, True), ids=("amax_row", "fold"))
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
@pytest.mark.parametrize("hidden,threads,rows,vec,keep", FP8_ROW_POINTS)
def test_fp8_row_maxima_are_stored_for_rows_below_n_only(norm, hidden, threads, rows, vec, keep, fold):
    """With several rows a block, the last block's rows past n store no maximum, to amax_row or
    (folding) to the register folded into amax: TVM lowers the write-back of a reduction across
    threads under `threadIdx.x == 0` alone, and amax_row[n] was written past its end
    (_tvm._guard_reduction_stores)."""
    from tvmnorm.sched.rows import CudaRowConfig
    cfg = CudaRowConfig(threads=threads, rows=rows, vec=vec, keep_row=keep, keep_y=keep)
    body = kernel(fp8_fwd_source(norm, hidden, cfg, fold), "fwd")
    target = r"amax_fold_ptr\[0\] = (?!0x0p\+0f)" if fold else r"(?<!\w)amax_row_ptr\[[^\n]*\] = "
    stores = [m.start() for m in re.finditer(target, body)]
    assert stores, "no row maxima stored"
    guard = rf"\(\(\(\(int64_t\)blockIdx\.x\) \* \(int64_t\){rows}\) \+ \(\(int64_t\)threadIdx\.y\)\) < n\)[^\n]*\{{\s*$"
    for at in stores:
        assert re.search(guard, body[max(0, at - 400):at]), f"a row maximum stored without its row guard: {body[at:at + 120]}"


@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
@pytest.mark.parametrize("hidden,threads,rows,vec,keep,warp_sums", [
    (128, 8, 16, 8, False, False), (128, 4, 4, 8, True, False), (1000, 64, 4, 4, False, False),
    (4096, 256, 2, 8, True, False), (7168, 128, 1, 8, True, True), (8192, 256, 1, 8, False, True)])
def test_fp8_forward_folds_the_row_maxima_into_amax(norm, hidden, threads, rows, vec, keep, warp_sums):
    """A folding fp8 forward (_tvm.AMAX_FOLD) takes amax[1] for amax_row[n]: each thread keeps
    what it stored to amax_row in a register that starts at 0, and at the end of the kernel the
    block reduces them (__reduce_max_sync, then the warps' through shared memory) and makes one
    atomicMax on the bits, from its first thread, only where that is above amax as read from L2
    (__ldcg; same-address atomics are served one at a time). warp_sums forwards
    accumulate their row's maximum over the warps' partial maxima in that register too (each
    warp's lane 0, the same value)."""
    from tvmnorm.sched.rows import CudaRowConfig
    cfg = CudaRowConfig(threads=threads, rows=rows, vec=vec, keep_row=keep, keep_y=keep, warp_sums=warp_sums)
    src = fp8_fwd_source(norm, hidden, cfg, fold=True)
    assert re.search(r"_fwd_kernel\(float\* __restrict__ amax_ptr,", src) and not re.search(r"(?<!_)amax_row_ptr", src)
    body = kernel(src, "fwd")
    assert body.lstrip().startswith("alignas(64) float amax_fold_ptr[1];\n  amax_fold_ptr[0] = 0x0p+0f")
    assert body.count("atomicMax(") == 1
    block = threads * rows
    linear = rf"\(\(\(\(int64_t\)threadIdx\.y\) \* \(int64_t\){threads}\) \+ \(\(int64_t\)threadIdx\.x\)\) == \(int64_t\)0\)" \
        if rows > 1 else None
    mask = "(uint)4294967295" if block >= 32 else f"(uint){(1 << block) - 1}"
    tail = body[body.index("__reduce_max_sync("):]
    assert tail.startswith(f"__reduce_max_sync({mask}, "), tail[:80]
    if block > 32:
        assert f"__shared__ alignas(64) int amax_warps_ptr[{block // 32}];" in body
        assert tail.index("__syncthreads();") < tail.index("atomicMax(")
        assert "max(amax_warps_ptr[0], amax_warps_ptr[1])" in tail
    else:
        assert "amax_warps" not in body and "__syncthreads" not in tail
    if linear:
        last = tail.index("__syncthreads();") if block > 32 else 0
        assert re.search(linear, tail[last:tail.index("atomicMax(")]), "the atomic is not the block's first thread's"
    assert re.search(r"if \(__ldcg\(\(&\(\(\(int\*\)amax_ptr\)\[0\]\)\)\) < amax_(block|warp)\) \{\s*"
                     r"atomicMax\(\(&\(\(\(int\*\)amax_ptr\)\[0\]\)\), amax_(block|warp)\);", tail)
    if warp_sums:  # the warps' partial maxima combined in the register, none in global memory
        assert re.search(r"amax_fold_ptr\[0\] = max\(amax_fold_ptr\[0\], amax_row_rf_shared_ptr\[", body)


def test_fp8_parts_fold_on_cuda_only():
    """The CUDA fp8 forward folds its amax at every width (amax_zero, then the forward: no amax
    kernels); llvm keeps the amax kernels after its forward."""
    from tvmnorm.compute.norms import parts_of
    for hidden in (128, 1000, 7168):
        key = NormKey(otype="fp8e4m3", hidden_size=hidden)
        assert parts_of(key, "cuda") == ("amax_zero", "fwd") and parts_of(key, "llvm") == ("fwd", "amax", "amax_one")
    assert parts_of(NormKey(hidden_size=128), "cuda") == ("fwd",)
    src = cuda_source(NormKey(otype="fp8e4m3", hidden_size=128))
    assert re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?\w+_(amax\w*|fwd)_kernel\(", src)[:2] == \
        ["amax_zero", "fwd"] and "_amax_kernel" not in src and "_amax_one_kernel" not in src
    assert "amax_ptr[0] = 0x0p+0f" in kernel(src, "amax_zero")


@pytest.mark.parametrize("hidden", [8192, 4096])
def test_layernorm_bwd_reduces_both_row_sums_in_one_allreduce(hidden):
    """LayerNorm's dx needs sum(dy*g) and sum(dy*g*xhat) per row: one tuple allreduce on CUDA, so
    a multi-warp row has as many barriers as RMSNorm's one sum (two chained ones had twice as
    many). The default loads rows in groups of `prefetch` (unrolled), so barriers are compared
    per row, and per copy of the walk (full_chunks writes it twice: without row guards, and with
    them for the last chunk). At 4096 the default stages its rows in shared memory, whose
    buffers take barriers of their own (ThreadSync's), the same in both norms."""
    from tvmnorm.compute.norms import kernel_funcs
    from tvmnorm.sched.default import fused_cuda_heuristic

    sources, per_row = {}, {}
    for norm in ("layernorm", "rmsnorm"):
        key = NormKey(norm=norm, stage="bwd", hidden_size=hidden)
        sources[norm] = kernel(cuda_source(key), "dx")
        assert "red_buf_staging" in sources[norm], "expected a multi-warp allreduce at this width"
        cfg = fused_cuda_heuristic(kernel_funcs(key, "cuda")["dx"], hidden, 2)
        per_row[norm] = sources[norm].count("__syncthreads") / cfg.prefetch / (1 + cfg.full_chunks)
    assert per_row["layernorm"] == per_row["rmsnorm"]
    if not cfg.staged:
        assert per_row["rmsnorm"] == 2
    assert "red_buf1" in sources["layernorm"], "the two sums do not share one allreduce"


@pytest.mark.parametrize("norm,hidden,threads,group", [
    ("layernorm", 4096, 256, 2), ("rmsnorm", 4096, 256, 4), ("layernorm", 1000, 128, 2), ("rmsnorm", 7168, 448, 2)])
def test_grouped_dx_reduces_a_group_of_rows_in_one_allreduce(norm, hidden, threads, group):
    """With P rows per row reduction (compute.norms._group_sums) a multi-warp row's dx kernel
    has the barriers of one allreduce per group of P rows, where P rows loaded at once without
    it have P allreduces; the rows' statistics and sums stay in registers indexed by constants
    (no row selected at run time)."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage="bwd", hidden_size=hidden)
    cfg = CudaRowConfig(threads=threads, rows=1, vec=8, prefetch=group)
    grouped = kernel(cuda_source(key, row_config=cfg, group_rows=group), "dx")
    per_row = kernel(cuda_source(key, row_config=cfg), "dx")
    assert "red_buf_staging" in grouped, "expected a multi-warp allreduce at this width"
    assert per_row.count("__syncthreads") == group * grouped.count("__syncthreads") == group * 2
    stats = ("mu_local_ptr", "rsigma_local_ptr") if norm == "layernorm" else ("rsigma_local_ptr",)
    for buf in stats:
        assert re.search(rf" {buf}\[(\d+)\];", grouped)[1] == str(group), buf
    sums = set(re.findall(r"\b((?:c12|c2)_v\d+)_local_ptr\[0\]", grouped))
    assert len(sums) == group * (2 if norm == "layernorm" else 1), sums
    assert not re.search(r"\? *\(?(c12|c2)_v\d", grouped), "a row's sum is selected at run time"


def test_grouped_rows_need_cuda_and_a_divisor_of_the_chunk():
    from tvmnorm.compute.norms import dx
    key = NormKey(norm="layernorm", stage="bwd", hidden_size=1024)
    for kind, group in (("llvm", 2), ("cuda", 3), ("cuda", 0)):
        with pytest.raises(ValueError, match="rows per group"):
            dx(key, kind, group_rows=group)
    assert dx(key, "cuda", group_rows=4).attrs["tvmnorm.rows_per_group"] == 4
    assert "tvmnorm.rows_per_group" not in dx(key, "cuda").attrs


@pytest.mark.parametrize("norm,hidden,threads,prefetch,stages", [
    ("layernorm", 8192, 512, 1, 2), ("rmsnorm", 1024, 64, 2, 3), ("layernorm", 1000, 128, 4, 2)])
def test_pipelined_dx_loads_the_next_groups_before_the_first_barrier(norm, hidden, threads, prefetch, stages):
    """The pipelined dx (sched.rows._cuda_pipeline): `stages` copies of the group's row
    registers, indexed by constants only (the walk is unrolled by `stages`), and the loads
    of the first `stages` groups issued before the first row's allreduce barrier."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage="bwd", hidden_size=hidden)
    vec = 8
    cfg = CudaRowConfig(threads=threads, rows=1, vec=vec, prefetch=prefetch, stages=stages)
    body = kernel(cuda_source(key, row_config=cfg), "dx")
    vectors = -(-hidden // (threads * vec))
    for buf in ("dy_local_ptr", "x_local_ptr"):
        assert re.search(rf" {buf}\[(\d+)\];", body)[1] == str(stages * prefetch * vectors * vec), buf
        indices = re.findall(rf"\b{buf}\[([^\]]*)\]", body)[1:]
        assert all(re.fullmatch(r"(\(int64_t\))?\d+", i) for i in indices), indices[:4]
    loads = [m.start() for m in re.finditer(r"= \*\(\w+\*\)\(dy_ptr", body)]
    first_barrier = body.index("__syncthreads")
    assert sum(p < first_barrier for p in loads) == stages * prefetch * vectors
    # the walk stays a loop, unrolled only `stages` times (each copy then indexes its own row
    # registers by constants): the group loop is the kernel's one loop
    assert re.findall(r"for \(int64_t (\w+) = ", body) == [re.search(r"for \(int64_t (\w+_o) = ", body)[1]]


@pytest.mark.parametrize("norm,hidden,threads,rows,min_blocks", [
    ("layernorm", 8192, 512, 1, 2), ("rmsnorm", 1000, 128, 2, 4), ("layernorm", 7168, 896, 1, 1)])
def test_dx_asks_for_min_blocks_per_sm_in_its_launch_bounds(norm, hidden, threads, rows, min_blocks):
    """CudaRowConfig.min_blocks becomes __launch_bounds__'s second argument of the dx kernel
    (both index widths; _tvm.MIN_BLOCKS_PER_SM), and 1 leaves the bounds as TVM prints them;
    the other kernels of the key keep theirs."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage="bwd", hidden_size=hidden)
    cfg = CudaRowConfig(threads=threads, rows=rows, vec=8, min_blocks=min_blocks)
    src = cuda_source(key, row_config=cfg)
    bounds = f"{threads * rows}, {min_blocks}" if min_blocks > 1 else f"{threads * rows}"
    assert re.search(rf"__global__ void __launch_bounds__\({bounds}\) \w+_dx_kernel\(", src)
    # declaration and definition of dx; combine and finalize keep theirs
    assert len(re.findall(r"__launch_bounds__\(\d+, \d+\)", src)) == (2 if min_blocks > 1 else 0)


@pytest.mark.parametrize("norm,stage,hidden,threads,prefetch,stages,min_blocks", [
    ("layernorm", "bwd", 8192, 512, 2, 1, 1), ("rmsnorm", "bwd_add", 1000, 128, 2, 2, 2),
    ("layernorm", "bwd", 1024, 128, 1, 1, 1), ("layernorm", "bwd", 2048, 64, 2, 1, 1)])
def test_dx_walks_whole_chunks_without_row_guards(norm, stage, hidden, threads, prefetch, stages, min_blocks):
    """full_chunks (_tvm.FULL_CHUNK): the dx kernel's walk comes twice, under one test of its
    chunk's last row: a copy with no row guard at all (loads, row sums, dx, partial sums), taken
    when every row of the chunk is below n, and the guarded walk for the last chunk. Without it
    each stage guards every element (the walk of 2 rows a group at layernorm 8192: 150 guards)."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage=stage, hidden_size=hidden)
    cfg = CudaRowConfig(threads=threads, rows=max(1, 128 // threads), vec=8, prefetch=prefetch, stages=stages,
                        min_blocks=min_blocks)
    guarded = kernel(cuda_source(key, row_config=cfg), "dx")
    body = kernel(cuda_source(key, row_config=dataclasses.replace(cfg, full_chunks=1)), "dx")
    walk = re.compile(r"for \(int64_t \w+ = ")
    assert len(walk.findall(guarded)) == 1 and len(walk.findall(body)) == 2
    test = re.search(r"if \((.*) < n\) \{\n\s*for \(int64_t", body)
    assert test, "no test of the chunk's last row before the walk"
    # the last row of the block's last chunk lane, whatever the thread: all of a block's threads
    # take one version (the row sums' barriers); a pipelined walk leaves its last groups to the
    # loop's epilogue
    last = re.fullmatch(r"\(+\(int64_t\)blockIdx\.x\) \* \(int64_t\)(\d+)\) \+ \(int64_t\)(\d+)\)", test[1])
    from tvmnorm.compute.norms import rows_per_partial
    per_block = rows_per_partial(key, "cuda") * cfg.rows
    assert last and int(last[1]) == per_block, test[1]
    assert int(last[2]) == per_block - 1 or stages > 1 and int(last[2]) < per_block - 1, test[1]
    fast = body[test.end():body.index("} else {", test.end())]
    assert "< n" not in fast and "dy_ptr" in fast and "part_local" in fast
    # the guarded copy keeps its guards (less those the failed test decides, which TVM's
    # simplifier drops there), and so do a pipelined walk's prologue and epilogue
    rest = body[body.index("} else {", test.end()):]
    assert guarded.count("< n") - 4 <= rest.count("< n") + body[:test.start()].count("< n") <= guarded.count("< n")


@pytest.mark.parametrize("norm,hidden,threads,prefetch", [("layernorm", 7168, 448, 1), ("rmsnorm", 1024, 128, 2)])
def test_tuning_candidates_walk_whole_chunks_as_the_library_does(norm, hidden, threads, prefetch):
    """A tuning candidate has a static row count (tune.tuning_func), so its row guards compare
    with a constant: full_chunks versions its walk all the same (_tvm.STATIC_ROWS_ATTR), as it
    does the library's symbolic-row kernel. It did not, and the tuner timed one guarded walk
    where the library ran two copies (layernorm bwd 7168: 272 us as a candidate, 379 us in the
    library, which spilled under the point's register cap)."""
    from tvmnorm.sched.rows import CudaRowConfig, schedule_rows_cuda
    from tvmnorm.tune import tuning_func, tune_rows
    key = NormKey(norm=norm, stage="bwd", hidden_size=hidden)
    cfg = CudaRowConfig(threads=threads, rows=max(1, 128 // threads), vec=8, prefetch=prefetch, full_chunks=1)
    rows = tune_rows(key, "cuda")
    sch = schedule_rows_cuda(tuning_func(key, "dx", rows, "cuda"), cfg)
    funcs = {"cand_dx": sch.mod["main"].with_attr("global_symbol", "cand_dx").with_attr("tirx.is_scheduled", True)}
    body = kernel(generated_cuda(funcs), "dx")
    walks = re.findall(r"for \(int(?:64_t)? \w+ = ", body)
    assert len(walks) == 2, f"{len(walks)} copies of the walk"
    # the test of the chunk's last row (which TVM's simplifier may fold into a bound on blockIdx)
    test = re.search(r"if \((.*)\) \{\n\s*for \(int", body)
    assert test, "no test before the walk"
    fast, rest = body[test.end():body.index("} else {", test.end())], body[body.index("} else {", test.end()):]
    assert f"< {rows})" not in fast and "dy_ptr" in fast and f"< {rows})" in rest


@pytest.mark.parametrize("key,threads,rows,vec,keep", [
    (NormKey(hidden_size=128), 16, 8, 8, True), (NormKey(norm="layernorm", otype="fp8e4m3", hidden_size=1024), 64, 4, 8, True),
    (NormKey(norm="layernorm", hidden_size=1000), 32, 4, 4, False), (NormKey(hidden_size=4096), 512, 1, 8, True)],
    ids=lambda v: getattr(v, "name", str(v)))
def test_fwd_computes_whole_blocks_without_row_guards(key, threads, rows, vec, keep):
    """full_chunks on the forward: a block of several rows all below n runs a copy of the kernel
    body with no row guard, under one test of the block's last row that every thread of the
    block takes alike (the rows' allreduce barriers); the last block keeps its guards. One row a
    block has no row guard to drop."""
    from tvmnorm.sched.rows import CudaRowConfig
    cfg = CudaRowConfig(threads=threads, rows=rows, vec=vec, keep_row=keep, keep_y=keep and key.fp8_out)
    guarded = kernel(cuda_source(key, row_config=cfg), "fwd")
    body = kernel(cuda_source(key, row_config=dataclasses.replace(cfg, full_chunks=1)), "fwd")
    if rows == 1:
        assert "< n" not in guarded and body == guarded
        return
    test = re.search(r"if \(\(+\(int64_t\)blockIdx\.x\) \* \(int64_t\)(\d+)\) \+ \(int64_t\)(\d+)\) < n\) \{", body)
    assert test and int(test[1]) == rows and int(test[2]) == rows - 1, body[:400]
    fast = body[test.end():body.index("} else {", test.end())]
    assert "< n" not in fast and "x_ptr" in fast and "y_ptr" in fast
    assert guarded.count("< n") > 2 and body[body.index("} else {", test.end()):].count("< n") >= guarded.count("< n") - 2


def test_min_blocks_decision_replays_on_both_index_widths():
    """A tuned record whose min_blocks decision is 2 (the sampled knob of the fused dx space)
    gives the library's dx kernel in both index widths (build.key_funcs) __launch_bounds__(N, 2)."""
    import json

    from tvmnorm.build import key_funcs
    from tvmnorm.sched.space import MIN_BLOCKS
    from tvmnorm.tune import tuning_func
    key = NormKey(norm="layernorm", stage="bwd", hidden_size=2048)
    sch = space_variant(key, "cuda", tuning_func(key, "dx", 2048, "cuda"))
    insts, decisions = json.loads(json.dumps(sch.trace.simplified(remove_postproc=True).as_json(),
                                             default=lambda o: o.value))
    choice = [i for i, inst in enumerate(insts) if inst[0] == "SampleCategorical"
              and inst[2][0] == [b for b in MIN_BLOCKS if b <= len(inst[2][0])]]
    assert len(choice) == 1, "one min_blocks decision per fused variant"
    decisions = [d for d in decisions if d[0] != choice[0]] + [[choice[0], 1]]  # MIN_BLOCKS[1] == 2
    src = generated_cuda(key_funcs(key, "cuda", {"parts": {"dx": [insts, decisions]}}))
    for part in ("dx", "narrow_dx"):
        assert re.search(rf"__global__ void __launch_bounds__\(\d+, 2\) {key.name}_{part}_kernel\(", src), part


@pytest.mark.parametrize("norm,otype,hidden,threads,vec,keep", [
    ("rmsnorm", "bf16", 7168, 256, 4, True), ("layernorm", "bf16", 8192, 256, 4, True),
    ("rmsnorm", "fp8e4m3", 4096, 128, 4, True), ("layernorm", "fp8e4m3", 7168, 896, 8, True),
    ("rmsnorm", "bf16", 8192, 512, 4, False)])
def test_warp_sums_take_one_barrier_a_row_sum(norm, otype, hidden, threads, vec, keep):
    """warp_sums: each row sum (rmsnorm's, layernorm's two, fp8's amax) is reduced within each
    warp by shuffles into shared memory at the warp's place, and every thread then adds the
    warps' sums: one __syncthreads a row sum where TVM's allreduce over several warps takes two;
    the row's statistics are still stored by one thread. (A forward folding its amax takes one
    barrier more at its end, _tvm.AMAX_FOLD, not counted here.)"""

    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, otype=otype, hidden_size=hidden)
    base = CudaRowConfig(threads=threads, rows=1, vec=vec, keep_row=keep, keep_y=keep and otype != "bf16")

    def row_sums(src):
        return kernel(src, "fwd").split("__shared__ alignas(64) int amax_warps_ptr")[0]
    before = row_sums(cuda_source(key, row_config=base))
    after = row_sums(cuda_source(key, row_config=dataclasses.replace(base, warp_sums=True)))
    sums = (2 if norm == "layernorm" else 1) + (otype != "bf16")
    assert before.count("__syncthreads") == 2 * sums and after.count("__syncthreads") == sums
    assert len(re.findall(rf"__shared__ alignas\(64\) float \w+_rf_shared_ptr\[{threads // 32}\];", after)) == sums
    assert "threadIdx.z" in after and "threadIdx.z" not in before
    store = after.index("rsigma_ptr[")
    assert re.search(r"if \(\(\(\(\(int64_t\)threadIdx\.z\) \* \(int64_t\)32\) \+ \(\(int64_t\)threadIdx\.x\)\) < "
                     r"\(int64_t\)1\) \{\s*$", after[:store].rstrip()[-200:] + "\n"), after[store - 300:store]


@pytest.mark.parametrize("norm,otype,hidden,threads,rows,vec,extra", [
    ("rmsnorm", "bf16", 8192, 512, 2, 8, {}), ("layernorm", "bf16", 1000, 128, 2, 4, {}),
    ("rmsnorm", "bf16", 7168, 896, 1, 8, {"warp_sums": True}), ("layernorm", "fp8e4m3", 4096, 512, 1, 8, {}),
    ("layernorm", "fp8e4m3", 4096, 256, 1, 8, {"keep_y": True}), ("layernorm", "bf16", 2048, 64, 2, 8, {"full_chunks": 1})])
def test_early_weights_load_before_the_row_sums(norm, otype, hidden, threads, rows, vec, extra):
    """early_weights: the weights (gamma, and layernorm's beta) are loaded into registers with x,
    before the first barrier of the row sums, and every later stage (y, fp8's amax) reads those
    registers: no load of them after it. Without it they are loaded only after the sums."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, otype=otype, hidden_size=hidden)
    base = CudaRowConfig(threads=threads, rows=rows, vec=vec, keep_row=True, **extra)
    weights = ("gamma", "beta") if norm == "layernorm" else ("gamma",)
    for early in (False, True):
        body = kernel(cuda_source(key, row_config=dataclasses.replace(base, early_weights=early)), "fwd")
        # with full_chunks the row appears twice (unguarded, then guarded): each copy's first barrier
        copies = body.split("} else {") if extra.get("full_chunks") else [body]
        assert len(copies) == (2 if extra.get("full_chunks") else 1)
        for copy in copies:
            barrier = copy.index("__syncthreads")
            for w in weights:
                loads = [m.start() for m in re.finditer(rf"\b{w}_ptr \+", copy)]
                assert loads, f"no vector load of {w}"
                assert all((at < barrier) == early for at in loads), (w, early)
            assert copy.index("x_ptr +") < barrier


@pytest.mark.parametrize("hidden,elem_bytes,small", [
    (128, 2, (16, 8, 8, False, False, False)), (64, 2, (8, 16, 8, False, False, False)),  # rows that share a
    (128, 4, (32, 4, 4, False, False, False)),                          # block: one vector a thread
    (96, 2, None),  # twice the threads would idle (16 x 8 elements > 96): the forward's
    (512, 2, (128, 1, 4, False, True, False)),  # one 8-byte vector a thread already: one barrier a row sum
    (2560, 2, (320, 1, 4, False, True, False)),  # 640 vectors: 10 warps of 2 each
    (7168, 2, (896, 1, 4, False, True, True)),  # 28 warps of 2 vectors each, their sums by shuffles
    (8192, 2, (1024, 1, 4, False, True, True)),  # 32 warps
    (7168, 4, (1024, 1, 2, False, False, False)),  # 3584 vectors: no whole warps <= 1024 split them in 2s
    (1000, 2, None),  # 250 vectors split by no whole warps: the forward's 128 threads
    (4095, 2, None),  # 2-byte vectors, 8 a thread: the forward's 512 threads
    (65536, 2, (1024, 1, 4, False, True, True))])
def test_small_call_rule(hidden, elem_bytes, small):
    """sched.default.small_call_cuda_heuristic, as (threads, rows, vec, early_weights,
    warp_sums, shuffle_sums): where rows share a block, the forward rule's kept row with twice
    the threads a row and half the rows a block (unless threads would idle); a row a block, at
    most 16 bytes of it a thread in 8-byte vectors, the fewest whole warps that split it evenly
    (one barrier a row sum; from 24 warps up the warps' sums added by shuffles), else the fewest
    powers of two (at least the forward's), the weights loaded after the sums. A default key
    gets a small-call kernel only where the rule differs from its forward
    (build.has_own_small_call), and it compiles to blocks of that shape."""
    from tvmnorm.build import has_own_small_call, key_funcs
    from tvmnorm.sched.default import fwd_cuda_heuristic, small_call_cuda_heuristic
    rule, got = fwd_cuda_heuristic(hidden, elem_bytes), small_call_cuda_heuristic(hidden, elem_bytes)
    if small is None:
        assert got == rule
    else:
        assert (got.threads, got.rows, got.vec, got.early_weights, got.warp_sums, got.shuffle_sums) == small
        assert got.keep_row
        assert got.threads * got.vec <= hidden  # no idle thread
        if rule.rows > 1:
            assert got.threads == 2 * rule.threads and got.threads * got.rows == rule.threads * rule.rows
    dt = {2: "bf16", 4: "fp32"}[elem_bytes]
    key = NormKey(norm="layernorm", itype=dt, wtype=dt, otype=dt, hidden_size=hidden)
    assert has_own_small_call(key, "cuda") == (small is not None)
    assert not has_own_small_call(key, "llvm") and not has_own_small_call(dataclasses.replace(key, stage="bwd"), "cuda")
    symbols = key_funcs(key, "cuda")
    assert (f"{key.name}_small_fwd" in symbols) == (small is not None)
    if small is not None:
        src = generated_cuda({f"{key.name}_small_fwd": symbols[f"{key.name}_small_fwd"]})
        body = kernel(src, "small_fwd")
        assert f"__launch_bounds__({got.threads * got.rows})" in src
        assert got.vec == 1 or f"threadIdx.x) * {got.vec}" in body
        assert ("threadIdx.z" in body) == got.warp_sums
        if got.shuffle_sums:  # five more shuffles for each of layernorm's two row sums than without
            alone = kernel(cuda_source(key, dataclasses.replace(got, shuffle_sums=False)), "fwd")
            assert body.count("__shfl_down_sync") == alone.count("__shfl_down_sync") + 10
        if got.threads >= 64:  # sub-warp rows sum by shuffles alone: no barrier to load before
            barrier = body.index("__syncthreads")
            loads = [re.search(rf"\b{w}_ptr\b", body).start() for w in ("gamma", "beta")]
            assert all((at < barrier) == got.early_weights for at in loads)


@pytest.mark.parametrize("hidden", [1024, 7168])
def test_decode_probe_times_the_served_small_call_kernel_beside_its_neighbours(bench_script, hidden):
    """bench/decode_probe.py --around-served: the first point is the kernel a library serves
    decode forwards with (small_call_cuda_heuristic's), and each other point moves it by the
    knobs that rule leaves off (weights loaded with x, one barrier a row sum, threads, vector
    width), one row a block, every one a distinct kernel that TVM schedules for CUDA."""
    from tvmnorm.sched.default import small_call_cuda_heuristic
    from tvmnorm.sched.rows import warp_sums_problem
    key = NormKey(norm="layernorm", hidden_size=hidden)
    points = bench_script("decode_probe").around_served(key)
    served = small_call_cuda_heuristic(hidden, 2)
    assert points["served"] == served and len(points) == len(set(points.values())) > 8
    assert any(c.early_weights for c in points.values()) and any(c.warp_sums for c in points.values())
    if hidden == 7168:  # whole warps beyond the powers of two that split the row evenly come too
        assert {448, 896} <= {c.threads for c in points.values() if c.warp_sums and c.vec == 4}
    bodies = set()
    for name, cfg in points.items():
        assert cfg.keep_row and cfg.rows == 1 and served.threads // 2 <= cfg.threads <= 2 * served.threads, name
        assert not cfg.warp_sums or warp_sums_problem(cfg.threads, 1, cfg.vec, hidden) is None, name
        bodies.add(kernel(cuda_source(key, cfg), "fwd"))
    assert len(bodies) == len(points)


@pytest.mark.parametrize("hidden", [128, 1000, 2560, 8192])
def test_decode_probe_times_the_small_call_rule_against_its_knobs(bench_script, hidden):
    """bench/decode_probe.py --rule-knobs: the served kernel (small_call_cuda_heuristic's), the
    rule with each knob of RULE_KNOBS moved alone, and the key's default forward (what served
    decode rows before), each a distinct kernel once; where rows share a block (128) the knobs
    move nothing, and the forward is the one other point."""
    from tvmnorm.sched.default import fwd_cuda_heuristic, small_call_cuda_heuristic
    probe = bench_script("decode_probe")
    key = NormKey(norm="layernorm", hidden_size=hidden)
    points = probe.rule_knobs(key)
    assert points["served"] == small_call_cuda_heuristic(hidden, 2)
    assert len(points) == len(set(points.values()))
    for name, cfg in points.items():
        want = (fwd_cuda_heuristic(hidden, 2) if name == "forward" else
                small_call_cuda_heuristic(hidden, 2, **probe.RULE_KNOBS.get(name, {})))
        assert cfg == want, name
    if hidden == 128:
        assert set(points) == {"served", "forward"}
    else:
        assert {"+ew", "v16B"} <= set(points) and ("-ws" in points) == points["served"].warp_sums
        # the warps' sums by shuffles wherever they are the warps' (one barrier a row sum): the
        # rule's own from SMALL_CALL_SHUFFLE_WARPS warps up (8192's 32), the knobs' at every count
        served = points["served"]
        assert served.warp_sums == (hidden != 1000) and served.shuffle_sums == (hidden == 8192)
        assert ("+shfl" in points) == (served.warp_sums and not served.shuffle_sums)
        assert ("-shfl" in points) == served.shuffle_sums
    bodies = {kernel(cuda_source(key, cfg), "fwd") for cfg in points.values()}
    assert len(bodies) == len(points)


def test_early_weights_are_a_kept_forward_schedule():
    from tvmnorm.build import scheduled_funcs
    from tvmnorm.sched.rows import CudaRowConfig
    with pytest.raises(ValueError, match="early_weights needs keep_row"):
        CudaRowConfig(threads=256, vec=8, early_weights=True)
    with pytest.raises(ValueError, match="forward schedules"):
        scheduled_funcs(NormKey(stage="bwd", hidden_size=1024), "cuda",
                        row_config=CudaRowConfig(threads=128, vec=8, keep_row=True, early_weights=True))


@pytest.mark.parametrize("norm,stage,dtype,hidden,cfg", [
    ("layernorm", "bwd", "bf16", 8192, dict(threads=512, vec=8, prefetch=2, full_chunks=1)),
    ("rmsnorm", "bwd", "bf16", 1000, dict(threads=64, rows=2, vec=8, prefetch=4)),
    ("layernorm", "bwd_add", "fp32", 4095, dict(threads=1024, vec=1, prefetch=2, stages=2)),
    ("rmsnorm", "bwd", "bf16", 4096, dict(threads=256, vec=8, prefetch=2, min_blocks=2))])
def test_chunk_weights_load_gamma_once_a_chunk(norm, stage, dtype, hidden, cfg):
    """chunk_weights: the dx kernel loads gamma into registers once, before the walk over its
    chunk's rows, and no stage of any row loads it again; the loads of a column tail (1000,
    4095) keep their guard. Without it every row's sums and dx stage load it."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    for once in (False, True):
        body = kernel(cuda_source(key, row_config=CudaRowConfig(chunk_weights=once, **cfg)), "dx")
        walk = body.index("for (")
        loads = [m.start() for m in re.finditer(r"\bgamma_ptr[ +\[]", body)]
        assert loads and all((at < walk) == once for at in loads), (once, loads, walk)
        if once:
            assert len(loads) == -(-hidden // (cfg["threads"] * cfg["vec"]))  # one a vector of the thread
            if hidden % (cfg["threads"] * cfg["vec"]):
                assert re.search(r"if \(\(\(int(64_t)?\)threadIdx\.x\) < (\(int64_t\))?\d+\) \{\s*\S*gamma_local_ptr",
                                 body[:walk])


def test_chunk_weights_are_a_dx_schedule():
    from tvmnorm.build import scheduled_funcs
    from tvmnorm.sched.rows import CudaRowConfig
    with pytest.raises(ValueError, match="chunk_weights is a dx schedule"):
        scheduled_funcs(NormKey(hidden_size=1024), "cuda", row_config=CudaRowConfig(threads=128, vec=8,
                                                                                   chunk_weights=True))


@pytest.mark.parametrize("norm,otype,hidden,threads,vec", [
    ("layernorm", "bf16", 8192, 1024, 4), ("rmsnorm", "fp8e4m3", 8192, 1024, 8),
    ("layernorm", "fp8e4m3", 16384, 1024, 8), ("layernorm", "bf16", 2560, 320, 4), ("rmsnorm", "bf16", 7168, 896, 4)])
def test_shuffle_sums_add_the_warps_sums_by_shuffles(norm, otype, hidden, threads, vec):
    """shuffle_sums: after the one barrier a row sum (warp_sums), lane w of every warp reads warp
    w's sum from shared memory and the warp adds them by five shuffles, instead of every thread
    reading and adding all of them (an unrolled chain of up to 32 adds a thread, as many times
    the shared-memory reads as warps); with fewer than 32 warps the lanes past the last one are
    guarded out (they would read beyond the sums). The barriers stay one a row sum (fp8's amax
    fold its own)."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, otype=otype, hidden_size=hidden)
    base = CudaRowConfig(threads=threads, vec=vec, keep_row=True, keep_y=otype != "bf16", warp_sums=True)
    sums = ("sum", "varsum") if norm == "layernorm" else ("sumsq",)
    sums += ("amax_row",) * (otype != "bf16")
    before = kernel(cuda_source(key, row_config=base), "fwd")
    after = kernel(cuda_source(key, row_config=dataclasses.replace(base, shuffle_sums=True)), "fwd")
    for s in sums:
        lane_read = rf"\b{s}_rf_shared_ptr\[\(\((int|int64_t)\)threadIdx\.x\)\]"
        assert re.search(lane_read, after) and not re.search(lane_read, before), s
    assert after.count("__syncthreads") == before.count("__syncthreads")
    assert after.count("__shfl_down_sync") == before.count("__shfl_down_sync") + 5 * len(sums)
    assert "for (int ax0" in before and "for (int ax0" not in after
    guards = re.findall(r"if \(\(\((int|int64_t)\)threadIdx\.x\) < \(?(?:\(int64_t\))?(\d+)\)?\) \{", after)
    assert [int(n) for _, n in guards] == ([threads // 32] * len(sums) if threads < 1024 else []), guards


def test_warp_sums_apply_where_they_can():
    from tvmnorm.build import scheduled_funcs
    from tvmnorm.sched.rows import CudaRowConfig
    with pytest.raises(ValueError, match="shuffle_sums needs warp_sums"):
        CudaRowConfig(threads=1024, vec=4, shuffle_sums=True)
    with pytest.raises(ValueError, match="2 or more whole warps"):
        CudaRowConfig(threads=48, warp_sums=True)
    with pytest.raises(ValueError, match="2 or more whole warps"):
        CudaRowConfig(threads=32, warp_sums=True)
    with pytest.raises(ValueError, match="one row per block"):
        CudaRowConfig(threads=64, rows=2, warp_sums=True)
    with pytest.raises(ValueError, match="split evenly"):
        scheduled_funcs(NormKey(hidden_size=1000), "cuda", row_config=CudaRowConfig(threads=64, vec=4, warp_sums=True))
    with pytest.raises(ValueError, match="forward schedule"):
        scheduled_funcs(NormKey(stage="bwd", hidden_size=1024), "cuda",
                        row_config=CudaRowConfig(threads=64, vec=8, warp_sums=True))


def test_full_chunks_is_a_switch():
    from tvmnorm.sched.rows import CpuRowConfig, CudaRowConfig
    for cls in (CudaRowConfig, CpuRowConfig):
        with pytest.raises(ValueError, match="full_chunks must be 0 or 1, got 2"):
            cls(full_chunks=2)


def test_min_blocks_must_be_a_count_of_blocks():
    from tvmnorm.sched.rows import CudaRowConfig
    with pytest.raises(ValueError, match="min_blocks must be 1..32"):
        CudaRowConfig(threads=128, min_blocks=0)


@pytest.mark.parametrize("norm,otype,hidden,threads,vec", [
    ("rmsnorm", "bf16", 8192, 512, 8), ("layernorm", "bf16", 1000, 32, 8), ("rmsnorm", "fp8e4m3", 128, 16, 8),
    ("layernorm", "fp8e4m3", 4095, 1024, 1)])
def test_fwd_kept_row_reads_x_once(norm, otype, hidden, threads, vec):
    """With keep_row every element of x is loaded once, into registers indexed by constants,
    and the reductions, the output (and fp8's amax) read it there; without it each stage loads
    x again."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, otype=otype, hidden_size=hidden)
    vectors = -(-hidden // (threads * vec))
    bodies = {}
    for keep in (True, False):
        cfg = CudaRowConfig(threads=threads, rows=max(1, 128 // threads), vec=vec, keep_row=keep)
        bodies[keep] = kernel(cuda_source(key, row_config=cfg), "fwd")
    loads = lambda body: len(re.findall(r"= \*?(\(\w+\*\))?\(?x_ptr[\[ +]", body))  # noqa: E731
    assert loads(bodies[True]) == vectors
    stages = 3 if norm == "layernorm" else 2  # the reductions and y (fp8's amax reads y's registers)
    assert loads(bodies[False]) >= stages * vectors
    assert re.search(rf" x_local_ptr\[{vectors * vec}\];", bodies[True])
    indices = re.findall(r"\bx_local_ptr\[([^\]]*)\]", bodies[True])[1:]
    assert all(re.fullmatch(r"(\(int64_t\))?\d+", i) for i in indices), indices[:4]


@pytest.mark.parametrize("norm,otype,hidden,threads,rows,vec", [
    ("rmsnorm", "bf16", 4096, 512, 1, 8), ("layernorm", "bf16", 1000, 32, 4, 8), ("rmsnorm", "fp8e4m3", 128, 16, 8, 8),
    ("layernorm", "bf16", 4095, 1024, 1, 1)])
def test_fwd_add_reads_x_and_residual_once_and_stores_h_per_row(norm, otype, hidden, threads, rows, vec):
    """fwd_add with the row kept: x and the residual are each loaded once, h = x + residual is
    added once into per-thread registers (constant indices) that the sums, y and h's store read,
    and h is stored once. Without it, x and residual are loaded by each stage, but h is still
    stored once, by the thread and row that computed it: a store of h under the row loop without
    the row's own loops (reverse_compute_at's placement, for a block outside the anchor's chain)
    wrote every row of the call under each row."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage="fwd_add", otype=otype, hidden_size=hidden)
    vectors = -(-hidden // (threads * vec))
    loads = lambda body, name: len(re.findall(rf"= \*?(\(\w+\*\))?\(?{name}_ptr[\[ +]", body))  # noqa: E731
    stores = lambda body: len(re.findall(r"\bh_ptr[\[ +][^=;]*\]? = |\*\(\w+\*\)\(h_ptr[^;]*\) = ", body))  # noqa: E731
    for keep in (True, False):
        cfg = CudaRowConfig(threads=threads, rows=rows, vec=vec, keep_row=keep)
        body = kernel(cuda_source(key, row_config=cfg), "fwd")
        assert stores(body) == vectors, (keep, stores(body))
        assert not re.search(r"for \([^;]*; [^;]*< n\b", body), "a loop over every row of the call"
        if keep:
            assert loads(body, "x") == loads(body, "residual") == vectors
            assert re.search(rf" h_sum_local_ptr\[{vectors * vec}\];", body)
            indices = re.findall(r"\bh_sum_local_ptr\[([^\]]*)\]", body)[1:]
            assert all(re.fullmatch(r"(\(int64_t\))?\d+", i) for i in indices), indices[:4]
        else:
            assert loads(body, "x") >= 2 * vectors and "h_sum" not in body


@pytest.mark.parametrize("norm,hidden,threads,vec", [("layernorm", 7168, 256, 4), ("rmsnorm", 1000, 32, 8),
                                                     ("layernorm", 4095, 1024, 1)])
def test_fp8_fwd_keeps_y_in_registers(norm, hidden, threads, vec):
    """With keep_y the fp8 forward computes y once into per-thread registers (constant indices)
    that the store and amax read: gamma (and beta) are loaded once per element, not again for
    amax's recomputed y; without it (the stage inlined) y is computed twice."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, otype="fp8e4m3", hidden_size=hidden)
    per_thread = -(-hidden // (threads * vec)) * vec
    bodies = {keep_y: kernel(cuda_source(key, CudaRowConfig(threads=threads, rows=max(1, 128 // threads), vec=vec,
                                                             keep_row=True, keep_y=keep_y)), "fwd")
              for keep_y in (True, False)}
    gamma_loads = lambda body: len(re.findall(r"\bgamma_ptr\b", body))  # noqa: E731
    assert gamma_loads(bodies[True]) == per_thread // vec  # vector loads (sched.rows._vector_io)
    assert gamma_loads(bodies[False]) == 2 * per_thread // vec
    assert re.search(rf" y_unscaled_local_ptr\[{per_thread}\];", bodies[True])
    indices = re.findall(r"\by_unscaled_local_ptr\[([^\]]*)\]", bodies[True])[1:]
    assert indices and all(re.fullmatch(r"(\(int64_t\))?\d+", i) for i in indices), indices[:4]
    assert "y_unscaled" not in bodies[False]


@pytest.mark.parametrize("keep_y", (True, False), ids=("kept-y", "recomputed-y"))
@pytest.mark.parametrize("norm,otype,hidden,threads,vec", [("layernorm", "fp8e4m3", 8192, 256, 4),
                                                            ("rmsnorm", "fp8e5m2", 1000, 32, 8),
                                                            ("layernorm", "fp8e4m3", 4095, 1024, 1)])
def test_fp8_fwd_casts_pairs_without_a_written_clamp(norm, otype, hidden, threads, vec, keep_y):
    """CUDA's fp8 forward leaves saturation to the hardware cast (satfinite: no min/max with the
    format's largest value, which also turned NaN into it) and, with an even vector, converts
    two columns per cast (float2 -> fp8x2), whether y is kept in registers (keep_y) or
    recomputed by the store (then from x loaded again, its fp32 math on float2 pairs);
    unpaired (paired_cast off) or with odd vectors, one column per cast."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, otype=otype, hidden_size=hidden)
    pair_type = "__nv_fp8x2_" + ("e4m3" if otype == "fp8e4m3" else "e5m2")
    one_type = "__nv_fp8_" + ("e4m3" if otype == "fp8e4m3" else "e5m2")
    per_thread = -(-hidden // (threads * vec)) * vec
    cfg = CudaRowConfig(threads=threads, rows=max(1, 128 // threads), vec=vec, keep_row=keep_y, keep_y=keep_y)
    bodies = {paired: kernel(cuda_source(key, dataclasses.replace(cfg, paired_cast=paired)), "fwd")
              for paired in (True, False)}
    for body in bodies.values():
        assert "448" not in body and "57344" not in body and not re.search(r"\bmin\(", body)
    casts = lambda body, t: len(re.findall(rf"= \(?\({t}\)\(", body))  # noqa: E731
    assert casts(bodies[True], pair_type) == (per_thread // 2 if vec % 2 == 0 else 0)
    assert casts(bodies[True], one_type) == (0 if vec % 2 == 0 else per_thread)
    assert casts(bodies[False], pair_type) == 0
    assert casts(bodies[False], one_type) == per_thread


@pytest.mark.parametrize("key", [NormKey(norm="layernorm", stage="bwd", hidden_size=2048),
                                 NormKey(stage="bwd", hidden_size=4096), NormKey(norm="layernorm", hidden_size=4096)],
                         ids=lambda k: k.name)
def test_row_kernels_load_weights_in_vectors_and_row_statistics_once(key):
    """gamma and beta are read in vectors as wide as x's (one scalar load per element and stage
    was most of dx's load instructions), and dx reads each row's mu and rsigma once for all its
    stages, not once per element (once per copy of the walk: full_chunks, LayerNorm's default,
    writes it twice)."""
    from tvmnorm.compute import kernel_funcs
    from tvmnorm.sched.default import fused_cuda_heuristic
    part = "fwd" if key.stage == "fwd" else "dx"
    body = kernel(cuda_source(key), part)
    for w in ("gamma", "beta") if key.norm == "layernorm" and part == "fwd" else ("gamma",):
        loads = re.findall(rf"(\*\(\w+\*\)\()?\b{w}_ptr\b", body)
        assert loads and all(loads), f"{w} is read with scalar loads"
    if part == "dx":
        cfg = fused_cuda_heuristic(kernel_funcs(key, "cuda")["dx"], key.hidden_size, 2)
        # the staged walk is software-pipelined: a group's statistics are read where its copy
        # lands, in the loop and in the last groups' epilogue
        copies = cfg.prefetch * (1 + cfg.full_chunks) * (2 if cfg.staged else 1)
        for stat in ("mu", "rsigma") if key.norm == "layernorm" else ("rsigma",):
            n = len(re.findall(rf"\b{stat}_ptr\[", body))
            assert (0 < n <= copies) if cfg.staged else n == copies, (stat, n)


def test_keep_y_needs_keep_row():
    from tvmnorm.sched.rows import CudaRowConfig
    with pytest.raises(ValueError, match="keep_y needs keep_row"):
        CudaRowConfig(threads=128, keep_y=True)


def test_unroll_by_unrolls_a_loop_that_many_times_with_a_tail():
    """_tvm.UNROLL_BY = k turns a loop of n iterations into a rolled loop over k copies of its
    body and n % k copies after it (the pipelined dx walk needs it; TVM has no partial unroll):
    seen in the generated code, and the values stay right (llvm)."""
    import numpy as np
    import torch

    from tvmnorm._tvm import UNROLL_BY, Schedule, _unroll_annotated, compile_module, target, te
    from tvmnorm.targets import target_spec
    a = te.placeholder((7,), "float32", name="a")
    b = te.compute((7,), lambda i: a[i] * 2.0 + i.astype("float32"), name="b")
    sch = Schedule(te.create_prim_func([a, b]))
    (loop,) = sch.get_loops(sch.get_sblock("b"))
    sch.annotate(loop, UNROLL_BY, 3)
    ex = compile_module(sch.mod, target(target_spec("llvm")))
    x = torch.arange(7, dtype=torch.float32) * 0.5
    y = torch.full((7,), float("nan"))
    ex["main"](x, y)
    np.testing.assert_array_equal(y.numpy(), x.numpy() * 2 + np.arange(7))
    script = _unroll_annotated(sch.mod).script()
    assert re.search(r"for i_o in range\(2\)", script), script
    assert script.count('T.sblock("b")') == 4, script  # 3 copies in the loop, 1 after it


@pytest.mark.parametrize("norm,hidden,prefetch", [("rmsnorm", 256, 4), ("rmsnorm", 5120, 1), ("rmsnorm", 8192, 1),
                                                  ("layernorm", 8192, 2), ("rmsnorm", 128, 2)])
def test_default_dx_rows_per_group(norm, hidden, prefetch):
    """The default dx (where it does not stage its rows) loads as many rows at once as leave its
    blocks room: RMSNorm with blocks of 512 threads (hidden above 4096) one row, so two blocks
    fit an SM (measured faster on the H200), narrower RMSNorm rows 4, LayerNorm (two sums per
    element) 2, 8-row blocks 2."""
    from tvmnorm.compute import kernel_funcs
    from tvmnorm.sched.default import fused_cuda_heuristic
    func = kernel_funcs(NormKey(norm=norm, stage="bwd", hidden_size=hidden), "cuda")["dx"]
    cfg = fused_cuda_heuristic(func, hidden, 2)
    assert not cfg.staged and cfg.prefetch == prefetch


@pytest.mark.parametrize("norm,dtype,hidden,prefetch", [
    ("rmsnorm", "bf16", 512, 2), ("layernorm", "bf16", 1000, 2), ("layernorm", "bf16", 1024, 2),
    ("rmsnorm", "bf16", 1536, 1), ("layernorm", "bf16", 4096, 1), ("rmsnorm", "fp16", 2560, 1),
    ("layernorm", "fp32", 256, 2), ("rmsnorm", "fp32", 2048, 1), ("layernorm", "bf16/fp32/bf16", 1000, 2),
    ("layernorm", "bf16", 128, 0), ("rmsnorm", "bf16", 256, 0), ("rmsnorm", "bf16", 5120, 0),
    ("layernorm", "fp32", 4096, 0), ("rmsnorm", "bf16", 4095, 0), ("layernorm", "bf16", 1022, 0),
    ("rmsnorm", "bf16/fp32/fp32", 1000, 0), ("layernorm", "bf16/bf16/fp32", 2048, 0)])
def test_default_dx_stages_rows_of_1_to_8_kb(norm, dtype, hidden, prefetch):
    """The default dx stages its rows in shared memory (two groups in flight, over full chunks,
    one chunk lane a block) where the row is 1-8 KB in 16-byte vectors: two rows a group up to
    2 KB, one above; prefetch 0 here: not staged (rows under 1 KB or over 8 KB, 2- and 4-byte
    vectors at hidden 4095 and 1022, and dy of fp32 (otype) beside x of bf16, whose copies
    would need vectors of two widths). Mixed types are itype/wtype/otype; every key's default
    CUDA builds."""
    from tvmnorm.compute import kernel_funcs
    from tvmnorm.key import DTYPE_BYTES
    from tvmnorm.sched.default import fused_cuda_heuristic
    from tvmnorm.sched.rows import STAGED_SHARED_BYTES, staged_shared_bytes
    itype, wtype, otype = (dtype.split("/") * 3)[:3]  # "bf16" is bf16/bf16/bf16
    key = NormKey(norm=norm, stage="bwd", hidden_size=hidden, itype=itype, wtype=wtype, otype=otype)
    size = DTYPE_BYTES[itype]
    cfg = fused_cuda_heuristic(kernel_funcs(key, "cuda")["dx"], hidden, size)
    assert cfg.staged == bool(prefetch)
    if prefetch:
        assert (cfg.prefetch, cfg.stages, cfg.rows, cfg.full_chunks) == (prefetch, 2, 1, 1)
        assert staged_shared_bytes(hidden, size, cfg.prefetch, cfg.stages) <= STAGED_SHARED_BYTES
    assert ("ptx_cp_async" in kernel(cuda_source(key), "dx")) == bool(prefetch)


def test_cp_async_takes_int64_offsets_in_int64_kernels():
    """TVM declares its cp.async helper with an int global offset; _tvm's CUDA hook makes it a
    template over the offset's type, so the int64 row kernel of the staged dx (calls past 2^31
    elements) passes its offsets whole (they wrapped: an illegal address on the H200), and the
    int32 kernel instantiates it with int, the code it had."""
    from tvmnorm._tvm import _cp_async_wide_offsets
    key = NormKey(stage="bwd", hidden_size=4096)
    wide = cuda_source(key)
    narrow = generated_cuda(scheduled_funcs(key, "cuda", row_bits=32))
    for src in (wide, narrow):
        helpers = re.findall(r"(?:template <typename SrcOff> )?__forceinline__ __device__ void ptx_cp_async\w*\([^)]*\)", src)
        assert helpers and all(h.startswith("template <typename SrcOff>") and h.endswith("SrcOff src_off)")
                               for h in helpers), helpers
    calls = re.findall(r"ptx_cp_async_legacy\w*\(dy_shared_ptr, [^;]*dy_ptr, \(+\(\(int64_t\)blockIdx\.x\)", wide)
    assert calls, "the int64 kernel's copies index dy by an int64 expression"
    original = ("__forceinline__ __device__ void ptx_cp_async_legacy_cg_16_2_2(void* dst, int dst_off, void* src, "
                "int src_off) {")
    assert _cp_async_wide_offsets(original).startswith("template <typename SrcOff> ")
    assert "SrcOff src_off" in _cp_async_wide_offsets(original)


@pytest.mark.parametrize("norm,dtype,hidden,once", [("layernorm", "bf16", 8192, True), ("rmsnorm", "bf16", 2560, True),
                                                    ("rmsnorm", "bf16", 128, True), ("layernorm", "fp32", 8192, False),
                                                    ("rmsnorm", "bf16", 65536, False)])
def test_default_dx_holds_gamma_where_it_fits(norm, dtype, hidden, once):
    """The default dx holds gamma for the whole chunk (chunk_weights: faster or equal at 22 of 24
    bf16 widths on the H200) unless its registers would not fit beside the sums and rows (fp32
    rows of 8192 over 1024 threads, rows too wide for any variant to fit), and its kernel then
    loads gamma before the walk over the chunk's rows."""
    from tvmnorm.compute import kernel_funcs
    from tvmnorm.sched.default import fused_cuda_heuristic
    from tvmnorm.sched.space import fused_register_limit, fused_registers
    key = NormKey(norm=norm, stage="bwd", itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    size = 4 if dtype == "fp32" else 2
    cfg = fused_cuda_heuristic(kernel_funcs(key, "cuda")["dx"], hidden, size)
    assert cfg.chunk_weights == once
    per_thread = -(-hidden // (cfg.threads * cfg.vec)) * cfg.vec
    regs = fused_registers(key.column_sums, per_thread, cfg.prefetch, size, weight_bytes=size)
    assert (regs <= fused_register_limit(cfg.threads * cfg.rows, cap=96)) == once
    if hidden <= 8192:
        body = kernel(cuda_source(key), "dx")
        assert (body.index("gamma_ptr") < body.index("for (")) == once


def test_even_split_dx_has_no_column_guard():
    """448 threads x 2 vectors of 8 (a variant of exact_thread_counts) cover a row of 7168
    exactly: the generated dx has no per-thread column guard, which the power-of-two split (512:
    threadIdx.x < 384 on the last step) needs, and its allreduce spans 14 warps."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm="layernorm", stage="bwd", hidden_size=7168)
    src = cuda_source(key, CudaRowConfig(threads=448, rows=1, vec=8, prefetch=2))
    assert "__launch_bounds__(448)" in src and "red_buf_staging_ptr[14]" in src
    def guards(body):  # thread guards of 32 or more (the allreduce's second stage guards lanes of a warp)
        return {int(v) for v in re.findall(r"\(\(int64_t\)threadIdx\.x\) < \(int64_t\)(\d+)", body)} - set(range(32))
    assert guards(kernel(src, "dx")) == set()
    assert guards(kernel(cuda_source(key, CudaRowConfig(threads=512, rows=1, vec=8, prefetch=2)), "dx")) == {384}


@pytest.mark.parametrize("hidden,elem_bytes,threads,rows,vec,keep", [
    (128, 2, 8, 16, 8, True),        # short rows: 16-byte vectors, 2 a thread, 16 rows a block
    (1024, 2, 128, 1, 4, True),      # 8-byte vectors, 128 threads at least
    (4096, 2, 128, 1, 4, True),
    (7168, 2, 256, 1, 4, True),      # ~8 vectors a thread
    (4095, 2, 512, 1, 1, True),      # odd: scalar, predicated tail
    (65536, 2, 1024, 1, 4, True),    # 16 vectors of 8 bytes: 32 registers
    (65536, 4, 1024, 1, 4, False)])  # fp32 would need 64 registers: x loaded by each stage
def test_default_fwd_keeps_the_row_where_it_fits(hidden, elem_bytes, threads, rows, vec, keep):
    """The default forward (fwd_cuda_heuristic) keeps its row of x in registers with the
    thread counts and vector widths measured fastest on the H200, unless the row would take
    more than KEPT_ROW_BYTES of a thread's registers."""
    from tvmnorm.sched.default import KEPT_ROW_BYTES, fwd_cuda_heuristic
    cfg = fwd_cuda_heuristic(hidden, elem_bytes)
    assert (cfg.threads, cfg.rows, cfg.vec, cfg.keep_row) == (threads, rows, vec, keep)
    if keep:
        assert -(-hidden // (cfg.threads * cfg.vec)) * cfg.vec * elem_bytes <= KEPT_ROW_BYTES


@pytest.mark.parametrize("hidden", [1, 2, 3, 7, 8, 16, 1000, 4095])
@pytest.mark.parametrize("otype", ["bf16", "fp8e4m3"])
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_default_fwd_builds_for_narrow_and_odd_rows(norm, otype, hidden):
    """The default forward compiles at every narrow or odd width (keeping the row with idle
    threads failed to build for layernorm at hidden 1), and so does every kept variant of the
    space there."""
    from tvmnorm.sched.space import fwd_kept_variants
    key = NormKey(norm=norm, otype=otype, hidden_size=hidden)
    assert "fwd_kernel" in cuda_source(key)
    for kept in fwd_kept_variants(key):
        cuda_source(key, row_config=kept.config(1 if kept.warp_sums else max(1, 128 // kept.threads)))


@pytest.mark.parametrize("key", [NormKey(norm="layernorm", stage="bwd", hidden_size=2048),
                                 NormKey(hidden_size=7168), NormKey(norm="layernorm", otype="fp8e4m3", hidden_size=4096),
                                 NormKey(hidden_size=128)],
                         ids=lambda k: k.name)
@pytest.mark.parametrize("tuned", [False, True], ids=["default", "record"])
def test_library_row_kernels_come_in_both_index_widths(key, tuned):
    """A CUDA library holds each key's row kernel twice (build.key_funcs): with int32 index math
    throughout under <key>_narrow_<part>, as a static-row tuning candidate compiles after
    NarrowDataType (the kernel the tuner measured), and with int64 under <key>_<part>, for calls
    past int32 offsets. A committed record replays on both; a tuned forward's small-call kernel
    and a backward's dx at shorter chunks and its decode backward are int32 too."""
    from tvmnorm.build import decode_parts, has_own_small_call, key_funcs
    from tvmnorm.tune import load_records
    record = load_records("cuda").get(key.pack()) if tuned else None
    if tuned:
        assert record, f"no committed record for {key.name}"
    part = "fwd" if key.stage == "fwd" else "dx"
    src = generated_cuda(key_funcs(key, "cuda", record))

    def body(symbol):
        start = re.search(rf"__global__ void (__launch_bounds__\(\d+(, \d+)?\) )?{symbol}_kernel\([^)]*\) {{", src)
        assert start, f"no kernel {symbol}"
        return src[start.end():src.index("\n}\n", start.end())]

    def wide(text):  # int64 index math; an L2 cache policy (stream 3) is a uint64_t of its own
        return re.search(r"\bint64_t\b", text)
    assert not wide(body(f"{key.name}_narrow_{part}"))
    assert wide(body(f"{key.name}_{part}"))
    if key.stage == "fwd" and (tuned or has_own_small_call(key, "cuda")):
        assert not wide(body(f"{key.name}_small_fwd"))
    else:
        assert f"{key.name}_small_fwd" not in src
    if key.stage != "fwd":  # the dx at shorter chunks, for small calls (build.small_dx_funcs)
        assert not wide(body(f"{key.name}_small8_dx")) and f"{key.name}_small1_dx" not in src
        # and the decode backward (build.decode_funcs)
        for part in decode_parts(key):
            assert not wide(body(f"{key.name}_decode_{part}"))


def _versioned(func):
    from tvmnorm._tvm import IRModule, _full_chunks
    out = _full_chunks(IRModule({"main": func}))["main"]
    return out.script()


def test_full_chunk_versions_a_walk_whose_guards_grow_with_its_loops():
    """_tvm.FULL_CHUNK on a hand-written walk: the unguarded copy under the test of the largest
    row any guard admits, every row guard dropped there (also as one term of an and, whose other
    terms stay), the guarded loop in the else branch; a guard whose row shrinks as a loop grows
    leaves the walk as it is (its largest row is not at the loops' ends), and so does a row
    index that is not an affine sum of the loops (here a cast of an int32 loop)."""
    from tvm.script import tirx as T

    @T.prim_func(private=True)
    def grows(a: T.handle, b: T.handle):
        n = T.int64()
        A = T.match_buffer(a, (n,), "float32")
        B = T.match_buffer(b, (n,), "float32")
        for q in range((n + 7) // 8):
            for t in T.serial(T.int64(4), annotations={"tvmnorm.full_chunk": 1}):
                for u in range(T.int64(2)):
                    if q * 8 + t * 2 + u < n:
                        B[q * 8 + t * 2 + u] = A[q * 8 + t * 2 + u] * T.float32(2)
                    if q * 8 + t * 2 + u < n and u < 1:
                        B[q * 8 + t * 2 + u] = B[q * 8 + t * 2 + u] + T.float32(1)

    @T.prim_func(private=True)
    def shrinks(a: T.handle, b: T.handle):
        n = T.int64()
        A = T.match_buffer(a, (n,), "float32")
        B = T.match_buffer(b, (n,), "float32")
        for q in range((n + 7) // 8):
            for t in T.serial(T.int64(8), annotations={"tvmnorm.full_chunk": 1}):
                if q * 8 + 7 - t < n:
                    B[q * 8 + 7 - t] = A[q * 8 + 7 - t]

    text = _versioned(grows)
    fast, slow = text.split("else:")
    assert re.search(r"if q \* T\.int64\(8\) \+ T\.int64\(7\) < n:", fast), text
    assert fast.count("< n") == 1 and "if u < T.int64(1):" in fast and "tvmnorm.full_chunk" not in text
    assert slow.count("< n") == 2
    text = _versioned(shrinks)
    assert "else:" not in text and text.count("< n") == 1 and "tvmnorm.full_chunk" not in text

    @T.prim_func(private=True)
    def cast(a: T.handle, b: T.handle):
        n = T.int64()
        A = T.match_buffer(a, (n,), "float32")
        B = T.match_buffer(b, (n,), "float32")
        for q in range((n + 7) // 8):
            for t in T.serial(8, annotations={"tvmnorm.full_chunk": 1}):
                if q * 8 + T.Cast("int64", t) < n:
                    B[q * 8 + T.Cast("int64", t)] = A[q * 8 + T.Cast("int64", t)]
    text = _versioned(cast)
    assert "else:" not in text and text.count("< n") == 1


def test_full_chunk_drops_the_guards_its_test_implies_and_keeps_the_rest():
    """The unguarded copy also drops a guard its test implies though it is no row guard: a chunk
    lane's ``q < ceil(n / 8)`` holds wherever the lane's last row is below n. The library's
    kernel kept such guards in its unguarded copy where a tuning candidate had none (its
    constant row count let TVM prove them): layernorm bwd 128's tuned candidate ran 108.6 us
    as the search built it and 144.3 in the library (the thirty-second lease). A guard the test
    does not imply (``2q < n / 8``), or one that grows false as n grows (``n - 8q < 100``), stays."""
    from tvm.script import tirx as T

    @T.prim_func(private=True)
    def lanes(a: T.handle, b: T.handle, p: T.handle):
        n = T.int64()
        A = T.match_buffer(a, (n,), "float32")
        B = T.match_buffer(b, (n,), "float32")
        P = T.match_buffer(p, ((n + 7) // 8,), "float32")
        for q in range((n + 7) // 8):
            for t in T.serial(T.int64(4), annotations={"tvmnorm.full_chunk": 1}):
                for u in range(T.int64(2)):
                    if q * 8 + t * 2 + u < n:
                        B[q * 8 + t * 2 + u] = A[q * 8 + t * 2 + u]
                if q < (n + 7) // 8:
                    P[q] = P[q] + T.float32(1)
                if q * 2 < n // 8:
                    P[q] = P[q] + T.float32(2)
                if n - q * 8 < 100:
                    P[q] = P[q] + T.float32(3)

    fast, slow = _versioned(lanes).split("else:")
    lane = "if q < (n + T.int64(7)) // T.int64(8):"
    assert lane not in fast and lane in slow
    for kept in ("if q * T.int64(2) < n // T.int64(8):", "if n - q * T.int64(8) < T.int64(100):"):
        assert kept in fast and kept in slow


def test_implied_guards_hold_wherever_the_test_does():
    """_tvm._implied_by against brute force: every term it calls implied by the walk's test
    (its last row q*8 + 7 below n) holds at every n, q and loop value the test admits, and the
    chunk lane's terms are among them (the decision is not simply never)."""
    from tvm import tirx
    from tvmnorm._tvm import _implied_by
    n, q, t, u = (tirx.Var(name, "int64") for name in ("n", "q", "t", "u"))
    loops = [tirx.For(v, tirx.const(0, "int64"), tirx.const(e, "int64"), tirx.ForKind.SERIAL, tirx.Evaluate(0))
             for v, e in ((t, 4), (u, 2))]
    c = lambda v: tirx.const(v, "int64")  # noqa: E731
    terms = {  # name -> (TIR term, the same in Python, whether it is implied)
        "lane": (q < tirx.floordiv(n + c(7), c(8)), lambda n, q, t, u: q < (n + 7) // 8, True),
        "lane_le": (q * c(8) + c(8) <= n, lambda n, q, t, u: q * 8 + 8 <= n, True),
        "floor": (q < tirx.floordiv(n, c(8)), lambda n, q, t, u: q < n // 8, True),
        "rest": (t < tirx.floordiv(n - q * c(8), c(2)), lambda n, q, t, u: t < (n - q * 8) // 2, True),
        "lane_min": (q * c(8) + t * c(2) < tirx.Min(n, tirx.floordiv(n + c(7), c(8)) * c(8)),
                     lambda n, q, t, u: q * 8 + t * 2 < min(n, (n + 7) // 8 * 8), True),
        "one_more": (q * c(8) + c(9) <= n, lambda n, q, t, u: q * 8 + 9 <= n, False),
        "half": (q * c(2) < tirx.floordiv(n, c(8)), lambda n, q, t, u: q * 2 < n // 8, False),
        "shrinks": (n - q * c(8) < c(100), lambda n, q, t, u: n - q * 8 < 100, False),
        "capped": (q < tirx.Min(tirx.floordiv(n + c(7), c(8)), c(5)), lambda n, q, t, u: q < min((n + 7) // 8, 5), False),
        "mod": (q < tirx.floormod(n, c(8)) + c(8), lambda n, q, t, u: q < n % 8 + 8, False),
    }
    implied = _implied_by([q * c(8) + c(7) < n], loops, [])
    for name, (term, holds, want) in terms.items():
        assert implied(term) == want, name
        if want:
            assert all(holds(nv, qv, tv, uv) for nv in range(1, 200) for qv in range(0, 25) if qv * 8 + 7 < nv
                       for tv in range(4) for uv in range(2)), name


@pytest.mark.parametrize("key,cfg,part,loads,stores", [
    (NormKey(hidden_size=7168), dict(threads=512, vec=4, keep_row=True), "fwd", 4, 4),
    (NormKey(norm="layernorm", hidden_size=128), dict(threads=16, rows=8, vec=8, keep_row=True, full_chunks=1), "fwd", 2, 2),
    (NormKey(norm="layernorm", otype="fp8e4m3", hidden_size=4096), dict(threads=512, vec=8, keep_row=True), "fwd", 1, 1),
    (NormKey(norm="layernorm", stage="bwd", hidden_size=8192), dict(threads=512, vec=4, prefetch=2, full_chunks=1), "dx", 32, 16),
    (NormKey(stage="bwd_add", hidden_size=1024), dict(threads=128, vec=8, prefetch=1, stages=2), "dx", 12, 4)],
    ids=lambda v: getattr(v, "name", None) or str(v))
def test_stream_loads_rows_evict_first_and_leaves_the_weights(key, cfg, part, loads, stores):
    """stream (_tvm.STREAM_LOADS): every 8- or 16-byte load of a row (x; the dx's dy and x, and
    bwd_add's dz) becomes ld.global.cs, and with 2 every such store of a row too (st.global.cs);
    with 3 the loads carry an L2 evict_last policy made by createpolicy and the stores stay plain; the weights keep plain vector loads (every
    row reads them), and 0 leaves the code as it was."""
    from tvmnorm.sched.rows import CudaRowConfig
    base = CudaRowConfig(**cfg)
    plain = kernel(cuda_source(key, row_config=base), part)
    assert "ptx_" not in plain
    for mode, want_st in ((1, 0), (2, stores)):
        src = cuda_source(key, row_config=dataclasses.replace(base, stream=mode))
        body = kernel(src, part)
        assert body.count("tvm_builtin_ptx_ld_vec_global_cs") == loads and body.count("tvm_builtin_ptx_st_vec_global_cs") == want_st
        assert not re.findall(r"= \*\(\w+\*\)\((x|dy|dz)_ptr", body), "a row loaded without the hint"
        assert len(re.findall(r"\(gamma_ptr", body)) == len(re.findall(r"\(gamma_ptr", plain)) > 0
        assert "ld.global.cs.v" in src
    body = kernel(src := cuda_source(key, row_config=dataclasses.replace(base, stream=3)), part)
    assert body.count("tvm_builtin_ptx_ld_vec_global_L2__cache_hint") == loads
    assert body.count("tvm_builtin_ptx_createpolicy_fractional_fractional_L2__evict_last_b64") == loads
    assert "_st_vec_global" not in body and not re.findall(r"= \*\(\w+\*\)\((x|dy|dz)_ptr", body)
    assert len(re.findall(r"\(gamma_ptr", body)) == len(re.findall(r"\(gamma_ptr", plain)) > 0
    assert "createpolicy.fractional.L2::evict_last.b64" in src and "ld.global.L2::cache_hint.v" in src


@pytest.mark.parametrize("hidden", [1, 4095, 65536])
@pytest.mark.parametrize("key", [NormKey(norm="layernorm"), NormKey(stage="bwd_add", itype="fp16", wtype="fp16",
                                                                    otype="fp16"),
                                 NormKey(norm="layernorm", otype="fp8e4m3"),
                                 NormKey(norm="layernorm", stage="bwd", zero_centered_gamma=True)],
                         ids=lambda k: k.name.split("_i")[0])
def test_full_chunks_and_stream_build_at_every_width(key, hidden):
    """The default rule's points with full_chunks and streaming loads and stores, at widths of
    one element, an odd one (scalar accesses: nothing to stream) and 65536, both index widths:
    they compile (the tuner samples both knobs on every key; a sweep of 198 keys through nvcc
    found no failure)."""
    from tvmnorm.compute import kernel_funcs
    from tvmnorm.sched.default import fused_cuda_heuristic, fwd_cuda_heuristic
    key = dataclasses.replace(key, hidden_size=hidden)
    part = "fwd" if key.stage == "fwd" else "dx"
    base = (fwd_cuda_heuristic(hidden, 2) if part == "fwd"
            else fused_cuda_heuristic(kernel_funcs(key, "cuda")["dx"], hidden, 2))
    cfg = dataclasses.replace(base, rows=max(2, base.rows) if part == "fwd" and base.threads <= 512 else base.rows,
                              full_chunks=1, stream=2)
    for bits in (64, 32):
        src = generated_cuda(scheduled_funcs(key, "cuda", row_config=cfg, row_bits=bits, parts=[part]))
        assert f"_{part}_kernel" in src
        assert ("ld.global.cs" in src) == (hidden % 4 == 0 and hidden >= 4)


@pytest.mark.parametrize("key,cfg,want", [
    (NormKey(hidden_size=7168), dict(threads=512, vec=8), ["last"] * 2 + ["first"] * 2),
    (NormKey(norm="layernorm", hidden_size=4096), dict(threads=512, vec=8), ["last", "last", "first"]),
    (NormKey(hidden_size=7168), dict(threads=256, vec=8, keep_row=True), ["last"] * 4),
    (NormKey(norm="layernorm", stage="bwd", hidden_size=1024), dict(threads=128, vec=8, prefetch=1), None)],
    ids=lambda v: getattr(v, "name", None) or str(v))
def test_stream_4_reads_a_row_evict_last_until_its_last_read(key, cfg, want):
    """stream 4 (torch.compile's pair): a row that the kernel reads in several stages (x loaded
    by each stage: the sum, LayerNorm's variance, y) is loaded under an L2 evict_last policy but
    in its last stage, which loads it evict_first; a row read once (kept in registers, the dx's
    rows) takes evict_last, as stream 3."""
    from tvmnorm.sched.rows import CudaRowConfig
    part = "fwd" if key.stage == "fwd" else "dx"
    body = kernel(cuda_source(key, CudaRowConfig(stream=4, **cfg)), part)
    got = re.findall(r"createpolicy_fractional_fractional_L2__evict_(\w+?)_b64", body)
    if want is None:
        assert got and set(got) == {"last"}
    else:
        assert got == want
    assert not re.findall(r"= \*\(\w+\*\)\((x|dy|dz)_ptr", body), "a row loaded without a hint"


@pytest.mark.parametrize("stream,hint", [(1, "tvm_builtin_ptx_ld_vec_global_cs"),
                                         (3, "tvm_builtin_ptx_ld_vec_global_L2__cache_hint")])
@pytest.mark.parametrize("key,cfg", [
    (NormKey(hidden_size=7168), dict(threads=512, vec=8)),
    (NormKey(norm="layernorm", hidden_size=128), dict(threads=16, rows=8, vec=8, keep_row=True, full_chunks=1)),
    (NormKey(norm="layernorm", stage="bwd", hidden_size=8192), dict(threads=512, vec=4, prefetch=2, full_chunks=1))],
    ids=lambda v: getattr(v, "name", None) or str(v))
@pytest.mark.parametrize("rows", [None, 1024], ids=["tune_rows", "1024rows"])
def test_the_tuner_times_a_candidate_with_its_stream_hints(key, cfg, stream, hint, rows):
    """The static-row kernel MetaSchedule builds and times (tune.tuning_func, the row count a
    constant) loads every row with the cache hint of its stream mode, as the library's
    symbolic-row kernel of the same point does (the two version their walks apart, so the
    counts differ), and its weights without: until the thirtieth lease a candidate carried no
    hint, so the search timed every stream mode as 0. Also at a row count (--rows 1024) that
    divides the weights' extent."""
    from tvmnorm._tvm import Schedule, tvm
    from tvmnorm.build import _kernel
    from tvmnorm.sched.rows import CudaRowConfig, schedule_rows_cuda
    from tvmnorm.tune import tune_rows, tuning_func
    part = "fwd" if key.stage == "fwd" else "dx"
    point = CudaRowConfig(stream=stream, **cfg)
    library = kernel(cuda_source(key, row_config=point), part)
    func = tuning_func(key, part, rows or tune_rows(key, "cuda"), "cuda")
    sch = schedule_rows_cuda(func, point, sch=Schedule(func))
    # through JSON, as measure.InProcessBuilder hands a candidate to its worker
    built = Schedule(tvm.ir.load_json(tvm.ir.save_json(sch.mod))["main"])
    candidate = kernel(generated_cuda(_kernel(built, func.with_attr("global_symbol", f"tuned_{part}"))), part)
    for body in (candidate, library):
        assert body.count(hint) == len(re.findall(r"\b(x|dy)_ptr\[", body)) > 0, "a row loaded without the hint"
        hinted = [ln for ln in body.splitlines() if hint in ln]
        assert "gamma_ptr" in body and not any("gamma_ptr" in ln or "beta_ptr" in ln for ln in hinted)
    assert hint not in generated_cuda(_kernel(schedule_rows_cuda(func, CudaRowConfig(**cfg), sch=Schedule(func)),
                                              func.with_attr("global_symbol", f"plain_{part}")))


def test_probe_times_every_even_vector_fp8_point_unpaired_too(bench_script):
    """bench/gpu_probe.py's fp8 points of an even vector come again with paired_cast off
    (+unpaired), y kept in registers or recomputed by the store alike, so a probe times the
    paired cast against the one-column casts wherever the schedule pairs them; a bf16 forward
    has no cast to pair and no such point."""
    probe = bench_script("gpu_probe")
    fp8 = probe.points(NormKey(norm="layernorm", hidden_size=4096, otype="fp8e4m3"), variants=False)
    paired = {n: c for n, c in fp8.items() if "+unpaired" not in n and "+fc" not in n and "+ew" not in n}
    assert {c.keep_y for c in paired.values()} == {True, False}
    for name, cfg in paired.items():
        assert cfg.paired_cast and fp8[f"{name}+unpaired"] == dataclasses.replace(cfg, paired_cast=False)
    assert not any("+unpaired" in n for n in probe.points(NormKey(hidden_size=4096), variants=False))


def test_probe_swaps_a_records_stream_decision(bench_script):
    """bench/gpu_probe.py --stream-ab: a committed forward record with its STREAM decision made
    each mode replays, and only the rows' loads change (0: plain, 1: ld.global.cs, 3: under an
    L2 evict_last policy); the rest of the kernel is the record's."""
    from tvmnorm.tune import load_records
    probe = bench_script("gpu_probe")
    key = NormKey(hidden_size=8192)
    record = load_records("cuda")[key.pack()]
    bodies = {}
    for mode in (0, 1, 3):
        funcs = scheduled_funcs(key, "cuda", probe.with_stream(record, mode), parts=["fwd"])
        bodies[mode] = kernel(generated_cuda(funcs), "fwd")
    assert "ptx_" not in bodies[0]
    assert "ld_vec_global_cs" in bodies[1] and "cache_hint" not in bodies[1]
    assert "ld_vec_global_L2__cache_hint" in bodies[3] and "global_cs" not in bodies[3]
    strip = re.compile(r"tvm_builtin_ptx_\w+\([^;]*\);|alignas\(64\) uint64_t row_policy\w*\[1\];|"
                       r"\*\(\w+\*\)\(x_local_ptr[^;]*;")
    assert len({re.sub(r"\s+", "", strip.sub("", b)) for b in bodies.values()}) == 1
    assert record == load_records("cuda")[key.pack()], "the committed record was changed in place"


def test_stream_ab_swaps_a_backward_records_dx_stream_decision(bench_script):
    """bench/bwd_parts.py --stream-ab: a committed backward record (rmsnorm 8192, stream 3 since
    the thirty-first lease) with its dx STREAM decision made each mode replays with that mode
    (tune.stream_mode reads it back) and only the rows' loads change; its trace on the tuning
    function (what tune.tuner_us times) carries the same hints."""
    from tvmnorm._tvm import Schedule, Trace
    from tvmnorm.build import _kernel
    from tvmnorm.tune import load_records, stream_mode, tune_rows, tuning_func, with_stream
    bench_script("bwd_parts")  # imports: the probe's --stream-ab path is importable on a CPU host
    key = NormKey(stage="bwd", hidden_size=8192)
    record = load_records("cuda")[key.pack()]
    assert stream_mode(record, "dx") == 3
    hints = {0: (), 1: ("ld_vec_global_cs",), 3: ("ld_vec_global_L2__cache_hint",)}
    bodies = {}
    for mode in (0, 1, 3):
        swapped = with_stream(record, mode, "dx")
        assert stream_mode(swapped, "dx") == mode
        bodies[mode] = kernel(generated_cuda(scheduled_funcs(key, "cuda", swapped, parts=["dx"])), "dx")
        func = tuning_func(key, "dx", tune_rows(key, "cuda"), "cuda", record["rows_per_partial"])
        sch = Schedule(func)
        Trace.apply_json_to_schedule(swapped["parts"]["dx"], sch)
        candidate = kernel(generated_cuda(_kernel(sch, func.with_attr("global_symbol", "tuned_dx"))), "dx")
        for body in (bodies[mode], candidate):
            assert all(h in body for h in hints[mode]) and ("tvm_builtin_ptx_" in body) == bool(hints[mode])
    strip = re.compile(r"tvm_builtin_ptx_\w+\([^;]*\);|alignas\(64\) uint64_t row_policy\w*\[1\];|"
                       r"\*\(\w+\*\)\(\w+_local_ptr[^;]*;")
    assert len({re.sub(r"\s+", "", strip.sub("", b)) for b in bodies.values()}) == 1
    assert stream_mode(record, "dx") == 3, "the committed record was changed in place"


def test_sass_counts_reads_registers_and_spills_from_ptxas(tmp_path, bench_script):
    """bench/sass_counts.py's cubin(): each kernel's registers, stack frame and spills as ptxas -v
    reports them (what --records and --variants print): a kernel that must spill says so."""
    import shutil
    if not shutil.which("nvcc"):
        pytest.skip("nvcc not on PATH")
    counts = bench_script("sass_counts")
    # 64 live floats a thread under a cap of 32 registers (1024 threads x 2 blocks an SM) spill
    src = """extern "C" __global__ void __launch_bounds__(1024, 2) spills(float* p) {
      float v[64];
      for (int i = 0; i < 64; ++i) v[i] = p[threadIdx.x + i * 1024];
      float s = 0.f;
      for (int i = 0; i < 64; ++i) s += v[i] * v[63 - i] + v[(i * 7) % 64];
      p[threadIdx.x] = s;
    }
    extern "C" __global__ void plain(float* p) { p[threadIdx.x] += 1.f; }
    """
    _, usage = counts.cubin(src, tmp_path)
    assert set(usage) == {"spills", "plain"}
    regs, frame, stores, loads = usage["spills"]
    assert regs <= 32 and frame > 0 and stores > 0 and loads > 0
    regs, frame, stores, loads = usage["plain"]
    assert 0 < regs <= 16 and frame == stores == loads == 0


@pytest.mark.parametrize("hidden,block,rows", [(128, 64, 8), (512, 32, 2), (1024, 32, 1), (7168, 512, 1)])
def test_torch_compile_fwd_shapes_are_its_launch(hidden, block, rows):
    """space.torch_compile_fwd_shapes (seeds of the forward tune, bench/gpu_probe.py
    --peer-shape): torch.compile's forward launch (threads a block, rows a block:
    bench/results/h200-run24/launches.log) as a point of the space, x kept below 2048 columns,
    each stream mode; every point compiles to a kernel of that block. None for fp32 or fp8
    output, or the backward."""
    from tvmnorm.sched.space import torch_compile_fwd_shapes
    key = NormKey(hidden_size=hidden)
    points = torch_compile_fwd_shapes(key)
    assert not any(torch_compile_fwd_shapes(k) for k in (
        NormKey(hidden_size=hidden, itype="fp32", wtype="fp32", otype="fp32"),
        NormKey(hidden_size=hidden, otype="fp8e4m3"), NormKey(stage="bwd", hidden_size=hidden)))
    assert {cfg.stream for cfg in points.values()} == {0, 1, 3, 4}
    cfg = points["torch.compile-shape+stream0"]
    assert (cfg.threads * cfg.rows, cfg.rows, cfg.keep_row) == (block, rows, hidden < 2048)
    src = generated_cuda(scheduled_funcs(key, "cuda", row_config=cfg, row_bits=32, parts=["fwd"]))
    assert f"__launch_bounds__({block})" in src


def _store_order(src: str, part: str = "fwd") -> list:
    """'y' or 'stat' for each store of the kernel's rows or its per-row statistics, in order."""
    body = kernel(src, part)
    events = [(m.start(), "y") for m in re.finditer(r"\(y_ptr \+|y_ptr\[|global_cs_v\d_u32\(\(&\(y_ptr", body)]
    events += [(m.start(), "stat") for m in re.finditer(r"\b(rsigma|mu)_ptr\[", body)]
    return [what for _, what in sorted(events)]


@pytest.mark.parametrize("key,cfg", [
    (NormKey(hidden_size=7168), dict(threads=256, vec=8, keep_row=True)),
    (NormKey(norm="layernorm", hidden_size=128), dict(threads=16, rows=8, vec=8, keep_row=True, full_chunks=1)),
    (NormKey(norm="layernorm", hidden_size=1024), dict(threads=128, vec=8, keep_row=True, warp_sums=True)),
    (NormKey(norm="layernorm", otype="fp8e4m3", hidden_size=4096), dict(threads=512, vec=8, keep_row=True, keep_y=True)),
    (NormKey(hidden_size=1000), dict(threads=128, rows=2, vec=4, keep_row=False, stream=1)),
    (NormKey(norm="layernorm", hidden_size=8192), None)],
    ids=lambda v: getattr(v, "name", None) or str(v))
def test_stats_first_stores_the_row_statistics_before_y(key, cfg, monkeypatch):
    """_tvm.STATS_FIRST (compute.norms.stores_stats_first): the per-row statistics (rsigma, and
    LayerNorm's mu) are stored right after they are computed, before the row's y, where without
    it they come last; in a whole block's copy and its guarded twin (full_chunks) each copy
    stores its own first; the kernel's accesses, barriers and shuffles stay as they were."""
    from tvmnorm.compute import norms
    from tvmnorm.sched.rows import CudaRowConfig
    row_config = CudaRowConfig(**cfg) if cfg else None
    plain = cuda_source(key, row_config)
    assert _store_order(plain)[-1] == "stat"
    monkeypatch.setattr(norms, "stores_stats_first", lambda key, kind: True)
    first = cuda_source(key, row_config)
    order = _store_order(first)
    stats = 2 if key.norm == "layernorm" else 1
    copies = order.count("stat") // stats
    assert copies in (1, 2) and order[-1] == "y" and order[:stats] == ["stat"] * stats
    if copies == 2:
        second = order.index("stat", stats)
        assert order[second:second + stats] == ["stat"] * stats and order[second - 1] == "y"
    # the same accesses, barriers and shuffles (TVM's common-subexpression pass names and orders
    # its temporaries by where their first use now is)
    for what in ("x_ptr", "gamma_ptr", "beta_ptr", "y_ptr", "rsigma_ptr", "mu_ptr", "__syncthreads", "__shfl"):
        assert kernel(first, "fwd").count(what) == kernel(plain, "fwd").count(what), what


def test_stats_first_on_llvm_against_float64(monkeypatch, rng, seed):
    """The same pass on llvm's forwards (rmsnorm and LayerNorm, a width of a tail, one row and
    odd counts): right against float64, as without it."""
    from conftest import run_and_check
    from tvmnorm.compute import norms
    from tvmnorm.runtime import record_kernel
    monkeypatch.setattr(norms, "stores_stats_first", lambda key, kind: True)
    for norm in ("rmsnorm", "layernorm"):
        key = NormKey(norm=norm, itype="fp32", wtype="fp32", otype="fp32", hidden_size=1000)
        k = record_kernel(key, "llvm", None)
        for rows in (1, 7, 130):
            run_and_check(lambda _: k, key, rows, rng, seed)


@pytest.mark.parametrize("key,cfg", [
    (NormKey(stage="bwd", hidden_size=2048), dict(threads=256, vec=8, prefetch=1, stages=2)),
    (NormKey(norm="layernorm", stage="bwd", hidden_size=1000), dict(threads=128, vec=8, prefetch=1, stages=3)),
    (NormKey(norm="layernorm", stage="bwd_add", itype="fp32", wtype="fp32", otype="fp32", hidden_size=1024),
     dict(threads=128, vec=4, prefetch=2, stages=2, chunk_weights=True))])
def test_staged_dx_copies_its_rows_into_shared_memory_by_cp_async(key, cfg):
    """staged (sched.rows._cuda_row_shared): dy and x reach the dx kernel only through cp.async
    copies into shared buffers of `stages` groups of `prefetch` rows, each group committed and
    waited for `stages` - 1 groups behind, then as 16-byte vectors into registers that hold one
    group (not `stages`, as the unstaged pipeline's do), which the stages read. A column tail
    (1000) keeps its guard on the copy."""
    from tvmnorm.sched.rows import CudaRowConfig
    body = kernel(cuda_source(key, row_config=CudaRowConfig(staged=True, **cfg)), "dx")
    group = cfg["prefetch"] * -(-key.hidden_size // (cfg["threads"] * cfg["vec"])) * cfg["vec"]
    for op in ("dy", "x"):
        assert re.search(rf"__shared__ alignas\(\d+\) \w+ {op}_shared_ptr\[(\d+)\];", body)[1] == \
            str(cfg["stages"] * cfg["prefetch"] * key.hidden_size), op
        assert re.search(rf" {op}_local_ptr\[(\d+)\];", body)[1] == str(group), op
        reads = [line for line in body.splitlines() if re.search(rf"\b{op}_ptr\b", line)]
        assert reads and all("ptx_cp_async" in r for r in reads), reads[:2]
        assert re.search(rf"\*\((uint4|float4)\*\)\({op}_local_ptr \+ (\(int64_t\))?\d+\) = "
                         rf"\*\((uint4|float4)\*\)\({op}_shared_ptr \+", body), op
        assert not re.search(rf"\({op}_shared_ptr\[", body)  # no element is read from shared memory alone
    assert f"wait_group_{cfg['stages'] - 1}()" in body
    assert "commit_group()" in body
    if key.hidden_size % (cfg["threads"] * cfg["vec"]):
        assert re.search(r"\(\(\(int64_t\)threadIdx\.x\) < \(int64_t\)\d+\)\) \{\s*ptx_cp_async", body)


@pytest.mark.parametrize("key,cfg", [
    (NormKey(norm="layernorm", stage="bwd", hidden_size=1024), dict(threads=64, vec=8, prefetch=1)),
    (NormKey(stage="bwd", hidden_size=2048), dict(threads=128, vec=8, prefetch=2, chunk_weights=True))])
def test_staged_dx_over_full_chunks_keeps_its_barriers_in_both_walks(key, cfg):
    """staged with full_chunks: the walk's unguarded copy (_tvm._full_chunk) refills and reads
    its shared buffers behind the same barriers as the guarded walk (ThreadSync places them
    under the copy's test because _full_chunk marks it thread-invariant: it reads only the
    block's index and the row count), and its copies into shared memory carry no row guard."""
    from tvmnorm.sched.rows import CudaRowConfig
    body = kernel(cuda_source(key, row_config=CudaRowConfig(staged=True, stages=2, full_chunks=1, **cfg)), "dx")
    lines = body.splitlines()
    split = lines.index("  } else {")
    start = max(i for i in range(split) if lines[i].startswith("  if ("))
    end = next(i for i in range(split, len(lines)) if lines[i] == "  }")
    assert "threadIdx" not in lines[start] and "< n" in lines[start]
    fast, guarded = lines[start + 1:split], lines[split + 1:end]
    syncs = [sum("__syncthreads()" in line for line in walk) for walk in (fast, guarded)]
    assert syncs[0] == syncs[1] >= 4  # the refill's, the copies' wait's and the row sums' two
    assert sum("ptx_cp_async" in line for line in fast) == sum("ptx_cp_async" in line for line in guarded) > 0
    assert not any("< n" in line for line in fast)
    assert any("< n" in line for line in guarded)


@pytest.mark.parametrize("key,cfg,problem", [
    (NormKey(stage="bwd", hidden_size=2048), dict(threads=256, vec=8, stages=1), "stages >= 2"),
    (NormKey(stage="bwd", hidden_size=2048), dict(threads=128, rows=2, vec=8, stages=2), "one chunk lane a block"),
    (NormKey(hidden_size=2048), dict(threads=256, vec=8, stages=2), "a dx schedule"),
    (NormKey(stage="bwd", hidden_size=8192), dict(threads=1024, vec=8, stages=2), "65536 bytes of shared memory"),
    (NormKey(stage="bwd", itype="fp16", wtype="fp16", otype="fp16", hidden_size=4095),
     dict(threads=1024, vec=1, stages=2), "vectors of 4, 8 or 16 bytes")])
def test_staged_rows_are_refused_where_they_cannot_be_built(key, cfg, problem):
    """A staged dx needs an asynchronous pipeline, one chunk lane a block, vectors cp.async can
    copy and its groups within a block's static shared memory; a forward has no groups."""
    from tvmnorm.sched.rows import CudaRowConfig
    with pytest.raises(ValueError, match=problem):
        scheduled_funcs(key, "cuda", row_config=CudaRowConfig(staged=True, **cfg))


@pytest.mark.parametrize("key", [NormKey(norm="layernorm", stage="bwd", hidden_size=4095),
                                 NormKey(norm="layernorm", otype="fp8e4m3", hidden_size=4096)])
def test_async_copies_leave_the_other_kernels_as_they_were(key, monkeypatch):
    """_tvm.PASS_CONFIG turns on use_async_copy for the staged dx; no other kernel has an
    asynchronous stage, and their CUDA is the same without it (4095: the default dx does not
    stage rows of 2-byte vectors)."""
    from tvmnorm import _tvm
    with_async = cuda_source(key)
    monkeypatch.setitem(_tvm.PASS_CONFIG, "tirx.use_async_copy", False)
    assert cuda_source(key) == with_async


def _pdl_waiting(src: str) -> dict:
    """kernel name -> whether its body opens with griddepcontrol.wait; no kernel lets the next
    launch early (griddepcontrol.launch_dependents)."""
    from tvmnorm._tvm import PDL_WAIT
    assert "launch_dependents" not in src
    out = {}
    for m in re.finditer(r"__global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)_kernel\([^)]*\) \{\n(.*)\n", src):
        out[m.group(1)] = m.group(2).strip() == PDL_WAIT
    assert src.count("griddepcontrol") == sum(out.values())
    return out


def _pdl_launched(src: str) -> set:
    return set(re.findall(r"  cuda_config\.attrs = cuda_pdl;\n  cuda_config\.numAttrs = 1;\n"
                          r"  if \(::tvm_cuda_host_check\(tvm_cuda_host_launch\(::(\w+)_kernel, ", src))


@pytest.mark.parametrize("key,waiting", [
    (NormKey(norm="layernorm", stage="bwd", hidden_size=7168),
     {"combine", "finalize", "decode_wgrad", "decode_wgrad_few"}),
    (NormKey(stage="bwd_add", hidden_size=3584),
     {"combine", "finalize", "decode_wgrad", "decode_wgrad_few", "decode_wgrad_mid"}),
    (NormKey(otype="fp8e4m3", hidden_size=4096), {"fwd", "narrow_fwd", "small_fwd"}),
    (NormKey(hidden_size=1024), set())])
def test_kernels_after_another_of_a_call_wait_for_it_under_pdl(key, waiting, monkeypatch):
    """Programmatic dependent launch (sm_90): a library kernel that runs after another of the same
    call (finalize and combine after the dx, the decode backward's wgrad after its dx, the fp8
    forward after amax_zero) waits for it at its entry, before any access, and is launched with
    the programmatic stream serialization attribute; the first kernel of a call (the dx kernels,
    amax_zero, the bf16 forward) is launched plainly (the kernel ahead is the user's) and does not
    wait. TVMNORM_PDL=0 launches the same kernels plainly (the A/B); for sm_80 nothing is written
    (griddepcontrol is sm_90 PTX)."""
    from tvmnorm.build import key_funcs
    from tvmnorm.cuda_aot import unit_sources
    funcs = key_funcs(key, "cuda")
    src = "".join(unit_sources(funcs, "sm_90", 2))
    got = _pdl_waiting(src)
    assert set(got) == set(funcs)
    assert {name[len(key.name) + 1:] for name, w in got.items() if w} == waiting
    assert _pdl_launched(src) == {f"{key.name}_{part}" for part in waiting}
    assert src.count("cuda_pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;") == len(waiting)
    monkeypatch.setenv("TVMNORM_PDL", "0")
    plain = "".join(unit_sources(funcs, "sm_90", 2))
    assert "cuda_pdl" not in plain and _pdl_waiting(plain) == got
    monkeypatch.delenv("TVMNORM_PDL")
    old = "".join(unit_sources(funcs, "sm_80", 2))
    assert "griddepcontrol" not in old and "cuda_pdl" not in old


def test_pdl_source_refuses_a_source_it_does_not_recognise():
    """A kernel launched under programmatic stream serialization without its wait would read what
    the kernel ahead is still writing: a source in which some kernel or launch is not found is
    refused whole."""
    from tvmnorm._tvm import pdl_source
    from tvmnorm.build import key_funcs
    from tvmnorm.cuda_aot import cuda_host_source
    funcs = key_funcs(NormKey(stage="bwd", hidden_size=1024), "cuda")
    src = cuda_host_source(funcs, "sm_90")
    assert "cuda_pdl" in pdl_source(src, funcs)
    with pytest.raises(RuntimeError, match="programmatic dependent launch"):
        pdl_source(src.replace("  cuda_config.stream = cuda_stream;\n", "", 1), funcs)
    renamed = next(s for s in funcs if s.endswith("_finalize"))
    with pytest.raises(RuntimeError, match="programmatic dependent launch"):
        pdl_source(re.sub(rf"({renamed})_kernel(\([^)]*\) \{{\n)", r"\1_k\2", src), funcs)


@pytest.mark.slow
def test_library_manifest_says_whether_it_launches_with_pdl(tmp_path, monkeypatch):
    """The manifest records how the library launches (a run's bench files name the library)."""
    from tvmnorm.build import build_library
    if not has_nvcc():
        pytest.skip("nvcc not installed")
    key = NormKey(hidden_size=128)
    assert build_library([key], "cuda", tmp_path / "on", arch="sm_90", log=lambda *_: None, jobs=1)["pdl"] is True
    monkeypatch.setenv("TVMNORM_PDL", "0")
    assert build_library([key], "cuda", tmp_path / "off", arch="sm_90", log=lambda *_: None, jobs=1)["pdl"] is False


@pytest.mark.slow
def test_cuda_library_of_x_layouts_resolves_every_symbol(tmp_path):
    """`tvmnorm build --target cuda` with every layout (its default): a module of nvcc's a
    layout, each listed with its sha256 in the manifest and defining every symbol the manifest
    gives its key for that layout (the GPU runs them: test_gpu_core.test_cuda_library_of_x_layouts)."""
    from tvmnorm._tvm import load_module
    from tvmnorm.build import build_library, file_sha256
    if not has_nvcc():
        pytest.skip("nvcc not installed")
    key = NormKey(norm="layernorm", stage="bwd", hidden_size=1000)
    manifest = build_library([key], "cuda", tmp_path, arch="sm_90", log=lambda *_: None, layouts="all")
    (entry,) = manifest["kernels"]
    assert sorted(manifest["layouts"]) == sorted(entry["layouts"]) == ["heads", "strided"]
    for layout, info in manifest["layouts"].items():
        assert file_sha256(tmp_path / info["library"]) == info["sha256"]
        what = entry["layouts"][layout]
        assert what["symbols"] == entry["symbols"] and what["rows_per_partial"] == entry["rows_per_partial"]
        mod = load_module(str(tmp_path / info["library"]))
        assert all(mod.implements_function(s) for s in what["symbols"]), layout


@pytest.mark.parametrize("key", [NormKey(stage="bwd", hidden_size=7168), NormKey(norm="layernorm", hidden_size=1002),
                                 NormKey(norm="layernorm", stage="bwd_add", itype="fp32", wtype="fp32", otype="fp32",
                                         hidden_size=998)], ids=lambda k: k.name)
@pytest.mark.parametrize("layout", ("strided", "heads"))
def test_x_layout_cuda_kernels_load_through_ptx(key, layout):
    """Every kernel of a key for strided or per-head rows compiles for CUDA (no GPU): x's
    strides (and head count) are parameters of the kernels that read x, and its 8- and 16-byte
    vector loads are PTX loads (TVM's code generator refused them, unable to prove i *
    x_row_stride + j aligned: bf16 7168's dx failed so before _tvm.STRIDED_ROWS); the compact
    kernels keep TVM's own loads. Per-head rows divide a row index, never a column's: by the
    head count, C's / and % (no floordiv sign cases), and the tokens x heads check stays on
    the host."""
    from tvmnorm.build import key_funcs
    src = generated_cuda(key_funcs(key, "cuda", layout=layout))
    readers = [k for k in re.split(r'extern "C" __global__', src)[1:] if "x_ptr" in k.split("{")[0]]
    params = ("x_row_stride",) if layout == "strided" else ("x_token_stride", "x_head_stride", "x_heads")
    assert readers and all(p in k.split("{")[0] for k in readers for p in params)
    if layout == "heads":
        assert "/ x_heads)" in src and "% x_heads)" in src and "x_heads < " not in src
        assert "tokens x heads" not in src and "x_tokens" not in src
    # 8-byte vectors and wider where a row's bytes allow them (bf16 1002: 4-byte ones, which TVM writes)
    assert ("ld.global.v" in src) == (key.hidden_size * (4 if key.itype == "fp32" else 2) % 8 == 0)
    compact = generated_cuda(key_funcs(key, "cuda"))
    assert "ld.global.v" not in compact and "x_row_stride" not in compact and "x_heads" not in compact


def kernel_params(src: str) -> dict:
    """kernel name -> its parameter list, from CUDA source (definitions and declarations alike)."""
    return dict(re.findall(r'__global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(([^)]*)\)', src))


@pytest.mark.parametrize("name", ["rmsnorm_bwd_ibf16_wbf16_obf16_cfp32_h4096", "layernorm_bwd_ibf16_wbf16_obf16_cfp32_h128",
                                  "rmsnorm_fwd_ibf16_wbf16_ofp8e4m3_cfp32_h7168", "layernorm_fwd_ibf16_wbf16_obf16_cfp32_h128",
                                  "rmsnorm_bwd_ibf16_wbf16_obf16_cfp32_h8192"])
def test_committed_cuda_records_compile_for_per_head_rows(name):
    """The committed H200 records' traces replay for per-head x and compile (no GPU): a staged
    dx (cp.async from x, rmsnorm bwd 4096), stream hints, fp8 out with its amax fold, the
    QK-norm width 128; every kernel that reads x takes its head strides."""
    from tvmnorm.build import key_funcs
    from tvmnorm.tune import load_records
    (key, record), = [(NormKey.unpack(k), r) for k, r in load_records("cuda").items() if NormKey.unpack(k).name == name]
    assert record.get("parts")
    params = kernel_params(generated_cuda(key_funcs(key, "cuda", record, "heads")))
    readers = {k: p for k, p in params.items() if re.search(r"\bx_ptr\b", p)}  # not amax_ptr
    assert readers and all("x_heads" in p and "x_token_stride" in p for p in readers.values()), readers


@pytest.mark.parametrize("stage", ("fwd", "fwd_add"))
def test_llvm_fp8_output_is_stored_as_bytes(stage):
    """On llvm the fp8 byte is computed on the bits and stored through a uint8 view of y
    (_tvm._fp8_byte_stores): stored as an fp8 value, TVM's FP8ComputeLegalize decoded it to
    fp32 and encoded it again (1.4-1.5x the time of the fp8 forward on the CPU). The IR stores
    byte vectors into y_bytes and holds no fp8 decode (its exponent rebias constant)."""
    from tvmnorm.build import compile_funcs
    key = NormKey(norm="rmsnorm", stage=stage, itype="bf16", wtype="bf16", otype="fp8e4m3", hidden_size=1024)
    ir = compile_funcs(scheduled_funcs(key, "llvm"), "llvm").mod.inspect_source("ll")
    assert re.search(r"store <\d+ x i8> %\S+, ptr %\S+", ir) and "%y_bytes" in ir
    # fp8 e4m3 -> fp32 rebiases the exponent by (127 - 7) << 23 = 1006632960
    assert "1006632960" not in ir


def test_with_chunk_rows_moves_a_backward_records_dx_to_another_t(bench_script):
    """tune.with_chunk_rows (bench/bwd_parts.py --record-t): a committed backward record's dx
    replays at chunks of another T, here one no tuner task has (56, and 42, which no prefetch
    group divides), with only the row loop's split changed: its kernel carries the new T (what
    the runtime sizes the partials by) and the record itself is left as it was. A record without
    a dx, or whose first split is not by its T, is refused by name."""
    from tvmnorm.build import chunk_rows_of
    from tvmnorm.tune import load_records, with_chunk_rows
    bench_script("bwd_parts")  # imports: the probe's --record-t path is importable on a CPU host
    key = NormKey(norm="layernorm", stage="bwd", hidden_size=2560)
    record = load_records("cuda")[key.pack()]
    own = record["rows_per_partial"]
    for t in (56, 42):
        moved = with_chunk_rows(record, t)
        assert moved["rows_per_partial"] == t
        assert chunk_rows_of(scheduled_funcs(key, "cuda", moved, parts=["dx"])) == t
        changed = [(a, b) for a, b in zip(record["parts"]["dx"][0], moved["parts"]["dx"][0]) if a != b]
        assert changed == [(["Split", changed[0][0][1], [True, False], changed[0][0][3]],
                            ["Split", changed[0][0][1][:2] + [t], [True, False], changed[0][0][3]])]
        assert changed[0][0][1][2] == own
    assert record == load_records("cuda")[key.pack()], "the committed record was changed in place"
    for t in (0, 96):  # 96: past the int32-row kernels' index slack
        with pytest.raises(ValueError, match="chunk rows must be 1..64"):
            with_chunk_rows(record, t)
    with pytest.raises(ValueError, match="not a backward record"):
        with_chunk_rows(load_records("cuda")[NormKey(hidden_size=2560).pack()], 56)
    with pytest.raises(ValueError, match="first split"):
        with_chunk_rows({**record, "rows_per_partial": own + 1}, 56)
