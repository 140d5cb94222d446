// moe: the libmoe command-line tool. Dispatches subcommands; each lives in its
// own file and uses only the public API.
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: moe <command> [options]\n"
          "\n"
          "libmoe %s: a distributed Mixture-of-Experts runtime.\n"
          "\n"
          "commands:\n"
          "  version          print the version and the compiled-in features (also --version;\n"
          "                   --catalogue: the registered names of every plug-in kind)\n"
          "  train            train MoE-GPT (under mpirun: data x expert parallelism)\n"
          "  sample           generate text from a training checkpoint (one sequence)\n"
          "  generate         completions for a JSONL file of prompts: KV cache, continuous\n"
          "                   batching, expert-parallel under mpirun\n"
          "  serve            an OpenAI-compatible HTTP server (completions, chat, streaming,\n"
          "                   /metrics) over the same engine\n"
          "  bench layer      time one MoE layer (forward + backward), in one process or\n"
          "                   expert-parallel with the schedules (under mpirun)\n"
          "  bench a2a        time the all-to-all algorithms (run under mpirun)\n"
          "  bench compress   throughput, ratio and error of the compressors\n"
          "  bench parm       time Parm's schedules (baseline, s1, s2) on MP x EP x ESP layouts\n"
          "                   (under mpirun)\n"
          "  bench contention an all-to-all beside a gradient all-reduce: alone, fifo, Lina's\n"
          "                   priority (under mpirun)\n"
          "  bench serve      load-test a moe serve server (and compare placements)\n"
          "  calibrate        measure this cluster (under mpirun) and write a profile\n"
          "  simulate         predict the expert-parallel layer's time on a described cluster\n"
          "                   (the papers' testbeds are built in; no MPI needed)\n"
          "  roofline         the DDL-roofline point of every variant (and a gnuplot plot)\n"
          "  help             print this help (also --help, -h)\n"
          "\n"
          "Run 'moe <command> --help' for the options of a command.\n"
          "Exit status: 0 success, 1 runtime failure, 2 invalid arguments or input.\n",
          moe_version());
}

// `moe version --catalogue`: every plug-in kind's registered names, one kind a
// line ("KIND: name name ..."), straight from the catalogues (all of them, also
// those not compiled into this build). tests/catalogue_test.sh reads it.
static void print_catalogue(void) {
  int n = 0;
  const moe_a2a_algo *const *a2a = moe_a2a_list(&n);
  printf("a2a:");
  for (int i = 0; i < n; i++) printf(" %s", a2a[i]->name);
  const moe_compressor_entry *const *comp = moe_compressor_list(&n);
  printf("\ncompress:");
  for (int i = 0; i < n; i++) printf(" %s", comp[i]->codec.name);
  const moe_schedule_algo *sched = moe_schedule_algo_list(&n);
  printf("\nschedule:");
  for (int i = 0; i < n; i++) printf(" %s", sched[i].name);
  printf("\nexpert:");
  for (int i = 0; i < moe_expert_kind_count(); i++) printf(" %s", moe_expert_kind_get(i)->name);
  const moe_backend *const *backends = moe_backend_list(&n);
  printf("\nbackend:");
  for (int i = 0; i < n; i++) printf(" %s", backends[i]->name);
  printf("\n");
}

static int cmd_version(int argc, char **argv) {
  if (argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
    printf(
        "usage: moe version [--catalogue]\n\nPrints the libmoe version and compiled-in "
        "features;\nwith --catalogue, the registered names of every plug-in kind (all-to-all\n"
        "algorithms, compressors, schedules, expert kinds, compute backends), one kind a "
        "line.\n");
    return CLI_OK;
  }
  if (argc == 3 && strcmp(argv[2], "--catalogue") == 0) {
    print_catalogue();
    return CLI_OK;
  }
  if (argc > 2) {
    cli_error("version takes no arguments (got '%s')", argv[2]);
    return CLI_USAGE;
  }
  printf("libmoe %s\nfeatures: %s\nblas: %s (kernels: %s)\n", moe_version(), moe_features(),
         moe_blas_name(), moe_blas_core());
  return CLI_OK;
}

// OpenBLAS reads OPENBLAS_CORETYPE only when it loads, so when it picked kernels
// weaker than this CPU supports, restart once with the variable set. Skipped
// when the user set OPENBLAS_CORETYPE or MOE_NO_BLAS_REEXEC.
static void maybe_reexec_for_blas(char **argv) {
#ifdef __linux__
  const char *better = moe_blas_better_core();
  const char *off = getenv("MOE_NO_BLAS_REEXEC");
  if (!better || getenv("OPENBLAS_CORETYPE") || (off && *off && strcmp(off, "0") != 0)) return;
  if (setenv("OPENBLAS_CORETYPE", better, 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Only reached if exec failed: go on with the slow kernels (the library warns
  // when a layer is created) and keep the variable out of child processes.
  unsetenv("OPENBLAS_CORETYPE");
#else
  (void)argv;
#endif
}

int main(int argc, char **argv) {
  maybe_reexec_for_blas(argv);
  if (argc < 2) {
    usage(stderr);
    return CLI_USAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    usage(stdout);
    return CLI_OK;
  }
  if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) return cmd_version(argc, argv);
  if (strcmp(cmd, "train") == 0) return cmd_train(argc, argv);
  if (strcmp(cmd, "sample") == 0) return cmd_sample(argc, argv);
  if (strcmp(cmd, "generate") == 0) return cmd_generate(argc, argv);
  if (strcmp(cmd, "serve") == 0) return cmd_serve(argc, argv);
  if (strcmp(cmd, "bench") == 0) return cmd_bench(argc, argv);
  if (strcmp(cmd, "simulate") == 0) return cmd_simulate(argc, argv);
  if (strcmp(cmd, "roofline") == 0) return cmd_roofline(argc, argv);
  if (strcmp(cmd, "calibrate") == 0) return cmd_calibrate(argc, argv);
  cli_error("unknown command '%s' (run 'moe --help' for the list)", cmd);
  return CLI_USAGE;
}
