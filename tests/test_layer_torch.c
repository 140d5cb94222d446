// The MoE layer against PyTorch: for every reference file tests/data/layer_*.bin
// (written by tests/gen_layer_ref.py in float64 autograd), libmoe must produce
// the same routing (expert and slot of every token choice, same dropped set,
// same counts), outputs, aux and z losses, and every gradient within a relative
// error of 1e-5 (max |diff| / max |ref| per tensor). Also checks that forward
// and backward allocate nothing and are bitwise deterministic.
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"
#include "refio.h"
#include "testutil.h"

#define REL_TOL 1e-5

static void copy_param(float *dst, const ref_file *rf, const char *name, size_t n) {
  const float *src = ref_f32(rf, name, n);
  TU_CHECK(src != NULL, "%s: tensor '%s' with %zu floats missing", rf->case_name, name, n);
  if (src) memcpy(dst, src, n * sizeof(float));
}

static void check_f32(const ref_file *rf, const char *name, const float *got, size_t n) {
  const float *ref = ref_f32(rf, name, n);
  char label[128];
  snprintf(label, sizeof label, "%s/%s", rf->case_name, name);
  TU_CHECK(ref != NULL, "%s: reference missing", label);
  if (ref) tu_rel_close(label, got, ref, n, REL_TOL);
}

