// Parm's MoE layer: MP x EP x ESP with the baseline, s1 and s2 schedules
// (include/moe/parm.h, docs/parm.md). Built on the layer's building blocks
// (moe/layer_ops.h, moe/expert.h) and the all-to-all catalogue.
//
// Row orders used below:
//   route order   the gate's rows: expert-major, offset[e] .. offset[e + 1]
//   part          s2: MP rank m's rows of expert e are [n_e m / MP, n_e (m + 1) / MP)
//                 of its n_e rows (s1 and baseline: all of them); packed
//                 expert-major into `xs`, so the part of EP rank g's experts
//                 is rows gfirst[g] .. gfirst[g] + grows[g]
//   received      at an expert rank: (source member, local expert) blocks in
//                 member order (EP&ESP), or (source EP rank, ESP member of the
//                 source, local expert) blocks (baseline)
#define _POSIX_C_SOURCE 200809L

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe/expert.h"
#include "moe/kernels.h"
#include "moe/layer_ops.h"
#include "moe/parm.h"
#include "parallel/parm_internal.h"

void moe_parm_config_default(moe_parm_config *pc) {
  memset(pc, 0, sizeof *pc);
  pc->mp = pc->ep = pc->esp = 1;
  pc->schedule = MOE_PARM_S2;
  snprintf(pc->a2a, sizeof pc->a2a, "mpi");
  pc->saa = 1;
  pc->chunks = 1;
  snprintf(pc->task_schedule, sizeof pc->task_schedule, "sequential");
  pc->exec = moe_executor_config_default();
  snprintf(pc->compress, sizeof pc->compress, "none");  // catalogue: the identity
}

// s1 and s2 run their EP&ESP pass on the executor: in chunks, or compressed.
static int uses_executor(const moe_parm_config *pc) {
  moe_compressor comp;
  return pc->chunks > 1 || (moe_compressor_get(NULL, pc->compress, &comp) == MOE_STATUS_OK &&
                            !moe_compressor_is_identity(&comp));
}

moe_parm_coords moe_parm_coords_of(const moe_parm_config *pc, int world, int rank) {
  moe_parm_coords c;
  (void)world;
  c.mp = rank % pc->mp;
  c.esp = rank / pc->mp % pc->esp;
  c.ep = rank / (pc->mp * pc->esp) % pc->ep;
  c.dp = rank / (pc->mp * pc->esp * pc->ep);
  return c;
}

int moe_parm_data_index(const moe_parm_config *pc, int world, int rank) {
  const moe_parm_coords c = moe_parm_coords_of(pc, world, rank);
  return (c.dp * pc->ep + c.ep) * pc->esp + c.esp;
}

// ---- setup -------------------------------------------------------------------

static uint64_t config_hash(const moe_layer_config *c, const moe_parm_config *pc) {
  uint64_t h = moe_parallel_layer_hash_(c);
  const int ints[11] = {pc->mp,
                        pc->ep,
                        pc->esp,
                        (int)pc->schedule,
                        pc->saa,
                        pc->ranks_per_node,
                        pc->intra_node,
                        pc->slice_tokens,
                        pc->chunks,
                        (int)pc->exec.wait,
                        pc->compress_backward};
  h = moe_parallel_fnv1a_(ints, sizeof ints, h);
  h = moe_parallel_fnv1a_(pc->task_schedule, strnlen(pc->task_schedule, sizeof pc->task_schedule),
                          h);
  h = moe_parallel_fnv1a_(pc->compress, strnlen(pc->compress, sizeof pc->compress), h);
  return moe_parallel_fnv1a_(pc->a2a, strnlen(pc->a2a, sizeof pc->a2a), h);
}

static moe_status local_checks(moe_ctx *ctx, int W, const moe_layer_config *cfg,
                               const moe_parm_config *pc, const moe_a2a_algo **algo) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(moe_layer_config_validate(ctx, cfg));
  MOE_FAIL_IF(ctx, pc->mp < 1 || pc->ep < 1 || pc->esp < 1, MOE_STATUS_INVALID_ARG,
              "Parm layout: MP %d, EP %d and ESP %d must each be at least 1", pc->mp, pc->ep,
              pc->esp);
  const long long group = (long long)pc->mp * pc->ep * pc->esp;
  MOE_FAIL_IF(ctx, group > W || W % group != 0, MOE_STATUS_INVALID_ARG,
              "Parm layout: MP x EP x ESP = %d x %d x %d = %lld does not divide the %d ranks",
              pc->mp, pc->ep, pc->esp, group, W);
  MOE_FAIL_IF(ctx, cfg->num_experts % pc->ep != 0, MOE_STATUS_INVALID_ARG,
              "Parm layout: %d experts do not divide over EP = %d ranks", cfg->num_experts, pc->ep);
  MOE_FAIL_IF(ctx, cfg->hidden_dim % pc->esp != 0, MOE_STATUS_INVALID_ARG,
              "Parm layout: the hidden size H = %d is not divisible by ESP = %d", cfg->hidden_dim,
              pc->esp);
  MOE_FAIL_IF(ctx, (int)pc->schedule < 0 || (int)pc->schedule >= MOE_PARM_SCHEDULES,
              MOE_STATUS_INVALID_ARG, "unknown Parm schedule %d (valid: baseline, s1, s2)",
              (int)pc->schedule);
  MOE_FAIL_IF(ctx, pc->saa != 0 && pc->saa != 1, MOE_STATUS_INVALID_ARG, "saa must be 0 or 1");
  MOE_FAIL_IF(ctx, pc->slice_tokens < 0 || pc->slice_tokens > cfg->tokens, MOE_STATUS_INVALID_ARG,
              "Parm slice_tokens (%d) must be in [0, %d] (the layer's tokens)", pc->slice_tokens,
              cfg->tokens);
  // deterministic ESP > 1: the shards' chains (det_shards_forward, det_compute) re-state its GEMMs
  const int ffn = strcmp(cfg->expert, "ffn") == 0;  // catalogue: the chains' expert kind
  MOE_FAIL_IF(ctx, pc->slice_tokens > 0 && pc->esp > 1 && !ffn, MOE_STATUS_INVALID_ARG,
              "Parm deterministic mode (slice_tokens %d) with ESP %d chains the shards' GEMMs of "
              "the 'ffn' expert; expert '%s' is not it (use ESP 1, or deterministic mode off: "
              "--deterministic off)",
              pc->slice_tokens, pc->esp, cfg->expert);
  MOE_FAIL_IF(ctx, pc->ranks_per_node < 0 || (pc->ranks_per_node > 0 && W % pc->ranks_per_node),
              MOE_STATUS_INVALID_ARG, "ranks_per_node %d does not divide the %d ranks",
              pc->ranks_per_node, W);
  MOE_TRY(moe_a2a_find(ctx, pc->a2a, algo));
  MOE_FAIL_IF(ctx, pc->chunks < 1 || pc->chunks > MOE_MAX_CHUNKS, MOE_STATUS_INVALID_ARG,
              "Parm chunks %d out of range [1, %d]", pc->chunks, MOE_MAX_CHUNKS);
  {
    const moe_schedule_algo *ts = NULL;
    MOE_FAIL_IF(ctx, memchr(pc->task_schedule, 0, sizeof pc->task_schedule) == NULL,
                MOE_STATUS_INVALID_ARG, "Parm task schedule name is not terminated");
    MOE_TRY(moe_schedule_algo_find(ctx, pc->task_schedule, &ts));
    MOE_FAIL_IF(ctx, ts->chunking != MOE_CHUNK_ROWS, MOE_STATUS_INVALID_ARG,
                "task schedule '%s' cuts a pass by peer groups; Parm's EP&ESP pass is cut by rows "
                "(schedules: %s, except '%s')",
                pc->task_schedule, moe_schedule_algo_names(), pc->task_schedule);
  }
  {
    moe_compressor comp;
    MOE_FAIL_IF(ctx, memchr(pc->compress, 0, sizeof pc->compress) == NULL, MOE_STATUS_INVALID_ARG,
                "Parm compressor spec is not terminated");
    MOE_TRY(moe_compressor_get(ctx, pc->compress, &comp));
    MOE_FAIL_IF(ctx, pc->compress_backward != 0 && pc->compress_backward != 1,
                MOE_STATUS_INVALID_ARG, "Parm compress_backward must be 0 or 1 (got %d)",
                pc->compress_backward);
    MOE_FAIL_IF(ctx, !moe_compressor_is_identity(&comp) && pc->slice_tokens > 0,
                MOE_STATUS_INVALID_ARG,
                "Parm deterministic mode (slice_tokens %d) does not compress its payloads; "
                "compressor '%s' is not supported with it (use none)",
                pc->slice_tokens, pc->compress);
  }
  MOE_FAIL_IF(ctx, pc->chunks > 1 && pc->slice_tokens > 0, MOE_STATUS_INVALID_ARG,
              "Parm deterministic mode (slice_tokens %d) runs unchunked passes; chunks %d is not "
              "supported with it (use chunks 1)",
              pc->slice_tokens, pc->chunks);
  MOE_TRY(moe_expert_kind_find(ctx, cfg->expert, &(const moe_expert_kind *){NULL}));
  // MPI's int counts: the largest gather and reduction of the layer
  {
    const double R = (double)moe_layer_max_rows(cfg), M = cfg->model_dim;
    const double recv = R * (double)pc->ep * pc->esp;
    MOE_FAIL_IF(ctx, recv * M > INT_MAX || R * pc->esp * M > INT_MAX, MOE_STATUS_INVALID_ARG,
                "Parm layer: %.0f rows of %d floats exceed MPI's int counts; use fewer tokens",
                recv, cfg->model_dim);
  }
