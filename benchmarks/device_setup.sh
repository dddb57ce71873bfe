#!/usr/bin/env bash
# Source on the GPU machine: installs the carried wheels (.whl, from ../shared/tools/device-wheels.sh)
# into /tmp/site (and Ray's ray.tar.xz when it was carried) and puts them and this tree on
# PYTHONPATH. benchmarks/hf_wheels.txt lists the extra wheels of benchmarks/hf_llama_h200.py.
dups=$(ls .whl/*.whl 2>/dev/null | sed 's|.*/||; s|-[0-9].*||' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dups" ]; then  # pip refuses two versions of one package (ResolutionImpossible)
  echo "device_setup: .whl holds two versions of: $(echo $dups) (delete the one you do not want)" >&2
  return 1 2>/dev/null || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && { [ ! -f .whl/ray.tar.xz ] || tar -xJf .whl/ray.tar.xz -C /tmp/site; } \
  && export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH \
  && export PYTHONUNBUFFERED=1 TUNEFW_CACHE_DIR=/tmp/tunefw-cache
