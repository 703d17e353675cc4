"""`tvmnorm tune`: MetaSchedule over tvmnorm's design space, one task per key and row kernel.

tuning_logs/<target-arch>/ holds the raw MetaSchedule database (workload + tuning records, JSON,
appended as candidates are measured). After each batch of keys the best record's trace per key is
written to schedules/<target-arch>.json (committed data), atomically. A rerun skips keys that are
done and recovers from the database the keys an interrupted run had finished measuring.
Candidates are compiled in forked workers and timed in this process (measure.py): MetaSchedule's
default LocalBuilder/LocalRunner start fresh Pythons that spend 45-90 s importing TVM.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

from .key import DTYPE_BYTES, NormKey
from .targets import target_name, target_spec, usable_cores

REPO = pathlib.Path(__file__).resolve().parent.parent
TUNE_ROWS = {"llvm": 1024}


def tune_rows(key: NormKey, kind: str, override: int | None = None) -> int:
    """The static row count a key is tuned at. Any works for the kernel (its rows are
    symbolic); it only decides what the measurements see.

    On CUDA it is the catalog's training rows for the key's hidden size (16384 tokens, times the
    heads for QK-norm: the row count the issue's targets and the bench measure), each call timed
    cold (measure.InProcessRunner flushes the L2 first). Until the fifth lease keys were tuned
    warm at >= 256 MB of input, a steady state that 16384 tokens never reach at hidden <= 4096
    (32 MB at 1024): the winners there could lose to 1-row-per-block schedules (Liger's) at
    the bench's size, e.g. layernorm fwd 2048, 0.61 against Liger's 0.74 of copy bandwidth.

    It is one more than that, so that every rows-per-block knob leaves a partial last block, as
    the library's symbolic-row kernel must assume: there every stage of a row carries its own
    `row < n` guard, and with a long unrolled row the guards between the loads cost the
    compiler its load batching. Tuned at an even 19456 rows (no guard), 64 threads x 2 rows
    measured 138.9 us at hidden 7168 and was then 46% slower than the default schedule in the
    library (175.0 vs 120.3 us at 16384 rows, bench/results/h200-tuned-run1.json)."""
    if override:
        return override
    if kind != "cuda":
        return TUNE_ROWS[kind]
    from .shapes import train_rows
    return train_rows(key.hidden_size) + 1


# The committed records: schedules/ of the repository (a checkout, an editable install), else
# the copy a wheel carries in the package (tvmnorm/_schedules, a link to schedules/ in the
# repository): a package installed from a wheel has no repository beside it.
CHECKOUT_SCHEDULES = REPO / "schedules"
PACKAGED_SCHEDULES = pathlib.Path(__file__).resolve().parent / "_schedules"


def committed_schedules() -> pathlib.Path:
    return CHECKOUT_SCHEDULES if CHECKOUT_SCHEDULES.is_dir() else PACKAGED_SCHEDULES


def schedules_path(kind: str, root=None) -> pathlib.Path:
    return pathlib.Path(root or committed_schedules()) / f"{target_name(kind)}.json"


def read_records(path) -> dict:
    """packed key -> record, from one schedules file (empty when there is none)."""
    path = pathlib.Path(path)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        return {int(k, 16): v for k, v in data["records"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        # stop: tune would otherwise write its records over the file's
        raise ValueError(f"{path} is not a schedules file ({type(e).__name__}: {e}); move it aside or fix it") from None


def load_records(kind: str, root=None) -> dict:
    """packed key -> record, from schedules/<target-arch>.json (empty when there is none)."""
    return read_records(schedules_path(kind, root))


def records_or_stop(kind: str, root=None) -> dict:
    """load_records for the command line: a schedules file that does not parse ends the command
    with its message (tune would otherwise write its records over the file's)."""
    try:
        return load_records(kind, root)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def save_records(kind: str, records: dict, root=None) -> None:
    from ._tvm import FFI_VERSION, TVM_VERSION
    write_schedules(schedules_path(kind, root), {
        "target": target_spec(kind), "tvm_version": TVM_VERSION, "ffi_version": FFI_VERSION,
        "records": {f"{k:#x}": v for k, v in sorted(records.items())}})


def write_schedules(path, data: dict) -> None:
    """A schedules file written whole: to a temporary file beside it, then moved over it, so an
    interrupt leaves the old file or the new one, never a cut one (accept, merge and due-again
    rewrite committed files in place). It keeps the old file's mode; a new one gets the umask's
    (mkstemp's 0600 made a shared schedules/ unreadable to others)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".schedules-{os.getpid()}-{time.monotonic_ns()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def tuning_func(key: NormKey, part: str, rows: int, kind: str, chunk_rows: int | None = None):
    """The static-row PrimFunc MetaSchedule measures (eps bound to a constant: the measuring
    harness only fills tensor arguments); ``chunk_rows`` sets the fused dx kernel's T.

    On CUDA the row count is an int64 constant, so the trace is recorded on the int64 index
    types of the library's wide kernels and replays on its int32-row ones too
    (build.key_funcs). The compiled candidate indexes in int32 all the same: TVM's
    NarrowDataType proves a constant row count fits and narrows the index math, which is why the
    library runs int32-row kernels wherever a call fits (before it did, retunes that won in
    tuning lost in the library: rmsnorm bwd 5120, 177 us as a candidate, 242 us there)."""
    from . import compute
    from ._tvm import ROW_OPERANDS_ATTR, STATIC_ROWS_ATTR, tirx
    n = tirx.const(rows, "int64") if kind == "cuda" else rows
    func = compute.kernel_funcs(key, kind, rows=n, chunk_rows=chunk_rows)[part]
    eps = [p for p in func.params if p.name == "eps"]
    if eps:
        func = func.specialize({eps[0]: 1e-6})
    # the arguments whose extent the symbolic row count sets: the rows that the stream modes'
    # cache hints load (_tvm._row_buffers)
    symbolic = compute.kernel_funcs(key, kind, chunk_rows=chunk_rows)[part]
    row_operands = [p.name for p in symbolic.params
                    if any(not isinstance(d, tirx.IntImm) for d in getattr(p, "shape", None) or ())]
    # its row guards compare with this count: full_chunks versions the walk as in the library
    return (func.with_attr("global_symbol", "main").with_attr(STATIC_ROWS_ATTR, rows)
            .with_attr(ROW_OPERANDS_ATTR, row_operands))


_BAR_OPEN = [False]  # the progress bar's line has no newline yet


def _bar(i, n, t0, label):
    done = i / n if n else 1
    el = time.time() - t0
    eta = el / done - el if done else 0
    fill = int(30 * done)
    sys.stderr.write(f"\r[{'#' * fill}{'.' * (30 - fill)}] {i}/{n} {el:5.0f}s eta {eta:5.0f}s  {label[:60]:60s}")
    sys.stderr.flush()
    _BAR_OPEN[0] = True


def _end_bar() -> None:
    if _BAR_OPEN[0]:
        sys.stderr.write("\n")
        _BAR_OPEN[0] = False


def _say(message: str) -> None:
    """A line on stderr below the progress bar: the bar's line is ended first, else a log (not a
    terminal) glues the message to the bar."""
    _end_bar()
    print(message, file=sys.stderr)


def _postprocs(kind, stage: str = "fwd"):
    """What MetaSchedule applies to every drawn point. On CUDA, VerifyGPUCode (which lowers the
    whole kernel) rejects the forward space's points of more than 1024 threads a block (threads
    and rows per block are sampled apart); the fused backward space holds no such point (its
    lanes and staged variants are chosen to fit, space.fused_rows and staged_fits: all 26030
    points of the bf16 and fp16 catalog's backward spaces with hidden 1000 and 4095, and of
    bwd_add at 128, 1000, 4095 and 7168, every lane count and full_chunks, pass it,
    scripts/launchable_points.py; test_the_fused_space_holds_only_launchable_points), and there
    it took a fifth to a quarter of a search's time on the host (rmsnorm and layernorm bwd 3584,
    T 32 and 64, 24 trials, scripts/search_overhead.py on 2 cores: 62.0 and 68.1 -> 49.0 and
    49.5 s a key). A point that did fail would fail its build, which the builders report as a
    failed candidate.

    No stage gets RewriteReductionBlock, on either target: it splits a reduction's init out of
    its loop, while a record's trace (kept without postprocessors, record_trace) builds in the
    library with the init inside, so the search timed other kernels than the library runs. In
    the backward it moved the dx's running sums' init before the walk over a chunk's rows, and
    each candidate drawing hoist_inits = 1 failed to build (the pass found no init left to
    hoist: 124 of 256 trials of the fiftieth lease's layernorm retune, 198 of the forty-sixth's
    bwd_add); in the forward, the combine of a row's per-warp partial sums. Without it the search
    builds exactly what the library will (test_the_search_builds_the_kernels_the_library_runs).
    llvm gets no RewriteParallelVectorizeUnroll either: its space parallelises, vectorises and
    unrolls with schedule primitives and sets none of the annotations that pass acts on."""
    from ._tvm import ms
    if kind == "cuda" and stage not in ("bwd", "bwd_add"):
        return [ms.postproc.VerifyGPUCode()]
    return []


def space_generator(key: NormKey, kind: str):
    """MetaSchedule's space generator for a task of ``key``: our design space alone (no built-in
    schedule rule or mutator) and the postprocessors of _postprocs, which a TuneContext
    initialises for its target."""
    from ._tvm import ms
    from .sched.space import space_fn
    return ms.space_generator.ScheduleFn(space_fn(key, kind), sch_rules=[], postprocs=_postprocs(kind, key.stage),
                                         mutator_probs={})


def refused_fused_points(key: NormKey, chunk_rows: int = 32, every_lane: bool = True) -> tuple:
    """(points checked, the points VerifyGPUCode refuses) of the fused backward space of ``key``:
    each structural variant built as the space builds it, at every chunk-lane count and
    full_chunks value, or with ``every_lane`` False at its most lanes (the most threads and
    shared memory it asks for) and full_chunks 1; min_blocks and the stream hint change neither
    the launch nor the shared memory. What _postprocs leaving the check out for the backward
    rests on."""
    import itertools
    from ._tvm import IRModule, Schedule, cuda_tune_context, ms
    from .sched.rows import CudaRowConfig, schedule_rows_cuda
    from .sched.space import FULL_CHUNKS, fused_cuda_variants, fused_lanes
    func = tuning_func(key, "dx", tune_rows(key, "cuda"), "cuda", chunk_rows)
    ctx = cuda_tune_context(IRModule({"main": func}))
    verify = ms.postproc.VerifyGPUCode()
    verify._initialize_with_tune_context(ctx)
    checked, refused = 0, []
    for fused in fused_cuda_variants(key):
        threads, vec, prefetch, stages, weights, staged = fused
        ways = (itertools.product(fused_lanes(fused), FULL_CHUNKS) if every_lane
                else [(max(fused_lanes(fused)), 1)])
        for lanes, full in ways:
            sch = Schedule(func)
            schedule_rows_cuda(None, CudaRowConfig(threads=threads, rows=lanes, vec=vec, prefetch=prefetch,
                                                   stages=stages, chunk_weights=weights, staged=staged,
                                                   full_chunks=full), sch=sch)
            checked += 1
            if not verify.apply(sch):
                refused.append((fused, lanes, full))
    return checked, refused


def search_session(keys, funcs, owner, kind: str, trials: int, work, builder, runner, seed: int = 1,
                   committed=None):
    """One MetaSchedule session over ``funcs`` (see _tasks) with our design spaces, search and
    cost model, candidates built by ``builder`` and timed by ``runner``, after each task's default
    schedule and ``committed`` records (seed_candidates); returns how many of those were measured
    and the database.
    tune_batch runs it with the real builder and runner, scripts/search_overhead.py with fakes."""
    from ._tvm import IRModule, ms, target, without_tensor_intrinsics
    from .sched.space import population_points
    spaces = {task: space_generator(owner[task][0], kind) for task in funcs}
    db = open_database(work)
    seeded, kept, peers = seed_candidates(db, funcs, owner, kind, builder, runner, committed)
    _say(f"seeded the default schedule of {seeded} of {len(funcs)} tasks as a candidate"
         + (f", and {kept} committed records" if kept else "")
         + (f", and {peers} of torch.compile's launch shapes" if peers else ""))
    with without_tensor_intrinsics():
        return seeded + kept + peers, ms.tune_tir(
            IRModule(funcs), target(target_spec(kind)), str(work), max_trials_global=trials * len(funcs),
            max_trials_per_task=trials, num_trials_per_iter=min(trials, 16), database=db,
            space="post-order-apply", special_space=spaces, builder=builder, runner=runner,
            cost_model=_cost_model(kind), strategy=_search(min(population_points(k, kind) for k in keys)),
            seed=seed, num_tuning_cores=_search_cores(kind))


def tune_batch(keys, kind: str, trials: int, logs: pathlib.Path, rows: int | None, seed: int = 1,
               workers: int | None = None, cuda_build: str | None = None, chunks=None, committed=None,
               overlap: bool = False) -> dict:
    """Tune the row kernels of several keys in one MetaSchedule session (its start-up, about
    30 s of importing tensor intrinsics, is paid once per batch), with ``committed`` (packed key
    -> record) among the candidates; with ``overlap`` the candidates compile while the search
    goes on (InProcessBuilder). Returns packed key -> record."""
    from ._tvm import target
    from .measure import InProcessBuilder, InProcessRunner
    funcs, owner = _tasks(keys, kind, rows, chunks, committed)
    work = logs / target_name(kind)
    work.mkdir(parents=True, exist_ok=True)
    builder = InProcessBuilder(kind, workers=workers, cuda_build=cuda_build or "nvrtc", overlap=overlap)
    runner = InProcessRunner(kind, builder=builder)
    add_partial_sum_costs(funcs, owner, kind, builder, runner)
    before = runner.measured
    seeded, db = search_session(keys, funcs, owner, kind, trials, work, builder, runner, seed, committed)
    if runner.measured - before <= seeded:
        # no sampled candidate of any task was built and timed (the seeds may have been): a
        # broken toolchain, device or space; going on would spend the whole budget (one GPU
        # lease) learning nothing
        raise TuningBroken(f"no candidate of {len(funcs)} tasks could be built and timed; first errors:\n"
                           + "\n".join((builder.errors + runner.errors)[:3]))
    return _best_records(db, funcs, owner, target(target_spec(kind)), trials)


def add_partial_sum_costs(funcs, owner, kind: str, builder, runner) -> None:
    """Have ``runner`` add to every candidate of each dx task in ``funcs`` the cost of the
    kernels that sum its partials (partial_sum_costs), as the search measures candidates."""
    for task, secs in partial_sum_costs(funcs, owner, kind, builder, runner).items():
        runner.add_fixed(funcs[task], secs)


def partial_sum_costs(funcs, owner, kind: str, builder, runner) -> dict:
    """task -> seconds of the kernels that sum a dx task's weight-gradient partials (its rows in
    chunks of its T), as the library runs them: combine where runtime.combined_rows says, then
    finalize, default schedules, timed like candidates (all built at once). The tuner adds them
    to every candidate of the task: T trades the dx kernel's parallelism against the partial
    rows these kernels read, and tuning the dx kernel alone picked T = 16 at hidden 128 on the
    H200, whose 32768 partials then took longer to sum than its dx kernel ran (layernorm:
    632.8 us in the library against 413.6 for the default at T = 32). A task whose partial sum
    could not be built and timed is left out (its search goes on without it)."""
    from .compute.norms import combine, finalize, num_partials, rows_per_partial
    from .runtime import combined_rows
    from .sched.default import default_schedule
    items, whose = [], []
    for task in funcs:
        key, part, rows, chunk = owner[task]
        if part != "dx":
            continue
        count = num_partials(rows, chunk or rows_per_partial(key, kind))
        stages, mid_rows = [], combined_rows(count)
        if mid_rows is not None:
            stages.append(("combine", combine(key, "main", partials=count)))
            count = mid_rows
        stages.append(("finalize", finalize(key, kind, "main", partials=count)))
        for stage, f in stages:
            items.append((default_schedule(f, stage, kind, DTYPE_BYTES[key.itype]), f))
            whose.append(task)
    costs, failed = {}, set()
    for task, (secs, _) in zip(whose, measure_schedules(items, kind, builder, runner) if items else []):
        if secs is None:
            failed.add(task)
        else:
            costs[task] = costs.get(task, 0.0) + statistics.fmean(secs)
    return {task: c for task, c in costs.items() if task not in failed}


class TuningBroken(RuntimeError):
    pass


def preflight(key: NormKey, kind: str, rows: int | None) -> tuple:
    """Build and time one key's default schedule through the tuning builder and runner, before
    any search: a toolchain or device problem then costs seconds, not a batch. On CUDA the device
    is initialised first and the candidate is built in forked workers, as every later batch is
    (a worker that touches the CUDA runtime after the parent initialised it fails), the fast
    NVRTC build first and the nvcc build if that fails. Returns (measured microseconds, the CUDA
    build that worked or None)."""
    from ._tvm import cuda_available
    from .measure import InProcessBuilder, InProcessRunner
    from .sched.default import default_schedule
    from .sched.space import TUNED_PARTS
    from .compute.norms import parts_of
    part = next(p for p in parts_of(key, kind) if p in TUNED_PARTS)
    func = tuning_func(key, part, tune_rows(key, kind, rows), kind)
    sch = default_schedule(func, part, kind, DTYPE_BYTES[key.itype])
    if kind == "cuda":
        cuda_available()  # initialise the CUDA runtime in this process, as the runner will
    runner, failures = InProcessRunner(kind), []
    for build in (("nvrtc", "nvcc") if kind == "cuda" else (None,)):
        builder = InProcessBuilder(kind, workers=2, cuda_build=build or "nvrtc", timeout=60.0)
        # twice: the second build goes through the forked pool, as a batch's builds do
        (secs, error), _ = measure_schedules([(sch, func)] * 2, kind, builder, runner)
        if error is None:
            return 1e6 * min(secs), build
        failures.append(f"{build or kind} build of {key.name} {part}: {error}")
    raise TuningBroken("preflight failed:\n" + "\n".join(failures))


def measure_schedules(items, kind: str, builder, runner) -> list:
    """Build and time ``items`` ((Schedule, its PrimFunc) pairs) with a tuning builder and
    runner, outside a MetaSchedule session; returns (run seconds, None) or (None, error) per
    item. The artifacts are deleted, as MetaSchedule's RemoveBuildArtifact does for candidates
    (only directories this package's builders made under the temp dir: never anything else)."""
    import shutil
    from ._tvm import ms, target
    tgt = target(target_spec(kind))
    built = builder.build([ms.builder.BuilderInput(sch.mod, tgt) for sch, _ in items])
    runs = [None if b.error_msg else ms.runner.RunnerInput(b.artifact_path, kind,
                                                            ms.arg_info.ArgInfo.from_prim_func(func))
            for b, (_, func) in zip(built, items)]
    results = iter([f.result() for f in runner.run([r for r in runs if r is not None])])
    out = []
    for b, r in zip(built, runs):
        res = next(results) if r is not None else None
        if b.error_msg or res.error_msg:
            out.append((None, b.error_msg or res.error_msg))
        else:
            out.append(([float(x) for x in res.run_secs], None))
        folder = pathlib.Path(b.artifact_path or "").parent
        if b.artifact_path and folder.parent == pathlib.Path(tempfile.gettempdir()) \
                and folder.name.startswith("tvmnorm-"):
            shutil.rmtree(folder, ignore_errors=True)
    return out


def record_trace(trace):
    """A trace as a record keeps it (schedules/): its JSON form without postprocessors, with the
    decisions' TVM values as plain JSON values."""
    return json.loads(json.dumps(trace.as_json(remove_postproc=True), default=lambda o: o.value))


def is_default_trace(trace, default=None) -> bool:
    """Whether ``trace`` is the default rule's (seed_candidates): equal to ``default`` (the
    task's default trace as record_trace writes it) where given, else a trace that samples
    nothing, as every design-space trace samples a decision (a committed record of an older
    space may not: the thirteenth lease's warp_sums records)."""
    if default is not None:
        return record_trace(trace) == default
    return not any(inst.kind.name == "SampleCategorical" for inst in trace.insts)


def default_trace(func, key: NormKey, part: str, kind: str):
    """The default rule's trace for a tuning task, as record_trace writes it."""
    from .sched.default import default_schedule
    return record_trace(default_schedule(func, part, kind, DTYPE_BYTES[key.itype]).trace)


def seed_candidates(db, funcs, owner, kind: str, builder, runner, committed=None) -> tuple:
    """Measure every task's default schedule (the fallback rule at the task's row count and T),
    where ``committed`` (packed key -> record, e.g. schedules/) holds a record for the task's
    key and T, that record's trace, and for a CUDA forward torch.compile's launch shape
    (space.torch_compile_fwd_shapes), and commit each to ``db`` as one more candidate. A
    task's best record is then never one that measured slower than the default or than the
    record it replaces, in the same session's measurements:
    - without the default, 14 of the 120 catalog keys' tuned records lost to the default in the
      library on the H200 and were dropped (tune accept), leaving those keys without a record;
    - a retune (more trials, or a new measurement, as tune_rows changed in the fifth lease)
      starts from a fresh database, and its sampled winner may be a point the old search
      measured slower, picked on noise.
    - the forward search did not take torch.compile's launch shape at hidden 512, which ran
      4-10% faster than the records there in a probe (bench/results/h200-run27/probe.log).
    The default's trace replays on the symbolic-row kernel like a sampled one: a record holding
    it builds the default kernel (so does one holding a peer's shape). A committed trace that
    no longer applies (an older design space) is skipped. Tasks that already have candidates
    (a resumed run) are skipped. Returns (tasks whose default was measured, committed records
    measured, peer shapes measured)."""
    from ._tvm import IRModule, Schedule, Trace, ms, target
    from .sched.default import default_schedule
    from .sched.rows import schedule_rows_cuda
    from .sched.space import torch_compile_fwd_shapes
    tgt = target(target_spec(kind))
    todo = []
    for task, func in funcs.items():
        mod = IRModule({"main": func})
        if db.has_workload(mod) and db.get_top_k(db.commit_workload(mod), 1):
            continue
        key, part, _, chunk = owner[task]
        todo.append((mod, default_schedule(func, part, kind, DTYPE_BYTES[key.itype]), func, "default"))
        if kind == "cuda" and part == "fwd":
            todo += [(mod, schedule_rows_cuda(func, cfg), func, "peer") for cfg in torch_compile_fwd_shapes(key).values()]
        rec = (committed or {}).get(key.pack()) or {}
        trace = rec.get("parts", {}).get(part)
        if trace is not None and rec.get("rows_per_partial") == chunk:
            sch = Schedule(func)
            try:
                Trace.apply_json_to_schedule(trace, sch)
            except Exception:  # noqa: BLE001 - a record of an older space: the search replaces it
                continue
            todo.append((mod, sch, func, "committed"))
    seeded = {"default": 0, "committed": 0, "peer": 0}
    if not todo:
        return tuple(seeded.values())
    measured = measure_schedules([(sch, func) for _, sch, func, _ in todo], kind, builder, runner)
    for (mod, sch, func, origin), (secs, _) in zip(todo, measured):
        if secs is None:  # the search still runs; the error is in the builder's or runner's list
            continue
        db.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, db.commit_workload(mod), run_secs=secs, target=tgt,
            args_info=ms.arg_info.ArgInfo.from_prim_func(func)))
        seeded[origin] += 1
    return tuple(seeded.values())


