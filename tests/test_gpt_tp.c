// MoE-GPT with tensor parallelism (moe_gpt_create_tp) against the
// single-process model: MP = the world, every rank runs the same batch through
// its MP model (the all-reduce is MPI_Allreduce over MPI_COMM_WORLD) and
// through a whole reference model of the same config and parameters, and
// compares the loss, the logits and every gradient (its slice of each split
// tensor, the others whole; relative error <= 1e-5) after two forward +
// backward calls (gradients accumulate), in a model of dense and MoE blocks.
// Also: the init gives each rank exactly the reference's values of its slice;
// the parameter table describes the slices; MP size 1 gives the bits of
// moe_gpt_create; heads or dense_hidden that do not split, deterministic
// mode without a chain and KV-cache decoding are refused with MP > 1; in
// deterministic mode (the MP sums as moe_chain_run chains) loss, logits and
// every gradient are the whole model's bits; moe_gpt_memory_tp is
// what create_tp and the optimizer allocate; a whole checkpoint (parameters
// and AdamW moments) loads each rank's slices. Run under mpirun with 1, 2, 4 ranks.
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/checkpoint.h"
#include "moe/comm.h"
#include "moe/gpt_io.h"
#include "moe/model.h"
#include "testutil.h"
#include "testutil_mpi.h"

#define REL_TOL 1e-5

static moe_ctx *g_ctx;
static int g_rank, g_world;

static moe_status mpi_sum(void *user, float *buf, size_t n) {
  (void)user;
  const int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? MOE_STATUS_OK : MOE_STATUS_INTERNAL;
}

static moe_chain_state g_chains;  // the MP chains' requests, kept between calls

static moe_status mpi_chain(void *user, const moe_chain *ch) {
  (void)user;
  return moe_chain_run(g_ctx, MPI_COMM_WORLD, ch, &g_chains, "test MP chain");
}

static moe_gpt_tp world_tp(void) {
  const moe_gpt_tp tp = {g_world, g_rank, mpi_sum, NULL, mpi_chain};
  return tp;
}

// V 64, S 16, L 3, NH 4, M 32, dense 64, MoE in block 1 (E 4, K 2, H 32, dropless).
static moe_gpt_config test_config(void) {
  moe_gpt_config c;
  moe_gpt_config_default(&c);
  c.vocab_size = 64;
  c.seq_len = 16;
  c.n_layer = 3;
  c.n_head = 4;
  c.d_model = 32;
  c.dense_hidden = 64;
  c.moe_every = 2;
  c.init_std = 0.2f;
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  c.moe.hidden_dim = 32;
  c.moe.capacity_factor = -1.0;
  c.moe.aux_loss_coef = 0.05f;
  c.moe.z_loss_coef = 0.01f;
  return c;
}

// This rank's slice of the whole tensor `whole` as p describes it (tp_dim,
// tp_parts, tp_first, tp_count), into out (p->numel floats); whole when tp_dim < 0.
static void take_slice(const moe_gpt_param *p, const float *whole, float *out) {
  if (p->tp_dim < 0) {
    memcpy(out, whole, p->numel * sizeof(float));
    return;
  }
  size_t outer = 1, inner = 1;
  for (int d = 0; d < p->tp_dim; d++) outer *= (size_t)p->dims[d];
  for (int d = p->tp_dim + 1; d < p->ndim; d++) inner *= (size_t)p->dims[d];
  const size_t dim = (size_t)p->dims[p->tp_dim], part = dim / (size_t)p->tp_parts;
  size_t j = 0;
  for (size_t o = 0; o < outer; o++)
    for (int t = 0; t < p->tp_parts; t++)
      for (int c = 0; c < p->tp_count; c++)
        for (size_t i = 0; i < inner; i++)
          out[j++] =
              whole[(o * dim + (size_t)t * part + (size_t)p->tp_first + (size_t)c) * inner + i];
}

