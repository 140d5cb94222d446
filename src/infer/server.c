// The OpenAI-compatible HTTP server of `moe serve` (moe_serve_*, infer.h) on
// libmicrohttpd, one thread per connection.
//
// A completion request: the body is gathered (at most max_body bytes, else
// 413), parsed (moe_infer_request_from_json; 400 with the parser's message),
// queued (moe_infer_submit; 503 when the queue is full), and answered by a
// response whose content callback blocks until the engine's callbacks have
// produced its bytes: for "stream": true a server-sent event per text piece
// (a UTF-8 character split over tokens held back until complete), then a
// final chunk with finish_reason and usage and "data: [DONE]"; else one
// JSON object when the request ends. The request's state (http_req) is shared
// by the connection's thread and the engine's thread and freed by the last of
// the two to let go of it; a connection that ends before its request (the
// client went away) cancels it.
//
// Metrics (GET /metrics): request counts by endpoint and status, prompt and
// completion tokens, the engine's queue and running sequences, steps and rows,
// histograms of the request duration and the time to the first token.
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe/infer.h"
#include "moe_build_config.h"

void moe_serve_config_default(moe_serve_config *sc) {
  memset(sc, 0, sizeof *sc);
  sc->host = "127.0.0.1";
  sc->port = 8080;
  sc->max_body = (size_t)1 << 20;
  sc->max_connections = 256;
  sc->model = "moe-gpt";
}

#if MOE_HAVE_MHD
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

// Latency histogram buckets (seconds), Prometheus style (cumulative on output).
#define N_BUCKETS 12
static const double k_buckets[N_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                            0.5,   1.0,  2.5,   5.0,  10,  30};

typedef struct {
  uint64_t count[N_BUCKETS + 1];  // the last: +Inf
  double sum;
  uint64_t n;
} histogram;

static void hist_add(histogram *h, double v) {
  int b = 0;
  while (b < N_BUCKETS && v > k_buckets[b]) b++;
  h->count[b]++;
  h->sum += v;
  h->n++;
}

enum { EP_COMPLETIONS = 0, EP_CHAT, EP_MODELS, EP_HEALTH, EP_METRICS, EP_OTHER, EP_COUNT };
static const char *const k_ep_names[EP_COUNT] = {"completions", "chat_completions", "models",
                                                 "health",      "metrics",          "other"};
enum { ST_2XX = 0, ST_400, ST_404, ST_405, ST_413, ST_503, ST_COUNT };
static const char *const k_st_names[ST_COUNT] = {"200", "400", "404", "405", "413", "503"};

struct moe_server {
  moe_ctx *ctx;
  moe_infer *engine;
  moe_serve_config sc;
  char model[128];
  struct MHD_Daemon *d;
  int port;
  pthread_mutex_t mu;  // the metrics and quiescing
  int quiesced;
  int active;  // completion responses not yet fully sent
  uint64_t requests[EP_COUNT][ST_COUNT];
  uint64_t prompt_tokens, completion_tokens, finished[3];
  histogram duration, first_token;
  int64_t next_cmpl;
};

// One completion request, shared by the connection and the engine.
typedef struct {
  moe_server *srv;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;  // the connection's and the engine's
  int chat, stream, done;
  int64_t id;
  char cmpl_id[48];
  long created;
  char *out;  // bytes ready for the client
  size_t len, cap, sent;
  int oom;
  int counted;   // in srv->active
  char pend[4];  // a stream's text bytes held back: a UTF-8 character not yet complete
  size_t n_pend;
} http_req;

// Gathered body of a POST (the connection's con_cls).
typedef struct {
  char *body;
  size_t len, cap;
  int too_large;
  int is_post;
} conn_state;

// Grows a moe_malloc'd buffer to hold need bytes (moe_malloc has no realloc).
static int grow(char **buf, size_t *cap, size_t used, size_t need) {
  if (need <= *cap) return 1;
  size_t c = *cap ? *cap : 1024;
  while (c < need) c *= 2;
  char *b = moe_malloc(c);
  if (!b) return 0;
  if (*buf) memcpy(b, *buf, used);
  moe_free(*buf);
  *buf = b;
  *cap = c;
  return 1;
}

static void count(moe_server *s, int ep, int st) {
  pthread_mutex_lock(&s->mu);
  s->requests[ep][st]++;
  pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned code, const char *type,
                                 const char *text) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", type);
  const enum MHD_Result ok = MHD_queue_response(c, code, r);
  MHD_destroy_response(r);
  return ok;
}

