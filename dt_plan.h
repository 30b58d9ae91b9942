/* dt_plan.h - the planner for the dt toolkit: one cost model of a transformer training step for
   every layout dt can run, fed by a profile measured on the machine, and a search over layouts;
   the same for a recommendation model's embedding tables (where each goes: >>dlrm).
   v0.1, MIT licence

   The lesson. Trying layouts costs a cluster hours; counting FLOPs misses everything that is not a
   GEMM at peak. What works (Proteus, Charon, Megatron's and DeepSpeed's autotuners) is to measure
   the pieces once, where they will run, and add them up per layout:

       measure once (dt_plan_profile_measure, every rank at once, as the step will run them)
         one transformer block's forward and backward at each (tp, cp, sp) split the layouts give
         it, at the smallest and largest micro-batch they give it (time is affine in the rows);
         a MoE model's MoE layer at each (tp, cp, sp, ep); the embedding and the head; the
         optimizer per parameter; each collective as latency + bytes / bandwidth per group
         size; how much of a posted collective hides
                                         |
       model each layout (dt_plan_predict)        step = pipeline(makespan of the micro-batches,
         per micro-batch: blocks x (F + B + recompute)  dt_pp_schedule_simulate with each
         + embedding / head on the first / last stage   stage's own F and B)
         + data-parallel sync not hidden + optimizer    memory = weights, grads, master, optimizer
                                         |               state per ZeRO stage + activations of the
       search (dt_plan_search)                          micro-batches in flight + transients
         every valid layout of the world, ranked by predicted tokens / s, within a memory budget

   The block it times is examples/gpt's block, op for op (dt_tensor.h's and dt_parallel.h's tp and
   cp ops at the split's shapes, including their collectives), so its tp and cp communication is
   measured, not modelled (Ulysses' all-to-alls too, and a MoE layer's over ep, timed apart on
   rows its router spreads about evenly: a run's routing is its data's and its trained router's,
   which dt_plan_model.expert_load brings in from a run's printed loads). What is modelled: the
   data-parallel sync (DDP buckets during the backward, ZeRO's reduce-scatters and gathers), the
   pipeline's sends and bubble, activation offload's copies, the optimizer step, and memory, from
   the same accounting as examples/gpt's activations and dt_zero_memory.

   Contents (each marker finds this line, its declarations and its implementation):
       >>model           what is trained: dt_plan_model; what runs it: dt_plan_layout, its check
       >>profile         the machine's measured pieces: dt_plan_profile, measure, save, load
       >>predict         one layout's step time and memory: dt_plan_predict
       >>search          every valid layout ranked: dt_plan_search, dt_plan_format
       >>paper           a cluster you do not have: a machine's published figures instead of measurements
       >>dlrm            a DLRM's table plans (with dt_embed.h): measure, predict, search
       >>implementation  where the implementation starts

   API in one breath:
       dt_plan_layout_check    a layout against a model and a world size (named errors)
       dt_plan_profile_measure collective over the world: measures what the model's layouts need
       dt_plan_profile_save / _load   the profile as JSON (a bad file is named, field and value)
       dt_plan_profile_broadcast      one rank's profile to every rank (plan from the same bytes)
       dt_plan_predict         step time split (compute, exposed comm, bubble, optimizer), memory
       dt_plan_search          all valid layouts of a world size, best first
       dt_plan_format          the top n as a table
       dt_plan_machine_load / dt_plan_profile_paper   a machine file (docs/machines) made into a profile
       dt_plan_machine_measure / _save   a CUDA machine's figures measured on its GPUs, and as a file
       dt_plan_model_flops     a step's FLOPs per token in Megatron's count (for MFU)
       dt_plan_dlrm_measure / _predict / _search / _format / _plan_of   the tables' plans (>>dlrm)
       dt_plan_dlrm_profile_save / _load / _broadcast   their profile as a file

   Do this:
       #define DT_PLAN_IMPLEMENTATION    (or DT_IMPLEMENTATION for every dt header)
   before you include this file in *one* C or C++ file to create the implementation.
   Include order: dt_tensor.h, dt_comm.h, dt_opt.h, dt_parallel.h, (dt_embed.h,) dt_plan.h. Why a
   header of its own: a training program needs none of it, and it needs all of dt_parallel.h
   (layouts, the tp and cp ops it times, the pipeline simulator); it sits on top, as a tool. The
   >>dlrm section exists when dt_embed.h is included before it.

   Memory: from the ctx allocator; the profile is a plain struct (no pointers), copied freely.
   Errors: a dt_status and dt_ctx_error naming the argument, the value and what was expected.
   Threads: a profile is read-only to predict and search; they write the ctx's error and allocate
   from it, so each thread needs its own ctx.

   The licence (MIT) is at the end of this file.
*/
#ifndef DT_PLAN_H
#define DT_PLAN_H

#if !defined(DT_PARALLEL_H)
#error "dt_plan.h needs dt_tensor.h, dt_comm.h, dt_opt.h and dt_parallel.h included before it"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ==== >>model: what is trained and how it is laid out ============================================

   A GPT: layers x (attention of heads (kv_heads for K and V), MLP 4 x width), a vocab-parallel
   embedding tied to the head, learned positions; AdamW with clipping; activations in f32 (the
   CPU path's), parameters in dtype with f32 masters. The layout is examples/gpt's options. */

typedef struct dt_plan_model {
    int layers, width, heads;
    int kv_heads;          /* 0 = heads */
    int64_t vocab;         /* the padded vocab (the logits' columns): 256 for bytes, 50304 for GPT-2 */
    int64_t seq;           /* context length T */
    int64_t batch;         /* global batch, sequences per step */
    dt_dtype dtype;        /* parameters: DT_F32 (0 = f32) or DT_BF16 */
    int ffn;               /* the MLP's hidden width: 0 = 4 x width (examples/gpt's) */
    int gated;             /* 1: a gated MLP (SwiGLU: gate and up C x ffn, down ffn x C; Llama's) */
    /* mixture of experts (examples/gpt --moe-*, dt_parallel.h's >>moe); measured profiles only */
    int experts;           /* E experts in each MoE block's MLP: 0 = dense */
    int top_k;             /* experts a token visits: 0 = 2 */
    int moe_every;         /* blocks moe_every - 1, 2 moe_every - 1, ... are MoE: 0 = 1 (every block) */
    int moe_shared;        /* 1: the dense MLP stays beside the experts (a shared expert) */
    double capacity;       /* an expert keeps at most ceil(capacity T k / E) of a sequence's assignments; 0 = dropless */
    dt_moe_balance balance; /* 0 = aux (its gradient needs the step's every forward first: GPipe or one micro-batch) */
    /* Where the trained router sends the rows, which the profile cannot measure (it routes through a
       router at its initial scale: every expert about as likely, nothing over capacity). For each
       ep dividing E (ascending: 1, ..., E), w: the busiest ep rank's rows (its E / ep experts' kept
       assignments; rank r holds experts r E / ep ..) over its uniform share, the mean over steps of
       each step's busiest (which rank it is moves; the layer waits for it each time). [divisors of
       E], every MoE block alike, or [MoE blocks][divisors of E] in block order, as examples/gpt
       prints them after a run ("moe: --moe-load ..."). A skewed router at a capacity drops rows (ep 1's
       w, the share kept, below 1) and loads one ep rank above the others (w above 1). A MoE block's
       time gains (w - 1) k times its dense MLP's at those rows. NULL = 1 each. The caller's:
       measure, load, broadcast and paper leave it NULL (set it on the profile you predict from); the
       file does not keep it. */
    const double *expert_load;
    int n_expert_load;
} dt_plan_model;

typedef enum dt_plan_recompute {
    DT_PLAN_RECOMPUTE_NONE = 0,
    DT_PLAN_RECOMPUTE_FULL,       /* keep each block's input, run its forward again in the backward */
    DT_PLAN_RECOMPUTE_SELECTIVE,  /* attention and gelu again (Korthikanti et al.) */
    DT_PLAN_RECOMPUTE_GEMM_LAST,  /* keep the GEMMs' outputs, layernorm and gelu again; attention keeps lse */
    DT_PLAN_RECOMPUTE_COUNT
} dt_plan_recompute;

typedef struct dt_plan_layout {
    int dp, tp, pp, cp;    /* dp 0 = world / (tp cp pp); tp, pp, cp 0 = 1 */
    int zero;              /* 0 DDP, 1-3 ZeRO (1 at most with pp > 1) */
    int micro;             /* micro-batches per step, 0 = 1 */
    int sp;                /* sequence parallel over tp */
    dt_pp_kind schedule;   /* pp > 1: 0 = 1F1B */
    int chunks;            /* model chunks per stage: 2 for interleaved, else 1 (0 = so) */
    dt_plan_recompute recompute;
    int ulysses;           /* cp > 1: Ulysses' all-to-alls instead of the ring (examples/gpt --cp-kind ulysses): the
                              heads split over cp, attention keeps [T, T] of its H / (tp cp) heads (on paper:
                              flash attention, nothing [T, T] kept, as dt runs it on CUDA in bf16) */
    double offload;        /* 0 .. 1: the first offload x blocks of each chunk keep their activations in host
                              memory (examples/gpt --offload-activations): the device holds two slots (three on
                              CUDA) instead of them, each copied out after its forward and back before its
                              backward: at the measured copy rate in line (a measured profile: the CPU), or on
                              paper on a side stream at the machine's h2d_bw beside the compute */
    int ep;                /* expert-parallel ranks, inside dp x cp (examples/gpt --ep): 0 = 1; a MoE model's only */
} dt_plan_layout;

/* The layout's fields resolved (zeros to their defaults) and checked against the model and a
   world of `world` ranks as examples/gpt checks them: DT_ERR_ARG naming the field, its value and
   what was expected. out may be NULL; it may be layout itself. */
DT_API dt_status dt_plan_layout_check(dt_ctx *ctx, const dt_plan_model *m, int world, const dt_plan_layout *layout,
                                      dt_plan_layout *out);
/* "dp 2 tp 1 pp 2 cp 1, 1f1b, micro 4, zero 1, sp 0, recompute none" ("cp 2 ulysses" for Ulysses,
   ", offload 0.5" when offloading): examples/gpt's options */
DT_API const char *dt_plan_layout_string(const dt_plan_layout *l, char *buf, size_t n);
DT_API const char *dt_plan_recompute_name(dt_plan_recompute r); /* "none", "full", "selective", "gemm-last" */

/* ==== >>profile: the machine's measured pieces ====================================================

   Every rank measures at once, so what ranks sharing cores or a network do to each other is in
   the figures. A split's times are the slowest rank's median, at two micro-batch sizes (rows =
   sequences x T / cp), read between them as a line. Collectives: time = alpha + bytes x beta for
   groups of `size` consecutive ranks (cross: the group spans hosts), all groups of that size at
   once; bytes is the whole buffer (an all-gather's output, a reduce-scatter's input). */

#define DT_PLAN_MAX_SPLITS 128
#define DT_PLAN_MAX_COLLS 128
#define DT_PLAN_MAX_PIPES 48
#define DT_PLAN_MAX_MOES 64

typedef struct dt_plan_split {
    int tp, cp, sp, lse;         /* lse: attention keeps the logsumexp, not [T, T] (the ring at cp > 1, or gemm-last) */
    int ulysses;                 /* cp > 1 by Ulysses' all-to-alls (lse 0: [T, T] of H / (tp cp) heads kept) */
    int64_t rows[2];             /* the two sizes measured (equal: one) */
    double fwd[2], bwd[2];       /* one block, its tp / cp collectives included, seconds */
    double attn[2];              /* of fwd: attention (selective recompute runs it again) */
    double cheap[2];             /* of fwd: gelu (selective), and the two layernorms (gemm-last) */
    double gelu[2];
    double embed_fwd[2], embed_bwd[2]; /* the first stage's embedding */
    double head_fwd[2], head_bwd[2];   /* the last stage's ln_f, logits and cross entropy */
    double extra[2];             /* bytes the ops hold above their tensors at their peak: the ctx's
                                    scratch (GEMM packing, attention's rows), the ring's K/V, the
                                    comm's pool for tp / cp collectives */
} dt_plan_split;

/* A MoE model's MoE layer at a (tp, cp, sp, ep) split: examples/gpt's moe_fwd / moe_bwd (routing,
   the all-to-alls over ep, the experts, the sum over tp) on rows of a router at its initial scale
   (every expert about as likely), and the dense MLP it takes the place of, at the same rows. */
typedef struct dt_plan_moe {
    int tp, cp, sp, ep;
    int64_t rows[2];             /* a micro-batch's rows, b T / cp (under sp the layer takes them all) */
    double fwd[2], bwd[2];       /* the MoE layer, seconds */
    double mlp_fwd[2], mlp_bwd[2]; /* the dense MLP (fc, GELU, projection, their tp collectives), seconds */
    double acts[2];              /* bytes one micro-batch's dt_moe_acts holds (the fullest rank's) */
    double layer[2];             /* bytes the dt_moe holds itself (its exchange buffers: one set a layer) */
    double extra[2];             /* bytes its ops hold above these at their peak */
} dt_plan_moe;

typedef enum dt_plan_coll_kind {
    DT_PLAN_ALLREDUCE = 0, DT_PLAN_ALLGATHER, DT_PLAN_REDUCE_SCATTER, DT_PLAN_SENDRECV, DT_PLAN_COLL_KINDS
} dt_plan_coll_kind;

typedef struct dt_plan_coll {
    dt_plan_coll_kind kind;
    int size, cross;
    double alpha, beta;          /* seconds, seconds per byte */
} dt_plan_coll;

/* A pipeline's message as dt_pp_run delivers it between stages that compute: MPI moves a message
   only while both ends are inside MPI (no progress thread), so its delay is measured with the
   runtime itself, stages spinning for the block times between its tests, and read as the `comm`
   of dt_pp_schedule_simulate that reproduces the run's makespan. At two message sizes, per schedule:
   where a message waits for both ends to call MPI depends on what the stages do meanwhile (GPipe's
   back-to-back forwards hide none of it in the run that a constant delay hides in the simulation). */
typedef struct dt_plan_pipe {
    int pp;
    dt_pp_kind kind;             /* the schedule it ran: GPipe, 1F1B or ZB-H1 (interleaved takes 1F1B's) */
    double bytes[2], delay[2];
} dt_plan_pipe;

/* A machine on paper: what its data sheets and published benchmarks say, for a cluster you do not
   have (>>paper: dt_plan_profile_paper makes a profile of it). Rates per rank (one GPU); "eff" is
   the share of a peak that the kernels reach, from published measurements. The files in
   docs/machines/ hold H100 and A100 nodes with their sources. */
typedef struct dt_plan_machine {
    char name[96];
    int ranks_per_host;          /* GPUs a node; ranks fill hosts in order (rank / ranks_per_host) */
    double flops;                /* dense tensor-core peak of the model's dtype, FLOP/s */
    double gemm_eff;             /* a block's GEMMs */
    double attn_fwd_eff, attn_bwd_eff; /* fused (flash) attention's forward and backward, causal */
    double mem_bw, mem_eff;      /* HBM bytes/s, and the share elementwise kernels reach */
    double mem_bytes;            /* HBM a rank has */
    double reserved_bytes;       /* of it, what the runtime, workspaces and communicator buffers take */
    double act_bytes;            /* bytes of an activation (2: bf16) */
    double intra_bw, intra_alpha; /* a collective's bus bandwidth (nccl-tests' busbw) inside a host, and its latency */
    double nic_bw, inter_alpha;  /* a rank's own link out of the host (bytes/s), and a cross-host latency */
    double p2p_intra_bw, p2p_inter_bw; /* a pipeline's send inside / across hosts */
    double h2d_bw;               /* a rank's host link, each direction (its copy engines, pinned memory): what
                                    activation offload's copies move at; 0 = not known (offload is not planned) */
    double overlap;              /* of the data-parallel sync posted during the backward, the share hidden */
    double tp_overlap;           /* of tp's collectives inside a block, the share hidden behind its GEMMs */
} dt_plan_machine;

typedef struct dt_plan_profile {
    char machine[96];            /* host name of rank 0, cores */
    int world, hosts, cores;     /* ranks measured with, hosts they span, cores of rank 0's host */
    dt_plan_model model;         /* the model whose shapes were measured */
    double opt_s_per_param;      /* the optimizer's step (AdamW, clipping) per element of a shard */
    double copy_s_per_byte;      /* ZeRO's packing copies */
    double overlap;              /* of a collective posted before compute, the share hidden by it */
    double measure_s;            /* how long the measuring took */
    int n_splits, n_colls, n_pipes;
    dt_plan_split splits[DT_PLAN_MAX_SPLITS];
    dt_plan_coll colls[DT_PLAN_MAX_COLLS];
    dt_plan_pipe pipes[DT_PLAN_MAX_PIPES];
    int n_moes;                  /* a MoE model's: its MoE layer at each split its layouts give it */
    dt_plan_moe moes[DT_PLAN_MAX_MOES];
    int paper;                   /* 1: made by dt_plan_profile_paper from `mach`: its splits, collectives and
                                    pipes are computed when a layout asks, not stored */
    dt_plan_machine mach;
} dt_plan_profile;

typedef struct dt_plan_measure_desc {
    double budget_s;             /* 0 = 40: one repeat past half of it (it never stops short) */
    int repeats;                 /* of each timing, the median kept: 0 = 3 */
} dt_plan_measure_desc;

/* Collective over world (every rank calls it with the same model): measures what the model's
   valid layouts on this world need. desc may be NULL. */
DT_API dt_status dt_plan_profile_measure(dt_comm *world, const dt_plan_model *m, const dt_plan_measure_desc *desc,
                                         dt_plan_profile *out);
/* Every rank of c gets root's profile (collective): after one rank read the file, say. */
DT_API dt_status dt_plan_profile_broadcast(dt_comm *c, dt_plan_profile *p, int root);
/* JSON, one file: written by rank 0 only when called on every rank is fine (it writes what it
   is given). Load checks every field: a missing or bad one is DT_ERR_FORMAT naming it and the
   file. */
DT_API dt_status dt_plan_profile_save(dt_ctx *ctx, const dt_plan_profile *p, const char *path);
DT_API dt_status dt_plan_profile_load(dt_ctx *ctx, dt_plan_profile *p, const char *path);

/* ==== >>predict: one layout's step ================================================================ */

typedef struct dt_plan_prediction {
    dt_plan_layout layout;       /* resolved */
    double step_s, tokens_per_s;
    double compute_s;            /* the busiest stage's forward, backward and recompute (tp / cp comm included) */
    double comm_s;               /* data-parallel and pipeline communication not hidden */
    double bubble_s;             /* the pipeline's idle time on the busiest stage */
    double optimizer_s;          /* the optimizer step and ZeRO's copies */
    /* bytes, the largest rank's (the stage that holds most) */
    double mem_params, mem_grads, mem_optimizer, mem_activations, mem_transient, mem_total;
    int in_flight;               /* micro-batches whose activations the fullest stage holds at once */
    int pp_buffers;              /* dt_pp_run's message buffers the busiest stage's pool grows to (in mem_activations) */
    double mfu;                  /* paper profiles: dt_plan_model_flops x tokens/s / (ranks x peak); else 0 */
} dt_plan_prediction;

/* The step of `layout` on profile's machine and world (its model). DT_ERR_ARG for a layout the
   model or world does not allow (dt_plan_layout_check's message), DT_ERR_STATE when the profile
   lacks a split the layout needs (measure with this model and world). */
DT_API dt_status dt_plan_predict(dt_ctx *ctx, const dt_plan_profile *p, const dt_plan_layout *layout,
                                 dt_plan_prediction *out);

/* ==== >>search: every valid layout, best first ==================================================== */

typedef struct dt_plan_search_desc {
    double mem_budget;           /* bytes a rank may hold; 0 = no limit (paper: the machine's mem_bytes less
                                    reserved_bytes) */
    int max_micro;               /* micro-batches tried: 1, 2, 4, ... and those of 1, 2, 4, ... sequences,
                                    up to this; 0 = 16 (paper: the batch) */
    int recompute;               /* 1: try the recompute modes too (0: none only) */
    int max_cp;                  /* cp tried up to this; 0 = any (1: none, as examples/gpt on CUDA in f32) */
    int no_ring;                 /* 1: cp > 1 by Ulysses only */
} dt_plan_search_desc;

/* Fills out[0 .. *count) with the best max layouts by predicted tokens / s (ties: less memory),
   *total with how many were valid and fit. desc may be NULL. */
DT_API dt_status dt_plan_search(dt_ctx *ctx, const dt_plan_profile *p, const dt_plan_search_desc *desc,
                                dt_plan_prediction *out, int max, int *count, int *total);
/* A table of n predictions, ranked as given: layout, tokens / s, step split, memory. */
DT_API void dt_plan_format(const dt_plan_prediction *pr, int n, dt_strbuf *out);

/* ==== >>paper: planning for a machine you do not have ==========================================

   The same model of a step, fed by a machine's published figures instead of measurements: a
   block's time is its GEMM FLOPs at gemm_eff of the peak, its attention at the flash kernels'
   share, its other ops as HBM traffic, and its tp / cp collectives (the ring's sends, or Ulysses'
   all-to-alls as dt runs them on CUDA) as latency + bytes / busbw of the links the group spans;
   a group of ranks `stride` apart spans hosts when its ranks do (Megatron's order: tp innermost,
   then cp, dp, pp), and across hosts it moves at the node's NICs that its ranks use at once.
   Activations are act_bytes an element with flash attention (no [T, T]); parameters, grads and
   optimizer state as dt keeps them. So it answers "what layout, how fast, does it fit" for a
   cluster on paper; what it cannot know (kernel efficiencies at other shapes, congestion,
   stragglers) is in the machine's effs, which come from published runs. */

/* A machine file (JSON, docs/machines/): every field of dt_plan_machine by name, and "sources"
   (strings, kept for the reader). A missing or bad field is DT_ERR_FORMAT naming it. */
DT_API dt_status dt_plan_machine_load(dt_ctx *ctx, dt_plan_machine *mc, const char *path);
/* Checks mc (DT_ERR_ARG naming the field) and makes the profile of `world` of its ranks for model m:
   no measuring, microseconds. */
DT_API dt_status dt_plan_profile_paper(dt_ctx *ctx, const dt_plan_machine *mc, const dt_plan_model *m, int world,
                                       dt_plan_profile *out);
/* The machine of world's ranks measured on their GPUs instead of read from data sheets: planning on
   CUDA (examples/gpt --device cuda --plan). Collective; every rank's ctx on CUDA. For model m's
   shapes, the slowest rank's figures, the same on every rank:
     gemm_eff                   the block's four linears, forward and backward, at one sequence's
                                rows (dt_linear_fwd / _bwd with bf16 weights: the tensor cores)
     attn_fwd_eff, attn_bwd_eff causal flash attention of one sequence, bf16 qkv (dt_attention_gqa_*)
     mem_eff                    a device-to-device copy, its bytes read and written
     mem_bytes, reserved_bytes  cudaMemGetInfo at the call: the device's memory, what is taken
     intra_bw, intra_alpha      all-reduces over each host's ranks at 8 KB and 64 MB: bus bandwidth
     nic_bw, inter_alpha        the same over one rank of each host (several hosts)
     p2p_intra_bw, p2p_inter_bw a ring step's sends inside a host, across hosts
     h2d_bw                     64 MB of pinned host memory to the device and back: the lesser
   and ranks_per_host and name. The efficiencies are over given's peaks (flops, mem_bw: the data
   sheet's); given NULL, or a peak 0, the measured rate is the peak (efficiency 1, MFU then against
   the GEMMs' measured rate). What is not measured is given's, or dt's: overlap 0.9 (an assumption),
   tp_overlap 0 (dt hides no tp collective behind a GEMM), act_bytes 4 (dt's f32 activations; a
   bf16 model's GEMM inputs count 2). A link this world cannot show (a host of one rank, a single
   host) is given's, else the nearest measured figure (a host's links for the NICs, the device copy for a world of one rank,
   where no group is ever costed). DT_ERR_DEVICE without DT_CUDA or on a CPU ctx; DT_ERR_UNSUPPORTED
   for a head size the tensor-core attention does not take (16, 32, 64, 96, 128). */
DT_API dt_status dt_plan_machine_measure(dt_comm *world, const dt_plan_model *m, const dt_plan_machine *given,
                                         dt_plan_machine *out);
/* mc as a machine file that dt_plan_machine_load reads; source (may be NULL) is its "sources". */
DT_API dt_status dt_plan_machine_save(dt_ctx *ctx, const dt_plan_machine *mc, const char *path, const char *source);
/* The model's FLOPs per token of one training step (forward and backward, no recompute), in
   Megatron's count (Narayanan et al. 2021: GEMMs, attention's QK^T and AV without the causal half,
   the logits): MFU = flops_per_token x tokens/s / (ranks x peak). */
DT_API double dt_plan_model_flops(const dt_plan_model *m);

/* ==== >>dlrm: where a recommendation model's tables go (needs dt_embed.h included before) ======

   A DLRM-like step: the caller's dense part (input, MLPs, interaction, loss, the DDP sync), data
   parallel, and the embedding's tables, each placed by a plan (dt_embed_sharding per table, with
   an owner for table-wise). The dense part is the same under every plan; what a plan changes is
   the tables' work, which rank does it, and what each holds. So the profile measures, with the
   real dt_embed at the real world and this rank's real local batch:

       the dense step            the caller's function (everything but the embedding), timed between
                                 the forward and the backward of dt_embed's own plan of the tables
                                 (AUTO: its planner), where a step runs it: the caches then hold what
                                 they hold in a step
       each table x each kind    a one-table dt_embed: its forward and backward on a rank that owns
                                 it and on one that asks (table-wise: W copies, one per rank, give the
                                 asking share), the bytes it holds and its transient peak
       the exchanges' fixed time an empty batch's forward and backward (paid once per phase, not
                                 once per table: one all-to-all carries every table's ids)
       each kind whole           every table of one kind at once, the dense step between forward
                                 and backward: what all the tables' rows and the dense work do to
                                 the caches, as a scale on the one-table work (and transient bytes)
                                 of that kind; table-wise (and table-row) placed as dt_embed places
                                 them, so the scales do not move with the timings

   and a plan's step = dense + for each phase (forward, backward): the fixed exchange time + the
   busiest rank's sum of its tables' (scaled) work. Memory = what the caller held + the dense step's peak +
   each rank's tables and their transients; the busiest rank's. The search tries every kind for all
   tables, dt_embed's plan, and moves tables one at a time (kind, owner) while the step drops. */

#ifdef DT_EMBED_H
#define DT_PLAN_MAX_TABLES 64
#define DT_PLAN_MAX_BATCHES 16

/* The caller's dense step without the embedding: its input, forward, backward and gradient sync,
   on every rank (collective), and no update: the planner calls it several times, and the model
   must be as it was after (zero the gradients). */
typedef dt_status (*dt_plan_dense_fn)(void *user);

typedef struct dt_plan_dlrm_desc {
    const dt_embed_table_desc *tables; /* as dt_embed_create takes them, one feature per table; sharding
                                          and owner are the plan's (AUTO: dt_embed's planner decides) */
    int n_tables;                      /* 1 .. DT_PLAN_MAX_TABLES */
    const dt_kjt *batch;               /* this rank's local batch of a step: n_tables features; or */
    dt_status (*get_batch)(void *user, int i, dt_kjt *out); /* fills out with this rank's batch of step i
                                          (0 .. n_batches): its arrays are copied before the next call */
    int n_batches;                     /* with get_batch: 1 .. DT_PLAN_MAX_BATCHES. More than one: the
                                          timings go round them, and dt_embed's buffers grow to the
                                          largest, as they do over a run (a batch of more ids than the
                                          last takes them past their size: dt_grow keeps an eighth more) */
    int64_t global_batch;              /* dt_embed_desc.batch_hint */
    double dp_max_bytes;               /* dt_embed_desc's (0 = its default) */
    dt_plan_dense_fn dense;            /* NULL: no dense part */
    void *user;
    int repeats;                       /* of each timing, the median kept: 0 = 5 */
} dt_plan_dlrm_desc;

/* A table under one kind. Roles: [0] a rank that holds the table (table-wise: its owner; table-row:
   a rank of its group; every rank for the others), [1] a rank that only asks (table-wise and
   table-row); seconds of work above the fixed exchange, bytes held, transient bytes above them. */
typedef struct dt_plan_table_cost {
    int ok;                            /* 0: dt_embed refuses the kind for this table (column-wise with
                                          row-wise Adagrad, table-row without host groups, ...) */
    double fwd[2], bwd[2], bytes[2], peak[2];
} dt_plan_table_cost;

typedef struct dt_plan_dlrm_profile {
    char machine[96];
    int world, hosts, group;           /* group: ranks per host for table-row (0: not measured) */
    int n_tables, dim_total;           /* dim_total: the pooled width (sum of the tables' dims) */
    int64_t batch;                     /* global */
    double dense_s;                    /* the caller's dense step, the slowest rank's median */
    double base_bytes;                 /* what the caller held when measuring began (the busiest rank) */
    double dense_peak;                 /* the dense step's peak above base_bytes */
    double x_fwd, x_bwd;               /* the exchanges' fixed time per forward, per backward */
    double x_bytes;                    /* what one dt_embed holds besides its tables */
    double measure_s;
    dt_plan_table_cost cost[DT_PLAN_MAX_TABLES][DT_SHARD_COUNT];
    /* every table at once, one kind (index AUTO: dt_embed's plan): the slowest rank's forward and
       backward, and what they make of the tables' sums (their work above the fixed exchange over
       the busiest rank's sum of the one-table figures): a plan's tables of kind k count scale[k]
       times their one-table work. The one-table runs find each table's share and who does it;
       the whole runs, what all the tables' rows do to the caches together. 0 = 1 (not measured). */
    double whole_fwd[DT_SHARD_COUNT], whole_bwd[DT_SHARD_COUNT], whole_peak[DT_SHARD_COUNT];
    double scale_fwd[DT_SHARD_COUNT], scale_bwd[DT_SHARD_COUNT], scale_peak[DT_SHARD_COUNT]; /* peak: of the
                                          transient bytes (buffers the tables share, or not);
                                          scale_peak[AUTO]: dt_embed's plan's whole transient over
                                          its kinds' scaled sum, for that plan alone */
    dt_embed_sharding auto_kind[DT_PLAN_MAX_TABLES]; /* dt_embed's plan of the tables as given */
    int auto_owner[DT_PLAN_MAX_TABLES];
} dt_plan_dlrm_profile;

typedef struct dt_plan_dlrm_plan {
    char name[16];                     /* "table", "row", "auto", "searched", ... */
    int n_tables;
    dt_embed_sharding kind[DT_PLAN_MAX_TABLES]; /* TABLE, ROW, COLUMN, DATA or TABLE_ROW */
    int owner[DT_PLAN_MAX_TABLES];     /* table-wise: the rank; table-row: its group's first rank */
} dt_plan_dlrm_plan;

typedef struct dt_plan_dlrm_prediction {
    dt_plan_dlrm_plan plan;
    double step_s, samples_per_s;
    double dense_s;                    /* the caller's dense step */
    double fwd_s, bwd_s;               /* the embedding's forward and backward: busiest rank + exchange */
    double exchange_s;                 /* of fwd_s + bwd_s: the fixed exchange time */
    double imbalance_s;                /* of fwd_s + bwd_s: the busiest rank's work above the mean rank's */
    double mem_base, mem_dense, mem_tables, mem_transient, mem_total; /* bytes, the fullest rank */
    int busiest;                       /* the rank with the most embedding work */
} dt_plan_dlrm_prediction;

/* Collective over world: every rank passes the same desc but its own local batch. Creates and
   frees dt_embeds on the way (one table, then every table at once for each kind: the tables' memory
   again, for moments); calls desc->dense once, then between the forward and the backward of every
   step of the whole runs (n_batches + repeats a kind, and for dt_embed's own plan). */
DT_API dt_status dt_plan_dlrm_measure(dt_comm *world, const dt_plan_dlrm_desc *desc, dt_plan_dlrm_profile *out);
/* A plan's step and memory: DT_ERR_ARG naming the table whose kind or owner the profile's world
   or measurements cannot take. */
DT_API dt_status dt_plan_dlrm_predict(dt_ctx *ctx, const dt_plan_dlrm_profile *p, const dt_plan_dlrm_plan *plan,
                                      dt_plan_dlrm_prediction *out);
/* dt_embed's plan as a dt_plan_dlrm_plan (after dt_embed_create: to predict what runs) */
DT_API dt_status dt_plan_dlrm_plan_of(const dt_embed *e, int n_tables, const char *name, dt_plan_dlrm_plan *out);
/* The candidates (one kind for every table, dt_embed's plan, and the search's own) best first,
   within mem_budget bytes a rank (0: no limit): out[0 .. *count), at most max. */
DT_API dt_status dt_plan_dlrm_search(dt_ctx *ctx, const dt_plan_dlrm_profile *p, double mem_budget,
                                     dt_plan_dlrm_prediction *out, int max, int *count);
/* A table of n predictions (their split and memory), then the first one's placement per table. */
DT_API void dt_plan_dlrm_format(const dt_plan_dlrm_prediction *pr, int n, dt_strbuf *out);
/* The profile as JSON, to plan again without measuring (the same tables, world and batch: the
   caller checks them against the file's). Load names a missing or bad field and the file. */
DT_API dt_status dt_plan_dlrm_profile_save(dt_ctx *ctx, const dt_plan_dlrm_profile *p, const char *path);
DT_API dt_status dt_plan_dlrm_profile_load(dt_ctx *ctx, dt_plan_dlrm_profile *p, const char *path);
/* Every rank of c gets root's profile (collective) */
DT_API dt_status dt_plan_dlrm_profile_broadcast(dt_comm *c, dt_plan_dlrm_profile *p, int root);
#endif /* DT_EMBED_H */

#ifdef __cplusplus
}
#endif
#endif /* DT_PLAN_H */

/* ==== >>implementation: everything below needs DT_PLAN_IMPLEMENTATION ========================== */

#if (defined(DT_PLAN_IMPLEMENTATION) || defined(DT_IMPLEMENTATION)) && !defined(DT_PLAN_IMPLEMENTATION_DONE)
#define DT_PLAN_IMPLEMENTATION_DONE

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>      /* sysconf */
#include <sys/utsname.h> /* uname: the host's name (gethostname is hidden under strict C99) */
#include <time.h>        /* the pipeline probe spins on CPU time (dt__plan_cpu_now) */

/* ==== >>model ==================================================================================== */

static const char *const dt__plan_rec_names[DT_PLAN_RECOMPUTE_COUNT] = {"none", "full", "selective", "gemm-last"};

DT_API const char *dt_plan_recompute_name(dt_plan_recompute r) {
    return (int)r >= 0 && r < DT_PLAN_RECOMPUTE_COUNT ? dt__plan_rec_names[r] : "?";
}

DT_API const char *dt_plan_layout_string(const dt_plan_layout *l, char *buf, size_t n) {
    char pp[48] = "", off[48] = "", ep[24] = "";
    if (!buf || !n) return "";
    if (!l) { snprintf(buf, n, "(null)"); return buf; }
    if (l->pp > 1) snprintf(pp, sizeof pp, ", %s", dt_pp_kind_name(l->schedule));
    if (l->offload > 0) snprintf(off, sizeof off, ", offload %.3g", l->offload);
    if (l->ep > 1) snprintf(ep, sizeof ep, " ep %d", l->ep);
    snprintf(buf, n, "dp %d tp %d pp %d cp %d%s%s%s, micro %d, zero %d, sp %d, recompute %s%s", l->dp, l->tp, l->pp,
             l->cp, l->ulysses && l->cp > 1 ? " ulysses" : "", ep, pp, l->micro, l->zero, l->sp,
             dt_plan_recompute_name(l->recompute), off);
    return buf;
}