static moe_gpt *create(const moe_gpt_config *c, int B, const moe_gpt_tp *tp) {
  moe_gpt *m = NULL;
  const moe_status st = moe_gpt_create_tp(g_ctx, c, B, NULL, NULL, tp, &m);
  TU_CHECK(st == MOE_STATUS_OK, "create_tp (MP %d): %s", tp ? tp->size : 1, moe_ctx_error(g_ctx));
  if (!m) {
    fprintf(stderr, "rank %d: cannot go on without the model\n", g_rank);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return m;
}

static void fill_batch(int32_t *tok, int32_t *tgt, int n, int v, uint64_t seed) {
  moe_rng rng;
  moe_rng_init(&rng, seed, 3);
  for (int i = 0; i < n; i++) {
    tok[i] = (int32_t)(moe_rng_u32(&rng) % (uint32_t)v);
    tgt[i] = i % 7 == 5 ? -1 : (int32_t)(moe_rng_u32(&rng) % (uint32_t)v);  // some ignored
  }
}

// ---- the parameter table and the init -----------------------------------------------------

static void test_table_and_init(void) {
  const moe_gpt_config c = test_config();
  const moe_gpt_tp tp = world_tp();
  moe_gpt *ref = create(&c, 2, NULL), *m = create(&c, 2, &tp);
  TU_CHECK(moe_gpt_tp_size(m) == g_world && moe_gpt_tp_size(ref) == 1, "tp sizes %d, %d",
           moe_gpt_tp_size(m), moe_gpt_tp_size(ref));
  moe_gpt_init_params(ref, 77);
  moe_gpt_init_params(m, 77);
  TU_CHECK(moe_gpt_num_params(m) == moe_gpt_num_params(ref), "parameter counts differ");
  TU_CHECK(moe_gpt_total_elements(m) == moe_gpt_total_elements(ref),
           "total elements differ (%zu vs %zu)", moe_gpt_total_elements(m),
           moe_gpt_total_elements(ref));
  const int Ma = c.d_model / g_world, Hl = c.dense_hidden / g_world;
  int n_split = 0;
  for (int i = 0; i < moe_gpt_num_params(m); i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i), r = moe_gpt_get_param(ref, i);
    TU_CHECK(strcmp(p.name, r.name) == 0 && p.ndim == r.ndim && p.kind == r.kind,
             "tensor %d: %s vs %s", i, p.name, r.name);
    for (int d = 0; d < 4; d++)
      TU_CHECK(p.dims[d] == r.dims[d], "%s: whole dims[%d] %lld vs %lld", p.name, d,
               (long long)p.dims[d], (long long)r.dims[d]);
    TU_CHECK(r.tp_dim == -1, "%s: split in the single-process model", r.name);
    // what is split, along which dimension (none at MP 1)
    const char *leaf = strchr(p.name, '.') ? strchr(p.name, '.') + 1 : p.name;
    int want_dim = -1, want_parts = 1, want_count = 0;
    if (g_world > 1) {
      if (strcmp(leaf, "attn.w_qkv") == 0) want_dim = 1, want_parts = 3, want_count = Ma;
      if (strcmp(leaf, "attn.b_qkv") == 0) want_dim = 0, want_parts = 3, want_count = Ma;
      if (strcmp(leaf, "attn.w_proj") == 0) want_dim = 0, want_count = Ma;
      if (strcmp(leaf, "ffn.w_fc") == 0) want_dim = 1, want_count = Hl;
      if (strcmp(leaf, "ffn.b_fc") == 0) want_dim = 0, want_count = Hl;
      if (strcmp(leaf, "ffn.w_fc2") == 0) want_dim = 0, want_count = Hl;
    }
    TU_CHECK(p.tp_dim == want_dim && p.tp_parts == want_parts && p.tp_count == want_count &&
                 p.tp_first == (want_dim >= 0 ? g_rank * want_count : 0),
             "%s: tp_dim %d parts %d first %d count %d, expected dim %d parts %d count %d", p.name,
             p.tp_dim, p.tp_parts, p.tp_first, p.tp_count, want_dim, want_parts, want_count);
    TU_CHECK(p.numel == (want_dim >= 0 ? r.numel / (size_t)g_world : r.numel),
             "%s: numel %zu (whole %zu)", p.name, p.numel, r.numel);
    n_split += p.tp_dim >= 0;
    // the init: exactly the whole tensor's values at this rank's slice
    float *want = tu_fbuf(p.numel);
    take_slice(&p, r.data, want);
    TU_CHECK(memcmp(want, p.data, p.numel * sizeof(float)) == 0, "%s: init differs from the slice",
             p.name);
  }
  // 3 blocks with attention, 2 of them dense: 3 x 3 + 2 x 3 split tensors
  TU_CHECK(n_split == (g_world > 1 ? 15 : 0), "%d split tensors", n_split);
  moe_gpt_destroy(ref);
  moe_gpt_destroy(m);
  tu_free_all();
}

