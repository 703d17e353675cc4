"""tvmnorm.torch on CUDA: the CPU comparisons of test_torch.py on the GPU, plus what only CUDA
has (streams, pointer alignment, device placement). Skipped cleanly without a CUDA device.

Run on a GPU machine with ``python -m pytest -q -m gpu tests/test_torch_gpu.py``.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.filterwarnings("ignore::tvmnorm.runtime.FallbackWarning"),
]

from conftest import captured  # noqa: E402
import tvmnorm.torch as tn  # noqa: E402
from tvmnorm.torch import _host  # noqa: E402
from test_torch import (DTYPES, HIDDENS, Block, Model, Spy, assert_close, check_add_norm,  # noqa: E402
                        check_fp8, check_fwd_bwd, fp8_reference, fused_qkv_heads, rand, run)

DEV = "cuda"


@pytest.fixture
def gen(request):
    import zlib
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


# rows: one, a few, and enough that every CUDA dgamma partial row gets several rows
@pytest.mark.parametrize("lead", [(1,), (3, 7), (2, 1500)], ids=["1", "3x7", "2x1500"])
@pytest.mark.parametrize("hidden", HIDDENS + (8192,))
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_matches_torch_cuda(norm, dtype, hidden, lead, gen):
    dt = DTYPES[dtype]
    x = rand(gen, lead + (hidden,), dt, offset=2.0, requires_grad=True, device=DEV)
    w = (1 + 0.5 * torch.randn(hidden, generator=gen)).to(DEV, dt).requires_grad_()
    b = ((0.5 * torch.randn(hidden, generator=gen)).to(DEV, dt).requires_grad_()
         if norm == "layernorm" else None)
    check_fwd_bwd(norm, x, w, b, 1e-5, gen)


@pytest.mark.parametrize("types", [(torch.bfloat16, torch.float32, None), (torch.float16, torch.bfloat16, None),
                                   (torch.bfloat16, torch.float32, torch.float32)],
                         ids=["xbf16-wfp32", "xfp16-wbf16", "xbf16-wfp32-ofp32"])
@pytest.mark.parametrize("zc", (False, True))
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_mixed_dtypes_cuda(norm, zc, types, gen):
    xdt, wdt, odt = types
    x = rand(gen, (4, 33, 1000), xdt, offset=1.0, requires_grad=True, device=DEV)
    w = ((0.0 if zc else 1.0) + 0.5 * torch.randn(1000, generator=gen)).to(DEV, wdt).requires_grad_()
    b = (0.5 * torch.randn(1000, generator=gen)).to(DEV, wdt).requires_grad_() if norm == "layernorm" else None
    check_fwd_bwd(norm, x, w, b, 1e-6, gen, zc=zc, out_dtype=odt)


@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_gradcheck_fp64_cuda(norm, gen):
    x = rand(gen, (2, 3, 7), torch.float64, offset=1.0, requires_grad=True, device=DEV)
    w = torch.randn(7, generator=gen, dtype=torch.float64).to(DEV).requires_grad_()
    b = torch.randn(7, generator=gen, dtype=torch.float64).to(DEV).requires_grad_()
    if norm == "rmsnorm":
        assert torch.autograd.gradcheck(lambda x, w: tn.rms_norm(x, w), (x, w))
    else:
        assert torch.autograd.gradcheck(lambda x, w, b: tn.layer_norm(x, w, b), (x, w, b))


@pytest.mark.parametrize("fp8_dtype", (torch.float8_e4m3fn, torch.float8_e5m2), ids=("e4m3", "e5m2"))
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_fp8_output_cuda(norm, fp8_dtype, gen):
    x = rand(gen, (5, 300, 4096), torch.bfloat16, offset=1.0, device=DEV)
    w = (1 + 0.5 * torch.randn(4096, generator=gen)).to(DEV, torch.bfloat16)
    b = (0.5 * torch.randn(4096, generator=gen)).to(DEV, torch.bfloat16)
    scale = torch.tensor([3.0], device=DEV)
    if norm == "rmsnorm":
        y8, amax = tn.rms_norm_fp8(x, w, scale, 1e-6, fp8_dtype=fp8_dtype)
    else:
        y8, amax = tn.layer_norm_fp8(x, w, b, scale, 1e-5, fp8_dtype=fp8_dtype)
    q, amax_ref = fp8_reference(norm, x, w, b, 3.0, fp8_dtype, 1e-6 if norm == "rmsnorm" else 1e-5)
    assert y8.device.type == "cuda" and y8.dtype == fp8_dtype and amax.shape == (1,)
    assert_close("amax", amax, amax_ref.reshape(1), torch.float32, rtol=1e-5, atol=0)
    step = 2.0 ** -(3 if fp8_dtype == torch.float8_e4m3fn else 2)
    assert_close("y_fp8", y8.double(), q.double(), torch.float32, rtol=step, atol=0.02)
    assert (y8.double() == q.double()).float().mean() > 0.95


@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_empty_and_nonfinite_cuda(norm, gen):
    x = torch.randn(0, 128, device=DEV, requires_grad=True)
    w = torch.randn(128, device=DEV, requires_grad=True)
    b = torch.randn(128, device=DEV, requires_grad=True)
    y = run(norm, x, w, b if norm == "layernorm" else None, 1e-5)
    y.sum().backward()
    assert y.shape == (0, 128) and torch.equal(w.grad, torch.zeros_like(w))
    y8, amax = tn.rms_norm_fp8(x, w, 1.0)
    assert y8.shape == (0, 128) and amax.item() == 0.0
    xs = rand(gen, (4, 128), device=DEV)
    xs[0, 3], xs[1, 2] = float("nan"), float("inf")
    ours = run(norm, xs, w.detach(), b.detach(), 1e-5)
    theirs = (F.rms_norm(xs, (128,), w.detach(), 1e-5) if norm == "rmsnorm"
              else F.layer_norm(xs, (128,), w.detach(), b.detach(), 1e-5))
    assert torch.equal(ours.isnan(), theirs.isnan())
    torch.testing.assert_close(ours[theirs.isfinite()], theirs[theirs.isfinite()])
    torch.cuda.synchronize()


def test_zero_copy_cuda(monkeypatch, gen):
    spy = Spy(monkeypatch)
    big = rand(gen, (10, 4, 1024), torch.bfloat16, device=DEV)
    x = big[2:7].requires_grad_()
    w = torch.randn(1024, generator=gen).to(DEV, torch.bfloat16).requires_grad_()
    y = tn.rms_norm(x, w)
    (k, ptrs), = spy.calls
    assert k.kind == "cuda"
    assert ptrs[0] == x.data_ptr() and ptrs[1] == w.data_ptr() and ptrs[2] == y.data_ptr()
    y.backward(torch.ones_like(y))
    assert spy.calls[1][1][1] == x.data_ptr()


def test_non_default_stream(gen):
    """The kernels run on torch's current stream: if they ran on any other stream, they would
    read x before the copy queued behind a long sleep on ``s`` and normalize zeros."""
    x_src = rand(gen, (64, 4096), torch.bfloat16, device=DEV)
    w = (1 + 0.5 * torch.randn(4096, generator=gen)).to(DEV, torch.bfloat16)
    want = F.rms_norm(x_src.double(), (4096,), w.double(), 1e-6)
    tn.rms_norm(x_src, w)  # compile and load outside the timed region
    x = torch.zeros_like(x_src)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    assert s != torch.cuda.default_stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time queued on s
        x.copy_(x_src)
        y = tn.rms_norm(x, w)
        y8, amax = tn.rms_norm_fp8(x, w, 1.0)
        xg = x.clone().requires_grad_()
        wg = w.clone().requires_grad_()
        yg = tn.rms_norm(xg, wg)
        yg.backward(torch.ones_like(yg))
    s.synchronize()
    assert_close("y on stream", y, want)
    assert_close("amax on stream", amax, want.abs().max().reshape(1), torch.float32, rtol=1e-5, atol=0)
    assert yg.abs().max() > 0 and wg.grad.abs().max() > 0


def test_alignment_cuda(gen):
    w = torch.ones(128, device=DEV)
    flat = torch.randn(4 * 128 + 1, device=DEV)
    x = flat[1:].view(4, 128)  # 4 bytes off a 16-byte boundary
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        tn.rms_norm(x, w)
    torch.testing.assert_close(tn.rms_norm(x.clone(), w), F.rms_norm(x, (128,), w, 1e-6))
    # a row slice with rows of 14 bytes only needs 2-byte alignment: accepted, no copy
    big = rand(gen, (9, 7), torch.float16, device=DEV)
    w7 = torch.randn(7, generator=gen).to(DEV, torch.float16)
    xs = big[1:]
    assert_close("row slice", tn.rms_norm(xs, w7), F.rms_norm(xs.double(), (7,), w7.double(), 1e-6))
    # a misaligned weight is one row: copied, not refused
    wflat = torch.randn(129, device=DEV)
    torch.testing.assert_close(tn.rms_norm(x.clone(), wflat[1:]), F.rms_norm(x, (128,), wflat[1:], 1e-6))


@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
@pytest.mark.parametrize("dtype,hidden,width,offset,lead", [
    (torch.bfloat16, 128, 384, 0, (2, 5)), (torch.bfloat16, 1000, 1008, 8, (7,)),
    (torch.bfloat16, 4096, 3 * 4096, 4096, (2, 33)), (torch.bfloat16, 7168, 7168 + 64, 0, (4097,)),
    (torch.float32, 1000, 1004, 4, (3, 700)), (torch.float16, 4095, 4100, 0, (64,))],
    ids=["bf16-128-qkv", "bf16-1000", "bf16-4096-qkv", "bf16-7168-4097rows", "fp32-1000", "fp16-4095"])
def test_strided_rows_cuda(norm, dtype, hidden, width, offset, lead, gen):
    """x[..., offset:offset + hidden] of a wider tensor on the GPU: the kernels for strided rows
    (their vector loads written as PTX loads, _tvm.STRIDED_ROWS), right against float64 at
    decode and training rows (the backward's decode pair, its dx at T = 8, its own T)."""
    x = rand(gen, (*lead, width), dtype, offset=2.0, device=DEV)[..., offset:offset + hidden].requires_grad_()
    assert not x.is_contiguous()
    w = (1 + 0.5 * torch.randn(hidden, generator=gen)).to(DEV, dtype).requires_grad_()
    b = (0.5 * torch.randn(hidden, generator=gen)).to(DEV, dtype).requires_grad_() if norm == "layernorm" else None
    check_fwd_bwd(norm, x, w, b, 1e-5, gen)


def test_strided_rows_misaligned_cuda(gen):
    """Rows whose stride breaks the vector loads' alignment are refused with the stride named."""
    w = torch.ones(1000, device=DEV, dtype=torch.bfloat16)
    x = rand(gen, (4, 1003), torch.bfloat16, device=DEV)[:, :1000]
    with pytest.raises(ValueError, match=r"rows lie 1003 elements apart \(strides \(1003, 1\)\), not a multiple of 16"):
        tn.rms_norm(x, w)
    torch.testing.assert_close(tn.rms_norm(x.contiguous(), w), F.rms_norm(x, (1000,), w, 1e-6))
    # per-head rows (4 of 5 heads a token): the head stride (1003) breaks it, the token stride
    # (5015) too; 4 of 4 heads would be rows 1003 apart, one stride (above)
    heads = rand(gen, (3, 5, 1003), torch.bfloat16, device=DEV)[:, :4, :1000]
    assert _host.row_groups(heads, 1000) == ((3, 5015), (4, 1003))
    with pytest.raises(ValueError, match=r"rows lie 5015, 1003 elements apart"):
        tn.rms_norm(heads, w)


@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
@pytest.mark.parametrize("dtype,lead,heads,kv_heads,head_dim,part,pad", [
    (torch.bfloat16, (1,), 32, 8, 128, "q", 0), (torch.bfloat16, (8,), 32, 8, 128, "k", 0),
    (torch.bfloat16, (2, 2049), 16, 4, 128, "q", 8), (torch.bfloat16, (4097,), 8, 8, 128, "k", 0),
    (torch.float16, (64,), 5, 1, 1000, "q", 8), (torch.float32, (300,), 4, 2, 96, "k", 4)],
    ids=["bf16-decode1-q32", "bf16-decode8-k8", "bf16-4098x16-q", "bf16-4097x8-k", "fp16-64x5x1000", "fp32-300x2x96"])
def test_per_head_rows_cuda(norm, dtype, lead, heads, kv_heads, head_dim, part, pad, gen):
    """Per-head q or k of a fused qkv on the GPU (rows tokens x heads at two strides): the
    kernels for per-head rows, right against float64 at decode and training rows (the
    backward's decode pair, its dx at T = 8, its own T), the qkv NaN-padded around the part."""
    x = fused_qkv_heads(gen, dtype, lead, heads, kv_heads, head_dim, part, pad, device=DEV).requires_grad_()
    # one token's heads are adjacent rows: compact, the compact kernels serve them
    assert len(_host.row_groups(x, head_dim)) == (2 if math.prod(lead) > 1 else 1)
    w = (1 + 0.5 * torch.randn(head_dim, generator=gen)).to(DEV, dtype).requires_grad_()
    b = (0.5 * torch.randn(head_dim, generator=gen)).to(DEV, dtype).requires_grad_() if norm == "layernorm" else None
    check_fwd_bwd(norm, x, w, b, 1e-5, gen)


@pytest.mark.parametrize("lead", [(1,), (3, 7), (2, 1500)], ids=["1", "3x7", "2x1500"])
@pytest.mark.parametrize("hidden", (128, 1000, 4096, 7168))
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_add_norm_cuda(norm, dtype, hidden, lead, gen):
    """Residual add + norm on the GPU: y and h, and the backward's bwd_add kernel (h's gradient
    added into dx: the decode backward at 1 and 21 rows, the dx at its own T at 3000), right
    against float64."""
    dt = DTYPES[dtype]
    x = rand(gen, lead + (hidden,), dt, offset=2.0, requires_grad=True, device=DEV)
    r = rand(gen, lead + (hidden,), dt, requires_grad=True, device=DEV)
    w = (1 + 0.5 * torch.randn(hidden, generator=gen)).to(DEV, dt).requires_grad_()
    b = (0.5 * torch.randn(hidden, generator=gen)).to(DEV, dt).requires_grad_() if norm == "layernorm" else None
    check_add_norm(norm, x, r, w, b, 1e-5, gen)


@pytest.mark.parametrize("lead", [(1,), (5, 300)], ids=["1", "5x300"])
@pytest.mark.parametrize("hidden,wide", [(4096, 0), (1000, 0), (7168, 512)], ids=["4096", "1000", "7168-strided"])
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
def test_add_norm_fp8_cuda(norm, hidden, wide, lead, gen):
    """Residual add + norm with fp8 output (the fwd_add kernel with scale and amax): h bit for
    bit torch's add, y8 and amax against float64 of h's norm; odd width and strided x."""
    x = rand(gen, lead + (hidden + wide,), torch.bfloat16, offset=1.0, device=DEV)[..., wide:]
    r = rand(gen, lead + (hidden,), torch.bfloat16, device=DEV)
    w = (1 + 0.5 * torch.randn(hidden, generator=gen)).to(DEV, torch.bfloat16)
    b = (0.5 * torch.randn(hidden, generator=gen)).to(DEV, torch.bfloat16)
    scale = torch.tensor([3.0], device=DEV)
    if norm == "rmsnorm":
        y8, h, amax = tn.rms_norm_add_fp8(x, r, w, scale, 1e-6)
    else:
        y8, h, amax = tn.layer_norm_add_fp8(x, r, w, b, scale, 1e-5)
    assert torch.equal(h, x + r) and y8.device.type == "cuda"
    check_fp8(norm, h.cpu(), w.cpu(), b.cpu(), y8.cpu(), amax.cpu(), torch.float8_e4m3fn,
              1e-6 if norm == "rmsnorm" else 1e-5)


@pytest.mark.parametrize("layout", ("strided", "heads"))
def test_x_layout_fp8_cuda(layout, gen):
    """fp8 output of strided rows (x[..., 256:4352] of rows of 4608) and of per-head q (33 tokens
    x 16 heads of a fused qkv): the bits and amax against float64."""
    if layout == "heads":
        x = fused_qkv_heads(gen, torch.bfloat16, (33,), 16, 4, 128, "q", 8, device=DEV)
    else:
        x = rand(gen, (3, 4, 4096 + 512), torch.bfloat16, offset=1.0, device=DEV)[..., 256:256 + 4096]
    w = (1 + 0.5 * torch.randn(x.shape[-1], generator=gen)).to(DEV, torch.bfloat16)
    y8, amax = tn.rms_norm_fp8(x, w, torch.tensor([3.0], device=DEV), 1e-6, fp8_dtype=torch.float8_e4m3fn)
    q, amax_ref = fp8_reference("rmsnorm", x.cpu(), w.cpu(), None, 3.0, torch.float8_e4m3fn, 1e-6)
    assert_close("amax", amax.cpu(), amax_ref.reshape(1), torch.float32, rtol=1e-5, atol=0)
    assert (y8.cpu().double() == q.double()).float().mean() > 0.95


def test_device_mismatch_cuda():
    x = torch.randn(4, 128, device=DEV)
    with pytest.raises(ValueError, match="x is on cuda:0 but weight is on cpu"):
        tn.rms_norm(x, torch.ones(128))
    with pytest.raises(ValueError, match="but scale is on cpu"):
        tn.rms_norm_fp8(x, torch.ones(128, device=DEV), torch.ones(1))


@pytest.mark.multigpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_device_mismatch_between_gpus():
    x = torch.randn(4, 128, device="cuda:0")
    with pytest.raises(ValueError, match="x is on cuda:0 but weight is on cuda:1"):
        tn.rms_norm(x, torch.ones(128, device="cuda:1"))


@pytest.mark.multigpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device(gen):
    x = rand(gen, (8, 1024), torch.bfloat16, device="cuda:1")
    w = torch.randn(1024, generator=gen).to("cuda:1", torch.bfloat16)
    y = tn.rms_norm(x, w)
    assert y.device == x.device
    assert_close("y on cuda:1", y, F.rms_norm(x.double(), (1024,), w.double(), 1e-6))


def test_compile_inductor_cuda(gen):
    torch.manual_seed(0)
    m = Block(128).to(DEV)
    x = rand(gen, (2, 5, 128), device=DEV)
    torch._dynamo.reset()
    cm = torch.compile(m, fullgraph=True)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye, yc = m(xe), cm(xc)
    torch.testing.assert_close(yc, ye, rtol=1e-4, atol=1e-4)
    ye.sum().backward()
    yc.sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-4, atol=1e-4)


