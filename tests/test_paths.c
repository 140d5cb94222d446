// Lina's expert paths (include/moe/paths.h): the profile's counts and
// estimate on hand-worked cases; the estimation accuracy on a synthetic model
// with a known path structure equals the known value; the cap on paths and
// its fallback to the marginal; merging equals adding everything to one
// profile; JSON round trip and every refusal of a malformed profile.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe/moe.h"
#include "testutil.h"

static moe_ctx *ctx;

static uint64_t g_lcg = 1;
static uint32_t rnd(void) {
  g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(g_lcg >> 33);
}

static moe_path_profile *make(int nb, int E, int K, int l, int m) {
  const moe_path_config c = {nb, E, K, l, m};
  moe_path_profile *p = NULL;
  TU_CHECK(moe_path_profile_create(ctx, &c, &p) == MOE_STATUS_OK, "create: %s", moe_ctx_error(ctx));
  return p;
}

// Block 1 chooses (block 0's first choice + 1) % E, K = 1, l = 1: each path
// predicts one expert; the estimate of a batch is its exact count.
static void test_hand(void) {
  enum { E = 4, T = 6 };
  moe_path_profile *p = make(2, E, 1, 1, 16);
  if (!p) return;
  int32_t b0[T] = {0, 1, 1, 2, 3, 3}, b1[T];
  for (int t = 0; t < T; t++) b1[t] = (b0[t] + 1) % E;
  const int32_t *ch[2] = {b0, b1};
  TU_CHECK(moe_path_profile_add(p, ch, T) == MOE_STATUS_OK, "add");
  double pop[E];
  int known = -1;
  // a new batch: paths 3, 3, 0 -> experts 0, 0, 1
  int32_t n0[3] = {3, 3, 0};
  const int32_t *nch[1] = {n0};
  TU_CHECK(moe_path_profile_estimate(p, 1, nch, 3, pop, &known) == MOE_STATUS_OK && known == 3,
           "estimate block 1 (known %d)", known);
  TU_CHECK(pop[0] == 2.0 && pop[1] == 1.0 && pop[2] == 0.0 && pop[3] == 0.0,
           "hand estimate %g %g %g %g", pop[0], pop[1], pop[2], pop[3]);
  // block 0: the empty path for every token: its marginal x tokens
  TU_CHECK(moe_path_profile_estimate(p, 0, NULL, 6, pop, &known) == MOE_STATUS_OK && known == 6,
           "estimate block 0");
  TU_CHECK(fabs(pop[0] - 1.0) < 1e-12 && fabs(pop[1] - 2.0) < 1e-12 && fabs(pop[2] - 1.0) < 1e-12 &&
               fabs(pop[3] - 2.0) < 1e-12,
           "block 0 marginal %g %g %g %g", pop[0], pop[1], pop[2], pop[3]);
  int top[3];
  const double tie[4] = {1.0, 3.0, 3.0, 0.5};
  moe_path_top(tie, 4, 3, top);
  TU_CHECK(top[0] == 1 && top[1] == 2 && top[2] == 0, "top with ties: %d %d %d", top[0], top[1],
           top[2]);
  {  // Lina's phase-2 test (the re-plan trigger) on hand cases, top-2 of 4
    const double est[4] = {5, 4, 1, 0};
    const double same[4] = {50, 40, 3, 2}, swapped[4] = {4, 5, 1, 0}, other[4] = {5, 0, 1, 4};
    int ordered = -1, set = -1;
    moe_path_compare(est, same, 4, 2, &ordered, &set);
    TU_CHECK(ordered == 1 && set == 1, "compare: the same top-2 in order: %d %d", ordered, set);
    moe_path_compare(est, swapped, 4, 2, &ordered, &set);
    TU_CHECK(ordered == 0 && set == 1, "compare: swapped: not accurate, no re-plan: %d %d", ordered,
             set);
    moe_path_compare(est, other, 4, 2, &ordered, &set);
    TU_CHECK(ordered == 0 && set == 0, "compare: another expert: re-plan: %d %d", ordered, set);
    moe_path_compare(est, other, 4, 9, &ordered, &set);  // m capped at E: every expert
    TU_CHECK(ordered == 0 && set == 1, "compare: top-E sets are always equal: %d %d", ordered, set);
  }
  const moe_path_profile_stats s = moe_path_profile_get_stats(p);
  TU_CHECK(s.tokens == T && s.paths == 1 + 4 && s.unkept == 0, "stats %lld %lld %lld",
           (long long)s.tokens, (long long)s.paths, (long long)s.unkept);
  // bad arguments
  TU_CHECK(moe_path_profile_add(p, NULL, 1) == MOE_STATUS_INVALID_ARG &&
               moe_path_profile_estimate(p, 2, nch, 1, pop, NULL) == MOE_STATUS_INVALID_ARG &&
               moe_path_profile_estimate(p, 1, NULL, 1, pop, NULL) == MOE_STATUS_INVALID_ARG,
           "bad arguments refused");
  moe_path_profile_destroy(p);
}

