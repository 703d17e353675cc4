"""The runtime registry: the one-time fallback warning, a built library being used, and damaged
or stale libraries being refused (with LibraryRefused) while default kernels serve correctly."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import warnings

import pytest

from conftest import call, check_outputs, has_nvcc, make_inputs, x_in_layout
from tvmnorm.build import LIBRARY, MANIFEST, build_library, file_sha256
from tvmnorm.key import NormKey
from tvmnorm.runtime import FallbackWarning, LibraryRefused, Registry

EXPECTED_128 = ("Falling back to general normalization kernel because no tuned kernel is available for this "
                "config. hidden_size=128, wtype=bf16, itype=bf16, otype=bf16, ctype=fp32")

KEY_128 = NormKey(norm="rmsnorm", stage="fwd", itype="bf16", wtype="bf16", otype="bf16", hidden_size=128)
# keys built into the test library: a forward, a LayerNorm backward and an fp8 forward
LIB_KEYS = (
    KEY_128,
    NormKey(norm="layernorm", stage="bwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=1000),
    NormKey(norm="layernorm", stage="fwd", itype="bf16", wtype="bf16", otype="fp8e4m3", hidden_size=4095),
)


def fresh_registry(library=False) -> Registry:
    """A Registry that shares no state with others; ``library=False`` pins "no library" so a
    library in the package or the environment cannot change what these tests see."""
    reg = Registry()
    if library is False:
        reg.set_library("llvm", None)
    return reg


def fallback_messages(records):
    return [str(w.message) for w in records if issubclass(w.category, FallbackWarning)]


def refusals(records):
    return [str(w.message) for w in records if issubclass(w.category, LibraryRefused)]


# ---------------------------------------------------------------------------------------------
# fallback warning


def test_fallback_warning_text_and_once_per_config():
    reg = fresh_registry()
    other = NormKey(norm="rmsnorm", stage="fwd", itype="fp16", wtype="fp32", otype="fp16", hidden_size=1000)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")  # dedup must come from the registry, not the warnings module
        k1 = reg.get(KEY_128, "llvm")
        k2 = reg.get(KEY_128, "llvm")
        reg.get(other, "llvm")
        reg.get(other, "llvm")
        reg.get(KEY_128, "llvm")
    assert fallback_messages(rec) == [
        EXPECTED_128,
        "Falling back to general normalization kernel because no tuned kernel is available for this config. "
        "hidden_size=1000, wtype=fp32, itype=fp16, otype=fp16, ctype=fp32"]
    assert k1 is k2
    assert (k1.tuned, k1.origin) == (False, "default")


def test_fallback_warning_once_under_thread_race():
    """8 threads ask a fresh registry for the same new key at once: one warning, one kernel."""
    reg = fresh_registry()
    barrier = threading.Barrier(8)
    got, errors = [None] * 8, []

    def worker(i):
        try:
            barrier.wait()
            got[i] = reg.get(KEY_128, "llvm")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    assert not errors, errors
    assert fallback_messages(rec) == [EXPECTED_128]
    assert all(k is got[0] for k in got) and got[0] is not None


def test_fallback_warning_is_a_userwarning_category():
    """Users filter it with warnings.filterwarnings("ignore", category=FallbackWarning)."""
    reg = fresh_registry()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=FallbackWarning)
        reg.get(KEY_128, "llvm")  # would raise if another category were emitted
    assert issubclass(FallbackWarning, UserWarning)


def test_get_rejects_bad_arguments():
    reg = fresh_registry()
    with pytest.raises(TypeError, match="NormKey"):
        reg.get(KEY_128.pack(), "llvm")
    with pytest.raises(ValueError, match="target"):
        reg.get(KEY_128, "rocm")


# ---------------------------------------------------------------------------------------------
# libraries


@pytest.fixture(scope="module")
def built_library(tmp_path_factory):
    out = tmp_path_factory.mktemp("lib") / "llvm"
    manifest = build_library(LIB_KEYS, "llvm", out, log=lambda *a: None)
    return out, manifest


@pytest.fixture
def library_copy(built_library, tmp_path):
    """A private copy of the built library that a test may damage."""
    dst = tmp_path / "llvm"
    shutil.copytree(built_library[0], dst)
    return dst


def check_key(reg, key, rng, seed, rows=3):
    kernel = reg.get(key, "llvm")
    inputs = make_inputs(key, rows, rng)
    check_outputs(key, inputs, call(kernel, inputs, rows), f"{key.name} rows={rows} seed={seed} {kernel!r}")
    return kernel


def test_build_manifest(built_library):
    path, manifest = built_library
    assert sorted(p.name for p in path.iterdir()) == [LIBRARY, MANIFEST]
    assert json.loads((path / MANIFEST).read_text()) == manifest
    assert manifest["sha256"] == file_sha256(path / LIBRARY)
    assert [e["key"] for e in manifest["kernels"]] == [k.pack() for k in LIB_KEYS]
    assert {e["origin"] for e in manifest["kernels"]} == {"default"}


def test_library_is_used_via_env(built_library, monkeypatch, rng, seed):
    monkeypatch.setenv("TVMNORM_LIBRARY", str(built_library[0]))
    reg = fresh_registry(library=None)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for key in LIB_KEYS:
            kernel = check_key(reg, key, rng, seed)
            assert kernel.tuned is False  # built from the default schedule
            assert kernel.origin.startswith("library"), kernel.origin
    assert fallback_messages(rec) == [] and refusals(rec) == []


def test_library_via_set_library_and_missing_key_falls_back(built_library, rng, seed):
    reg = Registry()
    reg.set_library("llvm", built_library[0])
    absent = NormKey(norm="rmsnorm", stage="bwd", itype="bf16", wtype="bf16", otype="bf16", hidden_size=128)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert check_key(reg, KEY_128, rng, seed).origin.startswith("library")
        kernel = check_key(reg, absent, rng, seed)
    assert kernel.origin == "default"
    assert fallback_messages(rec) == [EXPECTED_128]  # absent has KEY_128's describe() text
    assert refusals(rec) == []


def _flip(path):
    so = path / LIBRARY
    data = bytearray(so.read_bytes())
    for i in range(len(data) // 3, len(data) // 3 + 64):
        data[i] ^= 0xFF
    so.write_bytes(bytes(data))


def _truncate(path):
    so = path / LIBRARY
    so.write_bytes(so.read_bytes()[: so.stat().st_size // 2])


def _edit_manifest(**changes):
    def edit(path):
        mf = json.loads((path / MANIFEST).read_text())
        mf.update(changes)
        (path / MANIFEST).write_text(json.dumps(mf))
    return edit


def _garbage_manifest(path):
    (path / MANIFEST).write_bytes(b"\x00\x01 this is not json {")


def _manifest_without_kernels(path):
    mf = json.loads((path / MANIFEST).read_text())
    del mf["kernels"]
    (path / MANIFEST).write_text(json.dumps(mf))


DAMAGE = {  # name -> (damage, words the refusal must contain)
    "flipped-bytes": (_flip, "does not match the sha256"),
    "truncated": (_truncate, "does not match the sha256"),
    "missing-so": (lambda p: (p / LIBRARY).unlink(), f"{LIBRARY} is missing"),
    "wrong-sha256": (_edit_manifest(sha256="0" * 64), "does not match the sha256"),
    "wrong-tvm-version": (_edit_manifest(tvm_version="0.19.0"), "built with TVM 0.19.0"),
    "wrong-ffi-version": (_edit_manifest(ffi_version="0.0.1"), "built with tvm-ffi 0.0.1"),
    "wrong-arch": (_edit_manifest(arch="not-this-cpu"), "built for not-this-cpu"),
    "wrong-target": (_edit_manifest(target="cuda"), "it targets cuda"),
    "stale-source": (_edit_manifest(tvmnorm_source_hash="0123456789abcdef"), "built from kernel sources"),
    "garbage-manifest": (_garbage_manifest, "unreadable manifest"),
    "manifest-without-kernels": (_manifest_without_kernels, "unreadable manifest"),
    "missing-manifest": (lambda p: (p / MANIFEST).unlink(), "unreadable manifest"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_library_is_refused(library_copy, damage, monkeypatch, rng, seed):
    fn, words = DAMAGE[damage]
    fn(library_copy)
    # explicitly: set_library raises, naming the problem
    with pytest.raises(ValueError, match="refused|unreadable") as exc:
        Registry().set_library("llvm", library_copy)
    assert words in str(exc.value)
    # through the environment: one LibraryRefused warning naming the problem, defaults serve
    monkeypatch.setenv("TVMNORM_LIBRARY", str(library_copy))
    reg = fresh_registry(library=None)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        kernels = [check_key(reg, key, rng, seed) for key in LIB_KEYS]
    refused = refusals(rec)
    assert len(refused) == 1, refused
    assert words in refused[0] and str(library_copy) in refused[0], refused[0]
    assert "Default kernels serve instead" in refused[0]
    assert all(k.origin == "default" and not k.tuned for k in kernels)
    assert len(fallback_messages(rec)) == len(LIB_KEYS)


def test_empty_library_dir_from_env_is_refused(tmp_path, monkeypatch, rng, seed):
    monkeypatch.setenv("TVMNORM_LIBRARY", str(tmp_path))
    reg = fresh_registry(library=None)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        kernel = check_key(reg, KEY_128, rng, seed)
    assert kernel.origin == "default"
    assert len(refusals(rec)) == 1 and "holds no tvmnorm library" in refusals(rec)[0]


_RESTAMPED_TRUNCATION = r"""
import json, sys, warnings
from tvmnorm.build import file_sha256
from tvmnorm.runtime import Registry
path = sys.argv[1]
so = path + "/libtvmnorm.so"
data = open(so, "rb").read()
open(so, "wb").write(data[: int(sys.argv[2])])
mf = json.load(open(path + "/manifest.json"))
mf["sha256"] = file_sha256(so)
json.dump(mf, open(path + "/manifest.json", "w"))
try:
    Registry().set_library("llvm", path)
    print("LOADED")
