// libmoe load balancing: the expert-copy placements of FasterMoE (shadowing)
// and Pro-Prophet (lightweight expert placement), EPLB-style redundant slots,
// and the performance models they are planned with. Pure C, no MPI: every
// rank gives the same counts and gets the same bitmap, bit for bit (integer
// arithmetic, or double arithmetic in a fixed order; ties go to the lowest
// index; no randomness).
//
// The mechanism's rule (docs/balance.md). E experts on the P ranks of an EP
// group, block placement: home(e) = e / (E / P). A placement is a bitmap
// replica (E, P): replica[e * P + p] = 1 when rank p holds a copy of expert e,
// never set for p = home(e). A copy on p computes ONLY rank p's own tokens for
// e (they leave the all-to-all); its parameters are sent from home before the
// forward (Trans) and its gradients reduced to home after the backward (Agg).
// The load is counts (P, E): counts[src * E + e] = rows rank src sends to
// expert e (after capacity).
//
// What this is not: the run-time mechanism that moves copies each step
// (include/moe/parallel.h: moe_ep_layer_set_placement) or its MPI; this
// header plans, and keeps a balancer's state for checkpoints.
//
// Threading: every function is reentrant; a moe_ctx is used by one thread at a
// time. A moe_balance_window is used by one thread at a time.
#ifndef MOE_BALANCE_H
#define MOE_BALANCE_H

#include <stddef.h>
#include <stdint.h>

#include "moe/core.h"
#include "moe/layer.h"
#include "moe/perf.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- load, rows, traffic -------------------------------------------------------------

// The largest count of a load: 2^40 rows (far above any step's tokens), so
// that sums over ranks and a window's steps stay exact in int64.
#define MOE_BALANCE_COUNT_MAX ((int64_t)1 << 40)

// One step's routing load of an EP group. counts is (P, E), read only, owned by
// the caller; every entry in [0, MOE_BALANCE_COUNT_MAX].
typedef struct {
  int num_experts;        // E, >= 1, divisible by P
  int num_ranks;          // P, >= 1
  const int64_t *counts;  // (P, E): counts[src * E + e]
} moe_balance_load;

// The home rank of expert e under block placement: e / (E / P).
static inline int moe_balance_home(int num_experts, int num_ranks, int expert) {
  return expert / (num_experts / num_ranks);
}

// Checks a load and (when not NULL) a bitmap: INVALID_ARG naming the value and
// its valid range for P < 1, E < 1, E not divisible by P, NULL counts, a
// count out of [0, MOE_BALANCE_COUNT_MAX], a bitmap entry other than 0 or 1, or a copy on its home.
moe_status moe_balance_check(moe_ctx *ctx, const moe_balance_load *load, const uint8_t *replica);

// rows (P): the rows each rank computes under the rule above; replica (E, P)
// or NULL (no copies). rows is written by the caller's buffer.
moe_status moe_balance_rows(moe_ctx *ctx, const moe_balance_load *load, const uint8_t *replica,
                            int64_t *rows);

// max / mean of rows (P): 1.0 when every entry is 0 (or P < 1).
double moe_balance_ratio(const int64_t *rows, int num_ranks);

// The all-to-all under the rule: sent (P) = rows rank p sends to other ranks,
// recv (P) = rows rank p receives from other ranks (a row computed where it
// is, by its home or a copy, is not sent). Either output may be NULL. Bytes on
// the wire per pass are rows x M x act_bytes.
moe_status moe_balance_traffic(moe_ctx *ctx, const moe_balance_load *load, const uint8_t *replica,
                               int64_t *sent, int64_t *recv);

// ---- costs and predictions -----------------------------------------------------------