def _search(points: int = 256):
    """Evolutionary search sized to this space. The space has at most a few hundred points and
    only categorical decisions, which MetaSchedule has no mutator for, so each round draws a fresh
    population, the XGBoost model ranks it, and the best unmeasured (plus an epsilon-greedy share
    of random ones) are measured. The default population (512, four genetic rounds) spent ~17 s
    of feature extraction per task and round on the H200 host for no better picks. The population
    is the space's size (``points``, at least 32, at most 256): the fused bwd space has ~100
    points over 12-20 design spaces, and a population of 256 took ~9 s per task and round to draw
    (24 tasks: 3.6 minutes before the first measurement)."""
    from ._tvm import ms
    population = max(32, min(256, points))
    return ms.search_strategy.EvolutionarySearch(population_size=population, init_measured_ratio=0.0,
                                                 init_min_unmeasured=min(64, population), genetic_num_iters=1,
                                                 eps_greedy=0.1)


# The XGBoost model's learning rate. MetaSchedule's default, 0.2, diverges on these kernels: the
# model predicts a candidate as the sum of its blocks' scores and fits every block as if it alone
# made the candidate's score, so one boosting round moves a kernel of ~15 blocks (loads, stats,
# dx, partials, finalize) about 15 steps at once. Trained on half of each task of the H200's
# tuning databases and asked to rank the other half, 0.2 ranked the backward's candidates
# backwards (rank correlation -0.54, -0.45 and -0.57 over the 8, 26 and 24 tasks of three
# leases, the best of its top 8 13-32% slower than the best) and the forward's at random (-0.06,
# -0.08 over two leases); 0.05 ranked them the right way round (0.58, 0.71, 0.68; forward 0.58,
# 0.58) with the best, or within 1% of it, in its top 8 (0.1: 0.60, 0.70, -, 0.60, -).
# tests/test_tune.py::test_the_cost_model_ranks_held_out_h200_candidates. Tuning at 0.05 on the
# H200 (thirtieth lease), a task's later candidates came nearer its best than at 0.2 at each of
# the 11 tasks both leases tuned (scripts/search_quality.py), and a backward key took 41 s at 48
# trials against 57 at 40.
COST_MODEL_ETA = 0.05
# Measured candidates before the model's ranking is used at all: MetaSchedule's XGBModel returns
# random scores until it has seen num_warmup_samples (default 100) across the session, so a
# one-key retune (2 tasks x 48 trials) never used it and a five-key batch drew its first six
# rounds at random. Simulated on the twenty-ninth lease's measured backward candidates (8 tasks,
# ~41 each, rounds of 8, 6 seeds): the best found after two rounds was 0.979 of each task's best
# at 100 and 0.9995 at 16 (0.996 at 8). On the H200 (thirty-fifth lease) three backward keys
# tuned from nothing at 24 trials came within 1.0-5.8% of their committed records.
COST_MODEL_WARMUP = 16


