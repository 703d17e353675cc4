"""The table of an interleaved A/B of libraries: `tvmnorm.bench` runs named LIB-I (I the run's
place in the order, e.g. old-0 new-1 new-2 old-3) in one folder, one row per (op, hidden) with
each library's times in run order ("untimed" where its runs have none), the fastest new over
the fastest old, and each side's best frac of copy.

    python bench/ab_table.py FOLDER [--base old]
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib


def ab_rows(folder) -> list:
    """(op, hidden, {library: [(us, frac), ...] in run order}) for every case of the runs."""
    runs = sorted(pathlib.Path(folder).glob("*-*.json"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    cases = collections.defaultdict(lambda: collections.defaultdict(list))
    for f in runs:
        for r in json.loads(f.read_text())["records"]:
            runs_of = cases[(r["op"], r["hidden"])][f.stem.rsplit("-", 1)[0]]
            if r.get("us") is not None:  # None: the run could not time it (its library missing, say)
                runs_of.append((r["us"], r.get("frac")))
    if not cases:
        raise SystemExit(f"no runs named LIB-I.json in {folder}")
    return [(op, h, dict(libs)) for (op, h), libs in sorted(cases.items())]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--base", default="old", help="the library the others are compared with")
    args = ap.parse_args(argv)
    for op, h, libs in ab_rows(args.folder):
        times = "  ".join(f"{lib} " + ("/".join(f"{us:.1f}" for us, _ in v) or "untimed")
                          for lib, v in sorted(libs.items()))
        libs = {lib: v for lib, v in libs.items() if v}
        base = libs.get(args.base)
        ratios = "".join(f"  {lib}/{args.base} {min(v)[0] / min(base)[0]:.3f}" for lib, v in sorted(libs.items())
                         if base and lib != args.base)
        fracs = "".join(f"  frac {lib} {max(f for _, f in v):.3f}" for lib, v in sorted(libs.items())
                        if all(f is not None for _, f in v))
        print(f"{op} {h}  {times}{ratios}{fracs}")


if __name__ == "__main__":
    main()
