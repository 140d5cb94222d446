// MoE-GPT against PyTorch: for every reference file tests/data/gpt_*.bin
// (written by tests/gen_gpt_ref.py in float64 autograd from docs/model.md), the
// model loaded with the file's parameters must give the same logits, loss, aux
// and z losses and every parameter gradient within a relative error of 1e-4
// (max |diff| / max |ref| per tensor), the same number of dropped choices, and
// the same cross-entropy over 10 AdamW steps (warm-up, cosine decay, clipping,
// weight decay on the matrices) within 1e-4 relative. Also checks that the
// steps after the first allocate nothing.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/model.h"
#include "refio.h"
#include "testutil.h"

#define REL_TOL 1e-4
#define N_CASES 2  // the generator writes this many; fewer means files went missing

static double g_worst;  // largest relative error of a case (printed)

static void check_f32(const ref_file *rf, const char *name, const float *got, size_t n) {
  const float *ref = ref_f32(rf, name, n);
  char label[160];
  snprintf(label, sizeof label, "%s/%s", rf->case_name, name);
  TU_CHECK(ref != NULL, "%s: reference with %zu floats missing", label, n);
  if (!ref) return;
  tu_rel_close(label, got, ref, n, REL_TOL);
  g_worst = fmax(g_worst, tu_max_rel_err(got, ref, n));
}

