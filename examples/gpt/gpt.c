/* examples/gpt/gpt.c - a GPT-2 trained with data x tensor x pipeline parallelism (Megatron layers,
   sequence parallel, ZeRO 0-3, GPipe / 1F1B / interleaved / zero-bubble pipeline schedules) on MPI
   ranks, in fp32 or bf16 / f16 with master weights.

   run:   build/examples/gpt                                  (text of the GPL, bytes, vocab 256)
          mpirun -np 4 build/examples/gpt --tp 2 --zero 1     (the same final loss, within 1e-5)
          mpirun -np 4 build/examples/gpt --pp 4 --schedule 1f1b --micro 4      (the same again)
   flags: build/examples/gpt --help lists every one.
   last line: "final: loss L" (L, %.9g: the training loss of the last step, the mean over its
   global batch), so runs under different layouts can be compared.

   The model (GPT-2, as llm.c's train_gpt2.c):
       x = wte[ids] + wpe[pos]                          wte [Vp, C] (tied with the head), wpe [T, C]
       L blocks:  x = x + attn.proj(attention(q, k, v of ln1(x)))
                  x = x + mlp.proj(gelu(mlp.fc(ln2(x))))
       logits = ln_f(x) @ wte^T;  loss = cross entropy over the real vocab V (columns >= V are
       llm.c's padding, never a target, ignored by the softmax)
   Tensor parallel (tp ranks, Megatron): q, k, v and mlp.fc are column-parallel (each rank holds
   the rows of its heads / of its quarter of 4C), attn.proj and mlp.proj row-parallel, wte
   vocab-parallel (rows [r Vp/tp, (r+1) Vp/tp)) both as the embedding and as the head, and the
   cross entropy never gathers the logits. q, k and v are three parameters rather than one
   [3C, C]: a rank's heads are then a contiguous slice of each, so every parameter is a box of
   its logical tensor and checkpoints reshard between tp sizes. They are registered one after
   the other, so their values (and grads) lie back to back as one [3Cl, C] matrix and one GEMM
   computes them (qkv_lin_get). Sequence parallel (--sp 1): the
   residual stream, layernorms and wpe are split by rows over tp; the layernorm, wpe and
   row-parallel-bias grads are then partial per rank and summed over tp (a scratch per block,
   so the sum never double-counts accumulated micro-steps).
   Parameters: every value through dt_tensor_init (normal std 0.02, projections 0.02/sqrt(2L),
   biases 0, layernorm 1 / 0) with the tensor's global shape and this rank's start, so a tp
   shard holds exactly the slice of the 1-rank tensor, and the runs of every layout start equal.
   Data (gpt_data.h): sample i of the run is a window drawn from (seed, i); step s's global batch
   is samples [s B, (s+1) B); dp rank d reads its block (dt_layout_batch_range), micro-batch m of
   --micro M the m-th part of it: the global batch, and so the loss, depend on neither.
   Units of the arena (what ZeRO-3 gathers): 0 = wte, wpe, ln_f; 1 + l = block l.
   Checkpoints (--ckpt DIR) through dt_zero_checkpoint_*: dt_opt.h's resharding directories.
   Pipeline (--pp P, dt_parallel.h's runtime): the blocks are split over the P x v virtual stages
   (v = 2 for --schedule interleaved, else 1) by dt_pp_split (uneven counts allowed, printed):
   the embedding (wte, wpe) lives on the first, ln_f, the head and the loss on the last. Each
   stage registers only its own parameters (same names, same values: the init is a function of
   the name), so a checkpoint saved at pp 2 holds every tensor once and resumes at pp 1. The
   head is tied to wte as at pp 1, Megatron's way: the last stage gets stage 0's wte values
   before each step (a comm of its own, the "embedding group") and sends its head gradient back
   after its last backward, which stage 0 adds to wte's gradient before that unit's sync; the
   optimizer and the gradient norm see wte once, on stage 0. --micro M is the schedule's m; a
   micro-batch is the same sequences at any pp, so the loss does not depend on pp either. The
   units' gradient sync (ZeRO-0 buckets) starts from the runtime's grads_done hook, as each stage
   finishes its last backward. Under --schedule zb the input-gradient pass (BI) runs the whole
   block backward and the weight pass (BW) only frees the micro-batch: the order and memory are
   ZB-H1's, the split of the tp layers' backward is not done here (tests/mpi_pp_runtime shows the
   split on dt_linear_bwd). --pp > 1 takes ZeRO 0 or 1 (stages 2-3 would free the grad buffer
   the head's gradient is added to) and no --sample.
   Mixture of experts (--moe-experts E, dt_parallel.h's >>moe): every --moe-every-th block's MLP
   becomes E experts and a router (its dense MLP stays beside them with --moe-shared 1); the
   router is a block parameter, the experts a unit of their own after the block's (dt_zero's
   expert_units: their grads average over the edp ranks holding the same experts). --ep N puts
   E / N experts on each of N dp x cp ranks; each expert is cut over tp as the dense MLP. With
   the aux loss (--moe-balance aux) every forward of a step runs before its first backward: GPipe
   at pp > 1 (the default then), --micro 1 at pp 1. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime, glob, mkdir */
#endif
#define DT_IMPLEMENTATION
#include "../../dt_tensor.h"
#include "../../dt_comm.h"
#include "../../dt_opt.h"
#include "../../dt_parallel.h"
#include "../../dt_plan.h"
#include "gpt_data.h"
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <errno.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

static dt_ctx *g_ctx;
static int g_rank;
/* dt_comm_abort, not exit: an error one rank alone sees ends every rank now (after a timeout it
   first gives the ranks still waiting the time to write their own reports). */
#define CHECK(call) do { dt_status s_ = (call); if (s_) { \
    fprintf(stderr, "gpt [rank %d]: %s failed: %s\n", g_rank, #call, dt_ctx_error(g_ctx)); dt_comm_abort(NULL, 1); } } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* --profile: seconds per op kind over the run (rank 0 prints the table). OP runs a dt call like
   CHECK, timed under `name` when profiling. On a CUDA ctx the host clock would time the launch,
   not the kernels, and a dt_ctx_sync around each op would add the waits a step must not have
   (the counters below): so each op is bracketed by two CUDA events on the ctx's stream, and their
   times are read later, once the device has passed them (prof_flush: after the step's own wait,
   the loss read, and at the end after one dt_ctx_sync). */
typedef struct prof_row { const char *name; double seconds; int64_t calls; } prof_row;
static prof_row g_prof[48];
static int g_nprof, g_profile;
static void prof_add(const char *name, double s) {
    int i;
    for (i = 0; i < g_nprof && strcmp(g_prof[i].name, name); i++) {}
    if (i == g_nprof) { if (g_nprof == 48) return; g_prof[g_nprof++].name = name; }
    g_prof[i].seconds += s;
    g_prof[i].calls++;
}
#ifdef DT_CUDA
typedef struct prof_ev { const char *name; cudaEvent_t begin, end; } prof_ev;
static prof_ev *g_ev;      /* the pairs recorded and not yet read; created once, reused */
static int g_nev, g_cev;   /* in use, created */
static int g_open;         /* ops begun and not ended (OP nests: the pipeline's run holds its ops) */
static int prof_cuda(void) { return g_ctx && g_ctx->device == DT_CUDA_DEVICE; }
/* The pair for the next op, its begin recorded; -1 when none could be had (the op goes untimed). */
static int prof_begin(void) {
    if (g_nev == g_cev) {
        prof_ev *n = (prof_ev *)realloc(g_ev, (size_t)(g_cev + 64) * sizeof *n);
        if (!n) return -1;
        g_ev = n;
        for (; g_cev < g_nev + 64; g_cev++)
            if (cudaEventCreate(&g_ev[g_cev].begin) != cudaSuccess || cudaEventCreate(&g_ev[g_cev].end) != cudaSuccess)
                return -1;
    }
    if (cudaEventRecord(g_ev[g_nev].begin, (cudaStream_t)g_ctx->cuda_stream) != cudaSuccess) return -1;
    g_open++;
    return g_nev++;
}
static void prof_end(int i, const char *name) {
    if (i < 0) return;
    g_ev[i].name = name;
    cudaEventRecord(g_ev[i].end, (cudaStream_t)g_ctx->cuda_stream);
    g_open--;
}
/* Adds the time of every pair the device has passed (no wait: cudaEventQuery) and keeps the rest.
   Not while an op is open (a loss read inside the pipeline's run): its pair has no end yet, and
   the compaction below would move the pair its caller holds by index. */
static void prof_flush(void) {
    int i, k = 0;
    if (g_open > 0) return;
    for (i = 0; i < g_nev; i++) {
        float ms = 0;
        if (cudaEventQuery(g_ev[i].end) == cudaSuccess && cudaEventElapsedTime(&ms, g_ev[i].begin, g_ev[i].end) == cudaSuccess)
            prof_add(g_ev[i].name, ms * 1e-3);
        else { prof_ev e = g_ev[k]; g_ev[k++] = g_ev[i]; g_ev[i] = e; }
    }
    g_nev = k;
}
static void prof_free(void) {
    int i;
    for (i = 0; i < g_cev; i++) { cudaEventDestroy(g_ev[i].begin); cudaEventDestroy(g_ev[i].end); }
    free(g_ev);
    g_ev = NULL; g_nev = g_cev = 0;
}
#else
static int prof_cuda(void) { return 0; }
static int prof_begin(void) { return -1; }
static void prof_end(int i, const char *name) { (void)i; (void)name; }
static void prof_flush(void) {}
static void prof_free(void) {}
#endif
#define TIMED(name, stmt) do { if (!g_profile) { stmt; break; } \
    if (prof_cuda()) { int e_ = prof_begin(); stmt; prof_end(e_, name); } \
    else { double t_ = now(); stmt; prof_add(name, now() - t_); } } while (0)
#define OP(name, call) TIMED(name, CHECK(call))

/* --device cuda: what each training step asked of the device (ctx->counters, dt_tensor.h),
   the largest of each count over the steps after the first (which allocates the scratch and
   uploads what the run keeps); a logging step's reads (the loss op and the optimizer step that
   fills the log line's info) are counted apart (g_read), so the numbers are those of a step that
   logs nothing. Printed by every rank under --profile. */
static dt_cuda_counters g_read, g_worst;
static void counters_add(dt_cuda_counters *acc, const dt_cuda_counters *now_, const dt_cuda_counters *then, int sign) {
    acc->syncs += sign * (now_->syncs - then->syncs);
    acc->allocs += sign * (now_->allocs - then->allocs);
    acc->frees += sign * (now_->frees - then->frees);
    acc->h2d_bytes += sign * (now_->h2d_bytes - then->h2d_bytes);
    acc->h2d_calls += sign * (now_->h2d_calls - then->h2d_calls);
    acc->d2h_bytes += sign * (now_->d2h_bytes - then->d2h_bytes);
    acc->d2h_calls += sign * (now_->d2h_calls - then->d2h_calls);
}
static void counters_max(dt_cuda_counters *w, const dt_cuda_counters *c) {
#define GPT_MAX_(f) if (c->f > w->f) w->f = c->f
    GPT_MAX_(syncs); GPT_MAX_(allocs); GPT_MAX_(frees); GPT_MAX_(h2d_bytes); GPT_MAX_(h2d_calls);
    GPT_MAX_(d2h_bytes); GPT_MAX_(d2h_calls);
#undef GPT_MAX_
}
/* A purely local op (no collective inside): also a compute span of the --trace timeline, so
   dt_trace_overlap tells how much communication ran beside compute. The tp layers, whose
   collectives are blocking, are left unspanned: their communication is exposed time. */
static dt_trace *g_tr;
#define COMPUTE(name, call) do { dt_trace_begin(g_tr, name); OP(name, call); dt_trace_end(g_tr); } while (0)


/* ---------------------------------------------------------------- flags */

static const char *const RECOMPUTE_NAMES[4] = {"none", "full", "selective", "gemm-last"};

typedef struct opts {
    int64_t steps, batch, seq, sample, stop_at;
    uint64_t seed;
    int layers, heads, kv_heads, width, tp, pp, cp, zero, micro, sp, print_every, ckpt_every, resume, quiet;
    dt_pp_kind schedule;  /* --schedule (pp > 1) */
    int chunks;           /* model chunks per stage: 2 for interleaved, else 1 */
    int recompute;        /* 0 none, 1 full, 2 selective, 3 gemm-last */
    int ulysses;          /* --cp-kind: 0 ring, 1 ulysses */
    double offload;       /* --offload-activations: the fraction of each chunk's blocks offloaded */
    int schedule_given;   /* --schedule was on the command line */
    int slow_every;       /* --slow-every K: each K steps, name ranks whose compute is slow (0: off) */
    double slow_factor;   /* --slow-factor F: slow = compute above F x the median rank's */
    double timeout;       /* --timeout S: a collective not done in S seconds is a named error (0: dt's 300) */
    int hier;             /* --hier auto|on|off: dt_comm_desc.hier (0, 1, -1) */
    int host_size;        /* --host-size K: dt_comm_desc.host_size (0: hosts by name) */
    int progress_us;      /* --progress-us N: dt_comm_desc.progress_us (0: no progress thread) */
    int moe_experts, moe_topk, ep, moe_every, moe_renorm, moe_shared; /* --moe-*: 0 experts = dense */
    double moe_capacity, moe_aux;
    double moe_load[4096];  /* --moe-load L: the planner's expert loads (dt_plan_model.expert_load) */
    int n_moe_load;
    dt_moe_balance moe_balance;
    int tf32;             /* --tf32: f32 GEMMs on TF32 tensor cores (cuda) */
    int sr;               /* --stochastic-rounding: bf16 values rounded stochastically from their masters */
    dt_dtype dtype;
    dt_device device;     /* --device: where parameters, activations and the optimizer live */
    double lr, min_lr_frac, wd, clip;
    int64_t warmup;
    const char *data, *shards, *ckpt, *log, *trace;
    int plan;             /* --plan: print the planner's best layouts and this one's prediction, then exit */
    int layout_auto;      /* --layout auto: train on the layout the planner ranks first */
    const char *layout_flag; /* the first flag given that --layout auto would choose (--tp, ...) */
    const char *plan_profile; /* --plan-profile FILE: read it, or measure and write it */
    double plan_memory;   /* --plan-memory MB: the most a rank may hold (0: no limit) */
} opts;

static const char *HELP =
    "gpt: a GPT-2 trained with data x tensor x pipeline parallelism on MPI ranks (mpirun -np N build/examples/gpt ...)\n"
    "  --steps N         training steps (200)\n"
    "  --seed N          the seed of the weights and of the data windows (1)\n"
    "  --batch B         global batch, sequences per step (8); a multiple of dp x micro\n"
    "  --seq T           context length (64)\n"
    "  --layers L        transformer blocks (4)\n"
    "  --heads H         attention heads (4); tp must divide it\n"
    "  --offload-activations F   the first F x blocks of each chunk keep their saved activations in host\n"
    "                    memory between forward and backward (two blocks' slots stay on the device) (0)\n"
    "  --kv-heads K      key / value heads (= --heads): K < H is grouped-query attention, query head h reading\n"
    "                    kv head h / (H / K); K divides H, tp divides K (the kv heads split over tp)\n"
    "  --width C         model width (128); H must divide it\n"
    "  --lr LR           peak learning rate of AdamW (1e-3)\n"
    "  --warmup N        linear warmup steps, then cosine decay to lr/10 at --steps (10)\n"
    "  --wd WD           AdamW weight decay of the matrices (0.1; biases, norms: none)\n"
    "  --clip C          clip the gradient norm to C, 0 = off (1)\n"
    "  --tp N            tensor-parallel ranks (1); dp = world / (tp x pp)\n"
    "  --pp N            pipeline stages (1); the blocks split over them, embedding first, head and loss last\n"
    "  --cp N            context-parallel ranks (1): each holds T / N tokens of every sequence (chunks r and\n"
    "                    2N-1-r of 2N), attention by ring over them; --seq a multiple of 2N\n"
    "  --cp-kind K       how cp attention gets the other ranks' tokens (ring): ring passes K/V around the cp\n"
    "                    ranks; ulysses trades sequence shards for head shards by all-to-all (heads / tp / cp)\n"
    "  --schedule S      pipeline schedule: gpipe, 1f1b, interleaved (2 chunks per stage) or zb (ZB-H1) (1f1b)\n"
    "  --zero N          0 DDP, 1-3 ZeRO stage (0)\n"
    "  --sp 0|1          sequence parallel over the tp group (0)\n"
    "  --micro N         micro-batches per step (1): gradient accumulation, and the pipeline's m; the loss\n"
    "                    does not depend on it\n"
    "  --recompute none|full|selective|gemm-last   activation recompute (none); gemm-last keeps every\n"
    "                    GEMM's output and recomputes only the cheap ops between (layernorm, gelu) and,\n"
    "                    on the CPU, keeps attention's logsumexp instead of its [T, T] scores\n"
    "  --dtype f32|bf16|f16   parameter dtype; f32 masters inside the optimizer (f32); cuda: f32 or bf16\n"
    "                    (bf16: attention on the tensor cores)\n"
    "  --tf32 0|1        cuda: f32 GEMMs on TF32 tensor cores, ~1e-3 relative (0: exact f32, as the CPU)\n"
    "  --stochastic-rounding 0|1  --dtype bf16: round the weights from their f32 masters stochastically\n"
    "                    (unbiased, as llm.c; a function of seed, step and element: layouts agree) (0: nearest)\n"
    "  --device cpu|cuda tensors and ops on the CPU or on the GPU (cpu); cuda needs a -DDT_CUDA build\n"
    "  --data FILE       a text file, read as bytes (vocab 256); default /usr/share/common-licenses/GPL-3,\n"
    "                    else README.md\n"
    "  --shards PATTERN  llm.c token shards (glob, e.g. 'data/tinyshakespeare_train*.bin'), GPT-2 vocab\n"
    "  --ckpt DIR        checkpoint directory; --ckpt-every N saves every N steps (and at the end)\n"
    "  --resume          continue from the newest checkpoint in --ckpt (any layout)\n"
    "  --stop-at N       stop after step N (saving a checkpoint), as a preempted job would; the\n"
    "                    schedule still spans --steps\n"
    "  --log FILE        JSON lines per step: step, loss, lr, grad_norm, tokens_per_s, loss_scale, comm_s,\n"
    "                    step_s (this step's seconds on rank 0)\n"
    "  --trace FILE      Chrome trace (Perfetto) of compute and collectives, every rank\n"
    "  --sample N        generate N tokens from the final model and print them\n"
    "  --print-every N   a progress line every N steps (10); --quiet: only the final line\n"
    "  --profile         time every op of the step; rank 0 prints a table (ms per step) at the end; with\n"
    "                    --device cuda every rank also prints \"cuda counters per step: syncs S allocs A ...\"\n"
    "                    (the most any step after the first asked of the device; a logging step's reads apart)\n"
    "  --moe-experts E   mixture of experts: the MLP of every --moe-every-th block becomes E experts and a\n"
    "                    router (0: dense) (dt_parallel.h's >>moe)\n"
    "  --moe-topk K      experts per token (2)\n"
    "  --ep N            expert-parallel ranks (1): the experts split over N of the dp x cp ranks (N divides dp x cp)\n"
    "  --moe-capacity F  per sequence, an expert keeps at most ceil(F x seq x K / E) tokens; the rest pass\n"
    "                    through the residual; 0 = dropless (1.25)\n"
    "  --moe-balance B   aux (Switch / GShard's aux loss over the global batch) or bias (DeepSeek-V3's\n"
    "                    aux-loss-free bias) (aux)\n"
    "  --moe-aux C       the aux loss's coefficient (0.01)\n"
    "  --moe-every N     every N-th block is MoE: blocks N-1, 2N-1, ... (1)\n"
    "  --moe-renorm 0|1  gates renormalised over the chosen K (Mixtral) or the raw probabilities (Switch) (1)\n"
    "  --moe-shared 0|1  keep the dense MLP beside the experts as a shared expert (0)\n"
    "  --timeout S       a collective that has not completed S seconds after it began fails on every\n"
    "                    rank that waits for it, naming the collective, its group and the ranks that did not\n"
    "                    arrive; the run then ends (dt's default 300). A step (with its checkpoint) not done\n"
    "                    in S seconds fails the same way (dt_comm_set_deadline), so a link too slow for a\n"
    "                    step is named too.\n"
    "                    mpirun notices a dead host sooner with\n"
    "                    --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3\n"
    "  --hier auto|on|off  all-reduce and all-to-all (MoE) of groups that span hosts in two levels: in\n"
    "                    each host, then across (dt_comm.h \"Across hosts\"): auto = where it pays (auto)\n"
    "  --progress-us N   a thread drives MPI's progress every N us while the rank computes, so posted\n"
    "                    collectives move during the backward (dt_comm.h \"Progress\"); 0 = none (0)\n"
    "  --host-size K     count every K consecutive ranks as one host (a cluster modelled on one machine);\n"
    "                    0 = hosts by name (0)\n"
    "  --slow-every K    every K steps, gather each rank's compute time (the step less its time in\n"
    "                    collectives) and name the ranks above --slow-factor x the median, with their host,\n"
    "                    on stdout and in --log's line (\"slow_ranks\"); 0 = off (10 on cpu, 0 on cuda)\n"
    "  --slow-factor F   (1.5)\n"
    "  --plan            measure this machine at this world size (or read --plan-profile), print the planner's\n"
    "                    best layouts for this model and batch and its prediction for the layout given, then\n"
    "                    exit (dt_plan.h; dense and MoE models on the CPU; --device cuda --dtype bf16: the GPUs'\n"
    "                    figures measured, dt_plan_machine_measure, the step modelled from them)\n"
    "  --layout auto     train on the layout the planner ranks first: it chooses --tp --pp --cp --zero --micro\n"
    "                    --sp --schedule --recompute --cp-kind --ep (and --offload-activations within --plan-memory);\n"
    "                    the model, batch and world stay as given\n"
    "  --plan-profile F  the planner's profile: read F when it exists, else measure (seconds) and write it\n"
    "                    (--device cuda: a machine file, as docs/machines/ holds)\n"
    "  --plan-memory MB  plan within MB per rank (0: no limit) (0)\n"
    "  --moe-load L      for --plan / --layout auto: per ep dividing E, the busiest ep rank's rows over its\n"
    "                    uniform share, a step's mean (one value per such ep for every MoE block, or per block\n"
    "                    and ep), comma-separated, as a run prints them at its end (\"moe: --moe-load ...\"):\n"
    "                    the trained router's skew and drops, which the profile's even router does not show\n"
    "                    (none: 1 each)\n"
    "  --help            this text\n";

static void usage(const char *why) {
    if (g_rank == 0) fprintf(stderr, "gpt: %s (--help lists the flags)\n", why);
    exit(2);
}

static int64_t num(const char *flag, const char *v, int64_t lo, int64_t hi) {
    char *end;
    long long x;
    errno = 0;
    x = v ? strtoll(v, &end, 10) : 0;
    if (!v || !*v || *end || errno == ERANGE || x < lo || x > hi) { /* ERANGE: strtoll clamped it */
        char why[200];
        snprintf(why, sizeof why, "%s wants an integer in [%lld, %lld], got '%s'", flag, (long long)lo, (long long)hi,
                 v ? v : "(nothing)");
        usage(why);
    }
    return x;
}

static double real(const char *flag, const char *v, double lo, double hi) {
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || !(x >= lo && x <= hi)) {
        char why[200];
        snprintf(why, sizeof why, "%s wants a number in [%g, %g], got '%s'", flag, lo, hi, v ? v : "(nothing)");
        usage(why);
    }
    return x;
}

