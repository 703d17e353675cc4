"""The shared row-kernel schedule: every stage of a row runs inside one task.

A "row kernel" (fwd, dx) is a chain of per-row reductions (sum of squares, mean, ...) followed by
an elementwise output over the row. The schedule maps rows to CUDA blocks (or CPU tasks), puts
every stage of a row under that row loop, and splits each stage's hidden loop over threads
(CUDA) or vector lanes (CPU). Per-row reductions become warp-shuffle allreduces on CUDA.

On CUDA the fused dx kernel's chunk is walked by one block lane (threadIdx.y): its rows are
loaded ``prefetch`` at a time into registers that every stage reads, and the running sums stay
in registers (``_cuda_row_registers``, ``_cuda_partials``); with ``staged`` the groups in flight
wait in shared memory, copied there by cp.async (``_cuda_row_shared``). A dx compute of grouped
row sums (P rows per reduction, ``compute.norms._group_sums``) makes the group of ``prefetch`` =
P rows the compute's own: one allreduce per group instead of one per row (``_chunk_rows``).

On llvm the dx kernel also carries the weight-gradient partials (block ``part``: part[s, q, j]
sums chunk q's T rows). There the row loop is split by T into (chunk q, row t of the chunk), the
dx chain goes under t, the partial block's loops are reordered to (q, t, s, j) and its q and t
loops are merged with the chain's (``_chunk_rows``): each chunk is one CPU task that walks its
T rows serially, updating the running partial sums right after the dx stages read the same row,
and the partials are written once per chunk.

Config objects are frozen dataclasses: ``default.py`` fills them from a heuristic, ``space.py``
samples them with MetaSchedule decisions. Every knob here is only a split factor, so a trace
recorded on a static row count replays on the symbolic-row function.
"""
from __future__ import annotations

import dataclasses

from .._tvm import (ALLREDUCE_SHARED_BYTES, BLOCK_SHARED_BYTES, FULL_CHUNK, HOIST_INITS, MIN_BLOCKS_PER_SM,
                    SHARED_SUMS, STREAM_LOADS, STREAM_MODES, UNROLL_BY, Schedule, tirx)
from ..compute.norms import (ADD_STAGE, FP8_Y_STAGE, ROW_STAT_OPERANDS, ROWS_PER_GROUP_ATTR, ROWS_PER_PARTIAL_ATTR,
                             WEIGHT_OPERANDS)

PART_BLOCK = "part"


# CudaRowConfig's 0/1 knobs of the fused dx kernel's running sums (a forward keeps none)
DX_SUM_KNOBS = ("hoist_inits", "shared_sums")


@dataclasses.dataclass(frozen=True)
class CudaRowConfig:
    threads: int = 256        # threads per row (threadIdx.x): 4..1024; < 32 is a partial warp
    rows: int = 1             # rows per block (threadIdx.y); chunks of rows in the fused dx kernel
    vec: int = 1              # consecutive elements per thread per step (vector width)
    unroll: int = 256         # pragma_auto_unroll_max_step on the per-thread loop
    prefetch: int = 1         # fused dx only: rows of a chunk loaded into registers at once
    stages: int = 1           # fused dx only: groups of rows in flight (2: the next group loads
                              # while this one computes)
    keep_row: bool = False    # fwd only: x loaded once into registers that every stage reads
                              # (the fused dx kernel always keeps its rows there)
    keep_y: bool = False      # fp8 fwd with keep_row: y (before scaling and the cast) computed
                              # once into registers that the store and amax read
    paired_cast: bool = True  # fp8 fwd, even vec: y cast two columns at a time (float2 -> fp8x2:
                              # one cvt.rn.satfinite.e4m3x2 a pair, packed as stored), whether
                              # y is kept (keep_y) or recomputed by the store
    min_blocks: int = 1       # blocks one SM must hold at once (__launch_bounds__'s second
                              # argument, _tvm.MIN_BLOCKS_PER_SM): ptxas then caps a thread's
                              # registers at 64K / (threads * rows * min_blocks)
    full_chunks: int = 0      # 1: the dx kernel walks a chunk whose rows are all below the row
                              # count without row guards, and the forward so computes a block
                              # whose rows all are (_tvm.FULL_CHUNK); the last ones keep them
    stream: int = 0           # 1: rows loaded with ld.global.cs (the L2 evicts them first), 2: rows
                              # also stored so; 3: rows loaded with an L2 evict_last policy
                              # (_tvm.STREAM_LOADS); the weights keep the default
    warp_sums: bool = False   # fwd only: each row sum reduced per warp (shuffles), the warps'
                              # sums then added by every thread from shared memory: one barrier
                              # a reduction instead of two (_warp_sums); threads in whole warps
    shuffle_sums: bool = False  # with warp_sums: the warps' sums added by one shuffle reduction
                              # in each warp (lane w reads warp w's, lanes past the last warp add
                              # nothing), not by every thread reading all of them from shared
                              # memory (_warp_sums)
    early_weights: bool = False  # fwd with keep_row only: gamma (and beta) loaded into registers
                              # with x, before the row sums' barriers, instead of after them
    chunk_weights: bool = False  # fused dx only: gamma loaded into registers once a chunk lane,
                              # before its walk over the chunk's rows, instead of by every stage
                              # of every row (_cuda_row_registers)
    staged: bool = False      # fused dx only, stages >= 2, one chunk lane a block: the rows' dy
                              # and x copied into shared memory by cp.async, `stages` groups in
                              # flight, each then into registers that hold one group
                              # (_cuda_row_shared), instead of `stages` groups in registers
    hoist_inits: int = 0      # fused dx only: 1 zeroes the running partial sums once before the
                              # walk over the chunk's rows instead of at its first row's update
                              # (_tvm.HOIST_INITS)
    shared_sums: int = 0      # fused dx only: 1 keeps the running partial sums in shared memory,
                              # a slot of each thread's own per sum, instead of registers
                              # (_tvm.SHARED_SUMS): fewer registers, more blocks an SM

    def __post_init__(self):
        # the design space passes MetaSchedule random variables here; only plain ints are checked
        if isinstance(self.threads, int) and isinstance(self.rows, int) and self.threads * self.rows > 1024:
            raise ValueError(f"{self.threads} threads x {self.rows} rows exceeds 1024 threads per block")
        if isinstance(self.min_blocks, int) and not 1 <= self.min_blocks <= 32:
            raise ValueError(f"min_blocks must be 1..32 blocks per SM, got {self.min_blocks}")
        _check_full_chunks(self.full_chunks)
        for knob in DX_SUM_KNOBS:
            value = getattr(self, knob)
            if isinstance(value, int) and value not in (0, 1):
                raise ValueError(f"{knob} must be 0 or 1, got {value}")
        if isinstance(self.stream, int) and self.stream not in STREAM_MODES:
            raise ValueError(f"stream must be one of {STREAM_MODES}, got {self.stream}")
        if self.keep_y and not self.keep_row:
            raise ValueError("keep_y needs keep_row: y's registers share the kept row's layout")
        if self.staged and isinstance(self.stages, int) and self.stages < 2:
            raise ValueError("staged rows need stages >= 2: the copy into shared memory is asynchronous only "
                             "when a later group's copy overlaps this group's math")
        if self.staged and isinstance(self.rows, int) and self.rows > 1:
            raise ValueError("staged rows need one chunk lane a block (rows=1): the copy into shared memory "
                             "covers the whole block's rows, and only threadIdx.x is bound over it")
        if self.early_weights and not self.keep_row:
            raise ValueError("early_weights needs keep_row: the weights' registers share the kept row's layout")
        if self.warp_sums and isinstance(self.threads, int) and isinstance(self.rows, int):
            problem = warp_sums_problem(self.threads, self.rows, self.vec)
            if problem:
                raise ValueError(problem)
        if self.shuffle_sums and not self.warp_sums:
            raise ValueError("shuffle_sums needs warp_sums: it is how the warps' sums are added")


