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

// Largest per-device (leader = 0) or per-node (leader = 1) volume sent or
// received, in bytes, over all pairs of distinct devices.
static double largest_volume(const moe_cluster *c, const double *bytes, int per_node) {
  const int D = moe_cluster_devices(c), G = c->devices_per_node;
  const int groups = per_node ? c->nodes : D, size = per_node ? G : 1;
  double worst = 0.0;
  for (int g = 0; g < groups; g++) {
    double up = 0.0, down = 0.0;
    for (int v = g * size; v < (g + 1) * size; v++) {
      for (int u = 0; u < D; u++) {
        if (u == v) continue;
        up += bytes[(size_t)v * D + u];
        down += bytes[(size_t)u * D + v];
      }
    }
    worst = up > worst ? up : worst;
    worst = down > worst ? down : worst;
  }
  return worst;
}

moe_status moe_model_a2a_algo_s(moe_ctx *ctx, const moe_cluster *c, const char *algo,
                                const double *bytes, double *seconds) {
  moe_status st = MOE_STATUS_OK;
  double *part = NULL;
  MOE_FAIL_IF(ctx, !c || !algo || !bytes || !seconds, MOE_STATUS_INVALID_ARG,
              "all-to-all model: cluster, algorithm, bytes and seconds must not be NULL");
  const int seq =
      strcmp(algo, "mpi") == 0 || strcmp(algo, "pairwise") == 0 || strcmp(algo, "grouped") == 0;
  const int pipe = strcmp(algo, "pipe") == 0, d2 = strcmp(algo, "2dh") == 0,
            d1 = strcmp(algo, "1dh") == 0;
  MOE_FAIL_IF(ctx, !seq && !pipe && !d2 && !d1, MOE_STATUS_INVALID_ARG,
              "all-to-all model: algorithm '%s' is unknown (valid: mpi, pairwise, grouped, pipe, "
              "1dh, 2dh)",
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
  const double intra_bw = c->intra.gbit_per_s * 1e9 / 8.0, lat = c->intra.latency_us * 1e-6;
  if (seq) {
    *seconds = t[0] + t[1];
  } else if (pipe) {
    *seconds = t[0] > t[1] ? t[0] : t[1];
  } else if (d2) {
    const double v = largest_volume(c, bytes, 0);
    *seconds = (v > 0 ? v / intra_bw + lat : 0.0) + t[1];
  } else {
    const double v = largest_volume(c, bytes, 1);
    *seconds = (v > 0 ? 2.0 * (v / intra_bw + lat) : 0.0) + t[1];
  }
done:
  moe_free(part);
  return st;
}
