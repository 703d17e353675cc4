"""Default-schedule kernels on llvm against the float64 reference (tvmnorm.reference).

Every output is poisoned with NaN before every call, every test draws fresh data from its own
seed, and tolerances come from the per-dtype table in conftest.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import call, check_outputs, f64, make_inputs, run_and_check
from tvmnorm.key import NormKey

STAGES = ("fwd", "bwd", "bwd_add", "fwd_add")
NORMS = ("rmsnorm", "layernorm")
DTYPES = ("fp32", "fp16", "bf16")
HIDDENS = (1, 128, 1000, 4095, 7168)
ROWS = (1, 3, 257)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("stage", STAGES)
def test_matrix(kernels, stage, norm, dtype, hidden, rows, rng, seed):
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    run_and_check(kernels, key, rows, rng, seed)


@pytest.mark.parametrize("rows", (3, 257))
@pytest.mark.parametrize("hidden", (1, 128, 1000, 4095))
@pytest.mark.parametrize("dtype", ("fp32", "bf16"))
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("stage", STAGES)
def test_zero_centered_gamma(kernels, stage, norm, dtype, hidden, rows, rng, seed):
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden,
                  zero_centered_gamma=True)
    run_and_check(kernels, key, rows, rng, seed)


MIXED = [  # (itype, wtype, otype)
    ("bf16", "fp32", "bf16"),
    ("fp16", "fp32", "fp16"),
    ("bf16", "fp32", "fp32"),
    ("fp32", "bf16", "bf16"),
    ("fp16", "bf16", "fp32"),
]


@pytest.mark.parametrize("rows", (3, 257))
@pytest.mark.parametrize("types", MIXED, ids=lambda t: "x{}-w{}-o{}".format(*t))
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("stage", STAGES)
def test_mixed_dtypes(kernels, stage, norm, types, rows, rng, seed):
    itype, wtype, otype = types
    key = NormKey(norm=norm, stage=stage, itype=itype, wtype=wtype, otype=otype, hidden_size=1000)
    run_and_check(kernels, key, rows, rng, seed)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("norm", NORMS)
def test_fp64_compute(kernels, stage, norm, rng, seed):
    """fp64 in, out and compute (the gradcheck-grade configuration) at fp64 tolerances."""
    key = NormKey(norm=norm, stage=stage, itype="fp64", wtype="fp64", otype="fp64", ctype="fp64",
                  hidden_size=1000)
    run_and_check(kernels, key, 257, rng, seed)


@pytest.mark.parametrize("stage", ("fwd", "fwd_add"))
@pytest.mark.parametrize("norm", NORMS)
def test_eps_is_used(kernels, norm, stage, rng, seed):
    """A large eps changes rsigma; the kernel must use the eps it is given, not its default."""
    key = NormKey(norm=norm, stage=stage, itype="fp32", wtype="fp32", otype="fp32", hidden_size=128)
    run_and_check(kernels, key, 3, rng, seed, eps=0.5)


@pytest.mark.parametrize("rows", (1, 3, 257))
@pytest.mark.parametrize("hidden", (1, 128, 1000, 4095, 7168))
@pytest.mark.parametrize("otype", ("fp8e4m3", "fp8e5m2"))
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("stage", ("fwd", "fwd_add"))
def test_fp8_output(kernels, stage, norm, otype, hidden, rows, rng, seed):
    key = NormKey(norm=norm, stage=stage, itype="bf16", wtype="bf16", otype=otype, hidden_size=hidden)
    run_and_check(kernels, key, rows, rng, seed)


@pytest.mark.parametrize("otype", ("fp8e4m3", "fp8e5m2"))
@pytest.mark.parametrize("norm", NORMS)
def test_fp8_saturates(kernels, norm, otype, rng, seed):
    """A scale that pushes most of y past the fp8 range: the kernel saturates to +-max (a plain
    llvm fp8 cast would wrap), and amax is still max|y| before scaling."""
    key = NormKey(norm=norm, stage="fwd", itype="fp32", wtype="fp32", otype=otype, hidden_size=1000)
    inputs = make_inputs(key, 3, rng)
    inputs["scale"] = torch.tensor([{"fp8e4m3": 1000.0, "fp8e5m2": 1e5}[otype]], dtype=torch.float32)
    outs = call(kernels(key), inputs, 3)
    context = f"{key.name} seed={seed}"
    check_outputs(key, inputs, outs, context)
    m = {"fp8e4m3": 448.0, "fp8e5m2": 57344.0}[otype]
    y = f64(outs["y"])
    assert (np.abs(y) == m).mean() > 0.3, f"expected many saturated elements ({context})"
    assert np.all(np.isfinite(y)), context


@pytest.mark.parametrize("otype", ("fp8e4m3", "fp8e5m2"))
@pytest.mark.parametrize("norm", NORMS)
def test_fp8_keeps_nan(kernels, norm, otype, rng, seed):
    """A NaN in x makes its row of fp8 y NaN, as the reference's clip keeps it (a clamp of
    min/max gave +-max, llvm's cast 1.5), whatever the scale; the other rows are bitwise those
    of the call without it (test_gpu_core checks CUDA's hardware cast the same way)."""
    key = NormKey(norm=norm, stage="fwd", itype="bf16", wtype="bf16", otype=otype, hidden_size=1000)
    rows, bad = 5, 2
    inputs = make_inputs(key, rows, rng)
    inputs["scale"] = torch.tensor([{"fp8e4m3": 1000.0, "fp8e5m2": 1e5}[otype]], dtype=torch.float32)
    kernel = kernels(key)
    first = call(kernel, inputs, rows)
    context = f"{key.name} seed={seed}"
    check_outputs(key, inputs, first, context)
    # outputs filled with finite values, not poisoned with NaN: a NaN read back was written
    inputs["x"][bad, 17] = float("nan")
    second = {n: torch.zeros_like(t) for n, t in first.items()}
    kernel(*[inputs[n] if n in inputs else second[n] for n in kernel.signature])
    assert torch.isnan(second["y"][bad].float()).all(), f"row {bad} of y is not all NaN ({context})"
    others = torch.arange(rows) != bad
    assert torch.equal(second["y"][others].view(torch.uint8), first["y"][others].view(torch.uint8)), context


@pytest.mark.parametrize("norm", NORMS)
def test_fp8_mixed_input(kernels, norm, rng, seed):
    key = NormKey(norm=norm, stage="fwd", itype="fp32", wtype="bf16", otype="fp8e4m3", hidden_size=4095)
    run_and_check(kernels, key, 257, rng, seed)


@pytest.mark.parametrize("path", ("one", "two"))
@pytest.mark.parametrize("where", ("first", "middle", "last"))
def test_fp8_amax_across_chunks(kernels, where, path, rng, seed):
    """amax is reduced by one kernel over every row's maximum (amax_one, up to AMAX_ONE_ROWS
    rows) or in chunks of AMAX_CHUNK rows, then over the chunks (amax): the row with the largest
    |y| is found in the first chunk, a middle one, or the last, partial one, by the kernel the
    row count picks."""
    from tvmnorm.compute.norms import AMAX_CHUNK, AMAX_ONE_ROWS
    rows = 2 * AMAX_CHUNK + 17 + (AMAX_ONE_ROWS if path == "two" else 0)
    key = NormKey(norm="rmsnorm", stage="fwd", itype="bf16", wtype="bf16", otype="fp8e4m3", hidden_size=8)
    inputs = make_inputs(key, rows, rng)
    big = {"first": 3, "middle": AMAX_CHUNK + 5, "last": rows - 2}[where]
    # rmsnorm makes every row's y about as large as gamma: the winner is a row with one spike
    x = torch.full((rows, 8), 0.5, dtype=torch.bfloat16)
    x[big, 0] = 64.0
    inputs["x"] = x
    kernel = kernels(key)
    ran, parts = [], kernel.parts_for(rows)
    real = {name: parts[name] for name in ("amax", "amax_one")}

    def spy(name):
        return lambda *args: (ran.append(name), real[name](*args))
    parts.update({name: spy(name) for name in real})
    try:
        outs = call(kernel, inputs, rows)
    finally:
        parts.update(real)  # the kernel is cached for the other tests
    assert ran == [{"one": "amax_one", "two": "amax"}[path]], ran
    check_outputs(key, inputs, outs, f"{key.name} rows={rows} spike at row {big} seed={seed}")


@pytest.mark.parametrize("rows", (257, 1000))
@pytest.mark.parametrize("stage", ("bwd", "bwd_add"))
@pytest.mark.parametrize("norm", NORMS)
def test_dgamma_bitwise_reproducible(kernels, norm, stage, rows, rng, seed):
    """dgamma (and dbeta) are bitwise equal across two runs on the same inputs."""
    key = NormKey(norm=norm, stage=stage, itype="bf16", wtype="fp32", otype="bf16", hidden_size=1000)
    inputs = make_inputs(key, rows, rng)
    k = kernels(key)
    first, second = call(k, inputs, rows), call(k, inputs, rows)
    for name in ("dgamma", "dbeta") if norm == "layernorm" else ("dgamma",):
        a, b = first[name].view(torch.int32), second[name].view(torch.int32)
        assert torch.equal(a, b), f"{name} differs between two runs ({key.name} rows={rows} seed={seed})"
    assert torch.equal(first["dx"].view(torch.int16), second["dx"].view(torch.int16))
    check_outputs(key, inputs, first, f"{key.name} rows={rows} seed={seed}")


@pytest.mark.parametrize("stage", ("bwd", "bwd_add"))
@pytest.mark.parametrize("norm", NORMS)
def test_two_stage_partial_sum(kernels, norm, stage, monkeypatch, rng, seed):
    """With more partials than runtime.COMBINE_ABOVE, combine sums them in groups first (here
    79 partials of T = 64 rows: a full group and a tail of 15); the result is right and still
    bitwise reproducible."""
    from tvmnorm import runtime
    from tvmnorm.compute.norms import COMBINE_GROUP, rows_per_partial
    monkeypatch.setattr(runtime, "COMBINE_ABOVE", 1)
    key = NormKey(norm=norm, stage=stage, itype="bf16", wtype="fp32", otype="bf16", hidden_size=1000)
    rows = 5000
    count = runtime.partials(rows, key, "llvm")
    assert rows_per_partial(key, "llvm") == 64 and count > COMBINE_GROUP and count % COMBINE_GROUP
    inputs = make_inputs(key, rows, rng)
    k = kernels(key)
    first, second = call(k, inputs, rows), call(k, inputs, rows)
    for name in ("dgamma", "dbeta") if norm == "layernorm" else ("dgamma",):
        assert torch.equal(first[name].view(torch.int32), second[name].view(torch.int32)), name
    check_outputs(key, inputs, first, f"{key.name} rows={rows} seed={seed} (two-stage partial sum)")


@pytest.mark.parametrize("stage, otype", [("fwd", "bf16"), ("fwd", "fp8e4m3"), ("bwd", "bf16"), ("bwd_add", "bf16"),
                                          ("fwd_add", "bf16"), ("fwd_add", "fp8e4m3")])
@pytest.mark.parametrize("norm", NORMS)
def test_zero_rows(kernels, norm, stage, otype, rng, seed):
    """An empty batch: dgamma/dbeta of nothing are 0 and fp8 amax is 0 (a zero-extent TIR
    reduction never runs its init, so these need at least one guarded step)."""
    key = NormKey(norm=norm, stage=stage, itype="bf16", wtype="bf16", otype=otype, hidden_size=1000)
    outs = call(kernels(key), make_inputs(key, 0, rng), 0)
    for name in ("dgamma", "dbeta", "amax"):
        if name in outs:
            assert torch.equal(outs[name].float(), torch.zeros(outs[name].shape)), (name, outs[name])


@pytest.mark.parametrize("dtype", ("bf16", "fp32"))
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("norm", NORMS)
def test_large_hidden(kernels, norm, stage, dtype, rng, seed):
    """hidden 65536: the default rule's widest configurations (many steps per thread/lane)."""
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=65536)
    run_and_check(kernels, key, 3, rng, seed)


