// Writes the checkpoint seeds of the fuzz corpus with the library's own writer:
//   fuzz_seeds DIR
// writes DIR/checkpoint/*.bin (for fuzz_checkpoint) and DIR/gpt_ckpt/*.bin
// (for fuzz_gpt_ckpt): each is the flag byte of fuzz_ckpt_input.h (0: the
// file as it is) followed by a checkpoint file. The checkpoints:
//   checkpoint/tensors.bin   three tensors (f32 2x3, i32 4, u8 1x2x3x1), config "{}"
//   checkpoint/empty.bin     no tensor, config ""
//   gpt_ckpt/model.bin       a tiny MoE-GPT (V 16, S 4, 1 block, M 4, E 2, K 1, H 4)
//                            with its router bias
//   gpt_ckpt/model-adam.bin  the same with its AdamW moments and schedule
// Run by hand when the format changes (fuzz/corpus/README.md); exit 1 on error.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe/balance.h"
#include "moe/checkpoint.h"
#include "moe/gpt_io.h"
#include "moe/model.h"

static int fail(moe_ctx *ctx, const char *what) {
  fprintf(stderr, "fuzz_seeds: %s: %s\n", what, moe_ctx_error(ctx));
  return 1;
}

// Copies the checkpoint at tmp into out behind a 0 flag byte, removes tmp.
static int wrap(const char *tmp, const char *out) {
  FILE *in = fopen(tmp, "rb"), *o = fopen(out, "wb");
  if (!in || !o) {
    fprintf(stderr, "fuzz_seeds: cannot open %s or %s\n", tmp, out);
    if (in) fclose(in);
    if (o) fclose(o);
    return 1;
  }
  fputc(0, o);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, o);
  fclose(in);
  const int bad = fclose(o) != 0;
  unlink(tmp);
  printf("fuzz_seeds: wrote %s\n", out);
  return bad;
}

static int plain(moe_ctx *ctx, const char *dir) {
  char tmp[512], out[512];
  const moe_ckpt_tensor_desc d[3] = {{"weights", MOE_CKPT_F32, 2, {2, 3}},
                                     {"ids", MOE_CKPT_I32, 1, {4}},
                                     {"bytes", MOE_CKPT_U8, 4, {1, 2, 3, 1}}};
  const float w[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 7.0f};
  const int32_t ids[4] = {0, -1, 65536, 42};
  const uint8_t bytes[6] = {'a', 'b', 0, 255, 1, 2};
  moe_ckpt_writer *wr = NULL;
  snprintf(tmp, sizeof tmp, "%s/tmp.ckpt", dir);
  if (moe_ckpt_writer_open(ctx, tmp, "{}", d, 3, &wr) != MOE_STATUS_OK ||
      moe_ckpt_writer_write(wr, 0, w, sizeof w) != MOE_STATUS_OK ||
      moe_ckpt_writer_write(wr, 1, ids, sizeof ids) != MOE_STATUS_OK ||
      moe_ckpt_writer_write(wr, 2, bytes, 3) != MOE_STATUS_OK ||
      moe_ckpt_writer_write(wr, 2, bytes + 3, 3) != MOE_STATUS_OK ||
      moe_ckpt_writer_commit(wr) != MOE_STATUS_OK) {
    return fail(ctx, "tensors.bin");
  }
  snprintf(out, sizeof out, "%s/checkpoint/tensors.bin", dir);
  if (wrap(tmp, out)) return 1;
  if (moe_ckpt_writer_open(ctx, tmp, "", NULL, 0, &wr) != MOE_STATUS_OK ||
      moe_ckpt_writer_commit(wr) != MOE_STATUS_OK) {
    return fail(ctx, "empty.bin");
  }
  snprintf(out, sizeof out, "%s/checkpoint/empty.bin", dir);
  return wrap(tmp, out);
}

