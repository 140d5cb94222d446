// pipe: ScheMoE's Pipe-A2A (EuroSys'24 §4, eqs 15-18; ScheMoE `pipe.cpp`). The
// all-to-all is P send/receive pairs; those with peers on my node and those
// with peers on other nodes use different links, so they run at the same time
// instead of one after the other: time max(intra, inter) instead of their sum
// (eq 16 vs 17, at most 2x faster). ScheMoE puts the two sets on two NCCL
// communicators and streams; here intra-node pairs go over g->intra and
// inter-node pairs over g->comm, all nonblocking and progressed by one wait loop.
// Works for any node layout (non-uniform and non-contiguous nodes included).
//
// Inter-node sends are issued in shift order (step k sends to rank (r+k) mod P,
// as in the pairwise exchange), at most PIPE_INTER_WINDOW at a time, so that at
// any moment each rank receives from about that many senders instead of all of
// them (no incast); intra-node sends, fewer and on faster links, are all
// posted at once. Every receive is posted before any send, so no message is
// unexpected and the window cannot deadlock. Empty blocks are not sent (the
// receiver's recv_counts say which to expect).
//
// Steps (G = ranks on my node, here any size):
//   1. post the receives: intra-node peers, then inter-node peers in shift order
//   2. post the intra-node sends (shift order within the node) and the first
//      PIPE_INTER_WINDOW inter-node sends
//   3. copy my own block while they fly
//   4. wait for any request; when an inter-node send completes, post the next
//      one in shift order; until all are done
// Cost: max((G-1)*(alpha_intra + n/P*beta_intra), (P-G)*(alpha_inter +
//   n/P*beta_inter)), n = bytes a rank sends (eq 16 with t1, t2 per message).
#include "comm/comm_internal.h"

// Cost model: intra-node and inter-node pairs at the same time (ScheMoE eq. 16):
// max(t_intra, t_inter).
static double pipe_cost(const moe_a2a_cost_params *p) {
  return p->t_intra_s > p->t_inter_s ? p->t_intra_s : p->t_inter_s;
}

#if MOE_HAVE_MPI

// Inter-node sends in flight per rank.
#define PIPE_INTER_WINDOW 4

static moe_status moe_alltoallv_pipe(MOE_A2A_ARGS) {
  moe_status st = MOE_STATUS_OK;
  const int P = g->size, r = g->rank, G = g->local_size, node = g->node;
  // Requests: intra receives and sends (2(G-1)), inter receives (P-G), send window.
  const int n_req = 2 * (G - 1) + (P - G) + PIPE_INTER_WINDOW;
  MOE_TRY(moe_workspace_reserve(ctx, ws, (size_t)n_req * sizeof(MPI_Request)));
  MPI_Request *req = ws->buf;
  for (int i = 0; i < n_req; i++) req[i] = MPI_REQUEST_NULL;
  MPI_Request *intra_req = req, *inter_recv = req + 2 * (G - 1), *window = inter_recv + (P - G);
  // ---- step 1: receives ------------------------------------------------------------------
  int ni = 0, ne = 0;
  for (int k = 1; k < P; k++) {
    const int from = (r - k + P) % P;
    if (recv_counts[from] == 0) continue;
    char *dst = (char *)recv + recv_displs[from];
    if (g->node_of[from] == node) {
      MOE_MPI_TRY(ctx, MPI_Irecv(dst, (int)recv_counts[from], MPI_BYTE, g->local_rank_of[from],
                                 MOE_A2A_TAG, g->intra, &intra_req[ni++]));
    } else {
      MOE_MPI_TRY(ctx, MPI_Irecv(dst, (int)recv_counts[from], MPI_BYTE, from, MOE_A2A_TAG, g->comm,
                                 &inter_recv[ne++]));
    }
  }
  // ---- step 2: intra-node sends, then the first inter-node window -------------------------
  for (int k = 1; k < P; k++) {
    const int to = (r + k) % P;
    if (g->node_of[to] != node || send_counts[to] == 0) continue;
    MOE_MPI_TRY(ctx, MPI_Isend((const char *)send + send_displs[to], (int)send_counts[to], MPI_BYTE,
                               g->local_rank_of[to], MOE_A2A_TAG, g->intra, &intra_req[ni++]));
  }
  int next = 1;  // next shift whose inter-node send is still to post
  for (int w = 0; w < PIPE_INTER_WINDOW; w++) {
    for (; next < P; next++) {
      const int to = (r + next) % P;
      if (g->node_of[to] == node || send_counts[to] == 0) continue;
      MOE_MPI_TRY(ctx, MPI_Isend((const char *)send + send_displs[to], (int)send_counts[to],
                                 MPI_BYTE, to, MOE_A2A_TAG, g->comm, &window[w]));
      next++;
      break;
    }
  }
  // ---- step 3: my own block ------------------------------------------------------------------
  moe_a2a_copy_self(g, send, send_counts, send_displs, recv, recv_displs);
  // ---- step 4: progress both sets; refill the send window in shift order -------------------
  for (;;) {
    int idx = MPI_UNDEFINED;
    MOE_MPI_TRY(ctx, MPI_Waitany(n_req, req, &idx, MPI_STATUS_IGNORE));
    if (idx == MPI_UNDEFINED) break;  // all requests are done
    if (req + idx < window) continue;
    for (; next < P; next++) {  // a window slot is free
      const int to = (r + next) % P;
      if (g->node_of[to] == node || send_counts[to] == 0) continue;
      MOE_MPI_TRY(ctx, MPI_Isend((const char *)send + send_displs[to], (int)send_counts[to],
                                 MPI_BYTE, to, MOE_A2A_TAG, g->comm, &req[idx]));
      next++;
      break;
    }
  }
done:
  // On an MPI error, requests still in flight are left to MPI: the group is
  // unusable after a failed collective anyway.
  return st;
}
#endif  // MOE_HAVE_MPI

const moe_a2a_algo moe_a2a_pipe = {
    .name = "pipe",
    .source = "ScheMoE Pipe-A2A (intra and inter concurrently)",
    .cost = "max((G-1)*(alpha_intra + n/P*beta_intra), (P-G)*(alpha_inter + n/P*beta_inter))",
    .needs_uniform_nodes = 0,
    .plannable = 1,
    .model = pipe_cost,
    MOE_A2A_FNS(moe_alltoallv_pipe, NULL)};
