/* dt_parallel.h - the dense half of hybrid parallelism for the dt toolkit: the process grid
   (dp x tp x pp), a flat parameter and gradient arena, data parallelism with bucketed gradient
   sync and ZeRO stages 1-3, Megatron tensor and sequence parallel layers, pipeline schedules,
   and a Chrome-trace timeline of compute and communication.            v0.1, MIT licence

   Do this:
       #define DT_PARALLEL_IMPLEMENTATION    (or DT_IMPLEMENTATION for every dt header)
   before you include this file in *one* C or C++ file to create the implementation.
   Include order: dt_tensor.h, dt_comm.h, dt_opt.h, dt_parallel.h.

   Compile-time options:
     in every file:
       DT_STATIC, DT_API   as in dt_tensor.h.
     in the implementation file only:
       DT_MPI              (seen by dt_comm.h) a grid over MPI ranks; without it the world is one
                           rank and every layout but 1 x 1 x 1 is a named error.

   API in one breath:
       grid           dt_layout_create / _free / _rank_of / _describe / _string
       batch          dt_layout_batch_range (which global samples this dp rank reads)
       arena          dt_arena_create / _free (one flat buffer per dtype for values, one for grads)
       data parallel  dt_zero_create / _free / _micro_begin / _gather / _release / _grad_ready /
                      _step / _memory / _checkpoint_save / _checkpoint_load   (stage 0 = DDP,
                      1-3 = ZeRO; the optimizer lives inside)
       tensor par.    dt_tp_allreduce, dt_sp_gather_rows / dt_sp_scatter_rows,
                      dt_tp_column_linear_fwd/_bwd, dt_tp_row_linear_fwd/_bwd,
                      dt_tp_embedding_fwd/_bwd, dt_tp_xent_fwd/_bwd
       pipeline       dt_pp_schedule_create / _free / _simulate / _format
       timeline       dt_trace_create / _free / _begin / _end / _attach / _write / _overlap

   The licence (MIT) is at the end of this file.
*/
#ifndef DT_PARALLEL_H
#define DT_PARALLEL_H

#if !defined(DT_TENSOR_H) || !defined(DT_COMM_H) || !defined(DT_OPT_H)
#error "dt_parallel.h needs dt_tensor.h, dt_comm.h and dt_opt.h included before it"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- the grid

   world = dp x tp x pp ranks in Megatron's order, tp innermost:
       rank = tp_rank + TP * (dp_rank + DP * pp_rank)
   so the ranks of a tensor-parallel group are neighbours (one host, the fastest links). */

typedef struct dt_layout_desc {
    int dp;   /* 0 = world size / (tp * pp) */
    int tp;   /* 0 = 1 */
    int pp;   /* 0 = 1 */
} dt_layout_desc;

/* Read the fields; every comm is non-NULL (a group of one where the size is 1). */
typedef struct dt_layout {
    dt_ctx *ctx;
    dt_comm *world;
    int size, rank;                /* of world */
    int dp, tp, pp;                /* resolved sizes, dp * tp * pp = size */
    int dp_rank, tp_rank, pp_rank; /* this rank's coordinates */
    dt_comm *dp_comm;    /* same (tp, pp), dp varies: gradient sync and ZeRO shards */
    dt_comm *tp_comm;    /* same (dp, pp), tp varies: tensor-parallel collectives */
    dt_comm *pp_comm;    /* same (dp, tp), pp varies: stage-to-stage send / recv (rank = pp_rank) */
    dt_comm *dptp_comm;  /* same pp: the dp x tp ranks of one stage (ZeRO shards of tp shards) */
} dt_layout;

/* Collective over world. Sizes that do not divide the world are DT_ERR_ARG naming them. */
DT_API dt_status dt_layout_create(dt_comm *world, dt_layout **out, const dt_layout_desc *desc);
DT_API void dt_layout_free(dt_layout *l);
/* World rank of the coordinates (-1 when one is out of range). */
DT_API int dt_layout_rank_of(const dt_layout *l, int dp_rank, int tp_rank, int pp_rank);
/* Collective over world: a picture of the grid (every rank's coordinates and host) into out. */
DT_API dt_status dt_layout_describe(dt_layout *l, dt_strbuf *out);
/* "dp=2,tp=2,pp=1" into buf (for dt_checkpoint_desc.layout); returns buf. */
DT_API const char *dt_layout_string(const dt_layout *l, char *buf, size_t n);
/* Samples [*first, *first + *count) of a global batch of `global_batch` samples are this dp rank's
   (a contiguous block; the global batch is the same at any dp). global_batch not divisible by dp
   is DT_ERR_ARG. */
DT_API dt_status dt_layout_batch_range(const dt_layout *l, int64_t global_batch, int64_t *first, int64_t *count);

/* ---------------------------------------------------------------- the arena

   llm.c's one contiguous block: the values of every parameter of a set live in one flat buffer
   per dtype, and every gradient in one f32 buffer, in registration order. Each dt_param's value
   and grad become views into them (owns = 0). Parameters are grouped into units (a transformer
   block, the embeddings, the head): the unit is what ZeRO-3 gathers and frees, and what the
   gradient sync launches as one piece. */

typedef struct dt_arena_desc {
    const int *units;  /* per ps item: its unit, non-decreasing from 0; NULL = one unit per parameter */
} dt_arena_desc;

typedef struct dt_arena {
    dt_ctx *ctx;
    dt_params *params;
    dt_tensor values[DT_DTYPE_COUNT]; /* flat value buffer of each dtype in use (data NULL if none) */
    dt_tensor grads;                  /* flat f32 gradient buffer */
    int64_t *value_offset;            /* per param: first element in values[its dtype] */
    int64_t *grad_offset;             /* per param: first element in grads */
    int *unit;                        /* per param */
    int n_units;
    int *unit_first;                  /* per unit: index of its first param; unit_first[n_units] = count */
} dt_arena;

/* Moves every parameter of ps into the arena (values kept). ps must not change afterwards. */
DT_API dt_status dt_arena_create(dt_ctx *ctx, dt_arena **out, dt_params *ps, const dt_arena_desc *desc);
/* Frees the buffers: the params' views then point nowhere; free the arena last. NULL is a no-op. */
DT_API void dt_arena_free(dt_arena *a);

/* ---------------------------------------------------------------- data parallel and ZeRO

   One object syncs gradients over the dp group and owns the optimizer:
     stage 0  DDP: grads all-reduced (averaged over dp) in buckets of whole units, launched by
              dt_zero_grad_ready during backward; the optimizer updates every full parameter.
     stage 1  optimizer state (and the f32 master of bf16/f16 values) sharded over dp: grads are
              reduce-scattered at the step, each rank updates its shard, parameters all-gathered.
     stage 2  as 1, and grads reduce-scattered per unit during backward; only the shard is kept.
     stage 3  as 2, and parameters sharded too (FSDP): dt_zero_gather brings a unit's full
              parameters before its forward and backward, dt_zero_release frees them, and the next
              unit's gather is prefetched while this one computes.
   Shards are whole rows (dim 0) of each tensor, FSDP2's per-parameter sharding: every shard is a
   box of its logical tensor, so dt_opt.h's checkpoints save and reshard them unchanged (a run at
   ZeRO-3 on 4 ranks resumes at ZeRO-0 on 1). */

typedef struct dt_zero_desc {
    int stage;                 /* 0..3 */
    int64_t bucket_bytes;      /* stage 0: 0 = 25 MB; units are never split */
    int prefetch;              /* stage 3: 0 = default (on), -1 = off */
    dt_opt_desc opt;           /* the optimizer; its comm and norm comms are filled in from the layout */
} dt_zero_desc;

typedef struct dt_zero dt_zero; /* opaque */

/* Memory of this rank, bytes: what it holds now and at its peak, and DeepSpeed's formula for the
   stage (16 psi baseline, 4 psi + 12 psi / N, 2 psi + 14 psi / N, 16 psi / N for mixed-precision
   Adam; the f32 analogues for f32 training) for comparison. */
typedef struct dt_zero_memory {
    int64_t psi;               /* parameters of the model replica this rank's stage holds a part of */
    size_t param_bytes, grad_bytes, master_bytes, state_bytes, total_bytes;
    double formula_bytes;      /* the stage's formula for psi and N = dp */
    const char *formula;       /* "4psi + 12psi/N", ... */
} dt_zero_memory;

