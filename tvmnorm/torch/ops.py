"""Functional RMSNorm / LayerNorm on torch tensors: autograd and ``torch.library`` ops.

Layers, thinnest first (STYLE.md lesson 6):

    _host.py           kernels over DLPack on [rows, hidden] views
    *_impl below       any leading shape -> [rows, hidden] view -> host function -> shaped back
    RMSNormFunction /  torch.autograd.Function: fwd kernel (saves rsigma, and mu for LayerNorm)
    LayerNormFunction  and bwd kernel; the eager path
    tvmnorm::* ops     torch.library.custom_op with fake implementations and register_autograd,
                       the same impls and the same backward; what torch.compile sees
    *_transformable    autograd.Functions in torch.func's form (setup_context, vmap rules),
                       the same impls; what vmap, grad, vjp and jacrev see
    rms_norm, ...      the public functions, picking one of them

rms_norm_add and layer_norm_add (residual add, then the norm) run one fwd_add kernel, which
writes h = x + residual beside y, and the norm's backward as its bwd_add kernel, which adds the
residual stream's gradient into dx.

Why two autograd wrappers around one implementation: a custom op goes through the dispatcher,
which costs ~14 us per call on the CPU against ~5 us for an autograd.Function (torch 2.13), and a
norm is a small kernel. Dynamo cannot trace into a TVM call, so while compiling the public
functions call the registered op, which dynamo keeps in the graph as one node and AOTAutograd
differentiates with the registered backward. Both paths run the same forward and backward code.
Without grad, eager calls skip autograd altogether.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch
from torch.autograd import forward_ad as _forward_ad

from ..runtime import checked_eps
from . import _host

Tensor = torch.Tensor


# ---------------------------------------------------------------------------------------------
# Gradients that must not be silently missing: nodes whose backward raises.

NOT_TWICE = ("tvmnorm's norm backward is not differentiable (once_differentiable: its kernels have no "
             "backward of their own), so a second derivative through it is not supported")


def once_differentiable(backward):
    """The bwd kernels are not differentiable themselves: the gradients a backward returns under
    create_graph differentiate to an error, never silently to nothing. torch's
    once_differentiable puts them on its error node only where a gradient flowing in requires
    grad and misses the saved inputs (its own comment says so): after y.sum() (dy = ones) the
    gradients came back without a graph, so a gradient penalty built on them was a constant and
    its second derivative silently zero. Here a saved input that requires grad counts too."""
    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        if not torch.is_grad_enabled() or not any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in (*grads, *ctx.saved_tensors)):
            return outputs
        return _refusing_backward(NOT_TWICE, outputs)
    return wrapper


def _refusing_backward(message: str, tensors) -> tuple:
    """``tensors`` (None kept) as outputs of a node whose backward raises ``message``: what
    torch's once_differentiable builds, for a gradient that must not silently be missing."""
    refuse = torch._C._functions.DelayedError(message.encode(), len(tensors))
    out = refuse(*[None if t is None else t.detach().requires_grad_() for t in tensors])
    return out if isinstance(out, tuple) else (out,)


def _forward_only(op: str, outputs: tuple, *inputs) -> tuple:
    """The fp8 ops have no backward. Where grad mode is on and an input requires grad, y_fp8 (and
    h) come back on a node whose backward raises, naming the op: a loss that reaches them fails
    instead of leaving x, residual and the weights silently without that part of their gradient
    (h is the residual stream of the next block). amax, a statistic, never requires grad, as
    TransformerEngine's."""
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in inputs):
        return outputs
    *values, amax = outputs
    return (*_refusing_backward(_fp8_refusal(op), values), amax)


def _fp8_refusal(op: str) -> str:
    return (f"{op} is forward-only (its fp8 output has no derivative, reverse or forward mode): for a "
            f"gradient, run the norm in bf16/fp16 (rms_norm, layer_norm, *_add) and quantize its output")


# ---------------------------------------------------------------------------------------------
# Implementations: checks, then the host call (outputs shaped like x).

def _rms_fwd_impl(x, w, eps, zc, out_dtype, op="rms_norm"):
    hidden = _host.check_input(op, x, [("weight", w)], out_dtype)
    return _host.rms_fwd(x, _host.compact_weight(w, hidden), checked_eps(eps, op), zc, out_dtype)


def _ln_fwd_impl(x, w, b, eps, zc, out_dtype, op="layer_norm"):
    hidden = _host.check_input(op, x, [("weight", w), ("bias", b)], out_dtype)
    return _host.ln_fwd(x, _host.compact_weight(w, hidden), _host.compact_weight(b, hidden), checked_eps(eps, op),
                        zc, out_dtype)


def _rms_bwd_impl(dy, x, rs, w, zc, dz=None):
    """dz: a gradient added into dx by the kernel (bwd_add; see _add_grads)."""
    if _storage_less(dy, dz):
        return _bwd_by_torch_ops(dy, x, None, rs, w, zc, dz)
    hidden = x.shape[-1]
    return _host.rms_bwd(_host.compact_rows(dy, hidden), x, rs, _host.compact_weight(w, hidden), zc,
                         None if dz is None else _host.compact_rows(dz, hidden))


def _ln_bwd_impl(dy, x, mu, rs, w, zc, dz=None):
    if _storage_less(dy, dz):
        return _bwd_by_torch_ops(dy, x, mu, rs, w, zc, dz)
    hidden = x.shape[-1]
    return _host.ln_bwd(_host.compact_rows(dy, hidden), x, mu, rs, _host.compact_weight(w, hidden), zc,
                        None if dz is None else _host.compact_rows(dz, hidden))


def _storage_less(*grads) -> bool:
    """A gradient without storage: torch's own batched gradients (autograd.grad with
    is_grads_batched=True, gradcheck's check_batched_grad: the legacy vmap, which torch.func's
    rules do not see) reach the backward as such, and a kernel cannot read them. (A sparse
    gradient has no storage either; the kernels get it made dense.)"""
    return any(g is not None and g.layout == torch.strided and not torch._C._has_storage(g) for g in grads)


