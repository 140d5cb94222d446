// moe_trace_write_ranks (include/moe/parallel.h): every rank serializes its
// passes into one flat byte buffer, rank 0 gathers the buffers (MPI_Gather of
// the sizes, then MPI_Gatherv), rebuilds a task graph (names and chunks only)
// and a record array per pass, and writes them all with moe_trace_write.
//
// Wire format (native byte order and sizes: the ranks of one job run the same
// binary on the same architecture):
//   u64 n_passes
//   per pass: u64 n_tasks, u64 offset_ns, char label[MOE_TASK_NAME_MAX] (NUL
//   padded, empty for none), then per task WIRE_TASK bytes:
//     char name[MOE_TASK_NAME_MAX], i32 chunk, i32 stream, i32 ran, u32 polls,
//     u64 start_ns, u64 end_ns
//
// Agreement: three decisions are made collectively so that no rank waits in a
// gather the others skipped: (1) did every rank serialize its passes, (2) can
// rank 0 receive them all (sizes fit MPI's int counts, memory), (3) did the
// write succeed. Every rank returns the same status.
#define _POSIX_C_SOURCE 200809L  // strnlen
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "moe/parallel.h"

#define WIRE_HEADER 8                       // n_passes
#define WIRE_PASS (16 + MOE_TASK_NAME_MAX)  // n_tasks, offset_ns, label
#define WIRE_TASK (MOE_TASK_NAME_MAX + 32)  // name, chunk, stream, ran, polls, start, end

static unsigned char *put(unsigned char *p, const void *v, size_t n) {
  memcpy(p, v, n);
  return p + n;
}

static const unsigned char *get(const unsigned char *p, void *v, size_t n) {
  memcpy(v, p, n);
  return p + n;
}

// Serializes this rank's passes into a new buffer (*out, *bytes).
static moe_status serialize(moe_ctx *ctx, const moe_trace_pass *passes, int n_passes,
                            unsigned char **out, size_t *bytes) {
  moe_status st = MOE_STATUS_OK;
  *out = NULL;
  *bytes = 0;
  MOE_FAIL_IF(ctx, n_passes < 0 || (n_passes > 0 && !passes), MOE_STATUS_INVALID_ARG,
              "trace: passes must be given (n_passes %d)", n_passes);
  size_t total = WIRE_HEADER;
  for (int p = 0; p < n_passes; p++) {
    const moe_task_graph *g = passes[p].graph;
    MOE_FAIL_IF(ctx, !g || g->n_tasks < 0 || (g->n_tasks > 0 && (!passes[p].records || !g->tasks)),
                MOE_STATUS_INVALID_ARG, "trace: pass %d has no graph or no records", p);
    total += WIRE_PASS + (size_t)g->n_tasks * WIRE_TASK;
  }
  unsigned char *buf = moe_malloc(total);
  MOE_FAIL_IF(ctx, !buf, MOE_STATUS_OUT_OF_MEMORY, "trace: cannot allocate %zu bytes", total);
  unsigned char *w = buf;
  const uint64_t np = (uint64_t)n_passes;
  w = put(w, &np, 8);
  for (int p = 0; p < n_passes; p++) {
    const moe_task_graph *g = passes[p].graph;
    const uint64_t nt = (uint64_t)g->n_tasks, off = passes[p].offset_ns;
    w = put(w, &nt, 8);
    w = put(w, &off, 8);
    char label[MOE_TASK_NAME_MAX];
    memset(label, 0, sizeof label);
    if (passes[p].label)
      memcpy(label, passes[p].label, strnlen(passes[p].label, MOE_TASK_NAME_MAX - 1));
    w = put(w, label, MOE_TASK_NAME_MAX);
    for (int i = 0; i < g->n_tasks; i++) {
      const moe_task *t = &g->tasks[i];
      const moe_task_record *r = &passes[p].records[i];
      char name[MOE_TASK_NAME_MAX];
      memset(name, 0, sizeof name);
      memcpy(name, t->name, strnlen(t->name, MOE_TASK_NAME_MAX - 1));
      const int32_t chunk = t->chunk, stream = (int32_t)r->stream, ran = r->ran;
      const uint32_t polls = r->polls;
      w = put(w, name, MOE_TASK_NAME_MAX);
      w = put(w, &chunk, 4);
      w = put(w, &stream, 4);
      w = put(w, &ran, 4);
      w = put(w, &polls, 4);
      w = put(w, &r->start_ns, 8);
      w = put(w, &r->end_ns, 8);
    }
  }
  *out = buf;
  *bytes = total;
done:
  return st;
}

