// Elementwise activations: GELU (exact erf form, PyTorch's nn.GELU() default) and
// ReLU, forward and backward, for the expert MLPs.
//
// GELU runs on 8192 x 2048 activations per MoE layer, next to the GEMMs, so it
// must vectorize. glibc's erff/expf are scalar calls the compiler cannot
// vectorize without -ffast-math, so the normal-tail function is written out here
// (its exp is fm_exp_split from fastmath.h) as straight-line float arithmetic
// (no calls, no branches, no float->int casts):
//
//   gelu(x) = x * Phi(x),  Phi(x) = 1 - Q(x) for x >= 0, Q(|x|) for x < 0,
//   Q(a) = 0.5 erfc(a / sqrt 2) = exp(-a^2 / 2) * R(a)   (upper normal tail).
//
// Working with the tail Q (not 1 + erf) keeps the RELATIVE error small for
// negative x as well, where 1 + erf(x/sqrt2) cancels (float erff loses all
// digits of 1 + erf below x ~ -5.5): over every float with 1e-6 <= |x| <= 12
// the forward is within 4.8e-7 relative of the double 0.5 x erfc(-x / sqrt 2),
// for each instruction-set copy below, with gcc and clang (test_kernels checks
// 1e-6 over a dense sweep of [-10, 10] for every copy the CPU supports, through
// moe_gelu_run_isa in internal.h). For x < -12, |gelu(x)| < 3e-32 and is
// returned as -0.
//
// Not here: the tanh approximation of GELU (a different function), and any
// fused bias+activation (the MoE layer calls bias_add and gelu separately).
#include <math.h>
#include <stdint.h>

#include "kernels/fastmath.h"
#include "kernels/kernels_internal.h"
#include "moe/kernels.h"

// Beyond this |x| the tail Q(|x|) < 2e-33 is flushed to zero; up to it
// exp(-x^2/2) >= 2^-104 is a normal float, so fm_exp_split is valid.
#define GELU_TAIL_CUT 12.0f

typedef struct {
  float phi_cdf;  // Phi(x)
  float pdf;      // phi(x) = exp(-x^2/2) / sqrt(2 pi), 0 when |x| > cut
} gelu_parts;

// Phi(x) and phi(x), Q to a few ulp relative. Inlined into the loops below;
// everything is plain float arithmetic so it vectorizes with SSE2.
static inline gelu_parts gelu_eval(float x) {
  // |x| is deliberately not clamped to the cut: GCC turns a clamp into a branch
  // whose constant arm it folds, and the loop no longer vectorizes. Above the
  // cut the arithmetic below yields meaningless (never trapping) values that
  // `keep` masks out; NaN flows through as NaN.
  const float a = fabsf(x);
  const int far = a > GELU_TAIL_CUT;  // false for NaN

  // exp(-a^2 / 2) with a^2 split exactly into hi + lo: ah is a with its low 12
  // mantissa bits cleared, so ah*ah (at most 24 significant bits) is exact.
  // Rounding a^2 itself would cost ~a^2 * 2^-24 relative error: 1e-5 at x = -12.
  // (Bit masking rather than Veltkamp's a*4097 split, which FMA contraction
  // under -ffp-contract=fast would silently break.)
  const float ah = fm_bits_and(a, 0xFFFFF000u);
  const float al = a - ah;
  const float hi = -0.5f * (ah * ah);
  const float lo = -0.5f * (al * (ah + ah) + al * al);
  // hi + lo >= -72 up to the cut: n in [-104, 0], so 2^n is a normal float.
  const float ex = fm_exp_split(hi, lo);  // exp(-a^2 / 2)

  // R(a) = Q(a) exp(a^2/2) = t * P(s), t = 3 / (3 + a) in [0.2, 1],
  // s = 2.5 t - 1.5 in [-1, 1]: degree-10 Chebyshev interpolant of R/t fitted
  // in long double (max relative error 1.1e-9 on [0, 12]).
  const float t = 3.0f / (3.0f + a);
  const float s = t * 2.5f - 1.5f;
  float q = 1.926890629e-06f;
  q = q * s + -1.004719148e-06f;
  q = q * s + -2.136833606e-05f;
  q = q * s + 3.525885641e-05f;
  q = q * s + 1.857587599e-04f;
  q = q * s + -5.465778605e-04f;
  q = q * s + -2.260955100e-03f;
  q = q * s + 6.198912270e-03f;
  q = q * s + 5.447206359e-02f;
  q = q * s + 1.617659840e-01f;
  q = q * s + 2.801700020e-01f;
  const float tq = ex * (t * q);                 // Q(|x|) for |x| <= cut
  const float pdf = ex * 0.398942280401432678f;  // 1/sqrt(2 pi)

  // The selections are bitwise, not `?:` on floats: GCC sinks the arithmetic of
  // a `?:` arm into a branch and then refuses to if-convert it back (a float op
  // "could trap"), which stops the loop from vectorizing.
  const uint32_t keep = 0u - (uint32_t)!far;  // all ones when |x| <= cut
  const uint32_t neg = 0u - (uint32_t)(x < 0.0f);
  const float tail = fm_bits_and(tq, keep);
  const float one_minus = 1.0f - tail;
  gelu_parts out;
  out.phi_cdf = fm_bits_select(neg, tail, one_minus);
  out.pdf = fm_bits_and(pdf, keep);
  return out;
}