// A synthetic model with a known path structure: E experts, K = 2, 4 blocks;
// a token's first choice at block b >= 1 is g(its first choices at the 2
// blocks before) with probability q, else uniform over all E; its second
// choice another expert, uniform. With l = 2 and enough tokens, the most
// likely first choice of a path is g(path), so the fraction of fresh tokens
// whose first choice is the estimate's top expert is q + (1 - q) / E.
static void test_synthetic(void) {
  enum { E = 8, K = 2, NB = 4, T = 40000 };
  const double q = 0.6;
  int32_t *ch[NB];
  for (int b = 0; b < NB; b++) ch[b] = malloc((size_t)T * K * sizeof(int32_t));
  g_lcg = 7;
  for (int round = 0; round < 2; round++) {  // round 0: profile; round 1: measure
    for (int t = 0; t < T; t++) {
      for (int b = 0; b < NB; b++) {
        int first;
        if (b == 0 || (double)(rnd() % 100000) / 100000.0 >= q) {
          first = (int)(rnd() % E);
        } else {
          const int a = ch[b - 1][(size_t)t * K], c = b >= 2 ? ch[b - 2][(size_t)t * K] : 0;
          first = (3 * a + 5 * c + 1) % E;
        }
        int second = (int)(rnd() % (E - 1));
        if (second >= first) second++;
        ch[b][(size_t)t * K] = first;
        ch[b][(size_t)t * K + 1] = second;
      }
    }
    static moe_path_profile *p;
    if (round == 0) {
      p = make(NB, E, K, 2, 4096);
      if (!p) break;
      const int32_t *cc[NB] = {ch[0], ch[1], ch[2], ch[3]};
      TU_CHECK(moe_path_profile_add(p, cc, T) == MOE_STATUS_OK, "add synthetic");
      continue;
    }
    // token by token: the estimate of one token's popularity, its top expert
    const double want = q + (1.0 - q) / E;
    for (int b = 2; b < NB; b++) {
      int hits = 0;
      for (int t = 0; t < T; t++) {
        const int32_t *prev[NB];
        int32_t one[NB][K];
        for (int i = 0; i < b; i++) {
          one[i][0] = ch[i][(size_t)t * K];
          one[i][1] = ch[i][(size_t)t * K + 1];
          prev[i] = one[i];
        }
        double pop[E];
        int top = -1;
        moe_path_profile_estimate(p, b, prev, 1, pop, NULL);
        moe_path_top(pop, E, 1, &top);
        hits += top == ch[b][(size_t)t * K];
      }
      const double acc = (double)hits / T;
      printf("synthetic block %d: top-1 accuracy %.4f (known %.4f)\n", b, acc, want);
      // binomial standard deviation at T = 40000: 0.0025; 4 sigma
      TU_CHECK(fabs(acc - want) < 0.01, "block %d: accuracy %.4f, known %.4f", b, acc, want);
    }
    moe_path_profile_destroy(p);
  }
  for (int b = 0; b < NB; b++) free(ch[b]);
}

