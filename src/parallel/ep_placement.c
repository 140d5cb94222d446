// Placements of expert copies for load balancing (include/moe/parallel.h,
// docs/balance.md): the copy slots allocated at create, switching the
// placement between steps without allocating, the parameter transfer to the
// copies (Trans), and the load matrix the planners read.
//
// The rule (FasterMoE shadowing, Pro-Prophet's lightweight placement): a copy
// of expert e on EP rank p computes p's own tokens for e, which then leave the
// all-to-all (moe_placement_target); its gradients are added to the home's in
// the backward (Agg: gather_replica_grads in ep_layer.c). The optimizer state
// stays at home. The forward and the backward are the layer's: only which rank
// computes a row changes, and a row's result does not depend on the rows
// beside it (the batch-invariant GEMM), so outputs keep their bits; expert
// gradients are summed in another order (home + copies), equal to rounding.
//
// Trans (non-blocking sends and receives in the EP group) is posted by
// set_placement; the next forward's expert task waits for it only before a
// copy's rows (the home experts first), and the comm stream's background
// task (moe_ep_background_) completes it meanwhile, so everything before
// (in a model, the blocks before this layer; in the layer, the gate, the
// dispatch and the home experts) hides it. Every rank posted it before its
// forward, so no expert task waits for a transfer nobody posted (no
// deadlock under any schedule).
// Trans's wait and Agg are recorded as comm-stream tasks of a small graph
// for traces (moe_ep_layer_balance_pass).
// Deferred Agg (pc.defer_agg) is posted by the backward (ep_layer.c) into the
// buffers allocated here and completed by moe_ep_layer_grads_wait.
// Pro-Prophet's block-wise scheduler (moe_ep_layer_link): the layers of a
// model are linked, and each layer's executor has a background task on its
// comm stream that tests the other layers' pending Trans and Agg whenever
// the stream would wait (for the expert compute, or for the compute stream
// to finish), so they progress beside this layer's compute (a later block's
// Trans beside this block's forward, a later block's Agg beside this
// block's backward) instead of only inside other MPI calls.
#include <limits.h>
#include <math.h>
#include <string.h>

#include "moe/kernels.h"
#include "moe/parallel.h"
#include "parallel/parallel_internal.h"

// Never run: the graph only names Trans and Agg for traces.
static moe_status no_run(void *arg, moe_ctx *ctx) {
  (void)arg;
  (void)ctx;
  return MOE_STATUS_OK;
}

static moe_status balance_graph_init(moe_ep_layer *L) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(moe_task_graph_init(L->ctx, &L->bal_graph, 2, 0));
  static const char *const names[2] = {"Trans", "Agg"};
  for (int i = 0; i < 2; i++) {
    const moe_task_desc d = {MOE_STREAM_COMM, names[i], -1, no_run, NULL, NULL, NULL, NULL, 0};
    MOE_TRY(moe_task_graph_add(L->ctx, &L->bal_graph, &d, NULL));
  }
  memset(L->bal_rec, 0, sizeof L->bal_rec);
  for (int b = 0; b < 2; b++)
    for (int i = 0; i < 2; i++) L->bal_rec[b][i].stream = MOE_STREAM_COMM;
done:
  return st;
}

void moe_ep_layer_balance_pass(const moe_ep_layer *L, int backward, const moe_task_graph **graph,
                               const moe_task_record **records) {
  const int have = L && L->bal_graph.n_tasks == 2;
  if (graph) *graph = have ? &L->bal_graph : NULL;
  if (records) *records = have ? L->bal_rec[backward ? 1 : 0] : NULL;
}

void moe_ep_balance_record_(moe_ep_layer *L, int backward, uint64_t start_ns, uint64_t end_ns) {
  if (L->bal_graph.n_tasks != 2) return;
  const uint64_t t0 = backward ? L->bwd_start_ns : L->fwd_start_ns;
  moe_task_record *r = &L->bal_rec[backward ? 1 : 0][backward ? 1 : 0];
  r->ran = 1;
  r->start_ns = start_ns > t0 ? start_ns - t0 : 0;
  r->end_ns = end_ns > t0 ? end_ns - t0 : 0;
}

