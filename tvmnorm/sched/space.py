"""The norm-specific MetaSchedule design space.

MetaSchedule's built-in rules see RMSNorm as a generic reduction and offer 8 candidates, none
better than dlight (0.13 of copy bandwidth at hidden 128 on the H200). The schedules that
matter for memory-bound row norms are the ones TE and Liger write by hand: a partial warp, a
warp or several warps per row, several rows per block for short rows, 16-byte vector
accesses, the whole row handled in one block with the statistics in registers. This space
is exactly that family: the shared row schedule of ``rows.py`` with each knob a
``sample_categorical`` decision, so the evolutionary search re-samples and the XGBoost cost
model ranks them, and every decision is only a split factor or an annotation, so a record
tuned at a static row count replays on the symbolic-row kernel.

CUDA knobs: threads per row (4..1024; in the fused dx variants also the warp multiples that
split the row evenly, e.g. 448 x 2 or 896 x 1 vectors of 8 at hidden 7168), rows per block
(1..16), vector width (elements per thread per access, up to 16 bytes, only widths that divide
the row: TE's rule hidden*size % (threads*bytes) == 0 is relaxed to hidden % vec == 0 because
predicated tails handle the rest), unroll depth, and whether the row of x is kept in registers
for every stage (read from memory once) or loaded again by each, and with fp8 output whether y
is kept there too (``fwd_kept_variants``: structural variants, as the register layout depends
on threads and vec; kept or not, y is cast to fp8 two columns at a time with an even vector:
CudaRowConfig.paired_cast).
(Staging the row in shared memory was tried: see design_spaces.)
Pruned here: thread counts that leave a thread no vector or more than 32 of them, vector widths
that do not divide the row or exceed 16 bytes; VerifyGPUCode rejects the rest (more than 1024
threads per block, too much shared memory). Several rows per block with multi-warp rows are
kept: TVM guards each row's allreduce, and such records (64 threads x 2 rows at hidden 7168,
128 x 8 at 2048) passed the float64 check on the H200 with partial last blocks (257, 4097 rows).

llvm knobs: vector lanes (4..32 fp32 lanes, split of the hidden loop, vectorised in every stage),
vector accumulators per row reduction (1..8: the reductions are rfactored into lanes x
accumulators, so they are SIMD and not one latency-bound chain), unroll of the output loop, and
rows per parallel task (for the fused bwd kernel: chunks of T rows per task, 1..4).

The bwd row kernel ``dx`` has the same knobs. It also writes the dgamma/dbeta partials and the
row schedule splits its rows into chunks of the key's static T (``rows_per_partial``), so
``rows`` counts chunks per task (llvm) or per block (cuda) there. On CUDA each thread keeps its
columns' running sums and ``stages`` groups of ``prefetch`` rows of dy and x in registers, whose
layout depends on threads, vec and prefetch, and the next groups load while one computes
(``stages`` > 1, a software pipeline), and gamma may be held there for the whole chunk
(``chunk_weights``): there each (threads, vec, prefetch, stages, chunk_weights) is its own
design space (``fused_cuda_variants``, pruned to what fits FUSED_REGISTERS), and rows per block,
the blocks an SM must hold (``min_blocks``: __launch_bounds__, a register cap), whether whole
chunks are walked without row guards (``full_chunks``), whether the running sums are zeroed before
the walk (``hoist_inits``) and whether they live in shared memory instead of registers
(``shared_sums``) are sampled within it, and in every
CUDA space whether rows are loaded evict-first (``stream``). The kept-row
forward variants come again with one barrier a row sum (``warp_sums``) where the row splits
evenly over whole warps, and, where a row's sums take barriers, with the weights loaded with x
before them (``early_weights``), and from SHUFFLE_SUMS_WARPS warps a row with the warps' sums
added by shuffles (``shuffle_sums``).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from typing import NamedTuple

from ..compute.norms import CUDA_CHUNK_ROWS
from ..key import DTYPE_BYTES, NormKey
from .._tvm import shared_sums_problem
from .rows import (CP_ASYNC_BYTES, STAGED_SHARED_BYTES, CpuRowConfig, CudaRowConfig, dx_shared_bytes, schedule_rows_cpu,
                   schedule_rows_cuda, staged_shared_bytes, thread_vectors, warp_sums_problem)

TUNED_PARTS = ("fwd", "dx")
THREADS = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
ROWS = (1, 2, 4, 8, 16)
UNROLL = (0, 16, 64, 256)
CPU_VEC = (4, 8, 16, 32)
CPU_ACC = (1, 2, 4, 8)
CPU_UNROLL = (1, 2, 4)
CPU_ROWS = (1, 4, 16, 64)
# the fused dx kernel's task is `rows` chunks of T rows, and a chunk is already >= 16K elements
CPU_CHUNKS = (1, 2, 4)


def cuda_vec_choices(key: NormKey) -> list:
    b = DTYPE_BYTES[key.itype]
    return [v for v in (1, 2, 4, 8, 16) if v * b <= 16 and key.hidden_size % v == 0]


def cuda_thread_choices(key: NormKey) -> list:
    """Thread counts that give every thread at least one vector and at most 32 of them."""
    lo = max(1, key.hidden_size // (16 * 32))
    out = [t for t in THREADS if t >= lo and t <= max(4, key.hidden_size)]
    return out or [THREADS[0]]


def exact_thread_counts(hidden: int, vec: int, most: int) -> list:
    """Thread counts beyond THREADS, in whole warps, that split the row into the same whole
    number (1..``most``) of ``vec``-element vectors for every thread: TE's divisibility rule,
    hidden * size % (threads * bytes) == 0, for rows whose vector count is not a power of two
    times 1..most. A row of 7168 is 896 vectors of 8: 256 or 512 threads leave a quarter of the
    last step's lanes idle (and a predicate on every access), 224, 448 or 896 threads none. TVM's
    cross-thread allreduce takes any whole number of warps (it pads its second, per-warp stage).
    They join the powers of two in the fused dx variants, not replace them: on the H200 (bf16,
    16384 tokens, bench/results/h200-dx-even-split.log) the default's dx with 448 x 2 took 407.4
    us against 379.1 with 512 x 1.75 at layernorm 7168 (339.3 vs 314.4 at 5120, 186.8 vs 171.6
    with 224 vs 256 threads at 3584), and 253.8 vs 263.6 at rmsnorm 7168: fewer warps keep fewer
    bytes in flight, which costs more than the idle lanes. In the forward's kept-row variants
    they were no faster than the powers of two (bench/results/h200-fwd-probe-2.log)."""
    if hidden % vec:
        return []
    vectors = hidden // vec
    return [t for t in range(96, 1025, 32) if t & (t - 1) and vectors % t == 0 and vectors // t <= most]


def _fused_thread_counts(key: NormKey, vec: int) -> list:
    """cuda_thread_choices and the exact warp multiples of ``vec``-element vectors."""
    exact = exact_thread_counts(key.hidden_size, vec, FUSED_VECTORS)
    return sorted(set(cuda_thread_choices(key)) | set(exact))


def _categorical(sch, choices):
    return sch.sample_categorical(list(choices), [1.0 / len(choices)] * len(choices))


def cuda_space(key: NormKey, fused=None, kept=None):
    """The CUDA row space. ``fused`` = (threads, vec, prefetch, stages, chunk_weights, staged), plain
    values, makes it one structural variant of the fused dx kernel: they decide the register
    layout of its row operands and partial sums (a constant of the trace, see _thread_layout),
    the software pipeline over its rows and where gamma is loaded (a cache stage or none), and
    its loops over registers are unrolled whatever the unroll knob, so only rows per block is
    sampled there. ``kept`` (a KeptVariant) makes it a forward variant that keeps the row of x
    (and fp8's y) in registers (``keep_row``), for the same reasons structural, and warp_sums
    changes the thread layout (lanes and warps), early_weights where the weights' loads go (a
    compute_at position), shuffle_sums the loops of the sum of the warps' sums."""
    def space(sch):
        # sampled even where there is one choice (warp_sums: one row a block): a trace that samples
        # nothing is the default rule's (tune.is_default_trace)
        rows = _categorical(sch, fused_lanes(fused) if fused else kept_rows(kept) if kept else ROWS)
        if fused is not None:
            threads, vec, prefetch, stages, chunk_weights, staged = fused
            cfg = CudaRowConfig(threads=threads, rows=rows, vec=vec, prefetch=prefetch, stages=stages,
                                chunk_weights=chunk_weights, staged=staged,
                                min_blocks=_categorical(sch, min_blocks_choices(threads)),
                                full_chunks=_categorical(sch, FULL_CHUNKS), hoist_inits=_categorical(sch, HOIST_INITS),
                                shared_sums=_categorical(sch, shared_sums_choices(key, fused)))
        elif kept is not None:
            cfg = kept.config(rows, full_chunks=_categorical(sch, FULL_CHUNKS) if kept_guarded(kept) else 0)
        else:
            cfg = CudaRowConfig(threads=_categorical(sch, cuda_thread_choices(key)), rows=rows,
                                vec=_categorical(sch, cuda_vec_choices(key)),
                                unroll=_categorical(sch, UNROLL), full_chunks=_categorical(sch, FULL_CHUNKS))
        cfg = dataclasses.replace(cfg, stream=_categorical(sch, STREAM))  # every variant's rows
        schedule_rows_cuda(None, cfg, sch=sch)
        return sch
    return space


