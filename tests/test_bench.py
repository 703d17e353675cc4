"""The benchmark harness on the CPU: two tiny awkward shapes, JSON/CSV schema, refcheck, compare.

torch.compile is deselected (--impls): Inductor's C++ build would dominate the test time.
"""
import argparse
import copy
import csv
import json
import math
import os
import pathlib
import re

import pytest

torch = pytest.importorskip("torch")

from tvmnorm import bench  # noqa: E402

FAST = ["--target", "llvm", "--hidden", "64,200", "--rows", "7", "--warmup-ms", "1", "--rep-ms", "5",
        "--copy-bytes", str(16 << 20), "--max-sets", "2", "--quiet"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    mp = pytest.MonkeyPatch()
    # an empty library directory: tvmnorm_tuned must then say "missing", never time the default
    mp.setenv("TVMNORM_LIBRARY", str(out / "no-library"))
    try:
        # every op, the *_add ones (not in a run's default --ops) too
        rc = bench.main(FAST + ["--dtypes", "bf16", "--impls", "tvmnorm_tuned,tvmnorm_default,torch_eager",
                                "--ops", ",".join(bench.OPS), "--out", str(out), "--name", "t"])
    finally:
        mp.undo()
    assert rc == 0
    return out


def test_schema(run_dir):
    result = json.loads((run_dir / "t.json").read_text())
    bench.validate(result)
    meta, records = result["meta"], result["records"]
    for k in ("device", "versions", "git_commit", "command_line", "timestamp", "copy_gbps", "repro"):
        assert meta[k] is not None, k
    assert meta["versions"]["torch"] and meta["versions"]["tvm"] and meta["versions"]["tvm_ffi"]
    assert meta["repro"].count("tvmnorm bench") == 1
    assert len(records) == len(bench.OPS) * 2 * 3  # ops x hidden sizes x impls
    assert {r["op"] for r in records} == set(bench.OPS)
    for r in records:
        assert r["dtype"] == "bf16" and r["rows"] == 7
        if r["impl"] == "tvmnorm_tuned":
            assert r["status"] == "missing" and r["us"] is None, r
        else:
            assert r["status"] == "ok", r
            assert r["err"] <= r["tol"]
            assert r["frac"] == pytest.approx(r["gbps"] / r["copy_gbps"])
            # the ceiling at the case's own size: one copy of its bytes, the same for every impl
            assert r["copy_at_size_gbps"] > 0 and r["frac_at_size"] == pytest.approx(r["gbps"] / r["copy_at_size_gbps"])
            same = {x["copy_at_size_gbps"] for x in records if (x["op"], x["hidden"]) == (r["op"], r["hidden"])
                    and x["status"] == "ok"}
            assert len(same) == 1
            size = 2
            want = {"fwd": 2 * 7 * r["hidden"] * size, "bwd": 3 * 7 * r["hidden"] * size,
                    "bwd_add": 4 * 7 * r["hidden"] * size, "fwd_add": 4 * 7 * r["hidden"] * size}
            if r["op"].endswith("fp8"):
                reads_adds = 3 if "_add" in r["op"] else 1  # x and residual read, h written
                assert r["bytes"] == 7 * r["hidden"] * (reads_adds * size + 1)
            else:
                assert r["bytes"] == want[bench.OPS[r["op"]][1]]
            assert r["gbps"] == pytest.approx(r["bytes"] / (r["us"] * 1e-6) / 1e9)
    with open(run_dir / "t.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(records)
    assert set(bench.RECORD_KEYS) <= set(rows[0])
    pngs = sorted(run_dir.glob("t_*.png"))
    assert len(pngs) == len(bench.OPS)  # one figure per (op, dtype, rows)
    assert all(p.stat().st_size > 1000 for p in pngs)


@pytest.mark.parametrize("stage", ("bwd_add", "fwd_add"))
def test_residual_add_ops(run_dir, stage):
    """rmsnorm_bwd_add / layernorm_bwd_add time the bwd_add kernels (dx with dz, the gradient
    reaching x around the norm, added) against torch's backward with dz summed into x's
    gradient as autograd sums it; rmsnorm_fwd_add / layernorm_fwd_add the fwd_add kernels (y and
    h = x + residual) against torch's add and then the norm; all right against float64, h
    among the outputs checked (test_schema). A run takes them only when --ops names them."""
    records = json.loads((run_dir / "t.json").read_text())["records"]
    add = [r for r in records if f"_{stage}" in r["op"] and r["impl"] in ("tvmnorm_default", "torch_eager")]
    assert len(add) == (16 if stage == "fwd_add" else 8), add  # x fp8 output for fwd_add
    assert all(r["status"] == "ok" for r in add), add
    assert {bench.record_key(r).stage for r in add} == {stage}
    assert {r["origin"] for r in add if r["impl"] == "tvmnorm_default"} == {"default"}
    assert not any(f"_{stage}" in op for op in bench.DEFAULT_OPS)
    assert set(bench.OPS) - set(bench.DEFAULT_OPS) == {f"{n}_{s}" for n in ("rmsnorm", "layernorm")
                                                        for s in ("bwd_add", "fwd_add", "fwd_add_fp8")}


def test_fwd_add_is_checked_on_h(monkeypatch):
    """The bench's check holds fwd_add's h against torch's add as well as y: an h of another
    sum fails it."""
    import torch
    case = bench.Case("rmsnorm_fwd_add", "bf16", 64, 5, 5, "tokens", "", "")
    gen = torch.Generator().manual_seed(0)
    s = bench.make_set(case, "cpu", gen)
    ref = bench.reference(case, s)
    h = s["x"] + s["residual"]
    good = {"y": ref["y"].to(torch.bfloat16), "h": h}
    assert bench.check(case, good, ref)[2] is None
    bad = dict(good, h=(s["x"].double() + 2 * s["residual"].double()).to(torch.bfloat16))
    assert "h: rel err" in bench.check(case, bad, ref)[2]
    # with fp8 output: y of the norm of h, scaled and cast, amax, and h itself
    case8 = bench.Case("layernorm_fwd_add_fp8", "bf16", 64, 5, 5, "tokens", "", "")
    s8 = bench.make_set(case8, "cpu", gen)
    ref8 = bench.reference(case8, s8)
    y8, amax, h8 = bench._torch_fn(case8)(s8["x"], s8["residual"], s8["gamma"], s8["beta"], s8["scale"])
    assert y8.dtype == torch.float8_e4m3fn and torch.equal(h8, s8["x"] + s8["residual"])
    good8 = {"y": y8, "amax": amax, "h": h8}
    assert bench.check(case8, good8, ref8)[2] is None
    assert "h: rel err" in bench.check(case8, dict(good8, h=s8["x"]), ref8)[2]


def _one(monkeypatch, tmp_path, impl, builder, ops="rmsnorm_fwd,layernorm_bwd"):
    monkeypatch.setitem(bench.IMPLS, impl, builder)
    rc = bench.main(FAST + ["--hidden", "200", "--ops", ops, "--dtypes", "fp32", "--impls",
                            f"{impl},torch_eager" if impl != "torch_eager" else impl,
                            "--out", str(tmp_path), "--name", "w", "--no-plots"])
    assert rc == 0
    result = json.loads((tmp_path / "w.json").read_text())
    bench.validate(result)
    return result["records"]


def test_garbage_is_reported_wrong(monkeypatch, tmp_path):
    real = bench.build_torch_eager

    def garbage(ctx, case, sets):
        p = real(ctx, case, sets)
        good = p.calls
        p.calls = [lambda c=c: {k: torch.randn_like(v) for k, v in c().items()} for c in good]
        return p

    recs = _one(monkeypatch, tmp_path, "torch_eager", garbage)
    assert len(recs) == 2
    for r in recs:
        assert r["status"] == "wrong", r
        assert r["us"] is None and r["gbps"] is None and r["frac"] is None
        assert "rel err" in r["error"]


def test_unwritten_output_is_reported_wrong(monkeypatch, tmp_path):
    """A kernel that does not write its outputs leaves the NaN poison, which the refcheck catches."""
    real = bench.build_tvmnorm_default

    def lazy(ctx, case, sets):
        p = real(ctx, case, sets)
        outs = [c() for c in p.calls]  # run once now; the checked call then writes nothing
        p.calls = [lambda o=o: o for o in outs]
        return p

    recs = _one(monkeypatch, tmp_path, "tvmnorm_default", lazy)
    mine = [r for r in recs if r["impl"] == "tvmnorm_default"]
    assert len(mine) == 2 and all(r["status"] == "wrong" and "NaN" in r["error"] for r in mine), mine
    assert all(r["status"] == "ok" for r in recs if r["impl"] == "torch_eager")


def test_cpu_calls_write_one_output_set_as_the_peers_do():
    """On the CPU every call of a tvmnorm impl writes the same outputs (torch hands a peer the
    memory its last call freed, still in cache); on CUDA each input set keeps its own."""
    case = bench.Case("layernorm_fwd", "fp32", 64, 5, 5, "tokens", "", "")
    gen = torch.Generator().manual_seed(0)
    sets = [bench.make_set(case, "cpu", gen) for _ in range(3)]
    seen = []

    class Kernel:
        origin = "stub"

        def __call__(self, *arrays, eps=None):
            seen.append([a.data_ptr() for a in arrays])

    p = bench._tvm_prepared(Kernel(), case, sets, "cpu")
    outs = [c() for c in p.calls]
    assert all(o["y"] is outs[0]["y"] and o["mu"] is outs[0]["mu"] for o in outs)
    assert len({tuple(ptrs) for ptrs in seen}) == 3  # each call still reads its own set
    p.poison(2)
    assert outs[0]["y"].isnan().all()


def test_failing_impl_does_not_abort(monkeypatch, tmp_path):
    def broken(ctx, case, sets):
        raise RuntimeError("boom")

    recs = _one(monkeypatch, tmp_path, "tvmnorm_default", broken)
    mine = [r for r in recs if r["impl"] == "tvmnorm_default"]
    assert all(r["status"] == "error" and "boom" in r["error"] for r in mine)
    assert all(r["status"] == "ok" for r in recs if r["impl"] == "torch_eager")


def test_interrupted_run_keeps_finished_cases(monkeypatch, tmp_path):
    """A run stopped by SIGINT (bench/h200.sh's PART_SECONDS) writes the cases it finished and
    says it was stopped."""
    real, calls = bench.run_case, []

    def stop_at_second(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(bench, "run_case", stop_at_second)
    recs = _one(monkeypatch, tmp_path, "torch_eager", bench.build_torch_eager)
    meta = json.loads((tmp_path / "w.json").read_text())["meta"]
    assert meta["interrupted"] == "stopped after 1 of 2 cases"
    assert [r["op"] for r in recs] == ["rmsnorm_fwd"] and recs[0]["status"] == "ok"


def test_compare(run_dir, tmp_path, capsys):
    old = json.loads((run_dir / "t.json").read_text())
    new = copy.deepcopy(old)
    for r in new["records"]:
        if r["status"] == "ok":
            r["us"] /= 2
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    assert bench.compare(tmp_path / "old.json", tmp_path / "new.json") == 0
    out = capsys.readouterr().out
    assert "2.000x" in out and "geometric mean" in out
    assert bench.compare(tmp_path / "old.json", tmp_path / "new.json", fail_below=3.0) == 1
    # the CLI wiring: `tvmnorm bench --compare OLD NEW`
    from tvmnorm.cli import main as cli_main
    assert cli_main(["bench", "--compare", str(tmp_path / "old.json"), str(tmp_path / "new.json")]) == 0


def test_merge(run_dir, tmp_path):
    rc = bench.main(["--merge", str(run_dir / "t.json"), str(run_dir / "t.json"), "--out", str(tmp_path),
                     "--name", "m", "--no-plots"])
    assert rc == 0
    merged = json.loads((tmp_path / "m.json").read_text())
    bench.validate(merged)
    assert len(merged["records"]) == 2 * len(json.loads((run_dir / "t.json").read_text())["records"])
    assert len(merged["meta"]["merged_from"]) == 2


def test_merge_counts_a_record_timed_in_rounds_at_its_fastest_round(run_dir, tmp_path):
    """A record timed in rounds under the earlier rule (us the median of the rounds' medians)
    is merged at its fastest round, with its bandwidth and fractions restated and the p20/p80
    of the other round dropped; a record already at its fastest round, or timed once, is kept
    as it is."""
    data = json.loads((run_dir / "t.json").read_text())
    ok = [r for r in data["records"] if r["status"] == "ok"]
    slow, fast, once = ok[:3]
    best = dict(slow)  # the run's median round took twice its fastest
    slow.update(us=2.0 * slow["us"], us_rounds=[3.0 * slow["us"], 2.0 * slow["us"], slow["us"]],
                **{k: slow[k] / 2 for k in ("gbps", "frac", "frac_at_size")})
    fast["us_rounds"] = [fast["us"], 1.5 * fast["us"]]
    (tmp_path / "r.json").write_text(json.dumps(data))
    merged = bench.merge([str(tmp_path / "r.json")])
    bench.validate(merged)
    got = {(r["op"], r["dtype"], r["hidden"], r["rows"], r["impl"]): r for r in merged["records"]}
    key = lambda r: (r["op"], r["dtype"], r["hidden"], r["rows"], r["impl"])  # noqa: E731
    g = got[key(slow)]
    assert g["us"] == slow["us_rounds"][2] and g["us_p20"] is None and "fastest" in g["us_from"]
    for k in ("gbps", "frac", "frac_at_size"):
        assert g[k] == pytest.approx(best[k]), k
    for r in (fast, once):
        assert {k: v for k, v in got[key(r)].items() if k != "run"} == r


def test_merge_keeps_the_measurements_of_the_committed_records(run_dir, tmp_path):
    """merge(records=): each case's rows come from the last run whose library ran the committed
    record of its key (all impls of that run), impls that run lacks from another run, and a
    tuned row of another record is left out; except at a decode-sized forward call, which every
    library serves with the default's small-call kernel, whatever its record, and (on CUDA only) at
    a backward call the decode backward serves."""
    from tvmnorm.build import record_fingerprint
    base = json.loads((run_dir / "t.json").read_text())
    case, small = ("rmsnorm_bwd", "bf16", 64, 7), ("rmsnorm_fwd", "bf16", 64, 7)
    keys = {c: bench.Case(*c, 7, "tokens", "", "").key().pack() for c in (case, small)}
    committed = {"parts": {"fwd": "the committed trace"}}
    other = {"parts": {"fwd": "a superseded trace"}}

    def run(name, record, us, extra_impl=None):
        data = copy.deepcopy(base)
        data["meta"]["library"] = {"records": {str(k): record_fingerprint(record) for k in keys.values()}}
        for c in keys:
            rows = [r for r in data["records"] if (r["op"], r["dtype"], r["hidden"], r["rows"]) == c]
            default = next(r for r in rows if r["impl"] == "tvmnorm_default")
            data["records"].remove(next(r for r in rows if r["impl"] == "tvmnorm_tuned"))
            data["records"].append(dict(default, impl="tvmnorm_tuned", us=us))
            next(r for r in rows if r["impl"] == "torch_eager")["us"] = 10 * us
            if extra_impl:
                data["records"].append(dict(default, impl=extra_impl, us=5.0))
        (tmp_path / name).write_text(json.dumps(data))
        return str(tmp_path / name)
    paths = [run("a.json", committed, 1.0, extra_impl="torch_compile"), run("b.json", committed, 2.0),
             run("c.json", other, 0.5), str(run_dir / "t.json")]  # t: no library, the tuned cell "missing"
    merged = bench.merge(paths, {f"{k:#x}": committed for k in keys.values()})
    bench.validate(merged)

    def rows_of(c):
        return {r["impl"]: r for r in merged["records"] if (r["op"], r["dtype"], r["hidden"], r["rows"]) == c}
    got = rows_of(case)
    assert got["tvmnorm_tuned"]["us"] == 2.0 and got["tvmnorm_tuned"]["run"] == 1  # b: the last to run it
    assert got["torch_eager"]["us"] == 20.0 and got["torch_compile"]["run"] == 0  # b's peers; a's compile
    got = rows_of(small)  # c's library held another record, but served this call the same kernel
    assert got["tvmnorm_tuned"]["us"] == 0.5 and got["tvmnorm_tuned"]["run"] == 2
    # a case no run measured the record of keeps its other impls and no tuned row (t's is "missing")
    lone = [r for r in merged["records"] if (r["op"], r["hidden"]) == ("layernorm_bwd", 200)]
    assert lone and all(r["impl"] != "tvmnorm_tuned" and r["run"] == 3 for r in lone)
    n = len([r for r in merged["records"]])
    assert n == len({(r["op"], r["dtype"], r["hidden"], r["rows"], r["impl"]) for r in merged["records"]})
    # without records every row of every file stays, each naming its file
    assert len(bench.merge(paths)["records"]) == 4 * len(base["records"]) + 2
    # the same runs on CUDA (t's target is llvm, where the backward's 7 rows are no decode call):
    # c's library served the backward's 7 rows with the decode backward too
    assert base["meta"]["target"] == "llvm"
    for path in paths[:3]:
        data = json.loads(pathlib.Path(path).read_text())
        data["meta"]["target"] = "cuda"
        pathlib.Path(path).write_text(json.dumps(data))
    merged = bench.merge(paths[:3], {f"{k:#x}": committed for k in keys.values()})
    for c in (case, small):
        got = rows_of(c)
        assert got["tvmnorm_tuned"]["us"] == 0.5 and got["tvmnorm_tuned"]["run"] == 2, c


def test_host_lock_keeps_timing_apart_from_setup(tmp_path):
    """Setups share the lock; timing waits for every setup (and timing) of other processes."""
    import threading
    import time

    lock = bench.HostLock(str(tmp_path / "bench.lock"))
    entered, release = threading.Event(), threading.Event()

    def setup_elsewhere():
        with bench.HostLock(lock.path).setup():
            entered.set()
            release.wait(5)

    t = threading.Thread(target=setup_elsewhere)
    t.start()
    entered.wait(5)
    t0 = time.perf_counter()
    with lock.setup():  # another setup does not wait
        assert time.perf_counter() - t0 < 0.2
    threading.Timer(0.3, release.set).start()
    t0 = time.perf_counter()
    with lock.timing():
        waited = time.perf_counter() - t0
    t.join()
    assert waited >= 0.25, f"timing started {waited:.3f}s into another process's setup"
    with bench.HostLock(None).timing():  # no path: no lock
        pass


def test_hidden_sizes_of_the_catalog_keep_their_rows():
    """``--hidden 128`` is the catalog's QK-norm shape (rows = tokens x heads), the rows tune tuned
    and `tune accept` looks for; a size outside the catalog is one row per token. (The ninth H200
    lease's accept found no measurement of layernorm fp8 128 because its bench ran 16384 rows.)"""
    from tvmnorm.shapes import TRAIN_TOKENS, train_rows
    p = argparse.ArgumentParser()
    bench.add_bench_args(p)
    cases = bench.make_cases(p.parse_args(["--hidden", "128,200", "--rows", "train,8", "--ops", "rmsnorm_fwd"]))
    rows = {(c.hidden, c.tokens): c.rows for c in cases}
    assert rows == {(128, TRAIN_TOKENS): train_rows(128), (128, 8): 8 * train_rows(128) // TRAIN_TOKENS,
                    (200, TRAIN_TOKENS): TRAIN_TOKENS, (200, 8): 8}
    assert train_rows(128) > TRAIN_TOKENS


def test_rounds_time_every_impl_in_turn(monkeypatch, tmp_path):
    """--rounds 3: every impl of a case is set up, then timed three times in turn (impl after
    impl, round after round); its us is the fastest round's median, us_rounds lists
    them, and an impl that fails in a later round is recorded as an error, not timed further."""
    order = []
    real_timer = bench.Timer.__call__

    def timer(self, calls):
        order.append(id(calls))
        return real_timer(self, calls)
    monkeypatch.setattr(bench.Timer, "__call__", timer)
    rc = bench.main(FAST + ["--hidden", "200", "--ops", "rmsnorm_fwd", "--dtypes", "fp32", "--impls",
                            "tvmnorm_default,torch_eager", "--rounds", "3", "--out", str(tmp_path), "--name", "r",
                            "--no-plots"])
    assert rc == 0
    result = json.loads((tmp_path / "r.json").read_text())
    bench.validate(result)
    recs = result["records"]
    assert [r["impl"] for r in recs] == ["tvmnorm_default", "torch_eager"]
    for r in recs:
        assert r["status"] == "ok" and len(r["us_rounds"]) == 3
        assert r["us"] == pytest.approx(min(r["us_rounds"]), rel=1e-3)
    # the copies (the run's ceiling, the case's size) first, then the two impls in turn, three times
    impls = order[2:]
    assert len(impls) == 6 and impls[0::2] == [impls[0]] * 3 and impls[1::2] == [impls[1]] * 3
    assert impls[0] != impls[1]
    assert "--rounds 3" in result["meta"]["repro"]
    with pytest.raises(SystemExit, match="--rounds must be 1 or more"):
        bench.main(FAST + ["--rounds", "0", "--out", str(tmp_path), "--name", "z"])


def test_probes_time_in_rounds_and_keep_nans():
    """The probes' helpers: time_in_rounds times the calls in turn, round after round, and keeps
    each one's fastest; relative_max_error lets a NaN through (a read past an operand shows)."""
    from tvmnorm.bench import relative_max_error, time_in_rounds
    order, times = [], iter([5.0, 9.0, 4.0, 8.0, 6.0, 7.0])

    def timer(calls):
        order.append(calls[0]())
        return [next(times)]
    assert time_in_rounds({"a": lambda: "a", "b": lambda: "b"}, timer, 3) == {"a": 4.0, "b": 7.0}
    assert order == ["a", "b"] * 3
    want = torch.tensor([1.0, -3.0, 0.0], dtype=torch.float64)
    assert relative_max_error(torch.tensor([1.5, -3.0, 0.25]), want) == pytest.approx(0.25)
    assert math.isnan(relative_max_error(torch.tensor([1.0, float("nan"), 0.0]), want))


def test_probe_parser_takes_the_probes_shared_arguments(tmp_path):
    """bench/gpu_probe.py and bench/bwd_parts.py share --out (made if missing: the probes write
    their JSON there at the end of a device call), --hidden (the catalog's widths by default) and
    --norms."""
    from tvmnorm.bench import probe_parser
    from tvmnorm.shapes import hidden_sizes
    out = tmp_path / "a" / "b"
    args = probe_parser().parse_args(["--out", str(out), "--norms", "rmsnorm"])
    assert out.is_dir() and args.norms == "rmsnorm"
    assert args.hidden.split(",") == [str(h) for h in hidden_sizes()]


def test_readme_targets_count_the_issue_targets(bench_script):
    """bench/readme_tables.py's status counts: per op the served kernel (tuned, else the
    default) against the fastest peer at the training rows (>= 1.0x, and >= 1.3x where that peer
    is below 0.75 of copy), and at decode rows the cells where it is no slower."""
    from tvmnorm.shapes import train_rows
    tables = bench_script("readme_tables")

    def rec(op, hidden, rows, impl, us, frac):
        return dict(op=op, dtype="bf16", hidden=hidden, rows=rows, impl=impl, us=us, frac=frac, status="ok")
    t = train_rows(1024)
    records = [rec("rmsnorm_bwd", 1024, t, "tvmnorm_tuned", 10.0, 0.6), rec("rmsnorm_bwd", 1024, t, "liger", 14.0, 0.4),
               rec("rmsnorm_bwd", 1024, t, "torch_eager", 20.0, 0.3),
               # served by the default (no tuned cell), 1.2x the peer: ahead, not 1.3x
               rec("rmsnorm_bwd", 2048, t, "tvmnorm_default", 10.0, 0.6), rec("rmsnorm_bwd", 2048, t, "liger", 12.0, 0.5),
               # behind a peer that is above 0.75 (so not counted for 1.3x)
               rec("rmsnorm_bwd", 4096, t, "tvmnorm_tuned", 10.0, 0.7), rec("rmsnorm_bwd", 4096, t, "torch_compile", 9.0, 0.8),
               rec("rmsnorm_bwd", 1024, 64, "tvmnorm_tuned", 5.0, 0.01), rec("rmsnorm_bwd", 1024, 64, "torch_eager", 6.0, 0.01),
               rec("rmsnorm_bwd", 1024, 8, "tvmnorm_tuned", 7.0, 0.01), rec("rmsnorm_bwd", 1024, 8, "torch_eager", 6.0, 0.01),
               dict(rec("rmsnorm_bwd", 1024, 1, "tvmnorm_tuned", 1.0, 0.0), status="wrong")]
    lines = tables.targets(records).splitlines()
    assert lines[0] == ("rmsnorm_bwd: frac 0.60-0.70; >= 1.0x 2 of 3 (behind: 4096 (0.90x torch_compile)); "
                        ">= 1.3x where the peer < 0.75: 1 of 2")
    # a 1.3x miss is named when 1.3x the peer's frac is more than a copy of the case's own bytes
    # reaches (no kernel that moves those bytes can meet it): 2048's needs 0.65
    records[3].update(copy_gbps=4000.0, copy_at_size_gbps=2600.0)  # 0.65: reachable, not named
    assert tables.targets(records).splitlines()[0] == lines[0]
    records[3].update(copy_at_size_gbps=2400.0)  # 0.60
    assert tables.targets(records).splitlines()[0] == lines[0] + (
        " (missed beyond a copy of their own bytes: 2048 (needs 0.65, copy at size 0.60))")
    assert lines[1] == "rmsnorm_bwd decode: <= best peer 1 of 2 (behind: 1024 x 8 (7.0 vs torch_eager 6.0 us))"
    assert len(lines) == 2
    # a decode case of a key with a timed record but no tuned row of its own ran before the
    # record changed: named as not measured, not counted with the default's time; a key with no
    # tuned training row (2048: served by the default) counts its default
    records += [rec("rmsnorm_bwd", 1024, 256, "tvmnorm_default", 8.0, 0.02), rec("rmsnorm_bwd", 1024, 256, "torch_eager", 9.0, 0.02),
                rec("rmsnorm_bwd", 2048, 64, "tvmnorm_default", 4.0, 0.02), rec("rmsnorm_bwd", 2048, 64, "torch_eager", 5.0, 0.02)]
    assert tables.targets(records).splitlines()[1] == (
        "rmsnorm_bwd decode: <= best peer 2 of 3 (behind: 1024 x 8 (7.0 vs torch_eager 6.0 us)); "
        "not measured with the committed record: 1024 x 256")


def test_host_overhead_times_the_ops_and_their_peers(bench_script, tmp_path, monkeypatch):
    """bench/host_overhead.py on the CPU: each impl that runs here gets host and wall us a call
    (wall >= host: it also waits for the device), the train mode runs forward and backward (the
    kernels alone too: tvmnorm_kernel), and
    what cannot run here (Liger, CUDA graphs) is recorded as skipped or left out, not timed."""
    import json
    monkeypatch.setenv("TVMNORM_CACHE", str(tmp_path / "cache"))
    ho = bench_script("host_overhead")
    path = ho.main(["--out", str(tmp_path), "--device", "cpu", "--dtype", "fp32", "--hidden", "64",
                    "--tokens", "1,8", "--norms", "rmsnorm,layernorm", "--calls", "3", "--rounds", "2",
                    "--impls", "tvmnorm,tvmnorm_kernel,torch_eager,liger,tvmnorm_graph"])
    result = json.loads(path.read_text())
    from tvmnorm.build import source_hash
    assert result["meta"]["tvmnorm_source_hash"] == source_hash() and result["meta"]["tvm"]
    records = result["records"]
    timed = {(r["op"], r["rows"], r["impl"]) for r in records if "host_us" in r}
    for op in ("rmsnorm_fwd", "layernorm_fwd", "rmsnorm_train", "layernorm_train"):
        for rows in (1, 8):
            assert {(op, rows, "tvmnorm"), (op, rows, "tvmnorm_kernel"), (op, rows, "torch_eager")} <= timed
    assert all(0 < r["host_us"] <= r["wall_us"] for r in records if "host_us" in r)
    assert not any(r["impl"] in ("liger", "tvmnorm_graph") for r in records if "host_us" in r)
    assert all(r["skipped"] == "Liger is GPU-only" for r in records if r["impl"] == "liger")


@pytest.mark.slow
def test_lease_env_prepares_and_packs_a_device_call(tmp_path):
    """bench/lease_env.sh, which a device call's script sources first: it runs the tree's
    .device/b/activate.sh, makes $X under $OUT, stamps `el` lines, writes the device line and
    the kernel sources' hash there, and packs $X into $OUT/x.tgz when the script exits (here with
    a stand-in activate.sh that puts this checkout on the path)."""
    import subprocess
    import sys
    import tarfile
    from tvmnorm.build import source_hash
    repo = pathlib.Path(__file__).resolve().parents[1]
    tree, out = tmp_path / "tree", tmp_path / "out"
    (tree / ".device" / "b").mkdir(parents=True)
    (tree / ".device" / "b" / "activate.sh").write_text(
        f'export PYTHONPATH={repo}\nexport PATH={pathlib.Path(sys.executable).parent}:$PATH\n')
    script = f'source {repo}/bench/lease_env.sh || exit 1\necho 42 > "$X/answer.txt"\nel "done"\n'
    r = subprocess.run(["bash", "-c", script], cwd=tree, env={**os.environ, "OUT": str(out)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"\[\d+ s\] done\n", r.stdout)
    with tarfile.open(out / "x.tgz") as t:
        files = {m.name: t.extractfile(m).read().decode() for m in t.getmembers() if m.isfile()}
    assert files["x/answer.txt"] == "42\n" and files["x/source-hash.txt"].strip() == source_hash()
    assert "torch" in files["x/device.txt"] and "cpus" in files["x/device.txt"]


def test_profile_case_splits_a_do_bench_timeline_at_its_flushes(bench_script):
    """bench/profile_case.py --gaps: each call's kernels are those after a flush, up to the next;
    the GPU's idle time before the call's first kernel, its kernels' own time and the span from
    the flush's end are medians over the calls; a timeline without a call's kernel is refused."""
    flush_gaps = bench_script("profile_case").flush_gaps
    fill = "fill<int8>"
    timeline = [(fill, 0.0, 80.0), ("amax_zero", 83.0, 1.0), ("fwd", 85.0, 2.0),   # idle 3, kernels 3, span 7
                (fill, 100.0, 80.0), ("fwd", 184.0, 2.5),                         # 4, 2.5, 6.5
                (fill, 200.0, 80.0), ("amax_zero", 282.0, 1.0), ("fwd", 290.0, 2.0)]  # 2, 3, 12
    got = flush_gaps(list(reversed(timeline)), fill)  # the trace's order is not the GPU's
    assert got == {"calls": 3, "gap": 3.0, "kernels": 3.0, "span": 7.0}
    with pytest.raises(ValueError, match="no call's kernel after a flush"):
        flush_gaps([("fwd", 0.0, 2.0), (fill, 5.0, 80.0)], fill)


def test_gpu_test_summary_adds_up_shards_finished_and_stopped(bench_script, tmp_path):
    """bench/gpu_tests.sh's summary: finished shards by their final line (errors of several shards
    add up), a shard stopped by its time limit by its progress characters, with the ids it never
    reached written out; any failure, error or unfinished shard fails the run."""
    summary = bench_script("gpu_test_summary")
    (tmp_path / "shard-0.txt").write_text("..F.E\nFAILED tests/a.py::t1 - boom\nERROR tests/a.py::t2\n"
                                          "== 1 failed, 3 passed, 1 error in 9.1s ==\n")
    (tmp_path / "shard-1.txt").write_text("..s\n== 2 passed, 1 skipped, 2 errors in 4.0s ==\n")
    (tmp_path / "shard-2.txt").write_text("....s.                                    [ 40%]\n..\n")
    (tmp_path / "ids-2.txt").write_text("\n".join(f"tests/b.py::t[{i}]" for i in range(11)) + "\n")
    text, status = summary.summarize(tmp_path, 24)
    assert status == 1
    assert text.splitlines()[0] == "24 tests: 3 error, 1 failed, 12 passed, 2 skipped"
    assert "shard-2.txt: no summary line (stopped by TEST_SECONDS or crashed) after 8 of 11 tests: " \
           "7 passed, 0 failed, 0 error, 1 skipped" in text
    assert (tmp_path / "not-reached.txt").read_text().split() == [f"tests/b.py::t[{i}]" for i in (8, 9, 10)]
    assert "FAILED tests/a.py::t1 - boom" in text and "ERROR tests/a.py::t2" in text

    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "shard-0.txt").write_text("...s\n== 3 passed, 1 skipped in 2.0s ==\n")
    assert summary.summarize(clean, 4) == ("4 tests: 3 passed, 1 skipped", 0)
    assert summary.summarize(clean, 5)[1] == 1  # a test that no shard ran
    assert not (clean / "not-reached.txt").exists()


def test_gpu_shards_deal_a_library_once_a_shard_and_balance_the_rest(bench_script, tmp_path):
    """bench/gpu_shards.py: each id dealt once, a shard's ids in collection order; a library
    fixture's tests in one shard while they fit the fair share, in as few pieces as it allows
    when not (each piece paying the build); the other ids in runs of neighbours, longest first
    to the least loaded shard, so no shard is expected to run longer than the fair share plus
    the longest unit."""
    shards = bench_script("gpu_shards")
    ids = [f"tests/a.py::t_lib[{i}]" for i in range(6)] + [f"tests/a.py::t_big[{i}]" for i in range(30)] \
        + [f"tests/a.py::t_plain[{i}]" for i in range(40)]
    groups = {i: "lib" for i in ids[:6]} | {i: "big" for i in ids[6:36]}
    times = {ids[0]: (100.0, 2.0), ids[6]: (50.0, 10.0)} | {i: (0.1, 10.0) for i in ids[7:36]} \
        | {i: (0.5, 3.0 + n % 5) for n, i in enumerate(ids[36:])}
    dealt, loads = shards.deal(ids, groups, 4, times)
    assert sorted(sum(dealt, [])) == sorted(ids)
    order = {i: n for n, i in enumerate(ids)}
    assert all(d == sorted(d, key=order.__getitem__) for d in dealt)
    assert sum(any(i in d for i in ids[:6]) for d in dealt) == 1  # "lib" fits: one build
    cost = shards.expected_seconds(ids, times)
    assert cost[ids[0]] == 2.0 and cost[ids[6]] == 10.0  # the builds are the group's, not a test's
    assert cost[ids[1]] == 2.0  # unlogged: its function's median
    fair = (sum(cost.values()) + 100.0 + 50.0) / 4
    big = sum(any(i in d for i in ids[6:36]) for d in dealt)
    assert big == math.ceil((50.0 + 300.0) / fair) > 1
    units = shards.units_of(ids, groups, cost, times, 4)
    assert max(loads) <= fair + max(u[0] for u in units) and abs(sum(loads) - sum(u[0] for u in units)) < 1e-6
    plain_runs = [u[1] for u in units if u[1][0] in ids[36:]]
    assert all(len(r) <= shards.RUN for r in plain_runs) and sum(map(len, plain_runs)) == 40
    # nothing logged: DEFAULT_TEST_S a test, DEFAULT_LIBRARY_S a build, one a library's piece
    _, loads = shards.deal(ids, groups, 4, {})
    pieces = [u for u in shards.units_of(ids, groups, shards.expected_seconds(ids, {}), {}, 4) if u[1][0] in groups]
    assert len(pieces) >= 2
    assert sum(loads) == pytest.approx(len(ids) * shards.DEFAULT_TEST_S + len(pieces) * shards.DEFAULT_LIBRARY_S)
    # logs of 0 s (ties everywhere) still spread the ids over every shard
    assert all(shards.deal(ids, groups, 4, {i: (0.0, 0.0) for i in ids})[0])


def test_gpu_shards_merge_keeps_each_ids_latest_phases(bench_script, tmp_path):
    """`gpu_shards.py merge`: a later log's phase replaces an earlier one's, an id the logs do not
    name keeps its line, and what it writes reads back."""
    shards = bench_script("gpu_shards")
    table = tmp_path / "times.tsv"
    table.write_text("# header\ntests/a.py::old\t1.00\t2.00\ntests/a.py::t[1]\t9.00\t9.00\n")
    first, second = tmp_path / "times-0.txt", tmp_path / "times-1.txt"
    first.write_text("0.01 setup passed tests/a.py::t[1]\n3.50 call passed tests/a.py::t[1]\n"
                     "0.00 teardown passed tests/a.py::t[1]\n")
    second.write_text("60.00 setup passed tests/a.py::t[2]\n4.25 call failed tests/a.py::t[2]\n"
                      "5.00 call passed tests/a.py::t[1]\nnot a log line\n")
    assert shards.merge([first, second], table) == 2
    assert shards.read_times(table) == {"tests/a.py::old": (1.0, 2.0), "tests/a.py::t[1]": (0.01, 5.0),
                                        "tests/a.py::t[2]": (60.0, 4.25)}


def test_gpu_tests_collection_names_each_ids_library_fixtures(tmp_path):
    """tests/conftest.py's TVMNORM_LIBRARY_GROUPS: each collected id with the library fixtures it
    uses (a parametrised one with its parameter), what gpu_shards.py keeps together."""
    import subprocess
    import sys
    out = tmp_path / "groups.txt"
    root = pathlib.Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                    "tests/test_gpu_core.py", "-k", "x_layouts or programmatic or cuda_matrix"],
                   cwd=root, env={**os.environ, "TVMNORM_LIBRARY_GROUPS": str(out)}, check=True, capture_output=True)
    groups = dict(line.split("\t") for line in out.read_text().splitlines())
    by_group = {}
    for nodeid, group in groups.items():
        by_group.setdefault(group, set()).add(nodeid.split("[")[0].split("::")[1])
    assert by_group == {"": {"test_cuda_matrix"},
                        "tuned_layout_library": {"test_cuda_tuned_records_for_x_layouts"},
                        "tuned_all_layouts_library": {"test_cuda_library_of_x_layouts"},
                        "pdl_library[library]": {"test_cuda_library_chains_under_programmatic_dependent_launch"},
                        "pdl_library[jit]": {"test_cuda_library_chains_under_programmatic_dependent_launch"}}


def test_ab_table_lists_each_librarys_runs_in_order_and_the_ratio_of_the_fastest(tmp_path, bench_script, capsys):
    """bench/ab_table.py: the interleaved A/B of the lease scripts (old new new old ...), runs
    named LIB-I: times in run order (I sorted as a number, so run 10 comes after run 9), the
    fastest of each library over the base's fastest, a library that timed nothing as untimed, and
    a folder without runs says so."""
    table = bench_script("ab_table")
    times = {"old-0": 110.0, "new-1": 100.0, "new-2": 99.0, "old-9": 108.0, "new-10": 98.0}
    for name, us in times.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({"records": [
            {"op": "rmsnorm_bwd", "hidden": 5120, "us": us, "frac": 0.5},
            {"op": "layernorm_bwd", "hidden": 2560, "us": 2 * us, "frac": 0.4}]}))
    rows = table.ab_rows(tmp_path)
    assert [(op, h) for op, h, _ in rows] == [("layernorm_bwd", 2560), ("rmsnorm_bwd", 5120)]
    assert [us for us, _ in rows[1][2]["new"]] == [100.0, 99.0, 98.0]
    assert [us for us, _ in rows[1][2]["old"]] == [110.0, 108.0]
    table.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "rmsnorm_bwd 5120  new 100.0/99.0/98.0  old 110.0/108.0  new/old 0.907" in out
    # a library whose runs timed nothing (lease 85: its build was cut off) is listed as untimed,
    # not a crash, and has no ratio
    for name in ("new-1", "new-2", "new-10"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"records": [
            {"op": "rmsnorm_bwd", "hidden": 5120, "us": None, "frac": None}]}))
    table.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "rmsnorm_bwd 5120  new untimed  old 110.0/108.0  frac old 0.500\n" in out
    with pytest.raises(SystemExit, match="no runs"):
        table.ab_rows(tmp_path / "empty")
