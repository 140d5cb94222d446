// The chunked forward and backward passes of the expert-parallel layer
// (include/moe/parallel.h), run as task graphs on the two-stream executor
// (include/moe/sched.h, docs/scheduling.md).
//
// Forward, on EP rank `me` of P ranks:
//   1. gate + routing on my T tokens; allreduce of the loss statistics and an
//      error flag over the world (caller's thread)
//   2. dispatch rows into route (expert) order; counts exchange: for every peer,
//      rows per expert plus my capacity, so both sides cut every (source,
//      expert) block into the same chunks (plan_chunks); pack the rows into
//      sendbuf in (chunk, destination, expert) order
//   3. one executor pass of r chunks x ScheMoE's tasks
//        C1 compress my chunk's blocks (compute)    A1 all-to-all (comm)
//        D1 decompress what arrived (compute)       E  experts on the chunk's rows
//        C2 compress the outputs                     A2 all-to-all back
//        D2 decompress into sendbuf
//      (C and D tasks exist only with a compressor), in the order of the
//      schedule (src/sched/schedules.c)
//   4. unpack sendbuf into route order, combine
// Backward is the same with the gradients: combine backward, pack dY, one pass
// whose E tasks run the expert backward (weight gradients accumulate over the
// chunks), unpack, dispatch backward, gate backward, then the reductions of
// ep_layer.c. Compression applies to the backward only with compress_backward.
//
// Buffers of a pass (rows of M floats unless said):
//   sendbuf (chunk, dest, expert)   bufa (chunk, source, expert)
//   ex_x, bufb, pre, h, dh, dpre (chunk, expert, source): expert-major, so each
//   expert's rows of a chunk are contiguous for its GEMMs; ex_x, pre and h keep
//   the forward's activations for the backward
//   csend, crecv: compressed (chunk, peer) blocks, each at a 64-byte boundary
// Chunk c of every buffer is its own region, so tasks of different chunks never
// touch the same memory, and A2^c may overwrite chunk c of sendbuf (or csend)
// because A1^c, which read it, precedes it in the chain.
//
// A compressor can refuse its input (int8 and zfp reject NaN/Inf). Such a
// failure must not leave peers waiting in an all-to-all, so compression tasks
// record it, zero their output and let the pass finish; the ranks then agree
// on the failure and every rank returns an error.
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "moe/expert.h"
#include "moe/kernels.h"
#include "moe/layer_ops.h"
#include "parallel/parallel_internal.h"

#define IDX3(L, c, p, e) \
  ((((size_t)(c) * (size_t)(L)->P) + (size_t)(p)) * (size_t)(L)->E + (size_t)(e))
#define IDX2(L, c, p) ((size_t)(c) * (size_t)(L)->P + (size_t)(p))
#define CBLOCK_ALIGN 64  // compressed blocks start at multiples of this many bytes

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// ---- setup -------------------------------------------------------------------------------

static moe_status task_c1(void *arg, moe_ctx *ctx);
static moe_status task_a1(void *arg, moe_ctx *ctx);
static moe_status task_d1(void *arg, moe_ctx *ctx);
static moe_status task_e(void *arg, moe_ctx *ctx);
static moe_status task_c2(void *arg, moe_ctx *ctx);
static moe_status task_a2(void *arg, moe_ctx *ctx);
static moe_status task_d2(void *arg, moe_ctx *ctx);
static moe_status task_a_test(void *arg, moe_ctx *ctx, moe_task_state *state);
static moe_status task_a_wait(void *arg, moe_ctx *ctx);

