// bf16 mixed precision at the layer level (moe_precision_use): the same layer,
// parameters and input run in fp32 and in bf16.
//   - routing is the same (the router's GEMMs stay fp32): every token's experts
//     and gate weights bitwise equal;
//   - every output and gradient is within bf16 tolerance of the fp32 run:
//     relative L2 error ||bf16 - fp32|| / ||fp32|| at most 1e-2 per tensor
//     (bf16 keeps 8 significant bits, unit roundoff 2^-9 = 2e-3; a value goes
//     through a few roundings: input, weights, hidden activation), measured and
//     printed per element class;
//   - and bf16 did run: the errors are not zero.
// On a CPU without AVX512_BF16 the bf16 GEMM is the portable emulation, with
// the same bits, so this test runs everywhere.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe/kernels.h"
#include "moe/layer.h"
#include "testutil.h"

static double rel_l2(const float *got, const float *want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = (double)got[i] - (double)want[i];
    num += d * d;
    den += (double)want[i] * want[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

typedef struct {
  float *y, *dx, *dwg, *dw1, *db1, *dw2, *db2;
  int32_t *expert;
  float *weight;
} run_out;

static void run(moe_ctx *ctx, const moe_layer_config *cfg, const float *x, const float *dy,
                moe_precision p, run_out *o) {
  const int T = cfg->tokens, M = cfg->model_dim, H = cfg->hidden_dim, E = cfg->num_experts;
  const int K = cfg->top_k;
  moe_layer *L = NULL;
  TU_CHECK(moe_layer_create(ctx, cfg, &L) == MOE_STATUS_OK, "create: %s", moe_ctx_error(ctx));
  moe_layer_init_params(L, 77);
  moe_precision_use(p);
  o->y = tu_fbuf((size_t)T * M);
  o->dx = tu_fbuf((size_t)T * M);
  moe_layer_stats st;
  TU_CHECK(moe_layer_forward(L, x, T, o->y, &st) == MOE_STATUS_OK, "forward: %s",
           moe_ctx_error(ctx));
  moe_layer_zero_grad(L);
  TU_CHECK(moe_layer_backward(L, dy, o->dx) == MOE_STATUS_OK, "backward: %s", moe_ctx_error(ctx));
  moe_precision_use(MOE_PRECISION_FP32);
  const moe_layer_tensors t = moe_layer_get_tensors(L);
  o->dwg = tu_copy_of(t.dwg, (size_t)M * E);
  o->dw1 = tu_copy_of(t.dw1, (size_t)E * M * H);
  o->db1 = tu_copy_of(t.db1, (size_t)E * H);
  o->dw2 = tu_copy_of(t.dw2, (size_t)E * H * M);
  o->db2 = tu_copy_of(t.db2, (size_t)E * M);
  const moe_route *r = moe_layer_get_route(L);
  o->expert = tu_ibuf((size_t)T * K);
  memcpy(o->expert, r->expert, (size_t)T * K * sizeof(int32_t));
  o->weight = tu_copy_of(r->weight, (size_t)T * K);
  moe_layer_destroy(L);
}

int main(void) {
  moe_ctx *ctx = NULL;
  TU_CHECK(moe_ctx_create(&ctx) == MOE_STATUS_OK, "ctx");
  printf("bf16 GEMM: %s kernel\n", moe_gemm_bf16_isa());
  static const int shapes[][5] = {{512, 256, 512, 8, 2}, {256, 128, 384, 4, 1}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    moe_layer_config cfg;
    moe_layer_config_default(&cfg);
    cfg.tokens = shapes[s][0];
    cfg.model_dim = shapes[s][1];
    cfg.hidden_dim = shapes[s][2];
    cfg.num_experts = shapes[s][3];
    cfg.top_k = shapes[s][4];
    cfg.capacity_factor = s == 0 ? -1.0 : 1.0;  // dropless, then a capacity
    const int T = cfg.tokens, M = cfg.model_dim, H = cfg.hidden_dim, E = cfg.num_experts;
    const float *x = tu_filled((size_t)T * M, 100 + s, -1.0f, 1.0f);
    const float *dy = tu_filled((size_t)T * M, 200 + s, -1.0f, 1.0f);
    run_out f, b;
    run(ctx, &cfg, x, dy, MOE_PRECISION_FP32, &f);
    run(ctx, &cfg, x, dy, MOE_PRECISION_BF16, &b);
    TU_CHECK(memcmp(f.expert, b.expert, (size_t)T * cfg.top_k * sizeof(int32_t)) == 0 &&
                 memcmp(f.weight, b.weight, (size_t)T * cfg.top_k * sizeof(float)) == 0,
             "shape %zu: bf16 changed the routing (the router must stay fp32)", s);
    struct {
      const char *name;
      const float *got, *want;
      size_t n;
    } cls[] = {{"y", b.y, f.y, (size_t)T * M},           {"dx", b.dx, f.dx, (size_t)T * M},
               {"dw1", b.dw1, f.dw1, (size_t)E * M * H}, {"db1", b.db1, f.db1, (size_t)E * H},
               {"dw2", b.dw2, f.dw2, (size_t)E * H * M}, {"db2", b.db2, f.db2, (size_t)E * M},
               {"dwg", b.dwg, f.dwg, (size_t)M * E}};
    printf("shape T=%d M=%d H=%d E=%d K=%d f=%g: relative L2 error bf16 vs fp32:", T, M, H, E,
           cfg.top_k, cfg.capacity_factor);
    for (size_t c = 0; c < sizeof cls / sizeof cls[0]; c++) {
      const double e = rel_l2(cls[c].got, cls[c].want, cls[c].n);
      printf(" %s %.2e", cls[c].name, e);
      TU_CHECK(e <= 1e-2, "shape %zu %s: relative error %.3e above the bf16 bound 1e-2", s,
               cls[c].name, e);
      if (strcmp(cls[c].name, "db2") != 0) {  // db2 = column sums of dy: no GEMM
        TU_CHECK(e > 0, "shape %zu %s: bf16 gave the fp32 bits (bf16 did not run)", s, cls[c].name);
      }
    }
    printf("\n");
    tu_free_all();
  }
  moe_ctx_destroy(ctx);
  return tu_finish("test_bf16");
}
