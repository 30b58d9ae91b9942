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
   ZeRO-3 on 4 ranks resumes at ZeRO-0 on 1).

   The design, in detail (stages 1-3; N = dp, r = this rank's dp rank):
     - A tensor of R rows: rank r holds rows [r*c, min(R, (r+1)*c)), c = ceil(R / N). A slice may be
       empty ([3, 5] over 4 ranks: 1, 1, 1 and 0 rows); it is a tensor with a 0 dim all the same.
     - The optimizer (dt_opt.h, created inside from desc.opt) runs on a "shard set": one dt_param
       per parameter, same name, value and grad views of this rank's rows, global_shape the
       logical tensor's, start = the parameter's own start (it may already be a tensor-parallel
       slice) plus the row offset, sharded = 1. So clipping, loss scaling, master weights of
       bf16 / f16 values and resharding checkpoints work unchanged. desc.opt's comm becomes the
       world (loss scaling agrees there), norm.param_comms the dp group (l->dptp_comm for a
       parameter that is tensor-parallel sharded), norm.stage_comm l->pp_comm; at stage 0 the
       shard set is the whole parameters and only tensor-parallel ones sum over l->tp_comm.
     - Collectives work on flat ranges: a unit's shards are packed rank-major (rank 0's rows of
       every tensor of the unit, then rank 1's, ...; each padded to c rows so the N blocks are
       equal) for dt_comm_reduce_scatter and dt_comm_allgather, and copied between that packed
       layout and the per-tensor contiguous arena. Cost: one copy of the unit each way per
       collective (memory bandwidth, small beside the network) and a transient packed buffer of
       N blocks of the unit (the padding is at most N - 1 rows per tensor).
     - Gradients are averaged over dp (the loss is a mean over each rank's local batch).
     - Stage 0 all-reduces buckets of whole units (the arena's grads in place, no copy) as soon
       as every unit of a bucket had dt_zero_grad_ready (dt_comm_iallreduce: the rest of the
       backward overlaps it). Stage 1 reduce-scatters each unit at dt_zero_step, updates its
       rows and all-gathers the values. Stages 2-3 reduce-scatter a unit from dt_zero_grad_ready
       (dt_comm_ireduce_scatter, finished at a later grad_ready or the step) and add this rank's
       block into its shard grads. Stage 3 keeps only this rank's rows of the values: a gather
       all-gathers the unit into freshly allocated buffers (the next unit in call order is
       posted ahead, desc.prefetch), a release frees them (p->value.data is NULL in between).
     - Accumulation (dt_zero_micro_begin): stages 0-1 sync on the last micro-step only (grads
       accumulate in the arena); stages 2-3 reduce-scatter every micro-step and accumulate the
       shard.
     - What a stage takes from the arena: stages 2-3 free the arena's grad buffer (the params'
       grad.data is NULL outside a unit's backward), stage 3 its value buffers too. They are
       not given back by dt_zero_free (stage 3's values exist only as shards): save a
       checkpoint, or gather, before freeing. One dt_zero per arena at stages 2-3.
     - dt_zero_grad_ready at stage 0 must come after the unit's last use in the backward (its
       bucket may be on the wire); at stages 2-3 a unit used again later (a tied embedding) may
       simply be gathered again: its new grads are reduce-scattered and added once more.
   Memory (dt_zero_memory_get): dt's grads are always f32, so DeepSpeed's mixed-precision
   formulas (16-bit grads: 16psi, 4psi + 12psi/N, 2psi + 14psi/N, 16psi/N) become, with K bytes
   per value, 4 per grad and S bytes of master + optimizer state per parameter:
   (K+4+S)psi, (K+4)psi + S psi/N, K psi + (4+S)psi/N, (K+4+S)psi/N. f32 with Adam (K 4, S 8):
   16psi, 8psi + 8psi/N, 4psi + 12psi/N, 16psi/N; bf16 values with Adam (K 2, S 12): 18psi,
   6psi + 12psi/N, 2psi + 16psi/N, 18psi/N. The formula string names the one that applies. */

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
    size_t peak_bytes;         /* the most this rank held at once (total_bytes plus the transient
                                  gather / reduce-scatter buffers and unit buffers, since create) */
    double formula_bytes;      /* the stage's formula for psi and N = dp */
    const char *formula;       /* "4psi + 12psi/N", ...: points into the dt_zero (valid while it lives) */
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

/* ---------------------------------------------------------------- pipeline schedules */

/* (declared by the pipeline section) */

/* ---------------------------------------------------------------- timeline

   Spans of compute (dt_trace_begin / _end, nested) and every collective of the comms attached,
   per rank, written as one Chrome-trace JSON for all ranks (clocks aligned to rank 0's), which
   Perfetto and chrome://tracing open: one process per rank, one track for compute and one per
   comm. Every function takes a NULL trace and does nothing, so model code calls them always.
   How: dt_trace_attach installs the comm's observer (dt_comm_set_observer, one per comm: it
   replaces another), which reports each operation from post to the dt call that saw it done.
   dt_trace_write aligns the clocks with 8 ping-pongs between rank 0 and each rank (NTP's
   estimate from the shortest round trip: offset = t_rank - (t_send + t_back) / 2, off by at
   most half that round trip), stores the offsets in the file ("otherData"), and sends every
   rank's events to rank 0 (send / recv on the world; not recorded). Times in the file are
   microseconds from rank 0's dt_trace_create. Spans still open at the write are left out.
   dt_trace_overlap counts, per collective, the time under the union of the compute spans:
   wrap compute in spans, not calls that wait for the network (a blocking collective inside
   a span counts as overlapped). Free the trace before the comms it is attached to (it removes
   their observers). */

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

#if !defined(__cplusplus) && (defined(__unix__) || defined(__APPLE__))
/* POSIX, declared here because strict -std=c99 hides it in <unistd.h> (as dt_tensor.h does
   for fsync). */
extern int gethostname(char *name, size_t len);
#define DT__PL_HOSTNAME 1
#elif defined(__cplusplus) && (defined(__unix__) || defined(__APPLE__))
} /* a system header goes outside the extern "C" block */
#include <unistd.h>
extern "C" {
#define DT__PL_HOSTNAME 1
#endif

/* dt_tensor.h's DT__TRY is private to its implementation (which may be in another file) */
#define DT__PL_TRY(x) do { dt_status dt__pl_s = (x); if (dt__pl_s) return dt__pl_s; } while (0)

#define DT__PL_HOST_MAX 64 /* bytes of a host name in dt_layout_describe's records */
#define DT__PL_REC (16 + DT__PL_HOST_MAX) /* rank, dp, tp, pp as 4 little-endian u32, then the host */

/* Frees the groups of l (split from l->world, so they go first; world is the caller's). */
static void dt__pl_layout_release(dt_layout *l) {
    dt_comm_free(l->dptp_comm);
    dt_comm_free(l->pp_comm);
    dt_comm_free(l->tp_comm);
    dt_comm_free(l->dp_comm);
    dt_release(l->ctx, l);
}

/* Splits l->world into the group of ranks with the same `color`, ordered by `key`, named `name`. */
static dt_status dt__pl_split(dt_layout *l, dt_comm **out, int color, int key, const char *name) {
    DT__PL_TRY(dt_comm_split(l->world, out, color, key));
    return dt_comm_set_name(*out, name);
}

DT_API dt_status dt_layout_create(dt_comm *world, dt_layout **out, const dt_layout_desc *desc) {
    const char *fn = "dt_layout_create";
    dt_ctx *ctx;
    dt_layout *l;
    dt_layout_desc d;
    int64_t tpp = 0, all = 0;
    int size, rank;
    dt_status st;
    if (!world) return DT_ERR_ARG; /* no ctx to say it in */
    ctx = dt_comm_ctx(world);
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (d.dp < 0 || d.tp < 0 || d.pp < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.dp = %d, desc.tp = %d, desc.pp = %d; expected sizes >= 0 "
                                "(0 = default)", fn, d.dp, d.tp, d.pp);
    size = dt_comm_size(world);
    rank = dt_comm_rank(world);
    if (!d.tp) d.tp = 1;
    if (!d.pp) d.pp = 1;
    dt_mul_ok(d.tp, d.pp, &tpp); /* two ints: always fits */
    if (!d.dp) {
        if (size % tpp)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tp x pp = %d x %d = %lld does not divide the world size %d, "
                                    "so dp cannot be derived; expected world size = dp x tp x pp", fn, d.tp, d.pp,
                                    (long long)tpp, size);
        d.dp = (int)(size / tpp);
    }
    dt_mul_ok(tpp, d.dp, &all); /* < 2^93 would not fit, but each factor is < 2^31: 2^62 fits */
    if (all != size)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: dp x tp x pp = %d x %d x %d = %lld does not equal the world size "
                                "%d; expected sizes whose product is the world size", fn, d.dp, d.tp, d.pp,
                                (long long)all, size);
    l = (dt_layout *)dt_alloc(ctx, sizeof *l);
    if (!l) return DT_ERR_OOM;
    memset(l, 0, sizeof *l);
    l->ctx = ctx;
    l->world = world;
    l->size = size;
    l->rank = rank;
    l->dp = d.dp;
    l->tp = d.tp;
    l->pp = d.pp;
    /* rank = tp + TP * (dp + DP * pp) */
    l->tp_rank = rank % l->tp;
    l->dp_rank = (rank / l->tp) % l->dp;
    l->pp_rank = rank / (l->tp * l->dp);
    /* every rank splits in the same order; a group's key is the coordinate that varies in it */
    st = dt__pl_split(l, &l->dp_comm, l->tp_rank + l->tp * l->pp_rank, l->dp_rank, "dp");
    if (!st) st = dt__pl_split(l, &l->tp_comm, l->dp_rank + l->dp * l->pp_rank, l->tp_rank, "tp");
    if (!st) st = dt__pl_split(l, &l->pp_comm, l->tp_rank + l->tp * l->dp_rank, l->pp_rank, "pp");
    if (!st) st = dt__pl_split(l, &l->dptp_comm, l->pp_rank, l->tp_rank + l->tp * l->dp_rank, "dptp");
    if (st) {
        dt__pl_layout_release(l);
        return st;
    }
    *out = l;
    return DT_OK;
}

DT_API void dt_layout_free(dt_layout *l) {
    if (l) dt__pl_layout_release(l);
}