DT_API dt_status dt_zero_create(dt_layout *l, dt_zero **out, dt_arena *a, const dt_zero_desc *desc);
DT_API void dt_zero_free(dt_zero *z);
DT_API dt_optimizer *dt_zero_optimizer(dt_zero *z);
/* As dt_opt_micro_begin: the backward seed for micro-step `micro`, and sync on the last one. */
DT_API dt_status dt_zero_micro_begin(dt_zero *z, float *dloss, int micro);
/* The model calls, every stage alike (no-ops where a stage has nothing to do):
       forward:   for u = 0 .. U-1:   dt_zero_gather(u); forward of u; dt_zero_release(u)
       backward:  dt_zero_backward_begin(); then for u = U-1 .. 0:
                  dt_zero_gather(u); backward of u; dt_zero_grad_ready(u); dt_zero_release(u)
   A unit may be gathered more than once (GPT's token embedding is also its output head).
   Stage 3: the unit's full parameters are present from dt_zero_gather to dt_zero_release (the
   next unit in the order of the calls is prefetched). Stages 2-3: after dt_zero_backward_begin,
   a unit's full-size grads exist (zeroed) from its first dt_zero_gather until dt_zero_grad_ready,
   which reduce-scatters them into this rank's shard (accumulating over micro-steps) and gives
   the buffer back. */
DT_API dt_status dt_zero_backward_begin(dt_zero *z);
DT_API dt_status dt_zero_gather(dt_zero *z, int unit);
DT_API dt_status dt_zero_release(dt_zero *z, int unit);
/* The unit's grads are final for this micro-step: stage 0 may launch its bucket's all-reduce,
   stages 2-3 its reduce-scatter. Calling it is optional (dt_zero_step syncs what is left). */
DT_API dt_status dt_zero_grad_ready(dt_zero *z, int unit);
/* Finishes the sync, steps the optimizer (clipping, loss scaling as dt_opt_step), all-gathers
   updated parameters (stages 1-2) and zeroes the grads for the next step. */
DT_API dt_status dt_zero_step(dt_zero *z, dt_opt_step_info *info);
DT_API dt_status dt_zero_memory_get(dt_zero *z, dt_zero_memory *out);
/* Checkpoints of the parameters and the (sharded) optimizer through dt_opt.h, collective over
   the world; desc.comm and desc.layout are filled in. */
DT_API dt_status dt_zero_checkpoint_save(dt_zero *z, const dt_train_state *state, const dt_checkpoint_desc *desc);
DT_API dt_status dt_zero_checkpoint_load(dt_zero *z, dt_train_state *state, const dt_checkpoint_desc *desc);

/* ---------------------------------------------------------------- tensor and sequence parallel

   Megatron-LM's layers over l->tp_comm. Activations are rows x features ([B, T, C] is B*T rows).
   Without sequence parallelism (sp = 0) the input of a column-parallel linear and the output of
   a row-parallel one are whole on every tp rank. With sp = 1 they are sharded by rows: tp rank
   k holds rows [k*N/tp, (k+1)*N/tp) (N rows divisible by tp), layernorm, dropout and residual
   run on that slice, the all-gather comes before the column-parallel linear and the
   reduce-scatter after the row-parallel one, replacing the all-reduces. Parameters used in the
   sharded region (layernorms, the row-parallel bias) then get partial grads on each tp rank:
   sum them with dt_tp_allreduce before the optimizer step (Megatron does the same). */

/* x = sum over tp of x, in place (Megatron's g forward and f backward). */
DT_API dt_status dt_tp_allreduce(dt_layout *l, dt_tensor *x);
/* full [N, C] = the row shards [N/tp, C] of every tp rank, in rank order. */
DT_API dt_status dt_sp_gather_rows(dt_layout *l, dt_tensor *full, const dt_tensor *shard);
/* shard [N/tp, C] = this rank's rows of the sum over tp of full [N, C]. */
DT_API dt_status dt_sp_scatter_rows(dt_layout *l, dt_tensor *shard, const dt_tensor *full);

/* Column-parallel linear: w [O/tp, I] and bias [O/tp] are this rank's rows of the [O, I] weight;
   out [N, O/tp] = x_all @ w^T + bias, with x_all = x (sp 0, x [N, I]) or the gathered rows of x
   (sp 1, x [N/tp, I]; x_all is written into xbuf [N, I], kept for the backward).
   bwd: dw += dout^T x_all, dbias += colsum(dout), dx += (dout @ w) summed over tp (sp 0: all-reduce,
   sp 1: reduce-scatter into the row shard; dxbuf [N, I] is the scratch of the sum). */
DT_API dt_status dt_tp_column_linear_fwd(dt_layout *l, dt_tensor *out, dt_tensor *xbuf, const dt_tensor *x,
                                         const dt_tensor *w, const dt_tensor *bias, int sp);
DT_API dt_status dt_tp_column_linear_bwd(dt_layout *l, dt_tensor *dx, dt_tensor *dw, dt_tensor *dbias,
                                         dt_tensor *dxbuf, const dt_tensor *dout, const dt_tensor *xbuf_or_x,
                                         const dt_tensor *w, int sp);
/* Row-parallel linear: w [O, I/tp] is this rank's columns, bias [O] whole (added after the sum);
   x [N, I/tp]; partial [N, O] = x @ w^T (scratch); out = sum over tp of partial + bias: [N, O]
   (sp 0, all-reduce) or this rank's rows [N/tp, O] (sp 1, reduce-scatter).
   bwd: dout is [N, O] (sp 0) or [N/tp, O] (sp 1, gathered into doutbuf [N, O]);
   dx += dout_all @ w, dw += dout_all^T x, dbias += colsum(dout) (the local rows under sp 1). */
DT_API dt_status dt_tp_row_linear_fwd(dt_layout *l, dt_tensor *out, dt_tensor *partial, const dt_tensor *x,
                                      const dt_tensor *w, const dt_tensor *bias, int sp);
DT_API dt_status dt_tp_row_linear_bwd(dt_layout *l, dt_tensor *dx, dt_tensor *dw, dt_tensor *dbias,
                                      dt_tensor *doutbuf, const dt_tensor *dout, const dt_tensor *x,
                                      const dt_tensor *w, int sp);
/* Vocab-parallel embedding: table [V/tp, C] holds rows [vocab_start, vocab_start + V/tp) of the
   [V, C] table; ids i32 [N] global; out = sum over tp of the local lookups (ids outside the
   range give 0): [N, C] (sp 0) or this rank's rows [N/tp, C] (sp 1; partial [N, C] scratch).
   bwd: dtable[id - vocab_start] += dout_all[n] for the ids in range (sp 1: dout gathered into
   doutbuf [N, C]). An id outside [0, vocab) is DT_ERR_RANGE. */
DT_API dt_status dt_tp_embedding_fwd(dt_layout *l, dt_tensor *out, dt_tensor *partial, const dt_tensor *table,
                                     const dt_tensor *ids, int64_t vocab_start, int64_t vocab, int sp);
DT_API dt_status dt_tp_embedding_bwd(dt_layout *l, dt_tensor *dtable, dt_tensor *doutbuf, const dt_tensor *dout,
                                     const dt_tensor *ids, int64_t vocab_start, int64_t vocab, int sp);
/* Vocab-parallel cross entropy: logits [N, Vp/tp] are this rank's columns [vocab_start, ...) of
   the [N, Vp] logits (Vp >= vocab: columns >= vocab are padding and ignored, as llm.c pads its
   vocab); targets i32 [N], ignore_index skipped. Three all-reduces over tp (row max, target
   logit, sum of exp); the full logits are never gathered. stats [N, 2] f32 keeps each row's max
   and log-sum-exp for the backward. *loss = mean over non-ignored targets, *n_valid their count.
   bwd: dlogits += dloss / n_valid * (softmax - onehot(target)) on this rank's columns. */
DT_API dt_status dt_tp_xent_fwd(dt_layout *l, float *loss, int64_t *n_valid, dt_tensor *stats,
                                const dt_tensor *logits, const dt_tensor *targets, int64_t vocab_start,
                                int64_t vocab, int ignore_index);
