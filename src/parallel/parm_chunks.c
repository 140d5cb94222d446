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
// Tasks of chunk c (moe_chunk_pass_build; C and D only with a compressor):
//   C1^c  compress my chunk c rows of each EP rank's part (xs) once per EP
//         rank into csend (compute stream): the Dump sends that one block to
//         each of its ESP shards
//   D1^c  decompress each member's block (crecv) into xr / yr
//   C2^c  compress each member's chunk c outputs (yr) into crecv, in place of
//         what D1^c read
//   D2^c  decompress each member's partials (cback) into the caller's buffer
// A compressor can refuse its input (int8 and zfp reject NaN/Inf): the task
// zeroes its output and records the failure, the pass runs to its end (no
// peer is left waiting in an all-to-all), and then every rank agrees on it.
//   A1^c  all-to-all of chunk c's rows (comm stream): xs -> xr (forward) or
//         the gradients -> yr (backward)
//   E^c   the shards on chunk c's rows of every (member, expert) block:
//         forward xr -> pre, h, yr; backward dy in yr -> dx in yr, the
//         weight gradients added to the scratch (over chunks: the sum's
//         order changes with r, within rounding)
//   A2^c  all-to-all of chunk c's outputs (yr) back into the caller's buffer
//         at back_at (comm stream)
//   G^c   s2 with SAA only, after A2^c on the comm stream: chunk c's ESP
//         partials summed in shard order (the local combine) and all-gathered
//         over MP (MPI_Iallgatherv) while the compute stream runs other
//         chunks' shards: Parm's SAA as a task. Every MP peer cuts its part
//         of each EP rank's experts the same way, so the gather of chunk c
//         holds, peer by peer, each peer's chunk c of each EP rank's rows.
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>

#include "parallel/parm_internal.h"

// The plan's arrays, each (r x P) bytes, index c x P + member:
enum {
  CH_SEND_BYTES = 0,  // way there: chunk c of my part for member q's EP rank
  CH_SEND_AT,         //   where it starts in xs (the Dump: the same for g's shards)
  CH_RECV_BYTES,      // chunk c of member q's section of the received rows
  CH_RECV_AT,         //   where it starts in xr / yr (also the way back's send side)
  CH_BACK_AT,         // way back: where chunk c of member q's partials lands
  // compressed (the same blocks, compressed, each at a 64-byte boundary)
  CH_CSEND_BYTES,  // chunk c of my part for member q's EP rank, compressed
  CH_CSEND_AT,     //   in csend (the same block for g's shards)
  CH_CRECV_BYTES,  // member q's chunk c block, compressed
  CH_CRECV_AT,     //   in crecv (also the compressed way back's send side)
  CH_CBACK_AT,     // where member q's compressed partials land in cback
  CH_ARRAYS
};
_Static_assert(CH_ARRAYS == MOE_PARM_CH_ARRAYS, "the plan's arrays (moe_parm_layer_memory)");
#define CBLOCK_ALIGN 64

static size_t round_up(size_t n) { return (n + CBLOCK_ALIGN - 1) / CBLOCK_ALIGN * CBLOCK_ALIGN; }

// Rows before chunk c of r of a block of n rows.
static size_t cut(size_t n, int c, int r) { return n * (size_t)c / (size_t)r; }

static size_t *ch_at(const moe_parm_layer *L, int kind, int c) {
  return L->ch + ((size_t)kind * (size_t)L->r + (size_t)c) * (size_t)L->P;
}

void moe_parm_compressed_bounds_(const moe_compressor *comp, int r, int EP, int P, size_t part_rows,
                                 size_t recv_rows, size_t back_rows, size_t M, size_t b[3]) {
  // a block of n rows takes at most max_bytes(n): summed over the blocks of
  // N rows in all, max_bytes(N) plus, per block, a block of 4 rows' (zfp's
  // row blocks and the header) and the alignment
  const size_t per = moe_compress_max_bytes(comp, 4, M) + CBLOCK_ALIGN;
  b[0] = moe_compress_max_bytes(comp, part_rows, M) + (size_t)r * (size_t)EP * per;
  b[1] = moe_compress_max_bytes(comp, recv_rows, M) + (size_t)r * (size_t)P * per;
  b[2] = moe_compress_max_bytes(comp, back_rows, M) + (size_t)r * (size_t)P * per;
}

