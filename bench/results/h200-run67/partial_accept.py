"""Lease 67's accept of the records adopted from H100 leases, from the benchmark's progress lines.

`l66.sh bench` timed the 72 records of leases 55-58 beside their defaults at 16384 tokens on the
H200, three benchmark processes of 110 s each; all three ran out of time before writing their
JSON (rc 124), so what they measured is only in the progress lines of `h100rec-bench/*.log`
(44 of the 72 keys, one line a case: tuned and default, each the median of its do_bench
timings). This turns those lines into a `tvmnorm bench` JSON (`h100rec-bench/progress.json`,
nothing but the measured microseconds and the keys) and runs `tune accept` on the committed
records with it: a record slower than its default beyond 2% on the H200 is replaced with the
default rule's schedule (`default_won`), as every other accept does; a key not timed is kept.

    python bench/results/h200-run67/partial_accept.py [--write]   # from the repo root
"""
import json
import pathlib
import re
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
LINE = re.compile(r"^\[\d+/\d+\] (?P<op>\S+) (?P<dtype>\S+) H=(?P<hidden>\d+) M=(?P<rows>\d+): "
                  r"tvmnorm_tuned (?P<tuned>[\d.]+)us \S+\s+tvmnorm_default (?P<default>[\d.]+)us")


def progress_records(logs) -> list:
    out = []
    for log in logs:
        for line in log.read_text().splitlines():
            m = LINE.match(line)
            if not m:
                continue
            case = dict(op=m["op"], dtype=m["dtype"], hidden=int(m["hidden"]), rows=int(m["rows"]), status="ok")
            out += [dict(case, impl="tvmnorm_tuned", us=float(m["tuned"])),
                    dict(case, impl="tvmnorm_default", us=float(m["default"]))]
    return out


def main(write: bool) -> int:
    logs = sorted((HERE / "h100rec-bench").glob("bench-*.log"))
    records = progress_records(logs)
    bench = {"meta": {"target": "cuda", "fp8_format": "fp8e4m3", "device": "NVIDIA H200",
                      "from": [f"{log.name} (progress lines)" for log in logs]},
             "records": records}
    path = HERE / "h100rec-bench" / "progress.json"
    path.write_text(json.dumps(bench, indent=1) + "\n")
    print(f"{len(records) // 2} cases -> {path.relative_to(HERE.parent.parent.parent)}")
    out = "schedules/cuda-sm_90.json" if write else str(HERE / "h100rec-bench" / "accepted-cuda-sm_90.json")
    return subprocess.call([sys.executable, "-m", "tvmnorm.tune", "accept", "schedules/cuda-sm_90.json", str(path),
                            out, "--accepted", "schedules/cuda-sm_90.json"])


if __name__ == "__main__":
    sys.exit(main("--write" in sys.argv))
