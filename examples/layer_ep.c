// libmoe example: the expert-parallel MoE layer over MPI, checked against the
// single-process layer. Public API only (moe/moe.h, moe/comm.h, moe/parallel.h).
//
// Shows: MPI_Init_thread (the layer's all-to-alls run on a communication
// thread: it needs MPI_THREAD_SERIALIZED at least; MULTIPLE is asked for), an
// expert-parallel layer over MPI_COMM_WORLD with EP = world size (each rank
// holds E / P experts), forward and backward on this rank's share of a global
// batch, and the library's guarantee: the outputs, dx and the losses equal the
// single-process layer's on the global batch (the concatenation of every
// rank's tokens in rank order), which every rank computes here too. Rank r
// holds T_r = 48 + 16 r tokens (ranks may hold different counts), the rows
// [sum of T_q for q < r, + T_r) of the global batch. Dropless routing
// (capacity_factor 0): with capacity the EP layer applies it per source rank.
//
// Prints the losses and the max abs difference of y and dx (over all ranks);
// exit status 1 if it is above 1e-4 (the library guarantees 1e-5 relative)
// or a call fails, else 0.
//
// Build against an installed libmoe (cmake --install build --prefix P, built with MPI):
//   cc -O2 layer_ep.c -o layer_ep $(PKG_CONFIG_PATH=P/lib/pkgconfig pkg-config --cflags --libs
//   libmoe) P/bin/moe-mpirun -n 2 ./layer_ep      (or: mpirun -n 2 ./layer_ep; as root with Open
//   MPI
//                                          set OMPI_ALLOW_RUN_AS_ROOT=1
//                                          OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, and add
//                                          --oversubscribe on fewer than 2 cores)
// or `make PKG_CONFIG_PATH=P/lib/pkgconfig` in examples/. In the source tree,
// CMake builds build/examples/example_layer_ep (ctest runs it on 2 ranks).
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "moe/comm.h"
#include "moe/moe.h"
#include "moe/parallel.h"

#define TOLERANCE 1e-4

static int g_rank;

static int failed(moe_ctx *ctx, const char *what, moe_status st) {
  fprintf(stderr, "layer_ep: rank %d: %s failed: %s: %s (at %s)\n", g_rank, what,
          moe_status_str(st), moe_ctx_error(ctx), moe_ctx_error_where(ctx));
  return 1;
}

static double abs_diff(double a, double b) { return a > b ? a - b : b - a; }

static double max_abs_diff(const float *a, const float *b, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; i++) {
    const double d = abs_diff(a[i], b[i]);
    if (!(d <= m)) m = d;  // NaN propagates
  }
  return m;
}

static int tokens_of(int rank) { return 48 + 16 * rank; }

