// Measurement under MPI (the single-process measurements are in
// moe/measure.h): the one harness that runs and times variants of the
// expert-parallel layer (used by `moe bench layer` and by calibration's layer
// step, so the corrections are fitted on runs measured exactly as the
// benchmark reports them), and the calibration of a cluster profile
// (moe_calibrate: the micro-benchmarks, the contention and overhead
// measurements, and the layer step with its fit).
//
// Every function here is collective over the given communicator: every rank
// calls it with the same arguments and every rank returns the same status
// (an error on one rank is agreed, with its message, on all). Numbers are the
// slowest rank's: each measurement is reduced with a maximum over the ranks,
// then the median over repetitions is taken.
//
// Threading: one thread per rank; MPI initialised with MPI_THREAD_MULTIPLE.
#ifndef MOE_MEASURE_MPI_H
#define MOE_MEASURE_MPI_H

#include <mpi.h>
#include <stdio.h>

#include "moe/balance.h"
#include "moe/comm.h"
#include "moe/measure.h"
#include "moe/parallel.h"
#include "moe/parm.h"
#include "moe/perf.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- the layer-variant harness ----------------------------------------------------

// One variant: a parallel config (a2a, schedule, chunks, compress, executor,
// EP size, ranks per node) and, for ScheMoE's task model, the index of its
// baseline variant in the same array (the sequential r = 1 run it is compared
// with; at most its own index, so a baseline runs first), or -1.
typedef struct {
  moe_parallel_config pc;
  int baseline;
  // Load balancing (docs/balance.md; a zeroed field is policy none): with a
  // policy other than none, every
  // iteration starts (inside its timed forward) by all-gathering the last
  // iteration's load (moe_ep_layer_load), stepping a moe_balancer and setting
  // the placement (moe_ep_layer_set_placement; pc.copy_slots must hold
  // balance.slots), whose Trans completes in the forward.
  // balance.cost.flops_per_s <= 0: the rates are measured on the variant's
  // first iteration, which runs without copies (moe_ep_layer_rates).
  moe_balance_config balance;
} moe_measure_variant;

// What one variant measured. Every time is the median over the iterations
// of the slowest rank's value, in ms.
typedef struct {
  int chunks;                       // r as run (smart: its peer groups)
  double fwd_ms, bwd_ms, total_ms;  // wall time of forward, backward, both
  double total_q1, total_q3;        // quartiles of total_ms (noise)
  double fwd_pass[5], bwd_pass[5];  // breakdown: compute, comm, overlap, exposed comm,
                                    // pass makespan (moe_pass_breakdown)
  double kind_ms[2][MOE_CT_KINDS];  // busy time per task kind, forward and backward
  double comp_sum_ms, comm_sum_ms;  // compute and comm busy time of both passes,
  double passes_sum_ms;             // and their makespans, summed per iteration
  double model_ms;                  // ScheMoE's task model: the time outside the passes as the
                                    // baseline measured it plus this variant's graphs and schedules
                                    // simulated with the baseline's per-kind busy times split over
                                    // the chunks; NAN without a baseline
  long long rows, dropped;          // expert rows and dropped choices, all ranks, last iteration
  long long max_rank_rows;          // most rows one rank's experts computed, last iteration
  double balance_ratio;             // max_rank_rows / mean over the ranks (1 = balanced)
  double skew_tv;                   // with mc->skew: the fit's total variation (0 without)
  double balance_ms;                // median time of the balancing step (load, plan, posting Trans)
  double trans_ms;                 // median Trans no compute hid (posting + waiting in the forward)
  int copies;                      // expert copies in force in the last iteration
  moe_balance_step_info bal_plan;  // the last balancing step that planned: predicted_ms,
                                   // predicted_none_ms, auto_ms (NAN without one)
  moe_balance_cost bal_cost;       // the rates the plans used (measured on the first iteration;
                                   // zeros without balancing)
  long long offnode_rows;          // rows sent to ranks on other nodes, all ranks, last iteration
  long long rerouted;  // choices the topology-aware gate re-selected, all ranks, last iteration
} moe_measure_result;

