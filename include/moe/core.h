// libmoe core: status codes, per-context errors, logging, arenas, a counter-based
// RNG, monotonic timers and allocation accounting.
//
// Dimension letters used across libmoe (stated once, here):
//   T tokens, M model dim, H expert hidden dim, E experts, K top-k, C capacity,
//   P ranks, r chunks, B batch, S sequence length, V vocabulary, L layers.
//   Gradients are d<name>.
//
// Threading: a moe_ctx belongs to one thread at a time. Logging and the
// allocation counters are safe from any thread.
#ifndef MOE_CORE_H
#define MOE_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// ---- version and build ----------------------------------------------------

// Version string, e.g. "0.1.0".
const char *moe_version(void);
// Features compiled into this build (1 or 0).
int moe_has_mpi(void);
int moe_has_zfp(void);
int moe_has_http(void);  // 1 when built with libmicrohttpd (moe serve)
int moe_has_cuda(void);

// ---- status ---------------------------------------------------------------

typedef enum {
  MOE_STATUS_OK = 0,
  MOE_STATUS_INVALID_ARG,    // a caller-supplied value is out of range
  MOE_STATUS_OUT_OF_MEMORY,  // an allocation failed or an arena is full
  MOE_STATUS_IO,             // reading or writing a file failed
  MOE_STATUS_BAD_FORMAT,     // a file or JSON text is malformed
  MOE_STATUS_UNSUPPORTED,    // the feature is not compiled in or not available
  MOE_STATUS_COMM,           // a communication (MPI) call failed
  MOE_STATUS_INTERNAL,       // a libmoe bug: please report
  MOE_STATUS_BUSY,           // a queue is full or the object is shutting down: try later
  MOE_STATUS_COUNT_          // number of codes (not a status)
} moe_status;

// Short English name of a status ("invalid argument"); never NULL.
const char *moe_status_str(moe_status st);

// ---- context: last error --------------------------------------------------

// A context carries the last error of the calls made with it. Create one per
// thread (or per object that is used from one thread).
typedef struct moe_ctx moe_ctx;

moe_status moe_ctx_create(moe_ctx **out);
void moe_ctx_destroy(moe_ctx *ctx);  // NULL is a no-op

// Text of the last error ("" if none). Owned by ctx; valid until the next call
// that fails with ctx.
const char *moe_ctx_error(const moe_ctx *ctx);
// "file:line" where the last error was raised ("" if none).
const char *moe_ctx_error_where(const moe_ctx *ctx);
moe_status moe_ctx_status(const moe_ctx *ctx);
void moe_ctx_clear_error(moe_ctx *ctx);

