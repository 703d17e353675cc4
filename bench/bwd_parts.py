"""Where the one-pass backward's time goes on the GPU: its dx kernel, and the partial sum either
by finalize alone or by combine then finalize, each timed apart (triton's do_bench, L2 flushed
before each call) at the catalog's training rows, against the copy ceiling of the same run.

    TVMNORM_LIBRARY=... python bench/bwd_parts.py --out $OUT [--hidden 128,1024,8192]

Writes bwd-parts.json. It decides runtime.COMBINE_ABOVE: at how many partials the two stages
beat finalize alone. With --finalize 32x16,8x64x8,... it also times finalize split other ways
(columns per block x threadIdx.y lanes [x partial rows in flight per lane],
sched.default._cuda_finalize), each checked against the default's dgamma, to choose that split by
measurement. With --dx 512x1x1,448x2x1 it also times the default rule's dx with other threads
per row x rows per group x groups in flight (sched.rows._cuda_pipeline; 0 keeps the default's
value; a fourth field 32 compiles it with an int32 row count, the index width a tuning candidate
gets), each checked against the library's dx and partials (run it with a library of default
schedules). With --chunk-rows 32,64 it also times the whole call under the default rule with
chunks of each T (the default's own T is compute.norms.rows_per_partial's), checked against the
library's call. With --small-rows 1,64,256,... it times whole calls of those rows at each T the
kernel holds (its own and build.SMALL_DX_CHUNK_ROWS') and through the decode backward
(build.decode_funcs), each checked against the call the runtime makes: what the rules'
FULL_GRID_CHUNKS, decode_bwd_rows and WGRAD_FEW_ROWS are chosen by; with --wgrad 32x16,64x8x4 also the decode
backward with its wgrad kernel split those ways (as --finalize's). With --stream-ab 0,1,3 it only
times the committed record of each key (or --records FOLDER's) with its dx stream mode made each
of those: whole call and dx alone (twice each, in turn), the whole call rotating over input sets,
the search's static-row candidate under the same timer, and the tuner's measure of the same trace
(tune.tuner_us, also without the partial sums and after a warm-up), to see why a candidate that
won the tune loses in the library (bwd-stream-ab.json). With --record-t 40,48,96 it only times
the committed record of each key (or --records FOLDER's) with its dx walking chunks of each T
(tune.with_chunk_rows; the record's own T first): the dx alone and dx + finalize, each output
checked against a float64 reference (bwd-record-t.json). T sets the dx's grid (16384 rows / T
blocks of one chunk lane), which the tuner searches only at compute.norms.CUDA_CHUNK_ROWS.
"""
from __future__ import annotations

import json
import pathlib

import torch

from tvmnorm import NormKey
from tvmnorm.bench import backward_inputs, copy_roofline, probe_meta, probe_parser, probe_timer, probe_us
from tvmnorm.compute.norms import combined_partials
from tvmnorm.key import DTYPE_BYTES
from tvmnorm.runtime import REGISTRY, partials
from tvmnorm.sched.default import FINALIZE_UNROLL
from tvmnorm.shapes import train_rows


def split_variant(func, columns: int, lanes: int, unroll: int):
    """A column-sum kernel (finalize, or the decode backward's wgrad) scheduled as
    sched.default._cuda_finalize with another split and unroll, compiled on its own."""
    from tvmnorm.build import _kernel, compile_funcs
    from tvmnorm.sched.default import _cuda_finalize
    return compile_funcs(_kernel(_cuda_finalize(func, columns, lanes, unroll), func), "cuda").mod[
        func.attrs["global_symbol"]]


def finalize_variant(key, columns: int, lanes: int, unroll: int):
    """The key's finalize kernel with another split and unroll."""
    from tvmnorm.compute.norms import finalize
    return split_variant(finalize(key, "cuda", "f"), columns, lanes, unroll)


def wgrad_variant(key, columns: int, lanes: int, unroll: int):
    """The key's decode wgrad kernel (int32 rows, as build.decode_funcs compiles it) with another
    split and unroll."""
    from tvmnorm.compute.norms import symbolic_rows, wgrad
    return split_variant(wgrad(key, "cuda", symbolic_rows(32), "w"), columns, lanes, unroll)