DT_API int dt_layout_rank_of(const dt_layout *l, int dp_rank, int tp_rank, int pp_rank) {
    if (!l || dp_rank < 0 || dp_rank >= l->dp || tp_rank < 0 || tp_rank >= l->tp || pp_rank < 0 || pp_rank >= l->pp)
        return -1;
    return tp_rank + l->tp * (dp_rank + l->dp * pp_rank);
}

DT_API const char *dt_layout_string(const dt_layout *l, char *buf, size_t n) {
    if (!buf || !n) return buf;
    if (!l) snprintf(buf, n, "(null)");
    else snprintf(buf, n, "dp=%d,tp=%d,pp=%d", l->dp, l->tp, l->pp);
    return buf;
}

static void dt__pl_put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v & 0xff);
    p[1] = (unsigned char)((v >> 8) & 0xff);
    p[2] = (unsigned char)((v >> 16) & 0xff);
    p[3] = (unsigned char)((v >> 24) & 0xff);
}
static int dt__pl_get_u32(const unsigned char *p) {
    return (int)((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24));
}

DT_API dt_status dt_layout_describe(dt_layout *l, dt_strbuf *out) {
    const char *fn = "dt_layout_describe";
    dt_tensor mine, all;
    dt_tensor_desc td;
    unsigned char *rec;
    char lay[64];
    int r, dp, tp, pp;
    dt_status st;
    if (!l) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    /* one fixed-size record per rank (coordinates and host name), all-gathered: every rank
       gets the whole picture */
    memset(&td, 0, sizeof td);
    td.dtype = DT_U8;
    td.shape[0] = DT__PL_REC;
    DT__PL_TRY(dt_tensor_create(l->ctx, &mine, &td));
    td.shape[0] = (int64_t)DT__PL_REC * l->size;
    st = dt_tensor_create(l->ctx, &all, &td);
    if (st) {
        dt_tensor_free(l->ctx, &mine);
        return st;
    }
    rec = (unsigned char *)mine.data;
    dt__pl_put_u32(rec, (uint32_t)l->rank);
    dt__pl_put_u32(rec + 4, (uint32_t)l->dp_rank);
    dt__pl_put_u32(rec + 8, (uint32_t)l->tp_rank);
    dt__pl_put_u32(rec + 12, (uint32_t)l->pp_rank);
#ifdef DT__PL_HOSTNAME
    if (gethostname((char *)rec + 16, DT__PL_HOST_MAX - 1) != 0) snprintf((char *)rec + 16, DT__PL_HOST_MAX, "?");
#else
    snprintf((char *)rec + 16, DT__PL_HOST_MAX, "?");
#endif
    rec[16 + DT__PL_HOST_MAX - 1] = 0;
    st = dt_comm_allgather(l->world, &all, &mine);
    dt_tensor_free(l->ctx, &mine);
    if (st) {
        dt_tensor_free(l->ctx, &all);
        return st;
    }
    rec = (unsigned char *)all.data;
    dt_strbuf_printf(out, "layout %s over %d rank%s (rank = tp + %d * (dp + %d * pp))\n",
                     dt_layout_string(l, lay, sizeof lay), l->size, l->size == 1 ? "" : "s", l->tp, l->dp);
    dt_strbuf_printf(out, "  rank  host                  dp  tp  pp\n");
    for (r = 0; r < l->size; r++) {
        const unsigned char *q = rec + (size_t)r * DT__PL_REC;
        dt_strbuf_printf(out, "  %4d  %-20.20s %3d %3d %3d\n", dt__pl_get_u32(q), (const char *)q + 16,
                         dt__pl_get_u32(q + 4), dt__pl_get_u32(q + 8), dt__pl_get_u32(q + 12));
    }
    /* the grid: per pipeline stage, which world rank sits at (dp, tp) */
    for (pp = 0; pp < l->pp; pp++) {
        dt_strbuf_printf(out, "  stage pp=%d: world rank at (dp row, tp column)\n        ", pp);
        for (tp = 0; tp < l->tp; tp++) dt_strbuf_printf(out, " tp%-3d", tp);
        dt_strbuf_printf(out, "\n");
        for (dp = 0; dp < l->dp; dp++) {
            dt_strbuf_printf(out, "   dp%-3d", dp);
            for (tp = 0; tp < l->tp; tp++) dt_strbuf_printf(out, " %5d", dt_layout_rank_of(l, dp, tp, pp));
            dt_strbuf_printf(out, "\n");
        }
    }
    dt_tensor_free(l->ctx, &all);
    if (out->failed) return dt_ctx_set_error(l->ctx, DT_ERR_OOM, "%s: out of memory for the text", fn);
    return DT_OK;
}

DT_API dt_status dt_layout_batch_range(const dt_layout *l, int64_t global_batch, int64_t *first, int64_t *count) {
    const char *fn = "dt_layout_batch_range";
    int64_t per;
    if (!l) return DT_ERR_ARG;
    if (!first || !count) return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: %s is NULL", fn, first ? "count" : "first");
    if (global_batch < 0 || global_batch % l->dp)
        return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: global_batch = %lld; expected >= 0 and divisible by dp = %d",
                                fn, (long long)global_batch, l->dp);
    per = global_batch / l->dp;
    *first = per * l->dp_rank;
    *count = per;
    return DT_OK;
}

/* ---------------------------------------------------------------- arena (impl) */

static void dt__pl_arena_release(dt_arena *a) {
    int k;
    dt_ctx *ctx = a->ctx;
    for (k = 0; k < DT_DTYPE_COUNT; k++) dt_tensor_free(ctx, &a->values[k]);
    dt_tensor_free(ctx, &a->grads);
    dt_release(ctx, a->value_offset);
    dt_release(ctx, a->grad_offset);
    dt_release(ctx, a->unit);
    dt_release(ctx, a->unit_first);
    dt_release(ctx, a);
}

/* Allocates n elements of `size` bytes (n >= 0, checked), at least one byte. */
static void *dt__pl_alloc_n(dt_ctx *ctx, int64_t n, size_t size, const char *fn, const char *what) {
    int64_t bytes;
    void *p;
    if (!dt_mul_ok(n, (int64_t)size, &bytes) || (uint64_t)bytes > (uint64_t)((size_t)-1 / 2)) {
        dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %lld x %zu bytes of %s do not fit in memory", fn, (long long)n, size,
                         what);
        return NULL;
    }
    p = dt_alloc(ctx, bytes ? (size_t)bytes : 1);
    if (p) memset(p, 0, bytes ? (size_t)bytes : 1);
    return p;
}

DT_API dt_status dt_arena_create(dt_ctx *ctx, dt_arena **out, dt_params *ps, const dt_arena_desc *desc) {
    const char *fn = "dt_arena_create";
    dt_arena *a;
    dt_tensor_desc td;
    dt_tensor *vviews = NULL, *gviews = NULL;
    int64_t total[DT_DTYPE_COUNT], gtotal = 0;
    const int *units = desc ? desc->units : NULL;
    int i, k, n;
    dt_status st = DT_OK;
    if (!ctx) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!ps) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: ps is NULL", fn);
    if (ps->count < 0 || (ps->count > 0 && !ps->items))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: ps has count %d and items %p; expected a dt_params", fn,
                                ps->count, (void *)ps->items);
    n = ps->count;
    /* check everything before anything changes: a failed create leaves ps as it was */
    for (i = 0; i < n; i++) {
        const dt_param *p = ps->items[i];
        if (!p || !p->value.data || !p->grad.data)
            return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: parameter %d (\"%s\") has no value or grad (freed, or "
                                    "released by ZeRO-3)", fn, i, p ? p->name : "(null)");
        if (p->value.device != DT_CPU || p->grad.device != DT_CPU)
            return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: parameter \"%s\" is on %s; the arena holds CPU parameters",
                                    fn, p->name, dt_device_name(p->value.device));
        if (p->grad.dtype != DT_F32 || p->grad.numel != p->value.numel)
            return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: parameter \"%s\" has a %s grad of %lld elements; expected "
                                    "f32 with the value's %lld", fn, p->name, dt_dtype_name(p->grad.dtype),
                                    (long long)p->grad.numel, (long long)p->value.numel);
        if ((int)p->value.dtype <= 0 || p->value.dtype >= DT_DTYPE_COUNT)
            return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: parameter \"%s\" has dtype %d", fn, p->name,
                                    (int)p->value.dtype);
        if (units) {
            int prev = i ? units[i - 1] : 0;
            if (units[i] < 0 || (i == 0 && units[0] != 0) || (i > 0 && units[i] != prev && units[i] != prev + 1))
                return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.units[%d] = %d (parameter \"%s\") after %d; "
                                        "expected units numbered from 0, each the same as the one before or one "
                                        "more", fn, i, units[i], p->name, i ? prev : 0);
        }
    }
    for (k = 0; k < DT_DTYPE_COUNT; k++) total[k] = 0;
    for (i = 0; i < n; i++) {
        const dt_param *p = ps->items[i];
        total[p->value.dtype] += p->value.numel; /* each < 2^62 bytes (a live tensor); n < 2^31 */
        gtotal += p->grad.numel;
        if (total[p->value.dtype] < 0 || gtotal < 0 || gtotal > ((int64_t)1 << 61))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: the parameters hold more elements than fit", fn);
    }
    a = (dt_arena *)dt_alloc(ctx, sizeof *a);
    if (!a) return DT_ERR_OOM;
    memset(a, 0, sizeof *a);
    a->ctx = ctx;
    a->params = ps;
    a->n_units = n == 0 ? 0 : units ? units[n - 1] + 1 : n;
    a->value_offset = (int64_t *)dt__pl_alloc_n(ctx, n, sizeof(int64_t), fn, "offsets");
    a->grad_offset = (int64_t *)dt__pl_alloc_n(ctx, n, sizeof(int64_t), fn, "offsets");
    a->unit = (int *)dt__pl_alloc_n(ctx, n, sizeof(int), fn, "units");
    a->unit_first = (int *)dt__pl_alloc_n(ctx, (int64_t)a->n_units + 1, sizeof(int), fn, "units");
    vviews = (dt_tensor *)dt__pl_alloc_n(ctx, n, sizeof(dt_tensor), fn, "views");
    gviews = (dt_tensor *)dt__pl_alloc_n(ctx, n, sizeof(dt_tensor), fn, "views");
    if (!a->value_offset || !a->grad_offset || !a->unit || !a->unit_first || !vviews || !gviews) st = DT_ERR_OOM;
    memset(&td, 0, sizeof td);
    td.ndim = 1;
    for (k = 1; k < DT_DTYPE_COUNT && !st; k++) {
        if (!total[k]) continue; /* data NULL: no parameter of this dtype */
        td.dtype = (dt_dtype)k;
        td.shape[0] = total[k];
        st = dt_tensor_create(ctx, &a->values[k], &td);
    }
    if (!st) {
        td.dtype = DT_F32;
        td.shape[0] = gtotal;
        st = dt_tensor_create(ctx, &a->grads, &td);
    }
    if (!st) { /* offsets in registration order, then the views (cannot fail on these sizes) */
        int64_t at[DT_DTYPE_COUNT], gat = 0;
        for (k = 0; k < DT_DTYPE_COUNT; k++) at[k] = 0;
        for (i = 0; i < n && !st; i++) {
            dt_param *p = ps->items[i];
            a->value_offset[i] = at[p->value.dtype];
            a->grad_offset[i] = gat;
            a->unit[i] = units ? units[i] : i;
            if (i == 0 || a->unit[i] != a->unit[i - 1]) a->unit_first[a->unit[i]] = i;
            st = dt_tensor_view(ctx, &vviews[i], &a->values[p->value.dtype], at[p->value.dtype], p->value.ndim,
                                p->value.shape);
            if (!st) st = dt_tensor_view(ctx, &gviews[i], &a->grads, gat, p->grad.ndim, p->grad.shape);
            at[p->value.dtype] += p->value.numel;
            gat += p->grad.numel;
        }
        a->unit_first[a->n_units] = n;
    }
    if (st) {
        dt_release(ctx, vviews);
        dt_release(ctx, gviews);
        dt__pl_arena_release(a);
        return st;
    }
    /* nothing can fail from here: move values and grads in, give the old memory back */
    for (i = 0; i < n; i++) {
        dt_param *p = ps->items[i];
        if (p->value.numel) memcpy(vviews[i].data, p->value.data, dt_tensor_bytes(&p->value));
        if (p->grad.numel) memcpy(gviews[i].data, p->grad.data, dt_tensor_bytes(&p->grad));
        dt_tensor_free(ctx, &p->value); /* a view (owns = 0) is only forgotten */
        dt_tensor_free(ctx, &p->grad);
        p->value = vviews[i];
        p->grad = gviews[i];
    }
    dt_release(ctx, vviews);
    dt_release(ctx, gviews);
    *out = a;
    return DT_OK;
}

