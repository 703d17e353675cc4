"""From keys to compiled code: scheduled PrimFuncs -> one module -> library + manifest.

A library directory holds ``libtvmnorm.so`` and ``manifest.json``. The manifest stamps what the
library was built from (tvmnorm's kernel-source hash, TVM and tvm-ffi versions, target and arch,
the library's sha256) so the runtime can refuse a stale or damaged library instead of calling
into it.
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import json
import pathlib
import shutil
import tempfile

from .cuda_aot import build_cuda_library, pdl_enabled
from .key import DTYPE_BYTES, NormKey
from .targets import arch_of, target_spec

MANIFEST = "manifest.json"
LIBRARY = "libtvmnorm.so"
# packed key -> the record a library's kernels of that key were built from: the runtime compiles
# a tuned key's kernels for x's other layouts from it (the manifest's fingerprint vouches for it)
RECORDS = "records.json"
FORMAT = 1
_PKG = pathlib.Path(__file__).resolve().parent
# Files whose change changes what a kernel computes or how it is scheduled or lowered (_tvm.py:
# the passes for loops a schedule annotates), or which kernels a library holds for a key
# (build.py: key_funcs).
_SOURCE_GLOBS = ("key.py", "build.py", "_tvm.py", "compute/*.py", "sched/*.py")


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    h = hashlib.sha256()
    for pattern in _SOURCE_GLOBS:
        for path in sorted(_PKG.glob(pattern)):
            h.update(str(path.relative_to(_PKG)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# How a kernel's x lies in memory (the other row operands are compact). "compact": rows hidden
# apart; "strided": rows one stride apart (x[..., :hidden] of a wider tensor), x a [rows, hidden]
# buffer of row stride x_row_stride; "heads": rows (token, head) pairs at two strides (per-head
# q/k of a fused qkv, qkv[..., :q_size].view(tokens, heads, head_dim), which no one row stride
# describes), x a [x_tokens, x_heads, hidden] buffer of strides x_token_stride, x_head_stride.
# The kernels are _tvm.with_x_layout's rewrite of the compact ones' schedules (a record's traces
# replay on the compact function first). A library holds a module per layout it was built for
# (layout_library: the same symbols as the compact module's), so that a deployment without TVM's
# compiler serves every layout; for a layout it was not built for, the runtime compiles them on
# first use (runtime.Registry) from the library's records (RECORDS).
X_LAYOUTS = ("compact", "strided", "heads")


def layout_library(layout: str) -> str:
    """The file of a library's module for x in ``layout``."""
    return LIBRARY if layout == "compact" else LIBRARY.replace(".so", f".{layout}.so")


def checked_layouts(layouts) -> tuple:
    """``layouts`` (names, or a comma-separated string; "all": X_LAYOUTS) in X_LAYOUTS' order,
    "compact" always among them: a library's compact module is the one it cannot do without."""
    names = layouts.split(",") if isinstance(layouts, str) else list(layouts)
    names = list(X_LAYOUTS) if names == ["all"] else [n.strip() for n in names]
    unknown = [n for n in names if n not in X_LAYOUTS]
    if unknown:
        raise ValueError(f"unknown x layout {', '.join(map(repr, unknown))}: each one of {', '.join(X_LAYOUTS)} "
                         f"(or all)")
    return tuple(n for n in X_LAYOUTS if n == "compact" or n in names)


def layout_record(key: NormKey, record: dict | None, layout: str) -> dict | None:
    """The record whose traces a key's kernels for x in ``layout`` replay, of its compact
    ``record``: all of it, but for per-head rows only a forward's. Per-head x costs a division
    by the head count a row a thread, which the more the bytes a thread loads a row, the less
    it costs: rmsnorm bwd 128's record walks its rows with 32 threads a row, 8 bytes each (eight
    rows in flight: eight divisions per eight 8-byte loads), the default rule's dx with 16
    threads a row, 16 bytes each. On the H200 (q heads of Qwen3-8B's qkv, 16384 tokens,
    bench/results/h200-run44) that record's backward took 154.0 us against 120.9 for the
    default's and 118.2 compact, while the forward records gained (69.2 against 71.2 us)."""
    if record is None or layout != "heads" or key.forward:
        return record
    return None


