// The Parm MoE FFN backend of MoE-GPT: moe_gpt_moe_ops over moe_parm_layer
// (src/parallel/parm_layer.c), so the model's MoE blocks run with Parm's
// layout and schedule (docs/parm.md). The model's tensor parallelism gives
// every MP rank the same MoE input, as the layer requires. Every call is
// collective over the world; the model makes them in the same order on every
// rank.
#include <string.h>

#include "moe/core.h"
#include "train/train_internal.h"

static moe_status parm_create(void *user, moe_ctx *ctx, const moe_layer_config *cfg, int block,
                              void **impl) {
  moe_status st = MOE_STATUS_OK;
  moe_train_parm_user *u = user;
  moe_parm_layer *L = NULL;
  *impl = NULL;
  MOE_TRY(moe_parm_layer_create(ctx, u->world, cfg, &u->parm, &L));
  u->impl[block] = L;  // block: the model's index of this MoE block
  *impl = L;
done:
  return st;
}

static void parm_destroy(void *impl) { moe_parm_layer_destroy(impl); }

static void parm_init_params(void *impl, uint64_t seed) { moe_parm_layer_init_params(impl, seed); }

static void parm_zero_grad(void *impl) { moe_parm_layer_zero_grad(impl); }

static moe_gpt_moe_tensors parm_tensors(void *impl) {
  const moe_parm_tensors t = moe_parm_layer_get_tensors(impl);
  const int shards = t.hs > 0 ? moe_parm_layer_shards(impl) : 1;
  moe_gpt_moe_tensors o = {.home_first = t.home_first,
                           .home_count = t.home_count,
                           .wg = t.wg,
                           .w1 = t.w1,
                           .b1 = t.b1,
                           .w2 = t.w2,
                           .b2 = t.b2,
                           .dwg = t.dwg,
                           .dw1 = t.dw1,
                           .db1 = t.db1,
                           .dw2 = t.dw2,
                           .db2 = t.db2,
                           .router_bias = t.router_bias,
                           .shard = t.shard,
                           .shards = shards};
  return o;
}

static moe_status parm_forward(void *impl, const float *x, int tokens, float *y,
                               moe_layer_stats *stats) {
  return moe_parm_layer_forward(impl, x, tokens, y, stats);
}

// The model's contract is dx +=; the layer overwrites: through a scratch row
// buffer would cost a copy of every token, so the layer's dx goes to the
// model's scratch and is added here.
static moe_status parm_backward(void *impl, const float *dy, float *dx) {
  return moe_parm_layer_backward_add(impl, dy, dx);
}

const moe_gpt_moe_ops moe_train_parm_ops = {
    .name = "parm",
    .create = parm_create,
    .destroy = parm_destroy,
    .init_params = parm_init_params,
    .zero_grad = parm_zero_grad,
    .tensors = parm_tensors,
    .forward = parm_forward,
    .backward = parm_backward,
};

moe_parm_layer *moe_train_parm_layer(void *impl) { return impl; }