// Every chunk's counts and displacements for this pass's blocks (and, with
// a compressor, their compressed sizes and places).
static moe_status plan(moe_parm_layer *L, const size_t *back_at) {
  moe_status st = MOE_STATUS_OK;
  const size_t M = (size_t)L->M, row = M * sizeof(float);
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
  if (!L->compress_on) goto done;
  {
    size_t s_at = 0, r_at = 0, b_at = 0;
    for (int c = 0; c < L->r; c++) {
      for (int q = 0; q < L->P; q++) {
        const int g = q / L->ESP;
        const size_t ns = ch_at(L, CH_SEND_BYTES, c)[q] / row;
        const size_t cs = ns ? moe_compress_max_bytes(&L->comp, ns, M) : 0;
        if (q % L->ESP == 0) {  // one block per EP rank: its shards share it
          ch_at(L, CH_CSEND_AT, c)[q] = s_at;
          s_at += round_up(cs);
        } else {
          ch_at(L, CH_CSEND_AT, c)[q] = ch_at(L, CH_CSEND_AT, c)[g * L->ESP];
        }
        ch_at(L, CH_CSEND_BYTES, c)[q] = cs;
        ch_at(L, CH_CBACK_AT, c)[q] = b_at;
        b_at += round_up(cs);
        const size_t nr = ch_at(L, CH_RECV_BYTES, c)[q] / row;
        const size_t cr = nr ? moe_compress_max_bytes(&L->comp, nr, M) : 0;
        ch_at(L, CH_CRECV_BYTES, c)[q] = cr;
        ch_at(L, CH_CRECV_AT, c)[q] = r_at;
        r_at += round_up(cr);
      }
    }
    // (reserved at create for any routing: these only grow if a bound was wrong)
    MOE_TRY(moe_workspace_reserve(L->ctx, &L->csend, s_at ? s_at : CBLOCK_ALIGN));
    MOE_TRY(moe_workspace_reserve(L->ctx, &L->crecv, r_at ? r_at : CBLOCK_ALIGN));
    MOE_TRY(moe_workspace_reserve(L->ctx, &L->cback, b_at ? b_at : CBLOCK_ALIGN));
  }
done:
  return st;
}

// ---- the compression tasks -----------------------------------------------------------------

static void soft_fail(moe_parm_layer *L, moe_ctx *ctx, int c, const char *what, void *out,
                      size_t bytes) {
  if (!L->soft_failed) {
    snprintf(L->soft_msg, sizeof L->soft_msg, "Parm %s of chunk %d (compressor %s) failed: %s",
             what, c + 1, L->comp.name, moe_ctx_error(ctx));
    L->soft_failed = 1;
  }
  if (out && bytes) memset(out, 0, bytes);
  moe_ctx_clear_error(ctx);
}

// rows (n rows of M floats) -> out (exactly `bytes`: sizes depend only on the shape)
static void compress_block(moe_parm_layer *L, moe_ctx *ctx, int c, const float *rows, size_t n,
                           char *out, size_t bytes, const char *what) {
  if (n == 0) return;
  size_t got = 0;
  moe_status s = moe_compress(&L->comp, ctx, rows, n, (size_t)L->M, out, bytes, &got);
  if (s == MOE_STATUS_OK && got != bytes)
    s = moe_error_at(ctx, MOE_STATUS_INTERNAL, __FILE__, __LINE__,
                     "compressed %zu rows to %zu bytes, expected %zu", n, got, bytes);
  if (s != MOE_STATUS_OK) soft_fail(L, ctx, c, what, out, bytes);
}

static void decompress_block(moe_parm_layer *L, moe_ctx *ctx, int c, const char *in, size_t bytes,
                             size_t n, float *rows, const char *what) {
  if (n == 0) return;
  if (moe_decompress(&L->comp, ctx, in, bytes, n, (size_t)L->M, rows) != MOE_STATUS_OK)
    soft_fail(L, ctx, c, what, rows, n * (size_t)L->M * sizeof(float));
}

