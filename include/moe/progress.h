// libmoe training outputs: the progress line, the metrics file (JSON lines)
// and the loss plot (gnuplot).
//
// What it is: presentation of numbers the trainer measures (losses, tokens/s,
// the share of time in all-to-all). What it is not: a measurement facility
// (the trainer times its steps) nor MPI-aware (call it on rank 0 only).
// Threading: each object belongs to one thread.
#ifndef MOE_PROGRESS_H
#define MOE_PROGRESS_H

#include <stdio.h>

#include "moe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- progress line -------------------------------------------------------------

typedef struct moe_progress moe_progress;

// out: where to print (e.g. stderr), not owned. tty: -1 detects with
// isatty(fileno(out)), 0 or 1 forces. On a terminal every update redraws one
// line in place ("\r", the line, then "ESC[K" to clear the rest; cut to the
// terminal's width) and moe_progress_finish ends it with "\n"; otherwise every
// update prints one plain line. total_steps >= 1 (INVALID_ARG otherwise).
moe_status moe_progress_create(moe_ctx *ctx, FILE *out, int tty, int total_steps, moe_progress **p);
// step: steps done so far (1..total); loss: training loss in nats per token;
// val_loss: NAN when not measured at this step (the line then shows the last
// measured value followed by "@<step it was measured at>", or "-" before any);
// tokens_per_s and a2a_share (fraction in [0, 1] of the step time spent in
// all-to-all; NAN: unknown); elapsed_s: seconds since training started.
// Losses are also shown in bits per byte (loss / ln 2): the tokens are bytes.
// ETA = (total - step) x the mean step time since the first update (the steps
// up to the first update, warm-up included, are left out); "-" until known.
// The line looks like
//   step 120/1000 loss 1.8342 (2.646 bpb) val 1.9021 (2.744 bpb)@100 | 52.3k tok/s
//   | a2a 23.4% | 41.2 s | ETA 5m02s
void moe_progress_update(moe_progress *p, int step, double loss, double val_loss,
                         double tokens_per_s, double a2a_share, double elapsed_s);
// Ends the line on a terminal (a "\n" if an update was drawn); nothing otherwise.
void moe_progress_finish(moe_progress *p);
void moe_progress_free(moe_progress *p);  // NULL is a no-op; does not close out

// ---- metrics file ----------------------------------------------------------------

typedef struct moe_metrics moe_metrics;

// Opens path for writing (append != 0: appends, e.g. when resuming). IO error
// with the reason. Errors of later writes are recorded in ctx, which must
// outlive m.
moe_status moe_metrics_open(moe_ctx *ctx, const char *path, int append, moe_metrics **m);
// Writes one JSON object on one line and flushes it:
//   {"step":S,"loss":L,"val_loss":V,"tokens_per_s":T,"a2a_share":A,"lr":R,"time_s":E,...}
// val_loss is omitted when NAN; numbers are printed with %.9g, other non-finite
// values as null; then n_extra extra numeric fields (names escaped as JSON
// strings; a name equal to a built-in key or empty is INVALID_ARG).
// IO error when the write fails (disk full).
moe_status moe_metrics_write(moe_metrics *m, int step, double loss, double val_loss,
                             double tokens_per_s, double a2a_share, double lr, double time_s,
                             const char *const *extra_names, const double *extra_values,
                             int n_extra);
void moe_metrics_close(moe_metrics *m);  // NULL is a no-op

// ---- plots (gnuplot) -------------------------------------------------------------

// 1 if a gnuplot executable is on PATH, else 0.
int moe_gnuplot_available(void);
// Writes the "set terminal" and "set output" lines of a gnuplot script for an
// output file, chosen by its extension: ".png" -> pngcairo (png where gnuplot
// lacks cairo), ".svg" -> svg (both 900x600), else "dumb" 100x30 (a text plot).
// out_path may not hold quotes, backslashes or newlines (check with
// moe_gnuplot_path_ok).
void moe_gnuplot_set_output(FILE *gp, const char *out_path);
// 1 if path can be quoted in a gnuplot script (no ' " \ or newline), else 0.
int moe_gnuplot_path_ok(const char *path);
// Runs `gnuplot script_path`. UNSUPPORTED (message saying so) when gnuplot is
// not installed; IO when gnuplot fails. script_path may not hold quotes,
// backslashes or newlines (INVALID_ARG). Spawns a shell: call outside MPI
// communication (e.g. on rank 0 after training).
moe_status moe_gnuplot_run(moe_ctx *ctx, const char *script_path);

// Reads a metrics file (JSON lines as written above) and plots the training
// loss (line) and the validation loss (points) in bits per byte against the
// step into out_path (terminal by moe_gnuplot_set_output: .png, .svg, else a
// text plot). Writes the data and the script next to it as out_path.dat and
// out_path.gp, then runs gnuplot. Errors: IO (unreadable metrics file),
// BAD_FORMAT (a line that is not a JSON object with a numeric "step" and a
// numeric or null "loss", naming the line; or no finite loss at all; null and
// non-finite losses are skipped), INVALID_ARG (quotes, backslashes or
// newlines in out_path), UNSUPPORTED when gnuplot is not installed (the data
// and script are written all the same, the message says how to run them).
moe_status moe_plot_loss(moe_ctx *ctx, const char *metrics_path, const char *out_path);

#ifdef __cplusplus
}
#endif
#endif  // MOE_PROGRESS_H