def fused_rows(threads: int) -> list:
    """Chunk lanes per block (threadIdx.y) a fused variant of ``threads`` threads per lane can
    have within 1024 threads per block. Sampling the others only made invalid candidates, and
    where few were valid (7 variants x 2 at hidden 7168) MetaSchedule spent round after round
    of sampling to find the last unmeasured ones."""
    return [r for r in ROWS if threads * r <= 1024]


# Blocks of the fused dx kernel one SM must hold at once (CudaRowConfig.min_blocks: ptxas caps
# the registers to fit them, spilling if it must). The kernel keeps a running sum per element of
# its columns and its rows in registers, and under Nsight Compute on the H200 the layernorm dx
# records ran 14-27 warps an SM (one 512-thread block at 128 registers at 8192), stalled mostly on
# global loads with ~1 eligible warp per scheduler and DRAM at 47-51% of peak: latency at the
# occupancy the registers allow (bench/results/h200-probes-12/). Asking for more blocks trades
# spills for warps: 2 blocks an SM took layernorm 1024's default dx from 62.6 to 58.7 us and
# layernorm 7168's from 314.3 to 419.3, so it is sampled, and the twelfth lease's retune took 2-4
# at 5 of 24 bf16 backward keys.
MIN_BLOCKS = (1, 2, 3, 4)


