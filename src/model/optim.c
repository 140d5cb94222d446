// MoE-GPT optimizer: AdamW (torch.optim.AdamW semantics, moe_adamw_update) over
// every tensor of the model's parameter table, a linear warm-up + cosine
// learning-rate schedule and global-norm gradient clipping.
//
// The optimizer state (m, v) is one arena, one (m, v) pair per tensor in
// moe_gpt_get_param order, each as large as the part of the tensor held here
// (home experts only for expert tensors), so a distributed trainer steps
// exactly the parameters it owns. Not here: reductions over ranks (the
// trainer sums the gradients and the squared norms before calling the step).
#include <math.h>
#include <string.h>

#include "moe/model.h"

struct moe_optim {
  moe_optim_config cfg;
  int n;           // tensors
  size_t *numel;   // (n)
  float **m, **v;  // (n) pointers into the arena
  moe_arena arena;
  int steps;
};

void moe_optim_config_default(moe_optim_config *oc) {
  memset(oc, 0, sizeof *oc);
  oc->lr = 3e-3f;
  oc->min_lr = 3e-4f;
  oc->warmup_steps = 100;
  oc->total_steps = 1000;
  oc->beta1 = 0.9f;
  oc->beta2 = 0.95f;
  oc->eps = 1e-8f;
  oc->weight_decay = 0.1f;
  oc->grad_clip = 1.0f;
}

moe_status moe_optim_config_validate(moe_ctx *ctx, const moe_optim_config *oc) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !oc, MOE_STATUS_INVALID_ARG, "optimizer config must not be NULL");
  MOE_FAIL_IF(ctx, !(oc->lr >= 0.0f) || !isfinite(oc->lr), MOE_STATUS_INVALID_ARG,
              "lr (%g) must be finite and >= 0", (double)oc->lr);
  MOE_FAIL_IF(ctx, !(oc->min_lr >= 0.0f) || !(oc->min_lr <= oc->lr), MOE_STATUS_INVALID_ARG,
              "min_lr (%g) must be in [0, lr = %g]", (double)oc->min_lr, (double)oc->lr);
  MOE_FAIL_IF(ctx, oc->warmup_steps < 0, MOE_STATUS_INVALID_ARG, "warmup_steps (%d) must be >= 0",
              oc->warmup_steps);
  MOE_FAIL_IF(ctx, oc->total_steps < 1, MOE_STATUS_INVALID_ARG, "total_steps (%d) must be >= 1",
              oc->total_steps);
  MOE_FAIL_IF(ctx, !(oc->beta1 >= 0.0f && oc->beta1 < 1.0f), MOE_STATUS_INVALID_ARG,
              "beta1 (%g) must be in [0, 1)", (double)oc->beta1);
  MOE_FAIL_IF(ctx, !(oc->beta2 >= 0.0f && oc->beta2 < 1.0f), MOE_STATUS_INVALID_ARG,
              "beta2 (%g) must be in [0, 1)", (double)oc->beta2);
  MOE_FAIL_IF(ctx, !(oc->eps > 0.0f) || !isfinite(oc->eps), MOE_STATUS_INVALID_ARG,
              "eps (%g) must be finite and > 0", (double)oc->eps);
  MOE_FAIL_IF(ctx, !(oc->weight_decay >= 0.0f) || !isfinite(oc->weight_decay),
              MOE_STATUS_INVALID_ARG, "weight_decay (%g) must be finite and >= 0",
              (double)oc->weight_decay);
  MOE_FAIL_IF(ctx, !isfinite(oc->grad_clip), MOE_STATUS_INVALID_ARG,
              "grad_clip (%g) must be finite (<= 0: no clipping)", (double)oc->grad_clip);
done:
  return st;
}

float moe_optim_lr(const moe_optim_config *oc, int step) {
  const double lr = oc->lr, min_lr = oc->min_lr;
  const int w = oc->warmup_steps, total = oc->total_steps;
  if (step < 1) step = 1;
  if (w > 0 && step <= w) return (float)(lr * step / w);
  if (step >= total) return (float)min_lr;
  const double pi = 3.14159265358979323846;
  const double frac = (double)(step - w) / (double)(total - w);
  return (float)(min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(pi * frac)));
}

const moe_optim_config *moe_optim_get_config(const moe_optim *opt) { return &opt->cfg; }

float moe_optim_clip_scale(const moe_optim_config *oc, double grad_norm) {
  if (!(oc->grad_clip > 0.0f) || !(grad_norm > oc->grad_clip)) return 1.0f;
  return (float)(oc->grad_clip / grad_norm);
}

