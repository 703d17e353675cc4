# lease 44, call 3: bench/x_layouts.py again: the forward under no_grad, tvmnorm's backward
# through its host functions (call 1 timed both through autograd: host-bound), impls timed in
# rounds in turn, one torch.compile per shape (torch._dynamo.reset)
source bench/lease_env.sh || exit 1
mkdir -p /tmp/tc && tar xJf .device/l44/tc.txz -C /tmp/tc --strip-components=1; export TVMNORM_CACHE=/tmp/tc
timeout 400 python bench/x_layouts.py --out "$X" --rounds 3 > "$X/x-layouts.log" 2>&1
el "x_layouts rc $?"; grep -c " ok " "$X/x-layouts.log"; grep -c WRONG "$X/x-layouts.log"