def _cost_model(kind: str):
    """MetaSchedule's XGBoost model at COST_MODEL_ETA, with at most 8 training threads: it trains
    on tens to a few hundred measured candidates, where more threads only add OpenMP barriers per
    boosting round (and on a host shared by two tuning jobs, oversubscription: see
    tuning_logs/cuda-sm_90/README.md)."""
    from ._tvm import ms
    cores = _search_cores(kind)
    config = ms.cost_model.xgb_model.XGBConfig(nthread=min(8, cores), eta=COST_MODEL_ETA)
    return ms.cost_model.XGBModel(config=config, num_warmup_samples=COST_MODEL_WARMUP, num_tuning_cores=cores)


def _search_cores(kind: str) -> int:
    # On CUDA candidates are timed on the GPU, so the search may use every core; on the CPU the
    # search and the measured kernels would share them
    return usable_cores() if kind == "cuda" else 1


def _best_records(db, funcs, owner, tgt, trials, need=0) -> dict:
    """packed key -> record from the database's best measured candidate per part, over the
    part's tasks (one per chunk size T for the CUDA dx kernel: the record then keeps the winner's
    T as ``rows_per_partial``). With ``need``, only keys whose every task has at least that many
    measured candidates are returned, and a record's ``trials`` is the fewest any of its tasks had."""
    from ._tvm import IRModule
    from .measure import timing
    records, short, done, defaults = {}, set(), {}, {}
    for task, func in funcs.items():
        key, part, rows, chunk = owner[task]
        mod = IRModule({"main": func})
        if need:  # the task's measured candidates from the space, counted once: not the default
            # or torch.compile's shapes (seed_candidates), traces that sample nothing
            top = db.get_top_k(db.commit_workload(mod), 1 << 20) if db.has_workload(mod) else []
            n = sum(not is_default_trace(r.trace) for r in top)
            if n < need:
                short.add(key.pack())
                continue
            done[key.pack()] = min(done.get(key.pack(), n), n)
        rec = db.query_tuning_record(mod, tgt, workload_name="main")
        if rec is None or not rec.run_secs:
            if not need:
                _say(f"no valid schedule found for {task}; it keeps the default")
            short.add(key.pack())
            continue
        # the mean, as MetaSchedule ranks candidates by it (the min could make a record look
        # slower than a candidate it beat)
        us = 1e6 * statistics.fmean(float(x) for x in rec.run_secs)
        r = records.setdefault(key.pack(), {"key": key.name, "describe": key.describe(), "rows": rows,
                                            "timing": timing(tgt.kind.name),
                                            "trials": trials, "parts": {}, "run_us": {}})
        if part in r["run_us"] and r["run_us"][part] <= us:
            continue  # another chunk size of this part measured faster
        r["parts"][part] = record_trace(rec.trace)
        r["run_us"][part] = us
        defaults[key.pack(), part] = is_default_trace(rec.trace, default_trace(func, key, part, tgt.kind.name))
        if chunk is not None:
            r["rows_per_partial"] = chunk
    for k, r in records.items():  # parts where no sampled candidate beat the default (seed_candidates)
        won = [part for part in r["parts"] if defaults.get((k, part))]
        if won:
            r["default_won"] = won
    if need:  # recovery is all or nothing per key
        records = {k: v for k, v in records.items() if k not in short}
        for k, r in records.items():
            r["trials"] = done[k]
    return records


