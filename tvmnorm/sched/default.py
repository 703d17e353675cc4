"""The general fallback rule: a schedule for any key, any hidden size, any row count.

It is correct for every shape (odd hidden sizes get predicated tails) and reasonable, not
tuned: tuned records in ``schedules/`` beat it. The rule is the shared row schedule with knob
values from a heuristic, so fallback and tuned kernels have the same structure.
"""
from __future__ import annotations

import dataclasses

from .._tvm import Schedule
from ..compute.norms import ROWS_PER_PARTIAL_ATTR
from .rows import (ROW_OPERANDS, CpuRowConfig, CudaRowConfig, is_fused, schedule_rows_cpu, schedule_rows_cuda,
                   thread_vectors, warp_sums_problem)
from .space import EARLY_WEIGHTS_THREADS, fused_register_limit, fused_registers, shuffles_warp_sums, staged_fits

ROW_PARTS = ("fwd", "dx")


def _pow2_at_least(v: int) -> int:
    p = 1
    while p < v:
        p *= 2
    return p


def _widest_vector(hidden: int, elem_bytes: int, most_bytes: int) -> int:
    """Elements in the widest vector of 16/8/4/2 bytes, at most ``most_bytes``, of whole
    elements that divides the row (1 if none does)."""
    return next((n // elem_bytes for n in (16, 8, 4, 2) if elem_bytes <= n <= most_bytes and n % elem_bytes == 0
                 and (hidden * elem_bytes) % n == 0), 1)


