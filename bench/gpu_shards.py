"""Deals a GPU lease's test ids to pytest shards by their expected seconds, keeping the tests that
share a library fixture (tests/conftest.library_fixture) together.

bench/gpu_tests.sh dealt the ids round-robin: neighbouring parametrisations cost about the same,
but a module fixture that builds a library (nvcc, up to four minutes of one core) was then built
in every shard that drew one of its tests, and lease 72's 15 shards spent 3215 of 5466
shard-seconds in such setups. Here each library's tests form one unit that pays the build once
(cut into as few pieces as the shards' fair share allows), the other ids form runs of a few
neighbours of one test function (they compile the same default kernels, which the shards' shared
cache then holds for the rest of the run), and the units go longest first to the shard with the
least expected time.

Expected seconds come from the times the shards logged (tests/conftest.py, TVMNORM_TEST_TIMES),
merged into bench/gpu_test_times.tsv (`--merge`): an id's own, else its test function's median,
else DEFAULT_TEST_S.

  python bench/gpu_shards.py deal --ids D/ids.txt --groups D/groups.txt --shards 15 --out D
  python bench/gpu_shards.py merge bench/results/h200-run72/tests-*/gpu-tests/times-*.txt
"""
from __future__ import annotations

import argparse
import math
import pathlib
import statistics
import sys

TIMES = pathlib.Path(__file__).resolve().parent / "gpu_test_times.tsv"
# ~14 s a test a shard on an H100 when every shard compiled its own default kernels (leases 70,
# 71); a library fixture's build measured 50-232 s on lease 72's H200 host
DEFAULT_TEST_S = 14.0
DEFAULT_LIBRARY_S = 240.0
# a setup this long built a library; shorter ones are the test's own (fixtures of inputs)
LIBRARY_SETUP_S = 30.0
RUN = 4  # neighbouring ids of one test function dealt together


def function_of(nodeid: str) -> str:
    return nodeid.split("[", 1)[0]


def read_times(path: pathlib.Path = TIMES) -> dict[str, tuple[float, float]]:
    """nodeid -> (setup s, call s) of bench/gpu_test_times.tsv ({} when there is none)."""
    if not path.exists():
        return {}
    times = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            nodeid, setup, call = line.split("\t")
            times[nodeid] = (float(setup), float(call))
    return times


def merge(logs: list[pathlib.Path], path: pathlib.Path = TIMES) -> int:
    """Folds shard logs ("seconds phase outcome nodeid" lines) into ``path``: a later log's
    phase replaces an earlier one's, ids not in the logs keep theirs. Returns the ids updated."""
    times = read_times(path)
    updated = {}
    for log in logs:
        for line in pathlib.Path(log).read_text().splitlines():
            parts = line.split(" ", 3)
            if len(parts) != 4 or parts[1] not in ("setup", "call"):
                continue
            setup, call = updated.get(parts[3], times.get(parts[3], (0.0, 0.0)))
            seconds = float(parts[0])
            updated[parts[3]] = (seconds, call) if parts[1] == "setup" else (setup, seconds)
    times.update(updated)
    lines = ["# nodeid\tsetup s\tcall s: the last GPU lease's shard logs (bench/gpu_shards.py merge)"]
    lines += [f"{k}\t{s:.2f}\t{c:.2f}" for k, (s, c) in sorted(times.items())]
    path.write_text("\n".join(lines) + "\n")
    return len(updated)


