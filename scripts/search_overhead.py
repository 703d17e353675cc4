"""Time MetaSchedule's search alone for CUDA keys, on a machine without a GPU: candidates are
drawn, ranked and recorded as in `tvmnorm tune`, but a fake builder compiles nothing and a fake
runner returns random times. What it prints is the per-key cost of the search itself (design
spaces, population draws, the cost model), the part of tuning that no GPU speeds up.

  python scripts/search_overhead.py --norms layernorm --stages bwd --hidden 1024,2048,4096,7168 \\
      --chunk-rows 16,32 --trials 16
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time


def main(argv=None) -> int:
    from tvmnorm.cli import add_key_args, keys_from_args
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_key_args(p, stages_default="bwd")
    p.add_argument("--trials", type=int, default=8, help="candidates per task")
    p.add_argument("--chunk-rows", default=None, help="T values for the CUDA dx kernel, e.g. 16,32")
    args = p.parse_args(argv)
    from tvmnorm._tvm import ms
    from tvmnorm.measure import _Done
    from tvmnorm.measure import _derived as derived_object
    from tvmnorm.tune import _search_cores, _tasks, is_default_trace, search_session

    @derived_object
    class FakeBuilder(ms.builder.PyBuilder):
        # each artifact in its own fresh directory: MetaSchedule deletes the artifact's directory
        # after the run
        def build(self, inputs):
            return [ms.builder.BuilderResult(os.path.join(tempfile.mkdtemp(prefix="tvmnorm-fake-"), "c.so"), None)
                    for _ in inputs]

    @derived_object
    class FakeRunner(ms.runner.PyRunner):
        def run(self, inputs):
            return [_Done(ms.runner.RunnerResult([random.uniform(1e-4, 2e-4)], None)) for _ in inputs]

    keys = keys_from_args(args)
    chunks = [int(c) for c in args.chunk_rows.split(",")] if args.chunk_rows else None
    funcs, owner = _tasks(keys, "cuda", None, chunks)
    with tempfile.TemporaryDirectory(prefix="tvmnorm-search-") as work:
        t0 = time.time()
        _, db = search_session(keys, funcs, owner, "cuda", args.trials, work, FakeBuilder(), FakeRunner())
        wall = time.time() - t0
        traces = [r.trace for r in db.get_all_tuning_records()]
        defaults = sum(map(is_default_trace, traces))
    print(f"{len(keys)} keys, {len(funcs)} tasks, {len(traces) - defaults} candidates (and {defaults} default "
          f"schedules), {args.trials} trials per task: {wall:.1f} s, {wall / len(keys):.1f} s per key, "
          f"{_search_cores('cuda')} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
