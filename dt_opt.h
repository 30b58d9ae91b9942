/* dt_opt.h - optimizers, learning-rate schedules, mixed precision with loss scaling, gradient
   accumulation, global gradient clipping and crash-safe training-state checkpoints for dt.
                                                                        v0.1, MIT licence

   The lesson. What happens between the backward and the next forward:
       micro-step i of k:  dt_opt_micro_begin -> seed the backward with scale / k; grads += ...
       dt_opt_step:        grads *= 1/scale --> inf or NaN on any rank? --yes--> skip the update,
                                  |             (one all-reduce of a flag)        scale *= 1/2
                                  | no
                           global norm over the ranks -> clip -> update -> step++ (and after
                           2000 clean steps in a row, scale *= 2)
   Mixed precision: a bf16 / f16 parameter is only a rounded copy; the optimizer keeps the f32
   master, so small updates are not lost to rounding:
        f32 grad * 1/scale --> Adam (m, v: f32) --> f32 master --round--> bf16 / f16 value
   Checkpoints are written, then renamed, so a crash anywhere leaves `latest` naming a complete
   checkpoint:
        step_N.tmp/rank_*.safetensors (fsync) -> manifest.json (fsync) -> rename to step_N/
        -> latest.tmp (fsync) -> rename over latest
   A load reads only the slices this rank needs, from whichever files hold them, so any world
   size or layout resumes any checkpoint (resharding).

   Contents. Each marker finds this line, its section in the declarations and the same section
   in the implementation (which starts at >>implementation):
       >>update   update math on float arrays: SGD, Adam, AdamW, Adagrad
       >>lr       learning-rate schedules (a pure function of the step)
       >>scale    loss scaling (torch.cuda.amp.GradScaler's rules)
       >>clip     the global gradient norm across ranks, and clipping
       >>opt      the optimizer: create, micro-steps, step
       >>ckpt     checkpoints: train state, save, load, XXH64
       >>memory   the ctx allocator's high-water mark
   After the options and an example, this comment holds the reference: the formulas, the
   schedules, mixed precision, clipping across ranks, checkpoints (files, crash safety, loads).

   API in one breath, in the order a training program calls it:
       dt_opt_create           state for every parameter (and f32 masters of bf16 / f16 values)
       dt_checkpoint_load      resume, with the dt_train_state (DT_ERR_IO when there is none yet)
       each step               dt_params_zero_grad; per micro-step dt_opt_micro_begin (the seed;
                               the bucketer syncs on the last one), forward, backward;
                               dt_opt_step (unscale, agree on inf/nan, clip, update); dt_opt_lr
                               (CUDA with loss scaling: dt_opt_sync reads the device's step first)
       dt_checkpoint_save      every N steps; dt_train_state_set / _get for your own keys
       dt_opt_free
     building blocks: dt_sgd_update / dt_adam_update / dt_adagrad_update (float arrays; the CUDA
     kernel of an optimizer takes the same name and arguments plus the stream), dt_lr_at,
     dt_lr_schedule_check, dt_loss_scaler_init / _unscale / _update, dt_grad_norm /
     dt_clip_grad_norm, dt_xxh64, dt_peak_bytes / dt_reset_peak_bytes

   Do this:
       #define DT_OPT_IMPLEMENTATION         (or DT_IMPLEMENTATION for every dt header)
   before you include this file in *one* C or C++ file to create the implementation.
   Include order: dt_tensor.h, dt_comm.h, dt_opt.h.

   Compile-time options. The first group changes declarations, so define it the same way in
   EVERY file that includes dt (or in the compiler flags); the second only matters in the file
   with the implementation (define it before the include there):
     in every file:
       DT_STATIC       every function is `static` (two libraries can each vendor their own copy).
       DT_API          the decoration of every external symbol (default: extern, or static under
                       DT_STATIC). Both are dt_tensor.h's: dt_opt.h uses the DT_API it defines.
     in the implementation file only:
       DT_MPI          in the file with dt_comm.h's implementation: multi-rank checkpoints,
                       clipping and overflow agreement; without it every comm is a world of one
                       and everything still runs
       DT_CUDA         dt_opt_step on CUDA parameters through kernels/dt_opt.cu: everything the
                       CPU path does, on the device without a wait (link the kernels' objects,
                       as for dt_tensor.h; see dt_opt_step for what reads back)
       DT_OPT_NO_SIMD  plain C loops instead of SSE2 in the Adam / Adagrad updates and the
                       gradient pass (same results, bit for bit: the lanes do the scalar ops)
       DT_OPT_NO_THREADS  dt_checkpoint_save computes its checksum in the calling thread
                       instead of a helper thread (see Threads)
       DT_OPT_NO_MMAP  dt_checkpoint_load reads each rank file into memory instead of mapping
                       it (what it also does when mmap fails, as on some FUSE file systems):
                       one more copy of the state while loading, and an I/O error while the
                       bytes are copied is a status rather than SIGBUS (see checkpoints)

   A training run (statuses unchecked for brevity):

       dt_comm *world;
       dt_bucketer *bucketer;
       dt_optimizer *opt;
       dt_opt_step_info info;
       dt_train_state ts = {0};
       dt_checkpoint_desc cd = {0};
       dt_opt_desc od = {0};
       dt_comm_create_world(&ctx, &world, NULL);
       dt_bucketer_create(world, &bucketer, &params, NULL);
       od.kind = DT_OPT_ADAMW; od.lr = 3e-4; od.clip_norm = 1.0; od.accum_steps = 4;
       od.schedule.kind = DT_LR_COSINE; od.schedule.warmup_steps = 100; od.schedule.total_steps = 5000;
       od.comm = world;                            // ranks that step together; NULL alone
       dt_opt_create(&ctx, &opt, &params, &od);
       cd.dir = "ckpt"; cd.comm = world;
       dt_checkpoint_load(&ctx, &params, opt, &ts, &cd); // resume; a first run has none (DT_ERR_IO)
       for (step = ts.step; step < 5000; step++) {
           dt_params_zero_grad(&ctx, &params);
           for (micro = 0; micro < 4; micro++) {
               float dloss;
               dt_opt_micro_begin(opt, &dloss, bucketer, micro); // sync on the last micro-step only
               forward(...); backward(..., dloss);             // seed = loss scale / micro-steps;
           }                                                   // backward marks params ready
           dt_bucketer_finish(bucketer);           // data-parallel average (with dt_comm)
           dt_opt_step(opt, &info);                // unscale, agree on inf/nan, clip, update
           ts.step = step + 1;
           if (ts.step % 1000 == 0) dt_checkpoint_save(&ctx, &params, opt, &ts, &cd);
       }

   ---------------------------------------------------------------- the formulas (PyTorch's docs)

   g is the gradient (after unscaling and clipping), w the parameter, t = 1, 2, ... the update
   number (opt->step + 1), lr the scheduled learning rate of the parameter's group, wd its weight
   decay (0 for parameters with no_decay). Defaults are PyTorch's (torch.optim, 2.x).

   SGD (lr 1e-3, momentum 0, dampening 0, weight_decay 0, nesterov off):
       g = g + wd * w
       if momentum != 0:  b = (t == 1) ? g : momentum * b + (1 - dampening) * g      [momentum_buffer]
                          g = nesterov ? g + momentum * b : b
       w = w - lr * g
   Adam (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0; L2 decay added to the gradient):
       g = g + wd * w
       m = beta1 * m + (1 - beta1) * g                                                 [exp_avg]
       v = beta2 * v + (1 - beta2) * g * g                                             [exp_avg_sq]
       w = w - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
   AdamW (as Adam, but weight_decay 1e-2 and decoupled: applied to w, not to g):
       w = w * (1 - lr * wd), then m, v and the update of Adam with g undecayed
   Adagrad (lr 1e-2, lr_decay 0, weight_decay 0, initial_accumulator_value 0, eps 1e-10):
       clr = lr / (1 + (t - 1) * lr_decay)
       g = g + wd * w
       s = s + g * g                                                                   [sum]
       w = w - clr * g / (sqrt(s) + eps)
   In float, Adam's last line runs as PyTorch's does: w - (lr / bc1) * (m / (sqrt(v) / sqrt(bc2) + eps)),
   bc1 = 1 - beta1^t, bc2 = 1 - beta2^t; Adagrad's as w - clr * (g / (sqrt(s) + eps)).
   Per-step scalars (bias corrections, clr, 1 - lr*wd) are computed in double and rounded to
   float once, as PyTorch computes them on the host; the element math is float. The results
   equal PyTorch's to float rounding (not bit for bit: its kernels order some products
   differently, e.g. lerp for m).

   Zero means default in every desc. Where PyTorch's default is not zero (lr, betas, eps,
   AdamW's weight_decay) write DT_OPT_ZERO for a real zero: `od.beta1 = DT_OPT_ZERO`.
   `od.lr = DT_OPT_ZERO` is lr 0 (as torch.optim accepts it): the weights stay, the state
   (momentum, exp_avg, ...) and the step still advance; schedule.lr DT_OPT_ZERO is a 0 peak.
   Hyperparameters are >= 0 and at most FLT_MAX (the update math rounds them to float); int
   flags (nesterov, a parameter's no_decay) are 0 or 1; anything else is a named DT_ERR_ARG.

   ---------------------------------------------------------------- schedules

   dt_lr_at(schedule, step) is the lr of update number `step` (0-based, = opt->step):
       warmup (every kind):  lr * (step + 1) / warmup_steps for step < warmup_steps (llm.c's form:
                             the first update does not get lr 0)
       CONSTANT:             lr
       COSINE:               min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * r)),
       LINEAR:               min_lr + (lr - min_lr) * (1 - r),
                             r = (step - warmup) / (total_steps - warmup), min_lr once r >= 1
       WSD:                  lr until total_steps - decay_steps, then linear to min_lr at
                             total_steps (warmup-stable-decay; decay_steps 0 = 10% of total)
   Steps skipped by the loss scaler do not advance opt->step, so they do not move the schedule
   (as Megatron). A parameter of group k gets lr * groups[k].lr_scale.

   ---------------------------------------------------------------- mixed precision

   Parameters whose value is bf16 or f16 get an f32 master copy inside the optimizer: the update
   is applied to the master, and the value is re-cast from it (round to nearest even) after every
   step. Gradients are always f32 (dt_param.grad). Loss scaling (torch.cuda.amp.GradScaler):
   scale starts at 2^16; the backward is seeded with scale / accum_steps (dt_opt_micro_begin);
   dt_opt_step multiplies the grads by 1/scale, and if any grad on any rank is inf or NaN (one
   all-reduce of a flag over desc.comm) the update is skipped and scale *= 0.5; after 2000
   consecutive clean steps scale *= 2, unless the product is not a finite float (the scale stops
   at 2^127, as GradScaler's float32 scale does: the seed (float)scale must not be inf); a
   back-off never goes below FLT_MIN (2^-126), so that 1/scale stays a float too. Mode DEFAULT
   turns dynamic scaling on when a parameter is f16 and off otherwise (f32 and bf16 need none).
   STATIC keeps a fixed scale but still skips steps with inf/NaN (Megatron's constant scaler).
   Gradients are unscaled before clipping. With scaling, desc.comm must hold every rank that
   steps together whenever the norm is summed over other ranks (dt_opt_create checks that it
   is not NULL then): a step skipped on one rank only would stall the others in the norm.

   Stochastic rounding (desc.stochastic_rounding = 1, off by default; llm.c rounds so): a bf16
   value is rounded from its master up or down, up with probability (master - down) / (up -
   down), so its expectation is the master and updates below a bf16 step are not lost on
   average. The random bits are a pure function of (desc.rounding_seed, the update number t, the
   parameter's name, the element's index in the whole tensor): 16 bits of splitmix64 added to
   the f32's low half, which is then cut off (a NaN master rounds to nearest). So a sharded
   parameter (ZeRO, tensor parallel, experts) rounds each element as the whole one does on one
   process, a data-parallel replica as every other, CUDA as the CPU, and a resumed run as one
   that never stopped. f16 values round to nearest even either way.

   ---------------------------------------------------------------- clipping across ranks

   The global norm counts every parameter once:  norm^2 = sum over non-sharded params of
   |g|^2 (computed locally: each rank holds the whole tensor, so nothing is summed across ranks)
   + all-reduce-sum over shard_comm of sum over sharded params (p->sharded) of |g|^2; then, when
   stage_comm is given, the total is summed over it (pipeline stages hold disjoint parameters).
   param_comms, when given, names the comm of each sharded parameter (one entry per ps item,
   NULL = shard_comm): for layouts where different tensors are split over different groups
   (ZeRO over dp plus tensor parallel over tp). Every rank of a comm must see that comm in the
   same order (true when the ranks of a group hold the same parameter names). Clipping scales
   every grad by max_norm / (norm + 1e-6) when that is below 1 (torch.nn.utils.clip_grad_norm_).
   dt_opt_step computes the norm on every step when one of these comms has more than one rank
   (so whether its all-reduces run never depends on a rank's info argument), otherwise when
   clip_norm > 0 or info asks for it.

   ---------------------------------------------------------------- checkpoints

   dt_checkpoint_save writes   dir/step_00000100/rank_00000.safetensors   one per rank
                               dir/step_00000100/manifest.json
                               dir/latest                                 "step_00000100\n"
   Each logical tensor is written once: where several ranks hold the same slice (data-parallel
   replicas) the lowest rank writes it. The rank files are plain safetensors (the format
   Python's safetensors package reads; tests/opt/ckpt_verify.py checks and reassembles a whole
   checkpoint with numpy alone) with entries "param/<name>", "master/<name>" (f32 master of a bf16
   or f16 parameter) and "state/<name>/<slot>" (slot: momentum_buffer, exp_avg, exp_avg_sq,
   sum, PyTorch's names). manifest.json holds the format ("dt-checkpoint", version 1), the
   world size, the layout string, the step, the optimizer's step and loss scaler, the train
   state (RNG seed/offset, data cursor, user key/values), each rank file's size and XXH64
   (seed 0; Python: xxhash.xxh64(open(f, "rb").read()).hexdigest()), and for every logical
   tensor its dtype, global shape and each shard's file, start and shape.
   Crash safety: the files are written into step_00000100.tmp/ and fsync'd; rank 0 writes the
   manifest, fsyncs the directory, renames it to step_00000100/, fsyncs dir/, then writes
   latest.tmp, fsyncs and renames it over `latest`. A process killed anywhere in between leaves
   `latest` naming the previous, complete checkpoint (saving the step `latest` names once more
   first points `latest` at the newest other step while the directory is replaced). A save that
   fails (a full disk or an I/O error on any rank, a failed collective) returns the error on
   every rank and removes what it made: each rank its rank file, rank 0 step_00000100.tmp/ and
   latest.tmp; `latest` and the previous checkpoints are as they were (after the rename, a
   failure to update `latest` leaves the complete step_00000100/ beside them). The newest
   `keep` step directories stay; step_*.tmp/ left by killed saves are removed by the next
   save. dir must be on a file system every rank sees (rank 0 renames the directory the ranks
   wrote into).
   dt_checkpoint_load reads latest (or desc.step_dir), validates everything, finds every slice
   this rank needs in whichever rank files hold it (so any world size or layout can load any
   checkpoint: resharding), maps each such file read-only (mmap) and checks it against the
   manifest's size and XXH64, and only when everything checks out on every rank does it copy
   the slices from the mappings into params and optimizer state (one copy, converting dtype
   where the checkpoint's differs). Truncated, corrupt, foreign or mismatched checkpoints are
   DT_ERR_FORMAT / DT_ERR_IO / DT_ERR_SHAPE with the file, tensor and values named, and nothing
   is changed. Memory while loading: no second copy of the state (the mappings are the page
   cache's); a host staging buffer only for CUDA tensors. Every file that holds a needed slice
   is read whole (its checksum covers the whole file). Mapped files are read twice, to verify
   and to copy: if the file is truncated by someone else in between, or the disk fails to
   re-read a page the kernel dropped, the process gets SIGBUS instead of a status
   (DT_OPT_NO_MMAP reads the files into memory instead). On CUDA tensors the last step, the
   host-to-device copies, can still fail (a broken CUDA context): the load then returns that
   error on every rank, naming the tensor, and the tensors before it hold the new values.

   Memory: everything comes from the ctx allocator. The trainer's memory measurement (e.g.
   activation recompute on/off) reads the allocator's high-water mark: dt_peak_bytes(ctx)
   (= ctx->bytes_peak), and dt_reset_peak_bytes(ctx) starts a new measurement.

   Errors: every function that can fail returns dt_status with a message in dt_ctx_error(ctx)
   naming the argument, the value and what was expected:
       dt_opt_create: desc.beta1 = 1.5; expected 0 <= beta1 < 1
   Collective functions (dt_opt_step with a comm, dt_grad_norm, dt_checkpoint_*) return the same
   status on every rank of their comm.

   Threads: an optimizer belongs to one thread at a time, like its ctx. The update functions
   are pure on their arrays and may run on disjoint arrays from several threads.
   dt_checkpoint_save starts one helper thread (POSIX threads) that computes the XXH64 of the
   bytes beside the writes, and joins it before it returns; it touches no dt state and calls
   no MPI. glibc before 2.34 needs -pthread at link time; DT_OPT_NO_THREADS keeps everything in
   the calling thread. dt_checkpoint_load hashes in the calling thread (from the mapping, at
   memory speed, before anything is copied).

   The licence (MIT) is at the end of this file.
*/
#ifndef DT_OPT_H
#define DT_OPT_H

#if !defined(DT_TENSOR_H) || !defined(DT_COMM_H)
#error "dt_opt.h needs dt_tensor.h and dt_comm.h included before it"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ==== >>update: update math on float arrays: SGD, Adam(W), Adagrad ===============================

   One function per optimizer, one loop over n elements: exactly the formulas above. t is the
   1-based update number. These are what dt_opt_step calls per parameter, what ZeRO calls on its
   shard, and what kernels/dt_opt.cu mirrors (same name, same arguments, plus the stream). */

/* Hyperparameters are double (Python floats in PyTorch); the per-step scalars are computed
   from them in double and rounded to float once, before the loop.
   buf may be NULL when momentum == 0; first: 1 on the first update (b = g). Arguments outside
   the contract (n < 0, a NULL array that the update needs, t < 1) leave every array as it was:
   these return nothing to say so, and dt_opt_step never passes such. */
DT_API void dt_sgd_update(float *w, const float *g, float *buf, int64_t n, double lr, double momentum,
                          double dampening, double weight_decay, int nesterov, int first);
/* decoupled: 0 = Adam (L2 added to g), 1 = AdamW (w *= 1 - lr * weight_decay). */
DT_API void dt_adam_update(float *w, const float *g, float *m, float *v, int64_t n, double lr, double beta1,
                           double beta2, double eps, double weight_decay, int decoupled, int64_t t);
DT_API void dt_adagrad_update(float *w, const float *g, float *sum, int64_t n, double lr, double lr_decay,
                              double weight_decay, double eps, int64_t t);

/* ==== >>lr: learning-rate schedules =========================================================== */

typedef enum dt_lr_kind {
    DT_LR_DEFAULT = 0, /* = DT_LR_CONSTANT */
    DT_LR_CONSTANT,
    DT_LR_COSINE,      /* warmup, cosine decay to min_lr at total_steps */
    DT_LR_LINEAR,      /* warmup, linear decay to min_lr at total_steps */
    DT_LR_WSD,         /* warmup, stable, linear decay over the last decay_steps */
    DT_LR_KIND_COUNT
} dt_lr_kind;

typedef struct dt_lr_schedule {
    dt_lr_kind kind;
    double lr;             /* peak lr, >= 0; 0 = the optimizer's lr (inside dt_opt_desc) */
    double min_lr;         /* the floor the decay ends at (absolute) */
    int64_t warmup_steps;  /* linear warmup over the first warmup_steps updates; 0 = none */
    int64_t total_steps;   /* COSINE, LINEAR, WSD: the decay ends here */
    int64_t decay_steps;   /* WSD: length of the final decay; 0 = total_steps / 10 */
} dt_lr_schedule;

/* The learning rate of update `step` (0-based). Pure: no state, no allocation. An invalid
   schedule gives NaN; dt_lr_schedule_check says why. */
DT_API double dt_lr_at(const dt_lr_schedule *s, int64_t step);
DT_API dt_status dt_lr_schedule_check(dt_ctx *ctx, const dt_lr_schedule *s);

/* ==== >>scale: loss scaling (GradScaler) ====================================================== */

typedef enum dt_loss_scale_mode {
    DT_LOSS_SCALE_DEFAULT = 0, /* DYNAMIC when a parameter is f16, else NONE */
    DT_LOSS_SCALE_NONE,        /* scale 1, no inf/nan check (f32, bf16) */
    DT_LOSS_SCALE_DYNAMIC,     /* torch.cuda.amp.GradScaler */
    DT_LOSS_SCALE_STATIC,      /* fixed scale; steps with inf/nan are still skipped */
    DT_LOSS_SCALE_MODE_COUNT
} dt_loss_scale_mode;

typedef struct dt_loss_scale_desc {
    dt_loss_scale_mode mode;
    double init_scale;         /* 0 = 65536 (2^16); STATIC: the scale */
    double growth_factor;      /* 0 = 2 */
    double backoff_factor;     /* 0 = 0.5 */
    int growth_interval;       /* clean steps before growing; 0 = 2000 */
} dt_loss_scale_desc;

typedef struct dt_loss_scaler {
    dt_loss_scale_mode mode;   /* resolved: NONE, DYNAMIC or STATIC */
    double scale;              /* the loss (backward seed) is multiplied by this; 1 when NONE */
    double growth_factor, backoff_factor;
    int growth_interval;
    int growth_tracker;        /* clean steps since the last change (GradScaler's _growth_tracker) */
    int64_t skipped;           /* steps skipped for inf/nan so far */
} dt_loss_scaler;

/* mode DEFAULT resolves to NONE here (dt_opt_create looks at the parameter dtypes). */
DT_API dt_status dt_loss_scaler_init(dt_ctx *ctx, dt_loss_scaler *s, const dt_loss_scale_desc *desc);
/* grads *= 1 / scale (skipped when the scale is 1) and *found_inf = 1 when any grad of ps is
   inf or NaN on any rank of comm (one all-reduce; comm NULL = this process alone). */
DT_API dt_status dt_loss_scaler_unscale(dt_ctx *ctx, dt_loss_scaler *s, dt_params *ps, int *found_inf,
                                        dt_comm *comm);
/* GradScaler.update: found_inf -> scale *= backoff, tracker = 0 (and skipped++); else tracker++
   and after growth_interval clean steps scale *= growth (unless that overflows). */
DT_API void dt_loss_scaler_update(dt_loss_scaler *s, int found_inf);

/* ==== >>clip: global gradient norm and clipping across ranks ================================== */

typedef struct dt_grad_norm_desc {
    dt_comm *shard_comm;          /* the comm over which params with p->sharded are split; required
                                     when one is (tensor parallel group, embedding group, ...) */
    dt_comm *const *param_comms;  /* optional, ps->count entries: per-parameter comm of a sharded
                                     parameter (NULL entry = shard_comm) */
    dt_comm *stage_comm;          /* ranks holding disjoint parameter sets (pipeline stages); the
                                     per-rank totals are summed over it; NULL = none */
} dt_grad_norm_desc;              /* inside dt_opt_desc: the comms and the array must outlive the optimizer */

/* The global L2 norm of the grads of ps (see "clipping across ranks"); desc may be NULL when no
   parameter is sharded. Sums in double, in a fixed order. */
DT_API dt_status dt_grad_norm(dt_ctx *ctx, double *norm, const dt_params *ps, const dt_grad_norm_desc *desc);
/* Computes the norm (returned in *norm, may be NULL) and scales every grad by
   max_norm / (norm + 1e-6) when that is < 1. A non-finite norm leaves the grads as they are
   (torch.nn.utils.clip_grad_norm_ multiplies them by its 0 or NaN coefficient instead; with loss
   scaling dt_opt_step skips such a step before clipping). */
DT_API dt_status dt_clip_grad_norm(dt_ctx *ctx, dt_params *ps, double *norm, double max_norm,
                                   const dt_grad_norm_desc *desc);

/* ==== >>opt: the optimizer: create, micro-steps, step ========================================= */

