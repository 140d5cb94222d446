// The inference engine: continuous batching of many generation requests over a
// MoE-GPT checkpoint, with a KV cache (moe_gpt_decode) and the MoE layers run
// expert-parallel over the ranks of an MPI communicator (docs/inference.md).
//
// Roles. Rank 0 owns the requests: moe_infer_submit queues them (from any
// thread of rank 0), and each moe_infer_step (collective) admits waiting
// requests into free KV-cache slots, builds the step's rows (one decode token
// per running sequence, then prefill chunks of new prompts), broadcasts them,
// and samples the next token of every sequence whose last row was computed.
// Every rank holds the KV cache of the sequences it was given (slots are
// spread over the ranks) and computes their dense layers; the MoE layers'
// experts are spread over all ranks and every rank takes part in every step,
// also in steps where it has no rows, so nothing hangs when sequences end at
// different times. The other ranks run moe_infer_follow until rank 0 calls
// moe_infer_shutdown.
//
// Determinism: a request's tokens depend only on the checkpoint, its prompt,
// its parameters and its seed: not on the other requests, the batching, the
// prefill chunking or the number of ranks, when moe_gemm runs on a
// batch-invariant backend (the default "fixed") and the MoE layers are
// dropless (moe_gpt_decode). With a capacity factor the dropped choices
// depend on the step's other rows.
//
// Context: the cache holds at most seq_len positions of a sequence. A prompt
// longer than that keeps its last seq_len tokens; when a generated token would
// need position seq_len, the sequence's last seq_len / 2 tokens are prefilled
// again from position 0 (the learned positions cannot shift), so every token
// is sampled from the logits of a full forward over the window held.
//
// Tokens are bytes (the model's byte-level vocabulary): a prompt of n bytes is
// n tokens; an empty prompt starts after a newline (as moe sample).
#ifndef MOE_INFER_H
#define MOE_INFER_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "moe/core.h"
#include "moe/infer_request.h"
#include "moe/model.h"
#include "moe/parallel.h"
#include "moe/paths.h"