DT_API void dt_arena_free(dt_arena *a) {
    if (a) dt__pl_arena_release(a); /* never touches a->params: they may be freed already */
}

/* ---------------------------------------------------------------- ZeRO (impl)

   Geometry. N = the dp size (1 at stage 0, which shards nothing), r = this rank's dp rank. A
   parameter of R rows (dim 0) of e elements each: every rank's block holds c = ceil(R / N)
   rows, rank j owns rows [min(R, j c), min(R, (j+1) c)). A unit's grads travel as one buffer of
   N blocks of B elements (rank-major; in a block each parameter of the unit at gpk, c rows,
   zero padded), its values as one such buffer per dtype (vpk, Bv). */

typedef struct dt__pl_zp {
    int64_t rows, row_elems; /* R and e */
    int64_t c;               /* rows per block */
    int64_t lo, n;           /* this rank's rows */
    int64_t gpk, vpk;        /* offset in a rank's grad block / value block (its dtype) of the unit */
    int64_t ug, uv;          /* offset in the unit's full grad buffer / full value buffer (its dtype) */
    int64_t sg, sv;          /* stages 2-3: offset in the shard grad buffer; stage 3: shard values */
} dt__pl_zp;

typedef struct dt__pl_zu {
    int first, last;                      /* params [first, last) */
    int64_t gblock, vblock[DT_DTYPE_COUNT];
    int64_t gnumel, vnumel[DT_DTYPE_COUNT];
    int has[DT_DTYPE_COUNT];              /* a param of this dtype is in the unit */
    int refs;                             /* stage 3: gathers not yet released */
    int ready;                            /* dt_zero_grad_ready seen in this backward */
    int bucket;                           /* stage 0 */
    dt_tensor vfull[DT_DTYPE_COUNT];      /* stage 3: the gathered values */
    dt_tensor vpack[DT_DTYPE_COUNT];      /* stage 3: an all-gather in flight (prefetch) */
    dt_comm_req *vreq[DT_DTYPE_COUNT];
    int vposted;
    dt_tensor gfull;                      /* stages 2-3: full grads, first gather to grad_ready */
    dt_tensor gpack, gout;                /* stages 2-3: a reduce-scatter in flight */
    dt_comm_req *greq;
} dt__pl_zu;

typedef struct dt__pl_bucket {
    int ulo, uhi;                         /* units [ulo, uhi] */
    dt_tensor view;                       /* their grads in the arena */
    dt_comm_req *req;
} dt__pl_bucket;

struct dt_zero {
    dt_ctx *ctx;
    dt_layout *l;
    dt_arena *a;
    dt_comm *dp;
    int stage, N, r, n_params, n_units, prefetch, sync, backward;
    int64_t bucket_bytes;
    dt__pl_zp *zp;
    dt__pl_zu *zu;
    dt__pl_bucket *bk;
    int n_buckets;
    dt_params shard;                      /* what the optimizer updates: this rank's rows */
    dt_comm **param_comms;
    dt_optimizer *opt;
    dt_tensor sgrad;                      /* stages 2-3 */
    dt_tensor sval[DT_DTYPE_COUNT];       /* stage 3 */
    size_t base_param, base_grad, live_param, live_grad, live_comm, peak;
    char formula[96];                     /* dt_zero_memory.formula points here */
};

/* Memory bookkeeping: what the stage holds besides its persistent buffers. */
static void dt__pl_znote(dt_zero *z) {
    size_t t = z->base_param + z->base_grad + z->live_param + z->live_grad + z->live_comm;
    if (z->opt) {
        int i;
        for (i = 0; i < z->opt->n_slots; i++)
            t += dt_tensor_bytes(&z->opt->slots[i].master) + dt_tensor_bytes(&z->opt->slots[i].state[0]) +
                 dt_tensor_bytes(&z->opt->slots[i].state[1]);
    }
    if (t > z->peak) z->peak = t;
}
static dt_status dt__pl_ztake(dt_zero *z, dt_tensor *t, dt_dtype dtype, int64_t numel, size_t *counter) {
    dt_tensor_desc td;
    memset(&td, 0, sizeof td);
    td.dtype = dtype;
    td.ndim = 1;
    td.shape[0] = numel;
    DT__PL_TRY(dt_tensor_create(z->ctx, t, &td));
    *counter += dt_tensor_bytes(t);
    dt__pl_znote(z);
    return DT_OK;
}
static void dt__pl_zgive(dt_zero *z, dt_tensor *t, size_t *counter) {
    if (!t->data) return;
    *counter -= dt_tensor_bytes(t);
    dt_tensor_free(z->ctx, t);
}

static dt_status dt__pl_zunit_arg(dt_zero *z, int unit, const char *fn) {
    if (unit < 0 || unit >= z->n_units)
        return dt_ctx_set_error(z->ctx, DT_ERR_RANGE, "%s: unit = %d; expected 0 <= unit < %d (the arena's units)", fn,
                                unit, z->n_units);
    return DT_OK;
}

static char *dt__pl_at(const dt_tensor *t, int64_t elem) {
    return (char *)t->data + (size_t)elem * dt_dtype_size(t->dtype);
}
static int64_t dt__pl_min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Rows [lo, hi) of param i that rank j owns. */
static void dt__pl_zrows(const dt__pl_zp *p, int j, int64_t *lo, int64_t *hi) {
    *lo = dt__pl_min64(p->rows, (int64_t)j * p->c);
    *hi = dt__pl_min64(p->rows, (int64_t)(j + 1) * p->c);
}

/* ---- stage 0: buckets of whole units over the arena grads, last unit first */

static dt_status dt__pl_zbucket_launch(dt_zero *z, dt__pl_bucket *b) {
    if (b->req || dt_comm_size(z->dp) == 1) return DT_OK; /* in flight already; or one replica */
    return dt_comm_iallreduce(z->dp, &b->view, DT_REDUCE_AVG, &b->req);
}

/* ---- stages 1-3: reduce-scatter of a unit's grads, all-gather of its values */

/* Packs unit u's full grads (the base params' grads) rank-major into u->gpack. */
static void dt__pl_zpack_grads(dt_zero *z, dt__pl_zu *u) {
    int i, j;
    for (j = 0; j < z->N; j++)
        for (i = u->first; i < u->last; i++) {
            const dt__pl_zp *p = &z->zp[i];
            const dt_param *bp = z->a->params->items[i];
            int64_t lo, hi;
            dt__pl_zrows(p, j, &lo, &hi);
            if (hi > lo)
                memcpy(dt__pl_at(&u->gpack, (int64_t)j * u->gblock + p->gpk), dt__pl_at(&bp->grad, lo * p->row_elems),
                       (size_t)((hi - lo) * p->row_elems) * sizeof(float));
        }
}

/* This rank's block of the reduce-scatter into its shard grads: added (stages 2-3, which
   accumulate over micro-steps) or written (stage 1, whose shard grads are the arena's rows). */
static void dt__pl_zgrads_in(dt_zero *z, dt__pl_zu *u, const dt_tensor *out, int add) {
    int i;
    int64_t k;
    for (i = u->first; i < u->last; i++) {
        const dt__pl_zp *p = &z->zp[i];
        float *g = (float *)z->shard.items[i]->grad.data;
        const float *s = (const float *)out->data + p->gpk;
        int64_t n = p->n * p->row_elems;
        if (add) for (k = 0; k < n; k++) g[k] += s[k];
        else if (n) memcpy(g, s, (size_t)n * sizeof(float));
    }
}