def dx_variant(key, threads: int, prefetch: int, stages: int, bits: int = 64, group: int = 1, min_blocks: int = 1,
               full_chunks: int = 0, chunk_weights: int = 0, staged: int = 0):
    """The key's dx kernel under the default rule's vec and lanes, with ``threads`` per row,
    ``prefetch`` rows loaded per group and ``stages`` groups in flight (sched.rows._cuda_pipeline;
    0: the default's), an int``bits`` row count, ``group`` rows per row reduction
    (compute.norms._group_sums; it is then the prefetch), ``min_blocks`` blocks an SM must
    hold (__launch_bounds__: a register cap), ``full_chunks`` 1 to walk whole chunks without
    row guards (_tvm.FULL_CHUNK), ``chunk_weights`` 1 to load gamma once a chunk lane
    (CudaRowConfig.chunk_weights) and ``staged`` 1 to copy the rows into shared memory by
    cp.async (CudaRowConfig.staged; one chunk lane a block), compiled on its own."""
    import dataclasses
    from tvmnorm.compute import kernel_funcs
    from tvmnorm.runtime import variant_kernel
    from tvmnorm.sched.default import fused_cuda_heuristic
    cfg = fused_cuda_heuristic(kernel_funcs(key, "cuda")["dx"], key.hidden_size, DTYPE_BYTES[key.itype])
    cfg = dataclasses.replace(cfg, threads=threads or cfg.threads, prefetch=prefetch or cfg.prefetch,
                              stages=stages or cfg.stages, min_blocks=min_blocks, full_chunks=full_chunks,
                              chunk_weights=bool(chunk_weights), staged=bool(staged),
                              rows=1 if staged else cfg.rows)
    if group > 1:
        cfg = dataclasses.replace(cfg, prefetch=group)
    return variant_kernel(key, "cuda", cfg, row_bits=bits, group_rows=group)._f["dx"], cfg


def default_at(key, t: int):
    """The key's whole backward under the default rule with chunks of ``t`` rows (a record of
    no traces and T = t, as tune.default_record writes where the default's schedule won),
    compiled on its own."""
    from tvmnorm.runtime import record_kernel
    return record_kernel(key, "cuda", {"rows_per_partial": t}, f"default-T{t}")


def rel_err(got, want) -> float:
    """The largest |got - want| over the largest |want|, across the outputs."""
    return max(float((a.float() - b).abs().max() / (b.abs().max() + 1e-30)) for a, b in zip(got, want))


def bwd_inputs(norm: str, rows: int, h: int, dtype: str = "bf16") -> tuple:
    """backward_inputs of the ``dtype`` backward key, and its number of per-column sums (dgamma,
    and layernorm's dbeta)."""
    key = NormKey(norm=norm, stage="bwd", itype=dtype, wtype=dtype, otype=dtype, hidden_size=h)
    return (*backward_inputs(key, rows)[:4], key.column_sums)