moe_status moe_ep_copies_init_(moe_ep_layer *L) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const int S = L->pc.copy_slots;
  if (S <= 0) goto done;
  const size_t nf = moe_ep_expert_floats_(L);
  L->copy_mem = moe_calloc((size_t)S * 2 * nf, sizeof(float));
  L->slot_expert = moe_malloc((size_t)S * sizeof(int));
  L->trans_mask = moe_calloc((size_t)L->E * (size_t)L->P, 1);
  L->expert_slot = moe_malloc((size_t)L->E * sizeof(int));
  L->reqs = moe_malloc((size_t)4 * L->E * L->P * sizeof(MPI_Request));
  L->trans_stats = moe_malloc((size_t)4 * L->E * L->P * sizeof(MPI_Status));
  MOE_FAIL_IF(ctx,
              !L->copy_mem || !L->slot_expert || !L->trans_mask || !L->expert_slot || !L->reqs ||
                  !L->trans_stats,
              MOE_STATUS_OUT_OF_MEMORY, "cannot allocate %d expert copy slots (%zu floats each)", S,
              2 * nf);
  for (int s = 0; s < S; s++) L->slot_expert[s] = -1;
  for (int e = 0; e < L->E; e++) L->expert_slot[e] = -1;
  MOE_TRY(balance_graph_init(L));
  if (L->pc.defer_agg) {
    // deferred Agg: a buffer per copy of this rank's home experts that can
    // arrive (each of the El home experts on each other rank, at most as many
    // as the other ranks' slots), and the requests
    MOE_FAIL_IF(ctx, nf > (size_t)INT_MAX, MOE_STATUS_INVALID_ARG,
                "deferred Agg: an expert's %zu floats exceed one MPI message (at most %d)", nf,
                INT_MAX);
    const int most = L->El * (L->P - 1), by_slots = S * (L->P - 1);
    L->agg_max = most < by_slots ? most : by_slots;
    L->agg_buf = moe_malloc((size_t)(L->agg_max > 0 ? L->agg_max : 1) * nf * sizeof(float));
    L->agg_reqs = moe_malloc((size_t)L->E * L->P * sizeof(MPI_Request));
    L->agg_stats = moe_malloc((size_t)L->E * L->P * sizeof(MPI_Status));
    MOE_FAIL_IF(ctx, !L->agg_buf || !L->agg_reqs || !L->agg_stats, MOE_STATUS_OUT_OF_MEMORY,
                "deferred Agg: cannot allocate buffers for %d copies (%zu floats each)", L->agg_max,
                nf);
  }
done:
  return st;
}

// Posts the placement's Trans and marks it pending (done without requests):
// every home sends each copy of trans_mask its parameters (4 parts; the
// receives are posted in the same (expert, part) order as the sends).
static moe_status trans_post(moe_ep_layer *L, moe_ctx *ctx) {
  moe_status st = MOE_STATUS_OK;
  {
    const int me = L->me, P = L->P;
    const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim;
    const size_t n[4] = {M * H, H, H * M, M};
    const uint8_t *replica = L->trans_mask;  // the same on every rank
    int nr = 0;
    for (int e = 0; e < L->E; e++) {
      const int home = L->placement.home[e];
      for (int p = 0; p < P; p++) {
        if (!replica[(size_t)e * P + p]) continue;
        float *parts[4] = {L->w1_of[e], L->b1_of[e], L->w2_of[e], L->b2_of[e]};
        for (int k = 0; k < 4; k++) {
          int rc = MPI_SUCCESS;
          if (me == home) {
            rc = MPI_Isend(parts[k], (int)n[k], MPI_FLOAT, p, 7301 + k, L->ep.comm, &L->reqs[nr++]);
          } else if (me == p) {
            rc = MPI_Irecv(parts[k], (int)n[k], MPI_FLOAT, home, 7301 + k, L->ep.comm,
                           &L->reqs[nr++]);
          }
          if (rc != MPI_SUCCESS) {
            L->n_reqs = nr - 1;  // the ones posted (a failed post makes no request)
            __atomic_store_n(&L->trans_state, MOE_EP_TRANS_FAILED, __ATOMIC_RELEASE);
            MOE_FAIL(ctx, MOE_STATUS_COMM,
                     "posting the expert parameters' transfer to their copies failed (MPI error "
                     "%d)",
                     rc);
          }
        }
      }
    }
    L->n_reqs = nr;
    __atomic_store_n(&L->trans_state, nr > 0 ? MOE_EP_TRANS_PENDING : MOE_EP_TRANS_DONE,
                     __ATOMIC_RELEASE);
  }
done:
  return st;
}

