// moe: the libmoe command-line tool. Dispatches subcommands; each lives in its
// own file and uses only the public API.
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: moe <command> [options]\n"
          "\n"
          "libmoe %s: a distributed Mixture-of-Experts runtime.\n"
          "\n"
          "commands:\n"
          "  version          print the version and the compiled-in features\n"
          "  bench layer      time one MoE layer (forward + backward) in one process\n"
          "  help             print this help\n"
          "\n"
          "Run 'moe <command> --help' for the options of a command.\n"
          "Exit status: 0 success, 1 runtime failure, 2 invalid arguments or input.\n",
          moe_version());
}

static int cmd_version(int argc, char **argv) {
  if (argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
    printf("usage: moe version\n\nPrints the libmoe version and compiled-in features.\n");
    return CLI_OK;
  }
  if (argc > 2) {
    cli_error("version takes no arguments (got '%s')", argv[2]);
    return CLI_USAGE;
  }
  printf("libmoe %s\nfeatures: %s\n", moe_version(), moe_features());
  return CLI_OK;
}

int main(int argc, char **argv) {
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
  if (strcmp(cmd, "bench") == 0) return cmd_bench(argc, argv);
  cli_error("unknown command '%s' (run 'moe --help' for the list)", cmd);
  return CLI_USAGE;
}
