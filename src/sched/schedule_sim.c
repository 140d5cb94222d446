// Schedule simulation: the makespan a schedule would have if every task took a
// given time, with the executor's rules (a stream starts the task that is next
// in its order once the stream is free and the task's dependencies have
// ended). With the durations of ScheMoE's task model this is the simulator of
// ALGORITHMS.md 1.1 [R] (eq. 12-14 place communication tasks FIFO as soon as
// they are ready, which is what this does with optsche's orders).
//
// Not here: where durations come from (profiles, performance models).
#include <string.h>

#include "moe/sched.h"

// The checks and buffers both simulations share: arguments, slowdowns (1 for
// the plain one), the schedule against the graph, every duration; then the
// per-task end times and done flags (moe_free'd by the caller).
static moe_status sim_begin(moe_ctx *ctx, const moe_task_graph *graph, const moe_schedule *sched,
                            const double *durations, const double *makespan, double slow_compute,
                            double slow_comm, double **end, unsigned char **done) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !graph || !sched || !durations || !makespan, MOE_STATUS_INVALID_ARG,
              "graph, schedule, durations and makespan must not be NULL");
  MOE_FAIL_IF(
      ctx, !(slow_compute >= 1.0) || !(slow_comm >= 1.0) || slow_compute > 1e6 || slow_comm > 1e6,
      MOE_STATUS_INVALID_ARG, "slowdowns (%g, %g) must be in [1, 1e6]", slow_compute, slow_comm);
  MOE_TRY(moe_schedule_validate(ctx, graph, sched));  // also rules out deadlocks
  const int n = graph->n_tasks;
  for (int i = 0; i < n; i++) {
    MOE_FAIL_IF(ctx, !(durations[i] >= 0.0) || durations[i] > 1e300, MOE_STATUS_INVALID_ARG,
                "duration of task '%s' (#%d) is %g; it must be finite and >= 0",
                graph->tasks[i].name, i, durations[i]);
  }
  *end = moe_calloc((size_t)(n ? n : 1), sizeof **end);
  *done = moe_calloc((size_t)(n ? n : 1), 1);
  MOE_FAIL_IF(ctx, !*end || !*done, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate %d tasks", n);
done:
  return st;
}

// The makespan (latest end) and, when asked, every task's end time.
static void sim_finish(int n, const double *end, double *end_times, double *makespan) {
  double m = 0.0;
  for (int i = 0; i < n; i++) m = end[i] > m ? end[i] : m;
  *makespan = m;
  if (end_times) memcpy(end_times, end, (size_t)n * sizeof *end);
}

moe_status moe_schedule_simulate(moe_ctx *ctx, const moe_task_graph *graph,
                                 const moe_schedule *sched, const double *durations,
                                 double *end_times, double *makespan) {
  moe_status st = MOE_STATUS_OK;
  double *end = NULL;
  unsigned char *done = NULL;
  MOE_TRY(sim_begin(ctx, graph, sched, durations, makespan, 1.0, 1.0, &end, &done));
  const int n = graph->n_tasks;
  int pos[MOE_STREAM_COUNT_] = {0};
  double free_at[MOE_STREAM_COUNT_] = {0};
  int placed = 0;
  while (placed < n) {
    int progress = 0;
    for (int s = 0; s < MOE_STREAM_COUNT_; s++) {
      while (pos[s] < sched->len[s]) {
        const int t = sched->order[s][pos[s]];
        const int *deps = NULL;
        int nd = 0;
        moe_task_graph_deps(graph, t, &deps, &nd);
        double ready = free_at[s];
        int ok = 1;
        for (int d = 0; d < nd && ok; d++) {
          ok = done[deps[d]];
          if (ok && end[deps[d]] > ready) ready = end[deps[d]];
        }
        if (!ok) break;
        end[t] = ready + durations[t];
        done[t] = 1;
        free_at[s] = end[t];
        pos[s]++;
        placed++;
        progress = 1;
      }
    }
    MOE_FAIL_IF(ctx, !progress, MOE_STATUS_INTERNAL, "schedule simulation made no progress");
  }
  sim_finish(n, end, end_times, makespan);
done:
  moe_free(end);
  moe_free(done);
  return st;
}

moe_status moe_schedule_simulate_shared(moe_ctx *ctx, const moe_task_graph *graph,
                                        const moe_schedule *sched, const double *durations,
                                        double slow_compute, double slow_comm, double *end_times,
                                        double *makespan) {
  moe_status st = MOE_STATUS_OK;
  double *end = NULL;
  unsigned char *done = NULL;
  MOE_TRY(sim_begin(ctx, graph, sched, durations, makespan, slow_compute, slow_comm, &end, &done));
  const int n = graph->n_tasks;
  // Event simulation: each stream runs at most one task, with `left` seconds
  // of solo work remaining; while both run, each progresses at 1/slow.
  int pos[MOE_STREAM_COUNT_] = {0}, cur[MOE_STREAM_COUNT_] = {-1, -1};
  double left[MOE_STREAM_COUNT_] = {0, 0};
  const double slow[MOE_STREAM_COUNT_] = {slow_compute, slow_comm};
  double now = 0.0;
  int finished = 0;
  while (finished < n) {
    // start what can start now (zero-length tasks finish at once)
    int started = 1;
    while (started) {
      started = 0;
      for (int s = 0; s < MOE_STREAM_COUNT_; s++) {
        if (cur[s] >= 0 || pos[s] >= sched->len[s]) continue;
        const int t = sched->order[s][pos[s]];
        const int *deps = NULL;
        int nd = 0, ok = 1;
        moe_task_graph_deps(graph, t, &deps, &nd);
        for (int d = 0; d < nd && ok; d++) ok = done[deps[d]];
        if (!ok) continue;
        pos[s]++;
        started = 1;
        if (durations[t] == 0.0) {
          end[t] = now;
          done[t] = 1;
          finished++;
        } else {
          cur[s] = t;
          left[s] = durations[t];
        }
      }
    }
    if (finished == n) break;
    const int both = cur[0] >= 0 && cur[1] >= 0;
    double dt = -1.0;
    for (int s = 0; s < MOE_STREAM_COUNT_; s++) {
      if (cur[s] < 0) continue;
      const double t_s = left[s] * (both ? slow[s] : 1.0);
      if (dt < 0 || t_s < dt) dt = t_s;
    }
    MOE_FAIL_IF(ctx, dt < 0, MOE_STATUS_INTERNAL, "schedule simulation made no progress");
    now += dt;
    for (int s = 0; s < MOE_STREAM_COUNT_; s++) {
      if (cur[s] < 0) continue;
      left[s] -= dt / (both ? slow[s] : 1.0);
      if (left[s] <= 1e-15 * (1.0 + durations[cur[s]])) {
        end[cur[s]] = now;
        done[cur[s]] = 1;
        finished++;
        cur[s] = -1;
      }
    }
  }
  sim_finish(n, end, end_times, makespan);
done:
  moe_free(end);
  moe_free(done);
  return st;
}
