// libmoe performance models: least-squares fits of measured times, cluster
// descriptions, and FasterMoE's models (PPoPP'22 §3: load-aware compute model
// eq. 1, directed link model eq. 2, DDL-roofline eq. 3-6).
//
// What: the building blocks the calibrator, the planner and the simulator use
// to predict how long a task takes on a cluster, measured or described.
// Not: the measurement (the benches and `moe calibrate` produce the points) or
// the choice of a plan (the planner). All functions are pure and
// thread-compatible; nothing here uses MPI.
#ifndef MOE_PERF_H
#define MOE_PERF_H

#include <stddef.h>

#include "moe/core.h"
#include "moe/layer.h"
#include "moe/sched.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- least-squares fits ------------------------------------------------------------

// y = alpha + beta * x, fitted by ordinary least squares.
typedef struct {
  double alpha;  // intercept (e.g. latency, seconds)
  double beta;   // slope (e.g. seconds per byte or per FLOP)
  double r2;     // coefficient of determination on the fitted points (1 = exact)
  double rmse;   // root mean square residual, in y's unit
  int n;         // points used
  double gamma;  // second slope of a two-variable fit (moe_fit_linear2); 0 otherwise
} moe_linear_fit;

// Fits n >= 2 points (x[i], y[i]). INVALID_ARG for NULL arrays, n < 2, a
// non-finite value (naming its index), or x values that are all equal (the
// slope is undetermined). R² is 1 when every y is predicted exactly (also when
// all y are equal and so fitted), otherwise 1 - SS_res / SS_tot.
moe_status moe_fit_linear(moe_ctx *ctx, const double *x, const double *y, int n,
                          moe_linear_fit *out);
// The same fit with alpha >= 0 and beta >= 0 (a latency and a time per byte
// cannot be negative; noisy small sizes can tilt the unconstrained line below
// zero): the least-squares line among those, so alpha = 0 (a line through the
// origin) or beta = 0 (the mean) when the unconstrained one is outside.
moe_status moe_fit_linear_nonneg(moe_ctx *ctx, const double *x, const double *y, int n,
                                 moe_linear_fit *out);
// alpha + beta * x.
double moe_fit_eval(const moe_linear_fit *fit, double x);
// y = alpha + beta * x + gamma * w by least squares (n >= 3): for example an
// expert step's time against its FLOPs (x) and the weights it reads (w), so a
// call's fixed cost of streaming its weights is not mistaken for per-FLOP
// work. INVALID_ARG for non-finite points or when x and w are collinear.
moe_status moe_fit_linear2(moe_ctx *ctx, const double *x, const double *w, const double *y, int n,
                           moe_linear_fit *out);
// alpha + beta * x + gamma * w.
double moe_fit_eval2(const moe_linear_fit *fit, double x, double w);

// ---- cluster descriptions ----------------------------------------------------------

// One kind of link, each direction separately.
typedef struct {
  double gbit_per_s;  // bandwidth per direction, Gbit/s (> 0)
  double latency_us;  // one-way latency of a message, microseconds (>= 0)
  char kind[32];      // free text: "PCIe 3.0 x16", "NVLink 4", "InfiniBand EDR"
} moe_link_spec;

// A homogeneous cluster: `nodes` nodes of `devices_per_node` devices.
// Each device has its own intra-node link (up and down) to its node's fabric;
// each node has `nics_per_node` network interfaces (inter links, up and down)
// sharing its inter-node traffic. Traffic between nodes also crosses the
// sending and receiving devices' intra links when inter_uses_intra is 1 (a
// GPU reaching its NIC over the same PCIe link it uses for peers); not when the
// NIC path is separate (NVLink within the node, PCIe to the NIC).
typedef struct {
  char name[64];
  char device[48];       // "RTX 2080 Ti", "V100-PCIe", ...
  char source[384];      // where the description comes from (paper, datasheet)
  int nodes;             // [1, 65536]
  int devices_per_node;  // [1, 1024]; nodes * devices_per_node <= 1 << 20
  double gemm_tflops;    // sustained dense GEMM rate of one device, TFLOP/s (> 0)
  moe_link_spec intra;
  moe_link_spec inter;
  int nics_per_node;     // [1, devices_per_node]
  int inter_uses_intra;  // 0 or 1
} moe_cluster;