@dataclasses.dataclass(frozen=True)
class CpuRowConfig:
    vec: int = 16             # vector lanes: inner split of the hidden loop, vectorised in every stage
    rows: int = 1             # rows per parallel task
    acc: int = 4              # independent vector accumulators per row reduction (rfactor lanes / vec)
    unroll: int = 1           # vectors per step of the elementwise output loop (unrolled)
    full_chunks: int = 0      # fused dx only: 1 walks a chunk whose rows are all below the row
                              # count without a row guard (_tvm.FULL_CHUNK), the last one with them

    def __post_init__(self):
        _check_full_chunks(self.full_chunks)


def _check_full_chunks(value) -> None:
    if isinstance(value, int) and value not in (0, 1):
        raise ValueError(f"full_chunks must be 0 or 1, got {value}")


def is_output(sch, blk) -> bool:
    root = sch.get(sch.get_sblock("root"))
    temps = {b.name for b in root.alloc_buffers}
    return any(w.source.name not in temps for w in sch.get(blk).writes)


def is_reduction(sch, blk) -> bool:
    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(blk).iter_vars)


def _extent_is(sch, loop, value):
    ext = sch.get(loop).extent
    return isinstance(ext, tirx.IntImm) and ext.value == value


def _inner_loop(sch, blk, depth):
    """Fuse a block's loops below the ``depth`` row loops into one (dropping unit loops first:
    fusing a unit row loop into a reduction hides it from LowerCrossThreadReduction)."""
    inner = [lp for lp in sch.get_loops(blk)[depth:] if not _extent_is(sch, lp, 1)]
    if not inner:
        return sch.add_unit_loop(blk)
    return sch.fuse(*inner) if len(inner) > 1 else inner[0]


def _anchor(sch, apart=()):
    """The first stage but those named ``apart``; every later stage of a row kernel depends on it
    through a chain (those apart do not: _merge_rows)."""
    return next(b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint not in apart)


def _named_block(sch, name):
    """The top-level block called ``name`` (the weight-gradient partials of a fused dx kernel,
    PART_BLOCK; the fp8 forward's unscaled y, FP8_Y_STAGE), or None."""
    for blk in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(blk).name_hint == name:
            return blk
    return None


def is_fused(func) -> bool:
    """Whether a dx PrimFunc also writes the weight-gradient partials (it carries T)."""
    return func.attrs is not None and ROWS_PER_PARTIAL_ATTR in func.attrs


def _rows_per_partial(sch) -> int:
    attrs = sch.mod["main"].attrs
    if attrs is None or ROWS_PER_PARTIAL_ATTR not in attrs:
        raise ValueError(f"a kernel with a '{PART_BLOCK}' block needs the {ROWS_PER_PARTIAL_ATTR} attribute")
    return int(attrs[ROWS_PER_PARTIAL_ATTR])


def _rows_per_group(sch) -> int:
    attrs = sch.mod["main"].attrs
    return int(attrs[ROWS_PER_GROUP_ATTR]) if attrs is not None and ROWS_PER_GROUP_ATTR in attrs else 1


