"""NormKey: the packed 64-bit config key that names one normalization kernel.

Bit layout (least significant bit first), written down once and used by pack, unpack
and every decode helper:

    bits  0-1   norm                 (2 bits)  NORMS index
    bits  2-3   stage                (2 bits)  STAGES index
    bits  4-6   itype                (3 bits)  DTYPES index
    bits  7-9   otype                (3 bits)
    bits 10-12  ctype                (3 bits)
    bits 13-15  wtype                (3 bits)
    bits 16-36  hidden_size          (21 bits) 1 .. 2**20
    bit  37     zero_centered_gamma  (1 bit)
    bits 38-63  reserved, must be zero

Dtype roles follow TransformerEngine: for fwd, x is itype, gamma/beta are wtype and y is
otype (fwd_add: the residual and h = x + residual are itype too); for bwd/bwd_add, dy is
otype, x and dx are itype, dgamma/dbeta are wtype.
"""
from __future__ import annotations

import dataclasses

NORMS = ("rmsnorm", "layernorm")
# fwd_add: the forward of x + residual, h = x + residual written beside y (a pre-norm block's
# residual stream: vLLM's fused_add_rms_norm), so the add is not a pass of its own over memory.
STAGES = ("fwd", "bwd", "bwd_add", "fwd_add")
FORWARD_STAGES = ("fwd", "fwd_add")
# fp64 exists for gradcheck-grade references through the same kernels (issue 3).
DTYPES = ("fp32", "fp16", "bf16", "fp8e4m3", "fp8e5m2", "fp64")
FP8 = ("fp8e4m3", "fp8e5m2")
FLOAT = ("fp32", "fp16", "bf16", "fp64")
COMPUTE = ("fp32", "fp64")
MAX_HIDDEN = 2 ** 20

# name -> (shift, width); the single source of the layout above.
_FIELDS = {
    "norm": (0, 2),
    "stage": (2, 2),
    "itype": (4, 3),
    "otype": (7, 3),
    "ctype": (10, 3),
    "wtype": (13, 3),
    "hidden_size": (16, 21),
    "zero_centered_gamma": (37, 1),
}
_USED_BITS = 38

# TVM / numpy / torch dtype names for each DTYPES entry.
TVM_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8e4m3": "float8_e4m3fn",
             "fp8e5m2": "float8_e5m2", "fp64": "float64"}
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8e4m3": 1, "fp8e5m2": 1, "fp64": 8}


def _field(packed: int, name: str) -> int:
    shift, width = _FIELDS[name]
    return (packed >> shift) & ((1 << width) - 1)


def _enum(table, code, field):
    if code >= len(table):
        raise ValueError(f"packed key has invalid {field} code {code}")
    return table[code]


def decode_norm(packed: int) -> str:
    return _enum(NORMS, _field(packed, "norm"), "norm")


def decode_stage(packed: int) -> str:
    return _enum(STAGES, _field(packed, "stage"), "stage")


def decode_itype(packed: int) -> str:
    return _enum(DTYPES, _field(packed, "itype"), "itype")


def decode_otype(packed: int) -> str:
    return _enum(DTYPES, _field(packed, "otype"), "otype")


def decode_ctype(packed: int) -> str:
    return _enum(DTYPES, _field(packed, "ctype"), "ctype")


def decode_wtype(packed: int) -> str:
    return _enum(DTYPES, _field(packed, "wtype"), "wtype")


def decode_hidden_size(packed: int) -> int:
    return _field(packed, "hidden_size")


def decode_zero_centered_gamma(packed: int) -> bool:
    return bool(_field(packed, "zero_centered_gamma"))