done:
  return st;
}

static moe_status split(moe_ctx *ctx, MPI_Comm world, int color, int key, MPI_Comm *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_MPI_TRY_OP(ctx, "Parm layer setup", MPI_Comm_split(world, color, key, out));
done:
  return st;
}

static moe_status group_of(moe_ctx *ctx, MPI_Comm world, int color, int key, int node,
                           moe_group *g) {
  moe_status st = MOE_STATUS_OK;
  MPI_Comm c = MPI_COMM_NULL;
  MOE_TRY(split(ctx, world, color, key, &c));
  st = moe_group_init(ctx, g, c, node);
  MPI_Comm_free(&c);
done:
  return st;
}

// The most rows an expert rank receives: from each of the P = EP x ESP
// sources (baseline: EP sources with ESP members' rows each), its tokens'
// choices of that rank's Eh experts (at most min(K, Eh) a token), or Eh
// capacities.
static size_t recv_rows_max(const moe_layer_config *cfg, int EP, int ESP) {
  const size_t T = (size_t)cfg->tokens, K = (size_t)cfg->top_k;
  const size_t Eh = (size_t)(cfg->num_experts / EP);
  size_t per_src = T * (K < Eh ? K : Eh);
  const int C = moe_layer_capacity(cfg, cfg->tokens);
  if (C >= 0 && Eh * (size_t)C < per_src) per_src = Eh * (size_t)C;
  return (size_t)EP * (size_t)ESP * per_src;
}

moe_status moe_parm_layer_memory(moe_ctx *ctx, const moe_layer_config *cfg,
                                 const moe_parm_config *pc, int world_size, moe_memory_need *out) {
  moe_status st = MOE_STATUS_OK;
  const moe_a2a_algo *algo = NULL;
  MOE_FAIL_IF(ctx, !cfg || !pc || !out || world_size < 1, MOE_STATUS_INVALID_ARG,
              "Parm memory: NULL argument or world size %d < 1", world_size);
  MOE_TRY(local_checks(ctx, world_size, cfg, pc, &algo));
  memset(out, 0, sizeof *out);
  {
    const double M = cfg->model_dim, E = cfg->num_experts, T = cfg->tokens, K = cfg->top_k;
    const double Eh = E / pc->ep, hs = (double)cfg->hidden_dim / pc->esp, F = sizeof(float);
    const double R = (double)moe_layer_max_rows(cfg), ESP = pc->esp, P = pc->ep * ESP;
    const double RI = (double)recv_rows_max(cfg, pc->ep, pc->esp);
    const double np = M * E + Eh * (2 * M * hs + hs + M);
    out->bytes[MOE_MEM_PARAMS] = F * (np + E + M);
    out->bytes[MOE_MEM_GRADS] = 2 * F * np;
    out->bytes[MOE_MEM_ACTIVATIONS] =
        F * (5 * T * E + T + 2 * T * K + 6 * R * M + T * M) +
        (double)moe_route_bytes(cfg->tokens, cfg->top_k, cfg->num_experts, (int)R);
    out->bytes[MOE_MEM_A2A] = F * (2 * ESP * R * M + 2 * RI * M + 4 * RI * hs);
    // balanced routing: each expert rank receives about what it sends (R x ESP rows)
    const double balanced = ESP * R < RI ? ESP * R : RI;
    out->skew_bytes = F * (RI - balanced) * (2 * M + 4 * hs);
    out->bytes[MOE_MEM_WORKSPACE] =
        sizeof(int) *
            (2 * (P * ESP * Eh + E + 1) + ESP * E + 2 * E + 4 * pc->ep + P + 2 * (pc->mp + ESP)) +
        sizeof(size_t) * 9 * P + sizeof(int) * 2 * pc->mp * pc->ep +
        (sizeof(MPI_Request) + sizeof(MPI_Status)) * (2 * P + pc->ep) +
        MOE_LOSS_STATS(cfg->num_experts) * sizeof(double) + sizeof(moe_parm_layer) + 4096;
    if (uses_executor(pc)) {  // the chunk plan, graphs, schedules and task records
      const double r = pc->chunks, tasks = (MOE_CT_KINDS + 1) * r;
      // four graphs and schedules ([backward][saa], tasks each) and their
      // validations' scratch, the executor's records, the plan's arrays (32
      // blocks, each rounded up by malloc)
      out->bytes[MOE_MEM_WORKSPACE] +=
          4 * tasks * (sizeof(moe_task) + 7 * sizeof(int)) +
          tasks * (1 + sizeof(moe_task_record) + 2 * sizeof(int)) + 2048 + 32 * 16 +
          sizeof(size_t) * (MOE_PARM_CH_ARRAYS + 1) * r * P + 2 * r * sizeof(moe_parm_task_arg) +
          sizeof(int) * (pc->mp * (double)pc->ep + 2 * r * pc->mp);
      out->bytes[MOE_MEM_A2A] += F * (R * M + 1);  // SAA's summed rows
      moe_compressor comp;
      moe_compressor_get(NULL, pc->compress, &comp);  // checked above
      if (!moe_compressor_is_identity(&comp)) {       // csend, crecv, cback (moe_parm_chunks_init_)
        size_t b[3];
        moe_parm_compressed_bounds_(&comp, pc->chunks, pc->ep, (int)P, (size_t)R,
                                    recv_rows_max(cfg, pc->ep, pc->esp), (size_t)ESP * (size_t)R,
                                    (size_t)M, b);
        out->bytes[MOE_MEM_A2A] += (double)b[0] + (double)b[1] + (double)b[2] + 3 * 256;
      }
    }
    if (pc->slice_tokens > 0) {  // alloc_det's tables, and moe_allreduce_fixed's buffer
      const double slices = (double)(cfg->tokens / pc->slice_tokens);
      out->bytes[MOE_MEM_WORKSPACE] +=
          (slices + 1) * (E + 1) * sizeof(double) +
          (double)moe_pairwise_bytes((size_t)(M * E), (int)slices) + (P * Eh + 1) * sizeof(size_t) +
          P * Eh * MOE_CHAIN_SPANS * (double)(sizeof(MPI_Request) + sizeof(MPI_Status));
      if (world_size > 1) out->bytes[MOE_MEM_GRADS] += F * M * E;
    }
  }
done:
  return st;
}

// Every buffer alloc_all allocates (checked there, freed by destroy).
#define PARM_BUFFERS(L)                                                                            \
  {                                                                                                \
    (L)->params, (L)->grads, (L)->gscratch, (L)->router_bias, (L)->zero_b2, (L)->logits,           \
        (L)->probs, (L)->scores, (L)->dprobs, (L)->dlogits, (L)->lse, (L)->topk_p, (L)->dweight,   \
        (L)->stats, (L)->xe, (L)->ye, (L)->dye, (L)->dxe, (L)->sum, (L)->stg, (L)->xs, (L)->xb,    \
        (L)->xr, (L)->yr, (L)->pre, (L)->h, (L)->dh, (L)->dpre, (L)->cnt_send, (L)->cnt_recv,      \
        (L)->gcnt, (L)->part_lo, (L)->part_n, (L)->gfirst, (L)->grows, (L)->member_rows, (L)->sc,  \
        (L)->sd, (L)->rc, (L)->rd, (L)->mcnt, (L)->mdis, (L)->reqs, (L)->dx_add, (L)->dump_counts, \
        (L)->back_displs, (L)->saa_cnt, (L)->statuses                                              \
  }

