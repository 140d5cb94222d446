// libmoe scheduler core: task graphs, schedules (per-stream task orders) and the
// two-stream executor with its per-task profiler (ScheMoE's task abstraction).
//
// A layer pass is a small DAG of tasks. Each task runs on one of two streams:
// the compute stream (kernels, compression) or the communication stream (MPI).
// A schedule gives, for each stream, the order of its tasks. The executor runs
// both orders concurrently: a task starts when it is next on its stream AND all
// of its dependencies are done.
//
// Threads: the executor owns one communication thread, created with the
// executor and parked between passes. The thread that calls moe_executor_run()
// is the compute stream (BLAS and other compute stay on the caller's thread);
// the communication thread runs every comm task, so it owns all MPI calls
// during a pass (MPI_THREAD_SERIALIZED is enough if the caller makes no MPI call
// while a pass runs; MPI_THREAD_MULTIPLE otherwise).
//
// What this is not: the schedules (sequential, pipeline, optsche, ...) and the
// chunked MoE layer build graphs and orders with this API; they live elsewhere.
#ifndef MOE_SCHED_H
#define MOE_SCHED_H

#include <stdint.h>

#include "moe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- tasks and task graphs ------------------------------------------------------

typedef enum {
  MOE_STREAM_COMPUTE = 0,  // compute thread (the caller of moe_executor_run)
  MOE_STREAM_COMM = 1,     // communication thread
  MOE_STREAM_COUNT_        // number of streams (not a stream)
} moe_stream;

// "compute" or "comm"; "unknown" otherwise. Never NULL.
const char *moe_stream_name(moe_stream stream);

// Result of a split task's completion test.
typedef enum {
  MOE_TASK_DONE = 0,    // the task has finished
  MOE_TASK_PENDING = 1  // not yet: poll again later (e.g. MPI_Test said no)
} moe_task_state;

// Runs (or starts, for a split task) the task. Records an error in ctx and
// returns its status on failure. ctx belongs to the stream's thread.
typedef moe_status (*moe_task_fn)(void *arg, moe_ctx *ctx);
// Completion test of a split task: sets *state to MOE_TASK_DONE or
// MOE_TASK_PENDING; must not block (for MPI: MPI_Testall).
typedef moe_status (*moe_task_test_fn)(void *arg, moe_ctx *ctx, moe_task_state *state);

#define MOE_TASK_NAME_MAX 32  // bytes, with the terminating NUL

// What a caller gives moe_task_graph_add(). Only run is required.
//
// A split task (test != NULL) is started by run and finished by test. How the
// executor waits for it depends on the wait policy (moe_wait_policy): polled
// with back-off sleeps, or handed to wait (a blocking completion such as
// MPI_Waitall) when the policy is MOE_WAIT_BLOCKING, or MOE_WAIT_ADAPTIVE while
// the other stream waits for this one, and wait != NULL.
typedef struct {
  moe_stream stream;      // which stream runs it
  const char *name;       // e.g. "A1^2"; NULL or "" gives "#<index>"; < MOE_TASK_NAME_MAX bytes
  int chunk;              // chunk index (informational, for schedules and traces); -1 if none
  moe_task_fn run;        // required
  moe_task_test_fn test;  // optional: completion test of a split task
  moe_task_fn wait;       // optional: blocking completion of a split task
  void *arg;              // passed to run/test/wait; not owned
  const int *deps;  // indices of earlier tasks this one waits for (may repeat; NULL if n_deps 0)
  int n_deps;
} moe_task_desc;

typedef struct {
  moe_stream stream;
  char name[MOE_TASK_NAME_MAX];
  int chunk;
  // What the task does: its moe_chunk_task (MOE_CT_A1, MOE_CT_E, ...) in a
  // graph of moe_chunk_pass_build, -1 for any other task. Code that needs a
  // task's kind reads it here; names are for people (and may change).
  int kind;
  moe_task_fn run;
  moe_task_test_fn test;
  moe_task_fn wait;
  void *arg;
  int dep_offset;  // deps are graph->deps[dep_offset .. dep_offset + n_deps)
  int n_deps;
} moe_task;

