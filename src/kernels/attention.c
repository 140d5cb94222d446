// Causal multi-head self-attention core (forward, backward, naive reference) for
// MoE-GPT: the part between the qkv projection and the output projection.
// Per batch row b and head h, with Q, K, V the (S, hd) slices of the packed qkv:
//   att = softmax_row(mask(Q K^T / sqrt(hd)))     (S, S), entries u > t masked out
//   out = att V                                     (S, hd)
// and the backward:
//   datt = dout V^T;  ds = att * (datt - rowsum(datt * att))
//   dQ += ds K / sqrt(hd);  dK += ds^T Q / sqrt(hd);  dV += att^T dout.
//
// How (per (b, h)): the rows are cut into tiles of ATT_TILE; row tile
// [i0, i1) only needs columns [0, i1) (everything right of the diagonal tile is
// masked), so each GEMM works on a (tile x i1) or (i1-rows x tile) block instead
// of the full S x S square. With S = 128 and tiles of 32 this computes 62.5% of
// the square instead of 100% (the exact triangle is 50.4%); smaller tiles skip
// more but cost more, smaller BLAS calls. dK and dV are column tiles: column
// tile [j0, j1) gets contributions from rows [j0, S) only. All GEMMs read the
// packed qkv and write dqkv in place through leading dimensions (3d, d), so
// nothing is copied. The softmax and its backward are lane-split row loops with
// the exp of fastmath.h (~1 ulp), as in softmax.c, compiled once per
// instruction set (below).
//
// Precision: the per-head GEMMs are fp32 whatever moe_gemm's precision
// (moe_gemm_fp32). They are small (a tile of 32 rows by hd or S), where the
// bf16 kernel's rounding and packing of both operands cost more than its
// faster products save (measured: 0.13x-0.6x of fp32 at 32 x 32 x 128).
// Cost per (b, h): 2 GEMMs forward and 4 backward of 2 S^2 hd flops each
// unmasked (62.5% of that with the tiles at S = 128), plus O(S^2) row work
// (S^2/2 exps forward).
//
// Not here: dropout, attention bias or padding masks, KV caches, flash-style
// (recompute, no att) variants, threading over (b, h) (BLAS threads only).
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/fastmath.h"
#include "kernels/kernels_internal.h"
#include "moe/kernels.h"

// Row/column tile of the blocked causal GEMMs (see the header comment). 32 and
// 64 measured best (within noise of each other) at S = 64..256, hd = 32 on
// SkylakeX OpenBLAS; 16 loses to the smaller BLAS calls, S (no blocking) to the
// computed upper triangle.
#define ATT_TILE 32

// Lanes of the row reductions: one AVX-512 register, two AVX2, four SSE2.
#define ATT_LANES 16

#if defined(__GNUC__) || defined(__clang__)
#define ATT_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define ATT_ALWAYS_INLINE inline
#endif

// ---- row kernels (inlined into one copy per instruction set) ------------------------------

// The rows are short (t + 1 <= S entries, 64 on average at S = 128), so the
// per-row overhead matters as much as the per-entry work: the reductions fold
// their lanes as a tree (log2 steps, vectorized) rather than one after the
// other, and every loop runs over t + 1 rounded up to ATT_LANES (padding
// entries are made neutral) so that no entry goes through a scalar tail.

// exp(z) for z <= 0, flushed to 0 below -87.3 (so -inf -> 0), as softmax.c.
static ATT_ALWAYS_INLINE float att_exp_nonpos(float z) {
  const uint32_t keep = 0u - (uint32_t) !(z < -87.3f);
  return fm_bits_and(fm_exp_split(z, -0.0f), keep);
}

static ATT_ALWAYS_INLINE float att_fold_max(float *lane) {
  for (int w = ATT_LANES / 2; w > 0; w /= 2) {
    for (int l = 0; l < w; l++) lane[l] = lane[l + w] > lane[l] ? lane[l + w] : lane[l];
  }
  return lane[0];
}

static ATT_ALWAYS_INLINE float att_fold_sum(float *lane) {
  for (int w = ATT_LANES / 2; w > 0; w /= 2) {
    for (int l = 0; l < w; l++) lane[l] += lane[l + w];
  }
  return lane[0];
}

