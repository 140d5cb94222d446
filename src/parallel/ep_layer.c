// The expert-parallel MoE layer (include/moe/parallel.h): the single-process
// layer's math (src/layer/layer_ops.c) on every rank's own tokens, with the rows
// of each expert sent to the rank that computes it and back.
//
// Forward, on rank r of an EP group of P ranks (E_l = E / P home experts each):
//   1. gate + routing plan on r's T tokens (capacity per source rank)
//   2. one allreduce over the world of the loss statistics (and of an error
//      flag, so a bad input on one rank fails every rank instead of hanging)
//   3. dispatch rows in expert order; counts exchange (P x E ints, alltoall)
//   4. all-to-all of the rows, ordered (destination, expert, slot) on the send
//      side and (source, expert, slot) on the receive side
//   5. receive side: rows regrouped expert-major, one FFN per expert over all of
//      its rows (home experts, and replicas for the rank's own tokens)
//   6. all-to-all back, combine
// Backward runs the same exchanges with the gradients, then reduces: gate
// gradients over the world, replica gradients into their home, and home expert
// gradients over the DP replicas (ranks with the same EP index).
//
// Not here: chunking and overlap (sched/), load-balancing planners (balance/).
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/kernels.h"
#include "moe/layer_ops.h"
#include "moe/parallel.h"
#include "parallel/parallel_internal.h"

void moe_parallel_config_default(moe_parallel_config *pc) {
  memset(pc, 0, sizeof *pc);
  pc->ep_size = 1;
  snprintf(pc->a2a, sizeof pc->a2a, "mpi");                   // catalogue: default
  snprintf(pc->schedule, sizeof pc->schedule, "sequential");  // catalogue: default
  pc->chunks = 1;
  snprintf(pc->compress, sizeof pc->compress, "none");  // catalogue: default
  pc->exec = moe_executor_config_default();
}

moe_status moe_gate_spec_parse(moe_ctx *ctx, const char *spec, double *topo_gate) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !spec || !topo_gate, MOE_STATUS_INVALID_ARG, "gate spec must be given");
  if (strcmp(spec, "plain") == 0) {
    *topo_gate = 0;
  } else if (strcmp(spec, "topo") == 0) {
    *topo_gate = MOE_TOPO_GATE_DEFAULT;
  } else if (strncmp(spec, "topo:", 5) == 0) {
    char *end = NULL;
    errno = 0;
    const double r = strtod(spec + 5, &end);
    MOE_FAIL_IF(ctx, errno != 0 || end == spec + 5 || *end != '\0' || !(r > 0 && r <= 1),
                MOE_STATUS_INVALID_ARG,
                "gate '%s': the ratio W_net/W_local must be a number in (0, 1]", spec);
    *topo_gate = r;
  } else {
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
             "gate '%s' is unknown (valid: plain, topo, topo:RATIO with RATIO in (0, 1])", spec);
  }
done:
  return st;
}

void moe_gate_spec_to_string(double topo_gate, char *buf, size_t len) {
  if (topo_gate > 0) {
    snprintf(buf, len, "topo:%g", topo_gate);
  } else {
    snprintf(buf, len, "plain");
  }
}

uint64_t moe_parallel_fnv1a_(const void *data, size_t n, uint64_t h) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t moe_parallel_layer_hash_(const moe_layer_config *cfg) {
  char text[1024];
  if (moe_layer_config_to_json(NULL, cfg, text, sizeof text) != MOE_STATUS_OK) text[0] = '\0';
  return moe_parallel_fnv1a_(text, strlen(text), 1469598103934665603ull);
}

moe_status moe_parallel_ordered_gate_sums_(moe_ctx *ctx, const moe_gate_buffers *gb, int E, int sl,
                                           int tokens, double *slice_sums, int max_slices,
                                           double *stats, MPI_Comm comm) {
  moe_status st = MOE_STATUS_OK;
  const int slices = tokens / sl;
  for (int q = 0; q < slices; q++) {
    double *o = slice_sums + (size_t)q * (size_t)(E + 1);
    for (int e = 0; e < E; e++) {
      double pe = 0.0;
      for (int t = q * sl; t < (q + 1) * sl; t++) pe += gb->probs[(size_t)t * E + e];
      o[e] = pe;
    }
    double z = 0.0;
    for (int t = q * sl; t < (q + 1) * sl; t++) z += (double)gb->lse[t] * gb->lse[t];
    o[E] = z;
  }
  double *out = slice_sums + (size_t)max_slices * (size_t)(E + 1);  // the spare row
  MOE_TRY(moe_sum_slices_ordered(ctx, slice_sums, slices, E + 1, out, comm,
                                 "the gate's loss statistics"));
  for (int e = 0; e < E; e++) stats[E + e] = out[e];
  stats[2 * E] = out[E];
done:
  return st;
}