// {"error": {...}} with the message as a JSON string.
static enum MHD_Result send_error(moe_server *s, struct MHD_Connection *c, int ep, unsigned code,
                                  const char *type, const char *msg) {
  const int st = code == 400   ? ST_400
                 : code == 404 ? ST_404
                 : code == 405 ? ST_405
                 : code == 413 ? ST_413
                               : ST_503;
  count(s, ep, st);
  char *m = moe_infer_json_string(msg, strlen(msg));  // up to 6 bytes per byte of msg
  const size_t len = (m ? strlen(m) : 8) + strlen(type) + 64;
  char *buf = moe_malloc(len);
  enum MHD_Result r;
  if (buf) {
    snprintf(buf, len,
             "{\"error\":{\"message\":%s,\"type\":\"%s\",\"param\":null,\"code\":null}}\n",
             m ? m : "\"error\"", type);
    r = send_text(c, code, "application/json", buf);
  } else {
    r = send_text(c, code, "application/json",
                  "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                  "\"param\":null,\"code\":null}}\n");
  }
  moe_free(buf);
  moe_free(m);
  return r;
}

// ---- the request's bytes --------------------------------------------------------------

static void req_append(http_req *q, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void req_append(http_req *q, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || q->oom) {
    va_end(ap2);
    return;
  }
  if (!grow(&q->out, &q->cap, q->len, q->len + (size_t)n + 1)) {
    q->oom = 1;
    va_end(ap2);
    return;
  }
  vsnprintf(q->out + q->len, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  q->len += (size_t)n;
}

static void req_release(http_req *q) {
  pthread_mutex_lock(&q->mu);
  const int left = --q->refs;
  pthread_mutex_unlock(&q->mu);
  if (left > 0) return;
  pthread_mutex_destroy(&q->mu);
  pthread_cond_destroy(&q->cv);
  moe_free(q->out);
  moe_free(q);
}

// A streamed chunk's head: the shape of the chunk objects of each endpoint.
static void chunk_head(http_req *q) {
  req_append(
      q, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":\"%s\",\"choices\":[{",
      q->cmpl_id, q->chat ? "chat.completion.chunk" : "text_completion", q->created, q->srv->model);
}

// Where the bytes b[0..n) may be cut for a stream chunk: before a UTF-8
// character that starts in the last 3 bytes and would need bytes not yet
// there (a lead byte followed by continuation bytes only). Tokens are bytes,
// so a character can span tokens; the text up to the cut decodes
// (moe_infer_json_string) as it does inside the whole text, so the chunks'
// concatenation equals the non-streamed text.
static size_t utf8_cut(const unsigned char *b, size_t n) {
  for (size_t i = n > 3 ? n - 3 : 0; i < n; i++) {
    const size_t need = b[i] >= 0xF0 && b[i] <= 0xF7   ? 4
                        : b[i] >= 0xE0 && b[i] <= 0xEF ? 3
                        : b[i] >= 0xC0 && b[i] <= 0xDF ? 2
                                                       : 0;
    if (need == 0 || i + need <= n) continue;
    size_t j = i + 1;
    while (j < n && (b[j] & 0xC0) == 0x80) j++;
    if (j == n) return i;
  }
  return n;
}

// A stream chunk with the text bytes b[0..n) (q->mu held).
static void stream_text(http_req *q, const char *b, size_t n) {
  char *js = moe_infer_json_string(b, n);
  if (js) {
    chunk_head(q);
    if (q->chat)
      req_append(q, "\"index\":0,\"delta\":{\"content\":%s},\"finish_reason\":null}]}\n\n", js);
    else
      req_append(q, "\"text\":%s,\"index\":0,\"logprobs\":null,\"finish_reason\":null}]}\n\n", js);
  } else {
    q->oom = 1;
  }
  moe_free(js);
}

static void on_text(void *user, int64_t id, const char *bytes, size_t n) {
  (void)id;
  http_req *q = user;
  if (!q->stream) return;
  pthread_mutex_lock(&q->mu);
  // the bytes held back, then these: up to the cut now, the rest held
  char *all = moe_malloc(q->n_pend + n);
  if (all) {
    memcpy(all, q->pend, q->n_pend);
    memcpy(all + q->n_pend, bytes, n);
    const size_t total = q->n_pend + n, cut = utf8_cut((const unsigned char *)all, total);
    if (cut > 0) stream_text(q, all, cut);
    q->n_pend = total - cut;  // at most 3
    memcpy(q->pend, all + cut, q->n_pend);
  } else {
    q->oom = 1;
  }
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  moe_free(all);
}

static void on_done(void *user, int64_t id, const moe_infer_result *r) {
  (void)id;
  http_req *q = user;
  moe_server *s = q->srv;
  const char *fin = moe_infer_finish_name(r->finish);  // stop, length, cancelled
  char usage[160];
  snprintf(usage, sizeof usage,
           "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", r->prompt_tokens,
           r->completion_tokens, r->prompt_tokens + r->completion_tokens);
  char *js = q->stream ? NULL : moe_infer_json_string(r->text, r->text_len);
  pthread_mutex_lock(&q->mu);
  if (q->stream) {
    if (q->n_pend > 0) stream_text(q, q->pend, q->n_pend);  // a character the text ends inside
    q->n_pend = 0;
    chunk_head(q);
    if (q->chat)
      req_append(q, "\"index\":0,\"delta\":{},\"finish_reason\":\"%s\"}],\"usage\":%s}\n\n", fin,
                 usage);
    else
      req_append(q,
                 "\"text\":\"\",\"index\":0,\"logprobs\":null,\"finish_reason\":\"%s\"}],"
                 "\"usage\":%s}\n\n",
                 fin, usage);
    req_append(q, "data: [DONE]\n\n");
  } else if (js) {
    if (q->chat)
      req_append(q,
                 "{\"id\":\"%s\",\"object\":\"chat.completion\",\"created\":%ld,\"model\":\"%s\","
                 "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":%s},"
                 "\"finish_reason\":\"%s\"}],\"usage\":%s}\n",
                 q->cmpl_id, q->created, s->model, js, fin, usage);
    else
      req_append(q,
                 "{\"id\":\"%s\",\"object\":\"text_completion\",\"created\":%ld,\"model\":\"%s\","
                 "\"choices\":[{\"text\":%s,\"index\":0,\"logprobs\":null,\"finish_reason\":\"%s\"}"
                 "],\"usage\":%s}\n",
                 q->cmpl_id, q->created, s->model, js, fin, usage);
  } else {
    q->oom = 1;
  }
  q->done = 1;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  moe_free(js);
  pthread_mutex_lock(&s->mu);
  s->prompt_tokens += (uint64_t)r->prompt_tokens;
  s->completion_tokens += (uint64_t)r->completion_tokens;
  s->finished[r->finish]++;
  hist_add(&s->duration, r->total_ms / 1000);
  if (r->first_token_ms > 0) hist_add(&s->first_token, r->first_token_ms / 1000);
  pthread_mutex_unlock(&s->mu);
  req_release(q);
}