DT_API dt_status dt_tp_xent_bwd(dt_layout *l, dt_tensor *dlogits, const dt_tensor *logits, const dt_tensor *stats,
                                const dt_tensor *targets, int64_t vocab_start, int64_t vocab, int ignore_index,
                                float dloss);

/* ---------------------------------------------------------------- pipeline schedules

   A schedule is, per stage, the ordered list of actions that stage runs in one training step:
   forwards and backwards of (model chunk, micro-batch) pairs and the sends and receives they
   imply. The runtime executes the lists as they are; the simulator executes them too, with
   every stage in lock-step with its neighbours, and proves a schedule sound before it is run.

   Kinds (p stages, m micro-batches, v model chunks per stage):
     GPIPE        every forward, then every backward (Huang et al. 2019). m activations in flight.
     1F1B         PipeDream-Flush (Narayanan et al. 2021): stage s runs min(p-s-1, m) warm-up
                  forwards, then alternates one forward and one backward, then drains. At most
                  min(p-s, m) activations in flight on stage s. Same bubble as GPipe.
     INTERLEAVED  Megatron's interleaved 1F1B: stage s holds v chunks, chunk c is virtual stage
                  c*p + s of p*v, so a micro-batch goes round the stages v times and the bubble
                  shrinks by v. m must be a multiple of p (and so >= p).
     ZB_H1        Qi et al. 2023, "Zero Bubble Pipeline Parallelism", handcrafted schedule 1: the
                  backward split into BI (input gradient, on the critical path) and BW (weight
                  gradient, free to move); stage s delays its BW passes by s micro-batches so
                  they fill the cooldown bubble, with at most min(p, m) activations in flight on
                  any stage (1F1B's peak, the first stage's). Bubble (p-1)(F+BI-BW) instead of
                  1F1B's (p-1)(F+BI+BW).

   Actions. Every action names a micro-batch and a chunk of the stage that runs it (both from
   0); a compute action (F, B, BI, BW) has peer -1. A send names the compute that produced the
   message, a receive the compute that will consume it: on stage s, SEND_ACT(c, i) sends the
   output of F(c, i) (virtual stage k = c*p + s) to stage (s+1) % p, where virtual stage k + 1
   lives, and RECV_ACT(c, i) brings the input of F(c, i) from stage (s-1+p) % p; SEND_GRAD and
   RECV_GRAD carry the input gradient of B / BI back the other way. The first virtual stage
   receives no activation, the last no gradient; with one stage (p = 1) chunks hand over in
   memory and there are no messages. A runtime tags messages by (kind, virtual stage, micro).
   Order inside a list: the receives of each (kind, chunk) stream are posted recv_ahead messages
   ahead (the first ones at the very start, then one right after each compute that consumed
   one), a send comes right after the compute that produced it. So a runtime posts receives where
   they stand (irecv, never blocks) and waits for one at the compute that needs it; a send may
   be an isend waited before the buffer is reused.

   Simulator model (dt_pp_schedule_simulate): a receive is a post and never blocks; a send blocks
   until the peer has posted the matching receive (MPI's synchronous send against a preposted
   irecv: the strictest buffering, so a schedule that completes here completes under any);
   a compute blocks until its input (activation, gradient) has arrived. Compute costs come from
   dt_pp_sim_desc (per stage-worth of layers; a chunk costs 1/v of it), messages take `comm`.
   It fails, with a message naming what it found, on
     deadlock       no stage can go on: DT_ERR_STATE listing each stage's blocked action
     order          a backward before its forward, BW before BI, a send before the compute that
                    produced it, a compute whose input this stage never received: DT_ERR_STATE
     count          a (stage, chunk, micro) without exactly one F and one B (or one BI and one
                    BW; never B and BI together), a receive never matched: DT_ERR_STATE
     memory         activations in flight (forward done, its B or BW not yet) above the bound
                    the schedule was built with: DT_ERR_STATE
     fields         an op, chunk, micro-batch or peer out of range: DT_ERR_ARG */

typedef enum dt_pp_kind {
    DT_PP_DEFAULT = 0, /* = DT_PP_1F1B */
    DT_PP_GPIPE,
    DT_PP_1F1B,
    DT_PP_INTERLEAVED,
    DT_PP_ZB_H1,
    DT_PP_KIND_COUNT
} dt_pp_kind;

typedef enum dt_pp_op {
    DT_PP_NOP = 0,    /* never in a generated schedule (the simulator refuses it) */
    DT_PP_F,          /* forward */
    DT_PP_B,          /* full backward: input and weight gradients */
    DT_PP_BI,         /* input-gradient half of the backward (zero bubble) */
    DT_PP_BW,         /* weight-gradient half; frees the micro-batch's activations */
    DT_PP_SEND_ACT,
    DT_PP_RECV_ACT,
    DT_PP_SEND_GRAD,
    DT_PP_RECV_GRAD,
    DT_PP_OP_COUNT
} dt_pp_op;

typedef struct dt_pp_action {
    dt_pp_op op;
    int micro;  /* micro-batch, 0 .. m-1 */
    int chunk;  /* model chunk on this stage, 0 .. v-1 (virtual stage chunk * p + stage) */
    int peer;   /* the stage sent to / received from; -1 for compute */
} dt_pp_action;

typedef struct dt_pp_desc {
    dt_pp_kind kind;
    int stages;   /* p; 0 = 1 */
    int micro;    /* m, micro-batches per step; 0 = 1 */
    int chunks;   /* v, model chunks per stage; 0 = 1; > 1 only for INTERLEAVED */
    int n_layers; /* 0 = unknown; else p * v <= n_layers (every virtual stage needs a layer) */
    int recv_ahead; /* receives of a stream posted ahead of the compute that consumes them: 0 = 2
                       (1 is enough to be deadlock-free; 2 keeps a blocking send off the critical
                       path, so the timings are the papers'); each is a buffer the runtime holds */
} dt_pp_desc;

/* Compute costs for the simulator, per stage-worth of layers. Zero = default. */
typedef struct dt_pp_sim_desc {
    double f;     /* forward: 0 = 1 */
    double b;     /* full backward: 0 = 2 */
    double bi;    /* input-gradient half: 0 = b / 2 */
    double bw;    /* weight-gradient half: 0 = b - bi */
    double comm;  /* from a send's completion to the data's arrival: 0 = none */
} dt_pp_sim_desc;

/* Read the fields; actions[s][0 .. count[s]) is stage s's list (a test may edit the actions in
   place and lower a count, never raise it). The arrays the simulator fills (start, busy,
   stage_bubble, peak) hold its last run. Not thread-safe: simulate writes into the schedule. */
typedef struct dt_pp_schedule {
    dt_ctx *ctx;
    dt_pp_kind kind;          /* resolved: never DEFAULT */
    int stages, micro, chunks;
    int recv_ahead;           /* resolved */
    int *count;               /* per stage: number of actions */
    dt_pp_action **actions;   /* per stage: the actions in order */
    int *bound;               /* per stage: activations in flight the schedule never exceeds
                                 (in chunk-micro-batches: divide by chunks for stage-worths) */
    double **start;           /* per stage, per action: its start time in the last simulation */
    double *busy;             /* per stage: compute time in the last simulation */
    double *stage_bubble;     /* per stage: 1 - busy / makespan */
    int *peak;                /* per stage: most activations in flight in the last simulation */
} dt_pp_schedule;

/* What a simulation found. */
typedef struct dt_pp_stats {
    double makespan;        /* when the last stage finishes (every stage starts at 0) */
    double bubble;          /* idle fraction of all stages: 1 - sum(busy) / (p * makespan) */
    double bubble_formula;  /* the kind's closed form at these costs (comm not counted):
                               GPIPE, 1F1B (p-1)/(m+p-1); INTERLEAVED (p-1)/(v*m+p-1);
                               ZB_H1 (p-1)(F+BI-BW) / (m(F+BI+BW) + (p-1)(F+BI-BW)), which
                               the simulation meets for m >= p and BW <= BI (the handcrafted
                               order; fewer micro-batches or a heavier BW leave more bubble) */
    int peak_max, bound_max;/* the largest peak and bound over the stages */
} dt_pp_stats;

