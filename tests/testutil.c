// Test utilities (see testutil.h).
#define _POSIX_C_SOURCE 200809L  // opendir
#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/core.h"
#include "moe/layer.h"

int tu_checks = 0;
int tu_failures = 0;

void tu_fail_at(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  tu_failures++;
  fprintf(stderr, "FAIL %s:%d: ", file, line);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

int tu_allclose(const char *name, const float *got, const float *ref, size_t n, double atol,
                double rtol) {
  size_t bad = 0;
  tu_checks++;
  for (size_t i = 0; i < n; i++) {
    const double g = got[i], r = ref[i];
    const double tol = atol + rtol * fabs(r);
    if (!(fabs(g - r) <= tol)) {  // NaN fails too
      if (bad < 5) {
        fprintf(stderr, "  %s[%zu]: got %.9g ref %.9g (|diff| %.3g > tol %.3g)\n", name, i, g, r,
                fabs(g - r), tol);
      }
      bad++;
    }
  }
  if (bad) {
    tu_failures++;
    fprintf(stderr, "FAIL %s: %zu of %zu elements differ\n", name, bad, n);
  }
  return bad == 0;
}

double tu_max_rel_err(const float *got, const float *ref, size_t n) {
  double maxdiff = 0.0, maxref = 0.0;
  for (size_t i = 0; i < n; i++) {
    const double d = fabs((double)got[i] - (double)ref[i]);
    if (isnan(d)) return INFINITY;
    if (d > maxdiff) maxdiff = d;
    if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
  }
  return maxdiff / (maxref > 1e-30 ? maxref : 1e-30);
}

double tu_max_abs(const float *a, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
  return m;
}

double tu_max_abs_diff(const float *a, const float *b, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; i++) {
    const double d = fabs((double)a[i] - (double)b[i]);
    if (isnan(d)) return INFINITY;
    m = fmax(m, d);
  }
  return m;
}

int tu_rel_close(const char *name, const float *got, const float *ref, size_t n, double tol) {
  const double err = tu_max_rel_err(got, ref, n);
  tu_checks++;
  if (!(err <= tol)) {
    size_t worst = 0;
    double wd = -1.0;
    for (size_t i = 0; i < n; i++) {
      const double d = fabs((double)got[i] - (double)ref[i]);
      if (d > wd || isnan(d)) {
        wd = d;
        worst = i;
      }
    }
    tu_failures++;
    fprintf(stderr, "FAIL %s: relative error %.3g > %.3g (worst [%zu]: got %.9g ref %.9g)\n", name,
            err, tol, worst, got[worst], ref[worst]);
    return 0;
  }
  return 1;
}

int tu_equal_i32(const char *name, const int32_t *got, const int32_t *ref, size_t n) {
  size_t bad = 0;
  tu_checks++;
  for (size_t i = 0; i < n; i++) {
    if (got[i] != ref[i]) {
      if (bad < 5) fprintf(stderr, "  %s[%zu]: got %d ref %d\n", name, i, got[i], ref[i]);
      bad++;
    }
  }
  if (bad) {
    tu_failures++;
    fprintf(stderr, "FAIL %s: %zu of %zu entries differ\n", name, bad, n);
  }
  return bad == 0;
}

int tu_fd_check(const char *name, tu_scalar_fn f, void *user, float *param, const float *analytic,
                size_t n, float eps, double atol, double rtol) {
  size_t bad = 0;
  tu_checks++;
  for (size_t i = 0; i < n; i++) {
    const float saved = param[i];
    param[i] = saved + eps;
    const double fp = f(user);
    param[i] = saved - eps;
    const double fm = f(user);
    param[i] = saved;
    const double fd = (fp - fm) / (2.0 * (double)eps);
    const double an = analytic[i];
    const double tol = atol + rtol * fmax(fabs(fd), fabs(an));
    if (!(fabs(fd - an) <= tol)) {
      if (bad < 5) {
        fprintf(stderr, "  %s[%zu]: analytic %.7g finite-diff %.7g (|diff| %.3g > %.3g)\n", name, i,
                an, fd, fabs(fd - an), tol);
      }
      bad++;
    }
  }
  if (bad) {
    tu_failures++;
    fprintf(stderr, "FAIL %s: %zu of %zu gradient entries differ from finite differences\n", name,
            bad, n);
  }
  return bad == 0;
}

