"""The one shape catalog: model hidden sizes with training and decode row counts.

tune, tests and bench all read this table, so a shape added here is tuned, tested and
benchmarked alike.
"""
from __future__ import annotations

import dataclasses

from .key import MAX_HIDDEN

TRAIN_TOKENS = 16384
DECODE_ROWS = (1, 8, 64, 256)


@dataclasses.dataclass(frozen=True)
class Shape:
    model: str        # e.g. "deepseek-v3"
    what: str         # which norm in the model
    hidden: int
    heads: int = 1    # QK-norm normalises each head: rows = tokens x heads

    def rows(self, tokens: int) -> int:
        return tokens * self.heads

    @property
    def train_rows(self) -> int:
        return self.rows(TRAIN_TOKENS)

    @property
    def decode_rows(self) -> tuple:
        return tuple(self.rows(t) for t in DECODE_ROWS)


CATALOG = {
    "deepseek": (
        Shape("deepseek-v3", "hidden", 7168),
        Shape("deepseek-v3", "q_lora", 1536),
        Shape("deepseek-v3", "kv_lora", 512),
    ),
    "qwen": tuple(Shape("qwen2.5/3", "hidden", h) for h in (896, 1024, 1536, 2048, 2560, 3584, 4096, 5120, 8192)),
    # Qwen3 QK-norm: head_dim 128 over 32 query heads (the largest head count in the family
    # that the training token count keeps within memory)
    "qknorm": (Shape("qwen3", "qk_norm", 128, heads=32),),
}


def shapes(groups="all") -> list:
    """Shapes of the named groups ("deepseek,qwen", a list, or "all"), deduplicated by hidden size
    in catalog order."""
    if isinstance(groups, str):
        groups = list(CATALOG) if groups == "all" else [g.strip() for g in groups.split(",") if g.strip()]
    unknown = [g for g in groups if g not in CATALOG]
    if unknown:
        raise ValueError(f"unknown shape group(s) {unknown}; known: {sorted(CATALOG)}")
    seen, out = set(), []
    for g in groups:
        for s in CATALOG[g]:
            if s.hidden not in seen:
                seen.add(s.hidden)
                out.append(s)
    return out


def hidden_sizes(groups="all") -> list:
    return [s.hidden for s in shapes(groups)]


def parse_hidden(text: str) -> list:
    """The hidden sizes of a --hidden argument ("768,4096"), each one the kernels take."""
    try:
        sizes = [int(h) for h in text.split(",") if h.strip()]
    except ValueError:
        raise ValueError(f"--hidden must be integers, got {text!r}") from None
    if not sizes or not all(1 <= h <= MAX_HIDDEN for h in sizes):
        raise ValueError(f"--hidden sizes must be in [1, {MAX_HIDDEN}], got {text!r}")
    return sizes


def shape_of(hidden: int) -> Shape:
    """A hidden size's catalog shape (QK-norm 128: rows = tokens x heads), or a shape of one row
    per token for a size outside the catalog: ``--hidden 128`` then means the rows that tune
    tuned and `tune accept` looks for."""
    return next((s for s in shapes() if s.hidden == hidden), Shape("custom", "hidden", hidden))


def train_rows(hidden: int) -> int:
    """The training row count of a hidden size: its catalog shape's (QK-norm: tokens x heads),
    or TRAIN_TOKENS for a size outside the catalog."""
    return shape_of(hidden).train_rows