// A task graph with a fixed capacity. Fields are read-only for users.
// Dependencies always point to earlier tasks, so a graph is acyclic by
// construction. Nothing is allocated after moe_task_graph_init().
typedef struct {
  moe_task *tasks;  // (max_tasks)
  int n_tasks;
  int max_tasks;
  int *deps;  // (max_deps) pool of dependency indices
  int n_deps;
  int max_deps;
} moe_task_graph;

// Allocates room for max_tasks tasks and max_deps dependency entries in total.
// max_tasks >= 1, max_deps >= 0. On failure the graph is left zeroed.
moe_status moe_task_graph_init(moe_ctx *ctx, moe_task_graph *graph, int max_tasks, int max_deps);
void moe_task_graph_free(moe_task_graph *graph);  // NULL or zeroed graph: no-op
// Forgets every task, keeping the capacity.
void moe_task_graph_clear(moe_task_graph *graph);
// Appends a task; its index (0, 1, ...) goes to *out_index (may be NULL).
// INVALID_ARG for: a dependency that is not an earlier task (which also rules
// out cycles), a full graph or dependency pool, a missing run function, a bad
// stream, a name too long.
moe_status moe_task_graph_add(moe_ctx *ctx, moe_task_graph *graph, const moe_task_desc *desc,
                              int *out_index);
// Dependencies of task i: *out points into graph->deps (n entries).
void moe_task_graph_deps(const moe_task_graph *graph, int i, const int **out, int *n);

// ---- schedules ---------------------------------------------------------------------

// For each stream the order in which it runs its tasks (task indices).
typedef struct {
  int *order[MOE_STREAM_COUNT_];  // (max_per_stream) each
  int len[MOE_STREAM_COUNT_];
  int max_per_stream;
} moe_schedule;

moe_status moe_schedule_init(moe_ctx *ctx, moe_schedule *sched, int max_per_stream);
void moe_schedule_free(moe_schedule *sched);   // NULL or zeroed: no-op
void moe_schedule_clear(moe_schedule *sched);  // empties both orders
// Appends task to the order of stream. INVALID_ARG when that order is full.
moe_status moe_schedule_push(moe_ctx *ctx, moe_schedule *sched, moe_stream stream, int task);
// Fills the orders with every task in index order (a valid schedule of any graph).
moe_status moe_schedule_in_index_order(moe_ctx *ctx, moe_schedule *sched,
                                       const moe_task_graph *graph);

// Checks that every task of graph appears exactly once, on the stream of its
// kind, and that the orders cannot deadlock: a simulation runs both streams
// (each starts its next task when the task's dependencies are done) and must
// finish every task. INVALID_ARG naming the offending tasks otherwise.
// Allocates scratch for the check; moe_executor_run() checks without allocating.
moe_status moe_schedule_validate(moe_ctx *ctx, const moe_task_graph *graph,
                                 const moe_schedule *sched);

// ---- schedules of a chunked MoE layer pass --------------------------------------------

// The seven task kinds of one chunk of a layer pass (ScheMoE eq. 3): compress,
// all-to-all, decompress, expert, compress, all-to-all, decompress. In a
// backward pass the same chain carries the gradients (C1 compresses dY on the
// token side, E is the expert backward). Compression tasks are absent (-1)
// when compression is off.
typedef enum {
  MOE_CT_C1 = 0,
  MOE_CT_A1,
  MOE_CT_D1,
  MOE_CT_E,
  MOE_CT_C2,
  MOE_CT_A2,
  MOE_CT_D2,
  MOE_CT_KINDS  // number of kinds (not a kind)
} moe_chunk_task;

// "C1", "A1", "D1", "E", "C2", "A2", "D2"; "?" otherwise.
const char *moe_chunk_task_name(moe_chunk_task kind);

