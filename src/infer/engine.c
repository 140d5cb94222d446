// The inference engine (include/moe/infer.h): requests, continuous batching,
// the step protocol between rank 0 and the other ranks, sampling, stop
// strings, the context window.
//
// A step, on rank 0:
//   1. requests cancelled since the last step end; waiting requests take free
//      slots (global slot g lives on rank g / slots, the rank with the fewest
//      running sequences first);
//   2. rows: first one decode row for every sequence whose window has one
//      token not yet in the cache, then prefill chunks (at most prefill_chunk
//      rows of a sequence, step_rows rows per rank); the row of a window's last
//      token wants logits;
//   3. broadcast {STEP, n} and the n rows (slot, pos, token, want) to every
//      rank; every rank decodes its own rows (moe_gpt_decode: the MoE layers'
//      collectives run on every rank, with or without rows); the rows' logits
//      are gathered on rank 0 (MPI_Gatherv, rank by rank, each in row order);
//      every rank agrees on the step's status;
//   4. rank 0 samples the next token of each sequence whose last row was
//      computed, appends it to the window (refilling from position 0 when the
//      window is full, see infer.h), to the text (stop strings cut it), calls
//      on_text with what can no longer be part of a stop string, and on_done
//      when a request ends.
// The other ranks wait in moe_infer_follow for the next {STEP, n} or {STOP}.
// After each step every rank runs the placement step (ic.placement; rank 0
// after sampling, the others after the step): the MoE blocks' loads in one
// all-gather, each block's balancer alike on every rank, and when one
// re-planned, the new placements in one agreement (the parameters travel to
// the copies placed anew during the next step's earlier work).
//
// Threads: rank 0's requests arrive from any thread (moe_infer_submit, _cancel
// under the queue lock); the slot table belongs to the thread that steps.
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe/balance.h"
#include "moe/comm.h"
#include "moe/gpt_io.h"
#include "moe/infer.h"
#include "moe/train.h"

enum { CMD_STEP = 1, CMD_STOP = 2 };
enum { LAT_CAP = 1 << 16 };  // latency samples kept (the last ones)

typedef struct rq {
  int64_t id;
  moe_infer_params p;
  moe_infer_callbacks cb;
  int32_t *win;  // (seq_len): the window of tokens the cache is built from
  int wl;        // tokens in the window
  int cached;    // of which in the slot's cache (positions 0 .. cached - 1)
  int gslot;     // -1 while waiting
  int prompt_tokens, generated;
  char *text;  // (max_tokens + 1): the completion
  size_t text_len, emitted;
  moe_rng rng;
  atomic_int cancel;
  uint64_t t_submit, t_first_row, t_first_token;
  int rows_now;  // rows of this request in the step being built
  int finished;  // 1 once on_done is due
  moe_infer_finish finish;
  struct rq *next;  // the waiting queue
} rq;

struct moe_infer {
  moe_ctx *ctx;
  MPI_Comm world;
  int rank, size;
  moe_infer_config ic;
  moe_gpt_config cfg;  // the checkpoint's
  moe_train_ep_user *user;
  moe_gpt *model;
  moe_gpt_kv *kv;
  int S, V;
  // step buffers (every rank)
  int32_t *plan;             // (size * step_rows, 4): the step's rows
  moe_gpt_decode_row *mine;  // (step_rows): this rank's rows, local slots
  float *logits;             // (step_rows, V): this rank's rows' logits
  // rank 0
  float *all_logits;              // (size * step_rows, V)
  moe_infer_step_row *last_rows;  // (size * step_rows): the last step's sampled rows
  int n_last;                     // (moe_infer_step_logits)
  int *counts, *displs;
  rq **slot_rq;     // (size * slots): the request in each global slot
  rq **row_rq;      // (size * step_rows)
  int *running_on;  // (size): sequences per rank
  double *sample_scr;
  int *sample_order;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int mu_ok;
  rq *q_head, *q_tail;  // waiting, FIFO
  int q_len;
  int n_running;
  int64_t next_id;
  int shutting_down;
  double *layer_ms;      // (3 L): per block, MoE forward, all-to-all and placement ms (step thread)
  double *layer_ms_pub;  // their copy (under mu)
  float *lat;            // (2, LAT_CAP) ring under mu: MoE forward and all-to-all ms of
  int64_t lat_n;         // a step's MoE block (rank 0); samples pushed so far
  double lat_sum[2];     // under mu: the sums of every sample pushed (MoE, all-to-all ms)
  // expert placement (ic.placement other than uniform, size > 1; every rank)
  int n_moe;  // MoE blocks
  moe_ep_layer *moe_layer[MOE_GPT_MAX_LAYERS];
  moe_balancer *bal[MOE_GPT_MAX_LAYERS];  // (n_moe)
  moe_balance_window place_win;           // this rank's (n_moe x E) rows, the last steps
  int64_t place_steps;                    // steps seen
  int64_t *place_mine;                    // (n_moe, E): this rank's rows (its window's mean)
  int64_t *place_all;                     // (P, n_moe, E): every rank's
  int64_t *place_load;                    // (P, E): one block's
  uint8_t *place_next;                    // (n_moe, E, P): the balancers' placements
  uint8_t *place_cur;                     // (n_moe, E, P): the placements in force
  int64_t *place_rows;                    // (P)
  int moe_index[MOE_GPT_MAX_LAYERS];      // block -> its index among the MoE blocks
  // lina (every rank): per MoE block before its forward
  double *lina_send;       // (2E + 1): this rank's estimate; its rows of the last block; failed
  double *lina_all;        // (P, 2E + 1)
  double *lina_est;        // (n_moe, E): each block's estimate summed over the ranks (phase 2)
  uint8_t *lina_have;      // (n_moe): lina_est holds this step's estimate
  MPI_Request lina_req;    // phase 1 of block lina_next, all-gathering (overlapped)
  int lina_next;           // -1: none in flight
  moe_status lina_est_st;  // this rank's last estimate (its error is in ctx)
  int64_t *lina_load;      // (P, E)
  int64_t lina_ratios;     // ratios summed into balance_uniform / _placed (rank 0)
  // Lina's expert paths (every rank; ic.record_paths, ic.paths)
  moe_path_profile *rec;   // this rank's recorded profile
  moe_path_profile *prof;  // the loaded one
  double *path_buf;        // (2, n_moe, E): the step's estimated and actual popularity
  int64_t *path_cnt;       // rank 0: (n_moe, 3) evals, accurate, fine-tune (step thread)
  int64_t *path_cnt_pub;   // their copy (under mu)
  // the routing trace (ic.routing_trace): rank 0's file, every rank's rows
  FILE *trace;
  int64_t trace_step;
  int32_t *trace_mine, *trace_all;  // (n_moe, E); rank 0: (P, n_moe, E)
  moe_infer_stats st;               // the step thread's counters
  moe_infer_stats st_pub;           // their copy at the end of the last step (under mu)
};

void moe_infer_config_default(moe_infer_config *ic) {
  memset(ic, 0, sizeof *ic);
  ic->slots = 32;
  ic->step_rows = 256;
  ic->prefill_chunk = 64;
  ic->queue = 256;
  moe_parallel_config_default(&ic->par);
  ic->placement = MOE_INFER_PLACE_UNIFORM;
  ic->place_slots = 2;
  ic->place_window = 16;
  ic->place_every = 16;
  ic->place_phase2 = 1;
  ic->path_len = MOE_PATHS_DEFAULT_LEN;
  ic->max_paths = MOE_PATHS_DEFAULT_MAX;
}

const char *moe_infer_finish_name(moe_infer_finish f) {
  switch (f) {
    case MOE_INFER_FINISH_LENGTH:
      return "length";
    case MOE_INFER_FINISH_STOP:
      return "stop";
    case MOE_INFER_FINISH_CANCELLED:
      return "cancelled";
  }
  return "unknown";
}

