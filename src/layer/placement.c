// Expert placement: the home rank of each expert and optional replicas. The
// single-process layer uses one rank; expert parallelism, FasterMoE shadowing
// and Pro-Prophet placement change this structure, never the routing plan.
#include <string.h>

#include "moe/layer.h"

size_t moe_placement_bytes(int num_experts, int num_ranks) {
  // the allocations of moe_placement_init, below
  return moe_align64((size_t)num_experts * sizeof(int32_t)) +
         moe_align64((size_t)num_experts * (size_t)num_ranks);
}

moe_status moe_placement_init(moe_ctx *ctx, moe_placement *pl, int num_experts, int num_ranks) {
  moe_status st = MOE_STATUS_OK;
  memset(pl, 0, sizeof *pl);
  MOE_FAIL_IF(ctx, num_experts < 1 || num_experts > MOE_MAX_EXPERTS, MOE_STATUS_INVALID_ARG,
              "experts (%d) must be in [1, %d]", num_experts, MOE_MAX_EXPERTS);
  MOE_FAIL_IF(ctx, num_ranks < 1, MOE_STATUS_INVALID_ARG, "ranks (%d) must be >= 1", num_ranks);
  MOE_FAIL_IF(ctx, num_experts % num_ranks != 0, MOE_STATUS_INVALID_ARG,
              "experts (%d) must be divisible by EP ranks (%d)", num_experts, num_ranks);
  pl->home = moe_calloc((size_t)num_experts, sizeof(int32_t));
  pl->replica = moe_calloc((size_t)num_experts * (size_t)num_ranks, 1);
  MOE_FAIL_IF(ctx, !pl->home || !pl->replica, MOE_STATUS_OUT_OF_MEMORY,
              "cannot allocate a placement for %d experts x %d ranks", num_experts, num_ranks);
  pl->num_experts = num_experts;
  pl->num_ranks = num_ranks;
  const int per_rank = num_experts / num_ranks;
  for (int e = 0; e < num_experts; e++) pl->home[e] = e / per_rank;
done:
  if (st != MOE_STATUS_OK) moe_placement_free(pl);
  return st;
}

void moe_placement_free(moe_placement *pl) {
  if (!pl) return;
  moe_free(pl->home);
  moe_free(pl->replica);
  memset(pl, 0, sizeof *pl);
}

moe_status moe_placement_set_replica(moe_ctx *ctx, moe_placement *pl, int expert, int rank,
                                     int on) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, expert < 0 || expert >= pl->num_experts, MOE_STATUS_INVALID_ARG,
              "expert (%d) must be in [0, %d)", expert, pl->num_experts);
  MOE_FAIL_IF(ctx, rank < 0 || rank >= pl->num_ranks, MOE_STATUS_INVALID_ARG,
              "rank (%d) must be in [0, %d)", rank, pl->num_ranks);
  pl->replica[(size_t)expert * (size_t)pl->num_ranks + (size_t)rank] = on ? 1 : 0;
done:
  return st;
}

int moe_placement_target(const moe_placement *pl, int expert, int src_rank) {
  if (pl->replica[(size_t)expert * (size_t)pl->num_ranks + (size_t)src_rank]) return src_rank;
  return pl->home[expert];
}
