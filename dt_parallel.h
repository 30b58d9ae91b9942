/* dt_parallel.h - the dense half of hybrid parallelism for the dt toolkit: the dp x cp x tp x pp
   process grid (with ep inside dp x cp), a flat parameter arena, DDP and ZeRO 1-3, Megatron tensor
   and sequence parallel layers, context parallel attention, mixture of experts over ep, pipeline
   schedules and their runtime, a Chrome-trace timeline.  v0.1, MIT licence

   The lesson. A world of dp x cp x tp x pp ranks is a grid, and each axis splits different work.
   Megatron's rank order puts tp innermost, then cp, so a tp group is neighbours on one host:
       rank = tp_rank + TP * (cp_rank + CP * (dp_rank + DP * pp_rank))
   (with cp = 1, the picture below: rank = tp_rank + TP * (dp_rank + DP * pp_rank))

                 pp stage 0       pp stage 1         dp 2 x tp 2 x pp 2 = 8 ranks
                 tp 0   tp 1      tp 0   tp 1
        dp 0     r0 --- r1  ===>  r4 --- r5          ---  tp: one all-reduce per layer pair
                 |      |         |      |           ===> pp: activations on, gradients back
        dp 1     r2 --- r3  ===>  r6 --- r7          |    dp: same weights, gradients averaged

   tp: a column-parallel linear feeds a row-parallel one, so an MLP needs one all-reduce:
        X --> X A_k --> GeLU --> (.) B_k --> Z_k --all-reduce over tp--> Z      (on tp rank k)
   cp: the ranks of a cp group hold the same weights and split each sequence's tokens; attention
   passes K/V around the cp ring (cp_comm). To the gradients they are one more data-parallel
   axis: dt_zero averages and shards over dp x cp (dpcp_comm, rank cp_rank + CP * dp_rank).
   ep: a MoE layer's experts split over ep of the dp x cp ranks (ep x edp = dp x cp); tokens go
   to their top-k experts and back by all-to-all over ep_comm, the experts' grads average over
   the edp ranks that hold the same experts.
   dp: stage 0 is DDP (bucketed all-reduce during backward); ZeRO 1 shards optimizer
   state over dp x cp, 2 also gradients (reduce-scatter per unit), 3 also parameters (gather a
   unit before use, release after).
   pp: micro-batches flow through the stages; 1F1B keeps at most p - s in flight on s:
        stage 0:  F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7          (p = 4, m = 8)
        stage 3:  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7

   Contents (each marker finds this line, its declarations and its implementation):
       >>grid            the grid: dt_layout, its comms, the rank order, dt_layout_batch_range
       >>arena           one flat buffer per dtype for values, one f32 buffer for gradients
       >>zero            data parallel: DDP (stage 0) and ZeRO 1-3, the optimizer inside
       >>tp              tensor and sequence parallel: column / row linear, vocab embedding, xent
       >>cp              context parallel attention: the zigzag ring and Ulysses' all-to-all
       >>moe             mixture of experts: router, top-k, capacity, dispatch / combine over ep
       >>pp              pipeline schedules and the simulator that proves a schedule sound
       >>trace           timeline: compute spans and collectives as one Chrome trace
       >>pprun           pipeline runtime: dt_pp_run runs a schedule through model callbacks
       >>implementation  where the implementation starts

   API in one breath, in the order a training program calls it:
       dt_layout_create          the grid and its dp / cp / tp / pp comms (collective over world)
       dt_layout_batch_range     the global samples this dp rank reads (its cp ranks alike)
       dt_arena_create           the parameters into flat buffers, grouped into units
       dt_zero_create            stage 0-3 over the dp x cp group, with the optimizer inside
       each step                 dt_zero_micro_begin; forward: dt_zero_gather / _release per
                                 unit; dt_zero_backward_begin; backward, last unit first:
                                 gather, dt_zero_grad_ready, release; dt_zero_step
       in the model              dt_tp_column_linear_fwd/_bwd (_gelu_fwd: with the GELU after
                                 it), dt_tp_row_linear_fwd/_bwd,
                                 dt_sp_gather_rows / _scatter_rows, dt_tp_embedding_fwd/_bwd,
                                 dt_tp_xent_fwd/_bwd, dt_tp_allreduce; at cp > 1 attention is
                                 dt_cp_attention_fwd/_bwd (ring) or dt_cp_ulysses_fwd/_bwd;
                                 a MoE MLP is dt_moe_fwd/_bwd (dt_moe_create per layer,
                                 dt_moe_acts_create per micro-batch, dt_moe_step_end each step)
       pipelines                 dt_pp_schedule_create (+ _simulate, _format), dt_pp_split,
                                 dt_pp_run once per step
       timeline                  dt_trace_create, _attach, _begin / _end, _write, _overlap
       checkpoints               dt_zero_checkpoint_save / _load (through dt_opt.h)
       at the end                dt_zero_free, dt_arena_free, dt_layout_free (and the comms)

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
       DT_CUDA             (seen by dt_tensor.h) CUDA tensors work too: an arena of CUDA parameters
                           keeps its buffers on the device, dt_zero packs and syncs them there
                           (dt_tensor_copy / dt_axpy of views, dt_comm on device tensors), and the
                           tp layers run on CUDA tensors, the vocab-parallel embedding and cross
                           entropy through kernels/dt_parallel.cu (link its object). A step
                           stays on the device: ids and targets are checked there (reported at
                           the next dt_ctx_sync or loss read), the cross entropy's per-row values
                           cross tp through dt_comm's device all-reduce (3 floats a row, never
                           the logits) and its loss is read only when asked for, ZeRO reuses
                           its unit buffers (no cudaMalloc / cudaFree after the first step).
                           Checked on the emulator (tests/cuda_emu/k_parallel.cpp, k_gpt.cpp)
                           at one rank, mpi_gpt.cpp at two.

   Memory: every buffer comes from the ctx allocator (dt_zero_memory_get says what a stage
   holds, next to DeepSpeed's formula). Errors: a dt_status, and dt_ctx_error naming the
   argument, the value and what was expected, as in dt_tensor.h. Threads: a layout, arena,
   dt_zero, schedule or trace belongs to one thread at a time, like its comms.

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

/* ==== >>grid: dp x cp x tp x pp, Megatron rank order =============================================

   world = dp x cp x tp x pp ranks in Megatron's order, tp innermost, then cp:
       rank = tp_rank + TP * (cp_rank + CP * (dp_rank + DP * pp_rank))
   so the ranks of a tensor-parallel group are neighbours (one host, the fastest links), and the
   ring of context parallelism comes next. cp ranks hold the same weights but different tokens of
   the same samples: they read the samples of their dp rank, and their gradients are averaged
   together with dp's, over dpcp_comm. With cp = 1 the order is rank = tp + TP * (dp + DP * pp). */

typedef struct dt_layout_desc {
    int dp;   /* 0 = world size / (cp * tp * pp) */
    int tp;   /* 0 = 1 */
    int pp;   /* 0 = 1 */
    int cp;   /* 0 = 1 (after pp, so a {dp, tp, pp} initialiser still reads as before) */
    int ep;   /* 0 = 1: expert parallel, inside dp x cp (it must divide dp * cp; see >>moe) */
} dt_layout_desc;

/* Read the fields; every comm is non-NULL (a group of one where the size is 1), and each is its
   own comm (none aliases another, even where two hold the same ranks). */
struct dt__pp_keep;
struct dt__cp_keep;

typedef struct dt_layout {
    dt_ctx *ctx;
    dt_comm *world;
    int size, rank;                /* of world */
    int dp, tp, pp, cp;            /* resolved sizes, dp * cp * tp * pp = size */
    int dp_rank, tp_rank, pp_rank, cp_rank; /* this rank's coordinates */
    int dpcp, dpcp_rank;           /* dp * cp, and cp_rank + cp * dp_rank: the gradient group */
    int ep, ep_rank, edp, edp_rank; /* experts (>>moe): ep x edp = dp x cp, dpcp_rank = ep_rank + ep * edp_rank */
    dt_comm *dp_comm;    /* same (cp, tp, pp), dp varies: the replicas that read different samples */
    dt_comm *tp_comm;    /* same (dp, cp, pp), tp varies: tensor-parallel collectives */
    dt_comm *pp_comm;    /* same (dp, cp, tp), pp varies: stage-to-stage send / recv (rank = pp_rank) */
    dt_comm *cp_comm;    /* same (dp, tp, pp), cp varies: the ring of context parallelism (rank = cp_rank) */
    dt_comm *dpcp_comm;  /* same (tp, pp): the dp x cp ranks (rank = dpcp_rank), gradient sync and ZeRO
                            shards (cp ranks hold the same weights, different tokens) */
    dt_comm *dptp_comm;  /* same pp: the dp x cp x tp ranks of one stage, rank tp + TP * (cp + CP * dp)
                            (ZeRO shards of tp shards) */
    dt_comm *ep_comm;    /* same (tp, pp, edp_rank): the ranks whose experts a token may visit (rank = ep_rank);
                            MoE's dispatch and combine all-to-alls */
    dt_comm *edp_comm;   /* same (tp, pp, ep_rank): the replicas of one set of experts (rank = edp_rank),
                            where their grads are averaged and ZeRO-sharded */
    dt_comm *eptp_comm;  /* same (pp, edp_rank): ep x tp, rank tp + TP * ep_rank (the norm of expert weights
                            at ZeRO 0: distinct over ep, and over tp where they are split) */
    struct dt__pp_keep *pp_keep; /* private: dt_pp_run's buffers, kept from one run to the next */
    struct dt__cp_keep *cp_keep; /* private: the cp attention's buffers, kept likewise */
} dt_layout;

/* Collective over world. Sizes that do not divide the world are DT_ERR_ARG naming them. Every
   rank must ask for the same layout (after defaults): a difference is DT_ERR_ARG on every rank,
   naming the first size that differs and the ranks (one all-reduce checks it). */
DT_API dt_status dt_layout_create(dt_comm *world, dt_layout **out, const dt_layout_desc *desc);
DT_API void dt_layout_free(dt_layout *l);
/* World rank of the coordinates (-1 when one is out of range); rank_of is rank_at at cp_rank 0. */
DT_API int dt_layout_rank_of(const dt_layout *l, int dp_rank, int tp_rank, int pp_rank);
DT_API int dt_layout_rank_at(const dt_layout *l, int dp_rank, int cp_rank, int tp_rank, int pp_rank);
/* Collective over world: a picture of the grid (every rank's coordinates and host) into out. */
DT_API dt_status dt_layout_describe(dt_layout *l, dt_strbuf *out);
/* "dp=2,tp=2,pp=1" (cp = 1) or "dp=1,cp=2,tp=2,pp=1" (cp > 1) into buf (for
   dt_checkpoint_desc.layout); returns buf. */
DT_API const char *dt_layout_string(const dt_layout *l, char *buf, size_t n);
/* Samples [*first, *first + *count) of a global batch of `global_batch` samples are this dp rank's
   (a contiguous block; the global batch is the same at any dp; the cp ranks of a dp rank read the
   same samples and split their tokens). global_batch not divisible by dp is DT_ERR_ARG. */
DT_API dt_status dt_layout_batch_range(const dt_layout *l, int64_t global_batch, int64_t *first, int64_t *count);

/* ==== >>arena: one flat buffer for values, one for grads =========================================

   llm.c's one contiguous block: the values of every parameter of a set live in one flat buffer
   per dtype, and every gradient in one f32 buffer, in registration order. Each dt_param's value
   and grad become views into them (owns = 0). Parameters are grouped into units (a transformer
   block, the embeddings, the head): the unit is what ZeRO-3 gathers and frees, and what the
   gradient sync launches as one piece. Every parameter must be on one device (cpu, or cuda under
   DT_CUDA): the buffers are made there (a mix is DT_ERR_DEVICE naming the first that differs). */

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
    dt_device device;                 /* the params' device: the buffers live there */
} dt_arena;

/* Moves every parameter of ps into the arena (values kept). ps must not change afterwards. */
DT_API dt_status dt_arena_create(dt_ctx *ctx, dt_arena **out, dt_params *ps, const dt_arena_desc *desc);
/* Frees the buffers: the params' views then point nowhere; free the arena last. NULL is a no-op. */
DT_API void dt_arena_free(dt_arena *a);

/* ==== >>zero: data parallel: DDP (stage 0) and ZeRO 1-3 ==========================================

   One object syncs gradients over the data-parallel group and owns the optimizer. That group is
   l->dpcp_comm, the dp x cp ranks of one (tp, pp) place: cp ranks hold the same weights and see
   different tokens, so to the gradients they are data parallel too (with cp = 1 it is the dp group).
     stage 0  DDP: grads all-reduced (averaged over dp x cp) in buckets, launched by
              dt_zero_grad_ready during backward; the optimizer updates every full parameter.
     stage 1  optimizer state (and the f32 master of bf16/f16 values) sharded over dp x cp: grads are
              reduce-scattered at the step, each rank updates its shard, parameters all-gathered.
     stage 2  as 1, and grads reduce-scattered per unit during backward; only the shard is kept.
     stage 3  as 2, and parameters sharded too (FSDP): dt_zero_gather brings a unit's full
              parameters before its forward and backward, dt_zero_release frees them, and the next
              unit's gather is prefetched while this one computes.
   Shards are whole rows (dim 0) of each tensor, FSDP2's per-parameter sharding: every shard is a
   box of its logical tensor, so dt_opt.h's checkpoints save and reshard them unchanged (a run at
   ZeRO-3 on 4 ranks resumes at ZeRO-0 on 1).

   The design, in detail (stages 1-3; N = l->dpcp = dp x cp, r = l->dpcp_rank):
     - A tensor of R rows: rank r holds rows [r*c, min(R, (r+1)*c)), c = ceil(R / N). A slice may be
       empty ([3, 5] over 4 ranks: 1, 1, 1 and 0 rows); it is a tensor with a 0 dim all the same.
     - The optimizer (dt_opt.h, created inside from desc.opt) runs on a "shard set": one dt_param
       per parameter, same name, value and grad views of this rank's rows, global_shape the
       logical tensor's, start = the parameter's own start (it may already be a tensor-parallel
       slice) plus the row offset, sharded = 1. So clipping, loss scaling, master weights of
       bf16 / f16 values and resharding checkpoints work unchanged. desc.opt's comm becomes the
       world (loss scaling agrees there), norm.param_comms l->dpcp_comm (l->dptp_comm, dp x cp x tp,
       for a parameter that is tensor-parallel sharded), norm.stage_comm l->pp_comm; at stage 0 the
       shard set is the whole parameters and only tensor-parallel ones sum over l->tp_comm.
     - Collectives work on flat ranges: a unit's shards are packed rank-major (rank 0's rows of
       every tensor of the unit, then rank 1's, ...; each padded to c rows so the N blocks are
       equal) for dt_comm_reduce_scatter and dt_comm_allgather, and copied between that packed
       layout and the per-tensor contiguous arena. Cost: one copy of the unit each way per
       collective (memory bandwidth, small beside the network) and a transient packed buffer of
       N blocks of the unit (the padding is at most N - 1 rows per tensor).
     - Gradients are averaged over dp x cp (the loss is a mean over each rank's local batch, and
       cp ranks hold equal shares of its tokens, so that average is the global batch's mean).
     - Stage 0 is dt_comm.h's dt_bucketer, the one bucketed all-reduce (mlp and dlrm use it on
       plain parameter sets; it needs no layout, so it sits below this header), over the arena's
       grads in place (desc.flat: its buckets are views of the arena, no copy): dt_zero_grad_ready
       marks the unit's parameters ready, and a bucket is all-reduced as soon as all of its are
       (dt_comm_iallreduce: the rest of the backward overlaps it). Stage 1 reduce-scatters each
       unit at dt_zero_step, updates its rows and all-gathers the values. Stages 2-3
       reduce-scatter a unit from dt_zero_grad_ready (dt_comm_ireduce_scatter; at most
       DT_ZERO_RS_IN_FLIGHT in flight, finished oldest first when one more is posted, at the next
       micro-step or at the step) and add this rank's block into its shard grads. Stage 3
       keeps only this rank's rows of the values: a gather all-gathers the unit into freshly
       allocated buffers (the next unit in call order is posted ahead, desc.prefetch), a release
       frees them (p->value.data is NULL in between).
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
    int64_t bucket_bytes;      /* stage 0: the dt_bucketer's buckets, bytes; 0 = its defaults (1 MB
                                  first, then 25 MB) */
    int prefetch;              /* stage 3: 0 = default (on), -1 = off */
    dt_opt_desc opt;           /* the optimizer; its comm and norm comms are filled in from the layout */
    const int *expert_units;   /* optional, one entry per arena unit: nonzero = the unit holds this ep rank's
                                  experts (>>moe: dim 0 of each of its params is the expert, split over ep; a
                                  later dim split means tp). Their grads are averaged and ZeRO-sharded over
                                  l->edp_comm, the ranks holding the same experts, instead of dp x cp (the
                                  MoE layer writes their grads already divided by ep, so that average is
                                  the global batch's mean); NULL = none */
} dt_zero_desc;

typedef struct dt_zero dt_zero; /* opaque */

/* Stages 2-3: the reduce-scatters a rank holds in flight at most (their packed grads, N blocks of a
   unit, and dt_comm's scratch). Posting one more first waits for the oldest, and a micro-step's
   dt_zero_micro_begin for all, so the peak is the same every step and run. 1 exposes every
   reduce-scatter's time; more hide more of it behind the backward and hold more memory. */
#ifndef DT_ZERO_RS_IN_FLIGHT
#define DT_ZERO_RS_IN_FLIGHT 2
#endif
#if DT_ZERO_RS_IN_FLIGHT < 1
#error "DT_ZERO_RS_IN_FLIGHT must be at least 1"
#endif

/* Memory of this rank, bytes: what it holds now and at its peak, and DeepSpeed's formula for the
   stage (16 psi baseline, 4 psi + 12 psi / N, 2 psi + 14 psi / N, 16 psi / N for mixed-precision
   Adam; the f32 analogues for f32 training) for comparison. */
typedef struct dt_zero_memory {
    int64_t psi;               /* parameters of the model replica this rank's stage holds a part of */
    size_t param_bytes, grad_bytes, master_bytes, state_bytes, total_bytes;
    size_t peak_bytes;         /* the most this rank held at once (total_bytes plus the transient
                                  gather / reduce-scatter buffers and unit buffers, since create) */
    double formula_bytes;      /* the stage's formula for psi and N = dp x cp */
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
   the buffer back. The order is checked at every stage (DT_ERR_STATE naming the missing call):
   dt_zero_grad_ready or dt_zero_step with no dt_zero_backward_begin since dt_zero_micro_begin,
   dt_zero_grad_ready twice for a unit not gathered again in between, dt_zero_step when some
   units had dt_zero_grad_ready and others not. */
DT_API dt_status dt_zero_backward_begin(dt_zero *z);
DT_API dt_status dt_zero_gather(dt_zero *z, int unit);
DT_API dt_status dt_zero_release(dt_zero *z, int unit);
/* The unit's grads are final for this micro-step: stage 0 may launch its bucket's all-reduce,
   stages 2-3 its reduce-scatter. Optional, but for every unit or none: without it dt_zero_step
   syncs them all. */
DT_API dt_status dt_zero_grad_ready(dt_zero *z, int unit);
/* Finishes the sync, steps the optimizer (clipping, loss scaling as dt_opt_step), all-gathers
   updated parameters (stages 1-2) and zeroes the grads for the next step. */
DT_API dt_status dt_zero_step(dt_zero *z, dt_opt_step_info *info);
DT_API dt_status dt_zero_memory_get(dt_zero *z, dt_zero_memory *out);
/* Checkpoints of the parameters and the (sharded) optimizer through dt_opt.h, collective over
   the world; desc.comm and desc.layout are filled in. Load between steps, every unit released
   (a gathered unit, or grads not yet stepped, are DT_ERR_STATE); stage 3's prefetch of the unit
   after the last one gathered is waited for and dropped. */
DT_API dt_status dt_zero_checkpoint_save(dt_zero *z, const dt_train_state *state, const dt_checkpoint_desc *desc);
DT_API dt_status dt_zero_checkpoint_load(dt_zero *z, dt_train_state *state, const dt_checkpoint_desc *desc);

/* ==== >>tp: tensor and sequence parallel layers ==================================================

   Megatron-LM's layers over l->tp_comm. Activations are rows x features ([B, T, C] is B*T rows).
   Without sequence parallelism (sp = 0) the input of a column-parallel linear and the output of
   a row-parallel one are whole on every tp rank. With sp = 1 they are sharded by rows: tp rank
   k holds rows [k*N/tp, (k+1)*N/tp) (N rows divisible by tp), layernorm, dropout and residual
   run on that slice, the all-gather comes before the column-parallel linear and the
   reduce-scatter after the row-parallel one, replacing the all-reduces. Parameters used in the
   sharded region (layernorms, the row-parallel bias) then get partial grads on each tp rank:
   sum them with dt_tp_allreduce before the optimizer step (Megatron does the same).

   The math (Megatron-LM, Shoeybi et al. 2019; sequence parallel, Korthikanti et al. 2022).
   A linear Y = X W^T with W [O, I] can be cut two ways over tp ranks:
     column-parallel  rank k holds rows O_k of W (and of its bias) and computes Y[:, O_k] from the
                      whole X: no communication forward. Backward, dX = sum over k of dY[:, O_k] W_k
                      is a sum of tp partial products: the all-reduce "f" (identity forward,
                      all-reduce backward) sits on its input.
     row-parallel     rank k holds columns I_k of W and the matching columns X[:, I_k] (exactly what
                      a column-parallel layer before it produced), so Y = sum over k of
                      X[:, I_k] W[:, I_k]^T: the all-reduce "g" (all-reduce forward, identity
                      backward) sits on its output. Its bias is whole on every rank and added once,
                      after the sum (added before it, it would count tp times).
   An MLP is column then row (GELU acts elementwise on the column-parallel output, so it needs no
   communication): one all-reduce forward and one backward per block. Attention splits heads:
   the qkv projection is column-parallel over heads, each rank runs dt_attention on its own
   n_head/tp heads, the output projection is row-parallel.
   Sequence parallel replaces each all-reduce by its two halves, reduce-scatter + all-gather: g
   becomes a reduce-scatter onto row shards (the residual, layernorm and dropout that follow run
   on N/tp rows, saving (tp-1)/tp of their activation memory), and the next column-parallel
   linear all-gathers its input rows first; backward, the all-gather's transpose is a
   reduce-scatter and vice versa. The bytes moved are those of the all-reduces.
   The backward of a column-parallel linear needs the gathered input: keep xbuf from the forward,
   or, to keep only the N/tp rows as Megatron-SP does, reuse xbuf elsewhere and gather it again
   with dt_sp_gather_rows just before the backward (one more all-gather, N x I less memory).
   What each rank holds: column-parallel w [O/tp, I], bias [O/tp], output [N, O/tp]; row-parallel
   w [O, I/tp], bias [O] (replicated), input [N, I/tp], output [N, O] or, under sp, [N/tp, O].
   Replicated parameters outside the sharded region (sp = 0: every layernorm and bias) get
   identical grads on every tp rank and need no sync over tp.

   Sum order: every sum over tp goes through dt_comm (rank order, the same on every rank), so the
   results are bitwise the same on every tp rank and from run to run; they equal the
   single-process op within fp32 reassociation. With tp = 1 no function communicates and each
   equals the plain dt_tensor.h op bitwise (the cross entropy within 1e-6, on cuda within the
   bound of its float sums: see dt_tp_xent_fwd).
   Every argument is checked before the first collective, and the checks depend only on what
   the ranks share (shapes, ids, targets), so a bad call fails on every tp rank alike and none is
   left waiting in a collective. (On cuda the ids and targets are checked on the device: the
   collectives run, an id or target out of range contributes nothing, and every rank reports it
   at its next dt_ctx_sync or loss read.)

   Laying out the weights. Column-parallel weights, their biases, the vocab-parallel embedding and
   a vocab-parallel head are cut by rows (dim 0); row-parallel weights by columns (dim 1).
   dt_tp_param_desc fills a dt_param_desc's shape, global_shape and start for each kind, so
   dt_tensor_init gives a shard the values of the matching slice of the full tensor and
   checkpoints store the logical tensor. The qkv projection ([3C, C], rows q | k | v, as
   dt_attention packs them) is the exception: the rows of tp rank k are its heads' rows of q, of k
   and of v, three blocks [k*C/tp, (k+1)*C/tp) + {0, C, 2C}, not one contiguous slice. Register it
   with the logical shape [3, C, C] (bias [3, C]) and shard dim 1 (DT_TP_QKV): the local
   [3, C/tp, C] tensor read as [3C/tp, C] is then q_k | k_k | v_k, the column-parallel output
   [N, 3C/tp] is the packed qkv that dt_attention_fwd takes with n_head/tp heads, and element
   (i, j, c) of [3, C, C] has the flat index of element (i*C + j, c) of [3C, C], so values and
   checkpoints agree with an unsharded [3C, C] weight. (DT_INIT_SCALED_NORMAL's fan-in is
   prod(global_shape[1:]), C*C for [3, C, C]: give such a weight an explicit std, as GPT-2's
   N(0, 0.02) does.) */

/* How a parameter is cut over the tp group (dt_tp_param_desc). */
typedef enum dt_tp_kind {
    DT_TP_DEFAULT = 0,  /* = DT_TP_REPLICATED */
    DT_TP_REPLICATED,   /* whole on every tp rank: layernorms, the row-parallel bias */
    DT_TP_COLUMN,       /* dim 0 cut: column-parallel weight [O, I] and bias [O], the vocab-parallel
                           embedding table / head [Vp, C] */
    DT_TP_ROW,          /* dim 1 cut: row-parallel weight [O, I] */
    DT_TP_QKV,          /* the qkv weight: logical [3, C, C] (global_rows = 3C, global_cols = C) or its
                           bias [3, C] (global_cols = 0), dim 1 (this rank's heads) cut */
    DT_TP_KIND_COUNT
} dt_tp_kind;

/* Fills desc->shape, global_shape, start and ndim (nothing else) for this tp rank's shard of a
   [global_rows, global_cols] parameter (global_cols = 0: a vector [global_rows]) cut as `kind`.
   The cut dim not divisible by tp, global_rows of DT_TP_QKV not divisible by 3, a vector cut as
   DT_TP_ROW, a negative size or a kind out of range are DT_ERR_ARG naming them. */
DT_API dt_status dt_tp_param_desc(const dt_layout *l, dt_param_desc *desc, dt_tp_kind kind, int64_t global_rows,
                                  int64_t global_cols);

/* x = sum over tp of x, in place (Megatron's g forward and f backward). Any float dtype. */
DT_API dt_status dt_tp_allreduce(dt_layout *l, dt_tensor *x);
/* full [N, C] = the row shards [N/tp, C] of every tp rank, in rank order. */
DT_API dt_status dt_sp_gather_rows(dt_layout *l, dt_tensor *full, const dt_tensor *shard);
/* shard [N/tp, C] = this rank's rows of the sum over tp of full [N, C]. */
DT_API dt_status dt_sp_scatter_rows(dt_layout *l, dt_tensor *shard, const dt_tensor *full);

/* Column-parallel linear: w [O/tp, I] and bias [O/tp] are this rank's rows of the [O, I] weight;
   out [N, O/tp] = x_all @ w^T + bias, with x_all = x (sp 0, x [N, I]) or the gathered rows of x
   (sp 1, x [N/tp, I]; x_all is written into xbuf [N, I], kept for the backward).
   bwd: dw += dout^T x_all, dbias += colsum(dout), dx += (dout @ w) summed over tp (sp 0: all-reduce,
   sp 1: reduce-scatter into the row shard; dxbuf [N, I] is the scratch of the sum).
   xbuf may be NULL under sp 0; dxbuf may be NULL when dx is NULL or tp = 1. The sum over tp of dx
   is in flight while dw and dbias are computed (Megatron's overlap). With a bf16 w, x, out and
   dout may be bf16 (dt_linear's bf16 activations and gradients); dx and the sum stay f32. */
DT_API dt_status dt_tp_column_linear_fwd(dt_layout *l, dt_tensor *out, dt_tensor *xbuf, const dt_tensor *x,
                                         const dt_tensor *w, const dt_tensor *bias, int sp);
/* The same with the GELU after it (a transformer's MLP up-projection): pre [N, O/tp] = what
   dt_tp_column_linear_fwd's out would be, out = gelu(pre), through dt_linear_gelu_fwd (one GEMM
   with both epilogues on CUDA). The backward is dt_gelu_bwd, then dt_tp_column_linear_bwd. */
DT_API dt_status dt_tp_column_linear_gelu_fwd(dt_layout *l, dt_tensor *out, dt_tensor *pre, dt_tensor *xbuf,
                                              const dt_tensor *x, const dt_tensor *w, const dt_tensor *bias, int sp);
DT_API dt_status dt_tp_column_linear_bwd(dt_layout *l, dt_tensor *dx, dt_tensor *dw, dt_tensor *dbias,
                                         dt_tensor *dxbuf, const dt_tensor *dout, const dt_tensor *xbuf_or_x,
                                         const dt_tensor *w, int sp);
/* Row-parallel linear: w [O, I/tp] is this rank's columns, bias [O] whole (added after the sum);
   x [N, I/tp]; partial [N, O] = x @ w^T (scratch); out = sum over tp of partial + bias: [N, O]
   (sp 0, all-reduce) or this rank's rows [N/tp, O] (sp 1, reduce-scatter).
   bwd: dout is [N, O] (sp 0) or [N/tp, O] (sp 1, gathered into doutbuf [N, O]);
   dx += dout_all @ w, dw += dout_all^T x, dbias += colsum(dout) (the local rows under sp 1).
   partial may be NULL under sp 0 (the sum is taken in out) or when tp = 1; doutbuf may be NULL
   under sp 0 or when tp = 1. With a bf16 w, x and dx may be bf16 (dx rounded once per call, as
   dt_linear_bwd's); out, partial and dout stay f32 (the residual stream's). */
DT_API dt_status dt_tp_row_linear_fwd(dt_layout *l, dt_tensor *out, dt_tensor *partial, const dt_tensor *x,
                                      const dt_tensor *w, const dt_tensor *bias, int sp);
DT_API dt_status dt_tp_row_linear_bwd(dt_layout *l, dt_tensor *dx, dt_tensor *dw, dt_tensor *dbias,
                                      dt_tensor *doutbuf, const dt_tensor *dout, const dt_tensor *x,
                                      const dt_tensor *w, int sp);
/* Vocab-parallel embedding: table [V/tp, C] holds rows [vocab_start, vocab_start + V/tp) of the
   [V, C] table; ids i32 [N] global; out = sum over tp of the local lookups (ids outside the
   range give 0): [N, C] (sp 0) or this rank's rows [N/tp, C] (sp 1; partial [N, C] scratch).
   bwd: dtable[id - vocab_start] += dout_all[n] for the ids in range (sp 1: dout gathered into
   doutbuf [N, C]). An id outside [0, vocab) is DT_ERR_RANGE.
   V here is the padded vocab tp * table rows (>= vocab, rows >= vocab are padding no id reaches);
   vocab_start must be tp_rank * table rows. ids may also be i64 (on cuda they are checked on the
   device, and an id out of range is reported by the next dt_ctx_sync or loss read). Each output
   row has one non-zero contribution, so the sum over tp is exact: the result equals
   dt_embedding_fwd bitwise, and the backward adds each row's grads in id order on cuda too.
   partial may be NULL under sp 0 or when tp = 1, doutbuf under sp 0 or when tp = 1. */
DT_API dt_status dt_tp_embedding_fwd(dt_layout *l, dt_tensor *out, dt_tensor *partial, const dt_tensor *table,
                                     const dt_tensor *ids, int64_t vocab_start, int64_t vocab, int sp);
DT_API dt_status dt_tp_embedding_bwd(dt_layout *l, dt_tensor *dtable, dt_tensor *doutbuf, const dt_tensor *dout,
                                     const dt_tensor *ids, int64_t vocab_start, int64_t vocab, int sp);
/* Vocab-parallel cross entropy: logits [N, Vp/tp] are this rank's columns [vocab_start, ...) of
   the [N, Vp] logits (Vp >= vocab: columns >= vocab are padding and ignored, as llm.c pads its
   vocab); targets i32 [N], ignore_index skipped. Three reductions over tp (row max, target
   logit, sum of exp); the full logits are never gathered. stats [N, 2] f32 keeps each row's max
   and log-sum-exp for the backward. *loss = mean over non-ignored targets, *n_valid their count.
   bwd: dlogits += dloss / n_valid * (softmax - onehot(target)) on this rank's columns.
   The definition is dt_softmax_xent_fwd's on the first `vocab` columns of the gathered logits
   (0 when no target counts). vocab_start must be tp_rank * (Vp/tp); 1 <= vocab <= Vp; a target
   outside [0, vocab) that is not ignore_index is DT_ERR_RANGE. On the host the reductions run in
   double through dt_comm_allreduce_f64 (the max, then the target logit and the sum of exp
   together in one call); on cuda they stay on the device (f32 per-row values through dt_comm's
   device all-reduce, each rank's sum of exp moved to the global max between the two, the loss
   summed in double by one block), within (columns per thread + log2 threads) ulps of the host's
   per-row sums. Either way every tp rank gets bitwise the same loss. loss and n_valid may be
   NULL; on cuda the loss is left in dt_cuda_loss_slot (loss, then n_valid, as doubles) and is
   read back, with one wait, only when loss is not NULL (*n_valid is filled with it), so a step
   that does not log passes NULL and does not wait. stats may be NULL in the forward (no
   backward to follow). The backward communicates nothing, counts n_valid itself (on the device
   on cuda) and WRITES dlogits (it does not add to it, unlike dt's other backward ops, so the
   caller need not zero it): dloss / n_valid (softmax - onehot) on the real columns of the rows
   not ignored, 0 on padding columns and ignored rows. It reads each logit before writing its
   gradient, so dlogits may be logits itself (in place, as llm.c's classifier: the logits are
   gone after it). On cuda it is one pass, a block per row. */
DT_API dt_status dt_tp_xent_fwd(dt_layout *l, float *loss, int64_t *n_valid, dt_tensor *stats,
                                const dt_tensor *logits, const dt_tensor *targets, int64_t vocab_start,
                                int64_t vocab, int ignore_index);
DT_API dt_status dt_tp_xent_bwd(dt_layout *l, dt_tensor *dlogits, const dt_tensor *logits, const dt_tensor *stats,
                                const dt_tensor *targets, int64_t vocab_start, int64_t vocab, int ignore_index,
                                float dloss);

/* ==== >>cp: context parallel attention: the zigzag ring and Ulysses =============================

   Context parallelism splits the sequence. Every op of a transformer but attention works on its
   own tokens, so a cp rank keeps T / CP tokens of each sequence from the embedding to the loss
   and its activation memory drops by CP; attention needs every earlier token's K and V, and that
   is all cp exchanges. Which tokens: the sequence in 2 CP chunks of c = T / (2 CP), rank r holding
   chunks r and 2CP-1-r (the "zigzag"), so that under the causal mask every rank has the same work:

       T = 16, CP = 2: chunks of 4         chunk:  0    1    2    3
                                           rank:   r0   r1   r1   r0
       rank 0 holds positions 0-3 and 12-15, rank 1 positions 4-11; local row j of rank r sits at
       dt_cp_position(CP, r, T, j). Attention pairs (query, key <= query) per sequence and head:
       rank 0: 10 (chunk 0) + 58 (chunk 3) = 68, rank 1: 26 + 42 = 68.   (2CP - 1) c^2 + 2 c(c+1)/2

   The ring (dt_cp_attention_fwd; Liu et al. 2023, balanced as Megatron-LM's context parallel):
   K/V blocks travel r -> r+1 around the cp group while each rank keeps its queries. At step s
   rank r holds the K/V of rank r - s; it posts the send of that block to r+1 and the receive of
   the next from r-1, then computes its two query chunks against the block's two key chunks
   (dt_attention_block_fwd: a block above the diagonal is skipped, one on it is half), merging each
   into out with the block's logsumexp (the online softmax), and waits for the transfer last:

       step 0: q{r, 2CP-1-r} x kv of r       (the diagonal: 2 half blocks + 1 whole)
       step s: q{r, 2CP-1-r} x kv of r - s   (2 whole blocks, whichever side r - s lies on)
       CP - 1 hops of one block (2 x T/CP x h_kv floats): 2 S h_kv (CP-1)/CP per rank and layer

   Backward (dt_cp_attention_bwd): the same ring with K/V again; a rank adds the dK/dV of its
   queries for the block it holds to the partial sum that came from r-1 (f32) and sends it on, so
   after CP hops every block's dK/dV arrives at its owner summed over all queries (in the ring's
   order). dQ stays local. The backward needs only out and lse (the logsumexp of each row) from
   the forward: nothing [T, T] is kept. Per rank: (CP-1) K/V hops + CP dK/dV hops.

   Ulysses (dt_cp_ulysses_fwd; Jacobs et al. 2023): an all-to-all turns the sequence shards of
   q, k, v into head shards (each rank gets H / CP heads of the whole sequence), attention runs
   as at cp 1 on those heads (dt_attention_fwd, causal by position), and a second all-to-all turns
   the output back. Per rank and layer, (2h + 2h_kv) (S/CP) (CP-1)/CP floats forward (q, k, v
   out, the output back), the same backward. Heads must divide by CP.

   Which wins: per rank the ring sends 2 S h_kv (CP-1)/CP, which tends to 2 S h_kv as CP grows and
   hides behind the block compute; Ulysses sends (2h + 2h_kv) S (CP-1)/CP^2, CP/2 times less for
   MHA (equal at CP 2, half at 4, a quarter at 8), in all-to-alls that cannot overlap attention,
   and CP is capped by the heads. Ulysses inside a fast node with heads to spare; the ring for
   more ranks than heads, for slow links (its hops overlap), and with GQA (h_kv << h).

   Sizes: qkv is this rank's [B, T/CP, W] packed rows (the column-parallel qkv of tp, local row
   order, zigzag): W = (H + 2 Hkv) hs, q | k | v, H query heads of head size hs, Hkv key / value
   heads (0 = H; Hkv divides H). out [B, T/CP, H hs]; lse [B, H, T/CP]. f32, every operand on one
   device: the ring runs on CPU tensors and (under DT_CUDA) on CUDA tensors, its blocks through
   dt_attention_block's kernels, or with a bf16 qkv on CUDA through the tensor cores' flash kernels
   (kernels/dt_flash.cu's block mode: each block merged into out and lse by the lanes that own
   them; K/V travel in bf16, half the bytes; the dK/dV sums in f32), K/V packed and dK/dV added
   by kernels/dt_parallel.cu's column copies,
   each step's send and receive ordered so NCCL cannot deadlock (below); Ulysses too, its row
   moves by kernels/dt_parallel.cu's strided copies (dt_k_cols_copy, dt_k_cp_rows), its attention
   on the tensor cores where uqkv is bf16 (below). Every check depends only
   on shapes the cp ranks share, so a bad call fails on every rank before any message. At cp 1
   both kinds are plain causal attention. */

/* The sequence position of local row j (0 <= j < T/cp) of cp rank r: chunk r or 2cp-1-r of
   2cp chunks of T/(2cp). -1 for arguments out of range (cp < 1, r, j, T not a multiple of 2cp). */
DT_API int64_t dt_cp_position(int cp, int cp_rank, int64_t T, int64_t j);
/* (query, key) pairs under the causal mask that cp rank r's ring forward computes per sequence and
   head, counted over the blocks the ring runs (the same schedule): (2cp - 1) c^2 + c (c + 1) with
   c = T / (2cp), the same on every rank. -1 for arguments out of range (T above 2^31 too). */
DT_API int64_t dt_cp_attention_pairs(int cp, int cp_rank, int64_t T);
/* Ring attention over l->cp_comm: out [B, T/CP, H hs] and lse [B, H, T/CP] (written, not added)
   from qkv [B, T/CP, (H + 2 Hkv) hs] (n_kv_head 0 = n_head). f32; on CUDA qkv may be bf16 (head
   size 16, 32, 64, 96 or 128, compute capability 8.0+): the blocks then run on the tensor cores
   (bf16 products, f32 softmax statistics and sums), out and lse still f32. */
DT_API dt_status dt_cp_attention_fwd(dt_layout *l, dt_tensor *out, dt_tensor *lse, const dt_tensor *qkv, int n_head,
                                     int n_kv_head);
/* dqkv += the gradient of qkv, from dout and the forward's qkv, out and lse. */
DT_API dt_status dt_cp_attention_bwd(dt_layout *l, dt_tensor *dqkv, const dt_tensor *dout, const dt_tensor *qkv,
                                     const dt_tensor *out, const dt_tensor *lse, int n_head, int n_kv_head);
/* Ulysses over l->cp_comm (n_head and n_kv_head divisible by CP, else DT_ERR_ARG): uqkv
   [B, T, (H + 2 Hkv) hs / CP] receives this rank's query heads (cp_rank H/CP ...) and kv heads
   (cp_rank Hkv/CP ...) of the whole sequence in position order, att [B, H/CP, T, T] their scores
   (both kept for the backward), out [B, T/CP, H hs] (written) this rank's rows of every head;
   qkv [B, T/CP, (H + 2 Hkv) hs] (n_kv_head 0 = n_head). Attention is dt_attention_gqa_fwd's.
   On CUDA tensors uqkv may be bf16 with att NULL: the rows arrive in f32 and are rounded once,
   and attention runs the tensor cores' FlashAttention-2 (nothing [T, T] kept; the backward
   recomputes); on the CPU, and in f32, att is required. */
DT_API dt_status dt_cp_ulysses_fwd(dt_layout *l, dt_tensor *out, dt_tensor *uqkv, dt_tensor *att,
                                   const dt_tensor *qkv, int n_head, int n_kv_head);
/* dqkv += the gradient of qkv, from dout and the forward's uqkv and att. */
DT_API dt_status dt_cp_ulysses_bwd(dt_layout *l, dt_tensor *dqkv, const dt_tensor *dout, const dt_tensor *uqkv,
                                   const dt_tensor *att, int n_head, int n_kv_head);
/* What this rank's last ring forward computed: (query, key) pairs per sequence and head, summed
   over the blocks it ran (0 before one). */
DT_API int64_t dt_cp_pairs_done(const dt_layout *l);

/* ==== >>moe: mixture of experts, expert parallel ================================================

   The MLP of a block becomes E experts (each C -> F -> GELU -> C, as the dense MLP) and a router
   sends each token to k of them. The experts live on the ep ranks of l->ep_comm (E / ep each,
   expert e on ep rank e / (E / ep)); tokens travel there and back by all-to-all:

        rank 0 tokens --router--> top-k --+                      +--> experts 0..E/ep-1 --+
                                          |  dispatch            |   (one GEMM each, over |
        rank 1 tokens --router--> top-k --+--all-to-allv-------->+    its tokens)         |
                                                                                          |
        y_t = sum_j g_tj out_tj  <---- combine: the reverse all-to-allv <-----------------+

   Router: logits = x W_r^T (W_r [E, C], f32), p = softmax(logits); the k largest of p (plus the
   balancing bias, below) are chosen, ties broken by the lower expert index; gates g = p of the
   chosen (renorm: divided by their sum, as Mixtral; else as they are, as Switch).
   Capacity (per sequence, so no layout changes which tokens are dropped): each expert keeps at
   most ceil(capacity * seq * k / E) of a sequence's assignments, filled as GShard does (every
   token's first choice in sequence order, then every second choice, ...); a dropped assignment
   adds nothing (the token's residual passes it by). capacity 0: dropless (the only choice at
   cp > 1, where a sequence's tokens are on several ranks; seq is then the rows here, T / cp).
   Balance: DT_MOE_AUX adds Switch / GShard's aux loss  coef * E * sum_e f_e P_e  with f_e the
   share of the step's assignments routed to e and P_e the mean of p_e, both over the global
   batch (every dp, cp and micro-batch's tokens), so neither value nor gradient changes with the
   layout; its gradient needs f of the whole step, so every forward of a step runs before its
   first backward (GPipe, or one micro-batch): otherwise dt_moe_bwd is DT_ERR_STATE. DT_MOE_BIAS
   is DeepSeek-V3's aux-loss-free balance: a per-expert bias added to p for the choice only,
   bias_e += rate * sign(mean load - load_e) after each step (dt_moe_step_end), over the global
   batch likewise.
   Tensor parallel: each expert is cut over tp as the dense MLP (fc by rows, proj by columns);
   every tp rank sees the same rows, so routing and dispatch are the same there, and the output
   is a partial sum the caller all-reduces over tp (as after dt_tp_row_linear_fwd without its
   all-reduce). The experts' second bias is added on tp rank 0 only.
   Grads: expert weights get (1/ep) x the sum over the tokens that reached them, so averaging
   them over l->edp_comm (dt_zero's expert_units) gives the global batch's mean; the router is a
   dense parameter (averaged over dp x cp as any other).
   Traffic per rank and layer: dispatch and combine each move the assignments it sends away,
   about N k C (ep - 1) / ep floats forward, the same again backward.
   Memory: E / ep experts of 2 C F / tp + F / tp + C values each; per micro-batch the kept
   assignments' inputs, hidden and GELU values and outputs (at most N k ep rows when dropless
   and every token goes to one rank, N k on average).
   CPU or CUDA tensors (all of a call's on x's device): on CUDA the routing, capacity, slots, row
   copies and combine are kernels/dt_moe.cu (each output in the CPU loop's order), each of the
   experts' six GEMMs one grouped cuBLAS call over the local experts (dt_k_gemm_grouped; at most 256
   experts per rank); a forward reads E counts back from the device once (the all-to-all's sizes:
   a synchronisation the dense layers do not make). */

typedef enum dt_moe_balance {
    DT_MOE_BALANCE_DEFAULT = 0, /* DT_MOE_AUX */
    DT_MOE_AUX,                 /* Switch / GShard auxiliary loss over the global batch */
    DT_MOE_BIAS,                /* DeepSeek-V3's aux-loss-free bias, updated per step */
    DT_MOE_NONE
} dt_moe_balance;

typedef struct dt_moe_desc {
    int experts;            /* E, a multiple of l->ep */
    int top_k;              /* k, 1 <= k <= E; 0 = 2 */
    int64_t width;          /* C, the rows' width */
    int64_t hidden;         /* F of each expert, whole (cut over tp); 0 = 4 C */
    int64_t seq;            /* rows of one sequence (the capacity's group); every x has whole sequences */
    double capacity;        /* capacity factor per sequence (>= 0); 0 = dropless */
    int renorm;             /* 1: gates renormalised over the chosen k */
    dt_moe_balance balance;
    double aux_coef;        /* DT_MOE_AUX's coefficient; 0 = 0.01 */
    double bias_rate;       /* DT_MOE_BIAS's update rate; 0 = 0.001 */
    int micro;              /* forwards per step and rank (micro-batches); 0 = 1 */
} dt_moe_desc;

typedef struct dt_moe dt_moe;           /* one MoE layer: its config, balance state and step counts */
typedef struct dt_moe_acts dt_moe_acts; /* what one micro-batch's backward needs (grows as needed) */

/* The step's routing, over the global batch (after dt_moe_step_end). */
typedef struct dt_moe_stats {
    double aux;             /* coef * E * sum_e f_e P_e (also under BIAS / NONE, for the log) */
    int64_t assigned;       /* token x choice pairs routed (global tokens x k) */
    int64_t dropped;        /* of them, over capacity */
    uint64_t drop_print;    /* a fingerprint of which (token, choice) pairs were dropped (the sum of
                               a 20-bit hash of each: exact to 2^33 drops a step): equal fingerprints,
                               equal sets (with high probability) */
    double load_max, load_mean; /* assignments per expert: the most and the mean */
    const int64_t *load;    /* [E] assignments per expert (valid until the next step_end) */
    const int64_t *kept;    /* [E] of them, those under capacity: the rows each expert computed (the
                               same; dropless, kept = load) */
    /* this rank's seconds in the step's forwards and backwards, by phase (wall clock: on CUDA the
       host's side of launches, not the device's time) */
    double router_s;        /* router GEMM, softmax, top-k, capacity; backward: the router's */
    double dispatch_s;      /* the counts' all-to-all, packing, the rows' all-to-allv, regrouping */
    double experts_s;       /* the experts' GEMMs and GELU */
    double combine_s;       /* the outputs back (all-to-allv) and the weighted sum; backward: their mirror */
} dt_moe_stats;

/* Collective over nothing; desc checked (E not a multiple of ep, k out of range, ...: DT_ERR_ARG
   naming the field). */
DT_API dt_status dt_moe_create(dt_layout *l, dt_moe **out, const dt_moe_desc *desc);
DT_API void dt_moe_free(dt_moe *m);
DT_API dt_status dt_moe_acts_create(dt_moe *m, dt_moe_acts **out);
DT_API void dt_moe_acts_free(dt_moe_acts *a);
/* y[N, C] = this tp rank's partial of sum_j g_tj expert_tj(x_t) (written, not accumulated); x [N, C]
   (N = whole sequences, the first being global sequence seq0: names the dropped tokens),
   router [E, C], fc_w [E/ep, F/tp, C], fc_b [E/ep, F/tp], proj_w [E/ep, C, F/tp], proj_b [E/ep, C].
   Collective over l->ep_comm. Adds this micro-batch's routing to the step's counts. */
DT_API dt_status dt_moe_fwd(dt_moe *m, dt_moe_acts *a, dt_tensor *y, const dt_tensor *x, int64_t seq0,
                            const dt_tensor *router, const dt_tensor *fc_w, const dt_tensor *fc_b,
                            const dt_tensor *proj_w, const dt_tensor *proj_b);
/* dx += d/dx (partial over tp: the caller's tp all-reduce sums it, as for a column-parallel
   linear), the grads += (expert ones x 1/ep), from dy [N, C] (whole, the same on every tp rank).
   loss_scale: the factor dy carries (fp16 loss scaling, micro-batch averaging aside), which the
   aux loss's gradient takes too. Collective over l->ep_comm and l->tp_comm; the step's first
   backward (under DT_MOE_AUX) also over l->dpcp_comm. */
DT_API dt_status dt_moe_bwd(dt_moe *m, dt_moe_acts *a, dt_tensor *dx, dt_tensor *d_router, dt_tensor *d_fc_w,
                            dt_tensor *d_fc_b, dt_tensor *d_proj_w, dt_tensor *d_proj_b, const dt_tensor *dy,
                            const dt_tensor *x, const dt_tensor *router, const dt_tensor *fc_w,
                            const dt_tensor *proj_w, float loss_scale);
/* After the step's last backward (collective over l->dpcp_comm): the step's stats, the bias
   update (DT_MOE_BIAS), and the counts reset. stats may be NULL. */
DT_API dt_status dt_moe_step_end(dt_moe *m, dt_moe_stats *stats);
/* The balancing bias, [E] (DT_MOE_BIAS; zeros otherwise): read to checkpoint it, write to restore. */
DT_API float *dt_moe_bias(dt_moe *m);
DT_API const char *dt_moe_balance_name(dt_moe_balance b); /* "aux", "bias", "none" */

/* ==== >>pp: pipeline schedules: GPipe, 1F1B, interleaved, ZB-H1, simulator =======================

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

/* Size limits, checked by dt_pp_schedule_create (and again by simulate and dt_pp_run, since a
   schedule may be edited in place). A schedule's lists and one simulation take memory in
   proportion to its passes (stages x chunks x micro, a few hundred bytes each), and the
   simulator's round-robin sweeps every stage once per round, its rounds growing with stages +
   micro: so the passes are bounded, and the stages on their own. These keep a schedule within a
   few hundred MB and its simulation within seconds, far above real pipelines (tens of stages, a
   few chunks per stage, hundreds of micro-batches). */
#define DT_PP_MAX_STAGES 4096
#define DT_PP_MAX_CHUNKS 1024
#define DT_PP_MAX_MICRO 1048576
#define DT_PP_MAX_PASSES 1048576 /* stages x chunks x micro */

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
    const double *stage_f, *stage_b; /* optional, [stages]: stage s's own f and b (the first stage's
                                        embedding, the last one's head, an uneven split); its bi and
                                        bw keep the bi / b and bw / b of the fields above. NULL =
                                        every stage f and b. Simulate only: _format refuses them */
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
/* Builds the lists. Bad values are DT_ERR_ARG naming the field, its value and what is expected
   (sizes above the DT_PP_MAX_* limits too). */
DT_API dt_status dt_pp_schedule_create(dt_ctx *ctx, dt_pp_schedule **out, const dt_pp_desc *desc);
/* The bound a made schedule has at `stage` (its `bound[stage]`) without making it: the activations
   in flight that schedule never exceeds there. kind resolved (not DEFAULT); -1 for bad values. */
DT_API int dt_pp_schedule_bound(dt_pp_kind kind, int stages, int micro, int chunks, int stage);
DT_API void dt_pp_schedule_free(dt_pp_schedule *s);
/* Executes every stage's list (model above) and checks it; desc may be NULL (defaults). */
DT_API dt_status dt_pp_schedule_simulate(dt_pp_schedule *s, dt_pp_stats *out, const dt_pp_sim_desc *desc);
/* Simulates, then appends the table to out: one row per stage, one column per time slot (the
   smallest compute cost), as the papers draw them: "F3" starts the forward of micro-batch 3,
   "--" continues the op before it, "." is idle; with chunks > 1 a letter names the chunk
   ("F3a" chunk 0, "F3b" chunk 1). Sends and receives take no slot. */
DT_API dt_status dt_pp_schedule_format(dt_pp_schedule *s, dt_strbuf *out, const dt_pp_sim_desc *desc);

/* ==== >>trace: timeline: Chrome-trace spans and collectives ======================================

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

/* ==== >>pprun: pipeline runtime: dt_pp_run =======================================================

   dt_pp_run executes this rank's list of a dt_pp_schedule (stage l->pp_rank) for one training
   step, calling the model through dt_pp_model's callbacks and exchanging activations and their
   gradients with the neighbouring stages over l->pp_comm (dt_comm_isend / dt_comm_irecv).
   Every rank of a pp group calls it with the same schedule and model shapes; each dp x cp x tp
   place runs its own pipeline.

   How the list is executed:
     RECV_ACT / RECV_GRAD  posted (irecv) where the schedule places them, recv_ahead messages
                           ahead of the compute that consumes them, into a buffer of the pool;
                           never waited there
     F, B, BI, BW          the receive it needs is waited just before it, then the callback runs
                           (a trace span named "F", "B", "BI" or "BW" around it)
     SEND_ACT / SEND_GRAD  an isend of the buffer the compute just wrote; the send is tested
                           after each later compute and its buffer goes back to the pool once
                           done; whatever is left is waited at the end of the step
   so a stage computes while its messages travel. With one stage (p = 1) a chunk's output is
   the next chunk's input in memory and nothing is sent.
   On CUDA with NCCL (a DT_NCCL build, device activations) the messages do not go over
   l->pp_comm: NCCL runs a group's operations in call order on one stream and has no tags, so the
   receives posted ahead and 1F1B's crossing sends (stage s sends an activation while s + 1 sends
   a gradient) would wait on each other. Each directed link (activations s -> s + 1, gradients
   s -> s - 1, mod p) gets a group of two of its own instead ("pp.act.0>1", ...; made by the first
   run, collective over l->pp_comm, kept in the layout), so a link's stream carries one way, in
   the sender's order; a stage posts its receives in its sender's order (one the list places
   later is posted early, e.g. interleaved 1F1B's last chunk). A step then waits for nothing on the
   host: the compute stream waits for a receive's event just before its consumer, and a send's
   buffer is reused only behind its event. Without NCCL (or use_nccl = -1) device tensors are
   staged through host memory and MPI over l->pp_comm, tagged.

   Buffers and their lifetimes (what the callbacks may rely on):
     in   (forward's input, the activation received): valid from F(c, i) until the last backward
          pass of (c, i) (B, or BW) has returned: a model may keep the pointer instead of a copy
          (a linear's saved input). NULL on the first virtual stage (the model reads its own data).
     out  (forward's output): written by the forward (shape model->act / acts), sent after it
          returns; not valid after the call. NULL on the last virtual stage (the model computes
          its loss there and seeds its own backward).
     dout (the gradient received for the output): valid from B / BI (c, i) until the last
          backward pass of (c, i) has returned (BW needs it for the weight gradient). NULL on the
          last virtual stage.
     din  (the input gradient the backward writes): zeroed before the call, gradients ACCUMULATE
          into it as everywhere in dt; NULL on the first virtual stage and for part WEIGHT.
   A buffer goes back to the pool (is reused, not freed) as soon as its lifetime ends, so the
   activations a stage holds follow the schedule's bound. The pool outlives the run: it is kept
   in the layout and reused by the next dt_pp_run (a step after the first allocates and frees
   nothing, on the host or the device), grows when a run needs a buffer it lacks (another shape),
   and is freed by dt_layout_free.
   The model's own saved tensors (pre-activations, ...) are the model's to free: at B, or at BW
   under the zero-bubble split.

   Backward parts: DT_PP_B runs part FULL, the zero-bubble schedule BI (part INPUT: din only,
   e.g. dt_linear_bwd with dw and dbias NULL) and later BW (part WEIGHT: dw and dbias only, e.g.
   dt_linear_bwd with dx NULL), which is what makes dt_tensor.h's separate input and weight
   gradients a schedule's unit.

   Gradient sync placement: model->grads_done(user, c) is called once the last backward pass of
   chunk c on this stage has run and the messages the schedule places right after it are posted
   (its gradient is on the wire to the stage before), so the chunk's units may start
   their gradient sync there (dt_zero_grad_ready: the DP all-reduce of ZeRO-0 buckets, the
   reduce-scatter of stages 2-3) while the other stages are still in their cooldown; call
   dt_zero_step after dt_pp_run. With ZeRO, use one dt_zero per stage (its parameters only;
   clipping sums the norm over l->pp_comm by itself) with opt.accum_steps = 1: the pipeline's
   micro-batches are one step's backward, and the model scales each micro-batch's loss by 1 / m.

   Errors: arguments (NULL callbacks, a schedule whose stages differ from l->pp, a bad activation
   shape, an action of any stage's list with a field out of range, as the simulator's "fields")
   are named before anything is sent, identically on every rank. An error inside a run (a
   callback's status, a comm error) is returned with the action named; the other stages then see
   their receives time out (the comm's timeout). The pool stays in the layout, except when a
   receive or send of the failed run is still posted: then the layout lets go of it (never
   freed while MPI may still write into it) and the next run makes a new one. Treat the
   pipeline as broken. */

typedef enum dt_pp_part {
    DT_PP_PART_DEFAULT = 0, /* = DT_PP_PART_FULL */
    DT_PP_PART_FULL,        /* B: the input gradient into din and the weight gradients */
    DT_PP_PART_INPUT,       /* BI: the input gradient into din only */
    DT_PP_PART_WEIGHT,      /* BW: the weight gradients only (din is NULL) */
    DT_PP_PART_COUNT
} dt_pp_part;

/* The model as the runtime sees it: a chunk c on stage s is virtual stage k = c * p + s of p * v;
   every callback returns a status (0 = ok; set the ctx error as dt does). */
typedef struct dt_pp_model {
    void *user;
    /* Forward of (chunk, micro): out = chunk(in). */
    dt_status (*forward)(void *user, int chunk, int micro, dt_tensor *out, const dt_tensor *in);
    /* Backward of (chunk, micro): din += d(loss)/d(in) from dout, and/or the weight gradients. */
    dt_status (*backward)(void *user, int chunk, int micro, dt_tensor *din, const dt_tensor *dout, dt_pp_part part);
    /* Optional (NULL = none): chunk's last backward pass of the step on this stage has run. */
    dt_status (*grads_done)(void *user, int chunk);
    dt_tensor_desc act;         /* the activation every virtual stage sends the next (and its gradient);
                                   dtype DEFAULT = f32, device DEFAULT = the ctx's */
    const dt_tensor_desc *acts; /* NULL = act everywhere; else acts[k] is what virtual stage k sends
                                   k + 1, k = 0 .. p v - 2 (the same array on every stage) */
} dt_pp_model;

typedef struct dt_pp_run_desc {
    struct dt_trace *trace; /* a dt_trace (the timeline, above) or NULL = none: every compute (a
                               span) and every send / recv (pp_comm is attached) of the run is
                               recorded, and busy / first / last of the stats come from it */
} dt_pp_run_desc;

/* What a run did on this rank (its stage). */
typedef struct dt_pp_run_stats {
    int stage;
    int peak;                 /* most chunk-micro-batches in flight (F run, its B or BW not yet) */
    int bound;                /* the schedule's bound for this stage: peak <= bound */
    size_t peak_buffer_bytes; /* most bytes of the runtime's activation and gradient buffers in use */
    size_t peak_ctx_bytes;    /* most ctx->bytes_in_use above its value at the start, seen after each
                                 action: the model's saved activations (allocated through the ctx)
                                 plus the runtime's buffers */
    int64_t messages;         /* sends and receives */
    double bytes_sent;
    double seconds;           /* wall time of the run */
    double compute_seconds;   /* inside the callbacks */
    double wait_seconds;      /* waiting for receives and, at the end, sends */
    double busy, first, last; /* from the trace (0 without one): the union of this run's compute
                                 spans, and the start of the first / end of the last (dt_comm_now
                                 seconds: comparable between the ranks of one host) */
} dt_pp_run_stats;

/* One step of this rank's stage; out may be NULL, desc may be NULL (defaults). Collective over
   l->pp_comm (point to point with the neighbours). */
DT_API dt_status dt_pp_run(dt_layout *l, dt_pp_run_stats *out, const dt_pp_schedule *s, const dt_pp_model *m,
                           const dt_pp_run_desc *desc);
/* Splits n_layers layers over n_parts consecutive parts (the virtual stages, p * v), as evenly as
   they go: part k holds layers [first[k], first[k+1]) (first has n_parts + 1 entries), the first
   n_layers % n_parts parts one layer more. Fewer layers than parts is DT_ERR_ARG naming both. */
DT_API dt_status dt_pp_split(dt_ctx *ctx, int *first, int n_layers, int n_parts);

#ifdef __cplusplus
}
#endif
#endif /* DT_PARALLEL_H */

/* ==== >>implementation: everything below needs DT_PARALLEL_IMPLEMENTATION ===================== */

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

/* ==== >>grid: dp x cp x tp x pp, Megatron rank order ========================================== */

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

#define DT__PL_HOST_MAX 64 /* bytes of a host name in dt_layout_describe's records */
#define DT__PL_REC (20 + DT__PL_HOST_MAX) /* rank, dp, cp, tp, pp as 5 little-endian u32, then the host */

static void dt__pp_keep_free(dt_ctx *ctx, struct dt__pp_keep *k);
static void dt__cp_keep_free(dt_ctx *ctx, struct dt__cp_keep *k);

/* Frees the groups of l (split from l->world, so they go first; world is the caller's). */
static void dt__pl_layout_release(dt_layout *l) {
    dt__pp_keep_free(l->ctx, l->pp_keep);
    dt__cp_keep_free(l->ctx, l->cp_keep);
    dt_comm_free(l->eptp_comm);
    dt_comm_free(l->edp_comm);
    dt_comm_free(l->ep_comm);
    dt_comm_free(l->dptp_comm);
    dt_comm_free(l->dpcp_comm);
    dt_comm_free(l->cp_comm);
    dt_comm_free(l->pp_comm);
    dt_comm_free(l->tp_comm);
    dt_comm_free(l->dp_comm);
    dt_release(l->ctx, l);
}

/* Splits l->world into the group of ranks with the same `color`, ordered by `key`, named `name`. */
static dt_status dt__pl_split(dt_layout *l, dt_comm **out, int color, int key, const char *name) {
    DT__TRY(dt_comm_split(l->world, out, color, key));
    return dt_comm_set_name(*out, name);
}

/* dt_layout_create, step 1 (local): the desc's own values. */
static dt_status dt__pl_layout_check(dt_ctx *ctx, const dt_layout_desc *d, const char *fn) {
    if (d->dp < 0 || d->cp < 0 || d->tp < 0 || d->pp < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.dp = %d, desc.cp = %d, desc.tp = %d, desc.pp = %d; expected "
                                "sizes >= 0 (0 = default)", fn, d->dp, d->cp, d->tp, d->pp);
    if (d->ep < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.ep = %d; expected >= 0 (0 = 1)", fn, d->ep);
    return DT_OK;
}

/* Step 2 (local): the defaults filled in; the sizes must multiply to the world size. */
static dt_status dt__pl_layout_resolve(dt_ctx *ctx, dt_layout_desc *d, int size, const char *fn) {
    int64_t ctp = 0, ctpp = 0, all = 0;
    int fits;
    if (!d->cp) d->cp = 1;
    if (!d->tp) d->tp = 1;
    if (!d->pp) d->pp = 1;
    fits = dt_mul_ok(d->cp, d->tp, &ctp) && dt_mul_ok(ctp, d->pp, &ctpp);
    if (!d->dp) {
        if (!fits || ctpp > size || size % ctpp)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: cp x tp x pp = %d x %d x %d = %.0f does not divide the world "
                                    "size %d, so dp cannot be derived; expected world size = dp x cp x tp x pp", fn,
                                    d->cp, d->tp, d->pp, (double)d->cp * d->tp * d->pp, size);
        d->dp = (int)(size / ctpp);
    }
    if (!fits || !dt_mul_ok(ctpp, d->dp, &all) || all != size)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: dp x cp x tp x pp = %d x %d x %d x %d = %.0f does not equal the "
                                "world size %d; expected sizes whose product is the world size", fn, d->dp, d->cp,
                                d->tp, d->pp, (double)d->dp * d->cp * d->tp * d->pp, size);
    if (!d->ep) d->ep = 1;
    if (((int64_t)d->dp * d->cp) % d->ep)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.ep = %d does not divide dp x cp = %d x %d = %lld; expert "
                                "parallelism lives inside the data-parallel ranks (ep x edp = dp x cp)", fn, d->ep,
                                d->dp, d->cp, (long long)d->dp * d->cp);
    return DT_OK;
}

/* Step 3 (collective): every rank resolved the same layout (ranks asking for different grids
   would split different groups and wait on each other, or train a model that diverges), or
   every rank fails, naming the first size that differs; a rank whose own desc failed steps 1-2
   passes st, so the others fail too instead of waiting in the splits. */
static dt_status dt__pl_layout_same(dt_comm *world, const dt_layout_desc *d, dt_status st, const char *fn) {
    static const char *const what[5] = {"dp", "cp", "tp", "pp", "ep"};
    dt_comm_same_diff df;
    uint64_t v[5];
    dt_status s2;
    v[0] = (uint64_t)d->dp;
    v[1] = (uint64_t)d->cp;
    v[2] = (uint64_t)d->tp;
    v[3] = (uint64_t)d->pp;
    v[4] = (uint64_t)d->ep;
    s2 = dt_comm_check_same(world, v, 5, st, &df);
    if (s2 == st || s2 != DT_ERR_ARG) return s2; /* this rank's own error, a comm error, or DT_OK */
    if (df.failed)
        return dt_ctx_set_error(dt_comm_ctx(world), DT_ERR_ARG, "%s: the desc of another rank failed its checks; see "
                                "its message", fn);
    return dt_ctx_set_error(dt_comm_ctx(world), DT_ERR_ARG, "%s: desc.%s = %lld on rank 0 but %lld on rank %d (after "
                            "defaults); expected every rank to ask for the same layout", fn,
                            df.field >= 0 ? what[df.field] : "?", (long long)df.value0, (long long)df.value, df.rank);
}

/* Step 4 (collective): the grid and its groups. */
static dt_status dt__pl_layout_build(dt_comm *world, dt_layout **out, const dt_layout_desc *d) {
    dt_layout *l;
    dt_status st;
    int rank = dt_comm_rank(world);
    l = (dt_layout *)dt_alloc_zeroed(dt_comm_ctx(world), sizeof *l);
    if (!l) return DT_ERR_OOM;
    l->ctx = dt_comm_ctx(world);
    l->world = world;
    l->size = dt_comm_size(world);
    l->rank = rank;
    l->dp = d->dp;
    l->cp = d->cp;
    l->tp = d->tp;
    l->pp = d->pp;
    /* rank = tp + TP * (cp + CP * (dp + DP * pp)) */
    l->tp_rank = rank % l->tp;
    l->cp_rank = (rank / l->tp) % l->cp;
    l->dp_rank = (rank / (l->tp * l->cp)) % l->dp;
    l->pp_rank = rank / (l->tp * l->cp * l->dp);
    l->dpcp = l->dp * l->cp;
    l->dpcp_rank = l->cp_rank + l->cp * l->dp_rank;
    l->ep = d->ep;
    l->edp = l->dpcp / l->ep;
    l->ep_rank = l->dpcp_rank % l->ep;  /* consecutive dp x cp ranks share their tokens' experts */
    l->edp_rank = l->dpcp_rank / l->ep;
    /* every rank splits in the same order; a group's color is the coordinates that stay, its key
       the ones that vary (so its rank is the coordinate, or dpcp_rank, or tp + TP * dpcp_rank) */
    st = dt__pl_split(l, &l->dp_comm, l->tp_rank + l->tp * (l->cp_rank + l->cp * l->pp_rank), l->dp_rank, "dp");
    if (!st) st = dt__pl_split(l, &l->tp_comm, l->dpcp_rank + l->dpcp * l->pp_rank, l->tp_rank, "tp");
    if (!st) st = dt__pl_split(l, &l->pp_comm, l->tp_rank + l->tp * l->dpcp_rank, l->pp_rank, "pp");
    if (!st)
        st = dt__pl_split(l, &l->cp_comm, l->tp_rank + l->tp * (l->dp_rank + l->dp * l->pp_rank), l->cp_rank, "cp");
    if (!st) st = dt__pl_split(l, &l->dpcp_comm, l->tp_rank + l->tp * l->pp_rank, l->dpcp_rank, "dpcp");
    if (!st) st = dt__pl_split(l, &l->dptp_comm, l->pp_rank, l->tp_rank + l->tp * l->dpcp_rank, "dptp");
    if (!st)
        st = dt__pl_split(l, &l->ep_comm, l->tp_rank + l->tp * (l->pp_rank + l->pp * l->edp_rank), l->ep_rank, "ep");
    if (!st)
        st = dt__pl_split(l, &l->edp_comm, l->tp_rank + l->tp * (l->pp_rank + l->pp * l->ep_rank), l->edp_rank, "edp");
    if (!st) st = dt__pl_split(l, &l->eptp_comm, l->pp_rank + l->pp * l->edp_rank, l->tp_rank + l->tp * l->ep_rank, "eptp");
    if (st) {
        dt__pl_layout_release(l);
        return st;
    }
    *out = l;
    return DT_OK;
}

DT_API dt_status dt_layout_create(dt_comm *world, dt_layout **out, const dt_layout_desc *desc) {
    const char *fn = "dt_layout_create";
    dt_ctx *ctx;
    dt_layout_desc d;
    dt_status st;
    if (out) *out = NULL;
    if (!world) return DT_ERR_ARG; /* no ctx to say it in */
    ctx = dt_comm_ctx(world);
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    st = dt__pl_layout_check(ctx, &d, fn);
    if (!st) st = dt__pl_layout_resolve(ctx, &d, dt_comm_size(world), fn);
    DT__TRY(dt__pl_layout_same(world, &d, st, fn));
    return dt__pl_layout_build(world, out, &d);
}

DT_API void dt_layout_free(dt_layout *l) {
    if (l) dt__pl_layout_release(l);
}

DT_API int dt_layout_rank_at(const dt_layout *l, int dp_rank, int cp_rank, int tp_rank, int pp_rank) {
    if (!l || dp_rank < 0 || dp_rank >= l->dp || cp_rank < 0 || cp_rank >= l->cp || tp_rank < 0 || tp_rank >= l->tp ||
        pp_rank < 0 || pp_rank >= l->pp)
        return -1;
    return tp_rank + l->tp * (cp_rank + l->cp * (dp_rank + l->dp * pp_rank));
}

DT_API int dt_layout_rank_of(const dt_layout *l, int dp_rank, int tp_rank, int pp_rank) {
    return dt_layout_rank_at(l, dp_rank, 0, tp_rank, pp_rank);
}

DT_API const char *dt_layout_string(const dt_layout *l, char *buf, size_t n) {
    if (!buf || !n) return buf;
    if (!l) snprintf(buf, n, "(null)");
    else if (l->cp == 1 && l->ep == 1) snprintf(buf, n, "dp=%d,tp=%d,pp=%d", l->dp, l->tp, l->pp); /* as before cp */
    else if (l->ep == 1) snprintf(buf, n, "dp=%d,cp=%d,tp=%d,pp=%d", l->dp, l->cp, l->tp, l->pp);
    else snprintf(buf, n, "dp=%d,cp=%d,tp=%d,pp=%d,ep=%d", l->dp, l->cp, l->tp, l->pp, l->ep);
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

/* The hosts of the records (world rank order), and a warning for each tp (and cp) group whose
   ranks are on more than one host: tp all-reduces every layer, cp passes K/V every layer, so
   both belong inside a host (Megatron's order puts them innermost for that; a host holding fewer
   ranks than tp x cp breaks it). */
static void dt__pl_describe_hosts(const dt_layout *l, dt_strbuf *out, const unsigned char *rec) {
    int r, q, hosts = 0, warned = 0, g;
    for (r = 0; r < l->size; r++) { /* distinct host names, counted at their first rank */
        for (q = 0; q < r; q++)
            if (!strcmp((const char *)rec + (size_t)q * DT__PL_REC + 20, (const char *)rec + (size_t)r * DT__PL_REC + 20)) break;
        hosts += q == r;
    }
    dt_strbuf_printf(out, "  hosts: %d, %d ranks on average each\n", hosts, l->size / (hosts ? hosts : 1));
    if (dt_comm_hosts(l->world) != hosts)
        dt_strbuf_printf(out, "  hosts as the collectives see them: %d (modelled: dt_comm_desc.host_size)\n",
                         dt_comm_hosts(l->world));
    { /* the gradient groups of this rank: how their all-reduce crosses hosts (dt_comm.h, "Across hosts") */
        dt_comm *gs[2];
        const char *names[2] = {"dp x cp", "dp x cp x tp"};
        gs[0] = l->dpcp_comm;
        gs[1] = l->dptp_comm;
        for (g = 0; g < 2; g++) {
            int h = dt_comm_hosts(gs[g]), per = dt_comm_ranks_per_host(gs[g]);
            if (!gs[g] || h < 2 || (g == 1 && l->tp == 1)) continue;
            dt_strbuf_printf(out, "  rank %d's %s group spans %d hosts, %s: its all-reduce %s\n", l->rank, names[g], h,
                             per ? (per == 1 ? "1 rank on each" : "the same ranks on each") : "uneven",
                             per > 1 && dt_comm_hier(gs[g]) >= 0 ? "goes in two levels (in each host, then across; "
                                                                    "sums in host order)"
                                     : "is flat (one level)");
        }
    }
    for (g = 0; g < 2; g++) { /* g 0: tp groups (consecutive ranks), 1: tp x cp blocks */
        int span = g ? l->tp * l->cp : l->tp;
        if (span == 1 || (g && l->cp == 1)) continue;
        for (r = 0; r < l->size && warned < 4; r += span) {
            const char *h0 = (const char *)rec + (size_t)r * DT__PL_REC + 20;
            for (q = r + 1; q < r + span; q++)
                if (strcmp(h0, (const char *)rec + (size_t)q * DT__PL_REC + 20)) break;
            if (q == r + span) continue;
            dt_strbuf_printf(out, "  warning: the %s of world ranks %d..%d spans hosts (%.20s and %.20s): its every-layer "
                             "collectives cross the network; expected ranks per host to be a multiple of %s = %d\n",
                             g ? "tp x cp block" : "tp group", r, r + span - 1, h0,
                             (const char *)rec + (size_t)q * DT__PL_REC + 20, g ? "tp x cp" : "tp", span);
            warned++;
        }
    }
}

DT_API dt_status dt_layout_describe(dt_layout *l, dt_strbuf *out) {
    const char *fn = "dt_layout_describe";
    dt_tensor mine, all;
    dt_tensor_desc td;
    unsigned char *rec;
    char lay[64];
    int r, dp, cp, tp, pp;
    dt_status st;
    if (!l) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    /* one fixed-size record per rank (coordinates and host name), all-gathered: every rank
       gets the whole picture */
    memset(&td, 0, sizeof td);
    td.dtype = DT_U8;
    td.shape[0] = DT__PL_REC;
    DT__TRY(dt_tensor_create(l->ctx, &mine, &td));
    td.shape[0] = (int64_t)DT__PL_REC * l->size;
    st = dt_tensor_create(l->ctx, &all, &td);
    if (st) {
        dt_tensor_free(l->ctx, &mine);
        return st;
    }
    rec = (unsigned char *)mine.data;
    dt__pl_put_u32(rec, (uint32_t)l->rank);
    dt__pl_put_u32(rec + 4, (uint32_t)l->dp_rank);
    dt__pl_put_u32(rec + 8, (uint32_t)l->cp_rank);
    dt__pl_put_u32(rec + 12, (uint32_t)l->tp_rank);
    dt__pl_put_u32(rec + 16, (uint32_t)l->pp_rank);
#ifdef DT__PL_HOSTNAME
    if (gethostname((char *)rec + 20, DT__PL_HOST_MAX - 1) != 0) snprintf((char *)rec + 20, DT__PL_HOST_MAX, "?");
#else
    snprintf((char *)rec + 20, DT__PL_HOST_MAX, "?");
#endif
    rec[20 + DT__PL_HOST_MAX - 1] = 0;
    st = dt_comm_allgather(l->world, &all, &mine);
    dt_tensor_free(l->ctx, &mine);
    if (st) {
        dt_tensor_free(l->ctx, &all);
        return st;
    }
    rec = (unsigned char *)all.data;
    if (l->cp > 1)
        dt_strbuf_printf(out, "layout %s over %d rank%s (rank = tp + %d * (cp + %d * (dp + %d * pp)))\n",
                         dt_layout_string(l, lay, sizeof lay), l->size, l->size == 1 ? "" : "s", l->tp, l->cp, l->dp);
    else /* as before cp existed */
        dt_strbuf_printf(out, "layout %s over %d rank%s (rank = tp + %d * (dp + %d * pp))\n",
                         dt_layout_string(l, lay, sizeof lay), l->size, l->size == 1 ? "" : "s", l->tp, l->dp);
    if (l->ep > 1)
        dt_strbuf_printf(out, "  experts: ep %d x edp %d over the dp x cp ranks of a stage (ep_rank = dpcp_rank %% %d, "
                         "edp_rank = dpcp_rank / %d)\n", l->ep, l->edp, l->ep, l->ep);
    dt_strbuf_printf(out, "  rank  host                  dp  cp  tp  pp\n");
    for (r = 0; r < l->size; r++) {
        const unsigned char *q = rec + (size_t)r * DT__PL_REC;
        dt_strbuf_printf(out, "  %4d  %-20.20s %3d %3d %3d %3d\n", dt__pl_get_u32(q), (const char *)q + 20,
                         dt__pl_get_u32(q + 4), dt__pl_get_u32(q + 8), dt__pl_get_u32(q + 12), dt__pl_get_u32(q + 16));
    }
    /* the grid: per pipeline stage, which world rank sits at ((dp, cp), tp) */
    for (pp = 0; pp < l->pp; pp++) {
        dt_strbuf_printf(out, "  stage pp=%d: world rank at (%s row, tp column)\n        ", pp,
                         l->cp > 1 ? "dp cp" : "dp");
        if (l->cp > 1) dt_strbuf_printf(out, "      ");
        for (tp = 0; tp < l->tp; tp++) dt_strbuf_printf(out, " tp%-3d", tp);
        dt_strbuf_printf(out, "\n");
        for (dp = 0; dp < l->dp; dp++)
            for (cp = 0; cp < l->cp; cp++) {
                if (l->cp > 1) dt_strbuf_printf(out, "   dp%-3d cp%-3d", dp, cp);
                else dt_strbuf_printf(out, "   dp%-3d", dp);
                for (tp = 0; tp < l->tp; tp++) dt_strbuf_printf(out, " %5d", dt_layout_rank_at(l, dp, cp, tp, pp));
                dt_strbuf_printf(out, "\n");
            }
    }
    dt__pl_describe_hosts(l, out, rec);
    dt_tensor_free(l->ctx, &all);
    { /* more ranks than CPUs on a host: bound or not (collective) */
        char note[512];
        DT__TRY(dt_comm_cpu_note(l->world, note, sizeof note));
        if (note[0]) dt_strbuf_printf(out, "  %s\n", note);
    }
    if (out->failed) return dt_ctx_set_error(l->ctx, DT_ERR_OOM, "%s: out of memory for the text", fn);
    return DT_OK;
}

DT_API dt_status dt_layout_batch_range(const dt_layout *l, int64_t global_batch, int64_t *first, int64_t *count) {
    const char *fn = "dt_layout_batch_range";
    int64_t per;
    if (first) *first = 0;
    if (count) *count = 0;
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

/* ==== >>arena: one flat buffer for values, one for grads ====================================== */

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
    if (!dt_mul_ok(n, (int64_t)size, &bytes) || (uint64_t)bytes > (uint64_t)((size_t)-1 / 2)) {
        dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %lld x %zu bytes of %s do not fit in memory", fn, (long long)n, size,
                         what);
        return NULL;
    }
    return dt_alloc_zeroed(ctx, bytes ? (size_t)bytes : 1);
}

/* dt_arena_create in three steps: check every parameter before anything changes (a failed create
   leaves ps as it was), resolve the sizes of the flat buffers, build them and copy the values in. */
static dt_status dt__pl_arena_check(dt_ctx *ctx, const dt_params *ps, const int *units, const char *fn) {
    int i;
    for (i = 0; i < ps->count; i++) {
        const dt_param *p = ps->items[i];
        if (!p || !p->value.data || !p->grad.data)
            return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: parameter %d (\"%s\") has no value or grad (freed, or "
                                    "released by ZeRO-3)", fn, i, p ? p->name : "(null)");
        if (p->value.device != ps->items[0]->value.device || p->grad.device != ps->items[0]->value.device)
            return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: parameter \"%s\" has its value on %s and grad on %s, "
                                    "parameter \"%s\" its value on %s; expected every parameter on one device", fn,
                                    p->name, dt_device_name(p->value.device), dt_device_name(p->grad.device),
                                    ps->items[0]->name, dt_device_name(ps->items[0]->value.device));
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
    return DT_OK;
}

/* The elements of each dtype's value buffer (total) and of the f32 grad buffer (gtotal). */
static dt_status dt__pl_arena_sizes(dt_ctx *ctx, const dt_params *ps, int64_t *total, int64_t *gtotal,
                                    const char *fn) {
    int i, k;
    for (k = 0; k < DT_DTYPE_COUNT; k++) total[k] = 0;
    *gtotal = 0;
    for (i = 0; i < ps->count; i++) {
        const dt_param *p = ps->items[i];
        total[p->value.dtype] += p->value.numel; /* each < 2^62 bytes (a live tensor); n < 2^31 */
        *gtotal += p->grad.numel;
        if (total[p->value.dtype] < 0 || *gtotal < 0 || *gtotal > ((int64_t)1 << 61))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: the parameters hold more elements than fit", fn);
    }
    return DT_OK;
}

/* The buffers, the offsets and unit table, and the views (vviews, gviews) holding copies of ps's
   values and grads; ps itself is not changed. */
static dt_status dt__pl_arena_build(dt_arena *a, const int *units, const int64_t *total, int64_t gtotal,
                                    dt_tensor *vviews, dt_tensor *gviews) {
    dt_ctx *ctx = a->ctx;
    dt_params *ps = a->params;
    dt_tensor_desc td;
    dt_status st = DT_OK;
    int i, k, n = ps->count;
    memset(&td, 0, sizeof td);
    td.ndim = 1;
    td.device = a->device;
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
    for (i = 0; i < n && !st; i++) { /* values and grads in (a cudaMemcpy may fail: ps is still whole) */
        dt_param *p = ps->items[i];
        st = dt_tensor_copy(ctx, &vviews[i], &p->value);
        if (!st) st = dt_tensor_copy(ctx, &gviews[i], &p->grad);
    }
    return st;
}

DT_API dt_status dt_arena_create(dt_ctx *ctx, dt_arena **out, dt_params *ps, const dt_arena_desc *desc) {
    const char *fn = "dt_arena_create";
    dt_arena *a;
    dt_tensor *vviews = NULL, *gviews = NULL;
    int64_t total[DT_DTYPE_COUNT], gtotal = 0;
    const int *units = desc ? desc->units : NULL;
    int i, n;
    dt_status st = DT_OK;
    if (out) *out = NULL;
    if (!ctx) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    if (!ps) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: ps is NULL", fn);
    if (ps->count < 0 || (ps->count > 0 && !ps->items))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: ps has count %d and items %p; expected a dt_params", fn,
                                ps->count, (void *)ps->items);
    n = ps->count;
    DT__TRY(dt__pl_arena_check(ctx, ps, units, fn));
    DT__TRY(dt__pl_arena_sizes(ctx, ps, total, &gtotal, fn));
    a = (dt_arena *)dt_alloc_zeroed(ctx, sizeof *a);
    if (!a) return DT_ERR_OOM;
    a->ctx = ctx;
    a->params = ps;
    a->device = n ? ps->items[0]->value.device : DT_CPU;
    a->n_units = n == 0 ? 0 : units ? units[n - 1] + 1 : n;
    a->value_offset = (int64_t *)dt__pl_alloc_n(ctx, n, sizeof(int64_t), fn, "offsets");
    a->grad_offset = (int64_t *)dt__pl_alloc_n(ctx, n, sizeof(int64_t), fn, "offsets");
    a->unit = (int *)dt__pl_alloc_n(ctx, n, sizeof(int), fn, "units");
    a->unit_first = (int *)dt__pl_alloc_n(ctx, (int64_t)a->n_units + 1, sizeof(int), fn, "units");
    vviews = (dt_tensor *)dt__pl_alloc_n(ctx, n, sizeof(dt_tensor), fn, "views");
    gviews = (dt_tensor *)dt__pl_alloc_n(ctx, n, sizeof(dt_tensor), fn, "views");
    if (!a->value_offset || !a->grad_offset || !a->unit || !a->unit_first || !vviews || !gviews) st = DT_ERR_OOM;
    if (!st) st = dt__pl_arena_build(a, units, total, gtotal, vviews, gviews);
    if (st) {
        dt_release(ctx, vviews);
        dt_release(ctx, gviews);
        dt__pl_arena_release(a);
        return st;
    }
    /* nothing can fail from here: the params become views, the old memory goes back */
    for (i = 0; i < n; i++) {
        dt_param *p = ps->items[i];
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

/* ==== >>zero: data parallel: DDP (stage 0) and ZeRO 1-3 ==========================================

   Geometry. N = dp x cp (1 at stage 0, which shards nothing), r = this rank's dpcp_rank. A
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
    int used;                             /* dt_zero_gather in this backward since its grad_ready */
    int expert;                           /* desc.expert_units: synced over edp, not dp x cp */
    dt_comm *comm;                        /* the group its grads are averaged and sharded over */
    int N, r;                             /* that group's size and this rank's place (1, 0 at stage 0) */
    dt_tensor vfull[DT_DTYPE_COUNT];      /* stage 3: the gathered values */
    dt_tensor vpack[DT_DTYPE_COUNT];      /* stage 3: an all-gather in flight (prefetch) */
    dt_tensor vmine[DT_DTYPE_COUNT];      /* on cuda: this rank's block, sent from its own buffer */
    dt_comm_req *vreq[DT_DTYPE_COUNT];
    int vposted;
    dt_tensor gfull;                      /* stages 2-3: full grads, first gather to grad_ready */
    dt_tensor gpack, gout;                /* stages 2-3: a reduce-scatter in flight */
    dt_comm_req *greq;
    int64_t gseq;                         /* its place in the order the reduce-scatters were posted */
} dt__pl_zu;

struct dt_zero {
    dt_ctx *ctx;
    dt_layout *l;
    dt_arena *a;
    dt_comm *dpcp;                        /* l->dpcp_comm: the group gradients are averaged over */
    int stage, N, r, n_params, n_units, prefetch, sync, backward;
    int64_t gseq;                         /* reduce-scatters posted so far */
    dt__pl_zp *zp;
    dt__pl_zu *zu;
    dt_bucketer *ddp;                     /* stage 0 (with expert units: the dense params') */
    dt_bucketer *eddp;                    /* stage 0, expert units: their params' buckets, over edp */
    dt_params dense_ps, expert_ps;        /* stage 0 with expert units: the two bucketers' params (views) */
    dt_params shard;                      /* what the optimizer updates: this rank's rows */
    dt_comm **param_comms;
    dt_optimizer *opt;
    dt_tensor sgrad;                      /* stages 2-3 */
    dt_tensor sval[DT_DTYPE_COUNT];       /* stage 3 */
    size_t base_param, base_grad, live_param, live_grad, live_comm, peak;
    char formula[96];                     /* dt_zero_memory.formula points here */
    dt_tensor *pool;                      /* on cuda: unit buffers given back, kept for the next take */
    int pool_n, pool_cap;
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
/* A unit buffer of numel zeros. On cuda the buffers a step gives back stay in z->pool and the
   next take of the same dtype and size reuses one (zeroed on the stream): the units of a model
   repeat a few sizes, so after the first step gathers, releases and reduce-scatters allocate and
   free nothing (cudaMalloc and cudaFree synchronise the device). The pool holds at most what
   was live at once; the memory figures count what is live. */
static dt_status dt__pl_ztake(dt_zero *z, dt_tensor *t, dt_dtype dtype, int64_t numel, size_t *counter) {
    dt_tensor_desc td;
    int k;
    for (k = 0; k < z->pool_n; k++)
        if (z->pool[k].dtype == dtype && z->pool[k].numel == numel) break;
    if (k < z->pool_n) {
        DT__TRY(dt_tensor_fill(z->ctx, &z->pool[k], 0.0));
        *t = z->pool[k];
        z->pool[k] = z->pool[--z->pool_n];
    } else {
        memset(&td, 0, sizeof td);
        td.dtype = dtype;
        td.device = z->a->device;
        td.ndim = 1;
        td.shape[0] = numel;
        DT__TRY(dt_tensor_create(z->ctx, t, &td));
    }
    *counter += dt_tensor_bytes(t);
    dt__pl_znote(z);
    return DT_OK;
}
static void dt__pl_zgive(dt_zero *z, dt_tensor *t, size_t *counter) {
    if (!t->data) return;
    *counter -= dt_tensor_bytes(t);
    if (t->device == DT_CUDA_DEVICE && t->owns) {
        if (z->pool_n == z->pool_cap) { /* grows during the first step only */
            int cap = z->pool_cap ? 2 * z->pool_cap : 16;
            dt_tensor *np = (dt_tensor *)dt_alloc(z->ctx, (size_t)cap * sizeof *np);
            if (np) {
                if (z->pool_n) memcpy(np, z->pool, (size_t)z->pool_n * sizeof *np);
                dt_release(z->ctx, z->pool);
                z->pool = np;
                z->pool_cap = cap;
            }
        }
        if (z->pool_n < z->pool_cap) {
            z->pool[z->pool_n++] = *t;
            memset(t, 0, sizeof *t);
            return;
        }
    }
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

/* n elements of src from element so to dst from element do, on either device (dt_tensor_copy of
   1-D views); add = 1: dst += src (dt_axpy with alpha 1: the sum bit for bit). */
static dt_status dt__pl_copy(dt_ctx *ctx, const dt_tensor *dst, int64_t dof, const dt_tensor *src, int64_t sof,
                             int64_t n, int add) {
    dt_tensor d, s;
    if (n <= 0) return DT_OK;
    DT__TRY(dt_tensor_view(ctx, &d, dst, dof, 1, &n));
    DT__TRY(dt_tensor_view(ctx, &s, src, sof, 1, &n));
    return add ? dt_axpy(ctx, &d, 1.0f, &s) : dt_tensor_copy(ctx, &d, &s);
}

/* Rows [lo, hi) of param i that rank j owns. */
static void dt__pl_zrows(const dt__pl_zp *p, int j, int64_t *lo, int64_t *hi) {
    *lo = dt__pl_min64(p->rows, (int64_t)j * p->c);
    *hi = dt__pl_min64(p->rows, (int64_t)(j + 1) * p->c);
}

/* ---- stages 1-3: reduce-scatter of a unit's grads, all-gather of its values */

/* Unit u's rows of every rank, rank-major, between the base params and a pack: the full grads
   packed into gpack (t = -1: the reduce-scatter's input), or the values of dtype t unpacked from
   vpack[t] (the all-gather's output). */
static dt_status dt__pl_zrank_major(dt_zero *z, dt__pl_zu *u, int t) {
    const dt_tensor *pack = t < 0 ? &u->gpack : &u->vpack[t];
    int64_t block = t < 0 ? u->gblock : u->vblock[t];
    int i, j;
    for (j = 0; j < u->N; j++)
        for (i = u->first; i < u->last; i++) {
            const dt__pl_zp *p = &z->zp[i];
            const dt_param *bp = z->a->params->items[i];
            int64_t lo, hi, at = (int64_t)j * block + (t < 0 ? p->gpk : p->vpk);
            if (t >= 0 && (int)bp->value.dtype != t) continue;
            dt__pl_zrows(p, j, &lo, &hi);
            DT__TRY(t < 0 ? dt__pl_copy(z->ctx, pack, at, &bp->grad, lo * p->row_elems, (hi - lo) * p->row_elems, 0)
                          : dt__pl_copy(z->ctx, &bp->value, lo * p->row_elems, pack, at, (hi - lo) * p->row_elems, 0));
        }
    return DT_OK;
}

/* This rank's block of the reduce-scatter into its shard grads: added (stages 2-3, which
   accumulate over micro-steps) or written (stage 1, whose shard grads are the arena's rows). */
static dt_status dt__pl_zgrads_in(dt_zero *z, dt__pl_zu *u, const dt_tensor *out, int add) {
    int i;
    for (i = u->first; i < u->last; i++) {
        const dt__pl_zp *p = &z->zp[i];
        DT__TRY(dt__pl_copy(z->ctx, &z->shard.items[i]->grad, 0, out, p->gpk, p->n * p->row_elems, add));
    }
    return DT_OK;
}

static dt_status dt__pl_zrs_finish(dt_zero *z, dt__pl_zu *u);

/* Finishes the oldest reduce-scatters until at most keep are in flight. How many a rank holds
   then never depends on how far MPI has moved them, so a stage's peak is the same every step
   and every run (and dt_plan can count it). */
static dt_status dt__pl_zrs_bound(dt_zero *z, int keep) {
    for (;;) {
        int k, n = 0, old = -1;
        for (k = 0; k < z->n_units; k++)
            if (z->zu[k].greq) {
                n++;
                if (old < 0 || z->zu[k].gseq < z->zu[old].gseq) old = k;
            }
        if (n <= keep) return DT_OK;
        DT__TRY(dt__pl_zrs_finish(z, &z->zu[old]));
    }
}

/* Posts unit u's reduce-scatter (stages 2-3) from its full grads, which it then gives back; the
   oldest one still in flight is finished first when DT_ZERO_RS_IN_FLIGHT are. */
static dt_status dt__pl_zrs_post(dt_zero *z, dt__pl_zu *u) {
    dt_status st;
    int i;
    DT__TRY(dt__pl_zrs_bound(z, DT_ZERO_RS_IN_FLIGHT - 1));
    DT__TRY(dt__pl_ztake(z, &u->gpack, DT_F32, (int64_t)u->N * u->gblock, &z->live_comm));
    st = dt__pl_ztake(z, &u->gout, DT_F32, u->gblock, &z->live_comm);
    if (st) { dt__pl_zgive(z, &u->gpack, &z->live_comm); return st; }
    st = dt__pl_zrank_major(z, u, -1);
    if (st) {
        dt__pl_zgive(z, &u->gpack, &z->live_comm);
        dt__pl_zgive(z, &u->gout, &z->live_comm);
        return st;
    }
    dt__pl_zgive(z, &u->gfull, &z->live_grad);
    for (i = u->first; i < u->last; i++) z->a->params->items[i]->grad.data = NULL;
    st = dt_comm_ireduce_scatter(u->comm, &u->gout, &u->gpack, DT_REDUCE_AVG, &u->greq);
    u->gseq = z->gseq++;
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
    if (!st) st = dt__pl_zgrads_in(z, u, &u->gout, 1);
    dt__pl_zgive(z, &u->gpack, &z->live_comm);
    dt__pl_zgive(z, &u->gout, &z->live_comm);
    return st;
}

/* Moves the reduce-scatters in flight along (MPI progresses a posted operation only inside its
   calls). A done one is not finished here: dt__pl_zrs_bound finishes them in the order posted,
   so what a rank holds does not depend on which ones MPI happened to complete. */
static dt_status dt__pl_zpoll(dt_zero *z) {
    int k, done;
    for (k = 0; k < z->n_units; k++)
        if (z->zu[k].greq) DT__TRY(dt_comm_test(z->zu[k].greq, &done));
    return DT_OK;
}

/* Stage 1 at the step: unit u's accumulated full grads, averaged over dp x cp, this rank's rows
   written into the arena (blocking). */
static dt_status dt__pl_zrs_stage1(dt_zero *z, dt__pl_zu *u) {
    dt_status st;
    DT__TRY(dt__pl_ztake(z, &u->gpack, DT_F32, (int64_t)u->N * u->gblock, &z->live_comm));
    st = dt__pl_ztake(z, &u->gout, DT_F32, u->gblock, &z->live_comm);
    if (!st) st = dt__pl_zrank_major(z, u, -1);
    if (!st) st = dt_comm_reduce_scatter(u->comm, &u->gout, &u->gpack, DT_REDUCE_AVG);
    if (!st) st = dt__pl_zgrads_in(z, u, &u->gout, 0);
    dt__pl_zgive(z, &u->gpack, &z->live_comm);
    dt__pl_zgive(z, &u->gout, &z->live_comm);
    return st;
}

/* Posts the all-gather of unit u's values of dtype t: this rank's rows (its shard params'
   values) into its block of vpack, the others' blocks arrive. */
static dt_status dt__pl_zag_post(dt_zero *z, dt__pl_zu *u, int t) {
    dt_tensor mine;
    int i, own = z->a->device != DT_CPU;
    dt_status st = DT_OK;
    memset(&mine, 0, sizeof mine);
    DT__TRY(dt__pl_ztake(z, &u->vpack[t], (dt_dtype)t, (int64_t)u->N * u->vblock[t], &z->live_comm));
    /* on the host the block goes in place; on cuda from a buffer of its own (dt_comm's staging of
       an in-place all-gather on device tensors sizes its buffer by the input: rank 0 overflowed it) */
    if (own) st = dt__pl_ztake(z, &u->vmine[t], (dt_dtype)t, u->vblock[t], &z->live_comm);
    for (i = u->first; i < u->last && !st; i++) {
        const dt__pl_zp *p = &z->zp[i];
        const dt_param *sp = z->shard.items[i];
        if ((int)sp->value.dtype == t)
            st = dt__pl_copy(z->ctx, own ? &u->vmine[t] : &u->vpack[t], (own ? 0 : (int64_t)u->r * u->vblock[t]) + p->vpk,
                             &sp->value, 0, sp->value.numel, 0);
    }
    if (!st && own) mine = u->vmine[t];
    else if (!st) st = dt_tensor_view(z->ctx, &mine, &u->vpack[t], (int64_t)u->r * u->vblock[t], 1, &u->vblock[t]);
    if (!st) st = dt_comm_iallgather(u->comm, &u->vpack[t], &mine, &u->vreq[t]);
    if (st) {
        dt__pl_zgive(z, &u->vpack[t], &z->live_comm);
        dt__pl_zgive(z, &u->vmine[t], &z->live_comm);
    }
    return st;
}

/* Posts the all-gathers of unit u (stage 3: a gather or a prefetch). */
static dt_status dt__pl_zgather_post(dt_zero *z, dt__pl_zu *u) {
    int t;
    for (t = 1; t < DT_DTYPE_COUNT; t++)
        if (u->has[t]) DT__TRY(dt__pl_zag_post(z, u, t));
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
        if (!st) st = dt__pl_zrank_major(z, u, t);
    }
    for (t = 1; t < DT_DTYPE_COUNT; t++) {
        dt__pl_zgive(z, &u->vpack[t], &z->live_comm);
        dt__pl_zgive(z, &u->vmine[t], &z->live_comm);
    }
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
    for (k = 0; k < z->n_units && !st; k++) {
        dt__pl_zu *u = &z->zu[k];
        for (t = 1; t < DT_DTYPE_COUNT && !st; t++) {
            if (!u->has[t] || u->N == 1) continue;
            st = dt__pl_zag_post(z, u, t);
            if (!st) {
                st = dt_comm_wait(u->vreq[t]);
                u->vreq[t] = NULL;
            }
            if (!st) st = dt__pl_zrank_major(z, u, t);
            dt__pl_zgive(z, &u->vpack[t], &z->live_comm);
            dt__pl_zgive(z, &u->vmine[t], &z->live_comm);
        }
    }
    return st;
}

/* Waits for everything in flight (errors ignored: for dt_zero_free). */
static void dt__pl_zdrain(dt_zero *z) {
    int k;
    if (!z->zu) return;
    for (k = 0; k < z->n_units; k++) {
        dt__pl_zu *u = &z->zu[k];
        if (u->greq) { dt_comm_wait(u->greq); u->greq = NULL; }
        if (u->vposted) dt__pl_zgather_finish(z, u, 0);
    }
}

static void dt__pl_zero_release(dt_zero *z) {
    int k, t, i;
    dt__pl_zdrain(z);
    dt_bucketer_free(z->ddp); /* waits for its buckets; the arena's grads stay where they are */
    dt_bucketer_free(z->eddp);
    dt_release(z->ctx, z->dense_ps.items); /* the params are the arena's */
    dt_release(z->ctx, z->expert_ps.items);
    for (k = 0; k < z->n_units && z->zu; k++) {
        dt__pl_zu *u = &z->zu[k];
        for (t = 0; t < DT_DTYPE_COUNT; t++) {
            dt__pl_zgive(z, &u->vfull[t], &z->live_param);
            dt__pl_zgive(z, &u->vpack[t], &z->live_comm);
            dt__pl_zgive(z, &u->vmine[t], &z->live_comm);
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
    for (k = 0; k < z->pool_n; k++) dt_tensor_free(z->ctx, &z->pool[k]);
    dt_release(z->ctx, z->pool);
    dt_release(z->ctx, z->param_comms);
    dt_release(z->ctx, z->zp);
    dt_release(z->ctx, z->zu);
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
            p->c = (p->rows + u->N - 1) / u->N;
            dt__pl_zrows(p, u->r, &p->lo, &d);
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
        if (!dt_mul_ok(u->gblock, u->N, &tot) || tot > ((int64_t)1 << 40))
            return dt_ctx_set_error(z->ctx, DT_ERR_ARG, "%s: unit %d: %d blocks of %lld elements are too many for one "
                                    "collective", fn, k, u->N, (long long)u->gblock);
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
        dt_param *sp = (dt_param *)dt_alloc_zeroed(z->ctx, sizeof *sp);
        int64_t shape[DT_MAX_DIMS];
        dt_status st;
        if (!sp) return DT_ERR_OOM;
        z->shard.items[z->shard.count++] = sp;
        memcpy(sp->name, bp->name, sizeof sp->name);
        for (d = 0; d < DT_MAX_DIMS; d++) {
            shape[d] = bp->value.shape[d];
            sp->global_shape[d] = bp->global_shape[d];
            sp->start[d] = bp->start[d];
        }
        shape[0] = p->n;
        sp->start[0] += p->lo;
        sp->sharded = bp->sharded || z->zu[z->a->unit[i]].N > 1; /* the same on every rank, even where this
                                                                      slice is whole */
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
        if (z->stage == 3) DT__TRY(dt__pl_copy(z->ctx, &sp->value, 0, &bp->value, p->lo * p->row_elems, sp->value.numel, 0));
        if (z->zu[z->a->unit[i]].expert) { /* distinct over ep, and over tp where a later dim is split */
            int tps = 0;
            for (d = 1; d < bp->value.ndim; d++) tps |= bp->global_shape[d] && bp->value.shape[d] < bp->global_shape[d];
            z->param_comms[i] = z->stage == 0 ? (tps ? z->l->eptp_comm : z->l->ep_comm)
                                              : (tps ? z->l->dptp_comm : z->l->dpcp_comm);
        } else
            z->param_comms[i] = z->stage == 0 ? (bp->sharded ? z->l->tp_comm : NULL)
                                              : (bp->sharded ? z->l->dptp_comm : z->l->dpcp_comm);
    }
    return DT_OK;
}

/* dt_zero_create in three steps: check the desc and the arena (nothing changes on a failure);
   resolve the desc into the object (the stage's group size and rank, prefetch) and each param's
   and unit's geometry; build the shard buffers, the optimizer's parameter set, stage 0's bucketer
   and the optimizer. Only then does the arena give up what the stage shards. */
static dt_status dt__pl_zero_check(dt_ctx *ctx, const dt_arena *a, const dt_zero_desc *d, const char *fn) {
    int i;
    if (d->stage < 0 || d->stage > 3)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.stage = %d; expected 0 (DDP), 1, 2 or 3", fn, d->stage);
    if (d->bucket_bytes < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.bucket_bytes = %lld; expected >= 0 (0 = default)", fn,
                                (long long)d->bucket_bytes);
    if (d->prefetch < -1 || d->prefetch > 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.prefetch = %d; expected 0 (default, on), 1 (on) or -1 "
                                "(off)", fn, d->prefetch);
    for (i = 0; i < a->params->count; i++) {
        const dt_param *p = a->params->items[i];
        if (!p->value.data || !p->grad.data)
            return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: parameter \"%s\" has no %s: the arena is already used by "
                                    "a ZeRO object of stage 2 or 3 (one per arena)", fn, p->name,
                                    p->value.data ? "grad" : "value");
    }
    return DT_OK;
}

/* The object with the desc resolved and its per-param and per-unit arrays; NULL (everything
   freed) when out of memory. */
static dt_zero *dt__pl_zero_new(dt_layout *l, dt_arena *a, const dt_zero_desc *d, const char *fn) {
    dt_ctx *ctx = l->ctx;
    dt_zero *z = (dt_zero *)dt_alloc_zeroed(ctx, sizeof *z);
    int k;
    if (!z) return NULL;
    z->ctx = ctx;
    z->l = l;
    z->a = a;
    z->dpcp = l->dpcp_comm;
    z->stage = d->stage;
    z->N = d->stage == 0 ? 1 : l->dpcp;
    z->r = d->stage == 0 ? 0 : l->dpcp_rank;
    z->n_params = a->params->count;
    z->n_units = a->n_units;
    z->prefetch = d->prefetch != -1;
    z->sync = 1;
    z->zp = (dt__pl_zp *)dt__pl_alloc_n(ctx, z->n_params, sizeof(dt__pl_zp), fn, "params");
    z->zu = (dt__pl_zu *)dt__pl_alloc_n(ctx, z->n_units, sizeof(dt__pl_zu), fn, "units");
    z->param_comms = (dt_comm **)dt__pl_alloc_n(ctx, z->n_params, sizeof(dt_comm *), fn, "comms");
    if (!z->zp || !z->zu || !z->param_comms) {
        z->stage = -1; /* nothing of the arena was taken */
        dt__pl_zero_release(z);
        return NULL;
    }
    for (k = 0; k < z->n_units; k++) {
        dt__pl_zu *u = &z->zu[k];
        u->expert = d->expert_units && d->expert_units[k];
        u->comm = u->expert ? l->edp_comm : l->dpcp_comm;
        u->N = d->stage == 0 ? 1 : u->expert ? l->edp : l->dpcp;
        u->r = d->stage == 0 ? 0 : u->expert ? l->edp_rank : l->dpcp_rank;
    }
    return z;
}

/* The shard buffers this rank keeps: its rows of the grads (stages 2-3) and of the values, one
   buffer per dtype (stage 3). */
static dt_status dt__pl_zero_buffers(dt_zero *z) {
    int i, t;
    if (z->stage >= 2) {
        int64_t n = 0;
        for (i = 0; i < z->n_params; i++) n += z->zp[i].n * z->zp[i].row_elems;
        DT__TRY(dt__pl_ztake(z, &z->sgrad, DT_F32, n, &z->base_grad));
    }
    for (t = 1; t < DT_DTYPE_COUNT && z->stage == 3; t++) {
        int64_t n = 0;
        int any = 0;
        for (i = 0; i < z->n_params; i++)
            if ((int)z->a->params->items[i]->value.dtype == t) {
                n += z->zp[i].n * z->zp[i].row_elems;
                any = 1; /* even when this rank's rows are none: its params' views look into it */
            }
        if (any) DT__TRY(dt__pl_ztake(z, &z->sval[t], (dt_dtype)t, n, &z->base_param));
    }
    return DT_OK;
}

/* Stage 0's bucketer over the arena's flat grads, then the optimizer over this rank's shard. */
static dt_status dt__pl_zero_opt(dt_zero *z, const dt_zero_desc *d) {
    dt_opt_desc od;
    if (z->stage == 0) {
        dt_bucketer_desc bd;
        int k, i, experts = 0;
        memset(&bd, 0, sizeof bd);
        bd.bucket_bytes = bd.first_bucket_bytes = d->bucket_bytes;
        for (k = 0; k < z->n_units; k++) experts |= z->zu[k].expert;
        if (!experts) {
            bd.flat = &z->a->grads;
            DT__TRY(dt_bucketer_create(z->dpcp, &z->ddp, z->a->params, &bd));
        } else { /* two groups: each bucketer copies its params' grads in and out (they interleave) */
            dt_params *two[2];
            two[0] = &z->dense_ps;
            two[1] = &z->expert_ps;
            for (k = 0; k < 2; k++) {
                two[k]->items = (dt_param **)dt__pl_alloc_n(z->ctx, z->n_params, sizeof(dt_param *), "dt_zero_create",
                                                            "params");
                if (!two[k]->items) return DT_ERR_OOM;
                two[k]->capacity = z->n_params;
            }
            for (i = 0; i < z->n_params; i++) {
                dt_params *to = two[z->zu[z->a->unit[i]].expert];
                to->items[to->count++] = z->a->params->items[i];
            }
            DT__TRY(dt_bucketer_create(z->dpcp, &z->ddp, &z->dense_ps, &bd));
            DT__TRY(dt_bucketer_create(z->l->edp_comm, &z->eddp, &z->expert_ps, &bd));
        }
    }
    od = d->opt;
    od.comm = z->l->world;
    od.norm.shard_comm = z->stage == 0 ? z->l->tp_comm : z->l->dpcp_comm;
    od.norm.param_comms = z->param_comms;
    od.norm.stage_comm = z->l->pp_comm;
    return dt_opt_create(z->ctx, &z->opt, &z->shard, &od);
}

/* The arena gives up what the stage shards (nothing fails here). */
static void dt__pl_zero_take_arena(dt_zero *z) {
    dt_arena *a = z->a;
    int i, t;
    if (z->stage < 3)
        for (t = 1; t < DT_DTYPE_COUNT; t++) z->base_param += dt_tensor_bytes(&a->values[t]);
    if (z->stage < 2) {
        z->base_grad += dt_tensor_bytes(&a->grads);
        dt_tensor_fill(z->ctx, &a->grads, 0.0);
    }
    if (z->stage >= 2) {
        dt_tensor_free(z->ctx, &a->grads);
        for (i = 0; i < z->n_params; i++) a->params->items[i]->grad.data = NULL;
    }
    if (z->stage == 3) {
        for (t = 1; t < DT_DTYPE_COUNT; t++) dt_tensor_free(z->ctx, &a->values[t]);
        for (i = 0; i < z->n_params; i++) a->params->items[i]->value.data = NULL;
    }
}

DT_API dt_status dt_zero_create(dt_layout *l, dt_zero **out, dt_arena *a, const dt_zero_desc *desc) {
    const char *fn = "dt_zero_create";
    dt_zero_desc d;
    dt_zero *z;
    dt_ctx *ctx;
    dt_status st;
    if (out) *out = NULL;
    if (!l) return DT_ERR_ARG;
    ctx = l->ctx;
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    if (!a) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: a is NULL", fn);
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    DT__TRY(dt__pl_zero_check(ctx, a, &d, fn));
    if (!(z = dt__pl_zero_new(l, a, &d, fn))) return DT_ERR_OOM;
    st = dt__pl_zgeometry(z, fn);
    if (!st) st = dt__pl_zero_buffers(z);
    if (!st) st = dt__pl_zshard_set(z);
    if (!st) st = dt__pl_zero_opt(z, &d);
    if (st) {
        z->stage = -1; /* nothing of the arena was taken yet */
        dt__pl_zero_release(z);
        return st;
    }
    dt__pl_zero_take_arena(z);
    z->peak = 0;
    dt__pl_znote(z);
    *out = z;
    return DT_OK;
}

/* The call order every stage shares (see dt_zero_backward_begin), checked at every stage alike
   so a program that works at one stage works at the others: at stages 2-3 a backward without
   dt_zero_backward_begin has no grads to write, and grads synced twice or not at all would be
   wrong without an error. Each rank sees its own calls: one that breaks the order fails alone
   before any collective (the others then time out in the step's). */
static dt_status dt__pl_zorder_ready(dt_zero *z, const dt__pl_zu *u, int unit) {
    const char *fn = "dt_zero_grad_ready";
    if (!z->backward)
        return dt_ctx_set_error(z->ctx, DT_ERR_STATE, "%s: unit %d: no dt_zero_backward_begin since the last "
                                "dt_zero_micro_begin / dt_zero_step; call dt_zero_backward_begin before the backward "
                                "(at stages 2-3 it is what makes the grads exist)", fn, unit);
    if (u->ready && !u->used)
        return dt_ctx_set_error(z->ctx, DT_ERR_STATE, "%s: unit %d is ready already in this backward (dt_zero_grad_ready "
                                "twice, with no dt_zero_gather of it in between); call it once per unit, after the "
                                "unit's last use (a unit used again is gathered again first)", fn, unit);
    return DT_OK;
}

static dt_status dt__pl_zorder_step(dt_zero *z) {
    const char *fn = "dt_zero_step";
    int k, n = 0;
    if (!z->backward)
        return dt_ctx_set_error(z->ctx, DT_ERR_STATE, "%s: no dt_zero_backward_begin since the last dt_zero_micro_begin "
                                "/ dt_zero_step (stage %d); every micro-step's backward starts with "
                                "dt_zero_backward_begin", fn, z->stage);
    for (k = 0; k < z->n_units; k++) n += z->zu[k].ready != 0;
    for (k = 0; n && k < z->n_units; k++)
        if (!z->zu[k].ready)
            return dt_ctx_set_error(z->ctx, DT_ERR_STATE, "%s: unit %d had no dt_zero_grad_ready in this backward (%d "
                                    "of %d units had); call dt_zero_grad_ready for every unit, or for none (then "
                                    "dt_zero_step syncs them all)", fn, k, n, z->n_units);
    return DT_OK;
}

DT_API void dt_zero_free(dt_zero *z) {
    if (z) dt__pl_zero_release(z);
}

DT_API dt_optimizer *dt_zero_optimizer(dt_zero *z) { return z ? z->opt : NULL; }

DT_API dt_status dt_zero_micro_begin(dt_zero *z, float *dloss, int micro) {
    if (dloss) *dloss = 0.0f;
    if (!z) return DT_ERR_ARG;
    DT__TRY(dt_opt_micro_begin(z->opt, dloss, NULL, micro));
    /* the micro-step before's last reduce-scatters: finished before this forward's activations */
    if (z->stage >= 2) DT__TRY(dt__pl_zrs_bound(z, 0));
    z->sync = micro == z->opt->desc.accum_steps - 1;
    z->backward = 0;
    return DT_OK;
}

DT_API dt_status dt_zero_backward_begin(dt_zero *z) {
    int k;
    if (!z) return DT_ERR_ARG;
    z->backward = 1;
    for (k = 0; k < z->n_units; k++) z->zu[k].ready = z->zu[k].used = 0;
    return DT_OK;
}

DT_API dt_status dt_zero_gather(dt_zero *z, int unit) {
    const char *fn = "dt_zero_gather";
    dt__pl_zu *u;
    int i;
    if (!z) return DT_ERR_ARG;
    DT__TRY(dt__pl_zunit_arg(z, unit, fn));
    u = &z->zu[unit];
    if (z->backward) u->used = 1;
    if (z->stage == 0 && z->backward && z->sync && u->ready)
        return dt_ctx_set_error(z->ctx, DT_ERR_STATE, "%s: unit %d's grads are in a bucket's all-reduce "
                                "(dt_zero_grad_ready was called for it in this backward); call grad_ready after a "
                                "unit's last use", fn, unit);
    if (z->stage >= 2 && z->backward && !u->gfull.data) { /* its full grads, from the first gather on */
        DT__TRY(dt__pl_ztake(z, &u->gfull, DT_F32, u->gnumel, &z->live_grad));
        for (i = u->first; i < u->last; i++)
            z->a->params->items[i]->grad.data = dt__pl_at(&u->gfull, z->zp[i].ug);
    }
    if (z->stage == 3) {
        if (!u->refs) {
            if (!u->vposted) DT__TRY(dt__pl_zgather_post(z, u));
            DT__TRY(dt__pl_zgather_finish(z, u, 1));
        }
        u->refs++;
        if (z->prefetch) { /* the next unit in call order: forward goes up, backward down */
            int v = z->backward ? unit - 1 : unit + 1;
            if (v >= 0 && v < z->n_units && !z->zu[v].refs && !z->zu[v].vposted)
                DT__TRY(dt__pl_zgather_post(z, &z->zu[v]));
        }
    }
    return DT_OK;
}

DT_API dt_status dt_zero_release(dt_zero *z, int unit) {
    dt__pl_zu *u;
    if (!z) return DT_ERR_ARG;
    DT__TRY(dt__pl_zunit_arg(z, unit, "dt_zero_release"));
    u = &z->zu[unit];
    if (z->stage == 3 && u->refs > 0 && --u->refs == 0) dt__pl_zvalues_drop(z, u);
    return DT_OK;
}

DT_API dt_status dt_zero_grad_ready(dt_zero *z, int unit) {
    const char *fn = "dt_zero_grad_ready";
    dt__pl_zu *u;
    if (!z) return DT_ERR_ARG;
    DT__TRY(dt__pl_zunit_arg(z, unit, fn));
    u = &z->zu[unit];
    DT__TRY(dt__pl_zorder_ready(z, u, unit));
    u->used = 0;
    if (z->stage == 0) {
        int i;
        u->ready = 1;
        if (!z->sync) return DT_OK; /* an accumulation micro-step: grads stay local */
        for (i = u->first; i < u->last; i++)
            DT__TRY(dt_bucketer_mark_ready(u->expert ? z->eddp : z->ddp, z->a->params->items[i]));
        return DT_OK;
    }
    u->ready = 1;
    if (z->stage == 1) return DT_OK;
    if (u->gfull.data) {
        if (u->greq) DT__TRY(dt__pl_zrs_finish(z, u)); /* a second use of the unit in this backward */
        DT__TRY(dt__pl_zrs_post(z, u));
    }
    return dt__pl_zpoll(z);
}

DT_API dt_status dt_zero_step(dt_zero *z, dt_opt_step_info *info) {
    dt_opt_step_info inf;
    dt_status st = DT_OK;
    int k;
    if (info) memset(info, 0, sizeof *info);
    if (!z) return DT_ERR_ARG;
    DT__TRY(dt__pl_zorder_step(z));
    /* 1. finish the gradient sync */
    if (z->stage == 0) {
        st = dt_bucketer_finish(z->ddp);
        if (!st && z->eddp) st = dt_bucketer_finish(z->eddp);
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
    if (out) memset(out, 0, sizeof *out);
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
    cv = psi > 0 ? vb / psi : 0;
    cg = 4;
    cm = psi > 0 ? (mb + sb) / psi : 0;
    for (k = 0; k < 2; k++) { /* the dense params over dp x cp, the experts' (desc.expert_units) over edp */
        double p = 0;
        N = k ? z->l->edp : z->l->dpcp;
        for (i = 0; i < z->n_params; i++)
            if (z->zu[z->a->unit[i]].expert == k) p += (double)z->a->params->items[i]->value.numel;
        switch (z->stage) {
        case 0: m.formula_bytes += p * (cv + cg + cm); break;
        case 1: m.formula_bytes += p * (cv + cg) + p * cm / N; break;
        case 2: m.formula_bytes += p * cv + p * (cg + cm) / N; break;
        default: m.formula_bytes += p * (cv + cg + cm) / N; break;
        }
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
    for (k = 0; k < z->n_units; k++) {
        if (z->zu[k].refs)
            return dt_ctx_set_error(z->ctx, DT_ERR_STATE, "dt_zero_checkpoint_load: unit %d is gathered (dt_zero_gather "
                                    "with no dt_zero_release); load between steps, with every unit released", k);
        if (z->zu[k].gfull.data || z->zu[k].greq)
            return dt_ctx_set_error(z->ctx, DT_ERR_STATE, "dt_zero_checkpoint_load: unit %d has grads of a backward not "
                                    "yet stepped (dt_zero_backward_begin, no dt_zero_step); load between steps", k);
    }
    /* a prefetch (the unit after the last one gathered) holds the values of before the load:
       finished and dropped (every rank posted it: the same calls post the same prefetches) */
    for (k = 0; k < z->n_units; k++)
        if (z->zu[k].vposted) DT__TRY(dt__pl_zgather_finish(z, &z->zu[k], 0));
    d = *desc;
    d.comm = z->l->world;
    d.layout = dt_layout_string(z->l, lay, sizeof lay);
    DT__TRY(dt_checkpoint_load(z->ctx, &z->shard, z->opt, state, &d));
    if (z->stage < 2) dt_tensor_fill(z->ctx, &z->a->grads, 0.0);
    else dt_tensor_fill(z->ctx, &z->sgrad, 0.0);
    /* this rank's rows were loaded; stages 1-2 keep the whole values */
    return z->stage == 1 || z->stage == 2 ? dt__pl_zallgather_all(z) : DT_OK;
}

/* ==== >>tp: tensor and sequence parallel layers =============================================== */


/* dt_check_tensor for either device: a cuda tensor is checked as its cpu shadow (shapes and
   dtypes; the data stays where it is). The ops these layers call check that operands share one. */
static dt_status dt__tp_chk(dt_ctx *ctx, const dt_tensor *t, dt_dtype dtype, const char *fn, const char *arg) {
    dt_tensor s;
    if (!t || t->device != DT_CUDA_DEVICE) return dt_check_tensor(ctx, t, dtype, fn, arg);
    s = *t;
    s.device = DT_CPU;
    return dt_check_tensor(ctx, &s, dtype, fn, arg);
}

/* Every tensor of a list (NULLs skipped) on the device of the first: else DT_ERR_DEVICE naming it. */
static dt_status dt__tp_same_device(dt_ctx *ctx, const char *fn, const dt_tensor *first, const char *first_name,
                                    const dt_tensor *t, const char *name) {
    if (!t || !first || t->device == first->device) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: %s is on %s but %s is on %s; expected one device", fn, name,
                            dt_device_name(t->device), first_name, dt_device_name(first->device));
}

static int64_t dt__tp_last(const dt_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }
static int64_t dt__tp_rows(const dt_tensor *t) {
    int64_t r = 1;
    int i;
    for (i = 0; i + 1 < t->ndim; i++) r *= t->shape[i]; /* fits: numel of a valid tensor fits */
    return r;
}

/* The layout has a tp group, and sp is a flag. */
static dt_status dt__tp_begin(dt_layout *l, int sp, const char *fn) {
    if (!l || !l->ctx) return DT_ERR_ARG;
    if (!l->tp_comm || l->tp < 1 || l->tp_rank < 0 || l->tp_rank >= l->tp || dt_comm_size(l->tp_comm) != l->tp)
        return dt_ctx_set_error(l->ctx, DT_ERR_STATE, "%s: the layout has no usable tp group (tp = %d, tp_rank = %d, "
                                "tp_comm %s); make it with dt_layout_create", fn, l->tp, l->tp_rank,
                                l->tp_comm ? "present" : "NULL");
    if (sp != 0 && sp != 1) return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: sp = %d; expected 0 or 1", fn, sp);
    return DT_OK;
}

/* t is an f32 CPU tensor of `rows` rows of `cols` (leading dims flattened). */
static dt_status dt__tp_mat(dt_ctx *ctx, const dt_tensor *t, int64_t rows, int64_t cols, const char *fn,
                            const char *arg, const char *why) {
    char s[96];
    DT__TRY(dt__tp_chk(ctx, t, DT_F32, fn, arg));
    if (t->ndim >= 1 && dt__tp_rows(t) == rows && dt__tp_last(t) == cols) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s shape %s; expected %lld rows of %lld (%s)", fn, arg,
                            dt_shape_str(t, s, sizeof s), (long long)rows, (long long)cols, why);
}

/* An activation of a linear with weight w, as dt__tp_mat: f32, or bf16 beside a bf16 w (dt_linear's
   bf16 activations); rows -1: its own (any). */
static dt_status dt__tp_act(dt_ctx *ctx, const dt_tensor *t, const dt_tensor *w, int64_t rows, int64_t cols,
                            const char *fn, const char *arg, const char *why) {
    dt_tensor f;
    if (t && w && w->dtype == DT_BF16 && t->dtype == DT_BF16) {
        f = *t;
        f.dtype = DT_F32;
        t = &f;
    }
    DT__TRY(dt__tp_chk(ctx, t, DT_F32, fn, arg));
    return dt__tp_mat(ctx, t, rows < 0 ? dt__tp_rows(t) : rows, cols, fn, arg, why);
}

/* w is an f32 2-D [rows, cols] weight of any size (or bf16: dt_linear's GEMMs in bf16, on the
   tensor cores or the CPU's AMX); bias (may be NULL) has w.shape[0] elements. */
static dt_status dt__tp_weight(dt_ctx *ctx, const dt_tensor *w, const dt_tensor *bias, int64_t bias_n,
                               const char *fn, const char *wn, const char *bn) {
    char s[96];
    int bf = w && w->dtype == DT_BF16;
    DT__TRY(dt__tp_chk(ctx, w, bf ? DT_BF16 : DT_F32, fn, wn));
    if (w->ndim != 2)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s shape %s; expected 2 dims", fn, wn,
                                dt_shape_str(w, s, sizeof s));
    if (!bias) return DT_OK;
    DT__TRY(dt__tp_chk(ctx, bias, DT_F32, fn, bn));
    if (bias->numel != bias_n)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s has %lld elements; expected %lld (%s)", fn, bn,
                                (long long)bias->numel, (long long)bias_n,
                                bias_n == w->shape[0] ? "w.shape[0]" : "out features");
    return DT_OK;
}

/* dw (may be NULL) has w's shape; dbias (may be NULL) w.shape[0] elements. */
static dt_status dt__tp_wgrads(dt_ctx *ctx, const dt_tensor *dw, const dt_tensor *dbias, const dt_tensor *w,
                               const char *fn) {
    if (dw) {
        char a[96], b[96];
        DT__TRY(dt__tp_chk(ctx, dw, DT_F32, fn, "dw"));
        if (!dt_tensor_same_shape(dw, w))
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: dw shape %s does not match w shape %s", fn,
                                    dt_shape_str(dw, a, sizeof a), dt_shape_str(w, b, sizeof b));
    }
    return dbias ? dt__tp_weight(ctx, w, dbias, w->shape[0], fn, "w", "dbias") : DT_OK;
}

/* N rows split over tp under sequence parallel: *local = N / tp. */
static dt_status dt__tp_split(dt_layout *l, int64_t N, int64_t *local, const char *fn, const char *what) {
    if (N % l->tp)
        return dt_ctx_set_error(l->ctx, DT_ERR_SHAPE, "%s: %s has %lld rows, not divisible by tp = %d (sequence "
                                "parallel gives each tp rank N/tp rows)", fn, what, (long long)N, l->tp);
    *local = N / l->tp;
    return DT_OK;
}

/* N = tp * local rows, checked. */
static dt_status dt__tp_times(dt_layout *l, int64_t local, int64_t *N, const char *fn, const char *what) {
    *N = 0;
    if (!dt_mul_ok(local, l->tp, N))
        return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: %s rows %lld x tp %d overflows int64", fn, what,
                                (long long)local, l->tp);
    return DT_OK;
}

/* Scratch that shares memory with an input would be overwritten before it is read: named. */
static dt_status dt__tp_apart(dt_ctx *ctx, const dt_tensor *scratch, const dt_tensor *in, const char *fn,
                              const char *sn, const char *in_name) {
    const char *a = (const char *)scratch->data, *b = (const char *)in->data;
    if (!a || !b || a + dt_tensor_bytes(scratch) <= b || b + dt_tensor_bytes(in) <= a) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s shares memory with %s; the scratch must be a buffer of its own",
                            fn, sn, in_name);
}

/* An op's output that shares a byte with one of its inputs (or another output, dt_tensor_overlap):
   named, before anything is written (it reads one while it writes the other); dt__par_same_or_apart
   lets the ops that run in place have out be in itself. */
static dt_status dt__par_apart(dt_ctx *ctx, const dt_tensor *o, const dt_tensor *in, const char *fn, const char *on,
                               const char *in_name) {
    if (!dt_tensor_overlap(o, in)) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s shares memory with %s; expected an op's outputs apart from its "
                            "inputs (it reads one while it writes the other)", fn, on, in_name);
}
static dt_status dt__par_same_or_apart(dt_ctx *ctx, const dt_tensor *o, const dt_tensor *in, const char *fn,
                                       const char *on, const char *in_name) {
    return dt_tensor_overlap(o, in) == 2 ? DT_OK : dt__par_apart(ctx, o, in, fn, on, in_name);
}

/* A [rows, cols] view of t (leading dims flattened) for the 2-D matmul. */
static dt_status dt__tp_2d(dt_ctx *ctx, dt_tensor *v, const dt_tensor *t) {
    int64_t shape[2];
    shape[0] = dt__tp_rows(t);
    shape[1] = dt__tp_last(t);
    return dt_tensor_reshape(ctx, v, t, 2, shape);
}

DT_API dt_status dt_tp_param_desc(const dt_layout *l, dt_param_desc *desc, dt_tp_kind kind, int64_t global_rows,
                                  int64_t global_cols) {
    const char *fn = "dt_tp_param_desc";
    int64_t g[3] = {global_rows, global_cols, 0}, s[3], st[3] = {0, 0, 0}, cut;
    int nd = global_cols ? 2 : 1, d, cdim = -1;
    if (!l || !l->ctx) return DT_ERR_ARG;
    if (!desc) return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: desc is NULL", fn);
    if (l->tp < 1 || l->tp_rank < 0 || l->tp_rank >= l->tp)
        return dt_ctx_set_error(l->ctx, DT_ERR_STATE, "%s: the layout has tp = %d, tp_rank = %d", fn, l->tp, l->tp_rank);
    if ((int)kind < 0 || kind >= DT_TP_KIND_COUNT)
        return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: kind = %d is not a dt_tp_kind", fn, (int)kind);
    if (global_rows < 0 || global_cols < 0)
        return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: global_rows = %lld, global_cols = %lld; expected >= 0", fn,
                                (long long)global_rows, (long long)global_cols);
    if (kind == DT_TP_COLUMN) cdim = 0;
    if (kind == DT_TP_ROW) {
        if (nd == 1)
            return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: kind DT_TP_ROW with global_cols = 0 (a vector); a "
                                    "row-parallel bias is whole: DT_TP_REPLICATED", fn);
        cdim = 1;
    }
    if (kind == DT_TP_QKV) { /* [3C, C] -> [3, C, C]; [3C] -> [3, C] */
        if (global_rows % 3)
            return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: DT_TP_QKV global_rows = %lld is not 3*C", fn,
                                    (long long)global_rows);
        g[0] = 3; g[1] = global_rows / 3; g[2] = global_cols;
        nd++;
        cdim = 1;
    }
    if (cdim >= 0 && g[cdim] % l->tp)
        return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: %s = %lld is not divisible by tp = %d", fn,
                                kind == DT_TP_QKV ? "C (global_rows / 3)" : cdim ? "global_cols" : "global_rows",
                                (long long)g[cdim], l->tp);
    for (d = 0; d < 3; d++) s[d] = g[d];
    if (cdim >= 0) {
        cut = g[cdim] / l->tp;
        s[cdim] = cut;
        st[cdim] = cut * l->tp_rank;
    }
    memset(desc->shape, 0, sizeof desc->shape);
    memset(desc->global_shape, 0, sizeof desc->global_shape);
    memset(desc->start, 0, sizeof desc->start);
    for (d = 0; d < nd; d++) {
        desc->shape[d] = s[d];
        desc->global_shape[d] = g[d];
        desc->start[d] = st[d];
    }
    desc->ndim = nd;
    return DT_OK;
}

DT_API dt_status dt_tp_allreduce(dt_layout *l, dt_tensor *x) {
    const char *fn = "dt_tp_allreduce";
    DT__TRY(dt__tp_begin(l, 0, fn));
    DT__TRY(dt__tp_chk(l->ctx, x, DT_DTYPE_DEFAULT, fn, "x"));
    if (l->tp == 1) return DT_OK;
    return dt_comm_allreduce(l->tp_comm, x, DT_REDUCE_SUM);
}

static dt_status dt__sp_rows_check(dt_layout *l, const dt_tensor *full, const dt_tensor *shard, const char *fn) {
    int64_t N = 0;
    char a[96], b[96];
    DT__TRY(dt__tp_chk(l->ctx, full, DT_DTYPE_DEFAULT, fn, "full"));
    DT__TRY(dt__tp_chk(l->ctx, shard, DT_DTYPE_DEFAULT, fn, "shard"));
    if (full->dtype != shard->dtype)
        return dt_ctx_set_error(l->ctx, DT_ERR_DTYPE, "%s: full is %s, shard is %s; expected the same dtype", fn,
                                dt_dtype_name(full->dtype), dt_dtype_name(shard->dtype));
    DT__TRY(dt__tp_times(l, dt__tp_rows(shard), &N, fn, "shard"));
    if (full->ndim < 1 || shard->ndim < 1 || dt__tp_last(full) != dt__tp_last(shard) || dt__tp_rows(full) != N)
        return dt_ctx_set_error(l->ctx, DT_ERR_SHAPE, "%s: full shape %s, shard shape %s; expected full = tp (%d) x "
                                "shard rows of the same width", fn, dt_shape_str(full, a, sizeof a),
                                dt_shape_str(shard, b, sizeof b), l->tp);
    return DT_OK;
}

DT_API dt_status dt_sp_gather_rows(dt_layout *l, dt_tensor *full, const dt_tensor *shard) {
    const char *fn = "dt_sp_gather_rows";
    DT__TRY(dt__tp_begin(l, 0, fn));
    DT__TRY(dt__sp_rows_check(l, full, shard, fn));
    if (l->tp == 1) return full->data == shard->data ? DT_OK : dt_tensor_copy(l->ctx, full, shard);
    return dt_comm_allgather(l->tp_comm, full, shard);
}

DT_API dt_status dt_sp_scatter_rows(dt_layout *l, dt_tensor *shard, const dt_tensor *full) {
    const char *fn = "dt_sp_scatter_rows";
    DT__TRY(dt__tp_begin(l, 0, fn));
    DT__TRY(dt__sp_rows_check(l, full, shard, fn));
    if (l->tp == 1) return full->data == shard->data ? DT_OK : dt_tensor_copy(l->ctx, shard, full);
    return dt_comm_reduce_scatter(l->tp_comm, shard, full, DT_REDUCE_SUM);
}

/* ---- column-parallel linear */

static dt_status dt__tp_column_fwd(dt_layout *l, dt_tensor *out, dt_tensor *pre, dt_tensor *xbuf, const dt_tensor *x,
                                   const dt_tensor *w, const dt_tensor *bias, int sp, const char *fn) {
    const dt_tensor *xall = x;
    int64_t N, In;
    DT__TRY(dt__tp_begin(l, sp, fn));
    DT__TRY(dt__tp_weight(l->ctx, w, bias, w ? w->shape[0] : 0, fn, "w", "bias"));
    In = w->shape[1];
    DT__TRY(dt__tp_act(l->ctx, x, w, -1, In, fn, "x", "w.shape[1] in features"));
    N = dt__tp_rows(x);
    if (sp) {
        DT__TRY(dt__tp_times(l, N, &N, fn, "x"));
        DT__TRY(dt__tp_act(l->ctx, xbuf, w, N, In, fn, "xbuf", "tp x the rows of x: the gathered input"));
        DT__TRY(dt__tp_apart(l->ctx, xbuf, x, fn, "xbuf", "x")); /* the gather writes it before the GEMM */
        DT__TRY(dt__tp_apart(l->ctx, xbuf, w, fn, "xbuf", "w"));
        if (bias) DT__TRY(dt__tp_apart(l->ctx, xbuf, bias, fn, "xbuf", "bias"));
        DT__TRY(dt__tp_apart(l->ctx, xbuf, out, fn, "xbuf", "out"));
        if (pre) DT__TRY(dt__tp_apart(l->ctx, xbuf, pre, fn, "xbuf", "pre"));
        xall = xbuf;
    }
    DT__TRY(dt__tp_act(l->ctx, out, w, N, w->shape[0], fn, "out", "the rows of x_all by w.shape[0], this rank's "
                          "out features"));
    if (pre) DT__TRY(dt__tp_act(l->ctx, pre, w, N, w->shape[0], fn, "pre", "out's shape"));
    if (sp) DT__TRY(dt_sp_gather_rows(l, xbuf, x));
    return pre ? dt_linear_gelu_fwd(l->ctx, out, pre, xall, w, bias) : dt_linear_fwd(l->ctx, out, xall, w, bias);
}

DT_API dt_status dt_tp_column_linear_fwd(dt_layout *l, dt_tensor *out, dt_tensor *xbuf, const dt_tensor *x,
                                         const dt_tensor *w, const dt_tensor *bias, int sp) {
    return dt__tp_column_fwd(l, out, NULL, xbuf, x, w, bias, sp, "dt_tp_column_linear_fwd");
}

DT_API dt_status dt_tp_column_linear_gelu_fwd(dt_layout *l, dt_tensor *out, dt_tensor *pre, dt_tensor *xbuf,
                                              const dt_tensor *x, const dt_tensor *w, const dt_tensor *bias, int sp) {
    const char *fn = "dt_tp_column_linear_gelu_fwd";
    if (l && l->ctx && !pre) return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: pre is NULL", fn);
    return dt__tp_column_fwd(l, out, pre, xbuf, x, w, bias, sp, fn);
}

DT_API dt_status dt_tp_column_linear_bwd(dt_layout *l, dt_tensor *dx, dt_tensor *dw, dt_tensor *dbias,
                                         dt_tensor *dxbuf, const dt_tensor *dout, const dt_tensor *xbuf_or_x,
                                         const dt_tensor *w, int sp) {
    const char *fn = "dt_tp_column_linear_bwd";
    const dt_tensor *xall = xbuf_or_x;
    dt_tensor d2, w2, sum;
    dt_comm_req *req = NULL;
    dt_status st, st2;
    int64_t N, In, O, nl = 0;
    DT__TRY(dt__tp_begin(l, sp, fn));
    DT__TRY(dt__tp_weight(l->ctx, w, NULL, 0, fn, "w", "bias"));
    O = w->shape[0]; In = w->shape[1];
    DT__TRY(dt__tp_act(l->ctx, xall, w, -1, In, fn, "xbuf_or_x", "w.shape[1] in features"));
    N = dt__tp_rows(xall);
    DT__TRY(dt__tp_act(l->ctx, dout, w, N, O, fn, "dout", "the rows of x_all by w.shape[0]"));
    if (sp) DT__TRY(dt__tp_split(l, N, &nl, fn, "xbuf_or_x"));
    DT__TRY(dt__tp_wgrads(l->ctx, dw, dbias, w, fn));
    if (dx) DT__TRY(dt__tp_mat(l->ctx, dx, sp ? nl : N, In, fn, "dx", sp ? "this rank's rows of x_all" : "as x"));
    if (dx && (dxbuf || l->tp > 1))
        DT__TRY(dt__tp_mat(l->ctx, dxbuf, N, In, fn, "dxbuf", "as x_all: the scratch of the sum over tp"));
    if (dx && dxbuf) {
        DT__TRY(dt__tp_apart(l->ctx, dxbuf, xall, fn, "dxbuf", "xbuf_or_x"));
        DT__TRY(dt__tp_apart(l->ctx, dxbuf, dout, fn, "dxbuf", "dout"));
        DT__TRY(dt__tp_apart(l->ctx, dxbuf, w, fn, "dxbuf", "w"));
    }
    if (dx && l->tp == 1) return dt_linear_bwd(l->ctx, dx, dw, dbias, dout, xall, w); /* the plain op */
    if (dx) {
        /* dxbuf = this rank's part of dx; its sum over tp travels while dw and dbias are computed */
        DT__TRY(dt__tp_2d(l->ctx, &d2, dout));
        DT__TRY(dt__tp_2d(l->ctx, &sum, dxbuf));
        if (w->dtype == DT_BF16) { /* dt_linear's bf16 GEMMs: 0, then += dout w */
            DT__TRY(dt_tensor_fill(l->ctx, &sum, 0.0));
            DT__TRY(dt_linear_bwd(l->ctx, &sum, NULL, NULL, &d2, xall, w));
        } else
            DT__TRY(dt_matmul_fwd(l->ctx, &sum, &d2, w, 0, 0, 1.0f, 0.0f));
        if (sp) {
            int64_t shape[2];
            w2 = sum;
            shape[0] = nl; shape[1] = In;
            DT__TRY(dt_tensor_view(l->ctx, &sum, &w2, nl * In * l->tp_rank, 2, shape)); /* in place: own block */
            DT__TRY(dt_comm_ireduce_scatter(l->tp_comm, &sum, &w2, DT_REDUCE_SUM, &req));
        } else {
            DT__TRY(dt_comm_iallreduce(l->tp_comm, &sum, DT_REDUCE_SUM, &req));
        }
    }
    st = dw || dbias ? dt_linear_bwd(l->ctx, NULL, dw, dbias, dout, xall, w) : DT_OK;
    if (!req) return st;
    st2 = dt_comm_wait(req); /* every request ends with one wait, even after an error */
    if (st) return st;
    if (st2) return st2;
    return dt_axpy(l->ctx, dx, 1.0f, &sum);
}

/* ---- row-parallel linear */

/* What the row-parallel forward and backward check alike, in this order: w (bias may be NULL),
   x [N rows, w.shape[1]] (*nl = N / tp under sp), and y (out or dout: this rank's rows under sp). */
static dt_status dt__tp_row_args(dt_layout *l, const dt_tensor *y, const char *yn, const dt_tensor *x,
                                 const dt_tensor *w, const dt_tensor *bias, int sp, int64_t *N, int64_t *nl,
                                 const char *fn) {
    DT__TRY(dt__tp_begin(l, sp, fn));
    DT__TRY(dt__tp_weight(l->ctx, w, bias, w ? w->shape[0] : 0, fn, "w", "bias"));
    DT__TRY(dt__tp_act(l->ctx, x, w, -1, w->shape[1], fn, "x", "w.shape[1], this rank's in features"));
    *N = dt__tp_rows(x);
    if (sp) DT__TRY(dt__tp_split(l, *N, nl, fn, "x"));
    return dt__tp_mat(l->ctx, y, sp ? *nl : *N, w->shape[0], fn, yn, sp ? "this rank's rows of x by w.shape[0]" :
                      "the rows of x by w.shape[0]");
}

DT_API dt_status dt_tp_row_linear_fwd(dt_layout *l, dt_tensor *out, dt_tensor *partial, const dt_tensor *x,
                                      const dt_tensor *w, const dt_tensor *bias, int sp) {
    const char *fn = "dt_tp_row_linear_fwd";
    int64_t N, O, nl = 0;
    DT__TRY(dt__tp_row_args(l, out, "out", x, w, bias, sp, &N, &nl, fn));
    O = w->shape[0];
    if (partial || (sp && l->tp > 1))
        DT__TRY(dt__tp_mat(l->ctx, partial, N, O, fn, "partial", "the rows of x by w.shape[0]: the scratch of "
                              "the sum over tp"));
    if (partial && sp && l->tp > 1) DT__TRY(dt__tp_apart(l->ctx, partial, x, fn, "partial", "x"));
    if (l->tp == 1) return dt_linear_fwd(l->ctx, out, x, w, bias); /* the plain op */
    if (sp) {
        DT__TRY(dt_linear_fwd(l->ctx, partial, x, w, NULL));
        DT__TRY(dt_comm_reduce_scatter(l->tp_comm, out, partial, DT_REDUCE_SUM));
    } else {
        DT__TRY(dt_linear_fwd(l->ctx, out, x, w, NULL));
        DT__TRY(dt_comm_allreduce(l->tp_comm, out, DT_REDUCE_SUM));
    }
    /* once, after the sum: every rank holds the whole bias */
    return bias ? dt_bias_add_fwd(l->ctx, out, bias) : DT_OK;
}

DT_API dt_status dt_tp_row_linear_bwd(dt_layout *l, dt_tensor *dx, dt_tensor *dw, dt_tensor *dbias,
                                      dt_tensor *doutbuf, const dt_tensor *dout, const dt_tensor *x,
                                      const dt_tensor *w, int sp) {
    const char *fn = "dt_tp_row_linear_bwd";
    const dt_tensor *dall = dout;
    int64_t N, O, nl = 0;
    int fuse;
    DT__TRY(dt__tp_row_args(l, dout, "dout", x, w, NULL, sp, &N, &nl, fn));
    O = w->shape[0];
    if (sp && l->tp > 1) {
        DT__TRY(dt__tp_mat(l->ctx, doutbuf, N, O, fn, "doutbuf", "the rows of x by w.shape[0]: the gathered dout"));
        DT__TRY(dt__tp_apart(l->ctx, doutbuf, x, fn, "doutbuf", "x"));
        DT__TRY(dt__tp_apart(l->ctx, doutbuf, w, fn, "doutbuf", "w"));
        dall = doutbuf;
    }
    if (dx) DT__TRY(dt__tp_act(l->ctx, dx, w, N, w->shape[1], fn, "dx", "as x"));
    DT__TRY(dt__tp_wgrads(l->ctx, dw, dbias, w, fn));
    if (dall != dout) DT__TRY(dt_sp_gather_rows(l, doutbuf, dout));
    /* the bias was added after the sum: its grad is dout's (this rank's rows under sp: partial).
       Where dout is all of dw's rows, the dw GEMM makes it too (on CUDA in its epilogue) */
    fuse = dbias && dw && dall == dout;
    if (dx || dw) DT__TRY(dt_linear_bwd(l->ctx, dx, dw, fuse ? dbias : NULL, dall, x, w));
    return dbias && !fuse ? dt_bias_add_bwd(l->ctx, dbias, dout) : DT_OK;
}

/* ---- vocab-parallel embedding */

static int64_t dt__tp_id(const dt_tensor *ids, int64_t i) {
    return ids->dtype == DT_I32 ? ((const int32_t *)ids->data)[i] : ((const int64_t *)ids->data)[i];
}

/* The shard [vocab_start, vocab_start + Vl) of a padded vocab tp * Vl, and vocab within it. */
static dt_status dt__tp_vocab(dt_layout *l, int64_t Vl, int64_t vocab_start, int64_t vocab, const char *fn,
                              const char *what) {
    int64_t Vp = 0, want;
    DT__TRY(dt__tp_times(l, Vl, &Vp, fn, what));
    want = Vl * l->tp_rank;
    if (vocab_start != want)
        return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: vocab_start = %lld; expected tp_rank (%d) x %lld (%s) = %lld", fn,
                                (long long)vocab_start, l->tp_rank, (long long)Vl, what, (long long)want);
    if (vocab < 1 || vocab > Vp)
        return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: vocab = %lld; expected 1..%lld (the padded vocab, tp (%d) x "
                                "%lld %s)", fn, (long long)vocab, (long long)Vp, l->tp, (long long)Vl, what);
    return DT_OK;
}

/* ids valid (i32 / i64, in the vocab). On cuda the check runs on the device and a failure is
   reported by the next dt_ctx_sync or loss read (the kernels give an id out of range nothing):
   reading the ids here would stop the step. */
static dt_status dt__tp_ids(dt_layout *l, const dt_tensor *ids, int64_t vocab, const char *fn) {
    int64_t i;
    DT__TRY(dt__tp_chk(l->ctx, ids, ids ? ids->dtype : DT_I32, fn, "ids"));
    if (ids->dtype != DT_I32 && ids->dtype != DT_I64)
        return dt_ctx_set_error(l->ctx, DT_ERR_DTYPE, "%s: ids has dtype %s; expected i32 or i64", fn,
                                dt_dtype_name(ids->dtype));
    if (ids->device == DT_CUDA_DEVICE)
        return dt_cuda_check_range(l->ctx, ids->data, ids->dtype, ids->numel, 0, vocab, 0, 0, fn, "ids");
    for (i = 0; i < ids->numel; i++) {
        int64_t id = dt__tp_id(ids, i);
        if (id < 0 || id >= vocab)
            return dt_ctx_set_error(l->ctx, DT_ERR_RANGE, "%s: ids[%lld] = %lld is outside the vocab [0, %lld)", fn,
                                    (long long)i, (long long)id, (long long)vocab);
    }
    return DT_OK;
}

/* What the embedding's forward and backward check alike, in this order: tab (table or dtable,
   tn) [Vl, C] is this rank's shard of the vocab, the ids are in the vocab (N of them; *nl = N / tp
   under sp), y (out or dout) holds this rank's ids by C. */
static dt_status dt__tp_emb_args(dt_layout *l, const dt_tensor *tab, const char *tn, const dt_tensor *y,
                                 const char *yn, const dt_tensor *ids, int64_t vocab_start, int64_t vocab, int sp,
                                 int64_t *N, int64_t *nl, const char *fn) {
    char rows[32], why[64];
    DT__TRY(dt__tp_weight(l->ctx, tab, NULL, 0, fn, tn, ""));
    snprintf(rows, sizeof rows, "%s rows", tn);
    DT__TRY(dt__tp_vocab(l, tab->shape[0], vocab_start, vocab, fn, rows));
    DT__TRY(dt__tp_ids(l, ids, vocab, fn));
    *N = ids->numel;
    if (sp) DT__TRY(dt__tp_split(l, *N, nl, fn, "ids"));
    snprintf(why, sizeof why, "%sids by %s.shape[1]", sp ? "this rank's " : "", tn);
    return dt__tp_mat(l->ctx, y, sp ? *nl : *N, tab->shape[1], fn, yn, why);
}

DT_API dt_status dt_tp_embedding_fwd(dt_layout *l, dt_tensor *out, dt_tensor *partial, const dt_tensor *table,
                                     const dt_tensor *ids, int64_t vocab_start, int64_t vocab, int sp) {
    const char *fn = "dt_tp_embedding_fwd";
    dt_tensor *dst = out;
    int64_t N, C, Vl, nl = 0, n;
    DT__TRY(dt__tp_begin(l, sp, fn));
    DT__TRY(dt__tp_emb_args(l, table, "table", out, "out", ids, vocab_start, vocab, sp, &N, &nl, fn));
    DT__TRY(dt__par_apart(l->ctx, out, table, fn, "out", "table"));
    DT__TRY(dt__par_apart(l->ctx, out, ids, fn, "out", "ids"));
    DT__TRY(dt__par_apart(l->ctx, partial, table, fn, "partial", "table"));
    DT__TRY(dt__par_apart(l->ctx, partial, ids, fn, "partial", "ids"));
    DT__TRY(dt__par_apart(l->ctx, partial, out, fn, "partial", "out"));
    Vl = table->shape[0]; C = table->shape[1];
    if (partial || (sp && l->tp > 1))
        DT__TRY(dt__tp_mat(l->ctx, partial, N, C, fn, "partial", "ids by table.shape[1]: the scratch of the sum"));
    if (sp && l->tp > 1) dst = partial;
    DT__TRY(dt__tp_same_device(l->ctx, fn, table, "table", dst, dst == out ? "out" : "partial"));
    DT__TRY(dt__tp_same_device(l->ctx, fn, table, "table", ids, "ids"));
    if (table->device == DT_CUDA_DEVICE) {
#ifdef DT_CUDA
        int e = dt_k_tp_embedding_fwd((float *)dst->data, (const float *)table->data, ids->data, ids->dtype == DT_I64, N,
                                      Vl, C, vocab_start, l->ctx->cuda_stream);
        if (e) return dt_ctx_set_error(l->ctx, DT_ERR_CUDA, "%s: dt_k_tp_embedding_fwd failed: %s", fn, dt_k_error_string(e));
#else
        return dt_ctx_set_error(l->ctx, DT_ERR_DEVICE, "%s: a cuda tensor, but dt was built without DT_CUDA", fn);
#endif
    } else
    for (n = 0; n < N; n++) {
        int64_t r = dt__tp_id(ids, n) - vocab_start;
        float *o = (float *)dst->data + n * C;
        if (r >= 0 && r < Vl) memcpy(o, (const float *)table->data + r * C, (size_t)C * sizeof(float));
        else memset(o, 0, (size_t)C * sizeof(float)); /* another rank's row: it adds the value */
    }
    if (l->tp == 1) return DT_OK;
    if (sp) return dt_comm_reduce_scatter(l->tp_comm, out, partial, DT_REDUCE_SUM);
    return dt_comm_allreduce(l->tp_comm, out, DT_REDUCE_SUM);
}

DT_API dt_status dt_tp_embedding_bwd(dt_layout *l, dt_tensor *dtable, dt_tensor *doutbuf, const dt_tensor *dout,
                                     const dt_tensor *ids, int64_t vocab_start, int64_t vocab, int sp) {
    const char *fn = "dt_tp_embedding_bwd";
    const dt_tensor *dall = dout;
    int64_t N, C, Vl, nl = 0, n, d;
    DT__TRY(dt__tp_begin(l, sp, fn));
    if (!dtable) return dt__tp_chk(l->ctx, dout, DT_F32, fn, "dout"); /* nothing wanted, nothing moved */
    DT__TRY(dt__tp_emb_args(l, dtable, "dtable", dout, "dout", ids, vocab_start, vocab, sp, &N, &nl, fn));
    DT__TRY(dt__par_apart(l->ctx, dtable, dout, fn, "dtable", "dout"));
    DT__TRY(dt__par_apart(l->ctx, dtable, ids, fn, "dtable", "ids"));
    if (sp && l->tp > 1) {
        DT__TRY(dt__par_apart(l->ctx, doutbuf, dout, fn, "doutbuf", "dout"));
        DT__TRY(dt__par_apart(l->ctx, doutbuf, ids, fn, "doutbuf", "ids"));
        DT__TRY(dt__par_apart(l->ctx, dtable, doutbuf, fn, "dtable", "doutbuf"));
    }
    Vl = dtable->shape[0]; C = dtable->shape[1];
    if (sp && l->tp > 1) {
        DT__TRY(dt__tp_mat(l->ctx, doutbuf, N, C, fn, "doutbuf", "ids by dtable.shape[1]: the gathered dout"));
        DT__TRY(dt_sp_gather_rows(l, doutbuf, dout));
        dall = doutbuf;
    }
    DT__TRY(dt__tp_same_device(l->ctx, fn, dtable, "dtable", dall, dall == dout ? "dout" : "doutbuf"));
    DT__TRY(dt__tp_same_device(l->ctx, fn, dtable, "dtable", ids, "ids"));
    if (dtable->device == DT_CUDA_DEVICE) {
#ifdef DT_CUDA
        size_t mark, bytes = dt_k_tp_embedding_bwd_scratch(N);
        void *keys;
        int e;
        if (N > 0 && (bytes == 0 || Vl >= 0xffffffffll))
            return dt_ctx_set_error(l->ctx, DT_ERR_UNSUPPORTED, "%s: %lld ids and %lld rows on cuda; expected fewer "
                                    "than 2^32 of each (the backward sorts (row, position) pairs in 64 bits)", fn,
                                    (long long)N, (long long)Vl);
        mark = dt_cuda_scratch_begin(l->ctx);
        keys = dt_cuda_scratch(l->ctx, bytes, fn);
        e = keys ? dt_k_tp_embedding_bwd((float *)dtable->data, (const float *)dall->data, ids->data,
                                         ids->dtype == DT_I64, N, Vl, C, vocab_start, keys, l->ctx->cuda_stream) : 0;
        dt_cuda_scratch_end(l->ctx, mark);
        if (!keys) return l->ctx->last_status;
        if (e) return dt_ctx_set_error(l->ctx, DT_ERR_CUDA, "%s: dt_k_tp_embedding_bwd failed: %s", fn, dt_k_error_string(e));
#else
        return dt_ctx_set_error(l->ctx, DT_ERR_DEVICE, "%s: a cuda tensor, but dt was built without DT_CUDA", fn);
#endif
        return DT_OK;
    }
    for (n = 0; n < N; n++) { /* in id order, as dt_embedding_bwd: the same sums, bitwise */
        int64_t r = dt__tp_id(ids, n) - vocab_start;
        float *row;
        const float *g = (const float *)dall->data + n * C;
        if (r < 0 || r >= Vl) continue;
        row = (float *)dtable->data + r * C;
        for (d = 0; d < C; d++) row[d] += g[d];
    }
    return DT_OK;
}

/* ---- vocab-parallel cross entropy */

/* The arguments, and the targets in range (on cuda: queued on the device, reported by the next
   dt_ctx_sync or loss read; the kernels give a target out of range nothing); on the host *n_valid
   (may be NULL) = the targets not ignored. */
static dt_status dt__tp_xent_check(dt_layout *l, const dt_tensor *logits, const dt_tensor *targets,
                                   int64_t vocab_start, int64_t vocab, int ignore_index, const char *fn,
                                   int64_t *n_valid) {
    int64_t N, r, nv = 0;
    DT__TRY(dt__tp_begin(l, 0, fn));
    DT__TRY(dt__tp_chk(l->ctx, logits, DT_F32, fn, "logits"));
    if (logits->ndim < 1)
        return dt_ctx_set_error(l->ctx, DT_ERR_SHAPE, "%s: logits is a scalar; expected [N, Vp/tp]", fn);
    DT__TRY(dt__tp_vocab(l, dt__tp_last(logits), vocab_start, vocab, fn, "logits.shape[-1]"));
    DT__TRY(dt__tp_chk(l->ctx, targets, DT_I32, fn, "targets"));
    N = dt__tp_rows(logits);
    if (targets->numel != N)
        return dt_ctx_set_error(l->ctx, DT_ERR_SHAPE, "%s: targets has %lld elements; expected %lld (logits rows)", fn,
                                (long long)targets->numel, (long long)N);
    if (N > 1073741823) /* INT_MAX / 2: dt_comm_allreduce_f64 counts in int, two doubles a row */
        return dt_ctx_set_error(l->ctx, DT_ERR_UNSUPPORTED, "%s: %lld rows; at most 1073741823 (two doubles per row "
                                "go through dt_comm_allreduce_f64)", fn, (long long)N);
    DT__TRY(dt__tp_same_device(l->ctx, fn, logits, "logits", targets, "targets"));
    if (targets->device == DT_CUDA_DEVICE)
        return dt_cuda_check_range(l->ctx, targets->data, DT_I32, N, 0, vocab, 1, ignore_index, fn, "targets");
    for (r = 0; r < N; r++) {
        int32_t t = ((const int32_t *)targets->data)[r];
        if (t != ignore_index && (t < 0 || t >= vocab))
            return dt_ctx_set_error(l->ctx, DT_ERR_RANGE, "%s: targets[%lld] = %d is outside [0, %lld) (vocab) and is "
                                    "not ignore_index = %d", fn, (long long)r, t, (long long)vocab, ignore_index);
        nv += t != ignore_index;
    }
    if (n_valid) *n_valid = nv;
    return DT_OK;
}

#ifdef DT_CUDA
/* A 1-D f32 device tensor over n floats of scratch: what dt_comm reduces. */
static dt_tensor dt__tp_dev_f32(float *p, int64_t n) {
    dt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = p;
    t.dtype = DT_F32;
    t.device = DT_CUDA_DEVICE;
    t.ndim = 1;
    t.shape[0] = t.numel = n;
    return t;
}

/* dt_tp_xent_fwd on cuda, all on the device (dt_k_tp_xent_*): per row, this rank's max, sum of
   exp and target logit; the max over tp, each rank's sum moved to that max, the sums over tp
   (device all-reduces, 3N floats); then the stats and the mean loss into dt_cuda_loss_slot. The
   all-reduce gives every rank the same per-row values, and the loss kernel sums them in a fixed
   order: every tp rank has bitwise the same loss. */
static dt_status dt__tp_xent_fwd_cuda(dt_layout *l, dt_tensor *stats, const dt_tensor *logits, const dt_tensor *targets,
                                      int64_t vocab_start, int ignore_index, int64_t N, int64_t Vl, int64_t nv,
                                      const char *fn) {
    dt_ctx *ctx = l->ctx;
    size_t mark;
    float *mloc, *mglob, *sz;
    dt_tensor tm, tsz;
    dt_status st = DT_OK;
    int e = 0;
    const char *what = "dt_k_tp_xent_fwd";
    if (!dt_cuda_loss_slot(ctx))
        return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: logits is on cuda but the ctx is not a cuda ctx "
                                "(dt_ctx_desc.device = DT_CUDA_DEVICE)", fn);
    mark = dt_cuda_scratch_begin(ctx);
    mloc = (float *)dt_cuda_scratch(ctx, sizeof(float) * (size_t)N, fn);
    mglob = mloc ? (float *)dt_cuda_scratch(ctx, sizeof(float) * (size_t)N, fn) : NULL;
    sz = mglob ? (float *)dt_cuda_scratch(ctx, sizeof(float) * 2 * (size_t)N, fn) : NULL;
    /* before any collective; the other ranks time out naming this one */
    if (!sz) st = ctx->last_status ? ctx->last_status : DT_ERR_OOM;
    if (!st) e = dt_k_tp_xent_fwd(mloc, mglob, sz, (const float *)logits->data, (const int32_t *)targets->data,
                                  ignore_index, N, Vl, nv, vocab_start, ctx->cuda_stream);
    if (!st && !e && l->tp > 1) {
        tm = dt__tp_dev_f32(mglob, N);
        tsz = dt__tp_dev_f32(sz, 2 * N);
        st = dt_comm_allreduce(l->tp_comm, &tm, DT_REDUCE_MAX);
        if (!st) what = "dt_k_tp_xent_rescale", e = dt_k_tp_xent_rescale(sz, mloc, mglob, N, ctx->cuda_stream);
        if (!st && !e) st = dt_comm_allreduce(l->tp_comm, &tsz, DT_REDUCE_SUM);
    }
    if (!st && !e)
        what = "dt_k_tp_xent_loss",
        e = dt_k_tp_xent_loss(dt_cuda_loss_slot(ctx), stats ? (float *)stats->data : NULL, mglob, sz,
                              (const int32_t *)targets->data, ignore_index, N, ctx->cuda_stream);
    dt_cuda_scratch_end(ctx, mark);
    if (st) return st;
    if (e) return dt_ctx_set_error(ctx, DT_ERR_CUDA, "%s: %s failed: %s", fn, what, dt_k_error_string(e));
    return DT_OK;
}
#endif

/* Per row: m = max over the real columns (all-reduce MAX), then the target logit (one rank has
   it, the others add 0) and s = sum of exp(z - m) (all-reduce SUM, one call for both), and
   loss_row = log s + m - z_target. exp and the sums are dt_softmax_xent_fwd's (expf of the f32
   difference, summed in double), so only the split of the sum over ranks differs from it. */
DT_API dt_status dt_tp_xent_fwd(dt_layout *l, float *loss, int64_t *n_valid, dt_tensor *stats,
                                const dt_tensor *logits, const dt_tensor *targets, int64_t vocab_start,
                                int64_t vocab, int ignore_index) {
    const char *fn = "dt_tp_xent_fwd";
    int64_t N, Vl, nv, r, c, n = 0;
    double total = 0, *buf;
    dt_status st = DT_OK;
    if (loss) *loss = 0;
    if (n_valid) *n_valid = 0;
    if (!l || !l->ctx) return DT_ERR_ARG;
    DT__TRY(dt__tp_xent_check(l, logits, targets, vocab_start, vocab, ignore_index, fn, NULL));
    N = dt__tp_rows(logits); Vl = dt__tp_last(logits);
    if (stats) DT__TRY(dt__tp_mat(l->ctx, stats, N, 2, fn, "stats", "each row's max and log-sum-exp"));
    DT__TRY(dt__par_apart(l->ctx, stats, logits, fn, "stats", "logits"));
    DT__TRY(dt__par_apart(l->ctx, stats, targets, fn, "stats", "targets"));
    nv = vocab - vocab_start; /* this rank's real (not padding) columns */
    nv = nv < 0 ? 0 : nv > Vl ? Vl : nv;
    if (logits->device == DT_CUDA_DEVICE) {
#ifdef DT_CUDA
        DT__TRY(dt__tp_same_device(l->ctx, fn, logits, "logits", stats, "stats"));
        DT__TRY(dt__tp_xent_fwd_cuda(l, stats, logits, targets, vocab_start, ignore_index, N, Vl, nv, fn));
        /* the logging step's one wait; otherwise the loss stays on the device */
        return loss ? dt_cuda_read_loss(l->ctx, loss, n_valid, fn) : DT_OK;
#else
        return dt_ctx_set_error(l->ctx, DT_ERR_DEVICE, "%s: a cuda tensor, but dt was built without DT_CUDA", fn);
#endif
    }
    buf = (double *)dt_alloc(l->ctx, sizeof(double) * (size_t)(3 * N + 1));
    if (!buf) return DT_ERR_OOM; /* before any collective; the other ranks time out naming this one */
    for (r = 0; r < N; r++) {
        const float *z = (const float *)logits->data + r * Vl;
        float mx = -INFINITY; /* no real column here: the other ranks have the max */
        for (c = 0; c < nv; c++) if (z[c] > mx) mx = z[c];
        buf[r] = mx;
    }
    if (l->tp > 1) st = dt_comm_allreduce_f64(l->tp_comm, buf, (int)N, DT_REDUCE_MAX);
    for (r = 0; r < N && !st; r++) {
        const float *z = (const float *)logits->data + r * Vl;
        float mx = (float)buf[r]; /* a float that went through a double: exact */
        int64_t t = ((const int32_t *)targets->data)[r] - vocab_start;
        double s = 0;
        for (c = 0; c < nv; c++) s += expf(z[c] - mx);
        buf[N + 2 * r] = ((const int32_t *)targets->data)[r] != ignore_index && t >= 0 && t < nv ? z[t] : 0.0;
        buf[N + 2 * r + 1] = s;
    }
    if (!st && l->tp > 1) st = dt_comm_allreduce_f64(l->tp_comm, buf + N, (int)(2 * N), DT_REDUCE_SUM);
    for (r = 0; r < N && !st; r++) {
        double mx = buf[r], zt = buf[N + 2 * r], ls = log(buf[N + 2 * r + 1]);
        if (stats) {
            ((float *)stats->data)[2 * r] = (float)mx;
            ((float *)stats->data)[2 * r + 1] = (float)(ls + mx);
        }
        if (((const int32_t *)targets->data)[r] != ignore_index) { total += ls + mx - zt; n++; }
    }
    dt_release(l->ctx, buf);
    if (st) return st;
    if (loss) *loss = n ? (float)(total / (double)n) : 0.0f;
    if (n_valid) *n_valid = n;
    return DT_OK;
}

DT_API dt_status dt_tp_xent_bwd(dt_layout *l, dt_tensor *dlogits, const dt_tensor *logits, const dt_tensor *stats,
                                const dt_tensor *targets, int64_t vocab_start, int64_t vocab, int ignore_index,
                                float dloss) {
    const char *fn = "dt_tp_xent_bwd";
    int64_t N, Vl, nv, r, c, n = 0;
    float s;
    DT__TRY(dt__tp_xent_check(l, logits, targets, vocab_start, vocab, ignore_index, fn, &n));
    N = dt__tp_rows(logits); Vl = dt__tp_last(logits);
    DT__TRY(dt__tp_mat(l->ctx, stats, N, 2, fn, "stats", "from dt_tp_xent_fwd"));
    if (!dlogits) return DT_OK;
    DT__TRY(dt__tp_mat(l->ctx, dlogits, N, Vl, fn, "dlogits", "as logits"));
    DT__TRY(dt__par_same_or_apart(l->ctx, dlogits, logits, fn, "dlogits", "logits")); /* in place, or apart */
    DT__TRY(dt__par_apart(l->ctx, dlogits, stats, fn, "dlogits", "stats"));
    DT__TRY(dt__par_apart(l->ctx, dlogits, targets, fn, "dlogits", "targets"));
    DT__TRY(dt__tp_same_device(l->ctx, fn, logits, "logits", stats, "stats"));
    DT__TRY(dt__tp_same_device(l->ctx, fn, logits, "logits", dlogits, "dlogits"));
    nv = vocab - vocab_start;
    nv = nv < 0 ? 0 : nv > Vl ? Vl : nv;
    if (logits->device == DT_CUDA_DEVICE) {
#ifdef DT_CUDA
        /* n_valid is counted on the device, by the kernel's first launch: no wait for it here */
        size_t mark = dt_cuda_scratch_begin(l->ctx);
        double *count = (double *)dt_cuda_scratch(l->ctx, sizeof(double), fn);
        int e = count ? dt_k_tp_xent_bwd((float *)dlogits->data, (const float *)logits->data,
                                         (const float *)stats->data, (const int32_t *)targets->data, ignore_index,
                                         dloss, count, N, Vl, nv, vocab_start, l->ctx->cuda_stream) : 0;
        dt_cuda_scratch_end(l->ctx, mark);
        if (!count) return l->ctx->last_status;
        if (e) return dt_ctx_set_error(l->ctx, DT_ERR_CUDA, "%s: dt_k_tp_xent_bwd failed: %s", fn, dt_k_error_string(e));
#else
        return dt_ctx_set_error(l->ctx, DT_ERR_DEVICE, "%s: a cuda tensor, but dt was built without DT_CUDA", fn);
#endif
        return DT_OK;
    }
    s = n ? dloss / (float)n : 0.0f;
    for (r = 0; r < N; r++) { /* softmax = exp(z - lse): local, no communication */
        const float *z = (const float *)logits->data + r * Vl;
        float *g = (float *)dlogits->data + r * Vl, lse = ((const float *)stats->data)[2 * r + 1];
        int64_t t = ((const int32_t *)targets->data)[r];
        int skip = n == 0 || t == ignore_index;
        t -= vocab_start;
        /* z[c] is read before g[c] is written: dlogits may be logits */
        for (c = 0; c < Vl; c++) g[c] = skip || c >= nv ? 0.0f : s * (expf(z[c] - lse) - (c == t ? 1.0f : 0.0f));
    }
    return DT_OK;
}


/* ==== >>cp: context parallel attention ========================================================= */

#define DT__CP_TAG_KV 1   /* the forward's K/V blocks */
#define DT__CP_TAG_KVB 2  /* the backward's K/V blocks */
#define DT__CP_TAG_DKV 3  /* the backward's partial dK/dV sums */

/* What l->cp_keep holds from one call to the next (grown, never shrunk; freed with the layout). */
typedef struct dt__cp_keep {
    dt_tensor kv[2];       /* ring: the K/V block held and the one arriving, [B, T/CP, 2 Ckv] */
    dt_tensor dkv[2];      /* ring backward: this rank's partial dK/dV sums, sent on in turn */
    dt_tensor din;         /* ring backward: the partial sum arriving from r - 1 */
    dt_tensor snd, rcv;    /* ulysses: the all-to-all's blocks (flat, as many floats as qkv) */
    dt_tensor uo, duqkv;   /* ulysses: [B, T, C/CP] output (or its gradient), [B, T, 3C/CP] */
    int64_t pairs;         /* dt_cp_pairs_done */
    int nccl_ready;        /* cp_comm has run a device collective (NCCL's send / recv need one first) */
} dt__cp_keep;

static void dt__cp_keep_free(dt_ctx *ctx, dt__cp_keep *k) {
    if (!k) return;
    dt_tensor_free(ctx, &k->kv[0]);
    dt_tensor_free(ctx, &k->kv[1]);
    dt_tensor_free(ctx, &k->dkv[0]);
    dt_tensor_free(ctx, &k->dkv[1]);
    dt_tensor_free(ctx, &k->din);
    dt_tensor_free(ctx, &k->snd);
    dt_tensor_free(ctx, &k->rcv);
    dt_tensor_free(ctx, &k->uo);
    dt_tensor_free(ctx, &k->duqkv);
    dt_release(ctx, k);
}

/* The sizes of a call. */
typedef struct dt__cp_dim {
    int64_t B, Tl, T, W, C, Ckv, hs, c; /* c: rows of a chunk (Tl / 2; Tl at cp 1) */
    int H, Hkv, cp, r, nch;             /* nch: chunks a rank holds (2; 1 at cp 1) */
    int tc;                             /* the ring with a bf16 qkv on cuda: K/V travel in bf16, the blocks
                                           run on the tensor cores (kernels/dt_flash.cu's block mode) */
    dt_device dev;                      /* qkv's: every operand's */
} dt__cp_dim;

/* Chunk a (0, 1) of rank r: its first local row and its index among the sequence's chunks. */
static int64_t dt__cp_chunk(int cp, int r, int a) { return a == 0 ? r : 2 * (int64_t)cp - 1 - r; }

DT_API int64_t dt_cp_position(int cp, int cp_rank, int64_t T, int64_t j) {
    int64_t c;
    if (cp < 1 || cp_rank < 0 || cp_rank >= cp || T < 0 || j < 0 || (cp > 1 && T % (2 * (int64_t)cp)) || j >= T / cp)
        return -1;
    if (cp == 1) return j;
    c = T / (2 * (int64_t)cp);
    return dt__cp_chunk(cp, cp_rank, j >= c) * c + j % c;
}

/* The block of the ring at which rank r's query chunk a meets key chunk b of rank src. */
static void dt__cp_block(dt_attn_block *d, const dt__cp_dim *g, int src, int a, int b) {
    d->n_head = g->H;
    d->n_kv_head = g->Hkv;
    d->q_row = a * g->c;
    d->q_rows = g->c;
    d->q_pos = dt__cp_chunk(g->cp, g->r, a) * g->c;
    d->k_row = b * g->c;
    d->k_rows = g->c;
    d->k_pos = dt__cp_chunk(g->cp, src, b) * g->c;
}

/* (query, key) pairs of a block under the causal mask: query row i sees min(max(e + i, 0), K) keys
   (e = q_pos - k_pos + 1, K = k_rows), summed over the rows in closed form: none before row lo,
   e + i from lo to hi, all K after (positions < 2^31, so no product overflows). */
static int64_t dt__cp_block_pairs(const dt_attn_block *d) {
    int64_t e = d->q_pos - d->k_pos + 1, n = d->q_rows, K = d->k_rows, lo, hi;
    lo = 1 - e > 0 ? 1 - e : 0;
    if (lo > n) lo = n;
    hi = K - e < n ? K - e : n;
    if (hi < lo) hi = lo;
    return (hi - lo) * e + (lo + hi - 1) * (hi - lo) / 2 + (n - hi) * K;
}

DT_API int64_t dt_cp_attention_pairs(int cp, int cp_rank, int64_t T) {
    dt__cp_dim g;
    dt_attn_block d;
    int s, a, b;
    int64_t n = 0;
    if (cp < 1 || cp_rank < 0 || cp_rank >= cp || T < 0 || T > ((int64_t)1 << 31) || (cp > 1 && T % (2 * (int64_t)cp)))
        return -1;
    memset(&g, 0, sizeof g);
    g.cp = cp;
    g.r = cp_rank;
    g.nch = cp > 1 ? 2 : 1;
    g.c = T / cp / g.nch;
    for (s = 0; s < cp; s++) /* the ring's schedule, as dt_cp_attention_fwd runs it */
        for (a = 0; a < g.nch; a++)
            for (b = 0; b < g.nch; b++) {
                dt__cp_block(&d, &g, (cp_rank - s + cp) % cp, a, b);
                n += dt__cp_block_pairs(&d);
            }
    return n;
}

DT_API int64_t dt_cp_pairs_done(const dt_layout *l) { return l && l->cp_keep ? l->cp_keep->pairs : 0; }

/* t is [d0, d1, d2] of dtype dt on dev: kept when it already is, else made anew. */
static dt_status dt__cp_buf_of(dt_ctx *ctx, dt_tensor *t, dt_device dev, dt_dtype dt, int64_t d0, int64_t d1,
                               int64_t d2) {
    dt_tensor_desc td;
    if (t->data && t->device == dev && t->dtype == dt && t->ndim == 3 && t->shape[0] == d0 && t->shape[1] == d1 &&
        t->shape[2] == d2)
        return DT_OK;
    dt_tensor_free(ctx, t);
    memset(&td, 0, sizeof td);
    td.device = dev;
    td.dtype = dt;
    td.ndim = 3;
    td.shape[0] = d0;
    td.shape[1] = d1;
    td.shape[2] = d2;
    return dt_tensor_create(ctx, t, &td);
}
static dt_status dt__cp_buf(dt_ctx *ctx, dt_tensor *t, dt_device dev, int64_t d0, int64_t d1, int64_t d2) {
    return dt__cp_buf_of(ctx, t, dev, DT_F32, d0, d1, d2);
}

/* The layout has a cp group; l->cp_keep exists. */
static dt_status dt__cp_begin(dt_layout *l, const char *fn) {
    if (!l || !l->ctx) return DT_ERR_ARG;
    if (!l->cp_comm || l->cp < 1 || l->cp_rank < 0 || l->cp_rank >= l->cp || dt_comm_size(l->cp_comm) != l->cp)
        return dt_ctx_set_error(l->ctx, DT_ERR_STATE, "%s: the layout has no usable cp group (cp = %d, cp_rank = %d, "
                                "cp_comm %s); make it with dt_layout_create", fn, l->cp, l->cp_rank,
                                l->cp_comm ? "present" : "NULL");
    if (!l->cp_keep) {
        l->cp_keep = (dt__cp_keep *)dt_alloc_zeroed(l->ctx, sizeof *l->cp_keep);
        if (!l->cp_keep) return dt_ctx_set_error(l->ctx, DT_ERR_OOM, "%s: out of memory for the ring's state", fn);
    }
    return DT_OK;
}

/* A tensor of dtype dt on dev (the ring and Ulysses run on cuda tensors too under DT_CUDA). */
static dt_status dt__cp_typed(dt_ctx *ctx, const dt_tensor *t, dt_dtype dt, dt_device dev, const char *fn,
                              const char *arg) {
    dt_tensor sh;
    if (t && t->device != dev)
        return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: %s is on %s but qkv on %s; expected one device", fn, arg,
                                dt_device_name(t->device), dt_device_name(dev));
    if (!t || t->device != DT_CUDA_DEVICE) return dt_check_tensor(ctx, t, dt, fn, arg);
    sh = *t; /* checked as its cpu shadow: dtype and shape; the data stays */
    sh.device = DT_CPU;
    return dt_check_tensor(ctx, &sh, dt, fn, arg);
}
static dt_status dt__cp_f32(dt_ctx *ctx, const dt_tensor *t, dt_device dev, const char *fn, const char *arg) {
    return dt__cp_typed(ctx, t, DT_F32, dev, fn, arg);
}

/* t has shape [d0, d1, d2]. */
static dt_status dt__cp_shape(dt_ctx *ctx, const dt_tensor *t, int64_t d0, int64_t d1, int64_t d2, const char *fn,
                              const char *arg, const char *why) {
    char s[96];
    if (t->ndim == 3 && t->shape[0] == d0 && t->shape[1] == d1 && t->shape[2] == d2) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s shape %s; expected [%lld, %lld, %lld] (%s)", fn, arg,
                            dt_shape_str(t, s, sizeof s), (long long)d0, (long long)d1, (long long)d2, why);
}

/* qkv [B, Tl, (H + 2 Hkv) hs] and the sizes that follow from it (ulysses: Hkv = H, H % cp == 0). */
static dt_status dt__cp_qkv(dt_layout *l, dt__cp_dim *g, const dt_tensor *qkv, const char *qn, int n_head,
                            int n_kv_head, int ulysses, const char *fn) {
    dt_ctx *ctx = l->ctx;
    char s[96];
    int64_t per;
    memset(g, 0, sizeof *g);
    if (!qkv) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, qn);
    g->dev = qkv->device;
#ifndef DT_CUDA
    if (g->dev == DT_CUDA_DEVICE)
        return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: %s is on cuda in a build without DT_CUDA", fn, qn);
#endif
    if (!ulysses && qkv->dtype == DT_BF16) { /* the ring's blocks on the tensor cores */
        if (g->dev != DT_CUDA_DEVICE)
            return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: %s is bf16 on %s; the ring takes a bf16 qkv on cuda only "
                                    "(its blocks on the tensor cores), f32 on the cpu", fn, qn,
                                    dt_device_name(g->dev));
        DT__TRY(dt__cp_typed(ctx, qkv, DT_BF16, g->dev, fn, qn));
        g->tc = 1;
    } else
        DT__TRY(dt__cp_f32(ctx, qkv, g->dev, fn, qn));
    g->H = n_head;
    g->Hkv = n_kv_head ? n_kv_head : n_head;
    if (n_head <= 0 || g->Hkv <= 0 || n_head % g->Hkv)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: n_head = %d, n_kv_head = %d; expected n_head > 0 and n_kv_head "
                                "(0 = n_head) > 0 dividing it", fn, n_head, n_kv_head);
    g->cp = l->cp;
    g->r = l->cp_rank;
    if (ulysses && (n_head % g->cp || g->Hkv % g->cp))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: n_head = %d, n_kv_head = %d heads do not divide over cp = %d; "
                                "Ulysses gives each cp rank n_head / cp query and n_kv_head / cp kv heads (use the "
                                "ring, dt_cp_attention_fwd)", fn, n_head, g->Hkv, g->cp);
    per = (int64_t)g->H + 2 * (int64_t)g->Hkv;
    if (qkv->ndim != 3 || qkv->shape[2] % per)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s shape %s; expected [B, T / cp, (n_head + 2 n_kv_head) x "
                                "head size] = [B, T / cp, %lld x head size]", fn, qn, dt_shape_str(qkv, s, sizeof s),
                                (long long)per);
    g->B = qkv->shape[0];
    g->Tl = qkv->shape[1];
    g->W = qkv->shape[2];
    g->hs = g->W / per;
    g->C = g->H * g->hs;
    g->Ckv = g->Hkv * g->hs;
    g->nch = g->cp > 1 ? 2 : 1;
    if (g->Tl % g->nch || !dt_mul_ok(g->Tl, g->cp, &g->T))
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s.shape[1] = %lld rows of each sequence on this rank; "
                                "expected an even number (chunks %d and %d of the 2 cp = %d chunks, equal sizes) and "
                                "T = rows x cp within int64", fn, qn, (long long)g->Tl, g->r, 2 * g->cp - 1 - g->r, 2 * g->cp);
    g->c = g->Tl / g->nch;
    if (g->tc && g->hs != 16 && g->hs != 32 && g->hs != 64 && g->hs != 96 && g->hs != 128)
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: %s is bf16 with head size %lld; the tensor-core blocks "
                                "take 16, 32, 64, 96 or 128 (cast qkv to f32 for the f32 blocks)", fn, qn, (long long)g->hs);
    if (g->tc && (uintptr_t)qkv->data % 16)
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: %s's data is not 16-byte aligned (a view at an odd "
                                "offset); the tensor-core blocks load 16 bytes at a time", fn, qn);
    if (g->tc && g->H > 65535 / (g->B ? g->B : 1))
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: B * n_head = %lld * %d: the tensor-core blocks take at "
                                "most 65535", fn, (long long)g->B, g->H);
    return DT_OK;
}

#ifdef DT_CUDA
/* A dt_k_* status as the call's error. */
static dt_status dt__cp_k(dt_ctx *ctx, int e, const char *fn, const char *what) {
    if (e) return dt_ctx_set_error(ctx, DT_ERR_CUDA, "%s: %s failed: %s", fn, what, dt_k_error_string(e));
    return DT_OK;
}
#endif

/* kv[b, t, :] = the k | v columns of qkv[b, t, :]. */
static dt_status dt__cp_pack_kv(dt_ctx *ctx, dt_tensor *kv, const dt_tensor *qkv, const dt__cp_dim *g) {
    int64_t n, rows = g->B * g->Tl;
#ifdef DT_CUDA
    if (g->tc) /* bf16 bits */
        return dt__cp_k(ctx, dt_k_cols_copy16((uint16_t *)kv->data, 2 * g->Ckv, (const uint16_t *)qkv->data + g->C, g->W,
                                              rows, 2 * g->Ckv, ctx->cuda_stream), "dt_cp_attention", "dt_k_cols_copy16");
    if (g->dev == DT_CUDA_DEVICE) { /* kernels/dt_parallel.cu's column copy: qkv's columns [C, C + 2 Ckv) out */
        int e = dt_k_concat((float *)qkv->data, (float *)kv->data, rows, g->W, g->C, 2 * g->Ckv, 0, 0, ctx->cuda_stream);
        if (e) return dt_ctx_set_error(ctx, DT_ERR_CUDA, "dt_cp_attention: dt_k_concat failed: %s", dt_k_error_string(e));
        return DT_OK;
    }
#endif
    (void)ctx;
    for (n = 0; n < rows; n++)
        memcpy((float *)kv->data + n * 2 * g->Ckv, (const float *)qkv->data + n * g->W + g->C,
               (size_t)(2 * g->Ckv) * sizeof(float));
    return DT_OK;
}

/* Posts this step's receive from r - 1 and send to r + 1. On NCCL a send and a receive are queued
   in order on one stream and each waits for its peer, so a ring where every rank receives first
   would wait on itself: at an even cp the even ranks send first and the odd ones receive first
   (pairs), at an odd cp rank 0 sends first and the rest receive first (a chain). MPI does not
   mind the order. The first device use runs one collective on cp_comm: NCCL's send / recv need
   the communicator it makes (dt_comm.h, "NCCL"). */
static dt_status dt__cp_post(dt_layout *l, const dt__cp_dim *g, dt_tensor *snd, dt_tensor *rcv, int tag,
                             dt_comm_req **sq, dt_comm_req **rq) {
    int prev = (g->r + g->cp - 1) % g->cp, next = (g->r + 1) % g->cp;
    int send_first = g->cp % 2 == 0 ? g->r % 2 == 0 : g->r == 0;
    if (g->dev == DT_CUDA_DEVICE && !l->cp_keep->nccl_ready) {
        dt_tensor one; /* a sum of one element of its own: the collective that makes the communicator */
        dt_tensor_desc d;
        dt_status st;
        memset(&d, 0, sizeof d);
        d.dtype = DT_F32; d.device = DT_CUDA_DEVICE; d.shape[0] = 1;
        DT__TRY(dt_tensor_create(l->ctx, &one, &d));
        st = dt_comm_allreduce(l->cp_comm, &one, DT_REDUCE_SUM);
        dt_tensor_free(l->ctx, &one);
        DT__TRY(st);
        l->cp_keep->nccl_ready = 1;
    }
    if (send_first) {
        DT__TRY(dt_comm_isend(l->cp_comm, snd, next, tag, sq));
        return dt_comm_irecv(l->cp_comm, rcv, prev, tag, rq);
    }
    DT__TRY(dt_comm_irecv(l->cp_comm, rcv, prev, tag, rq));
    return dt_comm_isend(l->cp_comm, snd, next, tag, sq);
}

/* Waits for a posted request (if any) and keeps the first error in *st. */
static void dt__cp_wait(dt_comm_req **rq, dt_status *st) {
    dt_status s2;
    if (!*rq) return;
    s2 = dt_comm_wait(*rq);
    *rq = NULL;
    if (!*st) *st = s2;
}

static dt_status dt__cp_ring_check(dt_layout *l, dt__cp_dim *g, const dt_tensor *o, const char *on,
                                   const dt_tensor *lse, const dt_tensor *qkv, int n_head, int n_kv_head,
                                   const char *fn) {
    DT__TRY(dt__cp_begin(l, fn));
    DT__TRY(dt__cp_qkv(l, g, qkv, "qkv", n_head, n_kv_head, 0, fn));
    DT__TRY(dt__cp_f32(l->ctx, o, g->dev, fn, on));
    DT__TRY(dt__cp_f32(l->ctx, lse, g->dev, fn, "lse"));
    DT__TRY(dt__cp_shape(l->ctx, o, g->B, g->Tl, g->C, fn, on, "B, T / cp, n_head x head size"));
    return dt__cp_shape(l->ctx, lse, g->B, g->H, g->Tl, fn, "lse", "B, n_head, T / cp");
}

#ifdef DT_CUDA
/* Block d of the ring on the tensor cores (g->tc): kernels/dt_flash.cu's block mode, q from the bf16
   qkv, K/V from the bf16 block kv; out, lse (and dout, dq, dk, dv backward) f32. */
static void dt__cp_flash(dt_k_flash *x, const dt__cp_dim *g, const dt_attn_block *d, const dt_tensor *qkv,
                         const dt_tensor *kv, const dt_tensor *out, const dt_tensor *lse) {
    memset(x, 0, sizeof *x);
    x->B = g->B, x->T = g->Tl, x->H = g->H, x->H_kv = g->Hkv, x->hs = (int)g->hs;
    x->q = (const uint16_t *)qkv->data, x->k = (const uint16_t *)kv->data, x->v = x->k + g->Ckv;
    x->q_stride = g->W, x->kv_stride = 2 * g->Ckv;
    x->out = (float *)out->data, x->lse = (float *)lse->data, x->out_stride = g->C;
    x->block = 1, x->Tk = g->Tl;
    x->q_row = d->q_row, x->q_rows = d->q_rows, x->q_pos = d->q_pos;
    x->k_row = d->k_row, x->k_rows = d->k_rows, x->k_pos = d->k_pos;
}

/* dt_k_flash's status as the call's error: below compute capability 8.0 what to do instead. */
static dt_status dt__cp_flash_status(dt_ctx *ctx, int e, const char *fn, const char *what) {
    if (e == (int)cudaErrorNotSupported)
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: qkv is bf16, whose tensor-core blocks need compute "
                                "capability 8.0 or newer (mma.sync with bf16); cast qkv to f32", fn);
    return dt__cp_k(ctx, e, fn, what);
}
#endif

/* Block d of the ring forward: merged into out and lse. */
static dt_status dt__cp_block_fwd(dt_ctx *ctx, const dt__cp_dim *g, dt_tensor *out, dt_tensor *lse,
                                  const dt_tensor *qkv, const dt_tensor *kv, const dt_attn_block *d) {
#ifdef DT_CUDA
    if (g->tc) {
        dt_k_flash x;
        dt__cp_flash(&x, g, d, qkv, kv, out, lse);
        return dt__cp_flash_status(ctx, dt_k_flash_fwd(&x, ctx->cuda_stream), "dt_cp_attention_fwd", "dt_k_flash_fwd");
    }
#endif
    (void)g;
    return dt_attention_block_fwd(ctx, out, lse, qkv, kv, d);
}

DT_API dt_status dt_cp_attention_fwd(dt_layout *l, dt_tensor *out, dt_tensor *lse, const dt_tensor *qkv, int n_head,
                                     int n_kv_head) {
    const char *fn = "dt_cp_attention_fwd";
    dt__cp_dim g;
    dt__cp_keep *k;
    dt_status mst = DT_OK, cst = DT_OK; /* the messages' status, the compute's */
    int s, a, b, cur = 0;
    DT__TRY(dt__cp_ring_check(l, &g, out, "out", lse, qkv, n_head, n_kv_head, fn));
    DT__TRY(dt__par_apart(l->ctx, out, qkv, fn, "out", "qkv"));
    DT__TRY(dt__par_apart(l->ctx, lse, qkv, fn, "lse", "qkv"));
    DT__TRY(dt__par_apart(l->ctx, lse, out, fn, "lse", "out"));
    k = l->cp_keep;
    DT__TRY(dt__cp_buf_of(l->ctx, &k->kv[0], g.dev, g.tc ? DT_BF16 : DT_F32, g.B, g.Tl, 2 * g.Ckv));
    DT__TRY(dt__cp_buf_of(l->ctx, &k->kv[1], g.dev, g.tc ? DT_BF16 : DT_F32, g.B, g.Tl, 2 * g.Ckv));
    DT__TRY(dt_tensor_fill(l->ctx, out, 0.0));
    DT__TRY(dt_tensor_fill(l->ctx, lse, -INFINITY));
    DT__TRY(dt__cp_pack_kv(l->ctx, &k->kv[0], qkv, &g));
    k->pairs = 0;
    for (s = 0; s < g.cp; s++) {
        dt_comm_req *rq = NULL, *sq = NULL;
        int src = (g.r - s + g.cp) % g.cp; /* whose K/V this rank holds at step s */
        if (s + 1 < g.cp && !mst) /* the next block is on its way while this one is computed */
            mst = dt__cp_post(l, &g, &k->kv[cur], &k->kv[cur ^ 1], DT__CP_TAG_KV, &sq, &rq);
        for (a = 0; a < g.nch; a++) /* a failed block keeps the ring going, so no rank waits forever */
            for (b = 0; b < g.nch && !cst; b++) {
                dt_attn_block d;
                dt__cp_block(&d, &g, src, a, b);
                cst = dt__cp_block_fwd(l->ctx, &g, out, lse, qkv, &k->kv[cur], &d);
                k->pairs += dt__cp_block_pairs(&d);
            }
        dt__cp_wait(&rq, &mst);
        dt__cp_wait(&sq, &mst);
        if (mst) break;
        cur ^= 1;
    }
    return mst ? mst : cst;
}

/* y[b, t, off + j] += x[b, t, j] for the x.shape[2] columns j of each row. */
static dt_status dt__cp_add_cols(dt_ctx *ctx, dt_tensor *y, int64_t off, const dt_tensor *x) {
    int64_t n, j, rows = x->shape[0] * x->shape[1], w = x->shape[2], W = y->shape[2];
#ifdef DT_CUDA
    if (y->device == DT_CUDA_DEVICE) {
        int e = dt_k_concat((float *)y->data, (float *)x->data, rows, W, off, w, 1, 1, ctx->cuda_stream);
        if (e) return dt_ctx_set_error(ctx, DT_ERR_CUDA, "dt_cp_attention_bwd: dt_k_concat failed: %s", dt_k_error_string(e));
        return DT_OK;
    }
#endif
    (void)ctx;
    for (n = 0; n < rows; n++) {
        float *yr = (float *)y->data + n * W + off;
        const float *xr = (const float *)x->data + n * w;
        for (j = 0; j < w; j++) yr[j] += xr[j];
    }
    return DT_OK;
}

/* Block d of the ring backward: dq into dqkv's q columns, dk and dv into dkv, from the merged out
   and lse. On the tensor cores scratch holds dt_k_flash_bwd_prep's rows (dout in bf16, D). */
static dt_status dt__cp_block_bwd(dt_ctx *ctx, const dt__cp_dim *g, dt_tensor *dqkv, dt_tensor *dkv,
                                  const dt_tensor *dout, const dt_tensor *qkv, const dt_tensor *kv,
                                  const dt_tensor *out, const dt_tensor *lse, void *scratch, const dt_attn_block *d) {
#ifdef DT_CUDA
    if (g->tc) {
        dt_k_flash x;
        dt__cp_flash(&x, g, d, qkv, kv, out, lse);
        x.dout = (const float *)dout->data, x.scratch = scratch, x.prepped = 1;
        x.dq = (float *)dqkv->data, x.dq_stride = g->W;
        x.dk = (float *)dkv->data, x.dv = x.dk + g->Ckv, x.dkv_stride = 2 * g->Ckv;
        return dt__cp_flash_status(ctx, dt_k_flash_bwd(&x, ctx->cuda_stream), "dt_cp_attention_bwd", "dt_k_flash_bwd");
    }
#endif
    (void)g, (void)scratch;
    return dt_attention_block_bwd(ctx, dqkv, dkv, dout, qkv, kv, out, lse, d);
}

/* On the tensor cores (g->tc): the scratch of the ring's backward in ctx's device scratch (*mark
   for dt_cuda_scratch_end, once begun), filled once for every query row; NULL and DT_OK elsewhere. */
static dt_status dt__cp_bwd_scratch(dt_ctx *ctx, const dt__cp_dim *g, const dt_tensor *dout, const dt_tensor *qkv,
                                    const dt_tensor *out, const dt_tensor *lse, void **scratch, size_t *mark) {
    *scratch = NULL;
#ifdef DT_CUDA
    if (g->tc) {
        const char *fn = "dt_cp_attention_bwd";
        size_t bytes = dt_k_flash_bwd_scratch(g->B, g->Tl, g->H, (int)g->hs);
        dt_attn_block d;
        dt_k_flash x;
        if (!bytes)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: B * T / cp * n_head = %lld * %lld * %d: the backward's "
                                    "scratch overflows", fn, (long long)g->B, (long long)g->Tl, g->H);
        *mark = dt_cuda_scratch_begin(ctx);
        if (!(*scratch = dt_cuda_scratch(ctx, bytes, fn))) return ctx->last_status;
        memset(&d, 0, sizeof d);
        d.q_rows = g->Tl; /* every query row */
        dt__cp_flash(&x, g, &d, qkv, qkv, out, lse); /* k, v: qkv's bytes, checked, not read by the prep */
        x.dout = (const float *)dout->data, x.scratch = *scratch;
        return dt__cp_flash_status(ctx, dt_k_flash_bwd_prep(&x, ctx->cuda_stream), fn, "dt_k_flash_bwd_prep");
    }
#endif
    (void)ctx, (void)g, (void)dout, (void)qkv, (void)out, (void)lse, (void)mark;
    return DT_OK;
}

DT_API dt_status dt_cp_attention_bwd(dt_layout *l, dt_tensor *dqkv, const dt_tensor *dout, const dt_tensor *qkv,
                                     const dt_tensor *out, const dt_tensor *lse, int n_head, int n_kv_head) {
    const char *fn = "dt_cp_attention_bwd";
    dt__cp_dim g;
    dt__cp_keep *k;
    dt_comm_req *dsq[2] = {NULL, NULL}; /* the sends of dkv[0], dkv[1] */
    dt_status mst = DT_OK, cst = DT_OK;
    void *scratch = NULL;
    size_t mark = (size_t)-1; /* the device scratch's, once begun */
    int s, a, b, cur = 0;
    DT__TRY(dt__cp_ring_check(l, &g, dout, "dout", lse, qkv, n_head, n_kv_head, fn));
    DT__TRY(dt__cp_f32(l->ctx, out, g.dev, fn, "out"));
    DT__TRY(dt__cp_shape(l->ctx, out, g.B, g.Tl, g.C, fn, "out", "dout's"));
    DT__TRY(dt__cp_f32(l->ctx, dqkv, g.dev, fn, "dqkv"));
    DT__TRY(dt__cp_shape(l->ctx, dqkv, g.B, g.Tl, g.W, fn, "dqkv", "qkv's"));
    DT__TRY(dt__par_apart(l->ctx, dqkv, dout, fn, "dqkv", "dout"));
    DT__TRY(dt__par_apart(l->ctx, dqkv, qkv, fn, "dqkv", "qkv"));
    DT__TRY(dt__par_apart(l->ctx, dqkv, out, fn, "dqkv", "out"));
    DT__TRY(dt__par_apart(l->ctx, dqkv, lse, fn, "dqkv", "lse"));
    k = l->cp_keep;
    DT__TRY(dt__cp_buf_of(l->ctx, &k->kv[0], g.dev, g.tc ? DT_BF16 : DT_F32, g.B, g.Tl, 2 * g.Ckv));
    DT__TRY(dt__cp_buf_of(l->ctx, &k->kv[1], g.dev, g.tc ? DT_BF16 : DT_F32, g.B, g.Tl, 2 * g.Ckv));
    DT__TRY(dt__cp_buf(l->ctx, &k->dkv[0], g.dev, g.B, g.Tl, 2 * g.Ckv));
    DT__TRY(dt__cp_buf(l->ctx, &k->dkv[1], g.dev, g.B, g.Tl, 2 * g.Ckv));
    DT__TRY(dt__cp_buf(l->ctx, &k->din, g.dev, g.B, g.Tl, 2 * g.Ckv));
    DT__TRY(dt__cp_pack_kv(l->ctx, &k->kv[0], qkv, &g));
    cst = dt__cp_bwd_scratch(l->ctx, &g, dout, qkv, out, lse, &scratch, &mark); /* a failure keeps the ring going */
    for (s = 0; s < g.cp && !mst; s++) {
        dt_comm_req *rq = NULL, *sq = NULL, *drq = NULL;
        int src = (g.r - s + g.cp) % g.cp, d = s & 1;
        if (s + 1 < g.cp) mst = dt__cp_post(l, &g, &k->kv[cur], &k->kv[cur ^ 1], DT__CP_TAG_KVB, &sq, &rq);
        /* the partial dK/dV sums travel while this step computes: last step's (dkv[d ^ 1]: the
           block of r - s + 1, summed by its ranks up to this one) to r + 1, and from r - 1 the
           block this step holds, summed by ranks src .. r - 1 */
        if (s > 0 && !mst) mst = dt__cp_post(l, &g, &k->dkv[d ^ 1], &k->din, DT__CP_TAG_DKV, &dsq[d ^ 1], &drq);
        dt__cp_wait(&dsq[d], &mst); /* dkv[d] left last step */
        if (!cst) cst = dt_tensor_fill(l->ctx, &k->dkv[d], 0.0);
        for (a = 0; a < g.nch; a++)
            for (b = 0; b < g.nch && !cst; b++) {
                dt_attn_block bd;
                dt__cp_block(&bd, &g, src, a, b);
                cst = dt__cp_block_bwd(l->ctx, &g, dqkv, &k->dkv[d], dout, qkv, &k->kv[cur], out, lse, scratch, &bd);
            }
        dt__cp_wait(&rq, &mst);
        dt__cp_wait(&sq, &mst);
        dt__cp_wait(&drq, &mst);
        if (mst) break;
        if (s > 0 && !cst) cst = dt__cp_add_cols(l->ctx, &k->dkv[d], 0, &k->din); /* mine + the earlier ranks' */
        cur ^= 1;
    }
    if (g.cp > 1 && !mst) { /* the last partial sum to its owner; this rank's own block, summed over
                               every rank's queries, comes in */
        dt_comm_req *drq = NULL;
        int d = (g.cp - 1) & 1;
        mst = dt__cp_post(l, &g, &k->dkv[d], &k->din, DT__CP_TAG_DKV, &dsq[d], &drq);
        dt__cp_wait(&drq, &mst);
        if (!mst && !cst) cst = dt__cp_add_cols(l->ctx, dqkv, g.C, &k->din);
    } else if (g.cp == 1 && !cst) {
        cst = dt__cp_add_cols(l->ctx, dqkv, g.C, &k->dkv[0]);
    }
    dt__cp_wait(&dsq[0], &mst);
    dt__cp_wait(&dsq[1], &mst);
#ifdef DT_CUDA
    if (mark != (size_t)-1) dt_cuda_scratch_end(l->ctx, mark);
#endif
    return mst ? mst : cst;
}

/* ---- Ulysses: the two all-to-alls and the row moves around them */

/* Head group j's columns of a row: of a qkv row (qkv = 1) its q, k and v heads, three parts; of an
   out row its heads, one part. Returns the parts; off[] their columns in the row, w[] widths. */
static int dt__uly_parts(const dt__cp_dim *g, int qkv, int64_t j, int64_t *off, int64_t *w) {
    int64_t Cu = g->C / g->cp, Ku = g->Ckv / g->cp;
    off[0] = j * Cu; w[0] = Cu;
    if (!qkv) return 1;
    off[1] = g->C + j * Ku; w[1] = Ku;
    off[2] = g->C + g->Ckv + j * Ku; w[2] = Ku;
    return 3;
}

/* Between x's rows [B, Tl, W] and the all-to-all's blocks in buf (block j, to or from cp rank j:
   head group j's columns of every row, dt__uly_parts, packed [B, Tl, width of the parts]):
   to_blocks 1 packs x into buf; 0 unpacks buf into x's columns, written (add 0) or added. */
static dt_status dt__uly_cols(dt_ctx *ctx, float *buf, dt_tensor *x, const dt__cp_dim *g, int qkv, int to_blocks,
                              int add, const char *fn) {
    int64_t j, n, c, off[3], w[3], rows = g->B * g->Tl, W = x->shape[2];
    int p, np;
    for (j = 0; j < g->cp; j++) {
        np = dt__uly_parts(g, qkv, j, off, w);
#ifdef DT_CUDA
        if (x->device == DT_CUDA_DEVICE) { /* a strided copy a part */
            int64_t po, pw = 0;
            for (p = 0; p < np; p++) pw += w[p];
            for (po = 0, p = 0; p < np; po += w[p], p++) {
                float *xs = (float *)x->data + off[p], *bs = buf + po;
                DT__TRY(dt__cp_k(ctx, to_blocks ? dt_k_cols_copy(bs, pw, xs, W, rows, w[p], 0, ctx->cuda_stream)
                                                 : dt_k_cols_copy(xs, W, bs, pw, rows, w[p], add, ctx->cuda_stream),
                                  fn, "dt_k_cols_copy"));
            }
            buf += rows * pw;
            continue;
        }
#endif
        (void)fn; (void)ctx;
        for (n = 0; n < rows; n++)
            for (p = 0; p < np; p++) {
                float *xr = (float *)x->data + n * W + off[p];
                if (to_blocks) memcpy(buf, xr, (size_t)w[p] * sizeof(float));
                else if (!add) memcpy(xr, buf, (size_t)w[p] * sizeof(float));
                else for (c = 0; c < w[p]; c++) xr[c] += buf[c];
                buf += w[p];
            }
    }
    return DT_OK;
}

/* Between the blocks of the all-to-all (block i: cp rank i's rows, [B, Tl, w] each) and y [B, T,
   w], every row at its position: to_seq 1 fills y from the blocks, 0 the blocks from y. */
static dt_status dt__uly_rows(dt_ctx *ctx, dt_tensor *y, float *blocks, const dt__cp_dim *g, int64_t w, int to_seq,
                              const char *fn) {
    int64_t i, b, t;
#ifdef DT_CUDA
    if (y->device == DT_CUDA_DEVICE)
        return dt__cp_k(ctx, dt_k_cp_rows((float *)y->data, blocks, g->B, g->T, g->cp, w, to_seq, ctx->cuda_stream), fn,
                         "dt_k_cp_rows");
#endif
    (void)ctx; (void)fn;
    for (i = 0; i < g->cp; i++)
        for (b = 0; b < g->B; b++)
            for (t = 0; t < g->Tl; t++) {
                float *yr = (float *)y->data + (b * g->T + dt_cp_position(g->cp, (int)i, g->T, t)) * w;
                float *br = blocks + ((i * g->B + b) * g->Tl + t) * w;
                if (to_seq) memcpy(yr, br, (size_t)w * sizeof(float));
                else memcpy(br, yr, (size_t)w * sizeof(float));
            }
    return DT_OK;
}

/* The all-to-all of the first `numel` floats of k->snd into k->rcv. */
static dt_status dt__uly_a2a(dt_layout *l, int64_t numel) {
    dt_tensor in, out;
    DT__TRY(dt_tensor_view(l->ctx, &in, &l->cp_keep->snd, 0, 1, &numel));
    DT__TRY(dt_tensor_view(l->ctx, &out, &l->cp_keep->rcv, 0, 1, &numel));
    return dt_comm_alltoall(l->cp_comm, &out, &in);
}

/* Checks and buffers of both directions: uqkv [B, T, W / cp], att [B, H/cp, T, T]. */
static dt_status dt__uly_setup(dt_layout *l, dt__cp_dim *g, const dt_tensor *x, const char *xn, int out_like,
                               const dt_tensor *uqkv, const dt_tensor *att, const dt_tensor *qkv_like,
                               const char *qn, int n_head, int n_kv_head, const char *fn) {
    dt__cp_keep *k;
    int64_t Cu;
    DT__TRY(dt__cp_begin(l, fn));
    DT__TRY(dt__cp_qkv(l, g, qkv_like, qn, n_head, n_kv_head, 1, fn));
    Cu = g->C / g->cp;
    DT__TRY(dt__cp_f32(l->ctx, x, g->dev, fn, xn));
    DT__TRY(dt__cp_shape(l->ctx, x, g->B, g->Tl, out_like ? g->C : g->W, fn, xn,
                         out_like ? "B, T / cp, n_head x head size" : "B, T / cp, (n_head + 2 n_kv_head) x head size"));
    if (uqkv && uqkv->dtype == DT_BF16 && g->dev == DT_CUDA_DEVICE) { /* the tensor cores: no [T, T] scores */
        DT__TRY(dt__cp_typed(l->ctx, uqkv, DT_BF16, g->dev, fn, "uqkv"));
        if (att)
            return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: att is given with a bf16 uqkv; expected NULL (bf16 runs "
                                    "the tensor cores' flash attention, which keeps no [T, T] scores)", fn);
    } else {
        DT__TRY(dt__cp_f32(l->ctx, uqkv, g->dev, fn, "uqkv"));
        DT__TRY(dt__cp_f32(l->ctx, att, g->dev, fn, "att"));
    }
    DT__TRY(dt__cp_shape(l->ctx, uqkv, g->B, g->T, g->W / g->cp, fn, "uqkv", "B, T, (n_head + 2 n_kv_head) x head size / cp"));
    if (att && (att->ndim != 4 || att->shape[0] != g->B || att->shape[1] != g->H / g->cp || att->shape[2] != g->T ||
        att->shape[3] != g->T)) {
        char s[96];
        return dt_ctx_set_error(l->ctx, DT_ERR_SHAPE, "%s: att shape %s; expected [%lld, %d, %lld, %lld] (B, n_head / "
                                "cp, T, T)", fn, dt_shape_str(att, s, sizeof s), (long long)g->B, g->H / g->cp,
                                (long long)g->T, (long long)g->T);
    }
    k = l->cp_keep;
    DT__TRY(dt__cp_buf(l->ctx, &k->snd, g->dev, 1, 1, qkv_like->numel));
    DT__TRY(dt__cp_buf(l->ctx, &k->rcv, g->dev, 1, 1, qkv_like->numel));
    DT__TRY(dt__cp_buf(l->ctx, &k->duqkv, g->dev, g->B, g->T, g->W / g->cp));
    return dt__cp_buf(l->ctx, &k->uo, g->dev, g->B, g->T, Cu);
}

DT_API dt_status dt_cp_ulysses_fwd(dt_layout *l, dt_tensor *out, dt_tensor *uqkv, dt_tensor *att,
                                   const dt_tensor *qkv, int n_head, int n_kv_head) {
    const char *fn = "dt_cp_ulysses_fwd";
    dt__cp_dim g;
    dt__cp_keep *k;
    dt_status st;
    int64_t Cu, wu;
    DT__TRY(dt__uly_setup(l, &g, qkv, "qkv", 0, uqkv, att, qkv, "qkv", n_head, n_kv_head, fn));
    DT__TRY(dt__cp_f32(l->ctx, out, g.dev, fn, "out"));
    DT__TRY(dt__cp_shape(l->ctx, out, g.B, g.Tl, g.C, fn, "out", "B, T / cp, n_head x head size"));
    /* uqkv and att are kept for the backward: out written over either would spoil it */
    DT__TRY(dt__par_apart(l->ctx, out, qkv, fn, "out", "qkv"));
    DT__TRY(dt__par_apart(l->ctx, out, uqkv, fn, "out", "uqkv"));
    DT__TRY(dt__par_apart(l->ctx, out, att, fn, "out", "att"));
    DT__TRY(dt__par_apart(l->ctx, uqkv, qkv, fn, "uqkv", "qkv"));
    DT__TRY(dt__par_apart(l->ctx, att, qkv, fn, "att", "qkv"));
    k = l->cp_keep;
    Cu = g.C / g.cp;
    wu = g.W / g.cp;
    /* q, k, v of head group j to rank j; this rank's heads of every rank's rows, by position (a bf16
       uqkv: through duqkv, then cast). A failure on this rank still runs both all-to-alls, so no
       rank waits for this one. */
    st = dt__uly_cols(l->ctx, (float *)k->snd.data, (dt_tensor *)qkv, &g, 1, 1, 0, fn);
    DT__TRY(dt__uly_a2a(l, qkv->numel));
    if (!st) st = dt__uly_rows(l->ctx, uqkv->dtype == DT_BF16 ? &k->duqkv : uqkv, (float *)k->rcv.data, &g, wu, 1, fn);
    if (!st && uqkv->dtype == DT_BF16) st = dt_tensor_cast(l->ctx, uqkv, &k->duqkv);
    /* the whole sequence's causal attention on H / cp heads */
    if (!st) st = dt_attention_gqa_fwd(l->ctx, &k->uo, att, uqkv, g.H / g.cp, g.Hkv / g.cp);
    if (!st) st = dt__uly_rows(l->ctx, &k->uo, (float *)k->snd.data, &g, Cu, 0, fn);
    DT__TRY(dt__uly_a2a(l, out->numel));
    if (!st) st = dt__uly_cols(l->ctx, (float *)k->rcv.data, out, &g, 0, 0, 0, fn);
    return st;
}

DT_API dt_status dt_cp_ulysses_bwd(dt_layout *l, dt_tensor *dqkv, const dt_tensor *dout, const dt_tensor *uqkv,
                                   const dt_tensor *att, int n_head, int n_kv_head) {
    const char *fn = "dt_cp_ulysses_bwd";
    dt__cp_dim g;
    dt__cp_keep *k;
    dt_status st;
    int64_t Cu, wu;
    DT__TRY(dt__uly_setup(l, &g, dout, "dout", 1, uqkv, att, dqkv, "dqkv", n_head, n_kv_head, fn));
    DT__TRY(dt__par_apart(l->ctx, dqkv, dout, fn, "dqkv", "dout"));
    DT__TRY(dt__par_apart(l->ctx, dqkv, uqkv, fn, "dqkv", "uqkv"));
    DT__TRY(dt__par_apart(l->ctx, dqkv, att, fn, "dqkv", "att"));
    k = l->cp_keep;
    Cu = g.C / g.cp;
    wu = g.W / g.cp;
    st = dt__uly_cols(l->ctx, (float *)k->snd.data, (dt_tensor *)dout, &g, 0, 1, 0, fn);
    DT__TRY(dt__uly_a2a(l, dout->numel));
    if (!st) st = dt__uly_rows(l->ctx, &k->uo, (float *)k->rcv.data, &g, Cu, 1, fn);
    if (!st) st = dt_tensor_fill(l->ctx, &k->duqkv, 0.0);
    if (!st) st = dt_attention_gqa_bwd(l->ctx, &k->duqkv, &k->uo, uqkv, att, g.H / g.cp, g.Hkv / g.cp);
    if (!st) st = dt__uly_rows(l->ctx, &k->duqkv, (float *)k->snd.data, &g, wu, 0, fn);
    DT__TRY(dt__uly_a2a(l, dqkv->numel));
    if (!st) st = dt__uly_cols(l->ctx, (float *)k->rcv.data, dqkv, &g, 1, 0, 1, fn);
    return st;
}

/* ==== >>moe: mixture of experts, expert parallel ================================================

   One forward, in the order it runs: the router's logits by one GEMM, the softmax and the top-k
   per row on the host, the capacity per sequence, then the kept assignments sorted by expert and
   token (a counting sort: the send order, so rank p's block is the assignments to its experts),
   one all-to-all of the counts per (rank, expert), one all-to-allv of the rows, the received rows
   regrouped expert-major (for each local expert, the rows of rank 0, then rank 1, ...: one GEMM
   per expert over contiguous rows, in an order that does not depend on timing), the experts, the
   outputs regrouped back and returned by the reverse all-to-allv, and the combine: each token's
   outputs summed in choice order (j = 0 .. k-1), so no result depends on ep or arrival. */

#define DT__MOE_GMAX 256 /* experts per rank the CUDA path groups (dt_k_gemm_grouped's limit) */

struct dt_moe {
    dt_ctx *ctx;
    dt_layout *l;
    dt_moe_desc d;                /* resolved */
    int E, El, k;
    int64_t C, Fl, cap;           /* cap: assignments an expert keeps per sequence; 0 = all */
    float *bias;                  /* [E] */
    double *acc;                  /* [3E + 3] this step: counts, sums of p, dropped, fingerprint, tokens, kept per expert (then global) */
    double *f;                    /* [E] the global f_e, once synced */
    int64_t *load, *kept;         /* [E] for the stats */
    double aux;
    double secs[4];               /* router, dispatch, experts, combine: this step, this rank */
    int n_fwd, synced;
    dt_tensor cnt_send, cnt_recv; /* I64 [E]: assignments per (rank, local expert), sent and received */
    dt_tensor bufs[4];            /* f32 scratch: packed rows, received rows, expert-major rows, columns */
    dt_tensor dgt;                /* f32 [N k]: the gates' grads (summed over tp) */
    dt_tensor dz;                 /* f32 [N, E]: the router logits' grads */
    dt_device dev;                /* the device of the call in progress (x's) */
    /* CUDA: the routing's counts on the device and their host copy (I64 [3E + 2S]: per expert
       routed, sum of p, kept as doubles, then per sequence dropped and fingerprint), the
       capacity's scratch, the bias / the aux loss's per-expert grads going up, perm going up */
    dt_tensor dstat, hstat, dused, dbias, hbias, dauxd, hauxd, hperm;
    dt_tensor hptr, dptr;         /* CUDA: the grouped GEMMs' pointer arrays and eoff, host and device */
};

struct dt_moe_acts {
    dt_moe *m;
    int64_t N, S, R;              /* rows, assignments kept (sent), rows received */
    dt_tensor probs;              /* f32 [N, E] */
    int *idx;                     /* [N k] chosen experts */
    float *gate;                  /* [N k] */
    int64_t *slot;                /* [N k] row in the send order, -1: dropped */
    int64_t *send_n, *recv_n;     /* [ep] rows to / from each ep rank */
    int64_t *eoff;                /* [El + 1] each local expert's first expert-major row */
    int64_t *perm;                /* [R] expert-major row -> received row */
    int64_t cap_idx, cap_slot, cap_gate, cap_perm;
    dt_tensor xin, h, act, ret;   /* [R, C], [R, Fl], [R, Fl] expert-major; [S, C] returned outputs */
    dt_tensor didx, dgate, dslot, dperm; /* CUDA: idx, gate, slot and perm on the device */
    dt_device dev;                /* the forward's device, and the x it read (the backward's must be both) */
    const void *xdata;
};

DT_API const char *dt_moe_balance_name(dt_moe_balance b) {
    return b == DT_MOE_AUX ? "aux" : b == DT_MOE_BIAS ? "bias" : b == DT_MOE_NONE ? "none" : "?";
}

/* A 1-D f32 (or I64) buffer of at least n elements, kept from call to call (grows by half). */
static dt_status dt__moe_fit(dt_ctx *ctx, dt_tensor *buf, int64_t n, dt_dtype dtype, dt_device dev) {
    dt_tensor_desc td;
    if (buf->data && buf->numel >= n && buf->dtype == dtype && buf->device == dev) return DT_OK;
    if (n > ((int64_t)1 << 40))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_moe: a buffer of %lld elements; expected at most 2^40",
                                (long long)n);
    dt_tensor_free(ctx, buf);
    memset(&td, 0, sizeof td);
    td.dtype = dtype;
    td.device = dev;
    td.ndim = 1;
    td.shape[0] = n + n / 2 + 1;
    return dt_tensor_create(ctx, buf, &td);
}

/* Rows [r0, r0 + rows) of a [*, cols] matrix kept flat in buf. */
static dt_status dt__moe_rows(dt_ctx *ctx, dt_tensor *v, const dt_tensor *buf, int64_t r0, int64_t rows, int64_t cols) {
    int64_t s[2];
    s[0] = rows;
    s[1] = cols;
    return dt_tensor_view(ctx, v, buf, r0 * cols, 2, s);
}

/* Expert e's slice of a per-expert parameter [El, a, b] (b 0: [El, a]). */
static dt_status dt__moe_expert(dt_ctx *ctx, dt_tensor *v, const dt_tensor *t, int e) {
    int64_t s[2], per;
    s[0] = t->shape[1];
    s[1] = t->ndim > 2 ? t->shape[2] : 0;
    per = t->ndim > 2 ? s[0] * s[1] : s[0];
    return dt_tensor_view(ctx, v, t, (int64_t)e * per, t->ndim - 1, s);
}

static dt_status dt__moe_check(dt_ctx *ctx, const dt_layout *l, const dt_moe_desc *d, const char *fn) {
    if (d->experts < 1 || d->experts > (1 << 24) || d->experts % l->ep)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.experts = %d; expected a multiple of ep = %d (each ep rank "
                                "holds experts / ep of them), 1 .. 2^24", fn, d->experts, l->ep);
    if (d->top_k < 0 || d->top_k > d->experts || (!d->top_k && d->experts < 2))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.top_k = %d; expected 1 <= top_k <= experts = %d (0 = 2, which "
                                "needs 2 experts)", fn, d->top_k, d->experts);
    if (d->width < 1 || d->hidden < 0 || d->seq < 1 || d->width > ((int64_t)1 << 30) || d->hidden > ((int64_t)1 << 32) ||
        d->seq > ((int64_t)1 << 40))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.width = %lld, hidden = %lld, seq = %lld; expected 1 <= width "
                                "<= 2^30, 0 <= hidden <= 2^32 (0 = 4 width), 1 <= seq <= 2^40", fn, (long long)d->width,
                                (long long)d->hidden, (long long)d->seq);
    if (!(d->capacity >= 0 && d->capacity <= 1e6) || !(d->aux_coef >= 0 && d->aux_coef < 1e30) ||
        !(d->bias_rate >= 0 && d->bias_rate < 1e30))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.capacity = %g, aux_coef = %g, bias_rate = %g; expected finite "
                                "values >= 0 (capacity <= 1e6)", fn, d->capacity, d->aux_coef, d->bias_rate);
    if ((int)d->balance < 0 || d->balance > DT_MOE_NONE)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.balance = %d; expected a dt_moe_balance", fn, (int)d->balance);
    if (d->micro < 0 || d->renorm < 0 || d->renorm > 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.micro = %d, renorm = %d; expected micro >= 0, renorm 0 or 1",
                                fn, d->micro, d->renorm);
    return DT_OK;
}

DT_API dt_status dt_moe_create(dt_layout *l, dt_moe **out, const dt_moe_desc *desc) {
    const char *fn = "dt_moe_create";
    dt_moe_desc d;
    dt_moe *m;
    int64_t F;
    double capd;
    if (out) *out = NULL;
    if (!l) return DT_ERR_ARG;
    if (!out || !desc) return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: %s is NULL", fn, out ? "desc" : "out");
    d = *desc;
    DT__TRY(dt__moe_check(l->ctx, l, &d, fn));
    if (!d.top_k) d.top_k = 2;
    if (!d.hidden && !dt_mul_ok(4, d.width, &d.hidden))
        return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: 4 x width overflows", fn);
    if (!d.balance) d.balance = DT_MOE_AUX;
    if (d.aux_coef == 0) d.aux_coef = 0.01;
    if (d.bias_rate == 0) d.bias_rate = 0.001;
    if (!d.micro) d.micro = 1;
    F = d.hidden;
    if (F % l->tp)
        return dt_ctx_set_error(l->ctx, DT_ERR_ARG, "%s: desc.hidden = %lld is not divisible by tp = %d", fn,
                                (long long)F, l->tp);
    if (l->cp > 1 && d.capacity > 0) /* a sequence's tokens are on cp ranks: its capacity would need their counts */
        return dt_ctx_set_error(l->ctx, DT_ERR_UNSUPPORTED, "%s: desc.capacity = %g with cp = %d: capacity is counted "
                                "per sequence, whose tokens cp splits over ranks; use capacity 0 (dropless) at cp > 1",
                                fn, d.capacity, l->cp);
    m = (dt_moe *)dt_alloc_zeroed(l->ctx, sizeof *m);
    if (!m) return DT_ERR_OOM;
    m->ctx = l->ctx;
    m->l = l;
    m->d = d;
    m->E = d.experts;
    m->El = d.experts / l->ep;
    m->k = d.top_k;
    m->C = d.width;
    m->Fl = F / l->tp;
    capd = ceil(d.capacity * (double)d.seq * d.top_k / d.experts);
    /* a cap of a sequence's k assignments or more drops nothing: the cast stays defined */
    m->cap = d.capacity > 0 ? (capd < 1 ? 1 : capd >= (double)d.seq * d.top_k ? d.seq * d.top_k : (int64_t)capd) : 0;
    m->bias = (float *)dt_alloc_zeroed(l->ctx, (size_t)m->E * sizeof(float));
    m->acc = (double *)dt_alloc_zeroed(l->ctx, (size_t)(3 * m->E + 3) * sizeof(double)); /* see dt__moe_sync */
    m->f = (double *)dt_alloc_zeroed(l->ctx, (size_t)m->E * sizeof(double));
    m->load = (int64_t *)dt_alloc_zeroed(l->ctx, (size_t)m->E * sizeof(int64_t));
    m->kept = (int64_t *)dt_alloc_zeroed(l->ctx, (size_t)m->E * sizeof(int64_t));
    if (!m->bias || !m->acc || !m->f || !m->load || !m->kept || dt__moe_fit(l->ctx, &m->cnt_send, m->E, DT_I64, DT_CPU) ||
        dt__moe_fit(l->ctx, &m->cnt_recv, m->E, DT_I64, DT_CPU)) {
        dt_moe_free(m);
        return DT_ERR_OOM;
    }
    *out = m;
    return DT_OK;
}

DT_API void dt_moe_free(dt_moe *m) {
    int i;
    if (!m) return;
    dt_release(m->ctx, m->bias);
    dt_release(m->ctx, m->acc);
    dt_release(m->ctx, m->f);
    dt_release(m->ctx, m->load);
    dt_release(m->ctx, m->kept);
    dt_tensor_free(m->ctx, &m->cnt_send);
    dt_tensor_free(m->ctx, &m->cnt_recv);
    for (i = 0; i < 4; i++) dt_tensor_free(m->ctx, &m->bufs[i]);
    dt_tensor_free(m->ctx, &m->dgt);
    dt_tensor_free(m->ctx, &m->dz);
    dt_tensor_free(m->ctx, &m->dstat);
    dt_tensor_free(m->ctx, &m->hstat);
    dt_tensor_free(m->ctx, &m->dused);
    dt_tensor_free(m->ctx, &m->dbias);
    dt_tensor_free(m->ctx, &m->hbias);
    dt_tensor_free(m->ctx, &m->dauxd);
    dt_tensor_free(m->ctx, &m->hauxd);
    dt_tensor_free(m->ctx, &m->hperm);
    dt_tensor_free(m->ctx, &m->hptr);
    dt_tensor_free(m->ctx, &m->dptr);
    dt_release(m->ctx, m);
}

DT_API float *dt_moe_bias(dt_moe *m) { return m ? m->bias : NULL; }

DT_API dt_status dt_moe_acts_create(dt_moe *m, dt_moe_acts **out) {
    dt_moe_acts *a;
    if (out) *out = NULL;
    if (!m) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(m->ctx, DT_ERR_ARG, "dt_moe_acts_create: out is NULL");
    a = (dt_moe_acts *)dt_alloc_zeroed(m->ctx, sizeof *a);
    if (!a) return DT_ERR_OOM;
    a->m = m;
    a->send_n = (int64_t *)dt_alloc_zeroed(m->ctx, (size_t)m->l->ep * sizeof(int64_t));
    a->recv_n = (int64_t *)dt_alloc_zeroed(m->ctx, (size_t)m->l->ep * sizeof(int64_t));
    a->eoff = (int64_t *)dt_alloc_zeroed(m->ctx, (size_t)(m->El + 1) * sizeof(int64_t));
    if (!a->send_n || !a->recv_n || !a->eoff) {
        dt_moe_acts_free(a);
        return DT_ERR_OOM;
    }
    *out = a;
    return DT_OK;
}

DT_API void dt_moe_acts_free(dt_moe_acts *a) {
    dt_ctx *ctx;
    if (!a) return;
    ctx = a->m->ctx;
    dt_tensor_free(ctx, &a->probs);
    dt_tensor_free(ctx, &a->xin);
    dt_tensor_free(ctx, &a->h);
    dt_tensor_free(ctx, &a->act);
    dt_tensor_free(ctx, &a->ret);
    dt_tensor_free(ctx, &a->didx);
    dt_tensor_free(ctx, &a->dgate);
    dt_tensor_free(ctx, &a->dslot);
    dt_tensor_free(ctx, &a->dperm);
    dt_release(ctx, a->idx);
    dt_release(ctx, a->gate);
    dt_release(ctx, a->slot);
    dt_release(ctx, a->perm);
    dt_release(ctx, a->send_n);
    dt_release(ctx, a->recv_n);
    dt_release(ctx, a->eoff);
    dt_release(ctx, a);
}

/* A tensor argument: CPU f32 of the given dims (-1: any). */
static dt_status dt__moe_arg(dt_ctx *ctx, const dt_tensor *t, const char *name, int ndim, int64_t d0, int64_t d1,
                             int64_t d2, const char *fn, dt_device dev) {
    int64_t want[3];
    int i;
    want[0] = d0;
    want[1] = d1;
    want[2] = d2;
    if (!t || !t->data) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL or has no data", fn, name);
    if (t->device != dev)
        return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: %s is on %s; expected %s (x's device)", fn, name,
                                dt_device_name(t->device), dt_device_name(dev));
    if (t->dtype != DT_F32)
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: %s is %s; expected f32", fn, name, dt_dtype_name(t->dtype));
    if (t->ndim != ndim)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s has %d dims; expected %d", fn, name, t->ndim, ndim);
    for (i = 0; i < ndim; i++)
        if (want[i] >= 0 && t->shape[i] != want[i])
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s's dim %d is %lld; expected %lld", fn, name, i,
                                    (long long)t->shape[i], (long long)want[i]);
    return DT_OK;
}

static dt_status dt__moe_weights(dt_moe *m, const dt_tensor *router, const dt_tensor *fc_w, const dt_tensor *fc_b,
                                 const dt_tensor *proj_w, const dt_tensor *proj_b, const char *fn, const char *const *nm) {
    dt_ctx *ctx = m->ctx;
    DT__TRY(dt__moe_arg(ctx, router, nm[0], 2, m->E, m->C, 0, fn, m->dev));
    DT__TRY(dt__moe_arg(ctx, fc_w, nm[1], 3, m->El, m->Fl, m->C, fn, m->dev));
    if (fc_b) DT__TRY(dt__moe_arg(ctx, fc_b, nm[2], 2, m->El, m->Fl, 0, fn, m->dev));
    DT__TRY(dt__moe_arg(ctx, proj_w, nm[3], 3, m->El, m->C, m->Fl, fn, m->dev));
    if (proj_b) DT__TRY(dt__moe_arg(ctx, proj_b, nm[4], 2, m->El, m->C, 0, fn, m->dev));
    return DT_OK;
}

/* splitmix64's finaliser: the fingerprint of one dropped (token, choice) pair */
static uint64_t dt__moe_mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Router: p = softmax(x W_r^T) per row (f32, max subtracted, the sum in double), the k largest of
   p + bias (ties: the lower index), the gates, and the step's counts. */
static dt_status dt__moe_route(dt_moe *m, dt_moe_acts *a, const dt_tensor *x, const dt_tensor *router) {
    dt_tensor pv;
    int64_t t, N = a->N;
    int E = m->E, k = m->k, e, j;
    DT__TRY(dt__moe_fit(m->ctx, &a->probs, N * E, DT_F32, m->dev));
    DT__TRY(dt__moe_rows(m->ctx, &pv, &a->probs, 0, N, E));
    DT__TRY(dt_matmul_fwd(m->ctx, &pv, x, router, 0, 1, 1.0f, 0.0f));
    for (t = 0; t < N; t++) {
        float *p = (float *)pv.data + t * E, mx = p[0];
        double sum = 0, sel = 0;
        for (e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        for (e = 0; e < E; e++) sum += (p[e] = expf(p[e] - mx));
        for (e = 0; e < E; e++) {
            p[e] = (float)(p[e] / sum);
            m->acc[E + e] += p[e];
        }
        for (j = 0; j < k; j++) { /* the j-th largest score among those not chosen yet */
            int best = -1, i;
            float bs = 0;
            for (e = 0; e < E; e++) {
                float s = m->d.balance == DT_MOE_BIAS ? p[e] + m->bias[e] : p[e];
                for (i = 0; i < j && a->idx[t * k + i] != e; i++) {}
                if (i < j) continue;
                if (best < 0 || s > bs) { best = e; bs = s; }
            }
            a->idx[t * k + j] = best;
            a->gate[t * k + j] = p[best];
            sel += p[best];
            m->acc[best] += 1;
        }
        if (m->d.renorm && sel > 0) /* (the bias may choose experts whose p underflowed to 0: gates 0 then) */
            for (j = 0; j < k; j++) a->gate[t * k + j] = (float)(a->gate[t * k + j] / sel);
    }
    m->acc[2 * E + 2] += (double)N;
    return DT_OK;
}

/* Capacity per sequence (GShard's order: first choices in sequence order, then second ...), then
   the send order: kept assignments sorted by expert, then token. */
static dt_status dt__moe_assign(dt_moe *m, dt_moe_acts *a, int64_t seq0, int64_t *ecnt) {
    int64_t s, t, T = m->d.seq, N = a->N, run = 0;
    int E = m->E, k = m->k, e, j, p;
    for (e = 0; e < E; e++) ecnt[e] = 0;
    for (s = 0; s < N / T; s++) {
        int64_t *used = (int64_t *)m->cnt_recv.data; /* scratch [E] here */
        for (e = 0; e < E; e++) used[e] = 0;
        for (j = 0; j < k; j++)
            for (t = s * T; t < (s + 1) * T; t++) {
                e = a->idx[t * k + j];
                if (!m->cap || used[e] < m->cap) {
                    used[e]++;
                    ecnt[e]++;
                    a->slot[t * k + j] = 0;
                } else {
                    uint64_t id = (uint64_t)(seq0 + s) * (uint64_t)T + (uint64_t)(t - s * T);
                    a->slot[t * k + j] = -1;
                    m->acc[2 * E] += 1;
                    m->acc[2 * E + 1] += (double)(dt__moe_mix(id * (uint64_t)k + (uint64_t)j) & 0xfffffu);
                }
            }
    }
    for (e = 0; e < E; e++) m->acc[2 * E + 3 + e] += (double)ecnt[e];
    /* ecnt becomes each expert's first row in the send order, then its end */
    for (e = 0; e < E; e++) {
        int64_t c = ecnt[e];
        ecnt[e] = run;
        run += c;
    }
    a->S = run;
    for (t = 0; t < N; t++)
        for (j = 0; j < k; j++)
            if (a->slot[t * k + j] >= 0) a->slot[t * k + j] = ecnt[a->idx[t * k + j]]++;
    for (p = 0; p < m->l->ep; p++) a->send_n[p] = 0;
    for (e = E - 1; e >= 0; e--) { /* back to counts: end - start */
        int64_t start = e ? ecnt[e - 1] : 0;
        ecnt[e] -= start;
        a->send_n[e / m->El] += ecnt[e];
    }
    return DT_OK;
}

/* Rows between the received order (rank-major, then expert, then token) and expert-major: to = 1:
   dst[i] = src[perm[i]] (received -> expert-major), 0: dst[perm[i]] = src[i]. */
static void dt__moe_permute(const dt_moe_acts *a, float *dst, const float *src, int64_t C, int to) {
    int64_t i;
    for (i = 0; i < a->R; i++) {
        if (to) memcpy(dst + i * C, src + a->perm[i] * C, (size_t)C * sizeof(float));
        else memcpy(dst + a->perm[i] * C, src + i * C, (size_t)C * sizeof(float));
    }
}

/* The counts of every (rank, local expert) arrive; then the expert-major offsets and perm. */
static dt_status dt__moe_layout_rows(dt_moe *m, dt_moe_acts *a, const int64_t *ecnt) {
    int ep = m->l->ep, El = m->El, q, e;
    int64_t *cs = (int64_t *)m->cnt_send.data, *cr, at = 0, i, nE = m->E;
    dt_tensor s, r;
    for (e = 0; e < m->E; e++) cs[e] = ecnt[e];
    DT__TRY(dt_tensor_view(m->ctx, &s, &m->cnt_send, 0, 1, &nE));
    DT__TRY(dt_tensor_view(m->ctx, &r, &m->cnt_recv, 0, 1, &nE));
    DT__TRY(dt_comm_alltoall(m->l->ep_comm, &r, &s));
    cr = (int64_t *)m->cnt_recv.data; /* [q * El + e]: rank q's rows for local expert e */
    a->R = 0;
    for (q = 0; q < ep; q++) {
        a->recv_n[q] = 0;
        for (e = 0; e < El; e++) a->recv_n[q] += cr[q * El + e];
        a->R += a->recv_n[q];
    }
    DT__TRY(dt_grow(m->ctx, (void **)&a->perm, &a->cap_perm, a->R ? a->R : 1, sizeof(int64_t), "dt_moe perm"));
    for (e = 0; e < El; e++) {
        int64_t qstart = 0;
        a->eoff[e] = at;
        for (q = 0; q < ep; q++) {
            int64_t off = qstart;
            int e2;
            for (e2 = 0; e2 < e; e2++) off += cr[q * El + e2];
            for (i = 0; i < cr[q * El + e]; i++) a->perm[at++] = off + i;
            qstart += a->recv_n[q];
        }
    }
    a->eoff[El] = at;
    return DT_OK;
}

/* rows out through the ep all-to-allv: fwd = 1 from the send order (send_n) to the received
   order (recv_n); 0 back. */
static dt_status dt__moe_exchange(dt_moe *m, dt_moe_acts *a, dt_tensor *dst, const dt_tensor *src, int fwd) {
    int64_t sc[64], rc[64], *scp = sc, *rcp = rc, ns = fwd ? a->S : a->R, nr = fwd ? a->R : a->S;
    int q, ep = m->l->ep;
    dt_tensor in, out;
    dt_status st;
    if (ep > 64) {
        scp = (int64_t *)dt_alloc(m->ctx, (size_t)ep * 2 * sizeof(int64_t));
        if (!scp) return DT_ERR_OOM;
        rcp = scp + ep;
    }
    for (q = 0; q < ep; q++) {
        scp[q] = (fwd ? a->send_n[q] : a->recv_n[q]) * m->C;
        rcp[q] = (fwd ? a->recv_n[q] : a->send_n[q]) * m->C;
    }
    ns = (ns ? ns : 1) * m->C; /* the buffers hold at least one row more than they carry */
    nr = (nr ? nr : 1) * m->C;
    st = dt_tensor_view(m->ctx, &in, src, 0, 1, &ns);
    if (!st) st = dt_tensor_view(m->ctx, &out, dst, 0, 1, &nr);
    if (!st) st = dt_comm_alltoallv(m->l->ep_comm, &out, rcp, &in, scp);
    if (scp != sc) dt_release(m->ctx, scp);
    return st;
}

/* ---- the host loops' CUDA twins: each step below runs one way or the other (kernels/dt_moe.cu
   computes each output in the loop's order) */

#ifdef DT_CUDA
static int dt__moe_on_cuda(const dt_moe *m) { return m->dev == DT_CUDA_DEVICE; }

static dt_status dt__moe_kerr(dt_moe *m, int e, const char *what) {
    return e ? dt_ctx_set_error(m->ctx, DT_ERR_CUDA, "dt_moe: %s failed: %s", what, dt_k_error_string(e)) : DT_OK;
}

/* n elements of src into dst (either device; dt_tensor_copy of 1-D views) */
static dt_status dt__moe_copy(dt_ctx *ctx, const dt_tensor *dst, const dt_tensor *src, int64_t n) {
    dt_tensor d, s;
    if (n <= 0) return DT_OK;
    DT__TRY(dt_tensor_view(ctx, &d, dst, 0, 1, &n));
    DT__TRY(dt_tensor_view(ctx, &s, src, 0, 1, &n));
    return dt_tensor_copy(ctx, &d, &s);
}

/* The router, the capacity and the send slots on the device, as dt__moe_route and
   dt__moe_assign; the counts come back (the forward's one read: the all-to-all's sizes) into
   the step's totals, ecnt and send_n. */
static dt_status dt__moe_route_cuda(dt_moe *m, dt_moe_acts *a, const dt_tensor *x, const dt_tensor *router,
                                    int64_t seq0, int64_t *ecnt) {
    dt_ctx *ctx = m->ctx;
    int64_t N = a->N, S = N / m->d.seq, i, ns;
    int E = m->E, k = m->k, e, err, bias = m->d.balance == DT_MOE_BIAS;
    dt_tensor pv;
    const double *stat;
    const int64_t *seq;
    void *st = ctx->cuda_stream;
    ns = 3 * (int64_t)E + 2 * S;
    DT__TRY(dt__moe_fit(ctx, &a->probs, N * E, DT_F32, m->dev));
    DT__TRY(dt__moe_fit(ctx, &a->didx, N * k, DT_I32, m->dev));
    DT__TRY(dt__moe_fit(ctx, &a->dgate, N * k, DT_F32, m->dev));
    DT__TRY(dt__moe_fit(ctx, &a->dslot, N * k, DT_I64, m->dev));
    DT__TRY(dt__moe_fit(ctx, &m->dstat, ns, DT_I64, m->dev));
    DT__TRY(dt__moe_fit(ctx, &m->hstat, ns, DT_I64, DT_CPU));
    DT__TRY(dt__moe_fit(ctx, &m->dused, S * E, DT_I64, m->dev));
    DT__TRY(dt__moe_rows(ctx, &pv, &a->probs, 0, N, E));
    DT__TRY(dt_matmul_fwd(ctx, &pv, x, router, 0, 1, 1.0f, 0.0f));
    if (bias) { /* the host's bias as it is now (dt_moe_bias may have written it) */
        DT__TRY(dt__moe_fit(ctx, &m->hbias, E, DT_F32, DT_CPU));
        DT__TRY(dt__moe_fit(ctx, &m->dbias, E, DT_F32, m->dev));
        memcpy(m->hbias.data, m->bias, (size_t)E * sizeof(float));
        DT__TRY(dt__moe_copy(ctx, &m->dbias, &m->hbias, E));
    }
    err = dt_k_moe_route((float *)pv.data, (int *)a->didx.data, (float *)a->dgate.data,
                         bias ? (const float *)m->dbias.data : NULL, N, E, k, m->d.renorm, st);
    if (!err)
        err = dt_k_moe_capacity((int64_t *)a->dslot.data, (int64_t *)m->dstat.data + 3 * E, (int64_t *)m->dused.data,
                                (const int *)a->didx.data, S, m->d.seq, E, k, m->cap, seq0, st);
    if (!err)
        err = dt_k_moe_counts((double *)m->dstat.data, (const int *)a->didx.data, (const int64_t *)a->dslot.data,
                              (const float *)pv.data, N, E, k, st);
    if (!err)
        err = dt_k_moe_slots((int64_t *)a->dslot.data, (const int *)a->didx.data, (const double *)m->dstat.data, N, E, k,
                             st);
    DT__TRY(dt__moe_kerr(m, err, "the routing kernels"));
    DT__TRY(dt__moe_copy(ctx, &m->hstat, &m->dstat, ns));
    stat = (const double *)m->hstat.data;
    seq = (const int64_t *)m->hstat.data + 3 * E;
    for (e = 0; e < m->l->ep; e++) a->send_n[e] = 0;
    for (e = 0, a->S = 0; e < E; e++) {
        m->acc[e] += stat[e];
        m->acc[E + e] += stat[E + e];
        ecnt[e] = (int64_t)stat[2 * E + e];
        m->acc[2 * E + 3 + e] += (double)ecnt[e];
        a->S += ecnt[e];
        a->send_n[e / m->El] += ecnt[e];
    }
    for (i = 0; i < S; i++) {
        m->acc[2 * E] += (double)seq[2 * i];
        m->acc[2 * E + 1] += (double)seq[2 * i + 1];
    }
    m->acc[2 * E + 2] += (double)N;
    return DT_OK;
}
#endif

#ifdef DT_CUDA
/* The CUDA experts: each GEMM of every local expert with tokens in one grouped cuBLAS call
   (dt_k_gemm_grouped), the biases by segment (kernels/dt_moe.cu), GELU over all rows at once.
   The grouped calls' device pointer arrays and the experts' row offsets go up in one copy. */
typedef struct dt__moe_grp {
    int n;                        /* experts with rows */
    int64_t M[DT__MOE_GMAX], e[DT__MOE_GMAX];
    const int64_t *deoff;         /* eoff on the device */
    const float *const *dp;       /* the uploaded pointer arrays, n each */
} dt__moe_grp;

/* The problem list and the upload: nptr pointers per problem (filled by ptr(e, j)), then eoff. */
static dt_status dt__moe_grp_make(dt_moe *m, dt_moe_acts *a, dt__moe_grp *g, int nptr,
                                  const void *(*ptr)(void *u, int e, int j), void *u) {
    int e, j, i;
    int64_t *h;
    g->n = 0;
    for (e = 0; e < m->El; e++)
        if (a->eoff[e + 1] > a->eoff[e]) {
            g->M[g->n] = a->eoff[e + 1] - a->eoff[e];
            g->e[g->n++] = e;
        }
    DT__TRY(dt__moe_fit(m->ctx, &m->hptr, (int64_t)nptr * g->n + m->El + 1, DT_I64, DT_CPU));
    DT__TRY(dt__moe_fit(m->ctx, &m->dptr, (int64_t)nptr * g->n + m->El + 1, DT_I64, m->dev));
    h = (int64_t *)m->hptr.data;
    for (j = 0; j < nptr; j++)
        for (i = 0; i < g->n; i++) h[j * g->n + i] = (int64_t)(intptr_t)ptr(u, (int)g->e[i], j);
    for (e = 0; e <= m->El; e++) h[nptr * g->n + e] = a->eoff[e];
    DT__TRY(dt__moe_copy(m->ctx, &m->dptr, &m->hptr, (int64_t)nptr * g->n + m->El + 1));
    g->dp = (const float *const *)m->dptr.data;
    g->deoff = (const int64_t *)m->dptr.data + nptr * g->n;
    return DT_OK;
}

/* One grouped GEMM over g's problems: pointer arrays j0, j0 + 1, j0 + 2 of the upload; M per problem
   (mrows) or fixed, likewise N, K (krows: K is the problem's rows). */
static dt_status dt__moe_grp_gemm(dt_moe *m, const dt__moe_grp *g, int j0, int ta, int tb, int64_t M, int64_t N,
                                  int64_t K, float alpha, float beta) {
    int64_t Ms[DT__MOE_GMAX], Ns[DT__MOE_GMAX], Ks[DT__MOE_GMAX];
    int i;
    for (i = 0; i < g->n; i++) {
        Ms[i] = M ? M : g->M[i];
        Ns[i] = N;
        Ks[i] = K ? K : g->M[i];
    }
    return dt__moe_kerr(m, dt_k_gemm_grouped(m->ctx->cublas, g->n, ta, tb, Ms, Ns, Ks, alpha, beta, g->dp + j0 * g->n,
                                             g->dp + (j0 + 1) * g->n, (float *const *)(g->dp + (j0 + 2) * g->n),
                                             m->ctx->cuda_stream),
                        "dt_k_gemm_grouped");
}

typedef struct dt__moe_fwdp { dt_moe *m; dt_moe_acts *a; const dt_tensor *w1, *w2; } dt__moe_fwdp;
static const void *dt__moe_fwd_ptr(void *u, int e, int j) {
    const dt__moe_fwdp *q = (const dt__moe_fwdp *)u;
    int64_t r0 = q->a->eoff[e], C = q->m->C, Fl = q->m->Fl;
    switch (j) {
    case 0: return (const float *)q->a->xin.data + r0 * C;               /* fc: X_e [n, C] */
    case 1: return (const float *)q->w1->data + (int64_t)e * Fl * C;     /*     W1_e [Fl, C] */
    case 2: return (float *)q->a->h.data + r0 * Fl;                      /*     H_e */
    case 3: return (const float *)q->a->act.data + r0 * Fl;              /* proj: A_e [n, Fl] */
    case 4: return (const float *)q->w2->data + (int64_t)e * C * Fl;     /*       W2_e [C, Fl] */
    default: return (float *)q->m->bufs[0].data + r0 * C;                /*       O_e */
    }
}

static dt_status dt__moe_experts_fwd_cuda(dt_moe *m, dt_moe_acts *a, const dt_tensor *fc_w, const dt_tensor *fc_b,
                                          const dt_tensor *proj_w, const dt_tensor *proj_b) {
    dt__moe_grp g;
    dt__moe_fwdp q;
    dt_tensor H, A;
    void *st = m->ctx->cuda_stream;
    if (!a->R) return DT_OK;
    q.m = m; q.a = a; q.w1 = fc_w; q.w2 = proj_w;
    DT__TRY(dt__moe_grp_make(m, a, &g, 6, dt__moe_fwd_ptr, &q));
    DT__TRY(dt__moe_grp_gemm(m, &g, 0, 0, 1, 0, m->Fl, m->C, 1.0f, 0.0f));
    if (fc_b) DT__TRY(dt__moe_kerr(m, dt_k_moe_bias_rows((float *)a->h.data, (const float *)fc_b->data, g.deoff, m->El,
                                                         m->Fl, st), "dt_k_moe_bias_rows"));
    DT__TRY(dt__moe_rows(m->ctx, &H, &a->h, 0, a->R, m->Fl));
    DT__TRY(dt__moe_rows(m->ctx, &A, &a->act, 0, a->R, m->Fl));
    DT__TRY(dt_gelu_fwd(m->ctx, &A, &H));
    DT__TRY(dt__moe_grp_gemm(m, &g, 3, 0, 1, 0, m->C, m->Fl, 1.0f, 0.0f));
    if (proj_b && m->l->tp_rank == 0) /* proj's bias once over tp */
        DT__TRY(dt__moe_kerr(m, dt_k_moe_bias_rows((float *)m->bufs[0].data, (const float *)proj_b->data, g.deoff,
                                                   m->El, m->C, st), "dt_k_moe_bias_rows"));
    return DT_OK;
}

typedef struct dt__moe_bwdp {
    dt_moe *m; dt_moe_acts *a; const dt_tensor *w1, *w2, *gw1, *gw2; float *dA, *dH, *dO, *dX;
} dt__moe_bwdp;
static const void *dt__moe_bwd_ptr(void *u, int e, int j) {
    const dt__moe_bwdp *q = (const dt__moe_bwdp *)u;
    int64_t r0 = q->a->eoff[e], C = q->m->C, Fl = q->m->Fl;
    switch (j) {
    case 0: return q->dO + r0 * C;                                        /* dA = dO W2 */
    case 1: return (const float *)q->w2->data + (int64_t)e * C * Fl;
    case 2: return q->dA + r0 * Fl;
    case 3: return q->dO + r0 * C;                                        /* dW2 += dO^T A */
    case 4: return (const float *)q->a->act.data + r0 * Fl;
    case 5: return (float *)q->gw2->data + (int64_t)e * C * Fl;
    case 6: return q->dH + r0 * Fl;                                       /* dW1 += dH^T X */
    case 7: return (const float *)q->a->xin.data + r0 * C;
    case 8: return (float *)q->gw1->data + (int64_t)e * Fl * C;
    case 9: return q->dH + r0 * Fl;                                       /* dX = dH W1 */
    case 10: return (const float *)q->w1->data + (int64_t)e * Fl * C;
    default: return q->dX + r0 * C;
    }
}

/* dO (bufs[0], expert-major) -> the weight grads (x 1/ep) and dX (bufs[1]); dA and dH in bufs[2]. */
static dt_status dt__moe_experts_bwd_cuda(dt_moe *m, dt_moe_acts *a, dt_tensor *d_fc_w, dt_tensor *d_fc_b,
                                          dt_tensor *d_proj_w, dt_tensor *d_proj_b, const dt_tensor *fc_w,
                                          const dt_tensor *proj_w) {
    dt__moe_grp g;
    dt__moe_bwdp q;
    dt_tensor dA, dH, H;
    float s = 1.0f / (float)m->l->ep;
    void *st = m->ctx->cuda_stream;
    if (!a->R) return DT_OK;
    DT__TRY(dt__moe_fit(m->ctx, &m->bufs[2], 2 * a->R * m->Fl + 1, DT_F32, m->dev));
    q.m = m; q.a = a; q.w1 = fc_w; q.w2 = proj_w; q.gw1 = d_fc_w; q.gw2 = d_proj_w;
    q.dA = (float *)m->bufs[2].data;
    q.dH = q.dA + a->R * m->Fl;
    q.dO = (float *)m->bufs[0].data;
    q.dX = (float *)m->bufs[1].data;
    DT__TRY(dt__moe_grp_make(m, a, &g, 12, dt__moe_bwd_ptr, &q));
    if (d_proj_b)
        DT__TRY(dt__moe_kerr(m, dt_k_moe_bias_grad((float *)d_proj_b->data, q.dO, g.deoff, m->El, m->C, s, st),
                             "dt_k_moe_bias_grad"));
    DT__TRY(dt__moe_grp_gemm(m, &g, 3, 1, 0, m->C, m->Fl, 0, s, 1.0f));   /* dW2 */
    DT__TRY(dt__moe_grp_gemm(m, &g, 0, 0, 0, 0, m->Fl, m->C, 1.0f, 0.0f)); /* dA */
    DT__TRY(dt__moe_rows(m->ctx, &dA, &m->bufs[2], 0, a->R, m->Fl));
    DT__TRY(dt__moe_rows(m->ctx, &dH, &m->bufs[2], a->R, a->R, m->Fl));
    DT__TRY(dt__moe_rows(m->ctx, &H, &a->h, 0, a->R, m->Fl));
    DT__TRY(dt_tensor_fill(m->ctx, &dH, 0.0));
    DT__TRY(dt_gelu_bwd(m->ctx, &dH, &dA, &H));
    if (d_fc_b)
        DT__TRY(dt__moe_kerr(m, dt_k_moe_bias_grad((float *)d_fc_b->data, q.dH, g.deoff, m->El, m->Fl, s, st),
                             "dt_k_moe_bias_grad"));
    DT__TRY(dt__moe_grp_gemm(m, &g, 6, 1, 0, m->Fl, m->C, 0, s, 1.0f));   /* dW1 */
    return dt__moe_grp_gemm(m, &g, 9, 0, 0, 0, m->C, m->Fl, 1.0f, 0.0f);  /* dX */
}
#endif

/* The received order's rows to expert-major (to 1) or back, on either device. */
static dt_status dt__moe_regroup(dt_moe *m, dt_moe_acts *a, dt_tensor *dst, const dt_tensor *src, int to) {
#ifdef DT_CUDA
    if (dt__moe_on_cuda(m))
        return dt__moe_kerr(m, dt_k_moe_permute((float *)dst->data, (const float *)src->data,
                                                (const int64_t *)a->dperm.data, a->R, m->C, to, m->ctx->cuda_stream),
                            "dt_k_moe_permute");
#endif
    dt__moe_permute(a, (float *)dst->data, (const float *)src->data, m->C, to);
    return DT_OK;
}

/* x's rows of the kept assignments into the send order (bufs[0]). */
static dt_status dt__moe_pack(dt_moe *m, dt_moe_acts *a, const dt_tensor *x) {
    int64_t t, C = m->C;
    int j, k = m->k;
    float *send = (float *)m->bufs[0].data;
#ifdef DT_CUDA
    if (dt__moe_on_cuda(m)) {
        DT__TRY(dt__moe_fit(m->ctx, &a->dperm, a->R + 1, DT_I64, m->dev));
        DT__TRY(dt__moe_fit(m->ctx, &m->hperm, a->R + 1, DT_I64, DT_CPU));
        memcpy(m->hperm.data, a->perm, (size_t)a->R * sizeof(int64_t));
        DT__TRY(dt__moe_copy(m->ctx, &a->dperm, &m->hperm, a->R)); /* the regrouping's map, up once */
        return dt__moe_kerr(m, dt_k_moe_pack(send, (const float *)x->data, (const int64_t *)a->dslot.data, a->N, k, C,
                                             m->ctx->cuda_stream), "dt_k_moe_pack");
    }
#endif
    for (t = 0; t < a->N; t++)
        for (j = 0; j < k; j++)
            if (a->slot[t * k + j] >= 0)
                memcpy(send + a->slot[t * k + j] * C, (const float *)x->data + t * C, (size_t)C * sizeof(float));
    return DT_OK;
}

/* y = sum over j in order of the kept g_tj ret[slot_tj] (written). */
static dt_status dt__moe_combine(dt_moe *m, dt_moe_acts *a, dt_tensor *y) {
    int64_t t, N = a->N, C = m->C;
    int j, k = m->k;
    float *yd = (float *)y->data;
#ifdef DT_CUDA
    if (dt__moe_on_cuda(m))
        return dt__moe_kerr(m, dt_k_moe_combine(yd, (const float *)a->ret.data, (const int64_t *)a->dslot.data,
                                                (const float *)a->dgate.data, N, k, C, m->ctx->cuda_stream),
                            "dt_k_moe_combine");
#endif
    memset(yd, 0, (size_t)(N * C) * sizeof(float));
    for (t = 0; t < N; t++)
        for (j = 0; j < k; j++) {
            int64_t s = a->slot[t * k + j], c;
            const float *o;
            float g = a->gate[t * k + j];
            if (s < 0) continue;
            o = (const float *)a->ret.data + s * C;
            for (c = 0; c < C; c++) yd[t * C + c] += g * o[c];
        }
    return DT_OK;
}

/* The combine's backward: the outputs' grads g dy in the send order (bufs[0]) and the gates'
   grads dg = dy . out (dgt; partial over tp). */
static dt_status dt__moe_combine_bwd(dt_moe *m, dt_moe_acts *a, const dt_tensor *dy) {
    int64_t t, N = a->N, C = m->C;
    int j, k = m->k;
    float *dret = (float *)m->bufs[0].data, *dgd = (float *)m->dgt.data;
#ifdef DT_CUDA
    if (dt__moe_on_cuda(m))
        return dt__moe_kerr(m, dt_k_moe_combine_bwd(dret, dgd, (const float *)dy->data, (const float *)a->ret.data,
                                                    (const int64_t *)a->dslot.data, (const float *)a->dgate.data, N, k,
                                                    C, m->ctx->cuda_stream), "dt_k_moe_combine_bwd");
#endif
    for (t = 0; t < N; t++)
        for (j = 0; j < k; j++) {
            int64_t s = a->slot[t * k + j], c;
            const float *o, *g = (const float *)dy->data + t * C;
            double dot = 0;
            dgd[t * k + j] = 0;
            if (s < 0) continue;
            o = (const float *)a->ret.data + s * C;
            for (c = 0; c < C; c++) {
                dot += (double)g[c] * o[c];
                dret[s * C + c] = a->gate[t * k + j] * g[c];
            }
            dgd[t * k + j] = (float)dot;
        }
    return DT_OK;
}

/* dx_t += its experts' input grads (back, the send order), in choice order. */
static dt_status dt__moe_dispatch_bwd(dt_moe *m, dt_moe_acts *a, dt_tensor *dx, const dt_tensor *back) {
    int64_t t, i, N = a->N, C = m->C;
    int j, k = m->k;
#ifdef DT_CUDA
    if (dt__moe_on_cuda(m))
        return dt__moe_kerr(m, dt_k_moe_dispatch_bwd((float *)dx->data, (const float *)back->data,
                                                     (const int64_t *)a->dslot.data, N, k, C, m->ctx->cuda_stream),
                            "dt_k_moe_dispatch_bwd");
#endif
    for (t = 0; t < N; t++)
        for (j = 0; j < k; j++) {
            int64_t s = a->slot[t * k + j];
            float *d = (float *)dx->data + t * C;
            const float *g = (const float *)back->data + s * C;
            if (s < 0) continue;
            for (i = 0; i < C; i++) d[i] += g[i];
        }
    return DT_OK;
}

DT_API dt_status dt_moe_fwd(dt_moe *m, dt_moe_acts *a, dt_tensor *y, const dt_tensor *x, int64_t seq0,
                            const dt_tensor *router, const dt_tensor *fc_w, const dt_tensor *fc_b,
                            const dt_tensor *proj_w, const dt_tensor *proj_b) {
    static const char *const nm[5] = {"router", "fc_w", "fc_b", "proj_w", "proj_b"};
    const char *fn = "dt_moe_fwd";
    dt_ctx *ctx;
    int64_t N, C, Fl, *ecnt, ek[64], t0i = 0;
    int e, k;
    dt_status st = DT_OK;
    double t0, t1;
    if (!m) return DT_ERR_ARG;
    ctx = m->ctx;
    if (!a || a->m != m) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: a is NULL or another layer's acts", fn);
    DT__TRY(dt__moe_arg(ctx, x, "x", 2, -1, m->C, 0, fn, x ? x->device : DT_CPU));
    m->dev = x->device;
    if (m->dev == DT_CUDA_DEVICE && m->El > DT__MOE_GMAX)
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: %d experts per rank on cuda; the grouped GEMM takes at "
                                "most %d (raise ep)", fn, m->El, DT__MOE_GMAX);
    if (x->shape[0] % m->d.seq)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: x has %lld rows; expected whole sequences of desc.seq = %lld", fn,
                                (long long)x->shape[0], (long long)m->d.seq);
    DT__TRY(dt__moe_arg(ctx, y, "y", 2, x->shape[0], m->C, 0, fn, m->dev));
    DT__TRY(dt__moe_weights(m, router, fc_w, fc_b, proj_w, proj_b, fn, nm));
    if (seq0 < 0) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: seq0 = %lld; expected >= 0", fn, (long long)seq0);
    if (m->d.balance == DT_MOE_AUX && m->synced)
        return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: a forward after this step's first backward (the aux loss's f "
                                "over the step is fixed by then); call dt_moe_step_end after the step's last backward",
                                fn);
    if (y->data == x->data) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: y and x are the same memory", fn);
    {   /* the routing's arrays and the rows that may travel (k per token, C each) stay well inside int64 */
        int64_t nk = 0, ne = 0, nkc = 0;
        if (!dt_mul_ok(x->shape[0], m->k, &nk) || !dt_mul_ok(x->shape[0], m->E, &ne) || !dt_mul_ok(nk + 1, m->C, &nkc) ||
            nkc > ((int64_t)1 << 40) || ne > ((int64_t)1 << 40))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: x has %lld rows: x k = %d assignments of %lld columns (or x E "
                                    "= %d probabilities) exceed 2^40 elements", fn, (long long)x->shape[0], m->k,
                                    (long long)m->C, m->E);
    }
    N = a->N = x->shape[0];
    C = m->C;
    Fl = m->Fl;
    k = m->k;
    DT__TRY(dt_grow(ctx, (void **)&a->idx, &a->cap_idx, N * k + 1, sizeof(int), "dt_moe idx"));
    DT__TRY(dt_grow(ctx, (void **)&a->gate, &a->cap_gate, N * k + 1, sizeof(float), "dt_moe gate"));
    DT__TRY(dt_grow(ctx, (void **)&a->slot, &a->cap_slot, N * k + 1, sizeof(int64_t), "dt_moe slot"));
    ecnt = m->E <= 64 ? ek : (int64_t *)dt_alloc(ctx, (size_t)m->E * sizeof(int64_t));
    if (!ecnt) return DT_ERR_OOM;
    t0 = dt_comm_now();
#ifdef DT_CUDA
    if (dt__moe_on_cuda(m)) st = dt__moe_route_cuda(m, a, x, router, seq0, ecnt);
    else
#endif
    {
        st = dt__moe_route(m, a, x, router);
        if (!st) st = dt__moe_assign(m, a, seq0, ecnt);
    }
    t1 = dt_comm_now();
    m->secs[0] += t1 - t0;
    if (!st) st = dt__moe_layout_rows(m, a, ecnt);
    if (ecnt != ek) dt_release(ctx, ecnt);
    if (!st && (!dt_mul_ok(a->R + 1, m->C > Fl ? m->C : Fl, &t0i) || t0i > ((int64_t)1 << 40)))
        st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %lld rows reached this rank's experts: x %lld columns exceeds 2^40 "
                              "elements", fn, (long long)a->R, (long long)(m->C > Fl ? m->C : Fl));
    if (st) return st;
    m->n_fwd++;
    a->dev = m->dev;
    a->xdata = x->data;
    /* dispatch: x's rows in the send order, across, then expert-major into xin */
    DT__TRY(dt__moe_fit(ctx, &m->bufs[0], ((a->S > a->R ? a->S : a->R) + 1) * C, DT_F32, m->dev));
    DT__TRY(dt__moe_fit(ctx, &m->bufs[1], ((a->S > a->R ? a->S : a->R) + 1) * C, DT_F32, m->dev));
    DT__TRY(dt__moe_fit(ctx, &a->xin, (a->R + 1) * C, DT_F32, m->dev));
    DT__TRY(dt__moe_fit(ctx, &a->h, (a->R + 1) * Fl, DT_F32, m->dev));
    DT__TRY(dt__moe_fit(ctx, &a->act, (a->R + 1) * Fl, DT_F32, m->dev));
    DT__TRY(dt__moe_fit(ctx, &a->ret, (a->S + 1) * C, DT_F32, m->dev));
    DT__TRY(dt__moe_pack(m, a, x));
    DT__TRY(dt__moe_exchange(m, a, &m->bufs[1], &m->bufs[0], 1));
    DT__TRY(dt__moe_regroup(m, a, &a->xin, &m->bufs[1], 1));
    t0 = dt_comm_now();
    m->secs[1] += t0 - t1;
    /* the experts, one GEMM pair each over its rows (expert-major outputs into bufs[0]) */
#ifdef DT_CUDA
    if (dt__moe_on_cuda(m)) st = dt__moe_experts_fwd_cuda(m, a, fc_w, fc_b, proj_w, proj_b);
    else
#endif
    for (e = 0; e < m->El && !st; e++) {
        int64_t r0 = a->eoff[e], n = a->eoff[e + 1] - a->eoff[e];
        dt_tensor X, H, A, O, w1, b1, w2, b2;
        if (!n) continue;
        st = dt__moe_rows(ctx, &X, &a->xin, r0, n, C);
        if (!st) st = dt__moe_rows(ctx, &H, &a->h, r0, n, Fl);
        if (!st) st = dt__moe_rows(ctx, &A, &a->act, r0, n, Fl);
        if (!st) st = dt__moe_rows(ctx, &O, &m->bufs[0], r0, n, C);
        if (!st) st = dt__moe_expert(ctx, &w1, fc_w, e);
        if (!st && fc_b) st = dt__moe_expert(ctx, &b1, fc_b, e);
        if (!st) st = dt__moe_expert(ctx, &w2, proj_w, e);
        if (!st && proj_b) st = dt__moe_expert(ctx, &b2, proj_b, e);
        if (!st) st = dt_linear_fwd(ctx, &H, &X, &w1, fc_b ? &b1 : NULL);
        if (!st) st = dt_gelu_fwd(ctx, &A, &H);
        /* proj's bias once over tp: the tp ranks' outputs are summed */
        if (!st) st = dt_linear_fwd(ctx, &O, &A, &w2, proj_b && m->l->tp_rank == 0 ? &b2 : NULL);
    }
    if (st) return st;
    t1 = dt_comm_now();
    m->secs[2] += t1 - t0;
    /* back to the received order, across, and the combine in choice order */
    DT__TRY(dt__moe_regroup(m, a, &m->bufs[1], &m->bufs[0], 0));
    DT__TRY(dt__moe_exchange(m, a, &a->ret, &m->bufs[1], 0));
    DT__TRY(dt__moe_combine(m, a, y));
    m->secs[3] += dt_comm_now() - t1;
    return DT_OK;
}

/* The step's counts over dp x cp (every rank of a stage with its tp place): f_e, P_e, the aux loss. */
static dt_status dt__moe_sync(dt_moe *m) {
    int E = m->E, e;
    double n, aux = 0;
    if (m->synced) return DT_OK;
    DT__TRY(dt_comm_allreduce_f64(m->l->dpcp_comm, m->acc, 3 * E + 3, DT_REDUCE_SUM));
    n = m->acc[2 * E + 2];
    for (e = 0; e < E; e++) {
        m->f[e] = n > 0 ? m->acc[e] / (n * m->k) : 0;
        aux += m->f[e] * (n > 0 ? m->acc[E + e] / n : 0);
    }
    m->aux = m->d.aux_coef * E * aux;
    m->synced = 1;
    return DT_OK;
}

/* sum over rows of g [rows, n], times alpha, into db [n] (through a scratch row of bufs[3]) */
static dt_status dt__moe_bias_grad(dt_moe *m, dt_tensor *db, const dt_tensor *g, float alpha) {
    dt_tensor tmp;
    DT__TRY(dt__moe_fit(m->ctx, &m->bufs[3], db->numel, DT_F32, m->dev));
    DT__TRY(dt_tensor_view(m->ctx, &tmp, &m->bufs[3], 0, 1, &db->numel));
    DT__TRY(dt_tensor_fill(m->ctx, &tmp, 0.0));
    DT__TRY(dt_bias_add_bwd(m->ctx, &tmp, g));
    return dt_axpy(m->ctx, db, alpha, &tmp);
}

/* One expert's backward over its rows: dO [n, C] -> weight grads (x 1/ep) and dX [n, C]. */
static dt_status dt__moe_expert_bwd(dt_moe *m, dt_moe_acts *a, int e, dt_tensor *dX, const dt_tensor *dO,
                                    dt_tensor *d_fc_w, dt_tensor *d_fc_b, dt_tensor *d_proj_w, dt_tensor *d_proj_b,
                                    const dt_tensor *fc_w, const dt_tensor *proj_w) {
    dt_ctx *ctx = m->ctx;
    int64_t r0 = a->eoff[e], n = a->eoff[e + 1] - a->eoff[e];
    float s = 1.0f / (float)m->l->ep;
    dt_tensor X, H, A, dA, w1, w2, gw1, gw2, gb;
    DT__TRY(dt__moe_rows(ctx, &X, &a->xin, r0, n, m->C));
    DT__TRY(dt__moe_rows(ctx, &H, &a->h, r0, n, m->Fl));
    DT__TRY(dt__moe_rows(ctx, &A, &a->act, r0, n, m->Fl));
    DT__TRY(dt__moe_fit(ctx, &m->bufs[2], 2 * n * m->Fl + 1, DT_F32, m->dev));
    DT__TRY(dt__moe_rows(ctx, &dA, &m->bufs[2], 0, n, m->Fl));
    DT__TRY(dt__moe_expert(ctx, &w1, fc_w, e));
    DT__TRY(dt__moe_expert(ctx, &w2, proj_w, e));
    DT__TRY(dt__moe_expert(ctx, &gw1, d_fc_w, e));
    DT__TRY(dt__moe_expert(ctx, &gw2, d_proj_w, e));
    /* proj: its grads from dO (the whole output's: the bias's grad is the same on every tp rank) */
    if (d_proj_b) {
        DT__TRY(dt__moe_expert(ctx, &gb, d_proj_b, e));
        DT__TRY(dt__moe_bias_grad(m, &gb, dO, s));
    }
    DT__TRY(dt_matmul_fwd(ctx, &gw2, dO, &A, 1, 0, s, 1.0f));
    DT__TRY(dt_tensor_fill(ctx, &dA, 0.0));
    DT__TRY(dt_linear_bwd(ctx, &dA, NULL, NULL, dO, &A, &w2));
    /* gelu, in place of the act rows' grads: dH into the second half of bufs[2] */
    {
        dt_tensor dH;
        DT__TRY(dt__moe_rows(ctx, &dH, &m->bufs[2], n, n, m->Fl));
        DT__TRY(dt_tensor_fill(ctx, &dH, 0.0));
        DT__TRY(dt_gelu_bwd(ctx, &dH, &dA, &H));
        if (d_fc_b) {
            DT__TRY(dt__moe_expert(ctx, &gb, d_fc_b, e));
            DT__TRY(dt__moe_bias_grad(m, &gb, &dH, s));
        }
        DT__TRY(dt_matmul_fwd(ctx, &gw1, &dH, &X, 1, 0, s, 1.0f));
        DT__TRY(dt_tensor_fill(ctx, dX, 0.0));
        DT__TRY(dt_linear_bwd(ctx, dX, NULL, NULL, &dH, &X, &w1));
    }
    return DT_OK;
}

/* The router's backward: the gates' grads dg (summed over tp), the aux loss's, through the
   softmax into dz [N, E]; then d_router += dz^T x and (tp rank 0) dx += dz W_r. */
static dt_status dt__moe_router_bwd(dt_moe *m, dt_moe_acts *a, dt_tensor *dx, dt_tensor *d_router, const dt_tensor *x,
                                    const dt_tensor *router, const float *dg, float loss_scale) {
    int64_t t, N = a->N;
    int E = m->E, k = m->k, e, j;
    double auxg = 0;
    dt_tensor dz, pv;
    float *dzd;
    DT__TRY(dt__moe_fit(m->ctx, &m->dz, N * E, DT_F32, m->dev));
    DT__TRY(dt__moe_rows(m->ctx, &dz, &m->dz, 0, N, E));
    DT__TRY(dt__moe_rows(m->ctx, &pv, &a->probs, 0, N, E));
    dzd = (float *)dz.data;
    /* d aux / d p_te = coef E f_e / N_global, and the ranks' grads are averaged over dp x cp */
    if (m->d.balance == DT_MOE_AUX && m->acc[2 * E + 2] > 0)
        auxg = m->d.aux_coef * E * (double)m->l->dpcp / m->acc[2 * E + 2] * loss_scale;
#ifdef DT_CUDA
    if (dt__moe_on_cuda(m)) { /* the aux loss's per-expert grads go up (E floats), then one thread per token */
        int err;
        DT__TRY(dt__moe_fit(m->ctx, &m->hauxd, E, DT_F32, DT_CPU));
        DT__TRY(dt__moe_fit(m->ctx, &m->dauxd, E, DT_F32, m->dev));
        for (e = 0; e < E; e++) ((float *)m->hauxd.data)[e] = (float)(auxg * m->f[e]);
        DT__TRY(dt__moe_copy(m->ctx, &m->dauxd, &m->hauxd, E));
        err = dt_k_moe_router_bwd(dzd, (const float *)pv.data, (const int *)a->didx.data, (const float *)a->dgate.data,
                                  dg, (const float *)m->dauxd.data, N, E, k, m->d.renorm, m->ctx->cuda_stream);
        DT__TRY(dt__moe_kerr(m, err, "dt_k_moe_router_bwd"));
        t = N; /* skip the host loop */
    } else
#endif
        t = 0;
    for (; t < N; t++) {
        const float *p = (const float *)pv.data + t * E;
        float *d = dzd + t * E;
        double dot = 0, sel = 0, gd = 0;
        for (e = 0; e < E; e++) d[e] = (float)(auxg * m->f[e]);
        if (m->d.renorm) { /* g_j = p_j / S: dp_j = (dg_j - sum_i dg_i g_i) / S (S = 0: gates 0, no gradient) */
            for (j = 0; j < k; j++) {
                sel += p[a->idx[t * k + j]];
                gd += (double)dg[t * k + j] * a->gate[t * k + j];
            }
            for (j = 0; j < k && sel > 0; j++) d[a->idx[t * k + j]] += (float)((dg[t * k + j] - gd) / sel);
        } else
            for (j = 0; j < k; j++) d[a->idx[t * k + j]] += dg[t * k + j];
        for (e = 0; e < E; e++) dot += (double)p[e] * d[e];
        for (e = 0; e < E; e++) d[e] = (float)(p[e] * (d[e] - dot));
    }
    DT__TRY(dt_matmul_fwd(m->ctx, d_router, &dz, x, 1, 0, 1.0f, 1.0f));
    if (m->l->tp_rank == 0) DT__TRY(dt_matmul_fwd(m->ctx, dx, &dz, router, 0, 0, 1.0f, 1.0f));
    return DT_OK;
}

DT_API dt_status dt_moe_bwd(dt_moe *m, dt_moe_acts *a, dt_tensor *dx, dt_tensor *d_router, dt_tensor *d_fc_w,
                            dt_tensor *d_fc_b, dt_tensor *d_proj_w, dt_tensor *d_proj_b, const dt_tensor *dy,
                            const dt_tensor *x, const dt_tensor *router, const dt_tensor *fc_w,
                            const dt_tensor *proj_w, float loss_scale) {
    static const char *const nm[5] = {"router", "fc_w", "fc_b", "proj_w", "proj_b"};
    static const char *const gn[5] = {"d_router", "d_fc_w", "d_fc_b", "d_proj_w", "d_proj_b"};
    const char *fn = "dt_moe_bwd";
    dt_ctx *ctx;
    int64_t N, C, t;
    int k, e;
    dt_tensor dgv;
    double t0 = dt_comm_now(), t1;
    if (!m) return DT_ERR_ARG;
    ctx = m->ctx;
    if (!a || a->m != m) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: a is NULL or another layer's acts", fn);
    if (!a->probs.data) return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: no dt_moe_fwd for these acts", fn);
    if (x && (x->device != a->dev || x->data != a->xdata))
        return dt_ctx_set_error(ctx, x->device != a->dev ? DT_ERR_DEVICE : DT_ERR_ARG, "%s: x (on %s) is not the tensor "
                                "these acts' forward read (on %s); the backward needs that forward's x", fn,
                                dt_device_name(x->device), dt_device_name(a->dev));
    m->dev = a->dev;
    N = a->N;
    C = m->C;
    k = m->k;
    DT__TRY(dt__moe_arg(ctx, x, "x", 2, N, C, 0, fn, m->dev));
    DT__TRY(dt__moe_arg(ctx, dy, "dy", 2, N, C, 0, fn, m->dev));
    DT__TRY(dt__moe_arg(ctx, dx, "dx", 2, N, C, 0, fn, m->dev));
    DT__TRY(dt__moe_weights(m, router, fc_w, NULL, proj_w, NULL, fn, nm));
    DT__TRY(dt__moe_weights(m, d_router, d_fc_w, d_fc_b, d_proj_w, d_proj_b, fn, gn));
    if (!(loss_scale > 0 && loss_scale < HUGE_VALF)) /* (not isfinite: a C++ template exported under DT_STATIC) */
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: loss_scale = %g; expected a finite value > 0", fn, loss_scale);
    if (m->d.balance == DT_MOE_AUX && !m->synced) {
        if (m->n_fwd != m->d.micro)
            return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: the aux loss needs f over the step's whole batch, but %d "
                                    "forwards of desc.micro = %d ran before this backward; run every forward of a step "
                                    "(desc.micro of them) before its first backward (GPipe, or one micro-batch), or "
                                    "balance by DT_MOE_BIAS", fn, m->n_fwd, m->d.micro);
        DT__TRY(dt__moe_sync(m));
    }
    /* the gates' grads dg = dy . out (partial over tp, summed), and the outputs' grads g dy in the
       send order */
    DT__TRY(dt__moe_fit(ctx, &m->dgt, N * k + 1, DT_F32, m->dev));
    DT__TRY(dt__moe_fit(ctx, &m->bufs[0], ((a->S > a->R ? a->S : a->R) + 1) * C, DT_F32, m->dev));
    DT__TRY(dt__moe_fit(ctx, &m->bufs[1], ((a->S > a->R ? a->S : a->R) + 1) * C, DT_F32, m->dev));
    DT__TRY(dt__moe_combine_bwd(m, a, dy));
    t = N * k;
    DT__TRY(dt_tensor_view(ctx, &dgv, &m->dgt, 0, 1, &t));
    if (m->l->tp > 1) DT__TRY(dt_comm_allreduce(m->l->tp_comm, &dgv, DT_REDUCE_SUM));
    /* to the experts, their backward, and back */
    DT__TRY(dt__moe_exchange(m, a, &m->bufs[1], &m->bufs[0], 1));
    DT__TRY(dt__moe_regroup(m, a, &m->bufs[0], &m->bufs[1], 1)); /* dO expert-major */
    t1 = dt_comm_now();
    m->secs[3] += t1 - t0; /* the combine's mirror: the outputs' grads back to the experts */
#ifdef DT_CUDA
    if (dt__moe_on_cuda(m)) DT__TRY(dt__moe_experts_bwd_cuda(m, a, d_fc_w, d_fc_b, d_proj_w, d_proj_b, fc_w, proj_w));
    else
#endif
    for (e = 0; e < m->El; e++) {
        int64_t r0 = a->eoff[e], n = a->eoff[e + 1] - r0;
        dt_tensor dO, dX;
        if (!n) continue;
        DT__TRY(dt__moe_rows(ctx, &dO, &m->bufs[0], r0, n, C));
        DT__TRY(dt__moe_rows(ctx, &dX, &m->bufs[1], r0, n, C)); /* the received rows are read: reuse */
        DT__TRY(dt__moe_expert_bwd(m, a, e, &dX, &dO, d_fc_w, d_fc_b, d_proj_w, d_proj_b, fc_w, proj_w));
    }
    t0 = dt_comm_now();
    m->secs[2] += t0 - t1;
    DT__TRY(dt__moe_regroup(m, a, &m->bufs[0], &m->bufs[1], 0));
    DT__TRY(dt__moe_exchange(m, a, &m->bufs[1], &m->bufs[0], 0));
    DT__TRY(dt__moe_dispatch_bwd(m, a, dx, &m->bufs[1]));
    t1 = dt_comm_now();
    m->secs[1] += t1 - t0; /* the dispatch's mirror: the inputs' grads back to the tokens */
    DT__TRY(dt__moe_router_bwd(m, a, dx, d_router, x, router, (const float *)m->dgt.data, loss_scale));
    m->secs[0] += dt_comm_now() - t1;
    return DT_OK;
}

DT_API dt_status dt_moe_step_end(dt_moe *m, dt_moe_stats *stats) {
    int E, e;
    double mean = 0, mx = 0;
    if (stats) memset(stats, 0, sizeof *stats);
    if (!m) return DT_ERR_ARG;
    E = m->E;
    DT__TRY(dt__moe_sync(m));
    for (e = 0; e < E; e++) {
        m->load[e] = (int64_t)m->acc[e];
        m->kept[e] = (int64_t)m->acc[2 * E + 3 + e];
        mean += m->acc[e] / E;
        mx = m->acc[e] > mx ? m->acc[e] : mx;
    }
    if (m->d.balance == DT_MOE_BIAS) /* DeepSeek-V3: raise the underloaded, lower the overloaded */
        for (e = 0; e < E; e++)
            m->bias[e] += (float)(m->d.bias_rate * (m->acc[e] < mean ? 1 : m->acc[e] > mean ? -1 : 0));
    if (stats) {
        stats->aux = m->aux;
        stats->assigned = (int64_t)(m->acc[2 * E + 2] * m->k);
        stats->dropped = (int64_t)m->acc[2 * E];
        stats->drop_print = (uint64_t)m->acc[2 * E + 1];
        stats->load_max = mx;
        stats->load_mean = mean;
        stats->load = m->load;
        stats->kept = m->kept;
        stats->router_s = m->secs[0];
        stats->dispatch_s = m->secs[1];
        stats->experts_s = m->secs[2];
        stats->combine_s = m->secs[3];
    }
    memset(m->secs, 0, sizeof m->secs);
    memset(m->acc, 0, (size_t)(3 * E + 3) * sizeof(double));
    m->n_fwd = 0;
    m->synced = 0;
    return DT_OK;
}

/* ==== >>pp: pipeline schedules ================================================================ */

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

DT_API int dt_pp_schedule_bound(dt_pp_kind kind, int stages, int micro, int chunks, int stage) {
    dt_pp_schedule s;
    if (kind <= DT_PP_DEFAULT || kind >= DT_PP_KIND_COUNT || stages < 1 || micro < 1 || chunks < 1 || stage < 0 ||
        stage >= stages)
        return -1;
    memset(&s, 0, sizeof s);
    s.kind = kind, s.stages = stages, s.micro = micro, s.chunks = chunks;
    return dt__pp_bound(&s, stage);
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

/* Stages, micro-batches and chunks within the DT_PP_MAX_* limits (the header says why); pre names
   where they come from ("desc->" or "s->"), note what a 0 means there. */
static dt_status dt__pp_check_sizes(dt_ctx *ctx, const char *fn, const char *pre, const char *note, int p, int m,
                                    int v) {
    static const char *const names[3] = {"stages", "micro", "chunks"};
    static const char *const limits[3] = {"DT_PP_MAX_STAGES", "DT_PP_MAX_MICRO", "DT_PP_MAX_CHUNKS"};
    const int val[3] = {p, m, v}, max[3] = {DT_PP_MAX_STAGES, DT_PP_MAX_MICRO, DT_PP_MAX_CHUNKS};
    int64_t passes = 0;
    int i;
    for (i = 0; i < 3; i++)
        if (val[i] < 1 || val[i] > max[i])
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s%s = %d, expected 1 .. %s = %d%s", fn, pre, names[i], val[i],
                                    limits[i], max[i], note);
    if (!dt_mul_ok(p, v, &passes) || !dt_mul_ok(passes, m, &passes) || passes > DT_PP_MAX_PASSES)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %sstages x %schunks x %smicro = %d x %d x %d = %lld passes, expected "
                                "at most DT_PP_MAX_PASSES = %d", fn, pre, pre, pre, p, v, m, (long long)passes,
                                DT_PP_MAX_PASSES);
    return DT_OK;
}

static dt_status dt__pp_check_desc(dt_ctx *ctx, const dt_pp_desc *d, int *p, int *m, int *v) {
    static const char fn[] = "dt_pp_schedule_create";
    dt_status err;
    if ((int)d->kind < 0 || d->kind >= DT_PP_KIND_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc->kind = %d, expected DT_PP_DEFAULT .. DT_PP_ZB_H1 (0 .. %d)",
                                fn, (int)d->kind, DT_PP_KIND_COUNT - 1);
    *p = d->stages ? d->stages : 1;
    *m = d->micro ? d->micro : 1;
    *v = d->chunks ? d->chunks : 1;
    err = dt__pp_check_sizes(ctx, fn, "desc->", " (0 = 1)", *p, *m, *v);
    if (err) return err;
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
    s = (dt_pp_schedule *)dt_alloc_zeroed(ctx, sizeof *s);
    if (!s) return DT_ERR_OOM;
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
    const double *sf, *sb;               /* per stage, whole stage (desc's stage_f, stage_b), or NULL */
    /* per (virtual stage k, micro i) at k * m + i; -1 = not yet */
    double *f_end, *bi_end, *w_end;      /* F; B or BI (input grad); B or BW (weight grad) */
    double *act_post, *act_arr;          /* the receive of k's input activation: posted, arrived */
    double *grad_post, *grad_arr;        /* the receive of k's output gradient */
    unsigned char *bkind;                /* 0 none yet, 1 a full B, 2 a BI */
    double *clock;                       /* per stage */
    int *pc, *inflight;
    int *why;                            /* per stage: what it waits for (DT__PP_WAIT_*) and on whom; words
                                            only for a deadlock's message (a search simulates thousands) */
} dt__pp_sim;

enum { DT__PP_WAIT_NONE, DT__PP_WAIT_ACT, DT__PP_WAIT_GRAD, DT__PP_WAIT_POST_ACT, DT__PP_WAIT_POST_GRAD };

static void dt__pp_why_str(char *buf, size_t n, const int *why) {
    static const char *const w[] = {"", "waits for the activation from stage %d", "waits for the gradient from stage %d",
                                    "waits for stage %d to post RECV_ACT", "waits for stage %d to post RECV_GRAD"};
    snprintf(buf, n, w[why[0] >= 0 && why[0] <= DT__PP_WAIT_POST_GRAD ? why[0] : 0], why[1]);
}

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
    int *why = S->why + 2 * st;
    char d[DT__PP_WHY];
    switch (a->op) {
    case DT_PP_F:
        if (S->f_end[x] >= 0) return dt__pp_bad(S, st, "count", "a second F of this chunk and micro-batch");
        if (k > 0 && p == 1) {
            if (S->f_end[x - m] < 0) return dt__pp_bad(S, st, "order", "before the F of the chunk before it");
            ready = S->f_end[x - m];
        } else if (k > 0) {
            if (S->act_post[x] < 0) return dt__pp_bad(S, st, "order", "its input activation was never received (no RECV_ACT before it)");
            if (S->act_arr[x] < 0) {
                why[0] = DT__PP_WAIT_ACT, why[1] = (st + p - 1) % p;
                return -1;
            }
            ready = S->act_arr[x];
        }
        cost = S->sf ? S->sf[st] / S->v : S->f;
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
                why[0] = DT__PP_WAIT_GRAD, why[1] = (st + 1) % p;
                return -1;
            }
            ready = S->grad_arr[x];
        }
        cost = a->op == DT_PP_B ? S->b : S->bi;
        if (S->sb) cost *= S->sb[st] / S->v / S->b;
        break;
    case DT_PP_BW:
        if (S->bkind[x] == 1) return dt__pp_bad(S, st, "count", "a BW after a full B (its weight gradient is done)");
        if (S->bkind[x] == 0) return dt__pp_bad(S, st, "order", "a BW before its BI");
        if (S->w_end[x] >= 0) return dt__pp_bad(S, st, "count", "a second BW of this chunk and micro-batch");
        cost = S->bw;
        if (S->sb) cost *= S->sb[st] / S->v / S->b;
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
            why[0] = act ? DT__PP_WAIT_POST_ACT : DT__PP_WAIT_POST_GRAD, why[1] = a->peer;
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

/* One action's fields against stage st of s: what its op, micro, chunk and peer must be before
   anything indexes with them (messages only between the neighbours the virtual stages imply). */
static dt_status dt__pp_check_action(dt_ctx *ctx, const char *fn, const dt_pp_schedule *s, int st, int j) {
    const dt_pp_action *a = &s->actions[st][j];
    char an[64], bad[160];
    int want, to;
    bad[0] = '\0';
    if ((int)a->op <= DT_PP_NOP || a->op >= DT_PP_OP_COUNT)
        snprintf(bad, sizeof bad, "op = %d, expected one of F .. RECV_GRAD (%d .. %d)", (int)a->op, DT_PP_F,
                 DT_PP_OP_COUNT - 1);
    else if (a->micro < 0 || a->micro >= s->micro)
        snprintf(bad, sizeof bad, "micro = %d, expected 0 .. %d (s->micro - 1)", a->micro, s->micro - 1);
    else if (a->chunk < 0 || a->chunk >= s->chunks)
        snprintf(bad, sizeof bad, "chunk = %d, expected 0 .. %d (s->chunks - 1)", a->chunk, s->chunks - 1);
    else if (a->op <= DT_PP_BW && a->peer != -1)
        snprintf(bad, sizeof bad, "peer = %d, expected -1 (a compute has no peer)", a->peer);
    else if (a->op > DT_PP_BW) {
        to = a->op == DT_PP_SEND_ACT || a->op == DT_PP_RECV_GRAD ? +1 : -1;
        want = s->stages > 1 ? dt__pp_neighbour(s->stages, s->chunks, st, a->chunk, to) : -1;
        if (s->stages == 1)
            snprintf(bad, sizeof bad, "a message in a one-stage pipeline, expected computes only (chunks hand over "
                     "in memory)");
        else if (want < 0)
            snprintf(bad, sizeof bad, "no virtual stage on that side of virtual stage %d (of %d), expected no such "
                     "message", a->chunk * s->stages + st, s->stages * s->chunks);
        else if (a->peer != want)
            snprintf(bad, sizeof bad, "peer = %d, expected %d (the stage of the neighbouring virtual stage)", a->peer,
                     want);
    }
    if (!bad[0]) return DT_OK;
    dt__pp_str(an, sizeof an, a);
    return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: fields: stage %d, action %d (%s): %s", fn, st, j, an, bad);
}

/* A schedule, as the simulator and the runtime both take it (it may have been edited in place):
   its sizes within the limits, its arrays there, and every action of every stage in range, all
   checked before any of it is used as an index. Every rank checks every stage, so an edited list
   is refused identically everywhere, before anything is sent. */
static dt_status dt__pp_check_schedule(dt_ctx *ctx, const char *fn, const dt_pp_schedule *s) {
    int st, j;
    dt_status err;
    if (!s->count || !s->actions || !s->bound)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: s is not a schedule from dt_pp_schedule_create (s->count, "
                                "s->actions or s->bound is NULL)", fn);
    err = dt__pp_check_sizes(ctx, fn, "s->", "", s->stages, s->micro, s->chunks);
    if (err) return err;
    for (st = 0; st < s->stages; st++) {
        if (s->count[st] < 0 || (s->count[st] > 0 && !s->actions[st]))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: fields: stage %d has s->count[%d] = %d and s->actions[%d] = "
                                    "%p, expected a count >= 0 and its actions", fn, st, st, s->count[st], st,
                                    (void *)s->actions[st]);
        for (j = 0; j < s->count[st]; j++) {
            err = dt__pp_check_action(ctx, fn, s, st, j);
            if (err) return err;
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
    if (!s || !s->ctx) return DT_ERR_ARG;
    ctx = s->ctx;
    if (out) memset(out, 0, sizeof *out);
    if (!s->start || !s->busy || !s->peak || !s->stage_bubble)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_pp_schedule_simulate: s is not a schedule from "
                                "dt_pp_schedule_create (s->start, s->busy, s->peak or s->stage_bubble is NULL)");
    err = dt__pp_costs(ctx, desc, c);
    if (err) return err;
    err = dt__pp_check_schedule(ctx, "dt_pp_schedule_simulate", s);
    if (err) return err;
    memset(&S, 0, sizeof S);
    S.s = s;
    S.p = p = s->stages;
    S.m = s->micro;
    S.v = s->chunks;
    S.V = p * s->chunks;
    /* a chunk holds 1/v of a stage's layers */
    S.f = c[0] / S.v, S.b = c[1] / S.v, S.bi = c[2] / S.v, S.bw = c[3] / S.v, S.comm = c[4];
    if (desc && (desc->stage_f || desc->stage_b)) {
        if (!desc->stage_f || !desc->stage_b)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_pp_schedule_simulate: desc->stage_f = %p, stage_b = %p: expected "
                                    "both or neither", (const void *)desc->stage_f, (const void *)desc->stage_b);
        for (st = 0; st < p; st++)
            if (!(desc->stage_f[st] >= 0.0 && desc->stage_f[st] <= 1e300 && desc->stage_b[st] >= 0.0 &&
                  desc->stage_b[st] <= 1e300))
                return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_pp_schedule_simulate: desc->stage_f[%d] = %g, stage_b[%d] = "
                                        "%g, expected finite costs >= 0", st, desc->stage_f[st], st, desc->stage_b[st]);
        S.sf = desc->stage_f, S.sb = desc->stage_b;
    }
    n = (size_t)S.V * (size_t)S.m;
    block = (double *)dt_alloc(ctx, sizeof(double) * (7 * n + (size_t)p) + sizeof(int) * 4 * (size_t)p + n);
    if (!block) return dt_ctx_set_error(ctx, DT_ERR_OOM, "dt_pp_schedule_simulate: out of memory for %zu pairs", n);
    S.f_end = block, S.bi_end = block + n, S.w_end = block + 2 * n;
    S.act_post = block + 3 * n, S.act_arr = block + 4 * n, S.grad_post = block + 5 * n, S.grad_arr = block + 6 * n;
    S.clock = block + 7 * n;
    for (i = 0; i < 7 * n; i++) block[i] = -1.0;
    S.pc = (int *)(S.clock + p);
    S.inflight = S.pc + p;
    S.why = S.inflight + p;
    S.bkind = (unsigned char *)(S.why + 2 * p);
    memset(S.bkind, 0, n);
    for (st = 0; st < p; st++) {
        S.clock[st] = 0.0, S.pc[st] = 0, S.inflight[st] = 0;
        s->busy[st] = 0.0, s->peak[st] = 0, s->stage_bubble[st] = 0.0;
        S.why[2 * st] = DT__PP_WAIT_NONE, S.why[2 * st + 1] = 0;
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
            char msg[DT_ERROR_MAX], an[64], wy[DT__PP_WHY];
            size_t len = 0;
            len += (size_t)snprintf(msg, sizeof msg, "deadlock: no stage can go on;");
            for (st = 0; st < p && len < sizeof msg; st++) {
                if (S.pc[st] >= s->count[st]) continue;
                dt__pp_str(an, sizeof an, &s->actions[st][S.pc[st]]);
                dt__pp_why_str(wy, sizeof wy, S.why + 2 * st);
                len += (size_t)snprintf(msg + len, sizeof msg - len, " stage %d at %d %s %s;", st, S.pc[st], an, wy);
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
    double c[5], q = 0.0, cost, width_slots;
    char label[32];
    int st, j, width = 2, w, len;
    int64_t slots, at, slot;
    dt_status err;
    if (!s || !s->ctx) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(s->ctx, DT_ERR_ARG, "dt_pp_schedule_format: out is NULL");
    if (desc && (desc->stage_f || desc->stage_b)) /* its columns are one slot wide for every stage */
        return dt_ctx_set_error(s->ctx, DT_ERR_ARG, "dt_pp_schedule_format: desc->stage_f / stage_b given, expected "
                                "NULL: the table draws stages of equal cost (dt_pp_schedule_simulate takes them)");
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
    /* the width in range (NaN and inf fail too) before it becomes an integer; every start and
       cost below is at most the makespan, so their casts stay in range with it. A table is drawn
       for a person: 1e7 cells is already tens of MB of text. */
    width_slots = stats.makespan / q;
    if (!(width_slots < 1e6) || !(width_slots * s->stages < 1e7))
        return dt_ctx_set_error(s->ctx, DT_ERR_ARG, "dt_pp_schedule_format: the table would be %g slots wide "
                                "(makespan %g / cheapest op %g) x %d stages, expected at most 1e6 slots and 1e7 "
                                "cells", width_slots, stats.makespan, q, s->stages);
    slots = (int64_t)(width_slots + 0.5);
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

/* ==== >>trace: timeline ==========================================================================

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
    if (out) *out = NULL;
    if (!world) return DT_ERR_ARG;
    ctx = dt_comm_ctx(world);
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_trace_create: out is NULL");
    st = dt_comm_barrier(world); /* the ranks start together: the picture starts at one moment */
    if (st) return st;
    t = (dt_trace *)dt_alloc_zeroed(ctx, sizeof *t);
    if (!t) return DT_ERR_OOM;
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
    DT__TRY(dt_tensor_create(t->ctx, &v, &td));
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
    DT__TRY(dt_tensor_create(t->ctx, out, &td));
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

/* ==== >>pprun: pipeline runtime ==================================================================

   After the timeline's implementation (not right after the schedules'): the run reads this
   run's compute spans out of struct dt_trace, which is only defined there.

   State of a run: per (chunk, micro) the received activation (in) and gradient (dout), each a
   pool buffer plus the request that fills it; a list of sends in flight; the pool itself (one
   entry per buffer ever made, reused when a buffer of the same numel and dtype is free).

   The pool and the run's host arrays live in the layout (l->pp_keep) from one run to the next:
   a step after the first makes no device allocation or free (a CUDA step stays on the device)
   and no host one; they grow only when a run needs more (a new shape, a longer list) and go
   with dt_layout_free. A buffer made by a run is zero-filled; a reused one holds whatever its
   last user left, which nothing reads: a received or forward output buffer is written whole
   before it is read, and din is zeroed before every backward (gradients accumulate). */

typedef struct dt__pp_buf {
    dt_tensor t;
    int used;
} dt__pp_buf;

typedef struct dt__pp_slot {
    int buf;             /* pool index, -1 = none */
    dt_comm_req *req;    /* the irecv filling it, NULL once waited (or for an in-memory handover) */
} dt__pp_slot;

typedef struct dt__pp_send {
    int buf;
    dt_comm_req *req;
} dt__pp_send;

typedef struct dt__pp_rt {
    dt_layout *l;
    dt_ctx *ctx;
    const dt_pp_schedule *s;
    const dt_pp_model *m;
    dt_trace *trace;
    int p, v, M, V, st;
    dt_tensor_desc *acts;   /* V - 1 boundaries, resolved (dtype, device, ndim) */
    dt__pp_buf **pool;      /* one allocation each: a callback may keep a pointer to a buffer's
                               dt_tensor while the pool grows */
    int64_t n_pool, cap_pool;
    dt__pp_slot *in, *dout; /* [chunk * M + micro] */
    dt__pp_send *sends;
    int n_sends;
    int *last_bwd;          /* per chunk: index of its last backward pass in the list */
    size_t held, base_ctx;
    dt_pp_run_stats *out;
    dt_comm *(*link)[2];    /* NULL: every message over l->pp_comm; else [act 0 / grad 1][out 0 / in 1] */
    int *order[2];          /* with links: per kind, the (chunk * M + micro) slots of this stage's
                               receives in the sender's order, n_order[g] of them; the receives up
                               to posted[g] are posted */
    int n_order[2], posted[2];
} dt__pp_rt;

/* What l->pp_keep holds between runs: the pool and the capacities of the host arrays. */
typedef struct dt__pp_keep {
    dt__pp_buf **pool;
    int64_t n_pool, cap_pool;
    dt_comm *link[2][2];    /* device activations through NCCL (dt__pp_links): this stage's groups of
                               two, [act 0 / grad 1][out 0: it sends / in 1: it receives] */
    char *made;             /* [kind * p + sender]: that directed link exists (the same on every stage) */
    int64_t cap_made;
    int *order[2];          /* dt__pp_rt's, kept for their capacity */
    int64_t cap_order[2];
    dt__pp_slot *slots;     /* in and dout, 2 x chunks x micro */
    dt__pp_send *sends;
    int *last_bwd;
    dt_tensor_desc *acts;
    int64_t cap_slots, cap_sends, cap_last_bwd, cap_acts;
} dt__pp_keep;

static void dt__pp_keep_free(dt_ctx *ctx, dt__pp_keep *k) {
    int64_t j;
    if (!k) return;
    for (j = 0; j < k->n_pool; j++) {
        dt_tensor_free(ctx, &k->pool[j]->t);
        dt_release(ctx, k->pool[j]);
    }
    dt_release(ctx, k->pool);
    dt_release(ctx, k->slots);
    dt_release(ctx, k->sends);
    dt_release(ctx, k->last_bwd);
    dt_release(ctx, k->acts);
    dt_release(ctx, k->made);
    dt_release(ctx, k->order[0]);
    dt_release(ctx, k->order[1]);
    dt_comm_free(k->link[0][0]);
    dt_comm_free(k->link[0][1]);
    dt_comm_free(k->link[1][0]);
    dt_comm_free(k->link[1][1]);
    dt_release(ctx, k);
}

static dt_status dt__pp_wait(dt__pp_rt *r, dt_comm_req **req);
static void dt__pp_buf_put(dt__pp_rt *r, int *idx);

static dt_status dt__pp_buf_get(dt__pp_rt *r, int k, int zero, int *idx) {
    const dt_tensor_desc *d = &r->acts[k];
    int64_t numel = dt_shape_numel(d->ndim, d->shape), i;
    int j;
    dt__pp_buf *b = NULL;
    for (i = 0; i < r->n_pool; i++) {
        b = r->pool[i];
        if (!b->used && b->t.numel == numel && b->t.dtype == d->dtype && b->t.device == d->device) break;
    }
    for (j = 0; i == r->n_pool && r->link && j < r->n_sends; j++) {
        /* over links a send's wait is stream-ordered (the compute stream waits for it, the host does
           not): take a buffer still being sent rather than allocate, so the pool does not grow with
           the timing of later steps */
        dt__pp_buf *sb = r->pool[r->sends[j].buf];
        if (sb->t.numel != numel || sb->t.dtype != d->dtype || sb->t.device != d->device) continue;
        i = r->sends[j].buf;
        DT__TRY(dt__pp_wait(r, &r->sends[j].req));
        dt__pp_buf_put(r, &r->sends[j].buf);
        r->sends[j] = r->sends[--r->n_sends];
        b = r->pool[i];
    }
    if (i == r->n_pool) {
        dt_status st;
        DT__TRY(dt_grow(r->ctx, (void **)&r->pool, &r->cap_pool, r->n_pool + 1, sizeof(dt__pp_buf *), "dt_pp_run"));
        b = (dt__pp_buf *)dt_alloc_zeroed(r->ctx, sizeof *b);
        if (!b) return DT_ERR_OOM;
        st = dt_tensor_create(r->ctx, &b->t, d); /* zero-filled */
        if (st) {
            dt_release(r->ctx, b);
            return st;
        }
        r->pool[r->n_pool++] = b;
    } else {
        int j;
        b->t.ndim = d->ndim; /* the same elements under this boundary's shape */
        for (j = 0; j < DT_MAX_DIMS; j++) b->t.shape[j] = j < d->ndim ? d->shape[j] : 0;
        if (zero) DT__TRY(dt_tensor_fill(r->ctx, &b->t, 0.0));
    }
    b->used = 1;
    r->held += dt_tensor_bytes(&b->t);
    if (r->held > r->out->peak_buffer_bytes) r->out->peak_buffer_bytes = r->held;
    *idx = (int)i;
    return DT_OK;
}

static void dt__pp_buf_put(dt__pp_rt *r, int *idx) {
    if (*idx < 0) return;
    r->pool[*idx]->used = 0;
    r->held -= dt_tensor_bytes(&r->pool[*idx]->t);
    *idx = -1;
}

/* Messages are tagged by (activation or gradient, the sending virtual stage, micro) while that
   fits dt_comm's 15-bit tags; beyond, by stream only (a stream's messages are sent and received
   in the same order, and MPI does not overtake within a tag). */
static int dt__pp_tag(const dt__pp_rt *r, int grad, int k_from, int micro) {
    int stream = grad * r->V + k_from;
    return (int64_t)2 * r->V * r->M <= 32768 ? stream * r->M + micro : stream % 32768;
}

static dt_status dt__pp_wait(dt__pp_rt *r, dt_comm_req **req) {
    double t0;
    dt_status st;
    if (!*req) return DT_OK;
    t0 = dt_comm_now();
    st = dt_comm_wait(*req);
    *req = NULL;
    r->out->wait_seconds += dt_comm_now() - t0;
    return st;
}

/* Gives back the buffers of the sends that are done (every send ends with one wait). */
static dt_status dt__pp_reap(dt__pp_rt *r, int all) {
    int i, w = 0;
    dt_status st = DT_OK;
    for (i = 0; i < r->n_sends; i++) {
        dt__pp_send *x = &r->sends[i];
        int done = all;
        if (!st && !all) st = dt_comm_test(x->req, &done);
        if (!st && done) {
            st = dt__pp_wait(r, &x->req);
            dt__pp_buf_put(r, &x->buf);
            continue;
        }
        r->sends[w++] = *x;
    }
    r->n_sends = w;
    return st;
}

static void dt__pp_note_ctx(dt__pp_rt *r) {
    size_t now = r->ctx->bytes_in_use;
    if (now > r->base_ctx && now - r->base_ctx > r->out->peak_ctx_bytes) r->out->peak_ctx_bytes = now - r->base_ctx;
}

/* Runs one compute action of the list. */
static dt_status dt__pp_compute(dt__pp_rt *r, const dt_pp_action *a, int *produced, int *in_flight) {
    int c = a->chunk, i = a->micro, k = c * r->p + r->st, first = k == 0, last = k == r->V - 1;
    dt__pp_slot *in = &r->in[c * r->M + i], *dout = &r->dout[c * r->M + i];
    dt_pp_part part = a->op == DT_PP_BI ? DT_PP_PART_INPUT : a->op == DT_PP_BW ? DT_PP_PART_WEIGHT : DT_PP_PART_FULL;
    dt_status st;
    double t0;
    *produced = -1;
    if (a->op == DT_PP_F) {
        if (!first) {
            if (in->buf < 0) return DT_ERR_STATE; /* the simulator's order check rules this out */
            DT__TRY(dt__pp_wait(r, &in->req));
        }
        if (!last) DT__TRY(dt__pp_buf_get(r, k, 0, produced));
        dt_trace_begin(r->trace, dt_pp_op_name(a->op));
        t0 = dt_comm_now();
        st = r->m->forward(r->m->user, c, i, last ? NULL : &r->pool[*produced]->t, first ? NULL : &r->pool[in->buf]->t);
        r->out->compute_seconds += dt_comm_now() - t0;
        dt_trace_end(r->trace);
        if (st) return st;
        if (++*in_flight > r->out->peak) r->out->peak = *in_flight;
        return DT_OK;
    }
    if (!last) { /* BW reads the gradient BI waited for; in an edited list it may be missing */
        if (dout->buf < 0) return DT_ERR_STATE;
        DT__TRY(dt__pp_wait(r, &dout->req));
    }
    if (!first && part != DT_PP_PART_WEIGHT) DT__TRY(dt__pp_buf_get(r, k - 1, 1, produced));
    dt_trace_begin(r->trace, dt_pp_op_name(a->op));
    t0 = dt_comm_now();
    st = r->m->backward(r->m->user, c, i, *produced >= 0 ? &r->pool[*produced]->t : NULL,
                        last ? NULL : &r->pool[dout->buf]->t, part);
    r->out->compute_seconds += dt_comm_now() - t0;
    dt_trace_end(r->trace);
    if (st) return st;
    if (part != DT_PP_PART_INPUT) { /* the micro-batch's last pass on this chunk: its buffers go back */
        dt__pp_buf_put(r, &in->buf);
        dt__pp_buf_put(r, &dout->buf);
        --*in_flight;
    }
    return DT_OK;
}

/* Hands a produced buffer to its consumer: the next chunk in memory (p = 1), or a send. */
static dt_status dt__pp_handover(dt__pp_rt *r, const dt_pp_action *a, int *produced) {
    int c = a->chunk, i = a->micro, grad = a->op != DT_PP_F && a->op != DT_PP_SEND_ACT;
    dt__pp_slot *to;
    if (*produced < 0) return DT_OK;
    if (r->p == 1) {
        to = grad ? &r->dout[(c - 1) * r->M + i] : &r->in[(c + 1) * r->M + i];
        to->buf = *produced;
        to->req = NULL;
        *produced = -1;
    }
    return DT_OK;
}

static dt_status dt__pp_post_send(dt__pp_rt *r, const dt_pp_action *a, int *produced) {
    int k = a->chunk * r->p + r->st, grad = a->op == DT_PP_SEND_GRAD;
    dt__pp_send *x;
    if (*produced < 0) return DT_ERR_STATE; /* a send without the compute before it: ruled out by the simulator */
    x = &r->sends[r->n_sends];
    x->buf = *produced;
    *produced = -1;
    DT__TRY(dt_comm_isend(r->link ? r->link[grad][0] : r->l->pp_comm, &r->pool[x->buf]->t, r->link ? 1 : a->peer,
                          dt__pp_tag(r, grad, k, a->micro), &x->req));
    r->n_sends++;
    r->out->messages++;
    r->out->bytes_sent += (double)dt_tensor_bytes(&r->pool[x->buf]->t);
    return DT_OK;
}

static dt_status dt__pp_post_one(dt__pp_rt *r, int grad, int c, int i, int peer) {
    int k = c * r->p + r->st;
    dt__pp_slot *x = grad ? &r->dout[c * r->M + i] : &r->in[c * r->M + i];
    if (x->buf >= 0) return DT_ERR_STATE;
    DT__TRY(dt__pp_buf_get(r, grad ? k : k - 1, 0, &x->buf));
    r->out->messages++;
    return dt_comm_irecv(r->link ? r->link[grad][1] : r->l->pp_comm, &r->pool[x->buf]->t, r->link ? 0 : peer,
                         dt__pp_tag(r, grad, grad ? k + 1 : k - 1, i), &x->req);
}

/* A receive of the list. Over links (NCCL matches in call order) the receives go out in the
   sender's order: this one, and first those the sender sends before it that the list places
   later (interleaved 1F1B's last chunk: stage p - 1 sends chunk 1's gradients before the list of
   stage 0 receives them); a receive posted early is skipped where the list places it. */
static dt_status dt__pp_post_recv(dt__pp_rt *r, const dt_pp_action *a) {
    int grad = a->op == DT_PP_RECV_GRAD, want = a->chunk * r->M + a->micro, j;
    if (!r->link) return dt__pp_post_one(r, grad, a->chunk, a->micro, a->peer);
    for (j = 0; j < r->posted[grad]; j++)
        if (r->order[grad][j] == want) return DT_OK; /* posted early */
    for (j = r->posted[grad]; j < r->n_order[grad] && r->order[grad][j] != want; j++) {}
    if (j == r->n_order[grad]) return DT_ERR_STATE; /* the sender never sends it: dt__pp_links ruled this out */
    for (; r->posted[grad] <= j; r->posted[grad]++) {
        int slot = r->order[grad][r->posted[grad]];
        DT__TRY(dt__pp_post_one(r, grad, slot / r->M, slot % r->M, a->peer));
    }
    return DT_OK;
}

static dt_status dt__pp_check(dt_layout *l, const dt_pp_schedule *s, const dt_pp_model *m) {
    static const char fn[] = "dt_pp_run";
    dt_ctx *ctx = l->ctx;
    if (!s) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: s (the schedule) is NULL", fn);
    if (!m) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: m (the model) is NULL", fn);
    if (!m->forward || !m->backward)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: m->%s is NULL, expected the model's callback", fn,
                                m->forward ? "backward" : "forward");
    if (s->stages != l->pp)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: the schedule has %d stages but the layout's pp is %d: expected "
                                "one stage per pp rank", fn, s->stages, l->pp);
    if (s->ctx != ctx)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: the schedule was made with another ctx than the layout's", fn);
    return dt__pp_check_schedule(ctx, fn, s);
}

/* The activation every virtual stage sends the next, resolved into acts (V - 1 of them). */
static dt_status dt__pp_check_acts(dt_layout *l, const dt_pp_schedule *s, const dt_pp_model *m, dt_tensor_desc *acts) {
    static const char fn[] = "dt_pp_run";
    dt_ctx *ctx = l->ctx;
    int k, j, V;
    V = s->stages * s->chunks;
    for (k = 0; k + 1 < V; k++) {
        dt_tensor_desc d = m->acts ? m->acts[k] : m->act;
        int64_t n;
        if (d.dtype == DT_DTYPE_DEFAULT) d.dtype = DT_F32;
        if (d.device == DT_DEVICE_DEFAULT) d.device = ctx->device == DT_DEVICE_DEFAULT ? DT_CPU : ctx->device;
        if ((int)d.dtype < 0 || d.dtype >= DT_DTYPE_COUNT || (int)d.device < 0 || d.device >= DT_DEVICE_COUNT ||
            d.ndim < 0 || d.ndim > DT_MAX_DIMS)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: m->%s%s dtype %d, device %d, ndim %d: expected a dt_dtype, a "
                                    "dt_device and ndim 0 .. %d", fn, m->acts ? "acts[" : "act", m->acts ? "]" : "",
                                    (int)d.dtype, (int)d.device, d.ndim, DT_MAX_DIMS);
        if (d.ndim == 0)
            while (d.ndim < DT_MAX_DIMS && d.shape[d.ndim] != 0) d.ndim++;
        n = dt_shape_numel(d.ndim, d.shape);
        if (n < 0)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: the activation virtual stage %d sends (m->%s) has shape "
                                    "[%lld, %lld, ...] (%d dims): expected dims >= 0 whose product fits int64", fn, k,
                                    m->acts ? "acts[k]" : "act", (long long)d.shape[0], (long long)d.shape[1], d.ndim);
        for (j = d.ndim; j < DT_MAX_DIMS; j++) d.shape[j] = 0;
        acts[k] = d;
    }
    return DT_OK;
}

/* The union of the compute spans recorded since event `from`: busy time, first start, last end. */
static void dt__pp_trace_busy(const dt_trace *t, int64_t from, dt_pp_run_stats *o) {
    double a = 0, b = 0, busy = 0;
    int64_t i;
    int any = 0;
    /* the spans of one rank's compute track start in order (nested ones inside their parent),
       so one sweep merges them */
    for (i = from; i < t->n; i++) {
        const dt__pl_event *e = &t->ev[i];
        if (e->tid != 0 || e->t1 < e->t0) continue;
        if (!any) {
            o->first = e->t0;
            a = e->t0, b = e->t1, any = 1;
        } else if (e->t0 <= b) {
            if (e->t1 > b) b = e->t1;
        } else {
            busy += b - a;
            a = e->t0, b = e->t1;
        }
        if (e->t1 > o->last) o->last = e->t1;
    }
    if (any) busy += b - a;
    o->busy = busy;
}

static dt_status dt__pp_execute(dt__pp_rt *r) {
    const dt_pp_action *list = r->s->actions[r->st];
    int n = r->s->count[r->st], j, produced = -1, in_flight = 0, hook = -1;
    dt_status st = DT_OK;
    for (j = 0; j < n && !st; j++) {
        const dt_pp_action *a = &list[j];
        dt_ctx_clear_error(r->ctx); /* so a bare status below is not blamed on an old message */
        switch (a->op) {
        case DT_PP_F: case DT_PP_B: case DT_PP_BI: case DT_PP_BW:
            if (hook >= 0 && r->m->grads_done) st = r->m->grads_done(r->m->user, hook);
            hook = -1;
            if (st) break;
            if (produced >= 0) dt__pp_buf_put(r, &produced); /* a last virtual stage's (never happens) */
            st = dt__pp_compute(r, a, &produced, &in_flight);
            if (!st) st = dt__pp_handover(r, a, &produced);
            if (!st && j == r->last_bwd[a->chunk]) hook = a->chunk;
            if (!st) st = dt__pp_reap(r, 0);
            break;
        case DT_PP_SEND_ACT: case DT_PP_SEND_GRAD: st = dt__pp_post_send(r, a, &produced); break;
        case DT_PP_RECV_ACT: case DT_PP_RECV_GRAD: st = dt__pp_post_recv(r, a); break;
        default: st = DT_ERR_STATE; break;
        }
        dt__pp_note_ctx(r);
        if (st) {
            char why[DT_ERROR_MAX];
            memcpy(why, r->ctx->last_error, sizeof why);
            why[sizeof why - 1] = '\0';
            if (st == DT_ERR_STATE && !why[0])
                snprintf(why, sizeof why, "the list is out of order (run dt_pp_schedule_simulate on it)");
            return dt_ctx_set_error(r->ctx, st, "dt_pp_run: stage %d, action %d (%s chunk %d micro %d): %.400s", r->st,
                                    j, dt_pp_op_name(a->op), a->chunk, a->micro, why);
        }
    }
    if (hook >= 0 && r->m->grads_done) st = r->m->grads_done(r->m->user, hook);
    if (!st) st = dt__pp_reap(r, 1);
    return st;
}

#ifdef DT_NCCL
/* Device activations through NCCL (see "On CUDA" at dt_pp_run). NCCL matches a group's sends and
   receives in call order, each call blocking its stream until its peer's matching call: over one
   group, the receives a stage posts ahead and 1F1B's crossing sends (stage s sends an activation
   while s + 1 sends a gradient) wait on each other. So each directed link (kind: activation or
   gradient; sender -> receiver) gets a group of its own, two ranks, one stream each side: a link's
   messages go one way, in the sender's order, and its receiver posts them in that order (recorded
   here into r->order, used by dt__pp_post_recv; the lists' peers and counts are checked here,
   identically on every stage, before anything is made). Made on the first run that uses a
   link (a dt_comm_split of l->pp_comm per link, then one device all-reduce of one float per link,
   in link order on every stage, which makes its NCCL communicator: no cycle of waits) and kept in
   the layout. */
static dt_status dt__pp_links(dt__pp_rt *r, dt__pp_keep *kp) {
    static const char fn[] = "dt_pp_run";
    static const char *const kind[2] = {"activation", "gradient"};
    const dt_pp_schedule *s = r->s;
    int p = r->p, me = r->st, g, snd;
    int64_t fresh = 0;
    dt_ctx *ctx = r->ctx;
    dt_status st = DT_OK;
    for (g = 0; g < 2; g++) { /* a stage receives at most chunks x micro of each kind */
        DT__TRY(dt_grow(ctx, (void **)&kp->order[g], &kp->cap_order[g], (int64_t)r->v * r->M, sizeof(int),
                        "dt_pp_run: links"));
        r->order[g] = kp->order[g], r->n_order[g] = r->posted[g] = 0;
    }
    if (!kp->made) { /* p is the layout's: the same every run */
        DT__TRY(dt_grow(ctx, (void **)&kp->made, &kp->cap_made, 2 * (int64_t)p, 1, "dt_pp_run: links"));
        memset(kp->made, 0, (size_t)kp->cap_made); /* dt_grow does not zero */
    }
    for (g = 0; g < 2; g++)
        for (snd = 0; snd < p; snd++) {
            dt_pp_op so = g ? DT_PP_SEND_GRAD : DT_PP_SEND_ACT, ro = g ? DT_PP_RECV_GRAD : DT_PP_RECV_ACT;
            int rcv = g ? (snd + p - 1) % p : (snd + 1) % p, ns = s->count[snd], nr = s->count[rcv], a = 0, b = 0;
            int n = 0;
            const dt_pp_action *sl = s->actions[snd], *rl = s->actions[rcv];
            for (;; a++, b++, n++) {
                int c, k;
                while (a < ns && sl[a].op != so) a++;
                while (b < nr && rl[b].op != ro) b++;
                if (a == ns && b == nr) break;
                if (a < ns && sl[a].peer != rcv)
                    return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: stage %d's action %d sends an %s to stage "
                                            "%d; on NCCL (device activations) a stage sends activations to stage + 1 "
                                            "and gradients to stage - 1 (mod %d) only", fn, snd, a, kind[g],
                                            sl[a].peer, p);
                if (b < nr && rl[b].peer != snd)
                    return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: stage %d's action %d receives an %s from "
                                            "stage %d; on NCCL (device activations) a stage receives activations from "
                                            "stage - 1 and gradients from stage + 1 (mod %d) only", fn, rcv, b,
                                            kind[g], rl[b].peer, p);
                if (a == ns || b == nr)
                    return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: stage %d sends stage %d %s %d %ss but "
                                            "it receives %s", fn, snd, rcv, a == ns ? "only" : "more than", n,
                                            kind[g], a == ns ? "more" : "fewer");
                k = sl[a].chunk * p + snd + (g ? -1 : 1); /* the virtual stage it goes to */
                c = k / p;
                if (k < 0 || k >= r->V || c >= r->v || sl[a].micro < 0 || sl[a].micro >= r->M)
                    return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: stage %d's action %d sends an %s from its chunk "
                                            "%d micro %d, which goes to no virtual stage", fn, snd, a, kind[g],
                                            sl[a].chunk, sl[a].micro);
                if (n >= r->v * r->M)
                    return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: stage %d sends stage %d more than %d %ss (chunks x "
                                            "micro-batches)", fn, snd, rcv, r->v * r->M, kind[g]);
                if (rcv == me) r->order[g][n] = c * r->M + sl[a].micro; /* the sender's order */
            }
            if (rcv == me) r->n_order[g] = n, r->posted[g] = 0;
            if (n && !kp->made[g * p + snd]) kp->made[g * p + snd] = 2; /* 2: to make now */
        }
    for (g = 0; g < 2 && !st; g++) /* every stage, in link order: dt_comm_split is collective */
        for (snd = 0; snd < p && !st; snd++) {
            int rcv = g ? (snd + p - 1) % p : (snd + 1) % p, in = me == snd || me == rcv;
            dt_comm *c = NULL;
            char name[48];
            if (kp->made[g * p + snd] != 2) continue;
            st = dt_comm_split(r->l->pp_comm, &c, in ? 0 : -1, me == snd ? 0 : 1);
            if (!st && c) {
                snprintf(name, sizeof name, "pp.%s.%d>%d", g ? "grad" : "act", snd, rcv);
                st = dt_comm_set_name(c, name);
                kp->link[g][me == snd ? 0 : 1] = c;
            }
            fresh++;
        }
    if (!st && fresh) { /* their NCCL communicators, in the same order */
        dt_tensor one;
        dt_tensor_desc d;
        memset(&d, 0, sizeof d);
        d.dtype = DT_F32, d.device = r->acts[0].device, d.ndim = 1, d.shape[0] = 1;
        st = dt_tensor_create(ctx, &one, &d);
        for (g = 0; g < 2 && !st; g++)
            for (snd = 0; snd < p && !st; snd++) {
                int rcv = g ? (snd + p - 1) % p : (snd + 1) % p;
                if (kp->made[g * p + snd] != 2) continue;
                kp->made[g * p + snd] = 1;
                if (me == snd || me == rcv) st = dt_comm_allreduce(kp->link[g][me == snd ? 0 : 1], &one, DT_REDUCE_SUM);
            }
        dt_tensor_free(ctx, &one);
    }
    r->link = kp->link;
    return st;
}
#endif

DT_API dt_status dt_pp_run(dt_layout *l, dt_pp_run_stats *out, const dt_pp_schedule *s, const dt_pp_model *m,
                           const dt_pp_run_desc *desc) {
    dt__pp_rt r;
    dt__pp_keep *kp;
    dt_pp_run_stats mine;
    dt_ctx *ctx;
    int64_t from = 0, k, cm = 0, n_send = 0, V;
    int j, pending = 0;
    size_t pool_bytes = 0;
    double t0 = dt_comm_now();
    dt_status st;
    if (!l) return DT_ERR_ARG;
    ctx = l->ctx;
    memset(&r, 0, sizeof r);
    memset(&mine, 0, sizeof mine);
    r.out = out ? out : &mine;
    memset(r.out, 0, sizeof *r.out);
    r.l = l, r.ctx = ctx, r.s = s, r.m = m, r.trace = desc ? desc->trace : NULL;
    r.st = l->pp_rank;
    r.out->stage = r.st;
    st = dt__pp_check(l, s, m);
    if (st) return st;
    if (!l->pp_keep) {
        l->pp_keep = (dt__pp_keep *)dt_alloc_zeroed(ctx, sizeof(dt__pp_keep));
        if (!l->pp_keep) return dt_ctx_set_error(ctx, DT_ERR_OOM, "dt_pp_run: out of memory for the runtime's state");
    }
    kp = l->pp_keep;
    V = (int64_t)s->stages * s->chunks;
    DT__TRY(dt_grow(ctx, (void **)&kp->acts, &kp->cap_acts, V, sizeof(dt_tensor_desc), "dt_pp_run: activation shapes"));
    r.acts = kp->acts;
    DT__TRY(dt__pp_check_acts(l, s, m, r.acts));
    r.p = s->stages, r.v = s->chunks, r.M = s->micro, r.V = r.p * r.v;
    r.out->bound = s->bound[r.st];
    cm = (int64_t)r.v * r.M;
    for (j = 0; j < s->count[r.st]; j++) /* a send in flight per SEND of the list at most, however edited */
        if (s->actions[r.st][j].op == DT_PP_SEND_ACT || s->actions[r.st][j].op == DT_PP_SEND_GRAD) n_send++;
    DT__TRY(dt_grow(ctx, (void **)&kp->slots, &kp->cap_slots, 2 * cm, sizeof(dt__pp_slot), "dt_pp_run: slots"));
    DT__TRY(dt_grow(ctx, (void **)&kp->sends, &kp->cap_sends, n_send, sizeof(dt__pp_send), "dt_pp_run: sends"));
    DT__TRY(dt_grow(ctx, (void **)&kp->last_bwd, &kp->cap_last_bwd, r.v, sizeof(int), "dt_pp_run: chunks"));
    r.in = kp->slots, r.sends = kp->sends, r.last_bwd = kp->last_bwd;
    r.pool = kp->pool, r.n_pool = kp->n_pool, r.cap_pool = kp->cap_pool;
    for (j = 0; j < r.n_pool; j++) { /* free between runs (a failed one may have left some in use) */
        r.pool[j]->used = 0;
        pool_bytes += dt_tensor_bytes(&r.pool[j]->t);
    }
    r.dout = r.in + cm;
    for (k = 0; k < 2 * cm; k++) r.in[k].buf = -1, r.in[k].req = NULL;
    for (j = 0; j < r.v; j++) r.last_bwd[j] = -1;
    for (j = 0; j < s->count[r.st]; j++) {
        dt_pp_op op = s->actions[r.st][j].op;
        if (op == DT_PP_B || op == DT_PP_BI || op == DT_PP_BW) r.last_bwd[s->actions[r.st][j].chunk] = j;
    }
#ifdef DT_NCCL
    if (r.p > 1 && r.acts[0].device == DT_CUDA_DEVICE) DT__TRY(dt__pp_links(&r, kp));
#endif
    if (r.trace) {
        st = dt_trace_attach(r.trace, l->pp_comm);
        for (j = 0; r.link && j < 4 && !st; j++)
            if (r.link[j / 2][j % 2]) st = dt_trace_attach(r.trace, r.link[j / 2][j % 2]);
        from = r.trace->n;
    }
    /* the pool made by earlier runs counts as this run's, as if it had been made now */
    r.base_ctx = ctx->bytes_in_use > pool_bytes ? ctx->bytes_in_use - pool_bytes : 0;
    if (!st) st = dt__pp_execute(&r);
    kp->pool = r.pool, kp->n_pool = r.n_pool, kp->cap_pool = r.cap_pool; /* it may have grown */
    if (st) {
        for (k = 0; k < 2 * cm; k++)
            if (r.in[k].req) pending = 1;
        for (j = 0; j < r.n_sends; j++)
            if (r.sends[j].req) pending = 1;
        /* with a receive or send of a failed run still posted, MPI may still write into its
           buffers (see the header): the layout lets go of them (never freed), and the next run
           starts a new pool */
        if (pending) l->pp_keep = NULL;
    }
    if (r.trace) dt__pp_trace_busy(r.trace, from, r.out);
    r.out->seconds = dt_comm_now() - t0;
    return st;
}

DT_API dt_status dt_pp_split(dt_ctx *ctx, int *first, int n_layers, int n_parts) {
    int k, extra;
    if (!ctx) return DT_ERR_ARG;
    if (!first) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_pp_split: first is NULL");
    if (n_parts < 1) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_pp_split: n_parts = %d, expected >= 1", n_parts);
    if (n_layers < n_parts)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_pp_split: n_layers = %d is fewer than n_parts = %d (stages x "
                                "chunks): expected at least one layer per virtual stage", n_layers, n_parts);
    extra = n_layers % n_parts;
    first[0] = 0;
    for (k = 0; k < n_parts; k++) first[k + 1] = first[k] + n_layers / n_parts + (k < extra ? 1 : 0);
    return DT_OK;
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
