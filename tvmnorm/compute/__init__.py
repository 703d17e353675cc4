"""What to compute: RMSNorm / LayerNorm as TVM tensor expressions, one PrimFunc per kernel."""
from .norms import kernel_funcs, KERNEL_PARTS, symbolic_rows

__all__ = ["kernel_funcs", "KERNEL_PARTS", "symbolic_rows"]
