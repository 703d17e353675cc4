"""Static SASS instruction counts of row kernels, with and without full_chunks: what nvcc makes
of a point of the space once the row guards are gone, without a GPU.

    python bench/sass_counts.py [--cuobjdump PATH] > counts.txt
    python bench/sass_counts.py --knob chunk_weights     # the dx points with and without another knob
    python bench/sass_counts.py --records bwd            # registers/spills of the committed records
    python bench/sass_counts.py --variants layernorm:2048  # ... of every fused dx variant of a key
    python bench/sass_counts.py --layouts layernorm:8192     # ... of every unstaged point, held or not
    python bench/sass_counts.py --forward-ops 128,1024,4096  # the committed forwards, bf16 and fp8 out
    python bench/sass_counts.py --paired                  # fp8 forwards casting y in pairs or not

Each point's kernel (the int32-row copy the library serves, as a tuning candidate compiles) goes
through nvcc -cubin for sm_90; cuobjdump -sass lists its instructions. A full_chunks kernel holds
the walk twice (unguarded, then guarded for the last chunk), so its unguarded version is counted
alone: the test before it is made always true and nvcc drops the other. The dx points are the
layernorm 8192 record's shape and the default's elsewhere; the forward points are the hidden-128
records' shapes. With --knob, the dx points are counted with that CudaRowConfig field off and
on (their own full_chunks kept), and the load instructions (LDG) apart. No triton or GPU needed
(cuobjdump ships with the CUDA toolkit; the triton wheel carries one too: `pip download --no-deps
triton==3.6.0`, then unzip triton/backends/nvidia/bin/ from it: cuobjdump runs the nvdisasm there,
which must be on PATH). --records, --variants and --layouts need nvcc alone.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import pathlib
import re
import shutil
import subprocess
import tempfile

from tvmnorm import NormKey
from tvmnorm.build import compile_funcs, narrow_prefix, scheduled_funcs
from tvmnorm.sched.rows import CudaRowConfig

POINTS = [
    (NormKey(norm="layernorm", stage="bwd", hidden_size=8192), CudaRowConfig(threads=512, vec=4, prefetch=2), "dx"),
    (NormKey(norm="layernorm", stage="bwd", hidden_size=7168), CudaRowConfig(threads=512, vec=8), "dx"),
    (NormKey(stage="bwd", hidden_size=8192), CudaRowConfig(threads=512, vec=8), "dx"),
    (NormKey(norm="layernorm", stage="bwd", hidden_size=1024), CudaRowConfig(threads=128, vec=8, prefetch=2), "dx"),
    (NormKey(hidden_size=128), CudaRowConfig(threads=16, rows=2, vec=8, keep_row=True), "fwd"),
    (NormKey(norm="layernorm", hidden_size=128), CudaRowConfig(threads=16, rows=2, vec=8, keep_row=True), "fwd"),
]


def source(key: NormKey, cfg: CudaRowConfig, part: str) -> str:
    funcs = scheduled_funcs(key, "cuda", row_config=cfg, row_bits=32, prefix=narrow_prefix(key), parts=[part])
    return compile_funcs(funcs, "cuda").mod.imports[0].inspect_source()


def unguarded_only(src: str) -> str:
    """The kernel with the full_chunks test made true: nvcc keeps the unguarded version alone."""
    out, n = re.subn(r"if \(([^{};]*?) < n\) \{(\n\s*(for|alignas|int|float|\*))", r"if (1) {\2", src, count=1)
    if n != 1:
        raise ValueError("no full_chunks test found")
    return out


def cubin(src: str, work: pathlib.Path) -> tuple:
    """(the cubin's path, kernel -> (registers, stack frame, spill stores, spill loads) in bytes as
    ptxas -v reports them) of CUDA source ``src`` built for sm_90."""
    cu, out = work / "k.cu", work / "k.cubin"
    cu.write_text(src)
    ptxas = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-O3", "-Xptxas", "-v", "-o", str(out), str(cu)],
                           capture_output=True, text=True, check=True).stderr
    usage = {}
    for name, body, regs in re.findall(r"Compiling entry function '(\w+)'(.*?)Used (\d+) registers", ptxas, re.S):
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", body)
        usage[name] = (int(regs), *(int(v) for v in (frame.groups() if frame else (0, 0, 0))))
    return out, usage


def count(src: str, part: str, cuobjdump: str, work: pathlib.Path) -> tuple:
    path, usage = cubin(src, work)
    sass = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    body = next(f for f in re.split(r"\n\s+Function : ", sass)[1:] if f.split("\n")[0].endswith(f"_{part}_kernel"))
    ops = [re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].split(".")[0]
           for i in re.findall(r"/\*[0-9a-f]{4}\*/\s+([^;]*);", body)]
    regs, _, spills, _ = next(u for name, u in usage.items() if name.endswith(f"_{part}_kernel"))
    return len(ops), collections.Counter(ops), regs, spills


def record_usage(stage: str, work: pathlib.Path) -> None:
    """Registers and spills of the row kernels (fwd, dx; the int32-row copy a library serves
    first) of every committed bf16 CUDA record of ``stage``, as its library compiles them."""
    from tvmnorm.build import key_funcs
    from tvmnorm.tune import load_records
    for packed, record in sorted(load_records("cuda").items()):
        key = NormKey.unpack(packed)
        if key.stage != stage or key.itype != "bf16" or key.fp8_out:
            continue
        _, usage = cubin(compile_funcs(key_funcs(key, "cuda", record), "cuda").mod.imports[0].inspect_source(), work)
        rows = [(name[len(key.name) + 1:-len("_kernel")], u) for name, u in usage.items()
                if re.fullmatch(rf"{key.name}_(narrow_)?(fwd|dx)_kernel", name)]
        t = f" T {record['rows_per_partial']}" if "rows_per_partial" in record else ""
        print(f"{key.name}{t}: " + "; ".join(f"{part} {regs} registers, {frame} B stack, {stores}/{loads} B spilled "
                                             f"(stores/loads)" for part, (regs, frame, stores, loads) in sorted(rows)),
              flush=True)


def variant_usage(spec: str, work: pathlib.Path) -> None:
    """Registers and spills of every structural variant of the fused dx (sched.space.
    fused_cuda_variants: the points the space offers, at the default unroll and min_blocks)
    of the bf16 backward key ``spec`` (NORM:HIDDEN), the staged ones too (whether or not the
    space holds them: space.STAGED), beside the registers space.fused_registers counts for its
    sums and rows (a staged variant's registers hold one group), which the space's register
    limit prunes by."""
    from tvmnorm.sched.space import fused_cuda_variants, fused_registers
    norm, hidden = spec.split(":")
    key = NormKey(norm=norm, stage="bwd", hidden_size=int(hidden))
    for threads, vec, prefetch, stages, weights, staged in fused_cuda_variants(key, staged=True):
        cfg = CudaRowConfig(threads=threads, vec=vec, prefetch=prefetch, stages=stages, chunk_weights=weights,
                            staged=staged)
        per_thread = -(-key.hidden_size // (threads * vec)) * vec
        model = fused_registers(key.column_sums, per_thread, prefetch, 2, 1 if staged else stages, 2 if weights else 0)
        _, usage = cubin(source(key, cfg, "dx"), work)
        (regs, _, stores, loads), = [u for name, u in usage.items() if name.endswith("_dx_kernel")]
        print(f"{key.name} dx {threads}x{vec} prefetch {prefetch} stages {stages} chunk_weights {int(weights)}"
              + (" staged" if staged else "") + ": "
              f"{per_thread} elements a thread, fused_registers {model}, ptxas {regs} registers, spilled "
              f"{stores}/{loads} B", flush=True)


def layout_usage(specs: str, work: pathlib.Path) -> None:
    """Registers and spills of every unstaged fused dx point of the bf16 backward keys ``specs``
    (NORM:HIDDEN,...): each thread layout the space offers (space._fused_layouts), prefetch,
    stages and chunk_weights, whether or not the register limit admits it, at the default unroll
    and min_blocks; what fused_register_limit's allowance for addresses is chosen by. ``vectors``
    counts the vectors of the row a thread holds, ``held`` whether the space holds the point."""
    from tvmnorm.compute.norms import CUDA_CHUNK_ROWS
    from tvmnorm.sched import space
    for spec in specs.split(","):
        norm, hidden = spec.split(":")
        key = NormKey(norm=norm, stage="bwd", hidden_size=int(hidden))
        held = set(space.fused_cuda_variants(key, staged=False))
        for threads, vec, per_thread, _ in space._fused_layouts(key):
            for prefetch in space.PREFETCH:
                for stages in space.STAGES if prefetch in space.PIPELINED_PREFETCH else (1,):
                    if any(t % prefetch for t in CUDA_CHUNK_ROWS) or stages * prefetch > min(CUDA_CHUNK_ROWS):
                        continue
                    limit = space.fused_register_limit(threads, vectors=per_thread // vec, rows=prefetch * stages)
                    for weights in (False, True):
                        model = space.fused_registers(key.column_sums, per_thread, prefetch, 2, stages,
                                                      2 if weights else 0)
                        cfg = CudaRowConfig(threads=threads, vec=vec, prefetch=prefetch, stages=stages,
                                            chunk_weights=weights)
                        _, usage = cubin(source(key, cfg, "dx"), work)
                        (regs, _, stores, loads), = [u for name, u in usage.items() if name.endswith("_dx_kernel")]
                        print(f"{key.name} dx {threads}x{vec} vectors {per_thread // vec} prefetch {prefetch} "
                              f"stages {stages} chunk_weights {int(weights)}: fused_registers {model}, limit {limit}, "
                              f"held {int((threads, vec, prefetch, stages, weights, False) in held)}, ptxas {regs} "
                              f"registers, spilled {stores}/{loads} B", flush=True)


def forward_ops(widths: str, cuobjdump: str, work: pathlib.Path) -> None:
    """Static instructions of the forward kernel a library serves a training call with (the
    int32-row copy of the committed record's, else the default rule's) for rmsnorm and layernorm
    with bf16 and fp8e4m3 output at each of ``widths``, over the elements a thread handles
    (hidden / threads a row): where the fp8 layernorm forward's time goes past its bytes'."""
    from tvmnorm.build import key_funcs
    from tvmnorm.tune import load_records
    records = load_records("cuda")
    for hidden in map(int, widths.split(",")):
        for norm in ("rmsnorm", "layernorm"):
            for otype in ("bf16", "fp8e4m3"):
                key = NormKey(norm=norm, hidden_size=hidden, otype=otype)
                record = records.get(key.pack())
                funcs = key_funcs(key, "cuda", record)
                name = f"{narrow_prefix(key)}_fwd"
                src = compile_funcs({name: funcs[name]}, "cuda").mod.imports[0].inspect_source()
                block = int(re.search(r"__launch_bounds__\((\d+)", src).group(1))
                rows = re.search(r"blockIdx\.x\) \* (\d+)\) \+ \(\(int\)threadIdx\.y\)", src)
                per_thread = hidden * (int(rows.group(1)) if rows else 1) // block
                total, ops, regs, _ = count(src, "narrow_fwd", cuobjdump, work)
                origin = "default rule" if not record or record.get("default_won") else "record"
                top = " ".join(f"{op} {n}" for op, n in ops.most_common(10))
                print(f"{norm} {otype} {hidden} ({origin}, {block} threads, {per_thread} elements a thread): "
                      f"{total} instructions, {total / per_thread:.1f} an element, {regs} registers; {top}",
                      flush=True)


# fp8 forwards of the records' shapes whose y is recomputed by the store (keep_y off; layernorm
# 1024's and rmsnorm 4096's records are so) and, for comparison, kept (keep_y)
PAIRED_POINTS = [
    (NormKey(norm="layernorm", hidden_size=1024, otype="fp8e4m3"), CudaRowConfig(threads=32, vec=8), "fwd"),
    (NormKey(hidden_size=4096, otype="fp8e4m3"), CudaRowConfig(threads=128, vec=8), "fwd"),
    (NormKey(norm="layernorm", hidden_size=128, otype="fp8e4m3"), CudaRowConfig(threads=4, rows=8, vec=8), "fwd"),
    (NormKey(norm="layernorm", hidden_size=4096, otype="fp8e4m3"),
     CudaRowConfig(threads=128, vec=8, keep_row=True, keep_y=True), "fwd"),
]


def knob_counts(knob: str, cuobjdump: str, work: pathlib.Path, points=None, opcodes=("LDG",)) -> None:
    """``points`` (the dx ones of POINTS by default) with ``knob`` off and on, ``opcodes`` apart."""
    for key, cfg, part in points or [p for p in POINTS if p[2] == "dx"]:
        off, on = (count(source(key, dataclasses.replace(cfg, **{knob: value}), part), part, cuobjdump, work)
                   for value in (False, True))
        shape = f"prefetch {cfg.prefetch}" if part == "dx" else "y kept" if cfg.keep_y else "y recomputed"
        ops = ", ".join(f"{op} {off[1][op]} -> {on[1][op]}" for op in opcodes)
        print(f"{key.name} {part} ({cfg.threads}x{cfg.rows} vec {cfg.vec} {shape}): {knob} "
              f"{off[0]} -> {on[0]} instructions, {ops}; registers {off[2]} -> "
              f"{on[2]}, spill stores {off[3]} -> {on[3]} bytes", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump")
    ap.add_argument("--records", default=None, metavar="STAGE", help="registers and spills of the committed bf16 "
                    "records' row kernels of STAGE (fwd, bwd) instead")
    ap.add_argument("--variants", default=None, metavar="NORM:HIDDEN", help="registers and spills of every fused "
                    "dx variant of that bf16 backward key instead")
    ap.add_argument("--layouts", default=None, metavar="NORM:HIDDEN,...", help="registers and spills of every "
                    "unstaged fused dx point of those bf16 backward keys, held by the space or not, instead")
    ap.add_argument("--forward-ops", default=None, metavar="HIDDEN,...", help="instructions of the committed "
                    "forwards' kernels, bf16 and fp8e4m3 output, at those widths instead")
    ap.add_argument("--paired", action="store_true", help="fp8 forwards with paired_cast off and on instead")
    ap.add_argument("--knob", default=None, help="a boolean CudaRowConfig field of the dx (e.g. chunk_weights) to "
                    "count off and on instead of full_chunks")
    ap.add_argument("--no-tir-cse", action="store_true", help="compile without TVM's common subexpression "
                    "elimination (tirx.disable_cse_tir), which hoists every repeated address computation to the "
                    "kernel's top, where nvcc keeps it live")
    args = ap.parse_args()
    if args.no_tir_cse:
        from tvmnorm import _tvm
        _tvm.PASS_CONFIG["tirx.disable_cse_tir"] = True
    with tempfile.TemporaryDirectory() as d:
        work = pathlib.Path(d)
        if args.records:
            return record_usage(args.records, work)
        if args.variants:
            return variant_usage(args.variants, work)
        if args.layouts:
            return layout_usage(args.layouts, work)
        if args.paired:
            return knob_counts("paired_cast", args.cuobjdump, work, PAIRED_POINTS, ("F2FP", "LOP3", "PRMT"))
        if args.forward_ops:
            return forward_ops(args.forward_ops, args.cuobjdump, work)
        if args.knob:
            return knob_counts(args.knob, args.cuobjdump, work)
        for key, cfg, part in POINTS:
            before = count(source(key, cfg, part), part, args.cuobjdump, work)
            after = count(unguarded_only(source(key, dataclasses.replace(cfg, full_chunks=1), part)), part,
                          args.cuobjdump, work)
            shape = f"{cfg.threads}x{cfg.rows} vec {cfg.vec}" + (f" prefetch {cfg.prefetch}" if part == "dx" else "")
            print(f"{key.name} {part} ({shape}): {before[0]} -> {after[0]} instructions "
                  f"({100 * (before[0] - after[0]) / before[0]:.0f}% fewer); registers {before[2]} -> {after[2]}, "
                  f"spill stores {before[3]} -> {after[3]} bytes", flush=True)
            print("   guarded:   " + ", ".join(f"{k} {v}" for k, v in before[1].most_common(8)))
            print("   unguarded: " + ", ".join(f"{k} {v}" for k, v in after[1].most_common(8)))


if __name__ == "__main__":
    main()
