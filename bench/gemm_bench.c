// moe_gemm_bench: the compute backends' GEMMs side by side at the shapes libmoe
// runs (docs/benchmarks.md). The layer benchmark (`moe bench layer`) reports one
// expert-GEMM rate per run; this program times each GEMM of the expert layer and
// of the demo model's training step on its own, so a kernel change (the fixed
// backend's tiles, blocking, packing) can be measured shape by shape against
// OpenBLAS in one run.
//
//   moe_gemm_bench [--reps N] [--min-ms MS] [--backends a,b,...] [--shape M,N,K,TA,TB]...
//
// For every shape and round, every backend in turn (interleaved, so a change in
// the machine's load hits all of them), one thread each: calls repeated until
// they take --min-ms, the time per call recorded. The table gives medians over
// the rounds, GFLOP/s (2 M N K per call) and each backend's time over the
// first backend's (OpenBLAS's when it runs, so that ratio is the
// batch-invariant kernel's cost at that shape).
#define _POSIX_C_SOURCE 200809L  // strtok_r
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/core.h"
#include "moe/kernels.h"

typedef struct {
  int m, n, k, ta, tb;
  const char *what;
} shape;

// The expert layer at `moe bench layer`'s default (T 4096, M 1024, H 2048, E 8,
// top-2: 1024 rows per expert) and the demo model's step (B 16 x S 128 tokens,
// M 128, H 256, E 8, top-2: 512 rows per expert; attention per head, S 128, 32
// wide). TA/TB as in moe_gemm: 1 = the operand is transposed.
static const shape k_default[] = {
    {1024, 2048, 1024, 0, 0, "layer: expert up (X W1)"},
    {1024, 1024, 2048, 0, 0, "layer: expert down (h W2)"},
    {1024, 2048, 1024, 0, 1, "layer: dh (dY W2^T)"},
    {1024, 2048, 1024, 1, 0, "layer: dW1 (X^T dh)"},
    {512, 256, 128, 0, 0, "demo: expert up"},
    {512, 128, 256, 0, 1, "demo: dX (dh W1^T)"},
    {128, 256, 512, 1, 0, "demo: dW1 (X^T dh)"},
    {2048, 384, 128, 0, 0, "demo: QKV projection"},
    {128, 128, 32, 0, 1, "demo: attention scores"},
    {128, 32, 128, 0, 0, "demo: attention x V"},
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: moe_gemm_bench [--reps N] [--min-ms MS] [--backends a,b,...] "
          "[--shape M,N,K,TA,TB]...\n"
          "  --reps N          rounds, medians over them [5; 1..1000]\n"
          "  --min-ms MS       each timing repeats the call until it takes MS ms [20; 1..10000]\n"
          "  --backends LIST   backends to compare, the first is the ratio's base\n"
          "                    [openblas then every other one this build runs: %s]\n"
          "  --shape M,N,K,TA,TB  a GEMM C (M x N) = op(A) (M x K) op(B) (K x N), TA/TB 0 or 1;\n"
          "                    repeat for several [the expert layer's and the demo model's]\n",
          moe_backend_names());
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return 0;
  *out = (int)v;
  return 1;
}

static int parse_shape(const char *s, shape *out) {
  int v[5], n = 0;
  char buf[128];
  const size_t len = strlen(s);
  // strtok_r would skip empty fields: refuse them here
  if (len == 0 || len >= sizeof buf || s[0] == ',' || s[len - 1] == ',' || strstr(s, ",,"))
    return 0;
  strcpy(buf, s);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (n == 5 || !parse_int(t, 0, n < 3 ? 65536 : 1, &v[n])) return 0;
    n++;
  }
  if (n != 5 || v[0] < 1 || v[1] < 1 || v[2] < 1) return 0;
  *out = (shape){v[0], v[1], v[2], v[3], v[4], "given"};
  return 1;
}

static void fill(float *x, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((seed >> 40) & 0xffff) / 65536.0f - 0.5f;
  }
}

// Seconds per call of b's GEMM at s, calls repeated until min_s has passed.
static double time_one(const moe_backend *b, const shape *s, const float *a, const float *bm,
                       float *c, double min_s) {
  const int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
  moe_backend_use(b, 1);
  // one call first, untimed: a backend's per-shape setup (oneDNN creates its
  // primitive on the first call of a shape) and cold caches are not the GEMM
  b->gemm(s->ta, s->tb, s->m, s->n, s->k, 1.0f, a, lda, bm, ldb, 0.0f, c, s->n);
  int calls = 0;
  const uint64_t t0 = moe_time_ns();
  double el;
  do {
    b->gemm(s->ta, s->tb, s->m, s->n, s->k, 1.0f, a, lda, bm, ldb, 0.0f, c, s->n);
    calls++;
    el = (double)(moe_time_ns() - t0) * 1e-9;
  } while (el < min_s);
  return el / calls;
}