/* The eps a MoE model of E experts can take (those dividing E, ascending): their count, and ep's
   place among them (-1 if ep divides no E): model->expert_load's index. */
static int dt__plan_ep_index(int E, int ep, int *count) {
    int d, n = 0, at = -1;
    for (d = 1; d <= E; d++)
        if (E % d == 0) {
            if (d == ep) at = n;
            n++;
        }
    if (count) *count = n;
    return at;
}

static dt_status dt__plan_model_check(dt_ctx *ctx, const char *fn, const dt_plan_model *m) {
    int kv;
    if (!m) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model is NULL", fn);
    kv = m->kv_heads ? m->kv_heads : m->heads;
    if (m->layers < 1 || m->layers > 100000)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->layers = %d, expected 1 .. 100000", fn, m->layers);
    if (m->heads < 1 || m->width < 1 || m->width % m->heads)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->width = %d, heads = %d: expected heads >= 1 dividing width",
                                fn, m->width, m->heads);
    if (kv < 1 || m->heads % kv)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->kv_heads = %d, expected a divisor of heads %d (0 = heads)",
                                fn, m->kv_heads, m->heads);
    if (m->vocab < 1 || m->seq < 2 || m->batch < 1 || m->vocab > ((int64_t)1 << 40) || m->seq > ((int64_t)1 << 30) ||
        m->batch > ((int64_t)1 << 30) || m->width > (1 << 20))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model vocab %lld, seq %lld, batch %lld, width %d: expected vocab "
                                ">= 1, seq >= 2, batch >= 1, each within 2^40 / 2^30 / 2^30 / 2^20", fn,
                                (long long)m->vocab, (long long)m->seq, (long long)m->batch, m->width);
    if (m->dtype != 0 && m->dtype != DT_F32 && m->dtype != DT_BF16)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->dtype = %s, expected f32 or bf16", fn,
                                dt_dtype_name(m->dtype));
    if (m->ffn < 0 || m->ffn > (1 << 22) || (m->gated != 0 && m->gated != 1))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->ffn = %d, gated = %d: expected ffn 0 .. 2^22 (0 = 4 x "
                                "width) and gated 0 or 1", fn, m->ffn, m->gated);
    if (m->experts < 0 || m->experts > (1 << 16))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->experts = %d, expected 0 (dense) .. 2^16", fn, m->experts);
    if (m->experts) {
        if (m->top_k < 0 || m->top_k > m->experts || (!m->top_k && m->experts < 2))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->top_k = %d, expected 1 .. experts %d (0 = 2)", fn,
                                    m->top_k, m->experts);
        if (m->moe_every < 0 || m->moe_every > m->layers)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->moe_every = %d, expected 0 .. layers %d (0 = 1)", fn,
                                    m->moe_every, m->layers);
        if (m->moe_shared != 0 && m->moe_shared != 1)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->moe_shared = %d, expected 0 or 1", fn, m->moe_shared);
        if (!(m->capacity >= 0 && m->capacity <= 1e6)) /* NaN too */
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->capacity = %g, expected 0 (dropless) .. 1e6", fn,
                                    m->capacity);
        if ((int)m->balance < 0 || m->balance > DT_MOE_NONE)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->balance = %d, expected a dt_moe_balance", fn,
                                    (int)m->balance);
    }
    if (m->expert_load || m->n_expert_load) {
        int every = m->moe_every ? m->moe_every : 1, k = m->top_k ? m->top_k : 2, i, nd;
        int64_t blocks = m->experts ? m->layers / every : 0, n = m->n_expert_load;
        dt__plan_ep_index(m->experts, 1, &nd);
        if (!m->experts || !m->expert_load || (n != nd && n != blocks * nd))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->expert_load = %p, n_expert_load = %d: expected a load "
                                    "per ep dividing the experts %d (%d) or per MoE block and such ep (%lld x %d) of a "
                                    "MoE model", fn, (const void *)m->expert_load, m->n_expert_load, m->experts, nd,
                                    (long long)blocks, nd);
        for (i = 0; i < m->n_expert_load; i++) /* an expert takes a token once: at most T of T k / E */
            if (!(m->expert_load[i] >= 0 && m->expert_load[i] <= (double)m->experts / k))
                return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->expert_load[%d] = %g, expected 0 .. E / k = %g (the "
                                        "busiest ep rank's rows over its uniform share)", fn, i, m->expert_load[i],
                                        (double)m->experts / k);
    }
    return DT_OK;
}

/* A MoE model's layout as examples/gpt allows it (its check_sizes): ep inside dp x cp dividing the
   experts; the aux loss's gradient needs every forward of the step first (GPipe, or one
   micro-batch at pp 1: an unset schedule becomes GPipe); capacity per sequence needs whole
   sequences (cp 1); no recompute (a block again would route again), offload or zb-h1 (not built
   for the experts). */
static dt_status dt__plan_moe_check(dt_ctx *ctx, const char *fn, const dt_plan_model *m, dt_plan_layout *l) {
    int aux = m->balance == DT_MOE_BALANCE_DEFAULT || m->balance == DT_MOE_AUX;
    if (!m->experts) {
        if (l->ep > 1)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: ep %d with a dense model (model->experts 0): expert parallelism "
                                    "splits experts", fn, l->ep);
        return DT_OK;
    }
    if (((int64_t)l->dp * l->cp) % l->ep || m->experts % l->ep)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: ep %d must divide dp x cp = %d x %d and the experts %d", fn, l->ep,
                                l->dp, l->cp, m->experts);
    if (l->cp > 1 && m->capacity > 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: cp %d with model->capacity %g: capacity is counted per sequence, "
                                "which cp splits over ranks (dropless, capacity 0, runs at cp > 1)", fn, l->cp, m->capacity);
    if (l->recompute || l->offload > 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: a MoE model with recompute %s, offload %g: recomputing a block "
                                "would route its tokens again, and offload is not built for the experts", fn,
                                dt_plan_recompute_name(l->recompute), l->offload);
    if (l->pp > 1 && l->schedule == DT_PP_ZB_H1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: a MoE model with zb-h1: the weight pass is not split for the "
                                "experts", fn);
    if (aux && l->pp > 1 && l->schedule != DT_PP_GPIPE)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: balance aux with %s: the aux loss's gradient needs the step's every "
                                "forward first (gpipe), or balance bias", fn, dt_pp_kind_name(l->schedule));
    if (aux && l->pp == 1 && l->micro > 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: balance aux with micro %d at pp 1: the aux loss's gradient needs "
                                "the step's every forward first (micro 1), or balance bias", fn, l->micro);
    return DT_OK;
}

DT_API dt_status dt_plan_layout_check(dt_ctx *ctx, const dt_plan_model *m, int world, const dt_plan_layout *layout,
                                      dt_plan_layout *out) {
    static const char *fn = "dt_plan_layout_check";
    dt_plan_layout l;
    int64_t rows, kv;
    dt_status err = dt__plan_model_check(ctx, fn, m);
    if (err) return err;
    if (!layout) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: layout is NULL", fn);
    if (world < 1) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: world = %d, expected >= 1", fn, world);
    l = *layout;
    if (!l.tp) l.tp = 1;
    if (!l.pp) l.pp = 1;
    if (!l.cp) l.cp = 1;
    if (!l.micro) l.micro = 1;
    if (!l.ep) l.ep = 1;
    if (l.tp < 1 || l.pp < 1 || l.cp < 1 || l.dp < 0 || l.micro < 1 || l.ep < 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: layout dp %d tp %d pp %d cp %d ep %d micro %d: expected sizes >= 1 "
                                "(dp 0 = the rest of the world)", fn, l.dp, l.tp, l.pp, l.cp, l.ep, l.micro);
    if (world % ((int64_t)l.tp * l.pp * l.cp))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tp %d x cp %d x pp %d does not divide the world size %d", fn, l.tp,
                                l.cp, l.pp, world);
    if (!l.dp) l.dp = world / (l.tp * l.pp * l.cp);
    if ((int64_t)l.dp * l.tp * l.pp * l.cp != world)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: dp %d x tp %d x cp %d x pp %d = %lld, expected the world size %d",
                                fn, l.dp, l.tp, l.cp, l.pp, (long long)l.dp * l.tp * l.pp * l.cp, world);
    kv = m->kv_heads ? m->kv_heads : m->heads;
    if (m->heads % l.tp) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tp %d does not divide heads %d", fn, l.tp, m->heads);
    if (kv % l.tp)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tp %d does not divide kv heads %lld (the planner does not model "
                                "kv heads replicated over tp)", fn, l.tp, (long long)kv);
    if (m->vocab % l.tp)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tp %d does not divide the padded vocab %lld", fn, l.tp,
                                (long long)m->vocab);
    if (m->seq % (2 * (int64_t)l.cp))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: seq %lld is not a multiple of 2 x cp = %d", fn, (long long)m->seq,
                                2 * l.cp);
    if (m->batch % ((int64_t)l.dp * l.micro))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: batch %lld is not a multiple of dp x micro = %d x %d", fn,
                                (long long)m->batch, l.dp, l.micro);
    if (l.zero < 0 || l.zero > 3)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: zero = %d, expected 0 .. 3", fn, l.zero);
    if (l.sp != 0 && l.sp != 1) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: sp = %d, expected 0 or 1", fn, l.sp);
    if (l.ulysses != 0 && l.ulysses != 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: ulysses = %d, expected 0 or 1", fn, l.ulysses);
    if (l.cp == 1) l.ulysses = 0; /* one rank's sequence: plain attention */
    if (l.ulysses && ((m->heads / l.tp) % l.cp || (kv / l.tp) % l.cp))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: ulysses: heads %d and kv heads %lld over tp %d leave %lld and %lld "
                                "per tp rank, which cp %d must divide", fn, m->heads, (long long)kv, l.tp,
                                (long long)(m->heads / l.tp), (long long)(kv / l.tp), l.cp);
    if (l.sp && l.tp == 1) l.sp = 0; /* nothing to split */
    rows = m->batch / l.dp / l.micro * (m->seq / l.cp);
    if (l.sp && rows % l.tp)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: sp 1: a micro-batch's %lld rows are not a multiple of tp %d", fn,
                                (long long)rows, l.tp);
    if (!(l.offload >= 0 && l.offload <= 1)) /* NaN too */
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: offload = %g, expected 0 .. 1", fn, l.offload);
    if ((int)l.recompute < 0 || l.recompute >= DT_PLAN_RECOMPUTE_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: recompute = %d, expected 0 .. %d", fn, (int)l.recompute,
                                DT_PLAN_RECOMPUTE_COUNT - 1);
    if (l.pp == 1) {
        l.schedule = DT_PP_DEFAULT;
        l.chunks = 1;
    } else {
        if (l.schedule == DT_PP_DEFAULT) /* examples/gpt's: a MoE model balanced by the aux loss runs GPipe */
            l.schedule = m->experts && (m->balance == DT_MOE_BALANCE_DEFAULT || m->balance == DT_MOE_AUX) ? DT_PP_GPIPE
                                                                                                       : DT_PP_1F1B;
        if ((int)l.schedule < 0 || l.schedule >= DT_PP_KIND_COUNT)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: schedule = %d, expected a dt_pp_kind", fn, (int)l.schedule);
        l.chunks = l.schedule == DT_PP_INTERLEAVED ? 2 : 1;
        if (m->layers < l.pp * l.chunks)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: pp %d x %d chunks = %d virtual stages, but %d layers", fn, l.pp,
                                    l.chunks, l.pp * l.chunks, m->layers);
        if (l.schedule == DT_PP_INTERLEAVED && l.micro % l.pp)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: interleaved: micro %d is not a multiple of pp %d", fn, l.micro,
                                    l.pp);
        if (l.zero > 1)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: zero %d with pp %d: the pipeline takes ZeRO 0 or 1", fn,
                                    l.zero, l.pp);
        if (l.offload > 0 && l.schedule == DT_PP_ZB_H1 && !l.sp && !l.recompute)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: offload %g with zb-h1: its weight pass reads a block's "
                                    "activations after their slot holds another block's (examples/gpt refuses it)", fn,
                                    l.offload);
    }
    if ((err = dt__plan_moe_check(ctx, fn, m, &l))) return err;
    if (out) *out = l;
    return DT_OK;
}

/* ---- what one rank holds: parameters, and one micro-batch's activations (examples/gpt's) ---- */

static double dt__plan_ffn(const dt_plan_model *m) { return m->ffn ? (double)m->ffn : 4.0 * m->width; }

/* Parameters of one block on one tp rank: ln 2 x 2C, qkv (C + 2 Ckv) x (C + 1) / tp, attention
   projection C x C / tp + C, fc F x (C + 1) / tp (gated: two of them), projection C x F / tp + C;
   F = ffn (4C). */
static double dt__plan_block_params(const dt_plan_model *m, int tp) {
    double C = m->width, Ckv = (double)(m->kv_heads ? m->kv_heads : m->heads) * (m->width / m->heads);
    double F = dt__plan_ffn(m);
    return 4 * C + (C + 2 * Ckv) * (C + 1) / tp + C * C / tp + C + (1 + m->gated) * F * (C + 1) / tp + F * C / tp + C;
}

/* Block l is a MoE block (examples/gpt's moe_block): every moe_every-th, the first being moe_every - 1. */
static int dt__plan_is_moe(const dt_plan_model *m, int l) {
    int every = m->moe_every ? m->moe_every : 1;
    return m->experts && l % every == every - 1;
}

/* A MoE block's experts at ep: the busiest ep rank's rows over their uniform share, less 1 (0
   without model->expert_load, or for a dense block). */
static double dt__plan_moe_skew(const dt_plan_model *m, int l, int ep) {
    int every = m->moe_every ? m->moe_every : 1, nd, at;
    if (!m->expert_load || !dt__plan_is_moe(m, l)) return 0;
    at = dt__plan_ep_index(m->experts, ep, &nd);
    if (at < 0) return 0; /* (the layout check refuses such an ep) */
    return m->expert_load[(m->n_expert_load > nd ? (size_t)(l / every) * (size_t)nd : 0) + (size_t)at] - 1;
}

/* A MoE block's parameters on one rank of tp and ep: *dense, what it changes of the dense block's
   count (the router E x C, whole on every rank, less the dense MLP unless it stays as a shared
   expert); *expert, its E / ep experts (fc F/tp x C + F/tp, projection C x F/tp + C: the bias
   whole, added on tp rank 0), which sync over the edp ranks that hold the same experts. */
static void dt__plan_moe_params(const dt_plan_model *m, int tp, int ep, double *dense, double *expert) {
    double C = m->width, F = dt__plan_ffn(m);
    double mlp = (1 + m->gated) * F * (C + 1) / tp + F * C / tp + C;
    *dense = (double)m->experts * C - (m->moe_shared ? 0 : mlp);
    *expert = (double)(m->experts / ep) * (2 * C * F / tp + F / tp + C);
}

/* The activation bytes of one micro-batch set (examples/gpt's acts_make) of nb blocks on a stage:
   each block's kept tensors for the recompute mode, the one shared set recompute uses, sp's
   gathered rows, and the head / backward scratch every set carries. A bytes an element (the CPU
   path: 4, f32; ids and targets i32 count the same); flash: attention keeps lse, never [T, T]. A
   gated MLP keeps its gate and up both (fch is 2 F wide; the activation's output, F). Ulysses keeps
   the whole sequence's q, k, v of its heads (uqkv, as many elements as qkv) and their [T, T]; under
   flash, uqkv alone, in bf16 (2 bytes an element whatever A is). A bf16 model keeps the GEMMs'
   inputs in bf16 too (at most 2 bytes an element): ln1, ln2 (f32 beside MoE layers, which read
   them), the MLP's fch and GELU, their sp gathers, qkv (f32 under Ulysses and in the CPU's ring,
   which take it so) and attention's output (f32 under Ulysses and the ring, which merges in f32),
   and the gradients of fch and the GELU's output, and under flash dqkv where attention's output is. */
static double dt__plan_acts_bytes(const dt_plan_model *m, const dt_plan_layout *l, int nb, double A, int flash,
                                  double *own) {
    double b = (double)(m->batch / l->dp / l->micro), T = (double)m->seq, Tl = T / l->cp, N = b * Tl;
    double Nl = l->sp ? N / l->tp : N, C = m->width, Cl = C / l->tp, Fl = dt__plan_ffn(m) / l->tp * (1 + m->gated);
    double Gl = dt__plan_ffn(m) / l->tp;
    double Hl = (double)m->heads / l->tp, Ckvl = (double)(m->kv_heads ? m->kv_heads : m->heads) / l->tp * (C / m->heads);
    double Wl = Cl + 2 * Ckvl, Vl = (double)m->vocab / l->tp;
    int uly = l->ulysses && l->cp > 1, r = (int)l->recompute;
    int lse = !uly && (flash || l->cp > 1 || l->recompute == DT_PLAN_RECOMPUTE_GEMM_LAST);
    double att = uly && flash ? N * Wl * 2 / A                 /* uqkv in bf16, for the tensor cores */
               : uly ? b * (Hl / l->cp) * T * T + N * Wl : lse ? b * Hl * Tl : b * Hl * T * T;
    double core = Nl * C + 2 * Nl + Nl * C + 2 * Nl + N * Wl + N * Cl + Nl * C + N * Fl; /* ln1 .. fch */
    /* of those, the elements a bf16 model keeps in bf16: ln1 and ln2 (lns), qkv and atty (q16), fch, gelu */
    int bf = m->dtype == DT_BF16, qbf = bf && !uly && (flash || !(l->cp > 1 || r == DT_PLAN_RECOMPUTE_GEMM_LAST));
    int abf = bf && !uly && !(l->cp > 1 || (r == DT_PLAN_RECOMPUTE_GEMM_LAST && !flash)); /* atty: not the ring's */
    double lns = bf ? Nl * C * (m->experts > 0 ? 1 : 2) : 0, mlp16 = bf ? N * Fl + N * Gl : 0;
    double q16 = (qbf ? N * Wl : 0) + (abf ? N * Cl : 0); /* qkv and attention's output */
    double A16 = A < 2 ? A : 2, blk, shared = 0, blk16, sh16 = 0, e, e16;
    switch (r) {
    case DT_PLAN_RECOMPUTE_FULL: blk = Nl * C; shared = core + att + N * Gl; blk16 = 0; sh16 = lns + q16 + mlp16; break;
    case DT_PLAN_RECOMPUTE_SELECTIVE:
        blk = Nl * C + core; shared = core + att + N * Gl;
        blk16 = lns + q16 + (bf ? N * Fl : 0); sh16 = lns + q16 + mlp16;
        break;
    case DT_PLAN_RECOMPUTE_GEMM_LAST:
        blk = Nl * C + core - 2 * Nl * C + att; shared = 2 * Nl * C + N * Gl;
        blk16 = q16 + (bf ? N * Fl : 0); sh16 = lns + (bf ? N * Gl : 0);
        break;
    default: blk = Nl * C + core + att + N * Gl; blk16 = lns + q16 + mlp16; break;
    }
    if (own) *own = A * (blk - blk16) + A16 * blk16; /* what offload moves: the block's own tensors */
    if (l->pp > 1 && l->schedule == DT_PP_ZB_H1 && !l->sp && !r) { /* the weight pass's kept grads (gpt splits */
        blk += 2 * Nl * C + N * Fl + N * Wl;                           /* the backward only without sp and */
        blk16 += (bf ? N * Fl : 0) + (abf && flash ? N * Wl : 0);      /* recompute); fch's and qkv's in bf16 */
    }
    e = nb * blk + shared;
    e16 = nb * blk16 + sh16;
    if (l->sp) e += 2 * N * C + N * C;                    /* gath1, gath2, lnfall */
    if (l->sp) e16 += lns * N / Nl;                       /* gath1, gath2 as ln1, ln2 */
    e += Nl * C * 2 + 2 * Nl + N * Vl + 2 * N + 2 * N;    /* xL, lnf (+ mean, rstd), logits, stats, ids, targets */
    e += N * C + Nl * C;                                  /* partial, y_scratch */
    e += Nl * C * 2 + N * C * 3 + N * Wl + N * Cl + N * Fl * 2 + N * Vl; /* the backward's scratch, of it */
    e16 += (bf ? N * Fl * 2 : 0) + (abf && flash ? N * Wl : 0);          /* the MLP's two and dqkv in bf16 */
    if (l->sp && l->tp > 1) e += 6 * C + T * C + 2 * C;
    return A * (e - e16) + A16 * e16;
}

/* ==== >>profile ================================================================================== */

/* Does a group of `size` ranks `stride` apart span hosts of rph ranks (ranks fill hosts in order)?
   Not when its reach, size x stride, fits a host and hosts hold whole groups. */
static int dt__plan_spans(int rph, int size, int stride) {
    int64_t reach = (int64_t)size * stride;
    if (size <= 1 || rph < 1) return 0;
    return reach > rph || rph % reach != 0;
}


/* One block's tensors at a split, for b sequences: examples/gpt's block_fwd / block_bwd op for op. */
typedef struct dt__plan_blk {
    dt_ctx *ctx;
    dt_layout *lay;
    struct dt__plan_xblk *x; /* a MoE layer's timing: its experts beside the block's tensors */
    int64_t b, T, Tl, N, Nl, C, Cl, Fl, Wl, Vl;
    int Hl, Hkvl, sp, lse, uly;
    dt_tensor w[12], g[12];  /* ln1 w b, qkv w b, proj w b, ln2 w b, fc w b, fcproj w b */
    dt_tensor in, ln1, ln1m, ln1r, ln1all, qkv, att, lse_t, uqkv, atty, res1, ln2, ln2m, ln2r, ln2all, fch, gelu, y, partial;
    dt_tensor dres, dln, dgelu, dfch, dxbuf, doutbuf, datty, dqkv, dall;
    /* embedding and head */
    dt_tensor wte, wpe, lnfw, lnfb, gwte, gwpe, glnfw, glnfb, ids, targets, x0, xL, lnf, lnfm, lnfr, lnfall, logits,
        stats, dlogits;
} dt__plan_blk;

static dt_status dt__plan_mk(dt__plan_blk *k, dt_tensor *t, int64_t d0, int64_t d1, int64_t d2, dt_dtype dt) {
    dt_tensor_desc d;
    dt_status err;
    memset(&d, 0, sizeof d);
    d.dtype = dt ? dt : DT_F32;
    d.shape[0] = d0; d.shape[1] = d1; d.shape[2] = d2;
    err = dt_tensor_create(k->ctx, t, &d);
    if (err) return err;
    if (dt_tensor_bytes(t) && t->dtype == DT_F32) { /* small values: no overflow, no denormals */
        int64_t i;
        float *p = (float *)t->data;
        for (i = 0; i < t->numel; i++) p[i] = 0.01f * (float)((i * 7919) % 101 - 50) / 50.0f;
    }
    return DT_OK;
}

static void dt__plan_blk_free(dt__plan_blk *k) {
    dt_tensor *t = (dt_tensor *)&k->w[0], *end = (dt_tensor *)(&k->dlogits + 1);
    for (; t < end; t++) dt_tensor_free(k->ctx, t);
}

#define DT__PLAN_TRY(x) do { err = (x); if (err) goto fail; } while (0)

static dt_status dt__plan_blk_make(dt__plan_blk *k, dt_layout *lay, const dt_plan_model *m, int64_t b, int sp, int lse,
                                   int uly) {
    dt_status err;
    int i;
    int64_t kv = m->kv_heads ? m->kv_heads : m->heads, rows[12], cols[12], n;
    memset(k, 0, sizeof *k);
    k->ctx = lay->ctx; k->lay = lay;
    k->b = b; k->T = m->seq; k->Tl = m->seq / lay->cp; k->N = b * k->Tl; k->sp = sp && lay->tp > 1; k->lse = lse && !uly;
    k->uly = uly && lay->cp > 1;
    k->Nl = k->sp ? k->N / lay->tp : k->N;
    k->C = m->width; k->Cl = m->width / lay->tp; k->Fl = 4 * (int64_t)m->width / lay->tp;
    k->Hl = m->heads / lay->tp; k->Hkvl = (int)(kv / lay->tp);
    k->Wl = k->Cl + 2 * (int64_t)k->Hkvl * (m->width / m->heads);
    k->Vl = m->vocab / lay->tp;
    rows[0] = rows[1] = k->C; cols[0] = cols[1] = 0;
    rows[2] = k->Wl; cols[2] = k->C; rows[3] = k->Wl; cols[3] = 0;
    rows[4] = k->C; cols[4] = k->Cl; rows[5] = k->C; cols[5] = 0;
    rows[6] = rows[7] = k->C; cols[6] = cols[7] = 0;
    rows[8] = k->Fl; cols[8] = k->C; rows[9] = k->Fl; cols[9] = 0;
    rows[10] = k->C; cols[10] = k->Fl; rows[11] = k->C; cols[11] = 0;
    for (i = 0; i < 12; i++) {
        DT__PLAN_TRY(dt__plan_mk(k, &k->w[i], rows[i], cols[i], 0, DT_F32));
        DT__PLAN_TRY(dt__plan_mk(k, &k->g[i], rows[i], cols[i], 0, DT_F32));
    }
    DT__PLAN_TRY(dt__plan_mk(k, &k->in, k->Nl, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->ln1, k->Nl, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->ln1m, k->Nl, 0, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->ln1r, k->Nl, 0, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->ln2, k->Nl, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->ln2m, k->Nl, 0, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->ln2r, k->Nl, 0, 0, DT_F32));
    if (k->sp) {
        DT__PLAN_TRY(dt__plan_mk(k, &k->ln1all, k->N, k->C, 0, DT_F32));
        DT__PLAN_TRY(dt__plan_mk(k, &k->ln2all, k->N, k->C, 0, DT_F32));
        DT__PLAN_TRY(dt__plan_mk(k, &k->lnfall, k->N, k->C, 0, DT_F32));
    }
    DT__PLAN_TRY(dt__plan_mk(k, &k->qkv, b, k->Tl, k->Wl, DT_F32));
    if (k->lse) DT__PLAN_TRY(dt__plan_mk(k, &k->lse_t, b, k->Hl, k->Tl, DT_F32));
    else {
        dt_tensor_desc d;
        memset(&d, 0, sizeof d);
        if (k->uly) DT__PLAN_TRY(dt__plan_mk(k, &k->uqkv, b, k->T, k->Wl / lay->cp, DT_F32));
        d.shape[0] = b; d.shape[1] = k->uly ? k->Hl / lay->cp : k->Hl; d.shape[2] = k->T; d.shape[3] = k->T;
        DT__PLAN_TRY(dt_tensor_create(k->ctx, &k->att, &d));
    }
    DT__PLAN_TRY(dt__plan_mk(k, &k->atty, k->N, k->Cl, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->res1, k->Nl, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->fch, k->N, k->Fl, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->gelu, k->N, k->Fl, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->y, k->Nl, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->partial, k->N, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->dres, k->Nl, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->dln, k->Nl, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->dgelu, k->N, k->Fl, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->dfch, k->N, k->Fl, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->dxbuf, k->N, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->doutbuf, k->N, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->datty, k->N, k->Cl, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->dqkv, b, k->Tl, k->Wl, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->dall, k->N, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->wte, k->Vl, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->gwte, k->Vl, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->wpe, k->T, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->gwpe, k->T, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->lnfw, k->C, 0, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->lnfb, k->C, 0, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->glnfw, k->C, 0, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->glnfb, k->C, 0, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->ids, k->N, 0, 0, DT_I32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->targets, k->N, 0, 0, DT_I32));
    for (n = 0; n < k->N; n++) { /* ids in range, spread over the vocab */
        ((int32_t *)k->ids.data)[n] = (int32_t)(((uint64_t)n * 2654435761u) % (uint64_t)m->vocab);
        ((int32_t *)k->targets.data)[n] = (int32_t)(((uint64_t)n * 40503u + 7) % (uint64_t)m->vocab);
    }
    DT__PLAN_TRY(dt__plan_mk(k, &k->x0, k->Nl, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->xL, k->Nl, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->lnf, k->Nl, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->lnfm, k->Nl, 0, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->lnfr, k->Nl, 0, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->logits, k->N, k->Vl, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->stats, k->N, 2, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &k->dlogits, k->N, k->Vl, 0, DT_F32));
    for (i = 0; i < 12; i += 6) dt_tensor_fill(k->ctx, &k->w[i], 1.0); /* layernorm weights 1 */
    dt_tensor_fill(k->ctx, &k->lnfw, 1.0);
    return DT_OK;
fail:
    dt__plan_blk_free(k);
    return err;
}

static dt_status dt__plan_attn_fwd(dt__plan_blk *k) {
    dt_tensor a3;
    int64_t s3[3];
    dt_status err;
    s3[0] = k->b; s3[1] = k->Tl; s3[2] = k->Cl;
    err = dt_tensor_reshape(k->ctx, &a3, &k->atty, 3, s3);
    if (err) return err;
    if (k->lse) return dt_cp_attention_fwd(k->lay, &a3, &k->lse_t, &k->qkv, k->Hl, k->Hkvl);
    if (k->uly) return dt_cp_ulysses_fwd(k->lay, &a3, &k->uqkv, &k->att, &k->qkv, k->Hl, k->Hkvl);
    return dt_attention_gqa_fwd(k->ctx, &a3, &k->att, &k->qkv, k->Hl, k->Hkvl);
}

static dt_status dt__plan_qkv2(dt__plan_blk *k, dt_tensor *out, dt_tensor *t) {
    int64_t s[2];
    s[0] = k->N; s[1] = k->Wl;
    return dt_tensor_reshape(k->ctx, out, t, 2, s);
}

/* examples/gpt's block_fwd (dense, no MoE). */
static dt_status dt__plan_blk_fwd(dt__plan_blk *k) {
    dt_ctx *c = k->ctx;
    dt_tensor q2;
    dt_status err;
    DT__PLAN_TRY(dt_layernorm_fwd(c, &k->ln1, &k->ln1m, &k->ln1r, &k->in, &k->w[0], &k->w[1], 1e-5f));
    if (k->sp) DT__PLAN_TRY(dt_sp_gather_rows(k->lay, &k->ln1all, &k->ln1));
    DT__PLAN_TRY(dt__plan_qkv2(k, &q2, &k->qkv));
    DT__PLAN_TRY(dt_linear_fwd(c, &q2, k->sp ? &k->ln1all : &k->ln1, &k->w[2], &k->w[3]));
    DT__PLAN_TRY(dt__plan_attn_fwd(k));
    DT__PLAN_TRY(dt_tp_row_linear_fwd(k->lay, &k->res1, &k->partial, &k->atty, &k->w[4], &k->w[5], k->sp));
    DT__PLAN_TRY(dt_axpy(c, &k->res1, 1.0f, &k->in));
    DT__PLAN_TRY(dt_layernorm_fwd(c, &k->ln2, &k->ln2m, &k->ln2r, &k->res1, &k->w[6], &k->w[7], 1e-5f));
    DT__PLAN_TRY(dt_tp_column_linear_fwd(k->lay, &k->fch, k->sp ? &k->ln2all : NULL, &k->ln2, &k->w[8], &k->w[9], k->sp));
    DT__PLAN_TRY(dt_gelu_fwd(c, &k->gelu, &k->fch));
    DT__PLAN_TRY(dt_tp_row_linear_fwd(k->lay, &k->y, &k->partial, &k->gelu, &k->w[10], &k->w[11], k->sp));
    DT__PLAN_TRY(dt_axpy(c, &k->y, 1.0f, &k->res1));
fail:
    return err;
}

/* examples/gpt's block_bwd (part 0, no recompute: what recompute adds is timed apart). */
static dt_status dt__plan_blk_bwd(dt__plan_blk *k) {
    dt_ctx *c = k->ctx;
    dt_tensor q2, dq2, a3, da3;
    int64_t s3[3];
    dt_status err;
    s3[0] = k->b; s3[1] = k->Tl; s3[2] = k->Cl;
    if (k->sp) {
        DT__PLAN_TRY(dt_sp_gather_rows(k->lay, &k->ln1all, &k->ln1));
        DT__PLAN_TRY(dt_sp_gather_rows(k->lay, &k->ln2all, &k->ln2));
    }
    DT__PLAN_TRY(dt_tensor_fill(c, &k->dgelu, 0));
    DT__PLAN_TRY(dt_tp_row_linear_bwd(k->lay, &k->dgelu, &k->g[10], &k->g[11], &k->doutbuf, &k->dres, &k->gelu, &k->w[10],
                                    k->sp));
    DT__PLAN_TRY(dt_tensor_fill(c, &k->dfch, 0));
    DT__PLAN_TRY(dt_gelu_bwd(c, &k->dfch, &k->dgelu, &k->fch));
    DT__PLAN_TRY(dt_tensor_fill(c, &k->dln, 0));
    DT__PLAN_TRY(dt_tp_column_linear_bwd(k->lay, &k->dln, &k->g[8], &k->g[9], &k->dxbuf, &k->dfch,
                                       k->sp ? &k->ln2all : &k->ln2, &k->w[8], k->sp));
    DT__PLAN_TRY(dt_layernorm_bwd(c, &k->dres, &k->g[6], &k->g[7], &k->dln, &k->res1, &k->w[6], &k->ln2m, &k->ln2r));
    DT__PLAN_TRY(dt_tensor_fill(c, &k->datty, 0));
    DT__PLAN_TRY(dt_tp_row_linear_bwd(k->lay, &k->datty, &k->g[4], &k->g[5], &k->doutbuf, &k->dres, &k->atty, &k->w[4],
                                    k->sp));
    DT__PLAN_TRY(dt_tensor_fill(c, &k->dqkv, 0));
    DT__PLAN_TRY(dt_tensor_reshape(c, &a3, &k->atty, 3, s3));
    DT__PLAN_TRY(dt_tensor_reshape(c, &da3, &k->datty, 3, s3));
    if (k->lse) DT__PLAN_TRY(dt_cp_attention_bwd(k->lay, &k->dqkv, &da3, &k->qkv, &a3, &k->lse_t, k->Hl, k->Hkvl));
    else if (k->uly) DT__PLAN_TRY(dt_cp_ulysses_bwd(k->lay, &k->dqkv, &da3, &k->uqkv, &k->att, k->Hl, k->Hkvl));
    else DT__PLAN_TRY(dt_attention_gqa_bwd(c, &k->dqkv, &da3, &k->qkv, &k->att, k->Hl, k->Hkvl));
    DT__PLAN_TRY(dt_tensor_fill(c, &k->dall, 0));
    DT__PLAN_TRY(dt__plan_qkv2(k, &q2, &k->qkv));
    DT__PLAN_TRY(dt__plan_qkv2(k, &dq2, &k->dqkv));
    (void)q2;
    DT__PLAN_TRY(dt_linear_bwd(c, &k->dall, &k->g[2], &k->g[3], &dq2, k->sp ? &k->ln1all : &k->ln1, &k->w[2]));
    if (k->sp) DT__PLAN_TRY(dt_sp_scatter_rows(k->lay, &k->dln, &k->dall));
    else {
        DT__PLAN_TRY(dt_tp_allreduce(k->lay, &k->dall));
        DT__PLAN_TRY(dt_tensor_copy(c, &k->dln, &k->dall));
    }
    DT__PLAN_TRY(dt_layernorm_bwd(c, &k->dres, &k->g[0], &k->g[1], &k->dln, &k->in, &k->w[0], &k->ln1m, &k->ln1r));
fail:
    return err;
}