@pytest.mark.parametrize("stage", ("fwd", "bwd", "fwd_add"))
@pytest.mark.parametrize("norm", NORMS)
def test_a_million_rows(kernels, norm, stage, rng, seed):
    """Row counts in the millions (QK-norm over many heads): int64 indexing, many partials."""
    key = NormKey(norm=norm, stage=stage, itype="fp32", wtype="fp32", otype="fp32", hidden_size=8)
    run_and_check(kernels, key, 1_000_003, rng, seed)


def _chunk_rows(key, spec):
    """Row counts around the fused bwd kernel's chunk size T (llvm): a partial chunk, exactly
    one, one more row than a chunk."""
    from tvmnorm.compute.norms import rows_per_partial
    t = rows_per_partial(key, "llvm")
    return {"T-1": t - 1, "T": t, "T+1": t + 1}.get(spec, spec)


@pytest.mark.parametrize("rows", ("T-1", "T", "T+1", 1000))
@pytest.mark.parametrize("hidden", (128, 1000, 4095, 7168))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("stage", ("bwd", "bwd_add"))
def test_fused_bwd_chunk_edges(kernels, stage, norm, dtype, hidden, rows, rng, seed):
    """dx and dgamma/dbeta from the one-pass kernel where the last chunk of T rows is partial,
    full, or holds a single row (its other rows must add nothing and read nothing)."""
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden)
    run_and_check(kernels, key, _chunk_rows(key, rows), rng, seed)


