// MoE-GPT: the model's parameters, forward and backward (docs/model.md).
//
// Layout: the dense parameters (embeddings, attention, layernorms, dense FFNs)
// live in one arena, data then gradients, in the order of the parameter table;
// the MoE FFNs' tensors are views into their backend (moe_gpt_moe_ops). The
// activations of every block and the backward scratch live in a second arena
// sized for max_batch x seq_len tokens, so forward and backward allocate
// nothing. Every big product is one BLAS GEMM over all B*S rows; attention is
// moe_attention_forward/backward.
//
// Forward, for N = B*S rows (x_l is (N, M), the residual stream into block l):
//   x_0 = wte[tokens] + wpe[positions]
//   per block: a = ln1(x_l); qkv = a w_qkv + b_qkv; y = attn(qkv);
//              r = x_l + y w_proj + b_proj; c = ln2(r);
//              x_{l+1} = r + ffn(c)      (MoE layer, or gelu(c w_fc + b_fc) w_fc2 + b_fc2)
//   logits = lnf(x_L) wte^T; loss = sum over targets of CE / denominator.
// Backward walks the same steps in reverse with one residual gradient buffer
// (N, M) that every branch accumulates into.
//
// Tensor parallelism (moe_gpt_create_tp, docs/model.md): each MP rank holds its
// heads' columns of w_qkv and rows of w_proj, and its columns of w_fc and rows
// of w_fc2; y w_proj and the dense FFN's output are partial sums, all-reduced
// before b_proj / b_fc2 (Megatron's g); the gradients entering ln1's and ln2's
// backward are all-reduced likewise (f). Everything else is replicated.
//
// Not here: the optimizer (optim.c), configuration (gpt_config.c), the MoE
// layer itself (src/layer/), communication (the trainer's backend and the
// MP all-reduce it passes in moe_gpt_tp).
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/gpt_internal.h"
#include "moe/kernels.h"
#include "moe/layer_ops.h"
#include "moe/model.h"

// ---- parameter table -----------------------------------------------------------------

// FNV-1a of the tensor name: the RNG stream of its init, independent of where
// the tensor lives and of which other tensors exist.
static uint64_t name_stream(const char *name) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 1099511628211ull;
  }
  return h;
}

static size_t pad16(size_t n) { return (n + 15) & ~(size_t)15; }  // 64-byte steps

typedef struct {
  float **data, **grad;  // where the dense pointers go once allocated (NULL for MoE)
  size_t offset;         // dense: offset in the dense region (floats)
} param_slot;

// tp_dim >= 0: the tensor is split along that dimension over the MP ranks
// (when there are more than one), packed from tp_parts equal parts.
static void add_param(moe_gpt *m, param_slot *slots, const char *name, moe_gpt_param_kind kind,
                      int ndim, const int64_t *dims, int decay, int block, int tp_dim, int tp_parts,
                      float **data, float **grad) {
  moe_gpt_param *p = &m->params[m->n_params];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  p->kind = kind;
  p->ndim = ndim;
  size_t numel = 1;
  for (int d = 0; d < 4; d++) {
    p->dims[d] = d < ndim ? dims[d] : 1;
    numel *= (size_t)p->dims[d];
  }
  p->tp_dim = -1;
  p->tp_parts = 1;
  if (tp_dim >= 0 && m->tp.size > 1) {
    p->tp_dim = tp_dim;
    p->tp_parts = tp_parts;
    p->tp_count = (int)(p->dims[tp_dim] / tp_parts / m->tp.size);
    p->tp_first = m->tp.rank * p->tp_count;
    numel /= (size_t)m->tp.size;
  }
  p->numel = numel;
  p->decay = decay;
  p->block = block;
  param_slot *s = &slots[m->n_params];
  s->data = data;
  s->grad = grad;
  if (kind == MOE_GPT_PARAM_DENSE) {
    s->offset = m->dense_floats;
    m->dense_floats += pad16(numel);
  }
  m->n_params++;
}

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})

// The whole table, in its documented order (docs/model.md). MoE tensors get
// their pointers later, from the backend.
static void build_param_table(moe_gpt *m, param_slot *slots) {
  const moe_gpt_config *c = &m->cfg;
  const int64_t V = c->vocab_size, S = c->seq_len, M = c->d_model, Hd = c->dense_hidden;
  const int64_t E = c->moe.num_experts, H = c->moe.hidden_dim;
  const moe_gpt_param_kind D = MOE_GPT_PARAM_DENSE;
  char nm[64];
  m->n_params = 0;
  m->dense_floats = 0;
  add_param(m, slots, "wte", D, 2, DIMS(V, M), 1, -1, -1, 1, &m->wte, &m->dwte);
  add_param(m, slots, "wpe", D, 2, DIMS(S, M), 1, -1, -1, 1, &m->wpe, &m->dwpe);
  for (int l = 0; l < c->n_layer; l++) {
    gpt_block *b = &m->blocks[l];
// tp: the split dimension (-1: whole on every MP rank) and its parts
#define ADD(suffix, ndim, dims, decay, tp, parts, field)                                   \
  do {                                                                                     \
    snprintf(nm, sizeof nm, "h%d.%s", l, suffix);                                          \
    add_param(m, slots, nm, D, ndim, dims, decay, l, tp, parts, &b->p.field, &b->g.field); \
  } while (0)
#define ADD_MOE(suffix, kind, ndim, dims, decay)                            \
  do {                                                                      \
    snprintf(nm, sizeof nm, "h%d.%s", l, suffix);                           \
    add_param(m, slots, nm, kind, ndim, dims, decay, l, -1, 1, NULL, NULL); \
  } while (0)
    // Megatron's split: w_qkv by columns (each of q, k, v: this rank's heads),
    // w_proj by rows; w_fc by columns, w_fc2 by rows; the biases that follow an
    // all-reduce (b_proj, b_fc2) whole.
    ADD("ln1.g", 1, DIMS(M), 0, -1, 1, ln1_g);
    ADD("ln1.b", 1, DIMS(M), 0, -1, 1, ln1_b);
    ADD("attn.w_qkv", 2, DIMS(M, 3 * M), 1, 1, 3, w_qkv);
    ADD("attn.b_qkv", 1, DIMS(3 * M), 0, 0, 3, b_qkv);
    ADD("attn.w_proj", 2, DIMS(M, M), 1, 0, 1, w_proj);
    ADD("attn.b_proj", 1, DIMS(M), 0, -1, 1, b_proj);
    ADD("ln2.g", 1, DIMS(M), 0, -1, 1, ln2_g);
    ADD("ln2.b", 1, DIMS(M), 0, -1, 1, ln2_b);
    if (b->is_moe) {
      // decay on the matrices; the expert biases b1 (E, H), b2 (E, M) are biases
      ADD_MOE("moe.wg", MOE_GPT_PARAM_GATE, 2, DIMS(M, E), 1);
      ADD_MOE("moe.w1", MOE_GPT_PARAM_EXPERT, 3, DIMS(E, M, H), 1);
      ADD_MOE("moe.b1", MOE_GPT_PARAM_EXPERT, 2, DIMS(E, H), 0);
      ADD_MOE("moe.w2", MOE_GPT_PARAM_EXPERT, 3, DIMS(E, H, M), 1);
      ADD_MOE("moe.b2", MOE_GPT_PARAM_EXPERT, 2, DIMS(E, M), 0);
    } else {
      ADD("ffn.w_fc", 2, DIMS(M, Hd), 1, 1, 1, w_fc);
      ADD("ffn.b_fc", 1, DIMS(Hd), 0, 0, 1, b_fc);
      ADD("ffn.w_fc2", 2, DIMS(Hd, M), 1, 0, 1, w_fc2);
      ADD("ffn.b_fc2", 1, DIMS(M), 0, -1, 1, b_fc2);
    }
#undef ADD
#undef ADD_MOE
  }
  add_param(m, slots, "lnf.g", D, 1, DIMS(M), 0, -1, -1, 1, &m->lnf_g, &m->dlnf_g);
  add_param(m, slots, "lnf.b", D, 1, DIMS(M), 0, -1, -1, 1, &m->lnf_b, &m->dlnf_b);
}