/* Posts unit u's reduce-scatter (stages 2-3) from its full grads, which it then gives back. */
static dt_status dt__pl_zrs_post(dt_zero *z, dt__pl_zu *u) {
    dt_status st;
    int i;
    DT__PL_TRY(dt__pl_ztake(z, &u->gpack, DT_F32, (int64_t)z->N * u->gblock, &z->live_comm));
    st = dt__pl_ztake(z, &u->gout, DT_F32, u->gblock, &z->live_comm);
    if (st) { dt__pl_zgive(z, &u->gpack, &z->live_comm); return st; }
    dt__pl_zpack_grads(z, u);
    dt__pl_zgive(z, &u->gfull, &z->live_grad);
    for (i = u->first; i < u->last; i++) z->a->params->items[i]->grad.data = NULL;
    st = dt_comm_ireduce_scatter(z->dp, &u->gout, &u->gpack, DT_REDUCE_AVG, &u->greq);
    if (st) {
        dt__pl_zgive(z, &u->gpack, &z->live_comm);
        dt__pl_zgive(z, &u->gout, &z->live_comm);
    }
    return st;
}

/* Waits for unit u's reduce-scatter and adds this rank's block into the shard grads. */
static dt_status dt__pl_zrs_finish(dt_zero *z, dt__pl_zu *u) {
    dt_status st;
    if (!u->greq) return DT_OK;
    st = dt_comm_wait(u->greq);
    u->greq = NULL;
    if (!st) dt__pl_zgrads_in(z, u, &u->gout, 1);
    dt__pl_zgive(z, &u->gpack, &z->live_comm);
    dt__pl_zgive(z, &u->gout, &z->live_comm);
    return st;
}

/* Finishes the reduce-scatters that are complete, in unit order (they progress meanwhile). */
static dt_status dt__pl_zpoll(dt_zero *z) {
    int k, done;
    for (k = 0; k < z->n_units; k++) {
        dt__pl_zu *u = &z->zu[k];
        if (!u->greq) continue;
        DT__PL_TRY(dt_comm_test(u->greq, &done));
        if (done) DT__PL_TRY(dt__pl_zrs_finish(z, u));
    }
    return DT_OK;
}

/* Stage 1 at the step: unit u's accumulated full grads, averaged over dp, this rank's rows
   written into the arena (blocking). */
static dt_status dt__pl_zrs_stage1(dt_zero *z, dt__pl_zu *u) {
    dt_status st;
    DT__PL_TRY(dt__pl_ztake(z, &u->gpack, DT_F32, (int64_t)z->N * u->gblock, &z->live_comm));
    st = dt__pl_ztake(z, &u->gout, DT_F32, u->gblock, &z->live_comm);
    if (!st) {
        dt__pl_zpack_grads(z, u);
        st = dt_comm_reduce_scatter(z->dp, &u->gout, &u->gpack, DT_REDUCE_AVG);
    }
    if (!st) dt__pl_zgrads_in(z, u, &u->gout, 0);
    dt__pl_zgive(z, &u->gpack, &z->live_comm);
    dt__pl_zgive(z, &u->gout, &z->live_comm);
    return st;
}

/* Posts the all-gather of unit u's values of dtype t: this rank's rows (its shard params'
   values) into its block of vpack, the others' blocks arrive. */
static dt_status dt__pl_zag_post(dt_zero *z, dt__pl_zu *u, int t) {
    dt_tensor mine;
    int i;
    dt_status st;
    DT__PL_TRY(dt__pl_ztake(z, &u->vpack[t], (dt_dtype)t, (int64_t)z->N * u->vblock[t], &z->live_comm));
    for (i = u->first; i < u->last; i++) {
        const dt__pl_zp *p = &z->zp[i];
        const dt_param *sp = z->shard.items[i];
        if ((int)sp->value.dtype == t && p->n)
            memcpy(dt__pl_at(&u->vpack[t], (int64_t)z->r * u->vblock[t] + p->vpk), sp->value.data,
                   dt_tensor_bytes(&sp->value));
    }
    st = dt_tensor_view(z->ctx, &mine, &u->vpack[t], (int64_t)z->r * u->vblock[t], 1, &u->vblock[t]);
    if (!st) st = dt_comm_iallgather(z->dp, &u->vpack[t], &mine, &u->vreq[t]);
    if (st) dt__pl_zgive(z, &u->vpack[t], &z->live_comm);
    return st;
}

/* Unpacks every rank's rows of dtype t from vpack into the base params' values. */
static void dt__pl_zag_unpack(dt_zero *z, dt__pl_zu *u, int t) {
    int i, j;
    for (j = 0; j < z->N; j++)
        for (i = u->first; i < u->last; i++) {
            const dt__pl_zp *p = &z->zp[i];
            const dt_param *bp = z->a->params->items[i];
            size_t sz = dt_dtype_size(bp->value.dtype);
            int64_t lo, hi;
            if ((int)bp->value.dtype != t) continue;
            dt__pl_zrows(p, j, &lo, &hi);
            if (hi > lo)
                memcpy((char *)bp->value.data + (size_t)(lo * p->row_elems) * sz,
                       dt__pl_at(&u->vpack[t], (int64_t)j * u->vblock[t] + p->vpk), (size_t)((hi - lo) * p->row_elems) * sz);
        }
}

/* Posts the all-gathers of unit u (stage 3: a gather or a prefetch). */
static dt_status dt__pl_zgather_post(dt_zero *z, dt__pl_zu *u) {
    int t;
    for (t = 1; t < DT_DTYPE_COUNT; t++)
        if (u->has[t]) DT__PL_TRY(dt__pl_zag_post(z, u, t));
    u->vposted = 1;
    return DT_OK;
}

/* Waits for unit u's all-gathers, puts its full values into fresh unit buffers and points the
   base params at them. keep = 0: a prefetch nobody asked for, dropped. */
static dt_status dt__pl_zgather_finish(dt_zero *z, dt__pl_zu *u, int keep) {
    dt_status st = DT_OK, s2;
    int t, i;
    for (t = 1; t < DT_DTYPE_COUNT; t++) {
        if (!u->vreq[t]) continue;
        s2 = dt_comm_wait(u->vreq[t]);
        u->vreq[t] = NULL;
        if (!st) st = s2;
    }
    for (t = 1; t < DT_DTYPE_COUNT && keep && !st; t++) {
        if (!u->vpack[t].data) continue;
        st = dt__pl_ztake(z, &u->vfull[t], (dt_dtype)t, u->vnumel[t], &z->live_param);
        for (i = u->first; i < u->last && !st; i++) {
            dt_param *bp = z->a->params->items[i];
            if ((int)bp->value.dtype == t) bp->value.data = dt__pl_at(&u->vfull[t], z->zp[i].uv);
        }
        if (!st) dt__pl_zag_unpack(z, u, t);
    }
    for (t = 1; t < DT_DTYPE_COUNT; t++) dt__pl_zgive(z, &u->vpack[t], &z->live_comm);
    u->vposted = 0;
    return st;
}

/* Stage 3: gives unit u's full values back; its params' value.data become NULL. */
static void dt__pl_zvalues_drop(dt_zero *z, dt__pl_zu *u) {
    int t, i;
    for (t = 1; t < DT_DTYPE_COUNT; t++) dt__pl_zgive(z, &u->vfull[t], &z->live_param);
    for (i = u->first; i < u->last; i++) z->a->params->items[i]->value.data = NULL;
    u->refs = 0;
}

/* Stages 1-2 after an update, and after a checkpoint load: every unit's full values again. */
static dt_status dt__pl_zallgather_all(dt_zero *z) {
    int k, t;
    dt_status st = DT_OK;
    if (z->N == 1) return DT_OK;
    for (k = 0; k < z->n_units && !st; k++) {
        dt__pl_zu *u = &z->zu[k];
        for (t = 1; t < DT_DTYPE_COUNT && !st; t++) {
            if (!u->has[t]) continue;
            st = dt__pl_zag_post(z, u, t);
            if (!st) {
                st = dt_comm_wait(u->vreq[t]);
                u->vreq[t] = NULL;
            }
            if (!st) dt__pl_zag_unpack(z, u, t);
            dt__pl_zgive(z, &u->vpack[t], &z->live_comm);
        }
    }
    return st;
}

/* Waits for everything in flight (errors ignored: for dt_zero_free). */
static void dt__pl_zdrain(dt_zero *z) {
    int k;
    if (!z->zu) return;
    for (k = 0; k < z->n_buckets; k++)
        if (z->bk[k].req) { dt_comm_wait(z->bk[k].req); z->bk[k].req = NULL; }
    for (k = 0; k < z->n_units; k++) {
        dt__pl_zu *u = &z->zu[k];
        if (u->greq) { dt_comm_wait(u->greq); u->greq = NULL; }
        if (u->vposted) dt__pl_zgather_finish(z, u, 0);
    }
}

static void dt__pl_zero_release(dt_zero *z) {
    int k, t, i;
    dt__pl_zdrain(z);
    for (k = 0; k < z->n_units && z->zu; k++) {
        dt__pl_zu *u = &z->zu[k];
        for (t = 0; t < DT_DTYPE_COUNT; t++) {
            dt__pl_zgive(z, &u->vfull[t], &z->live_param);
            dt__pl_zgive(z, &u->vpack[t], &z->live_comm);
        }
        dt__pl_zgive(z, &u->gfull, &z->live_grad);
        dt__pl_zgive(z, &u->gpack, &z->live_comm);
        dt__pl_zgive(z, &u->gout, &z->live_comm);
    }
    if (z->stage >= 2 && z->zp) /* the base params' grads (and at stage 3 values) lived in ZeRO's buffers */
        for (i = 0; i < z->n_params; i++) {
            z->a->params->items[i]->grad.data = NULL;
            if (z->stage == 3) z->a->params->items[i]->value.data = NULL;
        }
    dt_opt_free(z->opt);
    dt_params_free(z->ctx, &z->shard); /* views: only the dt_param structs are freed */
    dt_tensor_free(z->ctx, &z->sgrad);
    for (t = 0; t < DT_DTYPE_COUNT; t++) dt_tensor_free(z->ctx, &z->sval[t]);
    dt_release(z->ctx, z->param_comms);
    dt_release(z->ctx, z->zp);
    dt_release(z->ctx, z->zu);
    dt_release(z->ctx, z->bk);
    dt_release(z->ctx, z);
}

