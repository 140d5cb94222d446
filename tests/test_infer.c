// The inference engine (moe_infer_*) under MPI at 1, 2 and 4 ranks, against a
// naive generator on rank 0: the single-process model recomputing the full
// forward over the window for every token (moe_gpt_forward), with the same
// sampler, seeds and window rule. Requests of every kind (greedy, temperature
// with top-k and top-p, stop strings, max_tokens 0, prompts longer than the
// context, an empty prompt, generations past seq_len), through a queue small
// enough to fill (BUSY), with the streamed text equal to the final text; the
// logits of every token the engine samples (moe_infer_step_logits) equal to
// the reference's full forward over the same window (1e-5 relative), also in
// steps where a rank has no rows; cancellation; shutdown releasing the followers; a missing
// checkpoint failing on every rank. Also the sampler and the JSON request parser.
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe/gpt_io.h"
#include "moe/infer.h"
#include "moe/train.h"
#include "testutil.h"

static int g_rank, g_world;

enum { NREQ = 10, MAXT = 60 };

typedef struct {
  char stream[NREQ + 2][2048];  // on_text concatenated
  size_t stream_len[NREQ + 2];
  char text[NREQ + 2][2048];
  size_t text_len[NREQ + 2];
  moe_infer_result res[NREQ + 2];
  int done_calls[NREQ + 2];
} collected;

static void on_text(void *user, int64_t id, const char *b, size_t n) {
  collected *c = user;
  if (id < 1 || id > NREQ + 1 || c->stream_len[id] + n >= 2048) return;
  memcpy(c->stream[id] + c->stream_len[id], b, n);
  c->stream_len[id] += n;
}

static void on_done(void *user, int64_t id, const moe_infer_result *r) {
  collected *c = user;
  if (id < 1 || id > NREQ + 1) return;
  c->res[id] = *r;
  c->text_len[id] = r->text_len < 2048 ? r->text_len : 2047;
  memcpy(c->text[id], r->text, c->text_len[id]);
  c->done_calls[id]++;
}

// A request's window as the engine holds it (the reference's rule): the
// prompt's last seq_len tokens ("\n" for an empty prompt), each sampled token
// appended, the last seq_len / 2 kept when the window is full.
typedef struct {
  int32_t win[256];
  int wl;
} window;

static void window_init(window *w, const char *prompt, int S) {
  const size_t plen = strlen(prompt);
  w->wl = 0;
  if (plen == 0) w->win[w->wl++] = '\n';
  for (size_t i = plen > (size_t)S ? plen - S : 0; i < plen; i++)
    w->win[w->wl++] = (unsigned char)prompt[i];
}

static void window_push(window *w, int tok, int S) {
  if (w->wl < S) {
    w->win[w->wl++] = tok;
  } else {
    const int keep = S / 2;
    memmove(w->win, w->win + (w->wl - (keep - 1)), (size_t)(keep - 1) * sizeof(int32_t));
    w->win[keep - 1] = tok;
    w->wl = keep;
  }
}

// The naive reference: full forward over the window for every token.
static size_t reference(moe_gpt *m, const char *prompt, const moe_infer_params *p, char *text,
                        moe_infer_finish *finish) {
  const moe_gpt_config *c = moe_gpt_get_config(m);
  const int S = c->seq_len, V = c->vocab_size;
  window w;
  window_init(&w, prompt, S);
  moe_rng rng;
  moe_rng_init(&rng, p->seed, 0);
  double scr[2 * 256];
  int order[256];
  size_t n = 0;
  text[0] = '\0';
  *finish = MOE_INFER_FINISH_LENGTH;
  for (int g = 0; g < p->max_tokens; g++) {
    TU_CHECK(moe_gpt_forward(m, w.win, NULL, 1, w.wl, 0, NULL) == MOE_STATUS_OK, "ref forward");
    const float *lg = moe_gpt_logits(m) + (size_t)(w.wl - 1) * V;
    const int tok = moe_infer_sample(lg, V, p->temperature, p->top_k, p->top_p,
                                     moe_rng_uniform(&rng), scr, order);
    text[n++] = (char)tok;
    text[n] = '\0';
    for (int s = 0; s < p->n_stop; s++) {
      const size_t k = strlen(p->stop[s]);
      if (k <= n && memcmp(text + n - k, p->stop[s], k) == 0) {
        *finish = MOE_INFER_FINISH_STOP;
        return n - k;
      }
    }
    window_push(&w, tok, S);
  }
  return n;
}

