// The registry of all-to-all algorithms: the catalogue (one line per algorithm,
// below), lookup by name, and the checked entry points every caller uses. A new
// algorithm is one file (src/comm/alltoall_<name>.c defining
// `const moe_a2a_algo moe_a2a_<name>`) plus one X(<name>) line in
// MOE_A2A_CATALOG. The catalogue part compiles in every build; the entry
// points that run an exchange only with MPI.
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm_internal.h"

// The catalogue, in this order (moe_a2a_list, `--a2a all`, error messages).
#define MOE_A2A_CATALOG(X) \
  X(mpi)                   \
  X(pairwise)              \
  X(1dh)                   \
  X(2dh)                   \
  X(pipe)                  \
  X(grouped)

#define MOE_A2A_DECLARE(name) extern const moe_a2a_algo moe_a2a_##name;
#define MOE_A2A_REF(name) &moe_a2a_##name,
MOE_A2A_CATALOG(MOE_A2A_DECLARE)
static const moe_a2a_algo *const k_algos[] = {MOE_A2A_CATALOG(MOE_A2A_REF)};
#define N_ALGOS ((int)(sizeof k_algos / sizeof k_algos[0]))

void moe_a2a_names(char *buf, size_t len, int any_layout) {
  size_t used = 0;
  if (len == 0) return;
  buf[0] = '\0';
  for (int i = 0; i < N_ALGOS; i++) {
    if (any_layout && k_algos[i]->needs_uniform_nodes) continue;
    const int w = snprintf(buf + used, len - used, "%s%s", used ? ", " : "", k_algos[i]->name);
    if (w < 0 || (size_t)w >= len - used) break;
    used += (size_t)w;
  }
}

const moe_a2a_algo *const *moe_a2a_list(int *count) {
  if (count) *count = N_ALGOS;
  return k_algos;
}

moe_status moe_a2a_find(moe_ctx *ctx, const char *name, const moe_a2a_algo **out) {
  moe_status st = MOE_STATUS_OK;
  for (int i = 0; i < N_ALGOS; i++) {
    if (name && strcmp(name, k_algos[i]->name) == 0) {
      *out = k_algos[i];
      goto done;
    }
  }
  char names[256];
  moe_a2a_names(names, sizeof names, 0);
  MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG, "all-to-all algorithm '%s' is unknown (valid: %s)",
           name ? name : "(null)", names);
done:
  return st;
}

#if MOE_HAVE_MPI
moe_alltoallv_fn moe_alltoallv_mpi_fn(void) { return moe_alltoallv_mpi; }

moe_status moe_a2a_check_topology(moe_ctx *ctx, const moe_a2a_algo *algo, const moe_group *g) {
  moe_status st = MOE_STATUS_OK;
  if (algo->needs_uniform_nodes && !g->uniform) {
    char names[256];
    moe_a2a_names(names, sizeof names, 1);
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
             "all-to-all '%s' needs the same number of ranks on every node, node-contiguous "
             "(this group of %d ranks spans %d nodes unevenly); use %s",
             algo->name, g->size, g->num_nodes, names);
  }
done:
  return st;
}

void moe_a2a_copy_self(const moe_group *g, const void *send, const size_t *send_counts,
                       const size_t *send_displs, void *recv, const size_t *recv_displs) {
  const size_t n = send_counts[g->rank];
  if (n > 0) {
    memcpy((char *)recv + recv_displs[g->rank], (const char *)send + send_displs[g->rank], n);
  }
}

// The checks shared by moe_a2a_run and moe_a2a_start.
static moe_status check_args(moe_ctx *ctx, const moe_a2a_algo *algo, const moe_group *g,
                             const void *send, const size_t *send_counts, const size_t *send_displs,
                             void *recv, const size_t *recv_counts, const size_t *recv_displs) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !algo || !g, MOE_STATUS_INVALID_ARG, "algorithm and group must not be NULL");
  MOE_TRY(moe_a2a_check_topology(ctx, algo, g));
  // Only MPI_Alltoallv takes int displacements; every algorithm passes block
  // sizes to MPI as ints. Empty blocks are never touched.
  const int int_displs = algo->run == moe_alltoallv_mpi;
  size_t send_total = 0, recv_total = 0;
  for (int r = 0; r < g->size; r++) {
    MOE_FAIL_IF(ctx,
                send_counts[r] > INT_MAX || recv_counts[r] > INT_MAX ||
                    (int_displs && ((send_counts[r] && send_displs[r] > INT_MAX) ||
                                    (recv_counts[r] && recv_displs[r] > INT_MAX))),
                MOE_STATUS_INVALID_ARG,
                "all-to-all block for rank %d exceeds MPI's int counts (%d bytes)", r, INT_MAX);
    send_total += send_counts[r];
    recv_total += recv_counts[r];
  }
  MOE_FAIL_IF(ctx, (send_total > 0 && !send) || (recv_total > 0 && !recv), MOE_STATUS_INVALID_ARG,
              "all-to-all buffers must not be NULL when counts are non-zero");