moe_status moe_parallel_same_config_(moe_ctx *ctx, MPI_Comm world, uint64_t h, const char *what) {
  moe_status st = MOE_STATUS_OK;
  int W = 1;
  uint64_t *hashes = NULL;
  MOE_MPI_TRY(ctx, MPI_Comm_size(world, &W));
  hashes = moe_malloc((size_t)W * sizeof(uint64_t));
  MOE_FAIL_IF(ctx, !hashes, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate %d hashes", W);
  MOE_MPI_TRY_OP(ctx, "MoE layer setup",
                 MPI_Allgather(&h, 1, MPI_UINT64_T, hashes, 1, MPI_UINT64_T, world));
  for (int r = 1; r < W; r++) {
    MOE_FAIL_IF(ctx, hashes[r] != hashes[0], MOE_STATUS_INVALID_ARG,
                "the layer or %s configuration differs between ranks (rank %d differs from rank "
                "0); every rank must pass the same configuration",
                what, r);
  }
done:
  moe_free(hashes);
  return st;
}

static uint64_t config_hash(const moe_layer_config *c, const moe_parallel_config *pc) {
  uint64_t h = moe_parallel_layer_hash_(c);
  const int ints[9] = {pc->ep_size,      pc->ep_strided, pc->ranks_per_node,
                       pc->grouped_size, pc->chunks,     pc->compress_backward,
                       pc->copy_slots,   pc->defer_agg,  pc->frozen_params};
  h = moe_parallel_fnv1a_(ints, sizeof ints, h);
  h = moe_parallel_fnv1a_(&pc->topo_gate, sizeof pc->topo_gate, h);
  h = moe_parallel_fnv1a_(pc->schedule, strnlen(pc->schedule, sizeof pc->schedule), h);
  h = moe_parallel_fnv1a_(pc->compress, strnlen(pc->compress, sizeof pc->compress), h);
  return moe_parallel_fnv1a_(pc->a2a, strnlen(pc->a2a, sizeof pc->a2a), h);
}

// The topology-aware gate's locality (pc.topo_gate): expert e is local when
// its home EP rank is on this rank's node; the share of choices allowed off
// the node is topo_gate / (the group's ranks on this node). Nothing to do
// (topo_local NULL) when every expert is local.
static moe_status topo_gate_init(moe_ep_layer *L) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  if (!(L->pc.topo_gate > 0)) goto done;
  const int my_node = L->ep.node_of[L->me];
  int all_local = 1;
  L->topo_local = moe_malloc((size_t)L->E);
  L->topo_scratch = moe_malloc(MOE_TOPO_SCRATCH_BYTES(L->cfg.tokens, L->cfg.top_k));
  MOE_FAIL_IF(ctx, !L->topo_local || !L->topo_scratch, MOE_STATUS_OUT_OF_MEMORY,
              "topology-aware gate: out of memory");
  for (int e = 0; e < L->E; e++) {
    L->topo_local[e] = L->ep.node_of[L->placement.home[e]] == my_node;
    all_local &= L->topo_local[e];
  }
  L->topo_share = L->pc.topo_gate / L->ep.node_size[my_node];
  if (all_local) {  // one node: the plain gate
    moe_free(L->topo_local);
    moe_free(L->topo_scratch);
    L->topo_local = NULL;
    L->topo_scratch = NULL;
  }
done:
  return st;
}

// MPI counts are int: move large float arrays in chunks of at most 2^30.
#define MOE_MPI_CHUNK ((size_t)1 << 30)

static moe_status allreduce_sum(moe_ctx *ctx, float *buf, size_t n, MPI_Comm comm) {
  moe_status st = MOE_STATUS_OK;
  for (size_t i = 0; i < n; i += MOE_MPI_CHUNK) {
    const int c = (int)(n - i < MOE_MPI_CHUNK ? n - i : MOE_MPI_CHUNK);
    MOE_MPI_TRY_OP(ctx, "all-reduce of the MoE layer's gradients",
                   MPI_Allreduce(MPI_IN_PLACE, buf + i, c, MPI_FLOAT, MPI_SUM, comm));
  }
done:
  return st;
}

static moe_status local_checks(moe_ctx *ctx, int world_size, const moe_layer_config *cfg,
                               const moe_parallel_config *pc, const moe_a2a_algo **algo,
                               const moe_schedule_algo **sched, moe_compressor *comp) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(moe_layer_config_validate(ctx, cfg));
  MOE_FAIL_IF(ctx, pc->ep_size < 1 || pc->ep_size > world_size, MOE_STATUS_INVALID_ARG,
              "EP size (%d) must be in [1, %d] (the number of ranks)", pc->ep_size, world_size);
  MOE_FAIL_IF(ctx, world_size % pc->ep_size != 0, MOE_STATUS_INVALID_ARG,
              "ranks (%d) must be divisible by the EP size (%d)", world_size, pc->ep_size);
  MOE_FAIL_IF(ctx, cfg->num_experts % pc->ep_size != 0, MOE_STATUS_INVALID_ARG,
              "experts (%d) must be divisible by EP ranks (%d)", cfg->num_experts, pc->ep_size);
  MOE_FAIL_IF(
      ctx,
      pc->ranks_per_node < 0 || (pc->ranks_per_node > 0 && world_size % pc->ranks_per_node != 0),
      MOE_STATUS_INVALID_ARG, "ranks per node (%d) must divide the number of ranks (%d)",
      pc->ranks_per_node, world_size);
  MOE_FAIL_IF(ctx, pc->grouped_size < 0, MOE_STATUS_INVALID_ARG,
              "grouped all-to-all group size (%d) must be >= 0", pc->grouped_size);
  MOE_TRY(moe_a2a_find(ctx, pc->a2a, algo));
  MOE_FAIL_IF(ctx, !memchr(pc->schedule, 0, sizeof pc->schedule), MOE_STATUS_INVALID_ARG,
              "schedule name is not NUL-terminated");
  MOE_FAIL_IF(ctx, !memchr(pc->compress, 0, sizeof pc->compress), MOE_STATUS_INVALID_ARG,
              "compressor spec is not NUL-terminated");
  MOE_TRY(moe_schedule_algo_find(ctx, pc->schedule, sched));
  MOE_FAIL_IF(ctx, pc->chunks < 1 || pc->chunks > MOE_MAX_CHUNKS, MOE_STATUS_INVALID_ARG,
              "chunks (%d) must be in [1, %d]", pc->chunks, MOE_MAX_CHUNKS);
  MOE_FAIL_IF(ctx, pc->slice_tokens < 0 || pc->slice_tokens > cfg->tokens, MOE_STATUS_INVALID_ARG,
              "slice_tokens (%d) must be in [0, %d] (the layer's tokens; 0 = off)",
              pc->slice_tokens, cfg->tokens);
  MOE_FAIL_IF(ctx, pc->compress_backward != 0 && pc->compress_backward != 1, MOE_STATUS_INVALID_ARG,
              "compress_backward (%d) must be 0 or 1", pc->compress_backward);
  MOE_FAIL_IF(
      ctx, pc->copy_slots < 0 || pc->copy_slots > cfg->num_experts - cfg->num_experts / pc->ep_size,
      MOE_STATUS_INVALID_ARG,
      "copy_slots (%d) must be in [0, %d] (the experts an EP rank does not hold)", pc->copy_slots,
      cfg->num_experts - cfg->num_experts / pc->ep_size);
  MOE_FAIL_IF(ctx, pc->defer_agg != 0 && pc->defer_agg != 1, MOE_STATUS_INVALID_ARG,
              "defer_agg (%d) must be 0 or 1", pc->defer_agg);
  MOE_FAIL_IF(ctx, pc->frozen_params != 0 && pc->frozen_params != 1, MOE_STATUS_INVALID_ARG,
              "frozen_params (%d) must be 0 or 1", pc->frozen_params);
  MOE_FAIL_IF(ctx, !(pc->topo_gate >= 0 && pc->topo_gate <= 1), MOE_STATUS_INVALID_ARG,
              "topology-aware gate ratio W_net/W_local (%g) must be in (0, 1] (0: off)",
              pc->topo_gate);
  MOE_TRY(moe_compressor_get(ctx, pc->compress, comp));
  {
    int level = MPI_THREAD_SINGLE;
    MOE_MPI_TRY(ctx, MPI_Query_thread(&level));
    MOE_FAIL_IF(ctx, level < MPI_THREAD_SERIALIZED, MOE_STATUS_INVALID_ARG,
                "the EP layer runs its all-to-alls on a communication thread: initialise MPI "
                "with MPI_Init_thread and MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE "
                "(provided level: %d)",
                level);
  }
