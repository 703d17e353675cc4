"""RMSNorm and LayerNorm, forward and backward, as TVM tensor expressions.

Every kernel has a symbolic int64 row count ``n`` so that one compiled function serves any
number of tokens (pass ``rows=`` for a static count: MetaSchedule tunes on one). All math is
in the key's ctype; inputs are cast up on load and outputs cast down on store.

Kernels per stage (``KERNEL_PARTS``) and their arguments, in order:

fwd        rmsnorm    x[n,H], gamma[H], (scale[1]), y[n,H], rsigma[n], (amax_row[n]), eps
           layernorm  x, gamma, beta[H], (scale), y, mu[n], rsigma, (amax_row), eps
           fwd_add: residual[n,H] after x and h[n,H] after y: the norm of h = x + residual
           (scale and amax_row only when otype is fp8: y = sat(y * scale), amax_row = max|y|
           per row before scaling, as TransformerEngine's fused fp8 output does; on CUDA
           (folds_amax) the forward takes amax[1] in amax_row's place and folds the rows'
           maxima into it, at most one atomic a block: _tvm.AMAX_FOLD)
amax_zero  -> amax[1] = 0   (fp8 fwd on cuda: before the forward folds into it)
amax       amax_row[n], amax_part[ceil(n / AMAX_CHUNK)] -> amax[1]   (fp8 fwd on llvm)
amax_one   amax_row[n] -> amax[1]   (as amax; one task, for calls of <= AMAX_ONE_ROWS rows)
dx         rmsnorm    dy[n,H], x, rsigma, gamma, (dz[n,H]), dx[n,H], part[1,q,H]
           layernorm  dy, x, mu, rsigma, gamma, (dz), dx, part[2,q,H]   (dz only for bwd_add)
combine    part[s,q,H] -> mid[s,ceil(q / COMBINE_GROUP),H]   (only for many partials)
finalize   part[s,q,H] -> dgamma[H] (, dbeta[H]) in wtype   (or mid in place of part)

The backward is one pass over dy and x on both targets: the ``dx`` kernel also writes the
weight-gradient partials, part[0] for dgamma and (LayerNorm) part[1] for dbeta. Rows are cut into
chunks of a static T rows (``rows_per_partial``), q = ceildiv(n, T) of them, and partial row q is
the sum of the chunk's rows q*T .. q*T+T-1 (< n), so the task (llvm) or thread group (cuda) that
walks a chunk's rows for dx keeps the running sums next to it and writes one partial row per
chunk. ``finalize`` sums the partials in a fixed order. No atomics: the result is bitwise
reproducible for a given shape. With many partials (QK-norm: 524288 rows of 128 make 16384)
``combine`` first sums groups of COMBINE_GROUP of them, in parallel over the groups, and
finalize sums the group sums (runtime.COMBINE_ABOVE decides, by the partial count alone).

A two-pass backward (dx, then a ``wgrad`` kernel re-reading dy and x) was the CUDA path until
the CUDA row schedule kept each thread's running sums in registers (see _cuda_partials in
sched/rows.py); on the H200 the one pass (default schedules) measured faster on 22 of the 24
bf16 catalog shapes and within 5% on the other two (rmsnorm 5120: 0.46 vs 0.49 of copy
bandwidth, 128: 0.36 vs 0.37; bench/results/h200-tuned.json against h200-tuned-run1.json), so
it was removed.
"""
from __future__ import annotations

from .._tvm import register_sum_reducers, te, tirx
from ..key import TVM_DTYPE, NormKey
from ..targets import KINDS

KERNEL_PARTS = {"fwd": ("fwd",), "fwd_add": ("fwd",), "fwd_fp8": ("fwd", "amax", "amax_one"),
                "fwd_fp8_cuda": ("amax_zero", "fwd"), "bwd": ("dx", "combine", "finalize"),
                "bwd_add": ("dx", "combine", "finalize")}

# The PrimFunc attribute that carries T (rows per weight-gradient partial) from the compute
# definition to the schedule, which splits the row loop by it.
ROWS_PER_PARTIAL_ATTR = "tvmnorm.rows_per_partial"
# The PrimFunc attribute that carries P (rows whose row sums are one reduction, CUDA dx only).
ROWS_PER_GROUP_ATTR = "tvmnorm.rows_per_group"


# The narrowest rows whose CUDA backward chunks T = 64 rows by default (rows_per_partial).
CUDA_WIDE_ROWS = 2560


