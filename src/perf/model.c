// FasterMoE's performance models (PPoPP'22 §3; ALGORITHMS.md 4):
//   eq. 1  Lat_comp = max_w flops_w / P_w           (load-aware: the slowest worker)
//   eq. 2  Lat_comm = max_l T_l / W_l                (directed links, busiest one)
//   eq. 3-6 the DDL-roofline point: R_CC, achieved, ideal, semi-ideal throughput
// Link graph of a moe_cluster: per device an intra up and down link (to the
// node's fabric), per node an inter up and down link (its NICs together). A
// transfer within a node crosses the sender's intra up and the receiver's intra
// down link; one between nodes crosses the two nodes' inter links, and also the
// two devices' intra links when the cluster says inter_uses_intra. Latency is
// added once: the slowest path type in use (FasterMoE's eq. 2 has no latency
// term; without one a tiny exchange would take no time).
#include <math.h>
#include <string.h>

#include "moe/a2a_catalog.h"
#include "moe/perf.h"

double moe_model_compute_s(const moe_cluster *c, const double *flops) {
  const int D = moe_cluster_devices(c);
  double worst = 0.0;
  for (int w = 0; w < D; w++) worst = flops[w] > worst ? flops[w] : worst;
  return worst / (c->gemm_tflops * 1e12);
}

// Keeps the busiest link seen so far.
static void consider(moe_link_report *r, double t, int kind, int index) {
  if (t > r->max_load_s) {
    r->max_load_s = t;
    r->kind = kind;
    r->index = index;
  }
}

moe_status moe_model_alltoall_s(moe_ctx *ctx, const moe_cluster *c, const double *bytes,
                                moe_link_report *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !c || !bytes || !out, MOE_STATUS_INVALID_ARG,
              "link model: cluster, bytes and out must not be NULL");
  MOE_TRY(moe_cluster_validate(ctx, c));
  const int D = moe_cluster_devices(c), G = c->devices_per_node, N = c->nodes;
  // Loads are accumulated link by link without a D-sized scratch: every link's
  // load is a row or column sum over a block of the matrix.
  const double intra_bw = c->intra.gbit_per_s * 1e9 / 8.0;
  const double inter_bw = c->inter.gbit_per_s * 1e9 / 8.0 * c->nics_per_node;
  moe_link_report r;
  memset(&r, 0, sizeof r);
  int any_inter = 0, any_intra = 0;
  for (int s = 0; s < D; s++) {
    for (int d = 0; d < D; d++) {
      const double b = bytes[(size_t)s * D + d];
      MOE_FAIL_IF(ctx, !(b >= 0.0) || !isfinite(b), MOE_STATUS_INVALID_ARG,
                  "link model: bytes from device %d to %d is %g; it must be finite and >= 0", s, d,
                  b);
      if (s == d || b == 0.0) continue;
      if (s / G == d / G) {
        any_intra = 1;
      } else {
        any_inter = 1;
      }
    }
  }
  for (int v = 0; v < D; v++) {  // device v's intra links
    double up = 0.0, down = 0.0;
    for (int u = 0; u < D; u++) {
      if (u == v) continue;
      const int same = u / G == v / G;
      if (same || c->inter_uses_intra) {
        up += bytes[(size_t)v * D + u];
        down += bytes[(size_t)u * D + v];
      }
    }
    consider(&r, up / intra_bw, 0, v);
    consider(&r, down / intra_bw, 1, v);
  }
  for (int n = 0; n < N; n++) {  // node n's inter links
    double up = 0.0, down = 0.0;
    for (int v = n * G; v < (n + 1) * G; v++) {
      for (int u = 0; u < D; u++) {
        if (u / G == n) continue;
        up += bytes[(size_t)v * D + u];
        down += bytes[(size_t)u * D + v];
      }
    }
    consider(&r, up / inter_bw, 2, n);
    consider(&r, down / inter_bw, 3, n);
  }
  const double lat =
      any_inter ? c->inter.latency_us * 1e-6 : (any_intra ? c->intra.latency_us * 1e-6 : 0.0);
  r.latency_s = lat;
  r.seconds = r.max_load_s + lat;
  *out = r;
done:
  return st;
}