// The numbers the models need. Times come out in milliseconds.
typedef struct {
  double flops_per_s;         // expert GEMM rate of one rank, FLOP/s (> 0)
  double net_bytes_per_s;     // per-rank network bandwidth, bytes/s (> 0)
  int model_dim;              // M (>= 1)
  int hidden_dim;             // H (>= 1)
  int act_bytes;              // bytes per activation element on the wire (>= 1; fp32: 4)
  double expert_param_bytes;  // one expert's parameters = its gradients' bytes (>= 0)
  double fnec_ms, bnec_ms;    // Pro-Prophet's non-MoE forward / backward compute
                              // beside the layer (eq 8); 0 = unknown (no overlap)
  // The EP group's node layout for eq 6 / 8 (not FasterMoE's model). 0: the
  // papers' form (every rank its own node: T_A2A over every row a rank
  // receives, Trans spread evenly over the P links). g >= 1:
  // rank p sits on node p / g, and only what crosses nodes is charged, each
  // rank at its own link of net_bytes_per_s (full duplex):
  //   T_A2A = max_i max(rows i sends off-node, rows i receives off-node) M act_bytes / W
  //   T_Trans = T_Agg = max_i max(copies i sends off-node, copies i receives
  //             off-node) param_bytes / W
  // (a copy's home sends its parameters to each copy, so the home of a hot
  // expert copied to every node pays all of them, not 1/P of them). g >= P
  // (one node) charges nothing to the network. Set from the layer's nodes
  // (moe_ep_layer_ranks_per_node) by the runs that measure the rates.
  int ranks_per_node;
  // Ranks of the group that compute at once (every model): 0, or >= P, when
  // each rank has its own core or device; fewer when ranks share cores (4
  // ranks on 2 cores: 2). The compute term then takes
  //   max(max_i H_i, sum_i H_i / compute_slots)
  // rows instead of max_i H_i: moving rows off the busiest rank shortens the
  // step only down to the shared cores' total. Set from the machine
  // (moe_ep_layer_compute_slots) by the runs that measure the rates.
  double compute_slots;
} moe_balance_cost;

// FasterMoE's code defaults (shadow_policy.global_policy): flops_per_s =
// 11.5e12 (bw_mm), net_bytes_per_s = 50e9 / 8 = 6.25e9 (bw_net, 50 Gb/s),
// act_bytes = 4, expert_param_bytes = (2 M H + H + M) x 4 (W1, W2, b1, b2 in
// fp32), fnec_ms = bnec_ms = 0. M and H are stored as given (not checked
// here; the planners check them).
void moe_balance_cost_default(moe_balance_cost *cost, int model_dim, int hidden_dim);

// The defaults with the rates of a calibrated profile: flops_per_s = 1 / the
// GEMM fit's slope (s/FLOP), net_bytes_per_s = 1 / the slope of the all-to-all
// fit of `a2a` (s/byte one rank sends; NULL: the profile's first). INVALID_ARG
// when the profile has no such fit or a slope is not > 0.
moe_status moe_balance_cost_from_profile(moe_ctx *ctx, const moe_profile *prof, const char *a2a,
                                         int model_dim, int hidden_dim, moe_balance_cost *cost);

// The models a prediction follows (ALGORITHMS.md §3 and §4 name the equations).
typedef enum {
  // FasterMoE eq 7 / eq 8, with B_w = rows computed on rank w, r = experts
  // with at least one copy, F = flops_per_s, W = net_bytes_per_s:
  //   max_w { 3 x 4 M H B_w / F + 4 B_w M act_bytes / W } + 2 r param_bytes / W
  // (r = 0 is eq 7's Lat_imbl; r > 0 is Lat_shadow(r, B'), the broadcast of
  // the parameters plus the reduce of the gradients. The feature term stays as
  // in FasterMoE's code, which charges 4 B_(k+1) feature sends after
  // shadowing k experts.)
  MOE_BALANCE_MODEL_FASTERMOE = 0,
  // Pro-Prophet eq 6: T' = 4 T_A2A + 3 T_FEC + T_Trans + T_Agg with
  //   T_A2A = max_i R_i M act_bytes / W       (R_i: rows i receives, eq 1)
  //   T_FEC = max_i H_i 4 M H / F             (H_i: rows i computes, eq 2)
  //   T_Trans = T_Agg = c param_bytes / (P W) (c: copies in the bitmap, the
  //   paper's s (D - n) when each of s experts goes to D - n ranks; eq 4, 5)
  // (with cost.ranks_per_node > 0, T_A2A and T_Trans per link, above)
  MOE_BALANCE_MODEL_PROPHET,
  // Pro-Prophet eq 8 (with its scheduler): as eq 6 with
  //   T_PTrans = max(0, T_Trans - T_FEC - fnec_ms),
  //   T_PAgg = max(0, T_Agg - 2 T_FEC - bnec_ms)
  MOE_BALANCE_MODEL_PROPHET_SCHED,
  MOE_BALANCE_MODEL_COUNT_  // number of models (not a model)
} moe_balance_model;

// Predicted time of one forward + backward of the layer under a placement
// (replica (E, P) or NULL), in ms. INVALID_ARG for a bad load or bitmap (see
// moe_balance_check), a cost with a value out of range, or an unknown model.
moe_status moe_balance_predict(moe_ctx *ctx, const moe_balance_load *load, const uint8_t *replica,
                               const moe_balance_cost *cost, moe_balance_model model, double *ms);