// Points the MoE entries of the table at the backend's tensors.
static void bind_moe_params(moe_gpt *m) {
  for (int i = 0; i < m->n_params; i++) {
    moe_gpt_param *p = &m->params[i];
    if (p->kind == MOE_GPT_PARAM_DENSE) continue;
    const moe_gpt_moe_tensors *t = &m->blocks[p->block].mt;
    const char *leaf = strrchr(p->name, '.') + 1;
    const size_t per_expert = p->kind == MOE_GPT_PARAM_EXPERT ? p->numel / (size_t)p->dims[0] : 0;
    if (p->kind == MOE_GPT_PARAM_GATE) {
      p->data = t->wg;
      p->grad = t->dwg;
      continue;
    }
    p->expert_first = t->home_first;
    p->expert_count = t->home_count;
    p->numel = per_expert * (size_t)t->home_count;
    if (t->shards > 1 && strcmp(leaf, "b2") != 0) {  // sharded along H (b2 whole)
      const int H = (int)p->dims[strcmp(leaf, "w1") == 0 ? 2 : 1];
      p->tp_dim = strcmp(leaf, "w1") == 0 ? 2 : 1;
      p->tp_parts = 1;
      p->tp_count = H / t->shards;
      p->tp_first = t->shard * p->tp_count;
      p->numel /= (size_t)t->shards;
    }
    if (strcmp(leaf, "w1") == 0) {
      p->data = t->w1;
      p->grad = t->dw1;
    } else if (strcmp(leaf, "b1") == 0) {
      p->data = t->b1;
      p->grad = t->db1;
    } else if (strcmp(leaf, "w2") == 0) {
      p->data = t->w2;
      p->grad = t->dw2;
    } else {
      p->data = t->b2;
      p->grad = t->db2;
    }
  }
}

// ---- where a slice sits ------------------------------------------------------------------

// The slice's outer index range and run shape: outer indices [o0, o1) over
// the dims before the split one (EXPERT: from the home experts only), parts
// of the split dimension, run = tp_count x inner (or, unsplit, the whole rest).
static void slice_shape(const moe_gpt_param *p, size_t *o0, size_t *o1, size_t *dim,
                        size_t *inner) {
  const int d = p->tp_dim;
  size_t outer = 1, in = 1;
  for (int k = 0; k < (d >= 0 ? d : 1); k++) outer *= (size_t)p->dims[k];
  for (int k = (d >= 0 ? d + 1 : 1); k < p->ndim; k++) in *= (size_t)p->dims[k];
  *dim = d >= 0 ? (size_t)p->dims[d] : 1;
  *inner = in;
  *o0 = 0;
  *o1 = outer;
  if (p->kind == MOE_GPT_PARAM_EXPERT && p->ndim > 0) {  // dims[0] = E: the home experts
    const size_t per = outer / (size_t)p->dims[0];
    *o0 = (size_t)p->expert_first * per;
    *o1 = (size_t)(p->expert_first + p->expert_count) * per;
  }
}

size_t moe_gpt_param_runs(const moe_gpt_param *p) {
  if (p->tp_dim < 0) return 1;
  size_t o0, o1, dim, inner;
  slice_shape(p, &o0, &o1, &dim, &inner);
  return (o1 - o0) * (size_t)p->tp_parts;
}

size_t moe_gpt_param_run(const moe_gpt_param *p, size_t k, size_t *offset) {
  size_t o0, o1, dim, inner;
  if (p->tp_dim < 0) {
    // whole, or (EXPERT) the home experts' contiguous block
    *offset = p->kind == MOE_GPT_PARAM_EXPERT && p->expert_count > 0
                  ? (size_t)p->expert_first * (p->numel / (size_t)p->expert_count)
                  : 0;
    return p->numel;
  }
  slice_shape(p, &o0, &o1, &dim, &inner);
  const size_t parts = (size_t)p->tp_parts, o = o0 + k / parts, t = k % parts;
  *offset = (o * dim + t * (dim / parts) + (size_t)p->tp_first) * inner;
  return (size_t)p->tp_count * inner;
}

// ---- create / destroy ------------------------------------------------------------------

// Bytes of the MoE layer's own working buffers for cfg (the formula of
// src/layer/layer.c: gate buffers, routing plan, expert rows and their grads).
static size_t moe_layer_work_bytes(const moe_layer_config *cfg) {
  const size_t T = (size_t)cfg->tokens, M = (size_t)cfg->model_dim, H = (size_t)cfg->hidden_dim,
               E = (size_t)cfg->num_experts, K = (size_t)cfg->top_k;
  const size_t R = moe_layer_max_rows(cfg);
  const size_t floats = 4 * T * E + T + 2 * T * K + 3 * R * M + 4 * R * H;
  const size_t ints = 2 * T * K + T * K + 3 * E + 1 + 2 * R;  // route (weight counted as int)
  return 4 * (floats + ints);
}

// Most entries of the activation table for L blocks.
#define GPT_MAX_SPECS(L) (16 * (L) + 16)

// The activation arena as a table of named tensors (step 3 of moe_gpt_create,
// sized by moe_gpt_memory from the same table). resid holds L + 1 pointers;
// specs GPT_MAX_SPECS(L) entries. Returns the number of entries.
static int activation_specs(moe_gpt *m, int max_batch, float **resid, moe_tensor_spec *specs,
                            float **shared_base, float **ints, int *any_dense_out) {
  const moe_gpt_config *c = &m->cfg;
  const int L = c->n_layer;
  // this rank's attention columns Ma and dense hidden columns (Hd here) under MP
  const size_t N = (size_t)max_batch * (size_t)c->seq_len, M = (size_t)c->d_model,
               V = (size_t)c->vocab_size, Hd = (size_t)m->hd_local, Ma = (size_t)m->m_local;
  const size_t att =
      (size_t)max_batch * (size_t)m->nh_local * (size_t)c->seq_len * (size_t)c->seq_len;
  const size_t att_scr =
      moe_attention_scratch_floats(max_batch, c->seq_len, m->nh_local, c->d_model / c->n_head);
  int any_dense = 0;
  for (int l = 0; l < L; l++) any_dense |= !m->blocks[l].is_moe;
  // Block scratch and dlogits share memory: dlogits is dead once dlnf and dwte are done.
  const size_t block_scr =
      pad16(3 * N * Ma) + pad16(N * Ma) + (any_dense ? 2 * pad16(N * Hd) : 0) + pad16(att_scr);
  const size_t shared = block_scr > N * V ? block_scr : N * V;
  int n = 0;
#define SPEC(name, count, ptr) \
  specs[n++] = (moe_tensor_spec) { name, count, ptr }
  for (int l = 0; l <= L; l++) SPEC("resid", N * M, &resid[l]);
  for (int l = 0; l < L; l++) {
    gpt_block *b = &m->blocks[l];
    SPEC("ln1", N * M, &b->ln1);
    SPEC("ln1_mean", N, &b->ln1_mean);
    SPEC("ln1_rstd", N, &b->ln1_rstd);
    SPEC("qkv", 3 * N * Ma, &b->qkv);
    SPEC("att", att, &b->att);
    SPEC("atty", N * Ma, &b->atty);
    SPEC("resid2", N * M, &b->resid2);
    SPEC("ln2", N * M, &b->ln2);
    SPEC("ln2_mean", N, &b->ln2_mean);
    SPEC("ln2_rstd", N, &b->ln2_rstd);
    if (!b->is_moe) {
      SPEC("fch", N * Hd, &b->fch);
      SPEC("fch_gelu", N * Hd, &b->fch_gelu);
    }
  }
  SPEC("lnf", N * M, &m->lnf);
  SPEC("lnf_mean", N, &m->lnf_mean);
  SPEC("lnf_rstd", N, &m->lnf_rstd);
  SPEC("logits", N * V, &m->logits);
  SPEC("lse", N, &m->lse);
  SPEC("tokens_targets", 2 * N, ints);  // int32, same size as float
  SPEC("dresid", N * M, &m->dresid);
  SPEC("dln", N * M, &m->dln);
  SPEC("backward_scratch", shared, shared_base);
#undef SPEC
  *any_dense_out = any_dense;
  return n;
}

