"""tvmnorm.torch on the CPU: functional ops, autograd, torch.library/torch.compile, modules.

References are torch.nn.functional.rms_norm / layer_norm evaluated in float64 on the same
(rounded) inputs; tolerances come from the per-dtype table below. Kernels are cached by key in
the process, so the tests reuse hidden sizes and dtypes where they can (each new key compiles a
default kernel, ~1 s).
"""
from __future__ import annotations

import math
import os
import pathlib
import warnings
import zlib

import pytest
import torch
import torch.nn.functional as F

import tvmnorm
import tvmnorm.torch as tn
from tvmnorm import NormKey
from tvmnorm.torch import _host

pytestmark = pytest.mark.filterwarnings("ignore::tvmnorm.runtime.FallbackWarning")

HIDDENS = (1, 7, 128, 1000, 4096)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# |got - want| <= RTOL * |want| + ATOL * max|want|: RTOL is one ulp of the result dtype (its
# final rounding plus slack), ATOL the fp32 compute error relative to the largest element
# (sums of H or M terms in another order than the fp64 reference).
RTOL = {torch.float32: 2e-6, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7, torch.float64: 1e-12}
ATOL = {torch.float32: 2e-5, torch.float16: 2e-4, torch.bfloat16: 2e-3, torch.float64: 1e-12}


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory):
    """Default kernels compile into a tmp dir unless conftest.py already arranged one."""
    if "TVMNORM_CACHE" in os.environ:
        yield
        return
    os.environ["TVMNORM_CACHE"] = str(tmp_path_factory.mktemp("tvmnorm-torch-cache"))
    yield
    os.environ.pop("TVMNORM_CACHE", None)


@pytest.fixture
def gen(request):
    g = torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))
    return g


def rand(gen, shape, dtype=torch.float32, offset=0.0, requires_grad=False, device="cpu"):
    """Rows with a per-row offset and spread (LayerNorm must remove the offset), rounded to dtype
    (drawn on the CPU from ``gen``, then moved, so CPU and CUDA tests see the same data)."""
    rows = shape[:-1]
    off = offset * torch.randn(*rows, 1, generator=gen, dtype=torch.float64)
    spread = 0.5 + 2.5 * torch.rand(*rows, 1, generator=gen, dtype=torch.float64)
    t = (off + spread * torch.randn(*shape, generator=gen, dtype=torch.float64)).to(device=device, dtype=dtype)
    return t.requires_grad_(requires_grad)


