"""Float64 reference implementations of RMSNorm and LayerNorm (numpy), the ground truth that
tests and benchmarks compare tvmnorm's kernels against.

Every function takes array-likes of any float dtype (numpy float16/32/64, ml_dtypes bfloat16, or
anything ``np.asarray`` accepts), computes in float64 and returns float64 numpy arrays. Pass the
same *rounded* inputs that the kernel sees (e.g. the bf16 x, the fp32 rsigma), so the only
difference left between kernel and reference is the kernel's own arithmetic and output rounding.

Shapes and roles follow the kernels (and TransformerEngine): ``x``, ``dy``, ``dz`` are
``[rows, hidden]``; ``gamma``, ``beta`` are ``[hidden]``; ``mu``, ``rsigma`` are ``[rows]``.

Formulas (H = hidden, g = gamma, or 1 + gamma when ``zero_centered_gamma``):

    rmsnorm    rsigma = 1 / sqrt(mean(x^2) + eps)           xhat = x * rsigma
    layernorm  mu = mean(x)                                 xhat = (x - mu) * rsigma
               rsigma = 1 / sqrt(mean((x - mu)^2) + eps)
    fwd        y = xhat * g (+ beta)
    bwd        dx = rsigma * (dy*g - [mean(dy*g)] - xhat * mean(dy*g*xhat))   ([..] LN only)
               dgamma = sum_rows(dy * xhat),  dbeta = sum_rows(dy)
    bwd_add    dx = (bwd dx) + dz

The backward functions take mu and rsigma as inputs (as the kernels do) rather than
recomputing them, so they are checked against exactly what the kernel was given.

fp8 output (:func:`fp8_quantize`): q = cast(clamp(y * scale, -MAX, MAX)) with MAX = 448 (e4m3)
or 57344 (e5m2), round to nearest even, and amax = max|y| before scaling.
"""
from __future__ import annotations

import numpy as np

__all__ = ["DEFAULT_EPS", "FP8_MAX", "rmsnorm_fwd", "layernorm_fwd", "rmsnorm_bwd", "layernorm_bwd",
           "fwd", "bwd", "fp8_quantize", "fp8_numpy_dtype"]

# The kernels' default eps per norm (runtime.NormKernel uses the same).
DEFAULT_EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}
# Largest finite value of each fp8 format; outputs saturate to it.
FP8_MAX = {"fp8e4m3": 448.0, "fp8e5m2": 57344.0}


def _f64(a) -> np.ndarray:
    """Any array (numpy incl. ml_dtypes, or a CPU torch tensor) as a float64 numpy array."""
    if hasattr(a, "detach") and hasattr(a, "cpu"):  # torch.Tensor without importing torch
        import torch
        a = a.detach().cpu().to(torch.float64).numpy()
    return np.asarray(a).astype(np.float64)


def _gamma(gamma, zero_centered_gamma: bool) -> np.ndarray:
    g = _f64(gamma)
    return g + 1.0 if zero_centered_gamma else g


def rmsnorm_fwd(x, gamma, eps: float = DEFAULT_EPS["rmsnorm"], zero_centered_gamma: bool = False):
    """RMSNorm forward. Returns ``(y, rsigma)``: y ``[rows, H]``, rsigma ``[rows]``."""
    x = _f64(x)
    rsigma = 1.0 / np.sqrt(np.mean(x * x, axis=-1) + eps)
    y = x * rsigma[:, None] * _gamma(gamma, zero_centered_gamma)
    return y, rsigma


def layernorm_fwd(x, gamma, beta, eps: float = DEFAULT_EPS["layernorm"], zero_centered_gamma: bool = False):
    """LayerNorm forward (two-pass variance). Returns ``(y, mu, rsigma)``."""
    x = _f64(x)
    mu = np.mean(x, axis=-1)
    xc = x - mu[:, None]
    rsigma = 1.0 / np.sqrt(np.mean(xc * xc, axis=-1) + eps)
    y = xc * rsigma[:, None] * _gamma(gamma, zero_centered_gamma) + _f64(beta)
    return y, mu, rsigma


