// libFuzzer harness: the checkpoint reader, moe_ckpt_reader_* (include/moe/checkpoint.h).
//
// Input: a flag byte and a checkpoint file (fuzz_ckpt_input.h: the flags can
// ask for consistent checksums). The file is handed over as an in-memory
// file. Invariants checked:
//   - on failure: an error status with a message in the context, *out NULL;
//   - on success: the config is NUL-terminated text of config_len bytes;
//     every tensor's desc is valid (name of 1..63 characters, found by
//     moe_ckpt_reader_find at its own index, a known dtype, ndim in 1..4,
//     dims > 0 up to ndim and 0 after); the tensors fit in the file; every
//     tensor reads whole, and reads past its end or of a bad index fail with
//     INVALID_ARG and a message; written again with moe_ckpt_writer_* (to a
//     scratch directory) the same config, descs and data read back equal.
#include <string.h>

#include "fuzz_ckpt_input.h"
#include "fuzz_util.h"
#include "moe/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
  int n;
  moe_ckpt_tensor_desc *descs;
  unsigned char **data;  // each tensor's bytes
  size_t *bytes;
} tensors;

static void tensors_free(tensors *t) {
  for (int i = 0; i < t->n; i++) free(t->data[i]);
  free(t->data);
  free(t->bytes);
  free(t->descs);
}

