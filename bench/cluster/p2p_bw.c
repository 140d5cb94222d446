// moe_p2p_bw: point-to-point bandwidth and latency between MPI ranks, intra- vs
// inter-node, plus one MPI_Alltoall against its link bound. Meant for the
// emulated cluster (bench/cluster/cluster.sh run -- moe_p2p_bw), works on any MPI.
//
// Ping-pong between the two ranks of a pair: every round trip is timed on the
// lower rank; the table shows the median half round trip and the bandwidth it
// implies (bytes * 8 / half round trip). Ranks outside the pair wait in a
// sleeping barrier so they do not steal the CPU of the pair being measured.
//
// Nodes: rank r is on node r / G where G comes from MOE_RANKS_PER_NODE (what the
// cluster launcher exports); without it, ranks with equal MPI processor names
// share a node. The configured rates come from MOECL_INTER_GBIT /
// MOECL_INTRA_GBIT / MOECL_INTRA_MODE (exported by the launcher) or the flags.
#define _POSIX_C_SOURCE 200809L

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_SIZES = 16, TAG_ITERS = 11, TAG_PING = 12, TAG_PONG = 13 };

typedef struct {
  size_t sizes[MAX_SIZES];
  int nsizes;
  int all_pairs;      // every pair instead of rank 0 with each other rank
  double budget_s;    // time target per (pair, size)
  int min_iters;      // timed round trips at least ...
  int max_iters;      // ... and at most
  size_t a2a_bytes;   // MPI_Alltoall bytes per pair (0: skip)
  int a2a_iters;      // timed alltoall iterations
  double inter_gbit;  // configured rates (0: unknown)
  double intra_gbit;
  char mode[16];  // "shm", "shaped" or "" (unknown)
} options;

static void usage(FILE *f) {
  fprintf(f,
          "usage: moe_p2p_bw [--sizes LIST] [--all-pairs] [--budget-ms MS] [--min-iters N]\n"
          "                  [--max-iters N] [--alltoall-bytes B] [--alltoall-iters N]\n"
          "                  [--inter-gbit R] [--intra-gbit R2] [--intra-mode shm|shaped]\n"
          "  --sizes LIST        message sizes, e.g. 8,64k,4m,16m (the default; k/m = KiB/MiB)\n"
          "  --all-pairs         every pair of ranks (default: rank 0 with every other rank)\n"
          "  --budget-ms MS      time target per pair and size (default 800)\n"
          "  --min-iters N       timed round trips at least (default 5)\n"
          "  --max-iters N       ... and at most (default 1000)\n"
          "  --alltoall-bytes B  MPI_Alltoall bytes per pair (default 4m; 0 skips it)\n"
          "  --alltoall-iters N  timed alltoall iterations (default 5)\n"
          "  --inter-gbit R, --intra-gbit R2, --intra-mode M: configured links (default from\n"
          "                      MOECL_INTER_GBIT, MOECL_INTRA_GBIT, MOECL_INTRA_MODE)\n");
}

static int parse_size(const char *s, size_t *out) {
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) return 0;
  unsigned long long mul = 1;
  if (*end == 'k' || *end == 'K') {
    mul = 1024ull;
    end++;
  } else if (*end == 'm' || *end == 'M') {
    mul = 1024ull * 1024ull;
    end++;
  }
  if (*end != '\0') return 0;
  if (v > (1ull << 30) / mul) return 0;  // at most 1 GiB
  *out = (size_t)(v * mul);
  return 1;
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return 0;
  *out = (int)v;
  return 1;
}

static int parse_rate(const char *s, double *out) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || !(v > 0.0 && v <= 1000.0)) return 0;
  *out = v;
  return 1;
}

static int parse_sizes(const char *list, options *o) {
  char buf[256];
  if (strlen(list) >= sizeof buf) return 0;
  strcpy(buf, list);
  o->nsizes = 0;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (o->nsizes == MAX_SIZES || !parse_size(tok, &o->sizes[o->nsizes]) ||
        o->sizes[o->nsizes] == 0)
      return 0;
    o->nsizes++;
  }
  return o->nsizes > 0;
}

