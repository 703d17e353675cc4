"""The same numerics as test_numerics.py on target "cuda", with torch CUDA tensors.

Skipped cleanly without a CUDA GPU (torch.cuda.is_available() False, or TVM built without CUDA).
Run on the GPU host with ``python -m pytest -q -m gpu tests/test_gpu_core.py``. Each key compiles
once (the default schedule, into the default-kernel cache: nvcc, or NVRTC without it); inputs and
outputs live on the GPU, the float64 reference runs on the host from the same rounded inputs.
"""
from __future__ import annotations

import pytest
import torch

from conftest import KernelCache, call, check_outputs, library_fixture, make_inputs, tensor, x_in_layout
from conftest import run_and_check as check_on
from tvmnorm.key import NormKey
from tvmnorm.runtime import variant_kernel


def _cuda_missing() -> str:
    """Why the CUDA tests cannot run here ("" when they can). The reason goes into the skip
    message: on a two-GPU lease one of two pytest processes started together skipped everything
    with no way to tell which check failed."""
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        from tvmnorm._tvm import cuda_available
        return "" if cuda_available() else "TVM's CUDA runtime sees no device"
    except Exception as e:  # noqa: BLE001 - any failure to reach TVM's CUDA runtime means no GPU tests
        return f"TVM's CUDA runtime failed: {type(e).__name__}: {e}"


_MISSING = _cuda_missing()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(bool(_MISSING), reason=f"needs a CUDA GPU (torch and TVM with CUDA): {_MISSING}")]

STAGES = ("fwd", "bwd", "bwd_add", "fwd_add")
NORMS = ("rmsnorm", "layernorm")
DTYPES = ("bf16", "fp16", "fp32")
HIDDENS = (128, 1000, 7168)
ROWS = (1, 4097)


@pytest.fixture(scope="module")
def cuda_kernels():
    return KernelCache("cuda")


def run_and_check(kernels, key, rows, rng, seed, chunks=1):
    return check_on(kernels, key, at_chunk(key, rows, chunks), rng, seed, device="cuda")


def at_chunk(key, rows, chunks=1):
    """``rows``, where "T-1", "T" or "T+1" is counted from ``chunks`` chunks of the key's
    default T rows (compute.norms.rows_per_partial: 32, or 64 for wide rows): a last chunk one
    row short, whole, or of one row, at every width. A kernel that holds shorter T (the
    runtime's: runtime.dx_chunk_rows) keeps its own only from runtime.own_t_rows (own_t_chunks);
    a variant_kernel runs its T at any rows."""
    if not isinstance(rows, str):
        return rows
    from tvmnorm.compute.norms import rows_per_partial
    return chunks * rows_per_partial(key, "cuda") + {"T-1": -1, "T": 0, "T+1": 1}[rows]


