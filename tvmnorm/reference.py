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
           "fwd", "bwd", "stats", "fp8_quantize", "fp8_numpy_dtype", "ROW_STEP", "row_steps"]

# The kernels' default eps per norm (runtime.NormKernel uses the same).
DEFAULT_EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}
# Largest finite value of each fp8 format; outputs saturate to it.
FP8_MAX = {"fp8e4m3": 448.0, "fp8e5m2": 57344.0}


def _f64(a) -> np.ndarray:
    """Any array (numpy incl. ml_dtypes, or a CPU torch tensor) as a float64 numpy array."""
    if hasattr(a, "detach") and hasattr(a, "cpu"):  # torch.Tensor without importing torch
        import torch
        a = a.detach().cpu().to(torch.float64).numpy()
    # no copy of an array that is float64 already: the forward, stats and the checks pass theirs
    # on, and a copy of 16384 x 7168 is 940 MB
    return np.asarray(a, dtype=np.float64)


def _gamma(gamma, zero_centered_gamma: bool) -> np.ndarray:
    g = _f64(gamma)
    return g + 1.0 if zero_centered_gamma else g


# Rows a step. The arithmetic is row by row, and float64 temporaries of a whole call (16384 x
# 7168: 940 MB each, a dozen of them for the backward) cost far more in page faults than in
# arithmetic: the layernorm backward of 8192 x 7168 took 12 s at once and 0.8 s in steps of 64
# rows on the 2-core CI box. The GPU tests check every kernel against it on the host (an H100
# lease's shards took ~14 s a test, some of them at 16384 x 7168).
ROW_STEP = 64


def row_steps(rows: int):
    """Slices of ``rows`` rows, ROW_STEP at a time, in order."""
    return (slice(s, min(s + ROW_STEP, rows)) for s in range(0, rows, ROW_STEP))


def stats(norm: str, x, eps: float | None = None) -> dict:
    """Each row's ``rsigma`` and (LayerNorm, two-pass variance) ``mu``, as the forward computes
    them: what a backward is given."""
    if norm not in DEFAULT_EPS:
        raise ValueError(f"unknown norm {norm!r}")
    eps = DEFAULT_EPS[norm] if eps is None else eps
    x = _f64(x)
    out = {"rsigma": np.empty(x.shape[:-1])}
    if norm == "layernorm":
        out["mu"] = np.empty(x.shape[:-1])
    for s in row_steps(len(x)):
        xc = x[s]
        if norm == "layernorm":
            out["mu"][s] = np.mean(xc, axis=-1)
            xc = xc - out["mu"][s, None]
        out["rsigma"][s] = 1.0 / np.sqrt(np.mean(xc * xc, axis=-1) + eps)
    return out


def rmsnorm_fwd(x, gamma, eps: float = DEFAULT_EPS["rmsnorm"], zero_centered_gamma: bool = False):
    """RMSNorm forward. Returns ``(y, rsigma)``: y ``[rows, H]``, rsigma ``[rows]``."""
    x, g = _f64(x), _gamma(gamma, zero_centered_gamma)
    rsigma = stats("rmsnorm", x, eps)["rsigma"]
    y = np.empty_like(x)
    for s in row_steps(len(x)):
        y[s] = x[s] * rsigma[s, None] * g
    return y, rsigma


def layernorm_fwd(x, gamma, beta, eps: float = DEFAULT_EPS["layernorm"], zero_centered_gamma: bool = False):
    """LayerNorm forward (two-pass variance). Returns ``(y, mu, rsigma)``."""
    x, g, b = _f64(x), _gamma(gamma, zero_centered_gamma), _f64(beta)
    st = stats("layernorm", x, eps)
    y = np.empty_like(x)
    for s in row_steps(len(x)):
        y[s] = (x[s] - st["mu"][s, None]) * st["rsigma"][s, None] * g + b
    return y, st["mu"], st["rsigma"]


def _bwd(dy, x, mu, rsigma, gamma, dz, zero_centered_gamma):
    dy, x, rsigma = _f64(dy), _f64(x), _f64(rsigma)
    mu = _f64(mu) if mu is not None else None
    dz = _f64(dz) if dz is not None else None
    H = x.shape[-1]
    g = _gamma(gamma, zero_centered_gamma)
    dx, dgamma, dbeta = np.empty_like(x), np.zeros(H), np.zeros(H)
    for s in row_steps(len(x)):
        xc = x[s] - mu[s, None] if mu is not None else x[s]
        xhat = xc * rsigma[s, None]
        dyg = dy[s] * g
        corr = xhat * (np.sum(dyg * xhat, axis=-1, keepdims=True) / H)
        if mu is not None:
            corr = corr + np.sum(dyg, axis=-1, keepdims=True) / H
        dx[s] = rsigma[s, None] * (dyg - corr)
        if dz is not None:
            dx[s] += dz[s]
        dgamma += np.sum(dy[s] * xhat, axis=0)
        dbeta += np.sum(dy[s], axis=0)
    return dx, dgamma, dbeta


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
