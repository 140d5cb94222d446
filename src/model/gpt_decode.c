// Incremental decoding of MoE-GPT with a KV cache (moe_gpt_decode): the
// inference engine's numerical core.
//
// A step takes n rows (slot, pos, token): prefill chunks of new prompts and
// single tokens of running sequences, mixed. Per block, for all n rows at once:
//   a = ln1(x); qkv = a w_qkv + b_qkv          one GEMM over the n rows
//   K[slot][pos], V[slot][pos] = qkv's k, v    every row's before any attention
//   y_r = attention(q_r, K[slot][0..pos], V[slot][0..pos])   one row each
//   r = x + y w_proj + b_proj; x' = r + ffn(ln2(r))  (the MoE layer over the n rows)
// then lnf and the tied head for the rows that want logits. This is
// moe_gpt_forward's arithmetic restricted to the new positions, so a row's
// logits equal the full forward's at that position; on the batch-invariant
// backend a row's bits depend only on its own sequence.
//
// Memory: the cache is 2 L slots S M floats (K and V of every block), the
// step's buffers max_rows x (6 M + 3 M + Hd (dense blocks) + V) floats plus
// 2 S of attention scratch; all from one arena made at create.
//
// Not here: what to decode (the engine's scheduler, src/infer/), sampling
// (sample.c), a sliding window past seq_len (the caller re-prefills).
#include <stdio.h>
#include <string.h>

#include "model/gpt_internal.h"
#include "moe/kernels.h"
#include "moe/model.h"

struct moe_gpt_kv {
  const moe_gpt *model;
  int slots, max_rows, seq_len;
  moe_arena arena;
  float *k, *v;        // (L, slots, S, M) each
  int32_t *len;        // (slots): positions held
  int32_t *seen;       // (slots): running length of the call being validated
  uint32_t *stamp;     // (slots): call that set seen
  uint32_t call;       // calls so far
  float *x, *xn;       // (R, M): residual stream in and out of a block
  float *ln;           // (R, M): a layernorm's output
  float *mean, *rstd;  // (R)
  float *qkv;          // (R, 3M)
  float *atty;         // (R, M)
  float *resid2;       // (R, M)
  float *fch, *fchg;   // (R, Hd): dense blocks only
  float *att_scr;      // (2 S)
  float *head;         // (R, M): the rows that want logits, gathered
};

// Float counts of the step's buffers, in create's carving order.
typedef struct {
  size_t cache, rows_m, qkv, hd, att, ints;
} kv_sizes;

static size_t pad16(size_t n) { return (n + 15) & ~(size_t)15; }

static int any_dense(const moe_gpt_config *c) {
  for (int l = 0; l < c->n_layer; l++)
    if (!moe_gpt_block_is_moe(c, l)) return 1;
  return 0;
}

static kv_sizes sizes_for(const moe_gpt_config *c, int slots, int max_rows) {
  const size_t R = (size_t)max_rows, M = (size_t)c->d_model, S = (size_t)c->seq_len;
  kv_sizes z;
  z.cache = (size_t)c->n_layer * (size_t)slots * S * M;
  z.rows_m = pad16(R * M);
  z.qkv = pad16(R * 3 * M);
  z.hd = any_dense(c) ? pad16(R * (size_t)c->dense_hidden) : 0;
  z.att = pad16(2 * S);
  z.ints = pad16(3 * (size_t)slots);
  return z;
}

static size_t total_floats(const kv_sizes *z, size_t r) {
  // k, v; x, xn, ln, atty, resid2, head; mean, rstd; qkv; fch, fchg; att; ints
  return 2 * pad16(z->cache) + 6 * z->rows_m + 2 * pad16(r) + z->qkv + 2 * z->hd + z->att + z->ints;
}

size_t moe_gpt_kv_bytes(const moe_gpt_config *cfg, int slots, int max_rows) {
  if (!cfg || slots < 1 || slots > 65536 || max_rows < 1 || max_rows > MOE_MAX_TOKENS) return 0;
  const kv_sizes z = sizes_for(cfg, slots, max_rows);
  return moe_align64(sizeof(moe_gpt_kv)) + 64 + total_floats(&z, (size_t)max_rows) * sizeof(float);
}

