"""The decode forward's kernel shape on the GPU: the small-call kernel a library serves decode rows
with (build.small_call_funcs: the default rule's, int32 rows) against other kept-row points of
the forward's space at decode rows, and torch eager and Liger (where installed), each checked
against float64 on fresh random data (outputs poisoned with NaN first) and timed with triton's
do_bench (L2 flushed), rounds in turn, each point at its fastest round.

    python bench/decode_probe.py --out $OUT [--hidden 128,512] [--norms rmsnorm,layernorm] [--rounds 3]
    python bench/decode_probe.py --out $OUT --around-served --hidden 1024,4096,8192 --norms layernorm
    python bench/decode_probe.py --out $OUT --rule-knobs --rounds 4

--rule-knobs times the served kernel against the small-call rule with each of its knobs moved
alone (RULE_KNOBS: bytes of the row a thread, vector width, weights loaded with x, one barrier a
row sum, its warps' sums by shuffles) and the key's default forward.

--around-served times, instead of the sweep, the kernel that serves decode rows (the small-call
kernel: small_call_cuda_heuristic's) and its neighbours in the tuned forward's space: half to
twice its threads (whole warps that split the row evenly among them), the two widest vectors,
with the weights loaded with x (+ew), one barrier a row sum (+ws) and both, one row a block
(sched.space.fwd_kept_variants: the knobs the served rule leaves off). On an H100
(results/h100-run59/) Liger's layernorm forward led the served kernel at 38 of 48 decode
cells by up to 1.8 us.

Points: threads a row x rows a block x vector width (16 or 8 bytes), the row kept in registers
with at most 8 vectors a thread and no idle thread, rows of several warps also with their
weights loaded with x (+ew). A decode call is a few us of launch and DRAM latency (bench.py's
decode cells): which block shape gets its rows' few bytes through fastest is what this asks.
Writes decode-probe.json.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import torch

from tvmnorm import NormKey
from tvmnorm.bench import Timer, copy_roofline, liger_norm, probe_meta, probe_parser, time_in_rounds
from tvmnorm.key import DTYPE_BYTES
from tvmnorm.reference import fwd as reference_fwd
from tvmnorm.runtime import variant_kernel
from tvmnorm.sched.default import fwd_cuda_heuristic, small_call_cuda_heuristic, small_call_shuffles
from tvmnorm.sched.space import EARLY_WEIGHTS_THREADS, ROWS, THREADS, fwd_kept_variants
from tvmnorm.shapes import shape_of


def points(hidden: int, elem_bytes: int = 2) -> dict:
    """name -> CudaRowConfig: the served rule's point ("served") and the kept-row sweep."""
    base = fwd_cuda_heuristic(hidden, elem_bytes)
    out = {"served": base}
    for vec in (16 // elem_bytes, 8 // elem_bytes):
        if hidden % vec:
            continue
        for threads in THREADS:
            per_thread = -(-hidden // (threads * vec))
            if threads * vec > hidden or per_thread > 8:
                continue
            for rows in ROWS:
                if threads * rows > 1024:
                    continue
                cfg = dataclasses.replace(base, threads=threads, rows=rows, vec=vec, keep_row=True, keep_y=False,
                                          early_weights=False, warp_sums=False, full_chunks=0)
                out[f"{threads}x{rows}v{vec}"] = cfg
                if threads >= EARLY_WEIGHTS_THREADS:
                    out[f"{threads}x{rows}v{vec}+ew"] = dataclasses.replace(cfg, early_weights=True)
    return out


def around_served(key: NormKey) -> dict:
    """name -> CudaRowConfig: the small-call kernel a library serves ``key``'s decode rows with
    ("served") and its neighbours at one row a block (see the module's --around-served): the
    tuned forward's kept-row variants (space.fwd_kept_variants) of half to twice its threads."""
    served = small_call_cuda_heuristic(key.hidden_size, DTYPE_BYTES[key.itype])
    out = {"served": served}
    if not served.keep_row:
        return out
    for threads, vec, _, ws, ew, shfl in fwd_kept_variants(key):
        # the rule decides the shuffles (small_call_shuffles): the space's twin with them is the same point
        if not shfl and served.threads // 2 <= threads <= 2 * served.threads:
            cfg = dataclasses.replace(served, threads=threads, rows=1, vec=vec, early_weights=ew, warp_sums=ws,
                                      shuffle_sums=small_call_shuffles(threads, ws))
            if cfg != served:
                out[f"{threads}x1v{vec}" + "+ew" * ew + "+ws" * ws] = cfg
    return out


# The small-call rule's knobs (sched.default.small_call_cuda_heuristic's keyword arguments), each
# moved alone from the rule's own value: --rule-knobs times these points.
RULE_KNOBS = {"8B": dict(thread_bytes=8), "32B": dict(thread_bytes=32), "64B": dict(thread_bytes=64),
              "v16B": dict(vector_bytes=16), "+ew": dict(early_weights=True), "-ws": dict(warp_sums=False),
              "+shfl": dict(shuffle_warps=1), "-shfl": dict(shuffle_warps=33)}


def rule_knobs(key: NormKey) -> dict:
    """name -> CudaRowConfig: the small-call kernel a library serves ``key``'s decode rows with
    ("served"), the same rule with each knob of RULE_KNOBS moved, and the key's default forward
    ("forward": until session 59 it served them too, at one row a block), each distinct kernel
    once."""
    h, b = key.hidden_size, DTYPE_BYTES[key.itype]
    out = {"served": small_call_cuda_heuristic(h, b)}
    for name, knobs in {**RULE_KNOBS, "forward": None}.items():
        cfg = fwd_cuda_heuristic(h, b) if knobs is None else small_call_cuda_heuristic(h, b, **knobs)
        if cfg not in out.values():
            out[name] = cfg
    return out


def main():
    ap = probe_parser()
    ap.set_defaults(hidden="128,512")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--around-served", action="store_true",
                    help="the served small-call kernel and its neighbours instead of the block-shape sweep")
    ap.add_argument("--rule-knobs", action="store_true",
                    help="the served small-call kernel against its rule with each knob moved (RULE_KNOBS)")
    args = ap.parse_args()
    # shorter than probe_timer's 25/100 ms: ~50 points a case, and a decode call is ~5 us
    timer = Timer("cuda", warmup_ms=10, rep_ms=40)
    ceiling = copy_roofline("cuda", timer)["copy_gbps"]
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    F = torch.nn.functional
    results = []
    meta = probe_meta(ceiling)
    for norm in args.norms.split(","):
        for h in (int(v) for v in args.hidden.split(",")):
            key = NormKey(norm=norm, hidden_size=h)
            ln = norm == "layernorm"
            eps = 1e-5 if ln else 1e-6
            kernels, failed = {}, {}
            sweep = (rule_knobs(key) if args.rule_knobs else around_served(key) if args.around_served
                     else points(h, DTYPE_BYTES[key.itype]))
            for name, cfg in sweep.items():
                try:
                    kernels[name] = variant_kernel(key, "cuda", cfg, row_bits=32)
                except Exception as e:  # a point the schedule refuses is recorded, not fatal
                    failed[name] = f"{type(e).__name__}: {e}"[:200]
            for rows in shape_of(h).decode_rows:
                x = torch.randn(rows, h, device="cuda").bfloat16()
                gamma = (torch.rand(h, device="cuda") + 0.5).bfloat16()
                beta = [torch.randn(h, device="cuda").bfloat16()] if ln else []
                ref = torch.from_numpy(reference_fwd(norm, x.cpu(), gamma.cpu(), *[b.cpu() for b in beta])["y"]).cuda()
                y = torch.empty(rows, h, device="cuda", dtype=torch.bfloat16)
                stats = [torch.empty(rows, device="cuda") for _ in range(2 if ln else 1)]
                calls, errors = {}, {}
                for name, k in kernels.items():
                    y.fill_(float("nan"))
                    k(x, gamma, *beta, y, *stats, eps=eps)
                    torch.cuda.synchronize()
                    err = float(((y.double() - ref.double()).abs() / (ref.double().abs() + 1e-2)).max())
                    errors[name] = err
                    if err < 2 ** -6:  # bf16 output: a wrong point is reported, never timed
                        calls[name] = (lambda k=k: k(x, gamma, *beta, y, *stats, eps=eps))
                calls["torch_eager"] = ((lambda: F.layer_norm(x, (h,), gamma, beta[0], eps)) if ln
                                        else (lambda: F.rms_norm(x, (h,), gamma, eps)))
                try:
                    liger = liger_norm(ln, eps)
                    calls["liger"] = lambda: liger(x, gamma, *beta)
                except ImportError:
                    pass
                best = time_in_rounds(calls, timer, args.rounds)
                ranked = sorted(best.items(), key=lambda kv: kv[1])
                results.append({"norm": norm, "hidden": h, "rows": rows, "us": best, "rel_err": errors,
                                "failed": failed})
                print(f"{norm:9s} H={h:5d} rows={rows:5d} served {best.get('served', float('nan')):.2f} "
                      f"eager {best['torch_eager']:.2f} liger {best.get('liger', float('nan')):.2f} | "
                      + "  ".join(f"{n} {u:.2f}" for n, u in ranked[:8]), flush=True)
                # after each case: a call cut off by its time limit keeps what it timed
                pathlib.Path(args.out, "decode-probe.json").write_text(
                    json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
