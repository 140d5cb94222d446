// moe_comm_cpu_share (include/moe/comm.h): how much of a CPU core each rank
// has when several share a host (4 ranks on a 2-core machine compute two at a
// time), for the balancing models (moe_balance_cost.compute_slots).
#define _GNU_SOURCE  // sched_getaffinity, CPU_COUNT
#include "moe_build_config.h"

#if MOE_HAVE_MPI
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "moe/comm.h"

enum { MOE_CPU_KEY = 64 };

// The machine a rank runs on: the kernel's boot id (the same in every
// network namespace of one machine, unlike the shared-memory domain of MPI,
// which the emulated cluster splits per namespace), else the host name.
static void machine_key(char key[MOE_CPU_KEY]) {
  memset(key, 0, MOE_CPU_KEY);
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    const size_t n = fread(key, 1, MOE_CPU_KEY - 1, f);
    fclose(f);
    key[n] = '\0';
    if (n > 0) return;
  }
  memcpy(key, "host:", 5);
  if (gethostname(key + 5, MOE_CPU_KEY - 6) != 0) key[5] = '\0';
  key[MOE_CPU_KEY - 1] = '\0';
}

moe_status moe_comm_cpu_share(moe_ctx *ctx, MPI_Comm comm, double *share) {
  moe_status st = MOE_STATUS_OK;
  MPI_Comm host = MPI_COMM_NULL;
  char *keys = NULL;
  int rank = 0, size = 1, local = 1;
  MOE_FAIL_IF(ctx, !share, MOE_STATUS_INVALID_ARG, "share must not be NULL");
  MOE_MPI_TRY(ctx, MPI_Comm_rank(comm, &rank));
  MOE_MPI_TRY(ctx, MPI_Comm_size(comm, &size));
  {
    // the ranks of comm on this machine: the same key; color = the lowest such rank
    char mine[MOE_CPU_KEY];
    machine_key(mine);
    keys = moe_malloc((size_t)size * MOE_CPU_KEY);
    // every rank must reach the all-gather, or fail together
    MOE_TRY(moe_comm_agree(ctx, comm,
                           keys ? MOE_STATUS_OK
                                : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                               "cpu share: cannot allocate %d keys", size),
                           "the cpu share"));
    MOE_MPI_TRY(ctx, MPI_Allgather(mine, MOE_CPU_KEY, MPI_CHAR, keys, MOE_CPU_KEY, MPI_CHAR, comm));
    int color = rank;
    for (int r = 0; r < size; r++) {
      if (memcmp(keys + (size_t)r * MOE_CPU_KEY, mine, MOE_CPU_KEY) == 0) {
        color = r;
        break;
      }
    }
    MOE_MPI_TRY(ctx, MPI_Comm_split(comm, color, rank, &host));
    MOE_MPI_TRY(ctx, MPI_Comm_size(host, &local));
    // the cores they may run on: the union of their affinity masks (ranks
    // bound to cores have one each; unbound ones share the machine's)
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) CPU_ZERO(&set);  // adds nothing
    MOE_MPI_TRY(ctx, MPI_Allreduce(MPI_IN_PLACE, &set, (int)sizeof set, MPI_BYTE, MPI_BOR, host));
    int cores = CPU_COUNT(&set);
    if (cores < 1) {  // no rank could read its mask: the machine's online CPUs
      const long n = sysconf(_SC_NPROCESSORS_ONLN);
      cores = n > 0 ? (int)n : 1;
    }
    *share = cores >= local ? 1.0 : (double)cores / (double)local;
  }
done:
  if (host != MPI_COMM_NULL) MPI_Comm_free(&host);
  moe_free(keys);
  return st;
}
#else
typedef int moe_cpu_share_needs_mpi;
#endif  // MOE_HAVE_MPI