// Returns 0 on success, 1 on --help, -1 on a bad argument (message printed by rank 0).
static int parse_args(int argc, char **argv, options *o, int rank) {
  memset(o, 0, sizeof *o);
  parse_sizes("8,64k,4m,16m", o);
  o->budget_s = 0.8;
  o->min_iters = 5;
  o->max_iters = 1000;
  o->a2a_bytes = 4u << 20;
  o->a2a_iters = 5;
  const char *e = getenv("MOECL_INTER_GBIT");
  if (e && !parse_rate(e, &o->inter_gbit)) o->inter_gbit = 0;
  e = getenv("MOECL_INTRA_GBIT");
  if (e && !parse_rate(e, &o->intra_gbit)) o->intra_gbit = 0;
  e = getenv("MOECL_INTRA_MODE");
  if (e && (strcmp(e, "shm") == 0 || strcmp(e, "shaped") == 0))
    snprintf(o->mode, sizeof o->mode, "%s", e);

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    int ok = 1, takes = 1, ms = 0;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      if (rank == 0) usage(stdout);
      return 1;
    } else if (strcmp(a, "--all-pairs") == 0) {
      o->all_pairs = 1;
      takes = 0;
    } else if (!v) {
      ok = 0;
    } else if (strcmp(a, "--sizes") == 0) {
      ok = parse_sizes(v, o);
    } else if (strcmp(a, "--budget-ms") == 0) {
      ok = parse_int(v, 1, 600000, &ms);
      o->budget_s = ms / 1000.0;
    } else if (strcmp(a, "--min-iters") == 0) {
      ok = parse_int(v, 1, 100000, &o->min_iters);
    } else if (strcmp(a, "--max-iters") == 0) {
      ok = parse_int(v, 1, 100000, &o->max_iters);
    } else if (strcmp(a, "--alltoall-bytes") == 0) {
      ok = strcmp(v, "0") == 0 ? (o->a2a_bytes = 0, 1) : parse_size(v, &o->a2a_bytes);
    } else if (strcmp(a, "--alltoall-iters") == 0) {
      ok = parse_int(v, 1, 1000, &o->a2a_iters);
    } else if (strcmp(a, "--inter-gbit") == 0) {
      ok = parse_rate(v, &o->inter_gbit);
    } else if (strcmp(a, "--intra-gbit") == 0) {
      ok = parse_rate(v, &o->intra_gbit);
    } else if (strcmp(a, "--intra-mode") == 0) {
      ok = strcmp(v, "shm") == 0 || strcmp(v, "shaped") == 0;
      if (ok) snprintf(o->mode, sizeof o->mode, "%s", v);
    } else {
      ok = 0;
    }
    if (!ok) {
      if (rank == 0) {
        fprintf(stderr, "moe_p2p_bw: bad argument '%s'%s%s\n", a, v && takes ? " " : "",
                v && takes ? v : "");
        usage(stderr);
      }
      return -1;
    }
    i += takes;
  }
  if (o->min_iters > o->max_iters) o->max_iters = o->min_iters;
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A barrier that sleeps between polls: idle ranks must not busy-wait on the
// cores the measured pair needs.
static void idle_barrier(MPI_Comm comm) {
  MPI_Request rq;
  MPI_Ibarrier(comm, &rq);
  int done = 0;
  const struct timespec nap = {0, 200000};  // 200 us
  for (;;) {
    MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
    if (done) break;
    nanosleep(&nap, NULL);
  }
}

static void fmt_size(size_t b, char *out, size_t n) {
  if (b >= (1u << 20) && b % (1u << 20) == 0)
    snprintf(out, n, "%zuMiB", b >> 20);
  else if (b >= 1024 && b % 1024 == 0)
    snprintf(out, n, "%zuKiB", b >> 10);
  else
    snprintf(out, n, "%zuB", b);
}