// Creates the n variants' layers for cfg (tokens per rank) over comm, then
// runs them interleaved: every iteration runs each variant once, so a slow
// phase of a shared machine hits every variant alike and their ratios stay
// fair. Inputs: x and dy uniform in [-1, 1) from mc->seed, streams 100 + 2 r
// and 101 + 2 r on rank r. out (n) receives the results. Errors (every rank):
// an invalid config or variant (the layer's message), out of memory, a
// failing pass, an unwritable trace.
moe_status moe_measure_layer_variants(moe_ctx *ctx, MPI_Comm comm, const moe_layer_config *cfg,
                                      const moe_measure_variant *variants, int n,
                                      const moe_measure_config *mc, moe_measure_result *out);
// The bytes moe_measure_layer_variants(cfg, variants, n, mc) allocates on one
// rank of world_size, by category, without allocating: every variant's layer
// (moe_ep_layer_memory, all of them live at once), the inputs x, dy and
// outputs y, dx (activations) and the result tables (workspace). Local (no
// MPI call); INVALID_ARG for an invalid cfg or variant.
moe_status moe_measure_layer_variants_memory(moe_ctx *ctx, int world_size,
                                             const moe_layer_config *cfg,
                                             const moe_measure_variant *variants, int n,
                                             const moe_measure_config *mc, moe_memory_need *out);

// ---- one all-to-all -------------------------------------------------------------------

typedef struct {
  double median_s;          // median over the iterations of the slowest rank's time: the
                            // exchange as the job sees it (moe bench a2a)
  double slowest_median_s;  // the largest of the ranks' own medians (calibration's points)
  int bad;                  // with check: a received byte was wrong on some rank
} moe_measure_a2a_result;

// The bytes an all-to-all benchmark needs on one rank of P (ranks_per_node G,
// 0: all P), by category, for the largest exchange (max_send bytes sent,
// max_recv received): the send and receive buffers and the largest workspace
// of the named algorithms (moe_a2a_algo.workspace_copies x G x the larger
// of the two, doubled for the growth transient; unknown names count 0) as
// all-to-all buffers; the P x P count table, its per-rank rows and
// moe_measure_a2a's tables as workspace. Local; no allocation.
moe_status moe_measure_a2a_memory(moe_ctx *ctx, int P, int ranks_per_node, size_t max_send,
                                  size_t max_recv, const char *const *algos, int n, int iters,
                                  moe_memory_need *out);

// Times an all-to-all over g: algo, or NULL for MPI_Alltoallv on g->comm
// itself (the bare MPI baseline), with this rank's byte counts and
// displacements sc, sd (send) and rc, rd (receive), warmup + iters times,
// each after a barrier. With check, sbuf's blocks are filled with a payload
// encoding (source, destination, index) and every received byte is verified
// after every iteration. Collective over g. INVALID_ARG (every rank) for
// iters < 1 or, bare, counts beyond MPI's int; MOE_STATUS_COMM when an
// exchange fails (peers may wait inside it: the caller should MPI_Abort).
moe_status moe_measure_a2a(moe_ctx *ctx, const moe_group *g, const moe_a2a_algo *algo,
                           const size_t *sc, const size_t *sd, const size_t *rc, const size_t *rd,
                           unsigned char *sbuf, unsigned char *rbuf, moe_workspace *ws, int iters,
                           int warmup, int check, moe_measure_a2a_result *out);

// ---- an all-to-all beside gradient sums (Lina's Table 1 question) ---------------------

typedef struct {
  size_t a2a_bytes;       // bytes each rank sends per all-to-all, evenly to every rank [1 MiB]
  int layers;             // all-to-alls per round, each followed by a gap, 1..1000 [4]
  double gap_ms;          // the gap after each (the experts' compute), 0..60000 ms [5]
  size_t sum_bytes;       // gradients summed beside them, <= 4 GiB (0: none) [4 MiB]
  size_t bucket_bytes;    // their buckets (0: one) [0]
  size_t micro_op_bytes;  // Lina's micro-ops (0: a bucket per operation) [256 KiB]
  int deterministic;      // the reducer's sum: 1 the fixed-order tree, 0 MPI_Iallreduce [1]
  int rounds, warmup;     // timed and untimed rounds, 1..100000 and 0..1000 [10, 2]
} moe_contention_config;
void moe_contention_config_default(moe_contention_config *c);

