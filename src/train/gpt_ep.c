// The expert-parallel MoE FFN backend of MoE-GPT: moe_gpt_moe_ops over
// moe_ep_layer (src/parallel/), so the model's MoE blocks run on the task
// engine with the schedule, chunks, all-to-all and compression of the
// parallel config. Every call is collective over the world; the model makes
// them in the same order on every rank. It also remembers when each pass
// started, so the trainer can place the passes of a step in one trace.
#include <string.h>

#include "moe/core.h"
#include "train/train_internal.h"

typedef struct {
  moe_ep_layer *layer;
  moe_train_ep_user *user;
  int block;
  uint64_t fwd_start_ns, bwd_start_ns;
} ep_ffn;

size_t moe_train_ep_block_bytes_(void) { return moe_align64(sizeof(ep_ffn)); }

static moe_status ep_create(void *user, moe_ctx *ctx, const moe_layer_config *cfg, int block,
                            void **impl) {
  moe_status st = MOE_STATUS_OK;
  moe_train_ep_user *u = user;
  ep_ffn *f = moe_calloc(1, sizeof *f);
  *impl = NULL;
  // Collective: every rank must take part even when its allocation failed.
  moe_status mine = f ? MOE_STATUS_OK
                      : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                     "MoE block %d: out of memory", block);
  MOE_TRY(moe_comm_agree(ctx, u->world, mine, "MoE block allocation"));
  MOE_TRY(moe_ep_layer_create(ctx, u->world, cfg, &u->par, &f->layer));
  f->user = u;
  f->block = block;
  u->impl[block] = f;
  *impl = f;
  f = NULL;
done:
  moe_free(f);
  return st;
}

static void ep_destroy(void *impl) {
  ep_ffn *f = impl;
  if (!f) return;
  moe_ep_layer_destroy(f->layer);
  moe_free(f);
}

static void ep_init_params(void *impl, uint64_t seed) {
  moe_ep_layer_init_params(((ep_ffn *)impl)->layer, seed);
}

static void ep_zero_grad(void *impl) { moe_ep_layer_zero_grad(((ep_ffn *)impl)->layer); }

static moe_gpt_moe_tensors ep_tensors(void *impl) {
  const moe_ep_tensors t = moe_ep_layer_get_tensors(((ep_ffn *)impl)->layer);
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
                           .router_bias = t.router_bias};
  return o;
}

static moe_status ep_forward(void *impl, const float *x, int tokens, float *y,
                             moe_layer_stats *stats) {
  ep_ffn *f = impl;
  if (f->user->pre_forward) {
    const moe_status st = f->user->pre_forward(f->user->pre_forward_arg, f->block, tokens);
    if (st != MOE_STATUS_OK) return st;
  }
  f->fwd_start_ns = moe_time_ns();
  return moe_ep_layer_forward(f->layer, x, tokens, y, stats);
}

static moe_status ep_backward(void *impl, const float *dy, float *dx) {
  ep_ffn *f = impl;
  f->bwd_start_ns = moe_time_ns();
  return moe_ep_layer_backward(f->layer, dy, dx);
}

const moe_gpt_moe_ops moe_train_ep_ops = {
    .name = "expert-parallel",
    .create = ep_create,
    .destroy = ep_destroy,
    .init_params = ep_init_params,
    .zero_grad = ep_zero_grad,
    .tensors = ep_tensors,
    .forward = ep_forward,
    .backward = ep_backward,
};

moe_ep_layer *moe_train_ep_layer(void *impl, uint64_t *fwd_start_ns, uint64_t *bwd_start_ns) {
  ep_ffn *f = impl;
  if (fwd_start_ns) *fwd_start_ns = f->fwd_start_ns;
  if (bwd_start_ns) *bwd_start_ns = f->bwd_start_ns;
  return f->layer;
}
