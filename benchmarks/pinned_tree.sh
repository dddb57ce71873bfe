#!/usr/bin/env bash
# Runs that resume studies measured earlier (issue 17's recording, the llama3_8b table) run from
# a pinned tree: the code their trials were measured with (timing method, kernel sources,
# parameter spaces), so main's method and kernels can move on while they complete over several
# device calls. A resumed launch refuses another method or kernel source anyway (the round's
# guard): pin only a tree with those the studies were measured on (tests/test_record_sweeps.py
# checks the committed tree against both states).
#
#   bash benchmarks/pinned_tree.sh pin [SHA]        # (here) pack SHA's tree (default HEAD) into
#                                                   # benchmarks/state/tree.tar.gz; git add -f it
#   bash benchmarks/pinned_tree.sh run SCRIPT ARGS  # (device, after device_setup) unpack it into
#                                                   # /tmp/pinned-tree and run its SCRIPT there
#                                                   # with ARGS and --commit (the pinned SHA)
#   bash benchmarks/pinned_tree.sh unpack           # only unpack it (prints where)
#
# Paths in ARGS are resolved here first (this tree's state files are what the run resumes).
set -euo pipefail
cd "$(dirname "$0")/.."
TREE_TAR=benchmarks/state/tree.tar.gz
TREE=/tmp/pinned-tree
PATHS=(tunefw kernel_templates pyproject.toml studies benchmarks/studies benchmarks/models
       benchmarks/*.py)
unpack() { rm -rf "$TREE" && mkdir -p "$TREE" && tar -xzf "$TREE_TAR" -C "$TREE"; }
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
  unpack)
    unpack
    echo "$TREE"
    ;;
  run)
    script=${2:?usage: $0 run SCRIPT ARGS...}
    shift 2
    unpack
    # device_setup's wheels (/tmp/site) stay on the path; this tree gives way to the pinned one
    site=$( [ -d /tmp/site ] && echo /tmp/site: || true )
    cd "$TREE"
    PYTHONPATH="$site$TREE" exec python3 "$script" "$@" --commit "$(cat COMMIT)"
    ;;
  *)
    echo "usage: $0 pin [SHA] | run SCRIPT ARGS... | unpack" >&2
    exit 2
    ;;
esac
