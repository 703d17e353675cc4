"""RMSNorm and LayerNorm, forward and backward, as TVM tensor expressions.

Every kernel has a symbolic int64 row count ``n`` so that one compiled function serves any
number of tokens (pass ``rows=`` for a static count: MetaSchedule tunes on one). All math is
in the key's ctype; inputs are cast up on load and outputs cast down on store.

Kernels per stage (``KERNEL_PARTS``) and their arguments, in order:

fwd        rmsnorm    x[n,H], gamma[H], (scale[1]), y[n,H], rsigma[n], (amax_row[n]), eps
           layernorm  x, gamma, beta[H], (scale), y, mu[n], rsigma, (amax_row), eps
           (scale and amax_row only when otype is fp8: y = sat(y * scale), amax_row = max|y|
           per row before scaling, as TransformerEngine's fused fp8 output does)
amax       amax_row[n] -> amax[1]                                    (fp8 fwd only)
dx         rmsnorm    dy[n,H], x, rsigma, gamma, (dz[n,H]), dx[n,H]
           layernorm  dy, x, mu, rsigma, gamma, (dz), dx            (dz only for bwd_add)
wgrad      rmsnorm    dy, x, rsigma, part[1,p,H]                    (dgamma partials)
           layernorm  dy, x, mu, rsigma, part[2,p,H]                (dgamma, dbeta partials)
finalize   part[s,p,H] -> dgamma[H] (, dbeta[H]) in wtype

dgamma/dbeta use a deterministic two-stage reduction: ``wgrad`` sums rows i = q, q+p, q+2p, ...
into partial row q (no atomics), ``finalize`` sums the p partials in a fixed order. The
partial count p is symbolic too, chosen by the runtime from the row count, so the result is
bitwise reproducible for a given input shape.
"""
from __future__ import annotations

from .._tvm import te, tirx
from ..key import TVM_DTYPE, NormKey

KERNEL_PARTS = {"fwd": ("fwd",), "fwd_fp8": ("fwd", "amax"),
                "bwd": ("dx", "wgrad", "finalize"), "bwd_add": ("dx", "wgrad", "finalize")}

# Saturating bound for each fp8 format: llvm's fp8 cast does not saturate (1000 -> -0.0156),
# CUDA's does, so the clamp is written into the expression to make both agree (and _to_fp8
# encodes subnormals itself, which llvm's cast gets wrong).
FP8_MAX = {"fp8e4m3": 448.0, "fp8e5m2": 57344.0}


# Smallest normal and subnormal step of each fp8 format.
FP8_MIN_NORMAL = {"fp8e4m3": 2.0 ** -6, "fp8e5m2": 2.0 ** -14}
FP8_SUBNORMAL_STEP = {"fp8e4m3": 2.0 ** -9, "fp8e5m2": 2.0 ** -16}


def _to_fp8(v, otype: str, dt: str):
    """Round-to-nearest-even cast of an in-range value to fp8. llvm's cast is wrong below the
    smallest normal (2^-6 * 0.75 -> 2^-6 * 0.5, 2^-6 / 8 -> 0), so subnormals are encoded
    directly: the byte is sign | nearbyint(|v| / step), and a count of 2^mantissa is the
    smallest normal, so the encoding stays exact up to the boundary."""
    av = te.abs(v)
    q = tirx.nearbyint(av * tirx.const(1.0 / FP8_SUBNORMAL_STEP[otype], dt)).astype("uint8")
    byte = q | tirx.Select(v < tirx.const(0.0, dt), tirx.const(128, "uint8"), tirx.const(0, "uint8"))
    return tirx.Select(av < tirx.const(FP8_MIN_NORMAL[otype], dt), tirx.reinterpret(TVM_DTYPE[otype], byte),
                       v.astype(TVM_DTYPE[otype]))


def parts_of(key: NormKey) -> tuple:
    return KERNEL_PARTS["fwd_fp8" if key.fp8_out else key.stage]


def _rows(rows):
    return te.var("n", "int64") if rows is None else rows


def _func(args, name):
    return te.create_prim_func(args).with_attr("global_symbol", name)


def _loaders(key: NormKey):
    c = TVM_DTYPE[key.ctype]
    zc = key.zero_centered_gamma
    up = lambda v: v.astype(c) if v.dtype != c else v  # noqa: E731
    # zero-centred gamma stores gamma - 1, so the scale is 1 + gamma, added in compute precision
    gamma = (lambda w: (lambda j: up(w[j]) + tirx.const(1.0, c))) if zc else (lambda w: (lambda j: up(w[j])))
    return c, up, gamma