@pytest.mark.parametrize("stage", ("bwd", "bwd_add"))
@pytest.mark.parametrize("norm", NORMS)
def test_fused_bwd_many_chunks(kernels, norm, stage, rng, seed):
    """Many chunks and partials (a QK-norm-like shape): 300 chunks of T rows plus a tail."""
    from tvmnorm.compute.norms import rows_per_partial
    key = NormKey(norm=norm, stage=stage, itype="bf16", wtype="bf16", otype="bf16", hidden_size=128)
    rows = 300 * rows_per_partial(key, "llvm") + 7
    run_and_check(kernels, key, rows, rng, seed)


def test_partials_are_one_per_chunk():
    from tvmnorm.compute.norms import rows_per_partial
    from tvmnorm.runtime import partials
    for kind in ("llvm", "cuda"):
        for hidden in (8, 128, 1000, 4096):
            key = NormKey(stage="bwd", hidden_size=hidden)
            t = rows_per_partial(key, kind)
            assert t >= 32
            assert [partials(r, key, kind) for r in (1, t - 1, t, t + 1, 10 * t)] == [1, 1, 1, 2, 10]
    with pytest.raises(ValueError, match="target"):
        rows_per_partial(NormKey(stage="bwd"), "rocm")


@pytest.mark.parametrize("kind", ("llvm", "cuda"))
def test_backward_kernels_per_target(kind):
    """One pass (dx with partials, then finalize, after combine when there are many) on both
    targets."""
    from tvmnorm.compute import kernel_funcs
    funcs = kernel_funcs(NormKey(norm="layernorm", stage="bwd", hidden_size=1000), kind)
    assert list(funcs) == ["dx", "combine", "finalize"]
    dx_outputs = [p.name for p in funcs["dx"].params][-2:]
    assert dx_outputs == ["dx", "part"]