static void parse(opts *o, int argc, char **argv) {
    int i;
    FILE *fp;
    memset(o, 0, sizeof *o);
    o->steps = 200; o->batch = 8; o->seq = 64; o->seed = 1; o->layers = 4; o->heads = 4; o->width = 128;
    o->lr = 1e-3; o->clip = -1; o->warmup = 10; o->wd = 0.1; o->min_lr_frac = 0.1; o->tp = 1; o->pp = 1; o->cp = 1; o->micro = 1;
    o->print_every = 10; o->dtype = DT_F32; o->schedule = DT_PP_1F1B; o->device = DT_CPU;
    o->moe_topk = 2; o->ep = 1; o->moe_capacity = 1.25; o->moe_aux = 0.01; o->moe_every = 1; o->moe_renorm = 1;
    o->moe_balance = DT_MOE_AUX;
    o->slow_every = -1; o->slow_factor = 1.5;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { if (g_rank == 0) fputs(HELP, stdout); exit(0); }
        else if (!strcmp(a, "--steps")) o->steps = num(a, v, 0, (int64_t)1 << 40);
        else if (!strcmp(a, "--seed")) o->seed = (uint64_t)num(a, v, 0, INT64_MAX);
        else if (!strcmp(a, "--batch")) o->batch = num(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--seq")) o->seq = num(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--layers")) o->layers = (int)num(a, v, 1, 1024);
        else if (!strcmp(a, "--heads")) o->heads = (int)num(a, v, 1, 1024);
        else if (!strcmp(a, "--kv-heads")) o->kv_heads = (int)num(a, v, 1, 1024);
        else if (!strcmp(a, "--offload-activations")) o->offload = real(a, v, 0, 1);
        else if (!strcmp(a, "--width")) o->width = (int)num(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--lr")) o->lr = real(a, v, 0, 10);
        else if (!strcmp(a, "--warmup")) o->warmup = num(a, v, 0, (int64_t)1 << 40);
        else if (!strcmp(a, "--wd")) o->wd = real(a, v, 0, 10);
        else if (!strcmp(a, "--clip")) o->clip = real(a, v, 0, 1e30);
        else if (!strcmp(a, "--tp")) o->tp = (int)num(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--pp")) o->pp = (int)num(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--cp")) o->cp = (int)num(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--cp-kind")) {
            if (v && !strcmp(v, "ring")) o->ulysses = 0;
            else if (v && !strcmp(v, "ulysses")) o->ulysses = 1;
            else usage("--cp-kind is ring or ulysses");
        }
        else if (!strcmp(a, "--zero")) o->zero = (int)num(a, v, 0, 3);
        else if (!strcmp(a, "--sp")) o->sp = (int)num(a, v, 0, 1);
        else if (!strcmp(a, "--micro")) o->micro = (int)num(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--schedule")) {
            o->schedule_given = 1;
            if (v && !strcmp(v, "gpipe")) o->schedule = DT_PP_GPIPE;
            else if (v && !strcmp(v, "1f1b")) o->schedule = DT_PP_1F1B;
            else if (v && !strcmp(v, "interleaved")) o->schedule = DT_PP_INTERLEAVED;
            else if (v && (!strcmp(v, "zb") || !strcmp(v, "zb-h1"))) o->schedule = DT_PP_ZB_H1;
            else usage("--schedule is gpipe, 1f1b, interleaved or zb");
        }
        else if (!strcmp(a, "--recompute")) {
            if (v && !strcmp(v, "none")) o->recompute = 0;
            else if (v && !strcmp(v, "full")) o->recompute = 1;
            else if (v && !strcmp(v, "selective")) o->recompute = 2;
            else if (v && !strcmp(v, "gemm-last")) o->recompute = 3;
            else usage("--recompute is none, full, selective or gemm-last");
        } else if (!strcmp(a, "--tf32")) {
            if (v && (!strcmp(v, "0") || !strcmp(v, "1"))) o->tf32 = v[0] == '1';
            else usage("--tf32 is 0 or 1");
        } else if (!strcmp(a, "--stochastic-rounding")) {
            if (v && (!strcmp(v, "0") || !strcmp(v, "1"))) o->sr = v[0] == '1';
            else usage("--stochastic-rounding is 0 or 1");
        } else if (!strcmp(a, "--dtype")) {
            if (v && !strcmp(v, "f32")) o->dtype = DT_F32;
            else if (v && !strcmp(v, "bf16")) o->dtype = DT_BF16;
            else if (v && !strcmp(v, "f16")) o->dtype = DT_F16;
            else usage("--dtype is f32, bf16 or f16");
        } else if (!strcmp(a, "--device")) {
            if (v && !strcmp(v, "cpu")) o->device = DT_CPU;
            else if (v && !strcmp(v, "cuda")) o->device = DT_CUDA_DEVICE;
            else usage("--device is cpu or cuda");
        }
        else if (!strcmp(a, "--timeout")) o->timeout = real(a, v, 0.001, 1e9);
        else if (!strcmp(a, "--host-size")) o->host_size = (int)num(a, v, 0, 1 << 20);
        else if (!strcmp(a, "--progress-us")) o->progress_us = (int)num(a, v, 0, 1000000);
        else if (!strcmp(a, "--hier")) {
            if (v && !strcmp(v, "auto")) o->hier = 0;
            else if (v && !strcmp(v, "on")) o->hier = 1;
            else if (v && !strcmp(v, "off")) o->hier = -1;
            else usage("--hier is auto, on or off");
        }
        else if (!strcmp(a, "--slow-every")) o->slow_every = (int)num(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--slow-factor")) o->slow_factor = real(a, v, 1, 1e6);
        else if (!strcmp(a, "--moe-experts")) o->moe_experts = (int)num(a, v, 0, 1 << 16);
        else if (!strcmp(a, "--moe-topk")) o->moe_topk = (int)num(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--ep")) o->ep = (int)num(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--moe-capacity")) o->moe_capacity = real(a, v, 0, 1e6);
        else if (!strcmp(a, "--moe-aux")) o->moe_aux = real(a, v, 0, 1e6);
        else if (!strcmp(a, "--moe-every")) o->moe_every = (int)num(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--moe-renorm")) o->moe_renorm = (int)num(a, v, 0, 1);
        else if (!strcmp(a, "--moe-shared")) o->moe_shared = (int)num(a, v, 0, 1);
        else if (!strcmp(a, "--moe-balance")) {
            if (v && !strcmp(v, "aux")) o->moe_balance = DT_MOE_AUX;
            else if (v && !strcmp(v, "bias")) o->moe_balance = DT_MOE_BIAS;
            else usage("--moe-balance is aux or bias");
        }
        else if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--shards")) o->shards = v;
        else if (!strcmp(a, "--ckpt")) o->ckpt = v;
        else if (!strcmp(a, "--ckpt-every")) o->ckpt_every = (int)num(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--log")) o->log = v;
        else if (!strcmp(a, "--trace")) o->trace = v;
        else if (!strcmp(a, "--stop-at")) o->stop_at = num(a, v, 1, (int64_t)1 << 40);
        else if (!strcmp(a, "--sample")) o->sample = num(a, v, 0, 1 << 20);
        else if (!strcmp(a, "--print-every")) o->print_every = (int)num(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--resume")) { o->resume = 1; takes = 0; }
        else if (!strcmp(a, "--quiet")) { o->quiet = 1; takes = 0; }
        else if (!strcmp(a, "--profile")) { g_profile = 1; takes = 0; }
        else if (!strcmp(a, "--plan")) { o->plan = 1; takes = 0; }
        else if (!strcmp(a, "--layout")) {
            if (v && !strcmp(v, "auto")) o->layout_auto = 1;
            else usage("--layout is auto (the planner's first choice); give --tp / --pp / ... for your own");
        }
        else if (!strcmp(a, "--plan-profile")) o->plan_profile = v;
        else if (!strcmp(a, "--plan-memory")) o->plan_memory = real(a, v, 0, 1e12);
        else if (!strcmp(a, "--moe-load")) { /* n values checked against the model once it is known */
            char buf[64];
            const char *q = v;
            o->n_moe_load = 0;
            while (q) {
                size_t len = strcspn(q, ",");
                if (o->n_moe_load == (int)(sizeof o->moe_load / sizeof o->moe_load[0]))
                    usage("--moe-load: more than 4096 values");
                if (len >= sizeof buf) len = sizeof buf - 1; /* real() then names the cut value as malformed */
                memcpy(buf, q, len);
                buf[len] = 0;
                o->moe_load[o->n_moe_load++] = real(a, buf, 0, 1e6);
                if (!q[strcspn(q, ",")]) break;
                q += strcspn(q, ",") + 1;
            }
        }
        else { char why[200]; snprintf(why, sizeof why, "unknown flag '%s'", a); usage(why); }
        if (takes && !v) { char why[200]; snprintf(why, sizeof why, "%s needs a value", a); usage(why); }
        {
            static const char *const chosen[] = {"--tp", "--pp", "--cp", "--cp-kind", "--zero", "--sp", "--micro",
                                                 "--recompute", "--ep", "--schedule", "--offload-activations"};
            size_t k;
            for (k = 0; k < sizeof chosen / sizeof chosen[0] && !o->layout_flag; k++)
                if (!strcmp(a, chosen[k])) o->layout_flag = chosen[k];
        }
        i += takes;
    }
    if (o->data && o->shards) usage("give --data FILE or --shards PATTERN, not both");
    if (o->sr && o->dtype != DT_BF16) usage("--stochastic-rounding 1 rounds bf16 weights: give --dtype bf16 with it");
    if (o->layout_auto && o->layout_flag) { /* it would be replaced without a word */
        char why[200];
        snprintf(why, sizeof why, "--layout auto chooses the layout itself (tp, pp, cp, zero, sp, micro, recompute, ep, "
                 "schedule, offload): drop %s", o->layout_flag);
        usage(why);
    }
    if (o->moe_experts && o->moe_every > o->layers) {
        char why[200];
        snprintf(why, sizeof why, "--moe-every %d with --layers %d: no block would be MoE (the first is block %d)",
                 o->moe_every, o->layers, o->moe_every - 1);
        usage(why);
    }
    /* the aux loss's gradient needs every forward of a step first: GPipe, unless asked otherwise */
    if (o->moe_experts && o->moe_balance == DT_MOE_AUX && o->pp > 1 && !o->schedule_given) o->schedule = DT_PP_GPIPE;
    o->chunks = o->schedule == DT_PP_INTERLEAVED ? 2 : 1;
    if (o->ckpt_every && !o->ckpt) usage("--ckpt-every needs --ckpt DIR");
    if (o->resume && !o->ckpt) usage("--resume needs --ckpt DIR");
#ifndef DT_CUDA
    if (o->device == DT_CUDA_DEVICE) usage("--device cuda: this gpt was built without DT_CUDA (build it with -DDT_CUDA "
                                           "and link kernels/*.cu, or use --device cpu)");
#endif
    /* f16 on cuda would need the f32 path's attention and the loss scaler's device checks tested */
    if (o->device == DT_CUDA_DEVICE && o->dtype == DT_F16) usage("--device cuda trains --dtype f32 or bf16");
    if (o->clip < 0) o->clip = 1.0;
    /* on cuda a step's time means waiting for the device (and NCCL's statistics wait too): off
       there unless asked for */
    if (o->slow_every < 0) o->slow_every = o->device == DT_CPU ? 10 : 0;
    if (!o->data && !o->shards) { /* a text that ships with Debian, else with the project */
        o->data = "/usr/share/common-licenses/GPL-3";
        if (!(fp = fopen(o->data, "rb"))) o->data = "README.md";
        else fclose(fp);
    }
}

/* ---------------------------------------------------------------- the model */

enum { LN1W, LN1B, QW, KW, VW, QB, KB, VB, AOW, AOB, LN2W, LN2B, FCW, FCB, PW, PB, NBP };
static const char *BLOCK_NAMES[NBP] = {"ln1.w", "ln1.b", "attn.q.w", "attn.k.w", "attn.v.w", "attn.q.b",
                                       "attn.k.b", "attn.v.b", "attn.proj.w", "attn.proj.b", "ln2.w", "ln2.b",
                                       "mlp.fc.w", "mlp.fc.b", "mlp.proj.w", "mlp.proj.b"};
/* The params whose grads are partial per tp rank under sequence parallelism (used on row shards). */
static const int SP_PARTIAL[6] = {LN1W, LN1B, AOB, LN2W, LN2B, PB};

typedef struct model {
    int L, H, C, tp, tp_rank, sp, cp, cp_rank;  /* cp: context-parallel ranks (the sequence split) */
    int ulysses;                        /* cp > 1: Ulysses' all-to-all instead of the ring */
    double off_frac;                    /* --offload-activations */
    int lse_attn;                       /* attention through dt_cp_attention_fwd / _bwd (keeps lse, not
                                           att): the ring at cp > 1, and gemm-last on the CPU at cp 1 */
    int tc;                             /* --device cuda --dtype bf16: GEMMs and attention on tensor cores */
    int bfw;                            /* --dtype bf16: the linears take the bf16 weights (dt_linear's bf16
                                           GEMMs: tensor cores, or AMX / f32 on the CPU: dt_cpu_bf16_gemm) */
    int64_t Hkvl, Ckvl, Wl;              /* this rank's kv heads, their width, the qkv row Cl + 2 Ckvl */
    int kv_rep, kv_g;                   /* --kv-heads < --tp: k, v weights whole on every tp rank, which uses
                                           kv head kv_g only (the one its query heads read) */
    dt_tensor rw, rb, rgw, rgb;         /* kv_rep: this rank's [Wl, C] / [Wl] qkv weight, bias and grads */
    dt_tensor kvgw, kvgb;               /* kv_rep: [2, Ckv, C] / [2, Ckv] k, v grads summed over tp */
    int64_t T, Tl, V, Vp, Vl, Cl, Hl, Fl;  /* Tl = T / cp: a sequence's rows here; Vl, Cl, Hl, Fl: this rank's
                                          vocab rows, width, heads, 4C */
    dt_params ps;
    int wte, wpe, lnfw, lnfb;           /* param indices */
    int *blk;                           /* [L][NBP] param indices */
    int *units;                         /* per param: its arena unit */
    int64_t units_cap;
    dt_tensor *f32;                     /* per param: f32 working copy of a bf16 / f16 value (a view) */
    dt_tensor f32buf;                   /* the working copies, in registration order as the arena */
    dt_layout *lay;
    dt_zero *z;
    dt_trace *tr;
    /* the pipeline: this stage's share (at pp 1: everything, units as before) */
    int pp, st, v, nvs;                 /* stages, this stage, chunks per stage, virtual stages */
    int *first;                         /* [V + 1]: blocks [first[k], first[k+1]) on virtual stage k */
    int has_embed, has_head;            /* holds virtual stage 0 / V - 1 */
    int eunit;                          /* unit of wte, wpe, ln_f here (-1: none) */
    int *bunit;                         /* [L]: unit of block l here (-1: another stage's) */
    /* --moe-experts: block l's MLP is a MoE layer where moe[l] (NULL: dense, or another stage's);
       its router sits in the block's unit, its experts in unit xunit[l] = bunit[l] + 1 (dt_zero's
       expert_units: synced over edp) */
    dt_moe **moe;                       /* [L] */
    int *xunit;                         /* [L] (-1: none) */
    int *mp;                            /* [L][5] param indices: router, fc.w, fc.b, proj.w, proj.b */
    int moe_shared;                     /* the dense MLP stays beside the experts */
    float moe_scale;                    /* dt_moe_bwd's loss_scale: the backward seed x micro-batches */
    dt_tensor wte_head, wte_head_grad;  /* last stage at pp > 1: stage 0's wte (values) and the head's grad */
} model;

static dt_param *P(model *m, int i) { return m->ps.items[i]; }
static dt_tensor *VAL(model *m, int i) { return m->f32[i].data ? &m->f32[i] : &P(m, i)->value; }
static dt_tensor *GRD(model *m, int i) { return &P(m, i)->grad; }
static int BP(model *m, int l, int k) { return m->blk[l * NBP + k]; }
/* The head's weight (wte, tied) and where its gradient goes: wte itself where this stage holds it. */
/* A linear's weight: under m->bfw (--dtype bf16) the bf16 value itself, so that dt_linear runs its
   GEMMs in bf16 (f32 accumulation); else VAL. */
static dt_tensor *WVAL(model *m, int i) { return m->bfw ? &P(m, i)->value : VAL(m, i); }
static dt_tensor *HEADW(model *m) { return m->wte >= 0 ? WVAL(m, m->wte) : &m->wte_head; }
static dt_tensor *HEADG(model *m) { return m->wte >= 0 ? GRD(m, m->wte) : &m->wte_head_grad; }

/* One parameter, [rows, cols] whole (cols 0: a vector), cut over tp as `kind`
   (dt_tp_param_desc: this rank's box of the logical tensor, which dt_tensor_init fills with
   exactly the slice of the whole). */
static int add_param(model *m, const opts *o, const char *name, int unit, dt_tp_kind kind, int64_t rows, int64_t cols,
                     dt_init_kind init, double std_or_value) {
    dt_param_desc d;
    memset(&d, 0, sizeof d);
    dt_param *p;
    CHECK(dt_tp_param_desc(m->lay, &d, kind, rows, cols));
    d.name = name; d.dtype = o->dtype;
    d.init.kind = init; d.init.seed = o->seed;
    if (init == DT_INIT_NORMAL) d.init.std = std_or_value;
    else d.init.value = std_or_value;
    d.no_decay = cols == 0; /* biases and norms: no weight decay (GPT-2, nanoGPT) */
    CHECK(dt_params_add(g_ctx, &m->ps, &p, &d));
    CHECK(dt_grow(g_ctx, (void **)&m->units, &m->units_cap, m->ps.count, sizeof(int), "units"));
    m->units[m->ps.count - 1] = unit;
    return m->ps.count - 1;
}

/* Block l is a MoE block: every --moe-every-th, the first being block N - 1. */
static int moe_block(const opts *o, int l) { return o->moe_experts && l % o->moe_every == o->moe_every - 1; }

/* An expert parameter [E, d1, d2] whole (d2 0: [E, d1]): this rank's box holds the experts
   [ep_rank E/ep, (ep_rank + 1) E/ep) (dim 0) and, where cut is 1 or 2, its tp slice of that dim,
   so a checkpoint reshards between ep (and tp) sizes by index. */
static int add_expert(model *m, const opts *o, const char *name, int unit, int64_t d1, int64_t d2, int cut,
                      dt_init_kind init, double std) {
    dt_param_desc d;
    dt_param *p;
    int64_t g[3];
    int i, El = o->moe_experts / o->ep;
    memset(&d, 0, sizeof d);
    g[0] = o->moe_experts; g[1] = d1; g[2] = d2;
    d.ndim = d2 ? 3 : 2;
    for (i = 0; i < d.ndim; i++) { d.global_shape[i] = d.shape[i] = g[i]; d.start[i] = 0; }
    d.shape[0] = El;
    d.start[0] = (int64_t)m->lay->ep_rank * El;
    if (cut) {
        d.shape[cut] = g[cut] / m->tp;
        d.start[cut] = d.shape[cut] * m->tp_rank;
    }
    d.name = name; d.dtype = o->dtype;
    d.init.kind = init; d.init.seed = o->seed; d.init.std = std;
    d.no_decay = d2 == 0;
    CHECK(dt_params_add(g_ctx, &m->ps, &p, &d));
    CHECK(dt_grow(g_ctx, (void **)&m->units, &m->units_cap, m->ps.count, sizeof(int), "units"));
    m->units[m->ps.count - 1] = unit;
    return m->ps.count - 1;
}

/* Block l's MoE parameters: the router (a dense parameter, in the block's unit) and the experts
   (E / ep of them here, in the next unit): fc [E, 4C, C] cut by rows over tp, proj [E, C, 4C] by
   columns, as the dense MLP. */
static int moe_params(model *m, const opts *o, int l, int unit) {
    char name[64];
    int64_t C = m->C;
    double std = 0.02, pstd = 0.02 / sqrt(2.0 * o->layers);
    snprintf(name, sizeof name, "h.%d.moe.router.w", l);
    m->mp[l * 5] = add_param(m, o, name, unit, DT_TP_REPLICATED, o->moe_experts, C, DT_INIT_NORMAL, std);
    unit++;
    m->xunit[l] = unit;
    snprintf(name, sizeof name, "h.%d.moe.fc.w", l);
    m->mp[l * 5 + 1] = add_expert(m, o, name, unit, 4 * C, C, 1, DT_INIT_NORMAL, std);
    snprintf(name, sizeof name, "h.%d.moe.fc.b", l);
    m->mp[l * 5 + 2] = add_expert(m, o, name, unit, 4 * C, 0, 1, DT_INIT_ZEROS, 0);
    snprintf(name, sizeof name, "h.%d.moe.proj.w", l);
    m->mp[l * 5 + 3] = add_expert(m, o, name, unit, C, 4 * C, 2, DT_INIT_NORMAL, pstd);
    snprintf(name, sizeof name, "h.%d.moe.proj.b", l);
    m->mp[l * 5 + 4] = add_expert(m, o, name, unit, C, 0, 0, DT_INIT_ZEROS, 0);
    return unit;
}

static void model_make(model *m, const opts *o, int64_t V, int64_t Vp, dt_layout *lay) {
    int l, k, i, c, unit = 0;
    char name[64];
    int64_t C = o->width, tp = lay->tp;
    double std = 0.02, pstd = 0.02 / sqrt(2.0 * o->layers);
    memset(m, 0, sizeof *m);
    m->L = o->layers; m->H = o->heads; m->C = o->width; m->T = o->seq; m->V = V; m->Vp = Vp;
    m->cp = lay->cp; m->cp_rank = lay->cp_rank; m->Tl = m->T / m->cp; m->ulysses = m->cp > 1 && o->ulysses;
    m->lse_attn = !m->ulysses && (m->cp > 1 || (o->recompute == 3 && o->device == DT_CPU));
    m->off_frac = o->offload;
    m->tp = lay->tp; m->tp_rank = lay->tp_rank; m->sp = o->sp; m->lay = lay;
    m->tc = o->device == DT_CUDA_DEVICE && o->dtype == DT_BF16;
    m->bfw = o->dtype == DT_BF16;
    m->Vl = Vp / tp; m->Cl = C / tp; m->Hl = o->heads / tp; m->Fl = 4 * C / tp;
    m->Hkvl = (o->kv_heads ? o->kv_heads : o->heads) / tp;
    if (o->kv_heads && o->kv_heads < tp) { /* replicated: one kv head per rank, all its query heads' */
        m->kv_rep = 1;
        m->Hkvl = 1;
        m->kv_g = (int)(m->tp_rank * m->Hl / (o->heads / o->kv_heads));
    }
    m->Ckvl = m->Hkvl * (C / o->heads);
    m->Wl = m->Cl + 2 * m->Ckvl;
    m->pp = lay->pp; m->st = lay->pp_rank; m->v = lay->pp > 1 ? o->chunks : 1; m->nvs = m->pp * m->v;
    m->blk = (int *)dt_alloc(g_ctx, (size_t)m->L * NBP * sizeof(int));
    m->bunit = (int *)dt_alloc(g_ctx, (size_t)m->L * sizeof(int));
    m->first = (int *)dt_alloc(g_ctx, (size_t)(m->nvs + 1) * sizeof(int));
    m->moe = (dt_moe **)dt_alloc_zeroed(g_ctx, (size_t)m->L * sizeof(dt_moe *));
    m->xunit = (int *)dt_alloc(g_ctx, (size_t)m->L * sizeof(int));
    m->mp = (int *)dt_alloc(g_ctx, (size_t)m->L * 5 * sizeof(int));
    if (!m->blk || !m->bunit || !m->first || !m->moe || !m->xunit || !m->mp) CHECK(DT_ERR_OOM);
    m->moe_shared = o->moe_shared;
    for (i = 0; i < m->L; i++) m->xunit[i] = -1;
    for (i = 0; i < m->L * 5; i++) m->mp[i] = -1;
    CHECK(dt_pp_split(g_ctx, m->first, m->L, m->nvs));
    for (l = 0; l < m->L; l++) m->bunit[l] = -1;
    for (i = 0; i < m->L * NBP; i++) m->blk[i] = -1;
    m->has_embed = m->st == 0;                 /* virtual stage 0 is chunk 0 of stage 0 */
    m->has_head = m->st == m->pp - 1;          /* virtual stage nvs - 1 is chunk v - 1 of stage p - 1 */
    m->wte = m->wpe = m->lnfw = m->lnfb = m->eunit = -1;
    /* registration order (so units are non-decreasing): wte, wpe, ln_f, then the blocks; at pp 1
       exactly as before the pipeline */
    if (m->has_embed) {
        m->wte = add_param(m, o, "wte", 0, DT_TP_COLUMN, Vp, C, DT_INIT_NORMAL, std);   /* vocab-parallel rows */
        m->wpe = add_param(m, o, "wpe", 0, DT_TP_REPLICATED, m->T, C, DT_INIT_NORMAL, std);
    }
    if (m->has_head) {
        m->lnfw = add_param(m, o, "ln_f.w", 0, DT_TP_REPLICATED, C, 0, DT_INIT_CONST, 1.0);
        m->lnfb = add_param(m, o, "ln_f.b", 0, DT_TP_REPLICATED, C, 0, DT_INIT_ZEROS, 0);
    }
    if (m->has_embed || m->has_head) m->eunit = unit++;
    if (m->pp > 1 && (m->has_head || m->has_embed)) {
        /* the last stage: the tied head's weight (stage 0 sends it each step) and its gradient;
           stage 0: where that gradient arrives */
        dt_tensor_desc d;
        memset(&d, 0, sizeof d);
        d.shape[0] = m->Vl; d.shape[1] = C;
        d.dtype = m->bfw ? DT_BF16 : DT_F32; /* what stage 0's head would take: WVAL */
        if (m->has_head) CHECK(dt_tensor_create(g_ctx, &m->wte_head, &d));
        d.dtype = DT_F32;
        CHECK(dt_tensor_create(g_ctx, &m->wte_head_grad, &d));
    }
    for (c = 0; c < m->v; c++)
        for (l = m->first[c * m->pp + m->st]; l < m->first[c * m->pp + m->st + 1]; l++, unit++) {
        m->bunit[l] = unit;
        for (k = 0; k < NBP; k++) {
            if (moe_block(o, l) && !o->moe_shared && k >= FCW) break; /* the experts replace the MLP */
            int64_t rows = C, cols = 0;
            dt_tp_kind kind = DT_TP_REPLICATED;
            dt_init_kind init = DT_INIT_ZEROS;
            double sv = 0;
            snprintf(name, sizeof name, "h.%d.%s", l, BLOCK_NAMES[k]);
            switch (k) {
            case LN1W: case LN2W: init = DT_INIT_CONST; sv = 1.0; break;
            case LN1B: case LN2B: case AOB: case PB: break;                       /* whole, zeros */
            case QW: case KW: case VW: kind = DT_TP_COLUMN; cols = C; init = DT_INIT_NORMAL; sv = std;
                if (k != QW) rows = m->kv_rep ? (int64_t)o->kv_heads * (C / o->heads) : m->Ckvl * tp; /* the kv
                                                   heads' rows (all of them at --kv-heads = --heads) */
                if (k != QW && m->kv_rep) kind = DT_TP_REPLICATED;
                break;
            case QB: case KB: case VB: kind = DT_TP_COLUMN;
                if (k != QB) rows = m->kv_rep ? (int64_t)o->kv_heads * (C / o->heads) : m->Ckvl * tp;
                if (k != QB && m->kv_rep) kind = DT_TP_REPLICATED;
                break;
            case AOW: kind = DT_TP_ROW; cols = C; init = DT_INIT_NORMAL; sv = pstd; break;
            case FCW: kind = DT_TP_COLUMN; rows = 4 * C; cols = C; init = DT_INIT_NORMAL; sv = std; break;
            case FCB: kind = DT_TP_COLUMN; rows = 4 * C; break;
            default: /* PW */ kind = DT_TP_ROW; cols = 4 * C; init = DT_INIT_NORMAL; sv = pstd; break;
            }
            m->blk[l * NBP + k] = add_param(m, o, name, unit, kind, rows, cols, init, sv);
        }
        if (moe_block(o, l)) unit = moe_params(m, o, l, unit);
        }
    m->f32 = (dt_tensor *)dt_alloc(g_ctx, (size_t)m->ps.count * sizeof(dt_tensor));
    if (!m->f32) CHECK(DT_ERR_OOM);
    memset(m->f32, 0, (size_t)m->ps.count * sizeof(dt_tensor));
    /* the ops compute in f32: a working copy of a bf16 / f16 value, refreshed at each gather, all
       in one buffer laid out as the arena's (so q, k, v are adjacent there too: span3) */
    if (o->dtype != DT_F32 && m->ps.count) {
        dt_tensor_desc d;
        int64_t at = 0;
        memset(&d, 0, sizeof d);
        for (i = 0; i < m->ps.count; i++) d.shape[0] += P(m, i)->value.numel;
        d.device = P(m, 0)->value.device;
        d.dtype = DT_F32;
        CHECK(dt_tensor_create(g_ctx, &m->f32buf, &d));
        for (i = 0; i < m->ps.count; i++) {
            const dt_tensor *v = &P(m, i)->value;
            CHECK(dt_tensor_view(g_ctx, &m->f32[i], &m->f32buf, at, v->ndim, v->shape));
            at += v->numel;
        }
    }
}

/* dt_zero_gather, then the f32 copies of a bf16 / f16 unit. */
static void gather(model *m, int unit) {
    int i;
    CHECK(dt_zero_gather(m->z, unit));
    for (i = 0; i < m->ps.count; i++)
        if (m->units[i] == unit && m->f32[i].data) CHECK(dt_tensor_cast(g_ctx, &m->f32[i], &P(m, i)->value));
}
static void release(model *m, int unit) { CHECK(dt_zero_release(m->z, unit)); }
/* Block l's units: its own and, for a MoE block, its experts' (the next one; gathered first in
   the backward, which walks the units down). */
static void gather_block(model *m, int l, int backward) {
    if (backward && m->xunit[l] >= 0) gather(m, m->xunit[l]);
    gather(m, m->bunit[l]);
    if (!backward && m->xunit[l] >= 0) gather(m, m->xunit[l]);
}
static void release_block(model *m, int l) {
    if (m->xunit[l] >= 0) release(m, m->xunit[l]);
    release(m, m->bunit[l]);
}
static int moe_unit(const model *m, int unit) {
    int l;
    for (l = 0; l < m->L; l++)
        if (m->xunit[l] == unit) return 1;
    return 0;
}
static void ready_block(model *m, int l) {
    if (m->xunit[l] >= 0) CHECK(dt_zero_grad_ready(m->z, m->xunit[l]));
    CHECK(dt_zero_grad_ready(m->z, m->bunit[l]));
}

/* ---------------------------------------------------------------- activations

   For a local micro-batch of b sequences: N = b T rows, Nl = N / tp under sequence parallelism
   (the rows of the residual stream this rank holds), else N. Per block, what the backward
   reads; --recompute full keeps only each block's input (the rest is one shared set the
   backward refills), selective shares att [b, H/tp, T, T] and the GELU output, gemm-last shares
   the inputs of the GEMMs that cheap ops make (ln1, ln2: layernorm; gelu) and keeps the outputs
   of the GEMMs (qkv, atty, res1, fch) and attention's lse instead of att. */

typedef struct bacts {
    dt_tensor in;                       /* [Nl, C] block input (the residual stream) */
    dt_tensor ln1, ln1m, ln1r, ln1all;  /* ln1all [N, C]: gathered rows (sp) */
    dt_tensor qkv, att, atty;           /* [b, Tl, 3Cl], [b, Hl, T, T], [N, Cl] */
    dt_tensor lse;                      /* m->lse_attn: [b, Hl, Tl], the logsumexp of each row (no att) */
    dt_tensor uqkv;                     /* ulysses: [b, T, 3Cl/cp] this rank's heads of the whole sequence
                                           (att is then [b, Hl/cp, T, T]) */
    dt_tensor res1;                     /* [Nl, C] x + attention */
    dt_tensor ln2, ln2m, ln2r, ln2all;
    dt_tensor fch, gelu;                /* [N, Fl] */
    /* the zero-bubble split (--schedule zb, sp 0, no recompute): what the input-gradient pass
       leaves for the weight pass, the output gradient of each linear */
    dt_tensor g_mlp, g_fch, g_attn, g_qkv;   /* [N, C], [N, Fl], [N, C], [b, T, 3Cl] */
} bacts;

typedef struct acts {
    int64_t b, N, Nl;
    bacts *blk;                         /* [L] (views where shared) */
    bacts shared;                       /* full / selective / gemm-last: the tensors the blocks share */
    /* --offload-activations: blocks [off_lo, off_hi) own no memory of their own: their tensors are
       views into one of nslot slots (block l uses slot (l - off_lo) % nslot), copied to
       host[l - off_lo] after the block's forward and back before its backward, so nslot blocks'
       worth stay resident */
    int off_lo, off_hi, recording, nslot;
    int64_t off_elems;                  /* floats of one block's own tensors (each on 16 bytes) */
    int64_t off_at[sizeof(bacts) / sizeof(dt_tensor)]; /* each own tensor's offset in a slot, -1: not own */
    dt_tensor slot[3];
    dt_tensor *host;                    /* [off_hi - off_lo], outside the ctx's accounting (malloc, or
                                           cudaMallocHost: pinned, so the copies run beside compute) */
    uint64_t *tick_out, *tick_in;       /* [off_hi - off_lo]: each block's side-stream copies (0: none) */
    int resident[3];                    /* the block whose tensors each slot holds (-1: none), or will once
                                           its tick_in is waited for: the forward's last nslot blocks stay
                                           there for the backward, which starts with them, copying nothing */
    int64_t off_ins;                    /* copies back from host, this acts' share */
    double off_seconds;                 /* spent copying, this acts' share */
    dt_tensor xL, lnf, lnfm, lnfr, lnfall, logits, stats, ids, targets, partial, y_scratch;
    dt_tensor dres, dln, dxbuf, dall, doutbuf, dqkv, datty, dfch, dgelu, dlogits;
    dt_tensor dsp, dwpe, dlnf;          /* sp: partial grads of one block / wpe / ln_f */
    dt_tensor gath1, gath2;             /* sp: ln1 / ln2 rows gathered over tp [N, C], shared */
    dt_tensor hids, htargets;           /* --device cuda: the host side of ids / targets (load_tokens) */
    dt_tensor wids, wtargets;           /* --cp > 1: one whole window [T] (load_tokens takes its chunks) */
    dt_tensor moefull, moedy, moeout;   /* MoE: [N, C] the layer's partial output (then its input grad),
                                           [N, C] the output's grad gathered (sp), [Nl, C] this rank's rows */
    int64_t bytes;                      /* what these tensors hold */
    int64_t blk_bytes;                  /* of it, what the blocks keep for the backward (the recompute's target) */
    dt_moe_acts **moe;                  /* [L]: a MoE block's routing and experts' activations (NULL: dense) */
    int64_t seq0;                       /* the global index of the micro-batch's first sequence */
} acts;

static void mk(acts *a, dt_tensor *t, int64_t d0, int64_t d1, int64_t d2, int64_t d3, dt_dtype dt) {
    dt_tensor_desc d;
    if (a->recording) { /* an offloaded block's: the shape now, the memory a slot's (offload_bind) */
        int64_t dims[4];
        int k;
        dims[0] = d0; dims[1] = d1; dims[2] = d2; dims[3] = d3;
        memset(t, 0, sizeof *t);
        t->dtype = dt; t->device = g_ctx->device;
        for (k = 0; k < 4 && dims[k]; k++) t->shape[t->ndim++] = dims[k];
        t->numel = dt_shape_numel(t->ndim, t->shape);
        return;
    }
    memset(&d, 0, sizeof d);
    d.dtype = dt; d.shape[0] = d0; d.shape[1] = d1; d.shape[2] = d2; d.shape[3] = d3;
    CHECK(dt_tensor_create(g_ctx, t, &d));
    a->bytes += (int64_t)dt_tensor_bytes(t);
}

/* A view of the whole of t (owns 0), for the tensors blocks share. */
static dt_tensor share(const dt_tensor *t) { dt_tensor v = *t; v.owns = 0; return v; }

/* ---- activation offload (--offload-activations F): the first F x blocks of a chunk

   After block l's forward its own tensors (what its backward reads; under recompute, what the
   mode keeps per block) go to host memory and come back before its backward. They live in one
   of nslot device slots, (l - lo) % nslot, so the device keeps nslot blocks' worth instead of
   all. The copies run on the ctx's side stream (dt_tensor_copy_side) beside the compute: on
   CUDA three slots, so that block l - 1's copy out overlaps block l's forward (block l writes
   block l + 1's input, in the slot of l - 2, whose copy has had a block's time to finish; it is
   waited for, dt_side_wait, before l starts), and backward block l - 1's copy in overlaps block
   l's backward (a prefetch into the slot block l + 2 left). The forward's last nslot blocks are
   still in their slots when the backward starts with them, so they are not copied back at all,
   and their backward is the copy window of the first block that is (in a pipeline the time
   between a micro-batch's forward and its backward only lengthens the copies out's window; a
   block that is not offloaded prefetches the offloaded one below it). On the CPU a copy is done at once,
   so two slots do (the same code, tested everywhere). The host side is outside the ctx's
   accounting, so dt_peak_bytes (the device's peak on CUDA) drops by n_off - nslot blocks; on
   CUDA it is pinned (cudaMallocHost) so the copies are asynchronous. */

static void *host_alloc(size_t bytes) {
#ifdef DT_CUDA
    if (g_ctx->device == DT_CUDA_DEVICE) {
        void *p = NULL;
        return cudaMallocHost(&p, bytes) == cudaSuccess ? p : NULL;
    }
#endif
    return malloc(bytes);
}
static void host_free(void *p) {
#ifdef DT_CUDA
    if (g_ctx->device == DT_CUDA_DEVICE) { if (p) cudaFreeHost(p); return; }
#endif
    free(p);
}

/* The own tensors of an offloaded block get their place in a slot: the order of bacts' fields. */
static void offload_make(acts *a, int lo) {
    size_t i, n = sizeof(bacts) / sizeof(dt_tensor);
    int64_t at = 0;
    int l, k, cnt = a->off_hi - a->off_lo;
    if (cnt <= 0) return;
    for (i = 0; i < n; i++) {
        const dt_tensor *t = (const dt_tensor *)&a->blk[lo] + i;
        a->off_at[i] = -1;
        if (t->dtype && !t->data && t->numel > 0) { /* in floats, each tensor on 16 bytes (bf16 or f32) */
            a->off_at[i] = at;
            at += ((int64_t)dt_tensor_bytes(t) + 15) / 16 * 4;
        }
    }
    a->off_elems = at;
    a->nslot = g_ctx->device == DT_CUDA_DEVICE ? 3 : 2;
    if (a->nslot > cnt) a->nslot = cnt;
    for (k = 0; k < 3; k++) a->resident[k] = -1;
    for (k = 0; k < a->nslot; k++) mk(a, &a->slot[k], at, 0, 0, 0, DT_F32);
    a->host = (dt_tensor *)calloc((size_t)cnt, sizeof(dt_tensor));
    a->tick_out = (uint64_t *)calloc((size_t)cnt, sizeof(uint64_t));
    a->tick_in = (uint64_t *)calloc((size_t)cnt, sizeof(uint64_t));
    if (!a->host || !a->tick_out || !a->tick_in) CHECK(DT_ERR_OOM);
    for (l = 0; l < cnt; l++) {
        dt_tensor *h = &a->host[l];
        h->data = host_alloc((size_t)at * sizeof(float) + 1);
        if (!h->data) CHECK(DT_ERR_OOM);
        h->dtype = DT_F32; h->device = DT_CPU; h->ndim = 1; h->shape[0] = at; h->numel = at; h->owns = 0;
    }
}

static int offloaded(const acts *a, int l) { return l >= a->off_lo && l < a->off_hi; }
static dt_tensor *slot_of(acts *a, int l) { return &a->slot[(l - a->off_lo) % a->nslot]; }

/* Block l's own tensors as views into its slot, which holds (or is about to hold) block l. */
static void offload_bind(acts *a, int l) {
    size_t i, n = sizeof(bacts) / sizeof(dt_tensor);
    const dt_tensor *s = slot_of(a, l);
    a->resident[(l - a->off_lo) % a->nslot] = l;
    for (i = 0; i < n; i++)
        if (a->off_at[i] >= 0) ((dt_tensor *)&a->blk[l] + i)->data = (float *)s->data + a->off_at[i];
}

/* Before block l's forward: it and the block it writes the input of in their slots, the copies out
   of those slots' previous blocks done (the ctx stream waits; the host does not). */
static void offload_fwd_begin(acts *a, int l) {
    int prev = l + 1 - a->nslot; /* the last block before l + 1 in l + 1's slot */
    if (offloaded(a, l + 1) && offloaded(a, prev)) OP("offload wait", dt_side_wait(g_ctx, a->tick_out[prev - a->off_lo]));
    else if (offloaded(a, l) && offloaded(a, l - a->nslot)) OP("offload wait", dt_side_wait(g_ctx, a->tick_out[l - a->nslot - a->off_lo]));
    if (offloaded(a, l)) offload_bind(a, l);
    if (offloaded(a, l + 1)) offload_bind(a, l + 1);
}
/* After block l's forward: its slot to host, on the side stream. */
static void offload_fwd_end(acts *a, int l) {
    double t0;
    if (!offloaded(a, l)) return;
    t0 = dt_comm_now();
    OP("offload to host", dt_tensor_copy_side(g_ctx, &a->host[l - a->off_lo], slot_of(a, l), &a->tick_out[l - a->off_lo]));
    a->off_seconds += dt_comm_now() - t0;
}
/* Block j's tensors back from host into its slot, on the side stream, unless the slot still holds
   them (the forward's last blocks never left) or they are on their way. The slot's previous block
   is j + nslot, whose backward has run; its copy out went first on the same stream. */
static void offload_fetch(acts *a, int j) {
    if (!offloaded(a, j) || a->resident[(j - a->off_lo) % a->nslot] == j) return;
    OP("offload from host", dt_tensor_copy_side(g_ctx, slot_of(a, j), &a->host[j - a->off_lo], &a->tick_in[j - a->off_lo]));
    a->resident[(j - a->off_lo) % a->nslot] = j; /* once tick_in is waited for (0: the copy is done) */
    a->off_ins++;
}
/* Before block l's backward: its tensors in its slot (resident since the forward, prefetched during
   block l + 1's backward, or fetched now), and block l - 1's prefetch into the slot block
   l - 1 + nslot has left. A block that is not offloaded prefetches l - 1 too: the first offloaded
   block of the backward then overlaps the last one that was not. */
static void offload_bwd_begin(acts *a, int l) {
    double t0 = dt_comm_now();
    if (offloaded(a, l)) {
        offload_fetch(a, l);
        if (a->tick_in[l - a->off_lo]) OP("offload wait", dt_side_wait(g_ctx, a->tick_in[l - a->off_lo]));
        a->tick_in[l - a->off_lo] = 0;
        offload_bind(a, l);
    }
    if (a->nslot > 1 || !offloaded(a, l)) offload_fetch(a, l - 1); /* not into the slot block l is reading */
    a->off_seconds += dt_comm_now() - t0;
}

/* The activations of one micro-batch of b sequences through blocks [lo, hi) (a pipeline chunk;
   0, L at pp 1) and the head's and embedding's tensors. */
static void acts_make(acts *a, model *m, int64_t b, int recompute, int lo, int hi) {
    int64_t N = b * m->Tl, Nl = m->sp ? N / m->tp : N, C = m->C;
    int l;
    /* --dtype bf16: the GEMMs' inputs that cheap ops make (ln1, ln2, the MLP's GELU and its input),
       qkv and attention's output are kept in bf16, as llm.c keeps its activations: the layernorm,
       the fc's epilogue, the qkv GEMM and attention write them rounded once, the GEMMs read them
       as they are. Except: ln2 where a MoE layer reads it (dt_moe_fwd takes f32 rows), qkv under
       Ulysses (its all-to-all takes the f32 qkv) and in the CPU's ring (dt_cp_attention on f32),
       attention's output under either context parallelism (the ring merges its blocks in f32,
       Ulysses' all-to-all moves f32). So are the MLP's two inner gradients (d gelu out, d fch: the
       fc GEMMs read them as they are, as llm.c's) and, on CUDA, dqkv where atty is bf16 (the
       tensor-core attention's backward adds into it once, rounded; the qkv GEMMs read it as it
       is: the same bits as an f32 dqkv; on the CPU its two rounding passes would cost more than
       the bytes save). The residual stream and the other gradients stay f32. */
    dt_dtype a16 = m->bfw ? DT_BF16 : DT_F32, ln2t = a16;
    dt_dtype qkvt = m->bfw && !m->ulysses && (!m->lse_attn || m->tc) ? DT_BF16 : DT_F32;
    dt_dtype attyt = m->bfw && !m->ulysses && !m->lse_attn ? DT_BF16 : DT_F32; /* the ring merges into f32 */
    for (l = 0; l < m->L; l++)
        if (m->moe[l]) ln2t = DT_F32;
    memset(a, 0, sizeof *a);
    a->b = b; a->N = N; a->Nl = Nl;
    a->off_lo = lo;
    a->off_hi = lo + (int)floor(m->off_frac * (hi - lo) + 0.5);
    a->blk = (bacts *)dt_alloc(g_ctx, (size_t)m->L * sizeof(bacts));
    a->blk_bytes = -a->bytes;
    if (!a->blk) CHECK(DT_ERR_OOM);
    memset(a->blk, 0, (size_t)m->L * sizeof(bacts));
    for (l = 0; l < m->L + (recompute ? 1 : 0); l++) {
        int own_all = recompute == 0 || ((recompute == 2 || recompute == 3) && l < m->L), gl = recompute == 3;
        bacts *x = l < m->L ? &a->blk[l] : &a->shared;
        if (l < m->L && (l < lo || l >= hi)) continue; /* another chunk's */
        a->recording = l < m->L && l < a->off_hi;
        if (l < m->L) mk(a, &x->in, Nl, C, 0, 0, DT_F32);
        if (!own_all && recompute == 1 && l < m->L) continue; /* full: the input only */
        if (gl && l == m->L) { /* gemm-last: what the cheap ops remake, one set for all blocks */
            mk(a, &x->ln1, Nl, C, 0, 0, a16); mk(a, &x->ln2, Nl, C, 0, 0, ln2t); mk(a, &x->gelu, N, m->Fl, 0, 0, a16);
            continue;
        }
        if (!gl) mk(a, &x->ln1, Nl, C, 0, 0, a16);
        mk(a, &x->ln1m, Nl, 0, 0, 0, DT_F32); mk(a, &x->ln1r, Nl, 0, 0, 0, DT_F32);
        if (!gl) mk(a, &x->ln2, Nl, C, 0, 0, ln2t);
        mk(a, &x->ln2m, Nl, 0, 0, 0, DT_F32); mk(a, &x->ln2r, Nl, 0, 0, 0, DT_F32);
        mk(a, &x->qkv, b, m->Tl, m->Wl, 0, qkvt);
        mk(a, &x->atty, N, m->Cl, 0, 0, attyt);
        mk(a, &x->res1, Nl, C, 0, 0, DT_F32);
        mk(a, &x->fch, N, m->Fl, 0, 0, a16);
        if (recompute != 2 || l == m->L) { /* the tensor-core attention stores no [T, T] scores */
            if (m->ulysses) { /* on the tensor cores: uqkv in bf16, no [T, T] scores */
                mk(a, &x->uqkv, b, m->T, m->Wl / m->cp, 0, m->tc ? DT_BF16 : DT_F32);
                if (!m->tc) mk(a, &x->att, b, m->Hl / m->cp, m->T, m->T, DT_F32);
            } else if (m->lse_attn) mk(a, &x->lse, b, m->Hl, m->Tl, 0, DT_F32); /* ring / lse attention: no [T, T] */
            else if (!m->tc) mk(a, &x->att, b, m->Hl, m->T, m->T, DT_F32);
            if (!gl) mk(a, &x->gelu, N, m->Fl, 0, 0, a16);
        }
    }
    a->recording = 0;
    offload_make(a, lo);
    a->blk_bytes += a->bytes;
    for (l = lo; l < hi && recompute; l++) { /* the shared tensors, as views */
        bacts *x = &a->blk[l], *s = &a->shared;
        if (recompute == 3) { /* gemm-last: each block keeps the rest */
            x->ln1 = share(&s->ln1); x->ln2 = share(&s->ln2); x->gelu = share(&s->gelu);
            continue;
        }
        if (recompute == 1) {
            dt_tensor in = x->in;
            *x = *s;
            x->in = in;
            x->ln1 = share(&s->ln1); x->ln1m = share(&s->ln1m); x->ln1r = share(&s->ln1r); x->ln1all = share(&s->ln1all);
            x->ln2 = share(&s->ln2); x->ln2m = share(&s->ln2m); x->ln2r = share(&s->ln2r); x->ln2all = share(&s->ln2all);
            x->qkv = share(&s->qkv); x->atty = share(&s->atty); x->res1 = share(&s->res1); x->fch = share(&s->fch);
        }
        x->att = share(&s->att); x->lse = share(&s->lse); x->uqkv = share(&s->uqkv); x->gelu = share(&s->gelu);
    }
    if (m->sp) { /* the gathered rows: one copy for all blocks, gathered again in the backward
                    (Megatron-SP keeps only the row shard per block: the point of sp's memory) */
        mk(a, &a->gath1, N, C, 0, 0, a16);
        mk(a, &a->gath2, N, C, 0, 0, ln2t);
        for (l = 0; l <= m->L; l++) {
            bacts *x = l < m->L ? &a->blk[l] : &a->shared;
            x->ln1all = share(&a->gath1);
            x->ln2all = share(&a->gath2);
        }
    }
    mk(a, &a->xL, Nl, C, 0, 0, DT_F32);
    mk(a, &a->lnf, Nl, C, 0, 0, DT_F32); mk(a, &a->lnfm, Nl, 0, 0, 0, DT_F32); mk(a, &a->lnfr, Nl, 0, 0, 0, DT_F32);
    if (m->sp) mk(a, &a->lnfall, N, C, 0, 0, DT_F32);
    mk(a, &a->logits, N, m->Vl, 0, 0, DT_F32); mk(a, &a->stats, N, 2, 0, 0, DT_F32);
    mk(a, &a->ids, N, 0, 0, 0, DT_I32); mk(a, &a->targets, N, 0, 0, 0, DT_I32);
    mk(a, &a->partial, N, C, 0, 0, DT_F32); mk(a, &a->y_scratch, Nl, C, 0, 0, DT_F32);
    mk(a, &a->dres, Nl, C, 0, 0, DT_F32); mk(a, &a->dln, Nl, C, 0, 0, DT_F32);
    mk(a, &a->dxbuf, N, C, 0, 0, DT_F32); mk(a, &a->dall, N, C, 0, 0, DT_F32); mk(a, &a->doutbuf, N, C, 0, 0, DT_F32);
    mk(a, &a->dqkv, b, m->Tl, m->Wl, 0, m->tc ? attyt : DT_F32); /* bf16: the tensor cores' attention adds into it */
    mk(a, &a->datty, N, m->Cl, 0, 0, DT_F32);
    mk(a, &a->dfch, N, m->Fl, 0, 0, a16); mk(a, &a->dgelu, N, m->Fl, 0, 0, a16);
    mk(a, &a->dlogits, N, m->Vl, 0, 0, DT_F32);
    if (m->sp && m->tp > 1) { mk(a, &a->dsp, 6, C, 0, 0, DT_F32); mk(a, &a->dwpe, m->T, C, 0, 0, DT_F32); mk(a, &a->dlnf, 2, C, 0, 0, DT_F32); }
    for (l = lo; l < hi; l++)
        if (m->moe[l]) {
            if (!a->moe) {
                a->moe = (dt_moe_acts **)dt_alloc_zeroed(g_ctx, (size_t)m->L * sizeof(dt_moe_acts *));
                if (!a->moe) CHECK(DT_ERR_OOM);
                mk(a, &a->moefull, N, C, 0, 0, DT_F32); mk(a, &a->moedy, N, C, 0, 0, DT_F32); mk(a, &a->moeout, Nl, C, 0, 0, DT_F32);
            }
            CHECK(dt_moe_acts_create(m->moe[l], &a->moe[l])); /* its buffers grow with the tokens routed */
        }
}

static void acts_free(acts *a, int L) {
    int l;
    dt_tensor *t;
    size_t i, n = sizeof(bacts) / sizeof(dt_tensor);
    for (l = 0; l < L && a->blk; l++) for (t = &a->blk[l].in, i = 0; i < n; i++) dt_tensor_free(g_ctx, &t[i]);
    for (l = 0; l < L && a->moe; l++) dt_moe_acts_free(a->moe[l]);
    dt_release(g_ctx, a->moe);
    a->moe = NULL;
    for (t = &a->shared.in, i = 0; i < n; i++) dt_tensor_free(g_ctx, &t[i]);
    n = (offsetof(acts, bytes) - offsetof(acts, xL)) / sizeof(dt_tensor);
    for (t = &a->xL, i = 0; i < n; i++) dt_tensor_free(g_ctx, &t[i]);
    for (l = 0; l < 3; l++) dt_tensor_free(g_ctx, &a->slot[l]);
    for (l = 0; a->host && l < a->off_hi - a->off_lo; l++) host_free(a->host[l].data);
    free(a->host);
    free(a->tick_out);
    free(a->tick_in);
    a->host = NULL;
    a->tick_out = a->tick_in = NULL;
    dt_release(g_ctx, a->blk);
    a->blk = NULL;
}

/* ---------------------------------------------------------------- forward and backward */

static void fill0(dt_tensor *t) { COMPUTE("zero fill", dt_tensor_fill(g_ctx, t, 0.0)); }

/* The first row of this rank's residual-stream rows in the micro-batch (sp: its slice). */
static int64_t row0(const model *m, const acts *a) { return m->sp ? (int64_t)m->tp_rank * a->Nl : 0; }

/* One [3 rows, ...] tensor over a, b, c when they lie back to back in memory (same shape, dtype
   and device), as QW, KW, VW (and QB, KB, VB) do in the arena and in the working copies: the
   parameters are registered in that order and laid out in it with no gap, values and grads
   alike, at every ZeRO stage (a unit's full buffer keeps the order). Returns 0 where they do not. */
/* q (a), k (b) and v (c) back to back in memory, k and v alike (fewer rows than q under GQA):
   one tensor of their rows. */
static int span3(dt_tensor *out, const dt_tensor *a, const dt_tensor *b, const dt_tensor *c) {
    size_t n = dt_tensor_bytes(a), nk = dt_tensor_bytes(b);
    if (!a->data || (char *)b->data != (char *)a->data + n || (char *)c->data != (char *)b->data + nk ||
        dt_tensor_bytes(c) != nk || b->dtype != a->dtype || c->dtype != a->dtype || b->device != a->device ||
        c->device != a->device || a->ndim < 1 || b->ndim != a->ndim || (a->ndim == 2 && b->shape[1] != a->shape[1]))
        return 0;
    *out = *a;
    out->owns = 0;
    out->shape[0] += 2 * b->shape[0];
    out->numel += 2 * b->numel;
    return 1;
}

/* Block l's q, k and v as one linear [3Cl, C] (and bias [3Cl]), so one GEMM makes the row
   [q | k | v] that dt_attention reads from qkv, and one takes its gradient back. Q, K, V
   adjacent in memory is how model_make lays them out (span3); a layout that broke it would
   be a bug here, so it is named rather than worked around. */
typedef struct qkv_lin { dt_tensor w, b, gw, gb; } qkv_lin;

/* dst rows [d0, d0 + n) = src rows [s0, s0 + n) (rows of `cols`; cols 0: a vector), or += with add. */
static void copy_rows(dt_tensor *dst, int64_t d0, const dt_tensor *src, int64_t s0, int64_t n, int64_t cols, int add) {
    dt_tensor dv, sv;
    int64_t e = n * (cols ? cols : 1);
    CHECK(dt_tensor_view(g_ctx, &dv, dst, d0 * (cols ? cols : 1), 1, &e));
    CHECK(dt_tensor_view(g_ctx, &sv, src, s0 * (cols ? cols : 1), 1, &e));
    if (add) CHECK(dt_axpy(g_ctx, &dv, 1.0f, &sv));
    else CHECK(dt_tensor_copy(g_ctx, &dv, &sv));
}

/* kv_rep: this rank's linear is its q rows and the rows of kv head kv_g of the whole k and v. */
static void qkv_rep_get(model *m, int l, qkv_lin *q, int grads) {
    int64_t C = m->C, hs = m->Ckvl;
    if (!m->rw.data) {
        dt_tensor_desc d;
        memset(&d, 0, sizeof d);
        d.dtype = DT_F32; d.shape[0] = m->Wl; d.shape[1] = C;
        CHECK(dt_tensor_create(g_ctx, &m->rw, &d)); CHECK(dt_tensor_create(g_ctx, &m->rgw, &d));
        d.shape[1] = 0;
        CHECK(dt_tensor_create(g_ctx, &m->rb, &d)); CHECK(dt_tensor_create(g_ctx, &m->rgb, &d));
        d.shape[0] = 2; d.shape[1] = P(m, BP(m, l, KW))->value.shape[0]; d.shape[2] = C;
        CHECK(dt_tensor_create(g_ctx, &m->kvgw, &d));
        d.shape[2] = 0;
        CHECK(dt_tensor_create(g_ctx, &m->kvgb, &d));
    }
    copy_rows(&m->rw, 0, VAL(m, BP(m, l, QW)), 0, m->Cl, C, 0);
    copy_rows(&m->rw, m->Cl, VAL(m, BP(m, l, KW)), m->kv_g * hs, hs, C, 0);
    copy_rows(&m->rw, m->Cl + hs, VAL(m, BP(m, l, VW)), m->kv_g * hs, hs, C, 0);
    copy_rows(&m->rb, 0, VAL(m, BP(m, l, QB)), 0, m->Cl, 0, 0);
    copy_rows(&m->rb, m->Cl, VAL(m, BP(m, l, KB)), m->kv_g * hs, hs, 0, 0);
    copy_rows(&m->rb, m->Cl + hs, VAL(m, BP(m, l, VB)), m->kv_g * hs, hs, 0, 0);
    q->w = share(&m->rw);
    q->b = share(&m->rb);
    if (grads) {
        fill0(&m->rgw);
        fill0(&m->rgb);
        q->gw = share(&m->rgw);
        q->gb = share(&m->rgb);
    }
}

/* kv_rep, after the linear's backward: q's grads to q; k's and v's rows of kv head kv_g summed over
   tp (the ranks that share a kv head add into the same rows) before they join the grads, so a
   gradient accumulated over micro-batches is summed once. */
static void qkv_rep_put(model *m, int l) {
    int64_t C = m->C, hs = m->Ckvl, Ckv = m->kvgw.shape[1];
    copy_rows(GRD(m, BP(m, l, QW)), 0, &m->rgw, 0, m->Cl, C, 1);
    copy_rows(GRD(m, BP(m, l, QB)), 0, &m->rgb, 0, m->Cl, 0, 1);
    fill0(&m->kvgw);
    fill0(&m->kvgb);
    copy_rows(&m->kvgw, m->kv_g * hs, &m->rgw, m->Cl, hs, C, 0);
    copy_rows(&m->kvgw, Ckv + m->kv_g * hs, &m->rgw, m->Cl + hs, hs, C, 0);
    copy_rows(&m->kvgb, m->kv_g * hs, &m->rgb, m->Cl, hs, 0, 0);
    copy_rows(&m->kvgb, Ckv + m->kv_g * hs, &m->rgb, m->Cl + hs, hs, 0, 0);
    OP("tp allreduce", dt_tp_allreduce(m->lay, &m->kvgw));
    OP("tp allreduce", dt_tp_allreduce(m->lay, &m->kvgb));
    copy_rows(GRD(m, BP(m, l, KW)), 0, &m->kvgw, 0, Ckv, C, 1);
    copy_rows(GRD(m, BP(m, l, VW)), 0, &m->kvgw, Ckv, Ckv, C, 1);
    copy_rows(GRD(m, BP(m, l, KB)), 0, &m->kvgb, 0, Ckv, 0, 1);
    copy_rows(GRD(m, BP(m, l, VB)), 0, &m->kvgb, Ckv, Ckv, 0, 1);
}

static void qkv_lin_get(model *m, int l, qkv_lin *q, int grads) {
    int ok;
    if (m->kv_rep) { qkv_rep_get(m, l, q, grads); return; }
    ok = span3(&q->w, WVAL(m, BP(m, l, QW)), WVAL(m, BP(m, l, KW)), WVAL(m, BP(m, l, VW))) &&
             span3(&q->b, VAL(m, BP(m, l, QB)), VAL(m, BP(m, l, KB)), VAL(m, BP(m, l, VB)));
    if (ok && grads)
        ok = span3(&q->gw, GRD(m, BP(m, l, QW)), GRD(m, BP(m, l, KW)), GRD(m, BP(m, l, VW))) &&
             span3(&q->gb, GRD(m, BP(m, l, QB)), GRD(m, BP(m, l, KB)), GRD(m, BP(m, l, VB)));
    if (!ok) {
        fprintf(stderr, "gpt [rank %d]: block %d's q, k, v %s are not adjacent in memory (one [3C, C] "
                "linear needs them so)\n", g_rank, l, grads ? "values or grads" : "values");
        dt_comm_abort(NULL, 1);
    }
}
/* [N, 3Cl]: the rows of qkv / dqkv for the linear */
static dt_tensor rows3(const model *m, const acts *a, const dt_tensor *t) {
    dt_tensor v;
    int64_t s[2];
    s[0] = a->N; s[1] = m->Wl;
    CHECK(dt_tensor_reshape(g_ctx, &v, t, 2, s));
    return v;
}

/* Attention of the block's qkv into out (atty as [b, T, Cl]) and back (dqkv +=). With m->bfw
   (--dtype bf16) the qkv GEMM wrote qkv in bf16 and out is bf16 (but under Ulysses and the ring,
   acts_make): on CUDA
   dt_attention runs on the tensor cores (FlashAttention-2, nothing [T, T] kept: the backward
   recomputes), on the CPU its products are bf16 (AMX where the CPU has it) and it keeps att; else
   f32, keeping att. */
static void attn_fwd(model *m, acts *a, bacts *x, dt_tensor *out) {
    (void)a;
    if (m->ulysses) { /* heads for sequence: all-to-all, whole-sequence attention, all-to-all back */
        OP("cp attention fwd", dt_cp_ulysses_fwd(m->lay, out, &x->uqkv, m->tc ? NULL : &x->att, &x->qkv, (int)m->Hl,
                                                 (int)m->Hkvl));
        return;
    }
    if (m->lse_attn) { /* ring attention over the cp group (the other ranks' K/V come to this one); at
                          cp 1 the same code is causal attention keeping lse, not the [T, T] scores. On
                          CUDA in bf16 from a bf16 qkv: its blocks on the tensor cores, K/V sent in bf16 */
        OP("cp attention fwd", dt_cp_attention_fwd(m->lay, out, &x->lse, &x->qkv, (int)m->Hl, (int)m->Hkvl));
        return;
    }
    /* --dtype bf16: qkv is bf16 (acts_make), and on CUDA att is NULL (the tensor cores) */
    COMPUTE("attention fwd", dt_attention_gqa_fwd(g_ctx, out, m->tc ? NULL : &x->att, &x->qkv, (int)m->Hl, (int)m->Hkvl));
}
static void attn_bwd(model *m, acts *a, bacts *x, dt_tensor *dout, const dt_tensor *out) {
    (void)out; /* only the ring reads the forward's output */
    if (m->ulysses) {
        OP("cp attention bwd", dt_cp_ulysses_bwd(m->lay, &a->dqkv, dout, &x->uqkv, m->tc ? NULL : &x->att, (int)m->Hl,
                                                 (int)m->Hkvl));
        return;
    }
    if (m->lse_attn) {
        OP("cp attention bwd", dt_cp_attention_bwd(m->lay, &a->dqkv, dout, &x->qkv, out, &x->lse, (int)m->Hl, (int)m->Hkvl));
        return;
    }
    COMPUTE("attention bwd", dt_attention_gqa_bwd(g_ctx, &a->dqkv, dout, &x->qkv, m->tc ? NULL : &x->att, (int)m->Hl, (int)m->Hkvl));
}

/* The MoE layer of block l on ln2's rows (all of them: gathered under sp), its tp partial summed
   (all-reduce, or reduce-scatter to this rank's rows under sp), written into y, or added to the
   shared expert's output there. */
static void moe_fwd(model *m, acts *a, bacts *x, int l, dt_tensor *y) {
    dt_layout *lay = m->lay;
    const dt_tensor *in = &x->ln2, *out = &a->moefull;
    const int *p = m->mp + l * 5;
    if (m->sp) {
        if (!m->moe_shared) OP("sp gather", dt_sp_gather_rows(lay, &x->ln2all, &x->ln2)); /* else the fc's gathered them */
        in = &x->ln2all;
    }
    OP("moe fwd", dt_moe_fwd(m->moe[l], a->moe[l], &a->moefull, in, a->seq0, VAL(m, p[0]), VAL(m, p[1]), VAL(m, p[2]),
                             VAL(m, p[3]), VAL(m, p[4])));
    if (m->sp) {
        OP("sp scatter", dt_sp_scatter_rows(lay, &a->moeout, &a->moefull));
        out = &a->moeout;
    } else if (m->tp > 1)
        OP("tp allreduce", dt_tp_allreduce(lay, &a->moefull));
    if (m->moe_shared) COMPUTE("residual add", dt_axpy(g_ctx, y, 1.0f, out));
    else CHECK(dt_tensor_copy(g_ctx, y, out));
}

/* Its backward from a->dres (this rank's rows of the block output's grad): the input grad,
   summed over tp as moe_fwd's output was, added into a->dln. */
static void moe_bwd(model *m, acts *a, bacts *x, int l) {
    dt_layout *lay = m->lay;
    const dt_tensor *in = m->sp ? &x->ln2all : &x->ln2, *dy = &a->dres;
    const int *p = m->mp + l * 5;
    if (m->sp) {
        OP("sp gather", dt_sp_gather_rows(lay, &a->moedy, &a->dres));
        dy = &a->moedy;
    }
    fill0(&a->moefull);
    OP("moe bwd", dt_moe_bwd(m->moe[l], a->moe[l], &a->moefull, GRD(m, p[0]), GRD(m, p[1]), GRD(m, p[2]), GRD(m, p[3]),
                             GRD(m, p[4]), dy, in, VAL(m, p[0]), VAL(m, p[1]), VAL(m, p[3]), m->moe_scale));
    if (m->sp) {
        OP("sp scatter", dt_sp_scatter_rows(lay, &a->moeout, &a->moefull));
        COMPUTE("residual add", dt_axpy(g_ctx, &a->dln, 1.0f, &a->moeout));
    } else {
        if (m->tp > 1) OP("tp allreduce", dt_tp_allreduce(lay, &a->moefull));
        COMPUTE("residual add", dt_axpy(g_ctx, &a->dln, 1.0f, &a->moefull));
    }
}

/* Block l: y = x + attn(ln1(x)); y += mlp(ln2(y)). Reads x->in, writes y. */
static void block_fwd(model *m, acts *a, bacts *x, int l, dt_tensor *y) {
    dt_layout *lay = m->lay;
    const dt_tensor *xall = m->sp ? &x->ln1all : &x->ln1;
    dt_tensor atty3, qkv2;
    qkv_lin ql;
    int64_t s3[3];
    COMPUTE("layernorm fwd", dt_layernorm_fwd(g_ctx, &x->ln1, &x->ln1m, &x->ln1r, &x->in, VAL(m, BP(m, l, LN1W)), VAL(m, BP(m, l, LN1B)), 1e-5f));
    /* q, k, v: column-parallel, one gather of the rows for the three (sp) */
    if (m->sp) OP("sp gather", dt_sp_gather_rows(lay, &x->ln1all, &x->ln1));
    qkv_lin_get(m, l, &ql, 0);
    qkv2 = rows3(m, a, &x->qkv);
    COMPUTE("qkv linear fwd", dt_linear_fwd(g_ctx, &qkv2, xall, &ql.w, &ql.b));
    s3[0] = a->b; s3[1] = m->Tl; s3[2] = m->Cl;
    CHECK(dt_tensor_reshape(g_ctx, &atty3, &x->atty, 3, s3));
    attn_fwd(m, a, x, &atty3);
    OP("row linear fwd", dt_tp_row_linear_fwd(lay, &x->res1, &a->partial, &x->atty, WVAL(m, BP(m, l, AOW)), VAL(m, BP(m, l, AOB)), m->sp));
    COMPUTE("residual add", dt_axpy(g_ctx, &x->res1, 1.0f, &x->in)); /* res1 + in, as dt_add: on either device */
    COMPUTE("layernorm fwd", dt_layernorm_fwd(g_ctx, &x->ln2, &x->ln2m, &x->ln2r, &x->res1, VAL(m, BP(m, l, LN2W)), VAL(m, BP(m, l, LN2B)), 1e-5f));
    if (!m->moe[l] || m->moe_shared) {
        /* fch = ln2 fc^T + b, gelu = gelu(fch): on CUDA one GEMM whose epilogue adds the bias and
           applies the GELU (dt_linear_gelu_fwd) */
        OP("column linear gelu fwd", dt_tp_column_linear_gelu_fwd(lay, &x->gelu, &x->fch, m->sp ? &x->ln2all : NULL, &x->ln2, WVAL(m, BP(m, l, FCW)), VAL(m, BP(m, l, FCB)), m->sp));
        OP("row linear fwd", dt_tp_row_linear_fwd(lay, y, &a->partial, &x->gelu, WVAL(m, BP(m, l, PW)), VAL(m, BP(m, l, PB)), m->sp));
    }
    if (m->moe[l]) moe_fwd(m, a, x, l, y);
    COMPUTE("residual add", dt_axpy(g_ctx, y, 1.0f, &x->res1));
}

/* The grad target of param k of block l: its grad, or under sp the block's partial scratch. */
static dt_tensor *GT(model *m, acts *a, int l, int k, dt_tensor *tmp) {
    int j;
    if (!(m->sp && m->tp > 1)) return GRD(m, BP(m, l, k));
    for (j = 0; j < 6; j++)
        if (SP_PARTIAL[j] == k) {
            int64_t s[1];
            s[0] = m->C;
            CHECK(dt_tensor_view(g_ctx, tmp, &a->dsp, j * m->C, 1, s));
            return tmp;
        }
    return GRD(m, BP(m, l, k));
}

/* The weights' half of block l's backward (part 2 of block_bwd): from the output gradients the
   input half saved, the same dt_linear_bwd / dt_bias_add_bwd calls the tp layers make (sp 0). */
static void block_bwd_weights(model *m, bacts *x, int l) {
    qkv_lin ql;
    dt_tensor g_qkv;
    int64_t s2[2];
    s2[0] = x->g_qkv.shape[0] * x->g_qkv.shape[1]; s2[1] = x->g_qkv.shape[2];
    CHECK(dt_tensor_reshape(g_ctx, &g_qkv, &x->g_qkv, 2, s2));
    COMPUTE("linear bwd (weights)", dt_linear_bwd(g_ctx, NULL, GRD(m, BP(m, l, PW)), NULL, &x->g_mlp, &x->gelu, WVAL(m, BP(m, l, PW))));
    COMPUTE("linear bwd (weights)", dt_bias_add_bwd(g_ctx, GRD(m, BP(m, l, PB)), &x->g_mlp));
    COMPUTE("linear bwd (weights)", dt_linear_bwd(g_ctx, NULL, GRD(m, BP(m, l, FCW)), GRD(m, BP(m, l, FCB)), &x->g_fch, &x->ln2, WVAL(m, BP(m, l, FCW))));
    COMPUTE("linear bwd (weights)", dt_linear_bwd(g_ctx, NULL, GRD(m, BP(m, l, AOW)), NULL, &x->g_attn, &x->atty, WVAL(m, BP(m, l, AOW))));
    COMPUTE("linear bwd (weights)", dt_bias_add_bwd(g_ctx, GRD(m, BP(m, l, AOB)), &x->g_attn));
    qkv_lin_get(m, l, &ql, 1);
    COMPUTE("linear bwd (weights)", dt_linear_bwd(g_ctx, NULL, &ql.gw, &ql.gb, &g_qkv, &x->ln1, &ql.w));
    if (m->kv_rep) qkv_rep_put(m, l);
}

/* A copy of t kept for the weight pass (the input pass's scratch is reused by the next block). */
static void keep(acts *a, dt_tensor *dst, const dt_tensor *t) {
    if (!dst->data) mk(a, dst, t->shape[0], t->shape[1], t->ndim > 2 ? t->shape[2] : 0, 0, t->dtype);
    CHECK(dt_tensor_copy(g_ctx, dst, t));
}

/* dres holds d(block output); on return d(block input). part 0: the whole backward; 1: the
   input-gradient half only (the linears' weight gradients left for block_bwd_weights, their
   output gradients kept in x; layernorms do both halves here: theirs are a few vectors). */
static void block_bwd_part(model *m, acts *a, bacts *x, int l, int recompute, int part);
static void block_bwd(model *m, acts *a, bacts *x, int l, int recompute) { block_bwd_part(m, a, x, l, recompute, 0); }
static void block_bwd_part(model *m, acts *a, bacts *x, int l, int recompute, int part) {
    int w = part == 0; /* the weight gradients now */
    dt_layout *lay = m->lay;
    const dt_tensor *xall = m->sp ? &x->ln1all : &x->ln1;
    dt_tensor t1, t2, atty3, datty3, dqkv2;
    qkv_lin ql;
    int64_t s3[3];
    int j;
    if (recompute == 3) { /* gemm-last: the GEMMs' inputs the cheap ops made, from the outputs kept */
        COMPUTE("layernorm fwd", dt_layernorm_fwd(g_ctx, &x->ln1, &x->ln1m, &x->ln1r, &x->in, VAL(m, BP(m, l, LN1W)), VAL(m, BP(m, l, LN1B)), 1e-5f));
        COMPUTE("layernorm fwd", dt_layernorm_fwd(g_ctx, &x->ln2, &x->ln2m, &x->ln2r, &x->res1, VAL(m, BP(m, l, LN2W)), VAL(m, BP(m, l, LN2B)), 1e-5f));
        COMPUTE("gelu fwd", dt_gelu_fwd(g_ctx, &x->gelu, &x->fch));
    }
    if (recompute == 1) block_fwd(m, a, x, l, &a->y_scratch);
    else if (m->sp) { /* the blocks share one gathered copy: this block's rows again */
        OP("sp gather", dt_sp_gather_rows(lay, &x->ln1all, &x->ln1));
        OP("sp gather", dt_sp_gather_rows(lay, &x->ln2all, &x->ln2));
    }
    s3[0] = a->b; s3[1] = m->Tl; s3[2] = m->Cl;
    CHECK(dt_tensor_reshape(g_ctx, &atty3, &x->atty, 3, s3));
    if (recompute == 2) { /* the two tensors selective recompute did not keep */
        attn_fwd(m, a, x, &atty3);
        COMPUTE("gelu fwd", dt_gelu_fwd(g_ctx, &x->gelu, &x->fch));
    }
    if (m->sp && m->tp > 1) fill0(&a->dsp);
    /* mlp (and / or the experts) */
    if (!m->moe[l] || m->moe_shared) {
        fill0(&a->dgelu);
        if (!w) keep(a, &x->g_mlp, &a->dres);
        OP("row linear bwd", dt_tp_row_linear_bwd(lay, &a->dgelu, w ? GRD(m, BP(m, l, PW)) : NULL, w ? GT(m, a, l, PB, &t1) : NULL, &a->doutbuf, &a->dres, &x->gelu,
                                   WVAL(m, BP(m, l, PW)), m->sp));
        fill0(&a->dfch);
        COMPUTE("gelu bwd", dt_gelu_bwd(g_ctx, &a->dfch, &a->dgelu, &x->fch));
        fill0(&a->dln);
        if (!w) keep(a, &x->g_fch, &a->dfch);
        OP("column linear bwd", dt_tp_column_linear_bwd(lay, &a->dln, w ? GRD(m, BP(m, l, FCW)) : NULL, w ? GRD(m, BP(m, l, FCB)) : NULL, &a->dxbuf, &a->dfch,
                                      m->sp ? &x->ln2all : &x->ln2, WVAL(m, BP(m, l, FCW)), m->sp));
    } else
        fill0(&a->dln);
    if (m->moe[l]) moe_bwd(m, a, x, l);
    COMPUTE("layernorm bwd", dt_layernorm_bwd(g_ctx, &a->dres, GT(m, a, l, LN2W, &t1), GT(m, a, l, LN2B, &t2), &a->dln, &x->res1,
                           VAL(m, BP(m, l, LN2W)), &x->ln2m, &x->ln2r));
    /* attention */
    fill0(&a->datty);
    if (!w) keep(a, &x->g_attn, &a->dres);
    OP("row linear bwd", dt_tp_row_linear_bwd(lay, &a->datty, w ? GRD(m, BP(m, l, AOW)) : NULL, w ? GT(m, a, l, AOB, &t1) : NULL, &a->doutbuf, &a->dres, &x->atty,
                               WVAL(m, BP(m, l, AOW)), m->sp));
    fill0(&a->dqkv);
    CHECK(dt_tensor_reshape(g_ctx, &datty3, &a->datty, 3, s3));
    attn_bwd(m, a, x, &datty3, &atty3);
    /* q, k, v: column-parallel by hand (one linear of this rank's 3Cl rows), so that the input
       grad is one sum over tp */
    fill0(&a->dall);
    if (!w) keep(a, &x->g_qkv, &a->dqkv);
    qkv_lin_get(m, l, &ql, w);
    dqkv2 = rows3(m, a, &a->dqkv);
    COMPUTE("qkv linear bwd", dt_linear_bwd(g_ctx, &a->dall, w ? &ql.gw : NULL, w ? &ql.gb : NULL, &dqkv2, xall, &ql.w));
    if (m->kv_rep && w) qkv_rep_put(m, l);
    if (m->sp) OP("sp scatter", dt_sp_scatter_rows(lay, &a->dln, &a->dall));
    else {
        OP("tp allreduce", dt_tp_allreduce(lay, &a->dall));
        CHECK(dt_tensor_copy(g_ctx, &a->dln, &a->dall));
    }
    COMPUTE("layernorm bwd", dt_layernorm_bwd(g_ctx, &a->dres, GT(m, a, l, LN1W, &t1), GT(m, a, l, LN1B, &t2), &a->dln, &x->in,
                           VAL(m, BP(m, l, LN1W)), &x->ln1m, &x->ln1r));
    if (m->sp && m->tp > 1) { /* the row-sharded params' grads: the sum over tp, added once */
        OP("tp allreduce", dt_tp_allreduce(lay, &a->dsp));
        for (j = 0; j < 6; j++) {
            dt_tensor v;
            int64_t s[1];
            if (BP(m, l, SP_PARTIAL[j]) < 0) continue; /* a MoE block's absent mlp.proj.b */
            s[0] = m->C;
            CHECK(dt_tensor_view(g_ctx, &v, &a->dsp, j * m->C, 1, s));
            CHECK(dt_axpy(g_ctx, GRD(m, BP(m, l, SP_PARTIAL[j])), 1.0f, &v));
        }
    }
}

/* The sequence position of a sequence's local row j (0 <= j < Tl), and how many rows from j on
   have consecutive positions: at cp 1 the row itself and the rest of the sequence; at cp > 1 the
   zigzag's (chunks cp_rank and 2cp-1-cp_rank of 2cp, dt_cp_position) and the rest of j's chunk. */
static int64_t seq_pos(const model *m, int64_t j, int64_t *run) {
    int64_t c = m->Tl / 2;
    if (m->cp == 1) { *run = m->Tl - j; return j; }
    *run = c - j % c;
    return dt_cp_position(m->cp, m->cp_rank, m->T, j);
}

/* rows += wpe[pos] (bwd: dwpe[pos] += rows) for this rank's rows, local row (r0 + r) % Tl of its
   sequence (seq_pos): one dt_axpy per run of consecutive positions, in row order as a loop would. */
static void wpe_rows(model *m, acts *a, dt_tensor *rows, const dt_tensor *wpe, int bwd) {
    int64_t r, C = m->C, r0 = row0(m, a), n;
    for (r = 0; r < a->Nl; r += n) {
        int64_t run, pos = seq_pos(m, (r0 + r) % m->Tl, &run);
        dt_tensor x, p;
        n = run < a->Nl - r ? run : a->Nl - r;
        n *= C;
        CHECK(dt_tensor_view(g_ctx, &x, rows, r * C, 1, &n));
        CHECK(dt_tensor_view(g_ctx, &p, wpe, pos * C, 1, &n));
        n /= C;
        if (bwd) CHECK(dt_axpy(g_ctx, &p, 1.0f, &x));
        else CHECK(dt_axpy(g_ctx, &x, 1.0f, &p));
    }
}

/* x = wte[ids] + wpe[pos] for this rank's rows. */
static void embed_fwd(model *m, acts *a) {
    OP("embedding fwd", dt_tp_embedding_fwd(m->lay, &a->blk[0].in, &a->partial, VAL(m, m->wte), &a->ids,
                              (int64_t)m->tp_rank * m->Vl, m->Vp, m->sp));
    wpe_rows(m, a, &a->blk[0].in, VAL(m, m->wpe), 0);
}

static void embed_bwd(model *m, acts *a) {
    int part = m->sp && m->tp > 1;
    OP("embedding bwd", dt_tp_embedding_bwd(m->lay, GRD(m, m->wte), &a->doutbuf, &a->dres, &a->ids, (int64_t)m->tp_rank * m->Vl,
                              m->Vp, m->sp));
    if (part) fill0(&a->dwpe);
    wpe_rows(m, a, &a->dres, part ? &a->dwpe : GRD(m, m->wpe), 1);
    if (part) {
        OP("tp allreduce", dt_tp_allreduce(m->lay, &a->dwpe));
        CHECK(dt_axpy(g_ctx, GRD(m, m->wpe), 1.0f, &a->dwpe));
    }
}

/* ln_f and the logits (vocab-parallel, the head tied to wte) from a->xL; unit eunit gathered. */
static void head_fwd(model *m, acts *a) {
    COMPUTE("layernorm fwd", dt_layernorm_fwd(g_ctx, &a->lnf, &a->lnfm, &a->lnfr, &a->xL, VAL(m, m->lnfw), VAL(m, m->lnfb), 1e-5f));
    OP("column linear fwd", dt_tp_column_linear_fwd(m->lay, &a->logits, m->sp ? &a->lnfall : NULL, &a->lnf, HEADW(m), NULL, m->sp));
}

/* From the loss (seed dloss) back through the head and ln_f: a->dres = d(last block's output). */
static void head_bwd(model *m, acts *a, float dloss) {
    int part = m->sp && m->tp > 1;
    dt_tensor t1, t2;
    int64_t s[1];
    /* dt_tp_xent_bwd writes every element of dlogits: nothing to zero first */
    OP("cross entropy bwd", dt_tp_xent_bwd(m->lay, &a->dlogits, &a->logits, &a->stats, &a->targets, (int64_t)m->tp_rank * m->Vl, m->V, -1, dloss));
    fill0(&a->dln);
    OP("column linear bwd", dt_tp_column_linear_bwd(m->lay, &a->dln, HEADG(m), NULL, &a->dxbuf, &a->dlogits,
                                  m->sp ? &a->lnfall : &a->lnf, HEADW(m), m->sp));
    fill0(&a->dres);
    s[0] = m->C;
    if (part) {
        fill0(&a->dlnf);
        CHECK(dt_tensor_view(g_ctx, &t1, &a->dlnf, 0, 1, s));
        CHECK(dt_tensor_view(g_ctx, &t2, &a->dlnf, m->C, 1, s));
    }
    COMPUTE("layernorm bwd", dt_layernorm_bwd(g_ctx, &a->dres, part ? &t1 : GRD(m, m->lnfw), part ? &t2 : GRD(m, m->lnfb), &a->dln, &a->xL,
                           VAL(m, m->lnfw), &a->lnfm, &a->lnfr));
    if (part) {
        OP("tp allreduce", dt_tp_allreduce(m->lay, &a->dlnf));
        CHECK(dt_axpy(g_ctx, GRD(m, m->lnfw), 1.0f, &t1));
        CHECK(dt_axpy(g_ctx, GRD(m, m->lnfb), 1.0f, &t2));
    }
}

/* The forward of a micro-batch to the logits (every unit gathered and released in turn);
   ends with unit 0 gathered, for the head (the caller releases it). */
static void forward_logits(model *m, acts *a) {
    int l;
    gather(m, m->eunit);
    if (offloaded(a, 0)) offload_bind(a, 0); /* the embedding writes block 0's input */
    embed_fwd(m, a);
    release(m, m->eunit);
    for (l = 0; l < m->L; l++) {
        gather_block(m, l, 0);
        offload_fwd_begin(a, l);
        block_fwd(m, a, &a->blk[l], l, l + 1 < m->L ? &a->blk[l + 1].in : &a->xL);
        offload_fwd_end(a, l);
        release_block(m, l);
    }
    gather(m, m->eunit);
    head_fwd(m, a);
}

/* The cross entropy forward; the loss into *loss only when loss is not NULL (a logging step:
   on CUDA that is the step's one wait for the device, counted apart in g_read). */
static void xent_fwd(model *m, acts *a, float *loss) {
    dt_cuda_counters before = g_ctx->counters;
    OP("cross entropy fwd", dt_tp_xent_fwd(m->lay, loss, NULL, &a->stats, &a->logits, &a->targets, (int64_t)m->tp_rank * m->Vl, m->V, -1));
    if (loss) {
        counters_add(&g_read, &g_ctx->counters, &before, 1);
        prof_flush(); /* the device has passed every op before this one */
    }
}

/* Forward + loss + backward of one micro-batch (ids, targets filled); returns the loss when
   `logging` (else 0: the loss stays on the device, nothing waits for it). */
static float train_micro(model *m, acts *a, float dloss, int recompute, int logging) {
    float loss = 0;
    int l;
    forward_logits(m, a);
    xent_fwd(m, a, logging ? &loss : NULL);
    release(m, m->eunit);
    CHECK(dt_zero_backward_begin(m->z));
    gather(m, m->eunit);
    head_bwd(m, a, dloss);
    release(m, m->eunit);
    for (l = m->L - 1; l >= 0; l--) {
        gather_block(m, l, 1);
        offload_bwd_begin(a, l);
        block_bwd(m, a, &a->blk[l], l, recompute);
        ready_block(m, l);
        release_block(m, l);
    }
    gather(m, m->eunit);
    embed_bwd(m, a);
    CHECK(dt_zero_grad_ready(m->z, m->eunit));
    release(m, m->eunit);
    return loss;
}

/* The tokens of `count` samples from global sample `first` into a->ids / a->targets: written on
   the host (gpt_data.h reads files), then copied once to the device where the acts live. At
   cp > 1 each sample's window is read whole and this rank keeps its two chunks of it. */
static void load_tokens(model *m, acts *a, const opts *o, dt_gpt_data *data, int64_t first, int64_t count) {
    dt_tensor hi = a->ids, ht = a->targets;
    int64_t i, T = m->Tl;
    int dev = a->ids.device != DT_CPU;
    a->seq0 = first;
    if (dev) { /* host buffers made once, kept with the acts: a step allocates nothing */
        if (!a->hids.data) CHECK(dt_tensor_create_like(g_ctx, &a->hids, &a->ids, DT_DTYPE_DEFAULT, DT_CPU));
        if (!a->htargets.data) CHECK(dt_tensor_create_like(g_ctx, &a->htargets, &a->targets, DT_DTYPE_DEFAULT, DT_CPU));
        hi = a->hids;
        ht = a->htargets;
    }
    if (m->cp > 1 && !a->wids.data) {
        dt_tensor_desc d;
        memset(&d, 0, sizeof d);
        d.dtype = DT_I32; d.shape[0] = m->T; d.device = DT_CPU; /* read on the host, as hids */
        CHECK(dt_tensor_create(g_ctx, &a->wids, &d));
        CHECK(dt_tensor_create(g_ctx, &a->wtargets, &d));
    }
    for (i = 0; i < count; i++) {
        dt_tensor in, out;
        int64_t j, run;
        CHECK(dt_tensor_view(g_ctx, &in, &hi, i * T, 1, &T));
        CHECK(dt_tensor_view(g_ctx, &out, &ht, i * T, 1, &T));
        if (m->cp == 1) {
            CHECK(dt_gpt_data_window(g_ctx, &in, &out, data, o->seed, first + i));
            continue;
        }
        CHECK(dt_gpt_data_window(g_ctx, &a->wids, &a->wtargets, data, o->seed, first + i));
        for (j = 0; j < T; j += run) { /* the zigzag's chunks, in local row order */
            int64_t pos = seq_pos(m, j, &run);
            memcpy((int32_t *)in.data + j, (const int32_t *)a->wids.data + pos, (size_t)run * sizeof(int32_t));
            memcpy((int32_t *)out.data + j, (const int32_t *)a->wtargets.data + pos, (size_t)run * sizeof(int32_t));
        }
    }
    if (dev) { /* the step's inputs: one copy each, not waited for */
        CHECK(dt_tensor_copy(g_ctx, &a->ids, &hi));
        CHECK(dt_tensor_copy(g_ctx, &a->targets, &ht));
    }
}

/* ---------------------------------------------------------------- the pipeline (--pp > 1)

   dt_pp_run (dt_parallel.h) calls these for the (chunk, micro-batch) pairs of this stage's list.
   A micro-batch's activations live from its forward to its last backward pass (one acts per pair
   in flight), so the stage holds what its schedule's bound says. */

typedef struct pstate {
    model *m;
    const opts *o;
    dt_gpt_data *data;
    int64_t per_micro, local_first, step;
    float dloss;
    int logging;            /* this step reads its loss (log_step) */
    acts *act;              /* [v * micro], by chunk * micro + micro-batch */
    acts *spare;            /* [v * micro]: chunk c's sets whose micro-batch ended, from c * micro */
    int *n_spare;           /* [v]: how many of them (taken again by the next forwards) */
    double loss_sum;        /* the last stage: this step's micro-batch losses */
    dt_comm *emb;           /* the embedding group: the stages of one (dp, tp), rank = stage */
    dt_comm_req *head_req;  /* the last stage: its head's wte gradient on the way to stage 0 */
} pstate;

/* The tokens of micro-batch i of this step (the same sequences as at pp 1). */
static void pipe_tokens(pstate *S, acts *a, int i) {
    load_tokens(S->m, a, S->o, S->data, S->step * S->o->batch + S->local_first + i * S->per_micro, S->per_micro);
}

static dt_status pipe_forward(void *user, int c, int i, dt_tensor *out, const dt_tensor *in) {
    pstate *S = (pstate *)user;
    model *m = S->m;
    int k = c * m->pp + m->st, lo = m->first[k], hi = m->first[k + 1], l;
    acts *a = &S->act[c * S->o->micro + i];
    /* a set this chunk used before, so that a step after the first makes none (the schedule
       bounds how many are in flight, and so how many are ever made) */
    if (S->n_spare[c] > 0) *a = S->spare[c * S->o->micro + --S->n_spare[c]];
    else acts_make(a, m, S->per_micro, S->o->recompute, lo, hi);
    if (k == 0 || k == m->nvs - 1) pipe_tokens(S, a, i);
    a->seq0 = S->step * S->o->batch + S->local_first + i * S->per_micro; /* the MoE's drop fingerprint */
    if (offloaded(a, lo)) offload_bind(a, lo); /* the chunk's input goes into its first block */
    if (k == 0) {
        gather(m, m->eunit);
        embed_fwd(m, a);
        release(m, m->eunit);
    } else {
        CHECK(dt_tensor_copy(g_ctx, &a->blk[lo].in, in));
    }
    for (l = lo; l < hi; l++) {
        gather_block(m, l, 0);
        offload_fwd_begin(a, l);
        block_fwd(m, a, &a->blk[l], l, l + 1 < hi ? &a->blk[l + 1].in : &a->xL);
        offload_fwd_end(a, l);
        release_block(m, l);
    }
    if (k < m->nvs - 1) return dt_tensor_copy(g_ctx, out, &a->xL);
    {
        float loss = 0;
        gather(m, m->eunit);
        head_fwd(m, a);
        xent_fwd(m, a, S->logging ? &loss : NULL);
        release(m, m->eunit);
        S->loss_sum += loss;
    }
    return DT_OK;
}

/* The zero-bubble split: BI (part INPUT) the blocks' input-gradient halves (block_bwd_part 1),
   BW (part WEIGHT) their weight halves, where sp is off and nothing is recomputed (both would
   overwrite what BW reads); otherwise BI runs the whole backward and BW only ends the micro-batch. */
static dt_status pipe_backward(void *user, int c, int i, dt_tensor *din, const dt_tensor *dout, dt_pp_part part) {
    pstate *S = (pstate *)user;
    model *m = S->m;
    int k = c * m->pp + m->st, lo = m->first[k], hi = m->first[k + 1], l;
    acts *a = &S->act[c * S->o->micro + i];
    int split = part != DT_PP_PART_FULL && !m->sp && !S->o->recompute;
    if (part == DT_PP_PART_WEIGHT && split)
        for (l = hi - 1; l >= lo; l--) {
            gather(m, m->bunit[l]);
            block_bwd_weights(m, &a->blk[l], l);
            release(m, m->bunit[l]);
        }
    if (part != DT_PP_PART_WEIGHT) {
        if (k == m->nvs - 1) {
            gather(m, m->eunit);
            head_bwd(m, a, S->dloss);
            release(m, m->eunit);
        } else {
            CHECK(dt_tensor_copy(g_ctx, &a->dres, dout));
        }
        for (l = hi - 1; l >= lo; l--) {
            gather_block(m, l, 1);
            offload_bwd_begin(a, l);
            block_bwd_part(m, a, &a->blk[l], l, S->o->recompute, split);
            release_block(m, l);
        }
        if (k == 0) {
            gather(m, m->eunit);
            embed_bwd(m, a);
            release(m, m->eunit);
        } else {
            CHECK(dt_tensor_copy(g_ctx, din, &a->dres));
        }
    }
    if (part != DT_PP_PART_INPUT) { /* the micro-batch is done: its set goes back to the chunk's spares */
        S->spare[c * S->o->micro + S->n_spare[c]++] = *a;
        memset(a, 0, sizeof *a);
    }
    return DT_OK;
}

/* Chunk c's last backward of the step has run on this stage: its units' gradients are final,
   their sync (ZeRO-0 buckets) may start while the other stages drain. The tied head's gradient
   goes to stage 0 first, which adds it into wte's before wte's unit is synced. */
static dt_status pipe_grads_done(void *user, int c) {
    pstate *S = (pstate *)user;
    model *m = S->m;
    int k = c * m->pp + m->st, l;
    if (k == m->nvs - 1 && !m->has_embed)
        CHECK(dt_comm_isend(S->emb, &m->wte_head_grad, 0, 1, &S->head_req));
    for (l = m->first[k + 1] - 1; l >= m->first[k]; l--) ready_block(m, l);
    if (k == 0 && !m->has_head) {
        CHECK(dt_comm_recv(S->emb, &m->wte_head_grad, m->pp - 1, 1));
        CHECK(dt_axpy(g_ctx, GRD(m, m->wte), 1.0f, &m->wte_head_grad));
    }
    if ((k == 0 && m->has_embed) || (k == m->nvs - 1 && !m->has_embed)) CHECK(dt_zero_grad_ready(m->z, m->eunit));
    return DT_OK;
}

/* ---------------------------------------------------------------- sampling */

/* n tokens after a one-token prompt, each drawn from the softmax of the last position's logits
   (temperature 1) with dt_rng_uniform(seed, stream, i): the same text at every layout. */
static void sample_text(model *m, int64_t n, uint64_t seed, int V256) {
    acts a;
    int64_t T = m->T, i, len = 1, j;
    int32_t *ctxt;
    dt_tensor row, full, hfull, hids; /* full on the model's device; the h* on the host */
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    acts_make(&a, m, 1, 0, 0, m->L);
    CHECK(dt_tensor_create_like(g_ctx, &hids, &a.ids, DT_DTYPE_DEFAULT, DT_CPU));
    ctxt = (int32_t *)hids.data;
    memset(ctxt, 0, (size_t)T * sizeof(int32_t));
    ctxt[0] = V256 ? '\n' : 50256; /* GPT-2's <|endoftext|> */
    d.shape[0] = m->Vp;
    CHECK(dt_tensor_create(g_ctx, &full, &d));
    CHECK(dt_tensor_create_like(g_ctx, &hfull, &full, DT_DTYPE_DEFAULT, DT_CPU));
    if (g_rank == 0) printf("sample (%lld tokens):\n", (long long)n);
    for (i = 0; i < n; i++) {
        double sum = 0, u, acc = 0;
        const float *lg;
        float mx = -INFINITY;
        int64_t pos = len - 1, pick = m->nvs - 1;
        CHECK(dt_tensor_copy(g_ctx, &a.ids, &hids));
        forward_logits(m, &a);
        release(m, m->eunit);
        CHECK(dt_tensor_view(g_ctx, &row, &a.logits, pos * m->Vl, 1, &m->Vl));
        if (m->tp > 1) CHECK(dt_comm_allgather(m->lay->tp_comm, &full, &row));
        else CHECK(dt_tensor_copy(g_ctx, &full, &row));
        CHECK(dt_tensor_copy(g_ctx, &hfull, &full));
        lg = (const float *)hfull.data;
        for (j = 0; j < m->V; j++) if (lg[j] > mx) mx = lg[j];
        for (j = 0; j < m->V; j++) sum += exp((double)lg[j] - mx);
        u = dt_rng_uniform(seed, 0x73616d706c65ull /* "sample" */, (uint64_t)i) * sum;
        for (j = 0; j < m->V; j++) { acc += exp((double)lg[j] - mx); if (acc > u) { pick = j; break; } }
        if (g_rank == 0) {
            if (V256) putchar(pick == '\n' || pick == '\t' || (pick >= 32 && pick < 127) ? (int)pick : '?');
            else printf("%lld ", (long long)pick);
        }
        if (len < T) ctxt[len++] = (int32_t)pick;
        else { memmove(ctxt, ctxt + 1, (size_t)(T - 1) * sizeof(int32_t)); ctxt[T - 1] = (int32_t)pick; }
    }
    if (g_rank == 0) { printf("\n"); fflush(stdout); }
    dt_tensor_free(g_ctx, &full);
    dt_tensor_free(g_ctx, &hfull);
    dt_tensor_free(g_ctx, &hids);
    acts_free(&a, m->L);
}

/* ---------------------------------------------------------------- the run */

/* f32 GEMM flop/s of this rank: the best of a few 512^3 dt_matmul_fwd (the MFU's denominator). */
static double gemm_peak(void) {
    dt_tensor a, b, c;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    double best = 1e30;
    int i;
    d.shape[0] = 512; d.shape[1] = 512;
    CHECK(dt_tensor_create(g_ctx, &a, &d)); CHECK(dt_tensor_create(g_ctx, &b, &d)); CHECK(dt_tensor_create(g_ctx, &c, &d));
    CHECK(dt_tensor_fill(g_ctx, &a, 0.5)); CHECK(dt_tensor_fill(g_ctx, &b, 0.25));
    /* on CUDA a GEMM returns when it is queued: dt_ctx_sync before the clock starts (the fills
       done) and before it stops (the GEMM done), so the time is the GEMM's (before the training
       steps, outside their counters; a no-op on the CPU) */
    CHECK(dt_ctx_sync(g_ctx));
    for (i = 0; i < 4; i++) {
        double t = now();
        CHECK(dt_matmul_fwd(g_ctx, &c, &a, &b, 0, 0, 1.0f, 0.0f));
        CHECK(dt_ctx_sync(g_ctx));
        t = now() - t;
        if (t < best) best = t;
    }
    dt_tensor_free(g_ctx, &a); dt_tensor_free(g_ctx, &b); dt_tensor_free(g_ctx, &c);
    return 2.0 * 512 * 512 * 512 / best;
}

/* Seconds this rank has spent in collectives on the layout's comms (dt_comm's statistics). */
static double comm_seconds(dt_layout *l, dt_comm *emb) {
    dt_comm *cs[11];
    double s = 0;
    int i, k;
    /* every group of the layout (each its own comm: ZeRO's dp x cp, the norm's dp x cp x tp, the
       experts' ep / edp / ep x tp), the world, and the pipeline's embedding group */
    cs[0] = l->tp_comm; cs[1] = l->dp_comm; cs[2] = l->world; cs[3] = l->pp_comm; cs[4] = l->cp_comm;
    cs[5] = l->dpcp_comm; cs[6] = l->dptp_comm; cs[7] = l->ep_comm; cs[8] = l->edp_comm; cs[9] = l->eptp_comm;
    cs[10] = emb;
    for (i = 0; i < 11; i++) {
        for (k = 0; k < DT_COLL_COUNT; k++) {
            dt_comm_stat st;
            if (cs[i] && dt_comm_stats(cs[i], &st, (dt_coll)k) == DT_OK) s += st.seconds;
        }
    }
    return s;
}

/* Seconds this rank has waited, blocked, in every group's collectives (dt_comm_wait_seconds). */
static double wait_seconds(dt_layout *l, dt_comm *emb) {
    dt_comm *cs[11];
    double s = 0;
    int i;
    cs[0] = l->tp_comm; cs[1] = l->dp_comm; cs[2] = l->world; cs[3] = l->pp_comm; cs[4] = l->cp_comm;
    cs[5] = l->dpcp_comm; cs[6] = l->dptp_comm; cs[7] = l->ep_comm; cs[8] = l->edp_comm; cs[9] = l->eptp_comm;
    cs[10] = emb;
    for (i = 0; i < 11; i++) s += dt_comm_wait_seconds(cs[i]);
    return s;
}

/* The last step's loss rides in the checkpoint, so a resumed run with no step left still ends
   on its "final: loss" line. */
static void save_loss(dt_train_state *st, double loss) {
    char v[64];
    snprintf(v, sizeof v, "%.9g", loss);
    CHECK(dt_train_state_set(g_ctx, st, "loss", v));
}

/* What a checkpoint must match that its tensors' shapes do not show: the layers (a run with fewer
   would load the first ones and drop the rest), the heads (the same qkv shape split another way)
   and the batch (the data cursor counts samples). */
static void model_key(const opts *o, char *v, size_t n) {
    snprintf(v, n, "layers %d heads %d kv-heads %d batch %lld", o->layers, o->heads, o->kv_heads ? o->kv_heads : o->heads,
             (long long)o->batch);
}

/* A named error about the run's configuration (every rank sees the same): rank 0 says it, all exit 1. */
static void fail(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static void fail(const char *fmt, ...) {
    va_list ap;
    if (g_rank == 0) {
        fprintf(stderr, "gpt: ");
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fprintf(stderr, "\n");
    } else sleep(10); /* mpirun ends the job at the first exit: give rank 0 the time to say why (it exits at once) */
    exit(1);
}

static void open_data(dt_gpt_data *d, const opts *o) {
    dt_gpt_data_desc dd;
    memset(&dd, 0, sizeof dd);
    glob_t g;
    memset(&g, 0, sizeof g);
    if (o->shards) {
        if (glob(o->shards, 0, NULL, &g) != 0 || g.gl_pathc == 0) fail("--shards '%s' matches no file", o->shards);
        dd.shards = (const char *const *)g.gl_pathv;
        dd.n_shards = (int)g.gl_pathc;
    } else dd.text = o->data;
    if (dt_gpt_data_open(g_ctx, d, &dd)) {
        if (g_rank == 0) fprintf(stderr, "gpt: %s\n", dt_ctx_error(g_ctx));
        exit(1);
    }
    if (o->shards) globfree(&g);
}

/* For a test that includes this file with GPT_NO_MAIN (tests/cuda_emu/k_gpt.cpp) and calls
   gpt_main: each step's loss (indexed by step), and the model just before it is freed. */
static double *g_step_losses;
/* ... and at the start (begin 1) and the end (begin 0) of each training step, on the step's ctx
   (before the first step's end resets its counters): k_gpt.cpp compares ctx->counters with the
   emulator's own counts over a step. */
static void (*g_on_step)(int begin, const dt_ctx *ctx, int64_t step, int logging);
static void (*g_on_done)(model *m, void *user);
static void *g_on_done_user;

/* Everything one run holds, so that main reads as the training loop and each phase of it is a
   function of its own. */
typedef struct trainer {
    dt_ctx ctx;
    dt_comm *world;
    int W;                              /* world size */
    opts o;
    dt_gpt_data data;
    dt_layout *lay;
    dt_arena *arena;
    model m;
    int64_t local_first, per_micro;     /* this dp rank's samples of a global batch, and per micro-batch */
    acts a;                             /* pp 1: one micro-batch's activations */
    pstate pl;                          /* pp > 1: the pipeline's state, models and schedule */
    dt_pp_schedule *sched;
    dt_pp_model pm;
    dt_pp_run_desc rd;
    dt_pp_run_stats rs;
    int pp_peak;                        /* the most micro-batches stage 0 held */
    FILE *log;                          /* --log, rank 0 */
    int64_t step, first_step, last_step;
    double loss;                        /* the last step's (or the checkpoint's) */
    double peak_flops, flops_per_token, n_params, t0, act_peak, base;
    double step_s;              /* the last step's wall time on this rank (--log's step_s) */
    int logging;                        /* this step reads its loss (is_logging_step) */
    double moe_aux, moe_dropped, moe_print, moe_lmax; /* MoE: the last logging step's, over every layer */
    double *moe_hist;                   /* MoE: [2][L][E] assignments, then kept ones, per expert, summed over the run */
    double *moe_busy;                   /* MoE: [L][divisors of E] the busiest ep rank's kept rows over its share, summed
                                           over the run's later half (moe_step) */
    int moe_busy_steps;
    /* --slow-every: this window's compute and collective seconds, the last check's verdict */
    double win_compute, win_comm, comm_before, step_t0;
    int win_steps, n_slow, slow[8];     /* the slow ranks the last check named (at most 8 listed) */
    double slow_median;                 /* that check's median compute per step, seconds */
    char (*hosts)[64];                  /* [W] each rank's host name (gathered at the first check) */
} trainer;

/* This process's rank among those of its host, from the launcher's environment (Open MPI,
   MPICH, Slurm; 0 without one): the ctx is made before the world, so MPI cannot say yet. */
static int local_rank(void) {
    const char *v[3];
    int i;
    v[0] = getenv("OMPI_COMM_WORLD_LOCAL_RANK"); v[1] = getenv("MPI_LOCALRANKID"); v[2] = getenv("SLURM_LOCALID");
    for (i = 0; i < 3; i++) if (v[i] && *v[i]) return atoi(v[i]);
    return 0;
}

/* The device of this rank: one per rank of a host (NCCL wants distinct devices), shared round
   robin when a host has fewer (dt_comm then stages through the host); dt_ctx_init names the
   error when there is none. */
static int local_device(void) {
    int r = local_rank();
#ifdef DT_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return r % n;
#endif
    return r;
}

/* The ctx (on --device), the world, the flags and the data. */
static void setup(trainer *t, int argc, char **argv) {
    dt_ctx_desc cdesc;
    int i;
    memset(&cdesc, 0, sizeof cdesc);
    for (i = 1; i + 1 < argc; i++) { /* the ctx's device and GEMMs before anything is made (parse checks) */
        if (!strcmp(argv[i], "--device") && !strcmp(argv[i + 1], "cuda")) cdesc.device = DT_CUDA_DEVICE;
        if (!strcmp(argv[i], "--tf32") && !strcmp(argv[i + 1], "1")) cdesc.tf32 = 1;
    }
#ifndef DT_CUDA
    cdesc.device = DT_CPU; /* parse names the error */
#endif
    cdesc.cuda_device = local_device();
    g_ctx = &t->ctx; /* so that a failing dt_ctx_init is reported with its own message */
    CHECK(dt_ctx_init(&t->ctx, &cdesc));
    { /* the world's settings come from two flags, read before the others (parse checks them) */
        dt_comm_desc wd;
        int i;
        memset(&wd, 0, sizeof wd);
        for (i = 1; i + 1 < argc; i++) {
            if (!strcmp(argv[i], "--host-size")) {
                char *end = NULL;
                long k = strtol(argv[i + 1], &end, 10);
                wd.host_size = end != argv[i + 1] && !*end && k > 0 && k <= 1 << 20 ? (int)k : 0;
            }
            if (!strcmp(argv[i], "--hier")) wd.hier = !strcmp(argv[i + 1], "on") ? 1 : !strcmp(argv[i + 1], "off") ? -1 : 0;
            if (!strcmp(argv[i], "--progress-us")) {
                char *end = NULL;
                long k = strtol(argv[i + 1], &end, 10);
                wd.progress_us = end != argv[i + 1] && !*end && k > 0 && k <= 1000000 ? (int)k : 0;
            }
        }
        CHECK(dt_comm_create_world(&t->ctx, &t->world, &wd));
    }
    g_rank = dt_comm_rank(t->world);
    t->W = dt_comm_size(t->world);
    parse(&t->o, argc, argv);
    if (t->o.timeout > 0) CHECK(dt_comm_set_timeout(t->world, t->o.timeout)); /* the layout's groups inherit it */
    open_data(&t->data, &t->o);
}

/* The layout as the planner sees it (dt_plan.h), from the flags. */
static dt_plan_layout plan_given(const opts *o) {
    dt_plan_layout l;
    memset(&l, 0, sizeof l);
    l.tp = o->tp; l.pp = o->pp; l.cp = o->cp; l.zero = o->zero; l.micro = o->micro; l.sp = o->sp;
    l.schedule = o->schedule; l.recompute = (dt_plan_recompute)o->recompute; l.ulysses = o->ulysses;
    l.offload = o->offload; l.ep = o->ep;
    return l;
}

/* --plan and --layout auto: the profile (read, or measured by every rank at once), the search,
   rank 0's table; --layout auto then takes the first layout into the flags (every rank computes
   the same search from the same profile: measured figures are the slowest rank's). */
static void plan_layout(trainer *t) {
    opts *o = &t->o;
    dt_plan_model pm;
    dt_plan_profile *pf;
    dt_plan_prediction top[64], mine;
    const dt_plan_prediction *best = NULL;
    dt_plan_search_desc sd;
    dt_plan_layout given = plan_given(o);
    int n = 0, total = 0, have = 0, r, mine_ok;
    double flag[1];
    char ls[160];
    FILE *f;
    if (!o->plan && !o->layout_auto) return;
    if ((o->device != DT_CPU && (o->dtype != DT_BF16 || o->moe_experts)) || (o->kv_heads && o->kv_heads < o->tp) ||
        o->dtype == DT_F16)
        fail("--plan / --layout auto: the planner models the CPU in f32 or bf16, and --device cuda in bf16 without "
             "--moe-experts (no --dtype f16, --kv-heads below --tp) for now");
    memset(&pm, 0, sizeof pm);
    pm.layers = o->layers; pm.width = o->width; pm.heads = o->heads; pm.kv_heads = o->kv_heads ? o->kv_heads : o->heads;
    pm.vocab = t->data.vocab_padded; pm.seq = o->seq; pm.batch = o->batch; pm.dtype = o->dtype;
    if (o->moe_experts) {
        pm.experts = o->moe_experts; pm.top_k = o->moe_topk; pm.moe_every = o->moe_every; pm.moe_shared = o->moe_shared;
        pm.capacity = o->moe_capacity;
        pm.balance = o->moe_aux == 0 && o->moe_balance == DT_MOE_AUX ? DT_MOE_NONE : o->moe_balance;
    }
    pf = (dt_plan_profile *)malloc(sizeof *pf);
    if (!pf) CHECK(DT_ERR_OOM);
    /* rank 0 decides and reads: a path only some hosts see cannot split the ranks between reading
       and the collective measuring, and every rank plans from rank 0's bytes */
    if (g_rank == 0 && o->plan_profile && (f = fopen(o->plan_profile, "rb"))) { fclose(f); have = 1; }
    flag[0] = have;
    CHECK(dt_comm_allreduce_f64(t->world, flag, 1, DT_REDUCE_MAX));
    have = flag[0] > 0;
    if (o->device == DT_CUDA_DEVICE) {
        /* CUDA: the machine's figures measured on the GPUs (or read: a machine file), the step
           modelled as on paper (flash attention, bf16 GEMMs on the tensor cores) */
        dt_plan_machine mc;
        memset(&mc, 0, sizeof mc);
        if (have) {
            dt_status st = g_rank == 0 ? dt_plan_machine_load(g_ctx, &mc, o->plan_profile) : DT_OK;
            flag[0] = st;
            if (st) fprintf(stderr, "gpt: --plan-profile: %s\n", dt_ctx_error(g_ctx));
            CHECK(dt_comm_allreduce_f64(t->world, flag, 1, DT_REDUCE_MAX));
            if (flag[0] != 0) fail("--plan-profile %s could not be read as a machine file (rank 0 said why)", o->plan_profile);
        } else {
            double t0 = dt_comm_now();
            CHECK(dt_plan_machine_measure(t->world, &pm, NULL, &mc));
            if (o->plan_profile && g_rank == 0) {
                char src[160];
                snprintf(src, sizeof src, "examples/gpt --device cuda --plan measured it in %.1f s for layers %d, width "
                         "%d, heads %d / %d, seq %lld", dt_comm_now() - t0, pm.layers, pm.width, pm.heads, pm.kv_heads,
                         (long long)pm.seq);
                CHECK(dt_plan_machine_save(g_ctx, &mc, o->plan_profile, src));
            }
        }
        { /* every rank plans from rank 0's figures */
            dt_status st = g_rank == 0 ? dt_plan_profile_paper(g_ctx, &mc, &pm, t->W, pf) : DT_OK;
            flag[0] = st;
            if (st) fprintf(stderr, "gpt: --plan: %s\n", dt_ctx_error(g_ctx));
            CHECK(dt_comm_allreduce_f64(t->world, flag, 1, DT_REDUCE_MAX));
            if (flag[0] != 0) fail("--plan: the machine's figures make no profile (rank 0 said why)");
            CHECK(dt_plan_profile_broadcast(t->world, pf, 0));
        }
    } else if (have) {
        dt_status st = g_rank == 0 ? dt_plan_profile_load(g_ctx, pf, o->plan_profile) : DT_OK;
        flag[0] = st;
        if (st) fprintf(stderr, "gpt: --plan-profile: %s\n", dt_ctx_error(g_ctx));
        CHECK(dt_comm_allreduce_f64(t->world, flag, 1, DT_REDUCE_MAX));
        if (flag[0] != 0) fail("--plan-profile %s could not be read (rank 0 said why)", o->plan_profile);
        CHECK(dt_plan_profile_broadcast(t->world, pf, 0));
        if (pf->world != t->W || memcmp(&pf->model, &pm, sizeof pm))
            fail("--plan-profile %s was measured for %d ranks and a model of %d layers, width %d, heads %d / %d, vocab "
                 "%lld, seq %lld, batch %lld, %s, %d experts (top %d, every %d, shared %d, capacity %g, %s); this run has "
                 "%d ranks and %d, %d, %d / %d, %lld, %lld, %lld, %s, %d (%d, %d, %d, %g, %s): remove the file to measure "
                 "again", o->plan_profile, pf->world, pf->model.layers, pf->model.width,
                 pf->model.heads, pf->model.kv_heads, (long long)pf->model.vocab, (long long)pf->model.seq,
                 (long long)pf->model.batch, dt_dtype_name(pf->model.dtype), pf->model.experts, pf->model.top_k,
                 pf->model.moe_every, pf->model.moe_shared, pf->model.capacity, dt_moe_balance_name(pf->model.balance),
                 t->W, pm.layers, pm.width, pm.heads, pm.kv_heads, (long long)pm.vocab, (long long)pm.seq,
                 (long long)pm.batch, dt_dtype_name(pm.dtype), pm.experts, pm.top_k, pm.moe_every, pm.moe_shared,
                 pm.capacity, dt_moe_balance_name(pm.balance));
    } else {
        CHECK(dt_plan_profile_measure(t->world, &pm, NULL, pf));
        if (o->plan_profile && g_rank == 0) CHECK(dt_plan_profile_save(g_ctx, pf, o->plan_profile));
    }
    if (o->n_moe_load) { /* the run's routing, which the profile's model leaves out (dt_plan_model.expert_load) */
        pf->model.expert_load = o->moe_load;
        pf->model.n_expert_load = o->n_moe_load;
    }
    memset(&sd, 0, sizeof sd);
    sd.mem_budget = o->plan_memory * 1e6;
    sd.recompute = 1;
    /* cp on cuda in bf16: the ring's blocks and Ulysses' whole-sequence heads both run the flash
       kernels the paper model times; f32 runs the ring's blocks by dt_attention_block's scalar
       kernels and keeps Ulysses' [T, T] scores, which it does not time: no cp */
    if (o->device == DT_CUDA_DEVICE && o->dtype != DT_BF16) sd.max_cp = 1;
    CHECK(dt_plan_search(g_ctx, pf, &sd, top, 64, &n, &total));
    for (r = 0; r < n && !best; r++) /* --sample runs at pp 1 and cp 1 only */
        if (!o->sample || (top[r].layout.pp == 1 && top[r].layout.cp == 1)) best = &top[r];
    mine_ok = best && o->layout_auto ? (mine = *best, 1) : dt_plan_predict(g_ctx, pf, &given, &mine) == DT_OK;
    if (g_rank == 0) {
        dt_strbuf sb;
        memset(&sb, 0, sizeof sb);
        sb.ctx = g_ctx;
        if (pf->paper)
            printf("plan: machine %s, %d ranks on %d host%s, %s; the step modelled from its figures; %d layouts valid%s\n",
                   pf->mach.name, pf->world, pf->hosts, pf->hosts > 1 ? "s" : "",
                   have ? "read from --plan-profile" : "measured on its GPUs", total,
                   o->plan_memory > 0 ? " within --plan-memory" : "");
        else
            printf("plan: profile of %s, %d ranks on %d host%s, %s in %.1f s; %d layouts valid%s\n", pf->machine, pf->world,
                   pf->hosts, pf->hosts > 1 ? "s" : "", have ? "read from --plan-profile, measured" : "measured",
                   pf->measure_s, total, o->plan_memory > 0 ? " within --plan-memory" : "");
        dt_plan_format(top, n < 5 ? n : 5, &sb);
        if (sb.text) fputs(sb.text, stdout);
        dt_strbuf_free(&sb);
        if (mine_ok) /* one line the validation bench reads */
            printf("plan: the layout %s (%s): predicted step %.6f s, %.0f tokens/s (compute %.2f ms, comm %.2f ms, "
                   "bubble %.2f ms, optimizer %.2f ms), memory %.3f MB per rank (params %.2f, grads %.2f, optimizer "
                   "%.2f, activations %.2f, transient %.2f)\n", o->layout_auto ? "chosen" : "given",
                   dt_plan_layout_string(&mine.layout, ls, sizeof ls),
                   mine.step_s, mine.tokens_per_s, mine.compute_s * 1e3, mine.comm_s * 1e3, mine.bubble_s * 1e3,
                   mine.optimizer_s * 1e3, mine.mem_total / 1e6, mine.mem_params / 1e6, mine.mem_grads / 1e6,
                   mine.mem_optimizer / 1e6, mine.mem_activations / 1e6, mine.mem_transient / 1e6);
        else printf("plan: the layout given: %s\n", dt_ctx_error(g_ctx));
        fflush(stdout);
    }
    if (!best)
        fail("--plan: no layout of this model fits %d ranks%s%s", t->W, o->plan_memory > 0 ? " within --plan-memory" : "",
             o->sample && n ? " at pp 1 and cp 1 (--sample)" : "");
    if (o->layout_auto) { /* the flags of the first layout */
        const dt_plan_layout *b = &best->layout;
        o->tp = b->tp; o->pp = b->pp; o->cp = b->cp; o->zero = b->zero; o->micro = b->micro; o->sp = b->sp;
        o->recompute = (int)b->recompute; o->ulysses = b->ulysses; o->offload = b->offload; o->ep = b->ep;
        if (b->pp > 1) o->schedule = b->schedule;
        o->chunks = o->schedule == DT_PP_INTERLEAVED && o->pp > 1 ? 2 : 1;
        if (g_rank == 0)
            printf("layout auto: %s (predicted %.0f tokens/s)\n", dt_plan_layout_string(b, ls, sizeof ls), best->tokens_per_s);
    }
    free(pf);
    if (o->plan) { /* printed: nothing to train */
        dt_comm_free(t->world);
        dt_ctx_shutdown(&t->ctx);
        exit(0);
    }
}

/* The layout's sizes, checked here with names before any collective; the pipeline's schedule. */
static void check_sizes(trainer *t) {
    const opts *o = &t->o;
    int W = t->W, dp = W / o->tp / o->pp / o->cp;
    int64_t Tl = o->seq / o->cp;
    if (W % ((int64_t)o->tp * o->pp * o->cp) && o->cp == 1)
        fail("--tp %d x --pp %d does not divide the world size %d", o->tp, o->pp, W);
    if (W % ((int64_t)o->tp * o->pp * o->cp))
        fail("--tp %d x --cp %d x --pp %d does not divide the world size %d", o->tp, o->cp, o->pp, W);
    if (o->seq % (2 * (int64_t)o->cp))
        fail("--seq %lld is not a multiple of 2 x --cp = %d (each cp rank holds two chunks of T / (2 cp))",
             (long long)o->seq, 2 * o->cp);
    if (o->cp > 1 && o->sample) fail("--sample with --cp %d: sampling runs at --cp 1 only", o->cp);
    if (o->cp > 1 && o->ulysses && (o->heads / o->tp) % o->cp)
        fail("--cp-kind ulysses: --heads %d / --tp %d = %d heads per tp rank do not divide over --cp %d", o->heads, o->tp,
             o->heads / o->tp, o->cp);
    if (o->offload > 0 && o->pp > 1 && o->schedule == DT_PP_ZB_H1 && !o->sp && !o->recompute)
        fail("--offload-activations with --schedule zb: the zero-bubble weight pass reads a block's activations "
             "after its input pass, when its slot holds another block's; use 1f1b or interleaved");
    if (o->kv_heads && o->heads % o->kv_heads)
        fail("--kv-heads %d does not divide --heads %d (each kv head serves heads / kv-heads query heads)", o->kv_heads,
             o->heads);
    if (o->kv_heads && o->kv_heads % o->tp && o->tp % o->kv_heads)
        fail("--kv-heads %d and --tp %d: expected a multiple of tp (the kv heads split over tp) or a divisor of it (each "
             "kv head replicated on tp / kv-heads ranks)", o->kv_heads, o->tp);
    if (o->cp > 1 && o->ulysses && o->kv_heads && (o->kv_heads < o->tp || (o->kv_heads / o->tp) % o->cp))
        fail("--cp-kind ulysses: --kv-heads %d over --tp %d leaves %d kv heads per tp rank, which do not divide over "
             "--cp %d", o->kv_heads, o->tp, o->kv_heads < o->tp ? 1 : o->kv_heads / o->tp, o->cp);
    if (o->ep > 1 && !o->moe_experts) fail("--ep %d without --moe-experts: expert parallelism splits experts", o->ep);
    if (o->n_moe_load) {
        int d, nd = 0;
        for (d = 1; d <= o->moe_experts; d++) nd += o->moe_experts % d == 0;
        if (!o->moe_experts || (o->n_moe_load != nd && o->n_moe_load != o->layers / o->moe_every * nd))
            fail("--moe-load has %d values: expected one per ep dividing --moe-experts %d (%d) or per MoE block and "
                 "such ep (%d x %d), as a run prints them", o->n_moe_load, o->moe_experts, nd,
                 o->moe_experts ? o->layers / o->moe_every : 0, nd);
    }
    if (o->moe_experts) {
        int nmoe = o->layers / o->moe_every;
        if ((dp * o->cp) % o->ep)
            fail("--ep %d does not divide dp x cp = %d x %d (expert parallelism lives inside the data-parallel ranks)",
                 o->ep, dp, o->cp);
        if (o->moe_experts % o->ep)
            fail("--moe-experts %d is not a multiple of --ep %d (each ep rank holds experts / ep of them)",
                 o->moe_experts, o->ep);
        if (o->moe_topk > o->moe_experts) fail("--moe-topk %d exceeds --moe-experts %d", o->moe_topk, o->moe_experts);
        if (o->cp > 1 && o->moe_capacity > 0)
            fail("--moe-experts with --cp %d and --moe-capacity %g: capacity is counted per sequence, which cp splits "
                 "over ranks; use --moe-capacity 0 (dropless) with --cp", o->cp, o->moe_capacity);
        if (o->recompute)
            fail("--moe-experts with --recompute %s: recomputing a block would route its tokens again (and count "
                 "them twice); use --recompute none", RECOMPUTE_NAMES[o->recompute]);
        if (o->offload > 0) fail("--moe-experts with --offload-activations: not built yet");
        if (o->pp > 1 && o->schedule == DT_PP_ZB_H1)
            fail("--moe-experts with --schedule zb: the weight pass is not split for the experts; use gpipe, 1f1b or "
                 "interleaved");
        if (o->moe_balance == DT_MOE_AUX && o->pp > 1 && o->schedule != DT_PP_GPIPE)
            fail("--moe-balance aux with --schedule %s: the aux loss's gradient uses f over the step's whole batch, so "
                 "every forward must run before the first backward: --schedule gpipe (the default with MoE), or "
                 "--moe-balance bias", dt_pp_kind_name(o->schedule));
        if (o->moe_balance == DT_MOE_AUX && o->pp == 1 && o->micro > 1)
            fail("--moe-balance aux with --micro %d at --pp 1: a micro-batch's backward would run before the next "
                 "one's forward, but the aux loss's gradient uses f over the whole batch; use --micro 1, --moe-balance "
                 "bias, or --pp > 1 with --schedule gpipe", o->micro);
        if (o->moe_balance == DT_MOE_BIAS && o->ckpt && nmoe * ((o->moe_experts + 7) / 8) > 24)
            fail("--moe-balance bias with --ckpt: the biases ride in the checkpoint's train state, 8 experts a key, "
                 "at most 24 keys; %d MoE blocks x %d experts need %d", nmoe, o->moe_experts,
                 nmoe * ((o->moe_experts + 7) / 8));
    }
    if (o->heads % o->tp) fail("--tp %d does not divide --heads %d", o->tp, o->heads);
    if (o->width % o->heads) fail("--heads %d does not divide --width %d", o->heads, o->width);
    if (t->data.vocab_padded % o->tp)
        fail("--tp %d does not divide the padded vocab %lld", o->tp, (long long)t->data.vocab_padded);
    if (o->batch % ((int64_t)dp * o->micro))
        fail("--batch %lld is not a multiple of dp x micro = %d x %d", (long long)o->batch, dp, o->micro);
    if (o->sp && (o->batch / dp / o->micro * Tl) % o->tp)
        fail("--sp 1: a micro-batch's %lld rows (sequences x --seq / --cp) are not a multiple of --tp %d",
             (long long)(o->batch / dp / o->micro * Tl), o->tp);
    if (o->pp > 1) {
        dt_pp_desc sd;
        memset(&sd, 0, sizeof sd);
        if (o->layers < o->pp * o->chunks)
            fail("--pp %d x %d chunks per stage (--schedule %s) = %d virtual stages but --layers %d: each needs a "
                 "block", o->pp, o->chunks, dt_pp_kind_name(o->schedule), o->pp * o->chunks, o->layers);
        if (o->zero > 1) fail("--zero %d with --pp %d: the pipeline takes ZeRO 0 or 1", o->zero, o->pp);
        if (o->sample) fail("--sample with --pp %d: sampling runs at --pp 1 only", o->pp);
        sd.kind = o->schedule; sd.stages = o->pp; sd.micro = o->micro; sd.chunks = o->chunks; sd.n_layers = o->layers;
        if (dt_pp_schedule_create(&t->ctx, &t->sched, &sd))
            fail("--schedule %s --pp %d --micro %d: %s", dt_pp_kind_name(o->schedule), o->pp, o->micro,
                 dt_ctx_error(&t->ctx));
    }
}

/* The MoE layers of this stage's MoE blocks, and the run's routing totals (--moe-experts). */
static void moe_make(trainer *t) {
    const opts *o = &t->o;
    model *m = &t->m;
    dt_moe_desc md;
    int l;
    if (!o->moe_experts) return;
    memset(&md, 0, sizeof md);
    md.experts = o->moe_experts; md.top_k = o->moe_topk; md.width = o->width; md.hidden = 4 * (int64_t)o->width;
    md.seq = o->seq / o->cp; md.capacity = o->moe_capacity; md.renorm = o->moe_renorm; md.balance = o->moe_balance;
    md.aux_coef = o->moe_aux; md.micro = o->micro;
    if (o->moe_aux == 0 && o->moe_balance == DT_MOE_AUX) md.balance = DT_MOE_NONE; /* --moe-aux 0: no balancing */
    for (l = 0; l < m->L; l++)
        if (m->xunit[l] >= 0) CHECK(dt_moe_create(t->lay, &m->moe[l], &md));
    t->moe_hist = (double *)dt_alloc_zeroed(&t->ctx, 2 * (size_t)m->L * (size_t)o->moe_experts * sizeof(double));
    t->moe_busy = (double *)dt_alloc_zeroed(&t->ctx, (size_t)m->L * (size_t)o->moe_experts * sizeof(double));
    if (!t->moe_hist || !t->moe_busy) CHECK(DT_ERR_OOM);
}

/* After the optimizer step: each MoE layer's step (the bias update, its counts reset); on a
   logging step the totals over the stages' layers: the aux loss, the tokens dropped and the most
   loaded expert over the mean. Collective over the stage's dp x cp, then (logging) pp. In the
   run's later half, for --moe-load: at each ep dividing E, the busiest ep rank's kept rows over its
   uniform share (its E / ep experts' kept over assigned x (E / ep) / E), as the step's layer waits
   for it; the mean over steps is what a step takes, the max of the mean loads is not (which rank
   is the busiest moves from step to step). */
static void moe_step(trainer *t) {
    model *m = &t->m;
    double v[4] = {0, 0, 0, 0};
    int l, e, E = t->o.moe_experts, later = t->step >= t->first_step + (t->last_step - t->first_step) / 2;
    if (!E) return;
    t->moe_busy_steps += later;
    for (l = 0; l < m->L; l++) {
        dt_moe_stats st;
        int d, j = 0;
        if (!m->moe[l]) continue;
        CHECK(dt_moe_step_end(m->moe[l], &st));
        v[0] += st.aux;
        v[1] += (double)st.dropped;
        v[2] += (double)st.drop_print;
        if (st.load_mean > 0 && st.load_max / st.load_mean > v[3]) v[3] = st.load_max / st.load_mean;
        for (e = 0; e < E; e++) {
            t->moe_hist[l * E + e] += (double)st.load[e];
            t->moe_hist[(m->L + l) * E + e] += (double)st.kept[e];
        }
        for (d = 1; later && st.assigned > 0 && d <= E; d++) { /* d: an ep dividing E */
            double most = 0;
            int r, El = E / d;
            if (E % d) continue;
            for (r = 0; r < d; r++) {
                double sum = 0;
                for (e = r * El; e < (r + 1) * El; e++) sum += (double)st.kept[e];
                most = sum > most ? sum : most;
            }
            t->moe_busy[l * E + j++] += most * d / (double)st.assigned;
        }
    }
    if (!t->logging) return;
    CHECK(dt_comm_allreduce_f64(t->lay->pp_comm, v, 3, DT_REDUCE_SUM));
    CHECK(dt_comm_allreduce_f64(t->lay->pp_comm, v + 3, 1, DT_REDUCE_MAX));
    t->moe_aux = v[0]; t->moe_dropped = v[1]; t->moe_print = v[2]; t->moe_lmax = v[3];
}

/* The layout, this rank's share of the model, its arena and the ZeRO object (with AdamW inside). */
static void build_model(trainer *t) {
    const opts *o = &t->o;
    dt_layout_desc ld;
    dt_arena_desc ad;
    dt_zero_desc zd;
    int64_t local_count;
    memset(&ld, 0, sizeof ld);
    memset(&ad, 0, sizeof ad);
    memset(&zd, 0, sizeof zd);
    ld.tp = o->tp; ld.pp = o->pp; ld.cp = o->cp; ld.ep = o->ep;
    CHECK(dt_layout_create(t->world, &t->lay, &ld));
    model_make(&t->m, o, t->data.vocab, t->data.vocab_padded, t->lay);
    moe_make(t);
    if (o->trace) {
        CHECK(dt_trace_create(t->world, &t->m.tr));
        CHECK(dt_trace_attach(t->m.tr, t->lay->tp_comm));
        CHECK(dt_trace_attach(t->m.tr, t->lay->dp_comm));
        CHECK(dt_trace_attach(t->m.tr, t->lay->dpcp_comm)); /* the gradients' group, also at cp 1 */
        if (t->lay->cp > 1) CHECK(dt_trace_attach(t->m.tr, t->lay->cp_comm));
        if (t->lay->dptp_comm != t->lay->dp_comm) CHECK(dt_trace_attach(t->m.tr, t->lay->dptp_comm)); /* ZeRO of tp shards */
        g_tr = t->m.tr;
    }
    ad.units = t->m.units;
    CHECK(dt_arena_create(&t->ctx, &t->arena, &t->m.ps, &ad));
    if (o->moe_experts) { /* the experts' units sync over the ranks that hold the same experts */
        int l, *ex = (int *)dt_alloc_zeroed(&t->ctx, (size_t)(t->arena->n_units + 1) * sizeof(int));
        if (!ex) CHECK(DT_ERR_OOM);
        for (l = 0; l < t->m.L; l++)
            if (t->m.xunit[l] >= 0) ex[t->m.xunit[l]] = 1;
        zd.expert_units = ex;
    }
    zd.stage = o->zero;
    zd.opt.kind = DT_OPT_ADAMW;
    zd.opt.lr = o->lr > 0 ? o->lr : DT_OPT_ZERO; /* --lr 0 is a frozen run (dt_opt reads 0 as its default) */
    zd.opt.beta1 = 0.9; zd.opt.beta2 = 0.95; /* GPT-2 / llm.c */
    zd.opt.weight_decay = o->wd > 0 ? o->wd : DT_OPT_ZERO;
    zd.opt.clip_norm = o->clip;
    zd.opt.accum_steps = o->micro;
    zd.opt.stochastic_rounding = o->sr;
    zd.opt.rounding_seed = o->seed;
    zd.opt.schedule.kind = DT_LR_COSINE;
    zd.opt.schedule.warmup_steps = o->warmup < o->steps ? o->warmup : 0;
    zd.opt.schedule.total_steps = o->steps > 0 ? o->steps : 1;
    zd.opt.schedule.min_lr = o->lr * o->min_lr_frac;
    CHECK(dt_zero_create(t->lay, &t->m.z, t->arena, &zd));
    dt_release(&t->ctx, (void *)zd.expert_units);
    CHECK(dt_layout_batch_range(t->lay, o->batch, &t->local_first, &local_count));
    t->per_micro = local_count / o->micro;
}

/* pp > 1: the embedding group and the model the pipeline runtime calls. */
static void build_pipeline(trainer *t) {
    const opts *o = &t->o;
    pstate *pl = &t->pl;
    int64_t N = t->per_micro * (o->seq / o->cp);
    /* the embedding group: this (dp, tp)'s stages, a comm of their own so its messages never
       meet the runtime's on pp_comm */
    CHECK(dt_comm_split(t->world, &pl->emb, (t->lay->dp_rank * t->lay->cp + t->lay->cp_rank) * t->lay->tp + t->lay->tp_rank,
                        t->lay->pp_rank));
    if (t->ctx.device == DT_CUDA_DEVICE) { /* a group's first device collective makes its NCCL communicator,
                                              which the device sends below need (dt_comm.h, "NCCL") */
        dt_tensor one;
        dt_tensor_desc d = {DT_F32, DT_CUDA_DEVICE, {1}, 1};
        CHECK(dt_tensor_create(&t->ctx, &one, &d));
        CHECK(dt_comm_allreduce(pl->emb, &one, DT_REDUCE_SUM));
        dt_tensor_free(&t->ctx, &one);
    }
    pl->m = &t->m; pl->o = o; pl->data = &t->data; pl->per_micro = t->per_micro; pl->local_first = t->local_first;
    pl->act = (acts *)dt_alloc(&t->ctx, (size_t)t->m.v * (size_t)o->micro * sizeof(acts));
    if (!pl->act) CHECK(DT_ERR_OOM);
    memset(pl->act, 0, (size_t)t->m.v * (size_t)o->micro * sizeof(acts));
    pl->spare = (acts *)dt_alloc(&t->ctx, (size_t)t->m.v * (size_t)o->micro * sizeof(acts));
    pl->n_spare = (int *)dt_alloc(&t->ctx, (size_t)t->m.v * sizeof(int));
    if (!pl->spare || !pl->n_spare) CHECK(DT_ERR_OOM);
    memset(pl->n_spare, 0, (size_t)t->m.v * sizeof(int));
    t->pm.user = pl;
    t->pm.forward = pipe_forward;
    t->pm.backward = pipe_backward;
    t->pm.grads_done = pipe_grads_done;
    t->pm.act.shape[0] = o->sp ? N / o->tp : N; /* the residual stream's rows on this rank */
    t->pm.act.shape[1] = o->width;
    t->rd.trace = t->m.tr;
}

static void moe_bias_load(trainer *t, const dt_train_state *st);

/* --ckpt's directory and --trace's file (rank 0 writes them: checked before the first step, not
   found out after the last), --resume's checkpoint, --log's file; 0 on every rank when one
   cannot be had. */
static int open_outputs(trainer *t) {
    opts *o = &t->o;
    double bad = 0;
    struct stat sb;
    if (g_rank == 0) {
        FILE *f;
        if (o->ckpt && mkdir(o->ckpt, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "gpt: cannot create --ckpt %s: %s\n", o->ckpt, strerror(errno));
            bad = 1;
        } else if (o->ckpt && (stat(o->ckpt, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
            fprintf(stderr, "gpt: --ckpt %s is not a directory\n", o->ckpt);
            bad = 1;
        }
        if (o->trace && !(f = fopen(o->trace, "a"))) {
            fprintf(stderr, "gpt: cannot write --trace %s: %s\n", o->trace, strerror(errno));
            bad = 1;
        } else if (o->trace) {
            fclose(f);
        }
    }
    CHECK(dt_comm_allreduce_f64(t->world, &bad, 1, DT_REDUCE_SUM)); /* every rank stops, or none */
    if (bad) return 0;
    if (o->resume) {
        dt_train_state st;
        dt_checkpoint_desc cd;
        memset(&cd, 0, sizeof cd);
        memset(&st, 0, sizeof st);
        cd.dir = o->ckpt;
        CHECK(dt_zero_checkpoint_load(t->m.z, &st, &cd));
        t->step = st.step;
        moe_bias_load(t, &st);
        if (dt_train_state_get(&st, "loss")) t->loss = strtod(dt_train_state_get(&st, "loss"), NULL); /* a run with no step left */
        {
            char want[128];
            const char *had = dt_train_state_get(&st, "model"); /* checkpoints from before it have none */
            model_key(o, want, sizeof want);
            if (had && strcmp(had, want) != 0)
                fail("--resume: the checkpoint in %s was trained with %s; this run asks for %s (give the same flags)",
                     o->ckpt, had, want);
        }
        if (st.rng_seed != o->seed) {
            if (g_rank == 0) fprintf(stderr, "gpt: --seed %llu, the checkpoint was trained with seed %llu: resuming with %llu\n",
                                     (unsigned long long)o->seed, (unsigned long long)st.rng_seed, (unsigned long long)st.rng_seed);
            o->seed = st.rng_seed;
        }
    }
    t->first_step = t->step;
    if (g_rank == 0 && o->log && !(t->log = fopen(o->log, o->resume ? "a" : "w"))) {
        fprintf(stderr, "gpt: cannot open --log %s\n", o->log);
        bad = 1;
    }
    CHECK(dt_comm_allreduce_f64(t->world, &bad, 1, DT_REDUCE_SUM));
    return !bad;
}

/* The MFU's numbers (this machine's GEMM peak, llm.c's flops per token) and the run's plan:
   model, layout, pipeline, memory per rank. */
static void print_plan(trainer *t) {
    const opts *o = &t->o;
    const model *m = &t->m;
    dt_zero_memory zm;
    char lstr[64];
    int i, k;
    t->peak_flops = gemm_peak() * t->W;
    for (i = 0, t->n_params = 0; i < m->ps.count; i++) { /* the whole model's, not this rank's shards */
        double e = 1;
        for (k = 0; k < m->ps.items[i]->value.ndim; k++) e *= (double)m->ps.items[i]->global_shape[k];
        t->n_params += e;
    }
    t->flops_per_token = 6.0 * t->n_params + 6.0 * o->layers * o->width * (double)o->seq; /* llm.c's count, fwd + bwd */
    if (o->moe_experts) { /* a token visits k of the E experts: count those, not all */
        double ex = 0;
        for (i = 0; i < m->ps.count; i++)
            if (moe_unit(m, m->units[i])) {
                double e = 1;
                for (k = 0; k < m->ps.items[i]->value.ndim; k++) e *= (double)m->ps.items[i]->global_shape[k];
                ex += e;
            }
        t->flops_per_token -= 6.0 * ex * (o->moe_experts - o->moe_topk) / o->moe_experts;
    }
    CHECK(dt_zero_memory_get(m->z, &zm));
    if (!o->quiet) { /* the host grid (collective), with a warning where a tp group spans hosts */
        dt_strbuf sb;
        memset(&sb, 0, sizeof sb);
        sb.ctx = g_ctx;
        CHECK(dt_layout_describe(t->lay, &sb));
        if (g_rank == 0 && sb.text) fputs(sb.text, stdout);
        dt_strbuf_free(&sb);
    }
    if (g_rank != 0 || o->quiet) return;
    printf("gpt: %d layers, %d heads (%d kv heads%s), width %d, context %lld, vocab %lld (padded %lld), %lld params; "
           "data %s (%lld tokens)\n", o->layers, o->heads, o->kv_heads ? o->kv_heads : o->heads,
           o->kv_heads && o->kv_heads != o->heads ? (o->kv_heads < o->tp ? ", grouped-query, each kv head whole on "
           "tp / kv-heads ranks" : ", grouped-query") : "", o->width, (long long)o->seq, (long long)t->data.vocab,
           (long long)t->data.vocab_padded, (long long)t->n_params, o->shards ? o->shards : o->data,
           (long long)t->data.n_tokens);
    printf("layout %s on %d ranks, zero %d, sp %d, micro %d, recompute %s, dtype %s; global batch %lld x %lld "
           "tokens; GEMM peak %.1f GFLOP/s (all ranks)\n", dt_layout_string(t->lay, lstr, sizeof lstr), t->W, o->zero,
           o->sp, o->micro, RECOMPUTE_NAMES[o->recompute],
           dt_dtype_name(o->dtype), (long long)o->batch, (long long)o->seq, t->peak_flops / 1e9);
    if (o->recompute || m->lse_attn) { /* what the backward computes twice, in llm.c's units: GEMM FLOPs (the
                                          block's 12C^2 + 13C params twice per token, attention's 2CT), the
                                          elementwise ops (layernorm, gelu, softmax's exp) not counted */
        double L = o->layers, C = o->width, T = (double)o->seq, blk = 2.0 * L * (12.0 * C * C + 13.0 * C);
        double again = o->recompute == 1 ? blk + 2.0 * L * C * T : o->recompute == 2 ? 2.0 * L * C * T : 0.0;
        double qk = m->lse_attn ? L * C * T : 0.0; /* lse attention's backward makes P from Q K^T again */
        printf("recompute %s: the backward computes again %.3g GFLOP per step, %.2f%% of the step's %.3g GFLOP "
               "(6N + 6LCT per token)%s\n", RECOMPUTE_NAMES[o->recompute], (again + qk) * (double)o->batch * T / 1e9,
               100.0 * (again + qk) / t->flops_per_token, t->flops_per_token * (double)o->batch * T / 1e9,
               qk > 0 ? "; of it Q K^T in attention's backward (lse kept, not the [T, T] scores): LCT per token" : "");
    }
    if (o->cp > 1 && o->ulysses) /* dt_parallel.h's >>cp: q, k, v out and the output back, (CP-1)/CP of each */
        printf("context parallel: cp %d (ulysses), %lld tokens of each sequence per rank (chunks %d and %d of %d), %lld "
               "heads of the whole sequence in attention; all-to-all sent per rank and layer: %.3f MB forward, %.3f MB "
               "backward\n", o->cp, (long long)(o->seq / o->cp), t->lay->cp_rank, 2 * o->cp - 1 - t->lay->cp_rank, 2 * o->cp,
               (long long)(o->heads / o->tp / o->cp),
               (double)(o->cp - 1) / o->cp * (double)(o->batch / t->lay->dp) * (double)(o->seq / o->cp) * (double)(m->Wl + m->Cl) * 4 / 1e6,
               (double)(o->cp - 1) / o->cp * (double)(o->batch / t->lay->dp) * (double)(o->seq / o->cp) * (double)(m->Wl + m->Cl) * 4 / 1e6);
    else if (o->cp > 1) /* dt_parallel.h's >>cp: K/V of the two chunks, CP - 1 hops; backward K/V again and CP hops of dK/dV */
        printf("context parallel: cp %d (ring), %lld tokens of each sequence per rank (chunks %d and %d of %d); K/V "
               "sent per rank and layer: %.3f MB forward, %.3f MB backward; attention pairs per rank %lld (%s)\n", o->cp,
               (long long)(o->seq / o->cp), t->lay->cp_rank, 2 * o->cp - 1 - t->lay->cp_rank, 2 * o->cp,
               2.0 * (o->cp - 1) * (double)(o->batch / t->lay->dp) * (double)(o->seq / o->cp) * (double)m->Ckvl * 4 / 1e6,
               2.0 * (2 * o->cp - 1) * (double)(o->batch / t->lay->dp) * (double)(o->seq / o->cp) * (double)m->Ckvl * 4 / 1e6,
               (long long)dt_cp_attention_pairs(o->cp, t->lay->cp_rank, o->seq), "per sequence and head, equal on every cp rank");
    if (o->moe_experts) { /* dt_parallel.h's >>moe: the kept assignments travel, (ep-1)/ep of them off-rank */
        double El = (double)o->moe_experts / o->ep, C = o->width, rows = (double)(o->batch / t->lay->dp / t->lay->cp) * o->seq;
        printf("moe: %d experts in %d of %d blocks (every %d), top-%d%s, %s, balance %s; ep %d x edp %d: %.0f experts "
               "per rank, %.2f MB of their values; all-to-all per rank and MoE block: about %.3f MB each way forward "
               "and backward (tokens x k x C x 4 B x (ep-1)/ep, capacity aside)\n", o->moe_experts,
               o->layers / o->moe_every, o->layers, o->moe_every, o->moe_topk, o->moe_renorm ? " renormalised" : "",
               o->moe_capacity > 0 ? "capacity per sequence" : "dropless", dt_moe_balance_name(o->moe_balance),
               t->lay->ep, t->lay->edp, El, El * (8.0 * C * C + 5.0 * C) / o->tp * dt_dtype_size(o->dtype) / 1e6,
               rows * o->moe_topk * C * 4 * (o->ep - 1) / o->ep / 1e6);
        if (o->moe_capacity > 0)
            printf("moe: capacity factor %g: each expert keeps at most %lld of a sequence's %lld x %d assignments\n",
                   o->moe_capacity, (long long)ceil(o->moe_capacity * (double)o->seq * o->moe_topk / o->moe_experts),
                   (long long)o->seq, o->moe_topk);
    }
    if (o->pp > 1) {
        printf("pipeline: pp %d, schedule %s, %d chunk%s per stage, %d micro-batches; blocks per virtual stage:",
               o->pp, dt_pp_kind_name(o->schedule), m->v, m->v > 1 ? "s" : "", o->micro);
        for (k = 0; k < m->nvs; k++) printf(" %d", m->first[k + 1] - m->first[k]);
        printf("%s; embedding on stage 0, head and loss on stage %d\n", o->layers % m->nvs ? " (uneven)" : "",
               o->pp - 1);
    }
    printf("memory per rank: params %.2f MB, grads %.2f MB, master %.2f MB, optimizer %.2f MB, total %.2f MB "
           "(%s: %.2f MB); activations %.2f MB%s\n", zm.param_bytes / 1e6, zm.grad_bytes / 1e6,
           zm.master_bytes / 1e6, zm.state_bytes / 1e6, zm.total_bytes / 1e6, zm.formula ? zm.formula : "?",
           zm.formula_bytes / 1e6, t->a.bytes / 1e6, o->pp > 1 ? " (the pipeline's: per micro-batch in flight, below)" : "");
    fflush(stdout);
}

/* pp > 1: one schedule is the whole step (its micro-batches, one sync); returns this rank's
   share of the summed micro-batch losses. */
static double pipeline_step(trainer *t) {
    model *m = &t->m;
    pstate *pl = &t->pl;
    float dloss = 0;
    CHECK(dt_zero_micro_begin(m->z, &dloss, t->o.micro - 1));
    pl->dloss = dloss;
    m->moe_scale = dloss * (float)t->o.micro;
    pl->step = t->step;
    pl->loss_sum = 0;
    pl->logging = t->logging;
    if (m->has_embed) { /* the tied head's weight for the last stage */
        gather(m, m->eunit);
        CHECK(dt_comm_send(pl->emb, WVAL(m, m->wte), t->o.pp - 1, 2));
        release(m, m->eunit);
    }
    if (m->has_head) CHECK(dt_comm_recv(pl->emb, &m->wte_head, 0, 2));
    CHECK(dt_zero_backward_begin(m->z));
    OP("pipeline (dt_pp_run)", dt_pp_run(t->lay, &t->rs, t->sched, &t->pm, &t->rd));
    if (t->rs.peak > t->pp_peak) t->pp_peak = t->rs.peak;
    if (pl->head_req) {
        CHECK(dt_comm_wait(pl->head_req));
        pl->head_req = NULL;
    }
    if (m->wte_head_grad.data) CHECK(dt_tensor_fill(&t->ctx, &m->wte_head_grad, 0.0));
    return m->has_head && t->lay->tp_rank == 0 ? pl->loss_sum : 0; /* one copy of each loss */
}

/* One optimizer step: its micro-batches forward and backward, the gradient sync and update
   (dt_zero_step), and the global batch's mean loss into t->loss. */
/* A step whose loss someone reads: printed (--print-every, the first and the last), written
   (--log: every step), checkpointed, or wanted by a test (g_step_losses). The others leave the
   loss on the device, and on CUDA do not wait for it. The same on every rank. */
static int is_logging_step(const trainer *t) {
    const opts *o = &t->o;
    int64_t n = t->step + 1;
    return g_step_losses || o->log || n == t->last_step || n == o->steps ||
           (!o->quiet && (t->step == t->first_step || (o->print_every && n % o->print_every == 0))) ||
           (o->ckpt && o->ckpt_every && n % o->ckpt_every == 0);
}

/* One optimizer step: its micro-batches forward and backward, the gradient sync and update
   (dt_zero_step), and on a logging step the global batch's mean loss into t->loss. */
static void train_step(trainer *t, dt_opt_step_info *info) {
    const opts *o = &t->o;
    double sums[1] = {0};
    int mi;
    dt_cuda_counters before = t->ctx.counters, step, none;
    memset(info, 0, sizeof *info);
    memset(&none, 0, sizeof none);
    memset(&g_read, 0, sizeof g_read);
    t->logging = is_logging_step(t);
    if (g_on_step) g_on_step(1, &t->ctx, t->step, t->logging);
    if (o->pp > 1) sums[0] = pipeline_step(t);
    for (mi = 0; mi < o->micro && o->pp == 1; mi++) {
        float dloss = 0;
        CHECK(dt_zero_micro_begin(t->m.z, &dloss, mi));
        t->m.moe_scale = dloss * (float)o->micro;
        load_tokens(&t->m, &t->a, o, &t->data, t->step * o->batch + t->local_first + mi * t->per_micro, t->per_micro);
        sums[0] += train_micro(&t->m, &t->a, dloss, o->recompute, t->logging);
    }
    {   /* info (the grad norm, the lr) only for a logging step's line: its read counted apart too;
           the same optimizer step without it is measured on the steps that do not log */
        dt_cuda_counters b = t->ctx.counters;
        OP("optimizer step (dt_zero_step)", dt_zero_step(t->m.z, t->logging ? info : NULL));
        if (t->logging) counters_add(&g_read, &t->ctx.counters, &b, 1);
    }
    moe_step(t);
    memset(&step, 0, sizeof step); /* this step's counts less its loss reads */
    counters_add(&step, &t->ctx.counters, &before, 1);
    counters_add(&step, &g_read, &none, -1);
    if (g_on_step) g_on_step(0, &t->ctx, t->step, t->logging);
    if (t->step > t->first_step) counters_max(&g_worst, &step);
    else dt_ctx_counters_reset(&t->ctx); /* the first step sets up what the others reuse */
    if (t->logging) {
        /* each rank's loss is the mean over its tokens, and every rank of dp x cp holds as many */
        CHECK(dt_comm_allreduce_f64(o->pp > 1 ? t->world : t->lay->dpcp_comm, sums, 1, DT_REDUCE_SUM));
        t->loss = sums[0] / ((double)o->micro * t->lay->dp * t->lay->cp);
        if (g_step_losses) g_step_losses[t->step] = t->loss;
    }
    if (t->step == t->first_step) t->act_peak = (double)dt_peak_bytes(&t->ctx) - t->base;
}

/* --moe-balance bias: every MoE layer's bias (every stage's, gathered over pp: rank 0's train
   state is the one saved) as keys "moe_bias.<block>.<part>" of 8 floats each ("%a": exact). */
static void moe_bias_save(trainer *t, dt_train_state *st) {
    model *m = &t->m;
    int l, e, E = t->o.moe_experts;
    double *b;
    if (!E || t->o.moe_balance != DT_MOE_BIAS) return;
    b = (double *)dt_alloc_zeroed(&t->ctx, (size_t)m->L * (size_t)E * sizeof(double));
    if (!b) CHECK(DT_ERR_OOM);
    for (l = 0; l < m->L; l++)
        for (e = 0; m->moe[l] && e < E; e++) b[l * E + e] = dt_moe_bias(m->moe[l])[e];
    CHECK(dt_comm_allreduce_f64(t->lay->pp_comm, b, m->L * E, DT_REDUCE_SUM)); /* one stage holds each */
    for (l = 0; l < m->L; l++) {
        int part;
        if (!moe_block(&t->o, l)) continue;
        for (part = 0; part * 8 < E; part++) {
            char key[64], val[DT_CKPT_VALUE_MAX];
            size_t at = 0;
            for (e = part * 8; e < E && e < part * 8 + 8; e++)
                at += (size_t)snprintf(val + at, sizeof val - at, "%s%a", e > part * 8 ? "," : "", (double)(float)b[l * E + e]);
            snprintf(key, sizeof key, "moe_bias.%d.%d", l, part);
            CHECK(dt_train_state_set(&t->ctx, st, key, val));
        }
    }
    dt_release(&t->ctx, b);
}

/* ... and back, into this stage's layers (a checkpoint without them: the biases stay 0). */
static void moe_bias_load(trainer *t, const dt_train_state *st) {
    model *m = &t->m;
    int l, e, E = t->o.moe_experts;
    if (!E || t->o.moe_balance != DT_MOE_BIAS) return;
    for (l = 0; l < m->L; l++) {
        int part;
        if (!m->moe[l]) continue;
        for (part = 0; part * 8 < E; part++) {
            char key[64];
            const char *v;
            snprintf(key, sizeof key, "moe_bias.%d.%d", l, part);
            if (!(v = dt_train_state_get(st, key))) break;
            for (e = part * 8; e < E && e < part * 8 + 8 && *v; e++) {
                char *end;
                dt_moe_bias(m->moe[l])[e] = (float)strtod(v, &end);
                v = *end == ',' ? end + 1 : end;
            }
        }
    }
}

/* The checkpoint of `step` steps into --ckpt (the last step's loss rides along: save_loss). */
static void save_checkpoint(trainer *t, int64_t step) {
    dt_train_state st;
    dt_checkpoint_desc cd;
    memset(&cd, 0, sizeof cd);
    memset(&st, 0, sizeof st);
    st.step = step; st.rng_seed = t->o.seed; st.data_cursor = step * t->o.batch;
    save_loss(&st, t->loss);
    {
        char v[128];
        model_key(&t->o, v, sizeof v);
        CHECK(dt_train_state_set(&t->ctx, &st, "model", v));
    }
    moe_bias_save(t, &st);
    cd.dir = t->o.ckpt;
    CHECK(dt_zero_checkpoint_save(t->m.z, &st, &cd));
}

/* ---- slow ranks (--slow-every K): a rank that computes slower than the others makes every rank's
   step longer, as they wait for it in the collectives, so the step time names nobody. Each rank
   counts its step less its seconds blocked in collectives (every group's); every K steps
   the world gathers those, and a rank above --slow-factor x the median (and 1 ms a step above
   it: timer noise) is named with its host. Collective over the world, every K steps. */
static void slow_begin(trainer *t) {
    t->step_t0 = now();
    t->comm_before = wait_seconds(t->lay, t->pl.emb);
}
static void slow_end(trainer *t) {
    const opts *o = &t->o;
    double c = wait_seconds(t->lay, t->pl.emb) - t->comm_before, *all, *sorted, med;
    dt_tensor mine, every;
    dt_tensor_desc td;
    int r, i, j, W = t->W;
    if (!o->slow_every) return;
    t->win_comm += c;
    t->win_compute += now() - t->step_t0 - c;
    if (++t->win_steps < o->slow_every) return;
    memset(&td, 0, sizeof td);
    td.dtype = DT_F32; td.device = DT_CPU; td.shape[0] = 2;
    CHECK(dt_tensor_create(g_ctx, &mine, &td));
    td.shape[0] = 2 * (int64_t)W;
    CHECK(dt_tensor_create(g_ctx, &every, &td));
    ((float *)mine.data)[0] = (float)(t->win_compute / t->win_steps);
    ((float *)mine.data)[1] = (float)(t->win_comm / t->win_steps);
    CHECK(dt_comm_allgather(t->world, &every, &mine));
    if (!t->hosts) { /* once: each rank's host */
        dt_tensor hm, ha;
        td.dtype = DT_U8; td.shape[0] = 64;
        CHECK(dt_tensor_create(g_ctx, &hm, &td));
        td.shape[0] = 64 * (int64_t)W;
        CHECK(dt_tensor_create(g_ctx, &ha, &td));
        memset(hm.data, 0, 64);
        if (gethostname((char *)hm.data, 63) != 0) snprintf((char *)hm.data, 64, "?");
        CHECK(dt_comm_allgather(t->world, &ha, &hm));
        t->hosts = (char (*)[64])malloc((size_t)W * 64);
        if (!t->hosts) CHECK(DT_ERR_OOM);
        memcpy(t->hosts, ha.data, (size_t)W * 64);
        dt_tensor_free(g_ctx, &hm);
        dt_tensor_free(g_ctx, &ha);
    }
    all = (double *)malloc((size_t)W * 2 * sizeof(double));
    if (!all) CHECK(DT_ERR_OOM);
    sorted = all + W;
    for (r = 0; r < W; r++) all[r] = sorted[r] = ((const float *)every.data)[2 * r];
    for (i = 1; i < W; i++) /* insertion sort: W is small */
        for (j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) { double x = sorted[j]; sorted[j] = sorted[j - 1]; sorted[j - 1] = x; }
    med = sorted[(W - 1) / 2]; /* the lower median: at 2 ranks the faster one, not the pair's mean */
    t->n_slow = 0;
    t->slow_median = med;
    for (r = 0; r < W; r++)
        if (all[r] > o->slow_factor * med && all[r] - med > 1e-3) {
            if (t->n_slow < 8) t->slow[t->n_slow] = r;
            t->n_slow++;
            if (g_rank == 0)
                printf("slow rank: %d on host %s computes %.2f ms a step, %.2fx the median rank's %.2f ms (steps %lld-%lld; "
                       "it waited %.2f ms a step in collectives)\n", r, t->hosts[r], all[r] * 1e3, med > 0 ? all[r] / med : 0.0,
                       med * 1e3, (long long)(t->step + 2 - t->win_steps), (long long)(t->step + 1),
                       ((const float *)every.data)[2 * r + 1] * 1e3);
        }
    if (g_rank == 0) fflush(stdout);
    free(all);
    dt_tensor_free(g_ctx, &mine);
    dt_tensor_free(g_ctx, &every);
    t->win_compute = t->win_comm = 0;
    t->win_steps = 0;
}

/* Rank 0: the progress line every --print-every steps, the JSON line of every step (--log). */
static void log_step(trainer *t, const dt_opt_step_info *info) {
    const opts *o = &t->o;
    double el = now() - t->t0, done = (double)(t->step + 1 - t->first_step);
    double tps = done * (double)o->batch * (double)o->seq / (el > 0 ? el : 1e-9);
    if (g_rank != 0 || !t->logging) return;
    if (!o->quiet && o->print_every && ((t->step + 1) % o->print_every == 0 || t->step + 1 == o->steps ||
                                        t->step == t->first_step))
        printf("step %lld/%lld  loss %.4f  lr %.2e  norm %.3f  %.0f tok/s  MFU %.1f%%  eta %.0fs\n",
               (long long)(t->step + 1), (long long)o->steps, t->loss, info->lr, info->grad_norm, tps,
               100.0 * tps * t->flops_per_token / t->peak_flops, el / done * (double)(o->steps - t->step - 1));
    if (!o->quiet && o->moe_experts && o->print_every && ((t->step + 1) % o->print_every == 0 ||
                                                          t->step + 1 == o->steps || t->step == t->first_step))
        printf("  moe: aux %.6f  dropped %.0f  load max/mean %.3f\n", t->moe_aux, t->moe_dropped, t->moe_lmax);
    if (t->log) {
        fprintf(t->log, "{\"step\":%lld,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"tokens_per_s\":%.1f,"
                        "\"loss_scale\":%g,\"comm_s\":%.6f,\"skipped\":%d,\"step_s\":%.6f", (long long)(t->step + 1), t->loss,
                info->lr, info->grad_norm, tps, info->loss_scale, comm_seconds(t->lay, t->pl.emb), info->skipped, t->step_s);
        if (o->slow_every && t->win_steps == 0) { /* the step that ended a --slow-every window */
            int i;
            fprintf(t->log, ",\"compute_s_median\":%.6f,\"slow_ranks\":[", t->slow_median);
            for (i = 0; i < t->n_slow && i < 8; i++) fprintf(t->log, "%s%d", i ? "," : "", t->slow[i]);
            fprintf(t->log, "]");
        }
        if (o->moe_experts)
            fprintf(t->log, ",\"moe_aux\":%.9g,\"moe_dropped\":%.0f,\"moe_drop_print\":%.0f,\"moe_load_max_over_mean\":%.6g",
                    t->moe_aux, t->moe_dropped, t->moe_print, t->moe_lmax);
        fprintf(t->log, "}\n");
        fflush(t->log);
    }
    fflush(stdout);
}

/* The run's expert load per MoE block (every stage's, summed over pp to rank 0): a bar per expert,
   its share of the block's assignments (1/E each when balanced), and the rows it kept under the
   capacity over its uniform share (1 when balanced and nothing dropped); then the planner's
   --moe-load: per MoE block in order, per ep dividing E (ascending), the mean over the run's later
   half of the busiest ep rank's kept rows over its uniform share (moe_step). */
static void moe_histogram(trainer *t) {
    model *m = &t->m;
    int l, e, E = t->o.moe_experts;
    CHECK(dt_comm_allreduce_f64(t->lay->pp_comm, t->moe_hist, 2 * m->L * E, DT_REDUCE_SUM));
    CHECK(dt_comm_allreduce_f64(t->lay->pp_comm, t->moe_busy, m->L * E, DT_REDUCE_SUM));
    if (g_rank != 0 || t->o.quiet) return;
    printf("moe: expert load over the run (share of each block's assignments, balanced = %.3f; kept: the rows it "
           "computed over its uniform share)\n", 1.0 / E);
    for (l = 0; l < m->L; l++) {
        double sum = 0;
        if (!moe_block(&t->o, l)) continue;
        for (e = 0; e < E; e++) sum += t->moe_hist[l * E + e];
        for (e = 0; e < E; e++) {
            double share = sum > 0 ? t->moe_hist[l * E + e] / sum : 0;
            int n = (int)(share * E * 20 + 0.5), i;
            printf("  block %2d expert %3d  %.3f  kept %.3f  ", l, e, share,
                   sum > 0 ? t->moe_hist[(m->L + l) * E + e] * E / sum : 0);
            for (i = 0; i < n && i < 60; i++) putchar('#');
            putchar('\n');
        }
    }
    printf("moe: --moe-load ");
    for (l = 0; l < m->L; l++) {
        int d, j = 0;
        if (!moe_block(&t->o, l)) continue;
        for (d = 1; d <= E; d++)
            if (E % d == 0) {
                printf("%s%.4f", l == t->o.moe_every - 1 && !j ? "" : ",",
                       t->moe_busy_steps ? t->moe_busy[l * E + j] / t->moe_busy_steps : 1);
                j++;
            }
    }
    printf("\n");
}

/* After the last step: memory peaks, the --profile table, the --trace file, --sample's text and
   the "final: loss" line. */
static void report(trainer *t) {
    const opts *o = &t->o;
    int trained = t->last_step > t->first_step;
    dt_zero_memory zm;
    CHECK(dt_zero_memory_get(t->m.z, &zm));
    if (g_rank == 0 && !o->quiet && trained)
        printf("activation memory per rank: %.2f MB peak above the model and optimizer in step 1 (dt_peak_bytes; "
               "recompute %s, sp %d; the activation tensors %.2f MB, of them the blocks' saved for the backward "
               "%.2f MB; ZeRO's transient buffers the rest); dt_zero's peak %.2f MB\n", t->act_peak / 1e6,
               RECOMPUTE_NAMES[o->recompute], o->sp, t->a.bytes / 1e6, t->a.blk_bytes / 1e6, zm.peak_bytes / 1e6);
    if (g_rank == 0 && !o->quiet && trained && o->pp == 1 && t->a.off_hi > t->a.off_lo)
        printf("activation offload: %d of %d blocks, %.2f MB each to host and back per micro-batch (%.2f MB in all; %d "
               "slots of %.2f MB stay on the device); copied back %.2f blocks per micro-batch (the forward's last %d "
               "stay in their slots for the backward); posting the copies took %.3f s of the run\n",
               t->a.off_hi - t->a.off_lo, t->m.L, t->a.off_elems * 4.0 / 1e6,
               (t->a.off_hi - t->a.off_lo) * t->a.off_elems * 4.0 / 1e6, t->a.nslot, t->a.off_elems * 4.0 / 1e6,
               (double)t->a.off_ins / ((double)(t->last_step - t->first_step) * o->micro), t->a.nslot, t->a.off_seconds);
    if (o->pp > 1 && g_rank == 0 && !o->quiet && trained)
        printf("pipeline: stage 0 held at most %d micro-batches' activations (the schedule's bound %d), %.2f MB of "
               "them and the runtime's buffers at its peak\n", t->pp_peak, t->rs.bound, t->rs.peak_ctx_bytes / 1e6);
    if (g_profile && trained) { /* the events not yet read: the device has passed them all after this */
        CHECK(dt_ctx_sync(&t->ctx));
        prof_flush();
    }
    if (g_profile && trained && t->ctx.device == DT_CUDA_DEVICE) { /* every rank: tests/cuda_counters.sh reads them */
        printf("cuda counters per step: syncs %lld allocs %lld frees %lld h2d_bytes %lld h2d_calls %lld d2h_bytes %lld "
               "d2h_calls %lld\n", (long long)g_worst.syncs, (long long)g_worst.allocs, (long long)g_worst.frees,
               (long long)g_worst.h2d_bytes, (long long)g_worst.h2d_calls, (long long)g_worst.d2h_bytes,
               (long long)g_worst.d2h_calls);
        /* which path the linears with a bias or GELU took: cuBLASLt's epilogues, or (no algorithm
           on this GPU, a vector not on 16 bytes) the separate ops */
        printf("cuda linears after the first step: %lld with cuBLASLt's fused epilogues, %lld by the separate ops\n",
               (long long)t->ctx.counters.lt_fused, (long long)t->ctx.counters.lt_separate);
        fflush(stdout);
    }
    if (g_profile && g_rank == 0 && trained) {
        double total = 0, per = 1e3 / (double)(t->last_step - t->first_step), wall = (now() - t->t0) * per;
        int r;
        for (r = 0; r < g_nprof; r++) total += g_prof[r].seconds;
        printf("profile (rank 0, ms per step; wall %.2f ms per step):\n", wall);
        for (r = 0; r < g_nprof; r++)
            printf("  %-32s %9.3f  %5.1f%%  (%lld calls)\n", g_prof[r].name, g_prof[r].seconds * per,
                   100.0 * g_prof[r].seconds * per / wall, (long long)g_prof[r].calls);
        printf("  %-32s %9.3f  %5.1f%%\n", "(not in an op above)", wall - total * per, 100.0 - 100.0 * total * per / wall);
    }
    if (o->trace) {
        double cs = 0, ov = 0, blocked = wait_seconds(t->lay, t->pl.emb);
        CHECK(dt_trace_overlap(t->m.tr, &cs, &ov));
        CHECK(dt_trace_write(t->m.tr, o->trace));
        if (g_rank == 0 && !o->quiet)
            printf("trace: %s (Perfetto / chrome://tracing); rank 0: %.3f s in collectives, %.0f%% of it overlapped "
                   "with compute; blocked in waits %.3f s (hidden: %.0f%% of the collectives' time)\n", o->trace, cs,
                   cs > 0 ? 100.0 * ov / cs : 0.0, blocked, cs > 0 ? 100.0 * (1.0 - blocked / cs) : 0.0);
    }
    if (o->moe_experts && trained) moe_histogram(t);
    { /* the largest rank's high-water mark since the model was built (model, optimizer, activations,
         transients): what dt_plan_predict's memory is checked against */
        double pk = (double)dt_peak_bytes(&t->ctx);
        CHECK(dt_comm_allreduce_f64(t->world, &pk, 1, DT_REDUCE_MAX));
        if (g_rank == 0 && !o->quiet && trained)
            printf("peak memory per rank: %.3f MB (the largest rank's dt_peak_bytes since the model was built)\n", pk / 1e6);
    }
    if (o->sample) sample_text(&t->m, o->sample, o->seed, t->data.vocab == 256);
    if (g_rank == 0) printf("final: loss %.9g\n", t->loss);
}

/* Everything back, in the reverse order of its making. */
static void teardown(trainer *t) {
    model *m = &t->m;
    int64_t i;
    if (t->log) fclose(t->log);
    if (g_on_done) g_on_done(m, g_on_done_user);
    acts_free(&t->a, m->L);
    for (i = 0; t->pl.act && i < (int64_t)m->v * t->o.micro; i++) acts_free(&t->pl.act[i], m->L);
    dt_release(&t->ctx, t->pl.act);
    for (i = 0; t->pl.spare && i < (int64_t)m->v; i++) {
        int j;
        for (j = 0; j < t->pl.n_spare[i]; j++) acts_free(&t->pl.spare[i * t->o.micro + j], m->L);
    }
    dt_release(&t->ctx, t->pl.spare);
    dt_release(&t->ctx, t->pl.n_spare);
    dt_comm_free(t->pl.emb);
    dt_pp_schedule_free(t->sched);
    dt_tensor_free(&t->ctx, &m->wte_head);
    dt_tensor_free(&t->ctx, &m->wte_head_grad);
    dt_release(&t->ctx, m->bunit);
    dt_release(&t->ctx, m->first);
    for (i = 0; m->moe && i < m->L; i++) dt_moe_free(m->moe[i]);
    dt_release(&t->ctx, m->moe);
    dt_release(&t->ctx, m->xunit);
    dt_release(&t->ctx, m->mp);
    dt_release(&t->ctx, t->moe_hist);
    dt_release(&t->ctx, t->moe_busy);
    free(t->hosts);
    dt_zero_free(m->z);
    dt_trace_free(m->tr);
    dt_tensor_free(&t->ctx, &m->f32buf);
    dt_release(&t->ctx, m->f32);
    dt_release(&t->ctx, m->blk);
    dt_release(&t->ctx, m->units);
    dt_arena_free(t->arena);
    dt_params_free(&t->ctx, &m->ps);
    dt_gpt_data_close(&t->ctx, &t->data);
    dt_layout_free(t->lay);
    dt_comm_free(t->world);
    prof_free();
    dt_ctx_shutdown(&t->ctx);
}

#ifdef GPT_NO_MAIN
static int gpt_main(int argc, char **argv) {
#else
int main(int argc, char **argv) {
#endif
    trainer t;
    dt_opt_step_info info;
    const opts *o = &t.o;

#ifndef GPT_NO_MAIN
    dt_blas_rerun(argv); /* OpenBLAS's kernels fit the CPU: dt_tensor.h, dt_blas_note */
#endif
    memset(&t, 0, sizeof t);
    setup(&t, argc, argv);
    plan_layout(&t);
    check_sizes(&t);
    build_model(&t);
    if (o->pp > 1) build_pipeline(&t);
    t.base = (double)t.ctx.bytes_in_use; /* activations and ZeRO's transient buffers: what comes above */
    dt_reset_peak_bytes(&t.ctx);
    if (o->pp == 1) acts_make(&t.a, &t.m, t.per_micro, o->recompute, 0, t.m.L);
    if (!open_outputs(&t)) return 1;
    print_plan(&t);

    t.last_step = o->stop_at && o->stop_at < o->steps ? o->stop_at : o->steps;
    t.t0 = now();
    for (; t.step < t.last_step; t.step++) {
        /* the whole step with its checkpoint, not each call: a fault anywhere in it is named
           within --timeout of the step's start (plus the report's grace) */
        double ts = now();
        if (o->timeout > 0) CHECK(dt_comm_set_deadline(t.world, o->timeout));
        slow_begin(&t);
        train_step(&t, &info);
        slow_end(&t);
        t.step_s = now() - ts;
        /* the log line before the checkpoint: a run killed after a checkpoint has logged every
           step it holds, so the resumed run's lines complete the log */
        log_step(&t, &info);
        if (o->ckpt && o->ckpt_every && (t.step + 1) % o->ckpt_every == 0) save_checkpoint(&t, t.step + 1);
    }
    if (o->timeout > 0) CHECK(dt_comm_set_deadline(t.world, 0));
    if (o->ckpt && t.last_step > t.first_step && (!o->ckpt_every || t.last_step % o->ckpt_every))
        save_checkpoint(&t, t.last_step);

    report(&t);
    teardown(&t);
    return 0;
}
