"""MetaSchedule builder and runner that never start a fresh Python.

MetaSchedule's LocalBuilder and LocalRunner start worker processes, and each worker imports
TVM's tensor intrinsics first: 45-90 s on a 2-core machine, more than the default timeout,
so every candidate failed. Here candidates are compiled by workers *forked* from the tuning
process (TVM already imported: no start-up cost) and timed in the tuning process itself.

On CUDA the workers compile with NVRTC (TVM's own CUDA build, the target in scope) or with nvcc
(the library's cuda_host path), see CUDA_BUILDS; either way the compiler runs on every core at
once. On the H200 the serial in-process path took 4.2 s per candidate (16 candidates in 67 s); 16
nvcc builds in parallel took ~7 s a round.
"""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import pathlib
import random
import tempfile
import time

import numpy as np

from ._tvm import compile_module, load_module, ms, tvm
from .targets import usable_cores

from tvm.ir.utils import derived_object as _derived  # noqa: E402


def _candidate_path() -> str:
    # one directory per candidate: MetaSchedule's RemoveBuildArtifact callback deletes the
    # artifact's whole directory after measuring it
    return os.path.join(tempfile.mkdtemp(prefix="tvmnorm-cand-"), "cand.so")


# How a CUDA candidate is compiled. "nvrtc": TVM's own CUDA build (NVRTC to a cubin, inside the
# worker, with the target in scope so NVRTC never asks the CUDA runtime for the device), the host
# side by LLVM, exported to a .so that TVM's CUDA runtime loads. "nvcc": the library's path
# (cuda_host source + nvcc -shared): the same device code, but nvcc also compiles the tvm-ffi
# host wrappers as C++, 2.8 s a candidate against 0.9 s for the kernels alone; on the H200 host
# 16 such builds in parallel took ~7 s of each ~9.5 s tuning round.
CUDA_BUILDS = ("nvrtc", "nvcc")


def build_candidate(mod, kind: str, arch: str | None, target=None, cuda_build: str = "nvrtc", path=None) -> str:
    """Compile one candidate IRModule into a loadable .so (at ``path``, or in a fresh directory);
    returns its path."""
    path = pathlib.Path(path or _candidate_path())
    if kind == "cuda" and cuda_build == "nvcc":
        from .cuda_aot import build_cuda_library
        from .targets import arch_of
        funcs = {gv.name_hint: f for gv, f in mod.functions_items()}
        build_cuda_library(funcs, arch_of("cuda", arch), path, path.parent, jobs=1)
    else:
        if kind == "cuda" and cuda_build not in CUDA_BUILDS:
            raise ValueError(f"cuda_build must be one of {CUDA_BUILDS}, got {cuda_build!r}")
        with target:  # in scope, NVRTC takes the arch from it and never asks the CUDA runtime
            compile_module(mod, target).export_library(str(path))
    return str(path)


def _build_in_worker(payload):
    mod_json, target_json, kind, arch, cuda_build, path = payload
    try:
        mod = tvm.ir.load_json(mod_json)
        return build_candidate(mod, kind, arch, tvm.target.Target(target_json), cuda_build, path), None
    except Exception as e:  # noqa: BLE001 - a failed candidate is a result, not a crash
        return None, f"{type(e).__name__}: {str(e)[-2000:]}"