def _chunk_rows(sch, chain, part, group: int = 1):
    """Fuse the partial block into the row loop of the dx chain: split the anchor's row loop by
    T (the static chunk size; a symbolic split factor is refused), move the chain under the row
    loop t, reorder the partial block to (q, t, s, j) and merge its q and t loops with the
    chain's. The partial block keeps its init inside (no decompose_reduction: an init block
    under q would keep t from being the only child there, which merge requires); it runs at
    t == 0. The chain's blocks are predicated on row q*T+t < n by the split, the partial block
    by its own guard. Returns the merged (q, t) loops.

    With ``group`` = P > 1 (a dx compute of grouped row sums, compute.norms._group_sums) the
    anchor's loop runs over groups of P rows, so t is the group of the chunk (T/P of them): the
    later stages go under it, each with a loop over the group's P rows, and the partial block's
    row loop is split into (group, row of the group) likewise."""
    T = _rows_per_partial(sch)
    q, t = sch.split(sch.get_loops(chain[0])[0], [None, T // group])
    for blk in chain[1:]:
        sch.reverse_compute_at(blk, t, preserve_unit_loops=True)
    s_, qp, j, tp = sch.get_loops(part)
    if group > 1:
        tp, rp = sch.split(tp, [None, group])
        sch.reorder(qp, tp, rp, s_, j)
    else:
        sch.reorder(qp, tp, s_, j)
    q = sch.merge(q, qp)
    t = sch.merge(sch.get_loops(chain[0])[1], sch.get_loops(part)[1])
    return q, t


def _gather_under(sch, anchor, loop, apart=()):
    """Move every other stage but those named ``apart`` under ``loop`` of the anchor (the first
    stage of the row's chain) by reverse_compute_at, which follows the producer chain and
    accepts output blocks. Returns every block, in order."""
    root = sch.get_sblock("root")
    first = sch.get(anchor).name_hint
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(root)]
    for name in names:
        if name != first and name not in apart:
            sch.reverse_compute_at(sch.get_sblock(name), loop, preserve_unit_loops=True)
    return [sch.get_sblock(n) for n in names]


def _merge_rows(sch, anchor, name: str, rows) -> tuple:
    """Give block ``name`` the anchor's row loops, split alike ([None, rows]) and merged with
    them, for a stage outside the anchor's chain (fwd_add's store of h where the add is inlined
    into its readers: reverse_compute_at gave it every row of the call, under each row).
    Returns the merged (block, row of the block) loops."""
    blk = sch.get_sblock(name)
    sch.split(sch.get_loops(blk)[0], [None, rows])
    sch.merge(sch.get_loops(anchor)[0], sch.get_loops(blk)[0])
    row = sch.merge(sch.get_loops(anchor)[1], sch.get_loops(sch.get_sblock(name))[1])
    return sch.get_loops(anchor)[0], row


def _vector_io(sch, blk, outer, skip=()):
    """Stage a thread's `vec` consecutive elements of each 2-D operand and of the weights
    (gamma, beta) in registers, so the global accesses are single vector loads/stores while the
    fp32 math on them stays scalar. Scalar weight loads were most of the dx kernel's load
    instructions: per row and stage one 2-byte load per element, 8 for each 16-byte load of dy
    or x. (consumer_blocks names only ``blk`` itself: Trace.simplified() drops block RVs that
    appear nowhere but inside consumer_blocks, and MetaSchedule could then not replay the
    trace.)"""
    names = [r.source.name for r in sch.get(blk).reads
             if (len(r.source.shape) == 2 or r.source.name in WEIGHT_OPERANDS)
             and r.source.scope() == "global" and r.source.name not in skip]
    for name in names:
        idx = [r.source.name for r in sch.get(blk).reads].index(name)
        cache = sch.cache_read(blk, idx, "local", consumer_blocks=[blk])
        sch.compute_at(cache, outer, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(cache)[-1])
    if is_output(sch, blk) and not is_reduction(sch, blk):
        wb = sch.cache_write(blk, 0, "local")
        sch.reverse_compute_at(wb, outer, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(wb)[-1])


def _row_scalars(sch, row, group: int = 1):
    """Load the per-row statistics (dx's mu and rsigma) into registers once per row (``row``: the
    row loop) for every stage that reads them, where nvcc loaded them again for every element.
    The loads take the row guard from the buffers' extent, as the row registers do. With
    ``group`` > 1 ``row`` is a group of that many rows, whose statistics are indexed by the
    row's place in the group (as _thread_layout's rows; compaction alone sized them as every
    row of the launch)."""
    root = sch.get_sblock("root")
    for name in ROW_STAT_OPERANDS:
        readers = [b for b in sch.get_child_blocks(root) if any(r.source.name == name for r in sch.get(b).reads)]
        if readers:
            idx = [r.source.name for r in sch.get(readers[0]).reads].index(name)
            cache = sch.cache_read(readers[0], idx, "local", consumer_blocks=readers)
            sch.compute_at(cache, row, preserve_unit_loops=True)
            if group > 1:
                sch.unroll(sch.get_loops(cache)[-1])
                sch.transform_layout(cache, ("write", 0), lambda i: (i % group,), assume_injective_transform=True)


def schedule_rows_cuda(func, cfg: CudaRowConfig, sch=None):
    """One row per (threadIdx.y, blockIdx.x); every stage of the row inside that block.

    Per-row scalars (sum of squares, mean, rsigma, ...) live in registers: the allreduce leaves
    each reduction's result in every thread of the row, and the scalar stages after it run
    redundantly in every thread, so no shared memory and no barrier is needed between the
    reduction and the output stage (a barrier inside the row-tail predicate is illegal, and a
    global rsigma written by one thread and read by others would race). Only the stores of
    per-row outputs are done by one thread.

    In the fused dx kernel (a ``part`` block) the unit of a (threadIdx.y, blockIdx.x) lane is a
    chunk of T rows instead of one row: the lane walks the chunk's rows serially and keeps the
    running dgamma/dbeta sums in registers (``_cuda_partials``); ``rows`` counts chunks per
    block there.
    """
    sch = sch or Schedule(func)
    part = _named_block(sch, PART_BLOCK)
    group_sums = None
    # the row operands loaded once into registers that every stage reads: the stages' loops
    # then index registers (constant indices, fully unrolled)
    kept = ROW_OPERANDS if part is not None else FWD_ROW_OPERANDS if cfg.keep_row else ()
    if part is None and cfg.early_weights:
        kept = WEIGHT_OPERANDS + kept
    if part is None and cfg.chunk_weights:
        raise ValueError("chunk_weights is a dx schedule: a forward's block holds no chunk of rows")
    y_stage = _named_block(sch, FP8_Y_STAGE)
    fp8_y = y_stage is not None
    if y_stage is not None and not cfg.keep_y:
        sch.compute_inline(y_stage)  # recomputed by the store and by amax
        y_stage = None
    add_stage = _named_block(sch, ADD_STAGE)
    apart = ()
    if add_stage is not None and not cfg.keep_row:
        # fwd_add without the row kept: x + residual added again by the row sums, y and the
        # store of h, which so reads nothing the row's chain writes
        sch.compute_inline(add_stage)
        add_stage, apart = None, ("h",)
    warp_sums = {}
    if part is None:
        if cfg.warp_sums:
            warp_sums = _warp_sums(sch, cfg)
        anchor = _anchor(sch, apart)
        bx, ty = sch.split(sch.get_loops(anchor)[0], [None, cfg.rows])
        blocks = _gather_under(sch, anchor, ty, apart)
        for name in apart:
            bx, ty = _merge_rows(sch, anchor, name, cfg.rows)
        depth = 2
        _annotate_row_loop(sch, ty, cfg)
    elif cfg.warp_sums or cfg.early_weights:
        raise ValueError("warp_sums and early_weights are forward schedules; the dx kernel keeps one allreduce "
                         "per row and reads gamma before its first")
    else:
        if cfg.chunk_weights:
            kept = kept + ("gamma",)
        blocks = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint != PART_BLOCK]
        grouped = _rows_per_group(sch)
        if grouped > 1:
            # the group of rows is the compute's (one reduction of P rows): it is the prefetch
            cfg = dataclasses.replace(cfg, prefetch=grouped)
            if cfg.stages > 1:
                raise ValueError("a dx kernel of grouped row sums is not pipelined (stages must be 1)")
            q, group = _chunk_rows(sch, blocks, part, grouped)
            group_sums = blocks[0]
            bx, ty = sch.split(q, [None, cfg.rows])
            for blk in blocks[1:] + [part]:
                sch.unroll(sch.get_loops(blk)[3])  # the group's rows index its registers
            _annotate_if_set(sch, group, HOIST_INITS, cfg.hoist_inits)
            _row_scalars(sch, group, grouped)
        else:
            q, t = _chunk_rows(sch, blocks, part)
            bx, ty = sch.split(q, [None, cfg.rows])
            group, row = sch.split(t, [None, cfg.prefetch])
            sch.unroll(row)  # the rows' registers are indexed by it: constant indices
            _annotate_row_loop(sch, group, cfg)
            _row_scalars(sch, row)
        depth = 4  # (block, chunk lane, group of rows, row of the group)
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    if not isinstance(cfg.min_blocks, int) or cfg.min_blocks > 1:  # a sampled value is annotated whatever it is
        sch.annotate(bx, MIN_BLOCKS_PER_SM, cfg.min_blocks)
    for blk in blocks:
        name = sch.get(blk).name_hint
        scope = sch.get(blk).writes[0].source.scope()
        if not is_output(sch, blk) and scope == "global":
            for idx in range(len(sch.get(blk).writes)):  # a tuple reduction writes several
                sch.set_scope(blk, idx, "local")
            scope = "local"
        two_d = len(sch.get(blk).iter_vars) == 2
        if not two_d and scope == "local" and not is_reduction(sch, blk):
            continue  # a per-row scalar computed by every thread of the row
        if name in warp_sums.values():
            if cfg.shuffle_sums:
                # its loops are (..., warp, unit row): the warps' sums one a lane, the reduction
                # over them then lowered to shuffles within each warp (every warp gets the sum).
                # Split to a whole warp of lanes first: bound as it is, a loop of fewer than 32
                # lost its guard in the lowering, and the lanes past the last warp read (and
                # added) shared memory beyond the sums; the split's predicate keeps them out.
                warp, unit = sch.get_loops(blk)[-2:]
                sch.reorder(unit, warp)
                sch.bind(sch.split(warp, [None, 32])[1], "threadIdx.x")
            continue  # else the sum of the warps' sums, by every thread of the row
        if name in warp_sums:
            outer, w, lane, v = _warp_sum_loops(sch, blk)
            lanes, two_d = (w, lane), True
        else:
            # a grouped reduction (the anchor) has no row loop of its own under the group
            loop = _inner_loop(sch, blk, depth - (blk is group_sums))
            outer, lanes, v = _split_columns(sch, loop, cfg, cfg.vec if two_d else 1)
        sch.reorder(*lanes, outer, v)
        _bind(sch, lanes)
        # loads and stores are `vec` wide; the fp32 math on them stays scalar per element
        # (NVRTC rejects float32x8 arithmetic) and is unrolled
        if two_d:
            _vector_io(sch, blk, outer, skip=kept)
        if fp8_y and name == "y" and cfg.paired_cast and cfg.vec % 2 == 0:
            # the hardware converts two floats per instruction; one a column took a cvt of the
            # value and a zero, then byte shuffles to pack the results for the vector store. A
            # y recomputed by the store pairs too (its fp32 math then runs on float2 pairs): the
            # records that chose it, layernorm 1024's among them, cast one column at a time:
            # 568 -> 488 SASS instructions there (bench/results/sass-fp8-paired-cast.txt)
            v, pair = sch.split(v, [None, 2])
            sch.vectorize(pair)
        if kept:
            # they index the row registers: constant indices, whatever `unroll`
            sch.unroll(outer)
            sch.unroll(v)
        else:
            sch.annotate(outer, "pragma_auto_unroll_max_step", cfg.unroll)
            sch.annotate(outer, "pragma_unroll_explicit", 1)
    if part is None and kept:
        _cuda_row_registers(sch, ty, cfg, kept, rows=False)
    for stage in (y_stage, add_stage):
        if stage is not None:
            # per-thread registers, as the kept row's (see _cuda_partials for why the assumption)
            sch.transform_layout(stage, ("write", 0), _thread_layout(cfg), assume_injective_transform=True)
    if part is not None:
        if cfg.staged:
            _cuda_row_shared(sch, group, cfg, ROW_OPERANDS)
        else:
            _cuda_row_registers(sch, group, cfg, ROW_OPERANDS, rows=True)
        if cfg.chunk_weights:
            _cuda_row_registers(sch, ty, cfg, ("gamma",), rows=False)
        _cuda_partials(sch, ty, cfg)
        if cfg.stages > 1:
            _cuda_pipeline(sch, group, cfg.stages, copies_async=cfg.staged)
    elif cfg.staged:
        raise ValueError("staged is a dx schedule: a forward's rows are not walked in groups")
    else:
        for knob in DX_SUM_KNOBS:
            value = getattr(cfg, knob)
            if not isinstance(value, int) or value:
                raise ValueError(f"{knob} is a dx schedule: a forward keeps no running sums")
    return sch


