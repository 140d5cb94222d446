// Tests of the causal self-attention kernel (moe_attention_* in
// include/moe/kernels.h), run on the public functions and then on every
// instruction-set copy of its row loops the CPU supports (through the test
// hooks in src/kernels/attention.c), the copies also compared with each other:
//   - a hand case with literal numbers (S = 2, forward and backward), so a
//     mistake shared by the kernel and its `_ref` cannot pass;
//   - forward against moe_attention_forward_ref over awkward shapes (S = 1,
//     hd = 1, NH = 1, odd sizes, S on both sides of the 32-row tile, hd > 64,
//     B > 1) into NaN-filled outputs; att rows sum to 1, the upper triangle is
//     exactly +0; large scores (~1e2..1e3) stay finite and accurate;
//   - backward against central finite differences of L = sum(out * w)
//     computed in double through the _ref forward, every qkv element, on small
//     shapes (two of them cross a tile boundary); on larger shapes against a
//     naive double-precision backward written here;
//   - the accumulate (+=) contract (twice from zero = 2x once; onto a pre-filled
//     buffer); scratch contents ignored (NaN-filled) and nothing written past
//     moe_attention_scratch_floats;
//   - causality: perturbing qkv at position t' leaves out at every t < t' (and
//     the other batch row) bit-identical, and changes out at t'.
// Finally a timing line for B=16 S=128 NH=4 hd=32 with one BLAS thread
// (printed, never checked).
//
// Tolerances: forward atol 1e-6 + rtol 2e-5 against the double reference
// (observed worst ~2e-7; sgemm over k <= 200 with |q|, |k|, |v| <= 2), 1e-4 +
// 2e-3 with big scores (a float score of ~1e3 is off by ~1e-4); finite
// differences eps 1e-2, atol 3e-5, rtol 1e-3 (observed worst ~6e-6); the naive
// backward 1e-5 + 1e-4. Scaling dQ, dK, dV or the rowsum term of the softmax
// backward by 0.99, shortening a column tile by one row, or an off-by-one in
// the mask fails them (checked by hand on mutated kernels).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_internal.h"
#include "moe/core.h"
#include "moe/kernels.h"
#include "testutil.h"

// Test hooks defined in src/kernels/attention.c: the public forward / backward
// on the row-loop copy for one instruction set (MOE_GELU_ISA_x); -1 when the
// CPU or build lacks it. Declared here because src/kernels/kernels_internal.h, where
// such hooks belong, is outside this kernel's files.
int moe_attention_forward_isa(int isa, float *out, float *att, const float *qkv, int b, int s,
                              int nh, int hd);
int moe_attention_backward_isa(int isa, float *dqkv, float *scratch, const float *dout,
                               const float *att, const float *qkv, int b, int s, int nh, int hd);

// The copy under test: -1 for the public functions (widest copy), else a
// MOE_GELU_ISA_x. Every test below runs through fwd() and bwd().
static int g_isa = -1;

static const char *isa_label(void) { return g_isa < 0 ? "public" : moe_gelu_isa_name(g_isa); }

static void fwd(float *out, float *att, const float *qkv, int b, int s, int nh, int hd) {
  if (g_isa < 0) {
    moe_attention_forward(out, att, qkv, b, s, nh, hd);
  } else {
    const int rc = moe_attention_forward_isa(g_isa, out, att, qkv, b, s, nh, hd);
    TU_CHECK(rc == 0, "moe_attention_forward_isa(%s) failed", isa_label());
  }
}

static void bwd(float *dqkv, float *scratch, const float *dout, const float *att, const float *qkv,
                int b, int s, int nh, int hd) {
  if (g_isa < 0) {
    moe_attention_backward(dqkv, scratch, dout, att, qkv, b, s, nh, hd);
  } else {
    const int rc = moe_attention_backward_isa(g_isa, dqkv, scratch, dout, att, qkv, b, s, nh, hd);
    TU_CHECK(rc == 0, "moe_attention_backward_isa(%s) failed", isa_label());
  }
}

// ---- small helpers ---------------------------------------------------------------------

static void fill_nan(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = NAN;
}

static int all_finite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(x[i])) return 0;
  }
  return 1;
}

typedef struct {
  int b, s, nh, hd;
} shape;