static moe_status task_c1(void *arg, moe_ctx *ctx) {
  moe_parm_task_arg *a = arg;
  moe_parm_layer *L = a->L;
  const int c = a->chunk;
  const size_t row = (size_t)L->M * sizeof(float);
  for (int q = 0; q < L->P; q += L->ESP) {
    compress_block(L, ctx, c, L->xs + ch_at(L, CH_SEND_AT, c)[q] / sizeof(float),
                   ch_at(L, CH_SEND_BYTES, c)[q] / row,
                   (char *)L->csend.buf + ch_at(L, CH_CSEND_AT, c)[q],
                   ch_at(L, CH_CSEND_BYTES, c)[q], "compression C1");
  }
  return MOE_STATUS_OK;
}

static moe_status task_d1(void *arg, moe_ctx *ctx) {
  moe_parm_task_arg *a = arg;
  moe_parm_layer *L = a->L;
  const int c = a->chunk;
  const size_t row = (size_t)L->M * sizeof(float);
  float *to = a->backward ? L->yr : L->xr;
  for (int q = 0; q < L->P; q++) {
    decompress_block(L, ctx, c, (const char *)L->crecv.buf + ch_at(L, CH_CRECV_AT, c)[q],
                     ch_at(L, CH_CRECV_BYTES, c)[q], ch_at(L, CH_RECV_BYTES, c)[q] / row,
                     to + ch_at(L, CH_RECV_AT, c)[q] / sizeof(float), "decompression D1");
  }
  return MOE_STATUS_OK;
}

static moe_status task_c2(void *arg, moe_ctx *ctx) {
  moe_parm_task_arg *a = arg;
  moe_parm_layer *L = a->L;
  const int c = a->chunk;
  const size_t row = (size_t)L->M * sizeof(float);
  for (int q = 0; q < L->P; q++) {
    compress_block(L, ctx, c, L->yr + ch_at(L, CH_RECV_AT, c)[q] / sizeof(float),
                   ch_at(L, CH_RECV_BYTES, c)[q] / row,
                   (char *)L->crecv.buf + ch_at(L, CH_CRECV_AT, c)[q],
                   ch_at(L, CH_CRECV_BYTES, c)[q], "compression C2");
  }
  return MOE_STATUS_OK;
}

static moe_status task_d2(void *arg, moe_ctx *ctx) {
  moe_parm_task_arg *a = arg;
  moe_parm_layer *L = a->L;
  const int c = a->chunk;
  const size_t row = (size_t)L->M * sizeof(float);
  for (int q = 0; q < L->P; q++) {
    decompress_block(L, ctx, c, (const char *)L->cback.buf + ch_at(L, CH_CBACK_AT, c)[q],
                     ch_at(L, CH_CSEND_BYTES, c)[q], ch_at(L, CH_SEND_BYTES, c)[q] / row,
                     L->ch_back + ch_at(L, CH_BACK_AT, c)[q] / sizeof(float), "decompression D2");
  }
  return MOE_STATUS_OK;
}

static moe_status task_a1(void *arg, moe_ctx *ctx) {
  moe_parm_task_arg *a = arg;
  moe_parm_layer *L = a->L;
  const int c = a->chunk;
  if (a->compressed)
    return moe_a2a_start(ctx, L->algo, &L->a2a, L->csend.buf, ch_at(L, CH_CSEND_BYTES, c),
                         ch_at(L, CH_CSEND_AT, c), L->crecv.buf, ch_at(L, CH_CRECV_BYTES, c),
                         ch_at(L, CH_CRECV_AT, c), &L->a2a_ws, &L->pending);
  return moe_a2a_start(ctx, L->algo, &L->a2a, L->xs, ch_at(L, CH_SEND_BYTES, c),
                       ch_at(L, CH_SEND_AT, c), a->backward ? L->yr : L->xr,
                       ch_at(L, CH_RECV_BYTES, c), ch_at(L, CH_RECV_AT, c), &L->a2a_ws,
                       &L->pending);
}