/* Geometry of every parameter and unit (see the top of this section). */
static dt_status dt__pl_zgeometry(dt_zero *z, const char *fn) {
    const dt_params *ps = z->a->params;
    int64_t sg = 0, sv[DT_DTYPE_COUNT];
    int i, k, t;
    for (t = 0; t < DT_DTYPE_COUNT; t++) sv[t] = 0;
    for (k = 0; k < z->n_units; k++) {
        dt__pl_zu *u = &z->zu[k];
        int64_t tot = 0;
        u->first = z->a->unit_first[k];
        u->last = z->a->unit_first[k + 1];
        for (i = u->first; i < u->last; i++) {
            const dt_param *bp = ps->items[i];
            dt__pl_zp *p = &z->zp[i];
            int64_t e = 1, blk, d;
            t = (int)bp->value.dtype;
            for (d = 1; d < bp->value.ndim; d++) e *= bp->value.shape[d]; /* a factor of numel: fits */
            p->rows = bp->value.ndim ? bp->value.shape[0] : 1;
            p->row_elems = e;
            p->c = (p->rows + z->N - 1) / z->N;
            dt__pl_zrows(p, z->r, &p->lo, &d);
            p->n = d - p->lo;
            if (!dt_mul_ok(p->c, e, &blk))
                return dt_ctx_set_error(z->ctx, DT_ERR_ARG, "%s: \"%s\": %lld rows x %lld elements overflow", fn,
                                        bp->name, (long long)p->c, (long long)e);
            p->gpk = u->gblock;
            p->vpk = u->vblock[t];
            p->ug = u->gnumel;
            p->uv = u->vnumel[t];
            p->sg = sg;
            p->sv = sv[t];
            u->gblock += blk;
            u->vblock[t] += blk;
            u->gnumel += bp->value.numel;
            u->vnumel[t] += bp->value.numel;
            u->has[t] = 1;
            sg += p->n * e;
            sv[t] += p->n * e;
        }
        if (!dt_mul_ok(u->gblock, z->N, &tot) || tot > ((int64_t)1 << 40))
            return dt_ctx_set_error(z->ctx, DT_ERR_ARG, "%s: unit %d: %d blocks of %lld elements are too many for one "
                                    "collective", fn, k, z->N, (long long)u->gblock);
    }
    return DT_OK;
}

/* The optimizer's parameter set: one dt_param per base param, views of this rank's rows. */
static dt_status dt__pl_zshard_set(dt_zero *z) {
    dt_params *ps = z->a->params;
    int i, d;
    z->shard.items = (dt_param **)dt__pl_alloc_n(z->ctx, z->n_params, sizeof(dt_param *), "dt_zero_create", "params");
    if (!z->shard.items) return DT_ERR_OOM;
    z->shard.capacity = z->n_params;
    for (i = 0; i < z->n_params; i++) {
        const dt_param *bp = ps->items[i];
        const dt__pl_zp *p = &z->zp[i];
        dt_param *sp = (dt_param *)dt_alloc(z->ctx, sizeof *sp);
        int64_t shape[DT_MAX_DIMS];
        dt_status st;
        if (!sp) return DT_ERR_OOM;
        memset(sp, 0, sizeof *sp);
        z->shard.items[z->shard.count++] = sp;
        memcpy(sp->name, bp->name, sizeof sp->name);
        for (d = 0; d < DT_MAX_DIMS; d++) {
            shape[d] = bp->value.shape[d];
            sp->global_shape[d] = bp->global_shape[d];
            sp->start[d] = bp->start[d];
        }
        shape[0] = p->n;
        sp->start[0] += p->lo;
        sp->sharded = bp->sharded || z->N > 1; /* the same on every rank, even where this slice is whole */
        sp->no_decay = bp->no_decay;
        sp->group = bp->group;
        if (z->stage == 3)
            st = dt_tensor_view(z->ctx, &sp->value, &z->sval[bp->value.dtype], p->sv, bp->value.ndim, shape);
        else
            st = dt_tensor_view(z->ctx, &sp->value, &z->a->values[bp->value.dtype],
                                z->a->value_offset[i] + p->lo * p->row_elems, bp->value.ndim, shape);
        if (!st && z->stage >= 2) st = dt_tensor_view(z->ctx, &sp->grad, &z->sgrad, p->sg, bp->value.ndim, shape);
        else if (!st)
            st = dt_tensor_view(z->ctx, &sp->grad, &z->a->grads, z->a->grad_offset[i] + p->lo * p->row_elems,
                                bp->value.ndim, shape);
        if (st) return st;
        /* stage 3: this rank's rows become its copy of the values (the arena's go at the end) */
        if (z->stage == 3 && p->n)
            memcpy(sp->value.data, (const char *)bp->value.data + (size_t)(p->lo * p->row_elems) *
                   dt_dtype_size(bp->value.dtype), dt_tensor_bytes(&sp->value));
        z->param_comms[i] = z->stage == 0 ? (bp->sharded ? z->l->tp_comm : NULL)
                                          : (bp->sharded ? z->l->dptp_comm : z->l->dp_comm);
    }
    return DT_OK;
}

/* Stage 0's buckets: whole units from the last one back, up to bucket_bytes of grads each. */
static dt_status dt__pl_zbuckets(dt_zero *z) {
    int k, nb = 0;
    int64_t bytes = 0;
    z->bk = (dt__pl_bucket *)dt__pl_alloc_n(z->ctx, z->n_units, sizeof(dt__pl_bucket), "dt_zero_create", "buckets");
    if (!z->bk) return DT_ERR_OOM;
    for (k = z->n_units - 1; k >= 0; k--) {
        int64_t ub = z->zu[k].gnumel * 4;
        if (nb > 0 && bytes + ub > z->bucket_bytes) { /* close the open bucket */
            bytes = 0;
            z->bk[nb - 1].ulo = k + 1;
            nb++;
            z->bk[nb - 1].uhi = k;
        }
        if (nb == 0) { nb = 1; z->bk[0].uhi = k; }
        bytes += ub;
        z->zu[k].bucket = nb - 1;
    }
    if (nb > 0) z->bk[nb - 1].ulo = 0;
    z->n_buckets = nb;
    for (k = 0; k < nb; k++) {
        dt__pl_bucket *b = &z->bk[k];
        int64_t from = z->a->grad_offset[z->zu[b->ulo].first];
        int64_t to = z->zu[b->uhi].last < z->n_params ? z->a->grad_offset[z->zu[b->uhi].last] : z->a->grads.numel;
        int64_t len = to - from;
        DT__PL_TRY(dt_tensor_view(z->ctx, &b->view, &z->a->grads, from, 1, &len));
    }
    return DT_OK;
}

DT_API dt_status dt_zero_create(dt_layout *l, dt_zero **out, dt_arena *a, const dt_zero_desc *desc) {
    const char *fn = "dt_zero_create";
    dt_zero_desc d;
    dt_zero *z;
    dt_opt_desc od;
    dt_ctx *ctx;
    int i, t;
    dt_status st = DT_OK;
    if (!l) return DT_ERR_ARG;
    ctx = l->ctx;
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!a) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: a is NULL", fn);
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (d.stage < 0 || d.stage > 3)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.stage = %d; expected 0 (DDP), 1, 2 or 3", fn, d.stage);
    if (d.bucket_bytes < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.bucket_bytes = %lld; expected >= 0 (0 = 25 MB)", fn,
                                (long long)d.bucket_bytes);
    if (d.prefetch < -1 || d.prefetch > 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.prefetch = %d; expected 0 (default, on), 1 (on) or -1 "
                                "(off)", fn, d.prefetch);
    for (i = 0; i < a->params->count; i++) {
        const dt_param *p = a->params->items[i];
        if (!p->value.data || !p->grad.data)
            return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: parameter \"%s\" has no %s: the arena is already used by "
                                    "a ZeRO object of stage 2 or 3 (one per arena)", fn, p->name,
                                    p->value.data ? "grad" : "value");
    }
    z = (dt_zero *)dt_alloc(ctx, sizeof *z);
    if (!z) return DT_ERR_OOM;
    memset(z, 0, sizeof *z);
    z->ctx = ctx;
    z->l = l;
    z->a = a;
    z->dp = l->dp_comm;
    z->stage = d.stage;
    z->N = d.stage == 0 ? 1 : l->dp;
    z->r = d.stage == 0 ? 0 : l->dp_rank;
    z->n_params = a->params->count;
    z->n_units = a->n_units;
    z->prefetch = d.prefetch != -1;
    z->bucket_bytes = d.bucket_bytes ? d.bucket_bytes : (int64_t)25 << 20;
    z->sync = 1;
    z->zp = (dt__pl_zp *)dt__pl_alloc_n(ctx, z->n_params, sizeof(dt__pl_zp), fn, "params");
    z->zu = (dt__pl_zu *)dt__pl_alloc_n(ctx, z->n_units, sizeof(dt__pl_zu), fn, "units");
    z->param_comms = (dt_comm **)dt__pl_alloc_n(ctx, z->n_params, sizeof(dt_comm *), fn, "comms");
    if (!z->zp || !z->zu || !z->param_comms) st = DT_ERR_OOM;
    if (!st) st = dt__pl_zgeometry(z, fn);
    if (!st && z->stage >= 2) {
        int64_t n = 0;
        for (i = 0; i < z->n_params; i++) n += z->zp[i].n * z->zp[i].row_elems;
        st = dt__pl_ztake(z, &z->sgrad, DT_F32, n, &z->base_grad);
    }
    for (t = 1; t < DT_DTYPE_COUNT && !st && z->stage == 3; t++) {
        int64_t n = 0;
        int any = 0;
        for (i = 0; i < z->n_params; i++)
            if ((int)a->params->items[i]->value.dtype == t) {
                n += z->zp[i].n * z->zp[i].row_elems;
                any = 1; /* even when this rank's rows are none: its params' views look into it */
            }
        if (any) st = dt__pl_ztake(z, &z->sval[t], (dt_dtype)t, n, &z->base_param);
    }
    if (!st) st = dt__pl_zshard_set(z);
    if (!st && z->stage == 0) st = dt__pl_zbuckets(z);
    if (!st) {
        od = d.opt;
        od.comm = l->world;
        od.norm.shard_comm = z->stage == 0 ? l->tp_comm : l->dp_comm;
        od.norm.param_comms = z->param_comms;
        od.norm.stage_comm = l->pp_comm;
        st = dt_opt_create(ctx, &z->opt, &z->shard, &od);
    }
    if (st) {
        z->stage = -1; /* nothing of the arena was taken yet */
        dt__pl_zero_release(z);
        return st;
    }
    /* nothing fails from here: take what the stage shards away from the arena */
    if (z->stage < 3)
        for (t = 1; t < DT_DTYPE_COUNT; t++) z->base_param += dt_tensor_bytes(&a->values[t]);
    if (z->stage < 2) {
        z->base_grad += dt_tensor_bytes(&a->grads);
        dt_tensor_fill(ctx, &a->grads, 0.0);
    }
    if (z->stage >= 2) {
        dt_tensor_free(ctx, &a->grads);
        for (i = 0; i < z->n_params; i++) a->params->items[i]->grad.data = NULL;
    }
    if (z->stage == 3) {
        for (t = 1; t < DT_DTYPE_COUNT; t++) dt_tensor_free(ctx, &a->values[t]);
        for (i = 0; i < z->n_params; i++) a->params->items[i]->value.data = NULL;
    }
    z->peak = 0;
    dt__pl_znote(z);
    *out = z;
    return DT_OK;
}

