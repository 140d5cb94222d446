// Incremental decoding with the KV cache (moe_gpt_decode) against the full
// forward (moe_gpt_forward on the sequence's tokens 0..pos): every row's logits
// within 1e-5, for prompts cut into prefill chunks of several sizes, single
// tokens, sequences of different lengths mixed in one step, slot reuse and
// rewinding; on the batch-invariant backend the bits of a row do not depend on
// the schedule; bad rows are refused with the cache unchanged. On a small model
// (dense and MoE blocks) and on the default demo model (seq_len 128).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/model.h"
#include "testutil.h"

enum { MAX_SEQ = 6 };

typedef struct {
  moe_ctx *ctx;
  moe_gpt *model;
  int V, S;
  int32_t tok[MAX_SEQ][256];
  int len[MAX_SEQ];
  float *ref[MAX_SEQ];  // (len, V) logits of the full forward
} fixture;

static void make_fixture(fixture *f, const moe_gpt_config *cfg, int max_batch, uint64_t seed) {
  memset(f, 0, sizeof *f);
  TU_CHECK(moe_ctx_create(&f->ctx) == MOE_STATUS_OK, "ctx");
  TU_CHECK(moe_gpt_create(f->ctx, cfg, max_batch, NULL, NULL, &f->model) == MOE_STATUS_OK, "%s",
           moe_ctx_error(f->ctx));
  moe_gpt_init_params(f->model, seed);
  // a non-zero router bias, so that routing is not the init's near-uniform one
  for (int l = 0; l < cfg->n_layer; l++) {
    float *rb = moe_gpt_router_bias(f->model, l);
    if (rb)
      for (int e = 0; e < cfg->moe.num_experts; e++) rb[e] = 0.05f * (float)((e * 7 + l) % 5);
  }
  f->V = cfg->vocab_size;
  f->S = cfg->seq_len;
  moe_rng rng;
  moe_rng_init(&rng, seed, 77);
  for (int q = 0; q < MAX_SEQ; q++) {
    f->len[q] = f->S - (q * 3) % (f->S / 2);
    for (int t = 0; t < f->len[q]; t++)
      f->tok[q][t] = (int32_t)(moe_rng_u32(&rng) % (uint32_t)f->V);
    f->ref[q] = malloc((size_t)f->len[q] * f->V * sizeof(float));
    TU_CHECK(moe_gpt_forward(f->model, f->tok[q], NULL, 1, f->len[q], 0, NULL) == MOE_STATUS_OK,
             "%s", moe_ctx_error(f->ctx));
    memcpy(f->ref[q], moe_gpt_logits(f->model), (size_t)f->len[q] * f->V * sizeof(float));
  }
}

static void free_fixture(fixture *f) {
  for (int q = 0; q < MAX_SEQ; q++) free(f->ref[q]);
  moe_gpt_destroy(f->model);
  moe_ctx_destroy(f->ctx);
}

static double max_rel(const float *a, const float *b, int n) {
  double worst = 0;
  for (int i = 0; i < n; i++) {
    const double d = fabs((double)a[i] - b[i]) / fmax(1.0, fabs((double)b[i]));
    worst = d > worst ? d : worst;
  }
  return worst;
}

// Decodes sequences 0..nseq-1 in slots slot0.. with a schedule: at each step
// sequence q advances by chunk[q] positions (a prompt in chunks, then the
// rest), every row wanting logits; checks every row against the reference and
// stores the logits in out[q] (len, V) when out is not NULL.
static double run_schedule(fixture *f, moe_gpt_kv *kv, int nseq, int slot0, const int *chunk,
                           float **out) {
  const int R = moe_gpt_kv_max_rows(kv);
  moe_gpt_decode_row *rows = malloc((size_t)R * sizeof *rows);
  float *logits = malloc((size_t)R * f->V * sizeof(float));
  int done[MAX_SEQ] = {0};
  double worst = 0;
  for (int step = 0; step < 10000; step++) {
    int n = 0;
    for (int q = 0; q < nseq; q++) {
      for (int c = 0; c < chunk[q] && done[q] < f->len[q] && n < R; c++, done[q]++) {
        rows[n] = (moe_gpt_decode_row){slot0 + q, done[q], f->tok[q][done[q]], 1};
        n++;
      }
    }
    if (n == 0) break;
    TU_CHECK(moe_gpt_decode(f->model, kv, rows, n, logits) == MOE_STATUS_OK, "decode: %s",
             moe_ctx_error(f->ctx));
    for (int r = 0; r < n; r++) {
      const int q = rows[r].slot - slot0, p = rows[r].pos;
      const float *ref = f->ref[q] + (size_t)p * f->V;
      const double d = max_rel(logits + (size_t)r * f->V, ref, f->V);
      worst = d > worst ? d : worst;
      if (out) memcpy(out[q] + (size_t)p * f->V, logits + (size_t)r * f->V, f->V * sizeof(float));
    }
  }
  for (int q = 0; q < nseq; q++)
    TU_CHECK(moe_gpt_kv_length(kv, slot0 + q) == f->len[q], "slot %d holds %d of %d", slot0 + q,
             moe_gpt_kv_length(kv, slot0 + q), f->len[q]);
  free(rows);
  free(logits);
  return worst;
}