// ---- policies -----------------------------------------------------------------------

// The catalogue of balancing policies, one X(ENUM, name) line each: the one
// source of the enum, the names and the lists printed in messages. (`auto`,
// choosing a policy from the models, comes later: it will be one more line.)
#define MOE_BALANCE_POLICIES(X) \
  X(NONE, none)                 \
  X(SHADOW, shadow)             \
  X(PROPHET, prophet)           \
  X(EPLB, eplb)                 \
  X(AUTO, auto)

#define MOE_BALANCE_POLICY_ENUM_(U, l) MOE_BALANCE_##U,
typedef enum {
  MOE_BALANCE_POLICIES(MOE_BALANCE_POLICY_ENUM_) MOE_BALANCE_POLICY_COUNT_
} moe_balance_policy;
#undef MOE_BALANCE_POLICY_ENUM_

// The policy called `name` (a moe_balance_policy), or -1 (also for NULL).
int moe_balance_policy_find(const char *name);
// The name of a policy, or NULL when out of range.
const char *moe_balance_policy_name(int policy);
// "none, shadow, prophet, eplb, auto": every name, in catalogue order (static).
const char *moe_balance_policy_names(void);

// ---- planners -----------------------------------------------------------------------
//
// Each planner clears replica (E, P) (caller-owned, E x P bytes), writes its
// placement and the placement's predicted time (*ms, may be NULL). A copy is
// only placed where it changes something (counts[p][e] > 0), never on home;
// the empty placement is returned when nothing beats it. Scratch is taken
// with moe_malloc and freed before returning; nothing else is allocated.
// INVALID_ARG for a bad load (moe_balance_check) or cost, or an argument out
// of range (named); OUT_OF_MEMORY when scratch cannot be allocated.

// FasterMoE Algorithm 1 (SelectShadowExperts), MOE_BALANCE_MODEL_FASTERMOE:
// experts in descending total load (ties: lowest index); shadowing one gives
// it a copy on every rank other than home that sends it tokens; it is kept
// while the predicted latency drops strictly, and the search stops at the
// first expert that does not lower it.
moe_status moe_balance_plan_shadow(moe_ctx *ctx, const moe_balance_load *load,
                                   const moe_balance_cost *cost, uint8_t *replica, double *ms);

// Defaults of moe_balance_plan_prophet's n and alpha.
#define MOE_BALANCE_PROPHET_N_DEFAULT (-1)
#define MOE_BALANCE_PROPHET_ALPHA_DEFAULT 0.1

// Pro-Prophet Algorithm 1 (greedy), with model MOE_BALANCE_MODEL_PROPHET
// (eq 6) or MOE_BALANCE_MODEL_PROPHET_SCHED (eq 8). While the rows H are not
// balanced (eq 7: max(H) - min(H) < alpha I / E, I = total rows; also stops
// when I = 0): take the heaviest rank (lowest index on ties) and its heaviest
// not-yet-used home expert by total load (generalising the paper's one expert
// per rank to E/P; none left ends the loop); BottomK(counts[:, e], n): the n
// ranks other than home sending fewest rows to e (ties: lowest rank) get no
// copy, the others that send e rows get one; evaluate T'. The returned
// placement is the prefix of additions with the lowest T' (strictly below the
// empty placement's, and with max(H) no higher than without copies).
// n in [0, P - 2], or -1: run the greedy for every n in 0..P-2 and keep the
// lowest T' (ties: the smallest n). alpha > 0 and finite.
moe_status moe_balance_plan_prophet(moe_ctx *ctx, const moe_balance_load *load,
                                    const moe_balance_cost *cost, moe_balance_model model, int n,
                                    double alpha, uint8_t *replica, double *ms);

// EPLB-style redundant slots: every rank holds at most `slots` copies
// (0 <= slots <= E - E/P). Greedy: take the experts in descending load per
// copy (total rows / (1 + copies); ties: lowest index); the first whose next
// copy can lower the pair (max per-rank rows, number of ranks at that max)
// gets it, on the rank (a free slot, no copy of it yet, not home, sends it
// rows) that lowers the pair the most (ties: lowest rank); stop when no copy
// lowers it or the slots run out. The returned placement is the prefix of
// copies with the lowest predicted time under `model` (each copy costs a
// Trans and an Agg per step under this mechanism): a copy is kept only while
// it lowers the prediction.
moe_status moe_balance_plan_eplb(moe_ctx *ctx, const moe_balance_load *load,
                                 const moe_balance_cost *cost, moe_balance_model model, int slots,
                                 uint8_t *replica, double *ms);

