"""`tvmnorm bench`: tvmnorm against its peers, as a fraction of the measured copy roofline.

One run benchmarks, side by side and on the same inputs:

  tvmnorm_tuned    the kernel from the loaded tuned library; a key the library has no *tuned*
                   entry for is reported as status "missing", never timed under this name
  tvmnorm_default  the default-schedule kernel, compiled through a fresh Registry with no library
                   so that it is the default even where a library exists
  torch_eager      F.rms_norm / F.layer_norm (on the CPU this is torch's CPU kernel)
  torch_compile    the same function under torch.compile(dynamic=False), compiled per shape
  liger            liger_kernel's LigerRMSNormFunction / LigerLayerNormFunction (CUDA only)

Every implementation is first checked against a float64 torch reference computed from the same
inputs (outputs poisoned with NaN first, so an unwritten element fails); a wrong one is recorded
with status "wrong" and its error and is not timed. Any exception in one implementation is
recorded as status "error" and the run goes on.

Bytes moved are counted once per tensor element that must cross memory (gamma, beta and the
per-row statistics are ignored: they are O(H + M) against O(M*H)):

  fwd       2 * M * H * size        read x, write y
  bwd       3 * M * H * size        read dy and x, write dx
  fp8 fwd   M * H * (size + 1)      read x, write one byte of y
  fwd_add   4 * M * H * size        read x and residual, write y and h
  fp8 fwd_add  M * H * (3 * size + 1)  read x and residual, write h and one byte of y

``gbps`` is bytes / median time; ``frac`` is gbps / copy_gbps, where copy_gbps comes from a
large device copy (bytes read + bytes written) timed in the same run with the same timer.
``frac_at_size`` is gbps over ``copy_at_size_gbps``, a copy of the case's own bytes (half read,
half written) timed the same way: the ceiling at that size. A 16384-token case is 16-96 MB on the
H200, where a copy of the same bytes runs well below the large copy's bandwidth (a cold call's
start and tail, and the timer's L2 flush leaving dirty lines that the call writes back).

Timing: on CUDA triton.testing.do_bench (median of per-call event timings, L2 flushed before
each call) or, without triton, CUDA events around each call after an L2 flush; on the CPU the
median of per-call wall times. Inputs are torch.randn (never zeros), and when one input set is
smaller than 4x the last-level cache, calls rotate over several input sets so that repeated
calls do not time the cache.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import fcntl
import functools
import importlib.metadata
import json
import math
import os
import pathlib
import platform
import shlex
import statistics
import subprocess
import sys
import time
import traceback
import warnings
import zlib

from .key import DTYPE_BYTES, FORWARD_STAGES, NormKey
from .shapes import DECODE_ROWS, TRAIN_TOKENS, hidden_sizes, parse_hidden, shape_of
from .shapes import shapes as catalog_shapes

REPO = pathlib.Path(__file__).resolve().parent.parent

# op name -> (norm, stage, fp8 output)
OPS = {
    "rmsnorm_fwd": ("rmsnorm", "fwd", False),
    "rmsnorm_bwd": ("rmsnorm", "bwd", False),
    "layernorm_fwd": ("layernorm", "fwd", False),
    "layernorm_bwd": ("layernorm", "bwd", False),
    "rmsnorm_fwd_fp8": ("rmsnorm", "fwd", True),
    "layernorm_fwd_fp8": ("layernorm", "fwd", True),
    # the backward with dz, the gradient reaching x around the norm (a residual's), added into dx
    "rmsnorm_bwd_add": ("rmsnorm", "bwd_add", False),
    "layernorm_bwd_add": ("layernorm", "bwd_add", False),
    # the forward of h = x + residual, h written beside y (peers: torch's add, then the norm)
    "rmsnorm_fwd_add": ("rmsnorm", "fwd_add", False),
    "layernorm_fwd_add": ("layernorm", "fwd_add", False),
    # the same with y in fp8 (rms_norm_add_fp8; vLLM's fused_add_rms_norm_static_fp8_quant)
    "rmsnorm_fwd_add_fp8": ("rmsnorm", "fwd_add", True),
    "layernorm_fwd_add_fp8": ("layernorm", "fwd_add", True),
}
# the ops a run takes unless --ops names others (the *_add ones: named)
DEFAULT_OPS = tuple(op for op, (_, stage, _) in OPS.items() if stage not in ("bwd_add", "fwd_add"))
BENCH_DTYPES = ("bf16", "fp16", "fp32")
IMPL_ORDER = ("tvmnorm_tuned", "tvmnorm_default", "torch_eager", "torch_compile", "liger")
EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}
# The fp8 scale: a power of two, so y / scale is exact and a missing or doubled scale shows.
FP8_SCALE = 2.0
FP8_MAX = {"fp8e4m3": 448.0, "fp8e5m2": 57344.0}

# ||out - ref|| / ||ref|| bounds by the output's storage dtype. Rounding one value to bf16 costs up
# to 2^-9 relative (about 2^-10 rms), fp16 2^-12, fp8 e4m3 2^-4, e5m2 2^-3; the bounds sit ~10x
# above that so a correct kernel passes and an indexing or formula bug (errors of O(1)) cannot.
TOL = {"fp32": 1e-4, "fp16": 4e-3, "bf16": 2e-2, "fp8e4m3": 1e-1, "fp8e5m2": 2e-1}
# dgamma / dbeta sum M products, in a different order and precision per implementation (quack
# scales its dgamma tolerance with sqrt(M) for the same reason). torch's CPU bf16 LayerNorm
# backward, single-threaded, was measured at 2.1% error on 300 rows (2026-11-29), so the scale
# is generous; an indexing or formula bug still gives errors of O(1).
def _wgrad_tol(dtype, rows):
    return TOL[dtype] * max(1.0, math.sqrt(rows) / 8)


RECORD_KEYS = ("op", "dtype", "hidden", "rows", "tokens", "rows_kind", "model", "what", "impl", "status",
               "us", "us_p20", "us_p80", "gbps", "copy_gbps", "frac", "copy_at_size_gbps", "frac_at_size",
               "bytes", "err", "tol", "n_sets", "origin", "setup_s", "error")
# written since the fifth H200 lease: files from before it lack them and are still valid
LATER_KEYS = ("copy_at_size_gbps", "frac_at_size")


class Skip(Exception):
    """This implementation does not apply here (status "skipped" or "missing")."""

    def __init__(self, msg, status="skipped"):
        super().__init__(msg)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    dtype: str
    hidden: int
    rows: int
    tokens: int
    rows_kind: str   # train | decode | tokens
    model: str
    what: str
    fp8_format: str = "fp8e4m3"

    @property
    def norm(self):
        return OPS[self.op][0]

    @property
    def stage(self):
        return OPS[self.op][1]

    @property
    def fp8(self):
        return OPS[self.op][2]

    @property
    def ln(self):
        return self.norm == "layernorm"

    @property
    def eps(self):
        return EPS[self.norm]

    def key(self) -> NormKey:
        otype = self.fp8_format if self.fp8 else self.dtype
        return NormKey(norm=self.norm, stage=self.stage, itype=self.dtype, wtype=self.dtype, otype=otype,
                       hidden_size=self.hidden)

    @property
    def bytes(self) -> int:
        m, h, s = self.rows, self.hidden, DTYPE_BYTES[self.dtype]
        if self.fp8:
            return m * h * ((3 if self.stage == "fwd_add" else 1) * s + 1)
        return {"fwd": 2, "bwd": 3, "bwd_add": 4, "fwd_add": 4}[self.stage] * m * h * s

    @property
    def forward(self) -> bool:
        return self.stage in FORWARD_STAGES


def _torch():
    import torch
    return torch


def torch_dtype(name):
    torch = _torch()
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
            "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}[name]


# ----------------------------------------------------------------------------------------------
# inputs and the float64 reference

def make_set(case: Case, device, gen):
    """One input set: fresh random data (never zeros), plus float64 stats for bwd."""
    torch = _torch()
    dt = torch_dtype(case.dtype)
    M, H = case.rows, case.hidden
    rnd = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float32, device=device).to(dt)  # noqa: E731
    s = {"x": rnd(M, H), "gamma": rnd(H)}
    if case.ln:
        s["beta"] = rnd(H)
    if case.stage == "fwd_add":
        s["residual"] = rnd(M, H)
    if case.stage in ("bwd", "bwd_add"):
        s["dy"] = rnd(M, H)
        if case.stage == "bwd_add":
            s["dz"] = rnd(M, H)
        xd = s["x"].double()
        if case.ln:
            mu = xd.mean(-1)
            s["mu"] = mu.float()
            s["rsigma"] = torch.rsqrt(((xd - mu[:, None]) ** 2).mean(-1) + case.eps).float()
        else:
            s["rsigma"] = torch.rsqrt((xd * xd).mean(-1) + case.eps).float()
    if case.fp8:
        s["scale"] = torch.full((1,), FP8_SCALE, dtype=torch.float32, device=device)
    return s


def set_bytes(case: Case, s) -> int:
    """Bytes one call touches: its inputs plus outputs of the same size as x."""
    nin = sum(t.numel() * t.element_size() for t in s.values())
    out = case.rows * case.hidden * (1 if case.fp8 else DTYPE_BYTES[case.dtype])
    return nin + out


def reference(case: Case, s) -> dict:
    """float64 torch on the same inputs (autograd for bwd)."""
    torch = _torch()
    F = torch.nn.functional
    H = case.hidden
    x, g = s["x"].double(), s["gamma"].double()
    b = s["beta"].double() if case.ln else None
    if case.forward:
        # fwd_add: the norm of h = x + residual as torch's add rounds it, which h must equal
        h = (s["x"] + s["residual"]).double() if case.stage == "fwd_add" else None
        x = x if h is None else h
        with torch.no_grad():
            if case.ln:
                y = F.layer_norm(x, (H,), g, b, case.eps)
                mu = x.mean(-1)
                rs = torch.rsqrt(((x - mu[:, None]) ** 2).mean(-1) + case.eps)
                out = {"y": y, "mu": mu, "rsigma": rs}
            else:
                y = F.rms_norm(x, (H,), g, case.eps)
                out = {"y": y, "rsigma": torch.rsqrt((x * x).mean(-1) + case.eps)}
        if case.fp8:
            out["amax"] = y.abs().max().reshape(1)
        if h is not None:
            out["h"] = h
        return out
    x.requires_grad_(True)
    g.requires_grad_(True)
    leaves = (x, g)
    if case.ln:
        b.requires_grad_(True)
        leaves = (x, g, b)
        y = F.layer_norm(x, (H,), g, b, case.eps)
    else:
        y = F.rms_norm(x, (H,), g, case.eps)
    grads = [t.detach() for t in torch.autograd.grad(y, leaves, s["dy"].double())]
    if case.stage == "bwd_add":
        grads[0] = grads[0] + s["dz"].double()
    return dict(zip(("dx", "dgamma", "dbeta"), grads))


def check(case: Case, out: dict, ref: dict):
    """(worst err/tol ratio's err, its tol, message or None). Every output the impl returns is
    compared; NaN or inf anywhere (including the NaN poison left in an unwritten element) fails."""
    torch = _torch()
    worst, problems = (0.0, 0.0, 0.0), []
    for name, got in out.items():
        want = ref[name]
        g = got.detach().to(device=want.device, dtype=torch.float64)
        if case.fp8 and name == "y":
            g = g / FP8_SCALE
        if name in ("rsigma", "mu"):
            tol = TOL["fp32"]
        elif name == "y":
            tol = TOL[case.fp8_format if case.fp8 else case.dtype]
        elif name == "amax":
            tol = TOL[case.dtype]
        elif name in ("dgamma", "dbeta"):
            tol = _wgrad_tol(case.dtype, case.rows)
        else:
            tol = TOL[case.dtype]
        if g.shape != want.shape:
            problems.append(f"{name}: shape {tuple(g.shape)} != {tuple(want.shape)}")
            continue
        if not bool(torch.isfinite(g).all()):
            bad = int((~torch.isfinite(g)).sum())
            problems.append(f"{name}: {bad} of {g.numel()} elements are NaN/inf (unwritten or overflow)")
            worst = (float("inf"), tol, float("inf"))
            continue
        err = float((g - want).norm() / want.norm().clamp_min(1e-300))
        if err > tol:
            problems.append(f"{name}: rel err {err:.3g} > tol {tol:.3g}")
        if err / tol > worst[2]:
            worst = (err, tol, err / tol)
    return worst[0], worst[1], ("; ".join(problems) or None)


# ----------------------------------------------------------------------------------------------
# implementations: builder(ctx, case, sets) -> Prepared, or raise Skip

@dataclasses.dataclass
class Prepared:
    calls: list                 # calls[i]() runs on input set i and returns {output name: tensor}
    poison: object = None       # poison(i) fills set i's caller-allocated outputs with NaN
    origin: str = ""


def _tvm_outputs(case: Case, device):
    torch = _torch()
    M, H = case.rows, case.hidden
    dt = torch_dtype(case.dtype)
    if case.forward:
        o = {"y": torch.empty(M, H, dtype=torch_dtype(case.fp8_format) if case.fp8 else dt, device=device),
             "rsigma": torch.empty(M, dtype=torch.float32, device=device)}
        if case.stage == "fwd_add":
            o["h"] = torch.empty(M, H, dtype=dt, device=device)
        if case.ln:
            o["mu"] = torch.empty(M, dtype=torch.float32, device=device)
        if case.fp8:
            o["amax"] = torch.empty(1, dtype=torch.float32, device=device)
        return o
    o = {"dx": torch.empty(M, H, dtype=dt, device=device), "dgamma": torch.empty(H, dtype=dt, device=device)}
    if case.ln:
        o["dbeta"] = torch.empty(H, dtype=dt, device=device)
    return o


def _tvm_prepared(kernel, case: Case, sets, device) -> Prepared:
    from .runtime import signature
    names = signature(case.key())
    # On the CPU every call writes the same outputs, as a peer's do: torch allocates them per call
    # and its allocator hands back the memory the last call freed, still in cache. Outputs of
    # their own a set left each call writing lines of cold memory: the layernorm fwd fp32 768 x
    # 1024 kernel took 283 us against torch eager's 192 that way, and 164 against 209 with one
    # output set (session 65). CUDA's timer flushes L2 before each call, so there each set keeps
    # its own outputs, as in every GPU result.
    outs = ([_tvm_outputs(case, device) for _ in sets] if device != "cpu"
            else [_tvm_outputs(case, device)] * len(sets))
    eps = case.eps if case.forward else None

    def make(i):
        arrays = [sets[i][n] if n in sets[i] else outs[i][n] for n in names]
        o = outs[i]
        if eps is None:
            return lambda: (kernel(*arrays), o)[1]
        return lambda: (kernel(*arrays, eps=eps), o)[1]

    def poison(i):
        for t in outs[i].values():
            t.fill_(float("nan"))

    return Prepared([make(i) for i in range(len(sets))], poison, kernel.origin)


def build_tvmnorm_tuned(ctx, case, sets):
    lib = ctx.tuned_library()
    if lib is None:
        raise Skip(f"no tuned library for {ctx.kind} ({ctx.library_note})", "missing")
    kernel = lib.kernel(case.key())
    if kernel is None:
        raise Skip(f"key {case.key().name} is not in the library {lib.path}", "missing")
    if not kernel.tuned:
        raise Skip(f"the library's entry for {case.key().name} is the default schedule ({kernel.origin})",
                   "missing")
    return _tvm_prepared(kernel, case, sets, ctx.device)


def build_tvmnorm_default(ctx, case, sets):
    from .runtime import FallbackWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        kernel = ctx.default_registry().get(case.key(), ctx.kind)
    if kernel.tuned:  # cannot happen with no library; guards the impl's name
        raise RuntimeError("default registry returned a tuned kernel")
    return _tvm_prepared(kernel, case, sets, ctx.device)


def eager_norm(ln: bool, hidden: int, eps: float):
    """torch's own norm as (x, gamma[, beta]) -> y (bench/host_overhead.py times it too)."""
    F = _torch().nn.functional
    if ln:
        return lambda x, g, b: F.layer_norm(x, (hidden,), g, b, eps)
    return lambda x, g: F.rms_norm(x, (hidden,), g, eps)


def liger_norm(ln: bool, eps: float):
    """Liger's norm as (x, gamma[, beta]) -> y; ImportError without liger_kernel."""
    if ln:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        return lambda x, g, b: LigerLayerNormFunction.apply(x, g, b, eps)
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    # offset 0, Llama casting (Liger's default), and not in place: in-place backward would
    # overwrite dy with dx, so every later call would see different data
    return lambda x, g: LigerRMSNormFunction.apply(x, g, eps, 0.0, "llama", False)


def liger_add_rms_norm(eps: float):
    """Liger's fused add + RMSNorm (LigerFusedAddRMSNorm's function: the add inside its forward
    kernel) as (x, residual, gamma) -> (y, h); ImportError without it."""
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    # as the module calls it: offset 0, Llama casting, not in place
    return lambda x, r, g: LigerFusedAddRMSNormFunction.apply(x, r, g, eps, 0.0, "llama", False)


def _torch_fn(case: Case):
    """The eager function of (x, gamma[, beta]) -> outputs; for fp8, the unfused recipe
    (norm, amax of y, scale, saturate, cast) that a torch user writes."""
    norm = eager_norm(case.ln, case.hidden, case.eps)
    if case.fp8:
        fdt, m, plain = torch_dtype(case.fp8_format), FP8_MAX[case.fp8_format], norm

        def norm(*a):
            scale = a[-1]
            y = plain(*a[:-1]).float()
            return (y * scale).clamp(-m, m).to(fdt), y.abs().amax().reshape(1)
    if case.stage == "fwd_add":
        def add_norm(x, r, *rest):
            h = x + r
            out = norm(h, *rest)
            return (*out, h) if case.fp8 else (out, h)
        return add_norm
    return norm


def _torch_prepared(fn, case: Case, sets) -> Prepared:
    torch = _torch()
    wnames = ["gamma", "beta"] if case.ln else ["gamma"]
    if case.forward:
        # _torch_fn's results in order: y, then amax (fp8), then h (fwd_add)
        names = ["y"] + ["amax"] * case.fp8 + ["h"] * (case.stage == "fwd_add")

        def make(s):
            rows = [s["x"]] + ([s["residual"]] if case.stage == "fwd_add" else [])
            args = rows + [s[n] for n in wnames] + ([s["scale"]] if case.fp8 else [])

            def call():
                with torch.no_grad():
                    out = fn(*args)
                return dict(zip(names, out if len(names) > 1 else (out,)))
            return call
        return Prepared([make(s) for s in sets])

    def make_bwd(s):
        # the forward runs once, outside the timed region; each call is one backward through the
        # saved graph (retain_graph keeps it for the next call)
        leaves = [s["x"].detach().requires_grad_(True)] + [s[n].detach().requires_grad_(True) for n in wnames]
        y = fn(*leaves)
        dy = s["dy"]
        names = ["dx", "dgamma", "dbeta"][:len(leaves)]
        if case.stage == "bwd_add":
            # x's gradient from around the norm too, as autograd sums it where x is used twice
            # (h = x + residual feeding the norm and the residual stream): dy for y, dz for x
            outs, grads = (y, leaves[0]), (dy, s["dz"])
        else:
            outs, grads = y, dy

        def call():
            return dict(zip(names, torch.autograd.grad(outs, leaves, grads, retain_graph=True)))
        return call
    return Prepared([make_bwd(s) for s in sets])


def build_torch_eager(ctx, case, sets):
    return _torch_prepared(_torch_fn(case), case, sets)


def build_torch_compile(ctx, case, sets):
    torch = _torch()
    import torch._dynamo
    # one compile per shape: reset so earlier shapes' graphs neither count against the
    # recompile limit (past which dynamo silently runs eager) nor guard this one
    torch._dynamo.reset()
    fn = torch.compile(_torch_fn(case), dynamic=False)
    p = _torch_prepared(fn, case, sets)
    p.origin = "inductor"
    return p


def build_liger(ctx, case, sets):
    if ctx.kind != "cuda":
        raise Skip("Liger kernels are Triton GPU kernels; no CPU path")
    if case.fp8:
        raise Skip("Liger has no fused fp8-output norm")
    if case.stage == "bwd_add":
        raise Skip("Liger has no backward-with-add of a norm alone (bench/add_norm.py times its fused add + "
                   "RMSNorm)")
    if case.stage == "fwd_add" and case.ln:
        raise Skip("Liger has no fused add + LayerNorm")
    try:
        fn = liger_add_rms_norm(case.eps) if case.stage == "fwd_add" else liger_norm(case.ln, case.eps)
    except ImportError as e:
        raise Skip(f"liger_kernel is not installed ({e})") from None
    p = _torch_prepared(fn, case, sets)
    p.origin = "liger_kernel " + _version("liger-kernel")
    return p


IMPLS = {
    "tvmnorm_tuned": build_tvmnorm_tuned,
    "tvmnorm_default": build_tvmnorm_default,
    "torch_eager": build_torch_eager,
    "torch_compile": build_torch_compile,
    "liger": build_liger,
}


# ----------------------------------------------------------------------------------------------
# timing

def _quantiles(ts):
    ts = sorted(ts)
    q = lambda p: ts[min(len(ts) - 1, max(0, round(p * (len(ts) - 1))))]  # noqa: E731
    return statistics.median(ts), q(0.2), q(0.8)


class HostLock:
    """Keeps timing apart from CPU-heavy setup in other bench processes on the same host (one
    per GPU in bench/h200.sh): setup (inputs, the float64 reference, JIT and Inductor compiles,
    the refcheck call) holds a shared flock on ``path``, timing an exclusive one. A kernel
    launched from Python (Liger, torch.compile) is timed with its launch cost: on an H200 lease,
    with Inductor compiling in the other GPU's process, Liger's rmsnorm fwd at 2048 measured
    0.22 of copy bandwidth against 0.73 alone. Without a path it does nothing."""

    def __init__(self, path=None):
        self.path = path

    @contextlib.contextmanager
    def _hold(self, mode):
        if not self.path:
            yield
            return
        with open(self.path, "a+") as f:
            fcntl.flock(f, mode)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def setup(self):
        return self._hold(fcntl.LOCK_SH)

    def timing(self):
        return self._hold(fcntl.LOCK_EX)


class Timer:
    """Median (and 20th/80th percentile) microseconds of one call of ``fn(i)`` cycling i over the
    input sets."""

    ROUNDS = 5

    def __init__(self, kind, warmup_ms, rep_ms):
        self.kind, self.warmup_ms, self.rep_ms = kind, warmup_ms, rep_ms
        self.method = (f"cpu wall clock (time.perf_counter per call): median of each of {self.ROUNDS} rounds, "
                       f"best round reported")
        if kind == "cuda":
            try:
                import triton.testing  # noqa: F401
                self.method = "triton.testing.do_bench, median (L2 flushed before each call)"
            except ImportError:
                self.method = "CUDA events per call after an L2 flush, median"

    def __call__(self, calls) -> tuple:
        n = len(calls)
        state = [0]

        def step():
            c = calls[state[0] % n]
            state[0] += 1
            c()
        if self.kind == "cuda":
            return self._cuda(step)
        return self._cpu(step)

    def _cpu(self, step):
        # Five rounds, each a median of per-call times; the best round is reported. On this
        # 2-core VM, torch's OpenMP calls in a process that has also run TVM's thread pool stall
        # in streaks for whole multiples of 16 ms (seen 2026-11-29, not with torch alone);
        # a streak spoils one round's median, not all five.
        t_end = time.perf_counter() + self.warmup_ms / 1e3
        step()
        while time.perf_counter() < t_end:
            step()
        best = None
        for _ in range(self.ROUNDS):
            ts, t_end = [], time.perf_counter() + self.rep_ms / 1e3 / self.ROUNDS
            while len(ts) < 5 or (time.perf_counter() < t_end and len(ts) < 100000):
                t0 = time.perf_counter()
                step()
                ts.append(time.perf_counter() - t0)
            q = _quantiles(ts)
            if best is None or q[0] < best[0]:
                best = q
        return tuple(v * 1e6 for v in best)

    def _cuda(self, step):
        torch = _torch()
        try:
            from triton.testing import do_bench
        except ImportError:
            do_bench = None
        if do_bench is not None:
            r = do_bench(step, warmup=self.warmup_ms, rep=self.rep_ms, quantiles=[0.5, 0.2, 0.8])
            return tuple(v * 1e3 for v in r)
        flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
        step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        while (time.perf_counter() - t0) * 1e3 < self.warmup_ms:
            step()
            torch.cuda.synchronize()
        ts, t0 = [], time.perf_counter()
        while len(ts) < 10 or (time.perf_counter() - t0) * 1e3 < self.rep_ms:
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        return tuple(v * 1e3 for v in _quantiles(ts))


@functools.lru_cache(maxsize=None)
def probe_timer() -> Timer:
    """The GPU probes' timer (bench/gpu_probe.py, bench/bwd_parts.py): the bench's CUDA timer,
    made on first use (it imports triton)."""
    return Timer("cuda", warmup_ms=25, rep_ms=100)


def probe_parser():
    """The GPU probes' shared arguments: --out (the folder their JSON goes to; made if missing),
    --hidden and --norms (the keys they walk, the catalog's widths by default)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".", type=_made_dir)
    ap.add_argument("--hidden", default=",".join(map(str, hidden_sizes())))
    ap.add_argument("--norms", default="rmsnorm,layernorm")
    return ap


def _made_dir(path: str) -> str:
    pathlib.Path(path).mkdir(parents=True, exist_ok=True)
    return path


def probe_us(fn) -> float:
    """Median microseconds of one call of ``fn()`` by probe_timer()."""
    return probe_timer()([fn])[0]


def backward_inputs(key, rows: int) -> tuple:
    """Fresh random inputs of one CUDA backward call of ``key`` (a NormKey, stage bwd or
    bwd_add) at ``rows``: (dy, x, stats, gamma, adds), dy and x in its itype, its fp32 statistics
    as a list (layernorm's mu, then rsigma, kept away from zero), gamma in its wtype, and the
    list of what its dx kernel takes after gamma (bwd_add's dz, the residual stream's gradient;
    none for bwd), for the probes that time the library's parts (tune.dx_call_us,
    bench/bwd_parts.py)."""
    torch = _torch()
    h = key.hidden_size
    dy, x, *adds = (torch.randn(rows, h, device="cuda").to(torch_dtype(key.itype))
                    for _ in range(3 if key.stage == "bwd_add" else 2))
    stats = ([torch.randn(rows, device="cuda")] if key.column_sums == 2 else []) + [torch.rand(rows, device="cuda") + 0.5]
    return dy, x, stats, torch.randn(h, device="cuda").to(torch_dtype(key.wtype)), adds


def probe_meta(copy_gbps: float) -> dict:
    """What a GPU probe script (bench/gpu_probe.py, bench/bwd_parts.py) records beside its
    numbers: the device, the versions, the kernel sources' hash (it names the tree: a device
    copy's git metadata can be stale) and the copy ceiling of the same run."""
    torch = _torch()
    from ._tvm import FFI_VERSION, TVM_VERSION
    from .build import source_hash
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "tvm": TVM_VERSION, "tvm_ffi": FFI_VERSION, "tvmnorm_source_hash": source_hash(),
            "copy_gbps": copy_gbps}