static moe_status task_a2(void *arg, moe_ctx *ctx) {
  moe_parm_task_arg *a = arg;
  moe_parm_layer *L = a->L;
  const int c = a->chunk;
  if (a->compressed)
    return moe_a2a_start(ctx, L->algo, &L->a2a, L->crecv.buf, ch_at(L, CH_CRECV_BYTES, c),
                         ch_at(L, CH_CRECV_AT, c), L->cback.buf, ch_at(L, CH_CSEND_BYTES, c),
                         ch_at(L, CH_CBACK_AT, c), &L->a2a_ws, &L->pending);
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

// ---- SAA's tasks -------------------------------------------------------------------------------

// The rows of my part of expert e on MP peer m (s2's split of its n_e rows).
static size_t part_rows(const moe_parm_layer *L, int e, int m) {
  const size_t n = (size_t)L->route.count[e];
  return cut(n, m + 1, L->MP) - cut(n, m, L->MP);
}

// Every MP peer's rows per EP rank, each chunk's gather counts and where my
// summed rows of each chunk start.
static void plan_saa(moe_parm_layer *L) {
  const int MP = L->MP, EP = L->EP, r = L->r, M = L->M;
  for (int m = 0; m < MP; m++) {
    for (int g = 0; g < EP; g++) {
      size_t n = 0;
      for (int e = g * L->Eh; e < (g + 1) * L->Eh; e++) n += part_rows(L, e, m);
      L->saa_rows[m * EP + g] = (int)n;
    }
  }
  int at = 0;
  size_t mine = 0;
  for (int c = 0; c < r; c++) {
    L->ch_gsend[c] = mine;
    for (int m = 0; m < MP; m++) {
      size_t n = 0;
      for (int g = 0; g < EP; g++) {
        const size_t rows = (size_t)L->saa_rows[m * EP + g];
        n += cut(rows, c + 1, r) - cut(rows, c, r);
      }
      L->ch_gcnt[c * MP + m] = (int)n * M;
      L->ch_gdis[c * MP + m] = at;
      at += (int)n * M;
      if (m == L->me.mp) mine += n;
    }
  }
}

// G^c: chunk c's local combine into saa_buf, then its MP-AllGather started.
static moe_status task_g(void *arg, moe_ctx *ctx) {
  moe_status st = MOE_STATUS_OK;
  moe_parm_task_arg *a = arg;
  moe_parm_layer *L = a->L;
  const int c = a->chunk, MP = L->MP;
  const size_t M = (size_t)L->M;
  float *const first = L->saa_buf + L->ch_gsend[c] * M;
  float *out = first;
  for (int g = 0; g < L->EP; g++) {
    const size_t ng = (size_t)L->grows[g];
    const size_t lo = cut(ng, c, L->r), n = (cut(ng, c + 1, L->r) - lo) * M;
    memcpy(out, L->ch_back + (L->ch_back_at[g * L->ESP] + lo) * M, n * sizeof(float));
    for (int s = 1; s < L->ESP; s++) {
      const float *b = L->ch_back + (L->ch_back_at[g * L->ESP + s] + lo) * M;
      for (size_t i = 0; i < n; i++) out[i] += b[i];
    }
    out += n;
  }
  const int rc =
      MPI_Iallgatherv(first, L->ch_gcnt[c * MP + L->me.mp], MPI_FLOAT, L->stg, L->ch_gcnt + c * MP,
                      L->ch_gdis + c * MP, MPI_FLOAT, L->mp, &L->ch_greq);
  if (rc != MPI_SUCCESS) {
    L->ch_greq = MPI_REQUEST_NULL;
    MOE_TRY(moe_mpi_error(ctx, rc, "MPI_Iallgatherv (Parm SAA)", __FILE__, __LINE__));
  }
  L->ch_gwatch = moe_watchdog_op_begin("Parm SAA", "the MP-AllGather of a chunk");
done:
  return st;
}

static void gather_done(moe_parm_layer *L) {
  moe_watchdog_op_end(L->ch_gwatch);
  L->ch_gwatch = 0;
}

static moe_status task_g_test(void *arg, moe_ctx *ctx, moe_task_state *state) {
  moe_parm_layer *L = ((moe_parm_task_arg *)arg)->L;
  int flag = 0;
  const int rc = MPI_Test(&L->ch_greq, &flag, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    gather_done(L);
    return moe_mpi_error(ctx, rc, "MPI_Test (Parm SAA)", __FILE__, __LINE__);
  }
  *state = flag ? MOE_TASK_DONE : MOE_TASK_PENDING;
  if (flag) gather_done(L);
  return MOE_STATUS_OK;
}

static moe_status task_g_wait(void *arg, moe_ctx *ctx) {
  moe_parm_layer *L = ((moe_parm_task_arg *)arg)->L;
  const int rc = MPI_Wait(&L->ch_greq, MPI_STATUS_IGNORE);
  gather_done(L);
  return rc == MPI_SUCCESS ? MOE_STATUS_OK
                           : moe_mpi_error(ctx, rc, "MPI_Wait (Parm SAA)", __FILE__, __LINE__);
}

void moe_parm_saa_unpack_(moe_parm_layer *L, float *dst) {
  const moe_route *rt = &L->route;
  const int MP = L->MP, EP = L->EP, r = L->r;
  const size_t M = (size_t)L->M;
  for (int c = 0; c < r; c++) {
    for (int m = 0; m < MP; m++) {
      size_t from = (size_t)L->ch_gdis[c * MP + m] / M;  // rows of stg
      for (int g = 0; g < EP; g++) {
        const size_t rows = (size_t)L->saa_rows[m * EP + g];
        const size_t lo = cut(rows, c, r), hi = cut(rows, c + 1, r);
        // peer m's section of g's experts: expert-major, part_rows(e, m) each
        size_t b0 = 0;
        for (int e = g * L->Eh; e < (g + 1) * L->Eh && b0 < hi; e++) {
          const size_t b1 = b0 + part_rows(L, e, m);
          const size_t x = b0 > lo ? b0 : lo, z = b1 < hi ? b1 : hi;
          if (z > x) {
            const size_t row = (size_t)rt->offset[e] + cut((size_t)rt->count[e], m, MP) + (x - b0);
            memcpy(dst + row * M, L->stg + (from + x - lo) * M, (z - x) * M * sizeof(float));
          }
          b0 = b1;
        }
        from += hi - lo;
      }
    }
  }
}

// Graph [backward][saa]: moe_chunk_pass_build's, plus (saa) G^c after A2^c
// on the comm stream.
static moe_status build(moe_parm_layer *L, int backward, int saa, void *const *args) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const int r = L->r;
  moe_task_graph *gr = &L->graph[backward][saa];
  moe_schedule *so = &L->order[backward][saa];
  const moe_chunk_task_fns none = {NULL, NULL, NULL};
  moe_chunk_task_fns fns[MOE_CT_KINDS] = {none, none, none, none, none, none, none};
  fns[MOE_CT_A1] = (moe_chunk_task_fns){task_a1, task_a_test, task_a_wait};
  fns[MOE_CT_E] = (moe_chunk_task_fns){task_e, NULL, NULL};
  fns[MOE_CT_A2] = (moe_chunk_task_fns){task_a2, task_a_test, task_a_wait};
  fns[MOE_CT_C1] = (moe_chunk_task_fns){task_c1, NULL, NULL};
  fns[MOE_CT_D1] = (moe_chunk_task_fns){task_d1, NULL, NULL};
  fns[MOE_CT_C2] = (moe_chunk_task_fns){task_c2, NULL, NULL};
  fns[MOE_CT_D2] = (moe_chunk_task_fns){task_d2, NULL, NULL};
  const int compressed = ((moe_parm_task_arg *)args[0])->compressed;
  int tidx[MOE_MAX_CHUNKS][MOE_CT_KINDS];
  MOE_TRY(moe_chunk_pass_build(ctx, L->tsched, r, compressed, backward, fns, args, gr, so, tidx));
  if (!saa) goto done;
  int gidx[MOE_MAX_CHUNKS];
  for (int c = 0; c < r; c++) {
    char name[MOE_TASK_NAME_MAX];
    snprintf(name, sizeof name, "G%s^%d", backward ? "'" : "", c + 1);
    const int dep = tidx[c][compressed ? MOE_CT_D2 : MOE_CT_A2];  // the partials in place
    const moe_task_desc d = {MOE_STREAM_COMM, name,    c,    task_g, task_g_test,
                             task_g_wait,     args[c], &dep, 1};
    MOE_TRY(moe_task_graph_add(ctx, gr, &d, &gidx[c]));
  }
  {
    // the comm order again: each G^c right after its A2^c; compressed, the
    // G tasks after the last A2 (G^c waits for D2^c, which the row-chunked
    // schedules run after every chunk's shards: right after A2^c it would
    // hold the later chunks' way back behind the compute stream)
    int comm[MOE_CT_KINDS * MOE_MAX_CHUNKS], cpu[MOE_CT_KINDS * MOE_MAX_CHUNKS];
    const int nc = so->len[MOE_STREAM_COMM], np = so->len[MOE_STREAM_COMPUTE];
    memcpy(comm, so->order[MOE_STREAM_COMM], (size_t)nc * sizeof(int));
    memcpy(cpu, so->order[MOE_STREAM_COMPUTE], (size_t)np * sizeof(int));
    moe_schedule_clear(so);
    for (int i = 0; i < np; i++) MOE_TRY(moe_schedule_push(ctx, so, MOE_STREAM_COMPUTE, cpu[i]));
    for (int i = 0; i < nc; i++) {
      MOE_TRY(moe_schedule_push(ctx, so, MOE_STREAM_COMM, comm[i]));
      for (int c = 0; c < r && !compressed; c++) {
        if (comm[i] == tidx[c][MOE_CT_A2])
          MOE_TRY(moe_schedule_push(ctx, so, MOE_STREAM_COMM, gidx[c]));
      }
    }
    for (int c = 0; c < r && compressed; c++)
      MOE_TRY(moe_schedule_push(ctx, so, MOE_STREAM_COMM, gidx[c]));
  }
  MOE_TRY(moe_schedule_validate(ctx, gr, so));
done:
  return st;
}