static size_t n_qkv(shape p) { return (size_t)p.b * p.s * 3 * p.nh * p.hd; }
static size_t n_out(shape p) { return (size_t)p.b * p.s * p.nh * p.hd; }
static size_t n_att(shape p) { return (size_t)p.b * p.nh * p.s * p.s; }

static double dot_d(const float *a, const float *b, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
  return s;
}

// Rows of att sum to 1 (within 1e-5) and entries u > t are exactly +0.
static void check_att_rows(const char *name, const float *att, shape p) {
  double worst = 0.0;
  size_t upper_bad = 0;
  for (int bh = 0; bh < p.b * p.nh; bh++) {
    for (int t = 0; t < p.s; t++) {
      const float *row = att + ((size_t)bh * p.s + t) * p.s;
      double sum = 0.0;
      for (int u = 0; u <= t; u++) sum += row[u];
      worst = fmax(worst, fabs(sum - 1.0));
      for (int u = t + 1; u < p.s; u++) upper_bad += !(row[u] == 0.0f && !signbit(row[u]));
    }
  }
  TU_CHECK(worst < 1e-5, "%s: att rows sum to 1 (worst |sum - 1| %.3g)", name, worst);
  TU_CHECK(upper_bad == 0, "%s: %zu entries above the diagonal are not +0", name, upper_bad);
}

// ---- hand case ----------------------------------------------------------------------------

static void test_hand(void) {
  // B = 1, S = 2, NH = 1, hd = 1: rows [q | k | v]. t = 0 sees only u = 0:
  // out0 = v0 = 4. t = 1: scores q1*k0 = 0, q1*k1 = ln 3 -> att (1/4, 3/4),
  // out1 = 4/4 + 3*8/4 = 7.
  const float qkv[6] = {0.5f, 0.0f, 4.0f, 1.0986122886681098f, 1.0f, 8.0f};
  const float want_out[2] = {4.0f, 7.0f}, want_att[4] = {1.0f, 0.0f, 0.25f, 0.75f};
  float out[2], att[4];
  fwd(out, att, qkv, 1, 2, 1, 1);
  tu_allclose("attention hand out", out, want_out, 2, 0, 1e-6);
  tu_allclose("attention hand att", att, want_att, 4, 0, 1e-6);
  moe_attention_forward_ref(out, att, qkv, 1, 2, 1, 1);
  tu_allclose("attention hand out (ref)", out, want_out, 2, 0, 1e-6);
  tu_allclose("attention hand att (ref)", att, want_att, 4, 0, 1e-6);

  // Backward by hand, dout = (0, 1): only t = 1 contributes. datt1 = v = (4, 8),
  // rowsum(datt*att) = 1 + 6 = 7, ds1 = att1 * (datt1 - 7) = (-0.75, 0.75).
  // dq1 = ds1 . (k0, k1) = 0.75; dk0 = -0.75 q1, dk1 = 0.75 q1; dv = att1 = (1/4, 3/4);
  // nothing for q0 (its only score is alone in its softmax).
  const float dout[2] = {0.0f, 1.0f};
  const float l3 = 1.0986122886681098f;
  const float want_d[6] = {0.0f, -0.75f * l3, 0.25f, 0.75f, 0.75f * l3, 0.75f};
  float dqkv[6] = {0}, scratch[4];
  fwd(out, att, qkv, 1, 2, 1, 1);
  bwd(dqkv, scratch, dout, att, qkv, 1, 2, 1, 1);
  tu_allclose("attention hand dqkv", dqkv, want_d, 6, 1e-7, 1e-6);
}

// ---- forward vs reference --------------------------------------------------------------------

static const shape fwd_shapes[] = {{1, 1, 1, 1},    {3, 1, 2, 3},   {1, 2, 1, 1},  {2, 5, 1, 1},
                                   {1, 7, 3, 5},    {3, 17, 2, 8},  {1, 31, 1, 4}, {2, 32, 2, 16},
                                   {1, 33, 3, 7},   {2, 64, 4, 32}, {1, 65, 2, 9}, {1, 129, 1, 33},
                                   {2, 100, 3, 70}, {1, 200, 2, 13}};