// Records an error in ctx (ctx may be NULL: then only logged at debug level)
// and returns code, so callers can write `return moe_error(...)`.
moe_status moe_error_at(moe_ctx *ctx, moe_status code, const char *file, int line, const char *fmt,
                        ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

// Error propagation inside libmoe. A function using them declares
// `moe_status st = MOE_STATUS_OK;` and has a single `done:` exit.
#define MOE_TRY(expr)                   \
  do {                                  \
    st = (expr);                        \
    if (st != MOE_STATUS_OK) goto done; \
  } while (0)

#define MOE_FAIL_IF(ctx, cond, code, ...)                                \
  do {                                                                   \
    if (cond) {                                                          \
      st = moe_error_at((ctx), (code), __FILE__, __LINE__, __VA_ARGS__); \
      goto done;                                                         \
    }                                                                    \
  } while (0)

#define MOE_FAIL(ctx, code, ...) MOE_FAIL_IF(ctx, 1, code, __VA_ARGS__)

// ---- logging ----------------------------------------------------------------

typedef enum {
  MOE_LOG_ERROR = 0,
  MOE_LOG_WARN,
  MOE_LOG_INFO,
  MOE_LOG_DEBUG,
  MOE_LOG_TRACE
} moe_log_level;

// Messages at or below the level are written to stderr. The initial level is
// MOE_LOG_WARN, or the value of the environment variable MOE_LOG_LEVEL
// (error|warn|info|debug|trace or 0..4), read on first use.
void moe_log_set_level(moe_log_level level);
moe_log_level moe_log_get_level(void);
// Parses "error".."trace" or "0".."4"; returns INVALID_ARG otherwise.
moe_status moe_log_level_parse(const char *text, moe_log_level *out);
void moe_log_at(moe_log_level level, const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
#define MOE_LOG(level, ...) moe_log_at((level), __FILE__, __LINE__, __VA_ARGS__)
#define MOE_ERROR(...) MOE_LOG(MOE_LOG_ERROR, __VA_ARGS__)
#define MOE_WARN(...) MOE_LOG(MOE_LOG_WARN, __VA_ARGS__)
#define MOE_INFO(...) MOE_LOG(MOE_LOG_INFO, __VA_ARGS__)
#define MOE_DEBUG(...) MOE_LOG(MOE_LOG_DEBUG, __VA_ARGS__)

// ---- memory -----------------------------------------------------------------

// All heap memory libmoe takes goes through these. They are 64-byte aligned and
// counted, so tests can assert that a hot path allocates nothing.
void *moe_malloc(size_t bytes);               // NULL on failure or bytes == 0
void *moe_calloc(size_t count, size_t size);  // zeroed; NULL on failure/overflow
void moe_free(void *p);                       // NULL is a no-op
// Number of successful moe_malloc/moe_calloc calls since the process started.
uint64_t moe_alloc_count(void);
// Bytes of those calls together (each rounded up to 64), since the process
// started; never decreases (frees are not subtracted). A test takes the
// difference around a create call to count what it allocated.
uint64_t moe_alloc_bytes(void);
// Bytes of moe_malloc blocks not yet given to moe_free (as the C library
// sizes them: malloc_usable_size, a few bytes above the request; 0 where the
// C library is not glibc), and the most they have been since the last
// moe_alloc_peak_reset (or the start). For the peak of a phase whose buffers
// grow and are replaced (workspaces): reset, run, peak - live before.
uint64_t moe_alloc_live_bytes(void);
uint64_t moe_alloc_peak_bytes(void);
void moe_alloc_peak_reset(void);
// Gives the C library's free heap pages back to the system (glibc:
// malloc_trim(0); a no-op elsewhere). Called where a long-lived buffer was
// just replaced by a larger one (moe_workspace_reserve): glibc serves blocks
// below its mmap threshold, which rises to the size of each mapped block
// freed, from the heap, and keeps their pages resident after free; the
// replaced receive buffers of a training run's expert-parallel layers held
// 10-15 MiB per rank that way after 60 steps, memory the estimate does not
// count.
void moe_heap_trim(void);
// bytes rounded up to a multiple of 64 (the alignment of moe_malloc).
static inline size_t moe_align64(size_t bytes) { return (bytes + 63u) & ~(size_t)63u; }

// Little-endian fields of files (checkpoints, the balancer's state): host
// independent.
static inline void moe_le_put_u32(unsigned char *p, uint32_t v) {
  for (int b = 0; b < 4; b++) p[b] = (unsigned char)(v >> (8 * b));
}
static inline void moe_le_put_u64(unsigned char *p, uint64_t v) {
  for (int b = 0; b < 8; b++) p[b] = (unsigned char)(v >> (8 * b));
}
static inline uint32_t moe_le_get_u32(const unsigned char *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t moe_le_get_u64(const unsigned char *p) {
  return (uint64_t)moe_le_get_u32(p) | ((uint64_t)moe_le_get_u32(p + 4) << 32);
}

// A bump allocator over one block: carve many buffers, free them together.
typedef struct {
  unsigned char *base;
  size_t capacity;  // bytes
  size_t used;      // bytes
} moe_arena;

// capacity 0 gives an empty arena on which every allocation fails.
moe_status moe_arena_init(moe_ctx *ctx, moe_arena *arena, size_t capacity);
void moe_arena_free(moe_arena *arena);  // NULL or zeroed arena is a no-op
// 64-byte aligned, zero-filled; NULL when the arena is full.
void *moe_arena_alloc(moe_arena *arena, size_t bytes);
void moe_arena_reset(moe_arena *arena);  // forget all allocations

// A table of named float tensors carved from one arena in one call.
typedef struct {
  const char *name;  // for messages and dumps
  size_t count;      // number of floats (0 gives NULL)
  float **out;       // where to store the pointer
} moe_tensor_spec;

// Bytes an arena needs for the table (with alignment padding).
size_t moe_tensor_table_bytes(const moe_tensor_spec *specs, int n);
// Carves every tensor; fails with OUT_OF_MEMORY naming the tensor that did not fit.
moe_status moe_tensor_table_carve(moe_ctx *ctx, moe_arena *arena, const moe_tensor_spec *specs,
                                  int n);

// ---- memory bound: what a shape needs, what the machine has -----------------------

// Bytes one rank needs, by category, computed from a configuration before
// anything is allocated (moe_layer_memory, moe_ep_layer_memory,
// moe_gpt_memory, moe_train_memory, ...). Each function derives its numbers
// from the allocation sites of the objects it sizes (tests compare them with
// the bytes counted by moe_alloc_bytes), so every byte is in exactly one
// category:
//   PARAMS       parameters
//   GRADS        their gradients (and gradient reduction scratch)
//   OPTIM        optimizer state (AdamW m and v)
//   ACTIVATIONS  activations kept for backward, backward scratch, inputs
//   A2A          all-to-all payload buffers: send/receive rows, compressed
//                payloads, the algorithm's own workspace
//   WORKSPACE    everything else: routing plans, tables, task graphs, the
//                training text, small buffers
//   BASELINE     the process itself (code, MPI, OpenBLAS), not allocated by
//                libmoe: filled in by the caller (moe_memory_baseline_bytes)
typedef enum {
  MOE_MEM_PARAMS = 0,
  MOE_MEM_GRADS,
  MOE_MEM_OPTIM,
  MOE_MEM_ACTIVATIONS,
  MOE_MEM_A2A,
  MOE_MEM_WORKSPACE,
  MOE_MEM_BASELINE,
  MOE_MEM_COUNT_  // number of categories (not a category)
} moe_mem_category;

typedef struct {
  double bytes[MOE_MEM_COUNT_];  // per category (double: a huge shape must not wrap)
  // The part of bytes[] that only a skewed routing needs: the expert-parallel
  // receive side is sized for the most rows that can arrive (see
  // moe_ep_layer_memory); a balanced routing needs total - skew_bytes. 0
  // where no size depends on the data.
  double skew_bytes;
} moe_memory_need;

// Two figures from one need. The total (moe_memory_need_total) is an upper
// bound: what the memory check compares with the limit. The expected figure
// (moe_memory_need_expected) is a prediction of the peak resident set for a
// typical run: total - MOE_MEM_SKEW_EXPECTED x skew_bytes, i.e. the
// routing-dependent receive side halfway between balanced routing (each rank
// receives what it sends) and the most that can arrive. The receive buffers
// keep the most rows any step delivered, so a run's figure rises over its
// steps from near balanced towards the bound; the middle of that range is the
// prediction made without a model of the routing the run will learn
// (docs/reliability.md, "Memory bound", has the measured spread).
#define MOE_MEM_SKEW_EXPECTED 0.5

// "parameters", "gradients", "optimizer state", "activations",
// "all-to-all buffers", "workspace", "process baseline"; "?" otherwise.
const char *moe_mem_category_name(moe_mem_category c);
double moe_memory_need_total(const moe_memory_need *n);
// total - MOE_MEM_SKEW_EXPECTED x skew_bytes (see above).
double moe_memory_need_expected(const moe_memory_need *n);
// dst += src, category by category (skew_bytes too).
void moe_memory_need_add(moe_memory_need *dst, const moe_memory_need *src);
// dst += k * src (k copies of an object).
void moe_memory_need_add_scaled(moe_memory_need *dst, const moe_memory_need *src, double k);
// "params 1.2 GiB + grads 1.2 GiB + ... = total 5.0 GiB" (non-zero categories;
// the total always); truncated to len.
void moe_memory_need_format(const moe_memory_need *n, char *buf, size_t len);
// "512.0 MiB", "2.00 GiB", "3.1 TiB" ...
void moe_format_bytes(double bytes, char *buf, size_t len);

// Parses a size: digits with an optional suffix K, M, G or T (powers of 1024,
// optional trailing 'B' or 'iB', case-insensitive): "2G", "512M", "1.5GiB",
// "4096". INVALID_ARG naming the text and the accepted form for anything else,
// for 0, and for values above 2^60 bytes.
moe_status moe_size_parse(moe_ctx *ctx, const char *text, size_t *out);
// The same with the least size accepted (0 or 1 bytes): 0 where it means none
// or "one piece".
moe_status moe_size_parse_min(moe_ctx *ctx, const char *text, size_t min_bytes, size_t *out);

// Memory this machine can give the calling process now: MemAvailable from
// /proc/meminfo, lowered to the cgroup's room (memory.max - memory.current,
// cgroup v2, /sys/fs/cgroup of the process) when a limit is set. source gets
// where the number came from ("MemAvailable", "cgroup memory.max"). IO when
// neither can be read (not Linux).
moe_status moe_memory_available(moe_ctx *ctx, size_t *out, char *source, size_t len);

// Resident set of this process now (VmRSS) and its peak (VmHWM), bytes, from
// /proc/self/status; 0 when unknown.
size_t moe_rss_bytes(void);
size_t moe_peak_rss_bytes(void);

// The process baseline added to an estimate (category BASELINE): the resident
// set measured now (code, libraries, MPI's buffers, whatever the process holds
// before the shape is allocated) plus MOE_MEM_BLAS_BYTES for OpenBLAS's GEMM
// buffers, which are touched only by the first large GEMM.
#define MOE_MEM_BLAS_BYTES ((size_t)6 << 20)
size_t moe_memory_baseline_bytes(void);

// Refuses a need above a limit: OK when total(need) <= limit, else
// INVALID_ARG with a message naming the need by category, the limit and
// where it came from (limit_source, e.g. "--max-memory" or "MemAvailable /
// 2 ranks on this node"), and what to change. who ("rank 3", "this process")
// and what_to_change (a hint, may be NULL) go into the message.
moe_status moe_memory_check(moe_ctx *ctx, const moe_memory_need *need, size_t limit,
                            const char *limit_source, const char *who, const char *what_to_change);
// The memory bound of one process (a command without MPI ranks): sets need's BASELINE to
// moe_memory_baseline_bytes() and checks need against max_memory when > 0 (named
// "--max-memory"), else against the memory available now (moe_memory_available, named by its
// source). OK when it fits; INVALID_ARG with moe_memory_check's message (who: "this process")
// when it does not; IO when no limit is given and the available memory cannot be read.
// Under MPI, moe_comm_memory_check (comm.h) is the same bound agreed over the ranks.
moe_status moe_memory_check_process(moe_ctx *ctx, moe_memory_need *need, size_t max_memory,
                                    const char *what_to_change);

// ---- counter-based RNG --------------------------------------------------------

// Philox4x32-10 (Salmon et al., SC'11, Random123). Value i of stream `stream` under
// `seed` depends only on (seed, stream, i): the same numbers on every platform and
// however a fill is split. Integer and uniform outputs are bit-exact everywhere;
// normals go through libm's log and cos (double precision, then rounded to
// float), which other C libraries may round differently in rare last-bit cases.
typedef struct {
  uint64_t seed;
  uint64_t stream;
  uint64_t index;  // next 32-bit output to draw
} moe_rng;

void moe_rng_init(moe_rng *rng, uint64_t seed, uint64_t stream);
// Raw Philox4x32-10: out = philox(counter ctr[4], key key[2]).
void moe_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
uint32_t moe_rng_u32(moe_rng *rng);
float moe_rng_uniform(moe_rng *rng);  // [0, 1), 24-bit resolution
float moe_rng_normal(moe_rng *rng);   // N(0, 1), Box-Muller
void moe_rng_fill_uniform(moe_rng *rng, float *x, size_t n, float lo, float hi);
void moe_rng_fill_normal(moe_rng *rng, float *x, size_t n, float mean, float std);

// ---- timers -------------------------------------------------------------------

uint64_t moe_time_ns(void);  // monotonic clock, nanoseconds
// Stops a process tree a launcher started (src/core/proc.c; Linux /proc):
// SIGTERM to process group pid (the caller's child, started in a group of
// its own) and to every descendant, read before the signal; waits until all
// are gone (pid reaped); SIGKILL to those left after term_s seconds; gives up
// kill_s seconds later. Each process is named by PID and start time, so one
// that took a PID after the exit is never signalled. Returns 0 (stopped by
// SIGTERM), 1 (SIGKILL was needed) or 2 (some outlived SIGKILL).
int moe_proc_tree_stop(int pid, double term_s, double kill_s);
double moe_time_ms_since(uint64_t start_ns);

// ---- numeric helpers ----------------------------------------------------------

// Index of the first NaN or Inf in x, or -1 if all finite. x is (n).
ptrdiff_t moe_find_nonfinite(const float *x, size_t n);

// ---- statistics of repeated measurements --------------------------------------

// The median of v (n >= 1); sorts v in place.
double moe_median(double *v, int n);
// The q-quantile (0 <= q <= 1) of n >= 1 values sorted ascending, linearly
// interpolated between the nearest ranks.
double moe_quantile_sorted(const double *sorted, int n, double q);

#ifdef __cplusplus
}
#endif
#endif  // MOE_CORE_H
