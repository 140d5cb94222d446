// Private pieces shared by the trainer's files (src/train/).
#ifndef MOE_TRAIN_INTERNAL_H
#define MOE_TRAIN_INTERNAL_H

#include "moe/model.h"
#include "moe/parallel.h"
#include "moe/train.h"

// Bytes the backend's create allocates per block besides the moe_ep_layer.
size_t moe_train_ep_block_bytes_(void);

// A copy of *tc with its 'auto' choices planned from tc->profile (train_plan.c);
// *pred_ms the planner's forward + backward time of one MoE layer (NAN without
// a profile). INVALID_ARG for 'auto' without a profile.
moe_status moe_train_plan_for_run_(moe_ctx *ctx, MPI_Comm world, const moe_train_config *tc,
                                   moe_train_config *planned, double *pred_ms);

// Routing traces (routing_trace.c; moe_train_config.routing_trace).
typedef struct moe_routing_trace moe_routing_trace;
// Collective: rank 0 opens path (append: keep its lines through step
// keep_step, after checking its header is this run's; the header only when
// the file is new or empty) and writes the header; every rank allocates its
// counts.
moe_status moe_routing_trace_open_(moe_ctx *ctx, MPI_Comm world, const char *path, int append,
                                   long long keep_step, const moe_gpt_config *model,
                                   int tokens_per_rank, moe_routing_trace **out);
// Collective: one line per MoE block (impl[b] non-NULL) of the step just run.
moe_status moe_routing_trace_step_(moe_ctx *ctx, MPI_Comm world, moe_routing_trace *t, int step,
                                   void *const *impl, int n_blocks);
void moe_routing_trace_close_(moe_routing_trace *t);  // NULL is a no-op

#endif
