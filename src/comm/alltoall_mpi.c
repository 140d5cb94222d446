// mpi: the MPI library's own MPI_Alltoallv, the baseline every other algorithm
// is compared with (the analogue of NCCL's all-to-all in the papers).
//
// Steps: whatever the MPI library chooses (Open MPI's tuned component picks
// pairwise or linear exchanges by size).
// Cost: library-defined; typically (P-1)*alpha + (P-1)/P*n*beta.
// Nonblocking form: MPI_Ialltoallv (Open MPI's libnbc), progressed by each
// MPI_Test of the pending request.
#include <stdint.h>

#include "comm/comm_internal.h"

// Cost model: a sequential exchange, intra-node and inter-node pairs one after
// the other (ScheMoE eq. 17): t_intra + t_inter.
static double mpi_cost(const moe_a2a_cost_params *p) { return p->t_intra_s + p->t_inter_s; }

#if MOE_HAVE_MPI

// int counts for MPI: 4 arrays of P ints carved from the workspace.
static moe_status int_counts(MOE_A2A_ARGS, int **out) {
  moe_status st = MOE_STATUS_OK;
  const int P = g->size;
  (void)send;
  (void)recv;
  // int counts for MPI: 4 arrays of P ints carved from the workspace.
  MOE_TRY(moe_workspace_reserve(ctx, ws, 4 * (size_t)P * sizeof(int)));
  int *sc = ws->buf, *sd = sc + P, *rc = sd + P, *rd = rc + P;
  for (int r = 0; r < P; r++) {  // moe_a2a_run checked that these fit in int
    sc[r] = (int)send_counts[r];
    sd[r] = send_counts[r] ? (int)send_displs[r] : 0;  // empty blocks may point anywhere
    rc[r] = (int)recv_counts[r];
    rd[r] = recv_counts[r] ? (int)recv_displs[r] : 0;
  }
  *out = sc;
done:
  return st;
}

moe_status moe_alltoallv_mpi(MOE_A2A_ARGS) {
  moe_status st = MOE_STATUS_OK;
  const int P = g->size;
  int *sc = NULL;
  MOE_TRY(
      int_counts(ctx, g, send, send_counts, send_displs, recv, recv_counts, recv_displs, ws, &sc));
  MOE_MPI_TRY(ctx, MPI_Alltoallv(send, sc, sc + P, MPI_BYTE, recv, sc + 2 * P, sc + 3 * P, MPI_BYTE,
                                 g->comm));
done:
  return st;
}

moe_status moe_alltoallv_mpi_start(MOE_A2A_ARGS, moe_a2a_pending *out) {
  moe_status st = MOE_STATUS_OK;
  const int P = g->size;
  int *sc = NULL;
  MOE_TRY(
      int_counts(ctx, g, send, send_counts, send_displs, recv, recv_counts, recv_displs, ws, &sc));
  MOE_MPI_TRY(ctx, MPI_Ialltoallv(send, sc, sc + P, MPI_BYTE, recv, sc + 2 * P, sc + 3 * P,
                                  MPI_BYTE, g->comm, &out->req));
  out->active = 1;
done:
  return st;
}
#endif  // MOE_HAVE_MPI

const moe_a2a_algo moe_a2a_mpi = {.name = "mpi",
                                  .source = "MPI_Alltoallv (the NCCL-A2A analogue)",
                                  .cost = "library-defined",
                                  .needs_uniform_nodes = 0,
                                  .plannable = 1,
                                  .model = mpi_cost,
                                  MOE_A2A_FNS(moe_alltoallv_mpi, moe_alltoallv_mpi_start)};
