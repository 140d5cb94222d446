// The load generator of `moe bench serve` (moe_loadgen_run, infer.h): drives
// a running `moe serve` over HTTP (libcurl) with streamed completion requests,
// open loop (Poisson arrivals at a rate) or closed loop (a fixed number in
// flight), and measures per request the time to the first token, the gaps
// between tokens and the end-to-end latency.
//
// Open loop: request i is due at t_i (exponential gaps, seeded); a worker
// that takes it late (all workers busy) still measures from t_i, so waiting at
// the client counts as latency (no coordinated omission). Closed loop: each of
// `concurrency` workers sends its next request when the last one ends.
// Prompts are seeded pseudo-words of the drawn length; every request streams
// and asks for exactly its drawn number of tokens (no stop strings), so each
// server-sent event carries one token.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe/infer_request.h"
#include "moe_build_config.h"

void moe_loadgen_config_default(moe_loadgen_config *c) {
  memset(c, 0, sizeof *c);
  c->url = "http://127.0.0.1:8080";
  c->requests = 64;
  c->rate = 0;
  c->concurrency = 8;
  c->prompt_min = c->prompt_max = 32;
  c->output_min = c->output_max = 64;
  c->temperature = 0.8;
  c->seed = 1;
  c->timeout_s = 600;
}

moe_status moe_loadgen_range_parse(moe_ctx *ctx, const char *text, int lo, int hi, int *a, int *b) {
  moe_status st = MOE_STATUS_OK;
  char *end = NULL;
  MOE_FAIL_IF(ctx, !text || !*text, MOE_STATUS_INVALID_ARG,
              "a length must be N or A-B (integers in [%d, %d])", lo, hi);
  const long x = strtol(text, &end, 10);
  long y = x;
  if (*end == '-') {
    const char *s = end + 1;
    y = strtol(s, &end, 10);
    MOE_FAIL_IF(ctx, end == s, MOE_STATUS_INVALID_ARG,
                "length '%s' must be N or A-B (integers in [%d, %d])", text, lo, hi);
  }
  MOE_FAIL_IF(ctx, *end != '\0' || end == text || x < lo || y > hi || x > y, MOE_STATUS_INVALID_ARG,
              "length '%s' must be N or A-B with %d <= A <= B <= %d", text, lo, hi);
  *a = (int)x;
  *b = (int)y;
done:
  return st;
}

double moe_prom_value(const char *text, const char *name) {
  const size_t n = name ? strlen(name) : 0;
  if (!text || n == 0) return NAN;
  for (const char *p = text; *p;) {
    const char *eol = strchr(p, '\n');
    if (strncmp(p, name, n) == 0 && p[n] == ' ') {
      char *end = NULL;
      const double v = strtod(p + n + 1, &end);
      // the value ends the line (a timestamp may follow it, after a space)
      if (end != p + n + 1 && (*end == '\0' || *end == '\n' || *end == ' ')) return v;
      return NAN;
    }
    if (!eol) break;
    p = eol + 1;
  }
  return NAN;
}

moe_status moe_server_metrics_get(moe_ctx *ctx, const char *url, moe_server_metrics *out) {
  char *m = NULL;
  const moe_status st = moe_http_get(ctx, url, "/metrics", &m);
  if (st != MOE_STATUS_OK) return st;
  out->moe_ms[0] = 1e3 * moe_prom_value(m, "moe_engine_moe_layer_seconds{quantile=\"0.5\"}");
  out->moe_ms[1] = 1e3 * moe_prom_value(m, "moe_engine_moe_layer_seconds{quantile=\"0.95\"}");
  out->a2a_ms[0] = 1e3 * moe_prom_value(m, "moe_engine_a2a_layer_seconds{quantile=\"0.5\"}");
  out->a2a_ms[1] = 1e3 * moe_prom_value(m, "moe_engine_a2a_layer_seconds{quantile=\"0.95\"}");
  out->balance[0] = moe_prom_value(m, "moe_placement_balance_ratio{copies=\"none\"}");
  out->balance[1] = moe_prom_value(m, "moe_placement_balance_ratio{copies=\"placed\"}");
  out->plans = moe_prom_value(m, "moe_placement_plans_total");
  out->replans = moe_prom_value(m, "moe_placement_replans_total");
  out->copies_sent = moe_prom_value(m, "moe_placement_copies_sent_total");
  moe_free(m);
  return MOE_STATUS_OK;
}