def scheduled_funcs(key: NormKey, kind: str, record: dict | None = None, row_config=None,
                    row_bits: int = 64, parts=None, prefix: str | None = None, group_rows: int = 1,
                    layout: str = "compact") -> dict:
    """symbol -> scheduled PrimFunc (symbolic rows) for one key, from a tuned record when given
    (its trace replayed on the symbolic-row function) and the default rule otherwise.
    ``row_config`` (a CudaRowConfig or CpuRowConfig: one point of the tuned space) schedules the
    row kernel (fwd, or the backward's dx) instead (tests and bench/bwd_parts.py time and check such points).
    ``row_bits`` = 32 gives the kernels an int32 row count (compute.symbolic_rows); ``parts``
    keeps only those kernels, named ``<prefix>_<part>`` (default prefix: the key's name).
    ``group_rows`` is the dx kernel's rows per row reduction (compute.norms._group_sums; a probe
    variant, no record has it). A forward that compute.norms.folds_amax carries _tvm.AMAX_FOLD
    (its amax_row output becomes amax[1]): the tuner's candidates alone keep amax_row; one that
    compute.norms.stores_stats_first carries _tvm.STATS_FIRST. ``layout``: how x lies in memory
    (X_LAYOUTS, _tvm.with_x_layout, applied after the schedule)."""
    from . import compute
    from ._tvm import AMAX_FOLD, STATS_FIRST, Schedule, Trace
    from .compute.norms import folds_amax, stores_stats_first
    from .sched.default import default_schedule
    from .sched.rows import schedule_rows_cpu, schedule_rows_cuda
    out = {}
    chunk_rows = (record or {}).get("rows_per_partial")
    rows = None if row_bits == 64 else compute.symbolic_rows(row_bits)
    for part, func in compute.kernel_funcs(key, kind, rows=rows, prefix=prefix, chunk_rows=chunk_rows,
                                           group_rows=group_rows).items():
        if parts is not None and part not in parts:
            continue
        trace = (record or {}).get("parts", {}).get(part)
        if part in ("fwd", "dx") and row_config is not None:
            rows_rule = schedule_rows_cuda if kind == "cuda" else schedule_rows_cpu
            sch = rows_rule(func.with_attr("global_symbol", "main"), row_config)
        elif trace is not None:
            sch = Schedule(func.with_attr("global_symbol", "main"))
            Trace.apply_json_to_schedule(trace, sch)
        else:
            sch = default_schedule(func, part, kind, DTYPE_BYTES[key.itype])
        marks = [AMAX_FOLD] if part == "fwd" and folds_amax(key, kind) else []
        marks += [STATS_FIRST] if part == "fwd" and stores_stats_first(key, kind) else []
        out.update(_kernel(sch, func, *marks, *pdl_marks(key, kind, part), layout=layout))
    return out


def pdl_marks(key: NormKey, kind: str, part: str) -> list:
    """[_tvm.PDL_WAITS] for a kernel that runs after another of its call (compute.norms.pdl_waits)."""
    from ._tvm import PDL_WAITS
    from .compute.norms import pdl_waits
    return [PDL_WAITS] if pdl_waits(key, kind, part) else []


def _kernel(sch, func, *marks: str, layout: str = "compact") -> dict:
    """{symbol: the scheduled PrimFunc} of ``func`` (its global symbol) scheduled by ``sch``,
    with the attributes ``marks`` set (to 1) and x in ``layout`` (_tvm.with_x_layout)."""
    from ._tvm import with_x_layout
    symbol = func.attrs["global_symbol"]
    scheduled = with_x_layout(sch.mod["main"], layout).with_attr("global_symbol", symbol).with_attr(
        "tirx.is_scheduled", True)
    for mark in marks:
        scheduled = scheduled.with_attr(mark, 1)
    return {symbol: scheduled}


# On CUDA a key's row kernels (the forward and the backward's dx: the kernels that walk x) come
# twice, with the int64 row count that indexes any tensor and again with an int32 one, under
# <key>_narrow_<part>, which the runtime runs for every call whose tensors fit int32 offsets
# (runtime.fits_int32: all but calls of ~2^31 elements). The int32 kernel is the one the tuner
# measured: a tuning candidate has a static row count and TVM's NarrowDataType turns its index
# math to int32, which the symbolic int64 count keeps. With int64 offsets the same trace took
# more registers and time (rmsnorm bwd 5120 on the H200: 48 registers and 177 us as a candidate,
# 65 and 242 us in the library; layernorm bwd 2048's default dx 125 -> 96 registers by ptxas).
# llvm keeps one width: 64-bit registers, no such cost there.
NARROW_PARTS = ("fwd", "dx")


