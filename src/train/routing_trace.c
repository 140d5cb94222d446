// Routing traces of training (moe_train_config.routing_trace): per step and
// MoE layer, the (source rank x expert) matrix of rows each rank's tokens
// sent to each expert (kept choices, after capacity), gathered to rank 0 and
// written as JSON lines. The skew a trained router produces, recorded so
// that balancing policies can be planned and replayed on it
// (docs/balance.md "Routing traces").
//
// The format and its writer: src/layer/trace_shares.c. A resumed run appends
// lines without a second header when the file exists and is a trace of the
// same shape (else it is refused, nothing written).
//
// Not here: reading traces back (moe_routing_trace_load).
#define _POSIX_C_SOURCE 200809L  // getline
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train/train_internal.h"

struct moe_routing_trace {
  FILE *f;
  char path[512];
  int world, E;
  int32_t *mine, *all;  // (E) this rank's counts, (P, E) gathered on rank 0
};

// An existing trace a resumed run appends to: its header must be this run's
// (ranks, experts, top-k, tokens per rank, MoE blocks). Its body is kept
// through step keep_step (the checkpoint's): the lines of steps run after the
// checkpoint by the run that stopped, and a partial last line of one that was
// killed mid-write, are dropped (with a warning) so the resumed run's lines
// follow without duplicates. Rewritten through a temporary file (renamed).
static moe_status check_append(moe_ctx *ctx, const char *path, int P, const moe_gpt_config *model,
                               int tokens_per_rank, const int *blocks, int n_blocks,
                               long long keep_step) {
  moe_status st = MOE_STATUS_OK;
  FILE *in = NULL, *out = NULL;
  char *line = NULL, tmp[600];
  size_t cap = 0;
  moe_routing_trace_data d;
  if (moe_routing_trace_load_header(ctx, path, &d) != MOE_STATUS_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", moe_ctx_error(ctx));
    moe_ctx_clear_error(ctx);
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
             "a resumed run appends to the routing trace '%s', which cannot be read (%s): give "
             "another file",
             path, why);
  }
  int same = d.ranks == P && d.experts == model->moe.num_experts && d.top_k == model->moe.top_k &&
             d.tokens_per_rank == tokens_per_rank && d.n_layers == n_blocks;
  for (int i = 0; same && i < n_blocks; i++) same = d.layers[i] == blocks[i];
  MOE_FAIL_IF(ctx, !same, MOE_STATUS_INVALID_ARG,
              "the routing trace '%s' was written by another run (ranks %d, experts %d, top_k "
              "%d, tokens per rank %d, %d MoE layers); this run has %d, %d, %d, %d and %d: a "
              "resumed run appends only to its own trace, give another file",
              path, d.ranks, d.experts, d.top_k, d.tokens_per_rank, d.n_layers, P,
              model->moe.num_experts, model->moe.top_k, tokens_per_rank, n_blocks);
  MOE_FAIL_IF(ctx, snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp,
              MOE_STATUS_INVALID_ARG, "routing trace path '%s' is too long", path);
  in = fopen(path, "r");
  out = in ? fopen(tmp, "w") : NULL;
  MOE_FAIL_IF(ctx, !in || !out, MOE_STATUS_INVALID_ARG, "cannot rewrite the routing trace '%s': %s",
              path, strerror(errno));
  long long kept = 0, dropped = 0;
  int partial = 0, lineno = 0;
  for (ssize_t n; (n = getline(&line, &cap, in)) >= 0;) {
    if (++lineno == 1) {  // the header, checked above
      fputs(line, out);
      continue;
    }
    long long step = 0;
    if (n == 0 || line[n - 1] != '\n') {
      partial = 1;  // cut off mid-write: nothing can follow it
      break;
    }
    if (sscanf(line, "{\"step\": %lld", &step) == 1 && step <= keep_step) {
      fputs(line, out);
      kept++;
    } else {
      dropped++;
    }
  }
  MOE_FAIL_IF(ctx, ferror(in) || fflush(out) != 0 || ferror(out), MOE_STATUS_IO,
              "cannot rewrite the routing trace '%s' (through '%s'): %s", path, tmp,
              strerror(errno));
  fclose(out);
  out = NULL;
  MOE_FAIL_IF(ctx, rename(tmp, path) != 0, MOE_STATUS_IO, "cannot replace '%s' with '%s': %s", path,
              tmp, strerror(errno));
  if (dropped || partial)
    MOE_WARN("%s: kept %lld lines through step %lld (the checkpoint's); dropped %lld after it%s",
             path, kept, keep_step, dropped, partial ? " and a partial last line" : "");