moe_status moe_ep_trans_wait_(moe_ep_layer *L) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  if (L->n_reqs <= 0) goto done;
  {
    const uint64_t t0 = moe_time_ns();
    const int n = L->n_reqs;
    L->n_reqs = 0;
    MOE_MPI_TRY_OP(ctx, "transfer of expert parameters to their copies",
                   MPI_Waitall(n, L->reqs, L->trans_stats));
    __atomic_store_n(&L->trans_state, MOE_EP_TRANS_DONE, __ATOMIC_RELEASE);
    L->trans_wait_ms += moe_time_ms_since(t0);
    moe_ep_balance_record_(L, 0, t0, moe_time_ns());
  }
done:
  return st;
}

static void unlink_layer(moe_ep_layer *L);

void moe_ep_copies_free_(moe_ep_layer *L) {
  unlink_layer(L);
  if (L->n_reqs > 0) moe_ep_trans_wait_(L);  // no request left behind the buffers
  if (L->n_agg > 0) MPI_Waitall(L->n_agg, L->agg_reqs, L->agg_stats);
  L->n_agg = 0;
  L->agg_pending = 0;
  moe_free(L->agg_buf);
  moe_free(L->agg_reqs);
  moe_free(L->agg_stats);
  L->agg_buf = NULL;
  L->agg_reqs = NULL;
  L->agg_stats = NULL;
  if (L->expert_slot && L->replica_mem) {
    for (int e = 0; e < L->E; e++)
      if (L->expert_slot[e] >= 0) L->replica_mem[e] = NULL;  // slot memory, not its own
  }
  moe_free(L->copy_mem);
  moe_free(L->slot_expert);
  moe_free(L->trans_mask);
  L->trans_mask = NULL;
  moe_free(L->expert_slot);
  moe_free(L->reqs);
  moe_free(L->trans_stats);
  moe_task_graph_free(&L->bal_graph);
  L->trans_stats = NULL;
  L->copy_mem = NULL;
  L->slot_expert = L->expert_slot = NULL;
  L->reqs = NULL;
}

static uint64_t bitmap_hash(const uint8_t *b, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (b[i] ? 1u : 0u)) * 1099511628211ull;
  return h;
}

// The checks every rank makes alike on the same bitmap (so they agree).
static moe_status check_placement(moe_ep_layer *L, const uint8_t *rep) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  if (L->pc.copy_slots <= 0) {  // only the empty placement fits (a no-op)
    for (size_t i = 0; i < (size_t)L->E * (size_t)L->P; i++)
      MOE_FAIL_IF(ctx, rep[i], MOE_STATUS_INVALID_ARG,
                  "the layer has no expert copy slots (moe_parallel_config.copy_slots is 0; "
                  "a placement with copies needs at least one)");
  }
  for (int e = 0; e < L->E; e++) {
    const int home = L->placement.home[e];
    MOE_FAIL_IF(ctx, rep[(size_t)e * L->P + home], MOE_STATUS_INVALID_ARG,
                "placement: EP rank %d is expert %d's home and cannot hold a copy of it", home, e);
  }
  for (int p = 0; p < L->P; p++) {
    int n = 0;
    for (int e = 0; e < L->E; e++) n += rep[(size_t)e * L->P + p] != 0;
    MOE_FAIL_IF(ctx, n > L->pc.copy_slots, MOE_STATUS_INVALID_ARG,
                "placement: EP rank %d would hold %d expert copies; the layer has %d copy "
                "slots per rank (moe_parallel_config.copy_slots)",
                p, n, L->pc.copy_slots);
  }
  // copies in the placement that set_placement did not make: set_replica's
  // (the bitmap is the same on every rank, so every rank sees them)
  for (int e = 0; L->n_placed == 0 && e < L->E; e++) {
    for (int p = 0; p < L->P; p++)
      MOE_FAIL_IF(ctx, L->placement.replica[(size_t)e * L->P + p], MOE_STATUS_INVALID_ARG,
                  "placement: expert %d has a replica made with moe_ep_layer_set_replica; "
                  "replicas and placements cannot be mixed",
                  e);
  }
done:
  return st;
}