def chunk_sizes(chunks=None) -> tuple | None:
    """The chunk sizes T named to tune the CUDA dx kernel at (``chunks``, checked against
    CUDA_CHUNK_ROWS, the sizes the fused design space is built for), or None where none are
    named: then each key has its own (key_chunk_sizes)."""
    from .compute.norms import CUDA_CHUNK_ROWS
    if not chunks:
        return None
    bad = [c for c in chunks if c not in CUDA_CHUNK_ROWS]
    if bad:
        raise ValueError(f"chunk rows {bad} not among {list(CUDA_CHUNK_ROWS)} (the sizes the bwd design space "
                         f"is built for)")
    return tuple(dict.fromkeys(chunks))


def key_chunk_sizes(key: NormKey, kind: str, chunks=None, record: dict | None = None) -> tuple:
    """The chunk sizes T a key's CUDA dx kernel is tuned at: ``chunks`` where named, else the
    default rule's T (compute.rows_per_partial) and, where it differs, the T of the key's
    ``record``, so that a retune still meets the record on its own ground (the record is seeded
    only into the task of its T). Each T is a task of its own, so every T costs a key another
    search: at 32 trials the H200 took 25.7 s a bf16 backward key at T 32 and 64 and 17.3 s at
    64 alone (thirty-sixth and thirty-seventh leases). Tuned at two or three T each, 20 of the 24
    committed bf16 backward records had chosen the rule's T (the others: rmsnorm and layernorm
    128 at 64, rmsnorm 2560 and layernorm 5120 at 32, and they keep their T in a retune);
    ``--chunk-rows all`` searches every size."""
    from .compute.norms import rows_per_partial
    if chunks:
        return chunk_sizes(chunks)
    own = (record or {}).get("rows_per_partial")
    return tuple(dict.fromkeys([rows_per_partial(key, kind)] + ([own] if own else [])))


def _tasks(keys, kind, rows, chunks=None, records=None):
    """task name -> static-row PrimFunc, and task name -> (key, part, rows, T), for the tuned
    parts: the CUDA dx kernel once per chunk size T (key_chunk_sizes, with the key's record in
    ``records``, packed key -> record; T is a compute constant, not a schedule decision), every
    other part once (T None)."""
    from .compute.norms import parts_of
    from .sched.space import TUNED_PARTS
    funcs, owner = {}, {}
    for key in keys:
        for part in [p for p in parts_of(key, kind) if p in TUNED_PARTS]:
            n = tune_rows(key, kind, rows)
            sizes = (key_chunk_sizes(key, kind, chunks, (records or {}).get(key.pack()))
                     if (kind == "cuda" and part == "dx") else (None,))
            for chunk in sizes:
                task = f"{key.name}_{part}" + (f"_t{chunk}" if chunk else "")
                funcs[task] = tuning_func(key, part, n, kind, chunk)
                owner[task] = (key, part, n, chunk)
    return funcs, owner


DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")


def open_database(work):
    """MetaSchedule's JSON database in ``work``, a line its files end with cut short set aside
    first. A run killed while it appends a line (a lease's timeout) leaves the line without its
    newline, and every later open then failed ("parallel_for_dynamic error with Unexpected
    EOF"), the records before it out of reach of tune and its recovery. The cut text goes to
    <file>.cut, with a word on stderr; the records before it open as they were."""
    from ._tvm import ms
    work = pathlib.Path(work)
    for name in DATABASE_FILES:
        path = work / name
        if not path.exists():
            continue
        with open(path, "rb+") as f:
            data = f.read()
            end = data.rfind(b"\n") + 1
            if end == len(data):
                continue
            with open(path.with_name(path.name + ".cut"), "ab") as aside:
                aside.write(data[end:] + b"\n")
                aside.flush()
                os.fsync(aside.fileno())
            f.truncate(end)
        kept = data.count(b"\n")
        _say(f"{path}: its last line was cut short (a run stopped while writing it); set aside in "
             f"{path.name}.cut, the {kept} lines before it kept")
    return ms.database.JSONDatabase(work_dir=str(work))


def recover_records(keys, kind: str, trials: int, logs: pathlib.Path, rows: int | None, chunks=None,
                    records=None) -> dict:
    """Records for keys an interrupted run measured but never wrote to schedules/: every task
    of the key (its chunk sizes as the run drew them: ``chunks`` and the keys' ``records``) has
    at least ``trials`` candidates in the database. A record's ``trials`` is how many its tasks
    had (the fewest over its tasks)."""
    from ._tvm import target
    work = logs / target_name(kind)
    if not (work / "database_tuning_record.json").exists():
        return {}
    db = open_database(work)
    funcs, owner = _tasks(keys, kind, rows, chunks, records)
    return _best_records(db, funcs, owner, target(target_spec(kind)), trials, need=trials)


def due_keys(keys, records: dict, kind: str, trials: int, rows: int | None = None) -> list:
    """The keys to tune: those without a record, with one that saw fewer than ``trials``
    candidates, or with one measured another way (another row count, or another timing: the
    CUDA records tuned warm before the fifth lease are tuned again, cold). A record without
    ``timing`` was measured back to back."""
    from .measure import WARM, timing

    def due(key):
        rec = records.get(key.pack())
        return (rec is None or rec.get("trials", 0) < trials or rec.get("rows") != tune_rows(key, kind, rows)
                or rec.get("timing", WARM) != timing(kind))
    return [k for k in keys if due(k)]


# The share of a batch's time it needs before its keys reach a recoverable trial count (its
# design spaces are drawn first, ~a quarter of a CUDA backward batch; then a third of 48 trials,
# h200_tune.sh's MIN_TRIALS 16): a batch with less time than that left measures nothing it keeps.
BATCH_USEFUL_SHARE = 0.5


def batch_past_limit(keys: int, elapsed: float, tuning: float, done: int, limit: float | None,
                     key_seconds: float | None) -> str | None:
    """Why a batch of ``keys`` must not start ``elapsed`` seconds into a run with a time
    ``limit``, or None: less than BATCH_USEFUL_SHARE of its time would be left, at the seconds a
    key has taken in this run (``tuning`` seconds over ``done`` keys) or, before any key has,
    ``key_seconds``; with neither known it starts. On the H200 a job's call is stopped by a
    timeout, and a batch cut short keeps nothing below --min-trials: the thirty-second lease's
    last 130 s drew the design spaces of a batch of four keys and measured none of them."""
    if limit is None:
        return None
    if elapsed >= limit:
        return f"{elapsed:.0f} s of --time-limit {limit:.0f} s spent"
    per_key = tuning / done if done else key_seconds
    if per_key and limit - elapsed < BATCH_USEFUL_SHARE * per_key * keys:
        return (f"{limit - elapsed:.0f} s of --time-limit {limit:.0f} s left, under half of "
                f"{per_key * keys:.0f} s at {per_key:.0f} s a key ({'this run' if done else '--key-seconds'})")
    return None


@contextlib.contextmanager
def run_lock(*paths):
    """Holds each of ``paths`` (a schedules file, a tuning database's folder) for one tune run.
    Two runs on one schedules file would each write their records over the other's (a run saves
    what it loaded at its start and what it tuned), and two on one database would interleave
    their workload lines, which its records point into by line: the second run stops at once,
    naming the path, before it reads or writes anything."""
    with contextlib.ExitStack() as stack:
        for path in paths:
            path = pathlib.Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            f = stack.enter_context(open(path.parent / f".{path.name}.lock", "a+"))
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "another process"
                raise SystemExit(f"{path} is in use by another tvmnorm tune ({holder}): wait for it to end, "
                                 "or give this run --schedules and --logs of its own") from None
            f.truncate(0)
            f.write(f"pid {os.getpid()}")
            f.flush()
        yield