def start_cuda_probe(ap) -> tuple:
    """A CUDA probe's start: (``ap``'s arguments, probe_timer(), the copy ceiling measured with
    it (copy_roofline), a CUDA generator seeded 0 for its fresh random data)."""
    args = ap.parse_args()
    timer = probe_timer()
    return args, timer, copy_roofline("cuda", timer), _torch().Generator(device="cuda").manual_seed(0)


def time_in_rounds(calls: dict, timer, rounds: int) -> dict:
    """name -> the fastest of ``rounds`` timings of ``calls[name]()`` (microseconds, ``timer``'s),
    the calls timed in turn each round: a slow spell of the machine spoils one round of each
    call, not every round of one."""
    best = {}
    for _ in range(rounds):
        for name, call in calls.items():
            best[name] = min(best.get(name, float("inf")), timer([call])[0])
    return best


def relative_max_error(got, want) -> float:
    """max |got - want| / (1 + |want|) over the elements, in float64: a NaN (a read outside
    the operand) stays NaN."""
    return float(((got.double() - want).abs() / (1 + want.abs())).max())


def write_probe(out, name: str, roof: dict, records: list, what: str, **meta) -> pathlib.Path:
    """A probe's ``<out>/<name>`` JSON: probe_meta, the copy ceiling measured (copy_roofline's
    ``roof``), what the probe measures and ``meta`` beside its ``records``."""
    path = pathlib.Path(out) / name
    result = {"meta": {**probe_meta(roof["copy_gbps"]), **roof, "what": what, **meta}, "records": records}
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}; {sum(not r.get('ok', True) for r in records)} records not ok")
    return path