def narrow_prefix(key: NormKey) -> str:
    return f"{key.name}_narrow"


def small_call_prefix(key: NormKey) -> str:
    return f"{key.name}_small"


def small_call_symbol(key: NormKey) -> str:
    return f"{small_call_prefix(key)}_fwd"


def key_funcs(key: NormKey, kind: str, record: dict | None = None, layout: str = "compact") -> dict:
    """Every kernel a library (or the default-kernel cache) holds for a key: its parts, the
    int32-row copies of its row kernels on CUDA (NARROW_PARTS), for a tuned forward (and one
    whose small-call rule differs, has_own_small_call) the small-call kernel
    (small_call_funcs), and for a CUDA backward its dx at shorter chunks (small_dx_funcs) and
    its decode backward (decode_funcs). ``layout`` other than "compact": the same set with x in
    that layout (_tvm.with_x_layout), under the same symbols (a module of their own)."""
    funcs = scheduled_funcs(key, kind, record, layout=layout)
    if kind == "cuda":
        funcs.update(scheduled_funcs(key, kind, record, row_bits=32, parts=NARROW_PARTS,
                                     prefix=narrow_prefix(key), layout=layout))
        funcs.update(small_dx_funcs(key, kind, layout))
        funcs.update(decode_funcs(key, kind, layout))
    if key.forward and (record or has_own_small_call(key, kind)):
        funcs.update(small_call_funcs(key, kind, layout))
    return funcs


# The chunk sizes (T) of the CUDA backward's dx kernels for calls too small for the key's own T:
# its chunks are the dx's unit of parallelism, and one block walks a chunk's rows one after the
# other, so with T = 64 a call of 64 rows ran in one block (rmsnorm bwd 8192: 124.7 us on the
# H200, torch eager 24.1; bench/results/h200-run16/decode.json). runtime.dx_chunk_rows picks
# among them and the key's T by the call's rows. T = 1 went with the twentieth lease: the decode
# backward beat it at every call it had served (bench/results/h200-run20/bwd-small-*.log).
SMALL_DX_CHUNK_ROWS = (8,)


def small_dx_prefix(key: NormKey, t: int) -> str:
    return f"{key.name}_small{t}"


def small_dx_symbol(key: NormKey, t: int) -> str:
    return f"{small_dx_prefix(key, t)}_dx"


# The decode backward's kernels (compute.norms.decode_funcs): dx, then one of the three wgrad
# kernels by the call's rows (runtime.wgrad_part). wgrad_mid only where its split is wgrad's
# own (decode_parts); elsewhere wgrad serves its calls.
DECODE_PARTS = ("dx", "wgrad", "wgrad_few", "wgrad_mid")
OPTIONAL_DECODE_PARTS = {"wgrad_mid": "wgrad"}


def decode_parts(key: NormKey) -> tuple:
    """The decode backward's kernels a CUDA library builds for ``key``."""
    from .sched.default import has_wgrad_mid
    return tuple(p for p in DECODE_PARTS if p != "wgrad_mid" or has_wgrad_mid(key.hidden_size))


def decode_prefix(key: NormKey) -> str:
    return f"{key.name}_decode"


def decode_funcs(key: NormKey, kind: str, layout: str = "compact") -> dict:
    """The decode backward of a CUDA backward key (compute.norms.decode_funcs: dx without
    partials, then wgrad's column sums of dy and x, split two or three ways), default-scheduled,
    int32 rows, under ``<key>_decode_<part>`` for each of decode_parts; the runtime runs it for
    calls of at most runtime.decode_bwd_rows rows."""
    if kind != "cuda" or key.stage not in ("bwd", "bwd_add"):
        return {}
    from .compute.norms import decode_funcs as decode_computes
    from .compute.norms import symbolic_rows
    from .sched.default import default_schedule
    out = {}
    for part, func in decode_computes(key, kind, decode_parts(key), rows=symbolic_rows(32),
                                      prefix=decode_prefix(key)).items():
        out.update(_kernel(default_schedule(func, part, kind, DTYPE_BYTES[key.itype]), func,
                           *pdl_marks(key, kind, part), layout=layout))
    return out


