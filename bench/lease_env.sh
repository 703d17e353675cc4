# Sourced first by the script of a device call (the call after .device/a/stage.sh's), so that
# each lease's scripts keep only what they run:
#
#   source bench/lease_env.sh || exit 1
#   timeout 200 python -m tvmnorm.bench ... --out "$X" ...; el "bench done"
#
# It puts TVM on the path (.device/b/activate.sh), makes $X ($OUT/x, packed into $OUT/x.tgz when
# the script exits, which the call brings back), gives `el` (a line stamped with the seconds
# since the start) and writes beside the results the device and versions (device.txt) and the
# kernel sources' hash (source-hash.txt): the device copy's git metadata can be stale, the hash
# names the tree that ran.
set -uo pipefail
source .device/b/activate.sh || return 1
export PYTHONUNBUFFERED=1
X=$OUT/x
mkdir -p "$X"
_lease_pack() { tar czf "$OUT/x.tgz" -C "$OUT" x; }
trap _lease_pack EXIT
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0)) s] $*"; }
python - > "$X/device.txt" <<'PY'
import importlib.metadata as md, os, platform, torch, tvm, tvm_ffi
def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device", "torch", torch.__version__, "tvm", tvm.__version__, "ffi", tvm_ffi.__version__,
      "triton", version("triton"), "liger", version("liger-kernel"), "python", platform.python_version())
print(cpu, os.cpu_count(), "cpus")
PY
python -c "from tvmnorm.build import source_hash; print(source_hash())" > "$X/source-hash.txt"