def _bwd(dy, x, mu, rsigma, gamma, dz, zero_centered_gamma):
    dy, x, rsigma = _f64(dy), _f64(x), _f64(rsigma)
    H = x.shape[-1]
    xc = x - _f64(mu)[:, None] if mu is not None else x
    xhat = xc * rsigma[:, None]
    dyg = dy * _gamma(gamma, zero_centered_gamma)
    corr = xhat * (np.sum(dyg * xhat, axis=-1, keepdims=True) / H)
    if mu is not None:
        corr = corr + np.sum(dyg, axis=-1, keepdims=True) / H
    dx = rsigma[:, None] * (dyg - corr)
    if dz is not None:
        dx = dx + _f64(dz)
    dgamma = np.sum(dy * xhat, axis=0)
    return dx, dgamma, np.sum(dy, axis=0)


def rmsnorm_bwd(dy, x, rsigma, gamma, dz=None, zero_centered_gamma: bool = False):
    """RMSNorm backward from the saved rsigma. Returns ``(dx, dgamma)``; with ``dz`` (bwd_add)
    dx includes + dz."""
    dx, dgamma, _ = _bwd(dy, x, None, rsigma, gamma, dz, zero_centered_gamma)
    return dx, dgamma


def layernorm_bwd(dy, x, mu, rsigma, gamma, dz=None, zero_centered_gamma: bool = False):
    """LayerNorm backward from the saved mu and rsigma. Returns ``(dx, dgamma, dbeta)``; with
    ``dz`` (bwd_add) dx includes + dz."""
    return _bwd(dy, x, mu, rsigma, gamma, dz, zero_centered_gamma)


def fwd(norm: str, x, gamma, beta=None, eps: float | None = None, zero_centered_gamma: bool = False) -> dict:
    """Either norm's forward by name; returns a dict with ``y``, ``rsigma`` and (LayerNorm) ``mu``."""
    eps = DEFAULT_EPS[norm] if eps is None else eps
    if norm == "rmsnorm":
        y, rsigma = rmsnorm_fwd(x, gamma, eps, zero_centered_gamma)
        return {"y": y, "rsigma": rsigma}
    if norm == "layernorm":
        y, mu, rsigma = layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma)
        return {"y": y, "mu": mu, "rsigma": rsigma}
    raise ValueError(f"unknown norm {norm!r}")


def bwd(norm: str, dy, x, rsigma, gamma, mu=None, dz=None, zero_centered_gamma: bool = False) -> dict:
    """Either norm's backward by name (``dz`` given: bwd_add); returns a dict with ``dx``,
    ``dgamma`` and (LayerNorm) ``dbeta``."""
    if norm == "rmsnorm":
        dx, dgamma = rmsnorm_bwd(dy, x, rsigma, gamma, dz, zero_centered_gamma)
        return {"dx": dx, "dgamma": dgamma}
    if norm == "layernorm":
        if mu is None:
            raise ValueError("layernorm backward needs mu")
        dx, dgamma, dbeta = layernorm_bwd(dy, x, mu, rsigma, gamma, dz, zero_centered_gamma)
        return {"dx": dx, "dgamma": dgamma, "dbeta": dbeta}
    raise ValueError(f"unknown norm {norm!r}")


def fp8_numpy_dtype(otype: str):
    """The ml_dtypes numpy dtype of an fp8 otype ("fp8e4m3" or "fp8e5m2")."""
    import ml_dtypes
    return {"fp8e4m3": ml_dtypes.float8_e4m3fn, "fp8e5m2": ml_dtypes.float8_e5m2}[otype]


def fp8_quantize(y, scale, otype: str):
    """TransformerEngine's fused fp8 output: ``q = fp8(clamp(y * scale, -MAX, MAX))`` and
    ``amax = max|y|`` taken before scaling (0 for an empty y).

    Returns ``(q, amax)``: q as float64 values of the fp8 numbers (same shape as y), amax a float.
    The clamp comes first because a plain cast does not saturate (e4m3fn has no inf: ml_dtypes
    turns 1000 into NaN).
    """
    y = _f64(y)
    m = FP8_MAX[otype]
    scaled = np.clip(y * float(np.asarray(scale, dtype=np.float64).reshape(-1)[0]), -m, m)
    q = scaled.astype(fp8_numpy_dtype(otype)).astype(np.float64)
    amax = float(np.max(np.abs(y))) if y.size else 0.0
    return q, amax