@_derived
class InProcessBuilder(ms.builder.PyBuilder):
    """Builds candidates in ``workers`` forked processes (1: in this process); CUDA ones the
    ``cuda_build`` way (see CUDA_BUILDS). With ``overlap`` (and more than one worker) a build
    call only submits its candidates and returns their artifacts' paths at once; an
    InProcessRunner made with this builder waits for each build when MetaSchedule asks for that
    candidate's run, so the search draws and ranks the next tasks' candidates while these
    compile (on the H200 host a backward batch spent 3-5 s a task blocked on its 16 builds
    between sends, the thirty-first lease's task logs)."""

    def __init__(self, kind: str = "llvm", arch: str | None = None, workers: int | None = None,
                 cuda_build: str = "nvrtc", timeout: float = 300.0, overlap: bool = False):
        super().__init__()
        self.kind, self.arch, self.cuda_build, self.timeout = kind, arch, cuda_build, timeout
        self.workers = max(1, workers or usable_cores())
        self.overlap = overlap and self.workers > 1
        self._pool = None
        self._pending = {}  # artifact path -> (its build's future, when it was submitted)
        self.errors = []  # the first few build errors, for a caller that finds nothing worked

    def _executor(self):
        if self._pool is None:
            # fork: the workers inherit the imported TVM; they never touch the GPU (NVRTC runs
            # with the target in scope, nvcc is a subprocess), so forking after the runner has
            # initialised CUDA is harmless
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.workers, mp_context=multiprocessing.get_context("fork"))
        return self._pool

    def build(self, build_inputs):
        if self.overlap:
            return self._build_later(build_inputs)
        payloads = [(tvm.ir.save_json(inp.mod), str(inp.target), self.kind, self.arch, self.cuda_build, None)
                    for inp in build_inputs]
        if self.workers == 1 or len(payloads) == 1:
            done = [_build_in_worker(p) for p in payloads]
        else:
            done = self._build_forked(payloads)
        self._note_errors(err for _, err in done)
        return [ms.builder.BuilderResult(path, err) for path, err in done]

    def _note_errors(self, errors) -> None:
        self.errors += [err for err in errors if err][:max(0, 3 - len(self.errors))]

    def _timed_out(self) -> str:
        return f"TimeoutError: not built within {self.timeout:.0f} s"

    def _kill_pool(self) -> None:
        """Kill the worker pool (a compiler that hangs in a forked process); the next build
        starts a fresh one. Builds still in it fail."""
        for proc in list(getattr(self._pool, "_processes", {}).values()):
            proc.kill()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None

    def _build_forked(self, payloads):
        """Build in the worker pool; a round that is not done within ``timeout`` seconds (a
        compiler that hangs in a forked process) fails its unfinished candidates, and the pool
        is killed and started afresh, rather than stalling the tuning run (and a GPU lease)."""
        futures = [self._executor().submit(_build_in_worker, p) for p in payloads]
        _, late = concurrent.futures.wait(futures, timeout=self.timeout)
        if late:
            self._kill_pool()
        return [f.result() if f not in late else (None, self._timed_out()) for f in futures]

    def _build_later(self, build_inputs):
        out = []
        for inp in build_inputs:
            path = _candidate_path()  # decided here: MetaSchedule hands it to the runner now
            payload = (tvm.ir.save_json(inp.mod), str(inp.target), self.kind, self.arch, self.cuda_build, path)
            self._pending[path] = (self._executor().submit(_build_in_worker, payload), time.monotonic())
            out.append(ms.builder.BuilderResult(path, None))
        return out

    def built(self, path, wait: bool):
        """(artifact path or None, build error or None) of the candidate at ``path``; for one
        that ``overlap`` is still building, None if not ``wait`` (until ``timeout`` seconds have
        passed: a hung build fails, and the pool is restarted), else once it is built."""
        entry = self._pending.get(path)
        if entry is None:
            return path, None
        future, start = entry
        left = self.timeout - (time.monotonic() - start)
        if not future.done() and not wait and left > 0:
            return None
        try:
            result = future.result(timeout=max(0.0, left))
        except concurrent.futures.TimeoutError:
            self._kill_pool()
            result = None, self._timed_out()
        except Exception as e:  # noqa: BLE001 - a pool killed under it, for another's hang
            result = None, f"{type(e).__name__}: {str(e)[-500:]}"
        del self._pending[path]
        self._note_errors([result[1]])
        return result


@_derived
class _Done(ms.runner.PyRunnerFuture):
    def __init__(self, result):
        super().__init__()
        self._result = result

    def done(self):
        return True

    def result(self):
        return self._result


