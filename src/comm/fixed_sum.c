// Sums over ranks in one fixed order (moe_allreduce_fixed, moe_sum_slices_ordered
// in comm.h): the reductions of the deterministic mode, whose bits must not
// depend on how MPI schedules a reduction or on how many ranks there are.
#include "moe_build_config.h"

#if MOE_HAVE_MPI
#include <mpi.h>
#include <string.h>

#include "moe/comm.h"
#include "moe/core.h"
#include "moe/kernels.h"

// MPI counts are int: the broadcast goes in pieces of at most 2^28 floats.
#define PIECE ((size_t)1 << 28)
// The tree's point-to-point messages.
#define FIXED_SUM_TAG 41

void moe_fixed_sum_free(moe_fixed_sum *fs) {
  if (!fs) return;
  moe_free(fs->tmp);
  memset(fs, 0, sizeof *fs);
}

// The agreement of a call with a new (comm, n): the same n on every rank (an
// all-reduce of n and ~n under MAX gives the largest and the smallest), and the
// receive buffer grown where needed; a failure on any rank fails every rank.
static moe_status agree_call(moe_ctx *ctx, moe_fixed_sum *fs, size_t n, MPI_Comm comm, int receives,
                             const char *what) {
  moe_status st = MOE_STATUS_OK, mine = MOE_STATUS_OK;
  unsigned long long ext[2] = {(unsigned long long)n, ~(unsigned long long)n};
  const int watch = moe_watchdog_op_begin("agreement", what);  // as moe_comm_agree's
  const int rc = MPI_Allreduce(MPI_IN_PLACE, ext, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm);
  moe_watchdog_op_end(watch);
  MOE_MPI_TRY(ctx, rc);
  if (ext[0] != (unsigned long long)n || ~ext[1] != (unsigned long long)n) {
    mine = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                        "%s (fixed order): the ranks pass different sizes (from %llu to %llu "
                        "floats); every rank must pass the same",
                        what, ~ext[1], ext[0]);
  } else if (receives && fs->cap < n) {
    moe_free(fs->tmp);
    fs->cap = 0;
    fs->tmp = moe_malloc(n * sizeof(float));
    if (fs->tmp) {
      fs->cap = n;
    } else {
      mine = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                          "%s (fixed order): out of memory (%zu floats)", what, n);
    }
  }
  MOE_TRY(moe_comm_agree(ctx, comm, mine, what));
  fs->comm = comm;
  fs->agreed_n = n;
done:
  return st;
}

moe_status moe_allreduce_fixed(moe_ctx *ctx, moe_fixed_sum *fs, float *buf, size_t n, MPI_Comm comm,
                               const char *what) {
  moe_status st = MOE_STATUS_OK;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  moe_fixed_sum once;
  memset(&once, 0, sizeof once);
  if (!fs) fs = &once;
  if (size == 1 || n == 0) return st;
  const int receives = rank % 2 == 0 && rank + 1 < size;
  // An agreement before the first call of each (comm, n), not before every
  // call: one more collective (and an allocation) per step would cost latency
  // on every gradient reduction, and the buffer it makes safe is kept.
  if (fs->agreed_n != n || fs->comm != comm) MOE_TRY(agree_call(ctx, fs, n, comm, receives, what));
  // Binomial tree: at distance d, rank r (a multiple of 2d) adds rank r + d's
  // sum after its own: (lower ranks) + (higher ranks), the same pairing at
  // every size, so the tree over P ranks is the top of the tree over slices.
  for (int d = 1; d < size; d *= 2) {
    if (rank % (2 * d) == 0) {
      if (rank + d < size) {
        MOE_TRY(moe_recv_floats(ctx, fs->tmp, n, rank + d, FIXED_SUM_TAG, comm, what));
        moe_add_inplace(buf, fs->tmp, n);
      }
    } else {
      MOE_TRY(moe_send_floats(ctx, buf, n, rank - d, FIXED_SUM_TAG, comm, what));
      break;
    }
  }
  for (size_t i = 0; i < n; i += PIECE) {
    const size_t c = n - i < PIECE ? n - i : PIECE;
    MOE_MPI_TRY_OP(ctx, what, MPI_Bcast(buf + i, (int)c, MPI_FLOAT, 0, comm));
  }
done:
  moe_fixed_sum_free(&once);
  return st;
}

moe_status moe_sum_slices_ordered(moe_ctx *ctx, const double *mine, int slices, int n, double *out,
                                  MPI_Comm comm, const char *what) {
  moe_status st = MOE_STATUS_OK;
  int size = 1;
  MPI_Comm_size(comm, &size);
  int *counts = NULL, *displs = NULL;
  double *all = NULL;
  counts = moe_malloc((size_t)size * sizeof(int));
  displs = moe_malloc((size_t)size * sizeof(int));
  const int nmine = slices * n;
  MOE_TRY(moe_comm_agree(ctx, comm,
                         counts && displs ? MOE_STATUS_OK
                                          : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__,
                                                         __LINE__, "ordered sum: out of memory"),
                         "ordered sum"));
  MOE_MPI_TRY_OP(ctx, what, MPI_Allgather(&nmine, 1, MPI_INT, counts, 1, MPI_INT, comm));
  size_t total = 0;
  for (int q = 0; q < size; q++) {
    displs[q] = (int)total;
    total += (size_t)counts[q];
  }
  all = moe_malloc((total ? total : 1) * sizeof(double));
  MOE_TRY(moe_comm_agree(ctx, comm,
                         all ? MOE_STATUS_OK
                             : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                            "ordered sum: out of memory (%zu doubles)", total),
                         "ordered sum"));
  MOE_MPI_TRY_OP(ctx, what,
                 MPI_Allgatherv(mine, nmine, MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, comm));
  for (int j = 0; j < n; j++) out[j] = 0.0;
  for (size_t s = 0; s + (size_t)n <= total; s += (size_t)n) {
    for (int j = 0; j < n; j++) out[j] += all[s + (size_t)j];
  }
done:
  moe_free(counts);
  moe_free(displs);
  moe_free(all);
  return st;
}
#else
typedef int moe_comm_fixed_sum_needs_mpi;
#endif  // MOE_HAVE_MPI