// The logits the engine sampled from in its last step against the reference's
// full forward (moe_gpt_forward, one process) over each request's window at
// 1e-5 relative; each window then takes the sampled token. Returns the rows
// compared.
static int check_step_logits(moe_infer *e, moe_gpt *ref, window *w, const char *label) {
  const moe_gpt_config *c = moe_gpt_get_config(ref);
  const moe_infer_step_row *rows = NULL;
  const int n = moe_infer_step_logits(e, &rows);
  for (int k = 0; k < n; k++) {
    const int64_t id = rows[k].id;
    TU_CHECK(id >= 1 && id <= NREQ && rows[k].logits && rows[k].token >= 0 &&
                 rows[k].token < c->vocab_size,
             "%s: step row %d: id %lld, token %d", label, k, (long long)id, rows[k].token);
    if (id < 1 || id > NREQ || !rows[k].logits) continue;
    window *wi = &w[id];
    TU_CHECK(moe_gpt_forward(ref, wi->win, NULL, 1, wi->wl, 0, NULL) == MOE_STATUS_OK,
             "ref forward");
    char name[160];
    snprintf(name, sizeof name, "%s: request %lld, window of %d: logits", label, (long long)id,
             wi->wl);
    tu_rel_close(name, rows[k].logits,
                 moe_gpt_logits(ref) + (size_t)(wi->wl - 1) * (size_t)c->vocab_size,
                 (size_t)c->vocab_size, 1e-5);
    window_push(wi, rows[k].token, c->seq_len);
  }
  return n;
}

static void make_requests(moe_infer_params *p, const char **prompts) {
  static const char *pr[NREQ] = {
      "Q: What is the answer? A:",
      "",
      "A long prompt, longer than the sixteen positions the model holds, so it is cut.",
      "The ",
      "x",
      "Once upon a time",
      "abc",
      "Hello, world",
      "\n\n",
      "zzz"};
  for (int i = 0; i < NREQ; i++) {
    moe_infer_params_default(&p[i]);
    prompts[i] = pr[i];
    p[i].max_tokens = 10 + 5 * i;
    p[i].seed = 100 + (uint64_t)i;
    p[i].temperature = i % 3 == 0 ? 0.0 : 0.9;
    p[i].top_k = i % 4 == 1 ? 5 : 0;
    p[i].top_p = i % 4 == 2 ? 0.8 : 1.0;
  }
  p[4].max_tokens = 0;
  p[7].n_stop = 1;
  snprintf(p[7].stop[0], sizeof p[7].stop[0], "ZZZZ");  // never generated
  p[9].max_tokens = MAXT;                               // past seq_len: several refills
}

static char paths_file[300];

