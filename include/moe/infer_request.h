// The MPI-free half of the inference API (moe/infer.h includes it): request
// parameters, completion requests as JSON (the OpenAI shapes), the sampler,
// JSON text of completions, and `moe bench serve`'s load generator (an HTTP
// client; libcurl). Compiled in every build, so the fuzzers reach the parsers.
#ifndef MOE_INFER_REQUEST_H
#define MOE_INFER_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "moe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

// Expert placement while serving (docs/inference.md "Expert placement"):
// which ranks hold copies of which experts, planned from the load the steps
// observed. A copy computes its own rank's rows for its expert, so a rank that
// sends a popular expert many rows computes them itself; the tokens, logits
// and text are the same under every placement (the math is the layer's).
// One X(ENUM, name) line each: the enum, the names and the lists in messages.
//   uniform  every expert on its home rank only (block placement; default)
//   eplb     EPLB's redundant slots: place_slots copies per rank, filled with
//            the experts of the highest load per copy (moe_balance_plan_eplb)
//            from the mean load of the last place_window steps, re-planned
//            every place_every steps (each rank keeps its own rows' window;
//            they are all-gathered only at a plan); the parameters move only
//            to copies placed anew (pc.frozen_params)
//   lina     Lina's two phases (ATC'23). Phase 1: before each MoE block's
//            forward of a step, its popularity is estimated from the step's
//            tokens' paths (the profile given as `paths`: every rank
//            estimates its own tokens; the all-gather of the estimates is
//            posted after the previous block's gate and overlaps its work),
//            copies are allocated from that estimate as Lina does
//            (moe_balance_plan_lina: an expert with share s of the rows gets
//            round(P s) ranks; place_slots per rank) and placed when the plan
//            changed; the first block uses the profile's marginal. Phase 2
//            (place_phase2): after the block's gate, when the actual top-2K
//            experts are not the estimated ones (as sets), the block is
//            re-planned from its actual load before the dispatch (stats
//            replans).
#define MOE_INFER_PLACEMENTS(X) \
  X(UNIFORM, uniform)           \
  X(EPLB, eplb)                 \
  X(LINA, lina)

#define MOE_INFER_PLACEMENT_ENUM_(U, l) MOE_INFER_PLACE_##U,
typedef enum {
  MOE_INFER_PLACEMENTS(MOE_INFER_PLACEMENT_ENUM_) MOE_INFER_PLACEMENT_COUNT_
} moe_infer_placement;
#undef MOE_INFER_PLACEMENT_ENUM_
// The placement called `name`, or -1 (also for NULL).
int moe_infer_placement_find(const char *name);
// Its name, or NULL when out of range.
const char *moe_infer_placement_name(int placement);
// "uniform, eplb, lina": every name, in catalogue order (static).
const char *moe_infer_placement_names(void);

#define MOE_INFER_MAX_STOP 4     // stop strings per request
#define MOE_INFER_STOP_BYTES 64  // bytes of one stop string at most

typedef struct {
  int max_tokens;      // tokens to generate at most, [0, 1 << 20] [16]
  double temperature;  // [0, 100]; 0: greedy (the most likely token) [1]
  int top_k;           // sample among the k most likely; 0: all [0]
  double top_p;        // nucleus: the smallest set of probability >= top_p, (0, 1] [1]
  uint64_t seed;       // the draws' RNG stream [0]
  int n_stop;          // [0, MOE_INFER_MAX_STOP]
  char stop[MOE_INFER_MAX_STOP][MOE_INFER_STOP_BYTES + 1];  // non-empty, NUL-terminated
} moe_infer_params;
void moe_infer_params_default(moe_infer_params *p);
// INVALID_ARG naming the field and its valid range.
moe_status moe_infer_params_validate(moe_ctx *ctx, const moe_infer_params *p);

// ---- requests as JSON -------------------------------------------------------

// One completion request, as `moe generate` reads a JSONL line and `moe serve`
// a request body (the OpenAI completions shape). Keys:
//   prompt (string, required), max_tokens (integer), temperature, top_p
//   (numbers), top_k (integer; llama.cpp's extension), seed (integer >= 0),
//   stop (a string or an array of at most MOE_INFER_MAX_STOP strings), stream
//   (boolean), model (string, kept), n (only 1), user (string, ignored);
//   with MOE_INFER_JSON_ID also "id" (a string, or an integer of magnitude < 2^53;
//   kept as JSON text: the string exactly, the integer as its digits).
// Anything else is refused naming the key (as the OpenAI API refuses an
// unrecognized argument), as are a wrong type, a value out of range
// (moe_infer_params_validate), a NUL inside a string and malformed JSON.
// With MOE_INFER_JSON_CHAT the chat completions shape instead: "messages"
// (required; each {"role": system|user|assistant, "content": string}) in place
// of "prompt", and "max_completion_tokens" as a synonym of max_tokens; the
// prompt is the chat template "<role>: <content>\n" per message, then
// "assistant:" (the model is a byte-level LM without special tokens).
enum { MOE_INFER_JSON_ID = 1, MOE_INFER_JSON_CHAT = 2 };