// Builds the task graph of one direction and its schedule.
static moe_status build_pass(moe_ep_layer *L, int dir) {
  moe_status st = MOE_STATUS_OK;
  const int r = L->r;
  const int compressed = L->compress_on && (dir == 0 || L->pc.compress_backward);
  moe_chunk_task_fns fns[MOE_CT_KINDS] = {
      {task_c1, NULL, NULL}, {task_a1, task_a_test, task_a_wait},
      {task_d1, NULL, NULL}, {task_e, NULL, NULL},
      {task_c2, NULL, NULL}, {task_a2, task_a_test, task_a_wait},
      {task_d2, NULL, NULL}};
  void **args = moe_calloc((size_t)r, sizeof *args);
  MOE_FAIL_IF(L->ctx, !args, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate task arguments");
  for (int c = 0; c < r; c++) {
    moe_ep_task_arg *a = &L->targ[dir * r + c];
    a->L = L;
    a->chunk = c;
    a->backward = dir;
    a->compressed = compressed;
    args[c] = a;
  }
  st = moe_chunk_pass_build(L->ctx, L->sched, r, compressed, dir, fns, args, &L->graph[dir],
                            &L->order[dir], NULL);
done:
  moe_free(args);
  return st;
}

moe_status moe_ep_pass_init_(moe_ep_layer *L) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const int P = L->P;
  if (L->sched->chunking == MOE_CHUNK_PEER_GROUPS) {
    int g = L->ep.grouped_size > 0 ? L->ep.grouped_size : (L->ep.uniform ? L->ep.local_size : 1);
    if (g > P) g = P;
    L->group_size = g;
    L->groups = (P + g - 1) / g;
    L->my_group = L->me / g;
    L->r = L->groups;
    MOE_FAIL_IF(ctx, L->r > MOE_MAX_CHUNKS, MOE_STATUS_INVALID_ARG,
                "schedule smart: %d peer groups of %d ranks exceed %d chunks; set a larger "
                "grouped_size (at least %d)",
                L->groups, g, MOE_MAX_CHUNKS, (P + MOE_MAX_CHUNKS - 1) / MOE_MAX_CHUNKS);
  } else {
    L->group_size = P;
    L->groups = 1;
    L->my_group = 0;
    L->r = L->pc.chunks;
  }
  memset(&L->pending, 0, sizeof L->pending);
  const size_t r = (size_t)L->r, n3 = r * (size_t)P * (size_t)L->E, n2 = r * (size_t)P;
  const int max_tasks = MOE_CT_KINDS * L->r;
  L->plan.send_rows = moe_calloc(n3, sizeof(int));
  L->plan.send_first = moe_calloc(n3, sizeof(int));
  L->plan.recv_rows = moe_calloc(n3, sizeof(int));
  size_t **big[] = {&L->plan.send_at, &L->plan.recv_at, &L->plan.expert_at};
  for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) *big[i] = moe_calloc(n3, sizeof(size_t));
  size_t **mid[] = {&L->plan.raw_send.bytes,  &L->plan.raw_send.displ,  &L->plan.raw_recv.bytes,
                    &L->plan.raw_recv.displ,  &L->plan.comp_send.bytes, &L->plan.comp_send.displ,
                    &L->plan.comp_recv.bytes, &L->plan.comp_recv.displ, &L->plan.send_block_rows,
                    &L->plan.recv_block_rows};
  for (size_t i = 0; i < sizeof mid / sizeof mid[0]; i++) *mid[i] = moe_calloc(n2, sizeof(size_t));
  L->plan.expert_start = moe_calloc(r * (size_t)L->E, sizeof(size_t));
  L->plan.expert_rows = moe_calloc(r * (size_t)L->E, sizeof(size_t));
  L->plan.send_chunk_row = moe_calloc(r, sizeof(size_t));
  L->plan.recv_chunk_row = moe_calloc(r, sizeof(size_t));
  L->plan.comp_send_chunk_byte = moe_calloc(r + 1, sizeof(size_t));
  L->plan.comp_recv_chunk_byte = moe_calloc(r + 1, sizeof(size_t));
  L->targ = moe_calloc(2 * r, sizeof(moe_ep_task_arg));
  L->rec[0] = moe_calloc((size_t)max_tasks, sizeof(moe_task_record));
  L->rec[1] = moe_calloc((size_t)max_tasks, sizeof(moe_task_record));
  int ok = L->plan.send_rows && L->plan.send_first && L->plan.recv_rows && L->plan.expert_start &&
           L->plan.expert_rows && L->plan.send_chunk_row && L->plan.recv_chunk_row &&
           L->plan.comp_send_chunk_byte && L->plan.comp_recv_chunk_byte && L->targ && L->rec[0] &&
           L->rec[1];
  for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) ok = ok && *big[i];
  for (size_t i = 0; i < sizeof mid / sizeof mid[0]; i++) ok = ok && *mid[i];
  MOE_FAIL_IF(ctx, !ok, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate the chunk plan (%d chunks)",
              L->r);
  for (int dir = 0; dir < 2; dir++) {
    MOE_TRY(moe_task_graph_init(ctx, &L->graph[dir], max_tasks, max_tasks));
    MOE_TRY(moe_schedule_init(ctx, &L->order[dir], max_tasks));
    MOE_TRY(build_pass(L, dir));
  }
  MOE_TRY(moe_executor_create(ctx, &L->pc.exec, max_tasks, &L->ex));
  // the comm stream completes this layer's Trans (and its linked layers'
  // transfers) while it waits
  moe_executor_set_background(L->ex, moe_ep_background_, L);
done:
  return st;
}

void moe_ep_pass_free_(moe_ep_layer *L) {
  moe_executor_destroy(L->ex);
  L->ex = NULL;
  for (int dir = 0; dir < 2; dir++) {
    moe_task_graph_free(&L->graph[dir]);
    moe_schedule_free(&L->order[dir]);
    moe_free(L->rec[dir]);
    L->rec[dir] = NULL;
  }
  void *p[] = {L->plan.send_rows,
               L->plan.send_first,
               L->plan.recv_rows,
               L->plan.send_at,
               L->plan.recv_at,
               L->plan.expert_at,
               L->plan.raw_send.bytes,
               L->plan.raw_send.displ,
               L->plan.raw_recv.bytes,
               L->plan.raw_recv.displ,
               L->plan.comp_send.bytes,
               L->plan.comp_send.displ,
               L->plan.comp_recv.bytes,
               L->plan.comp_recv.displ,
               L->plan.send_block_rows,
               L->plan.recv_block_rows,
               L->plan.expert_start,
               L->plan.expert_rows,
               L->plan.send_chunk_row,
               L->plan.recv_chunk_row,
               L->plan.comp_send_chunk_byte,
               L->plan.comp_recv_chunk_byte,
               L->targ};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) moe_free(p[i]);
}

// ---- the chunk plan ------------------------------------------------------------------------

// Rows [*lo, *lo + *n) of a block of `count` rows that chunk c of r holds, by
// slot ranges of the sender's capacity `cap` (>= 0) or by fractions (cap < 0).
static void row_range(int c, int r, int count, int cap, int *lo, int *n) {
  long long a, b;
  if (cap >= 0) {
    a = (long long)cap * c / r;
    b = (long long)cap * (c + 1) / r;
    if (a > count) a = count;
    if (b > count) b = count;
  } else {
    a = (long long)count * c / r;
    b = (long long)count * (c + 1) / r;
  }
  *lo = (int)a;
  *n = (int)(b - a);
}

