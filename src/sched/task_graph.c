// Task graphs and schedules: building them with clear errors, and validating a
// schedule against its graph (each task once, on its own stream, and no
// deadlock) before the executor runs it.
//
// Deadlock check: both streams run their orders; a stream may start its next
// task only when that task's dependencies are done. Progress is monotone and
// does not depend on timing, so running the two orders greedily with
// instantaneous tasks reaches every state any real execution can reach: if the
// simulation gets stuck, so would the executor. Cost O(rounds * (n + deps)).
//
// Not here: building graphs for a MoE layer, or choosing an order (schedules).
#include <stdio.h>
#include <string.h>

#include "moe/sched.h"
#include "sched/sched_internal.h"

// ---- task graph ----------------------------------------------------------------

const char *moe_stream_name(moe_stream stream) {
  switch (stream) {
    case MOE_STREAM_COMPUTE:
      return "compute";
    case MOE_STREAM_COMM:
      return "comm";
    case MOE_STREAM_COUNT_:
      break;
  }
  return "unknown";
}

moe_status moe_task_graph_init(moe_ctx *ctx, moe_task_graph *graph, int max_tasks, int max_deps) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !graph, MOE_STATUS_INVALID_ARG, "task graph is NULL");
  memset(graph, 0, sizeof(*graph));
  MOE_FAIL_IF(ctx, max_tasks < 1, MOE_STATUS_INVALID_ARG,
              "task graph capacity (%d tasks) must be at least 1", max_tasks);
  MOE_FAIL_IF(ctx, max_deps < 0, MOE_STATUS_INVALID_ARG,
              "task graph dependency capacity (%d) must not be negative", max_deps);
  graph->tasks = moe_calloc((size_t)max_tasks, sizeof(moe_task));
  MOE_FAIL_IF(ctx, !graph->tasks, MOE_STATUS_OUT_OF_MEMORY, "task graph: cannot allocate %d tasks",
              max_tasks);
  if (max_deps > 0) {
    graph->deps = moe_calloc((size_t)max_deps, sizeof(int));
    MOE_FAIL_IF(ctx, !graph->deps, MOE_STATUS_OUT_OF_MEMORY,
                "task graph: cannot allocate %d dependencies", max_deps);
  }
  graph->max_tasks = max_tasks;
  graph->max_deps = max_deps;
done:
  if (st != MOE_STATUS_OK && graph) moe_task_graph_free(graph);
  return st;
}

void moe_task_graph_free(moe_task_graph *graph) {
  if (!graph) return;
  moe_free(graph->tasks);
  moe_free(graph->deps);
  memset(graph, 0, sizeof(*graph));
}

void moe_task_graph_clear(moe_task_graph *graph) {
  if (!graph) return;
  graph->n_tasks = 0;
  graph->n_deps = 0;
}

moe_status moe_task_graph_add(moe_ctx *ctx, moe_task_graph *graph, const moe_task_desc *desc,
                              int *out_index) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !graph || !desc, MOE_STATUS_INVALID_ARG, "task graph or task is NULL");
  const int index = graph->n_tasks;
  const char *name = desc->name && desc->name[0] ? desc->name : NULL;
  const char *shown = name ? name : "(unnamed)";
  MOE_FAIL_IF(ctx, index >= graph->max_tasks, MOE_STATUS_INVALID_ARG,
              "task '%s': too many tasks (capacity %d)", shown, graph->max_tasks);
  MOE_FAIL_IF(ctx, name && strlen(name) >= MOE_TASK_NAME_MAX, MOE_STATUS_INVALID_ARG,
              "task name '%s' is longer than %d bytes", name, MOE_TASK_NAME_MAX - 1);
  MOE_FAIL_IF(ctx, desc->stream != MOE_STREAM_COMPUTE && desc->stream != MOE_STREAM_COMM,
              MOE_STATUS_INVALID_ARG, "task '%s': stream (%d) must be compute (0) or comm (1)",
              shown, (int)desc->stream);
  MOE_FAIL_IF(ctx, !desc->run, MOE_STATUS_INVALID_ARG, "task '%s': run function is NULL", shown);
  MOE_FAIL_IF(ctx, desc->n_deps < 0 || (desc->n_deps > 0 && !desc->deps), MOE_STATUS_INVALID_ARG,
              "task '%s': %d dependencies with a %s list", shown, desc->n_deps,
              desc->deps ? "non-NULL" : "NULL");
  MOE_FAIL_IF(ctx, desc->n_deps > graph->max_deps - graph->n_deps, MOE_STATUS_INVALID_ARG,
              "task '%s': %d dependencies do not fit (%d of %d used)", shown, desc->n_deps,
              graph->n_deps, graph->max_deps);
  for (int d = 0; d < desc->n_deps; d++) {
    const int dep = desc->deps[d];
    MOE_FAIL_IF(ctx, dep < 0 || dep >= index, MOE_STATUS_INVALID_ARG,
                "task '%s' (#%d): dependency %d is %d, which is not an earlier task (0..%d)", shown,
                index, d, dep, index - 1);
  }

  moe_task *t = &graph->tasks[index];
  memset(t, 0, sizeof(*t));
  if (name) {
    memcpy(t->name, name, strlen(name) + 1);
  } else {
    snprintf(t->name, sizeof(t->name), "#%d", index);
  }
  t->stream = desc->stream;
  t->chunk = desc->chunk;
  t->kind = -1;  // moe_chunk_pass_build sets the kinds of its tasks
  t->run = desc->run;
  t->test = desc->test;
  t->wait = desc->wait;
  t->arg = desc->arg;
  t->dep_offset = graph->n_deps;
  t->n_deps = desc->n_deps;
  if (desc->n_deps > 0) {
    memcpy(graph->deps + graph->n_deps, desc->deps, (size_t)desc->n_deps * sizeof(int));
  }
  graph->n_deps += desc->n_deps;
  graph->n_tasks++;
  if (out_index) *out_index = index;