def _store(stat, name):
    """The saved per-row statistic as its own copy stage. The statistic itself is a temporary
    that every thread of a row computes into a register, and one thread stores this copy: a
    row's other threads never read the global output back (no barrier orders global memory)."""
    return te.compute(stat.shape, lambda i: stat[i], name=name)


def fwd(key: NormKey, rows=None, name="fwd"):
    c, up, gamma = _loaders(key)
    H = key.hidden_size
    N = _rows(rows)
    eps = te.var("eps", c)
    x = te.placeholder((N, H), TVM_DTYPE[key.itype], name="x")
    w = te.placeholder((H,), TVM_DTYPE[key.wtype], name="gamma")
    g = gamma(w)
    xf = lambda i, j: up(x[i, j])  # noqa: E731
    inv_h = tirx.const(1.0 / H, c)
    if key.norm == "rmsnorm":
        k = te.reduce_axis((0, H), name="k")
        ss = te.compute((N,), lambda i: te.sum(xf(i, k) * xf(i, k), axis=k), name="sumsq")
        rs = te.compute((N,), lambda i: te.rsqrt(ss[i] * inv_h + eps), name="rstd")
        yf = lambda i, j: xf(i, j) * rs[i] * g(j)  # noqa: E731
        ins, stats = [x, w], [_store(rs, "rsigma")]
    else:
        b = te.placeholder((H,), TVM_DTYPE[key.wtype], name="beta")
        k1, k2 = te.reduce_axis((0, H), name="k1"), te.reduce_axis((0, H), name="k2")
        s = te.compute((N,), lambda i: te.sum(xf(i, k1), axis=k1), name="sum")
        mu = te.compute((N,), lambda i: s[i] * inv_h, name="mean")
        # two-pass variance: E[(x - mu)^2] does not cancel catastrophically like E[x^2] - mu^2
        vs = te.compute((N,), lambda i: te.sum((xf(i, k2) - mu[i]) * (xf(i, k2) - mu[i]), axis=k2),
                        name="varsum")
        rs = te.compute((N,), lambda i: te.rsqrt(vs[i] * inv_h + eps), name="rstd")
        yf = lambda i, j: (xf(i, j) - mu[i]) * rs[i] * g(j) + up(b[j])  # noqa: E731
        ins, stats = [x, w, b], [_store(mu, "mu"), _store(rs, "rsigma")]
    if not key.fp8_out:
        y = te.compute((N, H), lambda i, j: yf(i, j).astype(TVM_DTYPE[key.otype]), name="y")
        return _func(ins + [y] + stats + [eps], name)
    scale = te.placeholder((1,), "float32", name="scale")
    m = tirx.const(FP8_MAX[key.otype], c)
    y = te.compute((N, H), lambda i, j: _to_fp8(te.max(te.min(yf(i, j) * up(scale[0]), m), -m), key.otype, c),
                   name="y")
    ka = te.reduce_axis((0, H), name="ka")
    amax = te.compute((N,), lambda i: te.max(te.abs(yf(i, ka)).astype("float32"), axis=ka), name="amax_row")
    return _func(ins + [scale, y] + stats + [amax, eps], name)


def amax(rows=None, name="amax"):
    N = _rows(rows)
    row = te.placeholder((N,), "float32", name="amax_row")
    # at least one step: a TIR reduction initialises inside its loop, so a zero-extent one would
    # leave amax unwritten; the guarded step adds 0, neutral for a max of absolute values
    r = te.reduce_axis((0, tirx.max(N, 1) if isinstance(N, tirx.Var) else max(N, 1)), name="r")
    out = te.compute((1,), lambda _: te.max(te.if_then_else(r < N, row[r], tirx.const(0.0, "float32")), axis=r),
                     name="amax")
    return _func([row, out], name)


def _bwd_inputs(key: NormKey, N):
    c = TVM_DTYPE[key.ctype]
    H = key.hidden_size
    dy = te.placeholder((N, H), TVM_DTYPE[key.otype], name="dy")
    x = te.placeholder((N, H), TVM_DTYPE[key.itype], name="x")
    mu = te.placeholder((N,), c, name="mu") if key.norm == "layernorm" else None
    rs = te.placeholder((N,), c, name="rsigma")
    return dy, x, mu, rs


