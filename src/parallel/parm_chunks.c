// s1 and s2's EP&ESP pass cut into chunks and run as tasks on the two-stream
// executor (moe/sched.h): Parm's Dump + all-to-all, the expert shards and the
// all-to-all back, pipelined with ScheMoE's task schedules (docs/parm.md
// "Chunks and task schedules").
//
// Chunk c of r holds rows [n c / r, n (c + 1) / r) of each block of n rows
// that one member sends another: on the way there my part of EP rank g's
// experts (grows[g] rows at gfirst[g] of xs, sent whole to each of g's ESP
// shards: the Dump, as overlapping send displacements), which member q
// receives as its section of member_rows[q] rows; the way back is the same
// blocks the other way. Both ends cut a block of the same size, so they agree
// on every chunk without another counts exchange. The received rows keep the
// unchunked pass's layout (member-major, each member's rows expert-major),
// so the backward finds the forward's activations where the unchunked pass
// leaves them, and every chunk's rows are their own region of each buffer:
// tasks of different chunks never touch the same memory.
//
// Tasks of chunk c (moe_chunk_pass_build, no compression):
//   A1^c  all-to-all of chunk c's rows (comm stream): xs -> xr (forward) or
//         the gradients -> yr (backward)
//   E^c   the shards on chunk c's rows of every (member, expert) block:
//         forward xr -> pre, h, yr; backward dy in yr -> dx in yr, the
//         weight gradients added to the scratch (over chunks: the sum's
//         order changes with r, within rounding)
//   A2^c  all-to-all of chunk c's outputs (yr) back into the caller's buffer
//         at back_at (comm stream)
#define _POSIX_C_SOURCE 200809L
#include <string.h>

#include "parallel/parm_internal.h"

// The plan's arrays, each (r x P) bytes, index c x P + member:
enum {
  CH_SEND_BYTES = 0,  // way there: chunk c of my part for member q's EP rank
  CH_SEND_AT,         //   where it starts in xs (the Dump: the same for g's shards)
  CH_RECV_BYTES,      // chunk c of member q's section of the received rows
  CH_RECV_AT,         //   where it starts in xr / yr (also the way back's send side)
  CH_BACK_AT,         // way back: where chunk c of member q's partials lands
  CH_ARRAYS
};

// Rows before chunk c of r of a block of n rows.
static size_t cut(size_t n, int c, int r) { return n * (size_t)c / (size_t)r; }

static size_t *ch_at(const moe_parm_layer *L, int kind, int c) {
  return L->ch + ((size_t)kind * (size_t)L->r + (size_t)c) * (size_t)L->P;
}

// Every chunk's counts and displacements for this pass's blocks.
static void plan(moe_parm_layer *L, const size_t *back_at) {
  const size_t row = (size_t)L->M * sizeof(float);
  size_t section = 0;
  for (int q = 0; q < L->P; q++) {
    const int g = q / L->ESP;
    const size_t ng = (size_t)L->grows[g], nm = (size_t)L->member_rows[q];
    for (int c = 0; c < L->r; c++) {
      const size_t lo = cut(ng, c, L->r), hi = cut(ng, c + 1, L->r);
      ch_at(L, CH_SEND_BYTES, c)[q] = (hi - lo) * row;
      ch_at(L, CH_SEND_AT, c)[q] = ((size_t)L->gfirst[g] + lo) * row;
      ch_at(L, CH_BACK_AT, c)[q] = (back_at[q] + lo) * row;
      const size_t rlo = cut(nm, c, L->r), rhi = cut(nm, c + 1, L->r);
      ch_at(L, CH_RECV_BYTES, c)[q] = (rhi - rlo) * row;
      ch_at(L, CH_RECV_AT, c)[q] = (section + rlo) * row;
    }
    section += nm;
  }
}

static moe_status task_a1(void *arg, moe_ctx *ctx) {
  moe_parm_task_arg *a = arg;
  moe_parm_layer *L = a->L;
  const int c = a->chunk;
  return moe_a2a_start(ctx, L->algo, &L->a2a, L->xs, ch_at(L, CH_SEND_BYTES, c),
                       ch_at(L, CH_SEND_AT, c), a->backward ? L->yr : L->xr,
                       ch_at(L, CH_RECV_BYTES, c), ch_at(L, CH_RECV_AT, c), &L->a2a_ws,
                       &L->pending);
}

static moe_status task_a2(void *arg, moe_ctx *ctx) {
  moe_parm_task_arg *a = arg;
  moe_parm_layer *L = a->L;
  const int c = a->chunk;
  return moe_a2a_start(ctx, L->algo, &L->a2a, L->yr, ch_at(L, CH_RECV_BYTES, c),
                       ch_at(L, CH_RECV_AT, c), L->ch_back, ch_at(L, CH_SEND_BYTES, c),
                       ch_at(L, CH_BACK_AT, c), &L->a2a_ws, &L->pending);
}