static void test_forward(void) {
  char name[128];
  for (size_t si = 0; si < sizeof fwd_shapes / sizeof fwd_shapes[0]; si++) {
    const shape p = fwd_shapes[si];
    for (int big = 0; big < 2; big++) {
      // big: q and k scaled so scores reach ~1e3 (max-subtraction must hold).
      float *qkv = tu_filled(n_qkv(p), 100 + si, -2, 2);
      if (big) {
        const int d = p.nh * p.hd;
        for (size_t r = 0; r < (size_t)p.b * p.s; r++) {
          for (int c = 0; c < 2 * d; c++) qkv[r * 3 * d + c] *= 10.0f;
        }
      }
      float *out = tu_fbuf(n_out(p)), *att = tu_fbuf(n_att(p));
      float *out_r = tu_fbuf(n_out(p)), *att_r = tu_fbuf(n_att(p));
      fill_nan(out, n_out(p));
      fill_nan(att, n_att(p));
      fill_nan(out_r, n_out(p));
      fill_nan(att_r, n_att(p));
      fwd(out, att, qkv, p.b, p.s, p.nh, p.hd);
      moe_attention_forward_ref(out_r, att_r, qkv, p.b, p.s, p.nh, p.hd);
      snprintf(name, sizeof name, "attention fwd [%s] B%d S%d NH%d hd%d%s", isa_label(), p.b, p.s,
               p.nh, p.hd, big ? " (big scores)" : "");
      TU_CHECK(all_finite(out, n_out(p)) && all_finite(att, n_att(p)), "%s: non-finite output",
               name);
      // Big scores: att is nearly one-hot, and a score error of 1e-4 (float
      // rounding of ~1e3) moves probabilities by 1e-4 relative.
      const double rtol = big ? 2e-3 : 2e-5, atol = big ? 1e-4 : 1e-6;
      char nm[160];
      snprintf(nm, sizeof nm, "%s out", name);
      tu_allclose(nm, out, out_r, n_out(p), atol, rtol);
      snprintf(nm, sizeof nm, "%s att", name);
      tu_allclose(nm, att, att_r, n_att(p), atol, rtol);
      check_att_rows(name, att, p);
      snprintf(nm, sizeof nm, "%s (ref)", name);
      check_att_rows(nm, att_r, p);
    }
  }
  // Sizes <= 0 do nothing (and touch nothing).
  float sentinel = 42.0f;
  fwd(&sentinel, &sentinel, &sentinel, 0, 4, 1, 1);
  fwd(&sentinel, &sentinel, &sentinel, 1, 0, 1, 1);
  bwd(&sentinel, &sentinel, &sentinel, &sentinel, &sentinel, 1, 4, 0, 1);
  TU_CHECK(sentinel == 42.0f, "empty shapes wrote to their buffers");
  TU_CHECK(moe_attention_scratch_floats(1, 0, 1, 1) == 0, "scratch for S = 0");
}

// ---- backward ----------------------------------------------------------------------------------

typedef struct {
  const float *qkv, *w;
  float *out, *att;
  shape p;
} att_fd;

// L = sum(out * w) through the double-accumulating reference forward.
static double att_loss(void *u) {
  att_fd *c = u;
  moe_attention_forward_ref(c->out, c->att, c->qkv, c->p.b, c->p.s, c->p.nh, c->p.hd);
  return dot_d(c->out, c->w, n_out(c->p));
}