// Lina's resource allocation (ATC'23, section 5, inference; [R] on this
// mechanism): expert e gets d_e = round(P x its share of the load), at least 1
// and at most P, devices (Lina eq. 1: n_e = N x estimated share); the
// unpopular ones stay on their homes, packed E/P per rank as the homes are
// (Lina's first-fit-decreasing packing of the rest, at most 4 per device:
// the block placement already packs them). A popular expert's d_e - 1
// copies go to the ranks that send it the most rows (ties: lowest rank),
// among those with a free slot (at most `slots` copies per rank, 0 <= slots
// <= E - E/P), not its home, sending it rows, and left computing no more
// rows than its home does before the copy (a copy never makes the busier of
// the two busier: rows counted under the copies placed so far); experts are
// served in descending d_e, then total load, then index. No time model: the
// copies are the allocation. INVALID_ARG for a bad load or slots out of range.
moe_status moe_balance_plan_lina(moe_ctx *ctx, const moe_balance_load *load, int slots,
                                 uint8_t *replica);

// `auto`: the plans of shadow, prophet and eplb (each fitted to `slots`
// copies per rank, as moe_balancer does; prophet and eplb planned with
// `model`, or eq 6 when it is FasterMoE's) and no copies, evaluated under
// `model`; writes the one with the least predicted time (ties: the earlier
// of none, shadow, prophet, eplb) and its policy in *chosen (may be NULL).
moe_status moe_balance_plan_auto(moe_ctx *ctx, const moe_balance_load *load,
                                 const moe_balance_cost *cost, moe_balance_model model, int slots,
                                 uint8_t *replica, double *ms, int *chosen);

// ---- a window of recent loads ---------------------------------------------------------

// A ring of the last W count matrices (P, E), all allocated by _init; _push
// and _mean allocate nothing. The planners are given a window's mean (the
// load changes little between steps, Pro-Prophet's locality).
typedef struct {
  int num_experts, num_ranks;  // E, P
  int capacity;                // W
  int count;                   // matrices held, <= W
  int next;                    // the slot the next _push writes
  int64_t *ring;               // (W, P, E)
  int64_t *sum;                // (P, E): sum of the held matrices
} moe_balance_window;

// INVALID_ARG for E, P as moe_balance_check, or W < 1.
moe_status moe_balance_window_init(moe_ctx *ctx, moe_balance_window *win, int num_experts,
                                   int num_ranks, int window);
void moe_balance_window_free(moe_balance_window *win);  // NULL or zeroed is a no-op
// Adds counts (P, E), replacing the oldest when full. INVALID_ARG for NULL or
// a count out of [0, MOE_BALANCE_COUNT_MAX] (the window is then unchanged).
moe_status moe_balance_window_push(moe_ctx *ctx, moe_balance_window *win, const int64_t *counts);
// The mean of the held matrices into out (P, E): rounded to the nearest
// integer, halves up (int64), or exact sum / count (double). All zeros when
// nothing was pushed yet.
void moe_balance_window_mean(const moe_balance_window *win, int64_t *out);
void moe_balance_window_mean_f64(const moe_balance_window *win, double *out);

// ---- a policy driven step by step -------------------------------------------------------
//
// moe_balancer turns the loads of the steps run so far into the placement of
// the next step, identically on every rank given the same counts (plan from
// all-gathered counts: moe_ep_layer_load). The caller applies the placement
// (moe_ep_layer_set_placement) before the next forward.

typedef struct {
  int policy;               // moe_balance_policy
  int replan_every;         // plan every N steps, >= 1 [1]; between plans the placement stays
  int window;               // steps of load averaged for the plan, >= 1 [1; eplb 10]
  int slots;                // copies a rank may hold (the layer's copy_slots), >= 0; eplb's R
  int prophet_n;            // Pro-Prophet's n [MOE_BALANCE_PROPHET_N_DEFAULT]
  double prophet_alpha;     // Pro-Prophet's alpha [MOE_BALANCE_PROPHET_ALPHA_DEFAULT]
  moe_balance_model model;  // prophet, eplb and auto [MOE_BALANCE_MODEL_PROPHET: eq 6, Trans
                            // and Agg charged in full; eq 8 measured no better, see balancer.c]
  moe_balance_cost cost;    // the machine's rates (moe_balance_cost_default / _from_profile)
} moe_balance_config;