void tu_fill(float *x, size_t n, uint64_t seed, float lo, float hi) {
  moe_rng rng;
  moe_rng_init(&rng, seed, 0);
  moe_rng_fill_uniform(&rng, x, n, lo, hi);
}

int tu_finish(const char *name) {
  const int passed = tu_checks - tu_failures;
  printf("%s: %d passed, %d failed\n", name, passed < 0 ? 0 : passed, tu_failures);
  return tu_failures ? 1 : 0;
}

// ---- buffer pool --------------------------------------------------------------------------

#define TU_MAX_ALLOCS 8192
static void *tu_allocs[TU_MAX_ALLOCS];
static int tu_nallocs;

static void *tu_alloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p || tu_nallocs == TU_MAX_ALLOCS) {
    fprintf(stderr, "test: out of memory (or more than %d test buffers)\n", TU_MAX_ALLOCS);
    exit(2);
  }
  tu_allocs[tu_nallocs++] = p;
  return p;
}

float *tu_fbuf(size_t n) { return tu_alloc(n, sizeof(float)); }
int32_t *tu_ibuf(size_t n) { return tu_alloc(n, sizeof(int32_t)); }

float *tu_filled(size_t n, uint64_t seed, float lo, float hi) {
  float *p = tu_fbuf(n);
  tu_fill(p, n, seed, lo, hi);
  return p;
}

float *tu_copy_of(const float *x, size_t n) {
  float *p = tu_fbuf(n);
  if (n) memcpy(p, x, n * sizeof(float));
  return p;
}

void tu_free_all(void) {
  for (int i = 0; i < tu_nallocs; i++) free(tu_allocs[i]);
  tu_nallocs = 0;
}

// ---- reference file lists -------------------------------------------------------------------

static int tu_cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int tu_list_files(const char *dir, const char *prefix, const char *suffix, char **names, int max) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "cannot open data directory %s\n", dir);
    return -1;
  }
  const size_t lp = strlen(prefix), ls = strlen(suffix);
  int n = 0;
  for (struct dirent *ent; (ent = readdir(d)) != NULL && n < max;) {
    const size_t len = strlen(ent->d_name);
    if (len > lp + ls && strncmp(ent->d_name, prefix, lp) == 0 &&
        strcmp(ent->d_name + len - ls, suffix) == 0) {
      names[n] = malloc(strlen(dir) + len + 2);
      if (!names[n]) break;
      sprintf(names[n], "%s/%s", dir, ent->d_name);
      n++;
    }
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof names[0], tu_cmp_str);
  return n;
}

void tu_free_names(char **names, int n) {
  for (int i = 0; i < n; i++) free(names[i]);
}

int tu_run_files(const char *dir, const char *prefix, const char *suffix, int min_files,
                 void (*run)(const char *path)) {
  char *names[256];
  const int n = tu_list_files(dir, prefix, suffix, names, 256);
  if (n < 0) return -1;
  TU_CHECK(n >= min_files, "expected at least %d %s*%s reference files in %s, found %d", min_files,
           prefix, suffix, dir, n);
  for (int i = 0; i < n; i++) {
    const int failures = tu_failures;
    run(names[i]);
    printf("%-60s %s\n", names[i], tu_failures == failures ? "ok" : "FAILED");
  }
  tu_free_names(names, n);
  return n;
}

double tu_layer_fd_loss(void *user) {
  tu_layer_fd *f = user;
  moe_layer_stats s;
  moe_layer_forward(f->L, f->x, f->T, f->y, &s);
  const moe_layer_config *c = moe_layer_get_config(f->L);
  double l = 0.0;
  for (size_t i = 0; i < (size_t)f->T * f->M; i++) l += (double)f->y[i] * f->dy[i];
  return l + c->aux_loss_coef * s.aux_loss + c->z_loss_coef * s.z_loss;
}

moe_layer_config tu_layer_config(int T, int M, int H, int E, int K) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.tokens = T;
  c.model_dim = M;
  c.hidden_dim = H;
  c.num_experts = E;
  c.top_k = K;
  c.capacity_factor = 0.0;  // dropless
  c.aux_loss_coef = 0.01f;
  c.z_loss_coef = 0.001f;
  return c;
}
