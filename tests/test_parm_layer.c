// Parm's layer against the single-process layer: every rank runs
// moe_parm_layer on its data part of a global batch (MP peers the same part)
// and moe_layer on the whole batch, and compares its outputs, dx, the aux and
// z losses, the gate gradient and the gradients of the expert shards it holds
// (relative error <= 1e-5), for every MP x EP x ESP layout in {1, 2, 4} that
// divides the world (DP the rest) with every all-to-all algorithm and the
// three schedules (s2 with and without SAA), 2 ranks per node, dropless and a
// capacity where nothing drops, a data part with no tokens and all tokens
// routed to one expert.
// Then: SAA gives the sequential s2's bits; the EP&ESP all-to-all is byte
// equal to the ESP-AllGather + EP all-to-all composition; bad layouts fail on
// every rank (no hang). Deterministic mode (slice_tokens): bit for bit with
// one rank's expert-parallel layer on every MP x EP x ESP layout and
// schedule, and its refusals.
// Run under mpirun with 1, 2 and 4 ranks.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"
#include "moe/parallel.h"
#include "moe/parm.h"
#include "testutil.h"
#include "testutil_mpi.h"

#define REL_TOL 1e-5

static int g_rank, g_world;

typedef struct {
  int mp, ep, esp;
  moe_parm_schedule sched;
  int saa;
  const char *a2a;
  double f;            // capacity factor (0: dropless; large: a capacity without drops)
  int zero_part;       // data part with no tokens, or -1
  int one_expert;      // every first choice to expert 1 (a router bias)
  int rpn;             // ranks per node (0: automatic)
  int chunks;          // s1 / s2's EP&ESP pass in chunks on the executor (0 or 1: unchunked)
  const char *tsched;  // its task schedule (NULL: the default)
} scenario;

// Tokens of data part d (MP peers share it) and where it starts.
static int part_tokens(const scenario *sc, int d) {
  return d == sc->zero_part ? 0 : 6 + (5 * d) % 7;
}

static void name_of(const scenario *sc, char *buf, size_t n) {
  snprintf(buf, n, "mp%d ep%d esp%d %s%s %s f%g%s%s rpn%d chunks %d %s", sc->mp, sc->ep, sc->esp,
           moe_parm_schedule_name(sc->sched), sc->sched == MOE_PARM_S2 && sc->saa ? "+saa" : "",
           sc->a2a, sc->f, sc->zero_part >= 0 ? " zero-part" : "",
           sc->one_expert ? " one-expert" : "", sc->rpn, sc->chunks > 1 ? sc->chunks : 1,
           sc->tsched ? sc->tsched : "");
}

// moe_parm_layer_create over the world, checking that moe_parm_layer_memory
// bounds what it allocates and is not far above it; NULL on failure.
static moe_parm_layer *create_checked(moe_ctx *ctx, const char *name, const moe_layer_config *cfg,
                                      const moe_parm_config *pc) {
  moe_parm_layer *L = NULL;
  moe_memory_need need;
  TU_CHECK(moe_parm_layer_memory(ctx, cfg, pc, g_world, &need) == MOE_STATUS_OK, "%s memory: %s",
           name, moe_ctx_error(ctx));
  const uint64_t before = moe_alloc_bytes();
  const moe_status st = moe_parm_layer_create(ctx, MPI_COMM_WORLD, cfg, pc, &L);
  TU_CHECK(st == MOE_STATUS_OK, "%s create: %s", name, moe_ctx_error(ctx));
  if (st != MOE_STATUS_OK) return NULL;
  const double got = (double)(moe_alloc_bytes() - before), want = moe_memory_need_total(&need);
  TU_CHECK(got <= want && got >= 0.6 * want, "%s: create allocated %.0f bytes, estimate %.0f", name,
           got, want);
  if (getenv("PARM_MEM_VERBOSE")) printf("%s: alloc %.0f est %.0f\n", name, got, want);
  return L;
}

