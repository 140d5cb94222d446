// The routing plan: for every (token, choice) its expert, slot and weight, and
// the per-expert row layout that dispatch, experts and combine share.
//
// Slot assignment follows GShard: all first choices are placed before any
// second choice, and within a choice tokens are placed in order; a choice whose
// expert already holds C rows is dropped. This order is deterministic and does
// not depend on how tokens are later split into chunks or ranks.
#include <string.h>

#include "moe/layer.h"

moe_status moe_route_init(moe_ctx *ctx, moe_route *route, int max_tokens, int top_k,
                          int num_experts, int max_rows) {
  moe_status st = MOE_STATUS_OK;
  memset(route, 0, sizeof *route);
  MOE_FAIL_IF(ctx, max_tokens < 0 || top_k < 1 || num_experts < 1 || max_rows < 0,
              MOE_STATUS_INVALID_ARG,
              "route sizes must be tokens >= 0 (%d), top_k >= 1 (%d), experts >= 1 (%d), "
              "rows >= 0 (%d)",
              max_tokens, top_k, num_experts, max_rows);
  const size_t tk = (size_t)max_tokens * (size_t)top_k + 1;  // +1: never a 0-byte request
  route->expert = moe_malloc(tk * sizeof(int32_t));
  route->slot = moe_malloc(tk * sizeof(int32_t));
  route->weight = moe_malloc(tk * sizeof(float));
  route->count = moe_calloc((size_t)num_experts, sizeof(int32_t));
  route->count_all = moe_calloc((size_t)num_experts, sizeof(int32_t));
  route->offset = moe_calloc((size_t)num_experts + 1, sizeof(int32_t));
  route->row_token = moe_malloc(((size_t)max_rows + 1) * sizeof(int32_t));
  route->row_choice = moe_malloc(((size_t)max_rows + 1) * sizeof(int32_t));
  MOE_FAIL_IF(ctx,
              !route->expert || !route->slot || !route->weight || !route->count ||
                  !route->count_all || !route->offset || !route->row_token || !route->row_choice,
              MOE_STATUS_OUT_OF_MEMORY, "cannot allocate a routing plan for %d tokens x %d",
              max_tokens, top_k);
  route->max_tokens = max_tokens;
  route->max_rows = max_rows;
  route->top_k = top_k;
  route->num_experts = num_experts;
  route->capacity = -1;
done:
  if (st != MOE_STATUS_OK) moe_route_free(route);
  return st;
}

void moe_route_free(moe_route *route) {
  if (!route) return;
  moe_free(route->expert);
  moe_free(route->slot);
  moe_free(route->weight);
  moe_free(route->count);
  moe_free(route->count_all);
  moe_free(route->offset);
  moe_free(route->row_token);
  moe_free(route->row_choice);
  memset(route, 0, sizeof *route);
}

moe_status moe_route_assign(moe_ctx *ctx, moe_route *route, int tokens, int capacity) {
  moe_status st = MOE_STATUS_OK;
  const int K = route->top_k, E = route->num_experts;
  MOE_FAIL_IF(ctx, tokens < 0 || tokens > route->max_tokens, MOE_STATUS_INVALID_ARG,
              "tokens (%d) must be in [0, %d]", tokens, route->max_tokens);
  memset(route->count, 0, (size_t)E * sizeof(int32_t));
  memset(route->count_all, 0, (size_t)E * sizeof(int32_t));
  route->dropped = 0;
  // step 1: slots in GShard order (choice-major, then token order)
  for (int k = 0; k < K; k++) {
    for (int t = 0; t < tokens; t++) {
      const int e = route->expert[t * K + k];
      MOE_FAIL_IF(ctx, e < 0 || e >= E, MOE_STATUS_INTERNAL,
                  "routing chose expert %d for token %d (valid [0, %d))", e, t, E);
      route->count_all[e]++;
      if (capacity < 0 || route->count[e] < capacity) {
        route->slot[t * K + k] = route->count[e]++;
      } else {
        route->slot[t * K + k] = -1;
        route->dropped++;
      }
    }
  }
  // step 1b: the kept choices' rows in token order within each expert (which
  // choices are kept is decided above, in GShard's priority order). A sum over
  // an expert's rows (its weight gradients) then runs in token order: on EP
  // ranks that receive the rows source rank by source rank, the same order as
  // the single-process layer's (docs/reliability.md).
  memset(route->count, 0, (size_t)E * sizeof(int32_t));
  for (int t = 0; t < tokens; t++) {
    for (int k = 0; k < K; k++) {
      if (route->slot[t * K + k] >= 0)
        route->slot[t * K + k] = route->count[route->expert[t * K + k]]++;
    }
  }
  // step 2: expert-ordered row layout
  route->offset[0] = 0;
  for (int e = 0; e < E; e++) route->offset[e + 1] = route->offset[e] + route->count[e];
  route->rows = route->offset[E];
  MOE_FAIL_IF(ctx, route->rows > route->max_rows, MOE_STATUS_INTERNAL,
              "routing produced %d rows, buffers hold %d", route->rows, route->max_rows);
  for (int t = 0; t < tokens; t++) {
    for (int k = 0; k < K; k++) {
      const int s = route->slot[t * K + k];
      if (s < 0) continue;
      const int row = route->offset[route->expert[t * K + k]] + s;
      route->row_token[row] = t;
      route->row_choice[row] = k;
    }
  }
  route->tokens = tokens;
  route->capacity = capacity;
done:
  return st;
}

void moe_route_count_by_rank(const moe_route *route, const moe_placement *pl, int src_rank,
                             int32_t *counts) {
  const int E = route->num_experts;
  memset(counts, 0, (size_t)pl->num_ranks * (size_t)E * sizeof(int32_t));
  for (int e = 0; e < E; e++) {
    const int p = moe_placement_target(pl, e, src_rank);
    counts[(size_t)p * (size_t)E + (size_t)e] += route->count[e];
  }
}