def fp8_cast_probes(otype: str, rng) -> np.ndarray:
    """fp32 values around every fp8 rounding decision: each fp8 value, each midpoint between
    neighbours (ties: round to even) and its fp32 neighbours, the subnormal-normal boundary,
    values past the format's max (saturate), zeros, and random values over the whole range."""
    import ml_dtypes
    fdt = {"fp8e4m3": ml_dtypes.float8_e4m3fn, "fp8e5m2": ml_dtypes.float8_e5m2}[otype]
    grid = np.arange(256, dtype=np.uint8).view(fdt).astype(np.float64)
    grid = np.unique(grid[np.isfinite(grid)])
    mids = (grid[1:] + grid[:-1]) / 2
    near = np.concatenate([mids, np.nextafter(mids.astype(np.float32), np.float32(np.inf)),
                           np.nextafter(mids.astype(np.float32), np.float32(-np.inf))])
    top = float(grid[-1])
    wide = np.exp(rng.uniform(np.log(2.0 ** -24), np.log(4 * top), 20000)) * rng.choice((-1, 1), 20000)
    values = np.concatenate([grid, near, wide, [0.0, -0.0, top * 1.03, -top * 1.5, 1e30, -1e30]])
    return values.astype(np.float32)


@pytest.mark.parametrize("otype", ("fp8e4m3", "fp8e5m2"))
def test_fp8_cast_is_exact(kernels, otype, rng, seed):
    """llvm encodes fp8 in software (its cast is wrong below the smallest normal and does not
    saturate): y = gamma exactly (x ones, eps 0, scale 1: rsigma is 1), so the bytes of y are
    the cast of gamma alone, against ml_dtypes' round-to-nearest-even of the clamped value, bit
    for bit, at every rounding decision of the format."""
    import ml_dtypes
    fdt = {"fp8e4m3": ml_dtypes.float8_e4m3fn, "fp8e5m2": ml_dtypes.float8_e5m2}[otype]
    values = fp8_cast_probes(otype, rng)
    hidden = 4096
    values = np.concatenate([values, np.ones(-len(values) % hidden, np.float32)])
    key = NormKey(norm="rmsnorm", stage="fwd", itype="fp32", wtype="fp32", otype=otype, hidden_size=hidden)
    kernel = kernels(key)
    top = float(np.finfo(fdt).max)
    for part in values.reshape(-1, hidden):
        inputs = {"x": torch.ones(2, hidden), "gamma": torch.tensor(part),
                  "scale": torch.ones(1)}
        y = call(kernel, inputs, 2, eps=0.0)["y"]
        want = np.clip(part, -top, top).astype(fdt).view(np.uint8)
        got = y.view(torch.uint8).numpy()
        bad = np.flatnonzero(got[0] != want)
        assert bad.size == 0, (f"{otype} seed={seed}: {bad.size} values cast wrong, e.g. "
                               f"{part[bad[:4]].tolist()} -> {got[0][bad[:4]].tolist()}, want {want[bad[:4]].tolist()}")
        assert np.array_equal(got[0], got[1])