done:
  return st;
}

static moe_status alloc_tables(moe_ctx *ctx, moe_ep_layer *L) {
  moe_status st = MOE_STATUS_OK;
  const size_t E = (size_t)L->E, P = (size_t)L->P;
  void **ptrs[] = {(void **)&L->w1_of,  (void **)&L->b1_of,  (void **)&L->w2_of,
                   (void **)&L->b2_of,  (void **)&L->dw1_of, (void **)&L->db1_of,
                   (void **)&L->dw2_of, (void **)&L->db2_of, (void **)&L->replica_mem};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) {
    *ptrs[i] = moe_calloc(E, sizeof(float *));
    MOE_FAIL_IF(ctx, !*ptrs[i], MOE_STATUS_OUT_OF_MEMORY, "cannot allocate expert tables");
  }
  L->cnt_send = moe_calloc(P * (E + 1), sizeof(int));
  L->cnt_recv = moe_calloc(P * (E + 1), sizeof(int));
  L->stats = moe_calloc(MOE_LOSS_STATS(E) + 1 + E, sizeof(double));
  MOE_FAIL_IF(ctx, !L->cnt_send || !L->cnt_recv || !L->stats, MOE_STATUS_OUT_OF_MEMORY,
              "cannot allocate count tables for %zu ranks", P);
  if (L->pc.slice_tokens > 0) {
    const int slices = (L->cfg.tokens + L->pc.slice_tokens - 1) / L->pc.slice_tokens;
    L->max_slices = slices;
    L->slice_sums = moe_calloc((size_t)(slices + 1) * (E + 1), sizeof(double));  // + the total
    MOE_FAIL_IF(ctx, !L->slice_sums, MOE_STATUS_OUT_OF_MEMORY,
                "cannot allocate the per-slice gate sums (%d slices)", slices);
    MOE_TRY(moe_pairwise_init(ctx, &L->gate_pw, (size_t)L->cfg.model_dim * E, slices));
  }
done:
  return st;
}

static moe_status alloc_buffers(moe_ctx *ctx, moe_ep_layer *L) {
  moe_status st = MOE_STATUS_OK;
  const moe_layer_config *c = &L->cfg;
  const size_t T = (size_t)c->tokens, M = (size_t)c->model_dim, H = (size_t)c->hidden_dim,
               E = (size_t)c->num_experts, K = (size_t)c->top_k, El = (size_t)L->El;
  const size_t R = moe_layer_max_rows(c);
  L->max_rows = (int)R;
  moe_ep_tensors *t = &L->t;
  const moe_tensor_spec params[] = {
      {"wg", M * E, &t->wg},
      {"w1", El * M * H, &t->w1},
      {"b1", El * H, &t->b1},
      {"w2", El * H * M, &t->w2},
      {"b2", El * M, &t->b2},
      {"dwg", M * E, &t->dwg},
      {"dw1", El * M * H, &t->dw1},
      {"db1", El * H, &t->db1},
      {"dw2", El * H * M, &t->dw2},
      {"db2", El * M, &t->db2},
      {"grad_scratch", M * E + El * (2 * M * H + H + M), &L->grad_scratch},
      {"router_bias", E, &t->router_bias},
  };
  const moe_tensor_spec work[] = {
      {"logits", T * E, &L->logits},
      {"probs", T * E, &L->probs},
      {"lse", T, &L->lse},
      {"topk_p", T * K, &L->topk_p},
      {"xe", R * M, &L->xe},
      {"ye", R * M, &L->ye},
      {"dye", R * M, &L->dye},
      {"dweight", T * K, &L->dweight},
      {"dprobs", T * E, &L->dprobs},
      {"dlogits", T * E, &L->dlogits},
      {"sendbuf", R * M, &L->sendbuf},
  };
  const int np = (int)(sizeof params / sizeof params[0]), nw = (int)(sizeof work / sizeof work[0]);
  MOE_TRY(moe_arena_init(ctx, &L->params, moe_tensor_table_bytes(params, np)));
  MOE_TRY(moe_arena_init(ctx, &L->work, moe_tensor_table_bytes(work, nw)));
  MOE_TRY(moe_tensor_table_carve(ctx, &L->params, params, np));
  MOE_TRY(moe_tensor_table_carve(ctx, &L->work, work, nw));
  L->grad_gate_n = M * E;
  L->grad_home_n = El * (2 * M * H + H + M);
  t->home_first = L->me * L->El;
  t->home_count = L->El;
  for (int i = 0; i < L->El; i++) {
    const int e = t->home_first + i;
    L->w1_of[e] = t->w1 + (size_t)i * M * H;
    L->b1_of[e] = t->b1 + (size_t)i * H;
    L->w2_of[e] = t->w2 + (size_t)i * H * M;
    L->b2_of[e] = t->b2 + (size_t)i * M;
  }
done:
  return st;
}

