// Performance models (include/moe/perf.h): least-squares fits recover known
// alpha and beta from synthetic data; FasterMoE's compute (eq. 1), link (eq. 2)
// and roofline (eq. 3-6) models against values worked out by hand; every
// shipped cluster description loads and validates; bad descriptions fail with
// messages naming the key.
#define _DEFAULT_SOURCE  // DT_REG
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"
#include "moe/perf.h"
#include "testutil.h"

static moe_ctx *g_ctx;

static int close_rel(double got, double want, double tol) {
  return fabs(got - want) <= tol * fabs(want) + 1e-300;
}

static void test_fit(void) {
  // exact line: t = 25 us + n / 10 GB/s, sizes 1 KiB .. 64 MiB
  double x[17], y[17];
  for (int i = 0; i < 17; i++) {
    x[i] = 1024.0 * (1 << i);
    y[i] = 25e-6 + x[i] / 10e9;
  }
  moe_linear_fit f;
  TU_CHECK(moe_fit_linear(g_ctx, x, y, 17, &f) == MOE_STATUS_OK, "fit: %s", moe_ctx_error(g_ctx));
  TU_CHECK(close_rel(f.alpha, 25e-6, 1e-9) && close_rel(f.beta, 1e-10, 1e-9) && f.r2 > 1 - 1e-12,
           "exact line: alpha %g beta %g r2 %.15f", f.alpha, f.beta, f.r2);
  TU_CHECK(close_rel(moe_fit_eval(&f, 1e6), 25e-6 + 1e-4, 1e-9), "eval");
  // noisy: +-2% multiplicative noise from a fixed generator, 64 points
  double xn[64], yn[64];
  moe_rng rng;
  moe_rng_init(&rng, 99, 0);
  float u[64];
  moe_rng_fill_uniform(&rng, u, 64, -0.02f, 0.02f);
  for (int i = 0; i < 64; i++) {
    xn[i] = 1e6 * (i + 1);  // FLOPs or bytes
    yn[i] = (3e-3 + xn[i] * 2e-9) * (1.0 + u[i]);
  }
  TU_CHECK(moe_fit_linear(g_ctx, xn, yn, 64, &f) == MOE_STATUS_OK, "noisy fit");
  TU_CHECK(close_rel(f.beta, 2e-9, 0.02) && close_rel(f.alpha, 3e-3, 0.25) && f.r2 > 0.99,
           "noisy line: alpha %g (3e-3) beta %g (2e-9) r2 %g", f.alpha, f.beta, f.r2);
  // constant y: fitted exactly
  double yc[3] = {5, 5, 5}, xc[3] = {1, 2, 3};
  TU_CHECK(moe_fit_linear(g_ctx, xc, yc, 3, &f) == MOE_STATUS_OK && f.r2 == 1.0 && f.beta == 0.0,
           "constant y: r2 %g beta %g", f.r2, f.beta);
  // errors
  TU_CHECK(moe_fit_linear(g_ctx, x, y, 1, &f) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "at least 2"),
           "one point refused: %s", moe_ctx_error(g_ctx));
  double same[3] = {4, 4, 4};
  TU_CHECK(moe_fit_linear(g_ctx, same, y, 3, &f) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "same x"),
           "equal x refused: %s", moe_ctx_error(g_ctx));
  double bad[3] = {1, NAN, 3};
  TU_CHECK(moe_fit_linear(g_ctx, bad, y, 3, &f) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "point 1"),
           "NaN refused naming the point: %s", moe_ctx_error(g_ctx));
  TU_CHECK(moe_fit_linear(g_ctx, NULL, y, 3, &f) == MOE_STATUS_INVALID_ARG, "NULL refused");
}

static moe_cluster small_cluster(int inter_uses_intra) {
  moe_cluster c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "t");
  c.nodes = 2;
  c.devices_per_node = 2;
  c.gemm_tflops = 10.0;
  c.intra.gbit_per_s = 80.0;  // 10 GB/s
  c.intra.latency_us = 2.0;
  c.inter.gbit_per_s = 8.0;  // 1 GB/s
  c.inter.latency_us = 5.0;
  c.nics_per_node = 1;
  c.inter_uses_intra = inter_uses_intra;
  return c;
}