// The response's content: blocks until bytes are ready or the request ended.
static ssize_t read_cb(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  http_req *q = cls;
  pthread_mutex_lock(&q->mu);
  while (q->sent == q->len && !q->done && !q->oom) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&q->cv, &q->mu, &ts);
  }
  ssize_t n;
  if (q->oom) {
    n = MHD_CONTENT_READER_END_WITH_ERROR;
  } else if (q->sent < q->len) {
    const size_t k = q->len - q->sent < max ? q->len - q->sent : max;
    memcpy(buf, q->out + q->sent, k);
    q->sent += k;
    n = (ssize_t)k;
  } else {
    n = MHD_CONTENT_READER_END_OF_STREAM;
  }
  pthread_mutex_unlock(&q->mu);
  return n;
}

// The connection is done with the response: cancel the request if it still runs.
static void free_cb(void *cls) {
  http_req *q = cls;
  moe_server *s = q->srv;
  pthread_mutex_lock(&q->mu);
  const int running = !q->done, counted = q->counted;
  pthread_mutex_unlock(&q->mu);
  if (running) moe_infer_cancel(s->engine, q->id);
  req_release(q);
  if (counted) {
    pthread_mutex_lock(&s->mu);
    s->active--;
    pthread_mutex_unlock(&s->mu);
  }
}