static dt_status dt__plan_embed_fwd(dt__plan_blk *k) {
    dt_status err = dt_tp_embedding_fwd(k->lay, &k->x0, &k->partial, &k->wte, &k->ids,
                                        (int64_t)k->lay->tp_rank * k->Vl, k->Vl * k->lay->tp, k->sp);
    if (!err) err = dt_axpy(k->ctx, &k->x0, 1.0f, &k->xL); /* the positions: one pass over the rows */
    return err;
}
static dt_status dt__plan_embed_bwd(dt__plan_blk *k) {
    dt_status err = dt_tp_embedding_bwd(k->lay, &k->gwte, &k->doutbuf, &k->dres, &k->ids,
                                        (int64_t)k->lay->tp_rank * k->Vl, k->Vl * k->lay->tp, k->sp);
    if (!err) err = dt_axpy(k->ctx, &k->xL, 1.0f, &k->dres);
    return err;
}
static dt_status dt__plan_head_fwd(dt__plan_blk *k) {
    dt_status err;
    DT__PLAN_TRY(dt_layernorm_fwd(k->ctx, &k->lnf, &k->lnfm, &k->lnfr, &k->xL, &k->lnfw, &k->lnfb, 1e-5f));
    DT__PLAN_TRY(dt_tp_column_linear_fwd(k->lay, &k->logits, k->sp ? &k->lnfall : NULL, &k->lnf, &k->wte, NULL, k->sp));
    DT__PLAN_TRY(dt_tp_xent_fwd(k->lay, NULL, NULL, &k->stats, &k->logits, &k->targets,
                              (int64_t)k->lay->tp_rank * k->Vl, k->Vl * k->lay->tp, -1));
fail:
    return err;
}
static dt_status dt__plan_head_bwd(dt__plan_blk *k) {
    dt_status err;
    DT__PLAN_TRY(dt_tp_xent_bwd(k->lay, &k->dlogits, &k->logits, &k->stats, &k->targets,
                              (int64_t)k->lay->tp_rank * k->Vl, k->Vl * k->lay->tp, -1, 1.0f));
    DT__PLAN_TRY(dt_tensor_fill(k->ctx, &k->dln, 0));
    DT__PLAN_TRY(dt_tp_column_linear_bwd(k->lay, &k->dln, &k->gwte, NULL, &k->dxbuf, &k->dlogits,
                                       k->sp ? &k->lnfall : &k->lnf, &k->wte, k->sp));
    DT__PLAN_TRY(dt_tensor_fill(k->ctx, &k->dres, 0));
    DT__PLAN_TRY(dt_layernorm_bwd(k->ctx, &k->dres, &k->glnfw, &k->glnfb, &k->dln, &k->xL, &k->lnfw, &k->lnfm, &k->lnfr));
fail:
    return err;
}
static dt_status dt__plan_cheap_fwd(dt__plan_blk *k) { /* gemm-last's remade inputs */
    dt_status err;
    DT__PLAN_TRY(dt_layernorm_fwd(k->ctx, &k->ln1, &k->ln1m, &k->ln1r, &k->in, &k->w[0], &k->w[1], 1e-5f));
    DT__PLAN_TRY(dt_layernorm_fwd(k->ctx, &k->ln2, &k->ln2m, &k->ln2r, &k->res1, &k->w[6], &k->w[7], 1e-5f));
    DT__PLAN_TRY(dt_gelu_fwd(k->ctx, &k->gelu, &k->fch));
fail:
    return err;
}
static dt_status dt__plan_gelu_fwd(dt__plan_blk *k) { return dt_gelu_fwd(k->ctx, &k->gelu, &k->fch); }

/* The median over `reps` of the slowest rank's time of fn(k), every rank starting together. */
/* t[0 .. n) sorted ascending: v goes in at its place (t has room for n + 1); the medians of
   every timing here come from it */
static void dt__plan_sorted_add(double *t, int n, double v) {
    for (; n > 0 && t[n - 1] > v; n--) t[n] = t[n - 1];
    t[n] = v;
}

/* The median over `reps` of the slowest rank's time of fn over the n copies (in order, or from the
   last under `reverse`, as a backward runs), per copy; every rank starting together. The copies
   are the blocks of a stage: each with its own weights and activations, so the caches hold what
   they hold in the step, not one block's tensors touched again and again. */
static dt_status dt__plan_time(dt_comm *world, dt__plan_blk *k, int n, int reverse, dt_status (*fn)(dt__plan_blk *),
                               int reps, double *out) {
    double t[16], v;
    int i, c;
    dt_status err;
    if (reps > 16) reps = 16;
    for (i = 0; i < reps; i++) {
        err = dt_comm_barrier(world);
        if (err) return err;
        v = dt_comm_now();
        for (c = 0; c < n; c++)
            if ((err = fn(&k[reverse ? n - 1 - c : c]))) return err;
        v = (dt_comm_now() - v) / n;
        err = dt_comm_allreduce_f64(world, &v, 1, DT_REDUCE_MAX);
        if (err) return err;
        dt__plan_sorted_add(t, i, v);
    }
    *out = t[reps / 2];
    return DT_OK;
}

/* The splits and rows the model's layouts on this world need: every (tp, cp, sp, lse, ulysses) with
   the smallest and largest rows a micro-batch takes there. */
static int dt__plan_find_split(const dt_plan_profile *p, int tp, int cp, int sp, int lse, int uly) {
    int i;
    for (i = 0; i < p->n_splits; i++)
        if (p->splits[i].tp == tp && p->splits[i].cp == cp && p->splits[i].sp == sp && p->splits[i].lse == lse &&
            p->splits[i].ulysses == uly)
            return i;
    return -1;
}

static int dt__plan_find_moe(const dt_plan_profile *p, int tp, int cp, int sp, int ep) {
    int i;
    for (i = 0; i < p->n_moes; i++)
        if (p->moes[i].tp == tp && p->moes[i].cp == cp && p->moes[i].sp == sp && p->moes[i].ep == ep) return i;
    return -1;
}

/* A MoE model's layer at (tp, cp, sp) and every ep the layout allows, for a micro-batch of rows. */
static int dt__plan_need_moe(dt_plan_profile *p, const dt_plan_model *m, const dt_plan_layout *l, int64_t rows) {
    int ep, i, dropped = 0;
    for (ep = 1; ep <= l->dp * l->cp; ep++) {
        if ((l->dp * l->cp) % ep || m->experts % ep) continue;
        i = dt__plan_find_moe(p, l->tp, l->cp, l->sp, ep);
        if (i < 0) {
            if (p->n_moes >= DT_PLAN_MAX_MOES) { dropped++; continue; }
            i = p->n_moes++;
            memset(&p->moes[i], 0, sizeof p->moes[i]);
            p->moes[i].tp = l->tp; p->moes[i].cp = l->cp; p->moes[i].sp = l->sp; p->moes[i].ep = ep;
            p->moes[i].rows[0] = p->moes[i].rows[1] = rows;
        }
        if (rows < p->moes[i].rows[0]) p->moes[i].rows[0] = rows;
        if (rows > p->moes[i].rows[1]) p->moes[i].rows[1] = rows;
    }
    return dropped;
}

static int dt__plan_need(dt_plan_profile *p, const dt_plan_model *m, int world) {
    int tp, cp, pp, sp, lse, uly, dropped = 0;
    int64_t dp, micro, rows;
    for (tp = 1; tp <= world; tp++)
        for (cp = 1; tp * cp <= world; cp++)
            for (pp = 1; tp * cp * pp <= world; pp++) {
                dt_plan_layout l;
                if (world % (tp * cp * pp)) continue;
                dp = world / (tp * cp * pp);
                for (micro = 1; micro <= m->batch / dp; micro *= 2)
                    for (sp = 0; sp <= (tp > 1); sp++)
                        for (lse = 0; lse <= 1; lse++)
                            for (uly = 0; uly <= (cp > 1); uly++) {
                                int i, klse = !uly && (lse || cp > 1);
                                memset(&l, 0, sizeof l);
                                l.tp = tp; l.cp = cp; l.pp = pp; l.micro = (int)micro; l.sp = sp; l.ulysses = uly;
                                /* lse: gemm-last's split, which at cp > 1 is the ring's without recompute */
                                l.recompute = lse && cp == 1 ? DT_PLAN_RECOMPUTE_GEMM_LAST : DT_PLAN_RECOMPUTE_NONE;
                                if (cp > 1 && !lse && !uly) continue; /* the ring keeps lse: lse 1's split */
                                if (dt_plan_layout_check(NULL, m, world, &l, &l)) continue;
                                rows = m->batch / dp / micro * (m->seq / cp);
                                if (m->experts) dropped += dt__plan_need_moe(p, m, &l, rows);
                                i = dt__plan_find_split(p, tp, cp, sp, klse, uly);
                                if (i < 0) {
                                    if (p->n_splits >= DT_PLAN_MAX_SPLITS) { dropped++; continue; }
                                    i = p->n_splits++;
                                    memset(&p->splits[i], 0, sizeof p->splits[i]);
                                    p->splits[i].tp = tp; p->splits[i].cp = cp; p->splits[i].sp = sp;
                                    p->splits[i].lse = klse; p->splits[i].ulysses = uly;
                                    p->splits[i].rows[0] = p->splits[i].rows[1] = rows;
                                }
                                if (rows < p->splits[i].rows[0]) p->splits[i].rows[0] = rows;
                                if (rows > p->splits[i].rows[1]) p->splits[i].rows[1] = rows;
                            }
            }
    return dropped;
}

#define DT__PLAN_COPIES 4

static dt_status dt__plan_measure_split(dt_comm *world, const dt_plan_model *m, dt_plan_split *s, int reps) {
    dt_ctx *ctx = dt_comm_ctx(world);
    dt_layout *lay = NULL;
    dt_layout_desc ld;
    dt_status err;
    int j, c;
    memset(&ld, 0, sizeof ld);
    ld.tp = s->tp; ld.cp = s->cp;
    err = dt_layout_create(world, &lay, &ld);
    if (err) return err;
    for (j = 0; j < 2; j++) {
        dt__plan_blk k[DT__PLAN_COPIES];
        int64_t b = s->rows[j] / (m->seq / s->cp);
        int n = m->layers < DT__PLAN_COPIES ? m->layers : DT__PLAN_COPIES;
        size_t before = ctx->bytes_in_use;
        double nd;
        if (j == 1 && s->rows[1] == s->rows[0]) { /* one size: copy */
            s->fwd[1] = s->fwd[0]; s->bwd[1] = s->bwd[0]; s->attn[1] = s->attn[0]; s->cheap[1] = s->cheap[0];
            s->gelu[1] = s->gelu[0]; s->embed_fwd[1] = s->embed_fwd[0]; s->embed_bwd[1] = s->embed_bwd[0];
            s->head_fwd[1] = s->head_fwd[0]; s->head_bwd[1] = s->head_bwd[0]; s->extra[1] = s->extra[0];
            break;
        }
        /* the stage's blocks, as many as fit in 1 GB (at least one); the same count on every rank */
        for (c = 0; c < n; c++) {
            if ((err = dt__plan_blk_make(&k[c], lay, m, b, s->sp, s->lse, s->ulysses))) break;
            if (c == 0 && ctx->bytes_in_use - before > 0) {
                nd = 1e9 / (double)(ctx->bytes_in_use - before);
                if ((err = dt_comm_allreduce_f64(world, &nd, 1, DT_REDUCE_MIN))) { c++; break; }
                if (nd < n) n = nd < 1 ? 1 : (int)nd;
            }
        }
        if (err) { while (c-- > 0) dt__plan_blk_free(&k[c]); break; }
        /* a warm-up of each, which also finds what the ops hold above the tensors (the ctx's
           scratch counts though an earlier split made it: it is part of what these ops need) */
        {
            size_t made = ctx->bytes_in_use, scratch = ctx->scratch_floats * sizeof(float);
            dt_reset_peak_bytes(ctx);
            if (!(err = dt__plan_blk_fwd(&k[0])) && !(err = dt__plan_blk_bwd(&k[0])) && !(err = dt__plan_head_fwd(&k[0])) &&
                !(err = dt__plan_head_bwd(&k[0])) && !(err = dt__plan_embed_fwd(&k[0])))
                err = dt__plan_embed_bwd(&k[0]);
            s->extra[j] = (double)(dt_peak_bytes(ctx) - made + scratch);
            if (!err) err = dt_comm_allreduce_f64(world, &s->extra[j], 1, DT_REDUCE_MAX);
        }
        if (!err &&
            !(err = dt__plan_time(world, k, n, 0, dt__plan_blk_fwd, reps, &s->fwd[j])) &&
            !(err = dt__plan_time(world, k, n, 1, dt__plan_blk_bwd, reps, &s->bwd[j])) &&
            !(err = dt__plan_time(world, k, n, 0, dt__plan_attn_fwd, reps, &s->attn[j])) &&
            !(err = dt__plan_time(world, k, n, 0, dt__plan_cheap_fwd, reps, &s->cheap[j])) &&
            !(err = dt__plan_time(world, k, n, 0, dt__plan_gelu_fwd, reps, &s->gelu[j])) &&
            !(err = dt__plan_time(world, k, 1, 0, dt__plan_embed_fwd, reps, &s->embed_fwd[j])) &&
            !(err = dt__plan_time(world, k, 1, 0, dt__plan_embed_bwd, reps, &s->embed_bwd[j])) &&
            !(err = dt__plan_time(world, k, 1, 0, dt__plan_head_fwd, reps, &s->head_fwd[j])))
            err = dt__plan_time(world, k, 1, 0, dt__plan_head_bwd, reps, &s->head_bwd[j]);
        for (c = 0; c < n; c++) dt__plan_blk_free(&k[c]);
        if (err) break;
    }
    dt_layout_free(lay);
    return err;
}

/* ---- a MoE layer: examples/gpt's moe_fwd / moe_bwd, and the dense MLP they take the place of ---- */

typedef struct dt__plan_xblk {
    dt_moe *moe;
    dt_moe_acts *a;
    dt_tensor w[5], g[5];   /* router [E, C], fc [El, Fl, C] and [El, Fl], proj [El, C, Fl] and [El, C] */
    dt_tensor full, dy, out; /* [N, C] the layer's output (a tp partial), [N, C] sp's gathered grad, [Nl, C] */
} dt__plan_xblk;

/* values about N(0, scale^2) that do not repeat along the rows (a sum of three hashed uniforms): a
   router at its initial scale on layernormed rows sends tokens about evenly, as at a run's start */
static void dt__plan_noise(dt_tensor *t, uint64_t seed, double scale) {
    int64_t i;
    float *f = (float *)t->data;
    for (i = 0; i < t->numel; i++) {
        double u = 0;
        int j;
        for (j = 0; j < 3; j++) {
            uint64_t z = seed + (uint64_t)(3 * i + j) * 0x9E3779B97F4A7C15ull;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            u += (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
        }
        f[i] = (float)(scale * 2 * (u - 1.5));
    }
}

static void dt__plan_xblk_free(dt_ctx *ctx, dt__plan_xblk *x) {
    int i;
    dt_moe_acts_free(x->a);
    dt_moe_free(x->moe);
    for (i = 0; i < 5; i++) { dt_tensor_free(ctx, &x->w[i]); dt_tensor_free(ctx, &x->g[i]); }
    dt_tensor_free(ctx, &x->full); dt_tensor_free(ctx, &x->dy); dt_tensor_free(ctx, &x->out);
    memset(x, 0, sizeof *x);
}

/* k's experts (k made by dt__plan_blk_make): weights, the layer, one micro-batch's acts. Balanced by
   the bias (it keeps no state between a step's forwards and backwards the timing repeats; the aux
   loss's one small all-reduce a step is modelled). */
static dt_status dt__plan_xblk_make(dt__plan_blk *k, dt__plan_xblk *x, const dt_plan_model *m, uint64_t seed) {
    dt_moe_desc md;
    dt_status err;
    int i, El = m->experts / k->lay->ep;
    int64_t d[5][3];
    memset(x, 0, sizeof *x);
    d[0][0] = m->experts; d[0][1] = k->C; d[0][2] = 0;
    d[1][0] = El; d[1][1] = k->Fl; d[1][2] = k->C;
    d[2][0] = El; d[2][1] = k->Fl; d[2][2] = 0;
    d[3][0] = El; d[3][1] = k->C; d[3][2] = k->Fl;
    d[4][0] = El; d[4][1] = k->C; d[4][2] = 0;
    for (i = 0; i < 5; i++) {
        DT__PLAN_TRY(dt__plan_mk(k, &x->w[i], d[i][0], d[i][1], d[i][2], DT_F32));
        DT__PLAN_TRY(dt__plan_mk(k, &x->g[i], d[i][0], d[i][1], d[i][2], DT_F32));
    }
    dt__plan_noise(&x->w[0], seed, 0.02);
    dt__plan_noise(&k->ln2, seed + 1, 1.0); /* the layer's input: layernormed rows */
    if (k->sp) dt__plan_noise(&k->ln2all, seed + 1, 1.0);
    DT__PLAN_TRY(dt__plan_mk(k, &x->full, k->N, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &x->dy, k->N, k->C, 0, DT_F32));
    DT__PLAN_TRY(dt__plan_mk(k, &x->out, k->Nl, k->C, 0, DT_F32));
    memset(&md, 0, sizeof md);
    md.experts = m->experts; md.top_k = m->top_k ? m->top_k : 2; md.width = k->C; md.hidden = 4 * k->C;
    md.seq = k->Tl; md.capacity = k->lay->cp > 1 ? 0 : m->capacity; md.renorm = 1; md.balance = DT_MOE_BIAS;
    DT__PLAN_TRY(dt_moe_create(k->lay, &x->moe, &md));
    k->x = x;
    return DT_OK;
fail:
    dt__plan_xblk_free(k->ctx, x);
    return err;
}

static dt_status dt__plan_moe_fwd(dt__plan_blk *k) {
    dt__plan_xblk *x = k->x;
    const dt_tensor *in = &k->ln2;
    dt_status err;
    if (!x->a) DT__PLAN_TRY(dt_moe_acts_create(x->moe, &x->a));
    if (k->sp) {
        DT__PLAN_TRY(dt_sp_gather_rows(k->lay, &k->ln2all, &k->ln2));
        in = &k->ln2all;
    }
    DT__PLAN_TRY(dt_moe_fwd(x->moe, x->a, &x->full, in, 0, &x->w[0], &x->w[1], &x->w[2], &x->w[3], &x->w[4]));
    if (k->sp) DT__PLAN_TRY(dt_sp_scatter_rows(k->lay, &x->out, &x->full));
    else if (k->lay->tp > 1) DT__PLAN_TRY(dt_tp_allreduce(k->lay, &x->full));
    DT__PLAN_TRY(dt_tensor_copy(k->ctx, &k->y, k->sp ? &x->out : &x->full));
fail:
    return err;
}

static dt_status dt__plan_moe_bwd(dt__plan_blk *k) {
    dt__plan_xblk *x = k->x;
    const dt_tensor *dy = &k->dres;
    dt_status err;
    if (k->sp) {
        DT__PLAN_TRY(dt_sp_gather_rows(k->lay, &x->dy, &k->dres));
        dy = &x->dy;
    }
    DT__PLAN_TRY(dt_tensor_fill(k->ctx, &x->full, 0));
    DT__PLAN_TRY(dt_moe_bwd(x->moe, x->a, &x->full, &x->g[0], &x->g[1], &x->g[2], &x->g[3], &x->g[4], dy,
                            k->sp ? &k->ln2all : &k->ln2, &x->w[0], &x->w[1], &x->w[3], 1.0f));
    if (k->sp) {
        DT__PLAN_TRY(dt_sp_scatter_rows(k->lay, &x->out, &x->full));
        DT__PLAN_TRY(dt_axpy(k->ctx, &k->dln, 1.0f, &x->out));
    } else {
        if (k->lay->tp > 1) DT__PLAN_TRY(dt_tp_allreduce(k->lay, &x->full));
        DT__PLAN_TRY(dt_axpy(k->ctx, &k->dln, 1.0f, &x->full));
    }
fail:
    return err;
}

/* the dense MLP of dt__plan_blk_fwd / _bwd (the backward's gather of ln2's rows under sp with it) */
static dt_status dt__plan_mlp_fwd(dt__plan_blk *k) {
    dt_status err;
    DT__PLAN_TRY(dt_tp_column_linear_fwd(k->lay, &k->fch, k->sp ? &k->ln2all : NULL, &k->ln2, &k->w[8], &k->w[9], k->sp));
    DT__PLAN_TRY(dt_gelu_fwd(k->ctx, &k->gelu, &k->fch));
    DT__PLAN_TRY(dt_tp_row_linear_fwd(k->lay, &k->y, &k->partial, &k->gelu, &k->w[10], &k->w[11], k->sp));
fail:
    return err;
}

static dt_status dt__plan_mlp_bwd(dt__plan_blk *k) {
    dt_status err;
    if (k->sp) DT__PLAN_TRY(dt_sp_gather_rows(k->lay, &k->ln2all, &k->ln2));
    DT__PLAN_TRY(dt_tensor_fill(k->ctx, &k->dgelu, 0));
    DT__PLAN_TRY(dt_tp_row_linear_bwd(k->lay, &k->dgelu, &k->g[10], &k->g[11], &k->doutbuf, &k->dres, &k->gelu, &k->w[10],
                                    k->sp));
    DT__PLAN_TRY(dt_tensor_fill(k->ctx, &k->dfch, 0));
    DT__PLAN_TRY(dt_gelu_bwd(k->ctx, &k->dfch, &k->dgelu, &k->fch));
    DT__PLAN_TRY(dt_tensor_fill(k->ctx, &k->dln, 0));
    DT__PLAN_TRY(dt_tp_column_linear_bwd(k->lay, &k->dln, &k->g[8], &k->g[9], &k->dxbuf, &k->dfch,
                                       k->sp ? &k->ln2all : &k->ln2, &k->w[8], k->sp));
fail:
    return err;
}

/* The bytes in use on the fullest rank, less `base` (this rank's figure before) */
static dt_status dt__plan_held(dt_comm *world, size_t base, double *out) {
    *out = (double)dt_comm_ctx(world)->bytes_in_use - (double)base;
    return dt_comm_allreduce_f64(world, out, 1, DT_REDUCE_MAX);
}

/* A MoE layer at e's split, at both its row counts: as many copies as a stage has MoE blocks (at
   most DT__PLAN_COPIES), each with its own experts. Memory: copy 0's layer and acts after a
   forward and backward (what they grew to), then a second micro-batch's acts on the same layer
   (the acts alone; the layer is the rest), and what the ops hold above it all at their peak. */
static dt_status dt__plan_measure_moe(dt_comm *world, const dt_plan_model *m, dt_plan_moe *e, int reps) {
    dt_ctx *ctx = dt_comm_ctx(world);
    dt_layout *lay = NULL;
    dt_layout_desc ld;
    dt_status err;
    int j, c, every = m->moe_every ? m->moe_every : 1;
    memset(&ld, 0, sizeof ld);
    ld.tp = e->tp; ld.cp = e->cp; ld.ep = e->ep;
    err = dt_layout_create(world, &lay, &ld);
    if (err) return err;
    for (j = 0; j < 2 && !err; j++) {
        dt__plan_blk k[DT__PLAN_COPIES];
        dt__plan_xblk x[DT__PLAN_COPIES];
        int64_t b = e->rows[j] / (m->seq / e->cp);
        int n = m->layers / every < DT__PLAN_COPIES ? m->layers / every : DT__PLAN_COPIES, made = 0;
        size_t base;
        double total = 0;
        if (n < 1) n = 1;
        if (j == 1 && e->rows[1] == e->rows[0]) { /* one size: copy */
            e->fwd[1] = e->fwd[0]; e->bwd[1] = e->bwd[0]; e->mlp_fwd[1] = e->mlp_fwd[0]; e->mlp_bwd[1] = e->mlp_bwd[0];
            e->acts[1] = e->acts[0]; e->layer[1] = e->layer[0]; e->extra[1] = e->extra[0];
            break;
        }
        for (c = 0; c < n && !err; c++) {
            if ((err = dt__plan_blk_make(&k[c], lay, m, b, e->sp, 1, 0))) break;
            if ((err = dt__plan_xblk_make(&k[c], &x[c], m, 1000 * (uint64_t)c + 17))) { dt__plan_blk_free(&k[c]); break; }
            made++;
            if (c == 0) { /* the layer and one micro-batch's acts, as they grow in a step (the weights and
                             grads made above count with the parameters) */
                base = ctx->bytes_in_use;
                if (!(err = dt__plan_moe_fwd(&k[0])) && !(err = dt__plan_moe_bwd(&k[0])))
                    err = dt__plan_held(world, base, &total);
            }
        }
        if (!err) { /* a second micro-batch's acts on copy 0's layer: the acts alone */
            dt_moe_acts *first = x[0].a;
            size_t before;
            x[0].a = NULL;
            before = ctx->bytes_in_use;
            dt_reset_peak_bytes(ctx);
            if (!(err = dt__plan_moe_fwd(&k[0])) && !(err = dt__plan_moe_bwd(&k[0])) &&
                !(err = dt__plan_held(world, before, &e->acts[j]))) {
                e->extra[j] = (double)dt_peak_bytes(ctx) - (double)ctx->bytes_in_use;
                err = dt_comm_allreduce_f64(world, &e->extra[j], 1, DT_REDUCE_MAX);
            }
            dt_moe_acts_free(x[0].a);
            x[0].a = first;
        }
        if (!err) e->layer[j] = total > e->acts[j] ? total - e->acts[j] : 0;
        if (!err &&
            !(err = dt__plan_time(world, k, made, 0, dt__plan_moe_fwd, reps, &e->fwd[j])) &&
            !(err = dt__plan_time(world, k, made, 1, dt__plan_moe_bwd, reps, &e->bwd[j])) &&
            !(err = dt__plan_time(world, k, made, 0, dt__plan_mlp_fwd, reps, &e->mlp_fwd[j])))
            err = dt__plan_time(world, k, made, 1, dt__plan_mlp_bwd, reps, &e->mlp_bwd[j]);
        for (c = 0; c < made; c++) {
            dt__plan_xblk_free(ctx, &x[c]);
            dt__plan_blk_free(&k[c]);
        }
    }
    dt_layout_free(lay);
    return err;
}

/* time of one collective of `elems` f32 (whole buffer) on the groups g, all at once, on dev's tensors
   (CUDA: the device waited for before the clock is read) */
static dt_status dt__plan_coll_once(dt_comm *world, dt_comm *g, dt_plan_coll_kind kind, int64_t elems, int reps,
                                  dt_device dev, double *out) {
    dt_ctx *ctx = dt_comm_ctx(world);
    dt_tensor a, b;
    dt_tensor_desc d;
    dt_status err;
    int n = dt_comm_size(g), r = dt_comm_rank(g), i;
    double t[16], v;
    memset(&a, 0, sizeof a); memset(&b, 0, sizeof b);
    memset(&d, 0, sizeof d);
    elems = (elems + n - 1) / n * n;
    d.shape[0] = elems;
    d.device = dev;
    if ((err = dt_tensor_create(ctx, &a, &d))) return err;
    if (kind == DT_PLAN_ALLGATHER || kind == DT_PLAN_REDUCE_SCATTER) d.shape[0] = elems / n;
    if ((err = dt_tensor_create(ctx, &b, &d))) { dt_tensor_free(ctx, &a); return err; }
    dt_tensor_fill(ctx, &a, 1.0); dt_tensor_fill(ctx, &b, 1.0);
    if (reps > 16) reps = 16;
    for (i = 0; i <= reps; i++) { /* the first is a warm-up */
        if ((err = dt_comm_barrier(world))) break;
        v = dt_comm_now();
        switch (kind) {
        case DT_PLAN_ALLREDUCE: err = dt_comm_allreduce(g, &a, DT_REDUCE_SUM); break;
        case DT_PLAN_ALLGATHER: err = dt_comm_allgather(g, &a, &b); break;
        case DT_PLAN_REDUCE_SCATTER: err = dt_comm_reduce_scatter(g, &b, &a, DT_REDUCE_SUM); break;
        default: /* a ring step, as the pipeline's neighbours exchange */
            if (n > 1) {
                dt_comm_req *rq = NULL;
                err = dt_comm_irecv(g, &b, (r + n - 1) % n, 7, &rq);
                if (!err) err = dt_comm_send(g, &a, (r + 1) % n, 7);
                if (!err) err = dt_comm_wait(rq);
            }
            break;
        }
        if (!err && dev == DT_CUDA_DEVICE) err = dt_ctx_sync(ctx);
        if (err) break;
        v = dt_comm_now() - v;
        if ((err = dt_comm_allreduce_f64(world, &v, 1, DT_REDUCE_MAX))) break;
        if (i > 0) dt__plan_sorted_add(t, i - 1, v); /* the first run is a warm-up */
    }
    dt_tensor_free(ctx, &a);
    dt_tensor_free(ctx, &b);
    if (!err) *out = t[reps / 2];
    return err;
}

/* Each kind on groups of each size that divides the world, all groups at once: consecutive ranks
   (tp's groups), and where those stay inside a host but a group of ranks W / size apart spans
   hosts (dp's and pp's, in Megatron's order), that one too (cross = 1): a layout's group then
   takes the figures of the links it uses. */
static dt_status dt__plan_measure_colls(dt_comm *world, dt_plan_profile *p, int reps) {
    int W = dt_comm_size(world), r = dt_comm_rank(world), size, kind, strided;
    dt_status err = DT_OK;
    for (size = 2; size <= W; size++) {
        if (W % size) continue;
        for (strided = 0; strided <= 1 && !err; strided++) {
            dt_comm *g = NULL;
            int cross;
            if (strided && (p->hosts < 2 || size == W || !dt__plan_spans(W / p->hosts, size, W / size) ||
                            dt__plan_spans(W / p->hosts, size, 1)))
                continue;
            err = dt_comm_split(world, &g, strided ? r % (W / size) : r / size, r);
            if (err) return err;
            cross = dt_comm_hosts(g) > 1;
            for (kind = 0; kind < DT_PLAN_COLL_KINDS && !err; kind++) {
                double t0 = 0, t1 = 0;
                int64_t e0 = 1024, e1 = 1 << 20; /* 4 KB and 4 MB */
                dt_plan_coll *c;
                if (p->n_colls >= DT_PLAN_MAX_COLLS) break;
                if ((err = dt__plan_coll_once(world, g, (dt_plan_coll_kind)kind, e0, reps, DT_CPU, &t0))) break;
                if ((err = dt__plan_coll_once(world, g, (dt_plan_coll_kind)kind, e1, reps, DT_CPU, &t1))) break;
                c = &p->colls[p->n_colls++];
                c->kind = (dt_plan_coll_kind)kind;
                c->size = size;
                c->cross = cross;
                c->beta = t1 > t0 ? (t1 - t0) / (4.0 * (double)(e1 - e0)) : 0.0;
                c->alpha = t0 - c->beta * 4.0 * (double)e0;
                if (c->alpha < 0) c->alpha = 0;
            }
            dt_comm_free(g);
        }
        if (err) break;
    }
    return err;
}

/* AdamW with clipping over n elements (as dt_zero_step runs it on a shard), and a copy's speed;
   then how much of an all-reduce hides behind a GEMM posted after it. */
/* The optimizer step as a DDP rank runs it: dt_zero_step (stage 0) on a one-rank layout of n
   parameters in an arena (the clipping norm, AdamW, the grads zeroed), every rank at once. */
static dt_status dt__plan_measure_opt(dt_comm *world, int reps, int64_t n, double *best) {
    dt_ctx *ctx = dt_comm_ctx(world);
    dt_comm *self = NULL;
    dt_layout *lay = NULL;
    dt_layout_desc ld;
    dt_params ps;
    dt_param *prm = NULL;
    dt_param_desc pd;
    dt_arena *ar = NULL;
    dt_zero *z = NULL;
    dt_zero_desc zd;
    dt_opt_step_info info;
    dt_status err;
    float dloss = 1;
    double t;
    int i;
    *best = 1e30;
    memset(&ps, 0, sizeof ps);
    memset(&pd, 0, sizeof pd);
    memset(&ld, 0, sizeof ld);
    memset(&zd, 0, sizeof zd);
    if ((err = dt_comm_split(world, &self, dt_comm_rank(world), 0))) return err;
    if ((err = dt_layout_create(self, &lay, &ld))) goto done;
    pd.name = "plan"; pd.shape[0] = n; pd.ndim = 1;
    if ((err = dt_params_add(ctx, &ps, &prm, &pd))) goto done;
    if ((err = dt_arena_create(ctx, &ar, &ps, NULL))) goto done;
    zd.opt.kind = DT_OPT_ADAMW; zd.opt.clip_norm = 1.0;
    if ((err = dt_zero_create(lay, &z, ar, &zd))) goto done;
    for (i = 0; i <= reps && !err; i++) {
        if ((err = dt_zero_micro_begin(z, &dloss, 0)) || (err = dt_zero_backward_begin(z))) break;
        dt_tensor_fill(ctx, &ar->grads, 0.001);
        if ((err = dt_comm_barrier(world))) break;
        t = dt_comm_now();
        if ((err = dt_zero_step(z, &info))) break;
        t = dt_comm_now() - t;
        if ((err = dt_comm_allreduce_f64(world, &t, 1, DT_REDUCE_MAX))) break;
        if (i && t < *best) *best = t;
    }
done:
    dt_zero_free(z);
    dt_arena_free(ar);
    dt_params_free(ctx, &ps);
    dt_layout_free(lay);
    dt_comm_free(self);
    return err;
}

/* The optimizer per parameter, a copy's speed, and how much of an all-reduce hides behind GEMMs
   posted after it. */
static dt_status dt__plan_measure_misc(dt_comm *world, dt_plan_profile *p, int reps, int64_t n) {
    dt_ctx *ctx = dt_comm_ctx(world);
    dt_tensor a, b, x, w, y, big;
    dt_tensor_desc d;
    dt_status err;
    double t, best = 1e30, tc = 1e30, tg = 1e30, tb = 1e30, tboth = 1e30;
    int i;
    memset(&a, 0, sizeof a); memset(&b, 0, sizeof b); memset(&x, 0, sizeof x);
    memset(&w, 0, sizeof w); memset(&y, 0, sizeof y); memset(&big, 0, sizeof big);
    if ((err = dt__plan_measure_opt(world, reps, n, &best))) return err;
    p->opt_s_per_param = best / (double)n;
    memset(&d, 0, sizeof d);
    d.shape[0] = 4 << 20; /* 16 MB */
    if ((err = dt_tensor_create(ctx, &a, &d)) || (err = dt_tensor_create(ctx, &b, &d))) goto fail;
    dt_tensor_fill(ctx, &a, 1.0);
    for (i = 0; i <= reps; i++) {
        t = dt_comm_now();
        if ((err = dt_tensor_copy(ctx, &b, &a))) goto fail;
        t = dt_comm_now() - t;
        if (i && t < tc) tc = t;
    }
    if ((err = dt_comm_allreduce_f64(world, &tc, 1, DT_REDUCE_MAX))) goto fail; /* the same on every rank */
    p->copy_s_per_byte = tc / (16.0 * (double)(1 << 20));
    /* overlap: a 4 MB all-reduce over the world posted, a GEMM, the wait; against each alone */
    d.shape[0] = 256; d.shape[1] = 256;
    if ((err = dt_tensor_create(ctx, &x, &d)) || (err = dt_tensor_create(ctx, &w, &d)) ||
        (err = dt_tensor_create(ctx, &y, &d)))
        goto fail;
    dt_tensor_fill(ctx, &x, 0.01); dt_tensor_fill(ctx, &w, 0.01);
    memset(&d, 0, sizeof d);
    d.shape[0] = 1 << 20; /* 4 MB */
    if ((err = dt_tensor_create(ctx, &big, &d))) goto fail;
    dt_tensor_fill(ctx, &big, 1.0);
    p->overlap = 0;
    if (dt_comm_size(world) > 1) {
        for (i = 0; i <= reps; i++) {
            int k;
            dt_comm_req *rq = NULL;
            if ((err = dt_comm_barrier(world))) goto fail;
            t = dt_comm_now();
            for (k = 0; k < 8; k++) if ((err = dt_matmul_fwd(ctx, &y, &x, &w, 0, 0, 1.0f, 0.0f))) goto fail;
            t = dt_comm_now() - t;
            if ((err = dt_comm_allreduce_f64(world, &t, 1, DT_REDUCE_MAX))) goto fail;
            if (i && t < tg) tg = t;
            if ((err = dt_comm_barrier(world))) goto fail;
            t = dt_comm_now();
            if ((err = dt_comm_allreduce(world, &big, DT_REDUCE_SUM))) goto fail;
            t = dt_comm_now() - t;
            if ((err = dt_comm_allreduce_f64(world, &t, 1, DT_REDUCE_MAX))) goto fail;
            if (i && t < tb) tb = t;
            if ((err = dt_comm_barrier(world))) goto fail;
            t = dt_comm_now();
            if ((err = dt_comm_iallreduce(world, &big, DT_REDUCE_SUM, &rq))) goto fail;
            for (k = 0; k < 8; k++) if ((err = dt_matmul_fwd(ctx, &y, &x, &w, 0, 0, 1.0f, 0.0f))) goto fail;
            if ((err = dt_comm_wait(rq))) goto fail;
            t = dt_comm_now() - t;
            if ((err = dt_comm_allreduce_f64(world, &t, 1, DT_REDUCE_MAX))) goto fail;
            if (i && t < tboth) tboth = t;
        }
        t = tg < tb ? tg : tb;
        p->overlap = t > 0 ? (tg + tb - tboth) / t : 0;
        if (p->overlap < 0) p->overlap = 0;
        if (p->overlap > 1) p->overlap = 1;
    }
fail:
    dt_tensor_free(ctx, &a); dt_tensor_free(ctx, &b); dt_tensor_free(ctx, &x);
    dt_tensor_free(ctx, &w); dt_tensor_free(ctx, &y); dt_tensor_free(ctx, &big);
    return err;
}

/* ---- the pipeline's messages: dt_pp_run with stages that spin for the block times ---- */

static double dt__plan_at(const int64_t r[2], const double v[2], double rows);
static double dt__plan_coll(const dt_plan_profile *p, dt_plan_coll_kind kind, int size, int stride, double bytes);

typedef struct dt__plan_spin {
    double f, b; /* CPU seconds a forward / a full backward of one (chunk, micro) spins */
} dt__plan_spin;

/* Compute that calls no MPI, as a block's does, for s seconds of this process's CPU time: where
   ranks share cores it takes longer on the wall clock, as the block would. */
/* This thread's CPU seconds (clock() counts the whole process: a BLAS thread pool spinning beside
   it would cut the spin short). dt_comm.h's implementation has declared clock_gettime (its
   DT__CM_CLOCK); without it, clock(). */
static double dt__plan_cpu_now(void) {
#if defined(DT__CM_CLOCK) && DT__CM_CLOCK == 1 && defined(CLOCK_THREAD_CPUTIME_ID)
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#elif defined(DT__CM_CLOCK) && DT__CM_CLOCK == 2
    struct dt__cm_timespec ts;
    clock_gettime(3, &ts); /* CLOCK_THREAD_CPUTIME_ID on Linux */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#else
    return (double)clock() / CLOCKS_PER_SEC;
#endif
}

static void dt__plan_spin_for(double s) {
    double t0 = dt__plan_cpu_now();
    while (dt__plan_cpu_now() - t0 < s) {
    }
}
static dt_status dt__plan_spin_fwd(void *u, int c, int i, dt_tensor *out, const dt_tensor *in) {
    (void)c; (void)i; (void)out; (void)in;
    dt__plan_spin_for(((const dt__plan_spin *)u)->f);
    return DT_OK;
}
static dt_status dt__plan_spin_bwd(void *u, int c, int i, dt_tensor *din, const dt_tensor *dout, dt_pp_part part) {
    (void)c; (void)i; (void)din; (void)dout;
    dt__plan_spin_for(((const dt__plan_spin *)u)->b * (part == DT_PP_PART_FULL || part == DT_PP_PART_DEFAULT ? 1 : 0.5));
    return DT_OK;
}

/* The message buffers dt_pp_run's pool grows to on the stage that needs most, from the schedule's
   lists: a posted receive holds one until its micro-batch's last backward pass on that chunk; a
   compute that sends (F before the last virtual stage, B / BI after the first) takes one, and the
   send holds it until the stage next waits for a receive (the compute of a received activation or
   gradient). On CPU, MPI moves a message of rendezvous size only while both ends are inside MPI,
   and a stage that computes between its tests does not finish its sends before it blocks in a
   wait: GPipe's stage 0 holds its m sends and the 2 receives it posted first (m + 2). The pool
   keeps what it grew to, so its peak is what dt_peak_bytes sees. */
static int dt__plan_pp_buffers(const dt_pp_schedule *s) {
    int st, j, best = 0, V = s->stages * s->chunks;
    for (st = 0; st < s->stages; st++) {
        int held = 0, peak = 0, sends = 0, slots = s->chunks * s->micro;
        unsigned char *in = (unsigned char *)calloc((size_t)slots * 2, 1);
        if (!in) return 0;
        for (j = 0; j < s->count[st]; j++) {
            const dt_pp_action *a = &s->actions[st][j];
            int k = a->chunk * s->stages + st, at = a->chunk * s->micro + a->micro;
            if (a->chunk < 0 || a->chunk >= s->chunks || a->micro < 0 || a->micro >= s->micro) continue;
            switch (a->op) {
            case DT_PP_RECV_ACT: case DT_PP_RECV_GRAD:
                held++;
                in[2 * at + (a->op == DT_PP_RECV_GRAD)] = 1;
                break;
            case DT_PP_SEND_ACT: case DT_PP_SEND_GRAD:
                sends++;
                break;
            case DT_PP_F: case DT_PP_B: case DT_PP_BI: case DT_PP_BW: {
                int waits = a->op == DT_PP_F ? k > 0 : a->op != DT_PP_BW && k < V - 1;
                if (waits) { held -= sends; sends = 0; }
                held += a->op == DT_PP_F ? k < V - 1 : a->op != DT_PP_BW && k > 0;
                if (held > peak) peak = held;
                if (a->op == DT_PP_B || a->op == DT_PP_BW) { /* the micro-batch's last pass: its buffers go back */
                    held -= in[2 * at] + in[2 * at + 1];
                    in[2 * at] = in[2 * at + 1] = 0;
                }
                break;
            }
            default: break;
            }
            if (held > peak) peak = held;
        }
        free(in);
        if (peak > best) best = peak;
    }
    return best;
}

/* The pipeline's step: schedule s simulated with stage s's costs fst[s], bst[s] (timed with every
   rank computing) and message delay d. Where a host has more ranks (rph) than cores, the blocks
   were timed at a share min(1, cores / rph) of a core, but in a pipeline only the busy share u of
   the ranks computes at a time and gets the cores the waiting ones give up (dt_comm's waits
   yield): a block's time scales to the share min(1, cores / (u rph)). u comes out of the
   simulation, so a few rounds find the fixed point. fst, bst are scaled in place. */
static dt_status dt__plan_simulate(dt_pp_schedule *s, double *fst, double *bst, double d, double rph, double cores,
                                   int whole_b, dt_pp_stats *out) {
    dt_pp_sim_desc sd;
    double sb = rph > cores ? cores / rph : 1, k = 1;
    int st, it;
    dt_status err;
    memset(&sd, 0, sizeof sd);
    for (st = 0; st < s->stages; st++) { sd.f += fst[st] / s->stages; sd.b += bst[st] / s->stages; }
    if (!(sd.f > 0)) sd.f = 1e-12;
    if (!(sd.b > 0)) sd.b = 2e-12;
    sd.comm = d;
    if (whole_b) { /* ZB-H1 whose model does not split its backward: BI is all of it, BW (almost) nothing */
        sd.bi = sd.b * (1 - 1e-9);
        sd.bw = sd.b * 1e-9;
    }
    sd.stage_f = fst; sd.stage_b = bst;
    err = dt_pp_schedule_simulate(s, out, &sd);
    for (it = 0; !err && sb < 1 && it < 4; it++) {
        double u = 1 - out->bubble, su = u > 0 ? cores / (u * rph) : 1, kn;
        if (su > 1) su = 1;
        kn = sb / su;
        for (st = 0; st < s->stages; st++) { fst[st] *= kn / k; bst[st] *= kn / k; }
        sd.f *= kn / k; sd.b *= kn / k; sd.bi *= kn / k; sd.bw *= kn / k;
        k = kn;
        err = dt_pp_schedule_simulate(s, out, &sd);
    }
    return err;
}

/* the makespan of a pipeline of uniform stages (f, b each) and message delay d; -1 on an error */
static double dt__plan_sim(dt_pp_schedule *s, double f, double b, double d, double rph, double cores) {
    double fst[64], bst[64];
    dt_pp_stats st;
    int i;
    if (s->stages > 64) return -1;
    for (i = 0; i < s->stages; i++) { fst[i] = f; bst[i] = b; }
    return dt__plan_simulate(s, fst, bst, d, rph, cores, 0, &st) ? -1 : st.makespan;
}

static dt_status dt__plan_measure_pipe(dt_comm *world, const dt_plan_model *m, dt_plan_profile *p, int pp,
                                       dt_pp_kind kind, int reps) {
    dt_ctx *ctx = dt_comm_ctx(world);
    dt_layout *lay = NULL;
    dt_layout_desc ld;
    dt_pp_schedule *sch = NULL;
    dt_pp_desc pd;
    dt_pp_model pm;
    dt__plan_spin sp, spin;
    dt_plan_pipe *pi;
    double rph = 1, cpu;
    dt_status err;
    int W = dt_comm_size(world), dp = W / pp, si = dt__plan_find_split(p, 1, 1, 0, 0, 0), j, i, micro = 2 * pp;
    int64_t micro_max = 1;
    if (si < 0 || p->n_pipes >= DT_PLAN_MAX_PIPES || m->batch % dp || m->batch < dp)
        return DT_OK; /* nothing to scale the compute by, or no layout has this pipeline */
    while (micro_max * 2 <= 16 && m->batch % (dp * micro_max * 2) == 0) micro_max *= 2;
    pi = &p->pipes[p->n_pipes];
    memset(pi, 0, sizeof *pi);
    pi->pp = pp;
    pi->kind = kind;
    memset(&ld, 0, sizeof ld);
    ld.pp = pp;
    if ((err = dt_layout_create(world, &lay, &ld))) return err;
    memset(&pd, 0, sizeof pd);
    pd.kind = kind; pd.stages = pp; pd.micro = micro;
    if ((err = dt_pp_schedule_create(ctx, &sch, &pd))) { dt_layout_free(lay); return err; }
    for (j = 0; j < 2 && !err; j++) {
        double rows = (double)(m->batch / dp / (j ? 1 : micro_max)) * (double)m->seq, t[16], meas, lo = 0, hi, blocks;
        double scale = 1;
        const dt_plan_split *s = &p->splits[si];
        memset(&pm, 0, sizeof pm);
        blocks = (double)m->layers / pp;
        sp.f = blocks * dt__plan_at(s->rows, s->fwd, rows);
        sp.b = blocks * dt__plan_at(s->rows, s->bwd, rows);
        rph = (double)W / dt_comm_hosts(world);
        if ((sp.f + sp.b) * (micro + pp - 1) > 1.0) { /* at most a second a run: the delay found is scaled back */
            scale = 1.0 / ((sp.f + sp.b) * (micro + pp - 1));
            sp.f *= scale; sp.b *= scale;
        }
        /* the spin is CPU time: the block's wall time times the share of a core it was timed at */
        cpu = rph > p->cores ? p->cores / rph : 1;
        spin.f = sp.f * cpu; spin.b = sp.b * cpu;
        pm.user = &spin; pm.forward = dt__plan_spin_fwd; pm.backward = dt__plan_spin_bwd;
        pm.act.shape[0] = (int64_t)rows; pm.act.shape[1] = m->width;
        pi->bytes[j] = rows * m->width * 4;
        for (i = 0; i <= reps && !err; i++) {
            dt_pp_run_stats rs;
            double v;
            if ((err = dt_comm_barrier(world))) break;
            v = dt_comm_now();
            if ((err = dt_pp_run(lay, &rs, sch, &pm, NULL))) break;
            v = dt_comm_now() - v;
            if ((err = dt_comm_allreduce_f64(world, &v, 1, DT_REDUCE_MAX))) break;
            if (i > 0) dt__plan_sorted_add(t, i - 1, v); /* the first run is a warm-up */
        }
        if (err) break;
        meas = t[reps / 2];
        /* the delay that makes the simulation's makespan the measured one */
        hi = meas;
        if (dt__plan_sim(sch, sp.f, sp.b, 0, rph, p->cores) >= meas) hi = 0;
        for (i = 0; i < 40 && hi > 0; i++) {
            double mid = 0.5 * (lo + hi);
            if (dt__plan_sim(sch, sp.f, sp.b, mid, rph, p->cores) < meas) lo = mid;
            else hi = mid;
        }
        /* Past the bare send, the delay is a multiple of the stages' compute: a message moves only
           while its sender is back inside MPI, after its next pass (bench/plan's model at pp 2: GPipe
           2.8 forwards, 1F1B 2.1, at 256 to 2048 rows). A probe whose spin was cut to a second
           finds the wait of that shorter compute: scaled back, it is the block's (found 202 ms at a
           spin of 0.77 of the block, 261 at the whole: 202 / 0.77 = 262). The send itself (the
           next stage is dp ranks on) does not scale. */
        {
            double send = dt__plan_coll(p, DT_PLAN_SENDRECV, 2, dp, pi->bytes[j]);
            pi->delay[j] = hi > send ? send + (hi - send) / scale : hi;
        }
    }
    dt_pp_schedule_free(sch);
    dt_layout_free(lay);
    if (!err) p->n_pipes++;
    return err;
}

/* The repeats for the next timing: reps, or one once half the budget is spent (the slowest rank's
   clock, so that every rank decides alike) */
static dt_status dt__plan_reps_left(dt_comm *world, double t0, double budget_s, int reps, int *out) {
    double el = dt_comm_now() - t0;
    dt_status err = dt_comm_allreduce_f64(world, &el, 1, DT_REDUCE_MAX);
    *out = el > budget_s * 0.5 ? 1 : reps;
    return err;
}

DT_API dt_status dt_plan_profile_measure(dt_comm *world, const dt_plan_model *m, const dt_plan_measure_desc *desc,
                                         dt_plan_profile *out) {
    static const char *fn = "dt_plan_profile_measure";
    dt_ctx *ctx;
    dt_plan_measure_desc md;
    dt_status err;
    double t0 = dt_comm_now();
    int i, reps, r;
    struct utsname un;
    if (!world || !out)
        return dt_ctx_set_error(dt_comm_ctx(world), DT_ERR_ARG, "%s: %s is NULL", fn, world ? "out" : "world");
    ctx = dt_comm_ctx(world);
    if (ctx->device == DT_CUDA_DEVICE)
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: world's ctx is on cuda, and the block this profile times "
                                "is the CPU path's; on CUDA measure the machine (dt_plan_machine_measure) and plan on "
                                "paper (dt_plan_profile_paper)", fn);
    err = dt__plan_model_check(ctx, fn, m);
    if (err) return err;
    if ((m->ffn && m->ffn != 4 * m->width) || m->gated)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model ffn %d, gated %d: the block it times is examples/gpt's (ffn "
                                "4 x width = %d, not gated); plan other MLPs on paper (dt_plan_profile_paper)", fn,
                                m->ffn, m->gated, 4 * m->width);
    if (desc) md = *desc;
    else memset(&md, 0, sizeof md);
    if (md.budget_s <= 0) md.budget_s = 40;
    reps = md.repeats > 0 ? md.repeats : 3;
    if (reps > 16) reps = 16; /* the medians are taken from arrays of 16 */
    memset(out, 0, sizeof *out);
    out->model = *m;
    out->model.expert_load = NULL; /* the caller's (a profile holds shapes) */
    out->model.n_expert_load = 0;
    if (!out->model.kv_heads) out->model.kv_heads = m->heads;
    if (!out->model.dtype) out->model.dtype = DT_F32;
    out->world = dt_comm_size(world);
    out->hosts = dt_comm_hosts(world);
    { /* the fewest cores any rank's host has: the same figure on every rank (the pipeline probe's
         bisection and every prediction read it) */
        double c = (double)sysconf(_SC_NPROCESSORS_ONLN);
        if (!(c >= 1)) c = 1;
        if ((err = dt_comm_allreduce_f64(world, &c, 1, DT_REDUCE_MIN))) return err;
        out->cores = (int)c;
    }

    snprintf(out->machine, sizeof out->machine, "%.60s, %d cores", uname(&un) == 0 ? un.nodename : "?", out->cores);
    if (dt__plan_need(out, &out->model, out->world))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: the layouts of this model on %d ranks need more than %d (tp, cp, sp) "
                                "splits (DT_PLAN_MAX_SPLITS) or %d MoE ones (DT_PLAN_MAX_MOES)", fn, out->world,
                                DT_PLAN_MAX_SPLITS, DT_PLAN_MAX_MOES);
    if (!out->n_splits)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: no layout of this model fits a world of %d ranks", fn, out->world);
    { /* the optimizer at the most parameters a rank holds (one rank, the whole model): its four
         f32 streams at their real size, past the caches as in the step; at most 64M */
        double psi = m->layers * dt__plan_block_params(&out->model, 1) + (double)m->vocab * m->width +
                     (double)m->seq * m->width;
        if (psi > 64e6) psi = 64e6;
        if ((err = dt__plan_measure_misc(world, out, reps, (int64_t)psi))) return err;
    }
    if ((err = dt__plan_measure_colls(world, out, reps))) return err;
    /* past half the budget, one repeat each (decided alike on every rank) */
    for (i = 0; i < out->n_splits; i++)
        if ((err = dt__plan_reps_left(world, t0, md.budget_s, reps, &r)) ||
            (err = dt__plan_measure_split(world, &out->model, &out->splits[i], r)))
            return err;
    for (i = 0; i < out->n_moes; i++) /* a MoE model's layer at each split and ep */
        if ((err = dt__plan_reps_left(world, t0, md.budget_s, reps, &r)) ||
            (err = dt__plan_measure_moe(world, &out->model, &out->moes[i], r)))
            return err;
    for (i = 2; i <= out->world && i <= m->layers && i <= 64; i++) { /* after the splits: their block times set the spins */
        static const dt_pp_kind kinds[3] = {DT_PP_1F1B, DT_PP_GPIPE, DT_PP_ZB_H1};
        int k;
        for (k = 0; k < 3 && out->world % i == 0; k++) { /* a MoE model runs no ZB-H1; 1F1B's repeats, others' two */
            if (m->experts && kinds[k] == DT_PP_ZB_H1) continue;
            if ((err = dt__plan_reps_left(world, t0, md.budget_s, k && reps > 2 ? 2 : reps, &r)) ||
                (err = dt__plan_measure_pipe(world, &out->model, out, i, kinds[k], r)))
                return err;
        }
    }
    out->measure_s = dt_comm_now() - t0;
    /* every rank plans from the same bytes: rank 0's (its host name, a group's cross flag) */
    return dt_plan_profile_broadcast(world, out, 0);
}