// n rounded up to a multiple of ATT_LANES, at most cap.
static ATT_ALWAYS_INLINE int att_round_up(int n, int cap) {
  const int r = (n + ATT_LANES - 1) / ATT_LANES * ATT_LANES;
  return r < cap ? r : cap;
}

// Largest entry of x (n).
static ATT_ALWAYS_INLINE float att_row_max(const float *restrict x, int n) {
  float lane[ATT_LANES];
  for (int l = 0; l < ATT_LANES; l++) lane[l] = -INFINITY;
  int j = 0;
  for (; j + ATT_LANES <= n; j += ATT_LANES) {
    for (int l = 0; l < ATT_LANES; l++) lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
  }
  for (int l = 0; j + l < n; l++) lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
  return att_fold_max(lane);
}

// x (n) = exp(x - m) in place; returns the sum.
static ATT_ALWAYS_INLINE float att_exp_sum(float *restrict x, int n, float m) {
  float lane[ATT_LANES] = {0};
  int j = 0;
  for (; j + ATT_LANES <= n; j += ATT_LANES) {
    for (int l = 0; l < ATT_LANES; l++) {
      const float e = att_exp_nonpos(x[j + l] - m);
      x[j + l] = e;
      lane[l] += e;
    }
  }
  for (int l = 0; j + l < n; l++) {
    const float e = att_exp_nonpos(x[j + l] - m);
    x[j + l] = e;
    lane[l] += e;
  }
  return att_fold_sum(lane);
}

// sum_j a_j b_j over a, b (n).
static ATT_ALWAYS_INLINE float att_row_dot(const float *restrict a, const float *restrict b,
                                           int n) {
  float lane[ATT_LANES] = {0};
  int j = 0;
  for (; j + ATT_LANES <= n; j += ATT_LANES) {
    for (int l = 0; l < ATT_LANES; l++) lane[l] += a[j + l] * b[j + l];
  }
  for (int l = 0; j + l < n; l++) lane[l] += a[j + l] * b[j + l];
  return att_fold_sum(lane);
}

// Rows [i0, i1) of one (S, S) att block a, holding the scaled scores in
// columns [0, i1): row t becomes the softmax over [0, t], zeros in (t, S).
// Padding (t, n) is set to -inf, which the max ignores and exp turns into 0.
static ATT_ALWAYS_INLINE void att_softmax_rows(float *restrict a, int i0, int i1, int s) {
  for (int t = i0; t < i1; t++) {
    float *restrict row = a + (size_t)t * (size_t)s;
    const int n = att_round_up(t + 1, s);
    for (int u = t + 1; u < n; u++) row[u] = -INFINITY;
    const float m = att_row_max(row, n);
    // The sum is >= 1 (the max contributes exp(0)) for finite scores.
    const float inv = 1.0f / att_exp_sum(row, n, m);
    for (int u = 0; u < n; u++) row[u] *= inv;
    for (int u = n; u < s; u++) row[u] = 0.0f;
  }
}

// Rows [i0, i1) of the softmax backward: ds (holding datt in columns [0, i1))
// becomes att * (datt - rowsum(datt * att)) in [0, t] and 0 in (t, i1). The
// padding (t, n) needs nothing: att is 0 there, so its products are 0 (finite
// datt).
static ATT_ALWAYS_INLINE void att_softmax_back_rows(float *restrict ds, const float *restrict a,
                                                    int i0, int i1, int s) {
  for (int t = i0; t < i1; t++) {
    float *restrict r = ds + (size_t)t * (size_t)s;
    const float *restrict ar = a + (size_t)t * (size_t)s;
    const int n = att_round_up(t + 1, i1);
    const float dot = att_row_dot(r, ar, n);
    for (int u = 0; u < n; u++) r[u] = ar[u] * (r[u] - dot);
    for (int u = n; u < i1; u++) r[u] = 0.0f;
  }
}

// ---- per-instruction-set copies ------------------------------------------------------------

// The library is built for baseline x86-64 (SSE2); the exp-heavy softmax rows
// are ~40% of the forward there, so on x86-64 with GCC or clang AVX2+FMA and
// AVX-512 copies of the two row loops are compiled too and picked at run time,
// with the same CPU test as GELU (moe_gelu_isa_mask, kernels/kernels_internal.h).
// Copies may differ in the last bit where a*b+c is contracted into an FMA.
typedef struct {
  void (*softmax)(float *a, int i0, int i1, int s);
  void (*softmax_back)(float *ds, const float *a, int i0, int i1, int s);
} att_row_ops;

