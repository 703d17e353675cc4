# lease 42, second machine: the backward's host path alone (tvmnorm_kernel in the train mode:
# the forward and backward kernel calls on preallocated outputs, no autograd), this tree against
# 81eaee4's, processes in turn; the autograd step beside it
source bench/lease_env.sh || exit 1
mkdir -p /tmp/old /tmp/tc && tar xzf .device/l42/old-tvmnorm.tgz -C /tmp/old
tar xJf .device/l42/tc.txz -C /tmp/tc --strip-components=1
export TVMNORM_CACHE=/tmp/tc
A=(--hidden 128,1024,4096,7168 --tokens 1,64 --modes fwd,train --impls tvmnorm_kernel,tvmnorm)
for i in 1 2 3; do
  timeout 60 python bench/host_overhead.py --out "$X" --name kernel-new-$i "${A[@]}" > "$X/kernel-new-$i.log" 2>&1
  el "new $i"
  PYTHONPATH=/tmp/old:${PYTHONPATH:-} timeout 60 python bench/host_overhead.py --out "$X" --name kernel-old-$i "${A[@]}" > "$X/kernel-old-$i.log" 2>&1
  el "old $i"
done
