// Process groups with their node topology, the workspace that collectives
// grow on demand, and MPI error translation.
//
// Node ids come from MPI_Comm_split_type(SHARED) or from a ranks-per-node
// override (one host pretending to be several nodes, as the emulated cluster's
// per-rank namespaces need). Every member computes the same dense numbering:
// nodes are ordered by their lowest world rank.
#include "moe_build_config.h"

#if MOE_HAVE_MPI
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

moe_status moe_topology_nodes(moe_ctx *ctx, MPI_Comm comm, int ranks_per_node, int *out) {
  moe_status st = MOE_STATUS_OK;
  MPI_Comm shared = MPI_COMM_NULL;
  int *keys = NULL;
  int size = 0, rank = 0;
  const int watch = moe_watchdog_op_begin("node topology", NULL);
  MOE_MPI_TRY(ctx, MPI_Comm_size(comm, &size));
  MOE_MPI_TRY(ctx, MPI_Comm_rank(comm, &rank));
  // step 1: this rank's choice, checked locally
  moe_status local = MOE_STATUS_OK;
  int rpn = ranks_per_node;
  const char *env = getenv("MOE_RANKS_PER_NODE");
  if (rpn == 0 && env && *env) {
    char *end = NULL;
    const long v = strtol(env, &end, 10);
    if (end == env || *end != '\0' || v < 1 || v > size) {
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "MOE_RANKS_PER_NODE ('%s') must be an integer in [1, %d]", env, size);
    }
    rpn = local == MOE_STATUS_OK ? (int)v : 0;
  }
  if (local == MOE_STATUS_OK && rpn < 0) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                         "ranks per node (%d) must be >= 0", rpn);
  } else if (local == MOE_STATUS_OK && rpn > 0 && size % rpn != 0) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                         "ranks per node (%d) must divide the number of ranks (%d)", rpn, size);
  }
  // step 2: every rank must have succeeded and chosen the same value, or all
  // fail (a rank that skipped the collectives below would hang the others)
  int v[3] = {local != MOE_STATUS_OK, rpn, -rpn};
  MOE_MPI_TRY(ctx, MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_INT, MPI_MAX, comm));
  if (local != MOE_STATUS_OK) {
    st = local;
    goto done;
  }
  MOE_FAIL_IF(ctx, v[0], MOE_STATUS_INVALID_ARG,
              "the ranks-per-node setting is invalid on another rank (see its error)");
  MOE_FAIL_IF(ctx, v[1] != -v[2], MOE_STATUS_INVALID_ARG,
              "ranks per node differs between ranks (%d to %d): set --ranks-per-node or "
              "MOE_RANKS_PER_NODE the same everywhere",
              -v[2], v[1]);
  if (rpn > 0) {
    for (int r = 0; r < size; r++) out[r] = r / rpn;
    goto done;
  }
  // step 3: key of a node = lowest rank on it, agreed within the shared communicator
  MOE_MPI_TRY(ctx, MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared));
  int key = rank;
  MOE_MPI_TRY(ctx, MPI_Allreduce(MPI_IN_PLACE, &key, 1, MPI_INT, MPI_MIN, shared));
  keys = moe_malloc((size_t)size * sizeof(int));
  const int have = keys != NULL;
  int all_have = 0;
  MOE_MPI_TRY(ctx, MPI_Allreduce(&have, &all_have, 1, MPI_INT, MPI_MIN, comm));
  MOE_FAIL_IF(ctx, !all_have, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate %d node keys", size);
  MOE_MPI_TRY(ctx, MPI_Allgather(&key, 1, MPI_INT, keys, 1, MPI_INT, comm));
  dense_nodes(keys, size, out);
done:
  moe_watchdog_op_end(watch);
  if (shared != MPI_COMM_NULL) MPI_Comm_free(&shared);
  moe_free(keys);
  return st;
}

// ---- groups --------------------------------------------------------------------------------

