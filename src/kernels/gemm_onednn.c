// The `onednn` compute backend: moe_gemm on oneDNN's matmul primitive.
//
// oneDNN compiles a primitive for one exact problem (shapes, strides, alpha,
// beta); creating one takes tens of microseconds to milliseconds, far more than
// a small GEMM. So every thread keeps its own table of primitives, keyed by
// the whole problem, each with its three memory objects whose data pointers
// are set per call: a step's GEMMs are created in the first step and only
// looked up afterwards (no creation, no allocation). The table holds up to
// MAX_ENTRIES problems; when it is full it is emptied and refilled (bounded
// memory when the shapes keep changing, as expert row counts do with dropless
// routing). A thread's table is destroyed when the thread ends.
//
// alpha is the primitive's output scale, beta a "sum" post-op (beta == 0: no
// post-op, so C is not read, as moe_gemm promises). Shapes oneDNN refuses, or a
// failed creation, are computed by the fixed-order kernel instead (same
// contract; logged once).
//
// Threads: Debian's oneDNN runs on OpenMP; moe_backend_use sets its thread
// count, one by default (each calling thread applies it with
// omp_set_num_threads before its next GEMM).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_internal.h"
#include "moe/kernels.h"
#include "moe_build_config.h"

#if MOE_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>

// The OpenMP runtime's (libgomp, which libdnnl runs on; declared here rather
// than from <omp.h>, which not every compiler ships).
void omp_set_num_threads(int n);

enum { MAX_ENTRIES = 1024, TABLE = 2048 };  // TABLE: open-addressing slots, a power of two

typedef struct {
  int ta, tb, m, n, k, lda, ldb, ldc;
  uint32_t alpha, beta;  // bit patterns
} problem;

typedef struct {
  problem key;
  int used;
  dnnl_primitive_t prim;
  dnnl_memory_t ma, mb, mc;
} entry;

typedef struct {
  dnnl_engine_t eng;
  dnnl_stream_t strm;
  int threads;  // the OpenMP thread count this thread last set
  int count;
  entry slots[TABLE];
} cache;

static uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static int same(const problem *a, const problem *b) { return memcmp(a, b, sizeof *a) == 0; }

static size_t hash_of(const problem *p) {
  const unsigned char *b = (const unsigned char *)p;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (size_t i = 0; i < sizeof *p; i++) h = (h ^ b[i]) * 1099511628211ull;
  return (size_t)(h ^ (h >> 29));
}

static void entry_release(entry *e) {
  if (e->prim) dnnl_primitive_destroy(e->prim);
  if (e->ma) dnnl_memory_destroy(e->ma);
  if (e->mb) dnnl_memory_destroy(e->mb);
  if (e->mc) dnnl_memory_destroy(e->mc);
  memset(e, 0, sizeof *e);
}

static void cache_clear(cache *c) {
  for (int i = 0; i < TABLE; i++) {
    if (c->slots[i].used) entry_release(&c->slots[i]);
  }
  c->count = 0;
}

static void cache_free(void *p) {
  cache *c = p;
  if (!c) return;
  cache_clear(c);
  if (c->strm) dnnl_stream_destroy(c->strm);
  if (c->eng) dnnl_engine_destroy(c->eng);
  free(c);
}

// moe_backend_use's thread count. omp_set_num_threads sets it for the calling
// thread only, so every thread sets it again before its next GEMM when it
// changed (executor threads included).
static int g_threads = 1;

static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static int g_key_ok;
static int g_warned;

static void key_make(void) { g_key_ok = pthread_key_create(&g_key, cache_free) == 0; }

static void warn_once(const char *what, dnnl_status_t s) {
  if (__atomic_exchange_n(&g_warned, 1, __ATOMIC_RELAXED)) return;
  MOE_LOG(MOE_LOG_WARN,
          "onednn backend: %s failed (dnnl status %d); such GEMMs run on the fixed-order kernel",
          what, (int)s);
}

static cache *thread_cache(void) {
  pthread_once(&g_key_once, key_make);
  if (!g_key_ok) return NULL;
  cache *c = pthread_getspecific(g_key);
  if (c) return c;
  c = calloc(1, sizeof *c);
  if (!c) return NULL;
  dnnl_status_t s = dnnl_engine_create(&c->eng, dnnl_cpu, 0);
  if (s == dnnl_success) s = dnnl_stream_create(&c->strm, c->eng, dnnl_stream_default_flags);
  if (s != dnnl_success || pthread_setspecific(g_key, c) != 0) {
    warn_once("engine creation", s);
    cache_free(c);
    return NULL;
  }
  return c;
}

static dnnl_status_t make_md(dnnl_memory_desc_t *md, int rows, int cols, int trans, int ld) {
  dnnl_dims_t dims = {rows, cols};
  dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
  return dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_f32, strides);
}

