// The Chrome trace writer: a real executor pass (two compute and two comm
// tasks with dependencies) written for two ranks, read back with cJSON: valid
// JSON, one process per rank, one named thread per stream, one complete event
// per task with the right name, stream, chunk and dependency order; an
// unwritable path fails with IO and leaves no file behind.
#define _POSIX_C_SOURCE 200809L
#include <cJSON.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moe/moe.h"
#include "testutil.h"

static moe_status sleep_task(void *arg, moe_ctx *ctx) {
  (void)ctx;
  const struct timespec ts = {0, (long)(size_t)arg * 1000000L};
  nanosleep(&ts, NULL);
  return MOE_STATUS_OK;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  static char buf[1 << 16];
  const size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  return buf;
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_task_graph g;
  moe_schedule s;
  moe_executor *ex = NULL;
  TU_CHECK(moe_task_graph_init(ctx, &g, 8, 8) == MOE_STATUS_OK, "graph");
  TU_CHECK(moe_schedule_init(ctx, &s, 8) == MOE_STATUS_OK, "schedule");
  // C1 (compute) -> A1 (comm) -> E (compute) -> A2 (comm)
  const char *names[4] = {"C1^0", "A1^0", "E^0", "A2^0"};
  const moe_stream streams[4] = {MOE_STREAM_COMPUTE, MOE_STREAM_COMM, MOE_STREAM_COMPUTE,
                                 MOE_STREAM_COMM};
  for (int i = 0; i < 4; i++) {
    const int dep = i - 1;
    const moe_task_desc d = {streams[i],        names[i],        0,        sleep_task, NULL, NULL,
                             (void *)(size_t)2, i ? &dep : NULL, i ? 1 : 0};
    TU_CHECK(moe_task_graph_add(ctx, &g, &d, NULL) == MOE_STATUS_OK, "add %s: %s", names[i],
             moe_ctx_error(ctx));
  }
  TU_CHECK(moe_schedule_in_index_order(ctx, &s, &g) == MOE_STATUS_OK, "order");
  TU_CHECK(moe_executor_create(ctx, NULL, 8, &ex) == MOE_STATUS_OK, "executor");
  TU_CHECK(moe_executor_run(ex, &g, &s, ctx) == MOE_STATUS_OK, "run: %s", moe_ctx_error(ctx));
  int n = 0;
  const moe_task_record *rec = moe_executor_records(ex, &n);
  TU_CHECK(n == 4, "4 records, got %d", n);

  char path[256];
  snprintf(path, sizeof path, "/tmp/moe_trace_test_%d.json", (int)getpid());
  const moe_trace_pass passes[2] = {{0, &g, rec, 0, NULL}, {1, &g, rec, 1000, NULL}};
  TU_CHECK(moe_trace_write(ctx, path, passes, 2) == MOE_STATUS_OK, "write: %s", moe_ctx_error(ctx));
  cJSON *root = cJSON_Parse(slurp(path) ? slurp(path) : "");
  TU_CHECK(root != NULL, "the trace is valid JSON");
  const cJSON *events = root ? cJSON_GetObjectItemCaseSensitive(root, "traceEvents") : NULL;
  TU_CHECK(cJSON_IsArray(events), "traceEvents is an array");
  int procs = 0, threads[2][2] = {{0}}, x_events = 0, on_stream[2][2] = {{0}};
  double end_of[2][4] = {{0}}, start_of[2][4] = {{0}};
  const cJSON *ev = NULL;
  cJSON_ArrayForEach(ev, events) {
    const char *ph = cJSON_GetObjectItemCaseSensitive(ev, "ph")->valuestring;
    const int pid = cJSON_GetObjectItemCaseSensitive(ev, "pid")->valueint;
    const int tid = cJSON_GetObjectItemCaseSensitive(ev, "tid")->valueint;
    const char *name = cJSON_GetObjectItemCaseSensitive(ev, "name")->valuestring;
    TU_CHECK(pid == 0 || pid == 1, "pid %d", pid);
    if (pid < 0 || pid > 1 || tid < 0 || tid > 1) continue;
    if (strcmp(ph, "M") == 0 && strcmp(name, "process_name") == 0) procs++;
    if (strcmp(ph, "M") == 0 && strcmp(name, "thread_name") == 0) threads[pid][tid]++;
    if (strcmp(ph, "X") == 0) {
      x_events++;
      on_stream[pid][tid]++;
      int idx = -1;
      for (int i = 0; i < 4; i++) idx = strcmp(name, names[i]) == 0 ? i : idx;
      TU_CHECK(idx >= 0 && (int)streams[idx] == tid, "event '%s' on thread %d", name, tid);
      if (idx >= 0) {
        const double ts = cJSON_GetObjectItemCaseSensitive(ev, "ts")->valuedouble;
        const double dur = cJSON_GetObjectItemCaseSensitive(ev, "dur")->valuedouble;
        start_of[pid][idx] = ts;
        end_of[pid][idx] = ts + dur;
        TU_CHECK(dur >= 1000.0, "'%s' lasted %g us (slept 2 ms)", name, dur);
      }
    }
  }
  TU_CHECK(procs == 2, "one process per rank (%d)", procs);
  TU_CHECK(threads[0][0] == 1 && threads[0][1] == 1 && threads[1][0] == 1 && threads[1][1] == 1,
           "one named thread per stream and rank");
  TU_CHECK(x_events == 8, "8 task events, got %d", x_events);
  for (int r = 0; r < 2; r++) {
    TU_CHECK(on_stream[r][0] == 2 && on_stream[r][1] == 2, "rank %d: 2 events per stream", r);
    for (int i = 1; i < 4; i++) {
      TU_CHECK(start_of[r][i] >= end_of[r][i - 1] - 1e-3, "rank %d: %s starts after %s ends", r,
               names[i], names[i - 1]);
    }
  }
  TU_CHECK(start_of[1][0] >= start_of[0][0] + 0.999, "rank 1's offset applied");
  cJSON_Delete(root);
  remove(path);
  // an unwritable path: IO, and nothing left behind
  TU_CHECK(moe_trace_write(ctx, "/nonexistent-dir/t.json", passes, 2) == MOE_STATUS_IO &&
               strstr(moe_ctx_error(ctx), "/nonexistent-dir/t.json"),
           "unwritable path: %s", moe_ctx_error(ctx));
  TU_CHECK(access("/nonexistent-dir/t.json.tmp", F_OK) != 0, "no temporary left");
  TU_CHECK(moe_trace_write(ctx, path, NULL, 1) == MOE_STATUS_INVALID_ARG, "NULL passes");
  moe_executor_destroy(ex);
  moe_schedule_free(&s);
  moe_task_graph_free(&g);
  moe_ctx_destroy(ctx);
  return tu_finish("test_trace");
}