def test_patch_norms_cuda(gen):
    torch.manual_seed(0)
    model = Model().to(DEV, torch.bfloat16).eval()
    x = rand(gen, (2, 3, 128), torch.bfloat16, device=DEV)
    with torch.no_grad():
        want = model(x)
        tn.patch_norms(model)
        got = model(x)
    assert type(model.final) is tn.LayerNorm and model.final.weight.device.type == "cuda"
    assert all(k.kind == "cuda" for t, k in _host._KERNELS.items() if t[-1])
    assert_close("patched model", got, want.double(), torch.bfloat16, rtol=2 ** -6, atol=2e-2)


# A decode loop without CUDA graphs pays each call's host time (bench/host_overhead.py): the
# ops must capture and replay, each replay computing on the data in the captured buffers.
@pytest.mark.parametrize("op", ("rms_norm", "layer_norm", "rms_norm_fp8"))
@pytest.mark.parametrize("shape", [(1, 32, 128), (8, 4096), (3, 1000)], ids=["qk32x128", "8x4096", "3x1000"])
def test_ops_replay_in_a_cuda_graph(op, shape, gen):
    hidden = shape[-1]
    x = rand(gen, shape, torch.bfloat16, offset=1.0, device=DEV)
    w = (1 + 0.5 * torch.randn(hidden, generator=gen)).to(DEV, torch.bfloat16)
    b = (0.5 * torch.randn(hidden, generator=gen)).to(DEV, torch.bfloat16)
    scale = torch.tensor([2.0], device=DEV)
    fns = {"rms_norm": lambda x: tn.rms_norm(x, w, 1e-6),
           "layer_norm": lambda x: tn.layer_norm(x, w, b, 1e-5),
           "rms_norm_fp8": lambda x: tn.rms_norm_fp8(x, w, scale, 1e-6)}
    graph, out = captured(fns[op], x)
    for i in range(3):
        x.copy_(rand(gen, shape, torch.bfloat16, offset=1.0, device=DEV))
        for t in (out if isinstance(out, tuple) else (out,)):  # poisoned: NaN (0x7f is e4m3's)
            (t.view(torch.uint8).fill_(0x7F) if t.element_size() == 1 else t.fill_(float("nan")))
        graph.replay()
        torch.cuda.synchronize()
        if op == "rms_norm_fp8":
            q, amax_ref = fp8_reference("rmsnorm", x, w, None, 2.0, torch.float8_e4m3fn, 1e-6)
            assert_close(f"replay {i} amax", out[1], amax_ref.reshape(1), torch.float32, rtol=1e-5, atol=0)
            assert_close(f"replay {i} y_fp8", out[0].double(), q.double(), torch.float32, rtol=2.0 ** -3, atol=0.02)
        else:
            want = (F.rms_norm(x.double(), (hidden,), w.double(), 1e-6) if op == "rms_norm"
                    else F.layer_norm(x.double(), (hidden,), w.double(), b.double(), 1e-5))
            assert_close(f"replay {i} y", out, want)