// One pair, one size. Rank a drives: a warm-up round trip sets the iteration
// count (sent to b), then every round trip is timed. Returns on rank a the
// median and minimum half round trip in seconds.
static void ping_pong(int me, int a, int b, char *buf, size_t bytes, const options *o, double *med,
                      double *mn, int *iters) {
  MPI_Comm w = MPI_COMM_WORLD;
  int n = 0;
  if (me == a) {
    double t0 = MPI_Wtime();
    MPI_Send(buf, (int)bytes, MPI_BYTE, b, TAG_PING, w);
    MPI_Recv(buf, (int)bytes, MPI_BYTE, b, TAG_PONG, w, MPI_STATUS_IGNORE);
    double rt = MPI_Wtime() - t0;
    double want = rt > 0 ? o->budget_s / rt : o->max_iters;
    n = want < o->min_iters ? o->min_iters : want > o->max_iters ? o->max_iters : (int)want;
    MPI_Send(&n, 1, MPI_INT, b, TAG_ITERS, w);
    double *t = malloc((size_t)n * sizeof *t);
    if (!t) MPI_Abort(w, 2);
    for (int i = 0; i < n; i++) {
      t0 = MPI_Wtime();
      MPI_Send(buf, (int)bytes, MPI_BYTE, b, TAG_PING, w);
      MPI_Recv(buf, (int)bytes, MPI_BYTE, b, TAG_PONG, w, MPI_STATUS_IGNORE);
      t[i] = 0.5 * (MPI_Wtime() - t0);
    }
    *med = median(t, n);
    *mn = t[0];  // sorted by median()
    *iters = n;
    free(t);
  } else {
    MPI_Recv(buf, (int)bytes, MPI_BYTE, a, TAG_PING, w, MPI_STATUS_IGNORE);
    MPI_Send(buf, (int)bytes, MPI_BYTE, a, TAG_PONG, w);
    MPI_Recv(&n, 1, MPI_INT, a, TAG_ITERS, w, MPI_STATUS_IGNORE);
    for (int i = 0; i < n; i++) {
      MPI_Recv(buf, (int)bytes, MPI_BYTE, a, TAG_PING, w, MPI_STATUS_IGNORE);
      MPI_Send(buf, (int)bytes, MPI_BYTE, a, TAG_PONG, w);
    }
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm w = MPI_COMM_WORLD;
  int me = 0, np = 1;
  MPI_Comm_rank(w, &me);
  MPI_Comm_size(w, &np);

  options o;
  int pr = parse_args(argc, argv, &o, me);
  if (pr != 0) {
    MPI_Finalize();
    return pr > 0 ? 0 : 2;
  }

  // ---- where every rank is ----------------------------------------------------------------
  char name[MPI_MAX_PROCESSOR_NAME + 1];
  memset(name, 0, sizeof name);
  int len = 0;
  MPI_Get_processor_name(name, &len);
  char *names = malloc((size_t)np * sizeof name);
  int *node = malloc((size_t)np * sizeof *node);
  if (!names || !node) MPI_Abort(w, 2);
  MPI_Allgather(name, (int)sizeof name, MPI_CHAR, names, (int)sizeof name, MPI_CHAR, w);

  int g = 0;
  const char *rpn = getenv("MOE_RANKS_PER_NODE");
  if (rpn && parse_int(rpn, 1, 1 << 20, &g) && np % g == 0) {
    for (int r = 0; r < np; r++) node[r] = r / g;
  } else {
    g = 0;
    int nnodes = 0;
    for (int r = 0; r < np; r++) {
      node[r] = -1;
      for (int q = 0; q < r; q++)
        if (strcmp(names + (size_t)q * sizeof name, names + (size_t)r * sizeof name) == 0) {
          node[r] = node[q];
          break;
        }
      if (node[r] < 0) node[r] = nnodes++;
    }
  }
  int nnodes = 0;
  for (int r = 0; r < np; r++)
    if (node[r] + 1 > nnodes) nnodes = node[r] + 1;

  if (me == 0) {
    printf("# moe_p2p_bw: %d ranks on %d nodes (nodes from %s), intra mode %s\n", np, nnodes,
           g ? "MOE_RANKS_PER_NODE" : "processor names", o.mode[0] ? o.mode : "unknown");
    printf("# configured Gbit/s: inter %g, intra %g (0: unknown or shared memory)\n", o.inter_gbit,
           strcmp(o.mode, "shm") == 0 ? 0.0 : o.intra_gbit);
    for (int r = 0; r < np; r++)
      printf("# rank %2d node %d host %s\n", r, node[r], names + (size_t)r * sizeof name);
    fflush(stdout);
  }

  // ---- point to point ---------------------------------------------------------------------
  size_t maxb = 8;
  for (int i = 0; i < o.nsizes; i++)
    if (o.sizes[i] > maxb) maxb = o.sizes[i];
  char *buf = malloc(maxb);
  if (!buf) MPI_Abort(w, 2);
  memset(buf, me & 0xff, maxb);

  if (me == 0) {
    printf("\n%-7s %-5s %10s %-8s %6s %12s %12s %9s %7s %7s\n", "pair", "same", "bytes", "size",
           "iters", "median_us", "min_us", "Gbit/s", "cfg", "%cfg");
    fflush(stdout);
  }
  for (int a = 0; a < np; a++) {
    for (int b = a + 1; b < np; b++) {
      if (!o.all_pairs && a != 0) continue;
      int in_pair = me == a || me == b;
      int same = node[a] == node[b];
      double cfg = same ? (strcmp(o.mode, "shaped") == 0 ? o.intra_gbit : 0.0) : o.inter_gbit;
      if (in_pair) {  // open the connection outside the timings
        char c = 0;
        if (me == a) {
          MPI_Send(&c, 1, MPI_CHAR, b, TAG_PING, w);
          MPI_Recv(&c, 1, MPI_CHAR, b, TAG_PONG, w, MPI_STATUS_IGNORE);
        } else {
          MPI_Recv(&c, 1, MPI_CHAR, a, TAG_PING, w, MPI_STATUS_IGNORE);
          MPI_Send(&c, 1, MPI_CHAR, a, TAG_PONG, w);
        }
      }
      for (int s = 0; s < o.nsizes; s++) {
        double med = 0, mn = 0;
        int iters = 0;
        if (in_pair) ping_pong(me, a, b, buf, o.sizes[s], &o, &med, &mn, &iters);
        // rank a reports to rank 0
        double res[3] = {med, mn, (double)iters};
        if (a != 0) {
          if (me == a) MPI_Send(res, 3, MPI_DOUBLE, 0, TAG_ITERS, w);
          if (me == 0) MPI_Recv(res, 3, MPI_DOUBLE, a, TAG_ITERS, w, MPI_STATUS_IGNORE);
        }
        if (me == 0) {
          char pair[32], sz[32], cfgs[32], pct[32];
          snprintf(pair, sizeof pair, "%d-%d", a, b);
          fmt_size(o.sizes[s], sz, sizeof sz);
          double gbit = res[0] > 0 ? (double)o.sizes[s] * 8.0 / res[0] / 1e9 : 0.0;
          if (cfg > 0) {
            snprintf(cfgs, sizeof cfgs, "%g", cfg);
            snprintf(pct, sizeof pct, "%.1f", 100.0 * gbit / cfg);
          } else {
            snprintf(cfgs, sizeof cfgs, "%s", same && strcmp(o.mode, "shaped") != 0 ? "shm" : "-");
            snprintf(pct, sizeof pct, "-");
          }
          printf("%-7s %-5s %10zu %-8s %6d %12.2f %12.2f %9.3f %7s %7s\n", pair,
                 same ? "yes" : "no", o.sizes[s], sz, (int)res[2], res[0] * 1e6, res[1] * 1e6, gbit,
                 cfgs, pct);
          fflush(stdout);
        }
        idle_barrier(w);
      }
    }
  }
  free(buf);

  // ---- alltoall ----------------------------------------------------------------------------
  int rc = 0;
  if (o.a2a_bytes > 0) {
    size_t total = o.a2a_bytes * (size_t)np;
    if (o.a2a_bytes > (size_t)INT32_MAX) MPI_Abort(w, 2);
    char *sb = malloc(total), *rb = malloc(total);
    if (!sb || !rb) MPI_Abort(w, 2);
    memset(sb, me & 0xff, total);
    memset(rb, 0, total);
    int cnt = (int)o.a2a_bytes;
    double *t = malloc((size_t)(o.a2a_iters + 1) * sizeof *t);
    if (!t) MPI_Abort(w, 2);
    for (int it = 0; it <= o.a2a_iters; it++) {  // iteration 0 is the warm-up
      idle_barrier(w);
      MPI_Barrier(w);
      double t0 = MPI_Wtime();
      MPI_Alltoall(sb, cnt, MPI_BYTE, rb, cnt, MPI_BYTE, w);
      double dt = MPI_Wtime() - t0, mx = 0;
      MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, w);
      t[it] = mx;
    }
    // every block must hold the sender's byte
    int bad = 0;
    for (int r = 0; r < np && !bad; r++)
      for (size_t i = 0; i < o.a2a_bytes; i += 4096)
        if ((unsigned char)rb[(size_t)r * o.a2a_bytes + i] != (unsigned char)(r & 0xff)) bad = 1;
    int anybad = 0;
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, w);
    if (me == 0) {
      double med = median(t + 1, o.a2a_iters);
      // Link bound: bytes over the busiest shaped link (both directions carry the
      // same amount, each direction shaped separately).
      int gg = np / nnodes;
      double bound = 0.0;
      const char *which = "none (one node, shared memory)";
      if (nnodes > 1 && o.inter_gbit > 0 && np % nnodes == 0) {
        double inter_bytes = (double)gg * gg * (nnodes - 1) * (double)o.a2a_bytes;
        bound = inter_bytes * 8.0 / (o.inter_gbit * 1e9);
        which = "node uplink";
      }
      if (strcmp(o.mode, "shaped") == 0 && o.intra_gbit > 0 && np > 1) {
        double rank_bytes = (double)(np - 1) * (double)o.a2a_bytes;
        double b2 = rank_bytes * 8.0 / (o.intra_gbit * 1e9);
        if (b2 > bound) {
          bound = b2;
          which = "rank link";
        }
      }
      char sz[32];
      fmt_size(o.a2a_bytes, sz, sizeof sz);
      printf("\nalltoall %s per pair, %d ranks: median %.2f ms over %d iterations (min %.2f ms)",
             sz, np, med * 1e3, o.a2a_iters, t[1] * 1e3);  // median() sorted t[1..]
      if (bound > 0)
        printf("; link bound %.2f ms (%s) -> %.1f%% of bound\n", bound * 1e3, which,
               100.0 * bound / med);
      else
        printf("; link bound: %s\n", which);
      printf("alltoall data check: %s\n", anybad ? "FAILED" : "ok");
      fflush(stdout);
    }
    if (anybad) rc = 1;
    free(t);
    free(sb);
    free(rb);
  }
  free(names);
  free(node);
  MPI_Finalize();
  return rc;
}
