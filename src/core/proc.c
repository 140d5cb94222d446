// Stopping a launched process tree (moe_proc_tree_stop): a launcher (sh,
// mpirun, hydra) exits before the ranks it started, and hydra may start them
// outside its process group, so the tree is read from /proc before any
// signal and each process is named by its PID and start time (a PID taken by
// another process after the exit is never signalled).
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#include "moe/core.h"

typedef struct {
  pid_t pid;
  unsigned long long start;  // clock ticks since boot (/proc/PID/stat field 22)
} proc_id;

// /proc/p/stat's state, parent and start time; 0 when p does not exist.
static int proc_stat(pid_t p, char *state, long *ppid, unsigned long long *start) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)p);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  const size_t got = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[got] = '\0';
  const char *rp = strrchr(buf, ')');  // after the command name: " S ppid ... (22) starttime"
  // fields 3 (state), 4 (ppid), then 5-21 skipped, 22 (starttime)
  return rp && sscanf(rp + 1,
                      " %c %ld %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
                      "%*d %llu",
                      state, ppid, start) == 3;
}

// Whether the process id names still runs (not a zombie, not another process
// that took its PID).
static int alive(proc_id id) {
  char state = 0;
  long ppid = 0;
  unsigned long long start = 0;
  return proc_stat(id.pid, &state, &ppid, &start) && start == id.start && state != 'Z' &&
         state != 'X';
}

static void signal_proc(proc_id id, int sig) {
  if (alive(id)) kill(id.pid, sig);
}

// pid's descendants, depth-first, into tree (at most max).
static void collect_tree(pid_t pid, proc_id *tree, int *n_out, int max, int depth) {
  if (depth > 8) return;
  DIR *d = opendir("/proc");
  if (!d) return;
  struct dirent *de;
  proc_id kids[256];
  int n = 0;
  while ((de = readdir(d)) != NULL && n < 256) {
    const long p = strtol(de->d_name, NULL, 10);
    char state = 0;
    long ppid = -1;
    unsigned long long start = 0;
    if (p > 0 && proc_stat((pid_t)p, &state, &ppid, &start) && ppid == (long)pid)
      kids[n++] = (proc_id){(pid_t)p, start};
  }
  closedir(d);
  for (int i = 0; i < n && *n_out < max; i++) {
    tree[(*n_out)++] = kids[i];
    collect_tree(kids[i].pid, tree, n_out, max, depth + 1);
  }
}

int moe_proc_tree_stop(int pid, double term_s, double kill_s) {
  if (pid <= 0) return 0;
  enum { TREE_MAX = 1024 };
  proc_id tree[TREE_MAX];
  int n = 0;
  collect_tree((pid_t)pid, tree, &n, TREE_MAX, 0);  // before the signal: orphans lose their parent
  for (int i = 0; i < n; i++) signal_proc(tree[i], SIGTERM);
  kill(-(pid_t)pid, SIGTERM);
  int status = 0, reaped = 0, killed = 0;
  const uint64_t t0 = moe_time_ns();
  for (;;) {
    if (!reaped) {
      const pid_t w = waitpid((pid_t)pid, &status, WNOHANG);
      reaped = w == (pid_t)pid || (w < 0 && errno == ECHILD);
    }
    int left = !reaped;  // (zombies are gone: the group may hold ones nobody reaps)
    for (int i = 0; i < n && !left; i++) left = alive(tree[i]);
    if (!left) return killed;
    const double s = moe_time_ms_since(t0) / 1e3;
    if (!killed && s > term_s) {
      for (int i = 0; i < n; i++) signal_proc(tree[i], SIGKILL);
      if (!reaped) kill(-(pid_t)pid, SIGKILL);
      killed = 1;
    }
    if (s > term_s + kill_s) return 2;
    const struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
  }
}