@pytest.mark.parametrize("kind", ("RMSNorm", "LayerNorm"))
def test_modules_train_in_graphed_callables(kind, gen):
    """torch.cuda.make_graphed_callables over a tvmnorm module: forward and backward each replay
    a captured graph (the backward's partial sums from the graph's pool); y and the gradients of
    x and the weights right against float64 on fresh data at each of three steps."""
    hidden, shape, eps = 1024, (4, 16, 1024), 1e-5
    m = getattr(tn, kind)(hidden, eps=eps, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        m.weight.copy_(1 + 0.5 * torch.randn(hidden, generator=gen))
        if kind == "LayerNorm":
            m.bias.copy_(0.5 * torch.randn(hidden, generator=gen))
    graphed = torch.cuda.make_graphed_callables(
        m, (rand(gen, shape, torch.bfloat16, offset=1.0, requires_grad=True, device=DEV),))
    norm, b = ("rmsnorm", None) if kind == "RMSNorm" else ("layernorm", m.bias)
    for _ in range(3):
        x = rand(gen, shape, torch.bfloat16, offset=1.0, requires_grad=True, device=DEV)
        check_fwd_bwd(norm, x, m.weight, b, eps, gen, fn=graphed)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=("fp32", "bf16"))
def test_per_sample_gradients_cuda(dtype, gen):
    """torch.func on CUDA tensors: vmap(grad) gives each sample's gradients (test_torch.py checks
    the transforms on the CPU against torch's norms in float64)."""
    from torch.func import grad, vmap
    x = rand(gen, (3, 5, 1000), dtype, offset=1.0, device=DEV)
    w = (1 + 0.5 * torch.randn(1000, generator=gen)).to(DEV, dtype)
    b = (0.5 * torch.randn(1000, generator=gen)).to(DEV, dtype)

    c = rand(gen, (3, 5, 1000), dtype, device=DEV)  # dy, exact in the dtype: the error is the kernels' own

    def loss(w, b, t, c):
        return (tn.layer_norm(t, w, b).float() * c.float()).sum()

    def reference(w, b, t, c):
        return (F.layer_norm(t, (1000,), w, b, 1e-5) * c).sum()
    got = vmap(grad(loss, argnums=(0, 1, 2)), in_dims=(None, None, 0, 0))(w, b, x, c)
    want = vmap(grad(reference, argnums=(0, 1, 2)), in_dims=(None, None, 0, 0))(w.double(), b.double(), x.double(),
                                                                                c.double())
    for name, g, e in zip(("dw", "db", "dx"), got, want):
        assert g.shape == e.shape and g.dtype == dtype
        assert_close(name, g, e)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=("fp32", "bf16"))
def test_forward_mode_cuda(dtype, gen):
    """torch.func.jvp on CUDA tensors: the kernels' primal and the tangent by torch ops, against
    torch's layer_norm_add in float64 (test_torch.py checks every norm on the CPU)."""
    from torch.func import jvp
    x, r, tx = (rand(gen, (3, 5, 1000), dtype, offset=1.0, device=DEV) for _ in range(3))
    w = (1 + 0.5 * torch.randn(1000, generator=gen)).to(DEV, dtype)
    b = (0.5 * torch.randn(1000, generator=gen)).to(DEV, dtype)
    (y, h), (ty, th) = jvp(lambda t: tn.layer_norm_add(t, r, w, b), (x,), (tx,))
    want = jvp(lambda t: F.layer_norm(t + r.double(), (1000,), w.double(), b.double(), 1e-5), (x.double(),),
               (tx.double(),))
    assert (y.dtype, ty.dtype, th.dtype) == (dtype, dtype, dtype)
    assert_close("y", y, want[0])
    assert_close("y tangent", ty, want[1])
    assert torch.equal(th, tx)