// Parses a cluster description. Keys (all required unless marked):
//   "name" (string), "device" (string), "source" (string, optional),
//   "nodes" (int), "devices_per_node" (int), "gemm_tflops" (number),
//   "intra": {"gbit_per_s", "latency_us", "kind" (optional)},
//   "inter": {"gbit_per_s", "latency_us", "kind" (optional)},
//   "nics_per_node" (int, optional, default 1),
//   "inter_uses_intra" (bool, optional, default false).
// Unknown or repeated keys, wrong types, missing keys and out-of-range values
// are INVALID_ARG (BAD_FORMAT for malformed JSON) naming the key and the valid
// range; out is unchanged on error.
moe_status moe_cluster_from_json(moe_ctx *ctx, const char *json, moe_cluster *out);
moe_status moe_cluster_load(moe_ctx *ctx, const char *path, moe_cluster *out);
// Range checks of moe_cluster_from_json on a filled struct.
moe_status moe_cluster_validate(moe_ctx *ctx, const moe_cluster *c);
// The same cluster with `devices` devices: whole nodes of the same size
// (devices must be a multiple of devices_per_node, or smaller than one node,
// which then becomes a single node of `devices` devices).
moe_status moe_cluster_scale(moe_ctx *ctx, const moe_cluster *c, int devices, moe_cluster *out);
static inline int moe_cluster_devices(const moe_cluster *c) {
  return c->nodes * c->devices_per_node;
}

// ---- FasterMoE's models ------------------------------------------------------------

// Eq. 1 (load-aware compute): the slowest device, max_w flops[w] / rate, in
// seconds, for flops (D = devices) FLOPs per device at c->gemm_tflops.
double moe_model_compute_s(const moe_cluster *c, const double *flops);

// Where the busiest link is, from moe_model_alltoall_s.
typedef struct {
  double seconds;     // the model's time
  double max_load_s;  // the busiest link's bytes / bandwidth
  int kind;           // 0 intra up, 1 intra down, 2 inter up, 3 inter down
  int index;          // device (intra) or node (inter) of that link
  double latency_s;   // the latency term added
} moe_link_report;

// Eq. 2 (directed link model): an exchange moving bytes[s * D + d] bytes from
// device s to device d (D = devices; the diagonal is ignored) takes
// max over directed links of (bytes crossing it) / (its bandwidth), plus the
// one-way latency of the slowest path in use (inter if any bytes leave a node,
// else intra; 0 with no traffic). A node's inter links are its NICs together
// (nics_per_node x the inter bandwidth). INVALID_ARG for negative or
// non-finite bytes.
moe_status moe_model_alltoall_s(moe_ctx *ctx, const moe_cluster *c, const double *bytes,
                                moe_link_report *out);

// Eq. 3-6, the DDL-roofline point of a layer (FasterMoE §3.3), per worker:
//   R_CC = lat_comp / lat_comm                                    (eq. 3)
//   achieved = flops_total / (workers * lat_e2e)                  (eq. 4)
//   ideal = peak * min(1, R_CC)                                   (eq. 5)
//   semi-ideal = peak * R_CC / (R_CC + 1)                         (eq. 6)
// All rates in FLOP/s; times in seconds (> 0).
typedef struct {
  double r_cc;
  double achieved_flops, ideal_flops, semi_flops, peak_flops;
} moe_roofline;
moe_status moe_roofline_point(moe_ctx *ctx, double peak_flops, double flops_total, int workers,
                              double lat_comp, double lat_comm, double lat_e2e, moe_roofline *out);

// ---- all-to-all algorithms on a described cluster ---------------------------------

// Time of one all-to-all by algorithm, from the link model (eq. 2) applied
// separately to the intra-node pairs (t_intra) and the inter-node pairs
// (t_inter) of bytes (D x D), and the largest per-device and per-node volumes:
// these fill a moe_a2a_cost_params (include/moe/a2a_catalog.h) and the
// algorithm's own cost model (its catalogue entry's `model`, in
// src/comm/alltoall_<name>.c) gives the time. The shipped ones: sequential
// exchanges t_intra + t_inter (ScheMoE eq. 17: the send/receive pairs one after
// another); Pipe-A2A max(t_intra, t_inter) (eq. 16); 2D hierarchical
// t_all_intra + t_inter (phase 1 moves every byte that leaves a device over the
// intra links, phase 2 the inter-node share; Tutel/DeepSpeed); 1D hierarchical
// 2 t_leader + t_inter (gather to and scatter from the node leader, whose intra
// link carries the node's whole traffic; HetuMoE).
// INVALID_ARG naming the valid algorithms for an unknown name.
moe_status moe_model_a2a_algo_s(moe_ctx *ctx, const moe_cluster *c, const char *algo,
                                const double *bytes, double *seconds);

// ---- compressor throughput ---------------------------------------------------------

// GB/s of float input per device (compress, decompress) of a compressor by
// name ("zfp:12" reads zfp's): the rates its catalogue entry declares
// (moe_compressor_entry.compress_gbs, decompress_gbs: one core of the
// development machine, docs/compression.md). INVALID_ARG for an unknown name.
moe_status moe_codec_rate_default(moe_ctx *ctx, const char *name, double *compress_gbs,
                                  double *decompress_gbs);