def _torch_cuda_missing() -> str:
    """Why torch cannot run CUDA kernels here ("" where it can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install torch)"
    return "" if torch.cuda.is_available() else "torch sees no CUDA device (torch.cuda.is_available() is False)"


def tune_main(args, keys, out: pathlib.Path | None) -> None:
    """Tunes ``keys`` under the run lock, then builds the library at ``out`` (None: no build)."""
    kind = args.target
    if getattr(args, "overlap_builds", False) and kind != "cuda":
        raise SystemExit(f"--overlap-builds is for CUDA: on {kind} the builds would share the cores the "
                         "candidates are timed on")
    if getattr(args, "sweep_again", False) and not getattr(args, "sweep_chunk_rows", False):
        raise SystemExit("--sweep-again goes with --sweep-chunk-rows")
    if getattr(args, "sweep_chunk_rows", False):
        if kind != "cuda":
            raise SystemExit(f"--sweep-chunk-rows is for the CUDA backward (T sets its dx's grid); got --target {kind}")
        # before the search, not after it: the sweep would compile every T and then keep each T
        # for want of a GPU to time it on
        missing = _torch_cuda_missing()
        if missing:
            raise SystemExit(f"--sweep-chunk-rows times the kernels on a CUDA GPU through torch: {missing}")
    # a schedules file that does not parse stops the run before it leaves a trace (the lock's
    # files); the run reads it again under the lock
    records_or_stop(kind, args.schedules)
    with run_lock(schedules_path(kind, args.schedules), pathlib.Path(args.logs) / target_name(kind)):
        _tune(args, keys, out)


def _tune(args, keys, out: pathlib.Path | None) -> None:
    """tune_main's run, under its lock; ``out``: the library to build (None: --no-build)."""
    started = time.time()
    kind = args.target
    logs = pathlib.Path(args.logs)
    rows = args.rows  # None: tune_rows per key
    chunks = chunk_sizes(getattr(args, "chunk_rows", None))
    records = records_or_stop(kind, args.schedules)
    todo = due_keys(keys, records, kind, args.trials, rows)
    least = getattr(args, "min_trials", None) or args.trials
    recovered = recover_records(todo, kind, least, logs, rows, chunks, records) if todo else {}
    if recovered:
        records.update(recovered)
        save_records(kind, records, args.schedules)
        todo = due_keys(todo, records, kind, args.trials, rows)
        print(f"recovered {len(recovered)} keys measured by an interrupted run from {logs}", file=sys.stderr)
    if getattr(args, "recover_only", False):
        print(f"recover only: {len(todo)} of {len(keys)} keys have fewer than {args.trials} trials; "
              f"tuning 0 of {len(keys)} keys", file=sys.stderr)
        todo = []
    else:
        print(f"tuning {len(todo)} of {len(keys)} keys on {target_name(kind)} ({len(keys) - len(todo)} already "
              f"tuned), {args.trials} trials each, rows={rows or 'per key'}", file=sys.stderr)
    cuda_build = None
    if todo:
        try:
            us, cuda_build = preflight(todo[0], kind, args.rows)
        except TuningBroken as e:
            print(f"stopping: {e}", file=sys.stderr)
            raise SystemExit(2)
        how = f", candidates built with {cuda_build}" if cuda_build else ""
        print(f"preflight: {todo[0].name} default schedule {us:.1f} us{how}", file=sys.stderr)
    t0 = time.time()
    batch = max(1, args.batch)
    failed = []
    for i in range(0, len(todo), batch):
        group = todo[i:i + batch]
        late = batch_past_limit(len(group), time.time() - started, time.time() - t0, i,
                                getattr(args, "time_limit", None), getattr(args, "key_seconds", None))
        if late:
            _say(f"stopping before {len(group)} keys: {late}; they stay due")
            todo = todo[:i]
            break
        _bar(i, len(todo), t0, ", ".join(k.name for k in group))
        try:
            found = tune_batch(group, kind, args.trials, logs, rows, args.seed, args.build_workers, cuda_build,
                               chunks, records, getattr(args, "overlap_builds", False))
        except TuningBroken as e:
            _say(f"stopping: {e}")
            raise SystemExit(2)
        except Exception as e:  # noqa: BLE001 - one batch's failure must not lose the others
            _say(f"tuning {[k.name for k in group]} failed: {e}")
            failed += group
            continue
        records.update(found)
        save_records(kind, records, args.schedules)  # after every batch: an interrupt loses little
    if todo:  # the yardstick: seconds per key, search, builds and measurements together
        _bar(len(todo), len(todo), t0, "done")
        _end_bar()
        spent = time.time() - t0
        done = len(todo) - len(failed)
        print(f"tuned {done} keys in {spent:.0f} s: {spent / len(todo):.1f} s per key"
              + (f"; {len(failed)} of {len(todo)} failed (above) and stay due: "
                 f"{', '.join(k.name for k in failed)}" if failed else ""), file=sys.stderr)
    if getattr(args, "sweep_chunk_rows", False):
        # saved after each key: a sweep cut off keeps what it timed and resumes past it
        records.update(sweep_records([k for k in keys if k not in failed], records, kind,
                                     save=lambda swept: save_records(kind, {**records, **swept}, args.schedules),
                                     again=getattr(args, "sweep_again", False)))
    if out is not None:
        from .build import build_library
        build_library(keys, kind, out, records=records, layouts=getattr(args, "layouts", "all"))
    if failed:  # the library serves them the default schedule; a script must not take this for success
        raise SystemExit(1)


def _bench_runs(bench: dict) -> dict:
    """(packed key, rows) -> impl -> record, from a ``tvmnorm bench`` JSON, less the calls a
    library serves with kernels no record schedules (runtime.runs_no_record: the forward's
    small-call kernel, the CUDA decode backward): they say nothing of a tuned record."""
    from .bench import record_key
    from .runtime import runs_no_record
    kind = bench.get("meta", {}).get("target", "cuda")
    runs = {}
    for r in bench["records"]:
        key = record_key(r, bench.get("meta", {}).get("fp8_format"))
        if not runs_no_record(key, r["rows"], kind):
            runs.setdefault((key.pack(), r["rows"]), {})[r["impl"]] = r
    return runs


def _previous_runs(previous, accepted) -> dict:
    """(packed key, rows) -> impl -> record from benchmarks of earlier libraries (a later file's
    measurement of a case wins), where a key's measurements count only if that library ran the
    ``accepted`` record (the fingerprint its manifest keeps, which the benchmark copies into
    meta.library.records; a benchmark from before that cannot say, and counts)."""
    from .build import record_fingerprint
    out = {}
    for bench in previous or []:
        ran = ((bench.get("meta") or {}).get("library") or {}).get("records") or {}
        for (packed, rows), impls in _bench_runs(bench).items():
            if str(packed) in ran and ran[str(packed)] != record_fingerprint((accepted or {}).get(packed)):
                continue  # that library ran another record of this key
            out.setdefault((packed, rows), {}).update(impls)
    return out


def accept_records(records: dict, bench: dict, slack: float = 0.02, accepted: dict | None = None,
                   previous: list | None = None, to_default=None) -> tuple:
    """The tuned records a benchmark run of their library supports: a record stays when its
    key's ``tvmnorm_tuned`` kernel passed the float64 refcheck and was no slower than
    ``tvmnorm_default`` (within ``slack``) at every row count benchmarked for it. Tuning
    measures a static-row candidate, the library runs the symbolic-row kernel, and a record
    that lost to the default in the library (three did on the H200) must not ship.
    ``bench`` is a ``tvmnorm bench`` JSON. A record the benchmark did not cover (no tuned cell,
    or one "missing": its library lacked the key or served it the default) stays only if
    ``accepted`` (the records accepted before, e.g. the committed schedules) holds the same trace.
    A retuned record (its trace differs from the ``accepted`` one) that fails gives way to the
    record it would replace, which stays in ``kept``; so does one that did not run faster, beyond
    ``slack``, than that record did in ``previous``, benchmarks of libraries that ran it
    (_previous_runs): a retune within the drift between runs is no reason to replace a record
    (the twenty-first lease's accept took three at -1.7, -1.0 and +0.5%). The record it would
    replace is dropped too where ``previous`` measured it slower than this run's default (then a
    retune within ``slack`` of it, and of the default, replaces it). In the fifth lease retuned bwd records measured faster than the committed
    ones in tuning, which times the dx kernel alone, and ran 7-72% slower in the library.
    ``to_default`` (packed key, losing record -> default_record) keeps a key whose record lost
    to the default, and has no record left to fall back on, with the default rule's schedule as
    its record instead of none: the search's verdict for that key on this target.
    Returns (kept, dropped: packed key -> reason)."""
    from .build import record_fingerprint
    runs = _bench_runs(bench)
    before_runs = _previous_runs(previous, accepted)
    kept, dropped = {}, {}
    for packed, rec in records.items():
        # a "missing" tuned cell is a library that did not run this record (a tune job's library
        # holds the job's keys only; a default-schedule record is served as the default): no verdict
        seen = [(rows, impls) for (k, rows), impls in runs.items()
                if k == packed and impls.get("tvmnorm_tuned", {}).get("status", "missing") != "missing"]
        before = (accepted or {}).get(packed)
        # the same traces at another T are another kernel: the fingerprint tells them apart
        retuned = bool(before) and record_fingerprint(before) != record_fingerprint(rec)
        reason = None if seen or (before and not retuned) else "not benchmarked"
        for rows, impls in seen:
            tuned, default = impls.get("tvmnorm_tuned", {}), impls.get("tvmnorm_default", {})
            if tuned["status"] != "ok":
                reason = f"tuned kernel {tuned['status']} at {rows} rows"
            elif default.get("status") == "ok" and tuned["us"] > default["us"] * (1 + slack):
                reason = f"slower than the default at {rows} rows ({tuned['us']:.1f} vs {default['us']:.1f} us)"
            if reason:
                break
            was = before_runs.get((packed, rows), {}).get("tvmnorm_tuned", {})
            if retuned and was.get("status") == "ok" and tuned["us"] > was["us"] * (1 - slack):
                versus = f"at {rows} rows ({tuned['us']:.1f} vs {was['us']:.1f} us)"
                if tuned["us"] > was["us"] * (1 + slack):
                    reason = f"slower than the record it replaces {versus}"
                elif _slower_than_default(before_runs, packed, seen, slack) is None:
                    reason = f"no faster, beyond {slack:.0%}, than the record it replaces {versus}"
                if reason:
                    break
        if reason:
            dropped[packed] = reason
            # a retune that failed leaves the record it would replace, unless that one, as earlier
            # runs measured it, is slower than this run's default too
            lost = _slower_than_default(before_runs, packed, seen, slack) if retuned else None
            if retuned and lost is None:
                kept[packed] = before
                continue
            if lost:
                dropped[packed] += f"; so was the record it would replace ({lost})"
            if to_default is not None and reason.startswith("slower than the default"):
                kept[packed] = to_default(packed, rec, dropped[packed])
        else:
            # the same trace found again by a job that started it from fewer trials (a retune that
            # made it due again, due_again) has still been searched as hard as before
            if before and not retuned and before.get("trials", 0) > rec.get("trials", 0):
                rec = dict(rec, trials=before["trials"])
            kept[packed] = rec
    return kept, dropped


def default_record(key: NormKey, kind: str, lost: dict, why: str) -> dict:
    """The record of a key whose tuned kernel (``lost``) ran slower than the default schedule in
    its library (``why``): the default rule's traces of the same parts, at the default chunk size
    T, marked ``default_won`` (as a search whose best candidate was the seeded default). The key
    keeps a record, the search's verdict for it, and its library builds the default kernel. The
    trace is taken on the tuning function at the record's rows, as seed_candidates takes it."""
    from .compute.norms import rows_per_partial
    from .sched.default import default_schedule
    chunk = rows_per_partial(key, kind) if "dx" in lost.get("parts", {}) else None
    parts = {}
    for part in lost.get("parts", {}):
        sch = default_schedule(tuning_func(key, part, lost["rows"], kind, chunk), part, kind, DTYPE_BYTES[key.itype])
        parts[part] = record_trace(sch.trace)
    rec = {k: v for k, v in lost.items() if k not in ("parts", "run_us", "rows_per_partial", "default_won")}
    rec.update(parts=parts, default_won=sorted(parts), lost_in_library=why)
    if chunk is not None:
        rec["rows_per_partial"] = chunk
    return rec


