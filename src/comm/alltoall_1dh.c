// 1dh: HetuMoE's hierarchical all-to-all (Hetu `HAllToAllOp`, ScheMoE
// `hetu.cpp`). Every node's leader (local rank 0) gathers the whole send buffer
// of its members, regroups it by destination node, exchanges one aggregate per
// node pair with the other leaders, and scatters each member's result. Only the
// leaders touch the network: N-1 large messages per node instead of many small
// ones, at the price of a G*n-byte buffer and a serial gather/scatter on the
// leader. Needs uniform nodes (P = N nodes x G ranks, rank r = node*G + local).
//
// Variable counts: the leader must know every member's send counts (to regroup)
// and every member's receive counts (to size what the other leaders and the
// scatter deliver), so step 0 gathers both (2P words per member) on the leader;
// no count exchange between leaders is needed, since a member's recv_counts
// already say what each remote rank sends it. Aggregates and their offsets must
// fit MPI's int counts; only the leader knows its node's aggregates, so all ranks
// agree on that check with one MPI_Allreduce of a flag, and an oversized call
// fails with INVALID_ARG on every rank instead of hanging.
//
// Steps (C[s][d] = bytes rank s sends to rank d; leader of node m = rank m*G):
//   0. counts: MPI_Gather of (send_counts, recv_counts) to the leader;
//      allreduce of the int-limit flag over the group
//   1. gather: MPI_Gatherv of each member's send buffer, packed in destination
//      order (sent in place when it already is), into buf1[src_local][dst]
//   2. leader transform: buf2[dst_node][dst_local][src_local] = buf1[src_local][dst]
//   3. leaders' MPI_Alltoallv on g->inter: buf2[m] -> leader of m; receive
//      buf1[src_node][dst_local][src_local] (sizes from the gathered recv_counts)
//   4. leader reverse transform: buf2[dst_local][src_node][src_local], i.e. per
//      member in source-rank order
//   5. scatter: MPI_Scatterv of buf2[l] to local rank l, straight into recv when
//      recv is packed in source-rank order, else unpacked to recv + recv_displs[s]
//   With G == 1 every rank is a leader: then it is one MPI_Alltoallv on g->comm.
// Cost: 3(G-1)*alpha_intra + 2(G-1)*n*beta_intra + (N-1)*alpha_inter +
//   (N-1)/N*G*n*beta_inter + log2(P)*alpha, n = bytes a rank sends (balanced
//   loads): the counts gather, then gather and scatter serialised on the leader's
//   link, the leaders' exchange, and the flag allreduce; plus 2 local copies of
//   G*n bytes on the leader. Leader workspace: about 2 G*n bytes.
#include <limits.h>
#include <string.h>

#include "comm/comm_internal.h"

// Cost model: 2 t_leader + t_inter: the gather to and the scatter from the node
// leader, whose intra link carries the node's whole traffic (the largest node
// volume), then the leaders' inter-node exchange.
static double h1d_cost(const moe_a2a_cost_params *p) {
  const double v = p->max_node_bytes;
  return (v > 0 ? 2.0 * (v / p->intra_bytes_per_s + p->intra_latency_s) : 0.0) + p->t_inter_s;
}

#if MOE_HAVE_MPI

// The workspace's count tables, carved from its start (they survive growth).
typedef struct {
  uint64_t *mine;  // (2P): my send_counts, then my recv_counts
  uint64_t *all;   // (G, 2P): every member's `mine` (leader only)
  uint64_t *sum;   // (2N + G): per-node bytes out, per-node bytes in, per-member bytes
  uint64_t *cur;   // (P): write cursors of the transforms
  int *gc, *gd;    // (G) each: gather counts/displs
  int *sc, *sd;    // (G) each: scatter counts/displs
  int *ec, *ed;    // (N) each: leaders' exchange, send counts/displs
  int *erc, *erd;  // (N) each: leaders' exchange, receive counts/displs
} tables;

static size_t tables_bytes(int P, int N, int G) {
  return moe_align64((2 * (size_t)P + 2 * (size_t)G * P + 2 * (size_t)N + G + P) *
                         sizeof(uint64_t) +
                     (4 * (size_t)G + 4 * (size_t)N) * sizeof(int));
}

static tables carve_tables(void *buf, int P, int N, int G) {
  tables t;
  t.mine = buf;
  t.all = t.mine + 2 * (size_t)P;
  t.sum = t.all + 2 * (size_t)G * P;
  t.cur = t.sum + 2 * (size_t)N + G;
  t.gc = (int *)(t.cur + P);
  t.gd = t.gc + G;
  t.sc = t.gd + G;
  t.sd = t.sc + G;
  t.ec = t.sd + G;
  t.ed = t.ec + N;
  t.erc = t.ed + N;
  t.erd = t.erc + N;
  return t;
}