static enum MHD_Result completion(moe_server *s, struct MHD_Connection *c, int ep,
                                  const conn_state *cs) {
  moe_infer_params defaults;
  moe_infer_params_default(&defaults);
  moe_infer_request rq;
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK)
    return send_error(s, c, ep, 503, "server_error", "out of memory");
  const unsigned flags = ep == EP_CHAT ? MOE_INFER_JSON_CHAT : 0;
  if (moe_infer_request_from_json(ctx, cs->body ? cs->body : "", cs->len, &defaults, flags, &rq) !=
      MOE_STATUS_OK) {
    const enum MHD_Result r =
        send_error(s, c, ep, 400, "invalid_request_error", moe_ctx_error(ctx));
    moe_ctx_destroy(ctx);
    return r;
  }
  http_req *q = moe_calloc(1, sizeof *q);
  if (!q || pthread_mutex_init(&q->mu, NULL) != 0) {
    moe_free(q);
    moe_infer_request_free(&rq);
    moe_ctx_destroy(ctx);
    return send_error(s, c, ep, 503, "server_error", "out of memory");
  }
  pthread_cond_init(&q->cv, NULL);
  q->srv = s;
  q->chat = ep == EP_CHAT;
  q->stream = rq.stream;
  q->created = (long)time(NULL);
  q->refs = 2;
  pthread_mutex_lock(&s->mu);
  const int64_t n = ++s->next_cmpl;
  pthread_mutex_unlock(&s->mu);
  snprintf(q->cmpl_id, sizeof q->cmpl_id, "%s-%lld", q->chat ? "chatcmpl" : "cmpl", (long long)n);
  // the response first, so that nothing can fail after the request is queued
  struct MHD_Response *r =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, read_cb, q, free_cb);
  if (!r) {
    q->refs = 1;
    req_release(q);
    moe_infer_request_free(&rq);
    moe_ctx_destroy(ctx);
    return send_error(s, c, ep, 503, "server_error", "out of memory");
  }
  moe_infer_callbacks cb = {on_text, on_done, q};
  int64_t id = 0;
  pthread_mutex_lock(&q->mu);  // the engine may finish before q->id is set
  if (q->stream && q->chat) {  // a chat stream opens with the assistant's role
    chunk_head(q);
    req_append(q, "\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n");
  }
  const moe_status st =
      moe_infer_submit(s->engine, ctx, rq.prompt, rq.prompt_len, &rq.params, &cb, &id);
  q->id = id;
  pthread_mutex_unlock(&q->mu);
  moe_infer_request_free(&rq);
  enum MHD_Result res;
  if (st != MOE_STATUS_OK) {
    q->done = 1;  // no engine reference: the response's free_cb drops the last one
    q->refs = 1;
    res = send_error(s, c, ep, st == MOE_STATUS_BUSY ? 503 : 400,
                     st == MOE_STATUS_BUSY ? "server_error" : "invalid_request_error",
                     moe_ctx_error(ctx));
  } else {
    count(s, ep, ST_2XX);
    pthread_mutex_lock(&s->mu);
    s->active++;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&q->mu);
    q->counted = 1;
    pthread_mutex_unlock(&q->mu);
    MHD_add_response_header(r, "Content-Type",
                            q->stream ? "text/event-stream" : "application/json");
    if (q->stream) MHD_add_response_header(r, "Cache-Control", "no-cache");
    res = MHD_queue_response(c, MHD_HTTP_OK, r);
  }
  MHD_destroy_response(r);  // free_cb runs when MHD lets go of it
  moe_ctx_destroy(ctx);
  return res;
}

