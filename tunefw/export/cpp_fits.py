"""The shape-dependent part of each family's check() in C++ (``fits_<family>`` of the header
tunefw/export/cpp.py writes), mirroring templates/<family>.py::_check; tests/test_export_cpp.py
compares them with Python on random configs and shapes. ``GATED`` is 1 for an entry of a gated
problem, whose tiles write BN/2 columns (GemmProblem.tile_out_cols)."""
from __future__ import annotations

CPP_FITS = {
    "mma_sm80": """\
  if (e.split_k > 1) {
    const int64_t ktiles = cdiv(K, e.bk);
    if (e.split_k > ktiles) return false;
    if (cdiv(ktiles, e.split_k) * (e.split_k - 1) >= ktiles) return false;
    const int64_t tiles = cdiv(M, e.bm) * cdiv(N, e.bn);
    const int64_t per_tile = int64_t(e.split_k) * e.bm * e.bn * 4;
    if (tiles > kMaxWorkspaceBytes / per_tile) return false;
    if (cdiv(tiles * 4, 256) * 256 + tiles * per_tile > kMaxWorkspaceBytes) return false;
  }
  return cdiv(M, e.bm) * cdiv(N, e.bn) <= kMaxGrid;""",
    # Under SWAP_AB the kernel's rows are N and its columns the M <= 256 tokens.
    "wgmma_sm90": """\
  if (SWAP_AB && M > 256) return false;
  const int64_t num_m = cdiv(SWAP_AB ? N : M, BM);
  const int64_t num_n = cdiv(SWAP_AB ? M : N, e.gate == Gate::none ? BN : BN / 2);
  if (CLUSTER_M > num_m || CLUSTER_N > num_n) return false;
  if (SPLIT_K > cdiv(K, BK)) return false;
  if (PERSISTENT == 0 &&
      cdiv(num_m, CLUSTER_M) * cdiv(num_n, CLUSTER_N) * SPLIT_K * CLUSTER_M > kMaxGrid)
    return false;
  return true;""",
    # Reads its knobs from the entry's template arguments (see _knob_prelude).
    "skinny_sm90": """  const int64_t need = cdiv(M, 8);
  if (MTILES < need || MTILES > 2 * need) return false;
  if (BN - 16 >= N) return false;
  const int64_t steps = cdiv(K, 32 * KV), per_rank = cdiv(steps, CK);
  if (per_rank * (CK - 1) >= steps) return false;
  return per_rank >= WARPS;""",
    "stream_sm90": """  const int64_t need = cdiv(M, 8);
  if (MTILES < need || MTILES > 2 * need) return false;
  if (BN - 16 >= N) return false;
  const int64_t chunks = cdiv(K, BK);
  return cdiv(chunks, CK) * (CK - 1) < chunks;""",
    # The ring holds STAGES*RS whole rows: shared memory depends on K (templates/rows_sm90.py).
    "rows_sm90": """  if (M > MROWS || (MROWS == 16 && M <= 8)) return false;
  if (K % 8 != 0 || RS - 8 >= N || COPY > RS * K * 2) return false;
  const int64_t pairs = cdiv(K, 64);
  if (pairs < WARPS || KP != cdiv(pairs, WARPS)) return false;
  const int64_t groups = RS >= 8 ? RS / 8 : 1;
  const int64_t smem = STAGES * RS * K * 2 + 2 * WARPS * groups * 32 * 2 * (MROWS / 8) * 4 + 16 * STAGES;
  return smem <= kSmemPerBlockOptin && OCC * (smem + kSmemReservedPerBlock) <= kSmemPerSm;""",
}
# Families whose fits_<family> reads knobs by name from Entry::args: template arguments are the
# dtype code, then the kernel's order (KernelTemplate.kernel_order: templates/<family>.py).
KNOBS_FROM_ARGS = ("skinny_sm90", "stream_sm90", "rows_sm90", "wgmma_sm90")
RULE_FIELDS = ("BM", "BN", "BK", "SPLIT_K", "CLUSTER_M", "CLUSTER_N", "PERSISTENT")
RULE_DEFAULTS = {"SPLIT_K": 1, "CLUSTER_M": 1, "CLUSTER_N": 1, "PERSISTENT": 1}