// ---- calibrated profiles --------------------------------------------------------------

#define MOE_PROFILE_MAX 16

typedef struct {
  char name[16];
  moe_linear_fit fit;
} moe_named_fit;

// What `moe calibrate` measured on a cluster: its description (devices,
// nodes; link and GEMM numbers from the fits) and the fitted models:
//   gemm          seconds of one GEMM = alpha + beta * FLOPs
//   a2a[name]     seconds of one all-to-all = alpha + beta * bytes one rank sends
//   codec_c/d     seconds to compress / decompress = alpha + beta * input float bytes
// Corrections fitted on whole layer runs (moe_profile_fit_layer, the layer
// step of moe calibrate): the bottom-up models of a profile come from
// micro-benchmarks, which miss what only the layer does (the executor's
// polling between the steps of a nonblocking all-to-all, skew between ranks,
// caches shared with the other buffers). With `have`, the simulator makes a
// compute task (E) last compute_scale x its modelled time + compute_task_s,
// an all-to-all task of the profile's algorithm a2a[i] a2a_scale[i] x
// modelled + a2a_exchange_s[i] (scale 0: no correction for that algorithm),
// both before the executor's task_overhead (the per-task terms may be
// negative down to -task_overhead, when the layer's tasks cost less than that
// measurement), and takes the time outside the passes from `outside`
// (alpha-beta over T M (E + K), measured in the distributed layer) instead of
// the bottom-up sum.
typedef struct {
  int have;
  double compute_scale, compute_task_s;
  moe_linear_fit outside;
  double a2a_scale[MOE_PROFILE_MAX], a2a_exchange_s[MOE_PROFILE_MAX];
  // Contention while algorithm i overlaps compute (compute, comm slowdown),
  // when fitted for it; 0: the profile's slow_compute / slow_comm. A blocking
  // algorithm's communication thread spins and slows compute far more than a
  // polled nonblocking one.
  double a2a_slow[MOE_PROFILE_MAX][2];
  // The same for the smart schedule when fitted apart (0: a2a_slow). Its
  // compute stream waits for every peer step's exchange, so the executor
  // blocks in the exchange for most of it (MOE_WAIT_ADAPTIVE), while a
  // pipelined schedule's exchanges run beside compute and are polled: the
  // two contend differently (on the emulated cluster: smart slows compute,
  // pipelined slows the exchanges).
  double a2a_smart_slow[MOE_PROFILE_MAX][2];
  int samples;  // the layer runs given to the fit, including any it left out as outliers
} moe_layer_corrections;

// Parm's alpha-beta terms (eq. 12): seconds = alpha + beta x elements.
typedef struct {
  double alpha_a2a, beta_a2a;  // one EP&ESP all-to-all of V elements per device
  double alpha_mp, beta_mp;    // one MP-AllGather of the T M elements of s1's output
  double alpha_o, beta_o;      // the SAA pair (all-to-all of V and s2's MP-AllGather), in V
} moe_parm_alpha_beta;

// Parm's terms measured on one layout with one all-to-all (moe calibrate).
typedef struct {
  int mp, ep, esp;  // the layout (DP 1)
  char a2a[32];     // the all-to-all algorithm of its EP&ESP all-to-all
  moe_parm_alpha_beta ab;
} moe_parm_terms;