#define ATT_ISA_COPY(suffix, attr)                                                               \
  attr static void att_softmax_##suffix(float *a, int i0, int i1, int s) {                       \
    att_softmax_rows(a, i0, i1, s);                                                              \
  }                                                                                              \
  attr static void att_softmax_back_##suffix(float *ds, const float *a, int i0, int i1, int s) { \
    att_softmax_back_rows(ds, a, i0, i1, s);                                                     \
  }

ATT_ISA_COPY(base, )
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATT_X86_DISPATCH 1
ATT_ISA_COPY(avx2, __attribute__((target("avx2,fma"))))
ATT_ISA_COPY(avx512, __attribute__((target("avx512f,avx2,fma"))))
#else
#define ATT_X86_DISPATCH 0
#endif

// The row loops for `isa` (a MOE_GELU_ISA_x the caller checked is supported).
static att_row_ops att_ops_for(int isa) {
#if ATT_X86_DISPATCH
  if (isa == MOE_GELU_ISA_AVX512) return (att_row_ops){att_softmax_avx512, att_softmax_back_avx512};
  if (isa == MOE_GELU_ISA_AVX2) return (att_row_ops){att_softmax_avx2, att_softmax_back_avx2};
#endif
  (void)isa;
  return (att_row_ops){att_softmax_base, att_softmax_back_base};
}

// The widest copy this CPU supports.
static att_row_ops att_ops_best(void) {
  const unsigned mask = moe_gelu_isa_mask();
  return att_ops_for((mask >> MOE_GELU_ISA_AVX512) & 1u ? MOE_GELU_ISA_AVX512
                     : (mask >> MOE_GELU_ISA_AVX2) & 1u ? MOE_GELU_ISA_AVX2
                                                        : MOE_GELU_ISA_BASE);
}

// ---- forward ----------------------------------------------------------------------

// out is (B, S, d), att is (B, NH, S, S), qkv is (B, S, 3d); d = nh * hd.
static void att_forward(att_row_ops ops, float *out, float *att, const float *qkv, int b, int s,
                        int nh, int hd) {
  if (b <= 0 || s <= 0 || nh <= 0 || hd <= 0) return;
  const int d = nh * hd, ld = 3 * d;
  const float scale = 1.0f / sqrtf((float)hd);
  for (int bi = 0; bi < b; bi++) {
    const float *qkv_b = qkv + (size_t)bi * (size_t)s * (size_t)ld;
    float *out_b = out + (size_t)bi * (size_t)s * (size_t)d;
    for (int h = 0; h < nh; h++) {
      const float *q = qkv_b + (size_t)h * (size_t)hd;
      const float *k = q + d;
      const float *v = q + 2 * d;
      float *a = att + ((size_t)bi * (size_t)nh + (size_t)h) * (size_t)s * (size_t)s;
      float *o = out_b + (size_t)h * (size_t)hd;
      for (int i0 = 0; i0 < s; i0 += ATT_TILE) {
        const int i1 = i0 + ATT_TILE < s ? i0 + ATT_TILE : s;
        const int m = i1 - i0;
        float *arows = a + (size_t)i0 * (size_t)s;
        // step 1: scores[i0:i1, 0:i1] = Q[i0:i1] K[0:i1]^T / sqrt(hd)
        moe_gemm_fp32(0, 1, m, i1, hd, scale, q + (size_t)i0 * (size_t)ld, ld, k, ld, 0.0f, arows,
                      s);
        // step 2: masked row softmax; zeros right of the diagonal
        ops.softmax(a, i0, i1, s);
        // step 3: out[i0:i1] = att[i0:i1, 0:i1] V[0:i1]
        moe_gemm_fp32(0, 0, m, hd, i1, 1.0f, arows, s, v, ld, 0.0f, o + (size_t)i0 * (size_t)d, d);
      }
    }
  }
}

void moe_attention_forward(float *out, float *att, const float *qkv, int b, int s, int nh, int hd) {
  att_forward(att_ops_best(), out, att, qkv, b, s, nh, hd);
}