// Naive backward in double from the definition (recomputes the softmax from
// qkv): dqkv += d(sum out * dout)/dqkv.
static void backward_naive(float *dqkv, const float *dout, const float *qkv, shape p) {
  const int d = p.nh * p.hd, ld = 3 * d;
  const double scale = 1.0 / sqrt((double)p.hd);
  double *pr = malloc(sizeof(double) * p.s), *dp = malloc(sizeof(double) * p.s);
  if (!pr || !dp) exit(2);
  for (int b = 0; b < p.b; b++) {
    for (int h = 0; h < p.nh; h++) {
      const size_t base = (size_t)b * p.s * ld + (size_t)h * p.hd;
      const float *q = qkv + base, *k = q + d, *v = q + 2 * d;
      float *dq = dqkv + base, *dk = dq + d, *dv = dq + 2 * d;
      const float *go = dout + (size_t)b * p.s * d + (size_t)h * p.hd;
      for (int t = 0; t < p.s; t++) {
        double mx = -INFINITY, sum = 0.0, rs = 0.0;
        for (int u = 0; u <= t; u++) {
          double sc = 0.0;
          for (int i = 0; i < p.hd; i++) sc += (double)q[t * ld + i] * k[u * ld + i];
          pr[u] = sc * scale;
          mx = fmax(mx, pr[u]);
        }
        for (int u = 0; u <= t; u++) sum += (pr[u] = exp(pr[u] - mx));
        for (int u = 0; u <= t; u++) {
          pr[u] /= sum;
          dp[u] = 0.0;
          for (int i = 0; i < p.hd; i++) dp[u] += (double)go[t * d + i] * v[u * ld + i];
          rs += dp[u] * pr[u];
        }
        for (int u = 0; u <= t; u++) {
          const double g = pr[u] * (dp[u] - rs) * scale;
          for (int i = 0; i < p.hd; i++) {
            dq[t * ld + i] = (float)(dq[t * ld + i] + g * k[u * ld + i]);
            dk[u * ld + i] = (float)(dk[u * ld + i] + g * q[t * ld + i]);
            dv[u * ld + i] = (float)(dv[u * ld + i] + pr[u] * go[t * d + i]);
          }
        }
      }
    }
  }
  free(pr);
  free(dp);
}

// Forward, then backward with a NaN-filled scratch of exactly the advertised
// size plus a guard that must stay untouched; dqkv += gradient.
static void run_backward(const char *name, float *dqkv, const float *dout, const float *qkv,
                         shape p) {
  float *out = tu_fbuf(n_out(p)), *att = tu_fbuf(n_att(p));
  fwd(out, att, qkv, p.b, p.s, p.nh, p.hd);
  const size_t ns = moe_attention_scratch_floats(p.b, p.s, p.nh, p.hd);
  TU_CHECK(ns <= n_att(p), "%s: scratch %zu floats > B*NH*S*S", name, ns);
  float *scratch = tu_fbuf(ns + 16);
  fill_nan(scratch, ns);
  for (int i = 0; i < 16; i++) scratch[ns + i] = 1234.5f;
  bwd(dqkv, scratch, dout, att, qkv, p.b, p.s, p.nh, p.hd);
  int guard_ok = 1;
  for (int i = 0; i < 16; i++) guard_ok &= scratch[ns + i] == 1234.5f;
  TU_CHECK(guard_ok, "%s: backward wrote past moe_attention_scratch_floats (%zu)", name, ns);
}

static const shape fd_shapes[] = {{1, 1, 1, 1}, {1, 3, 1, 2},  {2, 4, 2, 3}, {1, 6, 1, 4},
                                  {3, 5, 3, 2}, {1, 35, 1, 2}, {2, 40, 2, 3}};
static const shape cmp_shapes[] = {{2, 64, 4, 32}, {1, 97, 3, 11}, {2, 129, 2, 33}};

