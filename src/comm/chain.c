// Fixed-order chains over ranks (moe_chain_run in comm.h, moe_chain in
// kernels.h): the deterministic mode's sums that are split over ranks along
// the chain itself (tensor parallelism's partial products, Parm's expert rows
// split over MP), continued rank after rank instead of reduced, so that the
// bits are those of one rank's whole chain.
#include "moe_build_config.h"

#if MOE_HAVE_MPI
#include <limits.h>
#include <mpi.h>
#include <string.h>

#include "moe/comm.h"
#include "moe/core.h"
#include "moe/kernels.h"

// The hops' point-to-point messages (the final broadcasts are collectives).
#define CHAIN_TAG 43

static moe_status check(moe_ctx *ctx, const moe_chain *ch, int size) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !ch || ch->blocks < 0 || ch->segs < 0, MOE_STATUS_INVALID_ARG,
              "fixed-order chain: needs a description with blocks and segments >= 0");
  if (ch->blocks == 0 || ch->segs == 0) return st;
  MOE_FAIL_IF(ctx, !ch->owner || !ch->compute || !ch->spans, MOE_STATUS_INVALID_ARG,
              "fixed-order chain: owner, compute and spans must not be NULL");
  for (int s = 0; s < ch->segs; s++) {
    const int o = ch->owner(ch->user, s);
    MOE_FAIL_IF(ctx, o < 0 || o >= size, MOE_STATUS_INVALID_ARG,
                "fixed-order chain: segment %d's owner (%d) must be in [0, %d)", s, o, size);
  }
done:
  return st;
}

// Block b's ranges; INVALID_ARG for a count or size out of range.
static moe_status spans_of(moe_ctx *ctx, const moe_chain *ch, int b, float **p, size_t *n, int *k) {
  moe_status st = MOE_STATUS_OK;
  *k = ch->spans(ch->user, b, p, n);
  MOE_FAIL_IF(ctx, *k < 0 || *k > MOE_CHAIN_SPANS, MOE_STATUS_INVALID_ARG,
              "fixed-order chain: block %d has %d ranges (at most %d)", b, *k, MOE_CHAIN_SPANS);
  for (int i = 0; i < *k; i++)
    MOE_FAIL_IF(ctx, n[i] > (size_t)INT_MAX, MOE_STATUS_INVALID_ARG,
                "fixed-order chain: block %d's range %d has %zu floats (at most %d)", b, i, n[i],
                INT_MAX);
done:
  return st;
}

void moe_chain_state_free(moe_chain_state *cs) {
  if (!cs) return;
  moe_free(cs->req);
  moe_free(cs->sts);
  memset(cs, 0, sizeof *cs);
}

// cs holds at least n requests; grown with an agreement (every rank grows at
// the same call: they pass the same blocks).
static moe_status reserve(moe_ctx *ctx, MPI_Comm comm, moe_chain_state *cs, size_t n,
                          const char *what) {
  moe_status st = MOE_STATUS_OK, mine = MOE_STATUS_OK;
  if (cs->cap >= n) return st;
  moe_chain_state_free(cs);
  cs->req = moe_malloc(n * sizeof *cs->req);
  cs->sts = moe_malloc(n * sizeof *cs->sts);
  if (cs->req && cs->sts) {
    cs->cap = n;
  } else {
    moe_chain_state_free(cs);
    mine = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                        "%s (fixed-order chain): out of memory (%zu requests)", what, n);
  }
  MOE_TRY(moe_comm_agree(ctx, comm, mine, what));
done:
  return st;
}

moe_status moe_chain_run(moe_ctx *ctx, MPI_Comm comm, const moe_chain *ch, moe_chain_state *cs,
                         const char *what) {
  moe_status st = MOE_STATUS_OK;
  int me = 0, size = 1;
  moe_chain_state own = {NULL, NULL, 0};
  if (!cs) cs = &own;
  MOE_MPI_TRY(ctx, MPI_Comm_rank(comm, &me));
  MOE_MPI_TRY(ctx, MPI_Comm_size(comm, &size));
  MOE_TRY(check(ctx, ch, size));
  if (ch->blocks == 0 || ch->segs == 0) return st;
  const int B = ch->blocks, S = ch->segs, root = ch->owner(ch->user, S - 1);
  const size_t nreq = (size_t)B * MOE_CHAIN_SPANS;
  MOE_TRY(reserve(ctx, comm, cs, nreq, what));
  MPI_Request *req = cs->req;
  MPI_Status *sts = cs->sts;
  for (size_t i = 0; i < nreq; i++) req[i] = MPI_REQUEST_NULL;
  float *p[MOE_CHAIN_SPANS];
  size_t n[MOE_CHAIN_SPANS];
  int k = 0;
  // the wavefront: step t holds (b, s) with b + s = t; a rank takes its own in
  // order of s, so every receive's sender reached it one step earlier, and the
  // messages between two ranks go and are taken in the same order
  for (int t = 0; t <= B + S - 2; t++) {
    for (int s = 0; s < S; s++) {
      const int b = t - s;
      if (b < 0 || b >= B || ch->owner(ch->user, s) != me) continue;
      MOE_TRY(spans_of(ctx, ch, b, p, n, &k));
      MPI_Request *rb = req + (size_t)b * MOE_CHAIN_SPANS;
      const int prev = s > 0 ? ch->owner(ch->user, s - 1) : me;
      const int next = s + 1 < S ? ch->owner(ch->user, s + 1) : me;
      if (prev != me) {
        // this block's own earlier send must have left before it is overwritten
        MOE_MPI_TRY_OP(ctx, what, MPI_Waitall(MOE_CHAIN_SPANS, rb, sts));
        for (int i = 0; i < k; i++)
          MOE_MPI_TRY_OP(
              ctx, what,
              MPI_Recv(p[i], (int)n[i], MPI_FLOAT, prev, CHAIN_TAG, comm, MPI_STATUS_IGNORE));
      }
      ch->compute(ch->user, b, s);
      if (next != me) {
        for (int i = 0; i < k; i++)
          MOE_MPI_TRY_OP(ctx, what,
                         MPI_Isend(p[i], (int)n[i], MPI_FLOAT, next, CHAIN_TAG, comm, &rb[i]));
      }
    }
  }
  MOE_MPI_TRY_OP(ctx, what, MPI_Waitall((int)nreq, req, sts));
  if (size > 1) {
    for (int b = 0; b < B; b++) {
      MOE_TRY(spans_of(ctx, ch, b, p, n, &k));
      for (int i = 0; i < k; i++)
        MOE_MPI_TRY_OP(ctx, what, MPI_Bcast(p[i], (int)n[i], MPI_FLOAT, root, comm));
    }
  }
done:
  moe_chain_state_free(&own);
  return st;
}

#else
// Without MPI this file has nothing to compile (ISO C wants a declaration).
typedef int moe_comm_chain_needs_mpi;
#endif  // MOE_HAVE_MPI
