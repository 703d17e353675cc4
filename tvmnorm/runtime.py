"""The runtime registry: NormKey -> callable kernel.

Lookup follows dlight's shape, "not mine" is a value: the loaded tuned library answers if it
has the key, otherwise the default schedule is compiled for that key (once per process, cached
on disk across processes) and a one-time warning says so, in TransformerEngine's words.

Kernel calling convention (all arrays are DLPack tensors, e.g. torch tensors passed directly;
2-D arrays are [rows, hidden] and row-contiguous; outputs are allocated by the caller):

  rmsnorm   fwd      k(x, gamma, y, rsigma, eps=)
            fwd fp8  k(x, gamma, scale, y, rsigma, amax, eps=)          scale, amax: fp32 [1]
  layernorm fwd      k(x, gamma, beta, y, mu, rsigma, eps=)
            fwd fp8  k(x, gamma, beta, scale, y, mu, rsigma, amax, eps=)
  rmsnorm   fwd_add  k(x, residual, gamma, y, h, rsigma, eps=)           h = x + residual, y = norm(h)
  layernorm fwd_add  k(x, residual, gamma, beta, y, h, mu, rsigma, eps=)  (fp8: scale after beta, amax last)
  rmsnorm   bwd      k(dy, x, rsigma, gamma, dx, dgamma)
            bwd_add  k(dy, x, rsigma, gamma, dz, dx, dgamma)            dx = grad + dz
  layernorm bwd      k(dy, x, mu, rsigma, gamma, dx, dgamma, dbeta)
            bwd_add  k(dy, x, mu, rsigma, gamma, dz, dx, dgamma, dbeta)

mu and rsigma are in ctype (fp32), one per row; ``k.signature`` lists the names in order.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import sys
import tempfile
import threading
import warnings

from .build import (DECODE_PARTS, LIBRARY, MANIFEST, NARROW_PARTS, OPTIONAL_DECODE_PARTS, RECORDS,
                    SMALL_DX_CHUNK_ROWS, X_LAYOUTS, chunk_rows_of, compile_funcs, decode_prefix, file_sha256,
                    key_funcs, layout_record, narrow_prefix, record_fingerprint, scheduled_funcs, small_call_symbol,
                    small_dx_symbol, source_hash)
from .key import DTYPE_BYTES, TVM_DTYPE, NormKey
from .targets import KINDS, arch_of, cache_root, cuda_arch, target_name

FALLBACK_MESSAGE = ("Falling back to general normalization kernel because no tuned kernel is available "
                    "for this config. {}")
DEFAULT_LIBRARY_ROOT = pathlib.Path(__file__).resolve().parent / "_lib"


class FallbackWarning(UserWarning):
    """A key has no tuned kernel; the general (default-schedule) kernel serves it."""


class LibraryRefused(RuntimeWarning):
    """A library failed verification; default kernels serve instead."""


def signature(key: NormKey) -> list:
    ln = key.norm == "layernorm"
    if key.forward:
        adds = key.stage == "fwd_add"
        ins = ["x"] + (["residual"] if adds else []) + ["gamma"] + (["beta"] if ln else []) \
            + (["scale"] if key.fp8_out else [])
        return (ins + ["y"] + (["h"] if adds else []) + (["mu"] if ln else []) + ["rsigma"]
                + (["amax"] if key.fp8_out else []))
    stats = ["mu", "rsigma"] if ln else ["rsigma"]
    return (["dy", "x"] + stats + ["gamma"] + (["dz"] if key.stage == "bwd_add" else [])
            + ["dx", "dgamma"] + (["dbeta"] if ln else []))


# Above this many partial rows the bwd sums them in two stages (combine, then finalize): the
# partial count alone decides, so the summation order, and the result, depend on the shape only.
# 16384 tokens give 512 partials at T = 32 (one stage) except at hidden 128 (16384: two).
COMBINE_ABOVE = 1024


def combined_rows(count: int) -> int | None:
    """The partial rows combine leaves of ``count`` before finalize sums them, or None where
    finalize sums the ``count`` alone (COMBINE_ABOVE decides). The runtime and the tuner, which
    times the partial sum with each dx candidate, both ask here."""
    from .compute.norms import combined_partials
    return combined_partials(count) if count > COMBINE_ABOVE else None


def partials(rows: int, key: NormKey, kind: str, chunk_rows: int | None = None) -> int:
    """How many dgamma/dbeta partial rows the backward writes: one per chunk of T rows of the dx
    kernel (``chunk_rows``: a library kernel's T from its manifest; default
    rows_per_partial(key, kind)). It depends only on the shape, key, target and kernel, and the
    partials are summed in a fixed order (no atomics), so dgamma is bitwise reproducible."""
    from .compute.norms import num_partials, rows_per_partial
    return num_partials(rows, chunk_rows or rows_per_partial(key, kind))


def _alloc(like, shape, dtype: str, zero: bool = False):
    """Scratch memory on the same device and from the same library as ``like`` (zeroed if
    ``zero``)."""
    mod = type(like).__module__
    if mod.startswith("torch"):
        # like is a torch tensor, so torch is loaded; new_empty takes its device without a
        # torch.device object (a few us of a decode-size backward call)
        torch = sys.modules["torch"]
        return (like.new_zeros if zero else like.new_empty)(shape, dtype=getattr(torch, dtype))
    if mod.startswith("numpy"):
        import numpy as np
        return (np.zeros if zero else np.empty)(shape, dtype=dtype)
    from ._tvm import empty
    import tvm_ffi
    dev_type, dev_id = like.__dlpack_device__()
    out = empty(shape, dtype, tvm_ffi.device(int(dev_type), int(dev_id)))
    if zero:
        import numpy as np
        out.copyfrom(np.zeros(shape, dtype=dtype))
    return out


# A tuned library serves forward calls of at most this many bytes of x (decode: 1-256 tokens,
# up to 4 MiB at hidden 8192 in bf16; QK-norm's 8192 rows of 128, 2 MiB) with the small-call
# kernel, the default rule's (sched.default.small_call_cuda_heuristic: a row split thinner than
# the forward's, one barrier a row sum), which it holds beside the tuned one
# (build.small_call_funcs; a default key holds one where it differs from its forward); the
# smallest training call of the catalog is 16 MiB. Records are tuned at training rows, and at
# decode rows the default, which keeps its row in registers with at most 8 vectors a thread, was
# the faster of the two: on the H200 (bench/results/h200-tuned-run8.json, eighth lease, 60 decode cells with
# both) 3.5% faster on average, >2% faster in 35, >2% slower in 7 (at most 0.4 us), and never
# behind the best of torch eager and Liger, where the tuned records were in 4 cells.
# The small-call kernel with its weights loaded with x, before the row sums' barriers
# (early_weights), lost to it at these rows: geomean 0.965x layernorm, 0.988x rmsnorm over the 96
# bf16 decode cells, 10-21% slower at hidden >= 3584 (bench/results/h200-run40/README.md).
SMALL_CALL_BYTES = 4 << 20


def is_small_call(key: NormKey, rows: int) -> bool:
    """Whether a call of ``rows`` rows of ``key`` is a small call: a forward of at most
    SMALL_CALL_BYTES of x, which the small-call kernel serves where the key has one (a tuned
    record, or build.has_own_small_call)."""
    return key.forward and rows <= small_call_rows(key)


def small_call_rows(key: NormKey) -> int:
    """The most rows of a small call of ``key`` (at most SMALL_CALL_BYTES of x)."""
    return SMALL_CALL_BYTES // (key.hidden_size * DTYPE_BYTES[key.itype])


# How a backward call past the decode rows (decode_bwd_rows) cuts its dx into chunks of T rows
# (one block lane walks a chunk's rows one after another and writes one fp32 partial row a sum for
# it): the key's own T (32 or 64, tuned at 16384 tokens) for calls of FULL_GRID_CHUNKS chunks of
# it, else T = 8 (build.SMALL_DX_CHUNK_ROWS). Whole calls at each T on the H200 (bench/results/
# h200-run17/bwd-small.*, `bench/bwd_parts.py --small-rows`): at 128 chunks of 32 rows (4096
# rows) T = 8 ran 1.3-2.2x faster (rmsnorm 1024: 48.8 -> 25.3 us), at 512 the own T won from
# hidden 896 up. (T = 1, one row a chunk, served the calls the decode backward serves now.)
FULL_GRID_CHUNKS = 256
# A key with no tuned record (the default rule's dx) keeps its own T only from this many elements
# (rows x hidden) as well: at narrow widths the default's dx at T = 32 is slower than the tuned
# records' (hidden 128 x 16384 rows: 29.1 us against the record's 23.8), and T = 8 beat it well
# past 256 chunks (bench/results/h200-run21/, rule-fit.txt: rmsnorm 128 x 65536 rows 29.1
# against 39.7 us, 512 x 16384 33.1 against 37.2, 1000 x 8192 41.6 against 55.7), up to 8.4M
# elements; from 16.4M its own T won (layernorm 1000 x 16384: 63.9 against 72.0, 512 x 32768
# 48.5 against 52.0). Over the 118 default-kernel calls past the decode rows measured in the
# 17th, 20th and 21st leases this took the sum from 8589 to 8379 us (the best T at each: 8288).
# The tuned records' own T lost to T = 8 by 17% at exactly 256 chunks at hidden 512 (8192 rows)
# and by at most 4% past them, and every elements threshold cost the records more than it saved.
DEFAULT_OWN_T_ELEMENTS = 12 << 20

# A CUDA backward call of at most decode_bwd_rows(hidden) rows runs the decode backward
# (build.decode_funcs: dx with no partials, then wgrad's column sums of dy and x) instead of the
# dx at short chunks and finalize: at 64 and 256 tokens the dx at T = 1 or 8 and finalize took
# 1.5-3x torch eager's two kernels on the H200 (bench/results/h200-run19/decode-bwd-kernels.txt),
# which compute the weight gradient that way. Whole calls of 64-4096 rows at every catalog width
# (bench/results/h200-run20/bwd-small-*.log): it was faster at every width up to 1024 rows
# (rmsnorm 4096 x 1024: 22.0 us against T = 8's 27.1; level at rmsnorm 7168/8192), and at 2048
# rows up to hidden 2048 (layernorm 2048: 25.4 against 30.4; rmsnorm 1536 lost 20.5 to 19.6);
# past that wgrad's few blocks (one a column tile, each walking every row) lose to the partials'
# grid (rmsnorm 4096 x 2048: 40.6 against 37.0).
DECODE_BWD_ROWS = 1024
DECODE_BWD_NARROW_ROWS, DECODE_BWD_NARROW_HIDDEN = 2048, 2048
# A decode backward call of at most WGRAD_FEW_ROWS rows sums the weight gradient with wgrad_few
# (sched.default.WGRAD_FEW_SPLIT), one of at most WGRAD_MID_ROWS with wgrad_mid
# (sched.default.wgrad_mid_split), more rows with finalize's split.
WGRAD_FEW_ROWS = 64
WGRAD_MID_ROWS = 512


def wgrad_part(rows: int) -> str:
    """The decode backward's wgrad kernel for a call of ``rows`` rows."""
    return "wgrad_few" if rows <= WGRAD_FEW_ROWS else "wgrad_mid" if rows <= WGRAD_MID_ROWS else "wgrad"