done:
  return st;
}

void moe_task_graph_deps(const moe_task_graph *graph, int i, const int **out, int *n) {
  *out = graph->deps ? graph->deps + graph->tasks[i].dep_offset : NULL;
  *n = graph->tasks[i].n_deps;
}

// ---- schedules -------------------------------------------------------------------

moe_status moe_schedule_init(moe_ctx *ctx, moe_schedule *sched, int max_per_stream) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !sched, MOE_STATUS_INVALID_ARG, "schedule is NULL");
  memset(sched, 0, sizeof(*sched));
  MOE_FAIL_IF(ctx, max_per_stream < 1, MOE_STATUS_INVALID_ARG,
              "schedule capacity (%d tasks per stream) must be at least 1", max_per_stream);
  for (int s = 0; s < MOE_STREAM_COUNT_; s++) {
    sched->order[s] = moe_calloc((size_t)max_per_stream, sizeof(int));
    MOE_FAIL_IF(ctx, !sched->order[s], MOE_STATUS_OUT_OF_MEMORY,
                "schedule: cannot allocate %d entries", max_per_stream);
  }
  sched->max_per_stream = max_per_stream;
done:
  if (st != MOE_STATUS_OK && sched) moe_schedule_free(sched);
  return st;
}

void moe_schedule_free(moe_schedule *sched) {
  if (!sched) return;
  for (int s = 0; s < MOE_STREAM_COUNT_; s++) moe_free(sched->order[s]);
  memset(sched, 0, sizeof(*sched));
}

void moe_schedule_clear(moe_schedule *sched) {
  if (!sched) return;
  for (int s = 0; s < MOE_STREAM_COUNT_; s++) sched->len[s] = 0;
}

moe_status moe_schedule_push(moe_ctx *ctx, moe_schedule *sched, moe_stream stream, int task) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !sched, MOE_STATUS_INVALID_ARG, "schedule is NULL");
  MOE_FAIL_IF(ctx, stream != MOE_STREAM_COMPUTE && stream != MOE_STREAM_COMM,
              MOE_STATUS_INVALID_ARG, "schedule: stream (%d) must be compute (0) or comm (1)",
              (int)stream);
  MOE_FAIL_IF(ctx, sched->len[stream] >= sched->max_per_stream, MOE_STATUS_INVALID_ARG,
              "schedule: the %s order is full (%d tasks)", moe_stream_name(stream),
              sched->max_per_stream);
  sched->order[stream][sched->len[stream]++] = task;
done:
  return st;
}

moe_status moe_schedule_in_index_order(moe_ctx *ctx, moe_schedule *sched,
                                       const moe_task_graph *graph) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !sched || !graph, MOE_STATUS_INVALID_ARG, "schedule or graph is NULL");
  moe_schedule_clear(sched);
  for (int i = 0; i < graph->n_tasks; i++) {
    MOE_TRY(moe_schedule_push(ctx, sched, graph->tasks[i].stream, i));
  }
done:
  return st;
}

