// The batch-invariant bf16 GEMM (moe_gemm_bf16, see kernels.h): op(A) and
// alpha * op(B) are rounded to bfloat16, products are accumulated in fp32.
// Every element of C is one chain over the pairs of k:
//     s = C_ij after beta
//     for q = 0, 1, ..., ceil(k/2) - 1:
//       s = ftz(fma(a[2q+1], b[2q+1], daz(s)))      (a[k] = b[k] = 0 when k is odd)
//       s = ftz(fma(a[2q],   b[2q],   s))
// where a[p] = bf16(op(A)_ip), b[p] = bf16(alpha * op(B)_pj), both rounded to
// nearest-even with subnormal results flushed to zero, and daz/ftz turn a
// subnormal into a zero of the same sign. The product of two bf16 values is
// exact in fp32, so each fma is one rounding of s plus an exact product.
//
// This is what AVX512_BF16's VDPBF16PS computes per lane (odd element first,
// each step rounded to nearest-even, denormals treated as and flushed to
// zero; checked bit for bit against the instruction on 20 million random
// operands, extreme exponents included), so the AVX512_BF16 kernel and the
// portable one (fmaf plus the flushes) give the same bits. As in the fp32
// kernel the chain does not depend on m, n, the row's place in the call or the
// blocking: a row's bits are the same at any batch size (batch invariance),
// and k split at even points over calls with beta = 1 equals one call.
//
// Layout: for each block of NC columns and KC steps of k, alpha * op(B) is
// rounded and packed into panels of NR columns of bf16 pairs (q, j, {2q, 2q+1});
// the rows go in blocks of MC whose strips of MR rows are rounded and packed as
// (q, i) pairs; an MR x NR tile of C lives in registers. Edge tiles go through
// a zero-padded scratch tile. Single-threaded.
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_internal.h"
#include "moe/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MOE_BF16_X86 1
#include <immintrin.h>
#else
#define MOE_BF16_X86 0
#endif

// MR x NR tile; KC even.
enum { MR = 8, NR = 32, KC = 512, NC = 512, MC = 128 };

// ---- bf16 rounding -----------------------------------------------------------------

uint16_t moe_bf16_round(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return (uint16_t)(u >> 16);
}

float moe_bf16_to_float(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// The GEMM's inputs: a subnormal float becomes a zero of its sign, every
// other value is rounded to nearest-even (a normal float never rounds to a
// subnormal bf16, so no bf16 input is subnormal: VDPBF16PS's DAZ changes
// nothing). The AVX-512 packing below computes the same with vector integer
// operations.
static inline uint16_t bf16_in(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
  return moe_bf16_round(x);
}

static inline float flush(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  memcpy(&x, &u, sizeof x);
  return x;
}

// ---- kernels -------------------------------------------------------------------------

// c (MR x NR, row stride ldc) continues its chains over kq pairs: ap[q * MR + i]
// is row i's pair q (low half the even element), bp[(q * NR + j)] column j's.
// zero: the chains start at 0 instead of at c.
typedef void (*ukernel_fn)(int kq, const uint32_t *ap, const uint32_t *bp, float *c, ptrdiff_t ldc,
                           int zero);

static void ukernel_portable(int kq, const uint32_t *ap, const uint32_t *bp, float *c,
                             ptrdiff_t ldc, int zero) {
  for (int i = 0; i < MR; i++) {
    float acc[NR];
    float *ci = c + (ptrdiff_t)i * ldc;
    for (int j = 0; j < NR; j++) acc[j] = zero ? 0.0f : ci[j];
    for (int q = 0; q < kq; q++) {
      const uint32_t a = ap[(size_t)q * MR + (size_t)i];
      const float a0 = moe_bf16_to_float((uint16_t)a), a1 = moe_bf16_to_float((uint16_t)(a >> 16));
      const uint32_t *bq = bp + (size_t)q * NR;
      for (int j = 0; j < NR; j++) {
        const float b0 = moe_bf16_to_float((uint16_t)bq[j]);
        const float b1 = moe_bf16_to_float((uint16_t)(bq[j] >> 16));
        acc[j] = flush(fmaf(a0, b0, flush(fmaf(a1, b1, flush(acc[j])))));
      }
    }
    for (int j = 0; j < NR; j++) ci[j] = acc[j];
  }
}

#if MOE_BF16_X86
__attribute__((target("avx512f,avx512bf16"))) static void ukernel_avx512bf16(
    int kq, const uint32_t *ap, const uint32_t *bp, float *c, ptrdiff_t ldc, int zero) {
  __m512 acc[MR][2];
  for (int i = 0; i < MR; i++) {
    acc[i][0] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc);
    acc[i][1] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + 16);
  }
  for (int q = 0; q < kq; q++) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp),
                   b1 = (__m512bh)_mm512_loadu_si512(bp + 16);
    bp += NR;
    for (int i = 0; i < MR; i++) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[i]);
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], a, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], a, b1);
    }
    ap += MR;
  }
  for (int i = 0; i < MR; i++) {
    _mm512_storeu_ps(c + i * ldc, acc[i][0]);
    _mm512_storeu_ps(c + i * ldc + 16, acc[i][1]);
  }
}
#endif

