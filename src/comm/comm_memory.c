// moe_comm_memory_check (include/moe/comm.h): the memory bound agreed over MPI.
// Every rank's need and limit are gathered on every rank, so all of them build
// the same refusal message from the same numbers and return together: no rank
// goes on to allocate while another has given up.
#include "moe_build_config.h"

#if MOE_HAVE_MPI
#include <stdio.h>
#include <string.h>

#include "moe/comm.h"

// Per rank: the categories, skew_bytes, the limit, the limit's source code,
// the ranks on its node, and whether reading its available memory failed.
enum { F_LIMIT = MOE_MEM_COUNT_ + 1, F_SOURCE, F_LOCAL, F_FAILED, N_FIELDS };
enum { SRC_FLAG = 0, SRC_AVAILABLE = 1, SRC_CGROUP = 2 };

moe_status moe_comm_memory_check(moe_ctx *ctx, MPI_Comm comm, const moe_memory_need *need,
                                 size_t max_memory, const char *what_to_change) {
  moe_status st = MOE_STATUS_OK;
  double *all = NULL;
  MPI_Comm node = MPI_COMM_NULL;
  int rank = 0, size = 1, local = 1;
  MOE_FAIL_IF(ctx, !need, MOE_STATUS_INVALID_ARG, "need must not be NULL");
  MOE_MPI_TRY(ctx, MPI_Comm_rank(comm, &rank));
  MOE_MPI_TRY(ctx, MPI_Comm_size(comm, &size));
  MOE_MPI_TRY(ctx, MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  MOE_MPI_TRY(ctx, MPI_Comm_size(node, &local));
  {
    double mine[N_FIELDS];
    memset(mine, 0, sizeof mine);
    for (int c = 0; c < MOE_MEM_COUNT_; c++) mine[c] = need->bytes[c];
    mine[MOE_MEM_COUNT_] = need->skew_bytes;
    mine[F_LOCAL] = local;
    if (max_memory > 0) {
      mine[F_LIMIT] = (double)max_memory;
      mine[F_SOURCE] = SRC_FLAG;
    } else {
      size_t avail = 0;
      char src[64] = "";
      if (moe_memory_available(ctx, &avail, src, sizeof src) != MOE_STATUS_OK) {
        mine[F_FAILED] = 1;
      } else {
        mine[F_LIMIT] = (double)(avail / (size_t)local);
        mine[F_SOURCE] = strcmp(src, "MemAvailable") == 0 ? SRC_AVAILABLE : SRC_CGROUP;
      }
    }
    all = moe_malloc((size_t)size * N_FIELDS * sizeof(double));
    // Everyone must reach the gather even when this allocation failed.
    moe_status got = all ? MOE_STATUS_OK
                         : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                        "memory check: out of memory");
    MOE_TRY(moe_comm_agree(ctx, comm, got, "the memory check"));
    MOE_MPI_TRY(ctx, MPI_Allgather(mine, N_FIELDS, MPI_DOUBLE, all, N_FIELDS, MPI_DOUBLE, comm));
  }
  for (int r = 0; r < size; r++) {
    const double *f = all + (size_t)r * N_FIELDS;
    MOE_FAIL_IF(ctx, f[F_FAILED] != 0, MOE_STATUS_INVALID_ARG,
                "rank %d cannot read its available memory (/proc/meminfo, cgroup memory.max); "
                "give a limit with --max-memory",
                r);
    moe_memory_need n;
    memset(&n, 0, sizeof n);
    for (int c = 0; c < MOE_MEM_COUNT_; c++) n.bytes[c] = f[c];
    n.skew_bytes = f[MOE_MEM_COUNT_];
    char who[32], source[128];
    snprintf(who, sizeof who, "rank %d of %d", r, size);
    if ((int)f[F_SOURCE] == SRC_FLAG) {
      snprintf(source, sizeof source, "--max-memory, per rank");
    } else {
      snprintf(source, sizeof source, "%s / %d rank%s on its node",
               (int)f[F_SOURCE] == SRC_AVAILABLE ? "MemAvailable" : "cgroup memory.max",
               (int)f[F_LOCAL], (int)f[F_LOCAL] == 1 ? "" : "s");
    }
    MOE_TRY(moe_memory_check(ctx, &n, (size_t)f[F_LIMIT], source, who, what_to_change));
  }
done:
  if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
  moe_free(all);
  return st;
}
#else
typedef int moe_comm_memory_needs_mpi;
#endif  // MOE_HAVE_MPI