def leading_shape(gen, hidden):
    """A random leading shape of 1-3 dims, fewer rows for wide rows (keeps the CPU test fast)."""
    ndim = int(torch.randint(1, 4, (1,), generator=gen))
    cap = max(2, min(64, 8192 // hidden))
    dims, rows = [], 1
    for _ in range(ndim):
        d = int(torch.randint(1, max(2, cap // rows) + 1, (1,), generator=gen))
        dims.append(d)
        rows *= d
    return tuple(dims)


def assert_close(what, got, want, dtype=None, rtol=None, atol=None, scale=0.0):
    """|got - want| <= rtol * |want| + atol * max(max|want|, scale); ``scale`` is the size of the
    terms that were combined, for results that cancel to ~0 (LayerNorm dx at hidden=1)."""
    dtype = dtype or got.dtype
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if want.numel() == 0:
        return
    rtol = RTOL[dtype] if rtol is None else rtol
    atol = (ATOL[dtype] if atol is None else atol) * max(float(want.abs().max()), scale)
    err = (got - want).abs()
    allowed = rtol * want.abs() + atol
    bad = ~(err <= allowed)
    if bad.any():
        i = int(torch.argmax(torch.where(bad, err / allowed, torch.zeros_like(err))))
        raise AssertionError(f"{what}: {int(bad.sum())}/{bad.numel()} elements out of tolerance; worst: got "
                             f"{got.flatten()[i].item()!r}, want {want.flatten()[i].item()!r}, allowed "
                             f"{allowed.flatten()[i].item():.3g}")


def reference(norm, x, w, b, eps, zc=False):
    """torch's own op in float64 on the same rounded inputs, with fp64 grads."""
    xr = x.detach().double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    g = wr + 1 if zc else wr
    if norm == "rmsnorm":
        return xr, wr, None, F.rms_norm(xr, (x.shape[-1],), g, eps)
    br = b.detach().double().requires_grad_()
    return xr, wr, br, F.layer_norm(xr, (x.shape[-1],), g, br, eps)


def run(norm, x, w, b, eps, **kw):
    if norm == "rmsnorm":
        return tn.rms_norm(x, w, eps, **kw)
    return tn.layer_norm(x, w, b, eps, **kw)


def check_fwd_bwd(norm, x, w, b, eps, gen, zc=False, out_dtype=None, fn=None):
    """The op (or ``fn``: x -> y, with w and b its weights) against float64: y, and the
    gradients of x and the weights for a random dy."""
    y = fn(x) if fn else run(norm, x, w, b, eps, zero_centered_gamma=zc, out_dtype=out_dtype)
    assert y.shape == x.shape and y.dtype == (out_dtype or x.dtype)
    xr, wr, br, yr = reference(norm, x, w, b, eps, zc)
    assert_close("y", y, yr)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(device=y.device, dtype=y.dtype)
    ins = [x, w] + ([b] if b is not None else [])
    grads = torch.autograd.grad(y, ins, dy)
    refs = torch.autograd.grad(yr, [xr, wr] + ([br] if br is not None else []), dy.double())
    for name, got, want, t, sc in zip(("dx", "dweight", "dbias"), grads, refs, ins, grad_scales(norm, x, w, dy, eps, zc)):
        assert got.dtype == t.dtype, f"{name} dtype {got.dtype} != input dtype {t.dtype}"
        assert_close(name, got, want, scale=sc)


def grad_scales(norm, x, w, dy, eps, zc) -> tuple:
    """The size of the terms each gradient combines: rsigma * |dy * g| for dx, sqrt(rows) * |dy|
    * (|x| + |mu|) * rsigma for dweight (x - mu cancels), sqrt(rows) * |dy| for dbias."""
    xd = x.detach().double()
    centred = xd - xd.mean(-1, keepdim=True) if norm == "layernorm" else xd
    rs = (centred.square().mean(-1) + eps).rsqrt()
    g = w.detach().double() + 1 if zc else w.detach().double()
    rows = max(1, x.numel() // x.shape[-1])
    dyd = dy.double().abs().max()
    return (float((rs.max() * dyd * g.abs().max())),
            float(math.sqrt(rows) * dyd * ((xd.abs() + xd.mean(-1, keepdim=True).abs()) * rs[..., None]).max()),
            float(math.sqrt(rows) * dyd))


# ---------------------------------------------------------------------------------------------
# numerics against torch in float64


@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_matches_torch(norm, dtype, hidden, gen):
    dt = DTYPES[dtype]
    lead = leading_shape(gen, hidden)
    x = rand(gen, lead + (hidden,), dt, offset=2.0, requires_grad=True)
    w = (1 + 0.5 * torch.randn(hidden, generator=gen)).to(dt).requires_grad_()
    b = (0.5 * torch.randn(hidden, generator=gen)).to(dt).requires_grad_() if norm == "layernorm" else None
    check_fwd_bwd(norm, x, w, b, 1e-5, gen)


@pytest.mark.parametrize("types", [(torch.bfloat16, torch.float32, None), (torch.float16, torch.bfloat16, None),
                                   (torch.bfloat16, torch.float32, torch.float32),
                                   (torch.float32, torch.bfloat16, torch.bfloat16)],
                         ids=["xbf16-wfp32", "xfp16-wbf16", "xbf16-wfp32-ofp32", "xfp32-wbf16-obf16"])
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_mixed_dtypes(norm, types, gen):
    xdt, wdt, odt = types
    x = rand(gen, (3, 5, 128), xdt, offset=1.0, requires_grad=True)
    w = (1 + 0.5 * torch.randn(128, generator=gen)).to(wdt).requires_grad_()
    b = (0.5 * torch.randn(128, generator=gen)).to(wdt).requires_grad_() if norm == "layernorm" else None
    check_fwd_bwd(norm, x, w, b, 1e-6, gen, out_dtype=odt)


@pytest.mark.parametrize("xdt", (torch.bfloat16, torch.float32), ids=("xbf16", "xfp32"))
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_autocast_leaves_the_dtypes_alone(norm, xdt, gen):
    """Under torch.autocast the ops run as outside it (the README says so: the output follows x
    or out_dtype), with fp32 weights as mixed precision keeps them: the same values bit for bit,
    and the gradients in each input's dtype."""
    m = (tn.RMSNorm if norm == "rmsnorm" else tn.LayerNorm)(128)
    with torch.no_grad():
        m.weight.copy_(1 + 0.5 * torch.randn(128, generator=gen))
    x = rand(gen, (3, 5, 128), xdt, offset=1.0, requires_grad=True)
    dy = torch.randn(3, 5, 128, generator=gen).to(xdt)
    plain = m(x)
    (gx, gw) = torch.autograd.grad(plain, (x, m.weight), dy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = m(x)
        (cx, cw) = torch.autograd.grad(cast, (x, m.weight), dy)
    assert cast.dtype == plain.dtype == xdt and cx.dtype == xdt and cw.dtype == torch.float32
    assert torch.equal(cast, plain) and torch.equal(cx, gx) and torch.equal(cw, gw)


@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_zero_centered_gamma(norm, gen):
    x = rand(gen, (4, 3, 128), torch.bfloat16, offset=1.0, requires_grad=True)
    w = (0.3 * torch.randn(128, generator=gen)).to(torch.bfloat16).requires_grad_()
    b = (0.5 * torch.randn(128, generator=gen)).to(torch.bfloat16).requires_grad_() if norm == "layernorm" else None
    check_fwd_bwd(norm, x, w, b, 1e-6, gen, zc=True)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=("fp32", "bf16"))
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_grads_match_torch_same_dtype(norm, dtype, gen):
    """Against torch's own kernels run in the same dtype, not only the fp64 reference."""
    x = rand(gen, (6, 128), dtype, offset=1.0, requires_grad=True)
    w = (1 + 0.5 * torch.randn(128, generator=gen)).to(dtype).requires_grad_()
    b = (0.5 * torch.randn(128, generator=gen)).to(dtype).requires_grad_()
    dy = torch.randn(6, 128, generator=gen).to(dtype)
    if norm == "rmsnorm":
        ours = torch.autograd.grad(tn.rms_norm(x, w, 1e-6), (x, w), dy)
        theirs = torch.autograd.grad(F.rms_norm(x, (128,), w, 1e-6), (x, w), dy)
    else:
        ours = torch.autograd.grad(tn.layer_norm(x, w, b, 1e-5), (x, w, b), dy)
        theirs = torch.autograd.grad(F.layer_norm(x, (128,), w, b, 1e-5), (x, w, b), dy)
    for name, a, t in zip(("dx", "dweight", "dbias"), ours, theirs):
        # both round once or twice to dtype: allow a few ulps of the larger result
        assert_close(name, a, t, rtol=4 * RTOL[dtype], atol=4 * ATOL[dtype])


# batched gradients (torch's legacy vmap: autograd.grad's is_grads_batched) and forward mode,
# each batched too, besides the plain check
ALL_GRADCHECKS = {"check_batched_grad": True, "check_forward_ad": True, "check_batched_forward_grad": True}


@pytest.mark.parametrize("zc", (False, True))
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_gradcheck_fp64(norm, zc, gen):
    """gradcheck through the real kernels: fp64 keys (itype=wtype=otype=ctype=fp64)."""
    x = rand(gen, (2, 3, 7), torch.float64, offset=1.0, requires_grad=True)
    w = torch.randn(7, generator=gen, dtype=torch.float64).requires_grad_()
    b = torch.randn(7, generator=gen, dtype=torch.float64).requires_grad_()
    if norm == "rmsnorm":
        fn, ins = (lambda x, w: tn.rms_norm(x, w, 1e-6, zero_centered_gamma=zc)), (x, w)
    else:
        fn, ins = (lambda x, w, b: tn.layer_norm(x, w, b, 1e-5, zero_centered_gamma=zc)), (x, w, b)
    assert torch.autograd.gradcheck(fn, ins, **ALL_GRADCHECKS)
    # the registered op's own autograd (what torch.compile uses) too
    if norm == "rmsnorm":
        op = lambda x, w: torch.ops.tvmnorm.rms_norm_fwd(x, w, 1e-6, zc, torch.float64)[0]  # noqa: E731
    else:
        op = lambda x, w, b: torch.ops.tvmnorm.layer_norm_fwd(x, w, b, 1e-5, zc, torch.float64)[0]  # noqa: E731
    assert torch.autograd.gradcheck(op, ins)


@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_batched_gradients_match_torch(norm, gen):
    """autograd.grad(..., is_grads_batched=True) (what torch.autograd.functional.jacobian's
    vectorize=True runs): the backward gets gradients without storage, which no kernel can read,
    and computes them by torch ops; a bf16 x with fp32 weights against float64."""
    x = rand(gen, (5, 96), torch.bfloat16, offset=1.0, requires_grad=True)
    w = (1 + 0.5 * torch.randn(96, generator=gen)).requires_grad_()
    v = rand(gen, (4, 5, 96), torch.bfloat16)
    got = torch.autograd.grad(run(norm, x, w, None, 1e-5), (x, w), v, is_grads_batched=True)
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y = F.rms_norm(xr, (96,), wr, 1e-5) if norm == "rmsnorm" else F.layer_norm(xr, (96,), wr, None, 1e-5)
    want = torch.autograd.grad(y, (xr, wr), v.double(), is_grads_batched=True)
    for name, g, e, a in zip(("dx", "dw"), got, want, (x, w)):
        assert g.dtype == a.dtype and g.shape == e.shape
        assert_close(name, g, e, dtype=torch.bfloat16)


def test_gradcheck_fp64_hidden1_and_no_weight(gen):
    x = rand(gen, (5, 1), torch.float64, requires_grad=True)
    w = torch.randn(1, generator=gen, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: tn.rms_norm(x, w, 1e-3), (x, w))
    x7 = rand(gen, (3, 7), torch.float64, offset=1.0, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: tn.layer_norm(x, None, None, 1e-5), (x7,))
    torch.testing.assert_close(tn.layer_norm(x7, None, None), F.layer_norm(x7, (7,), eps=1e-5))


@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
@pytest.mark.parametrize("dy_grad", (True, False), ids=("dy-requires-grad", "y.sum"))
@pytest.mark.parametrize("add", (False, True), ids=("norm", "add-norm"))
def test_double_backward_is_refused(gen, norm, dy_grad, add):
    """The bwd kernels are not differentiable: a second derivative raises, never silently zero.
    With dy = ones (y.sum()), torch's once_differentiable gave x's gradient no graph: a gradient
    penalty on it was a constant (backward through it either failed with "does not require grad"
    or, beside another loss, added nothing)."""
    x = rand(gen, (3, 7), torch.float64, requires_grad=True)
    w = torch.randn(7, generator=gen, dtype=torch.float64).requires_grad_()
    b = torch.randn(7, generator=gen, dtype=torch.float64) if norm == "layernorm" else None
    if add:
        y = run_add(norm, x, torch.randn(3, 7, generator=gen, dtype=torch.float64), w, b, 1e-5)[0]
    else:
        y = run(norm, x, w, b, 1e-5)
    dy = torch.randn(3, 7, generator=gen, dtype=torch.float64).requires_grad_() if dy_grad else torch.ones_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), dy, create_graph=True)
    for g in (gx, gw):
        assert g.requires_grad
        with pytest.raises(RuntimeError, match="tvmnorm's norm backward is not differentiable"):
            (g.square().sum() + y.sum()).backward(retain_graph=True)
    # without create_graph the gradients are plain tensors, as before
    gx2, _ = torch.autograd.grad(y, (x, w), dy)
    assert not gx2.requires_grad and torch.equal(gx2, gx.detach())


# ---------------------------------------------------------------------------------------------
# residual add + norm (rms_norm_add, layer_norm_add)


def run_add(norm, x, r, w, b, eps, **kw):
    if norm == "rmsnorm":
        return tn.rms_norm_add(x, r, w, eps, **kw)
    return tn.layer_norm_add(x, r, w, b, eps, **kw)


def check_add_norm(norm, x, r, w, b, eps, gen, zc=False, out_dtype=None, fn=None):
    """(y, h) of a residual add + norm (or ``fn``: (x, r) -> (y, h)) against float64: h = x +
    residual in x's dtype (torch's add), y the norm of that h, and the gradients of x,
    residual and the weights for random dy and dh (x's and residual's: dh + the norm's dx)."""
    y, h = fn(x, r) if fn else run_add(norm, x, r, w, b, eps, zero_centered_gamma=zc, out_dtype=out_dtype)
    assert y.shape == h.shape == x.shape and y.dtype == (out_dtype or x.dtype) and h.dtype == x.dtype
    want_h = x.detach() + r.detach()  # rounded to x's dtype as the op rounds it
    assert torch.equal(h.detach(), want_h), "h is not x + residual"
    hr, wr, br, yr = reference(norm, want_h, w, b, eps, zc)
    assert_close("y", y, yr)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(device=y.device, dtype=y.dtype)
    dh = torch.randn(h.shape, generator=gen, dtype=torch.float64).to(device=h.device, dtype=h.dtype)
    weights = [w] + ([b] if b is not None else [])
    grads = torch.autograd.grad((y, h), [x, r, *weights], (dy, dh))
    refs = torch.autograd.grad(yr, [hr, wr] + ([br] if br is not None else []), dy.double())
    dx_scale, *w_scales = grad_scales(norm, want_h, w, dy, eps, zc)
    want_dx = refs[0] + dh.double()
    assert_close("dx", grads[0], want_dx, scale=dx_scale)
    assert_close("dresidual", grads[1], want_dx, scale=dx_scale)
    for name, got, want, t, sc in zip(("dweight", "dbias"), grads[2:], refs[1:], weights, w_scales):
        assert got.dtype == t.dtype, f"{name} dtype {got.dtype} != input dtype {t.dtype}"
        assert_close(name, got, want, scale=sc)


@pytest.mark.parametrize("zc", (False, True))
@pytest.mark.parametrize("hidden", (1, 128, 1000))
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_add_norm_matches_float64(norm, dtype, hidden, zc, gen):
    dtype, lead = DTYPES[dtype], leading_shape(gen, hidden)
    x = rand(gen, (*lead, hidden), dtype, offset=1.0, requires_grad=True)
    r = rand(gen, (*lead, hidden), dtype, requires_grad=True)
    w = (1 + 0.5 * torch.randn(hidden, generator=gen)).to(dtype).requires_grad_()
    b = (0.5 * torch.randn(hidden, generator=gen)).to(dtype).requires_grad_()
    check_add_norm(norm, x, r, w, b if norm == "layernorm" else None, 1e-5, gen, zc=zc)


@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_add_norm_is_one_kernel_each_way(norm, monkeypatch, gen):
    """The forward is one kernel, the fwd_add stage, given x and residual as they are (no copy)
    and writing y and h; the backward one kernel, the bwd_add stage, given dh (the dx a plain
    norm's backward would write, then add to, is not made); with y's gradient alone the plain
    backward, with h's alone no kernel at all."""
    spy = Spy(monkeypatch)
    x, r = rand(gen, (4, 3, 128), requires_grad=True), rand(gen, (4, 3, 128), requires_grad=True)
    w, b = torch.randn(128, generator=gen).requires_grad_(), torch.randn(128, generator=gen).requires_grad_()
    bias = [b] if norm == "layernorm" else []
    y, h = run_add(norm, x, r, w, b, 1e-5)
    (k, ptrs), = spy.calls
    assert k.key.stage == "fwd_add" and ptrs[:2] == [x.data_ptr(), r.data_ptr()]
    assert {y.data_ptr(), h.data_ptr()} <= set(ptrs)
    dy, dh = torch.randn(y.shape, generator=gen), torch.randn(h.shape, generator=gen)
    torch.autograd.grad((y, h), [x, r, w, *bias], (dy, dh))
    (k, ptrs), = spy.calls[1:]
    assert k.key.stage == "bwd_add" and dh.data_ptr() in ptrs
    spy.calls.clear()
    y, h = run_add(norm, x, r, w, b, 1e-5)
    gx, gr, gw, *gb = torch.autograd.grad(y, [x, r, w, *bias], dy)
    assert [k.key.stage for k, _ in spy.calls] == ["fwd_add", "bwd"]
    want = torch.autograd.grad(run(norm, x + r, w, b, 1e-5), [x, w, *bias], dy)
    for got, ref in zip((gx, gw, *gb), want):
        torch.testing.assert_close(got, ref)
    assert torch.equal(gx, gr)
    spy.calls.clear()
    y, h = run_add(norm, x, r, w, b, 1e-5)
    gx, gr, gw, *gb = torch.autograd.grad(h, [x, r, w, *bias], dh, allow_unused=True)
    assert [k.key.stage for k, _ in spy.calls] == ["fwd_add"]
    assert torch.equal(gx, dh) and torch.equal(gr, dh) and not gw.any() and all(not g.any() for g in gb)


@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_add_norm_gradcheck_fp64(norm, gen):
    x = rand(gen, (2, 3, 7), torch.float64, offset=1.0, requires_grad=True)
    r = rand(gen, (2, 3, 7), torch.float64, requires_grad=True)
    w = torch.randn(7, generator=gen, dtype=torch.float64).requires_grad_()
    b = torch.randn(7, generator=gen, dtype=torch.float64).requires_grad_()
    if norm == "rmsnorm":
        fn, ins = (lambda x, r, w: tn.rms_norm_add(x, r, w, 1e-6)), (x, r, w)
        op = lambda x, r, w: torch.ops.tvmnorm.rms_norm_add_fwd(x, r, w, 1e-6, True, torch.float64)[:2]  # noqa: E731
    else:
        fn, ins = (lambda x, r, w, b: tn.layer_norm_add(x, r, w, b, 1e-5)), (x, r, w, b)
        op = lambda x, r, w, b: torch.ops.tvmnorm.layer_norm_add_fwd(x, r, w, b, 1e-5, True, torch.float64)[:2]  # noqa: E731
    assert torch.autograd.gradcheck(fn, ins, **ALL_GRADCHECKS)
    assert torch.autograd.gradcheck(op, ins)  # the registered op's autograd (torch.compile's)


def test_add_norm_strided_x_and_module(gen):
    """x in any layout the kernels take (strided rows here: the fwd_add kernel for them), a
    strided residual (copied compact), out_dtype, and the modules' forward(x, residual) -> (y,
    h), as vLLM's norm layers take it."""
    qkv = rand(gen, (6, 3 * 128), torch.bfloat16, offset=1.0)
    x, r = qkv[:, 128:256].requires_grad_(), rand(gen, (6, 128), torch.bfloat16, requires_grad=True)
    w = (1 + 0.5 * torch.randn(128, generator=gen)).to(torch.bfloat16).requires_grad_()
    check_add_norm("rmsnorm", x, r, w, None, 1e-6, gen, out_dtype=torch.float32)
    wide = rand(gen, (6, 2 * 128), torch.bfloat16)
    check_add_norm("rmsnorm", x, wide[:, 64:192].requires_grad_(), w, None, 1e-6, gen)
    for kind in (tn.RMSNorm, tn.LayerNorm):
        m = kind(128, eps=1e-6)
        with torch.no_grad():
            m.weight.copy_(w.float())
        xf, rf = x.detach().float().view(2, 3, 128).requires_grad_(), r.detach().float().view(2, 3, 128).requires_grad_()
        check_add_norm("rmsnorm" if kind is tn.RMSNorm else "layernorm", xf, rf, m.weight, getattr(m, "bias", None),
                       1e-6, gen, fn=m)


def test_add_norm_bad_input_messages(gen):
    x, w = rand(gen, (3, 128)), torch.ones(128)
    with pytest.raises(ValueError, match=r"rms_norm_add: residual must have x's shape \[3, 128\], got \[1, 128\]"):
        tn.rms_norm_add(x, x[:1], w)
    with pytest.raises(TypeError, match="residual .torch.bfloat16. must have x's dtype .torch.float32."):
        tn.layer_norm_add(x, x.bfloat16(), w, None)
    with pytest.raises(TypeError, match="residual must be a torch.Tensor, got float"):
        tn.rms_norm_add(x, 1.0, w)
    with pytest.raises(ValueError, match="weight must have shape \\[128\\]"):
        tn.rms_norm_add(x, x, torch.ones(64))


# ---------------------------------------------------------------------------------------------
# zero copy, layouts, targets


class Spy:
    """Wraps the host layer's kernel lookup to record the data pointers each kernel receives."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = _host.kernel

        def kernel(*args, **kw):
            k = real(*args, **kw)

            def call(*arrays, **kwa):
                self.calls.append((k, [a.data_ptr() for a in arrays]))
                return k(*arrays, **kwa)
            return call
        monkeypatch.setattr(_host, "kernel", kernel)


def test_zero_copy_fwd_bwd(monkeypatch, gen):
    spy = Spy(monkeypatch)
    big = rand(gen, (10, 4, 128))
    x = big[2:7].requires_grad_()  # a row slice of a bigger tensor: still row-contiguous
    w = torch.randn(128, generator=gen).requires_grad_()
    y = tn.rms_norm(x, w)
    (k, ptrs), = spy.calls
    assert k.kind == "llvm"
    assert ptrs[0] == x.data_ptr() == big[2].data_ptr(), "x was copied before the kernel"
    assert ptrs[1] == w.data_ptr(), "weight was copied"
    assert ptrs[2] == y.data_ptr(), "y is not the buffer the kernel wrote"
    dy = torch.randn(y.shape, generator=gen)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    (_, bptrs), = spy.calls[1:]
    assert bptrs[0] == dy.data_ptr() and bptrs[1] == x.data_ptr()
    assert bptrs[4] == dx.data_ptr() and bptrs[5] == dw.data_ptr()


def test_zero_copy_layer_norm_no_grad(monkeypatch, gen):
    spy = Spy(monkeypatch)
    x = rand(gen, (3, 128), torch.bfloat16)
    w, b = torch.randn(128, generator=gen), torch.randn(128, generator=gen)
    y = tn.layer_norm(x, w, b)
    (_, ptrs), = spy.calls
    assert ptrs[:4] == [x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
@pytest.mark.parametrize("hidden,width,offset,lead", [(128, 384, 0, (2, 5)), (1000, 1003, 3, (7,)),
                                                      (4095, 4100, 5, (3,)), (96, 288, 96, (3, 4, 2))])
def test_strided_rows_match_float64(norm, dtype, hidden, width, offset, lead, gen):
    """x[..., offset:offset + hidden] of a wider tensor (q sliced out of a fused qkv; odd strides
    and offsets on the CPU): the forward and the backward run the kernels for strided rows on x
    itself, and y, dx, dweight (and dbias) are right against float64."""
    big = rand(gen, (*lead, width), dtype, offset=2.0)
    x = big[..., offset:offset + hidden].requires_grad_()
    assert not x.is_contiguous() and _host.row_groups(x, hidden) == ((x.numel() // hidden, width),)
    w, b = rand(gen, (hidden,), dtype, requires_grad=True), rand(gen, (hidden,), dtype, requires_grad=True)
    check_fwd_bwd(norm, x, w, b if norm == "layernorm" else None, 1e-5, gen)
    assert_layout_kernels("strided", hidden, dtype)


def assert_layout_kernels(layout: str, hidden: int, dtype):
    """The forward and the backward of hidden/dtype ran the default kernels for x in ``layout``."""
    used = [k for tag, k in _host._KERNELS.items() if tag[-1] == layout and tag[5] == hidden and tag[2] == dtype
            and tag[1] in ("fwd", "bwd")]  # not the residual add's, which another test may have run
    assert {k.key.stage for k in used} == {"fwd", "bwd"}
    assert all(k.origin == f"default:{layout}" and k.layout == layout for k in used)


def fused_qkv_heads(gen, dtype, lead, heads: int, kv_heads: int, head_dim: int, part: str, pad: int = 0,
                    device="cpu"):
    """q or k of a fused qkv projection, per head: qkv[..., q or k columns].view(*lead, heads, head_dim)
    (vLLM's and SGLang's QK-norm input), the qkv rows NaN-padded by ``pad`` columns at each end,
    so a read past a head's columns would bring a NaN in."""
    q, kv = heads * head_dim, kv_heads * head_dim
    qkv = torch.full((*lead, pad + q + 2 * kv + pad), float("nan"), dtype=dtype, device=device)
    start, n = (pad, heads) if part == "q" else (pad + q, kv_heads)
    qkv[..., start:start + n * head_dim] = rand(gen, (*lead, n * head_dim), dtype, offset=2.0, device=device)
    return qkv[..., start:start + n * head_dim].view(*lead, n, head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
@pytest.mark.parametrize("lead,heads,kv_heads,head_dim,part,pad", [((7,), 3, 1, 128, "q", 0), ((2, 5), 4, 2, 128, "k", 8),
                                                                   ((9,), 5, 5, 96, "q", 3), ((33,), 2, 2, 1000, "k", 1)],
                         ids=("q-7x3x128", "k-2x5x2x128", "q-9x5x96", "k-33x2x1000"))
def test_per_head_rows_of_fused_qkv_match_float64(norm, dtype, lead, heads, kv_heads, head_dim, part, pad, gen):
    """Per-head q or k of a fused qkv (rows tokens x heads at two strides, no [rows, hidden]
    view): the forward and the backward run the kernels for per-head rows on x itself (no
    copy), and y, dx, dweight (and dbias) are right against float64."""
    x = fused_qkv_heads(gen, dtype, lead, heads, kv_heads, head_dim, part, pad).requires_grad_()
    groups = _host.row_groups(x, head_dim)
    assert len(groups) == 2 and _host.x_operand(x, head_dim)[1].data_ptr() == x.data_ptr()
    w, b = rand(gen, (head_dim,), dtype, requires_grad=True), rand(gen, (head_dim,), dtype, requires_grad=True)
    check_fwd_bwd(norm, x, w, b if norm == "layernorm" else None, 1e-5, gen)
    assert_layout_kernels("heads", head_dim, dtype)


def test_per_head_rows_of_other_layouts(gen):
    """Two-stride rows beyond qkv: 3 of 4 heads, and heads broadcast from one row (stride 0)."""
    w = rand(gen, (128,), torch.float32)
    for x in (rand(gen, (5, 3 * 4 * 128))[:, :4 * 128].view(5, 4, 128)[:, :3],
              rand(gen, (5, 128))[:, None].expand(5, 6, 128)):
        assert len(_host.row_groups(x, 128)) == 2
        assert_close("y", tn.rms_norm(x, w), reference("rmsnorm", x, w, None, 1e-6)[3])


def test_strided_rows_that_are_no_rows_view_rejected(gen):
    """Layouts beyond the kernels': rows at three strides (heads of a qkv whose batch and
    sequence dims were sliced apart), a transpose (columns not adjacent), a 1-D slice with a
    step; each names its strides."""
    w = torch.ones(128)
    qkv = rand(gen, (2, 6, 3 * 4 * 128))[:, :5]  # batch rows 6 tokens apart, 5 of them used
    heads = qkv[..., :4 * 128].view(2, 5, 4, 128)
    assert len(_host.row_groups(heads, 128)) == 3
    with pytest.raises(ValueError, match=r"tokens x heads at two strides.*strides \(9216, 1536, 128, 1\)"):
        tn.rms_norm(heads, w)
    with pytest.raises(ValueError, match=r"strides \(1, 6\)"):
        tn.layer_norm(rand(gen, (128, 6)).t(), w, None)
    with pytest.raises(ValueError, match=r"rows of 128 adjacent columns"):
        tn.rms_norm(rand(gen, (256,))[::2], w)
    # the explicit copy the message suggests works
    torch.testing.assert_close(tn.rms_norm(heads.contiguous(), w), F.rms_norm(heads, (128,), w, 1e-6))


def test_strided_weight_and_grad_are_fine(gen):
    """weight is one row (copying it is cheap); dy comes from autograd in any layout."""
    x = rand(gen, (4, 128), torch.float64, requires_grad=True)
    wbig = torch.randn(128, 2, generator=gen, dtype=torch.float64)
    w = wbig[:, 0].requires_grad_()
    assert not w.is_contiguous()
    y = tn.rms_norm(x, w)
    y.sum().backward()  # dy is an expanded scalar (stride 0)
    xr, wr, _, yr = reference("rmsnorm", x, w, None, 1e-6)
    yr.sum().backward()
    assert_close("y", y, yr)
    assert_close("dx", x.grad, xr.grad)
    assert_close("dweight", w.grad, wr.grad)


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_sparse_grad_reaching_the_backward(gen, norm):
    """autograd passes a sparse dy on when the next op's backward made one; it is made dense."""
    x = rand(gen, (6, 128), torch.float64, requires_grad=True)
    w = torch.randn(128, generator=gen, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(6, 128, generator=gen, dtype=torch.float64)
    dy[1:4] = 0
    b = torch.randn(128, generator=gen, dtype=torch.float64)
    y = tn.rms_norm(x, w) if norm == "rmsnorm" else tn.layer_norm(x, w, b)
    y.backward(dy.to_sparse())
    xr, wr, _, yr = reference(norm, x, w, b, 1e-6 if norm == "rmsnorm" else 1e-5)
    yr.backward(dy)
    assert_close("dx", x.grad, xr.grad)
    assert_close("dweight", w.grad, wr.grad)


def test_1d_input(gen):
    x = rand(gen, (128,), requires_grad=True)
    w = torch.randn(128, generator=gen)
    y = tn.rms_norm(x, w)
    assert y.shape == (128,)
    torch.testing.assert_close(y, F.rms_norm(x, (128,), w, 1e-6))


# ---------------------------------------------------------------------------------------------
# bad input, empty input, NaN/Inf


def test_bad_input_messages():
    x, w = torch.randn(4, 128), torch.randn(128)
    with pytest.raises(TypeError, match="x has unsupported dtype torch.int32"):
        tn.rms_norm(torch.ones(4, 128, dtype=torch.int32), w)
    with pytest.raises(TypeError, match="weight has unsupported dtype torch.float8_e4m3fn"):
        tn.rms_norm(x, w.to(torch.float8_e4m3fn))
    with pytest.raises(TypeError, match="float64 is only supported with x, weight, bias and output all float64"):
        tn.rms_norm(x.double(), w.bfloat16())
    with pytest.raises(TypeError, match="float64 is only supported"):
        tn.rms_norm(x, w, out_dtype=torch.float64)
    with pytest.raises(TypeError, match="out_dtype torch.int8"):
        tn.rms_norm(x, w, out_dtype=torch.int8)
    with pytest.raises(ValueError, match=r"weight must have shape \[128\].*got \[129\]"):
        tn.rms_norm(x, torch.randn(129))
    with pytest.raises(ValueError, match=r"weight must have shape \[128\].*got \[1, 128\]"):
        tn.layer_norm(x, torch.randn(1, 128), None)
    with pytest.raises(ValueError, match=r"bias must have shape \[128\]"):
        tn.layer_norm(x, w, torch.randn(64))
    with pytest.raises(TypeError, match="weight .* and bias .* must have the same dtype"):
        tn.layer_norm(x, w, torch.zeros(128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="x is on cpu but weight is on meta"):
        tn.rms_norm(x, torch.empty(128, device="meta"))
    with pytest.raises(ValueError, match="0-dim"):
        tn.rms_norm(torch.tensor(1.0), torch.ones(1))
    with pytest.raises(ValueError, match="normalized .* dimension of x has size 0"):
        tn.rms_norm(torch.randn(4, 0), torch.ones(0))
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        tn.rms_norm(x, [1.0] * 128)
    with pytest.raises(TypeError, match=r"rms_norm: x must be a dense tensor .*layout torch.sparse_coo.*x.to_dense\(\)"):
        tn.rms_norm(x.to_sparse(), w)
    with pytest.raises(TypeError, match="x must be a dense tensor .*layout torch.sparse_csr"):
        tn.rms_norm(x.to_sparse_csr(), w)
    with pytest.raises(TypeError, match="layer_norm: bias must be a dense tensor .*layout torch.sparse_coo"):
        tn.layer_norm(x, w, torch.randn(128).to_sparse())
    with pytest.raises(TypeError, match="rms_norm_add: residual must be a dense tensor"):
        tn.rms_norm_add(x, x.to_sparse(), w)
    with pytest.raises(TypeError, match="x must be a dense tensor .*got a nested tensor"):
        tn.rms_norm(torch.nested.nested_tensor([torch.randn(2, 128), torch.randn(3, 128)]), w)
    with pytest.raises(TypeError, match="fp8_dtype"):
        tn.rms_norm_fp8(x, w, 1.0, fp8_dtype=torch.float16)
    with pytest.raises(ValueError, match="scale must hold one value"):
        tn.rms_norm_fp8(x, w, torch.ones(2))


def test_eps_that_would_make_y_nan_is_refused(gen):
    """A negative eps made the rows whose mean square is below -eps NaN and a NaN eps every row
    (as torch does, silently); both raise, in each op, the module and the kernel itself. eps 0
    and a one-value tensor are numbers like any other."""
    from tvmnorm.runtime import get_kernel
    x, w, b = rand(gen, (4, 128)), torch.randn(128, generator=gen), torch.randn(128, generator=gen)
    x[1] *= 1e-4  # its mean square is below 1e-6: a NaN row with eps = -1e-6
    r = torch.randn(4, 128, generator=gen)
    calls = {"rms_norm": lambda eps: tn.rms_norm(x, w, eps),
             "layer_norm": lambda eps: tn.layer_norm(x, w, b, eps),
             "rms_norm_add": lambda eps: tn.rms_norm_add(x, r, w, eps),
             "layer_norm_add": lambda eps: tn.layer_norm_add(x, r, w, b, eps),
             "rms_norm_fp8": lambda eps: tn.rms_norm_fp8(x, w, 1.0, eps),
             "layer_norm_fp8": lambda eps: tn.layer_norm_fp8(x, w, b, 1.0, eps),
             "rms_norm_add_fp8": lambda eps: tn.rms_norm_add_fp8(x, r, w, 1.0, eps),
             "layer_norm_add_fp8": lambda eps: tn.layer_norm_add_fp8(x, r, w, b, 1.0, eps),
             "RMSNorm": lambda eps: tn.RMSNorm(128, eps=eps)(x),
             "LayerNorm": lambda eps: tn.LayerNorm(128, eps=eps)(x)}
    for op, call in calls.items():
        name = {"RMSNorm": "rms_norm", "LayerNorm": "layer_norm"}.get(op, op)
        for eps in (-1e-6, float("nan")):
            with pytest.raises(ValueError, match=rf"^{name}: eps must be a non-negative number, got {eps}$"):
                call(eps)
        with pytest.raises(TypeError, match=rf"^{name}: eps must be a number, got 'a'$"):
            call("a")
    torch.testing.assert_close(tn.rms_norm(x, w, 0.0), F.rms_norm(x, (128,), w, 0.0))
    torch.testing.assert_close(tn.layer_norm(x, w, b, torch.tensor([1e-3])), F.layer_norm(x, (128,), w, b, 1e-3))
    kernel = get_kernel(NormKey(hidden_size=128, itype="fp32", wtype="fp32", otype="fp32"), "llvm")
    y, rs = torch.empty_like(x), torch.empty(4)
    with pytest.raises(ValueError, match=r"eps must be a non-negative number, got -1e-06"):
        kernel(x, w, y, rs, eps=-1e-6)


@pytest.mark.parametrize("shape", [(0, 128), (2, 0, 128)])
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_empty_input(norm, shape):
    x = torch.randn(shape, requires_grad=True)
    w, b = torch.randn(128, requires_grad=True), torch.randn(128, requires_grad=True)
    y = run(norm, x, w, b if norm == "layernorm" else None, 1e-5)
    assert y.shape == shape
    y.sum().backward()
    assert x.grad.shape == shape
    assert torch.equal(w.grad, torch.zeros(128))
    if norm == "layernorm":
        assert torch.equal(b.grad, torch.zeros(128))
    y8, amax = (tn.rms_norm_fp8(x, w, 2.0) if norm == "rmsnorm" else tn.layer_norm_fp8(x, w, b, 2.0))
    assert y8.shape == shape and y8.dtype == torch.float8_e4m3fn
    assert amax.shape == (1,) and amax.item() == 0.0
    y8, h, amax = (tn.rms_norm_add_fp8(x, x, w, 2.0) if norm == "rmsnorm" else tn.layer_norm_add_fp8(x, x, w, b, 2.0))
    assert y8.shape == h.shape == shape and amax.shape == (1,) and amax.item() == 0.0


@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_nan_inf_propagate_like_torch(norm, gen):
    x = rand(gen, (5, 128))
    x[0, 3] = float("nan")
    x[1, 2] = float("inf")
    x[2, 5] = -float("inf")
    x[3] = 0.0
    w, b = torch.randn(128, generator=gen), torch.randn(128, generator=gen)
    ours = run(norm, x, w, b, 1e-5)
    theirs = (F.rms_norm(x, (128,), w, 1e-5) if norm == "rmsnorm" else F.layer_norm(x, (128,), w, b, 1e-5))
    assert torch.equal(ours.isnan(), theirs.isnan())
    assert torch.equal(ours.isinf(), theirs.isinf())
    fin = theirs.isfinite()
    torch.testing.assert_close(ours[fin], theirs[fin])


# ---------------------------------------------------------------------------------------------
# fp8 output


def fp8_reference(norm, x, w, b, scale, fp8_dtype, eps):
    _, _, _, yr = reference(norm, x, w, b, eps)
    yr = yr.detach()
    fmax = torch.finfo(fp8_dtype).max
    return (yr * scale).clamp(-fmax, fmax).to(fp8_dtype), yr.abs().max()


@pytest.mark.parametrize("fp8_dtype", (torch.float8_e4m3fn, torch.float8_e5m2), ids=("e4m3", "e5m2"))
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
@pytest.mark.parametrize("strided", (False, True), ids=("compact", "strided"))
def test_fp8_output(norm, fp8_dtype, strided, gen):
    x = rand(gen, (3, 4, 128 + 40 * strided), torch.bfloat16, offset=1.0)[..., 40 * strided:]  # strided: rows 168 apart
    w = (1 + 0.5 * torch.randn(128, generator=gen)).to(torch.bfloat16)
    b = (0.5 * torch.randn(128, generator=gen)).to(torch.bfloat16)
    scale = torch.tensor([3.0])
    if norm == "rmsnorm":
        y8, amax = tn.rms_norm_fp8(x, w, scale, 1e-6, fp8_dtype=fp8_dtype)
    else:
        y8, amax = tn.layer_norm_fp8(x, w, b, scale, 1e-5, fp8_dtype=fp8_dtype)
    check_fp8(norm, x, w, b, y8, amax, fp8_dtype, 1e-6 if norm == "rmsnorm" else 1e-5)
    check_saturates(tn.rms_norm_fp8(x, w, 1e6, fp8_dtype=fp8_dtype)[0] if norm == "rmsnorm"
                    else tn.layer_norm_fp8(x, w, b, 1e6, fp8_dtype=fp8_dtype)[0], fp8_dtype)


def check_fp8(norm, x, w, b, y8, amax, fp8_dtype, eps):
    """y8 and amax of x's norm (scale 3) against float64."""
    q, amax_ref = fp8_reference(norm, x, w, b, 3.0, fp8_dtype, eps)
    assert y8.dtype == fp8_dtype and y8.shape == x.shape
    assert amax.dtype == torch.float32 and amax.shape == (1,)
    assert_close("amax", amax, amax_ref.reshape(1), torch.float32, rtol=1e-5, atol=0)
    # fp32 y may sit on the other side of an fp8 rounding boundary than the fp64 one: one step
    step = 2.0 ** -(3 if fp8_dtype == torch.float8_e4m3fn else 2)
    assert_close("y_fp8", y8.double(), q.double(), torch.float32, rtol=step, atol=0.02)
    assert (y8.double() == q.double()).float().mean() > 0.95


def check_saturates(big, fp8_dtype):
    """A large scale clamps at the format's max instead of overflowing to inf/nan."""
    assert big.double().abs().max() == torch.finfo(fp8_dtype).max
    assert big.double().isfinite().all()


@pytest.mark.parametrize("fp8_dtype", (torch.float8_e4m3fn, torch.float8_e5m2), ids=("e4m3", "e5m2"))
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
@pytest.mark.parametrize("layout", ("compact", "strided"))
def test_add_norm_fp8_output(norm, fp8_dtype, layout, gen):
    """rms_norm_add_fp8 / layer_norm_add_fp8: one fwd_add kernel with the fp8 cast, h = x +
    residual exactly (torch's add), y8 and amax those of h's norm (test_fp8_output's bounds);
    x strided (the strided rows' kernel) with a strided residual (copied compact)."""
    wide = 40 * (layout == "strided")
    x = rand(gen, (3, 5, 128 + wide), torch.bfloat16, offset=1.0)[..., wide:]
    r = rand(gen, (3, 5, 128 + wide), torch.bfloat16)[..., :128]
    w = (1 + 0.5 * torch.randn(128, generator=gen)).to(torch.bfloat16)
    b = (0.5 * torch.randn(128, generator=gen)).to(torch.bfloat16)
    eps = 1e-6 if norm == "rmsnorm" else 1e-5
    add_fp8 = (lambda s: tn.rms_norm_add_fp8(x, r, w, s, eps, fp8_dtype=fp8_dtype)) if norm == "rmsnorm" else \
        (lambda s: tn.layer_norm_add_fp8(x, r, w, b, s, eps, fp8_dtype=fp8_dtype))
    y8, h, amax = add_fp8(torch.tensor([3.0]))
    assert torch.equal(h, x + r) and h.is_contiguous() and h.dtype == x.dtype
    check_fp8(norm, h, w, b, y8, amax, fp8_dtype, eps)
    check_saturates(add_fp8(1e6)[0], fp8_dtype)


def test_add_norm_fp8_is_one_kernel_and_checks_its_input(monkeypatch, gen):
    spy = Spy(monkeypatch)
    x, r, w = rand(gen, (4, 128)), rand(gen, (4, 128)), torch.ones(128)
    y8, h, amax = tn.rms_norm_add_fp8(x, r, w, 2.0)
    (k, ptrs), = spy.calls
    assert (k.key.stage, k.key.otype) == ("fwd_add", "fp8e4m3") and ptrs[:2] == [x.data_ptr(), r.data_ptr()]
    assert {y8.data_ptr(), h.data_ptr(), amax.data_ptr()} <= set(ptrs)
    assert not (y8.requires_grad or h.requires_grad)  # no input requires grad
    with pytest.raises(ValueError, match=r"rms_norm_add_fp8: residual must have x's shape \[4, 128\], got \[1, 128\]"):
        tn.rms_norm_add_fp8(x, r[:1], w, 2.0)
    with pytest.raises(TypeError, match="layer_norm_add_fp8: fp8_dtype must be"):
        tn.layer_norm_add_fp8(x, r, w, None, 2.0, fp8_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="layer_norm_add_fp8: scale must hold one value"):
        tn.layer_norm_add_fp8(x, r, w, None, torch.ones(2))
    with pytest.raises(TypeError, match="rms_norm_add_fp8: fp8 output needs x in float32"):
        tn.rms_norm_add_fp8(x.double(), r.double(), w.double(), 2.0)


@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
@pytest.mark.parametrize("add", (False, True), ids=("norm", "add-norm"))
def test_fp8_ops_refuse_a_backward_that_reaches_them(gen, norm, add):
    """The fp8 ops have no backward: where an input requires grad, a loss that reaches y_fp8 or h
    raises, naming the op (h, the next block's residual, left x and residual silently without
    that part of their gradient before); amax never requires grad; the values are those of the
    same call without grad, and nothing changes under no_grad or without an input that requires
    grad."""
    x, r = rand(gen, (4, 128)), rand(gen, (4, 128))
    w, b = torch.randn(128, generator=gen), torch.randn(128, generator=gen) if norm == "layernorm" else None
    op = f"{'rms' if norm == 'rmsnorm' else 'layer'}_norm{'_add' if add else ''}_fp8"

    def call(x, w):
        args = (x, r) if add else (x,)
        return getattr(tn, op)(*args, w, *((b,) if norm == "layernorm" else ()), 2.0)
    plain = call(x, w)
    assert not any(t.requires_grad for t in plain)
    for grad_of in ("x", "weight"):
        xg, wg = x.clone().requires_grad_(grad_of == "x"), w.clone().requires_grad_(grad_of == "weight")
        out = call(xg, wg)
        *values, amax = out
        assert all(v.requires_grad for v in values) and not amax.requires_grad
        assert all(torch.equal(a.float(), p.float()) for a, p in zip(out, plain))
        for v in values:
            with pytest.raises(RuntimeError, match=f"^{op} is forward-only"):
                v.float().sum().backward()
        with torch.no_grad():
            assert not any(t.requires_grad for t in call(xg, wg))


# ---------------------------------------------------------------------------------------------
# torch.library / torch.compile


OPS = [
    ("rms_norm_fwd", lambda x, w, b: (x, w, 1e-6, False, x.dtype)),
    ("layer_norm_fwd", lambda x, w, b: (x, w, b, 1e-5, True, torch.float32)),
    ("rms_norm_fp8", lambda x, w, b: (x, w, torch.tensor([2.0]), 1e-6, False, torch.float8_e4m3fn)),
    ("layer_norm_fp8", lambda x, w, b: (x, w, b, torch.tensor([2.0]), 1e-5, False, torch.float8_e5m2)),
    ("rms_norm_add_fwd", lambda x, w, b: (x, torch.randn(x.shape).requires_grad_(x.requires_grad), w, 1e-6, False,
                                          x.dtype)),
    ("layer_norm_add_fwd", lambda x, w, b: (x, torch.randn(x.shape).requires_grad_(x.requires_grad), w, b, 1e-5,
                                            True, torch.bfloat16)),
    ("rms_norm_add_fp8", lambda x, w, b: (x, torch.randn(x.shape), w, torch.tensor([2.0]), 1e-6, False,
                                          torch.float8_e4m3fn)),
    ("layer_norm_add_fp8", lambda x, w, b: (x, torch.randn(x.shape), w, b, torch.tensor([2.0]), 1e-5, True,
                                            torch.float8_e5m2)),
]


@pytest.mark.parametrize("layout", ("compact", "heads"))
@pytest.mark.parametrize("name,args", OPS, ids=[o[0] for o in OPS])
def test_opcheck(name, args, layout, gen):
    """torch.library's own checks: schema, fake (meta) implementation, autograd registration;
    on compact x and on per-head q of a fused qkv."""
    fp8 = "fp8" in name
    x = rand(gen, (2, 3, 128)) if layout == "compact" else fused_qkv_heads(gen, torch.float32, (5,), 4, 2, 128, "q")
    x.requires_grad_(not fp8)
    w = torch.randn(128, generator=gen).requires_grad_(not fp8)
    b = torch.randn(128, generator=gen).requires_grad_(not fp8)
    result = torch.library.opcheck(getattr(torch.ops.tvmnorm, name).default, args(x, w, b))
    assert all(v == "SUCCESS" for v in result.values()), result


class Block(torch.nn.Module):
    def __init__(self, hidden=128):
        super().__init__()
        self.lin = torch.nn.Linear(hidden, hidden)
        self.rms = tn.RMSNorm(hidden, eps=1e-6)
        self.ln = tn.LayerNorm(hidden)

    def forward(self, x):
        return self.ln(torch.relu(self.rms(self.lin(x))) + x)


def _block_and_input(gen):
    torch.manual_seed(0)
    m = Block()
    with torch.no_grad():
        m.rms.weight.add_(0.3 * torch.randn(128, generator=gen))
        m.ln.bias.add_(0.3 * torch.randn(128, generator=gen))
    return m, rand(gen, (2, 5, 128))


def _eager_and_compiled(m, x, compiled):
    out = {}
    for name, mod in (("eager", m), ("compiled", compiled)):
        m.zero_grad()
        xi = x.clone().requires_grad_()
        y = mod(xi)
        y.backward(torch.cos(torch.arange(y.numel(), dtype=y.dtype)).view_as(y))
        out[name] = (y.detach(), xi.grad, [p.grad.clone() for p in m.parameters()])
    return out


def test_compile_fullgraph_no_graph_break(gen):
    m, x = _block_and_input(gen)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(m, backend=backend, fullgraph=True)
    out = _eager_and_compiled(m, x, compiled)
    assert len(graphs) == 1
    assert "tvmnorm.rms_norm_fwd" in graphs[0] and "tvmnorm.layer_norm_fwd" in graphs[0]
    torch.testing.assert_close(out["compiled"][0], out["eager"][0])
    explanation = torch._dynamo.explain(m)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_compile_aot_eager_backward(gen):
    """AOTAutograd traces the registered backward (tvmnorm.*_bwd ops) into the joint graph."""
    m, x = _block_and_input(gen)
    torch._dynamo.reset()
    out = _eager_and_compiled(m, x, torch.compile(m, backend="aot_eager", fullgraph=True))
    (ye, gxe, gpe), (yc, gxc, gpc) = out["eager"], out["compiled"]
    torch.testing.assert_close(yc, ye)
    torch.testing.assert_close(gxc, gxe)
    for a, b in zip(gpc, gpe):
        torch.testing.assert_close(a, b)


def test_compile_functional_dynamic(gen):
    """Fake implementations give the right shapes under dynamic shapes (no recompile per M)."""
    w = torch.randn(128, generator=gen)

    def f(x):
        y, h = tn.rms_norm_add(x, x * 0.5, w)
        return tn.rms_norm(x, w) * 2, tn.rms_norm_fp8(x, w, 4.0)[1], y, h, tn.rms_norm_add_fp8(x, x * 0.5, w, 4.0)

    torch._dynamo.reset()
    cf = torch.compile(f, backend="aot_eager", fullgraph=True, dynamic=True)
    for rows in (3, 9):
        x = rand(gen, (rows, 128))
        y, amax, y_add, h, (y8, h8, amax8) = cf(x)
        torch.testing.assert_close(amax8, F.rms_norm(x * 1.5, (128,), w, 1e-6).abs().max().reshape(1))
        assert torch.equal(h8, h) and y8.dtype == torch.float8_e4m3fn
        torch.testing.assert_close(y, 2 * F.rms_norm(x, (128,), w, 1e-6))
        torch.testing.assert_close(amax, F.rms_norm(x, (128,), w, 1e-6).abs().max().reshape(1))
        torch.testing.assert_close(h, x * 1.5)
        torch.testing.assert_close(y_add, F.rms_norm(x * 1.5, (128,), w, 1e-6))


def test_compile_dynamic_strided_and_per_head_rows(gen):
    """x's rows at one stride and per head of a fused qkv, under dynamic shapes: the fake
    implementation's layout check (row_groups) takes symbolic sizes, which do not hash."""
    w = torch.randn(128, generator=gen)

    def f(qkv):
        return tn.rms_norm(qkv[:, 128:256], w), tn.rms_norm(qkv[:, :512].view(qkv.shape[0], 4, 128), w)

    torch._dynamo.reset()
    cf = torch.compile(f, backend="aot_eager", fullgraph=True, dynamic=True)
    for rows in (3, 9):
        qkv = rand(gen, (rows, 768))
        strided, heads = cf(qkv)
        torch.testing.assert_close(strided, F.rms_norm(qkv[:, 128:256], (128,), w, 1e-6))
        torch.testing.assert_close(heads, F.rms_norm(qkv[:, :512].view(rows, 4, 128), (128,), w, 1e-6))


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=("fp32", "bf16"))
@pytest.mark.parametrize("offset", (1, 3, 8))
def test_cpu_operands_at_odd_offsets(dtype, offset, gen):
    """Compact CPU operands whose base is not 64-byte aligned (views at an odd element offset):
    TVM's llvm kernels take every tensor as 64-byte aligned, and such an x crashed the process
    (aligned vector moves). The host layer copies them; every op stays right against float64."""
    def odd(shape):  # a compact view of fresh values, `offset` elements into its storage
        n = math.prod(shape)
        return rand(gen, (n + offset,), dtype, offset=0.5)[offset:].view(shape)
    x, r, w, b = odd((64, 1024)), odd((64, 1024)), odd((1024,)), odd((1024,))
    assert all(t.data_ptr() % 64 for t in (x, r, w, b))
    for norm in ("rmsnorm", "layernorm"):
        bias = b if norm == "layernorm" else None
        check_fwd_bwd(norm, x.clone().requires_grad_(), w.clone().requires_grad_(),
                      None if bias is None else bias.clone().requires_grad_(), 1e-5, gen)
        xg = odd((64, 1024)).requires_grad_()
        y = run(norm, xg, w, bias, 1e-5)
        (gx,) = torch.autograd.grad(y, xg, odd((64, 1024)))
        yr = reference(norm, xg, w, bias, 1e-5)[3]
        assert_close("y", y, yr)
        assert gx.isfinite().all()
        y, h = run_add(norm, x, r, w, bias, 1e-5)
        assert torch.equal(h, x + r)
        assert_close("y_add", y, reference(norm, x + r, w, bias, 1e-5)[3])
        y8, amax = tn.rms_norm_fp8(x, w, 3.0, 1e-5) if norm == "rmsnorm" else tn.layer_norm_fp8(x, w, bias, 3.0, 1e-5)
        check_fp8(norm, x, w, bias, y8, amax, torch.float8_e4m3fn, 1e-5)
        y8, h8, amax = (tn.rms_norm_add_fp8(x, r, w, 3.0, 1e-5) if norm == "rmsnorm"
                        else tn.layer_norm_add_fp8(x, r, w, bias, 3.0, 1e-5))
        assert torch.equal(h8, x + r)
        check_fp8(norm, h8, w, bias, y8, amax, torch.float8_e4m3fn, 1e-5)


def test_compile_inductor(gen):
    m, x = _block_and_input(gen)
    torch._dynamo.reset()
    out = _eager_and_compiled(m, x, torch.compile(m, fullgraph=True))
    (ye, gxe, gpe), (yc, gxc, gpc) = out["eager"], out["compiled"]
    torch.testing.assert_close(yc, ye, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gxc, gxe, rtol=1e-4, atol=1e-4)
    for gc, ge in zip(gpc, gpe, strict=True):
        torch.testing.assert_close(gc, ge, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ("aot_eager", "inductor"))
def test_compile_add_norm(backend, gen):
    """A pre-norm block's residual add + norm compiled whole (fullgraph): the registered ops
    (tvmnorm.*_add_fwd, whose registered backward is tvmnorm.*_bwd_add) in the graph, y, h and
    every gradient as in eager."""
    lin = torch.nn.Linear(128, 128)
    norm_rms, norm_ln = tn.RMSNorm(128, eps=1e-6), tn.LayerNorm(128)
    with torch.no_grad():
        norm_rms.weight.add_(0.3 * torch.randn(128, generator=gen))
        norm_ln.bias.add_(0.3 * torch.randn(128, generator=gen))

    def block(x, res):
        y, h = norm_rms(x, res)
        y2, h2 = norm_ln(lin(y), h)
        return y2 * 2 + h2

    params = [lin.weight, lin.bias, norm_rms.weight, norm_ln.weight, norm_ln.bias]
    x, res = rand(gen, (2, 5, 128)), rand(gen, (2, 5, 128), offset=1.0)
    results = []
    torch._dynamo.reset()
    for fn in (block, torch.compile(block, backend=backend, fullgraph=True)):
        xi, ri = x.clone().requires_grad_(), res.clone().requires_grad_()
        out = fn(xi, ri)
        grads = torch.autograd.grad(out, [xi, ri, *params], torch.cos(torch.arange(out.numel(), dtype=out.dtype)).view_as(out))
        results.append((out.detach(), *grads))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    explanation = torch._dynamo.explain(block)(x, res)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    code = explanation.graphs[0].code
    assert "tvmnorm.rms_norm_add_fwd" in code and "tvmnorm.layer_norm_add_fwd" in code, code


def test_compile_per_head_view(gen):
    """A per-head view made inside the compiled graph (qkv split, then q per head) reaches the op
    as Inductor lays it out, and the result is right against float64."""
    def qk_norm(qkv, w):
        return tn.rms_norm(qkv[:, :512].view(-1, 4, 128), w) * 2
    qkv, w = rand(gen, (6, 1024), offset=1.0), torch.randn(128, generator=gen)
    torch._dynamo.reset()
    _host._KERNELS.clear()
    got = torch.compile(qk_norm, fullgraph=True)(qkv, w)
    want = F.rms_norm(qkv[:, :512].view(-1, 4, 128).double(), (128,), w.double(), 1e-6) * 2
    assert_close("y", got, want)
    assert [tag[-1] for tag in _host._KERNELS] == ["heads"]  # the view itself, not a copy


class AddBlock(Block):
    """Block with the residual-add forms (rms_norm_add, layer_norm_add) as well."""

    def forward(self, x, residual):
        y, h = self.rms(self.lin(x), residual)
        z, h2 = self.ln(torch.relu(y), h)
        return z, h2


def test_export_keeps_the_ops_and_serves_other_rows_after_save_and_load(gen, tmp_path):
    """torch.export with a dynamic row count: the exported program calls the tvmnorm ops (not a
    decomposition), serves row counts it was not traced at, and survives torch.export.save/load
    (the loading process must have imported tvmnorm.torch, which registers the ops)."""
    torch.manual_seed(0)
    m = AddBlock()
    with torch.no_grad():
        m.rms.weight.add_(0.3 * torch.randn(128, generator=gen))
        m.ln.bias.add_(0.3 * torch.randn(128, generator=gen))
    rows = torch.export.Dim("rows", min=1)
    ep = torch.export.export(m, (rand(gen, (4, 128)), rand(gen, (4, 128))),
                             dynamic_shapes={"x": {0: rows}, "residual": {0: rows}})
    code = ep.run_decompositions().graph_module.code
    assert "tvmnorm.rms_norm_add_fwd" in code and "tvmnorm.layer_norm_add_fwd" in code, code
    torch.export.save(ep, tmp_path / "block.pt2")
    loaded = torch.export.load(tmp_path / "block.pt2").module()
    for n in (1, 7, 33):
        x, r = rand(gen, (n, 128), offset=1.0), rand(gen, (n, 128))
        want = m(x, r)
        for got in (ep.module()(x, r), loaded(x, r)):
            for g, w in zip(got, want):
                assert torch.equal(g, w)  # the same kernels on the same inputs
        h = m.lin(x).detach().double() + r.double()
        y = F.rms_norm(h, (128,), m.rms.weight.double(), 1e-6)
        assert_close("h2", want[1], y.relu() + h)
        assert_close("z", want[0], F.layer_norm(want[1].double(), (128,), m.ln.weight.double(),
                                                m.ln.bias.double(), 1e-5))


def test_aot_inductor_package_runs_the_ops(gen, tmp_path):
    """An AOTInductor package of a model with tvmnorm modules runs them (through torch's proxy
    executor, so in a Python process that imported tvmnorm.torch) and gives eager's results."""
    m, x = _block_and_input(gen)
    m.eval()
    ep = torch.export.export(m, (x,))
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "block.pt2"))
    got = torch._inductor.aoti_load_package(path)(x)
    torch.testing.assert_close(got, m(x))


def test_meta_tensors_give_torchs_shapes_and_dtypes_forward_and_backward():
    """On the meta device (shapes only: deferred init, FLOP counting) every op answers as the
    torch.library op's fake implementation does, with torch's shapes and dtypes, and its
    backward too."""
    M = "meta"
    x = torch.empty(2, 5, 64, device=M, dtype=torch.bfloat16, requires_grad=True)
    r = torch.empty_like(x, requires_grad=True)
    w = torch.empty(64, device=M, requires_grad=True)
    b = torch.empty(64, device=M, requires_grad=True)
    y = tn.rms_norm(x, w)
    want = F.rms_norm(x, (64,), w)
    assert (y.shape, y.dtype, y.device) == (want.shape, want.dtype, want.device)
    y.float().sum().backward()
    assert (x.grad.shape, x.grad.dtype, w.grad.shape, w.grad.dtype) == (x.shape, x.dtype, w.shape, w.dtype)
    y, h = tn.layer_norm_add(x, r, w, b, out_dtype=torch.float32)
    assert (y.dtype, h.dtype, y.device, h.shape) == (torch.float32, x.dtype, x.device, x.shape)
    (y.sum() + h.float().sum()).backward()
    assert r.grad.shape == x.shape and b.grad.shape == (64,)
    y8, h, amax = tn.rms_norm_add_fp8(x.detach(), r.detach(), w.detach(), 2.0)
    assert (y8.dtype, y8.shape, h.shape, amax.shape) == (torch.float8_e4m3fn, x.shape, x.shape, (1,))
    assert tn.LayerNorm(64, device=M)(torch.empty(3, 7, 64, device=M)).shape == (3, 7, 64)
    with pytest.raises(ValueError, match="x is on meta but weight is on cpu"):
        tn.rms_norm(torch.empty(3, 64, device=M), torch.ones(64))


# ---------------------------------------------------------------------------------------------
# torch.func transforms: checked against torch's own norms under the same transform, in float64
# (the same inputs, so the references are the exact computation)

F64 = torch.float64


def _func_case(gen, shape=(3, 4, 64)):
    return (rand(gen, shape, F64, offset=1.0), rand(gen, shape, F64), torch.randn(shape[-1], generator=gen, dtype=F64),
            torch.randn(shape[-1], generator=gen, dtype=F64))


def test_vmap_over_rows_and_over_weights_matches_torch(gen):
    from torch.func import vmap
    x, r, w, b = _func_case(gen)
    H = x.shape[-1]
    assert_close("rms", vmap(lambda t: tn.rms_norm(t, w))(x), F.rms_norm(x, (H,), w, 1e-6))
    assert_close("ln", vmap(lambda t: tn.layer_norm(t, w, b), in_dims=1, out_dims=1)(x),
                 F.layer_norm(x, (H,), w, b, 1e-5))
    y, h = vmap(lambda t, u: tn.layer_norm_add(t, u, w, b))(x, r)
    assert torch.equal(h, x + r)
    assert_close("ln_add", y, F.layer_norm(x + r, (H,), w, b, 1e-5))
    y, h = vmap(lambda t, u: tn.rms_norm_add(t, u, w), in_dims=(0, None))(x, r[0])
    assert_close("rms_add", y, F.rms_norm(x + r[0], (H,), w, 1e-6))
    assert_close("nested", vmap(vmap(lambda t: tn.rms_norm(t, w)))(x), F.rms_norm(x, (H,), w, 1e-6))
    assert_close("one row a sample", vmap(lambda t: tn.layer_norm(t, w, b))(x[:, 0]),
                 F.layer_norm(x[:, 0], (H,), w, b, 1e-5))
    # an ensemble: one weight (and bias) a member, the same x
    ws, bs = torch.stack([w, 2 * w, -w]), torch.stack([b, -b, 0 * b])
    assert_close("ensemble", vmap(lambda u, c: tn.layer_norm(x, u, c))(ws, bs),
                 torch.stack([F.layer_norm(x, (H,), u, c, 1e-5) for u, c in zip(ws, bs)]))


def test_per_sample_gradients_match_torch(gen):
    """vmap(grad): each sample's weight gradient its own (not summed over the batch)."""
    from torch.func import grad, vmap
    x, r, w, b = _func_case(gen)
    H = x.shape[-1]

    def ours(w, b, t, u):
        y, h = tn.layer_norm_add(t, u, w, b)
        return (tn.rms_norm(y, w) * h.cos()).sum()

    def theirs(w, b, t, u):
        h = t + u
        return (F.rms_norm(F.layer_norm(h, (H,), w, b, 1e-5), (H,), w, 1e-6) * h.cos()).sum()
    got, want = (vmap(grad(f, argnums=(0, 1, 2, 3)), in_dims=(None, None, 0, 0))(w, b, x, r) for f in (ours, theirs))
    for name, g, e in zip(("dw", "db", "dx", "dresidual"), got, want):
        assert g.shape == e.shape and g.shape[0] == x.shape[0]
        assert_close(name, g, e)


_PER_SAMPLE_OPS = {  # op -> (ours, torch's, the backward stage): loss(w, b, t, u, c) of a sample
    "rms_norm": (lambda w, b, t, u, c: (tn.rms_norm(t, w) * c).sum(),
                 lambda w, b, t, u, c: (F.rms_norm(t, (t.shape[-1],), w, 1e-6) * c).sum(), "bwd"),
    "layer_norm": (lambda w, b, t, u, c: (tn.layer_norm(t, w, b, zero_centered_gamma=True) * c).sum(),
                   lambda w, b, t, u, c: (F.layer_norm(t, (t.shape[-1],), w + 1, b, 1e-5) * c).sum(), "bwd"),
    # y alone: dh is None, the plain backward with h's gradient
    "rms_norm_add y": (lambda w, b, t, u, c: (tn.rms_norm_add(t, u, w)[0] * c).sum(),
                       lambda w, b, t, u, c: (F.rms_norm(t + u, (t.shape[-1],), w, 1e-6) * c).sum(), "bwd"),
    "layer_norm_add": (lambda w, b, t, u, c: sum((o * c).sum() for o in tn.layer_norm_add(t, u, w, b)),
                       lambda w, b, t, u, c: ((F.layer_norm(t + u, (t.shape[-1],), w, b, 1e-5) + t + u) * c).sum(),
                       "bwd_add"),
}


@pytest.mark.parametrize("op", _PER_SAMPLE_OPS)
@pytest.mark.parametrize("dtype, shape, x_dim", ((torch.float32, (5, 3, 1000), 0), (torch.bfloat16, (4, 7, 64), 1),
                                                 (torch.float32, (6, 256), 0)), ids=("fp32", "bf16-dim1", "one-row"))
def test_per_sample_gradients_are_one_backward_call(op, dtype, shape, x_dim, monkeypatch, gen):
    """vmap(grad) over a batch of x with shared weights: the forward and the backward are one
    kernel call each over the whole batch (not one a sample), and each sample's weight gradients
    are its own, against torch's norms in float64 (fp32 weights with a bf16 x: the gradients
    keep each input's dtype). x is batched along ``x_dim``; the last case is one row a sample."""
    from torch.func import grad, vmap
    ours, theirs, stage = _PER_SAMPLE_OPS[op]
    x, u, c = (rand(gen, shape, dtype, offset=1.0) for _ in range(3))
    if x_dim:
        x = x.movedim(0, x_dim).contiguous()
    w, b = torch.randn(shape[-1], generator=gen), torch.randn(shape[-1], generator=gen)
    spy = Spy(monkeypatch)
    dims = (None, None, x_dim, 0, 0)
    got = vmap(grad(ours, argnums=(0, 1, 2, 3)), in_dims=dims)(w, b, x, u, c)
    assert [k.key.stage for k, _ in spy.calls] == [spy.calls[0][0].key.stage, stage], "not one call each way"
    want = vmap(grad(theirs, argnums=(0, 1, 2, 3)), in_dims=dims)(*(a.double() for a in (w, b, x, u, c)))
    for name, g, e, a in zip(("dw", "db", "dx", "du"), got, want, (w, b, x, u)):
        assert g.dtype == a.dtype, name
        assert_close(f"{op} {name}", g, e, dtype=dtype)  # zeros where the loss does not use it


@pytest.mark.parametrize("shape", ((0, 3, 64), (4, 0, 64), (0, 64)), ids=("no-samples", "no-rows", "no-samples-1d"))
def test_per_sample_gradients_of_empty_batches(shape):
    """A batch of no samples, or samples of no rows: torch's shapes, zero weight gradients (the
    folded call's rows a sample come from x's shape, not from dividing a total of none)."""
    from torch.func import grad, vmap
    x, w, b = torch.randn(shape), torch.randn(64), torch.randn(64)
    dw, dx = vmap(grad(lambda w, t: tn.layer_norm_add(t, t, w, b)[0].pow(2).sum(), argnums=(0, 1)),
                  in_dims=(None, 0))(w, x)
    assert (dw.shape, dx.shape) == ((shape[0], 64), shape) and not dw.any()
    assert vmap(lambda t: tn.rms_norm(t, w))(x).shape == shape


def test_grad_vjp_jacrev_and_functional_call_match_torch(gen):
    from torch.func import functional_call, grad, jacrev, vjp
    x, r, w, b = _func_case(gen, (5, 32))
    assert_close("jacrev", jacrev(lambda t: tn.rms_norm(t, w))(x[0]),
                 jacrev(lambda t: F.rms_norm(t, (32,), w, 1e-6))(x[0]))
    # only h of an add-norm used, then only y: the unused output's gradient is missing, not zeros
    assert_close("h only", grad(lambda t: tn.rms_norm_add(t, r, w)[1].pow(2).sum())(x), 2 * (x + r))
    assert_close("y only", grad(lambda t: tn.rms_norm_add(t, r, w)[0].sin().sum())(x),
                 grad(lambda t: F.rms_norm(t + r, (32,), w, 1e-6).sin().sum())(x))
    ct = rand(gen, (5, 32), F64)
    (_, pull), (_, pull_ref) = vjp(lambda t: tn.layer_norm(t, w, b), x), vjp(lambda t: F.layer_norm(t, (32,), w, b), x)
    assert_close("vjp", pull(ct)[0], pull_ref(ct)[0])
    m = tn.LayerNorm(32, dtype=F64)
    params = {"weight": w, "bias": b}
    got = grad(lambda p: functional_call(m, p, (x,)).pow(3).sum())(params)
    want = grad(lambda p: F.layer_norm(x, (32,), p["weight"], p["bias"]).pow(3).sum())(params)
    for k in params:
        assert_close(k, got[k], want[k])


def test_vmap_of_fp8_ops_and_a_float32_norm_against_float64(gen):
    """amax is each sample's own under vmap; a float32 norm under vmap against float64."""
    from torch.func import vmap
    x = rand(gen, (3, 4, 128), offset=1.0)
    w = torch.randn(128, generator=gen)
    y8, amax = vmap(lambda t: tn.rms_norm_fp8(t, w, 2.0))(x)
    want = [tn.rms_norm_fp8(t, w, 2.0) for t in x]
    assert torch.equal(y8.view(torch.uint8), torch.stack([v[0] for v in want]).view(torch.uint8))
    assert torch.equal(amax, torch.stack([v[1] for v in want]))
    assert len(set(amax.flatten().tolist())) == 3
    y8, h, amax = vmap(lambda t: tn.layer_norm_add_fp8(t, t, w, None, 2.0))(x)
    assert torch.equal(h, 2 * x) and amax.shape == (3, 1)
    assert_close("y", vmap(lambda t: tn.rms_norm(t, w))(x), F.rms_norm(x.double(), (128,), w.double(), 1e-6),
                 dtype=torch.float32)


def test_transforms_that_are_not_supported_say_so(gen):
    from torch.func import grad, hessian, jvp
    x, _, w, _ = _func_case(gen, (4, 16))
    with pytest.raises(RuntimeError, match="rms_norm_fp8 is forward-only"):
        grad(lambda t: tn.rms_norm_fp8(t.float(), None, 2.0)[0].float().sum())(x)
    with pytest.raises(RuntimeError, match="layer_norm_add_fp8 is forward-only"):
        jvp(lambda t: tn.layer_norm_add_fp8(t.float(), t.float(), None, None, 2.0)[1], (x,), (x,))
    with pytest.raises(RuntimeError, match="not differentiable"):
        grad(lambda t: grad(lambda u: tn.rms_norm(u, w).pow(2).sum())(t).sum())(x)
    with pytest.raises(RuntimeError, match="not differentiable"):  # forward over reverse
        hessian(lambda t: tn.layer_norm(t, w, None).pow(2).sum())(x[0])
    from torch._vmap_internals import vmap as legacy_vmap
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "Please use torch.vmap"
        with pytest.raises(TypeError, match="rms_norm: x is a tensor without storage .* use torch.func.vmap"):
            legacy_vmap(lambda t: tn.rms_norm(t, w))(x)


_FORWARD_MODE_OPS = {  # op -> (ours, torch's) of (x, residual, w, b)
    "rms_norm": (lambda x, r, w, b: tn.rms_norm(x, w), lambda x, r, w, b: F.rms_norm(x, (x.shape[-1],), w, 1e-6)),
    "rms_norm zc": (lambda x, r, w, b: tn.rms_norm(x, w, zero_centered_gamma=True),
                    lambda x, r, w, b: F.rms_norm(x, (x.shape[-1],), w + 1, 1e-6)),
    "layer_norm": (lambda x, r, w, b: tn.layer_norm(x, w, b),
                   lambda x, r, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)),
    "rms_norm_add": (lambda x, r, w, b: tn.rms_norm_add(x, r, w),
                     lambda x, r, w, b: (F.rms_norm(x + r, (x.shape[-1],), w, 1e-6), x + r)),
    "layer_norm_add zc": (lambda x, r, w, b: tn.layer_norm_add(x, r, w, b, zero_centered_gamma=True),
                          lambda x, r, w, b: (F.layer_norm(x + r, (x.shape[-1],), w + 1, b, 1e-5), x + r)),
}


@pytest.mark.parametrize("op", _FORWARD_MODE_OPS)
def test_forward_mode_matches_torch(op, gen):
    """jvp (torch.func's, and forward_ad's dual tensors, which the kernels alone passed through
    with the tangent dropped) and jacfwd against torch's norms in float64, tangents on every
    input, then on the weight alone; the kernels give the primal."""
    import torch.autograd.forward_ad as fwAD
    from torch.func import jacfwd, jvp
    ours, theirs = _FORWARD_MODE_OPS[op]
    primals, tangents = _func_case(gen, (3, 5, 96)), _func_case(gen, (3, 5, 96))
    as_tuple = lambda v: v if isinstance(v, tuple) else (v,)  # noqa: E731
    (y, t), (y_ref, t_ref) = (jvp(f, primals, tangents) for f in (ours, theirs))
    for name, got, want in zip(("y", "h"), as_tuple(y), as_tuple(y_ref)):
        assert_close(f"{op} {name}", got, want)
    for name, got, want in zip(("y tangent", "h tangent"), as_tuple(t), as_tuple(t_ref)):
        assert_close(f"{op} {name}", got, want)
    with fwAD.dual_level():
        duals = [fwAD.make_dual(p, d) for p, d in zip(primals, tangents)]
        for got, want in zip(as_tuple(ours(*duals)), as_tuple(t_ref)):
            assert_close(f"{op} dual tangent", fwAD.unpack_dual(got).tangent, want)
    x, r, w, b = primals
    t_w = jvp(lambda u: ours(x, r, u, b), (w,), (tangents[2],))[1]
    assert_close(f"{op} weight's tangent", as_tuple(t_w)[0],
                 as_tuple(jvp(lambda u: theirs(x, r, u, b), (w,), (tangents[2],))[1])[0])
    row = lambda f: lambda u: as_tuple(f(u, r[0, 0], w, b))[0]  # noqa: E731
    assert_close(f"{op} jacfwd", jacfwd(row(ours))(x[0, 0]), jacfwd(row(theirs))(x[0, 0]))


def test_forward_mode_keeps_each_outputs_dtype(gen):
    """A bf16 x with fp32 weights and an fp32 y: the tangent has y's dtype (h's, x's), and is
    close to torch's in float64 at bf16 tolerance."""
    from torch.func import jvp
    x, tx = rand(gen, (6, 200), torch.bfloat16, offset=1.0), rand(gen, (6, 200), torch.bfloat16)
    w = 1 + 0.5 * torch.randn(200, generator=gen)
    (y, h), (ty, th) = jvp(lambda t: tn.rms_norm_add(t, t, w, out_dtype=torch.float32), (x,), (tx,))
    assert (y.dtype, ty.dtype, h.dtype, th.dtype) == (torch.float32, torch.float32, torch.bfloat16, torch.bfloat16)
    want = jvp(lambda t: F.rms_norm(2 * t, (200,), w.double(), 1e-6), (x.double(),), (tx.double(),))[1]
    assert_close("y tangent", ty, want, dtype=torch.bfloat16)
    assert torch.equal(th, (2 * tx).to(torch.bfloat16))


# ---------------------------------------------------------------------------------------------
# modules


@pytest.mark.parametrize("kind", ("rms", "ln", "ln-nobias"))
def test_module_state_dict_and_outputs_match_torch(kind, gen):
    if kind == "rms":
        ref, ours = torch.nn.RMSNorm(128, eps=1e-6), tn.RMSNorm(128, eps=1e-6)
    else:
        bias = kind == "ln"
        ref, ours = torch.nn.LayerNorm(128, bias=bias), tn.LayerNorm(128, bias=bias)
    assert isinstance(ours, type(ref))
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    assert ours.state_dict().keys() == ref.state_dict().keys()
    ours.load_state_dict(ref.state_dict())
    x = rand(gen, (2, 3, 128), offset=1.0)
    torch.testing.assert_close(ours(x), ref(x))
    ours(x).sum().backward()
    ref(x).sum().backward()
    for (n, a), b in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=n)


def test_module_defaults_match_torch(gen):
    """eps=None in RMSNorm is finfo(x.dtype).eps as in torch; no affine; multi-dim shapes."""
    x = rand(gen, (3, 4, 128)) * 1e-4  # small enough that eps matters
    torch.testing.assert_close(tn.RMSNorm(128)(x), torch.nn.RMSNorm(128)(x))
    for ours, ref in ((tn.RMSNorm(128, elementwise_affine=False), torch.nn.RMSNorm(128, elementwise_affine=False)),
                      (tn.LayerNorm(128, elementwise_affine=False), torch.nn.LayerNorm(128, elementwise_affine=False))):
        assert ours.weight is None and len(ours.state_dict()) == 0
        xi = x.clone().requires_grad_()
        y = ours(xi)
        y.sum().backward()
        torch.testing.assert_close(y, ref(x))
        assert xi.grad is not None
    y2 = x.view(3, 4, 8, 16)
    torch.testing.assert_close(tn.LayerNorm((8, 16))(y2), torch.nn.LayerNorm((8, 16))(y2))
    with pytest.raises(ValueError, match=r"trailing shape \[128\]"):
        tn.RMSNorm(128)(torch.randn(3, 64))


def test_module_zero_centered_gamma(gen):
    m = tn.LayerNorm(128, zero_centered_gamma=True, dtype=torch.bfloat16)
    assert torch.equal(m.weight, torch.zeros(128, dtype=torch.bfloat16)) and m.weight.dtype == torch.bfloat16
    assert "zero_centered_gamma=True" in repr(m)
    r = tn.RMSNorm(128, zero_centered_gamma=True, elementwise_affine=False)
    x = rand(gen, (4, 128))
    torch.testing.assert_close(r(x), F.rms_norm(x, (128,), eps=torch.finfo(torch.float32).eps))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Linear(128, 128)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.RMSNorm(128, eps=1e-6), torch.nn.Linear(128, 128)) for _ in range(2))
        self.final = torch.nn.LayerNorm(128)
        self.plain = torch.nn.LayerNorm(128, elementwise_affine=False)
        self.shared = self.final

    def forward(self, x):
        x = self.emb(x)
        for b in self.blocks:
            x = x + b(x)
        return self.plain(self.shared(x))


