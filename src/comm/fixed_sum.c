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

moe_status moe_allreduce_fixed(moe_ctx *ctx, float *buf, size_t n, MPI_Comm comm,
                               const char *what) {
  moe_status st = MOE_STATUS_OK;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  float *tmp = NULL;
  if (size == 1 || n == 0) return st;
  // Every rank allocates (a failure on one is agreed, so none waits forever).
  const int receives = rank % 2 == 0 && rank + 1 < size;
  if (receives) tmp = moe_malloc(n * sizeof(float));
  const moe_status mine =
      receives && !tmp ? moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                      "%s (fixed order): out of memory (%zu floats)", what, n)
                       : MOE_STATUS_OK;
  MOE_TRY(moe_comm_agree(ctx, comm, mine, what));
  // Binomial tree: at distance d, rank r (a multiple of 2d) adds rank r + d's
  // sum after its own: (lower ranks) + (higher ranks), the same pairing at
  // every size, so the tree over P ranks is the top of the tree over slices.
  for (int d = 1; d < size; d *= 2) {
    if (rank % (2 * d) == 0) {
      if (rank + d < size) {
        MOE_TRY(moe_recv_floats(ctx, tmp, n, rank + d, FIXED_SUM_TAG, comm, what));
        moe_add_inplace(buf, tmp, n);
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
  moe_free(tmp);
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
