#!/usr/bin/env bash
# A device call carries the working tree and .whl under 64 MiB: with the llama3_8b state grown
# that needs room. Tracked files no device step reads are moved out of the tree before a call
# (`aside`) and back after it (`back`; one lost meanwhile comes back from HEAD).
#
#   bash benchmarks/device_aside.sh aside   # before the run call
#   bash benchmarks/device_aside.sh back    # after it
set -euo pipefail
cd "$(dirname "$0")/.."
KEEP=/tmp/tunefw-device-aside
# The recording is complete (no step resumes it); the reports and plots are CPU outputs.
FILES=(benchmarks/state/records/records_h200.db.xz benchmarks/results/report_sim_llama.html
       benchmarks/results/report_sim_llama.png benchmarks/results/report_replay_decode2_h200.html
       benchmarks/results/report_replay_decode2_h200.png)
case "${1:-}" in
  aside) mkdir -p "$KEEP"; for f in "${FILES[@]}"; do [ -e "$f" ] && mkdir -p "$KEEP/$(dirname "$f")" && mv "$f" "$KEEP/$f"; done
         echo "moved aside: $(du -sh "$KEEP" | cut -f1) (bash $0 back afterwards)" ;;
  back) for f in "${FILES[@]}"; do [ -e "$KEEP/$f" ] && mv "$KEEP/$f" "$f"; done
        for f in "${FILES[@]}"; do [ -e "$f" ] || git checkout -- "$f"; done  # a lost one: HEAD's
        echo "restored" ;;
  *) echo "usage: $0 aside|back" >&2; exit 2 ;;
esac