// The task graphs, schedules, executor and group tables, not sized one by one:
// measured 5.6 KiB at r = 1 plus 1.2-1.6 KiB per further chunk (P = 1..4;
// tests/test_membound_mpi.c checks the total).
#define MOE_EP_FIXED_BYTES(r) ((double)(6144 + 2048 * (r)))

// The receive rows of the estimate: balanced (what the rank sends) and the
// most it can be (every source sends all it can to this rank's experts).
static void recv_rows_bound(const moe_layer_config *c, int P, size_t *balanced, size_t *worst) {
  const size_t T = (size_t)c->tokens, K = (size_t)c->top_k, El = (size_t)(c->num_experts / P);
  const size_t R = moe_layer_max_rows(c);
  size_t per_src = T * (K < El ? K : El);
  const int cap = moe_layer_capacity(c, c->tokens);
  if (cap >= 0 && El * (size_t)cap < per_src) per_src = El * (size_t)cap;
  *balanced = R;
  *worst = (size_t)P * per_src;
}

moe_status moe_ep_layer_memory(moe_ctx *ctx, const moe_layer_config *cfg,
                               const moe_parallel_config *pc, int world_size, int ranks_per_node,
                               moe_memory_need *out) {
  moe_status st = MOE_STATUS_OK;
  const moe_a2a_algo *algo = NULL;
  const moe_schedule_algo *sched = NULL;
  moe_compressor comp;
  MOE_FAIL_IF(ctx, !cfg || !pc || !out, MOE_STATUS_INVALID_ARG, "cfg, pc and out must be given");
  memset(out, 0, sizeof *out);
  MOE_TRY(moe_layer_config_validate(ctx, cfg));
  MOE_FAIL_IF(ctx, pc->ep_size < 1 || world_size < pc->ep_size, MOE_STATUS_INVALID_ARG,
              "EP size (%d) must be in [1, %d] (the number of ranks)", pc->ep_size, world_size);
  MOE_FAIL_IF(ctx, cfg->num_experts % pc->ep_size != 0, MOE_STATUS_INVALID_ARG,
              "experts (%d) must be divisible by EP ranks (%d)", cfg->num_experts, pc->ep_size);
  MOE_FAIL_IF(ctx, pc->chunks < 1 || pc->chunks > MOE_MAX_CHUNKS, MOE_STATUS_INVALID_ARG,
              "chunks (%d) must be in [1, %d]", pc->chunks, MOE_MAX_CHUNKS);
  MOE_TRY(moe_a2a_find(ctx, pc->a2a, &algo));
  MOE_TRY(moe_compressor_get(ctx, pc->compress, &comp));
  MOE_TRY(moe_schedule_algo_find(ctx, pc->schedule, &sched));
  {
    const int P = pc->ep_size;
    const size_t T = (size_t)cfg->tokens, M = (size_t)cfg->model_dim, H = (size_t)cfg->hidden_dim,
                 E = (size_t)cfg->num_experts, K = (size_t)cfg->top_k, El = E / (size_t)P,
                 R = moe_layer_max_rows(cfg);
    size_t rbal = 0, rworst = 0;
    recv_rows_bound(cfg, P, &rbal, &rworst);
    // peer-group chunking runs one chunk per group of G ranks (ep_pass.c)
    const int G = ranks_per_node > 0 && ranks_per_node < P ? ranks_per_node : P;
    const int gsz = pc->grouped_size > 0 ? (pc->grouped_size < P ? pc->grouped_size : P) : G;
    const size_t r = sched->chunking == MOE_CHUNK_PEER_GROUPS ? (size_t)((P + gsz - 1) / gsz)
                                                              : (size_t)pc->chunks;
#define A(n) ((double)moe_align64((size_t)(n)))
#define F(n) A((size_t)(n) * sizeof(float))
    // alloc_buffers: the parameter arena (params, grads, grad_scratch), the work arena
    out->bytes[MOE_MEM_PARAMS] = F(M * E) + F(El * M * H) + F(El * H) + F(El * H * M) + F(El * M);
    out->bytes[MOE_MEM_GRADS] = out->bytes[MOE_MEM_PARAMS] + F(M * E + El * (2 * M * H + H + M)) +
                                A((2 * M * H + H + M) * sizeof(float));  // + rep_tmp
    if (pc->copy_slots > 0) {  // ep_placement.c: the slots (parameters, then gradients)
      const size_t nf = 2 * M * H + H + M, S = (size_t)pc->copy_slots;
      out->bytes[MOE_MEM_PARAMS] += F(S * 2 * nf) / 2;
      out->bytes[MOE_MEM_GRADS] += F(S * 2 * nf) / 2;
      out->bytes[MOE_MEM_WORKSPACE] += A(S * sizeof(int)) + A(E * sizeof(int)) +
                                       A(4 * E * (size_t)P * sizeof(MPI_Request)) +
                                       A(4 * E * (size_t)P * sizeof(MPI_Status)) +
                                       A(2 * sizeof(moe_task));  // Trans/Agg trace graph
      if (pc->defer_agg) {  // the copies' gradients arriving at this home, the requests
        const size_t most = El * (size_t)(P - 1), by_slots = S * (size_t)(P - 1);
        const size_t n_in = most < by_slots ? most : by_slots;
        out->bytes[MOE_MEM_GRADS] += F((n_in > 0 ? n_in : 1) * nf);
        out->bytes[MOE_MEM_WORKSPACE] +=
            A(E * (size_t)P * sizeof(MPI_Request)) + A(E * (size_t)P * sizeof(MPI_Status));
      }
    }
    if (pc->topo_gate > 0)  // the gate's locality mask and scratch
      out->bytes[MOE_MEM_WORKSPACE] += A(E) + A(MOE_TOPO_SCRATCH_BYTES(T, K));
    const double act = 2 * F(T * E) + F(T) + F(T * K) + 3 * F(R * M) + F(T * K) + 2 * F(T * E);
    const double a2a = F(R * M);  // sendbuf
    // ep_pass.c: the receive side, grown to the most rows received: sized here
    // for the most that can arrive (rworst); skew_bytes is what a balanced
    // routing (rbal rows) would not need.
    double recv_act[2], recv_a2a[2];
    const size_t recv_rows[2] = {rworst, rbal};
    for (int i = 0; i < 2; i++) {
      const double rows = (double)(recv_rows[i] ? recv_rows[i] : 1);
      recv_act[i] = rows * M * 4 + 4 * rows * H * 4;  // ex_x; pre, h (fwd); dh, dpre (bwd)
      recv_a2a[i] = 2 * rows * M * 4;                 // bufa, bufb
      if (!moe_compressor_is_identity(&comp)) {       // csend, crecv
        const double pad = 64.0 * (double)r * P;
        recv_a2a[i] += (double)moe_compress_max_bytes(&comp, R, M) + pad +
                       (double)moe_compress_max_bytes(&comp, recv_rows[i], M) + pad;
      }
      if (algo->workspace_copies > 0) {
        // A node's payload in one call (one chunk): its G ranks' sends, or
        // what they receive, which no more than all P ranks' sends.
        const double gr = (double)G * R, all = (double)P * R;
        const double in = (double)G * recv_rows[i] < all ? (double)G * recv_rows[i] : all;
        const double node_rows = (gr > in ? gr : in) / (double)r + (double)E;
        // x 2: a growing workspace keeps its old block until the new one holds
        // its tables (moe_workspace_reserve_keep), so both live for a moment
        recv_a2a[i] += 2.0 * (double)algo->workspace_copies * node_rows * M * 4;
      }
    }
    out->bytes[MOE_MEM_ACTIVATIONS] = act + recv_act[0];
    out->bytes[MOE_MEM_A2A] = a2a + recv_a2a[0];
    out->skew_bytes = recv_act[0] + recv_a2a[0] - recv_act[1] - recv_a2a[1];
    // tables, routing plan, placement, counts, the chunk plan and task records
    const size_t n3 = r * (size_t)P * E, n2 = r * (size_t)P, max_tasks = MOE_CT_KINDS * r;
    out->bytes[MOE_MEM_WORKSPACE] +=
        F(E) /* router_bias, in the parameter arena */ + A(sizeof(moe_ep_layer)) +
        A((size_t)world_size * 8) + A((size_t)world_size * 4) +
        (double)moe_placement_bytes((int)E, P) + 9 * A(E * sizeof(float *)) +
        2 * A((size_t)P * (E + 1) * sizeof(int)) + A((MOE_LOSS_STATS(E) + 1 + E) * sizeof(double)) +
        (double)moe_route_bytes(cfg->tokens, cfg->top_k, (int)E, (int)R) + 3 * A(n3 * sizeof(int)) +
        3 * A(n3 * sizeof(size_t)) + 10 * A(n2 * sizeof(size_t)) + 2 * A(r * E * sizeof(size_t)) +
        2 * A(r * sizeof(size_t)) + 2 * A((r + 1) * sizeof(size_t)) +
        A(2 * r * sizeof(moe_ep_task_arg)) + 2 * A(max_tasks * sizeof(moe_task_record)) +
        MOE_EP_FIXED_BYTES(r);
    if (pc->slice_tokens > 0) {  // alloc_tables: the fixed-order sums' tables
      const size_t slices = (T + (size_t)pc->slice_tokens - 1) / (size_t)pc->slice_tokens;
      out->bytes[MOE_MEM_WORKSPACE] += A((slices + 1) * (E + 1) * sizeof(double)) +
                                       (double)moe_pairwise_bytes(M * E, (int)slices);
      // moe_allreduce_fixed's receive buffers, kept (fixed_home over DP, fixed_gate over the
      // world; rank 0 has a partner in both whenever they have two ranks)
      if (world_size / P > 1) out->bytes[MOE_MEM_GRADS] += F(El * (2 * M * H + H + M));
      if (world_size > 1) out->bytes[MOE_MEM_GRADS] += F(M * E);
    }
#undef A
#undef F
  }
done:
  return st;
}