typedef struct {
  char name[64];
  moe_cluster cluster;
  moe_linear_fit gemm;
  // Optional (have_step_fits, the micro-benchmarks of the layer's steps): one expert's whole
  // forward / backward step (GEMMs, bias, activation) vs its FLOPs (4 n M H / 8 n M H), and the
  // layer work outside the expert passes (gate, softmax, top-k, dispatch, combine and their
  // backward) vs T M (E + K).
  int have_step_fits;
  moe_linear_fit expert_fwd, expert_bwd, outside;
  // Optional measured expert steps: rows, M, H and seconds of forward and
  // backward, used instead of expert_fwd/bwd when present (a GEMM's rate
  // depends on the rows; a table captures that curve, a line cannot).
  int n_expert_points;
  double expert_points[MOE_PROFILE_MAX * 2][5];  // rows, M, H, fwd s, bwd s
  // Contention while a compute task and an all-to-all run at the same time
  // (measured with the executor): each is this many times slower than alone;
  // 1 when absent. The simulator then uses moe_schedule_simulate_shared.
  double slow_compute, slow_comm;
  // Optional measured all-to-all times: per algorithm (same order and names
  // as a2a[]), up to 24 points (bytes sent per rank, seconds); when present
  // the simulator interpolates them (log-log) instead of the alpha-beta line,
  // whose intercept misstates small exchanges.
  int n_a2a_points[MOE_PROFILE_MAX];
  double a2a_points[MOE_PROFILE_MAX][24][2];
  // Fixed cost per task of the executor (hand-off between the streams), s.
  double task_overhead;
  // Optional: the time of one small collective over all ranks (an 8-double
  // allreduce: the layer makes about five per step outside its passes: loss
  // statistics, counts exchange, agreements, gradient reductions), s; and the
  // memory copy bandwidth of one rank, GB/s (the layer copies every row to
  // and from its send order and the expert-major order). 0 when absent.
  double small_collective, copy_gbs;
  // Optional: an all-to-all's slowdown beside a gradient all-reduce started
  // at the same time (moe_measure_contention's fifo over alone; Lina's Table
  // 1 question), >= 1; 0 when absent. moe simulate --lina-train uses it.
  double a2a_allreduce_slowdown;
  int n_a2a;
  moe_named_fit a2a[MOE_PROFILE_MAX];
  int n_codec;
  moe_named_fit codec_c[MOE_PROFILE_MAX], codec_d[MOE_PROFILE_MAX];
  // Optional corrections fitted on whole layer runs (calibrate's layer step).
  moe_layer_corrections layer_fit;
  // Optional: Parm's alpha-beta terms per layout and all-to-all ("parm"; moe
  // calibrate measures the layouts with MP >= 2 whose MP x ESP groups fit in
  // a node); moe train --parm auto uses them for its layout (moe_profile_parm).
  int n_parm;
  moe_parm_terms parm[MOE_PROFILE_MAX];
} moe_profile;

// Profile JSON (written by `moe calibrate`, read by --profile):
//   {"profile_version": 1, "name": "...", "cluster": {cluster description},
//    "gemm": FIT, "a2a": {"mpi": FIT, ...}, "codecs": {"int8": {"compress": FIT,
//    "decompress": FIT}, ...}, optionally "expert_fwd": FIT, "expert_bwd": FIT,
//    "outside": FIT (all three or none), and "expert_points": [[rows, M, H,
//    fwd_s, bwd_s], ...] (at most 32), and "overlap": {"compute_slowdown": x,
//    "comm_slowdown": y} (each >= 1), "a2a_points": {"mpi": [[bytes, s], ...]},
//    "task_overhead_s": t, "small_collective_s": t, "copy_gbs": g,
//    "a2a_allreduce_slowdown": s, "layer_fit":
//    {"samples": n, "compute_scale": s, "compute_task_s": t, "outside": FIT,
//     "a2a": {"mpi": {"scale": s, "exchange_s": t, optionally "compute_slowdown": x,
//     "comm_slowdown": y, optionally "smart_compute_slowdown": x,
//     "smart_comm_slowdown": y}, ...}}}
//   FIT = {"alpha_s": a, "beta_s": b, "r2": r, "points": n}, plus "gamma_s" for
//   the expert fits (seconds per weight element read, see moe_fit_linear2)
// Strict like the cluster parser; INVALID_ARG names the key. A fit needs a
// finite alpha (a small negative intercept is fitting noise), a finite
// beta > 0, r2 <= 1 and points >= 2.
moe_status moe_profile_from_json(moe_ctx *ctx, const char *json, moe_profile *out);
moe_status moe_profile_load(moe_ctx *ctx, const char *path, moe_profile *out);
// INVALID_ARG unless prof describes `ranks` devices and the layer runs EP over
// all of them (ep == ranks): predictions need the ranks the profile measured.
moe_status moe_profile_check_ranks(moe_ctx *ctx, const moe_profile *prof, int ranks, int ep);
// The profile as JSON text (moe_malloc'd, the caller moe_free()s it).
moe_status moe_profile_to_json(moe_ctx *ctx, const moe_profile *p, char **out);
// The fitted all-to-all model of algo, or NULL when the profile has none.
const moe_linear_fit *moe_profile_a2a(const moe_profile *p, const char *algo);
// Parm's terms of layout mp x ep x esp with all-to-all algo, or NULL when the
// profile has none for it.
const moe_parm_alpha_beta *moe_profile_parm(const moe_profile *p, int mp, int ep, int esp,
                                            const char *algo);
// The fitted codec models of a compressor name ("zfp:8" matches "zfp"), or 0.
int moe_profile_codec(const moe_profile *p, const char *name, const moe_linear_fit **compress,
                      const moe_linear_fit **decompress);

// ---- the layer simulator -------------------------------------------------------------