def expected_seconds(ids: list[str], times: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each id's expected seconds, without a library build its setup may have paid."""
    own = {k: c + (s if s < LIBRARY_SETUP_S else 0.0) for k, (s, c) in times.items()}
    by_function: dict[str, list[float]] = {}
    for k, v in own.items():
        by_function.setdefault(function_of(k), []).append(v)
    medians = {f: statistics.median(v) for f, v in by_function.items()}
    return {i: own.get(i, medians.get(function_of(i), DEFAULT_TEST_S)) for i in ids}


def build_seconds(group_ids: list[str], times: dict[str, tuple[float, float]]) -> float:
    """A library fixture's build: the longest setup its tests logged, DEFAULT_LIBRARY_S unlogged."""
    setups = [times[i][0] for i in group_ids if i in times]
    return max(setups) if setups else DEFAULT_LIBRARY_S


def library_builds(ids: list[str], groups: dict[str, str],
                   times: dict[str, tuple[float, float]]) -> tuple[dict[str, list[str]], dict[str, float]]:
    """(library group -> its ids in order, library group -> its build's seconds)."""
    by_group: dict[str, list[str]] = {}
    for i in ids:
        if groups.get(i):
            by_group.setdefault(groups[i], []).append(i)
    return by_group, {g: build_seconds(v, times) for g, v in by_group.items()}


def units_of(ids: list[str], groups: dict[str, str], cost: dict[str, float],
             times: dict[str, tuple[float, float]], shards: int) -> list[tuple[float, list[str]]]:
    """(expected seconds, ids) units: each library group, cut into pieces no longer than the
    shards' fair share where it can be, and runs of RUN neighbours of one test function."""
    by_group, builds = library_builds(ids, groups, times)
    plain = [i for i in ids if not groups.get(i)]
    fair = max((sum(cost.values()) + sum(builds.values())) / max(shards, 1), 1e-9)  # logs of 0 s: one piece
    units = []
    for g, members in by_group.items():
        total = builds[g] + sum(cost[i] for i in members)
        pieces = min(len(members), max(1, math.ceil(total / fair)))
        for p in range(pieces):
            piece = members[p * len(members) // pieces:(p + 1) * len(members) // pieces]
            units.append((builds[g] + sum(cost[i] for i in piece), piece))
    run: list[str] = []
    for i in plain + [None]:
        if run and (i is None or len(run) == RUN or function_of(i) != function_of(run[0])):
            units.append((sum(cost[k] for k in run), run))
            run = []
        if i is not None:
            run.append(i)
    return units


def deal(ids: list[str], groups: dict[str, str], shards: int,
         times: dict[str, tuple[float, float]]) -> tuple[list[list[str]], list[float]]:
    """The shards' ids (each in collection order) and their expected seconds: units longest
    first, each to the shard expected to finish first."""
    cost = expected_seconds(ids, times)
    order = {i: n for n, i in enumerate(ids)}
    loads = [0.0] * shards
    dealt: list[list[str]] = [[] for _ in range(shards)]
    for seconds, members in sorted(units_of(ids, groups, cost, times, shards), key=lambda u: -u[0]):
        s = min(range(shards), key=lambda k: (loads[k], len(dealt[k])))  # ties: the fewest ids
        loads[s] += seconds
        dealt[s] += members
    return [sorted(d, key=order.__getitem__) for d in dealt], loads


def round_robin_seconds(ids: list[str], groups: dict[str, str], shards: int,
                        times: dict[str, tuple[float, float]]) -> list[float]:
    """What the round-robin dealing would be expected to take a shard, for the log."""
    cost = expected_seconds(ids, times)
    _, builds = library_builds(ids, groups, times)
    loads = []
    for s in range(shards):
        mine = ids[s::shards]
        built = {groups[i] for i in mine if groups.get(i)}
        loads.append(sum(cost[i] for i in mine) + sum(builds[g] for g in built))
    return loads


def read_groups(path: pathlib.Path) -> dict[str, str]:
    """nodeid -> its library fixtures ("" for none), as tests/conftest.py's
    TVMNORM_LIBRARY_GROUPS writes them; {} when the file is missing (every id on its own)."""
    if not path.exists():
        return {}
    return dict(line.split("\t", 1) for line in path.read_text().splitlines() if "\t" in line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("deal", help="write OUT/ids-<i>.txt for SHARDS shards")
    d.add_argument("--ids", type=pathlib.Path, required=True)
    d.add_argument("--groups", type=pathlib.Path, required=True)
    d.add_argument("--shards", type=int, required=True)
    d.add_argument("--out", type=pathlib.Path, required=True)
    d.add_argument("--times", type=pathlib.Path, default=TIMES)
    m = sub.add_parser("merge", help="fold shard logs (times-<i>.txt) into the times table")
    m.add_argument("logs", type=pathlib.Path, nargs="+")
    m.add_argument("--times", type=pathlib.Path, default=TIMES)
    a = ap.parse_args(argv)
    if a.cmd == "merge":
        print(f"{merge(a.logs, a.times)} ids updated in {a.times}")
        return 0
    if a.shards < 1:
        ap.error("--shards must be at least 1")
    ids = [line for line in a.ids.read_text().splitlines() if line]
    groups = read_groups(a.groups)
    unknown = sum(i not in groups for i in ids)
    if unknown:
        # tests/conftest.py wrote no line for them (another conftest, a failed hook): each such id
        # is dealt alone, and a library fixture among them is built once a shard that draws it
        print(f"gpu_shards: {unknown} of {len(ids)} ids have no line in {a.groups}: dealt as using no library",
              file=sys.stderr)
    times = read_times(a.times)
    dealt, loads = deal(ids, groups, a.shards, times)
    for s, members in enumerate(dealt):
        (a.out / f"ids-{s}.txt").write_text("".join(f"{i}\n" for i in members))
    rr = round_robin_seconds(ids, groups, a.shards, times) if ids else [0.0]
    known = sum(i in times for i in ids)
    print(f"dealt {len(ids)} ids ({known} with logged times) to {a.shards} shards: expected "
          f"{max(loads):.0f} s the longest, {sum(loads) / a.shards:.0f} s on average "
          f"(round-robin: {max(rr):.0f} s the longest)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