def own_t_chunks(key):
    """The fewest chunks of the default kernel's own T whose "T-1" still runs at that T."""
    from tvmnorm.compute.norms import rows_per_partial
    from tvmnorm.runtime import own_t_rows
    t = rows_per_partial(key, "cuda")
    return -(-(own_t_rows(t, key.hidden_size, tuned=False) + 1) // t)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("stage", STAGES)
def test_cuda_matrix(cuda_kernels, stage, norm, dtype, hidden, rows, rng, seed):
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    run_and_check(cuda_kernels, key, rows, rng, seed)


@pytest.mark.parametrize("hidden", (1, 4095))
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("stage", STAGES)
def test_cuda_odd_hidden_zero_centered(cuda_kernels, stage, norm, hidden, rng, seed):
    """Odd hidden sizes take the predicated tails of the row schedule."""
    key = NormKey(norm=norm, stage=stage, itype="bf16", wtype="bf16", otype="bf16", hidden_size=hidden,
                  zero_centered_gamma=True)
    run_and_check(cuda_kernels, key, 257, rng, seed)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("norm", NORMS)
def test_cuda_mixed_dtypes(cuda_kernels, stage, norm, rng, seed):
    key = NormKey(norm=norm, stage=stage, itype="bf16", wtype="fp32", otype="bf16", hidden_size=7168)
    run_and_check(cuda_kernels, key, 4097, rng, seed)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("otype", ("fp8e4m3", "fp8e5m2"))
@pytest.mark.parametrize("norm", NORMS)
def test_cuda_fp8_output(cuda_kernels, norm, otype, hidden, rows, rng, seed):
    key = NormKey(norm=norm, stage="fwd", itype="bf16", wtype="bf16", otype=otype, hidden_size=hidden)
    run_and_check(cuda_kernels, key, rows, rng, seed)


@pytest.mark.parametrize("stage", ("bwd", "bwd_add"))
@pytest.mark.parametrize("norm", NORMS)
def test_cuda_dgamma_bitwise_reproducible(cuda_kernels, norm, stage, rng, seed):
    key = NormKey(norm=norm, stage=stage, itype="bf16", wtype="fp32", otype="bf16", hidden_size=7168)
    rows = 4097
    inputs = make_inputs(key, rows, rng, device="cuda")
    k = cuda_kernels(key)
    first, second = call(k, inputs, rows, device="cuda"), call(k, inputs, rows, device="cuda")
    torch.cuda.synchronize()
    for name in ("dgamma", "dbeta") if norm == "layernorm" else ("dgamma",):
        assert torch.equal(first[name].view(torch.int32), second[name].view(torch.int32)), (
            f"{name} differs between two runs ({key.name} seed={seed})")
    check_outputs(key, inputs, first, f"cuda {key.name} rows={rows} seed={seed}")


@pytest.mark.parametrize("stage", ("bwd", "bwd_add"))
@pytest.mark.parametrize("norm", NORMS)
def test_cuda_two_stage_partial_sum(cuda_kernels, norm, stage, rng, seed):
    """More partials than runtime.COMBINE_ABOVE (T = 32: 1026, a tail group of 2): combine sums
    groups of them before finalize; right against float64, and bitwise reproducible."""
    from tvmnorm.runtime import COMBINE_ABOVE, partials
    key = NormKey(norm=norm, stage=stage, itype="bf16", wtype="fp32", otype="bf16", hidden_size=1000)
    rows = 32 * (COMBINE_ABOVE + 1) + 1
    assert partials(rows, key, "cuda") == COMBINE_ABOVE + 2
    inputs = make_inputs(key, rows, rng, device="cuda")
    k = cuda_kernels(key)
    first, second = call(k, inputs, rows, device="cuda"), call(k, inputs, rows, device="cuda")
    torch.cuda.synchronize()
    for name in ("dgamma", "dbeta") if norm == "layernorm" else ("dgamma",):
        assert torch.equal(first[name].view(torch.int32), second[name].view(torch.int32)), name
    check_outputs(key, inputs, first, f"cuda {key.name} rows={rows} seed={seed} (two-stage partial sum)")


@pytest.mark.parametrize("rows", (1, 17, 4095, 16385))
@pytest.mark.parametrize("norm,hidden,threads,block_rows,vec,warp_sums", [
    ("rmsnorm", 128, 8, 16, 8, False), ("layernorm", 128, 4, 4, 8, False), ("rmsnorm", 1000, 64, 4, 4, False),
    ("layernorm", 4096, 256, 2, 8, False), ("rmsnorm", 7168, 128, 1, 8, True), ("layernorm", 8192, 256, 1, 8, True)])
def test_cuda_fp8_amax_folded_by_blocks(norm, hidden, threads, block_rows, vec, warp_sums, rows, rng, seed):
    """A forward that folds its rows' maxima into amax (_tvm.AMAX_FOLD: a register a thread,
    one atomic a block, after amax_zero) is right against float64 with blocks of one to 16
    rows, a block of half a warp, warp_sums rows (every warp holds the row's maximum), a
    partial last block (rows past n must not fold) and more blocks than one wave."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage="fwd", itype="bf16", wtype="bf16", otype="fp8e4m3", hidden_size=hidden)
    keep = warp_sums or threads * block_rows < 32
    kernel = variant_kernel(key, "cuda", CudaRowConfig(threads=threads, rows=block_rows, vec=vec, keep_row=keep,
                                                       keep_y=keep, warp_sums=warp_sums))
    assert "amax_zero" in kernel._f and "amax" not in kernel._f
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("norm", NORMS)
def test_cuda_fp8_folded_amax_starts_from_zero(cuda_kernels, norm, rng, seed):
    """A folding forward's amax is zeroed by each call (amax_zero) before the rows fold into
    it: a call after one with larger values gives its own maximum, and a call of no rows 0;
    the largest |y| in the first row, a middle one or the last is found."""
    from tvmnorm.compute.norms import folds_amax
    key = NormKey(norm=norm, stage="fwd", itype="bf16", wtype="bf16", otype="fp8e4m3", hidden_size=4096)
    assert folds_amax(key, "cuda")
    k = cuda_kernels(key)
    rows = 4099
    inputs = make_inputs(key, rows, rng, device="cuda")
    outs = call(k, dict(inputs, x=inputs["x"] * 64), rows, device="cuda")  # amax now holds a larger maximum
    k(*[inputs[n] if n in inputs else outs[n] for n in k.signature])  # the same outputs again
    torch.cuda.synchronize()
    check_outputs(key, inputs, outs, f"cuda {key.name} rows={rows} seed={seed} (after a larger call)")
    for spike in (0, rows // 2, rows - 1):
        x = inputs["x"].clone()
        x[spike, 5] = 40.0
        again = call(k, dict(inputs, x=x), rows, device="cuda")
        torch.cuda.synchronize()
        check_outputs(key, dict(inputs, x=x), again, f"cuda {key.name} spike at row {spike} seed={seed}")
    none = make_inputs(key, 0, rng, device="cuda")
    empty = call(k, none, 0, device="cuda")
    torch.cuda.synchronize()
    assert float(empty["amax"][0]) == 0.0, "amax of no rows is not 0"


@pytest.mark.parametrize("cfg", [None, dict(threads=256, vec=8, keep_row=True, keep_y=True, paired_cast=False),
                                 dict(threads=512, vec=8), dict(threads=128, vec=1, keep_row=True, keep_y=True)],
                         ids=["default", "unpaired", "recomputed-y", "odd-vec"])
@pytest.mark.parametrize("otype", ("fp8e4m3", "fp8e5m2"))
@pytest.mark.parametrize("norm", NORMS)
def test_cuda_fp8_saturates_and_keeps_nan(norm, otype, cfg, rng, seed):
    """CUDA leaves the fp8 saturation to the hardware cast (cvt.rn.satfinite; no clamp written
    out): a scale that pushes most of y past the format's range gives +-max, never inf or NaN,
    right against float64 (amax is max|y| before scaling); and a NaN in x makes its row of y NaN,
    as the reference's clip keeps it (fminf/fmaxf of the written clamp had made it +-max),
    the other rows bitwise as without it."""
    from tvmnorm.compute.norms import FP8_MAX
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage="fwd", itype="bf16", wtype="bf16", otype=otype, hidden_size=4096)
    kernel = variant_kernel(key, "cuda", None if cfg is None else CudaRowConfig(**cfg))
    rows, bad = 33, 5
    inputs = make_inputs(key, rows, rng, device="cuda")
    inputs["scale"] = torch.tensor([{"fp8e4m3": 1000.0, "fp8e5m2": 1e5}[otype]], device="cuda")
    outs = call(kernel, inputs, rows, device="cuda")
    torch.cuda.synchronize()
    context = f"{key.name} {cfg} seed={seed}"
    check_outputs(key, inputs, outs, context)
    y = outs["y"].float()
    assert torch.isfinite(y).all(), context
    assert (y.abs() == FP8_MAX[otype]).float().mean() > 0.3, f"expected many saturated elements ({context})"
    # the NaN row: outputs filled with finite values first, so a NaN read back was written
    inputs["x"][bad, 17] = float("nan")
    again = {n: torch.zeros_like(t) for n, t in outs.items()}
    kernel(*[inputs[n] if n in inputs else again[n] for n in kernel.signature])
    torch.cuda.synchronize()
    assert torch.isnan(again["y"][bad].float()).all(), f"row {bad} of y is not all NaN ({context})"
    others = torch.arange(rows, device="cuda") != bad
    assert torch.equal(again["y"][others].view(torch.uint8), outs["y"][others].view(torch.uint8)), context


@pytest.mark.parametrize("stage", STAGES)
def test_cuda_zero_rows(cuda_kernels, stage, rng, seed):
    """No rows: nothing is launched for the row kernels, dgamma of nothing is 0."""
    key = NormKey(norm="layernorm", stage=stage, itype="bf16", wtype="bf16", otype="bf16", hidden_size=1000)
    inputs = make_inputs(key, 0, rng, device="cuda")
    outs = call(cuda_kernels(key), inputs, 0, device="cuda")
    torch.cuda.synchronize()
    for name in ("dgamma", "dbeta") if not key.forward else ():
        assert torch.equal(outs[name].float().cpu(), torch.zeros(1000)), name


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("norm", NORMS)
def test_cuda_large_hidden(cuda_kernels, stage, norm, rng, seed):
    """hidden 65536: 1024 threads per row, 8 vectors each, in the default rule."""
    key = NormKey(norm=norm, stage=stage, itype="bf16", wtype="bf16", otype="bf16", hidden_size=65536)
    run_and_check(cuda_kernels, key, 257, rng, seed)


@pytest.mark.parametrize("stage", ("fwd", "bwd", "fwd_add"))
def test_cuda_million_rows(cuda_kernels, stage, rng, seed):
    key = NormKey(stage=stage, itype="bf16", wtype="bf16", otype="bf16", hidden_size=128)
    run_and_check(cuda_kernels, key, 2_000_003, rng, seed)


@pytest.mark.parametrize("rows", (7, 128 * 8 + 7, 257 * 8 + 1, "T-1", "T", "T+1", 16384))
@pytest.mark.parametrize("hidden", (128, 1000, 4095, 7168))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("stage", ("bwd", "bwd_add"))
def test_cuda_bwd_partial_edges(cuda_kernels, stage, norm, dtype, hidden, rows, rng, seed):
    """The one-pass backward around its chunk of T rows (T = 32, or 64 for wide rows: a last
    chunk one row short, whole, of one row; with 4 or 8 rows prefetched per group, T - 1 and
    T + 1 also leave a partial group) at the fewest chunks that run the own T (own_t_chunks:
    256, or 3073 at hidden 128 and 394 at 1000, where DEFAULT_OWN_T_ELEMENTS binds), the
    training token count, and the smaller calls: the decode backward (7 rows; 1031 at the
    narrow widths, runtime.decode_bwd_rows) and the dx at chunks of 8 (runtime.dx_chunk_rows)
    with a last one of 7 rows (1031 at 4095 and 7168) or of one row (2057)."""
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    run_and_check(cuda_kernels, key, rows, rng, seed, chunks=own_t_chunks(key))


_DECODE_WIDTHS = [("bf16", 1), ("fp32", 7), ("bf16", 128), ("bf16", 1000), ("fp16", 4095), ("bf16", 7168),
                  ("fp32", 8192), ("bf16", 65536)]


# 2048 rows only where they run the decode backward (hidden <= 2048): past that they run the dx
# at short chunks, which test_cuda_bwd_partial_edges covers (and a float64 reference of 2048 x
# 65536 takes the host most of a shard's time)
@pytest.mark.parametrize("dtype,hidden,rows", [(d, h, r) for d, h in _DECODE_WIDTHS for r in (2, 63, 64, 65, 1000)]
                         + [(d, h, 2048) for d, h in _DECODE_WIDTHS if h <= 2048] + [("bf16", 4095, 1025)]
                         + [("bf16", 2560, 256), ("fp16", 4095, 511), ("bf16", 4096, 512), ("bf16", 4096, 513)])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("stage", ("bwd", "bwd_add"))
def test_cuda_decode_backward(cuda_kernels, stage, norm, dtype, hidden, rows, rng, seed):
    """Calls of at most decode_bwd_rows rows run the decode backward (dx without partials, then
    wgrad's column sums of dy and x: build.decode_funcs), at odd and tiny widths (predicated
    tails; at 1 and 7 a block holds 32 rows), rows too wide to keep in registers (65536), and
    row counts that leave a wgrad's last step of row lanes part full (wgrad_few's 8 x 8 rows a
    step up to WGRAD_FEW_ROWS; then wgrad_mid's, 16 x 8 at hidden 2049-4096, up to
    WGRAD_MID_ROWS, and around that edge; wgrad's lanes x 8: 128 x 8 at hidden <= 1024, 32 x 8
    at 2049-4096, 16 x 8 past it); 2048 rows run it at the narrow widths only, 1025 rows not at
    4095."""
    from tvmnorm.runtime import decode_bwd_rows
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden,
                  zero_centered_gamma=hidden == 1000)
    assert cuda_kernels(key).decodes(rows) == (rows <= decode_bwd_rows(hidden))
    run_and_check(cuda_kernels, key, rows, rng, seed)


@pytest.mark.parametrize("rows", ("T-1", 4097))
@pytest.mark.parametrize("norm,dtype,hidden,threads,vec,prefetch,stages", [
    ("layernorm", "bf16", 8192, 512, 8, 1, 2), ("rmsnorm", "bf16", 7168, 256, 8, 1, 3),
    ("layernorm", "fp32", 1000, 128, 4, 2, 2), ("rmsnorm", "fp16", 4095, 1024, 1, 4, 2),
    ("layernorm", "bf16", 128, 16, 8, 4, 3), ("rmsnorm", "bf16", 1024, 64, 8, 8, 2)])
def test_cuda_pipelined_dx(norm, dtype, hidden, threads, vec, prefetch, stages, rows, rng, seed):
    """The software-pipelined dx (the next `stages` - 1 groups of `prefetch` rows load while one
    computes; bench/bwd_parts.py --stages times it): right against float64 with a chunk one row
    short of T and a last chunk of one row, odd widths with a column tail, several chunk
    lanes per block."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage="bwd", itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    cfg = CudaRowConfig(threads=threads, rows=max(1, 128 // threads), vec=vec, prefetch=prefetch, stages=stages)
    kernel = variant_kernel(key, "cuda", cfg)
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (1, "T-1", 4097))
@pytest.mark.parametrize("norm,stage,dtype,hidden,threads,vec,prefetch,stages,weights", [
    ("layernorm", "bwd", "bf16", 2048, 128, 8, 1, 2, False), ("rmsnorm", "bwd", "bf16", 1024, 64, 8, 1, 4, True),
    ("layernorm", "bwd_add", "fp32", 1000, 128, 4, 2, 2, False), ("rmsnorm", "bwd", "fp16", 4096, 512, 8, 1, 2, False)])