// One variant of an expert-parallel layer on a described cluster: EP over all
// devices, cfg.tokens tokens per device, routing assumed uniform (each device
// sends K T / E rows to every expert, capped at the capacity).
typedef struct {
  moe_layer_config cfg;
  char a2a[32];       // algorithm for moe_model_a2a_algo_s
  char schedule[16];  // moe_schedule_algo_find
  int chunks;         // r (smart: ignored; r = peer groups)
  char compress[32];  // compressor spec ("none", "int8", "zfp:8", ...)
  int compress_backward;
  int group_size;                       // smart's peer group size; 0 = devices per node
  double compress_gbs, decompress_gbs;  // codec throughput; 0 = moe_codec_rate_default
  // Measured models (moe calibrate) instead of the description's: all-to-all
  // by its measured points (else its alpha-beta) on the bytes the busiest
  // device sends, experts by the measured expert points (else the fits),
  // codecs by their fits (a compressor the profile lacks is an error), plus
  // contention and the per-task overhead. NULL: the description's models.
  const moe_profile *profile;
} moe_sim_variant;

typedef struct {
  double fwd_ms, bwd_ms, total_ms;  // predicted layer times
  double outside_ms;                // gate GEMMs (forward + backward), outside the passes
  double pass_ms[2];                // simulated pass makespans, forward and backward
  moe_pass_breakdown breakdown[2];  // compute, comm, overlap, exposed of each pass (ns)
  int chunks;                       // r as run
  double a2a_ms;                    // one unchunked all-to-all of the forward, for reference
  double expert_ms;                 // the unchunked forward expert computation
} moe_sim_result;

// Runs the variant's forward and backward task graphs (moe_chunk_pass_build,
// the same graphs the layer runs) through moe_schedule_simulate_shared
// (contention factors from the profile, else none) with modelled
// durations: A tasks by moe_model_a2a_algo_s on the chunk's traffic, E tasks by
// eq. 1 on the chunk's rows (2 GEMMs forward, 4 backward), C and D tasks by
// the codec throughput, on the slowest device. INVALID_ARG for a config the
// layer would refuse, experts not divisible by the devices, or unknown names.
moe_status moe_simulate_layer(moe_ctx *ctx, const moe_cluster *c, const moe_sim_variant *v,
                              moe_sim_result *out);

// The DDL-roofline point (moe_roofline_point) of a simulated layer variant
// on c: the experts' FLOPs of forward + backward over the whole cluster (every
// device computes its E / D experts' rows from every device, min(K T / E, C)
// per source, 12 M H FLOPs each), the passes' compute and communication busy
// times and the variant's total time from r (moe_simulate_layer on cfg).
void moe_roofline_of_layer(const moe_cluster *c, const moe_layer_config *cfg,
                           const moe_sim_result *r, moe_roofline *out);

// ---- fitting the simulator to whole layer runs ---------------------------------------

// One measured layer variant (moe calibrate's layer step): medians over
// iterations of the slowest rank, in ms.
typedef struct {
  moe_layer_config cfg;  // tokens per device
  char a2a[32];
  char schedule[16];
  int chunks;        // as requested (smart: ignored)
  double comp_ms;    // compute-stream busy time of both passes
  double comm_ms;    // communication-stream busy time of both passes
  double passes_ms;  // forward + backward pass makespans
  double total_ms;   // forward + backward of the layer
} moe_layer_sample;

typedef struct {
  int seq_samples, overlap_samples;  // used for the task corrections / the contention factors
  int at_bound;                      // corrections whose scale hit [0.1, 10]: a poor fit
  double mape_before, mape_after;    // of total_ms over the samples fitted, %
  double r2_after;
  int outliers;              // runs left out of the fit (see moe_profile_fit_layer)
  double outlier_threshold;  // their total's relative error under the first fit exceeded this
} moe_layer_fit_report;

// Fits the profile's layer corrections (see moe_profile) to measured runs on
// the profile's own cluster (uncompressed, tokens per device as simulated):
// - compute: the sequential samples' compute busy time = scale x modelled +
//   per task x E tasks (weighted least squares on relative error, the scale
//   in [0.1, 10]; the busy time includes the executor's overhead per task, so
//   the per-task term, which the simulator adds to that overhead, may be
//   negative down to -task_overhead);
// - each all-to-all algorithm with sequential samples at two or more chunk
//   counts: the same on its communication busy time and A tasks;
// - outside the passes: total - passes against T M (E + K) (moe_fit_linear);
// - the contention factors (slow_compute, slow_comm), when there are at least
//   two samples with an overlapping schedule: the pair in [1, 4] (steps of
//   0.05) with the least squared relative error of
//   their pass makespans; per algorithm, the same on its pipelined samples
//   (every overlapping schedule but smart; all overlapping ones when fewer
//   than two) when it has two (layer_fit.a2a_slow), and on its smart samples
//   when it has two (layer_fit.a2a_smart_slow).
// Then, robustly: a run whose total the fit misses by more than 25% and by
// more than 4 x the median error (a burst of noise on a shared machine) is
// left out and everything is fitted again without it, when such runs are at
// most a quarter of all (rep->outliers; with more, the machine was noisy
// throughout and the report's errors say so).
// Replaces any earlier corrections. INVALID_ARG without two sequential samples
// of distinct chunk counts, or when a sample does not simulate; the profile is
// then unchanged.
moe_status moe_profile_fit_layer(moe_ctx *ctx, moe_profile *pf, const moe_layer_sample *s, int n,
                                 moe_layer_fit_report *rep);