// Every allocation of the layer (agreed on by the caller).
static moe_status alloc_all(moe_parm_layer *L) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const size_t M = (size_t)L->M, E = (size_t)L->E, Eh = (size_t)L->Eh, hs = (size_t)L->hs;
  const size_t T = (size_t)L->cfg.tokens, K = (size_t)L->cfg.top_k, P = (size_t)L->P;
  const size_t R = moe_layer_max_rows(&L->cfg), ESP = (size_t)L->ESP;
  L->R = (int)R;
  L->RI = recv_rows_max(&L->cfg, L->EP, L->ESP);
  L->n_gate = M * E;
  L->n_expert = Eh * (2 * M * hs + hs + M);
  const size_t np = L->n_gate + L->n_expert;
  L->params = moe_calloc(np + 1, sizeof(float));
  L->grads = moe_calloc(np + 1, sizeof(float));
  L->gscratch = moe_calloc(np + 1, sizeof(float));
  L->router_bias = moe_calloc(E, sizeof(float));
  L->zero_b2 = moe_calloc(M, sizeof(float));
  float **fl[] = {&L->logits, &L->probs, &L->scores, &L->dprobs, &L->dlogits};
  for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) *fl[i] = moe_malloc((T * E + 1) * 4);
  L->lse = moe_malloc((T + 1) * sizeof(float));
  L->topk_p = moe_malloc((T * K + 1) * sizeof(float));
  L->dweight = moe_malloc((T * K + 1) * sizeof(float));
  L->stats = moe_calloc(MOE_LOSS_STATS(E), sizeof(double));
  float **rows[] = {&L->xe, &L->ye, &L->dye, &L->dxe, &L->sum, &L->stg};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) *rows[i] = moe_malloc((R * M + 1) * 4);
  L->xs = moe_malloc((ESP * R * M + 1) * sizeof(float));
  L->dx_add = moe_malloc((T * M + 1) * sizeof(float));
  L->xb = moe_malloc((ESP * R * M + 1) * sizeof(float));
  L->xr = moe_malloc((L->RI * M + 1) * sizeof(float));
  L->yr = moe_malloc((L->RI * M + 1) * sizeof(float));
  float **hid[] = {&L->pre, &L->h, &L->dh, &L->dpre};
  for (size_t i = 0; i < sizeof hid / sizeof hid[0]; i++)
    *hid[i] = moe_malloc((L->RI * hs + 1) * sizeof(float));
  const size_t cn = P * ESP * Eh + E + 1;
  L->cnt_send = moe_calloc(cn, sizeof(int));
  L->cnt_recv = moe_calloc(cn, sizeof(int));
  L->gcnt = moe_calloc(ESP * E + 1, sizeof(int));
  L->part_lo = moe_calloc(E, sizeof(int));
  L->part_n = moe_calloc(E, sizeof(int));
  L->gfirst = moe_calloc((size_t)L->EP + 1, sizeof(int));
  L->grows = moe_calloc((size_t)L->EP + 1, sizeof(int));
  L->member_rows = moe_calloc(P, sizeof(int));
  L->sc = moe_calloc(P, sizeof(size_t));
  L->sd = moe_calloc(P, sizeof(size_t));
  L->rc = moe_calloc(P, sizeof(size_t));
  L->rd = moe_calloc(P, sizeof(size_t));
  const size_t mm = (size_t)(L->MP > L->ESP ? L->MP : L->ESP);
  L->mcnt = moe_calloc(mm, sizeof(int));
  L->mdis = moe_calloc(mm, sizeof(int));
  L->reqs = moe_calloc(2 * P + (size_t)L->EP, sizeof(MPI_Request));
  L->dump_counts = moe_calloc(4 * P, sizeof(size_t));
  L->back_displs = moe_calloc(P, sizeof(size_t));
  L->saa_cnt = moe_calloc((size_t)2 * L->MP * L->EP, sizeof(int));
  L->statuses = moe_calloc(2 * P + (size_t)L->EP, sizeof(MPI_Status));
  void *all[] = PARM_BUFFERS(L);
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    MOE_FAIL_IF(ctx, !all[i], MOE_STATUS_OUT_OF_MEMORY,
                "cannot allocate the Parm layer's buffers (%zu rows of %zu floats received)", L->RI,
                M);
  }
  MOE_TRY(moe_route_init(ctx, &L->route, L->cfg.tokens, L->cfg.top_k, L->E, L->R));
  if (L->pc.slice_tokens > 0) {  // deterministic mode's tables
    L->sl = L->pc.slice_tokens;
    L->max_slices = L->cfg.tokens / L->sl;
    L->slice_sums = moe_calloc((size_t)(L->max_slices + 1) * (E + 1), sizeof(double));
    L->blk_at = moe_calloc(P * Eh + 1, sizeof(size_t));
    MOE_FAIL_IF(ctx, !L->slice_sums || !L->blk_at, MOE_STATUS_OUT_OF_MEMORY,
                "cannot allocate the Parm layer's deterministic tables");
    MOE_TRY(moe_pairwise_init(ctx, &L->gate_pw, M * E, L->max_slices));
  }
  // the tensors' views
  float *p = L->params, *g = L->grads;
  const size_t sizes[5] = {L->n_gate, Eh * M * hs, Eh * hs, Eh * hs * M, Eh * M};
  float **pv[5] = {&L->t.wg, &L->t.w1, &L->t.b1, &L->t.w2, &L->t.b2};
  float **gv[5] = {&L->t.dwg, &L->t.dw1, &L->t.db1, &L->t.dw2, &L->t.db2};
  for (int i = 0; i < 5; i++) {
    *pv[i] = p;
    *gv[i] = g;
    p += sizes[i];
    g += sizes[i];
  }
  L->t.router_bias = L->router_bias;
  L->t.home_first = L->me.ep * L->Eh;
  L->t.home_count = L->Eh;
  L->t.shard = L->me.esp;
  L->t.hs = L->hs;
done:
  return st;
}

moe_status moe_parm_layer_create(moe_ctx *ctx, MPI_Comm world, const moe_layer_config *cfg,
                                 const moe_parm_config *pc, moe_parm_layer **out) {
  moe_status st = MOE_STATUS_OK;
  moe_parm_layer *L = NULL;
  int *nodes = NULL;
  int W = 0, rank = 0;
  if (out) *out = NULL;
  MOE_MPI_TRY(ctx, MPI_Comm_size(world, &W));
  MOE_MPI_TRY(ctx, MPI_Comm_rank(world, &rank));
  const moe_a2a_algo *algo = NULL;
  moe_status local = MOE_STATUS_OK;
  if (!out || !cfg || !pc) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                         "out, cfg and pc must not be NULL");
  } else {
    local = local_checks(ctx, W, cfg, pc, &algo);
  }
  if (local == MOE_STATUS_OK && uses_executor(pc)) {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_SERIALIZED)
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "Parm's chunked or compressed pass runs its all-to-alls on a "
                           "communication thread: initialise MPI with MPI_Init_thread and "
                           "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (provided level: %d)",
                           level);
  }
  MOE_TRY(moe_comm_agree(ctx, world, local, "Parm layer setup"));
  MOE_TRY(moe_parallel_same_config_(ctx, world, config_hash(cfg, pc), "Parm"));
  L = moe_calloc(1, sizeof *L);
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate the Parm layer");
  L->ctx = ctx;
  L->cfg = *cfg;
  L->pc = *pc;
  L->algo = algo;
  moe_expert_kind_find(ctx, cfg->expert, &L->expert);  // checked above
  L->world = L->mp = L->esp = L->data = L->rep = L->rep_dp = MPI_COMM_NULL;
  L->W = W;
  L->MP = pc->mp;
  L->EP = pc->ep;
  L->ESP = pc->esp;
  L->P = L->EP * L->ESP;
  L->DP = W / (L->MP * L->P);
  L->E = cfg->num_experts;
  L->Eh = L->E / L->EP;
  L->M = cfg->model_dim;
  L->H = cfg->hidden_dim;
  L->hs = L->H / L->ESP;
  L->scfg = *cfg;
  L->scfg.hidden_dim = L->hs;
  L->sched = pc->schedule;
  L->saa = pc->saa;
  L->me = moe_parm_coords_of(pc, W, rank);
  const moe_parm_coords c = L->me;
  MOE_MPI_TRY_OP(ctx, "Parm layer setup", MPI_Comm_dup(world, &L->world));
  MOE_MPI_TRY(ctx, MPI_Comm_set_errhandler(L->world, MPI_ERRORS_RETURN));
  const int q = c.ep * L->ESP + c.esp;
  MOE_TRY(split(ctx, L->world, (c.dp * L->EP + c.ep) * L->ESP + c.esp, c.mp, &L->mp));
  MOE_TRY(split(ctx, L->world, (c.dp * L->MP + c.mp) * L->EP + c.ep, c.esp, &L->esp));
  MOE_TRY(split(ctx, L->world, c.mp, rank, &L->data));
  MOE_TRY(split(ctx, L->world, q, rank, &L->rep));
  MOE_TRY(split(ctx, L->world, c.mp * L->P + q, rank, &L->rep_dp));
  nodes = moe_malloc((size_t)W * sizeof(int));
  MOE_FAIL_IF(ctx, !nodes, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate %d node ids", W);
  MOE_TRY(moe_topology_nodes(ctx, L->world, pc->ranks_per_node, nodes));
  MOE_TRY(group_of(ctx, L->world, c.dp * L->MP + c.mp, q, nodes[rank], &L->a2a));
  MOE_TRY(
      group_of(ctx, L->world, (c.dp * L->MP + c.mp) * L->ESP + c.esp, c.ep, nodes[rank], &L->ep));
  {
    // the groups that must stay inside a node, and the algorithm's restrictions
    moe_status ok = MOE_STATUS_OK;
    if (pc->intra_node) {
      const int mp0 = rank - c.mp, esp0 = rank - c.esp * L->MP;
      for (int i = 0; i < L->MP && ok == MOE_STATUS_OK; i++) {
        if (nodes[mp0 + i] != nodes[rank])
          ok = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                            "Parm layout: the MP group of rank %d (ranks %d..%d) spans two nodes; "
                            "MP must divide the ranks per node",
                            rank, mp0, mp0 + L->MP - 1);
      }
      for (int i = 0; i < L->ESP && ok == MOE_STATUS_OK; i++) {
        if (nodes[esp0 + i * L->MP] != nodes[rank])
          ok = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                            "Parm layout: the ESP group of rank %d spans two nodes; MP x ESP "
                            "must divide the ranks per node",
                            rank);
      }
    }
    if (ok == MOE_STATUS_OK) ok = moe_a2a_check_topology(ctx, algo, &L->a2a);
    if (ok == MOE_STATUS_OK) ok = moe_a2a_check_topology(ctx, algo, &L->ep);
    MOE_TRY(moe_comm_agree(ctx, L->world, ok, "Parm layout"));
  }
  MOE_TRY(moe_comm_agree(ctx, L->world, alloc_all(L), "Parm layer allocation"));
  L->r = 1;
  moe_compressor_get(ctx, pc->compress, &L->comp);  // checked above
  L->compress_on = !moe_compressor_is_identity(&L->comp);
  if (uses_executor(pc))
    MOE_TRY(moe_comm_agree(ctx, L->world, moe_parm_chunks_init_(L), "Parm chunked pass setup"));
  *out = L;
  L = NULL;
done:
  moe_free(nodes);
  moe_parm_layer_destroy(L);
  return st;
}