typedef enum dt_opt_kind {
    DT_OPT_DEFAULT = 0, /* = DT_OPT_ADAMW */
    DT_OPT_SGD,
    DT_OPT_ADAM,
    DT_OPT_ADAMW,
    DT_OPT_ADAGRAD,
    DT_OPT_KIND_COUNT
} dt_opt_kind;

/* An explicit zero for the fields where 0 means a non-zero default (lr, beta1, beta2, eps,
   AdamW's weight_decay, a group's weight_decay). Any float computation sees it as 0. */
#define DT_OPT_ZERO 1e-300
#define DT_OPT_MAX_GROUPS 16
#define DT_OPT_CUDA_CLS 8   /* distinct comms of the norm, plus one, that the CUDA optimizer handles */

typedef struct dt_opt_group {
    double lr_scale;      /* lr of this group = scheduled lr * lr_scale; 0 = 1 */
    double weight_decay;  /* 0 = dt_opt_desc.weight_decay; DT_OPT_ZERO = none */
} dt_opt_group;

typedef struct dt_opt_desc {
    dt_opt_kind kind;
    double lr;            /* 0 = 1e-3 (SGD, Adam, AdamW) or 1e-2 (Adagrad) */
    double weight_decay;  /* 0 = 1e-2 for AdamW, 0 otherwise */
    double beta1, beta2;  /* Adam, AdamW: 0 = 0.9, 0.999 */
    double eps;           /* 0 = 1e-8 (Adam, AdamW), 1e-10 (Adagrad) */
    double momentum;      /* SGD */
    double dampening;     /* SGD */
    int nesterov;         /* SGD: needs momentum > 0 and dampening 0 */
    double lr_decay;      /* Adagrad */
    double initial_accumulator_value; /* Adagrad */
    dt_opt_group groups[DT_OPT_MAX_GROUPS]; /* indexed by dt_param.group */
    dt_lr_schedule schedule;                /* zero = constant lr */
    dt_loss_scale_desc loss_scale;
    double clip_norm;     /* > 0: clip the global grad norm to this before the update */
    int accum_steps;      /* micro-steps per update (dt_opt_micro_begin); 0 = 1 */
    dt_comm *comm;        /* every rank that steps together (the world): the inf/nan decision is
                             agreed over it; NULL = this process alone */
    dt_grad_norm_desc norm; /* comms of the global grad norm */
    int stochastic_rounding; /* 1: a bf16 value is rounded from its f32 master stochastically
                                (unbiased, llm.c's rounding); 0 (default): to nearest even. See
                                "mixed precision" above; f16 values always round to nearest even */
    uint64_t rounding_seed;  /* its seed (a run's seed): with the step, the parameter's name and the
                                element's index in the whole tensor it fixes every rounding */
} dt_opt_desc;

/* Per parameter: the f32 master (bf16 / f16 values only) and the optimizer state, f32, the
   shape of the value. state[0]: momentum_buffer (SGD with momentum) / exp_avg (Adam, AdamW) /
   sum (Adagrad); state[1]: exp_avg_sq (Adam, AdamW). Unused tensors have data == NULL. */
typedef struct dt_opt_slot {
    dt_param *param;
    dt_tensor master;
    dt_tensor state[2];
    /* stochastic rounding: where the value's elements sit in the whole tensor. Element
       i = (i0 * n1 + i1) * n2 + i2 is element sr_base + i0 * sr_g0 + i1 * sr_g1 + i2 of it (the
       shard's dims collapsed into at most three levels); sr_stream = dt_hash_name(name). */
    uint64_t sr_stream;
    int64_t sr_base, sr_n1, sr_n2, sr_g0, sr_g1;
} dt_opt_slot;

/* Read the fields, change them through the functions. */
typedef struct dt_optimizer {
    dt_ctx *ctx;
    dt_params *params;
    dt_opt_desc desc;       /* every default resolved */
    dt_loss_scaler scaler;
    int64_t step;           /* updates applied (skipped steps not counted); t = step + 1 */
    dt_opt_slot *slots;     /* one per params->items[i], same order */
    int n_slots;
    double *sumsq;          /* per-parameter sums of squares of one step, kept: no allocation per step */
    int norm_collective;    /* 1: desc.norm sums over other ranks, so every step computes the norm */
    /* CUDA parameters only (dt_opt.h's private fields): */
    dt_tensor cuda_tab;     /* the device state, norm sums and parameter table of dt_opt_step */
    void *cuda_segs;        /* the table's host copy (a bucketer may move grads: then re-sent) */
    int64_t cuda_numel;     /* elements of all parameters */
    dt_comm *cuda_cls_comm[DT_OPT_CUDA_CLS]; /* the norm's comms: [0] NULL (local), then each distinct one */
    int cuda_n_cls;
    int cuda_pending;       /* 1: a step with scaling ran on the device since step / scaler were read */
    int cuda_dirty;         /* 1: step / scaler changed on the host (a load): sent before the next step */
} dt_optimizer;

typedef struct dt_opt_step_info {
    int skipped;            /* 1: inf/nan in the grads; no update, scale backed off */
    double grad_norm;       /* global norm of the unscaled grads before clipping (inf if skipped) */
    double lr;              /* scheduled lr of this update (group scale 1) */
    double loss_scale;      /* the scale the grads of this step carried */
} dt_opt_step_info;

/* Creates the state for every parameter of ps (which must not change afterwards), on the
   parameters' device. CPU params; or, built with DT_CUDA, a set whose every parameter is a CUDA
   tensor (f32, bf16 or f16 value, f32 grad): the master weights and the state then live on the
   device, with a table of the parameters made here (the one device allocation and upload of
   the optimizer), and dt_opt_step runs kernels/dt_opt.cu (see dt_opt_step). */
DT_API dt_status dt_opt_create(dt_ctx *ctx, dt_optimizer **out, dt_params *ps, const dt_opt_desc *desc);
DT_API void dt_opt_free(dt_optimizer *opt);
/* Start of micro-step `micro` (0 .. accum_steps - 1) of gradient accumulation: switches the
   bucketer's sync on for the last micro-step only (b may be NULL) and returns the backward seed
   in *dloss: loss_scale / accum_steps. Grads are summed over the micro-steps (they accumulate),
   so the update sees the mean over the whole batch, as one big batch would. */
DT_API dt_status dt_opt_micro_begin(dt_optimizer *opt, float *dloss, dt_bucketer *b, int micro);
/* One update: unscale + inf/nan check (when scaling), global grad norm, clip, update every
   parameter with its group's lr and weight decay, re-cast bf16/f16 values, advance the step and
   the scaler. Collective over desc.comm (when scaling) and over the norm comms when one of them
   has more than one rank: then every step computes the norm (one more pass over the grads
   without scaling, and a one-number all-reduce per comm), whatever info is. info may be NULL,
   and may differ between ranks (a trainer that logs on rank 0 only): it changes no collective
   and no result; with info, a norm that no other rank takes part in is computed locally.
   On an error (a failed collective) the grads may already be unscaled: do not call it again
   on the same grads; end the run or redo the step from the forward.
   CUDA parameters: the same steps on the device, queued on the ctx's stream with no copy to the
   host, no allocation after the first step and no wait: the pass over the grads (unscale,
   inf/nan flag, sums of squares) is a two-stage reduction over all parameters in a fixed order
   (deterministic, but not the CPU's order: the norm differs from the CPU's by at most
   2 (n - 1) 2^-53 of norm^2, n the elements); the all-reduces of the flag and the norm run on
   device memory (dt_comm_allreduce: NCCL, or dt_comm's staging), the norm's parts over other
   ranks as floats (dt_comm has no f64 device tensors: the norm is then within a float rounding
   per rank of the CPU's, finer than the f32 clip factor it feeds); the skip, the clip factor, the
   loss scale and the step count are decided by a device thread and read by the one update
   launch from device memory (the update does the CPU's float ops in its order). The clip factor
   is applied as the update reads the grads, so the grads stay unclipped (unscaled, as on the
   CPU). What reads back and waits (one small copy, one synchronisation each):
     - info != NULL: skipped and grad_norm come from the device, so pass info on logging steps
       only (info NULL = nothing read back; the norm is still computed when clipping needs it);
     - with loss scaling (DYNAMIC or STATIC) the device decides skips, so opt->step and
       opt->scaler are stale after a step until read: dt_opt_micro_begin (its seed is the
       scale), dt_opt_sync, dt_checkpoint_save, and a dt_opt_step called with no
       dt_opt_micro_begin since, read them first. Without scaling no step is skipped and
       nothing is read. */
DT_API dt_status dt_opt_step(dt_optimizer *opt, dt_opt_step_info *info);
/* CUDA parameters with loss scaling: makes opt->step and opt->scaler (so dt_opt_lr) those of the
   device after the last dt_opt_step (one copy back and one wait when a step ran since they were
   last read). Nothing to do otherwise. */
DT_API dt_status dt_opt_sync(dt_optimizer *opt);
/* The scheduled lr of the next update (CUDA parameters with loss scaling: of opt->step as last
   read from the device; dt_opt_sync reads it). */
DT_API double dt_opt_lr(const dt_optimizer *opt);

/* ==== >>ckpt: checkpoints: train state, save, load, XXH64 ===================================== */

#define DT_CKPT_MAX_KV 32
#define DT_CKPT_KEY_MAX 64
#define DT_CKPT_VALUE_MAX 256

/* What the trainer owns and a resume must restore besides parameters and optimizer. */
typedef struct dt_train_state {
    int64_t step;           /* trainer iterations done; the step directory is named after it */
    uint64_t rng_seed;      /* counter-based RNG: seed and offset are its whole state */
    uint64_t rng_offset;
    int64_t data_cursor;    /* the data loader's position (next global sample / token) */
    int n_kv;               /* user key/values (dt_train_state_set / _get) */
    char keys[DT_CKPT_MAX_KV][DT_CKPT_KEY_MAX];
    char values[DT_CKPT_MAX_KV][DT_CKPT_VALUE_MAX];
} dt_train_state;

DT_API dt_status dt_train_state_set(dt_ctx *ctx, dt_train_state *s, const char *key, const char *value);
DT_API const char *dt_train_state_get(const dt_train_state *s, const char *key); /* NULL if absent */

/* Called at each durable point of a save: "tensor" (index k: after the k-th tensor of this
   rank's file is written), "rank_file" (index = rank: file written and fsync'd), and on rank 0
   "manifest" (manifest written, directory fsync'd, before the rename), "renamed" (step
   directory in place, before `latest`), "latest" (latest updated, before pruning). For
   progress logs, and for tests that kill the process there. */
typedef void (*dt_ckpt_hook_fn)(const char *point, int index, void *user);

typedef struct dt_checkpoint_desc {
    const char *dir;        /* root: holds step_NNNNNNNN/ and latest (created if missing) */
    dt_comm *comm;          /* every rank that saves / loads together; NULL = this process alone */
    const char *layout;     /* save: free text naming the parallel layout ("dp=2,tp=2"), stored */
    int keep;               /* save: step directories to keep, newest first; 0 = 3, < 0 = all */
    const char *step_dir;   /* load: a step directory name under dir ("step_00000100"); NULL = the
                               one `latest` names */
    dt_ckpt_hook_fn hook;
    void *hook_user;
} dt_checkpoint_desc;

/* Collective over desc->comm. opt may be NULL (parameters only); state may be NULL (step =
   opt->step, or 0). */
DT_API dt_status dt_checkpoint_save(dt_ctx *ctx, dt_params *ps, dt_optimizer *opt, const dt_train_state *state,
                                    const dt_checkpoint_desc *desc);
/* Collective over desc->comm. Loads into ps (each parameter's own slice, by name), opt (state,
   master weights, step, loss scaler; NULL = parameters only) and *state (NULL = not needed).
   A bf16 / f16 parameter saved with an f32 master gets master and value; an f32 parameter
   loaded from a checkpoint of bf16 master mode takes the master. */
DT_API dt_status dt_checkpoint_load(dt_ctx *ctx, dt_params *ps, dt_optimizer *opt, dt_train_state *state,
                                    const dt_checkpoint_desc *desc);
/* Private (dt_embed.h's load): dt_checkpoint_load with a check between validation and commit.
   check runs on every rank once every rank has validated the checkpoint, before anything
   changes; it may read the values a parameter of ps is about to get (dt__checkpoint_peek) and
   call collectives on desc->comm. A failure on any rank fails the load on every rank, nothing
   changed. */
struct dt__ck_load;
typedef dt_status (*dt__ck_check_fn)(dt_ctx *ctx, struct dt__ck_load *L, void *user);
DT_API dt_status dt__checkpoint_load_checked(dt_ctx *ctx, dt_params *ps, dt_optimizer *opt, dt_train_state *state,
                                             const dt_checkpoint_desc *desc, dt__ck_check_fn check, void *user);
/* Copies the checkpoint's values for p (one of the load's ps, by pointer) into dst: host memory
   of p->value's dtype and element count. */
DT_API dt_status dt__checkpoint_peek(dt_ctx *ctx, struct dt__ck_load *L, const dt_param *p, void *dst);
/* 1 when the checkpoint's manifest lists the tensor `name` ("param/<p>", ...), whether or not this
   load fills it; *dir (may be NULL) = the step directory, for messages. */
DT_API int dt__checkpoint_has(const struct dt__ck_load *L, const char *name, const char **dir);

/* XXH64 (seed 0) of n bytes: the checksum the manifest records for each file. Streaming form:
   dt_xxh64_init, _update (any split of the bytes), _final. */
typedef struct dt_xxh64_state {
    uint64_t total, v[4];
    unsigned char mem[32];
    unsigned mem_size;
} dt_xxh64_state;
DT_API void dt_xxh64_init(dt_xxh64_state *s);
DT_API void dt_xxh64_update(dt_xxh64_state *s, const void *data, size_t n);
DT_API uint64_t dt_xxh64_final(const dt_xxh64_state *s);
DT_API uint64_t dt_xxh64(const void *data, size_t n);

/* ==== >>memory: the allocator's high-water mark =============================================== */

/* High-water mark of the ctx allocator (host + device bytes of the ctx's tensors). */
DT_API size_t dt_peak_bytes(const dt_ctx *ctx);
/* Starts a new measurement: the peak becomes the bytes in use now. */
DT_API void dt_reset_peak_bytes(dt_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif /* DT_OPT_H */

/* ============================================================================================
   Implementation                                                              >>implementation
   ============================================================================================ */
#if defined(DT_IMPLEMENTATION) && !defined(DT_OPT_IMPLEMENTATION)
#define DT_OPT_IMPLEMENTATION
#endif
#ifdef DT_OPT_IMPLEMENTATION
#ifndef DT_OPT_IMPLEMENTATION_DONE
#define DT_OPT_IMPLEMENTATION_DONE

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef DT_CUDA
#include <cuda_runtime.h>
#include "kernels/dt_kernels.h" /* dt_opt_step on CUDA parameters: kernels/dt_opt.cu */
#endif
#if defined(__unix__) || defined(__APPLE__)
/* POSIX file and directory calls for the checkpoints: raw fds (write/read/fsync without stdio
   buffering), mkdir, opendir. These headers declare them even under strict -std=c99. */
#define DT__OPT_POSIX 1
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#ifndef DT_OPT_NO_THREADS
/* one helper thread hashes checkpoint bytes while the caller's thread writes them */
#define DT__OPT_THREADS 1
#include <pthread.h>
#endif
#endif
#if defined(__SSE2__) && !defined(DT_OPT_NO_SIMD)
/* the Adam and Adagrad loops: sqrt and divide 4 lanes at a time (x86-64 always has SSE2) */
#define DT__OPT_SSE2 1
#include <emmintrin.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define DT__PI 3.14159265358979323846

static int dt__ofinite(double x) { return x == x && x != HUGE_VAL && x != -HUGE_VAL; }

/* n elements of `size` bytes from dt_alloc, zero-filled (calloc's contract). A wrapper because
   dt_alloc takes bytes while every array here is a count of something (parameters, ranks,
   slices) and most must start zeroed: the count x size product is checked in this one place
   (dt_mul_ok) instead of beside each call and each memset. NULL, with DT_ERR_OOM set, when the
   bytes do not fit in a ptrdiff_t (as dt_grow) or the allocator fails. */
static void *dt__ocalloc(dt_ctx *ctx, int64_t n, size_t size) {
    int64_t bytes;
    if (!dt_mul_ok(n, (int64_t)size, &bytes) || (uint64_t)bytes > (uint64_t)PTRDIFF_MAX) {
        dt_ctx_set_error(ctx, DT_ERR_OOM, "dt_alloc: %lld elements of %zu bytes do not fit in memory", (long long)n,
                         size);
        return NULL;
    }
    return dt_alloc_zeroed(ctx, (size_t)bytes);
}

/* ==== >>update: update math on float arrays =================================================== */

/* The per-step scalars are rounded to float with a plain (float) cast: C's IEEE 754 conversion
   (Annex F, which dt_tensor.h relies on too) rounds to nearest, gives +-inf beyond the float
   range and keeps NaN, so a huge double from a caller of the update functions is defined.
   (dt_opt_create keeps every hyperparameter within FLT_MAX.) */

DT_API void dt_sgd_update(float *w, const float *g, float *buf, int64_t n, double lr, double momentum,
                          double dampening, double weight_decay, int nesterov, int first) {
    const float lrf = (float)lr, mom = (float)momentum, damp = (float)(1.0 - dampening);
    const float wd = (float)weight_decay;
    int64_t i = 0;
    if (n <= 0 || !w || !g || (mom != 0.0f && !buf)) return; /* outside the contract: nothing written */
    if (wd == 0.0f && mom == 0.0f) { /* plain SGD (a sparse table's rows): w -= lr g, the lanes rounding as the loop */
#ifdef DT__OPT_SSE2
        const __m128 l = _mm_set1_ps(lrf);
        for (; i + 4 <= n; i += 4) _mm_storeu_ps(w + i, _mm_sub_ps(_mm_loadu_ps(w + i), _mm_mul_ps(l, _mm_loadu_ps(g + i))));
#endif
        for (; i < n; i++) w[i] -= lrf * g[i];
        return;
    }
    for (i = 0; i < n; i++) {
        float d = g[i];
        if (wd != 0.0f) d += wd * w[i];
        if (mom != 0.0f) {
            float b = first ? d : mom * buf[i] + damp * d;
            buf[i] = b;
            d = nesterov ? d + mom * b : b;
        }
        w[i] -= lrf * d;
    }
}

#ifdef DT__OPT_SSE2
typedef struct dt__adam_k { __m128 b1, omb1, b2, omb2, step, bc2, eps, l2, decay; int l2_on, decay_on; } dt__adam_k;

/* Four elements of dt_adam_update: the scalar loop's operations in the scalar loop's order,
   each IEEE-rounded, so the lanes give bitwise what the scalar code gives. */
static void dt__adam4(float *w, const float *g, float *m, float *v, const dt__adam_k *k) {
    __m128 wi = _mm_loadu_ps(w), gi = _mm_loadu_ps(g), mi, vi, denom;
    if (k->l2_on) gi = _mm_add_ps(gi, _mm_mul_ps(k->l2, wi));
    if (k->decay_on) wi = _mm_mul_ps(wi, k->decay);
    mi = _mm_add_ps(_mm_mul_ps(k->b1, _mm_loadu_ps(m)), _mm_mul_ps(k->omb1, gi));
    vi = _mm_add_ps(_mm_mul_ps(k->b2, _mm_loadu_ps(v)), _mm_mul_ps(k->omb2, _mm_mul_ps(gi, gi)));
    _mm_storeu_ps(m, mi);
    _mm_storeu_ps(v, vi);
    denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), k->bc2), k->eps);
    _mm_storeu_ps(w, _mm_sub_ps(wi, _mm_mul_ps(k->step, _mm_div_ps(mi, denom))));
}
#endif

DT_API void dt_adam_update(float *w, const float *g, float *m, float *v, int64_t n, double lr, double beta1,
                           double beta2, double eps, double weight_decay, int decoupled, int64_t t) {
    /* the per-step scalars in double, rounded once (PyTorch computes them in Python floats) */
    const double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);
    const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    const float b1 = (float)beta1, omb1 = (float)(1.0 - beta1), b2 = (float)beta2, omb2 = (float)(1.0 - beta2);
    const float epsf = (float)eps, l2 = decoupled ? 0.0f : (float)weight_decay;
    const float decay = (float)(1.0 - lr * weight_decay);
    const int decay_on = decoupled && weight_decay != 0.0;
    int64_t i = 0;
    if (n <= 0 || t < 1 || !w || !g || !m || !v) return; /* outside the contract (t 0: bias corrections 0) */
#ifdef DT__OPT_SSE2
    dt__adam_k k;
    k.b1 = _mm_set1_ps(b1); k.omb1 = _mm_set1_ps(omb1); k.b2 = _mm_set1_ps(b2); k.omb2 = _mm_set1_ps(omb2);
    k.step = _mm_set1_ps(step_size); k.bc2 = _mm_set1_ps(bc2_sqrt); k.eps = _mm_set1_ps(epsf);
    k.l2 = _mm_set1_ps(l2); k.decay = _mm_set1_ps(decay);
    k.l2_on = l2 != 0.0f;
    k.decay_on = decay_on;
    for (; i + 4 <= n; i += 4) dt__adam4(w + i, g + i, m + i, v + i, &k);
    if (i < n) { /* the tail through the same lanes, on a zero-padded copy */
        float tw[4] = {0}, tg[4] = {0}, tm[4] = {0}, tv[4] = {0};
        size_t r = (size_t)(n - i) * sizeof(float);
        memcpy(tw, w + i, r); memcpy(tg, g + i, r); memcpy(tm, m + i, r); memcpy(tv, v + i, r);
        dt__adam4(tw, tg, tm, tv, &k);
        memcpy(w + i, tw, r); memcpy(m + i, tm, r); memcpy(v + i, tv, r);
    }
#else
    for (; i < n; i++) {
        float wi = w[i], gi = g[i], mi, vi, denom;
        if (l2 != 0.0f) gi += l2 * wi;
        if (decay_on) wi *= decay;
        mi = b1 * m[i] + omb1 * gi;
        vi = b2 * v[i] + omb2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        denom = sqrtf(vi) / bc2_sqrt + epsf;
        w[i] = wi - step_size * (mi / denom);
    }
#endif
}

#ifdef DT__OPT_SSE2
static void dt__adagrad4(float *w, const float *g, float *sum, __m128 clr, __m128 wd, __m128 eps, int wd_on) {
    __m128 wi = _mm_loadu_ps(w), gi = _mm_loadu_ps(g), s;
    if (wd_on) gi = _mm_add_ps(gi, _mm_mul_ps(wd, wi));
    s = _mm_add_ps(_mm_loadu_ps(sum), _mm_mul_ps(gi, gi));
    _mm_storeu_ps(sum, s);
    _mm_storeu_ps(w, _mm_sub_ps(wi, _mm_mul_ps(clr, _mm_div_ps(gi, _mm_add_ps(_mm_sqrt_ps(s), eps)))));
}
#endif

DT_API void dt_adagrad_update(float *w, const float *g, float *sum, int64_t n, double lr, double lr_decay,
                              double weight_decay, double eps, int64_t t) {
    const float clr = (float)(lr / (1.0 + (double)(t - 1) * lr_decay));
    const float wd = (float)weight_decay, epsf = (float)eps;
    int64_t i = 0;
    if (n <= 0 || t < 1 || !w || !g || !sum) return; /* outside the contract */
#ifdef DT__OPT_SSE2
    const __m128 C = _mm_set1_ps(clr), WD = _mm_set1_ps(wd), E = _mm_set1_ps(epsf);
    for (; i + 4 <= n; i += 4) dt__adagrad4(w + i, g + i, sum + i, C, WD, E, wd != 0.0f);
    if (i < n) {
        float tw[4] = {0}, tg[4] = {0}, ts[4] = {0};
        size_t r = (size_t)(n - i) * sizeof(float);
        memcpy(tw, w + i, r); memcpy(tg, g + i, r); memcpy(ts, sum + i, r);
        dt__adagrad4(tw, tg, ts, C, WD, E, wd != 0.0f);
        memcpy(w + i, tw, r); memcpy(sum + i, ts, r);
    }
#else
    for (; i < n; i++) {
        float gi = g[i], s;
        if (wd != 0.0f) gi += wd * w[i];
        s = sum[i] + gi * gi;
        sum[i] = s;
        w[i] -= clr * (gi / (sqrtf(s) + epsf));
    }
#endif
}