static moe_status check_config(moe_ctx *ctx, const moe_infer_config *ic) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !ic || !ic->checkpoint, MOE_STATUS_INVALID_ARG, "a checkpoint is needed");
  MOE_FAIL_IF(ctx, ic->slots < 1 || ic->slots > 4096, MOE_STATUS_INVALID_ARG,
              "slots (%d) must be in [1, 4096]", ic->slots);
  MOE_FAIL_IF(ctx, ic->step_rows < 1 || ic->step_rows > 65536, MOE_STATUS_INVALID_ARG,
              "rows per step (%d) must be in [1, 65536]", ic->step_rows);
  MOE_FAIL_IF(ctx, ic->prefill_chunk < 1 || ic->prefill_chunk > ic->step_rows,
              MOE_STATUS_INVALID_ARG, "prefill chunk (%d) must be in [1, %d] (rows per step)",
              ic->prefill_chunk, ic->step_rows);
  MOE_FAIL_IF(ctx, ic->queue < 1 || ic->queue > (1 << 20), MOE_STATUS_INVALID_ARG,
              "queue (%d) must be in [1, %d]", ic->queue, 1 << 20);
  MOE_FAIL_IF(ctx, !moe_infer_placement_name(ic->placement), MOE_STATUS_INVALID_ARG,
              "placement %d is unknown (valid: %s)", ic->placement, moe_infer_placement_names());
  MOE_FAIL_IF(ctx, ic->placement == MOE_INFER_PLACE_LINA && !ic->paths, MOE_STATUS_INVALID_ARG,
              "placement lina estimates each MoE block's popularity from a path profile: give "
              "one (--paths FILE, recorded with --record-paths)");
  if (ic->placement != MOE_INFER_PLACE_UNIFORM) {
    MOE_FAIL_IF(ctx, ic->place_window < 1 || ic->place_window > 10000, MOE_STATUS_INVALID_ARG,
                "placement window (%d) must be in [1, 10000] steps", ic->place_window);
    MOE_FAIL_IF(ctx, ic->place_every < 1 || ic->place_every > (1 << 20), MOE_STATUS_INVALID_ARG,
                "placement interval (%d) must be in [1, %d] steps", ic->place_every, 1 << 20);
  }
  MOE_FAIL_IF(ctx, ic->place_phase2 != 0 && ic->place_phase2 != 1, MOE_STATUS_INVALID_ARG,
              "place_phase2 (%d) must be 0 or 1", ic->place_phase2);
  if (ic->record_paths) {
    MOE_FAIL_IF(ctx, ic->path_len < 1 || ic->path_len > MOE_PATHS_MAX_LEN, MOE_STATUS_INVALID_ARG,
                "path length (%d) must be in [1, %d]", ic->path_len, MOE_PATHS_MAX_LEN);
    MOE_FAIL_IF(ctx, ic->max_paths < 1 || ic->max_paths > (1 << 20), MOE_STATUS_INVALID_ARG,
                "paths per MoE block (%d) must be in [1, %d]", ic->max_paths, 1 << 20);
  }
done:
  return st;
}

// The copy slots per rank the placement needs on P ranks of a model with E
// experts (0: none), or an error naming the valid range.
static moe_status place_slots(moe_ctx *ctx, const moe_infer_config *ic, int E, int P, int *out) {
  moe_status st = MOE_STATUS_OK;
  *out = 0;
  if (ic->placement == MOE_INFER_PLACE_UNIFORM || P < 2 || E % P != 0) goto done;
  MOE_FAIL_IF(ctx, ic->place_slots < 1 || ic->place_slots > E - E / P, MOE_STATUS_INVALID_ARG,
              "placement slots (%d) must be in [1, %d] (the experts a rank does not hold: %d "
              "experts on %d ranks)",
              ic->place_slots, E - E / P, E, P);
  *out = ic->place_slots;
done:
  return st;
}

// The model's max_batch for step_rows rows (the MoE layers take max_batch x S tokens).
static int batch_for(int step_rows, int seq_len) { return (step_rows + seq_len - 1) / seq_len; }

moe_status moe_infer_memory(moe_ctx *ctx, const moe_gpt_config *cfg, const moe_infer_config *ic,
                            int world_size, moe_memory_need *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(check_config(ctx, ic));
  MOE_FAIL_IF(ctx, !cfg || !out || world_size < 1, MOE_STATUS_INVALID_ARG,
              "memory: a model config, an output and world_size >= 1 are needed");
  const int mb = batch_for(ic->step_rows, cfg->seq_len);
  moe_layer_config lc = cfg->moe;
  lc.model_dim = cfg->d_model;
  lc.tokens = mb * cfg->seq_len;
  moe_parallel_config pc = ic->par;
  pc.ep_size = world_size;
  MOE_TRY(place_slots(ctx, ic, cfg->moe.num_experts, world_size, &pc.copy_slots));
  moe_memory_need per_moe;
  MOE_TRY(moe_ep_layer_memory(ctx, &lc, &pc, world_size, pc.ranks_per_node, &per_moe));
  MOE_TRY(moe_gpt_memory(ctx, cfg, mb, world_size, &per_moe, 0, out));
  out->bytes[MOE_MEM_ACTIVATIONS] += (double)moe_gpt_kv_bytes(cfg, ic->slots, ic->step_rows);
  if (ic->record_paths) {  // the profile (bounded by max_paths), twice while merging
    int nb = 0;
    for (int b = 0; b < cfg->n_layer; b++) nb += moe_gpt_block_is_moe(cfg, b);
    const moe_path_config pc2 = {nb > 0 ? nb : 1, cfg->moe.num_experts, cfg->moe.top_k,
                                 ic->path_len, ic->max_paths};
    out->bytes[MOE_MEM_WORKSPACE] += 2.0 * (double)moe_path_profile_bytes(&pc2);
  }
  const double rows = (double)world_size * ic->step_rows;
  out->bytes[MOE_MEM_WORKSPACE] +=
      rows * (16.0 + (double)cfg->vocab_size * 4.0 + 8.0 + (double)sizeof(moe_infer_step_row)) +
      (double)cfg->vocab_size * 20.0;
done:
  return st;
}

// Lina's placement (ic.placement lina; every rank alike). Phase 1 of MoE
// block i: every rank estimates its own tokens' popularity for the block
// from their choices at the earlier MoE blocks of the step
// (moe_path_profile_estimate; block 0: the profile's marginal) and the
// estimates are all-gathered; every rank plans the same allocation from the
// (ranks x E) estimated load and places it when it changed. For blocks
// after the first the all-gather is posted right after the previous block's
// gate (lina_gate_hook) and completes during that block's all-to-all and
// expert work and this block's attention; it is waited for before this
// block's forward (lina_pre_forward). Phase 2 (lina_gate_hook, after block
// i's gate): when the actual top-2K experts are not the estimated ones (as
// sets), block i is re-planned from the actual (ranks x E) load before the
// dispatch (blocking), counted as a re-plan.

// This rank's part of block i's phase 1 into lina_send: the estimate (E), its
// rows of block i - 1 (E, for the balance ratios) and a failure flag (1: the
// error is in this rank's ctx), so that every rank posts the all-gather.
static void lina_local(moe_infer *e, int i, int tokens) {
  const int E = e->cfg.moe.num_experts;
  const int32_t *choices[MOE_GPT_MAX_LAYERS] = {0};
  for (int j = 0; j < i; j++) choices[j] = moe_ep_layer_get_route(e->moe_layer[j])->expert;
  const moe_status est = moe_path_profile_estimate(e->prof, i, choices, tokens, e->lina_send, NULL);
  const moe_route *prev = i > 0 ? moe_ep_layer_get_route(e->moe_layer[i - 1]) : NULL;
  for (int x = 0; x < E; x++) e->lina_send[E + x] = prev ? (double)prev->count[x] : 0.0;
  e->lina_send[2 * E] = est == MOE_STATUS_OK ? 0.0 : 1.0;
  e->lina_est_st = est;
}

// Block i's plan from the (ranks x E) load in lina_load; placed when it
// differs from the block's current one. *sent: the copies that got parameters.
static moe_status lina_place(moe_infer *e, int i, int *sent) {
  moe_status st = MOE_STATUS_OK;
  const int E = e->cfg.moe.num_experts, P = e->size;
  const size_t PE = (size_t)E * (size_t)P;
  const moe_balance_load load = {E, P, e->lina_load};
  *sent = 0;
  // the same inputs on every rank: the same plan, or the same error
  MOE_TRY(moe_balance_plan_lina(e->ctx, &load, e->user->par.copy_slots, e->place_next));
  uint8_t *cur = e->place_cur + (size_t)i * PE;
  if (memcmp(cur, e->place_next, PE) != 0) {
    MOE_TRY(moe_ep_layer_set_placement(e->moe_layer[i], e->place_next));
    memcpy(cur, e->place_next, PE);
    *sent = moe_ep_layer_trans_copies(e->moe_layer[i]);
  }
done:
  return st;
}

// Rank 0's counters after a placement step of t0's for MoE block i.
static void lina_count(moe_infer *e, int i, int sent, uint64_t t0) {
  if (e->rank != 0) return;
  const double ms = moe_time_ms_since(t0);
  for (int b = 0; b < e->cfg.n_layer && e->layer_ms; b++)
    if (e->moe_index[b] == i) e->layer_ms[3 * b + 2] += ms;
  const size_t PE = (size_t)e->cfg.moe.num_experts * (size_t)e->size;
  int copies = 0;
  for (size_t k = 0; k < (size_t)e->n_moe * PE; k++) copies += e->place_cur[k] != 0;
  e->st.plans++;
  e->st.copies_sent += sent;
  e->st.copies = copies;
  e->st.place_ms += ms;
}