void moe_parm_layer_destroy(moe_parm_layer *L) {
  if (!L) return;
  moe_parm_chunks_free_(L);
  moe_group_free(&L->a2a);
  moe_group_free(&L->ep);
  MPI_Comm *comms[] = {&L->mp, &L->esp, &L->data, &L->rep, &L->rep_dp, &L->world};
  for (size_t i = 0; i < sizeof comms / sizeof comms[0]; i++) {
    if (*comms[i] != MPI_COMM_NULL && *comms[i] != 0) MPI_Comm_free(comms[i]);
  }
  moe_route_free(&L->route);
  moe_workspace_free(&L->ws);
  void *all[] = PARM_BUFFERS(L);
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) moe_free(all[i]);
  moe_pairwise_free(&L->gate_pw);
  moe_fixed_sum_free(&L->fixed_gate);
  moe_chain_state_free(&L->chains);
  void *det[] = {L->slice_sums, L->blk_at};
  for (size_t i = 0; i < sizeof det / sizeof det[0]; i++) moe_free(det[i]);
  moe_free(L);
}

moe_parm_tensors moe_parm_layer_get_tensors(moe_parm_layer *L) { return L->t; }

const moe_group *moe_parm_layer_a2a_group(const moe_parm_layer *L) { return &L->a2a; }
MPI_Comm moe_parm_layer_mp_comm(const moe_parm_layer *L) { return L->mp; }
const moe_a2a_algo *moe_parm_layer_algo(const moe_parm_layer *L) { return L->algo; }

int moe_parm_layer_shards(const moe_parm_layer *L) { return L->ESP; }

moe_parm_schedule moe_parm_pick(const moe_parm_alpha_beta *ab, const moe_layer_config *cfg,
                                const moe_parm_config *pc, double *t1_ms, double *t2_ms) {
  moe_parm_sim_config c;
  moe_parm_sim_config_default(&c);
  c.mp = pc->mp;
  c.ep = pc->ep;
  c.esp = pc->esp;
  c.tokens = cfg->tokens;
  c.model_dim = cfg->model_dim;
  c.hidden_dim = cfg->hidden_dim;
  c.experts = cfg->num_experts;
  c.top_k = cfg->top_k;
  c.capacity_factor = cfg->capacity_factor;
  double t1 = 0, t2 = 0;
  const moe_parm_schedule s = (moe_parm_schedule)moe_parm_alg1(ab, &c, &t1, &t2);
  if (t1_ms) *t1_ms = t1 * 1e3;
  if (t2_ms) *t2_ms = t2 * 1e3;
  return s;
}

moe_parm_timing moe_parm_layer_timing(const moe_parm_layer *L, int backward) {
  return backward ? L->tb : L->tf;
}

void moe_parm_layer_init_params(moe_parm_layer *L, uint64_t seed) {
  const size_t M = (size_t)L->M, H = (size_t)L->H, E = (size_t)L->E, hs = (size_t)L->hs;
  const size_t e0 = (size_t)L->t.home_first, s0 = (size_t)L->me.esp * hs;
  const float am = 1.0f / sqrtf((float)M), ah = 1.0f / sqrtf((float)H);
  moe_init_uniform_slice(L->t.wg, M * E, seed, MOE_STREAM_WG, 0, am);
  for (size_t el = 0; el < (size_t)L->Eh; el++) {
    const size_t e = e0 + el;
    for (size_t m = 0; m < M; m++)  // w1 (E, M, H): row m's columns s0 .. s0 + hs
      moe_init_uniform_slice(L->t.w1 + (el * M + m) * hs, hs, seed, MOE_STREAM_W1,
                             (e * M + m) * H + s0, am);
    moe_init_uniform_slice(L->t.b1 + el * hs, hs, seed, MOE_STREAM_B1, e * H + s0, am);
    // w2 (E, H, M): rows s0 .. s0 + hs
    moe_init_uniform_slice(L->t.w2 + el * hs * M, hs * M, seed, MOE_STREAM_W2, (e * H + s0) * M,
                           ah);
    moe_init_uniform_slice(L->t.b2 + el * M, M, seed, MOE_STREAM_B2, e * M, ah);
  }
}

void moe_parm_layer_zero_grad(moe_parm_layer *L) {
  memset(L->grads, 0, (L->n_gate + L->n_expert) * sizeof(float));
}

moe_status moe_parm_layer_set_schedule(moe_parm_layer *L, moe_parm_schedule s, int saa) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_INVALID_ARG, "layer must not be NULL");
  MOE_FAIL_IF(ctx, (int)s < 0 || (int)s >= MOE_PARM_SCHEDULES || (saa != 0 && saa != 1),
              MOE_STATUS_INVALID_ARG, "Parm schedule %d / saa %d out of range (0..%d, 0..1)",
              (int)s, saa, MOE_PARM_SCHEDULES - 1);
  L->sched = s;
  L->saa = saa;
  L->have_forward = 0;
done:
  return st;
}

// ---- the collectives ---------------------------------------------------------------

moe_status moe_parm_dump_a2a(moe_ctx *ctx, const moe_a2a_algo *algo, const moe_group *g, int esp,
                             const float *send, const int *rows, const int *first, int width,
                             float *recv, const int *recv_rows, size_t *b, moe_workspace *ws) {
  const int P = g->size;
  const size_t row = (size_t)width * sizeof(float);
  size_t at = 0;
  for (int q = 0; q < P; q++) {
    b[q] = (size_t)rows[q / esp] * row;
    b[P + q] = (size_t)first[q / esp] * row;
    b[2 * P + q] = (size_t)recv_rows[q] * row;
    b[3 * P + q] = at;
    at += b[2 * P + q];
  }
  return moe_a2a_run(ctx, algo, g, send, b, b + P, recv, b + 2 * P, b + 3 * P, ws);
}

// ---- the pass's pieces -------------------------------------------------------------

// Local expert el's shard: its parameters (b2 added by shard 0 only) and the
// backward's scratch for its gradients (wg | w1 | b1 | w2 | b2, expert-major
// within each).
static moe_expert_params shard_params(const moe_parm_layer *L, size_t el) {
  const size_t M = (size_t)L->M, hs = (size_t)L->hs;
  const moe_expert_params p = {L->t.w1 + el * M * hs, L->t.b1 + el * hs, L->t.w2 + el * hs * M,
                               L->me.esp == 0 ? L->t.b2 + el * M : L->zero_b2};
  return p;
}

static moe_expert_grads shard_scratch_grads(const moe_parm_layer *L, size_t el) {
  const size_t M = (size_t)L->M, hs = (size_t)L->hs, Eh = (size_t)L->Eh;
  float *gw1 = L->gscratch + L->n_gate, *gb1 = gw1 + Eh * M * hs, *gw2 = gb1 + Eh * hs,
        *gb2 = gw2 + Eh * hs * M;
  const moe_expert_grads g = {gw1 + el * M * hs, gb1 + el * hs, gw2 + el * hs * M, gb2 + el * M};
  return g;
}

// One shard's FFN over the received blocks: forward (x -> pre, h, y) or
// backward (dy in dyx -> dx in dyx, gradients into the scratch). Blocks:
// nb[i] rows of local expert el[i], in order.
void moe_parm_shard_block_(moe_parm_layer *L, int backward, size_t at, size_t n, size_t el,
                           float *dyx, moe_layer_timing *tm) {
  const size_t M = (size_t)L->M, hs = (size_t)L->hs;
  if (n == 0) return;
  const moe_expert_params p = shard_params(L, el);
  if (!backward) {
    L->expert->forward(&L->scfg, &p, L->xr + at * M, (int)n, L->pre + at * hs, L->h + at * hs,
                       L->yr + at * M, tm);
  } else {
    const moe_expert_grads g = shard_scratch_grads(L, el);
    L->expert->backward(&L->scfg, &p, &g, L->xr + at * M, L->pre + at * hs, L->h + at * hs,
                        dyx + at * M, (int)n, L->dh + at * hs, L->dpre + at * hs, tm);
  }
}

static void run_shards(moe_parm_layer *L, int backward, const int *nb, int blocks, int cycle,
                       float *dyx, moe_layer_timing *tm) {
  size_t at = 0;
  for (int i = 0; i < blocks; i++) {
    moe_parm_shard_block_(L, backward, at, (size_t)nb[i], (size_t)(i % cycle), dyx, tm);
    at += (size_t)nb[i];
  }
}

// ---- deterministic mode: each expert's gradients as one chain ------------------------------

// Block i = (member q, local expert el) of the received rows starts at blk_at[i].
static void det_block_starts(moe_parm_layer *L) {
  size_t at = 0;
  for (int i = 0; i < L->P * L->Eh; i++) {
    L->blk_at[i] = at;
    at += (size_t)L->cnt_recv[i];
  }
}

// The expert gradients' chain (det_shards_backward): segment seg = d x mps + m
// is data index d's rows from MP rank m (mps = MP, or 1 for the baseline,
// which computes every row on each MP rank); they came from member d % P.
static int det_mps(const moe_parm_layer *L) { return L->sched == MOE_PARM_BASELINE ? 1 : L->MP; }

static int det_owner(void *user, int seg) {
  const moe_parm_layer *L = user;
  const int mps = det_mps(L), d = seg / mps, m = seg % mps;
  return mps == 1 ? d / L->P : (d / L->P) * L->MP + m;
}

// The shards' chains: segment s on ESP rank s.
static int esp_owner(void *user, int seg) {
  (void)user;
  return seg;
}