// Points expert e's parameter pointers at slot s (or clears them, s < 0).
static void bind_slot(moe_ep_layer *L, int e, int s) {
  const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim;
  if (s < 0) {
    L->replica_mem[e] = NULL;
    L->w1_of[e] = L->b1_of[e] = L->w2_of[e] = L->b2_of[e] = NULL;
    L->expert_slot[e] = -1;
    return;
  }
  float *m = L->copy_mem + (size_t)s * 2 * moe_ep_expert_floats_(L);
  L->replica_mem[e] = m;
  L->w1_of[e] = m;
  L->b1_of[e] = m + M * H;
  L->w2_of[e] = m + M * H + H;
  L->b2_of[e] = m + 2 * M * H + H;
  L->expert_slot[e] = s;
  L->slot_expert[s] = e;
}

// One layer's checks on its bitmap (every rank makes them alike).
static moe_status placement_local(moe_ep_layer *L, const uint8_t *replica) {
  moe_ctx *ctx = L->ctx;
  if (!replica)
    return moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                        "placement: the bitmap must not be NULL");
  if (L->agg_pending)
    return moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                        "placement: the last backward's gradients are pending (deferred Agg): "
                        "call moe_ep_layer_grads_wait first");
  return check_placement(L, replica);
}

// Steps 2 and 3 of a placement agreed on: this rank's slots (free the copies
// dropped, take new ones), then Trans.
static moe_status placement_apply(moe_ep_layer *L, const uint8_t *replica) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const size_t EP = (size_t)L->E * (size_t)L->P;
  if (L->pc.copy_slots <= 0) goto done;  // checked: the empty placement, nothing to do
  L->have_forward = 0;
  MOE_TRY(moe_ep_trans_wait_(L));  // the last placement's Trans, if no forward took it
  // step 2: this rank's slots: free the copies dropped, then take new ones
  const int me = L->me, P = L->P;
  for (int e = 0; e < L->E; e++) {
    if (L->expert_slot[e] >= 0 && !replica[(size_t)e * P + me]) {
      L->slot_expert[L->expert_slot[e]] = -1;
      bind_slot(L, e, -1);
    }
  }
  for (int e = 0; e < L->E; e++) {
    if (!replica[(size_t)e * P + me] || L->expert_slot[e] >= 0) continue;
    int s = 0;
    while (s < L->pc.copy_slots && L->slot_expert[s] >= 0) s++;  // checked: one is free
    bind_slot(L, e, s);
  }
  L->n_placed = 0;
  for (size_t i = 0; i < EP; i++) L->n_placed += replica[i] != 0;
  // the copies that get parameters: every one, or with frozen parameters
  // the new ones only (a kept copy's slot still holds them)
  for (size_t i = 0; i < EP; i++)
    L->trans_mask[i] = replica[i] && (!L->pc.frozen_params || !L->placement.replica[i]);
  for (size_t i = 0; i < EP; i++) L->placement.replica[i] = replica[i] ? 1 : 0;
  // step 3: Trans, posted now: it travels while everything before the
  // next forward's expert tasks runs (in a model, the blocks before it)
  {
    const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim;
    MOE_FAIL_IF(ctx, M * H > (size_t)INT_MAX, MOE_STATUS_INVALID_ARG,
                "placement: an expert's weight (%zu floats) exceeds MPI's int count", M * H);
    const uint64_t t0 = moe_time_ns();
    L->n_reqs = 0;
    L->trans_wait_ms = 0.0;
    MOE_TRY(trans_post(L, ctx));  // sets the state: pending, or done without requests
    L->trans_post_ms = moe_time_ms_since(t0);
  }
done:
  return st;
}

