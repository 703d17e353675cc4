"""`tvmnorm tune`: MetaSchedule over tvmnorm's design space, one task per key and row kernel.

tuning_logs/<target-arch>/ holds the raw MetaSchedule database (workload + tuning records, JSON,
appended as candidates are measured). After each batch of keys the best record's trace per key is
written to schedules/<target-arch>.json (committed data), atomically. A rerun skips keys that are
done and recovers from the database the keys an interrupted run had finished measuring.
Candidates are compiled in forked workers and timed in this process (measure.py): MetaSchedule's
default LocalBuilder/LocalRunner start fresh Pythons that spend 45-90 s importing TVM.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile
import time

from .key import NormKey
from .targets import target_name, target_spec

REPO = pathlib.Path(__file__).resolve().parent.parent
TUNE_ROWS = {"cuda": 16384, "llvm": 1024}


def schedules_path(kind: str, root=None) -> pathlib.Path:
    return pathlib.Path(root or REPO / "schedules") / f"{target_name(kind)}.json"


def load_records(kind: str, root=None) -> dict:
    """packed key -> record, from schedules/<target-arch>.json (empty when there is none)."""
    path = schedules_path(kind, root)
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {int(k, 16): v for k, v in data.get("records", {}).items()}


def save_records(kind: str, records: dict, root=None) -> None:
    from ._tvm import FFI_VERSION, TVM_VERSION
    path = schedules_path(kind, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"target": target_spec(kind), "tvm_version": TVM_VERSION, "ffi_version": FFI_VERSION,
            "records": {f"{k:#x}": v for k, v in sorted(records.items())}}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".schedules-")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def tuning_func(key: NormKey, part: str, rows: int, kind: str):
    """The static-row PrimFunc MetaSchedule measures (eps bound to a constant: the measuring
    harness only fills tensor arguments)."""
    from . import compute
    func = compute.kernel_funcs(key, kind, rows=rows)[part]
    eps = [p for p in func.params if p.name == "eps"]
    if eps:
        func = func.specialize({eps[0]: 1e-6})
    return func.with_attr("global_symbol", "main")


def _bar(i, n, t0, label):
    done = i / n if n else 1
    el = time.time() - t0
    eta = el / done - el if done else 0
    fill = int(30 * done)
    sys.stderr.write(f"\r[{'#' * fill}{'.' * (30 - fill)}] {i}/{n} {el:5.0f}s eta {eta:5.0f}s  {label[:60]:60s}")
    sys.stderr.flush()


def _postprocs(kind):
    from ._tvm import ms
    if kind == "cuda":
        return [ms.postproc.RewriteReductionBlock(), ms.postproc.VerifyGPUCode()]
    return [ms.postproc.RewriteParallelVectorizeUnroll(), ms.postproc.RewriteReductionBlock()]


def tune_batch(keys, kind: str, trials: int, logs: pathlib.Path, rows: int, seed: int = 1,
               workers: int | None = None) -> dict:
    """Tune the row kernels of several keys in one MetaSchedule session (its start-up, about
    30 s of importing tensor intrinsics, is paid once per batch). Returns packed key -> record."""
    from ._tvm import IRModule, ms, target
    from .measure import InProcessBuilder, InProcessRunner
    from .sched.space import space_fn
    tgt = target(target_spec(kind))
    funcs, owner = _tasks(keys, rows, kind)
    spaces = {task: ms.space_generator.ScheduleFn(space_fn(owner[task][0], kind), sch_rules=[],
                                                  postprocs=_postprocs(kind), mutator_probs={})
              for task in funcs}
    work = logs / target_name(kind)
    work.mkdir(parents=True, exist_ok=True)
    db = ms.tune_tir(IRModule(funcs), tgt, str(work), max_trials_global=trials * len(funcs),
                     max_trials_per_task=trials, num_trials_per_iter=min(trials, 16),
                     space="post-order-apply", special_space=spaces,
                     builder=InProcessBuilder(kind, workers=workers), runner=InProcessRunner(kind),
                     cost_model="xgb", strategy="evolutionary", seed=seed, num_tuning_cores=1)
    return _best_records(db, funcs, owner, tgt, trials, rows)


def _best_records(db, funcs, owner, tgt, trials, rows, need=0) -> dict:
    """packed key -> record from the database's best measured candidate per task. With ``need``,
    only keys whose every task has at least that many measured candidates are returned."""
    from ._tvm import IRModule
    records, short = {}, set()
    for task, func in funcs.items():
        key, part = owner[task]
        mod = IRModule({"main": func})
        if need and (not db.has_workload(mod) or len(db.get_top_k(db.commit_workload(mod), need)) < need):
            short.add(key.pack())
            continue
        rec = db.query_tuning_record(mod, tgt, workload_name="main")
        if rec is None or not rec.run_secs:
            if not need:
                print(f"\nno valid schedule found for {task}; it keeps the default", file=sys.stderr)
            short.add(key.pack())
            continue
        r = records.setdefault(key.pack(), {"key": key.name, "describe": key.describe(), "rows": rows,
                                            "trials": trials, "parts": {}, "run_us": {}})
        r["parts"][part] = json.loads(json.dumps(rec.trace.as_json(remove_postproc=True),
                                                 default=lambda o: o.value))
        r["run_us"][part] = 1e6 * min(float(x) for x in rec.run_secs)
    if need:  # recovery is all or nothing per key
        records = {k: v for k, v in records.items() if k not in short}
    return records


def _tasks(keys, rows, kind):
    """task name -> static-row PrimFunc, and task name -> (key, part), for the tuned parts."""
    from .compute.norms import parts_of
    from .sched.space import TUNED_PARTS
    funcs, owner = {}, {}
    for key in keys:
        for part in [p for p in parts_of(key) if p in TUNED_PARTS]:
            task = f"{key.name}_{part}"
            funcs[task], owner[task] = tuning_func(key, part, rows, kind), (key, part)
    return funcs, owner


def recover_records(keys, kind: str, trials: int, logs: pathlib.Path, rows: int) -> dict:
    """Records for keys an interrupted run finished measuring but never wrote to schedules/:
    every task of the key has ``trials`` candidates in the database."""
    from ._tvm import ms, target
    work = logs / target_name(kind)
    if not (work / "database_tuning_record.json").exists():
        return {}
    db = ms.database.JSONDatabase(work_dir=str(work))
    funcs, owner = _tasks(keys, rows, kind)
    return _best_records(db, funcs, owner, target(target_spec(kind)), trials, rows, need=trials)


def tune_main(args, keys) -> None:
    kind = args.target
    logs = pathlib.Path(args.logs)
    rows = args.rows or TUNE_ROWS[kind]
    records = load_records(kind, args.schedules)
    todo = [k for k in keys if records.get(k.pack(), {}).get("trials", 0) < args.trials]
    recovered = recover_records(todo, kind, args.trials, logs, rows) if todo else {}
    if recovered:
        records.update(recovered)
        save_records(kind, records, args.schedules)
        todo = [k for k in todo if k.pack() not in recovered]
        print(f"recovered {len(recovered)} keys measured by an interrupted run from {logs}", file=sys.stderr)
    print(f"tuning {len(todo)} of {len(keys)} keys on {target_name(kind)} ({len(keys) - len(todo)} already "
          f"tuned), {args.trials} trials each, rows={rows}", file=sys.stderr)
    t0 = time.time()
    batch = max(1, args.batch)
    for i in range(0, len(todo), batch):
        group = todo[i:i + batch]
        _bar(i, len(todo), t0, ", ".join(k.name for k in group))
        try:
            found = tune_batch(group, kind, args.trials, logs, rows, args.seed, args.build_workers)
        except Exception as e:  # noqa: BLE001 - one batch's failure must not lose the others
            print(f"\ntuning {[k.name for k in group]} failed: {e}", file=sys.stderr)
            continue
        records.update(found)
        save_records(kind, records, args.schedules)  # after every batch: an interrupt loses little
    _bar(len(todo), len(todo), t0, "done")
    print(file=sys.stderr)
    if not args.no_build:
        from .build import build_library
        from .runtime import DEFAULT_LIBRARY_ROOT
        out = pathlib.Path(args.out) if args.out else DEFAULT_LIBRARY_ROOT / kind
        build_library(keys, kind, out, records=records)
