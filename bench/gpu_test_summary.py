"""The summary of bench/gpu_tests.sh's shards: passed/failed/skipped/errors added up over every
shard file, the failures listed, and for a shard stopped before its summary line (TEST_SECONDS,
or a crash) how far it got, counted from pytest -q's progress characters, with the ids it never
reached written to not-reached.txt (for a later IDS=... run).

    python bench/gpu_test_summary.py DIR TOTAL     # DIR: shard-<i>.txt and ids-<i>.txt

Exit status 0 only if every shard finished, nothing failed or errored, and passed + skipped
covers TOTAL."""
from __future__ import annotations

import pathlib
import re
import sys

FINAL = re.compile(r"\b\d+ (passed|failed|skipped|errors?|deselected)\b.* in [\d.]+s")
# pytest -q prints a character a finished test ("....F.s  [ 12%]") as it goes
PROGRESS = re.compile(r"([.FEsxX]+)\s*(\[\s*\d+%\])?")
MARKS = ((".", "passed"), ("F", "failed"), ("E", "error"), ("s", "skipped"))


def summarize(d: pathlib.Path, total: int) -> tuple[str, int]:
    """(the summary's text, the exit status)."""
    counts, failures, unfinished, not_reached = {}, [], [], []
    for f in sorted(d.glob("shard-*.txt")):
        text = f.read_text()
        final = [line for line in text.splitlines() if FINAL.search(line)]
        if not final:
            marks = "".join(m.group(1) for m in (PROGRESS.fullmatch(line.strip()) for line in text.splitlines()) if m)
            tally = {what: marks.count(ch) for ch, what in MARKS}
            shard_ids = d / f.name.replace("shard-", "ids-")
            ids = shard_ids.read_text().split() if shard_ids.exists() else []
            not_reached += ids[len(marks):]
            of = len(ids) if shard_ids.exists() else "?"
            why = ("ran no tests" if "no tests ran" in text else
                   f"no summary line (stopped by TEST_SECONDS or crashed) after {len(marks)} of {of} tests: "
                   + ", ".join(f"{n} {what}" for what, n in tally.items()))
            unfinished.append(f"{f.name}: {why}")
            for what, n in tally.items():
                if n:
                    counts[what] = counts.get(what, 0) + n
        for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", final[-1] if final else ""):
            what = "error" if what.startswith("error") else what
            counts[what] = counts.get(what, 0) + int(n)
        failures += [line for line in text.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    out = [f"{total} tests: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), *unfinished]
    if not_reached:
        (d / "not-reached.txt").write_text("".join(i + "\n" for i in not_reached))
        out.append(f"{len(not_reached)} ids not reached: {d / 'not-reached.txt'}")
    if not counts.get("passed"):
        out.append("no test passed: on a GPU machine, read a shard's skip reasons (-rs)")
    out += failures
    bad = (failures or unfinished or counts.get("failed") or counts.get("error") or not counts.get("passed")
           or counts.get("passed", 0) + counts.get("skipped", 0) < total)
    return "\n".join(out), 1 if bad else 0


if __name__ == "__main__":
    text, status = summarize(pathlib.Path(sys.argv[1]), int(sys.argv[2]))
    print(text)
    sys.exit(status)