// x * Phi(x) with x clamped below so that -inf gives -0 (not -inf * 0 = NaN).
static inline float gelu_value(float x) {
  const gelu_parts g = gelu_eval(x);
  const float xl = x < -GELU_TAIL_CUT ? -GELU_TAIL_CUT : x;  // NaN stays NaN
  return xl * g.phi_cdf;
}

// gelu'(x) = Phi(x) + x phi(x); x is zeroed where phi was flushed so that
// +-inf gives 1 and 0 instead of NaN.
static inline float gelu_grad(float x) {
  const gelu_parts g = gelu_eval(x);
  const uint32_t keep = 0u - (uint32_t) !(fabsf(x) > GELU_TAIL_CUT);
  return g.phi_cdf + fm_bits_and(x, keep) * g.pdf;
}

// ---- GELU loops and their per-ISA copies -----------------------------------------------

#if defined(__GNUC__) || defined(__clang__)
#define GELU_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define GELU_ALWAYS_INLINE inline
#endif

// Separate in-place and out-of-place loops: with y == x the restrict-qualified
// out-of-place loop would be undefined, and clang sends a loop without restrict
// to its scalar path when y == x (its runtime overlap check fails).
static GELU_ALWAYS_INLINE void gelu_fwd_loop(float *restrict y, const float *restrict x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = gelu_value(x[i]);
}

static GELU_ALWAYS_INLINE void gelu_fwd_inplace_loop(float *restrict y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = gelu_value(y[i]);
}

static GELU_ALWAYS_INLINE void gelu_bwd_loop(float *restrict dx, const float *restrict dy,
                                             const float *restrict x, size_t n) {
  for (size_t i = 0; i < n; i++) dx[i] += dy[i] * gelu_grad(x[i]);
}

enum { GELU_FWD, GELU_FWD_INPLACE, GELU_BWD };

// One copy of the three loops per instruction set. The library is built for
// baseline x86-64 (SSE2, 4 floats a vector); GELU is compute-bound (~60 flops
// an element), so on x86-64 with GCC or clang AVX2+FMA and AVX-512 copies are
// compiled too and picked at run time from CPUID. Results may differ between
// copies in the last bit where the compiler contracts a*b+c into an FMA.
#define GELU_ISA_COPY(suffix, attr)                                                       \
  attr static void gelu_run_##suffix(int op, float *out, const float *dy, const float *x, \
                                     size_t n) {                                          \
    if (op == GELU_FWD) {                                                                 \
      gelu_fwd_loop(out, x, n);                                                           \
    } else if (op == GELU_FWD_INPLACE) {                                                  \
      gelu_fwd_inplace_loop(out, n);                                                      \
    } else {                                                                              \
      gelu_bwd_loop(out, dy, x, n);                                                       \
    }                                                                                     \
  }

GELU_ISA_COPY(base, )

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GELU_X86_DISPATCH 1
GELU_ISA_COPY(avx2, __attribute__((target("avx2,fma"))))
GELU_ISA_COPY(avx512, __attribute__((target("avx512f,avx2,fma"))))
#else
#define GELU_X86_DISPATCH 0
#endif

// Bit (1 << MOE_GELU_ISA_x) per copy compiled in that this CPU can run.
// __builtin_cpu_supports reads flags libgcc filled in at startup: cheap enough
// per call, and no shared function pointer to initialise racily.
unsigned moe_gelu_isa_mask(void) {
  unsigned mask = 1u << MOE_GELU_ISA_BASE;
#if GELU_X86_DISPATCH
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    mask |= 1u << MOE_GELU_ISA_AVX2;
    if (__builtin_cpu_supports("avx512f")) mask |= 1u << MOE_GELU_ISA_AVX512;
  }