def measure(norm: str, h: int, ceiling: float, variants=(), dx_points=(), chunk_rows=(), dtype: str = "bf16") -> dict:
    key = NormKey(norm=norm, stage="bwd", itype=dtype, wtype=dtype, otype=dtype, hidden_size=h)
    k = REGISTRY.get(key, "cuda")
    rows = train_rows(h)
    count = partials(rows, key, "cuda", k.chunk_rows)
    dy, x, stats, gamma, s = bwd_inputs(norm, rows, h, dtype)
    dx = torch.empty_like(x)
    part = torch.randn(s, count, h, device="cuda")
    mid = torch.empty(s, combined_partials(count), h, device="cuda")
    grads = [torch.empty_like(gamma) for _ in range(s)]
    f = k.parts_for(rows)  # what a call of these rows runs: the int32-row dx (a JIT default compiles no other until needed)
    r = {"norm": norm, "dtype": dtype, "hidden": h, "rows": rows, "partials": count, "origin": k.origin,
         "dx_us": probe_us(lambda: f["dx"](dy, x, *stats, gamma, dx, part)),
         "finalize_us": probe_us(lambda: f["finalize"](part, *grads)),
         "combine_us": probe_us(lambda: f["combine"](part, mid)),
         "finalize_mid_us": probe_us(lambda: f["finalize"](mid, *grads)),
         "call_us": probe_us(lambda: k(dy, x, *stats, gamma, dx, *grads))}
    r["frac"] = 3 * rows * h * DTYPE_BYTES[dtype] / r["call_us"] / 1e3 / ceiling
    r["two_stage_us"] = r["combine_us"] + r["finalize_mid_us"]
    f["finalize"](part, *grads)
    want = [g.float() for g in grads]
    r["finalize_variants"] = {}
    for columns, lanes, unroll in variants:
        fin = finalize_variant(key, columns, lanes, unroll)
        got = [torch.full_like(g, float("nan")) for g in grads]
        fin(part, *got)
        r["finalize_variants"][f"{columns}x{lanes}x{unroll}"] = {"us": probe_us(lambda: fin(part, *got)),
                                                                "rel_err": rel_err(got, want)}
    r["default_T"] = {}
    if chunk_rows:  # the whole call against the library's (a --no-tuned library: the default's T)
        k(dy, x, *stats, gamma, dx, *grads)
        want = [dx.float()] + [g.float() for g in grads]
    for t in chunk_rows:
        kt = default_at(key, t)
        got = [torch.full_like(dx, float("nan"))] + [torch.full_like(g, float("nan")) for g in grads]
        kt(dy, x, *stats, gamma, *got)
        r["default_T"][t] = {"us": probe_us(lambda: kt(dy, x, *stats, gamma, *got)), "rel_err": rel_err(got, want)}
    r["dx_points"] = {}
    if dx_points:  # against the default rule's dx (a --no-tuned library) at the default T
        f["dx"](dy, x, *stats, gamma, dx, part)
        want = [dx.float(), part.clone()]
    for point in dx_points:
        try:
            fdx, cfg = dx_variant(key, *point)
        except ValueError as e:  # a point this width cannot take (staged rows beyond shared memory)
            r["dx_points"]["x".join(map(str, point))] = {"error": str(e)}
            continue
        threads, prefetch, n, bits, group, min_blocks, full, weights, staged = point
        got = [torch.full_like(dx, float("nan")), torch.full_like(part, float("nan"))]
        fdx(dy, x, *stats, gamma, *got)
        name = (f"{cfg.threads}x{cfg.rows}v{cfg.vec}p{cfg.prefetch}s{cfg.stages}" + ("i32" if bits == 32 else "")
                + (f"g{group}" if group > 1 else "") + (f"b{min_blocks}" if min_blocks > 1 else "")
                + ("+fc" if full else "") + ("+cw" if weights else "") + ("+smem" if staged else ""))
        r["dx_points"][name] = {
            "us": probe_us(lambda: fdx(dy, x, *stats, gamma, *got)), "rel_err": rel_err(got, want)}
    return r