// Lays out every chunk's blocks on both sides from the exchanged counts.
static moe_status plan_chunks(moe_ep_layer *L) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const int E = L->E, P = L->P, r = L->r, M = L->cfg.model_dim, H = L->cfg.hidden_dim;
  const size_t row_bytes = (size_t)M * sizeof(float);
  const int peer_groups = L->sched->chunking == MOE_CHUNK_PEER_GROUPS;
  for (int c = 0; c < r; c++) {
    for (int p = 0; p < P; p++) {
      for (int e = 0; e < E; e++) {
        const size_t i = IDX3(L, c, p, e);
        const int ns = L->cnt_send[(size_t)p * (E + 1) + e];
        const int nr = L->cnt_recv[(size_t)p * (E + 1) + e];
        if (peer_groups) {
          // step c: send to group (mine + c), receive from group (mine - c)
          const int gp = p / L->group_size, n = L->groups;
          L->plan.send_first[i] = 0;
          L->plan.send_rows[i] = gp == (L->my_group + c) % n ? ns : 0;
          L->plan.recv_rows[i] = gp == (L->my_group - c + n) % n ? nr : 0;
        } else {
          int lo = 0, n = 0;
          row_range(c, r, ns, L->route.capacity, &lo, &n);
          L->plan.send_first[i] = lo;
          L->plan.send_rows[i] = n;
          row_range(c, r, nr, L->cnt_recv[(size_t)p * (E + 1) + E], &lo, &n);
          L->plan.recv_rows[i] = n;
        }
      }
    }
  }
  size_t srow = 0, rrow = 0, xrow = 0, cs = 0, cr = 0;
  for (int c = 0; c < r; c++) {
    L->plan.send_chunk_row[c] = srow;
    L->plan.recv_chunk_row[c] = rrow;
    L->plan.comp_send_chunk_byte[c] = cs;
    L->plan.comp_recv_chunk_byte[c] = cr;
    for (int p = 0; p < P; p++) {
      const size_t j = IDX2(L, c, p), s0 = srow, r0 = rrow;
      for (int e = 0; e < E; e++) {
        const size_t i = IDX3(L, c, p, e);
        L->plan.send_at[i] = srow;
        srow += (size_t)L->plan.send_rows[i];
        L->plan.recv_at[i] = rrow;
        rrow += (size_t)L->plan.recv_rows[i];
      }
      L->plan.send_block_rows[j] = srow - s0;
      L->plan.recv_block_rows[j] = rrow - r0;
      L->plan.raw_send.displ[j] = (s0 - L->plan.send_chunk_row[c]) * row_bytes;
      L->plan.raw_send.bytes[j] = L->plan.send_block_rows[j] * row_bytes;
      L->plan.raw_recv.displ[j] = (r0 - L->plan.recv_chunk_row[c]) * row_bytes;
      L->plan.raw_recv.bytes[j] = L->plan.recv_block_rows[j] * row_bytes;
      if (L->compress_on) {
        L->plan.comp_send.bytes[j] =
            L->plan.send_block_rows[j]
                ? moe_compress_max_bytes(&L->comp, L->plan.send_block_rows[j], (size_t)M)
                : 0;
        L->plan.comp_recv.bytes[j] =
            L->plan.recv_block_rows[j]
                ? moe_compress_max_bytes(&L->comp, L->plan.recv_block_rows[j], (size_t)M)
                : 0;
        MOE_FAIL_IF(
            ctx, L->plan.comp_send.bytes[j] == SIZE_MAX || L->plan.comp_recv.bytes[j] == SIZE_MAX,
            MOE_STATUS_INVALID_ARG, "chunk %d: a block is too large to compress", c + 1);
        L->plan.comp_send.displ[j] = cs - L->plan.comp_send_chunk_byte[c];
        L->plan.comp_recv.displ[j] = cr - L->plan.comp_recv_chunk_byte[c];
        cs += round_up(L->plan.comp_send.bytes[j], CBLOCK_ALIGN);
        cr += round_up(L->plan.comp_recv.bytes[j], CBLOCK_ALIGN);
      }
    }
    for (int e = 0; e < E; e++) {
      L->plan.expert_start[(size_t)c * E + e] = xrow;
      for (int s = 0; s < P; s++) {
        const size_t i = IDX3(L, c, s, e);
        L->plan.expert_at[i] = xrow;
        xrow += (size_t)L->plan.recv_rows[i];
      }
      L->plan.expert_rows[(size_t)c * E + e] = xrow - L->plan.expert_start[(size_t)c * E + e];
      MOE_FAIL_IF(ctx, L->plan.expert_rows[(size_t)c * E + e] > 0 && !L->w1_of[e],
                  MOE_STATUS_INTERNAL,
                  "rank %d received rows for expert %d, which it does not hold", L->me, e);
    }
  }
  L->plan.comp_send_chunk_byte[r] = cs;
  L->plan.comp_recv_chunk_byte[r] = cr;
  MOE_FAIL_IF(ctx, srow != (size_t)L->route.rows, MOE_STATUS_INTERNAL,
              "chunk plan covers %zu of %d rows", srow, L->route.rows);
  MOE_FAIL_IF(ctx, rrow > INT_MAX, MOE_STATUS_INVALID_ARG,
              "EP rank %d would receive %zu rows; at most %d fit one exchange", L->me, rrow,
              INT_MAX);
  const int mpi_algo = L->a2a->run == moe_alltoallv_mpi_fn();
  for (size_t j = 0; j < (size_t)r * P; j++) {
    // MPI counts and (for the mpi algorithm) displacements are ints of bytes
    const size_t big = INT_MAX;
    // (displacements of empty blocks are never used)
    const int bad =
        L->plan.raw_send.bytes[j] > big || L->plan.raw_recv.bytes[j] > big ||
        L->plan.comp_send.bytes[j] > big || L->plan.comp_recv.bytes[j] > big ||
        (mpi_algo && ((L->plan.raw_send.bytes[j] && L->plan.raw_send.displ[j] > big) ||
                      (L->plan.raw_recv.bytes[j] && L->plan.raw_recv.displ[j] > big) ||
                      (L->plan.comp_send.bytes[j] && L->plan.comp_send.displ[j] > big) ||
                      (L->plan.comp_recv.bytes[j] && L->plan.comp_recv.displ[j] > big)));
    MOE_FAIL_IF(ctx, bad, MOE_STATUS_INVALID_ARG,
                "chunk %zu: the all-to-all between EP ranks %d and %zu exceeds MPI's int byte "
                "counts (more chunks, fewer tokens per rank, a larger EP size, or a "
                "point-to-point all-to-all algorithm, which needs no int displacements)",
                j / P + 1, L->me, j % P);
  }
  L->recv_rows = (int)rrow;
  const size_t rows = rrow ? rrow : 1;
  MOE_TRY(moe_workspace_reserve(ctx, &L->bufa, rows * row_bytes));
  MOE_TRY(moe_workspace_reserve(ctx, &L->bufb, rows * row_bytes));
  MOE_TRY(moe_workspace_reserve(ctx, &L->ex_x, rows * row_bytes));
  MOE_TRY(moe_workspace_reserve(ctx, &L->pre, rows * (size_t)H * sizeof(float)));
  MOE_TRY(moe_workspace_reserve(ctx, &L->h, rows * (size_t)H * sizeof(float)));
  if (L->compress_on) {
    MOE_TRY(moe_workspace_reserve(ctx, &L->csend, cs ? cs : CBLOCK_ALIGN));
    MOE_TRY(moe_workspace_reserve(ctx, &L->crecv, cr ? cr : CBLOCK_ALIGN));
  }
