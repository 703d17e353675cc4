"""Lease 49 probe, built here (no GPU): the layernorm backward's fused dx kernel with its running
dgamma/dbeta sums moved from registers into shared memory, laid out sum-major
(part_sm[k * threads + threadIdx.x]: each thread owns its column of slots, so no barrier is
needed and a warp's accesses hit 32 banks), by a rewrite of TVM's generated CUDA, against the
same points with the sums in registers. The point: ptxas puts the layernorm dx at 118-128
registers a thread at 512 threads (one block an SM, 16 warps), and under a 64-register cap
(two blocks) it spills 320-1100 bytes; with the sums in shared memory some points fit 64
registers without spills. Writes <out>/<tag>.cubin and <out>/points.json for shared_sums_probe.py.

    python bench/results/h200-run49/shared_sums_gen.py OUT_DIR
"""
import json
import pathlib
import re
import subprocess
import sys

sys.path.insert(0, "tests")
from conftest import generated_cuda  # noqa: E402
from tvmnorm import NormKey  # noqa: E402
from tvmnorm.build import scheduled_funcs  # noqa: E402
from tvmnorm.sched.rows import CudaRowConfig  # noqa: E402
from tvmnorm.tune import load_records  # noqa: E402

out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
KERNEL = re.compile(r'extern "C" __global__ void __launch_bounds__\((\d+)(?:, \d+)?\) (\w+_dx_kernel)\(')


def dx_kernel(src):
    """(declarations, the dx kernel's definition, threads, name) of a generated module."""
    defs = list(KERNEL.finditer(src))
    m = defs[-1]  # the last match is the definition (the first ones are forward declarations)
    end = src.find('extern "C" __global__', m.end())
    head = src[:src.index('extern "C" __global__')]
    return head, src[m.start():end if end > 0 else None], int(m.group(1)), m.group(2)


def to_shared(body, threads, min_blocks):
    n = int(re.search(r"float part_local_ptr\[(\d+)\]", body).group(1))
    body = re.sub(r"alignas\(64\) float part_local_ptr\[\d+\];", "extern __shared__ float part_sm[];", body)
    body = re.sub(r"part_local_ptr\[([^\]]+)\]", rf"part_sm[(\1) * {threads} + threadIdx.x]", body)
    return re.sub(r"__launch_bounds__\((\d+)(, \d+)?\)", rf"__launch_bounds__(\1, {min_blocks})", body, count=1), n


def ptxas(code, tag):
    (out / f"{tag}.cu").write_text(code)
    r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(out / f"{tag}.cubin"),
                        str(out / f"{tag}.cu")], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    regs = int(re.search(r"Used (\d+) registers", r.stderr).group(1))
    spill = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", r.stderr))
    return regs, spill


POINTS = {  # hidden -> (threads, vec, prefetch, chunk_weights)
    8192: [(512, 8, 1, False), (512, 8, 1, True), (512, 8, 2, True), (1024, 8, 1, True)],
    7168: [(512, 8, 1, False), (512, 8, 1, True), (896, 8, 1, True)],
    4096: [(512, 8, 1, False), (256, 8, 1, False), (256, 8, 1, True), (512, 8, 1, True)],
    2048: [(256, 8, 1, False), (256, 8, 1, True), (128, 8, 1, False)],
}
records = load_records("cuda")
points = []
for hidden, cfgs in POINTS.items():
    key = NormKey(norm="layernorm", stage="bwd", hidden_size=hidden)
    variants = [("record", None, 1)] + [(c, CudaRowConfig(threads=c[0], vec=c[1], prefetch=c[2], chunk_weights=c[3],
                                                            full_chunks=1, hoist_inits=1), None) for c in cfgs]
    for point, cfg, _ in variants:
        if cfg is None:
            funcs = scheduled_funcs(key, "cuda", records[key.pack()], parts=("dx",))
        else:
            funcs = scheduled_funcs(key, "cuda", row_config=cfg, parts=("dx",))
        head, body, threads, name = dx_kernel(generated_cuda(funcs))
        chunk = {int(t) for t in re.findall(r"\(\(int64_t\)blockIdx\.x\) \* \(int64_t\)(\d+)\)", body) if int(t) < 4096}
        chunk = min(chunk)
        label = "record" if cfg is None else "t{}v{}p{}c{}".format(*(int(v) for v in point))
        for where, mb in (("regs", 1), ("regs", 2), ("shared", 1), ("shared", 2)):
            if where == "regs":
                code = re.sub(r"__launch_bounds__\((\d+)(, \d+)?\)", rf"__launch_bounds__(\1, {mb})", body, count=1)
                nsum = 0
            else:
                code, nsum = to_shared(body, threads, mb)
            tag = f"h{hidden}-{label}-{where}-m{mb}"
            regs, spill = ptxas(head + code, tag)
            points.append({"tag": tag, "hidden": hidden, "point": label, "sums": where, "min_blocks": mb, "name": name,
                           "threads": threads, "chunk": chunk, "smem": 4 * nsum * threads, "regs": regs, "spill": spill})
            print(tag, f"threads={threads} chunk={chunk} regs={regs} spill={spill} smem={4 * nsum * threads}", flush=True)
(out / "points.json").write_text(json.dumps(points, indent=1))