def test_patch_norms(gen):
    torch.manual_seed(0)
    model = Model().to(torch.bfloat16)
    model.eval()
    x = rand(gen, (2, 3, 128), torch.bfloat16)
    with torch.no_grad():
        model.final.bias.normal_(generator=gen)
        want = model(x)
    weights = {n: p for n, p in model.named_parameters()}
    before = model.state_dict()
    assert tn.patch_norms(model) is model
    assert type(model.blocks[0][0]) is tn.RMSNorm and type(model.final) is tn.LayerNorm
    assert type(model.plain) is tn.LayerNorm and model.shared is model.final
    assert model.blocks[1][0].eps == 1e-6 and not model.final.training
    assert {n: p for n, p in model.named_parameters()} == weights  # the same Parameter objects
    assert model.final.weight.dtype == torch.bfloat16
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    with torch.no_grad():
        got = model(x)
    assert_close("patched model", got, want.double(), torch.bfloat16, rtol=2 ** -6, atol=2e-2)
    # idempotent, and a bare norm is returned replaced
    assert tn.patch_norms(model) is model
    assert type(tn.patch_norms(torch.nn.LayerNorm(7))) is tn.LayerNorm


def test_patch_norms_leaves_subclasses(gen):
    class MyNorm(torch.nn.LayerNorm):
        def forward(self, x):
            return super().forward(x) * 2

    seq = torch.nn.Sequential(MyNorm(128))
    tn.patch_norms(seq)
    assert type(seq[0]) is MyNorm