done:
  return st;
}

// Counts exchange (rows per expert and the sender's capacity), then the plan.
static moe_status plan_exchange(moe_ep_layer *L) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const int E = L->E, P = L->P;
  memset(L->cnt_send, 0, (size_t)P * (E + 1) * sizeof(int));
  for (int e = 0; e < E; e++) {
    const int p = moe_placement_target(&L->placement, e, L->me);
    L->cnt_send[(size_t)p * (E + 1) + e] = L->route.count[e];
  }
  for (int p = 0; p < P; p++) L->cnt_send[(size_t)p * (E + 1) + E] = L->route.capacity;
  MOE_MPI_TRY_OP(
      ctx, "exchange of routing counts",
      MPI_Alltoall(L->cnt_send, E + 1, MPI_INT, L->cnt_recv, E + 1, MPI_INT, L->ep.comm));
  MOE_TRY(plan_chunks(L));
done:
  return st;
}

// Copies rows between route order (rows of expert e from route.offset[e]) and
// sendbuf's (chunk, destination, expert) order.
static void pack(const moe_ep_layer *L, const float *route_rows, float *send, int to_send) {
  const size_t M = (size_t)L->cfg.model_dim;
  for (int c = 0; c < L->r; c++) {
    for (int p = 0; p < L->P; p++) {
      for (int e = 0; e < L->E; e++) {
        const size_t i = IDX3(L, c, p, e);
        const size_t n = (size_t)L->plan.send_rows[i];
        if (n == 0) continue;
        float *s = send + L->plan.send_at[i] * M;
        float *q =
            (float *)route_rows + ((size_t)L->route.offset[e] + (size_t)L->plan.send_first[i]) * M;
        if (to_send) {
          memcpy(s, q, n * M * sizeof(float));
        } else {
          memcpy(q, s, n * M * sizeof(float));
        }
      }
    }
  }
}

// Chunk c's received blocks between (source, expert) order and expert-major order.
static void regroup(const moe_ep_layer *L, int c, const float *from, float *to,
                    int to_expert_major) {
  const size_t M = (size_t)L->cfg.model_dim;
  for (int s = 0; s < L->P; s++) {
    for (int e = 0; e < L->E; e++) {
      const size_t i = IDX3(L, c, s, e);
      const size_t n = (size_t)L->plan.recv_rows[i];
      if (n == 0) continue;
      const size_t a = L->plan.recv_at[i], b = L->plan.expert_at[i];
      if (to_expert_major) {
        memcpy(to + b * M, from + a * M, n * M * sizeof(float));
      } else {
        memcpy(to + a * M, from + b * M, n * M * sizeof(float));
      }
    }
  }
}

// ---- tasks ---------------------------------------------------------------------------------

// Records a compression failure (first one wins) and clears the output, so the
// pass can finish everywhere; see the file comment.
static void soft_fail(moe_ep_layer *L, moe_ctx *ctx, int chunk, const char *what, void *out,
                      size_t out_bytes) {
  if (!L->soft_failed) {
    snprintf(L->soft_msg, sizeof L->soft_msg, "%s of chunk %d (compressor %s) failed: %s", what,
             chunk + 1, L->comp.name, moe_ctx_error(ctx));
    L->soft_failed = 1;
  }
  if (out && out_bytes) memset(out, 0, out_bytes);
  moe_ctx_clear_error(ctx);
}

// Compresses the float blocks (c, peer) of `rows` (rows per block nrows, byte
// displacements disp relative to row base `base`) into comp at cdisp.
static moe_status compress_blocks(moe_ep_layer *L, moe_ctx *ctx, int c, const float *rows,
                                  size_t base, const size_t *nrows, const size_t *disp, char *comp,
                                  const size_t *cbytes, const size_t *cdisp, const char *what) {
  const size_t M = (size_t)L->cfg.model_dim;
  for (int p = 0; p < L->P; p++) {
    const size_t j = IDX2(L, c, p);
    if (nrows[j] == 0) continue;
    const float *x = rows + base * M + disp[j] / sizeof(float);
    char *out = comp + cdisp[j];
    size_t got = 0;
    moe_status s = moe_compress(&L->comp, ctx, x, nrows[j], M, out, cbytes[j], &got);
    if (s == MOE_STATUS_OK && got != cbytes[j]) {
      s = moe_error_at(ctx, MOE_STATUS_INTERNAL, __FILE__, __LINE__,
                       "compressed %zu rows to %zu bytes, expected %zu (libmoe needs "
                       "compressors whose size depends only on the shape)",
                       nrows[j], got, cbytes[j]);
    }
    if (s != MOE_STATUS_OK) soft_fail(L, ctx, c, what, out, cbytes[j]);
  }
  return MOE_STATUS_OK;
}

static moe_status decompress_blocks(moe_ep_layer *L, moe_ctx *ctx, int c, const char *comp,
                                    const size_t *cbytes, const size_t *cdisp, float *rows,
                                    size_t base, const size_t *nrows, const size_t *disp,
                                    const char *what) {
  const size_t M = (size_t)L->cfg.model_dim;
  for (int p = 0; p < L->P; p++) {
    const size_t j = IDX2(L, c, p);
    if (nrows[j] == 0) continue;
    float *y = rows + base * M + disp[j] / sizeof(float);
    if (moe_decompress(&L->comp, ctx, comp + cdisp[j], cbytes[j], nrows[j], M, y) !=
        MOE_STATUS_OK) {
      soft_fail(L, ctx, c, what, y, nrows[j] * M * sizeof(float));
    }
  }
  return MOE_STATUS_OK;
}