enum {
  MOE_CONTENTION_ALONE = 0,  // the all-to-alls and gaps only
  MOE_CONTENTION_FIFO = 1,   // the sums started at once, a bucket per operation (DDP-style)
  MOE_CONTENTION_LINA = 2,   // Lina: micro-ops, started only in the gaps
  MOE_CONTENTION_MODES = 3
};
// "alone", "fifo", "lina"; "?" otherwise.
const char *moe_contention_mode_name(int mode);

// One mode's figures: medians (and quartiles) of the slowest rank's values, in ms.
typedef struct {
  int ran;                              // 0: a sum mode with nothing to sum
  double a2a_ms, a2a_q1, a2a_q3;        // one all-to-all (every one of every round)
  double round_ms, round_q1, round_q3;  // a round: all-to-alls, gaps, the sum's rest
  double sum_wait_ms;                   // waiting for the sum after the last gap
  int micro_ops;                        // the sum's operations in the last round
  int sum_bad;                          // a sum differed from the exact one on some rank
} moe_contention_result;

// Times `layers` all-to-alls of algo over g, each followed by a gap of
// gap_ms, alone and beside a sum of sum_bytes of gradients (ready when the
// round starts) over g->comm, FIFO and with Lina's priority (docs/lina.md),
// the three modes interleaved round by round, warmup + rounds times. out
// (MOE_CONTENTION_MODES) receives each mode's figures. Collective over g;
// INVALID_ARG (every rank) for a config out of range; MOE_STATUS_COMM when an
// exchange fails (peers may wait inside it: the caller should MPI_Abort).
moe_status moe_measure_contention(moe_ctx *ctx, const moe_group *g, const moe_a2a_algo *algo,
                                  const moe_contention_config *c, moe_contention_result *out);
// The bytes moe_measure_contention(c) allocates on one rank of P, by category,
// without allocating: the all-to-all's send and receive buffers and its
// algorithm's workspace (ranks_per_node G as moe_measure_a2a_memory) as
// all-to-all buffers; the gradients, the two reducers' packed copies and
// receive buffers and the tables as workspace. Local; INVALID_ARG for a
// config out of range.
moe_status moe_measure_contention_memory(moe_ctx *ctx, int P, int ranks_per_node,
                                         const moe_a2a_algo *algo, const moe_contention_config *c,
                                         moe_memory_need *out);

// ---- Parm's schedules (moe bench parm) ---------------------------------------------------

// The variants one Parm layer is timed in, round by round interleaved (the
// first three: the moe_parm_schedule of the same value).
enum {
  MOE_PARM_RUN_BASELINE = 0,  // DeepSpeed-MoE's schedule
  MOE_PARM_RUN_S1 = 1,
  MOE_PARM_RUN_S2 = 2,      // the MP-AllGather after the all-to-all back
  MOE_PARM_RUN_S2_SAA = 3,  // overlapped with it (SAA)
  MOE_PARM_RUNS = 4
};
// "baseline", "s1", "s2", "s2+saa"; "?" otherwise.
const char *moe_parm_run_name(int run);

typedef struct {
  int warmup;     // untimed rounds [2], [0, 1000]
  int rounds;     // timed rounds [7], [1, 100000]
  uint64_t seed;  // parameters and tokens [1]
} moe_parm_bench_config;
void moe_parm_bench_config_default(moe_parm_bench_config *c);

// One variant's figures: medians over the rounds of the slowest rank's ms.
typedef struct {
  double fwd_ms, bwd_ms, total_ms, total_q1, total_q3;
  double a2a_ms, mp_ms, esp_ms, expert_ms;  // forward + backward
  double max_rel_diff;  // outputs and dx against the baseline's (max over ranks and rounds)
  int dropped;          // choices dropped in a forward (max over ranks)
} moe_parm_run_result;

