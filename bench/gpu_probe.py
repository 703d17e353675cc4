"""Forward row-schedule points on the GPU: the library's forward kernel (tuned or default) against
points of the tuned space, above all the row of x kept in registers (``keep_row``) or loaded again
by each stage, each checked against float64 on the same fresh random data (outputs poisoned with
NaN first) and timed with triton's do_bench (L2 flushed) at the catalog's training rows, as a
fraction of the copy ceiling of the same run.

    TVMNORM_LIBRARY=... python bench/gpu_probe.py --out $OUT [--hidden 128,7168,8192] [--norms rmsnorm]

Points per key: the default rule's config (sched.default.fwd_cuda_heuristic) with keep_row as it
sets it and flipped, the earlier rule (cuda_row_heuristic: x loaded by each stage), and every kept
variant of the space (sched.space.fwd_kept_variants) with the rows per block cuda_row_heuristic
gives its thread count; each of them also with one barrier a row sum (+ws: warp_sums) where
that applies, and those of several rows a block also computing a block whose rows are all in
bounds without row guards (+fc: full_chunks); and every kept point of rows of several warps again
with its weights loaded with x, before the row sums' barriers (+ew: early_weights). With ``--otype fp8e4m3`` (y in fp8 and its amax): the default rule's
config with keep_y as it sets it and flipped, the kept variants (each a whole call, amax
included), and the library's fwd kernel alone, which with the library's whole call shows what
the amax kernels (or amax_zero and the atomics, where the forward folds amax in: then also
amax_zero alone) cost; the points of an even vector
also cast one column at a time (``+unpaired``: CudaRowConfig.paired_cast off), and
with ``--fold-ab`` the committed record's kernels with amax folded into the forward and not
(``record+fold``, ``record+amax-kernels``, twice each in turn). ``--int32`` adds
the default rule's kernel with an int32 row count (``default-int32``: the index width tuning
candidates get from NarrowDataType). ``--hints`` adds the default rule's point and the kept
points of 16-byte vectors with x loaded evict-first (``+stream1``: ld.global.cs, as
torch.compile loads it) and y also stored so (``+stream2``). ``--rows 8,16,32,64`` times instead
the kept points of rows of at most a warp (16-byte vectors) at those rows per block, with and
without row guards (+fc), beyond the space's 16. ``--peer-shape`` adds torch.compile's launch
shape as points of the space (``torch.compile-shape+streamN``, space.torch_compile_fwd_shapes), ``--stream-ab 0,1,3``
the committed record with each stream mode (with_stream), ``--stats-ab`` the committed record's
kernels storing the rows' statistics first and last (_tvm.STATS_FIRST), whole calls in turn.
Writes probe.json.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import time

import torch

from tvmnorm import NormKey
from tvmnorm.key import DTYPE_BYTES
from tvmnorm.bench import copy_roofline, probe_meta, probe_parser, probe_timer, probe_us
from tvmnorm.reference import fwd as reference_fwd
from tvmnorm.runtime import REGISTRY, record_kernel, variant_kernel
from tvmnorm.sched.default import cuda_row_heuristic, fwd_cuda_heuristic
from tvmnorm.sched.rows import warp_sums_problem
from tvmnorm.sched.space import EARLY_WEIGHTS_THREADS, fwd_kept_variants, torch_compile_fwd_shapes
from tvmnorm.shapes import train_rows
from tvmnorm.tune import load_records, stream_decision, with_stream


def rows_sweep(key: NormKey, rows: list) -> dict:
    """name -> CudaRowConfig: the kept-row points of 16-byte vectors and rows of at most a warp,
    at each block height in ``rows`` that fits 1024 threads (the space's ROWS stop at 16), and
    again computing a block whose rows are all in bounds without row guards (+fc)."""
    base = fwd_cuda_heuristic(key.hidden_size, 2)
    out = {}
    for threads, vec, keep_y, ws, early, _ in fwd_kept_variants(key):
        if ws or early or keep_y != key.fp8_out or threads > 32 or vec * DTYPE_BYTES[key.itype] != 16:
            continue
        for r in rows:
            if threads * r <= 1024:
                cfg = dataclasses.replace(base, threads=threads, rows=r, vec=vec, keep_row=True, keep_y=keep_y)
                out[f"{threads}x{r}v{vec}+keep"] = cfg
                out[f"{threads}x{r}v{vec}+keep+fc"] = dataclasses.replace(cfg, full_chunks=1)
    return out


def points(key: NormKey, variants: bool = True) -> dict:
    """name -> CudaRowConfig: the default rule's, with keep_row flipped (fp8: keep_y flipped),
    the earlier rule's, and (``variants``) the kept variants (those with warp_sums: +ws); the
    rule's points also with warp_sums where it applies, and every point of several rows a block
    also with full_chunks (+fc)."""
    base = fwd_cuda_heuristic(key.hidden_size, 2)
    out = {"default": base}
    if key.fp8_out and base.keep_row:
        out["default-keep_y-flipped"] = dataclasses.replace(base, keep_y=not base.keep_y)
    if not key.fp8_out:
        out["default-flipped"] = dataclasses.replace(base, keep_row=not base.keep_row, keep_y=False)
        out["loaded-per-stage"] = cuda_row_heuristic(key.hidden_size, 2)
    for threads, vec, keep_y, ws, early, shfl in fwd_kept_variants(key) if variants else ():
        if early or shfl:
            continue  # every kept point comes with +ew below; shuffle_sums is the tuned space's
        rows = 1 if ws else cuda_row_heuristic(threads * vec, 2).rows if threads < 128 else 1
        name = f"{threads}x{rows}v{vec}+keep" + ("+y" if keep_y else "") + ("+ws" if ws else "")
        out[name] = dataclasses.replace(base, threads=threads, rows=rows, vec=vec, keep_row=True, keep_y=keep_y,
                                        warp_sums=ws)
    # the rule's points again with one barrier a row sum, where it applies (sched.rows.warp_sums_problem)
    out.update({f"{name}+ws": dataclasses.replace(cfg, warp_sums=True) for name, cfg in list(out.items())
                if not cfg.warp_sums and warp_sums_problem(cfg.threads, cfg.rows, cfg.vec, key.hidden_size) is None})
    # and blocks of several rows computed without row guards where all their rows are in bounds
    out.update({f"{name}+fc": dataclasses.replace(cfg, full_chunks=1) for name, cfg in list(out.items())
                if cfg.rows > 1})
    # and the kept points of rows with barriers with their weights loaded before those (+ew)
    out.update({f"{name}+ew": dataclasses.replace(cfg, early_weights=True) for name, cfg in list(out.items())
                if cfg.keep_row and cfg.threads >= EARLY_WEIGHTS_THREADS})
    # fp8: the points of an even vector again casting one column at a time (+unpaired), y kept
    # in registers or recomputed by the store (which pairs its casts too since session 66)
    out.update({f"{name}+unpaired": dataclasses.replace(cfg, paired_cast=False) for name, cfg in list(out.items())
                if key.fp8_out and cfg.vec % 2 == 0 and "+fc" not in name and "+ew" not in name})
    return out


def policy_kernels(key: NormKey, policy: str, variants: dict) -> dict:
    """name -> the committed record's kernels (record_kernel) built with compute.norms'
    ``policy`` function swapped for each of ``variants`` (a probe's switch: the library keeps
    the policy as it is); the A/Bs time them twice in turn (ABAB)."""
    from tvmnorm.compute import norms
    record = load_records("cuda").get(key.pack())
    kept, kernels = getattr(norms, policy), {}
    for name, fn in variants.items():
        setattr(norms, policy, fn)
        try:
            kernels[name] = record_kernel(key, "cuda", record, origin=name)
        finally:
            setattr(norms, policy, kept)
    return kernels


def measure(key: NormKey, ceiling: float, deadline: float, variants: bool = True, int32: bool = False,
            hints: bool = False, library_only: bool = False, sweep: list | None = None,
            fold_ab: bool = False, stream_ab: list | None = None, peer: bool = False,
            stats_ab: bool = False) -> dict:
    """Each point's time and error on one fresh input. fp8 points are whole calls (the amax
    kernels after the forward, or amax_zero before one that folds amax in); the library's fwd
    kernel is also timed alone, so the rest of its call shows, and with ``fold_ab`` the
    committed record's kernels with the fold forced on and off (record_kernel)."""
    norm, h = key.norm, key.hidden_size
    rows = train_rows(h)
    x = torch.randn(rows, h, device="cuda").bfloat16()
    gamma = (torch.rand(h, device="cuda") + 0.5).bfloat16()
    beta = [torch.randn(h, device="cuda").bfloat16()] if norm == "layernorm" else []
    stats = [torch.empty(rows, device="cuda") for _ in range(2 if beta else 1)]
    ref = torch.from_numpy(reference_fwd(norm, x.cpu(), gamma.cpu(), *[b.cpu() for b in beta])["y"]).cuda()
    peak = float(ref.abs().max())
    eps = 1e-5 if beta else 1e-6
    if key.fp8_out:
        y = torch.empty(rows, h, device="cuda", dtype=torch.float8_e4m3fn)
        scale = torch.ones(1, device="cuda")  # |y| of a few units: no saturation, e4m3's steps of 1/16
        amax, amax_row = torch.empty(1, device="cuda"), torch.empty(rows, device="cuda")
        extra_in, extra_out = [scale], [amax]
        nbytes = rows * h * 3
    else:
        y = torch.empty_like(x)
        extra_in, extra_out = [], []
        nbytes = 2 * rows * h * 2

    row_peak = ref.abs().amax(dim=1) if key.fp8_out else None

    def run(call, whole=True, zeroed=False):
        """Time and error of ``call``; fp8: with amax of the whole call (``whole``) or of each
        row (a fwd kernel alone that writes them out), amax zeroed before the checked call
        (``zeroed``: a fwd kernel alone that folds into it) instead of poisoned."""
        (y.view(torch.uint8).fill_(0x7F) if key.fp8_out else y.fill_(float("nan")))  # NaN
        for t in extra_out + ([amax_row] if key.fp8_out else []):
            t.fill_(float("nan"))
        if zeroed:
            amax.zero_()
        call()
        err = float((y.double() - ref).abs().max()) / peak  # NaN left anywhere stays NaN
        if key.fp8_out:
            got, want = (amax[0], peak) if whole else (amax_row, row_peak)
            err = max(err, float((got.double() - want).abs().max()) / peak)
        t = probe_us(call)
        return {"us": t, "frac": nbytes / t / 1e3 / ceiling, "rel_err": err}

    def whole_call(k):
        return lambda: k(x, gamma, *beta, *extra_in, y, *stats, *extra_out, eps=eps)

    def abab(kernels):
        """Each of ``kernels``' whole calls timed twice in turn (A, B, A, B)."""
        for rep in ("", "#2"):
            for name, k in kernels.items():
                r["points"][name + rep] = run(whole_call(k))

    lib = REGISTRY.get(key, "cuda")
    r = {"norm": norm, "otype": key.otype, "hidden": h, "rows": rows, "library": lib.origin,
         "points": {"library": run(whole_call(lib))}}
    todo = [] if library_only else [(name, cfg, 64) for name, cfg in points(key, variants).items()]
    if sweep:  # only the block heights asked for, after the default rule's point
        todo = todo[:1] + [(name, cfg, 64) for name, cfg in rows_sweep(key, sweep).items()]
    if peer:
        todo += [(name, cfg, 32) for name, cfg in torch_compile_fwd_shapes(key).items()]
    if int32 and todo:  # the default rule's kernel with an int32 row count (compute.symbolic_rows)
        todo.insert(1, ("default-int32", todo[0][1], 32))
    if hints:  # x loaded evict-first (stream 1) and y also stored so (2): the default rule's point
        # and the kept-row points of 16-byte vectors (torch.compile's loads)
        hinted = [(name, cfg) for name, cfg, _ in todo if name == "default" or
                  name.endswith("+keep") and cfg.vec * DTYPE_BYTES[key.itype] == 16]
        todo[1:1] = [(f"{name}+stream{mode}", dataclasses.replace(cfg, stream=mode), 64) for name, cfg in hinted
                     for mode in (1, 2)]
    for name, cfg, bits in todo:
        if time.time() > deadline:
            break
        k = variant_kernel(key, "cuda", cfg, row_bits=bits)
        if key.fp8_out:
            r["points"][name] = run(whole_call(k))
        else:
            f = k._f["fwd"]
            r["points"][name] = run(lambda: f(x, gamma, *beta, y, *stats, eps))
    if key.fp8_out:
        fwd = lib.forward_for(rows)
        parts = lib.parts_for(rows)
        if "amax_zero" in parts:
            # amax zeroed once: each timed call finds amax at its maximum and makes no atomic
            r["points"]["library-fwd-kernel-only"] = run(
                lambda: fwd(x, gamma, *beta, scale, y, *stats, amax, eps), zeroed=True)
            # amax_zero's launch alone: the whole call less it and the forward alone is what
            # the atomics of the blocks that read amax before it rises cost
            r["points"]["library-amax-zero-only"] = {"us": probe_us(lambda: parts["amax_zero"](amax))}
        else:
            r["points"]["library-fwd-kernel-only"] = run(
                lambda: fwd(x, gamma, *beta, scale, y, *stats, amax_row, eps), whole=False)
    if stream_ab:
        # the committed record (or, where the default won, the default rule's point) with each
        # STREAM_LOADS mode, timed twice in turn (ABAB)
        record = load_records("cuda").get(key.pack())
        kernels = {}
        traced = record and "fwd" in record.get("parts", {})
        if traced and stream_decision(record) is None:
            print(f"{key.name}: its record has no stream decision (tuned before the knob)")
            stream_ab = ()
        for mode in stream_ab:
            name = f"stream{mode}"
            if traced:
                kernels["record+" + name] = record_kernel(key, "cuda", with_stream(record, mode), origin=name)
            else:
                cfg = dataclasses.replace(fwd_cuda_heuristic(key.hidden_size, 2), stream=mode)
                kernels["default+" + name] = variant_kernel(key, "cuda", cfg, row_bits=32)
        abab(kernels)
    if stats_ab:
        # the committed record's kernels storing the rows' statistics first (_tvm.STATS_FIRST)
        # and last, whatever compute.norms.stores_stats_first says
        kernels = policy_kernels(key, "stores_stats_first", {"record+stats-first": lambda key, kind: True,
                                                             "record+stats-last": lambda key, kind: False})
        abab(kernels)
    if key.fp8_out and fold_ab:
        # the record's kernels folding amax and not, whatever compute.norms.folds_amax says
        kernels = policy_kernels(key, "folds_amax", {"record+fold": lambda key, kind: key.fp8_out,
                                                     "record+amax-kernels": lambda key, kind: False})
        abab(kernels)
    return r