# ---------------------------------------------------------------------------------------------
# targets and the fallback warning


def test_fallback_warning_once_and_silenced(gen):
    # keys used by no other test, so the registry has not warned for them yet
    x, w = rand(gen, (2, 3)), torch.randn(3, generator=gen)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        tn.rms_norm(x, w, zero_centered_gamma=True)
        tn.rms_norm(x, w, zero_centered_gamma=True)
    fallback = [r for r in rec if issubclass(r.category, tvmnorm.FallbackWarning)]
    if _host._KERNELS and all(k.tuned for k in _host._KERNELS.values() if k.key.hidden_size == 3):
        pytest.skip("a tuned library serves this key")
    assert len(fallback) == 1, [str(r.message) for r in rec]
    assert "Falling back to general normalization kernel" in str(fallback[0].message)
    assert "hidden_size=3" in str(fallback[0].message)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=tvmnorm.FallbackWarning)
        tn.layer_norm(x, w, None, zero_centered_gamma=True)
    assert not [r for r in rec if issubclass(r.category, tvmnorm.FallbackWarning)]


def test_kernel_lookup_is_cached():
    x, w = torch.randn(2, 128), torch.randn(128)
    tn.rms_norm(x, w)
    k = _host.kernel("rmsnorm", "fwd", torch.float32, torch.float32, torch.float32, 128, False, x.is_cuda)
    assert k is _host.kernel("rmsnorm", "fwd", torch.float32, torch.float32, torch.float32, 128, False, x.is_cuda)
    assert k.kind == "llvm" and k.key.hidden_size == 128 and k.key.ctype == "fp32"


