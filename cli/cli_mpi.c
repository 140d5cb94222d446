// Pieces of the moe command-line tool that only MPI commands use.
#include "cli.h"

#if MOE_CLI_MPI
#include <mpi.h>

int cli_out_open_root(cli_out *o, const char *path, int rank) {
  int ok = 1;
  if (rank == 0 && path) ok = cli_out_open(o, path) == CLI_OK;
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return ok ? CLI_OK : CLI_FAILED;
}

int cli_profile_load_for(moe_ctx *ctx, const char *path, int world, int ep, int rank,
                         moe_profile *out) {
  if (moe_profile_load(ctx, path, out) != MOE_STATUS_OK) {
    if (rank == 0) cli_error("--profile: %s", moe_ctx_error(ctx));
    return CLI_USAGE;
  }
  if (moe_profile_check_ranks(ctx, out, world, ep) != MOE_STATUS_OK) {
    if (rank == 0) cli_error("--%s", moe_ctx_error(ctx));  // "profile ..."
    return CLI_USAGE;
  }
  return CLI_OK;
}

#endif
