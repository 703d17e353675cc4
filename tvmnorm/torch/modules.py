"""nn.Modules over the functional ops, and ``patch_norms`` to swap them into a model.

The modules subclass torch.nn.RMSNorm / torch.nn.LayerNorm: same constructor arguments, same
parameters and state_dict keys (``weight``, ``bias``), and ``isinstance(m, torch.nn.LayerNorm)``
still holds, so code that special-cases norms (weight-decay groups, HF ``_init_weights``,
FSDP wrap policies) treats them as before. Only ``forward`` (and the zero-centred init) differ;
``forward(x, residual)`` returns ``(y, h)`` with h = x + residual normalized, as vLLM's norm
layers do (tvmnorm.torch.rms_norm_add).
"""
from __future__ import annotations

import math

import torch

from .ops import layer_norm, layer_norm_add, rms_norm, rms_norm_add


def _flatten(module, x):
    """Normalize over ``normalized_shape`` (the trailing dims) as one hidden dimension."""
    shape = tuple(module.normalized_shape)
    if tuple(x.shape[-len(shape):]) != shape or x.dim() < len(shape):
        raise ValueError(f"{type(module).__name__}: expected input with trailing shape {list(shape)}, "
                         f"got {list(x.shape)}")
    if len(shape) == 1:
        return x
    if not x.is_contiguous():
        raise ValueError(f"{type(module).__name__}: normalizing over {len(shape)} dims needs a contiguous "
                         f"input, got strides {tuple(x.stride())} for shape {tuple(x.shape)}")
    return x.view(*x.shape[:x.dim() - len(shape)], math.prod(shape))


class _ZeroCenteredGamma:
    """Zero-centred gamma stores gamma - 1: a fresh weight is zeros (scale 1), not ones."""

    def reset_parameters(self):
        super().reset_parameters()
        if self.weight is not None and getattr(self, "zero_centered_gamma", False):
            torch.nn.init.zeros_(self.weight)

    def extra_repr(self):
        return super().extra_repr() + (", zero_centered_gamma=True" if self.zero_centered_gamma else "")


class RMSNorm(_ZeroCenteredGamma, torch.nn.RMSNorm):
    """torch.nn.RMSNorm computed by tvmnorm kernels.

    ``eps=None`` means ``torch.finfo(x.dtype).eps``, as in torch. With ``zero_centered_gamma`` the
    stored weight is ``gamma - 1`` (initialised to zeros), TransformerEngine's convention.
    ``elementwise_affine=False`` registers no weight and normalizes with an identity scale.
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None,
                 zero_centered_gamma=False):
        self.zero_centered_gamma = bool(zero_centered_gamma)
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)

    def forward(self, x, residual=None):
        """``y``; with ``residual``, ``(y, h)``: h = x + residual normalized (rms_norm_add)."""
        x2 = _flatten(self, x)
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        weight = None if self.weight is None else self.weight.view(-1)
        if residual is not None:
            y, h = rms_norm_add(x2, _flatten(self, residual), weight, eps, zero_centered_gamma=self.zero_centered_gamma)
            return y.view(x.shape), h.view(x.shape)
        return rms_norm(x2, weight, eps, zero_centered_gamma=self.zero_centered_gamma).view(x.shape)


class LayerNorm(_ZeroCenteredGamma, torch.nn.LayerNorm):
    """torch.nn.LayerNorm computed by tvmnorm kernels (``bias=False`` and
    ``elementwise_affine=False`` as in torch; ``zero_centered_gamma`` as in :class:`RMSNorm`)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None,
                 zero_centered_gamma=False):
        self.zero_centered_gamma = bool(zero_centered_gamma)
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)

    def forward(self, x, residual=None):
        """``y``; with ``residual``, ``(y, h)``: h = x + residual normalized (layer_norm_add)."""
        x2 = _flatten(self, x)
        weight = None if self.weight is None else self.weight.view(-1)
        bias = None if self.bias is None else self.bias.view(-1)
        if residual is not None:
            y, h = layer_norm_add(x2, _flatten(self, residual), weight, bias, self.eps,
                                  zero_centered_gamma=self.zero_centered_gamma)
            return y.view(x.shape), h.view(x.shape)
        return layer_norm(x2, weight, bias, self.eps, zero_centered_gamma=self.zero_centered_gamma).view(x.shape)


def _replacement(m):
    # Exact types only: a subclass may have changed forward, and ours are subclasses themselves.
    if type(m) is torch.nn.RMSNorm:
        new = RMSNorm(m.normalized_shape, m.eps, m.elementwise_affine, device="meta")
    elif type(m) is torch.nn.LayerNorm:
        new = LayerNorm(m.normalized_shape, m.eps, m.elementwise_affine, bias=m.bias is not None, device="meta")
    else:
        return None
    # Carry the Parameter objects over: device, dtype, requires_grad, values, and an optimizer
    # already holding them all stay as they were.
    for name in ("weight", "bias"):
        if getattr(new, name, None) is not None:
            setattr(new, name, getattr(m, name))
    new.train(m.training)
    return new


def patch_norms(model: torch.nn.Module) -> torch.nn.Module:
    """Replace every torch.nn.RMSNorm and torch.nn.LayerNorm in ``model`` (exact types, not
    subclasses) by the tvmnorm module with the same settings and the same parameters, in place.
    Returns the model, or the replacement when ``model`` is itself such a norm. A module shared
    at several places stays shared. Hooks registered on the old modules are not carried over."""
    memo = {}

    def visit(m):
        if id(m) in memo:
            return memo[id(m)]
        new = _replacement(m)
        memo[id(m)] = new if new is not None else m
        if new is None:
            # _modules, not named_children(): that skips a module registered under a second name
            for name, child in list(m._modules.items()):
                if child is None:
                    continue
                swapped = visit(child)
                if swapped is not child:
                    setattr(m, name, swapped)
        return memo[id(m)]

    return visit(model)