def _compute_dtype(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _xhat(x, mu, rs):
    """x normalised again from its statistics (mu None for rmsnorm), in fp32 (fp64 for fp64),
    for the gradients and tangents computed by torch ops."""
    rows = (*x.shape[:-1], 1)
    x = x.to(_compute_dtype(x))
    return (x if mu is None else x - mu.reshape(rows)) * rs.reshape(rows)


def _gamma(w, zc, ct):
    return w.to(ct) + 1 if zc else w.to(ct)


def _through_xhat(v, xhat, rs, layernorm: bool):
    """v through the Jacobian of xhat in x, rsigma * (v - xhat * mean(xhat * v)), less mean(v)
    for layernorm: symmetric, so one formula gives the backward (v = g dy: dx) and the forward
    mode (v = x's tangent: xhat's)."""
    centred = v - v.mean(-1, keepdim=True) if layernorm else v
    return rs.reshape(*xhat.shape[:-1], 1) * (centred - xhat * (v * xhat).mean(-1, keepdim=True))


def _bwd_by_torch_ops(dy, x, mu, rs, w, zc, dz):
    """The bwd kernels' results, (dx, dweight) or with mu (dx, dweight, dbias), by torch ops, for
    gradients the kernels cannot take (_storage_less), plus dz."""
    ct = _compute_dtype(x)
    xhat, dy = _xhat(x, mu, rs), dy.to(ct)
    dx = _through_xhat(dy * _gamma(w, zc, ct), xhat, rs, mu is not None)
    dx = _plus(dx, None if dz is None else dz.to(ct)).to(x.dtype)
    leading = tuple(range(x.dim() - 1))
    dw = (dy * xhat).sum(leading).to(w.dtype)
    return (dx, dw) if mu is None else (dx, dw, dy.sum(leading).to(w.dtype))


def _check_residual(op, x, residual):
    """The residual of a residual add + norm: x's shape, dtype and device."""
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"{op}: residual must be a torch.Tensor, got {type(residual).__name__}")
    if residual.shape != x.shape:
        raise ValueError(f"{op}: residual must have x's shape {list(x.shape)}, got {list(residual.shape)}")
    if residual.dtype != x.dtype:
        raise TypeError(f"{op}: residual ({residual.dtype}) must have x's dtype ({x.dtype}): their sum h is "
                        f"returned in it, and its gradient is theirs")
    if residual.device != x.device:
        raise ValueError(f"{op}: x is on {x.device} but residual is on {residual.device}")


def _rms_add_fwd_impl(x, residual, w, eps, zc, out_dtype):
    """(y, h, rsigma) of one fwd_add kernel: the add is not a pass of its own."""
    _check_residual("rms_norm_add", x, residual)
    hidden = _host.check_input("rms_norm_add", x, [("weight", w)], out_dtype)
    return _host.rms_fwd_add(x, _host.compact_rows(residual, hidden), _host.compact_weight(w, hidden),
                             checked_eps(eps, "rms_norm_add"), zc, out_dtype)


def _ln_add_fwd_impl(x, residual, w, b, eps, zc, out_dtype):
    _check_residual("layer_norm_add", x, residual)
    hidden = _host.check_input("layer_norm_add", x, [("weight", w), ("bias", b)], out_dtype)
    return _host.ln_fwd_add(x, _host.compact_rows(residual, hidden), _host.compact_weight(w, hidden),
                            _host.compact_weight(b, hidden), checked_eps(eps, "layer_norm_add"), zc, out_dtype)


def _add_grads(dy, dh, h, w, bwd, weights: int):
    """The gradients of a residual add + norm (h's, which x's and residual's are, then the
    weights'): the norm's backward ``bwd(dy, dz)`` with dh, the gradient reaching h around the
    norm, added into its dx by the kernel (bwd_add). Either may be None (its output unused)."""
    if dy is None:
        zeros = tuple(torch.zeros_like(w) for _ in range(weights))
        return (dh if dh is not None else torch.zeros_like(h)), *zeros
    return bwd(dy, dh)


def _rms_add_bwd_impl(dy, dh, h, rs, w, zc):
    return _add_grads(dy, dh, h, w, lambda dy, dz: _rms_bwd_impl(dy, h, rs, w, zc, dz), 1)


def _ln_add_bwd_impl(dy, dh, h, mu, rs, w, zc):
    return _add_grads(dy, dh, h, w, lambda dy, dz: _ln_bwd_impl(dy, h, mu, rs, w, zc, dz), 2)


def _rms_fp8_impl(x, w, scale, eps, zc, fp8_dtype, op="rms_norm_fp8"):
    hidden = _host.check_input(op, x, [("weight", w)], fp8_dtype, fp8=True)
    _check_scale(op, scale, x)
    return _host.rms_fwd_fp8(x, _host.compact_weight(w, hidden), scale, checked_eps(eps, op), zc, fp8_dtype)


def _ln_fp8_impl(x, w, b, scale, eps, zc, fp8_dtype, op="layer_norm_fp8"):
    hidden = _host.check_input(op, x, [("weight", w), ("bias", b)], fp8_dtype, fp8=True)
    _check_scale(op, scale, x)
    return _host.ln_fwd_fp8(x, _host.compact_weight(w, hidden), _host.compact_weight(b, hidden), scale,
                            checked_eps(eps, op), zc, fp8_dtype)


def _rms_add_fp8_impl(x, residual, w, scale, eps, zc, fp8_dtype):
    op = "rms_norm_add_fp8"
    _check_residual(op, x, residual)
    hidden = _host.check_input(op, x, [("weight", w)], fp8_dtype, fp8=True)
    _check_scale(op, scale, x)
    return _host.rms_fwd_add_fp8(x, _host.compact_rows(residual, hidden), _host.compact_weight(w, hidden), scale,
                                 checked_eps(eps, op), zc, fp8_dtype)


def _ln_add_fp8_impl(x, residual, w, b, scale, eps, zc, fp8_dtype):
    op = "layer_norm_add_fp8"
    _check_residual(op, x, residual)
    hidden = _host.check_input(op, x, [("weight", w), ("bias", b)], fp8_dtype, fp8=True)
    _check_scale(op, scale, x)
    return _host.ln_fwd_add_fp8(x, _host.compact_rows(residual, hidden), _host.compact_weight(w, hidden),
                                _host.compact_weight(b, hidden), scale, checked_eps(eps, op), zc, fp8_dtype)


def _check_scale(op, scale, x):
    if scale.numel() != 1:
        raise ValueError(f"{op}: scale must hold one value (shape [] or [1]), got shape {list(scale.shape)}")
    if scale.device != x.device:
        raise ValueError(f"{op}: x is on {x.device} but scale is on {scale.device}")


def hidden_of(x):
    return x.shape[-1] if x.dim() else 1


# ---------------------------------------------------------------------------------------------
# Eager autograd.

class RMSNormFunction(torch.autograd.Function):
    """y = x * rsigma * gamma (gamma = 1 + weight if zero-centred), rsigma = 1/sqrt(mean(x^2) + eps)."""

    @staticmethod
    def forward(ctx, x, weight, eps, zero_centered_gamma, out_dtype):
        y, rs = _rms_fwd_impl(x, weight, eps, zero_centered_gamma, out_dtype)
        ctx.save_for_backward(x, weight, rs)
        ctx.zc = zero_centered_gamma
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, rs = ctx.saved_tensors
        dx, dw = _rms_bwd_impl(dy, x, rs, weight, ctx.zc)
        return dx, dw, None, None, None