static moe_status task_c1(void *arg, moe_ctx *ctx) {
  moe_ep_task_arg *a = arg;
  moe_ep_layer *L = a->L;
  const int c = a->chunk;
  return compress_blocks(L, ctx, c, L->sendbuf, L->plan.send_chunk_row[c], L->plan.send_block_rows,
                         L->plan.raw_send.displ,
                         (char *)L->csend.buf + L->plan.comp_send_chunk_byte[c],
                         L->plan.comp_send.bytes, L->plan.comp_send.displ, "compression C1");
}

static moe_status task_d1(void *arg, moe_ctx *ctx) {
  moe_ep_task_arg *a = arg;
  moe_ep_layer *L = a->L;
  const int c = a->chunk;
  return decompress_blocks(L, ctx, c, (const char *)L->crecv.buf + L->plan.comp_recv_chunk_byte[c],
                           L->plan.comp_recv.bytes, L->plan.comp_recv.displ, L->bufa.buf,
                           L->plan.recv_chunk_row[c], L->plan.recv_block_rows,
                           L->plan.raw_recv.displ, "decompression D1");
}

static moe_status task_c2(void *arg, moe_ctx *ctx) {
  moe_ep_task_arg *a = arg;
  moe_ep_layer *L = a->L;
  const int c = a->chunk;
  return compress_blocks(L, ctx, c, L->bufa.buf, L->plan.recv_chunk_row[c], L->plan.recv_block_rows,
                         L->plan.raw_recv.displ,
                         (char *)L->crecv.buf + L->plan.comp_recv_chunk_byte[c],
                         L->plan.comp_recv.bytes, L->plan.comp_recv.displ, "compression C2");
}

static moe_status task_d2(void *arg, moe_ctx *ctx) {
  moe_ep_task_arg *a = arg;
  moe_ep_layer *L = a->L;
  const int c = a->chunk;
  return decompress_blocks(L, ctx, c, (const char *)L->csend.buf + L->plan.comp_send_chunk_byte[c],
                           L->plan.comp_send.bytes, L->plan.comp_send.displ, L->sendbuf,
                           L->plan.send_chunk_row[c], L->plan.send_block_rows,
                           L->plan.raw_send.displ, "decompression D2");
}

// The all-to-all of chunk c, towards the experts (A1) or back (A2).
static moe_status chunk_a2a(moe_ep_layer *L, moe_ctx *ctx, int c, int back, int compressed) {
  const size_t M = (size_t)L->cfg.model_dim, j = IDX2(L, c, 0);
  const char *src;
  char *dst;
  const size_t *sc, *sdp, *rc, *rdp;
  if (compressed) {
    char *tok = (char *)L->csend.buf + L->plan.comp_send_chunk_byte[c],
         *exp = (char *)L->crecv.buf + L->plan.comp_recv_chunk_byte[c];
    src = back ? exp : tok;
    dst = back ? tok : exp;
    sc = back ? L->plan.comp_recv.bytes + j : L->plan.comp_send.bytes + j;
    sdp = back ? L->plan.comp_recv.displ + j : L->plan.comp_send.displ + j;
    rc = back ? L->plan.comp_send.bytes + j : L->plan.comp_recv.bytes + j;
    rdp = back ? L->plan.comp_send.displ + j : L->plan.comp_recv.displ + j;
  } else {
    char *tok = (char *)(L->sendbuf + L->plan.send_chunk_row[c] * M);
    char *exp = (char *)((float *)L->bufa.buf + L->plan.recv_chunk_row[c] * M);
    src = back ? exp : tok;
    dst = back ? tok : exp;
    sc = back ? L->plan.raw_recv.bytes + j : L->plan.raw_send.bytes + j;
    sdp = back ? L->plan.raw_recv.displ + j : L->plan.raw_send.displ + j;
    rc = back ? L->plan.raw_send.bytes + j : L->plan.raw_recv.bytes + j;
    rdp = back ? L->plan.raw_send.displ + j : L->plan.raw_recv.displ + j;
  }
  return moe_a2a_start(ctx, L->a2a, &L->ep, src, sc, sdp, dst, rc, rdp, &L->a2a_ws, &L->pending);
}

// Completion of the A tasks (split tasks): one all-to-all is pending at a
// time, since the communication stream runs its tasks one after another.
static moe_status task_a_test(void *arg, moe_ctx *ctx, moe_task_state *state) {
  moe_ep_task_arg *a = arg;
  int done = 0;
  const moe_status st = moe_a2a_test(ctx, &a->L->pending, &done);
  *state = done ? MOE_TASK_DONE : MOE_TASK_PENDING;
  return st;
}

static moe_status task_a_wait(void *arg, moe_ctx *ctx) {
  moe_ep_task_arg *a = arg;
  return moe_a2a_wait(ctx, &a->L->pending);
}

static moe_status task_a1(void *arg, moe_ctx *ctx) {
  moe_ep_task_arg *a = arg;
  return chunk_a2a(a->L, ctx, a->chunk, 0, a->compressed);
}

static moe_status task_a2(void *arg, moe_ctx *ctx) {
  moe_ep_task_arg *a = arg;
  return chunk_a2a(a->L, ctx, a->chunk, 1, a->compressed);
}

// The experts on chunk c's rows: forward, or backward (gradients accumulate).
// The compute stream waits (back-off sleeps of 2 to 20 us) until Trans is
// complete: the comm stream's background task completes it while it waits
// between its own tasks. Gives up when the pass failed or Trans did.
static moe_status wait_trans(moe_ep_layer *L, moe_ctx *ctx) {
  moe_status st = MOE_STATUS_OK;
  int state = __atomic_load_n(&L->trans_state, __ATOMIC_ACQUIRE);
  if (state == MOE_EP_TRANS_DONE) return st;
  const uint64_t t0 = moe_time_ns();
  long pause = 2000;
  // a wait on other ranks: the hang watchdog names it if it never ends
  const int watch = moe_watchdog_op_begin("the copies' parameters (Trans)", NULL);
  while ((state = __atomic_load_n(&L->trans_state, __ATOMIC_ACQUIRE)) == MOE_EP_TRANS_PENDING &&
         !moe_executor_pass_failed(L->ex)) {
    struct timespec ts = {0, pause};
    nanosleep(&ts, NULL);
    pause = pause < 10000 ? 2 * pause : 20000;
  }
  moe_watchdog_op_end(watch);
  L->trans_spin_ns += moe_time_ns() - t0;
  MOE_FAIL_IF(ctx, state != MOE_EP_TRANS_DONE, MOE_STATUS_COMM,
              "the copies' parameters (Trans) did not arrive: %s",
              state == MOE_EP_TRANS_FAILED ? "their transfer failed" : "the pass failed");
done:
  return st;
}

