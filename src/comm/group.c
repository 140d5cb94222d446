// Process groups with their node topology, the workspace that collectives
// grow on demand, and MPI error translation.
//
// Node ids come from MPI_Comm_split_type(SHARED) or from a ranks-per-node
// override (one host pretending to be several nodes, as the emulated cluster's
// per-rank namespaces need). Every member computes the same dense numbering:
// nodes are ordered by their lowest world rank.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/comm.h"

moe_status moe_mpi_error(moe_ctx *ctx, int mpi_code, const char *what, const char *file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(mpi_code, text, &len) != MPI_SUCCESS) {
    snprintf(text, sizeof text, "MPI error %d", mpi_code);
  }
  return moe_error_at(ctx, MOE_STATUS_COMM, file, line, "%s failed: %s", what, text);
}

// ---- topology ------------------------------------------------------------------------

// Renumbers node keys (any ints, equal for ranks on one node) densely in order
// of first appearance by rank.
static void dense_nodes(const int *key, int n, int *out) {
  int next = 0;
  for (int r = 0; r < n; r++) {
    out[r] = -1;
    for (int q = 0; q < r; q++) {
      if (key[q] == key[r]) {
        out[r] = out[q];
        break;
      }
    }
    if (out[r] < 0) out[r] = next++;
  }
}

moe_status moe_topology_nodes(moe_ctx *ctx, MPI_Comm world, int ranks_per_node, int *out) {
  moe_status st = MOE_STATUS_OK;
  MPI_Comm shared = MPI_COMM_NULL;
  int *keys = NULL;
  int size = 0, rank = 0;
  MOE_MPI_TRY(ctx, MPI_Comm_size(world, &size));
  MOE_MPI_TRY(ctx, MPI_Comm_rank(world, &rank));
  int rpn = ranks_per_node;
  const char *env = getenv("MOE_RANKS_PER_NODE");
  if (rpn == 0 && env && *env) {
    char *end = NULL;
    const long v = strtol(env, &end, 10);
    MOE_FAIL_IF(ctx, end == env || *end != '\0' || v < 1 || v > size, MOE_STATUS_INVALID_ARG,
                "MOE_RANKS_PER_NODE ('%s') must be an integer in [1, %d]", env, size);
    rpn = (int)v;
  }
  MOE_FAIL_IF(ctx, rpn < 0, MOE_STATUS_INVALID_ARG, "ranks per node (%d) must be >= 0", rpn);
  if (rpn > 0) {
    MOE_FAIL_IF(ctx, size % rpn != 0, MOE_STATUS_INVALID_ARG,
                "ranks per node (%d) must divide the number of ranks (%d)", rpn, size);
    for (int r = 0; r < size; r++) out[r] = r / rpn;
    goto done;
  }
  // Key of a node = lowest world rank on it, agreed within the shared communicator.
  MOE_MPI_TRY(ctx, MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared));
  int key = rank;
  MOE_MPI_TRY(ctx, MPI_Allreduce(MPI_IN_PLACE, &key, 1, MPI_INT, MPI_MIN, shared));
  keys = moe_malloc((size_t)size * sizeof(int));
  MOE_FAIL_IF(ctx, !keys, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate %d node keys", size);
  MOE_MPI_TRY(ctx, MPI_Allgather(&key, 1, MPI_INT, keys, 1, MPI_INT, world));
  dense_nodes(keys, size, out);
done:
  if (shared != MPI_COMM_NULL) MPI_Comm_free(&shared);
  moe_free(keys);
  return st;
}

// ---- groups --------------------------------------------------------------------------------