// Layer samples as JSON, so a profile's corrections can be fitted again from
// the runs behind them (moe calibrate --samples / --refit):
//   {"layer_samples_version": 1, "samples": [{"config": {layer config, see
//    moe_layer_config_from_json}, "a2a": "mpi", "schedule": "sequential",
//    "chunks": r, "comp_ms": t, "comm_ms": t, "passes_ms": t, "total_ms": t},
//    ...]}
// The text is moe_malloc'd (the caller moe_free()s it); times are printed so
// that they read back exactly.
moe_status moe_layer_samples_to_json(moe_ctx *ctx, const moe_layer_sample *s, int n, char **out);
// Strict: unknown, repeated or missing keys, an invalid layer config, chunks
// outside [1, 64], times that are not positive and finite or passes above the
// total are INVALID_ARG naming the sample and key. *out is moe_malloc'd (the
// caller moe_free()s it), 1..100000 samples.
moe_status moe_layer_samples_from_json(moe_ctx *ctx, const char *json, moe_layer_sample **out,
                                       int *n);
moe_status moe_layer_samples_load(moe_ctx *ctx, const char *path, moe_layer_sample **out, int *n);

// ---- the planner ------------------------------------------------------------------------

// What to choose: each of a2a, schedule, chunks and compress is either fixed
// or "auto" ("auto" strings; chunks 0). Candidates for auto: the algorithms the
// profile has (without a profile, the catalogue's plannable ones, in its
// order: include/moe/a2a_catalog.h); every registered schedule; r in {1, 2, 4,
// 8} (peer-group schedules: their groups); the catalogue's plannable
// compressors with their default parameter (include/moe/compress.h; "zfp:8"),
// the lossy ones only when allow_lossy is 1 (an explicit lossy compress is the
// caller's choice and always allowed).
typedef struct {
  moe_layer_config cfg;  // tokens per device
  char a2a[32];
  char schedule[16];
  int chunks;
  char compress[32];
  int allow_lossy;
  int compress_backward;
  int group_size;
  const moe_profile *profile;  // measured models, or NULL for the description's
} moe_plan_request;

typedef struct {
  moe_sim_variant best;      // the choice (its profile pointer is the request's)
  moe_sim_result predicted;  // its simulated times
  int candidates;            // how many were simulated
} moe_plan;

// Simulates every candidate on c (moe_simulate_layer) and returns the one with
// the least predicted forward + backward time (ties: the first in the order
// a2a, compressor, schedule, chunks listed above). INVALID_ARG when no
// candidate can run (the message of the last failure).
moe_status moe_plan_layer(moe_ctx *ctx, const moe_cluster *c, const moe_plan_request *req,
                          moe_plan *out);

// ---- shipped cluster descriptions -------------------------------------------------

// ---- Lina's training step, simulated (moe simulate --lina-train; src/perf/lina_train.c) ----

// A GPT-style MoE model on the cluster's devices (every device holds
// `tokens` tokens; EP spans every device, one expert set per device).
typedef struct {
  int layers;             // blocks, 1..1024 [12]
  int moe_every;          // blocks moe_every - 1, 2 moe_every - 1, ... have an MoE FFN [2]
  int model_dim;          // M [768]
  int hidden_dim;         // the experts' hidden size H [3072]
  int dense_hidden;       // the dense FFNs' hidden size, 0: 4 M [0]
  int experts;            // E, a multiple of the devices, 0: one per device [0]
  int top_k;              // [2]
  int tokens;             // per device per step [4096]
  int seq_len;            // the attention's length [1024]
  int vocab;              // the embedding rows (their gradients are summed last) [50257]
  double elem_bytes;      // per activation and gradient element [2: Lina trains in fp16]
  double micro_op_bytes;  // Lina's micro-op [30e6]
  double contention;      // an all-to-all's slowdown beside an all-reduce, >= 1 [1.83: Lina's
                          // median; measure yours with moe bench contention]
  int packing;            // the packing variant's experts-per-device factor, divides the
                          // devices [2]
} moe_lina_train_config;
void moe_lina_train_config_default(moe_lina_train_config *c);