@pytest.mark.parametrize("zc", (False, True))
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_reference_in_row_steps_matches_autograd(norm, zc, rng):
    """tvmnorm.reference walks the rows ROW_STEP at a time (and sums dgamma/dbeta step by step):
    against torch's float64 autograd of the whole call, at a row count that leaves a last step
    part full, with bwd_add's dz."""
    from tvmnorm import reference as ref
    rows, H, eps = 2 * ref.ROW_STEP + 5, 96, ref.DEFAULT_EPS[norm]
    x = torch.from_numpy(rng.normal(1.0, 2.0, (rows, H))).requires_grad_()
    g = torch.from_numpy(rng.normal(0.0 if zc else 1.0, 0.5, H)).requires_grad_()
    b = torch.from_numpy(rng.normal(0.0, 0.5, H)).requires_grad_()
    dy, dz = rng.standard_normal((rows, H)), rng.standard_normal((rows, H))
    w = g + 1.0 if zc else g
    if norm == "layernorm":
        y = torch.nn.functional.layer_norm(x, (H,), w, b, eps)
    else:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    y.backward(torch.from_numpy(dy))
    fw = ref.fwd(norm, x.detach().numpy(), g.detach().numpy(), b.detach().numpy() if norm == "layernorm" else None,
                 zero_centered_gamma=zc)
    np.testing.assert_allclose(fw["y"], y.detach().numpy(), rtol=1e-12, atol=1e-12)
    st = ref.stats(norm, x.detach().numpy())
    np.testing.assert_array_equal(st["rsigma"], fw["rsigma"])
    bw = ref.bwd(norm, dy, x.detach().numpy(), st["rsigma"], g.detach().numpy(), mu=st.get("mu"), dz=dz,
                 zero_centered_gamma=zc)
    np.testing.assert_allclose(bw["dx"], x.grad.numpy() + dz, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(bw["dgamma"], g.grad.numpy(), rtol=1e-10, atol=1e-10)
    if norm == "layernorm":
        np.testing.assert_allclose(bw["dbeta"], b.grad.numpy(), rtol=1e-10, atol=1e-10)


def test_row_stepped_check_names_every_bad_element_and_the_worst_row():
    """conftest.assert_close walks a 2-D check ROW_STEP rows at a time: a failure still counts
    the bad elements of every step, names the worst by its row in the whole array and counts
    the NaNs; a bound given per row slice is applied to those rows only."""
    from conftest import assert_close
    from tvmnorm.reference import ROW_STEP
    rows, H = 3 * ROW_STEP + 1, 8
    want = np.zeros((rows, H))
    got = want.copy()
    got[5, 1], got[ROW_STEP + 2, 3], got[3 * ROW_STEP, 7] = 0.5, 2.0, np.nan
    worst_nan = rf"3/{rows * H} elements .* worst at \({3 * ROW_STEP}, 7\).*NaNs in output: 1"
    with pytest.raises(AssertionError, match=worst_nan):
        assert_close("t", got, want, 0.1)
    got[3 * ROW_STEP, 7] = 0.0
    with pytest.raises(AssertionError, match=rf"2/{rows * H} elements .* worst at \({ROW_STEP + 2}, 3\)"):
        assert_close("t", got, want, lambda s: np.full((s.stop - s.start, H), 0.1))
    bound = np.full((rows, H), 0.1)
    bound[ROW_STEP + 2] = 3.0
    with pytest.raises(AssertionError, match=rf"1/{rows * H} elements .* worst at \(5, 1\)"):
        assert_close("t", got, want, lambda s: bound[s])
    assert_close("t", got, want, 2.5)