// ---- backward -----------------------------------------------------------------------

size_t moe_attention_scratch_floats(int b, int s, int nh, int hd) {
  (void)b;
  (void)nh;
  (void)hd;
  // One (S, S) block, reused for every (b, h): datt, then ds in place.
  return s > 0 ? (size_t)s * (size_t)s : 0;
}

// dqkv is (B, S, 3d) (accumulated), scratch holds moe_attention_scratch_floats,
// dout is (B, S, d), att is (B, NH, S, S), qkv is (B, S, 3d).
static void att_backward(att_row_ops ops, float *dqkv, float *scratch, const float *dout,
                         const float *att, const float *qkv, int b, int s, int nh, int hd) {
  if (b <= 0 || s <= 0 || nh <= 0 || hd <= 0) return;
  const int d = nh * hd, ld = 3 * d;
  const float scale = 1.0f / sqrtf((float)hd);
  float *ds = scratch;  // (S, S): datt, then ds, rows [i0, i1) x columns [0, i1) per tile
  for (int bi = 0; bi < b; bi++) {
    const size_t boff = (size_t)bi * (size_t)s * (size_t)ld;
    const float *dout_b = dout + (size_t)bi * (size_t)s * (size_t)d;
    for (int h = 0; h < nh; h++) {
      const float *q = qkv + boff + (size_t)h * (size_t)hd;
      const float *k = q + d;
      const float *v = q + 2 * d;
      float *dq = dqkv + boff + (size_t)h * (size_t)hd;
      float *dk = dq + d;
      float *dv = dq + 2 * d;
      const float *dout_h = dout_b + (size_t)h * (size_t)hd;
      const float *a = att + ((size_t)bi * (size_t)nh + (size_t)h) * (size_t)s * (size_t)s;
      for (int i0 = 0; i0 < s; i0 += ATT_TILE) {
        const int i1 = i0 + ATT_TILE < s ? i0 + ATT_TILE : s;
        const int m = i1 - i0;
        float *dsrows = ds + (size_t)i0 * (size_t)s;
        // step 1: datt[i0:i1, 0:i1] = dout[i0:i1] V[0:i1]^T
        moe_gemm_fp32(0, 1, m, i1, hd, 1.0f, dout_h + (size_t)i0 * (size_t)d, d, v, ld, 0.0f,
                      dsrows, s);
        // step 2: ds = att * (datt - rowsum(datt * att)) over u <= t, 0 in (t, i1)
        ops.softmax_back(ds, a, i0, i1, s);
        // step 3: dQ[i0:i1] += ds[i0:i1, 0:i1] K[0:i1] / sqrt(hd)
        moe_gemm_fp32(0, 0, m, hd, i1, scale, dsrows, s, k, ld, 1.0f, dq + (size_t)i0 * (size_t)ld,
                      ld);
      }
      // Column tiles: ds[t, j0:j1] and att[t, j0:j1] are zero (or unwritten and
      // unused) for t < j0, so rows [j0, S) carry every contribution.
      for (int j0 = 0; j0 < s; j0 += ATT_TILE) {
        const int j1 = j0 + ATT_TILE < s ? j0 + ATT_TILE : s;
        const int n = j1 - j0, kk = s - j0;
        const size_t off = (size_t)j0 * (size_t)s + (size_t)j0;
        // step 4: dK[j0:j1] += ds[j0:S, j0:j1]^T Q[j0:S] / sqrt(hd)
        moe_gemm_fp32(1, 0, n, hd, kk, scale, ds + off, s, q + (size_t)j0 * (size_t)ld, ld, 1.0f,
                      dk + (size_t)j0 * (size_t)ld, ld);
        // step 5: dV[j0:j1] += att[j0:S, j0:j1]^T dout[j0:S]
        moe_gemm_fp32(1, 0, n, hd, kk, 1.0f, a + off, s, dout_h + (size_t)j0 * (size_t)d, d, 1.0f,
                      dv + (size_t)j0 * (size_t)ld, ld);
      }
    }
  }
}

void moe_attention_backward(float *dqkv, float *scratch, const float *dout, const float *att,
                            const float *qkv, int b, int s, int nh, int hd) {
  att_backward(att_ops_best(), dqkv, scratch, dout, att, qkv, b, s, nh, hd);
}