moe_status moe_group_init(moe_ctx *ctx, moe_group *g, MPI_Comm comm, const int *world_node_of) {
  moe_status st = MOE_STATUS_OK;
  int *world_rank_of = NULL, *key = NULL;
  memset(g, 0, sizeof *g);
  g->comm = g->intra = g->inter = MPI_COMM_NULL;
  MOE_MPI_TRY(ctx, MPI_Comm_dup(comm, &g->comm));
  MOE_MPI_TRY(ctx, MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN));
  MOE_MPI_TRY(ctx, MPI_Comm_rank(g->comm, &g->rank));
  MOE_MPI_TRY(ctx, MPI_Comm_size(g->comm, &g->size));
  const int P = g->size;
  world_rank_of = moe_malloc((size_t)P * sizeof(int));
  key = moe_malloc((size_t)P * sizeof(int));
  g->node_of = moe_malloc((size_t)P * sizeof(int));
  g->local_rank_of = moe_malloc((size_t)P * sizeof(int));
  g->node_size = moe_calloc((size_t)P, sizeof(int));
  MOE_FAIL_IF(ctx, !world_rank_of || !key || !g->node_of || !g->local_rank_of || !g->node_size,
              MOE_STATUS_OUT_OF_MEMORY, "cannot allocate a group of %d members", P);
  int my_world = 0;
  MOE_MPI_TRY(ctx, MPI_Comm_rank(MPI_COMM_WORLD, &my_world));
  MOE_MPI_TRY(ctx, MPI_Allgather(&my_world, 1, MPI_INT, world_rank_of, 1, MPI_INT, g->comm));
  for (int r = 0; r < P; r++) key[r] = world_node_of[world_rank_of[r]];
  dense_nodes(key, P, g->node_of);
  for (int r = 0; r < P; r++) {
    const int n = g->node_of[r];
    g->local_rank_of[r] = g->node_size[n]++;
    if (n + 1 > g->num_nodes) g->num_nodes = n + 1;
  }
  g->node = g->node_of[g->rank];
  g->local_rank = g->local_rank_of[g->rank];
  g->local_size = g->node_size[g->node];
  const int G = g->node_size[0];
  g->uniform = P % G == 0;
  for (int r = 0; r < P && g->uniform; r++) {
    g->uniform = g->node_of[r] == r / G && g->local_rank_of[r] == r % G;
  }
  MOE_MPI_TRY(ctx, MPI_Comm_split(g->comm, g->node, g->rank, &g->intra));
  MOE_MPI_TRY(ctx, MPI_Comm_split(g->comm, g->local_rank, g->node, &g->inter));
  MOE_MPI_TRY(ctx, MPI_Comm_set_errhandler(g->intra, MPI_ERRORS_RETURN));
  MOE_MPI_TRY(ctx, MPI_Comm_set_errhandler(g->inter, MPI_ERRORS_RETURN));
done:
  moe_free(world_rank_of);
  moe_free(key);
  if (st != MOE_STATUS_OK) moe_group_free(g);
  return st;
}

void moe_group_free(moe_group *g) {
  if (!g) return;
  if (g->intra != MPI_COMM_NULL && g->intra != 0) MPI_Comm_free(&g->intra);
  if (g->inter != MPI_COMM_NULL && g->inter != 0) MPI_Comm_free(&g->inter);
  if (g->comm != MPI_COMM_NULL && g->comm != 0) MPI_Comm_free(&g->comm);
  moe_free(g->node_of);
  moe_free(g->local_rank_of);
  moe_free(g->node_size);
  memset(g, 0, sizeof *g);
  g->comm = g->intra = g->inter = MPI_COMM_NULL;
}

// ---- workspace -------------------------------------------------------------------------------

moe_status moe_workspace_reserve(moe_ctx *ctx, moe_workspace *ws, size_t bytes) {
  moe_status st = MOE_STATUS_OK;
  if (bytes <= ws->capacity) goto done;
  moe_free(ws->buf);
  ws->buf = moe_malloc(bytes);
  ws->capacity = ws->buf ? bytes : 0;
  MOE_FAIL_IF(ctx, !ws->buf, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate %zu bytes of workspace",
              bytes);
done:
  return st;
}

moe_status moe_workspace_reserve_keep(moe_ctx *ctx, moe_workspace *ws, size_t bytes, size_t keep) {
  moe_status st = MOE_STATUS_OK;
  if (bytes <= ws->capacity) goto done;
  void *old = ws->buf;
  ws->buf = NULL;
  ws->capacity = 0;
  st = moe_workspace_reserve(ctx, ws, bytes);
  if (st == MOE_STATUS_OK && keep > 0) memcpy(ws->buf, old, keep < bytes ? keep : bytes);
  moe_free(old);
done:
  return st;
}

void moe_workspace_free(moe_workspace *ws) {
  if (!ws) return;
  moe_free(ws->buf);
  ws->buf = NULL;
  ws->capacity = 0;
}
