"""Time MetaSchedule's search alone for CUDA keys, on a machine without a GPU: candidates are
drawn, ranked and recorded as in `tvmnorm tune`, but a fake builder compiles nothing and a fake
runner returns random times. What it prints is the per-key cost of the search itself (design
spaces, population draws, the cost model), the part of tuning that no GPU speeds up; with
--build nvcc the candidates are compiled too (with --overlap-builds while the search goes on).

  python scripts/search_overhead.py --norms layernorm --stages bwd --hidden 1024,2048,4096,7168 \\
      --chunk-rows 16,32 --trials 16
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time


def main(argv=None) -> int:
    from tvmnorm.cli import _chunk_rows, add_key_args, keys_from_args
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_key_args(p, stages_default="bwd")
    p.add_argument("--trials", type=int, default=8, help="candidates per task")
    p.add_argument("--chunk-rows", type=_chunk_rows, default=None,
                   help="T values for the CUDA dx kernel, e.g. 16,32, or all (default: each key's, tune.key_chunk_sizes)")
    p.add_argument("--build", choices=("nvrtc", "nvcc"), default=None,
                   help="really compile the candidates this way (nvcc works without a GPU), still timing none")
    p.add_argument("--overlap-builds", action="store_true", help="with --build, as tvmnorm tune --overlap-builds")
    args = p.parse_args(argv)
    from tvmnorm.measure import InProcessBuilder, RandomTimeRunner, SearchOnlyBuilder
    from tvmnorm.tune import _search_cores, _tasks, search_session

    keys = keys_from_args(args)
    funcs, owner = _tasks(keys, "cuda", None, args.chunk_rows)
    with tempfile.TemporaryDirectory(prefix="tvmnorm-search-") as work:
        t0 = time.time()
        builder = (InProcessBuilder("cuda", cuda_build=args.build, overlap=args.overlap_builds) if args.build
                   else SearchOnlyBuilder())
        seeds, db = search_session(keys, funcs, owner, "cuda", args.trials, work, builder,
                                   RandomTimeRunner(builder if args.build else None))
        wall = time.time() - t0
        records = db.get_all_tuning_records()
        traces, failed = len(records), sum(r.run_secs is None for r in records)
    print(f"{len(keys)} keys, {len(funcs)} tasks, {traces - seeds} candidates (and {seeds} seeds: default schedules, "
          f"committed records, torch.compile's shapes), {args.trials} trials per task: {wall:.1f} s, "
          f"{wall / len(keys):.1f} s per key, {_search_cores('cuda')} cores"
          + (f"; {failed} failed to build" if args.build else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