def dx(key: NormKey, rows=None, name="dx"):
    """dx = rsigma * (dy*g - mean(dy*g) [LN only] - xhat * mean(dy*g*xhat)) (+ dz for bwd_add)."""
    c, up, gamma = _loaders(key)
    H = key.hidden_size
    N = _rows(rows)
    dy, x, mu, rs = _bwd_inputs(key, N)
    w = te.placeholder((H,), TVM_DTYPE[key.wtype], name="gamma")
    g = gamma(w)
    inv_h = tirx.const(1.0 / H, c)
    xhat = ((lambda i, j: (up(x[i, j]) - mu[i]) * rs[i]) if mu is not None
            else (lambda i, j: up(x[i, j]) * rs[i]))
    dyg = lambda i, j: up(dy[i, j]) * g(j)  # noqa: E731
    k = te.reduce_axis((0, H), name="k")
    if mu is not None:
        k1 = te.reduce_axis((0, H), name="k1")
        c1 = te.compute((N,), lambda i: te.sum(dyg(i, k1), axis=k1), name="c1")
        # sum((dyg - mean(dyg)) * xhat) equals sum(dyg * xhat) because sum(xhat) = 0; written this
        # way c2 depends on c1, so the row's stages form one chain that the schedule can place
        # under one row loop (TVM's tuple reductions, the other way, miscompile bf16 on llvm).
        c2 = te.compute((N,), lambda i: te.sum((dyg(i, k) - c1[i] * inv_h) * xhat(i, k), axis=k), name="c2")
        corr = lambda i, j: (c1[i] + xhat(i, j) * c2[i]) * inv_h  # noqa: E731
    else:
        c2 = te.compute((N,), lambda i: te.sum(dyg(i, k) * xhat(i, k), axis=k), name="c2")
        corr = lambda i, j: xhat(i, j) * c2[i] * inv_h  # noqa: E731
    grad = lambda i, j: rs[i] * (dyg(i, j) - corr(i, j))  # noqa: E731
    extra = []
    if key.stage == "bwd_add":
        dz = te.placeholder((N, H), TVM_DTYPE[key.itype], name="dz")
        extra = [dz]
        base = grad
        grad = lambda i, j: base(i, j) + up(dz[i, j])  # noqa: E731
    out = te.compute((N, H), lambda i, j: grad(i, j).astype(TVM_DTYPE[key.itype]), name="dx")
    return _func([dy, x] + ([mu] if mu is not None else []) + [rs, w] + extra + [out], name)


def wgrad(key: NormKey, rows=None, name="wgrad"):
    c, up, _ = _loaders(key)
    H = key.hidden_size
    N = _rows(rows)
    P = te.var("p", "int64")
    dy, x, mu, rs = _bwd_inputs(key, N)
    xhat = ((lambda i, j: (up(x[i, j]) - mu[i]) * rs[i]) if mu is not None
            else (lambda i, j: up(x[i, j]) * rs[i]))
    # at least one step, so the partials are initialised (to 0, by the guard) when there are no rows
    steps = tirx.max(tirx.ceildiv(N, P), 1)  # P is symbolic, so this is an expression either way
    zero = tirx.const(0.0, c)

    t = te.reduce_axis((0, steps), name="t")
    # part[0] accumulates dgamma, part[1] (LayerNorm) dbeta: one reduction block, so dy and x
    # are read once for both (TVM's tuple reductions miscompile bf16 on llvm)
    def term(s, i, j):
        g = up(dy[i, j]) * xhat(i, j)
        return g if mu is None else te.if_then_else(s == 0, g, up(dy[i, j]))
    part = te.compute((2 if mu is not None else 1, P, H), lambda s, q, j: te.sum(te.if_then_else(
        t * P + q < N, term(s, t * P + q, j), zero), axis=t), name="part")
    return _func([dy, x] + ([mu] if mu is not None else []) + [rs, part], name)


def finalize(key: NormKey, name="finalize"):
    """dgamma[j] = sum_q part[0, q, j] (and dbeta from part[1]), cast to wtype."""
    c = TVM_DTYPE[key.ctype]
    H = key.hidden_size
    P = te.var("p", "int64")
    S = 2 if key.norm == "layernorm" else 1
    part = te.placeholder((S, P, H), c, name="part")
    outs = []
    for s, nm in zip(range(S), ("dgamma", "dbeta")):
        q = te.reduce_axis((0, P), name="q")
        acc = te.compute((H,), lambda j: te.sum(part[s, q, j], axis=q), name=f"{nm}_acc")
        outs.append(te.compute((H,), lambda j: acc[j].astype(TVM_DTYPE[key.wtype]), name=nm))
    return _func([part] + outs, name)


def kernel_funcs(key: NormKey, rows=None, prefix=None) -> dict:
    """part name -> PrimFunc for this key, global symbols ``<prefix>_<part>``."""
    prefix = prefix or key.name
    build = {"fwd": lambda n: fwd(key, rows, n), "amax": lambda n: amax(rows, n),
             "dx": lambda n: dx(key, rows, n), "wgrad": lambda n: wgrad(key, rows, n),
             "finalize": lambda n: finalize(key, n)}
    return {part: build[part](f"{prefix}_{part}") for part in parts_of(key)}