// Checks the reader's descs and reads every tensor whole into t.
static void read_all(moe_ctx *ctx, moe_ckpt_reader *r, size_t file_bytes, tensors *t) {
  const int n = moe_ckpt_reader_num_tensors(r);
  FUZZ_CHECK(n >= 0, "negative tensor count %d", n);
  FUZZ_CHECK(moe_ckpt_reader_desc(r, n) == NULL && moe_ckpt_reader_desc(r, -1) == NULL,
             "desc out of range is not NULL");
  t->n = n;
  t->descs = calloc((size_t)n + 1, sizeof *t->descs);
  t->data = calloc((size_t)n + 1, sizeof *t->data);
  t->bytes = calloc((size_t)n + 1, sizeof *t->bytes);
  FUZZ_CHECK(t->descs && t->data && t->bytes, "out of memory");
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    const moe_ckpt_tensor_desc *d = moe_ckpt_reader_desc(r, i);
    FUZZ_CHECK(d != NULL, "tensor %d has no desc", i);
    const size_t len = strnlen(d->name, sizeof d->name);
    FUZZ_CHECK(len >= 1 && len <= MOE_CKPT_MAX_NAME, "tensor %d: name length %zu", i, len);
    FUZZ_CHECK(moe_ckpt_reader_find(r, d->name) == i, "tensor %d '%s' found at %d", i, d->name,
               moe_ckpt_reader_find(r, d->name));
    const size_t es = moe_ckpt_dtype_size(d->dtype);
    FUZZ_CHECK(es > 0, "tensor '%s': dtype %d", d->name, d->dtype);
    FUZZ_CHECK(d->ndim >= 1 && d->ndim <= MOE_CKPT_MAX_DIMS, "tensor '%s': ndim %d", d->name,
               d->ndim);
    for (int k = 0; k < MOE_CKPT_MAX_DIMS; k++) {
      FUZZ_CHECK(k < d->ndim ? d->dims[k] > 0 : d->dims[k] == 0, "tensor '%s': dims[%d] = %lld",
                 d->name, k, (long long)d->dims[k]);
    }
    const int64_t numel = moe_ckpt_desc_numel(d);
    FUZZ_CHECK(numel > 0 && (uint64_t)numel <= file_bytes / es, "tensor '%s': %lld elements",
               d->name, (long long)numel);
    const size_t bytes = (size_t)numel * es;
    total += bytes;
    FUZZ_CHECK(total <= file_bytes, "tensors hold %zu bytes, the file %zu", total, file_bytes);
    t->descs[i] = *d;
    t->bytes[i] = bytes;
    t->data[i] = malloc(bytes);
    FUZZ_CHECK(t->data[i] != NULL, "out of memory");
    moe_status st = moe_ckpt_reader_read(r, i, 0, (size_t)numel, t->data[i]);
    FUZZ_CHECK(st == MOE_STATUS_OK, "reading tensor '%s': %s", d->name, moe_ctx_error(ctx));
    moe_ctx_clear_error(ctx);
    st = moe_ckpt_reader_read(r, i, (size_t)numel, 1, t->data[i]);
    FUZZ_CHECK(st == MOE_STATUS_INVALID_ARG, "read past tensor '%s' gave %s", d->name,
               moe_status_str(st));
    fuzz_check_failure(ctx, st, "read past a tensor");
  }
  moe_ctx_clear_error(ctx);
  unsigned char one[4];
  const moe_status st = moe_ckpt_reader_read(r, n, 0, 1, one);
  FUZZ_CHECK(st == MOE_STATUS_INVALID_ARG, "read of tensor %d of %d gave %s", n, n,
             moe_status_str(st));
  fuzz_check_failure(ctx, st, "read of a bad index");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  moe_ctx *ctx = fuzz_ctx();
  const char *path = fuzz_ckpt_file(data, size);
  const size_t file_bytes = size ? size - 1 : 0;
  static char sentinel;
  moe_ckpt_reader *r = (moe_ckpt_reader *)&sentinel, *again = NULL;  // a failure must reset r
  moe_status st = moe_ckpt_reader_open(ctx, path, &r);
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_ckpt_reader_open");
    FUZZ_CHECK(r == NULL, "failed open left *out set");
    moe_ctx_destroy(ctx);
    return 0;
  }
  const char *config = moe_ckpt_reader_config(r);
  FUZZ_CHECK(config && strlen(config) == moe_ckpt_reader_config_len(r),
             "config of %zu bytes has strlen %zu", moe_ckpt_reader_config_len(r),
             config ? strlen(config) : 0);
  FUZZ_CHECK(moe_ckpt_reader_config_len(r) < file_bytes, "config longer than the file");
  tensors t;
  read_all(ctx, r, file_bytes, &t);

  // Written again by the library's writer, it reads back the same.
  char out[320];
  snprintf(out, sizeof out, "%s/rewrite.ckpt", fuzz_dir());
  moe_ckpt_writer *w = NULL;
  st = moe_ckpt_writer_open(ctx, out, config, t.descs, t.n, &w);
  FUZZ_CHECK(st == MOE_STATUS_OK, "writer refused what the reader accepted: %s",
             moe_ctx_error(ctx));
  for (int i = 0; i < t.n; i++) {
    st = moe_ckpt_writer_write(w, i, t.data[i], t.bytes[i]);
    FUZZ_CHECK(st == MOE_STATUS_OK, "writing tensor %d: %s", i, moe_ctx_error(ctx));
  }
  st = moe_ckpt_writer_commit(w);
  FUZZ_CHECK(st == MOE_STATUS_OK, "commit: %s", moe_ctx_error(ctx));
  st = moe_ckpt_reader_open(ctx, out, &again);
  FUZZ_CHECK(st == MOE_STATUS_OK, "reading the rewrite: %s", moe_ctx_error(ctx));
  FUZZ_CHECK(strcmp(moe_ckpt_reader_config(again), config) == 0, "config changed on rewrite");
  tensors u;
  read_all(ctx, again, (size_t)-1, &u);
  FUZZ_CHECK(u.n == t.n, "%d tensors became %d", t.n, u.n);
  for (int i = 0; i < t.n; i++) {
    FUZZ_CHECK(memcmp(&t.descs[i], &u.descs[i], sizeof t.descs[i]) == 0,
               "tensor %d desc changed on rewrite", i);
    FUZZ_CHECK(memcmp(t.data[i], u.data[i], t.bytes[i]) == 0, "tensor '%s' data changed",
               t.descs[i].name);
  }
  tensors_free(&u);
  tensors_free(&t);
  moe_ckpt_reader_close(again);
  moe_ckpt_reader_close(r);
  unlink(out);
  moe_ctx_destroy(ctx);
  return 0;
}