DT_API void dt_zero_free(dt_zero *z) {
    if (z) dt__pl_zero_release(z);
}

DT_API dt_optimizer *dt_zero_optimizer(dt_zero *z) { return z ? z->opt : NULL; }

DT_API dt_status dt_zero_micro_begin(dt_zero *z, float *dloss, int micro) {
    if (!z) return DT_ERR_ARG;
    DT__PL_TRY(dt_opt_micro_begin(z->opt, dloss, NULL, micro));
    z->sync = micro == z->opt->desc.accum_steps - 1;
    z->backward = 0;
    return DT_OK;
}

DT_API dt_status dt_zero_backward_begin(dt_zero *z) {
    int k;
    if (!z) return DT_ERR_ARG;
    z->backward = 1;
    for (k = 0; k < z->n_units; k++) z->zu[k].ready = 0;
    return DT_OK;
}

DT_API dt_status dt_zero_gather(dt_zero *z, int unit) {
    const char *fn = "dt_zero_gather";
    dt__pl_zu *u;
    int i;
    if (!z) return DT_ERR_ARG;
    DT__PL_TRY(dt__pl_zunit_arg(z, unit, fn));
    u = &z->zu[unit];
    if (z->stage == 0 && z->backward && z->sync && z->bk[u->bucket].req)
        return dt_ctx_set_error(z->ctx, DT_ERR_STATE, "%s: unit %d's grads are being all-reduced (dt_zero_grad_ready "
                                "was called for it in this backward); call grad_ready after a unit's last use", fn,
                                unit);
    if (z->stage >= 2 && z->backward && !u->gfull.data) { /* its full grads, from the first gather on */
        DT__PL_TRY(dt__pl_ztake(z, &u->gfull, DT_F32, u->gnumel, &z->live_grad));
        for (i = u->first; i < u->last; i++)
            z->a->params->items[i]->grad.data = dt__pl_at(&u->gfull, z->zp[i].ug);
    }
    if (z->stage == 3) {
        if (!u->refs) {
            if (!u->vposted) DT__PL_TRY(dt__pl_zgather_post(z, u));
            DT__PL_TRY(dt__pl_zgather_finish(z, u, 1));
        }
        u->refs++;
        if (z->prefetch) { /* the next unit in call order: forward goes up, backward down */
            int v = z->backward ? unit - 1 : unit + 1;
            if (v >= 0 && v < z->n_units && !z->zu[v].refs && !z->zu[v].vposted)
                DT__PL_TRY(dt__pl_zgather_post(z, &z->zu[v]));
        }
    }
    return DT_OK;
}

DT_API dt_status dt_zero_release(dt_zero *z, int unit) {
    dt__pl_zu *u;
    if (!z) return DT_ERR_ARG;
    DT__PL_TRY(dt__pl_zunit_arg(z, unit, "dt_zero_release"));
    u = &z->zu[unit];
    if (z->stage == 3 && u->refs > 0 && --u->refs == 0) dt__pl_zvalues_drop(z, u);
    return DT_OK;
}

DT_API dt_status dt_zero_grad_ready(dt_zero *z, int unit) {
    const char *fn = "dt_zero_grad_ready";
    dt__pl_zu *u;
    if (!z) return DT_ERR_ARG;
    DT__PL_TRY(dt__pl_zunit_arg(z, unit, fn));
    u = &z->zu[unit];
    if (z->stage == 0) {
        dt__pl_bucket *b = &z->bk[u->bucket];
        int k, all = 1;
        if (!z->sync) return DT_OK; /* an accumulation micro-step: grads stay local */
        if (b->req)
            return dt_ctx_set_error(z->ctx, DT_ERR_STATE, "%s: unit %d: its bucket is already being all-reduced in "
                                    "this backward", fn, unit);
        u->ready = 1;
        for (k = b->ulo; k <= b->uhi; k++) all &= z->zu[k].ready;
        return all ? dt__pl_zbucket_launch(z, b) : DT_OK;
    }
    if (z->stage == 1) return DT_OK;
    u->ready = 1;
    if (u->gfull.data) {
        if (u->greq) DT__PL_TRY(dt__pl_zrs_finish(z, u)); /* a second use of the unit in this backward */
        DT__PL_TRY(dt__pl_zrs_post(z, u));
    }
    return dt__pl_zpoll(z);
}

DT_API dt_status dt_zero_step(dt_zero *z, dt_opt_step_info *info) {
    dt_opt_step_info inf;
    dt_status st = DT_OK;
    int k;
    if (!z) return DT_ERR_ARG;
    /* 1. finish the gradient sync */
    if (z->stage == 0) {
        for (k = 0; k < z->n_buckets && !st; k++) st = dt__pl_zbucket_launch(z, &z->bk[k]);
        for (k = 0; k < z->n_buckets; k++)
            if (z->bk[k].req) {
                dt_status s2 = dt_comm_wait(z->bk[k].req);
                z->bk[k].req = NULL;
                if (!st) st = s2;
            }
    } else if (z->stage == 1) {
        for (k = 0; k < z->n_units && !st; k++) st = dt__pl_zrs_stage1(z, &z->zu[k]);
    } else {
        for (k = z->n_units - 1; k >= 0 && !st; k--) /* units whose grad_ready never came */
            if (z->zu[k].gfull.data) {
                if (z->zu[k].greq) st = dt__pl_zrs_finish(z, &z->zu[k]);
                if (!st) st = dt__pl_zrs_post(z, &z->zu[k]);
            }
        for (k = 0; k < z->n_units && !st; k++) st = dt__pl_zrs_finish(z, &z->zu[k]);
        for (k = 0; k < z->n_units && !st && z->stage == 3; k++) {
            dt__pl_zu *u = &z->zu[k];
            if (u->vposted) st = dt__pl_zgather_finish(z, u, 0); /* a prefetch nobody used */
            if (u->refs) dt__pl_zvalues_drop(z, u);               /* stale after the update */
        }
    }
    if (st) return st;
    /* 2. the update of this rank's rows (clipping, loss scaling, master weights: dt_opt_step) */
    memset(&inf, 0, sizeof inf);
    st = dt_opt_step(z->opt, info ? &inf : NULL);
    if (info) *info = inf;
    dt__pl_znote(z);
    /* 3. everybody's updated rows (stages 1-2); stage 3 gathers on demand */
    if (!st && (z->stage == 1 || z->stage == 2)) st = dt__pl_zallgather_all(z);
    /* 4. clean grads for the next step */
    if (z->stage < 2) dt_tensor_fill(z->ctx, &z->a->grads, 0.0);
    else dt_tensor_fill(z->ctx, &z->sgrad, 0.0);
    for (k = 0; k < z->n_units; k++) z->zu[k].ready = 0;
    z->backward = 0;
    return st;
}

DT_API dt_status dt_zero_memory_get(dt_zero *z, dt_zero_memory *out) {
    dt_zero_memory m;
    double psi = 0, vb = 0, mb = 0, sb = 0, N, cv, cg, cm;
    int i, k;
    if (!z) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(z->ctx, DT_ERR_ARG, "dt_zero_memory_get: out is NULL");
    memset(&m, 0, sizeof m);
    for (i = 0; i < z->n_params; i++) {
        const dt_param *bp = z->a->params->items[i];
        double n = (double)bp->value.numel;
        psi += n;
        vb += n * (double)dt_dtype_size(bp->value.dtype);
        if (bp->value.dtype != DT_F32) mb += 4 * n;
    }
    k = z->opt->desc.kind;
    sb = psi * 4 * (k == DT_OPT_SGD ? (z->opt->desc.momentum != 0 ? 1 : 0) : k == DT_OPT_ADAGRAD ? 1 : 2);
    m.psi = (int64_t)psi;
    m.param_bytes = z->base_param + z->live_param;
    m.grad_bytes = z->base_grad + z->live_grad;
    for (i = 0; i < z->opt->n_slots; i++) {
        m.master_bytes += dt_tensor_bytes(&z->opt->slots[i].master);
        m.state_bytes += dt_tensor_bytes(&z->opt->slots[i].state[0]) + dt_tensor_bytes(&z->opt->slots[i].state[1]);
    }
    m.total_bytes = m.param_bytes + m.grad_bytes + m.master_bytes + m.state_bytes + z->live_comm;
    m.peak_bytes = z->peak > m.total_bytes ? z->peak : m.total_bytes;
    /* per psi: values cv, grads 4 (dt's grads are f32), master + state cm */
    N = z->l->dp;
    cv = psi > 0 ? vb / psi : 0;
    cg = 4;
    cm = psi > 0 ? (mb + sb) / psi : 0;
    switch (z->stage) {
    case 0: m.formula_bytes = psi * (cv + cg + cm); break;
    case 1: m.formula_bytes = psi * (cv + cg) + psi * cm / N; break;
    case 2: m.formula_bytes = psi * cv + psi * (cg + cm) / N; break;
    default: m.formula_bytes = psi * (cv + cg + cm) / N; break;
    }
    switch (z->stage) {
    case 0: snprintf(z->formula, sizeof z->formula, "%gpsi", cv + cg + cm); break;
    case 1: snprintf(z->formula, sizeof z->formula, "%gpsi + %gpsi/N", cv + cg, cm); break;
    case 2: snprintf(z->formula, sizeof z->formula, "%gpsi + %gpsi/N", cv, cg + cm); break;
    default: snprintf(z->formula, sizeof z->formula, "%gpsi/N", cv + cg + cm); break;
    }
    m.formula = z->formula;
    *out = m;
    return DT_OK;
}