static moe_status task_e(void *arg, moe_ctx *ctx) {
  moe_status st = MOE_STATUS_OK;
  moe_ep_task_arg *a = arg;
  moe_ep_layer *L = a->L;
  const moe_layer_config *cfg = &L->cfg;
  const int c = a->chunk;
  const size_t M = (size_t)cfg->model_dim, H = (size_t)cfg->hidden_dim;
  float *bufa = L->bufa.buf, *bufb = L->bufb.buf, *ex_x = L->ex_x.buf;
  float *pre = L->pre.buf, *h = L->h.buf;
  (void)ctx;
  if (!a->backward) {
    regroup(L, c, bufa, ex_x, 1);
    // the home experts first, then the copies (expert_slot >= 0), whose
    // parameters may still be travelling (Trans, completed by the comm
    // stream's background task meanwhile); each expert's rows are its own,
    // so the order changes no bit
    for (int copies = 0; copies <= 1; copies++) {
      for (int e = 0; e < L->E; e++) {
        const size_t s = L->plan.expert_start[(size_t)c * L->E + e],
                     n = L->plan.expert_rows[(size_t)c * L->E + e];
        if (n == 0 || (L->expert_slot && L->expert_slot[e] >= 0) != copies) continue;
        if (copies) MOE_TRY(wait_trans(L, ctx));
        const moe_expert_params p = {L->w1_of[e], L->b1_of[e], L->w2_of[e], L->b2_of[e]};
        L->expert->forward(cfg, &p, ex_x + s * M, (int)n, pre + s * H, h + s * H, bufb + s * M,
                           &L->fwd_timing);
      }
    }
  } else {
    float *dh = L->dh.buf, *dpre = L->dpre.buf;
    regroup(L, c, bufa, bufb, 1);
    for (int e = 0; e < L->E; e++) {
      const size_t s = L->plan.expert_start[(size_t)c * L->E + e],
                   n = L->plan.expert_rows[(size_t)c * L->E + e];
      if (n == 0) continue;
      const moe_expert_params p = {L->w1_of[e], L->b1_of[e], L->w2_of[e], L->b2_of[e]};
      const moe_expert_grads g = {L->dw1_of[e], L->db1_of[e], L->dw2_of[e], L->db2_of[e]};
      L->expert->backward(cfg, &p, &g, ex_x + s * M, pre + s * H, h + s * H, bufb + s * M, (int)n,
                          dh + s * H, dpre + s * H, &L->bwd_timing);
    }
  }
  regroup(L, c, bufb, bufa, 0);
done:
  return st;
}

// Runs the pass of one direction; with compression, the ranks then agree on
// any compression failure.
static moe_status run_pass(moe_ep_layer *L, int dir) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  L->soft_failed = 0;
  L->soft_msg[0] = '\0';
  L->have_rec[dir] = 0;
  st = moe_executor_run(L->ex, &L->graph[dir], &L->order[dir], ctx);
  L->bg_stats[dir] = moe_executor_background_stats(L->ex);
  L->pass_t0[dir] = moe_executor_pass_start_ns(L->ex);
  if (st != MOE_STATUS_OK) {
    // An all-to-all still in flight can be neither cancelled nor freed (MPI
    // forbids both for collectives), and its buffers belong to this layer: the
    // layer refuses further passes (agreed at their start) until destroyed.
    if (L->pending.active) {
      L->broken = 1;
      snprintf(L->broken_msg, sizeof L->broken_msg,
               "a %s pass failed with an all-to-all in flight (%s); destroy and recreate the "
               "layer",
               dir ? "backward" : "forward", moe_ctx_error(ctx));
    }
    goto done;
  }
  int n = 0;
  const moe_task_record *rec = moe_executor_records(L->ex, &n);
  memcpy(L->rec[dir], rec, (size_t)n * sizeof *rec);
  L->have_rec[dir] = 1;
  if (L->targ[dir * L->r].compressed) {
    moe_status local = MOE_STATUS_OK;
    if (L->soft_failed) {
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__, "%s", L->soft_msg);
    }
    MOE_TRY(
        moe_comm_agree(ctx, L->world, local, dir ? "backward compression" : "forward compression"));
  }
done:
  return st;
}

// ---- fixed-order sums (pc.slice_tokens > 0) -----------------------------------------------------

// ---- forward ---------------------------------------------------------------------------------