class LayerNormFunction(torch.autograd.Function):
    """y = (x - mu) * rsigma * gamma + beta, rsigma = 1/sqrt(var(x) + eps) (biased variance)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, zero_centered_gamma, out_dtype):
        y, mu, rs = _ln_fwd_impl(x, weight, bias, eps, zero_centered_gamma, out_dtype)
        ctx.save_for_backward(x, weight, mu, rs)
        ctx.zc = zero_centered_gamma
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, mu, rs = ctx.saved_tensors
        dx, dw, db = _ln_bwd_impl(dy, x, mu, rs, weight, ctx.zc)
        return dx, dw, db, None, None, None


class RMSNormAddFunction(torch.autograd.Function):
    """(y, h): h = x + residual, y = rms_norm(h); the backward one bwd_add kernel (see rms_norm_add)."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps, zero_centered_gamma, out_dtype):
        y, h, rs = _rms_add_fwd_impl(x, residual, weight, eps, zero_centered_gamma, out_dtype)
        ctx.save_for_backward(h, weight, rs)
        ctx.zc = zero_centered_gamma
        ctx.set_materialize_grads(False)  # an unused output's gradient is None, not a tensor of zeros
        return y, h

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh):
        h, weight, rs = ctx.saved_tensors
        dx, dw = _rms_add_bwd_impl(dy, dh, h, rs, weight, ctx.zc)
        return dx, dx, dw, None, None, None


class LayerNormAddFunction(torch.autograd.Function):
    """(y, h): h = x + residual, y = layer_norm(h); the backward one bwd_add kernel."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, zero_centered_gamma, out_dtype):
        y, h, mu, rs = _ln_add_fwd_impl(x, residual, weight, bias, eps, zero_centered_gamma, out_dtype)
        ctx.save_for_backward(h, weight, mu, rs)
        ctx.zc = zero_centered_gamma
        ctx.set_materialize_grads(False)
        return y, h

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh):
        h, weight, mu, rs = ctx.saved_tensors
        dx, dw, db = _ln_add_bwd_impl(dy, dh, h, mu, rs, weight, ctx.zc)
        return dx, dx, dw, db, None, None, None


# ---------------------------------------------------------------------------------------------
# torch.func transforms (vmap, grad, vjp, jacrev, jvp, jacfwd and their compositions).
#
# Under a transform the tensors are functorch wrappers without storage, which the kernels cannot
# take, and torch.func accepts only an autograd.Function with setup_context (the eager Functions
# above keep ctx in forward, the cheaper form for the common path) and, for vmap, a rule of its
# own. These Functions run the same impls: forward on the unwrapped tensors, backward as another
# such Function (the kernels again, not differentiable further). Under vmap a norm's forward
# and backward fold a batch of x into their rows (one call each; the backward's weight
# gradients, which its kernel sums over every row, are summed again by sample); a batch of
# weights and the fp8 ops (whose amax would be the batch's) take one call a sample, stacked.
# Forward mode (jvp: torch.func's, and torch.autograd.forward_ad's dual tensors) runs the
# kernels for the primal and torch ops for the tangent (_norm_tangent).

def _transform_active() -> bool:
    """A torch.func transform, or a forward-AD dual level: both need the Functions below (a dual
    x through the kernels alone came back with its tangent dropped, silently)."""
    return torch._C._are_functorch_transforms_active() or _forward_ad._current_level >= 0


def _vmap_by_sample(apply, info, in_dims, args):
    """A vmap rule: ``apply`` once per sample of the batch (the batched args selected at their
    batch dim, each sample a copy: a view starts at an offset the llvm kernels may not take for
    their vector moves), the outputs stacked along dim 0."""
    outs = [apply(*[a if d is None else a.select(d, b).clone() for a, d in zip(args, in_dims)])
            for b in range(info.batch_size)]
    single = not isinstance(outs[0], tuple)
    stacked = tuple(None if col[0] is None else torch.stack(col) for col in ([outs] if single else zip(*outs)))
    dims = tuple(None if s is None else 0 for s in stacked)
    return (stacked[0], dims[0]) if single else (stacked, dims)


def _vmap_folded(apply, info, in_dims, args, row_args: int, regroup, stat_args=(), needed=()):
    """A vmap rule for a norm's forward or backward whose batched args are all among its first
    ``row_args`` (x, residual, dy, the statistics): the batch becomes leading rows of one call
    (the norm is row by row; ``stat_args``, one value a row, are flattened to match), and
    ``regroup(outs, rows, B, n)`` (n rows a sample) splits by sample what the call summed or
    flattened. None where another arg is batched (a weight: an ensemble), which needs a call a
    sample, or where an arg of ``needed`` is None."""
    if any(d is not None for d in in_dims[row_args:]) or any(args[i] is None for i in needed):
        return None
    B = info.batch_size
    rows = [None if a is None else (a.expand(B, *a.shape) if d is None else a.movedim(d, 0)).contiguous()
            for a, d in zip(args[:row_args], in_dims)]
    rows = [a.reshape(-1) if i in stat_args else a for i, a in enumerate(rows)]
    # rows a sample, from x's shape (a batch of none has no total to divide)
    n = math.prod(rows[0].shape[1:-1])
    outs = regroup(apply(*rows, *args[row_args:]), rows, B, n)
    return outs, (0,) * len(outs)


def _weight_grads_by_sample(dy, x, mu, rs, B, n):
    """Each sample's weight gradients, (dgamma,) or with ``mu`` (layernorm) (dgamma, dbeta), from
    the folded rows of a batch of B samples of n rows: the sums over a sample's rows of dy * xhat
    (and of dy), in fp32 (fp64 for fp64), where the kernel's finalize sums over every row of the
    call. rsigma enters through a batched product over the rows, so one temporary of x's size is
    made (three made the sums slower than the dx kernel on the CPU)."""
    ct, H = _compute_dtype(x), x.shape[-1]
    dy, x = dy.to(ct).reshape(B, n, H), x.to(ct).reshape(B, n, H)
    dy_xc = dy * x if mu is None else (x - mu.reshape(B, n, 1)).mul_(dy)
    dgamma = torch.bmm(rs.reshape(B, 1, n), dy_xc).reshape(B, H)
    return (dgamma,) + (() if mu is None else (dy.sum(1),))


def _backward_fold(at):
    """The fold of a backward's vmap (_vmap_folded's keywords): ``at`` is where dy, x (or h), mu
    (None for rmsnorm) and rsigma are among its args. dx comes from one kernel call over the
    whole batch; each sample's weight gradients are summed apart (_weight_grads_by_sample). A
    missing dy (an add-norm whose y is unused) leaves it to the rule by sample."""
    def regroup(outs, rows, B, n):
        dy, x, mu, rs = (None if i is None else rows[i] for i in at)
        return (outs[0], *(g.to(o.dtype) for g, o in zip(_weight_grads_by_sample(dy, x, mu, rs, B, n), outs[1:])))
    return {"row_args": max(i for i in at if i is not None) + 1, "regroup": regroup,
            "stat_args": tuple(i for i in at[2:] if i is not None), "needed": (at[0],)}


def _forward_fold(row_args: int, stats):
    """The fold of a forward's vmap (_vmap_folded's keywords): its first ``row_args`` args (x,
    and residual) are rows; each statistic (one value a row) is split back by sample."""
    def regroup(outs, rows, B, n):
        return tuple(o.reshape(B, n) if i in stats else o for i, o in enumerate(outs))
    return {"row_args": row_args, "regroup": regroup}


def _plus(a, b):
    """a + b where None is a zero tangent."""
    return a if b is None else b if a is None else a + b


def _norm_tangent(x, tx, mu, rs, w, tw, tb, zc, y):
    """The forward-mode tangent of a norm's y = xhat * g (+ bias), g = w or 1 + w, from x's
    tangent tx and the weights' tw, tb (any may be None: zero), in fp32 (fp64 for fp64) by torch
    ops, in y's dtype (xhat's tangent: _through_xhat; ``mu`` given for layernorm). None where
    every tangent is."""
    ct = _compute_dtype(x)
    xhat = _xhat(x, mu, rs)
    t = None if tx is None else _through_xhat(tx.to(ct), xhat, rs, mu is not None) * _gamma(w, zc, ct)
    t = _plus(t, None if tw is None else xhat * tw.to(ct))
    t = _plus(t, None if tb is None else tb.to(ct).expand_as(xhat))
    return None if t is None else t.to(y.dtype)


def _add_norm_tangents(i, o, t, mu, rs, bias):
    """(y's, h's) tangents of an add-norm: h = x + residual, whose tangent is theirs, then the
    norm of h. h's is zeros where neither has one (None there failed an internal assert of
    torch's forward AD, "Expected both tensor and its forward grad to be floating point")."""
    th = _plus(t[0], t[1])
    return (_norm_tangent(o[1], th, mu, rs, i[2], t[2], t[3] if bias else None, i[-2], o[0]),
            torch.zeros_like(o[1]) if th is None else th.to(o[1].dtype))