// ---- forward and backward against the single-process model ---------------------------------

// Checks loss, logits and every gradient of m (MP) against ref (whole).
// Deterministic mode: the same bits.
static void compare_bits(const char *when, moe_gpt *m, moe_gpt *ref, const moe_gpt_loss *lm,
                         const moe_gpt_loss *lr, size_t n_logits) {
  TU_CHECK(lm->loss == lr->loss && lm->aux == lr->aux && lm->z == lr->z,
           "%s (deterministic): loss %.17g vs %.17g, aux %.17g vs %.17g (rank %d)", when, lm->loss,
           lr->loss, lm->aux, lr->aux, g_rank);
  TU_CHECK(memcmp(moe_gpt_logits(m), moe_gpt_logits(ref), n_logits * sizeof(float)) == 0,
           "%s (deterministic): logits differ (rank %d)", when, g_rank);
  for (int i = 0; i < moe_gpt_num_params(m); i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i), r = moe_gpt_get_param(ref, i);
    float *want = tu_fbuf(p.numel);
    take_slice(&p, r.grad, want);
    TU_CHECK(memcmp(p.grad, want, p.numel * sizeof(float)) == 0,
             "%s (deterministic): d%s differs from the whole model's slice (rank %d, max rel %.3g)",
             when, p.name, g_rank, tu_max_rel_err(p.grad, want, p.numel));
  }
}

static void compare(const char *when, moe_gpt *m, moe_gpt *ref, const moe_gpt_loss *lm,
                    const moe_gpt_loss *lr, size_t n_logits) {
  char name[128];
  TU_CHECK(fabs(lm->loss - lr->loss) <= REL_TOL * fabs(lr->loss), "%s: loss %.9g vs %.9g (rank %d)",
           when, lm->loss, lr->loss, g_rank);
  TU_CHECK(fabs(lm->aux - lr->aux) <= REL_TOL * fabs(lr->aux) + 1e-12, "%s: aux %.9g vs %.9g", when,
           lm->aux, lr->aux);
  TU_CHECK(lm->tokens == lr->tokens, "%s: tokens %d vs %d", when, lm->tokens, lr->tokens);
  snprintf(name, sizeof name, "%s: logits (rank %d)", when, g_rank);
  tu_rel_close(name, moe_gpt_logits(m), moe_gpt_logits(ref), n_logits, REL_TOL);
  for (int i = 0; i < moe_gpt_num_params(m); i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i), r = moe_gpt_get_param(ref, i);
    float *want = tu_fbuf(p.numel);
    take_slice(&p, r.grad, want);
    snprintf(name, sizeof name, "%s: d%s (rank %d)", when, p.name, g_rank);
    tu_rel_close(name, p.grad, want, p.numel, REL_TOL);
  }
}