int main(int argc, char **argv) {
  int provided = 0, world = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    fprintf(stderr, "layer_ep: MPI_Init_thread failed\n");
    return 1;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);

  moe_ctx *ctx = NULL;
  moe_layer *ref = NULL;
  moe_ep_layer *ep = NULL;
  float *x = NULL, *dy = NULL, *y_ref = NULL, *dx_ref = NULL, *y = NULL, *dx = NULL;
  int bad = 1;  // this rank's outcome; every rank agrees on the exit status at the end

  moe_status st = moe_ctx_create(&ctx);
  if (st != MOE_STATUS_OK) {
    fprintf(stderr, "layer_ep: moe_ctx_create failed: %s\n", moe_status_str(st));
    goto done;
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    fprintf(stderr,
            "layer_ep: this MPI provides thread level %d; the EP layer needs "
            "MPI_THREAD_SERIALIZED or more\n",
            provided);
    goto done;
  }

  // The global batch: Tg tokens; this rank's rows start at `off`.
  int Tg = 0, off = 0;
  for (int q = 0; q < world; q++) {
    if (q < g_rank) off += tokens_of(q);
    Tg += tokens_of(q);
  }
  const int T = tokens_of(g_rank);

  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.tokens = Tg;  // the most tokens one call passes: the reference takes the whole batch
  cfg.model_dim = 32;
  cfg.hidden_dim = 64;
  cfg.num_experts = 8;  // EP = world: the world size must divide it (1, 2, 4 or 8 ranks)
  cfg.top_k = 2;
  cfg.capacity_factor = 0.0;  // dropless
  cfg.aux_loss_coef = 0.01f;
  cfg.z_loss_coef = 0.001f;
  const int M = cfg.model_dim;
  const size_t ng = (size_t)Tg * M, n = (size_t)T * M;

  // Every rank draws the same global batch (same seed) and gradient dy.
  x = malloc(ng * sizeof *x);
  dy = malloc(ng * sizeof *dy);
  y_ref = malloc(ng * sizeof *y_ref);
  dx_ref = calloc(ng, sizeof *dx_ref);
  y = malloc(n * sizeof *y);
  dx = calloc(n, sizeof *dx);
  if (!x || !dy || !y_ref || !dx_ref || !y || !dx) {
    fprintf(stderr, "layer_ep: rank %d: out of memory\n", g_rank);
    goto done;
  }
  moe_rng rng;
  moe_rng_init(&rng, 7, 0);
  moe_rng_fill_normal(&rng, x, ng, 0.0f, 1.0f);
  moe_rng_init(&rng, 7, 1);
  moe_rng_fill_uniform(&rng, dy, ng, -1.0f, 1.0f);

  // The reference: the single-process layer on the whole global batch.
  moe_layer_stats rs;
  if ((st = moe_layer_create(ctx, &cfg, &ref)) != MOE_STATUS_OK) {
    failed(ctx, "moe_layer_create", st);
    goto done;
  }
  moe_layer_init_params(ref, 2024);
  moe_layer_zero_grad(ref);
  if ((st = moe_layer_forward(ref, x, Tg, y_ref, &rs)) != MOE_STATUS_OK) {
    failed(ctx, "moe_layer_forward", st);
    goto done;
  }
  if ((st = moe_layer_backward(ref, dy, dx_ref)) != MOE_STATUS_OK) {
    failed(ctx, "moe_layer_backward", st);
    goto done;
  }

  // The expert-parallel layer: collective calls, every rank makes them. On an
  // error every rank gets a status (no hang), so all leave through `done`.
  moe_parallel_config pc;
  moe_parallel_config_default(&pc);
  pc.ep_size = world;  // DP = 1: the experts are spread over all ranks
  if ((st = moe_ep_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &ep)) != MOE_STATUS_OK) {
    failed(ctx, "moe_ep_layer_create", st);
    goto done;
  }
  moe_ep_layer_init_params(ep, 2024);  // the same values as moe_layer_init_params(2024)
  moe_ep_layer_zero_grad(ep);
  moe_layer_stats s;
  if ((st = moe_ep_layer_forward(ep, x + (size_t)off * M, T, y, &s)) != MOE_STATUS_OK) {
    failed(ctx, "moe_ep_layer_forward", st);
    goto done;
  }
  if ((st = moe_ep_layer_backward(ep, dy + (size_t)off * M, dx)) != MOE_STATUS_OK) {
    failed(ctx, "moe_ep_layer_backward", st);
    goto done;
  }

  const moe_ep_tensors t = moe_ep_layer_get_tensors(ep);
  const double aux_diff = abs_diff(s.aux_loss, rs.aux_loss), z_diff = abs_diff(s.z_loss, rs.z_loss);
  double diff[3] = {max_abs_diff(y, y_ref + (size_t)off * M, n),
                    max_abs_diff(dx, dx_ref + (size_t)off * M, n),
                    aux_diff > z_diff ? aux_diff : z_diff};
  double all[3];
  MPI_Allreduce(diff, all, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  printf(
      "layer_ep: rank %d/%d: tokens [%d, %d) of %d, experts [%d, %d), aux_loss %.6f z_loss "
      "%.6f, max |y - y_ref| %.3e, max |dx - dx_ref| %.3e\n",
      g_rank, world, off, off + T, Tg, t.home_first, t.home_first + t.home_count, s.aux_loss,
      s.z_loss, diff[0], diff[1]);
  bad = !(all[0] <= TOLERANCE && all[1] <= TOLERANCE && all[2] <= TOLERANCE);
  if (g_rank == 0) {
    printf(
        "layer_ep: %d ranks: reference aux_loss %.6f z_loss %.6f; over all ranks max abs diff "
        "y %.3e, dx %.3e, losses %.3e (tolerance %.0e): %s\n",
        world, rs.aux_loss, rs.z_loss, all[0], all[1], all[2], TOLERANCE, bad ? "FAIL" : "OK");
  }

done:;
  int any_bad = 1;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  moe_ep_layer_destroy(ep);  // collective: every rank reaches it
  moe_layer_destroy(ref);
  moe_ctx_destroy(ctx);
  free(x);
  free(dy);
  free(y_ref);
  free(dx_ref);
  free(y);
  free(dx);
  MPI_Finalize();
  return any_bad ? 1 : 0;
}