moe_status moe_ep_layer_create(moe_ctx *ctx, MPI_Comm world, const moe_layer_config *cfg,
                               const moe_parallel_config *pc, moe_ep_layer **out) {
  moe_status st = MOE_STATUS_OK;
  moe_ep_layer *L = NULL;
  int *nodes = NULL;
  int W = 0, rank = 0;
  if (out) *out = NULL;
  MOE_MPI_TRY(ctx, MPI_Comm_size(world, &W));
  MOE_MPI_TRY(ctx, MPI_Comm_rank(world, &rank));
  // step 1: local checks, then one collective that every rank reaches
  const moe_a2a_algo *algo = NULL;
  const moe_schedule_algo *sched = NULL;
  moe_compressor comp;
  memset(&comp, 0, sizeof comp);
  moe_status local = MOE_STATUS_OK;
  if (!out || !cfg || !pc) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                         "out, cfg and pc must not be NULL");
  } else {
    local = local_checks(ctx, W, cfg, pc, &algo, &sched, &comp);
  }
  MOE_TRY(moe_comm_agree(ctx, world, local, "layer setup"));
  // step 2: identical configuration everywhere
  MOE_TRY(moe_parallel_same_config_(ctx, world, config_hash(cfg, pc), "parallel"));
  L = moe_calloc(1, sizeof *L);
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate the layer");
  L->ctx = ctx;
  L->cfg = *cfg;
  L->pc = *pc;
  L->world = L->dp = MPI_COMM_NULL;
  L->a2a = algo;
  moe_expert_kind_find(ctx, cfg->expert, &L->expert);  // validated by local_checks
  L->sched = sched;
  L->comp = comp;
  L->compress_on = !moe_compressor_is_identity(&comp);
  L->E = cfg->num_experts;
  L->P = pc->ep_size;
  L->El = L->E / L->P;
  const int DP = W / L->P;
  const int group = pc->ep_strided ? rank % DP : rank / L->P;
  L->me = pc->ep_strided ? rank / DP : rank % L->P;
  MOE_MPI_TRY_OP(ctx, "MoE layer setup", MPI_Comm_dup(world, &L->world));
  MOE_MPI_TRY(ctx, MPI_Comm_set_errhandler(L->world, MPI_ERRORS_RETURN));
  MOE_MPI_TRY_OP(ctx, "MoE layer setup", MPI_Comm_split(L->world, L->me, group, &L->dp));
  // step 3: topology and the EP group
  nodes = moe_malloc((size_t)W * sizeof(int));
  MOE_FAIL_IF(ctx, !nodes, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate %d node ids", W);
  MOE_TRY(moe_topology_nodes(ctx, L->world, pc->ranks_per_node, nodes));
  {
    MPI_Comm ep_comm = MPI_COMM_NULL;
    MOE_MPI_TRY_OP(ctx, "MoE layer setup", MPI_Comm_split(L->world, group, L->me, &ep_comm));
    const moe_status gst = moe_group_init(ctx, &L->ep, ep_comm, nodes[rank]);
    MPI_Comm_free(&ep_comm);
    MOE_TRY(gst);
  }
  L->ep.grouped_size = pc->grouped_size;
  // Restrictions of the algorithm can differ between EP groups: agree on the world.
  {
    const moe_status ok = moe_a2a_check_topology(ctx, algo, &L->ep);
    MOE_TRY(moe_comm_agree(ctx, L->world, ok, "all-to-all selection"));
  }
  {
    // Allocations can fail on one rank only: agree before handing out a layer
    // whose peers may have given up.
    moe_status alloc = moe_placement_init(ctx, &L->placement, L->E, L->P);
    if (alloc == MOE_STATUS_OK) alloc = alloc_tables(ctx, L);
    if (alloc == MOE_STATUS_OK) alloc = alloc_buffers(ctx, L);
    if (alloc == MOE_STATUS_OK) {
      alloc = moe_route_init(ctx, &L->route, cfg->tokens, cfg->top_k, L->E, L->max_rows);
    }
    if (alloc == MOE_STATUS_OK) alloc = moe_ep_pass_init_(L);
    if (alloc == MOE_STATUS_OK) alloc = moe_ep_copies_init_(L);
    if (alloc == MOE_STATUS_OK) alloc = topo_gate_init(L);
    MOE_TRY(moe_comm_agree(ctx, L->world, alloc, "layer allocation"));
  }
  *out = L;
  L = NULL;
done:
  moe_free(nodes);
  moe_ep_layer_destroy(L);
  return st;
}

