// Training outputs declared in include/moe/progress.h: the progress line (in
// place on a terminal, plain lines otherwise), the metrics writer (one JSON
// object per line) and the loss plot through gnuplot, with small gnuplot
// helpers (availability, terminal by extension, running a script) that other
// plots can share.
//
// Not a timer and not MPI-aware: the trainer measures and calls these on
// rank 0.
#define _POSIX_C_SOURCE 200809L
#include "moe/progress.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

// ---- progress line -----------------------------------------------------------------

#define LN2 0.69314718055994530942  // bits per nat: loss / ln 2

struct moe_progress {
  FILE *out;
  int tty;
  int total;
  int drawn;       // an in-place line is on screen (tty)
  int have_first;  // the first update was seen (ETA reference)
  int first_step;  // step and elapsed time of the first update
  double first_elapsed;
  double last_val;  // last measured validation loss (NAN: none yet)
  int last_val_step;
};

moe_status moe_progress_create(moe_ctx *ctx, FILE *out, int tty, int total_steps,
                               moe_progress **p) {
  moe_status st = MOE_STATUS_OK;
  moe_progress *q = NULL;
  MOE_FAIL_IF(ctx, !p, MOE_STATUS_INVALID_ARG, "moe_progress_create: p is NULL");
  *p = NULL;
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "moe_progress_create: out is NULL");
  MOE_FAIL_IF(ctx, total_steps < 1, MOE_STATUS_INVALID_ARG, "total steps (%d) must be at least 1",
              total_steps);
  MOE_FAIL_IF(ctx, tty < -1 || tty > 1, MOE_STATUS_INVALID_ARG,
              "tty (%d) must be -1 (detect), 0 or 1", tty);
  q = moe_calloc(1, sizeof *q);
  MOE_FAIL_IF(ctx, !q, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate the progress line");
  q->out = out;
  q->tty = tty >= 0 ? tty : isatty(fileno(out)) != 0;
  q->total = total_steps;
  q->last_val = NAN;
  *p = q;
done:
  return st;
}

// "532", "52.3k", "1.24M".
static void fmt_rate(char *buf, size_t cap, double x) {
  if (!isfinite(x)) {
    snprintf(buf, cap, "-");
  } else if (x < 1e3) {
    snprintf(buf, cap, "%.0f", x);
  } else if (x < 1e6) {
    snprintf(buf, cap, "%.1fk", x / 1e3);
  } else if (x < 1e9) {
    snprintf(buf, cap, "%.2fM", x / 1e6);
  } else {
    snprintf(buf, cap, "%.2fG", x / 1e9);
  }
}

// "41.2 s", "5m02s", "2h07m".
static void fmt_duration(char *buf, size_t cap, double s) {
  if (!isfinite(s) || s < 0) {
    snprintf(buf, cap, "-");
  } else if (s < 60) {
    snprintf(buf, cap, "%.1f s", s);
  } else if (s < 3600) {
    const long t = lround(s);
    snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
  } else {
    const long t = lround(s / 60);
    snprintf(buf, cap, "%ldh%02ldm", t / 60, t % 60);
  }
}

// "1.8342 (2.646 bpb)" or "nan".
static void fmt_loss(char *buf, size_t cap, double loss) {
  if (isfinite(loss)) {
    snprintf(buf, cap, "%.4f (%.3f bpb)", loss, loss / LN2);
  } else {
    snprintf(buf, cap, "%s", isnan(loss) ? "nan" : "inf");
  }
}

static int terminal_width(FILE *out) {
#ifdef TIOCGWINSZ
  struct winsize ws;
  if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
#else
  (void)out;
#endif
  return 0;  // unknown: no cut
}

