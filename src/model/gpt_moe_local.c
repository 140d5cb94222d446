// The single-process MoE FFN backend of MoE-GPT: every expert local, a thin
// wrapper over moe_layer (home_first 0, home_count E).
//
// Not here: the expert-parallel backend (the trainer's, over MPI).
#include "moe/model.h"

static moe_status local_create(void *user, moe_ctx *ctx, const moe_layer_config *cfg, int block,
                               void **impl) {
  (void)user;
  (void)block;
  return moe_layer_create(ctx, cfg, (moe_layer **)impl);
}

static void local_destroy(void *impl) { moe_layer_destroy((moe_layer *)impl); }

static void local_init_params(void *impl, uint64_t seed) {
  moe_layer_init_params((moe_layer *)impl, seed);
}

static void local_zero_grad(void *impl) { moe_layer_zero_grad((moe_layer *)impl); }

static moe_gpt_moe_tensors local_tensors(void *impl) {
  moe_layer *layer = (moe_layer *)impl;
  const moe_layer_tensors t = moe_layer_get_tensors(layer);
  moe_gpt_moe_tensors out = {0,
                             moe_layer_get_config(layer)->num_experts,
                             t.wg,
                             t.w1,
                             t.b1,
                             t.w2,
                             t.b2,
                             t.dwg,
                             t.dw1,
                             t.db1,
                             t.dw2,
                             t.db2,
                             t.router_bias,
                             0,
                             1};
  return out;
}

static moe_status local_forward(void *impl, const float *x, int tokens, float *y,
                                moe_layer_stats *stats) {
  return moe_layer_forward((moe_layer *)impl, x, tokens, y, stats);
}

static moe_status local_backward(void *impl, const float *dy, float *dx) {
  return moe_layer_backward((moe_layer *)impl, dy, dx);
}

const moe_gpt_moe_ops moe_gpt_moe_local = {
    "local",         local_create,  local_destroy, local_init_params,
    local_zero_grad, local_tensors, local_forward, local_backward,
};
