"""In-process MetaSchedule builder and runner.

MetaSchedule's LocalBuilder and LocalRunner start worker processes, and each worker imports
TVM's tensor intrinsics first: 45-90 s on a 2-core machine, more than the default timeout,
so every candidate failed. Candidates here are compiled and timed in the tuning process.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from ._tvm import compile_module, load_module, ms, tvm

from tvm.ir.utils import derived_object as _derived  # noqa: E402


@_derived
class InProcessBuilder(ms.builder.PyBuilder):
    def build(self, build_inputs):
        results = []
        for inp in build_inputs:
            try:
                ex = compile_module(inp.mod, inp.target)
                # one directory per candidate: MetaSchedule's RemoveBuildArtifact callback deletes
                # the artifact's whole directory after measuring it
                path = os.path.join(tempfile.mkdtemp(prefix="tvmnorm-cand-"), "cand.so")
                ex.export_library(path)
                results.append(ms.builder.BuilderResult(path, None))
            except Exception as e:  # noqa: BLE001 - a failed candidate is a result, not a crash
                results.append(ms.builder.BuilderResult(None, f"{type(e).__name__}: {str(e)[-2000:]}"))
        return results


@_derived
class _Done(ms.runner.PyRunnerFuture):
    def __init__(self, result):
        super().__init__()
        self._result = result

    def done(self):
        return True

    def result(self):
        return self._result


def _random(info, dev):
    shape = [int(s) for s in info.shape]
    dtype = str(info.dtype)
    host = np.random.default_rng().standard_normal(shape).astype("float32")
    if dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes
        host = host.astype(getattr(ml_dtypes, dtype))
    else:
        host = host.astype(dtype)
    return tvm.runtime.tensor(host, dev)


@_derived
class InProcessRunner(ms.runner.PyRunner):
    def __init__(self, kind: str, number: int = 5, repeat: int = 3, min_repeat_ms: int = 20):
        super().__init__()
        self.kind, self.number, self.repeat, self.min_repeat_ms = kind, number, repeat, min_repeat_ms

    def run(self, runner_inputs):
        dev = tvm.cuda(0) if self.kind == "cuda" else tvm.cpu(0)
        futures = []
        for inp in runner_inputs:
            try:
                if inp.artifact_path is None:
                    raise RuntimeError("build failed")
                mod = load_module(inp.artifact_path)
                args = [_random(info, dev) for info in inp.args_info]
                timer = mod.time_evaluator("main", dev, number=self.number, repeat=self.repeat,
                                           min_repeat_ms=self.min_repeat_ms)
                secs = list(timer(*args).results)
                futures.append(_Done(ms.runner.RunnerResult(secs, None)))
            except Exception as e:  # noqa: BLE001
                futures.append(_Done(ms.runner.RunnerResult(None, f"{type(e).__name__}: {str(e)[-1000:]}")))
        return futures
