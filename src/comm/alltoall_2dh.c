// 2dh: the two-dimensional hierarchical all-to-all of Tutel and DeepSpeed
// (ScheMoE's `dd_comm.cpp`). An intra-node all-to-all first gathers on local
// rank l everything its node sends to local rank l of every node; an inter-node
// all-to-all among the ranks with local rank l then delivers it. Each rank sends
// N-1 inter-node messages of about n/N bytes instead of P-G messages of n/P.
// Needs uniform nodes (P = N nodes x G ranks, rank r = node*G + local).
// Deliberately not pipelined: the two phases run one after the other.
//
// Variable counts: intermediate ranks forward blocks whose sizes only their
// senders know, so step 0 exchanges them inside the node. C[s][d] is the bytes
// rank s sends to rank d; rank (node, l) needs K[g][n] = C[(node,g)][(n,l)],
// the N block sizes local rank g will hand it, so every rank sends each local
// peer g the N counts C[me][(n,g)] (an MPI_Alltoall of N words on the intra
// communicator). Its final receive sizes are its own recv_counts. Aggregated
// blocks and their offsets must fit MPI's int counts; since only the node knows
// its aggregates, all ranks agree on that check with one MPI_Allreduce of a flag,
// so an oversized call fails with INVALID_ARG on every rank instead of hanging.
//
// Steps (me = (node, l)):
//   0. counts: intra MPI_Alltoall of C[me][(n,g)], n < N, to each local g -> K;
//      allreduce of the int-limit flag over the group
//   1. stride-transpose (pack): tmp[g][n] = my block for (n, g)
//   2. intra MPI_Alltoallv: tmp[g] -> local g; receive buf[g'][n] (K[g'][n] bytes)
//   3. transpose: tmp[n][g'] = buf[g'][n]
//   4. inter MPI_Alltoallv (ranks with local rank l): tmp[n] -> (n, l); receive
//      from (n, l) the blocks of ranks n*G + g' for me, g' ascending, which is
//      source-rank order: straight into recv when recv is packed in that order
//   5. otherwise scatter them to recv + recv_displs[s]
//   With G == 1 or N == 1 one phase is empty: then it is one MPI_Alltoallv on
//   g->comm, without copies.
// Cost: 2(G-1)*alpha_intra + (G-1)/G*n*beta_intra + (N-1)*alpha_inter +
//   (N-1)/N*n*beta_inter + log2(P)*alpha, n = bytes a rank sends (balanced
//   loads); one (G-1)*alpha_intra is the counts exchange, log2(P)*alpha the flag
//   allreduce; plus 2-3 local copies of n bytes. Workspace: about 2 max(n, n')
//   bytes (n' = bytes a rank forwards) plus 8P-byte count tables.
#include <limits.h>
#include <string.h>

#include "comm/comm_internal.h"

// Cost model: t_phase1 + t_inter: phase 1 moves everything that leaves a device
// over its intra link (the largest device volume), phase 2 the inter-node share.
static double h2d_cost(const moe_a2a_cost_params *p) {
  const double v = p->max_device_bytes;
  return (v > 0 ? v / p->intra_bytes_per_s + p->intra_latency_s : 0.0) + p->t_inter_s;
}

#if MOE_HAVE_MPI

// The workspace's count tables, carved from its start (they survive growth).
typedef struct {
  uint64_t *mine;            // (G, N): mine[j*N + n] = C[me][(n, j)]
  uint64_t *K;               // (G, N): K[j*N + n] = C[(node, j)][(n, l)]
  uint64_t *sum;             // (2N): bytes I forward to (n, l), then bytes I get from node n
  uint64_t *cur;             // (N): write cursors of the transpose
  int *ci, *di, *cir, *dir;  // (G) each: intra counts/displs, send then receive
  int *ce, *de, *cer, *der;  // (N) each: inter counts/displs, send then receive
} tables;

static size_t tables_bytes(int P, int N, int G) {
  return moe_align64((2 * (size_t)P + 3 * (size_t)N) * sizeof(uint64_t) +
                     (4 * (size_t)G + 4 * (size_t)N) * sizeof(int));
}

static tables carve_tables(void *buf, int P, int N, int G) {
  tables t;
  t.mine = buf;
  t.K = t.mine + P;
  t.sum = t.K + P;
  t.cur = t.sum + 2 * (size_t)N;
  t.ci = (int *)(t.cur + N);
  t.di = t.ci + G;
  t.cir = t.di + G;
  t.dir = t.cir + G;
  t.ce = t.dir + G;
  t.de = t.ce + N;
  t.cer = t.de + N;
  t.der = t.cer + N;
  return t;
}