def test_cuda_staged_dx(norm, stage, dtype, hidden, threads, vec, prefetch, stages, weights, rows, rng, seed):
    """The dx whose rows are copied into shared memory by cp.async, `stages` groups in flight
    (CudaRowConfig.staged; ThreadSync's barriers guard each buffer's refill): right against
    float64 with one row, a chunk one row short of T and a last chunk of one row, a column tail
    (1000), gamma held for the chunk, bwd_add."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    cfg = CudaRowConfig(threads=threads, vec=vec, prefetch=prefetch, stages=stages, chunk_weights=weights, staged=True)
    kernel = variant_kernel(key, "cuda", cfg)
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", ("T+1", 4097))
@pytest.mark.parametrize("norm,stage,dtype,hidden,threads,vec,prefetch,weights", [
    ("layernorm", "bwd", "bf16", 2048, 128, 8, 1, False), ("layernorm", "bwd", "bf16", 1024, 64, 8, 2, True),
    ("layernorm", "bwd_add", "fp32", 1000, 128, 4, 2, False), ("rmsnorm", "bwd", "fp16", 4096, 512, 8, 1, False)])
def test_cuda_staged_dx_over_full_chunks(norm, stage, dtype, hidden, threads, vec, prefetch, weights, rows, rng, seed):
    """The staged dx walking whole chunks without row guards (full_chunks: the walk's copy with
    its shared buffers' barriers under a test every thread of a block takes alike, _tvm
    _full_chunk), beside the guarded walk of the last chunk: right against float64 with one
    full chunk and a row, and 4097 rows."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    cfg = CudaRowConfig(threads=threads, vec=vec, prefetch=prefetch, stages=2, chunk_weights=weights, staged=True,
                        full_chunks=1)
    kernel = variant_kernel(key, "cuda", cfg)
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", ("T-1", 4097))
@pytest.mark.parametrize("norm,stage,dtype,hidden,threads,vec,min_blocks", [
    ("layernorm", "bwd", "bf16", 8192, 512, 8, 2), ("layernorm", "bwd", "bf16", 7168, 896, 8, 2),
    ("rmsnorm", "bwd", "bf16", 4096, 256, 8, 4), ("layernorm", "bwd_add", "fp32", 1000, 128, 4, 3),
    ("rmsnorm", "bwd_add", "fp16", 4095, 1024, 1, 2)])
def test_cuda_dx_under_a_register_cap(norm, stage, dtype, hidden, threads, vec, min_blocks, rows, rng, seed):
    """The dx kernel asked to fit ``min_blocks`` blocks an SM (__launch_bounds__(N, min_blocks):
    ptxas caps its registers, and at layernorm 7168 x 896 threads x 2 blocks, 36 registers, spills
    most of its running sums and rows): right against float64 with a chunk one row short of T and
    a last chunk of one row, odd widths with a column tail, several chunk lanes per block."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    cfg = CudaRowConfig(threads=threads, rows=max(1, 128 // threads), vec=vec, min_blocks=min_blocks)
    kernel = variant_kernel(key, "cuda", cfg)
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (1, "T-1", "T", "T+1", 4097, 16384))
@pytest.mark.parametrize("norm,stage,dtype,hidden,threads,vec,prefetch,stages,min_blocks", [
    ("layernorm", "bwd", "bf16", 8192, 512, 4, 2, 1, 1), ("layernorm", "bwd", "bf16", 7168, 448, 8, 1, 2, 1),
    ("rmsnorm", "bwd", "bf16", 4096, 256, 8, 2, 1, 2), ("layernorm", "bwd_add", "fp32", 1000, 128, 4, 2, 2, 1),
    ("rmsnorm", "bwd_add", "fp16", 4095, 1024, 1, 1, 1, 1), ("layernorm", "bwd", "bf16", 128, 16, 8, 4, 1, 1)])
def test_cuda_dx_walking_whole_chunks(norm, stage, dtype, hidden, threads, vec, prefetch, stages, min_blocks, rows,
                                      rng, seed):
    """The dx kernel whose walk over a chunk comes without row guards where all its rows are in
    bounds (full_chunks, _tvm.FULL_CHUNK), and guarded for the last chunk: right against float64
    with one row, a chunk one row short of T, exactly T, one past it, a last chunk of one
    row and whole chunks only, pipelined, under a register cap, with a column tail and bwd_add."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    cfg = CudaRowConfig(threads=threads, rows=max(1, 128 // threads), vec=vec, prefetch=prefetch, stages=stages,
                        min_blocks=min_blocks, full_chunks=1)
    kernel = variant_kernel(key, "cuda", cfg)
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (1, "T-1", "T+1", 4097))
@pytest.mark.parametrize("norm,stage,dtype,hidden,cfg,group", [
    ("layernorm", "bwd", "bf16", 7168, dict(threads=448, vec=8, prefetch=1, stages=2, full_chunks=1), 1),
    ("rmsnorm", "bwd", "bf16", 8192, dict(threads=512, vec=8, prefetch=2, chunk_weights=True, full_chunks=1), 1),
    ("layernorm", "bwd_add", "fp32", 1000, dict(threads=128, vec=4, prefetch=2, stages=2, min_blocks=2), 1),
    ("layernorm", "bwd", "bf16", 2048, dict(threads=128, vec=8, prefetch=2, stages=2, staged=True), 1),
    ("rmsnorm", "bwd_add", "fp16", 4095, dict(threads=1024, vec=1, prefetch=1), 1),
    ("layernorm", "bwd", "bf16", 4096, dict(threads=512, vec=8, prefetch=2), 2)])