DT_API const char *dt_pp_kind_name(dt_pp_kind k); /* "gpipe", "1f1b", "interleaved", "zb-h1" */
DT_API const char *dt_pp_op_name(dt_pp_op op);    /* "F", "B", "BI", "BW", "SEND_ACT", ... */
/* Builds the lists. Bad values are DT_ERR_ARG naming the field, its value and what is expected. */
DT_API dt_status dt_pp_schedule_create(dt_ctx *ctx, dt_pp_schedule **out, const dt_pp_desc *desc);
DT_API void dt_pp_schedule_free(dt_pp_schedule *s);
/* Executes every stage's list (model above) and checks it; desc may be NULL (defaults). */
DT_API dt_status dt_pp_schedule_simulate(dt_pp_schedule *s, dt_pp_stats *out, const dt_pp_sim_desc *desc);
/* Simulates, then appends the table to out: one row per stage, one column per time slot (the
   smallest compute cost), as the papers draw them: "F3" starts the forward of micro-batch 3,
   "--" continues the op before it, "." is idle; with chunks > 1 a letter names the chunk
   ("F3a" chunk 0, "F3b" chunk 1). Sends and receives take no slot. */
DT_API dt_status dt_pp_schedule_format(dt_pp_schedule *s, dt_strbuf *out, const dt_pp_sim_desc *desc);

/* ---------------------------------------------------------------- timeline

   Spans of compute (dt_trace_begin / _end, nested) and every collective of the comms attached,
   per rank, written as one Chrome-trace JSON for all ranks (clocks aligned to rank 0's), which
   Perfetto and chrome://tracing open: one process per rank, one track for compute and one per
   comm. Every function takes a NULL trace and does nothing, so model code calls them always. */

typedef struct dt_trace dt_trace; /* opaque */

/* Collective over world. */
DT_API dt_status dt_trace_create(dt_comm *world, dt_trace **out);
DT_API void dt_trace_free(dt_trace *t);
DT_API void dt_trace_begin(dt_trace *t, const char *name); /* name: a string literal or one that outlives t */
DT_API void dt_trace_end(dt_trace *t);
/* Records every collective and send / recv of c from now on (post to completion). */
DT_API dt_status dt_trace_attach(dt_trace *t, dt_comm *c);
/* Collective over world: rank 0 writes every rank's events to path. */
DT_API dt_status dt_trace_write(dt_trace *t, const char *path);
/* This rank's time in collectives, and the part of it that overlapped a compute span. */
DT_API dt_status dt_trace_overlap(const dt_trace *t, double *comm_seconds, double *overlapped_seconds);

#ifdef __cplusplus
}
#endif
#endif /* DT_PARALLEL_H */

/* ================================================================ implementation */

#if defined(DT_IMPLEMENTATION) && !defined(DT_PARALLEL_IMPLEMENTATION)
#define DT_PARALLEL_IMPLEMENTATION
#endif

#ifdef DT_PARALLEL_IMPLEMENTATION
#ifndef DT_PARALLEL_IMPLEMENTATION_DONE
#define DT_PARALLEL_IMPLEMENTATION_DONE

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- grid (impl) */

/* ---------------------------------------------------------------- arena (impl) */

/* ---------------------------------------------------------------- ZeRO (impl) */

/* ---------------------------------------------------------------- tensor parallel (impl) */

/* ---------------------------------------------------------------- pipeline (impl) */

DT_API const char *dt_pp_kind_name(dt_pp_kind k) {
    switch (k) {
    case DT_PP_DEFAULT:
    case DT_PP_1F1B: return "1f1b";
    case DT_PP_GPIPE: return "gpipe";
    case DT_PP_INTERLEAVED: return "interleaved";
    case DT_PP_ZB_H1: return "zb-h1";
    default: return "?";
    }
}

DT_API const char *dt_pp_op_name(dt_pp_op op) {
    static const char *const names[DT_PP_OP_COUNT] = {"NOP",      "F",        "B",         "BI",       "BW",
                                                      "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD"};
    return (int)op >= 0 && op < DT_PP_OP_COUNT ? names[op] : "?";
}

static dt_pp_action dt__pp_act(dt_pp_op op, int chunk, int micro, int peer) {
    dt_pp_action a;
    a.op = op;
    a.micro = micro;
    a.chunk = chunk;
    a.peer = peer;
    return a;
}

/* Megatron's interleaved order: the k-th forward of a stage runs chunk (k mod pv) / p on
   micro-batch (k / pv) * p + k mod p, so p micro-batches go through chunk 0, then the same p
   through chunk 1, ...; backwards walk the chunks the other way. */
static dt_pp_action dt__pp_interleaved_op(int p, int v, int k, int forward) {
    int c = (k % (p * v)) / p, i = (k / (p * v)) * p + k % p;
    return forward ? dt__pp_act(DT_PP_F, c, i, -1) : dt__pp_act(DT_PP_B, v - 1 - c, i, -1);
}

/* The compute actions of stage st in order, into o (room for 3 * m * v); returns how many. */
static int dt__pp_compute_order(const dt_pp_schedule *s, int st, dt_pp_action *o) {
    int p = s->stages, m = s->micro, v = s->chunks, n = 0, i, nw, total, nextw = 0;
    switch (s->kind) {
    case DT_PP_GPIPE:
        for (i = 0; i < m; i++) o[n++] = dt__pp_act(DT_PP_F, 0, i, -1);
        for (i = 0; i < m; i++) o[n++] = dt__pp_act(DT_PP_B, 0, i, -1);
        break;
    case DT_PP_INTERLEAVED:
        if (v > 1) {
            /* warm-up: the forwards it takes for the first gradient to come back round.
               With 1F1B's p-s-1 in place of 2 (p-s-1) and receives posted one ahead, the sends
               of the stages wait on each other round the ring (the simulator finds it at p 3,
               m 6, v 2). */
            total = m * v;
            nw = 2 * (p - st - 1) + (v - 1) * p;
            if (nw > total) nw = total;
            for (i = 0; i < nw; i++) o[n++] = dt__pp_interleaved_op(p, v, i, 1);
            for (i = 0; i < total - nw; i++) {
                o[n++] = dt__pp_interleaved_op(p, v, nw + i, 1);
                o[n++] = dt__pp_interleaved_op(p, v, i, 0);
            }
            for (i = total - nw; i < total; i++) o[n++] = dt__pp_interleaved_op(p, v, i, 0);
            break;
        }
        /* one chunk: interleaving is 1F1B */
        /* fall through */
    case DT_PP_DEFAULT:
    case DT_PP_1F1B:
        nw = p - st - 1 < m ? p - st - 1 : m;
        for (i = 0; i < nw; i++) o[n++] = dt__pp_act(DT_PP_F, 0, i, -1);
        for (i = 0; i < m - nw; i++) {
            o[n++] = dt__pp_act(DT_PP_F, 0, nw + i, -1);
            o[n++] = dt__pp_act(DT_PP_B, 0, i, -1);
        }
        for (i = m - nw; i < m; i++) o[n++] = dt__pp_act(DT_PP_B, 0, i, -1);
        break;
    case DT_PP_ZB_H1:
        /* 1F1B with the backward split; stage st keeps st weight-gradient passes pending, so
           its BIs (what the stage before waits for) run earlier and the pending BWs fill the
           cooldown, where 1F1B idles. In flight: (p-st) + st = p on every stage. */
        nw = p - st - 1 < m ? p - st - 1 : m;
        for (i = 0; i < nw; i++) o[n++] = dt__pp_act(DT_PP_F, 0, i, -1);
        for (i = 0; i < m - nw; i++) {
            o[n++] = dt__pp_act(DT_PP_F, 0, nw + i, -1);
            o[n++] = dt__pp_act(DT_PP_BI, 0, i, -1);
            if (i + 1 - nextw > st) o[n++] = dt__pp_act(DT_PP_BW, 0, nextw++, -1);
        }
        for (i = m - nw; i < m; i++) {
            o[n++] = dt__pp_act(DT_PP_BI, 0, i, -1);
            o[n++] = dt__pp_act(DT_PP_BW, 0, nextw++, -1); /* fills the wait for the next BI's gradient */
        }
        while (nextw < m) o[n++] = dt__pp_act(DT_PP_BW, 0, nextw++, -1);
        break;
    default: break;
    }
    return n;
}