// Records a path profile of the test's requests (every rank's tokens,
// merged on rank 0, written to paths_file) for the lina placement.
static void record_profile(moe_ctx *ctx, const char *ckpt) {
  moe_infer_config ic;
  moe_infer_config_default(&ic);
  ic.checkpoint = ckpt;
  ic.slots = 2;
  ic.step_rows = 12;
  ic.prefill_chunk = 5;
  ic.record_paths = 1;
  ic.path_len = 2;
  moe_infer *e = NULL;
  moe_status st = moe_infer_create(ctx, MPI_COMM_WORLD, &ic, &e);
  TU_CHECK(st == MOE_STATUS_OK, "record: create: %s", moe_ctx_error(ctx));
  if (st != MOE_STATUS_OK) return;
  if (g_rank == 0) {
    moe_infer_params p[NREQ];
    const char *prompts[NREQ];
    make_requests(p, prompts);
    for (int i = 0; i < NREQ; i++) {
      int64_t id = 0;
      while (moe_infer_submit(e, NULL, prompts[i], strlen(prompts[i]), &p[i], NULL, &id) ==
             MOE_STATUS_BUSY)
        moe_infer_step(e);
    }
    TU_CHECK(moe_infer_run(e) == MOE_STATUS_OK && moe_infer_shutdown(e) == MOE_STATUS_OK,
             "record: run: %s", moe_ctx_error(ctx));
  } else {
    TU_CHECK(moe_infer_follow(e) == MOE_STATUS_OK, "record: follow");
  }
  char *text = NULL;
  TU_CHECK(moe_infer_paths_json(e, &text) == MOE_STATUS_OK, "record: paths: %s",
           moe_ctx_error(ctx));
  if (g_rank == 0) {
    TU_CHECK(text && strstr(text, "\"libmoe-paths\""), "record: the profile's text");
    FILE *f = fopen(paths_file, "w");
    if (f && text) fputs(text, f);
    if (f) fclose(f);
  } else {
    TU_CHECK(!text, "record: text on rank %d", g_rank);
  }
  moe_free(text);
  moe_infer_destroy(e);
  MPI_Barrier(MPI_COMM_WORLD);
}

