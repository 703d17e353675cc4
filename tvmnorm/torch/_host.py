"""Host functions: torch tensors in, the runtime's kernels called over DLPack, torch tensors out.

This is the only layer of ``tvmnorm.torch`` that touches a kernel. The host functions take x
(and dy) row-contiguous in any leading shape, return outputs in that shape and hand the kernels
``[rows, hidden]`` views; ``ops.py`` does the checks' calls, the autograd and the
``torch.library`` registration on top.

What crosses into TVM, and why it is zero-copy:

- ``x`` is viewed as ``[rows, hidden]`` (``Tensor.view``, never ``.contiguous()``) and handed to
  the kernel as is; tvm-ffi wraps torch tensors through torch's DLPack exchange API without a
  copy. Outputs (y, mu, rsigma, dx, dgamma, dbeta, amax) are allocated here by torch.
- x's rows may lie at any stride, or per head at two: a view whose rows are padded, such as
  x[..., :hidden] of a wider tensor, runs the kernels built for strided rows, and per-head q or
  k of a fused qkv (qkv[..., :q_size].view(tokens, heads, head_dim)) those for per-head rows,
  handed a [tokens, heads, hidden] view (``x_operand``; ``get_kernel(..., layout)``: the
  library's record of the key, else the default schedule, JIT-compiled once a key), still
  without a copy. A layout beyond these (columns not
  adjacent, rows at three strides) is rejected with a ``ValueError`` that names the strides,
  rather than silently copied.
- gamma/beta are ``[hidden]`` and cheap, so a strided or misaligned weight is copied (it is one
  row, not an activation). The same holds for ``dy`` in the backward: autograd hands over
  whatever layout the next op produced (``y.sum().backward()`` gives a stride-0 expand), and the
  torch reference kernels copy it too.
- On CUDA the kernels run on torch's current stream: tvm-ffi sets TVM's stream from the torch
  tensors' DLPack exchange for the length of each call (guide section 7.4), so
  ``with torch.cuda.stream(s):`` just works.
"""
from __future__ import annotations

import functools

import torch

from ..key import MAX_HIDDEN, NormKey
from ..runtime import LLVM_ALIGNMENT, get_kernel

# torch dtype -> NormKey dtype name, per role.
_FLOAT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}
_FP8 = {torch.float8_e4m3fn: "fp8e4m3", torch.float8_e5m2: "fp8e5m2"}
_NAMES = ", ".join(str(d) for d in (*_FLOAT, *_FP8))
HALF = (torch.float32, torch.float16, torch.bfloat16)

# (norm, stage, x dtype, w dtype, out dtype, hidden, zero-centred, target, x layout) -> NormKernel.
# The runtime registry caches per key too, but behind a lock and a NormKey construction (field
# validation); this dict makes a warm lookup one hash.
_KERNELS: dict = {}


def kernel(norm: str, stage: str, xdt, wdt, odt, hidden: int, zc: bool, cuda: bool, layout: str = "compact"):
    """The kernel of a config, for CUDA tensors (``cuda``: the tensors' is_cuda) or CPU ones,
    with x in ``layout`` (x_operand)."""
    tag = (norm, stage, xdt, wdt, odt, hidden, zc, cuda, layout)
    k = _KERNELS.get(tag)
    if k is None:
        ctype = "fp64" if xdt == torch.float64 else "fp32"
        otype = _FLOAT.get(odt) or _FP8[odt]
        key = NormKey(norm=norm, stage=stage, itype=_FLOAT[xdt], wtype=_FLOAT[wdt], otype=otype,
                      ctype=ctype, hidden_size=hidden, zero_centered_gamma=zc)
        k = _KERNELS[tag] = get_kernel(key, "cuda" if cuda else "llvm", layout)
    return k


def stat_dtype(xdt) -> torch.dtype:
    """mu/rsigma are in the key's ctype: fp64 for the fp64 (gradcheck) kernels, fp32 otherwise."""
    return torch.float64 if xdt == torch.float64 else torch.float32


# ---------------------------------------------------------------------------------------------
# Checks. They run on real and on fake tensors (torch.compile traces the fake implementations),
# so they read only shapes, strides, dtypes and devices; pointer alignment is checked separately.

