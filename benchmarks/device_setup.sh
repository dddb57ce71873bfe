#!/usr/bin/env bash
# Source on the GPU machine: installs the carried wheels (.whl, from ../shared/tools/device-wheels.sh)
# into /tmp/site and puts them and this tree on PYTHONPATH.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && tar -xJf .whl/ray.tar.xz -C /tmp/site \
  && export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH \
  && export PYTHONUNBUFFERED=1 TUNEFW_CACHE_DIR=/tmp/tunefw-cache