/* ==== >>lr: learning-rate schedules =========================================================== */

/* NULL when s is valid, else what is wrong (for the error message). */
static const char *dt__lr_problem(const dt_lr_schedule *s, char *buf, size_t n) {
    int64_t decay;
    if ((int)s->kind < 0 || s->kind >= DT_LR_KIND_COUNT)
        snprintf(buf, n, "kind = %d is not a dt_lr_kind", (int)s->kind);
    else if (!(s->lr >= 0) || s->lr > FLT_MAX)
        snprintf(buf, n, "lr = %g; expected a value >= 0 that a float can hold (<= %g)", s->lr, (double)FLT_MAX);
    else if (!(s->min_lr >= 0) || s->min_lr > s->lr)
        snprintf(buf, n, "min_lr = %g; expected 0 <= min_lr <= lr (%g)", s->min_lr, s->lr);
    else if (s->warmup_steps < 0)
        snprintf(buf, n, "warmup_steps = %lld; expected >= 0", (long long)s->warmup_steps);
    else if (s->kind > DT_LR_CONSTANT && s->total_steps <= s->warmup_steps)
        snprintf(buf, n, "total_steps = %lld; expected > warmup_steps (%lld) for a decaying schedule",
                 (long long)s->total_steps, (long long)s->warmup_steps);
    else if (s->kind == DT_LR_WSD && s->decay_steps < 0)
        snprintf(buf, n, "decay_steps = %lld; expected >= 0", (long long)s->decay_steps);
    else if (s->kind == DT_LR_WSD &&
             (decay = s->decay_steps ? s->decay_steps : (s->total_steps / 10 > 0 ? s->total_steps / 10 : 1)) >
                 s->total_steps - s->warmup_steps)
        snprintf(buf, n, "decay_steps = %lld; expected <= total_steps - warmup_steps (%lld)", (long long)decay,
                 (long long)(s->total_steps - s->warmup_steps));
    else
        return NULL;
    return buf;
}

DT_API double dt_lr_at(const dt_lr_schedule *s, int64_t step) {
    char why[160];
    double lr, lo, r;
    int64_t warm, total, decay, start;
    if (!s || step < 0 || dt__lr_problem(s, why, sizeof why)) return NAN;
    lr = s->lr;
    lo = s->min_lr;
    warm = s->warmup_steps;
    total = s->total_steps;
    if (step < warm) return lr * (double)(step + 1) / (double)warm;
    switch (s->kind) {
    case DT_LR_COSINE:
    case DT_LR_LINEAR:
        r = (double)(step - warm) / (double)(total - warm);
        if (r >= 1.0) return lo;
        return s->kind == DT_LR_COSINE ? lo + (lr - lo) * 0.5 * (1.0 + cos(DT__PI * r)) : lo + (lr - lo) * (1.0 - r);
    case DT_LR_WSD:
        decay = s->decay_steps ? s->decay_steps : (total / 10 > 0 ? total / 10 : 1);
        start = total - decay;
        if (step < start) return lr;
        r = (double)(step - start) / (double)decay;
        return r >= 1.0 ? lo : lo + (lr - lo) * (1.0 - r);
    default:
        return lr;
    }
}

DT_API dt_status dt_lr_schedule_check(dt_ctx *ctx, const dt_lr_schedule *s) {
    char why[160];
    if (!ctx) return DT_ERR_ARG;
    if (!s) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_lr_schedule_check: s is NULL");
    if (dt__lr_problem(s, why, sizeof why))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_lr_schedule_check: schedule.%s", why);
    return DT_OK;
}

/* ==== >>scale: loss scaling =================================================================== */

/* A loss scale the float math can use: the backward seed (float)scale and the unscale
   multiplier (float)(1 / scale) are both finite: FLT_MIN (2^-126) <= scale <= FLT_MAX. */
static int dt__scale_ok(double scale) { return scale >= FLT_MIN && scale <= FLT_MAX; }

DT_API dt_status dt_loss_scaler_init(dt_ctx *ctx, dt_loss_scaler *s, const dt_loss_scale_desc *desc) {
    const char *fn = "dt_loss_scaler_init";
    dt_loss_scale_desc d;
    if (!ctx) return DT_ERR_ARG;
    if (!s) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: s is NULL", fn);
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if ((int)d.mode < 0 || d.mode >= DT_LOSS_SCALE_MODE_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.mode = %d is not a dt_loss_scale_mode", fn, (int)d.mode);
    if (d.init_scale != 0 && !dt__scale_ok(d.init_scale))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.init_scale = %g; expected %g <= init_scale <= %g (a float "
                                "whose reciprocal is a float too; 0 = 65536)", fn, d.init_scale, (double)FLT_MIN,
                                (double)FLT_MAX);
    if (d.growth_factor != 0 && (!(d.growth_factor > 1) || !dt__ofinite(d.growth_factor)))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.growth_factor = %g; expected > 1 (0 = 2)", fn,
                                d.growth_factor);
    if (d.backoff_factor != 0 && !(d.backoff_factor > 0 && d.backoff_factor < 1))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.backoff_factor = %g; expected 0 < backoff < 1 (0 = 0.5)",
                                fn, d.backoff_factor);
    if (d.growth_interval < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.growth_interval = %d; expected > 0 (0 = 2000)", fn,
                                d.growth_interval);
    memset(s, 0, sizeof *s);
    s->mode = d.mode == DT_LOSS_SCALE_DEFAULT ? DT_LOSS_SCALE_NONE : d.mode;
    s->scale = s->mode == DT_LOSS_SCALE_NONE ? 1.0 : d.init_scale > 0 ? d.init_scale : 65536.0;
    s->growth_factor = d.growth_factor > 0 ? d.growth_factor : 2.0;
    s->backoff_factor = d.backoff_factor > 0 ? d.backoff_factor : 0.5;
    s->growth_interval = d.growth_interval > 0 ? d.growth_interval : 2000;
    return DT_OK;
}

DT_API void dt_loss_scaler_update(dt_loss_scaler *s, int found_inf) {
    if (!s || s->mode == DT_LOSS_SCALE_NONE) return;
    if (found_inf && s->skipped < INT64_MAX) s->skipped++;
    if (s->mode != DT_LOSS_SCALE_DYNAMIC) return;
    if (found_inf) {
        /* no lower than FLT_MIN: the unscale multiplier 1 / scale must stay a finite float */
        double backed = s->scale * s->backoff_factor;
        if (backed >= FLT_MIN) s->scale = backed;
        s->growth_tracker = 0;
    } else if ((int64_t)s->growth_tracker + 1 >= s->growth_interval) { /* >=: a loaded tracker may be past it */
        /* torch._amp_update_scale_ grows the float32 scale only when the product is finite: in
           float, so a double scale past FLT_MAX would seed the backward with (float)scale = inf
           and waste a step every growth interval */
        double grown = s->scale * s->growth_factor;
        if (grown <= FLT_MAX) s->scale = grown;
        s->growth_tracker = 0;
    } else {
        s->growth_tracker++;
    }
}

/* One pass over a gradient: multiplies by mul when `scale` is set, ORs "saw inf or NaN" into
   *bad (by the exponent bits, so -ffast-math cannot fold it away) and returns the sum of
   squares in double. The sum has four lanes (element i goes to lane i % 4), combined as
   (l0 + l1) + (l2 + l3): independent chains run at memory speed, and the SSE2 path and the
   plain path add the same numbers in the same order. */
static double dt__grad_pass(float *g, int64_t n, float mul, int scale, int *bad) {
    double lane[4] = {0, 0, 0, 0};
    uint32_t nonfinite = 0, u;
    int64_t i = 0;
#ifdef DT__OPT_SSE2
    const __m128 M = _mm_set1_ps(mul);
    const __m128i EXP = _mm_set1_epi32(0x7f800000);
    __m128d s01 = _mm_setzero_pd(), s23 = _mm_setzero_pd();
    __m128i inf = _mm_setzero_si128();
    for (; i + 4 <= n; i += 4) {
        __m128 x = _mm_loadu_ps(g + i);
        __m128d lo, hi;
        if (scale) {
            x = _mm_mul_ps(x, M);
            _mm_storeu_ps(g + i, x);
        }
        inf = _mm_or_si128(inf, _mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(x), EXP), EXP));
        lo = _mm_cvtps_pd(x);
        hi = _mm_cvtps_pd(_mm_movehl_ps(x, x));
        s01 = _mm_add_pd(s01, _mm_mul_pd(lo, lo));
        s23 = _mm_add_pd(s23, _mm_mul_pd(hi, hi));
    }
    nonfinite = _mm_movemask_epi8(inf) != 0;
    _mm_storeu_pd(lane, s01);
    _mm_storeu_pd(lane + 2, s23);
#endif
    for (; i < n; i++) {
        float x = g[i];
        if (scale) {
            x *= mul;
            g[i] = x;
        }
        memcpy(&u, &x, 4);
        nonfinite |= (u & 0x7f800000u) == 0x7f800000u;
        lane[i & 3] += (double)x * (double)x;
    }
    if (nonfinite) *bad = 1;
    return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

static int dt__comm_size(dt_comm *c) { return c ? dt_comm_size(c) : 1; }

/* found_inf agreed by every rank of comm: one all-reduce (MAX) of the flag. */
static dt_status dt__agree_flag(dt_comm *comm, int *flag) {
    double v = *flag ? 1.0 : 0.0;
    if (dt__comm_size(comm) > 1) DT__TRY(dt_comm_allreduce_f64(comm, &v, 1, DT_REDUCE_MAX));
    *flag = v != 0.0;
    return DT_OK;
}

static dt_status dt__check_grads(dt_ctx *ctx, const dt_params *ps, const char *fn) {
    int i;
    if (!ps) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: ps is NULL", fn);
    for (i = 0; i < ps->count; i++) {
        const dt_param *p = ps->items[i];
        if (p->grad.dtype != DT_F32 || p->grad.device == DT_CUDA_DEVICE || !p->grad.data)
            return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: \"%s\" grad is %s on %s; expected an f32 CPU tensor", fn,
                                    p->name, dt_dtype_name(p->grad.dtype), dt_device_name(p->grad.device));
    }
    return DT_OK;
}

/* The one pass over the grads that dt_loss_scaler_unscale, dt_opt_step and dt_grad_norm share
   (dt__grad_pass on each grad). With a scaler s that scales (mode not NONE): grads *= 1 / scale
   (not when the scale is 1) and *found_inf = an inf or NaN in a grad on any rank of comm (one
   all-reduce). s NULL or NONE: the grads are only read, *found_inf = 0, no collective. sq[i]
   (sq may be NULL) = the sum of squares of grad i after the multiply. */
static dt_status dt__unscale(const dt_loss_scaler *s, const dt_params *ps, double *sq, int *found_inf,
                             dt_comm *comm) {
    const int scaling = s && s->mode != DT_LOSS_SCALE_NONE;
    /* GradScaler: inv_scale = scale.double().reciprocal().float() */
    const float mul = scaling ? (float)(1.0 / s->scale) : 1.0f;
    int i, bad = 0;
    *found_inf = 0;
    for (i = 0; i < ps->count; i++) {
        double q = dt__grad_pass((float *)ps->items[i]->grad.data, ps->items[i]->grad.numel, mul,
                                 scaling && s->scale != 1.0, &bad);
        if (sq) sq[i] = q;
    }
    if (!scaling) return DT_OK;
    DT__TRY(dt__agree_flag(comm, &bad));
    *found_inf = bad;
    return DT_OK;
}

DT_API dt_status dt_loss_scaler_unscale(dt_ctx *ctx, dt_loss_scaler *s, dt_params *ps, int *found_inf,
                                        dt_comm *comm) {
    const char *fn = "dt_loss_scaler_unscale";
    if (!ctx) return DT_ERR_ARG;
    if (!s || !found_inf) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, s ? "found_inf" : "s");
    DT__TRY(dt__check_grads(ctx, ps, fn));
    *found_inf = 0;
    if ((int)s->mode < 0 || s->mode >= DT_LOSS_SCALE_MODE_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: s->mode = %d is not a dt_loss_scale_mode", fn, (int)s->mode);
    if (s->mode == DT_LOSS_SCALE_NONE) return DT_OK;
    if (!dt__scale_ok(s->scale))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: s->scale = %g; expected %g <= scale <= %g (set by "
                                "dt_loss_scaler_init)", fn, s->scale, (double)FLT_MIN, (double)FLT_MAX);
    return dt__unscale(s, ps, NULL, found_inf, comm);
}

/* ==== >>clip: global gradient norm and clipping across ranks ================================== */

static dt_comm *dt__param_comm(const dt_grad_norm_desc *d, int i) {
    if (!d) return NULL;
    if (d->param_comms && d->param_comms[i]) return d->param_comms[i];
    return d->shard_comm;
}

static dt_status dt__norm_check(dt_ctx *ctx, const dt_params *ps, const dt_grad_norm_desc *d, const char *fn) {
    int i;
    for (i = 0; i < ps->count; i++) {
        const dt_param *p = ps->items[i];
        if (p->sharded && !dt__param_comm(d, i))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: \"%s\" is sharded (a slice of a larger tensor) but the norm's "
                                    "shard_comm is NULL; give the comm it is split over (tensor-parallel group, "
                                    "...) so its slices are summed once", fn, p->name);
    }
    return DT_OK;
}

/* 1 when dt__norm_combine all-reduces: a comm of d that it uses has more than one rank. The same
   on every rank of those comms (they hold the same parameter names), so dt_opt_step decides from
   it, never from a local choice such as passing info, whether the norm's collectives run. */
static int dt__norm_collective(const dt_params *ps, const dt_grad_norm_desc *d) {
    int i;
    if (!d) return 0;
    if (dt__comm_size(d->shard_comm) > 1 || dt__comm_size(d->stage_comm) > 1) return 1;
    for (i = 0; i < ps->count; i++)
        if (ps->items[i]->sharded && dt__comm_size(dt__param_comm(d, i)) > 1) return 1;
    return 0;
}

/* norm^2 = sum over non-sharded of sq[i] + for each shard comm (in order of first use, shard_comm
   first), all-reduce-sum of its sharded sq[i]; then summed over stage_comm. */
static dt_status dt__norm_combine(dt_ctx *ctx, const dt_params *ps, const dt_grad_norm_desc *d, const double *sq,
                                  double *norm, const char *fn) {
    double total = 0.0, part;
    dt_comm *c, *prev;
    int i, j, seen;
    DT__TRY(dt__norm_check(ctx, ps, d, fn));
    for (i = 0; i < ps->count; i++)
        if (!ps->items[i]->sharded) total += sq[i];
    /* each distinct comm once, in a fixed order every rank of it agrees on */
    for (i = -1; i < ps->count; i++) {
        if (i < 0) c = d ? d->shard_comm : NULL;
        else c = ps->items[i]->sharded ? dt__param_comm(d, i) : NULL;
        if (!c) continue;
        seen = i >= 0 && d && c == d->shard_comm;
        for (j = 0; j < i && !seen; j++) {
            prev = ps->items[j]->sharded ? dt__param_comm(d, j) : NULL;
            seen = prev == c;
        }
        if (seen) continue;
        part = 0.0;
        for (j = 0; j < ps->count; j++)
            if (ps->items[j]->sharded && dt__param_comm(d, j) == c) part += sq[j];
        if (dt_comm_size(c) > 1) DT__TRY(dt_comm_allreduce_f64(c, &part, 1, DT_REDUCE_SUM));
        total += part;
    }
    if (d && d->stage_comm && dt_comm_size(d->stage_comm) > 1)
        DT__TRY(dt_comm_allreduce_f64(d->stage_comm, &total, 1, DT_REDUCE_SUM));
    *norm = sqrt(total);
    return DT_OK;
}

static double *dt__sumsqs(dt_ctx *ctx, const dt_params *ps) {
    double *sq = (double *)dt__ocalloc(ctx, ps->count, sizeof(double));
    int bad;
    if (sq) dt__unscale(NULL, ps, sq, &bad, NULL); /* no scaler: reads only, no collective */
    return sq;
}

DT_API dt_status dt_grad_norm(dt_ctx *ctx, double *norm, const dt_params *ps, const dt_grad_norm_desc *desc) {
    const char *fn = "dt_grad_norm";
    double *sq;
    dt_status st;
    if (!ctx) return DT_ERR_ARG;
    if (!norm) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: norm is NULL", fn);
    DT__TRY(dt__check_grads(ctx, ps, fn));
    DT__TRY(dt__norm_check(ctx, ps, desc, fn));
    if (!(sq = dt__sumsqs(ctx, ps))) return DT_ERR_OOM;
    st = dt__norm_combine(ctx, ps, desc, sq, norm, fn);
    dt_release(ctx, sq);
    return st;
}

static void dt__scale_grads(dt_params *ps, float coef) {
    int i;
    int64_t k;
    for (i = 0; i < ps->count; i++) {
        float *g = (float *)ps->items[i]->grad.data;
        for (k = 0; k < ps->items[i]->grad.numel; k++) g[k] *= coef;
    }
}

/* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1. */
static void dt__clip(dt_params *ps, double max_norm, double norm) {
    double coef = max_norm / (norm + 1e-6);
    if (dt__ofinite(norm) && coef < 1.0) dt__scale_grads(ps, (float)coef);
}

DT_API dt_status dt_clip_grad_norm(dt_ctx *ctx, dt_params *ps, double *norm, double max_norm,
                                   const dt_grad_norm_desc *desc) {
    double n = 0.0;
    if (!ctx) return DT_ERR_ARG;
    if (!(max_norm > 0) || !dt__ofinite(max_norm))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_clip_grad_norm: max_norm = %g; expected a finite value > 0",
                                max_norm);
    DT__TRY(dt_grad_norm(ctx, &n, ps, desc));
    dt__clip(ps, max_norm, n);
    if (norm) *norm = n;
    return DT_OK;
}

/* ==== >>opt: the optimizer: create, micro-steps, step ========================================= */

static const char *dt__opt_kind_name(dt_opt_kind k) {
    switch (k) {
    case DT_OPT_SGD: return "sgd";
    case DT_OPT_ADAM: return "adam";
    case DT_OPT_ADAMW: return "adamw";
    case DT_OPT_ADAGRAD: return "adagrad";
    default: return "invalid";
    }
}

/* PyTorch's names of the per-parameter state, as state_dict()["state"][i] has them. */
static const char *dt__opt_state_name(dt_opt_kind k, int i) {
    switch (k) {
    case DT_OPT_SGD: return i == 0 ? "momentum_buffer" : NULL;
    case DT_OPT_ADAM: case DT_OPT_ADAMW: return i == 0 ? "exp_avg" : "exp_avg_sq";
    case DT_OPT_ADAGRAD: return i == 0 ? "sum" : NULL;
    default: return NULL;
    }
}

/* 0 = default, DT_OPT_ZERO = 0, anything else as given. */
static double dt__pick(double v, double dflt) { return v == DT_OPT_ZERO ? 0.0 : v == 0.0 ? dflt : v; }

/* A hyperparameter: >= 0 and small enough for the float the update math rounds it to. */
static dt_status dt__nonneg(dt_ctx *ctx, const char *fn, const char *field, double v) {
    if (v >= 0 && v <= FLT_MAX) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.%s = %g; expected a value >= 0 that a float can hold "
                            "(<= %g)", fn, field, v, (double)FLT_MAX);
}

/* An int flag: 0 or 1, anything else is a mistake worth naming (not a silent "on"). */
static dt_status dt__flag(dt_ctx *ctx, const char *fn, const char *field, int v) {
    if (v == 0 || v == 1) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s = %d; expected 0 or 1", fn, field, v);
}

static dt_status dt__opt_resolve(dt_ctx *ctx, dt_opt_desc *d, const char *fn) {
    char why[160], field[48];
    int k, adagrad, adamw;
    if ((int)d->kind < 0 || d->kind >= DT_OPT_KIND_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.kind = %d is not a dt_opt_kind", fn, (int)d->kind);
    if (d->kind == DT_OPT_DEFAULT) d->kind = DT_OPT_ADAMW;
    adagrad = d->kind == DT_OPT_ADAGRAD;
    adamw = d->kind == DT_OPT_ADAMW;
    DT__TRY(dt__nonneg(ctx, fn, "lr", d->lr));
    DT__TRY(dt__nonneg(ctx, fn, "weight_decay", d->weight_decay));
    DT__TRY(dt__nonneg(ctx, fn, "eps", d->eps));
    DT__TRY(dt__nonneg(ctx, fn, "momentum", d->momentum));
    DT__TRY(dt__nonneg(ctx, fn, "lr_decay", d->lr_decay));
    DT__TRY(dt__nonneg(ctx, fn, "initial_accumulator_value", d->initial_accumulator_value));
    DT__TRY(dt__nonneg(ctx, fn, "clip_norm", d->clip_norm));
    if (!(d->beta1 >= 0 && d->beta1 < 1))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.beta1 = %g; expected 0 <= beta1 < 1", fn, d->beta1);
    if (!(d->beta2 >= 0 && d->beta2 < 1))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.beta2 = %g; expected 0 <= beta2 < 1", fn, d->beta2);
    if (!(d->dampening >= 0 && d->dampening <= 1))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.dampening = %g; expected 0 <= dampening <= 1", fn,
                                d->dampening);
    if (d->accum_steps < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.accum_steps = %d; expected >= 1 (0 = 1)", fn,
                                d->accum_steps);
    DT__TRY(dt__flag(ctx, fn, "desc.nesterov", d->nesterov));
    DT__TRY(dt__flag(ctx, fn, "desc.stochastic_rounding", d->stochastic_rounding));
    d->lr = dt__pick(d->lr, adagrad ? 1e-2 : 1e-3);
    d->weight_decay = dt__pick(d->weight_decay, adamw ? 1e-2 : 0.0);
    d->beta1 = dt__pick(d->beta1, 0.9);
    d->beta2 = dt__pick(d->beta2, 0.999);
    d->eps = dt__pick(d->eps, adagrad ? 1e-10 : 1e-8);
    d->momentum = dt__pick(d->momentum, 0.0);
    d->dampening = dt__pick(d->dampening, 0.0);
    d->lr_decay = dt__pick(d->lr_decay, 0.0);
    d->initial_accumulator_value = dt__pick(d->initial_accumulator_value, 0.0);
    if (d->accum_steps == 0) d->accum_steps = 1;
    if (d->nesterov && (d->momentum <= 0 || d->dampening != 0))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.nesterov needs momentum > 0 and dampening 0 (momentum = %g, "
                                "dampening = %g)", fn, d->momentum, d->dampening);
    for (k = 0; k < DT_OPT_MAX_GROUPS; k++) {
        snprintf(field, sizeof field, "groups[%d].lr_scale", k);
        DT__TRY(dt__nonneg(ctx, fn, field, d->groups[k].lr_scale));
        snprintf(field, sizeof field, "groups[%d].weight_decay", k);
        DT__TRY(dt__nonneg(ctx, fn, field, d->groups[k].weight_decay));
        d->groups[k].lr_scale = dt__pick(d->groups[k].lr_scale, 1.0);
        d->groups[k].weight_decay = dt__pick(d->groups[k].weight_decay, d->weight_decay);
    }
    /* schedule.lr 0 = the optimizer's lr (which may be a real 0: DT_OPT_ZERO, a frozen run) */
    d->schedule.lr = dt__pick(d->schedule.lr, d->lr);
    if (dt__lr_problem(&d->schedule, why, sizeof why))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.schedule.%s", fn, why);
    return DT_OK;
}

/* What every parameter of an optimizer needs on either device: grad and value of one size, a
   group in range, no_decay a flag. */
static dt_status dt__param_fields_check(dt_ctx *ctx, const dt_param *p, const char *fn) {
    if (p->grad.numel != p->value.numel)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: \"%s\" grad has %lld elements, value %lld", fn, p->name,
                                (long long)p->grad.numel, (long long)p->value.numel);
    if (p->group < 0 || p->group >= DT_OPT_MAX_GROUPS)
        return dt_ctx_set_error(ctx, DT_ERR_RANGE, "%s: \"%s\" has group %d; expected 0 <= group < %d "
                                "(DT_OPT_MAX_GROUPS)", fn, p->name, p->group, DT_OPT_MAX_GROUPS);
    if (p->no_decay != 0 && p->no_decay != 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: \"%s\" has no_decay = %d; expected 0 or 1", fn, p->name,
                                p->no_decay);
    return DT_OK;
}