void moe_progress_update(moe_progress *p, int step, double loss, double val_loss,
                         double tokens_per_s, double a2a_share, double elapsed_s) {
  if (!p) return;
  if (!p->have_first) {
    p->have_first = 1;
    p->first_step = step;
    p->first_elapsed = elapsed_s;
  }
  const int fresh = !isnan(val_loss);
  if (fresh) {
    p->last_val = val_loss;
    p->last_val_step = step;
  }
  char l[64], v[80], rate[32], el[32], eta[32], a2a[32];
  fmt_loss(l, sizeof l, loss);
  if (isnan(p->last_val) && !fresh) {
    snprintf(v, sizeof v, "-");
  } else {
    char vl[64];
    fmt_loss(vl, sizeof vl, p->last_val);
    if (fresh) {
      snprintf(v, sizeof v, "%s", vl);
    } else {
      snprintf(v, sizeof v, "%s@%d", vl, p->last_val_step);
    }
  }
  fmt_rate(rate, sizeof rate, tokens_per_s);
  fmt_duration(el, sizeof el, elapsed_s);
  double eta_s = NAN;
  if (step > p->first_step) {
    const double mean = (elapsed_s - p->first_elapsed) / (double)(step - p->first_step);
    eta_s = mean * (double)(p->total > step ? p->total - step : 0);
  } else if (step >= p->total) {
    eta_s = 0;
  }
  fmt_duration(eta, sizeof eta, eta_s);
  if (isfinite(a2a_share)) {
    snprintf(a2a, sizeof a2a, "%.1f%%", 100.0 * a2a_share);
  } else {
    snprintf(a2a, sizeof a2a, "-");
  }
  char line[512];
  int n = snprintf(line, sizeof line, "step %d/%d loss %s val %s | %s tok/s | a2a %s | %s | ETA %s",
                   step, p->total, l, v, rate, a2a, el, eta);
  if (n < 0) return;
  if (p->tty) {
    const int width = terminal_width(p->out);
    // Leave the last column free: a full-width line wraps on some terminals.
    if (width > 1 && n > width - 1) line[width - 1] = '\0';
    fprintf(p->out, "\r%s\033[K", line);
    p->drawn = 1;
  } else {
    fprintf(p->out, "%s\n", line);
  }
  fflush(p->out);
}

void moe_progress_finish(moe_progress *p) {
  if (!p) return;
  if (p->tty && p->drawn) {
    fputc('\n', p->out);
    fflush(p->out);
  }
  p->drawn = 0;
}

void moe_progress_free(moe_progress *p) { moe_free(p); }

// ---- metrics file -----------------------------------------------------------------

struct moe_metrics {
  FILE *f;
  moe_ctx *ctx;
  char path[1024];
};

moe_status moe_metrics_open(moe_ctx *ctx, const char *path, int append, moe_metrics **m) {
  moe_status st = MOE_STATUS_OK;
  moe_metrics *q = NULL;
  MOE_FAIL_IF(ctx, !m, MOE_STATUS_INVALID_ARG, "moe_metrics_open: m is NULL");
  *m = NULL;
  MOE_FAIL_IF(ctx, !path || !path[0], MOE_STATUS_INVALID_ARG, "metrics file: the path is empty");
  q = moe_calloc(1, sizeof *q);
  MOE_FAIL_IF(ctx, !q, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate the metrics writer");
  q->f = fopen(path, append ? "a" : "w");
  MOE_FAIL_IF(ctx, !q->f, MOE_STATUS_IO, "cannot open the metrics file '%s': %s", path,
              strerror(errno));
  q->ctx = ctx;
  snprintf(q->path, sizeof q->path, "%s", path);
  *m = q;
  q = NULL;
done:
  moe_metrics_close(q);
  return st;
}

static const char *const k_metric_keys[] = {"step",      "loss", "val_loss", "tokens_per_s",
                                            "a2a_share", "lr",   "time_s"};

static void put_number(FILE *f, double x) {
  if (isfinite(x)) {
    fprintf(f, "%.9g", x);
  } else {
    fputs("null", f);
  }
}

// A JSON string: quotes, backslashes and control characters escaped.
static void put_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\') {
      fputc('\\', f);
      fputc(*c, f);
    } else if (*c < 0x20) {
      fprintf(f, "\\u%04x", *c);
    } else {
      fputc(*c, f);
    }
  }
  fputc('"', f);
}

