"""Shared test helpers: seeds, input generation, NaN-poisoned outputs, kernel calls, and the
per-dtype tolerance table, all checked against tvmnorm.reference (float64 numpy).

Seeds: every test gets its own seed, crc32(test id) xor TVMNORM_TEST_SEED (default 0), printed
in every failure message; set TVMNORM_TEST_SEED to explore other data.
"""
from __future__ import annotations

import os
import pathlib
import warnings
import zlib

import numpy as np
import pytest
import torch

from tvmnorm import reference as ref
from tvmnorm.key import NormKey

PKG_LIB = pathlib.Path(__file__).resolve().parent.parent / "tvmnorm" / "_lib"
BASE_SEED = int(os.environ.get("TVMNORM_TEST_SEED", "0"))

TORCH_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64,
               "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}

# Per-dtype tolerance table. A kernel output o of the reference value r passes when
#     |o - r| <= ROUND[dtype] * |r| + TINY[dtype] + COMPUTE[ctype] * magnitude
# ROUND is the unit roundoff of the output dtype (round to nearest: half an ulp, relative), the
# error of the final cast; TINY is half the subnormal spacing, the cast's absolute error below
# the smallest normal. COMPUTE bounds the kernel's arithmetic in its compute type relative
# to the magnitude of the terms that were combined (|xhat*g| + |beta| for y, where |xhat| counts
# as (|x| + |mu|) * rsigma because x - mu cancels when x has an offset; the root sum of
# squares of the summed terms for dgamma/dbeta, which scales like sqrt(rows)), so cancellation
# never turns into an unbounded relative error.
ROUND = {"fp32": 2.0 ** -24, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "fp64": 2.0 ** -53}
TINY = {"fp32": 2.0 ** -150, "fp16": 2.0 ** -25, "bf16": 2.0 ** -134, "fp64": 0.0}
COMPUTE = {"fp32": 1e-5, "fp64": 1e-12}
# rsigma and mu are stored in ctype: relative to |rsigma| and to mean|x| (mu can be ~0). They
# come from a sum over the row, whose rounding error grows like sqrt(hidden): 1e-5 up to hidden
# ~1000 in fp32, 4 unit roundoffs x sqrt(hidden) beyond.
UNIT = {"fp32": 2.0 ** -24, "fp64": 2.0 ** -53}


def has_nvcc() -> bool:
    """Whether the nvcc the CUDA library build runs (cuda_aot.nvcc_path) is installed."""
    from tvmnorm.cuda_aot import nvcc_path
    return os.path.exists(nvcc_path())


def committed_llvm_records() -> dict:
    """packed key -> record of the committed CPU records (schedules/llvm-<cpu>.json), whichever
    CPU tuned them: a record's trace applies to its PrimFunc on any llvm host, but
    tune.load_records("llvm") reads only this host's file (none on another CPU). Every such file,
    merged: `tvmnorm tune --target llvm` in a checkout adds this CPU's beside the committed one."""
    from tvmnorm.tune import read_records
    records = {}
    for path in sorted((pathlib.Path(__file__).resolve().parent.parent / "schedules").glob("llvm-*.json")):
        records.update(read_records(path))
    return records


def stats_rtol(ctype: str, hidden: int) -> float:
    return max(COMPUTE[ctype], 4 * UNIT[ctype] * hidden ** 0.5)


def pytest_report_header(config):
    return f"tvmnorm test seed base: TVMNORM_TEST_SEED={BASE_SEED}"


