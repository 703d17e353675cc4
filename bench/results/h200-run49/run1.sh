# lease 49, call 1: stage the compiler's first half, then the shared-sums probe (raw cubins, no TVM)
bash .device/a/stage.sh
python .device/ss/shared_sums_probe.py .device/ss 2>&1 | tee $OUT/shared-sums.log | tail -80