moe_status moe_ep_layer_forward(moe_ep_layer *L, const float *x, int tokens, float *y,
                                moe_layer_stats *stats) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_INVALID_ARG, "layer must not be NULL");
  const moe_layer_config *c = &L->cfg;
  const int M = c->model_dim;
  const size_t ns = MOE_LOSS_STATS(L->E);
  L->have_forward = 0;
  const uint64_t t_start = moe_time_ns();
  L->fwd_start_ns = t_start;
  L->bal_rec[0][0].ran = 0;
  memset(&L->fwd_timing, 0, sizeof L->fwd_timing);
  moe_layer_timing *tm = &L->fwd_timing;
  // the backward scratch dprobs holds the biased scores (free until backward)
  moe_gate_buffers gb = {L->logits,
                         L->probs,
                         L->lse,
                         L->topk_p,
                         moe_router_bias_active(L->t.router_bias, L->E),
                         L->dprobs,
                         L->topo_local,
                         L->topo_share,
                         L->topo_scratch,
                         0};

  // step 1: local checks and gate; global loss statistics + error flag
  uint64_t t0 = moe_time_ns();
  moe_status local =
      L->broken ? moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__, "%s", L->broken_msg)
                : moe_forward_checks(ctx, c, x, tokens, y);
  if (local == MOE_STATUS_OK && L->pc.slice_tokens > 0 && tokens % L->pc.slice_tokens != 0) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                         "tokens (%d) must be a multiple of slice_tokens (%d) for fixed-order sums",
                         tokens, L->pc.slice_tokens);
  }
  if (local == MOE_STATUS_OK)
    local = moe_gate_route(ctx, c, L->t.wg, x, tokens, &gb, &L->route, tm);
  if (local == MOE_STATUS_OK) {
    moe_gate_loss_stats(c, &gb, &L->route, tokens, L->stats);
  } else {
    memset(L->stats, 0, ns * sizeof(double));
  }
  L->stats[ns] = local == MOE_STATUS_OK ? 0.0 : 1.0;
  for (int e = 0; e < L->E; e++)  // the choices per expert (the gate hook's)
    L->stats[ns + 1 + (size_t)e] = local == MOE_STATUS_OK ? (double)L->route.count_all[e] : 0.0;
  MOE_MPI_TRY_OP(
      ctx, "all-reduce of the routing statistics",
      MPI_Allreduce(MPI_IN_PLACE, L->stats, (int)ns + 1 + L->E, MPI_DOUBLE, MPI_SUM, L->world));
  if (local != MOE_STATUS_OK) {
    st = local;
    goto done;
  }
  MOE_FAIL_IF(ctx, L->stats[ns] > 0, MOE_STATUS_INVALID_ARG,
              "forward failed on %g other rank(s) (see their errors)", L->stats[ns]);
  if (L->pc.slice_tokens > 0)
    MOE_TRY(moe_parallel_ordered_gate_sums_(L->ctx, &gb, L->E, L->pc.slice_tokens, tokens,
                                            L->slice_sums, L->max_slices, L->stats, L->world));
  moe_gate_losses(c, L->stats, &L->last.aux_loss, &L->last.z_loss);
  tm->gate_ms = moe_time_ms_since(t0);
  if (L->gate_hook)  // agreed: a rank whose hook failed after its collectives stops them all
    MOE_TRY(moe_comm_agree(ctx, L->world,
                           L->gate_hook(L->gate_hook_arg, L, tokens, L->stats + ns + 1),
                           "forward (gate hook)"));

  // step 2: dispatch, counts exchange and chunk plan (agreed: its checks and
  // buffer growth can fail on one rank), pack
  t0 = moe_time_ns();
  moe_dispatch_forward(&L->route, x, M, L->xe);
  MOE_TRY(moe_comm_agree(ctx, L->world, plan_exchange(L), "forward (chunk plan)"));
  pack(L, L->xe, L->sendbuf, 1);
  tm->dispatch_ms = moe_time_ms_since(t0);

  // step 3: the pass; the copies' parameters (Trans, posted by
  // set_placement) complete inside it, at the latest beside the home
  // experts' compute
  const uint64_t t_pass = moe_time_ns();
  L->trans_spin_ns = 0;
  MOE_TRY(run_pass(L, 0));
  if (L->trans_spin_ns > 0) {  // what the expert tasks waited for Trans
    L->trans_wait_ms += (double)L->trans_spin_ns * 1e-6;
    moe_ep_balance_record_(L, 0, t_pass, t_pass + L->trans_spin_ns);
  }
  MOE_TRY(moe_ep_trans_wait_(L));  // the rest (no copy rows here), if any

  // step 4: unpack, combine
  t0 = moe_time_ns();
  pack(L, L->ye, L->sendbuf, 0);
  moe_combine_forward(&L->route, L->ye, M, tokens, y);
  tm->combine_ms = moe_time_ms_since(t0);
  tm->total_ms = moe_time_ms_since(t_start);

  L->x_last = x;
  L->tokens_last = tokens;
  L->have_forward = 1;
  L->last.tokens = tokens;
  L->last.rows = L->route.rows;
  L->last.dropped = L->route.dropped;
  L->last.rerouted = gb.topo_rerouted;
  if (stats) *stats = L->last;
done:
  return st;
}

// ---- backward ---------------------------------------------------------------------------------

// Points dw*_of[e] at this pass's gradient scratch (home experts) or the
// replica's gradient area, both zeroed.
static void bind_grads(moe_ep_layer *L) {
  const size_t Ms = (size_t)L->cfg.model_dim, Hs = (size_t)L->cfg.hidden_dim, El = (size_t)L->El;
  const size_t nf = moe_ep_expert_floats_(L);
  float *gs = L->grad_scratch, *home = gs + L->grad_gate_n;
  memset(gs, 0, (L->grad_gate_n + L->grad_home_n) * sizeof(float));
  for (int e = 0; e < L->E; e++) {
    if (e >= L->t.home_first && e < L->t.home_first + L->t.home_count) {
      const size_t i = (size_t)(e - L->t.home_first);
      L->dw1_of[e] = home + i * Ms * Hs;
      L->db1_of[e] = home + El * Ms * Hs + i * Hs;
      L->dw2_of[e] = home + El * (Ms * Hs + Hs) + i * Hs * Ms;
      L->db2_of[e] = home + El * (2 * Ms * Hs + Hs) + i * Ms;
    } else if (L->replica_mem[e]) {
      float *g = L->replica_mem[e] + nf;
      memset(g, 0, nf * sizeof(float));
      L->dw1_of[e] = g;
      L->db1_of[e] = g + Ms * Hs;
      L->dw2_of[e] = g + Ms * Hs + Hs;
      L->db2_of[e] = g + 2 * Ms * Hs + Hs;
    }
  }
}

