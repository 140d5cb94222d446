// Sampling from MoE-GPT (moe_sample_logits, moe_gpt_generate): temperature
// and top-k over the last position's logits, one token at a time. The whole
// forward is recomputed for every token over the last S tokens (the simple
// reference; the inference engine, src/infer/, decodes with a KV cache and
// batches many sequences). `moe sample` prints what this generates.
#include <math.h>
#include <stdlib.h>

#include "moe/model.h"

int moe_sample_logits(const float *logits, int v, double temperature, int top_k, double u,
                      double *probs) {
  double mx = -INFINITY;
  for (int i = 0; i < v; i++) mx = logits[i] > mx ? logits[i] : mx;
  // The k-th largest logit is the threshold (ties at it are kept).
  double thresh = -INFINITY;
  if (top_k > 0 && top_k < v) {
    for (int i = 0; i < v; i++) probs[i] = logits[i];
    for (int k = 0; k < top_k; k++) {  // partial selection: k passes of a max search
      int best = -1;
      for (int i = 0; i < v; i++)
        if (probs[i] > -INFINITY && (best < 0 || probs[i] > probs[best])) best = i;
      thresh = probs[best];
      probs[best] = -INFINITY;
    }
  }
  double sum = 0;
  for (int i = 0; i < v; i++) {
    probs[i] = logits[i] >= thresh ? exp((logits[i] - mx) / temperature) : 0.0;
    sum += probs[i];
  }
  double acc = 0, target = u * sum;
  int last = 0;
  for (int i = 0; i < v; i++) {
    if (probs[i] <= 0) continue;
    last = i;
    acc += probs[i];
    if (acc > target) return i;
  }
  return last;
}

void moe_sample_config_default(moe_sample_config *sc) {
  sc->temperature = 0.8;
  sc->top_k = 40;
  sc->seed = 1;
}

moe_status moe_gpt_generate(moe_ctx *ctx, moe_gpt *model, int32_t *tokens, size_t *n, int max_new,
                            const moe_sample_config *sc, void (*on_token)(void *user, int token),
                            void *user) {
  moe_status st = MOE_STATUS_OK;
  const moe_gpt_config *cfg = moe_gpt_get_config(model);
  const int s_max = cfg->seq_len, v = cfg->vocab_size;
  double *probs = NULL;
  MOE_FAIL_IF(ctx, !tokens || !n || *n == 0 || max_new < 0 || !sc || !(sc->temperature > 0),
              MOE_STATUS_INVALID_ARG,
              "generate: a non-empty context, max_new >= 0 (%d) and temperature > 0 are needed",
              max_new);
  probs = moe_malloc((size_t)v * sizeof *probs);
  MOE_FAIL_IF(ctx, !probs, MOE_STATUS_OUT_OF_MEMORY, "generate: out of memory");
  moe_rng rng;
  moe_rng_init(&rng, sc->seed, 0);
  for (int g = 0; g < max_new; g++) {
    const int s = (int)(*n < (size_t)s_max ? *n : (size_t)s_max);
    moe_gpt_loss l;
    MOE_TRY(moe_gpt_forward(model, tokens + (*n - (size_t)s), NULL, 1, s, 0, &l));
    const float *logits = moe_gpt_logits(model) + (size_t)(s - 1) * v;
    const int next =
        moe_sample_logits(logits, v, sc->temperature, sc->top_k, moe_rng_uniform(&rng), probs);
    tokens[(*n)++] = next;
    if (on_token) on_token(user, next);
  }
done:
  moe_free(probs);
  return st;
}