def _transformable(name, fwd, bwd=None, stats=(), diff_outputs=1, save=None, input_grads=None, refusal=NOT_TWICE,
                   row_args=0, bwd_at=None, fold=None, tangent=None):
    """An autograd.Function over ``fwd(*inputs) -> outputs`` for torch.func. ``stats`` are the
    output positions that are statistics (never differentiable); the gradients of the first
    ``diff_outputs`` outputs and ``save(inputs, outputs)`` go to ``bwd``, whose results
    ``input_grads`` places at the inputs. Without ``bwd`` (the fp8 ops, and a backward's own
    Function), a backward that reaches an output raises ``refusal``. vmap folds a batch into the
    rows of one call by ``fold`` (_vmap_folded's keywords), by default the forward's of its
    first ``row_args`` args (_forward_fold), else it takes a call a sample; ``bwd_at`` (where dy,
    x, mu and rsigma are among bwd's args) folds the backward's (_backward_fold).
    ``tangent(inputs, outputs, input_tangents)`` gives the outputs' tangents in forward mode;
    without it, a forward-mode derivative raises ``refusal``."""
    fold = fold or (_forward_fold(row_args, stats) if row_args else None)

    # the backward's own Function: the bwd kernels, whose backward raises (not differentiable)
    backward_function = None if bwd is None else _transformable(
        f"{name}_backward", bwd, fold=None if bwd_at is None else _backward_fold(bwd_at))

    class Forward(torch.autograd.Function):
        @staticmethod
        def forward(*inputs):
            return fwd(*inputs)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.mark_non_differentiable(*(output[i] for i in stats))
            ctx.set_materialize_grads(False)
            if bwd is not None:
                ctx.save_for_backward(*save(inputs, output))
                ctx.zc = inputs[-2]
            if tangent is not None:
                values = (*inputs, *output)
                ctx.fwd_slots = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
                ctx.fwd_other = {i: v for i, v in enumerate(values) if not isinstance(v, torch.Tensor)}
                ctx.save_for_forward(*(values[i] for i in ctx.fwd_slots))

        @staticmethod
        def backward(ctx, *grads):
            if bwd is None:
                raise RuntimeError(refusal)
            grads = grads[:diff_outputs]
            if all(g is None for g in grads):
                return (None,) * len(ctx.needs_input_grad)
            return input_grads(backward_function.apply(*grads, *ctx.saved_tensors, ctx.zc))

        @staticmethod
        def jvp(ctx, *tangents):
            if tangent is None:
                raise RuntimeError(refusal)
            saved = {**ctx.fwd_other, **dict(zip(ctx.fwd_slots, ctx.saved_tensors))}
            values = [saved[i] for i in range(len(saved))]
            return tangent(values[:len(tangents)], values[len(tangents):], tangents)

        @staticmethod
        def vmap(info, in_dims, *args):
            folded = _vmap_folded(Forward.apply, info, in_dims, args, **fold) if fold else None
            return folded or _vmap_by_sample(Forward.apply, info, in_dims, args)

    Forward.__name__ = Forward.__qualname__ = f"{name}_transformable"
    return Forward


# save(inputs, outputs) lists the saved tensors in the order of bwd's arguments after the gradients
_RMS_T = _transformable("rms_norm", _rms_fwd_impl, _rms_bwd_impl, stats=(1,), save=lambda i, o: (i[0], o[1], i[1]),
                        input_grads=lambda g: (*g, None, None, None), row_args=1, bwd_at=(0, 1, None, 2),
                        tangent=lambda i, o, t: (_norm_tangent(i[0], t[0], None, o[1], i[1], t[1], None, i[3], o[0]),
                                                 None))