// The cap: 2 paths per block; the third and fourth paths are unkept, and a
// batch of an unkept path is estimated with the block's marginal.
static void test_cap_and_merge(void) {
  enum { E = 4, T = 8 };
  int32_t b0[T] = {0, 0, 1, 1, 2, 3, 2, 0}, b1[T] = {1, 1, 2, 2, 3, 0, 3, 1};
  const int32_t *ch[2] = {b0, b1};
  moe_path_profile *p = make(2, E, 1, 1, 2);
  if (!p) return;
  TU_CHECK(moe_path_profile_add(p, ch, T) == MOE_STATUS_OK, "add capped");
  const moe_path_profile_stats s = moe_path_profile_get_stats(p);
  // block 0: 1 path; block 1: paths 0 and 1 held (5 tokens), 2 and 3 not (3 tokens)
  TU_CHECK(s.paths == 3 && s.unkept == 3, "cap: %lld paths, %lld unkept", (long long)s.paths,
           (long long)s.unkept);
  double pop[E];
  int known = -1;
  int32_t n0[1] = {3};
  const int32_t *nch[1] = {n0};
  TU_CHECK(moe_path_profile_estimate(p, 1, nch, 1, pop, &known) == MOE_STATUS_OK && known == 0,
           "unkept path");
  // the marginal of block 1: experts 1 x3, 2 x2, 3 x2, 0 x1 over 8
  TU_CHECK(pop[0] == 1.0 / 8 && pop[1] == 3.0 / 8 && pop[2] == 2.0 / 8 && pop[3] == 2.0 / 8,
           "marginal fallback %g %g %g %g", pop[0], pop[1], pop[2], pop[3]);
  moe_path_profile_destroy(p);
  // merging halves equals adding everything (same order of first sight)
  moe_path_profile *a = make(2, E, 1, 1, 8), *b = make(2, E, 1, 1, 8), *w = make(2, E, 1, 1, 8);
  if (!a || !b || !w) return;
  const int32_t *h1[2] = {b0, b1}, *h2[2] = {b0 + 3, b1 + 3};
  moe_path_profile_add(a, h1, 3);
  moe_path_profile_add(b, h2, T - 3);
  moe_path_profile_add(w, ch, T);
  TU_CHECK(moe_path_profile_merge(ctx, a, b) == MOE_STATUS_OK, "merge: %s", moe_ctx_error(ctx));
  char *ja = NULL, *jw = NULL;
  TU_CHECK(moe_path_profile_to_json(ctx, a, &ja) == MOE_STATUS_OK &&
               moe_path_profile_to_json(ctx, w, &jw) == MOE_STATUS_OK && strcmp(ja, jw) == 0,
           "merged != whole:\n%s\n%s", ja ? ja : "", jw ? jw : "");
  moe_path_profile *o = make(2, E, 2, 1, 8);
  TU_CHECK(moe_path_profile_merge(ctx, a, o) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "other configs"),
           "merge of another config refused: %s", moe_ctx_error(ctx));
  moe_free(ja);
  moe_free(jw);
  moe_path_profile_destroy(a);
  moe_path_profile_destroy(b);
  moe_path_profile_destroy(w);
  moe_path_profile_destroy(o);
}