// How a schedule cuts the layer's rows into chunks.
typedef enum {
  // Chunk i of r holds the i-th r-th of every (peer, expert) block: slots
  // [i*C/r, (i+1)*C/r) in capacity mode, rows [i*n/r, (i+1)*n/r) of a block of
  // n rows in dropless mode. Every chunk talks to every peer.
  MOE_CHUNK_ROWS = 0,
  // FasterMoE: peers form n groups of g consecutive ranks; step j sends to
  // group (i + j) mod n and receives from group (i - j) mod n (i = my group).
  // The number of chunks is n.
  MOE_CHUNK_PEER_GROUPS = 1
} moe_chunking;

// A schedule algorithm: fills, for a pass of r chunks whose tasks are
// tasks[c][kind] (task indices, -1 for absent kinds), the order of each stream.
// The comm order must be the same on every rank (the all-to-alls are
// collective), which holds when it depends only on r and the kinds present.
typedef moe_status (*moe_schedule_order_fn)(moe_ctx *ctx, int r, const int (*tasks)[MOE_CT_KINDS],
                                            int backward, moe_schedule *out);

typedef struct {
  const char *name;     // "sequential", "pipeline", "optsche", "smart"
  const char *source;   // where it comes from
  const char *summary;  // one line: the orders it produces
  moe_chunking chunking;
  moe_schedule_order_fn order;
} moe_schedule_algo;

// Registered schedules in a fixed order; *count receives their number.
const moe_schedule_algo *moe_schedule_algo_list(int *count);
// By name; INVALID_ARG naming the valid names otherwise.
moe_status moe_schedule_algo_find(moe_ctx *ctx, const char *name, const moe_schedule_algo **out);
// "sequential, pipeline, optsche, smart".
const char *moe_schedule_algo_names(void);

// Makespan of graph under sched if task i took durations[i] (any time unit),
// with the executor's rules: each stream runs its order, starting a task when
// the stream is free and the task's dependencies have ended. end_times (n_tasks,
// may be NULL) receives each task's end. Validates the schedule first
// (INVALID_ARG for a bad or deadlocking one, or a negative/non-finite
// duration). Allocates scratch. This is ScheMoE's task-model simulator: with
// per-task durations of a profile split over r chunks it gives the makespan an
// ideal r-chunk pass would have.
moe_status moe_schedule_simulate(moe_ctx *ctx, const moe_task_graph *graph,
                                 const moe_schedule *sched, const double *durations,
                                 double *end_times, double *makespan);

// The functions of one task kind in a chunked pass (run, and for split tasks
// test and wait). run NULL: a task that does nothing (graphs for simulation).
typedef struct {
  moe_task_fn run;
  moe_task_test_fn test;
  moe_task_fn wait;
} moe_chunk_task_fns;

// Builds the task graph of a chunked layer pass and its schedule: r chunks,
// each the chain C1 -> A1 -> D1 -> E -> C2 -> A2 -> D2 (the C and D kinds only
// when compressed), A1 and A2 on the communication stream, the rest on the
// compute stream, named "A1^2" ("A1'^2" in a backward pass), with chunk index
// c and their kind (moe_task.kind); then algo's orders, validated. fns (MOE_CT_KINDS entries, or
// NULL for all no-ops) and args[c] (or NULL) give the tasks' functions and arguments. graph needs
// room for 7 r tasks and 7 r dependencies and sched for 7 r tasks per stream; both are cleared
// first. tidx (r rows, may be NULL) receives the task indices (-1 for absent kinds). Used by the
// expert-parallel layer, by Parm's chunked EP&ESP pass (which appends SAA's
// gather tasks) and by the simulator, so they run the same graphs.
moe_status moe_chunk_pass_build(moe_ctx *ctx, const moe_schedule_algo *algo, int r, int compressed,
                                int backward, const moe_chunk_task_fns *fns, void *const *args,
                                moe_task_graph *graph, moe_schedule *sched,
                                int (*tidx)[MOE_CT_KINDS]);