def copy_roofline(kind, timer, nbytes=None, sets: int = 1) -> dict:
    """A device copy (dst.copy_(src)) of ``nbytes`` each way (default: large), bytes read +
    written over median time; with ``sets``, the calls rotate over that many copies, as a
    case's calls rotate over its input sets."""
    torch = _torch()
    device = "cuda" if kind == "cuda" else "cpu"
    if nbytes is None:
        nbytes = (2 << 30) if kind == "cuda" else (512 << 20)
    n = max(1, nbytes // 2)
    pairs = []
    for _ in range(sets):
        src = torch.randn(n, dtype=torch.float32, device=device).to(torch.bfloat16)
        pairs.append((torch.empty_like(src), src))
    us, p20, p80 = timer([lambda d=d, s=s: d.copy_(s) for d, s in pairs])
    if kind == "cuda":
        torch.cuda.synchronize()
    gbps = 2 * n * 2 / (us * 1e-6) / 1e9
    return {"copy_gbps": gbps, "copy_bytes_each_way": n * 2, "copy_us": us, "copy_us_p20": p20,
            "copy_us_p80": p80, "copy_what": f"{device} bf16 dst.copy_(src), {n * 2 / 2**30:.2f} GiB each way, "
                                               f"bytes = read + write"}


# ----------------------------------------------------------------------------------------------
# provenance

def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args):
    try:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _last_level_cache_bytes(kind) -> int:
    if kind == "cuda":
        torch = _torch()
        props = torch.cuda.get_device_properties(0)
        return int(getattr(props, "L2_cache_size", 0) or 60 << 20)  # H200: 60 MB
    best = 0
    for d in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            s = (d / "size").read_text().strip()
            v = int(s[:-1]) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[s[-1]] if s[-1] in "KMG" else int(s)
            best = max(best, v)
        except (OSError, ValueError, KeyError):
            pass
    return best or (32 << 20)


