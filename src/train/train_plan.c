// The planner for training: resolves the MoE layers' 'auto' choices of a
// moe_train_config (all-to-all, schedule, chunks, compressor) from a
// calibrated profile, for the shape one MoE layer has on one rank (B / P
// sequences of S tokens, the model's MoE config). The CLI only parses and
// prints; library users get the same choice from moe_train_plan or by
// passing 'auto' to moe_train_run.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe/train.h"
#include "train/train_internal.h"

static int has_auto(const moe_parallel_config *pc) {
  return strcmp(pc->a2a, "auto") == 0 || strcmp(pc->schedule, "auto") == 0 ||
         strcmp(pc->compress, "auto") == 0 || pc->chunks == 0;
}

moe_status moe_train_plan(moe_ctx *ctx, MPI_Comm world, moe_train_config *tc, moe_plan *plan) {
  moe_status st = MOE_STATUS_OK;
  int P = 1;
  moe_plan local;
  if (!plan) plan = &local;
  MOE_FAIL_IF(ctx, !tc, MOE_STATUS_INVALID_ARG, "tc must not be NULL");
  MOE_FAIL_IF(ctx, !tc->profile, MOE_STATUS_INVALID_ARG,
              "'auto' needs a calibrated profile (moe calibrate on these ranks)");
  MOE_MPI_TRY(ctx, MPI_Comm_size(world, &P));
  const moe_profile *prof = tc->profile;
  const int ep = tc->par.ep_size > 0 ? tc->par.ep_size : P;
  MOE_TRY(moe_profile_check_ranks(ctx, prof, P, ep));
  MOE_FAIL_IF(ctx, tc->batch <= 0 || tc->batch % P != 0, MOE_STATUS_INVALID_ARG,
              "batch (%d) must be a positive multiple of the %d ranks", tc->batch, P);
  MOE_FAIL_IF(ctx, tc->model.moe_every == 0, MOE_STATUS_INVALID_ARG,
              "the model has no MoE layers (moe_every 0): nothing to plan");
  moe_plan_request q;
  memset(&q, 0, sizeof q);
  q.cfg = tc->model.moe;
  q.cfg.model_dim = tc->model.d_model;
  q.cfg.tokens = tc->batch / P * tc->model.seq_len;
  snprintf(q.a2a, sizeof q.a2a, "%s", tc->par.a2a);
  snprintf(q.schedule, sizeof q.schedule, "%s", tc->par.schedule);
  snprintf(q.compress, sizeof q.compress, "%s", tc->par.compress);
  q.chunks = tc->par.chunks;
  q.allow_lossy = tc->allow_lossy;
  q.compress_backward = tc->par.compress_backward;
  q.profile = prof;
  MOE_TRY(moe_plan_layer(ctx, &prof->cluster, &q, plan));
  snprintf(tc->par.a2a, sizeof tc->par.a2a, "%s", plan->best.a2a);
  snprintf(tc->par.schedule, sizeof tc->par.schedule, "%s", plan->best.schedule);
  snprintf(tc->par.compress, sizeof tc->par.compress, "%s", plan->best.compress);
  tc->par.chunks = plan->best.chunks;
done:
  return st;
}

// moe_train_run's entry: a copy of *tc with the auto choices planned (or an
// error when 'auto' has no profile); *pred_ms the planner's MoE pass time.
moe_status moe_train_plan_for_run_(moe_ctx *ctx, MPI_Comm world, const moe_train_config *tc,
                                   moe_train_config *planned, double *pred_ms) {
  moe_status st = MOE_STATUS_OK;
  *planned = *tc;
  *pred_ms = NAN;
  if (!tc->profile) {
    MOE_FAIL_IF(ctx, has_auto(&tc->par), MOE_STATUS_INVALID_ARG,
                "'auto' (a2a '%s', schedule '%s', chunks %d, compress '%s') needs a calibrated "
                "profile: --profile FILE from 'moe calibrate'",
                tc->par.a2a, tc->par.schedule, tc->par.chunks, tc->par.compress);
    MOE_FAIL_IF(ctx, tc->allow_lossy && strcmp(tc->par.compress, "auto") != 0,
                MOE_STATUS_INVALID_ARG, "allow_lossy only applies to compress 'auto'");
    goto done;
  }
  MOE_FAIL_IF(ctx, tc->allow_lossy && strcmp(tc->par.compress, "auto") != 0, MOE_STATUS_INVALID_ARG,
              "allow_lossy only applies to compress 'auto'");
  if (tc->model.moe_every == 0 && !has_auto(&tc->par)) goto done;  // nothing to predict
  if (tc->parm_on) goto done;  // the profile's "parm" terms serve --parm auto (trainer.c)
  moe_plan plan;
  MOE_TRY(moe_train_plan(ctx, world, planned, &plan));
  *pred_ms = plan.predicted.pass_ms[0] + plan.predicted.pass_ms[1];
done:
  return st;
}
