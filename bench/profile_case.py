"""One benchmark case's calls, for a profiler to watch (Nsight Compute: bench/h200_ncu.sh): the
case is the benchmark's own (tvmnorm.bench: the same inputs, implementations and library), so
what the profiler sees is what bench/h200.sh times.

    TVMNORM_LIBRARY=... python bench/profile_case.py --op layernorm_bwd --hidden 1024 --impl tvmnorm_tuned

Runs the case's first call (which compiles, for torch_compile and Liger), then ``--calls`` more;
ncu's --launch-skip picks a kernel of a later call. With ``--kernels`` it needs no external
profiler: torch.profiler watches the later calls and each kernel's mean GPU time and count per
call are printed, with the call's time between CUDA events, so a slow call shows which launch
costs it (several hidden sizes and implementations in one process:
``--hidden 2048,7168 --impl tvmnorm_tuned,torch_eager --rows 256 --kernels``). With
``--launches DIR`` each kernel's launch shape is printed too (grid, block, registers, shared
memory: torch.profiler's trace) and all of them written to DIR/launches.json, to set a peer's
beside ours; with TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR set to fresh folders, those then hold
the peers' Triton source, PTX and cubin (the twenty-fourth lease read torch.compile's forward so:
bench/results/h200-run24/). With ``--gaps`` the call runs as triton's do_bench times it (an L2
flush, then the call) under torch.profiler, and the GPU timeline says where a call's time goes:
the GPU's idle time from the flush's end to the call's first kernel, the call's kernels, and the
span from the flush's end to its last kernel's end, beside do_bench's own figure (a decode
call's kernel can take the same GPU time as a peer's while do_bench times the call slower).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile
import types

import torch

from tvmnorm.bench import IMPLS, Context, make_cases, make_set


def kernel_table(call, calls: int) -> list:
    """(kernel name, launches per call, mean GPU us) of ``calls`` calls under torch.profiler,
    slowest first, and the call's mean us between CUDA events (no L2 flush: back to back)."""
    from torch.profiler import ProfilerActivity, profile
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        call()
    end.record()
    torch.cuda.synchronize()
    wall = start.elapsed_time(end) * 1e3 / calls
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    rows = [(e.key, e.count / calls, e.device_time_total / e.count) for e in prof.key_averages()
            if str(e.device_type).endswith("CUDA") and e.device_time_total > 0 and e.count]
    return sorted(rows, key=lambda r: -r[1] * r[2]), wall


def flush_gaps(kernels: list, flush_name: str) -> dict:
    """Median us over the calls of a do_bench loop's GPU timeline ``kernels`` ([(name, start us,
    duration us)], each call's kernels after a flush kernel named ``flush_name``): "gap", the GPU
    idle from the flush's end to the call's first kernel's start; "kernels", the call's kernels'
    own time; "span", from the flush's end to the call's last kernel's end."""
    calls, flush_end = [], None
    for name, start, dur in sorted(kernels, key=lambda k: k[1]):
        if name == flush_name:
            flush_end = start + dur
            calls.append([flush_end, None, 0.0, None])
        elif flush_end is not None:
            c = calls[-1]
            c[1] = start if c[1] is None else c[1]
            c[2] += dur
            c[3] = start + dur
    calls = [c for c in calls if c[1] is not None]
    if not calls:
        raise ValueError(f"no call's kernel after a flush ({flush_name}) in the timeline")
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"calls": len(calls), "gap": med([c[1] - c[0] for c in calls]), "kernels": med([c[2] for c in calls]),
            "span": med([c[3] - c[0] for c in calls])}


def kernel_events(prof) -> list:
    """The kernels of torch.profiler ``prof``'s chrome trace (dicts: name, ts, dur, args)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    return [e for e in events if e.get("cat") == "kernel"]


def _timeline(prof) -> list:
    return [(e["name"], e["ts"], e.get("dur", 0.0)) for e in kernel_events(prof)]


def launch_gaps(call, calls: int) -> dict:
    """flush_gaps of ``calls`` iterations of do_bench's loop (a 256 MiB zero_, then the call) under
    torch.profiler, with do_bench's median us of the same call ("do_bench")."""
    from torch.profiler import ProfilerActivity, profile
    from triton.testing import do_bench
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        flush.zero_()
        torch.cuda.synchronize()
    (flush_name,) = {name for name, _, _ in _timeline(prof)}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            call()
        torch.cuda.synchronize()
    return {**flush_gaps(_timeline(prof), flush_name), "do_bench": do_bench(call, quantiles=[0.5]) * 1e3}