static double pct(double *v, int n, double p) {
  if (n <= 0) return NAN;
  // nearest rank on sorted values
  int k = (int)ceil(p / 100.0 * n) - 1;
  if (k < 0) k = 0;
  if (k >= n) k = n - 1;
  return v[k];
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#if MOE_HAVE_CURL
#include <curl/curl.h>

typedef struct {
  const moe_loadgen_config *c;
  uint64_t t0;
  double *due_s;     // (requests): open loop arrival times
  int *plen, *olen;  // (requests)
  atomic_int next;
  pthread_mutex_t mu;  // the results below
  double *ttft, *lat, *itl;
  int n_ok, n_itl, itl_cap;
  int n_failed;
  long codes[8];  // non-200 statuses seen (first 8 kinds)
  int code_n[8];
  int64_t tokens;
  char first_error[256];
} lg_state;

typedef struct {
  lg_state *s;
  uint64_t start;  // when the request was due (ns)
  uint64_t last;   // last token's time
  int events;
  double first;  // ms
  double *gaps;  // this request's gaps (ms)
  int n_gaps, cap_gaps;
  char carry[512];  // an event cut between two writes
  size_t carry_len;
  int tokens_reported;
  int done_seen;
} lg_req;

static void on_event(lg_req *q, const char *ev, size_t n) {
  if (n >= 6 && memcmp(ev, "[DONE]", 6) == 0) {
    q->done_seen = 1;
    return;
  }
  const char *u = NULL;
  for (size_t i = 0; i + 20 < n && !u; i++)
    if (memcmp(ev + i, "\"completion_tokens\":", 20) == 0) u = ev + i + 20;
  if (u) {
    q->tokens_reported = atoi(u);
    return;  // the final chunk: no text
  }
  const uint64_t now = moe_time_ns();
  if (q->events == 0) {
    q->first = (double)(now - q->start) / 1e6;
  } else if (q->n_gaps < q->cap_gaps) {
    q->gaps[q->n_gaps++] = (double)(now - q->last) / 1e6;
  }
  q->last = now;
  q->events++;
}

// Splits the stream into "data: ...\n\n" events (an event may span writes).
static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *user) {
  lg_req *q = user;
  const size_t n = size * nmemb;
  for (size_t i = 0; i < n; i++) {
    if (q->carry_len < sizeof q->carry) q->carry[q->carry_len++] = ptr[i];
    if (q->carry_len >= 2 && q->carry[q->carry_len - 1] == '\n' &&
        q->carry[q->carry_len - 2] == '\n') {
      if (q->carry_len > 8 && memcmp(q->carry, "data: ", 6) == 0)
        on_event(q, q->carry + 6, q->carry_len - 8);
      q->carry_len = 0;
    }
  }
  return n;
}

static void record_failure(lg_state *s, long code, const char *msg) {
  pthread_mutex_lock(&s->mu);
  s->n_failed++;
  int k = 0;
  while (k < 8 && s->code_n[k] && s->codes[k] != code) k++;
  if (k < 8) {
    s->codes[k] = code;
    s->code_n[k]++;
  }
  if (!s->first_error[0]) snprintf(s->first_error, sizeof s->first_error, "%s", msg);
  pthread_mutex_unlock(&s->mu);
}