def small_calls(norm: str, h: int, rows_list, wgrad_splits=()) -> list:
    """Whole backward calls of few rows at every T the key's kernel holds (runtime.dx_for's
    choices, forced one at a time, the decode backward off), and through the decode backward
    (runtime.decode_bwd_rows, forced at any rows; again with all its wgrad kernels split each
    of the ``wgrad_splits`` ways, "decode@CxLxU"), against what the runtime picks."""
    from tvmnorm import runtime
    from tvmnorm.build import DECODE_PARTS, SMALL_DX_CHUNK_ROWS
    key = NormKey(norm=norm, stage="bwd", hidden_size=h)
    k = REGISTRY.get(key, "cuda")
    own = k.own_chunk_rows()
    pick, decode_rows, decode = runtime.dx_chunk_rows, runtime.decode_bwd_rows, k._decode
    ways = {"decode": decode} if decode else {}
    for w in wgrad_splits if decode else ():
        f = wgrad_variant(key, *w)
        ways[f"decode@{'x'.join(map(str, w))}"] = {**decode, **{p: f for p in DECODE_PARTS if p != "dx"}}
    out = []
    for rows in rows_list:
        dy, x, stats, gamma, s = bwd_inputs(norm, rows, h)
        want = [torch.empty_like(x)] + [torch.empty(h, device="cuda").bfloat16() for _ in range(s)]
        k(dy, x, *stats, gamma, *want)
        want = [w.float() for w in want]
        r = {"norm": norm, "hidden": h, "rows": rows, "own_T": own,
             "picked_T": "decode" if k.decodes(rows) else k.dx_for(rows)[0], "T": {}}
        try:
            for t in sorted({own, *SMALL_DX_CHUNK_ROWS}) + list(ways):
                if t in ways:
                    k._decode, runtime.dx_chunk_rows = ways[t], pick
                    runtime.decode_bwd_rows = lambda _: max(rows_list)
                else:
                    runtime.dx_chunk_rows, k._decode = (lambda *_, t=t: t), {}  # whatever the rule's arguments
                got = [torch.full_like(w, float("nan"), dtype=torch.bfloat16) for w in want]
                k(dy, x, *stats, gamma, *got)
                r["T"][t] = {"us": probe_us(lambda: k(dy, x, *stats, gamma, *got)), "rel_err": rel_err(got, want)}
        finally:
            runtime.dx_chunk_rows, runtime.decode_bwd_rows, k._decode = pick, decode_rows, decode
        out.append(r)
    return out


def main():
    ap = probe_parser()
    ap.add_argument("--finalize", default="", help="other finalize splits to time, COLUMNSxLANES[xUNROLL], "
                    "e.g. 8x64,16x32x8 (unroll: sched.default.FINALIZE_UNROLL unless given)")
    ap.add_argument("--dx", default="", help="the default dx with THREADSxPREFETCHxSTAGES[xBITS[xGROUP[xMINB[xFULL[xCW[xSMEM]]]]]] "
                    "threads per row, rows per group, groups in flight (0: the default's), row-count bits (64 unless "
                    "given; 32: int32 index math, as tuning candidates get it), rows per row reduction (1 unless "
                    "given), blocks an SM must hold (1 unless given), 1 to walk whole chunks without row guards "
                    "(0 unless given), 1 to load gamma once a chunk lane (chunk_weights; 0 unless given) and 1 to "
                    "stage the rows in shared memory by cp.async (staged; needs >= 2 groups in flight), e.g. "
                    "512x0x0,0x1x2,0x0x0x32,0x0x1x32x2,0x0x0x32x1x2,0x0x0x32x1x1x1,0x0x0x32x1x1x0x1,0x1x3x32x1x1x0x0x1 "
                    "(run with a --no-tuned library: checked against its dx)")
    ap.add_argument("--dtype", default="bf16", help="itype = wtype = otype of the keys: bf16, fp16 or fp32")
    ap.add_argument("--chunk-rows", default="", help="also the whole call under the default rule at these T, "
                    "e.g. 32,64 (run with a --no-tuned library: checked against its call)")
    ap.add_argument("--small-rows", default="", help="only whole calls of these rows at every T the kernel holds, "
                    "e.g. 1,64,256,1024 (bwd-small.json)")
    ap.add_argument("--wgrad", default="", help="with --small-rows, also the decode backward with its wgrad split "
                    "these ways, COLUMNSxLANES[xUNROLL], e.g. 32x16,64x8x4")
    ap.add_argument("--stream-ab", default="", help="only the committed record of each backward key with its dx "
                    "stream mode made each of these, e.g. 0,1,3: whole call, dx alone and the tuner's measure "
                    "(bwd-stream-ab.json)")
    ap.add_argument("--record-t", default="", help="only the committed record of each backward key with its dx at "
                    "chunks of these T besides its own, e.g. 40,48,96 (bwd-record-t.json)")
    ap.add_argument("--records", default=None, help="with --stream-ab or --record-t, the schedules folder to take the records "
                    "from (default: the committed schedules/)")
    args = ap.parse_args()
    if args.small_rows:
        return small_main(args)
    if args.stream_ab:
        return stream_main(args)
    if args.record_t:
        return record_t_main(args)
    variants = splits(args.finalize)
    # THREADSxPREFETCHxSTAGES, then BITS (64), GROUP (1), MINB (1), FULL (0), CW (0) and SMEM (0) where not given
    fields = [[int(v) for v in c.split("x")] for c in args.dx.split(",") if c]
    dx_points = [tuple(f + [64, 1, 1, 0, 0, 0][len(f) - 3:]) for f in fields]
    ceiling = copy_roofline("cuda", probe_timer())["copy_gbps"]
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    out = []
    for norm in args.norms.split(","):
        for h in (int(v) for v in args.hidden.split(",")):
            r = measure(norm, h, ceiling, variants, dx_points, [int(t) for t in args.chunk_rows.split(",") if t],
                        args.dtype)
            out.append(r)
            print(f"{norm:9s} {args.dtype} H={h:5d} P={r['partials']:6d} dx {r['dx_us']:7.1f}  finalize {r['finalize_us']:6.1f}  "
                  f"combine+finalize {r['combine_us']:5.1f}+{r['finalize_mid_us']:4.1f}  call {r['call_us']:7.1f} "
                  f"(frac {r['frac']:.3f})" + "".join(f"  {k} {v['us']:.1f} (err {v['rel_err']:.0e})"
                                                      for k, v in r["finalize_variants"].items())
                  + "".join(f"  dx@{k} {v['us']:.1f} (err {v['rel_err']:.0e})" if "us" in v else f"  dx@{k} refused"
                            for k, v in r["dx_points"].items())
                  + "".join(f"  call@T{t} {v['us']:.1f} (err {v['rel_err']:.0e})" for t, v in r["default_T"].items()),
                  flush=True)
    meta = probe_meta(ceiling)
    pathlib.Path(args.out, "bwd-parts.json").write_text(json.dumps({"meta": meta, "records": out}, indent=1))