LAUNCH_FIELDS = ("grid", "block", "registers per thread", "shared memory", "est. achieved occupancy %")


def launches(call, calls: int) -> list:
    """One dict per kernel name over ``calls`` calls: launches per call, mean GPU us and the
    launch fields of torch.profiler's chrome trace (LAUNCH_FIELDS) of its first launch."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    out = {}
    for e in kernel_events(prof):
        k = out.setdefault(e["name"], {"name": e["name"], "count": 0, "us": 0.0,
                                       **{f: e.get("args", {}).get(f) for f in LAUNCH_FIELDS}})
        k["count"] += 1
        k["us"] += e.get("dur", 0.0)
    for k in out.values():
        k["us"] /= k["count"]
        k["count"] /= calls
    return sorted(out.values(), key=lambda k: -k["us"] * k["count"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", required=True, help="a tvmnorm.bench op, e.g. rmsnorm_bwd, or several: a,b")
    ap.add_argument("--hidden", required=True, help="a hidden size, or several: 2048,7168")
    ap.add_argument("--impl", default="tvmnorm_tuned", help=f"one of {', '.join(IMPLS)}, or several: a,b")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--rows", default="train", help="train, or a token count")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--kernels", action="store_true", help="print each call's kernels and their GPU time")
    ap.add_argument("--launches", metavar="DIR", help="print each kernel's launch shape, write DIR/launches.json")
    ap.add_argument("--gaps", action="store_true",
                    help="time the call as do_bench does (L2 flush, call) under torch.profiler: GPU idle before "
                         "its first kernel, its kernels' time, the span, do_bench's figure")
    args = ap.parse_args()
    unknown = set(args.impl.split(",")) - set(IMPLS)
    if unknown:
        ap.error(f"unknown --impl {', '.join(sorted(unknown))}: one of {', '.join(IMPLS)}")
    ctx = Context("cuda", os.environ.get("TVMNORM_LIBRARY"))
    found = []
    for op, hidden in ((op, hidden) for op in args.op.split(",") for hidden in args.hidden.split(",")):
        (case,) = make_cases(types.SimpleNamespace(ops=op, dtypes=args.dtype, hidden=hidden,
                                                   shapes=None, rows=args.rows, fp8_format="fp8e4m3"))
        s = make_set(case, "cuda", torch.Generator(device="cuda").manual_seed(0))
        for impl in args.impl.split(","):
            try:
                call = IMPLS[impl](ctx, case, [s]).calls[0]
                for _ in range(1 + args.calls):
                    call()
                torch.cuda.synchronize()
            except Exception as e:  # a peer missing here must not cost the other cases
                print(f"{case.op} {case.dtype} H={case.hidden} M={case.rows} {impl}: {type(e).__name__}: {e}")
                continue
            print(f"{case.op} {case.dtype} H={case.hidden} M={case.rows} {impl}: {1 + args.calls} calls")
            if args.kernels:
                table, wall = kernel_table(call, max(args.calls, 20))
                print(f"  call {wall:7.1f} us between events; kernels per call:")
                for name, count, us in table:
                    print(f"  {us:7.1f} us x {count:4.1f}  {name[:110]}")
            if args.gaps:
                g = launch_gaps(call, max(args.calls, 50))
                print(f"  do_bench {g['do_bench']:6.2f} us; after the flush (median of {g['calls']} calls): "
                      f"idle {g['gap']:5.2f} us, kernels {g['kernels']:5.2f} us, span {g['span']:5.2f} us")
            if args.launches:
                for k in launches(call, max(args.calls, 5)):
                    found.append({"op": case.op, "hidden": case.hidden, "rows": case.rows, "impl": impl, **k})
                    print(f"  {k['us']:7.1f} us x{k['count']:.0f} grid {k['grid']} block {k['block']} "
                          f"regs {k['registers per thread']} smem {k['shared memory']} "
                          f"occ {k['est. achieved occupancy %']}  {k['name'][:90]}")
    if args.launches:
        pathlib.Path(args.launches).mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.launches, "launches.json").write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
