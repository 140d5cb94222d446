// Field-by-field comparison of cluster descriptions and profiles
// (include/moe/perf.h) for the cluster and profile harnesses: every number
// exactly (the writer prints them so that they read back bitwise).
#ifndef MOE_FUZZ_PERF_EQ_H
#define MOE_FUZZ_PERF_EQ_H

#include <string.h>

#include "fuzz_util.h"
#include "moe/perf.h"

#define FUZZ_EQ_D(a, b, what)                                                            \
  FUZZ_CHECK((a) == (b), "%s: %.17g became %.17g after write + read", what, (double)(a), \
             (double)(b))
#define FUZZ_EQ_I(a, b, what) \
  FUZZ_CHECK((a) == (b), "%s: %d became %d after write + read", what, (int)(a), (int)(b))
#define FUZZ_EQ_S(a, b, what) \
  FUZZ_CHECK(strcmp((a), (b)) == 0, "%s: '%s' became '%s' after write + read", what, (a), (b))

static inline void fuzz_link_check_equal(const moe_link_spec *a, const moe_link_spec *b,
                                         const char *what) {
  FUZZ_EQ_D(a->gbit_per_s, b->gbit_per_s, what);
  FUZZ_EQ_D(a->latency_us, b->latency_us, what);
  FUZZ_EQ_S(a->kind, b->kind, what);
}

static inline void fuzz_cluster_check_equal(const moe_cluster *a, const moe_cluster *b) {
  FUZZ_EQ_S(a->name, b->name, "cluster name");
  FUZZ_EQ_S(a->device, b->device, "cluster device");
  FUZZ_EQ_S(a->source, b->source, "cluster source");
  FUZZ_EQ_I(a->nodes, b->nodes, "cluster nodes");
  FUZZ_EQ_I(a->devices_per_node, b->devices_per_node, "cluster devices_per_node");
  FUZZ_EQ_D(a->gemm_tflops, b->gemm_tflops, "cluster gemm_tflops");
  fuzz_link_check_equal(&a->intra, &b->intra, "cluster intra");
  fuzz_link_check_equal(&a->inter, &b->inter, "cluster inter");
  FUZZ_EQ_I(a->nics_per_node, b->nics_per_node, "cluster nics_per_node");
  FUZZ_EQ_I(a->inter_uses_intra, b->inter_uses_intra, "cluster inter_uses_intra");
}

static inline void fuzz_fit_check_equal(const moe_linear_fit *a, const moe_linear_fit *b,
                                        const char *what) {
  FUZZ_EQ_D(a->alpha, b->alpha, what);
  FUZZ_EQ_D(a->beta, b->beta, what);
  FUZZ_EQ_D(a->gamma, b->gamma, what);
  FUZZ_EQ_D(a->r2, b->r2, what);
  FUZZ_EQ_D(a->rmse, b->rmse, what);
  FUZZ_EQ_I(a->n, b->n, what);
}

static inline void fuzz_profile_check_equal(const moe_profile *a, const moe_profile *b) {
  FUZZ_EQ_S(a->name, b->name, "profile name");
  fuzz_cluster_check_equal(&a->cluster, &b->cluster);
  fuzz_fit_check_equal(&a->gemm, &b->gemm, "gemm");
  FUZZ_EQ_I(a->have_step_fits, b->have_step_fits, "have_step_fits");
  fuzz_fit_check_equal(&a->expert_fwd, &b->expert_fwd, "expert_fwd");
  fuzz_fit_check_equal(&a->expert_bwd, &b->expert_bwd, "expert_bwd");
  fuzz_fit_check_equal(&a->outside, &b->outside, "outside");
  FUZZ_EQ_I(a->n_expert_points, b->n_expert_points, "n_expert_points");
  for (int i = 0; i < a->n_expert_points; i++) {
    for (int j = 0; j < 5; j++)
      FUZZ_EQ_D(a->expert_points[i][j], b->expert_points[i][j], "expert_points");
  }
  FUZZ_EQ_D(a->slow_compute, b->slow_compute, "overlap compute_slowdown");
  FUZZ_EQ_D(a->slow_comm, b->slow_comm, "overlap comm_slowdown");
  FUZZ_EQ_D(a->task_overhead, b->task_overhead, "task_overhead_s");
  FUZZ_EQ_D(a->small_collective, b->small_collective, "small_collective_s");
  FUZZ_EQ_D(a->copy_gbs, b->copy_gbs, "copy_gbs");
  FUZZ_EQ_I(a->n_a2a, b->n_a2a, "number of a2a models");
  for (int i = 0; i < a->n_a2a; i++) {
    FUZZ_EQ_S(a->a2a[i].name, b->a2a[i].name, "a2a name");
    fuzz_fit_check_equal(&a->a2a[i].fit, &b->a2a[i].fit, "a2a fit");
    FUZZ_EQ_I(a->n_a2a_points[i], b->n_a2a_points[i], "a2a_points count");
    for (int j = 0; j < a->n_a2a_points[i]; j++) {
      FUZZ_EQ_D(a->a2a_points[i][j][0], b->a2a_points[i][j][0], "a2a_points bytes");
      FUZZ_EQ_D(a->a2a_points[i][j][1], b->a2a_points[i][j][1], "a2a_points seconds");
    }
  }
  FUZZ_EQ_I(a->n_codec, b->n_codec, "number of codecs");
  for (int i = 0; i < a->n_codec; i++) {
    FUZZ_EQ_S(a->codec_c[i].name, b->codec_c[i].name, "codec name");
    FUZZ_EQ_S(a->codec_d[i].name, b->codec_d[i].name, "codec name");
    fuzz_fit_check_equal(&a->codec_c[i].fit, &b->codec_c[i].fit, "codec compress fit");
    fuzz_fit_check_equal(&a->codec_d[i].fit, &b->codec_d[i].fit, "codec decompress fit");
  }
  const moe_layer_corrections *x = &a->layer_fit, *y = &b->layer_fit;
  FUZZ_EQ_I(x->have, y->have, "layer_fit present");
  FUZZ_EQ_I(x->samples, y->samples, "layer_fit samples");
  FUZZ_EQ_D(x->compute_scale, y->compute_scale, "layer_fit compute_scale");
  FUZZ_EQ_D(x->compute_task_s, y->compute_task_s, "layer_fit compute_task_s");
  fuzz_fit_check_equal(&x->outside, &y->outside, "layer_fit outside");
  for (int i = 0; i < a->n_a2a; i++) {
    FUZZ_EQ_D(x->a2a_scale[i], y->a2a_scale[i], "layer_fit a2a scale");
    FUZZ_EQ_D(x->a2a_exchange_s[i], y->a2a_exchange_s[i], "layer_fit a2a exchange_s");
    for (int j = 0; j < 2; j++) {
      FUZZ_EQ_D(x->a2a_slow[i][j], y->a2a_slow[i][j], "layer_fit a2a slowdown");
      FUZZ_EQ_D(x->a2a_smart_slow[i][j], y->a2a_smart_slow[i][j], "layer_fit a2a smart slowdown");
    }
  }
}

#endif  // MOE_FUZZ_PERF_EQ_H