static moe_status lina_pre_forward(void *arg, int block, int tokens) {
  moe_status st = MOE_STATUS_OK;
  moe_infer *e = arg;
  moe_ctx *ctx = e->ctx;
  const int i = block >= 0 && block < e->cfg.n_layer ? e->moe_index[block] : -1;
  if (i < 0 || !e->prof) goto done;
  {
    const uint64_t t0 = moe_time_ns();
    const int E = e->cfg.moe.num_experts, P = e->size, W = 2 * E + 1;
    const size_t PE = (size_t)E * (size_t)P;
    if (e->lina_req != MPI_REQUEST_NULL) {  // posted after the last block's gate
      MOE_MPI_TRY_OP(ctx, "all-gather of the estimated expert popularity (wait)",
                     MPI_Wait(&e->lina_req, MPI_STATUS_IGNORE));
      if (e->lina_next != i) e->lina_next = -1;  // a step that failed part-way: not this block's
    }
    if (e->lina_next != i) {  // block 0, or nothing in flight: estimate and gather now
      lina_local(e, i, tokens);
      MOE_MPI_TRY_OP(
          ctx, "all-gather of the estimated expert popularity",
          MPI_Allgather(e->lina_send, W, MPI_DOUBLE, e->lina_all, W, MPI_DOUBLE, e->world));
    }
    e->lina_next = -1;
    for (int p = 0; p < P; p++)  // a rank's estimate failed: every rank fails, no hang
      if (e->lina_all[(size_t)p * W + 2 * E] != 0.0) {
        if (p == e->rank) goto done_err;  // the message is in this rank's ctx
        MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
                 "MoE block %d: rank %d failed estimating its popularity (see its error)", block,
                 p);
      }
    if (i > 0 && e->rank == 0) {  // the previous block's ratios, as it ran
      for (int p = 0; p < P; p++)
        for (int x = 0; x < E; x++)
          e->lina_load[(size_t)p * E + x] = (int64_t)e->lina_all[(size_t)p * W + E + x];
      const moe_balance_load done_load = {E, P, e->lina_load};
      double r[2] = {0, 0};
      for (int k = 0; k < 2 && st == MOE_STATUS_OK; k++) {
        st = moe_balance_rows(ctx, &done_load, k ? e->place_cur + (size_t)(i - 1) * PE : NULL,
                              e->place_rows);
        r[k] = moe_balance_ratio(e->place_rows, P);
      }
      MOE_TRY(st);
      const double n = (double)e->lina_ratios;
      e->st.balance_uniform = (e->st.balance_uniform * n + r[0]) / (n + 1);
      e->st.balance_placed = (e->st.balance_placed * n + r[1]) / (n + 1);
      e->lina_ratios++;
    }
    double *est = e->lina_est + (size_t)i * E;  // summed over the ranks (phase 2's)
    for (int x = 0; x < E; x++) est[x] = 0.0;
    for (int p = 0; p < P; p++)  // the estimate as a load (expected rows, rounded)
      for (int x = 0; x < E; x++) {
        const double v = e->lina_all[(size_t)p * W + x];
        e->lina_load[(size_t)p * E + x] = llround(v);
        est[x] += v;
      }
    e->lina_have[i] = 1;
    int sent = 0;
    MOE_TRY(lina_place(e, i, &sent));
    lina_count(e, i, sent, t0);
  }
done:
  return st;
done_err:
  return e->lina_est_st;
}

// After MoE block i's gate (the layer's gate hook; rows: the world's choices
// per expert): phase 2 of block i, then phase 1 of block i + 1 posted.
static moe_status lina_gate_hook(void *arg, moe_ep_layer *L, int tokens, const double *rows) {
  moe_status st = MOE_STATUS_OK;
  moe_infer *e = arg;
  moe_ctx *ctx = e->ctx;
  int i = 0;
  while (i < e->n_moe && e->moe_layer[i] != L) i++;
  if (i == e->n_moe || !e->prof) goto done;
  {
    const int E = e->cfg.moe.num_experts, K = e->cfg.moe.top_k, W = 2 * E + 1;
    double any = 0;
    for (int x = 0; x < E; x++) any += rows[x];
    if (e->ic.place_phase2 && e->lina_have[i] && any > 0) {
      // the same sums on every rank: the same decision
      int ordered = 0, same = 0;
      moe_path_compare(e->lina_est + (size_t)i * E, rows, E, 2 * K, &ordered, &same);
      if (!same) {
        const uint64_t t0 = moe_time_ns();
        MOE_TRY(moe_ep_layer_load(L, e->lina_load));  // the actual (ranks x E) rows
        int sent = 0;
        MOE_TRY(lina_place(e, i, &sent));
        if (e->rank == 0) {
          e->st.replans++;
          e->st.replan_ms += moe_time_ms_since(t0);
        }
        lina_count(e, i, sent, t0);
      }
    }
    e->lina_have[i] = 0;
    if (i + 1 < e->n_moe) {  // phase 1 of the next block, overlapped
      lina_local(e, i + 1, tokens);
      MOE_MPI_TRY_OP(ctx, "all-gather of the estimated expert popularity (posted)",
                     MPI_Iallgather(e->lina_send, W, MPI_DOUBLE, e->lina_all, W, MPI_DOUBLE,
                                    e->world, &e->lina_req));
      e->lina_next = i + 1;
    }
  }
done:
  return st;
}

// The balancers of the MoE blocks and their tables (collective: agreed).
static moe_status placement_init(moe_infer *e) {
  moe_status st = MOE_STATUS_OK, local = MOE_STATUS_OK;
  moe_ctx *ctx = e->ctx;
  for (int b = 0; b < e->cfg.n_layer; b++) {
    e->moe_index[b] = e->user->impl[b] ? e->n_moe : -1;
    if (e->user->impl[b])
      e->moe_layer[e->n_moe++] = moe_train_ep_layer(e->user->impl[b], NULL, NULL);
  }
  if (e->user->par.copy_slots == 0 || e->n_moe == 0) goto done;  // uniform, or one rank
  if (e->ic.placement == MOE_INFER_PLACE_LINA) {
    const int E = e->cfg.moe.num_experts, P = e->size;
    const size_t PE = (size_t)E * (size_t)P;
    e->lina_send = moe_calloc(2 * (size_t)E + 1, sizeof(double));
    e->lina_all = moe_calloc((2 * (size_t)E + 1) * (size_t)P, sizeof(double));
    e->lina_est = moe_calloc((size_t)e->n_moe * E, sizeof(double));
    e->lina_have = moe_calloc((size_t)e->n_moe, 1);
    e->lina_load = moe_calloc(PE, sizeof(int64_t));
    e->place_next = moe_calloc(PE, 1);
    e->place_cur = moe_calloc((size_t)e->n_moe * PE, 1);
    e->place_rows = moe_calloc((size_t)P, sizeof(int64_t));
    if (!(e->lina_send && e->lina_all && e->lina_est && e->lina_have && e->lina_load &&
          e->place_next && e->place_cur && e->place_rows))
      local = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                           "cannot allocate the placement tables");
    e->user->pre_forward = lina_pre_forward;  // the profile is loaded by paths_init
    e->user->pre_forward_arg = e;
    for (int i = 0; i < e->n_moe; i++)
      moe_ep_layer_set_gate_hook(e->moe_layer[i], lina_gate_hook, e);
  } else {
    const int E = e->cfg.moe.num_experts, P = e->size, n = e->n_moe;
    const size_t PE = (size_t)E * (size_t)P;
    // each plan is made from the window's mean, gathered at the plan: the
    // balancer holds one matrix and plans whenever it is called
    moe_balance_config bc;
    moe_balance_config_default(&bc, MOE_BALANCE_EPLB, e->cfg.d_model, e->cfg.moe.hidden_dim,
                               e->user->par.copy_slots);
    bc.window = 1;
    bc.replan_every = 1;
    bc.model = MOE_BALANCE_MODEL_PROPHET;  // eq 6: Trans in full (a step has no backward)
    // The model charges each copy a Trans and an Agg per step (training).
    // Serving sends a copy's parameters once per plan at most and has no
    // Agg: the bytes are spread over the steps between plans.
    bc.cost.expert_param_bytes /= 2.0 * e->ic.place_every;
    for (int i = 0; i < n && local == MOE_STATUS_OK; i++)
      local = moe_balancer_create(ctx, &bc, E, P, &e->bal[i]);
    // this rank's rows per expert of every block, the last place_window steps
    if (local == MOE_STATUS_OK)
      local = moe_balance_window_init(ctx, &e->place_win, n * E, 1, e->ic.place_window);
    e->place_mine = moe_calloc((size_t)n * E, sizeof(int64_t));
    e->place_all = moe_calloc((size_t)n * PE, sizeof(int64_t));
    e->place_load = moe_calloc(PE, sizeof(int64_t));
    e->place_next = moe_calloc((size_t)n * PE, 1);
    e->place_cur = moe_calloc((size_t)n * PE, 1);
    e->place_rows = moe_calloc((size_t)P, sizeof(int64_t));
    if (local == MOE_STATUS_OK && !(e->place_mine && e->place_all && e->place_load &&
                                    e->place_next && e->place_cur && e->place_rows))
      local = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                           "cannot allocate the placement tables");
  }
  MOE_TRY(moe_comm_agree(ctx, e->world, local, "the expert placement"));
done:
  return st;
}