// The same with contention: while both streams run a task, the compute task
// progresses slow_compute times slower and the communication task slow_comm
// times slower (>= 1; both 1 is moe_schedule_simulate). Models two streams
// sharing cores, memory bandwidth and the network stack, as measured by
// `moe calibrate`. durations are the tasks' times when running alone.
moe_status moe_schedule_simulate_shared(moe_ctx *ctx, const moe_task_graph *graph,
                                        const moe_schedule *sched, const double *durations,
                                        double slow_compute, double slow_comm, double *end_times,
                                        double *makespan);

// ---- executor ------------------------------------------------------------------------

// How the communication stream waits for a split task to complete.
typedef enum {
  // Block in the task itself: its wait function (e.g. MPI_Waitall), or, when it
  // has none, its test called back to back. Open MPI's blocking calls busy-poll,
  // so this keeps a core busy for the whole wait.
  MOE_WAIT_BLOCKING = 0,
  // Call test, then sleep with exponential back-off (poll_min_ns doubling up to
  // poll_max_ns) between tests. Costs a few percent of a core; see
  // docs/scheduling.md for the measurement against blocking.
  MOE_WAIT_POLL_BACKOFF = 1,
  // Poll-backoff while the other stream runs a task; while it waits for this
  // stream (a dependency on the pending task, or the end of its order), block
  // in the task like MOE_WAIT_BLOCKING: there is nothing to slow down then,
  // and each protocol step of an exchange that progresses only inside MPI
  // calls would otherwise wait for the next poll. The default (measured in
  // docs/scheduling.md: up to 1.9x faster sequential passes on small shapes).
  MOE_WAIT_ADAPTIVE = 2
} moe_wait_policy;

// "blocking", "poll-backoff" or "adaptive"; "unknown" otherwise.
const char *moe_wait_policy_name(moe_wait_policy policy);
// Parses "blocking", "poll-backoff" or "adaptive"; INVALID_ARG otherwise.
moe_status moe_wait_policy_parse(moe_ctx *ctx, const char *text, moe_wait_policy *out);

typedef struct {
  moe_wait_policy wait;  // policy for split tasks
  uint32_t poll_min_ns;  // first back-off sleep (default 5000)
  uint32_t poll_max_ns;  // longest back-off sleep (default 100000)
} moe_executor_config;

// The defaults: MOE_WAIT_ADAPTIVE, back-off 5 us .. 100 us.
moe_executor_config moe_executor_config_default(void);

// One profiler record per task of the last pass. Times in ns from the pass start.
typedef struct {
  moe_stream stream;
  int ran;            // 1 if the task completed in the last pass
  uint64_t start_ns;  // when it started (0 if it did not run)
  uint64_t end_ns;    // when it completed (for a split task: when test said done)
  uint32_t polls;     // number of test calls (0 for plain tasks)
} moe_task_record;

// Per-pass breakdown of the records (all in ns).
typedef struct {
  uint64_t total_ns;         // latest end among the records
  uint64_t compute_ns;       // sum of compute task durations (busy time)
  uint64_t comm_ns;          // sum of comm task durations
  uint64_t overlap_ns;       // comm time during which a compute task also ran
  uint64_t exposed_comm_ns;  // comm_ns - overlap_ns: comm not hidden by compute
} moe_pass_breakdown;

// Breakdown of n records (tasks of one pass; those with ran == 0 are skipped).
// Tasks on one stream never overlap each other, which the computation assumes.
void moe_pass_breakdown_compute(const moe_task_record *records, int n, moe_pass_breakdown *out);

typedef struct moe_executor moe_executor;

// Creates an executor for graphs of at most max_tasks tasks and starts its
// communication thread. config NULL: the defaults. INVALID_ARG for a bad
// config (unknown policy, poll_min_ns 0 or > poll_max_ns).
moe_status moe_executor_create(moe_ctx *ctx, const moe_executor_config *config, int max_tasks,
                               moe_executor **out);
