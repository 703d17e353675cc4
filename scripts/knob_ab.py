"""A GPU A/B of a 0/1 dx knob on the committed backward records, and the records that take it.

Records tuned before a knob of the dx (sched.rows.DX_SUM_KNOBS: hoist_inits, shared_sums) never
ran with it; the space samples it from then on. The A/B builds the library of the committed
records twice, as tuned (off) and with the knob on (on: tune.with_knob, the same trace with the
knob annotated), times both in turn (off, on, on, off: `tvmnorm.bench --impls tvmnorm_tuned`,
which checks every kernel against float64 first), and a record whose call ran at least
--min-speedup faster with the knob in every pair takes it, with its measurements as
``<knob>_ab``; the others stay as tuned. The thirty-sixth lease did so for hoist_inits
(bench/results/h200-run36/), h200-run50 for shared_sums.

    python scripts/knob_ab.py prepare --knob shared_sums --stages bwd --dtypes bf16 --out on/
    tvmnorm build --target cuda --tuned-only --schedules on/ ...    (and the committed records)
    python scripts/knob_ab.py adopt --knob shared_sums --off off-0.json off-1.json \\
        --on on-0.json on-1.json [--write]

``prepare`` keeps out the records whose dx does not build with the knob (shared_sums that cannot
launch beside a staged variant's shared memory: _tvm.shared_sums_problem) and says why.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import pathlib

from tvmnorm.bench import record_key
from tvmnorm.key import NormKey
from tvmnorm.sched.rows import DX_SUM_KNOBS
from tvmnorm.tune import knob_of, load_records, save_records, with_knob


def tuned_us(path) -> dict:
    """packed key -> tvmnorm_tuned us of a bench file."""
    data = json.loads(pathlib.Path(path).read_text())
    return {record_key(r).pack(): r["us"] for r in data["records"]
            if r["impl"] == "tvmnorm_tuned" and r.get("status", "ok") == "ok"}


def builds(packed: int, record: dict) -> str | None:
    """Why ``record``'s dx does not compile for CUDA (no GPU needed), or None."""
    from tvmnorm.build import compile_funcs, scheduled_funcs
    try:
        compile_funcs(scheduled_funcs(NormKey.unpack(packed), "cuda", record, parts=["dx"]), "cuda")
    except Exception as e:  # noqa: BLE001 - the reason is reported, the record left out
        return f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"
    return None


def prepare(args) -> None:
    records = load_records("cuda", args.schedules)
    stages, dtypes = args.stages.split(","), args.dtypes.split(",")
    chosen, why = {}, {}
    for packed, rec in records.items():
        key = NormKey.unpack(packed)
        if key.stage in stages and key.itype in dtypes and "dx" in rec.get("parts", {}) and not knob_of(rec, args.knob):
            try:
                chosen[packed] = with_knob(rec, args.knob)
            except ValueError as e:  # a trace without the walk's marks (an old default_record)
                chosen[packed], why[packed] = rec, str(e)
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        todo = [p for p in chosen if p not in why]
        why.update(zip(todo, pool.map(builds, todo, [chosen[p] for p in todo])))
    for packed, problem in sorted(why.items()):
        print(f"{chosen[packed]['key']:45s} {'left out: ' + problem if problem else args.knob}")
    out = {packed: (rec if why.get(packed) else chosen.get(packed, rec)) for packed, rec in records.items()}
    print(f"{sum(p is None for p in why.values())} of {len(why)} records with {args.knob} -> {args.out}")
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    save_records("cuda", out, args.out)


def adopt(args) -> None:
    if len(args.off) != len(args.on):
        raise SystemExit("--off and --on need as many files each: they are timed in pairs")
    off, on = [tuned_us(p) for p in args.off], [tuned_us(p) for p in args.on]
    records = load_records("cuda", args.schedules)
    adopted = 0
    for packed in sorted(set.intersection(*map(set, off + on))):
        rec = records.get(packed)
        speedups = [a[packed] / b[packed] for a, b in zip(off, on)]
        take = rec is not None and min(speedups) >= args.min_speedup and knob_of(rec, args.knob) == 0
        print(f"{rec['key'] if rec else hex(packed):45s} off {' '.join(f'{a[packed]:8.2f}' for a in off)}  "
              f"on {' '.join(f'{b[packed]:8.2f}' for b in on)}  x{min(speedups):.3f}{'  adopted' if take else ''}")
        if take:
            records[packed] = dict(with_knob(rec, args.knob), **{f"{args.knob}_ab": {
                "off_us": [round(a[packed], 2) for a in off], "on_us": [round(b[packed], 2) for b in on],
                "files": [str(p) for p in args.off + args.on]}})
            adopted += 1
    print(f"{adopted} records adopt {args.knob} (every pair at least x{args.min_speedup})")
    if args.write:
        save_records("cuda", records, args.schedules)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write the records with the knob on (those whose dx builds)")
    p.add_argument("--out", required=True, help="schedules folder to write")
    p.add_argument("--stages", default="bwd")
    p.add_argument("--dtypes", default="bf16")
    p.add_argument("--jobs", type=int, default=4)
    a = sub.add_parser("adopt", help="give the knob to the records it made faster in every pair")
    a.add_argument("--off", nargs="+", required=True, help="bench files of the library as tuned")
    a.add_argument("--on", nargs="+", required=True, help="bench files of the library with the knob, paired in order")
    a.add_argument("--min-speedup", type=float, default=1.01)
    a.add_argument("--write", action="store_true", help="write the adopted records (else only report)")
    for q in (p, a):
        q.add_argument("--knob", required=True, choices=DX_SUM_KNOBS)
        q.add_argument("--schedules", default=None, help="schedules folder (default: the repository's)")
    args = ap.parse_args()
    (prepare if args.command == "prepare" else adopt)(args)


if __name__ == "__main__":
    main()