void moe_ep_layer_destroy(moe_ep_layer *L) {
  if (!L) return;
  moe_group_free(&L->ep);
  if (L->dp != MPI_COMM_NULL && L->dp != 0) MPI_Comm_free(&L->dp);
  if (L->world != MPI_COMM_NULL && L->world != 0) MPI_Comm_free(&L->world);
  moe_arena_free(&L->params);
  moe_arena_free(&L->work);
  moe_route_free(&L->route);
  moe_placement_free(&L->placement);
  moe_ep_copies_free_(L);  // first: clears the slot copies' replica_mem entries
  if (L->replica_mem) {
    for (int e = 0; e < L->E; e++) moe_free(L->replica_mem[e]);
  }
  moe_ep_pass_free_(L);
  void *tables[] = {L->w1_of,    L->b1_of,  L->w2_of,      L->b2_of,       L->dw1_of,
                    L->db1_of,   L->dw2_of, L->db2_of,     L->replica_mem, L->cnt_send,
                    L->cnt_recv, L->stats,  L->slice_sums, L->topo_local,  L->topo_scratch};
  moe_pairwise_free(&L->gate_pw);
  moe_fixed_sum_free(&L->fixed_home);
  moe_fixed_sum_free(&L->fixed_gate);
  for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) moe_free(tables[i]);
  moe_workspace *ws[] = {&L->bufa, &L->bufb,   &L->ex_x,    &L->pre,   &L->h,    &L->dh,
                         &L->dpre, &L->a2a_ws, &L->rep_tmp, &L->csend, &L->crecv};
  for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) moe_workspace_free(ws[i]);
  moe_free(L);
}

moe_ep_tensors moe_ep_layer_get_tensors(moe_ep_layer *L) { return L->t; }
const moe_group *moe_ep_layer_ep_group(const moe_ep_layer *L) { return &L->ep; }
const moe_placement *moe_ep_layer_get_placement(const moe_ep_layer *L) { return &L->placement; }
const moe_route *moe_ep_layer_get_route(const moe_ep_layer *L) { return &L->route; }

// ---- parameters ------------------------------------------------------------------------

static void init_expert(moe_ep_layer *L, int e, uint64_t seed) {
  const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim;
  const float am = 1.0f / sqrtf((float)M), ah = 1.0f / sqrtf((float)H);
  moe_init_uniform_slice(L->w1_of[e], M * H, seed, MOE_STREAM_W1, (size_t)e * M * H, am);
  moe_init_uniform_slice(L->b1_of[e], H, seed, MOE_STREAM_B1, (size_t)e * H, am);
  moe_init_uniform_slice(L->w2_of[e], H * M, seed, MOE_STREAM_W2, (size_t)e * H * M, ah);
  moe_init_uniform_slice(L->b2_of[e], M, seed, MOE_STREAM_B2, (size_t)e * M, ah);
}

void moe_ep_layer_init_params(moe_ep_layer *L, uint64_t seed) {
  const size_t M = (size_t)L->cfg.model_dim;
  (void)moe_ep_trans_wait_(L);  // a pending Trans still reads the homes' parameters
  moe_init_uniform_slice(L->t.wg, M * (size_t)L->E, seed, MOE_STREAM_WG, 0, 1.0f / sqrtf((float)M));
  for (int e = 0; e < L->E; e++) {
    if (L->w1_of[e]) init_expert(L, e, seed);  // home experts and replicas alike
  }
}

void moe_ep_layer_zero_grad(moe_ep_layer *L) {
  const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim, El = (size_t)L->El;
  memset(L->t.dwg, 0, M * (size_t)L->E * sizeof(float));
  memset(L->t.dw1, 0, El * M * H * sizeof(float));
  memset(L->t.db1, 0, El * H * sizeof(float));
  memset(L->t.dw2, 0, El * H * M * sizeof(float));
  memset(L->t.db2, 0, El * M * sizeof(float));
}

size_t moe_ep_expert_floats_(const moe_ep_layer *L) {
  const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim;
  return 2 * M * H + H + M;
}