static void test_models(void) {
  moe_cluster c = small_cluster(0);
  TU_CHECK(moe_cluster_validate(g_ctx, &c) == MOE_STATUS_OK, "small cluster valid: %s",
           moe_ctx_error(g_ctx));
  // eq. 1: the slowest device: 4e10 FLOPs at 10 TFLOP/s = 4 ms
  const double flops[4] = {1e10, 4e10, 2e10, 0};
  TU_CHECK(close_rel(moe_model_compute_s(&c, flops), 4e-3, 1e-12), "compute model");
  // eq. 2, uniform all-to-all of b = 1 MB per pair, 2 nodes x 2 devices:
  // intra links carry 1 local block each way: 1 MB / 10 GB/s = 0.1 ms
  // node NIC up carries 2 devices x 2 remote blocks = 4 MB / 1 GB/s = 4 ms
  double bytes[16];
  for (int i = 0; i < 16; i++) bytes[i] = (i / 4 == i % 4) ? 0.0 : 1e6;
  moe_link_report r;
  TU_CHECK(moe_model_alltoall_s(g_ctx, &c, bytes, &r) == MOE_STATUS_OK, "link model");
  TU_CHECK(close_rel(r.max_load_s, 4e-3, 1e-12) && close_rel(r.latency_s, 5e-6, 1e-12) &&
               close_rel(r.seconds, 4e-3 + 5e-6, 1e-12) && (r.kind == 2 || r.kind == 3),
           "uniform a2a: %g s (load %g, kind %d)", r.seconds, r.max_load_s, r.kind);
  // with inter traffic over the intra links too: each device sends 3 MB up
  // its intra link (0.3 ms), still below the NIC's 4 ms
  c = small_cluster(1);
  moe_model_alltoall_s(g_ctx, &c, bytes, &r);
  TU_CHECK(close_rel(r.max_load_s, 4e-3, 1e-12), "inter_uses_intra, NIC-bound: %g", r.max_load_s);
  // two NICs per node halve the NIC time; intra (3 MB / 10 GB/s = 0.3 ms) is
  // still below 2 ms
  c.nics_per_node = 2;
  moe_model_alltoall_s(g_ctx, &c, bytes, &r);
  TU_CHECK(close_rel(r.max_load_s, 2e-3, 1e-12), "2 NICs: %g", r.max_load_s);
  // only intra traffic (device 0 -> 1, 5 MB): 0.5 ms + intra latency, on
  // device 0's up link (kind 0, index 0)
  memset(bytes, 0, sizeof bytes);
  bytes[0 * 4 + 1] = 5e6;
  moe_model_alltoall_s(g_ctx, &c, bytes, &r);
  TU_CHECK(close_rel(r.seconds, 5e-4 + 2e-6, 1e-12) && r.kind == 0 && r.index == 0,
           "intra only: %g s kind %d index %d", r.seconds, r.kind, r.index);
  // skew: device 3 receives 8 MB from device 0 (other node) -> node 1's NIC
  // down link (kind 3, index 1): 8 ms
  memset(bytes, 0, sizeof bytes);
  bytes[0 * 4 + 3] = 8e6;
  c.nics_per_node = 1;
  moe_model_alltoall_s(g_ctx, &c, bytes, &r);
  TU_CHECK(close_rel(r.max_load_s, 8e-3, 1e-12) && (r.kind == 2 || r.kind == 3),
           "one remote block: %g kind %d index %d", r.max_load_s, r.kind, r.index);
  // no traffic: 0 s
  memset(bytes, 0, sizeof bytes);
  moe_model_alltoall_s(g_ctx, &c, bytes, &r);
  TU_CHECK(r.seconds == 0.0, "no traffic: %g", r.seconds);
  bytes[1] = -1.0;
  TU_CHECK(moe_model_alltoall_s(g_ctx, &c, bytes, &r) == MOE_STATUS_INVALID_ARG,
           "negative bytes refused");
  // roofline: comp 2 ms, comm 4 ms -> R_CC 0.5; ideal = peak/2, semi = peak/3;
  // achieved = 1.2e11 FLOPs / (4 workers x 10 ms) = 3e12
  moe_roofline p;
  TU_CHECK(moe_roofline_point(g_ctx, 10e12, 1.2e11, 4, 2e-3, 4e-3, 10e-3, &p) == MOE_STATUS_OK,
           "roofline");
  TU_CHECK(close_rel(p.r_cc, 0.5, 1e-12) && close_rel(p.ideal_flops, 5e12, 1e-12) &&
               close_rel(p.semi_flops, 10e12 / 3, 1e-12) &&
               close_rel(p.achieved_flops, 3e12, 1e-12),
           "roofline values: r_cc %g ideal %g semi %g achieved %g", p.r_cc, p.ideal_flops,
           p.semi_flops, p.achieved_flops);
  TU_CHECK(moe_roofline_point(g_ctx, 10e12, 1e9, 0, 1, 1, 1, &p) == MOE_STATUS_INVALID_ARG,
           "roofline: 0 workers refused");
}

