#!/usr/bin/env bash
# Nsight Compute of the llama3_8b table's mid-M wgmma_sm90 winners (exported as cuBLAS routes:
# they lose 0.84-0.94x) beside the cuBLAS kernel of the same shape, with warp stall reasons
# (WarpStateStats), to see why the same decomposition as cuBLAS's (profile_h200.json: 96x64
# tiles, 2-CTA clusters at 128x6144x4096) runs slower. Writes $OUT/profile_midm_h200.json and
# the raw CSV beside it. Run by device_batch.sh's midmprof step (TUNEFW_COMMIT set).
set -euo pipefail
cd "$(dirname "$0")/.."
table=benchmarks/results/dispatch_llama3_8b_h200.json
shapes=${MIDM_SHAPES:-64x4096x4096,128x4096x4096,256x4096x4096,512x4096x4096,128x6144x4096,256x6144x4096,256x4096x14336}
ncu --clock-control none --profile-from-start off --csv --page raw \
  --section SpeedOfLight --section LaunchStats --section WarpStateStats \
  --metrics dram__bytes_read.sum,lts__t_bytes.sum,gpc__cycles_elapsed.avg.per_second,sm__cycles_active.avg,gpc__cycles_elapsed.max \
  -k 'regex:^(gemm_|nvjet|sm[0-9]+_xmma|cutlass|splitKreduce|gemv|Kernel)' \
  python3 benchmarks/profile_h200.py --any-route --table "$table" --shapes "$shapes" \
  > "$OUT/profile_midm_h200.csv"
python3 benchmarks/profile_h200.py --table "$table" --shapes "$shapes" \
  --summarize "$OUT/profile_midm_h200.csv" --out "$OUT/profile_midm_h200.json" \
  --script-commit "${TUNEFW_COMMIT:-}" \
  --device "$(nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader)"