def record_at_t(norm: str, h: int, ts, records: dict, dtype: str = "bf16") -> dict:
    """The committed record of a backward key with its dx at chunks of each T (its own first),
    compiled here (the int32-row dx the library serves 16384 tokens with, and finalize), each
    checked against gpu_check's float64 reference on its inputs (statistics of x as the forward
    saves them) and timed as the dx alone and as dx + finalize."""
    from gpu_check import make_inputs, reference  # bench/, beside this script
    from tvmnorm.tune import dx_finalize_kernels, with_chunk_rows
    key = NormKey(norm=norm, stage="bwd", itype=dtype, wtype=dtype, otype=dtype, hidden_size=h)
    record = records.get(key.pack())
    r = {"norm": norm, "dtype": dtype, "hidden": h, "T": {}}
    if record is None or "dx" not in record.get("parts", {}):
        r["skipped"] = "no record with a dx trace"
        return r
    rows, s = train_rows(h), key.column_sums
    inputs = make_inputs(key, rows, "cuda", 1e-5)
    dy, x, gamma = inputs["dy"], inputs["x"], inputs["gamma"]
    stats = [inputs["mu"], inputs["rsigma"]] if s == 2 else [inputs["rsigma"]]
    ref = reference(key, inputs, 1e-5)
    want = [ref[n] for n in ("dx", "dgamma", "dbeta")[:1 + s]]
    own = record["rows_per_partial"]
    r.update(rows=rows, own_T=own)
    sizes = list(dict.fromkeys([own, *ts]))
    for t, pair in zip(sizes, dx_finalize_kernels(key, [with_chunk_rows(record, t) for t in sizes])):
        if isinstance(pair, Exception):
            raise pair
        dx_f, fin = pair
        part = torch.full((s, partials(rows, key, "cuda", t), h), float("nan"), device="cuda")
        got = [torch.full_like(x, float("nan"))] + [torch.full_like(gamma, float("nan")) for _ in range(s)]
        dx_f(dy, x, *stats, gamma, got[0], part)
        fin(part, *got[1:])
        r["T"][t] = {"partials": part.shape[1], "rel_err": [rel_err([g], [w]) for g, w in zip(got, want)],
                     "dx_us": probe_us(lambda: dx_f(dy, x, *stats, gamma, got[0], part)),
                     "dx_finalize_us": probe_us(lambda: (dx_f(dy, x, *stats, gamma, got[0], part), fin(part, *got[1:])))}
    return r