static void expect_bad(const char *json, const char *needle) {
  moe_cluster c;
  memset(&c, 0x5a, sizeof c);
  moe_cluster before = c;
  const moe_status st = moe_cluster_from_json(g_ctx, json, &c);
  TU_CHECK(st != MOE_STATUS_OK && strstr(moe_ctx_error(g_ctx), needle) != NULL,
           "bad cluster %s: status %s, message '%s' should contain '%s'", json, moe_status_str(st),
           moe_ctx_error(g_ctx), needle);
  TU_CHECK(memcmp(&c, &before, sizeof c) == 0, "bad cluster left out changed: %s", json);
}

#define GOOD_LINKS                                                  \
  "\"intra\": {\"gbit_per_s\": 96, \"latency_us\": 5}, \"inter\": " \
  "{\"gbit_per_s\": 100, \"latency_us\": 5}"

static void test_cluster_json(const char *clusters_dir) {
  const char *good =
      "{\"name\": \"x\", \"device\": \"d\", \"nodes\": 2, \"devices_per_node\": 4, "
      "\"gemm_tflops\": 10, " GOOD_LINKS "}";
  moe_cluster c;
  TU_CHECK(moe_cluster_from_json(g_ctx, good, &c) == MOE_STATUS_OK && c.nics_per_node == 1 &&
               c.inter_uses_intra == 0 && moe_cluster_devices(&c) == 8,
           "minimal cluster: %s", moe_ctx_error(g_ctx));
  expect_bad("{\"name\": \"x\", \"device\": \"d\", \"nodes\": 2, \"gemm_tflops\": 10, " GOOD_LINKS
             "}",
             "devices_per_node");
  expect_bad(
      "{\"name\": \"x\", \"device\": \"d\", \"nodes\": 0, \"devices_per_node\": 4, "
      "\"gemm_tflops\": 10, " GOOD_LINKS "}",
      "nodes (0) must be in [1, 65536]");
  expect_bad(
      "{\"name\": \"x\", \"device\": \"d\", \"nodes\": 2, \"devices_per_node\": 4, "
      "\"gemm_tflops\": -1, " GOOD_LINKS "}",
      "gemm_tflops");
  expect_bad(
      "{\"name\": \"x\", \"device\": \"d\", \"nodes\": 2, \"devices_per_node\": 4, "
      "\"gemm_tflops\": 10, \"intra\": {\"gbit_per_s\": 0, \"latency_us\": 5}, \"inter\": "
      "{\"gbit_per_s\": 100, \"latency_us\": 5}}",
      "intra.gbit_per_s");
  expect_bad(
      "{\"name\": \"x\", \"device\": \"d\", \"nodes\": 2, \"devices_per_node\": 4, "
      "\"gemm_tflops\": 10, \"intra\": {\"gbit_per_s\": 10}, \"inter\": "
      "{\"gbit_per_s\": 100, \"latency_us\": 5}}",
      "latency_us");
  expect_bad(
      "{\"name\": \"x\", \"device\": \"d\", \"nodes\": 2, \"devices_per_node\": 4, "
      "\"gemm_tflops\": 10, \"colour\": 1, " GOOD_LINKS "}",
      "unknown key 'colour'");
  expect_bad(
      "{\"name\": \"x\", \"name\": \"y\", \"device\": \"d\", \"nodes\": 2, "
      "\"devices_per_node\": 4, \"gemm_tflops\": 10, " GOOD_LINKS "}",
      "twice");
  expect_bad(
      "{\"name\": 3, \"device\": \"d\", \"nodes\": 2, \"devices_per_node\": 4, "
      "\"gemm_tflops\": 10, " GOOD_LINKS "}",
      "'name' must be a string");
  expect_bad(
      "{\"name\": \"x\", \"device\": \"d\", \"nodes\": 2, \"devices_per_node\": 4, "
      "\"gemm_tflops\": 10, \"nics_per_node\": 5, " GOOD_LINKS "}",
      "nics_per_node (5) must be in [1, 4]");
  expect_bad("{\"name\": \"x\"", "");  // malformed JSON: any message
  // scaling
  moe_cluster s;
  TU_CHECK(moe_cluster_scale(g_ctx, &c, 1024, &s) == MOE_STATUS_OK && s.nodes == 256 &&
               s.devices_per_node == 4,
           "scale to 1024");
  TU_CHECK(moe_cluster_scale(g_ctx, &c, 2, &s) == MOE_STATUS_OK && s.nodes == 1 &&
               s.devices_per_node == 2,
           "scale below a node");
  TU_CHECK(moe_cluster_scale(g_ctx, &c, 6, &s) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "multiple of 4"),
           "scale to 6 refused: %s", moe_ctx_error(g_ctx));
  // every shipped description loads
  DIR *dir = opendir(clusters_dir);
  TU_CHECK(dir != NULL, "cannot open %s", clusters_dir);
  int n = 0;
  for (struct dirent *e; dir && (e = readdir(dir)) != NULL;) {
    const size_t len = strlen(e->d_name);
    if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0) continue;
    char path[2048];
    snprintf(path, sizeof path, "%.1000s/%.1000s", clusters_dir, e->d_name);
    moe_cluster k;
    const moe_status st = moe_cluster_load(g_ctx, path, &k);
    TU_CHECK(st == MOE_STATUS_OK, "%s: %s", path, moe_ctx_error(g_ctx));
    char stem[256];
    snprintf(stem, sizeof stem, "%.*s", (int)(len - 5), e->d_name);
    TU_CHECK(st != MOE_STATUS_OK || strcmp(k.name, stem) == 0,
             "%s: name '%s' should equal the file name", path, k.name);
    n++;
  }
  if (dir) closedir(dir);
  TU_CHECK(n >= 5, "expected the papers' testbeds in %s, found %d files", clusters_dir, n);
  TU_CHECK(moe_cluster_load(g_ctx, "/nonexistent/c.json", &c) != MOE_STATUS_OK &&
               strstr(moe_ctx_error(g_ctx), "/nonexistent/c.json"),
           "missing file names the path: %s", moe_ctx_error(g_ctx));
}

int main(int argc, char **argv) {
  moe_ctx_create(&g_ctx);
  char clusters[1024];
  // tests get tests/data as argv[1]; the descriptions are in ../../clusters
  snprintf(clusters, sizeof clusters, "%.990s/../../clusters", argc > 1 ? argv[1] : "tests/data");
  test_fit();
  test_models();
  test_cluster_json(clusters);
  moe_ctx_destroy(g_ctx);
  return tu_finish("test_perf");
}
