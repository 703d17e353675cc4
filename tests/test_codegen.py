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
                                 NormKey(stage="bwd_add", hidden_size=4096)], ids=lambda k: k.name)
def test_cuda_bwd_is_dx_wgrad_finalize(key):
    """CUDA keeps the two-pass backward (FUSED_BWD): dx, then wgrad with its running sums
    (dgamma, and dbeta for LayerNorm) in registers over the row walk, stored to global once
    after it, then finalize. No atomics anywhere."""
    src = cuda_source(key)
    names = sorted(set(kernels_of(src)))
    for part in ("dx", "wgrad", "finalize"):
        assert any(n.startswith(f"{key.name}_{part}_kernel") for n in names), (part, names)
    assert "atomic" not in src
    assert "part_ptr" not in kernel(src, "dx")
    body = kernel(src, "wgrad")
    s = 2 if key.norm == "layernorm" else 1
    assert f"float part_local_ptr[{s}];" in body
    assert len(re.findall(r"part_ptr\[", body)) == 1
    assert body.index("for (int64_t t") < body.index("part_ptr[")


def test_finalize_splits_the_partials_over_lanes():
    """Many partials (QK-norm: 8192 at 524288 rows of 128) are summed by 16 threadIdx.y lanes per
    column and a fixed-order tree, not one serial thread per column."""
    body = kernel(cuda_source(NormKey(stage="bwd", hidden_size=128)), "finalize")
    assert "threadIdx.y" in body and "red_buf" in body and "__syncthreads" in body
    assert "atomic" not in body
    # the store is done by one lane
    assert re.search(r"threadIdx\.y\) < \(int64_t\)1\)+ \{\s*dgamma_ptr\[", body)