#ifdef DT_CUDA
/* CUDA parameters (every parameter of the set on cuda, grads f32 on cuda): dt_opt_step runs
   kernels/dt_opt.cu; the same checks as the CPU's, with the device named. */
static dt_status dt__opt_check_cuda(dt_ctx *ctx, dt_params *ps, const dt_opt_desc *d, const char *fn) {
    int i;
    for (i = 0; i < ps->count; i++) {
        const dt_param *p = ps->items[i];
        if (p->value.device != DT_CUDA_DEVICE || p->grad.device != DT_CUDA_DEVICE || !p->grad.data)
            return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: \"%s\" value is on %s and grad on %s, but \"%s\" is on cuda; "
                                    "every parameter of an optimizer must be on one device", fn, p->name,
                                    dt_device_name(p->value.device), dt_device_name(p->grad.device), ps->items[0]->name);
        if ((p->value.dtype != DT_F32 && p->value.dtype != DT_BF16 && p->value.dtype != DT_F16) ||
            p->grad.dtype != DT_F32)
            return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: \"%s\" value is %s, grad %s on cuda; expected an f32, bf16 or "
                                    "f16 value and an f32 grad", fn, p->name, dt_dtype_name(p->value.dtype),
                                    dt_dtype_name(p->grad.dtype));
        DT__TRY(dt__param_fields_check(ctx, p, fn));
    }
    return dt__norm_check(ctx, ps, &d->norm, fn);
}
#endif

/* Every value and grad of the set in memory of its own: a grad over another parameter's value (or
   over another grad) would be updated by the one and read by the other within a step. The 2n byte
   ranges sorted by start; each must begin past the furthest end before it. */
typedef struct dt__opt_range { uintptr_t lo, hi; int param, grad; } dt__opt_range;
static int dt__opt_range_cmp(const void *a, const void *b) {
    const dt__opt_range *x = (const dt__opt_range *)a, *y = (const dt__opt_range *)b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}
static dt_status dt__opt_apart(dt_ctx *ctx, const dt_params *ps, const char *fn) {
    dt__opt_range *r;
    int i, n = 0, far = -1;
    dt_status st = DT_OK;
    if (!ps->count) return DT_OK;
    if (!(r = (dt__opt_range *)dt_alloc(ctx, 2 * (size_t)ps->count * sizeof *r))) return ctx->last_status;
    for (i = 0; i < ps->count; i++) {
        const dt_tensor *t[2];
        int k;
        t[0] = &ps->items[i]->value; t[1] = &ps->items[i]->grad;
        for (k = 0; k < 2; k++) {
            size_t b = dt_tensor_bytes(t[k]);
            if (!t[k]->data || !b) continue;
            r[n].lo = (uintptr_t)t[k]->data, r[n].hi = r[n].lo + b, r[n].param = i, r[n].grad = k;
            n++;
        }
    }
    qsort(r, (size_t)n, sizeof *r, dt__opt_range_cmp);
    for (i = 0; i < n && !st; i++) {
        if (far >= 0 && r[i].lo < r[far].hi)
            st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: \"%s\" %s shares memory with \"%s\" %s; expected every value "
                                  "and grad of the set apart (one is updated while the other is read)", fn,
                                  ps->items[r[i].param]->name, r[i].grad ? "grad" : "value", ps->items[r[far].param]->name,
                                  r[far].grad ? "grad" : "value");
        if (far < 0 || r[i].hi > r[far].hi) far = i;
    }
    dt_release(ctx, r);
    return st;
}

static dt_status dt__opt_check_params(dt_ctx *ctx, dt_params *ps, const dt_opt_desc *d, const char *fn) {
    int i;
#ifdef DT_CUDA
    if (ps->count && ps->items[0]->value.device == DT_CUDA_DEVICE) return dt__opt_check_cuda(ctx, ps, d, fn);
    for (i = 0; i < ps->count; i++) /* a CUDA parameter after CPU ones: the device is the mistake */
        if (ps->items[i]->value.device == DT_CUDA_DEVICE || ps->items[i]->grad.device == DT_CUDA_DEVICE)
            return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: \"%s\" value is on %s and grad on %s, but \"%s\" is on "
                                    "cpu; every parameter of an optimizer must be on one device", fn,
                                    ps->items[i]->name, dt_device_name(ps->items[i]->value.device),
                                    dt_device_name(ps->items[i]->grad.device), ps->items[0]->name);
#endif
    DT__TRY(dt__check_grads(ctx, ps, fn));
    for (i = 0; i < ps->count; i++) {
        const dt_param *p = ps->items[i];
        dt_dtype t = p->value.dtype;
        if (p->value.device == DT_CUDA_DEVICE)
            return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: \"%s\" is on cuda; this optimizer updates CPU tensors "
                                    "(the CUDA kernels are not in this build)", fn, p->name);
        if (t != DT_F32 && t != DT_BF16 && t != DT_F16)
            return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: \"%s\" value is %s; expected f32, bf16 or f16", fn, p->name,
                                    dt_dtype_name(t));
        DT__TRY(dt__param_fields_check(ctx, p, fn));
    }
    return dt__norm_check(ctx, ps, &d->norm, fn);
}

/* ---------------------------------------------------------------- stochastic rounding
   kernels/dt_opt.cu has the same three functions (dt_k__sr_*): the same bits on both devices. */

/* splitmix64's finaliser (Steele, Lea, Flood 2014): a bijection of 64 bits whose outputs pass
   BigCrush for consecutive inputs. Cheaper than a Philox block per element, which would make the
   update, a pass that should run at memory speed, compute-bound on a GPU. */
static uint64_t dt__sr_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The key of one parameter's rounding at update t. */
static uint64_t dt__sr_key(uint64_t seed, uint64_t stream, int64_t t) {
    return dt__sr_mix(seed ^ dt__sr_mix(stream ^ dt__sr_mix((uint64_t)t)));
}

/* x to bf16, up with probability (its low 16 bits) / 2^16: the 16 random bits of element g are
   added to the low half, and the carry decides. A NaN rounds to nearest (keeps it a NaN); an inf
   stays inf; a finite x above bf16's largest rounds to inf with the probability of its fraction. */
static uint16_t dt__sr_bf16(float x, uint64_t key, int64_t g) {
    uint32_t u, r = (uint32_t)(dt__sr_mix(key + (uint64_t)g * 0x9E3779B97F4A7C15ull) >> 48);
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return dt_f32_to_bf16(x);
    return (uint16_t)((u + r) >> 16);
}

/* Where slot s's value sits in its whole tensor (dt_opt_slot.sr_*): dims that the shard holds
   whole join the dim before them, leaving one level per split dim (and dim 0); more than three
   levels (three dims split besides the first) is DT_ERR_UNSUPPORTED, which no dt layout makes. */
static dt_status dt__opt_sr_geom(dt_ctx *ctx, dt_opt_slot *s, const char *fn) {
    const dt_param *p = s->param;
    int64_t l[DT_MAX_DIMS], g[DT_MAX_DIMS], st[DT_MAX_DIMS], stride = 1;
    int d, m = 0, nd = p->value.ndim;
    s->sr_stream = dt_hash_name(p->name);
    for (d = 0; d < nd; d++) g[d] = p->global_shape[d] ? p->global_shape[d] : p->value.shape[d];
    if (dt_shape_numel(nd, g) < 0) /* then the products below fit */
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: \"%s\" global_shape's element count overflows int64", fn, p->name);
    for (d = 0; d < nd; d++) {
        int64_t gd = p->global_shape[d] ? p->global_shape[d] : p->value.shape[d], ld = p->value.shape[d];
        int whole = ld == gd && p->start[d] == 0;
        if (m && whole) { /* (i_prev, i_d) -> i_prev * gd + i_d */
            l[m - 1] *= ld; g[m - 1] *= gd; st[m - 1] *= gd;
        } else {
            l[m] = ld; g[m] = gd; st[m] = p->start[d]; m++;
        }
    }
    if (m > 3)
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: \"%s\" is a shard split along %d dims besides its first; "
                                "desc.stochastic_rounding handles at most 2", fn, p->name, m - 1);
    while (m < 3) { /* levels of one element in front */
        for (d = m; d > 0; d--) { l[d] = l[d - 1]; g[d] = g[d - 1]; st[d] = st[d - 1]; }
        l[0] = g[0] = 1; st[0] = 0; m++;
    }
    s->sr_n1 = l[1]; s->sr_n2 = l[2];
    s->sr_g1 = g[2]; s->sr_g0 = g[1] * g[2];
    s->sr_base = 0;
    for (d = 2; d >= 0; d--) { s->sr_base += st[d] * stride; stride *= g[d]; }
    return DT_OK;
}

/* value = master rounded stochastically, rows of n2 elements at a time. */
static void dt__opt_sr_store(const dt_opt_slot *s, uint16_t *v, const float *w, int64_t n, uint64_t key) {
    int64_t i = 0, row = 0, n2 = s->sr_n2 ? s->sr_n2 : 1, n1 = s->sr_n1 ? s->sr_n1 : 1;
    for (; i < n; row++) {
        int64_t g = s->sr_base + (row / n1) * s->sr_g0 + (row % n1) * s->sr_g1, e = i + n2 < n ? i + n2 : n;
        for (; i < e; i++, g++) v[i] = dt__sr_bf16(w[i], key, g);
    }
}

#ifdef DT_CUDA
/* The device side of an optimizer of CUDA parameters, one allocation (opt->cuda_tab) made by
   dt_opt_create: the step's decisions (dt_k_opt_state), the norm classes' sums, and the
   parameter table of the multi-tensor kernels (dt_k_opt_seg per parameter). The table is sent
   once, and again only when a grad moves (dt__opt_cuda_grads); opt->cuda_segs is its host copy. */
#define DT__OPT_TAB_CLS 64 /* after the state (64 bytes): double cls[], then float clsf[] */
#define DT__OPT_TAB_CLSF (DT__OPT_TAB_CLS + 8 * DT_K_OPT_MAX_CLS)
#define DT__OPT_TAB_SEG (DT__OPT_TAB_CLSF + 8 * DT_K_OPT_MAX_CLS)
#define DT__OPT_TAB_BYTES(n) (DT__OPT_TAB_SEG + (size_t)(n) * sizeof(dt_k_opt_seg))
typedef char dt__opt_state_fits[sizeof(dt_k_opt_state) <= DT__OPT_TAB_CLS ? 1 : -1];
typedef char dt__opt_cls_fits[DT_K_OPT_MAX_CLS == DT_OPT_CUDA_CLS ? 1 : -1];

static dt_k_opt_state *dt__opt_dstate(const dt_optimizer *opt) { return (dt_k_opt_state *)opt->cuda_tab.data; }
static double *dt__opt_dcls(const dt_optimizer *opt) {
    return (double *)((unsigned char *)opt->cuda_tab.data + DT__OPT_TAB_CLS);
}
static float *dt__opt_dclsf(const dt_optimizer *opt) {
    return (float *)((unsigned char *)opt->cuda_tab.data + DT__OPT_TAB_CLSF);
}
static dt_k_opt_seg *dt__opt_dseg(const dt_optimizer *opt) {
    return (dt_k_opt_seg *)((unsigned char *)opt->cuda_tab.data + DT__OPT_TAB_SEG);
}

static dt_status dt__opt_settle(dt_optimizer *opt, const char *fn);

static dt_status dt__opt_cuda_err(dt_ctx *ctx, const char *fn, const char *call, int k) {
    return dt_ctx_set_error(ctx, DT_ERR_CUDA, "%s: %s failed: %s", fn, call, dt_k_error_string(k));
}

/* The norm classes: 0 for the parameters summed here only, then each distinct comm of the
   norm in the order dt__norm_combine all-reduces them (shard_comm first), so every rank of a
   comm joins the same all-reduces in the same order as on the CPU. */
static dt_status dt__opt_cuda_classes(dt_optimizer *opt, const char *fn) {
    const dt_grad_norm_desc *d = &opt->desc.norm;
    dt_params *ps = opt->params;
    int i, c;
    opt->cuda_n_cls = 1;
    opt->cuda_cls_comm[0] = NULL;
    for (i = -1; i < ps->count; i++) {
        dt_comm *cm = i < 0 ? d->shard_comm : ps->items[i]->sharded ? dt__param_comm(d, i) : NULL;
        if (!cm) continue;
        for (c = 1; c < opt->cuda_n_cls && opt->cuda_cls_comm[c] != cm; c++) {}
        if (c < opt->cuda_n_cls) continue;
        if (c == DT_OPT_CUDA_CLS)
            return dt_ctx_set_error(opt->ctx, DT_ERR_ARG, "%s: desc.norm names more than %d distinct comms (shard_comm "
                                    "and param_comms); the CUDA optimizer sums the norm over at most that many", fn,
                                    DT_OPT_CUDA_CLS - 1);
        opt->cuda_cls_comm[opt->cuda_n_cls++] = cm;
    }
    return DT_OK;
}

/* The host's scaler and step as the device state (sent at create, and after a checkpoint load
   changed them: opt->cuda_dirty). */
static dt_status dt__opt_cuda_push(dt_optimizer *opt, const char *fn) {
    dt_k_opt_state st;
    memset(&st, 0, sizeof st);
    st.scale = opt->scaler.scale;
    st.step = opt->step;
    st.skipped = opt->scaler.skipped;
    st.growth_tracker = opt->scaler.growth_tracker;
    st.grad_mul = 1.0f;
    DT__TRY(dt_cuda_memcpy(opt->ctx, dt__opt_dstate(opt), DT_CUDA_DEVICE, &st, DT_CPU, sizeof st, fn));
    opt->cuda_dirty = 0;
    opt->cuda_pending = 0;
    return DT_OK;
}

/* Builds the tables once: the parameters, their state and weight decays do not change after
   dt_opt_create. Grads may move (a bucketer created or freed later makes them views into its
   buckets or gives them their own memory back): dt__opt_cuda_grads re-sends the table then. */
static dt_status dt__opt_cuda_init(dt_optimizer *opt, const char *fn) {
    dt_ctx *ctx = opt->ctx;
    dt_tensor_desc td;
    dt_k_opt_seg *seg;
    int64_t start = 0;
    int i, n = opt->n_slots;
    DT__TRY(dt__opt_cuda_classes(opt, fn));
    memset(&td, 0, sizeof td);
    td.dtype = DT_U8; td.device = DT_CUDA_DEVICE; td.shape[0] = (int64_t)DT__OPT_TAB_BYTES(n); td.ndim = 1;
    DT__TRY(dt_tensor_create(ctx, &opt->cuda_tab, &td));
    if (!(opt->cuda_segs = dt__ocalloc(ctx, n ? n : 1, sizeof(dt_k_opt_seg)))) return DT_ERR_OOM;
    seg = (dt_k_opt_seg *)opt->cuda_segs;
    for (i = 0; i < n; i++) {
        const dt_opt_slot *s = &opt->slots[i];
        const dt_param *p = s->param;
        const dt_opt_group *g = &opt->desc.groups[p->group];
        int c = 0;
        if (p->sharded)
            for (c = 1; c < opt->cuda_n_cls && opt->cuda_cls_comm[c] != dt__param_comm(&opt->desc.norm, i); c++) {}
        seg[i].w = p->value.data;
        seg[i].master = (float *)s->master.data;
        seg[i].g = (float *)p->grad.data;
        seg[i].s0 = (float *)s->state[0].data;
        seg[i].s1 = (float *)s->state[1].data;
        seg[i].start = start;
        seg[i].wd = p->no_decay ? 0.0 : g->weight_decay; /* dt__opt_update_slot's */
        seg[i].lr_scale = g->lr_scale;
        seg[i].w_dtype = (int)p->value.dtype;
        seg[i].cls = c;
        seg[i].sr_stream = s->sr_stream; /* dt__opt_sr_geom's, when stochastic rounding */
        seg[i].sr_base = s->sr_base; seg[i].sr_n1 = s->sr_n1; seg[i].sr_n2 = s->sr_n2;
        seg[i].sr_g0 = s->sr_g0; seg[i].sr_g1 = s->sr_g1;
        start += p->value.numel;
    }
    opt->cuda_numel = start;
    DT__TRY(dt_cuda_memcpy(ctx, dt__opt_dseg(opt), DT_CUDA_DEVICE, seg, DT_CPU, (size_t)n * sizeof(dt_k_opt_seg), fn));
    return dt__opt_cuda_push(opt, fn);
}
#endif

/* master = value widened (exact), on the value's device. */
static dt_status dt__opt_master_init(dt_ctx *ctx, dt_tensor *master, const dt_tensor *value, const char *fn) {
#ifdef DT_CUDA
    if (value->device == DT_CUDA_DEVICE) {
        int k = dt_k_tensor_cast(master->data, DT_F32, value->data, (int)value->dtype, value->numel, ctx->cuda_stream);
        return k ? dt__opt_cuda_err(ctx, fn, "dt_k_tensor_cast (the master weights)", k) : DT_OK;
    }
#endif
    (void)fn;
    return dt_tensor_cast(ctx, master, value);
}

DT_API void dt_opt_free(dt_optimizer *opt) {
    int i, k;
    dt_ctx *ctx;
    if (!opt) return;
    ctx = opt->ctx;
    for (i = 0; i < opt->n_slots; i++) {
        dt_tensor_free(ctx, &opt->slots[i].master);
        for (k = 0; k < 2; k++) dt_tensor_free(ctx, &opt->slots[i].state[k]);
    }
    dt_release(ctx, opt->slots);
    dt_release(ctx, opt->sumsq);
    dt_tensor_free(ctx, &opt->cuda_tab);
    dt_release(ctx, opt->cuda_segs);
    dt_release(ctx, opt);
}

DT_API dt_status dt_opt_create(dt_ctx *ctx, dt_optimizer **out, dt_params *ps, const dt_opt_desc *desc) {
    const char *fn = "dt_opt_create";
    dt_optimizer *opt;
    dt_opt_desc d;
    dt_status st = DT_OK;
    int i, k, n_state, any_f16 = 0, norm_collective;
    if (out) *out = NULL;
    if (!ctx) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    if (!ps || !desc) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, ps ? "desc" : "ps");
    d = *desc;
    DT__TRY(dt__opt_resolve(ctx, &d, fn));
    DT__TRY(dt__opt_check_params(ctx, ps, &d, fn));
    DT__TRY(dt__opt_apart(ctx, ps, fn));
    for (i = 0; i < ps->count; i++) any_f16 |= ps->items[i]->value.dtype == DT_F16;
    if (d.loss_scale.mode == DT_LOSS_SCALE_DEFAULT && any_f16) d.loss_scale.mode = DT_LOSS_SCALE_DYNAMIC;
    norm_collective = dt__norm_collective(ps, &d.norm);
    /* a step skipped on one rank only would leave the others waiting in the norm's all-reduce */
    if ((d.loss_scale.mode == DT_LOSS_SCALE_DYNAMIC || d.loss_scale.mode == DT_LOSS_SCALE_STATIC) &&
        norm_collective && dt__comm_size(d.comm) == 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.comm is %s but desc.norm sums the grad norm over other "
                                "ranks; with loss scaling every rank that steps together must agree on skipping a "
                                "step: set desc.comm to them (the world)", fn, d.comm ? "a comm of one rank" : "NULL");
    opt = (dt_optimizer *)dt_alloc_zeroed(ctx, sizeof *opt);
    if (!opt) return DT_ERR_OOM;
    opt->ctx = ctx;
    opt->params = ps;
    opt->norm_collective = norm_collective;
    st = dt_loss_scaler_init(ctx, &opt->scaler, &d.loss_scale);
    if (st) { dt_release(ctx, opt); return st; }
    d.loss_scale.mode = opt->scaler.mode;
    opt->desc = d;
    opt->slots = (dt_opt_slot *)dt__ocalloc(ctx, ps->count, sizeof(dt_opt_slot));
    opt->sumsq = (double *)dt__ocalloc(ctx, ps->count, sizeof(double));
    if (!opt->slots || !opt->sumsq) {
        dt_release(ctx, opt->slots);
        dt_release(ctx, opt->sumsq);
        dt_release(ctx, opt);
        return DT_ERR_OOM;
    }
    n_state = d.kind == DT_OPT_SGD ? (d.momentum != 0 ? 1 : 0) : d.kind == DT_OPT_ADAGRAD ? 1 : 2;
    for (i = 0; i < ps->count && !st; i++) {
        dt_opt_slot *s = &opt->slots[i];
        dt_param *p = ps->items[i];
        s->param = p;
        opt->n_slots = i + 1;
        if (!st && d.stochastic_rounding && p->value.dtype == DT_BF16) st = dt__opt_sr_geom(ctx, s, fn);
        if (!st && p->value.dtype != DT_F32) { /* on the value's device, as the state */
            st = dt_tensor_create_like(ctx, &s->master, &p->value, DT_F32, p->value.device);
            if (!st) st = dt__opt_master_init(ctx, &s->master, &p->value, fn); /* exact: bf16/f16 -> f32 */
        }
        for (k = 0; k < n_state && !st; k++) /* on the value's device: cpu, or cuda under DT_CUDA */
            st = dt_tensor_create_like(ctx, &s->state[k], &p->value, DT_F32, p->value.device);
        if (!st && d.kind == DT_OPT_ADAGRAD && d.initial_accumulator_value != 0)
            st = dt_tensor_fill(ctx, &s->state[0], d.initial_accumulator_value);
    }
#ifdef DT_CUDA
    if (!st && ps->count && ps->items[0]->value.device == DT_CUDA_DEVICE) st = dt__opt_cuda_init(opt, fn);
#endif
    if (st) { dt_opt_free(opt); return st; }
    *out = opt;
    return DT_OK;
}

DT_API double dt_opt_lr(const dt_optimizer *opt) { return opt ? dt_lr_at(&opt->desc.schedule, opt->step) : NAN; }

DT_API dt_status dt_opt_micro_begin(dt_optimizer *opt, float *dloss, dt_bucketer *b, int micro) {
    int n;
    if (dloss) *dloss = 0.0f; /* written on every path (a caller's unchecked status reads no garbage) */
    if (!opt) return DT_ERR_ARG;
    n = opt->desc.accum_steps;
    if (micro < 0 || micro >= n)
        return dt_ctx_set_error(opt->ctx, DT_ERR_RANGE, "dt_opt_micro_begin: micro = %d; expected 0 <= micro < "
                                "accum_steps (%d)", micro, n);
    if (b) dt_bucketer_set_sync(b, micro == n - 1);
#ifdef DT_CUDA
    if (dloss) DT__TRY(dt__opt_settle(opt, "dt_opt_micro_begin")); /* the seed carries the device's scale */
#endif
    if (dloss) *dloss = (float)(opt->scaler.scale / n);
    return DT_OK;
}

static dt_status dt__opt_check_state(dt_optimizer *opt, const char *fn) {
    int i;
    if (opt->params->count != opt->n_slots)
        return dt_ctx_set_error(opt->ctx, DT_ERR_STATE, "%s: the parameter set has %d parameters; the optimizer was "
                                "created for %d", fn, opt->params->count, opt->n_slots);
    for (i = 0; i < opt->n_slots; i++) {
        const dt_param *p = opt->params->items[i];
        if (p != opt->slots[i].param)
            return dt_ctx_set_error(opt->ctx, DT_ERR_STATE, "%s: parameter %d is not the one the optimizer was created "
                                    "for (\"%s\")", fn, i, opt->slots[i].param->name);
        if (p->group < 0 || p->group >= DT_OPT_MAX_GROUPS) /* changed since dt_opt_create: it indexes desc.groups */
            return dt_ctx_set_error(opt->ctx, DT_ERR_STATE, "%s: \"%s\" has group %d since dt_opt_create; expected 0 <= "
                                    "group < %d (DT_OPT_MAX_GROUPS)", fn, p->name, p->group, DT_OPT_MAX_GROUPS);
    }
    return DT_OK;
}

