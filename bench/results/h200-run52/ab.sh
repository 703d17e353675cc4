# lease 52, after PHASE=bench of JOB=fwd on the same machine: the library of the committed bf16
# forward records ("old", built here) against the retune's ($STATE/lib, "new"), timed old, new,
# new, old at 16384 tokens (tuned impl only), for ab_accept.py's same-machine accept; the steps
# are bench/lease_ab.sh's (folded there when lease 67 ran them again)
HIDDEN=${HIDDEN:-128,896,7168,8192} bash bench/lease_ab.sh