/* root's n bytes at p to every rank of c (a plain struct: no pointers) */
static dt_status dt__plan_bcast(dt_comm *c, void *p, size_t n, int root) {
    dt_ctx *ctx = dt_comm_ctx(c);
    dt_tensor t;
    dt_tensor_desc d;
    dt_status err;
    memset(&d, 0, sizeof d);
    d.dtype = DT_U8;
    d.shape[0] = (int64_t)n;
    if ((err = dt_tensor_create(ctx, &t, &d))) return err;
    memcpy(t.data, p, n);
    err = dt_comm_broadcast(c, &t, root);
    if (!err) memcpy(p, t.data, n);
    dt_tensor_free(ctx, &t);
    return err;
}

DT_API dt_status dt_plan_profile_broadcast(dt_comm *c, dt_plan_profile *p, int root) {
    dt_status err;
    if (!c || !p)
        return dt_ctx_set_error(dt_comm_ctx(c), DT_ERR_ARG, "dt_plan_profile_broadcast: %s is NULL", c ? "p" : "c");
    err = dt__plan_bcast(c, p, sizeof *p, root);
    p->model.expert_load = NULL; /* root's address: the loads are each caller's to set */
    p->model.n_expert_load = 0;
    return err;
}

/* ---- JSON ---- */

#define DT__PLAN_SPLIT_FIELDS(X) \
    X(fwd) X(bwd) X(attn) X(cheap) X(gelu) X(embed_fwd) X(embed_bwd) X(head_fwd) X(head_bwd) X(extra)
#define DT__PLAN_MOE_FIELDS(X) X(fwd) X(bwd) X(mlp_fwd) X(mlp_bwd) X(acts) X(layer) X(extra)

/* b's text into the file at path, and b freed: DT_ERR_OOM when b ran out of memory, DT_ERR_IO
   naming fn and the file when it cannot be written whole (closed once, whatever happened). */
static dt_status dt__plan_write(dt_ctx *ctx, const char *fn, const char *path, dt_strbuf *b) {
    FILE *f;
    int written;
    if (b->failed) { dt_strbuf_free(b); return dt_ctx_set_error(ctx, DT_ERR_OOM, "%s: out of memory", fn); }
    f = fopen(path, "wb");
    written = f && fwrite(b->text, 1, b->len, f) == b->len;
    if (f && fclose(f)) written = 0;
    dt_strbuf_free(b);
    return written ? DT_OK : dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot write %s", fn, path);
}

DT_API dt_status dt_plan_profile_save(dt_ctx *ctx, const dt_plan_profile *p, const char *path) {
    dt_strbuf b;
    int i;
    char moe[256] = "";
    const dt_plan_model *m;
    if (!p || !path) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_plan_profile_save: %s is NULL", p ? "path" : "p");
    if (p->paper)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_plan_profile_save: a paper profile (%s) is made from its machine "
                                "file in microseconds: keep that file instead", p->mach.name);
    m = &p->model;
    if (m->experts) /* a MoE model's fields (a dense model's file reads as before) */
        snprintf(moe, sizeof moe, ", \"experts\": %d, \"top_k\": %d, \"moe_every\": %d, \"moe_shared\": %d, \"capacity\": "
                 "%.17g, \"balance\": \"%s\"", m->experts, m->top_k, m->moe_every, m->moe_shared, m->capacity,
                 dt_moe_balance_name(m->balance == DT_MOE_BALANCE_DEFAULT ? DT_MOE_AUX : m->balance));
    memset(&b, 0, sizeof b);
    b.ctx = ctx;
    dt_strbuf_str(&b, "{\"dt_plan_profile\": 1, \"machine\": ");
    dt_strbuf_json(&b, p->machine);
    dt_strbuf_printf(&b, ", \"world\": %d, \"hosts\": %d, \"cores\": %d,\n \"model\": {\"layers\": %d, \"width\": %d, "
                     "\"heads\": %d, \"kv_heads\": %d, \"vocab\": %lld, \"seq\": %lld, \"batch\": %lld, \"dtype\": \"%s\", "
                     "\"ffn\": %d, \"gated\": %d%s},\n"
                     " \"opt_s_per_param\": %.17g, \"copy_s_per_byte\": %.17g, \"overlap\": %.17g, \"measure_s\": %.3f,\n"
                     " \"splits\": [", p->world, p->hosts, p->cores, m->layers, m->width, m->heads, m->kv_heads,
                     (long long)m->vocab, (long long)m->seq, (long long)m->batch, dt_dtype_name(m->dtype), m->ffn,
                     m->gated, moe, p->opt_s_per_param, p->copy_s_per_byte, p->overlap, p->measure_s);
    for (i = 0; i < p->n_splits; i++) {
        const dt_plan_split *s = &p->splits[i];
        dt_strbuf_printf(&b, "%s\n  {\"tp\": %d, \"cp\": %d, \"sp\": %d, \"lse\": %d, \"ulysses\": %d, \"rows\": [%lld, %lld]",
                         i ? "," : "", s->tp, s->cp, s->sp, s->lse, s->ulysses, (long long)s->rows[0],
                         (long long)s->rows[1]);
#define DT__PLAN_W(f) dt_strbuf_printf(&b, ", \"" #f "\": [%.17g, %.17g]", s->f[0], s->f[1]);
        DT__PLAN_SPLIT_FIELDS(DT__PLAN_W)
#undef DT__PLAN_W
        dt_strbuf_str(&b, "}");
    }
    dt_strbuf_str(&b, "],\n \"collectives\": [");
    for (i = 0; i < p->n_colls; i++) {
        static const char *const kn[DT_PLAN_COLL_KINDS] = {"allreduce", "allgather", "reduce_scatter", "sendrecv"};
        const dt_plan_coll *c = &p->colls[i];
        dt_strbuf_printf(&b, "%s\n  {\"kind\": \"%s\", \"size\": %d, \"cross\": %d, \"alpha\": %.17g, \"beta\": %.17g}",
                         i ? "," : "", kn[c->kind], c->size, c->cross, c->alpha, c->beta);
    }
    dt_strbuf_str(&b, "],\n \"pipes\": [");
    for (i = 0; i < p->n_pipes; i++)
        dt_strbuf_printf(&b, "%s\n  {\"pp\": %d, \"kind\": \"%s\", \"bytes\": [%.17g, %.17g], \"delay\": [%.17g, %.17g]}",
                         i ? "," : "", p->pipes[i].pp,
                         dt_pp_kind_name(p->pipes[i].kind == DT_PP_DEFAULT ? DT_PP_1F1B : p->pipes[i].kind), p->pipes[i].bytes[0], p->pipes[i].bytes[1], p->pipes[i].delay[0],
                         p->pipes[i].delay[1]);
    dt_strbuf_str(&b, "],\n \"moes\": [");
    for (i = 0; i < p->n_moes; i++) {
        const dt_plan_moe *s = &p->moes[i];
        dt_strbuf_printf(&b, "%s\n  {\"tp\": %d, \"cp\": %d, \"sp\": %d, \"ep\": %d, \"rows\": [%lld, %lld]", i ? "," : "",
                         s->tp, s->cp, s->sp, s->ep, (long long)s->rows[0], (long long)s->rows[1]);
#define DT__PLAN_W(f) dt_strbuf_printf(&b, ", \"" #f "\": [%.17g, %.17g]", s->f[0], s->f[1]);
        DT__PLAN_MOE_FIELDS(DT__PLAN_W)
#undef DT__PLAN_W
        dt_strbuf_str(&b, "}");
    }
    dt_strbuf_str(&b, "]}\n");
    return dt__plan_write(ctx, "dt_plan_profile_save", path, &b);
}

/* The JSON of the file at path (at most max bytes), or an error naming fn and the file. */
static dt_status dt__plan_read_json(dt_ctx *ctx, const char *fn, const char *path, long max, dt_json **out) {
    FILE *f = fopen(path, "rb");
    char *text;
    long len;
    dt_status err;
    *out = NULL;
    if (!f) return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot open %s", fn, path);
    if (fseek(f, 0, SEEK_END) || (len = ftell(f)) < 0 || len > max || fseek(f, 0, SEEK_SET)) {
        fclose(f);
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: not a readable file of at most %ld bytes", fn, path, max);
    }
    text = (char *)dt_alloc(ctx, (size_t)len + 1);
    if (!text) { fclose(f); return dt_ctx_set_error(ctx, DT_ERR_OOM, "%s: out of memory for %s", fn, path); }
    if (fread(text, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        dt_release(ctx, text);
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot read %s", fn, path);
    }
    fclose(f);
    err = dt_json_parse(ctx, out, text, (size_t)len);
    dt_release(ctx, text);
    if (err) { /* the parser's message, copied out of the buffer the new one is written into */
        char why[DT_ERROR_MAX];
        snprintf(why, sizeof why, "%s", dt_ctx_error(ctx));
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: %s", fn, path, why);
    }
    return DT_OK;
}

/* A check's DT_ERR_ARG about what a file gave (its fn argument "reader: path"), said as the
   file's DT_ERR_FORMAT. The message is copied out of the buffer the new one is written into. */
static dt_status dt__plan_as_format(dt_ctx *ctx, dt_status err) {
    char why[DT_ERROR_MAX];
    if (!err) return DT_OK;
    snprintf(why, sizeof why, "%s", dt_ctx_error(ctx));
    return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s", why);
}

/* a file's value as its error names it: the number, "(missing)" or "(not a number)"; in v[48] */
static const char *dt__plan_jval(const dt_json *j, char v[48]) {
    if (!j) snprintf(v, 48, "(missing)");
    else if (j->type != DT_JSON_NUMBER) snprintf(v, 48, "(not a number)");
    else snprintf(v, 48, "%.9g", j->number);
    return v;
}

/* a number field of obj within [lo, hi], named in the error */
static dt_status dt__plan_num(dt_ctx *ctx, const char *path, const dt_json *obj, const char *where, const char *key,
                            double lo, double hi, double *out) {
    const dt_json *j = dt_json_get(obj, key);
    char v[48];
    if (!j || j->type != DT_JSON_NUMBER || !(j->number >= lo && j->number <= hi))
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "dt_plan_profile_load: %s: %s%s = %s, expected a number in [%g, %g]",
                                path, where, key, dt__plan_jval(j, v), lo, hi);
    *out = j->number;
    return DT_OK;
}
static dt_status dt__plan_pair(dt_ctx *ctx, const char *path, const dt_json *obj, const char *where, const char *key,
                             double hi, double out[2]) {
    const dt_json *j = dt_json_get(obj, key);
    char v[48];
    int i;
    if (!j || j->type != DT_JSON_ARRAY || j->count != 2)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "dt_plan_profile_load: %s: %s%s: expected an array of 2 numbers", path,
                                where, key);
    for (i = 0; i < 2; i++)
        if (j->items[i].type != DT_JSON_NUMBER || !(j->items[i].number >= 0 && j->items[i].number <= hi))
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "dt_plan_profile_load: %s: %s%s[%d] = %s, expected a number in "
                                    "[0, %g]", path, where, key, i, dt__plan_jval(&j->items[i], v), hi);
        else out[i] = j->items[i].number;
    return DT_OK;
}

DT_API dt_status dt_plan_profile_load(dt_ctx *ctx, dt_plan_profile *p, const char *path) {
    static const char *fn = "dt_plan_profile_load";
    char where[48], at[DT_ERROR_MAX];
    dt_json *root = NULL;
    const dt_json *j, *mo, *arr;
    dt_status err;
    double v;
    int i;
    if (!p || !path) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, p ? "path" : "p");
    memset(p, 0, sizeof *p);
    if ((err = dt__plan_read_json(ctx, fn, path, 64L << 20, &root))) return err;
#define DT__PLAN_N(obj, w, key, lo, hi, dst) \
    do { if ((err = dt__plan_num(ctx, path, obj, w, key, lo, hi, &v))) goto done; dst = v; } while (0)
    /* a count: an integer (a fraction would be cut to one silently) */
#define DT__PLAN_I(obj, w, key, lo, hi, dst) \
    do { \
        if ((err = dt__plan_num(ctx, path, obj, w, key, lo, hi, &v))) goto done; \
        if (v != floor(v)) { \
            err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: %s%s = %.9g, expected an integer in [%g, %g]", fn, path, \
                                   w, key, v, (double)(lo), (double)(hi)); \
            goto done; \
        } \
        dst = v; \
    } while (0)
    if (root->type != DT_JSON_OBJECT || !dt_json_get(root, "dt_plan_profile")) {
        err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: not a dt_plan profile (no \"dt_plan_profile\" key)", fn, path);
        goto done;
    }
    j = dt_json_get(root, "machine");
    if (j && j->type == DT_JSON_STRING) snprintf(p->machine, sizeof p->machine, "%s", j->string);
    DT__PLAN_I(root, "", "world", 1, 1 << 20, p->world);
    DT__PLAN_I(root, "", "hosts", 1, 1 << 24, p->hosts);
    DT__PLAN_I(root, "", "cores", 1, 1 << 20, p->cores);
    mo = dt_json_get(root, "model");
    if (!mo || mo->type != DT_JSON_OBJECT) {
        err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: model: expected an object", fn, path);
        goto done;
    }
    DT__PLAN_I(mo, "model.", "layers", 1, 100000, p->model.layers);
    DT__PLAN_I(mo, "model.", "width", 1, 1 << 20, p->model.width);
    DT__PLAN_I(mo, "model.", "heads", 1, 1 << 20, p->model.heads);
    DT__PLAN_I(mo, "model.", "kv_heads", 1, 1 << 20, p->model.kv_heads);
    DT__PLAN_I(mo, "model.", "vocab", 1, 1099511627776.0, p->model.vocab);
    DT__PLAN_I(mo, "model.", "seq", 2, 1 << 30, p->model.seq);
    DT__PLAN_I(mo, "model.", "batch", 1, 1 << 30, p->model.batch);
    j = dt_json_get(mo, "dtype");
    p->model.dtype = j && j->type == DT_JSON_STRING && !strcmp(j->string, "bf16") ? DT_BF16 : DT_F32;
    if (!j || j->type != DT_JSON_STRING || (strcmp(j->string, "bf16") && strcmp(j->string, "f32"))) {
        err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: model.dtype: expected \"f32\" or \"bf16\"", fn, path);
        goto done;
    }
    if (dt_json_get(mo, "ffn")) DT__PLAN_I(mo, "model.", "ffn", 0, 1 << 22, p->model.ffn); /* older files: 0, 0 */
    if (dt_json_get(mo, "gated")) DT__PLAN_I(mo, "model.", "gated", 0, 1, p->model.gated);
    if (dt_json_get(mo, "experts")) { /* older files: dense */
        DT__PLAN_I(mo, "model.", "experts", 0, 1 << 16, p->model.experts);
        DT__PLAN_I(mo, "model.", "top_k", 0, 1 << 16, p->model.top_k);
        DT__PLAN_I(mo, "model.", "moe_every", 0, 100000, p->model.moe_every);
        DT__PLAN_I(mo, "model.", "moe_shared", 0, 1, p->model.moe_shared);
        DT__PLAN_N(mo, "model.", "capacity", 0, 1e6, p->model.capacity);
        j = dt_json_get(mo, "balance");
        for (i = DT_MOE_AUX; i <= DT_MOE_NONE; i++)
            if (j && j->type == DT_JSON_STRING && !strcmp(j->string, dt_moe_balance_name((dt_moe_balance)i))) break;
        if (i > DT_MOE_NONE) {
            err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: model.balance: expected \"aux\", \"bias\" or \"none\"", fn,
                                   path);
            goto done;
        }
        p->model.balance = (dt_moe_balance)i;
    }
    snprintf(at, sizeof at, "%s: %s", fn, path);
    if ((err = dt__plan_as_format(ctx, dt__plan_model_check(ctx, at, &p->model)))) goto done;
    DT__PLAN_N(root, "", "opt_s_per_param", 0, 1, p->opt_s_per_param);
    DT__PLAN_N(root, "", "copy_s_per_byte", 0, 1, p->copy_s_per_byte);
    DT__PLAN_N(root, "", "overlap", 0, 1, p->overlap);
    DT__PLAN_N(root, "", "measure_s", 0, 1e9, p->measure_s);
    arr = dt_json_get(root, "splits");
    if (!arr || arr->type != DT_JSON_ARRAY || arr->count < 1 || arr->count > DT_PLAN_MAX_SPLITS) {
        err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: splits: expected an array of 1 .. %d", fn, path,
                               DT_PLAN_MAX_SPLITS);
        goto done;
    }
    for (i = 0; i < arr->count; i++) {
        dt_plan_split *s = &p->splits[i];
        const dt_json *o = &arr->items[i];
        double r[2];
        snprintf(where, sizeof where, "splits[%d].", i);
        DT__PLAN_I(o, where, "tp", 1, 1 << 20, s->tp);
        DT__PLAN_I(o, where, "cp", 1, 1 << 20, s->cp);
        DT__PLAN_I(o, where, "sp", 0, 1, s->sp);
        DT__PLAN_I(o, where, "lse", 0, 1, s->lse);
        if (dt_json_get(o, "ulysses")) DT__PLAN_I(o, where, "ulysses", 0, 1, s->ulysses); /* older files: the ring's */
        if (s->ulysses && (s->cp < 2 || s->lse)) {
            err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: %sulysses = 1 with cp %d, lse %d: expected cp >= 2 and lse 0",
                                   fn, path, where, s->cp, s->lse);
            goto done;
        }
        if ((err = dt__plan_pair(ctx, path, o, where, "rows", 1099511627776.0, r))) goto done;
        s->rows[0] = (int64_t)r[0]; s->rows[1] = (int64_t)r[1];
        if (s->rows[0] < 1 || s->rows[1] < s->rows[0] || r[0] != floor(r[0]) || r[1] != floor(r[1])) {
            err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: %srows = [%.9g, %.9g], expected integers 1 <= rows[0] <= rows[1]",
                                   fn, path, where, r[0], r[1]);
            goto done;
        }