static void *worker(void *arg) {
  lg_state *s = arg;
  const moe_loadgen_config *c = s->c;
  CURL *h = curl_easy_init();
  char url[512];
  snprintf(url, sizeof url, "%s%s", c->url, c->chat ? "/v1/chat/completions" : "/v1/completions");
  struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
  const int cap_gaps = c->output_max + 1;
  double *gaps = moe_malloc((size_t)cap_gaps * sizeof(double));
  char *body = moe_malloc((size_t)c->prompt_max + 512);
  if (!h || !hdr || !gaps || !body) {
    record_failure(s, -1, "out of memory");
    goto out;
  }
  for (;;) {
    const int i = atomic_fetch_add(&s->next, 1);
    if (i >= c->requests) break;
    uint64_t due = s->t0;
    if (c->rate > 0) {
      due = s->t0 + (uint64_t)(s->due_s[i] * 1e9);
      const uint64_t now = moe_time_ns();
      if (due > now) {
        const uint64_t w = due - now;
        struct timespec ts = {(time_t)(w / 1000000000u), (long)(w % 1000000000u)};
        nanosleep(&ts, NULL);
      }
    } else {
      due = moe_time_ns();
    }
    // the prompt: pseudo-words of the drawn length, from the request's index
    moe_rng rng;
    moe_rng_init(&rng, c->seed, 1000 + (uint64_t)i);
    int o = c->chat ? snprintf(body, 64, "{\"messages\":[{\"role\":\"user\",\"content\":\"")
                    : snprintf(body, 64, "{\"prompt\":\"");
    for (int k = 0; k < s->plen[i]; k++) {
      const uint32_t r = moe_rng_u32(&rng) % 27u;
      body[o++] = r == 26 ? ' ' : (char)('a' + r);
    }
    o += snprintf(body + o, 400,
                  "\"%s,\"max_tokens\":%d,\"temperature\":%g,\"seed\":%d,\"stream\":true}",
                  c->chat ? "}]" : "", s->olen[i], c->temperature, i);
    lg_req q;
    memset(&q, 0, sizeof q);
    q.s = s;
    q.start = due;
    q.gaps = gaps;
    q.cap_gaps = cap_gaps;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)o);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &q);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(c->timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    const CURLcode rc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    const double lat = (double)(moe_time_ns() - due) / 1e6;
    if (rc != CURLE_OK || code != 200 || !q.done_seen) {
      char msg[256];
      snprintf(msg, sizeof msg, "request %d: %s (HTTP %ld)", i,
               rc != CURLE_OK ? curl_easy_strerror(rc) : "incomplete stream", code);
      record_failure(s, rc != CURLE_OK ? -1 : code, msg);
      continue;
    }
    pthread_mutex_lock(&s->mu);
    s->ttft[s->n_ok] = q.events > 0 ? q.first : lat;
    s->lat[s->n_ok] = lat;
    s->n_ok++;
    s->tokens += q.tokens_reported;
    for (int g = 0; g < q.n_gaps && s->n_itl < s->itl_cap; g++) s->itl[s->n_itl++] = q.gaps[g];
    pthread_mutex_unlock(&s->mu);
  }
out:
  moe_free(gaps);
  moe_free(body);
  curl_slist_free_all(hdr);
  if (h) curl_easy_cleanup(h);
  return NULL;
}

typedef struct {
  char *buf;
  size_t len, cap;
  int oom;
} get_buf;

static size_t get_cb(char *ptr, size_t size, size_t nmemb, void *user) {
  get_buf *b = user;
  const size_t n = size * nmemb;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 16384;
    while (cap < b->len + n + 1) cap *= 2;
    char *nb = moe_malloc(cap);
    if (!nb) {
      b->oom = 1;
      return 0;
    }
    if (b->buf) memcpy(nb, b->buf, b->len);
    moe_free(b->buf);
    b->buf = nb;
    b->cap = cap;
  }
  memcpy(b->buf + b->len, ptr, n);
  b->len += n;
  b->buf[b->len] = '\0';
  return n;
}