moe_status moe_ep_layers_set_placement(moe_ep_layer *const *layers, int n,
                                       const uint8_t *const *replicas) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = n > 0 && layers && layers[0] ? layers[0]->ctx : NULL;
  MOE_FAIL_IF(ctx, n < 1 || !layers || !replicas, MOE_STATUS_INVALID_ARG,
              "placement: %d layers (must be >= 1, with arrays of layers and bitmaps)", n);
  for (int i = 0; i < n; i++)
    MOE_FAIL_IF(ctx, !layers[i], MOE_STATUS_INVALID_ARG, "placement: layer %d is NULL", i);
  {
    // step 1: the same checks on every rank, then one agreement on every
    // layer's verdict and on a hash of every bitmap
    moe_ep_layer *L0 = layers[0];
    moe_status local = MOE_STATUS_OK;
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n && local == MOE_STATUS_OK; i++) {
      moe_ep_layer *L = layers[i];
      int same = MPI_UNEQUAL;
      if (i > 0) MPI_Comm_compare(L->world, L0->world, &same);
      if (i > 0 && same != MPI_IDENT && same != MPI_CONGRUENT)
        local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                             "placement: layer %d is on other ranks than layer 0", i);
      else
        local = placement_local(L, replicas[i]);
      if (local != MOE_STATUS_OK && L->ctx != ctx)
        moe_error_at(ctx, local, __FILE__, __LINE__, "%s", moe_ctx_error(L->ctx));
      if (local == MOE_STATUS_OK)
        h = (h ^ bitmap_hash(replicas[i], (size_t)L->E * (size_t)L->P)) * 1099511628211ull;
    }
    // max of (failed, h, ~h): every rank failed alike, or all passed with one bitmap
    uint64_t v[3] = {local != MOE_STATUS_OK, h, ~h};
    MOE_MPI_TRY_OP(ctx, "placement agreement",
                   MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_UINT64_T, MPI_MAX, L0->world));
    if (v[0]) {  // someone failed: agree on who (the message is on that rank)
      MOE_TRY(moe_comm_agree(ctx, L0->world, local, "set_placement"));
      MOE_FAIL(ctx, MOE_STATUS_INTERNAL, "placement: a rank failed but none says so");
    }
    MOE_FAIL_IF(ctx, v[1] != ~v[2], MOE_STATUS_INVALID_ARG,
                "placement: the bitmaps differ between ranks; every rank must pass the same (plan "
                "from all-gathered counts)");
  }
  for (int i = 0; i < n; i++) {
    st = placement_apply(layers[i], replicas[i]);
    if (st != MOE_STATUS_OK && layers[i]->ctx != ctx)
      moe_error_at(ctx, st, __FILE__, __LINE__, "%s", moe_ctx_error(layers[i]->ctx));
    if (st != MOE_STATUS_OK) goto done;
  }
done:
  return st;
}

moe_status moe_ep_layer_set_placement(moe_ep_layer *L, const uint8_t *replica) {
  if (!L) return MOE_STATUS_INVALID_ARG;
  return moe_ep_layers_set_placement(&L, 1, &replica);
}

moe_status moe_ep_layers_load(moe_ep_layer *const *layers, int n, int64_t *counts) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = n > 0 && layers && layers[0] ? layers[0]->ctx : NULL;
  MPI_Datatype rows = MPI_DATATYPE_NULL, block = MPI_DATATYPE_NULL;
  MOE_FAIL_IF(ctx, n < 1 || !layers || !counts, MOE_STATUS_INVALID_ARG,
              "load: %d layers (must be >= 1, with the layers and a counts buffer)", n);
  const moe_ep_layer *L0 = layers[0];
  const int E = L0->E, P = L0->P;
  for (int i = 0; i < n; i++) {
    MOE_FAIL_IF(ctx, !layers[i], MOE_STATUS_INVALID_ARG, "load: layer %d is NULL", i);
    int same = MPI_IDENT;
    if (i > 0) MPI_Comm_compare(layers[i]->ep.comm, L0->ep.comm, &same);
    MOE_FAIL_IF(
        ctx, layers[i]->E != E || layers[i]->P != P || (same != MPI_IDENT && same != MPI_CONGRUENT),
        MOE_STATUS_INVALID_ARG, "load: layer %d has another EP group or expert count than layer 0",
        i);
  }
  {
    // this rank's kept rows per expert of every layer (0 before a forward),
    // all-gathered in the EP group in one call: rank p's n rows of E land at
    // p * E of each layer's (P, E) matrix (a vector type resized to one row)
    const size_t PE = (size_t)P * (size_t)E;
    for (int i = 0; i < n; i++)
      for (int e = 0; e < E; e++)
        counts[i * PE + (size_t)L0->me * E + e] = layers[i]->route.count[e];
    MOE_MPI_TRY_OP(ctx, "the load's row type", MPI_Type_vector(n, E, (int)PE, MPI_INT64_T, &rows));
    MOE_MPI_TRY_OP(ctx, "the load's row type",
                   MPI_Type_create_resized(rows, 0, (MPI_Aint)(E * sizeof(int64_t)), &block));
    MOE_MPI_TRY_OP(ctx, "the load's row type", MPI_Type_commit(&block));
    MOE_MPI_TRY_OP(
        ctx, "all-gather of the routing counts",
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, counts, 1, block, L0->ep.comm));
    // summed over the DP groups (same EP index)
    MOE_FAIL_IF(ctx, (size_t)n * PE > (size_t)INT_MAX, MOE_STATUS_INVALID_ARG,
                "load: %d layers of %d x %d counts exceed MPI's int count", n, P, E);
    MOE_MPI_TRY_OP(
        ctx, "sum of the routing counts over the DP groups",
        MPI_Allreduce(MPI_IN_PLACE, counts, (int)((size_t)n * PE), MPI_INT64_T, MPI_SUM, L0->dp));
  }