#define DT__PLAN_R(f) if ((err = dt__plan_pair(ctx, path, o, where, #f, 1e18, s->f))) goto done;
        DT__PLAN_SPLIT_FIELDS(DT__PLAN_R)
#undef DT__PLAN_R
        p->n_splits++;
    }
    arr = dt_json_get(root, "collectives");
    if (!arr || arr->type != DT_JSON_ARRAY || arr->count > DT_PLAN_MAX_COLLS) {
        err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: collectives: expected an array of at most %d", fn, path,
                               DT_PLAN_MAX_COLLS);
        goto done;
    }
    for (i = 0; i < arr->count; i++) {
        static const char *const kn[DT_PLAN_COLL_KINDS] = {"allreduce", "allgather", "reduce_scatter", "sendrecv"};
        dt_plan_coll *c = &p->colls[i];
        const dt_json *o = &arr->items[i], *k = dt_json_get(o, "kind");
        int q;
        snprintf(where, sizeof where, "collectives[%d].", i);
        for (q = 0; q < DT_PLAN_COLL_KINDS; q++)
            if (k && k->type == DT_JSON_STRING && !strcmp(k->string, kn[q])) break;
        if (q == DT_PLAN_COLL_KINDS) {
            err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: %skind: expected allreduce, allgather, reduce_scatter or "
                                   "sendrecv", fn, path, where);
            goto done;
        }
        c->kind = (dt_plan_coll_kind)q;
        DT__PLAN_I(o, where, "size", 2, 1 << 24, c->size);
        DT__PLAN_I(o, where, "cross", 0, 1, c->cross);
        DT__PLAN_N(o, where, "alpha", 0, 1e3, c->alpha);
        DT__PLAN_N(o, where, "beta", 0, 1, c->beta);
        p->n_colls++;
    }
    arr = dt_json_get(root, "pipes");
    if (!arr || arr->type != DT_JSON_ARRAY || arr->count > DT_PLAN_MAX_PIPES) {
        err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: pipes: expected an array of at most %d", fn, path,
                               DT_PLAN_MAX_PIPES);
        goto done;
    }
    for (i = 0; i < arr->count; i++) {
        dt_plan_pipe *q = &p->pipes[i];
        const dt_json *o = &arr->items[i];
        snprintf(where, sizeof where, "pipes[%d].", i);
        DT__PLAN_I(o, where, "pp", 2, 1 << 24, q->pp);
        q->kind = DT_PP_1F1B; /* older files: 1F1B's */
        if ((j = dt_json_get(o, "kind"))) {
            int k;
            for (k = DT_PP_GPIPE; k < DT_PP_KIND_COUNT; k++)
                if (j->type == DT_JSON_STRING && k != DT_PP_INTERLEAVED && !strcmp(j->string, dt_pp_kind_name((dt_pp_kind)k)))
                    break;
            if (k == DT_PP_KIND_COUNT) {
                err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: %skind: expected \"gpipe\", \"1f1b\" or \"zb-h1\"", fn,
                                       path, where);
                goto done;
            }
            q->kind = (dt_pp_kind)k;
        }
        if ((err = dt__plan_pair(ctx, path, o, where, "bytes", 1e18, q->bytes))) goto done;
        if ((err = dt__plan_pair(ctx, path, o, where, "delay", 1e6, q->delay))) goto done;
        p->n_pipes++;
    }
    arr = dt_json_get(root, "moes");
    if (arr && (arr->type != DT_JSON_ARRAY || arr->count > DT_PLAN_MAX_MOES)) { /* older files: none */
        err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: moes: expected an array of at most %d", fn, path,
                               DT_PLAN_MAX_MOES);
        goto done;
    }
    for (i = 0; arr && i < arr->count; i++) {
        dt_plan_moe *s = &p->moes[i];
        const dt_json *o = &arr->items[i];
        double r[2];
        snprintf(where, sizeof where, "moes[%d].", i);
        DT__PLAN_I(o, where, "tp", 1, 1 << 20, s->tp);
        DT__PLAN_I(o, where, "cp", 1, 1 << 20, s->cp);
        DT__PLAN_I(o, where, "sp", 0, 1, s->sp);
        DT__PLAN_I(o, where, "ep", 1, 1 << 20, s->ep);
        if ((err = dt__plan_pair(ctx, path, o, where, "rows", 1099511627776.0, r))) goto done;
        s->rows[0] = (int64_t)r[0]; s->rows[1] = (int64_t)r[1];
        if (s->rows[0] < 1 || s->rows[1] < s->rows[0] || r[0] != floor(r[0]) || r[1] != floor(r[1])) {
            err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: %srows = [%.9g, %.9g], expected integers 1 <= rows[0] <= rows[1]",
                                   fn, path, where, r[0], r[1]);
            goto done;
        }
#define DT__PLAN_R(f) if ((err = dt__plan_pair(ctx, path, o, where, #f, 1e18, s->f))) goto done;
        DT__PLAN_MOE_FIELDS(DT__PLAN_R)
#undef DT__PLAN_R
        p->n_moes++;
    }
    if (p->model.experts && !p->n_moes) {
        err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: model.experts = %d but no moes: a MoE model's profile times "
                               "its MoE layer", fn, path, p->model.experts);
        goto done;
    }
#undef DT__PLAN_N
#undef DT__PLAN_I
    err = DT_OK;
done:
    dt_json_free(ctx, root);
    if (err) memset(p, 0, sizeof *p);
    return err;
}

/* ==== >>predict ================================================================================== */


/* On paper: latency + bytes x the algorithm's share / the links' bus bandwidth (nccl-tests' busbw:
   an all-reduce moves 2 (n - 1) / n of the buffer through each rank, a gather or scatter (n - 1) / n).
   A group inside a host runs at intra_bw; one across hosts at the NICs its ranks use at once (one
   a GPU: as many as it has members on a host), never faster than inside; its latency grows with
   the tree's depth. */
static double dt__plan_paper_coll(const dt_plan_machine *mc, dt_plan_coll_kind kind, int size, int stride,
                                  double bytes) {
    double n = size, f, bw, a;
    int span = dt__plan_spans(mc->ranks_per_host, size, stride);
    if (size <= 1 || bytes <= 0) return 0;
    f = kind == DT_PLAN_ALLREDUCE ? 2 * (n - 1) / n : kind == DT_PLAN_SENDRECV ? 1 : (n - 1) / n;
    if (kind == DT_PLAN_SENDRECV) {
        bw = span ? mc->p2p_inter_bw : mc->p2p_intra_bw;
        a = span ? mc->inter_alpha : mc->intra_alpha;
    } else if (!span) {
        bw = mc->intra_bw;
        a = mc->intra_alpha;
    } else {
        int per = stride >= mc->ranks_per_host ? 1 : mc->ranks_per_host / stride;
        if (per > size) per = size;
        bw = per * mc->nic_bw;
        if (bw > mc->intra_bw) bw = mc->intra_bw;
        a = mc->inter_alpha * ceil(log2(n));
    }
    return a + bytes * f / bw;
}

/* time of a collective of `bytes` on a group of `size` ranks `stride` apart. Paper: the machine's
   links. Measured: a group measured across hosts when this one spans them (and inside when not),
   where the profile has one; of those, the measured size, else the nearest larger one (a smaller
   group is not slower), else the largest scaled by the ring's 2 (n - 1) / n steps. 0 for a group
   of one. */
static double dt__plan_coll(const dt_plan_profile *p, dt_plan_coll_kind kind, int size, int stride, double bytes) {
    const dt_plan_coll *best = NULL, *big = NULL;
    int i, span, any = 0;
    if (size <= 1 || bytes <= 0) return 0;
    if (p->paper) return dt__plan_paper_coll(&p->mach, kind, size, stride, bytes);
    span = p->hosts > 1 && dt__plan_spans(p->world / p->hosts, size, stride);
    for (i = 0; i < p->n_colls; i++) any |= p->colls[i].kind == kind && p->colls[i].cross == span;
    for (i = 0; i < p->n_colls; i++) {
        const dt_plan_coll *c = &p->colls[i];
        if (c->kind != kind || (any && c->cross != span)) continue;
        if (c->size >= size && (!best || c->size < best->size)) best = c;
        if (!big || c->size > big->size) big = c;
    }
    if (best) return best->alpha + best->beta * bytes;
    if (big) {
        double f = (2.0 * (size - 1) / size) / (2.0 * (big->size - 1) / big->size);
        return big->alpha * size / big->size + big->beta * bytes * f;
    }
    return 0;
}

/* a pipeline message of `bytes` between stages of a pp-stage pipeline of schedule `kind`: the
   measured delay (the pipe of that schedule and pp, else the nearest pp of it, else of 1F1B; the
   interleaved schedule takes 1F1B's), on the line through its two sizes; else the bare send */
static double dt__plan_pipe_delay(const dt_plan_profile *p, int pp, dt_pp_kind kind, int stride, double bytes) {
    const dt_plan_pipe *best = NULL;
    int i, k, have = 0;
    if (kind == DT_PP_INTERLEAVED) kind = DT_PP_1F1B;
    for (i = 0; i < p->n_pipes; i++) have |= p->pipes[i].kind == kind;
    k = have ? kind : DT_PP_1F1B;
    for (i = 0; i < p->n_pipes; i++)
        if (p->pipes[i].kind == (dt_pp_kind)k && (!best || abs(p->pipes[i].pp - pp) < abs(best->pp - pp)))
            best = &p->pipes[i];
    for (i = 0; !best && i < p->n_pipes; i++) /* none of 1F1B either: any */
        if (!best || abs(p->pipes[i].pp - pp) < abs(best->pp - pp)) best = &p->pipes[i];
    if (!best) return dt__plan_coll(p, DT_PLAN_SENDRECV, 2, stride, bytes);
    if (best->bytes[1] == best->bytes[0]) return best->delay[0];
    {
        double d = best->delay[0] + (best->delay[1] - best->delay[0]) * (bytes - best->bytes[0]) /
                                        (best->bytes[1] - best->bytes[0]);
        return d > 0 ? d : 0;
    }
}

/* One block at a layout's split on paper, at `rows` rows (a micro-batch's tokens on a rank, b T /
   cp), as a split measured at that one size: the GEMMs' FLOPs at gemm_eff of the peak; flash
   attention's QK^T and AV over the causal half (its backward 2.5 times the forward's FLOPs: it
   computes the scores again); the rest as HBM traffic at act_bytes an element (forward: two
   layernorms, two residual adds, the activation; the backward twice that); tp's collectives (two
   all-reduces, or with sp two all-gathers and two reduce-scatters, of the N x C activations in each
   direction) less tp_overlap of them, and in the backward the column linears' sums hidden behind
   their weight grads as dt_tp_column_linear_bwd runs them; cp's ring (cp - 1 passes of this rank's K and V
   at act_bytes; the backward's again, and cp passes of their grads' partial sums in f32) where
   attention does not cover it (on CUDA in bf16 the ring's blocks are the same flash kernels, block
   by block: kernels/dt_flash.cu's block mode); or Ulysses, as dt runs it
   on CUDA: f32 rows by all-to-all (costed as an all-gather of the same bytes: each rank sends and
   receives (cp - 1) / cp of its buffer) over the cp group, q, k, v in and the output back (the
   backward: the output's grad in, q, k, v's back), each packed and unpacked by a copy kernel, in
   line with the compute; attention over the whole sequence on H / (tp cp) heads, the same FLOPs
   as the ring's, its backward running the forward again first (nothing of it is kept). */
static void dt__plan_paper_split(const dt_plan_profile *p, const dt_plan_layout *l, double rows, dt_plan_split *s) {
    const dt_plan_machine *mc = &p->mach;
    const dt_plan_model *m = &p->model;
    double C = m->width, F = dt__plan_ffn(m), g = 1 + m->gated, T = (double)m->seq, N = rows, tp = l->tp;
    double b = rows * l->cp / T, Ckv = (double)(m->kv_heads ? m->kv_heads : m->heads) * (C / m->heads);
    double Nl = l->sp ? N / tp : N, V = (double)m->vocab, A = mc->act_bytes, bw = mc->mem_bw * mc->mem_eff;
    double gr = mc->flops * mc->gemm_eff, act = N * C * A;
    double gemm = 2 * N * C * (C + 2 * Ckv + C + (g + 1) * F) / tp / gr;
    double attn = 2 * b * T * T * C / (tp * l->cp), fa = attn / (mc->flops * mc->attn_fwd_eff);
    double ba = 2.5 * attn / (mc->flops * mc->attn_bwd_eff);
    double ln = A * 4 * Nl * C / bw, elem = A * 6 * Nl * C / bw + A * (g + 1) * N * F / tp / bw;
    double tpc = 0, tpb = 0, cpc = 0, cpb = 0, ux = 0, h, ag = 0, rs = 0;
    if (l->tp > 1) { /* tp's group: consecutive ranks */
        double ar = dt__plan_coll(p, DT_PLAN_ALLREDUCE, l->tp, 1, act), sum;
        double dw = 2 * N * C * (C + 2 * Ckv + g * F) / tp / gr; /* the column linears' (qkv, fc) weight grads */
        ag = dt__plan_coll(p, DT_PLAN_ALLGATHER, l->tp, 1, act);
        rs = dt__plan_coll(p, DT_PLAN_REDUCE_SCATTER, l->tp, 1, act);
        sum = l->sp ? rs : ar;
        tpc = (1 - mc->tp_overlap) * 2 * (l->sp ? ag + rs : ar);
        /* the backward: the column linears' input-grad sums run while their weight grads compute
           (dt_tp_column_linear_bwd, Megatron's overlap); sp's gathers of the row linears' output
           grads wait in line */
        tpb = (1 - mc->tp_overlap) * (l->sp ? 2 * ag : 0) + (2 * sum > dw ? 2 * sum - dw : 0);
    }
    if (l->cp > 1 && l->ulysses) { /* f32 rows: qkv (C + 2 Ckv wide) and the output (C), over tp */
        double io = dt__plan_coll(p, DT_PLAN_ALLGATHER, l->cp, l->tp, 4 * N * (C + 2 * Ckv) / tp) +
                    dt__plan_coll(p, DT_PLAN_ALLGATHER, l->cp, l->tp, 4 * N * C / tp);
        double mv = 2 * 2 * 4 * N * (2 * C + 2 * Ckv) / tp / bw; /* packed and unpacked: read and written */
        ux = io + mv;
        ba += fa; /* the forward again: its output and lse, which nothing kept */
    } else if (l->cp > 1) { /* K/V at act_bytes (bf16 on the tensor cores), the dK/dV sums in f32 */
        cpc = (l->cp - 1) * dt__plan_coll(p, DT_PLAN_SENDRECV, 2, l->tp, N * 2 * Ckv / tp * A);
        cpb = cpc + l->cp * dt__plan_coll(p, DT_PLAN_SENDRECV, 2, l->tp, N * 2 * Ckv / tp * 4);
    }
    memset(s, 0, sizeof *s);
    s->tp = l->tp; s->cp = l->cp; s->sp = l->sp;
    s->ulysses = l->cp > 1 && l->ulysses;
    s->lse = !s->ulysses;
    s->rows[0] = s->rows[1] = rows >= 1 ? (int64_t)rows : 1;
    s->attn[0] = fa + ux + (cpc > fa ? cpc - fa : 0);
    s->gelu[0] = A * (g + 1) * N * F / tp / bw;
    s->cheap[0] = ln + s->gelu[0];
    s->fwd[0] = gemm + s->attn[0] + ln + elem + tpc;
    s->bwd[0] = 2 * gemm + ba + ux + (cpb > ba ? cpb - ba : 0) + 2 * (ln + elem) + tpb;
    /* the vocab-parallel embedding (rows gathered, summed over tp) and the head: logits at the GEMM
       rate, the f32 logits read and written for the loss */
    s->embed_fwd[0] = A * 2 * Nl * C / bw + (l->tp > 1 ? dt__plan_coll(p, DT_PLAN_ALLREDUCE, l->tp, 1, act) : 0);
    s->embed_bwd[0] = A * 2 * Nl * C / bw;
    h = 2 * N * C * V / tp / gr;
    s->head_fwd[0] = h + (4.0 * 2 * N * V / tp + A * 2 * Nl * C) / bw + (l->sp ? ag : 0);
    s->head_bwd[0] = 2 * h + (4.0 * 2 * N * V / tp + A * 2 * Nl * C) / bw + (l->sp ? rs : 0);
#define DT__PLAN_TWIN(f) s->f[1] = s->f[0];
    DT__PLAN_SPLIT_FIELDS(DT__PLAN_TWIN)
#undef DT__PLAN_TWIN
}

/* A profile made by hand or changed after loading: its counts within the arrays, every split's
   rows positive, every group of two or more, at least a core. */
static dt_status dt__plan_profile_check(dt_ctx *ctx, const char *fn, const dt_plan_profile *p) {
    int i;
    if (p->world < 1 || p->world > (1 << 20) || p->hosts < 1 || p->cores < 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: profile world %d, hosts %d, cores %d: expected world 1 .. 2^20, "
                                "hosts and cores >= 1", fn, p->world, p->hosts, p->cores);
    if (p->n_splits < 0 || p->n_splits > DT_PLAN_MAX_SPLITS || p->n_colls < 0 || p->n_colls > DT_PLAN_MAX_COLLS ||
        p->n_pipes < 0 || p->n_pipes > DT_PLAN_MAX_PIPES)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: profile n_splits %d, n_colls %d, n_pipes %d: expected at most %d, "
                                "%d, %d", fn, p->n_splits, p->n_colls, p->n_pipes, DT_PLAN_MAX_SPLITS,
                                DT_PLAN_MAX_COLLS, DT_PLAN_MAX_PIPES);
    for (i = 0; i < p->n_splits; i++)
        if (p->splits[i].rows[0] < 1 || p->splits[i].rows[1] < p->splits[i].rows[0])
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: profile splits[%d].rows = [%lld, %lld], expected 1 <= rows[0] "
                                    "<= rows[1]", fn, i, (long long)p->splits[i].rows[0], (long long)p->splits[i].rows[1]);
    if (p->n_moes < 0 || p->n_moes > DT_PLAN_MAX_MOES)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: profile n_moes %d: expected 0 .. %d", fn, p->n_moes, DT_PLAN_MAX_MOES);
    for (i = 0; i < p->n_moes; i++)
        if (p->moes[i].rows[0] < 1 || p->moes[i].rows[1] < p->moes[i].rows[0])
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: profile moes[%d].rows = [%lld, %lld], expected 1 <= rows[0] "
                                    "<= rows[1]", fn, i, (long long)p->moes[i].rows[0], (long long)p->moes[i].rows[1]);
    for (i = 0; i < p->n_colls; i++)
        if (p->colls[i].size < 2 || (int)p->colls[i].kind < 0 || p->colls[i].kind >= DT_PLAN_COLL_KINDS)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: profile colls[%d]: size %d, kind %d, expected size >= 2 and a "
                                    "dt_plan_coll_kind", fn, i, p->colls[i].size, (int)p->colls[i].kind);
    return DT_OK;
}

/* a split's figure at `rows` rows, on the line through its two measured sizes */
static double dt__plan_at(const int64_t r[2], const double v[2], double rows) {
    if (r[1] == r[0]) return v[0] * rows / (double)r[0];
    return v[0] + (v[1] - v[0]) * (rows - (double)r[0]) / (double)(r[1] - r[0]);
}

/* dt_zero's memory replayed (dt__plan_zero_transient, below). The replay's state: bytes live, the
   peak of live + pools, each communicator's pool (0: dp x cp, 1: edp) and the reduce-scatters in
   flight, oldest first. */
typedef struct dt__plan_zs {
    double live, peak, cap[2][16];
    int busy[2][16];
    double rs[DT_ZERO_RS_IN_FLIGHT]; /* bytes of each reduce-scatter in flight */
    int rc[DT_ZERO_RS_IN_FLIGHT], rslot[DT_ZERO_RS_IN_FLIGHT], n_rs;
    int posted[2];                   /* stage 3: units whose all-gather is posted (a prefetch) */
} dt__plan_zs;

/* a unit: n elements, g a rank's rows of them, over N ranks of communicator c */
typedef struct dt__plan_zu {
    double n, g, N;
    int c;
} dt__plan_zu;

static void dt__plan_zs_note(dt__plan_zs *s) {
    double t = s->live;
    int c, k;
    for (c = 0; c < 2; c++)
        for (k = 0; k < 16; k++) t += s->cap[c][k];
    if (t > s->peak) s->peak = t;
}
static void dt__plan_zs_take(dt__plan_zs *s, double bytes) { s->live += bytes; dt__plan_zs_note(s); }
/* dt_comm's pool (dt__cm_take): the free slot that fits best, else the largest free one grown to
   1.125 x the need (bytes >= 1); -1: none free, a plain allocation (live, the caller's to give) */
static int dt__plan_zs_scratch(dt__plan_zs *s, int c, double bytes) {
    int k, best = -1, spare = -1;
    for (k = 0; k < 16; k++) {
        if (s->busy[c][k]) continue;
        if (s->cap[c][k] >= bytes && (best < 0 || s->cap[c][k] < s->cap[c][best])) best = k;
        if (spare < 0 || s->cap[c][k] > s->cap[c][spare]) spare = k;
    }
    if (best < 0 && spare >= 0) {
        best = spare;
        s->cap[c][best] = bytes + floor(bytes / 8); /* (the old one released first) */
        dt__plan_zs_note(s);
    }
    if (best < 0) { dt__plan_zs_take(s, bytes); return -1; }
    s->busy[c][best] = 1;
    return best;
}
/* finishes the oldest reduce-scatters until at most keep are in flight (dt__pl_zrs_bound) */
static void dt__plan_zs_bound(dt__plan_zs *s, int keep) {
    while (s->n_rs > keep) {
        int k;
        if (s->rslot[0] >= 0) s->busy[s->rc[0]][s->rslot[0]] = 0;
        s->live -= s->rs[0];
        for (k = 1; k < s->n_rs; k++) { s->rs[k - 1] = s->rs[k]; s->rc[k - 1] = s->rc[k]; s->rslot[k - 1] = s->rslot[k]; }
        s->n_rs--;
    }
}
/* unit u's grad_ready at stages 2-3 (dt__pl_zrs_post): its full grads packed and reduce-scattered */
static void dt__plan_zs_post(dt__plan_zs *s, const dt__plan_zu *u) {
    double pk = 4 * u->g * (u->N + 1), sc = u->N > 1 ? 4 * u->g * (u->N - 1) : 1;
    int slot;
    dt__plan_zs_bound(s, DT_ZERO_RS_IN_FLIGHT - 1);
    dt__plan_zs_take(s, pk);
    s->live -= 4 * u->n;
    slot = dt__plan_zs_scratch(s, u->c, sc);
    s->rs[s->n_rs] = pk + (slot < 0 ? sc : 0);
    s->rc[s->n_rs] = u->c;
    s->rslot[s->n_rs++] = slot;
}
/* The units as examples/gpt registers them: id 0 unit 0, 1 + 2 i block i's, 2 + 2 i its experts' */
typedef struct dt__plan_zw {
    const dt_plan_model *m;
    int pp, nb, nm;
    dt__plan_zu u0, ub, ubx, ux;
} dt__plan_zw;

static int dt__plan_zw_moe(const dt__plan_zw *w, int i) { return w->pp == 1 ? dt__plan_is_moe(w->m, i) : i < w->nm; }
static const dt__plan_zu *dt__plan_zw_unit(const dt__plan_zw *w, int id) {
    if (!id) return &w->u0;
    if (!(id % 2)) return &w->ux;
    return dt__plan_zw_moe(w, (id - 1) / 2) ? &w->ubx : &w->ub;
}
/* the next unit gathered: the forward walks the units up, the backward down (dt_zero's prefetch) */
static int dt__plan_zw_next(const dt__plan_zw *w, int id, int backward) {
    int i = (id - 1) / 2;
    if (!backward) {
        if (!id) return 1;
        if (id % 2 && dt__plan_zw_moe(w, i)) return id + 1;
        i = id % 2 ? i : id / 2 - 1;
        return i + 1 < w->nb ? 2 * (i + 1) + 1 : -1;
    }
    if (!id) return -1;
    if (!(id % 2)) return id - 1;
    return !i ? 0 : dt__plan_zw_moe(w, i - 1) ? id - 1 : id - 2;
}
/* stage 3's dt_zero_gather of unit id's values: waited for (posted now unless a prefetch was), then
   the next unit's posted unless it is already */
static void dt__plan_zs_gather(dt__plan_zs *s, const dt__plan_zw *w, int id, int backward, double K) {
    const dt__plan_zu *u = dt__plan_zw_unit(w, id);
    int k, posted = 0, nx = dt__plan_zw_next(w, id, backward);
    for (k = 0; k < 2; k++)
        if (s->posted[k] == id) { posted = 1; s->posted[k] = -1; }
    if (!posted) dt__plan_zs_take(s, K * u->g * u->N);
    dt__plan_zs_take(s, K * u->n);
    s->live -= K * u->g * u->N;
    if (nx < 0 || s->posted[0] == nx || s->posted[1] == nx) return;
    u = dt__plan_zw_unit(w, nx);
    dt__plan_zs_take(s, K * u->g * u->N);
    s->posted[s->posted[0] < 0 ? 0 : 1] = nx;
}

/* What dt_zero and its collectives hold above the persistent buffers at their peak, on the CPU,
   at examples/gpt's call order. Bytes, per rank. Stages 1-3 are replayed call by call over the
   units, the way dt_parallel.h's >>zero takes and gives its buffers and dt_comm's pool lends its
   scratch; stage 0 is summed. The units (pp 1; at pp > 1 the fullest stage's): unit 0 = the
   embedding and the tied head (gathered first in the backward, released last), then each block's,
   and after a MoE block's its experts' (an expert unit: E / ep experts, synced over the edp ranks
   that hold the same ones, its own communicator and pool). For a unit of n elements over a group
   of N ranks, g = a rank's rows (ceil per expert for an expert unit):
     its full grads             4 n        (stages 2-3: from its first gather in the backward)
     a reduce-scatter           4 g (N + 1)  (the packed grads and this rank's block)
     the reduce-scatter's scratch 4 g (N - 1), from its communicator's pool: the free slot that
                                fits best, else the largest free one grown to 1.125 x the need;
                                slots are kept (the pool is the largest the step ever needed)
     stage 3's gathered values  K n (the unit's own buffer), K g N (the all-gather, until used)
     stage 0   every DDP bucket's slot: none finishes before the step (overlap 0 on one host's
               MPI), the dense params' buckets over dp x cp and the experts' over edp
     stage 1   at the step, one unit's reduce-scatter at a time; then each unit's values gathered
     stages 2-3: each unit's grads reduce-scattered at its grad_ready, at most
               D = DT_ZERO_RS_IN_FLIGHT in flight (the oldest finished first: a rank holds the same
               whatever MPI's progress), none at a micro-step's start; stage 3 gathers each unit
               before its use and posts the next one's gather (forward up, backward down: the
               head's gather at the forward's end posts block 0's, used only in the backward)
   Derived from dt_parallel.h's >>zero and checked against examples/gpt's peaks (dense np 2 and 4,
   micro 1 to 4, and tp 2 at dp 1: within 0.3%; a MoE model at np 2, ep 1: within 0.2%; tests/test_plan
   derives some by hand; the replay's pieces are above). */
static double dt__plan_zero_transient(const dt_plan_model *m, const dt_plan_layout *l, double K, int nb, int nm,
                                      double dense, double px) {
    double N = (double)l->dp * l->cp, Ne = N / l->ep, C = m->width, xd = 0, xe = 0;
    double Eep = m->experts ? (double)(m->experts / l->ep) : 1;
    dt__plan_zs s;
    dt__plan_zw w;
    int step, mi, i, id, st3 = l->zero == 3;
    if (l->zero == 0) /* the DDP buckets' slots: the dense params' over dp x cp, the experts' over edp */
        return (N > 1 ? 1.125 * 4 * dense / N * (N - 1) : 0) + (Ne > 1 ? 1.125 * 4 * px / Ne * (Ne - 1) : 0);
    memset(&s, 0, sizeof s);
    s.posted[0] = s.posted[1] = -1;
    memset(&w, 0, sizeof w);
    w.m = m; w.pp = l->pp; w.nb = nb; w.nm = nm;
    if (m->experts) dt__plan_moe_params(m, l->tp, l->ep, &xd, &xe);
    w.u0.n = (double)m->vocab / l->tp * C + (double)m->seq * C + 2 * C;
    w.u0.g = w.u0.n / N; w.u0.N = N; w.u0.c = 0;
    w.ub = w.u0; w.ub.n = dt__plan_block_params(m, l->tp); w.ub.g = w.ub.n / N;
    w.ubx = w.ub; w.ubx.n += xd; w.ubx.g = w.ubx.n / N; /* a MoE block's own: the router, less the MLP */
    w.ux.n = xe; w.ux.N = Ne; w.ux.g = ceil(Eep / Ne) * xe / Eep; w.ux.c = 1;
    for (step = 0; step < 2; step++) { /* the second step's pools are the first's */
        for (mi = 0; mi < l->micro && l->zero >= 2; mi++) {
            dt__plan_zs_bound(&s, 0); /* dt_zero_micro_begin */
            if (st3) { /* the forward: unit 0 for the embedding, each block, unit 0 again for the head */
                dt__plan_zs_gather(&s, &w, 0, 0, K);
                s.live -= K * w.u0.n;
                for (i = 0; i < nb; i++) {
                    dt__plan_zs_gather(&s, &w, 2 * i + 1, 0, K);
                    if (dt__plan_zw_moe(&w, i)) dt__plan_zs_gather(&s, &w, 2 * i + 2, 0, K);
                    s.live -= K * (dt__plan_zw_unit(&w, 2 * i + 1)->n + (dt__plan_zw_moe(&w, i) ? w.ux.n : 0));
                }
                dt__plan_zs_gather(&s, &w, 0, 0, K);
                s.live -= K * w.u0.n;
            }
            /* the backward: unit 0 for the head (its full grads held to the end), each block down
               (its experts' units first), unit 0 for the embedding */
            dt__plan_zs_take(&s, 4 * w.u0.n);
            if (st3) { dt__plan_zs_gather(&s, &w, 0, 1, K); s.live -= K * w.u0.n; }
            for (i = nb - 1; i >= 0; i--) {
                int x = dt__plan_zw_moe(&w, i);
                const dt__plan_zu *b = dt__plan_zw_unit(&w, 2 * i + 1);
                if (x) {
                    dt__plan_zs_take(&s, 4 * w.ux.n);
                    if (st3) dt__plan_zs_gather(&s, &w, 2 * i + 2, 1, K);
                }
                dt__plan_zs_take(&s, 4 * b->n);
                if (st3) dt__plan_zs_gather(&s, &w, 2 * i + 1, 1, K);
                if (x) dt__plan_zs_post(&s, &w.ux);
                dt__plan_zs_post(&s, b);
                if (st3) s.live -= K * (b->n + (x ? w.ux.n : 0));
            }
            if (st3) dt__plan_zs_gather(&s, &w, 0, 1, K);
            dt__plan_zs_post(&s, &w.u0);
            if (st3) s.live -= K * w.u0.n;
        }
        /* dt_zero_step: the reduce-scatters finished (stage 1: each unit's now, blocking, in unit
           order); stages 1-2 gather every unit's values after the update */
        dt__plan_zs_bound(&s, 0);
        for (id = 0; id < 2 * nb + 1 && l->zero <= 2; id++) {
            const dt__plan_zu *u;
            if (id && !(id % 2) && !dt__plan_zw_moe(&w, id / 2 - 1)) continue;
            u = dt__plan_zw_unit(&w, id);
            if (l->zero == 1) {
                double sc = u->N > 1 ? 4 * u->g * (u->N - 1) : 1;
                int slot;
                dt__plan_zs_take(&s, 4 * u->g * (u->N + 1));
                slot = dt__plan_zs_scratch(&s, u->c, sc);
                if (slot >= 0) s.busy[u->c][slot] = 0;
                else s.live -= sc;
                s.live -= 4 * u->g * (u->N + 1);
            }
            if (u->N > 1) { dt__plan_zs_take(&s, K * u->g * u->N); s.live -= K * u->g * u->N; }
        }
    }
    return s.peak;
}

/* dt_plan_predict, for the search too: *cache (may be NULL) keeps the last pipeline schedule made
   (the search asks for the same one many times in a row). floor_tps > 0 on a paper profile: a layout
   whose step cannot beat floor_tps tokens/s even with no bubble and no message delay is not simulated
   (*pruned = 1; its memory is filled in, its time is not): at 1024 ranks most of the tens of
   thousands of layouts are, and a plan prints in well under a second. */