_LN_T = _transformable("layer_norm", _ln_fwd_impl, _ln_bwd_impl, stats=(1, 2), row_args=1, bwd_at=(0, 1, 2, 3),
                       save=lambda i, o: (i[0], o[1], o[2], i[1]), input_grads=lambda g: (*g, None, None, None),
                       tangent=lambda i, o, t: (_norm_tangent(i[0], t[0], o[1], o[2], i[1], t[1], t[2], i[4], o[0]),
                                                None, None))
_RMS_ADD_T = _transformable("rms_norm_add", _rms_add_fwd_impl, _rms_add_bwd_impl, stats=(2,), diff_outputs=2,
                            row_args=2, bwd_at=(0, 2, None, 3),
                            save=lambda i, o: (o[1], o[2], i[2]),
                            input_grads=lambda g: (g[0], g[0], g[1], None, None, None),
                            tangent=lambda i, o, t: (*_add_norm_tangents(i, o, t, None, o[2], False), None))
_LN_ADD_T = _transformable("layer_norm_add", _ln_add_fwd_impl, _ln_add_bwd_impl, stats=(2, 3), diff_outputs=2,
                           row_args=2, bwd_at=(0, 2, 3, 4),
                           save=lambda i, o: (o[1], o[2], o[3], i[2]),
                           input_grads=lambda g: (g[0], g[0], *g[1:], None, None, None),
                           tangent=lambda i, o, t: (*_add_norm_tangents(i, o, t, o[2], o[3], True), None, None))
_FP8_T = {name: _transformable(name, impl, stats=(n - 1,), refusal=_fp8_refusal(name)) for name, impl, n in (
    ("rms_norm_fp8", _rms_fp8_impl, 2), ("layer_norm_fp8", _ln_fp8_impl, 2),
    ("rms_norm_add_fp8", _rms_add_fp8_impl, 3), ("layer_norm_add_fp8", _ln_add_fp8_impl, 3))}


# ---------------------------------------------------------------------------------------------
# torch.library ops (what torch.compile traces). Fake implementations run the same checks, so
# a bad call fails at trace time with the same message.