def test_cuda_dx_hoisting_the_sums_init(norm, stage, dtype, hidden, cfg, group, rows, rng, seed):
    """The dx kernel that zeroes its running sums once before the walk (hoist_inits,
    _tvm.HOIST_INITS): right against float64 with one row, a chunk one row short of T, one past
    it and a last chunk of one row (chunks past n: sums of zero rows), walking whole chunks,
    pipelined, staged in shared memory, under a register cap, with gamma held, a column tail,
    bwd_add and grouped row sums."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    threads = cfg["threads"]
    cfg = CudaRowConfig(rows=1 if cfg.get("staged") else max(1, 128 // threads), hoist_inits=1, **cfg)
    kernel = variant_kernel(key, "cuda", cfg, group_rows=group)
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (1, "T-1", "T", "T+1", 4097, 16384))
@pytest.mark.parametrize("norm,stage,dtype,hidden,cfg", [
    ("layernorm", "bwd", "bf16", 8192, dict(threads=512, vec=8, min_blocks=2, full_chunks=1, hoist_inits=1)),
    ("layernorm", "bwd", "bf16", 7168, dict(threads=512, vec=8, chunk_weights=True, min_blocks=2, full_chunks=1)),
    ("rmsnorm", "bwd", "bf16", 4096, dict(threads=256, rows=2, vec=8, prefetch=2, min_blocks=2)),
    ("layernorm", "bwd_add", "fp32", 1000, dict(threads=128, rows=2, vec=4, prefetch=2, stages=2)),
    ("layernorm", "bwd", "bf16", 2048, dict(threads=128, vec=8, prefetch=1, stages=2, staged=True, full_chunks=1)),
    ("rmsnorm", "bwd_add", "fp16", 4095, dict(threads=1024, vec=1, prefetch=1)),
    ("layernorm", "bwd", "fp16", 128, dict(threads=16, rows=8, vec=8, prefetch=4))])
def test_cuda_dx_sums_in_shared_memory(norm, stage, dtype, hidden, cfg, rows, rng, seed):
    """The dx kernel keeping its running sums in shared memory (shared_sums, _tvm.SHARED_SUMS: a
    slot of each thread's own per sum, no barrier; 64 KB of dynamic shared memory at layernorm
    8192): right against float64 with one row, a chunk one row short of T, exactly T, one past it,
    a last chunk of one row and whole chunks only, two blocks an SM, several chunk lanes a block
    (their slots apart), pipelined, staged, gamma held, a column tail (1000, 4095) and bwd_add."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    kernel = variant_kernel(key, "cuda", CudaRowConfig(shared_sums=1, **cfg))
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (1, "T-1", "T", "T+1", 4097))
@pytest.mark.parametrize("norm,stage,dtype,hidden,cfg", [
    ("layernorm", "bwd", "bf16", 8192, dict(threads=512, vec=8, prefetch=2, full_chunks=1)),
    ("rmsnorm", "bwd", "bf16", 1000, dict(threads=64, rows=2, vec=8, prefetch=4)),
    ("layernorm", "bwd_add", "fp32", 4095, dict(threads=1024, vec=1, prefetch=2, stages=2)),
    ("rmsnorm", "bwd", "bf16", 4096, dict(threads=256, vec=8, prefetch=2, min_blocks=2)),
    ("layernorm", "bwd", "fp16", 128, dict(threads=16, rows=8, vec=8, prefetch=4))])
def test_cuda_dx_chunk_weights(norm, stage, dtype, hidden, cfg, rows, rng, seed):
    """The dx kernel holding gamma in registers for its whole chunk (chunk_weights): right
    against float64 with one row, a chunk one row short of T, exactly T, one past it and a last
    chunk of one row, several chunk lanes a block, a column tail (1000, 4095), pipelined, under a
    register cap, whole chunks without row guards, and bwd_add."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    kernel = variant_kernel(key, "cuda", CudaRowConfig(chunk_weights=True, **cfg))
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (1, "T-1", "T+1", 4097))
@pytest.mark.parametrize("norm,stage,dtype,hidden,threads,vec,group", [
    ("layernorm", "bwd", "bf16", 7168, 448, 8, 2), ("rmsnorm", "bwd", "bf16", 4096, 256, 8, 4),
    ("layernorm", "bwd_add", "fp32", 1000, 128, 4, 2), ("rmsnorm", "bwd_add", "fp16", 4095, 1024, 1, 2),
    ("layernorm", "bwd", "bf16", 128, 16, 8, 4), ("rmsnorm", "bwd", "bf16", 1024, 64, 8, 8),
    ("layernorm", "bwd", "fp16", 2048, 128, 8, 2)])
def test_cuda_grouped_dx(norm, stage, dtype, hidden, threads, vec, group, rows, rng, seed):
    """The dx kernel whose row sums are one reduction per group of P rows (one allreduce of P
    rows' sums: compute.norms._group_sums): right against float64 with one row, a chunk one row
    short of T (a last group short of P rows), a second chunk of one row, odd widths with a
    column tail, several chunk lanes per block, and bwd_add."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    cfg = CudaRowConfig(threads=threads, rows=max(1, 128 // threads), vec=vec, prefetch=group)
    kernel = variant_kernel(key, "cuda", cfg, group_rows=group)
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (1, 257, 16384))
@pytest.mark.parametrize("norm,dtype,otype,hidden,threads,vec,keep", [
    ("rmsnorm", "bf16", "bf16", 7168, 256, 4, True), ("rmsnorm", "bf16", "bf16", 8192, 1024, 8, True),
    ("layernorm", "bf16", "bf16", 8192, 256, 4, True), ("rmsnorm", "fp32", "fp32", 4096, 512, 4, False),
    ("layernorm", "fp16", "fp16", 2048, 64, 8, False), ("rmsnorm", "bf16", "fp8e4m3+y", 4096, 128, 4, True),
    ("layernorm", "bf16", "fp8e4m3", 7168, 896, 8, True),
    ("layernorm", "bf16", "bf16+shfl", 8192, 1024, 4, True), ("rmsnorm", "bf16", "fp8e4m3+y+shfl", 8192, 1024, 8, True),
    ("layernorm", "fp32", "fp32+shfl", 16384, 1024, 4, False), ("layernorm", "bf16", "bf16+shfl", 2560, 320, 4, True),
    ("rmsnorm", "bf16", "bf16+shfl", 7168, 896, 4, True), ("layernorm", "fp16", "fp16+shfl", 2048, 64, 8, False)])
def test_cuda_fwd_warp_sums(norm, dtype, otype, hidden, threads, vec, keep, rows, rng, seed):
    """The forward whose row sums take one barrier (warp_sums: each warp's sum by shuffles into
    shared memory, then every thread adds the warps', or with shuffle_sums each warp adds them
    by shuffles, its lanes past the last warp guarded out): right against float64, with the
    row kept in registers or loaded per stage, 2 to 32 warps a row (896 threads: 28), LayerNorm's
    two sums and fp8's amax, and one row, an odd count and the training rows."""
    from tvmnorm.sched.rows import CudaRowConfig
    otype, shuffle = otype.removesuffix("+shfl"), otype.endswith("+shfl")
    otype, keep_y = otype.removesuffix("+y"), otype.endswith("+y")
    key = NormKey(norm=norm, stage="fwd", itype=dtype, wtype=dtype, otype=otype, hidden_size=hidden)
    cfg = CudaRowConfig(threads=threads, rows=1, vec=vec, keep_row=keep, keep_y=keep_y, warp_sums=True,
                        shuffle_sums=shuffle)
    kernel = variant_kernel(key, "cuda", cfg)
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (1, 33, 4097))
@pytest.mark.parametrize("norm,dtype,otype,hidden,cfg", [
    ("rmsnorm", "bf16", "bf16", 8192, dict(threads=512, rows=2, vec=8)),
    ("layernorm", "bf16", "bf16", 1000, dict(threads=128, rows=2, vec=4)),
    ("rmsnorm", "bf16", "bf16", 7168, dict(threads=896, vec=8, warp_sums=True)),
    ("layernorm", "bf16", "fp8e4m3", 4096, dict(threads=512, vec=8)),
    ("layernorm", "bf16", "fp8e4m3", 4096, dict(threads=256, vec=8, keep_y=True)),
    ("layernorm", "fp16", "fp16", 2048, dict(threads=64, rows=2, vec=8, full_chunks=1)),
    ("rmsnorm", "fp32", "fp32", 4095, dict(threads=1024, vec=1))])