def test_cuda_alignment_rule():
    """The pointer alignment the CUDA path demands: the widest power of two <= 16 dividing a
    row's bytes (so a row slice of an aligned tensor always passes)."""
    assert _host._alignment(4096, 2) == 16
    assert _host._alignment(7, 2) == 2
    assert _host._alignment(7, 4) == 4
    assert _host._alignment(1, 1) == 1
    assert _host._alignment(12, 2) == 8
    for hidden in (1, 7, 12, 1000, 4096):
        for size in (1, 2, 4, 8):
            a = _host._alignment(hidden, size)
            assert (hidden * size) % a == 0 and a <= 16 and a == 2 ** int(math.log2(a))


def test_the_readmes_pytorch_example_runs():
    """The first code block of the README's PyTorch section, run as it stands (on the CPU): its
    residual-add lines used a `residual` it never defined."""
    import re
    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    section = readme[readme.index("\n## PyTorch\n"):]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tvmnorm.FallbackWarning)
        scope = {}
        exec(compile(example, "README.md (PyTorch)", "exec"), scope)
    assert scope["y8"].dtype == torch.float8_e4m3fn and scope["h"].shape == scope["x"].shape


FORKED_CHILDREN = """
import faulthandler, multiprocessing, warnings
import torch
import tvmnorm.torch as tn
warnings.simplefilter("ignore")
x, w = torch.randn(512, 1024), torch.randn(1024)
want = tn.rms_norm(x, w), tn.layer_norm(x, w, None)  # the parent's pool runs first

def child(q):
    faulthandler.dump_traceback_later(60, exit=True)  # a hang ends the child, with its stack
    q.put(torch.equal(tn.rms_norm(x, w), want[0]) and torch.equal(tn.layer_norm(x, w, None), want[1]))

ctx = multiprocessing.get_context("fork")
q = ctx.Queue()
children = [ctx.Process(target=child, args=(q,)) for _ in range(3)]
for p in children:
    p.start()
print("ok", sum(q.get(timeout=120) for _ in children), torch.equal(tn.rms_norm(x, w), want[0]))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX's")
def test_forked_children_run_cpu_kernels_after_their_parent_did():
    """TVM's CPU thread pool is not rebuilt in a forked child: after the parent had run a CPU
    kernel, a fork's first one (a DataLoader worker's, say) waited forever on worker threads the
    child does not have. _tvm sets TVM's concurrency to one in every forked child, where the
    kernels run on the calling thread; the parent keeps its pool."""
    import subprocess
    import sys
    res = subprocess.run([sys.executable, "-c", FORKED_CHILDREN], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.split() == ["ok", "3", "True"], res.stderr[-3000:]