// det: both models in deterministic mode (the MP sums as chains), compared bit
// for bit; a sequence count of 4 (the per-sequence leaves' tree).
static void test_against_reference(int det) {
  const moe_gpt_config c = test_config();
  const moe_gpt_tp tp = world_tp();
  const int B = det ? 4 : 3, S = c.seq_len, N = B * S;
  moe_gpt *ref = create(&c, B, NULL), *m = create(&c, B, &tp);
  if (det) {
    TU_CHECK(moe_gpt_set_deterministic(ref, 1) == MOE_STATUS_OK &&
                 moe_gpt_set_deterministic(m, 1) == MOE_STATUS_OK,
             "deterministic mode with MP %d: %s", g_world, moe_ctx_error(g_ctx));
  }
  // init, then biases away from 0 and gains away from 1 (they would hide
  // mistakes), then this rank's slices of the reference's values
  moe_gpt_init_params(ref, 5);
  for (int i = 0; i < moe_gpt_num_params(ref); i++) {
    const moe_gpt_param r = moe_gpt_get_param(ref, i);
    if (r.ndim == 1) {
      float *noise = tu_filled(r.numel, 900 + (uint64_t)i, -0.3f, 0.3f);
      for (size_t j = 0; j < r.numel; j++) r.data[j] += noise[j];
    }
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    take_slice(&p, r.data, p.data);
  }
  moe_gpt_zero_grad(ref);
  moe_gpt_zero_grad(m);
  int32_t *tok = (int32_t *)tu_ibuf((size_t)N), *tgt = (int32_t *)tu_ibuf((size_t)N);
  for (int call = 0; call < 2; call++) {
    // the second call: fewer sequences, shorter, a fixed denominator
    const int b = call == 0 ? B : 2, s = call == 0 ? S : S - 3;
    const double denom = call == 0 ? 0.0 : 40.0;
    fill_batch(tok, tgt, b * s, c.vocab_size, 11 + (uint64_t)call);
    moe_gpt_loss lm, lr;
    TU_CHECK(moe_gpt_forward(ref, tok, tgt, b, s, denom, &lr) == MOE_STATUS_OK, "ref forward: %s",
             moe_ctx_error(g_ctx));
    TU_CHECK(moe_gpt_forward(m, tok, tgt, b, s, denom, &lm) == MOE_STATUS_OK, "MP forward: %s",
             moe_ctx_error(g_ctx));
    TU_CHECK(moe_gpt_backward(ref) == MOE_STATUS_OK, "ref backward: %s", moe_ctx_error(g_ctx));
    TU_CHECK(moe_gpt_backward(m) == MOE_STATUS_OK, "MP backward: %s", moe_ctx_error(g_ctx));
    char when[32];
    snprintf(when, sizeof when, "call %d", call + 1);
    if (det) {
      compare_bits(when, m, ref, &lm, &lr, (size_t)b * s * c.vocab_size);
    } else {
      compare(when, m, ref, &lm, &lr, (size_t)b * s * c.vocab_size);
    }
  }
  moe_gpt_destroy(ref);
  moe_gpt_destroy(m);
  tu_free_all();
}

// MP size 1 through the ops: the bits of moe_gpt_create.
static void test_mp1_same_bits(void) {
  const moe_gpt_config c = test_config();
  const moe_gpt_tp one = {1, 0, mpi_sum, NULL, NULL};
  const int B = 2, N = B * c.seq_len;
  moe_gpt *a = create(&c, B, NULL), *b = create(&c, B, &one);
  moe_gpt_init_params(a, 9);
  moe_gpt_init_params(b, 9);
  int32_t *tok = (int32_t *)tu_ibuf((size_t)N), *tgt = (int32_t *)tu_ibuf((size_t)N);
  fill_batch(tok, tgt, N, c.vocab_size, 4);
  moe_gpt_loss la, lb;
  TU_CHECK(moe_gpt_forward(a, tok, tgt, B, c.seq_len, 0.0, &la) == MOE_STATUS_OK &&
               moe_gpt_forward(b, tok, tgt, B, c.seq_len, 0.0, &lb) == MOE_STATUS_OK &&
               moe_gpt_backward(a) == MOE_STATUS_OK && moe_gpt_backward(b) == MOE_STATUS_OK,
           "MP 1: %s", moe_ctx_error(g_ctx));
  TU_CHECK(la.loss == lb.loss, "MP 1: loss %.17g vs %.17g", lb.loss, la.loss);
  TU_CHECK(
      memcmp(moe_gpt_logits(a), moe_gpt_logits(b), (size_t)N * c.vocab_size * sizeof(float)) == 0,
      "MP 1: logits differ");
  for (int i = 0; i < moe_gpt_num_params(a); i++) {
    const moe_gpt_param pa = moe_gpt_get_param(a, i), pb = moe_gpt_get_param(b, i);
    TU_CHECK(pb.tp_dim == -1 && pa.numel == pb.numel &&
                 memcmp(pa.data, pb.data, pa.numel * sizeof(float)) == 0 &&
                 memcmp(pa.grad, pb.grad, pa.numel * sizeof(float)) == 0,
             "MP 1: %s differs", pa.name);
  }
  moe_gpt_destroy(a);
  moe_gpt_destroy(b);
  tu_free_all();
}

