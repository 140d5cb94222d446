// One all-to-all timed (moe_measure_a2a): the loop behind `moe bench a2a`
// and calibration's all-to-all fits, with the optional byte-exact check of
// every received block (the payload encodes source, destination and index).
#include "moe_build_config.h"
#if MOE_HAVE_MPI  // the whole file: collective measurements

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "moe/measure_mpi.h"

// The byte at index i of the block rank s sends to rank d.
static unsigned char payload(int s, int d, size_t i) {
  return (unsigned char)((uint32_t)s * 131u + (uint32_t)d * 31u + (uint32_t)(i * 7u) +
                         (uint32_t)(i >> 8));
}

moe_status moe_measure_a2a(moe_ctx *ctx, const moe_group *g, const moe_a2a_algo *algo,
                           const size_t *sc, const size_t *sd, const size_t *rc, const size_t *rd,
                           unsigned char *sbuf, unsigned char *rbuf, moe_workspace *ws, int iters,
                           int warmup, int check, moe_measure_a2a_result *out) {
  moe_status st = MOE_STATUS_OK;
  const int P = g->size, rank = g->rank;
  int *ic = NULL;
  double *slow = NULL, *mine = NULL;
  MOE_FAIL_IF(ctx, iters < 1 || warmup < 0 || !out, MOE_STATUS_INVALID_ARG,
              "measure: iters (%d) must be >= 1 and warmup (%d) >= 0", iters, warmup);
  memset(out, 0, sizeof *out);
  size_t recv_end = 0;
  int too_big = 0;
  for (int p = 0; p < P; p++) {
    if (rc[p] && rd[p] + rc[p] > recv_end) recv_end = rd[p] + rc[p];
    too_big |= sc[p] > INT_MAX || sd[p] > INT_MAX || rc[p] > INT_MAX || rd[p] > INT_MAX;
  }
  if (!algo)
    MOE_TRY(moe_comm_agree(ctx, g->comm,
                           too_big ? moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                                                  "measure: a count or displacement "
                                                  "beyond MPI's int (bare MPI_Alltoallv)")
                                   : MOE_STATUS_OK,
                           "bare all-to-all counts"));
  ic = moe_malloc(4 * (size_t)P * sizeof(int));
  slow = moe_malloc((size_t)iters * sizeof(double));
  mine = moe_malloc((size_t)iters * sizeof(double));
  MOE_TRY(moe_comm_agree(ctx, g->comm,
                         ic && slow && mine ? MOE_STATUS_OK
                                            : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__,
                                                           __LINE__, "measure: out of memory"),
                         "all-to-all buffers"));
  for (int p = 0; p < P; p++) {
    ic[p] = (int)sc[p];
    ic[P + p] = (int)sd[p];
    ic[2 * P + p] = (int)rc[p];
    ic[3 * P + p] = (int)rd[p];
    if (check)
      for (size_t i = 0; i < sc[p]; i++) sbuf[sd[p] + i] = payload(rank, p, i);
  }
  int bad = 0;
  for (int it = 0; it < warmup + iters; it++) {
    if (check) memset(rbuf, 0xA5, recv_end + 1);
    MOE_MPI_WATCHED("barrier before a timed all-to-all", MPI_Barrier(g->comm));
    const double t0 = MPI_Wtime();
    if (!algo) {
      const int rc_mpi = MPI_Alltoallv(sbuf, ic, ic + P, MPI_BYTE, rbuf, ic + 2 * P, ic + 3 * P,
                                       MPI_BYTE, g->comm);
      MOE_FAIL_IF(ctx, rc_mpi != MPI_SUCCESS, MOE_STATUS_COMM,
                  "rank %d: MPI_Alltoallv failed (code %d)", rank, rc_mpi);
    } else if (moe_a2a_run(ctx, algo, g, sbuf, sc, sd, rbuf, rc, rd, ws) != MOE_STATUS_OK) {
      char why[512];
      snprintf(why, sizeof why, "%s", moe_ctx_error(ctx));
      MOE_FAIL(ctx, MOE_STATUS_COMM, "rank %d: all-to-all '%s': %s", rank, algo->name, why);
    }
    const double dt = MPI_Wtime() - t0;
    if (it >= warmup) {
      mine[it - warmup] = dt;
      MOE_MPI_TRY_OP(ctx, "all-reduce of the timings",
                     MPI_Allreduce(&dt, &slow[it - warmup], 1, MPI_DOUBLE, MPI_MAX, g->comm));
    }
    for (int src = 0; check && src < P && !bad; src++) {
      for (size_t i = 0; i < rc[src]; i++) {
        if (rbuf[rd[src] + i] != payload(src, rank, i)) {
          bad = 1;
          break;
        }
      }
    }
  }
  MOE_MPI_TRY_OP(ctx, "all-reduce of the check",
                 MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, g->comm));
  out->bad = bad;
  out->median_s = moe_median(slow, iters);
  double m = moe_median(mine, iters);
  MOE_MPI_TRY_OP(ctx, "all-reduce of the timings",
                 MPI_Allreduce(MPI_IN_PLACE, &m, 1, MPI_DOUBLE, MPI_MAX, g->comm));
  out->slowest_median_s = m;
done:
  moe_free(ic);
  moe_free(slow);
  moe_free(mine);
  return st;
}

#else
// Without MPI this file has nothing to compile (ISO C wants a declaration).
typedef int moe_measure_a2a_runs_need_mpi;
#endif  // MOE_HAVE_MPI