moe_status moe_group_init(moe_ctx *ctx, moe_group *g, MPI_Comm comm, int my_node) {
  moe_status st = MOE_STATUS_OK;
  int *key = NULL;
  const int watch = moe_watchdog_op_begin("process group setup", NULL);
  memset(g, 0, sizeof *g);
  g->comm = g->intra = g->inter = MPI_COMM_NULL;
  MOE_MPI_TRY(ctx, MPI_Comm_dup(comm, &g->comm));
  MOE_MPI_TRY(ctx, MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN));
  MOE_MPI_TRY(ctx, MPI_Comm_rank(g->comm, &g->rank));
  MOE_MPI_TRY(ctx, MPI_Comm_size(g->comm, &g->size));
  const int P = g->size;
  key = moe_malloc((size_t)P * sizeof(int));
  g->node_of = moe_malloc((size_t)P * sizeof(int));
  g->local_rank_of = moe_malloc((size_t)P * sizeof(int));
  g->node_size = moe_calloc((size_t)P, sizeof(int));
  // Agree on the allocations before the next collective: a rank that left now
  // would leave the others waiting.
  const int have = key && g->node_of && g->local_rank_of && g->node_size;
  int all_have = 0;
  MOE_MPI_TRY(ctx, MPI_Allreduce(&have, &all_have, 1, MPI_INT, MPI_MIN, g->comm));
  MOE_FAIL_IF(ctx, !all_have, MOE_STATUS_OUT_OF_MEMORY,
              "cannot allocate a group of %d members (on this or another rank)", P);
  MOE_MPI_TRY(ctx, MPI_Allgather(&my_node, 1, MPI_INT, key, 1, MPI_INT, g->comm));
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
  moe_watchdog_op_end(watch);
  moe_free(key);
  if (st != MOE_STATUS_OK) moe_group_free(g);
  return st;
}

moe_status moe_group_init_topology(moe_ctx *ctx, moe_group *g, MPI_Comm comm, int ranks_per_node) {
  moe_status st = MOE_STATUS_OK;
  int size = 0, rank = 0;
  int *nodes = NULL;
  MOE_MPI_TRY(ctx, MPI_Comm_size(comm, &size));
  MOE_MPI_TRY(ctx, MPI_Comm_rank(comm, &rank));
  nodes = moe_malloc((size_t)size * sizeof(int));
  {
    // every rank must take part in the collectives below, or none
    int ok = nodes != NULL;
    MOE_MPI_TRY(ctx, MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm));
    MOE_FAIL_IF(ctx, !ok, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate %d node ids", size);
  }
  MOE_TRY(moe_topology_nodes(ctx, comm, ranks_per_node, nodes));
  MOE_TRY(moe_group_init(ctx, g, comm, nodes[rank]));
done:
  moe_free(nodes);
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
  if (ws->buf) {  // the old block's pages back to the system (moe_heap_trim)
    moe_free(ws->buf);
    moe_heap_trim();
  }
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
  if (old) {
    moe_free(old);
    moe_heap_trim();
  }
done:
  return st;
}

void moe_workspace_free(moe_workspace *ws) {
  if (!ws) return;
  moe_free(ws->buf);
  ws->buf = NULL;
  ws->capacity = 0;
}

// Every rank contributes its local status; returns OK only if all are OK. On
// failure every rank returns INVALID_ARG (or its own code) with a message: its
// own, or the first failing rank's number.
moe_status moe_comm_agree(moe_ctx *ctx, MPI_Comm comm, moe_status local, const char *what) {
  moe_status st = MOE_STATUS_OK;
  int mine = local == MOE_STATUS_OK ? INT32_MAX : 0, rank = 0, first = INT32_MAX;
  MPI_Comm_rank(comm, &rank);
  if (local != MOE_STATUS_OK) mine = rank;
  // `what` names the agreement for the hang watchdog (callers pass literals)
  const int watch = moe_watchdog_op_begin("agreement", what);
  const int rc = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  moe_watchdog_op_end(watch);
  MOE_MPI_TRY(ctx, rc);
  if (local != MOE_STATUS_OK) {
    st = local;  // the message is already in ctx
  } else if (first != INT32_MAX) {
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG, "%s failed on rank %d (see that rank's error)", what,
             first);
  }
done:
  return st;
}
#else
// Without MPI this file has nothing to compile (ISO C wants a declaration).
typedef int moe_comm_group_needs_mpi;
#endif  // MOE_HAVE_MPI