moe_status moe_roofline_point(moe_ctx *ctx, double peak_flops, double flops_total, int workers,
                              double lat_comp, double lat_comm, double lat_e2e, moe_roofline *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "roofline: out must not be NULL");
  MOE_FAIL_IF(ctx,
              !(peak_flops > 0) || !(flops_total >= 0) || workers < 1 || !(lat_comp > 0) ||
                  !(lat_comm > 0) || !(lat_e2e > 0) || !isfinite(peak_flops) ||
                  !isfinite(flops_total) || !isfinite(lat_comp) || !isfinite(lat_comm) ||
                  !isfinite(lat_e2e),
              MOE_STATUS_INVALID_ARG,
              "roofline: peak (%g), FLOPs (%g) and the three latencies (%g, %g, %g s) must be "
              "finite, positive (FLOPs >= 0), workers (%d) >= 1",
              peak_flops, flops_total, lat_comp, lat_comm, lat_e2e, workers);
  out->r_cc = lat_comp / lat_comm;
  out->peak_flops = peak_flops;
  out->achieved_flops = flops_total / (workers * lat_e2e);
  out->ideal_flops = peak_flops * (out->r_cc < 1.0 ? out->r_cc : 1.0);
  out->semi_flops = peak_flops * out->r_cc / (out->r_cc + 1.0);
done:
  return st;
}

// Largest volume, in bytes, one device (*device) and one node's devices together
// (*node) send or receive, over all pairs of distinct devices: one pass over the
// matrix, each sum accumulated in the order of a device-by-device scan.
static void largest_volumes(const moe_cluster *c, const double *bytes, double *device,
                            double *node) {
  const int D = moe_cluster_devices(c), G = c->devices_per_node;
  double worst_dev = 0.0, worst_node = 0.0;
  for (int n = 0; n < c->nodes; n++) {
    double node_up = 0.0, node_down = 0.0;
    for (int v = n * G; v < (n + 1) * G; v++) {
      double up = 0.0, down = 0.0;
      for (int u = 0; u < D; u++) {
        if (u == v) continue;
        const double out = bytes[(size_t)v * D + u], in = bytes[(size_t)u * D + v];
        up += out;
        down += in;
        node_up += out;
        node_down += in;
      }
      worst_dev = up > worst_dev ? up : worst_dev;
      worst_dev = down > worst_dev ? down : worst_dev;
    }
    worst_node = node_up > worst_node ? node_up : worst_node;
    worst_node = node_down > worst_node ? node_down : worst_node;
  }
  *device = worst_dev;
  *node = worst_node;
}

moe_status moe_model_a2a_algo_s(moe_ctx *ctx, const moe_cluster *c, const char *algo,
                                const double *bytes, double *seconds) {
  moe_status st = MOE_STATUS_OK;
  double *part = NULL;
  MOE_FAIL_IF(ctx, !c || !algo || !bytes || !seconds, MOE_STATUS_INVALID_ARG,
              "all-to-all model: cluster, algorithm, bytes and seconds must not be NULL");
  // The algorithm's own cost model, from the catalogue (its file in src/comm/).
  const moe_a2a_algo *entry = NULL;
  if (moe_a2a_find(ctx, algo, &entry) != MOE_STATUS_OK) {
    char names[256];
    moe_a2a_names(names, sizeof names, 0);
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG, "all-to-all model: algorithm '%s' is unknown (valid: %s)",
             algo, names);
  }
  MOE_FAIL_IF(ctx, !entry->model, MOE_STATUS_UNSUPPORTED,
              "all-to-all model: algorithm '%s' declares no cost model (its catalogue entry's "
              "model is NULL)",
              algo);
  const int D = moe_cluster_devices(c), G = c->devices_per_node;
  const size_t n = (size_t)D * (size_t)D;
  part = moe_malloc(n * sizeof *part);
  MOE_FAIL_IF(ctx, !part, MOE_STATUS_OUT_OF_MEMORY, "all-to-all model: cannot allocate %zu cells",
              n);
  // t_intra: intra-node pairs only; t_inter: inter-node pairs only
  double t[2];
  for (int inter = 0; inter < 2; inter++) {
    for (size_t i = 0; i < n; i++) {
      const int s = (int)(i / (size_t)D), d = (int)(i % (size_t)D);
      part[i] = ((s / G != d / G) == inter) ? bytes[i] : 0.0;
    }
    moe_link_report r;
    MOE_TRY(moe_model_alltoall_s(ctx, c, part, &r));
    t[inter] = r.seconds;
  }
  moe_a2a_cost_params p;
  memset(&p, 0, sizeof p);
  p.P = D;
  p.nodes = c->nodes;
  p.ranks_per_node = G;
  p.intra_bytes_per_s = c->intra.gbit_per_s * 1e9 / 8.0;
  p.intra_latency_s = c->intra.latency_us * 1e-6;
  p.inter_bytes_per_s = c->inter.gbit_per_s * 1e9 / 8.0 * c->nics_per_node;
  p.inter_latency_s = c->inter.latency_us * 1e-6;
  p.t_intra_s = t[0];
  p.t_inter_s = t[1];
  largest_volumes(c, bytes, &p.max_device_bytes, &p.max_node_bytes);
  *seconds = entry->model(&p);
done:
  moe_free(part);
  return st;
}