def check_dtypes(op: str, x, weights, out_dtype, fp8: bool = False) -> None:
    if x.dtype not in _FLOAT:
        raise TypeError(f"{op}: x has unsupported dtype {x.dtype}; supported: float32, float16, bfloat16 "
                        f"(float64 for gradcheck)")
    for name, w in weights:
        if w.dtype not in _FLOAT:
            raise TypeError(f"{op}: {name} has unsupported dtype {w.dtype}; supported: float32, float16, "
                            f"bfloat16 (float64 for gradcheck)")
    if fp8:
        if out_dtype not in _FP8:
            raise TypeError(f"{op}: fp8_dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {out_dtype}")
    elif out_dtype not in _FLOAT:
        raise TypeError(f"{op}: out_dtype {out_dtype} is not supported; supported: float32, float16, "
                        f"bfloat16 (float64 for gradcheck)")
    # fp64 kernels exist so that gradcheck can run through the real kernels; they are built with
    # an fp64 compute type, which only makes sense when every operand is fp64.
    dts = [x.dtype] + [w.dtype for _, w in weights] + ([] if fp8 else [out_dtype])
    if torch.float64 in dts and any(d != torch.float64 for d in dts):
        roles = ", ".join(f"{n}={d}" for n, d in zip(["x"] + [n for n, _ in weights] + ["out"], dts))
        raise TypeError(f"{op}: float64 is only supported with x, weight, bias and output all float64 "
                        f"(there is no mixed fp64 kernel); got {roles}")
    if fp8 and x.dtype == torch.float64:
        raise TypeError(f"{op}: fp8 output needs x in float32, float16 or bfloat16, got float64")


def check_x(op: str, x, weights) -> int:
    """Validate x against the weights and return the hidden size."""
    if x.dim() == 0:
        raise ValueError(f"{op}: x must have at least one dimension (the normalized one), got a 0-dim tensor")
    hidden = x.shape[-1]
    if not 1 <= hidden <= MAX_HIDDEN:
        raise ValueError(f"{op}: the normalized (last) dimension of x has size {hidden}; supported sizes "
                         f"are 1 .. {MAX_HIDDEN}")
    cuda = x.is_cuda
    meta = False
    if not (cuda or x.is_cpu):
        # meta tensors (shapes only) reach here from the ops' fake implementations
        if not x.is_meta:
            raise ValueError(f"{op}: x is on {x.device}; tvmnorm runs on cpu and cuda tensors (and meta, "
                             f"for shapes)")
        meta = True
    for name, t in ([("x", x)] if meta else [("x", x), *weights]):
        if not torch._C._has_storage(t):
            # torch's legacy vmap (torch._vmap_internals) batches without storage, which the kernels
            # read through; torch.func.vmap reaches the ops' vmap rules instead
            raise TypeError(f"{op}: {name} is a tensor without storage (a batched tensor of torch's legacy "
                            f"vmap?), which the kernels cannot read; use torch.func.vmap")
    index = x.get_device()  # -1 on the CPU; with is_cuda/is_cpu it names the device without a torch.device
    for name, w in weights:
        if w.shape != (hidden,):
            raise ValueError(f"{op}: {name} must have shape [{hidden}] (the last dimension of x), "
                             f"got {list(w.shape)}")
        if not (w.is_cuda if cuda else w.is_meta if meta else w.is_cpu) or w.get_device() != index:
            raise ValueError(f"{op}: x is on {x.device} but {name} is on {w.device}")
    if not x.is_contiguous():
        groups = row_groups(x, hidden)
        if groups is None or len(groups) > 2:
            raise ValueError(f"{op}: x must be viewable as rows of {hidden} adjacent columns, the rows one stride "
                             f"apart or tokens x heads at two strides (per-head q/k of a fused qkv); got strides "
                             f"{tuple(x.stride())} for shape {tuple(x.shape)}. Pass x.contiguous() if a copy is "
                             f"acceptable.")
        span = sum((n - 1) * s for n, s in groups) + hidden
        if span >= 1 << 31:
            raise ValueError(f"{op}: x's rows (strides {tuple(x.stride())}) span {span} elements; the kernels for "
                             f"strided rows index them in int32 (< 2^31). Pass x.contiguous() if a copy is "
                             f"acceptable.")
    return hidden


def row_groups(x, hidden: int) -> tuple | None:
    """x's rows as ((count, stride), ...), outermost first: the dimensions before the last,
    merged where one steps over the next exactly (as Tensor.view merges them) and those of one
    element dropped; None where x's columns are not adjacent. () or one group: x is viewable as
    [rows, hidden] (Tensor.view), its rows one stride apart; two: tokens x heads, such as per-head
    q of a fused qkv (qkv[..., :q_size].view(tokens, heads, head_dim)). Reads shapes and strides
    only. Cached by shape and strides: a non-compact x's call asks three times (check_x,
    check_x_aligned, x_operand), and a decode loop passes views of one shape every step."""
    shape, strides = tuple(x.shape), x.stride()
    try:
        return _row_groups(shape, strides, hidden)
    except TypeError:  # symbolic sizes (torch.compile's dynamic shapes) do not hash
        return _row_groups.__wrapped__(shape, strides, hidden)