// Chain segment seg of expert el: its owner's block of the rows that came
// from member (seg / mps) % P (the expert's backward on them, into the scratch).
static void det_compute(void *user, int el, int seg) {
  moe_parm_layer *L = user;
  const size_t M = (size_t)L->M, hs = (size_t)L->hs, Eh = (size_t)L->Eh, e = (size_t)el;
  const size_t i = (size_t)(seg / det_mps(L) % L->P) * Eh + e, n = (size_t)L->cnt_recv[i],
               at = L->blk_at[i];
  if (n == 0) return;
  const moe_expert_params p = shard_params(L, e);
  const moe_expert_grads g = shard_scratch_grads(L, e);
  if (L->ESP == 1) {
    L->expert->backward(&L->scfg, &p, &g, L->xr + at * M, L->pre + at * hs, L->h + at * hs,
                        L->yr + at * M, (int)n, L->dh + at * hs, L->dpre + at * hs, L->ch_tm);
    return;
  }
  // ESP > 1: the 'ffn' expert's backward (expert_ffn.c) but dX, whose sum over
  // H runs over the shards (esp_dx_compute)
  float *dy = L->yr + at * M, *dh = L->dh + at * hs, *dpre = L->dpre + at * hs;
  const float *pre = L->pre + at * hs, *h = L->h + at * hs;
  moe_bias_add_backward(g.db2, dy, (int)n, L->M);
  moe_gemm(1, 0, L->hs, L->M, (int)n, 1.0f, h, L->hs, dy, L->M, 1.0f, g.dw2, L->M);
  moe_gemm(0, 1, (int)n, L->hs, L->M, 1.0f, dy, L->M, p.w2, L->M, 0.0f, dh, L->hs);
  memset(dpre, 0, n * hs * sizeof(float));
  if (L->cfg.act == MOE_ACT_GELU) {
    moe_gelu_backward(dpre, dh, pre, n * hs);
  } else {
    moe_relu_backward(dpre, dh, pre, n * hs);
  }
  moe_bias_add_backward(g.db1, dpre, (int)n, L->hs);
  moe_gemm(1, 0, L->M, L->hs, (int)n, 1.0f, L->xr + at * M, L->M, dpre, L->hs, 1.0f, g.dw1, L->hs);
}

// ---- deterministic mode with ESP > 1: the shards' sums over H as chains ----------------

// Received block b's rows: how many, and where they start.
static size_t block_rows(const moe_parm_layer *L, int b, size_t *at) {
  *at = L->blk_at[b];
  return (size_t)L->cnt_recv[b];
}

static int esp_spans(void *user, int b, float **p, size_t *n) {
  moe_parm_layer *L = user;
  size_t at;
  const size_t rows = block_rows(L, b, &at);
  p[0] = L->yr + at * (size_t)L->M;
  n[0] = rows * (size_t)L->M;
  return 1;
}

// Forward segment s of block b: y = h w2 over H, shard s's hs columns of it
// continuing shard s - 1's (shard 0: from 0), then b2 (the last shard).
static void esp_y_compute(void *user, int b, int s) {
  moe_parm_layer *L = user;
  size_t at;
  const size_t rows = block_rows(L, b, &at), M = (size_t)L->M, hs = (size_t)L->hs;
  if (rows == 0) return;
  const size_t el = (size_t)(b % L->Eh);
  float *y = L->yr + at * M;
  moe_gemm(0, 0, (int)rows, L->M, L->hs, 1.0f, L->h + at * hs, L->hs, L->t.w2 + el * hs * M, L->M,
           s == 0 ? 0.0f : 1.0f, y, L->M);
  if (s == L->ESP - 1) moe_bias_add_forward(y, L->t.b2 + el * M, (int)rows, L->M);
}

// Backward segment s of block b: dX = dpre w1^T over H, likewise (in place of
// dy, which the weight gradients no longer need).
static void esp_dx_compute(void *user, int b, int s) {
  moe_parm_layer *L = user;
  size_t at;
  const size_t rows = block_rows(L, b, &at), M = (size_t)L->M, hs = (size_t)L->hs;
  if (rows == 0) return;
  const size_t el = (size_t)(b % L->Eh);
  moe_gemm(0, 1, (int)rows, L->M, L->hs, 1.0f, L->dpre + at * hs, L->hs, L->t.w1 + el * M * hs,
           L->hs, s == 0 ? 0.0f : 1.0f, L->yr + at * M, L->M);
}

// The shards' forward in deterministic mode with ESP > 1: the 'ffn' expert's
// first GEMM, bias and activation on each shard's columns (no sum), then y
// as one chain over the ESP group per received block; every shard ends with
// the whole y of every block (so the way back takes shard 0's alone).
static moe_status det_shards_forward(moe_parm_layer *L, moe_layer_timing *tm) {
  const size_t M = (size_t)L->M, hs = (size_t)L->hs;
  det_block_starts(L);
  for (int b = 0; b < L->P * L->Eh; b++) {
    size_t at;
    const size_t rows = block_rows(L, b, &at), el = (size_t)(b % L->Eh);
    if (rows == 0) continue;
    float *pre = L->pre + at * hs;
    moe_gemm(0, 0, (int)rows, L->hs, L->M, 1.0f, L->xr + at * M, L->M, L->t.w1 + el * M * hs, L->hs,
             0.0f, pre, L->hs);
    moe_bias_add_forward(pre, L->t.b1 + el * hs, (int)rows, L->hs);
    if (L->cfg.act == MOE_ACT_GELU) {
      moe_gelu_forward(L->h + at * hs, pre, rows * hs);
    } else {
      moe_relu_forward(L->h + at * hs, pre, rows * hs);
    }
    tm->expert_flops += 4.0 * (double)rows * (double)M * (double)hs;
  }
  const moe_chain ch = {L->P * L->Eh, L->ESP, esp_owner, esp_y_compute, esp_spans, L};
  return moe_chain_run(L->ctx, L->esp, &ch, &L->chains, "Parm's shard chain (forward)");
}

static int det_spans(void *user, int el, float **p, size_t *n) {
  const moe_parm_layer *L = user;
  const size_t M = (size_t)L->M, hs = (size_t)L->hs;
  const moe_expert_grads g = shard_scratch_grads(L, (size_t)el);
  p[0] = g.dw1;
  n[0] = M * hs;
  p[1] = g.db1;
  n[1] = hs;
  p[2] = g.dw2;
  n[2] = hs * M;
  p[3] = g.db2;
  n[3] = M;
  return 4;
}

// The shards' backward in deterministic mode (ESP 1): for each local expert,
// one chain over the rows of the global batch in token order, which is data
// part by data part, and inside a part MP rank by MP rank (s1's token slices,
// s2's slices of the expert's rows); the part of data index d = dp EP + q
// reached its home of MP rank m from member q. So segment (d, m) belongs to
// the holder (dp, m): the rep group, rank dp MP + m (the baseline computes
// every row on each MP rank: its own chain over DP, the rep_dp group).
// Afterwards every holder has the whole gradients in its scratch.
static moe_status det_shards_backward(moe_parm_layer *L, moe_layer_timing *tm) {
  const int base = L->sched == MOE_PARM_BASELINE;
  det_block_starts(L);
  L->ch_tm = tm;
  const moe_chain ch = {L->Eh, L->DP * L->P * det_mps(L), det_owner, det_compute, det_spans, L};
  moe_status st = moe_chain_run(L->ctx, base ? L->rep_dp : L->rep, &ch, &L->chains,
                                "Parm's expert gradient chain");
  if (st == MOE_STATUS_OK && L->ESP > 1) {
    const moe_chain dx = {L->P * L->Eh, L->ESP, esp_owner, esp_dx_compute, esp_spans, L};
    st = moe_chain_run(L->ctx, L->esp, &dx, &L->chains, "Parm's shard chain (backward)");
  }
  return st;
}

// The shards over the received blocks: run_shards, or in the deterministic
// backward the chains.
static moe_status shards(moe_parm_layer *L, int backward, moe_layer_timing *tm) {
  if (backward && L->sl > 0) return det_shards_backward(L, tm);
  if (L->sl > 0 && L->ESP > 1) return det_shards_forward(L, tm);
  run_shards(L, backward, L->cnt_recv, L->P * L->Eh, L->Eh, L->yr, tm);
  return MOE_STATUS_OK;
}

// Where part m of `parts` equal parts of n items starts (part m is
// [split_at(n, m, parts), split_at(n, m + 1, parts))): s1's token slices and
// s2's slices of each expert's rows.
static int split_at(int n, int m, int parts) { return (int)((long long)n * m / parts); }

// s1's MP-AllGather of the (tokens, M) slices of buf (in place): the
// outputs in the forward, the input gradients in the backward.
static moe_status mp_gather_tokens(moe_parm_layer *L, float *buf, int tokens, double *ms) {
  moe_status st = MOE_STATUS_OK;
  const uint64_t t0 = moe_time_ns();
  for (int m = 0; m < L->MP; m++) {
    const int lo = split_at(tokens, m, L->MP);
    L->mcnt[m] = (split_at(tokens, m + 1, L->MP) - lo) * L->M;
    L->mdis[m] = lo * L->M;
  }
  MOE_MPI_TRY_OP(
      L->ctx, "Parm MP-AllGather",
      MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf, L->mcnt, L->mdis, MPI_FLOAT, L->mp));
  *ms += moe_time_ms_since(t0);
done:
  return st;
}

