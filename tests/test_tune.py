"""Tuning: the design space, `tvmnorm tune` end to end on llvm (records, resume, library), and a
structural check that every committed record in schedules/ still applies to its kernel."""
from __future__ import annotations

import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from conftest import (call, check_outputs, committed_llvm_records, generated_cuda, has_nvcc, make_inputs,
                      space_variant)
from tvmnorm import NormKey, reference
from tvmnorm.build import build_library, compile_funcs, key_funcs, narrow_prefix, scheduled_funcs
from tvmnorm.compute import kernel_funcs
from tvmnorm.runtime import Registry
from tvmnorm.sched.space import TUNED_PARTS, cuda_thread_choices, cuda_vec_choices, design_spaces, space_fn
from tvmnorm.tune import load_records, read_records, tuning_func

REPO = pathlib.Path(__file__).resolve().parent.parent
KEYS = [NormKey(hidden_size=4096), NormKey(norm="layernorm", stage="bwd", hidden_size=1000),
        NormKey(otype="fp8e4m3", hidden_size=128), NormKey(stage="bwd_add", hidden_size=4095, itype="fp16",
                                                           wtype="fp16", otype="fp16"),
        NormKey(norm="layernorm", stage="fwd_add", hidden_size=2048)]


def test_vector_widths_divide_the_row_and_fit_16_bytes():
    assert cuda_vec_choices(NormKey(hidden_size=4096)) == [1, 2, 4, 8]           # bf16: 8 x 2 B = 16 B
    assert cuda_vec_choices(NormKey(hidden_size=4096, itype="fp32", wtype="fp32", otype="fp32")) == [1, 2, 4]
    assert cuda_vec_choices(NormKey(hidden_size=4095)) == [1]                     # odd: predicated tail
    assert cuda_vec_choices(NormKey(hidden_size=1000)) == [1, 2, 4, 8]
    assert min(cuda_thread_choices(NormKey(hidden_size=65536))) >= 65536 // (16 * 32)
    assert max(cuda_thread_choices(NormKey(hidden_size=8))) <= 8


def test_design_space_built_in_threads_is_the_one_built_in_turn(monkeypatch):
    """space_fn builds a key's structural variants in threads (SPACE_THREADS); each variant's
    schedule is copied in order first, so the variants, sampled decisions included, are those
    of building them one after another from the same seed."""
    from tvmnorm._tvm import Schedule
    from tvmnorm.sched import space
    key = NormKey(norm="layernorm", stage="bwd", hidden_size=1024)
    func = tuning_func(key, "dx", 2048, "cuda", 32)
    built = {}
    for threads in (1, 4):
        monkeypatch.setattr(space, "SPACE_THREADS", threads)
        monkeypatch.setattr("os.cpu_count", lambda: 4)
        built[threads] = [str(s.trace) for s in space_fn(key, "cuda")(Schedule(func, seed=3))]
    assert len(built[1]) == len(design_spaces(key, "cuda")) > 10
    assert built[1] == built[4]
    assert len(set(built[1])) == len(built[1])  # the variants differ from one another


@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS, ids=lambda k: k.name)
@pytest.mark.parametrize("kind", ["cuda", "llvm"])
def test_design_space_replays_on_symbolic_rows(key, kind):
    """Every structural variant of the space, with the decisions it sampled, replays from its
    (simplified, as MetaSchedule stores it) trace onto the symbolic-row kernels a library holds
    (on CUDA both index widths, build.key_funcs), and compiles (on CUDA each width at every
    other variant). Each samples a decision, even a
    variant with one choice (warp_sums: one row a block): a trace that samples nothing is taken
    for the default rule's (the thirteenth lease's forward retune marked its warp_sums records default_won)."""
    from tvmnorm._tvm import Schedule
    from tvmnorm.tune import is_default_trace
    for part in [p for p in kernel_funcs(key, kind) if p in TUNED_PARTS]:
        spaces = space_fn(key, kind)(Schedule(tuning_func(key, part, 2048, kind)))
        assert len(spaces) == len(design_spaces(key, kind)) >= 1
        for index, sch in enumerate(spaces):
            assert not is_default_trace(sch.trace)
            trace = sch.trace.simplified(remove_postproc=True)
            record = {"parts": {part: json.loads(json.dumps(trace.as_json(), default=lambda o: o.value))}}
            # the replayed kernel alone, at each index width a library holds it (build.key_funcs)
            widths = [scheduled_funcs(key, kind, record, parts=(part,))]
            if kind == "cuda":
                widths.append(scheduled_funcs(key, kind, record, row_bits=32, parts=(part,),
                                              prefix=narrow_prefix(key)))
            # every variant replays at both widths; each width compiles at every other variant
            # (0.7 s a kernel: ~100 of them at layernorm bwd 1000 took most of two minutes)
            funcs = widths[index % len(widths)] if len(spaces) > 1 else {k: f for w in widths for k, f in w.items()}
            if kind == "llvm":
                compile_funcs(funcs, kind)
            else:
                try:
                    compile_funcs(funcs, kind)
                except Exception as e:  # noqa: BLE001
                    # a sampled point may be invalid on the GPU (VerifyGPUCode rejects it while
                    # tuning): only these two reasons are acceptable
                    assert "syncs inside condition" in str(e) or "threads" in str(e), str(e)[-500:]


def tvmnorm(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tvmnorm", *args], capture_output=True, text=True, env=env,
                          timeout=900)


