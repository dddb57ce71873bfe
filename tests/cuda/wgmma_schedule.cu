// Host build of wgmma_sm90's work scheduler (the kernel's own WorkList):
// prints every unit each cluster takes and, for each stream-K tile, where its reducer reads
// each piece, so tests/test_wgmma_schedule.py can check coverage and slot agreement on a CPU.
//   wgmma_schedule MODE TILES K_ITERS CLUSTERS
//   MODE: streamk | persistent_split4 | oneshot_pingpong
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "../../kernel_templates/wgmma_sm90.cuh"

using namespace tunefw::wgmma_sm90_detail;

template <int PERSISTENT, int PER_CLUSTER, int SPLIT_K, int STREAM_K>
static void dump(int tiles, int k_iters, int clusters) {
  for (int c = 0; c < clusters; ++c) {
    WorkList<PERSISTENT, PER_CLUSTER, SPLIT_K, STREAM_K> work(c, clusters, tiles, k_iters);
    std::printf("count %d %d\n", c, work.count);
    Unit u;
    while (work.next(u)) std::printf("unit %d %d %d %d %d\n", c, u.t, u.kb0, u.kb1, u.piece);
  }
  if (!STREAM_K) return;
  WorkList<PERSISTENT, PER_CLUSTER, SPLIT_K, STREAM_K> any(0, clusters, tiles, k_iters);
  for (int t = 0; t < any.sk_tiles; ++t) {  // the reducer's view, as in the kernel's epilogue
    int c_lo;
    const int pieces = any.pieces_of(t, c_lo);
    for (int c = c_lo; c < c_lo + pieces; ++c) std::printf("read %d %d %d\n", t, c, any.slot_of(c, t));
  }
}

int main(int argc, char** argv) {
  if (argc != 5) return 2;
  const int tiles = std::atoi(argv[2]), k_iters = std::atoi(argv[3]), clusters = std::atoi(argv[4]);
  if (!std::strcmp(argv[1], "streamk"))
    dump<1, 1, 1, 1>(tiles, k_iters, clusters);
  else if (!std::strcmp(argv[1], "persistent_split4"))
    dump<1, 1, 4, 0>(tiles, k_iters, clusters);
  else if (!std::strcmp(argv[1], "oneshot_pingpong"))
    dump<0, 2, 1, 0>(tiles, k_iters, clusters);
  else
    return 2;
  return 0;
}