static void run_scenario(const scenario *sc) {
  char name[160];
  name_of(sc, name, sizeof name);
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  const int M = 12, H = 16, E = 4, K = 2;
  const int parts = g_world / sc->mp;
  int total = 0, maxT = 1;
  for (int d = 0; d < parts; d++) {
    total += part_tokens(sc, d);
    if (part_tokens(sc, d) > maxT) maxT = part_tokens(sc, d);
  }
  moe_layer_config cfg = tu_layer_config(maxT, M, H, E, K);
  cfg.capacity_factor = sc->f;
  moe_layer_config rcfg = cfg;
  rcfg.tokens = total > 0 ? total : 1;
  if (sc->f > 0) rcfg.capacity_factor = sc->f * (double)total / maxT + 1;  // no drop either
  moe_parm_config pc;
  moe_parm_config_default(&pc);
  pc.mp = sc->mp;
  pc.ep = sc->ep;
  pc.esp = sc->esp;
  pc.schedule = sc->sched;
  pc.saa = sc->saa;
  pc.ranks_per_node = sc->rpn;
  snprintf(pc.a2a, sizeof pc.a2a, "%s", sc->a2a);
  if (sc->chunks > 1) pc.chunks = sc->chunks;
  if (sc->tsched) snprintf(pc.task_schedule, sizeof pc.task_schedule, "%s", sc->tsched);
  moe_layer *ref = NULL;
  moe_parm_layer *L = create_checked(ctx, name, &cfg, &pc);
  moe_status st = L ? MOE_STATUS_OK : MOE_STATUS_INTERNAL;
  if (st != MOE_STATUS_OK) goto out;
  st = moe_layer_create(ctx, &rcfg, &ref);
  TU_CHECK(st == MOE_STATUS_OK, "%s reference: %s", name, moe_ctx_error(ctx));
  if (st != MOE_STATUS_OK) goto out;
  moe_parm_layer_init_params(L, 7);
  moe_layer_init_params(ref, 7);
  moe_parm_tensors t = moe_parm_layer_get_tensors(L);
  moe_layer_tensors rt = moe_layer_get_tensors(ref);
  if (sc->one_expert) {
    for (int e = 0; e < E; e++) t.router_bias[e] = rt.router_bias[e] = e == 1 ? 50.0f : 0.0f;
  }
  float *x = tu_filled((size_t)(total + 1) * M, 11, -1, 1);
  float *dy = tu_filled((size_t)(total + 1) * M, 12, -1, 1);
  float *yr = tu_fbuf((size_t)(total + 1) * M), *dxr = tu_fbuf((size_t)(total + 1) * M);
  moe_layer_stats rs, s;
  moe_layer_zero_grad(ref);
  st = moe_layer_forward(ref, x, total, yr, &rs);
  if (st == MOE_STATUS_OK) st = moe_layer_backward(ref, dy, dxr);
  TU_CHECK(st == MOE_STATUS_OK && rs.dropped == 0, "%s reference pass: %s (dropped %d)", name,
           moe_ctx_error(ctx), rs.dropped);
  const int d = moe_parm_data_index(&pc, g_world, g_rank);
  int off = 0;
  for (int q = 0; q < d; q++) off += part_tokens(sc, q);
  const int T = part_tokens(sc, d);
  float *y = tu_fbuf((size_t)(T + 1) * M), *dx = tu_fbuf((size_t)(T + 1) * M);
  moe_parm_layer_zero_grad(L);
  // two passes: the second adds the same gradients again (+=); compared halved
  for (int pass = 0; pass < 2 && st == MOE_STATUS_OK; pass++) {
    st = moe_parm_layer_forward(L, x + (size_t)off * M, T, y, &s);
    if (st == MOE_STATUS_OK) st = moe_parm_layer_backward(L, dy + (size_t)off * M, dx);
  }
  TU_CHECK(st == MOE_STATUS_OK, "%s pass: %s", name, moe_ctx_error(ctx));
  if (st != MOE_STATUS_OK) goto out;
  char label[256];
  if (T > 0) {
    snprintf(label, sizeof label, "%s rank %d y", name, g_rank);
    tu_rel_close(label, y, yr + (size_t)off * M, (size_t)T * M, REL_TOL);
    snprintf(label, sizeof label, "%s rank %d dx", name, g_rank);
    tu_rel_close(label, dx, dxr + (size_t)off * M, (size_t)T * M, REL_TOL);
  }
  snprintf(label, sizeof label, "%s aux", name);
  tu_rel_close(label, &s.aux_loss, &rs.aux_loss, 1, REL_TOL);
  snprintf(label, sizeof label, "%s z", name);
  tu_rel_close(label, &s.z_loss, &rs.z_loss, 1, REL_TOL);
  TU_CHECK(s.dropped == 0, "%s: %d choices dropped", name, s.dropped);
  {
    // gradients: twice the reference's (two backward passes); the shard's slices
    const size_t hs = (size_t)t.hs, s0 = (size_t)t.shard * hs;
    const size_t n = (size_t)t.home_count, f = (size_t)t.home_first;
    float *half = tu_fbuf((size_t)M * E + n * (2 * (size_t)M * hs + hs + M));
    float *want = tu_fbuf((size_t)M * E + n * (2 * (size_t)M * hs + hs + M));
    for (size_t i = 0; i < (size_t)M * E; i++) half[i] = t.dwg[i] * 0.5f;
    snprintf(label, sizeof label, "%s dwg", name);
    tu_rel_close(label, half, rt.dwg, (size_t)M * E, REL_TOL);
    size_t k = 0;
    for (size_t el = 0; el < n; el++) {
      for (size_t m = 0; m < (size_t)M; m++) {
        for (size_t j = 0; j < hs; j++, k++) {
          half[k] = t.dw1[(el * M + m) * hs + j] * 0.5f;
          want[k] = rt.dw1[((f + el) * M + m) * H + s0 + j];
        }
      }
      for (size_t j = 0; j < hs; j++, k++) {
        half[k] = t.db1[el * hs + j] * 0.5f;
        want[k] = rt.db1[(f + el) * H + s0 + j];
      }
      for (size_t i = 0; i < hs * M; i++, k++) {
        half[k] = t.dw2[el * hs * M + i] * 0.5f;
        want[k] = rt.dw2[((f + el) * H + s0) * M + i];
      }
      for (size_t i = 0; i < (size_t)M; i++, k++) {
        half[k] = t.db2[el * M + i] * 0.5f;
        want[k] = rt.db2[(f + el) * M + i];
      }
    }
    snprintf(label, sizeof label, "%s rank %d expert shard grads", name, g_rank);
    tu_rel_close(label, half, want, k, REL_TOL);
  }
out:
  moe_parm_layer_destroy(L);
  moe_layer_destroy(ref);
  moe_ctx_destroy(ctx);
  tu_free_all();
}

