// Shared pieces of the moe command-line tool: option parsing with range
// errors, and the exit codes. The CLI uses only the public headers.
#ifndef MOE_CLI_H
#define MOE_CLI_H

#include <stdio.h>

#include "moe/moe.h"
#include "moe/perf.h"

// Exit codes of every subcommand.
enum { CLI_OK = 0, CLI_FAILED = 1, CLI_USAGE = 2 };

// Prints "moe: error: <message>" to stderr.
void cli_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

// Option cursor over argv[first..argc). For "--name VALUE" and "--name=VALUE".
typedef struct {
  int argc;
  char **argv;
  int i;              // index of the current argument
  const char *value;  // value of the last matched option with a value
  int bad;            // set when an option was malformed (message already printed)
} cli_args;

void cli_args_init(cli_args *a, int argc, char **argv, int first);
int cli_args_done(const cli_args *a);
const char *cli_args_peek(const cli_args *a);
// If the current argument is the flag `name`, consumes it and returns 1.
int cli_flag(cli_args *a, const char *name);
// If the current argument is option `name`, consumes it and its value, stores
// the value in a->value and returns 1 (sets a->bad if the value is missing).
int cli_opt(cli_args *a, const char *name);
// Parse a->value into *out checking [lo, hi]; prints the error naming opt and
// sets a->bad on failure.
void cli_parse_int(cli_args *a, const char *opt, long lo, long hi, int *out);
// on|off into 1|0 (the error names opt and the two values).
void cli_parse_on_off(cli_args *a, const char *opt, int *out);
// --backend NAME: a compute backend this build can run (moe_backend_find);
// stores the name. Prints the error naming the valid ones and sets a->bad.
void cli_parse_backend(cli_args *a, const char *opt, const char **out);
// --precision fp32|bf16 into *out (a moe_precision).
void cli_parse_precision(cli_args *a, const char *opt, int *out);
// --skew SPEC: a named expert popularity (moe_skew_parse) into *out.
void cli_parse_skew(cli_args *a, const char *opt, moe_skew *out);
// A trace skew's file against the layer's shape (read now, so that a bad
// trace is a usage error before any run): CLI_OK, CLI_USAGE or CLI_FAILED,
// the message printed when print is 1. Other skews: CLI_OK.
int cli_check_skew(const moe_skew *skew, int num_experts, int top_k, int print);
// s as a quoted JSON string (quotes, backslashes and control bytes escaped).
void cli_json_string(FILE *f, const char *s);
// Makes `name` the backend of moe_gemm with `threads` threads and
// `precision` (a moe_precision), after moe_compute_check, and writes a
// description ("openblas: OpenBLAS ..., fp32, 2 threads") to desc. Returns
// CLI_OK, or prints the error and returns CLI_USAGE.
int cli_use_compute(const char *name, int threads, int precision, char *desc, size_t len);
void cli_parse_double(cli_args *a, const char *opt, double lo, double hi, double *out);
// Parse a->value as a non-negative integer (no sign) into *out, or print the
// error naming opt and the range [0, ULLONG_MAX] and set a->bad.
void cli_parse_u64(cli_args *a, const char *opt, unsigned long long *out);
// Parse a->value as a size ("512M", "2G", moe_size_parse) into *out, or print
// the error naming opt and the accepted form and set a->bad.
void cli_parse_size(cli_args *a, const char *opt, size_t *out);
// The same, with 0 (or 0 with a unit) allowed: where 0 means none or "one".
void cli_parse_size_or_zero(cli_args *a, const char *opt, size_t *out);

// The help line of --max-memory, shared by every command that allocates a shape.
#define CLI_MAX_MEMORY_HELP                                                          \
  "  --max-memory SIZE     refuse to start when a rank would need more than SIZE\n"  \
  "                        (e.g. 512M, 2G; per rank) [the node's MemAvailable, or\n" \
  "                        its cgroup's memory.max room, / its ranks]\n"

// Memory bound of a one-process command (moe_memory_check_process: need + the
// process baseline against max_memory (> 0) or the available memory). CLI_OK,
// or CLI_USAGE after printing the refusal (what to change: hint).
int cli_memory_check(moe_ctx *ctx, moe_memory_need *need, size_t max_memory, const char *hint);

// Layer-config options shared by the commands that take a layer shape. Each
// helper consumes the current argument when it is one of its options, sets
// the matching CLI_LAYER_* bit in *set and returns 1; else returns 0.
enum {
  CLI_LAYER_TOKENS = 1,
  CLI_LAYER_MODEL = 2,
  CLI_LAYER_HIDDEN = 4,
  CLI_LAYER_CAPACITY = 8,
  CLI_LAYER_CONFIG = 16,
  CLI_LAYER_EXPERTS = 32,
  CLI_LAYER_TOPK = 64,
  CLI_LAYER_ACT = 128,
  CLI_LAYER_RENORM = 256
};
// --tokens, --model, --hidden, --experts, --topk, --capacity-factor.
int cli_layer_shape_opt(cli_args *a, moe_layer_config *cfg, unsigned *set);
// --act gelu|relu, --renormalize, --config FILE (layer config JSON).
int cli_layer_config_opt(cli_args *a, moe_layer_config *cfg, unsigned *set);