def rows_per_partial(key: NormKey, kind: str) -> int:
    """T, the rows summed into one dgamma/dbeta partial row by the fused dx kernel (static, so
    the row loop can be split by it: a symbolic split factor is refused).

    Each chunk of T rows writes S fp32 partial rows (S = 1 dgamma, 2 with dbeta) that finalize
    reads back: 8*S*H bytes against the 3*T*H*size counted for dy, x and dx, i.e. a share of
    8*S / (3*size*T) of the counted traffic. The chunks are also the unit of parallelism (a
    chunk's rows are walked serially by one CPU task), so T cannot grow
    without bound.

    llvm: T >= 64 keeps the partials to 1-2% (fp32) of the traffic and gives 16 chunks at 1024
      rows, 64 at 4096 for 2 cores; narrow rows get T = 16384 / H (a task of >= 16K elements,
      like the other row kernels' tasks) up to 1024 rows, so a million 8-wide rows make ~1000
      partials, not 16000 (finalize is serial per column on the CPU).
    cuda: a chunk is walked serially by one group of threads (a block, or one threadIdx.y lane
      of it), so T trades partial traffic against parallelism. T = 32 below CUDA_WIDE_ROWS: the
      partials are 4% of the bf16 traffic for RMSNorm, 8% for LayerNorm, and 16384 tokens still
      make 512 chunks (~4 per SM, each with a whole row of loads in flight). Wide rows take 64:
      their blocks are large enough that 256 chunks still fill the SMs, and halving the
      partials' traffic won there (the default rule's backward at T = 64 against 32 on the H200,
      bench/results/h200-run15/bwd-parts.json: 1.03-1.14x at 2560-8192 but layernorm 4096,
      0.98x; 0.65-0.80x at 512-2048). Narrow rows do not get a longer T, unlike llvm: their
      parallelism is the number of chunks in flight. `tvmnorm tune` searches a key at this T
      and, where its record has another, at the record's too (tune.key_chunk_sizes;
      --chunk-rows names others); a record keeps its T.
    """
    if kind not in KINDS:
        raise ValueError(f"target must be one of {KINDS}, got {kind!r}")
    h = key.hidden_size
    if kind == "cuda":
        return 64 if h >= CUDA_WIDE_ROWS else 32
    t = 64
    while t < 1024 and t * h < 16384:
        t *= 2
    return t


# The chunk sizes the CUDA tuner tries for the fused dx kernel (one tuning task each; the record
# keeps the best one's T as ``rows_per_partial``). T is a compute-level constant (a static split
# factor), so it cannot be a decision inside one design space. A shorter chunk means more chunks
# in flight (16384 tokens: 1024 at T = 16) for more partial traffic (8*S / (6*T) of bf16's).
CUDA_CHUNK_ROWS = (16, 32, 64)