moe_status moe_sched_validate_scratch_(moe_ctx *ctx, const moe_task_graph *graph,
                                       const moe_schedule *sched, int *scratch) {
  moe_status st = MOE_STATUS_OK;
  const int n = graph->n_tasks;
  int *pos_of = scratch;       // (n) position of each task in its stream's order, -1 if absent
  int *done_of = scratch + n;  // (n) 1 once the simulation has run the task
  for (int i = 0; i < n; i++) {
    pos_of[i] = -1;
    done_of[i] = 0;
  }

  // 1. every entry is a task of the right stream, at most once
  for (int s = 0; s < MOE_STREAM_COUNT_; s++) {
    MOE_FAIL_IF(ctx, sched->len[s] < 0 || sched->len[s] > sched->max_per_stream,
                MOE_STATUS_INVALID_ARG, "schedule: %s order length %d is out of range",
                moe_stream_name((moe_stream)s), sched->len[s]);
    for (int p = 0; p < sched->len[s]; p++) {
      const int t = sched->order[s][p];
      MOE_FAIL_IF(ctx, t < 0 || t >= n, MOE_STATUS_INVALID_ARG,
                  "schedule: %s order position %d holds %d, which is not a task (0..%d)",
                  moe_stream_name((moe_stream)s), p, t, n - 1);
      MOE_FAIL_IF(ctx, (int)graph->tasks[t].stream != s, MOE_STATUS_INVALID_ARG,
                  "schedule: task '%s' (#%d) is a %s task but is on the %s order",
                  graph->tasks[t].name, t, moe_stream_name(graph->tasks[t].stream),
                  moe_stream_name((moe_stream)s));
      MOE_FAIL_IF(ctx, pos_of[t] >= 0, MOE_STATUS_INVALID_ARG,
                  "schedule: task '%s' (#%d) appears twice on the %s order (positions %d and %d)",
                  graph->tasks[t].name, t, moe_stream_name((moe_stream)s), pos_of[t], p);
      pos_of[t] = p;
    }
  }
  // 2. every task appears
  for (int i = 0; i < n; i++) {
    MOE_FAIL_IF(ctx, pos_of[i] < 0, MOE_STATUS_INVALID_ARG,
                "schedule: task '%s' (#%d) is missing from the %s order", graph->tasks[i].name, i,
                moe_stream_name(graph->tasks[i].stream));
  }

  // 3. simulate both streams with instantaneous tasks
  int head[MOE_STREAM_COUNT_] = {0};
  int blocker[MOE_STREAM_COUNT_] = {-1, -1};  // first unfinished dependency of each head
  for (int progress = 1; progress;) {
    progress = 0;
    for (int s = 0; s < MOE_STREAM_COUNT_; s++) {
      blocker[s] = -1;
      while (head[s] < sched->len[s]) {
        const int t = sched->order[s][head[s]];
        const int *deps = graph->deps + graph->tasks[t].dep_offset;
        for (int d = 0; d < graph->tasks[t].n_deps && blocker[s] < 0; d++) {
          if (!done_of[deps[d]]) blocker[s] = deps[d];
        }
        if (blocker[s] >= 0) break;
        done_of[t] = 1;
        head[s]++;
        progress = 1;
      }
    }
  }
  int stuck = 0;
  for (int s = 0; s < MOE_STREAM_COUNT_; s++) stuck |= head[s] < sched->len[s];
  if (stuck) {
    char text[2][192];
    for (int s = 0; s < MOE_STREAM_COUNT_; s++) {
      if (head[s] >= sched->len[s]) {
        snprintf(text[s], sizeof(text[s]), "%s stream finished", moe_stream_name((moe_stream)s));
        continue;
      }
      const int t = sched->order[s][head[s]];
      const int b = blocker[s];
      snprintf(text[s], sizeof(text[s]),
               "%s stream waits at '%s' (#%d, position %d) for '%s' (#%d, %s position %d)",
               moe_stream_name((moe_stream)s), graph->tasks[t].name, t, head[s],
               graph->tasks[b].name, b, moe_stream_name(graph->tasks[b].stream), pos_of[b]);
    }
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
             "schedule deadlocks (stream order contradicts dependencies): %s; %s", text[0],
             text[1]);
  }
done:
  return st;
}

moe_status moe_schedule_validate(moe_ctx *ctx, const moe_task_graph *graph,
                                 const moe_schedule *sched) {
  moe_status st = MOE_STATUS_OK;
  int *scratch = NULL;
  MOE_FAIL_IF(ctx, !graph || !sched, MOE_STATUS_INVALID_ARG, "graph or schedule is NULL");
  if (graph->n_tasks > 0) {
    scratch = moe_malloc(2 * (size_t)graph->n_tasks * sizeof(int));
    MOE_FAIL_IF(ctx, !scratch, MOE_STATUS_OUT_OF_MEMORY,
                "schedule validation: cannot allocate scratch for %d tasks", graph->n_tasks);
  }
  MOE_TRY(moe_sched_validate_scratch_(ctx, graph, sched, scratch));
done:
  moe_free(scratch);
  return st;
}