// One forward + backward of s2 (MP x EP x ESP, `chunks` in order tsched, compressor comp,
// compress_backward cb) on fixed tokens; y, dx and the gradients into the
// caller's buffers (T x M, T x M, ng). 0 on failure (reported).
static int s2_pass(int mp, int ep, int esp, int chunks, const char *tsched, const char *comp,
                   int cb, int saa, const float *x, const float *dy, int T, float *y, float *dx,
                   float *g, size_t *ng) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  const int M = 16, H = 24, E = 8, K = 2;
  moe_layer_config cfg = tu_layer_config(T, M, H, E, K);
  moe_parm_config pc;
  moe_parm_config_default(&pc);
  pc.mp = mp;
  pc.ep = ep;
  pc.esp = esp;
  pc.schedule = MOE_PARM_S2;
  pc.saa = saa;
  pc.chunks = chunks;
  pc.compress_backward = cb;
  snprintf(pc.compress, sizeof pc.compress, "%s", comp);
  snprintf(pc.task_schedule, sizeof pc.task_schedule, "%s", tsched);
  char name[128];
  snprintf(name, sizeof name, "mp%d ep%d esp%d chunks %d %s %s%s%s", mp, ep, esp, chunks, tsched,
           comp, cb ? " +backward" : "", saa ? " saa" : "");
  moe_parm_layer *L = create_checked(ctx, name, &cfg, &pc);
  moe_status st = L ? MOE_STATUS_OK : MOE_STATUS_INTERNAL;
  if (L) {
    moe_parm_layer_init_params(L, 3);
    moe_parm_layer_zero_grad(L);
    st = moe_parm_layer_forward(L, x, T, y, NULL);
    if (st == MOE_STATUS_OK) st = moe_parm_layer_backward(L, dy, dx);
    TU_CHECK(st == MOE_STATUS_OK, "%s: %s", name, moe_ctx_error(ctx));
    const moe_parm_tensors t = moe_parm_layer_get_tensors(L);
    *ng = (size_t)M * E + (size_t)t.home_count * (2 * (size_t)M * t.hs + t.hs + M);
    memcpy(g, t.dwg, *ng * sizeof(float));
  }
  moe_parm_layer_destroy(L);
  moe_ctx_destroy(ctx);
  return L && st == MOE_STATUS_OK;
}

// The chunked pass with a compressor (the Dump's block compressed once per EP
// rank): outputs within the codec's bound of the uncompressed pass and not
// equal to them (the payloads were compressed); compress_backward keeps the
// forward and changes dx; SAA's tasks keep the bits; a NaN that int8
// refuses fails the pass on every rank.
static void check_compressed(int mp, int ep, int esp) {
  const int T = 29, M = 16;
  const size_t n = (size_t)T * M, gmax = 1 << 16;
  const int d = (g_rank / mp) % (g_world / mp);
  float *x = tu_filled(n, 300 + (uint64_t)d, -1, 1), *dy = tu_filled(n, 400 + (uint64_t)d, -1, 1);
  float *y0 = tu_fbuf(n), *dx0 = tu_fbuf(n), *g0 = tu_fbuf(gmax);
  size_t ng = 0;
  int ok = s2_pass(mp, ep, esp, 2, "optsche", "none", 0, 1, x, dy, T, y0, dx0, g0, &ng);
  const char *comps[3] = {"fp16", "bf16", "int8"};
  const double bound[3] = {0x1p-8, 0x1p-5, 0x1p-4};
  for (int i = 0; i < 3 && ok; i++) {
    for (int chunks = 1; chunks <= 3; chunks += 2) {
      float *y = tu_fbuf(n), *dx = tu_fbuf(n), *g = tu_fbuf(gmax), *yb = tu_fbuf(n),
            *dxb = tu_fbuf(n), *gb = tu_fbuf(gmax), *ys = tu_fbuf(n), *dxs = tu_fbuf(n),
            *gs = tu_fbuf(gmax);
      ok = s2_pass(mp, ep, esp, chunks, "optsche", comps[i], 0, 1, x, dy, T, y, dx, g, &ng) &&
           s2_pass(mp, ep, esp, chunks, "optsche", comps[i], 1, 1, x, dy, T, yb, dxb, gb, &ng) &&
           s2_pass(mp, ep, esp, chunks, "optsche", comps[i], 1, 0, x, dy, T, ys, dxs, gs, &ng);
      if (!ok) break;
      double err = tu_max_abs_diff(y, y0, n), scale = tu_max_abs(y0, n);
      int ydiff = memcmp(y, yb, n * 4) != 0, dxdiff = memcmp(dx, dxb, n * 4) != 0;
      int saadiff =
          memcmp(ys, yb, n * 4) != 0 || memcmp(dxs, dxb, n * 4) != 0 || memcmp(gs, gb, ng * 4) != 0;
      double e_s = 0, s_s = 0;
      MPI_Allreduce(&err, &e_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(&scale, &s_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &ydiff, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &dxdiff, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &saadiff, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      const int moved = mp * ep * esp > 1;  // one rank alone: the all-to-all is still compressed
      TU_CHECK(e_s <= s_s * bound[i] && (e_s > 0 || !moved),
               "mp%d ep%d esp%d chunks %d %s: max |y - y_none| = %g (max |y| %g, bound %g)", mp, ep,
               esp, chunks, comps[i], e_s, s_s, s_s * bound[i]);
      TU_CHECK(!ydiff, "mp%d ep%d esp%d chunks %d %s: compress_backward changed y", mp, ep, esp,
               chunks, comps[i]);
      TU_CHECK(dxdiff, "mp%d ep%d esp%d chunks %d %s: compress_backward left dx unchanged", mp, ep,
               esp, chunks, comps[i]);
      TU_CHECK(!saadiff, "mp%d ep%d esp%d chunks %d %s: SAA's tasks changed the results", mp, ep,
               esp, chunks, comps[i]);
    }
  }
  {
    // int8 refuses NaN: the pass fails on every rank with the compressor named
    moe_ctx *ctx = NULL;
    moe_ctx_create(&ctx);
    moe_layer_config cfg = tu_layer_config(T, M, 24, 8, 2);
    cfg.check_finite = 0;
    moe_parm_config pc;
    moe_parm_config_default(&pc);
    pc.mp = mp;
    pc.ep = ep;
    pc.esp = esp;
    pc.chunks = 2;
    snprintf(pc.compress, sizeof pc.compress, "int8");
    moe_parm_layer *L = NULL;
    moe_status st = moe_parm_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &L);
    TU_CHECK(st == MOE_STATUS_OK, "int8 NaN create: %s", moe_ctx_error(ctx));
    if (st == MOE_STATUS_OK) {
      moe_parm_layer_init_params(L, 3);
      float *xn = tu_filled(n, 300 + (uint64_t)d, -1, 1), *y = tu_fbuf(n);
      xn[5] = NAN;  // (every rank: MP peers pass the same tokens)
      st = moe_parm_layer_forward(L, xn, T, y, NULL);
      TU_CHECK(st != MOE_STATUS_OK && (strstr(moe_ctx_error(ctx), "compressor int8") ||
                                       strstr(moe_ctx_error(ctx), "failed on rank") ||
                                       strstr(moe_ctx_error(ctx), "NaN")),
               "int8 with a NaN: status %d, '%s'", (int)st, moe_ctx_error(ctx));
    }
    moe_parm_layer_destroy(L);
    moe_ctx_destroy(ctx);
  }
  tu_free_all();
}

// Chunked passes: chunks out of range, a schedule that cuts by peer groups or
// does not exist, chunks with deterministic mode: refused on every rank.
static void check_bad_chunks(void) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_layer_config cfg = tu_layer_config(8, 8, 8, 2, 1);
  struct {
    int chunks, slice;
    const char *sched, *comp, *want;
  } bad[8] = {{0, 0, "sequential", "none", "chunks 0 out of range [1, 64]"},
              {65, 0, "sequential", "none", "chunks 65 out of range [1, 64]"},
              {2, 0, "smart", "none", "cuts a pass by peer groups"},
              {2, 0, "nope", "none", "nope"},
              {2, 4, "sequential", "none", "chunks 2 is not supported with it"},
              {1, 4, "sequential", "fp16", "compressor 'fp16' is not supported with it"},
              {1, 0, "sequential", "nope", "nope"},
              {1, 0, "sequential", "zfp:99", "zfp"}};
  for (int i = 0; i < 8; i++) {
    moe_parm_config pc;
    moe_parm_config_default(&pc);
    pc.chunks = bad[i].chunks;
    pc.slice_tokens = bad[i].slice;
    snprintf(pc.task_schedule, sizeof pc.task_schedule, "%s", bad[i].sched);
    snprintf(pc.compress, sizeof pc.compress, "%s", bad[i].comp);
    moe_parm_layer *L = NULL;
    const moe_status st = moe_parm_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &L);
    TU_CHECK(st == MOE_STATUS_INVALID_ARG && !L && strstr(moe_ctx_error(ctx), bad[i].want),
             "chunks %d schedule %s slice %d: status %d, '%s' (want '%s')", bad[i].chunks,
             bad[i].sched, bad[i].slice, (int)st, moe_ctx_error(ctx), bad[i].want);
    moe_parm_layer_destroy(L);
  }
  moe_ctx_destroy(ctx);
}

