# lease 42, call 2: the default-kernel cache compiled by nvcc (this session) against TVM's CUDA
# module: a process's cost of a default key, the backward's GPU time with programmatic dependent
# launch against without; then the host time of a train step, this tree against 81eaee4's
source bench/lease_env.sh || exit 1
S=.device/l42
timeout 200 python $S/jit_probe.py "$X" > "$X/jit-probe.log" 2>&1
el "jit probe"; cat "$X/jit-probe.log" | cut -c1-200
# the backward of untuned keys, both caches (filled by the probe where it ran the key), in turn
for i in 1 2; do
  for mode in nvcc nvrtc; do
    TVMNORM_JIT_NVCC=$([ $mode = nvcc ] && echo 1 || echo 0) TVMNORM_CACHE=/tmp/jit-$mode timeout 150 \
      python -m tvmnorm.bench --target cuda --ops rmsnorm_bwd,layernorm_bwd --dtypes bf16 --hidden 2880,6144 \
      --rows 16384,1,64,256 --impls tvmnorm_default,torch_eager --rounds 2 --out "$X" --name default-$mode-$i \
      --no-plots --quiet > "$X/default-$mode-$i.log" 2>&1
    el "default $mode $i: $(tail -1 "$X/default-$mode-$i.log")"
  done
done
mkdir -p /tmp/old /tmp/tc && tar xzf .device/l42/old-tvmnorm.tgz -C /tmp/old
tar xJf .device/l42/tc.txz -C /tmp/tc --strip-components=1
export TVMNORM_CACHE=/tmp/tc
H=128,1024,4096,7168
for i in 1 2; do
  timeout 100 python bench/host_overhead.py --out "$X" --name host-new-$i --hidden $H --modes fwd,train --impls tvmnorm,torch_eager > "$X/host-new-$i.log" 2>&1
  el "new $i: $(tail -1 "$X/host-new-$i.log")"
  PYTHONPATH=/tmp/old:${PYTHONPATH:-} timeout 100 python bench/host_overhead.py --out "$X" --name host-old-$i --hidden $H --modes fwd,train --impls tvmnorm > "$X/host-old-$i.log" 2>&1
  el "old $i: $(tail -1 "$X/host-old-$i.log")"
done
