// Mean cross-entropy of row logits against integer targets, with ignored rows
// (target -1), for the language-model head and classification tests.
//
// The loss of a row is (max - logits[target]) + log sum_j exp(logits_j - max),
// not -log(softmax[target]) (a poorly predicted target's probability
// underflows to 0 in float, and its log to -inf), and not the float
// logsumexp minus the logit either: with logits ~1e4 the float logsumexp is
// only good to ~5e-4 absolute, while max - logit is exact. The softmax is
// written to `probs` separately, for the backward pass.
//
// A target outside [0, V) other than -1 is a caller bug; kernels cannot fail,
// so such rows are treated as ignored (never read out of bounds) by both
// forward and backward.
//
// The row sums use libm's expf (not vectorized): cross-entropy is not on the
// MoE layer's hot path; the softmax into `probs` is the vectorized kernel.
//
// Not here: label smoothing, class weights, or a z-loss term.
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "moe/kernels.h"

static int target_valid(int32_t t, int v) { return t >= 0 && t < v; }

// -log softmax(row)[t] for row (v), in double from the float logits.
static double row_loss(const float *row, int v, int32_t t) {
  float m = -INFINITY;
  for (int j = 0; j < v; j++) m = row[j] > m ? row[j] : m;
  double s = 0.0;
  for (int j = 0; j < v; j++) s += expf(row[j] - m);
  return ((double)m - (double)row[t]) + log(s);
}

// probs (n, v) or NULL, logits (n, v), targets (n).
float moe_cross_entropy_forward(float *probs, const float *logits, const int32_t *targets, int n,
                                int v) {
  double total = 0.0;  // summed in double: n can be large and the mean is reported
  int valid = 0;
  for (int i = 0; i < n; i++) {
    const size_t off = (size_t)i * (size_t)v;
    if (probs) moe_softmax_forward(probs + off, logits + off, 1, v);
    const int32_t t = targets[i];
    if (!target_valid(t, v)) continue;
    total += row_loss(logits + off, v, t);
    valid++;
  }
  return valid ? (float)(total / valid) : 0.0f;
}

// dlogits, probs are (n, v); targets (n). Ignored rows get no gradient.
void moe_cross_entropy_backward(float *dlogits, const float *probs, const int32_t *targets, int n,
                                int v, float dloss) {
  int valid = 0;
  for (int i = 0; i < n; i++) valid += target_valid(targets[i], v);
  if (valid == 0) return;
  const float scale = dloss / (float)valid;
  for (int i = 0; i < n; i++) {
    const int32_t t = targets[i];
    if (!target_valid(t, v)) continue;
    const size_t off = (size_t)i * (size_t)v;
    float *restrict dl = dlogits + off;
    const float *restrict p = probs + off;
    for (int j = 0; j < v; j++) dl[j] += scale * p[j];
    dl[t] -= scale;
  }
}

// Each row's log-sum-exp and the mean in double.
float moe_cross_entropy_forward_ref(const float *logits, const int32_t *targets, int n, int v) {
  double total = 0.0;
  int valid = 0;
  for (int i = 0; i < n; i++) {
    const int32_t t = targets[i];
    if (!target_valid(t, v)) continue;
    const float *row = logits + (size_t)i * (size_t)v;
    double m = -INFINITY, s = 0.0;
    for (int j = 0; j < v; j++) m = row[j] > m ? row[j] : m;
    for (int j = 0; j < v; j++) s += exp((double)row[j] - m);
    total += m + log(s) - (double)row[t];
    valid++;
  }
  return valid ? (float)(total / valid) : 0.0f;
}
