"""Structural checks of the CUDA code the default rule generates (no GPU needed): the features
the H200 runs depend on, and the race that was found there staying fixed."""
from __future__ import annotations

import re

import pytest

from tvmnorm import NormKey
from tvmnorm.build import compile_funcs, scheduled_funcs


def cuda_source(key: NormKey) -> str:
    ex = compile_funcs(scheduled_funcs(key, "cuda"), "cuda")
    assert [m.kind for m in ex.mod.imports] == ["cuda"]
    return ex.mod.imports[0].inspect_source()


def kernel(src: str, part: str) -> str:
    start = re.search(rf"__global__ void (__launch_bounds__\(\d+\) )?\w+_{part}_kernel\([^)]*\) {{", src)
    assert start, f"no {part} kernel"
    return src[start.end():src.index("\n}\n", start.end())]


def test_row_kernel_uses_vector_loads_and_warp_allreduce():
    body = kernel(cuda_source(NormKey(hidden_size=4096)), "fwd")
    assert "*(uint4*)(x_ptr" in body, "x is not read with 16-byte loads"
    assert "*(uint4*)(y_ptr" in body, "y is not written with 16-byte stores"
    assert "__shfl_down_sync" in body
    # rsigma is stored by one thread of the row, after the value is in every thread's registers
    assert re.search(r"threadIdx\.x\) < 1\)\) \{\s*rsigma_ptr\[", body)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_multi_warp_rows_do_not_update_the_allreduce_result_in_place(dtype):
    """On the H200, StorageRewrite folded rsigma into the shared allreduce result and every thread
    rewrote it in place while others still read it (wrong rsigma for 7168-wide rows)."""
    body = kernel(cuda_source(NormKey(hidden_size=7168, itype=dtype, wtype=dtype, otype=dtype)), "fwd")
    assert "red_result" in body, "expected a multi-warp allreduce at this width"
    assert not re.search(r"red_result_ptr\)\[0\] = rsqrtf", body)


def kernels_of(src: str) -> list:
    return re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", src)


@pytest.mark.parametrize("key", [NormKey(norm="layernorm", stage="bwd", hidden_size=1000),
                                 NormKey(stage="bwd_add", hidden_size=4096),
                                 NormKey(norm="layernorm", stage="bwd", hidden_size=7168, itype="fp32",
                                         wtype="fp32", otype="fp32")],
                         ids=lambda k: k.name)
def test_fused_bwd_is_one_pass_over_dy_and_x(key):
    """The backward is one row kernel that writes dx and the dgamma/dbeta partials (plus the
    finalize kernel): no second kernel reads dy and x, no atomics, each row's dy and x are
    loaded by the dx stages with vector loads, the partial update re-reads the same elements
    (L1 hits) inside the chunk's row loop, and the partials are initialised once per chunk."""
    src = cuda_source(key)
    names = sorted(set(kernels_of(src)))
    assert [n for n in names if n.endswith("_dx_kernel")] == [f"{key.name}_dx_kernel"], names
    assert all(n.endswith(("_dx_kernel", "_finalize_kernel")) or "_finalize_kernel_" in n for n in names), names
    assert "atomic" not in src
    body = kernel(src, "dx")
    # the chunk's rows are walked serially inside the kernel: one loop over the T rows
    loop = re.search(r"for \(int64_t (\w+) = \(int64_t\)0; \1 < \(int64_t\)(\d+); \+\+\1\)", body)
    assert loop, "no row loop over the chunk"
    from tvmnorm.compute.norms import rows_per_partial
    assert int(loop.group(2)) == rows_per_partial(key, "cuda")
    t = loop.group(1)
    # every global access to dy, x, dx and part is inside that loop (one pass over dy and x)
    inner = body[loop.start():]
    for name in ("dy_ptr", "x_ptr", "dx_ptr", "part_ptr"):
        assert body[:loop.start()].count(name + "[") + body[:loop.start()].count(name + " +") == 0, name
        assert name in inner, name
    vec_load = "*(uint4*)(dy_ptr" if key.itype != "fp32" else "*(float4*)(dy_ptr"
    if key.hidden_size % 8 == 0:
        assert vec_load in body, "dy is not read with 16-byte loads"
    # the partial sums are (re)initialised only at the chunk's first row
    assert re.search(rf"if \({t} == \(int64_t\)0\) {{\s*(\*\(float\d?\*\)\()?part_ptr", body), \
        "partials not initialised at t == 0"
    if key.hidden_size % 4 == 0:
        # the partial row's read-modify-write is contiguous 16-byte accesses per thread
        assert "*(float4*)(part_ptr" in body
    assert "__shfl_down_sync" in body  # per-row reductions are warp allreduces


def test_finalize_splits_the_partials_over_lanes():
    """Many partials (QK-norm: 8192 at 524288 rows of 128) are summed by 16 threadIdx.y lanes per
    column and a fixed-order tree, not one serial thread per column."""
    body = kernel(cuda_source(NormKey(stage="bwd", hidden_size=128)), "finalize")
    assert "threadIdx.y" in body and "red_buf" in body and "__syncthreads" in body
    assert "atomic" not in body
    # the store is done by one lane
    assert re.search(r"threadIdx\.y\) < \(int64_t\)1\)+ \{\s*dgamma_ptr\[", body)
