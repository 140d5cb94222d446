// Shared helpers of the libFuzzer harnesses (fuzz/fuzz_*.c): invariant checks
// that abort (libFuzzer then saves the input as a crash), the input as a C
// string, the error contract of a failed call, an in-memory file to hand to
// readers that take a path, and a scratch directory.
//
// What it is for: every harness checks more than "does not crash": a call
// that fails must leave an error message in its context, and a call that
// succeeds must give a result that passes its own checks and reads back
// equal after writing, where the library has a writer.
// Not: a test framework. Public API only (moe/*.h), like the CLI.
#ifndef MOE_FUZZ_UTIL_H
#define MOE_FUZZ_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // memfd_create, mkdtemp
#endif
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "moe/core.h"

// Aborts with a message when cond is false: an invariant of the library broke.
#define FUZZ_CHECK(cond, ...)                                                               \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      fprintf(stderr, "fuzz invariant failed at %s:%d: %s\n  ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                         \
      fprintf(stderr, "\n");                                                                \
      abort();                                                                              \
    }                                                                                       \
  } while (0)

// The input as a NUL-terminated string (malloc'd; an embedded NUL ends it).
static inline char *fuzz_cstr(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  FUZZ_CHECK(s != NULL, "out of memory copying %zu bytes", size);
  if (size) memcpy(s, data, size);
  s[size] = '\0';
  return s;
}

// A new context (aborts if that fails: nothing to fuzz without one).
static inline moe_ctx *fuzz_ctx(void) {
  moe_ctx *ctx = NULL;
  FUZZ_CHECK(moe_ctx_create(&ctx) == MOE_STATUS_OK && ctx, "moe_ctx_create failed");
  return ctx;
}

// The error contract of a failed call: a status that is an error, recorded in
// ctx with a non-empty message and location.
static inline void fuzz_check_failure(moe_ctx *ctx, moe_status st, const char *what) {
  FUZZ_CHECK(st > MOE_STATUS_OK && st < MOE_STATUS_COUNT_, "%s: status %d out of range", what,
             (int)st);
  FUZZ_CHECK(moe_ctx_error(ctx)[0] != '\0', "%s failed (%s) without an error message", what,
             moe_status_str(st));
  FUZZ_CHECK(moe_ctx_status(ctx) == st, "%s: returned %s but ctx says %s", what, moe_status_str(st),
             moe_status_str(moe_ctx_status(ctx)));
  FUZZ_CHECK(moe_ctx_error_where(ctx)[0] != '\0', "%s: error without a location", what);
}

// ---- an in-memory file -------------------------------------------------------

// One memfd per process, refilled for every input; its path (/proc/self/fd/N)
// opens the same bytes, so a reader that takes a path never touches a disk.
static inline const char *fuzz_memfile(const void *data, size_t size) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    fd = memfd_create("moe-fuzz", MFD_CLOEXEC);
    FUZZ_CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  FUZZ_CHECK(ftruncate(fd, 0) == 0, "ftruncate: %s", strerror(errno));
  const unsigned char *p = data;
  size_t done = 0;
  while (done < size) {
    const ssize_t k = pwrite(fd, p + done, size - done, (off_t)done);
    FUZZ_CHECK(k > 0, "pwrite: %s", strerror(errno));
    done += (size_t)k;
  }
  return path;
}

// A scratch directory made once per process under /dev/shm (else $TMPDIR or
// /tmp); removed at exit when empty.
static char fuzz_dir_path[256];
static inline void fuzz_dir_remove(void) {
  if (fuzz_dir_path[0]) rmdir(fuzz_dir_path);
}
static inline const char *fuzz_dir(void) {
  if (!fuzz_dir_path[0]) {
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/moe-fuzz-XXXXXX", base);
    FUZZ_CHECK(mkdtemp(fuzz_dir_path) != NULL, "mkdtemp %s: %s", fuzz_dir_path, strerror(errno));
    atexit(fuzz_dir_remove);
  }
  return fuzz_dir_path;
}

#endif  // MOE_FUZZ_UTIL_H