def min_blocks_choices(threads: int) -> list:
    """Blocks per SM a fused variant of ``threads`` threads per chunk lane can ask for (an SM
    holds at most 2048 threads; rows per block is sampled apart, so a larger block may ask for
    more than fit: ptxas then caps its registers as asked, and the measurement judges it)."""
    return [b for b in MIN_BLOCKS if b * threads <= 2048]


# Whether the fused dx kernel walks a chunk whose rows are all in bounds without row guards, and
# the forward so computes a block of several rows (CudaRowConfig.full_chunks, _tvm.FULL_CHUNK):
# ptxas counted a third fewer instructions for layernorm 8192's dx (1248 -> 864 at 512 threads x
# 4, 2 rows a group) and a fifth to a quarter fewer for the hidden-128 forward records (rmsnorm
# 320 -> 264, layernorm 528 -> 392), as nvcc then converts and combines each element once for
# every stage; the copy it adds takes registers (the dx's spills went 64 -> 72 bytes), so the
# search decides.
FULL_CHUNKS = (0, 1)
# The rows' cache policy (CudaRowConfig.stream, _tvm.STREAM_LOADS): none, loaded with
# ld.global.cs (the L2 evicts them first; 12 fwd and 8 dx records took it by the 23rd lease), or
# loaded under an L2 evict_last policy, as torch.compile's forward loads x first at 4096-8192
# (3: on the H200 rmsnorm 8192's record 133.3 -> 129.7 us, 0.95 -> 0.975 of copy, and 7168's
# 118.8 -> 130.8, so a knob). Stores keep the default policy (torch.compile's do; stream = 2,
# streaming stores too, is for the probes).
STREAM = (0, 1, 3)
# Whether the fused dx zeroes its running sums before the walk over the chunk's rows
# (CudaRowConfig.hoist_inits, _tvm.HOIST_INITS): fewer instructions, which nvcc schedules
# otherwise, 2-6.5% faster at 6 of the 24 bf16 records and 7.5% slower at layernorm 8192.
HOIST_INITS = (0, 1)
# Where the fused dx keeps its running sums (CudaRowConfig.shared_sums, _tvm.SHARED_SUMS): in
# registers, or in shared memory, a slot of each thread's own per sum. ptxas puts the layernorm
# 8192 dx at 118-128 registers at 512 threads x 8 (one block an SM) and, under the 64-register cap
# of two blocks, spills 424-710 bytes of such points (the records' own layouts 2042-2466); with the
# sums in shared memory 512 x 8 with one row a group fits 64 registers without a spill at 7168
# and 8192 (bench/results/h200-run49/). Timed on the H200 (h200-run50/, the dx alone at 16384
# rows), that point ran 0.72 of copy at 7168 against the record's 0.62 (sums in registers), the
# record's own layout 0.72 with its sums in shared memory, and 0.71 at 8192 as the best in
# registers; at 2048 and 4096 the records in registers stayed ahead (0.61 against 0.54-0.58, 0.80
# against 0.71). The sums of every chunk lane of a block must fit the shared memory a block may
# launch with (_tvm.shared_sums_problem).
SHARED_SUMS = (0, 1)