static enum MHD_Result metrics(moe_server *s, struct MHD_Connection *c) {
  moe_infer_stats es;
  moe_infer_get_stats(s->engine, &es);
  size_t cap = 65536, o = 0;
  char *b = moe_malloc(cap);
  if (!b) return send_error(s, c, EP_METRICS, 503, "server_error", "out of memory");
#define P(...) o += (size_t)snprintf(b + o, o < cap ? cap - o : 0, __VA_ARGS__)
  pthread_mutex_lock(&s->mu);
  s->requests[EP_METRICS][ST_2XX]++;
  P("# HELP moe_http_requests_total HTTP requests by endpoint and status code.\n"
    "# TYPE moe_http_requests_total counter\n");
  for (int e = 0; e < EP_COUNT; e++)
    for (int t = 0; t < ST_COUNT; t++)
      if (s->requests[e][t])
        P("moe_http_requests_total{endpoint=\"%s\",code=\"%s\"} %llu\n", k_ep_names[e],
          k_st_names[t], (unsigned long long)s->requests[e][t]);
  P("# HELP moe_requests_finished_total Completions finished, by reason.\n"
    "# TYPE moe_requests_finished_total counter\n"
    "moe_requests_finished_total{reason=\"length\"} %llu\n"
    "moe_requests_finished_total{reason=\"stop\"} %llu\n"
    "moe_requests_finished_total{reason=\"cancelled\"} %llu\n",
    (unsigned long long)s->finished[0], (unsigned long long)s->finished[1],
    (unsigned long long)s->finished[2]);
  P("# HELP moe_prompt_tokens_total Prompt tokens (bytes) of finished completions.\n"
    "# TYPE moe_prompt_tokens_total counter\nmoe_prompt_tokens_total %llu\n"
    "# HELP moe_completion_tokens_total Tokens generated by finished completions.\n"
    "# TYPE moe_completion_tokens_total counter\nmoe_completion_tokens_total %llu\n",
    (unsigned long long)s->prompt_tokens, (unsigned long long)s->completion_tokens);
  const histogram *hs[2] = {&s->duration, &s->first_token};
  const char *hn[2] = {"moe_request_duration_seconds", "moe_time_to_first_token_seconds"};
  const char *hh[2] = {"From a request's arrival to its last token.",
                       "From a request's arrival to its first token."};
  for (int h = 0; h < 2; h++) {
    P("# HELP %s %s\n# TYPE %s histogram\n", hn[h], hh[h], hn[h]);
    uint64_t cum = 0;
    for (int k = 0; k < N_BUCKETS; k++) {
      cum += hs[h]->count[k];
      P("%s_bucket{le=\"%g\"} %llu\n", hn[h], k_buckets[k], (unsigned long long)cum);
    }
    P("%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", hn[h],
      (unsigned long long)hs[h]->n, hn[h], hs[h]->sum, hn[h], (unsigned long long)hs[h]->n);
  }
  pthread_mutex_unlock(&s->mu);
  P("# HELP moe_queue_length Requests waiting for a slot.\n# TYPE moe_queue_length gauge\n"
    "moe_queue_length %d\n"
    "# HELP moe_running_sequences Sequences in a KV-cache slot.\n"
    "# TYPE moe_running_sequences gauge\nmoe_running_sequences %d\n"
    "# HELP moe_engine_steps_total Engine steps with rows.\n# TYPE moe_engine_steps_total counter\n"
    "moe_engine_steps_total %lld\n"
    "# HELP moe_engine_rows_total Rows computed (prefill and decode), all ranks.\n"
    "# TYPE moe_engine_rows_total counter\nmoe_engine_rows_total %lld\n"
    "# HELP moe_engine_prefill_rows_total Prompt rows computed.\n"
    "# TYPE moe_engine_prefill_rows_total counter\nmoe_engine_prefill_rows_total %lld\n"
    "# HELP moe_engine_tokens_total Tokens sampled.\n# TYPE moe_engine_tokens_total counter\n"
    "moe_engine_tokens_total %lld\n"
    "# HELP moe_engine_batch_sequences_max Most sequences in one step so far.\n"
    "# TYPE moe_engine_batch_sequences_max gauge\nmoe_engine_batch_sequences_max %d\n"
    "# HELP moe_engine_step_seconds_total Time in engine steps (rank 0).\n"
    "# TYPE moe_engine_step_seconds_total counter\nmoe_engine_step_seconds_total %.6f\n",
    es.waiting, es.running, (long long)es.steps, (long long)es.rows, (long long)es.prefill_rows,
    (long long)es.tokens, es.max_batch_seqs, es.step_ms / 1000);
  P("# HELP moe_engine_moe_seconds_total Time in a block's MoE layer forwards (rank 0).\n"
    "# TYPE moe_engine_moe_seconds_total counter\n");
  const int L = moe_infer_model_config(s->engine)->n_layer;
  for (int l = 0; l < L; l++) {
    double mm = 0, am = 0;
    moe_infer_layer_times(s->engine, l, &mm, &am, NULL);
    if (mm > 0) P("moe_engine_moe_seconds_total{block=\"%d\"} %.6f\n", l, mm / 1000);
  }
  P("# HELP moe_engine_a2a_seconds_total Time in a block's MoE all-to-alls (rank 0).\n"
    "# TYPE moe_engine_a2a_seconds_total counter\n");
  for (int l = 0; l < L; l++) {
    double mm = 0, am = 0;
    moe_infer_layer_times(s->engine, l, &mm, &am, NULL);
    if (mm > 0) P("moe_engine_a2a_seconds_total{block=\"%d\"} %.6f\n", l, am / 1000);
  }
  P("# HELP moe_engine_place_seconds_total Time in a block's expert placement (rank 0; eplb: "
    "each plan spread evenly over the blocks).\n# TYPE moe_engine_place_seconds_total counter\n");
  for (int l = 0; l < L; l++) {
    double mm = 0, pm = 0;
    moe_infer_layer_times(s->engine, l, &mm, NULL, &pm);
    if (mm > 0) P("moe_engine_place_seconds_total{block=\"%d\"} %.6f\n", l, pm / 1000);
  }
  {
    const double q[3] = {0.5, 0.95, 0.99};
    double lm[3], am[3];
    const int k = moe_infer_layer_quantiles(s->engine, q, 3, lm, am);
    double msum = 0, asum = 0;  // _count and _sum: every sample, the quantiles the last 65536
    const long long all = (long long)moe_infer_layer_samples(s->engine, &msum, &asum);
    P("# HELP moe_engine_moe_layer_seconds A MoE layer's forward per step and block (rank 0; "
      "quantiles of the last 65536).\n# TYPE moe_engine_moe_layer_seconds summary\n");
    for (int i = 0; i < 3 && k > 0; i++)
      P("moe_engine_moe_layer_seconds{quantile=\"%g\"} %.6f\n", q[i], lm[i] / 1000);
    P("moe_engine_moe_layer_seconds_sum %.6f\nmoe_engine_moe_layer_seconds_count %lld\n",
      msum / 1000, all);
    P("# HELP moe_engine_a2a_layer_seconds Its all-to-alls per step and block (rank 0; "
      "quantiles of the last 65536).\n# TYPE moe_engine_a2a_layer_seconds summary\n");
    for (int i = 0; i < 3 && k > 0; i++)
      P("moe_engine_a2a_layer_seconds{quantile=\"%g\"} %.6f\n", q[i], am[i] / 1000);
    P("moe_engine_a2a_layer_seconds_sum %.6f\nmoe_engine_a2a_layer_seconds_count %lld\n",
      asum / 1000, all);
  }
  P("# HELP moe_path_checks_total Steps whose estimated popularity (--paths) was checked "
    "against the gate, per block.\n# TYPE moe_path_checks_total counter\n"
    "# HELP moe_path_accurate_total Of those, with the estimated top-2K equal to the gate's "
    "(Lina's accuracy).\n# TYPE moe_path_accurate_total counter\n"
    "# HELP moe_path_finetune_total Of those, with another set of top-2K experts (Lina's phase "
    "2 would re-plan).\n# TYPE moe_path_finetune_total counter\n");
  for (int l = 0; l < L; l++) {
    int64_t ev = 0, ac = 0, ft = 0;
    moe_infer_path_stats(s->engine, l, &ev, &ac, &ft);
    if (ev > 0)
      P("moe_path_checks_total{block=\"%d\"} %lld\nmoe_path_accurate_total{block=\"%d\"} "
        "%lld\nmoe_path_finetune_total{block=\"%d\"} %lld\n",
        l, (long long)ev, l, (long long)ac, l, (long long)ft);
  }
  P("# HELP moe_placement_balance_ratio Mean balance ratio (most rows a rank computed / mean) "
    "over the steps and MoE blocks, without copies and as placed (placement other than "
    "uniform).\n# TYPE moe_placement_balance_ratio gauge\n"
    "moe_placement_balance_ratio{copies=\"none\"} %.6f\n"
    "moe_placement_balance_ratio{copies=\"placed\"} %.6f\n"
    "# HELP moe_placement_plans_total Placement plans made (per MoE block).\n"
    "# TYPE moe_placement_plans_total counter\nmoe_placement_plans_total %lld\n"
    "# HELP moe_placement_copies_sent_total Expert copies whose parameters moved.\n"
    "# TYPE moe_placement_copies_sent_total counter\nmoe_placement_copies_sent_total %lld\n"
    "# HELP moe_placement_copies Expert copies in force, over the MoE blocks.\n"
    "# TYPE moe_placement_copies gauge\nmoe_placement_copies %d\n"
    "# HELP moe_placement_seconds_total Time in placement steps (rank 0).\n"
    "# TYPE moe_placement_seconds_total counter\nmoe_placement_seconds_total %.6f\n"
    "# HELP moe_placement_replans_total Lina's phase-2 re-plans (the estimated top-2K experts "
    "missed).\n# TYPE moe_placement_replans_total counter\nmoe_placement_replans_total %lld\n",
    es.balance_uniform, es.balance_placed, (long long)es.plans, (long long)es.copies_sent,
    es.copies, es.place_ms / 1000, (long long)es.replans);
#undef P
  enum MHD_Result r;
  if (o >= cap) {
    r = send_error(s, c, EP_METRICS, 503, "server_error", "metrics overflow");
  } else {
    r = send_text(c, MHD_HTTP_OK, "text/plain; version=0.0.4", b);
  }
  moe_free(b);
  return r;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls) {
  (void)version;
  moe_server *s = cls;
  const int post = strcmp(method, "POST") == 0, get = strcmp(method, "GET") == 0;
  int ep = EP_OTHER;
  if (strcmp(url, "/v1/completions") == 0) ep = EP_COMPLETIONS;
  if (strcmp(url, "/v1/chat/completions") == 0) ep = EP_CHAT;
  if (strcmp(url, "/v1/models") == 0) ep = EP_MODELS;
  if (strcmp(url, "/health") == 0) ep = EP_HEALTH;
  if (strcmp(url, "/metrics") == 0) ep = EP_METRICS;
  conn_state *cs = *con_cls;
  if (!cs) {  // the first call: headers only
    cs = moe_calloc(1, sizeof *cs);
    if (!cs) return MHD_NO;
    // no Nagle: a response goes out in small writes (headers, each streamed
    // token, the chunked end) that must not wait for the client's delayed ACK
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) {
      const int one = 1;
      setsockopt(ci->connect_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    cs->is_post = post;
    *con_cls = cs;
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (post && cl && strtoull(cl, NULL, 10) > s->sc.max_body) cs->too_large = 1;
    return MHD_YES;
  }
  if (*upload_size > 0 && !post) {  // another method's body: read and dropped, then 404/405
    *upload_size = 0;
    return MHD_YES;
  }
  if (post && *upload_size > 0) {  // body bytes
    if (!cs->too_large && cs->len + *upload_size > s->sc.max_body) cs->too_large = 1;
    if (!cs->too_large) {
      if (!grow(&cs->body, &cs->cap, cs->len, cs->len + *upload_size + 1)) return MHD_NO;
      memcpy(cs->body + cs->len, upload, *upload_size);
      cs->len += *upload_size;
    }
    *upload_size = 0;
    return MHD_YES;
  }
  // the request is complete
  if (ep == EP_OTHER)
    return send_error(s, c, ep, 404, "invalid_request_error",
                      "unknown path (POST /v1/completions, POST /v1/chat/completions, GET "
                      "/v1/models, /health, /metrics)");
  const int want_post = ep == EP_COMPLETIONS || ep == EP_CHAT;
  if ((want_post && !post) || (!want_post && !get))
    return send_error(s, c, ep, 405, "invalid_request_error",
                      want_post ? "use POST for this path" : "use GET for this path");
  if (cs->too_large) {
    char msg[128];
    snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->sc.max_body);
    return send_error(s, c, ep, 413, "invalid_request_error", msg);
  }
  pthread_mutex_lock(&s->mu);
  const int quiesced = s->quiesced;
  pthread_mutex_unlock(&s->mu);
  if (ep == EP_HEALTH) {
    if (quiesced) return send_error(s, c, ep, 503, "server_error", "shutting down");
    count(s, ep, ST_2XX);
    return send_text(c, MHD_HTTP_OK, "application/json", "{\"status\":\"ok\"}\n");
  }
  if (ep == EP_MODELS) {
    char buf[512];
    snprintf(buf, sizeof buf,
             "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\",\"created\":0,"
             "\"owned_by\":\"libmoe\"}]}\n",
             s->model);
    count(s, ep, ST_2XX);
    return send_text(c, MHD_HTTP_OK, "application/json", buf);
  }
  if (ep == EP_METRICS) return metrics(s, c);
  if (quiesced) return send_error(s, c, ep, 503, "server_error", "the server is shutting down");
  return completion(s, c, ep, cs);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)c;
  (void)toe;
  conn_state *cs = *con_cls;
  if (!cs) return;
  moe_free(cs->body);
  moe_free(cs);
  *con_cls = NULL;
}