typedef struct {
  char *prompt;  // moe_malloc'd, NUL-terminated
  size_t prompt_len;
  moe_infer_params params;  // the defaults given, overridden by the keys present
  int has_seed;             // 1 when "seed" was given
  int stream;               // "stream": true
  char model[128];          // "model" ("" when absent; longer names are refused)
  char *id_json;            // "id" as JSON text (moe_malloc'd), or NULL
} moe_infer_request;

// Parses json (len bytes; need not be NUL-terminated) into *out over
// defaults. On error *out holds nothing to free. Free with moe_infer_request_free.
moe_status moe_infer_request_from_json(moe_ctx *ctx, const char *json, size_t len,
                                       const moe_infer_params *defaults, unsigned flags,
                                       moe_infer_request *out);
void moe_infer_request_free(moe_infer_request *r);

// n bytes as a quoted JSON string (moe_malloc'd; NULL when out of memory):
// quotes, backslashes and control bytes escaped (\n, \t, \r, else \u00XX),
// valid UTF-8 kept, each byte of an invalid sequence written as \ufffd (the
// replacement character: a byte-level model can emit any byte).
char *moe_infer_json_string(const char *s, size_t n);

// ---- the load generator (moe bench serve) ----------------------------------

// Drives a running `moe serve` over HTTP (libcurl) with streamed completion
// requests and measures them (src/infer/loadgen.c): open loop (Poisson
// arrivals at `rate`; latency counted from each request's due time, so
// waiting for a free worker counts) or closed loop (rate 0: `concurrency`
// requests in flight). Prompt and output lengths are drawn uniformly from
// their [min, max]; prompts are seeded pseudo-words; each request asks for
// exactly its output length (no stop strings).
typedef struct {
  const char *url;             // the server ["http://127.0.0.1:8080"]
  int chat;                    // 1: /v1/chat/completions, else /v1/completions [0]
  int requests;                // [64]
  double rate;                 // requests/s, 0: closed loop [0]
  int concurrency;             // closed loop: in flight; open loop: workers [8]
  int prompt_min, prompt_max;  // bytes [32, 32]
  int output_min, output_max;  // tokens [64, 64]
  double temperature;          // [0.8]
  uint64_t seed;               // lengths, arrivals and prompts [1]
  double timeout_s;            // per request [600]
} moe_loadgen_config;
void moe_loadgen_config_default(moe_loadgen_config *c);
// "N" or "A-B" into [*a, *b] within [lo, hi]; INVALID_ARG naming the forms.
moe_status moe_loadgen_range_parse(moe_ctx *ctx, const char *text, int lo, int hi, int *a, int *b);

typedef struct {
  int ok, failed;      // requests answered in full / not
  long fail_codes[8];  // HTTP statuses of the failures (-1: no answer)
  int fail_counts[8];
  char first_error[256];
  double wall_s;
  int64_t tokens;  // completion tokens (the servers' usage counts)
  double requests_per_s, tokens_per_s;
  double ttft_ms[3];     // time to the first token: p50, p95, p99
  double itl_ms[3];      // gaps between consecutive tokens: p50, p95, p99
  double latency_ms[3];  // end to end: p50, p95, p99
} moe_loadgen_result;
// UNSUPPORTED in a build without libcurl. Failed requests are counted, not errors.
// (Call it from one thread at a time: it sets libcurl up and down.)
moe_status moe_loadgen_run(moe_ctx *ctx, const moe_loadgen_config *c, moe_loadgen_result *out);
// GET url + path into *out (moe_malloc'd, NUL-terminated). IO naming the URL
// and the reason when it cannot be fetched or the status is not 200.
moe_status moe_http_get(moe_ctx *ctx, const char *url, const char *path, char **out);

// The value of the sample `name` in a Prometheus text exposition (GET
// /metrics): the line "NAME VALUE", NAME with its labels exactly as written,
// e.g. moe_engine_moe_layer_seconds{quantile="0.5"}. NAN when the sample is
// absent or its value is not a number.
double moe_prom_value(const char *text, const char *name);

// What `moe bench serve` reads from a server's /metrics after a run (NAN: not
// reported, e.g. no MoE step timed yet or the server predates the metric).
typedef struct {
  double moe_ms[2];                    // a MoE layer's forward per step and block: p50, p95 (ms)
  double a2a_ms[2];                    // its all-to-alls: p50, p95 (ms)
  double balance[2];                   // mean balance ratio without copies, as placed
  double plans, replans, copies_sent;  // placement counters
} moe_server_metrics;
// GET url/metrics and read it into *out; moe_http_get's errors.
moe_status moe_server_metrics_get(moe_ctx *ctx, const char *url, moe_server_metrics *out);

// ---- sampling ----------------------------------------------------------------

// The next token from logits (V) under p's temperature, top_k and top_p, at
// u in [0, 1): temperature 0 is the argmax (the first of equal maxima);
// otherwise softmax(logits / temperature) over the top_k largest (ties at the
// k-th kept), cut to the smallest prefix (by probability, then index) whose
// mass reaches top_p, inverted at u. scratch: 2 V doubles + V ints.
int moe_infer_sample(const float *logits, int v, double temperature, int top_k, double top_p,
                     double u, double *scratch, int *order);

#ifdef __cplusplus
}
#endif
#endif  // MOE_INFER_REQUEST_H
