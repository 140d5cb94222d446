// moe_sample_logits against the distribution it must draw from: inverting
// the CDF at a fine grid of u gives every token with the frequency of its
// softmax(logits / temperature) probability over the kept tokens (within one
// grid step); top-k keeps exactly the k largest (ties at the k-th kept);
// top-1 is the argmax at any u.
#include <math.h>
#include <stdio.h>

#include "moe/model.h"
#include "testutil.h"

enum { V = 6, N = 200000 };

// Frequencies of each token over u = (i + 0.5) / N.
static void frequencies(const float *logits, double t, int k, double *freq) {
  double probs[V];
  for (int i = 0; i < V; i++) freq[i] = 0;
  for (int i = 0; i < N; i++) {
    const int tok = moe_sample_logits(logits, V, t, k, (i + 0.5) / N, probs);
    if (tok >= 0 && tok < V) freq[tok] += 1.0 / N;
  }
}

// softmax(logits / t) over the tokens whose logit is >= thresh.
static void reference(const float *logits, double t, double thresh, double *p) {
  double mx = -INFINITY, sum = 0;
  for (int i = 0; i < V; i++) mx = fmax(mx, logits[i]);
  for (int i = 0; i < V; i++) {
    p[i] = logits[i] >= thresh ? exp((logits[i] - mx) / t) : 0.0;
    sum += p[i];
  }
  for (int i = 0; i < V; i++) p[i] /= sum;
}

int main(void) {
  const float logits[V] = {0.5f, 2.0f, -1.0f, 1.0f, 2.0f, -3.0f};
  const double temps[3] = {0.3, 1.0, 2.5};
  double freq[V], ref[V];
  for (int ti = 0; ti < 3; ti++) {
    frequencies(logits, temps[ti], 0, freq);
    reference(logits, temps[ti], -INFINITY, ref);
    for (int i = 0; i < V; i++)
      TU_CHECK(fabs(freq[i] - ref[i]) <= 2.0 / N, "t=%g token %d: %.6f vs %.6f", temps[ti], i,
               freq[i], ref[i]);
  }
  // top-3: the two tied 2.0 logits and 1.0
  frequencies(logits, 1.0, 3, freq);
  reference(logits, 1.0, 1.0, ref);
  for (int i = 0; i < V; i++)
    TU_CHECK(fabs(freq[i] - ref[i]) <= 2.0 / N, "top-3 token %d: %.6f vs %.6f", i, freq[i], ref[i]);
  // top-1 with a tie at the top: both tied tokens kept, nothing else
  frequencies(logits, 1.0, 1, freq);
  TU_CHECK(fabs(freq[1] - 0.5) <= 2.0 / N && fabs(freq[4] - 0.5) <= 2.0 / N,
           "top-1 with a tie: %.4f %.4f", freq[1], freq[4]);
  const float single[V] = {0, 0, 3, 0, 0, 0};
  double probs[V];
  for (int i = 0; i < 100; i++)
    TU_CHECK(moe_sample_logits(single, V, 0.7, 1, i / 100.0, probs) == 2, "top-1 argmax");
  // k >= V is every token
  frequencies(logits, 1.0, V, freq);
  reference(logits, 1.0, -INFINITY, ref);
  TU_CHECK(fabs(freq[5] - ref[5]) <= 2.0 / N && freq[5] > 0, "k = V keeps all");
  return tu_finish("test_sample");
}