static moe_status moe_alltoallv_1dh(MOE_A2A_ARGS) {
  moe_status st = MOE_STATUS_OK;
  const int P = g->size, N = g->num_nodes, G = g->local_size, node = g->node;
  const int leader = g->local_rank == 0;
  if (G == 1) {  // every rank leads its own node: a flat exchange
    MOE_TRY(moe_alltoallv_mpi(ctx, g, send, send_counts, send_displs, recv, recv_counts,
                              recv_displs, ws));
    goto done;
  }
  // ---- step 0: counts to the leader ------------------------------------------------------
  const size_t meta_bytes = tables_bytes(P, N, G);
  MOE_TRY(moe_workspace_reserve(ctx, ws, meta_bytes));
  tables t = carve_tables(ws->buf, P, N, G);
  size_t my_send = 0, my_recv = 0;
  for (int r = 0; r < P; r++) {
    t.mine[r] = send_counts[r];
    t.mine[P + r] = recv_counts[r];
    my_send += send_counts[r];
    my_recv += recv_counts[r];
  }
  MOE_MPI_TRY(ctx,
              MPI_Gather(t.mine, 2 * P, MPI_UINT64_T, t.all, 2 * P, MPI_UINT64_T, 0, g->intra));
  size_t base_s = 0, base_r = 0;
  const int direct_send = moe_a2a_packed_in_order(send_counts, send_displs, P, &base_s);
  const int direct_recv = moe_a2a_packed_in_order(recv_counts, recv_displs, P, &base_r);
  int ok = my_send <= INT_MAX && my_recv <= INT_MAX;
  size_t node_send = 0, node_recv = 0;  // leader: bytes of buf1 and of the exchange's receive
  if (leader) {
    // Member j's counts: Cs(j, d) = all[j*2P + d], Cr(j, s) = all[j*2P + P + s].
    uint64_t *out = t.sum, *in = t.sum + N, *mem = t.sum + 2 * N;
    for (int j = 0; j < G; j++) {
      uint64_t a = 0;
      for (int d = 0; d < P; d++) a += t.all[(size_t)j * 2 * P + d];
      mem[j] = a;
    }
    ok &= moe_a2a_int_layout(mem, G, t.gc, t.gd, &node_send);
    for (int m = 0; m < N; m++) {  // to node m: C[(node, js)][(m, jd)] for all jd, js
      uint64_t a = 0, b = 0;
      for (int j = 0; j < G; j++) {
        for (int k = 0; k < G; k++) {
          a += t.all[(size_t)j * 2 * P + m * G + k];      // Cs(j, m*G + k)
          b += t.all[(size_t)j * 2 * P + P + m * G + k];  // Cr(j, m*G + k)
        }
      }
      out[m] = a;
      in[m] = b;
    }
    size_t out_total = 0;
    ok &= moe_a2a_int_layout(out, N, t.ec, t.ed, &out_total);
    ok &= moe_a2a_int_layout(in, N, t.erc, t.erd, &node_recv);
    for (int j = 0; j < G; j++) {
      uint64_t a = 0;
      for (int s = 0; s < P; s++) a += t.all[(size_t)j * 2 * P + P + s];
      mem[j] = a;
    }
    size_t scatter_total = 0;
    ok &= moe_a2a_int_layout(mem, G, t.sc, t.sd, &scatter_total);
  }
  int bad = !ok;
  MOE_MPI_TRY(ctx, MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, g->comm));
  MOE_FAIL_IF(ctx, bad, MOE_STATUS_INVALID_ARG,
              "1dh: a node leader's aggregate or offset exceeds MPI's int counts (%d bytes) on "
              "%s rank (here: %zu bytes sent, %zu received, node %d's leader gathers %zu and "
              "receives %zu); use 2dh, pipe, pairwise or grouped",
              INT_MAX, ok ? "another" : "this", my_send, my_recv, node, node_send, node_recv);
  // Data region. Leader: A holds buf1 (step 1), then the exchange's receive
  // (step 3); B holds buf2 (step 2), then the scatter's source (step 4). Member:
  // M holds the packed send, then the packed receive, when not sent in place.
  size_t data = 0;
  const size_t big = node_send > node_recv ? node_send : node_recv;
  if (leader) {
    data = 2 * moe_align64(big);
  } else {
    if (!direct_send) data = my_send;
    if (!direct_recv && my_recv > data) data = my_recv;
  }
  MOE_TRY(moe_workspace_reserve_keep(ctx, ws, meta_bytes + moe_align64(data), meta_bytes));
  t = carve_tables(ws->buf, P, N, G);
  char *const A = (char *)ws->buf + meta_bytes, *const B = A + moe_align64(big);
  char *const M = A;
  // ---- step 1: gather every member's send buffer ------------------------------------------
  const void *sbuf = direct_send && my_send > 0 ? (const char *)send + base_s : send;
  if (!direct_send) {  // pack in destination order (the leader packs into buf1[0])
    char *dst = leader ? A : M;
    size_t off = 0;
    for (int d = 0; d < P; d++) {
      if (send_counts[d] > 0) {
        memcpy(dst + off, (const char *)send + send_displs[d], send_counts[d]);
        off += send_counts[d];
      }
    }
    sbuf = leader ? MPI_IN_PLACE : M;
  }
  MOE_MPI_TRY(ctx, MPI_Gatherv(sbuf, (int)my_send, MPI_BYTE, A, t.gc, t.gd, MPI_BYTE, 0, g->intra));
  if (leader) {
    // ---- step 2: buf2[m][jd][js] = buf1[js][m*G + jd] --------------------------------------
    for (int m = 0; m < N; m++) {
      size_t off = (size_t)t.ed[m];
      for (int k = 0; k < G; k++) {
        t.cur[m * G + k] = off;
        for (int j = 0; j < G; j++) off += t.all[(size_t)j * 2 * P + m * G + k];
      }
    }
    for (int j = 0; j < G; j++) {
      size_t src = (size_t)t.gd[j];
      for (int d = 0; d < P; d++) {
        const size_t k = t.all[(size_t)j * 2 * P + d];
        if (k > 0) {
          memcpy(B + t.cur[d], A + src, k);
          t.cur[d] += k;
          src += k;
        }
      }
    }
    // ---- step 3: leaders exchange per-node aggregates --------------------------------------
    MOE_MPI_TRY(ctx, MPI_Alltoallv(B, t.ec, t.ed, MPI_BYTE, A, t.erc, t.erd, MPI_BYTE, g->inter));
    // ---- step 4: buf2[jd][n*G + js] = buf1[n][jd][js] ------------------------------------
    for (int k = 0; k < G; k++) t.cur[k] = (uint64_t)t.sd[k];
    size_t src = 0;
    for (int n = 0; n < N; n++) {
      for (int k = 0; k < G; k++) {
        for (int j = 0; j < G; j++) {
          const size_t c = t.all[(size_t)k * 2 * P + P + n * G + j];  // Cr(k, n*G + j)
          if (c > 0) {
            memcpy(B + t.cur[k], A + src, c);
            t.cur[k] += c;
            src += c;
          }
        }
      }
    }
  }
  // ---- step 5: scatter each member's result ------------------------------------------------
  void *rbuf = M;
  if (leader) {
    rbuf = MPI_IN_PLACE;
  } else if (direct_recv) {
    rbuf = my_recv > 0 ? (char *)recv + base_r : recv;
  }
  MOE_MPI_TRY(ctx,
              MPI_Scatterv(B, t.sc, t.sd, MPI_BYTE, rbuf, (int)my_recv, MPI_BYTE, 0, g->intra));
  if (leader || !direct_recv) {  // unpack (the leader's own result is at buf2[0])
    const char *src = leader ? B : M;
    size_t off = 0;
    for (int s = 0; s < P; s++) {
      if (recv_counts[s] > 0) {
        memcpy((char *)recv + recv_displs[s], src + off, recv_counts[s]);
        off += recv_counts[s];
      }
    }
  }
done:
  return st;
}
#endif  // MOE_HAVE_MPI

const moe_a2a_algo moe_a2a_1dh = {
    .name = "1dh",
    .source = "HetuMoE hierarchical (leader gather/exchange/scatter)",
    .cost =
        "3(G-1)*alpha_intra + 2(G-1)*n*beta_intra + (N-1)*alpha_inter + (N-1)/N*G*n*beta_inter + "
        "log2(P)*alpha",
    .needs_uniform_nodes = 1,
    .workspace_copies = 2,  // leader: buf1 and buf2, G*n each (file header)
    .plannable = 1,
    .model = h1d_cost,
    MOE_A2A_FNS(moe_alltoallv_1dh, NULL)};