// After a step, on every rank alike: this rank's rows per expert join its
// window (no communication); every place_every steps (collective) the
// windows' means are all-gathered, each block's balancer plans from its
// (P, E) mean load, and the placements are set in one agreement.
static moe_status placement_step(moe_infer *e) {
  moe_status st = MOE_STATUS_OK, local = MOE_STATUS_OK;
  moe_ctx *ctx = e->ctx;
  if (!e->bal[0]) goto done;
  {
    const uint64_t t0 = moe_time_ns();
    const int E = e->cfg.moe.num_experts, P = e->size, n = e->n_moe;
    const size_t PE = (size_t)E * (size_t)P;
    for (int i = 0; i < n; i++) {
      const moe_route *r = moe_ep_layer_get_route(e->moe_layer[i]);
      for (int x = 0; x < E; x++) e->place_mine[(size_t)i * E + x] = r ? r->count[x] : 0;
    }
    MOE_TRY(moe_balance_window_push(ctx, &e->place_win, e->place_mine));
    if (++e->place_steps % e->ic.place_every != 0) goto timed;
    moe_balance_window_mean(&e->place_win, e->place_mine);
    MOE_MPI_TRY_OP(ctx, "all-gather of the expert loads",
                   MPI_Allgather(e->place_mine, n * E, MPI_INT64_T, e->place_all, n * E,
                                 MPI_INT64_T, e->world));
    int copies = 0;
    double uni = 0, placed = 0;
    for (int i = 0; i < n && local == MOE_STATUS_OK; i++) {
      for (int p = 0; p < P; p++)  // block i's (P, E) load
        memcpy(e->place_load + (size_t)p * E, e->place_all + ((size_t)p * n + i) * E,
               (size_t)E * sizeof(int64_t));
      const moe_balance_load now = {E, P, e->place_load};
      local = moe_balance_rows(ctx, &now, e->place_cur + (size_t)i * PE, e->place_rows);
      if (local != MOE_STATUS_OK) break;
      placed += moe_balance_ratio(e->place_rows, P);
      moe_balance_step_info bi;
      local = moe_balancer_step(e->bal[i], e->place_load, e->place_next + (size_t)i * PE, &bi);
      uni += bi.ratio_before;
      copies += bi.copies;
    }
    MOE_TRY(moe_comm_agree(ctx, e->world, local, "the expert placement plan"));
    const uint8_t *next[MOE_GPT_MAX_LAYERS];
    for (int i = 0; i < n; i++) next[i] = e->place_next + (size_t)i * PE;
    MOE_TRY(moe_ep_layers_set_placement(e->moe_layer, n, next));
    memcpy(e->place_cur, e->place_next, (size_t)n * PE);
    int sent = 0;
    for (int i = 0; i < n; i++) sent += moe_ep_layer_trans_copies(e->moe_layer[i]);
    if (e->rank == 0) {
      const double k = (double)e->st.plans;
      e->st.balance_uniform = (e->st.balance_uniform * k + uni) / (k + n);
      e->st.balance_placed = (e->st.balance_placed * k + placed) / (k + n);
      e->st.plans += n;
      e->st.copies_sent += sent;
      e->st.copies = copies;
    }
  timed:
    if (e->rank == 0) {  // one plan for every block: its time spread over them evenly
      const double ms = moe_time_ms_since(t0);
      e->st.place_ms += ms;
      for (int b = 0; b < e->cfg.n_layer && e->layer_ms; b++)
        if (e->moe_index[b] >= 0) e->layer_ms[3 * b + 2] += ms / n;
    }
  }
done:
  return st;
}

// The path profiles: recording, or the one to check estimates against
// (collective: agreed; the loaded one must be of this model's shape).
static moe_status paths_init(moe_infer *e) {
  moe_status st = MOE_STATUS_OK, local = MOE_STATUS_OK;
  moe_ctx *ctx = e->ctx;
  const int E = e->cfg.moe.num_experts, K = e->cfg.moe.top_k, n = e->n_moe;
  if (!e->ic.record_paths && !e->ic.paths) goto done;
  if (n == 0) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                         "path profiles need MoE blocks; this model has none");
  } else if (e->ic.record_paths) {
    const moe_path_config pc = {n, E, K, e->ic.path_len, e->ic.max_paths};
    local = moe_path_profile_create(ctx, &pc, &e->rec);
  }
  if (local == MOE_STATUS_OK && e->ic.paths) {
    local = moe_path_profile_load(ctx, e->ic.paths, &e->prof);
    const moe_path_config *c = local == MOE_STATUS_OK ? moe_path_profile_config(e->prof) : NULL;
    if (c && (c->n_blocks != n || c->num_experts != E || c->top_k != K))
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "path profile %s: of %d MoE blocks of %d experts, top_k %d; this "
                           "model has %d, %d, %d",
                           e->ic.paths, c->n_blocks, c->num_experts, c->top_k, n, E, K);
    if (local == MOE_STATUS_OK) {
      e->path_buf = moe_calloc(2 * (size_t)n * E, sizeof(double));
      if (e->rank == 0) {
        e->path_cnt = moe_calloc(6 * (size_t)n, sizeof(int64_t));
        e->path_cnt_pub = e->path_cnt ? e->path_cnt + 3 * n : NULL;
      }
      if (!e->path_buf || (e->rank == 0 && !e->path_cnt))
        local = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                             "cannot allocate the path statistics");
    }
  }
  MOE_TRY(moe_comm_agree(ctx, e->world, local, "the path profiles"));
done:
  return st;
}

// After a step, on every rank: its tokens' choices join the recorded
// profile; with a loaded one, each block's estimated and actual popularity
// are summed over the ranks (one all-reduce) and rank 0 compares their top-2K.
static moe_status paths_step(moe_infer *e) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = e->ctx;
  if (!e->rec && !e->prof) goto done;
  {
    const int E = e->cfg.moe.num_experts, K = e->cfg.moe.top_k, n = e->n_moe;
    const int32_t *choices[MOE_GPT_MAX_LAYERS];
    int T = -1;
    for (int i = 0; i < n; i++) {
      const moe_route *r = moe_ep_layer_get_route(e->moe_layer[i]);
      choices[i] = r->expert;
      T = T < 0 || r->tokens < T ? r->tokens : T;  // the same rows in every block
    }
    if (T < 0) T = 0;
    if (e->rec) MOE_TRY(moe_path_profile_add(e->rec, choices, T));
    if (!e->prof) goto done;
    double *est = e->path_buf, *act = e->path_buf + (size_t)n * E;
    for (int i = 0; i < n; i++) {
      MOE_TRY(moe_path_profile_estimate(e->prof, i, choices, T, est + (size_t)i * E, NULL));
      const moe_route *r = moe_ep_layer_get_route(e->moe_layer[i]);
      for (int x = 0; x < E; x++) act[(size_t)i * E + x] = T > 0 ? (double)r->count_all[x] : 0.0;
    }
    MOE_MPI_TRY_OP(
        ctx, "sum of the estimated expert popularity",
        MPI_Allreduce(MPI_IN_PLACE, e->path_buf, 2 * n * E, MPI_DOUBLE, MPI_SUM, e->world));
    // under lina, the estimates its phase 2 tested (the same values, summed in
    // rank order on every rank: the counted fine-tunes are its re-plans)
    if (e->lina_est) memcpy(est, e->lina_est, (size_t)n * E * sizeof(double));
    if (e->rank != 0) goto done;
    for (int i = 0; i < n; i++) {
      double any = 0;
      for (int x = 0; x < E; x++) any += act[(size_t)i * E + x];
      if (any <= 0) continue;
      int ordered = 0, sets = 0;
      moe_path_compare(est + (size_t)i * E, act + (size_t)i * E, E, 2 * K, &ordered, &sets);
      e->path_cnt[3 * i] += 1;
      e->path_cnt[3 * i + 1] += ordered;
      e->path_cnt[3 * i + 2] += !sets;
      e->st.path_evals += 1;
      e->st.path_accurate += ordered;
      e->st.path_finetune += !sets;
    }
  }
done:
  return st;
}

// The routing trace (ic.routing_trace; collective: agreed): rank 0 opens the
// file and writes the header (the format of moe train --routing-trace, with
// tokens_per_rank = step_rows, the most rows a rank computes in a step).
static moe_status trace_init(moe_infer *e) {
  moe_status st = MOE_STATUS_OK, local = MOE_STATUS_OK;
  moe_ctx *ctx = e->ctx;
  const int E = e->cfg.moe.num_experts, n = e->n_moe;
  if (!e->ic.routing_trace) goto done;
  if (n == 0) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                         "a routing trace needs MoE blocks; this model has none");
  } else {
    e->trace_mine = moe_calloc((size_t)n * E, sizeof(int32_t));
    if (e->rank == 0) e->trace_all = moe_calloc((size_t)e->size * n * E, sizeof(int32_t));
    if (!e->trace_mine || (e->rank == 0 && !e->trace_all))
      local = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                           "cannot allocate the routing trace's counts");
  }
  if (local == MOE_STATUS_OK && e->rank == 0) {
    e->trace = fopen(e->ic.routing_trace, "w");
    if (!e->trace) {
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "cannot open the routing trace '%s': %s", e->ic.routing_trace,
                           strerror(errno));
    } else {
      int blocks[MOE_GPT_MAX_LAYERS], n_blocks = 0;
      for (int b = 0; b < e->cfg.n_layer; b++)
        if (e->moe_index[b] >= 0) blocks[n_blocks++] = b;
      moe_routing_trace_write_header(e->trace, e->size, E, e->cfg.moe.top_k, e->ic.step_rows,
                                     blocks, n_blocks);
      if (fflush(e->trace) != 0)
        local = moe_error_at(ctx, MOE_STATUS_IO, __FILE__, __LINE__,
                             "cannot write the routing trace '%s': %s", e->ic.routing_trace,
                             strerror(errno));
    }
  }
  MOE_TRY(moe_comm_agree(ctx, e->world, local, "opening the routing trace"));