@_derived
class _AfterBuild(ms.runner.PyRunnerFuture):
    """A candidate an overlapping InProcessBuilder is still building: timed (in this thread,
    the one that owns the GPU) as soon as MetaSchedule, polling, finds its build done, or when
    it asks for the result."""

    def __init__(self, runner, inp):
        super().__init__()
        self._runner, self._inp, self._result = runner, inp, None

    def done(self):
        if self._result is None:
            built = self._runner.builder.built(self._inp.artifact_path, wait=False)
            if built is None:
                return False
            self._result = self._runner.measure(self._inp, *built)
        return True

    def result(self):
        if self._result is None:
            self._result = self._runner.measure(self._inp, *self._runner.builder.built(self._inp.artifact_path, True))
        return self._result


@_derived
class SearchOnlyBuilder(ms.builder.PyBuilder):
    """Builds nothing: an empty artifact for each candidate, each in a fresh directory of its
    own (MetaSchedule deletes the artifact's directory after the run). With RandomTimeRunner it
    runs the search alone, on a machine without a GPU (scripts/search_overhead.py, tests)."""

    def build(self, inputs):
        return [ms.builder.BuilderResult(_candidate_path(), None) for _ in inputs]


@_derived
class RandomTimeRunner(ms.runner.PyRunner):
    """Times nothing: each candidate takes a random 100-200 us. With an overlapping
    InProcessBuilder (``builder``) each result waits for its candidate's build, as
    InProcessRunner's do (scripts/search_overhead.py --build: search and builds, no GPU)."""

    def __init__(self, builder=None):
        super().__init__()
        self.builder = builder

    def measure(self, inp, path, build_error):
        if path is None:
            return ms.runner.RunnerResult(None, f"build failed: {build_error}")
        return ms.runner.RunnerResult([random.uniform(1e-4, 2e-4)], None)

    def run(self, inputs):
        if self.builder is not None and self.builder.overlap:
            return [_AfterBuild(self, inp) for inp in inputs]
        return [_Done(self.measure(inp, inp.artifact_path, None)) for inp in inputs]


def random_argument(shape, dtype: str, kind: str):
    """Random normal data of one argument. On CUDA it is made on the GPU with torch when torch
    is there: numpy needs about a second per 100M elements, the GPU a millisecond."""
    if kind == "cuda":
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None and torch.cuda.is_available():
            t = torch.randn(shape, device="cuda", dtype=torch.float32).to(getattr(torch, dtype))  # TVM's dtype names are torch's
            return tvm.runtime.from_dlpack(t), t  # keep the torch tensor alive with the view
    host = np.random.default_rng().standard_normal(shape).astype("float32")
    if dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes
        host = host.astype(getattr(ml_dtypes, dtype))
    else:
        host = host.astype(dtype)
    dev = tvm.cuda(0) if kind == "cuda" else tvm.cpu(0)
    return tvm.runtime.tensor(host, dev), host


# Bytes the CUDA runner copies device to device before each timed call: four times the 60 MB L2
# of an H200, as triton's do_bench (the bench's timer) writes 256 MB before each call.
# The copy leaves the L2 full of dirty lines that the timed kernel must write back, as in the bench.
CUDA_FLUSH_BYTES = 256 << 20
CUDA_REPEATS = 20


WARM, COLD = "warm", "cold-l2"


def timing(kind: str) -> str:
    """How InProcessRunner times a candidate on ``kind`` (records keep it: tune retunes a record
    measured another way)."""
    return COLD if kind == "cuda" else WARM


def trimmed(secs) -> list:
    """The middle of the sorted repeats (20th to 80th percentile): a cold call that a host
    hiccup delayed must not move the mean MetaSchedule's cost model learns from."""
    s = sorted(secs)
    lo, hi = len(s) // 5, len(s) - len(s) // 5
    return s[lo:hi] or s