// Times the layer cfg with pc's layout and all-to-all in the MOE_PARM_RUNS
// variants (pc.schedule and pc.saa are ignored; one layer switched between
// schedules), a forward and a backward per variant and round, each pass
// started after a barrier. Every data part has cfg.tokens tokens (MP peers
// the same). Collective over world; errors agreed on every rank.
moe_status moe_measure_parm(moe_ctx *ctx, MPI_Comm world, const moe_layer_config *cfg,
                            const moe_parm_config *pc, const moe_parm_bench_config *bc,
                            moe_parm_run_result *out);

// The bytes one rank of moe_measure_parm needs: the layer's
// (moe_parm_layer_memory) and the benchmark's six token buffers.
moe_status moe_measure_parm_memory(moe_ctx *ctx, const moe_layer_config *cfg,
                                   const moe_parm_config *pc, int world_size, moe_memory_need *out);

// ---- moe bench parm's grid: one row per layer shape and layout ----------------------------

typedef struct {
  moe_layer_config cfg;
  moe_parm_config pc;
  moe_parm_run_result r[MOE_PARM_RUNS];  // moe_measure_parm's
  int layout;                            // which of the grid's layouts (its alpha-beta terms)
  // moe_parm_grid_judge's:
  int alg1;             // Algorithm 1's pick (MOE_PARM_S1 or MOE_PARM_S2)
  double t1_ms, t2_ms;  // its two predictions
  int faster;           // measured: MOE_PARM_S1 or MOE_PARM_S2 (s2 with SAA); -1 within noise
  double max_diff;      // the largest max_rel_diff of the variants
} moe_parm_grid_row;

// The default layouts on P ranks (layouts[i] = MP, EP, ESP; at most 4): MP
// and ESP in {1, 2} where they divide P, EP the rest (DP = 1). Returns the count.
int moe_parm_grid_default_layouts(int P, int layouts[][3]);

// The range moe_measure_parm_alpha_beta fits layout `layout`'s terms over: the
// rows per EP rank of its rows' shapes (s2's part: f K T / (EP MP), f = 1
// dropless) from *rows_lo to *rows_hi (at least twice rows_lo), and the
// widest model_dim.
void moe_parm_grid_ab_range(const moe_parm_grid_row *rows, int n, int layout, int *rows_lo,
                            int *rows_hi, int *width);

// Fills row's alg1, t1_ms, t2_ms (Algorithm 1 on ab), faster (which of s1 and
// s2 + SAA the measurement found faster: their quartile ranges apart, else
// -1) and max_diff.
void moe_parm_grid_judge(moe_parm_grid_row *row, const moe_parm_alpha_beta *ab);

typedef struct {
  double lo[3], hi[3];  // speedups over the baseline of s1, s2, s2+SAA: range over the rows
  // Algorithm 1 on the rows with MP > 1: right of judged (s1 and s2+SAA apart), noise (not)
  int judged, right, noise;
  double worst_s2;  // the largest max_rel_diff of s2 and s2+SAA (they keep the math)
} moe_parm_grid_summary;
void moe_parm_grid_summarize(const moe_parm_grid_row *rows, int n, moe_parm_grid_summary *out);

// The grid as JSON (docs/parm.md): ranks, all-to-all, rounds, the chunks,
// task schedule and compressor of s1 and s2's EP&ESP pass (the first row's),
// and every row with its variants.
void moe_parm_grid_write_json(FILE *f, const moe_parm_grid_row *rows, int n, int ranks,
                              const char *a2a, const moe_parm_bench_config *bc);

// Parm's alpha-beta terms (moe_parm_alpha_beta, eq. 12) measured on pc's
// layout (its MP, EP, ESP groups and all-to-all): the EP&ESP all-to-all of V
// elements per rank, the MP-AllGather of n elements in all, and the SAA pair
// (that all-to-all's way back overlapped with an MP-AllGather of V / ESP
// elements a rank, as the layer's s2 does), each timed (slowest rank, median
// of rounds) at `points` sizes from model_dim-wide rows (rows_lo .. rows_hi
// rows per EP rank, geometric) and fitted by least squares. fits (3, may be
// NULL) get the fits with their r2. Collective over world.
moe_status moe_measure_parm_alpha_beta(moe_ctx *ctx, MPI_Comm world, const moe_parm_config *pc,
                                       int model_dim, int rows_lo, int rows_hi, int points,
                                       int rounds, moe_parm_alpha_beta *out, moe_linear_fit *fits);