done:
  return st;
}

// After a step (collective when tracing): every rank's rows per expert of
// every MoE block gathered to rank 0, one line per block; with a path
// profile, the step's estimate summed over the ranks (paths_step's). A
// write error makes rank 0 warn and stop writing; serving goes on.
static moe_status trace_step(moe_infer *e) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = e->ctx;
  if (!e->trace_mine) goto done;
  {
    const int E = e->cfg.moe.num_experts, n = e->n_moe, P = e->size;
    for (int i = 0; i < n; i++) {
      const moe_route *r = moe_ep_layer_get_route(e->moe_layer[i]);
      for (int x = 0; x < E; x++)
        e->trace_mine[(size_t)i * E + x] = r->tokens > 0 ? r->count[x] : 0;
    }
    MOE_MPI_TRY_OP(ctx, "gather of the routing counts",
                   MPI_Gather(e->trace_mine, n * E, MPI_INT32_T, e->trace_all, n * E, MPI_INT32_T,
                              0, e->world));
    e->trace_step++;
    if (e->rank != 0 || !e->trace) goto done;
    for (int i = 0; i < n; i++) {
      int block = 0;
      while (block < e->cfg.n_layer && e->moe_index[block] != i) block++;
      // rank p's rows of block i at trace_all[(p * n + i) * E]; with a
      // profile, paths_step's sums (it runs first)
      moe_routing_trace_write_step(e->trace, (long long)e->trace_step, block,
                                   e->trace_all + (size_t)i * E, P, E, (size_t)n * E,
                                   e->prof ? e->path_buf + (size_t)i * E : NULL);
    }
    errno = 0;
    if (ferror(e->trace) || fflush(e->trace) != 0) {
      MOE_WARN("routing trace '%s': %s; no more lines are written", e->ic.routing_trace,
               errno ? strerror(errno) : "write error");
      fclose(e->trace);
      e->trace = NULL;
    }
  }
done:
  return st;
}

moe_status moe_infer_paths_json(moe_infer *e, char **out) {
  moe_status st = MOE_STATUS_OK, local = MOE_STATUS_OK;
  moe_ctx *ctx = e->ctx;
  char *mine = NULL, *all = NULL;
  int *lens = NULL, *displs = NULL;
  moe_path_profile *other = NULL;
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "out must not be NULL");
  *out = NULL;
  MOE_FAIL_IF(ctx, !e->rec, MOE_STATUS_INVALID_ARG,
              "the engine records no path profile (moe_infer_config.record_paths)");
  local = moe_path_profile_to_json(ctx, e->rec, &mine);
  MOE_TRY(moe_comm_agree(ctx, e->world, local, "the path profiles' text"));
  {
    const size_t n = strlen(mine);
    MOE_FAIL_IF(ctx, n > (size_t)INT_MAX / 2, MOE_STATUS_INVALID_ARG,
                "a path profile of %zu bytes is too large to gather", n);
    int len = (int)n;
    if (e->rank == 0) {
      lens = moe_calloc((size_t)e->size, sizeof(int));
      displs = moe_calloc((size_t)e->size, sizeof(int));
    }
    MOE_MPI_TRY_OP(ctx, "gather of the path profiles' sizes",
                   MPI_Gather(&len, 1, MPI_INT, lens, 1, MPI_INT, 0, e->world));
    size_t total = 0;
    if (e->rank == 0 && lens && displs) {
      for (int p = 0; p < e->size; p++) {
        displs[p] = (int)total;
        total += (size_t)lens[p];
      }
      if (total <= (size_t)INT_MAX) all = moe_malloc(total + 1);
    }
    local = e->rank != 0 || all ? MOE_STATUS_OK
                                : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                               "cannot gather %zu bytes of path profiles", total);
    MOE_TRY(moe_comm_agree(ctx, e->world, local, "gathering the path profiles"));
    MOE_MPI_TRY_OP(ctx, "gather of the path profiles",
                   MPI_Gatherv(mine, len, MPI_CHAR, all, lens, displs, MPI_CHAR, 0, e->world));
    if (e->rank != 0) goto done;
    for (int p = 1; p < e->size; p++) {
      MOE_TRY(moe_path_profile_from_json(ctx, all + displs[p], (size_t)lens[p], &other));
      MOE_TRY(moe_path_profile_merge(ctx, e->rec, other));
      moe_path_profile_destroy(other);
      other = NULL;
    }
    MOE_TRY(moe_path_profile_to_json(ctx, e->rec, out));
  }
done:
  moe_path_profile_destroy(other);
  moe_free(mine);
  moe_free(all);
  moe_free(lens);
  moe_free(displs);
  return st;
}

moe_status moe_infer_create(moe_ctx *ctx, MPI_Comm world, const moe_infer_config *ic,
                            moe_infer **out) {
  moe_status st = MOE_STATUS_OK, local = MOE_STATUS_OK;
  moe_infer *e = NULL;
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "out must not be NULL");
  *out = NULL;
  e = moe_calloc(1, sizeof *e);
  if (e) {
    e->lina_req = MPI_REQUEST_NULL;
    e->lina_next = -1;
  }
  local = e ? check_config(ctx, ic)
            : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__, "out of memory");
  moe_gpt_ckpt_info info;
  if (local == MOE_STATUS_OK) local = moe_gpt_ckpt_read_info(ctx, ic->checkpoint, &info);
  MOE_TRY(moe_comm_agree(ctx, world, local, "reading the checkpoint"));
  e->ctx = ctx;
  e->world = world;
  MPI_Comm_rank(world, &e->rank);
  MPI_Comm_size(world, &e->size);
  e->ic = *ic;
  e->cfg = info.model;
  e->S = info.model.seq_len;
  e->V = info.model.vocab_size;
  e->next_id = 1;
  {  // the memory bound (it also refuses experts not divisible by the ranks)
    moe_memory_need need;
    local = moe_infer_memory(ctx, &info.model, ic, e->size, &need);
    if (local == MOE_STATUS_OK) need.bytes[MOE_MEM_BASELINE] = (double)moe_memory_baseline_bytes();
    MOE_TRY(moe_comm_agree(ctx, world, local, "the memory estimate"));
    MOE_TRY(moe_comm_memory_check(ctx, world, &need, ic->max_memory,
                                  "use fewer --slots or --step-rows, or more ranks"));
  }
  e->user = moe_calloc(1, sizeof *e->user);
  local = e->user
              ? MOE_STATUS_OK
              : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__, "out of memory");
  MOE_TRY(moe_comm_agree(ctx, world, local, "allocation"));
  e->user->world = world;
  e->user->par = ic->par;
  e->user->par.ep_size = e->size;
  e->user->par.slice_tokens = 0;
  MOE_TRY(place_slots(ctx, ic, e->cfg.moe.num_experts, e->size, &e->user->par.copy_slots));
  e->user->par.frozen_params = 1;  // serving: the parameters never change
  MOE_TRY(moe_gpt_create(ctx, &e->cfg, batch_for(ic->step_rows, e->S), &moe_train_ep_ops, e->user,
                         &e->model));
  local = moe_gpt_ckpt_load(ctx, ic->checkpoint, e->model, NULL);
  if (local == MOE_STATUS_OK)
    local = moe_gpt_kv_create(ctx, e->model, ic->slots, ic->step_rows, &e->kv);
  if (local == MOE_STATUS_OK) {
    const size_t R = (size_t)ic->step_rows, all = R * (size_t)e->size, V = (size_t)e->V;
    e->plan = moe_malloc(all * 4 * sizeof(int32_t));
    e->mine = moe_malloc(R * sizeof *e->mine);
    e->logits = moe_malloc(R * V * sizeof(float));
    if (e->rank == 0) {
      e->all_logits = moe_malloc(all * V * sizeof(float));
      e->counts = moe_calloc((size_t)e->size, sizeof(int));
      e->displs = moe_calloc((size_t)e->size, sizeof(int));
      e->slot_rq = moe_calloc((size_t)e->size * (size_t)ic->slots, sizeof(rq *));
      e->row_rq = moe_calloc(all, sizeof(rq *));
      e->last_rows = moe_calloc(all, sizeof *e->last_rows);
      e->running_on = moe_calloc((size_t)e->size, sizeof(int));
      e->sample_scr = moe_malloc(2 * V * sizeof(double));
      e->sample_order = moe_malloc(V * sizeof(int));
      e->layer_ms = moe_calloc(6 * (size_t)e->cfg.n_layer, sizeof(double));
      e->layer_ms_pub = e->layer_ms ? e->layer_ms + 3 * e->cfg.n_layer : NULL;
      e->lat = moe_malloc(2 * (size_t)LAT_CAP * sizeof(float));
    }
    const int ok = e->plan && e->mine && e->logits &&
                   (e->rank != 0 || (e->all_logits && e->counts && e->displs && e->slot_rq &&
                                     e->row_rq && e->last_rows && e->running_on && e->sample_scr &&
                                     e->sample_order && e->layer_ms && e->lat));
    if (!ok)
      local = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                           "cannot allocate the engine's step buffers");
  }
  if (local == MOE_STATUS_OK) {
    if (pthread_mutex_init(&e->mu, NULL) == 0) {
      if (pthread_cond_init(&e->cv, NULL) == 0) {
        e->mu_ok = 1;
      } else {
        pthread_mutex_destroy(&e->mu);
      }
    }
    if (!e->mu_ok)
      local = moe_error_at(ctx, MOE_STATUS_INTERNAL, __FILE__, __LINE__, "pthread init failed");
  }
  MOE_TRY(moe_comm_agree(ctx, world, local, "loading the model"));
  MOE_TRY(placement_init(e));
  MOE_TRY(paths_init(e));
  MOE_TRY(trace_init(e));
  *out = e;
  e = NULL;