enum {
  MOE_LINA_TRAIN_PACKED = 0,    // one all-reduce after the backward
  MOE_LINA_TRAIN_FIFO = 1,      // the all-reduce beside everything (DeepSpeed: Lina's baseline)
  MOE_LINA_TRAIN_PRIORITY = 2,  // Lina's priority micro-ops and pipelined all-to-all micro-ops
  MOE_LINA_TRAIN_PACKING = 3,   // the same with `packing` times the experts per device
  MOE_LINA_TRAIN_VARIANTS = 4
};
// "packed", "fifo", "priority", "packing"; "?" otherwise.
const char *moe_lina_train_variant_name(int variant);

typedef struct {
  double fwd_ms, bwd_ms;  // the passes (bwd without the all-reduce left after it)
  double ar_exposed_ms;   // the all-reduce left after the backward
  double step_ms;         // fwd + bwd + exposed
  double a2a_ms;          // the all-to-alls' time alone (every one of the step)
  double ar_ms;           // the all-reduce's work at the full link
  int ep;                 // EP size (devices / packing for the packing variant)
  int chunks;             // all-to-all micro-ops per pass (1: not pipelined)
  int moe_blocks;         // the model's MoE blocks
} moe_lina_train_result;

// out (MOE_LINA_TRAIN_VARIANTS): each policy's step. [R] reconstructed
// model (docs/lina.md#simulated-steps). INVALID_ARG names a bad field.
moe_status moe_lina_train_simulate(moe_ctx *ctx, const moe_cluster *cluster,
                                   const moe_lina_train_config *c, moe_lina_train_result *out);

// The model's engine, exposed for its tests: a step as segments in order,
// each compute or all-to-all of `seconds` alone, after which `ready_after`
// seconds of all-reduce work (at the full link) become ready. packed: the
// work after the last segment; fifo: it runs in compute at full speed and
// beside an all-to-all sharing the link (the all-to-all `contention` times
// slower, the all-reduce at 1 - 1/contention of its speed, until it ends);
// priority and packing: it runs in compute, and an all-to-all of d seconds
// takes min(work left, micro_op_s / 2, d (contention - 1)) longer (the
// micro-op in flight, ending beside it as in fifo's fluid model). step_s:
// the end of the last segment plus the work left (exposed_s).
typedef enum { MOE_LINA_SEG_COMPUTE = 0, MOE_LINA_SEG_A2A = 1 } moe_lina_segment_kind;
typedef struct {
  moe_lina_segment_kind kind;
  double seconds, ready_after;
} moe_lina_segment;
moe_status moe_lina_train_timeline(moe_ctx *ctx, const moe_lina_segment *seg, int n, int variant,
                                   double contention, double micro_op_s, double *step_s,
                                   double *exposed_s);

// ---- Parm's schedules, simulated (moe simulate --parm; src/perf/parm_sim.c) ----

// One MoE layer of Parm (INFOCOM'24) on a described cluster, under its three
// schedules (the layer itself: include/moe/parm.h). Layout: devices = DP x MP
// x EP x ESP, device d = ((dp x EP + ep) x ESP + esp) x MP + mp: an MP group is
// MP consecutive devices, an ESP group the next level of consecutive ones;
// the all-to-all group of a device is the EP x ESP devices with its (dp, mp).
// MP peers hold the same T tokens. Loads are the balanced expectation: every
// device routes C = f K T / E rows to every expert (K T / E when dropless).
typedef struct {
  int mp;          // N_MP, >= 1 [1]
  int ep;          // N_EP, >= 1; mp x ep x esp divides the devices (DP: the rest) [1]
  int esp;         // N_ESP, >= 1, divides hidden_dim [1]
  int tokens;      // T = B L per device, [mp, 1 << 30] (s1 gives each MP rank T / MP) [4096]
  int model_dim;   // M, >= 1 [1024]
  int hidden_dim;  // H, >= 1 [4096]
  int experts;     // E, a multiple of ep; 0: the least multiple of ep >= top_k [0]
  int top_k;       // K, [1, E] [2]
  double capacity_factor;  // f in (0, 1e6]; <= 0: dropless (C = K T / E) [1.2]
  double elem_bytes;       // bytes per activation or gradient element, (0, 16] [4: fp32]
} moe_parm_sim_config;
void moe_parm_sim_config_default(moe_parm_sim_config *c);