// ---- tensor parallelism -----------------------------------------------------------------

// INVALID_ARG unless cfg's heads and dense hidden width split over mp MP ranks
// (cfg already valid).
static moe_status check_mp(moe_ctx *ctx, const moe_gpt_config *cfg, int mp) {
  moe_status st = MOE_STATUS_OK;
  int any_dense = 0;
  for (int l = 0; l < cfg->n_layer; l++) any_dense |= !moe_gpt_block_is_moe(cfg, l);
  MOE_FAIL_IF(ctx, mp < 1 || mp > cfg->n_head, MOE_STATUS_INVALID_ARG,
              "MP ranks (%d) must be in [1, %d] (n_head)", mp, cfg->n_head);
  MOE_FAIL_IF(ctx, cfg->n_head % mp != 0, MOE_STATUS_INVALID_ARG,
              "n_head (%d) must be divisible by MP ranks (%d): a multiple of %d", cfg->n_head, mp,
              mp);
  MOE_FAIL_IF(ctx, any_dense && cfg->dense_hidden % mp != 0, MOE_STATUS_INVALID_ARG,
              "dense_hidden (%d) must be divisible by MP ranks (%d): a multiple of %d",
              cfg->dense_hidden, mp, mp);
done:
  return st;
}

// The model's MP group and the local widths (before the parameter table).
static void set_mp(moe_gpt *m, const moe_gpt_tp *tp) {
  memset(&m->tp, 0, sizeof m->tp);
  m->tp.size = 1;
  if (tp && tp->size > 1) m->tp = *tp;
  const moe_gpt_config *c = &m->cfg;
  m->nh_local = c->n_head / m->tp.size;
  m->m_local = c->d_model / m->tp.size;
  m->hd_local = c->dense_hidden / m->tp.size;
}

// buf (n floats) = its sum over the MP group (Megatron's g in the forward, f in
// the backward). Nothing to do without MP.
static moe_status mp_allreduce(moe_gpt *m, float *buf, size_t n) {
  if (m->tp.size <= 1) return MOE_STATUS_OK;
  return m->tp.allreduce_sum(m->tp.user, buf, n);
}

int moe_gpt_tp_size(const moe_gpt *m) { return m ? m->tp.size : 1; }

// ---- create ---------------------------------------------------------------------------------

moe_status moe_gpt_create(moe_ctx *ctx, const moe_gpt_config *cfg, int max_batch,
                          const moe_gpt_moe_ops *ops, void *ops_user, moe_gpt **out) {
  return moe_gpt_create_tp(ctx, cfg, max_batch, ops, ops_user, NULL, out);
}