/* The activations stage st may hold at once (chunk-micro-batches), as each paper states it. */
static int dt__pp_bound(const dt_pp_schedule *s, int st) {
    int p = s->stages, m = s->micro, v = s->chunks, b;
    switch (s->kind) {
    case DT_PP_GPIPE: return m;
    case DT_PP_ZB_H1: return p < m ? p : m;
    case DT_PP_INTERLEAVED:
        if (v > 1) { /* Megatron: the warm-up forwards plus the one of the first steady step */
            b = 2 * (p - st - 1) + (v - 1) * p + 1;
            return b < m * v ? b : m * v;
        }
        /* fall through */
    default: return p - st < m ? p - st : m;
    }
}

DT_API void dt_pp_schedule_free(dt_pp_schedule *s) {
    dt_ctx *ctx;
    int st;
    if (!s || !s->ctx) return;
    ctx = s->ctx;
    for (st = 0; st < s->stages; st++) {
        if (s->actions) dt_release(ctx, s->actions[st]);
        if (s->start) dt_release(ctx, s->start[st]);
    }
    dt_release(ctx, s->actions);
    dt_release(ctx, s->start);
    dt_release(ctx, s->count);
    dt_release(ctx, s->bound);
    dt_release(ctx, s->busy);
    dt_release(ctx, s->stage_bubble);
    dt_release(ctx, s->peak);
    memset(s, 0, sizeof *s);
    dt_release(ctx, s);
}

/* Which stage is on the other side of a message, seen from stage st: the virtual stage
   before (to = -1) or after (to = +1) chunk c of st. -1 when there is none. */
static int dt__pp_neighbour(int p, int v, int st, int c, int to) {
    int k = c * p + st + to;
    if (k < 0 || k >= p * v) return -1;
    return k % p;
}

/* Stage st's full list: the compute order with its messages (see the header's "Order inside a
   list"). o holds n compute actions; rank and list have room for n, off for 2 v + 1, fill for
   2 v; out has room for 3 n (each stream item is posted once, each compute sends at most once). */
static int dt__pp_expand(const dt_pp_schedule *s, int st, const dt_pp_action *o, int n, int *rank, int *list,
                         int *off, int *fill, dt_pp_action *out) {
    int p = s->stages, v = s->chunks, A = s->recv_ahead, j, c, r, w = 0, q, peer, grad;
    /* stream of a compute: 2c for the activations F(c) consumes, 2c+1 for B/BI(c)'s gradients;
       list[off[q] ..] = its computes in order, rank[j] = j's place there */
#define DT__PP_STREAM(a) (2 * (a).chunk + ((a).op == DT_PP_F ? 0 : 1))
    for (q = 0; q <= 2 * v; q++) off[q] = 0;
    for (j = 0; j < n; j++)
        if (o[j].op != DT_PP_BW) off[DT__PP_STREAM(o[j]) + 1]++;
    for (q = 0; q < 2 * v; q++) off[q + 1] += off[q];
    for (q = 0; q < 2 * v; q++) fill[q] = 0;
    for (j = 0; j < n; j++) {
        if (o[j].op == DT_PP_BW) continue;
        q = DT__PP_STREAM(o[j]);
        rank[j] = fill[q]++;
        list[off[q] + rank[j]] = j;
    }
    if (p == 1) { /* chunks hand over in memory */
        memcpy(out, o, sizeof *o * (size_t)n);
        return n;
    }
    /* the first A receives of every stream, at the very start */
    for (q = 0; q < 2 * v; q++) {
        c = q / 2, grad = q % 2;
        peer = dt__pp_neighbour(p, v, st, c, grad ? +1 : -1);
        for (r = 0; peer >= 0 && r < A && off[q] + r < off[q + 1]; r++)
            out[w++] = dt__pp_act(grad ? DT_PP_RECV_GRAD : DT_PP_RECV_ACT, c, o[list[off[q] + r]].micro, peer);
    }
    for (j = 0; j < n; j++) {
        out[w++] = o[j];
        if (o[j].op == DT_PP_BW) continue;
        c = o[j].chunk, q = DT__PP_STREAM(o[j]), grad = q % 2;
        /* consumed one: post the receive A places further down the stream */
        peer = dt__pp_neighbour(p, v, st, c, grad ? +1 : -1);
        if (peer >= 0 && (int64_t)off[q] + rank[j] + A < off[q + 1])
            out[w++] = dt__pp_act(grad ? DT_PP_RECV_GRAD : DT_PP_RECV_ACT, c, o[list[off[q] + rank[j] + A]].micro, peer);
        /* and send what it produced */
        peer = dt__pp_neighbour(p, v, st, c, grad ? -1 : +1);
        if (peer >= 0) out[w++] = dt__pp_act(grad ? DT_PP_SEND_GRAD : DT_PP_SEND_ACT, c, o[j].micro, peer);
    }
#undef DT__PP_STREAM
    return w;
}

static dt_status dt__pp_check_desc(dt_ctx *ctx, const dt_pp_desc *d, int *p, int *m, int *v) {
    static const char fn[] = "dt_pp_schedule_create";
    int64_t pv = 0;
    if ((int)d->kind < 0 || d->kind >= DT_PP_KIND_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc->kind = %d, expected DT_PP_DEFAULT .. DT_PP_ZB_H1 (0 .. %d)",
                                fn, (int)d->kind, DT_PP_KIND_COUNT - 1);
    *p = d->stages ? d->stages : 1;
    *m = d->micro ? d->micro : 1;
    *v = d->chunks ? d->chunks : 1;
    if (*p < 1) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc->stages = %d, expected >= 1 (0 = 1)", fn, d->stages);
    if (*m < 1) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc->micro = %d, expected >= 1 (0 = 1)", fn, d->micro);
    if (*v < 1) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc->chunks = %d, expected >= 1 (0 = 1)", fn, d->chunks);
    if (*v > 1 && d->kind != DT_PP_INTERLEAVED)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc->chunks = %d with kind %s, expected 1: only the interleaved "
                                "schedule puts several model chunks on a stage", fn, d->chunks, dt_pp_kind_name(d->kind));
    if (d->kind == DT_PP_INTERLEAVED && *m < *p)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc->micro = %d is fewer than desc->stages = %d: the interleaved "
                                "schedule needs at least one micro-batch per stage", fn, *m, *p);
    if (d->kind == DT_PP_INTERLEAVED && *m % *p != 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc->micro = %d is not a multiple of desc->stages = %d, as the "
                                "interleaved schedule needs (micro-batches go round the stages in groups of p)",
                                fn, *m, *p);
    /* the simulator indexes (virtual stage, micro) pairs and a stage lists up to 9 m v + 2 v
       actions: keep all of it in int */
    if (!dt_mul_ok(*p, *v, &pv) || !dt_mul_ok(pv, *m, &pv) || pv > 100000000 || (int64_t)*m * *v > 10000000)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: stages %d x chunks %d x micro %d is too large (at most 1e8 "
                                "(stage, chunk, micro) triples and 1e7 chunk-micro-batches per stage)", fn, *p, *v, *m);
    if (d->recv_ahead < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc->recv_ahead = %d, expected >= 0 (0 = 2)", fn, d->recv_ahead);
    if (d->n_layers < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc->n_layers = %d, expected >= 0 (0 = not checked)", fn,
                                d->n_layers);
    if (d->n_layers > 0 && (int64_t)*p * *v > d->n_layers)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc->stages x desc->chunks = %d x %d = %lld virtual stages but "
                                "desc->n_layers = %d: expected at most one virtual stage per layer", fn, *p, *v,
                                (long long)*p * *v, d->n_layers);
    return DT_OK;
}