static dt_status dt__plan_predict(dt_ctx *ctx, const dt_plan_profile *p, const dt_plan_layout *layout,
                                  dt_plan_prediction *out, double floor_tps, dt_pp_schedule **cache, int *pruned) {
    static const char *fn = "dt_plan_predict";
    const dt_plan_model *m;
    const dt_plan_split *s;
    dt_plan_split paper;
    dt_plan_layout l;
    dt_status err;
    double rows, F, B, R, ef, eb, hf, hb, K, A, psi_max = 0, grads_b, N;
    double exposed, opt, step, makespan = 0, bubble = 0, busy = 0, fst[4096], bst[4096], C, own = 0;
    /* offload: the slots that stay on the device (examples/gpt's: three on CUDA, where the copies run
       on a side stream beside the compute; two on the CPU, where they are memcpys in line) */
    int slots = p->paper ? 3 : 2;
    double xf = 0, xb = 0, xdense = 0, xexp = 0, px_max = 0, edp, xsh; /* MoE: a MoE block's time and params over a dense one's */
    double xk_f = 0, xk_b = 0; /* MoE: its experts' time at their uniform share (k dense MLPs' rows) */
    const dt_plan_moe *x = NULL;
    int si, lse, st, first[4097], dpcp, nb_max = 0, nm_max = 0;
    dt_pp_schedule *sch = NULL;
    if (pruned) *pruned = 0;
    if (!p || !layout || !out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: p, layout and out must not be NULL", fn);
    m = &p->model;
    memset(out, 0, sizeof *out);
    if ((err = dt__plan_profile_check(ctx, fn, p))) return err;
    err = dt_plan_layout_check(ctx, m, p->world, layout, &l);
    if (err) return err;
    if ((int64_t)l.pp * l.chunks > 4096)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: pp %d x %d chunks, expected at most 4096 virtual stages", fn, l.pp,
                                l.chunks);
    lse = !l.ulysses && (l.cp > 1 || l.recompute == DT_PLAN_RECOMPUTE_GEMM_LAST);
    if (p->paper && l.offload > 0 && !(p->mach.h2d_bw > 0))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: offload %g on paper: machine %s has h2d_bw 0 (its host link is not "
                                "known), so the copies cannot be costed", fn, l.offload, p->mach.name);
    rows = (double)(m->batch / l.dp / l.micro) * (double)(m->seq / l.cp);
    if (p->paper) {
        dt__plan_paper_split(p, &l, rows, &paper);
        s = &paper;
    } else {
        si = dt__plan_find_split(p, l.tp, l.cp, l.sp, lse, l.ulysses);
        if (si < 0)
            return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: the profile has no block timed at tp %d cp %d sp %d %s (measure "
                                    "it with this model on a world of %d)", fn, l.tp, l.cp, l.sp,
                                    l.ulysses ? "by ulysses" : lse ? "keeping lse" : "keeping [T, T]", p->world);
        s = &p->splits[si];
    }
    if (m->experts) {
        if (p->paper)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->experts %d on paper: the planner models MoE from a "
                                    "measured profile only (its routing and all-to-alls are timed, not derived)", fn,
                                    m->experts);
        si = dt__plan_find_moe(p, l.tp, l.cp, l.sp, l.ep);
        if (si < 0)
            return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: the profile has no MoE layer timed at tp %d cp %d sp %d ep %d "
                                    "(measure it with this model on a world of %d)", fn, l.tp, l.cp, l.sp, l.ep, p->world);
        x = &p->moes[si];
        xf = dt__plan_at(x->rows, x->fwd, rows) - (m->moe_shared ? 0 : dt__plan_at(x->rows, x->mlp_fwd, rows));
        xb = dt__plan_at(x->rows, x->bwd, rows) - (m->moe_shared ? 0 : dt__plan_at(x->rows, x->mlp_bwd, rows));
        xk_f = (m->top_k ? m->top_k : 2) * dt__plan_at(x->rows, x->mlp_fwd, rows);
        xk_b = (m->top_k ? m->top_k : 2) * dt__plan_at(x->rows, x->mlp_bwd, rows);
        dt__plan_moe_params(m, l.tp, l.ep, &xdense, &xexp);
    }
    out->layout = l;
    dpcp = l.dp * l.cp;
    K = m->dtype == DT_BF16 ? 2 : 4;
    A = p->paper ? p->mach.act_bytes : 4;
    F = dt__plan_at(s->rows, s->fwd, rows);
    B = dt__plan_at(s->rows, s->bwd, rows);
    switch (l.recompute) {
    case DT_PLAN_RECOMPUTE_FULL: R = F; break;
    case DT_PLAN_RECOMPUTE_SELECTIVE: R = dt__plan_at(s->rows, s->attn, rows) + dt__plan_at(s->rows, s->gelu, rows); break;
    case DT_PLAN_RECOMPUTE_GEMM_LAST: R = dt__plan_at(s->rows, s->cheap, rows); break;
    default: R = 0; break;
    }
    ef = dt__plan_at(s->rows, s->embed_fwd, rows); eb = dt__plan_at(s->rows, s->embed_bwd, rows);
    if (l.offload > 0) dt__plan_acts_bytes(m, &l, 1, A, p->paper, &own); /* a block's own tensors, copied */
    hf = dt__plan_at(s->rows, s->head_fwd, rows); hb = dt__plan_at(s->rows, s->head_bwd, rows);
    if ((err = dt_pp_split(ctx, first, m->layers, l.pp * l.chunks))) return err;
    /* per stage: compute per micro-batch and parameters */
    C = m->width;
    {
        double bp = dt__plan_block_params(m, l.tp);
        double emb = (double)m->vocab / l.tp * C + (double)m->seq * C, head = 2 * C;
        for (st = 0; st < l.pp; st++) {
            int c, nb = 0, nm = 0, outs = 0, ins = 0, b;
            double psi, skew = 0;
            for (c = 0; c < l.chunks; c++) { /* offload: each copied out, all but the slots' back (on the CPU, at once) */
                int k = first[c * l.pp + st + 1] - first[c * l.pp + st], off = (int)floor(l.offload * k + 0.5);
                nb += k;
                outs += off;
                ins += off > slots ? off - slots : 0;
                for (b = first[c * l.pp + st]; b < first[c * l.pp + st + 1]; b++) {
                    nm += dt__plan_is_moe(m, b);
                    skew += dt__plan_moe_skew(m, b, l.ep);
                }
            }
            if (nb > nb_max) nb_max = nb;
            if (nm > nm_max) nm_max = nm;
            fst[st] = nb * F + nm * xf + skew * xk_f + (p->paper ? 0 : outs * own * p->copy_s_per_byte);
            bst[st] = nb * (B + R) + nm * xb + skew * xk_b + (p->paper ? 0 : ins * own * p->copy_s_per_byte);
            psi = nb * bp + nm * (xdense + xexp);
            if (st == 0) { fst[st] += ef; bst[st] += eb; psi += emb; }
            if (st == l.pp - 1) { fst[st] += hf; bst[st] += hb; psi += head; }
            if (p->paper && outs) { /* the side stream copies while the blocks compute: a stage's forward takes
                                       its compute or its first block and every copy out after it, whichever is
                                       longer; its backward likewise with the copies back */
                double c = own / p->mach.h2d_bw;
                if (F + outs * c > fst[st]) fst[st] = F + outs * c;
                if (ins && B + R + ins * c > bst[st]) bst[st] = B + R + ins * c;
            }
            if (psi > psi_max) { psi_max = psi; px_max = nm * xexp; }
        }
        /* a bound on the pipeline's makespan: stage st starts after the stages before it ran their
           first chunk of micro-batch 0, and (but for ZB-H1, whose weight passes may come last)
           the stages before it run the last micro-batch's backward after it ends */
        {
            double head_f = 0, tail_b = 0;
            for (st = 0; st < l.pp; st++) {
                double t = head_f + l.micro * (fst[st] + bst[st]) + (l.schedule == DT_PP_ZB_H1 ? 0 : tail_b);
                if (t > busy) busy = t;
                head_f += fst[st] / l.chunks;
                tail_b += bst[st] / l.chunks;
            }
        }
    }
    out->in_flight = 1; /* the schedule's activations in flight: every schedule dt makes reaches its bound */
    out->pp_buffers = 0;
    for (st = 0; l.pp > 1 && st < l.pp; st++) {
        int bd = dt_pp_schedule_bound(l.schedule, l.pp, l.micro, l.chunks, st);
        if (bd > out->in_flight) out->in_flight = bd;
    }
    /* data-parallel sync over dp x cp: grads f32, values K bytes a parameter; experts over the edp
       ranks that hold the same ones (ep x edp = dp x cp, ep innermost) */
    N = dpcp;
    edp = (double)dpcp / l.ep;
    grads_b = (psi_max - px_max) * 4;
    exposed = 0;
    if (dpcp > 1) {
        /* the dp x cp group: ranks tp apart (tp innermost); edp's: tp x ep apart */
        int ne = dpcp / l.ep;
        double ar = dt__plan_coll(p, DT_PLAN_ALLREDUCE, dpcp, l.tp, grads_b) +
                    dt__plan_coll(p, DT_PLAN_ALLREDUCE, ne, l.tp * l.ep, px_max * 4);
        double rs = dt__plan_coll(p, DT_PLAN_REDUCE_SCATTER, dpcp, l.tp, grads_b) +
                    dt__plan_coll(p, DT_PLAN_REDUCE_SCATTER, ne, l.tp * l.ep, px_max * 4);
        double ag = dt__plan_coll(p, DT_PLAN_ALLGATHER, dpcp, l.tp, (psi_max - px_max) * K) +
                    dt__plan_coll(p, DT_PLAN_ALLGATHER, ne, l.tp * l.ep, px_max * K);
        switch (l.zero) {
        case 0: /* buckets during the last micro-batch's backward */
            exposed = ar - p->overlap * (ar < B * nb_max ? ar : B * nb_max);
            break;
        case 1: exposed = rs + ag; break; /* at the step */
        case 2: /* reduce-scatter per unit during every micro-batch's backward, gather at the step */
            exposed = l.micro * (rs - p->overlap * (rs < B * nb_max ? rs : B * nb_max)) + ag;
            break;
        default: /* 3: gathers before each unit forward and backward, reduce-scatters after */
            exposed = l.micro * (2 * ag + rs) * (1 - p->overlap);
            break;
        }
    }
    /* the optimizer over this rank's shard, ZeRO's pack / unpack copies, the loss and norm */
    /* a rank's share of the experts: whole experts (dim 0) over edp, the first ranks one more */
    xsh = m->experts ? px_max * ceil((double)(m->experts / l.ep) / edp) / (double)(m->experts / l.ep) : 0;
    opt = p->opt_s_per_param * (l.zero >= 1 ? (psi_max - px_max) / N + xsh : psi_max);
    /* ZeRO's copies, in passes over a buffer of the whole model's (dt_zero's units): a buffer taken
       from its pool is zero-filled (a pass), a pack or unpack copies (a pass). Stage 1 packs the grads
       and unpacks the values once a step (2 passes each); stage 2 fills a unit's grads, fills its
       pack and packs (3 passes of 4 bytes) every micro-batch, and gathers the values at the step;
       stage 3 also gathers each unit twice a micro-batch (forward and backward: fill the pack, fill
       the values, unpack: 3 passes of K bytes each). ZeRO 3 at micro 4 measured 258 ms a step at
       np 2 where the step-only copies predicted 225 (now 255). */
    if (l.zero == 1) opt += p->copy_s_per_byte * psi_max * (4 + K) * 2;
    else if (l.zero == 2) opt += p->copy_s_per_byte * psi_max * (K * 2 + l.micro * 4 * 3);
    else if (l.zero >= 3) opt += p->copy_s_per_byte * psi_max * l.micro * (4 * 3 + 2 * K * 3);
    opt += 2 * dt__plan_coll(p, DT_PLAN_ALLREDUCE, p->world, 1, 8);
    if (m->experts) /* each MoE layer's routing counts over dp x cp at the step's end, and the aux loss's in
                       the first backward */
        opt += nm_max * (m->balance == DT_MOE_BIAS || m->balance == DT_MOE_NONE ? 1 : 2) *
               dt__plan_coll(p, DT_PLAN_ALLREDUCE, dpcp, l.tp, (3.0 * m->experts + 3) * 8);
    step = busy + exposed + opt;
    if (floor_tps > 0 && p->paper && (double)m->batch * (double)m->seq / step < floor_tps) { /* no bubble can make it */
        if (pruned) *pruned = 1;
        makespan = busy; /* the bound: out's time is no more than that */
    } else if (l.pp == 1) {
        makespan = busy;
    } else {
        dt_pp_stats stt;
        if (cache && *cache && (*cache)->stages == l.pp && (*cache)->micro == l.micro && (*cache)->kind == l.schedule &&
            (*cache)->chunks == l.chunks)
            sch = *cache;
        else {
            dt_pp_desc pd;
            memset(&pd, 0, sizeof pd);
            pd.kind = l.schedule; pd.stages = l.pp; pd.micro = l.micro; pd.chunks = l.chunks; pd.n_layers = m->layers;
            if ((err = dt_pp_schedule_create(ctx, &sch, &pd))) return err;
            if (cache) { dt_pp_schedule_free(*cache); *cache = sch; }
        }
        /* a stage whose blocks call MPI (tp's all-reduces, cp's ring) moves its messages along
           inside those calls: the bare send; one that only computes, the measured delay. The
           next stage's rank is tp x cp x dp further. */
        int stride = l.tp * l.cp * l.dp;
        double send = l.tp > 1 || l.cp > 1 || p->paper
                          ? dt__plan_coll(p, DT_PLAN_SENDRECV, 2, stride, rows / (l.sp ? l.tp : 1) * C * A)
                          : dt__plan_pipe_delay(p, l.pp, l.schedule, stride, rows * C * A);
        err = dt__plan_simulate(sch, fst, bst, send, (double)p->world / (p->hosts > 0 ? p->hosts : 1), p->cores,
                                l.schedule == DT_PP_ZB_H1 && (l.sp || l.recompute), &stt);
        if (!err) {
            makespan = stt.makespan;
            busy = 0;
            for (st = 0; st < l.pp; st++) if (sch->busy[st] > busy) busy = sch->busy[st];
            bubble = makespan - busy;
            out->in_flight = stt.peak_max;
            out->pp_buffers = dt__plan_pp_buffers(sch);
        }
        /* the tied head: stage 0 sends wte to the last stage and its gradient comes back, each step */
        makespan += 2 * dt__plan_coll(p, DT_PLAN_SENDRECV, 2, (l.pp - 1) * stride, (double)m->vocab / l.tp * C * 4);
    }
    if (!cache) dt_pp_schedule_free(sch);
    if (err) return err;
    step = makespan + exposed + opt;
    out->step_s = step;
    out->tokens_per_s = (double)m->batch * (double)m->seq / step;
    out->compute_s = busy;
    out->comm_s = exposed;
    out->bubble_s = bubble;
    out->optimizer_s = opt;
    if (p->paper) out->mfu = dt_plan_model_flops(m) * out->tokens_per_s / ((double)p->world * p->mach.flops);
    /* memory of the fullest stage: dt_zero_memory's accounting, examples/gpt's activations */
    {
        double psi = psi_max, shard = l.zero >= 1 ? (psi - px_max) / N + xsh : psi;
        double sets = l.pp == 1 ? 1 : out->in_flight;
        double master = m->dtype == DT_BF16 ? 4 : 0;
        out->mem_params = (l.zero == 3 ? shard : psi) * K + (m->dtype == DT_BF16 ? 4 * psi : 0); /* + f32 working copy */
        out->mem_grads = 4 * (l.zero >= 2 ? shard : psi);
        if (m->experts && !l.zero) /* DDP of dense and expert params: two bucketers, each with its own flat grads */
            out->mem_grads += 4 * psi;
        out->mem_optimizer = (8 + master) * shard;
        /* a set is one (chunk, micro-batch): a chunk's blocks (interleaved: half the stage's) */
        int nbc = (nb_max + l.chunks - 1) / l.chunks, off = (int)floor(l.offload * nbc + 0.5);
        out->mem_activations = sets * (dt__plan_acts_bytes(m, &l, nbc, A, p->paper, NULL) - (off > slots ? off - slots : 0) * own);
        if (x && nm_max) { /* a set's MoE outputs and grads (moefull, moedy, moeout) and each MoE block's routed
                              rows (dt_moe_acts); each layer's exchange buffers once */
            double Nr = rows, Nl = l.sp ? rows / l.tp : rows;
            int nmc = (nm_max + l.chunks - 1) / l.chunks;
            out->mem_activations += sets * (A * (2 * Nr * C + Nl * C) + nmc * dt__plan_at(x->rows, x->acts, rows)) +
                                    nm_max * dt__plan_at(x->rows, x->layer, rows);
        }
        if (l.pp > 1) { /* the tied head's copy and grad; the runtime's message buffers (a bound's search: m + 2) */
            out->mem_params += 2.0 * (double)m->vocab / l.tp * m->width * 4;
            if (!out->pp_buffers) out->pp_buffers = out->in_flight + 2;
            out->mem_activations += out->pp_buffers * (rows / (l.sp ? l.tp : 1) * C * A);
        }
        if (p->paper) /* NCCL reduces in place; ZeRO 3 holds a gathered block and the next one */
            out->mem_transient = l.zero == 3 ? 2 * K * dt__plan_block_params(m, l.tp) : 0;
        else { /* the ops' peak above their tensors: the block's, or a MoE layer's where larger */
            double ex = dt__plan_at(s->rows, s->extra, rows), xe = x ? dt__plan_at(x->rows, x->extra, rows) : 0;
            out->mem_transient = (ex > xe ? ex : xe) + dt__plan_zero_transient(m, &l, K, nb_max, nm_max, psi_max - px_max, px_max);
        }
        out->mem_total = out->mem_params + out->mem_grads + out->mem_optimizer + out->mem_activations + out->mem_transient;
    }
    return DT_OK;
}

DT_API dt_status dt_plan_predict(dt_ctx *ctx, const dt_plan_profile *p, const dt_plan_layout *layout,
                                 dt_plan_prediction *out) {
    return dt__plan_predict(ctx, p, layout, out, 0, NULL, NULL);
}

/* ==== >>search =================================================================================== */

static int dt__plan_better(const dt_plan_prediction *a, const dt_plan_prediction *b) {
    if (a->tokens_per_s != b->tokens_per_s) return a->tokens_per_s > b->tokens_per_s;
    return a->mem_total < b->mem_total;
}

/* insert pr into out[0 .. *n) (at most max), keeping it best first */
static void dt__plan_insert(dt_plan_prediction *out, int max, int *n, const dt_plan_prediction *pr) {
    int i;
    if (*n == max && !dt__plan_better(pr, &out[max - 1])) return;
    i = *n < max ? (*n)++ : max - 1;
    for (; i > 0 && dt__plan_better(pr, &out[i - 1]); i--) out[i] = out[i - 1];
    out[i] = *pr;
}

/* a layout of a paper search and the most tokens/s it could reach (no bubble, no message delay) */
typedef struct dt__plan_cand {
    dt_plan_layout l;
    double bound;
} dt__plan_cand;

static int dt__plan_cand_cmp(const void *a, const void *b) {
    double x = ((const dt__plan_cand *)a)->bound, y = ((const dt__plan_cand *)b)->bound;
    return x > y ? -1 : x < y ? 1 : 0;
}

/* The search so far: the best `max` layouts, how many fit, and a paper search's bounded layouts
   (simulated later, best bound first) */
typedef struct dt__plan_hunt {
    dt_plan_prediction *out;
    int max, n, all;
    dt__plan_cand *cands;
    int64_t n_cands, cap;
    dt_pp_schedule *cache; /* the last pipeline schedule made: the next layout often has the same */
} dt__plan_hunt;

/* One layout of the search: valid, predicted (paper: bounded), kept when it fits the budget (*fit 1). */
static dt_status dt__plan_try(dt_ctx *ctx, const dt_plan_profile *p, const dt_plan_search_desc *sd,
                              const dt_plan_layout *l, dt__plan_hunt *h, int *fit) {
    dt_plan_prediction pr;
    int pruned;
    dt_status err;
    *fit = 0;
    if (dt_plan_layout_check(NULL, &p->model, p->world, l, NULL)) return DT_OK;
    /* paper: memory and a bound on the step now, the pipeline later */
    err = dt__plan_predict(ctx, p, l, &pr, p->paper ? HUGE_VAL : 0, &h->cache, &pruned);
    if (err == DT_ERR_ARG || err == DT_ERR_STATE) return DT_OK; /* not this layout */
    if (err) return err;
    if (sd->mem_budget > 0 && pr.mem_total > sd->mem_budget) return DT_OK;
    h->all++;
    *fit = 1;
    if (!pruned) {
        dt__plan_insert(h->out, h->max, &h->n, &pr);
        return DT_OK;
    }
    if ((err = dt_grow(ctx, (void **)&h->cands, &h->cap, h->n_cands + 1, sizeof *h->cands, "dt_plan_search's layouts")))
        return err;
    h->cands[h->n_cands].l = *l;
    h->cands[h->n_cands++].bound = pr.tokens_per_s;
    return DT_OK;
}

DT_API dt_status dt_plan_search(dt_ctx *ctx, const dt_plan_profile *p, const dt_plan_search_desc *desc,
                                dt_plan_prediction *out, int max, int *count, int *total) {
    static const double offs[3] = {0, 0.5, 1};
    dt_plan_search_desc sd;
    dt__plan_hunt h;
    dt_status err = DT_OK;
    int W, tp, cp, pp, zero, sp, rec, sch, v, n_off, n_var, mi, nm, ep, fit, fit0 = 0;
    int64_t micro, per, ms[128], c;
    if (!p || !out || max < 1 || !count)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_plan_search: p, out and count must not be NULL, max >= 1 (max = %d)",
                                max);
    if (desc) sd = *desc;
    else memset(&sd, 0, sizeof sd);
    if ((err = dt__plan_profile_check(ctx, "dt_plan_search", p))) return err;
    if (sd.max_micro <= 0) sd.max_micro = p->paper ? (int)(p->model.batch < (1 << 20) ? p->model.batch : 1 << 20) : 16;
    if (sd.mem_budget <= 0 && p->paper) sd.mem_budget = p->mach.mem_bytes - p->mach.reserved_bytes;
    memset(&h, 0, sizeof h);
    h.out = out; h.max = max;
    W = p->world;
    /* offload never speeds a step: tried only to fit a budget (on paper, only where the layout without
       it does not fit: its copies may hide behind the compute, and the tie would go to offloading) */
    n_off = sd.mem_budget > 0 && (!p->paper || p->mach.h2d_bw > 0) ? 3 : 1;
    for (tp = 1; tp <= W; tp++)
        for (cp = 1; W % tp == 0 && tp * cp <= W && (sd.max_cp <= 0 || cp <= sd.max_cp); cp++)
            for (pp = 1; (W / tp) % cp == 0 && tp * cp * pp <= W; pp++) {
                if (W % (tp * cp * pp)) continue;
                /* micro-batches: 1, 2, 4, ... and those of 1, 2, 4, ... sequences (Megatron's micro-batch size) */
                per = p->model.batch / (W / (tp * cp * pp));
                for (nm = 0, micro = 1; micro <= sd.max_micro && nm < 64; micro *= 2) ms[nm++] = micro;
                for (micro = 1; micro <= per && nm < 128; micro *= 2)
                    if (per % micro == 0 && per / micro <= sd.max_micro && (per / micro & (per / micro - 1)))
                        ms[nm++] = per / micro; /* not a power of two: not listed yet */
                /* the variants of each: the ring or Ulysses (cp > 1), offload 0, 1/2, 1 (a budget) */
                n_var = (cp > 1 ? 2 : 1) * n_off;
                for (mi = 0; mi < nm && (micro = ms[mi]) > 0; mi++)
                    for (sch = pp > 1 ? DT_PP_GPIPE : 0; sch <= (pp > 1 ? DT_PP_ZB_H1 : 0); sch++)
                        for (zero = 0; zero <= 3; zero++)
                            for (sp = 0; sp <= (tp > 1); sp++)
                                for (rec = 0; rec <= (sd.recompute ? DT_PLAN_RECOMPUTE_GEMM_LAST : 0); rec++)
                                    for (v = 0; v < n_var; v++)
                                        for (ep = 1; ep <= (p->model.experts ? W / (tp * pp) : 1); ep++) {
                                            dt_plan_layout l;
                                            if ((W / (tp * pp)) % ep) continue; /* ep divides dp x cp */
                                            memset(&l, 0, sizeof l);
                                            l.tp = tp; l.cp = cp; l.pp = pp; l.micro = (int)micro; l.zero = zero;
                                            l.sp = sp; l.schedule = (dt_pp_kind)sch; l.recompute = (dt_plan_recompute)rec;
                                            l.ulysses = v / n_off; l.offload = offs[v % n_off]; l.ep = ep;
                                            if (p->paper && v % n_off && fit0) continue;
                                            if (cp > 1 && sd.no_ring && !l.ulysses) continue;
                                            if ((err = dt__plan_try(ctx, p, &sd, &l, &h, &fit))) goto done;
                                            if (v % n_off == 0) fit0 = fit;
                                        }
            }
    /* paper: the most promising first, until no bound can beat the last one kept */
    if (h.n_cands) qsort(h.cands, (size_t)h.n_cands, sizeof *h.cands, dt__plan_cand_cmp);
    for (c = 0; c < h.n_cands; c++) {
        dt_plan_prediction pr;
        if (h.n == max && h.cands[c].bound < out[max - 1].tokens_per_s) break;
        if ((err = dt__plan_predict(ctx, p, &h.cands[c].l, &pr, 0, &h.cache, NULL))) goto done;
        dt__plan_insert(out, max, &h.n, &pr);
    }
    err = DT_OK;
done:
    dt_release(ctx, h.cands);
    dt_pp_schedule_free(h.cache);
    *count = h.n;
    if (total) *total = h.all;
    return err;
}

DT_API void dt_plan_format(const dt_plan_prediction *pr, int n, dt_strbuf *out) {
    int i;
    char ls[160];
    if (!out) return;
    dt_strbuf_printf(out, "%-4s %-76s %10s %9s %9s %9s %9s %9s %10s\n", "rank", "layout", "tokens/s", "step ms",
                     "compute", "comm", "bubble", "optim", "memory MB");
    for (i = 0; i < n; i++)
        dt_strbuf_printf(out, "%-4d %-76s %10.0f %9.2f %9.2f %9.2f %9.2f %9.2f %10.2f\n", i + 1,
                         dt_plan_layout_string(&pr[i].layout, ls, sizeof ls), pr[i].tokens_per_s, pr[i].step_s * 1e3,
                         pr[i].compute_s * 1e3, pr[i].comm_s * 1e3, pr[i].bubble_s * 1e3, pr[i].optimizer_s * 1e3,
                         pr[i].mem_total / 1e6);
}


/* ==== >>paper ==================================================================================== */

/* The machine's fields: name in the file, where in the struct, the range a sane value takes. */
typedef struct dt__plan_mfield {
    const char *key;
    size_t off;
    double lo, hi;
} dt__plan_mfield;

#define DT__PLAN_MF(f, lo, hi) {#f, offsetof(dt_plan_machine, f), lo, hi}
static const dt__plan_mfield dt__plan_mfields[] = {
    DT__PLAN_MF(flops, 1e6, 1e18),       DT__PLAN_MF(gemm_eff, 1e-6, 1),     DT__PLAN_MF(attn_fwd_eff, 1e-6, 1),
    DT__PLAN_MF(attn_bwd_eff, 1e-6, 1),  DT__PLAN_MF(mem_bw, 1e6, 1e15),     DT__PLAN_MF(mem_eff, 1e-6, 1),
    DT__PLAN_MF(mem_bytes, 1e6, 1e15),   DT__PLAN_MF(reserved_bytes, 0, 1e15), DT__PLAN_MF(act_bytes, 1, 8),
    DT__PLAN_MF(intra_bw, 1e6, 1e15),    DT__PLAN_MF(intra_alpha, 0, 1),     DT__PLAN_MF(nic_bw, 1e6, 1e15),
    DT__PLAN_MF(inter_alpha, 0, 1),      DT__PLAN_MF(p2p_intra_bw, 1e6, 1e15), DT__PLAN_MF(p2p_inter_bw, 1e6, 1e15),
    DT__PLAN_MF(overlap, 0, 1),          DT__PLAN_MF(tp_overlap, 0, 1),      DT__PLAN_MF(h2d_bw, 0, 1e15),
};
#undef DT__PLAN_MF
#define DT__PLAN_NMF ((int)(sizeof dt__plan_mfields / sizeof dt__plan_mfields[0]))

static dt_status dt__plan_machine_check(dt_ctx *ctx, const char *fn, const dt_plan_machine *mc) {
    int i;
    if (!mc) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: machine is NULL", fn);
    if (mc->ranks_per_host < 1 || mc->ranks_per_host > 4096)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: machine %s: ranks_per_host = %d, expected 1 .. 4096", fn, mc->name,
                                mc->ranks_per_host);
    for (i = 0; i < DT__PLAN_NMF; i++) {
        double v;
        memcpy(&v, (const char *)mc + dt__plan_mfields[i].off, sizeof v);
        if (!(v >= dt__plan_mfields[i].lo && v <= dt__plan_mfields[i].hi))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: machine %s: %s = %g, expected %g .. %g", fn, mc->name,
                                    dt__plan_mfields[i].key, v, dt__plan_mfields[i].lo, dt__plan_mfields[i].hi);
    }
    if (mc->h2d_bw > 0 && mc->h2d_bw < 1e6)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: machine %s: h2d_bw = %g, expected 0 (not known) or 1e6 .. 1e15",
                                fn, mc->name, mc->h2d_bw);
    if (mc->reserved_bytes >= mc->mem_bytes)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: machine %s: reserved_bytes %g, expected less than mem_bytes %g", fn,
                                mc->name, mc->reserved_bytes, mc->mem_bytes);
    return DT_OK;
}

DT_API dt_status dt_plan_machine_load(dt_ctx *ctx, dt_plan_machine *mc, const char *path) {
    static const char *fn = "dt_plan_machine_load";
    char at[DT_ERROR_MAX];
    dt_json *root = NULL;
    const dt_json *j;
    dt_status err = DT_OK;
    int i;
    if (!mc || !path) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, mc ? "path" : "mc");
    memset(mc, 0, sizeof *mc);
    if ((err = dt__plan_read_json(ctx, fn, path, 1L << 20, &root))) return err;
    if (root->type != DT_JSON_OBJECT || !dt_json_get(root, "dt_plan_machine")) {
        err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: not a dt_plan machine (no \"dt_plan_machine\" key)", fn, path);
        goto done;
    }
    j = dt_json_get(root, "name");
    if (!j || j->type != DT_JSON_STRING || !j->string[0] || strlen(j->string) >= sizeof mc->name) {
        err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: name: expected a string of 1 .. %d characters", fn, path,
                               (int)sizeof mc->name - 1);
        goto done;
    }
    snprintf(mc->name, sizeof mc->name, "%s", j->string);
    j = dt_json_get(root, "ranks_per_host");
    if (!j || j->type != DT_JSON_NUMBER || !(j->number >= 1 && j->number <= 4096) || j->number != floor(j->number)) {
        char v[48];
        err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: ranks_per_host = %s, expected an integer in [1, 4096]", fn,
                               path, dt__plan_jval(j, v));
        goto done;
    }
    mc->ranks_per_host = (int)j->number;
    for (i = 0; i < DT__PLAN_NMF; i++) {
        const dt__plan_mfield *mf = &dt__plan_mfields[i];
        j = dt_json_get(root, mf->key);
        if (!j || j->type != DT_JSON_NUMBER || !(j->number >= mf->lo && j->number <= mf->hi)) {
            char v[48];
            err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: %s = %s, expected a number in [%g, %g]", fn, path, mf->key,
                                   dt__plan_jval(j, v), mf->lo, mf->hi);
            goto done;
        }
        memcpy((char *)mc + mf->off, &j->number, sizeof j->number);
    }
    snprintf(at, sizeof at, "%s: %s", fn, path);
    if ((err = dt__plan_as_format(ctx, dt__plan_machine_check(ctx, at, mc)))) goto done;
done:
    dt_json_free(ctx, root);
    if (err) memset(mc, 0, sizeof *mc);
    return err;
}

DT_API dt_status dt_plan_profile_paper(dt_ctx *ctx, const dt_plan_machine *mc, const dt_plan_model *m, int world,
                                       dt_plan_profile *out) {
    static const char *fn = "dt_plan_profile_paper";
    dt_status err;
    double bw;
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    if ((err = dt__plan_machine_check(ctx, fn, mc))) return err;
    if ((err = dt__plan_model_check(ctx, fn, m))) return err;
    if (m->experts)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->experts = %d: the planner models MoE from a measured profile "
                                "only (its routing and all-to-alls are timed, not derived from a data sheet)", fn,
                                m->experts);
    if (world < 1 || world > (1 << 20))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: world = %d, expected 1 .. 2^20", fn, world);
    memset(out, 0, sizeof *out);
    out->paper = 1;
    out->mach = *mc;
    out->model = *m;
    out->model.expert_load = NULL; /* the caller's (a profile holds shapes) */
    out->model.n_expert_load = 0;
    if (!out->model.kv_heads) out->model.kv_heads = m->heads;
    if (!out->model.dtype) out->model.dtype = DT_F32;
    out->world = world;
    out->hosts = (world + mc->ranks_per_host - 1) / mc->ranks_per_host;
    out->cores = mc->ranks_per_host; /* a GPU each: no rank waits for another's core */
    snprintf(out->machine, sizeof out->machine, "%.60s (on paper)", mc->name);
    bw = mc->mem_bw * mc->mem_eff;
    /* AdamW over a shard: reads grad, m, v and the f32 master (16 bytes), writes m, v, the master and
       the dtype's copy (12 + K); ZeRO's packing copies read and write each byte */
    out->opt_s_per_param = (28.0 + (m->dtype == DT_BF16 ? 2 : 4)) / bw;
    out->copy_s_per_byte = 2.0 / bw;
    out->overlap = mc->overlap;
    return DT_OK;
}

DT_API dt_status dt_plan_machine_save(dt_ctx *ctx, const dt_plan_machine *mc, const char *path, const char *source) {
    static const char *fn = "dt_plan_machine_save";
    dt_strbuf b;
    int i;
    dt_status err;
    if (!path) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: path is NULL", fn);
    if ((err = dt__plan_machine_check(ctx, fn, mc))) return err;
    memset(&b, 0, sizeof b);
    b.ctx = ctx;
    dt_strbuf_str(&b, "{\"dt_plan_machine\": 1,\n \"name\": ");
    dt_strbuf_json(&b, mc->name);
    dt_strbuf_printf(&b, ",\n \"ranks_per_host\": %d", mc->ranks_per_host);
    for (i = 0; i < DT__PLAN_NMF; i++) {
        double v;
        memcpy(&v, (const char *)mc + dt__plan_mfields[i].off, sizeof v);
        dt_strbuf_printf(&b, ",\n \"%s\": %.17g", dt__plan_mfields[i].key, v);
    }
    dt_strbuf_str(&b, ",\n \"sources\": [");
    dt_strbuf_json(&b, source ? source : "");
    dt_strbuf_str(&b, "]}\n");
    return dt__plan_write(ctx, fn, path, &b);
}

#ifdef DT_CUDA
/* What dt_plan_machine_measure runs on the device: the block's four linears (qkv, the attention's
   projection, fc, the MLP's projection) on one sequence's rows, its attention, a copy. */
typedef struct dt__plan_dev {
    dt_ctx *ctx;
    int64_t N, in[4], outc[4], S; /* S: floats a copy moves */
    int H, K;
    dt_tensor tmp, x, y, dy, dx, w[4], dw[4], q16, ao, dao, dq, ca, cb;
} dt__plan_dev;