typedef struct {
  ukernel_fn fn;
  const char *name;
} ukernel;

static const ukernel k_portable = {ukernel_portable, "portable (fmaf)"};

// MOE_GEMM_FIXED_ISA=portable (or avx2: no bf16 instructions) picks the
// portable kernel, as for the fp32 kernel.
static ukernel pick_kernel(void) {
#if MOE_BF16_X86
  const char *force = getenv("MOE_GEMM_FIXED_ISA");
  if (!force || (strcmp(force, "portable") != 0 && strcmp(force, "avx2") != 0)) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16")) {
      return (ukernel){ukernel_avx512bf16, "avx512_bf16"};
    }
  }
#endif
  return k_portable;
}

static ukernel g_kernel;
static pthread_once_t g_kernel_once = PTHREAD_ONCE_INIT;
static void kernel_make(void) { g_kernel = pick_kernel(); }

static const ukernel *kernel(void) {
  pthread_once(&g_kernel_once, kernel_make);
  return &g_kernel;
}

const char *moe_gemm_bf16_isa(void) { return kernel()->name; }

int moe_bf16_native(void) { return kernel()->fn != ukernel_portable; }

// ---- scratch and packing ---------------------------------------------------------------

// Per thread: the B panels (NC x KC/2 pairs) and one MC x KC/2 block of A.
enum { BPACK = NC * (KC / 2), APACK = MC * (KC / 2) };

static uint32_t *scratch(void) {
  _Static_assert((size_t)(BPACK + APACK) * sizeof(uint32_t) <= MOE_GEMM_SCRATCH_BYTES,
                 "the bf16 kernel's packing exceeds the shared scratch");
  return moe_gemm_scratch();
}

static inline uint32_t pair(float even, float odd) {
  return (uint32_t)bf16_in(even) | ((uint32_t)bf16_in(odd) << 16);
}

// alpha * op(B) rows [p0, p0 + kc) and columns [j0, j0 + nc) into ceil(nc / NR)
// panels of kq = ceil(kc / 2) pairs x NR columns (zero past column nc and
// past row k).
static void pack_b_vec(uint32_t *dst, const float *b, int ldb, int trans_b, int p0, int kc, int j0,
                       int nc, float alpha);

static void pack_b(uint32_t *restrict dst, const float *b, int ldb, int trans_b, int p0, int kc,
                   int j0, int nc, float alpha, int vec) {
  if (vec) {
    pack_b_vec(dst, b, ldb, trans_b, p0, kc, j0, nc, alpha);
    return;
  }
  const int kq = (kc + 1) / 2;
  for (int jp = 0; jp < nc; jp += NR) {
    const int nr = nc - jp < NR ? nc - jp : NR;
    for (int q = 0; q < kq; q++) {
      const int p = p0 + 2 * q;
      const int has_odd = 2 * q + 1 < kc;
      uint32_t *restrict d = dst + (size_t)q * NR;
      for (int j = 0; j < nr; j++) {
        const size_t col = (size_t)(j0 + jp + j);
        const float e =
            trans_b ? b[col * (size_t)ldb + (size_t)p] : b[(size_t)p * (size_t)ldb + col];
        const float o = !has_odd ? 0.0f
                                 : (trans_b ? b[col * (size_t)ldb + (size_t)p + 1]
                                            : b[(size_t)(p + 1) * (size_t)ldb + col]);
        d[j] = pair(alpha * e, alpha * o);
      }
      for (int j = nr; j < NR; j++) d[j] = 0;
    }
    dst += (size_t)kq * NR;
  }
}