def small_dx_funcs(key: NormKey, kind: str, layout: str = "compact") -> dict:
    """The default rule's dx kernel of a CUDA backward key at each T of SMALL_DX_CHUNK_ROWS,
    under ``<key>_small<T>_dx``, with an int32 row count (the calls they serve are small; a
    larger one that needs int64 offsets keeps the key's own T)."""
    if kind != "cuda" or key.stage not in ("bwd", "bwd_add"):
        return {}
    out = {}
    for t in SMALL_DX_CHUNK_ROWS:
        funcs = scheduled_funcs(key, kind, {"rows_per_partial": t}, row_bits=32, parts=("dx",),
                                prefix=small_dx_prefix(key, t), layout=layout)
        out[small_dx_symbol(key, t)] = funcs[small_dx_symbol(key, t)]
    return out


def small_call_funcs(key: NormKey, kind: str, layout: str = "compact") -> dict:
    """The small-call forward kernel of a key, under the symbol ``<key>_small_fwd``: a library
    (and the default-kernel cache) serves calls of at most runtime.SMALL_CALL_BYTES of x with it
    (records are tuned at training rows; see runtime.SMALL_CALL_BYTES). The default rule's
    schedule, on CUDA sched.default.small_call_cuda_heuristic's. Such a call always fits int32
    offsets, so on CUDA it has an int32 row count."""
    from .sched.default import small_call_cuda_heuristic
    cfg = small_call_cuda_heuristic(key.hidden_size, DTYPE_BYTES[key.itype]) if kind == "cuda" else None
    funcs = scheduled_funcs(key, kind, row_config=cfg, row_bits=32 if kind == "cuda" else 64, parts=("fwd",),
                            prefix=small_call_prefix(key), layout=layout)
    return {small_call_symbol(key): funcs[small_call_symbol(key)]}


def has_own_small_call(key: NormKey, kind: str) -> bool:
    """Whether a forward key without a record gets a small-call kernel of its own: where the
    small-call rule differs from the default rule's forward (on CUDA nearly every width: see
    sched.default.small_call_cuda_heuristic); elsewhere its forward serves small calls too."""
    from .sched.default import fwd_cuda_heuristic, small_call_cuda_heuristic
    h, b = key.hidden_size, DTYPE_BYTES[key.itype]
    return kind == "cuda" and key.forward and small_call_cuda_heuristic(h, b) != fwd_cuda_heuristic(h, b)


def record_fingerprint(record: dict | None) -> str | None:
    """What identifies a tuned record's kernel (its traces and T): the manifest keeps it, so a
    benchmark of a library says which records it measured (tune accept --previous)."""
    if not record:
        return None
    what = {"parts": record.get("parts"), "rows_per_partial": record.get("rows_per_partial")}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def chunk_rows_of(funcs: dict) -> int | None:
    """T of the dx kernel among a key's scheduled ``funcs`` (the attribute its compute carries),
    or None for a key without one (forward): the runtime sizes the partials by it."""
    from .sched.rows import is_fused
    from .compute.norms import CUDA_CHUNK_ROWS, ROWS_PER_PARTIAL_ATTR
    # the key's own dx is the one of the largest T: the small dx kernels' T are below any it has
    assert max(SMALL_DX_CHUNK_ROWS) < min(CUDA_CHUNK_ROWS)
    return max((int(f.attrs[ROWS_PER_PARTIAL_ATTR]) for f in funcs.values() if is_fused(f)), default=None)


def compile_funcs(funcs: dict, kind: str, arch: str | None = None):
    """Compile scheduled PrimFuncs into one executable (CUDA kernels as source, for NVRTC)."""
    from ._tvm import IRModule, compile_module, target
    ex = compile_module(IRModule(funcs), target(target_spec(kind, arch)))
    if kind == "cuda" and [m.kind for m in ex.mod.imports] != ["cuda"]:
        # an unscheduled function compiles silently into a host loop over device pointers
        raise RuntimeError("CUDA build produced no device module; a kernel is unscheduled")
    return ex


def check_out_dir(out_dir) -> None:
    """A library's folder is replaced whole by the next build there, so ``out_dir`` must be new,
    empty or a library's: a folder holding anything else (``--out .``, ``--out schedules``) was
    deleted with it. Raises ValueError naming what it holds."""
    out_dir = pathlib.Path(out_dir)
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ValueError(f"{out_dir} is a file, not a library's folder")
    ours = {MANIFEST, RECORDS} | {layout_library(layout) for layout in X_LAYOUTS}
    other = sorted(p.name for p in out_dir.iterdir() if p.name not in ours)
    if other:
        raise ValueError(f"{out_dir} holds files that are not a tvmnorm library's ({', '.join(other[:3])}"
                         f"{', ...' if len(other) > 3 else ''}), which a build there would delete: give it a new "
                         "or empty folder")