done:
  if (block != MPI_DATATYPE_NULL) MPI_Type_free(&block);
  if (rows != MPI_DATATYPE_NULL) MPI_Type_free(&rows);
  return st;
}

moe_status moe_ep_layer_load(moe_ep_layer *L, int64_t *counts) {
  moe_ctx *ctx = L ? L->ctx : NULL;
  if (!L || !counts)
    return ctx ? moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                              "layer and counts must not be NULL")
               : MOE_STATUS_INVALID_ARG;
  return moe_ep_layers_load(&L, 1, counts);
}

// ---- linked layers: the background task -------------------------------------------------

// Tests q's pending Trans once; marks it done (or failed) for q's expert
// tasks. Completed requests become MPI_REQUEST_NULL, so q's own
// MPI_Waitall later returns at once.
static moe_status test_trans(moe_ep_layer *q, moe_ctx *ctx, int *all) {
  if (q->n_reqs <= 0 || __atomic_load_n(&q->trans_state, __ATOMIC_ACQUIRE) != MOE_EP_TRANS_PENDING)
    return MOE_STATUS_OK;
  int flag = 0;
  const int rc = MPI_Testall(q->n_reqs, q->reqs, &flag, q->trans_stats);
  if (rc != MPI_SUCCESS) {
    __atomic_store_n(&q->trans_state, MOE_EP_TRANS_FAILED, __ATOMIC_RELEASE);
    return moe_error_at(ctx, MOE_STATUS_COMM, __FILE__, __LINE__,
                        "test of the expert parameters' transfer to their copies failed (MPI "
                        "error %d)",
                        rc);
  }
  if (flag) __atomic_store_n(&q->trans_state, MOE_EP_TRANS_DONE, __ATOMIC_RELEASE);
  *all &= flag != 0;
  return MOE_STATUS_OK;
}

// The comm stream's background task of L's passes: one non-blocking test of
// L's own pending Trans (its expert tasks wait for it before a copy's rows)
// and of every linked layer's pending Trans and deferred Agg. Done when
// nothing is pending. Runs on L's comm thread during L's pass, while the
// caller's thread runs L's compute tasks and touches no linked layer.
moe_status moe_ep_background_(void *arg, moe_ctx *ctx, moe_task_state *state) {
  moe_status st = MOE_STATUS_OK;
  moe_ep_layer *L = arg;
  int all = 1;
  MOE_TRY(test_trans(L, ctx, &all));
  for (int i = 0; i < L->n_peers; i++) {
    moe_ep_layer *q = L->peers[i];
    MOE_TRY(test_trans(q, ctx, &all));
    if (q->agg_pending && q->n_agg > 0) {
      int flag = 1;
      MOE_MPI_TRY_OP(ctx, "test of a linked layer's Agg",
                     MPI_Testall(q->n_agg, q->agg_reqs, &flag, q->agg_stats));
      all &= flag != 0;
    }
  }
  if (L->bg_extra) {  // its failure ends only its own polling (its owner meets the error)
    moe_task_state extra = MOE_TASK_DONE;
    if (L->bg_extra(L->bg_extra_arg, ctx, &extra) != MOE_STATUS_OK) {
      moe_ctx_clear_error(ctx);
      extra = MOE_TASK_DONE;
    }
    all &= extra == MOE_TASK_DONE;
  }
  *state = all ? MOE_TASK_DONE : MOE_TASK_PENDING;
done:
  return st;
}

static void unlink_layer(moe_ep_layer *L) {
  for (int i = 0; i < L->n_peers; i++) {
    moe_ep_layer *q = L->peers[i];
    int k = 0;
    for (int j = 0; j < q->n_peers; j++)
      if (q->peers[j] != L) q->peers[k++] = q->peers[j];
    q->n_peers = k;
  }
  moe_free(L->peers);
  L->peers = NULL;
  L->n_peers = 0;
}