def test_cuda_fwd_early_weights(norm, dtype, otype, hidden, cfg, rows, rng, seed):
    """The kept-row forward with its weights loaded with x, before the row sums' barriers
    (early_weights): right against float64 with one row, partial last blocks, a column tail
    (1000, 4095), one barrier a row sum, fp8 with y recomputed or kept, and whole blocks
    without row guards."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage="fwd", itype=dtype, wtype=dtype, otype=otype, hidden_size=hidden)
    kernel = variant_kernel(key, "cuda", CudaRowConfig(keep_row=True, early_weights=True, **cfg))
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (1, 33, 4097))
@pytest.mark.parametrize("norm,stage,dtype,otype,hidden,cfg", [
    ("rmsnorm", "fwd", "bf16", "bf16", 7168, dict(threads=512, vec=4, keep_row=True, stream=1)),
    ("layernorm", "fwd", "bf16", "fp8e4m3", 4096, dict(threads=512, vec=8, keep_row=True, keep_y=True, stream=2)),
    ("layernorm", "fwd", "fp32", "fp32", 1000, dict(threads=32, rows=4, vec=4, full_chunks=1, stream=2)),
    ("layernorm", "bwd", "bf16", "bf16", 8192, dict(threads=512, vec=4, prefetch=2, full_chunks=1, stream=2)),
    ("rmsnorm", "bwd_add", "bf16", "bf16", 1024, dict(threads=128, vec=8, prefetch=1, stages=2, stream=1)),
    ("rmsnorm", "bwd", "fp16", "fp16", 4095, dict(threads=1024, vec=1, stream=2)),
    ("rmsnorm", "fwd", "bf16", "bf16", 7168, dict(threads=256, vec=8, keep_row=True, stream=3)),
    ("layernorm", "fwd", "bf16", "bf16", 128, dict(threads=16, rows=8, vec=8, keep_row=True, full_chunks=1, stream=3)),
    ("layernorm", "fwd", "bf16", "fp8e4m3", 1024, dict(threads=64, rows=4, vec=8, keep_row=True, keep_y=True, stream=3)),
    ("rmsnorm", "bwd", "bf16", "bf16", 4096, dict(threads=256, vec=8, prefetch=2, stream=3)),
    ("rmsnorm", "fwd", "bf16", "bf16", 7168, dict(threads=512, vec=8, stream=4)),
    ("layernorm", "fwd", "fp16", "fp16", 4095, dict(threads=512, vec=1, stream=4)),
    ("layernorm", "fwd", "bf16", "bf16", 4096, dict(threads=512, vec=8, stream=4))])
def test_cuda_streaming_rows(norm, stage, dtype, otype, hidden, cfg, rows, rng, seed):
    """Rows loaded evict-first (stream 1: ld.global.cs) and also stored so (2: st.global.cs), or
    with an L2 evict_last policy (3; 4: the last of several reads of a row evict_first): right against float64 with
    one row, odd counts, the fp8 forward, a pipelined and a whole-chunk dx, bwd_add and a width
    of scalar accesses (4095: nothing to hint)."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=otype, hidden_size=hidden)
    kernel = variant_kernel(key, "cuda", CudaRowConfig(**cfg))
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (1, 7, 8, 9, 16385))
@pytest.mark.parametrize("norm,dtype,otype,hidden,threads,block_rows,vec,keep", [
    ("rmsnorm", "bf16", "bf16", 128, 16, 8, 8, True), ("layernorm", "bf16", "bf16", 128, 16, 8, 8, False),
    ("layernorm", "bf16", "fp8e4m3+y", 1024, 64, 4, 8, True), ("layernorm", "fp32", "fp32", 1000, 32, 4, 4, False),
    ("rmsnorm", "fp16", "fp8e5m2", 4095, 128, 8, 1, False), ("rmsnorm", "bf16", "bf16", 2048, 256, 2, 8, True)])
def test_cuda_fwd_whole_blocks(norm, dtype, otype, hidden, threads, block_rows, vec, keep, rows, rng, seed):
    """The forward that computes a block whose rows are all below n without row guards
    (full_chunks, _tvm.FULL_CHUNK) and the last block with them: right against float64 with one
    row, a block one row short, a whole one, one row past it and the training rows of hidden 128
    plus one, rows of part of a warp and of several warps (barriers in both versions), column
    tails and fp8 output with its amax."""
    from tvmnorm.sched.rows import CudaRowConfig
    otype, keep_y = otype.removesuffix("+y"), otype.endswith("+y")
    key = NormKey(norm=norm, stage="fwd", itype=dtype, wtype=dtype, otype=otype, hidden_size=hidden)
    cfg = CudaRowConfig(threads=threads, rows=block_rows, vec=vec, keep_row=keep, keep_y=keep_y, full_chunks=1)
    kernel = variant_kernel(key, "cuda", cfg)
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (1, 257))
@pytest.mark.parametrize("norm,dtype,otype,hidden,threads,vec", [
    ("rmsnorm", "bf16", "bf16", 8192, 1024, 8), ("layernorm", "bf16", "bf16", 7168, 256, 4),
    ("layernorm", "fp32", "fp32", 1000, 32, 4), ("rmsnorm", "fp16", "fp16", 4095, 512, 1),
    ("rmsnorm", "bf16", "fp8e4m3", 128, 16, 8), ("layernorm", "bf16", "fp8e4m3", 2048, 64, 8),
    ("rmsnorm", "bf16", "fp8e4m3+y", 1000, 32, 8), ("layernorm", "bf16", "fp8e4m3+y", 7168, 256, 4),
    ("layernorm", "fp16", "fp8e5m2+y", 4095, 1024, 1)])
def test_cuda_fwd_kept_row(norm, dtype, otype, hidden, threads, vec, rows, rng, seed):
    """The forward that keeps its row of x in registers for every stage (keep_row, a structural
    variant of the tuned space): right against float64 with a partial last block of rows,
    column tails (1000 with 4-wide vectors, 4095) and fp8 output with its amax, with y kept in
    registers too (+y: keep_y) or recomputed."""
    from tvmnorm.sched.rows import CudaRowConfig
    otype, keep_y = otype.removesuffix("+y"), otype.endswith("+y")
    key = NormKey(norm=norm, stage="fwd", itype=dtype, wtype=dtype, otype=otype, hidden_size=hidden)
    cfg = CudaRowConfig(threads=threads, rows=max(1, 128 // threads), vec=vec, keep_row=True, keep_y=keep_y)
    kernel = variant_kernel(key, "cuda", cfg)
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (1, 33, 4097))
@pytest.mark.parametrize("norm,dtype,otype,hidden,cfg", [
    ("rmsnorm", "bf16", "bf16", 7168, dict(threads=256, vec=4, keep_row=True)),
    ("layernorm", "bf16", "bf16", 8192, dict(threads=1024, vec=8, keep_row=True, warp_sums=True)),
    ("rmsnorm", "bf16", "bf16", 128, dict(threads=16, rows=8, vec=8, keep_row=True, full_chunks=1, stream=3)),
    ("layernorm", "bf16", "bf16", 1000, dict(threads=32, rows=4, vec=8, keep_row=True, early_weights=True)),
    ("layernorm", "bf16", "fp8e4m3", 4096, dict(threads=512, vec=8, keep_row=True, keep_y=True)),
    ("rmsnorm", "fp16", "fp8e5m2", 2048, dict(threads=64, rows=2, vec=8, keep_row=True)),
    ("rmsnorm", "bf16", "bf16", 4096, dict(threads=512, vec=8, stream=1)),
    ("layernorm", "bf16", "bf16", 128, dict(threads=8, rows=16, vec=4, full_chunks=1)),
    ("layernorm", "fp32", "fp32", 4095, dict(threads=1024, vec=1, warp_sums=False)),
    ("rmsnorm", "bf16", "fp8e4m3", 1000, dict(threads=64, rows=2, vec=4))])
def test_cuda_fwd_add_variants(norm, dtype, otype, hidden, cfg, rows, rng, seed):
    """fwd_add (h = x + residual written beside y, y the norm of h) at points of the tuned
    space: h kept in registers with the row (keep_row: added once, read by the sums, y and h's
    store) with one barrier a sum, weights loaded early, whole blocks, L2 hints and fp8 output
    (y kept or recomputed); or added again by each stage, h's store on the rows' loops beside
    them (several rows a block, a partial warp a row, column tails); h bit for bit torch's add."""
    from tvmnorm.sched.rows import CudaRowConfig
    key = NormKey(norm=norm, stage="fwd_add", itype=dtype, wtype=dtype, otype=otype, hidden_size=hidden)
    kernel = variant_kernel(key, "cuda", CudaRowConfig(**cfg))
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (1, 4097))
@pytest.mark.parametrize("key", [NormKey(norm="layernorm", stage="bwd", hidden_size=7168),
                                 NormKey(stage="bwd_add", hidden_size=1000), NormKey(norm="rmsnorm", hidden_size=4095),
                                 NormKey(norm="layernorm", otype="fp8e4m3", hidden_size=2048),
                                 NormKey(stage="bwd", hidden_size=128)], ids=lambda k: k.name)