static void test_json(void) {
  enum { E = 4, T = 8 };
  int32_t b0[T * 2], b1[T * 2], b2[T * 2];
  g_lcg = 3;
  for (int i = 0; i < T * 2; i++) {
    b0[i] = (int32_t)(rnd() % E);
    b1[i] = (int32_t)(rnd() % E);
    b2[i] = i == 5 ? -1 : (int32_t)(rnd() % E);  // a dropped choice
  }
  const int32_t *ch[3] = {b0, b1, b2};
  moe_path_profile *p = make(3, E, 2, 2, 64), *r = NULL;
  if (!p) return;
  moe_path_profile_add(p, ch, T);
  char *j1 = NULL, *j2 = NULL;
  TU_CHECK(moe_path_profile_to_json(ctx, p, &j1) == MOE_STATUS_OK, "to_json");
  TU_CHECK(j1 && moe_path_profile_from_json(ctx, j1, strlen(j1), &r) == MOE_STATUS_OK,
           "from_json: %s", moe_ctx_error(ctx));
  TU_CHECK(r && moe_path_profile_to_json(ctx, r, &j2) == MOE_STATUS_OK && strcmp(j1, j2) == 0,
           "round trip differs");
  moe_path_profile_destroy(r);
  r = NULL;
  // a path ending in a choice outside the experts (finding: its digit was the
  // base, so [6, 6, -1] was written back as [7, -1, -1])
  {
    moe_path_profile *d = make(4, 8, 1, 3, 8), *e = NULL;
    int32_t c0[1] = {6}, c1[1] = {6}, c2[1] = {-1}, c3[1] = {4};
    const int32_t *cc[4] = {c0, c1, c2, c3};
    char *a = NULL, *b = NULL;
    TU_CHECK(d && moe_path_profile_add(d, cc, 1) == MOE_STATUS_OK &&
                 moe_path_profile_to_json(ctx, d, &a) == MOE_STATUS_OK &&
                 strstr(a, "\"path\":[6,6,-1]") &&
                 moe_path_profile_from_json(ctx, a, strlen(a), &e) == MOE_STATUS_OK &&
                 moe_path_profile_to_json(ctx, e, &b) == MOE_STATUS_OK && strcmp(a, b) == 0,
             "a path with -1 round trips: %s", a ? a : "");
    moe_free(a);
    moe_free(b);
    moe_path_profile_destroy(d);
    moe_path_profile_destroy(e);
  }
  // a file
  char path[64];
  snprintf(path, sizeof path, "/tmp/test_paths_%d.json", (int)getpid());
  FILE *f = fopen(path, "w");
  if (f) {
    fputs(j1, f);
    fclose(f);
  }
  TU_CHECK(moe_path_profile_load(ctx, path, &r) == MOE_STATUS_OK, "load: %s", moe_ctx_error(ctx));
  moe_path_profile_destroy(r);
  r = NULL;
  remove(path);
  TU_CHECK(
      moe_path_profile_load(ctx, path, &r) == MOE_STATUS_IO && strstr(moe_ctx_error(ctx), path),
      "missing file: %s", moe_ctx_error(ctx));
  // damaged texts: each refused with BAD_FORMAT naming the problem
  const char *head =
      "{\"format\":\"libmoe-paths\",\"version\":1,\"moe_blocks\":2,\"num_experts\":2,"
      "\"top_k\":1,\"path_len\":1,\"max_paths\":2,\"blocks\":[{\"tokens\":1,"
      "\"unkept\":0,\"marginal\":[1,0],\"paths\":[{\"path\":[],\"tokens\":1,"
      "\"counts\":[1,0]}]},";
  struct {
    const char *tail, *words;
  } bad[] = {
      {"{\"tokens\":1,\"unkept\":0,\"marginal\":[0,1],\"paths\":[{\"path\":[0],\"tokens\":1,"
       "\"counts\":[0,1]}]}]}",
       NULL},
      {"{\"tokens\":1,\"unkept\":0,\"marginal\":[0,1],\"paths\":[{\"path\":[0,1],\"tokens\":1,"
       "\"counts\":[0,1]}]}]}",
       "\"path\" must be an array of 1 integers"},
      {"{\"tokens\":1,\"unkept\":0,\"marginal\":[0,1],\"paths\":[{\"path\":[2],\"tokens\":1,"
       "\"counts\":[0,1]}]}]}",
       "\"path\" entry 0 must be an integer in [-1, 1]"},
      {"{\"tokens\":1,\"unkept\":0,\"marginal\":[0,1],\"paths\":[{\"path\":[0],\"tokens\":1,"
       "\"counts\":[0,-1]}]}]}",
       "\"counts\" entry 1 must be an integer in [0, "},
      {"{\"tokens\":1,\"unkept\":0,\"marginal\":[0,1],\"paths\":[{\"path\":[0],\"tokens\":1,"
       "\"counts\":[0,1]},{\"path\":[0],\"tokens\":1,\"counts\":[0,1]}]}]}",
       "path 1 is there twice"},
      {"{\"tokens\":1,\"unkept\":0,\"marginal\":[0,1],\"paths\":[{\"path\":[0],\"tokens\":1,"
       "\"counts\":[0,1]},{\"path\":[1],\"tokens\":1,\"counts\":[0,1]},{\"path\":[-1],"
       "\"tokens\":1,\"counts\":[0,1]}]}]}",
       "holds 3 paths, more than max_paths (2)"},
      {"{\"tokens\":1,\"unkept\":2,\"marginal\":[0,1],\"paths\":[]}]}",
       "\"unkept\" must be an integer in [0, 1]"},
      {"{\"tokens\":1,\"unkept\":0,\"marginal\":[0,1],\"paths\":[]}]", "not a JSON object"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[1024];
    snprintf(text, sizeof text, "%s%s", head, bad[i].tail);
    const moe_status st = moe_path_profile_from_json(ctx, text, strlen(text), &r);
    if (!bad[i].words) {
      TU_CHECK(st == MOE_STATUS_OK, "the valid base text: %s", moe_ctx_error(ctx));
    } else {
      TU_CHECK(st == MOE_STATUS_BAD_FORMAT && !r && strstr(moe_ctx_error(ctx), bad[i].words),
               "damaged %zu: status %d, '%s'", i, (int)st, moe_ctx_error(ctx));
    }
    moe_path_profile_destroy(r);
    r = NULL;
  }
  const char *other[] = {
      "{\"format\":\"x\"}",
      "\"format\" must be \"libmoe-paths\"",
      "{\"format\":\"libmoe-paths\",\"version\":2}",
      "\"version\" must be an integer in [1, 1]",
      "{\"format\":\"libmoe-paths\",\"version\":1,\"moe_blocks\":1,\"num_experts\":4,\"top_k\":5}",
      "\"top_k\" must be an integer in [1, 4]"};
  for (size_t i = 0; i < sizeof other / sizeof other[0]; i += 2) {
    TU_CHECK(
        moe_path_profile_from_json(ctx, other[i], strlen(other[i]), &r) == MOE_STATUS_BAD_FORMAT &&
            strstr(moe_ctx_error(ctx), other[i + 1]),
        "'%s': %s", other[i], moe_ctx_error(ctx));
  }
  moe_free(j1);
  moe_free(j2);
  moe_path_profile_destroy(p);
  // config errors
  // the last: finding 11, a config of 26 blocks x 4096 paths x 65535 experts
  const moe_path_config cs[] = {{0, 4, 1, 3, 16},     {2, 4, 5, 3, 16}, {2, 4, 1, 9, 16},
                                {2, 60000, 1, 8, 16}, {2, 4, 1, 3, 0},  {26, 65535, 1, 1, 4096}};
  const char *words[] = {"MoE blocks (0)",      "top_k (5)",
                         "path length (9)",     "63-bit key",
                         "paths per block (0)", "more than the 256 MiB a profile may take"};
  for (int i = 0; i < 6; i++) {
    TU_CHECK(moe_path_profile_create(ctx, &cs[i], &r) == MOE_STATUS_INVALID_ARG && !r &&
                 strstr(moe_ctx_error(ctx), words[i]),
             "config %d: %s", i, moe_ctx_error(ctx));
  }
}

int main(void) {
  moe_ctx_create(&ctx);
  test_hand();
  test_synthetic();
  test_cap_and_merge();
  test_json();
  moe_ctx_destroy(ctx);
  return tu_finish("test_paths");
}