// Copies expert e's parameters (w1, b1, w2, b2 are contiguous for a replica but
// not for a home expert) from its home to rank p of the EP group.
static moe_status copy_to_replica(moe_ep_layer *L, int e, int p) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim;
  const int home = L->placement.home[e];
  float *parts[4] = {L->w1_of[e], L->b1_of[e], L->w2_of[e], L->b2_of[e]};
  const size_t n[4] = {M * H, H, H * M, M};
  for (int i = 0; i < 4; i++) {
    if (L->me == home) {
      MOE_TRY(
          moe_send_floats(ctx, parts[i], n[i], p, 7101 + i, L->ep.comm, "send of expert weights"));
    } else if (L->me == p) {
      MOE_TRY(moe_recv_floats(ctx, parts[i], n[i], home, 7101 + i, L->ep.comm,
                              "receive of expert weights"));
    }
  }
done:
  return st;
}

moe_status moe_ep_layer_set_replica(moe_ep_layer *L, int e, int p, int on) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  MOE_TRY(moe_ep_trans_wait_(L));  // a pending Trans of set_placement
  // step 1: local validation and allocation, then agreement over the world
  // (the same arguments everywhere; no rank left waiting in the copy below)
  moe_status local = MOE_STATUS_OK;
  if (e < 0 || e >= L->E) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                         "expert (%d) must be in [0, %d)", e, L->E);
  } else if (p < 0 || p >= L->P) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                         "EP rank (%d) must be in [0, %d)", p, L->P);
  } else if (L->placement.home[e] == p) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                         "EP rank %d is expert %d's home: it needs no replica", p, e);
  } else if (L->n_placed > 0) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                         "the layer has copies placed by moe_ep_layer_set_placement; replicas "
                         "and placements cannot be mixed");
  } else if (L->agg_pending) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                         "the last backward's gradients are pending (deferred Agg): call "
                         "moe_ep_layer_grads_wait first");
  } else if (on && L->me == p && !L->replica_mem[e]) {
    const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim;
    float *m = moe_calloc(2 * moe_ep_expert_floats_(L), sizeof(float));
    if (!m) {
      local = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                           "cannot allocate a replica of expert %d", e);
    } else {
      L->replica_mem[e] = m;
      L->w1_of[e] = m;
      L->b1_of[e] = m + M * H;
      L->w2_of[e] = m + M * H + H;
      L->b2_of[e] = m + 2 * M * H + H;
    }
  }
  {
    const int args[3] = {e, p, on ? 1 : 0};
    int hi[3], lo[3] = {-args[0], -args[1], -args[2]};
    MOE_MPI_TRY_OP(ctx, "replica agreement",
                   MPI_Allreduce(args, hi, 3, MPI_INT, MPI_MAX, L->world));
    MOE_MPI_TRY_OP(ctx, "replica agreement",
                   MPI_Allreduce(MPI_IN_PLACE, lo, 3, MPI_INT, MPI_MAX, L->world));
    if (local == MOE_STATUS_OK && (hi[0] != -lo[0] || hi[1] != -lo[1] || hi[2] != -lo[2])) {
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "moe_ep_layer_set_replica needs the same (expert, EP rank, on) on "
                           "every rank");
    }
  }
  MOE_TRY(moe_comm_agree(ctx, L->world, local, "set_replica"));
  // step 2: apply. The plan of the last forward no longer holds: backward must
  // follow a new forward.
  L->have_forward = 0;
  MOE_TRY(moe_placement_set_replica(ctx, &L->placement, e, p, on));
  if (!on) {
    if (L->me == p && L->replica_mem[e]) {
      moe_free(L->replica_mem[e]);
      L->replica_mem[e] = NULL;
      L->w1_of[e] = L->b1_of[e] = L->w2_of[e] = L->b2_of[e] = NULL;
    }
    goto done;
  }
  MOE_TRY(copy_to_replica(L, e, p));
done:
  return st;
}

moe_status moe_ep_layer_sync_replicas(moe_ep_layer *L) {
  moe_status st = MOE_STATUS_OK;
  // the same state on every rank: all fail alike, before any transfer
  MOE_FAIL_IF(L->ctx, L->agg_pending, MOE_STATUS_INVALID_ARG,
              "the last backward's gradients are pending (deferred Agg): call "
              "moe_ep_layer_grads_wait first");
  MOE_TRY(moe_ep_trans_wait_(L));  // a pending Trans of set_placement
  L->have_forward = 0;             // new parameters: a pending backward would mix old and new
  for (int e = 0; e < L->E; e++) {
    for (int p = 0; p < L->P; p++) {
      if (L->placement.replica[(size_t)e * L->P + p]) MOE_TRY(copy_to_replica(L, e, p));
    }
  }
done:
  return st;
}

// ---- gradient reductions ------------------------------------------------------------

// Adds a copy's gradients g of home expert e to the home scratch.
static void add_copy_grads(const moe_ep_layer *L, float *home_scratch, int e, const float *g) {
  const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim, El = (size_t)L->El;
  // replica layout: dw1 (M, H) | db1 (H) | dw2 (H, M) | db2 (M); home scratch
  // layout: dw1 (El, M, H) | db1 (El, H) | dw2 (El, H, M) | db2 (El, M)
  const size_t i = (size_t)(e - L->t.home_first);
  float *dst[4] = {home_scratch + i * M * H, home_scratch + El * M * H + i * H,
                   home_scratch + El * (M * H + H) + i * H * M,
                   home_scratch + El * (2 * M * H + H) + i * M};
  const size_t off[4] = {0, M * H, M * H + H, 2 * M * H + H}, n[4] = {M * H, H, H * M, M};
  for (int k = 0; k < 4; k++) moe_add_inplace(dst[k], g + off[k], n[k]);
}

// Sends every replica's gradients to its home, which adds them to its own.
static moe_status gather_replica_grads(moe_ep_layer *L, float *home_scratch) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const size_t nf = moe_ep_expert_floats_(L);
  for (int e = 0; e < L->E; e++) {
    const int home = L->placement.home[e];
    for (int p = 0; p < L->P; p++) {
      if (!L->placement.replica[(size_t)e * L->P + p]) continue;
      if (L->me == p) {
        MOE_TRY(moe_send_floats(ctx, L->replica_mem[e] + nf, nf, home, 7201, L->ep.comm,
                                "send of expert weights"));
      } else if (L->me == home) {
        float *g = L->rep_tmp.buf;  // reserved before backward's agreement
        MOE_TRY(moe_recv_floats(ctx, g, nf, p, 7201, L->ep.comm, "receive of expert weights"));
        add_copy_grads(L, home_scratch, e, g);
      }
    }
  }