static dt_status dt__plan_dev_lin(dt__plan_dev *d, int bwd) {
    dt_status err = DT_OK;
    int i;
    for (i = 0; i < 4 && !err; i++) {
        dt_tensor x, y, dx, dy;
        int64_t si[2], so[2];
        si[0] = so[0] = d->N; si[1] = d->in[i]; so[1] = d->outc[i];
        if ((err = dt_tensor_view(d->ctx, &x, &d->x, 0, 2, si)) || (err = dt_tensor_view(d->ctx, &y, &d->y, 0, 2, so)))
            break;
        if (!bwd) { err = dt_linear_fwd(d->ctx, &y, &x, &d->w[i], NULL); continue; }
        if ((err = dt_tensor_view(d->ctx, &dx, &d->dx, 0, 2, si)) || (err = dt_tensor_view(d->ctx, &dy, &d->dy, 0, 2, so)))
            break;
        err = dt_linear_bwd(d->ctx, &dx, &d->dw[i], NULL, &dy, &x, &d->w[i]);
    }
    return err;
}
static dt_status dt__plan_dev_lin_fwd(dt__plan_dev *d) { return dt__plan_dev_lin(d, 0); }
static dt_status dt__plan_dev_lin_bwd(dt__plan_dev *d) { return dt__plan_dev_lin(d, 1); }
static dt_status dt__plan_dev_attn_fwd(dt__plan_dev *d) {
    return dt_attention_gqa_fwd(d->ctx, &d->ao, NULL, &d->q16, d->H, d->K);
}
static dt_status dt__plan_dev_attn_bwd(dt__plan_dev *d) {
    return dt_attention_gqa_bwd(d->ctx, &d->dq, &d->dao, &d->q16, NULL, d->H, d->K);
}
static dt_status dt__plan_dev_copy(dt__plan_dev *d) { return dt_tensor_copy(d->ctx, &d->cb, &d->ca); }

/* The median over reps (after a warm-up) of the slowest rank's time of fn, the device waited for. */
static dt_status dt__plan_dev_time(dt_comm *world, dt__plan_dev *d, dt_status (*fn)(dt__plan_dev *), int reps,
                                   double *out) {
    double t[16], v;
    int i;
    dt_status err;
    if ((err = fn(d)) || (err = dt_ctx_sync(d->ctx))) return err;
    for (i = 0; i < reps; i++) {
        if ((err = dt_comm_barrier(world))) return err;
        v = dt_comm_now();
        if ((err = fn(d)) || (err = dt_ctx_sync(d->ctx))) return err;
        v = dt_comm_now() - v;
        if ((err = dt_comm_allreduce_f64(world, &v, 1, DT_REDUCE_MAX))) return err;
        dt__plan_sorted_add(t, i, v);
    }
    *out = t[reps / 2];
    return DT_OK;
}

/* A CUDA tensor of dims[0 .. nd) of dtype, its values 0.01 (bf16: cast from d->tmp's f32). */
static dt_status dt__plan_dev_mk(dt__plan_dev *d, dt_tensor *t, int nd, int64_t d0, int64_t d1, int64_t d2,
                                 dt_dtype dtype) {
    dt_tensor_desc td;
    dt_tensor v;
    dt_status err;
    memset(&td, 0, sizeof td);
    td.dtype = dtype; td.device = DT_CUDA_DEVICE; td.shape[0] = d0; td.shape[1] = d1; td.shape[2] = d2;
    if ((err = dt_tensor_create(d->ctx, t, &td))) return err;
    if (dtype != DT_BF16) return dt_tensor_fill(d->ctx, t, 0.01);
    if ((err = dt_tensor_view(d->ctx, &v, &d->tmp, 0, nd, td.shape))) return err;
    return dt_tensor_cast(d->ctx, t, &v);
}

static void dt__plan_dev_free(dt__plan_dev *d) {
    dt_tensor *t = &d->tmp, *end = &d->cb + 1;
    for (; t < end; t++) dt_tensor_free(d->ctx, t);
}

/* The block's tensors at one sequence's rows, and two copy buffers of S floats. */
static dt_status dt__plan_dev_make(dt__plan_dev *d, dt_ctx *ctx, const dt_plan_model *m, int64_t S) {
    int64_t kv = m->kv_heads ? m->kv_heads : m->heads, hs = m->width / m->heads, C = m->width;
    int64_t F = (int64_t)dt__plan_ffn(m), Fg = (1 + m->gated) * F, Wq = (m->heads + 2 * kv) * hs, big = 0;
    int i;
    dt_status err;
    memset(d, 0, sizeof *d);
    d->ctx = ctx; d->N = m->seq; d->H = m->heads; d->K = (int)kv; d->S = S;
    d->in[0] = C; d->outc[0] = C + 2 * kv * hs;
    d->in[1] = C; d->outc[1] = C;
    d->in[2] = C; d->outc[2] = Fg;
    d->in[3] = F; d->outc[3] = C;
    for (i = 0; i < 4; i++) if (d->in[i] * d->outc[i] > big) big = d->in[i] * d->outc[i];
    if (d->N * (Fg + C + Wq) > big) big = d->N * (Fg + C + Wq);
    if ((err = dt__plan_dev_mk(d, &d->tmp, 1, big, 0, 0, DT_F32)) ||
        (err = dt__plan_dev_mk(d, &d->x, 2, d->N, Fg + C, 0, DT_F32)) ||
        (err = dt__plan_dev_mk(d, &d->dx, 2, d->N, Fg + C, 0, DT_F32)) ||
        (err = dt__plan_dev_mk(d, &d->y, 2, d->N, Fg + C + Wq, 0, DT_F32)) ||
        (err = dt__plan_dev_mk(d, &d->dy, 2, d->N, Fg + C + Wq, 0, DT_F32)))
        return err;
    for (i = 0; i < 4; i++)
        if ((err = dt__plan_dev_mk(d, &d->w[i], 2, d->outc[i], d->in[i], 0, DT_BF16)) ||
            (err = dt__plan_dev_mk(d, &d->dw[i], 2, d->outc[i], d->in[i], 0, DT_F32)))
            return err;
    if ((err = dt__plan_dev_mk(d, &d->q16, 3, 1, d->N, Wq, DT_BF16)) ||
        (err = dt__plan_dev_mk(d, &d->dq, 3, 1, d->N, Wq, DT_F32)) ||
        (err = dt__plan_dev_mk(d, &d->ao, 3, 1, d->N, C, DT_F32)) ||
        (err = dt__plan_dev_mk(d, &d->dao, 3, 1, d->N, C, DT_F32)) ||
        (err = dt__plan_dev_mk(d, &d->ca, 1, S, 0, 0, DT_F32)) || (err = dt__plan_dev_mk(d, &d->cb, 1, S, 0, 0, DT_F32)))
        return err;
    return DT_OK;
}

/* The compute figures: the linears' and attention's rates over the peak (given's, raised to the
   fastest measured rate where below it), counting the work as dt__plan_paper_split does (the
   GEMMs' 2 N C (C + 2 Ckv + C + (g + 1) F) forward and twice that backward; attention's 2 b T^2 C
   forward, 2.5 times that backward), and the device copy's over mem_bw (*copy: its rate). */
static dt_status dt__plan_dev_rates(dt_comm *world, dt__plan_dev *d, const dt_plan_model *m, int reps,
                                    dt_plan_machine *mc, double *copy) {
    double C = m->width, T = (double)m->seq, F = dt__plan_ffn(m), g = 1 + m->gated, Ckv = (double)d->K * (C / m->heads);
    double t[5], gemm, attn = 2 * T * T * C, af, ab;
    dt_status err;
    if ((err = dt__plan_dev_time(world, d, dt__plan_dev_lin_fwd, reps, &t[0])) ||
        (err = dt__plan_dev_time(world, d, dt__plan_dev_lin_bwd, reps, &t[1])) ||
        (err = dt__plan_dev_time(world, d, dt__plan_dev_attn_fwd, reps, &t[2])) ||
        (err = dt__plan_dev_time(world, d, dt__plan_dev_attn_bwd, reps, &t[3])) ||
        (err = dt__plan_dev_time(world, d, dt__plan_dev_copy, reps, &t[4])))
        return err;
    gemm = 3 * 2 * T * C * (C + 2 * Ckv + C + (g + 1) * F) / (t[0] + t[1]);
    af = attn / t[2];
    ab = 2.5 * attn / t[3];
    *copy = 2.0 * 4 * (double)d->S / t[4];
    if (!(mc->flops >= gemm)) mc->flops = gemm;
    if (mc->flops < af) mc->flops = af;
    if (mc->flops < ab) mc->flops = ab;
    if (!(mc->mem_bw >= *copy)) mc->mem_bw = *copy;
    mc->gemm_eff = gemm / mc->flops;
    mc->attn_fwd_eff = af / mc->flops;
    mc->attn_bwd_eff = ab / mc->flops;
    mc->mem_eff = *copy / mc->mem_bw;
    return DT_OK;
}

/* The host link: S floats of pinned host memory to the device and back, each copy waited for;
   the slower direction's median. */
static dt_status dt__plan_dev_host_link(dt_comm *world, dt__plan_dev *d, int reps, dt_plan_machine *mc) {
    static const char *fn = "dt_plan_machine_measure";
    size_t bytes = (size_t)d->S * 4;
    void *pinned = NULL;
    double t[16], v;
    int i;
    dt_status err = DT_OK;
    if (cudaMallocHost(&pinned, bytes) != cudaSuccess || !pinned)
        return dt_ctx_set_error(d->ctx, DT_ERR_OOM, "%s: cudaMallocHost of %zu bytes failed", fn, bytes);
    memset(pinned, 0, bytes);
    for (i = 0; i <= reps && !err; i++) { /* the first a warm-up */
        double a = 0, b = 0;
        if ((err = dt_comm_barrier(world))) break;
        a = dt_comm_now();
        if ((err = dt_cuda_memcpy(d->ctx, d->ca.data, DT_CUDA_DEVICE, pinned, DT_CPU, bytes, fn)) ||
            (err = dt_ctx_sync(d->ctx)))
            break;
        a = dt_comm_now() - a;
        if ((err = dt_comm_barrier(world))) break;
        b = dt_comm_now();
        if ((err = dt_cuda_memcpy(d->ctx, pinned, DT_CPU, d->ca.data, DT_CUDA_DEVICE, bytes, fn))) break;
        b = dt_comm_now() - b;
        v = a > b ? a : b;
        if ((err = dt_comm_allreduce_f64(world, &v, 1, DT_REDUCE_MAX))) break;
        if (i) dt__plan_sorted_add(t, i - 1, v);
    }
    cudaFreeHost(pinned);
    if (!err) mc->h2d_bw = (double)bytes / t[reps / 2];
    return err;
}

/* alpha and seconds per byte of a collective over the groups g from its times at 8 KB and 64 MB */
static dt_status dt__plan_dev_coll(dt_comm *world, dt_comm *g, dt_plan_coll_kind kind, int reps, double *alpha,
                                   double *beta) {
    const int64_t e0 = 2048, e1 = 16 << 20; /* f32 elements */
    double t0 = 0, t1 = 0;
    dt_status err;
    if ((err = dt__plan_coll_once(world, g, kind, e0, reps, DT_CUDA_DEVICE, &t0)) ||
        (err = dt__plan_coll_once(world, g, kind, e1, reps, DT_CUDA_DEVICE, &t1)))
        return err;
    *beta = t1 > t0 ? (t1 - t0) / (4.0 * (double)(e1 - e0)) : 1e-15;
    *alpha = t0 - *beta * 4.0 * (double)e0;
    if (*alpha < 0) *alpha = 0;
    return DT_OK;
}

/* The links: each rank's host from a hash of its host name (every rank's in one array), then
   the groups of each host's ranks (all-reduce bus bandwidth, a ring step's send) and of one rank
   per host, all groups of a kind at once. A link the world cannot show keeps given's figure
   (has_given), else takes the nearest one measured (copy: the device copy's rate). */
static dt_status dt__plan_dev_links(dt_comm *world, int reps, int has_given, double copy, dt_plan_machine *mc) {
    dt_ctx *ctx = dt_comm_ctx(world);
    dt_comm *host = NULL, *across = NULL;
    int W = dt_comm_size(world), r = dt_comm_rank(world), i, j, first = -1, idx = 0, hosts = 0;
    double *hash, mine, a = 0, b = 0, have[2];
    struct utsname un;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    const char *c = uname(&un) == 0 ? un.nodename : "?";
    dt_status err;
    hash = (double *)dt_alloc_zeroed(ctx, (size_t)W * sizeof *hash);
    if (!hash) return DT_ERR_OOM;
    for (; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    mine = (double)(h >> 12) + 1; /* exact in a double, never 0 */
    hash[r] = mine;
    if ((err = dt_comm_allreduce_f64(world, hash, W, DT_REDUCE_SUM))) goto done;
    for (i = 0; i < W; i++) {
        int seen = 0;
        for (j = 0; j < i && !seen; j++) seen = hash[j] == hash[i];
        hosts += !seen;
        if (hash[i] == mine && first < 0) first = i;
        if (hash[i] == mine && i < r) idx++;
    }
    mc->ranks_per_host = (W + hosts - 1) / hosts;
    if ((err = dt_comm_split(world, &host, first, r)) || (err = dt_comm_split(world, &across, idx, r))) goto done;
    have[0] = dt_comm_size(host); /* the smallest host's group, and the fewest hosts a group spans */
    have[1] = dt_comm_size(across);
    if ((err = dt_comm_allreduce_f64(world, have, 2, DT_REDUCE_MIN))) goto done;
    if (have[0] >= 2) {
        if ((err = dt__plan_dev_coll(world, host, DT_PLAN_ALLREDUCE, reps, &a, &b))) goto done;
        mc->intra_alpha = a;
        mc->intra_bw = 2 * (have[0] - 1) / have[0] / b;
        if ((err = dt__plan_dev_coll(world, host, DT_PLAN_SENDRECV, reps, &a, &b))) goto done;
        mc->p2p_intra_bw = 1 / b;
    } else if (!has_given) { /* one rank a host: no group inside one is ever costed */
        mc->intra_bw = mc->p2p_intra_bw = copy;
        mc->intra_alpha = 0;
    }
    if (have[1] >= 2 && hosts > 1) {
        if ((err = dt__plan_dev_coll(world, across, DT_PLAN_ALLREDUCE, reps, &a, &b))) goto done;
        mc->inter_alpha = a / ceil(log2(have[1])); /* the paper model's latency per level of the tree */
        mc->nic_bw = 2 * (have[1] - 1) / have[1] / b;
        if ((err = dt__plan_dev_coll(world, across, DT_PLAN_SENDRECV, reps, &a, &b))) goto done;
        mc->p2p_inter_bw = 1 / b;
    } else if (!has_given) { /* one host: nothing leaves it; its own links stand in */
        mc->nic_bw = mc->intra_bw; mc->inter_alpha = mc->intra_alpha; mc->p2p_inter_bw = mc->p2p_intra_bw;
    }
done:
    dt_comm_free(across);
    dt_comm_free(host);
    dt_release(ctx, hash);
    return err;
}
#endif

DT_API dt_status dt_plan_machine_measure(dt_comm *world, const dt_plan_model *m, const dt_plan_machine *given,
                                         dt_plan_machine *out) {
    static const char *fn = "dt_plan_machine_measure";
    dt_ctx *ctx = dt_comm_ctx(world);
    dt_status err;
    if (!world || !m || !out)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, !world ? "world" : !m ? "m" : "out");
    if ((err = dt__plan_model_check(ctx, fn, m))) return err;
    if (m->experts)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: model->experts = %d: the paper model has no MoE (plan MoE on the "
                                "CPU's measured profile)", fn, m->experts);
#ifndef DT_CUDA
    (void)given;
    return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: dt was built without DT_CUDA: there is no GPU to measure (plan a "
                            "machine on paper from its file: dt_plan_machine_load)", fn);
#else
    {
        dt__plan_dev d;
        dt_plan_machine mc;
        int64_t hs = m->width / m->heads;
        double v[2], copy = 0;
        size_t fr = 0, tot = 0;
        struct utsname un;
        const int reps = 3;
        if (ctx->device != DT_CUDA_DEVICE)
            return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: world's ctx is on %s, expected cuda (it measures the "
                                    "GPUs the ranks train on)", fn, dt_device_name(ctx->device));
        if (hs != 16 && hs != 32 && hs != 64 && hs != 96 && hs != 128)
            return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: head size width / heads = %lld: the tensor-core "
                                    "attention takes 16, 32, 64, 96 or 128", fn, (long long)hs);
        if (given && (err = dt__plan_machine_check(ctx, fn, given))) return err;
        memset(&mc, 0, sizeof mc);
        if (given) mc = *given;
        else mc.overlap = 0.9; /* an assumption, as the machine files'; tp_overlap 0: dt hides no tp collective */
        mc.act_bytes = 4; /* dt's f32 activations (a bf16 model's GEMM inputs: 2, dt__plan_acts_bytes) */
        /* the device's memory before anything here takes some */
        if (cudaMemGetInfo(&fr, &tot) != cudaSuccess)
            return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: cudaMemGetInfo failed", fn);
        v[0] = -(double)tot; v[1] = (double)(tot - fr);
        if ((err = dt_comm_allreduce_f64(world, v, 2, DT_REDUCE_MAX))) return err;
        mc.mem_bytes = -v[0]; mc.reserved_bytes = v[1];
        if (!(err = dt__plan_dev_make(&d, ctx, m, 16 << 20)) && !(err = dt__plan_dev_rates(world, &d, m, reps, &mc, &copy)))
            err = dt__plan_dev_host_link(world, &d, reps, &mc);
        dt__plan_dev_free(&d);
        if (!err) err = dt__plan_dev_links(world, reps, given != NULL, copy, &mc);
        if (err) return err;
        snprintf(mc.name, sizeof mc.name, "%.40s: %d GPUs measured by dt_plan_machine_measure",
                 uname(&un) == 0 ? un.nodename : "?", dt_comm_size(world));
        if ((err = dt__plan_machine_check(ctx, fn, &mc))) return err;
        *out = mc;
        return DT_OK;
    }
#endif
}

DT_API double dt_plan_model_flops(const dt_plan_model *m) {
    double C, Ckv, F, gemm;
    if (!m || m->heads < 1 || m->width < 1) return 0;
    C = m->width;
    Ckv = (double)(m->kv_heads ? m->kv_heads : m->heads) * (C / m->heads);
    F = dt__plan_ffn(m);
    gemm = C * (C + 2 * Ckv) + C * C + (2.0 + m->gated) * C * F; /* qkv, projection, MLP */
    return 6 * (m->layers * gemm + (double)m->vocab * C) + 12.0 * m->layers * (double)m->seq * C;
}

/* ==== >>dlrm ===================================================================================== */

#ifdef DT_EMBED_H

/* Every table of one kind; table-wise and table-row: largest work first, each on the rank (group)
   with the least work so far. DT_ERR_OOM only. */
static dt_status dt__plan_uniform(dt_ctx *ctx, const dt_plan_dlrm_profile *p, int kind, dt_plan_dlrm_plan *pl) {
    int order[DT_PLAN_MAX_TABLES], i, j, t, W = p->world;
    memset(pl, 0, sizeof *pl);
    snprintf(pl->name, sizeof pl->name, "%s", dt_embed_sharding_name((dt_embed_sharding)kind));
    pl->n_tables = p->n_tables;
    for (t = 0; t < p->n_tables; t++) { pl->kind[t] = (dt_embed_sharding)kind; order[t] = t; }
    if (kind == DT_SHARD_TABLE || kind == DT_SHARD_TABLE_ROW) {
        int step = kind == DT_SHARD_TABLE ? 1 : (p->group > 0 ? p->group : W), slots = W / step;
        double *load = (double *)dt_alloc_zeroed(ctx, sizeof(double) * (size_t)slots);
        if (!load) return DT_ERR_OOM;
        for (i = 1; i < p->n_tables; i++) /* by work, largest first (stable) */
            for (j = i; j > 0 && p->cost[order[j - 1]][kind].fwd[0] + p->cost[order[j - 1]][kind].bwd[0] <
                                  p->cost[order[j]][kind].fwd[0] + p->cost[order[j]][kind].bwd[0]; j--) {
                int x = order[j]; order[j] = order[j - 1]; order[j - 1] = x;
            }
        for (i = 0; i < p->n_tables; i++) {
            int sl, bs = 0;
            t = order[i];
            for (sl = 1; sl < slots; sl++) if (load[sl] < load[bs]) bs = sl;
            pl->owner[t] = bs * step;
            load[bs] += p->cost[t][kind].fwd[0] + p->cost[t][kind].bwd[0];
        }
        dt_release(ctx, load);
    }
    return DT_OK;
}

/* One dt_embed (ed) through the nk batches k[] once (a warm-up: the buffers grow to the largest, as
   over a run) and then `reps` forwards and backwards going round them, every rank starting
   together: this rank's medians (fwd, bwd seconds), the bytes it holds and its peak above them in
   r[0 .. 4). dense: its step after each (timed: *dense_s, the slowest rank's median); made: the
   plan dt_embed made. *refused: dt_embed_create said DT_ERR_ARG or DT_ERR_UNSUPPORTED (on every
   rank alike: it checks the same desc everywhere, and agrees on failure). */
static dt_status dt__plan_em_time(dt_comm *world, const dt_embed_desc *ed, const dt_kjt *k, int nk, int reps, double r[4],
                                  int *refused, const dt_plan_dlrm_desc *dense, double *dense_s, dt_plan_dlrm_plan *made) {
    dt_ctx *ctx = dt_comm_ctx(world);
    dt_embed *e = NULL;
    dt_tensor buf[2], out, dout;
    dt_tensor_desc d;
    int64_t pooled = 0, shape[2];
    double tf[16], tb[16], td[16];
    size_t before;
    dt_status err;
    int i, f;
    *refused = 0;
    memset(r, 0, 4 * sizeof *r);
    memset(buf, 0, sizeof buf);
    for (f = 0; f < (ed->features ? ed->n_features : ed->n_tables); f++)
        pooled += ed->tables[ed->features ? ed->features[f].table : f].dim;
    memset(&d, 0, sizeof d);
    d.shape[0] = k->batch > 0 ? k->batch : 1;
    d.shape[1] = pooled;
    d.device = ctx->device;
    if ((err = dt_tensor_create(ctx, &buf[0], &d)) || (err = dt_tensor_create(ctx, &buf[1], &d))) goto done;
    dt_tensor_fill(ctx, &buf[1], 0.001);
    shape[0] = k->batch; shape[1] = pooled;
    if ((err = dt_tensor_view(ctx, &out, &buf[0], 0, 2, shape)) || (err = dt_tensor_view(ctx, &dout, &buf[1], 0, 2, shape)))
        goto done;
    before = ctx->bytes_in_use;
    err = dt_embed_create(ctx, &e, ed);
    if (err == DT_ERR_ARG || err == DT_ERR_UNSUPPORTED) {
        dt_ctx_clear_error(ctx);
        *refused = 1;
        err = DT_OK;
        goto done;
    }
    if (err) goto done;
    r[2] = (double)(ctx->bytes_in_use - before);
    if (made) for (f = 0; f < ed->n_tables && f < DT_PLAN_MAX_TABLES; f++) made->kind[f] = dt_embed_table_sharding(e, f, &made->owner[f]);
    dt_reset_peak_bytes(ctx);
    if (reps > 15) reps = 15;
    for (i = -nk; i < reps; i++) { /* the first nk are the warm-up */
        double t0, t1, t2;
        const dt_kjt *kb = &k[(i + nk) % nk];
        if ((err = dt_comm_barrier(world))) break;
        t0 = dt_comm_now();
        if ((err = dt_embed_forward_begin(e, kb)) || (err = dt_embed_forward_end(e, &out))) break;
        t1 = dt_comm_now();
        if (i >= 0) dt__plan_sorted_add(tf, i, t1 - t0);
        if (dense && dense->dense) { /* the dense step between the tables' forward and backward, as in
                                        a step: it has the caches then, and leaves them to the backward */
            double s;
            if ((err = dt_comm_barrier(world))) break;
            s = dt_comm_now();
            if ((err = dense->dense(dense->user)) || (err = dt_ctx_sync(ctx))) break;
            s = dt_comm_now() - s;
            if ((err = dt_comm_allreduce_f64(world, &s, 1, DT_REDUCE_MAX))) break;
            if (i >= 0) dt__plan_sorted_add(td, i, s);
            if ((err = dt_comm_barrier(world))) break;
            t1 = dt_comm_now();
        }
        if ((err = dt_embed_backward(e, &dout))) break;
        if ((err = dt_ctx_sync(ctx))) break;
        t2 = dt_comm_now();
        if (i >= 0) dt__plan_sorted_add(tb, i, t2 - t1);
    }
    if (!err) {
        r[0] = tf[reps / 2];
        r[1] = tb[reps / 2];
        if (dense_s) *dense_s = dense && dense->dense ? td[reps / 2] : 0;
        r[3] = (double)dt_peak_bytes(ctx) - (double)before - r[2];
        if (r[3] < 0) r[3] = 0;
    }
done:
    dt_embed_free(e);
    dt_tensor_free(ctx, &buf[0]);
    dt_tensor_free(ctx, &buf[1]);
    return err;
}

/* the largest of ranks 0 .. k-1's four figures (the owners: rank 0 of a table-wise table, the
   first group of a table-row one) and of the other ranks' (where there are none: the owners'
   again). With k = 1 for a table-row table, a rank of its group counted as one that only asks:
   its bytes were the group's, and `--shard table-row` at np 4 on hosts of 2 was predicted 31%
   over (25.78 MB a rank, 19.68 measured). */
static dt_status dt__plan_em_roles(dt_comm *world, int k, const double r[4], double own[4], double other[4]) {
    double v[8];
    int i, mine = dt_comm_rank(world) < k;
    dt_status err;
    for (i = 0; i < 4; i++) { v[i] = mine ? r[i] : -1e300; v[4 + i] = mine ? -1e300 : r[i]; }
    if ((err = dt_comm_allreduce_f64(world, v, 8, DT_REDUCE_MAX))) return err;
    for (i = 0; i < 4; i++) { own[i] = v[i]; other[i] = dt_comm_size(world) > k ? v[4 + i] : v[i]; }
    return DT_OK;
}

/* this rank's batches, copied (the caller's buffers may be one, filled again for each): n kjts and
   their storage from the ctx (freed by dt__plan_batches_free) */
typedef struct dt__plan_batches {
    int n;
    dt_kjt k[DT_PLAN_MAX_BATCHES];
    void *mem[DT_PLAN_MAX_BATCHES];
} dt__plan_batches;

static void dt__plan_batches_free(dt_ctx *ctx, dt__plan_batches *bs) {
    int i;
    for (i = 0; i < bs->n; i++) dt_release(ctx, bs->mem[i]);
    bs->n = 0;
}

static dt_status dt__plan_batches_get(dt_ctx *ctx, const char *fn, const dt_plan_dlrm_desc *desc, dt__plan_batches *bs) {
    int i, n = desc->get_batch ? desc->n_batches : 1;
    dt_status err;
    memset(bs, 0, sizeof *bs);
    for (i = 0; i < n; i++) {
        dt_kjt k;
        int64_t nl, nid = 0, j;
        size_t idsz, bytes;
        char *m;
        if (desc->get_batch) {
            memset(&k, 0, sizeof k);
            if ((err = desc->get_batch(desc->user, i, &k))) return err;
        } else k = *desc->batch;
        if (k.n_features != desc->n_tables || k.batch < 0 || (k.batch > 0 && (!k.lengths || !k.ids)) ||
            (i > 0 && k.batch != bs->k[0].batch) || (k.ids_dtype != DT_DTYPE_DEFAULT && k.ids_dtype != DT_I64 &&
                                                     k.ids_dtype != DT_I32))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: batch %d: %d features of %lld samples (lengths %s, ids %s, "
                                    "ids dtype %d); expected one feature per table (%d), arrays set, the same samples in "
                                    "every batch, ids i64 or i32", fn, i, k.n_features, (long long)k.batch,
                                    k.lengths ? "set" : "NULL", k.ids ? "set" : "NULL", (int)k.ids_dtype, desc->n_tables);
        if (k.batch > ((int64_t)1 << 40))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: batch %d: %lld samples; expected at most 2^40", fn, i,
                                    (long long)k.batch);
        nl = (int64_t)k.n_features * k.batch;
        for (j = 0; j < nl; j++) {
            if (k.lengths[j] < 0 || k.lengths[j] > ((int64_t)1 << 40))
                return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: batch %d: lengths[%lld] = %lld; expected 0 .. 2^40", fn, i,
                                        (long long)j, (long long)k.lengths[j]);
            nid += k.lengths[j];
            if (nid > ((int64_t)1 << 44)) /* (the copy's size below cannot overflow) */
                return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: batch %d: more than 2^44 ids; expected one step's batch",
                                        fn, i);
        }
        idsz = k.ids_dtype == DT_I32 ? 4 : 8;
        bytes = (size_t)nl * 8 + (size_t)nid * idsz + (k.weights ? (size_t)nid * 4 : 0) + 8;
        if (!(m = (char *)dt_alloc(ctx, bytes))) return DT_ERR_OOM;
        bs->mem[bs->n++] = m;
        memcpy(m, k.lengths, (size_t)nl * 8);
        memcpy(m + nl * 8, k.ids, (size_t)nid * idsz);
        if (k.weights) memcpy(m + nl * 8 + (size_t)nid * idsz, k.weights, (size_t)nid * 4);
        bs->k[i] = k;
        bs->k[i].lengths = (const int64_t *)m;
        bs->k[i].ids = m + nl * 8;
        bs->k[i].weights = k.weights ? (const float *)(m + nl * 8 + (size_t)nid * idsz) : NULL;
    }
    return DT_OK;
}

/* the batches' feature t alone: out[i], one feature each */
static void dt__plan_batches_slice(const dt__plan_batches *bs, int t, dt_kjt *out) {
    int i;
    for (i = 0; i < bs->n; i++) {
        const dt_kjt *k = &bs->k[i];
        int64_t off = 0, j, b = k->batch;
        size_t idsz = k->ids_dtype == DT_I32 ? 4 : 8;
        for (j = 0; j < (int64_t)t * b; j++) off += k->lengths[j];
        memset(&out[i], 0, sizeof out[i]);
        out[i].n_features = 1;
        out[i].batch = b;
        out[i].lengths = k->lengths + (int64_t)t * b;
        out[i].ids = (const char *)k->ids + (size_t)off * idsz;
        out[i].ids_dtype = k->ids_dtype;
        out[i].weights = k->weights ? k->weights + off : NULL;
    }
}