def _device_name(kind) -> str:
    if kind == "cuda":
        torch = _torch()
        return torch.cuda.get_device_name(0)
    name = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} ({os.cpu_count()} logical cores)"


def meta_header(args, kind, timer, roof, library_info) -> dict:
    torch = _torch()
    commit = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    from .build import source_hash
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "tvm": _version("apache-tvm"), "tvm_ffi": _version("apache-tvm-ffi"),
                "triton": _version("triton"), "liger_kernel": _version("liger-kernel"),
                "numpy": _version("numpy"), "tvmnorm": _version("tvmnorm")}
    try:
        from ._tvm import FFI_VERSION, TVM_VERSION
        versions["tvm"], versions["tvm_ffi"] = TVM_VERSION, FFI_VERSION
    except ImportError:
        pass
    if kind == "cuda":
        versions["cuda"] = torch.version.cuda
    env = {k: os.environ[k] for k in ("TVMNORM_LIBRARY", "TVMNORM_CACHE", "CUDA_VISIBLE_DEVICES",
                                      "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "TVM_NUM_THREADS", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_") if k in os.environ}
    return {
        "device": _device_name(kind), "target": kind, "versions": versions,
        "git_commit": commit, "git_dirty": dirty, "tvmnorm_source_hash": source_hash(),
        "command_line": shlex.join(sys.argv), "repro": repro_command(args, commit, env),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": platform.node(), "torch_threads": torch.get_num_threads(), "env": env,
        "timing": timer.method, "warmup_ms": timer.warmup_ms, "rep_ms": timer.rep_ms,
        "last_level_cache_bytes": _last_level_cache_bytes(kind), **roof,
        "bytes_model": {"fwd": "2*M*H*size (read x, write y)", "bwd": "3*M*H*size (read dy, x; write dx)",
                        "bwd_add": "4*M*H*size (read dy, x, dz; write dx)",
                        "fwd_add": "4*M*H*size (read x, residual; write y, h)",
                        "fwd_fp8": "M*H*(size+1) (read x, write fp8 y)",
                        "fwd_add_fp8": "M*H*(3*size+1) (read x, residual; write h, fp8 y)"},
        "frac": "gbps / copy_gbps", "refcheck": bool(args.refcheck),
        "tolerances": {"rel_l2": TOL, "dgamma_dbeta": "tol * max(1, sqrt(rows)/8)"},
        "library": library_info, "fp8_format": args.fp8_format, "fp8_scale": FP8_SCALE,
        "train_tokens": TRAIN_TOKENS, "decode_tokens": list(DECODE_ROWS),
    }