int main(int argc, char **argv) {
  int reps = 5, min_ms = 20, nshapes = 0;
  shape given[64];
  const char *list = NULL;
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
      usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "moe_gemm_bench: %s needs a value (or unknown option)\n", o);
      usage(stderr);
      return 2;
    }
    const char *v = argv[++i];
    if (!strcmp(o, "--reps")) {
      if (!parse_int(v, 1, 1000, &reps)) {
        fprintf(stderr, "moe_gemm_bench: --reps must be an integer in 1..1000 (got '%s')\n", v);
        return 2;
      }
    } else if (!strcmp(o, "--min-ms")) {
      if (!parse_int(v, 1, 10000, &min_ms)) {
        fprintf(stderr, "moe_gemm_bench: --min-ms must be an integer in 1..10000 (got '%s')\n", v);
        return 2;
      }
    } else if (!strcmp(o, "--backends")) {
      list = v;
    } else if (!strcmp(o, "--shape")) {
      if (nshapes == 64) {
        fprintf(stderr, "moe_gemm_bench: at most 64 --shape\n");
        return 2;
      }
      if (!parse_shape(v, &given[nshapes])) {
        fprintf(stderr,
                "moe_gemm_bench: --shape must be M,N,K,TA,TB with M, N, K in 1..65536 and "
                "TA, TB 0 or 1 (got '%s')\n",
                v);
        return 2;
      }
      nshapes++;
    } else {
      fprintf(stderr, "moe_gemm_bench: unknown option '%s'\n", o);
      usage(stderr);
      return 2;
    }
  }
  const shape *shapes = nshapes ? given : k_default;
  if (!nshapes) nshapes = (int)(sizeof k_default / sizeof k_default[0]);

  // the backends: the list given, or openblas first and then the others that run here
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    fprintf(stderr, "moe_gemm_bench: cannot allocate a context\n");
    return 1;
  }
  const moe_backend *bes[16];
  int nb = 0;
  if (list) {
    char buf[256];
    if (strlen(list) >= sizeof buf || !*list) {
      fprintf(stderr, "moe_gemm_bench: --backends must be a comma-separated list of: %s\n",
              moe_backend_names());
      return 2;
    }
    strcpy(buf, list);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
      if (nb == 16 || moe_backend_find(ctx, t, &bes[nb]) != MOE_STATUS_OK) {
        fprintf(stderr, "moe_gemm_bench: --backends: %s\n",
                nb == 16 ? "at most 16" : moe_ctx_error(ctx));
        return 2;
      }
      nb++;
    }
  } else {
    int count;
    const moe_backend *const *all = moe_backend_list(&count);
    for (int pass = 0; pass < 2; pass++) {
      for (int i = 0; i < count && nb < 16; i++) {
        const int is_blas = !strcmp(all[i]->name, "openblas");
        if (pass == is_blas || all[i]->unavailable()) continue;
        bes[nb++] = all[i];
      }
    }
  }
  moe_ctx_destroy(ctx);

  char cpu[160] = "unknown";
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f) {
    char line[256];
    while (fgets(line, sizeof line, f)) {
      const char *colon = strchr(line, ':');
      if (!strncmp(line, "model name", 10) && colon) {
        snprintf(cpu, sizeof cpu, "%s", colon + 2);
        cpu[strcspn(cpu, "\n")] = 0;
        break;
      }
    }
    fclose(f);
  }
  printf("CPU: %s; fixed kernel: %s; BLAS kernels: %s\nbuild: %s\n", cpu, moe_gemm_fixed_isa(),
         moe_blas_core(), moe_features());
  printf("medians of %d rounds, backends interleaved, one thread each, calls of at least %d ms\n\n",
         reps, min_ms);
  printf("| M x N x K | op | what | backend | ms per call | GFLOP/s | time / %s |\n", bes[0]->name);
  printf("|---|---|---|---|---|---|---|\n");
  double *t = malloc(sizeof(double) * (size_t)reps * (size_t)nb);
  for (int si = 0; si < nshapes; si++) {
    const shape *s = &shapes[si];
    const size_t na = (size_t)s->m * s->k, nbm = (size_t)s->k * s->n, nc = (size_t)s->m * s->n;
    float *a = malloc(na * sizeof(float)), *bm = malloc(nbm * sizeof(float));
    float *c = malloc(nc * sizeof(float));
    if (!a || !bm || !c || !t) {
      fprintf(stderr, "moe_gemm_bench: cannot allocate %zu floats for %dx%dx%d\n", na + nbm + nc,
              s->m, s->n, s->k);
      return 1;
    }
    fill(a, na, 1 + (uint64_t)si);
    fill(bm, nbm, 1000 + (uint64_t)si);
    for (int r = 0; r < reps; r++) {
      for (int bi = 0; bi < nb; bi++) {
        t[bi * reps + r] = time_one(bes[bi], s, a, bm, c, min_ms * 1e-3);
      }
    }
    double base = 0;
    for (int bi = 0; bi < nb; bi++) {
      const double med = moe_median(&t[bi * reps], reps);
      if (bi == 0) base = med;
      printf("| %d x %d x %d | %s%s | %s | %s | %.3f | %.1f | %.3f |\n", s->m, s->n, s->k,
             s->ta ? "T" : "N", s->tb ? "T" : "N", s->what, bes[bi]->name, med * 1e3,
             2.0 * s->m * s->n * (double)s->k / med * 1e-9, med / base);
    }
    free(a);
    free(bm);
    free(c);
  }
  free(t);
  return 0;
}