def _slower_than_default(before_runs: dict, packed: int, seen: list, slack: float) -> str | None:
    """Where an earlier run's measurement of a key's record (``before_runs``) is slower, beyond
    ``slack``, than the default of this benchmark (``seen``: its rows -> impls), what it was."""
    for rows, impls in seen:
        was = before_runs.get((packed, rows), {}).get("tvmnorm_tuned", {})
        default = impls.get("tvmnorm_default", {})
        if was.get("status") == "ok" and default.get("status") == "ok" and was["us"] > default["us"] * (1 + slack):
            return f"{was['us']:.1f} vs {default['us']:.1f} us at {rows} rows"
    return None


def accept_main(argv=None) -> int:
    """python -m tvmnorm.tune accept SCHEDULES.json BENCH.json OUT.json"""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m tvmnorm.tune accept",
                                 description="keep the tuned records that their library's benchmark supports")
    ap.add_argument("schedules")
    ap.add_argument("bench")
    ap.add_argument("out")
    ap.add_argument("--slack", type=float, default=0.02)
    ap.add_argument("--accepted", help="records accepted before (kept when this benchmark did not cover them)")
    ap.add_argument("--drop", action="store_true",
                    help="drop a record that lost to the default (default: replace it with the default's schedule)")
    ap.add_argument("--previous", nargs="*", default=[],
                    help="benchmarks of the --accepted records' library (a later file's measurement of a case "
                         "wins): a retuned record slower than the one it replaces keeps that one")
    ap.add_argument("--rejected", default=None, metavar="DIR",
                    help="write the job's records that were not kept, as a schedules folder (DIR/<target-arch>.json), "
                         "for bench/bwd_parts.py --stream-ab --records DIR")
    args = ap.parse_args(argv)
    # a missing benchmark must stop the accept before it judges anything: without --previous a
    # retuned record slower than the committed one would replace it (the fourteenth lease's
    # first accepts ran in a tree carried without bench/results and ended in a traceback)
    for what, path in [("schedules", args.schedules), ("bench", args.bench), ("--accepted", args.accepted)] + [
            ("--previous", path) for path in args.previous]:
        if path is not None and not pathlib.Path(path).is_file():
            ap.error(f"{what} file {path} does not exist")

    def read(path):
        data = json.loads(pathlib.Path(path).read_text())
        return data, {int(k, 16): v for k, v in data["records"].items()}
    data, records = read(args.schedules)
    accepted = read(args.accepted)[1] if args.accepted else None
    previous = [json.loads(pathlib.Path(path).read_text()) for path in args.previous]
    kind = "llvm" if data.get("target", {}).get("kind") == "llvm" else "cuda"
    to_default = None if args.drop else (
        lambda packed, rec, why: default_record(NormKey.unpack(packed), kind, rec, why))
    kept, dropped = accept_records(records, json.loads(pathlib.Path(args.bench).read_text()), args.slack, accepted,
                                   previous, to_default)
    for packed, why in sorted(dropped.items()):
        what = ("the default's schedule replaces" if kept.get(packed, {}).get("lost_in_library") == why
                else "kept the committed record" if packed in kept else "dropped")
        print(f"{what} {records[packed]['key']}: {why}")
    data["records"] = {f"{k:#x}": v for k, v in sorted(kept.items())}
    if accepted is not None:
        data["changes"] = accept_changes(accepted, kept, records)
    write_schedules(args.out, data)
    print(f"kept {len(kept)} of {len(records)} records -> {args.out}")
    if args.rejected:
        # the traces the tune chose and the library turned down: the two leases that looked into
        # why (the thirty-first and thirty-second) had to copy them out of the job's state by hand
        rejected = {packed: records[packed] for packed in dropped
                    if (kept.get(packed) or {}).get("parts") != records[packed].get("parts")}
        save_records(kind, rejected, args.rejected)
        print(f"{len(rejected)} records not kept -> {schedules_path(kind, args.rejected)}")
    return 0


def accept_changes(started: dict, kept: dict, judged) -> dict:
    """What one job's accept changed against the records it started from (``--accepted``):
    packed keys (hex) whose record it replaced or added, and those it dropped: of the keys it
    judged (its own records), those it did not keep. merge_accepted takes only these from a
    job, so a job's copies of records it did not touch never overwrite newer ones, and a job
    that tuned some keys from no records (h200_tune.sh FRESH=1) drops no others (the twelfth
    lease's verify merge left 105 committed records out when "dropped" was every committed key
    missing from the job's output)."""
    return {"records": [f"{k:#x}" for k in sorted(kept) if kept[k] != started.get(k)],
            "dropped": [f"{k:#x}" for k in sorted(started) if k in judged and k not in kept]}


def merge_accepted(committed: dict, accepted_runs: list) -> tuple:
    """One record set from several tune jobs' ``accept`` outputs, each of which is the records
    the job started from plus its accepted ones, less what its benchmark dropped. A run is the
    output's records, or (records, changes) with what the job changed (accept_changes): then
    only those records are taken, which matters when the committed records moved on after the
    job started (the eighth lease merged two jobs' outputs into records that already held both
    jobs' results, and each job's copies of the other's keys, which it had started from, put
    17 superseded records back). A committed record that any job dropped (it lost to the
    default, or failed the refcheck, in that job's run) stays out, though the other jobs,
    which did not benchmark its key, still carry it. Returns (records, dropped: the committed
    keys left out)."""
    dropped = set()
    found = {}
    for run in accepted_runs:
        accepted, changes = run if isinstance(run, tuple) else (run, None)
        if changes is None:  # an output written before accept recorded its changes
            dropped |= set(committed) - set(accepted)
            found.update({k: v for k, v in accepted.items() if committed.get(k) != v})
        else:
            dropped |= set(changes["dropped"]) & set(committed)
            found.update({k: accepted[k] for k in changes["records"]})
    records = {k: v for k, v in committed.items() if k not in dropped}
    records.update(found)
    return records, dropped - set(found)


def stream_decision(record: dict | None, part: str = "fwd") -> str | None:
    """The random variable of ``record``'s ``part`` trace that its STREAM_LOADS annotation takes
    (the stream knob's decision), or None: no trace of that part, or one tuned before the knob."""
    from ._tvm import STREAM_LOADS
    insts = ((record or {}).get("parts", {}).get(part) or [[]])[0]
    found = {inst[1][1] for inst in insts if inst[0] == "Annotate" and inst[2] == [STREAM_LOADS]}
    return found.pop() if len(found) == 1 else None


def _sample_of(insts, var: str) -> int:
    """The index of the SampleCategorical instruction of a trace that draws random variable ``var``."""
    (i,) = [i for i, inst in enumerate(insts) if inst[0] == "SampleCategorical" and inst[3] == [var]]
    return i


def _drawn(trace, i: int) -> int:
    """The value the SampleCategorical instruction ``i`` of ``trace`` (as a record keeps it) drew."""
    insts, decisions = trace
    return int(insts[i][2][0][dict(decisions)[i]])


def _draw(trace, i: int, value: int) -> None:
    """Make the SampleCategorical instruction ``i`` of ``trace`` (as a record keeps it) draw ``value``."""
    trace[0][i][2] = [[0, value], [0.5, 0.5]]
    trace[1] = [[j, 1 if j == i else d] for j, d in trace[1]]


def _stream_sample(record: dict, part: str) -> int:
    """The index of the SampleCategorical instruction of ``record``'s ``part`` trace that draws
    its STREAM decision (stream_decision)."""
    var = stream_decision(record, part)
    if var is None:
        raise ValueError(f"{record.get('key')}: no stream decision in its {part} trace")
    return _sample_of(record["parts"][part][0], var)


def stream_mode(record: dict, part: str = "fwd") -> int:
    """The STREAM_LOADS mode ``record``'s ``part`` runs with (its stream decision's choice)."""
    return _drawn(record["parts"][part], _stream_sample(record, part))


def with_stream(record: dict, mode: int, part: str = "fwd") -> dict:
    """A copy of ``record`` with its ``part``'s STREAM decision (stream_decision) made ``mode``:
    the record's schedule with that cache hint, the rest of its kernel unchanged (the probes'
    stream A/B: bench/gpu_probe.py for the forward, bench/bwd_parts.py for the dx)."""
    import copy
    i = _stream_sample(record, part)
    record = copy.deepcopy(record)
    _draw(record["parts"][part], i, mode)
    return record


def with_chunk_rows(record: dict, t: int) -> dict:
    """A copy of the backward ``record`` whose dx walks chunks of ``t`` rows instead of its
    ``rows_per_partial``: the row loop's split by T is the first Split of the dx trace (the
    schedule's first step, rows._chunk_rows), so only that factor and the record's T change.
    T is not a decision of the design space (a compute constant: compute.norms.CUDA_CHUNK_ROWS
    are the sizes searched); the chunk-size sweep (sweep_chunk_rows) and the probes
    (bench/bwd_parts.py --record-t) time a record at sizes the search does not try with it."""
    import copy
    from .compute.norms import CUDA_CHUNK_ROWS
    # a dx block walks at most 16 chunks of T rows, which the int32-row kernels' slack past the
    # last row (runtime._NARROW_SLACK_ROWS) covers for T up to the longest tuned chunk only
    own = record.get("rows_per_partial")
    if "dx" not in record.get("parts", {}) or own is None:
        raise ValueError(f"{record.get('key')}: not a backward record with a dx trace and its rows_per_partial")
    if not 1 <= t <= max(CUDA_CHUNK_ROWS):
        raise ValueError(f"chunk rows must be 1..{max(CUDA_CHUNK_ROWS)} (the int32-row kernels' index slack "
                         f"covers no longer chunks), got {t}")
    record = copy.deepcopy(record)
    split = next((i for i in record["parts"]["dx"][0] if i[0] == "Split"), None)
    if split is None or split[1][2] != own:
        raise ValueError(f"{record.get('key')}: the first split of its dx trace is not by its T = {own}")
    split[1][2] = t
    record["rows_per_partial"] = t
    return record