done:
  moe_infer_destroy(e);
  return st;
}

static void rq_free(rq *r) {
  if (!r) return;
  moe_free(r->win);
  moe_free(r->text);
  moe_free(r);
}

void moe_infer_destroy(moe_infer *e) {
  if (!e) return;
  if (e->slot_rq)
    for (int g = 0; g < e->size * e->ic.slots; g++) rq_free(e->slot_rq[g]);
  for (rq *r = e->q_head; r;) {
    rq *n = r->next;
    rq_free(r);
    r = n;
  }
  if (e->mu_ok) {
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
  }
  if (e->lina_req != MPI_REQUEST_NULL)  // a step that failed after posting (every rank did)
    MPI_Wait(&e->lina_req, MPI_STATUS_IGNORE);
  for (int i = 0; i < e->n_moe; i++) moe_balancer_destroy(e->bal[i]);
  if (e->trace) fclose(e->trace);
  moe_free(e->trace_mine);
  moe_free(e->trace_all);
  moe_path_profile_destroy(e->rec);
  moe_path_profile_destroy(e->prof);
  moe_free(e->path_buf);
  moe_free(e->path_cnt);
  moe_balance_window_free(&e->place_win);
  moe_free(e->place_mine);
  moe_free(e->place_all);
  moe_free(e->place_load);
  moe_free(e->place_next);
  moe_free(e->place_cur);
  moe_free(e->place_rows);
  moe_free(e->lina_send);
  moe_free(e->lina_all);
  moe_free(e->lina_est);
  moe_free(e->lina_have);
  moe_free(e->lina_load);
  moe_gpt_kv_destroy(e->kv);
  moe_gpt_destroy(e->model);
  moe_free(e->user);
  moe_free(e->plan);
  moe_free(e->mine);
  moe_free(e->logits);
  moe_free(e->all_logits);
  moe_free(e->counts);
  moe_free(e->displs);
  moe_free(e->slot_rq);
  moe_free(e->row_rq);
  moe_free(e->last_rows);
  moe_free(e->running_on);
  moe_free(e->sample_scr);
  moe_free(e->sample_order);
  moe_free(e->layer_ms);
  moe_free(e->lat);
  moe_free(e);
}

const moe_gpt_config *moe_infer_model_config(const moe_infer *e) { return &e->cfg; }

// ---- requests (rank 0) ----------------------------------------------------------------

moe_status moe_infer_submit(moe_infer *e, moe_ctx *ctx, const char *prompt, size_t prompt_len,
                            const moe_infer_params *p, const moe_infer_callbacks *cb, int64_t *id) {
  moe_status st = MOE_STATUS_OK;
  rq *r = NULL;
  if (!ctx) ctx = e->ctx;
  MOE_FAIL_IF(ctx, e->rank != 0, MOE_STATUS_INVALID_ARG, "requests are submitted on rank 0");
  MOE_FAIL_IF(ctx, prompt_len > 0 && !prompt, MOE_STATUS_INVALID_ARG, "prompt must not be NULL");
  MOE_TRY(moe_infer_params_validate(ctx, p));
  r = moe_calloc(1, sizeof *r);
  MOE_FAIL_IF(ctx, !r, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate a request");
  r->win = moe_malloc((size_t)e->S * sizeof(int32_t));
  r->text = moe_malloc((size_t)p->max_tokens + 1);
  MOE_FAIL_IF(ctx, !r->win || !r->text, MOE_STATUS_OUT_OF_MEMORY,
              "cannot allocate a request of %d tokens", p->max_tokens);
  r->p = *p;
  if (cb) r->cb = *cb;
  r->gslot = -1;
  r->prompt_tokens = (int)(prompt_len < (size_t)1 << 30 ? prompt_len : (size_t)1 << 30);
  if (prompt_len == 0) {
    r->win[r->wl++] = '\n';  // an empty prompt starts after a newline
  } else {
    const size_t keep = prompt_len < (size_t)e->S ? prompt_len : (size_t)e->S;
    const unsigned char *b = (const unsigned char *)prompt + (prompt_len - keep);
    for (size_t i = 0; i < keep; i++) {
      MOE_FAIL_IF(ctx, b[i] >= (unsigned)e->V, MOE_STATUS_INVALID_ARG,
                  "prompt byte %zu (%u) is outside the model's vocabulary of %d",
                  prompt_len - keep + i, b[i], e->V);
      r->win[r->wl++] = b[i];
    }
  }
  r->text[0] = '\0';
  moe_rng_init(&r->rng, p->seed, 0);
  atomic_init(&r->cancel, 0);
  r->t_submit = moe_time_ns();
  pthread_mutex_lock(&e->mu);
  if (e->shutting_down || e->q_len >= e->ic.queue) {
    const int down = e->shutting_down;
    pthread_mutex_unlock(&e->mu);
    MOE_FAIL(ctx, MOE_STATUS_BUSY,
             down ? "the engine is shutting down"
                  : "the queue is full (%d requests wait for a slot); try again later",
             e->ic.queue);
  }
  r->id = e->next_id++;
  if (id) *id = r->id;
  if (e->q_tail)
    e->q_tail->next = r;
  else
    e->q_head = r;
  e->q_tail = r;
  e->q_len++;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  r = NULL;
done:
  rq_free(r);
  return st;
}

void moe_infer_cancel(moe_infer *e, int64_t id) {
  if (e->rank != 0) return;
  pthread_mutex_lock(&e->mu);
  for (rq *r = e->q_head; r; r = r->next)
    if (r->id == id) atomic_store(&r->cancel, 1);
  for (int g = 0; g < e->size * e->ic.slots; g++)
    if (e->slot_rq[g] && e->slot_rq[g]->id == id) atomic_store(&e->slot_rq[g]->cancel, 1);
  pthread_mutex_unlock(&e->mu);
}

int moe_infer_pending(moe_infer *e) {
  pthread_mutex_lock(&e->mu);
  const int n = e->q_len + e->n_running;
  pthread_mutex_unlock(&e->mu);
  return n;
}

int moe_infer_wait(moe_infer *e, int timeout_ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += timeout_ms / 1000;
  ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&e->mu);
  while (e->q_len + e->n_running == 0 && !e->shutting_down) {
    if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT) break;
  }
  const int n = e->q_len + e->n_running;
  pthread_mutex_unlock(&e->mu);
  return n > 0;
}