static void test_engine(moe_ctx *ctx, const char *ckpt, int placement, int phase2) {
  moe_infer_config ic;
  moe_infer_config_default(&ic);
  ic.checkpoint = ckpt;
  ic.slots = 2;
  ic.step_rows = 12;
  ic.prefill_chunk = 5;
  ic.queue = 3;
  ic.placement = placement;  // eplb: re-planned every 2 steps; the text must not change
  ic.place_slots = 2;
  ic.place_window = 2;
  ic.place_every = 2;
  if (placement == MOE_INFER_PLACE_LINA) ic.paths = paths_file;  // its phase-1 estimates
  ic.place_phase2 = phase2;
  moe_infer *e = NULL;
  moe_status st = moe_infer_create(ctx, MPI_COMM_WORLD, &ic, &e);
  TU_CHECK(st == MOE_STATUS_OK, "create: %s", moe_ctx_error(ctx));
  if (st != MOE_STATUS_OK) return;
  if (g_rank != 0) {
    TU_CHECK(moe_infer_follow(e) == MOE_STATUS_OK, "follow: %s", moe_ctx_error(ctx));
    moe_infer_destroy(e);
    return;
  }
  // the reference model, single process
  moe_gpt_ckpt_info info;
  moe_gpt *ref = NULL;
  TU_CHECK(moe_gpt_ckpt_read_info(ctx, ckpt, &info) == MOE_STATUS_OK, "info");
  TU_CHECK(moe_gpt_create(ctx, &info.model, 1, NULL, NULL, &ref) == MOE_STATUS_OK, "ref model");
  TU_CHECK(moe_gpt_ckpt_load(ctx, ckpt, ref, NULL) == MOE_STATUS_OK, "ref load");

  static collected c;
  memset(&c, 0, sizeof c);
  moe_infer_callbacks cb = {on_text, on_done, &c};
  moe_infer_params p[NREQ];
  const char *prompts[NREQ];
  make_requests(p, prompts);
  // request 5 stops at two bytes it would generate (found by the reference)
  {
    char t[2048];
    moe_infer_finish f;
    const size_t n = reference(ref, prompts[5], &p[5], t, &f);
    size_t at = 4;
    while (at + 1 < n && (t[at] == 0 || t[at + 1] == 0)) at++;
    TU_CHECK(at + 1 < n, "request 5: no place for a stop string");
    p[5].n_stop = 2;
    snprintf(p[5].stop[0], sizeof p[5].stop[0], "NEVER");
    p[5].stop[1][0] = t[at];
    p[5].stop[1][1] = t[at + 1];
    p[5].stop[1][2] = '\0';
  }
  // every token's logits against the reference's (rows of ids 1..NREQ)
  static window win[NREQ + 1];
  for (int i = 0; i < NREQ; i++) window_init(&win[i + 1], prompts[i], info.model.seq_len);
  char label[64];
  snprintf(label, sizeof label, "P=%d placement %s", g_world, moe_infer_placement_name(placement));
  int64_t compared = 0, idle_compared = 0;
  int submitted = 0, busy = 0;
  while (submitted < NREQ || moe_infer_pending(e) > 0) {
    while (submitted < NREQ) {
      int64_t id = 0;
      st = moe_infer_submit(e, NULL, prompts[submitted], strlen(prompts[submitted]), &p[submitted],
                            &cb, &id);
      if (st == MOE_STATUS_BUSY) {
        busy++;
        break;
      }
      TU_CHECK(st == MOE_STATUS_OK && id == submitted + 1, "submit %d: %s", submitted,
               moe_ctx_error(ctx));
      submitted++;
    }
    moe_infer_stats before, after;
    moe_infer_get_stats(e, &before);
    TU_CHECK(moe_infer_step(e) == MOE_STATUS_OK, "step: %s", moe_ctx_error(ctx));
    moe_infer_get_stats(e, &after);
    const int rows = check_step_logits(e, ref, win, label);
    compared += rows;
    if (after.idle_rank_steps > before.idle_rank_steps) idle_compared += rows;
  }
  TU_CHECK(busy > 0, "the queue of 3 never filled");
  {
    moe_infer_stats s;
    moe_infer_get_stats(e, &s);
    TU_CHECK(compared == s.tokens && compared > 0, "%s: %lld rows of logits compared, %lld tokens",
             label, (long long)compared, (long long)s.tokens);
    // a rank with no rows in the step: the others' logits still right
    if (g_world > 1)
      TU_CHECK(idle_compared > 0, "%s: no logits compared in a step with an idle rank", label);
  }
  for (int i = 0; i < NREQ; i++) {
    const int id = i + 1;
    char want[2048];
    moe_infer_finish fin;
    const size_t wn = reference(ref, prompts[i], &p[i], want, &fin);
    TU_CHECK(c.done_calls[id] == 1, "request %d: on_done called %d times", i, c.done_calls[id]);
    TU_CHECK(c.text_len[id] == wn && memcmp(c.text[id], want, wn) == 0,
             "request %d (P=%d, placement %s): engine and reference differ (%zu vs %zu bytes)", i,
             g_world, moe_infer_placement_name(placement), c.text_len[id], wn);
    TU_CHECK(c.res[id].finish == fin, "request %d: finish %s vs %s", i,
             moe_infer_finish_name(c.res[id].finish), moe_infer_finish_name(fin));
    TU_CHECK(c.stream_len[id] == c.text_len[id] &&
                 memcmp(c.stream[id], c.text[id], c.stream_len[id]) == 0,
             "request %d: the streamed text differs from the final one", i);
    TU_CHECK(c.res[id].prompt_tokens == (int)strlen(prompts[i]), "request %d prompt tokens %d", i,
             c.res[id].prompt_tokens);
    if (fin == MOE_INFER_FINISH_LENGTH)
      TU_CHECK(c.res[id].completion_tokens == p[i].max_tokens, "request %d: %d tokens", i,
               c.res[id].completion_tokens);
  }
  TU_CHECK(c.res[5 + 1].finish == MOE_INFER_FINISH_STOP, "request 5 did not stop");
  TU_CHECK(c.res[7 + 1].finish == MOE_INFER_FINISH_LENGTH, "request 7 stopped");
  moe_infer_stats s;
  moe_infer_get_stats(e, &s);
  TU_CHECK(s.context_shifts >= 3, "context refills: %lld", (long long)s.context_shifts);
  TU_CHECK(s.requests_done == NREQ && s.running == 0 && s.waiting == 0, "stats: %lld done",
           (long long)s.requests_done);
  // sequences of different lengths end at different steps: at 2 and 4 ranks
  // some steps give a rank no rows, and it still takes part in them
  if (g_world > 1)
    TU_CHECK(s.idle_rank_steps > 0 && s.idle_rank_steps < s.steps,
             "steps with an idle rank: %lld of %lld", (long long)s.idle_rank_steps,
             (long long)s.steps);
  TU_CHECK(s.max_batch_seqs <= 2 * g_world, "at most %d sequences a step, saw %d", 2 * g_world,
           s.max_batch_seqs);
  if (placement == MOE_INFER_PLACE_LINA && g_world > 1) {
    // a plan before every MoE block's forward of every step; the path
    // statistics come with the profile
    TU_CHECK(s.plans >= s.steps && s.path_evals > 0 && s.path_accurate <= s.path_evals,
             "lina: %lld plans in %lld steps, %lld path checks", (long long)s.plans,
             (long long)s.steps, (long long)s.path_evals);
    // phase 2 re-plans exactly when the path statistics count a fine-tune
    // (the same test on the same estimates: the top-2K sets differ); a
    // re-plan is a plan of its own; without phase 2 none
    TU_CHECK(phase2 ? s.replans == s.path_finetune && s.replans > 0 : s.replans == 0,
             "lina phase 2 %s: %lld re-plans, %lld fine-tunes counted", phase2 ? "on" : "off",
             (long long)s.replans, (long long)s.path_finetune);
    printf(
        "lina P=%d phase 2 %s: %lld plans (%lld re-plans) in %lld steps, %lld copies sent, ratio "
        "%.3f -> %.3f, estimate accurate in %lld of %lld\n",
        g_world, phase2 ? "on" : "off", (long long)s.plans, (long long)s.replans,
        (long long)s.steps, (long long)s.copies_sent, s.balance_uniform, s.balance_placed,
        (long long)s.path_accurate, (long long)s.path_evals);
  } else if (placement == MOE_INFER_PLACE_EPLB && g_world > 1) {
    // every 2 steps a plan per MoE block; some placed copies (the texts above
    // are the reference's all the same)
    TU_CHECK(s.plans >= s.steps / 2 && s.copies_sent > 0 && s.balance_uniform >= 1.0 &&
                 s.balance_placed >= 1.0,
             "eplb: %lld plans in %lld steps, %lld copies sent, ratio %.3f -> %.3f",
             (long long)s.plans, (long long)s.steps, (long long)s.copies_sent, s.balance_uniform,
             s.balance_placed);
    printf(
        "eplb P=%d: %lld plans in %lld steps, %lld copies sent, %d in force, ratio %.3f -> "
        "%.3f\n",
        g_world, (long long)s.plans, (long long)s.steps, (long long)s.copies_sent, s.copies,
        s.balance_uniform, s.balance_placed);
  } else {
    TU_CHECK(s.plans == 0 && s.copies_sent == 0 && s.copies == 0, "uniform: no placement");
  }
  // cancellation: a long request, a few steps, cancel
  {
    moe_infer_params lp;
    moe_infer_params_default(&lp);
    lp.max_tokens = 1000;
    int64_t id = 0;
    TU_CHECK(moe_infer_submit(e, NULL, "abc", 3, &lp, &cb, &id) == MOE_STATUS_OK && id == NREQ + 1,
             "submit long");
    for (int k = 0; k < 4; k++) moe_infer_step(e);
    moe_infer_cancel(e, id);
    TU_CHECK(moe_infer_run(e) == MOE_STATUS_OK, "run after cancel");
    TU_CHECK(c.done_calls[id] == 1 && c.res[id].finish == MOE_INFER_FINISH_CANCELLED &&
                 c.res[id].completion_tokens < 1000,
             "cancelled: %d calls, finish %d, %d tokens", c.done_calls[id], (int)c.res[id].finish,
             c.res[id].completion_tokens);
  }
  // bad parameters
  {
    moe_infer_params bp;
    moe_infer_params_default(&bp);
    bp.top_p = 0;
    int64_t id = 0;
    TU_CHECK(moe_infer_submit(e, NULL, "x", 1, &bp, NULL, &id) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(ctx), "top_p"),
             "top_p 0: %s", moe_ctx_error(ctx));
  }
  // shutdown releases the followers; a request after it is refused
  TU_CHECK(moe_infer_shutdown(e) == MOE_STATUS_OK, "shutdown");
  int64_t id = 0;
  moe_infer_params dp;
  moe_infer_params_default(&dp);
  TU_CHECK(moe_infer_submit(e, NULL, "x", 1, &dp, NULL, &id) == MOE_STATUS_BUSY,
           "submit after shutdown");
  moe_gpt_destroy(ref);
  moe_infer_destroy(e);
}

