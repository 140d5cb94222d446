// moe_launcher_size and moe_launch_check (include/moe/comm.h) under mpiexec:
// the size comes from the first launcher variable set to a positive integer
// (the MPI launchers' before Slurm's, so mpirun inside an allocation counts
// its own ranks), bad values are skipped, and the check fails exactly when the
// launcher announces several processes while MPI_COMM_WORLD has one rank
// (a singleton started by a foreign launcher), with a message that names the
// count, the variable and srun's PMI choices. The variables are set by the test
// itself after MPI_Init (the launcher's own are removed first).
#define _POSIX_C_SOURCE 200809L  // setenv, unsetenv
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "moe/comm.h"
#include "testutil.h"

static const char *const k_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE",
                                     "SLURM_STEP_NUM_TASKS"};

static void clear_vars(void) {
  for (size_t i = 0; i < sizeof k_vars / sizeof k_vars[0]; i++) unsetenv(k_vars[i]);
}

// Sets the given NAME=VALUE pairs (after clearing every launcher variable) and
// checks the size and variable moe_launcher_size reports.
static void expect_size(int want, const char *want_var, const char *n1, const char *v1,
                        const char *n2, const char *v2) {
  clear_vars();
  if (n1) setenv(n1, v1, 1);
  if (n2) setenv(n2, v2, 1);
  const char *var = "unset";
  const int got = moe_launcher_size(&var);
  TU_CHECK(got == want, "%s=%s %s=%s: size %d, want %d", n1 ? n1 : "-", v1 ? v1 : "-",
           n2 ? n2 : "-", v2 ? v2 : "-", got, want);
  TU_CHECK(want_var ? var && strcmp(var, want_var) == 0 : var == NULL,
           "%s=%s %s=%s: variable %s, want %s", n1 ? n1 : "-", v1 ? v1 : "-", n2 ? n2 : "-",
           v2 ? v2 : "-", var ? var : "NULL", want_var ? want_var : "NULL");
  TU_CHECK(moe_launcher_size(NULL) == want, "NULL var: size differs");
}

int main(void) {
  int provided = 0, world = 0;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) return 2;

  // The launcher under which this test runs passes the check as it is.
  TU_CHECK(moe_launch_check(ctx) == MOE_STATUS_OK, "launched by mpiexec: %s", moe_ctx_error(ctx));
  const char *lib = moe_mpi_library_name();
  TU_CHECK(lib && (strstr(lib, "Open MPI") || strstr(lib, "MPICH")) && !strchr(lib, '\n') &&
               !strchr(lib, '\t'),
           "library name '%s': want one line naming Open MPI or MPICH", lib ? lib : "NULL");

  // moe_launcher_size.
  expect_size(1, NULL, NULL, NULL, NULL, NULL);
  expect_size(4, "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_TASKS", "4", NULL, NULL);
  expect_size(3, "PMI_SIZE", "PMI_SIZE", "3", "SLURM_STEP_NUM_TASKS", "8");
  expect_size(1, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "1", "SLURM_STEP_NUM_TASKS", "2");
  expect_size(6, "PMIX_SIZE", "PMIX_SIZE", "6", NULL, NULL);
  expect_size(5, "SLURM_STEP_NUM_TASKS", "PMI_SIZE", "abc", "SLURM_STEP_NUM_TASKS", "5");
  expect_size(1, NULL, "PMI_SIZE", "0", "PMIX_SIZE", "-3");
  expect_size(1, NULL, "PMI_SIZE", "4x", "OMPI_COMM_WORLD_SIZE", "");
  expect_size(2, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "2", "PMI_SIZE", "9");

  // moe_launch_check: fails only for a one-rank world under a launcher of several.
  clear_vars();
  setenv("SLURM_STEP_NUM_TASKS", "4", 1);
  moe_status st = moe_launch_check(ctx);
  if (world == 1) {
    const char *msg = moe_ctx_error(ctx);
    TU_CHECK(st == MOE_STATUS_INVALID_ARG, "1 rank, launcher says 4: status %d, want INVALID_ARG",
             (int)st);
    TU_CHECK(strstr(msg, "started 4 processes (SLURM_STEP_NUM_TASKS=4)") &&
                 strstr(msg, "MPI_COMM_WORLD has 1 rank") && strstr(msg, "--mpi=pmix") &&
                 strstr(msg, "--mpi=pmi2") && strstr(msg, lib),
             "message: %s", msg);
  } else {
    TU_CHECK(st == MOE_STATUS_OK, "%d ranks, launcher says 4: %s", world, moe_ctx_error(ctx));
  }
  clear_vars();
  setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
  setenv("SLURM_STEP_NUM_TASKS", "4", 1);  // mpirun -n 1 inside a 4-task step
  st = moe_launch_check(ctx);
  TU_CHECK(st == MOE_STATUS_OK, "launcher says 1 (first variable): %s", moe_ctx_error(ctx));
  clear_vars();
  st = moe_launch_check(ctx);
  TU_CHECK(st == MOE_STATUS_OK, "no launcher variable: %s", moe_ctx_error(ctx));

  moe_ctx_destroy(ctx);
  MPI_Finalize();
  return tu_finish("test_launch");
}