def shared_sums_choices(key: NormKey, fused) -> list:
    """Where a fused variant (fused_cuda_variants) may keep its running sums: SHARED_SUMS where
    the sums of its widest block (fused_lanes) launch beside its static shared memory, registers
    alone otherwise."""
    threads, vec, prefetch, stages, _, staged = fused
    cfg = CudaRowConfig(threads=threads, rows=max(fused_lanes(fused)), vec=vec, prefetch=prefetch, stages=stages,
                        staged=staged)
    shared = dx_shared_bytes(key.column_sums, key.hidden_size, DTYPE_BYTES[key.itype], cfg)
    return [0] if shared_sums_problem(shared) else list(SHARED_SUMS)


# Registers one thread of the fused dx kernel may spend on its running sums and its prefetched
# rows (``fused_registers``); nvcc needs the rest for addresses and the math.
FUSED_REGISTERS = 128
PREFETCH = (1, 2, 4, 8)
# Groups of rows in flight per chunk lane (rows._cuda_pipeline): 1 loads a group, then computes
# it; 2 and 3 load the next groups while one computes. On the H200 (bench/results/
# h200-bwd-stages.log, the default's threads at 16384 tokens) a pipeline of 1-2 rows a group beat
# every unpipelined prefetch at layernorm 128, 512, 4096 and 8192 (by 0.5-9%) and rmsnorm 1024
# and 4096 (2%), and lost where the rows' registers crowded the sums (layernorm 2048-7168 with 2
# rows a group: 1.05-1.3x slower); so only groups of 1-2 rows are pipelined, and the register
# limit counts every group in flight. 3 (two groups loading ahead) was a quarter of the structural
# variants (520 of 2152 over the bf16 and fp16 catalog) and no backward record chose it (48
# records after the pipeline came in: 45 unpipelined, 3 with 2): dropped, which cuts the time
# MetaSchedule spends building a task's design spaces (bf16 catalog: 1.29 -> 0.90 s a task here).
STAGES = (1, 2)
PIPELINED_PREFETCH = (1, 2)
# Vectors of the row one thread of a fused variant handles (it keeps a running sum per element).
FUSED_VECTORS = 4


def fused_registers(s: int, per_thread: int, prefetch: int, elem_bytes: int, stages: int = 1,
                    weight_bytes: int = 0) -> int:
    """Registers for S running sums per element and ``stages`` groups of ``prefetch`` rows of dy
    and x (two tensors of ``elem_bytes`` per element: a bf16 pair is one register, an fp32 pair
    two), and with ``weight_bytes`` (chunk_weights) gamma's elements held for the whole chunk."""
    return s * per_thread + stages * prefetch * per_thread * elem_bytes // 2 + -(-per_thread * weight_bytes // 4)


