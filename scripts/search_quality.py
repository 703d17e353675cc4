"""How close to its best the search's measured candidates came, per task of MetaSchedule JSON
databases (a tuning_logs/<target>/run-*/ folder, gzipped or not): the more the cost model ranks
well, the more of a task's later candidates (those it picked with more training data) land near
the best. Tasks are named from their arguments (norm, stage, hidden, the dx's T), so the same task
in several runs lines up:

  python scripts/search_quality.py tuning_logs/cuda-sm_90/run-2026-12-02-l29-rms \\
      tuning_logs/cuda-sm_90/run-2026-12-02-l30-bwd

Per task: candidates, the best time (us) and where it came, and the median of the second half's
times over the best (1.00: every later candidate matched the best).
"""
from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import statistics


def _lines(path: pathlib.Path) -> list:
    if not path.exists():
        path = path.with_name(path.name + ".gz")
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def task_name(args_info: list) -> str:
    """A CUDA fwd or dx task's name from its tensor arguments: the rows operand [N, H], one float32
    [N] statistic for RMSNorm and two for LayerNorm, and the dx's partial sums [k, P, H] (P = N / T,
    rounded up)."""
    shapes = [a[2] for a in args_info if a[0] == "TENSOR"]
    n, hidden = next(s for s in shapes if len(s) == 2)
    stats = sum(1 for a in args_info if a[0] == "TENSOR" and a[1] == "float32" and a[2] == [n])
    norm = {1: "rmsnorm", 2: "layernorm"}.get(stats, f"{stats}-stat")
    partials = [s for s in shapes if len(s) == 3]
    if not partials:
        return f"{norm} fwd h{hidden}"
    p = partials[0][1]
    t = next(t for t in (2 ** i for i in range(16)) if -(-n // t) == p)
    return f"{norm} dx h{hidden} T{t}"


def candidates(run: pathlib.Path) -> dict:
    """task name -> the measured times (us) of its candidates, in the order the search committed them."""
    out = {}
    for _workload, (_trace, secs, _target, args_info) in _lines(run / "database_tuning_record.json"):
        if secs and max(secs) < 1e9:  # a failed build or run records 1e10
            out.setdefault(task_name(args_info), []).append(statistics.median(secs) * 1e6)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=pathlib.Path, help="folders holding a database_tuning_record.json(.gz)")
    args = p.parse_args(argv)
    runs = {run: candidates(run) for run in args.runs}
    for name in sorted({n for c in runs.values() for n in c}):
        print(name)
        for run, tasks in runs.items():
            if name in tasks:
                ts = tasks[name]
                best, late = min(ts), ts[len(ts) // 2:]
                print(f"  {run.name:32s} n={len(ts):3d} best {best:7.1f} at #{ts.index(best):<3d}"
                      f" 2nd-half median/best {statistics.median(late) / best:5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