// ---- test hooks ------------------------------------------------------------------------

// The public forward / backward run on the copy for `isa` (MOE_GELU_ISA_x);
// -1, touching nothing, when the CPU or build lacks it. For test_attention,
// which declares them itself (not in a header: see its comment).
int moe_attention_forward_isa(int isa, float *out, float *att, const float *qkv, int b, int s,
                              int nh, int hd);
int moe_attention_backward_isa(int isa, float *dqkv, float *scratch, const float *dout,
                               const float *att, const float *qkv, int b, int s, int nh, int hd);

int moe_attention_forward_isa(int isa, float *out, float *att, const float *qkv, int b, int s,
                              int nh, int hd) {
  if (isa < 0 || isa >= MOE_GELU_ISA_COUNT || !((moe_gelu_isa_mask() >> isa) & 1u)) return -1;
  att_forward(att_ops_for(isa), out, att, qkv, b, s, nh, hd);
  return 0;
}

int moe_attention_backward_isa(int isa, float *dqkv, float *scratch, const float *dout,
                               const float *att, const float *qkv, int b, int s, int nh, int hd) {
  if (isa < 0 || isa >= MOE_GELU_ISA_COUNT || !((moe_gelu_isa_mask() >> isa) & 1u)) return -1;
  att_backward(att_ops_for(isa), dqkv, scratch, dout, att, qkv, b, s, nh, hd);
  return 0;
}

// ---- reference -----------------------------------------------------------------------

// q.k / sqrt(hd) for rows t and u of one (b, h), in double.
static double att_score_ref(const float *q, const float *k, int t, int u, int ld, int hd,
                            double scale) {
  double acc = 0.0;
  for (int i = 0; i < hd; i++) {
    acc += (double)q[(size_t)t * (size_t)ld + (size_t)i] *
           (double)k[(size_t)u * (size_t)ld + (size_t)i];
  }
  return acc * scale;
}

// Naive loops in double; the scores are recomputed where needed (max, sum,
// output) so nothing is stored at reduced precision and nothing is allocated:
// the output columns are accumulated in chunks of REF_CHUNK doubles on the stack.
#define REF_CHUNK 64

void moe_attention_forward_ref(float *out, float *att, const float *qkv, int b, int s, int nh,
                               int hd) {
  if (b <= 0 || s <= 0 || nh <= 0 || hd <= 0) return;
  const int d = nh * hd, ld = 3 * d;
  const double scale = 1.0 / sqrt((double)hd);
  for (int bi = 0; bi < b; bi++) {
    for (int h = 0; h < nh; h++) {
      const float *q = qkv + (size_t)bi * (size_t)s * (size_t)ld + (size_t)h * (size_t)hd;
      const float *k = q + d;
      const float *v = q + 2 * d;
      float *a = att + ((size_t)bi * (size_t)nh + (size_t)h) * (size_t)s * (size_t)s;
      float *o = out + (size_t)bi * (size_t)s * (size_t)d + (size_t)h * (size_t)hd;
      for (int t = 0; t < s; t++) {
        double mx = -INFINITY, sum = 0.0;
        for (int u = 0; u <= t; u++) mx = fmax(mx, att_score_ref(q, k, t, u, ld, hd, scale));
        for (int u = 0; u <= t; u++) sum += exp(att_score_ref(q, k, t, u, ld, hd, scale) - mx);
        float *arow = a + (size_t)t * (size_t)s;
        for (int u = 0; u < s; u++) arow[u] = 0.0f;
        for (int c0 = 0; c0 < hd; c0 += REF_CHUNK) {
          const int c1 = c0 + REF_CHUNK < hd ? c0 + REF_CHUNK : hd;
          double acc[REF_CHUNK] = {0};
          for (int u = 0; u <= t; u++) {
            const double p = exp(att_score_ref(q, k, t, u, ld, hd, scale) - mx) / sum;
            arow[u] = (float)p;
            for (int i = c0; i < c1; i++)
              acc[i - c0] += p * (double)v[(size_t)u * (size_t)ld + (size_t)i];
          }
          for (int i = c0; i < c1; i++) o[(size_t)t * (size_t)d + (size_t)i] = (float)acc[i - c0];
        }
      }
    }
  }
}