// Deterministic mode (pc.slice_tokens): Parm at MP x EP (ESP 1, DP the rest)
// against the expert-parallel layer with slice_tokens on one rank fed the
// whole global batch, bit for bit: outputs, dx, aux and z, the gate's
// gradient and every held expert's gradients, after two passes (+=).
static void check_deterministic(int mp, int ep, int esp, moe_parm_schedule sched, int saa,
                                const char *a2a) {
  if (g_world % (mp * ep * esp) != 0) return;
  char name[128];
  snprintf(name, sizeof name, "deterministic MP %d EP %d ESP %d %s%s %s", mp, ep, esp,
           moe_parm_schedule_name(sched), sched == MOE_PARM_S2 && !saa ? " (no SAA)" : "", a2a);
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  const moe_backend *was = moe_backend_current();
  moe_backend_use(NULL, 1);  // the fixed-order GEMM
  const int M = 12, H = 16, E = 4, K = 2, sl = 4, T = 16, parts = g_world / mp;
  const int total = parts * T;
  moe_layer_config cfg = tu_layer_config(T, M, H, E, K);
  cfg.capacity_factor = 0.0;
  moe_layer_config rcfg = cfg;
  rcfg.tokens = total;
  moe_parm_config pc;
  moe_parm_config_default(&pc);
  pc.mp = mp;
  pc.ep = ep;
  pc.esp = esp;
  pc.schedule = sched;
  pc.saa = saa;
  pc.slice_tokens = sl;
  snprintf(pc.a2a, sizeof pc.a2a, "%s", a2a);
  moe_parallel_config rpc;
  moe_parallel_config_default(&rpc);
  rpc.slice_tokens = sl;
  moe_ep_layer *ref = NULL;
  moe_parm_layer *L = create_checked(ctx, name, &cfg, &pc);
  moe_status st = L ? MOE_STATUS_OK : MOE_STATUS_INTERNAL;
  if (st != MOE_STATUS_OK) goto out;
  st = moe_ep_layer_create(ctx, MPI_COMM_SELF, &rcfg, &rpc, &ref);
  TU_CHECK(st == MOE_STATUS_OK, "%s reference: %s", name, moe_ctx_error(ctx));
  if (st != MOE_STATUS_OK) goto out;
  moe_parm_layer_init_params(L, 7);
  moe_ep_layer_init_params(ref, 7);
  {
    const moe_parm_tensors t = moe_parm_layer_get_tensors(L);
    const moe_ep_tensors rt = moe_ep_layer_get_tensors(ref);
    float *x = tu_filled((size_t)total * M, 11, -1, 1);
    float *dy = tu_filled((size_t)total * M, 12, -1, 1);
    float *yr = tu_fbuf((size_t)total * M), *dxr = tu_fbuf((size_t)total * M);
    const int d = moe_parm_data_index(&pc, g_world, g_rank);
    float *y = tu_fbuf((size_t)T * M), *dx = tu_fbuf((size_t)T * M);
    moe_layer_stats rs, ls;
    moe_parm_layer_zero_grad(L);
    moe_ep_layer_zero_grad(ref);
    for (int pass = 0; pass < 2 && st == MOE_STATUS_OK; pass++) {
      st = moe_ep_layer_forward(ref, x, total, yr, &rs);
      memset(dxr, 0, (size_t)total * M * sizeof(float));  // its dx is +=, Parm's =
      if (st == MOE_STATUS_OK) st = moe_ep_layer_backward(ref, dy, dxr);
      if (st == MOE_STATUS_OK) st = moe_parm_layer_forward(L, x + (size_t)d * T * M, T, y, &ls);
      if (st == MOE_STATUS_OK) st = moe_parm_layer_backward(L, dy + (size_t)d * T * M, dx);
    }
    TU_CHECK(st == MOE_STATUS_OK, "%s passes: %s", name, moe_ctx_error(ctx));
    if (st != MOE_STATUS_OK) goto out;
    const size_t TM = (size_t)T * M, off = (size_t)d * TM;
    TU_CHECK(memcmp(y, yr + off, TM * sizeof(float)) == 0, "%s rank %d: outputs differ", name,
             g_rank);
    TU_CHECK(memcmp(dx, dxr + off, TM * sizeof(float)) == 0, "%s rank %d: dx differs", name,
             g_rank);
    TU_CHECK(ls.aux_loss == rs.aux_loss && ls.z_loss == rs.z_loss,
             "%s: aux %.17g vs %.17g, z %.17g vs %.17g", name, ls.aux_loss, rs.aux_loss, ls.z_loss,
             rs.z_loss);
    TU_CHECK(memcmp(t.dwg, rt.dwg, (size_t)M * E * sizeof(float)) == 0,
             "%s rank %d: the gate's gradient differs (max rel %.3g)", name, g_rank,
             tu_max_rel_err(t.dwg, rt.dwg, (size_t)M * E));
    // the held experts' shards: columns s0 .. s0 + hs of w1 and b1, those rows of w2, b2 whole
    const size_t f = (size_t)t.home_first, n = (size_t)t.home_count, hs = (size_t)t.hs;
    const size_t s0 = (size_t)t.shard * hs, Ms = (size_t)M, Hs = (size_t)H;
    float *want = tu_fbuf(n * (2 * Ms * hs + hs + Ms));
    size_t k = 0;
    for (size_t el = 0; el < n; el++)
      for (size_t m = 0; m < Ms; m++)
        for (size_t j = 0; j < hs; j++) want[k++] = rt.dw1[((f + el) * Ms + m) * Hs + s0 + j];
    const size_t k1 = k;
    for (size_t el = 0; el < n; el++)
      for (size_t j = 0; j < hs; j++) want[k++] = rt.db1[(f + el) * Hs + s0 + j];
    const size_t k2 = k;
    for (size_t el = 0; el < n; el++)
      for (size_t i = 0; i < hs * Ms; i++) want[k++] = rt.dw2[((f + el) * Hs + s0) * Ms + i];
    const size_t k3 = k;
    for (size_t el = 0; el < n; el++)
      for (size_t i = 0; i < Ms; i++) want[k++] = rt.db2[(f + el) * Ms + i];
    const struct {
      const char *what;
      const float *got, *want;
      size_t count;
    } g[4] = {{"dw1", t.dw1, want, k1},
              {"db1", t.db1, want + k1, k2 - k1},
              {"dw2", t.dw2, want + k2, k3 - k2},
              {"db2", t.db2, want + k3, k - k3}};
    for (int i = 0; i < 4; i++)
      TU_CHECK(memcmp(g[i].got, g[i].want, g[i].count * sizeof(float)) == 0,
               "%s rank %d: %s of experts %zu..%zu (shard %d) differs (max rel %.3g)", name, g_rank,
               g[i].what, f, f + n - 1, t.shard, tu_max_rel_err(g[i].got, g[i].want, g[i].count));
  }
out:
  moe_parm_layer_destroy(L);
  moe_ep_layer_destroy(ref);
  moe_backend_use(was, 1);
  moe_ctx_destroy(ctx);
  tu_free_all();
}