def cuda_row_heuristic(hidden: int, elem_bytes: int, vectors_per_thread: int = 8) -> CudaRowConfig:
    """Vector width: the widest of 16/8/4/2/1 bytes that divides the row, so every thread's
    chunk is aligned (TE's rule: hidden * size % (threads * bytes_per_load) == 0 for no tail).
    Threads: enough that each thread holds <= ``vectors_per_thread`` vectors (8; 2 in the fused
    dx kernel, whose threads also keep a running sum per element in registers), one warp at
    least when the row has the work, at most 1024. Small rows share a block so that a block
    has >= 128 threads."""
    vec = _widest_vector(hidden, elem_bytes, 16)
    vectors = -(-hidden // vec)
    threads = min(1024, max(32, _pow2_at_least(-(-vectors // vectors_per_thread))))
    if vectors < 32:
        threads = max(4, _pow2_at_least(vectors))
    rows = max(1, min(1024 // threads, 128 // threads)) if threads < 128 else 1
    return CudaRowConfig(threads=threads, rows=rows, vec=vec, unroll=256)


# Bytes of the row one thread of the default forward may keep in registers (32 registers; a
# 1024-thread block leaves a thread 64 in all). Wider rows (fp32 at hidden 65536) are loaded
# by each stage instead.
KEPT_ROW_BYTES = 128


def fwd_cuda_heuristic(hidden: int, elem_bytes: int) -> CudaRowConfig:
    """The forward keeps its row of x in registers (keep_row: read from memory once), in
    8-byte vectors, 128 to 1024 threads per row with about 8 vectors each; rows of fewer than
    128 such vectors take 16-byte vectors, 2 per thread, and share a block (128 threads).
    Measured on the H200 (bf16, 16384 tokens; bench/results/h200-fwd-probe.log) against the
    earlier rule (16-byte vectors, ~8 per thread, x loaded by each stage): the kept row in
    these shapes took 71.7/73.3 us instead of 93.4/107.4 at rmsnorm/layernorm 4096, 118.8/
    120.6 instead of 120.2/157.0 at 7168, 135.5/136.7 instead of 137.1/176.8 at 8192, and
    72.5/74.4 instead of 75.1/99.5 at 128; 16-byte vectors with the row kept ran up to 1.3x
    slower than 8-byte ones at layernorm 4096-8192. Rows too wide to keep (KEPT_ROW_BYTES) and
    rows narrower than 4 threads' vectors get cuda_row_heuristic's schedule. With fp8 output y
    is kept in registers too (keep_y): ptxas gave layernorm 7168's kernel 48 registers with it,
    64 without (y, gamma and beta again for amax)."""
    vec = _widest_vector(hidden, elem_bytes, 8)
    vectors = -(-hidden // vec)
    if vectors >= 128:
        threads = min(1024, max(128, _pow2_at_least(-(-vectors // 8))))
        if -(-vectors // threads) * vec * elem_bytes > KEPT_ROW_BYTES:
            return cuda_row_heuristic(hidden, elem_bytes)  # the row would not fit: loaded per stage
        return CudaRowConfig(threads=threads, rows=1, vec=vec, unroll=256, keep_row=True, keep_y=True)
    vec = _widest_vector(hidden, elem_bytes, 16)
    threads = max(4, _pow2_at_least(-(-hidden // vec) // 2))
    if threads * vec > hidden:  # idle threads: see fwd_kept_variants
        return cuda_row_heuristic(hidden, elem_bytes)
    return CudaRowConfig(threads=threads, rows=max(1, 128 // threads), vec=vec, unroll=256, keep_row=True,
                         keep_y=True)


# Bytes of its row a thread of the small-call kernel keeps (at one row a block), the width of
# its vectors, and the most bytes of x a thread may keep and still load the weights with it
# (layernorm's gamma and beta take twice x's registers): see small_call_cuda_heuristic.
SMALL_CALL_THREAD_BYTES = 16
SMALL_CALL_VECTOR_BYTES = 8
SMALL_CALL_EARLY_WEIGHTS_BYTES = 32
SMALL_CALL_SHUFFLE_WARPS = 24


def small_call_shuffles(threads: int, warp_sums: bool, shuffle_warps: int = SMALL_CALL_SHUFFLE_WARPS) -> bool:
    """Whether a small-call block of ``threads`` adds its warps' sums by shuffles
    (rows.CudaRowConfig.shuffle_sums): with one barrier a row sum, from ``shuffle_warps`` warps
    up (small_call_cuda_heuristic says why)."""
    return shuffles_warp_sums(threads, warp_sums, shuffle_warps)


def small_call_cuda_heuristic(hidden: int, elem_bytes: int, thread_bytes: int = SMALL_CALL_THREAD_BYTES,
                              vector_bytes: int = SMALL_CALL_VECTOR_BYTES, early_weights: bool = False,
                              warp_sums: bool = True, shuffle_warps: int = SMALL_CALL_SHUFFLE_WARPS) -> CudaRowConfig:
    """The forward of a small call (runtime.is_small_call: decode rows, at most a few MiB of x).
    A small call is launch and DRAM latency, not bandwidth: what counts is the chain one row
    waits on, and each further vector a thread, barrier, and load issued after a barrier
    lengthens it.

    Rows narrower than 128 vectors, which share a block in fwd_cuda_heuristic's forward, take
    one 16-byte vector a thread instead of two (twice the threads a row, half the rows a block;
    not where threads would idle). Measured on the H200 (bf16, hidden 128, QK-norm's 32-8192
    rows; bench/results/h200-run41/decode-probe.json, every kept block shape, best of three
    rounds): 16 threads x 8 rows took 4.48-5.76 us (rmsnorm) and 4.70-6.02 (layernorm) against
    4.86-5.98 and 4.99-6.27 for the forward's 8 x 16, faster at all 8 cells by 0.16-0.39 us.

    A row a block keeps at most ``thread_bytes`` of the row a thread in ``vector_bytes``-byte
    vectors: the fewest whole warps (at least the forward's threads) that split the row evenly,
    so that each row sum takes one barrier (``warp_sums``), else the fewest powers of two.
    Measured against the forward's own kernel (128 or 256 threads of up to 8 vectors, two
    barriers a row sum), which served these calls before, both checked against float64 first
    (bf16, the catalog's widths at 1, 8, 64 and 256 rows, best of three rounds; decode_probe
    --rule-knobs): on the H200 (bench/results/h200-run63/) faster at 40 of 48 cells for each
    norm, by 0.46 us a cell on average for layernorm (up to 1.5) and 0.21 for rmsnorm, and
    ahead of torch eager and Liger at all 96; on an H100 (h100-run62/) the library's decode
    forwards 0.43 (layernorm) and 0.22 us (rmsnorm) a cell faster than in h100-run59/. Up to 32
    bytes a thread lost to 16 at 2560 by 0.9 us a cell (rmsnorm, H100: 5 warps; h100-run61/),
    and 8 bytes, 16-byte vectors or two barriers a row sum were no faster overall on either
    card; at 8192 (32 warps) 16 warps or two barriers were 0.25-0.3 us a cell faster in all
    three samples. Liger's layernorm, host-bound on the H200, led this kernel on the H100 at 34
    of 48 cells by up to 1.1 us.

    ``early_weights`` loads the weights with x instead of after the barriers (a second DRAM
    latency), where a thread keeps at most SMALL_CALL_EARLY_WEIGHTS_BYTES of x. Off: with this
    rule it moved the H200's cells by -0.07 (layernorm) and +0.02 us (rmsnorm) a cell, the
    H100's 32-byte rule's by under 0.03, and on the H200 it made the forward's kernel slower
    (layernorm 8192 x 1 5.70 -> 6.94 us; runtime.SMALL_CALL_BYTES).

    From ``shuffle_warps`` warps a block up, the warps' sums are added by shuffles within each
    warp (lane w reads warp w's, rows.CudaRowConfig.shuffle_sums) instead of by every thread
    reading all of them, which at 32 warps is a 32-deep chain of adds after the barrier. On an
    H100 (bench/results/h100-run64/, float64-checked first) at 7168 and 8192 (28 and 32 warps)
    the shuffles were faster at 13 of 16 cells, by 0.17 us a cell (up to 0.7, layernorm 8192 x
    256); at 16 and 20 warps mixed (layernorm 0.08 us faster, rmsnorm 0.08 slower), and below 16
    warps slower (0.05 us a cell for layernorm, 0.09 for rmsnorm, 13 of 56 cells faster). The
    library's decode forwards at 7168 and 8192 then ran 0.54 (layernorm) and 0.14 us (rmsnorm) a
    cell faster than in h100-run62/ (h100-run65/, another H100).

    The keyword arguments are the knobs bench/decode_probe.py --rule-knobs times the rule
    against."""
    cfg = fwd_cuda_heuristic(hidden, elem_bytes)
    if not cfg.keep_row:
        return cfg
    if cfg.rows > 1:
        if 2 * cfg.threads * cfg.vec > hidden:
            return cfg
        return dataclasses.replace(cfg, threads=2 * cfg.threads, rows=cfg.rows // 2)
    vec = _widest_vector(hidden, elem_bytes, vector_bytes)
    vectors = -(-hidden // vec)
    most = max(1, thread_bytes // (vec * elem_bytes))
    threads = None
    if warp_sums:  # the fewest whole warps that split the row evenly
        threads = next((t for t in range(min(cfg.threads, vectors), 1025)
                        if vectors // t <= most and warp_sums_problem(t, 1, vec, hidden) is None), None)
    if threads is None:
        threads = min(1024, max(cfg.threads, _pow2_at_least(-(-vectors // most))))
        while threads > vectors:  # no idle thread: see space.fwd_kept_variants
            threads //= 2
        warp_sums = warp_sums and warp_sums_problem(threads, 1, vec, hidden) is None
    early_weights = (early_weights and threads >= EARLY_WEIGHTS_THREADS
                     and thread_vectors(hidden, threads, vec) * vec * elem_bytes <= SMALL_CALL_EARLY_WEIGHTS_BYTES)
    return dataclasses.replace(cfg, threads=threads, vec=vec, warp_sums=warp_sums, early_weights=early_weights,
                               shuffle_sums=small_call_shuffles(threads, warp_sums, shuffle_warps))


def decode_dx_heuristic(hidden: int, elem_bytes: int) -> CudaRowConfig:
    """The decode backward's dx (compute.norms.dx without partials: a row kernel) as the
    forward: its rows of dy and x kept in registers, fwd_cuda_heuristic's threads and vectors,
    where both rows fit KEPT_ROW_BYTES together (every catalog width); wider rows are loaded by
    each stage."""
    cfg = fwd_cuda_heuristic(hidden, elem_bytes)
    if cfg.keep_row and 2 * thread_vectors(hidden, cfg.threads, cfg.vec) * cfg.vec * elem_bytes > KEPT_ROW_BYTES:
        return cuda_row_heuristic(hidden, elem_bytes)
    return dataclasses.replace(cfg, keep_y=False)


def fused_cuda_heuristic(func, hidden: int, elem_bytes: int) -> CudaRowConfig:
    """The row heuristic with at most 2 vectors per thread (each thread also keeps a running sum
    per element), and as many rows loaded at once (prefetch) as fit 96 registers of sums and
    rows, within what the block size leaves a thread (see fused_registers): at most 2 for
    LayerNorm, which keeps two sums per element (dgamma, dbeta), and for blocks of 8 or more
    short rows; at most 4 for RMSNorm otherwise. Measured on the H200 (bf16, 16384 tokens)
    against the earlier cap of 8: LayerNorm with 2 instead of 4 rows was 1.30-1.52x faster at
    hidden 1536-4096 and 0.91-0.93x at 896/1024; RMSNorm with 2 instead of 4 was 0.86-1.05x at
    512-8192, but at 128 (16 threads, 8 rows a block) 2 rows took 231.8 us, 4 251.4 us, 8 264.1.
    RMSNorm with blocks of 512 threads or more (hidden above 4096) loads 1 row: two such blocks
    share an SM only at <= 64 registers a thread, and 1 row took 263.8 and 293.3 us at hidden
    7168 and 8192 against 305.6 and 329.3 with 4 (bench/results/h200-bwd-stages.log).

    LayerNorm walks its chunks without row guards where all rows are in bounds (full_chunks,
    _tvm.FULL_CHUNK): its two sums per element made the guarded walk convert and recompute each
    element once per stage. Measured on the H200 (bwd_parts --dx, bf16, 16384 tokens): dx 64.8 ->
    61.5 us at 1024, 175.7 -> 141.2 at 4096, 254.6 -> 223.2 at 5120, 316.2 -> 287.0 at 7168,
    380.3 -> 297.8 at 8192. RMSNorm's lost at 4096-8192 (131.9 -> 166.6 at 4096, 239.9 -> 296.4 at
    8192: its one-row 512-thread blocks hold more registers unguarded) and stays guarded
    (bench/results/h200-probes-14/).

    gamma is held in registers for the whole chunk (chunk_weights) where its registers fit the
    same limit. Measured on the H200 (bwd_parts --dx, bf16, 16384 tokens, bench/results/
    h200-run18/): faster or equal at 22 of the 24 catalog widths, layernorm 4096 162.5 -> 127.2 us,
    8192 292.1 -> 267.3, 1536 60.4 -> 54.8; rmsnorm 2560 113.7 -> 102.7, 3584 134.4 -> 124.1, 1024
    55.0 -> 47.6; 0.5-0.7% slower (noise) at rmsnorm 896 and 8192.

    Rows of 1-8 KB are then staged in shared memory instead (_staged_dx)."""
    cfg = cuda_row_heuristic(hidden, elem_bytes, vectors_per_thread=2)
    s = int(func.params[-1].shape[0])  # part[S, q, H]
    per_thread = thread_vectors(hidden, cfg.threads, cfg.vec) * cfg.vec
    t = int(func.attrs[ROWS_PER_PARTIAL_ATTR])
    limit = fused_register_limit(cfg.threads * cfg.rows, cap=96)
    most = 1 if s == 1 and cfg.threads * cfg.rows >= 512 else 2 if s == 2 or cfg.rows >= 8 else 4
    prefetch = next(u for u in (4, 2, 1)
                    if u <= most and t % u == 0
                    and (fused_registers(s, per_thread, u, elem_bytes) <= limit or u == 1))
    weights = fused_registers(s, per_thread, prefetch, elem_bytes, weight_bytes=_weight_bytes(func))
    cfg = dataclasses.replace(cfg, prefetch=prefetch, full_chunks=1 if s == 2 else 0, chunk_weights=weights <= limit)
    return _staged_dx(cfg, func, hidden, elem_bytes, s, t, per_thread) or cfg


# Rows of these sizes (hidden * itype bytes) get the dx with its rows staged in shared memory,
# two groups in flight, two rows a group up to STAGED_PAIR_ROW_BYTES, one above: where it was
# measured to win (see _staged_dx); it lost at 256 bytes (bf16 128) and was not measured above
# 8 KB (fp32 4096 does not fit 47 KB).
STAGED_ROW_BYTES = (1024, 8192)
STAGED_PAIR_ROW_BYTES = 2048


def _staged_dx(cfg: CudaRowConfig, func, hidden: int, elem_bytes: int, s: int, t: int, per_thread: int):
    """The rule's dx with its rows staged in shared memory by cp.async (CudaRowConfig.staged):
    one chunk lane a block (where the unstaged rule puts 2-4 in a block of short rows), over
    full chunks, gamma held for the chunk where its registers fit; or None where the row is
    outside STAGED_ROW_BYTES, its vectors are narrower than 16 bytes (not measured; cp.async
    also copies 4 and 8), dy and x differ in width (fp32 dy of a bf16 x: the copies take one
    vector width) or the layout cannot be staged. Measured on the H200 (bwd_parts
    --dx at the rule's thread counts, bf16, 16384 tokens; bench/results/h200-run27/ and
    h200-run28/), dx alone against the unstaged rule's: two rows a group at 512-1024, rmsnorm
    33.5 -> 23.7 us at 512, 55.7 -> 33.8 at 896, 48.2 -> 33.1 at 1024, layernorm 34.2 -> 23.9,
    54.3 -> 38.8, 51.9 -> 35.2; one row a group above, where two lost at layernorm (2048: 71.3
    against 78-79; 2560: 95.4 against 116.4), rmsnorm 54.8 -> 47.4 at 1536, 67.4 -> 64.0 at 2048,
    96.7 -> 80.1 at 2560, 115.9 -> 98.9 at 3584, 128.1 -> 112.9 at 4096, layernorm 55.7 -> 53.3,
    95.6 -> 71.3, 97.8 -> 95.4, 121.4 -> 120.1, 132.0 -> 124.5; fp32 1024-2048 level to 7%
    faster. At 128 staging lost: layernorm 117.8 -> 126.8."""
    row_bytes, stages = hidden * elem_bytes, 2
    if (cfg.vec * elem_bytes != 16 or not STAGED_ROW_BYTES[0] <= row_bytes <= STAGED_ROW_BYTES[1]
            or any(_param_bytes(func, name) != elem_bytes for name in ROW_OPERANDS)):
        return None
    prefetch = 2 if row_bytes <= STAGED_PAIR_ROW_BYTES else 1
    limit = fused_register_limit(cfg.threads)
    if not staged_fits(s, hidden, elem_bytes, per_thread, limit, prefetch, stages, (t,)):
        return None
    weights = fused_registers(s, per_thread, prefetch, elem_bytes, weight_bytes=_weight_bytes(func))
    return dataclasses.replace(cfg, rows=1, prefetch=prefetch, stages=stages, staged=True, full_chunks=1,
                               chunk_weights=weights <= limit)


def _param_bytes(func, name: str) -> int:
    return next(p for p in func.params if p.name == name).dtype.itemsize


def _weight_bytes(func) -> int:
    return _param_bytes(func, "gamma")


def cpu_row_heuristic(hidden: int, fused: bool = False) -> CpuRowConfig:
    """16 fp32 lanes (one AVX-512 register; two AVX2 ones) when they divide the row, 4 vector
    accumulators per row reduction (enough independent adds to cover the FP add latency), and
    rows per task so that a task covers ~16K elements. Reduction lanes (vec * acc) must divide
    the row: a reduction's predicated tail does not survive moving it under the row loop, so
    odd rows get fewer lanes (down to a serial reduction, still correct). In the fused dx
    kernel a task is ``rows`` chunks of T rows, and one chunk already covers >= 16K elements
    (see rows_per_partial), so a task is one chunk."""
    vec = next(v for v in (16, 8, 4, 2, 1) if hidden % v == 0)
    acc = next(a for a in (4, 2, 1) if hidden % (vec * a) == 0)
    unroll = 2 if hidden % (2 * vec) == 0 else 1
    rows = 1 if fused else max(1, 16384 // max(hidden, 1))
    return CpuRowConfig(vec=vec, acc=acc, unroll=unroll, rows=rows)


def finalize_split(hidden: int) -> tuple:
    """(columns per block, threadIdx.y lanes) of finalize: enough blocks to spread the partial
    rows over the SMs, and the lanes that fill a block. Measured on the H200 (bf16, 16384
    tokens, 512-1024 partials; bench/results/h200-bwd-parts-2.log), against the earlier 32 x 16
    everywhere: 8 x 128 took 7.7-13.9 us instead of 13.7-25.2 at hidden 512-1024, 8 x 64
    10.0-13.5 instead of 14.8-17.9 at 2048, 16 x 32 10.5-18.2 instead of 11.3-19.3 at 4096, and
    32 x 16 stayed the fastest at 7168-8192 (12.5-13.4 us, others 13.6-21.1)."""
    columns = 8 if hidden <= 2048 else 16 if hidden <= 4096 else 32
    threads = 1024 if hidden <= 1024 else 512
    return columns, threads // columns


# Partial rows each finalize thread loads per step of its walk, unrolled so that they are all in
# flight together. Measured on the H200 (bf16, 16384 tokens, 512 partials; bench/results/
# h200-bwd-parts-3.log), 8 was never slower than 1, 2 or 4 and took 19.2 us against 22.1 (1) and
# 27.6 (4) for layernorm 8192 with 32 x 16 threads, 28.1 against 30.0 (1) and 72.4 (4) for
# layernorm 128 with its 16384 partials summed by finalize alone.
FINALIZE_UNROLL = 8


def _cuda_finalize(func, columns: int | None = None, lanes: int | None = None, unroll: int = FINALIZE_UNROLL):
    """dgamma[j] = sum over the partials: a block per ``columns`` columns, the partial axis split
    over ``lanes`` threadIdx.y lanes, each summing its share serially in steps of ``unroll``
    rows (partial q = (step * unroll + u) * lanes + lane), coalesced over the columns, then a
    cross-lane tree reduction in shared memory. Thousands of partials (QK-norm: 524288 rows of
    128 in chunks of 64 give 8192) are summed by hundreds of threads per block, not one serial
    thread per column. The order is fixed by the shape alone: deterministic. The split is
    finalize_split's unless given (bench/bwd_parts.py times others). One reduction block
    (LayerNorm's is a tuple of both sums on cuda) and one store block per output group."""
    default = finalize_split(int(func.params[-1].shape[-1]))
    columns, lanes = columns or default[0], lanes or default[1]
    sch = Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    for acc, out in zip(blocks[0::2], blocks[1::2]):  # (sums, stores): one pair, or dgamma's and dbeta's
        (j,) = sch.get_loops(out)
        jo, ji = sch.split(j, [None, columns])
        sch.bind(jo, "blockIdx.x")
        sch.bind(ji, "threadIdx.x")
        sch.compute_at(acc, ji)
        for idx in range(len(sch.get(acc).writes)):
            sch.set_scope(acc, idx, "local")
        (q,) = sch.get_loops(acc)[2:]
        qo, u, qy = sch.split(q, [None, unroll, lanes])
        sch.reorder(qy, qo, u)
        sch.bind(qy, "threadIdx.y")  # reduction loop on a thread axis: LowerCrossThreadReduction
        sch.unroll(u)
        # the cast and store are done by lane 0 only (a unit loop bound to threadIdx.y)
        _, lane = sch.split(sch.add_unit_loop(out), [None, lanes])
        sch.bind(lane, "threadIdx.y")
    return sch


# wgrad's split (columns per block, threadIdx.y lanes) for calls of at most runtime.WGRAD_FEW_ROWS
# rows: 8 lanes of one unrolled step of 8 rows each, so the cross-lane tree is 3 levels, not 4-7.
# Measured on the H200 (bf16, whole decode backward calls of 64 rows, bench/results/h200-run20/
# bwd-small-b.log): 64 x 8 took 8.0-10.9 us against finalize's split's 8.5-12.7 at every catalog
# width (layernorm 7168: 12.6 -> 10.5), and lost to it from 256 rows at hidden <= 4096 (rmsnorm
# 1024 x 256: 11.0 against 9.9), where more lanes share the rows.
WGRAD_FEW_SPLIT = (64, 8)


def _cuda_wgrad_few(func):
    return _cuda_finalize(func, *WGRAD_FEW_SPLIT)


# wgrad's split for calls of WGRAD_FEW_ROWS + 1 to runtime.WGRAD_MID_ROWS rows at hidden 2049-4096,
# where finalize's split (16 columns x 32 lanes) spreads 256 rows over 32 lanes of one unrolled
# step each. Measured on the H200 (bf16, whole decode backward calls, bench/results/h200-run20/
# bwd-small-b.log): 32 x 16 took 10.9-13.3 us at 256 rows against 11.6-14.7 (layernorm 4096:
# 14.7 -> 13.3, rmsnorm 2560: 11.6 -> 10.9), and at 512 rows 13.9-17.0 against 13.7-18.2 (one
# loss, rmsnorm 2560 by 0.2 us); at 1024 rows it lost by 0.6-1.9 us. Timed against each other in
# one call of the twenty-first lease (h200-run21/mid-parts.log): 0.4-1.9 us faster at 128-384
# rows, level at 512. Elsewhere finalize's split is as fast or faster at these rows (at hidden
# >= 5120 it is 32 x 16 already).
WGRAD_MID_SPLIT = (32, 16)
WGRAD_MID_HIDDEN = (2049, 4096)


def wgrad_mid_split(hidden: int) -> tuple:
    lo, hi = WGRAD_MID_HIDDEN
    return WGRAD_MID_SPLIT if lo <= hidden <= hi else finalize_split(hidden)


def has_wgrad_mid(hidden: int) -> bool:
    """Whether wgrad_mid's split differs from wgrad's at ``hidden``: only then is it a kernel of
    its own (build.decode_parts); elsewhere wgrad serves its calls, the very same kernel."""
    return wgrad_mid_split(hidden) != finalize_split(hidden)


def _cuda_wgrad_mid(func):
    return _cuda_finalize(func, *wgrad_mid_split(int(func.params[-1].shape[-1])))


COMBINE_THREADS = 64  # threadIdx.x over the columns of a tile: a warp's 32 columns are one 128-byte load


def _cuda_combine(func):
    """A block per (s, group, tile of COMBINE_THREADS columns); each thread sums its column's
    COMBINE_GROUP partials with the constant loop unrolled, so its loads are all in flight (the
    partial count is the runtime's: the tail group's loads are guarded)."""
    sch = Schedule(func)
    mid = sch.get_child_blocks(sch.get_sblock("root"))[0]
    out = sch.cache_write(mid, 0, "local")  # the running sum in a register, one store
    s, g, j, u = sch.get_loops(mid)
    jo, ji = sch.split(j, [None, COMBINE_THREADS])
    sch.reorder(g, s, jo, ji, u)
    sch.bind(g, "blockIdx.x")  # the symbolic group count alone: no index math over it
    sch.bind(sch.fuse(s, jo), "blockIdx.y")
    sch.bind(ji, "threadIdx.x")
    sch.unroll(u)
    sch.reverse_compute_at(out, ji)
    return sch


def _cuda_amax_zero(func):
    sch = Schedule(func)
    (only,) = sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[0])
    sch.bind(only, "threadIdx.x")
    return sch


def _cpu_finalize(func):
    sch = Schedule(func)
    for acc in sch.get_child_blocks(sch.get_sblock("root"))[0::2]:
        j, q = sch.get_loops(acc)
        sch.reorder(q, j)
    return sch


def _cpu_combine(func):
    sch = Schedule(func)
    mid = sch.get_child_blocks(sch.get_sblock("root"))[0]
    s, g, j, u = sch.get_loops(mid)
    sch.reorder(s, g, u, j)  # contiguous columns innermost
    sch.parallel(sch.fuse(s, g))
    return sch


def _cpu_amax(func):
    sch = Schedule(func)
    part = sch.get_child_blocks(sch.get_sblock("root"))[0]
    sch.parallel(sch.get_loops(part)[0])  # the chunks
    return sch


def default_schedule(func, part: str, target_kind: str, itype_bytes: int = 2):
    """The fallback Schedule for one kernel part on a target kind ("cuda" or "llvm")."""
    hidden = _hidden_of(func, part)
    if target_kind == "cuda":
        if part in ROW_PARTS:
            if part == "dx":
                rule = fused_cuda_heuristic(func, hidden, itype_bytes) if is_fused(func) else \
                    decode_dx_heuristic(hidden, itype_bytes)
                return schedule_rows_cuda(func, rule)
            return schedule_rows_cuda(func, fwd_cuda_heuristic(hidden, itype_bytes))
        # wgrad (the decode backward's column sums of dy and x) is finalize's column sum
        return {"finalize": _cuda_finalize, "wgrad": _cuda_finalize, "wgrad_few": _cuda_wgrad_few,
                "wgrad_mid": _cuda_wgrad_mid, "combine": _cuda_combine, "amax_zero": _cuda_amax_zero}[part](func)
    if part in ROW_PARTS:
        return schedule_rows_cpu(func, cpu_row_heuristic(hidden, fused=part == "dx"))
    if part == "amax_one":
        return Schedule(func)  # a serial loop over the rows' maxima
    return {"finalize": _cpu_finalize, "wgrad": _cpu_finalize, "wgrad_few": _cpu_finalize, "wgrad_mid": _cpu_finalize,
            "combine": _cpu_combine, "amax": _cpu_amax}[part](func)


def _hidden_of(func, part):
    if part in ("amax", "amax_one", "amax_zero"):
        return 1
    shape = func.params[0].shape
    return int(shape[-1])
