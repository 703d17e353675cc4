"""The README's H200 tables (section Benchmarks) from a merged bench file, so that they are
regenerated, not retyped, after each lease:

    python bench/readme_tables.py bench/results/h200-tuned.json

bf16 training rows of the catalog, by hidden size. Cells are ``frac`` for tuned / default / eager /
torch.compile / Liger; "–" in the first place where the library serves the default kernel (the
key's record is the default's schedule: no tvmnorm_tuned row). The second table has the fp8
forwards, the copy of each case's own bytes as a fraction of the large copy, and the served
kernel's ``frac_at_size``. Then the counts of the README's status table (``targets``).
"""
from __future__ import annotations

import argparse
import json

from tvmnorm.shapes import hidden_sizes, train_rows

IMPLS = ("tvmnorm_tuned", "tvmnorm_default", "torch_eager", "torch_compile", "liger")
PEERS = IMPLS[2:]
TRAIN = ("rmsnorm_fwd", "layernorm_fwd", "rmsnorm_bwd", "layernorm_bwd")
FP8 = ("rmsnorm_fwd_fp8", "layernorm_fwd_fp8")


def cases(records: list) -> dict:
    """(op, hidden) -> impl -> record, for the bf16 training rows that ran."""
    out = {}
    for r in records:
        if r["dtype"] == "bf16" and r["rows"] == train_rows(r["hidden"]) and r.get("status") == "ok":
            out.setdefault((r["op"], r["hidden"]), {})[r["impl"]] = r
    return out


def cell(by_impl: dict, impls) -> str:
    return " / ".join(f"{by_impl[i]['frac']:.2f}" if i in by_impl else "–" for i in impls)


def served(by_impl: dict) -> dict | None:
    return by_impl.get("tvmnorm_tuned") or by_impl.get("tvmnorm_default")


def tables(records: list) -> str:
    c = cases(records)
    lines = ["| hidden | rows | " + " | ".join(TRAIN) + " |", "|---" * (2 + len(TRAIN)) + "|"]
    for h in sorted(hidden_sizes()):
        lines.append(f"| {h} | {train_rows(h)} | " + " | ".join(cell(c.get((op, h), {}), IMPLS) for op in TRAIN) + " |")
    lines += ["", "| hidden | " + " | ".join(FP8) + " | copy at size: fwd / bwd / fp8 | served at size: rms fwd / "
              "ln fwd / rms bwd / ln bwd |", "|---" * (3 + len(FP8)) + "|"]
    for h in sorted(hidden_sizes()):
        fp8 = [cell(c.get((op, h), {}), IMPLS[:4]) for op in FP8]
        ceilings = []
        for op in ("rmsnorm_fwd", "rmsnorm_bwd", "rmsnorm_fwd_fp8"):
            r = served(c.get((op, h), {}))
            ceilings.append(f"{at_size(r):.2f}" if r else "–")
        frac_at = []
        for op in TRAIN:
            r = served(c.get((op, h), {}))
            frac_at.append(f"{r['frac_at_size']:.2f}" if r else "–")
        lines.append(f"| {h} | " + " | ".join(fp8) + f" | {' / '.join(ceilings)} | {' / '.join(frac_at)} |")
    return "\n".join(lines)


def at_size(r: dict) -> float | None:
    """A copy of the case's own bytes as a fraction of the large copy: the ceiling at its size."""
    return r["copy_at_size_gbps"] / r["copy_gbps"] if r.get("copy_at_size_gbps") and r.get("copy_gbps") else None


def best_peer(by_impl: dict) -> dict | None:
    timed = [by_impl[i] for i in PEERS if i in by_impl]
    return min(timed, key=lambda r: r["us"]) if timed else None


def targets(records: list) -> str:
    """Per op, the issue's targets at 16384 tokens (the served kernel's frac range, shapes at or
    above 1.0x the best peer, and at or above 1.3x where that peer is below 0.75 of copy), and
    at decode rows the cells whose served kernel is no slower than the best peer."""
    c = cases(records)
    lines = []
    for op in TRAIN + FP8:
        pairs = [(served(c[k]), best_peer(c[k])) for k in sorted(c) if k[0] == op]
        pairs = [(s, p) for s, p in pairs if s and p]
        if not pairs:
            continue
        fracs = [s["frac"] for s, _ in pairs]
        behind = [f"{s['hidden']} ({p['us'] / s['us']:.2f}x {p['impl']})" for s, p in pairs if s["us"] > p["us"]]
        slow = [(s, p) for s, p in pairs if p["frac"] < 0.75]
        # a miss where 1.3x the peer is more than a copy of the case's own bytes reaches (the
        # ceiling at that size) cannot be met by any kernel that moves those bytes
        beyond = [f"{s['hidden']} (needs {1.3 * p['frac']:.2f}, copy at size {at_size(s):.2f})"
                  for s, p in slow if p["us"] < 1.3 * s["us"] and at_size(s) is not None and 1.3 * p["frac"] > at_size(s)]
        lines.append(f"{op}: frac {min(fracs):.2f}-{max(fracs):.2f}; >= 1.0x {len(pairs) - len(behind)} of "
                     f"{len(pairs)}" + (f" (behind: {', '.join(behind)})" if behind else "")
                     + f"; >= 1.3x where the peer < 0.75: {sum(p['us'] >= 1.3 * s['us'] for s, p in slow)} of {len(slow)}"
                     + (f" (missed beyond a copy of their own bytes: {', '.join(beyond)})" if beyond else ""))
    decode = {}
    for r in records:
        if r["dtype"] == "bf16" and r["rows"] != train_rows(r["hidden"]) and r.get("status") == "ok":
            decode.setdefault((r["op"], r["hidden"], r["rows"]), {})[r["impl"]] = r
    for op in TRAIN:
        # a key whose record the training run timed has tuned decode rows: those the record
        # serves from the run whose library held it, those the decode kernels serve from any
        # (bench.merge). A decode case without one was not measured since the record changed,
        # and the default's time would stand in for a kernel that did not run
        of_op = [(k, v) for k, v in sorted(decode.items()) if k[0] == op]
        unmeasured = [k for k, v in of_op if "tvmnorm_tuned" not in v and "tvmnorm_tuned" in c.get((op, k[1]), {})]
        pairs = [(served(v), best_peer(v)) for k, v in of_op if k not in unmeasured]
        pairs = [(s, p) for s, p in pairs if s and p]
        if pairs:
            behind = [f"{s['hidden']} x {s['rows']} ({s['us']:.1f} vs {p['impl']} {p['us']:.1f} us)"
                      for s, p in pairs if s["us"] > p["us"]]
            lines.append(f"{op} decode: <= best peer {len(pairs) - len(behind)} of {len(pairs)}"
                         + (f" (behind: {', '.join(behind)})" if behind else "")
                         + (f"; not measured with the committed record: {', '.join(f'{h} x {m}' for _, h, m in unmeasured)}"
                            if unmeasured else ""))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_json")
    args = ap.parse_args()
    records = json.load(open(args.bench_json))["records"]
    print(tables(records))
    print()
    print(targets(records))


if __name__ == "__main__":
    main()