// A checkpoint of a tiny model, as the trainer writes one (gpt_io.h's contents).
static int gpt(moe_ctx *ctx, const char *dir, int with_optim) {
  char tmp[512], out[512];
  moe_gpt_config cfg;
  moe_gpt_config_default(&cfg);
  cfg.vocab_size = 16;
  cfg.seq_len = 4;
  cfg.n_layer = 1;
  cfg.n_head = 1;
  cfg.d_model = 4;
  cfg.dense_hidden = 8;
  cfg.moe.num_experts = 2;
  cfg.moe.top_k = 1;
  cfg.moe.hidden_dim = 4;
  moe_gpt *m = NULL;
  moe_optim *opt = NULL;
  moe_ckpt_writer *w = NULL;
  char *config = NULL;
  moe_ckpt_tensor_desc *d = NULL;
  int rc = 1;
  if (moe_gpt_create(ctx, &cfg, 1, NULL, NULL, &m) != MOE_STATUS_OK) goto done;
  moe_gpt_init_params(m, 5);
  if (with_optim) {
    moe_optim_config oc;
    moe_optim_config_default(&oc);
    if (moe_optim_create(ctx, m, &oc, &opt) != MOE_STATUS_OK) goto done;
    moe_optim_set_step_count(opt, 3);
  }
  const int np = moe_gpt_num_params(m), per = with_optim ? 3 : 1;
  d = calloc((size_t)(np * per + 1), sizeof *d);
  if (!d) goto done;
  // the router bias of block 0 (content version 3), not all zero
  float *bias = moe_gpt_router_bias(m, 0);
  for (int e = 0; e < cfg.moe.num_experts; e++) bias[e] = 0.25f * (float)(2 * e - 1);
  snprintf(d[np * per].name, sizeof d[np * per].name, MOE_GPT_ROUTER_BIAS_NAME, 0);
  d[np * per].dtype = MOE_CKPT_F32;
  d[np * per].ndim = 1;
  d[np * per].dims[0] = cfg.moe.num_experts;
  for (int i = 0; i < np; i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    for (int k = 0; k < per; k++) {
      moe_ckpt_tensor_desc *t = &d[i * per + k];
      snprintf(t->name, sizeof t->name, "%s%s",
               k == 0   ? ""
               : k == 1 ? "adam.m."
                        : "adam.v.",
               p.name);
      t->dtype = MOE_CKPT_F32;
      t->ndim = p.ndim;
      for (int j = 0; j < p.ndim; j++) t->dims[j] = p.dims[j];
    }
    if (opt) {  // moments that are not all zero
      for (size_t j = 0; j < p.numel; j++) {
        moe_optim_m(opt, i)[j] = 0.5f * p.data[j];
        moe_optim_v(opt, i)[j] = p.data[j] * p.data[j];
      }
    }
  }
  if (moe_gpt_ckpt_config_json(ctx, m, opt, 3, 7, 2, &config) != MOE_STATUS_OK) goto done;
  snprintf(tmp, sizeof tmp, "%s/tmp.ckpt", dir);
  if (moe_ckpt_writer_open(ctx, tmp, config, d, np * per + 1, &w) != MOE_STATUS_OK) goto done;
  for (int i = 0; i < np; i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    const float *src[3] = {p.data, opt ? moe_optim_m(opt, i) : NULL,
                           opt ? moe_optim_v(opt, i) : NULL};
    for (int k = 0; k < per; k++) {
      if (moe_ckpt_writer_write(w, i * per + k, src[k], p.numel * sizeof(float)) != MOE_STATUS_OK)
        goto done;
    }
  }
  if (moe_ckpt_writer_write(w, np * per, bias, (size_t)cfg.moe.num_experts * sizeof(float)) !=
      MOE_STATUS_OK)
    goto done;
  const moe_status st = moe_ckpt_writer_commit(w);
  w = NULL;
  if (st != MOE_STATUS_OK) goto done;
  snprintf(out, sizeof out, "%s/gpt_ckpt/%s", dir, with_optim ? "model-adam.bin" : "model.bin");
  rc = wrap(tmp, out);
done:
  if (rc) fail(ctx, "gpt checkpoint");
  moe_ckpt_writer_abort(w);
  moe_free(config);
  free(d);
  moe_optim_destroy(opt);
  moe_gpt_destroy(m);
  return rc;
}

// balance_state/: balancer states (fuzz/fuzz_balance_state.c) after a few
// steps of skewed loads, with the config byte that matches each.
static int balance_state(moe_ctx *ctx, const char *dir) {
  static const uint8_t configs[3] = {
      2 | 3 << 2 | 2 << 4,  // eplb, window 4, 2 slots
      1 | 0 << 2 | 6 << 4,  // prophet, window 1, 6 slots
      0 | 1 << 2 | 0 << 4,  // shadow, window 2, no slots
  };
  int rc = 0;
  for (int k = 0; k < 3 && !rc; k++) {
    const uint8_t cb = configs[k];
    moe_balance_config c;
    moe_balance_config_default(&c, MOE_BALANCE_SHADOW + (cb & 3), 16, 32, ((cb >> 4) & 7) % 7);
    c.window = 1 + ((cb >> 2) & 3);
    c.cost.flops_per_s = 1e6;  // copies pay: the plans place some
    moe_balancer *b = NULL;
    if (moe_balancer_create(ctx, &c, 8, 4, &b) != MOE_STATUS_OK) return fail(ctx, "balancer");
    int64_t counts[32];
    uint8_t rep[32];
    for (int step = 0; step < 3 + k && !rc; step++) {
      for (int i = 0; i < 32; i++) counts[i] = 1 + (i * 7 + step * 3) % 11 + (i % 8 == 0 ? 40 : 0);
      if (moe_balancer_step(b, counts, rep, NULL) != MOE_STATUS_OK) rc = fail(ctx, "balancer step");
    }
    const size_t n = moe_balancer_state_bytes(b);
    uint8_t *buf = malloc(n + 1);
    char out[640];
    snprintf(out, sizeof out, "%s/balance_state/state-%d.bin", dir, k);
    FILE *f = buf && !rc ? fopen(out, "wb") : NULL;
    if (f) {
      buf[0] = cb;
      moe_balancer_state_save(b, buf + 1);
      if (fwrite(buf, 1, n + 1, f) != n + 1) rc = 1;
      if (fclose(f) != 0) rc = 1;
    } else {
      rc = 1;
    }
    if (rc) fprintf(stderr, "fuzz_seeds: cannot write %s\n", out);
    free(buf);
    moe_balancer_destroy(b);
  }
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(
        stderr,
        "usage: fuzz_seeds DIR (writes DIR/checkpoint/, DIR/gpt_ckpt/ and DIR/balance_state/)\n");
    return 2;
  }
  char sub[512];
  snprintf(sub, sizeof sub, "%s/checkpoint", argv[1]);
  mkdir(sub, 0755);
  snprintf(sub, sizeof sub, "%s/gpt_ckpt", argv[1]);
  mkdir(sub, 0755);
  snprintf(sub, sizeof sub, "%s/balance_state", argv[1]);
  mkdir(sub, 0755);
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) return 1;
  const int rc = plain(ctx, argv[1]) || gpt(ctx, argv[1], 0) || gpt(ctx, argv[1], 1) ||
                 balance_state(ctx, argv[1]);
  moe_ctx_destroy(ctx);
  return rc;
}