// My part of each expert's rows (s2: a 1/MP slice; else all), packed from
// src (route order) into xs; gfirst/grows per EP rank.
static void pack_part(moe_parm_layer *L, const float *src) {
  const moe_route *r = &L->route;
  const size_t M = (size_t)L->M;
  const int split = L->sched == MOE_PARM_S2 ? L->MP : 1, m = L->sched == MOE_PARM_S2 ? L->me.mp : 0;
  int at = 0;
  for (int g = 0; g < L->EP; g++) {
    L->gfirst[g] = at;
    for (int el = 0; el < L->Eh; el++) {
      const int e = g * L->Eh + el, n = r->count[e];
      const int lo = split_at(n, m, split), hi = split_at(n, m + 1, split);
      L->part_lo[e] = lo;
      L->part_n[e] = hi - lo;
      memcpy(L->xs + (size_t)at * M, src + (size_t)(r->offset[e] + lo) * M,
             (size_t)(hi - lo) * M * sizeof(float));
      at += hi - lo;
    }
    L->grows[g] = at - L->gfirst[g];
  }
}

// Local combine of EP rank g's part: sum[g's rows] = the ESP partial outputs
// in `back` (member order, member (g, s) at back_at[s]) added in shard order.
static void local_combine(moe_parm_layer *L, int g, const float *back, const size_t *back_at) {
  const size_t M = (size_t)L->M, n = (size_t)L->grows[g] * M;
  float *out = L->sum + (size_t)L->gfirst[g] * M;
  const float *b0 = back + back_at[g * L->ESP] * M;
  memcpy(out, b0, n * sizeof(float));
  // (deterministic: every shard holds the whole chained sum; shard 0's is it)
  for (int s = 1; s < L->ESP && L->sl == 0; s++) {
    const float *bs = back + back_at[g * L->ESP + s] * M;
    for (size_t i = 0; i < n; i++) out[i] += bs[i];
  }
}

// dst (route order) <- my part (packed in `sum`) of EP ranks g0 .. g1 - 1.
static void unpack_part(moe_parm_layer *L, int g0, int g1, float *dst) {
  const moe_route *r = &L->route;
  const size_t M = (size_t)L->M;
  for (int g = g0; g < g1; g++) {
    size_t at = (size_t)L->gfirst[g];
    for (int e = g * L->Eh; e < (g + 1) * L->Eh; e++) {
      memcpy(dst + (size_t)(r->offset[e] + L->part_lo[e]) * M, L->sum + at * M,
             (size_t)L->part_n[e] * M * sizeof(float));
      at += (size_t)L->part_n[e];
    }
  }
}

// The MP-AllGather of s2 for EP ranks g0 .. g1 - 1 (their experts' rows):
// counts and displacements of the gather (floats), my rows at `sum`.
static void gather_counts(moe_parm_layer *L, int g0, int g1, int *mine) {
  const moe_route *r = &L->route;
  int at = 0;
  *mine = 0;
  for (int m = 0; m < L->MP; m++) {
    int n = 0;
    for (int e = g0 * L->Eh; e < g1 * L->Eh; e++) {
      const int c = r->count[e];
      n += split_at(c, m + 1, L->MP) - split_at(c, m, L->MP);
    }
    L->mcnt[m] = n * L->M;
    L->mdis[m] = at;
    at += n * L->M;
    if (m == L->me.mp) *mine = n * L->M;
  }
}

// stg (the gather of EP ranks g0 .. g1 - 1, peer-major) -> dst (route order).
static void gather_unpack(moe_parm_layer *L, int g0, int g1, const float *stg, float *dst) {
  const moe_route *r = &L->route;
  const size_t M = (size_t)L->M;
  size_t at = 0;
  for (int m = 0; m < L->MP; m++) {
    for (int e = g0 * L->Eh; e < g1 * L->Eh; e++) {
      const int c = r->count[e];
      const int lo = split_at(c, m, L->MP), hi = split_at(c, m + 1, L->MP);
      memcpy(dst + (size_t)(r->offset[e] + lo) * M, stg + at * M,
             (size_t)(hi - lo) * M * sizeof(float));
      at += (size_t)(hi - lo);
    }
  }
}

// The EP&ESP path of s1 and s2: my part of src (route order) goes to every
// shard of its experts (Dump + one all-to-all), the shards compute (forward,
// or backward with the forward's received rows), their outputs come back and
// are summed (local combine); dst (route order) gets my part, or (s2) every
// row after the MP-AllGather (with SAA overlapped with the way back).
static moe_status epesp_pass(moe_parm_layer *L, int backward, const float *src, float *dst,
                             moe_parm_timing *pt, moe_layer_timing *tm) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const int P = L->P, Eh = L->Eh, ESP = L->ESP;
  const size_t M = (size_t)L->M, row = M * sizeof(float);
  MPI_Comm ac = L->a2a.comm;
  uint64_t t0 = moe_time_ns();
  pack_part(L, src);
  if (!backward) {
    // counts: member q' gets, for each of its experts, the rows of my part
    for (int q = 0; q < P; q++) {
      for (int el = 0; el < Eh; el++) L->cnt_send[q * Eh + el] = L->part_n[(q / ESP) * Eh + el];
    }
    MOE_MPI_TRY_OP(ctx, "Parm counts exchange",
                   MPI_Alltoall(L->cnt_send, Eh, MPI_INT, L->cnt_recv, Eh, MPI_INT, ac));
    L->recv_total = 0;
    for (int q = 0; q < P; q++) {
      int n = 0;
      for (int el = 0; el < Eh; el++) n += L->cnt_recv[q * Eh + el];
      L->member_rows[q] = n;
      L->recv_total += n;
    }
    MOE_FAIL_IF(ctx, (size_t)L->recv_total > L->RI, MOE_STATUS_INTERNAL,
                "Parm layer: %d rows received, buffers hold %zu", L->recv_total, L->RI);
  }
  // the way back: member q' sends me its shard's rows of my part for its
  // experts, into xb at back_at[q'] (rows)
  size_t *back_at = L->rd;
  {
    size_t at = 0;
    for (int q = 0; q < P; q++) {
      back_at[q] = at;
      at += (size_t)L->grows[q / ESP];
    }
  }
  const int s2 = L->sched == MOE_PARM_S2 && L->MP > 1, saa = s2 && L->saa;
  if (L->ex) {  // way there, shards, way back (and SAA's gathers) as the executor's tasks
    // (the expert tasks' time; the rest of the pass's, its all-to-alls and
    // with SAA its gathers, as the unchunked SAA counts them: all-to-all)
    double ems = 0;
    MOE_TRY(moe_parm_chunked_pass_(L, backward, saa, L->xb, back_at, tm, &ems));
    pt->expert_ms += ems;
    pt->a2a_ms += moe_time_ms_since(t0) - ems;
    if (saa) {
      t0 = moe_time_ns();
      moe_parm_saa_unpack_(L, dst);
      pt->mp_ms += moe_time_ms_since(t0);
      goto done;
    }
  } else {
    float *recv = backward ? L->yr : L->xr;
    MOE_TRY(moe_parm_dump_a2a(ctx, L->algo, &L->a2a, ESP, L->xs, L->grows, L->gfirst, L->M, recv,
                              L->member_rows, L->dump_counts, &L->ws));
    pt->a2a_ms += moe_time_ms_since(t0);
    t0 = moe_time_ns();
    MOE_TRY(shards(L, backward, tm));
    pt->expert_ms += moe_time_ms_since(t0);
  }
  t0 = moe_time_ns();
  if (!saa) {
    if (!L->ex) {
      size_t sat = 0;
      for (int q = 0; q < P; q++) {
        L->sc[q] = (size_t)L->member_rows[q] * row;
        L->sd[q] = sat;
        sat += L->sc[q];
      }
      size_t *rc = L->rc, *rdb = L->back_displs;
      for (int q = 0; q < P; q++) {
        rc[q] = (size_t)L->grows[q / ESP] * row;
        rdb[q] = back_at[q] * row;
      }
      MOE_TRY(moe_a2a_run(ctx, L->algo, &L->a2a, L->yr, L->sc, L->sd, L->xb, rc, rdb, &L->ws));
    }
    for (int g = 0; g < L->EP; g++) local_combine(L, g, L->xb, back_at);
    pt->a2a_ms += moe_time_ms_since(t0);
    if (!s2) {
      unpack_part(L, 0, L->EP, dst);
      goto done;
    }
    t0 = moe_time_ns();
    int mine = 0;
    gather_counts(L, 0, L->EP, &mine);
    MOE_MPI_TRY_OP(
        ctx, "Parm MP-AllGather",
        MPI_Allgatherv(L->sum, mine, MPI_FLOAT, L->stg, L->mcnt, L->mdis, MPI_FLOAT, L->mp));
    gather_unpack(L, 0, L->EP, L->stg, dst);
    pt->mp_ms += moe_time_ms_since(t0);
    goto done;
  }
  {
    // SAA: the way back as point-to-point transfers, all posted; then, EP rank
    // by EP rank (from mine on: the same order on every MP peer), its ESP
    // partials summed and its rows all-gathered over MP while the others
    // still arrive.
    MPI_Request *rq = L->reqs, *ag = L->reqs + 2 * P;
    for (int i = 0; i < 2 * P + L->EP; i++) rq[i] = MPI_REQUEST_NULL;
    const int tag = 0x5aa;
    size_t sat = 0;
    for (int q = 0; q < P; q++) {
      MOE_MPI_TRY_OP(ctx, "Parm SAA",
                     MPI_Irecv(L->xb + back_at[q] * M, L->grows[q / ESP] * L->M, MPI_FLOAT, q, tag,
                               ac, &rq[q]));
    }
    for (int q = 0; q < P; q++) {
      MOE_MPI_TRY_OP(
          ctx, "Parm SAA",
          MPI_Isend(L->yr + sat * M, L->member_rows[q] * L->M, MPI_FLOAT, q, tag, ac, &rq[P + q]));
      sat += (size_t)L->member_rows[q];
    }
    // each EP rank's gather has its own counts (the same on every MP peer)
    int *cnt = L->saa_cnt;
    size_t stg_at = 0;
    for (int i = 0; i < L->EP && st == MOE_STATUS_OK; i++) {
      const int g = (L->me.ep + i) % L->EP;
      int rc = MPI_Waitall(ESP, rq + g * ESP, L->statuses);
      if (rc != MPI_SUCCESS) {
        st = moe_mpi_error(ctx, rc, "MPI_Waitall (Parm SAA)", __FILE__, __LINE__);
        break;
      }
      local_combine(L, g, L->xb, back_at);
      int mine = 0;
      gather_counts(L, g, g + 1, &mine);
      int *gc = cnt + (size_t)2 * L->MP * g, *gd = gc + L->MP;
      for (int m = 0; m < L->MP; m++) {
        gc[m] = L->mcnt[m];
        gd[m] = L->mdis[m] + (int)stg_at;
      }
      stg_at += (size_t)(L->mdis[L->MP - 1] + L->mcnt[L->MP - 1]);
      rc = MPI_Iallgatherv(L->sum + (size_t)L->gfirst[g] * M, mine, MPI_FLOAT, L->stg, gc, gd,
                           MPI_FLOAT, L->mp, &ag[g]);
      if (rc != MPI_SUCCESS) st = moe_mpi_error(ctx, rc, "MPI_Iallgatherv", __FILE__, __LINE__);
    }
    const int wd = moe_watchdog_op_begin("Parm SAA", NULL);
    const int rc1 = MPI_Waitall(2 * P + L->EP, rq, L->statuses);
    moe_watchdog_op_end(wd);
    if (st == MOE_STATUS_OK && rc1 != MPI_SUCCESS)
      st = moe_mpi_error(ctx, rc1, "MPI_Waitall (Parm SAA)", __FILE__, __LINE__);
    if (st == MOE_STATUS_OK) {
      // every EP rank's gathered block, in the order the gathers were started
      size_t blk = 0;
      for (int i = 0; i < L->EP; i++) {
        const int g = (L->me.ep + i) % L->EP;
        const int *gc = cnt + (size_t)2 * L->MP * g;
        gather_unpack(L, g, g + 1, L->stg + blk, dst);
        for (int m = 0; m < L->MP; m++) blk += (size_t)gc[m];
      }
    }
    pt->a2a_ms += moe_time_ms_since(t0);
  }
