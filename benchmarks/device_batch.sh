#!/usr/bin/env bash
# One device call, several steps in order, each under its own time limit, everything they write
# packed into one file ($OUT/batch.tar.gz: the device hands back at most 8 files) beside the log
# ($OUT/batch.log, whose table of steps comes last). Carry .whl (and benchmarks/micro/build for
# l2reuse, built here first); set TUNEFW_COMMIT (the device tree has no .git):
#
#   export TUNEFW_COMMIT=SHA; bash benchmarks/device_batch.sh l2reuse plancache modeltable
#
# Tree + .whl must stay under 64 MiB: `bash benchmarks/device_aside.sh aside` before the call
# (and `back` after) moves out tracked files no step reads; `device_aside.sh wheels ray|hf` keeps
# Ray (sweeps) or the Hugging Face wheels (hf steps) in .whl, never both.
#
# Steps (seconds allowed):
#   streambw    (120) benchmarks/micro/stream_bw.cu via stream_micro_h200.py (every read variant
#                     timed back to back and as a CUDA graph: the launch ceiling's fit; build it
#                     here first, like l2_reuse)
#   l2reuse     (120) benchmarks/micro/l2_reuse.cu via stream_micro_h200.py --micro l2_reuse
#                     (64-deep box stages with 0-256 activation rows, then 128/256-deep stages
#                     and a pre-packed weight in one 1D bulk copy a stage)
#   l2reuseocc   (60) the same micro's two-CTAs-an-SM variants only (--occ): does a second CTA
#                     per SM, which wgmma_sm90 cannot have, stream the weight faster?
#   records     (560) record_sweeps_h200.py --gpus GPUS (issue 17's recording, resumed from the
#                     committed state; its launches get what the call has left less 60 s, so
#                     the state is packed before the step's limit; commit it before the next call)
#                     run from the pinned tree (benchmarks/pinned_tree.sh: the code the recording
#                     was measured with, whatever main's method and kernels are now)
#   plancache   (150) plan_cache_h200.py --layers 4 --steps 12: per-call host cost in the model
#   modeltable  (400) model_table_h200.py --redo hf,guard --budget-s 340 (issues 14 and 19)
#   modelfused  (540) model_table_h200.py --fuse --study hf_llama3_8b_fused (study, sweep, export,
#                     hf): the fused model's own table (q/k/v one GEMM: tunefw/study/siblings.py; 25
#                     problems, FUSED_TRIALS trials, default 32; FUSED_STUDY names a new study)
#                     and the model patched with fuse=True against stock. Carries Ray and the
#                     HF wheels at once: before the call `device_aside.sh aside
#                     benchmarks/results benchmarks/state`
#   pdlcheck    (150) pdl_check_h200.py: chained up/down GEMMs served with and without
#                     programmatic launches agree bit for bit (eager, graphs) and their times
#   modelpdl    (330) model_table_h200.py --redo export,hf: the table's cubins shipped again
#                     (their manifest now says they wait for the kernel before), then the model
#                     with programmatic launches (TUNEFW_PDL=1: they are off by default)
#   hfnopdl     (200) hf_llama_h200.py on that table with TUNEFW_PDL=0 (run after modelpdl, in
#                     the same call): the same model without them -> hf_llama_nopdl_h200.json
#   stream64    (300) decode_probe.py: stream_sm90 at M = 40 and 64 (MTILES 6 and 8, new: the
#                     TMA-ring family that beats cuBLAS 1.22x at 32x4096x4096, where wgmma_sm90
#                     stops at 0.90-0.98 for M = 64) over Llama's four layers and the edge shapes
#   streamwn    (360) decode_probe.py: stream_sm90 at M = 32 and 64 with WN (warps splitting a
#                     CTA's 96-128 weight rows: A read once per wider tile; stream64's M = 64
#                     best was 0.80-0.95x cuBLAS at BN 32-64) over Llama's four layers, and
#                     random valid configs (WN included) verified on the edge shapes
#   sanitizewn  (360) compute-sanitizer memcheck + racecheck on 3 stream_sm90 configs with WN = 4
#                     that split K (the sliced partial tiles and the cluster's DSMEM sums) on
#                     edge shapes of M = 33-64
#   streama     (300) timeline_h200.py --family stream_sm90 on the streamwn probe's best configs
#                     (benchmarks/studies/stream_probe_table_h100.json, M = 32 and 64) as built
#                     and with TUNEFW_DIAG_A_ONCE (A loaded on the ring's first pass only: wrong
#                     answers, the weight's stream without A's traffic): is A's traffic what
#                     holds M = 64 at 72-84% of the streaming read?
#   gatedmodel  (560) issue 19's gated MLP in one call on an H200 (needs_h200: the model): the
#                     gated_h200 sweep (gated_h200.py, no verification: gated_verify_h100.json
#                     did it) into /tmp/gated.db (kept as $OUT's gated_h200.db.xz), then
#                     hf_gated_h200.py on it (the q/k/v table + the gated entries, the model with
#                     fuse=True, gated=True against stock). Carries Ray and the HF wheels:
#                     `device_aside.sh aside benchmarks/results benchmarks/state/records
#                     benchmarks/state/*_state.tar.gz but the qkv one ...`, `wheels both`
#   ckprobe     (150) what a cluster K split costs, controlled: timeline_h200.py on the probe table's
#                     32x4096x4096 and 64x4096x4096 stream_sm90 configs (BN 32, 128 CTAs) beside
#                     BN 64 with CK 2 (128 CTAs of the same bytes each, a cluster of 2 summing
#                     through DSMEM) and BN 64 with CK 1 (64 CTAs): if CK 2 loses to BN 32, a K
#                     split without clusters is worth building for wide tiles
#   earlyb      (240) timeline_h200.py --family stream_sm90 on stream_earlyb_table.json (decode winners
#                     at M = 1-64): the source as it is beside TUNEFW_EXP_EARLY_B (the weight's first
#                     ring loaded before griddepcontrol.wait: in a PDL chain the next GEMM's weight
#                     stream starts under the previous GEMM's tail, as B never depends on it). Only
#                     commit 1f937a3's stream_sm90.cuh has the experiment (not kept): run it there
#   decode6     (480) decode_h200.py on benchmarks/studies/decode6_h200.yaml, its state db kept
#   llamatable  (560) model_table_h200.py on studies/llama3_8b.yaml as it stands (issue 14's
#                     table: 56 problems, 64 trials, top 3 confirmed), then export, calibrate and
#                     dispatch_guard_h200.py; resumes from benchmarks/state/llama3_8b_state.tar.gz
#                     (copy the new one there from the batch tar and force-add it after a call;
#                     LLAMATABLE_ARGS=--new-round in the first call after a re-pin);
#                     from the pinned tree, like records (its confirmation resumes the study)
#   membound3   (420) decode_probe.py: wgmma_sm90 at M = 129 (the 136-wide swap-AB tile) and
#                     random valid configs on the edge shapes (the BN widths off a multiple of
#                     32 first run on a GPU here: every answer verified)
#   membound4   (540) the same at M = 64 and 128 over Llama's four layers, 48-wide weight tiles
#                     included (N = 6144 in 128 tiles, no split-K); alone in its call
#   membound5   (540) M = 64 and 129 again, one CTA a cluster, with 128- and 256-deep stages
#                     (a weight row's stage in 2 or 4 adjacent boxes: the wgmma probes so far
#                     loaded 64-deep stages only), 6 of them on each edge shape (K tails of a
#                     256-deep stage verified); alone in its call
#   membound6   (540) M = 128 and 129 over Llama's four layers, one CTA a cluster, 64- and
#                     128-deep stages side by side, swap-AB at every BM (256 weight rows a CTA
#                     included: half the activation re-reads of 128; never probed), where the
#                     launch ceiling leaves the most headroom (ours 0.59-0.87 of it); 879 jobs
#                     with the edge shapes' seeds; alone in its call
#   midm        (300) decode_probe.py --wgmma-midm 20: wgmma_sm90 at M = 128-1024 over Llama's four
#                     layers (and M = 129, 257) with tiles chosen by arithmetic (>= 64 FLOP a byte
#                     loaded, the waves of SMs full, split-K 1-4, swapped or not), where the
#                     llama3_8b sweep's best stayed 0.83-0.97x cuBLAS: can the existing knobs
#                     reach cuBLAS there (a search problem) or not (a kernel problem)? 480 jobs,
#                     existing knobs only
#   methodab    (240) method_ab_h200.py: the pinned tree's timing method (anchored-3) and this
#                     tree's (anchored-4) on the same 96 configs of four shapes, one launch each:
#                     trials/s and paired screened ratios (the newer method's gain, measured)
#   midmprof    (240) profile_midm.sh: Nsight Compute (stall reasons included) of the llama3_8b
#                     table's mid-M wgmma_sm90 winners beside cuBLAS's kernels: why the same
#                     decomposition as cuBLAS's runs 6-15% slower at M = 64-512 (the timed
#                     launches alone: the first run profiled every check kernel too and timed
#                     out after 5 of 7 shapes)
#   launchgap   (150) launch_gap_h200.py: the same mid-M winners as CUDA graphs of back-to-back
#                     GEMMs (own weight copies past L2) beside cuBLAS, launched plainly and
#                     programmatically: is their constant 1.3-3.3 us deficit a launch cost?
#   hfprofile   (200) hf_eager_profile_h200.py on the hf_llama3_8b study's table (HF wheels in .whl,
#                     no Ray: device_aside.sh wheels hf): stock, its copy, patched and patched over
#                     an empty table, eagerly, timed interleaved, torch.profiler and cProfile per
#                     model: which calls pay the patched model's extra host time at decode b64
#                     and prefill 512 (hf_llama_aa_h200.json)
#   hfsplit     (240) hf_eager_split_h200.py on the hf_llama3_8b study's table (HF wheels, no Ray):
#                     stock, a copy, patched, patched with wgmma_sm90 entries as cuBLAS routes and
#                     patched over an empty table, and patched with its kernels not launched,
#                     201 shuffled rounds at decode b64 / prefill 512,
#                     each step's host time split into linear forwards, tuned launches and the rest
#   timeline    (180) timeline_h200.py: the same winners built with TUNEFW_TIMELINE, every CTA's
#                     phases (set-up, first TMA, first data, main loop, epilogue, exit) and the
#                     gaps between kernels in graphed chains, plain and programmatic, beside
#                     cuBLAS's chain: where the per-CTA 1.7 us and the chain deficit go
#                     (TIMELINE_ARGS: source variants and knob overrides, --name)
#   fastcheck   (150) fastpath_check_h200.py on the hf_llama3_8b study's table (HF wheels, no
#                     Ray): the compiled call path's C bit for bit the Python launch's (twice,
#                     from a graph, through tunefw.Linear) and host us per call of each path
#   hfllama     (300) hf_llama_h200.py on the hf_llama3_8b study's table (HF wheels, no Ray): the
#                     issue's end-to-end comparison -> hf_llama_h200.json ($HFLLAMA_NAME.json)
#   hffused     (240) hf_llama_h200.py --fuse on the hf_llama3_8b_fused study's table (its committed
#                     state; HF wheels, no Ray: `device_aside.sh wheels hf`): the model as
#                     fuse=True patches it now -> hf_llama_fused_h200.json ($HFLLAMA_NAME.json)
#   guardprobe  (240) guard_probe_h200.py on the hf_llama3_8b study's table (HF wheels, no Ray): six
#                     fresh processes, each a shape's cold cuBLAS call, the guard's verdict and
#                     40 flushed pairs of kernel / matmul / F.linear: why the guard's verdict on
#                     64x1024x4096 flipped between processes (1.97x, 1.71x, 0.95x, 0.97x)
#   guardfirst  (200) guard_first_pair_h200.py on the hf_llama3_8b study's table (no Ray): the
#                     guard's first flushed pair timed as before (a new C and argument buffer
#                     between the events) and prepared (Plan.prepared), then steady pairs, and
#                     this tree's guard, on the large shapes its one-pair verdicts sent to cuBLAS
#   hfguard     (280) dispatch_guard_h200.py on the hf_llama3_8b study's calibrated table (no Ray):
#                     issue 14's acceptance on that table with this tree's guard and launch path
#                     -> dispatch_guard_hf_llama3_8b_h200.json
#   wgmmacheck  (240) wgmma_sm90_gpu_check.py --skip-perf: every kernel path and the split-K
#                     hand-off verified on the edge shapes (two launches bit for bit) after a
#                     wgmma_sm90 source change (CHECK_TAG names the result, default r5)
#   sanitize5   (420) compute-sanitizer memcheck + racecheck on 4 split-K configs with 256-deep
#                     stages (K tails past 2 and 4 stages: K = 520, 1032, 1040)
# Locally: tar -xzf FILES_AT/batch.tar.gz -C /tmp/batch; copy the results into place.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${TUNEFW_COMMIT:?set TUNEFW_COMMIT to the commit this tree is}"
final_out=${OUT:?run on the device machine, where \$OUT is set}
export OUT=$(mktemp -d /tmp/batch.XXXXXX)
log=$final_out/batch.log
source benchmarks/device_setup.sh >>"$log" 2>&1 || { echo "setup failed" | tee -a "$log"; exit 1; }

