// pairwise: the classic shifted exchange. In step k (1..P-1) rank r sends its
// block for rank (r+k) mod P and receives the block of rank (r-k) mod P, so
// every step is a perfect matching and no rank receives from two peers at once.
//
// Steps:
//   0. copy the block to myself
//   k = 1..P-1: sendrecv(to (r+k)%P, from (r-k+P)%P)
// Cost: (P-1)*alpha + (P-1)/P*n*beta, n = bytes a rank sends in total.
#include "comm/comm_internal.h"

// Cost model: a sequential exchange (ScheMoE eq. 17): t_intra + t_inter.
static double pairwise_cost(const moe_a2a_cost_params *p) { return p->t_intra_s + p->t_inter_s; }

#if MOE_HAVE_MPI

static moe_status moe_alltoallv_pairwise(MOE_A2A_ARGS) {
  moe_status st = MOE_STATUS_OK;
  const int P = g->size, r = g->rank;
  (void)ws;
  // step 0: my own block
  moe_a2a_copy_self(g, send, send_counts, send_displs, recv, recv_displs);
  for (int k = 1; k < P; k++) {
    const int to = (r + k) % P, from = (r - k + P) % P;
    MOE_MPI_TRY(
        ctx, MPI_Sendrecv((const char *)send + send_displs[to], (int)send_counts[to], MPI_BYTE, to,
                          MOE_A2A_TAG, (char *)recv + recv_displs[from], (int)recv_counts[from],
                          MPI_BYTE, from, MOE_A2A_TAG, g->comm, MPI_STATUS_IGNORE));
  }
done:
  return st;
}
#endif  // MOE_HAVE_MPI

const moe_a2a_algo moe_a2a_pairwise = {.name = "pairwise",
                                       .source = "classic shifted exchange",
                                       .cost = "(P-1)*alpha + (P-1)/P*n*beta",
                                       .needs_uniform_nodes = 0,
                                       .plannable = 1,
                                       .model = pairwise_cost,
                                       MOE_A2A_FNS(moe_alltoallv_pairwise, NULL)};