DT_API dt_status dt_zero_checkpoint_save(dt_zero *z, const dt_train_state *state, const dt_checkpoint_desc *desc) {
    dt_checkpoint_desc d;
    char lay[64];
    if (!z) return DT_ERR_ARG;
    if (!desc) return dt_ctx_set_error(z->ctx, DT_ERR_ARG, "dt_zero_checkpoint_save: desc is NULL");
    d = *desc;
    d.comm = z->l->world;
    d.layout = dt_layout_string(z->l, lay, sizeof lay);
    return dt_checkpoint_save(z->ctx, &z->shard, z->opt, state, &d);
}

DT_API dt_status dt_zero_checkpoint_load(dt_zero *z, dt_train_state *state, const dt_checkpoint_desc *desc) {
    dt_checkpoint_desc d;
    char lay[64];
    int k;
    if (!z) return DT_ERR_ARG;
    if (!desc) return dt_ctx_set_error(z->ctx, DT_ERR_ARG, "dt_zero_checkpoint_load: desc is NULL");
    for (k = 0; k < z->n_units; k++)
        if (z->zu[k].refs || z->zu[k].vposted || z->zu[k].gfull.data || z->zu[k].greq)
            return dt_ctx_set_error(z->ctx, DT_ERR_STATE, "dt_zero_checkpoint_load: unit %d is gathered or has grads "
                                    "in flight; load between steps, with every unit released", k);
    d = *desc;
    d.comm = z->l->world;
    d.layout = dt_layout_string(z->l, lay, sizeof lay);
    DT__PL_TRY(dt_checkpoint_load(z->ctx, &z->shard, z->opt, state, &d));
    if (z->stage < 2) dt_tensor_fill(z->ctx, &z->a->grads, 0.0);
    else dt_tensor_fill(z->ctx, &z->sgrad, 0.0);
    /* this rank's rows were loaded; stages 1-2 keep the whole values */
    return z->stage == 1 || z->stage == 2 ? dt__pl_zallgather_all(z) : DT_OK;
}

/* ---------------------------------------------------------------- tensor parallel (impl) */

/* ---------------------------------------------------------------- pipeline (impl) */

/* ---------------------------------------------------------------- timeline (impl)

   Events live in one growable array per rank: compute spans (tid 0, nested through a stack)
   and the operations the attached comms report through their observer (tid 1 + the comm's
   index). dt_trace_write measures each rank's clock offset to rank 0 (ping-pong, see there),
   sends every rank's events to rank 0 as fixed-size records, and rank 0 writes the JSON. */

#define DT__PL_TRACE_COMMS 16
#define DT__PL_TRACE_DEPTH 64
#define DT__PL_TRACE_NAME 48
#define DT__PL_TRACE_PINGS 8

typedef struct dt__pl_event {
    const char *name;   /* compute: the caller's string; comm: dt_coll_name */
    double t0, t1;      /* dt_comm_now seconds; t1 < t0 while a span is open */
    double bytes;
    int tid;
} dt__pl_event;

struct dt_trace {
    dt_ctx *ctx;
    dt_comm *world;
    int rank, size;
    double t_create;
    dt__pl_event *ev;
    int64_t n, cap;
    int stack[DT__PL_TRACE_DEPTH];
    int depth, lost;                    /* lost: events dropped (out of memory, nesting too deep) */
    dt_comm *comms[DT__PL_TRACE_COMMS];
    int n_comms;
};

static dt__pl_event *dt__pl_trace_push(dt_trace *t) {
    if (t->n == t->cap) {
        dt_ctx_clear_error(t->ctx);
        if (dt_grow(t->ctx, (void **)&t->ev, &t->cap, t->n + 1, sizeof(dt__pl_event), "dt_trace") != DT_OK) {
            t->lost++;
            return NULL;
        }
    }
    return &t->ev[t->n++];
}

static void dt__pl_trace_observe(const dt_comm *c, dt_coll kind, double bytes, double t_post, double t_done,
                                 void *user) {
    dt_trace *t = (dt_trace *)user;
    dt__pl_event *e;
    int k;
    for (k = 0; k < t->n_comms && t->comms[k] != c; k++) {}
    if (k == t->n_comms) return;
    e = dt__pl_trace_push(t);
    if (!e) return;
    e->name = dt_coll_name(kind);
    e->t0 = t_post;
    e->t1 = t_done;
    e->bytes = bytes;
    e->tid = 1 + k;
}

DT_API dt_status dt_trace_create(dt_comm *world, dt_trace **out) {
    dt_ctx *ctx;
    dt_trace *t;
    dt_status st;
    if (!world) return DT_ERR_ARG;
    ctx = dt_comm_ctx(world);
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_trace_create: out is NULL");
    *out = NULL;
    st = dt_comm_barrier(world); /* the ranks start together: the picture starts at one moment */
    if (st) return st;
    t = (dt_trace *)dt_alloc(ctx, sizeof *t);
    if (!t) return DT_ERR_OOM;
    memset(t, 0, sizeof *t);
    t->ctx = ctx;
    t->world = world;
    t->rank = dt_comm_rank(world);
    t->size = dt_comm_size(world);
    t->t_create = dt_comm_now();
    *out = t;
    return DT_OK;
}

DT_API void dt_trace_free(dt_trace *t) {
    int k;
    if (!t) return;
    for (k = 0; k < t->n_comms; k++) dt_comm_set_observer(t->comms[k], NULL, NULL);
    dt_release(t->ctx, t->ev);
    dt_release(t->ctx, t);
}

DT_API void dt_trace_begin(dt_trace *t, const char *name) {
    dt__pl_event *e;
    if (!t) return;
    if (t->depth == DT__PL_TRACE_DEPTH) { t->lost++; t->depth++; return; } /* counted, so _end pairs */
    if (t->depth > DT__PL_TRACE_DEPTH) { t->depth++; return; }
    e = dt__pl_trace_push(t);
    if (!e) { t->stack[t->depth++] = -1; return; }
    e->name = name ? name : "(null)";
    e->t0 = dt_comm_now();
    e->t1 = e->t0 - 1;
    e->bytes = 0;
    e->tid = 0;
    t->stack[t->depth++] = (int)(t->n - 1);
}

DT_API void dt_trace_end(dt_trace *t) {
    int i;
    if (!t || t->depth == 0) return;
    if (--t->depth >= DT__PL_TRACE_DEPTH) return;
    i = t->stack[t->depth];
    if (i >= 0) t->ev[i].t1 = dt_comm_now();
}

DT_API dt_status dt_trace_attach(dt_trace *t, dt_comm *c) {
    int k;
    if (!t) return DT_OK;
    if (!c) return dt_ctx_set_error(t->ctx, DT_ERR_ARG, "dt_trace_attach: c is NULL");
    for (k = 0; k < t->n_comms; k++)
        if (t->comms[k] == c) return DT_OK;
    if (t->n_comms == DT__PL_TRACE_COMMS)
        return dt_ctx_set_error(t->ctx, DT_ERR_RANGE, "dt_trace_attach: %d comms are attached already (the most a "
                                "trace follows); cannot add \"%s\"", DT__PL_TRACE_COMMS, dt_comm_name(c));
    t->comms[t->n_comms++] = c;
    return dt_comm_set_observer(c, dt__pl_trace_observe, t);
}

/* Intervals [a, b) of the closed compute spans, sorted and merged (their union). */
static int dt__pl_cmp_ev(const void *x, const void *y) {
    double a = ((const double *)x)[0], b = ((const double *)y)[0];
    return a < b ? -1 : a > b ? 1 : 0;
}

DT_API dt_status dt_trace_overlap(const dt_trace *t, double *comm_seconds, double *overlapped_seconds) {
    double *iv, comm = 0, over = 0;
    int64_t i, n = 0, m = 0, j;
    if (comm_seconds) *comm_seconds = 0;
    if (overlapped_seconds) *overlapped_seconds = 0;
    if (!t) return DT_OK;
    if (!comm_seconds || !overlapped_seconds)
        return dt_ctx_set_error(t->ctx, DT_ERR_ARG, "dt_trace_overlap: %s is NULL",
                                comm_seconds ? "overlapped_seconds" : "comm_seconds");
    iv = (double *)dt__pl_alloc_n(t->ctx, 2 * t->n + 2, sizeof(double), "dt_trace_overlap", "intervals");
    if (!iv) return DT_ERR_OOM;
    for (i = 0; i < t->n; i++)
        if (t->ev[i].tid == 0 && t->ev[i].t1 >= t->ev[i].t0) {
            iv[2 * n] = t->ev[i].t0;
            iv[2 * n + 1] = t->ev[i].t1;
            n++;
        }
    qsort(iv, (size_t)n, 2 * sizeof(double), dt__pl_cmp_ev);
    for (i = 0; i < n; i++) { /* merge in place: m intervals of the union */
        if (m > 0 && iv[2 * i] <= iv[2 * (m - 1) + 1]) {
            if (iv[2 * i + 1] > iv[2 * (m - 1) + 1]) iv[2 * (m - 1) + 1] = iv[2 * i + 1];
        } else {
            iv[2 * m] = iv[2 * i];
            iv[2 * m + 1] = iv[2 * i + 1];
            m++;
        }
    }
    for (i = 0; i < t->n; i++) {
        const dt__pl_event *e = &t->ev[i];
        if (e->tid == 0) continue;
        comm += e->t1 - e->t0;
        for (j = 0; j < m; j++) {
            double a = iv[2 * j] > e->t0 ? iv[2 * j] : e->t0, b = iv[2 * j + 1] < e->t1 ? iv[2 * j + 1] : e->t1;
            if (b > a) over += b - a;
        }
    }
    dt_release(t->ctx, iv);
    *comm_seconds = comm;
    *overlapped_seconds = over;
    return DT_OK;
}