# The whole call has BATCH_S seconds (a device call is cut at 600 and then hands back nothing
# packed): a step gets its own limit or what is left of them, whichever is less, and is skipped
# when under 30 s are left.
BATCH_S=${BATCH_S:-560}
# The sweeps (records, llamatable) take one worker per GPU the machine has (GPUS to override)
gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
((gpus > 0)) || gpus=1

step() {  # NAME SECONDS COMMAND...: run it, record its exit status and time
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  local left=$((BATCH_S - SECONDS))
  if ((left < 30)); then
    summary+=("$(printf '%-11s skipped: %d s left of the call' "$name" "$left")")
    return
  fi
  ((limit > left)) && limit=$left
  echo "=== $name (limit ${limit} s): $*" >>"$log"
  timeout --kill-after=20 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-11s rc %-3s %4d s' "$name" "$rc" $((SECONDS - start)))")
}

hf_state() {  # the hf_llama3_8b study's table and cubins, in /tmp/hf_llama3_8b (the hf steps)
  mkdir -p /tmp/hf_llama3_8b && tar -xzf benchmarks/state/hf_llama3_8b_state.tar.gz -C /tmp/hf_llama3_8b
}

summary=()
for name in "$@"; do
  case $name in
    streambw) step streambw 120 python3 benchmarks/stream_micro_h200.py ;;
    l2reuse) step l2reuse 120 python3 benchmarks/stream_micro_h200.py --micro l2_reuse ;;
    l2reuseocc) step l2reuseocc 60 python3 benchmarks/stream_micro_h200.py --micro l2_reuse --occ ;;
    records) step records 560 bash benchmarks/pinned_tree.sh run benchmarks/record_sweeps_h200.py \
        --state "$PWD/benchmarks/state/records" --gpus "$gpus" \
        --budget-s $((BATCH_S - SECONDS - 60)) ;;  # the pinned tree; packs its state in time
    plancache) step plancache 150 python3 benchmarks/plan_cache_h200.py --layers 4 --steps 12 ;;
    modeltable) step modeltable 400 python3 benchmarks/model_table_h200.py \
        --commit "$TUNEFW_COMMIT" --redo hf,guard --budget-s 340 ;;
    modelfused) step modelfused 540 python3 benchmarks/model_table_h200.py --commit "$TUNEFW_COMMIT" \
        --fuse --study "${FUSED_STUDY:-hf_llama3_8b_fused}" --trials "${FUSED_TRIALS:-32}" \
        --phases study,sweep,export,hf --budget-s $((BATCH_S - SECONDS - 15)) ;;
    pdlcheck) step pdlcheck 150 python3 benchmarks/pdl_check_h200.py --commit "$TUNEFW_COMMIT" ;;
    modelpdl) step modelpdl 330 env TUNEFW_PDL=1 python3 benchmarks/model_table_h200.py \
        --commit "$TUNEFW_COMMIT" --redo export,hf --phases export,hf --budget-s 300 ;;
    hfnopdl) step hfnopdl 200 env TUNEFW_PDL=0 python3 benchmarks/hf_llama_h200.py \
        --table /tmp/hf_llama3_8b/dispatch.json --cubins /tmp/hf_llama3_8b/cubins \
        --commit "$TUNEFW_COMMIT" --budget-s 170 --out "$OUT/hf_llama_nopdl_h200.json" ;;
    stream64) step stream64 300 python3 benchmarks/decode_probe.py --families stream_sm90 \
        --m 40,64 --per-shape 24 --edge-configs 12 --name stream64_probe ;;
    streamwn) step streamwn 360 python3 benchmarks/decode_probe.py --families stream_sm90 \
        --m 32,64 --per-shape 20 --edge-configs 16 --name stream_wn_probe ;;
    sanitizewn) step sanitizewn 360 python3 benchmarks/sanitize_h200.py --family stream_sm90 \
        --tools memcheck,racecheck --split-k --where WN=4 --sample 3 \
        --shapes 33x136x1032,64x200x520,40x1032x1040 --timeout 110 \
        --out "$OUT/sanitize_stream_sm90_wn_h200.json" ;;
    streama) step streama 300 python3 benchmarks/timeline_h200.py --family stream_sm90 \
        --table benchmarks/studies/stream_probe_table_h100.json --rounds 5 --variant base= \
        --variant noA=TUNEFW_DIAG_A_ONCE --name timeline_stream_a.json --commit "$TUNEFW_COMMIT" ;;
    gatedmodel) step gatedsweep 200 python3 benchmarks/gated_h200.py --db /tmp/gated.db \
        --time-limit 150 --verify-sample 0 --result "$OUT/gated_h200.json"
      [ -f /tmp/gated.db ] && xz -9c /tmp/gated.db > "$OUT/gated_h200.db.xz"
      step gatedhf 340 python3 benchmarks/hf_gated_h200.py --gated-db /tmp/gated.db \
        --budget-s $((BATCH_S - SECONDS - 30)) --commit "$TUNEFW_COMMIT" ;;
    ckprobe) step ckprobe 150 python3 benchmarks/timeline_h200.py --family stream_sm90 \
        --table benchmarks/studies/stream_probe_table_h100.json --rounds 7 \
        --shapes 32x4096x4096,64x4096x4096 --override 32x4096x4096:BN=64,CK=2,STAGES=3 \
        --override 32x4096x4096:BN=64,CK=2,STAGES=2 --override 32x4096x4096:BN=64,CK=1,STAGES=3 \
        --override 64x4096x4096:BN=64,CK=2,STAGES=3 --override 64x4096x4096:BN=64,CK=1,STAGES=3 \
        --name timeline_stream_ck_h200.json --commit "$TUNEFW_COMMIT" ;;
    earlyb) step earlyb 240 python3 benchmarks/timeline_h200.py --family stream_sm90 \
        --table benchmarks/studies/stream_earlyb_table.json --rounds 7 \
        --variant base= --variant earlyb=TUNEFW_EXP_EARLY_B \
        --name timeline_stream_earlyb_h200.json --commit "$TUNEFW_COMMIT" ;;
    decode6) xz -dc benchmarks/state/decode6.db.xz > /tmp/decode6.db  # kept compressed: the carry limit
      step decode6 480 python3 benchmarks/decode_h200.py \
        --db /tmp/decode6.db --time-limit 420 --result "$OUT/decode6_h200.json" \
        benchmarks/studies/decode6_h200.yaml
      xz -9c /tmp/decode6.db > "$OUT/decode6.db.xz" ;;
    llamatable) step llamatable 560 bash benchmarks/pinned_tree.sh run benchmarks/model_table_h200.py \
        --study-file studies/llama3_8b.yaml --phases study,sweep,export,calibrate,guard \
        --resume "$PWD/benchmarks/state/llama3_8b_state.tar.gz" --gpus "$gpus" \
        --budget-s $((BATCH_S - SECONDS - 40)) ${LLAMATABLE_ARGS:-} ;;  # the pinned tree: the
        # study's method and sources; LLAMATABLE_ARGS=--new-round once after re-pinning
    membound3) step membound3 420 python3 benchmarks/decode_probe.py --families wgmma_sm90 \
        --per-shape 0 --edge-configs 16 --m 129 --wgmma-membound --name membound3_probe ;;
    membound4) step membound4 540 python3 benchmarks/decode_probe.py --families wgmma_sm90 \
        --per-shape 0 --edge-configs 0 --m 64,128 --wgmma-membound --name membound4_probe ;;
    membound5) step membound5 540 python3 benchmarks/decode_probe.py --families wgmma_sm90 \
        --per-shape 0 --edge-configs 0 --m 64,129 --wgmma-membound --membound-bk 128,256 \
        --membound-clusters 1 --membound-edges 6 --name membound5_probe ;;
    membound6) step membound6 540 python3 benchmarks/decode_probe.py --families wgmma_sm90 \
        --per-shape 0 --edge-configs 0 --m 128,129 --wgmma-membound --membound-bk 64,128 \
        --membound-clusters 1 --membound-swap-all-bm --name membound6_probe ;;
    midm) step midm 300 python3 benchmarks/decode_probe.py --families "" \
        --m 128,129,256,257,512,1024 --wgmma-midm 20 --name midm_probe ;;
    methodab) bash benchmarks/pinned_tree.sh unpack >/dev/null
      step methodab 240 python3 benchmarks/method_ab_h200.py --commit "$TUNEFW_COMMIT" ;;
    midmprof) step midmprof 240 bash benchmarks/profile_midm.sh ;;
    launchgap) step launchgap 150 python3 benchmarks/launch_gap_h200.py --commit "$TUNEFW_COMMIT" ;;
    timeline) step timeline 180 python3 benchmarks/timeline_h200.py --commit "$TUNEFW_COMMIT" \
        ${TIMELINE_ARGS:-} ;;  # TIMELINE_ARGS: --variant / --override (word-split)
    sanitize5) step sanitize5 420 python3 benchmarks/sanitize_h200.py --family wgmma_sm90 \
        --tools memcheck,racecheck --split-k --where BK=256 --sample 4 \
        --shapes 17x24x520,129x136x1032,200x1000x1040 --timeout 190 \
        --out "$OUT/sanitize_wgmma_sm90_bk256_h200.json" ;;
    hfsplit) hf_state && step hfsplit 240 python3 benchmarks/hf_eager_split_h200.py \
        --table /tmp/hf_llama3_8b/dispatch.json --cubins /tmp/hf_llama3_8b/cubins \
        --commit "$TUNEFW_COMMIT" ;;
    hfprofile) hf_state && step hfprofile 200 python3 benchmarks/hf_eager_profile_h200.py --rounds 41 --steps 4 \
        --table /tmp/hf_llama3_8b/dispatch.json --cubins /tmp/hf_llama3_8b/cubins \
        --commit "$TUNEFW_COMMIT" ;;
    fastcheck) hf_state && step fastcheck 150 python3 benchmarks/fastpath_check_h200.py \
        --table /tmp/hf_llama3_8b/dispatch.json --cubins /tmp/hf_llama3_8b/cubins \
        --commit "$TUNEFW_COMMIT" ;;
    hfllama) hf_state && step hfllama 300 python3 benchmarks/hf_llama_h200.py \
        --table /tmp/hf_llama3_8b/dispatch.json --cubins /tmp/hf_llama3_8b/cubins \
        --commit "$TUNEFW_COMMIT" --budget-s 270 --out "$OUT/${HFLLAMA_NAME:-hf_llama_h200}.json" ;;
    hffused) mkdir -p /tmp/hf_fused && tar -xzf benchmarks/state/hf_llama3_8b_fused_state.tar.gz -C /tmp/hf_fused \
      && step hffused 240 python3 benchmarks/hf_llama_h200.py --fuse --table /tmp/hf_fused/dispatch.json \
        --cubins /tmp/hf_fused/cubins --commit "$TUNEFW_COMMIT" --budget-s 210 \
        --out "$OUT/${HFLLAMA_NAME:-hf_llama_fused_h200}.json" ;;
    guardprobe) hf_state && step guardprobe 240 python3 benchmarks/guard_probe_h200.py \
        --table /tmp/hf_llama3_8b/dispatch.json --cubins /tmp/hf_llama3_8b/cubins \
        --commit "$TUNEFW_COMMIT" ;;
    guardfirst) hf_state && step guardfirst 200 python3 benchmarks/guard_first_pair_h200.py \
        --table /tmp/hf_llama3_8b/dispatch_calibrated.json --cubins /tmp/hf_llama3_8b/cubins \
        --commit "$TUNEFW_COMMIT" ;;
    hfguard) hf_state && step hfguard 280 python3 benchmarks/dispatch_guard_h200.py \
        --table /tmp/hf_llama3_8b/dispatch_calibrated.json --cubins /tmp/hf_llama3_8b/cubins \
        --budget-s 250 --commit "$TUNEFW_COMMIT" --out "$OUT/dispatch_guard_hf_llama3_8b_h200.json" ;;
    wgmmacheck) step wgmmacheck 240 python3 benchmarks/wgmma_sm90_gpu_check.py --skip-perf \
        --commit "$TUNEFW_COMMIT" --out "$OUT/wgmma_sm90_gpu_check_${CHECK_TAG:-r5}_h200.json" ;;
    *) summary+=("$(printf '%-11s unknown step' "$name")") ;;
  esac
done
tar -czf "$final_out/batch.tar.gz" -C "$OUT" .
{ echo "=== steps"; printf '%s\n' "${summary[@]}"; echo "packed:"; tar -tzf "$final_out/batch.tar.gz"; } \
  | tee -a "$log"