// Rank 0: rebuilds the passes of every rank from the gathered buffers and
// writes the trace.
static moe_status write_gathered(moe_ctx *ctx, const char *path, const unsigned char *all,
                                 const int *counts, const int *displs, int size) {
  moe_status st = MOE_STATUS_OK;
  moe_trace_pass *tp = NULL;
  moe_task_graph *graphs = NULL;
  moe_task *tasks = NULL;
  moe_task_record *recs = NULL;
  char(*labels)[MOE_TASK_NAME_MAX] = NULL;
  // step 1: count passes and tasks, checking every length against the buffer
  size_t n_passes = 0, n_tasks = 0;
  for (int r = 0; r < size; r++) {
    const unsigned char *p = all + displs[r], *end = p + counts[r];
    uint64_t np = 0;
    MOE_FAIL_IF(ctx, counts[r] < WIRE_HEADER, MOE_STATUS_BAD_FORMAT,
                "trace: rank %d sent a truncated buffer", r);
    p = get(p, &np, 8);
    for (uint64_t k = 0; k < np; k++) {
      uint64_t nt = 0;
      MOE_FAIL_IF(ctx, (size_t)(end - p) < WIRE_PASS, MOE_STATUS_BAD_FORMAT,
                  "trace: rank %d sent a truncated buffer", r);
      p = get(p, &nt, 8);
      p += 8 + MOE_TASK_NAME_MAX;
      MOE_FAIL_IF(ctx, nt > (uint64_t)INT_MAX || (size_t)(end - p) / WIRE_TASK < nt,
                  MOE_STATUS_BAD_FORMAT, "trace: rank %d sent a truncated buffer", r);
      p += nt * WIRE_TASK;
      n_tasks += nt;
    }
    n_passes += np;
  }
  if (n_passes > 0) {
    tp = moe_calloc(n_passes, sizeof *tp);
    graphs = moe_calloc(n_passes, sizeof *graphs);
    labels = moe_calloc(n_passes, sizeof *labels);
    MOE_FAIL_IF(ctx, !tp || !graphs || !labels, MOE_STATUS_OUT_OF_MEMORY,
                "trace: cannot allocate %zu passes", n_passes);
  }
  if (n_tasks > 0) {
    tasks = moe_calloc(n_tasks, sizeof *tasks);
    recs = moe_calloc(n_tasks, sizeof *recs);
    MOE_FAIL_IF(ctx, !tasks || !recs, MOE_STATUS_OUT_OF_MEMORY,
                "trace: cannot allocate %zu task records", n_tasks);
  }
  // step 2: fill the graphs (names and chunks) and records
  size_t pi = 0, ti = 0;
  for (int r = 0; r < size; r++) {
    const unsigned char *p = all + displs[r];
    uint64_t np = 0;
    p = get(p, &np, 8);
    for (uint64_t k = 0; k < np; k++, pi++) {
      uint64_t nt = 0, off = 0;
      p = get(p, &nt, 8);
      p = get(p, &off, 8);
      p = get(p, labels[pi], MOE_TASK_NAME_MAX);
      labels[pi][MOE_TASK_NAME_MAX - 1] = '\0';
      moe_task_graph *g = &graphs[pi];
      g->tasks = nt > 0 ? tasks + ti : NULL;
      g->n_tasks = g->max_tasks = (int)nt;
      tp[pi].rank = r;
      tp[pi].graph = g;
      tp[pi].records = nt > 0 ? recs + ti : NULL;
      tp[pi].offset_ns = off;
      tp[pi].label = labels[pi];
      for (uint64_t i = 0; i < nt; i++, ti++) {
        moe_task *t = &tasks[ti];
        moe_task_record *rec = &recs[ti];
        int32_t chunk = 0, stream = 0, ran = 0;
        p = get(p, t->name, MOE_TASK_NAME_MAX);
        t->name[MOE_TASK_NAME_MAX - 1] = '\0';
        p = get(p, &chunk, 4);
        p = get(p, &stream, 4);
        p = get(p, &ran, 4);
        p = get(p, &rec->polls, 4);
        p = get(p, &rec->start_ns, 8);
        p = get(p, &rec->end_ns, 8);
        t->chunk = chunk;
        t->kind = -1;  // not carried: the trace needs names and chunks only
        t->stream = rec->stream = stream == MOE_STREAM_COMM ? MOE_STREAM_COMM : MOE_STREAM_COMPUTE;
        rec->ran = ran;
      }
    }
  }
  MOE_TRY(moe_trace_write(ctx, path, tp, (int)n_passes));
done:
  moe_free(tp);
  moe_free(graphs);
  moe_free(labels);
  moe_free(tasks);
  moe_free(recs);
  return st;
}