/* One parameter: its group's lr and decay, the update on the f32 master (or the value itself),
   then the working copy re-cast from the master. */
static void dt__opt_update_slot(dt_optimizer *opt, dt_opt_slot *s, double lr_base) {
    const dt_opt_desc *d = &opt->desc;
    dt_param *p = s->param;
    const dt_opt_group *g = &d->groups[p->group];
    double lr = lr_base * g->lr_scale, wd = p->no_decay ? 0.0 : g->weight_decay;
    float *w = (float *)(s->master.data ? s->master.data : p->value.data);
    const float *gr = (const float *)p->grad.data;
    float *s0 = (float *)s->state[0].data, *s1 = (float *)s->state[1].data;
    int64_t n = p->value.numel, t = opt->step + 1;
    switch (d->kind) {
    case DT_OPT_SGD:
        dt_sgd_update(w, gr, s0, n, lr, d->momentum, d->dampening, wd, d->nesterov, t == 1);
        break;
    case DT_OPT_ADAM: case DT_OPT_ADAMW:
        dt_adam_update(w, gr, s0, s1, n, lr, d->beta1, d->beta2, d->eps, wd, d->kind == DT_OPT_ADAMW, t);
        break;
    default:
        dt_adagrad_update(w, gr, s0, n, lr, d->lr_decay, wd, d->eps, t);
        break;
    }
    /* bf16 / f16 (the only other dtypes dt_opt_create accepts): the working copy rounded from
       the master. Both are contiguous, aligned CPU arrays of n elements made by dt_opt_create
       and dt_params_add, so dt_convert has nothing to refuse. */
    if (p->value.dtype == DT_BF16 && d->stochastic_rounding)
        dt__opt_sr_store(s, (uint16_t *)p->value.data, w, n, dt__sr_key(d->rounding_seed, s->sr_stream, t));
    else if (p->value.dtype != DT_F32) (void)dt_convert(opt->ctx, p->value.data, p->value.dtype, w, DT_F32, n);
}

#ifdef DT_CUDA
/* The grads' device pointers as they are now: checked on the host every step (n pointers), the
   table sent to the device only when one moved. */
static dt_status dt__opt_cuda_grads(dt_optimizer *opt, const char *fn) {
    dt_ctx *ctx = opt->ctx;
    dt_k_opt_seg *seg = (dt_k_opt_seg *)opt->cuda_segs;
    int i, n = opt->n_slots, moved = 0;
    for (i = 0; i < n; i++) {
        const dt_param *p = opt->slots[i].param;
        if (p->grad.device != DT_CUDA_DEVICE || p->grad.dtype != DT_F32 || p->grad.numel != p->value.numel ||
            (!p->grad.data && p->grad.numel))
            return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: \"%s\" grad is %s on %s with %lld elements (data %s); the "
                                    "optimizer of CUDA parameters needs an f32 CUDA grad of %lld", fn, p->name,
                                    dt_dtype_name(p->grad.dtype), dt_device_name(p->grad.device),
                                    (long long)p->grad.numel, p->grad.data ? "set" : "NULL",
                                    (long long)p->value.numel);
        moved |= seg[i].g != (float *)p->grad.data;
        seg[i].g = (float *)p->grad.data;
    }
    if (!moved) return DT_OK;
    return dt_cuda_memcpy(ctx, dt__opt_dseg(opt), DT_CUDA_DEVICE, seg, DT_CPU, (size_t)n * sizeof(dt_k_opt_seg), fn);
}

/* Reads the device state (one copy, one wait) into *out; with scaling the device decides the
   skip, the scale and the step, so the host's scaler and step are brought up to date. */
static dt_status dt__opt_cuda_pull(dt_optimizer *opt, dt_k_opt_state *out, const char *fn) {
    dt_k_opt_state st;
    DT__TRY(dt_cuda_memcpy(opt->ctx, &st, DT_CPU, dt__opt_dstate(opt), DT_CUDA_DEVICE, sizeof st, fn));
    if (opt->cuda_pending) {
        opt->step = st.step;
        opt->scaler.scale = st.scale;
        opt->scaler.growth_tracker = st.growth_tracker;
        opt->scaler.skipped = st.skipped;
        opt->cuda_pending = 0;
    }
    if (out) *out = st;
    return DT_OK;
}

/* The host's copy of the step and scaler made current: read back when a step with scaling ran
   since the last read (opt->cuda_pending), nothing otherwise. */
static dt_status dt__opt_settle(dt_optimizer *opt, const char *fn) {
    if (!opt || !opt->cuda_tab.data || !opt->cuda_pending) return DT_OK;
    return dt__opt_cuda_pull(opt, NULL, fn);
}

/* A one-element view of a device float (a norm class, the flag), for dt_comm_allreduce. */
static dt_tensor dt__opt_dview(float *p) {
    dt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = p; t.dtype = DT_F32; t.device = DT_CUDA_DEVICE; t.ndim = 1; t.shape[0] = 1; t.numel = 1;
    return t;
}

/* dt_opt_step on CUDA parameters (see dt_opt_step): the pass, the all-reduces on device memory,
   the decisions and the update, all queued on the ctx's stream without a wait. */
static dt_status dt__opt_cuda_step(dt_optimizer *opt, dt_opt_step_info *info, const char *fn) {
    dt_ctx *ctx = opt->ctx;
    const dt_opt_desc *d = &opt->desc;
    dt_k_opt_state *st;
    dt_k_opt_finish_args fa;
    dt_k_opt_hyper h;
    dt_opt_step_info inf;
    dt_tensor v;
    const int scaling = opt->scaler.mode != DT_LOSS_SCALE_NONE;
    const int want_norm = d->clip_norm > 0 || opt->norm_collective || info != NULL; /* as on the CPU */
    const int stages = d->norm.stage_comm && dt_comm_size(d->norm.stage_comm) > 1;
    int c, k;
    DT__TRY(dt__opt_settle(opt, fn)); /* a step with scaling before it, and no dt_opt_micro_begin since */
    if (opt->cuda_dirty) DT__TRY(dt__opt_cuda_push(opt, fn));
    DT__TRY(dt__opt_cuda_grads(opt, fn));
    st = dt__opt_dstate(opt);
    memset(&inf, 0, sizeof inf);
    inf.lr = dt_opt_lr(opt);
    inf.loss_scale = opt->scaler.scale;
    if (scaling || want_norm) {
        /* 1. the pass: unscale, flag, per-class sums (GradScaler's inv_scale, as dt__unscale) */
        const float mul = scaling ? (float)(1.0 / opt->scaler.scale) : 1.0f;
        size_t mark = dt_cuda_scratch_begin(ctx);
        double *part = (double *)dt_cuda_scratch(ctx, (size_t)dt_k_opt_blocks(opt->cuda_numel) *
                                                          (size_t)(opt->cuda_n_cls + 1) * sizeof(double) + 8, fn);
        k = part ? dt_k_opt_grad_pass(dt__opt_dseg(opt), opt->n_slots, opt->cuda_numel, opt->cuda_n_cls, part,
                                      dt__opt_dcls(opt), dt__opt_dclsf(opt), st, mul, scaling && opt->scaler.scale != 1.0,
                                      ctx->cuda_stream)
                 : -1;
        dt_cuda_scratch_end(ctx, mark);
        if (k < 0) return DT_ERR_OOM;
        if (k) return dt__opt_cuda_err(ctx, fn, "dt_k_opt_grad_pass", k);
        /* 2. the collectives, on device memory, in the CPU's order: the flag, then the norm */
        if (scaling && dt__comm_size(d->comm) > 1) {
            v = dt__opt_dview(&st->found_inf);
            DT__TRY(dt_comm_allreduce(d->comm, &v, DT_REDUCE_MAX));
        }
        memset(&fa, 0, sizeof fa);
        for (c = 1; want_norm && c < opt->cuda_n_cls; c++)
            if (dt_comm_size(opt->cuda_cls_comm[c]) > 1) {
                v = dt__opt_dview(dt__opt_dclsf(opt) + c);
                DT__TRY(dt_comm_allreduce(opt->cuda_cls_comm[c], &v, DT_REDUCE_SUM));
                fa.reduced |= 1 << c;
            }
        /* 3. the decisions on the device: skip, clip factor, scale, step */
        fa.scaling = scaling;
        fa.dynamic = opt->scaler.mode == DT_LOSS_SCALE_DYNAMIC;
        fa.want_norm = want_norm;
        fa.growth_interval = opt->scaler.growth_interval;
        fa.clip_norm = d->clip_norm;
        fa.growth_factor = opt->scaler.growth_factor;
        fa.backoff_factor = opt->scaler.backoff_factor;
        if (want_norm && stages) {
            if ((k = dt_k_opt_finish(st, dt__opt_dcls(opt), dt__opt_dclsf(opt), opt->cuda_n_cls, 1, &fa,
                                     ctx->cuda_stream)))
                return dt__opt_cuda_err(ctx, fn, "dt_k_opt_finish", k);
            v = dt__opt_dview(&st->sumsq_f);
            DT__TRY(dt_comm_allreduce(d->norm.stage_comm, &v, DT_REDUCE_SUM));
        }
        if ((k = dt_k_opt_finish(st, dt__opt_dcls(opt), dt__opt_dclsf(opt), opt->cuda_n_cls,
                                 want_norm && stages ? 2 : 0, &fa, ctx->cuda_stream)))
            return dt__opt_cuda_err(ctx, fn, "dt_k_opt_finish", k);
    }
    /* 4. one launch updates every parameter, reading the clip factor and the skip on the device */
    memset(&h, 0, sizeof h);
    h.kind = d->kind == DT_OPT_SGD ? 1 : d->kind == DT_OPT_ADAM ? 2 : d->kind == DT_OPT_ADAMW ? 3 : 4;
    h.t = opt->step + 1;
    h.first = h.t == 1;
    h.nesterov = d->nesterov;
    h.sr = d->stochastic_rounding;
    h.sr_seed = d->rounding_seed;
    h.lr = inf.lr;
    h.momentum = d->momentum; h.dampening = d->dampening;
    h.beta1 = d->beta1; h.beta2 = d->beta2; h.eps = d->eps; h.lr_decay = d->lr_decay;
    k = dt_k_opt_update(dt__opt_dseg(opt), opt->n_slots, opt->cuda_numel, &h,
                        scaling || want_norm ? &st->grad_mul : NULL, scaling ? &st->skip : NULL, ctx->cuda_stream);
    if (k) return dt__opt_cuda_err(ctx, fn, "dt_k_opt_update", k);
    /* without scaling no step is skipped: the host knows the step; with it the device does */
    if (scaling) opt->cuda_pending = 1;
    else opt->step++;
    if (info) { /* asked for: one copy back, one wait */
        dt_k_opt_state s;
        DT__TRY(dt__opt_cuda_pull(opt, &s, fn));
        inf.skipped = s.skip;
        inf.grad_norm = s.grad_norm;
        *info = inf;
    }
    return DT_OK;
}
#endif

DT_API dt_status dt_opt_step(dt_optimizer *opt, dt_opt_step_info *info) {
    const char *fn = "dt_opt_step";
    dt_opt_step_info inf;
    dt_params *ps;
    dt_ctx *ctx;
    double *sq, lr;
    int i, bad = 0, scaling, want_norm;
    dt_status st = DT_OK;
    if (info) memset(info, 0, sizeof *info); /* written on every path; filled at the end */
    if (!opt) return DT_ERR_ARG;
    ctx = opt->ctx;
    ps = opt->params;
    DT__TRY(dt__opt_check_state(opt, fn));
#ifdef DT_CUDA
    if (opt->cuda_tab.data) return dt__opt_cuda_step(opt, info, fn); /* CUDA parameters (dt_opt_create) */
#endif
    memset(&inf, 0, sizeof inf);
    lr = dt_opt_lr(opt);
    inf.lr = lr;
    inf.loss_scale = opt->scaler.scale;
    scaling = opt->scaler.mode != DT_LOSS_SCALE_NONE;
    /* Whether the norm's collectives run follows from the configuration alone, the same on
       every rank: a trainer that passes info on one rank only (to log) must not leave the
       others behind in an all-reduce. info adds a norm only where it is local. */
    want_norm = opt->desc.clip_norm > 0 || opt->norm_collective || info != NULL;
    sq = opt->sumsq;
    /* 1. one pass over the grads: unscale, inf/nan agreed over desc.comm, sums of squares (none
       without scaling or a norm: the update is then the only pass) */
    if (scaling || want_norm) {
        st = dt__unscale(scaling ? &opt->scaler : NULL, ps, sq, &bad, opt->desc.comm);
        if (!st && bad) {
            dt_loss_scaler_update(&opt->scaler, 1);
            inf.skipped = 1;
            inf.grad_norm = HUGE_VAL;
        }
    }
    /* 2. global norm, 3. clip, 4. update */
    if (!st && !inf.skipped && want_norm) st = dt__norm_combine(ctx, ps, &opt->desc.norm, sq, &inf.grad_norm, fn);
    if (!st && !inf.skipped) {
        if (opt->desc.clip_norm > 0) dt__clip(ps, opt->desc.clip_norm, inf.grad_norm);
        for (i = 0; i < opt->n_slots; i++) dt__opt_update_slot(opt, &opt->slots[i], lr);
        opt->step++;
        if (scaling) dt_loss_scaler_update(&opt->scaler, 0);
    }
    if (info) *info = inf;
    return st;
}

DT_API dt_status dt_opt_sync(dt_optimizer *opt) {
    if (!opt) return DT_ERR_ARG;
#ifdef DT_CUDA
    return dt__opt_settle(opt, "dt_opt_sync");
#else
    return DT_OK;
#endif
}

/* ==== >>ckpt: checkpoints: XXH64, train state, helpers, plan, write, load ===================== */

/* ---------------------------------------------------------------- XXH64 */

#define DT__P1 0x9E3779B185EBCA87ULL
#define DT__P2 0xC2B2AE3D27D4EB4FULL
#define DT__P3 0x165667B19E3779F9ULL
#define DT__P4 0x85EBCA77C2B2AE63ULL
#define DT__P5 0x27D4EB2F165667C5ULL

static uint64_t dt__rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
/* Little-endian loads. On a little-endian target a memcpy, which GCC sees as one load early
   enough to inline it into the hash loop (the byte-by-byte form became one load too, but too
   late: it stayed a call per word and the hash ran at half speed). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static uint64_t dt__rd64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t dt__rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
#else
static uint64_t dt__rd64(const unsigned char *p) {
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}
static uint32_t dt__rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
#endif
static uint64_t dt__xxround(uint64_t acc, uint64_t in) { return dt__rotl64(acc + in * DT__P2, 31) * DT__P1; }
static uint64_t dt__xxmerge(uint64_t h, uint64_t v) { return (h ^ dt__xxround(0, v)) * DT__P1 + DT__P4; }

DT_API void dt_xxh64_init(dt_xxh64_state *s) {
    memset(s, 0, sizeof *s);
    s->v[0] = DT__P1 + DT__P2;
    s->v[1] = DT__P2;
    s->v[2] = 0;
    s->v[3] = 0 - DT__P1;
}

DT_API void dt_xxh64_update(dt_xxh64_state *s, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data, *end = p + n;
    uint64_t v0, v1, v2, v3;
    if (!s || !n) return;
    s->total += n;
    if (s->mem_size + n < 32) {
        memcpy(s->mem + s->mem_size, p, n);
        s->mem_size += (unsigned)n;
        return;
    }
    if (s->mem_size) { /* complete the buffered stripe */
        size_t k = 32 - s->mem_size;
        memcpy(s->mem + s->mem_size, p, k);
        s->v[0] = dt__xxround(s->v[0], dt__rd64(s->mem));
        s->v[1] = dt__xxround(s->v[1], dt__rd64(s->mem + 8));
        s->v[2] = dt__xxround(s->v[2], dt__rd64(s->mem + 16));
        s->v[3] = dt__xxround(s->v[3], dt__rd64(s->mem + 24));
        p += k;
        s->mem_size = 0;
    }
    /* four independent lanes: the loop runs at several bytes per cycle */
    v0 = s->v[0]; v1 = s->v[1]; v2 = s->v[2]; v3 = s->v[3];
    while (end - p >= 32) {
        v0 = dt__xxround(v0, dt__rd64(p));
        v1 = dt__xxround(v1, dt__rd64(p + 8));
        v2 = dt__xxround(v2, dt__rd64(p + 16));
        v3 = dt__xxround(v3, dt__rd64(p + 24));
        p += 32;
    }
    s->v[0] = v0; s->v[1] = v1; s->v[2] = v2; s->v[3] = v3;
    if (p < end) {
        memcpy(s->mem, p, (size_t)(end - p));
        s->mem_size = (unsigned)(end - p);
    }
}

DT_API uint64_t dt_xxh64_final(const dt_xxh64_state *s) {
    const unsigned char *p = s->mem, *end = s->mem + s->mem_size;
    uint64_t h;
    if (s->total >= 32) {
        h = dt__rotl64(s->v[0], 1) + dt__rotl64(s->v[1], 7) + dt__rotl64(s->v[2], 12) + dt__rotl64(s->v[3], 18);
        h = dt__xxmerge(h, s->v[0]);
        h = dt__xxmerge(h, s->v[1]);
        h = dt__xxmerge(h, s->v[2]);
        h = dt__xxmerge(h, s->v[3]);
    } else {
        h = s->v[2] + DT__P5; /* v[2] holds the seed, 0 */
    }
    h += s->total;
    for (; end - p >= 8; p += 8) h = dt__rotl64(h ^ dt__xxround(0, dt__rd64(p)), 27) * DT__P1 + DT__P4;
    if (end - p >= 4) {
        h = dt__rotl64(h ^ (uint64_t)dt__rd32(p) * DT__P1, 23) * DT__P2 + DT__P3;
        p += 4;
    }
    for (; p < end; p++) h = dt__rotl64(h ^ (uint64_t)*p * DT__P5, 11) * DT__P1;
    h ^= h >> 33;
    h *= DT__P2;
    h ^= h >> 29;
    h *= DT__P3;
    h ^= h >> 32;
    return h;
}

DT_API uint64_t dt_xxh64(const void *data, size_t n) {
    dt_xxh64_state s;
    dt_xxh64_init(&s);
    dt_xxh64_update(&s, data, n);
    return dt_xxh64_final(&s);
}

/* ---------------------------------------------------------------- train state */

DT_API dt_status dt_train_state_set(dt_ctx *ctx, dt_train_state *s, const char *key, const char *value) {
    const char *fn = "dt_train_state_set";
    int i;
    if (!ctx) return DT_ERR_ARG;
    if (!s || !key || !value)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, !s ? "s" : !key ? "key" : "value");
    if (!key[0] || strlen(key) >= DT_CKPT_KEY_MAX)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: key \"%s\" has %zu bytes; expected 1..%d", fn, key, strlen(key),
                                DT_CKPT_KEY_MAX - 1);
    if (strlen(value) >= DT_CKPT_VALUE_MAX)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: the value of \"%s\" has %zu bytes; expected at most %d", fn, key,
                                strlen(value), DT_CKPT_VALUE_MAX - 1);
    for (i = 0; i < s->n_kv && strcmp(s->keys[i], key) != 0; i++) {}
    if (i == DT_CKPT_MAX_KV)
        return dt_ctx_set_error(ctx, DT_ERR_RANGE, "%s: \"%s\" would be key number %d; at most %d (DT_CKPT_MAX_KV)", fn,
                                key, i + 1, DT_CKPT_MAX_KV);
    memcpy(s->keys[i], key, strlen(key) + 1);
    memcpy(s->values[i], value, strlen(value) + 1);
    if (i == s->n_kv) s->n_kv++;
    return DT_OK;
}

DT_API const char *dt_train_state_get(const dt_train_state *s, const char *key) {
    int i;
    if (!s || !key) return NULL;
    for (i = 0; i < s->n_kv && i < DT_CKPT_MAX_KV; i++)
        if (strcmp(s->keys[i], key) == 0) return s->values[i];
    return NULL;
}

/* ---------------------------------------------------------------- checkpoints: helpers */

#ifdef DT__OPT_POSIX

#define DT__CK_PATH 4096
#define DT__CK_NAME (DT_NAME_MAX + 32)
#define DT__CK_CHUNK ((size_t)1 << 20) /* hash a chunk while it is in cache, then write / after read */
#define DT__CK_VERSION 1

/* snprintf for paths and names: the lengths were checked up front (desc.dir), and a call
   through va_list keeps -Wformat-truncation from second-guessing each one. */
static void dt__ck_fmt(char *out, size_t n, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void dt__ck_fmt(char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, n, fmt, ap);
    va_end(ap);
}

static void dt__ck_i64(dt_strbuf *b, int64_t v) {
    char num[32];
    snprintf(num, sizeof num, "%lld", (long long)v);
    dt_strbuf_str(b, num);
}

static void dt__ck_dims(dt_strbuf *b, int ndim, const int64_t *v) {
    int d;
    dt_strbuf_str(b, "[");
    for (d = 0; d < ndim; d++) {
        if (d) dt_strbuf_str(b, ",");
        dt__ck_i64(b, v[d]);
    }
    dt_strbuf_str(b, "]");
}

static int dt__ck_float(dt_dtype t) { return t == DT_F32 || t == DT_BF16 || t == DT_F16; }

/* A JSON array of at most DT_MAX_DIMS counts. */
static int dt__ck_dims_from(const dt_json *j, int *ndim, int64_t *dims) {
    int d;
    if (!j || j->type != DT_JSON_ARRAY || j->count > DT_MAX_DIMS) return 0;
    for (d = 0; d < j->count; d++)
        if (!dt_json_count(&j->items[d], &dims[d])) return 0;
    *ndim = j->count;
    return 1;
}

static const char *dt__ck_jstr(const dt_json *obj, const char *key) {
    const dt_json *v = dt_json_get(obj, key);
    return v && v->type == DT_JSON_STRING ? v->string : NULL;
}

static int dt__ck_u64(const char *s, uint64_t *out) {
    uint64_t v = 0;
    if (!s || !*s) return 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (UINT64_MAX - 9) / 10) return 0;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return 1;
}

static const char *dt__ck_errno(void) { return strerror(errno); }

/* XXH64 of a file's bytes, computed beside the writes: the caller's thread pushes each chunk as
   it is written, a helper thread hashes the chunks in order. Without threads
   (DT_OPT_NO_THREADS, or pthread_create failing) push hashes in place. A pushed chunk must
   stay unchanged until dt__hasher_drain (or _finish) returns. */
#define DT__HQ 64
typedef struct dt__hasher {
    dt_xxh64_state st;
#ifdef DT__OPT_THREADS
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const char *qp[DT__HQ];
    size_t qn[DT__HQ];
    int head, tail, stop, threaded;
#endif
} dt__hasher;

#ifdef DT__OPT_THREADS
static void *dt__hasher_main(void *arg) {
    dt__hasher *h = (dt__hasher *)arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        const char *p;
        size_t n;
        while (h->head == h->tail && !h->stop) pthread_cond_wait(&h->cv, &h->mu);
        if (h->head == h->tail) break; /* stopped and empty */
        p = h->qp[h->head];
        n = h->qn[h->head];
        pthread_mutex_unlock(&h->mu);
        dt_xxh64_update(&h->st, p, n);
        pthread_mutex_lock(&h->mu);
        h->head = (h->head + 1) % DT__HQ;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}
#endif

static void dt__hasher_start(dt__hasher *h) {
    dt_xxh64_init(&h->st);
#ifdef DT__OPT_THREADS
    h->head = h->tail = h->stop = h->threaded = 0;
    if (pthread_mutex_init(&h->mu, NULL) != 0) return;
    if (pthread_cond_init(&h->cv, NULL) != 0) { pthread_mutex_destroy(&h->mu); return; }
    if (pthread_create(&h->thread, NULL, dt__hasher_main, h) != 0) {
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        return;
    }
    h->threaded = 1;
#endif
}

static void dt__hasher_push(dt__hasher *h, const void *p, size_t n) {
#ifdef DT__OPT_THREADS
    if (h->threaded) {
        pthread_mutex_lock(&h->mu);
        while ((h->tail + 1) % DT__HQ == h->head) pthread_cond_wait(&h->cv, &h->mu);
        h->qp[h->tail] = (const char *)p;
        h->qn[h->tail] = n;
        h->tail = (h->tail + 1) % DT__HQ;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        return;
    }
#endif
    dt_xxh64_update(&h->st, p, n);
}

