// Lina's training step on a described cluster (moe simulate --lina-train;
// include/moe/perf.h): the forward and backward of a GPT-style MoE model as a
// sequence of compute and all-to-all segments, with the dense gradients'
// all-reduce (and, packed, the expert replicas') as work that becomes ready
// block by block during the backward, under four policies:
//
//   packed    one all-reduce after the backward (no overlap, no contention);
//   fifo      the all-reduce runs as soon as its gradients are ready, beside
//             everything (DeepSpeed, Lina's baseline): during an all-to-all
//             both share the network, the all-to-all `contention` times
//             slower than alone and the all-reduce progressing at the rest of
//             the link (a fluid model);
//   priority  Lina's scheduler: the all-reduce only progresses in compute
//             (the all-to-alls' gaps), in micro-ops, one of which may still
//             run when an all-to-all starts (half a micro-op on average,
//             sharing the link as above); the MoE layers' all-to-alls are
//             cut into micro-ops pipelined with the experts (the engine's
//             own task graph and pipeline schedule, simulated);
//   packing   priority with `packing` times as many experts per device (EP
//             divided by it: the all-to-all spans fewer devices, the
//             experts' gradients are summed over the replicas).
//
// [R] reconstructed: Lina gives its rules and results, not a model; the
// segment costs are FasterMoE's link model (moe_model_alltoall_s) and the
// cluster's GEMM rate, the all-reduce a ring over the bottleneck link.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe/perf.h"
#include "moe/sched.h"

void moe_lina_train_config_default(moe_lina_train_config *c) {
  memset(c, 0, sizeof *c);
  c->layers = 12;
  c->moe_every = 2;
  c->model_dim = 768;
  c->hidden_dim = 3072;
  c->dense_hidden = 0;  // 4 M
  c->experts = 0;       // one per device
  c->top_k = 2;
  c->tokens = 4096;
  c->seq_len = 1024;
  c->vocab = 50257;
  c->elem_bytes = 2;
  c->micro_op_bytes = 30e6;
  c->contention = 1.83;
  c->packing = 2;
}

const char *moe_lina_train_variant_name(int v) {
  static const char *const names[MOE_LINA_TRAIN_VARIANTS] = {"packed", "fifo", "priority",
                                                             "packing"};
  return v >= 0 && v < MOE_LINA_TRAIN_VARIANTS ? names[v] : "?";
}

moe_status moe_lina_train_timeline(moe_ctx *ctx, const moe_lina_segment *seg, int n, int variant,
                                   double contention, double micro_op_s, double *step_s,
                                   double *exposed_s) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, n < 0 || (n > 0 && !seg) || !step_s || !exposed_s, MOE_STATUS_INVALID_ARG,
              "lina timeline: %d segments", n);
  MOE_FAIL_IF(ctx, variant < 0 || variant >= MOE_LINA_TRAIN_VARIANTS, MOE_STATUS_INVALID_ARG,
              "lina timeline: variant %d is unknown", variant);
  MOE_FAIL_IF(ctx, !(contention >= 1) || !isfinite(contention) || !(micro_op_s >= 0),
              MOE_STATUS_INVALID_ARG,
              "lina timeline: contention (%g) must be >= 1 and the micro-op time (%g) >= 0",
              contention, micro_op_s);
  double t = 0, w = 0;  // time; all-reduce work ready and not done (full-link seconds)
  const double s = contention, share = 1.0 - 1.0 / contention;  // the all-reduce's share
  for (int i = 0; i < n; i++) {
    const double d = seg[i].seconds;
    MOE_FAIL_IF(ctx, !(d >= 0) || !isfinite(d) || !(seg[i].ready_after >= 0),
                MOE_STATUS_INVALID_ARG, "lina timeline: segment %d: %g s, %g s ready", i, d,
                seg[i].ready_after);
    if (variant == MOE_LINA_TRAIN_PACKED) {
      t += d;
    } else if (seg[i].kind == MOE_LINA_SEG_COMPUTE) {
      t += d;
      w -= w < d ? w : d;  // the link is free: the all-reduce runs at full speed
    } else if (seg[i].kind == MOE_LINA_SEG_A2A && variant == MOE_LINA_TRAIN_FIFO) {
      if (w <= 0 || share <= 0) {
        t += d;
      } else if (w / share >= d * s) {  // shared the whole time
        t += d * s;
        w -= d * s * share;
      } else {  // the all-reduce ends first: the rest at full speed
        const double t1 = w / share;
        t += t1 + (d - t1 / s);
        w = 0;
      }
    } else {  // an all-to-all, Lina: the micro-op in flight ends beside it (the
              // fluid model: the all-to-all is longer by the work done, at most d (s - 1))
      double r = micro_op_s / 2;
      if (r > w) r = w;
      if (r > d * (s - 1)) r = d * (s - 1);
      t += d + r;
      w -= r;
    }
    w += seg[i].ready_after;
  }
  *exposed_s = w;
  *step_s = t + w;