DT_API dt_status dt_pp_schedule_create(dt_ctx *ctx, dt_pp_schedule **out, const dt_pp_desc *desc) {
    dt_pp_schedule *s;
    dt_pp_action *o = NULL, *tmp = NULL;
    int *idx = NULL;
    int p = 1, m = 1, v = 1, st, n, cap;
    dt_status err;
    if (!ctx) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_pp_schedule_create: out is NULL");
    *out = NULL;
    if (!desc) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_pp_schedule_create: desc is NULL");
    err = dt__pp_check_desc(ctx, desc, &p, &m, &v);
    if (err) return err;
    s = (dt_pp_schedule *)dt_alloc(ctx, sizeof *s);
    if (!s) return DT_ERR_OOM;
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    s->kind = desc->kind == DT_PP_DEFAULT ? DT_PP_1F1B : desc->kind;
    s->stages = p;
    s->micro = m;
    s->chunks = v;
    s->recv_ahead = desc->recv_ahead ? desc->recv_ahead : 2;
    cap = 3 * m * v; /* compute actions: F, BI, BW at most */
    s->count = (int *)dt_alloc(ctx, sizeof(int) * (size_t)p);
    s->bound = (int *)dt_alloc(ctx, sizeof(int) * (size_t)p);
    s->peak = (int *)dt_alloc(ctx, sizeof(int) * (size_t)p);
    s->busy = (double *)dt_alloc(ctx, sizeof(double) * (size_t)p);
    s->stage_bubble = (double *)dt_alloc(ctx, sizeof(double) * (size_t)p);
    s->actions = (dt_pp_action **)dt_alloc(ctx, sizeof(dt_pp_action *) * (size_t)p);
    s->start = (double **)dt_alloc(ctx, sizeof(double *) * (size_t)p);
    o = (dt_pp_action *)dt_alloc(ctx, sizeof(dt_pp_action) * (size_t)cap);
    tmp = (dt_pp_action *)dt_alloc(ctx, sizeof(dt_pp_action) * (size_t)cap * 3);
    idx = (int *)dt_alloc(ctx, sizeof(int) * (2 * (size_t)cap + 4 * (size_t)v + 1)); /* rank, list, off, fill */
    if (s->actions) memset(s->actions, 0, sizeof(dt_pp_action *) * (size_t)p); /* what the free looks at */
    if (s->start) memset(s->start, 0, sizeof(double *) * (size_t)p);
    if (!s->count || !s->bound || !s->peak || !s->busy || !s->stage_bubble || !s->actions || !s->start || !o ||
        !tmp || !idx) {
        err = DT_ERR_OOM;
        goto done;
    }
    for (st = 0; st < p; st++) {
        n = dt__pp_compute_order(s, st, o);
        n = dt__pp_expand(s, st, o, n, idx, idx + cap, idx + 2 * cap, idx + 2 * cap + 2 * v + 1, tmp);
        s->actions[st] = (dt_pp_action *)dt_alloc(ctx, sizeof(dt_pp_action) * (size_t)(n ? n : 1));
        s->start[st] = (double *)dt_alloc(ctx, sizeof(double) * (size_t)(n ? n : 1));
        if (!s->actions[st] || !s->start[st]) {
            err = DT_ERR_OOM;
            goto done;
        }
        memcpy(s->actions[st], tmp, sizeof(dt_pp_action) * (size_t)n);
        memset(s->start[st], 0, sizeof(double) * (size_t)(n ? n : 1));
        s->count[st] = n;
        s->bound[st] = dt__pp_bound(s, st);
        s->peak[st] = 0;
        s->busy[st] = 0.0;
        s->stage_bubble[st] = 0.0;
    }
    err = DT_OK;
done:
    dt_release(ctx, o);
    dt_release(ctx, tmp);
    dt_release(ctx, idx);
    if (err) {
        dt_pp_schedule_free(s);
        return dt_ctx_set_error(ctx, DT_ERR_OOM, "dt_pp_schedule_create: out of memory for %d stages x %d micro-batches",
                                p, m);
    }
    *out = s;
    return DT_OK;
}

/* ---- the simulator */

#define DT__PP_WHY 96

typedef struct dt__pp_sim {
    dt_pp_schedule *s;
    int p, m, v, V;
    double f, b, bi, bw, comm;           /* per chunk */
    /* per (virtual stage k, micro i) at k * m + i; -1 = not yet */
    double *f_end, *bi_end, *w_end;      /* F; B or BI (input grad); B or BW (weight grad) */
    double *act_post, *act_arr;          /* the receive of k's input activation: posted, arrived */
    double *grad_post, *grad_arr;        /* the receive of k's output gradient */
    unsigned char *bkind;                /* 0 none yet, 1 a full B, 2 a BI */
    double *clock;                       /* per stage */
    int *pc, *inflight;
    char *why;                           /* per stage: what it waits for */
} dt__pp_sim;

static void dt__pp_str(char *buf, size_t n, const dt_pp_action *a) {
    if (a->op == DT_PP_SEND_ACT || a->op == DT_PP_SEND_GRAD)
        snprintf(buf, n, "%s m%d c%d ->%d", dt_pp_op_name(a->op), a->micro, a->chunk, a->peer);
    else if (a->op == DT_PP_RECV_ACT || a->op == DT_PP_RECV_GRAD)
        snprintf(buf, n, "%s m%d c%d <-%d", dt_pp_op_name(a->op), a->micro, a->chunk, a->peer);
    else
        snprintf(buf, n, "%s m%d c%d", dt_pp_op_name(a->op), a->micro, a->chunk);
}

static dt_status dt__pp_bad(dt__pp_sim *S, int st, const char *what, const char *detail) {
    char an[64];
    dt__pp_str(an, sizeof an, &S->s->actions[st][S->pc[st]]);
    return dt_ctx_set_error(S->s->ctx, DT_ERR_STATE, "dt_pp_schedule_simulate: %s: stage %d, action %d (%s): %s", what,
                            st, S->pc[st], an, detail);
}

/* Runs stage st's next action: 0 done, -1 blocked (S->why says on what), else an error status. */
static int dt__pp_step(dt__pp_sim *S, int st) {
    const dt_pp_action *a = &S->s->actions[st][S->pc[st]];
    int p = S->p, m = S->m, k = a->chunk * p + st, x = k * m + a->micro, y;
    double ready = 0.0, cost = 0.0, *clock = &S->clock[st];
    char *why = S->why + (size_t)st * DT__PP_WHY, d[DT__PP_WHY];
    switch (a->op) {
    case DT_PP_F:
        if (S->f_end[x] >= 0) return dt__pp_bad(S, st, "count", "a second F of this chunk and micro-batch");
        if (k > 0 && p == 1) {
            if (S->f_end[x - m] < 0) return dt__pp_bad(S, st, "order", "before the F of the chunk before it");
            ready = S->f_end[x - m];
        } else if (k > 0) {
            if (S->act_post[x] < 0) return dt__pp_bad(S, st, "order", "its input activation was never received (no RECV_ACT before it)");
            if (S->act_arr[x] < 0) {
                snprintf(why, DT__PP_WHY, "waits for the activation from stage %d", (st + p - 1) % p);
                return -1;
            }
            ready = S->act_arr[x];
        }
        cost = S->f;
        break;
    case DT_PP_B:
    case DT_PP_BI:
        if (S->bkind[x]) return dt__pp_bad(S, st, "count", "a second backward (B or BI) of this chunk and micro-batch");
        if (S->f_end[x] < 0) return dt__pp_bad(S, st, "order", "a backward before its forward");
        if (k < S->V - 1 && p == 1) {
            if (S->bi_end[x + m] < 0) return dt__pp_bad(S, st, "order", "before the backward of the chunk after it");
            ready = S->bi_end[x + m];
        } else if (k < S->V - 1) {
            if (S->grad_post[x] < 0) return dt__pp_bad(S, st, "order", "its gradient was never received (no RECV_GRAD before it)");
            if (S->grad_arr[x] < 0) {
                snprintf(why, DT__PP_WHY, "waits for the gradient from stage %d", (st + 1) % p);
                return -1;
            }
            ready = S->grad_arr[x];
        }
        cost = a->op == DT_PP_B ? S->b : S->bi;
        break;
    case DT_PP_BW:
        if (S->bkind[x] == 1) return dt__pp_bad(S, st, "count", "a BW after a full B (its weight gradient is done)");
        if (S->bkind[x] == 0) return dt__pp_bad(S, st, "order", "a BW before its BI");
        if (S->w_end[x] >= 0) return dt__pp_bad(S, st, "count", "a second BW of this chunk and micro-batch");
        cost = S->bw;
        break;
    case DT_PP_SEND_ACT:
    case DT_PP_SEND_GRAD: {
        int act = a->op == DT_PP_SEND_ACT;
        double *post = act ? S->act_post : S->grad_post, *arr = act ? S->act_arr : S->grad_arr;
        if ((act ? S->f_end[x] : S->bi_end[x]) < 0)
            return dt__pp_bad(S, st, "order", act ? "sent before the F that produces it" : "sent before the backward that produces it");
        y = act ? x + m : x - m;
        if (arr[y] >= 0) return dt__pp_bad(S, st, "count", "sent twice");
        if (post[y] < 0) {
            snprintf(why, DT__PP_WHY, "waits for stage %d to post %s", a->peer, act ? "RECV_ACT" : "RECV_GRAD");
            return -1;
        }
        S->s->start[st][S->pc[st]] = *clock;
        if (post[y] > *clock) *clock = post[y];
        arr[y] = *clock + S->comm;
        return 0;
    }
    case DT_PP_RECV_ACT:
    case DT_PP_RECV_GRAD: {
        double *post = a->op == DT_PP_RECV_ACT ? S->act_post : S->grad_post;
        if (post[x] >= 0) return dt__pp_bad(S, st, "count", "a receive posted twice");
        S->s->start[st][S->pc[st]] = *clock;
        post[x] = *clock;
        return 0;
    }
    default: return dt__pp_bad(S, st, "fields", "not an op"); /* refused before the run */
    }
    /* a compute */
    if (ready < *clock) ready = *clock;
    S->s->start[st][S->pc[st]] = ready;
    *clock = ready + cost;
    S->s->busy[st] += cost;
    switch (a->op) {
    case DT_PP_F:
        S->f_end[x] = *clock;
        if (++S->inflight[st] > S->s->peak[st]) S->s->peak[st] = S->inflight[st];
        if (S->inflight[st] > S->s->bound[st]) {
            snprintf(d, sizeof d, "%d activations in flight, above the schedule's bound of %d", S->inflight[st],
                     S->s->bound[st]);
            return dt__pp_bad(S, st, "memory", d);
        }
        break;
    case DT_PP_B:
        S->bkind[x] = 1;
        S->bi_end[x] = S->w_end[x] = *clock;
        S->inflight[st]--;
        break;
    case DT_PP_BI:
        S->bkind[x] = 2;
        S->bi_end[x] = *clock;
        break;
    default: /* BW */
        S->w_end[x] = *clock;
        S->inflight[st]--;
        break;
    }
    return 0;
}

