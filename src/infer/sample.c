// The engine's token sampler (moe_infer_sample): greedy, temperature, top-k
// and top-p (nucleus) over one row of logits, as the OpenAI-style request
// parameters ask. The candidates are sorted by logit (then index), so every
// cut (top-k with its ties, top-p's prefix) is a prefix of one order and the
// draw inverts the cumulative mass along that order: the same u gives the
// same token on every machine.
#include <math.h>

#include "moe/infer_request.h"

// order[lo, hi) sorted by logits descending, then index ascending (stable
// merge sort through tmp).
static void sort_desc(int *order, int *tmp, int n, const float *logits) {
  for (int w = 1; w < n; w *= 2) {
    for (int lo = 0; lo < n; lo += 2 * w) {
      int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
      int a = lo, b = mid, o = lo;
      while (a < mid && b < hi) {
        const float la = logits[order[a]], lb = logits[order[b]];
        tmp[o++] = (lb > la || (lb == la && order[b] < order[a])) ? order[b++] : order[a++];
      }
      while (a < mid) tmp[o++] = order[a++];
      while (b < hi) tmp[o++] = order[b++];
    }
    for (int i = 0; i < n; i++) order[i] = tmp[i];
  }
}

int moe_infer_sample(const float *logits, int v, double temperature, int top_k, double top_p,
                     double u, double *scratch, int *order) {
  if (v <= 0) return 0;
  if (!(temperature > 0)) {  // greedy: the first of the largest
    int best = 0;
    for (int i = 1; i < v; i++)
      if (logits[i] > logits[best]) best = i;
    return best;
  }
  double *prob = scratch;
  int *tmp = (int *)(scratch + v);
  for (int i = 0; i < v; i++) order[i] = i;
  sort_desc(order, tmp, v, logits);
  int keep = v;
  if (top_k > 0 && top_k < v) {  // the k largest and any tie with the k-th
    keep = top_k;
    while (keep < v && logits[order[keep]] == logits[order[keep - 1]]) keep++;
  }
  const double mx = logits[order[0]];
  double sum = 0;
  for (int j = 0; j < keep; j++) {
    prob[j] = exp(((double)logits[order[j]] - mx) / temperature);
    sum += prob[j];
  }
  if (top_p < 1.0) {  // the smallest prefix whose mass reaches top_p
    double acc = 0;
    int j = 0;
    while (j < keep) {
      acc += prob[j++];
      if (acc >= top_p * sum) break;
    }
    keep = j;
    sum = acc;
  }
  const double target = u * sum;
  double acc = 0;
  for (int j = 0; j < keep; j++) {
    acc += prob[j];
    if (acc > target) return order[j];
  }
  return order[keep - 1];
}