moe_status moe_gpt_create_tp(moe_ctx *ctx, const moe_gpt_config *cfg, int max_batch,
                             const moe_gpt_moe_ops *ops, void *ops_user, const moe_gpt_tp *tp,
                             moe_gpt **out) {
  moe_status st = MOE_STATUS_OK;
  moe_gpt *m = NULL;
  param_slot *slots = NULL;
  moe_tensor_spec *specs = NULL;
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "out must not be NULL");
  *out = NULL;
  MOE_TRY(moe_gpt_config_validate(ctx, cfg));
  MOE_FAIL_IF(ctx, max_batch < 1 || (int64_t)max_batch * cfg->seq_len > MOE_MAX_TOKENS,
              MOE_STATUS_INVALID_ARG,
              "max_batch (%d) must be in [1, %d] (max_batch x seq_len <= %d)", max_batch,
              MOE_MAX_TOKENS / cfg->seq_len, MOE_MAX_TOKENS);
  if (tp) {
    MOE_FAIL_IF(ctx, tp->size < 1, MOE_STATUS_INVALID_ARG, "MP ranks (%d) must be >= 1", tp->size);
    MOE_FAIL_IF(ctx, tp->rank < 0 || tp->rank >= tp->size, MOE_STATUS_INVALID_ARG,
                "MP rank (%d) must be in [0, %d]", tp->rank, tp->size - 1);
    MOE_FAIL_IF(ctx, tp->size > 1 && !tp->allreduce_sum, MOE_STATUS_INVALID_ARG,
                "MP ranks (%d) > 1 need an allreduce_sum", tp->size);
    MOE_TRY(check_mp(ctx, cfg, tp->size));
  }
  if (!ops) ops = &moe_gpt_moe_local;
  m = moe_calloc(1, sizeof *m);
  MOE_FAIL_IF(ctx, !m, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate the model");
  m->ctx = ctx;
  m->cfg = *cfg;
  set_mp(m, tp);
  m->cfg.moe.model_dim = cfg->d_model;
  m->cfg.moe.tokens = max_batch * cfg->seq_len;
  m->max_batch = max_batch;
  m->ops = ops;
  m->ops_user = ops_user;
  const moe_gpt_config *c = &m->cfg;
  const int L = c->n_layer;
  m->blocks = moe_calloc((size_t)L, sizeof *m->blocks);
  MOE_FAIL_IF(ctx, !m->blocks, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate %d blocks", L);
  for (int l = 0; l < L; l++) m->blocks[l].is_moe = moe_gpt_block_is_moe(c, l);

  // step 1: the parameter table and the dense arena (data, then gradients)
  const int max_params = 4 + 13 * L;
  m->params = moe_calloc((size_t)max_params, sizeof *m->params);
  slots = moe_calloc((size_t)max_params, sizeof *slots);
  MOE_FAIL_IF(ctx, !m->params || !slots, MOE_STATUS_OUT_OF_MEMORY,
              "cannot allocate the parameter table");
  build_param_table(m, slots);
  MOE_FAIL_IF(ctx, m->dense_floats > SIZE_MAX / 8, MOE_STATUS_INVALID_ARG,
              "model too large (%zu dense floats)", m->dense_floats);
  MOE_TRY(moe_arena_init(ctx, &m->param_arena, 2 * m->dense_floats * sizeof(float)));
  m->dense_data = moe_arena_alloc(&m->param_arena, 2 * m->dense_floats * sizeof(float));
  MOE_FAIL_IF(ctx, !m->dense_data, MOE_STATUS_OUT_OF_MEMORY, "cannot carve the parameters");
  m->dense_grad = m->dense_data + m->dense_floats;
  for (int i = 0; i < m->n_params; i++) {
    if (m->params[i].kind != MOE_GPT_PARAM_DENSE) continue;
    m->params[i].data = m->dense_data + slots[i].offset;
    m->params[i].grad = m->dense_grad + slots[i].offset;
    *slots[i].data = m->params[i].data;
    *slots[i].grad = m->params[i].grad;
  }

  // step 2: the MoE backends (collective for a distributed backend: same order everywhere)
  for (int l = 0; l < L; l++) {
    gpt_block *b = &m->blocks[l];
    if (!b->is_moe) continue;
    MOE_TRY(ops->create(ops_user, ctx, &c->moe, l, &b->moe));
    m->n_blocks_created = l + 1;
    b->mt = ops->tensors(b->moe);
    MOE_FAIL_IF(ctx,
                b->mt.home_count < 0 || b->mt.home_first < 0 ||
                    b->mt.home_first + b->mt.home_count > c->moe.num_experts,
                MOE_STATUS_INTERNAL, "backend '%s' holds experts %d..%d of %d", ops->name,
                b->mt.home_first, b->mt.home_first + b->mt.home_count - 1, c->moe.num_experts);
    m->moe_work_bytes += moe_layer_work_bytes(&c->moe);
  }
  m->n_blocks_created = L;
  bind_moe_params(m);

  // step 3: activations and backward scratch, one arena
  {
    const size_t N = (size_t)max_batch * (size_t)c->seq_len, Ma = (size_t)m->m_local,
                 Hd = (size_t)m->hd_local;
    m->resid = moe_calloc((size_t)L + 1, sizeof *m->resid);
    m->ce_seq = moe_calloc((size_t)max_batch, sizeof *m->ce_seq);
    MOE_FAIL_IF(ctx, !m->ce_seq, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate the loss table");
    specs = moe_calloc((size_t)GPT_MAX_SPECS(L), sizeof *specs);
    MOE_FAIL_IF(ctx, !m->resid || !specs, MOE_STATUS_OUT_OF_MEMORY,
                "cannot allocate the activation table");
    float *shared_base = NULL, *ints = NULL;
    int any_dense = 0;
    const int n = activation_specs(m, max_batch, m->resid, specs, &shared_base, &ints, &any_dense);
    const size_t bytes = moe_tensor_table_bytes(specs, n);
    MOE_FAIL_IF(ctx, bytes == SIZE_MAX, MOE_STATUS_INVALID_ARG,
                "activations overflow the address space (max_batch %d, seq_len %d)", max_batch,
                c->seq_len);
    MOE_TRY(moe_arena_init(ctx, &m->act_arena, bytes));
    MOE_TRY(moe_tensor_table_carve(ctx, &m->act_arena, specs, n));
    m->tokens = (int32_t *)ints;
    m->targets = (int32_t *)ints + N;
    m->dlogits = shared_base;
    float *p = shared_base;
    m->dqkv = p;
    p += pad16(3 * N * Ma);
    m->datty = p;
    p += pad16(N * Ma);
    if (any_dense) {
      m->dh = p;
      p += pad16(N * Hd);
      m->dfch = p;
      p += pad16(N * Hd);
    }
    m->att_scratch = p;
  }
  *out = m;
  m = NULL;
done:
  moe_free(slots);
  moe_free(specs);
  moe_gpt_destroy(m);
  return st;
}

moe_status moe_gpt_memory(moe_ctx *ctx, const moe_gpt_config *cfg, int max_batch, int ep_size,
                          const moe_memory_need *per_moe, int with_optim, moe_memory_need *out) {
  return moe_gpt_memory_tp(ctx, cfg, max_batch, ep_size, 1, per_moe, with_optim, out);
}

moe_status moe_gpt_memory_tp(moe_ctx *ctx, const moe_gpt_config *cfg, int max_batch, int ep_size,
                             int mp_size, const moe_memory_need *per_moe, int with_optim,
                             moe_memory_need *out) {
  moe_status st = MOE_STATUS_OK;
  moe_gpt m;  // a model with its tables only: the sizes come from create's own code
  param_slot *slots = NULL;
  moe_tensor_spec *specs = NULL;
  float **resid = NULL;
  size_t *numel = NULL;
  memset(&m, 0, sizeof m);
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "out must not be NULL");
  memset(out, 0, sizeof *out);
  MOE_TRY(moe_gpt_config_validate(ctx, cfg));
  MOE_FAIL_IF(ctx, max_batch < 1 || (int64_t)max_batch * cfg->seq_len > MOE_MAX_TOKENS,
              MOE_STATUS_INVALID_ARG,
              "max_batch (%d) must be in [1, %d] (max_batch x seq_len <= %d)", max_batch,
              MOE_MAX_TOKENS / cfg->seq_len, MOE_MAX_TOKENS);
  MOE_FAIL_IF(ctx, ep_size < 1 || cfg->moe.num_experts % ep_size != 0, MOE_STATUS_INVALID_ARG,
              "experts (%d) must be divisible by EP ranks (%d)", cfg->moe.num_experts, ep_size);
  MOE_TRY(check_mp(ctx, cfg, mp_size));
  m.cfg = *cfg;
  // the table of MP rank 0 (every rank's slices have the same sizes)
  const moe_gpt_tp tp = {mp_size, 0, NULL, NULL, NULL};
  set_mp(&m, &tp);
  m.cfg.moe.model_dim = cfg->d_model;
  m.cfg.moe.tokens = max_batch * cfg->seq_len;
  const int L = cfg->n_layer, max_params = 4 + 13 * L;
  m.blocks = moe_calloc((size_t)L, sizeof *m.blocks);
  m.params = moe_calloc((size_t)max_params, sizeof *m.params);
  slots = moe_calloc((size_t)max_params, sizeof *slots);
  specs = moe_calloc((size_t)GPT_MAX_SPECS(L), sizeof *specs);
  resid = moe_calloc((size_t)L + 1, sizeof *resid);
  numel = moe_calloc((size_t)max_params, sizeof *numel);
  MOE_FAIL_IF(ctx, !m.blocks || !m.params || !slots || !specs || !resid || !numel,
              MOE_STATUS_OUT_OF_MEMORY, "memory estimate: out of memory");
  int n_moe = 0;
  for (int l = 0; l < L; l++) n_moe += m.blocks[l].is_moe = moe_gpt_block_is_moe(&m.cfg, l);
  build_param_table(&m, slots);
  // step 1 of create: the dense arena, data then gradients
  const double dense = (double)m.dense_floats * sizeof(float);
  out->bytes[MOE_MEM_PARAMS] = dense;
  out->bytes[MOE_MEM_GRADS] = (double)moe_align64(2 * m.dense_floats * sizeof(float)) - dense;
  out->bytes[MOE_MEM_WORKSPACE] =
      (double)(moe_align64(sizeof(moe_gpt)) + moe_align64((size_t)L * sizeof(gpt_block)) +
               moe_align64((size_t)max_params * sizeof(moe_gpt_param)) +
               moe_align64((size_t)max_params * sizeof(param_slot)) +
               moe_align64(((size_t)L + 1) * sizeof(float *)) +
               moe_align64((size_t)GPT_MAX_SPECS(L) * sizeof(moe_tensor_spec)) +
               moe_align64((size_t)max_batch * sizeof(double)));  // ce_seq
  // step 2: the MoE blocks' FFNs
  if (n_moe > 0) {
    moe_memory_need block;
    if (per_moe) {
      block = *per_moe;
    } else {
      MOE_TRY(moe_layer_memory(ctx, &m.cfg.moe, &block));
    }
    moe_memory_need_add_scaled(out, &block, n_moe);
  }
  // step 3: the activation arena
  {
    float *shared_base = NULL, *ints = NULL;
    int any_dense = 0;
    const int n = activation_specs(&m, max_batch, resid, specs, &shared_base, &ints, &any_dense);
    for (int i = 0; i < n; i++)
      out->bytes[MOE_MEM_ACTIVATIONS] += (double)moe_align64(specs[i].count * sizeof(float));
  }
  // AdamW over the tensors this rank holds (bind_moe_params: home experts only)
  if (with_optim) {
    for (int i = 0; i < m.n_params; i++) {
      const moe_gpt_param *p = &m.params[i];
      numel[i] = p->kind == MOE_GPT_PARAM_EXPERT ? p->numel / (size_t)ep_size : p->numel;
    }
    out->bytes[MOE_MEM_OPTIM] = moe_optim_memory_bytes(m.n_params, numel);
  }
done:
  moe_free(m.blocks);
  moe_free(m.params);
  moe_free(slots);
  moe_free(specs);
  moe_free(resid);
  moe_free(numel);
  return st;
}

void moe_gpt_destroy(moe_gpt *m) {
  if (!m) return;
  if (m->blocks) {
    for (int l = 0; l < m->n_blocks_created; l++) {
      if (m->blocks[l].moe) m->ops->destroy(m->blocks[l].moe);
    }
  }
  moe_arena_free(&m->param_arena);
  moe_arena_free(&m->act_arena);
  moe_pairwise_free(&m->pw);
  moe_free(m->dlogits_own);
  moe_free(m->ce_seq);
  moe_free(m->resid);
  moe_free(m->params);
  moe_free(m->blocks);
  moe_free(m);
}

// ---- accessors ------------------------------------------------------------------------------

const moe_gpt_config *moe_gpt_get_config(const moe_gpt *m) { return &m->cfg; }
int moe_gpt_num_params(const moe_gpt *m) { return m->n_params; }

float *moe_gpt_router_bias(moe_gpt *m, int block) {
  if (!m || block < 0 || block >= m->cfg.n_layer || !m->blocks[block].is_moe) return NULL;
  return m->blocks[block].mt.router_bias;
}

moe_gpt_param moe_gpt_get_param(moe_gpt *m, int i) {
  moe_gpt_param none;
  memset(&none, 0, sizeof none);
  if (!m || i < 0 || i >= m->n_params) return none;
  return m->params[i];
}

static size_t whole_numel(const moe_gpt_param *p) {
  size_t n = 1;
  for (int d = 0; d < p->ndim; d++) n *= (size_t)p->dims[d];
  return n;
}

size_t moe_gpt_total_elements(const moe_gpt *m) {
  size_t n = 0;
  for (int i = 0; i < m->n_params; i++) n += whole_numel(&m->params[i]);
  return n;
}

size_t moe_gpt_active_elements(const moe_gpt *m) {
  size_t n = 0;
  for (int i = 0; i < m->n_params; i++) {
    const moe_gpt_param *p = &m->params[i];
    const size_t w = whole_numel(p);
    n += p->kind == MOE_GPT_PARAM_EXPERT ? w / (size_t)p->dims[0] * (size_t)m->cfg.moe.top_k : w;
  }
  return n;
}

size_t moe_gpt_activation_bytes(const moe_gpt *m) {
  return m->act_arena.capacity + m->moe_work_bytes;
}

const float *moe_gpt_logits(const moe_gpt *m) { return m->logits; }

// ---- init -----------------------------------------------------------------------------------

// Index in the whole tensor of element j of this rank's slice (moe_gpt_param.tp_*).
static size_t whole_index(const moe_gpt_param *p, size_t j) {
  if (p->tp_dim < 0) return j;
  size_t inner = 1;
  for (int d = p->tp_dim + 1; d < p->ndim; d++) inner *= (size_t)p->dims[d];
  const size_t whole = (size_t)p->dims[p->tp_dim], part = whole / (size_t)p->tp_parts;
  const size_t count = (size_t)p->tp_count, held = count * (size_t)p->tp_parts;
  const size_t in = j % inner, dl = (j / inner) % held, outer = j / inner / held;
  const size_t d = dl / count * part + (size_t)p->tp_first + dl % count;
  return (outer * whole + d) * inner + in;
}

void moe_gpt_init_params(moe_gpt *m, uint64_t seed) {
  const moe_gpt_config *c = &m->cfg;
  const float std = c->init_std, std_resid = c->init_std / sqrtf(2.0f * (float)c->n_layer);
  for (int i = 0; i < m->n_params; i++) {
    const moe_gpt_param *p = &m->params[i];
    if (p->kind != MOE_GPT_PARAM_DENSE) continue;
    const char *leaf = strrchr(p->name, '.');
    leaf = leaf ? leaf + 1 : p->name;
    if (p->ndim >= 2) {
      const int resid = strcmp(leaf, "w_proj") == 0 || strcmp(leaf, "w_fc2") == 0;
      const float sd = resid ? std_resid : std;
      moe_rng rng;
      moe_rng_init(&rng, seed, name_stream(p->name));
      if (p->tp_dim < 0) {
        moe_rng_fill_normal(&rng, p->data, p->numel, 0.0f, sd);
      } else {
        // a slice: element w of the whole tensor is the normal drawn from the
        // stream's 32-bit outputs 2w and 2w + 1 (moe_rng_normal takes exactly
        // two; the stream is counter-based), so jump there: the slice gets the
        // whole tensor's values without drawing the rest
        for (size_t j = 0; j < p->numel; j++) {
          rng.index = 2 * (uint64_t)whole_index(p, j);
          p->data[j] = 0.0f + sd * moe_rng_normal(&rng);  // moe_rng_fill_normal's expression
        }
      }
    } else if (strcmp(leaf, "g") == 0) {
      for (size_t j = 0; j < p->numel; j++) p->data[j] = 1.0f;
    } else {
      memset(p->data, 0, p->numel * sizeof(float));
    }
  }
  for (int l = 0; l < c->n_layer; l++) {
    if (m->blocks[l].is_moe) m->ops->init_params(m->blocks[l].moe, seed + 1000 + (uint64_t)l);
  }
}

void moe_gpt_zero_grad(moe_gpt *m) {
  memset(m->dense_grad, 0, m->dense_floats * sizeof(float));
  for (int l = 0; l < m->cfg.n_layer; l++) {
    if (m->blocks[l].is_moe) m->ops->zero_grad(m->blocks[l].moe);
  }
}

// ---- forward --------------------------------------------------------------------------------

// y (N, Dout) = x (N, Din) w (Din, Dout) + b, added onto y's current values (the residual).
static void linear_residual(float *y, const float *x, const float *w, const float *b, int n,
                            int din, int dout) {
  moe_gemm(0, 0, n, dout, din, 1.0f, x, din, w, dout, 1.0f, y, dout);
  moe_bias_add_forward(y, b, n, dout);
}

// ---- deterministic mode under MP: the partial products as one chain ---------------------

// C (n, cols) = init + A B^(T) over k, where k is cut into `parts` parts of
// kp columns on every MP rank (attention: q, k, v; else one part), and the
// whole k of the single-process model is part 0 of rank 0, part 0 of rank 1,
// ..., part 1 of rank 0, ...: segment part x MP + rank. Row blocks go through
// the MP ranks as a wavefront (moe_chain_run).
typedef struct {
  float *c;
  const float *init;  // segment 0's start (the residual), NULL: 0
  const float *a;     // (n, parts kp) this rank's
  const float *b;     // trans_b 0: (parts kp, cols); 1: (cols, parts kp)
  int trans_b, parts, kp, cols, n, blocks, mp;
} tp_chain_arg;

static void tp_rows(const tp_chain_arg *t, int block, int *r0, int *rn) {
  *r0 = (int)((long long)t->n * block / t->blocks);
  *rn = (int)((long long)t->n * (block + 1) / t->blocks) - *r0;
}

static void tp_chain_compute(void *user, int block, int seg) {
  const tp_chain_arg *t = user;
  int r0, rn;
  tp_rows(t, block, &r0, &rn);
  const int part = seg / t->mp, K = t->parts * t->kp;
  float *c = t->c + (size_t)r0 * t->cols;
  if (seg == 0 && t->init) memcpy(c, t->init + (size_t)r0 * t->cols, (size_t)rn * t->cols * 4);
  const float beta = seg == 0 && !t->init ? 0.0f : 1.0f;
  const float *a = t->a + (size_t)r0 * K + (size_t)part * t->kp;
  if (t->trans_b) {
    moe_gemm(0, 1, rn, t->cols, t->kp, 1.0f, a, K, t->b + (size_t)part * t->kp, K, beta, c,
             t->cols);
  } else {
    moe_gemm(0, 0, rn, t->cols, t->kp, 1.0f, a, K, t->b + (size_t)part * t->kp * t->cols, t->cols,
             beta, c, t->cols);
  }
}

static int tp_chain_owner(void *user, int seg) { return seg % ((const tp_chain_arg *)user)->mp; }

static int tp_chain_spans(void *user, int block, float **p, size_t *n) {
  const tp_chain_arg *t = user;
  int r0, rn;
  tp_rows(t, block, &r0, &rn);
  p[0] = t->c + (size_t)r0 * t->cols;
  n[0] = (size_t)rn * t->cols;
  return 1;
}

// Runs the chain over the MP group: c (n, cols) = init (or 0) + the product,
// with the single-process model's bits on every MP rank.
static moe_status tp_chain(moe_gpt *m, float *c, const float *init, const float *a, const float *b,
                           int trans_b, int parts, int kp, int cols, int n) {
  const int P = m->tp.size;
  const int blocks = n >= 4 * 16 ? 4 : 1;  // a wavefront of row blocks when there are rows
  tp_chain_arg t = {c, init, a, b, trans_b, parts, kp, cols, n, blocks, P};
  const moe_chain ch = {blocks, parts * P, tp_chain_owner, tp_chain_compute, tp_chain_spans, &t};
  return m->tp.chain(m->tp.user, &ch);
}

moe_status moe_gpt_forward(moe_gpt *m, const int32_t *tokens, const int32_t *targets, int b, int s,
                           double loss_denominator, moe_gpt_loss *out) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = m ? m->ctx : NULL;
  MOE_FAIL_IF(ctx, !m, MOE_STATUS_INVALID_ARG, "model must not be NULL");
  const moe_gpt_config *c = &m->cfg;
  m->have_forward = 0;
  MOE_FAIL_IF(ctx, b < 1 || b > m->max_batch, MOE_STATUS_INVALID_ARG,
              "batch size B (%d) must be in [1, %d] (max_batch)", b, m->max_batch);
  MOE_FAIL_IF(ctx, s < 1 || s > c->seq_len, MOE_STATUS_INVALID_ARG,
              "sequence length S (%d) must be in [1, %d] (seq_len)", s, c->seq_len);
  MOE_FAIL_IF(ctx, !tokens, MOE_STATUS_INVALID_ARG, "tokens must not be NULL");
  MOE_FAIL_IF(ctx, !isfinite(loss_denominator), MOE_STATUS_INVALID_ARG,
              "loss_denominator (%g) must be finite", loss_denominator);
  const int N = b * s, M = c->d_model, V = c->vocab_size, NH = c->n_head, hd = M / NH;
  const int Hd = c->dense_hidden;
  // under MP: this rank's heads, attention columns and dense hidden columns
  const int mp = m->tp.size > 1, NHl = m->nh_local, Ma = m->m_local, Hl = m->hd_local;
  const size_t NM = (size_t)N * M;
  for (int i = 0; i < N; i++) {
    MOE_FAIL_IF(ctx, tokens[i] < 0 || tokens[i] >= V, MOE_STATUS_INVALID_ARG,
                "tokens[%d][%d] (%d) must be in [0, %d)", i / s, i % s, (int)tokens[i], V);
    MOE_FAIL_IF(ctx, targets && (targets[i] < -1 || targets[i] >= V), MOE_STATUS_INVALID_ARG,
                "targets[%d][%d] (%d) must be in [0, %d) or -1 (ignored)", i / s, i % s,
                (int)targets[i], V);
  }
  memcpy(m->tokens, tokens, (size_t)N * sizeof(int32_t));

  // step 1: embeddings x_0 = wte[token] + wpe[t]
  float *x = m->resid[0];
  for (int i = 0; i < N; i++) {
    const float *te = m->wte + (size_t)tokens[i] * M, *pe = m->wpe + (size_t)(i % s) * M;
    float *xi = x + (size_t)i * M;
    for (int j = 0; j < M; j++) xi[j] = te[j] + pe[j];
  }

  // step 2: blocks
  moe_gpt_loss res;
  memset(&res, 0, sizeof res);
  for (int l = 0; l < c->n_layer; l++) {
    gpt_block *blk = &m->blocks[l];
    const gpt_block_params *p = &blk->p;
    const float *xl = m->resid[l];
    float *xn = m->resid[l + 1];
    // attention branch
    moe_layernorm_forward(blk->ln1, blk->ln1_mean, blk->ln1_rstd, xl, p->ln1_g, p->ln1_b, N, M,
                          c->ln_eps);
    if (mp) {
      // column-parallel qkv of this rank's heads, row-parallel projection: the
      // partial products summed over MP (g), then the residual and b_proj once
      moe_linear_forward(blk->qkv, blk->ln1, p->w_qkv, p->b_qkv, N, M, 3 * Ma);
      moe_attention_forward(blk->atty, blk->att, blk->qkv, b, s, NHl, hd);
      if (m->deterministic) {  // the single-process chain: x, then each rank's heads
        MOE_TRY(tp_chain(m, blk->resid2, xl, blk->atty, p->w_proj, 0, 1, Ma, M, N));
      } else {
        moe_gemm(0, 0, N, M, Ma, 1.0f, blk->atty, Ma, p->w_proj, M, 0.0f, blk->resid2, M);
        MOE_TRY(mp_allreduce(m, blk->resid2, NM));
        moe_add_inplace(blk->resid2, xl, NM);
      }
      moe_bias_add_forward(blk->resid2, p->b_proj, N, M);
    } else {
      moe_linear_forward(blk->qkv, blk->ln1, p->w_qkv, p->b_qkv, N, M, 3 * M);
      moe_attention_forward(blk->atty, blk->att, blk->qkv, b, s, NH, hd);
      memcpy(blk->resid2, xl, (size_t)N * M * sizeof(float));
      linear_residual(blk->resid2, blk->atty, p->w_proj, p->b_proj, N, M, M);
    }
    // feed-forward branch
    moe_layernorm_forward(blk->ln2, blk->ln2_mean, blk->ln2_rstd, blk->resid2, p->ln2_g, p->ln2_b,
                          N, M, c->ln_eps);
    if (blk->is_moe) {
      moe_layer_stats ls;
      memset(&ls, 0, sizeof ls);
      MOE_TRY(m->ops->forward(blk->moe, blk->ln2, N, xn, &ls));
      moe_add_inplace(xn, blk->resid2, NM);
      res.aux += ls.aux_loss;
      res.z += ls.z_loss;
      res.dropped += ls.dropped;
      res.rerouted += ls.rerouted;
    } else if (mp) {
      // column-parallel w_fc, row-parallel w_fc2, partial outputs summed (g)
      moe_linear_forward(blk->fch, blk->ln2, p->w_fc, p->b_fc, N, M, Hl);
      moe_gelu_forward(blk->fch_gelu, blk->fch, (size_t)N * Hl);
      if (m->deterministic) {
        MOE_TRY(tp_chain(m, xn, blk->resid2, blk->fch_gelu, p->w_fc2, 0, 1, Hl, M, N));
      } else {
        moe_gemm(0, 0, N, M, Hl, 1.0f, blk->fch_gelu, Hl, p->w_fc2, M, 0.0f, xn, M);
        MOE_TRY(mp_allreduce(m, xn, NM));
        moe_add_inplace(xn, blk->resid2, NM);
      }
      moe_bias_add_forward(xn, p->b_fc2, N, M);
    } else {
      moe_linear_forward(blk->fch, blk->ln2, p->w_fc, p->b_fc, N, M, Hd);
      moe_gelu_forward(blk->fch_gelu, blk->fch, (size_t)N * Hd);
      memcpy(xn, blk->resid2, (size_t)N * M * sizeof(float));
      linear_residual(xn, blk->fch_gelu, p->w_fc2, p->b_fc2, N, Hd, M);
    }
  }

  // step 3: final layernorm and the tied head: logits = lnf(x_L) wte^T
  moe_layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, m->resid[c->n_layer], m->lnf_g, m->lnf_b,
                        N, M, c->ln_eps);
  moe_gemm(0, 1, N, V, M, 1.0f, m->lnf, M, m->wte, M, 0.0f, m->logits, V);

  // step 4: cross-entropy, summed over the rows with a target
  if (targets) {
    memcpy(m->targets, targets, (size_t)N * sizeof(int32_t));
    moe_logsumexp_forward(m->lse, m->logits, N, V);
    // per sequence, then over the sequences in order: a sequence's sum does not
    // depend on the batch it is in, so ranks can add the global batch's
    // sequences in one order (moe_sum_slices_ordered)
    double sum = 0.0;
    int count = 0;
    for (int q = 0; q < b; q++) {
      double sq = 0.0;
      for (int i = q * s; i < (q + 1) * s; i++) {
        if (targets[i] < 0) continue;
        sq += (double)m->lse[i] - (double)m->logits[(size_t)i * V + targets[i]];
        count++;
      }
      m->ce_seq[q] = sq;
      sum += sq;
    }
    const double denom = loss_denominator > 0.0 ? loss_denominator : (count > 0 ? count : 1);
    res.ce_sum = sum;
    res.ce_seq = m->ce_seq;
    res.tokens = count;
    res.loss = sum / denom;
    m->denom_last = denom;
    m->b_last = b;
    m->s_last = s;
    m->have_forward = 1;
  }
  if (out) *out = res;