done:
  return st;
}

// Deferred Agg (pc.defer_agg): posts the copies' gradients to their homes as
// non-blocking transfers, in the (expert, rank) order gather_replica_grads
// uses; *posted 0 when some home receives more copies than its buffer holds
// (then nothing is posted and the caller gathers now). Every rank takes the
// same path without a message: the placement and the homes are the same on
// every rank, so each one counts every home's incoming copies.
static moe_status agg_post(moe_ep_layer *L, int *posted) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const size_t nf = moe_ep_expert_floats_(L);
  int n = 0;
  *posted = 0;
  for (int h = 0; h < L->P; h++) {
    int incoming = 0;
    for (int e = 0; e < L->E; e++)
      for (int p = 0; p < L->P; p++)
        incoming += L->placement.replica[(size_t)e * L->P + p] && L->placement.home[e] == h;
    if (incoming > L->agg_max) goto done;
  }
  int slot = 0;
  for (int e = 0; e < L->E; e++) {
    const int home = L->placement.home[e];
    for (int p = 0; p < L->P; p++) {
      if (!L->placement.replica[(size_t)e * L->P + p]) continue;
      if (L->me == p) {
        MOE_MPI_TRY_OP(ctx, "send of a copy's gradients",
                       MPI_Isend(L->replica_mem[e] + nf, (int)nf, MPI_FLOAT, home, 7202, L->ep.comm,
                                 &L->agg_reqs[n++]));
      } else if (L->me == home) {
        MOE_MPI_TRY_OP(ctx, "receive of a copy's gradients",
                       MPI_Irecv(L->agg_buf + (size_t)slot++ * nf, (int)nf, MPI_FLOAT, p, 7202,
                                 L->ep.comm, &L->agg_reqs[n++]));
      }
    }
  }
  L->n_agg = n;
  *posted = 1;
done:
  return st;
}

// The home experts' gradients in the scratch: summed over the DP group and
// added to the parameters' gradients.
static moe_status reduce_home(moe_ep_layer *L, float *home) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const size_t Ms = (size_t)L->cfg.model_dim, Hs = (size_t)L->cfg.hidden_dim, El = (size_t)L->El;
  if (L->pc.slice_tokens > 0) {
    MOE_TRY(moe_allreduce_fixed(ctx, &L->fixed_home, home, L->grad_home_n, L->dp,
                                "all-reduce of the MoE layer's gradients"));
  } else {
    MOE_TRY(allreduce_sum(ctx, home, L->grad_home_n, L->dp));
  }
  moe_add_inplace(L->t.dw1, home, El * Ms * Hs);
  moe_add_inplace(L->t.db1, home + El * Ms * Hs, El * Hs);
  moe_add_inplace(L->t.dw2, home + El * (Ms * Hs + Hs), El * Hs * Ms);
  moe_add_inplace(L->t.db2, home + El * (2 * Ms * Hs + Hs), El * Ms);
done:
  return st;
}

moe_status moe_ep_layer_grads_wait(moe_ep_layer *L) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_INVALID_ARG, "layer must not be NULL");
  if (!L->agg_pending) goto done;
  L->agg_pending = 0;
  float *home = L->grad_scratch + L->grad_gate_n;
  const uint64_t t0 = moe_time_ns();
  if (L->n_agg > 0) {
    const int n = L->n_agg;
    L->n_agg = 0;
    MOE_MPI_TRY_OP(ctx, "the copies' gradients to their homes",
                   MPI_Waitall(n, L->agg_reqs, L->agg_stats));
    const size_t nf = moe_ep_expert_floats_(L);
    int slot = 0;
    for (int e = 0; e < L->E; e++)
      for (int p = 0; p < L->P; p++)
        if (L->placement.replica[(size_t)e * L->P + p] && L->placement.home[e] == L->me &&
            p != L->me)
          add_copy_grads(L, home, e, L->agg_buf + (size_t)slot++ * nf);
  }
  if (L->n_placed > 0) {
    L->agg_wait_ms += moe_time_ms_since(t0);
    moe_ep_balance_record_(L, 1, L->agg_t0, moe_time_ns());
  }
  MOE_TRY(reduce_home(L, home));
done:
  return st;
}

moe_status moe_ep_reduce_grads_(moe_ep_layer *L) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  float *gs = L->grad_scratch, *home = gs + L->grad_gate_n;
  // the gate's gradient: over the world, now
  if (L->pc.slice_tokens > 0) {
    MOE_TRY(moe_allreduce_fixed(ctx, &L->fixed_gate, gs, L->grad_gate_n, L->world,
                                "all-reduce of the MoE layer's gradients"));
  } else {
    MOE_TRY(allreduce_sum(ctx, gs, L->grad_gate_n, L->world));
  }
  moe_add_inplace(L->t.dwg, gs, L->grad_gate_n);
  // the experts': Agg, then over the DP group; deferred to moe_ep_layer_grads_wait
  const uint64_t t_agg = moe_time_ns();
  if (L->pc.defer_agg) {
    int posted = 0;
    MOE_TRY(agg_post(L, &posted));
    if (!posted) MOE_TRY(gather_replica_grads(L, home));  // more copies than the buffer
    L->agg_t0 = t_agg;
    L->agg_pending = 1;
    L->agg_wait_ms = L->n_placed > 0 ? moe_time_ms_since(t_agg) : 0.0;  // posting
    goto done;
  }
  MOE_TRY(gather_replica_grads(L, home));
  L->agg_wait_ms = L->n_placed > 0 ? moe_time_ms_since(t_agg) : 0.0;
  if (L->n_placed > 0) moe_ep_balance_record_(L, 1, t_agg, moe_time_ns());
  MOE_TRY(reduce_home(L, home));
done:
  return st;
}