moe_status moe_trace_write_ranks(moe_ctx *ctx, MPI_Comm comm, const char *path,
                                 const moe_trace_pass *passes, int n_passes) {
  moe_status st = MOE_STATUS_OK;
  unsigned char *mine = NULL, *all = NULL;
  uint64_t *sizes = NULL;
  int *counts = NULL, *displs = NULL;
  int rank = 0, size = 1;
  MOE_MPI_TRY(ctx, MPI_Comm_rank(comm, &rank));
  MOE_MPI_TRY(ctx, MPI_Comm_size(comm, &size));

  // step 1: serialize; rank 0 also needs its gather tables and a path
  size_t my_bytes = 0;
  moe_status local = serialize(ctx, passes, n_passes, &mine, &my_bytes);
  if (local == MOE_STATUS_OK && rank == 0) {
    sizes = moe_calloc((size_t)size, sizeof *sizes);
    counts = moe_calloc((size_t)size, sizeof *counts);
    displs = moe_calloc((size_t)size, sizeof *displs);
    if (!path) {
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "trace: rank 0 must give a path");
    } else if (!sizes || !counts || !displs) {
      local = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                           "trace: cannot allocate gather tables for %d ranks", size);
    }
  }
  {
    // decision 1: the lowest failing rank, agreed by everyone
    const int mine_fail = local == MOE_STATUS_OK ? INT_MAX : rank;
    int first = INT_MAX;
    MOE_MPI_TRY_OP(ctx, "trace gathering",
                   MPI_Allreduce(&mine_fail, &first, 1, MPI_INT, MPI_MIN, comm));
    if (local != MOE_STATUS_OK) {
      st = local;  // this rank's own message is in ctx
      goto done;
    }
    if (first != INT_MAX) {
      MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
               "trace write failed: rank %d could not prepare its passes (see that rank's error)",
               first);
    }
  }
  // step 2: sizes to rank 0, which checks that they fit MPI's int counts
  {
    const uint64_t b = (uint64_t)my_bytes;
    MOE_MPI_TRY_OP(ctx, "trace gathering",
                   MPI_Gather(&b, 1, MPI_UINT64_T, sizes, 1, MPI_UINT64_T, 0, comm));
  }
  int verdict[2] = {MOE_STATUS_OK, 0};  // status of rank 0's check, then of the write
  if (rank == 0) {
    uint64_t total = 0;
    for (int r = 0; r < size && verdict[0] == MOE_STATUS_OK; r++) {
      total += sizes[r];
      if (sizes[r] > (uint64_t)INT_MAX || total > (uint64_t)INT_MAX) {
        verdict[0] = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                                  "trace: the passes of ranks 0..%d take %llu bytes, more than "
                                  "one MPI gather can move (%d)",
                                  r, (unsigned long long)total, INT_MAX);
        break;
      }
      counts[r] = (int)sizes[r];
      displs[r] = (int)(total - sizes[r]);
    }
    if (verdict[0] == MOE_STATUS_OK) {
      all = moe_malloc(total > 0 ? (size_t)total : 1);
      if (!all) {
        verdict[0] = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                  "trace: cannot allocate %llu bytes for the gathered passes",
                                  (unsigned long long)total);
      }
    }
  }
  // decision 2: whether rank 0 can receive
  MOE_MPI_TRY_OP(ctx, "trace gathering", MPI_Bcast(verdict, 1, MPI_INT, 0, comm));
  if (verdict[0] != MOE_STATUS_OK) {
    if (rank == 0) {
      st = (moe_status)verdict[0];
      goto done;
    }
    MOE_FAIL(ctx, (moe_status)verdict[0], "trace write failed on rank 0");
  }
  // step 3: gather and write on rank 0
  MOE_MPI_TRY_OP(
      ctx, "trace gathering",
      MPI_Gatherv(mine, (int)my_bytes, MPI_BYTE, all, counts, displs, MPI_BYTE, 0, comm));
  if (rank == 0) verdict[1] = (int)write_gathered(ctx, path, all, counts, displs, size);
  // decision 3: the write's result
  MOE_MPI_TRY_OP(ctx, "trace gathering", MPI_Bcast(&verdict[1], 1, MPI_INT, 0, comm));
  if (verdict[1] != MOE_STATUS_OK) {
    if (rank == 0) {
      st = (moe_status)verdict[1];
      goto done;
    }
    MOE_FAIL(ctx, (moe_status)verdict[1], "trace write failed on rank 0");
  }
done:
  moe_free(mine);
  moe_free(all);
  moe_free(sizes);
  moe_free(counts);
  moe_free(displs);
  return st;
}