def num_partials(rows: int, t: int) -> int:
    """Partial rows the fused dx kernel writes for ``rows`` rows in chunks of ``t``."""
    return -(-rows // t)

# Saturating bound for each fp8 format: llvm's fp8 cast does not saturate (1000 -> -0.0156),
# CUDA's does, so llvm's expression clamps to it (and _fp8_byte encodes subnormals itself, which
# llvm's cast gets wrong).
FP8_MAX = {"fp8e4m3": 448.0, "fp8e5m2": 57344.0}


# Smallest normal and subnormal step of each fp8 format.
FP8_MIN_NORMAL = {"fp8e4m3": 2.0 ** -6, "fp8e5m2": 2.0 ** -14}
FP8_SUBNORMAL_STEP = {"fp8e4m3": 2.0 ** -9, "fp8e5m2": 2.0 ** -16}

# Inputs indexed by column only (the weights) and by row only (the saved statistics that the
# backward reads): the row schedule loads each kind its own way (sched/rows.py).
WEIGHT_OPERANDS = ("gamma", "beta")
ROW_STAT_OPERANDS = ("mu", "rsigma")

# The CUDA fp8 forward's stage holding y before scaling and the cast (see fwd).
FP8_Y_STAGE = "y_unscaled"
# fwd_add's stage holding h = x + residual, which the row sums, y and the store of h read: in
# registers where a CUDA schedule keeps the row (keep_row), else inlined into its readers; on
# llvm a stage of its own (sched/rows.py).
ADD_STAGE = "h_sum"


# (mantissa bits, exponent bias) of the fp8 formats
FP8_BITS = {"fp8e4m3": (3, 7), "fp8e5m2": (2, 15)}


def _fp8_byte(v, otype: str, dt: str):
    """The fp8 byte of an in-range fp32 value, rounded to nearest even, encoded on the bits
    (llvm's cast is wrong below the smallest normal and does not saturate). Normal values:
    fp32's bits rounded at the fp8 mantissa's last bit (half an fp8 ulp less one, plus that bit:
    ties to even; a carry runs into the exponent), shifted, the exponent rebiased. Subnormals:
    nearbyint(|v| / step), whose count of 2^mantissa is the smallest normal's byte, so the
    encoding stays exact up to the boundary. The sign is v's sign bit, so -0.0 stays -0.0 (0x80),
    as CUDA's cast and ml_dtypes write it."""
    mant, bias = FP8_BITS[otype]
    shift = 23 - mant
    av = te.abs(v)
    bits = tirx.reinterpret("uint32", av)
    u32 = lambda c: tirx.const(c, "uint32")  # noqa: E731
    rounded = bits + u32((1 << (shift - 1)) - 1) + ((bits >> u32(shift)) & u32(1))
    normal = ((rounded >> u32(shift)) - u32((127 - bias) << mant)).astype("uint8")
    sub = tirx.nearbyint(av * tirx.const(1.0 / FP8_SUBNORMAL_STEP[otype], dt)).astype("uint8")
    magnitude = tirx.Select(av < tirx.const(FP8_MIN_NORMAL[otype], dt), sub, normal)
    sign = ((tirx.reinterpret("uint32", v) >> u32(24)) & u32(0x80)).astype("uint8")
    return magnitude | sign


# The byte of an fp8 NaN (e4m3fn's only NaN; one of e5m2's).
FP8_NAN_BYTE = 0x7F


def _quantize(v, otype: str, kind: str, dt: str):
    """fp8 of the scaled value ``v``: saturated to the format's largest value, NaN kept NaN (as
    reference.fp8_quantize's clip does). CUDA's cast does both by itself (cvt.rn.satfinite,
    round-to-nearest-even, subnormals included, sm_89+): a clamp written out cost two
    instructions an element there, and fminf/fmaxf turned NaN into +-MAX. On llvm the byte is
    computed (_fp8_byte) and y's store writes it as a byte (_tvm._fp8_byte_stores): stored as an
    fp8 value, TVM's FP8ComputeLegalize decoded it to fp32 and encoded it again, ~60 vector
    instructions for 16 values, and the fp8 forward took twice the time of bf16 output."""
    if kind == "cuda":
        return v.astype(TVM_DTYPE[otype])
    m = tirx.const(FP8_MAX[otype], dt)
    byte = tirx.Select(tirx.isnan(v), tirx.const(FP8_NAN_BYTE, "uint8"), _fp8_byte(te.max(te.min(v, m), -m), otype, dt))
    return tirx.reinterpret(TVM_DTYPE[otype], byte)


def folds_amax(key: NormKey, kind: str) -> bool:
    """Whether ``key``'s forward on target ``kind`` folds its rows' maxima into amax
    (_tvm.AMAX_FOLD, after amax_zero) instead of writing them out for the amax kernels: on
    CUDA, where the fold was as fast or faster at every catalog width timed on the H200 (the
    whole call 0-4 us faster, most at hidden 128 and 512; bench/results/h200-run23/). llvm
    keeps the amax kernels after its forward."""
    return key.fp8_out and kind == "cuda"


def stores_stats_first(key: NormKey, kind: str) -> bool:
    """Whether ``key``'s forward on target ``kind`` stores its rows' statistics before their y
    (_tvm.STATS_FIRST). Off: on the H200 (`bench/gpu_probe.py --stats-ab`, each committed bf16
    forward record built both ways and timed A, B, A, B; bench/results/h200-run25/) it was within
    the drift at rmsnorm 128-8192 and layernorm 128-7168, and 2.8% slower at layernorm 8192. The
    switch stays for the probe, which re-asks on other devices or records."""
    return False


# The kernels of one call run in KERNEL_PARTS' order (the decode backward: dx, then one of its
# wgrad kernels): these run after another of ours.
FOLLOWING_PARTS = ("combine", "finalize", "wgrad", "wgrad_few", "wgrad_mid")


def pdl_waits(key: NormKey, kind: str, part: str) -> bool:
    """Whether ``part``'s kernel runs after another kernel of the same call (the folding fp8
    forward after amax_zero, too), so that a CUDA library launches it with programmatic
    dependent launch and it waits for that one at its entry (_tvm.PDL_WAITS)."""
    return kind == "cuda" and (part in FOLLOWING_PARTS or (part == "fwd" and folds_amax(key, kind)))


def parts_of(key: NormKey, kind: str) -> tuple:
    """The kernels of a key on target ``kind``, in call order; a call runs combine only for
    many partials, and amax or amax_one by its row count (runtime.NormKernel)."""
    if key.fp8_out:
        return KERNEL_PARTS["fwd_fp8_cuda" if folds_amax(key, kind) else "fwd_fp8"]
    return KERNEL_PARTS[key.stage]


def symbolic_rows(bits: int = 64):
    """The symbolic row count ``n`` of the library's kernels: int64, so any tensor indexes
    right. An int32 one (``bits=32``) indexes in int32 throughout, as a static-row tuning
    candidate does after TVM's NarrowDataType; such a kernel serves only calls of fewer than
    2^31 elements per tensor (runtime.NormKernel refuses larger ones), and exists for the probes
    that time one width against the other."""
    if bits not in (32, 64):
        raise ValueError(f"row index bits must be 32 or 64, got {bits!r}")
    return te.var("n", f"int{bits}")


def _rows(rows):
    """The row count: symbolic int64 ``n`` (None), a symbolic one given (symbolic_rows), or a
    static one: a Python int (int32 indexing) or an int64 constant, which indexes as the symbolic
    kernel does (the CUDA tuner's rows: tune.tuning_func)."""
    return symbolic_rows() if rows is None else rows


def _wide(N) -> bool:
    """Whether row count N indexes in int64: the symbolic n, or an int64 constant."""
    return not isinstance(N, int) and str(N.ty) == "int64"


def _func(args, name):
    return te.create_prim_func(args).with_attr("global_symbol", name)


def _loaders(key: NormKey):
    c = TVM_DTYPE[key.ctype]
    zc = key.zero_centered_gamma
    up = lambda v: v.astype(c) if v.dtype != c else v  # noqa: E731
    # zero-centred gamma stores gamma - 1, so the scale is 1 + gamma, added in compute precision
    gamma = (lambda w: (lambda j: up(w[j]) + tirx.const(1.0, c))) if zc else (lambda w: (lambda j: up(w[j])))
    return c, up, gamma


def _store(stat, name):
    """The saved per-row statistic as its own copy stage. The statistic itself is a temporary
    that every thread of a row computes into a register, and one thread stores this copy: a
    row's other threads never read the global output back (no barrier orders global memory)."""
    return te.compute(stat.shape, lambda i: stat[i], name=name)


def _round_to_bf16(v):
    """fp32 ``v`` rounded to the nearest bf16 (ties to even), still fp32. llvm's lowering runs
    TVM's BF16ComputeLegalize, which treats bf16 as storage only: it drops a bf16 cast between
    fp32 values and keeps a bf16 temporary in fp32, so the rounding is written out on the bits.
    NaN stays NaN."""
    bits = tirx.reinterpret("uint32", v)
    bias = ((bits >> tirx.const(16, "uint32")) & tirx.const(1, "uint32")) + tirx.const(0x7FFF, "uint32")
    rounded = tirx.reinterpret("float32", (bits + bias) & tirx.const(0xFFFF0000, "uint32"))
    return tirx.Select(tirx.isnan(v), v, rounded)


def _residual_sum(a, b, itype: str, kind: str):
    """a + b rounded to ``itype`` as torch's add rounds it (added in fp32, or in itype where
    that is wider), so fwd_add's h, and the norm of it, are those of torch's add and then the
    norm."""
    it = TVM_DTYPE[itype]
    at = it if itype in ("fp32", "fp64") else "float32"
    v = a.astype(at) + b.astype(at)
    return (_round_to_bf16(v) if itype == "bf16" and kind == "llvm" else v).astype(it)


def fwd(key: NormKey, kind: str, rows=None, name="fwd"):
    c, up, gamma = _loaders(key)
    N = _rows(rows)
    # int64 columns with an int64 row count on cuda, as in dx: keeping the row in registers
    # (CudaRowConfig.keep_row) transforms a buffer's layout, which refuses mixed index dtypes
    H = tirx.const(key.hidden_size, "int64") if _wide(N) and kind == "cuda" else key.hidden_size
    eps = te.var("eps", c)
    x = te.placeholder((N, H), TVM_DTYPE[key.itype], name="x")
    adds = []
    if key.stage == "fwd_add":
        r = te.placeholder((N, H), TVM_DTYPE[key.itype], name="residual")
        hsum = te.compute((N, H), lambda i, j: _residual_sum(x[i, j], r[i, j], key.itype, kind), name=ADD_STAGE)
        h = te.compute((N, H), lambda i, j: hsum[i, j], name="h")
        adds = [r]
        xf = lambda i, j: up(hsum[i, j])  # noqa: E731
    else:
        xf = lambda i, j: up(x[i, j])  # noqa: E731
    w = te.placeholder((H,), TVM_DTYPE[key.wtype], name="gamma")
    g = gamma(w)
    inv_h = tirx.const(1.0 / key.hidden_size, c)
    if key.norm == "rmsnorm":
        k = te.reduce_axis((0, H), name="k")
        ss = te.compute((N,), lambda i: te.sum(xf(i, k) * xf(i, k), axis=k), name="sumsq")
        rs = te.compute((N,), lambda i: te.rsqrt(ss[i] * inv_h + eps), name="rstd")
        yf = lambda i, j: xf(i, j) * rs[i] * g(j)  # noqa: E731
        ins, stats = [x] + adds + [w], [_store(rs, "rsigma")]
    else:
        b = te.placeholder((H,), TVM_DTYPE[key.wtype], name="beta")
        k1, k2 = te.reduce_axis((0, H), name="k1"), te.reduce_axis((0, H), name="k2")
        s = te.compute((N,), lambda i: te.sum(xf(i, k1), axis=k1), name="sum")
        mu = te.compute((N,), lambda i: s[i] * inv_h, name="mean")
        # two-pass variance: E[(x - mu)^2] does not cancel catastrophically like E[x^2] - mu^2
        vs = te.compute((N,), lambda i: te.sum((xf(i, k2) - mu[i]) * (xf(i, k2) - mu[i]), axis=k2),
                        name="varsum")
        rs = te.compute((N,), lambda i: te.rsqrt(vs[i] * inv_h + eps), name="rstd")
        yf = lambda i, j: (xf(i, j) - mu[i]) * rs[i] * g(j) + up(b[j])  # noqa: E731
        ins, stats = [x] + adds + [w, b], [_store(mu, "mu"), _store(rs, "rsigma")]
    outs = [h] if adds else []
    if not key.fp8_out:
        y = te.compute((N, H), lambda i, j: yf(i, j).astype(TVM_DTYPE[key.otype]), name="y")
        return _func(ins + [y] + outs + stats + [eps], name)
    scale = te.placeholder((1,), "float32", name="scale")
    if kind == "cuda":
        # y in ctype as a stage of its own, read by the store and by amax: a schedule that keeps
        # the row in registers (CudaRowConfig.keep_y) computes it once there; otherwise it is
        # inlined into both, as llvm's expression always is
        yv = te.compute((N, H), yf, name=FP8_Y_STAGE)
        yf = lambda i, j: yv[i, j]  # noqa: E731
    y = te.compute((N, H), lambda i, j: _quantize(yf(i, j) * up(scale[0]), key.otype, kind, c), name="y")
    ka = te.reduce_axis((0, H), name="ka")
    amax = te.compute((N,), lambda i: te.max(te.abs(yf(i, ka)).astype("float32"), axis=ka), name="amax_row")
    return _func(ins + [scale, y] + outs + stats + [amax, eps], name)


# Rows of amax_row that one task of the amax kernel's first stage reduces (llvm; it was CUDA's
# too until its forward folded amax in: there one block reducing every row read 524288 rows of
# QK-norm with 512 loads per thread in a loop, 275 us in all on the H200 against 97 us in two
# stages). The second stage reduces ceil(n / 4096) values.
AMAX_CHUNK = 4096


def amax_partials(rows: int) -> int:
    """Length of the amax kernel's per-chunk maxima for ``rows`` rows (one for no rows, so
    that amax of nothing is written, as 0)."""
    return -(-max(rows, 1) // AMAX_CHUNK)


def amax(rows=None, name="amax"):
    """amax[0] = max(amax_row) in two stages: amax_part[p] is the max over the rows of chunk p
    (AMAX_CHUNK rows), amax over the chunks. The chunk maxima are an argument (the runtime
    allocates them, as it does the dx kernel's partials), so each stage is its own launch and
    no device workspace is needed."""
    N = _rows(rows)
    row = te.placeholder((N,), "float32", name="amax_row")
    C = AMAX_CHUNK
    P = _at_least_one(N, C) if isinstance(N, tirx.Var) else amax_partials(N)
    r = te.reduce_axis((0, C), name="r")
    part = te.compute((P,), lambda p: te.max(_row_or_zero(row, N, p * C + r), axis=r), name="amax_part")
    q = te.reduce_axis((0, P), name="q")
    out = te.compute((1,), lambda _: te.max(part[q], axis=q), name="amax")
    return _func([row, part, out], name)


# The most rows amax_one serves (one serial task) instead of amax's two stages (from CUDA's
# amax kernels, where one block of 1024 threads served them 0-2.3 us faster than two launches).
AMAX_ONE_ROWS = 8 * AMAX_CHUNK


def amax_one(rows=None, name="amax_one"):
    """amax[0] = max(amax_row) in one stage: a call of at most AMAX_ONE_ROWS rows, the
    training and decode shapes of every catalog width but 128, saves amax's second step."""
    N = _rows(rows)
    row = te.placeholder((N,), "float32", name="amax_row")
    r = te.reduce_axis((0, _at_least_one(N, 1) if isinstance(N, tirx.Var) else max(N, 1)), name="r")
    out = te.compute((1,), lambda _: te.max(_row_or_zero(row, N, r), axis=r), name="amax")
    return _func([row, out], name)


def amax_zero(name="amax_zero"):
    """amax[0] = 0: a forward that folds_amax then folds the rows' maxima into it."""
    out = te.compute((1,), lambda _: tirx.const(0.0, "float32"), name="amax")
    return _func([out], name)


def _at_least_one(N, C):
    """ceildiv(max(N, 1), C): at least one step, since a TIR reduction initialises inside its
    loop and a zero-extent one would leave amax unwritten (amax of no rows is 0)."""
    return tirx.floordiv(tirx.max(N, tirx.const(1, str(N.ty))) + (C - 1), C)


def _row_or_zero(row, N, i):
    """row[i], or 0 past the rows: neutral for a max of absolute values."""
    return te.if_then_else(i < N, row[i], tirx.const(0.0, "float32"))


def _bwd_inputs(key: NormKey, N, H=None):
    c = TVM_DTYPE[key.ctype]
    H = key.hidden_size if H is None else H
    dy = te.placeholder((N, H), TVM_DTYPE[key.otype], name="dy")
    x = te.placeholder((N, H), TVM_DTYPE[key.itype], name="x")
    mu = te.placeholder((N,), c, name="mu") if key.norm == "layernorm" else None
    rs = te.placeholder((N,), c, name="rsigma")
    return dy, x, mu, rs


def _group_sums(N, H, P, terms, name):
    """The row sums of P rows at once, one tuple reduction per group g of rows g*P .. g*P+P-1:
    on CUDA one cross-thread allreduce of P x len(terms(i, k)) values, whose barriers a group
    shares, where one reduction per row pays them P times. Rows past n (the last group of an
    odd count) add zeros. Returns pick(v, i): row i's v-th sum. On the H200 it was no faster
    than a reduction per row (bench/results/h200-grouped-dx/: 3-6% faster at layernorm 2048
    and 8192, up to 18% slower elsewhere), so the barriers do not bound a chunk's walk; the
    library does not use it (a probe variant: runtime.variant_kernel(group_rows=))."""
    register_sum_reducers()  # a tuple of width * P sums lowers to one allreduce only as a known reducer
    k = te.reduce_axis((0, H), name="k")
    width = len(terms(0, k))
    # written as the region of floordiv(i, P) over rows i < n comes out, (n - 1) // P + 1, so
    # the schedule sees the readers of the sums covered (ceildiv(n, P) was not proved equal)
    G = -(-N // P) if isinstance(N, int) else tirx.floordiv(N - 1, P) + 1
    red = te.comm_reducer(lambda a, b: tuple(u + v for u, v in zip(a, b)),
                          lambda *ts: tuple(tirx.const(0.0, t) for t in ts), name=f"sum{width * P}")

    def values(g):
        out = []
        for p in range(P):
            i = g * P + p
            out += [te.if_then_else(i < N, v, tirx.const(0.0, v.ty)) for v in terms(i, k)]
        return tuple(out)
    sums = te.compute((G,), lambda g: red(values(g), axis=k), name=name)
    sums = sums if isinstance(sums, (list, tuple)) else [sums]

    def pick(v, i):
        g = tirx.floordiv(i, P)
        e = sums[width * (P - 1) + v][g]
        for p in reversed(range(P - 1)):
            e = tirx.Select(tirx.floormod(i, P) == p, sums[width * p + v][g], e)
        return e
    return pick


def _pair_sum():
    """Two running sums as one tuple reduction: on cuda one cross-thread allreduce of both."""
    return te.comm_reducer(lambda a, b: (a[0] + b[0], a[1] + b[1]),
                           lambda t0, t1: (tirx.const(0.0, t0), tirx.const(0.0, t1)), name="pair_sum")


def _xhat(up, x, mu, rs):
    """xhat[i, j] = (x - mu) * rsigma (x * rsigma for RMSNorm, whose ``mu`` is None)."""
    if mu is None:
        return lambda i, j: up(x[i, j]) * rs[i]
    return lambda i, j: (up(x[i, j]) - mu[i]) * rs[i]


def _column_sums(H, n, terms, wt: str, kind: str, axis: str) -> list:
    """out_s[j] = sum over r < ``n`` of ``terms[s](r, j)``, cast to ``wt``: dgamma (and dbeta).
    On cuda LayerNorm's two sums are one tuple reduction: one kernel reduces both across its
    lanes together, where two kernels each paid a launch and a tree of barriers (llvm keeps one
    block each: TVM's tuple reductions miscompile there, see dx)."""
    if len(terms) == 2 and kind == "cuda":
        r = te.reduce_axis((0, n), name=axis)
        accs = te.compute((H,), lambda j: _pair_sum()((terms[0](r, j), terms[1](r, j)), axis=r), name="wgrad_acc")
        return list(te.compute((H,), lambda j: tuple(a[j].astype(wt) for a in accs), name="wgrad"))
    outs = []
    for term, nm in zip(terms, ("dgamma", "dbeta")):
        r = te.reduce_axis((0, n), name=axis)
        acc = te.compute((H,), lambda j: te.sum(term(r, j), axis=r), name=f"{nm}_acc")
        outs.append(te.compute((H,), lambda j: acc[j].astype(wt), name=nm))
    return outs


def dx(key: NormKey, kind: str, rows=None, name="dx", chunk_rows=None, group_rows=1, partials=True):
    """dx = rsigma * (dy*g - mean(dy*g) [LN only] - xhat * mean(dy*g*xhat)) (+ dz for bwd_add),
    and the weight-gradient partials of chunks of T = rows_per_partial(key, kind) rows:
    part[0, q, j] = sum_t dy*xhat and (LayerNorm) part[1, q, j] = sum_t dy over rows q*T + t < n.
    One reduction block with an s axis computes both (TVM's tuple reductions miscompile bf16 on
    llvm), so dy and x are read once for both sums. ``chunk_rows`` overrides T (a tuned record's
    ``rows_per_partial``). ``group_rows`` P > 1 (CUDA, P dividing T) computes the row sums of P
    rows as one reduction (_group_sums). ``partials`` False leaves the partials out: dx alone,
    a row kernel like the forward (the decode backward's, with ``wgrad``)."""
    c, up, gamma = _loaders(key)
    N = _rows(rows)
    T = chunk_rows or rows_per_partial(key, kind)
    P = group_rows
    if P != 1 and (kind != "cuda" or P < 1 or T % P):
        raise ValueError(f"rows per group must be 1, or on cuda divide the chunk of {T} rows; got {P}")
    # on cuda one index dtype for every axis (int64 with the symbolic n): the CUDA schedule
    # transforms the layout of its register buffers, which refuses mixed index dtypes, and its
    # thread loops over columns must have the dtype of the other stages' thread loops. llvm keeps
    # int32 columns: int64 column arithmetic measured up to 25% slower there (layernorm bwd fp32)
    idx = "int64" if _wide(N) and kind == "cuda" else "int32"
    H = tirx.const(key.hidden_size, idx)
    dy, x, mu, rs = _bwd_inputs(key, N, H)
    w = te.placeholder((H,), TVM_DTYPE[key.wtype], name="gamma")
    g = gamma(w)
    inv_h = tirx.const(1.0 / key.hidden_size, c)
    xhat = _xhat(up, x, mu, rs)
    dyg = lambda i, j: up(dy[i, j]) * g(j)  # noqa: E731
    k = te.reduce_axis((0, H), name="k")
    if P > 1:
        terms = ((lambda i, k_: (dyg(i, k_), dyg(i, k_) * xhat(i, k_))) if mu is not None
                 else (lambda i, k_: (dyg(i, k_) * xhat(i, k_),)))
        pick = _group_sums(N, H, P, terms, "c12" if mu is not None else "c2")
        corr = ((lambda i, j: (pick(0, i) + xhat(i, j) * pick(1, i)) * inv_h) if mu is not None
                else (lambda i, j: xhat(i, j) * pick(0, i) * inv_h))
    elif mu is not None and kind == "cuda":
        # c1 = sum(dyg) and c2 = sum(dyg * xhat) as one tuple reduction: one cross-thread
        # allreduce of two values per row instead of two chained ones, which halves the
        # barriers per row of a multi-warp row. c2 drops the -mean(dyg) term, which multiplies
        # sum(xhat) = 0 (up to the rounding of the saved mu), as Apex and Liger do.
        c1, c2 = te.compute((N,), lambda i: _pair_sum()((dyg(i, k), dyg(i, k) * xhat(i, k)), axis=k), name="c12")
        corr = lambda i, j: (c1[i] + xhat(i, j) * c2[i]) * inv_h  # noqa: E731
    elif mu is not None:
        k1 = te.reduce_axis((0, H), name="k1")
        c1 = te.compute((N,), lambda i: te.sum(dyg(i, k1), axis=k1), name="c1")
        # sum((dyg - mean(dyg)) * xhat) equals sum(dyg * xhat) because sum(xhat) = 0; written this
        # way c2 depends on c1, so the row's stages form one chain that the schedule can place
        # under one row loop (TVM's tuple reductions, the other way, miscompile bf16 on llvm).
        c2 = te.compute((N,), lambda i: te.sum((dyg(i, k) - c1[i] * inv_h) * xhat(i, k), axis=k), name="c2")
        corr = lambda i, j: (c1[i] + xhat(i, j) * c2[i]) * inv_h  # noqa: E731
    else:
        c2 = te.compute((N,), lambda i: te.sum(dyg(i, k) * xhat(i, k), axis=k), name="c2")
        corr = lambda i, j: xhat(i, j) * c2[i] * inv_h  # noqa: E731
    grad = lambda i, j: rs[i] * (dyg(i, j) - corr(i, j))  # noqa: E731
    extra = []
    if key.stage == "bwd_add":
        dz = te.placeholder((N, H), TVM_DTYPE[key.itype], name="dz")
        extra = [dz]
        base = grad
        grad = lambda i, j: base(i, j) + up(dz[i, j])  # noqa: E731
    out = te.compute((N, H), lambda i, j: grad(i, j).astype(TVM_DTYPE[key.itype]), name="dx")
    ins = [dy, x] + ([mu] if mu is not None else []) + [rs, w] + extra
    if not partials:
        return _func(ins + [out], name)
    # ceildiv written as the schedule's split writes the outer extent, so merging the dx row
    # chunks with the partial loop sees the same extent
    Q = -(-N // T) if isinstance(N, int) else tirx.floordiv(N + (T - 1), T)
    # the dtype of the row loop it is merged with: int64 for the symbolic n, int32 for a static
    # count (tuning), or the merged loops mix index types
    t = te.reduce_axis((0, tirx.const(T, "int64" if _wide(N) else "int32")), name="t")
    zero = tirx.const(0.0, c)

    def term(s_, i, j):
        gx = up(dy[i, j]) * xhat(i, j)
        return gx if mu is None else te.if_then_else(s_ == 0, gx, up(dy[i, j]))
    # te.sum(where=) would be dropped by create_prim_func: the tail rows of the last chunk are
    # guarded inside. On llvm their row index is also clamped, so that every access stays in
    # bounds where the vectoriser evaluates both sides of the guard. The CUDA schedule reads dy
    # and x through the register copy that the dx stages share, loaded under the row guard, so
    # there the index is the dx stages' own (one region for the shared copy).
    row = (lambda q, t_: tirx.min(q * T + t_, N - 1)) if kind != "cuda" else (lambda q, t_: q * T + t_)
    shape = (tirx.const(2 if mu is not None else 1, idx), Q, H)
    part = te.compute(shape, lambda s_, q, j: te.sum(te.if_then_else(
        q * T + t < N, term(s_, row(q, t), j), zero), axis=t), name="part")
    func = _func(ins + [out, part], name).with_attr(ROWS_PER_PARTIAL_ATTR, T)
    return func.with_attr(ROWS_PER_GROUP_ATTR, P) if P > 1 else func


def wgrad(key: NormKey, kind: str, rows=None, name="wgrad"):
    """dgamma[j] = sum_i dy*xhat and (LayerNorm) dbeta[j] = sum_i dy over all rows, from dy and
    x themselves, cast to wtype: the decode backward's weight gradient, a column sum as
    finalize's over partial rows (and scheduled as it), with no partials written by the dx. At
    a few hundred rows the partial rows cost more than reading dy and x again (from L2): torch
    eager's backward also sums the weight gradient apart from dx, by column tiles, and its two
    kernels took 10.5 us against our dx (T = 8) and finalize's 19.0 at rmsnorm 7168 x 256 rows
    on the H200 (bench/results/h200-run19/decode-bwd-kernels.txt)."""
    _, up, _ = _loaders(key)
    N = _rows(rows)
    H = tirx.const(key.hidden_size, "int64" if _wide(N) and kind == "cuda" else "int32")
    dy, x, mu, rs = _bwd_inputs(key, N, H)
    xhat = _xhat(up, x, mu, rs)
    terms = [lambda i, j: up(dy[i, j]) * xhat(i, j)] + ([lambda i, j: up(dy[i, j])] if mu is not None else [])
    outs = _column_sums(H, N, terms, TVM_DTYPE[key.wtype], kind, "i")
    return _func([dy, x] + ([mu] if mu is not None else []) + [rs] + outs, name)


def decode_funcs(key: NormKey, kind: str, parts, rows=None, prefix=None) -> dict:
    """The decode backward of a bwd key: part name -> PrimFunc for each of ``parts`` (of
    build.DECODE_PARTS), ``dx`` (no partials), ``wgrad``, ``wgrad_few`` and ``wgrad_mid`` (one
    compute, the same sums, under a symbol each: scheduled for calls of many, few and some
    rows), global symbols ``<prefix>_<part>``."""
    prefix = prefix or key.name
    sums = wgrad(key, kind, rows, f"{prefix}_wgrad")
    return {part: dx(key, kind, rows, f"{prefix}_dx", partials=False) if part == "dx"
            else sums.with_attr("global_symbol", f"{prefix}_{part}") for part in parts}


def _partial_count(partials):
    """The partial row count: symbolic ``p``, or a static one (``partials``: the tuner times the
    partial sum at its row count and T)."""
    return te.var("p", "int64") if partials is None else tirx.const(partials, "int64")


def finalize(key: NormKey, kind: str, name="finalize", partials=None):
    """dgamma[j] = sum_q part[0, q, j] (and dbeta from part[1]), cast to wtype (_column_sums).
    The partial count p = ceildiv(rows, T) is symbolic; the runtime passes one zero partial for
    no rows."""
    c = TVM_DTYPE[key.ctype]
    H = key.hidden_size
    P = _partial_count(partials)
    S = key.column_sums
    part = te.placeholder((S, P, H), c, name="part")
    terms = [lambda q, j, s_=s_: part[s_, q, j] for s_ in range(S)]
    return _func([part] + _column_sums(H, P, terms, TVM_DTYPE[key.wtype], kind, "q"), name)


# Partials summed per group by ``combine``. finalize alone parallelises over columns only: at
# hidden 128 a block per 32 of them made 4 blocks, and summing 16384 partials took ~120 us of
# rmsnorm bwd's 231 us on the H200 (524288 rows; bench/results/h200-cold-tune-bwd.json); with
# blocks of 8 columns (sched.default.finalize_split) it still took 24 us against 10 + 7 for
# combine, then finalize (bench/results/h200-bwd-parts-2.log). combine runs ceil(q / 64) groups x
# column tiles in parallel, each thread with its 64 loads unrolled (the group is a constant).
COMBINE_GROUP = 64


def combined_partials(count: int) -> int:
    """Rows of combine's output for ``count`` partial rows."""
    return -(-count // COMBINE_GROUP)


def combine(key: NormKey, name="combine", partials=None):
    """mid[s, g, j] = sum_u part[s, g*G + u, j] over u < G = COMBINE_GROUP (and g*G + u < p),
    in ctype: the first of two fixed-order stages of the partial sum."""
    c = TVM_DTYPE[key.ctype]
    P = _partial_count(partials)
    S = key.column_sums
    G = COMBINE_GROUP
    part = te.placeholder((S, P, key.hidden_size), c, name="part")
    u = te.reduce_axis((0, tirx.const(G, "int64")), name="u")
    zero = tirx.const(0.0, c)
    mid = te.compute((S, tirx.floordiv(P + (G - 1), G), key.hidden_size),
                     lambda s_, g, j: te.sum(te.if_then_else(g * G + u < P, part[s_, g * G + u, j], zero), axis=u),
                     name="mid")
    return _func([part, mid], name)


def kernel_funcs(key: NormKey, kind: str, rows=None, prefix=None, chunk_rows=None, group_rows=1) -> dict:
    """part name -> PrimFunc for this key on target ``kind`` (the fused dx kernel's chunk size
    depends on it, unless ``chunk_rows`` sets it; ``group_rows``: its rows per row reduction),
    global symbols ``<prefix>_<part>``."""
    prefix = prefix or key.name
    build = {"fwd": lambda n: fwd(key, kind, rows, n), "amax": lambda n: amax(rows, n),
             "amax_one": lambda n: amax_one(rows, n), "amax_zero": amax_zero,
             "dx": lambda n: dx(key, kind, rows, n, chunk_rows, group_rows), "combine": lambda n: combine(key, n),
             "finalize": lambda n: finalize(key, kind, n)}
    return {part: build[part](f"{prefix}_{part}") for part in parts_of(key, kind)}
