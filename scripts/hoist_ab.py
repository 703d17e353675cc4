"""Adopt CudaRowConfig.hoist_inits for the committed backward records it made faster on the GPU.

The thirty-sixth lease built the bf16 backward library of the committed records twice, with the
running sums' init inside the dx walk (as tuned) and hoisted before it (_tvm.HOIST_INITS), and
timed both twice in turn (off, on, on, off: bench/results/h200-run36/ab/). A record whose dx ran
at least --min-speedup faster hoisted in every pair gets the knob (tune.with_hoist_inits: the
same trace with its walk annotated), and its measurements as ``hoist_inits_ab``; the others stay
as tuned. Records tuned from now on sample the knob themselves (sched.space.HOIST_INITS).

    python scripts/hoist_ab.py --off off-0.json off-1.json --on on-0.json on-1.json [--write]
"""
from __future__ import annotations

import argparse
import json
import pathlib

from tvmnorm.bench import record_key
from tvmnorm.tune import hoist_inits_of, load_records, save_records, with_hoist_inits


def tuned_us(path) -> dict:
    """packed key -> tvmnorm_tuned us of a bench file."""
    data = json.loads(pathlib.Path(path).read_text())
    return {record_key(r).pack(): r["us"] for r in data["records"]
            if r["impl"] == "tvmnorm_tuned" and r.get("status", "ok") == "ok"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--off", nargs="+", required=True, help="bench files of the library as tuned")
    ap.add_argument("--on", nargs="+", required=True, help="bench files of the hoisted library, paired in order")
    ap.add_argument("--min-speedup", type=float, default=1.01)
    ap.add_argument("--schedules", default=None, help="schedules folder (default: the repository's)")
    ap.add_argument("--write", action="store_true", help="write the adopted records (else only report)")
    args = ap.parse_args()
    if len(args.off) != len(args.on):
        raise SystemExit("--off and --on need as many files each: they are timed in pairs")
    off, on = [tuned_us(p) for p in args.off], [tuned_us(p) for p in args.on]
    records = load_records("cuda", args.schedules)
    adopted = 0
    for packed in sorted(set.intersection(*map(set, off + on))):
        rec = records.get(packed)
        speedups = [a[packed] / b[packed] for a, b in zip(off, on)]
        take = rec is not None and min(speedups) >= args.min_speedup and hoist_inits_of(rec) == 0
        print(f"{rec['key'] if rec else hex(packed):45s} off {' '.join(f'{a[packed]:8.2f}' for a in off)}  "
              f"on {' '.join(f'{b[packed]:8.2f}' for b in on)}  x{min(speedups):.3f}{'  adopted' if take else ''}")
        if take:
            records[packed] = dict(with_hoist_inits(rec), hoist_inits_ab={
                "off_us": [round(a[packed], 2) for a in off], "on_us": [round(b[packed], 2) for b in on],
                "files": [str(p) for p in args.off + args.on]})
            adopted += 1
    print(f"{adopted} records adopt hoist_inits (every pair at least x{args.min_speedup})")
    if args.write:
        save_records("cuda", records, args.schedules)


if __name__ == "__main__":
    main()