def decode_bwd_rows(hidden: int) -> int:
    """The most rows a backward call of ``hidden`` columns runs the decode backward for."""
    return DECODE_BWD_NARROW_ROWS if hidden <= DECODE_BWD_NARROW_HIDDEN else DECODE_BWD_ROWS


def is_decode_call(key: NormKey, rows: int) -> bool:
    """Whether a CUDA library serves a backward call of ``rows`` rows of ``key`` with the decode
    backward (decode_bwd_rows; calls that need int64 offsets keep the chunked one)."""
    h = key.hidden_size
    return key.stage in ("bwd", "bwd_add") and 0 < rows <= decode_bwd_rows(h) and fits_int32(rows, h)


def runs_no_record(key: NormKey, rows: int, kind: str) -> bool:
    """Whether a library of ``kind`` serves a call of ``rows`` rows of ``key`` with kernels no
    record schedules, whatever record it holds: the forward's small-call kernel (is_small_call)
    or a CUDA backward's decode backward (is_decode_call). Such a call's time says nothing of
    the key's record, so benchmarks of libraries with another record of it count for it."""
    return is_small_call(key, rows) or (kind == "cuda" and is_decode_call(key, rows))


def own_t_rows(t: int, hidden: int, tuned: bool = True) -> int:
    """The fewest rows of a backward call whose dx runs at the key's own ``t`` (FULL_GRID_CHUNKS
    chunks of it; for a default kernel, DEFAULT_OWN_T_ELEMENTS elements too)."""
    rows = (FULL_GRID_CHUNKS - 1) * t + 1
    return rows if tuned else max(rows, -(-DEFAULT_OWN_T_ELEMENTS // hidden))


def dx_chunk_rows(rows: int, t: int, shorter=SMALL_DX_CHUNK_ROWS, hidden: int = 1, tuned: bool = True) -> int:
    """T for a backward call of ``rows`` rows, given the key's own ``t`` and the ``shorter`` T
    its kernel holds: ``t`` from own_t_rows on, else the longest shorter one."""
    if rows >= own_t_rows(t, hidden, tuned):
        return t
    return max((s for s in shorter if s < t), default=t)


# Rows of slack in fits_int32: a row kernel's index math reaches past the last row to the end of
# its last block (guarded, but computed): a forward block holds at most 16 rows, a dx block at
# most 16 chunks of at most 64 rows (sched.space.ROWS, compute.norms.CUDA_CHUNK_ROWS): 1024.
_NARROW_SLACK_ROWS = 1024


def narrow_rows(hidden: int) -> int:
    """The most rows of ``hidden`` a call may have and index within int32: (rows + slack) *
    hidden < 2^31."""
    return ((1 << 31) - 1) // hidden - _NARROW_SLACK_ROWS


# Row counts a NormKernel keeps its backward plan for (NormKernel.bwd_plan); past them it starts
# over, so a run of ever new row counts holds at most this many.
BWD_PLANS = 64


def fits_int32(rows: int, hidden: int) -> bool:
    """Whether a call of ``rows`` rows of ``hidden`` indexes within int32 (the kernels with an
    int32 row count serve it, build.NARROW_PARTS)."""
    return rows <= narrow_rows(hidden)


def checked_eps(eps, who: str) -> float:
    """``eps`` as the kernels take it, refused where it would make y NaN rather than compute a
    norm: a negative eps makes every row whose mean square (variance) is below -eps NaN, a NaN
    eps every row (torch computes both without a word)."""
    try:
        value = float(eps)
    except (TypeError, ValueError):
        raise TypeError(f"{who}: eps must be a number, got {eps!r}") from None
    if not value >= 0:
        raise ValueError(f"{who}: eps must be a non-negative number, got {value}")
    return value


# TVM's llvm packed functions take every tensor's data as this aligned (llvm.assume), and LLVM
# uses aligned vector moves where an offset from it is a provable multiple of the vector: a
# misaligned array crashed the process, so NormKernel refuses it (tvmnorm.torch copies instead).
LLVM_ALIGNMENT = 64


def _data_ptr(a) -> int:
    """The data pointer of a torch tensor, a TVM tensor or a numpy array. A torch tensor's
    method is tried first: an llvm call checks six arrays, and the plain call halves the ~1.2 us
    that looking the attribute up and testing it took."""
    try:
        return a.data_ptr()
    except (AttributeError, TypeError):  # numpy has none; a TVM tensor's data_ptr is an int
        ptr = getattr(a, "data_ptr", None)
        return a.__array_interface__["data"][0] if ptr is None else int(ptr)


class NormKernel:
    """One key's kernel: a callable over DLPack arrays, see the module docstring. ``funcs`` (part
    -> callable) have an int``row_bits`` row count; ``narrow`` (part -> callable, int32 rows)
    serve the calls that fit int32 offsets in their place, and ``small`` (part -> callable)
    forward calls of at most SMALL_CALL_BYTES of x."""

    def __init__(self, key: NormKey, kind: str, funcs: dict, tuned: bool, origin: str,
                 chunk_rows: int | None = None, small: dict | None = None, row_bits: int = 64,
                 narrow: dict | None = None, wide=None, small_dx: dict | None = None, decode: dict | None = None,
                 layout: str = "compact"):
        self.key, self.kind, self.tuned, self.origin, self.layout = key, kind, tuned, origin, layout
        self.row_bits = row_bits  # 32: kernels with an int32 row count (compute.symbolic_rows)
        self.chunk_rows = chunk_rows  # T of the bwd dx kernel (None: the default for the key)
        self.signature = signature(key)
        self._f = funcs  # part -> callable
        self._narrow = {**funcs, **(narrow or {})}
        # () -> part -> callable: the int64 row kernels ``funcs`` lacks, compiled on the first
        # call past int32 offsets (Registry._default)
        self._wide, self._wide_lock = wide, threading.Lock()
        self._small = small or {}
        self._small_dx = small_dx or {}  # T -> the dx kernel at chunks of T rows (int32 rows)
        self._decode = decode or {}  # DECODE_PARTS: the decode backward (int32 rows)
        self._ctype = TVM_DTYPE[key.ctype]
        # A forward without fp8's amax passes its arrays through as they come (signature order),
        # and the kernel a call runs depends on its row count alone: is_small_call and fits_int32
        # as row bounds, so that a decode call (a few us of GPU time) pays no Python for them.
        self._nargs = len(self.signature)
        # the array a call's row count is read from: x, but for per-head rows ([tokens, heads,
        # hidden]) the compact y or dy, against which the kernels check x's tokens x heads
        self._rows_at = self.signature.index("x" if layout != "heads" else "y" if key.forward else "dy")
        self._plain_fwd = key.forward and not key.fp8_out
        # llvm: the arrays whose base must be LLVM_ALIGNMENT-aligned (all but a strided or
        # per-head x, which its kernels index by a symbolic stride)
        self._aligned = [] if kind == "cuda" else [
            (i, n) for i, n in enumerate(self.signature) if layout == "compact" or n != "x"]
        self._default_eps = 1e-5 if key.norm == "layernorm" else 1e-6
        self._small_rows = small_call_rows(key) if key.forward and "fwd" in self._small else -1
        self._narrow_rows = narrow_rows(key.hidden_size)
        if key.fp8_out:
            from .compute.norms import AMAX_ONE_ROWS
            self._amax_zero, self._amax_one_rows = funcs.get("amax_zero"), AMAX_ONE_ROWS
        if not key.forward:
            # a backward's arrays by position: the dx kernel takes the signature up to dx, the
            # decode wgrad dy, x and the statistics, finalize the weights' gradients after dx
            self._dx_end = self.signature.index("dx") + 1
            self._row_inputs = self.signature.index("gamma")
            self._plans = {}  # rows -> _plan_bwd(rows)

    def parts_for(self, rows: int) -> dict:
        """part -> the kernel a call of ``rows`` rows runs (int32 rows where the call fits)."""
        if rows <= self._narrow_rows:  # fits_int32
            return self._narrow
        if self.row_bits == 32:
            # int32 offsets would wrap: the kernel would read and write the wrong elements
            raise ValueError(f"this kernel indexes rows in int32 and serves calls of fewer than 2^31 elements "
                             f"per tensor; got {rows} rows of {self.key.hidden_size}")
        if self._wide is not None:
            with self._wide_lock:
                if self._wide is not None:
                    self._f = {**self._f, **self._wide()}
                    self._wide = None
        return self._f

    def forward_for(self, rows: int):
        """The forward kernel a call of ``rows`` rows runs: the small-call one at most
        SMALL_CALL_BYTES of x, where the library holds one."""
        if rows <= self._small_rows:
            return self._small["fwd"]
        return self.parts_for(rows)["fwd"]

    def own_chunk_rows(self) -> int:
        """The T of the backward's own dx kernel (the record's, else the default's)."""
        from .compute.norms import rows_per_partial
        return self.chunk_rows or rows_per_partial(self.key, self.kind)

    def decodes(self, rows: int) -> bool:
        """Whether a backward call of ``rows`` rows runs the decode backward (decode_bwd_rows)."""
        return bool(self._decode) and is_decode_call(self.key, rows)

    def dx_for(self, rows: int) -> tuple:
        """(T, the dx kernel) a backward call of ``rows`` rows runs: the key's own T, or a shorter
        one where the call has too few chunks of it to fill the GPU (dx_chunk_rows)."""
        t, h = self.own_chunk_rows(), self.key.hidden_size
        if self._small_dx and fits_int32(rows, h):
            short = dx_chunk_rows(rows, t, tuple(self._small_dx), h, self.tuned)
            if short != t:
                return short, self._small_dx[short]
        return t, self.parts_for(rows)["dx"]

    def __repr__(self):
        return f"NormKernel({self.key.norm} {self.key.stage} {self.key.describe()}, {self.kind}, {self.origin})"

    def __call__(self, *arrays, eps: float | None = None):
        if len(arrays) != self._nargs:
            raise TypeError(f"{self.key.norm} {self.key.stage} kernel takes {len(self.signature)} arrays "
                            f"({', '.join(self.signature)}), got {len(arrays)}")
        try:
            for i, name in self._aligned:
                if _data_ptr(arrays[i]) % LLVM_ALIGNMENT:
                    raise ValueError(f"{self.key.name}: {name}'s data pointer {_data_ptr(arrays[i]):#x} is not "
                                     f"{LLVM_ALIGNMENT}-byte aligned, which TVM's llvm kernels assume (LLVM moves "
                                     f"vectors with aligned instructions, which would crash on it); it comes from "
                                     f"a view at an odd offset: pass a copy (t.clone())")
            rows = int(arrays[self._rows_at].shape[0])
        except AttributeError:
            # checked only once a lookup failed: a call pays nothing for it
            i = next((i for i, a in enumerate(arrays) if not hasattr(a, "shape")), None)
            if i is None:
                raise
            raise TypeError(f"{self.key.name}: {self.signature[i]} must be an array (a torch, TVM or numpy "
                            f"tensor), got {type(arrays[i]).__name__}") from None
        if self._plain_fwd:
            if rows or self.kind != "cuda":  # CUDA rejects an empty grid
                self.forward_for(rows)(*arrays, checked_eps(self._default_eps if eps is None else eps, self.key.name))
            return None
        if self.key.forward:
            return self._fp8_fwd(arrays, rows, checked_eps(self._default_eps if eps is None else eps, self.key.name))
        return self._bwd(arrays, rows)

    def _fp8_fwd(self, arrays, rows, eps):
        """The fp8 forward: amax (the signature's last array) is the rows' maxima, which the
        forward folds into it after amax_zero where the kernels do so (compute.norms.folds_amax),
        else writes out for the amax kernels after it."""
        launch = rows > 0 or self.kind != "cuda"  # CUDA rejects an empty grid
        args, amax = arrays[:-1], arrays[-1]
        fwd = self.forward_for(rows)
        if self._amax_zero is not None:
            self._amax_zero(amax)
            if launch:
                fwd(*args, amax, eps)
            return
        amax_row = _alloc(arrays[0], (rows,), "float32")
        if launch:
            fwd(*args, amax_row, eps)
        parts = self.parts_for(rows)
        if rows <= self._amax_one_rows:
            parts["amax_one"](amax_row, amax)
        else:
            from .compute.norms import amax_partials
            parts["amax"](amax_row, _alloc(arrays[0], (amax_partials(rows),), "float32"), amax)

    def bwd_plan(self, rows: int) -> tuple:
        """(dx kernel, partial sums' shape, combine's output shape, wgrad kernel) of a backward
        call of ``rows`` (> 0) rows: the decode backward's pair with no partials, else the dx
        kernel at its T (dx_for), its partials (None for combine's shape where finalize sums
        them alone) and finalize. Kept per row count, so that a call pays one dict lookup for
        what is ~10 us of Python: training and decoding repeat a few row counts."""
        plan = self._plans.get(rows)
        if plan is None:
            if len(self._plans) >= BWD_PLANS:
                self._plans.clear()
            plan = self._plans[rows] = self._plan_bwd(rows)
        return plan

    def _plan_bwd(self, rows: int) -> tuple:
        if self.decodes(rows):
            return self._decode["dx"], None, None, self._decode[wgrad_part(rows)]
        s, h = self.key.column_sums, self.key.hidden_size
        t, dx = self.dx_for(rows)
        count = partials(rows, self.key, self.kind, t)
        mid_rows = combined_rows(count)
        return dx, (s, count, h), None if mid_rows is None else (s, mid_rows, h), self._f["finalize"]

    def _bwd(self, arrays, rows):
        dx_args, wgrad = arrays[:self._dx_end], arrays[self._dx_end:]
        if rows == 0:
            # no rows, no dx launch: dgamma/dbeta of nothing are the sum of one zero partial (a
            # zero-extent partial array is refused: torch gives it strides that are not the
            # compact ones TVM checks)
            part = _alloc(arrays[1], (self.key.column_sums, 1, self.key.hidden_size), self._ctype, zero=True)
            self._f["finalize"](part, *wgrad)
            return
        dx, part_shape, mid_shape, wgrad_fn = self.bwd_plan(rows)
        if part_shape is None:  # the decode backward: dgamma/dbeta straight from dy and x
            dx(*dx_args)
            wgrad_fn(*arrays[:self._row_inputs], *wgrad)
            return
        # one pass over dy and x: dx and the per-chunk partial sums, then their fixed-order sum
        part = _alloc(arrays[1], part_shape, self._ctype)
        dx(*dx_args, part)
        if mid_shape is not None:
            mid = _alloc(arrays[1], mid_shape, self._ctype)
            self._f["combine"](part, mid)
            part = mid
        wgrad_fn(part, *wgrad)


def _kernel_from_module(key, kind, mod, tuned, origin, chunk_rows=None, row_bits=64, wide=None,
                        layout: str = "compact"):
    """A key's NormKernel from a module of key_funcs (or scheduled_funcs) symbols, with x in
    ``layout``: the int32-row and small-call kernels serve where the module holds them; ``wide``
    compiles the int64 row kernels it may leave out (Registry._default)."""
    from .compute.norms import parts_of
    have = lambda name: mod.implements_function(name)  # noqa: E731
    narrow = {p: mod[f"{narrow_prefix(key)}_{p}"] for p in NARROW_PARTS if have(f"{narrow_prefix(key)}_{p}")}
    small = {"fwd": mod[small_call_symbol(key)]} if have(small_call_symbol(key)) else None
    small_dx = {t: mod[small_dx_symbol(key, t)] for t in SMALL_DX_CHUNK_ROWS if have(small_dx_symbol(key, t))}
    decode = {p: mod[f"{decode_prefix(key)}_{p}"] for p in DECODE_PARTS if have(f"{decode_prefix(key)}_{p}")}
    for part, stand_in in OPTIONAL_DECODE_PARTS.items():  # a library builds it where it differs
        if stand_in in decode:
            decode.setdefault(part, decode[stand_in])
    decode = decode if all(p in decode for p in DECODE_PARTS) else None
    funcs = {p: mod[f"{key.name}_{p}"] for p in parts_of(key, kind) if have(f"{key.name}_{p}")}
    lacking = [p for p in parts_of(key, kind) if p not in funcs]
    if lacking and (wide is None or any(p not in narrow for p in lacking)):
        raise ValueError(f"module for {key.name} lacks its {', '.join(lacking)} kernel")
    return NormKernel(key, kind, funcs, tuned, origin, chunk_rows, small, row_bits, narrow,
                      wide if lacking else None, small_dx, decode, layout)


def variant_kernel(key: NormKey, kind: str, row_config=None, row_bits: int = 64, group_rows: int = 1) -> NormKernel:
    """The key's kernels with its row kernel (fwd, or the backward's dx) scheduled by
    ``row_config`` (a CudaRowConfig or CpuRowConfig: a point of the tuned space; None: the
    default rule's), an int``row_bits`` row count and ``group_rows`` rows per row reduction of
    the dx kernel, compiled in this process: the GPU tests and the bench probes check and time
    such points."""
    funcs = scheduled_funcs(key, kind, row_config=row_config, row_bits=row_bits, group_rows=group_rows)
    return _kernel_from_module(key, kind, compile_funcs(funcs, kind).mod, False, "variant",
                               chunk_rows_of(funcs), row_bits=row_bits)


def record_kernel(key: NormKey, kind: str, record: dict | None, origin: str = "record") -> NormKernel:
    """The key's kernels as a library holds them for ``record`` (build.key_funcs: on CUDA the
    int32-row copies too; a record of no traces and ``rows_per_partial`` T is the default rule
    at chunks of T, as tune.default_record writes), compiled in this process: the probes time
    what a library would serve without building one. On CUDA they are compiled as a library
    compiles them (cuda_aot: nvcc, programmatic dependent launch on sm_90) where cuda_aot.jit_nvcc
    says so, as the default-kernel cache does: TVM's NVRTC module launches them plainly, and on
    an H100 the chunk sweep's dx + finalize so built timed 6% under a library's whole call
    (bench/results/h100-run84/), built by nvcc within 2.5% of it (h100-run85/)."""
    from .cuda_aot import jit_nvcc, load_cuda_library
    funcs = key_funcs(key, kind, record)
    if kind == "cuda" and jit_nvcc():
        mod = load_cuda_library(funcs, arch_of(kind))
    else:
        mod = compile_funcs(funcs, kind).mod
    return _kernel_from_module(key, kind, mod, bool(record and record.get("parts")), origin, chunk_rows_of(funcs))


def _elf_problem(path) -> str | None:
    """Why ``path`` is not a whole ELF shared object, or None. dlopen of a truncated .so whose
    headers survive maps segments past the end of the file and dies of SIGBUS on first touch,
    so the extents in the headers are checked against the file size before loading."""
    import struct
    data = pathlib.Path(path).read_bytes()
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return "is not a 64-bit little-endian ELF file"
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    if end > len(data):
        return f"is truncated ({len(data)} bytes, its headers need {end})"
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1 and p_offset + p_filesz > len(data):  # PT_LOAD
            return f"is truncated ({len(data)} bytes, a segment ends at {p_offset + p_filesz})"
    return None


def _module_file_problem(so: pathlib.Path, sha256) -> str | None:
    """What is wrong with a library's module file ``so`` against its manifest's ``sha256``, or None."""
    if not so.is_file():
        return "is missing"
    if file_sha256(so) != sha256:
        return "does not match the sha256 in its manifest"
    return _elf_problem(so)


class TunedLibrary:
    """A verified library directory: manifest + libtvmnorm.so (+ a module for each other x
    layout it was built for, build.layout_library, verified on first use)."""

    def __init__(self, path, kind: str):
        from ._tvm import FFI_VERSION, TVM_VERSION, cuda_device_arch
        self.path = pathlib.Path(path)
        mf = self.path / MANIFEST
        try:
            manifest = json.loads(mf.read_text())
            so = self.path / manifest["library"]
            kernels = {int(e["key"]): e for e in manifest["kernels"]}
            # layout -> (its module's file, sha256)
            layout_files = {str(name): (str(info["library"]), str(info["sha256"]))
                            for name, info in manifest.get("layouts", {}).items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"unreadable manifest {mf}: {e}") from None
        problems = []
        if manifest.get("target") != kind:
            problems.append(f"it targets {manifest.get('target')}, not {kind}")
        if manifest.get("tvm_version") != TVM_VERSION:
            problems.append(f"built with TVM {manifest.get('tvm_version')}, running {TVM_VERSION}")
        if manifest.get("ffi_version") != FFI_VERSION:
            problems.append(f"built with tvm-ffi {manifest.get('ffi_version')}, running {FFI_VERSION}")
        if manifest.get("tvmnorm_source_hash") != source_hash():
            problems.append(f"built from kernel sources {manifest.get('tvmnorm_source_hash')}, "
                            f"these are {source_hash()}")
        here = cuda_device_arch() if kind == "cuda" else arch_of("llvm")
        if kind == "cuda" and here is None:
            problems.append("no CUDA device is available")
        elif manifest.get("arch") != here:
            problems.append(f"built for {manifest.get('arch')}, this machine is {here}")
        bad_file = _module_file_problem(so, manifest.get("sha256"))
        if bad_file:
            problems.append(f"{so.name} {bad_file}")
        if problems:
            raise ValueError(f"library {self.path} refused: " + "; ".join(problems))
        self.manifest, self.kernels, self._records = manifest, kernels, None
        self.module = self._load(so)
        self._layout_files, self._layout_modules = layout_files, {}

    def _load(self, so: pathlib.Path):
        from ._tvm import load_module
        try:
            return load_module(str(so.resolve()))
        except Exception as e:  # noqa: BLE001 - a broken .so must not take the process down
            raise ValueError(f"library {self.path} refused: cannot load {so.name}: {e}") from None

    def layouts(self) -> tuple:
        """x's layouts the library holds kernels for (build.X_LAYOUTS), compact first."""
        return ("compact", *self._layout_files)

    def _layout_module(self, layout: str):
        """The module of the library's kernels for x in ``layout``, checked as the compact one
        is (its sha256 in the manifest, a whole ELF file) on first use: a process that never
        sees such x never reads it. Raises ValueError for a missing or damaged one (each call:
        the refusal is kept, not the file hashed again)."""
        if layout not in self._layout_modules:
            name, sha256 = self._layout_files[layout]
            so = self.path / name
            problem = _module_file_problem(so, sha256)
            try:
                if problem:
                    raise ValueError(f"library {self.path}'s {layout} kernels refused: {so.name} {problem}")
                self._layout_modules[layout] = self._load(so)
            except ValueError as e:
                self._layout_modules[layout] = e
        found = self._layout_modules[layout]
        if isinstance(found, ValueError):
            raise found
        return found

    def kernel(self, key: NormKey, layout: str = "compact"):
        """The library's kernels of ``key`` for x in ``layout``, or None where it holds none
        (no such key, or a layout it was not built for)."""
        entry = self.kernels.get(key.pack())
        if entry is None or layout not in self.layouts():
            return None
        compact = layout == "compact"
        what = entry if compact else entry.get("layouts", {}).get(layout)
        if what is None:
            return None
        module = self.module if compact else self._layout_module(layout)
        origin = f"library:{what['origin']}" + ("" if compact else f":{layout}")
        # a manifest entry without rows_per_partial (a forward kernel) leaves T to the default
        return _kernel_from_module(key, self.manifest["target"], module, what["origin"] == "tuned", origin,
                                   what.get("rows_per_partial"), layout=layout)

    def record(self, key: NormKey) -> dict | None:
        """The record the library's kernels of ``key`` were built from (build.RECORDS), or None:
        no tuned record, a library built before the records were kept, or one whose
        fingerprint is not the manifest's (then the default schedule serves, as it would have
        without a library)."""
        entry = self.kernels.get(key.pack())
        if entry is None or entry.get("record") is None:
            return None
        if self._records is None:
            try:
                self._records = json.loads((self.path / RECORDS).read_text())
            except (OSError, ValueError):
                self._records = {}
        record = self._records.get(str(key.pack()))
        return record if record is not None and record_fingerprint(record) == entry["record"] else None


def default_library_path(kind: str) -> pathlib.Path:
    env = os.environ.get("TVMNORM_LIBRARY")
    if env:
        return pathlib.Path(env)
    return DEFAULT_LIBRARY_ROOT / kind


def cache_dir() -> pathlib.Path:
    from ._tvm import FFI_VERSION, TVM_VERSION
    return cache_root() / f"{source_hash()}-tvm{TVM_VERSION}-ffi{FFI_VERSION}"


@contextlib.contextmanager
def _file_lock(path: pathlib.Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Registry:
    """Thread-safe key -> kernel map for one process."""

    def __init__(self):
        self._lock = threading.RLock()
        self._kernels = {}
        self._libraries = {}
        self._warned = set()

    def library(self, kind: str):
        with self._lock:
            if kind not in self._libraries:
                self._libraries[kind] = self._load_library(kind)
            return self._libraries[kind]

    def _load_library(self, kind):
        path = default_library_path(kind)
        explicit = "TVMNORM_LIBRARY" in os.environ
        if not (path / MANIFEST).exists() and not (path / LIBRARY).exists():
            if explicit:
                warnings.warn(f"TVMNORM_LIBRARY={path} holds no tvmnorm library; default kernels serve",
                              LibraryRefused, stacklevel=4)
            return None
        try:
            return TunedLibrary(path, kind)
        except ValueError as e:
            warnings.warn(f"{e}. Default kernels serve instead.", LibraryRefused, stacklevel=4)
            return None

    def set_library(self, kind: str, path) -> None:
        """Use the library at ``path`` for ``kind`` (raises ValueError if it is refused)."""
        lib = TunedLibrary(path, kind) if path is not None else None
        with self._lock:
            self._libraries[kind] = lib
            self._kernels = {k: v for k, v in self._kernels.items() if k[1] != kind}

    def get(self, key: NormKey, kind: str, layout: str = "compact") -> NormKernel:
        """``layout``: how the kernels' x lies in memory (build.X_LAYOUTS); other than "compact"
        the library's kernels for it where it was built with them, else from the default-kernel
        cache: compiled from the library's record of the key where it has one
        (TunedLibrary.record; for per-head rows a forward's alone, build.layout_record), else
        the default schedule's, without a FallbackWarning."""
        if not isinstance(key, NormKey):
            raise TypeError(f"key must be a NormKey, got {type(key).__name__}")
        if kind not in KINDS:
            raise ValueError(f"target must be one of {KINDS}, got {kind!r}")
        if layout not in X_LAYOUTS:
            raise ValueError(f"layout must be one of {X_LAYOUTS}, got {layout!r}")
        with self._lock:
            hit = self._kernels.get((key, kind, layout))
            if hit is not None:
                return hit
            lib = self.library(kind)
            if layout != "compact":
                kernel = self._library_layout(lib, key, layout)
                if kernel is None:
                    kernel = self._default(key, kind, layout,
                                           layout_record(key, lib.record(key) if lib is not None else None, layout))
            else:
                kernel = lib.kernel(key) if lib is not None else None
                if kernel is None:
                    if (key, kind) not in self._warned:
                        self._warned.add((key, kind))
                        warnings.warn(FALLBACK_MESSAGE.format(key.describe()), FallbackWarning, stacklevel=3)
                    kernel = self._default(key, kind)
            self._kernels[(key, kind, layout)] = kernel
            return kernel

    def _library_layout(self, lib, key, layout):
        """The library's kernels of ``key`` for x in ``layout``, or None: none there, or the
        layout's module refused (said once, with why; the runtime compiles them instead)."""
        if lib is None:
            return None
        try:
            return lib.kernel(key, layout)
        except ValueError as e:
            if (lib.path, layout) not in self._warned:
                self._warned.add((lib.path, layout))
                warnings.warn(f"{e}. They are compiled on first use instead.", LibraryRefused, stacklevel=4)
            return None

    def _default(self, key, kind, layout: str = "compact", record: dict | None = None):
        """The default schedule's kernels of a key (or ``record``'s, with x in another
        ``layout``), from the disk cache or compiled into it. On
        CUDA the int64 row kernels, which only calls past int32 offsets run, are left out of the
        first compile (half the row-kernel code for the JIT) and compiled into their own cache
        entry on the first such call; a cache entry that holds them (scripts/warm_cache.py
        builds every kernel of key_funcs) serves them at once."""
        from .compute.norms import parts_of
        if kind == "cuda":
            cuda_arch(fp8=key.fp8_out)  # a clear error, not nvcc's, where this GPU cannot run the key
        compact, tuned = layout == "compact", bool(record and record.get("parts"))
        path = cache_path(key, kind, layout, record)
        # part -> symbol of the int64 row kernels left to compile_wide
        row = ({p: f"{key.name}_{p}" for p in NARROW_PARTS if p in parts_of(key, kind)} if kind == "cuda" else {})
        mod = _cached_module(path, kind, lambda: {s: f for s, f in key_funcs(key, kind, record, layout).items()
                                                  if s not in row.values()})

        def compile_wide():
            wmod = _cached_module(path.with_suffix(".wide.so"), kind,
                                  lambda: scheduled_funcs(key, kind, record, parts=row, layout=layout))
            return {p: wmod[s] for p, s in row.items()}
        origin = "tuned" if tuned else "default"
        return _kernel_from_module(key, kind, mod, tuned, origin if compact else f"{origin}:{layout}",
                                   (record or {}).get("rows_per_partial"),
                                   wide=None if all(mod.implements_function(s) for s in row.values()) else compile_wide,
                                   layout=layout)


def cache_entry(key: NormKey, layout: str = "compact", record: dict | None = None) -> str:
    """The name of a key's default-kernel cache entry (Registry._default; scripts/warm_cache.py
    fills it ahead): the key's name, then x's layout where it is not compact, then the
    fingerprint of the record the kernels replay, an entry per record, so that a new record
    never loads another's code."""
    name = key.name if layout == "compact" else f"{key.name}.{layout}"
    return name if record is None else f"{name}.{record_fingerprint(record)}"


def cache_path(key: NormKey, kind: str, layout: str = "compact", record: dict | None = None) -> pathlib.Path:
    """The file of a key's default-kernel cache entry (cache_entry) for ``kind``."""
    return cache_dir() / target_name(kind) / f"{cache_entry(key, layout, record)}.so"


def _cached_module(path: pathlib.Path, kind: str, funcs, jobs: int | None = None):
    """The module at ``path`` in the default-kernel cache, or ``funcs()`` compiled into it (under
    a file lock, written whole: a damaged entry is rebuilt, a concurrent process waits). CUDA
    kernels are compiled by nvcc into a library's form where cuda_aot.jit_nvcc says so; an entry
    of TVM's CUDA module (CUDA source for NVRTC, kernels launched without programmatic dependent
    launch) is then rebuilt. Where nvcc fails on an entry (a host compiler it does not support,
    say), the entry is TVM's CUDA module after all, with a warning, and a file beside it keeps
    nvcc's error so that later processes do not try again. A cache that cannot be written
    serves the entries it holds, and the process compiles the others in memory, with a warning
    (it raised the OSError of its mkdir before). ``jobs``: nvcc processes at once (default: the
    usable cores)."""
    from ._tvm import load_module
    try:
        with _file_lock(path.with_suffix(".lock")):
            return _cache_or_compile(path, kind, funcs, jobs)
    except OSError as e:
        # a cache that cannot be written (a read-only home or mount, TVMNORM_CACHE on a file):
        # an entry already there still loads, else the kernels are compiled in memory
        if path.exists():
            try:
                return load_module(str(path))
            except Exception:  # noqa: BLE001 - compiled in memory below
                pass
        if not _UNCACHED:
            _UNCACHED.add(True)
            warnings.warn(f"the default-kernel cache under {cache_root()} cannot be written ({e.strerror or e}: "
                          f"{e.filename or path}); default kernels are compiled in memory, again in every process. "
                          f"Set TVMNORM_CACHE to a writable folder", RuntimeWarning, stacklevel=3)
        return compile_funcs(funcs(), kind).mod


# whether this process has said that the default-kernel cache cannot be written
_UNCACHED: set = set()


def _cache_or_compile(path: pathlib.Path, kind: str, funcs, jobs):
    """_cached_module's work under the entry's lock."""
    from ._tvm import load_module
    from .cuda_aot import build_cuda_library, jit_nvcc
    failed = path.with_suffix(".nvcc-failed")
    nvcc = kind == "cuda" and jit_nvcc() and not failed.exists()
    if path.exists():
        try:
            mod = load_module(str(path))
            if not (nvcc and mod.imports):
                return mod
        except Exception:  # noqa: BLE001 - a damaged cache entry is rebuilt
            pass
    tmp, scheduled = path.with_suffix(f".tmp{os.getpid()}.so"), funcs()
    if nvcc:
        try:
            with tempfile.TemporaryDirectory(prefix=".tvmnorm-jit-", dir=path.parent) as work:
                build_cuda_library(scheduled, arch_of(kind), tmp, work, jobs)
        except (RuntimeError, OSError) as e:
            failed.write_text(f"{e}\n")
            warnings.warn(f"nvcc could not compile the default kernels of {path.stem} "
                          f"({str(e).splitlines()[0]}); they are compiled as TVM's CUDA module instead "
                          f"(NVRTC, launched without programmatic dependent launch). {failed} holds the "
                          f"error: delete it to try nvcc again, or set TVMNORM_JIT_NVCC=0", RuntimeWarning,
                          stacklevel=2)
        else:
            # loaded outside the try: a library nvcc built that does not load is not nvcc's failure
            os.replace(tmp, path)
            return load_module(str(path))
    ex = compile_funcs(scheduled, kind)
    ex.export_library(str(tmp))
    os.replace(tmp, path)
    return ex.mod


REGISTRY = Registry()


def get_kernel(key: NormKey, target: str = "llvm", layout: str = "compact") -> NormKernel:
    """The tuned kernel for ``key`` on ``target`` ("llvm" or "cuda"), or the default one;
    ``layout`` other than "compact": the one whose x lies in that layout (build.X_LAYOUTS: rows
    at one stride, or per-head rows at two), compiled from the library's record of the key or
    else the default schedule (Registry.get)."""
    return REGISTRY.get(key, target, layout)