@torch.library.custom_op("tvmnorm::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(x: Tensor, weight: Tensor, eps: float, zero_centered_gamma: bool,
                 out_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """-> (y shaped like x in out_dtype, rsigma [rows] in fp32 (fp64 for fp64 x))."""
    return _rms_fwd_impl(x, weight, eps, zero_centered_gamma, out_dtype)


@rms_norm_fwd.register_fake
def _(x, weight, eps, zero_centered_gamma, out_dtype):
    _host.check_dtypes("rms_norm", x, [("weight", weight)], out_dtype)
    _host.check_x("rms_norm", x, [("weight", weight)])
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty((_host.rows_of(x),), dtype=_host.stat_dtype(x.dtype))


@torch.library.custom_op("tvmnorm::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(dy: Tensor, x: Tensor, rsigma: Tensor, weight: Tensor,
                 zero_centered_gamma: bool) -> tuple[Tensor, Tensor]:
    """-> (dx like x, dweight [hidden] in weight's dtype)."""
    return _rms_bwd_impl(dy, x, rsigma, weight, zero_centered_gamma)


@rms_norm_bwd.register_fake
def _(dy, x, rsigma, weight, zero_centered_gamma):
    return x.new_empty(x.shape), weight.new_empty((x.shape[-1],))


def _rms_setup(ctx, inputs, output):
    x, weight, _, zc, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.zc = zc


def _rms_backward(ctx, dy, _drsigma):
    x, weight, rs = ctx.saved_tensors
    dx, dw = rms_norm_bwd(dy, x, rs, weight, ctx.zc)
    return dx, dw, None, None, None


rms_norm_fwd.register_autograd(_rms_backward, setup_context=_rms_setup)


@torch.library.custom_op("tvmnorm::layer_norm_fwd", mutates_args=())
def layer_norm_fwd(x: Tensor, weight: Tensor, bias: Tensor, eps: float, zero_centered_gamma: bool,
                   out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """-> (y shaped like x in out_dtype, mu [rows], rsigma [rows]), stats in fp32 (fp64 for fp64 x)."""
    return _ln_fwd_impl(x, weight, bias, eps, zero_centered_gamma, out_dtype)


@layer_norm_fwd.register_fake
def _(x, weight, bias, eps, zero_centered_gamma, out_dtype):
    _host.check_dtypes("layer_norm", x, [("weight", weight), ("bias", bias)], out_dtype)
    _host.check_x("layer_norm", x, [("weight", weight), ("bias", bias)])
    sd = _host.stat_dtype(x.dtype)
    return (x.new_empty(x.shape, dtype=out_dtype), x.new_empty((_host.rows_of(x),), dtype=sd),
            x.new_empty((_host.rows_of(x),), dtype=sd))


@torch.library.custom_op("tvmnorm::layer_norm_bwd", mutates_args=())
def layer_norm_bwd(dy: Tensor, x: Tensor, mu: Tensor, rsigma: Tensor, weight: Tensor,
                   zero_centered_gamma: bool) -> tuple[Tensor, Tensor, Tensor]:
    """-> (dx like x, dweight, dbias), the last two [hidden] in weight's dtype."""
    return _ln_bwd_impl(dy, x, mu, rsigma, weight, zero_centered_gamma)


@layer_norm_bwd.register_fake
def _(dy, x, mu, rsigma, weight, zero_centered_gamma):
    return x.new_empty(x.shape), weight.new_empty((x.shape[-1],)), weight.new_empty((x.shape[-1],))


def _ln_setup(ctx, inputs, output):
    x, weight, _, _, zc, _ = inputs
    ctx.save_for_backward(x, weight, output[1], output[2])
    ctx.zc = zc


def _ln_backward(ctx, dy, _dmu, _drsigma):
    x, weight, mu, rs = ctx.saved_tensors
    dx, dw, db = layer_norm_bwd(dy, x, mu, rs, weight, ctx.zc)
    return dx, dw, db, None, None, None


layer_norm_fwd.register_autograd(_ln_backward, setup_context=_ln_setup)


@torch.library.custom_op("tvmnorm::rms_norm_add_fwd", mutates_args=())
def rms_norm_add_fwd(x: Tensor, residual: Tensor, weight: Tensor, eps: float, zero_centered_gamma: bool,
                     out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """-> (y in out_dtype, h = x + residual, rsigma [rows]), y and h shaped like x."""
    return _rms_add_fwd_impl(x, residual, weight, eps, zero_centered_gamma, out_dtype)


@rms_norm_add_fwd.register_fake
def _(x, residual, weight, eps, zero_centered_gamma, out_dtype):
    _check_residual_fake("rms_norm_add", x, residual, [("weight", weight)], out_dtype)
    return (x.new_empty(x.shape, dtype=out_dtype), x.new_empty(x.shape),
            x.new_empty((_host.rows_of(x),), dtype=_host.stat_dtype(x.dtype)))


@torch.library.custom_op("tvmnorm::rms_norm_bwd_add", mutates_args=())
def rms_norm_bwd_add(dy: Tensor, dh: Tensor, h: Tensor, rsigma: Tensor, weight: Tensor,
                     zero_centered_gamma: bool) -> tuple[Tensor, Tensor]:
    """-> (dx = dh + the norm's dx, like h; dweight)."""
    return _rms_add_bwd_impl(dy, dh, h, rsigma, weight, zero_centered_gamma)


@rms_norm_bwd_add.register_fake
def _(dy, dh, h, rsigma, weight, zero_centered_gamma):
    return h.new_empty(h.shape), weight.new_empty((h.shape[-1],))


def _rms_add_setup(ctx, inputs, output):
    _, _, weight, _, zc, _ = inputs
    ctx.save_for_backward(output[1], weight, output[2])
    ctx.zc = zc


def _rms_add_backward(ctx, dy, dh, _drsigma):
    h, weight, rs = ctx.saved_tensors
    dx, dw = rms_norm_bwd_add(dy, dh, h, rs, weight, ctx.zc)
    return dx, dx, dw, None, None, None


rms_norm_add_fwd.register_autograd(_rms_add_backward, setup_context=_rms_add_setup)


@torch.library.custom_op("tvmnorm::layer_norm_add_fwd", mutates_args=())
def layer_norm_add_fwd(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, eps: float,
                       zero_centered_gamma: bool, out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> (y in out_dtype, h = x + residual, mu [rows], rsigma [rows])."""
    return _ln_add_fwd_impl(x, residual, weight, bias, eps, zero_centered_gamma, out_dtype)


@layer_norm_add_fwd.register_fake
def _(x, residual, weight, bias, eps, zero_centered_gamma, out_dtype):
    _check_residual_fake("layer_norm_add", x, residual, [("weight", weight), ("bias", bias)], out_dtype)
    sd = _host.stat_dtype(x.dtype)
    return (x.new_empty(x.shape, dtype=out_dtype), x.new_empty(x.shape), x.new_empty((_host.rows_of(x),), dtype=sd),
            x.new_empty((_host.rows_of(x),), dtype=sd))


@torch.library.custom_op("tvmnorm::layer_norm_bwd_add", mutates_args=())
def layer_norm_bwd_add(dy: Tensor, dh: Tensor, h: Tensor, mu: Tensor, rsigma: Tensor, weight: Tensor,
                       zero_centered_gamma: bool) -> tuple[Tensor, Tensor, Tensor]:
    """-> (dx = dh + the norm's dx, like h; dweight; dbias)."""
    return _ln_add_bwd_impl(dy, dh, h, mu, rsigma, weight, zero_centered_gamma)


@layer_norm_bwd_add.register_fake
def _(dy, dh, h, mu, rsigma, weight, zero_centered_gamma):
    return h.new_empty(h.shape), weight.new_empty((h.shape[-1],)), weight.new_empty((h.shape[-1],))


def _ln_add_setup(ctx, inputs, output):
    _, _, weight, _, _, zc, _ = inputs
    ctx.save_for_backward(output[1], weight, output[2], output[3])
    ctx.zc = zc


def _ln_add_backward(ctx, dy, dh, _dmu, _drsigma):
    h, weight, mu, rs = ctx.saved_tensors
    dx, dw, db = layer_norm_bwd_add(dy, dh, h, mu, rs, weight, ctx.zc)
    return dx, dx, dw, db, None, None, None


layer_norm_add_fwd.register_autograd(_ln_add_backward, setup_context=_ln_add_setup)


def _check_residual_fake(op, x, residual, weights, out_dtype, fp8: bool = False):
    """The checks the real implementation makes, on fake tensors (shapes, dtypes, devices)."""
    _check_residual(op, x, residual)
    _host.check_dtypes(op, x, weights, out_dtype, fp8)
    _host.check_x(op, x, weights)


@torch.library.custom_op("tvmnorm::rms_norm_fp8", mutates_args=())
def rms_norm_fp8_op(x: Tensor, weight: Tensor, scale: Tensor, eps: float, zero_centered_gamma: bool,
                    fp8_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    return _rms_fp8_impl(x, weight, scale, eps, zero_centered_gamma, fp8_dtype)


@rms_norm_fp8_op.register_fake
def _(x, weight, scale, eps, zero_centered_gamma, fp8_dtype):
    _host.check_dtypes("rms_norm_fp8", x, [("weight", weight)], fp8_dtype, fp8=True)
    _host.check_x("rms_norm_fp8", x, [("weight", weight)])
    return x.new_empty(x.shape, dtype=fp8_dtype), x.new_empty((1,), dtype=torch.float32)


@torch.library.custom_op("tvmnorm::layer_norm_fp8", mutates_args=())
def layer_norm_fp8_op(x: Tensor, weight: Tensor, bias: Tensor, scale: Tensor, eps: float,
                      zero_centered_gamma: bool, fp8_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    return _ln_fp8_impl(x, weight, bias, scale, eps, zero_centered_gamma, fp8_dtype)


@layer_norm_fp8_op.register_fake
def _(x, weight, bias, scale, eps, zero_centered_gamma, fp8_dtype):
    _host.check_dtypes("layer_norm_fp8", x, [("weight", weight), ("bias", bias)], fp8_dtype, fp8=True)
    _host.check_x("layer_norm_fp8", x, [("weight", weight), ("bias", bias)])
    return x.new_empty(x.shape, dtype=fp8_dtype), x.new_empty((1,), dtype=torch.float32)


@torch.library.custom_op("tvmnorm::rms_norm_add_fp8", mutates_args=())
def rms_norm_add_fp8_op(x: Tensor, residual: Tensor, weight: Tensor, scale: Tensor, eps: float,
                        zero_centered_gamma: bool, fp8_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """-> (y in fp8_dtype, h = x + residual, amax [1])."""
    return _rms_add_fp8_impl(x, residual, weight, scale, eps, zero_centered_gamma, fp8_dtype)


@rms_norm_add_fp8_op.register_fake
def _(x, residual, weight, scale, eps, zero_centered_gamma, fp8_dtype):
    _check_residual_fake("rms_norm_add_fp8", x, residual, [("weight", weight)], fp8_dtype, fp8=True)
    return x.new_empty(x.shape, dtype=fp8_dtype), x.new_empty(x.shape), x.new_empty((1,), dtype=torch.float32)


@torch.library.custom_op("tvmnorm::layer_norm_add_fp8", mutates_args=())
def layer_norm_add_fp8_op(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, scale: Tensor, eps: float,
                          zero_centered_gamma: bool, fp8_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    return _ln_add_fp8_impl(x, residual, weight, bias, scale, eps, zero_centered_gamma, fp8_dtype)


@layer_norm_add_fp8_op.register_fake
def _(x, residual, weight, bias, scale, eps, zero_centered_gamma, fp8_dtype):
    _check_residual_fake("layer_norm_add_fp8", x, residual, [("weight", weight), ("bias", bias)], fp8_dtype,
                         fp8=True)
    return x.new_empty(x.shape, dtype=fp8_dtype), x.new_empty(x.shape), x.new_empty((1,), dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Public functions.

def _check_tensor(op, name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    # the kernels take a data pointer and strides: a sparse or nested tensor has neither in that
    # sense, and failed later inside torch with messages that named neither the op nor the operand
    if t.layout is not torch.strided or t.is_nested:
        what = "a nested tensor" if t.is_nested else f"layout {t.layout}"
        raise TypeError(f"{op}: {name} must be a dense tensor (torch.strided layout), got {what}"
                        + ("" if t.is_nested else f"; pass {name}.to_dense() if a copy is acceptable"))


def _affine(op, x, weight, bias, zc, with_bias):
    """The (weight, bias) the kernel gets. A missing weight is the identity (ones, or zeros when
    zero-centred, since the kernel scales by 1 + weight then), a missing bias zeros; neither
    requires grad, so autograd drops their gradients."""
    _check_tensor(op, "x", x)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            _check_tensor(op, name, t)
    if with_bias and weight is not None and bias is not None and bias.dtype != weight.dtype:
        raise TypeError(f"{op}: weight ({weight.dtype}) and bias ({bias.dtype}) must have the same dtype: "
                        f"the kernels take gamma and beta in one dtype")
    ref = weight if weight is not None else bias
    hidden = hidden_of(x)
    wdt = ref.dtype if ref is not None else x.dtype
    dev = ref.device if ref is not None else x.device
    if weight is None:
        weight = (torch.zeros if zc else torch.ones)(hidden, dtype=wdt, device=dev)
    if with_bias and bias is None:
        bias = torch.zeros(hidden, dtype=wdt, device=dev)
    return weight, bias


def _needs_grad(*ts):
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


def rms_norm(x: Tensor, weight: Optional[Tensor], eps: float = 1e-6, *, zero_centered_gamma: bool = False,
             out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """RMSNorm over the last dimension of ``x`` (any leading shape): ``x / sqrt(mean(x**2) + eps) * g``
    with ``g = weight`` (``1 + weight`` if ``zero_centered_gamma``; ``weight=None`` means no scale).

    x and weight may be float32, float16 or bfloat16, independently (float64 when everything is,
    for gradcheck). The result has x's shape and dtype, or ``out_dtype``. Differentiable in x and
    weight; statistics are computed in fp32.
    """
    weight, _ = _affine("rms_norm", x, weight, None, zero_centered_gamma, False)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if torch.compiler.is_compiling() or x.is_meta:
        return rms_norm_fwd(x, weight, eps, zero_centered_gamma, out_dtype)[0]
    if _transform_active():
        return _RMS_T.apply(x, weight, eps, zero_centered_gamma, out_dtype)[0]
    if _needs_grad(x, weight):
        return RMSNormFunction.apply(x, weight, eps, zero_centered_gamma, out_dtype)
    return _rms_fwd_impl(x, weight, eps, zero_centered_gamma, out_dtype)[0]


def layer_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float = 1e-5, *,
               zero_centered_gamma: bool = False, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """LayerNorm over the last dimension of ``x``: ``(x - mean) / sqrt(var + eps) * g + bias`` with
    the biased variance, ``g`` as in :func:`rms_norm`; ``bias=None`` means no shift. Same dtype
    rules as :func:`rms_norm`; weight and bias share one dtype."""
    weight, bias = _affine("layer_norm", x, weight, bias, zero_centered_gamma, True)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if torch.compiler.is_compiling() or x.is_meta:
        return layer_norm_fwd(x, weight, bias, eps, zero_centered_gamma, out_dtype)[0]
    if _transform_active():
        return _LN_T.apply(x, weight, bias, eps, zero_centered_gamma, out_dtype)[0]
    if _needs_grad(x, weight, bias):
        return LayerNormFunction.apply(x, weight, bias, eps, zero_centered_gamma, out_dtype)
    return _ln_fwd_impl(x, weight, bias, eps, zero_centered_gamma, out_dtype)[0]


def rms_norm_add(x: Tensor, residual: Tensor, weight: Optional[Tensor], eps: float = 1e-6, *,
                 zero_centered_gamma: bool = False, out_dtype: Optional[torch.dtype] = None) -> tuple[Tensor, Tensor]:
    """Residual add, then RMSNorm: ``h = x + residual`` and ``y = rms_norm(h, weight, eps)``;
    returns ``(y, h)``, h the residual stream's next value (a pre-norm block's
    ``residual = x + residual; x = norm(residual)``, as vLLM's ``fused_add_rms_norm`` and Liger's
    ``LigerFusedAddRMSNorm``, out of place). x and residual share shape, dtype and device; h is
    compact in that dtype, rounded as torch's ``x + residual`` (y is the norm of that h). The
    forward is one kernel (stage fwd_add): x and residual read once, h written beside y, where
    ``rms_norm(x + residual)`` writes h and reads it back. The backward is one kernel (stage
    bwd_add): h's gradient from its other uses is added into the norm's dx as it is written,
    where autograd over ``rms_norm(x + residual)`` adds it in another pass; x and residual get
    that gradient."""
    weight, _ = _affine("rms_norm_add", x, weight, None, zero_centered_gamma, False)
    _check_tensor("rms_norm_add", "residual", residual)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if torch.compiler.is_compiling() or x.is_meta:
        return rms_norm_add_fwd(x, residual, weight, eps, zero_centered_gamma, out_dtype)[:2]
    if _transform_active():
        return _RMS_ADD_T.apply(x, residual, weight, eps, zero_centered_gamma, out_dtype)[:2]
    if _needs_grad(x, residual, weight):
        return RMSNormAddFunction.apply(x, residual, weight, eps, zero_centered_gamma, out_dtype)
    return _rms_add_fwd_impl(x, residual, weight, eps, zero_centered_gamma, out_dtype)[:2]


def layer_norm_add(x: Tensor, residual: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float = 1e-5,
                   *, zero_centered_gamma: bool = False,
                   out_dtype: Optional[torch.dtype] = None) -> tuple[Tensor, Tensor]:
    """Residual add, then LayerNorm: ``(y, h)`` with ``h = x + residual``, ``y = layer_norm(h, weight,
    bias, eps)``, as :func:`rms_norm_add`."""
    weight, bias = _affine("layer_norm_add", x, weight, bias, zero_centered_gamma, True)
    _check_tensor("layer_norm_add", "residual", residual)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if torch.compiler.is_compiling() or x.is_meta:
        return layer_norm_add_fwd(x, residual, weight, bias, eps, zero_centered_gamma, out_dtype)[:2]
    if _transform_active():
        return _LN_ADD_T.apply(x, residual, weight, bias, eps, zero_centered_gamma, out_dtype)[:2]
    if _needs_grad(x, residual, weight, bias):
        return LayerNormAddFunction.apply(x, residual, weight, bias, eps, zero_centered_gamma, out_dtype)
    return _ln_add_fwd_impl(x, residual, weight, bias, eps, zero_centered_gamma, out_dtype)[:2]


def _scale_tensor(op, scale, x):
    if not isinstance(scale, torch.Tensor):
        return torch.full((1,), float(scale), dtype=torch.float32, device=x.device)
    _check_scale(op, scale, x)
    return scale.reshape(1).to(torch.float32)


def rms_norm_fp8(x: Tensor, weight: Optional[Tensor], scale, eps: float = 1e-6, *,
                 fp8_dtype: torch.dtype = torch.float8_e4m3fn, zero_centered_gamma: bool = False):
    """RMSNorm with a fused fp8 cast, as TransformerEngine's fp8 output: returns ``(y_fp8, amax)``
    where ``y_fp8 = saturate(y * scale)`` in ``fp8_dtype`` (shaped like x) and ``amax = max|y|``
    over the whole tensor *before* scaling, an fp32 tensor of shape [1] (0 for an empty x), for
    the caller's delayed-scaling history. ``scale`` is a float or a one-element tensor.

    Forward only: the result is meant as a GEMM input, not differentiated through; where an input
    requires grad, a backward that reaches y_fp8 raises (amax never requires grad)."""
    weight, _ = _affine("rms_norm_fp8", x, weight, None, zero_centered_gamma, False)
    scale = _scale_tensor("rms_norm_fp8", scale, x)
    if torch.compiler.is_compiling() or x.is_meta:
        return rms_norm_fp8_op(x, weight, scale, eps, zero_centered_gamma, fp8_dtype)
    if _transform_active():
        return _FP8_T["rms_norm_fp8"].apply(x, weight, scale, eps, zero_centered_gamma, fp8_dtype)
    with torch.no_grad():
        out = _rms_fp8_impl(x, weight, scale, eps, zero_centered_gamma, fp8_dtype)
    return _forward_only("rms_norm_fp8", out, x, weight)


def layer_norm_fp8(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], scale, eps: float = 1e-5, *,
                   fp8_dtype: torch.dtype = torch.float8_e4m3fn, zero_centered_gamma: bool = False):
    """LayerNorm with a fused fp8 cast: ``(y_fp8, amax)`` as in :func:`rms_norm_fp8`."""
    weight, bias = _affine("layer_norm_fp8", x, weight, bias, zero_centered_gamma, True)
    scale = _scale_tensor("layer_norm_fp8", scale, x)
    if torch.compiler.is_compiling() or x.is_meta:
        return layer_norm_fp8_op(x, weight, bias, scale, eps, zero_centered_gamma, fp8_dtype)
    if _transform_active():
        return _FP8_T["layer_norm_fp8"].apply(x, weight, bias, scale, eps, zero_centered_gamma, fp8_dtype)
    with torch.no_grad():
        out = _ln_fp8_impl(x, weight, bias, scale, eps, zero_centered_gamma, fp8_dtype)
    return _forward_only("layer_norm_fp8", out, x, weight, bias)


def rms_norm_add_fp8(x: Tensor, residual: Tensor, weight: Optional[Tensor], scale, eps: float = 1e-6, *,
                     fp8_dtype: torch.dtype = torch.float8_e4m3fn, zero_centered_gamma: bool = False):
    """Residual add, then RMSNorm with the fused fp8 cast: ``(y_fp8, h, amax)`` with ``h = x +
    residual`` as in :func:`rms_norm_add` and ``y_fp8, amax`` of h's norm as in
    :func:`rms_norm_fp8` (vLLM's ``fused_add_rms_norm_static_fp8_quant``, out of place), in one
    kernel. Forward only, as :func:`rms_norm_fp8`."""
    weight, _ = _affine("rms_norm_add_fp8", x, weight, None, zero_centered_gamma, False)
    _check_tensor("rms_norm_add_fp8", "residual", residual)
    scale = _scale_tensor("rms_norm_add_fp8", scale, x)
    if torch.compiler.is_compiling() or x.is_meta:
        return rms_norm_add_fp8_op(x, residual, weight, scale, eps, zero_centered_gamma, fp8_dtype)
    if _transform_active():
        return _FP8_T["rms_norm_add_fp8"].apply(x, residual, weight, scale, eps, zero_centered_gamma, fp8_dtype)
    with torch.no_grad():
        out = _rms_add_fp8_impl(x, residual, weight, scale, eps, zero_centered_gamma, fp8_dtype)
    return _forward_only("rms_norm_add_fp8", out, x, residual, weight)


def layer_norm_add_fp8(x: Tensor, residual: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], scale,
                       eps: float = 1e-5, *, fp8_dtype: torch.dtype = torch.float8_e4m3fn,
                       zero_centered_gamma: bool = False):
    """Residual add, then LayerNorm with the fused fp8 cast: ``(y_fp8, h, amax)`` as in
    :func:`rms_norm_add_fp8`."""
    weight, bias = _affine("layer_norm_add_fp8", x, weight, bias, zero_centered_gamma, True)
    _check_tensor("layer_norm_add_fp8", "residual", residual)
    scale = _scale_tensor("layer_norm_add_fp8", scale, x)
    if torch.compiler.is_compiling() or x.is_meta:
        return layer_norm_add_fp8_op(x, residual, weight, bias, scale, eps, zero_centered_gamma, fp8_dtype)
    if _transform_active():
        return _FP8_T["layer_norm_add_fp8"].apply(x, residual, weight, bias, scale, eps, zero_centered_gamma,
                                                  fp8_dtype)
    with torch.no_grad():
        out = _ln_add_fp8_impl(x, residual, weight, bias, scale, eps, zero_centered_gamma, fp8_dtype)
    return _forward_only("layer_norm_add_fp8", out, x, residual, weight, bias)