static int cmp_float(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

int moe_infer_layer_quantiles(moe_infer *e, const double *q, int n, double *moe_ms,
                              double *a2a_ms) {
  for (int i = 0; i < n; i++) moe_ms[i] = a2a_ms[i] = 0.0;
  if (e->rank != 0 || !e->lat || n < 1) return 0;
  pthread_mutex_lock(&e->mu);
  const size_t k = (size_t)(e->lat_n < LAT_CAP ? e->lat_n : LAT_CAP);
  float *v = k ? moe_malloc(2 * k * sizeof(float)) : NULL;
  if (v) {
    memcpy(v, e->lat, k * sizeof(float));
    memcpy(v + k, e->lat + LAT_CAP, k * sizeof(float));
  }
  pthread_mutex_unlock(&e->mu);
  if (!v) return 0;
  qsort(v, k, sizeof(float), cmp_float);
  qsort(v + k, k, sizeof(float), cmp_float);
  for (int i = 0; i < n; i++) {  // the nearest rank: the smallest sample with >= q of them
    const double qi = q[i] < 0 ? 0 : q[i] > 1 ? 1 : q[i];
    size_t r = (size_t)ceil(qi * (double)k);
    r = r < 1 ? 0 : r - 1;
    moe_ms[i] = v[r];
    a2a_ms[i] = v[k + r];
  }
  moe_free(v);
  return (int)k;
}

int64_t moe_infer_layer_samples(moe_infer *e, double *moe_ms_sum, double *a2a_ms_sum) {
  int64_t n = 0;
  double m = 0, a = 0;
  if (e->rank == 0 && e->lat) {
    pthread_mutex_lock(&e->mu);
    n = e->lat_n;
    m = e->lat_sum[0];
    a = e->lat_sum[1];
    pthread_mutex_unlock(&e->mu);
  }
  if (moe_ms_sum) *moe_ms_sum = m;
  if (a2a_ms_sum) *a2a_ms_sum = a;
  return n;
}

void moe_infer_layer_times(moe_infer *e, int block, double *moe_ms, double *a2a_ms,
                           double *place_ms) {
  double m = 0, a = 0, pl = 0;
  if (e->rank == 0 && block >= 0 && block < e->cfg.n_layer && e->layer_ms_pub) {
    pthread_mutex_lock(&e->mu);
    m = e->layer_ms_pub[3 * block];
    a = e->layer_ms_pub[3 * block + 1];
    pl = e->layer_ms_pub[3 * block + 2];
    pthread_mutex_unlock(&e->mu);
  }
  if (moe_ms) *moe_ms = m;
  if (a2a_ms) *a2a_ms = a;
  if (place_ms) *place_ms = pl;
}

void moe_infer_get_stats(moe_infer *e, moe_infer_stats *s) {
  pthread_mutex_lock(&e->mu);
  *s = e->st_pub;
  s->running = e->n_running;
  s->waiting = e->q_len;
  pthread_mutex_unlock(&e->mu);
}

// ---- text and stop strings ------------------------------------------------------------

// The longest suffix of text that is a proper prefix of a stop string: bytes
// that must wait for the next token before they are shown.
static size_t holdback(const rq *r) {
  size_t best = 0;
  for (int i = 0; i < r->p.n_stop; i++) {
    const size_t n = strlen(r->p.stop[i]);
    for (size_t k = n - 1; k > best; k--) {
      if (k <= r->text_len && memcmp(r->text + r->text_len - k, r->p.stop[i], k) == 0) {
        best = k;
        break;
      }
    }
  }
  return best;
}

static void emit(rq *r, size_t upto) {
  if (upto > r->emitted && r->cb.on_text)
    r->cb.on_text(r->cb.user, r->id, r->text + r->emitted, upto - r->emitted);
  if (upto > r->emitted) r->emitted = upto;
}

// Appends a sampled token; marks the request finished when it ends.
static void append_token(moe_infer *e, rq *r, int token) {
  r->generated++;
  e->st.tokens++;
  if (!r->t_first_token) r->t_first_token = moe_time_ns();
  r->text[r->text_len++] = (char)token;
  r->text[r->text_len] = '\0';
  for (int i = 0; i < r->p.n_stop; i++) {
    const size_t n = strlen(r->p.stop[i]);
    if (n <= r->text_len && memcmp(r->text + r->text_len - n, r->p.stop[i], n) == 0) {
      r->text_len -= n;  // the stop string is not part of the completion
      r->text[r->text_len] = '\0';
      if (r->emitted > r->text_len) r->emitted = r->text_len;  // cannot happen: held back
      r->finished = 1;
      r->finish = MOE_INFER_FINISH_STOP;
      return;
    }
  }
  if (r->generated >= r->p.max_tokens) {
    r->finished = 1;
    r->finish = MOE_INFER_FINISH_LENGTH;
    return;
  }
  emit(r, r->text_len - holdback(r));
  // the window: the token goes at position wl, or the window restarts from its last S/2
  if (r->wl < e->S) {
    r->win[r->wl++] = token;
  } else {
    const int keep = e->S / 2 > 0 ? e->S / 2 : 1;
    memmove(r->win, r->win + (r->wl - (keep - 1)), (size_t)(keep - 1) * sizeof(int32_t));
    r->win[keep - 1] = token;
    r->wl = keep;
    r->cached = 0;
    e->st.context_shifts++;
  }
}

// Ends request r (its slot freed): the rest of its text, then on_done.
static void finish(moe_infer *e, rq *r) {
  emit(r, r->text_len);
  moe_infer_result res;
  memset(&res, 0, sizeof res);
  res.finish = r->finish;
  res.text = r->text;
  res.text_len = r->text_len;
  res.prompt_tokens = r->prompt_tokens;
  res.completion_tokens = r->generated;
  const uint64_t now = moe_time_ns();
  res.queue_ms = r->t_first_row ? (double)(r->t_first_row - r->t_submit) / 1e6 : 0;
  res.first_token_ms = r->t_first_token ? (double)(r->t_first_token - r->t_submit) / 1e6 : 0;
  res.total_ms = (double)(now - r->t_submit) / 1e6;
  pthread_mutex_lock(&e->mu);
  if (r->gslot >= 0) {
    e->slot_rq[r->gslot] = NULL;
    e->running_on[r->gslot / e->ic.slots]--;
    e->n_running--;
  }
  pthread_mutex_unlock(&e->mu);
  e->st.requests_done++;
  if (r->cb.on_done) r->cb.on_done(r->cb.user, r->id, &res);
  rq_free(r);
}

// ---- the step ---------------------------------------------------------------------------

// Every rank: this step's n rows (in e->plan) through the model; logits of
// the rows that want them to rank 0 (e->all_logits, rank by rank).
static moe_status run_rows(moe_infer *e, int n) {
  moe_status st = MOE_STATUS_OK, local = MOE_STATUS_OK;
  moe_ctx *ctx = e->ctx;
  const int slots = e->ic.slots;
  int mine = 0, want = 0;
  if (e->rank == 0) memset(e->counts, 0, (size_t)e->size * sizeof(int));
  for (int i = 0; i < n; i++) {
    const int32_t *w = e->plan + 4 * (size_t)i;
    const int owner = w[0] / slots;
    if (e->rank == 0 && w[3]) e->counts[owner] += e->V;
    if (owner != e->rank) continue;
    e->mine[mine++] = (moe_gpt_decode_row){w[0] % slots, w[1], w[2], w[3]};
    want += w[3] != 0;
  }
  local = moe_gpt_decode(e->model, e->kv, e->mine, mine, e->logits);
  MOE_TRY(moe_comm_agree(ctx, e->world, local, "a decode step"));
  if (e->rank == 0) {  // the MoE layers' time and their all-to-alls' (the passes' comm tasks)
    for (int l = 0; l < e->cfg.n_layer; l++) {
      if (!e->user->impl[l]) continue;
      const moe_ep_layer *layer = moe_train_ep_layer(e->user->impl[l], NULL, NULL);
      moe_layer_timing fwd;
      moe_ep_layer_timing(layer, &fwd, NULL);
      const moe_task_graph *g = NULL;
      const moe_task_record *rec = NULL;
      moe_ep_layer_last_pass(layer, 0, &g, &rec);
      moe_pass_breakdown bd;
      memset(&bd, 0, sizeof bd);
      if (g && rec) moe_pass_breakdown_compute(rec, g->n_tasks, &bd);
      e->layer_ms[3 * l] += fwd.total_ms;
      e->layer_ms[3 * l + 1] += (double)bd.comm_ns * 1e-6;
      e->st.moe_ms += fwd.total_ms;
      e->st.a2a_ms += (double)bd.comm_ns * 1e-6;
      pthread_mutex_lock(&e->mu);
      const size_t at = (size_t)(e->lat_n++ % LAT_CAP);
      e->lat[at] = (float)fwd.total_ms;
      e->lat[LAT_CAP + at] = (float)((double)bd.comm_ns * 1e-6);
      e->lat_sum[0] += fwd.total_ms;
      e->lat_sum[1] += (double)bd.comm_ns * 1e-6;
      pthread_mutex_unlock(&e->mu);
    }
  }
  if (e->rank == 0) {
    int at = 0;
    for (int p = 0; p < e->size; p++) {
      e->displs[p] = at;
      at += e->counts[p];
    }
  }
  if (e->rank == 0 && e->size > 1) {  // a rank without rows in this step?
    int idle = 0;
    for (int p = 0; p < e->size && !idle; p++) {
      int any = 0;
      for (int i = 0; i < n && !any; i++) any = e->plan[4 * (size_t)i] / slots == p;
      idle = !any;
    }
    e->st.idle_rank_steps += idle;
  }
  MOE_MPI_TRY_OP(ctx, "infer logits gather",
                 MPI_Gatherv(e->logits, want * e->V, MPI_FLOAT, e->all_logits, e->counts, e->displs,
                             MPI_FLOAT, 0, e->world));
done:
  return st;
}

// Rank 0: cancelled requests end; waiting ones take free slots.
static void admit(moe_infer *e) {
  const int total = e->size * e->ic.slots;
  for (int g = 0; g < total; g++) {
    rq *r = e->slot_rq[g];
    if (r && atomic_load(&r->cancel)) {
      r->finished = 1;
      r->finish = MOE_INFER_FINISH_CANCELLED;
      finish(e, r);
    }
  }
  for (;;) {
    pthread_mutex_lock(&e->mu);
    rq *r = e->q_head;
    int slot = -1;
    if (r) {
      int best = -1;
      for (int p = 0; p < e->size; p++)
        if (e->running_on[p] < e->ic.slots && (best < 0 || e->running_on[p] < e->running_on[best]))
          best = p;
      for (int j = 0; best >= 0 && j < e->ic.slots && slot < 0; j++)
        if (!e->slot_rq[best * e->ic.slots + j]) slot = best * e->ic.slots + j;
    }
    const int cancelled = r && atomic_load(&r->cancel);
    if (r && (slot >= 0 || cancelled)) {
      e->q_head = r->next;
      if (!e->q_head) e->q_tail = NULL;
      e->q_len--;
      r->next = NULL;
      if (!cancelled) {
        r->gslot = slot;
        e->slot_rq[slot] = r;
        e->running_on[slot / e->ic.slots]++;
        e->n_running++;
      }
    }
    pthread_mutex_unlock(&e->mu);
    if (!r || (slot < 0 && !cancelled)) break;
    if (cancelled || r->p.max_tokens == 0) {
      r->finished = 1;
      r->finish = cancelled ? MOE_INFER_FINISH_CANCELLED : MOE_INFER_FINISH_LENGTH;
      finish(e, r);
    }
  }
}

// Rank 0: the step's rows into e->plan; returns their number.
static int build_rows(moe_infer *e) {
  const int total = e->size * e->ic.slots, R = e->ic.step_rows;
  int n = 0, seqs = 0;
  int *budget = e->displs;  // scratch (size): rows left per rank
  for (int p = 0; p < e->size; p++) budget[p] = R;
  for (int pass = 0; pass < 2; pass++) {  // decode rows first, then prefill chunks
    for (int g = 0; g < total; g++) {
      rq *r = e->slot_rq[g];
      if (!r) continue;
      const int need = r->wl - r->cached, owner = g / e->ic.slots;
      if (need <= 0 || (pass == 0) != (need == 1)) continue;
      int take = need < e->ic.prefill_chunk ? need : e->ic.prefill_chunk;
      if (take > budget[owner]) take = budget[owner];
      if (take <= 0) continue;
      for (int k = 0; k < take; k++) {
        const int pos = r->cached + k;
        int32_t *w = e->plan + 4 * (size_t)n;
        w[0] = g;
        w[1] = pos;
        w[2] = r->win[pos];
        w[3] = pos == r->wl - 1;
        e->row_rq[n] = r;
        n++;
      }
      if (pass == 1) e->st.prefill_rows += take;
      r->rows_now = take;
      budget[owner] -= take;
      seqs++;
      if (!r->t_first_row) r->t_first_row = moe_time_ns();
    }
  }
  if (seqs > e->st.max_batch_seqs) e->st.max_batch_seqs = seqs;
  return n;
}

// The header goes out as a non-blocking broadcast on every rank: the followers
// wait for it with MPI_Ibcast (recv_cmd), and MPI does not match a blocking
// collective with a non-blocking one.
static moe_status bcast_cmd(moe_infer *e, int cmd, int n) {
  moe_status st = MOE_STATUS_OK;
  int32_t hdr[2] = {cmd, n};
  MPI_Request req;
  MOE_MPI_TRY(e->ctx, MPI_Ibcast(hdr, 2, MPI_INT32_T, 0, e->world, &req));
  MOE_MPI_TRY_OP(e->ctx, "infer step header", MPI_Wait(&req, MPI_STATUS_IGNORE));
done:
  return st;
}

moe_status moe_infer_step(moe_infer *e) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = e->ctx;
  const uint64_t t0 = moe_time_ns();
  MOE_FAIL_IF(ctx, e->rank != 0, MOE_STATUS_INVALID_ARG,
              "moe_infer_step runs on rank 0 (the others run moe_infer_follow)");
  e->n_last = 0;
  admit(e);
  const int n = build_rows(e);
  if (n == 0) goto done;
  MOE_TRY(bcast_cmd(e, CMD_STEP, n));
  MOE_MPI_TRY_OP(ctx, "infer step rows", MPI_Bcast(e->plan, 4 * n, MPI_INT32_T, 0, e->world));
  MOE_TRY(run_rows(e, n));
  // sample, in row order: the logits of rank p's rows start at displs[p]
  int cursor[64];
  int *cur = e->size <= 64 ? cursor : NULL;
  for (int p = 0; p < e->size && cur; p++) cur[p] = e->displs[p];
  rq *prev = NULL;
  for (int i = 0; i < n; i++) {
    const int32_t *w = e->plan + 4 * (size_t)i;
    rq *r = e->row_rq[i];
    if (r != prev) {
      r->cached += r->rows_now;
      r->rows_now = 0;
      prev = r;
    }
    if (!w[3]) continue;
    const int owner = w[0] / e->ic.slots;
    const float *lg;
    if (cur) {
      lg = e->all_logits + cur[owner];
      cur[owner] += e->V;
    } else {  // more than 64 ranks: count this rank's earlier wanted rows
      int before = 0;
      for (int j = 0; j < i; j++)
        before += e->plan[4 * (size_t)j + 3] && e->plan[4 * (size_t)j] / e->ic.slots == owner;
      lg = e->all_logits + e->displs[owner] + (size_t)before * e->V;
    }
    const double u = moe_rng_uniform(&r->rng);
    const int tok = moe_infer_sample(lg, e->V, r->p.temperature, r->p.top_k, r->p.top_p, u,
                                     e->sample_scr, e->sample_order);
    e->last_rows[e->n_last++] = (moe_infer_step_row){r->id, tok, lg};
    append_token(e, r, tok);
  }
  MOE_TRY(placement_step(e));  // the followers' come after their step
  MOE_TRY(paths_step(e));
  MOE_TRY(trace_step(e));
  e->st.steps++;
  e->st.rows += n;
  // the rows of a request are consecutive: look at it once, before it may be freed
  prev = NULL;
  for (int i = 0; i < n; i++) {
    rq *r = e->row_rq[i];
    e->row_rq[i] = NULL;
    if (r == prev) continue;
    prev = r;
    if (r->finished) finish(e, r);
  }
done:
  e->st.step_ms += moe_time_ms_since(t0);
  pthread_mutex_lock(&e->mu);
  e->st_pub = e->st;
  if (e->layer_ms)
    memcpy(e->layer_ms_pub, e->layer_ms, 3 * (size_t)e->cfg.n_layer * sizeof(double));
  if (e->path_cnt) memcpy(e->path_cnt_pub, e->path_cnt, 3 * (size_t)e->n_moe * sizeof(int64_t));
  pthread_mutex_unlock(&e->mu);
  return st;
}