def repro_command(args, commit, env) -> str:
    parts = ["tvmnorm", "bench", "--target", args.target, "--ops", args.ops, "--dtypes", args.dtypes]
    if args.hidden:
        parts += ["--hidden", args.hidden]
    else:
        parts += ["--shapes", args.shapes]
    parts += ["--rows", args.rows, "--impls", args.impls, "--seed", str(args.seed),
              "--fp8-format", args.fp8_format, "--warmup-ms", str(args.warmup_ms), "--rep-ms", str(args.rep_ms),
              "--max-sets", str(args.max_sets)]
    if getattr(args, "rounds", 1) > 1:
        parts += ["--rounds", str(args.rounds)]
    if args.library:
        parts += ["--library", args.library]
    if not args.refcheck:
        parts.append("--no-refcheck")
    cmd = shlex.join(parts)
    envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    pre = f"git checkout {commit} && " if commit else ""
    return pre + (envs + " " if envs else "") + cmd


# ----------------------------------------------------------------------------------------------
# the run

class Context:
    def __init__(self, kind, library):
        self.kind = kind
        self.device = "cuda" if kind == "cuda" else "cpu"
        self._library_arg = library
        self._tuned = None
        self._tuned_loaded = False
        self._default_reg = None
        self.library_note = ""

    def tuned_library(self):
        if not self._tuned_loaded:
            from .runtime import Registry, default_library_path
            self._tuned_loaded = True
            path = self._library_arg or str(default_library_path(self.kind))
            try:
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    if self._library_arg:
                        reg = Registry()
                        reg.set_library(self.kind, self._library_arg)
                        self._tuned = reg.library(self.kind)
                    else:
                        self._tuned = Registry().library(self.kind)
                self.library_note = "; ".join(str(x.message) for x in w) or (
                    f"loaded {path}" if self._tuned else f"no library at {path}")
            except ValueError as e:
                self._tuned, self.library_note = None, str(e)
        return self._tuned

    def library_info(self) -> dict:
        lib = self.tuned_library()
        info = {"note": self.library_note, "path": str(lib.path) if lib else None}
        if lib is not None:
            m = lib.manifest
            info.update({k: m.get(k) for k in ("target", "arch", "tvm_version", "ffi_version",
                                                "tvmnorm_source_hash", "sha256")})
            info["kernels"] = len(lib.kernels)
            info["tuned_kernels"] = sum(1 for e in lib.kernels.values() if e.get("origin") == "tuned")
            # which record each key ran (tune accept --previous counts a measurement only for it)
            info["records"] = {str(k): e.get("record") for k, e in lib.kernels.items()}
        return info

    def default_registry(self):
        if self._default_reg is None:
            from .runtime import Registry
            self._default_reg = Registry()
            self._default_reg.set_library(self.kind, None)
        return self._default_reg


def _csv_list(s):
    return [v.strip() for v in str(s).split(",") if v.strip()]


def make_cases(args) -> list:
    ops = _csv_list(args.ops)
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise SystemExit(f"unknown op(s) {bad}; choose from {list(OPS)}")
    dtypes = _csv_list(args.dtypes)
    bad = [d for d in dtypes if d not in BENCH_DTYPES]
    if bad:
        raise SystemExit(f"unknown dtype(s) {bad}; choose from {list(BENCH_DTYPES)}")
    try:
        shapes = [shape_of(h) for h in parse_hidden(args.hidden)] if args.hidden else catalog_shapes(args.shapes)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    tokens = []
    for r in _csv_list(args.rows):
        if r == "train":
            tokens.append((TRAIN_TOKENS, "train"))
        elif r == "decode":
            tokens += [(t, "decode") for t in DECODE_ROWS]
        else:
            try:
                count = int(r)
            except ValueError:
                count = 0
            if count < 1:
                raise SystemExit(f"--rows takes train, decode or token counts of at least 1, got {r!r}")
            tokens.append((count, "tokens"))
    out = []
    for op in ops:
        for dt in dtypes:
            for t, kind in tokens:
                for s in shapes:
                    out.append(Case(op, dt, s.hidden, s.rows(t), t, kind, s.model, s.what, args.fp8_format))
    return list(dict.fromkeys(out))


def _record(case: Case, impl, status, **kw) -> dict:
    r = {"op": case.op, "dtype": case.dtype, "hidden": case.hidden, "rows": case.rows, "tokens": case.tokens,
         "rows_kind": case.rows_kind, "model": case.model, "what": case.what, "impl": impl, "status": status,
         "us": None, "us_p20": None, "us_p80": None, "gbps": None, "copy_gbps": None, "frac": None,
         "copy_at_size_gbps": None, "frac_at_size": None, "bytes": case.bytes, "err": None, "tol": None,
         "n_sets": None, "origin": None, "setup_s": None, "error": None}
    r.update(kw)
    return r


def _rates(nbytes: int, us: float, copy_gbps: float, at_size: float | None) -> dict:
    """gbps of ``nbytes`` moved in ``us``, and its fractions of the run's copy ceiling (frac) and
    of the copy of the case's own size (frac_at_size, where measured)."""
    gbps = nbytes / (us * 1e-6) / 1e9
    return {"gbps": gbps, "frac": gbps / copy_gbps, **({"frac_at_size": gbps / at_size} if at_size else {})}


def fastest_round(times):
    """(us, p20, p80) of the round with the smallest median, of (us, p20, p80) per round."""
    return min(times, key=lambda t: t[0])


def _sync(kind):
    if kind == "cuda":
        _torch().cuda.synchronize()


def _case_inputs(ctx, case: Case, refcheck, max_sets, gen):
    """Input sets (enough to cover 4x the last-level cache, at most ``max_sets``) and the float64
    reference of the first."""
    first = make_set(case, ctx.device, gen)
    per = set_bytes(case, first)
    want = math.ceil(4 * _last_level_cache_bytes(ctx.kind) / max(per, 1))
    n_sets = max(1, min(max_sets, want))
    sets = [first] + [make_set(case, ctx.device, gen) for _ in range(n_sets - 1)]
    ref = reference(case, first) if refcheck else None
    _sync(ctx.kind)
    return sets, ref, n_sets