static void test_sampler(void) {
  const float lg[6] = {0.5f, 2.0f, -1.0f, 1.0f, 2.0f, -3.0f};
  double scr[12];
  int order[6];
  TU_CHECK(moe_infer_sample(lg, 6, 0, 0, 1, 0.99, scr, order) == 1, "greedy: first maximum");
  // top-k 1 keeps the tie (1 and 4, by index), top-p 0.3 keeps the first of them
  int seen[6] = {0};
  for (int i = 0; i < 1000; i++)
    seen[moe_infer_sample(lg, 6, 1, 1, 1, (i + 0.5) / 1000, scr, order)]++;
  TU_CHECK(seen[1] == 500 && seen[4] == 500, "top-1 with a tie: %d %d", seen[1], seen[4]);
  memset(seen, 0, sizeof seen);
  for (int i = 0; i < 1000; i++)
    seen[moe_infer_sample(lg, 6, 1, 0, 0.3, (i + 0.5) / 1000, scr, order)]++;
  TU_CHECK(seen[1] == 1000, "top-p 0.3: the most likely only (%d)", seen[1]);
  // full distribution: frequencies = softmax(lg / t)
  const double t = 0.7;
  double z = 0, pr[6];
  for (int i = 0; i < 6; i++) z += pr[i] = exp(lg[i] / t);
  memset(seen, 0, sizeof seen);
  const int N = 100000;
  for (int i = 0; i < N; i++) seen[moe_infer_sample(lg, 6, t, 0, 1, (i + 0.5) / N, scr, order)]++;
  for (int i = 0; i < 6; i++)
    TU_CHECK(fabs(seen[i] / (double)N - pr[i] / z) <= 2.0 / N, "token %d: %.5f vs %.5f", i,
             seen[i] / (double)N, pr[i] / z);
}