@functools.lru_cache(maxsize=256)
def _row_groups(shape: tuple, strides: tuple, hidden: int) -> tuple | None:
    if hidden > 1 and strides[-1] != 1:
        return None
    groups = []
    for n, s in zip(shape[:-1], strides[:-1]):
        if n == 1:
            continue
        if groups and groups[-1][1] == n * s:
            groups[-1] = (groups[-1][0] * n, s)
        else:
            groups.append((n, s))
    return tuple(groups)


def x_operand(x, hidden: int) -> tuple:
    """(the kernels' layout of x, x as that kernel takes it: a [rows, hidden] view, or for
    "heads" a [tokens, heads, hidden] one at x's strides), for an x that check_x passed. A
    compact CPU x whose base is not LLVM_ALIGNMENT-aligned is copied (see aligned)."""
    if x.is_contiguous():
        if not x.is_cuda and not aligned(x, hidden):  # a CUDA x passed check_x_aligned
            x = x.clone()
        return "compact", rows2d(x, hidden)
    groups = row_groups(x, hidden)
    if len(groups) < 2:
        return "strided", x.view(-1, hidden)
    (tokens, token_stride), (heads, head_stride) = groups
    return "heads", x.as_strided((tokens, heads, hidden), (token_stride, head_stride, 1))


def _alignment(hidden: int, elem_bytes: int) -> int:
    """The pointer alignment a CUDA kernel may rely on for a [*, hidden] operand: the widest
    vector load a schedule can use is the largest power of two <= 16 bytes dividing a row's
    bytes (a wider one would be misaligned on the second row already), so a row-contiguous
    tensor whose base has this alignment keeps every row aligned."""
    nbytes = hidden * elem_bytes
    a = 16
    while nbytes % a:
        a //= 2
    return a


def aligned(t: torch.Tensor, hidden: int) -> bool:
    """Whether the kernels take ``t`` as it lies: on CUDA _alignment's bound, on the CPU the
    runtime's LLVM_ALIGNMENT, which an llvm NormKernel requires of its arrays (a compact operand at
    an odd offset, torch.randn(n + 1)[1:].view(r, h), crashed the process). Operands the host
    layer passes compact are copied where it is False; x's strided and per-head kernels take x
    as it lies."""
    return t.data_ptr() % (_alignment(hidden, t.element_size()) if t.is_cuda else LLVM_ALIGNMENT) == 0


def check_x_aligned(op: str, x: torch.Tensor, hidden: int) -> None:
    a = _alignment(hidden, x.element_size())
    if x.data_ptr() % a:
        raise ValueError(f"{op}: x's data pointer {x.data_ptr():#x} is not {a}"
                         f"-byte aligned, which the CUDA kernels' vector loads need for hidden={hidden} "
                         f"{x.dtype}; this comes from a view at an odd offset. Pass x.clone() if a copy "
                         f"is acceptable.")
    if x.is_contiguous():  # rows hidden apart, whose bytes ``a`` divides by its definition
        return
    strides = [s for _, s in row_groups(x, hidden)]
    if any(s * x.element_size() % a for s in strides):
        raise ValueError(f"{op}: x's rows lie {', '.join(str(s) for s in strides)} elements apart (strides "
                         f"{tuple(x.stride())}), not a multiple of {a} bytes, which the CUDA kernels' vector loads "
                         f"need for hidden={hidden} {x.dtype} (each row must start aligned). Pass x.contiguous() "
                         f"if a copy is acceptable.")


def compact_weight(w: torch.Tensor, hidden: int) -> torch.Tensor:
    """gamma/beta are one row: copy when strided or misaligned, which is cheap."""
    if w.is_contiguous() and aligned(w, hidden):
        return w
    return w.clone(memory_format=torch.contiguous_format)


def compact_rows(t: torch.Tensor, hidden: int) -> torch.Tensor:
    """A row operand other than x (dy, dz, the residual) as the kernels take it: compact and
    aligned, copied where it is not (autograd hands dy over in whatever layout the next op
    produced; only x has kernels for other layouts). A sparse dy, which autograd passes on when
    the next op's backward gives one, is made dense: the kernels read every element anyway."""
    if t.layout != torch.strided:
        t = t.to_dense()
    t = t.contiguous()
    if not aligned(t, hidden):
        t = t.clone()
    return t


