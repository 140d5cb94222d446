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

#endif