moe_status moe_gpt_kv_create(moe_ctx *ctx, const moe_gpt *model, int slots, int max_rows,
                             moe_gpt_kv **out) {
  moe_status st = MOE_STATUS_OK;
  moe_gpt_kv *kv = NULL;
  MOE_FAIL_IF(ctx, !model || !out, MOE_STATUS_INVALID_ARG, "model and out must not be NULL");
  *out = NULL;
  MOE_FAIL_IF(ctx, model->tp.size > 1, MOE_STATUS_INVALID_ARG,
              "KV-cache decoding is not supported with tensor parallelism (MP ranks %d; needs 1)",
              model->tp.size);
  const moe_gpt_config *c = &model->cfg;
  const int row_cap = model->max_batch * c->seq_len;
  MOE_FAIL_IF(ctx, slots < 1 || slots > 65536, MOE_STATUS_INVALID_ARG,
              "KV-cache slots (%d) must be in [1, 65536]", slots);
  MOE_FAIL_IF(ctx, max_rows < 1 || max_rows > row_cap, MOE_STATUS_INVALID_ARG,
              "rows per decode step (%d) must be in [1, %d] (the model's max_batch %d x "
              "seq_len %d)",
              max_rows, row_cap, model->max_batch, c->seq_len);
  kv = moe_calloc(1, sizeof *kv);
  MOE_FAIL_IF(ctx, !kv, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate the KV cache");
  kv->model = model;
  kv->slots = slots;
  kv->max_rows = max_rows;
  kv->seq_len = c->seq_len;
  const kv_sizes z = sizes_for(c, slots, max_rows);
  const size_t R = (size_t)max_rows;
  const size_t bytes = total_floats(&z, R) * sizeof(float);
  MOE_FAIL_IF(ctx, z.cache > SIZE_MAX / 16, MOE_STATUS_INVALID_ARG,
              "KV cache too large (%d slots x %d positions)", slots, c->seq_len);
  st = moe_arena_init(ctx, &kv->arena, bytes);
  if (st != MOE_STATUS_OK) {
    MOE_FAIL(ctx, MOE_STATUS_OUT_OF_MEMORY,
             "cannot allocate the KV cache: %.1f MiB for %d slots x %d positions x %d layers",
             (double)bytes / (1 << 20), slots, c->seq_len, c->n_layer);
  }
  float *p = moe_arena_alloc(&kv->arena, bytes);
  MOE_FAIL_IF(ctx, !p, MOE_STATUS_INTERNAL, "cannot carve the KV cache");
#define TAKE(field, count) \
  do {                     \
    kv->field = p;         \
    p += (count);          \
  } while (0)
  TAKE(k, pad16(z.cache));
  TAKE(v, pad16(z.cache));
  TAKE(x, z.rows_m);
  TAKE(xn, z.rows_m);
  TAKE(ln, z.rows_m);
  TAKE(atty, z.rows_m);
  TAKE(resid2, z.rows_m);
  TAKE(head, z.rows_m);
  TAKE(mean, pad16(R));
  TAKE(rstd, pad16(R));
  TAKE(qkv, z.qkv);
  if (z.hd) {
    TAKE(fch, z.hd);
    TAKE(fchg, z.hd);
  }
  TAKE(att_scr, z.att);
#undef TAKE
  kv->len = (int32_t *)p;
  kv->seen = kv->len + slots;
  kv->stamp = (uint32_t *)(kv->seen + slots);
  memset(kv->len, 0, (size_t)3 * (size_t)slots * sizeof(int32_t));
  *out = kv;
  kv = NULL;
done:
  moe_gpt_kv_destroy(kv);
  return st;
}

void moe_gpt_kv_destroy(moe_gpt_kv *kv) {
  if (!kv) return;
  moe_arena_free(&kv->arena);
  moe_free(kv);
}

int moe_gpt_kv_slots(const moe_gpt_kv *kv) { return kv->slots; }
int moe_gpt_kv_max_rows(const moe_gpt_kv *kv) { return kv->max_rows; }

int moe_gpt_kv_length(const moe_gpt_kv *kv, int slot) {
  return slot >= 0 && slot < kv->slots ? kv->len[slot] : 0;
}

void moe_gpt_kv_reset(moe_gpt_kv *kv, int slot) {
  if (slot >= 0 && slot < kv->slots) kv->len[slot] = 0;
}

// Checks every row before anything changes (the cache stays as it was on error).
static moe_status check_rows(moe_ctx *ctx, moe_gpt_kv *kv, const moe_gpt_config *c,
                             const moe_gpt_decode_row *rows, int n, int *n_logits) {
  moe_status st = MOE_STATUS_OK;
  kv->call++;
  *n_logits = 0;
  for (int r = 0; r < n; r++) {
    const moe_gpt_decode_row *w = &rows[r];
    MOE_FAIL_IF(ctx, w->slot < 0 || w->slot >= kv->slots, MOE_STATUS_INVALID_ARG,
                "decode row %d: slot (%d) must be in [0, %d)", r, (int)w->slot, kv->slots);
    MOE_FAIL_IF(ctx, w->token < 0 || w->token >= c->vocab_size, MOE_STATUS_INVALID_ARG,
                "decode row %d: token (%d) must be in [0, %d)", r, (int)w->token, c->vocab_size);
    MOE_FAIL_IF(ctx, w->pos < 0 || w->pos >= c->seq_len, MOE_STATUS_INVALID_ARG,
                "decode row %d: position (%d) must be in [0, %d) (the model's seq_len)", r,
                (int)w->pos, c->seq_len);
    const int first = kv->stamp[w->slot] != kv->call;
    if (first) {
      MOE_FAIL_IF(ctx, w->pos > kv->len[w->slot], MOE_STATUS_INVALID_ARG,
                  "decode row %d: position (%d) of slot %d must be at most the %d positions "
                  "it holds (no gaps)",
                  r, (int)w->pos, (int)w->slot, (int)kv->len[w->slot]);
    } else {
      MOE_FAIL_IF(ctx, w->pos != kv->seen[w->slot], MOE_STATUS_INVALID_ARG,
                  "decode row %d: position (%d) of slot %d must follow the slot's previous row "
                  "in this step (%d)",
                  r, (int)w->pos, (int)w->slot, (int)kv->seen[w->slot]);
    }
    kv->stamp[w->slot] = kv->call;
    kv->seen[w->slot] = w->pos + 1;
    *n_logits += w->want_logits != 0;
  }
done:
  return st;
}

moe_status moe_gpt_decode(moe_gpt *m, moe_gpt_kv *kv, const moe_gpt_decode_row *rows, int n,
                          float *logits) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = m ? m->ctx : NULL;
  MOE_FAIL_IF(ctx, !m || !kv || kv->model != m, MOE_STATUS_INVALID_ARG,
              "decode: a model and a KV cache made for it are needed");
  const moe_gpt_config *c = &m->cfg;
  MOE_FAIL_IF(ctx, n < 0 || n > kv->max_rows || (n > 0 && !rows), MOE_STATUS_INVALID_ARG,
              "decode: rows (%d) must be in [0, %d]", n, kv->max_rows);
  int n_logits = 0;
  MOE_TRY(check_rows(ctx, kv, c, rows, n, &n_logits));
  MOE_FAIL_IF(ctx, n_logits > 0 && !logits, MOE_STATUS_INVALID_ARG,
              "decode: %d rows want logits but the logits buffer is NULL", n_logits);
  m->have_forward = 0;
  const int N = n, M = c->d_model, V = c->vocab_size, NH = c->n_head, hd = M / NH;
  const int Hd = c->dense_hidden, S = c->seq_len;
  const size_t slot_stride = (size_t)S * M, layer_stride = (size_t)kv->slots * slot_stride;

  // embeddings
  float *x = kv->x, *xn = kv->xn;
  for (int r = 0; r < N; r++) {
    const float *te = m->wte + (size_t)rows[r].token * M, *pe = m->wpe + (size_t)rows[r].pos * M;
    float *xr = x + (size_t)r * M;
    for (int j = 0; j < M; j++) xr[j] = te[j] + pe[j];
  }
  for (int l = 0; l < c->n_layer; l++) {
    gpt_block *blk = &m->blocks[l];
    const gpt_block_params *p = &blk->p;
    float *kc = kv->k + (size_t)l * layer_stride, *vc = kv->v + (size_t)l * layer_stride;
    if (N > 0) {
      moe_layernorm_forward(kv->ln, kv->mean, kv->rstd, x, p->ln1_g, p->ln1_b, N, M, c->ln_eps);
      moe_linear_forward(kv->qkv, kv->ln, p->w_qkv, p->b_qkv, N, M, 3 * M);
      for (int r = 0; r < N; r++) {  // every row's key and value first: a chunk attends to itself
        const float *q = kv->qkv + (size_t)r * 3 * M;
        const size_t at = (size_t)rows[r].slot * slot_stride + (size_t)rows[r].pos * M;
        memcpy(kc + at, q + M, (size_t)M * sizeof(float));
        memcpy(vc + at, q + 2 * M, (size_t)M * sizeof(float));
      }
      for (int r = 0; r < N; r++) {
        const size_t base = (size_t)rows[r].slot * slot_stride;
        moe_attention_decode(kv->atty + (size_t)r * M, kv->qkv + (size_t)r * 3 * M, kc + base,
                             vc + base, M, rows[r].pos + 1, NH, hd, kv->att_scr);
      }
      memcpy(kv->resid2, x, (size_t)N * M * sizeof(float));
      moe_gemm(0, 0, N, M, M, 1.0f, kv->atty, M, p->w_proj, M, 1.0f, kv->resid2, M);
      moe_bias_add_forward(kv->resid2, p->b_proj, N, M);
      moe_layernorm_forward(kv->ln, kv->mean, kv->rstd, kv->resid2, p->ln2_g, p->ln2_b, N, M,
                            c->ln_eps);
    }
    if (blk->is_moe) {  // also with no rows: a distributed backend's collectives
      moe_layer_stats ls;
      memset(&ls, 0, sizeof ls);
      MOE_TRY(m->ops->forward(blk->moe, kv->ln, N, xn, &ls));
      moe_add_inplace(xn, kv->resid2, (size_t)N * M);
    } else if (N > 0) {
      moe_linear_forward(kv->fch, kv->ln, p->w_fc, p->b_fc, N, M, Hd);
      moe_gelu_forward(kv->fchg, kv->fch, (size_t)N * Hd);
      memcpy(xn, kv->resid2, (size_t)N * M * sizeof(float));
      moe_gemm(0, 0, N, M, Hd, 1.0f, kv->fchg, Hd, p->w_fc2, M, 1.0f, xn, M);
      moe_bias_add_forward(xn, p->b_fc2, N, M);
    }
    float *t = x;
    x = xn;
    xn = t;
  }
  // the slots' lengths, then the head for the rows that want logits
  for (int r = 0; r < N; r++) kv->len[rows[r].slot] = rows[r].pos + 1;
  if (n_logits > 0) {
    int o = 0;
    for (int r = 0; r < N; r++) {
      if (!rows[r].want_logits) continue;
      memcpy(kv->head + (size_t)o * M, x + (size_t)r * M, (size_t)M * sizeof(float));
      o++;
    }
    moe_layernorm_forward(kv->ln, kv->mean, kv->rstd, kv->head, m->lnf_g, m->lnf_b, n_logits, M,
                          c->ln_eps);
    moe_gemm(0, 1, n_logits, V, M, 1.0f, kv->ln, M, m->wte, M, 0.0f, logits, V);
  }
done:
  return st;
}