moe_status moe_parm_chunks_init_(moe_parm_layer *L) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L->ctx;
  const int r = L->pc.chunks, max_tasks = (MOE_CT_KINDS + 1) * r;
  MOE_TRY(moe_schedule_algo_find(ctx, L->pc.task_schedule, &L->tsched));
  L->r = r;
  L->ch = moe_calloc((size_t)CH_ARRAYS * (size_t)r * (size_t)L->P, sizeof(size_t));
  L->targ = moe_calloc(2 * (size_t)r, sizeof *L->targ);
  L->saa_rows = moe_calloc((size_t)L->MP * (size_t)L->EP, sizeof(int));
  L->ch_gcnt = moe_calloc((size_t)r * (size_t)L->MP, sizeof(int));
  L->ch_gdis = moe_calloc((size_t)r * (size_t)L->MP, sizeof(int));
  L->ch_gsend = moe_calloc((size_t)r, sizeof(size_t));
  L->saa_buf = moe_malloc(((size_t)L->R * (size_t)L->M + 1) * sizeof(float));
  L->ch_greq = MPI_REQUEST_NULL;
  MOE_FAIL_IF(ctx,
              !L->ch || !L->targ || !L->saa_rows || !L->ch_gcnt || !L->ch_gdis || !L->ch_gsend ||
                  !L->saa_buf,
              MOE_STATUS_OUT_OF_MEMORY, "cannot allocate the Parm chunk plan (%d chunks)", r);
  void *args[MOE_MAX_CHUNKS];
  for (int dir = 0; dir < 2; dir++) {
    for (int c = 0; c < r; c++) {
      moe_parm_task_arg *a = &L->targ[dir * r + c];
      a->L = L;
      a->chunk = c;
      a->backward = dir;
      a->compressed = L->compress_on && (dir == 0 || L->pc.compress_backward);
      args[c] = a;
    }
    for (int saa = 0; saa < 2; saa++) {
      MOE_TRY(moe_task_graph_init(ctx, &L->graph[dir][saa], max_tasks, max_tasks));
      MOE_TRY(moe_schedule_init(ctx, &L->order[dir][saa], max_tasks));
      MOE_TRY(build(L, dir, saa, args));
    }
  }
  if (L->compress_on) {  // for any routing, so that no pass allocates
    size_t b[3];
    moe_parm_compressed_bounds_(&L->comp, r, L->EP, L->P, (size_t)L->R, L->RI,
                                (size_t)L->ESP * (size_t)L->R, (size_t)L->M, b);
    MOE_TRY(moe_workspace_reserve(ctx, &L->csend, b[0]));
    MOE_TRY(moe_workspace_reserve(ctx, &L->crecv, b[1]));
    MOE_TRY(moe_workspace_reserve(ctx, &L->cback, b[2]));
  }
  MOE_TRY(moe_executor_create(ctx, &L->pc.exec, max_tasks, &L->ex));
