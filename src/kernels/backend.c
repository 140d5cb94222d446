// The catalogue of compute backends (the GEMM seam, see kernels.h): one line
// per backend below, the process-wide choice, and moe_gemm's dispatch. A new
// backend is one file defining `const moe_backend moe_backend_<name>` (its
// gemm with moe_gemm's contract, and `unavailable` saying why it cannot run in
// a build or on a CPU) plus one X(<name>) line in MOE_BACKEND_CATALOG; the
// tests (test_backend) check every available one against the reference.
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "moe/kernels.h"

// The catalogue, in this order (lists, help texts).
#define MOE_BACKEND_CATALOG(X) \
  X(fixed)                     \
  X(openblas)                  \
  X(onednn)

#define MOE_BACKEND_DECLARE(name) extern const moe_backend moe_backend_##name;
#define MOE_BACKEND_REF(name) &moe_backend_##name,
MOE_BACKEND_CATALOG(MOE_BACKEND_DECLARE)
static const moe_backend *const k_backends[] = {MOE_BACKEND_CATALOG(MOE_BACKEND_REF)};
#define N_BACKENDS ((int)(sizeof k_backends / sizeof k_backends[0]))

const moe_backend *const *moe_backend_list(int *count) {
  if (count) *count = N_BACKENDS;
  return k_backends;
}

static char g_names[128];
static pthread_once_t g_names_once = PTHREAD_ONCE_INIT;

static void build_names(void) {
  size_t used = 0;
  for (int i = 0; i < N_BACKENDS; i++) {
    if (k_backends[i]->unavailable()) continue;
    const int w = snprintf(g_names + used, sizeof g_names - used, "%s%s", used ? ", " : "",
                           k_backends[i]->name);
    if (w < 0 || (size_t)w >= sizeof g_names - used) break;
    used += (size_t)w;
  }
}

const char *moe_backend_names(void) {
  pthread_once(&g_names_once, build_names);
  return g_names;
}

moe_status moe_backend_find(moe_ctx *ctx, const char *name, const moe_backend **out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !name || !out, MOE_STATUS_INVALID_ARG, "backend: name and out must be set");
  *out = NULL;
  for (int i = 0; i < N_BACKENDS && !*out; i++) {
    if (strcmp(k_backends[i]->name, name) == 0) *out = k_backends[i];
  }
  MOE_FAIL_IF(ctx, !*out, MOE_STATUS_INVALID_ARG, "unknown compute backend '%s' (valid: %s)", name,
              moe_backend_names());
  const char *why = (*out)->unavailable();
  if (why) *out = NULL;
  MOE_FAIL_IF(ctx, why, MOE_STATUS_UNSUPPORTED,
              "compute backend '%s' cannot run here: %s (valid: %s)", name, why,
              moe_backend_names());
done:
  return st;
}

static const moe_backend *g_current = &moe_backend_fixed;

void moe_backend_use(const moe_backend *b, int threads) {
  if (!b || b->unavailable()) b = &moe_backend_fixed;
  if (b->set_threads) b->set_threads(threads < 1 ? 1 : threads);
  __atomic_store_n(&g_current, b, __ATOMIC_RELEASE);
}

const moe_backend *moe_backend_current(void) {
  return __atomic_load_n(&g_current, __ATOMIC_ACQUIRE);
}

// ---- precision ------------------------------------------------------------------------

static int g_precision = MOE_PRECISION_FP32;

const char *moe_precision_name(moe_precision p) {
  return p == MOE_PRECISION_BF16 ? "bf16" : "fp32";
}

moe_status moe_precision_parse(moe_ctx *ctx, const char *text, moe_precision *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !text || !out, MOE_STATUS_INVALID_ARG, "precision: text and out must be set");
  if (strcmp(text, "fp32") == 0) {
    *out = MOE_PRECISION_FP32;
  } else if (strcmp(text, "bf16") == 0) {  // catalogue: a precision, not the compressor
    *out = MOE_PRECISION_BF16;
  } else {
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG, "unknown precision '%s' (valid: fp32, bf16)", text);
  }
done:
  return st;
}

moe_status moe_compute_check(moe_ctx *ctx, const moe_backend *b, moe_precision p) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !b, MOE_STATUS_INVALID_ARG, "compute check: backend must be set");
  if (p != MOE_PRECISION_BF16) goto done;
  MOE_FAIL_IF(ctx, !b->gemm_bf16, MOE_STATUS_UNSUPPORTED,
              "precision bf16: the %s backend has no bf16 GEMM (use --backend fixed, or "
              "--precision fp32)",
              b->name);
  MOE_FAIL_IF(ctx, !moe_bf16_native(), MOE_STATUS_UNSUPPORTED,
              "precision bf16: this CPU has no AVX512_BF16 instructions, so bf16 GEMMs would be "
              "emulated and slower than fp32 (use --precision fp32)");
done:
  return st;
}

void moe_precision_use(moe_precision p) {
  __atomic_store_n(&g_precision, p == MOE_PRECISION_BF16 ? MOE_PRECISION_BF16 : MOE_PRECISION_FP32,
                   __ATOMIC_RELEASE);
}

moe_precision moe_precision_current(void) {
  return (moe_precision)__atomic_load_n(&g_precision, __ATOMIC_ACQUIRE);
}

// ---- dispatch ---------------------------------------------------------------------------

void moe_gemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc) {
  const moe_backend *be = moe_backend_current();
  const moe_gemm_fn f =
      moe_precision_current() == MOE_PRECISION_BF16 && be->gemm_bf16 ? be->gemm_bf16 : be->gemm;
  f(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void moe_gemm_fp32(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                   int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  moe_backend_current()->gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