done:
  return st;
}

// ---- fixed-order weight gradients --------------------------------------------------------

// The largest leaf of the fixed-order sums: a weight and its bias, a
// layernorm's two vectors, or the tied embedding (V, M) with the positions (S, M).
static size_t largest_leaf(const moe_gpt_config *c) {
  const size_t M = (size_t)c->d_model, V = (size_t)c->vocab_size, S = (size_t)c->seq_len;
  const size_t Hd = (size_t)c->dense_hidden;
  size_t leaf = V * M + S * M;
  const size_t cand[] = {M * 3 * M + 3 * M, M * M + M, M * Hd + Hd, Hd * M + M, 2 * M};
  for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) leaf = cand[i] > leaf ? cand[i] : leaf;
  return leaf;
}

size_t moe_gpt_deterministic_bytes(const moe_gpt_config *cfg, int max_batch) {
  const size_t V = (size_t)cfg->vocab_size, S = (size_t)cfg->seq_len;
  return moe_pairwise_bytes(largest_leaf(cfg), max_batch) +
         moe_align64((size_t)max_batch * S * V * sizeof(float));  // dlogits_own
}

moe_status moe_gpt_set_deterministic(moe_gpt *m, int on) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = m ? m->ctx : NULL;
  MOE_FAIL_IF(ctx, !m, MOE_STATUS_INVALID_ARG, "model must not be NULL");
  m->have_forward = 0;
  MOE_FAIL_IF(ctx, on && m->tp.size > 1 && !m->tp.chain, MOE_STATUS_INVALID_ARG,
              "deterministic mode with tensor parallelism (MP ranks %d) needs the MP group's "
              "chain (moe_gpt_tp.chain)",
              m->tp.size);
  if (!on) {
    moe_pairwise_free(&m->pw);
    moe_free(m->dlogits_own);
    m->dlogits_own = NULL;
    m->deterministic = 0;
    return st;
  }
  if (m->deterministic) return st;
  const moe_gpt_config *c = &m->cfg;
  const size_t V = (size_t)c->vocab_size, S = (size_t)c->seq_len;
  MOE_TRY(moe_pairwise_init(ctx, &m->pw, largest_leaf(c), m->max_batch));
  m->dlogits_own = moe_malloc((size_t)m->max_batch * S * V * sizeof(float));
  MOE_FAIL_IF(ctx, !m->dlogits_own, MOE_STATUS_OUT_OF_MEMORY,
              "deterministic mode: cannot allocate dlogits (%zu floats)",
              (size_t)m->max_batch * S * V);
  m->deterministic = 1;
