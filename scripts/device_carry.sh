#!/usr/bin/env bash
# The working tree travels with every device call, and a call carries at most 64 MiB: with
# .device/b (42 MiB) the tree must stay under ~20 MiB, and .device/tc.txz (~22 MiB) now rides with
# .device/a (30 MiB) in the staging call (bench/h200_proof.sh cache unpacks it). Before such a
# call, `trim` moves what the GPU jobs never read (the raw tuning databases and every bench result
# but h200-tuned.json, which `tune accept` reads as PREVIOUS) into .device/stash (git-ignored);
# after the lease, `restore` moves them back.
#
#   bash scripts/device_carry.sh trim      # before the calls
#   bash scripts/device_carry.sh restore   # after them
#
# Moving, not deleting: a lease's new, not yet committed results under bench/results survive (the
# fourteenth lease's `rm` of that folder took an uncommitted README with it), and a commit made
# while trimmed cannot record them as deleted by accident once restored. Refuses to trim twice.
set -euo pipefail
cd "$(dirname "$0")/.."
S=.device/stash
case "${1:-}" in
  trim)
    if [ -e "$S" ]; then
      echo "$S exists: run '$0 restore' first" >&2
      exit 1
    fi
    mkdir -p "$S"
    shopt -s nullglob
    for p in tuning_logs/cuda-sm_90/run-* tuning_logs/llvm-znver5 bench/results/*; do
      [ "$p" = bench/results/h200-tuned.json ] && continue
      mkdir -p "$S/$(dirname "$p")"
      mv "$p" "$S/$p"
      echo "$p" >> "$S/moved.txt"
    done
    echo "moved $(wc -l < "$S/moved.txt" 2>/dev/null || echo 0) paths to $S; the tree is now" \
      "$(du -sh --exclude=.git --exclude=.venv --exclude=.device . | cut -f1)"
    ;;
  restore)
    if [ ! -d "$S" ]; then
      echo "nothing to restore ($S does not exist)"
      exit 0
    fi
    if [ -f "$S/moved.txt" ]; then
      while IFS= read -r p; do
        if [ -e "$p" ]; then
          echo "$p is in the tree again (a checkout?): keeping it, its stashed copy stays in $S" >&2
          continue
        fi
        mv "$S/$p" "$p"
      done < "$S/moved.txt"
    fi
    left=$(find "$S" -mindepth 1 -type f ! -name moved.txt | head -1)
    if [ -n "$left" ]; then
      echo "kept $S: it still holds files (e.g. $left)" >&2
      exit 1
    fi
    rm -rf "$S"
    echo "restored"
    ;;
  *)
    echo "usage: $0 trim|restore" >&2
    exit 2
    ;;
esac