# (op, x dtype, weight dtypes, out dtype) combinations check_dtypes has passed: a set lookup
# instead of its checks on every call.
_DTYPES_OK: set = set()


def check_input(op: str, x, weights, out_dtype, fp8: bool = False) -> int:
    """check_dtypes (once per dtype combination), check_x and check_x_aligned: the hidden size."""
    combo = (op, x.dtype, out_dtype, *[w.dtype for _, w in weights])
    if combo not in _DTYPES_OK:
        check_dtypes(op, x, weights, out_dtype, fp8)
        _DTYPES_OK.add(combo)
    hidden = check_x(op, x, weights)
    if x.is_cuda:
        check_x_aligned(op, x, hidden)
    return hidden


# ---------------------------------------------------------------------------------------------
# Host functions. x comes validated and viewable as [rows, hidden] in any leading shape, dy and
# the weights compact; outputs are allocated in x's shape, and the kernels get [rows, hidden]
# views. A decode call's kernel takes a few us of GPU time, so this path allocates each output
# once and views only what is not already 2-D (a view costs ~1 us of Python, a torch.Size
# argument ~1.5 more).

def rows2d(t, hidden: int):
    return t if t.dim() == 2 else t.view(-1, hidden)


def rows_of(x) -> int:
    if x.dim() == 2:
        return x.shape[0]
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def rms_fwd(x, w, eps: float, zc: bool, out_dtype):
    hidden = x.shape[-1]
    y = torch.empty_like(x, dtype=out_dtype, memory_format=torch.contiguous_format)
    rs = x.new_empty(rows_of(x), dtype=stat_dtype(x.dtype))
    layout, xk = x_operand(x, hidden)
    kernel("rmsnorm", "fwd", x.dtype, w.dtype, out_dtype, hidden, zc, x.is_cuda, layout)(
        xk, w, rows2d(y, hidden), rs, eps=eps)
    return y, rs


def ln_fwd(x, w, b, eps: float, zc: bool, out_dtype):
    hidden, rows, sd = x.shape[-1], rows_of(x), stat_dtype(x.dtype)
    y = torch.empty_like(x, dtype=out_dtype, memory_format=torch.contiguous_format)
    mu, rs = x.new_empty(rows, dtype=sd), x.new_empty(rows, dtype=sd)
    layout, xk = x_operand(x, hidden)
    kernel("layernorm", "fwd", x.dtype, w.dtype, out_dtype, hidden, zc, x.is_cuda, layout)(
        xk, w, b, rows2d(y, hidden), mu, rs, eps=eps)
    return y, mu, rs


def _fwd_add(norm: str, x, residual, weights, stats: int, eps: float, zc: bool, out_dtype, scale=None):
    """(y, h, the row statistics, amax) of one fwd_add kernel: h = x + residual and y its norm,
    with ``scale`` y = saturate(norm * scale) in the fp8 ``out_dtype`` and amax its max |norm|
    (else None); ``residual`` compact, ``stats`` 2 for layernorm (mu, rsigma), 1 for rmsnorm."""
    hidden, rows, sd = x.shape[-1], rows_of(x), stat_dtype(x.dtype)
    y = torch.empty_like(x, dtype=out_dtype, memory_format=torch.contiguous_format)
    h = torch.empty_like(x, memory_format=torch.contiguous_format)
    st = [x.new_empty(rows, dtype=sd) for _ in range(stats)]
    amax = None if scale is None else _amax_out(rows, x.device)
    if rows:
        fp8_in, fp8_out = ((), ()) if scale is None else ((_fp8_scale(scale, x.device),), (amax,))
        layout, xk = x_operand(x, hidden)
        kernel(norm, "fwd_add", x.dtype, weights[0].dtype, out_dtype, hidden, zc, x.is_cuda, layout)(
            xk, rows2d(residual, hidden), *weights, *fp8_in, rows2d(y, hidden), rows2d(h, hidden), *st, *fp8_out,
            eps=eps)
    return y, h, st, amax


def rms_fwd_add(x, residual, w, eps: float, zc: bool, out_dtype):
    """(y, h, rsigma): h = x + residual and y = rms_norm(h) in one kernel (stage fwd_add);
    ``residual`` compact."""
    y, h, (rs,), _ = _fwd_add("rmsnorm", x, residual, (w,), 1, eps, zc, out_dtype)
    return y, h, rs