def _annotate_row_loop(sch, loop, cfg: CudaRowConfig) -> None:
    """Mark the loop over a block's rows (the forward's rows of a block, the dx walk over a
    chunk's groups) for the passes of _tvm: FULL_CHUNK, STREAM_LOADS and HOIST_INITS (a sampled
    value is annotated whatever it is)."""
    for key, value in ((FULL_CHUNK, cfg.full_chunks), (STREAM_LOADS, cfg.stream), (HOIST_INITS, cfg.hoist_inits)):
        _annotate_if_set(sch, loop, key, value)


def _annotate_if_set(sch, loop, key: str, value) -> None:
    """Annotate ``loop`` with ``value`` unless it is a plain 0 (a sampled value is annotated
    whatever it is: the trace must hold the decision)."""
    if not isinstance(value, int) or value:
        sch.annotate(loop, key, value)


# The fused dx kernel's operands that every stage of a row reads (the reductions, dx and the
# partial sums): loaded once into registers shared by all of them.
ROW_OPERANDS = ("dy", "x")
# The forward's (the reductions, y and fp8's amax; fwd_add's add, of x and the residual), with
# ``keep_row``; and the decode backward's dx (compute.norms.dx without partials, scheduled as a
# forward), which reads dy too.
FWD_ROW_OPERANDS = ("dy", "x", "residual")


