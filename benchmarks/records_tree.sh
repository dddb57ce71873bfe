#!/usr/bin/env bash
# Issue 17's recording runs from a pinned tree: the code its studies were measured with (timing
# method, kernel sources, parameter space), so main can change the method and the kernels while
# the recording completes over several device calls.
#
#   bash benchmarks/records_tree.sh pin [SHA]   # (here) pack SHA's tree (default HEAD) into
#                                               # benchmarks/state/records/tree.tar.gz; force-add it
#   bash benchmarks/records_tree.sh run ARGS... # (device, after device_setup) unpack it into
#                                               # /tmp/records-tree and run its record_sweeps_h200.py
#                                               # there on this tree's state: --state is added
#
# A launch of a records study refuses another kernel source or method anyway (the round's
# guard); pin a new tree only with the sources and space the recorded trials were measured on.
set -euo pipefail
cd "$(dirname "$0")/.."
TREE_TAR=benchmarks/state/records/tree.tar.gz
PATHS=(tunefw kernel_templates pyproject.toml benchmarks/record_sweeps_h200.py
       benchmarks/record_sweeps_summary.py benchmarks/sweep_h200.py benchmarks/studies/records_h200.yaml)
case "${1:-}" in
  pin)
    sha=$(git rev-parse "${2:-HEAD}")
    tmp=$(mktemp -d)
    git archive --format=tar --prefix=tree/ "$sha" -- "${PATHS[@]}" | tar -xf - -C "$tmp"
    echo "$sha" > "$tmp/tree/COMMIT"
    tar -czf "$TREE_TAR" -C "$tmp/tree" .
    rm -rf "$tmp"
    echo "pinned $sha in $TREE_TAR ($(du -h "$TREE_TAR" | cut -f1)); git add -f it"
    ;;
  run)
    shift
    state=$PWD/benchmarks/state/records
    tree=/tmp/records-tree
    rm -rf "$tree" && mkdir -p "$tree" && tar -xzf "$TREE_TAR" -C "$tree"
    # device_setup's wheels (/tmp/site) stay on the path; this tree gives way to the pinned one
    site=$( [ -d /tmp/site ] && echo /tmp/site: || true )
    cd "$tree"
    PYTHONPATH="$site$tree" exec python3 benchmarks/record_sweeps_h200.py --state "$state" \
      --commit "$(cat COMMIT)" "$@"
    ;;
  *)
    echo "usage: $0 pin [SHA] | run ARGS..." >&2
    exit 2
    ;;
esac