moe_status moe_serve_start(moe_ctx *ctx, moe_infer *e, const moe_serve_config *sc,
                           moe_server **out) {
  moe_status st = MOE_STATUS_OK;
  moe_server *s = NULL;
  MOE_FAIL_IF(ctx, !e || !sc || !out, MOE_STATUS_INVALID_ARG, "serve: arguments must not be NULL");
  *out = NULL;
  MOE_FAIL_IF(ctx, sc->port < 0 || sc->port > 65535, MOE_STATUS_INVALID_ARG,
              "port (%d) must be in [0, 65535]", sc->port);
  MOE_FAIL_IF(ctx, sc->max_body < 64 || sc->max_body > ((size_t)1 << 30), MOE_STATUS_INVALID_ARG,
              "max body (%zu bytes) must be in [64, 1 GiB]", sc->max_body);
  MOE_FAIL_IF(ctx, sc->max_connections < 1 || sc->max_connections > 65536, MOE_STATUS_INVALID_ARG,
              "max connections (%d) must be in [1, 65536]", sc->max_connections);
  {  // the name goes into every response as is: text JSON needs no escape for
    const size_t n = sc->model ? strlen(sc->model) : 0;
    char *js = sc->model && n < 128 ? moe_infer_json_string(sc->model, n) : NULL;
    const int plain = js && strlen(js) == n + 2 && memcmp(js + 1, sc->model, n) == 0;
    moe_free(js);
    MOE_FAIL_IF(ctx, !plain, MOE_STATUS_INVALID_ARG,
                "the model name must be under 128 bytes of valid UTF-8 with no quote, backslash "
                "or control character");
  }
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)sc->port);
  MOE_FAIL_IF(ctx, !sc->host || inet_pton(AF_INET, sc->host, &addr.sin_addr) != 1,
              MOE_STATUS_INVALID_ARG, "host '%s' must be an IPv4 address (e.g. 127.0.0.1)",
              sc->host ? sc->host : "(null)");
  s = moe_calloc(1, sizeof *s);
  MOE_FAIL_IF(ctx, !s, MOE_STATUS_OUT_OF_MEMORY, "serve: out of memory");
  MOE_FAIL_IF(ctx, pthread_mutex_init(&s->mu, NULL) != 0, MOE_STATUS_INTERNAL, "mutex init");
  s->ctx = ctx;
  s->engine = e;
  s->sc = *sc;
  snprintf(s->model, sizeof s->model, "%s", sc->model);
  s->d = MHD_start_daemon(
      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC, 0, NULL, NULL,
      handler, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT,
      (unsigned)sc->max_connections, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, MHD_OPTION_END);
  if (!s->d) {
    pthread_mutex_destroy(&s->mu);
    MOE_FAIL(ctx, MOE_STATUS_IO,
             "cannot listen on %s:%d (in use, or not an address of this machine)", sc->host,
             sc->port);
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
  s->port = di ? di->port : sc->port;
  *out = s;
  s = NULL;
done:
  moe_free(s);
  return st;
}

