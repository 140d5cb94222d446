// Test utilities: checks that count failures and print where, tolerance
// comparisons that print the first mismatches, finite differences.
// A test program calls tu_finish() and returns its value: non-zero on failure.
#ifndef MOE_TESTUTIL_H
#define MOE_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "moe/layer.h"

extern int tu_checks;
extern int tu_failures;

void tu_fail_at(const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

// Counts a check; on failure prints file:line and the message.
#define TU_CHECK(cond, ...)                                   \
  do {                                                        \
    tu_checks++;                                              \
    if (!(cond)) tu_fail_at(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

// Element-wise |got - ref| <= atol + rtol*|ref|; prints the first 5 mismatches
// (index, got, ref). Counts one check. Returns 1 if all close.
int tu_allclose(const char *name, const float *got, const float *ref, size_t n, double atol,
                double rtol);
// Tensor-wise relative error max_i |got_i - ref_i| / max(max_i |ref_i|, 1e-30).
double tu_max_rel_err(const float *got, const float *ref, size_t n);
// max |a[i]|; max |a[i] - b[i]| (infinity if a difference is NaN)
double tu_max_abs(const float *a, size_t n);
double tu_max_abs_diff(const float *a, const float *b, size_t n);
// Checks tu_max_rel_err(got, ref) <= tol; prints the worst element on failure.
int tu_rel_close(const char *name, const float *got, const float *ref, size_t n, double tol);
// Equality of integer arrays, printing the first 5 differences.
int tu_equal_i32(const char *name, const int32_t *got, const int32_t *ref, size_t n);

// Central finite differences of a scalar function f(param) over each element of
// param (n floats), compared with the analytic gradient: |fd - an| <= atol +
// rtol*max(|fd|, |an|). f must recompute from scratch. Returns 1 if all close.
typedef double (*tu_scalar_fn)(void *user);
int tu_fd_check(const char *name, tu_scalar_fn f, void *user, float *param, const float *analytic,
                size_t n, float eps, double atol, double rtol);

// The single-process layer's scalar for finite differences: forward of x
// (T, M) into y, then sum(y * dy) + aux_coef * aux + z_coef * z, the scalar
// whose gradient the layer's backward with dy computes (it includes the aux
// and z gradients). user: a tu_layer_fd.
typedef struct {
  moe_layer *L;
  const float *x, *dy;
  int T, M;
  float *y;
} tu_layer_fd;
double tu_layer_fd_loss(void *user);
// A small dropless layer config: T tokens, M, H, E experts, top-K; aux 0.01, z 0.001.
moe_layer_config tu_layer_config(int T, int M, int H, int E, int K);

// Deterministic test data in [lo, hi).
void tu_fill(float *x, size_t n, uint64_t seed, float lo, float hi);

// A pool of zeroed test buffers (tests may allocate; kernels do not): each
// call returns a new buffer of n elements (at least one), freed together by
// tu_free_all(). Exits with status 2 when memory or the pool runs out.
float *tu_fbuf(size_t n);
int32_t *tu_ibuf(size_t n);
float *tu_filled(size_t n, uint64_t seed, float lo, float hi);  // tu_fbuf + tu_fill
float *tu_copy_of(const float *x, size_t n);
void tu_free_all(void);

// The files dir/PREFIX*SUFFIX, sorted by name, as malloc'ed paths in names
// (at most max). Returns the count, or -1 when dir cannot be opened (printed).
// Free with tu_free_names.
int tu_list_files(const char *dir, const char *prefix, const char *suffix, char **names, int max);
void tu_free_names(char **names, int n);
// Runs run(path) on every file dir/PREFIX*SUFFIX (at most 256, by name) and
// prints "<path> ok" or "<path> FAILED" after each; a check fails when there
// are fewer than min_files. Returns -1 when dir cannot be opened, else the
// number of files.
int tu_run_files(const char *dir, const char *prefix, const char *suffix, int min_files,
                 void (*run)(const char *path));

// Prints "<name>: N passed, M failed" and returns 0 if no failure, else 1.
int tu_finish(const char *name);

#endif