def fused_register_limit(threads: int, cap: int = FUSED_REGISTERS, vectors: int = 0, rows: int = 0) -> int:
    """What the sums and rows may take in a block of ``threads``: 64K registers per SM shared
    by the block's threads (__launch_bounds__ caps a 1024-thread block at 64 each), less ~40
    for addresses and the math, or ~28 where a thread holds ``vectors`` = 1 vector of the row
    and at most 2 ``rows`` are in flight. ptxas (bench/results/sass-variant-registers.txt) fits
    layernorm 8192 at 1024 x 8 and 7168 at 896 x 8 with two rows in flight (fused_registers
    32-36) in 64-72 registers without spilling, which the 40 pruned; with 2-4 vectors a thread,
    or 8 rows in flight, 28 admits points that spill 24-730 bytes."""
    return min(cap, 65536 // threads - (28 if vectors == 1 and 1 <= rows <= 2 else 40))


def _fused_layouts(key: NormKey):
    """(threads, vec, elements a thread, register limit) of every thread layout a fused variant
    can take: the two widest vector widths and the thread counts that give every thread 1 to
    FUSED_VECTORS vectors of the row."""
    h = key.hidden_size
    for vec in cuda_vec_choices(key)[-2:]:
        for threads in _fused_thread_counts(key, vec):
            vectors = thread_vectors(h, threads, vec)
            if 1 <= vectors <= FUSED_VECTORS and threads * vec <= max(h, 4 * vec):
                yield threads, vec, vectors * vec, fused_register_limit(threads)


def fused_cuda_variants(key: NormKey, staged: bool | None = None) -> list:
    """(threads, vec, prefetch, stages, chunk_weights, staged) of the fused dx kernel: the two widest
    vector widths, thread counts (powers of two, and the warp multiples that split the row
    evenly: exact_thread_counts) that give every thread 1 to FUSED_VECTORS vectors of the row
    (and a block of them within 1024 threads), rows loaded per group and groups in flight such
    that the sums and the rows fit the register limit (prefetch dividing every chunk size the
    tuner applies the space to, CUDA_CHUNK_ROWS, and the smallest chunk holding ``stages``
    groups), each again with gamma held in registers for the whole chunk (chunk_weights) where
    its registers fit too: where they are tight, ptxas spills for it (layernorm 8192, 512 x 4:
    12 -> 44 bytes, bench/results/sass-counts-chunk-weights.txt) and only a measurement tells
    whether the loads it saves are worth that. With ``staged`` (STAGED unless given), also
    staged_cuda_variants'."""
    s = key.column_sums
    size, weight_bytes = DTYPE_BYTES[key.itype], DTYPE_BYTES[key.wtype]
    out = []
    for threads, vec, per_thread, _ in _fused_layouts(key):
        for prefetch in PREFETCH:
            if any(t % prefetch for t in CUDA_CHUNK_ROWS):
                continue
            for stages in STAGES if prefetch in PIPELINED_PREFETCH else (1,):
                limit = fused_register_limit(threads, vectors=per_thread // vec, rows=prefetch * stages)
                regs = fused_registers(s, per_thread, prefetch, size, stages)
                fits = regs <= limit or (prefetch, stages) == (1, 1)
                if fits and stages * prefetch <= min(CUDA_CHUNK_ROWS):
                    out.append((threads, vec, prefetch, stages, False, False))
                    if fused_registers(s, per_thread, prefetch, size, stages, weight_bytes) <= limit:
                        out.append((threads, vec, prefetch, stages, True, False))
    # very wide rows (65536) have no variant within the limit: the widest one, spilling if it must
    out = out or [(cuda_thread_choices(key)[-1], cuda_vec_choices(key)[-1], 1, 1, False, False)]
    return out + (staged_cuda_variants(key) if (STAGED if staged is None else staged) else [])


# The staged dx (CudaRowConfig.staged: each group of rows copied by cp.async into shared memory,
# then into registers as vectors) as fused variants of the space. On the H200 (twenty-seventh
# lease, bench/results/h200-run27/) it took the default rule's dx from 47.4 to 40.2 us at rmsnorm
# 1024, 52.4 to 44.5 at layernorm 1024 and 95.0 to 77.0 at layernorm 2048 with two groups in
# flight; four were slower everywhere (up to 1.27x the two's), so the space holds two. Over full
# chunks (full_chunks, sampled as for the other variants) it went on to 33.1, 35.2 and 71.3.
STAGED = True
# Groups of rows in flight (copies into shared memory) and rows a group a staged variant takes.
STAGED_STAGES = (2,)
STAGED_PREFETCH = (1, 2)


def staged_fits(s: int, hidden: int, elem_bytes: int, per_thread: int, limit: int, prefetch: int, stages: int,
                chunk_rows) -> bool:
    """Whether a staged dx of ``stages`` groups of ``prefetch`` rows fits: every chunk of
    ``chunk_rows`` (the sizes T it may get) splits into such groups, a block's static shared
    memory holds the groups in flight (STAGED_SHARED_BYTES), and ``limit`` registers hold the S
    sums and one group (the space's variants and the default rule's alike)."""
    return (all(t % prefetch == 0 and stages * prefetch <= t for t in chunk_rows)
            and staged_shared_bytes(hidden, elem_bytes, prefetch, stages) <= STAGED_SHARED_BYTES
            and fused_registers(s, per_thread, prefetch, elem_bytes) <= limit)


def staged_cuda_variants(key: NormKey) -> list:
    """The staged fused variants, (threads, vec, prefetch, STAGES, chunk_weights, True): the
    unstaged variants' vector widths whose vectors cp.async copies (4, 8 or 16 bytes) and thread
    counts, STAGED_PREFETCH rows a group and STAGED_STAGES groups in flight where they fit the
    smallest chunk and a block's static shared memory (STAGED_SHARED_BYTES), and the registers
    hold the sums and one group (the groups in flight are in shared memory); each again with
    gamma held for the chunk where its registers fit too."""
    s, h = key.column_sums, key.hidden_size
    size, weight_bytes = DTYPE_BYTES[key.itype], DTYPE_BYTES[key.wtype]
    out = []
    for threads, vec, per_thread, limit in _fused_layouts(key):
        if vec * size not in CP_ASYNC_BYTES:
            continue
        for prefetch in STAGED_PREFETCH:
            for stages in STAGED_STAGES:
                if not staged_fits(s, h, size, per_thread, limit, prefetch, stages, CUDA_CHUNK_ROWS):
                    continue
                out.append((threads, vec, prefetch, stages, False, True))
                if fused_registers(s, per_thread, prefetch, size, 1, weight_bytes) <= limit:
                    out.append((threads, vec, prefetch, stages, True, True))
    return out


def fused_lanes(fused) -> list:
    """The chunk lanes per block a fused variant samples: a staged one has one lane a block
    (CudaRowConfig.staged)."""
    return [1] if fused[5] else fused_rows(fused[0])


# The thread counts from which a row sum takes barriers (TVM's allreduce over several warps),
# and so the kept-row forward also comes with its weights loaded before them (early_weights):
# within one warp the sum is shuffles, which do not stop nvcc from issuing the loads early.
EARLY_WEIGHTS_THREADS = 64
# Vectors of x one thread of a kept-row forward holds (FWD_KEPT_VECTORS * 16 bytes: 32 registers).
FWD_KEPT_VECTORS = 8
# Warps a row from which a warp_sums variant also comes adding its warps' sums by shuffles
# (shuffle_sums). On an H100 (bench/results/h100-run64/) the small-call kernel took it 0.17 us a
# call faster at 28-32 warps, mixed at 16-20 and slower below 16; so the search is offered it
# from 16 warps, the lowest where it ever won. At 16384 tokens no record has taken it: the bf16
# forward at 4096-8192 retuned with it on the H200 (bench/results/h200-run67/, 48 trials).
SHUFFLE_SUMS_WARPS = 16


def shuffles_warp_sums(threads: int, warp_sums: bool, warps: int = SHUFFLE_SUMS_WARPS) -> bool:
    """Whether a row of ``threads`` with one barrier a row sum (warp_sums) has at least
    ``warps`` warps, from which its warps' sums may be added by shuffles (shuffle_sums): the tuned
    space's bound here, the small-call rule's its own (sched.default.small_call_shuffles)."""
    return warp_sums and threads >= 32 * warps


class KeptVariant(NamedTuple):
    """One structural variant of the forward that keeps its row of x in registers
    (fwd_kept_variants): the knobs that decide its register and thread layout, so not sampled."""
    threads: int
    vec: int
    keep_y: bool
    warp_sums: bool
    early_weights: bool
    shuffle_sums: bool = False

    def config(self, rows: int, **knobs) -> CudaRowConfig:
        return CudaRowConfig(threads=self.threads, rows=rows, vec=self.vec, keep_row=True, keep_y=self.keep_y,
                             warp_sums=self.warp_sums, early_weights=self.early_weights,
                             shuffle_sums=self.shuffle_sums, **knobs)


# Widths below which torch.compile's forward keeps x (a persistent reduction) and its launch
# shape is a seed of the forward tune (torch_compile_fwd_shapes); from 2048 columns it loops,
# reads x twice, and its shape lost to the records (rmsnorm 4096: 75.7-88.9 against 71.1 us,
# bench/results/h200-run25/).
TORCH_COMPILE_KEPT_BELOW = 2048


def torch_compile_fwd_shapes(key: NormKey) -> dict:
    """name -> CudaRowConfig: torch.compile's forward launch shape as points of our space
    (bench/results/h200-run24/launches.log), for 2-byte rows split in 16-byte vectors: from 2048
    columns a looped reduction, one row of 512 threads a block reading x twice (not kept);
    below, a persistent reduction keeping x, one warp a block that holds one row at 896-1024 and
    two at 512, and at hidden 128 two warps holding eight (1024 elements a block: the rows share
    its threads). Each with no cache hint, evict-first loads (1), the L2 evict_last policy (3)
    and torch.compile's pair (4: the reread evict_first). Empty for other keys (fp8 output:
    torch.compile's launch of it was not read)."""
    h = key.hidden_size
    if DTYPE_BYTES[key.itype] != 2 or h % 8 or not key.forward or key.otype.startswith("fp8"):
        return {}
    if h >= TORCH_COMPILE_KEPT_BELOW:
        threads, rows = 512, 1
    else:
        rows = max(1, min(8, 1024 // h))
        threads = (64 if h <= 128 else 32) // rows
    cfg = CudaRowConfig(threads=threads, rows=rows, vec=8, unroll=256, keep_row=h < TORCH_COMPILE_KEPT_BELOW)
    return {f"torch.compile-shape+stream{mode}": dataclasses.replace(cfg, stream=mode) for mode in (0, 1, 3, 4)}


def fwd_kept_variants(key: NormKey) -> list:
    """KeptVariants of the forward that keeps its row of x in registers:
    the two widest vector widths, and thread counts that give every thread 1 to
    FWD_KEPT_VECTORS vectors of the row and leave none without one (with idle threads,
    layernorm at hidden 1 failed to build: TVM mixed int32 and int64 bounds). With fp8 output
    each also with y computed once into registers (keep_y) or recomputed by the store and by
    amax: the registers are fp32, twice or four times those of x, so which wins depends on the
    block. Each variant whose rows take it (rows.warp_sums_problem) comes again with one barrier
    a row sum (warp_sums), and so do the warp multiples that split the row evenly
    (exact_thread_counts), which warp_sums needs: at 7168 no power of two times 16 bytes does.
    Each variant of rows of several warps, whose row sums wait at barriers, comes again with
    the weights loaded with x before them (early_weights): the registers they take (as many as
    x's, twice that for layernorm) may cost more warps than the wait after the barrier. And each
    warp_sums variant of SHUFFLE_SUMS_WARPS warps or more comes again with the warps' sums added
    by shuffles (shuffle_sums), as the small-call rule does from 24."""
    h = key.hidden_size
    out = []
    for vec in cuda_vec_choices(key)[-2:]:
        exact = exact_thread_counts(h, vec, FWD_KEPT_VECTORS)
        for threads in sorted(set(cuda_thread_choices(key)) | set(exact)):
            vectors = thread_vectors(h, threads, vec)
            if not (1 <= vectors <= FWD_KEPT_VECTORS and threads * vec <= h):
                continue
            sums = [False] * (threads not in exact) + [True] * (warp_sums_problem(threads, 1, vec, h) is None)
            out += [KeptVariant(threads, vec, keep_y, ws, early, shfl) for ws in sums
                    for keep_y in ((False, True) if key.fp8_out else (False,))
                    for early in ((False, True) if threads >= EARLY_WEIGHTS_THREADS else (False,))
                    for shfl in ((False, True) if shuffles_warp_sums(threads, ws) else (False,))]
    return out


def kept_rows(kept) -> list:
    """Rows per block a kept-row variant can have: one under warp_sums (its barrier must not sit
    under the last block's row guard), else as many as a block holds."""
    return [1] if kept.warp_sums else fused_rows(kept.threads)


def kept_guarded(kept) -> bool:
    """Whether a kept-row variant can have row guards (several rows a block) for full_chunks to
    drop: with one row a block it would measure the same kernel twice."""
    return max(kept_rows(kept)) > 1


def llvm_choices(key: NormKey) -> dict:
    """Knob values for the llvm space. Every combination must divide the row: reduction lanes
    (vec * acc) because a reduction's predicated tail does not survive reverse_compute_at, and
    the output step (unroll * vec) so the vectorised loop has no tail. So vec comes from the
    divisors of H, and acc / unroll from the values that divide H with the largest vec."""
    h = key.hidden_size
    vec = [v for v in CPU_VEC if h % v == 0] or [next(v for v in (2, 1) if h % v == 0)]
    top = max(vec)
    acc = [a for a in CPU_ACC if h % (a * top) == 0] or [1]
    unroll = [u for u in CPU_UNROLL if h % (u * top) == 0] or [1]
    rows = CPU_CHUNKS if key.stage in ("bwd", "bwd_add") else CPU_ROWS
    return {"vec": vec, "acc": acc, "unroll": unroll, "rows": list(rows)}


def llvm_space(key: NormKey):
    choices = llvm_choices(key)

    def space(sch):
        # sampled values go straight into split factors; nothing here branches on them
        vec = _categorical(sch, choices["vec"])
        acc = _categorical(sch, choices["acc"])
        unroll = _categorical(sch, choices["unroll"])
        rows = _categorical(sch, choices["rows"])
        schedule_rows_cpu(None, CpuRowConfig(vec=vec, rows=rows, acc=acc, unroll=unroll), sch=sch)
        return sch
    return space


def design_spaces(key: NormKey, kind: str) -> list:
    """One space-generating function per structural variant."""
    if kind == "llvm":
        return [llvm_space(key)]
    # A second variant staging the row in shared memory (x read from HBM once) was tried and
    # removed: its traces do not replay on the symbolic-row kernel (the staging loop's extent
    # then depends on the row count and cannot be vectorised).
    # The dx with its rows staged in shared memory by cp.async joins only with STAGED (see there).
    if key.stage in ("bwd", "bwd_add"):
        return [cuda_space(key, fused) for fused in fused_cuda_variants(key)]
    return [cuda_space(key)] + [cuda_space(key, kept=kept) for kept in fwd_kept_variants(key)]


def space_size(key: NormKey, kind: str) -> int:
    """How many distinct schedules the design space of a key holds (the tuner sizes its
    population by it)."""
    if kind == "llvm":
        n = 1
        for values in llvm_choices(key).values():
            n *= len(values)
        return n
    return _cuda_space_size(key, len(FULL_CHUNKS), fused_factors=True) * len(STREAM)


def _cuda_space_size(key: NormKey, full: int, fused_factors: bool) -> int:
    """The CUDA space's size with ``full`` values of full_chunks, and the fused backward's
    min_blocks, hoist_inits and shared_sums factors or not (without the stream factor)."""
    if key.stage in ("bwd", "bwd_add"):
        return sum(len(fused_lanes(v)) * full * (len(min_blocks_choices(v[0])) * len(HOIST_INITS)
                                                 * len(shared_sums_choices(key, v)) if fused_factors else 1)
                   for v in fused_cuda_variants(key))
    sampled = len(cuda_thread_choices(key)) * len(ROWS) * len(cuda_vec_choices(key)) * len(UNROLL) * full
    return sampled + sum(len(kept_rows(kept)) * (full if kept_guarded(kept) else 1) for kept in fwd_kept_variants(key))


def population_points(key: NormKey, kind: str) -> int:
    """The points a search round draws for ``key`` (tune._search): the space's size, but on CUDA
    without the full_chunks and stream factors, and for the fused backward without the
    min_blocks, hoist_inits and shared_sums ones, which together multiply it by up to 64 (38 ->
    2368 points at layernorm 8192, the smallest bwd space, which sets a batch's population). Drawing costs ~35 ms a point and
    task on the H200 host, and a round of a backward task measures 8."""
    if kind == "cuda":
        return _cuda_space_size(key, 1, fused_factors=False)
    return space_size(key, kind)


# Threads that build a key's structural variants at once. A backward key has ~110 of them,
# each a few hundred TVM schedule primitives at 1-2 ms a call: 5.4 s a key built one after
# another, 2.9 s in 2 threads on 2 cores (layernorm bwd 3584), as the primitives' C++ part runs
# without the GIL. More threads than cores gained nothing on 2 cores (4: 3.2-3.5 s). On the H200
# host (16 cores) a bf16 backward task of 32 trials took 14.7 s against 17.3 s built serially
# (bench/results/h200-run38/README.md).
SPACE_THREADS = 8


def space_fn(key: NormKey, kind: str):
    """The ScheduleFn body for MetaSchedule: every structural variant from a copy of ``sch``.
    The copies are made here, in order, so each forks the same random state as one after
    another would (Schedule.copy forks the seed of ``sch``); the variants are then built in
    threads, so their sampled decisions do not depend on which thread ran first."""
    def fn(sch):
        spaces = design_spaces(key, kind)
        copies = [sch.copy() for _ in spaces]
        workers = max(1, min(SPACE_THREADS, os.cpu_count() or 1, len(spaces)))
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="tvmnorm-space") as pool:
            list(pool.map(lambda space, s: space(s), spaces, copies))
        return copies
    return fn
