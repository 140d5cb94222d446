// Chrome trace output of executor passes (the Trace Event Format's "X"
// complete events plus process/thread name metadata), for Perfetto and
// chrome://tracing. Not a live tracer: it writes records the executor already
// keeps. Merging ranks is the caller's job (gather each rank's pass, then
// write them together on one rank).
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "moe/sched.h"

// Task names are short identifiers ("A1^2", "#7"); escape what JSON needs anyway.
static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    const unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') {
      fprintf(f, "\\%c", ch);
    } else if (ch < 0x20) {
      fprintf(f, "\\u%04x", ch);
    } else {
      fputc(ch, f);
    }
  }
  fputc('"', f);
}

static const char *stream_name(moe_stream s) { return s == MOE_STREAM_COMM ? "comm" : "compute"; }

moe_status moe_trace_write(moe_ctx *ctx, const char *path, const moe_trace_pass *passes,
                           int n_passes) {
  moe_status st = MOE_STATUS_OK;
  FILE *f = NULL;
  char tmp[4096];
  MOE_FAIL_IF(ctx, !path || (n_passes > 0 && !passes) || n_passes < 0, MOE_STATUS_INVALID_ARG,
              "trace: path and passes must be given (n_passes %d)", n_passes);
  for (int p = 0; p < n_passes; p++) {
    MOE_FAIL_IF(ctx, !passes[p].graph || (passes[p].graph->n_tasks > 0 && !passes[p].records),
                MOE_STATUS_INVALID_ARG, "trace: pass %d has no graph or no records", p);
  }
  MOE_FAIL_IF(ctx, snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp,
              MOE_STATUS_INVALID_ARG, "trace: path is too long");
  f = fopen(tmp, "w");
  MOE_FAIL_IF(ctx, !f, MOE_STATUS_IO, "trace: cannot write '%s': %s", tmp, strerror(errno));
  fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", f);
  int first = 1;
  // step 1: names of every rank's process and streams (once per rank)
  for (int p = 0; p < n_passes; p++) {
    int seen = 0;
    for (int q = 0; q < p; q++) seen |= passes[q].rank == passes[p].rank;
    if (seen) continue;
    const int pid = passes[p].rank;
    fprintf(f,
            "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
            "\"args\": {\"name\": \"rank %d\"}}",
            first ? "" : ",\n", pid, pid);
    first = 0;
    for (int s = 0; s < MOE_STREAM_COUNT_; s++) {
      fprintf(f,
              ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
              "\"args\": {\"name\": \"%s\"}}",
              pid, s, stream_name((moe_stream)s));
    }
  }
  // step 2: one complete event per task that ran
  for (int p = 0; p < n_passes; p++) {
    const moe_trace_pass *ps = &passes[p];
    for (int i = 0; i < ps->graph->n_tasks; i++) {
      const moe_task_record *r = &ps->records[i];
      if (!r->ran) continue;
      const moe_task *t = &ps->graph->tasks[i];
      const double ts = (double)(ps->offset_ns + r->start_ns) / 1e3;
      const double dur = (double)(r->end_ns - r->start_ns) / 1e3;
      const int labelled = ps->label && ps->label[0];
      char name[2 * MOE_TASK_NAME_MAX + 1];
      snprintf(name, sizeof name, "%.*s%s%s", MOE_TASK_NAME_MAX - 1, labelled ? ps->label : "",
               labelled ? "." : "", t->name);
      fprintf(f, "%s{\"name\": ", first ? "" : ",\n");
      first = 0;
      json_string(f, name);
      fprintf(f,
              ", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, "
              "\"dur\": %.3f, \"args\": {\"chunk\": %d, \"polls\": %u",
              stream_name(r->stream), ps->rank, (int)r->stream, ts, dur, t->chunk,
              (unsigned)r->polls);
      if (labelled) {
        char label[MOE_TASK_NAME_MAX];
        snprintf(label, sizeof label, "%s", ps->label);
        fputs(", \"pass\": ", f);
        json_string(f, label);
      }
      fputs("}}", f);
    }
  }
  fputs("\n]}\n", f);
  const int werr = ferror(f);
  const int cerr = fclose(f);
  f = NULL;
  if (werr || cerr != 0 || rename(tmp, path) != 0) {
    remove(tmp);
    MOE_FAIL(ctx, MOE_STATUS_IO, "trace: cannot write '%s'", path);
  }
done:
  if (f) {
    fclose(f);
    remove(tmp);
  }
  return st;
}