// ---- what is refused ----------------------------------------------------------------------

static void expect_refused(const moe_gpt_config *c, const moe_gpt_tp *tp, const char *what) {
  moe_gpt *m = NULL;
  const moe_status st = moe_gpt_create_tp(g_ctx, c, 2, NULL, NULL, tp, &m);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG && m == NULL, "%s: status %s", what, moe_status_str(st));
  TU_CHECK(strstr(moe_ctx_error(g_ctx), what) != NULL, "error '%s' does not say '%s'",
           moe_ctx_error(g_ctx), what);
  if (st == MOE_STATUS_OK) moe_gpt_destroy(m);
}

static void test_refused(void) {
  const moe_gpt_tp tp = world_tp();
  char msg[128];
  moe_gpt_config c = test_config();
  moe_gpt_tp bad = tp;
  bad.rank = g_world;
  snprintf(msg, sizeof msg, "MP rank (%d) must be in [0, %d]", g_world, g_world - 1);
  expect_refused(&c, &bad, msg);
  if (g_world > 1) {
    // heads that do not split over the world: NH = world + 1
    c.n_head = g_world + 1;
    c.d_model = 8 * c.n_head;
    snprintf(msg, sizeof msg, "n_head (%d) must be divisible by MP ranks (%d)", c.n_head, g_world);
    expect_refused(&c, &tp, msg);
    c = test_config();
    c.dense_hidden = 4 * g_world + 1;
    snprintf(msg, sizeof msg, "dense_hidden (%d) must be divisible by MP ranks (%d)",
             c.dense_hidden, g_world);
    expect_refused(&c, &tp, msg);
    c.moe_every = 1;  // no dense block: dense_hidden is not split
    moe_gpt *m = create(&c, 2, &tp);
    moe_gpt_destroy(m);
    bad = tp;
    bad.allreduce_sum = NULL;
    expect_refused(&c, &bad, "need an allreduce_sum");
    // deterministic mode and KV-cache decoding
    c = test_config();
    m = create(&c, 2, &tp);
    TU_CHECK(moe_gpt_set_deterministic(m, 1) == MOE_STATUS_OK, "deterministic with a chain: %s",
             moe_ctx_error(g_ctx));
    moe_gpt_destroy(m);
    bad = tp;
    bad.chain = NULL;
    m = create(&c, 2, &bad);
    TU_CHECK(moe_gpt_set_deterministic(m, 1) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(g_ctx), "needs the MP group's chain") != NULL,
             "deterministic mode with MP %d without a chain: %s", g_world, moe_ctx_error(g_ctx));
    TU_CHECK(moe_gpt_set_deterministic(m, 0) == MOE_STATUS_OK, "deterministic off: %s",
             moe_ctx_error(g_ctx));
    moe_gpt_kv *kv = NULL;
    TU_CHECK(moe_gpt_kv_create(g_ctx, m, 1, 4, &kv) == MOE_STATUS_INVALID_ARG && kv == NULL &&
                 strstr(moe_ctx_error(g_ctx), "KV-cache decoding is not supported") != NULL,
             "KV cache with MP %d: %s", g_world, moe_ctx_error(g_ctx));
    moe_gpt_destroy(m);
    moe_memory_need need;
    c.n_head = g_world + 1;
    c.d_model = 8 * c.n_head;
    TU_CHECK(
        moe_gpt_memory_tp(g_ctx, &c, 2, 1, g_world, NULL, 0, &need) == MOE_STATUS_INVALID_ARG &&
            strstr(moe_ctx_error(g_ctx), "n_head") != NULL,
        "memory_tp with NH %d at MP %d: %s", c.n_head, g_world, moe_ctx_error(g_ctx));
  }
}

