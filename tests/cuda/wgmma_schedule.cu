// Host build of wgmma_sm90's work scheduler (the kernel's own WorkList and tile raster): prints
// every unit each CTA (by its rank in the cluster) of each cluster takes, so tests/test_wgmma_schedule.py can check on a CPU
// that every k-block of every tile is done exactly once.
//   wgmma_schedule MODE M_TILES N_TILES K_ITERS CLUSTERS
//   MODE: persistent_split4_2x1 | persistent_1x2_rn | oneshot_pingpong
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "../../kernel_templates/wgmma_sm90.cuh"

using namespace tunefw::wgmma_sm90_detail;

template <int PERSISTENT, int PER_CLUSTER, int SPLIT_K, int CM, int CN, int RASTER, int GROUP>
static void dump(int num_m, int num_n, int k_iters, int clusters) {
  const int cm_tiles = (num_m + CM - 1) / CM, cn_tiles = (num_n + CN - 1) / CN;
  for (int c = 0; c < clusters; ++c) {
    WorkList<PERSISTENT, PER_CLUSTER, SPLIT_K> work(c, clusters, cm_tiles * cn_tiles, k_iters);
    std::printf("count %d %d\n", c, work.count);
    Unit u;
    while (work.next(u))
      for (int rx = 0; rx < CM; ++rx)
        for (int ry = 0; ry < CN; ++ry) {
          int tm, tn;
          cluster_tile<CM, CN, RASTER, GROUP>(u.t, cm_tiles, cn_tiles, rx, ry, tm, tn);
          std::printf("unit %d %d %d %d %d %d %d\n", c, rx + ry * CM, tm, tn, u.kb0, u.kb1,
                      u.split);
        }
  }
}

int main(int argc, char** argv) {
  if (argc != 6) return 2;
  const int m = std::atoi(argv[2]), n = std::atoi(argv[3]), k = std::atoi(argv[4]);
  const int clusters = std::atoi(argv[5]);
  if (!std::strcmp(argv[1], "persistent_split4_2x1"))
    dump<1, 1, 4, 2, 1, 0, 8>(m, n, k, clusters);
  else if (!std::strcmp(argv[1], "persistent_1x2_rn"))
    dump<1, 1, 1, 1, 2, 1, 3>(m, n, k, clusters);
  else if (!std::strcmp(argv[1], "oneshot_pingpong"))
    dump<0, 2, 2, 1, 1, 0, 1>(m, n, k, clusters);
  else
    return 2;
  return 0;
}