moe_status moe_ep_layer_backward(moe_ep_layer *L, const float *dy, float *dx) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_INVALID_ARG, "layer must not be NULL");
  const moe_layer_config *c = &L->cfg;
  const int T = L->tokens_last, M = c->model_dim;
  const size_t Hs = (size_t)c->hidden_dim;
  const uint64_t t_start = moe_time_ns();
  L->bwd_start_ns = t_start;
  L->bal_rec[1][1].ran = 0;
  memset(&L->bwd_timing, 0, sizeof L->bwd_timing);
  moe_layer_timing *tm = &L->bwd_timing;

  // step 0: local checks, agreed over the world so no rank waits for a failed one
  moe_status local = MOE_STATUS_OK;
  if (L->broken) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__, "%s", L->broken_msg);
  } else if (!L->have_forward) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                         "backward needs a successful forward first");
  } else if (L->agg_pending) {
    local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                         "the last backward's gradients are pending (deferred Agg): call "
                         "moe_ep_layer_grads_wait first");
  } else if (T > 0 && (!dy || !dx)) {
    local =
        moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__, "dy and dx must not be NULL");
  } else if (c->check_finite) {
    local = moe_check_finite(ctx, "gradient dy", dy, T, M);
  }
  if (local == MOE_STATUS_OK) {  // scratch that may grow: reserve before agreeing
    const size_t rows = (size_t)(L->recv_rows ? L->recv_rows : 1);
    local = moe_workspace_reserve(ctx, &L->dh, rows * Hs * sizeof(float));
    if (local == MOE_STATUS_OK)
      local = moe_workspace_reserve(ctx, &L->dpre, rows * Hs * sizeof(float));
    if (local == MOE_STATUS_OK) {
      local = moe_workspace_reserve(ctx, &L->rep_tmp, moe_ep_expert_floats_(L) * sizeof(float));
    }
  }
  MOE_TRY(moe_comm_agree(ctx, L->world, local, "backward"));

  // step 1: combine backward, pack the row gradients
  uint64_t t0 = moe_time_ns();
  moe_combine_backward(&L->route, dy, L->ye, M, T, L->dye, L->dweight);
  pack(L, L->dye, L->sendbuf, 1);
  tm->combine_ms = moe_time_ms_since(t0);

  // step 2: the pass (experts backward into zeroed gradient scratch)
  bind_grads(L);
  MOE_TRY(run_pass(L, 1));

  // step 3: unpack, dispatch backward
  t0 = moe_time_ns();
  pack(L, L->dye, L->sendbuf, 0);
  moe_dispatch_backward(&L->route, L->dye, M, dx);
  tm->dispatch_ms = moe_time_ms_since(t0);

  // step 4: gate backward with the global loss statistics of the forward
  t0 = moe_time_ns();
  moe_gate_buffers gb = {L->logits, L->probs, L->lse, L->topk_p, NULL, NULL, NULL, 0, NULL, 0};
  const int sliced = L->pc.slice_tokens > 0;
  moe_gate_backward(c, &gb, &L->route, T, L->stats, L->dweight, L->dprobs, L->dlogits, L->x_last,
                    L->t.wg, sliced ? NULL : L->grad_scratch, dx, tm);
  if (sliced) {  // x^T dlogits as the pairwise sum over slices of slice_tokens tokens
    moe_pairwise_wgrad(&L->gate_pw, moe_gemm_fp32, L->grad_scratch, NULL, L->x_last, L->dlogits,
                       T / L->pc.slice_tokens, L->pc.slice_tokens, M, L->E);
  }
  tm->gate_ms = moe_time_ms_since(t0);

  // step 5: reductions
  MOE_TRY(moe_ep_reduce_grads_(L));
  tm->total_ms = moe_time_ms_since(t_start);
done:
  return st;
}

// ---- queries ----------------------------------------------------------------------------------

void moe_ep_layer_last_pass(const moe_ep_layer *L, int backward, const moe_task_graph **graph,
                            const moe_task_record **records) {
  const int dir = backward ? 1 : 0;
  const int have = L && L->have_rec[dir];
  if (graph) *graph = have ? &L->graph[dir] : NULL;
  if (records) *records = have ? L->rec[dir] : NULL;
}

uint64_t moe_ep_layer_pass_start_ns(const moe_ep_layer *L, int backward) {
  return L && L->have_rec[backward ? 1 : 0] ? L->pass_t0[backward ? 1 : 0] : 0;
}

const moe_schedule *moe_ep_layer_schedule(const moe_ep_layer *L, int backward) {
  return L ? &L->order[backward ? 1 : 0] : NULL;
}

void moe_ep_layer_set_gate_hook(moe_ep_layer *L, moe_ep_gate_hook hook, void *arg) {
  if (!L) return;
  L->gate_hook = hook;
  L->gate_hook_arg = hook ? arg : NULL;
}

int moe_ep_layer_chunks(const moe_ep_layer *L) { return L ? L->r : 0; }

int moe_ep_layer_rows_computed(const moe_ep_layer *L) { return L ? L->recv_rows : 0; }

long long moe_ep_rows_sent_away_(const moe_ep_layer *L, int across_nodes) {
  if (!L->have_forward) return 0;
  const int K = L->cfg.top_k, mine = L->ep.node_of[L->me];
  long long n = 0;
  for (int i = 0; i < L->tokens_last * K; i++) {
    if (L->route.slot[i] < 0) continue;  // dropped
    const int target = moe_placement_target(&L->placement, L->route.expert[i], L->me);
    n += across_nodes ? L->ep.node_of[target] != mine : target != L->me;
  }
  return n;
}

long long moe_ep_rows_received_from_away_(const moe_ep_layer *L, int across_nodes) {
  if (!L->have_forward) return 0;
  const int mine = L->ep.node_of[L->me];
  long long n = 0;
  for (int c = 0; c < L->r; c++)
    for (int p = 0; p < L->P; p++)
      if (across_nodes ? L->ep.node_of[p] != mine : p != L->me)
        n += (long long)L->plan.recv_block_rows[IDX2(L, c, p)];
  return n;
}

long long moe_ep_layer_offnode_rows(const moe_ep_layer *L) {
  return L ? moe_ep_rows_sent_away_(L, 1) : 0;
}

void moe_ep_layer_timing(const moe_ep_layer *L, moe_layer_timing *fwd, moe_layer_timing *bwd) {
  if (fwd) *fwd = L->fwd_timing;
  if (bwd) *bwd = L->bwd_timing;
}