// s2 with SAA against s2 without: the same bits (outputs, dx, gradients).
static void check_saa_bitwise(int mp, int ep, int esp, int chunks, const char *tsched) {
  const int T = 37, M = 16;
  const size_t n = (size_t)T * M, gmax = 1 << 16;
  const int d = g_rank / mp;  // the data part (MP peers share it)
  const float *x = tu_filled(n, 100 + (uint64_t)d, -1, 1);
  const float *dy = tu_filled(n, 200 + (uint64_t)d, -1, 1);
  float *y[2], *dx[2], *g[2];
  size_t ng = 0;
  int ok = 1;
  for (int saa = 0; saa < 2; saa++) {
    y[saa] = tu_fbuf(n);
    dx[saa] = tu_fbuf(n);
    g[saa] = tu_fbuf(gmax);
    ok = ok && s2_pass(mp, ep, esp, chunks, tsched, "none", 0, saa, x, dy, T, y[saa], dx[saa],
                       g[saa], &ng);
  }
  if (ok) {
    TU_CHECK(memcmp(y[0], y[1], n * 4) == 0 && memcmp(dx[0], dx[1], n * 4) == 0 &&
                 memcmp(g[0], g[1], ng * 4) == 0,
             "mp%d ep%d esp%d chunks %d %s: s2 with SAA differs from s2 without it", mp, ep, esp,
             chunks, tsched);
  }
  tu_free_all();
}