// Defaults for policy (see the fields) on a layer of M, H with `slots` copy
// slots per rank.
void moe_balance_config_default(moe_balance_config *cfg, int policy, int model_dim, int hidden_dim,
                                int slots);

typedef struct moe_balancer moe_balancer;

typedef struct {
  int planned;                       // 1: this step ran the planner (else the last plan was kept)
  int copies;                        // copies in the placement returned
  double predicted_ms;               // the model's prediction for the placement returned (fitted to
                                     // the slots; NAN when not planned)
  double predicted_none_ms;          // the same model's prediction without copies for the load
                                     // planned from (NAN when not planned): predicted_none_ms /
                                     // predicted_ms is the speedup the plan was chosen for
  double ratio_before;               // balance ratio of the step's load without copies
  double ratio_after;                // ... and under the placement returned (moe_balance_rows)
  double plan_ms;                    // wall time of this call
  int chosen;                        // auto: the policy whose plan it took (else the policy itself)
  double auto_ms[MOE_BALANCE_AUTO];  // auto, when it planned: each candidate's prediction
                                     // (by policy: none, shadow, prophet, eplb); else NAN
} moe_balance_step_info;

// Allocates everything the steps use (window, scratch). INVALID_ARG for an
// unknown policy, E not divisible by P, or a field out of range (named).
moe_status moe_balancer_create(moe_ctx *ctx, const moe_balance_config *cfg, int num_experts,
                               int num_ranks, moe_balancer **out);
void moe_balancer_destroy(moe_balancer *b);  // NULL is a no-op
// Replaces the rates the plans use (rates measured once the first steps have
// run). INVALID_ARG for a cost out of range (the balancer keeps its own).
moe_status moe_balancer_set_cost(moe_balancer *b, const moe_balance_cost *cost);
// counts (P, E): the step just run. replica (E, P): the next step's
// placement (kept from the last plan between plans; empty for `none`). A
// plan with more copies on a rank than cfg.slots drops that rank's copies
// that take the fewest rows until it fits. info may be NULL. Allocates only
// the planners' scratch, freed before returning.
moe_status moe_balancer_step(moe_balancer *b, const int64_t *counts, uint8_t *replica,
                             moe_balance_step_info *info);
// The placement in force (E, P): the last plan's, all zeros before one.
// Owned by b; NULL for NULL.
const uint8_t *moe_balancer_placement(const moe_balancer *b);

// The balancer's state for a checkpoint (what a resumed run needs to place
// the same copies as the uninterrupted one: the steps seen, the load window,
// the placement in force and the rates): moe_balancer_state_bytes(b) bytes,
// written by _save little-endian (host independent). _load replaces b's
// state with a saved one, or returns INVALID_ARG with b unchanged when the
// bytes are not a state, or one of another E, P, policy, window or slot
// count than b's config (named in the message), or hold a value out of
// range. The rates come from the state.
size_t moe_balancer_state_bytes(const moe_balancer *b);
void moe_balancer_state_save(const moe_balancer *b, uint8_t *out);
moe_status moe_balancer_state_load(moe_balancer *b, const uint8_t *in, size_t bytes);

// ---- predictions on a described cluster (moe simulate --balance) ------------------------

typedef struct {
  int policy;                           // moe_balance_policy
  int copies;                           // copies the plan places
  double ratio_before, ratio_after;     // balance ratio without and with them
  double ms_fastermoe, ms_prophet;      // the plan under FasterMoE's eq 7/8 and Pro-Prophet's eq 6
  double none_fastermoe, none_prophet;  // the same for no copies
} moe_balance_sim_result;

// The rates of a described cluster for the planners: the device's GEMM rate,
// and as bandwidth the share of a node's inter-node links per device (all of
// a device's all-to-all partners but its node's are remote; one node: the
// intra link). M, H as moe_balance_cost_default.
void moe_balance_cost_of_cluster(const moe_cluster *cl, int model_dim, int hidden_dim,
                                 moe_balance_cost *cost);
// Plans each of the n policies on the load of a layer of cfg (tokens per
// device) on the cluster whose expert choices follow shares (E): every device
// sends round(T x K x share_e) rows to expert e (the same routing everywhere),
// with `slots` copy slots per device (eplb's R; every plan fitted to them as
// moe_balancer does). INVALID_ARG when E is not divisible by the devices or an
// argument is out of range.
moe_status moe_balance_simulate(moe_ctx *ctx, const moe_cluster *cl, const moe_layer_config *cfg,
                                const double *shares, const int *policies, int n, int slots,
                                moe_balance_sim_result *out);