// ---- calibration ----------------------------------------------------------------------

// Receives calibration's report, one line at a time (no newline), on rank 0
// only: what each step measured and fitted, and warnings.
typedef void (*moe_calibrate_log_fn)(void *user, const char *line);

typedef struct {
  const char *name;                // profile and cluster name; NULL: "calibrated-<ranks>"
  int ranks_per_node;              // pretend every N consecutive ranks share a node (0: real nodes)
  const char *a2a;                 // comma-separated algorithms or "all" (those that run here)
  const char *compress;            // comma-separated compressors or "all"
  long long min_bytes, max_bytes;  // all-to-all sizes per rank, doubling; max >= 4 x min
  int iters;                       // timed repetitions per point, 1..1000
  // The layer step: shapes "T:M:H:f,..." of the expert-parallel layer (E = 2 x
  // ranks, K = 2; f 0 = dropless) run with every calibrated all-to-all, or NULL
  // to skip it (no layer corrections).
  const char *layers;
  moe_calibrate_log_fn log;  // may be NULL
  void *log_user;
} moe_calibrate_config;

// Defaults: a2a and compress "all", 4 KiB .. 8 MiB, 5 iterations, the layer
// step on MOE_CALIBRATE_DEFAULT_LAYERS, no log.
#define MOE_CALIBRATE_DEFAULT_LAYERS \
  "256:256:512:1.1,512:256:1024:1.1,256:512:1024:1.1,384:384:768:1.1"
moe_calibrate_config moe_calibrate_config_default(void);

// Checks cfg without measuring (not collective): ranges, the shape list for
// `ranks` ranks. INVALID_ARG naming the option and its valid range.
moe_status moe_calibrate_config_check(moe_ctx *ctx, const moe_calibrate_config *cfg, int ranks);

// The bytes moe_calibrate(cfg) allocates at most on one rank of P, by
// category, without allocating: the largest of its steps, the all-to-all
// buffers and workspace (max_bytes a rank) held from the all-to-all fits on
// beside each later step (contention, copies, compressors, Parm's terms on
// every layout it may measure, the layer step's variants of each shape).
// Without ranks_per_node the node is taken as all P ranks (an upper bound).
// Local; INVALID_ARG for an invalid cfg (moe_calibrate_config_check).
moe_status moe_calibrate_memory(moe_ctx *ctx, int P, const moe_calibrate_config *cfg,
                                moe_memory_need *out);

// Measures this cluster and fills *prof: the GEMM, expert and outside fits,
// every selected all-to-all and compressor, contention, the executor's
// per-task cost, a small collective and the copy bandwidth, the cluster
// description, and (cfg->layers) the layer corrections fitted to runs of the
// layer made with moe_measure_layer_variants (moe_profile_fit_layer). With
// samples non-NULL, *samples (moe_malloc'd, the caller frees) and *n_samples
// receive the layer runs (NULL, 0 without a layer step). A failure inside an
// all-to-all leaves peers inside the exchange: the status is then
// MOE_STATUS_COMM and the caller should MPI_Abort.
moe_status moe_calibrate(moe_ctx *ctx, MPI_Comm comm, const moe_calibrate_config *cfg,
                         moe_profile *prof, moe_layer_sample **samples, int *n_samples);

// Fits prof's layer corrections to n layer runs (moe_profile_fit_layer) and
// reports the fit through log (rank-0 callers pass it; NULL: silent). refit
// says the contention factors before the fit are an earlier fit's, not the
// executor measurement's. No MPI needed.
moe_status moe_calibrate_fit_layer(moe_ctx *ctx, moe_profile *prof, const moe_layer_sample *s,
                                   int n, int refit, moe_calibrate_log_fn log, void *log_user);

#ifdef __cplusplus
}
#endif

#endif  // MOE_MEASURE_MPI_H