/* Waits until every pushed chunk is hashed (before a buffer is reused). */
static void dt__hasher_drain(dt__hasher *h) {
#ifdef DT__OPT_THREADS
    if (!h->threaded) return;
    pthread_mutex_lock(&h->mu);
    while (h->head != h->tail) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
#else
    (void)h;
#endif
}

static uint64_t dt__hasher_finish(dt__hasher *h) {
#ifdef DT__OPT_THREADS
    if (h->threaded) {
        pthread_mutex_lock(&h->mu);
        h->stop = 1;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->thread, NULL);
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        h->threaded = 0;
    }
#endif
    return dt_xxh64_final(&h->st);
}

/* write(2) all of buf, each chunk handed to the hasher as it goes out. */
static dt_status dt__ck_write_all(dt_ctx *ctx, int fd, const void *buf, size_t n, dt__hasher *h,
                                  const char *path, const char *fn) {
    const char *p = (const char *)buf;
    while (n > 0) {
        size_t k = n < DT__CK_CHUNK ? n : DT__CK_CHUNK, off = 0;
        if (h) dt__hasher_push(h, p, k);
        while (off < k) {
            ssize_t w = write(fd, p + off, k - off);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0)
                return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: writing %s failed: %s", fn, path,
                                        w < 0 ? dt__ck_errno() : "no progress");
            off += (size_t)w;
        }
        p += k;
        n -= k;
    }
    return DT_OK;
}

/* read(2) exactly n bytes into dst. */
static dt_status dt__ck_read_all(dt_ctx *ctx, int fd, void *dst, size_t n, const char *path, const char *fn) {
    char *p = (char *)dst;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: reading %s failed: %s", fn, path, dt__ck_errno());
        if (r == 0) return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s ends early (truncated file)", fn, path);
        p += r;
        n -= (size_t)r;
    }
    return DT_OK;
}

static int dt__ck_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY), r;
    if (fd < 0) return -1;
    r = fsync(fd);
    close(fd);
    return r;
}

/* A small file written whole, fsync'd: the manifest, latest.tmp. */
static dt_status dt__ck_write_small(dt_ctx *ctx, const char *path, const char *text, size_t n, const char *fn) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    dt_status st;
    if (fd < 0) return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot create %s: %s", fn, path, dt__ck_errno());
    st = dt__ck_write_all(ctx, fd, text, n, NULL, path, fn);
    if (!st && fsync(fd) != 0) st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: fsync of %s failed: %s", fn, path, dt__ck_errno());
    if (close(fd) != 0 && !st) st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: closing %s failed: %s", fn, path, dt__ck_errno());
    return st;
}

/* The whole of a small text file, NUL-terminated, from the ctx allocator. */
static dt_status dt__ck_read_text(dt_ctx *ctx, const char *path, size_t max, char **text, size_t *len,
                                  const char *what, const char *fn) {
    int fd = open(path, O_RDONLY);
    off_t size;
    dt_status st;
    *text = NULL;
    if (fd < 0) return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot open %s (%s): %s", fn, path, what, dt__ck_errno());
    size = lseek(fd, 0, SEEK_END);
    if (size < 0 || lseek(fd, 0, SEEK_SET) != 0) {
        close(fd);
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot size %s: %s", fn, path, dt__ck_errno());
    }
    if ((uint64_t)size > max) {
        close(fd);
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s is %lld bytes; a %s has at most %llu (foreign file?)", fn,
                                path, (long long)size, what, (unsigned long long)max);
    }
    if (!(*text = (char *)dt_alloc(ctx, (size_t)size + 1))) { close(fd); return DT_ERR_OOM; }
    st = dt__ck_read_all(ctx, fd, *text, (size_t)size, path, fn);
    close(fd);
    if (st) { dt_release(ctx, *text); *text = NULL; return st; }
    (*text)[size] = 0;
    *len = (size_t)size;
    return DT_OK;
}

/* "step_" followed by digits only (not step_N.tmp). */
static int dt__ck_step_name(const char *s, int64_t *step) {
    int64_t v = 0;
    const char *p;
    if (strncmp(s, "step_", 5) != 0 || !s[5]) return 0;
    for (p = s + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return 0;
        v = v * 10 + (*p - '0');
    }
    if (step) *step = v;
    return 1;
}

/* Removes a directory and the files in it (one level: checkpoint directories hold only files). */
static int dt__ck_rmdir(const char *path) {
    char sub[DT__CK_PATH];
    DIR *dir = opendir(path);
    struct dirent *e;
    if (!dir) return errno == ENOENT ? 0 : -1;
    while ((e = readdir(dir)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        dt__ck_fmt(sub, sizeof sub, "%s/%s", path, e->d_name);
        remove(sub);
    }
    closedir(dir);
    return remove(path);
}

static int dt__ck_is_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return 0;
    closedir(d);
    return 1;
}

/* The step directory `latest` names, trimmed; 0 if there is none. */
static int dt__ck_latest(const char *root, char *out, size_t n) {
    char path[DT__CK_PATH];
    FILE *fp;
    size_t k;
    dt__ck_fmt(path, sizeof path, "%s/latest", root);
    if (!(fp = fopen(path, "rb"))) return 0;
    k = fread(out, 1, n - 1, fp);
    fclose(fp);
    out[k] = 0;
    while (k > 0 && (out[k - 1] == '\n' || out[k - 1] == '\r' || out[k - 1] == ' ')) out[--k] = 0;
    return k > 0;
}

/* ---------------------------------------------------------------- checkpoints: what a rank holds */

enum { DT__CK_VALUE = 0, DT__CK_MASTER, DT__CK_STATE };

typedef struct dt__ck_item {
    char name[DT__CK_NAME]; /* "param/<p>", "master/<p>", "state/<p>/<slot>" */
    int kind;
    dt_param *p;            /* its box in the logical tensor: p->global_shape, p->start, t->shape */
    dt_tensor *t;           /* the live tensor */
    int write;              /* save: this rank holds the copy that gets written */
    dt_tensor tmp;          /* load, CUDA tensors only: host staging for the commit */
    int64_t covered;        /* load: elements the checkpoint's shards cover */
} dt__ck_item;

static dt_status dt__ck_items(dt_ctx *ctx, dt_params *ps, dt_optimizer *opt, dt__ck_item **out, int *n_out,
                              const char *fn) {
    dt__ck_item *it;
    int64_t cap;
    int i, k, n = 0;
    *out = NULL;
    *n_out = 0;
    if (opt) {
        if (opt->params != ps)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: opt was created for another parameter set than ps", fn);
        DT__TRY(dt__opt_check_state(opt, fn));
    }
    for (i = 0; i < ps->count; i++) {
        if (!ps->items[i]->value.data || !dt_safetensors_dtype_name(ps->items[i]->value.dtype))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: parameter \"%s\" has no data or an unknown dtype", fn,
                                    ps->items[i]->name);
    }
    /* at most 4 items per parameter: value, master, two state slots */
    if (!dt_mul_ok((int64_t)ps->count + 1, 4, &cap) || !(it = (dt__ck_item *)dt__ocalloc(ctx, cap, sizeof *it)))
        return DT_ERR_OOM;
    for (i = 0; i < ps->count; i++) {
        dt_param *p = ps->items[i];
        dt__ck_fmt(it[n].name, DT__CK_NAME, "param/%s", p->name);
        it[n].kind = DT__CK_VALUE; it[n].p = p; it[n].t = &p->value; n++;
        if (!opt) continue;
        if (opt->slots[i].master.data) {
            dt__ck_fmt(it[n].name, DT__CK_NAME, "master/%s", p->name);
            it[n].kind = DT__CK_MASTER; it[n].p = p; it[n].t = &opt->slots[i].master; n++;
        }
        for (k = 0; k < 2; k++) {
            if (!opt->slots[i].state[k].data) continue;
            dt__ck_fmt(it[n].name, DT__CK_NAME, "state/%s/%s", p->name, dt__opt_state_name(opt->desc.kind, k));
            it[n].kind = DT__CK_STATE; it[n].p = p; it[n].t = &opt->slots[i].state[k]; n++;
        }
    }
    *out = it;
    *n_out = n;
    return DT_OK;
}

static void dt__ck_items_free(dt_ctx *ctx, dt__ck_item *it, int n) {
    int i;
    if (!it) return;
    for (i = 0; i < n; i++) dt_tensor_free(ctx, &it[i].tmp);
    dt_release(ctx, it);
}

/* Every rank returns the status of the lowest failing rank: one all-reduce (MIN) of
   rank * 64 + status. The failing rank keeps its own message; the others name it. */
static dt_status dt__ck_agree(dt_ctx *ctx, dt_comm *c, dt_status st, const char *fn) {
    int size = dt__comm_size(c), rank, fr;
    double v;
    dt_status cst, fs;
    if (size == 1) return st;
    if (st && !dt_comm_ok(c)) return st; /* a timeout broke c: its message is the one to keep */
    rank = dt_comm_rank(c);
    v = st ? (double)rank * 64 + (double)st : (double)size * 64;
    if (st) { /* this rank's own message survives a failing agreement */
        char saved[DT_ERROR_MAX];
        memcpy(saved, ctx->last_error, sizeof saved);
        cst = dt_comm_allreduce_f64(c, &v, 1, DT_REDUCE_MIN);
        memcpy(ctx->last_error, saved, sizeof saved);
        ctx->last_status = st;
    } else
        cst = dt_comm_allreduce_f64(c, &v, 1, DT_REDUCE_MIN);
    if (cst) return st ? st : cst;
    if (v >= (double)size * 64) return DT_OK;
    if (st) return st;
    fr = (int)(v / 64);
    fs = (dt_status)(int)(v - (double)fr * 64);
    return dt_ctx_set_error(ctx, fs, "%s: rank %d failed (%s); its error message says why", fn, fr, dt_status_name(fs));
}

/* ---------------------------------------------------------------- checkpoints: the save plan

   Every rank publishes the list of slices it holds (name, dtype, global shape, start, shape);
   every rank then computes the same plan from the same lists: which copy of each slice gets
   written (the lowest rank's), and that the written slices tile each logical tensor. */

typedef struct dt__ck_shard {
    const char *name;       /* points into the parsed index */
    dt_dtype dtype;
    int ndim, rank, index;  /* index: position in that rank's list */
    int64_t gshape[DT_MAX_DIMS], start[DT_MAX_DIMS], shape[DT_MAX_DIMS];
    int writer;
} dt__ck_shard;

static void dt__ck_index(dt_strbuf *b, const dt__ck_item *it, int n) {
    int i;
    dt_strbuf_str(b, "[");
    for (i = 0; i < n; i++) {
        const dt__ck_item *x = &it[i];
        dt_strbuf_str(b, i ? ",\n[" : "[");
        dt_strbuf_json(b, x->name);
        dt_strbuf_str(b, ",\"");
        dt_strbuf_str(b, dt_safetensors_dtype_name(x->t->dtype));
        dt_strbuf_str(b, "\",");
        dt__ck_dims(b, x->t->ndim, x->p->global_shape);
        dt_strbuf_str(b, ",");
        dt__ck_dims(b, x->t->ndim, x->p->start);
        dt_strbuf_str(b, ",");
        dt__ck_dims(b, x->t->ndim, x->t->shape);
        dt_strbuf_str(b, "]");
    }
    dt_strbuf_str(b, "]");
}

/* All ranks' index texts: text of rank r at *all + r * *stride (NUL-terminated). The first
   all-reduce also agrees on failure (a length of -1). */
static dt_status dt__ck_gather(dt_ctx *ctx, dt_comm *c, const dt_strbuf *mine, dt_status st_in, char **all,
                               size_t *stride, const char *fn) {
    int size = dt__comm_size(c), rank = c ? dt_comm_rank(c) : 0, r;
    double *lens, maxlen = 0;
    dt_tensor in, out;
    dt_tensor_desc td;
    int64_t total;
    dt_status st = DT_OK;
    *all = NULL;
    if (size == 1) {
        if (st_in) return st_in;
        if (!(*all = (char *)dt_alloc(ctx, mine->len + 1))) return DT_ERR_OOM;
        memcpy(*all, mine->text, mine->len + 1);
        *stride = mine->len + 1;
        return DT_OK;
    }
    if (st_in && !dt_comm_ok(c)) return st_in; /* a timeout broke c: keep its message */
    lens = (double *)dt__ocalloc(ctx, size, sizeof(double));
    if (!lens) return DT_ERR_OOM; /* the other ranks then time out in the all-reduce, naming this rank */
    lens[rank] = st_in ? -1.0 : (double)mine->len;
    st = dt_comm_allreduce_f64(c, lens, size, DT_REDUCE_SUM);
    for (r = 0; !st && r < size; r++) {
        if (lens[r] < 0)
            st = st_in ? st_in : dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: rank %d failed before writing; its error "
                                                  "message says why", fn, r);
        if (lens[r] > maxlen) maxlen = lens[r];
    }
    dt_release(ctx, lens);
    if (st) return st;
    /* below 2^53 the length is exact in the double and its cast to an integer defined */
    if (!(maxlen < 9007199254740992.0) || !dt_mul_ok((int64_t)maxlen + 1, size, &total))
        return dt_ctx_set_error(ctx, DT_ERR_OOM, "%s: %d index texts of up to %.0f bytes do not fit in memory", fn,
                                size, maxlen);
    *stride = (size_t)maxlen + 1;
    memset(&in, 0, sizeof in);
    memset(&out, 0, sizeof out);
    memset(&td, 0, sizeof td);
    td.dtype = DT_U8;
    td.shape[0] = (int64_t)*stride;
    st = dt_tensor_create(ctx, &in, &td);
    td.shape[0] = total;
    if (!st) st = dt_tensor_create(ctx, &out, &td);
    if (!st) {
        memcpy(in.data, mine->text, mine->len);
        st = dt_comm_allgather(c, &out, &in);
    }
    dt_tensor_free(ctx, &in);
    if (st) { dt_tensor_free(ctx, &out); return st; }
    *all = (char *)dt_alloc(ctx, (size_t)total); /* fits: out holds as many bytes */
    if (*all) memcpy(*all, out.data, (size_t)total);
    dt_tensor_free(ctx, &out);
    return *all ? DT_OK : DT_ERR_OOM;
}

static int dt__ck_shard_cmp(const void *a, const void *b) {
    const dt__ck_shard *x = (const dt__ck_shard *)a, *y = (const dt__ck_shard *)b;
    int c = strcmp(x->name, y->name), d;
    if (c) return c;
    for (d = 0; d < x->ndim && d < y->ndim; d++) {
        if (x->start[d] != y->start[d]) return x->start[d] < y->start[d] ? -1 : 1;
        if (x->shape[d] != y->shape[d]) return x->shape[d] < y->shape[d] ? -1 : 1;
    }
    return x->rank - y->rank;
}

static int dt__ck_same_box(const dt__ck_shard *a, const dt__ck_shard *b) {
    int d;
    for (d = 0; d < a->ndim; d++)
        if (a->start[d] != b->start[d] || a->shape[d] != b->shape[d]) return 0;
    return 1;
}

static int dt__ck_overlap(const dt__ck_shard *a, const dt__ck_shard *b) {
    int d;
    for (d = 0; d < a->ndim; d++)
        if (a->start[d] >= b->start[d] + b->shape[d] || b->start[d] >= a->start[d] + a->shape[d]) return 0;
    return 1;
}

/* Parses every rank's index into shards (sorted by name, box, rank) and marks the writers. */
static dt_status dt__ck_plan(dt_ctx *ctx, const char *all, size_t stride, int size, dt_json **roots,
                             dt__ck_shard **out, int *n_out, const char *fn) {
    dt__ck_shard *sh;
    size_t total = 0;
    int r, i, j, k, n = 0;
    char a[128], b[128];
    *out = NULL;
    for (r = 0; r < size; r++) {
        const char *text = all + (size_t)r * stride;
        DT__TRY(dt_json_parse(ctx, &roots[r], text, strlen(text)));
        if (roots[r]->type != DT_JSON_ARRAY)
            return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: rank %d sent a malformed index", fn, r);
        total += (size_t)roots[r]->count;
        if (total > (size_t)INT_MAX)
            return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: the ranks hold more than %d slices together", fn, INT_MAX);
    }
    if (!(sh = (dt__ck_shard *)dt__ocalloc(ctx, (int64_t)total, sizeof *sh))) return DT_ERR_OOM;
    *out = sh;
    for (r = 0; r < size; r++) {
        for (i = 0; i < roots[r]->count; i++) {
            const dt_json *e = &roots[r]->items[i];
            int n1, n2, n3;
            if (e->type != DT_JSON_ARRAY || e->count != 5 || e->items[0].type != DT_JSON_STRING ||
                e->items[1].type != DT_JSON_STRING || !dt__ck_dims_from(&e->items[2], &n1, sh[n].gshape) ||
                !dt__ck_dims_from(&e->items[3], &n2, sh[n].start) || !dt__ck_dims_from(&e->items[4], &n3, sh[n].shape) ||
                n1 != n2 || n1 != n3)
                return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: rank %d sent a malformed index entry %d", fn, r, i);
            sh[n].name = e->items[0].string;
            sh[n].dtype = dt_safetensors_dtype_from(e->items[1].string);
            sh[n].ndim = n1;
            sh[n].rank = r;
            sh[n].index = i;
            n++;
        }
    }
    *n_out = n;
    qsort(sh, (size_t)n, sizeof *sh, dt__ck_shard_cmp);
    for (i = 0; i < n; i = j) {
        /* -1 (a shape whose size overflows: it came from another rank) fails the fit check below */
        int64_t covered = 0, numel = dt_shape_numel(sh[i].ndim, sh[i].gshape);
        for (j = i; j < n && strcmp(sh[j].name, sh[i].name) == 0; j++) {
            const dt__ck_shard *x = &sh[j];
            if (x->dtype != sh[i].dtype || x->ndim != sh[i].ndim ||
                memcmp(x->gshape, sh[i].gshape, sizeof(int64_t) * (size_t)x->ndim) != 0) {
                dt_tensor ta, tb;
                memset(&ta, 0, sizeof ta); memset(&tb, 0, sizeof tb);
                ta.ndim = sh[i].ndim; tb.ndim = x->ndim;
                memcpy(ta.shape, sh[i].gshape, sizeof ta.shape); memcpy(tb.shape, x->gshape, sizeof tb.shape);
                return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: \"%s\" is %s with global shape %s on rank %d but %s "
                                        "with global shape %s on rank %d", fn, x->name, dt_safetensors_dtype_name(sh[i].dtype),
                                        dt_shape_str(&ta, a, sizeof a), sh[i].rank, dt_safetensors_dtype_name(x->dtype),
                                        dt_shape_str(&tb, b, sizeof b), x->rank);
            }
            sh[j].writer = j == i || !dt__ck_same_box(&sh[j], &sh[j - 1]) ? 1 : 0;
            if (sh[j].writer) {
                int64_t part = dt_shape_numel(sh[j].ndim, sh[j].shape);
                for (k = i; k < j; k++)
                    if (sh[k].writer && dt__ck_overlap(&sh[k], &sh[j]))
                        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: \"%s\": the slices of rank %d and rank %d "
                                                "overlap without being equal", fn, sh[j].name, sh[k].rank, sh[j].rank);
                if (numel < 0 || part < 0 || part > numel - covered) /* overflow-free: covered <= numel */
                    return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: \"%s\": the slice of rank %d does not fit in the "
                                            "global shape (or its size overflows)", fn, sh[j].name, sh[j].rank);
                covered += part;
            }
        }
        if (covered != numel)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: the ranks' slices of \"%s\" cover %lld of its %lld "
                                    "elements (a shard is missing)", fn, sh[i].name, (long long)covered,
                                    (long long)numel);
    }
    return DT_OK;
}

/* ---------------------------------------------------------------- checkpoints: writing */

static dt_status dt__ck_write_tensor(dt_ctx *ctx, int fd, const dt_tensor *t, dt__hasher *h, const char *path,
                                     const char *fn) {
    dt_tensor host;
    dt_status st;
    if (t->device != DT_CUDA_DEVICE) return dt__ck_write_all(ctx, fd, t->data, dt_tensor_bytes(t), h, path, fn);
    DT__TRY(dt_tensor_create_like(ctx, &host, t, DT_DTYPE_DEFAULT, DT_CPU)); /* through a host copy */
    st = dt_tensor_copy(ctx, &host, t);
    if (!st) st = dt__ck_write_all(ctx, fd, host.data, dt_tensor_bytes(&host), h, path, fn);
    dt__hasher_drain(h); /* the copy is about to go */
    dt_tensor_free(ctx, &host);
    return st;
}

/* This rank's safetensors file: the items it writes, in order, hashed as they go out.
   *created = 1 once the file exists (the caller removes it when the save fails). */
static dt_status dt__ck_write_file(dt_ctx *ctx, const dt_checkpoint_desc *desc, const char *path,
                                   const dt__ck_item *it, int n, int rank, int64_t step, uint64_t *bytes,
                                   uint64_t *hash, int *created, const char *fn) {
    dt_strbuf hb;
    dt__hasher h;
    int i, k, fd, nw = 0;
    char rank_s[24], step_s[24];
    const char *meta[6];
    const dt_tensor **ts;
    const char **names;
    dt_status st = DT_OK;
    memset(&hb, 0, sizeof hb);
    hb.ctx = ctx;
    ts = (const dt_tensor **)dt__ocalloc(ctx, n, sizeof *ts);
    names = (const char **)dt__ocalloc(ctx, n, sizeof *names);
    if (!ts || !names) st = DT_ERR_OOM;
    for (i = 0; !st && i < n; i++) {
        if (!it[i].write) continue;
        ts[nw] = it[i].t;
        names[nw++] = it[i].name;
    }
    snprintf(rank_s, sizeof rank_s, "%d", rank);
    snprintf(step_s, sizeof step_s, "%lld", (long long)step);
    meta[0] = "format"; meta[1] = "dt-checkpoint-rank"; meta[2] = "rank"; meta[3] = rank_s;
    meta[4] = "step"; meta[5] = step_s;
    /* the length, the header and (in *bytes) the size the file will have */
    if (!st) st = dt_safetensors_prefix(ctx, &hb, bytes, ts, names, nw, meta, 3);
    dt_release(ctx, ts);
    dt_release(ctx, names);
    if (st) { dt_strbuf_free(&hb); return st; }
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd < 0) {
        dt_release(ctx, hb.text);
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot create %s: %s", fn, path, dt__ck_errno());
    }
    *created = 1;
    dt__hasher_start(&h); /* hashes beside the writes and the fsync */
    st = dt__ck_write_all(ctx, fd, hb.text, hb.len, &h, path, fn);
    for (i = 0, k = 0; !st && i < n; i++) {
        if (!it[i].write) continue;
        st = dt__ck_write_tensor(ctx, fd, it[i].t, &h, path, fn);
        if (!st && desc->hook) desc->hook("tensor", k, desc->hook_user);
        k++;
    }
    if (!st && fsync(fd) != 0) st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: fsync of %s failed: %s", fn, path, dt__ck_errno());
    if (close(fd) != 0 && !st) st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: closing %s failed: %s", fn, path, dt__ck_errno());
    *hash = dt__hasher_finish(&h);
    dt_release(ctx, hb.text);
    return st;
}

static const char *dt__ck_mode_name(dt_loss_scale_mode m) {
    return m == DT_LOSS_SCALE_DYNAMIC ? "dynamic" : m == DT_LOSS_SCALE_STATIC ? "static" : "none";
}

static void dt__ck_num(dt_strbuf *b, const char *key, double v) {
    char num[64];
    dt_strbuf_json(b, key);
    snprintf(num, sizeof num, ":%.17g", v);
    dt_strbuf_str(b, num);
}

static void dt__ck_u64s(dt_strbuf *b, const char *key, uint64_t v) {
    char num[64];
    dt_strbuf_json(b, key);
    snprintf(num, sizeof num, ":\"%llu\"", (unsigned long long)v);
    dt_strbuf_str(b, num);
}