moe_status moe_metrics_write(moe_metrics *m, int step, double loss, double val_loss,
                             double tokens_per_s, double a2a_share, double lr, double time_s,
                             const char *const *extra_names, const double *extra_values,
                             int n_extra) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = m ? m->ctx : NULL;
  MOE_FAIL_IF(ctx, !m, MOE_STATUS_INVALID_ARG, "moe_metrics_write: m is NULL");
  MOE_FAIL_IF(ctx, n_extra < 0 || (n_extra > 0 && (!extra_names || !extra_values)),
              MOE_STATUS_INVALID_ARG, "metrics: %d extra fields without names or values", n_extra);
  for (int i = 0; i < n_extra; i++) {
    MOE_FAIL_IF(ctx, !extra_names[i] || !extra_names[i][0], MOE_STATUS_INVALID_ARG,
                "metrics: extra field %d has no name", i);
    for (size_t k = 0; k < sizeof k_metric_keys / sizeof k_metric_keys[0]; k++) {
      MOE_FAIL_IF(ctx, strcmp(extra_names[i], k_metric_keys[k]) == 0, MOE_STATUS_INVALID_ARG,
                  "metrics: extra field '%s' repeats a built-in key", extra_names[i]);
    }
  }
  FILE *f = m->f;
  fprintf(f, "{\"step\":%d,\"loss\":", step);
  put_number(f, loss);
  if (!isnan(val_loss)) {
    fputs(",\"val_loss\":", f);
    put_number(f, val_loss);
  }
  fputs(",\"tokens_per_s\":", f);
  put_number(f, tokens_per_s);
  fputs(",\"a2a_share\":", f);
  put_number(f, a2a_share);
  fputs(",\"lr\":", f);
  put_number(f, lr);
  fputs(",\"time_s\":", f);
  put_number(f, time_s);
  for (int i = 0; i < n_extra; i++) {
    fputc(',', f);
    put_string(f, extra_names[i]);
    fputc(':', f);
    put_number(f, extra_values[i]);
  }
  fputs("}\n", f);
  MOE_FAIL_IF(ctx, fflush(f) != 0 || ferror(f), MOE_STATUS_IO,
              "cannot write the metrics file '%s': %s", m->path, strerror(errno));
done:
  return st;
}

void moe_metrics_close(moe_metrics *m) {
  if (!m) return;
  if (m->f) fclose(m->f);
  moe_free(m);
}

// ---- gnuplot -------------------------------------------------------------------------

int moe_gnuplot_available(void) { return system("command -v gnuplot >/dev/null 2>&1") == 0; }

int moe_gnuplot_path_ok(const char *path) {
  return path && path[0] && !strpbrk(path, "'\"\\\n\r") && strlen(path) < 4000;
}

static int ends_with(const char *s, const char *suffix) {
  const size_t n = strlen(s), k = strlen(suffix);
  return n > k && strcmp(s + n - k, suffix) == 0;
}

void moe_gnuplot_set_output(FILE *gp, const char *out_path) {
  if (ends_with(out_path, ".png")) {
    fputs(
        "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
        "  set terminal pngcairo size 900,600\n"
        "} else {\n"
        "  set terminal png size 900,600\n"
        "}\n",
        gp);
  } else if (ends_with(out_path, ".svg")) {
    fputs("set terminal svg size 900,600\n", gp);
  } else {
    fputs("set terminal dumb size 100,30\n", gp);
  }
  fprintf(gp, "set output '%s'\n", out_path);
}

moe_status moe_gnuplot_run(moe_ctx *ctx, const char *script_path) {
  moe_status st = MOE_STATUS_OK;
  char cmd[4200];
  MOE_FAIL_IF(ctx, !moe_gnuplot_path_ok(script_path), MOE_STATUS_INVALID_ARG,
              "gnuplot script path '%s' may not be empty or hold quotes, backslashes or newlines",
              script_path ? script_path : "(null)");
  MOE_FAIL_IF(ctx, !moe_gnuplot_available(), MOE_STATUS_UNSUPPORTED,
              "gnuplot is not installed (Debian package gnuplot-nox): run 'gnuplot %s' "
              "where it is",
              script_path);
  snprintf(cmd, sizeof cmd, "gnuplot '%s'", script_path);
  const int rc = system(cmd);
  MOE_FAIL_IF(ctx, rc != 0, MOE_STATUS_IO,
              "gnuplot failed on '%s' (status %d; its messages are on stderr)", script_path, rc);
done:
  return st;
}

// ---- loss plot -------------------------------------------------------------------------