static dt_status dt__plan_dlrm_measure(dt_comm *world, const dt_plan_dlrm_desc *desc, dt_plan_dlrm_profile *out,
                                       const dt__plan_batches *bs) {
    static const char *fn = "dt_plan_dlrm_measure";
    dt_ctx *ctx = dt_comm_ctx(world);
    dt_embed_table_desc td[DT_PLAN_MAX_TABLES];
    dt_embed_feature_desc fd[DT_PLAN_MAX_TABLES];
    dt_embed_desc ed;
    dt_kjt k1[DT_PLAN_MAX_BATCHES];
    double r[4], own[4], other[4];
    int W = dt_comm_size(world), t, i, reps = desc->repeats ? desc->repeats : 5, refused, kind;
    dt_status err;
    memset(&ed, 0, sizeof ed);
    ed.comm = world;
    ed.seed = 1;
    ed.batch_hint = desc->global_batch;
    ed.dp_max_bytes = desc->dp_max_bytes;
    ed.device = ctx->device;
    { /* dt_embed's own plan of the tables as given, whole: its steps, and the dense step timed after
         each (the tables' rows have been through the caches then, as in a step) */
        dt_plan_dlrm_plan made;
        ed.tables = desc->tables;
        ed.n_tables = desc->n_tables;
        if ((err = dt__plan_em_time(world, &ed, bs->k, bs->n, reps, r, &refused, desc, &out->dense_s, &made))) return err;
        if (refused) {
            char why[DT_ERROR_MAX]; /* copied out of the buffer the new message is written into */
            snprintf(why, sizeof why, "%s", dt_ctx_error(ctx));
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: dt_embed_create refuses desc.tables: %s", fn, why);
        }
        for (t = 0; t < desc->n_tables; t++) { out->auto_kind[t] = made.kind[t]; out->auto_owner[t] = made.owner[t]; }
        if ((err = dt__plan_em_roles(world, 1, r, own, other))) return err;
        out->whole_fwd[DT_SHARD_AUTO] = own[0] > other[0] ? own[0] : other[0];
        out->whole_bwd[DT_SHARD_AUTO] = own[1] > other[1] ? own[1] : other[1];
        out->whole_peak[DT_SHARD_AUTO] = own[3] > other[3] ? own[3] : other[3];
    }
    { /* the fixed exchange: one row-wise table (the first), an empty batch on every rank (W > 1); and
         one embedding's own bytes: a one-row data-parallel table, less that row */
        int64_t zero = 0;
        dt_kjt k0;
        memset(&k0, 0, sizeof k0);
        k0.n_features = 1;
        k0.lengths = &zero;
        k0.ids = &zero;
        k0.ids_dtype = bs->k[0].ids_dtype;
        td[0] = desc->tables[0];
        td[0].pin_owner = 0; td[0].tier = DT_TIER_NONE; td[0].dynamic = 0;
        ed.tables = td; ed.n_tables = 1;
        if (W > 1) {
            td[0].sharding = DT_SHARD_ROW;
            if ((err = dt__plan_em_time(world, &ed, &k0, 1, reps, r, &refused, NULL, NULL, NULL))) return err;
            if ((err = dt__plan_em_roles(world, 1, r, own, other))) return err;
            out->x_fwd = own[0] > other[0] ? own[0] : other[0];
            out->x_bwd = own[1] > other[1] ? own[1] : other[1];
        }
        td[0].rows = 1;
        td[0].sharding = DT_SHARD_DATA;
        if ((err = dt__plan_em_time(world, &ed, &k0, 1, 1, r, &refused, NULL, NULL, NULL))) return err;
        if ((err = dt__plan_em_roles(world, 1, r, own, other))) return err;
        out->x_bytes = (own[2] > other[2] ? own[2] : other[2]) -
                       (double)td[0].dim * (double)dt_dtype_size(td[0].dtype ? td[0].dtype : DT_F32);
        if (out->x_bytes < 0) out->x_bytes = 0;
    }
    for (t = 0; t < desc->n_tables; t++) {
        dt__plan_batches_slice(bs, t, k1);
        for (kind = DT_SHARD_TABLE; kind < DT_SHARD_COUNT; kind++) {
            dt_plan_table_cost *c = &out->cost[t][kind];
            int dyn = desc->tables[t].dynamic;
            if ((dyn && kind != DT_SHARD_ROW) || (kind == DT_SHARD_TABLE_ROW && !out->group) ||
                (kind == DT_SHARD_COLUMN && desc->tables[t].optim.kind == DT_EMBED_ROWWISE_ADAGRAD))
                continue; /* dt_embed would refuse it (or, dynamic: never does it) */
            td[0] = desc->tables[t];
            td[0].sharding = (dt_embed_sharding)kind;
            td[0].pin_owner = kind == DT_SHARD_TABLE || kind == DT_SHARD_TABLE_ROW;
            td[0].owner = 0;
            td[0].group_size = kind == DT_SHARD_TABLE_ROW ? out->group : 0;
            ed.tables = td; ed.n_tables = 1; ed.features = NULL; ed.n_features = 0; ed.n_inputs = 0;
            if ((err = dt__plan_em_time(world, &ed, k1, bs->n, reps, r, &refused, NULL, NULL, NULL))) return err;
            if (refused) continue;
            if ((err = dt__plan_em_roles(world, kind == DT_SHARD_TABLE_ROW ? out->group : 1, r, own, other))) return err;
            c->ok = 1;
            if (kind == DT_SHARD_TABLE || kind == DT_SHARD_TABLE_ROW) {
                double xf = W > 1 ? out->x_fwd : 0, xb = W > 1 ? out->x_bwd : 0;
                c->fwd[0] = own[0] - xf; c->bwd[0] = own[1] - xb;
                c->bytes[0] = own[2]; c->peak[0] = own[3];
                c->fwd[1] = c->bwd[1] = 0;
                c->bytes[1] = other[2]; c->peak[1] = other[3];
                if (kind == DT_SHARD_TABLE && W > 1 && W <= DT_PLAN_MAX_TABLES) {
                    /* the asking share: W copies, copy j on rank j, every copy reading these ids; a
                       rank then owns one and asks W - 1: (its time - the owner's) / (W - 1) */
                    int j;
                    dt_embed_table_desc tw[DT_PLAN_MAX_TABLES];
                    char names[DT_PLAN_MAX_TABLES][24];
                    double rw[4], ow[4], xw[4];
                    for (j = 0; j < W; j++) {
                        tw[j] = td[0];
                        snprintf(names[j], sizeof names[j], "plan_copy_%d", j);
                        tw[j].name = names[j];
                        tw[j].owner = j;
                        fd[j].name = names[j]; fd[j].table = j; fd[j].input = 0;
                    }
                    ed.tables = tw; ed.n_tables = W; ed.features = fd; ed.n_features = W; ed.n_inputs = 1;
                    err = dt__plan_em_time(world, &ed, k1, bs->n, reps, rw, &refused, NULL, NULL, NULL);
                    ed.features = NULL; ed.n_features = 0; ed.n_inputs = 0;
                    if (err) return err;
                    if (!refused) {
                        if ((err = dt__plan_em_roles(world, 1, rw, ow, xw))) return err;
                        /* the slowest rank's, as the one-table figures are (its pooled output is W
                           times as wide: the asking share includes what the requester copies) */
                        for (j = 0; j < 4; j++) if (xw[j] > ow[j]) ow[j] = xw[j];
                        c->fwd[1] = (ow[0] - own[0]) / (W - 1);
                        c->bwd[1] = (ow[1] - own[1]) / (W - 1);
                        c->bytes[1] = (ow[2] - own[2]) / (W - 1);
                        c->peak[1] = (ow[3] - own[3]) / (W - 1);
                    }
                }
            } else { /* every rank alike: the slowest's */
                int exch_f = W > 1 && kind != DT_SHARD_DATA, exch_b = W > 1;
                for (i = 0; i < 4; i++) if (other[i] > own[i]) own[i] = other[i];
                c->fwd[0] = c->fwd[1] = own[0] - (exch_f ? out->x_fwd : 0);
                c->bwd[0] = c->bwd[1] = own[1] - (exch_b ? out->x_bwd : 0);
                c->bytes[0] = c->bytes[1] = own[2];
                c->peak[0] = c->peak[1] = own[3];
            }
            for (i = 0; i < 2; i++) { /* a table's own bytes: less the embedding's, counted once a plan */
                c->bytes[i] -= out->x_bytes * (c->bytes[i] > 0);
                if (c->fwd[i] < 0) c->fwd[i] = 0;
                if (c->bwd[i] < 0) c->bwd[i] = 0;
                if (c->bytes[i] < 0) c->bytes[i] = 0;
                if (c->peak[i] < 0) c->peak[i] = 0;
            }
        }
    }
    /* each kind whole: every table of it at once; the scale of its one-table work */
    for (kind = DT_SHARD_TABLE; kind < DT_SHARD_COUNT; kind++) {
        dt_plan_dlrm_plan pl;
        dt_plan_dlrm_prediction pr;
        double xf = W > 1 && kind != DT_SHARD_DATA ? out->x_fwd : 0, xb = W > 1 ? out->x_bwd : 0, wf, wb;
        for (t = 0; t < desc->n_tables && out->cost[t][kind].ok; t++) {}
        if (t < desc->n_tables) continue; /* a table cannot take it */
        /* placed by dt_embed (table-wise: largest first, each on the rank holding least), not by
           this profile's timings: the scales then fit `--shard table` exactly and are the same
           from one profile to the next (placed by the timings, the table-wise transient's scale
           moved 1.01 <-> 1.11 between profiles of one machine, and the prediction 4% with it) */
        memset(&pl, 0, sizeof pl);
        snprintf(pl.name, sizeof pl.name, "%s", dt_embed_sharding_name((dt_embed_sharding)kind));
        pl.n_tables = desc->n_tables;
        for (t = 0; t < desc->n_tables; t++) {
            td[t] = desc->tables[t];
            td[t].sharding = (dt_embed_sharding)kind;
            td[t].pin_owner = 0;
            td[t].group_size = kind == DT_SHARD_TABLE_ROW ? out->group : 0;
        }
        ed.tables = td; ed.n_tables = desc->n_tables; ed.features = NULL; ed.n_features = 0; ed.n_inputs = 0;
        if ((err = dt__plan_em_time(world, &ed, bs->k, bs->n, reps, r, &refused, desc, NULL, &pl))) return err;
        if (refused) continue;
        if ((err = dt__plan_em_roles(world, 1, r, own, other))) return err;
        wf = own[0] > other[0] ? own[0] : other[0];
        wb = own[1] > other[1] ? own[1] : other[1];
        out->whole_fwd[kind] = wf;
        out->whole_bwd[kind] = wb;
        if ((err = dt_plan_dlrm_predict(ctx, out, &pl, &pr))) return err; /* unscaled yet: scale 0 = 1 */
        if (pr.fwd_s - xf > 0 && wf - xf > 0) out->scale_fwd[kind] = (wf - xf) / (pr.fwd_s - xf);
        if (pr.bwd_s - xb > 0 && wb - xb > 0) out->scale_bwd[kind] = (wb - xb) / (pr.bwd_s - xb);
        out->whole_peak[kind] = own[3] > other[3] ? own[3] : other[3];
        if (pr.mem_transient > 0 && out->whole_peak[kind] > 0) out->scale_peak[kind] = out->whole_peak[kind] / pr.mem_transient;
    }
    { /* dt_embed's own plan mixes kinds (table-wise beside data-parallel tables, say), and what its
         buffers hold is not the sum of its kinds' (np 2: 1.6 MB over it, 4%): its transient, measured
         whole above, over what the kinds' scales make of it, applies when that plan is predicted */
        dt_plan_dlrm_plan pl;
        dt_plan_dlrm_prediction pr;
        memset(&pl, 0, sizeof pl);
        pl.n_tables = desc->n_tables;
        for (t = 0; t < desc->n_tables; t++) { pl.kind[t] = out->auto_kind[t]; pl.owner[t] = out->auto_owner[t]; }
        if (dt_plan_dlrm_predict(ctx, out, &pl, &pr) != DT_OK) /* a kind of it not measured alone: no scale */
            dt_ctx_clear_error(ctx);
        else if (pr.mem_transient > 0 && out->whole_peak[DT_SHARD_AUTO] > 0)
            out->scale_peak[DT_SHARD_AUTO] = out->whole_peak[DT_SHARD_AUTO] / pr.mem_transient;
    }
    return DT_OK;
}

DT_API dt_status dt_plan_dlrm_measure(dt_comm *world, const dt_plan_dlrm_desc *desc, dt_plan_dlrm_profile *out) {
    static const char *fn = "dt_plan_dlrm_measure";
    dt_ctx *ctx = dt_comm_ctx(world);
    dt__plan_batches bs;
    double t0 = dt_comm_now();
    int W, t;
    dt_status err;
    struct utsname un;
    if (!world || !desc || !out)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, !world ? "world" : !desc ? "desc" : "out");
    if (!desc->tables || desc->n_tables < 1 || desc->n_tables > DT_PLAN_MAX_TABLES)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.n_tables = %d with tables %s; expected 1 .. %d tables", fn,
                                desc->n_tables, desc->tables ? "set" : "NULL", DT_PLAN_MAX_TABLES);
    if (desc->get_batch ? desc->n_batches < 1 || desc->n_batches > DT_PLAN_MAX_BATCHES : !desc->batch)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.batch %s, desc.get_batch %s, desc.n_batches = %d; expected a "
                                "batch, or get_batch with 1 .. %d batches", fn, desc->batch ? "set" : "NULL",
                                desc->get_batch ? "set" : "NULL", desc->n_batches, DT_PLAN_MAX_BATCHES);
    if (desc->global_batch < 1 || desc->repeats < 0 || desc->repeats > 15)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.global_batch = %lld, desc.repeats = %d; expected >= 1 and "
                                "0 .. 15", fn, (long long)desc->global_batch, desc->repeats);
    W = dt_comm_size(world);
    memset(out, 0, sizeof *out);
    out->world = W;
    out->hosts = dt_comm_hosts(world);
    out->n_tables = desc->n_tables;
    out->batch = desc->global_batch;
    snprintf(out->machine, sizeof out->machine, "%.60s, %ld cores", uname(&un) == 0 ? un.nodename : "?",
             sysconf(_SC_NPROCESSORS_ONLN));
    for (t = 0; t < desc->n_tables; t++) out->dim_total += desc->tables[t].dim;
    { /* table-row's groups: the ranks of a host, when hosts hold equal numbers and there are several */
        int g = dt_comm_ranks_per_host(world);
        out->group = out->hosts > 1 && g > 1 && g < W && W % g == 0 ? g : 0;
    }
    { /* the dense step's memory: what the caller holds, and its first call's peak above that (it
         makes what it keeps: activations, buffers) */
        double v[2] = {(double)ctx->bytes_in_use, 0};
        dt_reset_peak_bytes(ctx);
        if (desc->dense && (err = desc->dense(desc->user))) return err;
        if ((err = dt_ctx_sync(ctx))) return err;
        v[1] = (double)dt_peak_bytes(ctx) - v[0];
        if ((err = dt_comm_allreduce_f64(world, v, 2, DT_REDUCE_MAX))) return err;
        out->base_bytes = v[0];
        out->dense_peak = v[1];
    }
    { /* the batches: a bad one on any rank fails every rank (before anything collective uses them) */
        double bad;
        err = dt__plan_batches_get(ctx, fn, desc, &bs);
        bad = err ? 1 : 0;
        if (dt_comm_allreduce_f64(world, &bad, 1, DT_REDUCE_MAX) && !err) err = DT_ERR_COMM;
        if (!err && bad > 0) err = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: another rank's batches are bad", fn);
    }
    if (!err) err = dt__plan_dlrm_measure(world, desc, out, &bs);
    dt__plan_batches_free(ctx, &bs);
    if (err) return err;
    out->measure_s = dt_comm_now() - t0;
    {   /* every rank plans from rank 0's figures */
        dt_tensor tb;
        dt_tensor_desc d;
        memset(&d, 0, sizeof d);
        d.dtype = DT_U8;
        d.shape[0] = (int64_t)sizeof *out;
        if ((err = dt_tensor_create(ctx, &tb, &d))) return err;
        memcpy(tb.data, out, sizeof *out);
        err = dt_comm_broadcast(world, &tb, 0);
        if (!err) memcpy(out, tb.data, sizeof *out);
        dt_tensor_free(ctx, &tb);
    }
    return err;
}

DT_API dt_status dt_plan_dlrm_plan_of(const dt_embed *e, int n_tables, const char *name, dt_plan_dlrm_plan *out) {
    int t;
    if (!e || !out || n_tables < 1 || n_tables > DT_PLAN_MAX_TABLES) return DT_ERR_ARG;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", name ? name : "");
    out->n_tables = n_tables;
    for (t = 0; t < n_tables; t++) out->kind[t] = dt_embed_table_sharding(e, t, &out->owner[t]);
    return DT_OK;
}

/* A table's figure on rank r under its plan: role 0 holds it, 1 asks */
static int dt__plan_role(const dt_plan_dlrm_profile *p, const dt_plan_dlrm_plan *pl, int t, int r) {
    if (pl->kind[t] == DT_SHARD_TABLE) return r == pl->owner[t] ? 0 : 1;
    if (pl->kind[t] == DT_SHARD_TABLE_ROW) return r >= pl->owner[t] && r < pl->owner[t] + p->group ? 0 : 1;
    return 0;
}

DT_API dt_status dt_plan_dlrm_predict(dt_ctx *ctx, const dt_plan_dlrm_profile *p, const dt_plan_dlrm_plan *plan,
                                      dt_plan_dlrm_prediction *out) {
    static const char *fn = "dt_plan_dlrm_predict";
    int t, r, W, xf = 0, xb = 0, same;
    double fmax = 0, bmax = 0, sum = 0, wmax = -1;
    if (!p || !plan || !out)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, !p ? "p" : !plan ? "plan" : "out");
    W = p->world;
    if (W < 1 || p->n_tables < 1 || p->n_tables > DT_PLAN_MAX_TABLES || p->batch < 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: p: world %d, n_tables %d, batch %lld; expected a measured profile",
                                fn, W, p->n_tables, (long long)p->batch);
    if (plan->n_tables != p->n_tables)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: plan.n_tables = %d; expected the profile's %d", fn, plan->n_tables,
                                p->n_tables);
    for (t = 0; t < p->n_tables; t++) {
        dt_embed_sharding k = plan->kind[t];
        if (k < DT_SHARD_TABLE || k >= DT_SHARD_COUNT || !p->cost[t][k].ok)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: plan.kind[%d] = %d (%s); expected a kind measured for this "
                                    "table", fn, t, (int)k, k > 0 && k < DT_SHARD_COUNT ? dt_embed_sharding_name(k) : "?");
        if ((k == DT_SHARD_TABLE && (plan->owner[t] < 0 || plan->owner[t] >= W)) ||
            (k == DT_SHARD_TABLE_ROW && (p->group < 1 || plan->owner[t] < 0 || plan->owner[t] % p->group ||
                                        plan->owner[t] >= W)))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: plan.owner[%d] = %d; expected %s", fn, t, plan->owner[t],
                                    k == DT_SHARD_TABLE ? "a rank of the world" : "a group's first rank");
        if (W > 1) { xb = 1; if (k != DT_SHARD_DATA) xf = 1; }
    }
    memset(out, 0, sizeof *out);
    out->plan = *plan;
    same = p->scale_peak[DT_SHARD_AUTO] > 0; /* dt_embed's own plan: its measured transient */
    for (t = 0; same && t < p->n_tables; t++)
        same = plan->kind[t] == p->auto_kind[t] &&
               ((plan->kind[t] != DT_SHARD_TABLE && plan->kind[t] != DT_SHARD_TABLE_ROW) || plan->owner[t] == p->auto_owner[t]);
    for (r = 0; r < W; r++) {
        double f = 0, b = 0, bytes = p->x_bytes, pk = 0;
        for (t = 0; t < p->n_tables; t++) {
            const dt_plan_table_cost *c = &p->cost[t][plan->kind[t]];
            int role = dt__plan_role(p, plan, t, r);
            double sf = p->scale_fwd[plan->kind[t]] > 0 ? p->scale_fwd[plan->kind[t]] : 1;
            double sb = p->scale_bwd[plan->kind[t]] > 0 ? p->scale_bwd[plan->kind[t]] : 1;
            f += sf * c->fwd[role]; b += sb * c->bwd[role];
            bytes += c->bytes[role];
            pk += (p->scale_peak[plan->kind[t]] > 0 ? p->scale_peak[plan->kind[t]] : 1) * c->peak[role];
        }
        if (same) pk *= p->scale_peak[DT_SHARD_AUTO];
        if (f > fmax) fmax = f;
        if (b > bmax) bmax = b;
        if (f + b > wmax) { wmax = f + b; out->busiest = r; }
        sum += f + b;
        if (bytes + pk > out->mem_tables + out->mem_transient) { out->mem_tables = bytes; out->mem_transient = pk; }
    }
    out->exchange_s = (xf ? p->x_fwd : 0) + (xb ? p->x_bwd : 0);
    out->fwd_s = fmax + (xf ? p->x_fwd : 0);
    out->bwd_s = bmax + (xb ? p->x_bwd : 0);
    out->imbalance_s = fmax + bmax - sum / W;
    out->dense_s = p->dense_s;
    out->step_s = p->dense_s + out->fwd_s + out->bwd_s;
    out->samples_per_s = out->step_s > 0 ? (double)p->batch / out->step_s : 0;
    out->mem_base = p->base_bytes;
    out->mem_dense = p->dense_peak;
    out->mem_total = out->mem_base + out->mem_dense + out->mem_tables + out->mem_transient;
    return DT_OK;
}

static int dt__plan_dlrm_better(const dt_plan_dlrm_prediction *a, const dt_plan_dlrm_prediction *b) {
    if (a->step_s != b->step_s) return a->step_s < b->step_s;
    return a->mem_total < b->mem_total;
}

/* The search's order: less memory past the budget first, then a step faster by more than 0.1% (less
   is the timings' noise: on one rank every kind is the same local path) */
static int dt__plan_dlrm_move_better(const dt_plan_dlrm_prediction *a, const dt_plan_dlrm_prediction *b, double budget) {
    double ea = budget > 0 && a->mem_total > budget ? a->mem_total - budget : 0;
    double eb = budget > 0 && b->mem_total > budget ? b->mem_total - budget : 0;
    if (ea != eb) return ea < eb;
    return a->step_s < b->step_s - 1e-3 * b->step_s;
}

/* keeps out[0 .. *n) best first, at most max; a plan already there (same kinds and owners) is not added twice */
static void dt__plan_dlrm_insert(const dt_plan_dlrm_profile *p, dt_plan_dlrm_prediction *out, int max, int *n,
                                 const dt_plan_dlrm_prediction *pr) {
    int i, t;
    for (i = 0; i < *n; i++) {
        for (t = 0; t < p->n_tables; t++)
            if (out[i].plan.kind[t] != pr->plan.kind[t] ||
                ((pr->plan.kind[t] == DT_SHARD_TABLE || pr->plan.kind[t] == DT_SHARD_TABLE_ROW) &&
                 out[i].plan.owner[t] != pr->plan.owner[t]))
                break;
        if (t == p->n_tables) return;
    }
    if (*n == max && !dt__plan_dlrm_better(pr, &out[max - 1])) return;
    i = *n < max ? (*n)++ : max - 1;
    for (; i > 0 && dt__plan_dlrm_better(pr, &out[i - 1]); i--) out[i] = out[i - 1];
    out[i] = *pr;
}

DT_API dt_status dt_plan_dlrm_search(dt_ctx *ctx, const dt_plan_dlrm_profile *p, double mem_budget,
                                     dt_plan_dlrm_prediction *out, int max, int *count) {
    static const char *fn = "dt_plan_dlrm_search";
    dt_plan_dlrm_plan pl, best;
    dt_plan_dlrm_prediction pr, bp;
    int kind, t, r, n = 0, W, pass, have = 0;
    dt_status err;
    memset(&bp, 0, sizeof bp);
    memset(&best, 0, sizeof best);
    if (!p || !out || !count || max < 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: p, out and count must not be NULL, max >= 1 (max = %d)", fn, max);
    if (!(mem_budget >= 0))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: mem_budget = %g; expected bytes >= 0 (0: no limit)", fn, mem_budget);
    *count = 0;
    W = p->world;
    if (W < 1 || p->n_tables < 1 || p->n_tables > DT_PLAN_MAX_TABLES)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: p: world %d, n_tables %d; expected a measured profile", fn, W,
                                p->n_tables);
#define DT__PLAN_TRY_PLAN(plan_) do { \
        err = dt_plan_dlrm_predict(ctx, p, (plan_), &pr); \
        if (err == DT_ERR_ARG) dt_ctx_clear_error(ctx); \
        else if (err) return err; \
        else { \
            if (!(mem_budget > 0 && pr.mem_total > mem_budget)) dt__plan_dlrm_insert(p, out, max, &n, &pr); \
            if (!have || dt__plan_dlrm_move_better(&pr, &bp, mem_budget)) { bp = pr; best = pr.plan; have = 1; } \
        } \
    } while (0)
    /* dt_embed's own plan */
    memset(&pl, 0, sizeof pl);
    snprintf(pl.name, sizeof pl.name, "auto");
    pl.n_tables = p->n_tables;
    for (t = 0; t < p->n_tables; t++) { pl.kind[t] = p->auto_kind[t]; pl.owner[t] = p->auto_owner[t]; }
    DT__PLAN_TRY_PLAN(&pl);
    /* one kind for every table */
    for (kind = DT_SHARD_TABLE; kind < DT_SHARD_COUNT; kind++) {
        if ((err = dt__plan_uniform(ctx, p, kind, &pl))) return err;
        DT__PLAN_TRY_PLAN(&pl);
    }
    if (!have) { *count = 0; return DT_OK; } /* no kind measured for every table */
    /* the search: from the best so far (or the one past the budget by least), move one table at a
       time to the kind and owner that gains most (memory past the budget, then time), until no
       move does */
    pl = best;
    snprintf(pl.name, sizeof pl.name, "searched");
    for (pass = 0; pass < 8; pass++) {
        int moved = 0;
        for (t = 0; t < p->n_tables; t++) {
            dt_embed_sharding k0 = pl.kind[t];
            int o0 = pl.owner[t], bk = k0, bo = o0;
            dt_plan_dlrm_prediction bs;
            if ((err = dt_plan_dlrm_predict(ctx, p, &pl, &bs))) return err;
            for (kind = DT_SHARD_TABLE; kind < DT_SHARD_COUNT; kind++) {
                int step = kind == DT_SHARD_TABLE ? 1 : kind == DT_SHARD_TABLE_ROW ? (p->group > 0 ? p->group : W) : W;
                if (!p->cost[t][kind].ok) continue;
                for (r = 0; r < W; r += step) {
                    pl.kind[t] = (dt_embed_sharding)kind;
                    pl.owner[t] = r;
                    err = dt_plan_dlrm_predict(ctx, p, &pl, &pr);
                    if (err == DT_ERR_ARG) { dt_ctx_clear_error(ctx); continue; }
                    if (err) return err;
                    if (dt__plan_dlrm_move_better(&pr, &bs, mem_budget)) { bs = pr; bk = kind; bo = r; }
                }
            }
            pl.kind[t] = (dt_embed_sharding)bk;
            pl.owner[t] = bo;
            if (bk != (int)k0 || bo != o0) moved = 1;
        }
        if (!moved) break;
    }
    for (t = 0; t < p->n_tables; t++) /* owners mean nothing for the other kinds */
        if (pl.kind[t] != DT_SHARD_TABLE && pl.kind[t] != DT_SHARD_TABLE_ROW) pl.owner[t] = 0;
    DT__PLAN_TRY_PLAN(&pl);
#undef DT__PLAN_TRY_PLAN
    *count = n;
    return DT_OK;
}

DT_API void dt_plan_dlrm_format(const dt_plan_dlrm_prediction *pr, int n, dt_strbuf *out) {
    int i, t;
    if (!out) return;
    dt_strbuf_printf(out, "%-4s %-10s %11s %9s %9s %9s %9s %9s %9s %10s\n", "rank", "plan", "samples/s", "step ms",
                     "dense", "emb fwd", "emb bwd", "exchange", "imbalance", "memory MB");
    for (i = 0; i < n; i++)
        dt_strbuf_printf(out, "%-4d %-10s %11.0f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %10.2f\n", i + 1, pr[i].plan.name,
                         pr[i].samples_per_s, pr[i].step_s * 1e3, pr[i].dense_s * 1e3, pr[i].fwd_s * 1e3,
                         pr[i].bwd_s * 1e3, pr[i].exchange_s * 1e3, pr[i].imbalance_s * 1e3, pr[i].mem_total / 1e6);
    if (n < 1) return;
    dt_strbuf_printf(out, "first-ranked (%s):", pr[0].plan.name);
    for (t = 0; t < pr[0].plan.n_tables && t < DT_PLAN_MAX_TABLES; t++) {
        dt_embed_sharding k = pr[0].plan.kind[t];
        if (k == DT_SHARD_TABLE || k == DT_SHARD_TABLE_ROW)
            dt_strbuf_printf(out, " %d:%s@%d", t, dt_embed_sharding_name(k), pr[0].plan.owner[t]);
        else dt_strbuf_printf(out, " %d:%s", t, dt_embed_sharding_name(k));
    }
    dt_strbuf_printf(out, "\n");
}

/* ---- the DLRM profile as JSON ---- */

#define DT__PLAN_DLRM_SCALARS(X) \
    X(dense_s) X(base_bytes) X(dense_peak) X(x_fwd) X(x_bwd) X(x_bytes) X(measure_s)
#define DT__PLAN_DLRM_KIND_ARRAYS(X) \
    X(whole_fwd) X(whole_bwd) X(whole_peak) X(scale_fwd) X(scale_bwd) X(scale_peak)
#define DT__PLAN_COST_PAIRS(X) X(fwd) X(bwd) X(bytes) X(peak)

DT_API dt_status dt_plan_dlrm_profile_save(dt_ctx *ctx, const dt_plan_dlrm_profile *p, const char *path) {
    dt_strbuf b;
    int t, k;
    if (!p || !path) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_plan_dlrm_profile_save: %s is NULL", p ? "path" : "p");
    if (p->n_tables < 1 || p->n_tables > DT_PLAN_MAX_TABLES)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_plan_dlrm_profile_save: p->n_tables = %d, expected 1 .. %d",
                                p->n_tables, DT_PLAN_MAX_TABLES);
    memset(&b, 0, sizeof b);
    b.ctx = ctx;
    dt_strbuf_str(&b, "{\"dt_plan_dlrm_profile\": 1, \"machine\": ");
    dt_strbuf_json(&b, p->machine);
    dt_strbuf_printf(&b, ", \"world\": %d, \"hosts\": %d, \"group\": %d, \"n_tables\": %d, \"dim_total\": %d, "
                     "\"batch\": %lld", p->world, p->hosts, p->group, p->n_tables, p->dim_total, (long long)p->batch);
#define DT__PLAN_W(f) dt_strbuf_printf(&b, ", \"" #f "\": %.17g", p->f);
    DT__PLAN_DLRM_SCALARS(DT__PLAN_W)
#undef DT__PLAN_W
    dt_strbuf_str(&b, ",\n \"kinds\": [");
    for (k = 0; k < DT_SHARD_COUNT; k++)
        dt_strbuf_printf(&b, "%s\"%s\"", k ? ", " : "", dt_embed_sharding_name((dt_embed_sharding)k));
    dt_strbuf_str(&b, "]");
#define DT__PLAN_W(f) \
    for (k = 0; k < DT_SHARD_COUNT; k++) dt_strbuf_printf(&b, "%s%.17g", k ? ", " : ",\n \"" #f "\": [", p->f[k]); \
    dt_strbuf_str(&b, "]");
    DT__PLAN_DLRM_KIND_ARRAYS(DT__PLAN_W)
#undef DT__PLAN_W
    dt_strbuf_str(&b, ",\n \"tables\": [");
    for (t = 0; t < p->n_tables; t++) {
        dt_strbuf_printf(&b, "%s\n  {\"auto_kind\": \"%s\", \"auto_owner\": %d, \"cost\": [", t ? "," : "",
                         dt_embed_sharding_name(p->auto_kind[t]), p->auto_owner[t]);
        for (k = 0; k < DT_SHARD_COUNT; k++) {
            const dt_plan_table_cost *c = &p->cost[t][k];
            dt_strbuf_printf(&b, "%s{\"ok\": %d", k ? ", " : "", c->ok);
#define DT__PLAN_W(f) dt_strbuf_printf(&b, ", \"" #f "\": [%.17g, %.17g]", c->f[0], c->f[1]);
            DT__PLAN_COST_PAIRS(DT__PLAN_W)
#undef DT__PLAN_W
            dt_strbuf_str(&b, "}");
        }
        dt_strbuf_str(&b, "]}");
    }
    dt_strbuf_str(&b, "]}\n");
    return dt__plan_write(ctx, "dt_plan_dlrm_profile_save", path, &b);
}

/* a kind by its dt_embed_sharding_name; -1 when none is */
static int dt__plan_kind_of(const dt_json *j) {
    int k;
    for (k = 0; j && j->type == DT_JSON_STRING && k < DT_SHARD_COUNT; k++)
        if (!strcmp(j->string, dt_embed_sharding_name((dt_embed_sharding)k))) return k;
    return -1;
}

/* an array of n numbers in [0, hi] (n = 1: a number) */
static dt_status dt__plan_nums(dt_ctx *ctx, const char *fn, const char *path, const dt_json *obj, const char *where,
                               const char *key, int n, double hi, double *out) {
    const dt_json *j = dt_json_get(obj, key);
    char v[48];
    int i;
    if (n == 1) {
        if (!j || j->type != DT_JSON_NUMBER || !(j->number >= 0 && j->number <= hi))
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: %s%s = %s, expected a number in [0, %g]", fn, path,
                                    where, key, dt__plan_jval(j, v), hi);
        out[0] = j->number;
        return DT_OK;
    }
    if (!j || j->type != DT_JSON_ARRAY || j->count != n)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: %s%s: expected an array of %d numbers", fn, path, where, key, n);
    for (i = 0; i < n; i++) {
        if (j->items[i].type != DT_JSON_NUMBER || !(j->items[i].number >= 0 && j->items[i].number <= hi))
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: %s%s[%d] = %s, expected a number in [0, %g]", fn, path,
                                    where, key, i, dt__plan_jval(&j->items[i], v), hi);
        out[i] = j->items[i].number;
    }
    return DT_OK;
}

/* an integer field in [lo, hi] */
static dt_status dt__plan_int(dt_ctx *ctx, const char *fn, const char *path, const dt_json *obj, const char *where,
                              const char *key, double lo, double hi, double *out) {
    const dt_json *j = dt_json_get(obj, key);
    char v[48];
    if (!j || j->type != DT_JSON_NUMBER || !(j->number >= lo && j->number <= hi) || j->number != floor(j->number))
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: %s%s = %s, expected an integer in [%g, %g]", fn, path,
                                where, key, dt__plan_jval(j, v), lo, hi);
    *out = j->number;
    return DT_OK;
}

DT_API dt_status dt_plan_dlrm_profile_load(dt_ctx *ctx, dt_plan_dlrm_profile *p, const char *path) {
    static const char *fn = "dt_plan_dlrm_profile_load";
    dt_json *root = NULL;
    const dt_json *j, *arr;
    dt_status err;
    double v;
    char where[48];
    int t, k;
    if (!p || !path) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, p ? "path" : "p");
    memset(p, 0, sizeof *p);
    if ((err = dt__plan_read_json(ctx, fn, path, 16L << 20, &root))) return err;
#define DT__PLAN_GI(obj, w, key, lo, hi, dst) \
    do { if ((err = dt__plan_int(ctx, fn, path, obj, w, key, lo, hi, &v))) goto done; dst = v; } while (0)
    if (root->type != DT_JSON_OBJECT || !dt_json_get(root, "dt_plan_dlrm_profile")) {
        err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: not a dt_plan DLRM profile (no \"dt_plan_dlrm_profile\" key)",
                               fn, path);
        goto done;
    }
    j = dt_json_get(root, "machine");
    if (j && j->type == DT_JSON_STRING) snprintf(p->machine, sizeof p->machine, "%s", j->string);
    DT__PLAN_GI(root, "", "world", 1, 1 << 20, p->world);
    DT__PLAN_GI(root, "", "hosts", 1, 1 << 20, p->hosts);
    DT__PLAN_GI(root, "", "group", 0, 1 << 20, p->group);
    DT__PLAN_GI(root, "", "n_tables", 1, DT_PLAN_MAX_TABLES, p->n_tables);
    DT__PLAN_GI(root, "", "dim_total", 0, 1 << 30, p->dim_total);
    DT__PLAN_GI(root, "", "batch", 1, 1099511627776.0, p->batch);
#define DT__PLAN_R(f) if ((err = dt__plan_nums(ctx, fn, path, root, "", #f, 1, 1e18, &p->f))) goto done;
    DT__PLAN_DLRM_SCALARS(DT__PLAN_R)
#undef DT__PLAN_R
    arr = dt_json_get(root, "kinds"); /* the file's kinds are this build's, in order */
    for (k = 0; arr && arr->type == DT_JSON_ARRAY && arr->count == DT_SHARD_COUNT && k < DT_SHARD_COUNT; k++)
        if (arr->items[k].type != DT_JSON_STRING ||
            strcmp(arr->items[k].string, dt_embed_sharding_name((dt_embed_sharding)k)))
            break;
    if (k != DT_SHARD_COUNT) {
        err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: kinds: expected the %d dt_embed_sharding names in order (a "
                               "file from another dt_embed: measure again)", fn, path, DT_SHARD_COUNT);
        goto done;
    }
#define DT__PLAN_R(f) if ((err = dt__plan_nums(ctx, fn, path, root, "", #f, DT_SHARD_COUNT, 1e18, p->f))) goto done;
    DT__PLAN_DLRM_KIND_ARRAYS(DT__PLAN_R)
#undef DT__PLAN_R
    arr = dt_json_get(root, "tables");
    if (!arr || arr->type != DT_JSON_ARRAY || arr->count != p->n_tables) {
        err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: tables: expected an array of n_tables = %d", fn, path,
                               p->n_tables);
        goto done;
    }
    for (t = 0; t < p->n_tables; t++) {
        const dt_json *o = &arr->items[t], *cost = dt_json_get(o, "cost");
        snprintf(where, sizeof where, "tables[%d].", t);
        if ((k = dt__plan_kind_of(dt_json_get(o, "auto_kind"))) < DT_SHARD_TABLE) {
            err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: %sauto_kind: expected table, row, column, data or "
                                   "table-row", fn, path, where);
            goto done;
        }
        p->auto_kind[t] = (dt_embed_sharding)k;
        DT__PLAN_GI(o, where, "auto_owner", -1, p->world - 1, p->auto_owner[t]); /* -1: no owner */
        if (!cost || cost->type != DT_JSON_ARRAY || cost->count != DT_SHARD_COUNT) {
            err = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: %scost: expected an array of %d", fn, path, where,
                                   DT_SHARD_COUNT);
            goto done;
        }
        for (k = 0; k < DT_SHARD_COUNT; k++) {
            const dt_json *c = &cost->items[k];
            dt_plan_table_cost *tc = &p->cost[t][k];
            snprintf(where, sizeof where, "tables[%d].cost[%d].", t, k);
            DT__PLAN_GI(c, where, "ok", 0, 1, tc->ok);
#define DT__PLAN_R(f) if ((err = dt__plan_nums(ctx, fn, path, c, where, #f, 2, 1e18, tc->f))) goto done;
            DT__PLAN_COST_PAIRS(DT__PLAN_R)
#undef DT__PLAN_R
        }
    }
#undef DT__PLAN_GI
    err = DT_OK;
done:
    dt_json_free(ctx, root);
    if (err) memset(p, 0, sizeof *p);
    return err;
}

DT_API dt_status dt_plan_dlrm_profile_broadcast(dt_comm *c, dt_plan_dlrm_profile *p, int root) {
    dt_ctx *ctx = dt_comm_ctx(c);
    if (!c || !p) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_plan_dlrm_profile_broadcast: %s is NULL", c ? "p" : "c");
    return dt__plan_bcast(c, p, sizeof *p, root);
}
#endif /* DT_EMBED_H */

#endif /* DT_PLAN_IMPLEMENTATION */

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
