"""What a norm call costs the host: tvmnorm's torch ops against torch eager, torch.compile and
Liger at decode rows, calls issued back to back from Python as an eager decode loop issues them.

A decode call's kernel takes a few us of GPU time (bench.py's do_bench figures, which hide the
host behind the L2 flush before each call); without CUDA graphs the loop is bound by the host
time of each call instead. Per case and impl, rounds of ``--calls`` calls in a row, each round
timed twice: until the last call returns (``host_us`` a call: Python, checks, allocation,
launch) and until the device is done too (``wall_us``: the larger of host and GPU time). Each
figure is the best round's; impls take turns round by round so that a slow stretch of the host
falls on all of them.

    python bench/host_overhead.py --out $OUT [--hidden 128,4096] [--tokens 1,8,64,256]
        [--modes fwd,train] [--impls tvmnorm,tvmnorm_kernel,torch_eager,torch_compile,liger]

Modes: ``fwd`` the forward with no autograd (inference); ``train`` the forward with x and the
weights requiring grad, then the backward of y. Impls: ``tvmnorm`` the public functions
(tvmnorm.torch.rms_norm / layer_norm), ``tvmnorm_kernel`` the runtime kernel alone on
preallocated outputs (what is left under the torch layer; fwd only), ``*_graph`` (tvmnorm_graph,
torch_eager_graph) the call captured in a CUDA graph and replayed (fwd only). Rows are the catalog's
decode rows (tokens x heads for QK-norm). Writes host-overhead.json.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time
import warnings

import torch

from tvmnorm.bench import _made_dir, _version, eager_norm, liger_norm
from tvmnorm.shapes import DECODE_ROWS, shape_of

IMPLS = ("tvmnorm", "tvmnorm_kernel", "torch_eager", "torch_compile", "liger", "tvmnorm_graph", "torch_eager_graph")
MODES = ("fwd", "train")


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def norm_fn(impl: str, norm: str, hidden: int):
    """(x, w[, b]) -> y for one impl."""
    import tvmnorm.torch as tn
    ln = norm == "layernorm"
    eps = 1e-5 if ln else 1e-6
    if impl == "tvmnorm":
        return (lambda x, w, b: tn.layer_norm(x, w, b, eps)) if ln else (lambda x, w: tn.rms_norm(x, w, eps))
    if impl == "torch_eager":
        return eager_norm(ln, hidden, eps)
    if impl == "torch_compile":
        from torch import _dynamo
        _dynamo.reset()  # one compile per shape, as bench.py's torch_compile
        return torch.compile(eager_norm(ln, hidden, eps), dynamic=False)
    if impl == "liger":  # the same calls as bench.py's liger impl
        return liger_norm(ln, eps)
    raise ValueError(impl)


def make_call(impl: str, mode: str, norm: str, hidden: int, rows: int, device, dtype):
    """A no-argument function doing one call of the case, on fresh random inputs."""
    if impl.endswith("_graph"):
        if mode != "fwd" or device.type != "cuda":
            return None
        return _graph_replay(make_call(impl[:-len("_graph")], mode, norm, hidden, rows, device, dtype))
    ln = norm == "layernorm"
    x = torch.randn(rows, hidden, device=device, dtype=dtype)
    ws = [torch.randn(hidden, device=device, dtype=dtype) for _ in range(2 if ln else 1)]
    if impl == "tvmnorm_kernel":
        # the runtime's kernels alone (NormKernel's host path) on preallocated outputs: the
        # forward, and in the train mode the backward after it, without autograd
        from tvmnorm.torch import _host
        cuda = device.type == "cuda"
        k = _host.kernel(norm, "fwd", dtype, dtype, dtype, hidden, False, cuda)
        y, stats = torch.empty_like(x), [torch.empty(rows, device=device) for _ in range(2 if ln else 1)]
        eps = 1e-5 if ln else 1e-6
        if mode == "fwd":
            return lambda: k(x, *ws, y, *stats, eps=eps)
        kb = _host.kernel(norm, "bwd", dtype, dtype, dtype, hidden, False, cuda)
        dy, dx, grads = torch.randn_like(x), torch.empty_like(x), [torch.empty_like(w) for w in ws]

        def kernels():
            k(x, *ws, y, *stats, eps=eps)
            kb(dy, x, *stats, ws[0], dx, *grads)
        return kernels
    f = norm_fn(impl, norm, hidden)
    if mode == "fwd":
        def call():
            with torch.no_grad():
                return f(x, *ws)
        return call
    x.requires_grad_(True)
    for w in ws:
        w.requires_grad_(True)
    dy = torch.randn_like(x)

    def step():
        f(x, *ws).backward(dy)
    return step


def _graph_replay(call):
    """``call`` captured in a CUDA graph (warmed up on a side stream first): its replay, what a
    decode loop under CUDA graphs pays a norm."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def time_rounds(calls: dict, device, n: int, rounds: int) -> dict:
    """impl -> (host_us, wall_us): the best of ``rounds`` rounds of ``n`` calls in a row."""
    best = {k: [float("inf"), float("inf")] for k in calls}
    for _ in range(rounds):
        for name, c in calls.items():
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(n):
                c()
            t1 = time.perf_counter()
            _sync(device)
            t2 = time.perf_counter()
            b = best[name]
            b[0], b[1] = min(b[0], (t1 - t0) / n * 1e6), min(b[1], (t2 - t0) / n * 1e6)
    return {k: tuple(v) for k, v in best.items()}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".", type=_made_dir)
    ap.add_argument("--hidden", default="128,1024,4096,7168")
    ap.add_argument("--norms", default="rmsnorm,layernorm")
    ap.add_argument("--tokens", default=",".join(map(str, DECODE_ROWS)),
                    help="tokens a call; rows = tokens x heads (QK-norm 128: 32 heads)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--calls", type=int, default=200, help="calls a round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--name", default="host-overhead")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    impls = [i for i in args.impls.split(",") if i]
    for i in impls:
        if i not in IMPLS:
            raise SystemExit(f"unknown impl {i!r}; known: {', '.join(IMPLS)}")
    warnings.simplefilter("ignore")  # the one-time fallback warning of keys without a tuned kernel
    records = []
    for mode in args.modes.split(","):
        for norm in args.norms.split(","):
            for hidden in (int(h) for h in args.hidden.split(",")):
                for tokens in (int(t) for t in args.tokens.split(",")):
                    rows = shape_of(hidden).rows(tokens)
                    calls, skipped = {}, {}
                    for impl in impls:
                        if impl == "liger" and device.type != "cuda":
                            skipped[impl] = "Liger is GPU-only"
                            continue
                        try:
                            c = make_call(impl, mode, norm, hidden, rows, device, dtype)
                            if c is None:
                                continue
                            for _ in range(20):  # compile, JIT, warm caches
                                c()
                            calls[impl] = c
                        except Exception as e:  # a peer that cannot run here is recorded, not fatal
                            skipped[impl] = f"{type(e).__name__}: {e}"[:300]
                    timed = time_rounds(calls, device, args.calls, args.rounds)
                    for impl, (host, wall) in timed.items():
                        records.append({"mode": mode, "op": f"{norm}_{mode}", "dtype": args.dtype, "hidden": hidden,
                                        "rows": rows, "tokens": tokens, "impl": impl, "host_us": host,
                                        "wall_us": wall})
                    for impl, why in skipped.items():
                        records.append({"mode": mode, "op": f"{norm}_{mode}", "dtype": args.dtype, "hidden": hidden,
                                        "rows": rows, "tokens": tokens, "impl": impl, "skipped": why})
                    print(f"{mode:5s} {norm:9s} H={hidden:5d} rows={rows:5d}  " + "  ".join(
                        f"{i} {h:.1f}/{w:.1f}" for i, (h, w) in timed.items()), flush=True)
    from tvmnorm._tvm import FFI_VERSION, TVM_VERSION
    from tvmnorm.build import source_hash
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "cuda": torch.version.cuda, "liger": _version("liger-kernel"),
            "tvm": TVM_VERSION, "tvm_ffi": FFI_VERSION, "tvmnorm_source_hash": source_hash(),
            "calls_a_round": args.calls, "rounds": args.rounds,
            "method": "best round of back-to-back calls: host_us until the last call returns, wall_us "
                      "until the device is done"}
    path = pathlib.Path(args.out, f"{args.name}.json")
    path.write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    return path


if __name__ == "__main__":
    main()