done:
  if (st != MOE_STATUS_OK) {
    moe_pairwise_free(&m->pw);
    moe_free(m->dlogits_own);
    m->dlogits_own = NULL;
  }
  return st;
}

// moe_layernorm_backward sequence by sequence: dx per row as before; dgamma
// and dbeta as the pairwise sum over sequences.
static void slice_layernorm_backward(moe_gpt *m, float *dx, float *dgamma, float *dbeta,
                                     const float *dy, const float *x, const float *mean,
                                     const float *rstd, const float *gamma, int M) {
  const int b = m->b_last, s = m->s_last;
  moe_pairwise_reset(&m->pw, 2 * (size_t)M);
  for (int q = 0; q < b; q++) {
    float *leaf = moe_pairwise_leaf(&m->pw);
    memset(leaf, 0, 2 * (size_t)M * sizeof(float));
    const size_t o = (size_t)q * s * M;
    moe_layernorm_backward(dx + o, leaf, leaf + M, dy + o, x + o, mean + (size_t)q * s,
                           rstd + (size_t)q * s, gamma, s, M);
    moe_pairwise_push(&m->pw);
  }
  const float *root = moe_pairwise_result(&m->pw);
  moe_add_inplace(dgamma, root, (size_t)M);
  moe_add_inplace(dbeta, root + M, (size_t)M);
}