def run_case(ctx, case: Case, impls, timer, copy_gbps, refcheck, max_sets, seed, log=print,
             lock: HostLock | None = None, rounds: int = 1) -> list:
    """One record per impl. With ``rounds`` > 1 every impl is set up first and then timed
    ``rounds`` times in turn (impl after impl, round after round), so that a drift of the machine
    or of a peer between calls shows in each one's ``us_rounds``; ``us`` (and its p20/p80) is
    then the fastest round's: on the H200 our kernels' rounds agreed within 0.2%, while a peer's
    moved up to 2.2x between rounds of one run (Liger's layernorm bwd 7168: 269.2, 424.8, 269.1
    us; torch.compile's at 3584: 196.2, 371.9, 441.0), so each impl is compared at its best."""
    torch = _torch()
    lock = lock or HostLock()
    # the seed depends on the case (not on Python's per-process str hash), so reruns see the same data
    tag = zlib.crc32(f"{case.op}/{case.dtype}/{case.hidden}/{case.rows}".encode())
    gen = torch.Generator(device=ctx.device).manual_seed(seed * 1_000_003 + tag)
    try:
        with lock.setup():
            sets, ref, n_sets = _case_inputs(ctx, case, refcheck, max_sets, gen)
    except Exception as e:  # noqa: BLE001 - e.g. out of memory: record it for every impl
        msg = f"inputs/reference: {type(e).__name__}: {e}"
        return [_record(case, impl, "error", error=msg) for impl in impls]
    with lock.timing():
        at_size = copy_roofline(ctx.kind, timer, case.bytes // 2, sets=n_sets)["copy_gbps"]
    records = {}

    def failed(impl, e, t0):
        if isinstance(e, Skip):
            records[impl] = _record(case, impl, e.status, error=str(e))
            return
        tb = traceback.format_exc(limit=3)
        records[impl] = _record(case, impl, "error", error=f"{type(e).__name__}: {e}",
                                setup_s=round(time.perf_counter() - t0, 3))
        log(f"  ! {case.op} {case.dtype} H={case.hidden} M={case.rows} {impl}: {type(e).__name__}: {e}\n{tb}")

    def prepare(impl):
        """(prepared calls, err, tol, setup seconds), or None with the impl's record written."""
        t0 = time.perf_counter()
        try:
            with lock.setup():
                p = IMPLS[impl](ctx, case, sets)
                err = tol = problem = None
                if refcheck and p.poison is not None:
                    p.poison(0)
                out = p.calls[0]()  # the first call compiles (Inductor, Triton)
                _sync(ctx.kind)
                if refcheck:
                    err, tol, problem = check(case, out, ref)
                del out
        except Exception as e:  # noqa: BLE001 - one failing impl must not abort the run
            failed(impl, e, t0)
            return None
        if problem is not None:
            records[impl] = _record(case, impl, "wrong", err=err, tol=tol, origin=p.origin, n_sets=n_sets,
                                    error=problem, setup_s=round(time.perf_counter() - t0, 3))
            return None
        return p, err, tol, time.perf_counter() - t0

    def timed(impl, p):
        """(us, p20, p80) of one timing of ``p``, or None with the impl's error record written."""
        t0 = time.perf_counter()
        try:
            with lock.timing():
                t = timer(p.calls)
                _sync(ctx.kind)
            return t
        except Exception as e:  # noqa: BLE001
            failed(impl, e, t0)
            return None

    def ok(impl, prepared, times):
        p, err, tol, setup = prepared
        us, p20, p80 = fastest_round(times)
        extra = {"us_rounds": [round(t[0], 3) for t in times]} if rounds > 1 else {}
        records[impl] = _record(case, impl, "ok", us=us, us_p20=p20, us_p80=p80, copy_gbps=copy_gbps,
                                copy_at_size_gbps=at_size, **_rates(case.bytes, us, copy_gbps, at_size),
                                err=err, tol=tol, n_sets=n_sets, origin=p.origin, setup_s=round(setup, 3), **extra)

    if rounds == 1:  # one impl at a time: only its buffers and graphs are held
        for impl in impls:
            prepared = prepare(impl)
            t = prepared and timed(impl, prepared[0])
            if t:
                ok(impl, prepared, [t])
            prepared = None
    else:
        held = {impl: prepared for impl in impls if (prepared := prepare(impl))}
        times = {impl: [] for impl in held}
        for _ in range(rounds):
            for impl in list(held):
                t = timed(impl, held[impl][0])
                if t:
                    times[impl].append(t)
                else:
                    del held[impl]
        for impl, prepared in held.items():
            ok(impl, prepared, times[impl])
        held = None
    sets = ref = None  # the inputs go before the next case's are made
    if ctx.kind == "cuda":
        torch.cuda.empty_cache()
    return [records[impl] for impl in impls]


def default_impls(kind):
    return ",".join(i for i in IMPL_ORDER if kind == "cuda" or i != "liger")


def run(args, log=print) -> dict:
    torch = _torch()
    kind = args.target or ("cuda" if torch.cuda.is_available() else "llvm")
    args.target = kind
    if kind == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--target cuda needs a CUDA device visible to torch")
    impls = _csv_list(args.impls) if args.impls else _csv_list(default_impls(kind))
    args.impls = ",".join(impls)
    bad = [i for i in impls if i not in IMPLS]
    if bad:
        raise SystemExit(f"unknown impl(s) {bad}; choose from {list(IMPLS)}")
    cases = make_cases(args)
    if getattr(args, "rounds", 1) < 1:
        raise SystemExit(f"--rounds must be 1 or more, got {args.rounds}")
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if "torch_compile" in impls:
        with contextlib.suppress(Exception):
            import torch._functorch.config as fc
            # retain_graph=True backward through a compiled graph needs undonated buffers
            fc.donated_buffer = False
    ctx = Context(kind, args.library)
    timer = Timer(kind, args.warmup_ms, args.rep_ms)
    log(f"# tvmnorm bench: {len(cases)} cases x {len(impls)} impls on {_device_name(kind)} ({kind})")
    lock = HostLock(getattr(args, "host_lock", None))
    with lock.timing():
        roof = copy_roofline(kind, timer, args.copy_bytes)
    log(f"# copy roofline: {roof['copy_gbps']:.1f} GB/s ({roof['copy_what']})")
    lib_info = ctx.library_info()
    log(f"# tuned library: {lib_info['note']}")
    meta = meta_header(args, kind, timer, roof, lib_info)
    if lock.path:
        meta["host_lock"] = (f"{lock.path}: timing held an exclusive flock, setup (inputs, reference, "
                             f"compiles) a shared one, against other bench processes on this host")
    records = []
    try:
        for i, case in enumerate(cases):
            recs = run_case(ctx, case, impls, timer, roof["copy_gbps"], args.refcheck, args.max_sets,
                            args.seed, log=log, lock=lock, rounds=getattr(args, "rounds", 1))
            records += recs
            if not args.quiet:
                cells = "  ".join(_cell(r) for r in recs)
                log(f"[{i + 1}/{len(cases)}] {case.op} {case.dtype} H={case.hidden} M={case.rows}: {cells}")
    except KeyboardInterrupt:
        # a run stopped by a time limit (SIGINT) keeps the cases it finished, and says so
        done = len({(r["op"], r["dtype"], r["hidden"], r["rows"]) for r in records})
        meta["interrupted"] = f"stopped after {done} of {len(cases)} cases"
        log(f"# interrupted: {meta['interrupted']}")
    return {"meta": meta, "records": records}


def _cell(r, width=0):
    if r["status"] == "ok":
        s = f"{r['impl']} {r['us']:.1f}us {r['frac']:.2f}" if not width else f"{r['us']:9.1f} {r['frac']:5.2f}"
    else:
        s = f"{r['impl']} {r['status'].upper()}" if not width else f"{r['status'].upper():>15}"
    return s


# ----------------------------------------------------------------------------------------------
# output: table, JSON, CSV, plots

def _group_key(r):
    return (r["op"], r["dtype"], r["rows_kind"], r["tokens"])


def _impls_in(records):
    seen = list(dict.fromkeys(r["impl"] for r in records))
    return [i for i in IMPL_ORDER if i in seen] + [i for i in seen if i not in IMPL_ORDER]


def table(result) -> str:
    meta, records = result["meta"], result["records"]
    lines = [f"device: {meta['device']}   target: {meta['target']}   copy roofline: {meta['copy_gbps']:.1f} GB/s"
             f"   commit: {(meta.get('git_commit') or '?')[:10]}{'+dirty' if meta.get('git_dirty') else ''}",
             "cells: median us and frac = GB/s / copy GB/s; WRONG = failed the float64 refcheck, not timed"]
    impls = _impls_in(records)
    groups = {}
    for r in records:
        groups.setdefault(_group_key(r), []).append(r)
    for (op, dt, rk, tok), rs in groups.items():
        lines.append("")
        lines.append(f"{op}  {dt}  {rk} tokens={tok}")
        lines.append(f"{'hidden':>7} {'rows':>8}  " + "  ".join(f"{i:>15}" for i in impls))
        by = {}
        for r in rs:
            by.setdefault((r["hidden"], r["rows"]), {})[r["impl"]] = r
        for (h, m), row in by.items():
            cells = [(_cell(row[i], 1) if i in row else f"{'-':>15}") for i in impls]
            lines.append(f"{h:>7} {m:>8}  " + "  ".join(cells))
    problems = [r for r in records if r["status"] in ("wrong", "error")]
    if problems:
        lines.append("")
        lines.append("problems:")
        for r in problems:
            lines.append(f"  {r['status'].upper()} {r['impl']} {r['op']} {r['dtype']} H={r['hidden']} "
                         f"M={r['rows']}: {r['error']}")
    return "\n".join(lines)


def write_csv(records, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(RECORD_KEYS), extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow(r)


def plot(result, out_dir, name) -> list:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    meta, records = result["meta"], result["records"]
    groups = {}
    for r in records:
        groups.setdefault(_group_key(r), []).append(r)
    paths = []
    for (op, dt, rk, tok), rs in groups.items():
        ok = [r for r in rs if r["status"] == "ok"]
        if not ok:
            continue
        fig, ax = plt.subplots(figsize=(8, 4.8))
        for impl in _impls_in(ok):
            pts = sorted((r["hidden"], r["frac"]) for r in ok if r["impl"] == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1,
                   label=f"copy roofline ({meta['copy_gbps']:.0f} GB/s)")
        ax.set_xscale("log")
        hs = sorted({r["hidden"] for r in rs})
        ax.set_xticks(hs)
        ax.set_xticklabels([str(h) for h in hs], rotation=45, fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel("hidden size")
        ax.set_ylabel("fraction of copy bandwidth")
        ax.set_ylim(0, max(1.1, max(r["frac"] for r in ok) * 1.1))
        commit = (meta.get("git_commit") or "?")[:10]
        ax.set_title(f"{op} {dt}, {rk} tokens={tok}\n{meta['device']}, commit {commit}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = pathlib.Path(out_dir) / f"{name}_{op}_{dt}_{rk}{tok}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))
    return paths


def save(result, out_dir, name, plots=True) -> dict:
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"json": str(out / f"{name}.json"), "csv": str(out / f"{name}.csv")}
    if plots:
        files["plots"] = plot(result, out, name)
    result["meta"]["files"] = {k: ([pathlib.Path(p).name for p in v] if isinstance(v, list) else pathlib.Path(v).name)
                               for k, v in files.items()}
    pathlib.Path(files["json"]).write_text(json.dumps(result, indent=1, default=str) + "\n")
    write_csv(result["records"], files["csv"])
    return files


def validate(result) -> None:
    """Raise ValueError if ``result`` is not a {"meta", "records"} bench file."""
    if set(result) != {"meta", "records"}:
        raise ValueError(f"top level must be meta and records, got {sorted(result)}")
    for k in ("device", "versions", "git_commit", "command_line", "timestamp", "copy_gbps", "repro"):
        if k not in result["meta"]:
            raise ValueError(f"meta lacks {k}")
    for r in result["records"]:
        missing = [k for k in RECORD_KEYS if k not in r and k not in LATER_KEYS]
        if missing:
            raise ValueError(f"record lacks {missing}: {r}")
        if r["op"] not in OPS or r["dtype"] not in BENCH_DTYPES:
            raise ValueError(f"bad op/dtype in {r}")
        if r["status"] == "ok":
            for k in ("us", "gbps", "copy_gbps", "frac"):
                if not (isinstance(r[k], (int, float)) and r[k] > 0 and math.isfinite(r[k])):
                    raise ValueError(f"ok record has bad {k}: {r}")
        elif r["status"] not in ("wrong", "error", "skipped", "missing"):
            raise ValueError(f"bad status {r['status']!r}")
        elif r["us"] is not None:
            raise ValueError(f"a {r['status']} record carries a time: {r}")


# ----------------------------------------------------------------------------------------------
# compare and merge

def _match_key(r):
    return (r["op"], r["dtype"], r["hidden"], r["rows"], r["impl"])


def compare(old_path, new_path, fail_below=None, log=print) -> int:
    old, new = (json.loads(pathlib.Path(p).read_text()) for p in (old_path, new_path))
    for label, m in (("old", old["meta"]), ("new", new["meta"])):
        log(f"{label}: {m.get('device')} commit {(m.get('git_commit') or '?')[:10]} {m.get('timestamp')} "
            f"copy {m.get('copy_gbps', 0):.1f} GB/s")
    if old["meta"].get("device") != new["meta"].get("device"):
        log("warning: the two runs are on different devices")
    o = {_match_key(r): r for r in old["records"] if r["status"] == "ok"}
    rows, per_impl = [], {}
    log(f"{'op':18} {'dtype':5} {'hidden':>7} {'rows':>8} {'impl':16} {'old us':>10} {'new us':>10} {'speedup':>8}")
    for r in new["records"]:
        k = _match_key(r)
        if k not in o:
            continue
        if r["status"] != "ok":
            log(f"{k[0]:18} {k[1]:5} {k[2]:>7} {k[3]:>8} {k[4]:16} {o[k]['us']:>10.2f} {r['status'].upper():>10}")
            rows.append((k, 0.0))
            continue
        s = o[k]["us"] / r["us"]
        rows.append((k, s))
        per_impl.setdefault(k[4], []).append(s)
        log(f"{k[0]:18} {k[1]:5} {k[2]:>7} {k[3]:>8} {k[4]:16} {o[k]['us']:>10.2f} {r['us']:>10.2f} {s:>7.3f}x")
    only_old = set(o) - {_match_key(r) for r in new["records"]}
    if only_old:
        log(f"{len(only_old)} ok records of OLD have no match in NEW")
    if not rows:
        log("no matching records")
        return 1
    log("geometric mean speedup (new vs old):")
    allv = []
    for impl, v in per_impl.items():
        allv += v
        log(f"  {impl:16} {math.exp(sum(map(math.log, v)) / len(v)):.3f}x over {len(v)} shapes")
    if allv:
        log(f"  {'all':16} {math.exp(sum(map(math.log, allv)) / len(allv)):.3f}x over {len(allv)} records")
    if fail_below is not None:
        bad = [(k, s) for k, s in rows if s < fail_below]
        if bad:
            log(f"{len(bad)} records below {fail_below}x (or no longer ok): regression")
            return 1
    return 0


def record_key(r: dict, fp8_format: str | None = None) -> NormKey:
    """The NormKey a bench record measured (``fp8_format``: its run's meta.fp8_format)."""
    return Case(r["op"], r["dtype"], r["hidden"], r["rows"], r.get("tokens", r["rows"]), r.get("rows_kind", "tokens"),
                r.get("model", ""), r.get("what", ""), fp8_format or "fp8e4m3").key()


def _fastest_of_rounds(r: dict) -> dict:
    """A record timed in rounds under the earlier rule (``us`` the median of the rounds' medians,
    fourteenth lease and before) restated as the fastest round's, as run_case now records it; the
    p20/p80 it kept were of another round, so they go; ``us_from`` says what was done."""
    rounds = r.get("us_rounds") or []
    if r.get("status") != "ok" or not rounds or r["us"] <= min(rounds) + 1e-3:  # us_rounds keep 3 decimals
        return r
    us = min(rounds)
    return dict(r, us=us, us_p20=None, us_p80=None,
                **_rates(r["bytes"], us, r["copy_gbps"], r.get("copy_at_size_gbps")),
                us_from="the fastest of us_rounds (bench.merge; the run recorded their median)")


def merge(paths, records: dict | None = None) -> dict:
    """Combine bench files of one device (e.g. one process per op) into one result. Each row
    names its file (``run``: an index into meta.merged_from).

    With ``records`` (a schedules file's records, packed key -> record), the result holds the
    measurements of those records: each case (op, dtype, hidden, rows) comes from the last file
    whose library ran the key's record (the fingerprint its meta.library.records keeps; a file
    that does not say counts), all implementations measured in that run, and the ones that run
    lacks (torch.compile, which a tune job's benchmark leaves out) from the last other file that
    has them. A case no such file measured keeps its other implementations and no tuned row. A
    decode-sized forward call (runtime.is_small_call) counts from any library with a record of
    its key, as does a CUDA backward call the decode backward serves (runtime.runs_no_record): a
    library serves it with kernels no record schedules, whatever the record. A record timed
    in rounds counts at its fastest round (_fastest_of_rounds), as run_case records it now."""
    from .build import record_fingerprint
    from .runtime import runs_no_record
    parts = [json.loads(pathlib.Path(p).read_text()) for p in paths]
    if not parts:
        raise SystemExit("--merge needs at least one file")
    meta = dict(parts[0]["meta"])
    meta["merged_from"] = [{"file": str(p), "command_line": q["meta"].get("command_line"),
                            "copy_gbps": q["meta"].get("copy_gbps"), "timestamp": q["meta"].get("timestamp"),
                            "tvmnorm_source_hash": q["meta"].get("tvmnorm_source_hash")}
                           for p, q in zip(paths, parts)]
    devices = {q["meta"].get("device") for q in parts}
    if len(devices) > 1:
        raise SystemExit(f"refusing to merge runs from different devices: {devices}")
    rows = [dict(_fastest_of_rounds(r), run=i) for i, q in enumerate(parts) for r in q["records"]]
    if records is None:
        return {"meta": meta, "records": rows}
    wanted = {int(k, 16) if isinstance(k, str) else k: record_fingerprint(v) for k, v in records.items()}

    def ran_the_record(r) -> bool:
        q = parts[r["run"]]
        key = record_key(r, q["meta"].get("fp8_format"))
        packed = key.pack()
        ran = ((q["meta"].get("library") or {}).get("records") or {})
        return (str(packed) not in ran or ran[str(packed)] == wanted.get(packed)
                or runs_no_record(key, r["rows"], q["meta"].get("target", "cuda")))
    cases = {}
    for r in rows:
        cases.setdefault((r["op"], r["dtype"], r["hidden"], r["rows"]), []).append(r)
    out = []
    for case_rows in cases.values():
        homes = [r["run"] for r in case_rows if r["impl"] == "tvmnorm_tuned" and ran_the_record(r)
                 and r["status"] not in ("missing", "skipped")]  # a run without the key says nothing
        home = max(homes) if homes else None
        picked = {}
        # the home run last, so its measurements win; among the others a later file's
        for r in sorted(case_rows, key=lambda r: (r["run"] == home, r["run"])):
            if r["impl"] != "tvmnorm_tuned" or r["run"] == home:
                picked[r["impl"]] = r
        out += picked.values()
    return {"meta": meta, "records": out}


# ----------------------------------------------------------------------------------------------
# CLI

def add_bench_args(p: argparse.ArgumentParser) -> None:
    from .cli import at_least_one
    p.add_argument("--target", choices=("llvm", "cuda"), default=None,
                   help="cuda or llvm (default: cuda when torch sees a GPU)")
    p.add_argument("--ops", default=",".join(DEFAULT_OPS), help=f"comma list of {', '.join(OPS)} "
                   f"(default: all but the *_bwd_add ones)")
    p.add_argument("--dtypes", default="bf16", help="comma list of bf16, fp16, fp32")
    p.add_argument("--shapes", default="all", help="catalog groups (deepseek,qwen,qknorm) or all")
    p.add_argument("--hidden", default=None, help="explicit hidden sizes instead of --shapes, e.g. 768,4096")
    p.add_argument("--rows", default="train",
                   help="train (catalog training tokens), decode (catalog decode tokens) and/or token counts, "
                        "comma separated; rows = tokens x heads for QK-norm shapes")
    p.add_argument("--impls", default=None,
                   help=f"comma list of {', '.join(IMPL_ORDER)} (default: all that apply to the target)")
    p.add_argument("--library", default=None, help="tuned library directory (default: the runtime's)")
    p.add_argument("--fp8-format", default="fp8e4m3", choices=("fp8e4m3", "fp8e5m2"))
    p.add_argument("--refcheck", dest="refcheck", action="store_true", default=True,
                   help="check every impl against float64 before timing (default)")
    p.add_argument("--no-refcheck", dest="refcheck", action="store_false")
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--max-sets", type=at_least_one, default=32, help="most input sets to rotate over")
    p.add_argument("--rounds", type=int, default=1,
                   help="time every impl of a case this many times in turn (set up first, then impl after impl): "
                        "us is the fastest round's median, us_rounds lists them all")
    p.add_argument("--copy-bytes", type=int, default=None,
                   help="bytes each way for the copy roofline (default 2 GiB on cuda, 512 MiB on cpu)")
    p.add_argument("--torch-threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--host-lock", default=os.environ.get("TVMNORM_BENCH_LOCK"), metavar="PATH",
                   help="a lock file shared by bench processes on one host (one per GPU): timing waits "
                        "until no other process is setting up or timing (default $TVMNORM_BENCH_LOCK)")
    p.add_argument("--out", default=None, help="directory for NAME.json, NAME.csv and plots")
    p.add_argument("--name", default="bench", help="file name stem (default bench)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no per-case progress lines")
    p.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), default=None,
                   help="print per-shape speedups of NEW over OLD and their geometric mean")
    p.add_argument("--fail-below", type=float, default=None,
                   help="with --compare: exit 1 if any speedup is below this")
    p.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                   help="merge bench files (one device) into --out/NAME.json with table, CSV and plots")
    p.add_argument("--records", default=None, metavar="SCHEDULES.json",
                   help="with --merge: keep each case's measurements from a run whose library ran this file's "
                        "record of its key (bench.merge)")


def bench_main(args) -> int:
    if args.compare:
        rc = compare(*args.compare, fail_below=args.fail_below)
        if rc:
            raise SystemExit(rc)
        return 0
    if args.out:
        from .cli import writable_dir
        writable_dir(args.out, "--out")
    if args.merge:
        records = json.loads(pathlib.Path(args.records).read_text())["records"] if args.records else None
        result = merge(args.merge, records)
    else:
        result = run(args)
    validate(result)
    print()
    print(table(result))
    if args.out:
        files = save(result, args.out, args.name, plots=not args.no_plots)
        print(f"\nwrote {files['json']}, {files['csv']}" + (f" and {len(files.get('plots', []))} plots"
                                                             if not args.no_plots else ""))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tvmnorm-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_args(parser)
    return bench_main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