static void run_case(const char *path) {
  ref_file rf;
  char err[256];
  if (ref_load(path, &rf, err, sizeof err) != 0) {
    TU_CHECK(0, "cannot load %s: %s", path, err);
    return;
  }
  const char *cn = rf.case_name;
  g_worst = 0.0;
  moe_ctx *ctx = NULL;
  moe_gpt *m = NULL;
  moe_optim *opt = NULL;
  moe_ctx_create(&ctx);
  const int32_t *ci = ref_i32(&rf, "config", 8);
  const float *cf = ref_f32(&rf, "config_f", 1);
  const float *oc_f = ref_f32(&rf, "optim", 10);
  TU_CHECK(ci && cf && oc_f, "%s: config, config_f or optim missing", cn);
  if (!ci || !cf || !oc_f) goto done;
  const int V = ci[0], S = ci[1], B = ci[7];
  TU_CHECK(rf.T == B * S, "%s: header T %d != B %d x S %d", cn, rf.T, B, S);

  moe_gpt_config c;
  moe_gpt_config_default(&c);
  c.vocab_size = V;
  c.seq_len = S;
  c.n_layer = ci[2];
  c.n_head = ci[3];
  c.d_model = ci[4];
  c.moe_every = ci[5];
  c.dense_hidden = ci[6];
  c.ln_eps = cf[0];
  c.moe.num_experts = rf.E;
  c.moe.top_k = rf.K;
  c.moe.hidden_dim = rf.H;
  c.moe.capacity_factor = rf.capacity_factor;  // 0 = dropless
  c.moe.act = rf.act == 0 ? MOE_ACT_GELU : MOE_ACT_RELU;
  c.moe.renormalize = rf.renormalize;
  c.moe.aux_loss_coef = rf.aux_loss_coef;
  c.moe.z_loss_coef = rf.z_loss_coef;
  TU_CHECK(c.d_model == rf.M, "%s: d_model %d != header M %d", cn, c.d_model, rf.M);
  // One more sequence than the batch: the model must handle B < max_batch.
  if (moe_gpt_create(ctx, &c, B + 1, NULL, NULL, &m) != MOE_STATUS_OK) {
    TU_CHECK(0, "%s: create: %s", cn, moe_ctx_error(ctx));
    goto done;
  }
  // every parameter by name; the file holds exactly the model's tensors
  const int np = moe_gpt_num_params(m);
  int n_file_params = 0;
  for (int i = 0; i < rf.n_tensors; i++) {
    n_file_params += strncmp(rf.tensors[i].name, "grad.", 5) == 0;
  }
  TU_CHECK(n_file_params == np, "%s: file has %d gradients, model %d tensors", cn, n_file_params,
           np);
  for (int i = 0; i < np; i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    const ref_tensor *t = ref_get(&rf, p.name);
    int shape_ok = t && t->ndim == p.ndim;
    for (int d = 0; shape_ok && d < p.ndim; d++) shape_ok = t->dims[d] == p.dims[d];
    TU_CHECK(shape_ok, "%s: parameter '%s' missing or of another shape", cn, p.name);
    const float *src = ref_f32(&rf, p.name, p.numel);
    if (src) memcpy(p.data, src, p.numel * sizeof(float));
  }
  const int32_t *tok = ref_i32(&rf, "tokens", (size_t)B * S);
  const int32_t *tgt = ref_i32(&rf, "targets", (size_t)B * S);
  TU_CHECK(tok && tgt, "%s: tokens or targets missing", cn);
  if (!tok || !tgt) goto done;

  // step 1: forward and backward against the reference
  moe_gpt_loss l;
  moe_gpt_zero_grad(m);
  if (moe_gpt_forward(m, tok, tgt, B, S, 0.0, &l) != MOE_STATUS_OK ||
      moe_gpt_backward(m) != MOE_STATUS_OK) {
    TU_CHECK(0, "%s: forward/backward: %s", cn, moe_ctx_error(ctx));
    goto done;
  }
  check_f32(&rf, "logits", moe_gpt_logits(m), (size_t)B * S * V);
  const float loss = (float)l.loss, aux = (float)l.aux, z = (float)l.z;
  check_f32(&rf, "loss", &loss, 1);
  check_f32(&rf, "aux", &aux, 1);
  if (rf.z_loss_coef > 0.0f) check_f32(&rf, "z", &z, 1);
  const int32_t *dropped = ref_i32(&rf, "dropped", 1);
  TU_CHECK(dropped && *dropped == l.dropped, "%s: dropped %d, reference %d", cn, l.dropped,
           dropped ? *dropped : -1);
  for (int i = 0; i < np; i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    char name[72];
    snprintf(name, sizeof name, "grad.%s", p.name);
    check_f32(&rf, name, p.grad, p.numel);
  }

  // steps 1..10: the reference's optimizer and schedule
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  oc.lr = oc_f[0];
  oc.min_lr = oc_f[1];
  oc.warmup_steps = (int)oc_f[2];
  oc.total_steps = (int)oc_f[3];
  oc.beta1 = oc_f[4];
  oc.beta2 = oc_f[5];
  oc.eps = oc_f[6];
  oc.weight_decay = oc_f[7];
  oc.grad_clip = oc_f[8];
  const int steps = (int)oc_f[9];
  if (moe_optim_create(ctx, m, &oc, &opt) != MOE_STATUS_OK) {
    TU_CHECK(0, "%s: optim create: %s", cn, moe_ctx_error(ctx));
    goto done;
  }
  const float *ref_losses = ref_f32(&rf, "losses", (size_t)steps);
  TU_CHECK(ref_losses != NULL, "%s: losses missing", cn);
  float losses[64];
  TU_CHECK(steps >= 1 && steps <= 64, "%s: %d steps", cn, steps);
  if (!ref_losses || steps < 1 || steps > 64) goto done;
  uint64_t allocs = 0;
  for (int t = 1; t <= steps; t++) {
    if (t > 1) {
      moe_gpt_zero_grad(m);
      if (moe_gpt_forward(m, tok, tgt, B, S, 0.0, &l) != MOE_STATUS_OK ||
          moe_gpt_backward(m) != MOE_STATUS_OK) {
        TU_CHECK(0, "%s: step %d: %s", cn, t, moe_ctx_error(ctx));
        goto done;
      }
    }
    losses[t - 1] = (float)l.loss;
    double sq[3];
    moe_optim_grad_sq(m, sq);
    moe_optim_step(opt, m, moe_optim_clip_scale(&oc, sqrt(sq[0] + sq[1] + sq[2])));
    if (t == 1) allocs = moe_alloc_count();
  }
  TU_CHECK(moe_alloc_count() == allocs, "%s: steps 2..%d allocated %llu times", cn, steps,
           (unsigned long long)(moe_alloc_count() - allocs));
  char label[160];
  snprintf(label, sizeof label, "%s/losses of %d steps", cn, steps);
  tu_allclose(label, losses, ref_losses, (size_t)steps, 0.0, REL_TOL);
  double worst_loss = 0.0;
  for (int t = 0; t < steps; t++) {
    worst_loss = fmax(worst_loss, fabs(losses[t] - ref_losses[t]) / fabs(ref_losses[t]));
  }
  printf("%s: logits, loss, aux, z and %d gradients: worst relative error %.2e; %d losses", cn, np,
         g_worst, steps);
  for (int t = 0; t < steps; t++) printf(" %.5f", (double)losses[t]);
  printf(": worst relative error %.2e\n", worst_loss);
done:
  moe_optim_destroy(opt);
  moe_gpt_destroy(m);
  moe_ctx_destroy(ctx);
  ref_free(&rf);
}

int main(int argc, char **argv) {
  if (tu_run_files(argc > 1 ? argv[1] : "tests/data", "gpt_", ".bin", N_CASES, run_case) < 0) {
    return 1;
  }
  return tu_finish("test_gpt_torch");
}