/* One event as sent to rank 0: t0, t1, bytes (f64), tid (i32), then the name. */
#define DT__PL_REC_BYTES (28 + DT__PL_TRACE_NAME)

static void dt__pl_put_f64(unsigned char *p, double v) { memcpy(p, &v, 8); }
static double dt__pl_get_f64(const unsigned char *p) {
    double v;
    memcpy(&v, p, 8);
    return v;
}

/* This rank's offset to rank 0's clock, on rank 0 for every rank: rank 0 sends a ping at a (its
   clock), rank r answers with its clock b, the answer is back at c; offset = b - (a + c) / 2
   from the round trip of the 8 that was shortest (NTP's estimate: exact when the two legs take
   the same time; off by at most half the round trip otherwise). Doubles travel as i64 bits. */
static dt_status dt__pl_trace_offsets(dt_trace *t, double *offs) {
    dt_tensor v;
    dt_tensor_desc td;
    int r, k;
    dt_status st = DT_OK;
    memset(&td, 0, sizeof td);
    td.dtype = DT_I64;
    td.shape[0] = 1;
    DT__PL_TRY(dt_tensor_create(t->ctx, &v, &td));
    offs[0] = 0;
    for (r = 1; r < t->size && !st; r++) {
        double best = HUGE_VAL;
        for (k = 0; k < DT__PL_TRACE_PINGS && !st; k++) {
            if (t->rank == 0) {
                double a = dt_comm_now(), b, c;
                st = dt_comm_send(t->world, &v, r, 901);
                if (!st) st = dt_comm_recv(t->world, &v, r, 902);
                c = dt_comm_now();
                memcpy(&b, v.data, 8);
                if (!st && c - a < best) {
                    best = c - a;
                    offs[r] = b - 0.5 * (a + c);
                }
            } else if (t->rank == r) {
                double b;
                st = dt_comm_recv(t->world, &v, 0, 901);
                b = dt_comm_now();
                memcpy(v.data, &b, 8);
                if (!st) st = dt_comm_send(t->world, &v, 0, 902);
            }
        }
    }
    dt_tensor_free(t->ctx, &v);
    return st;
}

/* Appends rank r's events (n records at rec) to the JSON, on rank 0's clock, in microseconds
   from rank 0's dt_trace_create. */
static void dt__pl_trace_json_rank(dt_trace *t, dt_strbuf *b, int r, const unsigned char *rec, int64_t n,
                                   double off, int *first) {
    int64_t i;
    for (i = 0; i < n; i++) {
        const unsigned char *q = rec + (size_t)i * DT__PL_REC_BYTES;
        double t0 = dt__pl_get_f64(q) - off - t->t_create, t1 = dt__pl_get_f64(q + 8) - off - t->t_create;
        double bytes = dt__pl_get_f64(q + 16);
        int tid = dt__pl_get_u32(q + 24);
        char name[DT__PL_TRACE_NAME + 1];
        memcpy(name, q + 28, DT__PL_TRACE_NAME);
        name[DT__PL_TRACE_NAME] = 0;
        dt_strbuf_printf(b, "%s\n", *first ? "" : ",");
        *first = 0;
        if (t1 < t0) { /* a record of a track's name (t1 < t0 marks it) */
            dt_strbuf_printf(b, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":", r, tid);
            dt_strbuf_json(b, name);
            dt_strbuf_printf(b, "}}");
            continue;
        }
        dt_strbuf_printf(b, "{\"name\":");
        dt_strbuf_json(b, name);
        dt_strbuf_printf(b, ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f", tid ? "comm" : "compute",
                         r, tid, t0 * 1e6, (t1 - t0) * 1e6);
        if (tid) dt_strbuf_printf(b, ",\"args\":{\"bytes\":%.0f}", bytes);
        dt_strbuf_printf(b, "}");
    }
}

/* This rank's closed events plus one name record per track, as DT__PL_REC_BYTES records. */
static dt_status dt__pl_trace_records(dt_trace *t, dt_tensor *out, int64_t *n_out) {
    dt_tensor_desc td;
    int64_t i, n = 0, k;
    unsigned char *q;
    for (i = 0; i < t->n; i++) n += t->ev[i].t1 >= t->ev[i].t0;
    n += 1 + t->n_comms;
    memset(&td, 0, sizeof td);
    td.dtype = DT_U8;
    td.shape[0] = n * DT__PL_REC_BYTES;
    DT__PL_TRY(dt_tensor_create(t->ctx, out, &td));
    q = (unsigned char *)out->data;
    for (k = 0; k <= t->n_comms; k++, q += DT__PL_REC_BYTES) {
        char name[DT__PL_TRACE_NAME + 64];
        if (k == 0) snprintf(name, sizeof name, "compute");
        else snprintf(name, sizeof name, "comm %.40s", dt_comm_name(t->comms[k - 1]));
        dt__pl_put_f64(q, 1);
        dt__pl_put_f64(q + 8, 0);
        dt__pl_put_u32(q + 24, (uint32_t)k);
        memcpy(q + 28, name, DT__PL_TRACE_NAME);
        q[28 + DT__PL_TRACE_NAME - 1] = 0;
    }
    for (i = 0; i < t->n; i++) {
        const dt__pl_event *e = &t->ev[i];
        if (e->t1 < e->t0) continue; /* still open */
        dt__pl_put_f64(q, e->t0);
        dt__pl_put_f64(q + 8, e->t1);
        dt__pl_put_f64(q + 16, e->bytes);
        dt__pl_put_u32(q + 24, (uint32_t)e->tid);
        strncpy((char *)q + 28, e->name, DT__PL_TRACE_NAME - 1);
        q += DT__PL_REC_BYTES;
    }
    *n_out = n;
    return DT_OK;
}

DT_API dt_status dt_trace_write(dt_trace *t, const char *path) {
    const char *fn = "dt_trace_write";
    dt_tensor mine, cnt, theirs;
    dt_tensor_desc td;
    dt_strbuf b;
    double *offs;
    int64_t n = 0, *counts;
    int k, r, first = 1;
    dt_status st, st0 = DT_OK;
    if (!t) return DT_OK;
    if (!path || !path[0]) return dt_ctx_set_error(t->ctx, DT_ERR_ARG, "%s: path is %s", fn, path ? "empty" : "NULL");
    /* the writing's own messages are not part of the picture */
    for (k = 0; k < t->n_comms; k++) dt_comm_set_observer(t->comms[k], NULL, NULL);
    offs = (double *)dt__pl_alloc_n(t->ctx, t->size, sizeof(double), fn, "offsets");
    counts = (int64_t *)dt__pl_alloc_n(t->ctx, t->size, sizeof(int64_t), fn, "counts");
    memset(&mine, 0, sizeof mine);
    memset(&cnt, 0, sizeof cnt);
    memset(&b, 0, sizeof b);
    b.ctx = t->ctx;
    st = offs && counts ? DT_OK : DT_ERR_OOM;
    if (!st) st = dt__pl_trace_offsets(t, offs);
    if (!st) st = dt__pl_trace_records(t, &mine, &n);
    memset(&td, 0, sizeof td);
    td.dtype = DT_I64;
    td.shape[0] = 1;
    if (!st) st = dt_tensor_create(t->ctx, &cnt, &td);
    if (!st && t->rank != 0) { /* count, then the records */
        ((int64_t *)cnt.data)[0] = n;
        st = dt_comm_send(t->world, &cnt, 0, 903);
        if (!st) st = dt_comm_send(t->world, &mine, 0, 904);
    }
    if (!st && t->rank == 0) {
        dt_strbuf_printf(&b, "{\"traceEvents\":[");
        for (r = 0; r < t->size && !st; r++) {
            dt_strbuf_printf(&b, "%s\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}}",
                             first ? "" : ",", r, r);
            first = 0;
            if (r == 0) {
                counts[0] = n;
                dt__pl_trace_json_rank(t, &b, 0, (const unsigned char *)mine.data, n, 0, &first);
                continue;
            }
            st = dt_comm_recv(t->world, &cnt, r, 903);
            if (st) break;
            counts[r] = ((int64_t *)cnt.data)[0];
            memset(&td, 0, sizeof td);
            td.dtype = DT_U8;
            td.shape[0] = counts[r] * DT__PL_REC_BYTES;
            st = dt_tensor_create(t->ctx, &theirs, &td);
            if (!st) st = dt_comm_recv(t->world, &theirs, r, 904);
            if (!st) dt__pl_trace_json_rank(t, &b, r, (const unsigned char *)theirs.data, counts[r], offs[r], &first);
            dt_tensor_free(t->ctx, &theirs);
        }
        dt_strbuf_printf(&b, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"clock\":\"CLOCK_MONOTONIC per rank, "
                         "aligned to rank 0 by ping-pong (best of %d round trips)\",\"clock_offset_s\":[",
                         DT__PL_TRACE_PINGS);
        for (r = 0; r < t->size; r++) dt_strbuf_printf(&b, "%s%.9f", r ? "," : "", offs[r]);
        dt_strbuf_printf(&b, "]}}\n");
        if (!st && b.failed) st = dt_ctx_set_error(t->ctx, DT_ERR_OOM, "%s: out of memory for the JSON", fn);
        if (!st) {
            FILE *f = fopen(path, "wb");
            int bad = !f || fwrite(b.text, 1, b.len, f) != b.len;
            if (f && fclose(f) != 0) bad = 1;
            if (bad) st0 = dt_ctx_set_error(t->ctx, DT_ERR_IO, "%s: cannot write \"%s\"", fn, path);
        }
    }
    /* every rank returns rank 0's verdict on the file */
    if (!st && t->size > 1) {
        ((int64_t *)cnt.data)[0] = st0;
        st = dt_comm_broadcast(t->world, &cnt, 0);
        if (!st && ((int64_t *)cnt.data)[0] && t->rank != 0)
            st = dt_ctx_set_error(t->ctx, DT_ERR_IO, "%s: rank 0 could not write \"%s\"", fn, path);
    }
    if (!st) st = st0;
    dt_strbuf_free(&b);
    dt_tensor_free(t->ctx, &mine);
    dt_tensor_free(t->ctx, &cnt);
    dt_release(t->ctx, offs);
    dt_release(t->ctx, counts);
    for (k = 0; k < t->n_comms; k++) dt_comm_set_observer(t->comms[k], dt__pl_trace_observe, t);
    return st;
}

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