#endif
  return mask;
}

const char *moe_gelu_isa_name(int isa) {
  switch (isa) {
    case MOE_GELU_ISA_BASE:
      return "baseline";
    case MOE_GELU_ISA_AVX2:
      return "avx2+fma";
    case MOE_GELU_ISA_AVX512:
      return "avx512";
    default:
      return "unknown";
  }
}

// Runs the copy for `isa`, which the caller has checked is in the mask.
static void gelu_run_copy(int isa, int op, float *out, const float *dy, const float *x, size_t n) {
#if GELU_X86_DISPATCH
  if (isa == MOE_GELU_ISA_AVX512) {
    gelu_run_avx512(op, out, dy, x, n);
    return;
  }
  if (isa == MOE_GELU_ISA_AVX2) {
    gelu_run_avx2(op, out, dy, x, n);
    return;
  }
#endif
  (void)isa;
  gelu_run_base(op, out, dy, x, n);
}

// The widest copy this CPU supports.
static void gelu_run(int op, float *out, const float *dy, const float *x, size_t n) {
  const unsigned mask = moe_gelu_isa_mask();
  const int isa = (mask >> MOE_GELU_ISA_AVX512) & 1u ? MOE_GELU_ISA_AVX512
                  : (mask >> MOE_GELU_ISA_AVX2) & 1u ? MOE_GELU_ISA_AVX2
                                                     : MOE_GELU_ISA_BASE;
  gelu_run_copy(isa, op, out, dy, x, n);
}

int moe_gelu_run_isa(int isa, int op, float *out, const float *dy, const float *x, size_t n) {
  if (isa < 0 || isa >= MOE_GELU_ISA_COUNT || !((moe_gelu_isa_mask() >> isa) & 1u)) return -1;
  if (op == MOE_GELU_FORWARD) {
    gelu_run_copy(isa, out == x ? GELU_FWD_INPLACE : GELU_FWD, out, NULL, x, n);
  } else if (op == MOE_GELU_BACKWARD) {
    gelu_run_copy(isa, GELU_BWD, out, dy, x, n);
  } else {
    return -1;
  }
  return 0;
}

// y, x are (n); y == x allowed (partial overlap is not).
void moe_gelu_forward(float *y, const float *x, size_t n) {
  gelu_run(y == x ? GELU_FWD_INPLACE : GELU_FWD, y, NULL, x, n);
}

// dx, dy, x are (n); x is the forward input.
void moe_gelu_backward(float *dx, const float *dy, const float *x, size_t n) {
  gelu_run(GELU_BWD, dx, dy, x, n);
}

// The definition itself in double: 0.5 x (1 + erf(x/sqrt2)) == 0.5 x erfc(-x/sqrt2);
// the erfc form is exact in the negative tail where 1 + erf cancels.
void moe_gelu_forward_ref(float *y, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const double xd = x[i];
    y[i] = (float)(0.5 * xd * erfc(-xd * 0.70710678118654752440));
  }
}

// ---- ReLU ------------------------------------------------------------------------

// Compares and selects, not fmaxf(x, 0) (which turns NaN into 0): NaN
// propagates as in PyTorch, and the loop compiles to compare-and-mask.
static void relu_inplace(float *restrict y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = y[i] > 0.0f ? y[i] : (y[i] != y[i] ? y[i] : 0.0f);
}

static void relu_outofplace(float *restrict y, const float *restrict x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : (x[i] != x[i] ? x[i] : 0.0f);
}

// y, x are (n); y == x allowed.
void moe_relu_forward(float *y, const float *x, size_t n) {
  if (y == x) {
    relu_inplace(y, n);
  } else {
    relu_outofplace(y, x, n);
  }
}

// dx, dy, x are (n). The derivative at exactly 0 is taken as 0 (PyTorch's choice).
void moe_relu_backward(float *dx, const float *dy, const float *x, size_t n) {
  float *restrict dxr = dx;
  const float *restrict dyr = dy;
  const float *restrict xr = x;
  for (size_t i = 0; i < n; i++) dxr[i] += xr[i] > 0.0f ? dyr[i] : 0.0f;
}

void moe_relu_forward_ref(float *y, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (x[i] != x[i]) {
      y[i] = x[i];
    } else {
      y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    }
  }
}