// The EP&ESP all-to-all against its definition, the ESP-AllGather of every
// member's rows followed by an EP all-to-all of each EP rank's rows: on random
// counts, every member receives the same bytes in the same order.
static void check_dump_a2a(int ep, int esp, const char *algo_name) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  const moe_a2a_algo *algo = NULL;
  moe_a2a_find(ctx, algo_name, &algo);
  const int P = ep * esp, W = 3;  // width
  if (g_world != P) goto out0;
  moe_group g;
  memset(&g, 0, sizeof g);
  TU_CHECK(moe_group_init(ctx, &g, MPI_COMM_WORLD, g_rank) == MOE_STATUS_OK, "group: %s",
           moe_ctx_error(ctx));
  {
    // rows[e] for EP rank e: random, the same formula on every rank
    int rows[8], first[8], recv_rows[8];
    size_t counts[32];
    int at = 0;
    for (int e = 0; e < ep; e++) {
      rows[e] = (g_rank * 7 + e * 3) % 5;
      first[e] = at;
      at += rows[e];
    }
    float *send = tu_fbuf((size_t)at * W + 1);
    for (int i = 0; i < at * W; i++) send[i] = (float)(g_rank * 1000 + i);
    int total = 0;
    for (int q = 0; q < P; q++) {
      recv_rows[q] = (q * 7 + (g_rank / esp) * 3) % 5;  // what member q sends my EP rank
      total += recv_rows[q];
    }
    float *got = tu_fbuf((size_t)total * W + 1), *want = tu_fbuf((size_t)total * W + 1);
    moe_workspace ws;
    memset(&ws, 0, sizeof ws);
    const moe_status st =
        moe_parm_dump_a2a(ctx, algo, &g, esp, send, rows, first, W, got, recv_rows, counts, &ws);
    TU_CHECK(st == MOE_STATUS_OK, "dump a2a %s: %s", algo_name, moe_ctx_error(ctx));
    // the composition, written out: member q's block for my EP rank, in member order
    size_t k = 0;
    for (int q = 0; q < P; q++) {
      int qfirst = 0;
      for (int e = 0; e < g_rank / esp; e++) qfirst += (q * 7 + e * 3) % 5;
      for (int i = 0; i < recv_rows[q] * W; i++) want[k++] = (float)(q * 1000 + qfirst * W + i);
    }
    TU_CHECK(k == (size_t)total * W && memcmp(got, want, k * sizeof(float)) == 0,
             "ep%d esp%d %s: the EP&ESP all-to-all differs from AllGather + all-to-all", ep, esp,
             algo_name);
    moe_workspace_free(&ws);
  }
  moe_group_free(&g);
out0:
  moe_ctx_destroy(ctx);
  tu_free_all();
}

// Bad layouts: INVALID_ARG naming the problem on every rank.
static void check_bad(int mp, int ep, int esp, int H, int E, int rpn, int intra, const char *a2a,
                      const char *want) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_layer_config cfg = tu_layer_config(8, 8, H, E, 1);
  moe_parm_config pc;
  moe_parm_config_default(&pc);
  pc.mp = mp;
  pc.ep = ep;
  pc.esp = esp;
  pc.ranks_per_node = rpn;
  pc.intra_node = intra;
  snprintf(pc.a2a, sizeof pc.a2a, "%s", a2a);
  moe_parm_layer *L = NULL;
  const moe_status st = moe_parm_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &L);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG && !L && strstr(moe_ctx_error(ctx), want),
           "bad layout mp%d ep%d esp%d H%d E%d rpn%d intra%d %s: status %d, '%s' (want '%s')", mp,
           ep, esp, H, E, rpn, intra, a2a, (int)st, moe_ctx_error(ctx), want);
  moe_parm_layer_destroy(L);
  moe_ctx_destroy(ctx);
}

// Deterministic mode's own refusals, on every rank: slice_tokens out of
// range, and ESP > 1 with an expert kind other than 'ffn'.
static void check_bad_deterministic(void) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_layer_config cfg = tu_layer_config(8, 8, 8, 2, 1);
  moe_parm_config pc;
  moe_parm_config_default(&pc);
  pc.slice_tokens = 9;
  moe_parm_layer *L = NULL;
  moe_status st = moe_parm_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &L);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG && !L &&
               strstr(moe_ctx_error(ctx), "slice_tokens (9) must be in [0, 8]"),
           "slice_tokens 9 of 8 tokens: status %d, '%s'", (int)st, moe_ctx_error(ctx));
  if (g_world >= 2) {
    pc.slice_tokens = 4;
    pc.esp = 2;
    snprintf(cfg.expert, sizeof cfg.expert, "ffn-ref");
    st = moe_parm_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &L);
    TU_CHECK(st == MOE_STATUS_INVALID_ARG && !L &&
                 strstr(moe_ctx_error(ctx), "expert 'ffn-ref' is not it"),
             "deterministic ESP 2 with ffn-ref: status %d, '%s'", (int)st, moe_ctx_error(ctx));
  }
  moe_parm_layer_destroy(L);
  moe_ctx_destroy(ctx);
}

// MPI at MPI_THREAD_FUNNELED (--funneled): the chunked and the compressed
// pass are refused on every rank (they call MPI from a second thread); the
// unchunked layer is created.
static int funneled_only(void) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_layer_config cfg = tu_layer_config(8, 8, 16, 4, 2);
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);  // (an MPI may provide more than asked for: then all are created)
  for (int i = 0; i < 3; i++) {
    moe_parm_config pc;
    moe_parm_config_default(&pc);
    pc.ep = g_world;
    if (i == 1) pc.chunks = 2;
    if (i == 2) snprintf(pc.compress, sizeof pc.compress, "fp16");
    moe_parm_layer *L = NULL;
    const moe_status st = moe_parm_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &L);
    if (i == 0 || level >= MPI_THREAD_SERIALIZED) {
      TU_CHECK(st == MOE_STATUS_OK && L, "funneled (provided %d), case %d: %s", level, i,
               moe_ctx_error(ctx));
    } else {
      TU_CHECK(st == MOE_STATUS_INVALID_ARG && !L &&
                   (strstr(moe_ctx_error(ctx), "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE") ||
                    strstr(moe_ctx_error(ctx), "failed on rank")),
               "funneled, %s: status %d, '%s'", i == 1 ? "chunks 2" : "fp16", (int)st,
               moe_ctx_error(ctx));
    }
    moe_parm_layer_destroy(L);
  }
  moe_ctx_destroy(ctx);
  return tu_mpi_finish("test_parm_layer --funneled");
}