def record_t_main(args):
    from tvmnorm.tune import load_records
    ts = [int(v) for v in args.record_t.split(",")]
    records = load_records("cuda", args.records) if args.records else load_records("cuda")
    ceiling = copy_roofline("cuda", probe_timer())["copy_gbps"]
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    out = []
    for norm in args.norms.split(","):
        for h in (int(v) for v in args.hidden.split(",")):
            r = record_at_t(norm, h, ts, records, args.dtype)
            out.append(r)
            size = 3 * r.get("rows", 0) * h * DTYPE_BYTES[args.dtype] / 1e3 / ceiling
            print(f"{norm:9s} H={h:5d} record T {r.get('own_T')}: " + (r.get("skipped") or "".join(
                f"\n  T={t:4d} P={v['partials']:5d} dx {v['dx_us']:6.1f} ({size / v['dx_us']:.3f})"
                f"  dx+finalize {v['dx_finalize_us']:6.1f} ({size / v['dx_finalize_us']:.3f})"
                f"  err {' '.join(f'{e:.1e}' for e in v['rel_err'])}" for t, v in r["T"].items())), flush=True)
    pathlib.Path(args.out, "bwd-record-t.json").write_text(json.dumps({"meta": probe_meta(ceiling), "records": out},
                                                                      indent=1))


def stream_ab(norm: str, h: int, modes, records: dict, dtype: str = "bf16", sets: int = 4) -> dict:
    """The record of a backward key with its dx STREAM decision made each of ``modes``
    (tune.with_stream), checked against the library's call and timed every way the tune and
    the library part: as a whole call and as its dx kernel alone, each twice in turn (ABAB),
    and the whole call rotating over ``sets`` input sets as the bench times it; the search's
    own candidate (the static-row tuning function, tune.tuner_calls) under the bench's timer,
    on one set and rotating; and the search's measure itself (tune.tuner_us: cold calls under
    TVM's time_evaluator, with the partial sums' fixed cost, without it, and without it after
    a warm-up). Where the tune's ranking and the library's part, these columns say whether the
    kernel (static rows against symbolic), the timer or the data moves it."""
    from tvmnorm.measure import InProcessRunner
    from tvmnorm.runtime import record_kernel
    from tvmnorm.tune import stream_decision, stream_mode, tuner_calls, tuner_us, with_stream
    key = NormKey(norm=norm, stage="bwd", itype=dtype, wtype=dtype, otype=dtype, hidden_size=h)
    record = records.get(key.pack())
    r = {"norm": norm, "dtype": dtype, "hidden": h, "modes": {}}
    if stream_decision(record, "dx") is None:
        r["skipped"] = "no record with a dx stream decision"
        return r
    rows = train_rows(h)
    inputs = [bwd_inputs(norm, rows, h, dtype) for _ in range(sets)]
    dy, x, stats, gamma, s = inputs[0]
    want = [torch.empty_like(x)] + [torch.empty_like(gamma) for _ in range(s)]
    REGISTRY.get(key, "cuda")(dy, x, *stats, gamma, *want)
    want = [w.float() for w in want]
    swapped = {mode: with_stream(record, mode, "dx") for mode in modes}
    kernels = {mode: record_kernel(key, "cuda", rec, f"stream{mode}") for mode, rec in swapped.items()}
    r.update(rows=rows, sets=sets, record_stream=stream_mode(record, "dx"))
    static = {}
    for mode, k in kernels.items():
        got = [torch.full_like(x, float("nan"))] + [torch.full_like(gamma, float("nan")) for _ in range(s)]
        k(dy, x, *stats, gamma, *got)
        static[mode] = tuner_calls(key, swapped[mode], "dx", sets=sets)
        r["modes"][mode] = {
            "rel_err": rel_err(got, want), "call_us": [], "dx_us": [], "static_us": [],
            "tuner_us": tuner_us(key, swapped[mode], "dx"),
            "tuner_dx_us": tuner_us(key, swapped[mode], "dx", partial_sums=False),
            "tuner_warm_dx_us": tuner_us(key, swapped[mode], "dx", partial_sums=False,
                                         runner=InProcessRunner("cuda", warmup_ms=50))}
    # every mode has the record's T: one set of outputs and partials serves them all
    dx, grads = torch.empty_like(x), [torch.empty_like(gamma) for _ in range(s)]
    part = torch.empty(s, partials(rows, key, "cuda", kernels[modes[0]].chunk_rows), h, device="cuda")
    for _ in range(2):
        for mode, k in kernels.items():
            f, m = k.parts_for(rows), r["modes"][mode]
            m["call_us"].append(probe_us(lambda: k(dy, x, *stats, gamma, dx, *grads)))
            m["dx_us"].append(probe_us(lambda: f["dx"](dy, x, *stats, gamma, dx, part)))
            m["static_us"].append(probe_us(static[mode][0]))
    for mode, k in kernels.items():
        m = r["modes"][mode]
        m["call_rot_us"] = probe_timer()([lambda i=i: k(i[0], i[1], *i[2], i[3], dx, *grads) for i in inputs])[0]
        m["static_rot_us"] = probe_timer()(static[mode])[0]
    return r