moe_status moe_http_get(moe_ctx *ctx, const char *url, const char *path, char **out) {
  moe_status st = MOE_STATUS_OK;
  get_buf b;
  memset(&b, 0, sizeof b);
  CURL *h = NULL;
  MOE_FAIL_IF(ctx, !url || !path || !out || strlen(url) + strlen(path) > 1000,
              MOE_STATUS_INVALID_ARG, "http get: a url and a path are needed");
  *out = NULL;
  char full[1024];
  snprintf(full, sizeof full, "%s%s", url, path);
  h = curl_easy_init();
  MOE_FAIL_IF(ctx, !h, MOE_STATUS_OUT_OF_MEMORY, "curl_easy_init failed");
  curl_easy_setopt(h, CURLOPT_URL, full);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, get_cb);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  const CURLcode rc = curl_easy_perform(h);
  long code = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  MOE_FAIL_IF(ctx, b.oom, MOE_STATUS_OUT_OF_MEMORY, "GET %s: out of memory", full);
  MOE_FAIL_IF(ctx, rc != CURLE_OK, MOE_STATUS_IO, "GET %s: %s (is the server running?)", full,
              curl_easy_strerror(rc));
  MOE_FAIL_IF(ctx, code != 200, MOE_STATUS_IO, "GET %s: HTTP %ld", full, code);
  *out = b.buf ? b.buf : moe_calloc(1, 1);
  b.buf = NULL;
done:
  moe_free(b.buf);
  if (h) curl_easy_cleanup(h);
  return st;
}