// ---- backward -------------------------------------------------------------------------------

// dx (N, Din) = dy (N, Dout) w^T (overwritten); dw (Din, Dout) += x^T dy; db (Dout) += sums.
// dx NULL: only the weight gradients (the caller computes dx).
static void linear_backward_set(moe_gpt *m, float *dx, float *dw, float *db, const float *dy,
                                const float *x, const float *w, int n, int din, int dout) {
  if (dx) moe_gemm(0, 1, n, din, dout, 1.0f, dy, dout, w, dout, 0.0f, dx, din);
  if (m->deterministic) {
    // one leaf per sequence (s rows)
    moe_pairwise_wgrad(&m->pw, NULL, dw, db, x, dy, m->b_last, m->s_last, din, dout);
    return;
  }
  moe_gemm(1, 0, din, dout, n, 1.0f, x, din, dy, dout, 1.0f, dw, dout);
  moe_bias_add_backward(db, dy, n, dout);
}

static void layernorm_backward(moe_gpt *m, float *dx, float *dgamma, float *dbeta, const float *dy,
                               const float *x, const float *mean, const float *rstd,
                               const float *gamma, int n, int M) {
  if (m->deterministic) {
    slice_layernorm_backward(m, dx, dgamma, dbeta, dy, x, mean, rstd, gamma, M);
  } else {
    moe_layernorm_backward(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, n, M);
  }
}