/* Every field in range, messages only between the neighbours the virtual stages imply. */
static dt_status dt__pp_check_fields(const dt_pp_schedule *s) {
    int st, j, want;
    char an[64];
    for (st = 0; st < s->stages; st++) {
        if (s->count[st] < 0 || (s->count[st] > 0 && !s->actions[st]))
            return dt_ctx_set_error(s->ctx, DT_ERR_ARG, "dt_pp_schedule_simulate: fields: stage %d has count %d and "
                                    "actions %p", st, s->count[st], (void *)s->actions[st]);
        for (j = 0; j < s->count[st]; j++) {
            const dt_pp_action *a = &s->actions[st][j];
            const char *bad = NULL;
            dt__pp_str(an, sizeof an, a);
            if ((int)a->op <= DT_PP_NOP || a->op >= DT_PP_OP_COUNT) bad = "op is not one of F .. RECV_GRAD";
            else if (a->micro < 0 || a->micro >= s->micro) bad = "micro out of [0, micro)";
            else if (a->chunk < 0 || a->chunk >= s->chunks) bad = "chunk out of [0, chunks)";
            else if (a->op <= DT_PP_BW && a->peer != -1) bad = "a compute's peer must be -1";
            else if (a->op > DT_PP_BW) {
                int to = a->op == DT_PP_SEND_ACT || a->op == DT_PP_RECV_GRAD ? +1 : -1;
                want = s->stages > 1 ? dt__pp_neighbour(s->stages, s->chunks, st, a->chunk, to) : -1;
                if (want < 0) bad = s->stages == 1 ? "a message in a one-stage pipeline" : "no virtual stage on that side";
                else if (a->peer != want) bad = "peer is not the stage of the neighbouring virtual stage";
            }
            if (bad)
                return dt_ctx_set_error(s->ctx, DT_ERR_ARG, "dt_pp_schedule_simulate: fields: stage %d, action %d (%s, "
                                        "op %d): %s", st, j, an, (int)a->op, bad);
        }
    }
    return DT_OK;
}

static dt_status dt__pp_costs(dt_ctx *ctx, const dt_pp_sim_desc *desc, double c[5]) {
    static const char *const names[5] = {"f", "b", "bi", "bw", "comm"};
    dt_pp_sim_desc d;
    int i;
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    c[0] = d.f, c[1] = d.b, c[2] = d.bi, c[3] = d.bw, c[4] = d.comm;
    for (i = 0; i < 5; i++)
        if (!(c[i] >= 0.0 && c[i] <= 1e300)) /* NaN fails too */
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_pp_schedule_simulate: desc->%s = %g, expected a finite cost "
                                    ">= 0 (0 = default)", names[i], c[i]);
    if (c[0] == 0.0) c[0] = 1.0;
    if (c[1] == 0.0) c[1] = 2.0;
    if (c[2] == 0.0) c[2] = c[1] / 2;
    if (c[3] == 0.0) c[3] = c[1] - c[2];
    if (!(c[3] > 0.0))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_pp_schedule_simulate: desc->bi = %g leaves bw = b - bi = %g, "
                                "expected > 0: give desc->bw too", c[2], c[3]);
    return DT_OK;
}

static double dt__pp_formula(const dt_pp_schedule *s, const double c[5]) {
    double p1 = s->stages - 1, m = s->micro, x;
    switch (s->kind) {
    case DT_PP_INTERLEAVED: return p1 / (s->chunks * m + p1);
    case DT_PP_ZB_H1:
        x = p1 * (c[0] + c[2] - c[3]);
        return x / (m * (c[0] + c[2] + c[3]) + x);
    default: return p1 / (m + p1);
    }
}

