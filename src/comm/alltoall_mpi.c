// mpi: the MPI library's own MPI_Alltoallv, the baseline every other algorithm
// is compared with (the analogue of NCCL's all-to-all in the papers).
//
// Steps: whatever the MPI library chooses (Open MPI's tuned component picks
// pairwise or linear exchanges by size).
// Cost: library-defined; typically (P-1)*alpha + (P-1)/P*n*beta.
#include <stdint.h>

#include "comm/alltoall.h"

moe_status moe_alltoallv_mpi(MOE_A2A_ARGS) {
  moe_status st = MOE_STATUS_OK;
  const int P = g->size;
  // int counts for MPI: 4 arrays of P ints carved from the workspace.
  MOE_TRY(moe_workspace_reserve(ctx, ws, 4 * (size_t)P * sizeof(int)));
  int *sc = ws->buf, *sd = sc + P, *rc = sd + P, *rd = rc + P;
  for (int r = 0; r < P; r++) {  // moe_a2a_run checked that these fit in int
    sc[r] = (int)send_counts[r];
    sd[r] = send_counts[r] ? (int)send_displs[r] : 0;  // empty blocks may point anywhere
    rc[r] = (int)recv_counts[r];
    rd[r] = recv_counts[r] ? (int)recv_displs[r] : 0;
  }
  MOE_MPI_TRY(ctx, MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, g->comm));
done:
  return st;
}