#ifdef __cplusplus
extern "C" {
#endif

// Expert placements (MOE_INFER_PLACEMENTS): in moe/infer_request.h.

typedef struct {
  const char *checkpoint;   // a moe train checkpoint (any world size it was written at)
  int slots;                // sequences held at once per rank (KV-cache slots), [1, 4096] [32]
  int step_rows;            // rows one rank computes per step at most, [1, 65536] [256]
  int prefill_chunk;        // prompt rows of one sequence per step at most, [1, step_rows] [64]
  int queue;                // requests waiting for a slot at most, [1, 1 << 20] [256]
  moe_parallel_config par;  // the MoE layers' expert parallelism (ep_size is forced to world)
  size_t max_memory;        // per rank; 0: the node's available memory (moe_comm_memory_check)
  // expert placement (moe_infer_placement); on one rank there is nothing to place
  int placement;     // [MOE_INFER_PLACE_UNIFORM]
  int place_slots;   // eplb: copies a rank may hold, [1, E - E/P] [2, at most E - E/P]
  int place_window;  // eplb: steps of load the plan averages, [1, 10000] [16]
  int place_every;   // eplb: re-plan every N steps, [1, 1 << 20] [16]
  int place_phase2;  // lina: 1 = Lina's phase 2 (re-plan after the gate when the estimate
                     // missed), 0 = phase 1 only, {0, 1} [1]
  // Lina's expert paths (include/moe/paths.h; docs/inference.md "Path profiles")
  int record_paths;  // 1: record a path profile of every step's tokens (moe_infer_paths_json)
  int path_len;      // its path length l, [1, MOE_PATHS_MAX_LEN] [3]
  int max_paths;     // its paths per MoE block at most, [1, 1 << 20] [4096]
  const char *routing_trace;  // rank 0 writes every step's routing here (NULL: none): the
                              // (ranks x E) rows per MoE block as moe train --routing-trace
                              // does, with `paths` each block's estimated popularity too
                              // ("estimate"); read by moe simulate --lina
  const char *paths;          // a recorded profile (NULL: none): every step, each MoE block's
                              // popularity estimated from it is checked against its gate's
                              // (Lina's phase-2 test; stats path_*)
} moe_infer_config;

// slots 32, step_rows 256, prefill_chunk 64, queue 256, par as
// moe_parallel_config_default, placement uniform (eplb: 2 slots, a window of
// 16 steps, re-planned every 16).
void moe_infer_config_default(moe_infer_config *ic);

typedef enum {
  MOE_INFER_FINISH_LENGTH = 0,     // max_tokens reached
  MOE_INFER_FINISH_STOP = 1,       // a stop string was generated (not part of the text)
  MOE_INFER_FINISH_CANCELLED = 2,  // moe_infer_cancel, or the engine shut down
} moe_infer_finish;
// "length", "stop", "cancelled".
const char *moe_infer_finish_name(moe_infer_finish f);

typedef struct {
  moe_infer_finish finish;
  const char *text;  // the completion (bytes, NUL-terminated; valid during on_done)
  size_t text_len;
  int prompt_tokens;      // tokens of the prompt as given (an empty prompt: 0)
  int completion_tokens;  // tokens generated (a stop string's tokens included)
  double queue_ms;        // from submit to the first row computed
  double first_token_ms;  // from submit to the first token sampled (0 when none)
  double total_ms;        // from submit to done
} moe_infer_result;

// Called on rank 0 by the thread that runs moe_infer_step: on_text with the
// completion's next bytes (held back while they could start a stop string),
// then on_done once. The strings are valid during the call only.
typedef struct {
  void (*on_text)(void *user, int64_t id, const char *bytes, size_t n);
  void (*on_done)(void *user, int64_t id, const moe_infer_result *r);
  void *user;
} moe_infer_callbacks;

typedef struct moe_infer moe_infer;

// Collective over world: reads the checkpoint on every rank (each its home
// experts), checks the memory it needs (moe_infer_memory plus the process
// baseline, against max_memory) before allocating anything, makes the model
// on the expert-parallel backend (EP = world) and the KV cache. Errors (a
// missing or corrupt checkpoint, a config out of range, experts not divisible
// by the ranks, not enough memory: INVALID_ARG with the numbers) are agreed:
// every rank returns the same status, the message naming the problem.
moe_status moe_infer_create(moe_ctx *ctx, MPI_Comm world, const moe_infer_config *ic,
                            moe_infer **out);
void moe_infer_destroy(moe_infer *e);  // NULL is a no-op; not collective
const moe_gpt_config *moe_infer_model_config(const moe_infer *e);
// Bytes moe_infer_create allocates on one rank for the model config and ic
// (parameters, the MoE layers' buffers, the KV cache), without allocating.
moe_status moe_infer_memory(moe_ctx *ctx, const moe_gpt_config *cfg, const moe_infer_config *ic,
                            int world_size, moe_memory_need *out);

// Rank 0, any thread: queues a request; its id (>= 1) in *id. prompt: bytes
// (may be empty). BUSY when the queue is full or the engine is shutting down;
// INVALID_ARG for bad params. The message goes to ctx (each thread its own;
// NULL: the engine's, for the thread that steps). Thread-safe against
// moe_infer_step.
moe_status moe_infer_submit(moe_infer *e, moe_ctx *ctx, const char *prompt, size_t prompt_len,
                            const moe_infer_params *p, const moe_infer_callbacks *cb, int64_t *id);
// Rank 0, any thread: the request ends with MOE_INFER_FINISH_CANCELLED at the
// next step (its on_done still comes). Unknown or finished ids: no-op.
void moe_infer_cancel(moe_infer *e, int64_t id);
// Rank 0: requests queued or running.
int moe_infer_pending(moe_infer *e);
// Rank 0: waits up to timeout_ms for a request to arrive (returns at once
// when one is pending); 1 when work is pending.
int moe_infer_wait(moe_infer *e, int timeout_ms);

// Rank 0: one step (collective with the followers): admit, compute, sample,
// call back. Does nothing collective when no request is pending (returns OK).
moe_status moe_infer_step(moe_infer *e);
// Rank 0, the thread that steps: the rows the last moe_infer_step sampled a
// token from, in the step's row order: each sequence's request id, the token
// and the V logits it was sampled from (gathered from the rank that holds the
// sequence). *rows stays valid until the next step; returns their number (0
// after a step without tokens, and on the other ranks). For tests and tools
// that check the engine's logits against a reference (tests/test_infer.c).
typedef struct {
  int64_t id;
  int token;
  const float *logits;  // (V)
} moe_infer_step_row;
int moe_infer_step_logits(const moe_infer *e, const moe_infer_step_row **rows);
// Rank 0: steps until no request is pending.
moe_status moe_infer_run(moe_infer *e);
// Ranks other than 0: take part in the steps until rank 0 shuts down. Waits
// between steps without spinning a core (polls with a back-off up to 1 ms).
moe_status moe_infer_follow(moe_infer *e);
// Rank 0: cancels what is pending (their on_done come with CANCELLED) and
// releases the followers from moe_infer_follow. Further submits fail.
moe_status moe_infer_shutdown(moe_infer *e);

typedef struct {
  int64_t steps;            // steps with rows
  int64_t rows;             // rows computed on all ranks (prefill + decode)
  int64_t prefill_rows;     // of which prompt rows (refills after a context shift included)
  int64_t tokens;           // tokens sampled
  int64_t requests_done;    // requests finished (any reason)
  int64_t context_shifts;   // refills after a sequence reached seq_len
  int64_t idle_rank_steps;  // steps in which some rank had no rows (it took part anyway)
  int running, waiting;     // requests in a slot / queued now
  int max_batch_seqs;       // most sequences in one step so far
  double step_ms;           // time in steps (rank 0)
  double moe_ms;            // of which in the MoE layers' forwards (rank 0)
  double a2a_ms;            // of which their all-to-alls (the passes' comm tasks, rank 0)
  // expert placement (placement other than uniform, on more than one rank;
  // zeros without). At each plan (every place_every steps, per MoE block),
  // the balance ratio of the window's mean load (the most rows a rank
  // computes over the mean; 1 = even) without copies and under the
  // placement of the last place_every steps; means over the plans.
  double balance_uniform;  // mean ratio without copies
  double balance_placed;   // mean ratio under the placement the load ran with
  int64_t plans;           // plans made (per MoE block; lina: per step and MoE block)
  int64_t copies_sent;     // copies whose parameters moved (placed anew)
  int copies;              // copies in force now, over the MoE blocks
  double place_ms;   // time in placement (load all-gather, plan, posting the transfer; rank 0)
  int64_t replans;   // lina: Lina's phase-2 re-plans (the actual top-2K experts were not
                     // the estimated ones, as sets), per step and MoE block
  double replan_ms;  // of place_ms, in them
  // ic.paths: over the steps and MoE blocks with tokens, each step's
  // estimated popularity (moe_path_profile_estimate over the step's tokens)
  // against the gate's actual choices: the top-2K experts (K = top_k, at most
  // E) as ordered lists equal (Lina's estimation accuracy) and as sets
  // different (Lina's phase 2 would re-plan: its fine-tune rate)
  int64_t path_evals, path_accurate, path_finetune;
} moe_infer_stats;
// Rank 0 (the counters are rank 0's; thread-safe).
void moe_infer_get_stats(moe_infer *e, moe_infer_stats *s);
// Rank 0: the time in block `block`'s MoE layer forwards, in their
// all-to-alls and in its placement (lina: its phase 1 and 2; eplb: each
// plan's time spread evenly over the blocks) so far (ms; any pointer may be
// NULL); 0 for a dense block or one out of range. Thread-safe.
void moe_infer_layer_times(moe_infer *e, int block, double *moe_ms, double *a2a_ms,
                           double *place_ms);
// Rank 0: block `block`'s path statistics (as moe_infer_stats' path_*; zeros
// for a dense block, one out of range, or without ic.paths). Thread-safe.
void moe_infer_path_stats(moe_infer *e, int block, int64_t *evals, int64_t *accurate,
                          int64_t *finetune);
// With ic.record_paths, after moe_infer_shutdown on rank 0 and
// moe_infer_follow's return on the others (collective): every rank's profile
// merged on rank 0, as moe_path_profile_to_json's text into *out (rank 0;
// NULL elsewhere; free with moe_free). INVALID_ARG without record_paths.
moe_status moe_infer_paths_json(moe_infer *e, char **out);
// Rank 0: the quantiles q[0..n-1] (in [0, 1]; the nearest-rank sample) of
// the MoE layer forward times, one sample per step and MoE block (the last
// 65536), into moe_ms[i], and of their all-to-all times into a2a_ms[i], in
// ms. Returns the samples used (0: none yet; the outputs are then 0).
// Thread-safe.
int moe_infer_layer_quantiles(moe_infer *e, const double *q, int n, double *moe_ms, double *a2a_ms);
// Rank 0: every sample pushed so far (one per step and MoE block), and the
// sums of their MoE forward and all-to-all times in ms (either may be NULL):
// a summary's _count and _sum, beside quantiles of the last 65536. Thread-safe.
int64_t moe_infer_layer_samples(moe_infer *e, double *moe_ms_sum, double *a2a_ms_sum);

// ---- the HTTP server (moe serve) --------------------------------------------

// An OpenAI-compatible HTTP server over an engine, on rank 0 (libmicrohttpd,
// one thread per connection; docs/inference.md):
//   POST /v1/completions, POST /v1/chat/completions   (moe_infer_request_from_json;
//        "stream": true answers with server-sent events, ending "data: [DONE]")
//   GET /v1/models, GET /health, GET /metrics (Prometheus text format)
// finish_reason is "stop", "length", or "cancelled" (the server shut down
// before the request ended). Errors are JSON {"error": {"message", "type",
// "param", "code"}}: 400 for a bad
// request, 404 an unknown path, 405 a wrong method, 413 a body over max_body,
// 503 when the queue is full or the server is shutting down. A streaming
// client that disconnects has its request cancelled at its next text.
// The server only queues requests: the thread that owns the engine steps it
// (moe_infer_wait, moe_infer_step).
typedef struct {
  const char *host;     // IPv4 address to listen on ["127.0.0.1"]
  int port;             // [8080]; 0: any free port (moe_serve_port says which)
  size_t max_body;      // bytes of a request body at most [1 MiB]
  int max_connections;  // open connections at most [256]
  const char *model;    // the model name /v1/models reports and responses carry
} moe_serve_config;
void moe_serve_config_default(moe_serve_config *sc);

typedef struct moe_server moe_server;
// Starts listening (rank 0). UNSUPPORTED in a build without libmicrohttpd;
// IO when the address cannot be bound (naming it and the reason).
moe_status moe_serve_start(moe_ctx *ctx, moe_infer *e, const moe_serve_config *sc,
                           moe_server **out);
int moe_serve_port(const moe_server *s);
// From now on new completion requests and /health answer 503 (the requests
// in flight go on).
void moe_serve_quiesce(moe_server *s);
// Closes every connection and frees the server (after moe_infer_shutdown, so
// that every request has ended): first waits (at most 10 s) for the answers
// of ended requests to be sent. NULL is a no-op.
void moe_serve_stop(moe_server *s);

#ifdef __cplusplus
}
#endif
#endif  // MOE_INFER_H
