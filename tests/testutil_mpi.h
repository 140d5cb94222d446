// The collective end of an MPI test program (header only: testutil.c is also
// linked into the tests without MPI). Every rank calls it last: each fails
// if any rank did; rank 0 prints "NAME (P=size): N passed, F failed" with the
// checks of all ranks summed. Returns the program's exit status.
#ifndef MOE_TESTUTIL_MPI_H
#define MOE_TESTUTIL_MPI_H

#include <mpi.h>
#include <stdio.h>

#include "testutil.h"

static inline int tu_mpi_finish(const char *name) {
  int rank = 0, size = 1, fail_max = 0, sums[2] = {tu_checks, tu_failures}, tot[2] = {0, 0};
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Allreduce(&tu_failures, &fail_max, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Reduce(sums, tot, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  int rc = fail_max ? 1 : 0;
  if (rank == 0) {
    tu_checks = tot[0];
    tu_failures = tot[1];
    char label[96];
    snprintf(label, sizeof label, "%s (P=%d)", name, size);
    rc = tu_finish(label) || fail_max;
  }
  return rc;
}

#endif  // MOE_TESTUTIL_MPI_H