// ---- a whole checkpoint loaded into the MP model ------------------------------------------

// Rank 0 writes ref (every tensor, its AdamW moments and router biases) to path.
static void write_checkpoint(const char *path, moe_gpt *ref, moe_optim *opt) {
  const int n = moe_gpt_num_params(ref), L = moe_gpt_get_config(ref)->n_layer;
  const int E = moe_gpt_get_config(ref)->moe.num_experts;
  moe_ckpt_tensor_desc *d = calloc((size_t)(3 * n + L), sizeof *d);
  const float **src = calloc((size_t)(3 * n + L), sizeof *src);
  size_t *bytes = calloc((size_t)(3 * n + L), sizeof *bytes);
  char *json = NULL;
  moe_ckpt_writer *w = NULL;
  int k = 0;
  for (int i = 0; i < n; i++) {
    const moe_gpt_param p = moe_gpt_get_param(ref, i);
    for (int what = 0; what < 3; what++, k++) {
      static const char *const prefix[3] = {"", "adam.m.", "adam.v."};
      char full[160];
      snprintf(full, sizeof full, "%s%s", prefix[what], p.name);
      snprintf(d[k].name, sizeof d[k].name, "%.63s", full);  // names here are short
      d[k].dtype = MOE_CKPT_F32;
      d[k].ndim = p.ndim;
      memcpy(d[k].dims, p.dims, sizeof d[k].dims);
      src[k] = what == 0 ? p.data : what == 1 ? moe_optim_m(opt, i) : moe_optim_v(opt, i);
      bytes[k] = p.numel * sizeof(float);
    }
  }
  for (int l = 0; l < L; l++) {
    const float *bias = moe_gpt_router_bias(ref, l);
    if (!bias) continue;
    snprintf(d[k].name, sizeof d[k].name, MOE_GPT_ROUTER_BIAS_NAME, l);
    d[k].dtype = MOE_CKPT_F32;
    d[k].ndim = 1;
    d[k].dims[0] = E;
    src[k] = bias;
    bytes[k++] = (size_t)E * sizeof(float);
  }
  moe_status st = moe_gpt_ckpt_config_json(g_ctx, ref, opt, 3, 5, 2, &json);
  if (st == MOE_STATUS_OK) st = moe_ckpt_writer_open(g_ctx, path, json, d, k, &w);
  for (int i = 0; i < k && st == MOE_STATUS_OK; i++)
    st = moe_ckpt_writer_write(w, i, src[i], bytes[i]);
  if (st == MOE_STATUS_OK) {
    st = moe_ckpt_writer_commit(w);
  } else {
    moe_ckpt_writer_abort(w);
  }
  TU_CHECK(st == MOE_STATUS_OK, "writing %s: %s", path, moe_ctx_error(g_ctx));
  moe_free(json);
  free(d);
  free(src);
  free(bytes);
}