done:
  return st;
}

// The baseline's path (DeepSpeed-MoE): ESP-AllGather of my rows, EP
// all-to-all, shards, ESP-AllReduce (forward) of the partial outputs, EP
// all-to-all back, ESP-Split; the backward: ESP-AllGather of the rows'
// gradients, EP all-to-all, shards' backward, EP all-to-all back,
// ESP-ReduceScatter of the partial input gradients.
static moe_status baseline_pass(moe_parm_layer *L, int backward, const float *src, float *dst,
                                moe_parm_timing *pt, moe_layer_timing *tm) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const moe_route *r = &L->route;
  const int EP = L->EP, ESP = L->ESP, Eh = L->Eh, E = L->E;
  const size_t M = (size_t)L->M, row = M * sizeof(float);
  uint64_t t0 = moe_time_ns();
  // ESP-AllGather: counts per expert of every member (forward), then the rows
  if (!backward) {
    MOE_MPI_TRY_OP(ctx, "Parm ESP-AllGather",
                   MPI_Allgather(r->count, E, MPI_INT, L->gcnt, E, MPI_INT, L->esp));
  }
  int *mrows = L->mcnt, *mdis = L->mdis;  // members' rows (floats) and displacements
  {
    int at = 0;
    for (int s = 0; s < ESP; s++) {
      int n = 0;
      for (int e = 0; e < E; e++) n += L->gcnt[s * E + e];
      mrows[s] = n * L->M;
      mdis[s] = at;
      at += n * L->M;
    }
  }
  MOE_MPI_TRY_OP(
      ctx, "Parm ESP-AllGather",
      MPI_Allgatherv(src, r->rows * L->M, MPI_FLOAT, L->xs, mrows, mdis, MPI_FLOAT, L->esp));
  pt->esp_ms += moe_time_ms_since(t0);
  // pack for EP rank g: (member s, local expert) blocks; sc/sd per EP rank
  t0 = moe_time_ns();
  {
    size_t at = 0;
    for (int g = 0; g < EP; g++) {
      L->sd[g] = at * row;
      for (int s = 0; s < ESP; s++) {
        size_t first = (size_t)mdis[s] / M;
        for (int e = 0; e < g * Eh; e++) first += (size_t)L->gcnt[s * E + e];
        size_t n = 0;
        for (int el = 0; el < Eh; el++) n += (size_t)L->gcnt[s * E + g * Eh + el];
        memcpy(L->xb + at * M, L->xs + first * M, n * row);
        at += n;
      }
      L->sc[g] = at * row - L->sd[g];
    }
  }
  if (!backward) {
    // counts: EP rank g gets (member, local expert) counts of its experts
    for (int g = 0; g < EP; g++) {
      for (int s = 0; s < ESP; s++) {
        for (int el = 0; el < Eh; el++)
          L->cnt_send[(g * ESP + s) * Eh + el] = L->gcnt[s * E + g * Eh + el];
      }
    }
    MOE_MPI_TRY_OP(
        ctx, "Parm counts exchange",
        MPI_Alltoall(L->cnt_send, ESP * Eh, MPI_INT, L->cnt_recv, ESP * Eh, MPI_INT, L->ep.comm));
    L->recv_total = 0;
    for (int g = 0; g < EP; g++) {
      int n = 0;
      for (int i = 0; i < ESP * Eh; i++) n += L->cnt_recv[g * ESP * Eh + i];
      L->member_rows[g] = n;
      L->recv_total += n;
    }
    MOE_FAIL_IF(ctx, (size_t)L->recv_total > L->RI, MOE_STATUS_INTERNAL,
                "Parm layer: %d rows received, buffers hold %zu", L->recv_total, L->RI);
  }
  {
    size_t at = 0;
    for (int g = 0; g < EP; g++) {
      L->rc[g] = (size_t)L->member_rows[g] * row;
      L->rd[g] = at;
      at += L->rc[g];
    }
  }
  float *recv = backward ? L->yr : L->xr;
  MOE_TRY(moe_a2a_run(ctx, L->algo, &L->ep, L->xb, L->sc, L->sd, recv, L->rc, L->rd, &L->ws));
  pt->a2a_ms += moe_time_ms_since(t0);
  t0 = moe_time_ns();
  MOE_TRY(shards(L, backward, tm));
  pt->expert_ms += moe_time_ms_since(t0);
  if (!backward && ESP > 1 && L->sl == 0) {  // (deterministic: chained, on every shard)
    t0 = moe_time_ns();
    MOE_MPI_TRY_OP(
        ctx, "Parm ESP-AllReduce",
        MPI_Allreduce(MPI_IN_PLACE, L->yr, L->recv_total * L->M, MPI_FLOAT, MPI_SUM, L->esp));
    pt->esp_ms += moe_time_ms_since(t0);
  }
  // back: the same blocks the other way, into xb's layout
  t0 = moe_time_ns();
  MOE_TRY(moe_a2a_run(ctx, L->algo, &L->ep, L->yr, L->rc, L->rd, L->xb, L->sc, L->sd, &L->ws));
  // unpack into member-major order (xs's layout)
  {
    size_t at = 0;
    for (int g = 0; g < EP; g++) {
      for (int s = 0; s < ESP; s++) {
        size_t first = (size_t)mdis[s] / M;
        for (int e = 0; e < g * Eh; e++) first += (size_t)L->gcnt[s * E + e];
        size_t n = 0;
        for (int el = 0; el < Eh; el++) n += (size_t)L->gcnt[s * E + g * Eh + el];
        memcpy(L->xs + first * M, L->xb + at * M, n * row);
        at += n;
      }
    }
  }
  pt->a2a_ms += moe_time_ms_since(t0);
  t0 = moe_time_ns();
  if (!backward) {  // ESP-Split: my rows
    memcpy(dst, L->xs + (size_t)mdis[L->me.esp], (size_t)r->rows * row);
  } else if (L->sl > 0) {  // deterministic: every shard holds the chained dX; my rows
    memcpy(dst, L->xs + (size_t)mdis[L->me.esp], (size_t)r->rows * row);
  } else {  // ESP-ReduceScatter of the shards' partial input gradients
    MOE_MPI_TRY_OP(ctx, "Parm ESP-ReduceScatter",
                   MPI_Reduce_scatter(L->xs, dst, mrows, MPI_FLOAT, MPI_SUM, L->esp));
  }
  pt->esp_ms += moe_time_ms_since(t0);
done:
  return st;
}

// ---- forward and backward ---------------------------------------------------------