def _thread_layout(cfg: CudaRowConfig, rows: bool = False):
    """The index map that drops the threadIdx.x component of a column, for per-thread register
    buffers: (..., j) -> (..., j // (threads*vec), j % vec), and with ``rows`` also the row's
    place outside its group of ``prefetch`` rows, (i, j) -> (i % prefetch, ...) (T is a
    multiple of prefetch, so a group's rows are distinct mod prefetch; left to compaction, a
    row with a column tail came out as min(n, prefetch) rows, which CUDA codegen cannot
    allocate). See _cuda_partials for why TVM must be told to assume the map injective."""
    threads, vec, group = cfg.threads, cfg.vec, cfg.prefetch
    if not all(isinstance(v, int) for v in (threads, vec, group)):
        raise TypeError("a kernel keeping rows in registers needs plain ints for threads, vec and prefetch: the "
                        "register layout of its row operands and partial sums depends on them")
    step = threads * vec
    if rows:
        return lambda i, j: (i % group, j // step, j % vec)
    return lambda *idx: (*idx[:-1], idx[-1] // step, idx[-1] % vec)


def _split_columns(sch, loop, cfg: CudaRowConfig, vec: int):
    """Split a column loop as every stage does, j = (o*threads + t)*vec + v, with t = w*32 +
    lane under ``warp_sums`` (the warp w goes to threadIdx.z, the lane to threadIdx.x: _bind):
    a thread then holds the same columns in every stage and buffer (which the register layout
    of _thread_layout relies on). Returns (o, the thread loops, v)."""
    if cfg.warp_sums:
        o, w, lane, v = sch.split(loop, [None, cfg.threads // 32, 32, vec])
        return o, (w, lane), v
    o, tx, v = sch.split(loop, [None, cfg.threads, vec])
    return o, (tx,), v


def _bind(sch, lanes):
    for lp, axis in zip(lanes, ("threadIdx.z", "threadIdx.x")[-len(lanes):]):
        sch.bind(lp, axis)


def _thread_columns(sch, loop, cfg: CudaRowConfig):
    """_split_columns with the vector width of the rows, its thread loops bound."""
    o, lanes, v = _split_columns(sch, loop, cfg, cfg.vec)
    _bind(sch, lanes)
    return o, lanes, v


def warp_sums_problem(threads: int, rows: int, vec: int, hidden: int | None = None) -> str | None:
    """Why a forward of ``threads`` x ``vec`` columns a step, ``rows`` rows a block (and
    ``hidden`` columns, where known) cannot take warp_sums, or None: it needs rows of 2 or more
    whole warps, one row a block (its barrier would sit under the last block's row guard, which
    some threads skip) and columns that threads x vec split evenly (a predicated column tail
    does not survive the rfactor)."""
    if threads % 32 or threads < 64:
        return f"warp_sums needs rows of 2 or more whole warps, got {threads} threads"
    if rows != 1:
        return f"warp_sums needs one row per block, got {rows}"
    if hidden is not None and hidden % (threads * vec):
        return f"warp_sums needs rows that {threads} threads x {vec} split evenly, got {hidden}"
    return None


def _warp_sum_loops(sch, rf):
    """The loops of a block _warp_sums rfactored, (o, warp, lane, v), found by the block's
    iterators (warp, row, o, lane, v): reverse_compute_at rebuilds a block's loops in that
    order, the anchor keeps the split's."""
    loops = sch.get_loops(rf)
    by_var = {sch.get(lp).loop_var.name: lp for lp in loops}
    values = sch.get(loops[-1]).body.iter_values
    w, o, lane, v = (by_var[values[i].name] for i in (0, 2, 3, 4))
    return o, w, lane, v


def _warp_sums(sch, cfg: CudaRowConfig) -> dict:
    """Every row sum of the forward in two steps (``warp_sums``): each warp's lanes reduce
    their columns' sums with shuffles alone (a cross-thread reduction over 32 threadIdx.x lanes
    is one warp's), into shared memory at the warp's place (rfactor by warp, threadIdx.z), and
    then every thread of the row adds the warps' sums itself. ThreadSync puts one barrier
    between the two; TVM's own allreduce over several warps takes two (after the warps' sums,
    and after warp 0 reduced them). Returns the rfactored block -> the name of its sum block."""
    done = {}
    rows = cfg.rows if isinstance(cfg.rows, int) else int(sch.get(cfg.rows))  # a sampled value
    for blk in list(sch.get_child_blocks(sch.get_sblock("root"))):
        if not (is_reduction(sch, blk) and len(sch.get(blk).iter_vars) == 2):
            continue
        name = sch.get(blk).name_hint
        cols = sch.get_loops(blk)[-1]
        problem = warp_sums_problem(cfg.threads, rows, cfg.vec, int(sch.get(cols).extent))  # a static width
        if problem:
            raise ValueError(problem)
        warp = sch.split(cols, [None, cfg.threads // 32, 32, cfg.vec])[1]
        rf = sch.rfactor(warp, factor_axis=0)
        for idx in range(len(sch.get(rf).writes)):
            sch.set_scope(rf, idx, "shared")
        done[sch.get(rf).name_hint] = name
    return done


def _cuda_row_registers(sch, loop, cfg: CudaRowConfig, operands, rows: bool):
    """Load the row's ``operands`` into registers at the top of ``loop``, one vector load
    (``vec`` elements, up to 16 bytes) per thread and vector, and let every stage read them
    from there: each element is read from memory once.

    Fused dx (``rows``: ``loop`` is a group of ``prefetch`` rows of a chunk): dy and x of the
    group's rows, read by the row reductions, dx and the partial sums, so the loads of the
    group's rows are all in flight before the first reduction's barrier. A chunk is walked
    serially, so without the group the kernel had one row in flight per chunk (512 chunks of
    ~4 KB at hidden 1024: 2 MB, a quarter of what the H200 needs to reach copy bandwidth).

    Forward (``keep_row``, ``loop`` is the row's): x, read by the reductions, the output and
    fp8's amax, which otherwise each load it again (from L1 or L2 after the first), as
    torch.compile's persistent reduction keeps the whole row in registers.

    With ``early_weights`` the operands start with the forward's weights (gamma, beta: one
    row's worth, the same for every row), and every load goes to the top of the row, the
    weights' too: compute_at alone puts a load right before its first reader, which for the
    weights is the output stage, after the row sums' barriers, so each block waited on them
    (from L2) once its sums were done. torch.compile's and Liger's forwards load the weight
    with x, before the sum.

    Fused dx with ``chunk_weights`` (``operands`` gamma, ``loop`` the chunk lane): gamma once
    before the lane's walk, as Liger's backward holds the weight for all the rows of a program;
    otherwise each row's sums and its dx stage load it again (L1 hits, but two loads and
    conversions a vector and row, and a wait after each row's barriers)."""
    layout = _thread_layout(cfg, rows=rows)
    root = sch.get_sblock("root")
    for name in operands:
        readers = [b for b in sch.get_child_blocks(root)
                   if any(r.source.name == name for r in sch.get(b).reads)]
        if not readers:
            continue  # rmsnorm has no beta
        idx = [r.source.name for r in sch.get(readers[0]).reads].index(name)
        cache = sch.cache_read(readers[0], idx, "local", consumer_blocks=readers)
        # no producers: -2 is the top of the row loop, and the later operands go before the earlier
        sch.compute_at(cache, loop, preserve_unit_loops=True, index=-2 if cfg.early_weights else -1)
        if name in WEIGHT_OPERANDS:
            o, lanes, v = _thread_columns(sch, sch.get_loops(cache)[-1], cfg)
            sch.reorder(*lanes, o, v)
        else:
            row, cols = sch.get_loops(cache)[-2:]
            o, lanes, v = _thread_columns(sch, cols, cfg)
            sch.reorder(*lanes, row, o, v)
            sch.unroll(row)
        sch.unroll(o)
        sch.vectorize(v)
        sch.transform_layout(cache, ("write", 0), layout, assume_injective_transform=True)


def _cuda_row_shared(sch, group, cfg: CudaRowConfig, operands):
    """Fused dx with ``staged``: the group's rows of dy and x are copied into shared memory at
    the top of ``group`` (each thread copies the vectors of the columns it computes, one 16-byte
    cp.async each once _cuda_pipeline marks the copies' stage asynchronous), then into the
    group's row registers (_cuda_row_registers) as vectors, which every stage reads. With the
    rows only in registers, each group in flight costs a thread prefetch * vectors * vec
    registers per operand, and the layernorm dx records took 186-255 registers with their SMs
    14-27 warps deep, stalled on global loads (the twelfth lease's Nsight Compute): here the
    groups in flight cost shared memory, ``stages`` groups of both operands per chunk lane
    (``staged_shared_bytes``), and the registers hold one group. The first form, whose stages
    read each element from shared memory (a 2-byte load per element, operand and stage), ran
    1.35-1.75x slower than the default's dx on the H200 (bench/results/h200-run26/). Each thread
    reads back only what it copied, but ThreadSync cannot tell: it puts a barrier between the
    copies' wait and the reads, and another before a buffer is refilled."""
    rows_buf = next(p for p in sch.mod["main"].params if p.name == operands[0])
    hidden, elem_bytes = int(rows_buf.shape[-1]), rows_buf.dtype.itemsize
    if cfg.vec * elem_bytes not in CP_ASYNC_BYTES:
        raise ValueError(f"staged rows need vectors of 4, 8 or 16 bytes, what one cp.async copies; got {cfg.vec} "
                         f"elements of {elem_bytes} bytes")
    need = staged_shared_bytes(hidden, elem_bytes, cfg.prefetch, cfg.stages)
    if need > STAGED_SHARED_BYTES:
        raise ValueError(f"staged rows take {need} bytes of shared memory ({cfg.stages} groups of {cfg.prefetch} rows "
                         f"of dy and x at hidden {hidden}), more than the {STAGED_SHARED_BYTES} a block may "
                         "hold statically")
    _cuda_row_registers(sch, group, cfg, operands, rows=True)
    group_rows = cfg.prefetch
    for name in operands:
        registers = [b for b in sch.get_child_blocks(group) if sch.get(b).name_hint == f"{name}_local"]
        if not registers:
            continue  # rmsnorm has no beta
        cache = sch.cache_read(registers[0], 0, "shared")
        sch.compute_at(cache, group, preserve_unit_loops=True, index=-1)
        row, cols = sch.get_loops(cache)[-2:]
        o, lanes, v = _thread_columns(sch, cols, cfg)
        sch.reorder(*lanes, row, o, v)
        for lp in (row, o):
            sch.unroll(lp)
        sch.vectorize(v)
        # a row's place in its group (as _thread_layout's rows: left to compaction, the buffer's
        # size depends on the row count, which CUDA codegen cannot allocate)
        sch.transform_layout(cache, ("write", 0), lambda i, j: (i % group_rows, j), assume_injective_transform=True)


# The static shared memory a block may hold is 48 KB, less the row sums' allreduce's
STAGED_SHARED_BYTES = BLOCK_SHARED_BYTES - ALLREDUCE_SHARED_BYTES
# The sizes one cp.async copies: a staged dx's vectors must be one of them
CP_ASYNC_BYTES = (4, 8, 16)


def staged_shared_bytes(hidden: int, elem_bytes: int, prefetch: int, stages: int) -> int:
    """Shared memory a staged dx block (one chunk lane) holds for its rows: ``stages`` groups of
    ``prefetch`` rows of dy and x."""
    return 2 * stages * prefetch * hidden * elem_bytes


def thread_vectors(hidden: int, threads: int, vec: int) -> int:
    """Vectors of ``vec`` elements each of ``threads`` threads handles of a row of ``hidden``
    (the last one in part where they do not divide it)."""
    return -(-hidden // (threads * vec))


def dx_shared_bytes(column_sums: int, hidden: int, elem_bytes: int, cfg: CudaRowConfig) -> tuple:
    """(dynamic, static) shared memory of a fused dx block with its running sums in shared
    memory (shared_sums): the S sums of each thread of every chunk lane, and a staged variant's
    rows in flight (staged_shared_bytes) with the allreduce's scratch."""
    per_thread = thread_vectors(hidden, cfg.threads, cfg.vec) * cfg.vec
    rows = staged_shared_bytes(hidden, elem_bytes, cfg.prefetch, cfg.stages) if cfg.staged else 0
    return 4 * column_sums * per_thread * cfg.threads * cfg.rows, rows + ALLREDUCE_SHARED_BYTES


def _cuda_pipeline(sch, group, stages: int, copies_async: bool = False):
    """Software-pipeline the walk over a chunk's groups of rows: the loads of group g + stages - 1
    are issued before group g is computed, into another copy of the row registers, so a lane's
    loads overlap its row reductions and their barriers instead of alternating with them (on the
    H200 that gained 1-9% at some sizes and lost at others: space.STAGES). InjectSoftwarePipeline
    makes `stages` versions of the row registers, indexed by the group's number modulo `stages`;
    the group loop is unrolled ``stages`` times (_tvm.UNROLL_BY) so those indices are constants
    (registers, not local memory). Unrolled whole, the walk let ptxas hoist every later row's
    loads: registers grew or spilled and the kernel ran 1.0-5.2x slower
    (bench/results/h200-bwd-parts-2.log). The group loop's body is the loads of dy and x
    (_cuda_row_registers put them first) and then the loop over the group's rows.

    With ``copies_async`` (staged rows, _cuda_row_shared) the body is each operand's copy into
    shared memory and its copy from there into registers, then the rows: the copies into shared
    memory are the early stage, asynchronous (InjectPTXAsyncCopy, _tvm.PASS_CONFIG's
    use_async_copy, makes them cp.async, committed as one group per group of rows and waited for
    ``stages`` - 1 groups behind), and `stages` versions of the shared buffers are made instead;
    the copies into registers go with the rows, one version. Shared memory takes the version from
    the group's number, so the walk stays rolled: at six of layernorm 1024's staged variants
    ptxas then took 16-87 registers fewer, or as many (64 x 4 threads x vec, two rows a group,
    four groups: 255 with 220 B of spill loads unrolled, 168 and none rolled), for half the code."""
    body = sch.get(group).body
    children = len(body.seq) if hasattr(body, "seq") else 1
    copies = [sch.get(b).name_hint for b in sch.get_child_blocks(group)][:children - 1]
    if children != len(ROW_OPERANDS) * (2 if copies_async else 1) + 1:
        raise ValueError(f"expected the row loads and the row loop under the group loop, got {children} statements")
    early = [name.endswith("_shared") if copies_async else True for name in copies] + [False]
    sch.annotate(group, "software_pipeline_stage", [0 if e else stages - 1 for e in early])
    # the early stage's statements first, each group in its own order
    order = sorted(range(children), key=lambda i: (not early[i], i))
    sch.annotate(group, "software_pipeline_order", [order.index(i) for i in range(children)])
    if copies_async:
        sch.annotate(group, "software_pipeline_async_stages", [0])
    else:
        sch.annotate(group, UNROLL_BY, stages)


def _cuda_partials(sch, lane, cfg: CudaRowConfig):
    """The fused dx kernel's running sums in registers. Each thread owns the columns
    j = (o * threads + threadIdx.x) * vec + v of its chunk (the columns it also handles in the
    dx stages), accumulates dy*xhat (and dy) for them over the chunk's rows, and stores them to
    its partial row once, after the row walk.

    TVM alone cannot place them in registers: the sums must live across the row loop, which
    holds every stage's own threadIdx.x loop, so the buffer is allocated above the thread
    loops, and CompactBufferAllocation relaxes every loop below an allocation, thread-bound
    ones included: the per-thread buffer came out as the whole row (S*H floats of local
    memory, read-modified-written in L1/L2 per row: slower than two passes on the H200). The
    layout transform below drops the threadIdx.x component from the buffer's index,
    (s, j) -> (s, j // (threads*vec), j % vec). That is not injective over the whole row,
    which is why TVM must be told to assume it is: a "local" buffer is private to each thread
    after lowering, and within one thread the map is injective, so each thread gets
    S * ceil(H / (threads*vec)) * vec floats with constant indices (unrolled loops), which
    nvcc keeps in registers. (Shared memory was tried too: ThreadSync cannot see that each
    thread touches only its own elements and put a barrier between every pair of accesses.)

    The map is a constant of the trace, so ``threads`` and ``vec`` must be plain ints here
    (the design space makes them structural variants for the fused kernel)."""
    layout = _thread_layout(cfg)
    part = sch.get_sblock(PART_BLOCK)
    acc = sch.cache_write(part, 0, "local")
    sch.reverse_compute_at(acc, lane, preserve_unit_loops=True)
    part = sch.get_sblock(PART_BLOCK)
    s_, j = sch.get_loops(part)[4:]
    o, lanes, v = _thread_columns(sch, j, cfg)
    sch.reorder(*lanes, s_, o, v)
    for lp in (s_, o, v):
        sch.unroll(lp)  # constant register indices
    s2, q2, j2 = sch.get_loops(acc)[2:]  # the store of the sums, once per chunk
    o2, lanes2, v2 = _thread_columns(sch, j2, cfg)
    sch.reorder(*lanes2, s2, q2, o2, v2)
    for lp in (s2, o2, v2):
        sch.unroll(lp)
    sch.transform_layout(part, ("write", 0), layout, assume_injective_transform=True)
    # where the sums then live: registers, or (_tvm.SHARED_SUMS) each thread's slots in shared
    # memory, moved there after TVM's ThreadSync, which would put a barrier at every access (and
    # which refuses sums that cannot launch beside the kernel's other shared memory)
    _annotate_if_set(sch, lane, SHARED_SUMS, cfg.shared_sums)


def _cpu_row_divides(hidden: int, cfg: CpuRowConfig) -> None:
    """Refuse a point whose vector lanes x accumulators or output step does not divide the row
    (space.llvm_choices draws only those that do): a reduction's predicated tail does not
    survive reverse_compute_at, and such a kernel computed wrong sums without a word."""
    knobs = {"vec * acc": (cfg.vec, cfg.acc), "vec * unroll": (cfg.vec, cfg.unroll)}
    for name, (a, b) in knobs.items():
        if isinstance(a, int) and isinstance(b, int) and hidden % (a * b):
            raise ValueError(f"{name} = {a} * {b} must divide the row of {hidden} elements on llvm")


def _cpu_rfactor(sch, blk, acc, vec):
    """Split a per-row reduction over the hidden axis so it runs in SIMD lanes with ``acc``
    independent vector accumulators: k -> (ko, acc*vec); rfactor the inner part (rf1: per-lane
    partial sums over ko), then rfactor the acc*vec lanes down to ``vec`` (rf2: acc vector adds),
    leaving a ``vec``-lane horizontal sum in the original block. Returns (rf1, rf2). Done on the
    flat function, before the stages are gathered under the row loop (rfactor copies the outer
    loops of the block into a new nest)."""
    _, k = sch.get_loops(blk)
    ko, ka, kv = sch.split(k, [None, acc, vec])
    rf1 = sch.rfactor(sch.fuse(ka, kv), 1)
    _, kw = sch.get_loops(blk)
    _, kv2 = sch.split(kw, [None, vec])
    rf2 = sch.rfactor(kv2, 1)
    return rf1, rf2


def schedule_rows_cpu(func, cfg: CpuRowConfig, sch=None):
    """Rows are parallel tasks; every stage of a row runs inside the task, so per-row temporaries
    shrink to scalars (or one vector of lanes). Per-row reductions run in ``vec`` SIMD lanes with
    ``acc`` accumulators (two rfactors, see ``_cpu_rfactor``), spatial stages are vectorised
    along the hidden axis. In the fused dx kernel a task is ``rows`` chunks of T rows, walked
    serially, and the partial sums of a chunk are accumulated in ``vec``-lane vectors.

    Only the loop structure decides what is done here, never a knob's value (the knobs may be
    MetaSchedule random variables, so the same instructions must replay for every sample)."""
    sch = sch or Schedule(func)
    root = sch.get_sblock("root")
    part = _named_block(sch, PART_BLOCK)
    # fwd_add's x + residual stays a stage of its own (the anchor, which every later stage of
    # the row reads): inlined into the norm's fp32 math, llvm's lowering (BF16ComputeLegalize)
    # would drop h's bf16 rounding, as if bf16 were only storage
    for blk in list(sch.get_child_blocks(root)):
        if is_reduction(sch, blk) and len(sch.get(blk).iter_vars) == 2:
            _cpu_row_divides(int(sch.get(sch.get_loops(blk)[-1]).extent), cfg)
            _cpu_rfactor(sch, blk, cfg.acc, cfg.vec)
    blocks = [b for b in sch.get_child_blocks(root) if sch.get(b).name_hint != PART_BLOCK]
    anchor = blocks[0]
    if part is None:
        task, r = sch.split(sch.get_loops(anchor)[0], [None, cfg.rows])
        sch.parallel(task)
        for blk in blocks[1:]:
            sch.reverse_compute_at(blk, r, preserve_unit_loops=True)
        depth = 2
    else:
        part = sch.get_sblock(PART_BLOCK)  # rfactor replaced the block RVs' function
        q, t = _chunk_rows(sch, blocks, part)
        _annotate_if_set(sch, t, FULL_CHUNK, cfg.full_chunks)
        task, _ = sch.split(q, [None, cfg.rows])
        sch.parallel(task)
        depth = 3  # (task, chunk of the task, row of the chunk)
    # each block's loops below the row loops, in block-iter order (spatial first, then reduce)
    rf1s, rf2s = blocks_kind(sch, blocks)
    for idx, blk in enumerate(blocks):
        loops = sch.get_loops(blk)[depth:]
        if idx in rf1s:
            # the anchor keeps its own order (ko, lanes); moved blocks come as (lanes, row, ko)
            if idx == 0:
                ko, lanes = loops
            else:
                lanes, unit, ko = loops
                sch.reorder(unit, ko, lanes)
            ka, kv = sch.split(lanes, [None, cfg.vec])
            sch.vectorize(kv)
            sch.unroll(ka)
            init = sch.decompose_reduction(blk, ko)
            ia, iv = sch.split(sch.get_loops(init)[-1], [None, cfg.vec])
            sch.vectorize(iv)
        elif idx in rf2s:
            lanes, unit, ka = loops
            sch.reorder(unit, ka, lanes)
            sch.vectorize(lanes)
        elif len(sch.get(blk).iter_vars) == 2 and not is_reduction(sch, blk):
            j = loops[-1]  # (the row's unit loop, j) but for the anchor: fwd_add's sum
            jo, ju, jv = sch.split(j, [None, cfg.unroll, cfg.vec])
            sch.vectorize(jv)
            sch.unroll(ju)
    if part is not None:
        # (s, j): the running sums of a row step are vec-lane vector adds
        _, j = sch.get_loops(part)[depth:]
        _, jv = sch.split(j, [None, cfg.vec])
        sch.vectorize(jv)
    return sch


def blocks_kind(sch, blocks):
    """Indices of the first and second rfactor blocks (see ``_cpu_rfactor``) among ``blocks``:
    a reduction whose only 2-D read is a 2-D temporary is a second-level one."""
    root = sch.get(sch.get_sblock("root"))
    temps = {b.name for b in root.alloc_buffers}
    rf1s, rf2s = set(), set()
    for idx, blk in enumerate(blocks):
        b = sch.get(blk)
        if not is_reduction(sch, blk) or len(b.iter_vars) != 3:
            continue
        reads2d = [r.source.name for r in b.reads if len(r.source.shape) == 2]
        (rf2s if reads2d and all(n in temps for n in reads2d) else rf1s).add(idx)
    return rf1s, rf2s
