"""tvmnorm for PyTorch: functional ops, autograd, torch.library ops and nn.Modules.

    import tvmnorm.torch as tn
    y = tn.rms_norm(x, weight, 1e-6)                      # any leading shape, last dim normalized
    y = tn.layer_norm(x, weight, bias, 1e-5)
    y8, amax = tn.rms_norm_fp8(x, weight, scale)          # fused fp8 output, amax: fp32 [1]
    y, h = tn.rms_norm_add(x, residual, weight, 1e-6)     # h = x + residual, y = rms_norm(h)
    y8, h, amax = tn.rms_norm_add_fp8(x, residual, weight, scale)   # the same, y in fp8
    model = tn.patch_norms(model)                         # swap torch.nn.RMSNorm / LayerNorm

CPU tensors run the llvm kernels, CUDA tensors the CUDA ones (on torch's current stream). The
ops are registered as ``torch.ops.tvmnorm.*`` so that ``torch.compile(fullgraph=True)`` keeps
them in the graph. A config without a tuned kernel warns once with ``tvmnorm.FallbackWarning``.
"""
from __future__ import annotations

from ..runtime import FallbackWarning
from .modules import LayerNorm, RMSNorm, patch_norms
from .ops import (LayerNormAddFunction, LayerNormFunction, RMSNormAddFunction, RMSNormFunction, layer_norm,
                  layer_norm_add, layer_norm_add_fp8, layer_norm_fp8, rms_norm, rms_norm_add, rms_norm_add_fp8,
                  rms_norm_fp8)

__all__ = ["rms_norm", "layer_norm", "rms_norm_fp8", "layer_norm_fp8", "rms_norm_add", "layer_norm_add",
           "rms_norm_add_fp8", "layer_norm_add_fp8", "RMSNorm", "LayerNorm", "patch_norms", "RMSNormFunction",
           "LayerNormFunction", "RMSNormAddFunction", "LayerNormAddFunction", "FallbackWarning"]