// op(A) rows [i0, i0 + mr) (mr <= MR), k [p0, p0 + kc) into one strip of kq
// pairs x MR (zero past row mr and past k).
static void pack_a_vec(uint32_t *dst, const float *a, int lda, int trans_a, int i0, int mr, int p0,
                       int kc);

static void pack_a_strip(uint32_t *restrict dst, const float *a, int lda, int trans_a, int i0,
                         int mr, int p0, int kc, int vec) {
  if (vec) {
    pack_a_vec(dst, a, lda, trans_a, i0, mr, p0, kc);
    return;
  }
  const int kq = (kc + 1) / 2;
  for (int q = 0; q < kq; q++) {
    const int p = p0 + 2 * q;
    const int has_odd = 2 * q + 1 < kc;
    uint32_t *restrict d = dst + (size_t)q * MR;
    for (int i = 0; i < mr; i++) {
      const size_t row = (size_t)(i0 + i);
      const float e = trans_a ? a[(size_t)p * (size_t)lda + row] : a[row * (size_t)lda + (size_t)p];
      const float o = !has_odd ? 0.0f
                               : (trans_a ? a[(size_t)(p + 1) * (size_t)lda + row]
                                          : a[row * (size_t)lda + (size_t)p + 1]);
      d[i] = pair(e, o);
    }
    for (int i = mr; i < MR; i++) d[i] = 0;
  }
}

// ---- packing with AVX-512 (the same bits as the scalar packing) ------------------------

#if MOE_BF16_X86
// bf16_in of 16 floats (the lanes of `mask`; 0.0 in the others), one per
// 32-bit lane, in its low half.
__attribute__((target("avx512f"))) static inline __m512i cvt16(const float *src, __mmask16 mask) {
  const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, src));
  const __m512i hi = _mm512_srli_epi32(u, 16);
  __m512i r = _mm512_add_epi32(
      u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(hi, _mm512_set1_epi32(1))));
  r = _mm512_srli_epi32(r, 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  const __mmask16 tiny = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_epi32(r, tiny, _mm512_and_si512(hi, _mm512_set1_epi32(0x8000)));
}