def build_library(keys, kind: str, out_dir, records: dict | None = None, arch: str | None = None,
                  log=print, jobs: int | None = None, layouts=("compact",)) -> dict:
    """Compile ``keys`` into ``out_dir``/libtvmnorm.so + manifest.json; returns the manifest.

    ``records`` maps packed key -> tuned record (schedules/<target>.json); other keys get the
    default schedule. ``layouts`` (checked_layouts): besides compact rows, the x layouts whose
    kernels the library holds, a module each (layout_library; per-head rows from a forward's
    record alone, layout_record). Written to a temporary directory first and moved in whole, so
    an interrupted build never leaves a library that disagrees with its manifest. ``jobs``: nvcc
    processes at once for a CUDA library (cuda_aot.build_cuda_library; default: the cores).
    """
    from ._tvm import FFI_VERSION, TVM_VERSION
    arch = arch_of(kind, arch)
    records = records or {}
    layouts = checked_layouts(layouts)
    out_dir = pathlib.Path(out_dir)
    check_out_dir(out_dir)
    keys = list(dict.fromkeys(keys))
    funcs, entries = {layout: {} for layout in layouts}, []
    for key in keys:
        rec = records.get(key.pack())
        entry = {"key": key.pack(), "name": key.name, "describe": key.describe(),
                 "norm": key.norm, "stage": key.stage, "zero_centered_gamma": key.zero_centered_gamma}
        for layout in layouts:
            lrec = layout_record(key, rec, layout)
            kfuncs = key_funcs(key, kind, lrec, layout)
            funcs[layout].update(kfuncs)
            what = {"symbols": sorted(kfuncs), "origin": "tuned" if lrec else "default",
                    "rows_per_partial": chunk_rows_of(kfuncs), "record": record_fingerprint(lrec)}
            if layout == "compact":
                # tuned, but no sampled candidate beat the default rule's schedule
                entry.update(what, default_won=bool(rec and rec.get("default_won")))
            else:
                entry.setdefault("layouts", {})[layout] = what
        entries.append(entry)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".tvmnorm-build-", dir=out_dir.parent))
    try:
        for layout in layouts:
            so = tmp / layout_library(layout)
            if kind == "cuda":
                with tempfile.TemporaryDirectory(prefix=f".{layout}-", dir=tmp) as work:
                    build_cuda_library(funcs[layout], arch, so, work, jobs)
            else:
                compile_funcs(funcs[layout], kind, arch).export_library(str(so))
        manifest = {
            "format": FORMAT, "tvmnorm_source_hash": source_hash(), "tvm_version": TVM_VERSION,
            "ffi_version": FFI_VERSION, "target": kind, "arch": arch, "target_spec": target_spec(kind, arch),
            "library": LIBRARY, "sha256": file_sha256(tmp / LIBRARY),
            # x's other layouts the library holds kernels for, a module each
            "layouts": {layout: {"library": layout_library(layout), "sha256": file_sha256(tmp / layout_library(layout))}
                        for layout in layouts if layout != "compact"},
            # whether the kernels that follow another launch with programmatic dependent launch
            "pdl": kind == "cuda" and pdl_enabled(arch),
            "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "kernels": entries,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        kept = {str(k.pack()): records[k.pack()] for k in keys if records.get(k.pack())}
        if kept:
            (tmp / RECORDS).write_text(json.dumps(kept))
        if out_dir.exists():
            check_out_dir(out_dir)  # again: files may have come in while it compiled
            # a name of its own beside it, never a fixed one a user's folder may have
            old = pathlib.Path(tempfile.mkdtemp(prefix=".tvmnorm-old-", dir=out_dir.parent))
            out_dir.rename(old / "library")
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    extra = f" (x layouts: {', '.join(layouts)})" if len(layouts) > 1 else ""
    log(f"built {len(entries)} keys ({sum(e['origin'] == 'tuned' for e in entries)} tuned) -> "
        f"{out_dir / LIBRARY}{extra}")
    return manifest