int main(int argc, char **argv) {
  int provided = 0;
  const int funneled = argc > 1 && strcmp(argv[argc - 1], "--funneled") == 0;
  MPI_Init_thread(&argc, &argv, funneled ? MPI_THREAD_FUNNELED : MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  if (funneled) {
    const int rc = funneled_only();
    MPI_Finalize();
    return rc;
  }
  const int sizes[3] = {1, 2, 4};
  // every layout, every all-to-all algorithm, every schedule (s2 with and without SAA)
  int nalgos = 0;
  const moe_a2a_algo *const *algos = moe_a2a_list(&nalgos);
  for (int a = 0; a < 3; a++) {
    for (int b = 0; b < 3; b++) {
      for (int c = 0; c < 3; c++) {
        const int mp = sizes[a], ep = sizes[b], esp = sizes[c];
        if (g_world % (mp * ep * esp)) continue;
        for (int i = 0; i < nalgos; i++) {
          for (int s = 0; s < 4; s++) {
            const moe_parm_schedule sched = s < 3 ? (moe_parm_schedule)s : MOE_PARM_S2;
            const scenario sc = {mp,  ep, esp, sched, s == 3, algos[i]->name,
                                 0.0, -1, 0,   0,     0,      NULL};
            run_scenario(&sc);
          }
        }
      }
    }
  }
  // deterministic mode: bit for bit with one rank's expert-parallel layer
  for (int a = 0; a < 3; a++) {
    for (int b = 0; b < 3; b++) {
      for (int c = 0; c < 3; c++) {
        for (int s = 0; s < 4; s++) {
          const moe_parm_schedule sched = s < 3 ? (moe_parm_schedule)s : MOE_PARM_S2;
          check_deterministic(sizes[a], sizes[b], sizes[c], sched, s != 3, "mpi");
        }
      }
    }
  }
  for (int i = 0; i < nalgos; i++) {
    check_deterministic(g_world >= 2 ? 2 : 1, 1, 1, MOE_PARM_S2, 1, algos[i]->name);
    check_deterministic(1, g_world >= 4 ? 2 : 1, g_world >= 2 ? 2 : 1, MOE_PARM_S1, 1,
                        algos[i]->name);
  }
  // the algorithms again with 2 ranks per node, on the widest EP&ESP group and on MP x EP
  for (int i = 0; i < nalgos; i++) {
    for (int s = 0; s < 3; s++) {
      const int rpn = g_world >= 2 ? 2 : 1;
      const scenario wide = {1,
                             g_world >= 2 ? g_world / 2 : 1,
                             g_world >= 2 ? 2 : 1,
                             (moe_parm_schedule)s,
                             1,
                             algos[i]->name,
                             0.0,
                             -1,
                             0,
                             rpn,
                             0,
                             NULL};
      run_scenario(&wide);
      const scenario mpep = {g_world >= 2 ? 2 : 1,
                             g_world >= 2 ? g_world / 2 : 1,
                             1,
                             (moe_parm_schedule)s,
                             1,
                             algos[i]->name,
                             0.0,
                             -1,
                             0,
                             rpn,
                             0,
                             NULL};
      run_scenario(&mpep);
    }
  }
  // a capacity without drops (baseline and s2: per rank; s1: per MP slice),
  // a data part with no tokens, every first choice to one expert
  for (int s = 0; s < 3; s++) {
    const int mp = g_world >= 2 ? 2 : 1, esp = g_world >= 4 ? 2 : 1;
    const scenario cap = {mp, 1, esp, (moe_parm_schedule)s, 1, "mpi", 8.0, -1, 0, 0, 0, NULL};
    run_scenario(&cap);
    const scenario zero = {mp, 1, esp, (moe_parm_schedule)s, 1, "pairwise", 0.0, 0, 0, 0, 0, NULL};
    run_scenario(&zero);
    const scenario hot = {1, g_world, 1, (moe_parm_schedule)s, 1, "mpi", 0.0, -1, 1, 0, 0, NULL};
    run_scenario(&hot);
  }
  // s1 and s2's EP&ESP pass in chunks on the executor: every layout with each
  // row-chunked task schedule; every algorithm; more chunks than rows; with a
  // capacity, an empty data part and one hot expert
  {
    const char *ts[3] = {"sequential", "pipeline", "optsche"};
    for (int a = 0; a < 3; a++) {
      for (int b = 0; b < 3; b++) {
        for (int c = 0; c < 3; c++) {
          const int mp = sizes[a], ep = sizes[b], esp = sizes[c];
          if (g_world % (mp * ep * esp)) continue;
          for (int s = 1; s < 4; s++) {
            const moe_parm_schedule sched = s < 3 ? (moe_parm_schedule)s : MOE_PARM_S2;
            const scenario sc = {mp, ep, esp, sched, s == 3, "mpi", 0.0, -1, 0, 0, 3, ts[s - 1]};
            run_scenario(&sc);
          }
        }
      }
    }
    const int mp = g_world >= 2 ? 2 : 1, rest = g_world / mp;
    for (int i = 0; i < nalgos; i++) {
      const scenario sc = {mp,
                           rest >= 2 ? rest / 2 : 1,
                           rest >= 2 ? 2 : 1,
                           MOE_PARM_S2,
                           1,
                           algos[i]->name,
                           0.0,
                           -1,
                           0,
                           g_world >= 2 ? 2 : 0,
                           2,
                           "optsche"};
      run_scenario(&sc);
    }
    for (int s = 1; s < 3; s++) {
      const scenario many = {mp, rest, 1,         (moe_parm_schedule)s, 0, "mpi", 0.0, -1, 0,
                             0,  16,   "pipeline"};
      run_scenario(&many);
      const scenario cap = {mp, 1, rest,     (moe_parm_schedule)s, 0, "mpi", 8.0, -1, 0,
                            0,  2, "optsche"};
      run_scenario(&cap);
      const scenario zero = {mp, rest, 1,   (moe_parm_schedule)s, 1, "pairwise", 0.0, 0, 0,
                             0,  3,    NULL};
      run_scenario(&zero);
      const scenario hot = {1, g_world, 1,         (moe_parm_schedule)s, 1, "mpi", 0.0, -1, 1,
                            0, 4,       "pipeline"};
      run_scenario(&hot);
    }
  }
  // SAA = sequential, bit for bit
  // (also in chunks: SAA's gathers as tasks, each schedule, more chunks than some blocks' rows)
  const char *ts[3] = {"sequential", "pipeline", "optsche"};
  for (int c = 0; c < 4; c++) {
    const int chunks = c == 0 ? 1 : c == 3 ? 8 : c + 1;
    const char *tsched = ts[c % 3];
    if (g_world >= 2) check_saa_bitwise(2, g_world / 2, 1, chunks, tsched);
    if (g_world >= 4) check_saa_bitwise(2, 1, 2, chunks, tsched);
    if (g_world >= 4) check_saa_bitwise(4, 1, 1, chunks, tsched);
    check_saa_bitwise(1, g_world, 1, chunks, tsched);
  }
  // EP&ESP all-to-all = AllGather + all-to-all
  for (int i = 0; i < nalgos; i++) {
    for (int esp = 1; esp <= g_world; esp *= 2) {
      if (g_world % esp == 0) check_dump_a2a(g_world / esp, esp, algos[i]->name);
    }
  }
  // bad layouts
  check_bad(g_world + 1, 1, 1, 16, 4, 0, 0, "mpi", "does not divide");
  if (g_world >= 2) {
    check_bad(1, 1, g_world, 16 * g_world + 1, 4, 0, 0, "mpi", "not divisible by ESP");
    check_bad(1, g_world, 1, 16, 4 * g_world + 1, 0, 0, "mpi", "do not divide over EP");
  }
  check_bad(0, 1, 1, 16, 4, 0, 0, "mpi", "at least 1");
  check_bad(1, 1, 1, 16, 4, 0, 0, "nope", "nope");
  if (g_world >= 2) {
    check_bad(2, 1, 1, 16, 4, 1, 1, "mpi", "MP group");
    check_bad(1, 1, 2, 16, 4, 1, 1, "mpi", "ESP group");
  }
  check_bad_deterministic();
  check_bad_chunks();
  // compression of the chunked pass
  check_compressed(1, g_world, 1);
  if (g_world >= 2) check_compressed(2, g_world / 2, 1);
  if (g_world >= 4) check_compressed(1, 2, 2);
  if (g_world >= 4) check_compressed(2, 1, 2);
  if (g_world >= 2) {
    // MP peers must pass the same tokens: a count that differs on one of them,
    // and (s2) other tokens of the same count, fail the forward on every rank
    moe_ctx *ctx = NULL;
    moe_ctx_create(&ctx);
    moe_layer_config cfg = tu_layer_config(16, 8, 16, 4, 2);
    moe_parm_config pc;
    moe_parm_config_default(&pc);
    pc.mp = 2;
    pc.ep = g_world / 2;
    moe_parm_layer *L = NULL;
    moe_status st = moe_parm_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &L);
    TU_CHECK(st == MOE_STATUS_OK, "MP peers: create: %s", moe_ctx_error(ctx));
    if (st == MOE_STATUS_OK) {
      moe_parm_layer_init_params(L, 5);
      float *x = tu_filled(16 * 8, 40 + (uint64_t)g_rank, -1, 1), *y = tu_fbuf(16 * 8);
      st = moe_parm_layer_forward(L, x, g_rank == 1 ? 15 : 16, y, NULL);
      // (the ranks of the other MP groups learn it from moe_comm_agree)
      TU_CHECK(st == MOE_STATUS_INVALID_ARG &&
                   (strstr(moe_ctx_error(ctx), "different token counts") ||
                    (g_rank >= 2 && strstr(moe_ctx_error(ctx), "Parm forward failed on rank"))),
               "MP peers with 15 and 16 tokens: status %d, '%s'", (int)st, moe_ctx_error(ctx));
      st = moe_parm_layer_forward(L, x, 16, y, NULL);  // other tokens on each rank
      TU_CHECK(st == MOE_STATUS_INVALID_ARG && strstr(moe_ctx_error(ctx), "same tokens"),
               "MP peers with other tokens under s2: status %d, '%s'", (int)st, moe_ctx_error(ctx));
    }
    moe_parm_layer_destroy(L);
    moe_ctx_destroy(ctx);
    tu_free_all();
  }
  if (g_world >= 2) {  // a configuration that differs on one rank: refused on every rank
    moe_ctx *ctx = NULL;
    moe_ctx_create(&ctx);
    moe_layer_config cfg = tu_layer_config(8, 8, 16, 4, 1);
    moe_parm_config pc;
    moe_parm_config_default(&pc);
    pc.schedule = g_rank == 0 ? MOE_PARM_S1 : MOE_PARM_S2;
    moe_parm_layer *L = NULL;
    const moe_status st = moe_parm_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &L);
    TU_CHECK(st == MOE_STATUS_INVALID_ARG && !L &&
                 strstr(moe_ctx_error(ctx), "Parm configuration differs between ranks"),
             "a schedule differing on rank 0: status %d, '%s'", (int)st, moe_ctx_error(ctx));
    moe_parm_layer_destroy(L);
    moe_ctx_destroy(ctx);
  }
  const int rc = tu_mpi_finish("test_parm_layer");
  MPI_Finalize();
  return rc;
}