def test_cuda_int32_row_kernels(key, rows, rng, seed):
    """The default schedule with an int32 row count (compute.symbolic_rows(32): the index width
    tuning candidates get, which the probes time against the library's int64): right against
    float64 with partial chunks and blocks, column tails and the fp8 amax."""
    kernel = variant_kernel(key, "cuda", row_bits=32)
    assert kernel.row_bits == 32
    run_and_check(lambda _: kernel, key, rows, rng, seed)


@library_fixture()
def small_call_library(tmp_path_factory):
    """A CUDA library (nvcc, as `tvmnorm build` makes it) of two forward keys with their
    committed H200 records: each holds the tuned kernel and the default's small-call one."""
    from tvmnorm.build import build_library
    from tvmnorm.runtime import Registry
    from tvmnorm.tune import load_records
    records = load_records("cuda")
    # an fp8 key where one has a record (fp8 records go when the fp8 compute changes, until retuned)
    second = [k for k in (NormKey(norm="layernorm", otype="fp8e4m3", hidden_size=1024),
                          NormKey(norm="layernorm", hidden_size=1024)) if k.pack() in records][:1]
    keys = [NormKey(norm="rmsnorm", hidden_size=4096)] + second
    assert len(keys) == 2 and all(k.pack() in records for k in keys), "the committed schedules lack the records these tests use"
    out = tmp_path_factory.mktemp("small-call") / "cuda"
    build_library(keys, "cuda", out, records={k.pack(): records[k.pack()] for k in keys}, log=lambda *_: None)
    reg = Registry()
    reg.set_library("cuda", out)
    return reg, keys


@pytest.mark.parametrize("which", (0, 1))
def test_cuda_library_serves_small_calls_with_the_default_kernel(small_call_library, which, rng, seed):
    """Through a built library: calls of at most SMALL_CALL_BYTES of x run the default's kernel,
    larger ones the tuned one, both right against float64 on either side of the bound (fp8 output
    with its amax included)."""
    from tvmnorm.key import DTYPE_BYTES
    from tvmnorm.runtime import SMALL_CALL_BYTES
    reg, keys = small_call_library
    key = keys[which]
    kernel = reg.get(key, "cuda")
    bound = SMALL_CALL_BYTES // (key.hidden_size * DTYPE_BYTES[key.itype])
    assert kernel.tuned and kernel.forward_for(bound) is not kernel.forward_for(bound + 1)
    for rows in (1, bound, bound + 1, 4 * bound + 1):
        run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("hidden", (128, 2560, 7168))
@pytest.mark.parametrize("otype", ("bf16", "fp32", "fp8e4m3"))
@pytest.mark.parametrize("norm", NORMS)
def test_cuda_default_key_serves_small_calls_with_its_own_kernel(cuda_kernels, norm, otype, hidden, rng, seed):
    """A key without a record whose small-call rule differs from its forward's
    (sched.default.small_call_cuda_heuristic: QK-norm's hidden 128, one vector a thread; a row a
    block, at most 16 bytes of it a thread, one barrier a row sum over 10 or 28 warps at 2560 and
    7168 in bf16, the 28 warps' sums added by shuffles, two over 32 warps at fp32 7168) holds a
    small-call kernel of its own: calls of at most SMALL_CALL_BYTES of x run it, larger ones the
    int32 forward, both right against float64 on either side of the bound (fp8 output with its
    amax)."""
    from tvmnorm.build import has_own_small_call
    from tvmnorm.key import DTYPE_BYTES
    from tvmnorm.runtime import SMALL_CALL_BYTES
    itype = "fp32" if otype == "fp32" else "bf16"
    key = NormKey(norm=norm, itype=itype, wtype=itype, otype=otype, hidden_size=hidden)
    kernel = cuda_kernels(key)
    assert has_own_small_call(key, "cuda") and not kernel.tuned
    bound = SMALL_CALL_BYTES // (key.hidden_size * DTYPE_BYTES[key.itype])
    assert kernel.forward_for(bound) is kernel._small["fwd"] and kernel.forward_for(bound + 1) is kernel._narrow["fwd"]
    for rows in (1, 32, 255, bound, bound + 1):
        run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("cache", ["fresh", "warm"])