/* manifest.json: everything a loader needs, the rank files' sizes and checksums last. */
static void dt__ck_manifest(dt_strbuf *m, const dt_checkpoint_desc *desc, int world, int64_t step,
                            const dt_train_state *ts, const dt_optimizer *opt, const dt__ck_shard *sh, int n_sh,
                            const double *files) {
    int i, j, r, first;
    char num[128];
    dt_strbuf_str(m, "{\"format\":\"dt-checkpoint\",\"version\":1,\n");
    dt__ck_num(m, "step", (double)step);
    dt_strbuf_str(m, ",");
    dt__ck_num(m, "world_size", (double)world);
    dt_strbuf_str(m, ",\"layout\":");
    dt_strbuf_json(m, desc->layout ? desc->layout : "");
    dt_strbuf_str(m, ",\n\"train_state\":{");
    dt__ck_u64s(m, "step", (uint64_t)(ts ? ts->step : step));
    dt_strbuf_str(m, ",");
    dt__ck_u64s(m, "rng_seed", ts ? ts->rng_seed : 0);
    dt_strbuf_str(m, ",");
    dt__ck_u64s(m, "rng_offset", ts ? ts->rng_offset : 0);
    dt_strbuf_str(m, ",");
    dt__ck_u64s(m, "data_cursor", (uint64_t)(ts ? ts->data_cursor : 0));
    dt_strbuf_str(m, ",\"user\":{");
    for (i = 0; ts && i < ts->n_kv && i < DT_CKPT_MAX_KV; i++) {
        if (i) dt_strbuf_str(m, ",");
        dt_strbuf_json(m, ts->keys[i]);
        dt_strbuf_str(m, ":");
        dt_strbuf_json(m, ts->values[i]);
    }
    dt_strbuf_str(m, "}},\n\"optimizer\":");
    if (!opt) {
        dt_strbuf_str(m, "null");
    } else {
        dt_strbuf_str(m, "{\"kind\":\"");
        dt_strbuf_str(m, dt__opt_kind_name(opt->desc.kind));
        dt_strbuf_str(m, "\",");
        dt__ck_u64s(m, "step", (uint64_t)opt->step);
        dt_strbuf_str(m, ",");
        dt__ck_num(m, "lr", opt->desc.lr);
        dt_strbuf_str(m, ",");
        dt__ck_num(m, "weight_decay", opt->desc.weight_decay);
        dt_strbuf_str(m, ",\"loss_scaler\":{\"mode\":\"");
        dt_strbuf_str(m, dt__ck_mode_name(opt->scaler.mode));
        dt_strbuf_str(m, "\",");
        dt__ck_num(m, "scale", opt->scaler.scale);
        dt_strbuf_str(m, ",");
        dt__ck_num(m, "growth_tracker", (double)opt->scaler.growth_tracker);
        dt_strbuf_str(m, ",");
        dt__ck_u64s(m, "skipped", (uint64_t)opt->scaler.skipped);
        dt_strbuf_str(m, "}}");
    }
    dt_strbuf_str(m, ",\n\"files\":[");
    for (r = 0; r < world; r++) {
        uint64_t h = ((uint64_t)files[3 * r + 1] << 32) | (uint64_t)files[3 * r + 2];
        snprintf(num, sizeof num, "%s\n{\"rank\":%d,\"file\":\"rank_%05d.safetensors\",\"bytes\":%.0f,\"xxh64\":\"%016llx\"}",
                 r ? "," : "", r, r, files[3 * r], (unsigned long long)h);
        dt_strbuf_str(m, num);
    }
    dt_strbuf_str(m, "],\n\"tensors\":{");
    for (i = 0, first = 1; i < n_sh; i = j) {
        dt_strbuf_str(m, first ? "\n" : ",\n");
        first = 0;
        dt_strbuf_json(m, sh[i].name);
        dt_strbuf_str(m, ":{\"dtype\":\"");
        dt_strbuf_str(m, dt_safetensors_dtype_name(sh[i].dtype));
        dt_strbuf_str(m, "\",\"global_shape\":");
        dt__ck_dims(m, sh[i].ndim, sh[i].gshape);
        dt_strbuf_str(m, ",\"shards\":[");
        for (j = i, r = 0; j < n_sh && strcmp(sh[j].name, sh[i].name) == 0; j++) {
            if (!sh[j].writer) continue;
            snprintf(num, sizeof num, "%s{\"rank\":%d,\"start\":", r++ ? "," : "", sh[j].rank);
            dt_strbuf_str(m, num);
            dt__ck_dims(m, sh[j].ndim, sh[j].start);
            dt_strbuf_str(m, ",\"shape\":");
            dt__ck_dims(m, sh[j].ndim, sh[j].shape);
            dt_strbuf_str(m, "}");
        }
        dt_strbuf_str(m, "]}");
    }
    dt_strbuf_str(m, "\n}}\n");
}

/* The newest complete step directory other than `skip`, into out; 0 if none. */
static int dt__ck_newest_other(const char *root, const char *skip, char *out, size_t n) {
    DIR *dir = opendir(root);
    struct dirent *e;
    int64_t best = -1, s;
    if (!dir) return 0;
    while ((e = readdir(dir)) != NULL)
        if (dt__ck_step_name(e->d_name, &s) && strcmp(e->d_name, skip) != 0 && s > best) {
            best = s;
            dt__ck_fmt(out, n, "%s", e->d_name);
        }
    closedir(dir);
    return best >= 0;
}

/* `latest` := name (tmp + fsync + rename + fsync of the directory). A failure before the
   rename removes latest.tmp: `latest` still names what it named. */
static dt_status dt__ck_set_latest(dt_ctx *ctx, const char *root, const char *name, const char *fn) {
    char tmp[DT__CK_PATH], path[DT__CK_PATH], text[DT__CK_NAME];
    dt_status st;
    dt__ck_fmt(tmp, sizeof tmp, "%s/latest.tmp", root);
    dt__ck_fmt(path, sizeof path, "%s/latest", root);
    dt__ck_fmt(text, sizeof text, "%s\n", name);
    st = dt__ck_write_small(ctx, tmp, text, strlen(text), fn);
    if (!st && rename(tmp, path) != 0)
        st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: renaming %s to %s failed: %s", fn, tmp, path, dt__ck_errno());
    if (st) {
        remove(tmp);
        return st;
    }
    if (dt__ck_fsync_path(root) != 0)
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: fsync of directory %s failed: %s", fn, root, dt__ck_errno());
    return DT_OK;
}

/* Keeps `name` and the keep-1 newest other step directories; removes the rest and stale
   step_*.tmp directories. Best effort: the checkpoint is already safe. */
static void dt__ck_prune(dt_ctx *ctx, const char *root, const char *name, int keep) {
    DIR *dir;
    struct dirent *e;
    int64_t *steps = NULL, s, n = 0, cap = 0, i, best;
    int kept;
    char path[DT__CK_PATH], latest[DT__CK_NAME];
    if (!(dir = opendir(root))) return;
    while ((e = readdir(dir)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 4 && strncmp(e->d_name, "step_", 5) == 0 && strcmp(e->d_name + len - 4, ".tmp") == 0) {
            dt__ck_fmt(path, sizeof path, "%s/%s", root, e->d_name);
            dt__ck_rmdir(path);
            continue;
        }
        if (keep < 0 || !dt__ck_step_name(e->d_name, &s) || strcmp(e->d_name, name) == 0) continue;
        /* out of memory: stop listing (best effort; what is listed is still pruned) */
        if (dt_grow(ctx, (void **)&steps, &cap, n + 1, sizeof *steps, "dt_checkpoint_save: step directories")) break;
        steps[n++] = s;
    }
    closedir(dir);
    if (!dt__ck_latest(root, latest, sizeof latest)) latest[0] = 0;
    /* newest first: a selection is enough, the lists are short */
    for (kept = 1; kept < keep && n > 0; kept++) {
        best = 0;
        for (i = 1; i < n; i++)
            if (steps[i] > steps[best]) best = i;
        steps[best] = steps[--n];
    }
    for (i = 0; i < n; i++) {
        dt__ck_fmt(path, sizeof path, "%s/step_%08lld", root, (long long)steps[i]);
        if (strcmp(path + strlen(root) + 1, latest) != 0) dt__ck_rmdir(path);
    }
    dt_release(ctx, steps);
}

/* Rank 0, once every rank file is durable: manifest, directory rename, latest, prune. */
static dt_status dt__ck_publish(dt_ctx *ctx, const dt_checkpoint_desc *desc, const char *root, const char *name,
                                const char *tmpdir, const dt_strbuf *manifest, const char *fn) {
    char path[DT__CK_PATH], latest[DT__CK_NAME], other[DT__CK_NAME];
    dt__ck_fmt(path, sizeof path, "%s/manifest.json", tmpdir);
    DT__TRY(dt__ck_write_small(ctx, path, manifest->text, manifest->len, fn));
    if (dt__ck_fsync_path(tmpdir) != 0)
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: fsync of directory %s failed: %s", fn, tmpdir, dt__ck_errno());
    if (desc->hook) desc->hook("manifest", 0, desc->hook_user);
    dt__ck_fmt(path, sizeof path, "%s/%s", root, name);
    if (dt__ck_is_dir(path)) {
        /* the same step saved again: `latest` must not name the directory while it is replaced */
        if (dt__ck_latest(root, latest, sizeof latest) && strcmp(latest, name) == 0) {
            if (dt__ck_newest_other(root, name, other, sizeof other)) {
                DT__TRY(dt__ck_set_latest(ctx, root, other, fn));
            } else {
                dt__ck_fmt(other, sizeof other, "%s/latest", root);
                remove(other);
            }
        }
        if (dt__ck_rmdir(path) != 0)
            return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: %s exists and cannot be removed: %s", fn, path, dt__ck_errno());
    }
    if (rename(tmpdir, path) != 0)
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: renaming %s to %s failed: %s", fn, tmpdir, path, dt__ck_errno());
    if (dt__ck_fsync_path(root) != 0)
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: fsync of directory %s failed: %s", fn, root, dt__ck_errno());
    if (desc->hook) desc->hook("renamed", 0, desc->hook_user);
    DT__TRY(dt__ck_set_latest(ctx, root, name, fn));
    if (desc->hook) desc->hook("latest", 0, desc->hook_user);
    dt__ck_prune(ctx, root, name, desc->keep == 0 ? 3 : desc->keep);
    return DT_OK;
}

/* Rank 0: root exists, step_N.tmp/ is empty and new. */
static dt_status dt__ck_prepare(dt_ctx *ctx, const char *root, const char *tmpdir, const char *fn) {
    if (mkdir(root, 0777) != 0 && errno != EEXIST)
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot create directory %s: %s", fn, root, dt__ck_errno());
    if (!dt__ck_is_dir(root))
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: desc.dir = %s is not a directory", fn, root);
    if (dt__ck_rmdir(tmpdir) != 0)
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot remove the stale %s: %s", fn, tmpdir, dt__ck_errno());
    if (mkdir(tmpdir, 0777) != 0)
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot create directory %s: %s", fn, tmpdir, dt__ck_errno());
    return DT_OK;
}

DT_API dt_status dt_checkpoint_save(dt_ctx *ctx, dt_params *ps, dt_optimizer *opt, const dt_train_state *state,
                                    const dt_checkpoint_desc *desc) {
    const char *fn = "dt_checkpoint_save";
    dt_comm *c;
    dt__ck_item *it = NULL;
    dt__ck_shard *sh = NULL;
    dt_json **roots = NULL;
    dt_strbuf index, man;
    char *all = NULL, name[DT__CK_NAME], tmpdir[DT__CK_PATH], path[DT__CK_PATH];
    size_t stride = 0;
    double *files = NULL;
    uint64_t bytes = 0, hash = 0;
    int64_t step;
    int rank, size, n_it = 0, n_sh = 0, i, made_tmp = 0, made_file = 0;
    dt_status st = DT_OK;
    if (!ctx) return DT_ERR_ARG;
    if (!desc || !desc->dir || !desc->dir[0] || !ps)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL or empty", fn, !desc ? "desc" : !ps ? "ps" : "desc.dir");
    c = desc->comm;
    rank = c ? dt_comm_rank(c) : 0;
    size = dt__comm_size(c);
#ifdef DT_CUDA
    if (opt) DT__TRY(dt__opt_settle(opt, fn)); /* the step and scale the device holds (a broken device: this rank) */
#endif
    step = state ? state->step : opt ? opt->step : 0;
    if (step < 0) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: state.step = %lld; expected >= 0", fn, (long long)step);
    if (strlen(desc->dir) + 64 >= DT__CK_PATH)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.dir is %zu bytes long; at most %d", fn, strlen(desc->dir),
                                DT__CK_PATH - 64);
    dt__ck_fmt(name, sizeof name, "step_%08lld", (long long)step);
    dt__ck_fmt(tmpdir, sizeof tmpdir, "%s/%s.tmp", desc->dir, name);
    memset(&index, 0, sizeof index);
    memset(&man, 0, sizeof man);
    index.ctx = man.ctx = ctx;
    /* 1. what each rank holds, and who writes what (every rank computes the same plan) */
    st = dt__ck_items(ctx, ps, opt, &it, &n_it, fn);
    if (!st) {
        dt__ck_index(&index, it, n_it);
        if (index.failed) st = DT_ERR_OOM;
    }
    st = dt__ck_gather(ctx, c, &index, st, &all, &stride, fn);
    if (!st) {
        roots = (dt_json **)dt__ocalloc(ctx, size, sizeof(dt_json *));
        if (!roots) st = DT_ERR_OOM;
    }
    if (!st) st = dt__ck_plan(ctx, all, stride, size, roots, &sh, &n_sh, fn);
    if (!st && !(files = (double *)dt__ocalloc(ctx, size, 3 * sizeof(double)))) st = DT_ERR_OOM; /* bytes, hash */
    for (i = 0; !st && i < n_sh; i++)
        if (sh[i].rank == rank) it[sh[i].index].write = sh[i].writer;
    /* 2. rank 0 makes the temporary directory */
    if (!st && rank == 0) {
        st = dt__ck_prepare(ctx, desc->dir, tmpdir, fn);
        made_tmp = !st;
    }
    st = dt__ck_agree(ctx, c, st, fn);
    /* 3. every rank writes and fsyncs its file */
    dt__ck_fmt(path, sizeof path, "%s/rank_%05d.safetensors", tmpdir, rank);
    if (!st) {
        st = dt__ck_write_file(ctx, desc, path, it, n_it, rank, step, &bytes, &hash, &made_file, fn);
        if (!st && desc->hook) desc->hook("rank_file", rank, desc->hook_user);
    }
    st = dt__ck_agree(ctx, c, st, fn);
    if (!st) { /* sizes and checksums to rank 0: a 64-bit hash travels as two exact 32-bit halves */
        files[3 * rank] = (double)bytes;
        files[3 * rank + 1] = (double)(hash >> 32);
        files[3 * rank + 2] = (double)(hash & 0xffffffffu);
        if (size > 1) st = dt_comm_allreduce_f64(c, files, 3 * size, DT_REDUCE_SUM);
    }
    /* 4. rank 0: manifest, rename, latest, prune */
    if (!st && rank == 0) {
        dt__ck_manifest(&man, desc, size, step, state, opt, sh, n_sh, files);
        st = man.failed ? DT_ERR_OOM : dt__ck_publish(ctx, desc, desc->dir, name, tmpdir, &man, fn);
    }
    st = dt__ck_agree(ctx, c, st, fn);
    /* 5. a failed save (a full disk on any rank, a failed collective) leaves no debris: every
       rank removes the file it made, rank 0 the directory it made (with anything still in it).
       Every rank has closed its file before the agreement above, so nothing writes there any
       more. After the rename both are gone already: the complete step directory stays. */
    if (st) {
        if (made_file) remove(path);
        if (made_tmp) dt__ck_rmdir(tmpdir);
    }
    for (i = 0; roots && i < size; i++) dt_json_free(ctx, roots[i]);
    dt_release(ctx, roots);
    dt_release(ctx, sh);
    dt_release(ctx, all);
    dt_release(ctx, files);
    dt_release(ctx, index.text);
    dt_release(ctx, man.text);
    dt__ck_items_free(ctx, it, n_it);
    return st;
}

/* ---------------------------------------------------------------- checkpoints: loading */

typedef struct dt__ck_piece {     /* part of one item that one shard of one file provides */
    int item, file;
    const char *src;                                  /* the entry's name in the rank file */
    dt_dtype sdtype;
    int64_t sstart[DT_MAX_DIMS], sshape[DT_MAX_DIMS]; /* the shard's box in the logical tensor */
    int64_t lo[DT_MAX_DIMS], hi[DT_MAX_DIMS];         /* the part the item needs (global coords) */
    const char *data;                                 /* the shard's bytes, in the file's mapping */
} dt__ck_piece;

typedef struct dt__ck_file {
    char name[64];
    uint64_t bytes, hash;
    int needed;
    void *map;                    /* the whole file: mapped read-only, or read into memory */
    int owned;                    /* 1: map is a dt_alloc buffer (DT_OPT_NO_MMAP, mmap failed) */
} dt__ck_file;

typedef struct dt__ck_load {
    char dir[DT__CK_PATH];        /* the step directory */
    char *text;                   /* manifest.json */
    dt_json *man;
    const dt_json *tensors;
    int world;
    dt__ck_file *files;
    dt__ck_item *it;
    int n_it;
    dt__ck_piece *pc;
    int n_pc;
    int64_t cap_pc;               /* dt_grow's capacity */
    int64_t opt_step;             /* the scalars, committed with the tensors */
    dt_loss_scaler scaler;
    dt_train_state ts;
} dt__ck_load;

static dt_status dt__ck_resolve(dt_ctx *ctx, const dt_checkpoint_desc *desc, char *out, const char *fn) {
    char name[DT__CK_NAME], path[DT__CK_PATH];
    if (!dt__ck_is_dir(desc->dir))
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: desc.dir = %s is not a directory (no checkpoint there)", fn,
                                desc->dir);
    if (desc->step_dir) {
        if (!desc->step_dir[0] || strlen(desc->step_dir) >= DT__CK_NAME)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.step_dir = \"%s\"; expected a step directory name such "
                                    "as step_00000100", fn, desc->step_dir);
        dt__ck_fmt(name, sizeof name, "%s", desc->step_dir);
    } else {
        dt__ck_fmt(path, sizeof path, "%s/latest", desc->dir);
        if (!dt__ck_latest(desc->dir, name, sizeof name)) {
            FILE *fp = fopen(path, "rb");
            if (fp) fclose(fp);
            return dt_ctx_set_error(ctx, fp ? DT_ERR_FORMAT : DT_ERR_IO, "%s: %s %s (no checkpoint in %s)", fn, path,
                                    fp ? "is empty" : "does not exist", desc->dir);
        }
        if (!dt__ck_step_name(name, NULL))
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s holds \"%.40s\", not a step directory name (a foreign "
                                    "file?)", fn, path, name);
    }
    dt__ck_fmt(out, DT__CK_PATH, "%s/%s", desc->dir, name);
    if (!dt__ck_is_dir(out))
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: checkpoint directory %s does not exist", fn, out);
    return DT_OK;
}

static dt_status dt__ck_parse_manifest(dt_ctx *ctx, dt__ck_load *L, const char *fn) {
    char path[DT__CK_PATH], why[DT_ERROR_MAX];
    const dt_json *files, *f;
    const char *fmt, *h;
    int64_t v;
    size_t len = 0;
    int r, k;
    dt__ck_fmt(path, sizeof path, "%s/manifest.json", L->dir);
    DT__TRY(dt__ck_read_text(ctx, path, (size_t)1 << 30, &L->text, &len, "checkpoint manifest", fn));
    if (dt_json_parse(ctx, &L->man, L->text, len)) {
        snprintf(why, sizeof why, "%s", dt_ctx_error(ctx));
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s is not JSON, so not a dt checkpoint manifest (%s)", fn, path,
                                why);
    }
    fmt = dt__ck_jstr(L->man, "format");
    if (!fmt || strcmp(fmt, "dt-checkpoint") != 0)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s has format \"%s\"; not a dt checkpoint (expected "
                                "\"dt-checkpoint\")", fn, path, fmt ? fmt : "(none)");
    if (!dt_json_count(dt_json_get(L->man, "version"), &v) || v < 1)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s has no valid version", fn, path);
    if (v > DT__CK_VERSION)
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: %s is format version %lld; this dt reads up to %d", fn,
                                path, (long long)v, DT__CK_VERSION);
    if (!dt_json_count(dt_json_get(L->man, "world_size"), &v) || v < 1 || v > (1 << 24))
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s has no valid world_size", fn, path);
    L->world = (int)v;
    files = dt_json_get(L->man, "files");
    L->tensors = dt_json_get(L->man, "tensors");
    if (!files || files->type != DT_JSON_ARRAY || files->count != L->world || !L->tensors ||
        L->tensors->type != DT_JSON_OBJECT)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s lacks a files array of world_size (%d) entries or a "
                                "tensors object", fn, path, L->world);
    if (!(L->files = (dt__ck_file *)dt__ocalloc(ctx, L->world, sizeof(dt__ck_file)))) return DT_ERR_OOM;
    for (r = 0; r < L->world; r++) {
        const char *name;
        f = &files->items[r];
        name = dt__ck_jstr(f, "file");
        h = dt__ck_jstr(f, "xxh64");
        if (!dt_json_count(dt_json_get(f, "rank"), &v) || v != r || !name || strlen(name) >= sizeof L->files[r].name ||
            strchr(name, '/') || !dt_json_count(dt_json_get(f, "bytes"), &v) || !h || strlen(h) != 16)
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: files[%d] needs rank %d, a file name, bytes and a "
                                    "16-digit xxh64", fn, path, r, r);
        memcpy(L->files[r].name, name, strlen(name) + 1);
        L->files[r].bytes = (uint64_t)v;
        for (k = 0; k < 16; k++) {
            int c = h[k], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (d < 0) return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: files[%d].xxh64 is not hex", fn, path, r);
            L->files[r].hash = (L->files[r].hash << 4) | (uint64_t)d;
        }
    }
    return DT_OK;
}

static const dt_json *dt__ck_find(const dt__ck_load *L, const char *prefix, const char *pname) {
    char key[DT__CK_NAME];
    dt__ck_fmt(key, sizeof key, "%s%s", prefix, pname);
    return dt_json_get(L->tensors, key);
}

static dt_status dt__ck_add_piece(dt_ctx *ctx, dt__ck_load *L, const dt__ck_piece *p) {
    if (L->n_pc == INT_MAX) /* n_pc is an int */
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "dt_checkpoint_load: %s: more than %d shard pieces (corrupt "
                                "manifest?)", L->dir, INT_MAX);
    DT__TRY(dt_grow(ctx, (void **)&L->pc, &L->cap_pc, (int64_t)L->n_pc + 1, sizeof *L->pc,
                     "dt_checkpoint_load: shard pieces"));
    L->pc[L->n_pc++] = *p;
    return DT_OK;
}

static const char *dt__ck_shape_str(int ndim, const int64_t *dims, char *buf, size_t n) {
    dt_tensor t;
    memset(&t, 0, sizeof t);
    t.ndim = ndim;
    memcpy(t.shape, dims, sizeof(int64_t) * (size_t)ndim);
    return dt_shape_str(&t, buf, n);
}

/* Where item i comes from: its source tensor in the manifest, checked against the item, and
   the pieces of the shards that overlap the item's box. */