done:
  return st;
}

// A ring all-reduce of `bytes` over `devices` devices whose slowest hop is
// bw bytes/s with latency lat s.
static double ring_s(double bytes, int devices, double bw, double lat) {
  if (devices < 2 || bytes <= 0) return 0;
  return 2.0 * (devices - 1) / devices * bytes / bw + 2.0 * (devices - 1) * lat;
}

// The pipelined MoE segment (Lina's partitioning): r chunks of dispatch
// all-to-all, experts and combine all-to-all, the engine's pipeline order,
// simulated; the comm stream's busy time is 2 a.
static moe_status pipelined_s(moe_ctx *ctx, double a, double e, int r, double *out) {
  moe_status st = MOE_STATUS_OK;
  moe_task_graph g;
  moe_schedule sc;
  memset(&g, 0, sizeof g);
  memset(&sc, 0, sizeof sc);
  double *dur = NULL;
  int(*tidx)[MOE_CT_KINDS] = NULL;
  const moe_schedule_algo *algo = NULL;
  MOE_TRY(moe_schedule_algo_find(ctx, "pipeline", &algo));  // catalogue: Lina pipelines
  MOE_TRY(moe_task_graph_init(ctx, &g, 7 * r, 7 * r));
  MOE_TRY(moe_schedule_init(ctx, &sc, 7 * r));
  tidx = moe_calloc((size_t)r, sizeof *tidx);
  dur = moe_calloc((size_t)7 * r, sizeof *dur);
  MOE_FAIL_IF(ctx, !tidx || !dur, MOE_STATUS_OUT_OF_MEMORY, "lina: out of memory");
  MOE_TRY(moe_chunk_pass_build(ctx, algo, r, 0, 0, NULL, NULL, &g, &sc, tidx));
  for (int c = 0; c < r; c++) {
    dur[tidx[c][MOE_CT_A1]] = a / r;
    dur[tidx[c][MOE_CT_E]] = e / r;
    dur[tidx[c][MOE_CT_A2]] = a / r;
  }
  MOE_TRY(moe_schedule_simulate(ctx, &g, &sc, dur, NULL, out));
done:
  moe_free(tidx);
  moe_free(dur);
  moe_task_graph_free(&g);
  moe_schedule_free(&sc);
  return st;
}