int moe_serve_port(const moe_server *s) { return s->port; }

void moe_serve_quiesce(moe_server *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->quiesced = 1;
  pthread_mutex_unlock(&s->mu);
}

void moe_serve_stop(moe_server *s) {
  if (!s) return;
  // the answers of ended requests still on their way to the clients go out
  // first (at most 10 s): stopping the daemon closes every connection
  for (int i = 0; i < 1000; i++) {
    pthread_mutex_lock(&s->mu);
    const int active = s->active;
    pthread_mutex_unlock(&s->mu);
    if (active == 0) break;
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  MHD_stop_daemon(s->d);
  pthread_mutex_destroy(&s->mu);
  moe_free(s);
}

#else  // no libmicrohttpd

moe_status moe_serve_start(moe_ctx *ctx, moe_infer *e, const moe_serve_config *sc,
                           moe_server **out) {
  moe_status st = MOE_STATUS_OK;
  (void)e;
  (void)sc;
  if (out) *out = NULL;
  MOE_FAIL(ctx, MOE_STATUS_UNSUPPORTED,
           "this build has no HTTP server (install libmicrohttpd-dev and rebuild)");
done:
  return st;
}
int moe_serve_port(const moe_server *s) {
  (void)s;
  return 0;
}
void moe_serve_quiesce(moe_server *s) { (void)s; }
void moe_serve_stop(moe_server *s) { (void)s; }

#endif