moe_status moe_plot_loss(moe_ctx *ctx, const char *metrics_path, const char *out_path) {
  moe_status st = MOE_STATUS_OK;
  FILE *in = NULL, *dat = NULL, *gp = NULL, *val = NULL;
  char *line = NULL;
  size_t line_cap = 0;
  cJSON *obj = NULL;
  char dat_path[4096], gp_path[4096];
  long lineno = 0, ntrain = 0, nval = 0;

  MOE_FAIL_IF(ctx, !metrics_path || !out_path, MOE_STATUS_INVALID_ARG,
              "moe_plot_loss: paths must not be NULL");
  MOE_FAIL_IF(ctx, !moe_gnuplot_path_ok(out_path), MOE_STATUS_INVALID_ARG,
              "plot path '%s' may not be empty or hold quotes, backslashes or newlines", out_path);
  snprintf(dat_path, sizeof dat_path, "%s.dat", out_path);
  snprintf(gp_path, sizeof gp_path, "%s.gp", out_path);
  in = fopen(metrics_path, "r");
  MOE_FAIL_IF(ctx, !in, MOE_STATUS_IO, "cannot open the metrics file '%s': %s", metrics_path,
              strerror(errno));
  dat = fopen(dat_path, "w");
  MOE_FAIL_IF(ctx, !dat, MOE_STATUS_IO, "cannot write '%s': %s", dat_path, strerror(errno));
  // Validation points go to a temporary file first, then become the second
  // data block (index 1) after the training block (index 0).
  val = tmpfile();
  MOE_FAIL_IF(ctx, !val, MOE_STATUS_IO, "cannot create a temporary file: %s", strerror(errno));
  fprintf(dat, "# training loss: step bits_per_byte\n");
  while (getline(&line, &line_cap, in) != -1) {
    lineno++;
    if (strspn(line, " \t\r\n") == strlen(line)) continue;  // blank
    obj = cJSON_Parse(line);
    MOE_FAIL_IF(ctx, !obj || !cJSON_IsObject(obj), MOE_STATUS_BAD_FORMAT,
                "%s:%ld: not a JSON object", metrics_path, lineno);
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(obj, "step");
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(obj, "loss");
    const cJSON *vl = cJSON_GetObjectItemCaseSensitive(obj, "val_loss");
    MOE_FAIL_IF(ctx, !cJSON_IsNumber(step), MOE_STATUS_BAD_FORMAT, "%s:%ld: no numeric \"step\"",
                metrics_path, lineno);
    MOE_FAIL_IF(ctx, !cJSON_IsNumber(loss) && !cJSON_IsNull(loss), MOE_STATUS_BAD_FORMAT,
                "%s:%ld: \"loss\" must be a number or null", metrics_path, lineno);
    if (cJSON_IsNumber(loss) && isfinite(loss->valuedouble)) {
      fprintf(dat, "%.9g %.9g\n", step->valuedouble, loss->valuedouble / LN2);
      ntrain++;
    }
    if (cJSON_IsNumber(vl) && isfinite(vl->valuedouble)) {
      fprintf(val, "%.9g %.9g\n", step->valuedouble, vl->valuedouble / LN2);
      nval++;
    }
    cJSON_Delete(obj);
    obj = NULL;
  }
  MOE_FAIL_IF(ctx, ferror(in), MOE_STATUS_IO, "cannot read the metrics file '%s'", metrics_path);
  MOE_FAIL_IF(ctx, ntrain == 0, MOE_STATUS_BAD_FORMAT,
              "the metrics file '%s' holds no finite training loss (%ld lines)", metrics_path,
              lineno);
  if (nval > 0) {
    fprintf(dat, "\n\n# validation loss: step bits_per_byte\n");
    rewind(val);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, val)) > 0) fwrite(buf, 1, n, dat);
  }
  MOE_FAIL_IF(ctx, fclose(dat) != 0, MOE_STATUS_IO, "cannot write '%s'", dat_path);
  dat = NULL;

  gp = fopen(gp_path, "w");
  MOE_FAIL_IF(ctx, !gp, MOE_STATUS_IO, "cannot write '%s': %s", gp_path, strerror(errno));
  moe_gnuplot_set_output(gp, out_path);
  fprintf(gp,
          "set title 'training loss'\nset xlabel 'step'\nset ylabel 'loss (bits per byte)'\n"
          "set grid\nset key top right\n"
          "plot '%s' index 0 using 1:2 with lines lw 2 title 'train'",
          dat_path);
  if (nval > 0) {
    fprintf(gp, ", '%s' index 1 using 1:2 with linespoints pt 7 title 'validation'", dat_path);
  }
  fputs("\n", gp);
  MOE_FAIL_IF(ctx, fclose(gp) != 0, MOE_STATUS_IO, "cannot write '%s'", gp_path);
  gp = NULL;
  if (!moe_gnuplot_available()) {
    MOE_FAIL(ctx, MOE_STATUS_UNSUPPORTED,
             "gnuplot is not installed (Debian package gnuplot-nox): wrote %s and %s; run "
             "'gnuplot %s' where it is",
             dat_path, gp_path, gp_path);
  }
  MOE_TRY(moe_gnuplot_run(ctx, gp_path));
done:
  cJSON_Delete(obj);
  free(line);  // from getline: the C library's malloc
  if (in) fclose(in);
  if (dat) fclose(dat);
  if (gp) fclose(gp);
  if (val) fclose(val);
  return st;
}
