"""Lease 51's accept, run here after the lease: the tune job's records judged against the committed
ones as the same machine (an H100) measured both libraries, timed old, new, new, old in one call
(ab*/old-0 ... old-1), each case at its faster round; the default's timings from the job's own
benchmark. Then `python -m tvmnorm.tune accept` as h200_tune.sh runs it (2% slack), except that
PREVIOUS is the committed records' library measured on this machine, not the H200's
h200-tuned.json (an H100 run against H200 timings would keep every committed record).

    python bench/results/h200-run51/ab_accept.py X_DIR AB_DIR JOB_SCHEDULES OUT_DIR
    python bench/results/h200-run51/ab_accept.py adopt OUT_DIR:AB_FILES_DIR ... [--write]

`adopt` takes from each OUT_DIR's accepted file only the records with a new kernel (another
fingerprint than the committed record's): a record whose trace the retune found again keeps its
committed form (its tuner time from the H200, its knob A/B), and each adopted one names the A/B
that let it in (``accepted_ab``: the machine, the files, old and new us at 16384 tokens).
"""
import json
import pathlib
import subprocess
import sys


def fastest(paths):
    """The first file's cases, each at the fastest of the files' timings of it (us and rates)."""
    runs = [json.loads(pathlib.Path(p).read_text()) for p in paths]
    best = {}
    for run in runs:
        for r in run["records"]:
            k = (r["op"], r["dtype"], r["hidden"], r["rows"], r["impl"])
            if r["status"] == "ok" and (k not in best or r["us"] < best[k]["us"]):
                best[k] = r
    out = dict(runs[0])
    out["records"] = [best.get((r["op"], r["dtype"], r["hidden"], r["rows"], r["impl"]), r) for r in runs[0]["records"]]
    return out


def main(x, ab, job_schedules, out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    new = fastest([f"{ab}/new-0.json", f"{ab}/new-1.json"])
    job = json.loads(pathlib.Path(f"{x}/h200-tuned.json").read_text())
    if new["meta"]["library"]["records"] != job["meta"]["library"]["records"]:
        sys.exit("the A/B's new library is not the job's")
    new["records"] += [r for r in job["records"] if r["impl"] == "tvmnorm_default"]
    (out / "bench-new.json").write_text(json.dumps(new))
    (out / "previous-old.json").write_text(json.dumps(fastest([f"{ab}/old-0.json", f"{ab}/old-1.json"])))
    return subprocess.call([sys.executable, "-m", "tvmnorm.tune", "accept", job_schedules, str(out / "bench-new.json"),
                            str(out / "accepted-cuda-sm_90.json"), "--accepted", "schedules/cuda-sm_90.json",
                            "--rejected", str(out / "rejected"), "--previous", str(out / "previous-old.json")])


def adopt(runs, write=False):
    from tvmnorm.bench import record_key
    from tvmnorm.build import record_fingerprint
    from tvmnorm.tune import write_schedules
    committed = json.loads(pathlib.Path("schedules/cuda-sm_90.json").read_text())
    records, changed = committed["records"], []
    # against the records as committed: each job's accepted file also holds the other job's keys
    # as committed, which are no retune of its own
    before = dict(records)
    for run in runs:
        out, files = run.split(":")
        accepted = json.loads(pathlib.Path(f"{out}/accepted-cuda-sm_90.json").read_text())["records"]
        timings = {name: json.loads(pathlib.Path(f"{files}/{name}.json").read_text())
                   for name in ("old-0", "old-1", "new-0", "new-1")}
        device = timings["new-0"]["meta"]["device"]
        for packed, rec in accepted.items():
            if record_fingerprint(rec) == record_fingerprint(before.get(packed)):
                continue

            def us(name):
                return [round(r["us"], 2) for r in timings[name]["records"] if r["impl"] == "tvmnorm_tuned"
                        and record_key(r).pack() == int(packed, 16) and r["rows"] in (16384, 524288)][0]
            ab = {"device": device, "files": [f"{files}/{n}.json" for n in timings],  # as given: from the repo root
                  "old_us": [us("old-0"), us("old-1")], "new_us": [us("new-0"), us("new-1")]}
            records[packed] = dict(rec, accepted_ab=ab)
            changed.append(packed)
            print(f"{rec['key']}: {ab['old_us']} -> {ab['new_us']} us on {device}")
    committed["changes"] = {"records": sorted(changed), "dropped": []}
    if write:
        write_schedules("schedules/cuda-sm_90.json", committed)
        print(f"{len(changed)} records adopted -> schedules/cuda-sm_90.json")


if __name__ == "__main__":
    if sys.argv[1:2] == ["adopt"]:
        sys.exit(adopt([a for a in sys.argv[2:] if a != "--write"], "--write" in sys.argv))
    sys.exit(main(*sys.argv[1:]))