// Creates the primitive and memory objects of problem p into e.
static dnnl_status_t entry_make(cache *c, entry *e, const problem *p, float alpha, float beta) {
  dnnl_memory_desc_t amd, bmd, cmd;
  dnnl_matmul_desc_t mmd;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = make_md(&amd, p->m, p->k, p->ta, p->lda);
  if (s == dnnl_success) s = make_md(&bmd, p->k, p->n, p->tb, p->ldb);
  if (s == dnnl_success) s = make_md(&cmd, p->m, p->n, 0, p->ldc);
  if (s == dnnl_success) s = dnnl_matmul_desc_init(&mmd, &amd, &bmd, NULL, &cmd);
  if (s == dnnl_success) s = dnnl_primitive_attr_create(&attr);
  if (s == dnnl_success && alpha != 1.0f)
    s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha);
  if (s == dnnl_success && beta != 0.0f) {
    s = dnnl_post_ops_create(&po);
    if (s == dnnl_success) s = dnnl_post_ops_append_sum(po, beta);
    if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(attr, po);
  }
  if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &mmd, attr, c->eng, NULL);
  if (s == dnnl_success) s = dnnl_primitive_create(&e->prim, pd);
  if (s == dnnl_success) s = dnnl_memory_create(&e->ma, &amd, c->eng, DNNL_MEMORY_NONE);
  if (s == dnnl_success) s = dnnl_memory_create(&e->mb, &bmd, c->eng, DNNL_MEMORY_NONE);
  if (s == dnnl_success) s = dnnl_memory_create(&e->mc, &cmd, c->eng, DNNL_MEMORY_NONE);
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (s != dnnl_success) {
    entry_release(e);
    return s;
  }
  e->key = *p;
  e->used = 1;
  return s;
}

// The entry of problem p, created when new; NULL when oneDNN cannot make it.
static entry *lookup(cache *c, const problem *p, float alpha, float beta) {
  size_t i = hash_of(p) & (TABLE - 1);
  for (;; i = (i + 1) & (TABLE - 1)) {
    entry *e = &c->slots[i];
    if (!e->used) break;
    if (same(&e->key, p)) return e;
  }
  if (c->count >= MAX_ENTRIES) {  // full: start again (slots stay at most half used)
    cache_clear(c);
    i = hash_of(p) & (TABLE - 1);
  }
  const dnnl_status_t s = entry_make(c, &c->slots[i], p, alpha, beta);
  if (s != dnnl_success) {
    warn_once("matmul primitive creation", s);
    return NULL;
  }
  c->count++;
  return &c->slots[i];
}

static void gemm_onednn(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                        int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == 0.0f) {
    moe_gemm_scale_c(c, m, n, ldc, beta);
    return;
  }
  cache *ch = thread_cache();
  const int nt = __atomic_load_n(&g_threads, __ATOMIC_RELAXED);
  if (ch && ch->threads != nt) {
    omp_set_num_threads(nt);
    ch->threads = nt;
  }
  const problem p = {trans_a, trans_b, m, n, k, lda, ldb, ldc, bits_of(alpha), bits_of(beta)};
  entry *e = ch ? lookup(ch, &p, alpha, beta) : NULL;
  dnnl_status_t s = e ? dnnl_success : dnnl_runtime_error;
  if (e) {
    dnnl_memory_set_data_handle(e->ma, (void *)a);
    dnnl_memory_set_data_handle(e->mb, (void *)b);
    dnnl_memory_set_data_handle(e->mc, c);
    const dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, e->ma}, {DNNL_ARG_WEIGHTS, e->mb}, {DNNL_ARG_DST, e->mc}};
    s = dnnl_primitive_execute(e->prim, ch->strm, 3, args);
    if (s == dnnl_success) s = dnnl_stream_wait(ch->strm);
    if (s != dnnl_success) warn_once("matmul execution", s);
  }
  if (s != dnnl_success)
    moe_gemm_fixed(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static const char *onednn_unavailable(void) { return NULL; }

static void onednn_set_threads(int n) {
  __atomic_store_n(&g_threads, n < 1 ? 1 : n, __ATOMIC_RELAXED);
}

static char g_describe[96];
static pthread_once_t g_describe_once = PTHREAD_ONCE_INIT;

static const char *isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    default:
      return "other";
  }
}

static void describe_make(void) {
  const dnnl_version_t *v = dnnl_version();
  snprintf(g_describe, sizeof g_describe, "oneDNN %d.%d.%d (%s)", v->major, v->minor, v->patch,
           isa_name(dnnl_get_effective_cpu_isa()));
}

static const char *onednn_describe(void) {
  pthread_once(&g_describe_once, describe_make);
  return g_describe;
}

const moe_backend moe_backend_onednn = {
    .name = "onednn",
    .summary = "oneDNN matmul, primitives cached per shape (bits depend on the shape)",
    .batch_invariant = 0,
    .unavailable = onednn_unavailable,
    .gemm = gemm_onednn,
    .set_threads = onednn_set_threads,
    .describe = onednn_describe,
};

#else  // !MOE_HAVE_DNNL

static const char *onednn_unavailable(void) {
  return "libmoe was built without oneDNN (install libdnnl-dev, e.g. `bash "
         "scripts/setup-debian.sh`, and configure again)";
}

static const char *onednn_describe(void) { return "oneDNN (not built)"; }

const moe_backend moe_backend_onednn = {
    .name = "onednn",
    .summary = "oneDNN matmul (not in this build)",
    .batch_invariant = 0,
    .unavailable = onednn_unavailable,
    .gemm = moe_gemm_fixed,
    .set_threads = NULL,
    .describe = onednn_describe,
};

#endif