@pytest.mark.slow
def test_tune_llvm_end_to_end_and_resume(tmp_path, rng, seed):
    common = ["--target", "llvm", "--norms", "rmsnorm", "--stages", "fwd,bwd", "--dtypes", "fp32",
              "--hidden", "384", "--trials", "4", "--rows", "256", "--logs", str(tmp_path / "logs"),
              "--schedules", str(tmp_path / "sch")]
    r = tvmnorm("tune", *common, "--out", str(tmp_path / "lib"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "tuning 2 of 2 keys" in r.stderr
    # on a line of its own: the progress bar's line (no newline on a terminal) is ended first
    assert re.search(r"^seeded the default schedule of 2 of 2 tasks", r.stderr, re.M), r.stderr[-3000:]
    assert re.search(r"tuned 2 keys in \d+ s: [\d.]+ s per key", r.stderr), r.stderr[-1000:]
    sched = json.loads(next((tmp_path / "sch").glob("llvm-*.json")).read_text())
    recs = {int(k, 16): v for k, v in sched["records"].items()}
    fwd, bwd = NormKey(itype="fp32", wtype="fp32", otype="fp32", hidden_size=384), NormKey(
        stage="bwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=384)
    assert set(recs) == {fwd.pack(), bwd.pack()}
    assert set(recs[fwd.pack()]["parts"]) == {"fwd"} and set(recs[bwd.pack()]["parts"]) == {"dx"}
    assert all(us > 0 for rec in recs.values() for us in rec["run_us"].values())
    assert (tmp_path / "logs" / next((tmp_path / "sch").glob("llvm-*.json")).stem /
            "database_tuning_record.json").stat().st_size > 0
    # each task's default schedule was measured once, as a candidate (seed_candidates), and no
    # record is slower than it
    from tvmnorm._tvm import IRModule, ms
    from tvmnorm.tune import is_default_trace
    db = ms.database.JSONDatabase(work_dir=str(tmp_path / "logs" / next((tmp_path / "sch").glob("llvm-*.json")).stem))
    assert sum(is_default_trace(r.trace) for r in db.get_all_tuning_records()) == 2
    for key, part in ((fwd, "fwd"), (bwd, "dx")):
        top = db.get_top_k(db.commit_workload(IRModule({"main": tuning_func(key, part, 256, "llvm")})), 100)
        default_us = next(1e6 * statistics.fmean(float(x) for x in r.run_secs) for r in top if is_default_trace(r.trace))
        assert recs[key.pack()]["run_us"][part] <= default_us
        assert ("default_won" in recs[key.pack()]) == (recs[key.pack()]["run_us"][part] == default_us)
    # the library serves the tuned kernels, and they are right; its manifest names each record
    from tvmnorm.build import record_fingerprint
    manifest = json.loads((tmp_path / "lib" / "manifest.json").read_text())
    assert {k["key"]: k["record"] for k in manifest["kernels"]} == {
        k: record_fingerprint(r) for k, r in recs.items()}
    # and a benchmark of the library says which record each key ran (tune accept --previous)
    from tvmnorm.bench import Context
    ran = Context("llvm", str(tmp_path / "lib")).library_info()["records"]
    assert ran == {str(k): record_fingerprint(r) for k, r in recs.items()}
    reg = Registry()
    reg.set_library("llvm", tmp_path / "lib")
    for key in (fwd, bwd):
        k = reg.get(key, "llvm")
        assert k.tuned and k.origin == "library:tuned"
        for rows in (1, 300):
            inputs = make_inputs(key, rows, rng)
            check_outputs(key, inputs, call(k, inputs, rows), f"tuned {key.name} rows={rows} seed={seed}")
    # a rerun finds both keys done and keeps their records
    r = tvmnorm("tune", *common, "--no-build")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "tuning 0 of 2 keys" in r.stderr
    sched_file = next((tmp_path / "sch").glob("llvm-*.json"))
    assert json.loads(sched_file.read_text())["records"] == sched["records"]
    # a run interrupted after measuring but before writing schedules/: the next run recovers the
    # keys from the database instead of tuning them again; one killed while appending a record
    # left it cut short, which is set aside (every open of the database failed on it before)
    sched_file.unlink()
    work = tmp_path / "logs" / sched_file.stem
    with open(work / "database_tuning_record.json", "ab") as f:
        f.write(b'[0,[[["GetSBlock",[],["root"')
    r = tvmnorm("tune", *common, "--no-build")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "recovered 2 keys" in r.stderr and "tuning 0 of 2 keys" in r.stderr, r.stderr[-2000:]
    assert "database_tuning_record.json: its last line was cut short" in r.stderr, r.stderr[-2000:]
    assert (work / "database_tuning_record.json.cut").read_bytes() == b'[0,[[["GetSBlock",[],["root"\n'
    assert json.loads(sched_file.read_text())["records"] == sched["records"]
    # a run stopped short of --trials (a lease's time limit): --min-trials takes the best of what
    # was measured, --recover-only builds the library without tuning, and the records say how
    # many candidates they saw, so a later run with --trials 8 still tunes them further
    sched_file.unlink()
    more = [("8" if a == "4" else a) for a in common]
    r = tvmnorm("tune", *more, "--min-trials", "4", "--recover-only", "--out", str(tmp_path / "lib2"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "recovered 2 keys" in r.stderr and "tuning 0 of 2 keys" in r.stderr, r.stderr[-2000:]
    recovered = json.loads(sched_file.read_text())["records"]
    assert {k: v["trials"] for k, v in recovered.items()} == {k: 4 for k in sched["records"]}
    assert (tmp_path / "lib2" / "manifest.json").exists()
    r = tvmnorm("tune", *more, "--recover-only", "--no-build")
    assert "tuning 0 of 2 keys" in r.stderr and "recovered" not in r.stderr, r.stderr[-2000:]


def committed_records():
    out = []
    for path in sorted((REPO / "schedules").glob("*.json")):
        kind = path.stem.split("-")[0]
        for packed, rec in json.loads(path.read_text())["records"].items():
            out.append(pytest.param(kind, int(packed, 16), rec, id=f"{path.stem}:{rec['key']}"))
    return out or [pytest.param(None, None, None, marks=pytest.mark.skip(reason="no committed records"))]


@pytest.mark.parametrize("kind,packed,record", committed_records())
def test_committed_record_applies_to_its_kernel(kind, packed, record):
    """Structural check: each committed trace replays on today's symbolic-row PrimFunc of its key
    and the result compiles for the record's target (the GPU numerics ran before commit)."""
    key = NormKey.unpack(packed)
    assert record["key"] == key.name
    funcs = scheduled_funcs(key, kind, record)
    assert set(record["parts"]) <= set(TUNED_PARTS)
    compile_funcs(funcs, kind, arch=None if kind == "cuda" else "x86-64")


@pytest.mark.parametrize("kind,key,chunk", [
    ("llvm", NormKey(norm="layernorm", hidden_size=1024), None),
    ("llvm", NormKey(stage="bwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=1000), None),
    ("cuda", NormKey(norm="layernorm", stage="bwd", hidden_size=4096), 16),
    ("cuda", NormKey(hidden_size=896), None),
])
def test_a_record_of_the_default_trace_builds_the_default_kernel(kind, key, chunk, rng, seed):
    """seed_candidates puts each task's default schedule among the candidates: where it measures
    fastest, the record holds its trace (taken at the static tuning row count), and the library
    must then build the very kernel the default rule gives the symbolic-row function."""
    from tvmnorm.sched.default import default_schedule
    from tvmnorm.tune import is_default_trace, tune_rows
    part = "dx" if key.stage == "bwd" else "fwd"
    func = tuning_func(key, part, tune_rows(key, kind), kind, chunk)
    sch = default_schedule(func, part, kind, 4 if key.itype == "fp32" else 2)
    assert is_default_trace(sch.trace)
    record = {"key": key.name, "parts": {part: json.loads(json.dumps(sch.trace.as_json(remove_postproc=True),
                                                                    default=lambda o: o.value))}}
    if chunk:
        record["rows_per_partial"] = chunk
    arch = None if kind == "cuda" else "x86-64"
    tuned = compile_funcs(scheduled_funcs(key, kind, record), kind, arch=arch)
    if kind == "cuda":
        from tvmnorm.compute.norms import kernel_funcs
        default = {f.attrs["global_symbol"]: default_schedule(f, p, kind, 2).mod["main"].with_attr(
            "global_symbol", f.attrs["global_symbol"]).with_attr("tirx.is_scheduled", True)
            for p, f in kernel_funcs(key, kind, chunk_rows=chunk).items()}
        source = lambda ex: ex.mod.imports[0].inspect_source()  # noqa: E731
        assert source(tuned) == source(compile_funcs(default, kind))
        return
    reg = Registry()
    with tempfile.TemporaryDirectory() as d:
        manifest = build_library([key], kind, pathlib.Path(d), records={key.pack(): {**record, "default_won": [part]}})
        assert manifest["kernels"][0]["origin"] == "tuned" and manifest["kernels"][0]["default_won"]
        reg.set_library(kind, pathlib.Path(d))
        k = reg.get(key, kind)
        assert k.tuned
        for rows in (1, 300):
            inputs = make_inputs(key, rows, rng)
            check_outputs(key, inputs, call(k, inputs, rows), f"default trace {key.name} rows={rows} seed={seed}")


def test_a_retune_measures_the_committed_record_beside_the_default(tmp_path):
    """seed_candidates measures, in a fresh database, each task's default schedule and the
    committed record it would replace (when its trace still applies, and for the fused bwd only
    at the record's T), so a retune never ships a point that measured slower than either."""
    from tvmnorm._tvm import IRModule, Schedule, ms
    from tvmnorm.measure import InProcessBuilder, InProcessRunner
    from tvmnorm.tune import _tasks, is_default_trace, seed_candidates
    fwd = NormKey(itype="fp32", wtype="fp32", otype="fp32", hidden_size=384)
    bwd = NormKey(stage="bwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=384)
    funcs, owner = _tasks([fwd, bwd], "llvm", 256)
    sampled = space_fn(fwd, "llvm")(Schedule(funcs[f"{fwd.name}_fwd"]))[0]
    trace = json.loads(json.dumps(sampled.trace.as_json(remove_postproc=True), default=lambda o: o.value))
    committed = {fwd.pack(): {"key": fwd.name, "parts": {"fwd": trace}},
                 # a trace of another kernel does not apply to the bwd task: skipped, not fatal
                 bwd.pack(): {"key": bwd.name, "parts": {"dx": trace}}}
    db = ms.database.JSONDatabase(work_dir=str(tmp_path))
    runner = InProcessRunner("llvm")
    assert seed_candidates(db, funcs, owner, "llvm", InProcessBuilder("llvm", workers=1), runner,
                           committed) == (2, 1, 0)
    assert runner.measured == 3
    top = db.get_top_k(db.commit_workload(IRModule({"main": funcs[f"{fwd.name}_fwd"]})), 10)
    assert sorted(is_default_trace(r.trace) for r in top) == [False, True]
    replayed = next(r.trace for r in top if not is_default_trace(r.trace))
    assert [int(d) for d in replayed.decisions.values()] == [int(d) for d in sampled.trace.decisions.values()]
    # a resumed session (the tasks have candidates) measures nothing again
    assert seed_candidates(db, funcs, owner, "llvm", InProcessBuilder("llvm", workers=1), runner,
                           committed) == (0, 0, 0)


def test_a_cuda_forward_tune_measures_torch_compiles_launch_shapes(tmp_path):
    """seed_candidates also measures a CUDA forward task at torch.compile's launch shape, each
    stream mode (space.torch_compile_fwd_shapes): the search had not taken that point at hidden
    512, where it ran 4-10% faster than the records in a probe. Their traces replay on the
    symbolic-row kernel as a record (here with a builder and runner that compile and time
    nothing: no GPU); the backward gets none."""
    from tvmnorm._tvm import IRModule, ms
    from tvmnorm.measure import RandomTimeRunner, SearchOnlyBuilder
    from tvmnorm.sched.space import torch_compile_fwd_shapes
    from tvmnorm.tune import _tasks, record_trace, seed_candidates

    fwd, bwd = NormKey(hidden_size=512), NormKey(stage="bwd", hidden_size=512)
    funcs, owner = _tasks([fwd, bwd], "cuda", 256, chunks=[32])
    db = ms.database.JSONDatabase(work_dir=str(tmp_path))
    assert seed_candidates(db, funcs, owner, "cuda", SearchOnlyBuilder(), RandomTimeRunner()) == (len(funcs), 0, 4)
    top = db.get_top_k(db.commit_workload(IRModule({"main": funcs[f"{fwd.name}_fwd"]})), 10)
    assert len(top) == 5
    shapes = torch_compile_fwd_shapes(fwd).values()
    launches = set()
    for rec in top:
        src = generated_cuda(scheduled_funcs(fwd, "cuda", {"parts": {"fwd": record_trace(rec.trace)}}))
        launches.add(re.search(r"__launch_bounds__\((\d+)", src).group(1))
    assert str(next(iter(shapes)).threads * next(iter(shapes)).rows) in launches and len(launches) == 2
    # an interrupted run's recovery counts candidates drawn from the space: the seeds are none
    from tvmnorm._tvm import target
    from tvmnorm.targets import target_spec
    from tvmnorm.tune import _best_records
    fwd_task = {f"{fwd.name}_fwd": funcs[f"{fwd.name}_fwd"]}
    assert _best_records(db, fwd_task, owner, target(target_spec("cuda")), 32, need=1) == {}


def test_cuda_runner_times_single_cold_calls():
    """On CUDA each timed call is one call after an L2 flush, as the bench times it (triton's
    do_bench writes 256 MB first); on the CPU calls run back to back. The mean the cost model
    learns from leaves out the fastest and slowest fifth of the repeats."""
    from tvmnorm.measure import InProcessRunner, trimmed
    cuda, cpu = InProcessRunner("cuda"), InProcessRunner("llvm")
    assert (cuda.number, cuda.min_repeat_ms) == (1, 0) and cuda.repeat >= 10 and cuda.flush_bytes >= 2 * (60 << 20)
    assert cpu.flush_bytes == 0 and cpu.number > 1
    assert trimmed([9.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 100.0]) == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert trimmed([2.0]) == [2.0]


def test_records_measured_another_way_are_due_again():
    """tune skips a key whose record saw enough trials at this row count and timing; a CUDA
    record tuned warm (before the fifth lease: no ``timing``, >= 256 MB of rows) is tuned again."""
    from tvmnorm.tune import due_keys, tune_rows
    a, b, c, d = (NormKey(hidden_size=h) for h in (1024, 2048, 4096, 7168))
    cold = {"trials": 16, "timing": "cold-l2"}
    records = {a.pack(): {**cold, "rows": tune_rows(a, "cuda")},
               b.pack(): {**cold, "rows": tune_rows(b, "cuda"), "trials": 8},
               c.pack(): {"trials": 32, "rows": 131073},  # the old warm record
               }
    assert due_keys([a, b, c, d], records, "cuda", 16) == [b, c, d]
    assert due_keys([a], records, "cuda", 16, rows=4097) == [a]  # another --rows
    # llvm records are timed back to back, as before
    assert due_keys([a], {a.pack(): {"trials": 8, "rows": 1024}}, "llvm", 8) == []
    assert all(not due_keys([NormKey.unpack(k)], {k: r}, "llvm", r["trials"])
               for k, r in committed_llvm_records().items())


def test_dx_candidates_are_timed_with_the_partial_sum_after_them(monkeypatch):
    """Each dx task's candidates carry the time of the kernels that sum its partials (finalize,
    after combine above runtime.COMBINE_ABOVE partials), so the choice of T pays for the partial
    rows it makes; other tasks carry nothing."""
    from tvmnorm import runtime
    from tvmnorm.measure import InProcessBuilder, InProcessRunner
    from tvmnorm.sched.default import default_schedule
    from tvmnorm.tune import _tasks, measure_schedules, partial_sum_costs
    bwd = NormKey(norm="layernorm", stage="bwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=384)
    fwd = NormKey(itype="fp32", wtype="fp32", otype="fp32", hidden_size=384)
    funcs, owner = _tasks([bwd, fwd], "llvm", 8192)  # T = 64 on llvm: 128 partials
    runner = InProcessRunner("llvm")
    costs = partial_sum_costs(funcs, owner, "llvm", InProcessBuilder("llvm", workers=1), runner)
    assert set(costs) == {f"{bwd.name}_dx"} and costs[f"{bwd.name}_dx"] > 0 and runner.measured == 1
    monkeypatch.setattr(runtime, "COMBINE_ABOVE", 64)  # 128 partials: combine, then finalize
    partial_sum_costs(funcs, owner, "llvm", InProcessBuilder("llvm", workers=1), runner)
    assert runner.measured == 3
    # the runner adds a task's cost to each of its measurements, and only to that task's
    task = f"{bwd.name}_dx"
    runner.add_fixed(funcs[task], 1.0)
    items = [(default_schedule(funcs[name], owner[name][1], "llvm", 4), funcs[name])
             for name in (task, f"{fwd.name}_fwd")]
    (dx_secs, _), (fwd_secs, _) = measure_schedules(items, "llvm", InProcessBuilder("llvm", workers=1), runner)
    assert all(1.0 < t < 1.1 for t in dx_secs) and all(t < 0.1 for t in fwd_secs)


def test_load_records_reads_what_tune_wrote(tmp_path):
    from tvmnorm.tune import save_records
    save_records("llvm", {NormKey().pack(): {"key": NormKey().name, "parts": {}, "trials": 3}}, tmp_path)
    assert load_records("llvm", tmp_path)[NormKey().pack()]["trials"] == 3
    assert load_records("cuda", tmp_path) == {}


@pytest.mark.slow
@pytest.mark.parametrize("key,part", [(NormKey(hidden_size=1024), "fwd"),
                                      (NormKey(norm="layernorm", stage="bwd", hidden_size=1000), "dx")],
                         ids=["fwd", "fused-bwd"])
@pytest.mark.parametrize("kind,build", [("llvm", None), ("cuda", "nvrtc"), ("cuda", "nvcc")])
def test_candidates_build_in_forked_workers(kind, build, key, part):
    """The tuning builder compiles sampled candidates in forked workers into loadable libraries,
    for a row kernel and the fused bwd kernel. CUDA candidates either the NVRTC way (TVM's CUDA
    build: without a CUDA runtime, as here, the library keeps the CUDA source, so it can only be
    loaded where there is one) or through cuda_host + nvcc (loadable with tvm_ffi alone)."""
    from tvm.s_tir import meta_schedule as ms
    from tvmnorm._tvm import IRModule, cuda_available, load_module, target
    from tvmnorm.measure import InProcessBuilder
    from tvmnorm.targets import target_spec
    if build == "nvcc" and not has_nvcc():
        pytest.skip("nvcc not installed")
    tgt = target(target_spec(kind))
    inputs = []
    for _ in range(2):
        # static rows, as MetaSchedule measures them (the static kernel must compile too, not
        # only its trace replayed on the symbolic-row one); the fused CUDA kernel has one space
        # per (threads, vec) variant: the first and the last
        func = tuning_func(key, part, 512, kind)
        for index in sorted({0, len(design_spaces(key, kind)) - 1}):
            sch = space_variant(key, kind, func, index)
            inputs.append(ms.builder.BuilderInput(IRModule({"main": sch.mod["main"]}), tgt))
    results = InProcessBuilder(kind, workers=2, cuda_build=build or "nvrtc").build(inputs)
    for res in results:
        assert res.error_msg is None, res.error_msg
        assert pathlib.Path(res.artifact_path).read_bytes()[:4] == b"\x7fELF"
        if build == "nvrtc" and not cuda_available():
            continue
        mod = load_module(res.artifact_path)
        assert mod.implements_function("main")


def test_cuda_build_mode_is_checked():
    from tvmnorm.measure import build_candidate
    with pytest.raises(ValueError, match="cuda_build"):
        build_candidate(None, "cuda", None, None, cuda_build="ptxas")


def test_cuda_tuning_rows_leave_a_partial_block_like_the_library_kernel():
    """The static row count a CUDA key is tuned at leaves a partial last block for every
    rows-per-block knob, so the measured candidate carries the same per-stage row guards as the
    library's symbolic-row kernel (without them, a 2-rows-per-block record measured 46% faster
    than it ran in the library on the H200)."""
    import re
    from tvmnorm._tvm import IRModule, compile_module, target
    from tvmnorm.compute import kernel_funcs
    from tvmnorm.sched.rows import CudaRowConfig, schedule_rows_cuda
    from tvmnorm.targets import target_spec
    from tvmnorm.tune import tune_rows
    from tvmnorm.shapes import TRAIN_TOKENS, shapes
    for shape in shapes():
        n = tune_rows(NormKey(hidden_size=shape.hidden), "cuda")
        assert n % 16 == 1 and n == shape.rows(TRAIN_TOKENS) + 1, (shape, n)
    assert tune_rows(NormKey(hidden_size=1000), "cuda") == TRAIN_TOKENS + 1
    key = NormKey(hidden_size=7168)
    cfg = CudaRowConfig(threads=64, rows=2, vec=2, unroll=256)

    def guards(func):
        sch = schedule_rows_cuda(func, cfg)
        mod = IRModule({"main": sch.mod["main"].with_attr("tirx.is_scheduled", True)})
        src = compile_module(mod, target(target_spec("cuda"))).mod.imports[0].inspect_source()
        return len(re.findall(r"threadIdx\.y\)\)? < ", src))
    static = guards(tuning_func(key, "fwd", tune_rows(key, "cuda"), "cuda"))
    assert static > 100 and static == guards(kernel_funcs(key, "cuda")["fwd"])


def test_accept_records_drops_what_lost_to_the_default_or_failed_refcheck():
    from tvmnorm.tune import accept_records
    keys = {h: NormKey(hidden_size=h) for h in (1024, 2048, 4096, 7168)}

    def rec(h, impl, us, status="ok"):
        return {"op": "rmsnorm_fwd", "dtype": "bf16", "hidden": h, "rows": 16384, "impl": impl,
                "us": us, "status": status}
    bench = {"records": [rec(1024, "tvmnorm_tuned", 10.0), rec(1024, "tvmnorm_default", 12.0),
                         rec(2048, "tvmnorm_tuned", 20.3), rec(2048, "tvmnorm_default", 20.0),  # within slack
                         rec(4096, "tvmnorm_tuned", 50.0, "wrong"), rec(4096, "tvmnorm_default", 60.0),
                         rec(7168, "tvmnorm_tuned", 175.0), rec(7168, "tvmnorm_default", 120.3)]}
    records = {k.pack(): {"key": k.name} for k in keys.values()}
    records[NormKey(hidden_size=512).pack()] = {"key": "never benchmarked"}
    # a decode call (at most SMALL_CALL_BYTES of x) runs the library's small-call kernel, not the
    # tuned one: its timing says nothing of the record
    bench["records"] += [dict(rec(1024, "tvmnorm_tuned", 9.0), rows=1), dict(rec(1024, "tvmnorm_default", 5.0), rows=1)]
    kept, dropped = accept_records(records, bench)
    assert set(kept) == {keys[1024].pack(), keys[2048].pack()}
    assert "wrong" in dropped[keys[4096].pack()]
    assert "slower than the default" in dropped[keys[7168].pack()]
    assert dropped[NormKey(hidden_size=512).pack()] == "not benchmarked"
    # so is a CUDA backward call the decode backward serves (runtime.is_decode_call), not on llvm
    bwd = NormKey(stage="bwd", hidden_size=4096)
    calls = {"records": [dict(rec(4096, impl, us), op="rmsnorm_bwd", rows=rows) for rows, impl, us in
                         ((16384, "tvmnorm_tuned", 100.0), (16384, "tvmnorm_default", 120.0),
                          (64, "tvmnorm_tuned", 9.0), (64, "tvmnorm_default", 5.0))]}
    assert bwd.pack() in accept_records({bwd.pack(): {"key": bwd.name}}, calls)[0]
    calls["meta"] = {"target": "llvm"}
    assert "slower than the default" in accept_records({bwd.pack(): {"key": bwd.name}}, calls)[1][bwd.pack()]
    # a record the benchmark did not cover stays when it was accepted before, unchanged
    before = {NormKey(hidden_size=512).pack(): {"key": "never benchmarked"}}
    kept, _ = accept_records(records, bench, accepted=before)
    assert NormKey(hidden_size=512).pack() in kept
    # so does one whose tuned cell is "missing": a tune job's library holds the job's keys only
    # (the eleventh lease's fp16 job dropped 10 committed records that way), and a
    # default-schedule record is served as the default; a new record there is not benchmarked
    k512 = NormKey(hidden_size=512).pack()
    gap = {"records": bench["records"] + [dict(rec(512, "tvmnorm_tuned", 0.0, "missing"), us=None),
                                          rec(512, "tvmnorm_default", 8.0)]}
    kept, dropped = accept_records(records, gap, accepted=before)
    assert kept[k512] == before[k512] and k512 not in dropped
    kept, dropped = accept_records(records, gap)
    assert k512 not in kept and dropped[k512] == "not benchmarked"
    # a retuned record slower than the committed one it replaces (as the committed library's
    # benchmark measured it), or no faster beyond the slack, gives way to it; an unchanged or
    # faster one is kept
    committed = {keys[1024].pack(): {"key": keys[1024].name, "parts": "old"},
                 keys[2048].pack(): {"key": keys[2048].name, "parts": "old"}}
    retuned = {keys[1024].pack(): {"key": keys[1024].name, "parts": "new"},
               keys[2048].pack(): {"key": keys[2048].name, "parts": "new"}}
    previous = [{"records": [rec(1024, "tvmnorm_tuned", 9.0), rec(2048, "tvmnorm_tuned", 21.0)]}]
    kept, dropped = accept_records(retuned, bench, accepted=committed, previous=previous)
    assert kept[keys[1024].pack()]["parts"] == "old" and "than the record it replaces" in dropped[keys[1024].pack()]
    assert kept[keys[2048].pack()]["parts"] == "new" and keys[2048].pack() not in dropped
    kept, dropped = accept_records(committed, bench, accepted=committed, previous=previous)  # unchanged
    assert kept == committed and not dropped
    level = [{"records": [rec(2048, "tvmnorm_tuned", 20.38)]}]  # 20.3 now: 0.4% faster, within the 2%
    kept, dropped = accept_records(retuned, bench, accepted=committed, previous=level)
    assert kept[keys[2048].pack()]["parts"] == "old"
    assert dropped[keys[2048].pack()] == "no faster, beyond 2%, than the record it replaces at 16384 rows (20.3 vs 20.4 us)"
    # ... unless the committed record ran slower than this run's default (20.0) beyond the slack
    lost = [{"records": [rec(2048, "tvmnorm_tuned", 20.45)]}]
    kept, dropped = accept_records(retuned, bench, accepted=committed, previous=lost)
    assert kept[keys[2048].pack()]["parts"] == "new" and keys[2048].pack() not in dropped
    # a benchmark counts only for the records its library ran (the manifest's fingerprint): one
    # of a library that ran another 1024 record says nothing about the committed one
    from tvmnorm.build import record_fingerprint
    other = {**previous[0], "meta": {"library": {"kernels": 2, "records": {
        str(keys[1024].pack()): record_fingerprint({"parts": "another"}),
        str(keys[2048].pack()): record_fingerprint(committed[keys[2048].pack()])}}}}
    kept, dropped = accept_records(retuned, bench, accepted=committed, previous=[other])
    assert kept[keys[1024].pack()]["parts"] == "new" and keys[1024].pack() not in dropped
    slow = {"records": [rec(2048, "tvmnorm_tuned", 19.0)], "meta": other["meta"]}
    kept, dropped = accept_records(retuned, bench, accepted=committed, previous=[slow])
    assert kept[keys[2048].pack()]["parts"] == "old" and "than the record it replaces" in dropped[keys[2048].pack()]
    # a later file that ran another record does not override an earlier one that ran this one
    kept, _ = accept_records(retuned, bench, accepted=committed, previous=[previous[0], other])
    assert kept[keys[1024].pack()]["parts"] == "old"
    # a retune that lost to the default leaves the committed record; the committed record
    # itself losing to the default is dropped
    old = {keys[7168].pack(): {"key": keys[7168].name, "parts": "old"}}
    kept, dropped = accept_records({keys[7168].pack(): {"key": keys[7168].name, "parts": "new"}}, bench, accepted=old)
    assert kept == old and "slower than the default" in dropped[keys[7168].pack()]
    kept, dropped = accept_records(old, bench, accepted=old)
    assert not kept and "slower than the default" in dropped[keys[7168].pack()]
    # ... unless earlier runs measured the committed record slower than this run's default too
    # (the kept-row default of the eighth lease overtook records tuned against the earlier one)
    new = {keys[7168].pack(): {"key": keys[7168].name, "parts": "new"}}
    slow_old = [{"records": [rec(7168, "tvmnorm_tuned", 150.0)]}]
    kept, dropped = accept_records(new, bench, accepted=old, previous=slow_old)
    assert not kept and "so was the record it would replace (150.0 vs 120.3 us" in dropped[keys[7168].pack()]
    kept, _ = accept_records(new, bench, accepted=old, previous=[{"records": [rec(7168, "tvmnorm_tuned", 121.0)]}])
    assert kept == old
    # the same traces at another chunk size T are another kernel: a retune that lost keeps the old
    at16 = {keys[7168].pack(): {"key": keys[7168].name, "parts": "old", "rows_per_partial": 16}}
    kept, _ = accept_records({keys[7168].pack(): {**at16[keys[7168].pack()], "rows_per_partial": 32}}, bench,
                             accepted=at16)
    assert kept == at16


def test_merge_accepted_leaves_out_what_any_job_dropped(tmp_path):
    """Each tune job's accepted file is the committed records plus its own accepted ones, less
    what its benchmark dropped; the other jobs still carry a dropped committed record."""
    from tvmnorm.tune import merge_accepted
    committed = {"0x1": {"key": "a", "parts": 1}, "0x2": {"key": "b", "parts": 1}, "0x3": {"key": "c", "parts": 1}}
    job_a = {"0x1": committed["0x1"], "0x3": committed["0x3"], "0x10": {"key": "new a", "parts": 2}}  # dropped b
    job_b = {**committed, "0x20": {"key": "new b", "parts": 2}}  # did not benchmark b: carries it
    records, dropped = merge_accepted(committed, [job_a, job_b])
    assert set(records) == {"0x1", "0x3", "0x10", "0x20"} and dropped == {"0x2"}
    records, dropped = merge_accepted(committed, [job_b, job_a])  # order does not matter
    assert set(records) == {"0x1", "0x3", "0x10", "0x20"} and dropped == {"0x2"}
    # a job that retuned a committed key ships its record; no job: the committed set as it is
    retuned = {**committed, "0x2": {"key": "b", "parts": 3}}
    assert merge_accepted(committed, [job_a, retuned])[0]["0x2"]["parts"] == 3
    assert merge_accepted(committed, []) == (committed, set())
    # the command line that bench/h200_verify.sh runs
    paths = []
    for name, records in (("committed", committed), ("a", job_a), ("b", job_b)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps({"target": "cuda", "records": records}))
    out = tmp_path / "out.json"
    run = subprocess.run([sys.executable, "-m", "tvmnorm.tune", "merge", *map(str, paths), "--out", str(out)],
                         capture_output=True, text=True, check=True)
    assert "left out b" in run.stdout
    data = json.loads(out.read_text())
    assert data["target"] == "cuda" and set(data["records"]) == {"0x1", "0x3", "0x10", "0x20"}


def test_a_job_tuned_from_no_records_drops_only_its_own_keys(tmp_path):
    """A job that tuned its keys from no records (h200_tune.sh FRESH=1) judges only those: its
    accept's changes drop none of the other committed records, and merge keeps them (the
    twelfth lease's verify merge left 105 of 120 out). Through the command lines, as the lease
    runs them."""
    from tvmnorm.tune import accept_changes, accept_main, merge_main
    a, b, c = (NormKey(hidden_size=h).pack() for h in (1024, 4096, 8192))
    committed = {a: {"key": "a", "parts": 1}, b: {"key": "b", "parts": 1}, c: {"key": "c", "parts": 1}}
    fresh = {b: {"key": "b", "parts": 7}, c: {"key": "c", "parts": 8}}   # the job's own records
    assert accept_changes(committed, {b: fresh[b], c: committed[c]}, fresh) == {"records": [f"{b:#x}"], "dropped": []}
    hexed = lambda recs: {f"{k:#x}": v for k, v in recs.items()}  # noqa: E731
    for name, recs in (("committed", committed), ("job", fresh)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"target": {"kind": "cuda"}, "records": hexed(recs)}))
    # b's retune beats the default; c's loses to it, and c's committed record stays
    bench = {"records": [{"op": "rmsnorm_fwd", "dtype": "bf16", "hidden": h, "rows": 16384, "impl": impl,
                          "status": "ok", "us": us}
                         for h, impl, us in ((4096, "tvmnorm_tuned", 60.0), (4096, "tvmnorm_default", 70.0),
                                             (8192, "tvmnorm_tuned", 150.0), (8192, "tvmnorm_default", 130.0))]}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    assert accept_main([str(tmp_path / "job.json"), str(tmp_path / "bench.json"), str(tmp_path / "acc.json"),
                        "--accepted", str(tmp_path / "committed.json"), "--drop", "--rejected",
                        str(tmp_path / "rejected")]) == 0
    assert json.loads((tmp_path / "acc.json").read_text())["changes"] == {"records": [f"{b:#x}"], "dropped": []}
    # c's retune, turned down, is kept aside as a schedules folder (bwd_parts.py --stream-ab --records)
    assert load_records("cuda", tmp_path / "rejected") == {c: fresh[c]}
    assert merge_main([str(tmp_path / "committed.json"), str(tmp_path / "acc.json"), "--out", str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["records"] == hexed({**committed, b: fresh[b]})


def test_a_retune_makes_records_due_and_keeps_what_it_found_again(tmp_path, capsys):
    """h200_tune.sh RETUNE=1 (`python -m tvmnorm.tune due-again`) makes the selected keys'
    committed records due at any trial count, leaving the others; the job's accept then keeps
    the committed trial count of a trace it found again from fewer trials (the thirty-first
    lease's accept wrote 0 and 16 for records of 48 and 28 trials), so merge changes only what
    the retune changed. Through the command lines, as the lease runs them."""
    from tvmnorm.measure import timing
    from tvmnorm.tune import accept_main, due_again_main, due_keys, merge_main, tune_rows
    a, b, c, d = (NormKey(stage="bwd", hidden_size=h) for h in (1024, 4096, 8192, 2048))
    made = lambda k, parts, trials: {"key": k.name, "parts": parts, "trials": trials,  # noqa: E731
                                     "rows": tune_rows(k, "cuda"), "timing": timing("cuda")}
    committed = {f"{k.pack():#x}": made(k, 1, t) for k, t in ((a, 48), (b, 12), (c, 32), (d, 24))}
    (tmp_path / "committed.json").write_text(json.dumps({"target": {"kind": "cuda"}, "records": committed}))
    state = tmp_path / "state.json"
    state.write_text((tmp_path / "committed.json").read_text())
    keys = f"{a.pack():#x},{b.pack()},{c.pack():#x}"
    assert due_again_main([str(state), "--keys", keys]) == 0
    assert "3 of 3 selected keys had records" in capsys.readouterr().out
    records = read_records(state)
    assert {k.name: records[k.pack()]["trials"] for k in (a, b, c, d)} == {a.name: 0, b.name: 0, c.name: 0, d.name: 24}
    assert all(records[k.pack()]["parts"] == 1 for k in (a, b, c))  # still seeded as candidates
    assert due_keys([a, b, c, d], records, "cuda", 24) == [a, b, c]
    assert due_keys([a], {a.pack(): made(a, 1, 48)}, "cuda", 48) == []
    # the job: a found again at 16 trials (recovered from an interrupted tune), b a new trace,
    # c found again at 48
    job = {f"{a.pack():#x}": made(a, 1, 16), f"{b.pack():#x}": made(b, 2, 48), f"{c.pack():#x}": made(c, 1, 48),
           f"{d.pack():#x}": made(d, 1, 24)}
    (tmp_path / "job.json").write_text(json.dumps({"target": {"kind": "cuda"}, "records": job}))
    bench = {"records": [{"op": "rmsnorm_bwd", "dtype": "bf16", "hidden": k.hidden_size, "rows": 16384, "impl": impl,
                          "status": "ok", "us": us}
                         for k in (a, b, c) for impl, us in (("tvmnorm_tuned", 50.0), ("tvmnorm_default", 60.0))]}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    assert accept_main([str(tmp_path / "job.json"), str(tmp_path / "bench.json"), str(tmp_path / "acc.json"),
                        "--accepted", str(tmp_path / "committed.json")]) == 0
    acc = json.loads((tmp_path / "acc.json").read_text())
    assert acc["records"][f"{a.pack():#x}"] == committed[f"{a.pack():#x}"]
    assert acc["changes"] == {"records": [f"{b.pack():#x}", f"{c.pack():#x}"], "dropped": []}
    assert merge_main([str(tmp_path / "committed.json"), str(tmp_path / "acc.json"), "--out", str(tmp_path / "m.json")]) == 0
    merged = json.loads((tmp_path / "m.json").read_text())["records"]
    assert {k: (v["parts"], v["trials"]) for k, v in merged.items()} == {
        f"{a.pack():#x}": (1, 48), f"{b.pack():#x}": (2, 48), f"{c.pack():#x}": (1, 48), f"{d.pack():#x}": (1, 24)}
    with pytest.raises(SystemExit):
        due_again_main([str(tmp_path / "gone.json"), "--keys", keys])
    assert "gone.json does not exist" in capsys.readouterr().err


def test_a_schedules_file_rewritten_in_place_survives_an_interrupt(tmp_path, monkeypatch):
    """due-again (and merge and accept, whose --out may be the committed file) rewrote a
    schedules file with write_text: an interrupt mid-write left it cut, its records lost. Now
    the new text goes to a temporary file that replaces the old one whole."""
    from tvmnorm import tune
    key = NormKey(stage="bwd", hidden_size=1024)
    path = tmp_path / "cuda-sm_90.json"
    path.write_text(json.dumps({"target": {"kind": "cuda"}, "records": {f"{key.pack():#x}": {"key": key.name,
                                                                                            "trials": 48}}}))
    before = path.read_bytes()

    def cut(data, f, **kw):
        f.write(json.dumps(data)[:20])
        raise KeyboardInterrupt
    monkeypatch.setattr(tune.json, "dump", cut)
    with pytest.raises(KeyboardInterrupt):
        tune.due_again_main([str(path), "--keys", f"{key.pack():#x}"])
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]
    # written whole, the file keeps its mode (mkstemp's 0600 made a shared schedules/ unreadable
    # to others), and a new one gets the umask's
    monkeypatch.undo()
    path.chmod(0o640)
    assert tune.due_again_main([str(path), "--keys", f"{key.pack():#x}"]) == 0
    assert read_records(path)[key.pack()]["trials"] == 0 and path.stat().st_mode & 0o777 == 0o640
    tune.save_records("llvm", {}, tmp_path / "new")
    mask = os.umask(0o022)
    os.umask(mask)
    assert tune.schedules_path("llvm", tmp_path / "new").stat().st_mode & 0o777 == 0o666 & ~mask


def _default_candidate(key, part, rows=256):
    from tvmnorm._tvm import ms, target
    from tvmnorm.sched.default import default_schedule
    from tvmnorm.targets import target_spec
    func = tuning_func(key, part, rows, "llvm")
    mod = default_schedule(func, part, "llvm", 4).mod
    return ms.builder.BuilderInput(mod, target(target_spec("llvm"))), func


def test_overlapping_builds_time_each_candidate_once_it_is_built(monkeypatch):
    """InProcessBuilder(overlap=True): build returns at once, its candidates still compiling in
    the pool; InProcessRunner(builder=...) gives futures that are not done until the build is,
    then timed, and a failed build comes back as that candidate's error. (tvmnorm tune
    --overlap-builds; on llvm only the mechanics: its timings would share the cores.)"""
    import time
    from tvmnorm import measure
    from tvmnorm._tvm import ms
    real = measure.build_candidate

    def slow(*a, **kw):
        time.sleep(1.5)
        return real(*a, **kw)
    monkeypatch.setattr(measure, "build_candidate", slow)  # the pool forks after this
    key = NormKey(itype="fp32", wtype="fp32", otype="fp32", hidden_size=384)
    inp, func = _default_candidate(key, "fwd")
    builder = measure.InProcessBuilder("llvm", workers=2, overlap=True)
    runner = measure.InProcessRunner("llvm", builder=builder)
    t0 = time.monotonic()
    (built,) = builder.build([inp])
    assert time.monotonic() - t0 < 1.0 and built.error_msg is None
    (future,) = runner.run([ms.runner.RunnerInput(built.artifact_path, "llvm", ms.arg_info.ArgInfo.from_prim_func(func))])
    assert not future.done()
    result = future.result()
    assert result.error_msg is None and len(result.run_secs) > 0 and future.done() and runner.measured == 1

    def broken(*a, **kw):
        raise RuntimeError("no compiler here")
    monkeypatch.setattr(measure, "build_candidate", broken)
    builder = measure.InProcessBuilder("llvm", workers=2, overlap=True)
    runner = measure.InProcessRunner("llvm", builder=builder)
    (built,) = builder.build([inp])
    (future,) = runner.run([ms.runner.RunnerInput(built.artifact_path, "llvm", ms.arg_info.ArgInfo.from_prim_func(func))])
    result = future.result()
    assert result.run_secs is None and "build failed: RuntimeError: no compiler here" in result.error_msg
    assert builder.errors and runner.measured == 0


def test_overlap_builds_is_refused_off_cuda(tmp_path):
    r = tvmnorm("tune", "--target", "llvm", "--hidden", "384", "--dtypes", "fp32", "--stages", "fwd", "--norms",
                "rmsnorm", "--schedules", str(tmp_path / "sch"), "--logs", str(tmp_path / "logs"), "--overlap-builds")
    assert r.returncode != 0 and "--overlap-builds is for CUDA" in r.stderr


def test_a_batch_starts_only_with_half_its_time_left():
    """tune.batch_past_limit (tvmnorm tune --time-limit, h200_tune.sh's TUNE_SECONDS): the
    thirty-second lease's last call had 130 s, spent them drawing a batch of four keys' design
    spaces at ~66 s a key, and measured none of them."""
    from tvmnorm.tune import batch_past_limit
    assert batch_past_limit(4, 10, 0, 0, None, 60) is None                 # no limit
    assert batch_past_limit(4, 10, 0, 0, 140, None) is None                # nothing to estimate with
    assert "under half of 240 s at 60 s a key (--key-seconds)" in batch_past_limit(4, 20, 0, 0, 130, 60)
    assert batch_past_limit(4, 10, 0, 0, 545, 60) is None
    # this run's own seconds a key win over the estimate
    assert "at 65 s a key (this run)" in batch_past_limit(4, 532, 520, 8, 545, 10)
    assert batch_past_limit(4, 400, 390, 6, 545, 1000) is None             # 145 s left of 260
    assert "spent" in batch_past_limit(1, 546, 520, 8, 545, None)


def test_tune_stops_before_a_batch_past_its_time_limit(tmp_path):
    """--time-limit with --key-seconds: the batch is not started, the run says why, its keys
    stay due (no records written) and the run ends cleanly."""
    r = tvmnorm("tune", "--target", "llvm", "--norms", "rmsnorm", "--stages", "fwd", "--dtypes", "fp32",
                "--hidden", "384,512", "--trials", "4", "--rows", "256", "--logs", str(tmp_path / "logs"),
                "--schedules", str(tmp_path / "sch"), "--no-build", "--time-limit", "600", "--key-seconds", "10000")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "stopping before 2 keys" in r.stderr and "they stay due" in r.stderr, r.stderr[-2000:]
    assert "tuned " not in r.stderr and not list((tmp_path / "sch").glob("llvm-*.json"))


@pytest.mark.parametrize("held", ("schedules", "logs"))
def test_a_second_tune_on_the_same_records_stops_before_touching_them(tmp_path, held):
    """Two tune runs on one schedules file lost records: each saved what it had loaded at its
    start and what it tuned, over what the other had saved; two on one database interleave the
    workload lines its records point into. A run finding either held by another stops at once,
    naming it, and leaves the other's file as it was."""
    from tvmnorm.cli import main
    from tvmnorm.targets import target_name
    from tvmnorm.tune import run_lock, save_records, schedules_path
    sch, logs = tmp_path / "sch", tmp_path / "logs"
    other = NormKey(hidden_size=512, itype="fp32", wtype="fp32", otype="fp32")
    save_records("llvm", {other.pack(): {"key": other.name, "trials": 4}}, sch)
    before = schedules_path("llvm", sch).read_bytes()
    held_path = schedules_path("llvm", sch) if held == "schedules" else logs / target_name("llvm")
    # the other run holds one of the two, with a folder of its own for the other
    own = tmp_path / "other"
    with run_lock(held_path if held == "schedules" else schedules_path("llvm", own),
                  held_path if held == "logs" else own / target_name("llvm")):
        with pytest.raises(SystemExit) as stop:
            main(["tune", "--target", "llvm", "--norms", "rmsnorm", "--stages", "fwd", "--dtypes", "fp32",
                  "--hidden", "384", "--trials", "1", "--logs", str(logs), "--schedules", str(sch), "--no-build"])
    assert f"{held_path} is in use by another tvmnorm tune (pid {os.getpid()})" in str(stop.value.code)
    assert schedules_path("llvm", sch).read_bytes() == before
    assert not (logs / target_name("llvm")).exists()


def test_tuner_us_times_a_record_as_the_search_does():
    """tune.tuner_us (bench/bwd_parts.py --stream-ab's "tuner" column): a committed record's
    trace built on the tuning function and timed by the tuner's runner, the dx with the partial
    sums' cost added as the search adds it; a trace that does not apply is an error that says
    which key. On llvm here (the H200 runs it on CUDA)."""
    from tvmnorm.measure import InProcessBuilder, InProcessRunner
    from tvmnorm.tune import tuner_us
    key = NormKey(stage="bwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=128)
    record = committed_llvm_records()[key.pack()]
    runner = InProcessRunner("llvm")
    us = tuner_us(key, record, "dx", "llvm", InProcessBuilder("llvm", workers=1), runner)
    (fixed,) = runner._fixed.values()
    assert 0 < fixed * 1e6 < us < 1e5
    # without the partial sums, and after a warm-up (--stream-ab's "dx" and "warm" columns)
    runner = InProcessRunner("llvm", warmup_ms=5)
    assert 0 < tuner_us(key, record, "dx", "llvm", runner=runner, partial_sums=False) < 1e5
    assert runner._fixed == {} and runner.measured == 1
    other = NormKey(norm="layernorm", stage="bwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=128)
    with pytest.raises(ValueError, match=f"{other.name} dx: the record's trace does not apply"):
        tuner_us(other, record, "dx", "llvm")


def test_tuner_calls_run_the_searchs_candidate_on_sets_of_their_own():
    """tune.tuner_calls (--stream-ab's "static" columns: the search's candidate under the
    bench's timer): one call a set, each on its own random arguments, each computing the
    record's dx and dgamma partials right against float64."""
    from tvmnorm.tune import tuner_calls
    key = NormKey(stage="bwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=128)
    calls = tuner_calls(key, committed_llvm_records()[key.pack()], "dx", "llvm", sets=2)
    assert len(calls) == 2
    for c in calls:
        dy, x, rsigma, gamma, dx, part = c.args
        dx.copyfrom(np.full(dx.shape, np.nan, "float32"))
        c()
        want_dx, want_dgamma = reference.rmsnorm_bwd(dy.numpy(), x.numpy(), rsigma.numpy(), gamma.numpy())
        np.testing.assert_allclose(dx.numpy(), want_dx, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(part.numpy().sum(axis=(0, 1)), want_dgamma, rtol=1e-4, atol=1e-3)
    assert not np.array_equal(calls[0].args[1].numpy(), calls[1].args[1].numpy())


def test_accept_names_a_missing_benchmark(tmp_path, capsys):
    """tune accept stops on a missing input file, by name, before it writes anything: run
    without --previous it would let a retuned record that is slower than the committed one
    replace it (the fourteenth lease's tree was carried without bench/results)."""
    from tvmnorm.tune import accept_main
    records = json.dumps({"target": {"kind": "cuda"}, "records": {}})
    for name in ("job", "committed"):
        (tmp_path / f"{name}.json").write_text(records)
    (tmp_path / "bench.json").write_text(json.dumps({"records": []}))
    args = [str(tmp_path / "job.json"), str(tmp_path / "bench.json"), str(tmp_path / "acc.json"),
            "--accepted", str(tmp_path / "committed.json")]
    for extra, missing in (([], None), (["--previous", str(tmp_path / "gone.json")], "--previous"),
                           (["--accepted", str(tmp_path / "nope.json")], "--accepted")):
        if missing is None:
            assert accept_main(args + extra) == 0
            continue
        (tmp_path / "acc.json").unlink(missing_ok=True)
        with pytest.raises(SystemExit):
            accept_main(args + extra)
        assert f"{missing} file" in capsys.readouterr().err and not (tmp_path / "acc.json").exists()


def test_merge_takes_only_what_each_job_changed(tmp_path):
    """accept records what a job changed against the records it started from; merge takes
    only that, so a job's copies of records it did not touch cannot overwrite records that the
    committed set gained after the job started (the eighth lease's verify merge put 17
    superseded records back into its library that way)."""
    from tvmnorm.tune import accept_changes, merge_accepted
    start = {1: {"key": "a", "parts": 1}, 2: {"key": "b", "parts": 1}, 3: {"key": "c", "parts": 1}}
    job_fwd = {**start, 1: {"key": "a", "parts": 2}}           # retuned a
    job_bwd = {1: start[1], 3: start[3], 4: {"key": "d"}}       # dropped b, added d
    judged = {**start, 4: {"key": "d"}}  # what each job's accept saw: the records it started from and its own
    assert accept_changes(start, job_fwd, judged) == {"records": ["0x1"], "dropped": []}
    assert accept_changes(start, job_bwd, judged) == {"records": ["0x4"], "dropped": ["0x2"]}
    hexed = [{f"{k:#x}": v for k, v in job.items()} for job in (job_fwd, job_bwd)]
    runs = [(job, accept_changes(start, orig, judged)) for job, orig in zip(hexed, (job_fwd, job_bwd))]
    # the committed records already hold both jobs' results, and c was retuned since
    committed = {"0x1": {"key": "a", "parts": 2}, "0x3": {"key": "c", "parts": 5}, "0x4": {"key": "d"}}
    records, _ = merge_accepted(committed, runs)
    assert records == committed
    # the older rule (whole records, no changes) would have put c's superseded record back
    assert merge_accepted(committed, [job for job, _ in runs])[0]["0x3"] == {"key": "c", "parts": 1}
    # the command line: changes are read from the accept output
    paths = []
    for name, data in (("committed", {"records": committed}),
                       ("fwd", {"records": hexed[0], "changes": runs[0][1]}),
                       ("bwd", {"records": hexed[1], "changes": runs[1][1]})):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(data))
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, "-m", "tvmnorm.tune", "merge", *map(str, paths), "--out", str(out)],
                   capture_output=True, text=True, check=True)
    assert json.loads(out.read_text())["records"] == committed
    # accept writes the changes: here a retuned record that beat the default
    key = NormKey(hidden_size=1024)
    bench = {"records": [{"op": "rmsnorm_fwd", "dtype": "bf16", "hidden": 1024, "rows": 16384, "impl": impl,
                          "us": us, "status": "ok"} for impl, us in (("tvmnorm_tuned", 9.0), ("tvmnorm_default", 12.0))]}
    files = {name: tmp_path / f"{name}.json" for name in ("tuned", "bench", "started", "accepted")}
    files["tuned"].write_text(json.dumps({"records": {f"{key.pack():#x}": {"key": key.name, "parts": "new"}}}))
    files["started"].write_text(json.dumps({"records": {f"{key.pack():#x}": {"key": key.name, "parts": "old"}}}))
    files["bench"].write_text(json.dumps(bench))
    subprocess.run([sys.executable, "-m", "tvmnorm.tune", "accept", *(str(files[n]) for n in ("tuned", "bench", "accepted")),
                    "--accepted", str(files["started"])], capture_output=True, text=True, check=True)
    assert json.loads(files["accepted"].read_text())["changes"] == {"records": [f"{key.pack():#x}"], "dropped": []}
    # one that lost to the default becomes the default's record (--drop: none)
    bench["records"][0]["us"] = 15.0
    files["bench"].write_text(json.dumps(bench))
    files["tuned"].write_text(json.dumps({"records": {f"{key.pack():#x}": {"key": key.name, "rows": 16385,
                                                                           "parts": {"fwd": "new"}}}}))
    for drop in ([], ["--drop"]):
        res = subprocess.run([sys.executable, "-m", "tvmnorm.tune", "accept", *(str(files[n]) for n in ("tuned", "bench", "accepted")),
                              *drop], capture_output=True, text=True, check=True)
        kept = json.loads(files["accepted"].read_text())["records"]
        if drop:
            assert kept == {} and "dropped rmsnorm_fwd" in res.stdout
        else:
            assert kept[f"{key.pack():#x}"]["default_won"] == ["fwd"] and "the default's schedule replaces" in res.stdout


def test_tune_batch_stops_when_only_the_defaults_could_be_timed(tmp_path, monkeypatch):
    """seed_candidates builds and times each task's default first; a session in which no sampled
    candidate builds (a broken space or toolchain) must still stop the run, not ship defaults."""
    from tvmnorm import measure
    from tvmnorm.tune import TuningBroken, tune_batch
    real, calls = measure._build_in_worker, []

    def fails_after_the_default(payload):
        calls.append(payload)
        return real(payload) if len(calls) == 1 else (None, "broken on purpose")
    monkeypatch.setattr(measure, "_build_in_worker", fails_after_the_default)
    key = NormKey(itype="fp32", wtype="fp32", otype="fp32", hidden_size=384)
    with pytest.raises(TuningBroken, match="broken on purpose"):
        tune_batch([key], "llvm", 2, tmp_path, 256, workers=1)  # workers=1: builds in this process
    assert len(calls) >= 2


@pytest.mark.slow
def test_preflight_times_the_default_or_names_every_failed_build():
    from tvmnorm._tvm import cuda_available
    from tvmnorm.tune import TuningBroken, preflight
    key = NormKey(hidden_size=768, itype="fp32", wtype="fp32", otype="fp32")
    us, build = preflight(key, "llvm", 64)
    assert us > 0 and build is None
    if cuda_available():
        pytest.skip("a GPU is here: the CUDA preflight would pass")
    with pytest.raises(TuningBroken) as err:
        preflight(NormKey(hidden_size=1024), "cuda", 4097)
    assert "nvrtc build of" in str(err.value) and "nvcc build of" in str(err.value)


def _hanging_build(payload):
    import time
    time.sleep(30)
    return "never", None


def test_forked_build_round_that_hangs_fails_instead_of_stalling(monkeypatch):
    import time
    from tvmnorm import measure
    monkeypatch.setattr(measure, "_build_in_worker", _hanging_build)
    builder = measure.InProcessBuilder("llvm", workers=2, timeout=1.0)
    t0 = time.time()
    done = builder._build_forked([("a",), ("b",)])
    assert time.time() - t0 < 10
    assert all(path is None and err.startswith("TimeoutError") for path, err in done)
    assert builder._pool is None  # killed, a fresh pool next round


def test_search_population_follows_the_space_size():
    """The population drawn each round is the space's size (32..256): the fused CUDA backward's
    ~100-370 points over 67-134 design spaces took ~9 s per task and round to draw at 256. The
    backward's min_blocks, full_chunks, hoist_inits and shared_sums factors are left out of it
    (population_points): they would make a batch's population 352 instead of 32 and the draw
    ~10x longer, for rounds that measure 8."""
    from tvmnorm.sched.space import (FULL_CHUNKS, HOIST_INITS, MIN_BLOCKS, SHARED_SUMS, STREAM, fwd_kept_variants,
                                     kept_guarded, population_points, space_size)
    from tvmnorm.tune import _search
    bwd = NormKey(norm="layernorm", stage="bwd", hidden_size=4096)
    assert 32 < population_points(bwd, "cuda") < 256
    assert population_points(bwd, "cuda") < space_size(bwd, "cuda") <= (
        len(MIN_BLOCKS) * len(FULL_CHUNKS) * len(HOIST_INITS) * len(SHARED_SUMS) * len(STREAM)
        * population_points(bwd, "cuda"))
    assert _search(population_points(bwd, "cuda")).population_size == population_points(bwd, "cuda")
    ln8192 = NormKey(norm="layernorm", stage="bwd", hidden_size=8192, itype="fp32", otype="fp32", wtype="fp32")
    assert population_points(ln8192, "cuda") < 32 and _search(population_points(ln8192, "cuda")).population_size == 32
    fwd = NormKey(hidden_size=4096)  # the forward's full_chunks factor is left out too
    # (a variant of one row a block, e.g. warp_sums, has no row guard and samples no full_chunks)
    assert 2 * population_points(fwd, "cuda") - space_size(fwd, "cuda") // len(STREAM) == sum(
        not kept_guarded(kept) for kept in fwd_kept_variants(fwd)) > 0
    for key, kind, size in [(fwd, "cuda", 256), (NormKey(hidden_size=1000), "llvm", 32)]:
        assert _search(population_points(key, kind)).population_size == size
    assert population_points(NormKey(hidden_size=1000), "llvm") == space_size(NormKey(hidden_size=1000), "llvm")


def test_fused_variants_add_warp_multiples_that_split_the_row_evenly():
    """Thread counts in whole warps beyond the powers of two split rows such as 7168 (896
    vectors of 8) evenly; the fused dx variants hold them beside the powers of two (which ran
    faster as the default at layernorm 3584-7168), and rows that none splits (4095) get none."""
    from tvmnorm.sched.space import exact_thread_counts, fused_cuda_variants, fwd_kept_variants
    assert exact_thread_counts(7168, 8, 4) == [224, 448, 896]
    assert exact_thread_counts(5120, 8, 2) == [320, 640]
    assert exact_thread_counts(8192, 8, 4) == [] and exact_thread_counts(4095, 1, 4) == []
    threads = {v[:2] for v in fused_cuda_variants(NormKey(norm="layernorm", stage="bwd", hidden_size=7168))}
    assert {(224, 8), (448, 8), (896, 8), (512, 8), (256, 8), (448, 4), (896, 4)} <= threads
    # the forward keeps them for its warp_sums variants (which need an even split) alone
    kept = fwd_kept_variants(NormKey(hidden_size=7168))
    assert all(v.threads & (v.threads - 1) == 0 for v in kept if not v.warp_sums)
    assert {(v.threads, v.vec) for v in kept if v.warp_sums} == {(128, 8), (224, 8), (448, 8), (896, 8), (224, 4),
                                                                 (256, 4), (448, 4), (896, 4)}
    # each of rows with barriers (64 threads or more) again with its weights loaded before them
    assert {v[:4] for v in kept if v.early_weights} == {v[:4] for v in kept if v.threads >= 64}
    assert all(not v.early_weights for v in fwd_kept_variants(NormKey(hidden_size=128)))
    # and each of 16 warps or more (warp_sums) again adding the warps' sums by shuffles
    assert {v[:5] for v in kept if v.shuffle_sums} == {v[:5] for v in kept if v.warp_sums and v.threads >= 512}
    assert {v.threads for v in kept if v.shuffle_sums} == {896} and all(v.warp_sums for v in kept if v.shuffle_sums)
    assert {v[0] for v in fused_cuda_variants(NormKey(stage="bwd", hidden_size=4095))} == {1024}


def test_fused_variants_hold_gamma_where_its_registers_fit():
    """Each fused variant comes again with gamma held for the whole chunk (chunk_weights) where
    its registers fit the limit beside the sums and rows, and the space builds that kernel."""
    from tvmnorm._tvm import Schedule
    from tvmnorm.sched.space import fused_cuda_variants, fused_register_limit, fused_registers
    key = NormKey(norm="layernorm", stage="bwd", hidden_size=8192)
    variants = fused_cuda_variants(key)
    plain = {v[:4] for v in variants if not v[4]}
    held = {v[:4] for v in variants if v[4]}
    assert held and held < plain
    for threads, vec, prefetch, stages in plain:
        per_thread = -(-8192 // (threads * vec)) * vec
        fits = fused_registers(2, per_thread, prefetch, 2, stages, weight_bytes=2) <= fused_register_limit(
            threads, vectors=per_thread // vec, rows=prefetch * stages)
        assert ((threads, vec, prefetch, stages) in held) == fits
    func = tuning_func(key, "dx", 256, "cuda", 32)
    spaces = space_fn(key, "cuda")(Schedule(func))
    # held: one copy of gamma above the walk over the chunk; else one per stage that reads it
    caches = [sum(sch.get(b).name_hint == "gamma_local" for b in sch.get_child_blocks(sch.get_sblock("root")))
              for sch in spaces]
    assert len(spaces) == len(variants) and [c == 1 for c in caches] == [v[4] for v in variants]


def test_one_vector_layouts_keep_two_rows_in_flight():
    """A thread holding one vector of the row needs fewer registers for addresses (ptxas:
    bench/results/sass-variant-registers.txt), so layernorm 8192 at 1024 x 8 and 7168 at 896 x 8
    load two rows ahead (prefetch 2, or 1 x 2 stages), which the 40-register allowance of wider
    layouts pruned; four rows, or two groups of two, still exceed it, and layouts of 2-4 vectors
    a thread, or more rows in flight, keep the wider allowance."""
    from tvmnorm.sched.space import fused_cuda_variants, fused_register_limit
    for hidden, threads in ((8192, 1024), (7168, 896)):
        points = {v[2:5] for v in fused_cuda_variants(NormKey(norm="layernorm", stage="bwd", hidden_size=hidden),
                                                     staged=False) if v[:2] == (threads, 8)}
        assert {(2, 1, True), (1, 2, True)} <= points
        assert not {p for p in points if p[0] * p[1] >= 4}
    assert fused_register_limit(1024, vectors=1, rows=2) == 36
    assert fused_register_limit(1024, vectors=2, rows=2) == fused_register_limit(1024, vectors=1, rows=4) == 24


@pytest.mark.slow
@pytest.mark.parametrize("key", [NormKey(norm="layernorm", stage="bwd", hidden_size=7168),
                                 NormKey(norm="layernorm", stage="bwd", hidden_size=128),
                                 NormKey(stage="bwd_add", hidden_size=1000, itype="fp16", wtype="fp16", otype="fp16")],
                         ids=lambda k: k.name)
def test_the_fused_space_holds_only_launchable_points(key):
    """The search draws the fused backward's points without VerifyGPUCode (tune._postprocs: it
    lowered every drawn point, ~30% of a search's time), so the space itself must hold no point
    a GPU refuses: every structural variant at its most chunk lanes a block (the most threads
    and shared memory it can ask for) passes it (scripts/launchable_points.py checks every lane
    count: 26030 points of the bf16 and fp16 catalog's spaces, none refused). The forward's
    space keeps the check: its threads and rows are sampled apart."""
    from tvmnorm.sched.space import fused_cuda_variants
    from tvmnorm.tune import _postprocs, refused_fused_points
    assert _postprocs("cuda", key.stage) == []
    assert "VerifyGPUCode" in [type(p).__name__ for p in _postprocs("cuda", "fwd")]
    checked, refused = refused_fused_points(key, every_lane=False)
    assert checked == len(fused_cuda_variants(key))
    assert not refused, refused


@pytest.mark.parametrize("kind,key", [
    ("cuda", NormKey(norm="layernorm", stage="bwd", hidden_size=2048)),
    ("cuda", NormKey(stage="bwd_add", hidden_size=1000, itype="fp16", wtype="fp16", otype="fp16")),
    ("cuda", NormKey(hidden_size=4096)),
    ("cuda", NormKey(norm="layernorm", hidden_size=7168)),
    ("llvm", NormKey(norm="layernorm", stage="bwd", hidden_size=1000, itype="fp32", wtype="fp32", otype="fp32")),
    ("llvm", NormKey(hidden_size=1000, itype="fp32", wtype="fp32", otype="fp32"))],
    ids=lambda v: v if isinstance(v, str) else v.name)
def test_the_search_builds_the_kernels_the_library_runs(kind, key):
    """A candidate, drawn and postprocessed as the search does (tune._postprocs), is the very
    kernel its record's trace (record_trace: no postprocessors) builds in the library, and on
    CUDA the backward draws hoist_inits either way. RewriteReductionBlock once split the inits
    of reductions out of their loops (the dx's running sums, the forward's combine of per-warp
    sums; on llvm every reduction): the search timed kernels the library never ran, and every
    backward candidate with hoist_inits failed to build."""
    from tvmnorm._tvm import IRModule, Schedule, Trace, ms, target, tvm, without_tensor_intrinsics
    from tvmnorm.targets import target_spec
    from tvmnorm.tune import hoist_inits_of, record_trace, space_generator
    part = "fwd" if key.stage == "fwd" else "dx"
    cuda_dx = kind == "cuda" and part == "dx"
    func = tuning_func(key, part, 4096, kind, 32 if cuda_dx else None)
    gen = space_generator(key, kind)
    postprocs = list(gen.postprocs)
    if postprocs:  # initialised for the target, as the search's TuneContext does
        with without_tensor_intrinsics():
            ms.TuneContext(mod=IRModule({"main": func}), target=target(target_spec(kind)), space_generator=gen,
                           task_name=key.name, num_threads=1)
    variants, hoisted = design_spaces(key, kind), set()
    for seed in range(12):
        sch = Schedule(func, seed=seed + 1)
        variants[seed * 7 % len(variants)](sch)
        record = {"parts": {part: record_trace(sch.trace)}}
        replay = Schedule(func)
        Trace.apply_json_to_schedule(record["parts"][part], replay)
        sch.enter_postproc()
        assert all(p.apply(sch) for p in postprocs)
        tvm.ir.assert_structural_equal(sch.mod, replay.mod)
        hoisted.add(hoist_inits_of(record))
        if seed >= 3 and (hoisted == {0, 1} or not cuda_dx):
            break
    assert hoisted == ({0, 1} if cuda_dx else {0})


def test_staged_variants_fit_cp_async_and_shared_memory():
    """The staged fused variants (space.staged_cuda_variants) copy vectors cp.async takes, hold
    their groups in flight within a block's static shared memory and the smallest chunk, and
    sample one chunk lane a block (full chunks or not, as every fused variant); the space holds them with space.STAGED
    (on since the H200 timed them), and wide bf16 rows (7168) have none."""
    from tvmnorm.compute.norms import CUDA_CHUNK_ROWS
    from tvmnorm.sched.rows import STAGED_SHARED_BYTES, staged_shared_bytes
    from tvmnorm.sched.space import STAGED, fused_cuda_variants, fused_lanes, staged_cuda_variants
    assert STAGED
    for key in (NormKey(norm="layernorm", stage="bwd", hidden_size=1024),
                NormKey(stage="bwd_add", itype="fp32", wtype="fp32", otype="fp32", hidden_size=1000)):
        staged = staged_cuda_variants(key)
        assert staged and all(v[5] for v in staged) and not any(v[5] for v in fused_cuda_variants(key, staged=False))
        assert fused_cuda_variants(key) == fused_cuda_variants(key, staged=False) + staged
        size = 4 if key.itype == "fp32" else 2
        for threads, vec, prefetch, stages, _, _ in staged:
            assert vec * size in (4, 8, 16) and stages * prefetch <= min(CUDA_CHUNK_ROWS)
            assert staged_shared_bytes(key.hidden_size, size, prefetch, stages) <= STAGED_SHARED_BYTES
        assert all(fused_lanes(v) == [1] for v in staged)
    assert staged_cuda_variants(NormKey(stage="bwd", hidden_size=7168)) == []


def test_staged_variants_replay_on_symbolic_rows():
    """The space's staged variants replay from their traces onto the symbolic-row kernels a
    library holds, at both index widths, and copy their rows by cp.async."""
    from tvmnorm._tvm import Schedule
    from tvmnorm.sched import space
    key = NormKey(norm="layernorm", stage="bwd", hidden_size=1024)
    variants = space.fused_cuda_variants(key)
    spaces = space_fn(key, "cuda")(Schedule(tuning_func(key, "dx", 2048, "cuda", 32)))
    assert len(spaces) == len(variants) == len(design_spaces(key, "cuda"))
    staged = [sch for sch, v in zip(spaces, variants) if v[5]]
    for sch in staged[:: max(1, len(staged) // 3)]:
        trace = sch.trace.simplified(remove_postproc=True)
        record = {"rows_per_partial": 32, "parts": {"dx": json.loads(json.dumps(trace.as_json(),
                                                                                 default=lambda o: o.value))}}
        funcs = scheduled_funcs(key, "cuda", record, parts=("dx",))
        funcs.update(scheduled_funcs(key, "cuda", record, row_bits=32, parts=("dx",), prefix=narrow_prefix(key)))
        assert generated_cuda(funcs).count("ptx_cp_async_legacy") > 2


def test_fused_space_samples_only_valid_block_sizes():
    """Each fused variant samples only the chunk lanes per block that keep a block within 1024
    threads, and the space's size counts exactly those (7 variants x 5 lanes at hidden 7168
    held 20 invalid points, which MetaSchedule kept sampling to find the 15 valid ones)."""
    from tvmnorm.sched.space import (FULL_CHUNKS, HOIST_INITS, ROWS, STREAM, fused_cuda_variants, fused_rows,
                                     min_blocks_choices, shared_sums_choices, space_size)
    bwd = NormKey(norm="layernorm", stage="bwd", hidden_size=7168)
    variants = fused_cuda_variants(bwd)
    assert all(v[0] * r <= 1024 for v in variants for r in fused_rows(v[0]))
    assert space_size(bwd, "cuda") == sum(len(fused_rows(v[0])) * len(min_blocks_choices(v[0])) * len(FULL_CHUNKS)
                                          * len(HOIST_INITS) * len(shared_sums_choices(bwd, v)) * len(STREAM)
                                          for v in variants)
    assert sum(len(fused_rows(v[0])) for v in variants) < len(variants) * len(ROWS)
    assert fused_rows(1024) == [1] and fused_rows(16) == list(ROWS)
    # an SM holds 2048 threads: a lane of 1024 threads may ask for 2 blocks, of 448 for 4
    assert min_blocks_choices(1024) == [1, 2] and min_blocks_choices(448) == [1, 2, 3, 4]


def test_cuda_dx_is_tuned_at_the_rules_chunk_size_and_its_records():
    """T (rows per dgamma partial) is a compute constant, so the CUDA dx kernel is one tuning
    task per chunk size: by default the default rule's T and the key's record's where that
    differs (tune.key_chunk_sizes); every other part (and llvm) is one task."""
    from argparse import ArgumentTypeError

    from tvmnorm.cli import _chunk_rows
    from tvmnorm.compute.norms import CUDA_CHUNK_ROWS, ROWS_PER_PARTIAL_ATTR, rows_per_partial
    from tvmnorm.tune import _tasks
    bwd, fwd = NormKey(norm="layernorm", stage="bwd", hidden_size=1024), NormKey(hidden_size=1024)
    wide = NormKey(stage="bwd", hidden_size=7168)
    assert (rows_per_partial(bwd, "cuda"), rows_per_partial(wide, "cuda")) == (32, 64)
    funcs, owner = _tasks([bwd, wide, fwd], "cuda", 4097)
    dx = {t: f for t, f in funcs.items() if owner[t][1] == "dx"}
    assert sorted((owner[t][0].hidden_size, int(f.attrs[ROWS_PER_PARTIAL_ATTR])) for t, f in dx.items()) == [(1024, 32), (7168, 64)]
    assert all(owner[t][3] == int(f.attrs[ROWS_PER_PARTIAL_ATTR]) for t, f in dx.items())
    assert [owner[t][3] for t in funcs if owner[t][1] == "fwd"] == [None]
    # a record at another T keeps its own task beside the rule's (its trace is seeded there)
    records = {bwd.pack(): {"rows_per_partial": 16}, wide.pack(): {"rows_per_partial": 64}}
    funcs, owner = _tasks([bwd, wide], "cuda", 4097, records=records)
    assert [(owner[t][0].hidden_size, owner[t][3]) for t in funcs] == [(1024, 32), (1024, 16), (7168, 64)]
    funcs, owner = _tasks([bwd], "llvm", 256, records=records)
    assert [owner[t][3] for t in funcs] == [None]
    # --chunk-rows names them for every key (all: every size the space is built for); a size
    # the space is not built for is refused
    funcs, owner = _tasks([bwd], "cuda", 4097, chunks=[32, 16, 32], records=records)
    assert [owner[t][3] for t in funcs] == [32, 16]
    funcs, owner = _tasks([bwd], "cuda", 4097, chunks=_chunk_rows("all"))
    assert [owner[t][3] for t in funcs] == list(CUDA_CHUNK_ROWS) and _chunk_rows("64, 32") == [64, 32]
    with pytest.raises(ArgumentTypeError, match="'all'"):
        _chunk_rows("some")
    with pytest.raises(ValueError, match="not among"):
        _tasks([bwd], "cuda", 4097, chunks=[48])


class _FakeDatabase:
    """The part of MetaSchedule's database _best_records reads: one measured record per task."""

    class _Record:
        def __init__(self, trace, secs):
            self.trace, self.run_secs = trace, [secs]

    def __init__(self, measured):
        self.measured = measured  # structural hash of the task's module -> (trace, seconds, count)

    @staticmethod
    def _h(mod):
        import tvm_ffi
        return tvm_ffi.structural_hash(mod)

    def has_workload(self, mod):
        return self._h(mod) in self.measured

    def commit_workload(self, mod):
        return mod

    def get_top_k(self, mod, k):
        trace, secs, count = self.measured[self._h(mod)]
        return [self._Record(trace, secs)] * min(k, count)

    def query_tuning_record(self, mod, tgt, workload_name):
        trace, secs, _ = self.measured[self._h(mod)]
        return self._Record(trace, secs)


@pytest.mark.parametrize("fastest", (16, 32, 64))
def test_best_records_keeps_the_fastest_chunk_size(fastest):
    from tvmnorm._tvm import IRModule, target
    from tvmnorm.targets import target_spec
    from tvmnorm.tune import _best_records, _tasks
    key = NormKey(stage="bwd", hidden_size=1024)
    funcs, owner = _tasks([key], "cuda", 4097, chunks=[16, 32, 64])
    measured = {}
    for task, func in funcs.items():
        sch = space_variant(key, "cuda", func)
        secs = 1e-4 if owner[task][3] == fastest else 3e-4
        measured[_FakeDatabase._h(IRModule({"main": func}))] = (sch.trace, secs, {16: 9, 32: 12, 64: 7}[owner[task][3]])
    db = _FakeDatabase(measured)
    (rec,) = _best_records(db, funcs, owner, target(target_spec("cuda")), 32).values()
    assert rec["rows_per_partial"] == fastest and rec["run_us"]["dx"] == pytest.approx(100.0)
    # recovery: a key is taken only when all its tasks have `need`; trials is the fewest any had
    assert _best_records(db, funcs, owner, target(target_spec("cuda")), 32, need=8) == {}
    (rec,) = _best_records(db, funcs, owner, target(target_spec("cuda")), 32, need=7).values()
    assert rec["trials"] == 7 and rec["rows_per_partial"] == fastest
    # the record builds the dx kernel with its T (its trace splits the rows by that T), and the
    # CUDA code compiles
    funcs = scheduled_funcs(key, "cuda", rec)
    from tvmnorm.compute.norms import ROWS_PER_PARTIAL_ATTR
    assert int(funcs[f"{key.name}_dx"].attrs[ROWS_PER_PARTIAL_ATTR]) == fastest
    compile_funcs(funcs, "cuda")


@pytest.mark.parametrize("chunk", (8, 16, 64))
def test_a_record_with_another_chunk_size_serves_right_results(tmp_path, chunk, rng, seed):
    """A record's rows_per_partial reaches the library's manifest and the runtime, which sizes
    the partials by it (llvm here; the path is the same on CUDA): dx, dgamma and dbeta stay
    right around the chunk edges."""
    from tvmnorm._tvm import Schedule
    from tvmnorm.build import build_library
    from tvmnorm.runtime import partials
    key = NormKey(norm="layernorm", stage="bwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=384)
    func = tuning_func(key, "dx", 256, "llvm", chunk)
    (sch,) = space_fn(key, "llvm")(Schedule(func))
    trace = json.loads(json.dumps(sch.trace.simplified(remove_postproc=True).as_json(), default=lambda o: o.value))
    rec = {"key": key.name, "parts": {"dx": trace}, "rows_per_partial": chunk, "trials": 1}
    manifest = build_library([key], "llvm", tmp_path / "lib", records={key.pack(): rec}, log=lambda *_: None)
    assert manifest["kernels"][0]["rows_per_partial"] == chunk
    reg = Registry()
    reg.set_library("llvm", tmp_path / "lib")
    k = reg.get(key, "llvm")
    assert k.tuned and k.chunk_rows == chunk
    assert partials(3 * chunk + 1, key, "llvm", k.chunk_rows) == 4
    for rows in (1, chunk - 1, chunk, chunk + 1, 5 * chunk + 3):
        inputs = make_inputs(key, rows, rng)
        check_outputs(key, inputs, call(k, inputs, rows), f"T={chunk} rows={rows} seed={seed}")


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_a_tuned_forward_serves_small_calls_with_the_default_kernel(tmp_path, norm, rng, seed):
    """A library holds, beside each tuned forward, the default schedule's kernel, and serves
    calls of at most SMALL_CALL_BYTES of x with it (records are tuned at training rows; the
    default was faster at decode rows on the H200): both right, each on its side of the bound."""
    from tvmnorm._tvm import Schedule
    from tvmnorm.runtime import SMALL_CALL_BYTES
    key = NormKey(norm=norm, itype="fp32", wtype="fp32", otype="fp32", hidden_size=384)
    (sch,) = space_fn(key, "llvm")(Schedule(tuning_func(key, "fwd", 256, "llvm")))
    trace = json.loads(json.dumps(sch.trace.simplified(remove_postproc=True).as_json(), default=lambda o: o.value))
    bwd = NormKey(norm=norm, stage="bwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=384)
    manifest = build_library([key, bwd], "llvm", tmp_path / "lib", log=lambda *_: None,
                             records={key.pack(): {"key": key.name, "parts": {"fwd": trace}, "trials": 1}})
    assert f"{key.name}_small_fwd" in manifest["kernels"][0]["symbols"]
    assert not any("small" in s for s in manifest["kernels"][1]["symbols"])  # a default: nothing to add
    reg = Registry()
    reg.set_library("llvm", tmp_path / "lib")
    k = reg.get(key, "llvm")
    bound = SMALL_CALL_BYTES // (384 * 4)  # rows of fp32 x at the bound
    assert k.tuned and k.forward_for(bound) is k._small["fwd"] and k.forward_for(bound + 1) is k._f["fwd"]
    for rows in (1, 3, bound, bound + 1):
        inputs = make_inputs(key, rows, rng)
        check_outputs(key, inputs, call(k, inputs, rows), f"{norm} rows={rows} seed={seed}")


def test_cost_model_trains_with_few_threads(monkeypatch):
    """XGBoost trains on tens of candidates: with a thread per core of a busy host it was 37x
    slower here (300 rounds, 32 threads on 2 loaded cores: 18 s, 2 threads: 0.5 s)."""
    import tvmnorm.tune as tune
    monkeypatch.setattr(tune, "usable_cores", lambda: 32)
    model = tune._cost_model("cuda")
    assert model.config.nthread == 8
    monkeypatch.setattr(tune, "usable_cores", lambda: 2)
    assert tune._cost_model("cuda").config.nthread == 2


def test_tuning_skips_the_tensor_intrinsics_import_and_leaves_it_importable(monkeypatch):
    """MetaSchedule's TuneContext imports tvm.s_tir.tensor_intrin (14 s of TVMScript parsing on
    a 2-core machine) for rules tvmnorm does not use: within without_tensor_intrinsics() the
    import finds an empty module, which is gone afterwards; a module imported before is kept."""
    import sys
    import types

    from tvmnorm._tvm import without_tensor_intrinsics
    name = "tvm.s_tir.tensor_intrin"
    monkeypatch.delitem(sys.modules, name, raising=False)
    with without_tensor_intrinsics():
        import tvm.s_tir.tensor_intrin as inside  # noqa: F401 - what TuneContext does
        assert not hasattr(inside, "cuda")
    assert name not in sys.modules
    real = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, real)
    with without_tensor_intrinsics():
        assert sys.modules[name] is real
    assert sys.modules[name] is real


def test_accept_replaces_a_record_that_lost_to_the_default_with_the_default_schedule():
    """With ``to_default``, a record slower than the default in its library (and with no record
    to fall back on) becomes a record of the default's schedule instead of none; a failed
    refcheck or a retune that leaves the committed record are unchanged."""
    from tvmnorm.tune import accept_records
    keys = {h: NormKey(hidden_size=h) for h in (2048, 4096, 7168)}

    def rec(h, impl, us, status="ok"):
        return {"op": "rmsnorm_fwd", "dtype": "bf16", "hidden": h, "rows": 16384, "impl": impl,
                "us": us, "status": status}
    bench = {"records": [rec(2048, "tvmnorm_tuned", 25.0), rec(2048, "tvmnorm_default", 20.0),
                         rec(4096, "tvmnorm_tuned", 50.0, "wrong"), rec(4096, "tvmnorm_default", 60.0),
                         rec(7168, "tvmnorm_tuned", 175.0), rec(7168, "tvmnorm_default", 120.3)]}
    records = {k.pack(): {"key": k.name, "parts": "tuned"} for k in keys.values()}
    committed = {keys[7168].pack(): {"key": keys[7168].name, "parts": "committed"}}
    seen = []

    def to_default(packed, lost, why):
        seen.append((packed, lost["parts"]))
        return {"key": lost["key"], "parts": "default", "lost_in_library": why}
    kept, dropped = accept_records(records, bench, accepted=committed, to_default=to_default)
    assert kept[keys[2048].pack()] == {"key": keys[2048].name, "parts": "default",
                                       "lost_in_library": dropped[keys[2048].pack()]}
    assert "slower than the default" in dropped[keys[2048].pack()]
    assert keys[4096].pack() not in kept and "wrong" in dropped[keys[4096].pack()]
    assert kept[keys[7168].pack()] == committed[keys[7168].pack()]  # the retune lost; the committed record stays
    assert seen == [(keys[2048].pack(), "tuned")]


@pytest.mark.parametrize("kind", ["llvm", "cuda"])
@pytest.mark.parametrize("key", [NormKey(norm="layernorm", hidden_size=2048), NormKey(stage="bwd", hidden_size=1024)],
                         ids=lambda k: k.name)
def test_default_record_builds_the_default_kernel(key, kind):
    """default_record's traces (the default rule's, taken on the tuning function at the lost
    record's rows, at the default T) build the same kernels as the default schedule itself."""
    from tvmnorm.compute.norms import rows_per_partial
    from tvmnorm.tune import default_record, tune_rows
    part = "fwd" if key.stage == "fwd" else "dx"
    lost = {"key": key.name, "rows": tune_rows(key, kind), "trials": 12, "parts": {part: "a sampled trace"},
            "run_us": {part: 1.0}, "rows_per_partial": 16, "timing": "cold-l2"}
    rec = default_record(key, kind, lost, "slower than the default at 16384 rows (2.0 vs 1.0 us)")
    assert rec["default_won"] == [part] and rec["trials"] == 12 and "run_us" not in rec
    assert rec["lost_in_library"].startswith("slower than the default")
    assert rec.get("rows_per_partial") == (rows_per_partial(key, kind) if part == "dx" else None)

    def source(funcs):
        mod = compile_funcs(funcs, kind).mod
        # llvm's IR names objects by their addresses in this process
        return mod.imports[0].inspect_source() if kind == "cuda" else re.sub(r"0x[0-9a-f]+", "", mod.inspect_source("ll"))
    assert source(scheduled_funcs(key, kind, rec)) == source(scheduled_funcs(key, kind))


@pytest.mark.slow
def test_cuda_library_in_several_translation_units_links_and_loads(tmp_path):
    """A CUDA library is compiled as several .cu files at once (cuda_aot: nvcc is one core per
    unit) and linked into one .so: every symbol of the manifest loads, with tvm_ffi alone, and
    the library context tvm-ffi fills in is defined once."""
    import shutil
    import subprocess
    from tvmnorm._tvm import load_module
    from tvmnorm.cuda_aot import unit_sources
    if not has_nvcc():
        pytest.skip("nvcc not installed")
    keys = [NormKey(hidden_size=1024), NormKey(norm="layernorm", stage="bwd", hidden_size=1000),
            NormKey(otype="fp8e4m3", hidden_size=4096)]
    funcs = {name: f for key in keys for name, f in key_funcs(key, "cuda").items()}
    sources = unit_sources(funcs, "sm_90", 3)
    assert len(funcs) == 15 and len(sources) == 3  # at least 5 kernels a unit
    assert [s.count("void* __tvm_ffi__library_ctx = NULL;") for s in sources] == [1, 0, 0]
    manifest = build_library(keys, "cuda", tmp_path / "lib", log=lambda *_: None, jobs=3)
    so = tmp_path / "lib" / "libtvmnorm.so"
    mod = load_module(str(so))
    symbols = [s for e in manifest["kernels"] for s in e["symbols"]]
    assert sorted(symbols) == sorted(funcs) and all(mod.implements_function(s) for s in symbols)
    nm = shutil.which("nm")
    if nm:
        defined = subprocess.run([nm, "-D", "--defined-only", str(so)], capture_output=True, text=True).stdout
        assert defined.count("__tvm_ffi__library_ctx") == 1


def test_default_trace_is_known_by_its_instructions():
    """The search's default_won label and the recovery's count of measured candidates compare a
    record with the task's default trace itself: a point of an older space that samples nothing
    (the thirteenth lease's warp_sums records, rows a plain 1) is not the default, though the
    fallback test (no sampled decision) would take it for it."""
    from tvmnorm._tvm import Schedule
    from tvmnorm.sched.default import default_schedule
    from tvmnorm.sched.rows import CudaRowConfig, schedule_rows_cuda
    from tvmnorm.tune import default_trace, is_default_trace
    key = NormKey(hidden_size=4096)
    func = tuning_func(key, "fwd", 2048, "cuda")
    default = default_trace(func, key, "fwd", "cuda")
    assert is_default_trace(default_schedule(func, "fwd", "cuda", 2).trace, default)
    warp = schedule_rows_cuda(None, CudaRowConfig(threads=128, rows=1, vec=8, keep_row=True, warp_sums=True),
                              sch=Schedule(func))
    assert is_default_trace(warp.trace) and not is_default_trace(warp.trace, default)


L29_BWD = REPO / "tuning_logs/cuda-sm_90/run-2026-12-02-l29-bwd"


def _measured_candidates(run: pathlib.Path, tmp: pathlib.Path, workloads=None) -> list:
    """The candidates of a committed tuning database, replayed on their workloads (~0.07 s each
    on the 2-core CI machine, and loading the database ~40 ms a record): per task (those of the
    database's ``workloads`` indices, or all), its module and a list of (MeasureCandidate, mean
    seconds)."""
    import gzip
    from tvmnorm._tvm import ms, s_tir
    for name in ("database_tuning_record", "database_workload"):
        with gzip.open(run / f"{name}.json.gz", "rt") as f, open(tmp / f"{name}.json", "w") as g:
            # a record's line starts with its workload's index: [i,[trace, run_secs, target, args]]
            g.writelines(ln for ln in f if name == "database_workload" or workloads is None
                         or json.loads(ln)[0] in workloads)
    db = ms.database.JSONDatabase(path_workload=str(tmp / "database_workload.json"),
                                  path_tuning_record=str(tmp / "database_tuning_record.json"))
    by_task: dict = {}
    for rec in db.get_all_tuning_records():
        secs = [float(s) for s in rec.run_secs or []]
        if not secs or max(secs) >= 1e9:  # a failed build or run
            continue
        sch = s_tir.Schedule(rec.workload.mod)
        rec.trace.apply_to_schedule(sch, remove_postproc=False)
        by_task.setdefault(str(rec.workload.mod), (rec.workload.mod, []))[1].append(
            (ms.MeasureCandidate(sch, rec.args_info), statistics.mean(secs)))
    return list(by_task.values())


def _rank_correlation(a, b) -> float:
    import numpy as np
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


@pytest.mark.slow
def test_the_cost_model_ranks_held_out_h200_candidates(tmp_path):
    """The search's XGBoost model, trained on half of the measured candidates of each backward
    task tuned on the H200 in the twenty-ninth lease, ranks the other half the right way round,
    with the fastest (within 2%) among its top 8 in every task; at MetaSchedule's default
    learning rate it ranked them backwards (tune.COST_MODEL_ETA says why), so the search
    measured its worst guesses first. Both learning rates in one test: the candidates are
    replayed, and their features extracted, once (~50 s on the 2-core CI machine; the features
    took 20 s a pass)."""
    tasks = _measured_candidates(L29_BWD, tmp_path)
    assert len(tasks) == 8 and all(len(t) >= 40 for _, t in tasks)
    from tvmnorm import tune
    features: dict = {}
    correlations, best_in_top8 = _held_out_ranking(tasks, tune.COST_MODEL_ETA, features)
    assert statistics.mean(correlations) > 0.4 and statistics.mean(best_in_top8) > 0.98, (correlations, best_in_top8)
    correlations, _ = _held_out_ranking(tasks, 0.2, features)  # MetaSchedule's default
    assert statistics.mean(correlations) < 0, correlations


class _KeptFeatures:
    """A feature extractor that extracts each list of candidates once (``kept``: the candidates'
    objects -> features, shared by the models of one test; a candidate is of one task). The
    model gets the candidates back through the FFI, in new Python wrappers of the same objects."""

    def __init__(self, extractor, kept: dict):
        self.extractor, self.kept = extractor, kept

    def extract_from(self, context, candidates):
        key = tuple(c.__chandle__() for c in candidates)
        if key not in self.kept:
            self.kept[key] = self.extractor.extract_from(context, candidates)
        return self.kept[key]


def _held_out_ranking(tasks, eta: float, features: dict):
    """Per task, the rank correlation of the model's scores with the held-out half's speed,
    and how close the fastest of its top 8 comes to the fastest of that half."""
    import random
    from unittest import mock
    import numpy as np
    from tvmnorm import tune
    from tvmnorm._tvm import cuda_tune_context, ms
    with mock.patch.object(tune, "COST_MODEL_ETA", eta):
        model = tune._cost_model("llvm")
    model.extractor = _KeptFeatures(model.extractor, features)
    rng, held_out = random.Random(0), []
    for mod, measured in tasks:
        # one context a task, as in the search: the model scales each task's times by its best
        ctx = cuda_tune_context(mod)
        t = rng.sample(measured, len(measured))
        train, test = t[: len(t) // 2], t[len(t) // 2:]
        model.update(ctx, [c for c, _ in train], [ms.runner.RunnerResult([s], None) for _, s in train])
        held_out.append((ctx, test))
    correlations, best_in_top8 = [], []
    for ctx, test in held_out:
        score = np.array(model.predict(ctx, [c for c, _ in test]))  # higher: predicted faster
        secs = np.array([s for _, s in test])
        correlations.append(_rank_correlation(score, -secs))
        best_in_top8.append(secs.min() / secs[np.argsort(-score)[:8]].min())
    return correlations, best_in_top8


def test_the_cost_model_ranks_after_one_round(tmp_path):
    """After one round of measured candidates (tune.COST_MODEL_WARMUP), the model's scores are
    its own, not MetaSchedule's random warm-up scores (those came for the first 100 candidates
    of a session: a one-key retune never used the model)."""
    import numpy as np
    from tvmnorm import tune
    from tvmnorm._tvm import cuda_tune_context, ms
    model = tune._cost_model("llvm")
    ((mod, measured),) = _measured_candidates(L29_BWD, tmp_path, workloads={0})
    ctx = cuda_tune_context(mod)
    train, test = measured[:tune.COST_MODEL_WARMUP], measured[tune.COST_MODEL_WARMUP:]
    model.update(ctx, [c for c, _ in train], [ms.runner.RunnerResult([s], None) for _, s in train])
    first = np.array(model.predict(ctx, [c for c, _ in test]))
    assert np.array_equal(first, np.array(model.predict(ctx, [c for c, _ in test])))
    assert len(set(first.tolist())) > 1


@pytest.mark.parametrize("knob", ["hoist_inits", "shared_sums"])
def test_with_knob_sets_the_knob_of_a_record_tuned_with_or_before_it(knob):
    """tune.with_knob (scripts/knob_ab.py): a record tuned before the knob gets its dx walk
    annotated, a sampled one its decision drawn again; either builds the kernel with the knob
    (hoist_inits: running sums zeroed before the walk; shared_sums: kept in shared memory), and
    0 the one without. The committed records that took a knob say what the GPU measured with
    and without."""
    from conftest import generated_cuda
    from tvmnorm._tvm import Schedule
    from tvmnorm.sched.space import cuda_space, fused_cuda_variants
    from tvmnorm.tune import knob_of, load_records, record_trace, tuning_func, with_knob
    zeroed_in_walk = re.compile(r"== \(?(int64_t)?\)?0\)+ \{\s*part_local(_shared)?_ptr")

    def shows_knob(key, record):
        src = generated_cuda(scheduled_funcs(key, "cuda", record, parts=["dx"]))
        return not zeroed_in_walk.search(src) if knob == "hoist_inits" else "part_local_shared_ptr" in src
    key = NormKey(norm="layernorm", stage="bwd", hidden_size=1024)
    sch = Schedule(tuning_func(key, "dx", 2048, "cuda", 32))
    cuda_space(key, fused=fused_cuda_variants(key)[0])(sch)
    sampled = {"parts": {"dx": record_trace(sch.trace)}, "rows_per_partial": 32}
    for value in (1, 0, 1):
        sampled = with_knob(sampled, knob, value)
        assert knob_of(sampled, knob) == value and shows_knob(key, sampled) == (value == 1)
    committed = load_records("cuda")
    adopted = {k: r for k, r in committed.items() if f"{knob}_ab" in r}
    # four committed records hold hoist_inits from the thirty-sixth lease's A/B; none shared_sums
    # (h200-run50)
    assert len(adopted) == {"hoist_inits": 4, "shared_sums": 0}[knob]
    assert all(knob_of(r, knob) == 1 for r in adopted.values())
    assert all(max(r[f"{knob}_ab"]["on_us"]) < min(r[f"{knob}_ab"]["off_us"]) for r in adopted.values())
    key = NormKey(norm="layernorm", stage="bwd", hidden_size={"hoist_inits": 8192, "shared_sums": 7168}[knob])
    old = committed[key.pack()]
    assert f"{knob}_ab" not in old and knob_of(old, knob) == 0
    assert knob_of(with_knob(old, knob), knob) == 1 and knob_of(with_knob(with_knob(old, knob), knob, 0), knob) == 0
    assert shows_knob(key, with_knob(old, knob))
    if knob == "shared_sums":  # a staged record's rows fill the shared memory that a launch without opt-in has
        staged = NormKey(norm="layernorm", stage="bwd", itype="fp16", wtype="fp16", otype="fp16", hidden_size=4096)
        with pytest.raises(ValueError, match="shared_sums takes 32768 bytes of dynamic shared memory beside 33792"):
            shows_knob(staged, with_knob(committed[staged.pack()], knob))
    with pytest.raises(ValueError, match=f"{knob} must be 0 or 1"):
        with_knob(old, knob, 2)
    with pytest.raises(ValueError, match="unknown dx knob"):
        with_knob(old, "stream")


def test_tune_with_a_failed_batch_says_so_and_exits_nonzero(tmp_path, monkeypatch, capsys):
    """A batch that fails is printed and the others go on; the run ends with status 1 and names
    the keys that failed (they stay due), after saving the others' records: a script must not take
    a run whose keys fell back to the default schedule for a tuned one."""
    import argparse
    from tvmnorm import tune
    keys = [NormKey(hidden_size=h, itype="fp32", wtype="fp32", otype="fp32") for h in (384, 512)]
    monkeypatch.setattr(tune, "preflight", lambda key, kind, rows: (1.0, None))

    def tune_batch(group, kind, *a, **kw):
        if group[0].hidden_size == 384:
            raise RuntimeError("broken on purpose")
        return {k.pack(): {"parts": {}, "trials": 2} for k in group}
    monkeypatch.setattr(tune, "tune_batch", tune_batch)
    args = argparse.Namespace(target="llvm", logs=str(tmp_path / "logs"), rows=256, chunk_rows=None,
                              schedules=str(tmp_path / "sch"), trials=2, min_trials=None, recover_only=False,
                              batch=1, time_limit=None, key_seconds=None, seed=1, build_workers=1,
                              overlap_builds=False, no_build=True)
    with pytest.raises(SystemExit) as stop:
        tune.tune_main(args, keys, None)
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "failed: broken on purpose" in err
    assert re.search(rf"tuned 1 keys in \d+ s.*; 1 of 2 failed \(above\) and stay due: {keys[0].name}", err), err
    saved = json.loads(next((tmp_path / "sch").glob("llvm-*.json")).read_text())["records"]
    assert {int(k, 16) for k in saved} == {keys[1].pack()}


def test_sweep_chunk_rows_keeps_the_fastest_t_by_its_measure(capsys):
    """tune.sweep_records (tvmnorm tune --sweep-chunk-rows): each CUDA backward (and
    backward-with-add) record's dx is timed at every SWEEP_CHUNK_ROWS T besides its own and keeps the fastest where it beats its
    own by more than SWEEP_SLACK; the times go into the record, a size that fails is recorded as
    such and the others still count, forward keys and keys without a record are passed over,
    and the committed records are not changed in place."""
    from tvmnorm.build import chunk_rows_of
    from tvmnorm.tune import SWEEP_CHUNK_ROWS, SWEEP_SLACK, sweep_chunk_rows, sweep_records
    records = load_records("cuda")
    ln, rms = (NormKey(norm=n, stage="bwd", hidden_size=h) for n, h in (("layernorm", 2560), ("rmsnorm", 5120)))
    add = NormKey(stage="bwd_add", hidden_size=2560)
    before = json.dumps(records, sort_keys=True)
    own = {k: records[k.pack()]["rows_per_partial"] for k in (ln, rms, add)}
    # layernorm: another T is 10% faster than its own; rmsnorm: the best other is within the slack
    fast = next(t for t in (56, 24) if t != own[ln])
    near = next(t for t in (24, 56) if t != own[rms])
    table = {ln: {own[ln]: 100.0, fast: 90.0}, rms: {own[rms]: 100.0, near: 100.0 * (1 - SWEEP_SLACK / 2)},
             add: {own[add]: 100.0, 40: 80.0}}

    def measure(key, record):
        t = record["rows_per_partial"]
        if t == 16:
            raise RuntimeError("no such kernel")
        return table[key].get(t, 150.0)

    saved = []
    swept = sweep_records([ln, rms, NormKey(hidden_size=2560), NormKey(stage="fwd_add", hidden_size=2560), add,
                           NormKey(stage="bwd", hidden_size=12345)],
                          records, "cuda", measure=measure, save=lambda out: saved.append(sorted(out)))
    assert set(swept) == {ln.pack(), rms.pack(), add.pack()}
    # saved after each key swept, so that a sweep cut off keeps what it timed
    assert saved == [sorted([ln.pack()]), sorted([ln.pack(), rms.pack()]), sorted([ln.pack(), rms.pack(), add.pack()])]
    # and, run again over what it saved, passes over the keys swept already (a resume)
    timed = []
    again = sweep_records([ln, rms, add], {**records, ln.pack(): swept[ln.pack()]}, "cuda",
                          measure=lambda k, r: timed.append(k) or measure(k, r))
    assert set(again) == {rms.pack(), add.pack()} and ln not in timed
    # unless asked to sweep them again, from the T they hold
    redone = sweep_records([ln], {**records, ln.pack(): swept[ln.pack()]}, "cuda", measure=measure, again=True)
    assert set(redone) == {ln.pack()} and redone[ln.pack()]["rows_per_partial"] == fast
    assert swept[add.pack()]["rows_per_partial"] == 40
    assert chunk_rows_of(scheduled_funcs(add, "cuda", swept[add.pack()], parts=["dx"])) == 40
    assert swept[ln.pack()]["rows_per_partial"] == fast
    assert chunk_rows_of(scheduled_funcs(ln, "cuda", swept[ln.pack()], parts=["dx"])) == fast
    assert swept[rms.pack()]["rows_per_partial"] == own[rms]
    sweep = swept[ln.pack()]["chunk_rows_sweep"]
    assert set(sweep) == {str(t) for t in SWEEP_CHUNK_ROWS} | {str(own[ln])} and sweep["16"] is None
    err = capsys.readouterr().err
    assert f"T {own[ln]} -> {fast}" in err and f"chunk sweep {ln.name}: swept already (T {fast})" in err
    assert json.dumps(records, sort_keys=True) == before, "the committed records were changed in place"
    assert sweep_records([ln], records, "cuda", measure=lambda k, r: 1 / 0) == {}
    assert f"kept T {own[ln]}" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="its record.s own dx"):
        sweep_chunk_rows(ln, records[ln.pack()], measure=lambda r: 1 / 0 if r["rows_per_partial"] == own[ln] else 1.0)
    with pytest.raises(ValueError, match="for the CUDA backward"):
        sweep_chunk_rows(ln, records[ln.pack()], "llvm", measure=lambda r: 1.0)


def test_sweep_chunk_rows_is_refused_off_cuda(tmp_path):
    r = tvmnorm("tune", "--target", "llvm", "--hidden", "384", "--dtypes", "fp32", "--stages", "bwd", "--norms",
                "rmsnorm", "--schedules", str(tmp_path / "sch"), "--logs", str(tmp_path / "logs"), "--sweep-chunk-rows")
    assert r.returncode != 0 and "--sweep-chunk-rows is for the CUDA backward" in r.stderr
    r = tvmnorm("tune", "--target", "cuda", "--hidden", "384", "--stages", "bwd", "--norms", "rmsnorm",
                "--schedules", str(tmp_path / "sch"), "--logs", str(tmp_path / "logs"), "--sweep-again")
    assert r.returncode != 0 and "--sweep-again goes with --sweep-chunk-rows" in r.stderr
    assert not (tmp_path / "logs").exists()


def test_sweep_chunk_rows_is_refused_before_the_search_without_a_gpu(tmp_path):
    """Without a CUDA device torch can run kernels on, --sweep-chunk-rows stops before the search
    (which would compile every T and then keep each for want of a GPU), saying why, and leaves
    no tuning logs."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the sweep can run")
    r = tvmnorm("tune", "--target", "cuda", "--hidden", "2560", "--dtypes", "bf16", "--stages", "bwd_add", "--norms",
                "rmsnorm", "--trials", "1", "--schedules", str(tmp_path / "sch"), "--logs", str(tmp_path / "logs"),
                "--sweep-chunk-rows")
    assert r.returncode != 0 and "times the kernels on a CUDA GPU through torch: torch sees no CUDA device" in r.stderr
    assert not (tmp_path / "logs").exists()


def test_dx_finalize_kernels_compile_a_records_dx_at_another_t_alone(cuda_builds):
    """tune.dx_finalize_kernels (what the chunk sweep and bench/bwd_parts.py --record-t time):
    the narrow dx and finalize of a record at another T, compiled by themselves as a library's
    kernels are (nvcc, not NVRTC), a backward's and a backward-with-add's; dx_call_us times
    backward stages only and says so."""
    from tvmnorm.tune import dx_call_us, dx_finalize_kernels, with_chunk_rows
    key = NormKey(norm="layernorm", stage="bwd", hidden_size=2560)
    with pytest.raises(ValueError, match="backward's dx and finalize; got stage 'fwd_add'"):
        dx_call_us(NormKey(norm="layernorm", stage="fwd_add", hidden_size=2560), {})
    if not has_nvcc():
        pytest.skip("nvcc not on PATH")
    built = cuda_builds
    for k in (key, NormKey(stage="bwd_add", hidden_size=2560)):
        pairs = dx_finalize_kernels(k, [with_chunk_rows(load_records("cuda")[k.pack()], 40)])
        assert len(pairs) == 1 and len(pairs[0]) == 2
    assert built == [sorted([f"r0_{narrow_prefix(k)}_dx", f"r0_{k.name}_finalize"])
                     for k in (key, NormKey(stage="bwd_add", hidden_size=2560))]


def test_dx_finalize_kernels_build_a_sweeps_records_together(monkeypatch, cuda_builds):
    """The chunk sweep's records (one key at several T) compile into one library (nvcc's units in
    parallel, not a build per T), each record's pair under its own symbols; a record whose trace
    does not replay gets its exception in its place; where the joint library fails to build,
    each record is built alone, so one bad record costs only itself."""
    from tvmnorm.tune import dx_finalize_kernels, with_chunk_rows
    if not has_nvcc():
        pytest.skip("nvcc not on PATH")
    import tvmnorm.cuda_aot as cuda_aot
    key = NormKey(stage="bwd_add", hidden_size=2560)
    record = load_records("cuda")[key.pack()]
    broken = dict(record, parts={"dx": [[["NoSuchInstruction", []]]]})
    built, build = cuda_builds, cuda_aot.build_cuda_library
    pairs = dx_finalize_kernels(key, [with_chunk_rows(record, 24), broken, with_chunk_rows(record, 48)])
    assert len(built) == 1 and [n.split("_")[0] for n in built[0]] == ["r0", "r0", "r2", "r2"]
    assert isinstance(pairs[1], Exception) and all(len(pairs[i]) == 2 for i in (0, 2))
    assert pairs[0][0] is not pairs[2][0]

    def fail_for_the_third(funcs, *a, **kw):  # the joint build fails, and then the third record's alone
        if len(built) in (0, 3):
            built.append(sorted(funcs))
            raise RuntimeError("nvcc failed")
        return build(funcs, *a, **kw)  # cuda_builds' spy, which records the call
    built.clear()
    monkeypatch.setattr(cuda_aot, "build_cuda_library", fail_for_the_third)
    pairs = dx_finalize_kernels(key, [with_chunk_rows(record, t) for t in (24, 32, 40)])
    assert len(built) == 4, "the joint build, then each record alone"
    assert [type(p).__name__ for p in pairs] == ["tuple", "tuple", "RuntimeError"]


def test_sweep_chunk_rows_builds_the_sizes_a_record_takes_and_times_each(monkeypatch):
    """sweep_chunk_rows's own measure: the sizes the record can take built as one library
    (dx_finalize_kernels) and each timed with its pair (dx_call_us, faked here: no GPU); a size
    past the int32 kernels' index slack is recorded as failed, not the end of the sweep."""
    from tvmnorm import tune
    if not has_nvcc():
        pytest.skip("nvcc not on PATH")
    key = NormKey(stage="bwd", hidden_size=1024)
    record = load_records("cuda")[key.pack()]
    built, timed = [], {}
    build = tune.dx_finalize_kernels
    monkeypatch.setattr(tune, "dx_finalize_kernels", lambda k, rs: built.append([r["rows_per_partial"] for r in rs])
                        or build(k, rs))
    monkeypatch.setattr(tune, "dx_call_us", lambda k, r, kernels=None: timed.setdefault(r["rows_per_partial"],
                        (len(kernels), 100.0 - r["rows_per_partial"]))[1])
    swept = tune.sweep_chunk_rows(key, record, sizes=(24, 48, 96))
    own = record["rows_per_partial"]
    assert built == [list(dict.fromkeys([own, 24, 48]))]
    assert all(n == 2 for n, _ in timed.values()) and set(timed) == {own, 24, 48}
    assert swept["chunk_rows_sweep"]["96"] is None and swept["rows_per_partial"] == 48


def test_a_sweep_cut_off_keeps_the_keys_it_swept_and_resumes_past_them(tmp_path, monkeypatch, capsys):
    """tvmnorm tune --sweep-chunk-rows writes each key's swept record as it goes: cut off after
    the first key (a lease's call limit killed lease 85's sweeps before any record was written),
    the schedules file holds that key's sweep, and the run again times only the keys after it."""
    import argparse
    import shutil
    from tvmnorm import tune
    keys = [NormKey(norm=n, stage="bwd", hidden_size=2560) for n in ("rmsnorm", "layernorm")]
    sch = tmp_path / "sch"
    sch.mkdir()
    shutil.copy(tune.schedules_path("cuda"), sch)
    monkeypatch.setattr(tune, "_torch_cuda_missing", lambda: "")
    swept = []

    def sweep(key, record, kind, measure=None):
        if key == keys[1] and not getattr(sweep, "resumed", False):
            raise KeyboardInterrupt  # the call's limit, mid-sweep
        swept.append(key)
        return dict(tune.with_chunk_rows(record, 32), chunk_rows_sweep={"32": 1.0})
    monkeypatch.setattr(tune, "sweep_chunk_rows", sweep)
    args = argparse.Namespace(target="cuda", logs=str(tmp_path / "logs"), rows=None, chunk_rows=None,
                              schedules=str(sch), trials=1, min_trials=None, recover_only=False, batch=1,
                              time_limit=None, key_seconds=None, seed=1, build_workers=1, overlap_builds=False,
                              no_build=True, sweep_chunk_rows=True)
    with pytest.raises(KeyboardInterrupt):
        tune.tune_main(args, keys, None)
    saved = tune.read_records(tune.schedules_path("cuda", sch))
    assert saved[keys[0].pack()]["rows_per_partial"] == 32 and "chunk_rows_sweep" in saved[keys[0].pack()]
    assert "chunk_rows_sweep" not in saved[keys[1].pack()]
    sweep.resumed = True
    tune.tune_main(args, keys, None)
    assert swept == keys, "the resumed run swept the first key again"
    saved = tune.read_records(tune.schedules_path("cuda", sch))
    assert all(saved[k.pack()]["rows_per_partial"] == 32 for k in keys)
    assert f"chunk sweep {keys[0].name}: swept already" in capsys.readouterr().err
