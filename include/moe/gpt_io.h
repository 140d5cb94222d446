// MoE-GPT checkpoints: what a training checkpoint holds and how a model (and
// its optimizer state) is loaded from one, in one process or as one rank's
// slice. Writing needs the whole model, so it lives with the trainer
// (include/moe/train.h); the file format is include/moe/checkpoint.h's.
//
// Contents (docs/training.md#checkpoints, docs/checkpoint.md#moe-gpt-contents):
// the config JSON
//   {"format": "libmoe-gpt", "version": 2, "model": {moe_gpt_config},
//    "step": N, "seed": S, "batch": B, "optim": true|false,
//    "schedule": {"lr": X, "min_lr": X, "warmup": W, "total": T}}
// ("schedule", the learning-rate schedule of moe_optim_lr, is new in version
// 2; version 1 files, without it, still load)
// and one tensor per model parameter under its moe_gpt_param name, WHOLE
// (every expert, in expert order), plus "adam.m.<name>" and "adam.v.<name>"
// when the optimizer state is saved. A rank that holds experts
// [first, first + count) reads only that slice, so a checkpoint loads at any
// world size and expert-parallel layout.
#ifndef MOE_GPT_IO_H
#define MOE_GPT_IO_H

#include "moe/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_GPT_CKPT_FORMAT "libmoe-gpt"
#define MOE_GPT_CKPT_VERSION 3      // written; versions 1..3 are read
#define MOE_GPT_CKPT_VERSION_MIN 1  // the oldest content version read

// The learning-rate schedule of moe_optim_lr (its lr, min_lr, warmup_steps
// and total_steps: everything the learning rate of a step depends on).
typedef struct {
  float lr, min_lr;
  int warmup_steps, total_steps;
} moe_gpt_ckpt_schedule;

typedef struct {
  moe_gpt_config model;
  int version;                     // content version of the file (1 to 3)
  int step;                        // optimizer steps taken when saved
  uint64_t seed;                   // training seed
  int batch;                       // global batch B
  int has_optim;                   // 1 when adam.m.* / adam.v.* are present
  int has_schedule;                // 1 when the file stores its schedule (version >= 2)
  moe_gpt_ckpt_schedule schedule;  // the stored schedule (zeros when has_schedule is 0)
} moe_gpt_ckpt_info;

// Reads a model config JSON file (moe_gpt_config_from_json) over the fields of cfg.
moe_status moe_gpt_config_load_file(moe_ctx *ctx, const char *path, moe_gpt_config *cfg);

// Opens and fully validates path (checksums), reads its config. BAD_FORMAT
// when the file is a valid checkpoint of something else or its config is not
// a MoE-GPT config.
moe_status moe_gpt_ckpt_read_info(moe_ctx *ctx, const char *path, moe_gpt_ckpt_info *info);

// The checkpoint tensor of MoE block b's router bias (f32, dims (E)): written
// from content version 3 on, one per MoE block (zeros when nothing set it).
#define MOE_GPT_ROUTER_BIAS_NAME "h%d.moe.router_bias"

// Loads every parameter tensor of model (this rank's slice of expert tensors and,
// with tensor parallelism, of the tensors split over MP: moe_gpt_param.tp_*)
// and every MoE block's router bias (a version 1 or 2 file has none: zeros)
// from path, and, when opt is not NULL, the AdamW moments and step count.
// The checkpoint's model config must equal the model's (BAD_FORMAT naming the
// first differing field otherwise); every tensor must be present with the
// model's whole shape. On error some tensors may already have been
// overwritten: treat the model (and opt) as unusable.
moe_status moe_gpt_ckpt_load(moe_ctx *ctx, const char *path, moe_gpt *model, moe_optim *opt);

// The config JSON of a checkpoint (caller frees with moe_free), at the current
// version; the schedule is opt's (moe_optim_get_config), or none without opt.
moe_status moe_gpt_ckpt_config_json(moe_ctx *ctx, const moe_gpt *model, const moe_optim *opt,
                                    int step, uint64_t seed, int batch, char **out);

#ifdef __cplusplus
}
#endif
#endif  // MOE_GPT_IO_H