static inline __mmask16 first(int n) {
  return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

// Pairs of two float rows (even, odd; odd may be NULL: zeros) of n values,
// scaled by alpha, into n uint32 at dst.
__attribute__((target("avx512f"))) static void pairs_rows(uint32_t *dst, const float *even,
                                                          const float *odd, int n, float alpha) {
  const __m512 al = _mm512_set1_ps(alpha);
  for (int j = 0; j < n; j += 16) {
    const __mmask16 m = first(n - j);
    float te[16], to[16];
    _mm512_storeu_ps(te, _mm512_mul_ps(al, _mm512_maskz_loadu_ps(m, even + j)));
    _mm512_storeu_ps(
        to, odd ? _mm512_mul_ps(al, _mm512_maskz_loadu_ps(m, odd + j)) : _mm512_setzero_ps());
    const __m512i e = cvt16(te, m), o = cvt16(to, m);
    _mm512_mask_storeu_epi32(dst + j, m, _mm512_or_si512(e, _mm512_slli_epi32(o, 16)));
  }
}

// One float row of kc values (scaled by alpha) as kq = ceil(kc / 2) pairs, pair q
// to dst[q * stride].
__attribute__((target("avx512f"))) static void pairs_along(uint32_t *dst, size_t stride,
                                                           const float *row, int kc, float alpha) {
  const __m512 al = _mm512_set1_ps(alpha);
  for (int p = 0; p < kc; p += 32) {
    // 32 values: lanes 0..15 and 16..31, packed into 16 pairs
    float t0[16], t1[16];
    const int left = kc - p;  // values from p on
    const int n0 = left < 16 ? left : 16;
    const int n1 = left <= 16 ? 0 : left - 16 < 16 ? left - 16 : 16;
    _mm512_storeu_ps(t0, _mm512_mul_ps(al, _mm512_maskz_loadu_ps(first(n0), row + p)));
    _mm512_storeu_ps(t1, n1 > 0 ? _mm512_mul_ps(al, _mm512_maskz_loadu_ps(first(n1), row + p + 16))
                                : _mm512_setzero_ps());
    const __m256i h0 = _mm512_cvtepi32_epi16(cvt16(t0, 0xffff));
    const __m256i h1 = _mm512_cvtepi32_epi16(cvt16(t1, 0xffff));
    uint32_t w[16];
    _mm256_storeu_si256((__m256i *)w, h0);
    _mm256_storeu_si256((__m256i *)(w + 8), h1);
    const int nq = (n0 + n1 + 1) / 2;
    for (int q = 0; q < nq; q++) dst[(size_t)(p / 2 + q) * stride] = w[q];
  }
}

static void pack_b_vec(uint32_t *dst, const float *b, int ldb, int trans_b, int p0, int kc, int j0,
                       int nc, float alpha) {
  const int kq = (kc + 1) / 2;
  for (int jp = 0; jp < nc; jp += NR) {
    const int nr = nc - jp < NR ? nc - jp : NR;
    if (!trans_b) {
      for (int q = 0; q < kq; q++) {
        const float *even = b + (size_t)(p0 + 2 * q) * (size_t)ldb + (size_t)(j0 + jp);
        pairs_rows(dst + (size_t)q * NR, even, 2 * q + 1 < kc ? even + ldb : NULL, nr, alpha);
        for (int j = nr; j < NR; j++) dst[(size_t)q * NR + (size_t)j] = 0;
      }
    } else {
      for (int j = 0; j < nr; j++) {
        pairs_along(dst + j, NR, b + (size_t)(j0 + jp + j) * (size_t)ldb + (size_t)p0, kc, alpha);
      }
      for (int q = 0; q < kq && nr < NR; q++) {
        for (int j = nr; j < NR; j++) dst[(size_t)q * NR + (size_t)j] = 0;
      }
    }
    dst += (size_t)kq * NR;
  }
}

static void pack_a_vec(uint32_t *dst, const float *a, int lda, int trans_a, int i0, int mr, int p0,
                       int kc) {
  const int kq = (kc + 1) / 2;
  if (!trans_a) {
    for (int i = 0; i < mr; i++) {
      pairs_along(dst + i, MR, a + (size_t)(i0 + i) * (size_t)lda + (size_t)p0, kc, 1.0f);
    }
  } else {
    for (int q = 0; q < kq; q++) {
      const float *even = a + (size_t)(p0 + 2 * q) * (size_t)lda + (size_t)i0;
      pairs_rows(dst + (size_t)q * MR, even, 2 * q + 1 < kc ? even + lda : NULL, mr, 1.0f);
    }
  }
  for (int q = 0; q < kq && mr < MR; q++) {
    for (int i = mr; i < MR; i++) dst[(size_t)q * MR + (size_t)i] = 0;
  }
}
#else
static void pack_b_vec(uint32_t *dst, const float *b, int ldb, int trans_b, int p0, int kc, int j0,
                       int nc, float alpha) {
  pack_b(dst, b, ldb, trans_b, p0, kc, j0, nc, alpha, 0);
}
static void pack_a_vec(uint32_t *dst, const float *a, int lda, int trans_a, int i0, int mr, int p0,
                       int kc) {
  pack_a_strip(dst, a, lda, trans_a, i0, mr, p0, kc, 0);
}
#endif

// ---- driver ----------------------------------------------------------------------------

static void tile(const ukernel *kern, int kq, const uint32_t *ap, const uint32_t *bp, float *c,
                 int ldc, int mr, int nr, int zero) {
  if (mr == MR && nr == NR) {
    kern->fn(kq, ap, bp, c, ldc, zero);
    return;
  }
  float t[MR * NR];
  for (int i = 0; i < MR; i++) {
    for (int j = 0; j < NR; j++) {
      t[i * NR + j] = !zero && i < mr && j < nr ? c[(size_t)i * (size_t)ldc + (size_t)j] : 0.0f;
    }
  }
  kern->fn(kq, ap, bp, t, NR, zero);
  for (int i = 0; i < mr; i++) {
    for (int j = 0; j < nr; j++) c[(size_t)i * (size_t)ldc + (size_t)j] = t[i * NR + j];
  }
}

// The same chains one element at a time: when a thread's scratch cannot be
// allocated.
static void gemm_elementwise(int trans_a, int trans_b, int m, int n, int k, float alpha,
                             const float *a, int lda, const float *b, int ldb, float *c, int ldc) {
  for (int i = 0; i < m; i++) {
    for (int j = 0; j < n; j++) {
      float s = c[(size_t)i * (size_t)ldc + (size_t)j];
      for (int p = 0; p < k; p += 2) {
        float av[2] = {0.0f, 0.0f}, bv[2] = {0.0f, 0.0f};
        for (int h = 0; h < 2 && p + h < k; h++) {
          const size_t pp = (size_t)(p + h);
          av[h] = moe_bf16_to_float(
              bf16_in(trans_a ? a[pp * (size_t)lda + (size_t)i] : a[(size_t)i * (size_t)lda + pp]));
          bv[h] = moe_bf16_to_float(bf16_in(alpha * (trans_b ? b[(size_t)j * (size_t)ldb + pp]
                                                             : b[pp * (size_t)ldb + (size_t)j])));
        }
        s = flush(fmaf(av[0], bv[0], flush(fmaf(av[1], bv[1], flush(s)))));
      }
      c[(size_t)i * (size_t)ldc + (size_t)j] = s;
    }
  }
}

static void gemm_bf16_with(const ukernel *kern, int trans_a, int trans_b, int m, int n, int k,
                           float alpha, const float *a, int lda, const float *b, int ldb,
                           float beta, float *c, int ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == 0.0f || beta != 0.0f) moe_gemm_scale_c(c, m, n, ldc, beta);
  if (k <= 0 || alpha == 0.0f) return;
  uint32_t *bpack = scratch();
  if (!bpack) {
    if (beta == 0.0f) moe_gemm_scale_c(c, m, n, ldc, 0.0f);  // the chains start at 0
    gemm_elementwise(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc);
    return;
  }
  uint32_t *apack = bpack + BPACK;
  // the AVX-512 packing with the AVX512_BF16 kernel (the portable kernel
  // packs with scalar code, so the tests compare the two packings too)
  const int vec = kern->fn != ukernel_portable;
  for (int j0 = 0; j0 < n; j0 += NC) {
    const int nc = n - j0 < NC ? n - j0 : NC;
    for (int p0 = 0; p0 < k; p0 += KC) {
      const int kc = k - p0 < KC ? k - p0 : KC, kq = (kc + 1) / 2;
      const int zero = beta == 0.0f && p0 == 0;
      pack_b(bpack, b, ldb, trans_b, p0, kc, j0, nc, alpha, vec);
      for (int i0 = 0; i0 < m; i0 += MC) {
        const int mc = m - i0 < MC ? m - i0 : MC;
        for (int ir = 0; ir < mc; ir += MR) {
          const int mr = mc - ir < MR ? mc - ir : MR;
          pack_a_strip(apack + (size_t)ir * kq, a, lda, trans_a, i0 + ir, mr, p0, kc, vec);
        }
        for (int jp = 0; jp < nc; jp += NR) {
          const int nr = nc - jp < NR ? nc - jp : NR;
          const uint32_t *bp = bpack + (size_t)(jp / NR) * (size_t)kq * NR;
          for (int ir = 0; ir < mc; ir += MR) {
            const int mr = mc - ir < MR ? mc - ir : MR;
            float *ct = c + (size_t)(i0 + ir) * (size_t)ldc + (size_t)(j0 + jp);
            tile(kern, kq, apack + (size_t)ir * kq, bp, ct, ldc, mr, nr, zero);
          }
        }
      }
    }
  }
}

void moe_gemm_bf16(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                   int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  gemm_bf16_with(kernel(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void moe_gemm_bf16_portable(int trans_a, int trans_b, int m, int n, int k, float alpha,
                            const float *a, int lda, const float *b, int ldb, float beta, float *c,
                            int ldc) {
  gemm_bf16_with(&k_portable, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