DT_API dt_status dt_pp_schedule_simulate(dt_pp_schedule *s, dt_pp_stats *out, const dt_pp_sim_desc *desc) {
    dt__pp_sim S;
    dt_ctx *ctx;
    double c[5], *block = NULL, sum = 0.0, makespan = 0.0;
    size_t n, i;
    int st, progress, left, r, p;
    dt_status err;
    if (!s || !s->ctx || s->stages < 1 || !s->count || !s->actions) return s && s->ctx ? dt_ctx_set_error(s->ctx, DT_ERR_ARG, "dt_pp_schedule_simulate: s is not a schedule from dt_pp_schedule_create") : DT_ERR_ARG;
    ctx = s->ctx;
    if (out) memset(out, 0, sizeof *out);
    err = dt__pp_costs(ctx, desc, c);
    if (err) return err;
    err = dt__pp_check_fields(s);
    if (err) return err;
    memset(&S, 0, sizeof S);
    S.s = s;
    S.p = p = s->stages;
    S.m = s->micro;
    S.v = s->chunks;
    S.V = p * s->chunks;
    /* a chunk holds 1/v of a stage's layers */
    S.f = c[0] / S.v, S.b = c[1] / S.v, S.bi = c[2] / S.v, S.bw = c[3] / S.v, S.comm = c[4];
    n = (size_t)S.V * (size_t)S.m;
    block = (double *)dt_alloc(ctx, sizeof(double) * (7 * n + (size_t)p) + n + sizeof(int) * 2 * (size_t)p +
                                        (size_t)p * DT__PP_WHY);
    if (!block) return dt_ctx_set_error(ctx, DT_ERR_OOM, "dt_pp_schedule_simulate: out of memory for %zu pairs", n);
    S.f_end = block, S.bi_end = block + n, S.w_end = block + 2 * n;
    S.act_post = block + 3 * n, S.act_arr = block + 4 * n, S.grad_post = block + 5 * n, S.grad_arr = block + 6 * n;
    S.clock = block + 7 * n;
    for (i = 0; i < 7 * n; i++) block[i] = -1.0;
    S.pc = (int *)(S.clock + p);
    S.inflight = S.pc + p;
    S.bkind = (unsigned char *)(S.inflight + p);
    S.why = (char *)(S.bkind + n);
    memset(S.bkind, 0, n);
    for (st = 0; st < p; st++) {
        S.clock[st] = 0.0, S.pc[st] = 0, S.inflight[st] = 0;
        s->busy[st] = 0.0, s->peak[st] = 0, s->stage_bubble[st] = 0.0;
        S.why[(size_t)st * DT__PP_WHY] = '\0';
    }
    /* Round-robin: each stage runs until it blocks; a round where none moves is a deadlock.
       Times come from the dependencies, not from this order. */
    for (;;) {
        progress = 0, left = 0;
        for (st = 0; st < p; st++) {
            while (S.pc[st] < s->count[st]) {
                r = dt__pp_step(&S, st);
                if (r > 0) { err = (dt_status)r; goto done; }
                if (r < 0) break;
                S.pc[st]++, progress = 1;
            }
            if (S.pc[st] < s->count[st]) left++;
        }
        if (!left) break;
        if (!progress) {
            char msg[DT_ERROR_MAX], an[64];
            size_t len = 0;
            len += (size_t)snprintf(msg, sizeof msg, "deadlock: no stage can go on;");
            for (st = 0; st < p && len < sizeof msg; st++) {
                if (S.pc[st] >= s->count[st]) continue;
                dt__pp_str(an, sizeof an, &s->actions[st][S.pc[st]]);
                len += (size_t)snprintf(msg + len, sizeof msg - len, " stage %d at %d %s %s;", st, S.pc[st], an,
                                        S.why + (size_t)st * DT__PP_WHY);
            }
            err = dt_ctx_set_error(ctx, DT_ERR_STATE, "dt_pp_schedule_simulate: %s", msg);
            goto done;
        }
    }
    /* every (virtual stage, micro) once forward and once backward, every receive matched */
    for (i = 0; i < n; i++) {
        int k = (int)(i / (size_t)S.m), mi = (int)(i % (size_t)S.m);
        const char *bad = S.f_end[i] < 0 ? "has no F" : S.bi_end[i] < 0 ? "has no backward (B or BI)"
                        : S.w_end[i] < 0 ? "has a BI but no BW"
                        : S.act_post[i] >= 0 && S.act_arr[i] < 0 ? "posted a RECV_ACT no stage sent to"
                        : S.grad_post[i] >= 0 && S.grad_arr[i] < 0 ? "posted a RECV_GRAD no stage sent to" : NULL;
        if (bad) {
            err = dt_ctx_set_error(ctx, DT_ERR_STATE, "dt_pp_schedule_simulate: count: stage %d, chunk %d, micro %d %s",
                                   k % p, k / p, mi, bad);
            goto done;
        }
    }
    for (st = 0; st < p; st++) {
        if (S.clock[st] > makespan) makespan = S.clock[st];
        sum += s->busy[st];
    }
    for (st = 0; st < p; st++) s->stage_bubble[st] = makespan > 0 ? 1.0 - s->busy[st] / makespan : 0.0;
    if (out) {
        out->makespan = makespan;
        out->bubble = makespan > 0 ? 1.0 - sum / (p * makespan) : 0.0;
        out->bubble_formula = dt__pp_formula(s, c);
        for (st = 0; st < p; st++) {
            if (s->peak[st] > out->peak_max) out->peak_max = s->peak[st];
            if (s->bound[st] > out->bound_max) out->bound_max = s->bound[st];
        }
    }
    err = DT_OK;
done:
    dt_release(ctx, block);
    return err;
}

/* "F3", "B3", "W3" (BI prints as B, BW as W, as in the zero-bubble paper), and a chunk letter
   when there are several. */
static void dt__pp_label(char *buf, size_t n, const dt_pp_action *a, int chunks) {
    const char *op = a->op == DT_PP_F ? "F" : a->op == DT_PP_BW ? "W" : "B";
    if (chunks == 1) snprintf(buf, n, "%s%d", op, a->micro);
    else if (chunks <= 26) snprintf(buf, n, "%s%d%c", op, a->micro, 'a' + a->chunk);
    else snprintf(buf, n, "%s%d/%d", op, a->micro, a->chunk);
}

DT_API dt_status dt_pp_schedule_format(dt_pp_schedule *s, dt_strbuf *out, const dt_pp_sim_desc *desc) {
    dt_pp_stats stats;
    double c[5], q = 0.0, cost;
    char label[32];
    int st, j, width = 2, w, len;
    int64_t slots, at, slot;
    dt_status err;
    if (!s || !s->ctx) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(s->ctx, DT_ERR_ARG, "dt_pp_schedule_format: out is NULL");
    err = dt_pp_schedule_simulate(s, &stats, desc);
    if (err) return err;
    dt__pp_costs(s->ctx, desc, c);
    /* a slot is the cheapest compute the schedule runs; labels set the column width */
    for (st = 0; st < s->stages; st++)
        for (j = 0; j < s->count[st]; j++) {
            const dt_pp_action *a = &s->actions[st][j];
            if (a->op > DT_PP_BW) continue;
            cost = (a->op == DT_PP_F ? c[0] : a->op == DT_PP_B ? c[1] : a->op == DT_PP_BI ? c[2] : c[3]) / s->chunks;
            if (q == 0.0 || cost < q) q = cost;
            dt__pp_label(label, sizeof label, a, s->chunks);
            len = (int)strlen(label);
            if (len > width) width = len;
        }
    if (q == 0.0) return DT_OK; /* nothing to draw */
    slots = (int64_t)(stats.makespan / q + 0.5);
    if (!(stats.makespan / q < 1e6))
        return dt_ctx_set_error(s->ctx, DT_ERR_ARG, "dt_pp_schedule_format: the table would be %.0f slots wide "
                                "(makespan %g / cheapest op %g), expected at most 1e6", stats.makespan / q, stats.makespan, q);
    for (st = 0; st < s->stages; st++) {
        size_t row = out->len;
        dt_strbuf_printf(out, "stage %*d |", s->stages > 10 ? (s->stages > 100 ? 3 : 2) : 1, st);
        slot = 0;
        for (j = 0; j < s->count[st]; j++) {
            const dt_pp_action *a = &s->actions[st][j];
            if (a->op > DT_PP_BW) continue;
            cost = (a->op == DT_PP_F ? c[0] : a->op == DT_PP_B ? c[1] : a->op == DT_PP_BI ? c[2] : c[3]) / s->chunks;
            at = (int64_t)(s->start[st][j] / q + 0.5);
            for (; slot < at; slot++) dt_strbuf_printf(out, " %-*s", width, ".");
            dt__pp_label(label, sizeof label, a, s->chunks);
            dt_strbuf_printf(out, " %-*s", width, label);
            slot++;
            for (w = (int)(cost / q + 0.5); w > 1; w--, slot++) dt_strbuf_printf(out, " %-*s", width, "--");
        }
        for (; slot < slots; slot++) dt_strbuf_printf(out, " %-*s", width, ".");
        /* no trailing blanks: tables are compared as text */
        while (!out->failed && out->len > row && out->text[out->len - 1] == ' ') out->text[--out->len] = '\0';
        dt_strbuf_str(out, "\n");
    }
    if (out->failed) return dt_ctx_set_error(s->ctx, DT_ERR_OOM, "dt_pp_schedule_format: out of memory for the table");
    return DT_OK;
}

/* ---------------------------------------------------------------- timeline (impl) */

#ifdef __cplusplus
}
#endif

#endif /* DT_PARALLEL_IMPLEMENTATION_DONE */
#endif /* DT_PARALLEL_IMPLEMENTATION */

/*
   ------------------------------------------------------------------------------------------------
   MIT License

   Copyright (c) 2026 the dt authors

   Permission is hereby granted, free of charge, to any person obtaining a copy of this software
   and associated documentation files (the "Software"), to deal in the Software without
   restriction, including without limitation the rights to use, copy, modify, merge, publish,
   distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
   Software is furnished to do so, subject to the following conditions:

   The above copyright notice and this permission notice shall be included in all copies or
   substantial portions of the Software.

   THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING
   BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
   NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
   DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
   OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
