"""Host microseconds of each layer of a decode forward call on CUDA (bf16), best of rounds."""
import sys, time, torch, warnings
warnings.simplefilter("ignore")
import tvmnorm.torch as tn
from tvmnorm.torch import _host, ops
F = torch.nn.functional
def t(f, n=2000):
    for _ in range(100): f()
    torch.cuda.synchronize()
    best = 1e9
    for r in range(7):
        t0 = time.perf_counter()
        for _ in range(n): f()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return round(best, 2)
dt = torch.bfloat16
for H, rows in ((128, 32), (4096, 1), (4096, 64)):
    x = torch.randn(rows, H, device="cuda", dtype=dt); w = torch.randn(H, device="cuda", dtype=dt)
    b = torch.randn(H, device="cuda", dtype=dt)
    y = torch.empty_like(x); rs = torch.empty(rows, device="cuda"); mu = torch.empty(rows, device="cuda")
    k = _host.kernel("rmsnorm", "fwd", dt, dt, dt, H, False, True)
    kl = _host.kernel("layernorm", "fwd", dt, dt, dt, H, False, True)
    f = k.forward_for(rows)
    cases = {
        "raw ffi": lambda: f(x, w, y, rs, 1e-6),
        "NormKernel": lambda: k(x, w, y, rs, eps=1e-6),
        "ln NormKernel": lambda: kl(x, w, b, y, mu, rs, eps=1e-5),
        "_host.rms_fwd": lambda: _host.rms_fwd(x, w, 1e-6, False, dt),
        "tn.rms_norm": lambda: tn.rms_norm(x, w, 1e-6),
        "tn.layer_norm": lambda: tn.layer_norm(x, w, b, 1e-5),
        "F.rms_norm": lambda: F.rms_norm(x, (H,), w, 1e-6),
        "F.layer_norm": lambda: F.layer_norm(x, (H,), w, b, 1e-5),
        "torch.empty_like": lambda: torch.empty_like(x),
        "x.new_empty(rows)": lambda: x.new_empty(rows, dtype=torch.float32),
        "x * 2 (one torch kernel)": lambda: x * 2,
    }
    print(f"H={H} rows={rows}: " + "  ".join(f"{n} {t(c)}" for n, c in cases.items()), flush=True)
