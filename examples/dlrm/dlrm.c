/* examples/dlrm/dlrm.c - DLRM (and DCNv2) trained hybrid-parallel on MPI ranks: the 26 embedding
   tables model-parallel (dt_embed.h: table-wise, row-wise, data-parallel, chosen by its planner),
   the bottom and top MLPs data-parallel (dt_comm.h's bucketer), BCE with logits.

   run:   build/examples/dlrm --steps 300 --batch 512                   (built by ./build.sh)
          mpirun -np 4 build/examples/dlrm --steps 300 --batch 512       (same losses)
   flags: --steps N --batch B (global) --seed S --data synthetic|FILE.tsv|FILE.bin --arch dlrm|dcn
          --dim D --bottom 64,32 --top 64,32 --cross L --cross-rank R (--arch dcn; 0: full rank W [w, w],
          w = 27 D; 0 < R < w: the low-rank W [w, R] V [R, w] of MLPerf's DLRM-DCNv2 reference)
          --opt sgd|adagrad --lr LR --emb-lr LR (in [0, 100]; 0 is a real 0: that part stays frozen)
          --accum N --eval-every N --eval-samples N --print-every N --log FILE.jsonl
          --ckpt DIR --ckpt-every N --resume --rows N (cap on table rows, 16384) --skip-bad
          --table-sizes N|n1,...,n26 (the tables' rows, one for all or one per feature, each at most
          2^31 with --data synthetic, 2^62 with a file; default min(Criteo Kaggle's cardinality,
          --rows); TSV ids are hashed into them) --timeout S (a collective not done in S seconds is
          a named error) --help
          --shard auto|row|table|column|table-row|data|plan (table-row: each table row-wise over the ranks
          of one host, TorchRec's TWRW; plan: dt_plan.h's first-ranked placement, table by table,
          from a profile it measures first with the first 8 batches: the dense step and every
          table under every kind, see docs/plan.md) --plan (print the ranked plans and the
          prediction for --shard's, then exit 0 untrained) --plan-memory MB (the planner's budget
          a rank) --plan-profile FILE (the planner's profile: read FILE when it exists, else measure
          and write it) --row-wise-over ROWS (pin bigger tables row-wise) --quiet
          --device cpu|cuda (cuda: a -DDT_CUDA build, build/examples/cuda/dlrm, or
          build/examples/emu/dlrm on the CPU emulator: MLPs, interaction, BCE, activations and the
          tables' shards on the GPU; the inputs go up once per step and the loss is read only on
          the steps that print, log or checkpoint it; tests/cuda_emu/k_dlrm.cpp checks it against
          the cpu run on the emulator)
          --dtype f32|bf16 (the weights of the dense linears, bottom and top MLPs and DCNv2's cross
          layers: bf16 values, which dt_linear multiplies in bf16 with f32 sums, as an autocast
          does: on the tensor cores with --device cuda; f32 master weights and optimizer state
          inside dt_opt.h, f32 biases, activations and tables; default f32. A checkpoint keeps
          the masters ("master/<name>"), so --resume with the other --dtype goes on from them:
          f32 takes the masters, bf16 rounds the f32 weights, a line says so)
          --profile (with --device cuda every rank prints, at the end, "cuda counters per step:
          syncs S allocs A frees F h2d_bytes B h2d_calls C d2h_bytes D d2h_calls E": the most any
          step after the first asked of the device, a logging step's loss read apart)
          --overlap 0|1 (the next batch's id exchange during this batch's dense work; default 0)
          --tier none|disk|host (disk: each rank's shards and optimizer state in files under
          --tier-dir DIR, default $TMPDIR or /tmp, a cache of hot rows in memory; host: cuda tables
          over pinned host memory) --cache-rows N|F (rows of the cache per table and rank, or a
          fraction 0 < F < 1 of each local shard; default 1/8) --prefetch 0|1 (tiered: the next
          batch's missing rows fetched on a helper thread during this step; default 1); the end
          prints each tiered table's hits, misses, evictions, bytes moved and prefetch wait
          --hier auto|on|off (the embedding's all-to-alls over hosts in two levels, dt_comm.h
          "Across hosts"; the end prints how many went so) --host-size K (every K consecutive
          ranks one host: hosts modelled on one machine; 0 = by host name)
          --dump-batches DIR (rank 0 writes each step's global batch, see below)
   last line: "final: loss L auc A" (L the training loss of the last step, A the held-out AUC);
   before it "peak memory per rank: M MB" (the largest rank's dt_peak_bytes over the training
   steps, evaluations apart).
   A is nan when the held-out labels are all one class (a warning says so; training goes on).
   A run that trains no step (--steps 0, or --resume at --steps) evaluates the model it has for
   A, and L is the loss the checkpoint recorded for its last step (nan: none was trained; --steps
   0 says so in a line before).
   A bad flag or value is named with what it wants (exit 2, the flags after it).
   --resume refuses (exit 2, naming both values) a checkpoint of another --seed, --batch or
   --data, and one past --steps; at --steps it says there is nothing to train (exit 0).
   A TSV is converted once to FILE.tsv.bin (by rank 0, the others wait), beside a record
   FILE.tsv.bin.src of the TSV's size and mtime and --skip-bad; the .bin is used again only
   when these and its table sizes match this run's, else converted again (saying what differed).

   One step on rank r (W ranks, global batch B; rank r's samples are a pure function of (seed,
   global index), dlrm_data.h's split, so every W sees the same global batches):
       dense [B_r, 13] -> bottom MLP -> z [B_r, D]
       sparse ids (26 features) -> dt_embed_forward: all-to-all to the owners, gather + pool,
                                   all-to-all back -> e [B_r, 26 D]
       DLRM: dot interaction of z and the 26 vectors -> [B_r, D + 27*26/2]
       DCNv2: x0 = [z, e]; x_{l+1} = x0 * (W_l x_l + b_l) + x_l, L times (--cross-rank R:
              W_l = U_l V_l, U_l [w, R] named cross.l.w and V_l [R, w] cross.l.v, as TorchRec's
              LowRankCrossNet in MLPerf's DLRM-DCNv2)
       -> top MLP -> logit [B_r, 1] -> BCE; the loss is the sum over the rank's samples / B, so
       the ranks' summed gradients are exactly the global batch's mean gradient.
   backward: top -> interaction -> bottom, each layer's grads handed to the bucketer as they
   are done (all-reduce overlapped with the rest of the backward); the embedding grads go back
   to the owners, which apply the sparse optimizer to the touched rows only.

   Accumulation (--accum N): step s still covers samples [s B, (s+1) B), as N micro-batches of
   B / N; the dense grads and the embedding contributions accumulate (dt_embed_set_sync), and one
   update follows the last micro-batch: the same update as one batch of B.
   Overlap (--overlap 1): the ids of batch s+1 are read and their exchange posted
   (dt_embed_forward_begin) right after batch s's pooled vectors arrive, and travel during batch
   s's dense forward and backward (dt_embed_progress between layers moves them: Open MPI here has
   no progress thread); the rows of batch s+1 are gathered in its forward_end, after batch s's
   sparse update, so the losses are those of --overlap 0 bit for bit. Not across a step that
   evaluates or saves a checkpoint (those need the embedding idle). Default 0: measured 1.3x
   faster steps at 2 ranks on 2 cores, slower at 4 (oversubscribed); bench/RESULTS.md.
   Checkpoints (--ckpt DIR): the dense model + optimizer in DIR/dense, the tables in DIR/embed
   (dt_opt.h's crash-safe directories; dense first, so DIR/dense always holds the step that
   DIR/embed's latest names, and --resume loads that pair); --steps 0 --ckpt DIR saves the
   initial model as step 0. Metrics: one JSON line per step
   (--log; "auc" and "logloss" on the steps that evaluate, null on the others). Eval: the exact AUC and logloss of held-out samples (synthetic: indices from
   2^40 on; a file: its last --eval-samples), gathered over the ranks.
   For an outside reference (tests/dlrm_reference.py is one): the checkpoint of step s holds the
   weights after s updates ("param/bot.0.w" [out, in], y = x W^T + b; with --dtype bf16 in bf16,
   and "master/bot.0.w" its f32 master; "param/embed/C1/weight"
   [rows, D] by logical row; dt_opt.h's and dt_embed.h's checkpoint sections), and
   --dump-batches DIR writes DIR/batch_00000001.safetensors, ... : the global batch that the
   logged step s trained on (samples [(s-1) B, s B), whatever the ranks; a file's training part
   is read in whole batches, epoch after epoch: see data_batch), as dlrm_data.h's
   batch: "dense" f32 [B, 13] (after log1p), "labels" f32 [B], "lengths" i32 [26, B] and "ids"
   i64 [nnz] (rows after hashing, feature-major). Step s's logged loss is that batch's mean BCE
   under checkpoint s - 1's weights. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, gethostname */
#define DT_IMPLEMENTATION
#include "../../dt_tensor.h"
#include "../../dt_comm.h"
#include "../../dt_opt.h"
#include "../../dt_parallel.h" /* (dt_plan.h sits on it) */
#include "../../dt_embed.h"
#include "../../dt_plan.h"     /* --plan, --shard plan: the tables' placement from a measured profile */
#include "dlrm_data.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h> /* gethostname */

#define F DT_DLRM_SPARSE
#define MAX_LAYERS 8
#define EVAL_BASE ((int64_t)1 << 40) /* synthetic eval samples never overlap training ones */
#define DP_MAX_BYTES (64.0 * 1024)   /* dt_embed's planner: small tables replicated; mid ones whole on one rank;
                                        big ones by rows */

typedef struct opts {
    int64_t steps, batch, eval_samples, rows, row_wise_over;
    int64_t table[DT_DLRM_SPARSE]; /* rows of table f: --table-sizes, else min(Kaggle's, --rows) */
    const char *table_sizes;       /* the --table-sizes text, NULL when not given */
    uint64_t seed;
    const char *data, *arch, *opt, *log, *ckpt, *shard, *device, *dump;
    double timeout;         /* --timeout S: a collective not done in S seconds is a named error (0: dt's 300) */
    int dim, cross, cross_rank, accum, eval_every, print_every, ckpt_every, resume, skip_bad, quiet, overlap, profile;
    const char *tier, *tier_dir;   /* --tier none|disk|host, --tier-dir */
    int64_t cache_rows;            /* --cache-rows N; or cache_frac for a fraction */
    double cache_frac;
    int prefetch;                  /* --prefetch (tiered tables): 1 by default */
    int hier, host_size;           /* --hier auto|on|off (dt_comm_desc.hier 0, 1, -1), --host-size K */
    int plan;                      /* --plan: print the planner's ranking and this --shard's prediction, exit */
    double plan_memory;            /* --plan-memory MB: the planner's per-rank budget (0: none) */
    const char *plan_profile;      /* --plan-profile FILE: read it, or measure and write it */
    int bottom[MAX_LAYERS], n_bottom, top[MAX_LAYERS], n_top;
    double lr, emb_lr;             /* 0: a real 0 (frozen; DT_OPT_ZERO in the descs), -1 until parse's default */
    int cross_given;               /* --cross or --cross-rank given (with --arch dlrm: a warning, it has no cross layers) */
    dt_dtype dtype;                /* --dtype: the dense linears' weights (DT_F32, DT_BF16) */
} opts;

static dt_ctx *g_ctx;
static int g_rank;
static dt_embed *g_progress; /* --overlap: an id exchange in flight, moved between dense layers */
static int g_prefetch;      /* --prefetch: the next batch begins with dt_embed_prefetch (its rows come too) */
static int g_auc_warned;    /* the held-out labels are all one class: said once */
static int g_dense_only;    /* the planner's dense step: everything but the embedding (it does not exist yet) */
/* dt_comm_abort, not exit: an error one rank alone sees ends every rank now (after a timeout it
   first gives the ranks still waiting the time to write their own reports). */