done:
  return st;
}

void moe_parm_chunks_free_(moe_parm_layer *L) {
  moe_executor_destroy(L->ex);
  L->ex = NULL;
  for (int dir = 0; dir < 2; dir++) {
    for (int saa = 0; saa < 2; saa++) {
      moe_task_graph_free(&L->graph[dir][saa]);
      moe_schedule_free(&L->order[dir][saa]);
    }
  }
  moe_workspace_free(&L->a2a_ws);
  moe_workspace_free(&L->csend);
  moe_workspace_free(&L->crecv);
  moe_workspace_free(&L->cback);
  void *p[] = {L->ch, L->targ, L->saa_rows, L->ch_gcnt, L->ch_gdis, L->ch_gsend, L->saa_buf};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) moe_free(p[i]);
  L->ch = NULL;
  L->targ = NULL;
  L->saa_rows = L->ch_gcnt = L->ch_gdis = NULL;
  L->ch_gsend = NULL;
  L->saa_buf = NULL;
}

moe_status moe_parm_chunked_pass_(moe_parm_layer *L, int backward, int saa, float *back,
                                  const size_t *back_at, moe_layer_timing *tm, double *expert_ms) {
  moe_status st = MOE_STATUS_OK;
  if (L->compress_on) {  // (the buffers are reserved at create; should one grow and fail, every
                         // rank must know before the first all-to-all)
    MOE_TRY(moe_comm_agree(L->ctx, L->world, plan(L, back_at), "Parm chunk plan"));
  } else {
    MOE_TRY(plan(L, back_at));
  }
  if (saa) plan_saa(L);
  L->soft_failed = 0;
  L->soft_msg[0] = '\0';
  L->ch_back = back;
  L->ch_back_at = back_at;
  L->ch_pass_tm = tm;
  L->ch_expert_ns = 0;
  st = moe_executor_run(L->ex, &L->graph[backward][saa], &L->order[backward][saa], L->ctx);
  *expert_ms = (double)L->ch_expert_ns * 1e-6;
  if (st != MOE_STATUS_OK) {
    // A collective still in flight can be neither cancelled nor freed, and
    // its buffers are this layer's: the layer refuses further passes.
    if (L->pending.active || L->ch_greq != MPI_REQUEST_NULL) L->broken = 1;
    goto done;
  }
  if (L->targ[backward * L->r].compressed) {  // a refused input fails the pass on every rank
    const moe_status local = L->soft_failed ? moe_error_at(L->ctx, MOE_STATUS_INVALID_ARG, __FILE__,
                                                           __LINE__, "%s", L->soft_msg)
                                            : MOE_STATUS_OK;
    MOE_TRY(moe_comm_agree(L->ctx, L->world, local,
                           backward ? "Parm backward compression" : "Parm forward compression"));
  }
done:
  return st;
}