// An output file written atomically: to PATH.tmp, renamed onto PATH by
// cli_out_commit, so a failed run never leaves a half-written PATH.
typedef struct {
  FILE *f;  // NULL when not open
  const char *path;
  char tmp[4096];
} cli_out;

// Opens PATH.tmp for writing: CLI_OK, or CLI_FAILED after printing why.
int cli_out_open(cli_out *o, const char *path);
// Closes and renames onto the path: CLI_OK, or CLI_FAILED after printing why
// (the temporary is removed). o is closed afterwards either way.
int cli_out_commit(cli_out *o);
// Closes and removes the temporary; a no-op when o is not open.
void cli_out_abort(cli_out *o);
// Under mpirun (cli_mpi.c, MPI builds): rank 0 opens path (nothing when path is
// NULL) and every rank learns whether it could: CLI_OK, or cli_out_open's error
// (CLI_USAGE: a directory, or a file that cannot be created) on all.
int cli_out_open_root(cli_out *o, const char *path, int rank);
// Collective: whether rank 0 could write path (a NULL path: yes), tried and
// removed before the work that ends by writing it; else the error (CLI_USAGE).
int cli_out_probe_root(const char *path, int rank);
// Under mpirun (cli_mpi.c): the memory bound of an MPI command. estimate is
// this rank's status of computing need; need gets the process baseline, the
// ranks agree on the estimate and check every rank's need against its limit
// (moe_comm_memory_check with max_memory and hint). CLI_OK, or CLI_USAGE on
// every rank with the refusal printed on rank 0.
int cli_memory_check_world(moe_ctx *ctx, moe_status estimate, moe_memory_need *need,
                           size_t max_memory, const char *hint, int rank);
// Under mpirun (cli_mpi.c): every rank loads the profile at path and checks
// that it was calibrated on these world ranks, with EP over all of them (ep).
// CLI_OK, or CLI_USAGE with the reason printed on rank 0 (every rank reads
// the same file, so every rank fails alike).
int cli_profile_load_for(moe_ctx *ctx, const char *path, int world, int ep, int rank,
                         moe_profile *out);

// --hang-timeout SECONDS of the MPI commands (cli_args.c): when it is the
// current argument, consumes it, sets *seconds (in [0, CLI_HANG_TIMEOUT_MAX];
// 0 = off) or prints the error and sets a->bad, and returns 1; else 0.
#define CLI_HANG_TIMEOUT_DEFAULT 300.0
#define CLI_HANG_TIMEOUT_MAX 86400.0
int cli_hang_timeout_opt(cli_args *a, double *seconds);
// Its --help lines (the same in every command).
#define CLI_HANG_TIMEOUT_HELP                                                         \
  "  --hang-timeout S      when a rank has waited S seconds for the others, probe\n"  \
  "                        every rank: one that does not answer (stopped, hung) or\n" \
  "                        a deadlock aborts the job with a line naming the rank\n"   \
  "                        and the operation; a slow rank only gets a warning;\n"     \
  "                        0 = off [300]\n"
// Under mpirun (cli_mpi.c): starts the hang watchdog over MPI_COMM_WORLD
// (moe_watchdog_start; every rank passes the same seconds). *wd
// stays NULL when seconds is 0. CLI_OK, or CLI_FAILED with the reason printed.
// Stop it with moe_watchdog_stop before MPI_Finalize.
struct moe_watchdog;
int cli_watchdog_start(moe_ctx *ctx, double seconds, int rank, struct moe_watchdog **wd);

// Under mpirun every rank parses the same argv; only rank 0 should print.
// cli_silence_begin(on, saved) sends stdout and stderr to /dev/null when on;
// cli_silence_end(saved) restores them (a no-op when nothing was silenced).
void cli_silence_begin(int on, int saved[2]);
void cli_silence_end(int saved[2]);

int cmd_bench(int argc, char **argv);
int cmd_bench_layer(int argc, char **argv);
// The distributed `bench layer` (cmd_bench_layer_ep.c; needs MPI): cmd_bench_layer hands
// over to it when cli_bench_layer_is_ep says so (an option of it is given, or
// the launcher started more than one rank).
int cmd_bench_layer_ep(int argc, char **argv);
int cli_bench_layer_is_ep(int argc, char **argv);
void cli_bench_layer_usage(FILE *f);              // both benchmarks' options
void cli_bench_layer_ep_usage(FILE *f);           // the distributed benchmark's part
int cmd_bench_a2a(int argc, char **argv);         // needs MPI (MOE_CLI_MPI)
int cmd_bench_contention(int argc, char **argv);  // needs MPI (MOE_CLI_MPI)
int cmd_bench_parm(int argc, char **argv);        // needs MPI (MOE_CLI_MPI)
int cmd_bench_compress(int argc, char **argv);
int cmd_bench_serve(int argc, char **argv);  // an HTTP client (libcurl)
int cmd_simulate(int argc, char **argv);
int cmd_roofline(int argc, char **argv);   // cmd_simulate.c
int cmd_calibrate(int argc, char **argv);  // MPI (MOE_CLI_MPI); an error without it