// Stops and joins the communication thread. NULL: no-op. Not during a run.
void moe_executor_destroy(moe_executor *ex);

// Runs one pass of graph in the order of sched on the caller's thread (compute
// stream) and the communication thread, and returns when both streams are done
// or stopped. Validates the schedule first (moe_schedule_validate, without
// allocating) and runs nothing if it is invalid. If a task fails, no further
// task starts on either stream, both streams stop, and the first failure's
// status is returned; ctx's message names the task and carries the task's own
// message. A split task that is still pending when the other stream fails is
// abandoned (its owner must cancel or complete its requests). Allocates
// nothing. One call at a time per executor.
moe_status moe_executor_run(moe_executor *ex, const moe_task_graph *graph,
                            const moe_schedule *sched, moe_ctx *ctx);

// A background task of the communication stream (Pro-Prophet's block-wise
// scheduling of transfers that belong to no pass, e.g. another layer's
// expert-parameter transfer): while the comm stream would wait (for its next
// task's dependencies, or, its order done, for the compute stream to
// finish), it polls test(arg) with back-off sleeps of at most 20 us instead,
// until test reports MOE_TASK_DONE or fails, once per pass. test runs on the
// comm thread (it may call MPI, as comm tasks do) and must not block. A
// failure does not fail the pass (the owner of the work completes it and
// meets the error itself). test NULL: none (the default). Between passes.
void moe_executor_set_background(moe_executor *ex, moe_task_test_fn test, void *arg);
typedef struct {
  int polls;         // calls of test in the last pass
  int done;          // 1: test reported MOE_TASK_DONE in the last pass
  int failed;        // 1: test failed in the last pass
  uint64_t done_ns;  // when it reported done or failed, from the pass's start
} moe_executor_background;
// Whether the pass running on ex has failed (a task returned an error): a
// task that waits for work outside the graph (e.g. the background task's)
// polls it so that it gives up instead of waiting forever.
int moe_executor_pass_failed(moe_executor *ex);
// The last pass's polls of the background task (zeros before any).
moe_executor_background moe_executor_background_stats(const moe_executor *ex);
// When the last pass started, on moe_time_ns's clock: its records' zero (0 before any).
uint64_t moe_executor_pass_start_ns(const moe_executor *ex);

// Records of the last pass, indexed by task (n = that pass's task count).
// Valid until the next run or destroy. NULL (and *n = 0) before any run.
const moe_task_record *moe_executor_records(const moe_executor *ex, int *n);
// Breakdown of the last pass (zeros before any run).
void moe_executor_breakdown(const moe_executor *ex, moe_pass_breakdown *out);

// ---- traces ---------------------------------------------------------------------------

// One rank's pass for a trace: the graph (task names and chunks) and the
// executor's records of that pass (n = graph->n_tasks).
typedef struct {
  int rank;  // becomes the trace's process id ("rank N")
  const moe_task_graph *graph;
  const moe_task_record *records;  // (graph->n_tasks)
  uint64_t offset_ns;              // added to every time (to place passes one after another)
  // Optional name of the pass's owner (e.g. "h1", the model's block 1): the
  // events are then named "<label>.<task>" ("h1.E^2") and carry it as
  // args.pass, so passes of different layers can be told apart. NULL or "":
  // the task names alone. At most MOE_TASK_NAME_MAX - 1 bytes are used.
  const char *label;
} moe_trace_pass;

// Writes a Chrome trace (JSON "traceEvents"; loads in Perfetto and
// chrome://tracing): one process per rank, one thread per stream ("compute",
// "comm"), one complete event per task that ran (named "<label>.<task>" when
// the pass has a label), with its chunk and polls (and the label) as
// arguments. Times in microseconds. Written to a temporary file and renamed, so
// a failure leaves no half-written file at path.
moe_status moe_trace_write(moe_ctx *ctx, const char *path, const moe_trace_pass *passes,
                           int n_passes);

#ifdef __cplusplus
}
#endif
#endif  // MOE_SCHED_H