@_derived
class InProcessRunner(ms.runner.PyRunner):
    """Times each candidate in this process. On CUDA every timed call is a single cold call, as
    in the bench: the L2 is flushed before it (TVM's time_evaluator copies CUDA_FLUSH_BYTES
    before each repeat), so the search ranks candidates at the row count and cache state that
    the bench (and a training step) sees. On the CPU the calls run back to back."""

    def __init__(self, kind: str, number: int | None = None, repeat: int | None = None,
                 min_repeat_ms: int | None = None, warmup_ms: float = 0.0, builder=None):
        super().__init__()
        # an overlapping InProcessBuilder: its candidates are timed once built (_AfterBuild)
        self.builder = builder
        # back-to-back calls of each candidate before its timed ones (bench/bwd_parts.py
        # --stream-ab times the search's measure with and without them: the GPU idles through
        # the builds between measurements, and do_bench, the bench's timer, warms up for 25 ms)
        self.warmup_ms = warmup_ms
        cold = timing(kind) == COLD
        self.kind = kind
        self.number = number or (1 if cold else 5)
        self.repeat = repeat or (CUDA_REPEATS if cold else 3)
        self.min_repeat_ms = (0 if cold else 20) if min_repeat_ms is None else min_repeat_ms
        self.flush_bytes = CUDA_FLUSH_BYTES if cold else 0
        # (position, shape, dtype) -> random argument, shared by the candidates of a tuning
        # session: every candidate of a task sees the same data, and none pays for making it
        # (the position keeps an input and an output of one shape apart: no aliasing)
        self._args = {}
        self.measured, self.errors = 0, []
        self._fixed = {}  # argument signature -> seconds added to each measurement (add_fixed)

    @staticmethod
    def _signature(args_info) -> tuple:
        return tuple((tuple(int(d) for d in info.shape), str(info.dtype)) for info in args_info)

    def add_fixed(self, func, seconds: float) -> None:
        """Add ``seconds`` to every measurement of a candidate of ``func`` (a task: candidates
        are told apart from other tasks' by their argument shapes and dtypes): the cost of the
        kernels that always follow it in the library (tune.partial_sum_costs)."""
        self._fixed[self._signature(ms.arg_info.ArgInfo.from_prim_func(func))] = seconds

    def _arg(self, pos, info):
        sig = (pos, tuple(int(s) for s in info.shape), str(info.dtype))
        if sig not in self._args:
            self._args[sig] = random_argument(sig[1], sig[2], self.kind)
        return self._args[sig][0]

    def run(self, runner_inputs):
        overlapped = self.builder is not None and self.builder.overlap
        return [_AfterBuild(self, inp) if overlapped else _Done(self.measure(inp, inp.artifact_path, None))
                for inp in runner_inputs]

    def measure(self, inp, path, build_error):
        """The RunnerResult of the candidate built at ``path`` (None: its build failed with
        ``build_error``)."""
        dev = tvm.cuda(0) if self.kind == "cuda" else tvm.cpu(0)
        try:
            if path is None:
                raise RuntimeError(f"build failed: {build_error}" if build_error else "build failed")
            mod = load_module(path)
            args = [self._arg(i, info) for i, info in enumerate(inp.args_info)]
            if self.warmup_ms:
                mod.time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=self.warmup_ms)(*args)
            timer = mod.time_evaluator("main", dev, number=self.number, repeat=self.repeat,
                                       min_repeat_ms=self.min_repeat_ms, cache_flush_bytes=self.flush_bytes)
            fixed = self._fixed.get(self._signature(inp.args_info), 0.0)
            secs = [t + fixed for t in trimmed(timer(*args).results)]
            self.measured += 1
            return ms.runner.RunnerResult(secs, None)
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {str(e)[-1000:]}"
            if len(self.errors) < 3 and path is not None:
                self.errors.append(err)
            return ms.runner.RunnerResult(None, err)