static dt_status dt__ck_target(dt_ctx *ctx, dt__ck_load *L, int i, const char *fn) {
    dt__ck_item *x = &L->it[i];
    const dt_param *p = x->p;
    const dt_json *src, *e, *m, *shards;
    dt__ck_piece pc;
    dt_dtype sd;
    int64_t gshape[DT_MAX_DIMS], v;
    char a[128], b[128];
    int nd = x->t->ndim, gnd, k, d, n1, n2, first, j;
    if (x->kind == DT__CK_STATE) {
        src = dt_json_get(L->tensors, x->name);
    } else {
        e = dt__ck_find(L, "param/", p->name);
        m = dt__ck_find(L, "master/", p->name);
        if (x->kind == DT__CK_VALUE) src = e && dt_safetensors_dtype_from(dt__ck_jstr(e, "dtype")) == x->t->dtype ? e : m ? m : e;
        else src = m ? m : e;
    }
    if (!src)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s has no tensor \"%s\" (the parameters or the optimizer do "
                                "not match the checkpoint)", fn, L->dir, x->name);
    sd = dt_safetensors_dtype_from(dt__ck_jstr(src, "dtype"));
    shards = dt_json_get(src, "shards");
    if (sd == DT_DTYPE_COUNT || !dt__ck_dims_from(dt_json_get(src, "global_shape"), &gnd, gshape) || !shards ||
        shards->type != DT_JSON_ARRAY)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: tensor \"%s\" lacks a valid dtype, global_shape or shards",
                                fn, L->dir, src->key);
    if (sd != x->t->dtype && !(dt__ck_float(sd) && dt__ck_float(x->t->dtype)))
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: \"%s\" is %s in the checkpoint; the tensor here is %s", fn,
                                src->key, dt_dtype_name(sd), dt_dtype_name(x->t->dtype));
    if (gnd != nd || memcmp(gshape, p->global_shape, sizeof(int64_t) * (size_t)nd) != 0)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: \"%s\" has global shape %s in the checkpoint; \"%s\" here has "
                                "global shape %s", fn, src->key, dt__ck_shape_str(gnd, gshape, a, sizeof a), p->name,
                                dt__ck_shape_str(nd, p->global_shape, b, sizeof b));
    first = L->n_pc;
    for (k = 0; k < shards->count; k++) {
        const dt_json *s = &shards->items[k];
        int64_t vol = 1;
        memset(&pc, 0, sizeof pc);
        if (!dt_json_count(dt_json_get(s, "rank"), &v) || v >= L->world ||
            !dt__ck_dims_from(dt_json_get(s, "start"), &n1, pc.sstart) ||
            !dt__ck_dims_from(dt_json_get(s, "shape"), &n2, pc.sshape) || n1 != nd || n2 != nd)
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: shard %d of \"%s\" is malformed", fn, L->dir, k, src->key);
        for (d = 0; d < nd; d++) {
            if (pc.sstart[d] + pc.sshape[d] > gshape[d])
                return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: shard %d of \"%s\" lies outside the global shape", fn,
                                        L->dir, k, src->key);
            pc.lo[d] = pc.sstart[d] > p->start[d] ? pc.sstart[d] : p->start[d];
            pc.hi[d] = pc.sstart[d] + pc.sshape[d] < p->start[d] + x->t->shape[d] ? pc.sstart[d] + pc.sshape[d]
                                                                                   : p->start[d] + x->t->shape[d];
            vol *= pc.hi[d] > pc.lo[d] ? pc.hi[d] - pc.lo[d] : 0;
        }
        if (vol == 0) continue;
        /* vol <= numel (the overlap with this rank's box); more than numel in all means shards
           overlap, found below, and stopping here keeps the sum from overflowing */
        if (vol > x->t->numel - x->covered)
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: the shards of \"%s\" cover more than the %lld "
                                    "elements this rank needs (overlapping shards: corrupt manifest)", fn, L->dir,
                                    src->key, (long long)x->t->numel);
        pc.item = i;
        pc.file = (int)v;
        pc.src = src->key;
        pc.sdtype = sd;
        x->covered += vol;
        L->files[pc.file].needed = 1;
        DT__TRY(dt__ck_add_piece(ctx, L, &pc));
    }
    /* covered == numel means complete only if no two pieces overlap (a corrupt manifest could
       list a slice twice and another not at all, and nothing else writes the tensor) */
    for (k = first; k < L->n_pc; k++)
        for (j = k + 1; j < L->n_pc; j++) {
            int apart = 0;
            for (d = 0; d < nd; d++)
                apart |= L->pc[k].hi[d] <= L->pc[j].lo[d] || L->pc[j].hi[d] <= L->pc[k].lo[d];
            if (!apart)
                return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: two shards of \"%s\" overlap (corrupt manifest)", fn,
                                        L->dir, src->key);
        }
    if (x->covered != x->t->numel)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: the shards of \"%s\" cover %lld of the %lld elements this "
                                "rank needs", fn, L->dir, src->key, (long long)x->covered, (long long)x->t->numel);
    return DT_OK;
}

static dt_status dt__ck_parse_scalars(dt_ctx *ctx, dt__ck_load *L, const dt_optimizer *opt, const char *fn) {
    const dt_json *ts = dt_json_get(L->man, "train_state"), *user, *o, *sc, *scale;
    const char *kind, *mode;
    uint64_t u, cursor, skipped;
    int64_t v;
    int i;
    if (!ts || ts->type != DT_JSON_OBJECT || !dt__ck_u64(dt__ck_jstr(ts, "step"), &u) ||
        !dt__ck_u64(dt__ck_jstr(ts, "rng_seed"), &L->ts.rng_seed) ||
        !dt__ck_u64(dt__ck_jstr(ts, "rng_offset"), &L->ts.rng_offset) ||
        !dt__ck_u64(dt__ck_jstr(ts, "data_cursor"), &cursor) || u > (uint64_t)INT64_MAX || cursor > (uint64_t)INT64_MAX)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: the manifest's train_state is malformed", fn, L->dir);
    L->ts.step = (int64_t)u;
    L->ts.data_cursor = (int64_t)cursor;
    user = dt_json_get(ts, "user");
    for (i = 0; user && user->type == DT_JSON_OBJECT && i < user->count; i++) {
        const dt_json *kv = &user->items[i];
        if (kv->type != DT_JSON_STRING || i >= DT_CKPT_MAX_KV || strlen(kv->key) >= DT_CKPT_KEY_MAX ||
            strlen(kv->string) >= DT_CKPT_VALUE_MAX)
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: train_state.user entry %d is not a string that fits "
                                    "dt_train_state", fn, L->dir, i);
        memcpy(L->ts.keys[i], kv->key, strlen(kv->key) + 1);
        memcpy(L->ts.values[i], kv->string, strlen(kv->string) + 1);
        L->ts.n_kv = i + 1;
    }
    if (!opt) return DT_OK;
    o = dt_json_get(L->man, "optimizer");
    if (!o || o->type != DT_JSON_OBJECT)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s holds no optimizer state; pass opt = NULL to load the "
                                "parameters only", fn, L->dir);
    kind = dt__ck_jstr(o, "kind");
    if (!kind || strcmp(kind, dt__opt_kind_name(opt->desc.kind)) != 0)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s holds the state of a %s optimizer; opt is %s", fn, L->dir,
                                kind ? kind : "(unnamed)", dt__opt_kind_name(opt->desc.kind));
    sc = dt_json_get(o, "loss_scaler");
    mode = dt__ck_jstr(sc, "mode");
    scale = dt_json_get(sc, "scale");
    L->scaler = opt->scaler;
    /* every number lands in a typed field: out of its range is a corrupt manifest, not a cast */
    if (!dt__ck_u64(dt__ck_jstr(o, "step"), &u) || u > (uint64_t)INT64_MAX || !mode || !scale ||
        scale->type != DT_JSON_NUMBER || !dt__scale_ok(scale->number) ||
        !dt_json_count(dt_json_get(sc, "growth_tracker"), &v) || v > INT_MAX ||
        !dt__ck_u64(dt__ck_jstr(sc, "skipped"), &skipped) || skipped > (uint64_t)INT64_MAX)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: the manifest's optimizer entry is malformed (step and "
                                "skipped <= 2^63 - 1, loss scale in [%g, %g], growth_tracker <= %d)", fn, L->dir,
                                (double)FLT_MIN, (double)FLT_MAX, INT_MAX);
    L->opt_step = (int64_t)u;
    L->scaler.skipped = (int64_t)skipped;
    if (strcmp(mode, dt__ck_mode_name(opt->scaler.mode)) == 0) { /* else opt keeps its own, new, settings */
        L->scaler.scale = scale->number;
        L->scaler.growth_tracker = (int)v;
    } else {
        L->scaler.skipped = opt->scaler.skipped;
    }
    return DT_OK;
}

/* Converts n elements (f32 / bf16 / f16 among themselves; other dtypes only to themselves).
   src is in a file's mapping, where entries are packed (an f32 entry after an odd-length bf16
   one is 2 bytes off alignment): its elements are loaded with memcpy. That is why this loop is
   not dt_convert, whose typed loads would be undefined on such a pointer; the rounding is the
   same (dt_f32_to_bf16 / dt_f32_to_f16, which dt_convert runs). dst is a tensor. */
static void dt__ck_convert(void *dst, dt_dtype dt, const void *src, dt_dtype sdt, int64_t n) {
    const char *s = (const char *)src;
    int64_t i;
    if (dt == sdt) { memcpy(dst, src, (size_t)n * dt_dtype_size(dt)); return; }
    for (i = 0; i < n; i++) {
        float x;
        uint16_t h;
        if (sdt == DT_F32) {
            memcpy(&x, s + 4 * i, 4);
        } else {
            memcpy(&h, s + 2 * i, 2);
            x = sdt == DT_BF16 ? dt_bf16_to_f32(h) : dt_f16_to_f32(h);
        }
        if (dt == DT_F32) ((float *)dst)[i] = x;
        else if (dt == DT_BF16) ((uint16_t *)dst)[i] = dt_f32_to_bf16(x);
        else ((uint16_t *)dst)[i] = dt_f32_to_f16(x);
    }
}

/* Copies the piece's box out of the shard's bytes (row-major, the shard's shape) into dst
   (row-major, the item's shape, the item's dtype), one innermost run at a time; the whole
   shard in one go when it is exactly the item. */
static void dt__ck_copy_piece(const dt__ck_item *x, const dt__ck_piece *pc, void *dst) {
    const int nd = x->t->ndim;
    const size_t ss = dt_dtype_size(pc->sdtype), ds = dt_dtype_size(x->t->dtype);
    const char *src = pc->data;
    int64_t idx[DT_MAX_DIMS], rows = 1, r, run = nd ? pc->hi[nd - 1] - pc->lo[nd - 1] : 1; /* a scalar: one */
    int d, same = 1;
    for (d = 0; d < nd; d++) same &= pc->sstart[d] == x->p->start[d] && pc->sshape[d] == x->t->shape[d];
    if (same) {
        dt__ck_convert(dst, x->t->dtype, src, pc->sdtype, x->t->numel);
        return;
    }
    for (d = 0; d < nd; d++) idx[d] = pc->lo[d];
    for (d = 0; d < nd - 1; d++) rows *= pc->hi[d] - pc->lo[d];
    for (r = 0; r < rows; r++) {
        int64_t so = 0, dof = 0;
        for (d = 0; d < nd; d++) {
            so = so * pc->sshape[d] + (idx[d] - pc->sstart[d]);
            dof = dof * x->t->shape[d] + (idx[d] - x->p->start[d]);
        }
        dt__ck_convert((char *)dst + (size_t)dof * ds, x->t->dtype, src + (size_t)so * ss, pc->sdtype, run);
        for (d = nd - 2; d >= 0; d--) { /* next row of the box */
            if (++idx[d] < pc->hi[d]) break;
            idx[d] = pc->lo[d];
        }
    }
}

/* Maps rank file f and checks it before anything is copied out of it: its size and XXH64
   against the manifest, its safetensors header, and that every piece this rank needs from it
   is there with the manifest's dtype and shape (pc->data then points at its bytes).
   Mapping instead of reading: the bytes go from the page cache to the live tensors in one copy
   (at the commit), with no temporaries to allocate and fault in; the hash reads the mapping at
   memory speed. The mapping stays until the load ends (dt__ck_unmap). A file truncated by
   someone else after the size check would fault on access (SIGBUS); the size check guards the
   rest. Under DT_OPT_NO_MMAP, or when mmap fails, the file is read into a buffer instead. */
static dt_status dt__ck_map_file(dt_ctx *ctx, dt__ck_load *L, int f, const char *fn) {
    char path[DT__CK_PATH];
    const unsigned char *m;
    dt_st_file hdr;
    uint64_t hl = 0, got;
    struct stat sb;
    int fd, i, k;
    dt_status st = DT_OK;
    dt__ck_fmt(path, sizeof path, "%s/%s", L->dir, L->files[f].name);
    if ((fd = open(path, O_RDONLY)) < 0)
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot open %s: %s", fn, path, dt__ck_errno());
    if (fstat(fd, &sb) != 0)
        st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot size %s: %s", fn, path, dt__ck_errno());
    else if ((uint64_t)sb.st_size != L->files[f].bytes)
        st = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s is %lld bytes; the manifest says %llu (truncated or "
                              "replaced file)", fn, path, (long long)sb.st_size, (unsigned long long)L->files[f].bytes);
    else if (sb.st_size < 10 || (uint64_t)sb.st_size != (uint64_t)(size_t)sb.st_size)
        st = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s is %lld bytes; a rank file has an 8-byte length and a "
                              "header (corrupt or foreign file)", fn, path, (long long)sb.st_size);
    if (!st) {
#ifndef DT_OPT_NO_MMAP
        void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map != MAP_FAILED) L->files[f].map = map;
#endif
        if (!L->files[f].map) { /* read it whole instead */
            if (!(L->files[f].map = dt_alloc(ctx, (size_t)sb.st_size))) st = DT_ERR_OOM;
            else L->files[f].owned = 1;
            if (!st) st = dt__ck_read_all(ctx, fd, L->files[f].map, (size_t)sb.st_size, path, fn);
        }
    }
    close(fd); /* a mapping keeps the file */
    if (st) return st;
    m = (const unsigned char *)L->files[f].map;
    got = dt_xxh64(m, (size_t)sb.st_size);
    if (got != L->files[f].hash)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: checksum mismatch, xxh64 %016llx but the manifest says "
                                "%016llx (corrupt file)", fn, path, (unsigned long long)got,
                                (unsigned long long)L->files[f].hash);
    memset(&hdr, 0, sizeof hdr);
    st = dt_safetensors_header_len(ctx, &hl, m, (uint64_t)sb.st_size, path);
    if (!st)
        st = dt_safetensors_parse(ctx, &hdr, (const char *)m + 8, (size_t)hl, (uint64_t)sb.st_size - 8 - hl, path);
    if (st) {
        char why[DT_ERROR_MAX]; /* DT_ERR_FORMAT naming the file; said as this load's error */
        snprintf(why, sizeof why, "%s", dt_ctx_error(ctx));
        return dt_ctx_set_error(ctx, st, "%s: %s", fn, why);
    }
    for (k = 0; !st && k < L->n_pc; k++) {
        dt__ck_piece *pc = &L->pc[k];
        const dt_st_entry *e = NULL;
        if (pc->file != f) continue;
        for (i = 0; i < hdr.n_entries && !e; i++)
            if (strcmp(hdr.entries[i].name, pc->src) == 0) e = &hdr.entries[i];
        if (!e)
            st = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s has no entry \"%s\", which the manifest places there", fn,
                                  path, pc->src);
        else if (e->dtype != pc->sdtype || e->ndim != L->it[pc->item].t->ndim ||
                 memcmp(e->shape, pc->sshape, sizeof(int64_t) * (size_t)e->ndim) != 0)
            st = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: entry \"%s\" is %s of %d dims; the manifest's shard "
                                  "differs (corrupt checkpoint)", fn, path, e->name, dt_safetensors_dtype_name(e->dtype),
                                  e->ndim);
        else
            pc->data = (const char *)m + 8 + hl + e->begin;
    }
    dt_safetensors_close(ctx, &hdr);
    return st;
}

static void dt__ck_unmap(dt_ctx *ctx, dt__ck_load *L) {
    int f;
    for (f = 0; L->files && f < L->world; f++) {
        if (L->files[f].owned) dt_release(ctx, L->files[f].map);
        else if (L->files[f].map) munmap(L->files[f].map, (size_t)L->files[f].bytes);
    }
}

/* A host tensor like t, not zero-filled: the file's bytes overwrite every element (coverage
   was checked). */
static dt_status dt__ck_tmp(dt_ctx *ctx, dt_tensor *tmp, const dt_tensor *t) {
    int d;
    memset(tmp, 0, sizeof *tmp);
    tmp->dtype = t->dtype;
    tmp->device = DT_CPU;
    tmp->ndim = t->ndim;
    for (d = 0; d < t->ndim; d++) tmp->shape[d] = t->shape[d];
    tmp->numel = t->numel;
    tmp->data = dt_alloc(ctx, dt_tensor_bytes(t) ? dt_tensor_bytes(t) : 1);
    tmp->owns = 1;
    return tmp->data ? DT_OK : DT_ERR_OOM;
}

/* Everything this rank needs, mapped and validated; nothing live is touched. */
static dt_status dt__ck_load_local(dt_ctx *ctx, const dt_checkpoint_desc *desc, dt_params *ps, dt_optimizer *opt,
                                   dt__ck_load *L, const char *fn) {
    int i, f;
    DT__TRY(dt__ck_resolve(ctx, desc, L->dir, fn));
    DT__TRY(dt__ck_parse_manifest(ctx, L, fn));
    DT__TRY(dt__ck_items(ctx, ps, opt, &L->it, &L->n_it, fn));
    DT__TRY(dt__ck_parse_scalars(ctx, L, opt, fn));
    for (i = 0; i < L->n_it; i++) DT__TRY(dt__ck_target(ctx, L, i, fn));
    for (i = 0; i < L->n_it; i++)
        if (L->it[i].t->device == DT_CUDA_DEVICE) DT__TRY(dt__ck_tmp(ctx, &L->it[i].tmp, L->it[i].t));
    for (f = 0; f < L->world; f++)
        if (L->files[f].needed) DT__TRY(dt__ck_map_file(ctx, L, f, fn));
    return DT_OK;
}

/* The only part that changes anything, reached when every rank has checked everything: each
   piece is copied from its file's mapping into the live tensor (views into it stay valid).
   Only a CUDA tensor's host-to-device copy can fail; then the load stops there. */
static dt_status dt__ck_commit(dt_ctx *ctx, dt__ck_load *L, dt_optimizer *opt, dt_train_state *state,
                               const char *fn) {
    char why[DT_ERROR_MAX];
    int i, k, done = 0;
    dt_status st;
    for (k = 0; k < L->n_pc; k++) {
        const dt__ck_item *x = &L->it[L->pc[k].item];
        dt__ck_copy_piece(x, &L->pc[k], x->tmp.data ? x->tmp.data : x->t->data);
    }
    for (i = 0; i < L->n_it; i++) {
        if (!L->it[i].tmp.data) continue;
        /* the copy's own status: DT_ERR_CUDA for a failed cudaMemcpy, as the save's device copy */
        if ((st = dt_tensor_copy(ctx, L->it[i].t, &L->it[i].tmp)) != DT_OK) {
            dt__ck_fmt(why, sizeof why, "%s", dt_ctx_error(ctx));
            return dt_ctx_set_error(ctx, st, "%s: copying \"%s\" to the device failed (%s); the load is "
                                    "incomplete: %d device tensors before it hold the checkpoint's values, it and the "
                                    "rest do not", fn, L->it[i].name, why, done);
        }
        done++;
    }
    if (opt) {
        opt->step = L->opt_step;
        opt->scaler = L->scaler;
        opt->cuda_pending = 0; /* the loaded step and scale replace the device's at the next step */
        opt->cuda_dirty = opt->cuda_tab.data != NULL;
    }
    if (state) *state = L->ts;
    return DT_OK;
}

DT_API dt_status dt__checkpoint_peek(dt_ctx *ctx, struct dt__ck_load *L, const dt_param *p, void *dst) {
    int i, k;
    for (i = 0; L && i < L->n_it; i++)
        if (L->it[i].p == p && L->it[i].kind == DT__CK_VALUE) break;
    if (!L || !dst || i == L->n_it)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt__checkpoint_peek: parameter \"%s\" is not one this load fills",
                                p ? p->name : "(null)");
    for (k = 0; k < L->n_pc; k++)
        if (L->pc[k].item == i) dt__ck_copy_piece(&L->it[i], &L->pc[k], dst);
    return DT_OK;
}

DT_API int dt__checkpoint_has(const struct dt__ck_load *L, const char *name, const char **dir) {
    if (dir) *dir = L ? L->dir : "";
    return L && name && dt_json_get(L->tensors, name) != NULL;
}

DT_API dt_status dt_checkpoint_load(dt_ctx *ctx, dt_params *ps, dt_optimizer *opt, dt_train_state *state,
                                    const dt_checkpoint_desc *desc) {
    return dt__checkpoint_load_checked(ctx, ps, opt, state, desc, NULL, NULL);
}

DT_API dt_status dt__checkpoint_load_checked(dt_ctx *ctx, dt_params *ps, dt_optimizer *opt, dt_train_state *state,
                                             const dt_checkpoint_desc *desc, dt__ck_check_fn check, void *user) {
    const char *fn = "dt_checkpoint_load";
    dt__ck_load *L;
    dt_status st;
    if (!ctx) return DT_ERR_ARG;
    if (!desc || !desc->dir || !desc->dir[0] || !ps)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL or empty", fn, !desc ? "desc" : !ps ? "ps" : "desc.dir");
    if (strlen(desc->dir) + DT__CK_NAME + 64 >= DT__CK_PATH)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.dir is %zu bytes long; at most %d", fn, strlen(desc->dir),
                                DT__CK_PATH - DT__CK_NAME - 64);
    if (!(L = (dt__ck_load *)dt_alloc(ctx, sizeof *L))) return DT_ERR_OOM;
    memset(L, 0, sizeof *L);
    st = dt__ck_load_local(ctx, desc, ps, opt, L, fn);
    st = dt__ck_agree(ctx, desc->comm, st, fn);
    if (!st && check) {
        st = check(ctx, L, user);
        st = dt__ck_agree(ctx, desc->comm, st, fn);
    }
    if (!st) {
        st = dt__ck_commit(ctx, L, opt, state, fn);
        st = dt__ck_agree(ctx, desc->comm, st, fn); /* a failed device copy anywhere fails everywhere */
    }
    dt__ck_unmap(ctx, L);
    dt__ck_items_free(ctx, L->it, L->n_it);
    dt_release(ctx, L->pc);
    dt_release(ctx, L->files);
    dt_json_free(ctx, L->man);
    dt_release(ctx, L->text);
    dt_release(ctx, L);
    return st;
}

#else /* no POSIX file system calls: checkpoints are not available */

DT_API dt_status dt_checkpoint_save(dt_ctx *ctx, dt_params *ps, dt_optimizer *opt, const dt_train_state *state,
                                    const dt_checkpoint_desc *desc) {
    (void)desc; (void)ps; (void)opt; (void)state;
    if (!ctx) return DT_ERR_ARG;
    return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "dt_checkpoint_save: needs a POSIX system (open, fsync, rename)");
}

DT_API dt_status dt_checkpoint_load(dt_ctx *ctx, dt_params *ps, dt_optimizer *opt, dt_train_state *state,
                                    const dt_checkpoint_desc *desc) {
    (void)desc; (void)ps; (void)opt; (void)state;
    if (!ctx) return DT_ERR_ARG;
    return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "dt_checkpoint_load: needs a POSIX system (open, rename)");
}

DT_API dt_status dt__checkpoint_load_checked(dt_ctx *ctx, dt_params *ps, dt_optimizer *opt, dt_train_state *state,
                                             const dt_checkpoint_desc *desc, dt__ck_check_fn check, void *user) {
    (void)check; (void)user;
    return dt_checkpoint_load(ctx, ps, opt, state, desc);
}

DT_API dt_status dt__checkpoint_peek(dt_ctx *ctx, struct dt__ck_load *L, const dt_param *p, void *dst) {
    (void)L; (void)p; (void)dst;
    return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "dt__checkpoint_peek: needs a POSIX system");
}

DT_API int dt__checkpoint_has(const struct dt__ck_load *L, const char *name, const char **dir) {
    (void)L; (void)name;
    if (dir) *dir = "";
    return 0;
}

#endif /* DT__OPT_POSIX */

/* ==== >>memory: the allocator's high-water mark =============================================== */

DT_API size_t dt_peak_bytes(const dt_ctx *ctx) { return ctx ? ctx->bytes_peak : 0; }
DT_API void dt_reset_peak_bytes(dt_ctx *ctx) {
    if (ctx) ctx->bytes_peak = ctx->bytes_in_use;
}

#ifdef __cplusplus
}
#endif
#endif /* DT_OPT_IMPLEMENTATION_DONE */
#endif /* DT_OPT_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the dt authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