// The grad hook (moe_gpt_set_grad_hook): `ready` tensors of `block` are
// final, or (ready 0, between the kernels) a chance to progress their sums.
#define GRAD_HOOK(block, ready)                                                   \
  do {                                                                            \
    if (m->grad_hook) MOE_TRY(m->grad_hook(m->grad_hook_user, (block), (ready))); \
  } while (0)

moe_status moe_gpt_backward(moe_gpt *m) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = m ? m->ctx : NULL;
  MOE_FAIL_IF(ctx, !m, MOE_STATUS_INVALID_ARG, "model must not be NULL");
  MOE_FAIL_IF(ctx, !m->have_forward, MOE_STATUS_INVALID_ARG,
              "backward needs a successful forward with targets first");
  const moe_gpt_config *c = &m->cfg;
  const int b = m->b_last, s = m->s_last, N = b * s, M = c->d_model, V = c->vocab_size;
  const int hd = M / c->n_head;
  // this rank's heads, attention columns and dense hidden columns (all of them without MP)
  const int NHl = m->nh_local, Ma = m->m_local, Hd = m->hd_local;
  const int det_mp = m->deterministic && m->tp.size > 1;
  const size_t NM = (size_t)N * M;

  // step 1: dlogits = (softmax - onehot) / denominator on rows with a target
  // (deterministic: in a buffer of its own, kept for step 4)
  float *dlogits = m->deterministic ? m->dlogits_own : m->dlogits;
  const float inv = (float)(1.0 / m->denom_last);
  for (int i = 0; i < N; i++) {
    float *dl = dlogits + (size_t)i * V;
    const int tgt = m->targets[i];
    if (tgt < 0) {
      memset(dl, 0, (size_t)V * sizeof(float));
      continue;
    }
    const float *lg = m->logits + (size_t)i * V;
    const float lse = m->lse[i];
    for (int v = 0; v < V; v++) dl[v] = expf(lg[v] - lse) * inv;
    dl[tgt] -= inv;
  }

  // step 2: tied head: dlnf = dlogits wte, dwte += dlogits^T lnf; final layernorm
  moe_gemm(0, 0, N, M, V, 1.0f, dlogits, V, m->wte, M, 0.0f, m->dln, M);
  if (!m->deterministic) moe_gemm(1, 0, V, M, N, 1.0f, dlogits, V, m->lnf, M, 1.0f, m->dwte, M);
  memset(m->dresid, 0, NM * sizeof(float));
  layernorm_backward(m, m->dresid, m->dlnf_g, m->dlnf_b, m->dln, m->resid[c->n_layer], m->lnf_mean,
                     m->lnf_rstd, m->lnf_g, N, M);
  GRAD_HOOK(c->n_layer, 1);

  // step 3: blocks in reverse; dresid holds dL/dx_{l+1}, then dL/dresid2, then dL/dx_l
  for (int l = c->n_layer - 1; l >= 0; l--) {
    gpt_block *blk = &m->blocks[l];
    const gpt_block_params *p = &blk->p;
    gpt_block_params *g = &blk->g;
    // feed-forward branch
    if (blk->is_moe) {
      memset(m->dln, 0, NM * sizeof(float));
      GRAD_HOOK(l, 3);  // the MoE layer's backward: its all-to-alls come
      MOE_TRY(m->ops->backward(blk->moe, m->dresid, m->dln));
      GRAD_HOOK(l, 4);
    } else {
      linear_backward_set(m, m->dh, g->w_fc2, g->b_fc2, m->dresid, blk->fch_gelu, p->w_fc2, N, Hd,
                          M);
      memset(m->dfch, 0, (size_t)N * Hd * sizeof(float));
      GRAD_HOOK(l, 0);
      moe_gelu_backward(m->dfch, m->dh, blk->fch, (size_t)N * Hd);
      linear_backward_set(m, det_mp ? NULL : m->dln, g->w_fc, g->b_fc, m->dfch, blk->ln2, p->w_fc,
                          N, M, Hd);
      GRAD_HOOK(l, 2);  // ffn.* final
      if (det_mp) {     // f: dln2 = dfch w_fc^T as one chain over the MP ranks' columns
        MOE_TRY(tp_chain(m, m->dln, NULL, m->dfch, p->w_fc, 1, 1, Hd, M, N));
      } else {
        MOE_TRY(mp_allreduce(m, m->dln, NM));  // f: the MP ranks' parts of dln2
      }
    }
    layernorm_backward(m, m->dresid, g->ln2_g, g->ln2_b, m->dln, blk->resid2, blk->ln2_mean,
                       blk->ln2_rstd, p->ln2_g, N, M);
    // attention branch
    linear_backward_set(m, m->datty, g->w_proj, g->b_proj, m->dresid, blk->atty, p->w_proj, N, Ma,
                        M);
    GRAD_HOOK(l, 0);
    memset(m->dqkv, 0, 3 * (size_t)N * Ma * sizeof(float));
    moe_attention_backward(m->dqkv, m->att_scratch, m->datty, blk->att, blk->qkv, b, s, NHl, hd);
    GRAD_HOOK(l, 0);
    linear_backward_set(m, det_mp ? NULL : m->dln, g->w_qkv, g->b_qkv, m->dqkv, blk->ln1, p->w_qkv,
                        N, M, 3 * Ma);
    if (det_mp) {  // f: dln1 = dqkv w_qkv^T, k in the single-process order (q, k, v; heads)
      MOE_TRY(tp_chain(m, m->dln, NULL, m->dqkv, p->w_qkv, 1, 3, Ma, M, N));
    } else {
      MOE_TRY(mp_allreduce(m, m->dln, NM));  // f: the MP ranks' parts of dln1
    }
    layernorm_backward(m, m->dresid, g->ln1_g, g->ln1_b, m->dln, m->resid[l], blk->ln1_mean,
                       blk->ln1_rstd, p->ln1_g, N, M);
    GRAD_HOOK(l, 1);
  }

  // step 4: embeddings (deterministic: per sequence, with the head's dwte, as
  // one pairwise sum over sequences)
  if (m->deterministic) {
    const size_t VM = (size_t)V * M;
    moe_pairwise_reset(&m->pw, VM + (size_t)s * M);
    for (int q = 0; q < b; q++) {
      float *leaf = moe_pairwise_leaf(&m->pw);
      moe_gemm(1, 0, V, M, s, 1.0f, dlogits + (size_t)q * s * V, V, m->lnf + (size_t)q * s * M, M,
               0.0f, leaf, M);
      memset(leaf + VM, 0, (size_t)s * M * sizeof(float));
      for (int i = q * s; i < (q + 1) * s; i++) {
        const float *d = m->dresid + (size_t)i * M;
        float *te = leaf + (size_t)m->tokens[i] * M, *pe = leaf + VM + (size_t)(i % s) * M;
        for (int j = 0; j < M; j++) {
          te[j] += d[j];
          pe[j] += d[j];
        }
      }
      moe_pairwise_push(&m->pw);
    }
    const float *root = moe_pairwise_result(&m->pw);
    moe_add_inplace(m->dwte, root, VM);
    moe_add_inplace(m->dwpe, root + VM, (size_t)s * M);
    GRAD_HOOK(-1, 1);
    goto done;
  }
  for (int i = 0; i < N; i++) {
    const float *d = m->dresid + (size_t)i * M;
    float *te = m->dwte + (size_t)m->tokens[i] * M, *pe = m->dwpe + (size_t)(i % s) * M;
    for (int j = 0; j < M; j++) {
      te[j] += d[j];
      pe[j] += d[j];
    }
  }
  GRAD_HOOK(-1, 1);
done:
  return st;
}

void moe_gpt_set_grad_hook(moe_gpt *m, moe_gpt_grad_hook fn, void *user) {
  if (!m) return;
  m->grad_hook = fn;
  m->grad_hook_user = user;
}