// Parm's schedules (the one name list: the layer, include/moe/parm.h, the
// simulator and the CLI use it); also the indices of moe_parm_sim_result.sched.
typedef enum { MOE_PARM_BASELINE = 0, MOE_PARM_S1 = 1, MOE_PARM_S2 = 2 } moe_parm_schedule;
#define MOE_PARM_SCHEDULES 3
// "baseline", "s1", "s2"; "?" otherwise.
const char *moe_parm_schedule_name(int s);
// The names above; INVALID_ARG naming them otherwise.
moe_status moe_parm_schedule_parse(moe_ctx *ctx, const char *text, moe_parm_schedule *out);

// One schedule's forward + backward, ms. The parts are each step alone at
// the full links; s2's pair of all-to-all back and MP-AllGather is counted in
// a2a_ms and mp_ms alone and saa_saved_ms is what running them side by side
// (SAA) saved, so total = compute + a2a + esp + mp - saa_saved.
typedef struct {
  double fwd_ms, bwd_ms, total_ms;
  double compute_ms;    // gate and expert GEMMs of both passes
  double a2a_ms;        // EP all-to-alls (baseline) or EP&ESP all-to-alls (s1, s2)
  double esp_ms;        // ESP-AllGather, -AllReduce, -ReduceScatter (baseline)
  double mp_ms;         // MP-AllGather (s1, s2)
  double saa_saved_ms;  // s2: the overlap SAA gained; 0 otherwise
} moe_parm_sim_times;

typedef struct {
  moe_parm_sim_times sched[MOE_PARM_SCHEDULES];
  int dp, experts;          // DP = devices / (MP EP ESP); E as used
  double rows;              // C = f K T / E rows per expert per device (before the MP split)
  double v_elems;           // Parm's V = ESP f K T M / MP: elements an EP&ESP all-to-all sends
  int mp_intra, esp_intra;  // 1 when every MP (ESP) group lies inside one node
} moe_parm_sim_result;

// [R] reconstructed model (docs/parm.md): every collective is an exchange
// matrix over the whole cluster (all groups at once) timed by the directed
// link model (moe_model_alltoall_s): all-to-alls and all-gathers as direct
// exchanges (an all-gather sends its block to every peer), the ESP
// all-reduce and reduce-scatter as 2 (ESP - 1) and ESP - 1 ring steps; GEMMs
// at the cluster's rate (gate 2 T M E, experts 4 rows M H / ESP FLOPs
// forward, twice that backward); s2's SAA as a two-stage pipeline of W = EP
// ESP slices whose middle steps share the links. INVALID_ARG names the bad
// field and its valid range.
moe_status moe_parm_simulate(moe_ctx *ctx, const moe_cluster *cl, const moe_parm_sim_config *c,
                             moe_parm_sim_result *out);

// Fits the three pairs by least squares (moe_fit_linear) to the link model's
// times of each collective on c's layout at T / 4, T / 2, T and 2 T tokens
// (Parm fits measured micro-benchmarks). The model is affine in the bytes,
// so the fit is exact (r2 = 1).
moe_status moe_parm_fit_alpha_beta(moe_ctx *ctx, const moe_cluster *cl,
                                   const moe_parm_sim_config *c, moe_parm_alpha_beta *out);

// Algorithm 1 (ChooseSchedule), eq. 13-14 with V = ESP f K T M / MP:
//   t1 = 2 (alpha_a2a + beta_a2a V) + alpha_mp + beta_mp T M
//   t2 = (alpha_a2a + beta_a2a V) + (alpha_o + beta_o V)
// Returns MOE_PARM_S1 when t1 <= t2 (within a relative 1e-9), else
// MOE_PARM_S2; t1_s and t2_s (may be NULL) get the two, in seconds. The
// compute is left out (Parm's model compares the communication).
int moe_parm_alg1(const moe_parm_alpha_beta *ab, const moe_parm_sim_config *c, double *t1_s,
                  double *t2_s);

// The faster of s1 and s2 by the simulation, compute included (a tie within
// a relative 1e-9: s1, as Algorithm 1): *pick is MOE_PARM_S1 or
// MOE_PARM_S2; res (may be NULL) gets the simulation.
moe_status moe_parm_choose(moe_ctx *ctx, const moe_cluster *cl, const moe_parm_sim_config *c,
                           int *pick, moe_parm_sim_result *res);

// The descriptions of clusters/*.json, compiled into the library.
int moe_cluster_builtin_count(void);
const char *moe_cluster_builtin_name(int i);  // NULL outside [0, count)
// By name (e.g. "schemoe-8x4-rtx2080ti"); INVALID_ARG listing the names.
moe_status moe_cluster_builtin(moe_ctx *ctx, const char *name, moe_cluster *out);

#ifdef __cplusplus
}
#endif
#endif  // MOE_PERF_H
