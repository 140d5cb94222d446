// launch: what the process launcher says about the job, checked against MPI.
// A program built with one MPI and started by another launcher, or by srun
// with the wrong PMI plug-in (srun --mpi=pmix with MPICH, whose client speaks
// PMI-1/PMI-2), runs every process as a singleton: N independent one-rank jobs
// that all write the same outputs, without any error from MPI. The launcher's
// own variables still say N, which is how moe_launch_check tells.
// Not a replacement for MPI's own start-up checks: it reads the environment only.
#include "moe_build_config.h"

#if MOE_HAVE_MPI
#include <limits.h>
#include <stdlib.h>

#include "moe/comm.h"

// The launchers' variables for the number of processes started: Open MPI's
// mpirun; MPICH's hydra and srun --mpi=pmi2; PMIx launchers that set it; srun
// whatever its plug-in (set for the tasks of a step; a batch script's own shell
// has SLURM_NTASKS but not this one). srun --mpi=pmix sets no size of its own.
static const char *const k_size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE",
                                          "SLURM_STEP_NUM_TASKS"};

// The first of vars set to an integer in [lo, INT_MAX] (*var: its name), or -1.
static int first_env_int(const char *const *vars, size_t n, long lo, const char **var) {
  for (size_t i = 0; i < n; i++) {
    const char *v = getenv(vars[i]);
    if (!v || !*v) continue;
    char *end = NULL;
    const long x = strtol(v, &end, 10);
    if (*end != '\0' || x < lo || x > INT_MAX) continue;
    if (var) *var = vars[i];
    return (int)x;
  }
  if (var) *var = NULL;
  return -1;
}

int moe_launcher_size(const char **var) {
  const int n = first_env_int(k_size_vars, sizeof k_size_vars / sizeof k_size_vars[0], 1, var);
  return n > 0 ? n : 1;
}

// The same launchers' variables for the process's rank, in the same order.
static const char *const k_rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                          "SLURM_PROCID"};

int moe_launcher_rank(void) {
  const int r = first_env_int(k_rank_vars, sizeof k_rank_vars / sizeof k_rank_vars[0], 0, NULL);
  return r >= 0 ? r : 0;
}

moe_status moe_launch_check(moe_ctx *ctx) {
  moe_status st = MOE_STATUS_OK;
  int world = 0;
  MOE_MPI_TRY(ctx, MPI_Comm_size(MPI_COMM_WORLD, &world));
  const char *var = NULL;
  const int n = moe_launcher_size(&var);
  MOE_FAIL_IF(ctx, world == 1 && n > 1, MOE_STATUS_INVALID_ARG,
              "the launcher started %d processes (%s=%d) but MPI_COMM_WORLD has 1 rank: each "
              "process runs alone. The launcher does not match this program's MPI (%s): use its "
              "own mpiexec, or under srun the PMI it speaks (srun --mpi=pmix for Open MPI, "
              "--mpi=pmi2 for MPICH; srun --mpi=list shows what Slurm offers)",
              n, var, n, moe_mpi_library_name());
done:
  return st;
}

// The MPI library's name and version, one line (MPI_Get_library_version's
// first line, which names the implementation).
const char *moe_mpi_library_name(void) {
  static char name[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(name, &len) != MPI_SUCCESS) return "unknown MPI";
  name[len < (int)sizeof name ? len : (int)sizeof name - 1] = '\0';
  // The first line, up to a comma, with runs of blanks as one space
  // (MPICH's is "MPICH Version:<tab>4.0.2").
  int w = 0;
  for (int r = 0; name[r] && name[r] != '\n' && name[r] != ','; r++) {
    const int blank = name[r] == ' ' || name[r] == '\t';
    if (blank && (w == 0 || name[w - 1] == ' ')) continue;
    name[w++] = blank ? ' ' : name[r];
  }
  while (w > 0 && name[w - 1] == ' ') w--;
  name[w] = '\0';
  return name;
}

#else
// Without MPI this file has nothing to compile (ISO C wants a declaration).
typedef int moe_comm_launch_needs_mpi;
#endif  // MOE_HAVE_MPI