def main():
    ap = probe_parser()
    ap.add_argument("--otype", default="bf16", help="bf16, or fp8e4m3 (y and its amax)")
    ap.add_argument("--no-variants", action="store_true", help="only the default rule's points")
    ap.add_argument("--library-only", action="store_true",
                    help="only the library's call (fp8: also its forward alone)")
    ap.add_argument("--fold-ab", action="store_true",
                    help="fp8: also the committed record's kernels with amax folded into the forward and not")
    ap.add_argument("--stats-ab", action="store_true",
                    help="also the committed record's kernels storing the rows' statistics before y and after")
    ap.add_argument("--peer-shape", action="store_true",
                    help="also torch.compile's launch shape as points of the space (stream 0, 1, 3, 4)")
    ap.add_argument("--stream-ab", default="", help="also the committed record with each of these "
                    "CudaRowConfig.stream modes, e.g. 0,3,4 (ABAB)")
    ap.add_argument("--int32", action="store_true",
                    help="also the default rule's kernel with an int32 row count (tuning's index width)")
    ap.add_argument("--hints", action="store_true",
                    help="also points with x loaded evict-first and y stored so (CudaRowConfig.stream)")
    ap.add_argument("--rows", default="", help="instead of the variants: the kept-row points of rows of at most a "
                    "warp at these rows per block, e.g. 8,16,32,64,128")
    ap.add_argument("--seconds", type=float, default=240, help="stop starting new points after this")
    args = ap.parse_args()
    deadline = time.time() + args.seconds
    ceiling = copy_roofline("cuda", probe_timer())["copy_gbps"]
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    out = []
    for norm in args.norms.split(","):
        for h in (int(v) for v in args.hidden.split(",")):
            if time.time() > deadline:
                break
            r = measure(NormKey(norm=norm, otype=args.otype, hidden_size=h), ceiling, deadline,
                        variants=not args.no_variants, int32=args.int32, hints=args.hints,
                        library_only=args.library_only, sweep=[int(v) for v in args.rows.split(",") if v],
                        fold_ab=args.fold_ab, stream_ab=[int(v) for v in args.stream_ab.split(",") if v],
                        peer=args.peer_shape, stats_ab=args.stats_ab)
            out.append(r)
            print(f"{norm:9s} H={h:5d} " + "  ".join(
                f"{k} {v['us']:.1f}" + (f" ({v['frac']:.3f}, err {v['rel_err']:.0e})" if "frac" in v else "")
                for k, v in r["points"].items()),
                flush=True)
    meta = probe_meta(ceiling)
    pathlib.Path(args.out, "probe.json").write_text(json.dumps({"meta": meta, "results": out}, indent=1))


if __name__ == "__main__":
    main()
