#!/usr/bin/env bash
# A device call carries the working tree and .whl under 64 MiB: with the llama3_8b state grown
# that needs room. Tracked files no device step reads are moved out of the tree before a call
# (`aside`) and back after it (`back`; one lost meanwhile comes back from HEAD).
#
#   bash benchmarks/device_aside.sh aside   # before the run call
#   bash benchmarks/device_aside.sh back    # after it
#
# `aside PATH...` moves those too (e.g. benchmarks/results benchmarks/state: a call carrying Ray
# and the HF wheels at once, for modelfused, has room for the code alone); `back` brings them.
#
# .whl cannot carry Ray (ray.tar.xz, 32 MB) and the Hugging Face wheels (benchmarks/hf_wheels.txt,
# 17 MB) at once beside the tree: `wheels ray` leaves Ray in .whl for a sweep (launch, records,
# llamatable), `wheels hf` the HF wheels for hf_llama_h200.py / hf_eager_profile_h200.py (no
# Ray), `wheels both` both (for a step that sweeps and then runs the model: aside
# benchmarks/results and the state files it does not read first), `wheels` says which are in;
# the other set waits in $KEEP/whl.
set -euo pipefail
cd "$(dirname "$0")/.."
KEEP=/tmp/tunefw-device-aside
# The recording is complete (no step resumes it); the reports and plots are CPU outputs.
FILES=(benchmarks/state/records/records_h200.db.xz benchmarks/results/report_sim_llama.html
       benchmarks/results/report_sim_llama.png benchmarks/results/report_replay_decode2_h200.html
       benchmarks/results/report_replay_decode2_h200.png)
case "${1:-}" in
  aside) mkdir -p "$KEEP"; for f in "${FILES[@]}"; do [ -e "$f" ] && mkdir -p "$KEEP/$(dirname "$f")" && mv "$f" "$KEEP/$f"; done
         # mv -T: a stale empty folder of an earlier aside is replaced, never nested into
         shift; for f in "$@"; do [ -e "$f" ] && mkdir -p "$KEEP/more/$(dirname "$f")" && mv -T "$f" "$KEEP/more/$f" \
                                   && echo "$f" >> "$KEEP/more.txt"; done
         echo "moved aside: $(du -sh "$KEEP" | cut -f1) (bash $0 back afterwards)" ;;
  back) more=(); [ -f "$KEEP/more.txt" ] && mapfile -t more < "$KEEP/more.txt" && rm "$KEEP/more.txt"
        for f in "${more[@]}"; do [ -e "$KEEP/more/$f" ] && [ ! -e "$f" ] && mv -T "$KEEP/more/$f" "$f"; done
        for f in "${FILES[@]}"; do [ -e "$KEEP/$f" ] && mv "$KEEP/$f" "$f"; done
        for f in "${FILES[@]}"; do [ -e "$f" ] || git checkout -- "$f"; done  # a lost one: HEAD's
        git ls-files --deleted -z | xargs -0 -r git checkout --  # any other lost one: HEAD's
        echo "restored" ;;
  wheels)
    mkdir -p "$KEEP/whl"
    hf=$(sed -n 's/^\([A-Za-z0-9_.-]*\)==.*/\1/p' benchmarks/hf_wheels.txt | tr 'A-Z-' 'a-z_')
    move() {  # move(src, dst, pattern...): each file matching a pattern from src to dst
      local src=$1 dst=$2; shift 2
      for p in "$@"; do for f in "$src"/$p; do [ -e "$f" ] && mv "$f" "$dst/"; done; done; return 0; }
    case "${2:-}" in
      ray) move "$KEEP/whl" .whl ray.tar.xz
           move .whl "$KEEP/whl" $(for n in $hf; do echo "${n}-*.whl"; done) ;;
      hf) move "$KEEP/whl" .whl $(for n in $hf; do echo "${n}-*.whl"; done)
          move .whl "$KEEP/whl" ray.tar.xz ;;
      both) move "$KEEP/whl" .whl ray.tar.xz $(for n in $hf; do echo "${n}-*.whl"; done) ;;
      "") ;;
      *) echo "usage: $0 wheels [ray|hf|both]" >&2; exit 2 ;;
    esac
    ray=no; [ -e .whl/ray.tar.xz ] && ray=yes
    n=0; for x in $hf; do for f in .whl/${x}-*.whl; do [ -e "$f" ] && n=$((n + 1)); done; done
    echo ".whl: $(du -sh .whl | cut -f1), ray $ray, HF wheels $n of $(echo $hf | wc -w)"
    if [ "${2:-}" = hf ] && [ "$n" -lt "$(echo $hf | wc -w)" ]; then
      echo "missing HF wheels: fetch them with the pip download line in benchmarks/hf_wheels.txt" >&2
    fi ;;
  *) echo "usage: $0 aside|back|wheels [ray|hf|both]" >&2; exit 2 ;;
esac