static void test_small(void) {
  moe_gpt_config cfg;
  moe_gpt_config_default(&cfg);
  cfg.vocab_size = 61;
  cfg.seq_len = 24;
  cfg.n_layer = 3;
  cfg.moe_every = 2;  // blocks 0 and 2 dense, block 1 MoE
  cfg.n_head = 2;
  cfg.d_model = 16;
  cfg.dense_hidden = 40;
  cfg.moe.num_experts = 4;
  cfg.moe.top_k = 2;
  cfg.moe.hidden_dim = 24;
  fixture f;
  make_fixture(&f, &cfg, 2, 11);
  moe_gpt_kv *kv = NULL;
  TU_CHECK(moe_gpt_kv_create(f.ctx, f.model, 2 * MAX_SEQ, 40, &kv) == MOE_STATUS_OK, "%s",
           moe_ctx_error(f.ctx));
  float *a[MAX_SEQ], *b[MAX_SEQ];
  for (int q = 0; q < MAX_SEQ; q++) {
    a[q] = calloc((size_t)f.len[q] * f.V, sizeof(float));
    b[q] = calloc((size_t)f.len[q] * f.V, sizeof(float));
  }
  // schedule 1: prefill chunks of 1..6 positions, sequences of different lengths
  const int chunk1[MAX_SEQ] = {1, 5, 24, 3, 2, 6};
  double d = run_schedule(&f, kv, MAX_SEQ, 0, chunk1, a);
  TU_CHECK(d <= 1e-5, "chunked schedule: logits differ from the full forward by %.3g", d);
  // schedule 2: other chunks, other slots (reuse after reset)
  const int chunk2[MAX_SEQ] = {7, 1, 1, 4, 24, 2};
  d = run_schedule(&f, kv, MAX_SEQ, MAX_SEQ, chunk2, b);
  TU_CHECK(d <= 1e-5, "second schedule: %.3g", d);
  const int batch_invariant = moe_backend_current()->batch_invariant;
  for (int q = 0; q < MAX_SEQ; q++) {
    if (batch_invariant)
      TU_CHECK(memcmp(a[q], b[q], (size_t)f.len[q] * f.V * sizeof(float)) == 0,
               "sequence %d: logits depend on the schedule on the batch-invariant backend '%s'", q,
               moe_backend_current()->name);
  }
  // slot reuse: reset slots 0..5 and decode again one token at a time
  for (int q = 0; q < MAX_SEQ; q++) moe_gpt_kv_reset(kv, q);
  const int ones[MAX_SEQ] = {1, 1, 1, 1, 1, 1};
  d = run_schedule(&f, kv, MAX_SEQ, 0, ones, b);
  TU_CHECK(d <= 1e-5, "reused slots: %.3g", d);
  for (int q = 0; q < MAX_SEQ && batch_invariant; q++)
    TU_CHECK(memcmp(a[q], b[q], (size_t)f.len[q] * f.V * sizeof(float)) == 0,
             "sequence %d: reused slot gives other bits", q);

  // rewind: slot 0 back to position 5 with sequence 1's tokens from there on
  // is the full forward of seq0[0..5) + seq1[5..)
  {
    int32_t mixed[64];
    const int L = 12;
    for (int t = 0; t < L; t++) mixed[t] = t < 5 ? f.tok[0][t] : f.tok[1][t];
    TU_CHECK(moe_gpt_forward(f.model, mixed, NULL, 1, L, 0, NULL) == MOE_STATUS_OK, "fwd");
    float *ref = malloc((size_t)L * f.V * sizeof(float));
    memcpy(ref, moe_gpt_logits(f.model), (size_t)L * f.V * sizeof(float));
    moe_gpt_decode_row rows[8];
    float logits[8 * 61];
    for (int t = 5; t < L; t++) rows[t - 5] = (moe_gpt_decode_row){0, t, mixed[t], 1};
    TU_CHECK(moe_gpt_decode(f.model, kv, rows, L - 5, logits) == MOE_STATUS_OK, "%s",
             moe_ctx_error(f.ctx));
    TU_CHECK(moe_gpt_kv_length(kv, 0) == L, "rewound slot holds %d", moe_gpt_kv_length(kv, 0));
    for (int t = 5; t < L; t++) {
      d = max_rel(logits + (size_t)(t - 5) * f.V, ref + (size_t)t * f.V, f.V);
      TU_CHECK(d <= 1e-5, "rewind position %d: %.3g", t, d);
    }
    // only some rows want logits: they come in row order
    for (int t = 5; t < L; t++) rows[t - 5].want_logits = t % 3 == 0;  // 6, 9
    TU_CHECK(moe_gpt_decode(f.model, kv, rows, L - 5, logits) == MOE_STATUS_OK, "%s",
             moe_ctx_error(f.ctx));
    TU_CHECK(max_rel(logits, ref + 6 * f.V, f.V) <= 1e-5 &&
                 max_rel(logits + f.V, ref + 9 * f.V, f.V) <= 1e-5,
             "logits of the selected rows");
    free(ref);
  }

  // bad rows: refused, naming the problem, cache lengths unchanged
  {
    const int before0 = moe_gpt_kv_length(kv, 0), before1 = moe_gpt_kv_length(kv, 1);
    float logits[4 * 61];
    struct {
      moe_gpt_decode_row rows[2];
      int n;
      const char *want;
    } bad[] = {
        {{{0, before0, 3, 1}, {99, 0, 3, 1}}, 2, "slot (99)"},
        {{{0, before0, 3, 1}, {1, before1 + 1, 3, 1}}, 2, "no gaps"},
        {{{0, before0, 61, 1}}, 1, "token (61)"},
        {{{0, 24, 1, 1}}, 1, "position (24)"},
        {{{1, 2, 1, 1}, {1, 4, 1, 1}}, 2, "must follow"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      const moe_status st = moe_gpt_decode(f.model, kv, bad[i].rows, bad[i].n, logits);
      TU_CHECK(st == MOE_STATUS_INVALID_ARG && strstr(moe_ctx_error(f.ctx), bad[i].want),
               "bad row case %zu: status %d, '%s'", i, (int)st, moe_ctx_error(f.ctx));
      TU_CHECK(moe_gpt_kv_length(kv, 0) == before0 && moe_gpt_kv_length(kv, 1) == before1,
               "bad row case %zu changed the cache", i);
    }
    TU_CHECK(moe_gpt_decode(f.model, kv, NULL, 0, NULL) == MOE_STATUS_OK, "an empty step");
    moe_gpt_kv *kv2 = NULL;
    TU_CHECK(moe_gpt_kv_create(f.ctx, f.model, 1, 49, &kv2) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(f.ctx), "[1, 48]"),
             "max_rows above the model's tokens: '%s'", moe_ctx_error(f.ctx));
    TU_CHECK(moe_gpt_kv_create(f.ctx, f.model, 0, 8, &kv2) == MOE_STATUS_INVALID_ARG, "zero slots");
    TU_CHECK(moe_gpt_kv_bytes(&cfg, 4, 16) > (size_t)2 * 3 * 4 * 24 * 16 * 4, "bytes");
  }
  for (int q = 0; q < MAX_SEQ; q++) {
    free(a[q]);
    free(b[q]);
  }
  moe_gpt_kv_destroy(kv);
  free_fixture(&f);
}

// The default demo model (V 256, S 128, L 4, M 128, E 8, K 2): sequences up to
// 128 positions, prefill and decode mixed.
static void test_default_model(void) {
  moe_gpt_config cfg;
  moe_gpt_config_default(&cfg);
  fixture f;
  make_fixture(&f, &cfg, 2, 5);
  moe_gpt_kv *kv = NULL;
  TU_CHECK(moe_gpt_kv_create(f.ctx, f.model, MAX_SEQ, 256, &kv) == MOE_STATUS_OK, "%s",
           moe_ctx_error(f.ctx));
  const int chunk[MAX_SEQ] = {1, 16, 128, 1, 40, 3};
  const double d = run_schedule(&f, kv, MAX_SEQ, 0, chunk, NULL);
  TU_CHECK(d <= 1e-5, "default model: logits differ from the full forward by %.3g", d);
  printf("default model: max relative logit difference, decode vs full forward: %.3g\n", d);
  moe_gpt_kv_destroy(kv);
  free_fixture(&f);
}

int main(void) {
  test_small();
  test_default_model();
  return tu_finish("test_gpt_decode");
}