void moe_ep_layer_set_background_extra(moe_ep_layer *layer, moe_task_test_fn test, void *arg) {
  if (!layer) return;
  layer->bg_extra = test;
  layer->bg_extra_arg = arg;
}

moe_status moe_ep_layer_link(moe_ep_layer *const *layers, int n) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = n > 0 && layers && layers[0] ? layers[0]->ctx : NULL;
  MOE_FAIL_IF(ctx, n < 0 || (n > 0 && !layers), MOE_STATUS_INVALID_ARG,
              "link: %d layers (must be >= 0, with an array)", n);
  for (int i = 0; i < n; i++) {
    MOE_FAIL_IF(ctx, !layers[i], MOE_STATUS_INVALID_ARG, "link: layer %d is NULL", i);
    for (int j = 0; j < i; j++)
      MOE_FAIL_IF(ctx, layers[j] == layers[i], MOE_STATUS_INVALID_ARG,
                  "link: layer %d is layer %d again", i, j);
    MOE_FAIL_IF(ctx, layers[i]->agg_pending || layers[i]->n_reqs > 0, MOE_STATUS_INVALID_ARG,
                "link: layer %d has transfers pending (link before placing copies)", i);
  }
  for (int i = 0; i < n; i++) {
    unlink_layer(layers[i]);
  }
  for (int i = 0; i < n && n > 1; i++) {
    moe_ep_layer *L = layers[i];
    L->peers = moe_calloc((size_t)n - 1, sizeof *L->peers);
    MOE_FAIL_IF(L->ctx, !L->peers, MOE_STATUS_OUT_OF_MEMORY, "link: out of memory");
    for (int j = 0; j < n; j++)
      if (j != i) L->peers[L->n_peers++] = layers[j];
  }
done:
  if (st == MOE_STATUS_OUT_OF_MEMORY)
    for (int i = 0; i < n; i++) unlink_layer(layers[i]);
  return st;
}

double moe_ep_layer_agg_ms(const moe_ep_layer *L) { return L ? L->agg_wait_ms : 0.0; }

moe_executor_background moe_ep_layer_background(const moe_ep_layer *L, int backward) {
  moe_executor_background b;
  memset(&b, 0, sizeof b);
  if (L) b = L->bg_stats[backward ? 1 : 0];
  return b;
}

double moe_ep_layer_trans_wait_ms(const moe_ep_layer *L) { return L ? L->trans_wait_ms : 0.0; }

int moe_ep_layer_trans_copies(const moe_ep_layer *L) {
  int n = 0;
  if (!L || !L->trans_mask) return 0;
  for (size_t i = 0; i < (size_t)L->E * (size_t)L->P; i++) n += L->trans_mask[i] != 0;
  return n;
}

double moe_ep_layer_trans_ms(const moe_ep_layer *L) {
  return L ? L->trans_post_ms + L->trans_wait_ms : 0.0;
}

// This EP group's g (local): see moe_ep_layer_ranks_per_node.
static int group_ranks_per_node(const moe_ep_layer *L) {
  if (L->ep.num_nodes < 2 || L->P % L->ep.num_nodes != 0) return 0;
  const int g = L->P / L->ep.num_nodes;
  // node ids follow the lowest member rank (moe_group), so a block layout
  // numbers its nodes 0, 1, ... in rank order
  for (int p = 0; p < L->P; p++)
    if (L->ep.node_of[p] != p / g) return 0;
  return g;
}

moe_status moe_ep_layer_ranks_per_node(moe_ep_layer *L, int *ranks_per_node) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L || !ranks_per_node, MOE_STATUS_INVALID_ARG,
              "layer and ranks_per_node must not be NULL");
  {
    // every EP group of the world plans from the same load and must reach the
    // same bitmap: the same g everywhere, or the flat form
    const int g = group_ranks_per_node(L);
    int v[2] = {g, -g};
    MOE_MPI_TRY_OP(ctx, "all-reduce of the ranks per node",
                   MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MAX, L->world));
    *ranks_per_node = v[0] == -v[1] ? g : 0;
  }
done:
  return st;
}

