// Private pieces shared by the trainer's files (src/train/).
#ifndef MOE_TRAIN_INTERNAL_H
#define MOE_TRAIN_INTERNAL_H

#include "moe/model.h"
#include "moe/parallel.h"
#include "moe/train.h"

// The `user` of moe_train_ep_ops: the world, the parallel config, and each
// block's backend instance (NULL for dense blocks), filled by create.
typedef struct {
  MPI_Comm world;
  moe_parallel_config par;
  void *impl[MOE_GPT_MAX_LAYERS];
} moe_train_ep_user;

// MoE-GPT's expert-parallel FFN backend (gpt_ep.c).
extern const moe_gpt_moe_ops moe_train_ep_ops;
// Bytes the backend's create allocates per block besides the moe_ep_layer.
size_t moe_train_ep_block_bytes_(void);
// The layer of a backend instance and when its last forward / backward began.
moe_ep_layer *moe_train_ep_layer(void *impl, uint64_t *fwd_start_ns, uint64_t *bwd_start_ns);

// A copy of *tc with its 'auto' choices planned from tc->profile (train_plan.c);
// *pred_ms the planner's forward + backward time of one MoE layer (NAN without
// a profile). INVALID_ARG for 'auto' without a profile.
moe_status moe_train_plan_for_run_(moe_ctx *ctx, MPI_Comm world, const moe_train_config *tc,
                                   moe_train_config *planned, double *pred_ms);

#endif