static moe_status moe_alltoallv_2dh(MOE_A2A_ARGS) {
  moe_status st = MOE_STATUS_OK;
  const int P = g->size, N = g->num_nodes, G = g->local_size;
  if (G == 1 || N == 1) {  // one level: the hierarchy adds nothing
    MOE_TRY(moe_alltoallv_mpi(ctx, g, send, send_counts, send_displs, recv, recv_counts,
                              recv_displs, ws));
    goto done;
  }
  // ---- step 0: block sizes ---------------------------------------------------------------
  const size_t meta_bytes = tables_bytes(P, N, G);
  MOE_TRY(moe_workspace_reserve(ctx, ws, meta_bytes));
  tables t = carve_tables(ws->buf, P, N, G);
  for (int j = 0; j < G; j++) {
    for (int n = 0; n < N; n++) t.mine[j * N + n] = send_counts[n * G + j];
  }
  MOE_MPI_TRY(ctx, MPI_Alltoall(t.mine, N, MPI_UINT64_T, t.K, N, MPI_UINT64_T, g->intra));
  // Sizes of both phases, in int, and whether they fit.
  size_t send_total = 0, fwd_total = 0, recv_total = 0;
  int ok = 1;
  for (int j = 0; j < G; j++) {  // intra: to local j sum_n C[me][(n,j)]; from j sum_n K[j][n]
    uint64_t a = 0, b = 0;
    for (int n = 0; n < N; n++) {
      a += t.mine[j * N + n];
      b += t.K[j * N + n];
    }
    ok &= a <= INT_MAX && b <= INT_MAX && send_total <= INT_MAX && fwd_total <= INT_MAX;
    t.ci[j] = ok ? (int)a : 0;
    t.di[j] = ok ? (int)send_total : 0;
    t.cir[j] = ok ? (int)b : 0;
    t.dir[j] = ok ? (int)fwd_total : 0;
    send_total += a;
    fwd_total += b;
  }
  for (int n = 0; n < N; n++) {  // inter: to (n,l) sum_j K[j][n]; from (n,l) its G blocks
    uint64_t a = 0, b = 0;
    for (int j = 0; j < G; j++) {
      a += t.K[j * N + n];
      b += recv_counts[n * G + j];
    }
    t.sum[n] = a;
    t.sum[N + n] = b;
  }
  size_t fwd_check = 0;  // equals fwd_total
  ok &= moe_a2a_int_layout(t.sum, N, t.ce, t.de, &fwd_check);
  ok &= moe_a2a_int_layout(t.sum + N, N, t.cer, t.der, &recv_total);
  // Step 4 can write straight into recv when its non-empty blocks are packed in
  // source-rank order: then t.der are the offsets from the first one.
  int direct_recv = 1, seen = 0;
  size_t base = 0, pos = 0;
  for (int s = 0; s < P; s++) {
    if (recv_counts[s] == 0) continue;
    if (!seen) base = pos = recv_displs[s];
    seen = 1;
    if (recv_displs[s] != pos) {
      direct_recv = 0;
      break;
    }
    pos += recv_counts[s];
  }
  int bad = !ok;
  MOE_MPI_TRY(ctx, MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, g->comm));
  MOE_FAIL_IF(ctx, bad, MOE_STATUS_INVALID_ARG,
              "2dh: a node-aggregated block or offset exceeds MPI's int counts (%d bytes) on %s "
              "rank (here: %zu bytes sent, %zu forwarded, %zu received); use pipe, pairwise or "
              "grouped, which send blocks separately",
              INT_MAX, ok ? "another" : "this", send_total, fwd_total, recv_total);
  // Data region: X holds the packed send (step 1), then the transposed forward
  // buffer (step 3); Y holds the intra receive (step 2), then the inter receive
  // unless that goes straight into recv.
  const size_t xb = moe_align64(send_total > fwd_total ? send_total : fwd_total);
  size_t yb = fwd_total;
  if (!direct_recv && recv_total > yb) yb = recv_total;
  MOE_TRY(moe_workspace_reserve_keep(ctx, ws, meta_bytes + xb + moe_align64(yb), meta_bytes));
  t = carve_tables(ws->buf, P, N, G);
  char *const X = (char *)ws->buf + meta_bytes, *const Y = X + xb;
  // ---- step 1: pack tmp[j][n] = my block for (n, j) ----------------------------------
  size_t off = 0;
  for (int j = 0; j < G; j++) {
    for (int n = 0; n < N; n++) {
      const int d = n * G + j;
      if (send_counts[d] > 0) {
        memcpy(X + off, (const char *)send + send_displs[d], send_counts[d]);
        off += send_counts[d];
      }
    }
  }
  // ---- step 2: intra-node all-to-all -------------------------------------------------------
  MOE_MPI_TRY(ctx, MPI_Alltoallv(X, t.ci, t.di, MPI_BYTE, Y, t.cir, t.dir, MPI_BYTE, g->intra));
  // ---- step 3: transpose buf[j][n] -> tmp[n][j] --------------------------------------------
  for (int n = 0; n < N; n++) t.cur[n] = (uint64_t)t.de[n];
  off = 0;
  for (int j = 0; j < G; j++) {
    for (int n = 0; n < N; n++) {
      const size_t k = t.K[j * N + n];
      if (k > 0) {
        memcpy(X + t.cur[n], Y + off, k);
        t.cur[n] += k;
        off += k;
      }
    }
  }
  // ---- step 4: inter-node all-to-all -------------------------------------------------------
  char *rbase = Y;
  if (direct_recv) rbase = recv_total > 0 ? (char *)recv + base : (char *)recv;
  MOE_MPI_TRY(ctx, MPI_Alltoallv(X, t.ce, t.de, MPI_BYTE, rbase, t.cer, t.der, MPI_BYTE, g->inter));
  // ---- step 5: final layout ----------------------------------------------------------------
  if (!direct_recv) {
    off = 0;
    for (int s = 0; s < P; s++) {
      if (recv_counts[s] > 0) {
        memcpy((char *)recv + recv_displs[s], Y + off, recv_counts[s]);
        off += recv_counts[s];
      }
    }
  }
done:
  return st;
}
#endif  // MOE_HAVE_MPI

const moe_a2a_algo moe_a2a_2dh = {
    .name = "2dh",
    .source = "Tutel/DeepSpeed 2D hierarchical",
    .cost =
        "2(G-1)*alpha_intra + (G-1)/G*n*beta_intra + (N-1)*alpha_inter + (N-1)/N*n*beta_inter + "
        "log2(P)*alpha",
    .needs_uniform_nodes = 1,
    .workspace_copies = 2,  // X (send/forward) and Y (intra/inter receive), <= G*n each
    .plannable = 1,
    .model = h2d_cost,
    MOE_A2A_FNS(moe_alltoallv_2dh, NULL)};