// The A tasks are split tasks: one all-to-all is in flight at a time (the
// communication stream runs its tasks one after another).
static moe_status task_a_test(void *arg, moe_ctx *ctx, moe_task_state *state) {
  moe_parm_task_arg *a = arg;
  int done = 0;
  const moe_status st = moe_a2a_test(ctx, &a->L->pending, &done);
  *state = done ? MOE_TASK_DONE : MOE_TASK_PENDING;
  return st;
}

static moe_status task_a_wait(void *arg, moe_ctx *ctx) {
  moe_parm_task_arg *a = arg;
  return moe_a2a_wait(ctx, &a->L->pending);
}

// The shards on chunk c's rows: in each member's section, the part of each
// local expert's block that falls in the chunk.
static moe_status task_e(void *arg, moe_ctx *ctx) {
  (void)ctx;
  moe_parm_task_arg *a = arg;
  moe_parm_layer *L = a->L;
  const uint64_t t0 = moe_time_ns();
  size_t section = 0;
  for (int q = 0; q < L->P; q++) {
    const size_t nm = (size_t)L->member_rows[q];
    const size_t lo = cut(nm, a->chunk, L->r), hi = cut(nm, a->chunk + 1, L->r);
    size_t b0 = 0;
    for (int el = 0; el < L->Eh && b0 < hi; el++) {
      const size_t b1 = b0 + (size_t)L->cnt_recv[q * L->Eh + el];
      const size_t from = b0 > lo ? b0 : lo, to = b1 < hi ? b1 : hi;
      if (to > from)
        moe_parm_shard_block_(L, a->backward, section + from, to - from, (size_t)el, L->yr,
                              L->ch_pass_tm);
      b0 = b1;
    }
    section += nm;
  }
  L->ch_expert_ns += moe_time_ns() - t0;
  return MOE_STATUS_OK;
}

moe_status moe_parm_chunks_init_(moe_parm_layer *L) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const int r = L->pc.chunks, max_tasks = MOE_CT_KINDS * r;
  MOE_TRY(moe_schedule_algo_find(ctx, L->pc.task_schedule, &L->tsched));
  L->r = r;
  L->ch = moe_calloc((size_t)CH_ARRAYS * (size_t)r * (size_t)L->P, sizeof(size_t));
  L->targ = moe_calloc(2 * (size_t)r, sizeof *L->targ);
  MOE_FAIL_IF(ctx, !L->ch || !L->targ, MOE_STATUS_OUT_OF_MEMORY,
              "cannot allocate the Parm chunk plan (%d chunks)", r);
  const moe_chunk_task_fns none = {NULL, NULL, NULL};
  moe_chunk_task_fns fns[MOE_CT_KINDS] = {none, none, none, none, none, none, none};
  fns[MOE_CT_A1] = (moe_chunk_task_fns){task_a1, task_a_test, task_a_wait};
  fns[MOE_CT_E] = (moe_chunk_task_fns){task_e, NULL, NULL};
  fns[MOE_CT_A2] = (moe_chunk_task_fns){task_a2, task_a_test, task_a_wait};
  void *args[MOE_MAX_CHUNKS];
  for (int dir = 0; dir < 2; dir++) {
    for (int c = 0; c < r; c++) {
      moe_parm_task_arg *a = &L->targ[dir * r + c];
      a->L = L;
      a->chunk = c;
      a->backward = dir;
      args[c] = a;
    }
    MOE_TRY(moe_task_graph_init(ctx, &L->graph[dir], max_tasks, max_tasks));
    MOE_TRY(moe_schedule_init(ctx, &L->order[dir], max_tasks));
    MOE_TRY(moe_chunk_pass_build(ctx, L->tsched, r, 0, dir, fns, args, &L->graph[dir],
                                 &L->order[dir], NULL));
  }
  MOE_TRY(moe_executor_create(ctx, &L->pc.exec, max_tasks, &L->ex));
done:
  return st;
}

void moe_parm_chunks_free_(moe_parm_layer *L) {
  moe_executor_destroy(L->ex);
  L->ex = NULL;
  for (int dir = 0; dir < 2; dir++) {
    moe_task_graph_free(&L->graph[dir]);
    moe_schedule_free(&L->order[dir]);
  }
  moe_workspace_free(&L->a2a_ws);
  moe_free(L->ch);
  moe_free(L->targ);
  L->ch = NULL;
  L->targ = NULL;
}

moe_status moe_parm_chunked_pass_(moe_parm_layer *L, int backward, float *back,
                                  const size_t *back_at, moe_layer_timing *tm, double *expert_ms) {
  plan(L, back_at);
  L->ch_back = back;
  L->ch_pass_tm = tm;
  L->ch_expert_ns = 0;
  const moe_status st = moe_executor_run(L->ex, &L->graph[backward], &L->order[backward], L->ctx);
  // An all-to-all still in flight can be neither cancelled nor freed, and its
  // buffers are this layer's: the layer refuses further passes.
  if (st != MOE_STATUS_OK && L->pending.active) L->broken = 1;
  *expert_ms = (double)L->ch_expert_ns * 1e-6;
  return st;
}