done:
  return st;
}

moe_status moe_a2a_run(moe_ctx *ctx, const moe_a2a_algo *algo, const moe_group *g, const void *send,
                       const size_t *send_counts, const size_t *send_displs, void *recv,
                       const size_t *recv_counts, const size_t *recv_displs, moe_workspace *ws) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(check_args(ctx, algo, g, send, send_counts, send_displs, recv, recv_counts, recv_displs));
  const int watch = moe_watchdog_op_begin("all-to-all", algo->name);
  st = algo->run(ctx, g, send, send_counts, send_displs, recv, recv_counts, recv_displs, ws);
  moe_watchdog_op_end(watch);
done:
  return st;
}

moe_status moe_a2a_start(moe_ctx *ctx, const moe_a2a_algo *algo, const moe_group *g,
                         const void *send, const size_t *send_counts, const size_t *send_displs,
                         void *recv, const size_t *recv_counts, const size_t *recv_displs,
                         moe_workspace *ws, moe_a2a_pending *pending) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !pending, MOE_STATUS_INVALID_ARG, "pending must not be NULL");
  MOE_FAIL_IF(ctx, pending->active, MOE_STATUS_INVALID_ARG,
              "an all-to-all is still in flight on this handle: complete it (moe_a2a_wait) "
              "before starting another");
  MOE_TRY(check_args(ctx, algo, g, send, send_counts, send_displs, recv, recv_counts, recv_displs));
  // The watchdog sees the exchange from its start until test or wait completes it.
  const int watch = moe_watchdog_op_begin("all-to-all", algo->name);
  if (algo->start) {
    st = algo->start(ctx, g, send, send_counts, send_displs, recv, recv_counts, recv_displs, ws,
                     pending);
  } else {
    st = algo->run(ctx, g, send, send_counts, send_displs, recv, recv_counts, recv_displs, ws);
  }
  if (st == MOE_STATUS_OK && pending->active) {
    pending->watch = watch;
  } else {
    moe_watchdog_op_end(watch);
  }
done:
  return st;
}

moe_status moe_a2a_test(moe_ctx *ctx, moe_a2a_pending *pending, int *done) {
  moe_status st = MOE_STATUS_OK;
  int flag = 1;
  if (pending->active) {
    MOE_MPI_TRY(ctx, MPI_Test(&pending->req, &flag, MPI_STATUS_IGNORE));
    if (flag) {
      pending->active = 0;
      moe_watchdog_op_end(pending->watch);
      pending->watch = 0;
    }
  }
  *done = flag;
done:
  return st;
}

moe_status moe_a2a_wait(moe_ctx *ctx, moe_a2a_pending *pending) {
  moe_status st = MOE_STATUS_OK;
  if (pending->active) {
    const int rc = MPI_Wait(&pending->req, MPI_STATUS_IGNORE);
    moe_watchdog_op_end(pending->watch);
    pending->watch = 0;
    if (rc != MPI_SUCCESS) {
      st = moe_mpi_error(ctx, rc, "MPI_Wait (all-to-all)", __FILE__, __LINE__);
      goto done;
    }
    pending->active = 0;
  }
done:
  return st;
}

int moe_a2a_int_layout(const uint64_t *count, int n, int *c, int *d, size_t *total) {
  int ok = 1;
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    ok &= count[i] <= INT_MAX && off <= INT_MAX;
    c[i] = ok ? (int)count[i] : 0;
    d[i] = ok ? (int)off : 0;
    off += count[i];
  }
  *total = off;
  return ok;
}

int moe_a2a_packed_in_order(const size_t *counts, const size_t *displs, int P, size_t *base) {
  int seen = 0;
  size_t pos = 0;
  *base = 0;
  for (int r = 0; r < P; r++) {
    if (counts[r] == 0) continue;
    if (!seen) *base = pos = displs[r];
    seen = 1;
    if (displs[r] != pos) return 0;
    pos += counts[r];
  }
  return 1;
}
#endif  // MOE_HAVE_MPI