moe_status moe_ep_layer_compute_slots(moe_ep_layer *L, double *slots) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L || !slots, MOE_STATUS_INVALID_ARG, "layer and slots must not be NULL");
  if (L->compute_slots > 0) {  // known: the machine does not change
    *slots = L->compute_slots;
    goto done;
  }
  {
    // a rank's share of a core among all the world's ranks on its host, summed
    // over the EP group
    double share = 1.0;
    MOE_TRY(moe_comm_cpu_share(ctx, L->world, &share));
    MOE_MPI_TRY_OP(ctx, "all-reduce of the compute slots",
                   MPI_Allreduce(MPI_IN_PLACE, &share, 1, MPI_DOUBLE, MPI_SUM, L->ep.comm));
    // the same on every rank of the world (every EP group plans from the same
    // load and must reach the same bitmap): the least of the groups'
    MOE_MPI_TRY_OP(ctx, "all-reduce of the compute slots",
                   MPI_Allreduce(MPI_IN_PLACE, &share, 1, MPI_DOUBLE, MPI_MIN, L->world));
    *slots = L->compute_slots = share;
  }
done:
  return st;
}

moe_status moe_ep_layer_rates(moe_ep_layer *L, double *flops, double *net) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L || !flops || !net, MOE_STATUS_INVALID_ARG,
              "layer, flops_per_s and net_bytes_per_s must not be NULL");
  {
    const double gemm_s = (L->fwd_timing.expert_gemm_ms + L->bwd_timing.expert_gemm_ms) * 1e-3;
    double f = gemm_s > 0 ? (L->fwd_timing.expert_flops + L->bwd_timing.expert_flops) / gemm_s : 0;
    // per pass (forward, backward) and kind (A1, A2): this rank's all-to-all time
    double a2a_s[4] = {0.0, 0.0, 0.0, 0.0};
    for (int d = 0; d < 2; d++) {
      const moe_task_graph *g = NULL;
      const moe_task_record *rec = NULL;
      moe_ep_layer_last_pass(L, d, &g, &rec);
      for (int i = 0; g && rec && i < g->n_tasks; i++) {
        const int k = g->tasks[i].kind;
        if ((k == MOE_CT_A1 || k == MOE_CT_A2) && rec[i].ran)
          a2a_s[2 * d + (k == MOE_CT_A2)] += (double)(rec[i].end_ns - rec[i].start_ns) * 1e-9;
      }
    }
    // The link rate, as the per-link model charges it (moe_balance_cost): each
    // of the 4 all-to-alls carries, over the busiest link (the slow one: the
    // node's, when the EP group spans several nodes), the larger of the rows
    // a rank sends away and receives, M floats each; it takes the time of the
    // rank that waited least inside it (one that arrived early also waits for
    // the last, which is load imbalance, not transfer).
    const int across = L->ep.num_nodes > 1;
    const long long away = moe_ep_rows_sent_away_(L, across);
    const long long from = moe_ep_rows_received_from_away_(L, across);
    double link = (double)(away > from ? away : from);
    // The GEMM rate of a rank with a core to itself: the slowest rank's when
    // every rank has one; when ranks share cores (moe_ep_layer_compute_slots)
    // the fastest rank's, as the rates of the others are slowed by the sharing
    // (the models count it in moe_balance_cost.compute_slots).
    double slots = (double)L->P;
    MOE_TRY(moe_ep_layer_compute_slots(L, &slots));
    const int shared = slots < (double)L->P - 1e-9;
    if (f <= 0) f = shared ? 0.0 : INFINITY;  // no rows here: not the rank to go by
    MOE_MPI_TRY_OP(
        ctx, "all-reduce of the measured rates",
        MPI_Allreduce(MPI_IN_PLACE, &f, 1, MPI_DOUBLE, shared ? MPI_MAX : MPI_MIN, L->world));
    MOE_MPI_TRY_OP(ctx, "all-reduce of the measured rates",
                   MPI_Allreduce(MPI_IN_PLACE, &link, 1, MPI_DOUBLE, MPI_MAX, L->world));
    MOE_MPI_TRY_OP(ctx, "all-reduce of the measured rates",
                   MPI_Allreduce(MPI_IN_PLACE, a2a_s, 4, MPI_DOUBLE, MPI_MIN, L->world));
    const double bt[2] = {4.0 * link * (double)L->cfg.model_dim * 4.0,
                          a2a_s[0] + a2a_s[1] + a2a_s[2] + a2a_s[3]};
    *flops = isfinite(f) && f > 0 ? f : 0.0;
    *net = bt[0] > 0 && bt[1] > 0 ? bt[0] / bt[1] : 0.0;
  }
done:
  return st;
}