#define CHECK(call) do { dt_status s_ = (call); if (s_) { \
    fprintf(stderr, "dlrm [rank %d]: %s failed: %s\n", g_rank, #call, dt_ctx_error(g_ctx)); dt_comm_abort(NULL, 1); } } while (0)

/* ---------------------------------------------------------------- flags */

#define FLAGS "flags: --steps N --batch B --seed S --data synthetic|FILE.tsv|FILE.bin " \
    "--arch dlrm|dcn --dim D --bottom 64,32 --top 64,32 --cross L --cross-rank R (dcn) --opt sgd|adagrad --lr LR " \
    "--emb-lr LR (0: frozen) --accum N --eval-every N --eval-samples N --print-every N --log FILE " \
    "--ckpt DIR --ckpt-every N --resume --rows N --table-sizes N|n1,...,n26 (rows: 1..2^31 synthetic, 1..2^62 " \
    "a file) --skip-bad --shard auto|row|table|column|table-row|data|plan --plan --plan-memory MB " \
    "--plan-profile FILE --row-wise-over ROWS --timeout S " \
    "--device cpu|cuda --dtype f32|bf16 --quiet --overlap 0|1 --dump-batches DIR --profile --tier none|disk|host " \
    "--tier-dir DIR --cache-rows N|F --prefetch 0|1 --hier auto|on|off --host-size K --help\n"

static void usage(const char *why) {
    fprintf(stderr, "dlrm: %s\n" FLAGS, why);
    exit(2);
}

/* A flag's integer in [lo, hi]: all of v, no overflow (strtoll clamps, saying so in errno). */
static int64_t num(const char *flag, const char *v, int64_t lo, int64_t hi) {
    char *end = NULL;
    long long x = 0;
    if (v) { errno = 0; x = strtoll(v, &end, 10); }
    if (!v || !*v || *end || errno == ERANGE || x < lo || x > hi) {
        char why[200];
        snprintf(why, sizeof why, "%s wants an integer in [%lld, %lld], got '%s'", flag, (long long)lo,
                 (long long)hi, v ? v : "(nothing)");
        usage(why);
    }
    return x;
}

/* A flag's number in [lo, hi] (nan is in no range; ERANGE: beyond a double, or below its least). */
static double real(const char *flag, const char *v, double lo, double hi) {
    char *end = NULL;
    double x = 0;
    if (v) { errno = 0; x = strtod(v, &end); }
    if (!v || !*v || *end || errno == ERANGE || !(x >= lo && x <= hi)) {
        char why[200];
        snprintf(why, sizeof why, "%s wants a number in [%g, %g], got '%s'", flag, lo, hi, v ? v : "(nothing)");
        usage(why);
    }
    return x;
}

/* A flag's value that is none of the words it takes: "--arch wants dlrm or dcn, got 'x'". */
static void bad(const char *flag, const char *v, const char *wants) {
    char why[300];
    snprintf(why, sizeof why, "%s wants %s, got '%s'", flag, wants, v ? v : "(nothing)");
    usage(why);
}

/* A width list "64,32": 1 to MAX_LAYERS widths, no empty one (as --table-sizes: "64,32," is refused). */
static int layers(const char *flag, const char *v, int *out) {
    int n = 0;
    const char *p = v;
    do {
        char *end = NULL;
        long x = p ? strtol(p, &end, 10) : 0;
        if (!p || end == p || x < 1 || x > 65536 || n == MAX_LAYERS || (*end && *end != ',') ||
            (*end == ',' && !end[1])) {
            char why[200];
            snprintf(why, sizeof why, "%s wants 1 to %d widths in [1, 65536] like 64,32, got '%s'", flag,
                     MAX_LAYERS, v ? v : "(nothing)");
            usage(why);
        }
        out[n++] = (int)x;
        p = *end ? end + 1 : end;
    } while (*p);
    return n;
}

/* A flag's path value: "--log --quiet" names no file (it would make a file called --quiet). */
static const char *path(const char *flag, const char *v) {
    if (!v || !strncmp(v, "--", 2)) {
        char why[160];
        snprintf(why, sizeof why, "%s wants a path, got %s%s%s", flag, v ? "the flag '" : "nothing", v ? v : "", v ? "'" : "");
        usage(why);
    }
    return v;
}

/* --table-sizes N (every table) or n1,...,n26 (C1..C26); without it, table f has min(Criteo
   Kaggle's cardinality of f, --rows) rows. TSV ids are hashed into these sizes (dlrm_data.h: id =
   1 + hash(v) mod (N_f - 1)), each in [1, 2^62] (dt_embed's and the .bin's limit); the synthetic
   data draws ids in [0, N_f), N_f in [1, 2^31] (dt_dlrm_synth_init's limit). */
static void table_sizes(opts *o) {
    const char *p = o->table_sizes;
    int n = 0, f, synthetic = !strcmp(o->data, "synthetic"), log2max = synthetic ? 31 : 62;
    if (!p) {
        for (f = 0; f < F; f++) {
            int64_t c = dt_dlrm_kaggle_cardinality(f);
            o->table[f] = c > o->rows ? o->rows : c;
        }
        return;
    }
    while (*p) {
        char *end, why[320];
        long long x;
        errno = 0;
        x = strtoll(p, &end, 10);
        if (end == p || errno || x < 1 || x > ((int64_t)1 << log2max) || (*end && *end != ',') || n == F ||
            (*end == ',' && !end[1])) {
            snprintf(why, sizeof why, "--table-sizes wants 1 or %d sizes in [1, 2^%d]%s separated by commas "
                     "(N, or n1,...,n%d for C1..C%d), got '%s' (%s size %d)", F, log2max,
                     synthetic ? " (--data synthetic's limit; a file's is 2^62)" : "", F, F, o->table_sizes,
                     n == F ? "more than 26 sizes: at" : "a bad", n + 1);
            usage(why);
        }
        o->table[n++] = (int64_t)x;
        p = *end ? end + 1 : end;
    }
    if (n != 1 && n != F) {
        char why[320];
        snprintf(why, sizeof why, "--table-sizes wants 1 or %d sizes separated by commas, got '%s' (%d sizes)", F,
                 o->table_sizes, n);
        usage(why);
    }
    if (n == 1) for (f = 1; f < F; f++) o->table[f] = o->table[0];
}

static void parse(opts *o, int argc, char **argv) {
    int i;
    memset(o, 0, sizeof *o);
    o->steps = 300; o->batch = 512; o->seed = 7; o->data = "synthetic"; o->arch = "dlrm"; o->opt = "adagrad";
    o->dim = 16; o->cross = 2; o->accum = 1; o->eval_every = 0; o->eval_samples = 16384; o->print_every = 25;
    o->rows = 16384; o->lr = -1; o->emb_lr = -1; o->shard = "auto"; o->device = "cpu"; o->tier = "none";
    o->prefetch = -1; o->dtype = DT_F32;
    o->n_bottom = layers("--bottom", "64,32", o->bottom);
    o->n_top = layers("--top", "64,32", o->top);
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(FLAGS, stdout); exit(0); }
        else if (!strcmp(a, "--steps")) o->steps = num(a, v, 0, (int64_t)1 << 40);
        else if (!strcmp(a, "--batch")) o->batch = num(a, v, 1, (int64_t)1 << 24);
        else if (!strcmp(a, "--seed")) o->seed = (uint64_t)num(a, v, 0, INT64_MAX);
        else if (!strcmp(a, "--data")) o->data = path(a, v);
        else if (!strcmp(a, "--arch")) o->arch = v;
        else if (!strcmp(a, "--dim")) o->dim = (int)num(a, v, 1, 4096);
        else if (!strcmp(a, "--bottom")) o->n_bottom = layers(a, v, o->bottom);
        else if (!strcmp(a, "--top")) o->n_top = layers(a, v, o->top);
        else if (!strcmp(a, "--cross")) { o->cross = (int)num(a, v, 0, MAX_LAYERS); o->cross_given = 1; }
        else if (!strcmp(a, "--cross-rank")) { o->cross_rank = (int)num(a, v, 0, 65536); o->cross_given = 1; }
        else if (!strcmp(a, "--opt")) o->opt = v;
        else if (!strcmp(a, "--lr")) o->lr = real(a, v, 0, 100);
        else if (!strcmp(a, "--emb-lr")) o->emb_lr = real(a, v, 0, 100);
        else if (!strcmp(a, "--accum")) o->accum = (int)num(a, v, 1, 1024);
        else if (!strcmp(a, "--eval-every")) o->eval_every = (int)num(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--eval-samples")) o->eval_samples = num(a, v, 2, (int64_t)1 << 30);
        else if (!strcmp(a, "--print-every")) o->print_every = (int)num(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--log")) o->log = path(a, v);
        else if (!strcmp(a, "--ckpt")) o->ckpt = path(a, v);
        else if (!strcmp(a, "--ckpt-every")) o->ckpt_every = (int)num(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--rows")) o->rows = num(a, v, 1, (int64_t)1 << 40);
        else if (!strcmp(a, "--table-sizes")) o->table_sizes = v;
        else if (!strcmp(a, "--shard")) o->shard = v;
        else if (!strcmp(a, "--timeout")) o->timeout = real(a, v, 1e-3, 1e9); /* seconds */
        else if (!strcmp(a, "--device")) o->device = v;
        else if (!strcmp(a, "--dtype")) {
            if (v && !strcmp(v, "f32")) o->dtype = DT_F32;
            else if (v && !strcmp(v, "bf16")) o->dtype = DT_BF16;
            else bad(a, v, "f32 or bf16 (the dense linears' weights; the tables stay f32)");
        }
        else if (!strcmp(a, "--row-wise-over")) o->row_wise_over = num(a, v, 0, (int64_t)1 << 40);
        else if (!strcmp(a, "--overlap")) o->overlap = (int)num(a, v, 0, 1);
        else if (!strcmp(a, "--dump-batches")) o->dump = path(a, v);
        else if (!strcmp(a, "--tier")) o->tier = v;
        else if (!strcmp(a, "--tier-dir")) o->tier_dir = path(a, v);
        else if (!strcmp(a, "--prefetch")) o->prefetch = (int)num(a, v, 0, 1);
        else if (!strcmp(a, "--hier")) {
            if (v && !strcmp(v, "auto")) o->hier = 0;
            else if (v && !strcmp(v, "on")) o->hier = 1;
            else if (v && !strcmp(v, "off")) o->hier = -1;
            else bad(a, v, "auto, on or off");
        }
        else if (!strcmp(a, "--host-size")) o->host_size = (int)num(a, v, 0, 1 << 20);
        else if (!strcmp(a, "--cache-rows")) { /* rows (an integer >= 1) or a fraction in (0, 1) */
            double x = real(a, v, 0, (double)((int64_t)1 << 50));
            if (!(x > 0) || (x >= 1 && x != floor(x)))
                bad(a, v, "rows (an integer >= 1) or a fraction 0 < F < 1 of each local shard");
            if (x < 1) o->cache_frac = x; else o->cache_rows = (int64_t)x;
        }
        else if (!strcmp(a, "--resume")) { o->resume = 1; takes = 0; }
        else if (!strcmp(a, "--skip-bad")) { o->skip_bad = 1; takes = 0; }
        else if (!strcmp(a, "--quiet")) { o->quiet = 1; takes = 0; }
        else if (!strcmp(a, "--profile")) { o->profile = 1; takes = 0; }
        else if (!strcmp(a, "--plan")) { o->plan = 1; takes = 0; }
        else if (!strcmp(a, "--plan-memory")) o->plan_memory = (double)num(a, v, 1, (int64_t)1 << 30);
        else if (!strcmp(a, "--plan-profile")) o->plan_profile = v;
        else { char why[160]; snprintf(why, sizeof why, "unknown flag '%s'", a); usage(why); }
        if (takes && !v) { char why[160]; snprintf(why, sizeof why, "%s needs a value", a); usage(why); }
        i += takes;
    }
    if (!o->data || !o->arch || !o->opt || !o->shard || !o->device) usage("a flag needs a value");
    if (strcmp(o->device, "cpu") && strcmp(o->device, "cuda")) bad("--device", o->device, "cpu or cuda");
#ifndef DT_CUDA
    if (!strcmp(o->device, "cuda")) usage("--device cuda needs a build with -DDT_CUDA (build/examples/cuda/)");
#endif
    if (strcmp(o->arch, "dlrm") && strcmp(o->arch, "dcn")) bad("--arch", o->arch, "dlrm or dcn");
    if (strcmp(o->opt, "sgd") && strcmp(o->opt, "adagrad")) bad("--opt", o->opt, "sgd or adagrad");
    if (strcmp(o->shard, "auto") && strcmp(o->shard, "row") && strcmp(o->shard, "table") && strcmp(o->shard, "data") &&
        strcmp(o->shard, "column") && strcmp(o->shard, "table-row") && strcmp(o->shard, "plan"))
        bad("--shard", o->shard, "auto, row, table, column, table-row, data or plan");
    if ((o->plan || !strcmp(o->shard, "plan")) &&
        (o->accum != 1 || o->overlap || strcmp(o->tier, "none") || strcmp(o->device, "cpu")))
        usage("--plan and --shard plan model a step of one batch on the CPU: not with --accum > 1, --overlap 1, "
              "--tier or --device cuda");
    if (o->plan_memory && !o->plan && strcmp(o->shard, "plan")) usage("--plan-memory is for --plan or --shard plan");
    if (o->plan_profile && !o->plan && strcmp(o->shard, "plan")) usage("--plan-profile is for --plan or --shard plan");
    if (o->batch % o->accum) usage("--batch must be a multiple of --accum");
    if (o->ckpt_every && !o->ckpt) usage("--ckpt-every needs --ckpt DIR");
    if (o->resume && !o->ckpt) usage("--resume needs --ckpt DIR");
    if (!o->tier || (strcmp(o->tier, "none") && strcmp(o->tier, "disk") && strcmp(o->tier, "host")))
        bad("--tier", o->tier, "none, disk or host");
    if (!strcmp(o->tier, "none") && (o->cache_rows || o->cache_frac || o->tier_dir || o->prefetch >= 0))
        usage("--cache-rows, --tier-dir and --prefetch are for tiered tables (--tier disk|host)");
    if (o->prefetch < 0) o->prefetch = strcmp(o->tier, "none") != 0;
    /* defaults that train stably on the synthetic data: the cross layers multiply activations,
       so DCNv2's dense part wants a smaller step than DLRM's */
    if (o->emb_lr < 0) o->emb_lr = !strcmp(o->opt, "sgd") ? 0.1 : 0.05;
    if (o->lr < 0) o->lr = (!strcmp(o->opt, "sgd") ? 0.1 : 0.05) / (!strcmp(o->arch, "dcn") ? 5 : 1);
    if (o->eval_every == 0) o->eval_every = o->steps >= 4 ? (int)(o->steps / 4) : 1;
    if (!strcmp(o->arch, "dcn") && o->cross_rank >= (F + 1) * o->dim) { /* dense_make's w: x0 = [z, e] */
        char why[300];
        snprintf(why, sizeof why, "--cross-rank %d is not below the cross layers' width %d (%d x --dim %d): low rank "
                 "wants 1 <= R < %d (0: full rank)", o->cross_rank, (F + 1) * o->dim, F + 1, o->dim, (F + 1) * o->dim);
        usage(why);
    }
    if (strcmp(o->data, "synthetic")) { /* fopen opens a directory and its first read fails: say so here */
        struct stat sb;
        char why[1200];
        snprintf(why, sizeof why, "--data '%s' is a directory; it wants synthetic, FILE.tsv or FILE.bin", o->data);
        if (stat(o->data, &sb) == 0 && S_ISDIR(sb.st_mode)) usage(why);
    }
    table_sizes(o);
}

/* ---------------------------------------------------------------- data */

/* Where samples come from: the synthetic stream, or a binary file (converted from a TSV once,
   by rank 0, then mapped by every rank). A file's last eval_samples are held out. */
typedef struct data {
    dt_dlrm_synth gen;
    dt_dlrm_bin bin;
    int synthetic;
    int64_t n_train, epoch, card[F]; /* epoch: the samples a pass over a file trains on */
} data;

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* A TSV's FILE.tsv.bin is reused only when it was converted from this TSV as it is now, with
   these table sizes and --skip-bad: FILE.tsv.bin.src (written after each conversion) records
   the TSV's size and modification time and skip_bad; the table sizes are in the .bin's header.
   Anything else (no .bin, no record, a difference) converts again; `why` says what differed. */
static void src_path(char *out, size_t n, const char *bin_path) { snprintf(out, n, "%s.src", bin_path); }

static int tsv_identity(const opts *o, char *out, size_t n) {
    struct stat sb;
    if (stat(o->data, &sb) != 0) return 0;
    snprintf(out, n, "tsv_bytes %lld tsv_mtime %lld.%09ld skip_bad %d", (long long)sb.st_size,
             (long long)sb.st_mtim.tv_sec, (long)sb.st_mtim.tv_nsec, o->skip_bad);
    return 1;
}

static void bin_record(const opts *o, const char *bin_path) {
    char src[1100], tmp[1200], id[160];
    FILE *fp;
    src_path(src, sizeof src, bin_path);
    snprintf(tmp, sizeof tmp, "%s.tmp", src);
    if (!tsv_identity(o, id, sizeof id) || !(fp = fopen(tmp, "w"))) return; /* no record: converted again next time */
    fprintf(fp, "%s\n", id);
    if (fclose(fp) != 0 || rename(tmp, src) != 0) remove(tmp);
}

static int bin_stale(const opts *o, const char *bin_path, char *why, size_t n) {
    char src[1100], want[160], have[160] = "";
    dt_dlrm_bin b;
    FILE *fp;
    int f;
    why[0] = 0;
    if (!(fp = fopen(bin_path, "rb"))) return 1; /* first conversion: nothing to say */
    fclose(fp);
    src_path(src, sizeof src, bin_path);
    if (!tsv_identity(o, want, sizeof want)) return 1; /* the TSV is missing: the conversion names it */
    if (!(fp = fopen(src, "r")) || !fgets(have, sizeof have, fp)) {
        snprintf(why, n, "%s has no record of its conversion (%s)", bin_path, src);
        if (fp) fclose(fp);
        return 1;
    }
    fclose(fp);
    have[strcspn(have, "\n")] = 0;
    if (strcmp(have, want)) {
        snprintf(why, n, "%s was converted from %s with %s; now %s", bin_path, o->data, have, want);
        return 1;
    }
    if (dt_dlrm_bin_open(g_ctx, &b, bin_path, NULL)) {
        snprintf(why, n, "%s does not open: %s", bin_path, dt_ctx_error(g_ctx));
        return 1;
    }
    for (f = 0; f < F; f++)
        if (b.table_size[f] != o->table[f]) {
            snprintf(why, n, "%s has %lld rows in C%d, this run wants %lld", bin_path, (long long)b.table_size[f],
                     f + 1, (long long)o->table[f]);
            break;
        }
    dt_dlrm_bin_close(g_ctx, &b);
    return why[0] != 0;
}

static void data_open(data *d, const opts *o, dt_comm *world) {
    dt_ctx *ctx = g_ctx;
    int f;
    memset(d, 0, sizeof *d);
    if (!strcmp(o->data, "synthetic")) {
        dt_dlrm_synth_desc sd = {0};
        sd.seed = o->seed;
        for (f = 0; f < F; f++) sd.cardinality[f] = o->table[f]; /* Criteo Kaggle's, capped by --rows */
        CHECK(dt_dlrm_synth_init(ctx, &d->gen, &sd));
        d->synthetic = 1;
        d->n_train = -1;
        for (f = 0; f < F; f++) d->card[f] = d->gen.card[f];
        return;
    } else {
        char bin_path[1024], bin_src[1100];
        const char *path = o->data;
        if (!ends_with(o->data, ".bin")) { /* a TSV: its binary form sits beside it */
            snprintf(bin_path, sizeof bin_path, "%s.bin", o->data);
            path = bin_path;
            if (g_rank == 0) { /* the others wait at the barrier and map what rank 0 left */
                char why[4096];
                if (bin_stale(o, bin_path, why, sizeof why)) {
                    dt_dlrm_bin_desc bd = {0};
                    dt_dlrm_tsv_stats st = {0};
                    bd.tsv.skip_bad = o->skip_bad;
                    for (f = 0; f < F; f++) {
                        bd.tsv.table_size[f] = o->table[f];
                        if (o->table[f] > INT32_MAX) bd.ids_i64 = 1;
                    }
                    if (!o->quiet && why[0]) printf("re-converting %s: %s\n", o->data, why);
                    src_path(bin_src, sizeof bin_src, bin_path);
                    remove(bin_src); /* no record while the .bin is replaced: a crash leaves it stale */
                    CHECK(dt_dlrm_bin_convert(ctx, bin_path, &st, o->data, &bd));
                    bin_record(o, bin_path);
                    if (!o->quiet)
                        printf("converted %s: %lld samples, %lld lines skipped -> %s\n", o->data,
                               (long long)st.samples, (long long)st.skipped, bin_path);
                }
            }
            CHECK(dt_comm_barrier(world));
        }
        CHECK(dt_dlrm_bin_open(ctx, &d->bin, path, NULL));
        for (f = 0; f < F && o->table_sizes; f++) /* a .bin given directly: its sizes are its ids' range */
            if (d->bin.table_size[f] != o->table[f]) {
                fprintf(stderr, "dlrm: %s was converted with %lld rows in C%d; --table-sizes asks for %lld: convert "
                                "the TSV again (--data FILE.tsv --table-sizes ...) or leave --table-sizes out\n",
                        path, (long long)d->bin.table_size[f], f + 1, (long long)o->table[f]);
                exit(2);
            }
        if (d->bin.n < o->eval_samples + o->batch) {
            fprintf(stderr, "dlrm: %s has %lld samples; it needs at least --eval-samples (%lld) + --batch (%lld)\n",
                    path, (long long)d->bin.n, (long long)o->eval_samples, (long long)o->batch);
            exit(1);
        }
        d->n_train = d->bin.n - o->eval_samples;
        d->epoch = d->n_train / o->batch * o->batch;
        for (f = 0; f < F; f++) d->card[f] = d->bin.table_size[f];
    }
}

/* This rank's slice of micro-batch g of size `size` (step s, micro m: g = s * accum + m); a
   file is read in whole global batches, epoch after epoch: step s trains on the samples of step
   s mod (n_train / B), and the last n_train mod B samples are not used (a batch that wrapped
   around the end would be cut differently by different world sizes). */
static void data_batch(data *d, dt_dlrm_batch *b, int64_t g, int64_t size, int rank, int world) {
    int64_t start, count;
    if (d->synthetic) { CHECK(dt_dlrm_synth_batch(g_ctx, &d->gen, b, g, size, rank, world)); return; }
    CHECK(dt_dlrm_split(g_ctx, &start, &count, g, size, rank, world, -1));
    start %= d->epoch; /* a multiple of B: a slice, inside one step's samples, never crosses it */
    CHECK(dt_dlrm_bin_range(g_ctx, &d->bin, b, start, count));
}

/* Held-out samples [start, start + count) of the eval set into b. */
static void data_eval(data *d, dt_dlrm_batch *b, int64_t start, int64_t count) {
    if (d->synthetic) CHECK(dt_dlrm_synth_range(g_ctx, &d->gen, b, EVAL_BASE + start, count));
    else CHECK(dt_dlrm_bin_range(g_ctx, &d->bin, b, d->n_train + start, count));
}

/* --dump-batches: the global batch of step `step` (0-based) into DIR/batch_<step + 1>, read
   whole by rank 0 (a sample is a pure function of its index, so this is the concatenation of
   the ranks' slices, at any world size). */
static void dump_batch(data *d, const opts *o, int64_t step) {
    dt_dlrm_batch b;
    dt_tensor lengths;
    const dt_tensor *ts[4];
    const char *names[4] = {"dense", "labels", "lengths", "ids"}, *meta[4];
    char path[1024], step_s[32], first_s[32];
    int64_t shape[2];
    memset(&b, 0, sizeof b);
    data_batch(d, &b, step, o->batch, 0, 1);
    shape[0] = F; shape[1] = b.size; /* lengths[f * B + i]: feature-major, as the ids */
    CHECK(dt_tensor_reshape(g_ctx, &lengths, &b.lengths, 2, shape));
    ts[0] = &b.dense; ts[1] = &b.labels; ts[2] = &lengths; ts[3] = &b.ids;
    snprintf(step_s, sizeof step_s, "%lld", (long long)(step + 1));
    snprintf(first_s, sizeof first_s, "%lld", (long long)b.start);
    meta[0] = "step"; meta[1] = step_s; meta[2] = "first_sample"; meta[3] = first_s;
    snprintf(path, sizeof path, "%s/batch_%08lld.safetensors", o->dump, (long long)(step + 1));
    CHECK(dt_safetensors_save(g_ctx, path, ts, names, 4, meta, 2));
    dt_dlrm_batch_free(g_ctx, &b);
}

/* ---------------------------------------------------------------- model */

typedef struct mlp { int n; dt_param *w[MAX_LAYERS + 1], *b[MAX_LAYERS + 1]; int relu_last; } mlp; /* hidden + output */

typedef struct model {
    dt_params ps;           /* the dense parameters, data parallel */
    mlp bottom, top;
    dt_param *cw[MAX_LAYERS], *cb[MAX_LAYERS]; /* DCNv2 cross layers */
    dt_param *cv[MAX_LAYERS];                  /* their low-rank factor V (--cross-rank R) */
    int dcn, cross, cross_rank, dim;
    dt_dtype wdtype;        /* --dtype: the linears' weights (biases f32) */
    int64_t inter;          /* width of the interaction output */
    dt_embed *emb;
} model;

/* A weight [d0, d1] of dtype wdtype (bf16: dt_linear's bf16 GEMMs take it as it is; dt_opt.h
   keeps its f32 master), or a bias [d0] (d1 0), f32: dt_linear adds it in f32. */
static dt_param *param(dt_params *ps, const char *name, int64_t d0, int64_t d1, uint64_t seed, dt_dtype wdtype) {
    dt_param_desc d = {0};
    dt_param *p;
    d.name = name; d.shape[0] = d0; d.shape[1] = d1;
    d.dtype = d1 ? wdtype : DT_F32;
    d.init.kind = d1 ? DT_INIT_SCALED_NORMAL : DT_INIT_ZEROS;
    d.init.gain = 1.41421356; /* He: std = sqrt(2 / fan_in), the MLPs are ReLU */
    d.init.seed = seed; d.no_decay = d1 == 0;
    CHECK(dt_params_add(g_ctx, ps, &p, &d));
    return p;
}

static void mlp_make(model *m, mlp *n, const char *prefix, int64_t in, const int *widths, int k, int64_t out,
                     int relu_last, uint64_t seed) {
    int i;
    char name[64];
    n->n = k + 1;
    n->relu_last = relu_last;
    for (i = 0; i <= k; i++) {
        int64_t o = i < k ? widths[i] : out;
        snprintf(name, sizeof name, "%s.%d.w", prefix, i); n->w[i] = param(&m->ps, name, o, in, seed, m->wdtype);
        snprintf(name, sizeof name, "%s.%d.b", prefix, i); n->b[i] = param(&m->ps, name, o, 0, seed, DT_F32);
        in = o;
    }
}

/* The 26 tables as dt_embed_create takes them, sharded as --shard says (plan: as `plan` says). */
static void table_descs(dt_embed_table_desc tabs[F], const opts *o, const data *d, const dt_plan_dlrm_plan *plan) {
    int f;
    static char names[F][16];
    memset(tabs, 0, sizeof(dt_embed_table_desc) * F);
    for (f = 0; f < F; f++) {
        snprintf(names[f], sizeof names[f], "C%d", f + 1);
        tabs[f].name = names[f];
        tabs[f].rows = d->card[f];
        tabs[f].dim = o->dim;
        tabs[f].optim.kind = !strcmp(o->opt, "sgd") ? DT_EMBED_SGD : DT_EMBED_ADAGRAD;
        tabs[f].optim.lr = o->emb_lr > 0 ? o->emb_lr : DT_OPT_ZERO; /* 0 in a desc is the default */
        tabs[f].sharding = !strcmp(o->shard, "row") ? DT_SHARD_ROW : !strcmp(o->shard, "table") ? DT_SHARD_TABLE
                         : !strcmp(o->shard, "data") ? DT_SHARD_DATA : !strcmp(o->shard, "column") ? DT_SHARD_COLUMN
                         : !strcmp(o->shard, "table-row") ? DT_SHARD_TABLE_ROW : DT_SHARD_AUTO;
        if (o->row_wise_over && tabs[f].rows > o->row_wise_over) tabs[f].sharding = DT_SHARD_ROW; /* pinned */
        if (plan) { /* the planner's: the kind, and the owner (table-wise) or group (table-row) it chose */
            tabs[f].sharding = plan->kind[f];
            tabs[f].pin_owner = plan->kind[f] == DT_SHARD_TABLE || plan->kind[f] == DT_SHARD_TABLE_ROW;
            tabs[f].owner = plan->owner[f];
        }
        if (strcmp(o->tier, "none")) {
            tabs[f].tier = !strcmp(o->tier, "disk") ? DT_TIER_DISK : DT_TIER_HOST;
            tabs[f].cache_rows = o->cache_rows;
            tabs[f].cache_fraction = o->cache_frac;
        }
    }
}

/* The embedding (collective): the tables placed by --shard, or by the planner's plan. */
static void embed_make(model *m, const opts *o, const data *d, dt_comm *world, const dt_plan_dlrm_plan *plan) {
    dt_embed_table_desc tabs[F];
    dt_embed_desc ed = {0};
    table_descs(tabs, o, d, plan);
    ed.tier_dir = o->tier_dir;
    ed.tables = tabs; ed.n_tables = F; ed.comm = world; ed.seed = o->seed;
    ed.batch_hint = o->batch;
    ed.dp_max_bytes = DP_MAX_BYTES;
    ed.print_plan = !o->quiet;
    ed.device = g_ctx->device; /* --device cuda: the tables too */
    CHECK(dt_embed_create(g_ctx, &m->emb, &ed));
}

/* The dense model: bottom MLP, DCNv2's cross layers, top MLP (data parallel). */
static void dense_make(model *m, const opts *o) {
    int f;
    char name[32];
    memset(m, 0, sizeof *m);
    m->dim = o->dim;
    m->dcn = !strcmp(o->arch, "dcn");
    m->cross = o->cross;
    m->cross_rank = o->cross_rank;
    m->wdtype = o->dtype;
    /* bottom: 13 -> ... -> D, ReLU after every layer (the DLRM reference) */
    mlp_make(m, &m->bottom, "bot", DT_DLRM_DENSE, o->bottom, o->n_bottom, o->dim, 1, o->seed);
    if (m->dcn) {
        int64_t w = (int64_t)(F + 1) * o->dim;
        for (f = 0; f < o->cross; f++) {
            int64_t r = o->cross_rank ? o->cross_rank : w; /* W [w, r]: full rank, or low rank after V [r, w] */
            if (o->cross_rank) {
                snprintf(name, sizeof name, "cross.%d.v", f); m->cv[f] = param(&m->ps, name, r, w, o->seed, m->wdtype);
            }
            snprintf(name, sizeof name, "cross.%d.w", f); m->cw[f] = param(&m->ps, name, w, r, o->seed, m->wdtype);
            snprintf(name, sizeof name, "cross.%d.b", f); m->cb[f] = param(&m->ps, name, w, 0, o->seed, DT_F32);
        }
        m->inter = w;
    } else {
        m->inter = o->dim + (int64_t)(F + 1) * F / 2;
    }
    mlp_make(m, &m->top, "top", m->inter, o->top, o->n_top, 1, 0, o->seed);
}

#ifdef DLRM_NO_MAIN /* tests/cuda_emu/k_dlrm.cpp's whole model (main makes the tables last: see setup) */
static void model_make(model *m, const opts *o, const data *d, dt_comm *world) {
    dense_make(m, o);
    embed_make(m, o, d, world, NULL);
}
#endif

/* Activations of one micro-batch of n rows, kept between forward and backward; grown to the
   largest n seen (a rank's local batch varies by one) and used through views of the first n
   rows. h: a layer's output (after the ReLU), dh: the grad of h, dp: the grad before the ReLU. */
typedef struct acts {
    int64_t cap;
    dt_tensor dense, bot_h[MAX_LAYERS + 1], bot_dh[MAX_LAYERS + 1], bot_dp[MAX_LAYERS + 1];
    dt_tensor emb, d_emb, inter, d_inter;
    dt_tensor top_h[MAX_LAYERS + 1], top_dh[MAX_LAYERS + 1], top_dp[MAX_LAYERS + 1];
    dt_tensor x[MAX_LAYERS + 1], u[MAX_LAYERS], d_x[MAX_LAYERS + 1], d_u; /* DCN, x[0] = [z, e] */
    dt_tensor h[MAX_LAYERS], d_h;  /* low-rank DCN: h = V x_l */
} acts;

typedef struct views { dt_tensor t[256]; int n; } views; /* the row views of one pass (8 + 8 layers and 8 cross layers need more than 128) */

static dt_tensor *rows(views *v, dt_tensor *t, int64_t n) {
    int64_t shape[2];
    dt_tensor *r;
    if (v->n == 256) { fprintf(stderr, "dlrm: too many views\n"); exit(1); }
    r = &v->t[v->n++];
    shape[0] = n; shape[1] = t->shape[1];
    CHECK(dt_tensor_view(g_ctx, r, t, 0, 2, shape));
    return r;
}

static void acts_grow(acts *a, const model *m, int64_t n) {
    enum { MAXT = 10 * MAX_LAYERS + 16 };
    dt_tensor *ts[MAXT];
    int64_t cols[MAXT], cap = a->cap;
    int k = 0, i;
    if (n <= a->cap && a->cap) return; /* (created on the first call even for n = 0: a rank's
                                           empty local batch is valid and views 0 rows of them) */
    while (cap < n || cap == 0) cap = cap ? 2 * cap : 64;
#define ADD(t_, c_) do { ts[k] = (t_); cols[k] = (c_); k++; } while (0)
    ADD(&a->dense, DT_DLRM_DENSE);
    for (i = 0; i < m->bottom.n; i++) {
        int64_t c = m->bottom.w[i]->value.shape[0];
        ADD(&a->bot_h[i], c); ADD(&a->bot_dh[i], c); ADD(&a->bot_dp[i], c);
    }
    ADD(&a->emb, (int64_t)F * m->dim); ADD(&a->d_emb, (int64_t)F * m->dim);
    ADD(&a->inter, m->inter); ADD(&a->d_inter, m->inter);
    for (i = 0; i < m->top.n; i++) {
        int64_t c = m->top.w[i]->value.shape[0];
        ADD(&a->top_h[i], c); ADD(&a->top_dh[i], c); ADD(&a->top_dp[i], c);
    }
    if (m->dcn) {
        for (i = 0; i <= m->cross; i++) { ADD(&a->x[i], m->inter); ADD(&a->d_x[i], m->inter); }
        for (i = 0; i < m->cross; i++) ADD(&a->u[i], m->inter);
        ADD(&a->d_u, m->inter);
        for (i = 0; m->cross_rank && i < m->cross; i++) ADD(&a->h[i], m->cross_rank);
        if (m->cross_rank) ADD(&a->d_h, m->cross_rank);
    }
#undef ADD
    for (i = 0; i < k; i++) {
        dt_tensor_desc d = {DT_DTYPE_DEFAULT}; /* (not {0}: tests/cuda_emu/k_dlrm.cpp compiles this as C++) */
        d.shape[0] = cap; d.shape[1] = cols[i];
        dt_tensor_free(g_ctx, ts[i]);
        CHECK(dt_tensor_create(g_ctx, ts[i], &d));
    }
    a->cap = cap;
}

static void acts_free(acts *a) {
    dt_tensor *t = (dt_tensor *)a;
    size_t i, n = (sizeof *a - offsetof(acts, dense)) / sizeof(dt_tensor);
    t = &a->dense;
    for (i = 0; i < n; i++) dt_tensor_free(g_ctx, &t[i]);
    a->cap = 0;
}

/* h_i = relu(W_i h_{i-1} + b_i), no ReLU after the top MLP's last layer (the logit). */
static dt_tensor *mlp_fwd(views *v, const mlp *n, dt_tensor *in, dt_tensor *h, int64_t b) {
    int i;
    for (i = 0; i < n->n; i++) {
        dt_tensor *o = rows(v, &h[i], b);
        CHECK(dt_linear_fwd(g_ctx, o, in, &n->w[i]->value, &n->b[i]->value));
        if (i + 1 < n->n || n->relu_last) CHECK(dt_relu_fwd(g_ctx, o, o));
        if (g_progress) CHECK(dt_embed_progress(g_progress));
        in = o;
    }
    return in;
}

/* From dh[last] (set by the caller) down to dx (may be NULL: the input needs no grad). ReLU's
   backward reads the layer's output, which is > 0 exactly where its input was. Each layer's
   grads go to the bucketer as soon as they are final. */
static void mlp_bwd(views *v, const mlp *n, dt_tensor *in, dt_tensor *h, dt_tensor *dh, dt_tensor *dp,
                    dt_tensor *dx, int64_t b, dt_bucketer *bk) {
    int i;
    for (i = n->n - 1; i >= 0; i--) {
        dt_tensor *g = rows(v, &dh[i], b), *x = i ? rows(v, &h[i - 1], b) : in;
        dt_tensor *gx = i ? rows(v, &dh[i - 1], b) : dx;
        if (i + 1 < n->n || n->relu_last) {
            dt_tensor *p = rows(v, &dp[i], b);
            CHECK(dt_tensor_fill(g_ctx, p, 0.0));
            CHECK(dt_relu_bwd(g_ctx, p, g, rows(v, &h[i], b)));
            g = p;
        }
        if (gx) CHECK(dt_tensor_fill(g_ctx, gx, 0.0));
        CHECK(dt_linear_bwd(g_ctx, gx, &n->w[i]->grad, &n->b[i]->grad, g, x, &n->w[i]->value));
        if (g_progress) CHECK(dt_embed_progress(g_progress));
        CHECK(dt_bucketer_mark_ready(bk, n->w[i]));
        CHECK(dt_bucketer_mark_ready(bk, n->b[i]));
    }
}

/* The local batch as dt_embed's jagged batch (dlrm_data.h keeps lengths as i32; dt_embed wants
   int64: converted into a buffer kept across steps). */
typedef struct kjt_buf { int64_t *lengths; int64_t cap; } kjt_buf;

static dt_kjt kjt_of(kjt_buf *kb, const dt_dlrm_batch *b) {
    dt_kjt k;
    int64_t i, n = (int64_t)F * b->size;
    const int32_t *len = (const int32_t *)b->lengths.data;
    CHECK(dt_grow(g_ctx, (void **)&kb->lengths, &kb->cap, n ? n : 1, sizeof(int64_t), "kjt lengths"));
    for (i = 0; i < n; i++) kb->lengths[i] = len[i];
    memset(&k, 0, sizeof k);
    k.n_features = F;
    k.batch = b->size;
    k.lengths = kb->lengths;
    k.ids = b->ids.data;
    k.ids_dtype = DT_I64;
    return k;
}

/* Forward of a local batch to the logits [b, 1] (a view into a's top activations). begun: its
   id exchange was posted already (--overlap); next: the batch whose exchange to post now. */
static dt_tensor *forward(views *v, model *m, acts *a, const dt_dlrm_batch *batch, kjt_buf *kb, int begun,
                          const dt_dlrm_batch *next) {
    int64_t b = batch->size, D = m->dim;
    dt_tensor *dense, *z, *e, *inter;
    acts_grow(a, m, b);
    dense = rows(v, &a->dense, b);
    CHECK(dt_tensor_copy(g_ctx, dense, &batch->dense));
    if (g_dense_only) { /* the planner's dense step: the ids converted as always, the embedding's output as it lies */
        (void)kjt_of(kb, batch);
        z = mlp_fwd(v, &m->bottom, dense, a->bot_h, b);
        e = rows(v, &a->emb, b);
        CHECK(dt_tensor_fill(g_ctx, e, 0.0));
    } else {
        if (!begun) {
            dt_kjt k = kjt_of(kb, batch);
            CHECK(dt_embed_forward_begin(m->emb, &k));
        }
        g_progress = NULL;
        if (next) { /* this batch's rows now, then the next batch's ids go out during all the dense work */
            dt_kjt kn = kjt_of(kb, next);
            e = rows(v, &a->emb, b);
            CHECK(dt_embed_forward_end(m->emb, e));
            if (g_prefetch) CHECK(dt_embed_prefetch(m->emb, &kn)); /* its ids arrive now, its rows during this step */
            else CHECK(dt_embed_forward_begin(m->emb, &kn));
            g_progress = g_prefetch ? NULL : m->emb;
            z = mlp_fwd(v, &m->bottom, dense, a->bot_h, b);
        } else {
            /* the id exchange first, then the bottom MLP, then the pooled exchange (dt_embed's
               begin/end split: dense work of this batch between the two all-to-alls) */
            z = mlp_fwd(v, &m->bottom, dense, a->bot_h, b);
            e = rows(v, &a->emb, b);
            CHECK(dt_embed_forward_end(m->emb, e));
        }
    }
    if (m->dcn) {
        const dt_tensor *parts[2];
        dt_tensor *x;
        int l;
        parts[0] = z; parts[1] = e;
        x = rows(v, &a->x[0], b);
        CHECK(dt_concat_fwd(g_ctx, x, parts, 2));
        for (l = 0; l < m->cross; l++) { /* x_{l+1} = x0 * (W x_l + b) + x_l; low rank: W (V x_l) */
            dt_tensor *u = rows(v, &a->u[l], b), *xn = rows(v, &a->x[l + 1], b), *in = x;
            if (m->cross_rank) {
                in = rows(v, &a->h[l], b);
                CHECK(dt_linear_fwd(g_ctx, in, x, &m->cv[l]->value, NULL));
            }
            CHECK(dt_linear_fwd(g_ctx, u, in, &m->cw[l]->value, &m->cb[l]->value));
            CHECK(dt_mul_fwd(g_ctx, xn, rows(v, &a->x[0], b), u));
            CHECK(dt_add(g_ctx, xn, xn, x));
            x = xn;
        }
        inter = x;
    } else {
        dt_tensor e3;
        int64_t shape[3];
        shape[0] = b; shape[1] = F; shape[2] = D;
        CHECK(dt_tensor_reshape(g_ctx, &e3, e, 3, shape));
        inter = rows(v, &a->inter, b);
        CHECK(dt_dot_interaction_fwd(g_ctx, inter, z, &e3));
    }
    return mlp_fwd(v, &m->top, inter, a->top_h, b);
}

/* Backward from the logits' grad (already in a->top_dh[last]); ends with the embedding
   backward (sent to the owners, applied or kept per dt_embed_set_sync). */
static void backward(views *v, model *m, acts *a, int64_t b, dt_bucketer *bk) {
    int64_t D = m->dim;
    dt_tensor *dense = rows(v, &a->dense, b), *z = rows(v, &a->bot_h[m->bottom.n - 1], b);
    dt_tensor *e = rows(v, &a->emb, b), *dz = rows(v, &a->bot_dh[m->bottom.n - 1], b);
    dt_tensor *de = rows(v, &a->d_emb, b), *inter, *dinter;
    int l;
    if (m->dcn) {
        inter = rows(v, &a->x[m->cross], b);
        dinter = rows(v, &a->d_x[m->cross], b);
    } else {
        inter = rows(v, &a->inter, b);
        dinter = rows(v, &a->d_inter, b);
    }
    mlp_bwd(v, &m->top, inter, a->top_h, a->top_dh, a->top_dp, dinter, b, bk);
    if (m->dcn) {
        dt_tensor *x0 = rows(v, &a->x[0], b), *dx0 = rows(v, &a->d_x[0], b), *du = rows(v, &a->d_u, b);
        dt_tensor *outs[2];
        for (l = 0; l < m->cross; l++) CHECK(dt_tensor_fill(g_ctx, rows(v, &a->d_x[l], b), 0.0));
        for (l = m->cross - 1; l >= 0; l--) {
            /* x_{l+1} = x0 * u + x_l: dx_l += dx_{l+1}; du = dx_{l+1} * x0; dx0 += dx_{l+1} * u;
               then u = W x_l + b */
            dt_tensor *dxn = rows(v, &a->d_x[l + 1], b), *dxl = rows(v, &a->d_x[l], b);
            dt_tensor *xl = rows(v, &a->x[l], b), *u = rows(v, &a->u[l], b);
            CHECK(dt_axpy(g_ctx, dxl, 1.0f, dxn));
            CHECK(dt_tensor_fill(g_ctx, du, 0.0));
            CHECK(dt_mul_bwd(g_ctx, dx0, du, dxn, x0, u));
            if (m->cross_rank) { /* u = W h + b, h = V x_l */
                dt_tensor *h = rows(v, &a->h[l], b), *dh = rows(v, &a->d_h, b);
                CHECK(dt_tensor_fill(g_ctx, dh, 0.0));
                CHECK(dt_linear_bwd(g_ctx, dh, &m->cw[l]->grad, &m->cb[l]->grad, du, h, &m->cw[l]->value));
                CHECK(dt_linear_bwd(g_ctx, dxl, &m->cv[l]->grad, NULL, dh, xl, &m->cv[l]->value));
            } else CHECK(dt_linear_bwd(g_ctx, dxl, &m->cw[l]->grad, &m->cb[l]->grad, du, xl, &m->cw[l]->value));
            CHECK(dt_bucketer_mark_ready(bk, m->cw[l]));
            CHECK(dt_bucketer_mark_ready(bk, m->cb[l]));
            if (m->cross_rank) CHECK(dt_bucketer_mark_ready(bk, m->cv[l]));
        }
        outs[0] = dz; outs[1] = de;
        CHECK(dt_split_fwd(g_ctx, outs, 2, dx0));
    } else {
        dt_tensor e3, de3;
        int64_t shape[3];
        shape[0] = b; shape[1] = F; shape[2] = D;
        CHECK(dt_tensor_reshape(g_ctx, &e3, e, 3, shape));
        CHECK(dt_tensor_reshape(g_ctx, &de3, de, 3, shape));
        CHECK(dt_tensor_fill(g_ctx, dz, 0.0));
        CHECK(dt_tensor_fill(g_ctx, de, 0.0));
        CHECK(dt_dot_interaction_bwd(g_ctx, dz, &de3, dinter, z, &e3));
    }
    mlp_bwd(v, &m->bottom, dense, a->bot_h, a->bot_dh, a->bot_dp, NULL, b, bk);
    if (!g_dense_only) CHECK(dt_embed_backward(m->emb, de));
}

/* ---------------------------------------------------------------- evaluation */

/* Scores (sigmoid of the logits) of the held-out samples on every rank, gathered in rank order
   (so the arrays are those of a 1-rank run), then the exact AUC and the logloss. Tiered tables
   (--tier): in chunks of a training micro-batch, whose rows the caches are sized for (a cache
   smaller than one forward's rows is an error); the scores are the same. */
static void evaluate(model *m, acts *a, data *d, const opts *o, dt_comm *world, kjt_buf *kb,
                     dt_dlrm_batch *batch, double *auc, double *logloss) {
    int W = dt_comm_size(world), r, rank = dt_comm_rank(world);
    int64_t n = o->eval_samples, pad = (n + W - 1) / W, i, at = 0, pos, start, count, chunk, off;
    dt_tensor mine, all;
    dt_tensor_desc td = {DT_DTYPE_DEFAULT};
    float *scores, *labels;
    CHECK(dt_dlrm_split(g_ctx, &start, &count, 0, n, rank, W, -1));
    chunk = strcmp(o->tier, "none") ? o->batch / o->accum / W : pad; /* the same count of forwards on every rank */
    if (chunk < 1) chunk = 1;
    td.device = DT_CPU; /* the scores are gathered and ranked on the host */
    td.shape[0] = 2 * pad;
    CHECK(dt_tensor_create(g_ctx, &mine, &td));
    td.shape[0] = 2 * pad * W;
    CHECK(dt_tensor_create(g_ctx, &all, &td));
    for (off = 0; off < pad; off += chunk) {
        int64_t len = count - off < chunk ? count - off : chunk;
        views v = {0};
        dt_tensor *logits, hl = {0};
        data_eval(d, batch, start + off, len > 0 ? len : 0);
        logits = forward(&v, m, a, batch, kb, 0, NULL);
        if (logits->device == DT_CUDA_DEVICE) {
            CHECK(dt_tensor_create_like(g_ctx, &hl, logits, DT_DTYPE_DEFAULT, DT_CPU));
            CHECK(dt_tensor_copy(g_ctx, &hl, logits));
            logits = &hl;
        }
        for (i = 0; i < batch->size; i++) {
            float z = ((const float *)logits->data)[i];
            ((float *)mine.data)[off + i] = z >= 0 ? 1.0f / (1.0f + expf(-z)) : expf(z) / (1.0f + expf(z));
            ((float *)mine.data)[pad + off + i] = ((const float *)batch->labels.data)[i];
        }
        dt_tensor_free(g_ctx, &hl);
    }
    CHECK(dt_comm_allgather(world, &all, &mine));
    scores = (float *)dt_alloc(g_ctx, (size_t)n * 2 * sizeof(float));
    if (!scores) CHECK(DT_ERR_OOM);
    labels = scores + n;
    for (r = 0; r < W; r++) { /* rank r's slice of the split, in rank order */
        int64_t start, count;
        CHECK(dt_dlrm_split(g_ctx, &start, &count, 0, n, r, W, -1));
        memcpy(scores + at, (float *)all.data + 2 * pad * r, (size_t)count * sizeof(float));
        memcpy(labels + at, (float *)all.data + 2 * pad * r + pad, (size_t)count * sizeof(float));
        at += count;
    }
    for (i = 0, pos = 0; i < n; i++) pos += labels[i] > 0.5f;
    if (pos == 0 || pos == n) { /* one class: no AUC (NAN, said once), the logloss still is one */
        *auc = NAN;
        if (rank == 0 && !g_auc_warned)
            fprintf(stderr, "dlrm: warning: every one of the %lld held-out labels is %d: the AUC is undefined "
                            "(reported as nan); training goes on\n", (long long)n, pos == n);
        g_auc_warned = 1;
    } else {
        CHECK(dt_dlrm_auc(g_ctx, auc, scores, labels, n));
    }
    CHECK(dt_dlrm_logloss(g_ctx, logloss, scores, labels, n, 0));
    dt_release(g_ctx, scores);
    dt_tensor_free(g_ctx, &mine);
    dt_tensor_free(g_ctx, &all);
}

/* ---------------------------------------------------------------- checkpoints */

static void ckpt_dir(char *out, size_t n, const char *root, const char *part) { snprintf(out, n, "%s/%s", root, part); }

/* The train state records what --resume must find again: the seed (rng_seed), the samples
   trained (data_cursor = step x batch: every step of a run, resumed or not, has the same
   --batch, see resume()), the data source ("data"), the last step's loss ("loss", for the
   final line of a run resumed with nothing left to train; "nan" at step 0) and the weights'
   --dtype ("dtype": a resume with the other one is told what it gets). */
static void save(model *m, dt_optimizer *opt, const opts *o, dt_comm *world, int64_t step, double loss) {
    dt_train_state st;
    dt_checkpoint_desc cd = {0};
    char dir[1024], v[64];
    memset(&st, 0, sizeof st);
    st.step = step; st.rng_seed = o->seed; st.data_cursor = step * o->batch;
    CHECK(dt_train_state_set(g_ctx, &st, "data", o->data));
    snprintf(v, sizeof v, "%.17g", step ? loss : NAN);
    CHECK(dt_train_state_set(g_ctx, &st, "loss", v));
    CHECK(dt_train_state_set(g_ctx, &st, "dtype", dt_dtype_name(o->dtype)));
    cd.comm = world; cd.layout = "dense=dp,embed=plan"; cd.keep = 3;
    ckpt_dir(dir, sizeof dir, o->ckpt, "dense"); cd.dir = dir; /* dense first: see the top */
    CHECK(dt_checkpoint_save(g_ctx, &m->ps, opt, &st, &cd));
    ckpt_dir(dir, sizeof dir, o->ckpt, "embed"); cd.dir = dir;
    CHECK(dt_embed_checkpoint_save(m->emb, &st, &cd));
}

/* Loads the newest embed checkpoint and the dense one of the same step; returns that step and
   the loss it recorded (NAN when none). A checkpoint of another seed, batch or data source would
   continue another run's sample stream: refused with a message naming both values (exit 2). */
static int64_t resume(model *m, dt_optimizer *opt, const opts *o, dt_comm *world, double *loss) {
    dt_train_state st;
    dt_checkpoint_desc cd = {0};
    char dir[1024], step_dir[64];
    memset(&st, 0, sizeof st);
    cd.comm = world;
    ckpt_dir(dir, sizeof dir, o->ckpt, "embed"); cd.dir = dir;
    CHECK(dt_embed_checkpoint_load(m->emb, &st, &cd));
    snprintf(step_dir, sizeof step_dir, "step_%08lld", (long long)st.step);
    ckpt_dir(dir, sizeof dir, o->ckpt, "dense"); cd.dir = dir; cd.step_dir = step_dir;
    CHECK(dt_checkpoint_load(g_ctx, &m->ps, opt, &st, &cd));
    {
        const char *data = dt_train_state_get(&st, "data"), *l = dt_train_state_get(&st, "loss");
        char why[512];
        why[0] = 0;
        if (st.rng_seed != o->seed)
            snprintf(why, sizeof why, "it was trained with --seed %llu, this run has --seed %llu",
                     (unsigned long long)st.rng_seed, (unsigned long long)o->seed);
        else if (st.data_cursor != st.step * o->batch)
            snprintf(why, sizeof why, "its %lld steps trained %lld samples (--batch %lld), this run has --batch %lld",
                     (long long)st.step, (long long)st.data_cursor,
                     st.step ? (long long)(st.data_cursor / st.step) : 0LL, (long long)o->batch);
        else if (data && strcmp(data, o->data))
            snprintf(why, sizeof why, "it was trained on --data %s, this run has --data %s", data, o->data);
        if (why[0]) {
            if (g_rank == 0)
                fprintf(stderr, "dlrm: --resume: the checkpoint in %s (step %lld) does not continue this run: %s; "
                                "resume with the flags it was trained with, or use another --ckpt DIR\n",
                        o->ckpt, (long long)st.step, why);
            exit(2);
        }
        *loss = l ? strtod(l, NULL) : NAN;
    }
    {   /* another --dtype is no error: dt_checkpoint_load gave an f32 weight the checkpoint's f32
           master, a bf16 weight the f32 weight rounded (and its master that f32 weight); say which */
        const char *dt = dt_train_state_get(&st, "dtype"), *here = dt_dtype_name(o->dtype);
        if (!dt) dt = "f32"; /* written before --dtype: f32 */
        if (strcmp(dt, here) && g_rank == 0)
            fprintf(stderr, "dlrm: --resume: the checkpoint in %s (step %lld) was trained with --dtype %s; this run "
                            "goes on in %s from its %s\n", o->ckpt, (long long)st.step, dt, here,
                    o->dtype == DT_F32 ? "f32 master weights" : "f32 weights rounded to bf16 (the masters: the f32 weights)");
    }
    return st.step;
}

/* ---------------------------------------------------------------- training */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#ifndef DLRM_NO_MAIN /* tests/cuda_emu/k_dlrm.cpp includes this file for its model, forward and backward */
/* Everything one run holds, so that main reads as the training loop and each phase of it is a
   function of its own. */
typedef struct trainer {
    dt_ctx ctx;
    dt_comm *world;
    int W;                                /* world size */
    opts o;
    data d;
    model m;
    acts a;
    kjt_buf kb;
    dt_dlrm_batch batches[2], *batch;     /* --overlap: the next micro-batch is read into the other */
    int begun;                            /* batch's id exchange is already posted (--overlap) */
    dt_optimizer *opt;                    /* the dense parameters' (the tables have their own) */
    dt_bucketer *bk;                      /* the dense parameters' data-parallel all-reduce */
    FILE *log;                            /* --log, rank 0 */
    int64_t step, first_step;
    /* loss: the last trained step's (a resumed run with nothing left: the checkpoint's; nan when
       no step was ever trained); auc, logloss: the last evaluation's (nan: one-class labels) */
    double loss, auc, logloss;
    double t0, comm_s, eval_s;            /* seconds: since the first step, in the step's sync, evaluating */
    double step_s;                        /* the last step's seconds on this rank (--log's step_s) */
    double train_peak;                    /* dt_peak_bytes over the training steps (evaluations apart) */
    int logging;                          /* this step reads its loss (is_logging_step) */
    dt_tensor labels;                     /* --device cuda: the micro-batch's labels, uploaded once */
    /* --device cuda: what a step asked of the device (ctx->counters), the most of each count over
       the steps after the first; the loss reads of logging steps apart (read). --profile prints it. */
    dt_cuda_counters worst, read;
} trainer;

/* acc += sign * (a - b), count by count. */
static void counters_add(dt_cuda_counters *acc, const dt_cuda_counters *a, const dt_cuda_counters *b, int sign) {
    acc->syncs += sign * (a->syncs - b->syncs);
    acc->allocs += sign * (a->allocs - b->allocs);
    acc->frees += sign * (a->frees - b->frees);
    acc->h2d_bytes += sign * (a->h2d_bytes - b->h2d_bytes);
    acc->h2d_calls += sign * (a->h2d_calls - b->h2d_calls);
    acc->d2h_bytes += sign * (a->d2h_bytes - b->d2h_bytes);
    acc->d2h_calls += sign * (a->d2h_calls - b->d2h_calls);
}
static void counters_max(dt_cuda_counters *w, const dt_cuda_counters *c) {
#define DLRM_MAX_(f) if (c->f > w->f) w->f = c->f
    DLRM_MAX_(syncs); DLRM_MAX_(allocs); DLRM_MAX_(frees); DLRM_MAX_(h2d_bytes); DLRM_MAX_(h2d_calls);
    DLRM_MAX_(d2h_bytes); DLRM_MAX_(d2h_calls);
#undef DLRM_MAX_
}

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

/* The host grid at start (collective): each host's name and its ranks (a table-row table is
   row-wise over one host's ranks, so this is where its all-to-alls stay), and a note where a host
   runs more ranks than it has CPUs (bound to them or not: dt_comm_cpu_note). */
static void print_hosts(dt_comm *world) {
    enum { HN = 64 };
    dt_tensor mine, all;
    dt_tensor_desc td;
    int r, q, W = dt_comm_size(world);
    char note[512];
    memset(&td, 0, sizeof td);
    td.dtype = DT_U8; td.device = DT_CPU; td.shape[0] = HN;
    CHECK(dt_tensor_create(g_ctx, &mine, &td));
    td.shape[0] = (int64_t)HN * W;
    CHECK(dt_tensor_create(g_ctx, &all, &td));
    memset(mine.data, 0, HN);
    if (gethostname((char *)mine.data, HN - 1) != 0) snprintf((char *)mine.data, HN, "?");
    CHECK(dt_comm_allgather(world, &all, &mine));
    CHECK(dt_comm_cpu_note(world, note, sizeof note));
    if (g_rank == 0) {
        const char *h = (const char *)all.data;
        printf("hosts (%d ranks, %d on this host):", W, dt_comm_local_size(world));
        for (r = 0; r < W; r++) {
            for (q = 0; q < r && strcmp(h + (size_t)q * HN, h + (size_t)r * HN); q++) {}
            if (q < r) continue; /* listed with its first rank */
            printf(" %s [", h + (size_t)r * HN);
            for (q = r; q < W; q++)
                if (!strcmp(h + (size_t)q * HN, h + (size_t)r * HN)) printf("%s%d", q == r ? "" : " ", q);
            printf("]");
        }
        printf("\n");
        if (note[0]) printf("%s\n", note);
    }
    dt_tensor_free(g_ctx, &mine);
    dt_tensor_free(g_ctx, &all);
}

/* The flags, the ctx (on --device), the world, the data, the model, its dense optimizer and
   bucketer. */
static void plan_tables(trainer *t);

static void setup(trainer *t, int argc, char **argv) {
    dt_ctx_desc cdesc;
    dt_opt_desc od;
    dt_bucketer_desc bd;
    memset(&cdesc, 0, sizeof cdesc); /* not = {0}: build/examples/emu/dlrm compiles this file as C++ */
    memset(&od, 0, sizeof od);
    memset(&bd, 0, sizeof bd);
    parse(&t->o, argc, argv);
    if (t->o.prefetch) t->o.overlap = 1; /* the next batch begins (and its rows come) during this one */
    g_prefetch = t->o.prefetch;
    cdesc.device = !strcmp(t->o.device, "cuda") ? DT_CUDA_DEVICE : DT_CPU; /* parameters, activations, tables */
    cdesc.cuda_device = local_device();
    g_ctx = &t->ctx; /* so that a failing dt_ctx_init is reported with its own message */
    CHECK(dt_ctx_init(&t->ctx, &cdesc));
    {
        dt_comm_desc wd;
        memset(&wd, 0, sizeof wd);
        wd.hier = t->o.hier;
        wd.host_size = t->o.host_size;
        CHECK(dt_comm_create_world(&t->ctx, &t->world, &wd));
    }
    g_rank = dt_comm_rank(t->world);
    t->W = dt_comm_size(t->world);
    if (g_rank == 0 && t->o.cross_given && strcmp(t->o.arch, "dcn")) /* not refused: scripts pass one model's flags to both */
        fprintf(stderr, "dlrm: warning: --cross and --cross-rank shape DCNv2's cross layers; --arch %s has none and "
                        "ignores them\n", t->o.arch);
    if (t->o.timeout > 0) CHECK(dt_comm_set_timeout(t->world, t->o.timeout)); /* comms split from it inherit it */
    if (!t->o.quiet) print_hosts(t->world);
    data_open(&t->d, &t->o, t->world);
    dense_make(&t->m, &t->o);
    t->batch = &t->batches[0];
    od.kind = !strcmp(t->o.opt, "sgd") ? DT_OPT_SGD : DT_OPT_ADAGRAD;
    od.lr = t->o.lr > 0 ? t->o.lr : DT_OPT_ZERO; /* 0 in a desc is the default */
    od.comm = t->world;
    CHECK(dt_opt_create(&t->ctx, &t->opt, &t->m.ps, &od));
    bd.average = -1; /* the loss is already the global mean: sum the ranks' grads */
    CHECK(dt_bucketer_create(t->world, &t->bk, &t->m.ps, &bd));
    /* the tables last: the planner times the dense step above without them */
    if (t->o.plan || !strcmp(t->o.shard, "plan")) plan_tables(t);
    else embed_make(&t->m, &t->o, &t->d, t->world, NULL);
    dt_reset_peak_bytes(&t->ctx); /* the training's peak: from here */
}

/* --ckpt's and --dump-batches' directories (rank 0), --resume's checkpoint, --log's file; 0 when
   one cannot be had (a checkpoint that does not continue this run exits 2). */
static int open_outputs(trainer *t) {
    const opts *o = &t->o;
    if (o->ckpt && g_rank == 0 && mkdir(o->ckpt, 0777) != 0 && errno != EEXIST) { /* dense/ and embed/ go in it */
        fprintf(stderr, "dlrm: cannot create --ckpt %s: %s\n", o->ckpt, strerror(errno));
        return 0;
    }
    if (o->dump && g_rank == 0 && mkdir(o->dump, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "dlrm: cannot create --dump-batches %s: %s\n", o->dump, strerror(errno));
        return 0;
    }
    if (o->resume) t->step = resume(&t->m, t->opt, o, t->world, &t->loss);
    t->first_step = t->step;
    if (t->step > o->steps) { /* the same on every rank (they loaded the same checkpoint) */
        if (g_rank == 0)
            fprintf(stderr, "dlrm: --resume: the checkpoint in %s is at step %lld, past --steps %lld: nothing to "
                            "train; give --steps above %lld to train on\n", o->ckpt, (long long)t->step,
                    (long long)o->steps, (long long)t->step);
        exit(2);
    }
    if (o->resume && t->step == o->steps && g_rank == 0 && !o->quiet)
        printf("dlrm: --resume: the checkpoint in %s is at step %lld = --steps: nothing to train (the final line "
               "gives its recorded loss and evaluates it)\n", o->ckpt, (long long)t->step);
    if (g_rank == 0 && o->log && !(t->log = fopen(o->log, o->resume ? "a" : "w"))) {
        fprintf(stderr, "dlrm: cannot open --log %s\n", o->log);
        return 0;
    }
    return 1;
}

/* Micro-batch mi of this step: forward, loss, backward (the dense grads reach the bucketer, the
   tables' their owners, on the last one only); returns the sum of its samples' losses. ahead:
   --overlap may post the next step's first exchange from the last micro-batch. */
static double train_micro(trainer *t, int mi, int ahead) {
    const opts *o = &t->o;
    int64_t micro = o->batch / o->accum;
    views v = {0};
    dt_tensor *logits, *dlogits;
    dt_dlrm_batch *next = NULL;
    const dt_tensor *labels;
    float l = 0;
    double sum;
    int last = mi == o->accum - 1;
    if (!t->begun) data_batch(&t->d, t->batch, t->step * o->accum + mi, micro, g_rank, t->W);
    labels = &t->batch->labels;
    if (o->overlap && (!last || ahead)) { /* the next micro-batch (of this step or the next) */
        next = t->batch == &t->batches[0] ? &t->batches[1] : &t->batches[0];
        data_batch(&t->d, next, t->step * o->accum + mi + 1, micro, g_rank, t->W);
    }
    CHECK(dt_bucketer_set_sync(t->bk, last));
    if (!g_dense_only) CHECK(dt_embed_set_sync(t->m.emb, last));
    if (t->ctx.device == DT_CUDA_DEVICE) { /* the labels go up once, for the loss and its gradient */
        if (t->labels.numel != t->batch->labels.numel) {
            dt_tensor_free(&t->ctx, &t->labels);
            CHECK(dt_tensor_create_like(&t->ctx, &t->labels, &t->batch->labels, DT_DTYPE_DEFAULT, DT_CUDA_DEVICE));
        }
        CHECK(dt_tensor_copy(&t->ctx, &t->labels, &t->batch->labels));
        labels = &t->labels;
    }
    logits = forward(&v, &t->m, &t->a, t->batch, &t->kb, t->begun, o->overlap ? next : NULL);
    {   /* the loss only on a logging step: read, it is the step's one wait (counted apart) */
        dt_cuda_counters before = t->ctx.counters;
        CHECK(dt_bce_logits_fwd(&t->ctx, t->logging ? &l : NULL, logits, labels));
        if (t->logging) counters_add(&t->read, &t->ctx.counters, &before, 1);
    }
    sum = (double)l * (double)t->batch->size;
    dlogits = rows(&v, &t->a.top_dh[t->m.top.n - 1], t->batch->size);
    CHECK(dt_tensor_fill(&t->ctx, dlogits, 0.0));
    /* mean over the rank's rows x rows / B = this rank's share of the global mean */
    CHECK(dt_bce_logits_bwd(&t->ctx, dlogits, logits, labels, (float)t->batch->size / (float)o->batch));
    backward(&v, &t->m, &t->a, t->batch->size, t->bk);
    g_progress = NULL;
    t->begun = o->overlap && next != NULL;
    if (t->begun) t->batch = next;
    return sum;
}

/* A step whose loss someone reads: printed (--print-every, the last), written (--log: every
   step) or checkpointed. The others leave the loss on the device, and on CUDA do not wait for
   it. The same on every rank. */
static int is_logging_step(const trainer *t) {
    const opts *o = &t->o;
    int64_t n = t->step + 1;
    return o->log || n == o->steps || (!o->quiet && o->print_every && n % o->print_every == 0) ||
           (o->ckpt && o->ckpt_every && n % o->ckpt_every == 0);
}

/* One optimizer step: its micro-batches, the dense sync and update, and on a logging step the
   global batch's mean loss into t->loss. */
static void train_step(trainer *t) {
    const opts *o = &t->o;
    double sums[1] = {0}, tc;
    int mi;
    dt_cuda_counters before = t->ctx.counters, step, none;
    memset(&t->read, 0, sizeof t->read);
    memset(&step, 0, sizeof step);
    memset(&none, 0, sizeof none);
    t->logging = is_logging_step(t);
    /* --overlap: the next micro-batch's exchange is posted during this one, except into a step
       that evaluates or checkpoints (they need the embedding idle) */
    int ahead = o->overlap && t->step + 1 < o->steps && (t->step + 1) % o->eval_every != 0 &&
                !(o->ckpt && o->ckpt_every && (t->step + 1) % o->ckpt_every == 0);
    if (o->dump && g_rank == 0) dump_batch(&t->d, o, t->step);
    for (mi = 0; mi < o->accum; mi++) sums[0] += train_micro(t, mi, ahead);
    tc = now();
    CHECK(dt_bucketer_finish(t->bk));
    CHECK(dt_opt_step(t->opt, NULL));
    dt_params_zero_grad(&t->ctx, &t->m.ps);
    counters_add(&step, &t->ctx.counters, &before, 1); /* this step's counts less its loss reads */
    counters_add(&step, &t->read, &none, -1);
    if (t->step > t->first_step) counters_max(&t->worst, &step);
    else dt_ctx_counters_reset(&t->ctx); /* the first step sets up what the others reuse */
    if (t->logging) CHECK(dt_comm_allreduce_f64(t->world, sums, 1, DT_REDUCE_SUM));
    t->comm_s += now() - tc;
    if (t->logging) t->loss = sums[0] / (double)o->batch;
}

/* The held-out AUC and log loss of the model after `step` steps, printed by rank 0. */
static void eval_step(trainer *t, int64_t step) {
    double te = now();
    evaluate(&t->m, &t->a, &t->d, &t->o, t->world, &t->kb, t->batch, &t->auc, &t->logloss);
    t->eval_s += now() - te; /* throughput counts training only */
    if (g_rank == 0 && !t->o.quiet)
        printf("eval  step %lld: auc %.4f logloss %.4f (%lld held-out samples)\n", (long long)step, t->auc,
               t->logloss, (long long)t->o.eval_samples);
}

/* This rank's tier counters, summed over the tables. */
static void tier_sum(dt_embed *e, dt_embed_tier_stats *out) {
    int f;
    memset(out, 0, sizeof *out);
    for (f = 0; f < F; f++) {
        dt_embed_tier_stats s;
        CHECK(dt_embed_tier_stats_get(e, f, &s));
        out->cache_rows += s.cache_rows; out->cached += s.cached; out->hits += s.hits; out->misses += s.misses;
        out->fetched += s.fetched; out->prefetched += s.prefetched; out->evicted += s.evicted;
        out->written_back += s.written_back; out->bytes_in += s.bytes_in; out->bytes_out += s.bytes_out;
        out->seconds_wait += s.seconds_wait; out->folds += s.folds; out->folded += s.folded;
        out->seconds_fold += s.seconds_fold;
    }
}

/* The end of a tiered run: per table, summed over the ranks, rank 0 prints hits, misses, hit rate,
   evictions, bytes moved each way, the prefetch wait and the log's folds (tier disk). Collective. */
static void tier_report(trainer *t) {
    double v[F][9];
    int f;
    if (!strcmp(t->o.tier, "none")) return;
    for (f = 0; f < F; f++) {
        dt_embed_tier_stats s;
        CHECK(dt_embed_tier_stats_get(t->m.emb, f, &s));
        v[f][0] = (double)s.cache_rows; v[f][1] = (double)s.hits; v[f][2] = (double)s.misses;
        v[f][3] = (double)s.evicted; v[f][4] = s.bytes_in; v[f][5] = s.bytes_out; v[f][6] = s.seconds_wait;
        v[f][7] = (double)s.prefetched; v[f][8] = (double)s.folds;
    }
    CHECK(dt_comm_allreduce_f64(t->world, &v[0][0], F * 9, DT_REDUCE_SUM));
    if (g_rank != 0 || t->o.quiet) return;
    printf("tier %s (sums over %d ranks)\n  table  cache_rows       hits     misses   hit%%    evicted  prefetched"
           "    MB in   MB out  wait_s  folds\n", t->o.tier, t->W);
    for (f = 0; f < F; f++)
        printf("  C%-4d %11.0f %10.0f %10.0f %6.2f %10.0f %11.0f %8.2f %8.2f %7.3f %6.0f\n", f + 1, v[f][0], v[f][1],
               v[f][2], v[f][1] + v[f][2] > 0 ? 100.0 * v[f][1] / (v[f][1] + v[f][2]) : 0.0, v[f][3], v[f][7],
               v[f][4] / 1e6, v[f][5] / 1e6, v[f][6], v[f][8]);
}

/* Rank 0: a progress line every --print-every steps, a JSON line every step (--log). */
static void log_step(trainer *t, int evaluated) {
    const opts *o = &t->o;
    double el = now() - t->t0 - t->eval_s, done = (double)(t->step + 1 - t->first_step);
    double sps = done * (double)o->batch / (el > 0 ? el : 1e-9), eta = el / done * (double)(o->steps - t->step - 1);
    if (g_rank != 0 || !t->logging) return;
    if (!o->quiet && ((o->print_every && (t->step + 1) % o->print_every == 0) || t->step + 1 == o->steps))
        printf("step %lld/%lld  loss %.6f  %.0f samples/s  eta %.0fs\n", (long long)(t->step + 1),
               (long long)o->steps, t->loss, sps, eta);
    if (t->log) { /* auc and logloss on the steps that evaluate, null on the others (and nan's) */
        dt_embed_stats es;
        char sa[32] = "null", sl[32] = "null";
        if (evaluated && t->auc == t->auc) snprintf(sa, sizeof sa, "%.6f", t->auc);
        if (evaluated && t->logloss == t->logloss) snprintf(sl, sizeof sl, "%.6f", t->logloss);
        dt_embed_tier_stats ts;
        char tier[224] = "";
        CHECK(dt_embed_stats_get(t->m.emb, &es));
        if (strcmp(o->tier, "none")) { /* this rank's tiered tables, summed */
            tier_sum(t->m.emb, &ts);
            snprintf(tier, sizeof tier, ",\"tier_hits\":%lld,\"tier_misses\":%lld,\"tier_evicted\":%lld,"
                     "\"tier_wait_s\":%.6f,\"tier_folds\":%lld,\"tier_fold_s\":%.6f", (long long)ts.hits,
                     (long long)ts.misses, (long long)ts.evicted, ts.seconds_wait, (long long)ts.folds, ts.seconds_fold);
        }
        fprintf(t->log, "{\"step\":%lld,\"loss\":%.9g,\"lr\":%g,\"emb_lr\":%g,\"samples_per_s\":%.1f,"
                        "\"comm_s\":%.6f,\"emb_fwd_s\":%.6f,\"emb_bwd_s\":%.6f,\"emb_wait_s\":%.6f,"
                        "\"emb_bytes_sent\":%.0f,\"auc\":%s,\"logloss\":%s,\"ranks\":%d,\"step_s\":%.6f%s}\n",
                (long long)(t->step + 1), t->loss, dt_opt_lr(t->opt), o->emb_lr, sps, t->comm_s, es.seconds_fwd,
                es.seconds_bwd, es.seconds_wait, es.bytes_sent_fwd + es.bytes_sent_bwd, sa, sl, t->W, t->step_s, tier);
        fflush(t->log);
    }
}

/* Everything back, in the reverse order of its making. */
static void teardown(trainer *t) {
    if (t->log) fclose(t->log);
    dt_bucketer_free(t->bk);
    dt_opt_free(t->opt);
    dt_embed_free(t->m.emb);
    acts_free(&t->a);
    dt_dlrm_batch_free(&t->ctx, &t->batches[0]);
    dt_dlrm_batch_free(&t->ctx, &t->batches[1]);
    dt_release(&t->ctx, t->kb.lengths);
    dt_tensor_free(&t->ctx, &t->labels);
    if (!t->d.synthetic) dt_dlrm_bin_close(&t->ctx, &t->d.bin);
    dt_params_free(&t->ctx, &t->m.ps);
    dt_comm_free(t->world);
    dt_ctx_shutdown(&t->ctx);
}

/* ---------------------------------------------------------------- the planner (--plan, --shard plan) */

/* The planner's dense step: this step's batch through everything but the embedding (it does not
   exist yet; its output is zeros), the dense grads all-reduced, no update (zeroed after). */
static dt_status dense_step(void *u) {
    trainer *t = (trainer *)u;
    g_dense_only = 1;
    t->logging = 0;
    (void)train_micro(t, 0, 0);
    g_dense_only = 0;
    CHECK(dt_bucketer_finish(t->bk));
    dt_params_zero_grad(&t->ctx, &t->m.ps);
    return DT_OK;
}

/* The planner's batches: step i's, read into the buffers the steps use (it copies them) */
static dt_status plan_batch(void *u, int i, dt_kjt *out) {
    trainer *t = (trainer *)u;
    data_batch(&t->d, t->batch, i, t->o.batch, g_rank, t->W);
    *out = kjt_of(&t->kb, t->batch);
    return DT_OK;
}

/* --plan-profile's file, when it exists: rank 0 reads it and every rank plans from its bytes (a
   path only some hosts see cannot split the ranks between reading and measuring). 0: none, measure. */
static int read_profile(trainer *t, dt_plan_dlrm_profile *prof) {
    const char *path = t->o.plan_profile;
    double flag[1] = {0};
    FILE *f;
    if (!path) return 0;
    if (g_rank == 0 && (f = fopen(path, "rb"))) { fclose(f); flag[0] = 1; }
    CHECK(dt_comm_allreduce_f64(t->world, flag, 1, DT_REDUCE_MAX));
    if (flag[0] == 0) return 0;
    flag[0] = g_rank == 0 ? (double)dt_plan_dlrm_profile_load(&t->ctx, prof, path) : 0;
    if (flag[0] != 0) fprintf(stderr, "dlrm: --plan-profile: %s\n", dt_ctx_error(&t->ctx));
    CHECK(dt_comm_allreduce_f64(t->world, flag, 1, DT_REDUCE_MAX));
    if (flag[0] != 0) {
        if (g_rank == 0) fprintf(stderr, "dlrm: --plan-profile %s could not be read\n", path);
        dt_comm_abort(t->world, 2);
    }
    CHECK(dt_plan_dlrm_profile_broadcast(t->world, prof, 0));
    if (prof->world != t->W || prof->n_tables != F || prof->batch != t->o.batch || prof->dim_total != F * t->o.dim) {
        if (g_rank == 0)
            fprintf(stderr, "dlrm: --plan-profile %s was measured on %d ranks for %d tables of %d columns in all and a "
                    "global batch of %lld; this run has %d, %d, %d and %lld: remove the file to measure again (the "
                    "file does not know the tables' rows: remove it when they change)\n", path, prof->world,
                    prof->n_tables, prof->dim_total, (long long)prof->batch, t->W, F, F * t->o.dim,
                    (long long)t->o.batch);
        dt_comm_abort(t->world, 2);
    }
    return 1;
}

/* The profile (dt_plan_dlrm_measure: the dense step timed, each table under each kind, with the
   first 8 steps' real batches), the ranking, then the tables made as the first-ranked plan (--shard
   plan) or as --shard says; rank 0 prints the ranking and the prediction of the plan made.
   --plan exits there (0), without training. */
static void plan_tables(trainer *t) {
    const opts *o = &t->o;
    static dt_plan_dlrm_profile prof; /* 30 KB: not on the stack */
    dt_embed_table_desc tabs[F];
    dt_plan_dlrm_desc pd;
    dt_plan_dlrm_prediction top[8], mine;
    dt_plan_dlrm_plan made;
    int n = 0;
    { /* the tables as given but for --shard: the profile is the tables' and serves every --shard (a
         file measured under --shard table plans --shard auto too), so its "auto" is dt_embed's planner's
         plan of them (it measured "table" for all when --shard table measured it: --shard auto's memory
         was then predicted 2.7% short at np 2) */
        opts as_auto = *o;
        as_auto.shard = "auto";
        table_descs(tabs, &as_auto, &t->d, NULL);
    }
    memset(&pd, 0, sizeof pd);
    pd.tables = tabs;
    pd.n_tables = F;
    pd.get_batch = plan_batch;
    pd.n_batches = 8;
    pd.global_batch = o->batch;
    pd.dp_max_bytes = DP_MAX_BYTES;
    pd.dense = dense_step;
    pd.user = t;
    if (!read_profile(t, &prof)) {
        CHECK(dt_plan_dlrm_measure(t->world, &pd, &prof));
        if (o->plan_profile && g_rank == 0) CHECK(dt_plan_dlrm_profile_save(&t->ctx, &prof, o->plan_profile));
    }
    CHECK(dt_plan_dlrm_search(&t->ctx, &prof, o->plan_memory * 1e6, top, 8, &n));
    if (n == 0) {
        if (g_rank == 0) fprintf(stderr, "dlrm: no plan of the tables fits --plan-memory %.0f MB a rank\n", o->plan_memory);
        dt_comm_abort(t->world, 2);
    }
    embed_make(&t->m, o, &t->d, t->world, !strcmp(o->shard, "plan") ? &top[0].plan : NULL);
    CHECK(dt_plan_dlrm_plan_of(t->m.emb, F, o->shard, &made));
    CHECK(dt_plan_dlrm_predict(&t->ctx, &prof, &made, &mine));
    if (g_rank == 0 && (o->plan || !o->quiet)) {
        dt_strbuf sb;
        memset(&sb, 0, sizeof sb);
        sb.ctx = &t->ctx;
        dt_plan_dlrm_format(top, n < 5 ? n : 5, &sb);
        printf("plan: %d ranks, global batch %lld, profile measured in %.1f s on %s\n%s", t->W, (long long)o->batch,
               prof.measure_s, prof.machine, sb.text ? sb.text : "");
        printf("plan: --shard %s: predicted step %.6f s, %.0f samples/s (dense %.3f ms, embedding forward %.3f ms, "
               "backward %.3f ms), memory %.3f MB a rank\n", o->shard, mine.step_s, mine.samples_per_s,
               mine.dense_s * 1e3, mine.fwd_s * 1e3, mine.bwd_s * 1e3, mine.mem_total / 1e6);
        fflush(stdout);
        dt_strbuf_free(&sb);
    }
    if (o->plan) {
        teardown(t);
        exit(0);
    }
}

int main(int argc, char **argv) {
    trainer t;
    const opts *o = &t.o;

    dt_blas_rerun(argv); /* OpenBLAS's kernels fit the CPU: dt_tensor.h, dt_blas_note */
    memset(&t, 0, sizeof t);
    t.loss = t.auc = t.logloss = NAN;
    setup(&t, argc, argv);
    if (!open_outputs(&t)) return 1;
    if (g_rank == 0 && !o->quiet)
        printf("dlrm: %s, %d ranks, global batch %lld%s, %lld steps, dim %d, %s, data %s\n", t.m.dcn ? "DCNv2" : "DLRM",
               t.W, (long long)o->batch, o->accum > 1 ? " (accumulated)" : "", (long long)o->steps, o->dim, o->opt,
               o->data);

    t.t0 = now();
    for (; t.step < o->steps; t.step++) {
        int evaluate_now = (t.step + 1) % o->eval_every == 0 || t.step + 1 == o->steps;
        int save_now = o->ckpt && o->ckpt_every && (t.step + 1) % o->ckpt_every == 0;
        /* the whole step, then its checkpoint, not each call (the evaluation has its own time) */
        double ts = now(), pk;
        if (o->timeout > 0) CHECK(dt_comm_set_deadline(t.world, o->timeout));
        train_step(&t);
        if (o->timeout > 0) CHECK(dt_comm_set_deadline(t.world, 0));
        t.step_s = now() - ts;
        pk = (double)dt_peak_bytes(&t.ctx);
        if (pk > t.train_peak) t.train_peak = pk;
        if (evaluate_now) {
            eval_step(&t, t.step + 1);
            dt_reset_peak_bytes(&t.ctx); /* the evaluation's own buffers are not the training's peak */
        }
        /* the log line before the checkpoint: a run killed after a checkpoint has logged every
           step it holds, so the resumed run's lines complete the log */
        log_step(&t, evaluate_now);
        if (save_now) {
            if (o->timeout > 0) CHECK(dt_comm_set_deadline(t.world, o->timeout));
            save(&t.m, t.opt, o, t.world, t.step + 1, t.loss);
            if (o->timeout > 0) CHECK(dt_comm_set_deadline(t.world, 0));
        }
    }

    /* the last checkpoint (--steps 0 without --resume: the initial model, step 0) */
    if (o->ckpt && ((o->steps > t.first_step && (!o->ckpt_every || o->steps % o->ckpt_every)) ||
                    (o->steps == 0 && !o->resume)))
        save(&t.m, t.opt, o, t.world, o->steps, t.loss);
    if (t.first_step == o->steps) /* nothing trained (--steps 0, or resumed at --steps): the model's AUC */
        eval_step(&t, o->steps);
    if (o->steps == 0 && !o->resume && g_rank == 0 && !o->quiet) /* the final line's nan, said in words */
        printf("dlrm: --steps 0 trains no step: the final loss is nan (there is none), the AUC the initial model's\n");
    if (o->profile && t.ctx.device == DT_CUDA_DEVICE && o->steps > t.first_step + 1) { /* every rank (tests/cuda_counters.sh) */
        printf("cuda counters per step: syncs %lld allocs %lld frees %lld h2d_bytes %lld h2d_calls %lld d2h_bytes %lld "
               "d2h_calls %lld\n", (long long)t.worst.syncs, (long long)t.worst.allocs, (long long)t.worst.frees,
               (long long)t.worst.h2d_bytes, (long long)t.worst.h2d_calls, (long long)t.worst.d2h_bytes,
               (long long)t.worst.d2h_calls);
        fflush(stdout);
    }
    tier_report(&t);
    if (o->steps > t.first_step) { /* the largest rank's, as examples/gpt prints it */
        double pk = t.train_peak;
        CHECK(dt_comm_allreduce_f64(t.world, &pk, 1, DT_REDUCE_MAX));
        if (g_rank == 0 && !o->quiet)
            printf("peak memory per rank: %.3f MB (the largest rank's dt_peak_bytes over the training steps since the "
                   "model was built, evaluations apart)\n", pk / 1e6);
    }
    if (g_rank == 0 && !o->quiet && dt_comm_hosts(t.world) > 1) { /* the embedding's exchanges (dt_comm.h, "Across hosts") */
        dt_comm_stat a, v;
        CHECK(dt_comm_stats(t.world, &a, DT_COLL_ALLTOALL));
        CHECK(dt_comm_stats(t.world, &v, DT_COLL_ALLTOALLV));
        printf("all-to-alls across %d hosts x %d ranks: %lld of %lld in two levels (--hier %s)\n", dt_comm_hosts(t.world),
               dt_comm_ranks_per_host(t.world), (long long)(a.hier_calls + v.hier_calls), (long long)(a.calls + v.calls),
               o->hier > 0 ? "on" : o->hier < 0 ? "off" : "auto");
    }
    if (g_rank == 0) printf("final: loss %.9g auc %.4f\n", t.loss, t.auc);
    teardown(&t);
    return 0;
}
#endif /* DLRM_NO_MAIN */