moe_status moe_parm_layer_forward(moe_parm_layer *L, const float *x, int tokens, float *y,
                                  moe_layer_stats *stats) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_INVALID_ARG, "layer must not be NULL");
  L->have_forward = 0;
  const uint64_t t_start = moe_time_ns();
  memset(&L->tf, 0, sizeof L->tf);
  moe_layer_timing tm;
  memset(&tm, 0, sizeof tm);
  {
    // local checks, then the MP peers' token counts: one agreement
    moe_status local = moe_forward_checks(ctx, &L->cfg, x, tokens, y);
    if (local == MOE_STATUS_OK && L->broken) {
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "Parm layer: an earlier chunked pass failed with an all-to-all in "
                           "flight; destroy and recreate the layer");
    }
    int tt[2] = {tokens, -tokens}, red[2] = {0, 0};
    MOE_MPI_TRY_OP(ctx, "Parm forward", MPI_Allreduce(tt, red, 2, MPI_INT, MPI_MAX, L->mp));
    if (local == MOE_STATUS_OK && red[0] != -red[1]) {
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "Parm forward: MP peers pass different token counts (%d .. %d); they "
                           "must pass the same tokens",
                           -red[1], red[0]);
    }
    const int per = (L->sched == MOE_PARM_S1 ? L->MP : 1) * L->sl;
    if (local == MOE_STATUS_OK && L->sl > 0 && tokens % per != 0) {
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "Parm forward (deterministic): %d tokens do not cut into slices of %d "
                           "tokens%s",
                           tokens, L->sl, L->sched == MOE_PARM_S1 ? " on each MP rank (s1)" : "");
    }
    MOE_TRY(moe_comm_agree(ctx, L->world, local, "Parm forward"));
  }
  const moe_layer_config *c = &L->cfg;
  const size_t M = (size_t)L->M;
  const int s1 = L->sched == MOE_PARM_S1;
  L->gate_first = s1 ? split_at(tokens, L->me.mp, L->MP) : 0;
  L->gate_tokens = s1 ? split_at(tokens, L->me.mp + 1, L->MP) - L->gate_first : tokens;
  const float *xg = x + (size_t)L->gate_first * M;
  // gate, routing, losses over the global batch
  moe_gate_buffers gb = {
      L->logits, L->probs, L->lse, L->topk_p, moe_router_bias_active(L->router_bias, L->E),
      L->scores, NULL,     0,      NULL,      0};
  MOE_TRY(moe_gate_route(ctx, c, L->t.wg, xg, L->gate_tokens, &gb, &L->route, &tm));
  moe_gate_loss_stats(c, &gb, &L->route, L->gate_tokens, L->stats);
  MOE_MPI_TRY_OP(ctx, "Parm gate statistics",
                 MPI_Allreduce(MPI_IN_PLACE, L->stats, (int)MOE_LOSS_STATS(L->E), MPI_DOUBLE,
                               MPI_SUM, s1 ? L->world : L->data));
  if (L->sl > 0)
    MOE_TRY(moe_parallel_ordered_gate_sums_(ctx, &gb, L->E, L->sl, L->gate_tokens, L->slice_sums,
                                            L->max_slices, L->stats, s1 ? L->world : L->data));
  moe_gate_losses(c, L->stats, &L->last.aux_loss, &L->last.z_loss);
  if (L->sched == MOE_PARM_S2 && L->MP > 1) {
    // s2 splits each expert's rows over MP: the peers' routing must agree
    // (the same tokens give the same routing; other tokens would corrupt the
    // gathers): the counts' minimum and maximum over MP, one agreement
    int *v = L->cnt_send;  // (2 E of its P ESP Eh + E + 1) free until the dispatch
    for (int e = 0; e < L->E; e++) v[L->E + e] = -(v[e] = L->route.count[e]);
    MOE_MPI_TRY_OP(ctx, "Parm forward",
                   MPI_Allreduce(MPI_IN_PLACE, v, 2 * L->E, MPI_INT, MPI_MAX, L->mp));
    moe_status local = MOE_STATUS_OK;
    for (int e = 0; e < L->E && local == MOE_STATUS_OK; e++) {
      if (v[e] != -v[L->E + e])
        local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                             "Parm forward (s2): MP peers route %d..%d rows to expert %d; they "
                             "must pass the same tokens",
                             -v[L->E + e], v[e], e);
    }
    MOE_TRY(moe_comm_agree(ctx, L->world, local, "Parm forward"));
  }
  moe_dispatch_forward(&L->route, xg, L->M, L->xe);
  if (L->sched == MOE_PARM_BASELINE) {
    MOE_TRY(baseline_pass(L, 0, L->xe, L->ye, &L->tf, &tm));
  } else {
    MOE_TRY(epesp_pass(L, 0, L->xe, L->ye, &L->tf, &tm));
  }
  moe_combine_forward(&L->route, L->ye, L->M, L->gate_tokens, y + (size_t)L->gate_first * M);
  if (s1 && L->MP > 1) MOE_TRY(mp_gather_tokens(L, y, tokens, &L->tf.mp_ms));
  L->x_last = x;
  L->tokens_last = tokens;
  L->have_forward = 1;
  L->last.tokens = L->gate_tokens;
  L->last.rows = L->route.rows;
  L->last.dropped = L->route.dropped;
  L->last.rerouted = 0;
  if (stats) *stats = L->last;
  L->tf.total_ms = moe_time_ms_since(t_start);
done:
  return st;
}

// buf (n floats) summed over comm in place, in pieces that fit MPI's int counts.
static moe_status sum_pieces(moe_ctx *ctx, float *buf, size_t n, MPI_Comm comm) {
  moe_status st = MOE_STATUS_OK;
  const size_t piece = (size_t)1 << 30;
  for (size_t i = 0; i < n; i += piece) {
    const size_t c = n - i < piece ? n - i : piece;
    MOE_MPI_TRY_OP(ctx, "Parm gradient sums",
                   MPI_Allreduce(MPI_IN_PLACE, buf + i, (int)c, MPI_FLOAT, MPI_SUM, comm));
  }
done:
  return st;
}

moe_status moe_parm_layer_backward(moe_parm_layer *L, const float *dy, float *dx) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_INVALID_ARG, "layer must not be NULL");
  {
    moe_status local = MOE_STATUS_OK;
    if (!L->have_forward) {
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "backward needs a successful forward first");
    } else if (L->broken) {
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "Parm layer: an earlier chunked pass failed with an all-to-all in "
                           "flight; destroy and recreate the layer");
    } else if (L->tokens_last > 0 && (!dy || !dx)) {
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "dy and dx must not be NULL");
    } else if (L->cfg.check_finite && L->tokens_last > 0) {
      local = moe_check_finite(ctx, "gradient dy", dy, L->tokens_last, L->M);
    }
    MOE_TRY(moe_comm_agree(ctx, L->world, local, "Parm backward"));
  }
  const uint64_t t_start = moe_time_ns();
  memset(&L->tb, 0, sizeof L->tb);
  moe_layer_timing tm;
  memset(&tm, 0, sizeof tm);
  const moe_layer_config *c = &L->cfg;
  const size_t M = (size_t)L->M, T = (size_t)L->tokens_last;
  const int s1 = L->sched == MOE_PARM_S1;
  const moe_route *r = &L->route;
  memset(L->gscratch, 0, (L->n_gate + L->n_expert) * sizeof(float));
  const size_t g0 = (size_t)L->gate_first;
  moe_combine_backward(r, dy + g0 * M, L->ye, L->M, L->gate_tokens, L->dye, L->dweight);
  if (L->sched == MOE_PARM_BASELINE) {
    MOE_TRY(baseline_pass(L, 1, L->dye, L->dxe, &L->tb, &tm));
  } else {
    MOE_TRY(epesp_pass(L, 1, L->dye, L->dxe, &L->tb, &tm));
  }
  float *dxg = dx + g0 * M;
  memset(dxg, 0, (size_t)L->gate_tokens * M * sizeof(float));
  moe_dispatch_backward(r, L->dxe, L->M, dxg);
  moe_gate_buffers gb = {L->logits, L->probs, L->lse, L->topk_p, NULL, NULL, NULL, 0, NULL, 0};
  moe_gate_backward(c, &gb, r, L->gate_tokens, L->stats, L->dweight, L->dprobs, L->dlogits,
                    L->x_last + g0 * M, L->t.wg, L->sl > 0 ? NULL : L->gscratch, dxg, &tm);
  if (L->sl > 0)  // x^T dlogits as the pairwise sum over slices of sl tokens
    moe_pairwise_wgrad(&L->gate_pw, moe_gemm_fp32, L->gscratch, NULL, L->x_last + g0 * M,
                       L->dlogits, L->gate_tokens / L->sl, L->sl, L->M, L->E);
  if (s1 && L->MP > 1) MOE_TRY(mp_gather_tokens(L, dx, (int)T, &L->tb.mp_ms));
  {
    // sums over the replicas: the gate over one copy of the global batch (s1:
    // every rank's tokens are its own), the shards over their holders (the
    // baseline computes every token on each MP peer: DP only)
    const uint64_t t0 = moe_time_ns();
    // (deterministic: the gate's in the fixed order; the experts' chains
    // already left the whole gradients with every holder)
    if (L->sl > 0) {
      MOE_TRY(moe_allreduce_fixed(ctx, &L->fixed_gate, L->gscratch, L->n_gate,
                                  s1 ? L->world : L->data, "Parm gradient sums"));
    } else {
      MOE_TRY(sum_pieces(ctx, L->gscratch, L->n_gate, s1 ? L->world : L->data));
      MOE_TRY(sum_pieces(ctx, L->gscratch + L->n_gate, L->n_expert,
                         L->sched == MOE_PARM_BASELINE ? L->rep_dp : L->rep));
    }
    for (size_t i = 0; i < L->n_gate + L->n_expert; i++) L->grads[i] += L->gscratch[i];
    L->tb.reduce_ms = moe_time_ms_since(t0);
  }
  L->tb.total_ms = moe_time_ms_since(t_start);
done:
  return st;
}

moe_status moe_parm_layer_backward_add(moe_parm_layer *L, const float *dy, float *dx) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_INVALID_ARG, "layer must not be NULL");
  MOE_TRY(moe_parm_layer_backward(L, dy, L->dx_add));
  const size_t n = (size_t)L->tokens_last * (size_t)L->M;
  for (size_t i = 0; i < n; i++) dx[i] += L->dx_add[i];
done:
  return st;
}
