// Private declarations shared by the all-to-all algorithm files and their
// registry (src/comm/alltoall_registry.c). Each algorithm lives in its own file
// src/comm/alltoall_<name>.c, headed by its steps and alpha-beta cost, and
// defines one catalogue entry `const moe_a2a_algo moe_a2a_<name>`
// (include/moe/a2a_catalog.h). Every file of src/comm/ compiles in every build:
// the MPI code is inside `#if MOE_HAVE_MPI`, the catalogue entry outside it.
#ifndef MOE_COMM_ALLTOALL_H
#define MOE_COMM_ALLTOALL_H

#include <stddef.h>
#include <stdint.h>

#include "moe/a2a_catalog.h"
#include "moe_build_config.h"

// The run and start fields of a catalogue entry: the functions in MPI builds,
// left NULL without MPI (where they are not compiled).
#if MOE_HAVE_MPI
#define MOE_A2A_FNS(run_fn, start_fn) .run = (run_fn), .start = (start_fn)
#else
#define MOE_A2A_FNS(run_fn, start_fn) .run = NULL, .start = NULL
#endif

#if MOE_HAVE_MPI
#include "moe/comm.h"

#define MOE_A2A_ARGS                                                                               \
  moe_ctx *ctx, const moe_group *g, const void *send, const size_t *send_counts,                   \
      const size_t *send_displs, void *recv, const size_t *recv_counts, const size_t *recv_displs, \
      moe_workspace *ws

// The `mpi` algorithm's functions (the registry checks its int displacements).
moe_status moe_alltoallv_mpi(MOE_A2A_ARGS);
moe_status moe_alltoallv_mpi_start(MOE_A2A_ARGS, moe_a2a_pending *out);

// Tag used by point-to-point based algorithms (one collective at a time per
// communicator, so one tag suffices).
#define MOE_A2A_TAG 7001

// Copies my own block (send to self) with memcpy; a no-op when empty.
void moe_a2a_copy_self(const moe_group *g, const void *send, const size_t *send_counts,
                       const size_t *send_displs, void *recv, const size_t *recv_displs);

// Converts n byte counts to int counts c and packed displacements d starting
// at 0; returns 0 when a count or an offset exceeds INT_MAX. *total receives
// the sum. (Hierarchical algorithms aggregate blocks, which can outgrow int.)
int moe_a2a_int_layout(const uint64_t *count, int n, int *c, int *d, size_t *total);
// Whether the non-empty blocks lie back to back in rank order (then *base is
// the offset of the first): such a buffer is sent or received in one piece.
int moe_a2a_packed_in_order(const size_t *counts, const size_t *displs, int P, size_t *base);

#endif  // MOE_HAVE_MPI
#endif