// ---- Lina's inference scheduling, replayed (moe simulate --lina) ------------------------
//
// Lina (ATC'23, section 5) gives each MoE layer's experts devices in
// proportion to their popularity in the batch, estimated before the gate
// from the tokens' expert paths (phase 1), and re-plans from the actual
// popularity when the gate's top-2K experts are not the estimated (phase 2).

// Lina's allocation of E experts on D devices from a popularity pop (E,
// finite, >= 0, any scale): n_e = D x pop_e / sum (eq. 1). Experts with
// n_e >= 1, in descending n_e, get round(n_e) devices of their own (at least
// 1, leaving one for every such expert after it); the rest are packed on the
// remaining devices by first-fit-decreasing of n_e (capacity 1, at most
// max_pack experts a device); one that fits nowhere, and an expert of
// popularity 0, goes to the device of least n, then fewest experts, then
// lowest index, among those with room [R: Lina says "a random device"]; if
// the popular experts' devices left none with room, among all (max_pack
// exceeded). on (E, D) = 1 where device
// d serves expert e; an expert's rows are split evenly over its devices.
// INVALID_ARG for E or D out of [1, 65536], max_pack x D < E, or a bad pop.
moe_status moe_lina_allocate(moe_ctx *ctx, const double *pop, int num_experts, int devices,
                             int max_pack, uint8_t *on);
// The modelled forward of the MoE layer (inference) in ms when expert e has
// rows[e] rows on the cluster split evenly over its devices in on (E, D) and
// every device sends rows_per_device rows: with L = the most rows a device
// computes, 4 M H L / flops_per_s + 2 x max(L, rows_per_device) (1 - 1/D) M
// act_bytes / net_bytes_per_s (the experts' two GEMMs; dispatch and combine,
// all but a device's own share remote).
double moe_lina_layer_ms(const uint8_t *on, const double *rows, int num_experts, int devices,
                         double rows_per_device, const moe_balance_cost *cost);

enum {
  MOE_LINA_IDEAL = 0,  // allocated from the actual popularity, no scheduling cost
  MOE_LINA_UNIFORM,    // the static placement (E/D experts a device, or D/E devices an expert)
  MOE_LINA_PHASE1,     // allocated from the estimate only
  MOE_LINA_TWO_PHASE,  // phase 1, checked after the gate (check_ms); a miss re-planned from
                       // the actual popularity (+ replan_ms)
  MOE_LINA_SCENARIOS
};

typedef struct {
  int tokens;                 // tokens per device and step [1024]
  int model_dim, hidden_dim;  // M, H [1024, 4096]
  int act_bytes;              // bytes of an activation on the wire [2: fp16]
  int max_pack;               // experts a device serves at most (Lina: 4) [4]
  double check_ms;            // phase 2's check; < 0: a small collective on the cluster [-1]
  double replan_ms;           // a re-plan's blocking cost; < 0: the same collective [-1]
  int from_block;             // MoE blocks before this one are not replayed [0]
} moe_lina_sim_config;
void moe_lina_sim_config_default(moe_lina_sim_config *c);

typedef struct {
  int devices, samples;        // the cluster's devices; trace lines replayed
  double accuracy;             // fraction whose estimated top-2K equals the gate's, in order
  double finetune;             // fraction whose top-2K differ as sets (phase 2 re-plans)
  double check_ms, replan_ms;  // the costs used
  double p50[MOE_LINA_SCENARIOS], p95[MOE_LINA_SCENARIOS];  // the layer's ms over the samples
} moe_lina_sim_result;

// Replays every line of a serving trace that has an estimate, from MoE block
// from_block on, on the cluster's D devices: the step's actual shares of the
// choices scaled to D x tokens x top_k rows, each scenario's allocation, its
// layer time (moe_lina_layer_ms with the cluster's rates). INVALID_ARG for a
// trace without estimates or lines, a config out of range, or a static
// placement E and D do not allow.
moe_status moe_lina_simulate(moe_ctx *ctx, const moe_cluster *cl, const moe_lina_sim_config *c,
                             const moe_routing_trace_data *trace, moe_lina_sim_result *out);

#ifdef __cplusplus
}
#endif

#endif  // MOE_BALANCE_H
