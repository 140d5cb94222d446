// libmoe example: one MoE layer in one process, through the public API only.
//
// Shows: a moe_ctx (errors come back as a status plus a message in the
// context), a layer configuration checked by moe_layer_config_validate, the
// layer's creation and parameter initialisation, a forward pass on random
// input, a toy loss L = 0.5 * sum(y^2) / T with its gradient dy = y / T, the
// backward pass (dx and parameter gradients accumulate), and cleanup. It
// prints the loss, the load-balancing (aux) loss and z-loss, the routing
// counts, and checksums of y, dx and the gate gradient. Exit status 0 on
// success, 1 with a message on stderr otherwise.
//
// Build against an installed libmoe (cmake --install build --prefix P):
//   cc -O2 layer_single.c -o layer_single $(PKG_CONFIG_PATH=P/lib/pkgconfig pkg-config --cflags
//   --libs libmoe)
// or `make PKG_CONFIG_PATH=P/lib/pkgconfig` in examples/. In the source tree,
// CMake builds it as build/examples/example_layer_single (ctest runs it).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "moe/moe.h"

// Prints what failed with libmoe's message and where it was raised.
static int failed(moe_ctx *ctx, const char *what, moe_status st) {
  fprintf(stderr, "layer_single: %s failed: %s: %s (at %s)\n", what, moe_status_str(st),
          moe_ctx_error(ctx), moe_ctx_error_where(ctx));
  return 1;
}

static double sum(const float *v, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += v[i];
  return s;
}

int main(void) {
  moe_ctx *ctx = NULL;
  moe_layer *layer = NULL;
  float *x = NULL, *y = NULL, *dy = NULL, *dx = NULL;
  int rc = 1;

  moe_status st = moe_ctx_create(&ctx);
  if (st != MOE_STATUS_OK) {
    fprintf(stderr, "layer_single: moe_ctx_create failed: %s\n", moe_status_str(st));
    return 1;
  }

  // T tokens of width M through E experts (FFN M -> H -> M), top-2 routing.
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.tokens = 256;
  cfg.model_dim = 64;
  cfg.hidden_dim = 128;
  cfg.num_experts = 8;
  cfg.top_k = 2;
  cfg.capacity_factor = 1.25;  // GShard capacity: choices beyond it are dropped
  cfg.aux_loss_coef = 0.01f;
  cfg.z_loss_coef = 0.001f;
  if ((st = moe_layer_config_validate(ctx, &cfg)) != MOE_STATUS_OK) {
    rc = failed(ctx, "moe_layer_config_validate", st);
    goto done;
  }
  if ((st = moe_layer_create(ctx, &cfg, &layer)) != MOE_STATUS_OK) {
    rc = failed(ctx, "moe_layer_create", st);
    goto done;
  }
  moe_layer_init_params(layer, 1234);

  const int T = cfg.tokens, M = cfg.model_dim;
  const size_t n = (size_t)T * M;
  x = malloc(n * sizeof *x);
  y = malloc(n * sizeof *y);
  dy = malloc(n * sizeof *dy);
  dx = calloc(n, sizeof *dx);  // backward adds into dx
  if (!x || !y || !dy || !dx) {
    fprintf(stderr, "layer_single: out of memory (%zu floats)\n", 4 * n);
    goto done;
  }
  moe_rng rng;
  moe_rng_init(&rng, 42, 0);
  moe_rng_fill_normal(&rng, x, n, 0.0f, 1.0f);

  moe_layer_stats stats;
  if ((st = moe_layer_forward(layer, x, T, y, &stats)) != MOE_STATUS_OK) {
    rc = failed(ctx, "moe_layer_forward", st);
    goto done;
  }
  double loss = 0.0;
  for (size_t i = 0; i < n; i++) {
    loss += 0.5 * (double)y[i] * y[i] / T;
    dy[i] = y[i] / (float)T;
  }
  moe_layer_zero_grad(layer);
  if ((st = moe_layer_backward(layer, dy, dx)) != MOE_STATUS_OK) {
    rc = failed(ctx, "moe_layer_backward", st);
    goto done;
  }

  const moe_layer_tensors g = moe_layer_get_tensors(layer);
  const double y_sum = sum(y, n), dx_sum = sum(dx, n);
  const double dwg_sum = sum(g.dwg, (size_t)M * cfg.num_experts);
  printf("layer_single: libmoe %s, T=%d M=%d H=%d E=%d top-%d, %zu parameters\n", moe_version(), T,
         M, cfg.hidden_dim, cfg.num_experts, cfg.top_k, moe_layer_num_params(layer));
  printf("routing: %d choices kept, %d dropped (capacity %d per expert)\n", stats.rows,
         stats.dropped, moe_layer_capacity(&cfg, T));
  printf("loss %.6f  aux_loss %.6f  z_loss %.6f\n", loss, stats.aux_loss, stats.z_loss);
  printf("checksums: sum(y) %.6e  sum(dx) %.6e  sum(dwg) %.6e\n", y_sum, dx_sum, dwg_sum);
  if (!isfinite(loss) || !isfinite(y_sum) || !isfinite(dx_sum) || !isfinite(dwg_sum)) {
    fprintf(stderr, "layer_single: non-finite result\n");
    goto done;
  }
  if (stats.rows + stats.dropped != T * cfg.top_k) {
    fprintf(stderr, "layer_single: %d kept + %d dropped choices, expected %d\n", stats.rows,
            stats.dropped, T * cfg.top_k);
    goto done;
  }
  printf("layer_single: OK\n");
  rc = 0;
done:
  free(x);
  free(y);
  free(dy);
  free(dx);
  moe_layer_destroy(layer);
  moe_ctx_destroy(ctx);
  return rc;
}