@pytest.mark.parametrize("stage", ["fwd", "bwd"])
def test_cuda_call_past_int32_offsets_runs_the_int64_kernels(stage, cache, seed, tmp_path, monkeypatch):
    """A call of more than 2^31 elements per tensor (rmsnorm at hidden 4096, 2^19 + 3 rows: 4.3 GB
    of bf16 per tensor) runs the int64 row kernel (the int32 one's offsets would wrap), and is
    right against float64 where a wrapped offset would land (the last rows), at the first rows,
    in every row's rsigma, and in dgamma, which sums all of them. From a fresh default-kernel
    cache the int64 kernel is compiled on this first such call; from an entry built whole
    (scripts/warm_cache.py's, which a lease's shards share) it is there at once."""
    import warnings

    from tvmnorm.build import key_funcs
    from tvmnorm.runtime import Registry, _cached_module, cache_path, fits_int32
    hidden, rows = 4096, (1 << 31) // 4096 + 3
    key = NormKey(stage=stage, hidden_size=hidden)
    part = "fwd" if stage == "fwd" else "dx"
    # a cache of its own, whatever the shared one of a lease's shards holds for this key
    monkeypatch.setenv("TVMNORM_CACHE", str(tmp_path / "cache"))
    if cache == "warm":
        _cached_module(cache_path(key, "cuda"), "cuda", lambda: key_funcs(key, "cuda"))
    reg = Registry()
    reg.set_library("cuda", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernel = reg.get(key, "cuda")
    if cache == "fresh":
        assert kernel._wide is not None and part not in kernel._f
    else:
        assert kernel._wide is None and part in kernel._f
    assert not fits_int32(rows, hidden) and kernel.parts_for(rows)[part] is kernel._f[part]
    assert kernel._wide is None
    assert kernel.parts_for(rows - 2048)[part] is not kernel._f[part]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    gamma = torch.randn(hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    eps = 1e-6
    check_rows = torch.cat([torch.arange(64), torch.arange(rows - 67, rows)]).cuda()
    rs_ref = torch.empty(rows, device="cuda", dtype=torch.float64)
    for i in range(0, rows, 1 << 16):
        rs_ref[i:i + (1 << 16)] = torch.rsqrt(x[i:i + (1 << 16)].double().square().mean(1) + eps)
    xs, g = x[check_rows].double(), gamma.double()

    def assert_close(what, got, want, rtol, atol):
        err = (got.double() - want).abs() - (atol + rtol * want.abs())
        assert not torch.isnan(got).any(), f"{what}: NaN (unwritten output)"
        assert err.max().item() <= 0, f"{what}: off by {err.max().item():.3g} beyond tolerance"

    if stage == "fwd":
        y = torch.full_like(x, float("nan"))
        rsigma = torch.full((rows,), float("nan"), device="cuda")
        kernel(x, gamma, y, rsigma, eps=eps)
        assert_close("rsigma", rsigma, rs_ref, 1e-5, 0)
        assert_close("y", y[check_rows], xs * rs_ref[check_rows, None] * g, 2 ** -7, 1e-2)
        return
    dy = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    rsigma = rs_ref.float()
    dx = torch.full_like(x, float("nan"))
    dgamma = torch.full((hidden,), float("nan"), device="cuda", dtype=torch.bfloat16)
    kernel(dy, x, rsigma, gamma, dx, dgamma)
    dg_ref = torch.zeros(hidden, device="cuda", dtype=torch.float64)
    for i in range(0, rows, 1 << 16):
        s = slice(i, i + (1 << 16))
        dg_ref += (dy[s].double() * x[s].double() * rsigma[s, None].double()).sum(0)
    assert_close("dgamma", dgamma, dg_ref, 2 ** -7, 1e-3 * dg_ref.abs().max().item())
    rs = rsigma[check_rows, None].double()
    xhat, gdy = xs * rs, dy[check_rows].double() * g
    assert_close("dx", dx[check_rows], rs * (gdy - xhat * (gdy * xhat).mean(1, keepdim=True)), 2 ** -7, 1e-2)


@pytest.mark.parametrize("rows", (1, 4097))
def test_cuda_library_of_several_translation_units(tmp_path_factory, rows, rng, seed):
    """A CUDA library compiled as several .cu files at once and linked into one .so
    (cuda_aot.build_cuda_library, as `tvmnorm build` makes one on a many-core host): every
    key's kernels, from whichever unit, right against float64 (int32 rows; fp8 with its amax;
    the backward's partial sums)."""
    from tvmnorm.build import build_library
    from tvmnorm.runtime import Registry
    keys = [NormKey(hidden_size=1024), NormKey(norm="layernorm", stage="bwd", hidden_size=1000),
            NormKey(otype="fp8e4m3", hidden_size=4096), NormKey(norm="layernorm", stage="bwd_add", hidden_size=7168)]
    out = tmp_path_factory.mktemp(f"units-{rows}") / "cuda"
    build_library(keys, "cuda", out, log=lambda *_: None, jobs=3)
    reg = Registry()
    reg.set_library("cuda", out)
    for key in keys:
        kernel = reg.get(key, "cuda")
        assert kernel.origin == "library:default", kernel.origin
        run_and_check(lambda _: kernel, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (1, 4097))
@pytest.mark.parametrize("arch,key", [
    ("sm_80", NormKey(norm="layernorm", stage="bwd", hidden_size=1000)),
    ("sm_80", NormKey(stage="bwd_add", hidden_size=7168)),
    ("sm_80", NormKey(norm="layernorm", itype="fp16", wtype="fp16", otype="fp16", hidden_size=4095)),
    ("sm_89", NormKey(otype="fp8e4m3", hidden_size=4096))], ids=lambda v: getattr(v, "name", v))
def test_cuda_default_kernels_compiled_for_an_older_gpu(arch, key, rows, monkeypatch, rng, seed):
    """The default kernels compiled for an older GPU (TVMNORM_CUDA_ARCH: an A100's sm_80, without
    programmatic dependent launch; an L40's sm_89, the first with fp8) run here from their PTX,
    which the driver compiles for this GPU: the code such a GPU runs, right against float64."""
    from tvmnorm.targets import target_name
    monkeypatch.setenv("TVMNORM_CUDA_ARCH", arch)
    assert target_name("cuda") == f"cuda-{arch}"
    kernel = KernelCache("cuda")(key)
    assert kernel.origin == "default", kernel.origin
    run_and_check(lambda _: kernel, key, rows, rng, seed)


PDL_CHAINS = [("layernorm", 7168, "bf16"), ("rmsnorm", 1024, "bf16"), ("rmsnorm", 128, "bf16"),
              ("layernorm", 4096, "fp8e4m3")]


@library_fixture(params=["library", "jit"])
def pdl_library(request, tmp_path_factory):
    """(registry, whether it launches with PDL, the kernels' origin) for the forward and backward
    keys of PDL_CHAINS: one library of their default schedules, or the runtime's default-kernel
    cache, which nvcc compiles as it does a library (cuda_aot.jit_nvcc)."""
    from tvmnorm.build import build_library
    from tvmnorm.cuda_aot import jit_nvcc, pdl_enabled
    from tvmnorm.runtime import Registry
    from tvmnorm.targets import arch_of
    reg = Registry()
    if request.param == "jit":
        if not jit_nvcc():
            pytest.skip("the default-kernel cache is TVM's CUDA module without nvcc (or with TVMNORM_JIT_NVCC=0)")
        reg.set_library("cuda", None)
        return reg, pdl_enabled(arch_of("cuda")), "default"
    keys = [k for norm, hidden, otype in PDL_CHAINS for k in (
        NormKey(norm=norm, otype=otype, hidden_size=hidden), NormKey(norm=norm, stage="bwd", hidden_size=hidden))]
    out = tmp_path_factory.mktemp("pdl") / "cuda"
    manifest = build_library(keys, "cuda", out, log=lambda *_: None)
    reg.set_library("cuda", out)
    return reg, manifest["pdl"], "library:default"


def pdl_chain(reg, norm, hidden, otype, rows):
    """The forward and backward keys of a PDL_CHAINS case, their kernels from ``reg`` and its row
    count ("train": 4097, or 65537 rows of 128, where the backward runs combine too)."""
    fwd = NormKey(norm=norm, otype=otype, hidden_size=hidden)
    bwd = NormKey(norm=norm, stage="bwd", hidden_size=hidden)
    rows = (4097 if hidden > 128 else 65537) if rows == "train" else rows
    return fwd, bwd, reg.get(fwd, "cuda"), reg.get(bwd, "cuda"), rows


def bwd_inputs_of(f_in, f_out, dy, norm):
    """The backward's inputs after a forward call: its x and gamma, dy, and the statistics it wrote."""
    return {"x": f_in["x"], "gamma": f_in["gamma"], "dy": dy, "rsigma": f_out["rsigma"],
            **({"mu": f_out["mu"]} if norm == "layernorm" else {})}


@pytest.mark.parametrize("rows", ("train", 64))
@pytest.mark.parametrize("norm,hidden,otype", PDL_CHAINS)
def test_cuda_library_chains_under_programmatic_dependent_launch(pdl_library, norm, hidden, otype, rows, rng, seed):
    """On sm_90 a library (or default-cache) kernel that runs after another of the same call (the
    backward's combine and finalize after its dx, the decode backward's wgrad after its dx, the
    fp8 forward after amax_zero) is launched with programmatic dependent launch and waits at its entry for the one
    ahead (_tvm.pdl_source). Chained with no synchronisation: a torch copy writes x, our forward
    reads it and writes the statistics, our backward reads them at once, four rounds back to back,
    at training rows (dx, finalize; 65537 rows of 128: dx, combine, finalize) and at 64 (the
    decode backward); every output of every round right against float64, and the weight
    gradients of the rounds bitwise equal (a kernel reading what the one ahead still writes shows
    as NaN from the poisoned outputs, or as sums that move between rounds)."""
    import numpy as np
    reg, pdl, origin = pdl_library
    major, minor = torch.cuda.get_device_capability()
    assert pdl is (major * 10 + minor >= 90)
    fwd, bwd, kf, kb, rows = pdl_chain(reg, norm, hidden, otype, rows)
    assert kf.origin == kb.origin == origin
    host = make_inputs(fwd, rows, rng, device="cuda")
    dy = tensor(rng.standard_normal((rows, hidden)), "bf16", "cuda")
    rounds = []
    for _ in range(4):
        x = torch.empty_like(host["x"]).copy_(host["x"])
        f_in = dict(host, x=x)
        f_out = call(kf, f_in, rows, device="cuda")
        b_in = bwd_inputs_of(f_in, f_out, dy, norm)
        rounds.append((f_in, f_out, b_in, call(kb, b_in, rows, device="cuda")))
    torch.cuda.synchronize()
    sums = ("dgamma", "dbeta") if norm == "layernorm" else ("dgamma",)
    for i, (f_in, f_out, b_in, b_out) in enumerate(rounds):
        context = f"round {i} {norm} {hidden} rows={rows} seed={seed}"
        check_outputs(fwd, f_in, f_out, context)
        check_outputs(bwd, b_in, b_out, context)
        for name in sums:
            assert np.array_equal(b_out[name].view(torch.int16).cpu().numpy(),
                                  rounds[0][3][name].view(torch.int16).cpu().numpy()), f"{name} moved: {context}"


@pytest.mark.parametrize("rows", ("train", 64))
@pytest.mark.parametrize("norm,hidden,otype", PDL_CHAINS)
def test_cuda_library_calls_replay_in_a_cuda_graph(pdl_library, norm, hidden, otype, rows, rng, seed):
    """A forward and a backward call of the library captured in one CUDA graph (torch's capture
    on a side stream, after a warm-up call) and replayed on new inputs copied into the captured
    buffers, outputs poisoned before each replay: every output right against float64 after each
    of three replays. The calls' later kernels are launched with programmatic dependent launch
    (_tvm.pdl_source), which a capture records as programmatic edges; the backward's partials
    come from the graph's memory pool."""
    from conftest import captured, output_specs, poisoned
    fwd, bwd, kf, kb, rows = pdl_chain(pdl_library[0], norm, hidden, otype, rows)
    f_in = {n: t.clone() for n, t in make_inputs(fwd, rows, rng, device="cuda").items()}
    dy = tensor(rng.standard_normal((rows, hidden)), "bf16", "cuda")
    f_out = {n: poisoned(shape, dt, "cuda") for n, (shape, dt) in output_specs(fwd, rows).items()}
    b_out = {n: poisoned(shape, dt, "cuda") for n, (shape, dt) in output_specs(bwd, rows).items()}
    b_in = bwd_inputs_of(f_in, f_out, dy, norm)

    def run():
        kf(*[f_in[n] if n in f_in else f_out[n] for n in kf.signature])
        kb(*[b_in[n] if n in b_in else b_out[n] for n in kb.signature])
    graph, _ = captured(run)
    for i in range(3):
        fresh_f = make_inputs(fwd, rows, rng, device="cuda")
        for n in f_in:
            f_in[n].copy_(fresh_f[n])
        dy.copy_(tensor(rng.standard_normal((rows, hidden)), "bf16", "cuda"))
        for t in (*f_out.values(), *b_out.values()):
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        context = f"replay {i} {norm} {hidden} {otype} rows={rows} seed={seed}"
        check_outputs(fwd, f_in, f_out, context)
        check_outputs(bwd, b_in, b_out, context)


@pytest.mark.parametrize("rows", (1, 33, 4097))
@pytest.mark.parametrize("norm,otype,hidden", [
    ("rmsnorm", "bf16", 7168), ("rmsnorm", "bf16", 8192), ("layernorm", "bf16", 128), ("layernorm", "bf16", 1024),
    ("rmsnorm", "fp8e4m3", 1024), ("layernorm", "fp8e4m3", 8192), ("rmsnorm", "bf16", 1000)])
def test_cuda_stats_first(norm, otype, hidden, rows, monkeypatch, rng, seed):
    """The forward storing its rows' statistics before their y (_tvm.STATS_FIRST): the
    committed record's kernels (the default's where none) right against float64 with one row,
    odd counts and a block's rows short (full_chunks records), fp8 with its folded amax."""
    from tvmnorm.compute import norms
    from tvmnorm.runtime import record_kernel
    from tvmnorm.tune import load_records
    monkeypatch.setattr(norms, "stores_stats_first", lambda key, kind: True)
    key = NormKey(norm=norm, otype=otype, hidden_size=hidden)
    kernel = record_kernel(key, "cuda", load_records("cuda").get(key.pack()))
    run_and_check(lambda _: kernel, key, rows, rng, seed)


# the committed H200 records whose kernels the per-head and strided layouts replay on the GPU:
# QK-norm's width (128), a staged dx (cp.async from x: rmsnorm bwd 4096), a layernorm dx with
# its gamma held a chunk, stream hints, fp8 output with its amax fold
TUNED_LAYOUT_KEYS = (NormKey(hidden_size=128), NormKey(stage="bwd", hidden_size=128),
                     NormKey(norm="layernorm", hidden_size=128), NormKey(norm="layernorm", stage="bwd", hidden_size=128),
                     NormKey(stage="bwd", hidden_size=4096), NormKey(norm="layernorm", stage="bwd", hidden_size=4096),
                     NormKey(hidden_size=7168, otype="fp8e4m3"))


def tuned_layout_registry(tmp_path_factory, layouts):
    """A registry on a CUDA library of TUNED_LAYOUT_KEYS from the committed records, with
    kernels for x in ``layouts``."""
    from tvmnorm.build import build_library
    from tvmnorm.runtime import Registry
    from tvmnorm.tune import load_records
    records = load_records("cuda")
    assert all(records.get(k.pack(), {}).get("parts") for k in TUNED_LAYOUT_KEYS)
    out = tmp_path_factory.mktemp("tuned-layouts") / "cuda"
    build_library(TUNED_LAYOUT_KEYS, "cuda", out, records, log=lambda *a: None, layouts=layouts)
    reg = Registry()
    reg.set_library("cuda", out)
    return reg


@library_fixture()
def tuned_layout_library(tmp_path_factory):
    """Compact rows' kernels alone: the other layouts' compiled from the library's records."""
    return tuned_layout_registry(tmp_path_factory, ("compact",))


@library_fixture()
def tuned_all_layouts_library(tmp_path_factory):
    """Every layout's kernels in the library (`tvmnorm build`'s default)."""
    return tuned_layout_registry(tmp_path_factory, "all")


@pytest.mark.parametrize("rows", (7, 4097 * 7))
@pytest.mark.parametrize("layout", ("heads", "strided"))
@pytest.mark.parametrize("key", TUNED_LAYOUT_KEYS, ids=lambda k: k.name)
def test_cuda_tuned_records_for_x_layouts(tuned_layout_library, key, layout, rows, rng, seed):
    """A library's records replayed for strided and per-head x (Registry.get(..., layout) with
    the library's records.json): the tuned kernels, right against float64 with NaN around x."""
    kernel = tuned_layout_library.get(key, "cuda", layout)
    tuned = layout != "heads" or key.stage == "fwd"  # build.layout_record
    assert (kernel.origin, kernel.tuned) == ((f"tuned:{layout}", True) if tuned else (f"default:{layout}", False))
    check_x_layout(kernel, key, layout, rows, rng, seed)


@pytest.mark.parametrize("rows", (7, 4097 * 7))
@pytest.mark.parametrize("layout", ("heads", "strided"))
@pytest.mark.parametrize("key", TUNED_LAYOUT_KEYS, ids=lambda k: k.name)
def test_cuda_library_of_x_layouts(tuned_all_layouts_library, key, layout, rows, rng, seed, monkeypatch):
    """A library built with every layout's kernels (nvcc, a module a layout) serves strided and
    per-head x from them, nothing compiled at run time: the records' kernels (per-head rows a
    forward's alone), right against float64 with NaN around x."""
    from tvmnorm import runtime
    monkeypatch.setattr(runtime, "_cached_module", lambda *a, **k: pytest.fail("a library's layout was compiled"))
    tuned = layout != "heads" or key.stage == "fwd"  # build.layout_record
    kernel = tuned_all_layouts_library.get(key, "cuda", layout)
    assert (kernel.origin, kernel.tuned) == (f"library:{'tuned' if tuned else 'default'}:{layout}", tuned)
    check_x_layout(kernel, key, layout, rows, rng, seed)


def check_x_layout(kernel, key, layout, rows, rng, seed):
    inputs = make_inputs(key, rows, rng, device="cuda")
    outs = call(kernel, {**inputs, "x": x_in_layout(inputs["x"], layout)}, rows, device="cuda")
    torch.cuda.synchronize()
    check_outputs(key, inputs, outs, f"cuda {kernel.origin} {key.name} rows={rows} seed={seed}")


def test_backward_inputs_and_dx_call_us_on_the_gpu():
    """bench.backward_inputs (the inputs tune.dx_call_us and bench/bwd_parts.py time): dy and x
    in the key's itype, gamma in its wtype, layernorm's mu and rsigma (rsigma positive) in fp32,
    bwd_add's dz beside them, all on the GPU and fresh each call; dx_call_us times a committed
    backward's and backward-with-add's dx and finalize."""
    import math
    from tvmnorm.bench import backward_inputs
    from tvmnorm.tune import dx_call_us, load_records
    key = NormKey(norm="layernorm", stage="bwd", itype="fp16", otype="fp16", wtype="bf16", hidden_size=1000)
    dy, x, stats, gamma, adds = backward_inputs(key, 37)
    assert (dy.shape, x.shape, gamma.shape, adds) == ((37, 1000), (37, 1000), (1000,), [])
    assert (dy.dtype, x.dtype, gamma.dtype) == (torch.float16, torch.float16, torch.bfloat16)
    assert [s.dtype for s in stats] == [torch.float32] * 2 and bool((stats[1] > 0).all())
    assert all(t.is_cuda for t in (dy, x, gamma, *stats))
    assert not torch.equal(x, backward_inputs(key, 37)[1])
    _, _, stats, _, (dz,) = backward_inputs(NormKey(norm="rmsnorm", stage="bwd_add", hidden_size=64), 3)
    assert len(stats) == 1 and (dz.shape, dz.dtype, dz.is_cuda) == ((3, 64), torch.bfloat16, True)
    for stage in ("bwd", "bwd_add"):
        rms = NormKey(norm="rmsnorm", stage=stage, hidden_size=1024)
        us = dx_call_us(rms, load_records("cuda")[rms.pack()], rows=4096)
        assert math.isfinite(us) and 0 < us < 10_000, (stage, us)