double moe_optim_memory_bytes(int n, const size_t *numel) {
  // the allocations of moe_optim_create, below: the object, three tables, the arena
  double floats = 0;
  for (int i = 0; i < n; i++) floats += 2.0 * (double)((numel[i] + 15) & ~(size_t)15);
  const size_t table = moe_align64((size_t)n * sizeof(size_t));
  return (double)(moe_align64(sizeof(moe_optim)) + 3 * table) +
         (double)moe_align64((size_t)(floats * sizeof(float)));
}

moe_status moe_optim_create(moe_ctx *ctx, moe_gpt *model, const moe_optim_config *oc,
                            moe_optim **out) {
  moe_status st = MOE_STATUS_OK;
  moe_optim *o = NULL;
  MOE_FAIL_IF(ctx, !out || !model, MOE_STATUS_INVALID_ARG, "model and out must not be NULL");
  *out = NULL;
  MOE_TRY(moe_optim_config_validate(ctx, oc));
  o = moe_calloc(1, sizeof *o);
  MOE_FAIL_IF(ctx, !o, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate the optimizer");
  o->cfg = *oc;
  o->n = moe_gpt_num_params(model);
  o->numel = moe_calloc((size_t)o->n, sizeof *o->numel);
  o->m = moe_calloc((size_t)o->n, sizeof *o->m);
  o->v = moe_calloc((size_t)o->n, sizeof *o->v);
  MOE_FAIL_IF(ctx, !o->numel || !o->m || !o->v, MOE_STATUS_OUT_OF_MEMORY,
              "cannot allocate the optimizer table");
  size_t floats = 0;
  for (int i = 0; i < o->n; i++) {
    o->numel[i] = moe_gpt_get_param(model, i).numel;
    floats += 2 * ((o->numel[i] + 15) & ~(size_t)15);
  }
  MOE_TRY(moe_arena_init(ctx, &o->arena, floats * sizeof(float)));
  for (int i = 0; i < o->n; i++) {
    const size_t bytes = ((o->numel[i] + 15) & ~(size_t)15) * sizeof(float);
    o->m[i] = bytes ? moe_arena_alloc(&o->arena, bytes) : NULL;
    o->v[i] = bytes ? moe_arena_alloc(&o->arena, bytes) : NULL;
    MOE_FAIL_IF(ctx, bytes && (!o->m[i] || !o->v[i]), MOE_STATUS_INTERNAL,
                "optimizer arena too small at tensor %d", i);
  }
  *out = o;
  o = NULL;
done:
  moe_optim_destroy(o);
  return st;
}

void moe_optim_destroy(moe_optim *o) {
  if (!o) return;
  moe_arena_free(&o->arena);
  moe_free(o->numel);
  moe_free(o->m);
  moe_free(o->v);
  moe_free(o);
}

float *moe_optim_m(moe_optim *o, int i) { return i >= 0 && i < o->n ? o->m[i] : NULL; }
float *moe_optim_v(moe_optim *o, int i) { return i >= 0 && i < o->n ? o->v[i] : NULL; }
int moe_optim_step_count(const moe_optim *o) { return o->steps; }
void moe_optim_set_step_count(moe_optim *o, int steps) { o->steps = steps < 0 ? 0 : steps; }

void moe_optim_grad_sq(moe_gpt *model, double sq[3]) {
  sq[0] = sq[1] = sq[2] = 0.0;
  const int n = moe_gpt_num_params(model);
  for (int i = 0; i < n; i++) {
    const moe_gpt_param p = moe_gpt_get_param(model, i);
    double s = 0.0;
    for (size_t j = 0; j < p.numel; j++) s += (double)p.grad[j] * (double)p.grad[j];
    sq[p.kind] += s;
  }
}

float moe_optim_step(moe_optim *o, moe_gpt *model, float clip_scale) {
  const int t = ++o->steps;
  const float lr = moe_optim_lr(&o->cfg, t);
  const int n = moe_gpt_num_params(model) < o->n ? moe_gpt_num_params(model) : o->n;
  for (int i = 0; i < n; i++) {
    const moe_gpt_param p = moe_gpt_get_param(model, i);
    const size_t numel = p.numel < o->numel[i] ? p.numel : o->numel[i];
    if (clip_scale != 1.0f) {
      for (size_t j = 0; j < numel; j++) p.grad[j] *= clip_scale;
    }
    const moe_adamw_config ac = {lr, o->cfg.beta1, o->cfg.beta2, o->cfg.eps,
                                 p.decay ? o->cfg.weight_decay : 0.0f};
    moe_adamw_update(p.data, o->m[i], o->v[i], p.grad, numel, &ac, t);
  }
  return lr;
}