done:
  if (in) fclose(in);
  if (out) {
    fclose(out);
    remove(tmp);
  }
  free(line);  // getline's allocator
  return st;
}

moe_status moe_routing_trace_open_(moe_ctx *ctx, MPI_Comm world, const char *path, int append,
                                   long long keep_step, const moe_gpt_config *model,
                                   int tokens_per_rank, moe_routing_trace **out) {
  moe_status st = MOE_STATUS_OK;
  moe_routing_trace *t = NULL;
  int rank = 0, P = 1;
  *out = NULL;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &P);
  const int E = model->moe.num_experts;
  t = moe_calloc(1, sizeof *t);
  moe_status local = t ? MOE_STATUS_OK
                       : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                      "routing trace: out of memory");
  if (t) {
    t->world = P;
    t->E = E;
    t->mine = moe_calloc((size_t)E, sizeof(int32_t));
    t->all = rank == 0 ? moe_calloc((size_t)P * E, sizeof(int32_t)) : NULL;
    if (!t->mine || (rank == 0 && !t->all))
      local = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                           "routing trace: cannot allocate %d x %d counts", P, E);
  }
  if (local == MOE_STATUS_OK && rank == 0) {
    snprintf(t->path, sizeof t->path, "%s", path);
    int blocks[MOE_GPT_MAX_LAYERS], n_blocks = 0;
    for (int b = 0; b < model->n_layer; b++)
      if (moe_gpt_block_is_moe(model, b)) blocks[n_blocks++] = b;
    // a resumed run appends to a trace of its own shape only (an empty file
    // gets the header); anything else is refused before a line is written
    struct stat sb;
    const int has_header = append && stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0;
    if (has_header)
      local = check_append(ctx, path, P, model, tokens_per_rank, blocks, n_blocks, keep_step);
    t->f = local != MOE_STATUS_OK ? NULL : fopen(path, append ? "a" : "w");
    if (local != MOE_STATUS_OK) {
      // the check's error
    } else if (!t->f) {
      // a path that cannot be written is a bad argument (exit 2 in the CLI)
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "cannot open the routing trace '%s': %s", path, strerror(errno));
    } else if (!has_header) {
      moe_routing_trace_write_header(t->f, P, E, model->moe.top_k, tokens_per_rank, blocks,
                                     n_blocks);
      if (fflush(t->f) != 0)
        local = moe_error_at(ctx, MOE_STATUS_IO, __FILE__, __LINE__,
                             "cannot write the routing trace '%s': %s", path, strerror(errno));
    }
  }
  MOE_TRY(moe_comm_agree(ctx, world, local, "opening the routing trace"));
  *out = t;
  t = NULL;
done:
  moe_routing_trace_close_(t);
  return st;
}

moe_status moe_routing_trace_step_(moe_ctx *ctx, MPI_Comm world, moe_routing_trace *t, int step,
                                   void *const *impl, int n_blocks) {
  moe_status st = MOE_STATUS_OK;
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  for (int b = 0; b < n_blocks; b++) {
    if (!impl[b]) continue;
    const moe_route *r = moe_ep_layer_get_route(moe_train_ep_layer(impl[b], NULL, NULL));
    memcpy(t->mine, r->count, (size_t)t->E * sizeof(int32_t));
    MOE_MPI_TRY_OP(ctx, "gather of the routing counts",
                   MPI_Gather(t->mine, t->E, MPI_INT32_T, t->all, t->E, MPI_INT32_T, 0, world));
    if (rank != 0 || !t->f) continue;
    moe_routing_trace_write_step(t->f, step, b, t->all, t->world, t->E, (size_t)t->E, NULL);
  }
  // A full disk must not stop training (nor leave the other ranks waiting):
  // rank 0 warns and stops writing.
  if (rank == 0 && t->f && (ferror(t->f) || fflush(t->f) != 0)) {
    MOE_WARN("routing trace '%s': %s; no more lines are written", t->path, strerror(errno));
    fclose(t->f);
    t->f = NULL;
  }
done:
  return st;
}

void moe_routing_trace_close_(moe_routing_trace *t) {
  if (!t) return;
  if (t->f) fclose(t->f);
  moe_free(t->mine);
  moe_free(t->all);
  moe_free(t);
}