# The chunk sizes T a CUDA backward record's dx is replayed at after its search
# (sweep_chunk_rows). T is a compute constant, one search task per size, so the search itself
# covers only CUDA_CHUNK_ROWS; but T also sets the dx's grid (16384 tokens / T blocks of one chunk
# lane), and on an H100 (bench/results/h100-run80/, h100-run82/) the whole backward call of
# layernorm 2560 ran 0.95x the time at T = 48 (342 blocks where an SM holds 3: 0.86 waves, against
# 256 at 64) and rmsnorm 5120's 0.90x at 40, while other widths stayed fastest at their own.
# Multiples of 8, so every prefetch group of the space divides them, up to the longest tuned
# chunk (with_chunk_rows: the int32-row kernels' index slack); 96 never won (h100-run80/81/83).
# From 8: bf16 bwd_add 512 timed fastest at 16, the shortest size then swept, and faster the
# shorter (rmsnorm 40.0 / 44.4 / 48.9 us at 16 / 24 / 32, h100-run87), so 16 was an edge, not a
# minimum.
SWEEP_CHUNK_ROWS = (8, 16, 24, 32, 40, 48, 56, 64)
# How much faster another T must time to replace a record's own: the same kernel's whole call
# moved 111.7-118.1 us between processes on one H100 (h100-run82), so less is noise.
SWEEP_SLACK = 0.05


def dx_finalize_kernels(key: NormKey, records: list) -> list:
    """(dx, finalize) of each of ``records`` (one key's backward records, e.g. at several T) as
    a CUDA library serves a call within int32 offsets (the narrow dx), compiled here by the
    library's own path (cuda_aot: nvcc -O3, and on sm_90 finalize launched with programmatic
    dependent launch after dx), not TVM's NVRTC build: what a probe of the backward's GPU time
    needs of it. On an H100 (bench/results/h100-run84/) the NVRTC pair of rmsnorm bwd_add 2560
    timed 7 us apart at T = 32 and 64 where the library's whole calls were 16 us apart; built by
    nvcc, the sweep's pair timed within 2.5% of the whole calls (h100-run85/). All records go into
    one library, nvcc's units in parallel: on the 2-core CI box a record alone took ~5 s of nvcc,
    the sweep's seven T together 14 s (before T = 8 joined them). A record whose trace does not
    replay gets the exception in its place; where the joint library fails to build, each record
    is built alone, so that one bad record does not take the others with it."""
    from .build import key_funcs, narrow_prefix
    from .cuda_aot import load_cuda_library
    from .targets import arch_of
    names = (f"{narrow_prefix(key)}_dx", f"{key.name}_finalize")
    out, funcs = [], {}
    for i, record in enumerate(records):
        try:
            built = key_funcs(key, "cuda", record)
        except Exception as e:  # noqa: BLE001 - this record's trace does not replay; the others still build
            out.append(e)
            continue
        out.append(tuple(f"r{i}_{n}" for n in names))  # symbols apart per record: one library holds them all
        funcs.update({f"r{i}_{n}": built[n].with_attr("global_symbol", f"r{i}_{n}") for n in names})
    if not funcs:
        return out
    try:
        mod = load_cuda_library(funcs, arch_of("cuda", None))
    except Exception:
        if sum(isinstance(o, tuple) for o in out) == 1:
            raise
        return [o if not isinstance(o, tuple) else _built_alone(key, records[i]) for i, o in enumerate(out)]
    return [tuple(mod[n] for n in o) if isinstance(o, tuple) else o for o in out]


def _built_alone(key: NormKey, record: dict):
    """dx_finalize_kernels of ``record`` by itself: its pair, or the exception its build raised."""
    try:
        return dx_finalize_kernels(key, [record])[0]
    except Exception as e:  # noqa: BLE001 - recorded in its place, as a replay failure is
        return e


def dx_call_us(key: NormKey, record: dict, rows: int | None = None, kernels: tuple | None = None) -> float:
    """Microseconds of ``record``'s dx and finalize back to back as a library runs them for a
    backward (or backward-with-add) call of ``rows`` (its training rows: the int32-row dx),
    compiled here (dx_finalize_kernels; ``kernels``: that pair, built already) and timed by the
    bench's probe timer (triton's do_bench, the L2 flushed before each call) on fresh random
    inputs. The search's own measure (tuner_us: the static-row candidate, cold calls under TVM's
    time_evaluator) ranked T otherwise on an H100 (bench/results/h100-run81/): it kept layernorm
    2560 at 64 (114.8 against 118.6 us at 48) and moved layernorm 5120 to 64, whose whole call
    then ran 1.04x slower, so the sweep times what the library serves. Needs torch and a CUDA GPU."""
    from .bench import backward_inputs, probe_us
    from .runtime import partials
    from .shapes import train_rows
    try:
        import torch
    except ImportError:
        raise RuntimeError("the chunk-size sweep times the library's kernels through torch: pip install torch") from None
    if key.forward:
        raise ValueError(f"the chunk-size sweep times the backward's dx and finalize; got stage {key.stage!r}")
    h, rows = key.hidden_size, rows or train_rows(key.hidden_size)
    dx_f, finalize_f = kernels or dx_finalize_kernels(key, [record])[0]
    dy, x, stats, gamma, adds = backward_inputs(key, rows)
    dx, grads = torch.empty_like(x), [torch.empty_like(gamma) for _ in range(key.column_sums)]
    part = torch.empty(key.column_sums, partials(rows, key, "cuda", record["rows_per_partial"]), h, device="cuda")
    return probe_us(lambda: (dx_f(dy, x, *stats, gamma, *adds, dx, part), finalize_f(part, *grads)))


def sweep_chunk_rows(key: NormKey, record: dict, kind: str = "cuda", sizes=SWEEP_CHUNK_ROWS, measure=None,
                     slack: float = SWEEP_SLACK) -> dict:
    """``record`` (a CUDA backward or backward-with-add record) with its dx at the T of ``sizes``
    that dx_call_us times fastest, where that beats its own T by more than ``slack``; each time
    goes into the record's ``chunk_rows_sweep`` (None where the replay failed to build or run; its
    ``run_us`` stays the search's measure of the trace it tuned). ``measure`` (record ->
    microseconds) replaces dx_call_us in tests."""
    if kind != "cuda":
        raise ValueError(f"the chunk-size sweep is for the CUDA backward's dx (its grid); got target {kind!r}")
    own = record.get("rows_per_partial")
    with_chunk_rows(record, own)  # refuses a record without a dx trace and its T, by name
    variants = {}  # T -> the record at T, or why it cannot take T (a size past the index slack)
    for t in dict.fromkeys([own, *sizes]):
        try:
            variants[t] = with_chunk_rows(record, t)
        except ValueError as e:
            variants[t] = e
    if measure is None:
        fit = [t for t, r in variants.items() if isinstance(r, dict)]
        built = dict(zip(fit, dx_finalize_kernels(key, [variants[t] for t in fit])))

        def measure(r):
            pair = built[r["rows_per_partial"]]
            if isinstance(pair, Exception):
                raise pair
            return dx_call_us(key, r, kernels=pair)
    times = {}
    for t, variant in variants.items():
        try:
            if isinstance(variant, Exception):
                raise variant
            times[t] = measure(variant)
        except Exception as e:  # noqa: BLE001 - a size the trace cannot take; the others still count
            times[t] = None
            _say(f"{key.name}: dx at T = {t} failed: {type(e).__name__}: {str(e)[:200]}")
    if times[own] is None:
        raise RuntimeError(f"{key.name}: its record's own dx (T = {own}) failed to build or run")
    best = min((us, t) for t, us in times.items() if us is not None)[1]
    if times[best] >= times[own] * (1 - slack):
        best = own
    out = variants[best]  # a copy already (with_chunk_rows)
    out["chunk_rows_sweep"] = {str(t): us for t, us in times.items()}
    return out


def sweep_records(keys, records: dict, kind: str, measure=None, save=None, again: bool = False) -> dict:
    """sweep_chunk_rows over the CUDA backward and backward-with-add keys of ``keys`` that have
    a record with a dx trace: packed key -> the swept record (others, and those whose own T
    failed to time, are left out), one line each. A record that holds a sweep already (its
    ``chunk_rows_sweep``) is passed over, so that a sweep cut off (by a lease's call limit: it
    took a minute a key on an H100 with its seven T built one after another) resumes where it
    stopped, unless ``again`` (a new sweep of them, from the T they hold); ``save`` (the swept
    records so far) is called after each key."""
    out = {}
    for key in keys:
        record = records.get(key.pack())
        if key.forward or not record or "dx" not in record.get("parts", {}):
            continue
        if "chunk_rows_sweep" in record and not again:
            _say(f"chunk sweep {key.name}: swept already (T {record['rows_per_partial']})")
            continue
        try:
            swept = sweep_chunk_rows(key, record, kind, measure=None if measure is None else
                                     (lambda r, key=key: measure(key, r)))
        except RuntimeError as e:  # its own T could not be timed: nothing to compare, the record stays
            _say(f"chunk sweep {key.name}: kept T {record['rows_per_partial']}: {e}")
            continue
        times = " ".join(f"{t}:{'-' if us is None else f'{us:.1f}'}" for t, us in swept["chunk_rows_sweep"].items())
        print(f"chunk sweep {key.name}: T {record['rows_per_partial']} -> {swept['rows_per_partial']} "
              f"(us by T {times})", file=sys.stderr)
        out[key.pack()] = swept
        if save is not None:
            save(out)
    return out