static void test_backward(void) {
  char name[128];
  for (size_t si = 0; si < sizeof fd_shapes / sizeof fd_shapes[0]; si++) {
    const shape p = fd_shapes[si];
    float *qkv = tu_filled(n_qkv(p), 200 + si, -1.5f, 1.5f),
          *w = tu_filled(n_out(p), 300 + si, -1, 1);
    float *dqkv = tu_fbuf(n_qkv(p));
    snprintf(name, sizeof name, "attention dqkv FD [%s] B%d S%d NH%d hd%d", isa_label(), p.b, p.s,
             p.nh, p.hd);
    run_backward(name, dqkv, w, qkv, p);
    att_fd c = {qkv, w, tu_fbuf(n_out(p)), tu_fbuf(n_att(p)), p};
    tu_fd_check(name, att_loss, &c, qkv, dqkv, n_qkv(p), 1e-2f, 3e-5, 1e-3);

    // Accumulation: twice from zero is 2x once; onto a pre-filled buffer adds.
    float *twice = tu_fbuf(n_qkv(p)), *want = tu_fbuf(n_qkv(p));
    run_backward(name, twice, w, qkv, p);
    run_backward(name, twice, w, qkv, p);
    for (size_t i = 0; i < n_qkv(p); i++) want[i] = 2.0f * dqkv[i];
    snprintf(name, sizeof name, "attention dqkv accumulates (2x) [%s] B%d S%d", isa_label(), p.b,
             p.s);
    tu_allclose(name, twice, want, n_qkv(p), 1e-6, 1e-5);
    float *base = tu_filled(n_qkv(p), 400 + si, -1, 1), *acc = tu_copy_of(base, n_qkv(p));
    run_backward(name, acc, w, qkv, p);
    for (size_t i = 0; i < n_qkv(p); i++) want[i] = base[i] + dqkv[i];
    snprintf(name, sizeof name, "attention dqkv accumulates (base) [%s] B%d S%d", isa_label(), p.b,
             p.s);
    tu_allclose(name, acc, want, n_qkv(p), 1e-6, 1e-5);
  }

  // Larger shapes (tile boundaries inside, hd not a multiple of anything):
  // against the naive double backward.
  for (size_t si = 0; si < sizeof cmp_shapes / sizeof cmp_shapes[0]; si++) {
    const shape p = cmp_shapes[si];
    float *qkv = tu_filled(n_qkv(p), 500 + si, -2, 2), *dout = tu_filled(n_out(p), 600 + si, -1, 1);
    float *base = tu_filled(n_qkv(p), 700 + si, -1, 1);
    float *got = tu_copy_of(base, n_qkv(p)), *want = tu_copy_of(base, n_qkv(p));
    snprintf(name, sizeof name, "attention dqkv vs naive [%s] B%d S%d NH%d hd%d", isa_label(), p.b,
             p.s, p.nh, p.hd);
    run_backward(name, got, dout, qkv, p);
    backward_naive(want, dout, qkv, p);
    tu_allclose(name, got, want, n_qkv(p), 1e-5, 1e-4);
  }
}

// ---- causality
// -----------------------------------------------------------------------------------

static void test_causality(void) {
  const shape p = {2, 40, 2, 4};
  const int d = p.nh * p.hd;
  float *qkv = tu_filled(n_qkv(p), 800, -1, 1);
  float *out0 = tu_fbuf(n_out(p)), *att0 = tu_fbuf(n_att(p));
  float *out1 = tu_fbuf(n_out(p)), *att1 = tu_fbuf(n_att(p));
  const int tps[] = {0, 1, 17, 31, 32, 33, 39};
  for (int fast = 0; fast < 2; fast++) {
    void (*run)(float *, float *, const float *, int, int, int, int) =
        fast ? fwd : moe_attention_forward_ref;
    run(out0, att0, qkv, p.b, p.s, p.nh, p.hd);
    for (size_t ti = 0; ti < sizeof tps / sizeof tps[0]; ti++) {
      const int tp = tps[ti];
      float *pert = tu_copy_of(qkv, n_qkv(p));
      // Perturb all of q, k and v at (b = 1, t').
      for (int c = 0; c < 3 * d; c++) pert[((size_t)1 * p.s + tp) * 3 * d + c] += 0.5f;
      run(out1, att1, pert, p.b, p.s, p.nh, p.hd);
      size_t changed_before = 0, changed_at = 0;
      for (int b = 0; b < p.b; b++) {
        for (int t = 0; t < p.s; t++) {
          const size_t off = ((size_t)b * p.s + t) * d;
          const int same = memcmp(out0 + off, out1 + off, d * sizeof(float)) == 0;
          if (b == 0 || t < tp) changed_before += !same;
          if (b == 1 && t == tp) changed_at += !same;
        }
      }
      TU_CHECK(changed_before == 0,
               "causality (%s): perturbing t'=%d changed %zu earlier/other-batch rows of out",
               fast ? isa_label() : "ref", tp, changed_before);
      TU_CHECK(changed_at == 1, "causality (%s): perturbing t'=%d did not change out at t'",
               fast ? isa_label() : "ref", tp);
    }
  }
}