int moe_infer_step_logits(const moe_infer *e, const moe_infer_step_row **rows) {
  if (rows) *rows = e->rank == 0 ? e->last_rows : NULL;
  return e->rank == 0 ? e->n_last : 0;
}

void moe_infer_path_stats(moe_infer *e, int block, int64_t *evals, int64_t *accurate,
                          int64_t *finetune) {
  int64_t v[3] = {0, 0, 0};
  int i = -1;  // the block's index among the MoE blocks
  if (e->rank == 0 && e->path_cnt_pub && block >= 0 && block < e->cfg.n_layer &&
      e->user->impl[block]) {
    i = 0;
    for (int b = 0; b < block; b++) i += e->user->impl[b] != NULL;
    pthread_mutex_lock(&e->mu);
    memcpy(v, e->path_cnt_pub + 3 * i, sizeof v);
    pthread_mutex_unlock(&e->mu);
  }
  if (evals) *evals = v[0];
  if (accurate) *accurate = v[1];
  if (finetune) *finetune = v[2];
}

moe_status moe_infer_run(moe_infer *e) {
  moe_status st = MOE_STATUS_OK;
  while (moe_infer_pending(e) > 0) MOE_TRY(moe_infer_step(e));
done:
  return st;
}

// Waits for rank 0's next command without spinning a core: a non-blocking
// broadcast, tested with a sleep that grows from 20 us to 1 ms.
static moe_status recv_cmd(moe_infer *e, int32_t hdr[2]) {
  moe_status st = MOE_STATUS_OK;
  MPI_Request req;
  MOE_MPI_TRY(e->ctx, MPI_Ibcast(hdr, 2, MPI_INT32_T, 0, e->world, &req));
  long sleep_ns = 20000;
  for (;;) {
    int flag = 0;
    MOE_MPI_TRY(e->ctx, MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
    if (flag) break;
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < 1000000) sleep_ns *= 2;
  }
done:
  return st;
}

moe_status moe_infer_follow(moe_infer *e) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = e->ctx;
  MOE_FAIL_IF(ctx, e->rank == 0, MOE_STATUS_INVALID_ARG, "rank 0 steps; it does not follow");
  for (;;) {
    int32_t hdr[2] = {0, 0};
    MOE_TRY(recv_cmd(e, hdr));
    if (hdr[0] == CMD_STOP) break;
    MOE_FAIL_IF(ctx, hdr[0] != CMD_STEP || hdr[1] < 1 || hdr[1] > e->size * e->ic.step_rows,
                MOE_STATUS_INTERNAL, "bad step header {%d, %d} from rank 0", (int)hdr[0],
                (int)hdr[1]);
    MOE_MPI_TRY_OP(ctx, "infer step rows",
                   MPI_Bcast(e->plan, 4 * hdr[1], MPI_INT32_T, 0, e->world));
    MOE_TRY(run_rows(e, hdr[1]));
    MOE_TRY(placement_step(e));
    MOE_TRY(paths_step(e));
    MOE_TRY(trace_step(e));
  }
done:
  return st;
}

moe_status moe_infer_shutdown(moe_infer *e) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(e->ctx, e->rank != 0, MOE_STATUS_INVALID_ARG, "rank 0 shuts the engine down");
  pthread_mutex_lock(&e->mu);
  e->shutting_down = 1;
  for (rq *r = e->q_head; r; r = r->next) atomic_store(&r->cancel, 1);
  for (int g = 0; g < e->size * e->ic.slots; g++)
    if (e->slot_rq[g]) atomic_store(&e->slot_rq[g]->cancel, 1);
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  admit(e);  // every request ends, cancelled
  pthread_mutex_lock(&e->mu);
  e->st_pub = e->st;
  pthread_mutex_unlock(&e->mu);
  MOE_TRY(bcast_cmd(e, CMD_STOP, 0));
done:
  return st;
}