def pytest_collection_modifyitems(config, items):
    """The tests marked slow (20 s to 2 min each on the 2-core CI machine) run first, the rest in
    their order: pytest-xdist hands tests out in collection order, and with the longest among
    the last, one worker ran them for minutes after the other had none left (the README's test
    command took 25 minutes, ~5 of them such a tail)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def library_fixture(**kwargs):
    """A module fixture that builds a library (nvcc: up to four minutes of one core on a GPU
    lease's host). bench/gpu_tests.sh deals the tests that share one to as few shards as their
    time allows (bench/gpu_shards.py), so it is built once a piece of them: dealt round-robin,
    lease 72's 15 shards each built the same x-layout library, 3215 of the 5466 shard-seconds
    its 260 tests took."""
    def wrap(fn):
        fn.tvmnorm_builds_library = True
        return pytest.fixture(scope="module", **kwargs)(fn)
    return wrap


def library_groups(item) -> list[str]:
    """The library fixtures (library_fixture) an item uses, each with its parameter where it has
    one ("pdl_library[jit]"): the tests that share one share its build within a process."""
    info = getattr(item, "_fixtureinfo", None)  # a Function's; other items use no fixtures
    groups = []
    for name, defs in (info.name2fixturedefs.items() if info else ()):
        if getattr(defs[-1].func, "tvmnorm_builds_library", False):
            param = item.callspec.params.get(name) if hasattr(item, "callspec") else None
            groups.append(name if param is None else f"{name}[{param}]")
    return sorted(groups)


def pytest_collection_finish(session):
    """With TVMNORM_LIBRARY_GROUPS=file, each collected id and the library fixtures it uses
    (tab-separated, "" for none): what bench/gpu_shards.py keeps together."""
    path = os.environ.get("TVMNORM_LIBRARY_GROUPS")
    if path:
        with open(path, "w") as f:
            for item in session.items:
                f.write(f"{item.nodeid}\t{' '.join(library_groups(item))}\n")


def pytest_runtest_logreport(report):
    """With TVMNORM_TEST_TIMES=file, each test phase's seconds as it ends: what a GPU lease's
    shard stopped by its time limit (no --durations summary) spent its time on."""
    path = os.environ.get("TVMNORM_TEST_TIMES")
    if path:
        with open(path, "a") as f:
            f.write(f"{report.duration:.2f} {report.when} {report.outcome} {report.nodeid}\n")


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Default-kernel cache in a session tmp dir (never ~/.cache), no library from the
    environment, and a guard that no test writes into the package's tvmnorm/_lib."""
    def snapshot():
        if not PKG_LIB.exists():
            return None
        return sorted((str(p.relative_to(PKG_LIB)), p.stat().st_mtime_ns) for p in PKG_LIB.rglob("*"))

    before = snapshot()
    saved = {k: os.environ.get(k) for k in ("TVMNORM_CACHE", "TVMNORM_LIBRARY")}
    if os.environ.get("TVMNORM_TEST_CACHE"):
        # one cache that concurrent pytest processes share (bench/gpu_tests.sh's shards, seeded
        # with a lease's staged default kernels): a shard compiled every kernel it met itself
        cache = pathlib.Path(os.environ["TVMNORM_TEST_CACHE"])
        cache.mkdir(parents=True, exist_ok=True)
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        # one cache for the run's workers (the parent of their base temps), so a default kernel
        # compiles once, not once a worker: entries are written whole under a file lock
        cache = tmp_path_factory.getbasetemp().parent / "tvmnorm-cache"
        cache.mkdir(exist_ok=True)
    else:
        cache = tmp_path_factory.mktemp("tvmnorm-cache")
    os.environ["TVMNORM_CACHE"] = str(cache)
    os.environ.pop("TVMNORM_LIBRARY", None)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    assert snapshot() == before, f"tests wrote into the package library directory {PKG_LIB}"


@pytest.fixture(scope="session")
def bench_script():
    """Loads bench/<name>.py as a module (the bench scripts are not part of the package)."""
    import importlib.util

    def load(name: str):
        path = pathlib.Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load


@pytest.fixture
def cuda_builds(monkeypatch) -> list:
    """The kernel names of each cuda_aot.build_cuda_library call the test makes, sorted, in call
    order; the builds themselves still run."""
    import tvmnorm.cuda_aot as cuda_aot
    built, build = [], cuda_aot.build_cuda_library

    def spy(funcs, *a, **kw):
        built.append(sorted(funcs))
        return build(funcs, *a, **kw)
    monkeypatch.setattr(cuda_aot, "build_cuda_library", spy)
    return built


@pytest.fixture
def seed(request) -> int:
    return zlib.crc32(request.node.nodeid.encode()) ^ BASE_SEED


@pytest.fixture
def rng(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


class KernelCache:
    """Compiles each key once (per test module) through a private Registry with no library, so
    the default schedules are what is tested and no state leaks between modules."""

    def __init__(self, kind: str = "llvm"):
        from tvmnorm.runtime import Registry
        self.kind = kind
        self.registry = Registry()
        self.registry.set_library(kind, None)

    def __call__(self, key: NormKey):
        from tvmnorm.runtime import FallbackWarning
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FallbackWarning)
            return self.registry.get(key, self.kind)


@pytest.fixture(scope="module")
def kernels():
    return KernelCache("llvm")


# ---------------------------------------------------------------------------------------------
# inputs and calls


def space_variant(key: NormKey, kind: str, func, index: int = 0):
    """Structural variant ``index`` of ``key``'s design space, its decisions sampled on ``func``:
    what a test takes from space_fn(...)[index] without building the other variants (a
    backward key has ~50, 4 s a key)."""
    from tvmnorm._tvm import Schedule
    from tvmnorm.sched.space import design_spaces
    return design_spaces(key, kind)[index](Schedule(func))


def generated_cuda(funcs: dict) -> str:
    """The CUDA C that TVM generates for ``funcs`` (name -> scheduled PrimFunc), compiled the
    way the library compiles them: what the structural (no-GPU) checks of codegen read."""
    from tvmnorm.build import compile_funcs
    ex = compile_funcs(funcs, "cuda")
    assert [m.kind for m in ex.mod.imports] == ["cuda"]
    return ex.mod.imports[0].inspect_source()


def tensor(values, dtype: str, device="cpu") -> torch.Tensor:
    """float64 values (numpy, or a torch tensor) -> a contiguous tensor of ``dtype`` (rounded
    once). Copied into a fresh tensor: torch.from_numpy gives an empty array strides (0, 0), which
    TVM rejects as not compact."""
    if not isinstance(values, torch.Tensor):
        values = torch.from_numpy(np.ascontiguousarray(values))
    src = values.to(dtype=TORCH_DTYPE[dtype])
    return torch.empty(src.shape, dtype=src.dtype, device=device).copy_(src)


def poisoned(shape, dtype: str, device="cpu") -> torch.Tensor:
    """An output buffer filled with NaN, so an element the kernel does not write fails the check."""
    return torch.full(shape, float("nan"), dtype=TORCH_DTYPE[dtype], device=device)


def f64(t) -> np.ndarray:
    return t.detach().cpu().to(torch.float64).numpy()


def make_inputs(key: NormKey, rows: int, rng: np.random.Generator, device="cpu") -> dict:
    """Random inputs for every input of ``key``'s kernel, never zeros: x has a per-row offset
    (LayerNorm must remove it) and a per-row spread; gamma is around 1 (around 0 when
    zero-centred, which stores gamma - 1). For bwd, mu and rsigma are the float64 reference
    statistics rounded to ctype, as a forward pass would have saved them."""
    H = key.hidden_size
    # [rows, H] draws by torch on the inputs' device (numpy's generator took 2 s for each
    # 16384 x 7168 on the host), in float32 wherever the tensor is no wider, so that an fp64
    # input keeps random low bits; seeded from rng, so a test's seed still fixes its inputs
    gen = torch.Generator(device).manual_seed(int(rng.integers(2 ** 62)))
    wide = torch.float64 if "fp64" in (key.itype, key.otype) else torch.float32

    def normal(shape):
        return torch.randn(shape, generator=gen, dtype=wide, device=device)

    def offset_rows():  # a per-row offset and spread (LayerNorm must remove the offset)
        return (torch.from_numpy(rng.normal(0.0, 2.0, (rows, 1))).to(device, wide)
                + torch.from_numpy(rng.uniform(0.5, 3.0, (rows, 1))).to(device, wide) * normal((rows, H)))
    x = tensor(offset_rows(), key.itype, device)
    g0 = 0.0 if key.zero_centered_gamma else 1.0
    a = {"x": x, "gamma": tensor(g0 + 0.5 * rng.standard_normal(H), key.wtype, device)}
    if key.norm == "layernorm":
        a["beta"] = tensor(0.5 * rng.standard_normal(H), key.wtype, device)
    if key.forward:
        if key.stage == "fwd_add":
            # a residual stream of its own offset and spread: h = x + residual cancels some
            a["residual"] = tensor(offset_rows(), key.itype, device)
        if key.fp8_out:
            a["scale"] = tensor(np.array([rng.uniform(0.5, 2.0)]), "fp32", device)
        return a
    a.pop("beta", None)
    st = ref.stats(key.norm, f64(x))
    a["rsigma"] = tensor(st["rsigma"], key.ctype, device)
    if key.norm == "layernorm":
        a["mu"] = tensor(st["mu"], key.ctype, device)
    a["dy"] = tensor(normal((rows, H)), key.otype, device)
    if key.stage == "bwd_add":
        a["dz"] = tensor(normal((rows, H)), key.itype, device)
    return a


def output_specs(key: NormKey, rows: int) -> dict:
    """name -> (shape, dtype) of every output of ``key``'s kernel."""
    H, c = key.hidden_size, key.ctype
    if key.forward:
        out = {"y": ((rows, H), key.otype)}
        if key.stage == "fwd_add":
            out["h"] = ((rows, H), key.itype)
        if key.norm == "layernorm":
            out["mu"] = ((rows,), c)
        out["rsigma"] = ((rows,), c)
        if key.fp8_out:
            out["amax"] = ((1,), "fp32")
        return out
    out = {"dx": ((rows, H), key.itype), "dgamma": ((H,), key.wtype)}
    if key.norm == "layernorm":
        out["dbeta"] = ((H,), key.wtype)
    return out


def call(kernel, inputs: dict, rows: int, device="cpu", eps=None) -> dict:
    """Poison every output with NaN, call the kernel in its signature order, return the outputs."""
    outs = {n: poisoned(s, d, device) for n, (s, d) in output_specs(kernel.key, rows).items()}
    args = [inputs[n] if n in inputs else outs[n] for n in kernel.signature]
    kernel(*args, eps=eps) if kernel.key.forward else kernel(*args)
    return outs


def x_in_layout(x, layout: str):
    """x's values ([rows, hidden]) in NaN-padded wider memory at odd offsets and strides, on x's
    device: "strided", the middle of wider rows; "heads", rows as tokens x heads (7 heads where
    the rows allow) with a padding head between tokens. Offsets and strides of 8 elements (16
    bytes of bf16) keep the CUDA kernels' vector loads aligned."""
    rows, h = x.shape
    heads = 7 if layout == "heads" and rows % 7 == 0 else 1
    pad = 8 if x.is_cuda else 3
    wide = torch.full((rows // heads, heads + (layout == "heads"), h + 2 * pad + 1 - x.is_cuda), float("nan"),
                      dtype=x.dtype, device=x.device)
    wide[:, :heads, pad:pad + h] = x.view(rows // heads, heads, h)
    return wide[:, :heads, pad:pad + h] if layout == "heads" else wide[:, 0, pad:pad + h]


def run_and_check(kernels, key: NormKey, rows: int, rng, seed: int, device="cpu", eps=None):
    """Fresh inputs, NaN-poisoned outputs, one kernel call, every output checked."""
    inputs = make_inputs(key, rows, rng, device=device)
    outs = call(kernels(key), inputs, rows, device=device, eps=eps)
    if device == "cuda":
        torch.cuda.synchronize()
    check_outputs(key, inputs, outs, f"{device} {key.name} rows={rows} seed={seed}", eps=eps)
    return inputs, outs


# ---------------------------------------------------------------------------------------------
# checks


def residual_sum(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """x + residual rounded once to their dtype (from the float64 sum, which two values of
    that dtype have exactly but for a rounding no later one can change): torch's add, and
    fwd_add's h, must equal it bit for bit."""
    return (x.double() + residual.double()).to(x.dtype)


def assert_close(what: str, got, want, allowed, context: str = ""):
    """|got - want| <= allowed elementwise (float64; NaN in got fails), with the worst element
    named on failure. ``allowed``: an array (broadcast to want's shape), or, for a 2-D want, a
    function of a row slice that gives those rows' bound. A 2-D check walks the rows in steps of
    reference.ROW_STEP: float64 temporaries of a whole 16384 x 7168 call cost seconds each in
    page faults (a GPU test's check of that size took ~20 s of host time)."""
    got = f64(got) if isinstance(got, torch.Tensor) else np.asarray(got, np.float64)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape} {context}"
    if not callable(allowed):
        whole = np.broadcast_to(np.asarray(allowed, np.float64), want.shape)
        allowed = lambda s: whole[s]  # noqa: E731
    bad_count, worst = 0, None
    for s in ref.row_steps(want.shape[0]) if want.ndim == 2 else (Ellipsis,):
        bound = np.broadcast_to(allowed(s), want[s].shape)
        err = np.abs(got[s] - want[s])
        bad = ~(err <= bound)  # NaN counts as bad
        if bad.any():
            bad_count += int(bad.sum())
            ratio = np.where(np.isnan(err), np.inf, err / np.maximum(bound, 1e-300))
            j = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
            if worst is None or ratio[j] > worst[0]:
                i = tuple(int(v) for v in ((s.start + j[0],) + j[1:] if s is not Ellipsis else j))
                worst = (ratio[j], i, float(got[s][j]), float(want[s][j]), err[j], bound[j])
    if bad_count:
        _, i, g, w, e, b = worst
        raise AssertionError(
            f"{what}: {bad_count}/{want.size} elements out of tolerance ({context}); worst at {i}: "
            f"got {g!r}, want {w!r}, |err| {e:.3g} > allowed {b:.3g}; "
            f"NaNs in output: {int(np.isnan(got).sum())}")


def cast_tol(dtype: str, want) -> np.ndarray:
    """The final cast's error bound: half an ulp of the value, or of the smallest subnormal."""
    return ROUND[dtype] * np.abs(want) + TINY[dtype]


def check_outputs(key: NormKey, inputs: dict, outs: dict, context: str, eps=None):
    """Compare a kernel's outputs against tvmnorm.reference on the same (rounded) inputs. The
    bounds are computed a step of rows at a time (assert_close)."""
    zc = key.zero_centered_gamma
    x, gamma = f64(inputs["x"]), f64(inputs["gamma"])
    g = gamma + 1.0 if zc else gamma
    u_c = COMPUTE[key.ctype]
    if key.forward:
        if key.stage == "fwd_add":
            # h is x + residual rounded once to itype, as torch's add rounds it: bit for bit
            h = residual_sum(inputs["x"], inputs["residual"])
            assert_close("h", outs["h"], f64(h), 0.0, context)
            x = f64(h)
        beta = f64(inputs["beta"]) if "beta" in inputs else None
        r = ref.fwd(key.norm, x, gamma, beta, eps=eps, zero_centered_gamma=zc)

        def mag(s):  # |xhat * g + beta|'s terms in magnitude: what the compute error scales with
            centre = np.abs(r["mu"][s])[:, None] if key.norm == "layernorm" else 0.0
            xhat_mag = (np.abs(x[s]) + centre) * r["rsigma"][s, None]
            return xhat_mag * np.abs(g) + (np.abs(beta) if beta is not None else 0.0)
        st = stats_rtol(key.ctype, key.hidden_size)
        assert_close("rsigma", outs["rsigma"], r["rsigma"], st * np.abs(r["rsigma"]), context)
        if key.norm == "layernorm":
            assert_close("mu", outs["mu"], r["mu"], st * (np.abs(r["mu"]) + np.mean(np.abs(x), axis=-1)),
                         context)
        if key.fp8_out:
            check_fp8(key, outs, r["y"], mag(slice(None)), f64(inputs["scale"])[0], context)
        else:
            assert_close("y", outs["y"], r["y"], lambda s: cast_tol(key.otype, r["y"][s]) + u_c * mag(s), context)
        return
    dy, rs = f64(inputs["dy"]), f64(inputs["rsigma"])
    mu = f64(inputs["mu"]) if "mu" in inputs else None
    dz = f64(inputs["dz"]) if "dz" in inputs else None
    r = ref.bwd(key.norm, dy, x, rs, gamma, mu=mu, dz=dz, zero_centered_gamma=zc)

    def xhat_mag(s):  # |xhat| as (|x| + |mu|) * rsigma: the magnitude of what x - mu cancels
        return (np.abs(x[s]) + (np.abs(mu[s])[:, None] if mu is not None else 0.0)) * rs[s, None]

    def dx_allowed(s):
        dyg, xm = dy[s] * g, xhat_mag(s)
        mag = rs[s, None] * (np.abs(dyg) + xm * np.mean(np.abs(dyg) * xm, axis=-1, keepdims=True)
                             + (np.mean(np.abs(dyg), axis=-1, keepdims=True) if mu is not None else 0.0))
        if dz is not None:
            mag = mag + np.abs(dz[s])
        return cast_tol(key.itype, r["dx"][s]) + u_c * mag
    assert_close("dx", outs["dx"], r["dx"], dx_allowed, context)
    # dgamma/dbeta sum over rows in another order than numpy: the error grows like the root sum
    # of squares of the terms (~ sqrt(rows) for O(1) terms)
    sq_g, sq_b = np.zeros(key.hidden_size), np.zeros(key.hidden_size)
    for s in ref.row_steps(len(x)):
        sq_g += np.sum((dy[s] * xhat_mag(s)) ** 2, axis=0)
        sq_b += np.sum(dy[s] * dy[s], axis=0)
    assert_close("dgamma", outs["dgamma"], r["dgamma"], cast_tol(key.wtype, r["dgamma"]) + u_c * np.sqrt(sq_g), context)
    if key.norm == "layernorm":
        assert_close("dbeta", outs["dbeta"], r["dbeta"], cast_tol(key.wtype, r["dbeta"]) + u_c * np.sqrt(sq_b),
                     context)


# fp8 formats: mantissa bits and smallest normal (below it the step is the subnormal step)
FP8_MANTISSA = {"fp8e4m3": 3, "fp8e5m2": 2}
FP8_MIN_NORMAL = {"fp8e4m3": 2.0 ** -6, "fp8e5m2": 2.0 ** -14}


def check_fp8(key: NormKey, outs: dict, y_ref: np.ndarray, mag: np.ndarray, scale: float, context: str):
    """fp8 y against the reference quantisation of the float64 y: bitwise equal except where the
    kernel's fp32 y sits within its compute error of an fp8 rounding boundary (then one fp8
    step apart), and amax = max|y| before scaling."""
    q_ref, amax_ref = ref.fp8_quantize(y_ref, scale, key.otype)
    got = f64(outs["y"])
    step = np.maximum(np.abs(q_ref), FP8_MIN_NORMAL[key.otype]) * 2.0 ** -FP8_MANTISSA[key.otype]
    assert_close("y (fp8)", got, q_ref, step, context)
    # elements whose exact scaled value is not within the compute error of a rounding boundary
    # (midpoint between neighbours) must match bit for bit
    y_s = np.clip(y_ref * scale, -ref.FP8_MAX[key.otype], ref.FP8_MAX[key.otype])
    slack = COMPUTE[key.ctype] * mag * scale
    lo, _ = ref.fp8_quantize(y_s - slack, 1.0, key.otype)
    hi, _ = ref.fp8_quantize(y_s + slack, 1.0, key.otype)
    safe = lo == hi
    mism = safe & (got != q_ref)
    assert not mism.any(), (f"y (fp8): {int(mism.sum())} elements differ from the reference quantisation "
                            f"away from rounding boundaries ({context}); first at "
                            f"{np.argwhere(mism)[0]}: got {got[mism][0]}, want {q_ref[mism][0]}")
    assert_close("amax", outs["amax"], np.array([amax_ref]), COMPUTE[key.ctype] * amax_ref, context)


def captured(fn, *static):
    """fn(*static) captured in a CUDA graph (after a warm-up call on a side stream, which loads
    every kernel the call launches): (graph, its outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static)
    return graph, out