def ln_fwd_add(x, residual, w, b, eps: float, zc: bool, out_dtype):
    """(y, h, mu, rsigma) as rms_fwd_add."""
    y, h, (mu, rs), _ = _fwd_add("layernorm", x, residual, (w, b), 2, eps, zc, out_dtype)
    return y, h, mu, rs


def rms_fwd_add_fp8(x, residual, w, scale, eps: float, zc: bool, fp8_dtype):
    """(y in fp8, h, amax): rms_fwd_add with the fp8 cast and amax of rms_fwd_fp8."""
    y, h, _, amax = _fwd_add("rmsnorm", x, residual, (w,), 1, eps, zc, fp8_dtype, scale)
    return y, h, amax


def ln_fwd_add_fp8(x, residual, w, b, scale, eps: float, zc: bool, fp8_dtype):
    y, h, _, amax = _fwd_add("layernorm", x, residual, (w, b), 2, eps, zc, fp8_dtype, scale)
    return y, h, amax


def _fp8_scale(scale, device):
    return scale.reshape(1).to(device=device, dtype=torch.float32).contiguous()


def _amax_out(rows: int, device):
    """amax's output: written by every call with rows (the amax kernels after the forward, or
    amax_zero before a forward that folds into it), so only a call of no rows, which launches
    nothing, needs the fill kernel of torch.zeros."""
    return (torch.empty if rows else torch.zeros)((1,), dtype=torch.float32, device=device)


def rms_fwd_fp8(x, w, scale, eps: float, zc: bool, fp8_dtype):
    hidden, rows = x.shape[-1], rows_of(x)
    y = torch.empty_like(x, dtype=fp8_dtype, memory_format=torch.contiguous_format)
    rs = x.new_empty(rows, dtype=torch.float32)
    amax = _amax_out(rows, x.device)
    if rows:
        layout, xk = x_operand(x, hidden)
        kernel("rmsnorm", "fwd", x.dtype, w.dtype, fp8_dtype, hidden, zc, x.is_cuda, layout)(
            xk, w, _fp8_scale(scale, x.device), rows2d(y, hidden), rs, amax, eps=eps)
    return y, amax


def ln_fwd_fp8(x, w, b, scale, eps: float, zc: bool, fp8_dtype):
    hidden, rows = x.shape[-1], rows_of(x)
    y = torch.empty_like(x, dtype=fp8_dtype, memory_format=torch.contiguous_format)
    mu = x.new_empty(rows, dtype=torch.float32)
    rs = x.new_empty(rows, dtype=torch.float32)
    amax = _amax_out(rows, x.device)
    if rows:
        layout, xk = x_operand(x, hidden)
        kernel("layernorm", "fwd", x.dtype, w.dtype, fp8_dtype, hidden, zc, x.is_cuda, layout)(
            xk, w, b, _fp8_scale(scale, x.device), rows2d(y, hidden), mu, rs, amax, eps=eps)
    return y, amax


def rms_bwd(dy, x, rs, w, zc: bool, dz=None):
    """dx and dweight; ``dz`` (compact, x's dtype and shape): a gradient that reaches x around
    the norm (a residual branch's), added into dx by the kernel (stage bwd_add) instead of by
    another pass over dx."""
    hidden, rows = x.shape[-1], rows_of(x)
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    if not rows:
        # No rows, no kernels: the gradient of an empty sum is zero.
        return dx, torch.zeros_like(w)
    dw = torch.empty_like(w)
    layout, xk = x_operand(x, hidden)
    add = () if dz is None else (rows2d(dz, hidden),)
    kernel("rmsnorm", "bwd" if dz is None else "bwd_add", x.dtype, w.dtype, dy.dtype, hidden, zc, x.is_cuda, layout)(
        rows2d(dy, hidden), xk, rs, w, *add, rows2d(dx, hidden), dw)
    return dx, dw


def ln_bwd(dy, x, mu, rs, w, zc: bool, dz=None):
    """dx, dweight and dbias; ``dz`` as in rms_bwd."""
    hidden, rows = x.shape[-1], rows_of(x)
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    if not rows:
        return dx, torch.zeros_like(w), torch.zeros_like(w)
    dw, db = torch.empty_like(w), torch.empty_like(w)
    layout, xk = x_operand(x, hidden)
    add = () if dz is None else (rows2d(dz, hidden),)
    kernel("layernorm", "bwd" if dz is None else "bwd_add", x.dtype, w.dtype, dy.dtype, hidden, zc, x.is_cuda,
           layout)(rows2d(dy, hidden), xk, mu, rs, w, *add, rows2d(dx, hidden), dw, db)
    return dx, dw, db
