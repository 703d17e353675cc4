"""NormKey: pack/unpack round trip over every valid enum combination, decode helpers, and
validation errors that name the offending field."""
from __future__ import annotations

import itertools

import pytest

import tvmnorm
from tvmnorm.key import COMPUTE, DTYPES, FORWARD_STAGES, FP8, MAX_HIDDEN, NORMS, STAGES, NormKey

DECODERS = {
    "norm": tvmnorm.decode_norm, "stage": tvmnorm.decode_stage, "itype": tvmnorm.decode_itype,
    "wtype": tvmnorm.decode_wtype, "otype": tvmnorm.decode_otype, "ctype": tvmnorm.decode_ctype,
    "hidden_size": tvmnorm.decode_hidden_size, "zero_centered_gamma": tvmnorm.decode_zero_centered_gamma,
}


def valid_combos():
    for norm, stage, itype, wtype, otype, ctype, zc in itertools.product(
            NORMS, STAGES, DTYPES, DTYPES, DTYPES, DTYPES, (False, True)):
        if itype in FP8 or wtype in FP8 or ctype not in COMPUTE or (otype in FP8 and stage not in FORWARD_STAGES):
            continue
        yield dict(norm=norm, stage=stage, itype=itype, wtype=wtype, otype=otype, ctype=ctype,
                   zero_centered_gamma=zc)


def test_round_trip_all_valid_combinations(rng):
    combos = list(valid_combos())
    # norm, itype, wtype, ctype, zc x (stage, otype): fp8 out only for fwd and fwd_add
    assert len(combos) == 2 * 4 * 4 * 2 * 2 * (6 + 4 + 4 + 6)
    hiddens = [1, MAX_HIDDEN, *rng.integers(1, MAX_HIDDEN + 1, 3).tolist()]
    seen = {}
    for fields in combos:
        for h in hiddens:
            key = NormKey(hidden_size=int(h), **fields)
            packed = key.pack()
            assert isinstance(packed, int) and 0 <= packed < 2 ** 38, (key, packed)
            assert NormKey.unpack(packed) == key
            for name, decode in DECODERS.items():
                assert decode(packed) == getattr(key, name), (name, key)
            assert seen.setdefault(packed, key) == key, f"{key} and {seen[packed]} pack to {packed:#x}"
    # names are symbols: unique and C identifiers
    names = {NormKey(hidden_size=7, **f).name for f in combos}
    assert len(names) == len(combos) and all(n.isidentifier() for n in names)


def test_round_trip_random_hidden_sizes(rng):
    for h in rng.integers(1, MAX_HIDDEN + 1, 500):
        key = NormKey(norm="layernorm", stage="bwd_add", itype="fp16", wtype="fp32", otype="bf16",
                      hidden_size=int(h), zero_centered_gamma=bool(h % 2))
        assert NormKey.unpack(key.pack()) == key


def test_describe_is_transformer_engine_wording():
    key = NormKey(norm="rmsnorm", stage="fwd", itype="bf16", wtype="fp32", otype="fp8e4m3", hidden_size=7168)
    assert key.describe() == "hidden_size=7168, wtype=fp32, itype=bf16, otype=fp8e4m3, ctype=fp32"


@pytest.mark.parametrize("fields, field", [
    (dict(itype="fp8e4m3"), "itype"),
    (dict(itype="fp8e5m2"), "itype"),
    (dict(wtype="fp8e4m3"), "wtype"),
    (dict(hidden_size=0), "hidden_size"),
    (dict(hidden_size=-5), "hidden_size"),
    (dict(hidden_size=MAX_HIDDEN + 1), "hidden_size"),
    (dict(hidden_size=128.0), "hidden_size"),
    (dict(hidden_size=True), "hidden_size"),
    (dict(itype="fp4"), "itype"),
    (dict(wtype="fp4"), "wtype"),
    (dict(otype="fp4"), "otype"),
    (dict(ctype="fp4"), "ctype"),
    (dict(ctype="bf16"), "ctype"),
    (dict(stage="bwd", otype="fp8e4m3"), "otype"),
    (dict(stage="bwd_add", otype="fp8e5m2"), "otype"),
    (dict(norm="batchnorm"), "norm"),
    (dict(stage="bwd2"), "stage"),
    (dict(zero_centered_gamma=1), "zero_centered_gamma"),
], ids=lambda v: str(v) if isinstance(v, str) else "-".join(f"{k}={v}" for k, v in v.items()))
def test_invalid_key_names_field(fields, field):
    with pytest.raises(ValueError, match=field):
        NormKey(**{"hidden_size": 128, **fields})


def test_unpack_rejects_reserved_bits_and_bad_codes():
    packed = NormKey(hidden_size=4096).pack()
    for bit in (38, 45, 63):
        with pytest.raises(ValueError, match="reserved"):
            NormKey.unpack(packed | (1 << bit))
    with pytest.raises(ValueError, match="norm"):
        NormKey.unpack(packed | 3)  # norm code 3 does not exist
    assert NormKey.unpack(packed | (3 << 2)).stage == "fwd_add"  # the 2-bit stage field has no spare code
    with pytest.raises(ValueError, match="itype"):
        NormKey.unpack((packed & ~(7 << 4)) | (7 << 4))
    with pytest.raises(ValueError, match="hidden_size"):
        NormKey.unpack(packed & ~(((1 << 21) - 1) << 16))  # hidden 0
    for bad in (-1, 2 ** 64, "12", 1.0, True):
        with pytest.raises(ValueError):
            NormKey.unpack(bad)


def test_keys_are_hashable_values():
    a = NormKey(norm="layernorm", hidden_size=1000)
    b = NormKey(norm="layernorm", hidden_size=1000)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(Exception):
        a.hidden_size = 5  # frozen