def dx_knob_annotation(knob: str) -> str:
    """The loop mark of _tvm that a record's trace carries CudaRowConfig's ``knob`` (one of
    sched.rows.DX_SUM_KNOBS) as."""
    from ._tvm import HOIST_INITS, SHARED_SUMS
    marks = {"hoist_inits": HOIST_INITS, "shared_sums": SHARED_SUMS}
    if knob not in marks:
        raise ValueError(f"unknown dx knob {knob!r}: one of {sorted(marks)}")
    return marks[knob]


def with_knob(record: dict, knob: str, value: int = 1, part: str = "dx") -> dict:
    """A copy of ``record`` whose ``part`` runs with the 0/1 dx knob ``knob`` (hoist_inits: the
    running sums zeroed before the walk; shared_sums: kept in shared memory) set to ``value``,
    as the record's trace would have sampled it. A trace tuned before the knob annotates none:
    the annotation goes on the loop its FULL_CHUNK and STREAM_LOADS annotations mark (the dx
    walk over the chunk's rows; _tvm reads SHARED_SUMS off any loop of the kernel), the rest of
    its kernel unchanged (the A/Bs of the thirty-sixth lease and h200-run50, scripts/knob_ab.py)."""
    import copy
    from ._tvm import FULL_CHUNK, STREAM_LOADS
    annotation = dx_knob_annotation(knob)
    if value not in (0, 1):
        raise ValueError(f"{knob} must be 0 or 1, got {value}")
    record = copy.deepcopy(record)
    trace = (record.get("parts") or {}).get(part)
    if trace is None:
        raise ValueError(f"{record.get('key')}: no {part} trace")
    insts = trace[0]
    marks = [i for i, inst in enumerate(insts) if inst[0] == "Annotate" and inst[2] in ([FULL_CHUNK], [STREAM_LOADS])]
    if not marks:
        raise ValueError(f"{record.get('key')}: its {part} trace annotates no walk over a chunk's rows")
    walk = insts[marks[-1]][1][0]
    mine = [i for i, inst in enumerate(insts) if inst[0] == "Annotate" and inst[2] == [annotation]]
    for i in mine:
        if isinstance(insts[i][1][1], str):  # a sampled decision: drawn as this value
            _draw(trace, _sample_of(insts, insts[i][1][1]), value)
        else:
            insts[i][1][1] = value
    if not mine:
        insts.insert(marks[-1] + 1, ["Annotate", [walk, value], [annotation], []])
        trace[1] = [[j + (j > marks[-1]), d] for j, d in trace[1]]
    return record


def annotated_value(record: dict | None, annotation: str, part: str = "dx") -> int:
    """The value ``record``'s ``part`` trace annotates ``annotation`` (a loop mark of _tvm) with,
    as drawn where it was sampled; 0 for a trace without it."""
    trace = (record or {}).get("parts", {}).get(part) or [[], []]
    for inst in trace[0]:
        if inst[0] == "Annotate" and inst[2] == [annotation]:
            value = inst[1][1]
            return _drawn(trace, _sample_of(trace[0], value)) if isinstance(value, str) else int(value)
    return 0


def knob_of(record: dict | None, knob: str, part: str = "dx") -> int:
    """The 0/1 dx knob ``knob`` (with_knob) ``record``'s ``part`` runs with (0 for a trace without it)."""
    return annotated_value(record, dx_knob_annotation(knob), part)


def hoist_inits_of(record: dict | None, part: str = "dx") -> int:
    return knob_of(record, "hoist_inits", part)


def shared_sums_of(record: dict | None, part: str = "dx") -> int:
    return knob_of(record, "shared_sums", part)


def _record_schedule(key: NormKey, record: dict, part: str, kind: str):
    """``record``'s ``part`` trace applied to its static-row tuning function at the record's
    rows (and T), as the search built it: (Schedule, PrimFunc, its partial_sum_costs owner)."""
    from ._tvm import Schedule, Trace
    chunk = record.get("rows_per_partial") if part == "dx" else None
    rows = record.get("rows") or tune_rows(key, kind)
    func = tuning_func(key, part, rows, kind, chunk)
    sch = Schedule(func)
    try:
        Trace.apply_json_to_schedule(record["parts"][part], sch)
    except Exception as e:  # noqa: BLE001 - TVM's replay errors name neither key nor record
        raise ValueError(f"{key.name} {part}: the record's trace does not apply to its tuning function: "
                         f"{str(e).strip()[-300:]}") from None
    return sch, func, (key, part, rows, chunk)


def tuner_us(key: NormKey, record: dict, part: str, kind: str = "cuda", builder=None, runner=None,
             partial_sums: bool = True) -> float:
    """What the search measures for ``record``'s ``part``: its trace on the static-row tuning
    function at the record's rows (and T), built and timed as a candidate (InProcessBuilder,
    InProcessRunner: cold calls), plus for the dx the partial sums' cost that the tuner adds
    (partial_sum_costs; not with ``partial_sums`` False); microseconds, the mean of the trimmed
    repeats. Beside the library's whole call of the same record it shows where the two measures
    part (the thirty-first lease's rejected backward candidates beat the committed traces in the
    tune and lost in the library)."""
    from .measure import InProcessBuilder, InProcessRunner
    sch, func, owner = _record_schedule(key, record, part, kind)
    builder = builder or InProcessBuilder(kind, workers=1)
    runner = runner or InProcessRunner(kind)
    if partial_sums:
        add_partial_sum_costs({part: func}, {part: owner}, kind, builder, runner)
    ((secs, err),) = measure_schedules([(sch, func)], kind, builder, runner)
    if secs is None:
        raise RuntimeError(f"{key.name} {part}: {err}")
    return statistics.mean(secs) * 1e6


def tuner_calls(key: NormKey, record: dict, part: str, kind: str = "cuda", sets: int = 1, builder=None) -> list:
    """The candidate tuner_us times (``record``'s ``part`` on its static-row tuning function,
    built as the search builds it), as ``sets`` zero-argument calls, each on its own random
    arguments made as InProcessRunner makes them: for a probe to time the search's very kernel
    with the bench's timer, apart from the search's timer (TVM's time_evaluator). Each call is
    a functools.partial: its ``args`` are the kernel's arguments, in the PrimFunc's order."""
    from ._tvm import load_module, ms, target
    from .measure import InProcessBuilder, random_argument
    sch, func, _ = _record_schedule(key, record, part, kind)
    builder = builder or InProcessBuilder(kind, workers=1)
    (built,) = builder.build([ms.builder.BuilderInput(sch.mod, target(target_spec(kind)))])
    if built.error_msg:
        raise RuntimeError(f"{key.name} {part}: {built.error_msg}")
    main = load_module(built.artifact_path)["main"]
    infos = ms.arg_info.ArgInfo.from_prim_func(func)
    calls = []
    for _ in range(sets):
        args = [random_argument(tuple(int(d) for d in info.shape), str(info.dtype), kind) for info in infos]
        call = functools.partial(main, *(view for view, _ in args))
        call.owners = [owner for _, owner in args]  # the torch tensors behind the views live with the call
        calls.append(call)
    return calls


def due_again(records: dict, keys) -> list:
    """Make the records of ``keys`` (hex packed key -> record, as a schedules file holds them) due
    for the next tune at any trial count, in place: their trial counts go to 0, the records
    stay, so the tune seeds each committed trace as a candidate and a new record must beat it.
    A record chosen under a measurement the tuner has since changed needs this (the thirtieth
    lease's stream-hint fix: every record before it had its stream mode timed as 0). Done once,
    when a job's state is created (h200_tune.sh RETUNE=1): a resumed job must not make its own
    records due again. Returns the packed keys made due."""
    hit = [key.pack() for key in keys if f"{key.pack():#x}" in records]
    for packed in hit:
        records[f"{packed:#x}"] = dict(records[f"{packed:#x}"], trials=0)
    return hit


def due_again_main(argv=None) -> int:
    """python -m tvmnorm.tune due-again SCHEDULES.json [key selection, as tvmnorm tune's]"""
    import argparse
    from .cli import add_key_args, keys_from_args
    ap = argparse.ArgumentParser(prog="python -m tvmnorm.tune due-again",
                                 description="make the selected keys' records due for the next tune (seeded, not skipped)")
    ap.add_argument("schedules")
    add_key_args(ap)
    args = ap.parse_args(argv)
    path = pathlib.Path(args.schedules)
    if not path.is_file():
        ap.error(f"schedules file {path} does not exist")
    data = json.loads(path.read_text())
    keys = keys_from_args(args)
    hit = due_again(data["records"], keys)
    write_schedules(path, data)
    print(f"{len(hit)} of {len(keys)} selected keys had records; they are due again -> {path}")
    return 0


def merge_main(argv=None) -> int:
    """python -m tvmnorm.tune merge COMMITTED.json ACCEPTED.json... --out OUT.json"""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m tvmnorm.tune merge",
                                 description="combine several tune jobs' accepted records with the committed ones")
    ap.add_argument("committed")
    ap.add_argument("accepted", nargs="*")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    data = json.loads(pathlib.Path(args.committed).read_text())
    runs = [(d["records"], d.get("changes")) for d in (json.loads(pathlib.Path(p).read_text()) for p in args.accepted)]
    committed = data["records"]
    data["records"], dropped = merge_accepted(committed, runs)
    for k in sorted(dropped):
        print(f"left out {committed[k]['key']}: a job's accept dropped it")
    write_schedules(args.out, data)
    print(f"{len(data['records'])} records from {len(runs)} accepted files -> {args.out}")
    return 0


if __name__ == "__main__":
    commands = {"accept": accept_main, "merge": merge_main, "due-again": due_again_main}
    if sys.argv[1:2] and sys.argv[1] in commands:
        sys.exit(commands[sys.argv[1]](sys.argv[2:]))
    sys.exit("usage: python -m tvmnorm.tune accept SCHEDULES.json BENCH.json OUT.json\n"
             "       python -m tvmnorm.tune merge COMMITTED.json ACCEPTED.json... --out OUT.json\n"
             "       python -m tvmnorm.tune due-again SCHEDULES.json [--keys K,... | --hidden ... --stages ...]")