except ValueError as e:
    print("REFUSED", e)
"""


@pytest.mark.parametrize("fraction", (0.05, 0.5, 0.95))
def test_truncated_library_with_matching_sha_is_refused_not_loaded(library_copy, fraction):
    """A truncated .so whose manifest was restamped to match: dlopen of it dies of SIGBUS, so it
    must be refused before loading. Run in a subprocess so a regression cannot kill pytest."""
    size = (library_copy / LIBRARY).stat().st_size
    res = subprocess.run([sys.executable, "-c", _RESTAMPED_TRUNCATION, str(library_copy), str(int(size * fraction))],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert res.returncode == 0, f"crashed with {res.returncode}: {res.stderr[-2000:]}"
    assert res.stdout.startswith("REFUSED") and "truncated" in res.stdout, res.stdout + res.stderr[-2000:]


@pytest.mark.parametrize("stage", ["fwd", "bwd"])
def test_variant_kernel_runs_a_point_of_the_space(stage, rng, seed):
    """variant_kernel compiles a key with its row kernel at a given point of the tuned space (what
    the GPU tests and bench probes check and time): right against float64, with odd rows."""
    from tvmnorm.runtime import variant_kernel
    from tvmnorm.sched.rows import CpuRowConfig
    key = NormKey(norm="layernorm", stage=stage, itype="fp32", wtype="fp32", otype="fp32", hidden_size=1000)
    kernel = variant_kernel(key, "llvm", CpuRowConfig(vec=8, rows=2, acc=1, unroll=1))
    assert kernel.origin == "variant" and not kernel.tuned
    for rows in (1, 37):
        inputs = make_inputs(key, rows, rng)
        check_outputs(key, inputs, call(kernel, inputs, rows), f"{key.name} rows={rows} seed={seed}")


def test_record_kernel_compiles_what_a_library_holds_for_a_record(rng, seed):
    """record_kernel: a record of no traces and T rows per partial is the default rule at chunks
    of T (tune.default_record), compiled in this process with the T the runtime sizes partials
    by (bench/bwd_parts.py times such kernels). Right against float64."""
    from tvmnorm.runtime import partials, record_kernel
    key = NormKey(norm="layernorm", stage="bwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=96)
    kernel = record_kernel(key, "llvm", {"rows_per_partial": 16}, "default-T16")
    assert (kernel.chunk_rows, kernel.origin, kernel.tuned) == (16, "default-T16", False)
    assert partials(33, key, "llvm", kernel.chunk_rows) == 3
    for rows in (1, 33):
        inputs = make_inputs(key, rows, rng)
        check_outputs(key, inputs, call(kernel, inputs, rows), f"{key.name} T=16 rows={rows} seed={seed}")
    assert record_kernel(NormKey(hidden_size=96, itype="fp32", wtype="fp32", otype="fp32"), "llvm", None).chunk_rows is None


@pytest.mark.parametrize("nvcc", ("1", "0"))
def test_record_kernel_compiles_cuda_kernels_as_a_library_does(nvcc, monkeypatch, cuda_builds):
    """On CUDA record_kernel's kernels are compiled as a library's are (cuda_aot's nvcc build:
    what the probes time should be what a library serves) where cuda_aot.jit_nvcc says so, and
    as TVM's NVRTC module with TVMNORM_JIT_NVCC=0; a committed backward record's kernels, its
    int32-row dx among them, either way."""
    from tvmnorm.runtime import record_kernel
    from tvmnorm.tune import load_records
    if nvcc == "1" and not has_nvcc():
        pytest.skip("nvcc not on PATH")
    monkeypatch.setenv("TVMNORM_JIT_NVCC", nvcc)
    built = cuda_builds
    key = NormKey(stage="bwd", hidden_size=2560)
    record = load_records("cuda")[key.pack()]
    kernel = record_kernel(key, "cuda", record)
    assert kernel.tuned and kernel.chunk_rows == record["rows_per_partial"] and "dx" in kernel._narrow
    assert len(built) == (nvcc == "1")
    if built:
        assert f"{key.name}_narrow_dx" in built[0] and f"{key.name}_finalize" in built[0]


def test_llvm_point_that_does_not_divide_the_row_is_refused():
    """A CPU point whose vector lanes x accumulators (or output step) leave a tail of the row
    (space.llvm_choices never draws one) is refused by name: it computed wrong sums silently
    (layernorm bwd 1000 with 8 lanes x 2 accumulators: every dx element wrong)."""
    from tvmnorm.runtime import variant_kernel
    from tvmnorm.sched.rows import CpuRowConfig
    key = NormKey(norm="layernorm", stage="bwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=1000)
    with pytest.raises(ValueError, match=r"vec \* acc = 8 \* 2 must divide the row of 1000"):
        variant_kernel(key, "llvm", CpuRowConfig(vec=8, rows=1, acc=2, unroll=1))
    with pytest.raises(ValueError, match=r"vec \* unroll = 8 \* 2 must divide"):
        variant_kernel(NormKey(hidden_size=1000), "llvm", CpuRowConfig(vec=8, rows=1, acc=1, unroll=2))


@pytest.mark.parametrize("key", [NormKey(norm="layernorm", stage="bwd", itype="fp32", wtype="fp32", otype="fp32",
                                         hidden_size=1000),
                                 NormKey(stage="bwd_add", hidden_size=128),
                                 NormKey(norm="layernorm", stage="bwd", hidden_size=4095)], ids=lambda k: k.name)
def test_dx_walking_whole_chunks_without_row_guards_is_right(key, rng, seed):
    """full_chunks (_tvm.FULL_CHUNK: the chunk walk in two versions, one without row guards for
    chunks whose rows are all below n) on the llvm dx kernel, where it runs here: right against
    float64 with one row, a chunk one row short of T, exactly T, one row past it and a last chunk
    of a few rows. (On CUDA, a knob of the tuned space and the layernorm default's dx:
    tests/test_gpu_core.py.)"""
    from tvmnorm.runtime import variant_kernel
    from tvmnorm.sched.rows import CpuRowConfig
    from tvmnorm.sched.space import llvm_choices
    choices = llvm_choices(key)
    kernel = variant_kernel(key, "llvm", CpuRowConfig(vec=max(choices["vec"]), rows=2, acc=max(choices["acc"]),
                                                      unroll=max(choices["unroll"]), full_chunks=1))
    T = kernel.chunk_rows
    for rows in (1, T - 1, T, T + 1, 3 * T + 5):
        inputs = make_inputs(key, rows, rng)
        check_outputs(key, inputs, call(kernel, inputs, rows), f"{key.name} rows={rows} seed={seed}")


@pytest.mark.parametrize("key", [NormKey(norm="layernorm", stage="bwd", hidden_size=1000),
                                 NormKey(stage="bwd_add", hidden_size=128),
                                 NormKey(norm="layernorm", otype="fp8e4m3", hidden_size=4095)], ids=lambda k: k.name)
def test_int32_row_kernels_are_right_and_refuse_what_would_wrap(key, rng, seed):
    """A key compiled with an int32 row count (compute.symbolic_rows(32), what the probes time
    against the library's int64 kernels) gives the float64 reference's results, chunk edges and
    the amax included; a call of 2^31 elements or more, whose int32 offsets would wrap, is refused
    before any kernel runs."""
    import torch

    from tvmnorm.runtime import variant_kernel
    kernel = variant_kernel(key, "llvm", row_bits=32)
    assert kernel.row_bits == 32
    for rows in (1, 33, 300):
        inputs = make_inputs(key, rows, rng)
        check_outputs(key, inputs, call(kernel, inputs, rows), f"{key.name} int32 rows={rows} seed={seed}")
    big = (1 << 31) // key.hidden_size + 1
    arrays = [torch.empty((big, 0) if n in ("x", "y", "dy", "dx", "dz") else (0,)) for n in kernel.signature]
    with pytest.raises(ValueError, match="int32 and serves calls of fewer than 2\\^31 elements"):
        kernel(*arrays)


def test_row_bits_must_be_32_or_64():
    from tvmnorm.compute import symbolic_rows
    with pytest.raises(ValueError, match="must be 32 or 64"):
        symbolic_rows(16)


@pytest.mark.parametrize("stage", ["fwd", "bwd"])
def test_calls_that_fit_int32_offsets_run_the_int32_row_kernels(stage):
    """A kernel with int32-row copies of its row kernels (a CUDA library's, build.key_funcs) runs
    them for every call whose tensors fit int32 offsets, with room for the last block's rows
    past the end, and the int64 ones past that; the small-call kernel still serves small calls."""
    from tvmnorm.compute.norms import parts_of
    from tvmnorm.runtime import NormKernel, fits_int32
    key = NormKey(stage=stage, hidden_size=4096)
    wide = {p: object() for p in parts_of(key, "cuda")}
    row_part = "fwd" if stage == "fwd" else "dx"
    narrow, small = {row_part: object()}, {"fwd": object()}
    kernel = NormKernel(key, "cuda", wide, True, "test", small=small if stage == "fwd" else None, narrow=narrow)
    first_wide = (1 << 31) // 4096 - 1024  # the fewest rows that do not fit
    assert fits_int32(first_wide - 1, 4096) and not fits_int32(first_wide, 4096)
    assert not fits_int32((1 << 31) // 4096, 4096) and fits_int32(1, (1 << 31) // 2048)
    fit = kernel.parts_for(first_wide - 1)
    assert fit[row_part] is narrow[row_part]
    assert all(fit[p] is wide[p] for p in wide if p != row_part)
    assert kernel.parts_for(first_wide) is not fit and kernel.parts_for(first_wide)[row_part] is wide[row_part]
    if stage == "fwd":
        assert kernel.forward_for(1) is small["fwd"]
        assert kernel.forward_for(first_wide - 1) is narrow["fwd"] and kernel.forward_for(first_wide) is wide["fwd"]


def test_backward_calls_take_chunks_that_fill_the_grid():
    """A backward call past the decode rows runs its dx at the key's own T where that makes
    FULL_GRID_CHUNKS chunks (and, for a key with no tuned record, DEFAULT_OWN_T_ELEMENTS
    elements), else at the longest shorter T its kernel holds (8). With the key's T = 64 a call
    of 64 rows was one block walking 64 rows (124.7 us against torch eager's 24.1 on the H200).
    Calls past int32 offsets keep the key's T (the shorter kernels have int32 rows)."""
    from tvmnorm.build import SMALL_DX_CHUNK_ROWS
    from tvmnorm.runtime import (DEFAULT_OWN_T_ELEMENTS, FULL_GRID_CHUNKS, NormKernel, dx_chunk_rows, fits_int32,
                                 own_t_rows)
    assert SMALL_DX_CHUNK_ROWS == (8,) and FULL_GRID_CHUNKS == 256 and DEFAULT_OWN_T_ELEMENTS == 12 << 20
    assert [dx_chunk_rows(r, 64) for r in (16384, 255 * 64 + 1, 255 * 64, 1024, 1)] == [64, 64, 8, 8, 8]
    assert [dx_chunk_rows(r, 32) for r in (8192, 255 * 32, 4096)] == [32, 8, 8]
    assert dx_chunk_rows(5, 32, ()) == 32 and dx_chunk_rows(5, 8) == 8 and dx_chunk_rows(5, 16, (1, 8)) == 8
    assert dx_chunk_rows(4096, 16) == 16 and dx_chunk_rows(255 * 16, 16) == 8
    # a default kernel: 256 chunks and 12 Mi elements (128 x 98304 rows; 1000 x 12583)
    assert own_t_rows(32, 128, tuned=False) == 98304 and own_t_rows(32, 128) == 255 * 32 + 1
    assert [dx_chunk_rows(r, 32, hidden=128, tuned=False) for r in (98304, 98303, 16384)] == [32, 8, 8]
    assert [dx_chunk_rows(r, 32, hidden=1000, tuned=False) for r in (12583, 12582)] == [32, 8]
    assert own_t_rows(64, 8192, tuned=False) == own_t_rows(64, 8192) == 255 * 64 + 1  # wide: the chunks bind
    key = NormKey(stage="bwd", hidden_size=4096)
    main, narrow, short = {"dx": object(), "finalize": object()}, {"dx": object()}, {8: object()}
    kernel = NormKernel(key, "cuda", main, True, "test", chunk_rows=64, narrow=narrow, small_dx=short)
    assert kernel.dx_for(16384) == (64, narrow["dx"])
    assert kernel.dx_for(4096) == (8, short[8]) == kernel.dx_for(300) == kernel.dx_for(1)
    wide = (1 << 31) // 4096
    assert not fits_int32(wide, 4096) and kernel.dx_for(wide) == (64, main["dx"])
    narrow_key = NormKey(stage="bwd", hidden_size=512)
    tuned = NormKernel(narrow_key, "cuda", main, True, "test", chunk_rows=32, narrow=narrow, small_dx=short)
    default = NormKernel(narrow_key, "cuda", main, False, "test", chunk_rows=32, narrow=narrow, small_dx=short)
    assert tuned.dx_for(16384) == (32, narrow["dx"]) and default.dx_for(16384) == (8, short[8])
    assert default.dx_for(32768) == (32, narrow["dx"])
    # a kernel without the shorter ones (a tuning candidate, variant_kernel) keeps its T
    assert NormKernel(key, "cuda", main, False, "test", chunk_rows=32).dx_for(1) == (32, main["dx"])


def test_cuda_backward_holds_its_dx_at_shorter_chunks():
    """Every CUDA backward key's kernels (build.key_funcs: a library's and the default cache's)
    include the default rule's dx at each T of SMALL_DX_CHUNK_ROWS (with an int32 row count); the
    manifest's rows_per_partial stays the key's own T; forwards and llvm have none."""
    from tvmnorm.build import SMALL_DX_CHUNK_ROWS, chunk_rows_of, key_funcs, small_dx_funcs, small_dx_symbol
    from tvmnorm.compute.norms import ROWS_PER_PARTIAL_ATTR, rows_per_partial
    for key in (NormKey(stage="bwd", hidden_size=8192), NormKey(norm="layernorm", stage="bwd_add", hidden_size=1000)):
        funcs = key_funcs(key, "cuda")
        for t in SMALL_DX_CHUNK_ROWS:
            f = funcs[small_dx_symbol(key, t)]
            assert int(f.attrs[ROWS_PER_PARTIAL_ATTR]) == t  # int32 rows: test_codegen's index-width test
        assert chunk_rows_of(funcs) == rows_per_partial(key, "cuda")
    assert small_dx_funcs(NormKey(hidden_size=8192), "cuda") == {}
    assert small_dx_funcs(NormKey(stage="bwd", hidden_size=8192), "llvm") == {}


class RecordedKernel:
    """A stand-in for a kernel part: each call appends (its name, its arguments) to ``ran``."""

    def __init__(self, name: str, ran: list):
        self.name, self.ran = name, ran

    def __call__(self, *args):
        self.ran.append((self.name, args))


def test_cuda_backward_holds_its_decode_backward():
    """Every CUDA backward key's kernels include the decode backward (build.decode_funcs): dx
    without partials (no T) and wgrad split three ways at hidden 2049-4096, two elsewhere, where
    wgrad_mid's split is wgrad's and wgrad serves its calls (int32 rows: test_codegen's
    index-width test); forwards and llvm have none. A call of 1 to decode_bwd_rows rows (more at
    narrow widths) that fits int32 offsets runs it, with wgrad_few up to WGRAD_FEW_ROWS rows and
    wgrad_mid up to WGRAD_MID_ROWS; larger, empty and int64 calls do not."""
    from tvmnorm.build import DECODE_PARTS, decode_funcs, decode_prefix, key_funcs
    from tvmnorm.compute.norms import ROWS_PER_PARTIAL_ATTR
    import torch
    from tvmnorm.runtime import (DECODE_BWD_NARROW_HIDDEN, DECODE_BWD_NARROW_ROWS, DECODE_BWD_ROWS, WGRAD_FEW_ROWS,
                                 WGRAD_MID_ROWS, NormKernel)
    for key, mid in ((NormKey(stage="bwd", hidden_size=8192), False),
                     (NormKey(norm="layernorm", stage="bwd_add", hidden_size=1000), False),
                     (NormKey(stage="bwd", hidden_size=2560), True), (NormKey(stage="bwd", hidden_size=4096), True)):
        funcs = key_funcs(key, "cuda")
        dx = funcs[f"{decode_prefix(key)}_dx"]
        assert dx.attrs is None or ROWS_PER_PARTIAL_ATTR not in dx.attrs
        assert (f"{decode_prefix(key)}_wgrad_mid" in funcs) == mid, key.name
        for part in ("wgrad", "wgrad_few") + (("wgrad_mid",) if mid else ()):
            wgrad = funcs[f"{decode_prefix(key)}_{part}"]
            assert [p.name for p in wgrad.params][-key.column_sums:] in (["dgamma"], ["wgrad.v0", "wgrad.v1"])
    assert decode_funcs(NormKey(hidden_size=8192), "cuda") == {}
    assert decode_funcs(NormKey(stage="bwd", hidden_size=8192), "llvm") == {}
    assert DECODE_BWD_NARROW_ROWS > DECODE_BWD_ROWS > WGRAD_MID_ROWS > WGRAD_FEW_ROWS

    for hidden, most in ((4096, DECODE_BWD_ROWS), (DECODE_BWD_NARROW_HIDDEN, DECODE_BWD_NARROW_ROWS)):
        key = NormKey(stage="bwd", hidden_size=hidden)
        ran = []
        kernel = NormKernel(key, "cuda", {}, True, "test", decode={p: RecordedKernel(p, ran) for p in DECODE_PARTS})
        assert [kernel.decodes(r) for r in (0, 1, most, most + 1)] == [False, True, True, False]
        assert not NormKernel(key, "cuda", {}, True, "test").decodes(1)
        for rows, part in ((1, "wgrad_few"), (WGRAD_FEW_ROWS, "wgrad_few"), (WGRAD_FEW_ROWS + 1, "wgrad_mid"),
                           (WGRAD_MID_ROWS, "wgrad_mid"), (WGRAD_MID_ROWS + 1, "wgrad"), (most, "wgrad")):
            ran.clear()
            x = torch.empty(rows, hidden)
            kernel(x, x, torch.empty(rows), torch.empty(hidden), x, torch.empty(hidden))
            assert [name for name, _ in ran] == ["dx", part], (hidden, rows)


def test_backward_plans_launch_what_each_row_count_needs_and_stay_bounded(monkeypatch):
    """A backward call's kernels and partial sums come from its row count's plan
    (NormKernel.bwd_plan), kept after the first call: the first and a repeated call of a row
    count launch the same kernels on the same arrays (the decode backward; dx at a shorter T;
    dx at the key's own T, then finalize; combine past COMBINE_ABOVE partials), and a run of ever
    new row counts keeps at most BWD_PLANS plans."""
    import torch
    from tvmnorm import runtime
    from tvmnorm.build import DECODE_PARTS
    from tvmnorm.compute.norms import num_partials
    launched = []
    key = NormKey(norm="layernorm", stage="bwd_add", hidden_size=1024)
    main = {p: RecordedKernel(p, launched) for p in ("dx", "combine", "finalize")}
    kernel = runtime.NormKernel(key, "cuda", main, True, "test", chunk_rows=64, narrow={"dx": main["dx"]},
                                small_dx={8: RecordedKernel("dx8", launched)},
                                decode={p: RecordedKernel(f"decode_{p}", launched) for p in DECODE_PARTS})
    monkeypatch.setattr(runtime, "COMBINE_ABOVE", 350)  # 3000 rows at T = 8: 375 partials, 20000 at 64: 313
    for rows in (5, 3000, 3000, 20000, 20000, 5):
        launched.clear()
        x = torch.empty(rows, 1024)
        dy, dz, dx = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
        mu, rs, w, dw, db = torch.empty(rows), torch.empty(rows), torch.empty(1024), torch.empty(1024), torch.empty(1024)
        kernel(dy, x, mu, rs, w, dz, dx, dw, db)
        # the call's own arrays as themselves, the scratch and weight arrays by their shapes
        ran = [(name, [a if a.shape[0] == rows else tuple(a.shape) for a in args]) for name, args in launched]
        names = [name for name, _ in ran]
        if rows == 5:
            assert names == ["decode_dx", "decode_wgrad_few"]
            assert ran[0][1] == [dy, x, mu, rs, (1024,), dz, dx] and ran[1][1] == [dy, x, mu, rs, (1024,), (1024,)]
            continue
        t, count = (8, num_partials(3000, 8)) if rows == 3000 else (64, num_partials(20000, 64))
        part = (2, count, 1024)
        assert ran[0] == ("dx8" if t == 8 else "dx", [dy, x, mu, rs, (1024,), dz, dx, part]), rows
        if count > 350:
            mid = (2, runtime.combined_rows(count), 1024)
            assert ran[1:] == [("combine", [part, mid]), ("finalize", [mid, (1024,), (1024,)])], rows
        else:
            assert ran[1:] == [("finalize", [part, (1024,), (1024,)])], rows
    assert set(kernel._plans) == {5, 3000, 20000}
    for rows in range(2000, 2000 + 2 * runtime.BWD_PLANS):
        kernel.bwd_plan(rows)
    assert 0 < len(kernel._plans) <= runtime.BWD_PLANS


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "amax-kernels"])
def test_fp8_forward_launches_its_amax_kernels_in_order(fold):
    """An fp8 forward call with recording kernels: where the forward folds the rows' maxima into
    amax (CUDA), amax_zero(amax) and then the forward with amax last, and no launch for no rows;
    else the forward into a row maxima array, then amax_one up to AMAX_ONE_ROWS rows, or amax
    with its partials beyond."""
    import torch
    from tvmnorm.compute.norms import AMAX_ONE_ROWS, amax_partials
    from tvmnorm.runtime import NormKernel
    ran = []
    key = NormKey(norm="layernorm", otype="fp8e4m3", hidden_size=1024)
    parts = ("amax_zero", "fwd") if fold else ("fwd", "amax", "amax_one")
    kernel = NormKernel(key, "cuda" if fold else "llvm", {p: RecordedKernel(p, ran) for p in parts}, True, "test")
    for rows in (0, 5, AMAX_ONE_ROWS + 1):
        ran.clear()
        x, y = torch.empty(rows, 1024), torch.empty(rows, 1024)
        w, b, scale, mu, rs, amax = (torch.empty(1024), torch.empty(1024), torch.empty(1), torch.empty(rows),
                                     torch.empty(rows), torch.empty(1))
        kernel(x, w, b, scale, y, mu, rs, amax, eps=0.5)
        inputs = (x, w, b, scale, y, mu, rs)
        if fold:
            assert [n for n, _ in ran] == ["amax_zero"] + ["fwd"] * bool(rows) and ran[0][1] == (amax,)
            if rows:
                assert ran[1][1][:-2] == inputs and ran[1][1][-2:] == (amax, 0.5)
            continue
        fwd, fwd_args = ran[0]
        assert fwd == "fwd" and fwd_args[:-2] == inputs and fwd_args[-1] == 0.5
        amax_row = fwd_args[-2]
        assert tuple(amax_row.shape) == (rows,) and amax_row.dtype == torch.float32
        if rows <= AMAX_ONE_ROWS:
            assert [n for n, _ in ran[1:]] == ["amax_one"] and ran[1][1] == (amax_row, amax)
        else:
            assert [n for n, _ in ran[1:]] == ["amax"] and ran[1][1][0] is amax_row and ran[1][1][2] is amax
            assert tuple(ran[1][1][1].shape) == (amax_partials(rows),)


@pytest.mark.parametrize("mid", [False, True], ids=["without-wgrad_mid", "with-wgrad_mid"])
def test_a_module_without_wgrad_mid_serves_its_calls_with_wgrad(mid):
    """A library holds wgrad_mid only where its split differs from wgrad's (build.decode_parts):
    loaded from a module without it, the kernel runs wgrad for those calls; with it, its own."""
    from tvmnorm.build import compile_funcs, decode_prefix, key_funcs
    from tvmnorm.compute.norms import decode_funcs
    from tvmnorm.runtime import _kernel_from_module
    from tvmnorm.sched.default import default_schedule
    key = NormKey(stage="bwd", hidden_size=1000)
    parts = ("dx", "wgrad", "wgrad_few") + (("wgrad_mid",) if mid else ())
    funcs = dict(key_funcs(key, "llvm"))
    for part, f in decode_funcs(key, "llvm", parts, prefix=decode_prefix(key)).items():
        funcs[f.attrs["global_symbol"]] = default_schedule(f, part, "llvm").mod["main"].with_attr(
            "global_symbol", f.attrs["global_symbol"])
    kernel = _kernel_from_module(key, "llvm", compile_funcs(funcs, "llvm").mod, False, "test")
    assert set(kernel._decode) == {"dx", "wgrad", "wgrad_few", "wgrad_mid"}
    assert (kernel._decode["wgrad_mid"] is kernel._decode["wgrad"]) != mid


@pytest.mark.parametrize("norm,stage,dtype,hidden,zc", [
    ("rmsnorm", "bwd", "bf16", 4096, False), ("layernorm", "bwd", "bf16", 1000, False),
    ("rmsnorm", "bwd_add", "fp32", 1000, True), ("layernorm", "bwd_add", "fp16", 4095, True)])
@pytest.mark.parametrize("rows", [1, 7, 256])
def test_decode_backward_matches_float64(norm, stage, dtype, hidden, zc, rows, rng, seed):
    """The decode backward's computes (dx without partials, wgrad's column sums of dy and x),
    run through the runtime's decode path on llvm, against the float64 reference: the CUDA
    library runs the same computes (its schedules are checked on the GPU, test_gpu_core)."""
    from tvmnorm.build import DECODE_PARTS, compile_funcs
    from tvmnorm.compute.norms import decode_funcs
    from tvmnorm.runtime import NormKernel
    from tvmnorm.sched.default import default_schedule
    key = NormKey(norm=norm, stage=stage, itype=dtype, wtype=dtype, otype=dtype, hidden_size=hidden,
                  zero_centered_gamma=zc)
    scheduled = {f.attrs["global_symbol"]: default_schedule(f, part, "llvm").mod["main"].with_attr(
        "global_symbol", f.attrs["global_symbol"]) for part, f in decode_funcs(key, "llvm", DECODE_PARTS).items()}
    mod = compile_funcs(scheduled, "llvm").mod
    decode = {p: mod[f"{key.name}_{p}"] for p in DECODE_PARTS}
    kernel = NormKernel(key, "llvm", {}, False, "test", decode=decode)
    inputs = make_inputs(key, rows, rng)
    check_outputs(key, inputs, call(kernel, inputs, rows), f"decode {key.name} rows={rows} seed={seed}")


def test_int32_slack_covers_the_largest_block_of_the_space():
    """fits_int32 leaves room for the rows a last block reaches past the end: the most rows any
    point of the CUDA space puts in one block (chunk lanes x T for the fused dx kernel)."""
    from tvmnorm.compute.norms import CUDA_CHUNK_ROWS
    from tvmnorm.runtime import _NARROW_SLACK_ROWS
    from tvmnorm.sched.space import ROWS
    assert _NARROW_SLACK_ROWS >= max(ROWS) * max(CUDA_CHUNK_ROWS)


def test_int64_row_kernels_are_compiled_on_the_first_call_past_int32_offsets():
    """A default kernel whose cache entry leaves the int64 row kernels out (Registry._default on
    CUDA) compiles them once, on the first call that does not fit int32 offsets, and never for
    calls that fit."""
    from tvmnorm.runtime import NormKernel
    key = NormKey(stage="bwd", hidden_size=4096)
    calls = []
    wide_dx = object()

    def compile_wide():
        calls.append(1)
        return {"dx": wide_dx}
    others = {"combine": object(), "finalize": object()}
    narrow = {"dx": object()}
    kernel = NormKernel(key, "cuda", dict(others), False, "default", narrow=narrow, wide=compile_wide)
    assert kernel.parts_for(16384)["dx"] is narrow["dx"] and not calls
    huge = (1 << 31) // 4096
    assert kernel.parts_for(huge)["dx"] is wide_dx and kernel.parts_for(huge + 1)["dx"] is wide_dx
    assert calls == [1] and kernel.parts_for(huge)["finalize"] is others["finalize"]


def test_a_module_without_a_kernel_part_is_refused_clearly():
    """A module that lacks one of a key's kernels (and no way to compile it) is refused by name,
    not turned into a kernel that fails on its first call."""
    from tvmnorm.runtime import _kernel_from_module

    class Module:
        def implements_function(self, name):
            return not name.endswith("_finalize")

        def __getitem__(self, name):
            return object()
    key = NormKey(stage="bwd", hidden_size=4096)
    with pytest.raises(ValueError, match="lacks its finalize kernel"):
        _kernel_from_module(key, "llvm", Module(), False, "test")


@pytest.mark.slow
def test_cuda_default_kernel_leaves_its_int64_row_kernels_to_the_first_call_past_int32(tmp_path, monkeypatch):
    """On CUDA the runtime compiles a key's default kernels without the int64 row kernels (the
    module here is compiled, not run: no GPU), and compiles those into a cache entry of their
    own when a call needs them."""
    import warnings

    from tvmnorm.runtime import NARROW_PARTS, Registry, cache_dir
    from tvmnorm.targets import target_name
    monkeypatch.setenv("TVMNORM_CACHE", str(tmp_path))
    key = NormKey(stage="bwd", hidden_size=1024)
    reg = Registry()
    reg.set_library("cuda", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernel = reg.get(key, "cuda")
    assert kernel._wide is not None and "dx" not in kernel._f and set(kernel._f) == {"combine", "finalize"}
    assert set(kernel._narrow) == {"dx", "combine", "finalize"} and NARROW_PARTS == ("fwd", "dx")
    entry = cache_dir() / target_name("cuda")
    assert (entry / f"{key.name}.so").exists() and not (entry / f"{key.name}.wide.so").exists()
    wide = kernel.parts_for((1 << 31) // 1024)
    assert kernel._wide is None and wide["dx"] is kernel._f["dx"] and wide["dx"] is not kernel._narrow["dx"]
    assert (entry / f"{key.name}.wide.so").exists()


def test_cuda_default_cache_holds_nvcc_libraries_and_rebuilds_nvrtc_entries(tmp_path, monkeypatch):
    """Where nvcc is found (cuda_aot.jit_nvcc) a CUDA default key's cache entry is compiled as a
    library's kernels are (SASS, no TVM CUDA module for NVRTC to compile in every process that
    loads it); an entry of TVM's CUDA module, as TVMNORM_JIT_NVCC=0 or a cache from before makes
    it, is rebuilt so."""
    import warnings

    from tvmnorm._tvm import load_module
    from tvmnorm.cuda_aot import jit_nvcc
    from tvmnorm.runtime import Registry, cache_dir
    from tvmnorm.targets import target_name
    if not has_nvcc():
        pytest.skip("nvcc not installed")
    monkeypatch.setenv("TVMNORM_CACHE", str(tmp_path))
    key = NormKey(hidden_size=1024)
    entry = cache_dir() / target_name("cuda") / f"{key.name}.so"

    def default_kernel():
        reg = Registry()
        reg.set_library("cuda", None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return reg.get(key, "cuda")
    monkeypatch.setenv("TVMNORM_JIT_NVCC", "0")
    assert not jit_nvcc()
    default_kernel()
    nvrtc_entry = entry.read_bytes()
    assert b"__global__ void" in nvrtc_entry  # CUDA source for NVRTC
    monkeypatch.delenv("TVMNORM_JIT_NVCC")
    assert jit_nvcc()
    kernel = default_kernel()
    assert b"__global__ void" not in entry.read_bytes() and not load_module(str(entry)).imports
    assert "fwd" in kernel._narrow and kernel._wide is not None  # the int64 one left to its first call


def test_cuda_default_cache_falls_back_to_nvrtc_where_nvcc_fails(tmp_path, monkeypatch):
    """An nvcc that fails on a default key's kernels (here a stand-in raising as _run does) leaves
    the key served from TVM's CUDA module, with a warning naming the file that keeps nvcc's error;
    later lookups do not run nvcc again while that file is there."""
    import tvmnorm.cuda_aot as cuda_aot
    from tvmnorm.runtime import Registry, cache_dir
    from tvmnorm.targets import target_name
    monkeypatch.setenv("TVMNORM_CACHE", str(tmp_path))
    monkeypatch.setattr(cuda_aot, "jit_nvcc", lambda: True)
    tries = []

    def broken_nvcc(*args, **kwargs):
        tries.append(args)
        raise RuntimeError("nvcc failed (nvcc -shared ...):\nunsupported GNU version!")
    monkeypatch.setattr(cuda_aot, "build_cuda_library", broken_nvcc)
    key = NormKey(hidden_size=1024)
    entry = cache_dir() / target_name("cuda") / f"{key.name}.so"
    failed = entry.with_suffix(".nvcc-failed")
    said = []
    for _ in range(2):
        reg = Registry()
        reg.set_library("cuda", None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kernel = reg.get(key, "cuda")
        assert "fwd" in kernel._narrow and entry.exists()
        said.append([str(w.message) for w in caught if "nvcc could not compile" in str(w.message)])
    assert len(tries) == 1 and "unsupported GNU version" in failed.read_text()
    assert len(said[0]) == 1 and str(failed) in said[0][0] and "TVMNORM_JIT_NVCC=0" in said[0][0]
    assert said[1] == []  # the second lookup: no nvcc, no warning


def test_cuda_arch_is_the_gpus_unless_named(monkeypatch):
    """CUDA kernels compile for TVMNORM_CUDA_ARCH, else this machine's GPU (an sm_90 build does
    not load on an A100 or an L40), else the H200's sm_90; an arch the kernels cannot run on is
    a ValueError that names it and where it came from."""
    from tvmnorm import targets
    monkeypatch.delenv("TVMNORM_CUDA_ARCH", raising=False)
    monkeypatch.setattr(targets, "_local_cuda_arch", lambda: None)
    assert targets.cuda_arch() == "sm_90" == targets.target_spec("cuda")["arch"]
    monkeypatch.setattr(targets, "_local_cuda_arch", lambda: "sm_86")
    assert targets.cuda_arch() == "sm_86" == targets.target_spec("cuda")["arch"]
    assert targets.target_name("cuda") == "cuda-sm_86" and targets.target_spec("cuda", "sm_100a")["arch"] == "sm_100a"
    with pytest.raises(ValueError, match="this machine's GPU is sm_86: fp8 output needs sm_89 or newer"):
        targets.cuda_arch(fp8=True)
    monkeypatch.setenv("TVMNORM_CUDA_ARCH", "sm_89")
    assert targets.cuda_arch(fp8=True) == "sm_89" == targets.arch_of("cuda")
    monkeypatch.setattr(targets, "_local_cuda_arch", lambda: "sm_75")
    assert targets.cuda_arch() == "sm_89"  # the variable wins over the GPU
    monkeypatch.delenv("TVMNORM_CUDA_ARCH")
    with pytest.raises(ValueError, match="this machine's GPU is sm_75: tvmnorm's CUDA kernels need sm_80 or newer"):
        targets.cuda_arch()
    with pytest.raises(ValueError, match="the CUDA arch asked for is sm_70"):
        targets.target_spec("cuda", "sm_70")
    monkeypatch.setenv("TVMNORM_CUDA_ARCH", "ampere")
    with pytest.raises(ValueError, match="not a CUDA arch: 'ampere'"):
        targets.cuda_arch()


def test_cuda_default_kernels_are_refused_where_the_arch_cannot_run_them(tmp_path, monkeypatch):
    """An fp8-output key on a GPU older than sm_89: a ValueError from the registry before any
    compile, no cache entry written, and the next lookup says it again."""
    from tvmnorm.runtime import Registry
    monkeypatch.setenv("TVMNORM_CACHE", str(tmp_path))
    monkeypatch.setenv("TVMNORM_CUDA_ARCH", "sm_86")
    reg = Registry()
    reg.set_library("cuda", None)
    key = NormKey(hidden_size=1024, otype="fp8e4m3")
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(ValueError, match="TVMNORM_CUDA_ARCH is sm_86: fp8 output needs sm_89"):
                reg.get(key, "cuda")
    assert not any(tmp_path.rglob("*.so"))


@pytest.mark.slow
def test_cuda_default_cache_compiles_for_the_gpu_it_serves(tmp_path, monkeypatch):
    """On an A100 (here TVMNORM_CUDA_ARCH=sm_80) the default kernels are nvcc's sm_80 SASS and
    compute_80 PTX, in a cache entry of that arch, launched without programmatic dependent launch
    (sm_90's). test_gpu_core runs such kernels on the H200 from their PTX."""
    import tvmnorm.cuda_aot as cuda_aot
    from tvmnorm.runtime import Registry, cache_dir
    if not has_nvcc():
        pytest.skip("nvcc not installed")
    monkeypatch.setenv("TVMNORM_CACHE", str(tmp_path))
    monkeypatch.setenv("TVMNORM_CUDA_ARCH", "sm_80")
    run, commands, sources = cuda_aot._run, [], []

    def recorded_run(cmd):
        commands.append(" ".join(cmd))
        sources.extend(pathlib.Path(a).read_text() for a in cmd if a.endswith(".cu"))
        return run(cmd)
    monkeypatch.setattr(cuda_aot, "_run", recorded_run)
    reg = Registry()
    reg.set_library("cuda", None)
    key = NormKey(stage="bwd", hidden_size=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernel = reg.get(key, "cuda")
    assert (cache_dir() / "cuda-sm_80" / f"{key.name}.so").exists() and "dx" in kernel._narrow
    compiles = [c for c in commands if ".cu " in c]  # one unit or several, each .cu is compiled once
    assert compiles and all("arch=compute_80,code=sm_80" in c and "arch=compute_80,code=compute_80" in c
                            for c in compiles)
    assert sources and not any("griddepcontrol" in s or "ProgrammaticStreamSerialization" in s for s in sources)
    assert not any(p.name.startswith("cuda-sm_90") for p in cache_dir().iterdir())


@pytest.mark.parametrize("layout", ("strided", "heads"))
@pytest.mark.parametrize("rows", (1, 70))
@pytest.mark.parametrize("key", [NormKey(stage="bwd_add", hidden_size=1000),
                                 NormKey(norm="layernorm", stage="bwd", itype="fp32", wtype="fp32", otype="fp32",
                                         hidden_size=96, zero_centered_gamma=True),
                                 NormKey(hidden_size=128, otype="fp8e4m3"), NormKey(norm="layernorm", hidden_size=4095)],
                         ids=lambda k: k.name)
def test_x_layout_kernels_match_float64(key, rows, layout, rng, seed, tmp_path, monkeypatch):
    """get_kernel(..., layout) on llvm, x inside NaN-padded wider memory at odd offsets and
    strides: "strided", the middle of wider rows; "heads", rows as tokens x heads (7 heads at 70
    rows) with a padding head between tokens. Every output right against float64 (a read past a
    row's end would bring a NaN in), from a cache entry of its own beside the compact kernels'."""
    from tvmnorm.runtime import Registry, cache_dir
    monkeypatch.setenv("TVMNORM_CACHE", str(tmp_path))
    inputs = make_inputs(key, rows, rng)
    operand = x_in_layout(inputs["x"], layout)
    reg = Registry()
    reg.set_library("llvm", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no FallbackWarning: such a call has no tuned kernel to miss
        kernel = reg.get(key, "llvm", layout)
    assert kernel.origin == f"default:{layout}" and reg.get(key, "llvm", layout) is kernel
    check_outputs(key, inputs, call(kernel, {**inputs, "x": operand}, rows), f"{layout} {key.name} rows={rows} seed={seed}")
    assert any(p.name == f"{key.name}.{layout}.so" for p in cache_dir().rglob("*.so"))
    if layout == "heads" and rows > 1:  # tokens x heads must be the rows of the other operands
        with pytest.raises(ValueError, match="tokens x heads must be the rows"):
            call(kernel, {**inputs, "x": operand[:-1]}, rows)


@pytest.mark.parametrize("layout", ("strided", "heads"))
def test_x_layout_kernels_from_a_librarys_records(layout, rng, seed, tmp_path, monkeypatch):
    """A library keeps its records (build.RECORDS): a tuned key's kernels for x's other layouts
    are its record's traces (replayed on the compact function, then x rewritten; for per-head
    rows a forward's alone, build.layout_record), compiled into a cache entry of that record,
    right against float64; a record its manifest does not vouch for (edited after the build) is
    not used: the default schedule serves."""
    from tvmnorm.build import RECORDS, record_fingerprint
    from tvmnorm.runtime import cache_dir
    from conftest import committed_llvm_records
    monkeypatch.setenv("TVMNORM_CACHE", str(tmp_path / "cache"))
    records = committed_llvm_records()
    keys = [NormKey(stage="bwd", hidden_size=512), NormKey(norm="layernorm", hidden_size=512)]
    assert all(records[k.pack()].get("parts") for k in keys)
    build_library(keys, "llvm", tmp_path / "lib", records, log=lambda *a: None)
    reg = Registry()
    reg.set_library("llvm", tmp_path / "lib")
    for key in keys:
        kernel = reg.get(key, "llvm", layout)
        if layout == "heads" and key.stage != "fwd":
            assert (kernel.origin, kernel.tuned, kernel.layout) == (f"default:{layout}", False, layout)
        else:
            assert (kernel.origin, kernel.tuned, kernel.layout) == (f"tuned:{layout}", True, layout)
            fingerprint = record_fingerprint(records[key.pack()])
            assert any(p.name == f"{key.name}.{layout}.{fingerprint}.so" for p in cache_dir().rglob("*.so"))
        for rows in (1, 70):
            inputs = make_inputs(key, rows, rng)
            check_outputs(key, inputs, call(kernel, {**inputs, "x": x_in_layout(inputs["x"], layout)}, rows),
                          f"tuned {layout} {key.name} rows={rows} seed={seed}")
    kept = json.loads((tmp_path / "lib" / RECORDS).read_text())
    kept[str(keys[1].pack())]["parts"]["fwd"][1] = []  # another record than the one built
    (tmp_path / "lib" / RECORDS).write_text(json.dumps(kept))
    reg.set_library("llvm", tmp_path / "lib")
    assert reg.get(keys[1], "llvm", layout).origin == f"default:{layout}"


def test_library_built_with_x_layouts(rng, seed, tmp_path, monkeypatch):
    """A library built for x's other layouts (build_library(layouts=...)) serves them from its
    own modules, nothing compiled at run time: its tuned keys' records replayed (per-head rows a
    forward's alone), a default key's default schedule, right against float64. A damaged layout
    module is refused with a warning once (the rest of the library still serves) and that
    layout's kernels are compiled instead; a library built for compact rows alone has none."""
    from tvmnorm import runtime
    from tvmnorm.build import layout_library
    from conftest import committed_llvm_records
    monkeypatch.setenv("TVMNORM_CACHE", str(tmp_path / "cache"))
    records = committed_llvm_records()
    keys = [NormKey(stage="bwd", hidden_size=512), NormKey(norm="layernorm", hidden_size=512),
            NormKey(norm="layernorm", stage="bwd_add", hidden_size=1000)]
    assert all(records[k.pack()].get("parts") for k in keys[:2]) and keys[2].pack() not in records
    manifest = build_library(keys, "llvm", tmp_path / "lib", records, log=lambda *a: None, layouts="all")
    assert list(manifest["layouts"]) == ["strided", "heads"]
    reg = Registry()
    reg.set_library("llvm", tmp_path / "lib")
    origin = {"library:tuned", "library:default"}
    for layout in ("strided", "heads"):
        with monkeypatch.context() as m, warnings.catch_warnings():
            warnings.simplefilter("error")
            m.setattr(runtime, "_cached_module", lambda *a, **k: pytest.fail("a library's layout was compiled"))
            for key in keys:
                kernel = reg.get(key, "llvm", layout)
                tuned = key.pack() in records and (layout != "heads" or key.stage == "fwd")
                assert (kernel.origin, kernel.tuned, kernel.layout) == (
                    f"library:{'tuned' if tuned else 'default'}:{layout}", tuned, layout)
                assert reg.get(key, "llvm").origin in origin
                for rows in (1, 70):
                    inputs = make_inputs(key, rows, rng)
                    check_outputs(key, inputs, call(kernel, {**inputs, "x": x_in_layout(inputs["x"], layout)}, rows),
                                  f"library {layout} {key.name} rows={rows} seed={seed}")
    assert not (tmp_path / "cache").exists()

    so = tmp_path / "lib" / layout_library("heads")
    # a damaged file put in its place, as a copy over it would be: written in place, the pages
    # this process has mapped changed under it, and unloading them at exit crashed (SIGSEGV)
    damaged = so.with_name(so.name + ".damaged")
    damaged.write_bytes(so.read_bytes()[:-100])
    os.replace(damaged, so)
    reg.set_library("llvm", tmp_path / "lib")
    assert reg.get(keys[0], "llvm", "strided").origin == "library:tuned:strided"
    with pytest.warns(LibraryRefused, match="heads kernels refused: libtvmnorm.heads.so does not match the sha256"):
        kernel = reg.get(keys[1], "llvm", "heads")
    assert kernel.origin == "tuned:heads"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert reg.get(keys[2], "llvm", "heads").origin == "default:heads"
    inputs = make_inputs(keys[1], 70, rng)
    check_outputs(keys[1], inputs, call(kernel, {**inputs, "x": x_in_layout(inputs["x"], "heads")}, 70),
                  f"compiled heads {keys[1].name} seed={seed}")

    build_library(keys[:1], "llvm", tmp_path / "compact", records, log=lambda *a: None)
    reg.set_library("llvm", tmp_path / "compact")
    assert reg.library("llvm").layouts() == ("compact",) and reg.library("llvm").kernel(keys[0], "strided") is None
    assert reg.get(keys[0], "llvm", "strided").origin == "tuned:strided"


def test_x_layout_named(tmp_path, monkeypatch):
    from tvmnorm.runtime import Registry
    with pytest.raises(ValueError, match="layout must be one of"):
        Registry().get(NormKey(hidden_size=128), "llvm", "rows")


def test_kernel_names_an_argument_that_is_not_an_array():
    """A list or None where the kernel takes an array: a TypeError naming the argument (it was an
    AttributeError about __array_interface__ from the alignment check)."""
    import torch
    from tvmnorm.runtime import get_kernel
    key = NormKey(norm="rmsnorm", stage="fwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=128)
    kernel = get_kernel(key, "llvm")
    x, w, y, rs = torch.randn(8, 128), torch.ones(128), torch.empty(8, 128), torch.empty(8)
    with pytest.raises(TypeError, match=rf"^{key.name}: x must be an array .*, got list$"):
        kernel(x.tolist(), w, y, rs)
    with pytest.raises(TypeError, match=rf"^{key.name}: rsigma must be an array .*, got NoneType$"):
        kernel(x, w, y, None)
    kernel(x, w, y, rs)
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (128,), w, 1e-6))


def test_llvm_kernel_refuses_misaligned_arrays(rng):
    """TVM's llvm kernels take every array as 64-byte aligned (LLVM's aligned vector moves
    crashed on a view at an odd offset): the kernel refuses such an array by name, before any
    compiled code runs; a strided x, whose kernel indexes rows by a symbolic stride, may lie
    anywhere."""
    import numpy as np
    import torch
    from tvmnorm.runtime import get_kernel
    key = NormKey(norm="rmsnorm", stage="fwd", itype="fp32", wtype="fp32", otype="fp32", hidden_size=1024)
    kernel = get_kernel(key, "llvm")
    x = torch.from_numpy(rng.standard_normal(64 * 1024 + 1).astype(np.float32))[1:].view(64, 1024)
    w, y, rs = torch.ones(1024), torch.empty(64, 1024), torch.empty(64)
    with pytest.raises(ValueError, match=r"x's data pointer 0x[0-9a-f]+ is not 64-byte aligned"):
        kernel(x, w, y, rs)
    with pytest.raises(ValueError, match="gamma's data pointer"):
        kernel(x.clone(), torch.ones(1025)[1:], y, rs)
    with pytest.raises(ValueError, match="y's data pointer"):
        kernel(x.clone(), w, torch.empty(64 * 1024 + 4)[4:].view(64, 1024), rs)
    # numpy arrays have no data_ptr, a TVM tensor its own: their pointers are read too
    xn = np.zeros(64 * 1024 + 1, np.float32)[1:].reshape(64, 1024)
    with pytest.raises(ValueError, match=r"x's data pointer 0x[0-9a-f]+ is not 64-byte aligned"):
        kernel(xn, w.numpy(), y.numpy(), rs.numpy())
    import tvm_ffi
    with pytest.raises(ValueError, match="gamma's data pointer"):
        kernel(x.clone(), tvm_ffi.from_dlpack(torch.ones(1025)[1:]), y, rs)
    kernel(x.clone(), w, y, rs)
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (1024,), w, 1e-6))
    wide = torch.from_numpy(rng.standard_normal((64, 1024 + 3)).astype(np.float32))
    strided = get_kernel(key, "llvm", "strided")
    strided(wide[:, 3:], w, y, rs)
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(wide[:, 3:], (1024,), w, 1e-6))


def test_a_cache_that_cannot_be_written_serves_what_it_holds_and_compiles_the_rest_in_memory(
        rng, seed, tmp_path, monkeypatch):
    """TVMNORM_CACHE on a file (or a read-only home) raised the OSError of the cache's mkdir
    from the first call; now the kernels are compiled in memory with one warning a process, right
    against float64, and where the cache holds an entry but its lock cannot be taken (a read-only
    mount) the entry serves without a word."""
    from tvmnorm import runtime
    monkeypatch.setattr(runtime, "_UNCACHED", set())
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TVMNORM_CACHE", str(blocker))
    keys = [NormKey(hidden_size=96), NormKey(norm="layernorm", stage="bwd", hidden_size=96)]
    reg = fresh_registry()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernels = [reg.get(key, "llvm") for key in keys]
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1 and f"the default-kernel cache under {blocker} cannot be written" in said[0], said
    for key, kernel in zip(keys, kernels):
        inputs = make_inputs(key, 9, rng)
        check_outputs(key, inputs, call(kernel, inputs, 9), f"uncached {key.name} seed={seed}")
    assert blocker.read_text() == ""

    monkeypatch.setenv("TVMNORM_CACHE", str(tmp_path / "cache"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        fresh_registry().get(keys[0], "llvm")  # fills the entry
    monkeypatch.setattr(runtime, "_UNCACHED", set())

    def read_only(path):
        raise PermissionError(13, "Read-only file system", str(path))
    monkeypatch.setattr(runtime, "_file_lock", read_only)
    monkeypatch.setattr(runtime, "compile_funcs", lambda *a: pytest.fail("compiled what the cache held"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = fresh_registry().get(keys[0], "llvm")
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
    inputs = make_inputs(keys[0], 5, rng)
    check_outputs(keys[0], inputs, call(kernel, inputs, 5), f"read-only cache seed={seed}")