moe_status moe_loadgen_run(moe_ctx *ctx, const moe_loadgen_config *c, moe_loadgen_result *out) {
  moe_status st = MOE_STATUS_OK;
  lg_state s;
  memset(&s, 0, sizeof s);
  pthread_t *th = NULL;
  int started = 0;
  MOE_FAIL_IF(ctx, !c || !out || !c->url, MOE_STATUS_INVALID_ARG, "loadgen: arguments");
  memset(out, 0, sizeof *out);
  MOE_FAIL_IF(ctx, c->requests < 1 || c->requests > 1000000, MOE_STATUS_INVALID_ARG,
              "requests (%d) must be in [1, 1000000]", c->requests);
  MOE_FAIL_IF(ctx, c->concurrency < 1 || c->concurrency > 4096, MOE_STATUS_INVALID_ARG,
              "concurrency (%d) must be in [1, 4096]", c->concurrency);
  MOE_FAIL_IF(ctx, !(c->rate >= 0 && c->rate <= 1e6), MOE_STATUS_INVALID_ARG,
              "rate (%g) must be in [0, 1e6] requests/s (0: closed loop)", c->rate);
  MOE_FAIL_IF(ctx, c->prompt_min < 0 || c->prompt_max > 65536 || c->prompt_min > c->prompt_max,
              MOE_STATUS_INVALID_ARG, "prompt lengths [%d, %d] must be within [0, 65536]",
              c->prompt_min, c->prompt_max);
  MOE_FAIL_IF(ctx, c->output_min < 1 || c->output_max > 65536 || c->output_min > c->output_max,
              MOE_STATUS_INVALID_ARG, "output lengths [%d, %d] must be within [1, 65536]",
              c->output_min, c->output_max);
  MOE_FAIL_IF(ctx, strlen(c->url) > 400, MOE_STATUS_INVALID_ARG, "url too long");
  s.c = c;
  const size_t R = (size_t)c->requests;
  s.due_s = moe_calloc(R, sizeof(double));
  s.plen = moe_calloc(R, sizeof(int));
  s.olen = moe_calloc(R, sizeof(int));
  s.ttft = moe_calloc(R, sizeof(double));
  s.lat = moe_calloc(R, sizeof(double));
  s.itl_cap = c->requests * c->output_max > 50000000 ? 50000000 : c->requests * c->output_max;
  s.itl = moe_calloc((size_t)s.itl_cap + 1, sizeof(double));
  th = moe_calloc((size_t)c->concurrency, sizeof *th);
  MOE_FAIL_IF(ctx, !s.due_s || !s.plen || !s.olen || !s.ttft || !s.lat || !s.itl || !th,
              MOE_STATUS_OUT_OF_MEMORY, "loadgen: out of memory");
  moe_rng rng;
  moe_rng_init(&rng, c->seed, 7);
  double t = 0;
  for (int i = 0; i < c->requests; i++) {
    s.plen[i] =
        c->prompt_min + (int)(moe_rng_u32(&rng) % (uint32_t)(c->prompt_max - c->prompt_min + 1));
    s.olen[i] =
        c->output_min + (int)(moe_rng_u32(&rng) % (uint32_t)(c->output_max - c->output_min + 1));
    if (c->rate > 0) {
      t += -log(1.0 - (double)moe_rng_uniform(&rng)) / c->rate;
      s.due_s[i] = t;
    }
  }
  MOE_FAIL_IF(ctx, curl_global_init(CURL_GLOBAL_DEFAULT) != 0, MOE_STATUS_INTERNAL,
              "curl_global_init failed");
  pthread_mutex_init(&s.mu, NULL);
  atomic_init(&s.next, 0);
  s.t0 = moe_time_ns();
  for (; started < c->concurrency; started++)
    if (pthread_create(&th[started], NULL, worker, &s) != 0) break;
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  const double wall = (double)(moe_time_ns() - s.t0) / 1e9;
  pthread_mutex_destroy(&s.mu);
  curl_global_cleanup();
  MOE_FAIL_IF(ctx, started == 0, MOE_STATUS_INTERNAL, "loadgen: no worker thread started");
  out->ok = s.n_ok;
  out->failed = s.n_failed + (c->requests - s.n_ok - s.n_failed);
  out->wall_s = wall;
  out->tokens = s.tokens;
  out->requests_per_s = s.n_ok / wall;
  out->tokens_per_s = (double)s.tokens / wall;
  qsort(s.ttft, (size_t)s.n_ok, sizeof(double), cmp_double);
  qsort(s.lat, (size_t)s.n_ok, sizeof(double), cmp_double);
  qsort(s.itl, (size_t)s.n_itl, sizeof(double), cmp_double);
  const double ps[3] = {50, 95, 99};
  for (int k = 0; k < 3; k++) {
    out->ttft_ms[k] = pct(s.ttft, s.n_ok, ps[k]);
    out->itl_ms[k] = pct(s.itl, s.n_itl, ps[k]);
    out->latency_ms[k] = pct(s.lat, s.n_ok, ps[k]);
  }
  for (int k = 0; k < 8 && s.code_n[k]; k++) {
    out->fail_codes[k] = s.codes[k];
    out->fail_counts[k] = s.code_n[k];
  }
  snprintf(out->first_error, sizeof out->first_error, "%s", s.first_error);
done:
  moe_free(s.due_s);
  moe_free(s.plen);
  moe_free(s.olen);
  moe_free(s.ttft);
  moe_free(s.lat);
  moe_free(s.itl);
  moe_free(th);
  return st;
}

#else  // no libcurl

moe_status moe_http_get(moe_ctx *ctx, const char *url, const char *path, char **out) {
  moe_status st = MOE_STATUS_OK;
  (void)url;
  (void)path;
  if (out) *out = NULL;
  MOE_FAIL(ctx, MOE_STATUS_UNSUPPORTED,
           "this build has no HTTP client (install libcurl4-openssl-dev and rebuild)");
done:
  return st;
}

moe_status moe_loadgen_run(moe_ctx *ctx, const moe_loadgen_config *c, moe_loadgen_result *out) {
  moe_status st = MOE_STATUS_OK;
  (void)c;
  if (out) memset(out, 0, sizeof *out);
  (void)pct;
  (void)cmp_double;
  MOE_FAIL(ctx, MOE_STATUS_UNSUPPORTED,
           "this build has no HTTP client (install libcurl4-openssl-dev and rebuild)");
done:
  return st;
}

#endif