static void test_request_json(moe_ctx *ctx) {
  moe_infer_params d;
  moe_infer_params_default(&d);
  moe_infer_request r;
  const char *ok =
      "{\"prompt\":\"Hi\\u00e9\",\"max_tokens\":5,\"temperature\":0,\"top_p\":0.5,"
      "\"top_k\":3,\"seed\":9,\"stop\":[\"a\",\"bc\"],\"stream\":true,\"model\":\"m\","
      "\"n\":1,\"user\":\"u\",\"id\":\"q\\u00e9\"}";
  TU_CHECK(
      moe_infer_request_from_json(ctx, ok, strlen(ok), &d, MOE_INFER_JSON_ID, &r) == MOE_STATUS_OK,
      "valid request: %s", moe_ctx_error(ctx));
  TU_CHECK(r.prompt_len == 4 && strcmp(r.prompt, "Hi\xc3\xa9") == 0 && r.params.max_tokens == 5 &&
               r.params.temperature == 0 && r.params.top_p == 0.5 && r.params.top_k == 3 &&
               r.params.seed == 9 && r.has_seed && r.params.n_stop == 2 &&
               strcmp(r.params.stop[1], "bc") == 0 && r.stream == 1 && strcmp(r.model, "m") == 0 &&
               r.id_json && strcmp(r.id_json, "\"q\xc3\xa9\"") == 0,
           "fields");
  moe_infer_request_free(&r);
  struct {
    const char *json, *want;
  } bad[] = {
      {"{\"max_tokens\":3}", "'prompt' is required"},
      {"{\"prompt\":\"a\",\"foo\":1}", "unrecognized key 'foo'"},
      {"{\"prompt\":\"a\",\"id\":1}", "unrecognized key 'id'"},  // without the flag
      {"{\"prompt\":\"a\",\"prompt\":\"b\"}", "appears twice"},
      {"{\"prompt\":[\"a\",\"b\"]}", "one string"},
      {"{\"prompt\":\"a\",\"n\":2}", "'n' must be 1"},
      {"{\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "at most 4"},
      {"{\"prompt\":\"a\",\"stop\":\"\"}", "1 to 64 bytes"},
      {"{\"prompt\":\"a\",\"temperature\":-1}", "temperature"},
      {"{\"prompt\":\"a\",\"max_tokens\":-1}", "max_tokens"},
      {"{\"prompt\":\"a\",\"top_p\":1.5}", "top_p"},
      {"{\"prompt\":\"a\",\"seed\":-2}", "'seed'"},
      {"{\"prompt\":\"a\\u0000b\"}", "NUL"},
      {"{\"prompt\":\"a\"", "request"},
      {"[1]", "request"},
      {"{\"prompt\":5}", "'prompt' must be a string"},
  };
  // chat: the template, and a message with a key twice (a fuzzer finding:
  // the prompt was sized with one "content" and written with the other)
  const char *chat =
      "{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
      "{\"role\":\"user\",\"content\":\"hi\"}],\"max_completion_tokens\":7}";
  TU_CHECK(moe_infer_request_from_json(ctx, chat, strlen(chat), &d, MOE_INFER_JSON_CHAT, &r) ==
                   MOE_STATUS_OK &&
               strcmp(r.prompt, "system: be brief\nuser: hi\nassistant:") == 0 &&
               r.params.max_tokens == 7,
           "chat template: %s", moe_ctx_error(ctx));
  moe_infer_request_free(&r);
  const char *dup =
      "{\"messages\":[{\"role\":\"user\",\"content\":\"a long one\",\"content\":\"x\"}]}";
  TU_CHECK(moe_infer_request_from_json(ctx, dup, strlen(dup), &d, MOE_INFER_JSON_CHAT, &r) ==
                   MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "'content' appears twice"),
           "duplicate content: %s", moe_ctx_error(ctx));
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const moe_status st =
        moe_infer_request_from_json(ctx, bad[i].json, strlen(bad[i].json), &d, 0, &r);
    TU_CHECK(st != MOE_STATUS_OK && strstr(moe_ctx_error(ctx), bad[i].want),
             "bad request %zu (%s): status %d, '%s'", i, bad[i].json, (int)st, moe_ctx_error(ctx));
  }
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  int provided = 0;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  // a tiny model trained a few steps at this world size, saved
  char ckpt[256];
  long pid = g_rank == 0 ? (long)getpid() : 0;
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  snprintf(ckpt, sizeof ckpt, "/tmp/test_infer_%ld.ckpt", pid);
  moe_train_config tc;
  moe_train_config_default(&tc);
  tc.model.seq_len = 16;
  tc.model.n_layer = 2;
  tc.model.n_head = 2;
  tc.model.d_model = 16;
  tc.model.dense_hidden = 32;
  tc.model.moe_every = 1;        // 2 MoE blocks: lina's phase 1 of the second one
  tc.model.moe.num_experts = 8;  // overlaps the first; top-2K (4) of 8: phase 2 can miss
  tc.model.moe.top_k = 2;
  tc.model.moe.hidden_dim = 24;
  tc.batch = 8;
  tc.steps = 3;
  tc.eval_every = 0;
  tc.progress = 0;
  tc.checkpoint = ckpt;
  moe_train_result res;
  TU_CHECK(moe_train_run(ctx, MPI_COMM_WORLD, &tc, &res) == MOE_STATUS_OK, "train: %s",
           moe_ctx_error(ctx));
  test_engine(ctx, ckpt, MOE_INFER_PLACE_UNIFORM, 1);
  test_engine(ctx, ckpt, MOE_INFER_PLACE_EPLB, 1);
  snprintf(paths_file, sizeof paths_file, "%s.paths.json", ckpt);
  record_profile(ctx, ckpt);
  test_engine(ctx, ckpt, MOE_INFER_PLACE_LINA, 1);
  test_engine(ctx, ckpt, MOE_INFER_PLACE_LINA, 0);
  // a missing checkpoint fails on every rank, no hang
  {
    moe_infer_config ic;
    moe_infer_config_default(&ic);
    ic.checkpoint = "/nonexistent/x.ckpt";
    moe_infer *e = NULL;
    TU_CHECK(moe_infer_create(ctx, MPI_COMM_WORLD, &ic, &e) != MOE_STATUS_OK && !e,
             "missing checkpoint accepted");
    ic.checkpoint = ckpt;
    ic.prefill_chunk = ic.step_rows + 1;
    TU_CHECK(moe_infer_create(ctx, MPI_COMM_WORLD, &ic, &e) == MOE_STATUS_INVALID_ARG,
             "prefill chunk above the rows per step accepted");
    // placement: an unknown one, a window out of range, too many slots (4
    // experts: a rank holds 4 - 4/P others; one rank places nothing)
    moe_infer_config_default(&ic);
    ic.checkpoint = ckpt;
    ic.placement = 7;
    TU_CHECK(moe_infer_create(ctx, MPI_COMM_WORLD, &ic, &e) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(ctx), "placement 7 is unknown (valid: uniform, eplb, lina)"),
             "unknown placement: %s", moe_ctx_error(ctx));
    ic.placement = MOE_INFER_PLACE_EPLB;
    ic.place_window = 0;
    TU_CHECK(moe_infer_create(ctx, MPI_COMM_WORLD, &ic, &e) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(ctx), "placement window (0) must be in [1, 10000]"),
             "placement window 0: %s", moe_ctx_error(ctx));
    ic.place_window = 16;
    ic.place_slots = 8;  // E: more than the E - E/P experts a rank does not hold
    const moe_status st = moe_infer_create(ctx, MPI_COMM_WORLD, &ic, &e);
    if (g_world > 1) {
      TU_CHECK(st == MOE_STATUS_INVALID_ARG &&
                   strstr(moe_ctx_error(ctx), "placement slots (8) must be in [1, "),
               "8 slots: %s", moe_ctx_error(ctx));
    } else {
      TU_CHECK(st == MOE_STATUS_OK, "one rank: slots unused: %s", moe_ctx_error(ctx));
      if (st == MOE_STATUS_OK) {
        moe_infer_shutdown(e);
        moe_infer_destroy(e);
      }
    }
    TU_CHECK(!strcmp(moe_infer_placement_names(), "uniform, eplb, lina") &&
                 moe_infer_placement_find("eplb") == MOE_INFER_PLACE_EPLB &&
                 moe_infer_placement_find("lina") == MOE_INFER_PLACE_LINA &&
                 moe_infer_placement_find("x") == -1 && !moe_infer_placement_name(3),
             "placement names: %s", moe_infer_placement_names());
    moe_infer_config_default(&ic);
    ic.checkpoint = ckpt;
    ic.placement = MOE_INFER_PLACE_LINA;
    TU_CHECK(moe_infer_create(ctx, MPI_COMM_WORLD, &ic, &e) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(ctx), "placement lina estimates"),
             "lina without a profile: %s", moe_ctx_error(ctx));
  }
  if (g_rank == 0) {
    test_sampler();
    test_request_json(ctx);
    remove(ckpt);
    remove(paths_file);
  }
  moe_ctx_destroy(ctx);
  const int rc = tu_finish("test_infer");
  int any = rc;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