static void test_checkpoint_load(void) {
  const moe_gpt_config c = test_config();
  const moe_gpt_tp tp = world_tp();
  moe_gpt *ref = create(&c, 2, NULL), *m = create(&c, 2, &tp);
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  moe_optim *oref = NULL, *om = NULL;
  TU_CHECK(moe_optim_create(g_ctx, ref, &oc, &oref) == MOE_STATUS_OK &&
               moe_optim_create(g_ctx, m, &oc, &om) == MOE_STATUS_OK,
           "optim: %s", moe_ctx_error(g_ctx));
  moe_gpt_init_params(ref, 31);
  for (int i = 0; i < moe_gpt_num_params(ref); i++) {
    const moe_gpt_param r = moe_gpt_get_param(ref, i);
    tu_fill(r.data, r.numel, 40 + (uint64_t)i, -1.0f, 1.0f);  // no init: every value its own
    tu_fill(moe_optim_m(oref, i), r.numel, 4000 + (uint64_t)i, -1.0f, 1.0f);
    tu_fill(moe_optim_v(oref, i), r.numel, 8000 + (uint64_t)i, 0.0f, 1.0f);
  }
  char path[64];
  snprintf(path, sizeof path, "test_gpt_tp_P%d.ckpt", g_world);
  if (g_rank == 0) write_checkpoint(path, ref, oref);
  MPI_Barrier(MPI_COMM_WORLD);
  TU_CHECK(moe_gpt_ckpt_load(g_ctx, path, m, om) == MOE_STATUS_OK, "load %s at MP %d: %s", path,
           g_world, moe_ctx_error(g_ctx));
  for (int i = 0; i < moe_gpt_num_params(m); i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i), r = moe_gpt_get_param(ref, i);
    float *want = tu_fbuf(p.numel);
    const float *got[3] = {p.data, moe_optim_m(om, i), moe_optim_v(om, i)};
    const float *whole[3] = {r.data, moe_optim_m(oref, i), moe_optim_v(oref, i)};
    for (int what = 0; what < 3; what++) {
      take_slice(&p, whole[what], want);
      TU_CHECK(memcmp(want, got[what], p.numel * sizeof(float)) == 0,
               "%s (%s) loaded at MP %d differs from the slice", p.name,
               what == 0   ? "data"
               : what == 1 ? "adam m"
                           : "adam v",
               g_world);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) remove(path);
  moe_optim_destroy(oref);
  moe_optim_destroy(om);
  moe_gpt_destroy(ref);
  moe_gpt_destroy(m);
  tu_free_all();
}

// ---- the memory estimate ------------------------------------------------------------------

static void test_memory(void) {
  const moe_gpt_config c = test_config();
  const moe_gpt_tp tp = world_tp();
  const int B = 3;
  moe_memory_need need, need1, old;
  TU_CHECK(moe_gpt_memory_tp(g_ctx, &c, B, 1, g_world, NULL, 1, &need) == MOE_STATUS_OK &&
               moe_gpt_memory_tp(g_ctx, &c, B, 1, 1, NULL, 1, &need1) == MOE_STATUS_OK &&
               moe_gpt_memory(g_ctx, &c, B, 1, NULL, 1, &old) == MOE_STATUS_OK,
           "memory: %s", moe_ctx_error(g_ctx));
  TU_CHECK(memcmp(&need1, &old, sizeof old) == 0, "memory_tp at MP 1 differs from memory");
  const uint64_t before = moe_alloc_bytes();
  moe_gpt *m = create(&c, B, &tp);
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  moe_optim *o = NULL;
  TU_CHECK(moe_optim_create(g_ctx, m, &oc, &o) == MOE_STATUS_OK, "optim: %s", moe_ctx_error(g_ctx));
  const double got = (double)(moe_alloc_bytes() - before);
  TU_CHECK(got == moe_memory_need_total(&need), "MP %d: estimate %.0f, allocated %.0f", g_world,
           moe_memory_need_total(&need), got);
  if (g_world > 1)
    TU_CHECK(need.bytes[MOE_MEM_PARAMS] < old.bytes[MOE_MEM_PARAMS] &&
                 need.bytes[MOE_MEM_ACTIVATIONS] < old.bytes[MOE_MEM_ACTIVATIONS],
             "MP %d: params %.0f, activations %.0f not below MP 1's %.0f, %.0f", g_world,
             need.bytes[MOE_MEM_PARAMS], need.bytes[MOE_MEM_ACTIVATIONS], old.bytes[MOE_MEM_PARAMS],
             old.bytes[MOE_MEM_ACTIVATIONS]);
  moe_optim_destroy(o);
  moe_gpt_destroy(m);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  if (moe_ctx_create(&g_ctx) != MOE_STATUS_OK) MPI_Abort(MPI_COMM_WORLD, 2);
  test_table_and_init();
  test_against_reference(0);
  test_against_reference(1);
  test_mp1_same_bits();
  test_refused();
  test_checkpoint_load();
  test_memory();
  moe_chain_state_free(&g_chains);
  moe_ctx_destroy(g_ctx);
  const int rc = tu_mpi_finish("test_gpt_tp");
  MPI_Finalize();
  return rc;
}