moe_status moe_lina_train_simulate(moe_ctx *ctx, const moe_cluster *cl,
                                   const moe_lina_train_config *c, moe_lina_train_result *out) {
  moe_status st = MOE_STATUS_OK;
  moe_lina_segment *seg = NULL;
  double *bytes = NULL;
  MOE_FAIL_IF(ctx, !cl || !c || !out, MOE_STATUS_INVALID_ARG, "lina train: NULL argument");
  MOE_TRY(moe_cluster_validate(ctx, cl));
  const int D = moe_cluster_devices(cl);
  const int E = c->experts > 0 ? c->experts : D;
  const int Hd = c->dense_hidden > 0 ? c->dense_hidden : 4 * c->model_dim;
  MOE_FAIL_IF(ctx, c->layers < 1 || c->layers > 1024, MOE_STATUS_INVALID_ARG,
              "lina train: layers (%d) must be in [1, 1024]", c->layers);
  MOE_FAIL_IF(ctx, c->moe_every < 1 || c->moe_every > c->layers, MOE_STATUS_INVALID_ARG,
              "lina train: moe_every (%d) must be in [1, %d] (the layers: else no block is MoE)",
              c->moe_every, c->layers);
  MOE_FAIL_IF(ctx, c->model_dim < 1 || c->hidden_dim < 1 || c->tokens < 1 || c->seq_len < 1,
              MOE_STATUS_INVALID_ARG,
              "lina train: model (%d), hidden (%d), tokens (%d) and seq_len (%d) must be >= 1",
              c->model_dim, c->hidden_dim, c->tokens, c->seq_len);
  MOE_FAIL_IF(ctx, c->top_k < 1 || c->top_k > E, MOE_STATUS_INVALID_ARG,
              "lina train: top_k (%d) must be in [1, %d] (the experts)", c->top_k, E);
  MOE_FAIL_IF(ctx, c->vocab < 0, MOE_STATUS_INVALID_ARG, "lina train: vocab (%d) must be >= 0",
              c->vocab);
  MOE_FAIL_IF(ctx, !(c->elem_bytes > 0 && c->elem_bytes <= 16), MOE_STATUS_INVALID_ARG,
              "lina train: element bytes (%g) must be in (0, 16]", c->elem_bytes);
  MOE_FAIL_IF(ctx, !(c->micro_op_bytes >= 1 && c->micro_op_bytes <= 1e12), MOE_STATUS_INVALID_ARG,
              "lina train: micro-op (%g bytes) must be in [1, 1e12]", c->micro_op_bytes);
  MOE_FAIL_IF(ctx, !(c->contention >= 1 && c->contention <= 100), MOE_STATUS_INVALID_ARG,
              "lina train: contention (%g) must be in [1, 100]", c->contention);
  MOE_FAIL_IF(ctx, c->packing < 1, MOE_STATUS_INVALID_ARG, "lina train: packing (%d) must be >= 1",
              c->packing);
  MOE_FAIL_IF(ctx, E % D != 0, MOE_STATUS_INVALID_ARG,
              "lina train: experts (%d) must be a multiple of the devices (%d)", E, D);
  MOE_FAIL_IF(ctx, D % c->packing != 0, MOE_STATUS_INVALID_ARG,
              "lina train: packing (%d) must divide the devices (%d)", c->packing, D);
  memset(out, 0, MOE_LINA_TRAIN_VARIANTS * sizeof *out);
  const double R = cl->gemm_tflops * 1e12, T = c->tokens, M = c->model_dim, H = c->hidden_dim,
               K = c->top_k, S = c->seq_len, eb = c->elem_bytes;
  const double bw_intra = cl->intra.gbit_per_s * 1e9 / 8;
  const double bw_inter = cl->inter.gbit_per_s * 1e9 / 8 * cl->nics_per_node;
  const double bw_ring = cl->nodes > 1 && bw_inter < bw_intra ? bw_inter : bw_intra;
  const double lat_ring = (cl->nodes > 1 ? cl->inter.latency_us : cl->intra.latency_us) * 1e-6;
  // per block: forward compute of attention, a dense FFN, the experts
  const double attn_f = (8 * T * M * M + 4 * T * S * M) / R;
  const double dense_f = 4 * T * M * Hd / R, expert_f = 4 * T * K * M * H / R;
  const double dense_grad_b = (4 * M * M + 2 * M * Hd) * eb, moe_grad_b = (4 * M * M + M * E) * eb;
  const double embed_b = ((double)c->vocab + S) * M * eb;
  seg = moe_calloc((size_t)c->layers * 4 + 2, sizeof *seg);
  bytes = moe_calloc((size_t)D * D, sizeof *bytes);
  MOE_FAIL_IF(ctx, !seg || !bytes, MOE_STATUS_OUT_OF_MEMORY, "lina train: out of memory");
  for (int v = 0; v < MOE_LINA_TRAIN_VARIANTS; v++) {
    const int p = v == MOE_LINA_TRAIN_PACKING ? c->packing : 1;
    const int ep = D / p;
    const int pipelined = v == MOE_LINA_TRAIN_PRIORITY || v == MOE_LINA_TRAIN_PACKING;
    // one all-to-all: T K M elements from each device, evenly over its EP group
    memset(bytes, 0, (size_t)D * D * sizeof *bytes);
    for (int s = 0; s < D; s++)
      for (int d = (s / ep) * ep; d < (s / ep + 1) * ep; d++)
        bytes[(size_t)s * D + d] = T * K * M * eb / ep;
    moe_link_report rep;
    MOE_TRY(moe_model_alltoall_s(ctx, cl, bytes, &rep));
    const double a = rep.seconds;
    // the experts' gradients over their p replicas (one per EP group: other nodes
    // when an EP group fills whole nodes)
    const double expert_grad_b = (double)E / ep * (2 * M * H + H + M) * eb;
    const double rep_bw = ep >= cl->devices_per_node ? bw_ring : bw_intra;
    const double expert_ar = ring_s(expert_grad_b, p, rep_bw, lat_ring);
    const double r = ceil(T * K * M * eb / c->micro_op_bytes);  // a2a micro-ops per pass
    const int chunks = r < 1 ? 1 : r > 64 ? 64 : (int)r;
    double fwd = 0, n_a2a = 0, ar_work = 0;
    int n = 0;
    for (int b = 0; b < c->layers; b++) {  // forward: no gradient sums run
      const int moe = (b + 1) % c->moe_every == 0;
      fwd += attn_f;
      if (!moe) {
        fwd += dense_f;
      } else if (pipelined) {
        double m = 0;
        MOE_TRY(pipelined_s(ctx, a, expert_f, chunks, &m));
        fwd += m;
      } else {
        fwd += 2 * a + expert_f;
      }
      n_a2a += moe ? 2 : 0;
    }
    for (int b = c->layers - 1; b >= 0; b--) {  // backward, from the last block
      const int moe = (b + 1) % c->moe_every == 0;
      const double grads =
          ring_s(moe ? moe_grad_b : dense_grad_b, D, bw_ring, lat_ring) + (moe ? expert_ar : 0);
      if (!moe) {
        seg[n++] = (moe_lina_segment){MOE_LINA_SEG_COMPUTE, 2 * dense_f, 0};
      } else if (pipelined) {  // the comm stream's gaps are compute for the sums
        double m = 0;
        MOE_TRY(pipelined_s(ctx, a, 2 * expert_f, chunks, &m));
        seg[n++] = (moe_lina_segment){MOE_LINA_SEG_A2A, a, 0};
        seg[n++] = (moe_lina_segment){MOE_LINA_SEG_COMPUTE, m - 2 * a, 0};
        seg[n++] = (moe_lina_segment){MOE_LINA_SEG_A2A, a, 0};
      } else {
        seg[n++] = (moe_lina_segment){MOE_LINA_SEG_A2A, a, 0};
        seg[n++] = (moe_lina_segment){MOE_LINA_SEG_COMPUTE, 2 * expert_f, 0};
        seg[n++] = (moe_lina_segment){MOE_LINA_SEG_A2A, a, 0};
      }
      seg[n++] = (moe_lina_segment){MOE_LINA_SEG_COMPUTE, 2 * attn_f, grads};
      ar_work += grads;
      n_a2a += moe ? 2 : 0;
    }
    // the embeddings' gradients are final last (the tied head)
    const double embed_ar = ring_s(embed_b, D, bw_ring, lat_ring);
    seg[n - 1].ready_after += embed_ar;
    ar_work += embed_ar;
    double bwd = 0, exposed = 0;
    MOE_TRY(moe_lina_train_timeline(ctx, seg, n, v, c->contention,
                                    ring_s(c->micro_op_bytes, D, bw_ring, lat_ring), &bwd,
                                    &exposed));
    out[v].fwd_ms = fwd * 1e3;
    out[v].bwd_ms = (bwd - exposed) * 1e3;
    out[v].ar_exposed_ms = exposed * 1e3;
    out[v].step_ms = (fwd + bwd) * 1e3;
    out[v].a2a_ms = n_a2a * a * 1e3;
    out[v].ar_ms = ar_work * 1e3;
    out[v].ep = ep;
    out[v].chunks = pipelined ? chunks : 1;
    out[v].moe_blocks = (int)(n_a2a / 4);
  }
done:
  moe_free(seg);
  moe_free(bytes);
  return st;
}
