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
// bytes rounded up to a multiple of 64 (the alignment of moe_malloc).
static inline size_t moe_align64(size_t bytes) { return (bytes + 63u) & ~(size_t)63u; }

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
