// Row-wise top-k selection for the MoE router: for each token, the k best
// experts (values and indices, descending), and the backward scatter of the
// gradient on the selected values.
//
// The order is total and deterministic so that every rank routes a token to
// the same experts: larger value first, equal values by lower index, and NaN
// after every number (NaNs among themselves by lower index), so a NaN can be
// chosen only when fewer than k numbers exist. -0 and +0 count as equal.
//
// The forward keeps a sorted list of the k best seen so far and inserts each
// new entry by shifting: O(d k) worst case, with d = E and k = K both small
// (E <= a few hundred, K <= 8), which beats a heap or a partial sort here.
// Not here: a heap/partial-sort path for large k, or any sorting of whole rows.
#include <stddef.h>
#include <stdint.h>

#include "moe/kernels.h"

// Does value a (index ia) rank before value b (index ib)? Total order as above.
static int ranks_before(float a, int32_t ia, float b, int32_t ib) {
  const int a_nan = a != a, b_nan = b != b;
  if (a_nan != b_nan) return b_nan;  // a number beats NaN
  if (!a_nan && a != b) return a > b;
  return ia < ib;  // equal values, or both NaN
}

// idx, val are (n, k); x is (n, d).
void moe_topk_forward(int32_t *idx, float *val, const float *x, int n, int d, int k) {
  if (k <= 0) return;  // outside the contract; avoids reading slot k - 1 = -1
  for (int i = 0; i < n; i++) {
    const float *xr = x + (size_t)i * (size_t)d;
    int32_t *ir = idx + (size_t)i * (size_t)k;
    float *vr = val + (size_t)i * (size_t)k;
    int filled = 0;
    for (int32_t j = 0; j < d; j++) {
      const float v = xr[j];
      // Entries arrive in increasing index order, so a later entry never wins a
      // tie against one already in the list: strict comparisons suffice.
      if (filled == k && !ranks_before(v, j, vr[k - 1], ir[k - 1])) continue;
      int pos = filled < k ? filled++ : k - 1;
      while (pos > 0 && ranks_before(v, j, vr[pos - 1], ir[pos - 1])) {
        vr[pos] = vr[pos - 1];
        ir[pos] = ir[pos - 1];
        pos--;
      }
      vr[pos] = v;
      ir[pos] = j;
    }
  }
}

// dx is (n, d), dval and idx are (n, k).
void moe_topk_backward(float *dx, const float *dval, const int32_t *idx, int n, int d, int k) {
  for (int i = 0; i < n; i++) {
    float *dxr = dx + (size_t)i * (size_t)d;
    for (int s = 0; s < k; s++) {
      const size_t o = (size_t)i * (size_t)k + (size_t)s;
      dxr[idx[o]] += dval[o];
    }
  }
}

// Selection by repeated full scans: slot s takes the best entry not yet taken,
// comparing with the same rules written out directly.
void moe_topk_forward_ref(int32_t *idx, float *val, const float *x, int n, int d, int k) {
  for (int i = 0; i < n; i++) {
    const float *xr = x + (size_t)i * (size_t)d;
    for (int s = 0; s < k; s++) {
      int32_t best = -1;
      for (int32_t j = 0; j < d; j++) {
        int taken = 0;
        for (int t = 0; t < s; t++) taken |= idx[(size_t)i * (size_t)k + (size_t)t] == j;
        if (taken) continue;
        if (best < 0) {
          best = j;
          continue;
        }
        const float v = xr[j], b = xr[best];
        // j > best always, so j wins only with a strictly larger number or by
        // being a number where best is NaN.
        if ((v == v && b != b) || v > b) best = j;
      }
      idx[(size_t)i * (size_t)k + (size_t)s] = best;
      val[(size_t)i * (size_t)k + (size_t)s] = xr[best];
    }
  }
}