@dataclasses.dataclass(frozen=True)
class NormKey:
    """One kernel configuration; validated on construction, hashable, packable."""

    norm: str = "rmsnorm"
    stage: str = "fwd"
    itype: str = "bf16"
    wtype: str = "bf16"
    otype: str = "bf16"
    ctype: str = "fp32"
    hidden_size: int = 4096
    zero_centered_gamma: bool = False

    def __post_init__(self):
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {self.stage!r}")
        for field in ("itype", "wtype", "otype", "ctype"):
            value = getattr(self, field)
            if value not in DTYPES:
                raise ValueError(f"{field} must be one of {DTYPES}, got {value!r}")
        for field in ("itype", "wtype"):
            if getattr(self, field) not in FLOAT:
                raise ValueError(f"{field}={getattr(self, field)} is not allowed: fp8 is only an output type "
                                 f"of the forward stages")
        if self.otype in FP8 and not self.forward:
            raise ValueError(f"otype={self.otype} is not allowed for stage={self.stage}: fp8 is only an "
                             f"output type of the forward stages {FORWARD_STAGES}")
        if self.ctype not in COMPUTE:
            raise ValueError(f"ctype must be one of {COMPUTE}, got {self.ctype!r}")
        if isinstance(self.hidden_size, bool) or not isinstance(self.hidden_size, int):
            raise ValueError(f"hidden_size must be an int, got {self.hidden_size!r}")
        if not 1 <= self.hidden_size <= MAX_HIDDEN:
            raise ValueError(f"hidden_size must be in [1, {MAX_HIDDEN}], got {self.hidden_size}")
        if not isinstance(self.zero_centered_gamma, bool):
            raise ValueError(f"zero_centered_gamma must be a bool, got {self.zero_centered_gamma!r}")

    @property
    def forward(self) -> bool:
        """A forward stage (fwd, or fwd_add with the residual add)."""
        return self.stage in FORWARD_STAGES

    @property
    def column_sums(self) -> int:
        """Per-column sums the backward reduces over rows: dgamma, and for layernorm dbeta."""
        return 2 if self.norm == "layernorm" else 1

    def pack(self) -> int:
        codes = {
            "norm": NORMS.index(self.norm),
            "stage": STAGES.index(self.stage),
            "itype": DTYPES.index(self.itype),
            "otype": DTYPES.index(self.otype),
            "ctype": DTYPES.index(self.ctype),
            "wtype": DTYPES.index(self.wtype),
            "hidden_size": self.hidden_size,
            "zero_centered_gamma": int(self.zero_centered_gamma),
        }
        packed = 0
        for name, code in codes.items():
            shift, width = _FIELDS[name]
            assert 0 <= code < (1 << width), (name, code)
            packed |= code << shift
        return packed

    @classmethod
    def unpack(cls, packed: int) -> "NormKey":
        if isinstance(packed, bool) or not isinstance(packed, int) or not 0 <= packed < 2 ** 64:
            raise ValueError(f"packed key must be an int in [0, 2**64), got {packed!r}")
        if packed >> _USED_BITS:
            raise ValueError(f"packed key {packed:#x} sets reserved bits {_USED_BITS}-63")
        return cls(norm=decode_norm(packed), stage=decode_stage(packed), itype=decode_itype(packed),
                   wtype=decode_wtype(packed), otype=decode_otype(packed), ctype=decode_ctype(packed),
                   hidden_size=decode_hidden_size(packed),
                   zero_centered_gamma=decode_zero_centered_gamma(packed))

    def describe(self) -> str:
        """TransformerEngine's wording, as in its fallback warning."""
        return (f"hidden_size={self.hidden_size}, wtype={self.wtype}, itype={self.itype}, "
                f"otype={self.otype}, ctype={self.ctype}")

    @property
    def name(self) -> str:
        """A C identifier naming this key, used as the kernel symbol prefix."""
        zc = "_zc" if self.zero_centered_gamma else ""
        return (f"{self.norm}_{self.stage}_i{self.itype}_w{self.wtype}_o{self.otype}_c{self.ctype}"
                f"_h{self.hidden_size}{zc}")

    @property
    def fp8_out(self) -> bool:
        return self.otype in FP8


def _self_check() -> None:
    # Every field differs from its default and from its neighbours, so a swapped or
    # mis-shifted field cannot round-trip by accident.
    key = NormKey(norm="layernorm", stage="bwd_add", itype="fp16", wtype="fp32", otype="bf16",
                  ctype="fp64", hidden_size=MAX_HIDDEN - 3, zero_centered_gamma=True)
    packed = key.pack()
    if NormKey.unpack(packed) != key or packed >= 2 ** 64:
        raise RuntimeError(f"NormKey pack/unpack round trip failed: {key} -> {packed:#x} -> "
                           f"{NormKey.unpack(packed)}")
    fwd = NormKey(stage="fwd_add", otype="fp8e5m2", itype="fp32", wtype="bf16", hidden_size=1)
    if NormKey.unpack(fwd.pack()) != fwd:
        raise RuntimeError(f"NormKey pack/unpack round trip failed for {fwd}")


_self_check()
