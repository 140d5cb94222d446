// grouped: FasterMoE's grouped pairwise exchange (PPoPP'22; fastmoe
// `smart_schedule.h`, group size FMOE_FASTER_GROUP_SIZE). The members form
// groups of gs consecutive ranks; in step j my group exchanges with group
// (gi+j) mod n (send) and group (gi-j) mod n (receive), every pair between the
// groups at once. A step is a shifted exchange of whole groups, so each step's
// traffic is a matching between groups (no incast), and with groups equal to
// nodes, step 0 is the intra-node exchange and every later step crosses the
// network once per rank pair. FasterMoE uses the steps to pipeline expert
// computation; this file is the communication alone.
//
// gs = g->grouped_size, or when 0 the members of one node (local_size) if the
// nodes are uniform, else 1; capped at P. When gs does not divide P the last
// group is smaller: the schedule is the same (group of rank q = q / gs), and
// pairs of groups still match up step by step. Works for any node layout.
// grouped_size must be the same on every member (negative: INVALID_ARG).
//
// Steps (n = ceil(P / gs) groups, gi = rank / gs):
//   j = 0..n-1: to = group (gi+j) mod n, from = group (gi-j+n) mod n;
//     Irecv from every member of `from`, Isend to every member of `to`
//     (my own block is a memcpy), then Waitall. Empty blocks are not sent.
// Cost: ceil(P/gs)*alpha + (P-gs)/P*n*beta_inter + (gs-1)/P*n*beta_intra, n =
//   bytes a rank sends, with groups = nodes; each step costs one latency since
//   its gs messages per rank are concurrent.
#include "comm/comm_internal.h"

// Cost model: its steps run one after the other, the node's own first (ScheMoE
// eq. 17): t_intra + t_inter.
static double grouped_cost(const moe_a2a_cost_params *p) { return p->t_intra_s + p->t_inter_s; }

#if MOE_HAVE_MPI

static moe_status moe_alltoallv_grouped(MOE_A2A_ARGS) {
  moe_status st = MOE_STATUS_OK;
  const int P = g->size, r = g->rank;
  MOE_FAIL_IF(ctx, g->grouped_size < 0, MOE_STATUS_INVALID_ARG,
              "grouped: group size (%d) must be >= 0 (0: the ranks of one node)", g->grouped_size);
  int gs = g->grouped_size;
  if (gs == 0) gs = g->uniform ? g->local_size : 1;
  if (gs > P) gs = P;
  const int n = (P + gs - 1) / gs, gi = r / gs;
  // Statuses first (MPI_Status may need the stricter alignment), then requests.
  // Waitall gets a real status array, not MPI_STATUSES_IGNORE: MPICH defines that
  // as (MPI_Status *)1 and GCC 12 (-O2, -Werror=stringop-overflow) then reports a
  // write of nr statuses into a region of size 0.
  MOE_TRY(
      moe_workspace_reserve(ctx, ws, 2 * (size_t)gs * (sizeof(MPI_Status) + sizeof(MPI_Request))));
  MPI_Status *stat = ws->buf;
  MPI_Request *req = (MPI_Request *)(stat + 2 * (size_t)gs);
  for (int j = 0; j < n; j++) {
    const int to_g = (gi + j) % n, from_g = (gi - j + n) % n;
    const int to0 = to_g * gs, to1 = to0 + gs < P ? to0 + gs : P;
    const int fr0 = from_g * gs, fr1 = fr0 + gs < P ? fr0 + gs : P;
    int nr = 0;
    // Receives first, starting after my own position so that the members of a
    // group do not all address the same peer first.
    for (int i = 0; i < fr1 - fr0; i++) {
      const int from = fr0 + (r % (fr1 - fr0) + 1 + i) % (fr1 - fr0);
      if (from == r || recv_counts[from] == 0) continue;
      MOE_MPI_TRY(ctx, MPI_Irecv((char *)recv + recv_displs[from], (int)recv_counts[from], MPI_BYTE,
                                 from, MOE_A2A_TAG, g->comm, &req[nr++]));
    }
    for (int i = 0; i < to1 - to0; i++) {
      const int to = to0 + (r % (to1 - to0) + 1 + i) % (to1 - to0);
      if (to == r || send_counts[to] == 0) continue;
      MOE_MPI_TRY(ctx, MPI_Isend((const char *)send + send_displs[to], (int)send_counts[to],
                                 MPI_BYTE, to, MOE_A2A_TAG, g->comm, &req[nr++]));
    }
    if (j == 0) moe_a2a_copy_self(g, send, send_counts, send_displs, recv, recv_displs);
    MOE_MPI_TRY(ctx, MPI_Waitall(nr, req, stat));
  }
done:
  return st;
}
#endif  // MOE_HAVE_MPI

const moe_a2a_algo moe_a2a_grouped = {
    .name = "grouped",
    .source = "FasterMoE grouped pairwise exchange",
    .cost = "ceil(P/gs)*alpha + (P-gs)/P*n*beta_inter + (gs-1)/P*n*beta_intra",
    .needs_uniform_nodes = 0,
    .plannable = 1,
    .model = grouped_cost,
    MOE_A2A_FNS(moe_alltoallv_grouped, NULL)};