static void run_case(const char *path) {
  ref_file rf;
  char err[256];
  if (ref_load(path, &rf, err, sizeof err) != 0) {
    TU_CHECK(0, "cannot load %s: %s", path, err);
    return;
  }
  const int T = rf.T, M = rf.M, H = rf.H, E = rf.E, K = rf.K;
  moe_ctx *ctx = NULL;
  moe_layer *layer = NULL;
  float *y = NULL, *dx = NULL, *y2 = NULL;
  moe_ctx_create(&ctx);
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  // Configure for more tokens than the batch: the layer must handle T < max.
  cfg.tokens = T + 3;
  cfg.model_dim = M;
  cfg.hidden_dim = H;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.capacity_factor = rf.capacity_factor;
  cfg.act = rf.act == 0 ? MOE_ACT_GELU : MOE_ACT_RELU;
  cfg.renormalize = rf.renormalize;
  cfg.aux_loss_coef = rf.aux_loss_coef;
  cfg.z_loss_coef = rf.z_loss_coef;
  if (moe_layer_create(ctx, &cfg, &layer) != MOE_STATUS_OK) {
    TU_CHECK(0, "%s: layer create failed: %s", rf.case_name, moe_ctx_error(ctx));
    goto done;
  }
  // Everything the layer needs is allocated by create: count from here on.
  const uint64_t allocs_after_create = moe_alloc_count();
  TU_CHECK(moe_layer_capacity(&cfg, T) == rf.capacity, "%s: capacity %d, reference %d",
           rf.case_name, moe_layer_capacity(&cfg, T), rf.capacity);
  moe_layer_tensors p = moe_layer_get_tensors(layer);
  copy_param(p.wg, &rf, "wg", (size_t)M * E);
  copy_param(p.w1, &rf, "w1", (size_t)E * M * H);
  copy_param(p.b1, &rf, "b1", (size_t)E * H);
  copy_param(p.w2, &rf, "w2", (size_t)E * H * M);
  copy_param(p.b2, &rf, "b2", (size_t)E * M);
  const float *x = ref_f32(&rf, "x", (size_t)T * M);
  const float *dy = ref_f32(&rf, "dy", (size_t)T * M);
  TU_CHECK(x && dy, "%s: x or dy missing", rf.case_name);
  if (!x || !dy) goto done;
  y = calloc((size_t)T * M, sizeof(float));
  y2 = calloc((size_t)T * M, sizeof(float));
  dx = calloc((size_t)T * M, sizeof(float));

  moe_layer_stats stats;
  moe_layer_zero_grad(layer);
  TU_CHECK(moe_layer_forward(layer, x, T, y, &stats) == MOE_STATUS_OK, "%s: forward: %s",
           rf.case_name, moe_ctx_error(ctx));
  TU_CHECK(moe_layer_backward(layer, dy, dx) == MOE_STATUS_OK, "%s: backward: %s", rf.case_name,
           moe_ctx_error(ctx));
  TU_CHECK(moe_alloc_count() == allocs_after_create,
           "%s: the first forward+backward allocated %llu times", rf.case_name,
           (unsigned long long)(moe_alloc_count() - allocs_after_create));

  // routing: identical experts, slots (dropped = -1), counts; weights within tolerance
  const moe_route *r = moe_layer_get_route(layer);
  const int32_t *ref_expert = ref_i32(&rf, "expert", (size_t)T * K);
  const int32_t *ref_slot = ref_i32(&rf, "slot", (size_t)T * K);
  const int32_t *ref_count = ref_i32(&rf, "count", (size_t)E);
  TU_CHECK(ref_expert && ref_slot && ref_count, "%s: routing reference missing", rf.case_name);
  if (ref_expert && ref_slot && ref_count) {
    char label[128];
    snprintf(label, sizeof label, "%s/expert", rf.case_name);
    tu_equal_i32(label, r->expert, ref_expert, (size_t)T * K);
    // The reference numbers slots in GShard order (which choices are kept);
    // libmoe numbers the kept choices of an expert in token order (route.c,
    // step 1b): the same kept set, renumbered.
    int32_t *want_slot = malloc((size_t)T * K * sizeof(int32_t));
    int32_t *next = calloc((size_t)E, sizeof(int32_t));
    TU_CHECK(want_slot && next, "out of memory");
    if (want_slot && next) {
      for (int i = 0; i < T * K; i++) want_slot[i] = ref_slot[i] < 0 ? -1 : next[ref_expert[i]]++;
      snprintf(label, sizeof label, "%s/slot", rf.case_name);
      tu_equal_i32(label, r->slot, want_slot, (size_t)T * K);
    }
    free(want_slot);
    free(next);
    snprintf(label, sizeof label, "%s/count", rf.case_name);
    tu_equal_i32(label, r->count, ref_count, (size_t)E);
    int ref_dropped = 0;
    for (int i = 0; i < T * K; i++) ref_dropped += ref_slot[i] < 0;
    TU_CHECK(stats.dropped == ref_dropped, "%s: dropped %d, reference %d", rf.case_name,
             stats.dropped, ref_dropped);
    TU_CHECK(stats.rows == T * K - ref_dropped, "%s: rows %d, reference %d", rf.case_name,
             stats.rows, T * K - ref_dropped);
    // An expert that kept no row gets exactly zero parameter gradients (the
    // tolerance below is relative to the largest entry and could hide garbage).
    for (int e = 0; e < E; e++) {
      if (ref_count[e] != 0) continue;
      int zero = 1;
      for (size_t i = 0; i < (size_t)M * H; i++) {
        zero &= p.dw1[(size_t)e * M * H + i] == 0.0f && p.dw2[(size_t)e * H * M + i] == 0.0f;
      }
      for (int i = 0; i < H; i++) zero &= p.db1[(size_t)e * H + i] == 0.0f;
      for (int i = 0; i < M; i++) zero &= p.db2[(size_t)e * M + i] == 0.0f;
      TU_CHECK(zero, "%s: expert %d received no rows but has non-zero gradients", rf.case_name, e);
    }
  }
  check_f32(&rf, "weight", r->weight, (size_t)T * K);
  check_f32(&rf, "y", y, (size_t)T * M);
  check_f32(&rf, "aux", &stats.aux_loss, 1);
  check_f32(&rf, "z", &stats.z_loss, 1);
  check_f32(&rf, "dx", dx, (size_t)T * M);
  check_f32(&rf, "dwg", p.dwg, (size_t)M * E);
  check_f32(&rf, "dw1", p.dw1, (size_t)E * M * H);
  check_f32(&rf, "db1", p.db1, (size_t)E * H);
  check_f32(&rf, "dw2", p.dw2, (size_t)E * H * M);
  check_f32(&rf, "db2", p.db2, (size_t)E * M);

  // Second pass: no allocation, bitwise-identical results, gradients accumulate.
  // Snapshot every gradient of the first pass.
  const size_t n_grads[6] = {(size_t)T * M, (size_t)M * E,     (size_t)E * M * H,
                             (size_t)E * H, (size_t)E * H * M, (size_t)E * M};
  float *const grads[6] = {dx, p.dwg, p.dw1, p.db1, p.dw2, p.db2};
  float *first[6];
  for (int i = 0; i < 6; i++) {
    first[i] = malloc(n_grads[i] * sizeof(float));
    memcpy(first[i], grads[i], n_grads[i] * sizeof(float));
  }
  float *dwg1 = first[1];
  const uint64_t allocs = moe_alloc_count();
  TU_CHECK(moe_layer_forward(layer, x, T, y2, NULL) == MOE_STATUS_OK, "second forward");
  TU_CHECK(moe_layer_backward(layer, dy, dx) == MOE_STATUS_OK, "second backward");
  TU_CHECK(moe_alloc_count() == allocs, "%s: forward+backward allocated %llu times", rf.case_name,
           (unsigned long long)(moe_alloc_count() - allocs));
  TU_CHECK(memcmp(y, y2, (size_t)T * M * sizeof(float)) == 0, "%s: forward not deterministic",
           rf.case_name);
  // Accumulate: dwg is twice the single-pass value. Not bitwise: the fixed-order
  // GEMM continues each element's sum from the value already there (the
  // k-continuation of moe_gemm_fixed), so the second pass rounds differently.
  float *dwg2 = malloc((size_t)M * E * sizeof(float));
  for (int i = 0; i < M * E; i++) dwg2[i] = dwg1[i] + dwg1[i];
  char acc_name[160];
  snprintf(acc_name, sizeof acc_name,
           "%s: backward must accumulate (dwg twice the single-pass value)", rf.case_name);
  tu_allclose(acc_name, p.dwg, dwg2, (size_t)M * E, 1e-6, 1e-5);
  free(dwg2);
  // Third pass from zeroed gradients: bitwise equal to the first pass.
  memset(dx, 0, (size_t)T * M * sizeof(float));
  moe_layer_zero_grad(layer);
  TU_CHECK(moe_layer_forward(layer, x, T, y2, NULL) == MOE_STATUS_OK &&
               moe_layer_backward(layer, dy, dx) == MOE_STATUS_OK,
           "third pass");
  for (int i = 0; i < 6; i++) {
    TU_CHECK(memcmp(first[i], grads[i], n_grads[i] * sizeof(float)) == 0,
             "%s: gradient %d differs between identical passes", rf.case_name, i);
    free(first[i]);
  }
done:
  free(y);
  free(y2);
  free(dx);
  moe_layer_destroy(layer);
  moe_ctx_destroy(ctx);
  ref_free(&rf);
}

int main(int argc, char **argv) {
  // The generator writes 8 cases; fewer means files went missing.
  if (tu_run_files(argc > 1 ? argv[1] : "tests/data", "layer_", ".bin", 8, run_case) < 0) {
    return 1;
  }
  return tu_finish("test_layer_torch");
}