// ---- timing
// ---------------------------------------------------------------------------------------

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void time_attention(void) {
  const shape p = {16, 128, 4, 32};
  moe_blas_set_threads(1);
  float *qkv = tu_filled(n_qkv(p), 900, -1, 1), *dout = tu_filled(n_out(p), 901, -1, 1);
  float *out = tu_fbuf(n_out(p)), *att = tu_fbuf(n_att(p)), *dqkv = tu_fbuf(n_qkv(p));
  float *scratch = tu_fbuf(moe_attention_scratch_floats(p.b, p.s, p.nh, p.hd));
  enum { REPS = 15 };
  double tf[REPS], tb[REPS];
  for (int r = 0; r < REPS; r++) {
    const uint64_t t0 = moe_time_ns();
    moe_attention_forward(out, att, qkv, p.b, p.s, p.nh, p.hd);
    const uint64_t t1 = moe_time_ns();
    moe_attention_backward(dqkv, scratch, dout, att, qkv, p.b, p.s, p.nh, p.hd);
    const uint64_t t2 = moe_time_ns();
    tf[r] = (double)(t1 - t0) * 1e-6;
    tb[r] = (double)(t2 - t1) * 1e-6;
  }
  qsort(tf, REPS, sizeof(double), cmp_double);
  qsort(tb, REPS, sizeof(double), cmp_double);
  // Causal flops: forward 2 GEMMs, backward 4, each ~S^2 hd (half of 2 S^2 hd).
  const double gf = (double)p.b * p.nh * p.s * p.s * p.hd * 1e-9;
  printf(
      "attention timing B%d S%d NH%d hd%d, 1 BLAS thread (%s): forward %.3f ms, backward "
      "%.3f ms, total %.3f ms (median of %d; causal %.1f GFLOP/s)\n",
      p.b, p.s, p.nh, p.hd, moe_blas_core(), tf[REPS / 2], tb[REPS / 2],
      tf[REPS / 2] + tb[REPS / 2], REPS, 6.0 * gf / ((tf[REPS / 2] + tb[REPS / 2]) * 1e-3));
}

// Every copy against the public functions: same results within float
// rounding (copies differ only in FMA contraction and vector width).
static void test_isa_copies_agree(void) {
  const shape p = {2, 77, 3, 19};
  float *qkv = tu_filled(n_qkv(p), 1000, -2, 2), *dout = tu_filled(n_out(p), 1001, -1, 1);
  float *out_p = tu_fbuf(n_out(p)), *att_p = tu_fbuf(n_att(p)), *d_p = tu_fbuf(n_qkv(p));
  float *out_c = tu_fbuf(n_out(p)), *att_c = tu_fbuf(n_att(p)), *d_c = tu_fbuf(n_qkv(p));
  float *scratch = tu_fbuf(moe_attention_scratch_floats(p.b, p.s, p.nh, p.hd));
  moe_attention_forward(out_p, att_p, qkv, p.b, p.s, p.nh, p.hd);
  moe_attention_backward(d_p, scratch, dout, att_p, qkv, p.b, p.s, p.nh, p.hd);
  fwd(out_c, att_c, qkv, p.b, p.s, p.nh, p.hd);
  bwd(d_c, scratch, dout, att_c, qkv, p.b, p.s, p.nh, p.hd);
  char name[96];
  snprintf(name, sizeof name, "attention [%s] out = public", isa_label());
  tu_allclose(name, out_c, out_p, n_out(p), 1e-6, 1e-5);
  snprintf(name, sizeof name, "attention [%s] att = public", isa_label());
  tu_allclose(name, att_c, att_p, n_att(p), 1e-7, 1e-5);
  snprintf(name, sizeof name, "attention [%s] dqkv = public", isa_label());
  tu_allclose(name, d_c, d_p, n_qkv(p), 1e-6, 1e-5);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  void (*const tests[])(void) = {test_hand, test_forward, test_backward, test_causality};
  // The public functions, then each instruction-set copy the CPU can run.
  const unsigned mask = moe_gelu_isa_mask();
  for (int isa = -1; isa < MOE_GELU_ISA_COUNT; isa++) {
    if (isa >= 0 && !((mask >> isa) & 1u)) {
      printf("attention[%s]: not supported by this CPU or build, not tested\n",
             moe_gelu_isa_name(isa));
      continue;
    }
    g_isa = isa;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
      tests[i]();
      tu_free_all();
    }
    if (isa >= 0) {
      test_isa_copies_agree();
      tu_free_all();
    }
  }
  g_isa = -1;
  TU_CHECK(moe_attention_forward_isa(MOE_GELU_ISA_COUNT, NULL, NULL, NULL, 1, 1, 1, 1) == -1 &&
               moe_attention_backward_isa(-1, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 1) == -1,
           "the ISA hooks accept an unknown instruction set");
  time_attention();
  tu_free_all();
  return tu_finish("test_attention");
}
