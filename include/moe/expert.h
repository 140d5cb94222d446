// Expert implementations (ScheMoE's AbsExpert): how one expert computes over
// the rows routed to it, selected by name (moe_layer_config.expert).
//
// What: every registered kind computes the same function, the FFN expert of
// docs/moe-layer.md, y = act(x w1 + b1) w2 + b2 with parameters w1 (M, H), b1 (H),
// w2 (H, M), b2 (M), and its backward; kinds differ in how (BLAS GEMMs, naive
// loops, later GPU kernels). The layers own the parameters and call the kind
// once per expert (and per chunk in a chunked pass).
// Registered: "ffn" (CBLAS GEMMs, the default) and "ffn-ref" (naive loops with
// double accumulation: slow, the reference a new kind is tested against).
// Not: experts with other parameter sets (gated FFNs, ...): the layers'
// parameter tables, initialisation and replicas assume the FFN set.
// A new kind is one file src/layer/expert_<name>.c plus one line in
// src/layer/expert_registry.c (docs/extending.md).
#ifndef MOE_EXPERT_H
#define MOE_EXPERT_H

#include "moe/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const float *w1, *b1, *w2, *b2;  // (M, H), (H), (H, M), (M)
} moe_expert_params;

typedef struct {
  float *dw1, *db1, *dw2, *db2;  // same shapes; accumulated (+=)
} moe_expert_grads;

typedef struct {
  const char *name;    // "ffn", "ffn-ref"
  const char *source;  // one line: what it is
  // x (n, M) -> pre, h (n, H) (kept for the backward) -> y (n, M). n >= 0.
  // Adds its GEMM/other times and FLOPs to tm.
  void (*forward)(const moe_layer_config *cfg, const moe_expert_params *p, const float *x, int n,
                  float *pre, float *h, float *y, moe_layer_timing *tm);
  // dyx (n, M) holds dY on entry and dX on return; gradients +=; dh and dpre
  // (n, H) are scratch. x, pre, h are the forward's.
  void (*backward)(const moe_layer_config *cfg, const moe_expert_params *p,
                   const moe_expert_grads *g, const float *x, const float *pre, const float *h,
                   float *dyx, int n, float *dh, float *dpre, moe_layer_timing *tm);
} moe_expert_kind;

// Registered kinds, in a fixed order: i in [0, count); NULL outside.
int moe_expert_kind_count(void);
const moe_expert_kind *moe_expert_kind_get(int i);
// By name; INVALID_ARG naming the valid names otherwise.
moe_status moe_expert_kind_find(moe_ctx *ctx, const char *name, const moe_expert_kind **out);
// "ffn, ffn-ref".
const char *moe_expert_kind_names(void);

#ifdef __cplusplus
}
#endif
#endif  // MOE_EXPERT_H