int cmd_train(int argc, char **argv);     // MPI (MOE_CLI_MPI)
int cmd_sample(int argc, char **argv);    // one process
int cmd_generate(int argc, char **argv);  // MPI (MOE_CLI_MPI)
int cmd_serve(int argc, char **argv);     // MPI (MOE_CLI_MPI)

#if MOE_CLI_MPI
#include "moe/infer.h"
// Under mpirun (cli_mpi.c): moe_infer_create over MPI_COMM_WORLD (the memory
// bound included); on failure rank 0 prints "CMD: <reason>". CLI_OK, CLI_USAGE
// (bad input, not enough memory) or CLI_FAILED.
int cli_infer_create(moe_ctx *ctx, const moe_infer_config *ic, int rank, const char *cmd,
                     moe_infer **out);
// The engine options moe generate and moe serve share (--slots, --step-rows,
// --prefill-chunk, --a2a, the placement): 1 when the current argument is one
// of them (consumed into ic; a bad value is printed on rank 0 and sets
// a->bad), else 0.
int cli_infer_engine_opt(cli_args *a, moe_infer_config *ic, const char **record_file, int rank,
                         const char *cmd);
// Collective, on every rank once the engine has stopped (rank 0 after
// moe_infer_shutdown, the others after moe_infer_follow returned OK): with
// record_file, the ranks' path profiles merged on rank 0, which writes them
// to it (atomically; only when `keep`: a failed run gathers them all the same,
// so that no rank waits, and writes nothing) with a line on stderr. CLI_OK, or
// CLI_FAILED (printed on rank 0). Nothing without record_file.
int cli_infer_paths_write(moe_ctx *ctx, moe_infer *eng, const char *record_file, int rank, int keep,
                          const char *cmd);
// Rank 0: with ic->paths, each MoE block's estimation accuracy and fine-tune
// rate on stderr.
void cli_infer_paths_report(moe_infer *eng, const moe_infer_config *ic, const char *cmd);
// Rank 0, after the run: the placement's line ("CMD: placement eplb: ...")
// on stderr, nothing for uniform placement or one rank.
void cli_infer_placement_report(moe_infer *eng, const moe_infer_stats *s,
                                const moe_infer_config *ic, const char *cmd);
#endif
// Their help lines.
#define CLI_INFER_ENGINE_HELP                                                            \
  "  --slots N             sequences decoded at once per rank [32]\n"                    \
  "  --step-rows N         rows one rank computes per step at most [256]\n"              \
  "  --prefill-chunk N     prompt rows of one sequence per step at most [64]\n"          \
  "  --a2a NAME            all-to-all algorithm of the MoE layers [mpi]\n"               \
  "  --placement NAME      where expert copies go (docs/inference.md; the text is\n"     \
  "                        the same): uniform (every expert on its home rank\n"          \
  "                        only), eplb (copies of the busiest experts in spare\n"        \
  "                        slots, re-planned from the observed load) or lina\n"          \
  "                        (before each MoE block, copies for the popularity the\n"      \
  "                        --paths profile estimates; after the gate, re-planned\n"      \
  "                        when the estimated top-2K experts missed) [uniform]\n"        \
  "  --place-slots N       eplb, lina: expert copies a rank may hold,\n"                 \
  "                        [1, E - E/ranks] [2]\n"                                       \
  "  --place-window N      eplb: steps of load a plan averages [16]\n"                   \
  "  --place-every N       eplb: re-plan every N steps [16]\n"                           \
  "  --place-replan on|off lina: phase 2, the re-plan after the gate [on]\n"             \
  "  --record-paths FILE   record a path profile of the run's tokens (Lina: the\n"       \
  "                        next MoE block's choices per path of earlier choices)\n"      \
  "  --path-len L          its path length, [1, 8] [3]\n"                                \
  "  --max-paths N         its paths per MoE block at most (a profile takes at most\n"   \
  "                        256 MiB) [4096]\n"                                            \
  "  --paths FILE          a recorded profile: report how well it estimates each\n"      \
  "                        step's expert popularity (Lina's accuracy, fine-tune rate)\n" \
  "  --routing-trace FILE  write every step's rows per MoE block and rank (and with\n"   \
  "                        --paths the estimated popularity) as moe train does; moe\n"   \
  "                        simulate --lina replays it\n"

#endif