def stream_main(args):
    from tvmnorm.tune import load_records
    modes = [int(v) for v in args.stream_ab.split(",")]
    records = load_records("cuda", args.records) if args.records else load_records("cuda")
    ceiling = copy_roofline("cuda", probe_timer())["copy_gbps"]
    out = []
    for norm in args.norms.split(","):
        for h in (int(v) for v in args.hidden.split(",")):
            r = stream_ab(norm, h, modes, records, args.dtype)
            out.append(r)
            print(f"{norm:9s} H={h:5d} record stream {r.get('record_stream')}: " + (r.get("skipped") or "".join(
                f"\n  stream{m} call {min(v['call_us']):6.1f} rotating {v['call_rot_us']:6.1f}  dx {min(v['dx_us']):6.1f}"
                f"  static dx {min(v['static_us']):6.1f} rotating {v['static_rot_us']:6.1f}  tuner {v['tuner_us']:6.1f}"
                f" dx {v['tuner_dx_us']:6.1f} warm {v['tuner_warm_dx_us']:6.1f} (err {v['rel_err']:.0e})"
                for m, v in r["modes"].items())), flush=True)
    pathlib.Path(args.out, "bwd-stream-ab.json").write_text(json.dumps({"meta": probe_meta(ceiling), "records": out},
                                                                       indent=1))


def splits(spec: str) -> list:
    """COLUMNSxLANES[xUNROLL],...: (columns, lanes, unroll) each, FINALIZE_UNROLL unless given."""
    return [(tuple(int(v) for v in c.split("x")) + (FINALIZE_UNROLL,))[:3] for c in spec.split(",") if c]


def small_main(args):
    rows_list = [int(v) for v in args.small_rows.split(",")]
    wgrad_splits = splits(args.wgrad)
    out = []
    for norm in args.norms.split(","):
        for h in (int(v) for v in args.hidden.split(",")):
            for r in small_calls(norm, h, rows_list, wgrad_splits):
                out.append(r)
                print(f"{norm:9s} H={h:5d} rows={r['rows']:6d} picked T={r['picked_T']!s:>6s} "
                      + "  ".join(f"T{t} {v['us']:6.1f} (err {v['rel_err']:.0e})" for t, v in r["T"].items()),
                      flush=True)
    pathlib.Path(args.out, "bwd-small.json").write_text(json.dumps({"meta": probe_meta(None), "records": out}, indent=1))


if __name__ == "__main__":
    main()
