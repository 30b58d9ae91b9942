/* (no "np:" line: one process, no MPI; ./build.sh bench runs it directly) */
/* bench/plan_paper.c - the planner (dt_plan.h) on clusters this machine is not: a machine's
   published figures (the JSON files of docs/machines, each figure with its source) instead of measurements.
   For each published training run below it prints
     - the run as published: its layout and its throughput per GPU (TFLOP/s, MFU), with the source;
     - dt's model of that same layout on that machine: predicted TFLOP/s and MFU, step split, memory,
       and how far the prediction is from the published figure;
     - dt's own plan: the five layouts it ranks first (tokens/s, MFU, split, memory per GPU),
       and how long the search took (the issue asks < 1 s for 1024 ranks).
   The MFU counts Megatron's FLOPs (dt_plan_model_flops: 72 B s l h^2 (1 + s / 6h + V / 12 l h)
   for GPT, the same terms for a gated GQA model), so it is comparable with the papers' figures.

   build/bench/plan_paper [--machines DIR (docs/machines)] [--case NAME] [--top N (5)]
       or, for any model:
   build/bench/plan_paper --machine FILE --world N --layers L --width C --heads H [--kv-heads K]
                          [--ffn F --gated] --vocab V --seq T --batch B */
#define _POSIX_C_SOURCE 200809L
#define DT_IMPLEMENTATION
#include "../dt_tensor.h"
#include "../dt_comm.h"
#include "../dt_opt.h"
#include "../dt_parallel.h"
#include "../dt_plan.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>
#include "bench.h"

/* A published run: the model, the machine (a file of docs/machines), the layout as the source
   gives it (what it leaves out, assumed and said so in `note`), the throughput it reports, and where. */
typedef struct pcase {
    const char *name, *machine;
    dt_plan_model m;
    int world, tp, pp, cp, vp, mbs; /* vp: virtual stages per rank (interleaved); mbs: micro-batch size */
    int zero;                       /* 1: Megatron's distributed optimizer (FSDP: the same in dt's terms with pp) */
    dt_plan_recompute recompute;
    double tflops;                  /* reported per GPU; 0: none published */
    int hardware_flops;             /* 1: the report counts the recomputed forward too (Narayanan et al.'s eq. 3) */
    const char *source, *note;
} pcase;

#define DENSE 0, 0, 0, 0, 0, DT_MOE_BALANCE_DEFAULT, NULL, 0 /* dt_plan_model's MoE fields: no experts */

static const pcase CASES[] = {
    {"gpt3-175b-a100", "a100-dgx.json", {96, 12288, 96, 96, 51200, 2048, 1536, DT_BF16, 0, 0, DENSE},
     1024, 8, 8, 1, 2, 1, 0, DT_PLAN_RECOMPUTE_FULL, 140, 1,
     "Narayanan et al., SC'21 (arXiv 2104.04473) section 5.1: 'On n=1024 A100 GPUs using batch size 1536, we "
     "achieve X=140 teraFLOP/s per GPU'; interleaved schedule, full recompute, vocab 51,200, sequence 2048",
     "the run's tp x pp is not printed: tp 8 x pp 8 as Table 1's row of the same width (145.6B); vp not printed"},
    {"gpt-177b-h100", "h100-dgx.json", {96, 12288, 96, 96, 131072, 4096, 1152, DT_BF16, 0, 0, DENSE},
     2304, 8, 6, 1, 2, 1, 1, DT_PLAN_RECOMPUTE_NONE, 432.8, 0,
     "NVIDIA/Megatron-LM README, images/model_table.png (2024-07): 177B, TP 8, PP 6, DP 48, 2304 H100, batch "
     "1152, 432.8 TFLOP/s per GPU, 44% MFU; vocab 131,072, sequence 4096",
     "precision, recompute and vp not stated (MFU against 989 TFLOP/s: bf16); modelled without recompute, "
     "interleaved (its PP overlap needs virtual stages), distributed optimizer (--overlap-param-gather)"},
    {"gpt3-175b-h100", "h100-dgx.json", {96, 12288, 96, 96, 51200, 2048, 1536, DT_BF16, 0, 0, DENSE},
     1024, 8, 8, 1, 2, 1, 1, DT_PLAN_RECOMPUTE_NONE, 0, 0,
     "no bf16 run of this size published; Megatron-Core's strong scaling of GPT-3 at batch 1152 from 96 to 4608 "
     "H100 goes from 47% to 42% MFU (Megatron-LM README)",
     "the A100 run's layout (tp 8 x pp 8), with the distributed optimizer and no recompute"},
    {"llama3-70b-h100", "h100-dgx.json", {80, 8192, 64, 8, 128256, 8192, 256, DT_BF16, 28672, 1, DENSE},
     256, 4, 4, 2, 5, 1, 1, DT_PLAN_RECOMPUTE_NONE, 0, 0,
     "no bf16 H100 figure published (every NeMo / Megatron-Bridge H100 row of Llama-3 70B is FP8: 64 GPUs, "
     "TP 4 PP 4 CP 2 VP 5, 738 TFLOP/s, NeMo 24.07); the layout is Megatron-Bridge's bf16 recipe "
     "(llama3_70b_pretrain_64gpu_h100_bf16_config: TP 4, PP 4, CP 2, VP 5, MBS 1, GBS 256, sequence 8192)",
     "Llama 3 paper Table 3: 80 layers, 8192, FFN 28,672, 64 heads, 8 KV heads; vocab 128,256"},
    {"llama3-405b-h100", "h100-dgx.json", {126, 16384, 128, 8, 128256, 8192, 2048, DT_BF16, 53248, 1, DENSE},
     8192, 8, 16, 1, 2, 1, 1, DT_PLAN_RECOMPUTE_NONE, 430, 0,
     "Llama 3 Herd of Models (arXiv 2407.21783) Table 4: 8,192 H100, TP 8, CP 1, PP 16, DP 64, sequence 8,192, "
     "32 sequences per DP rank, 430 TFLOP/s per GPU, 43% BF16 MFU; 'without activation checkpointing'",
     "their DP is FSDP (modelled as the distributed optimizer); interleaved, vp not printed; their fabric is "
     "RoCE at 400 Gb/s a GPU, modelled as the DGX H100's InfiniBand"},
};
#define N_CASES ((int)(sizeof CASES / sizeof CASES[0]))

static dt_ctx g_ctx;
static double g_err[N_CASES];
static int g_n_err;

static void die(const char *what) {
    fprintf(stderr, "plan_paper: %s: %s\n", what, dt_ctx_error(&g_ctx));
    exit(1);
}

/* the published layout in dt's terms: interleaved where it had virtual stages (dt's interleaving is
   2 chunks a stage), 1F1B otherwise; sp with tp (Megatron's default with tp > 1) */
static dt_plan_layout published(const pcase *c) {
    dt_plan_layout l;
    memset(&l, 0, sizeof l);
    l.tp = c->tp; l.pp = c->pp; l.cp = c->cp;
    l.dp = c->world / (c->tp * c->pp * c->cp);
    l.micro = (int)(c->m.batch / l.dp / c->mbs);
    l.zero = c->zero; l.sp = c->tp > 1; l.recompute = c->recompute;
    l.schedule = c->pp > 1 ? (c->vp > 1 ? DT_PP_INTERLEAVED : DT_PP_1F1B) : DT_PP_DEFAULT;
    return l;
}

static void line(const dt_plan_prediction *pr, double peak) {
    char ls[160];
    printf("    %-78s %6.1f TFLOP/s %5.1f%% MFU  step %8.3f s (compute %.3f, comm %.3f, bubble %.3f, optim %.3f)  %6.1f GB\n",
           dt_plan_layout_string(&pr->layout, ls, sizeof ls), pr->mfu * peak / 1e12, 100 * pr->mfu, pr->step_s,
           pr->compute_s, pr->comm_s, pr->bubble_s, pr->optimizer_s, pr->mem_total / 1e9);
}

static void plan(const dt_plan_machine *mc, const dt_plan_model *m, int world, int top_n, const pcase *c) {
    dt_plan_profile *p = (dt_plan_profile *)malloc(sizeof *p);
    dt_plan_prediction top[16], pr;
    int n = 0, total = 0, i;
    double t0, model_tf = 0;
    if (!p) { fprintf(stderr, "plan_paper: out of memory\n"); exit(1); }
    if (dt_plan_profile_paper(&g_ctx, mc, m, world, p)) die("dt_plan_profile_paper");
    if (c) {
        dt_plan_layout l = published(c);
        printf("  published: tp %d pp %d cp %d dp %d, %s%s, micro-batch %d of batch %lld, recompute %s: ", c->tp, c->pp,
               c->cp, l.dp, c->vp > 1 ? "interleaved" : "1f1b", c->zero ? ", distributed optimizer" : "", c->mbs,
               (long long)c->m.batch, dt_plan_recompute_name(c->recompute));
        if (c->tflops > 0 && c->hardware_flops) { /* the recomputed forward counted: 4/3 of all but the logits */
            double f = dt_plan_model_flops(&c->m), lg = 6.0 * (double)c->m.vocab * c->m.width;
            model_tf = c->tflops * f / (4.0 / 3 * (f - lg) + lg);
            printf("%.0f TFLOP/s per GPU counting the recompute, %.1f in model FLOPs (%.1f%% MFU)\n", c->tflops, model_tf,
                   100 * model_tf * 1e12 / mc->flops);
        } else if (c->tflops > 0) {
            model_tf = c->tflops;
            printf("%.1f TFLOP/s per GPU (%.1f%% MFU)\n", c->tflops, 100 * c->tflops * 1e12 / mc->flops);
        } else
            printf("no figure\n");
        printf("  source: %s\n  note: %s\n", c->source, c->note);
        if (dt_plan_predict(&g_ctx, p, &l, &pr)) printf("  dt's model of it: %s\n", dt_ctx_error(&g_ctx));
        else {
            printf("  dt's model of that layout:\n");
            line(&pr, mc->flops);
            if (model_tf > 0) {
                printf("    predicted / published: %.2f\n", pr.mfu * mc->flops / 1e12 / model_tf);
                g_err[g_n_err++] = pr.mfu * mc->flops / 1e12 / model_tf - 1;
            }
            if (pr.mem_total > mc->mem_bytes - mc->reserved_bytes)
                printf("    (it would not fit dt's memory: %.1f GB of %.1f)\n", pr.mem_total / 1e9,
                       (mc->mem_bytes - mc->reserved_bytes) / 1e9);
        }
    }
    t0 = now_s();
    if (dt_plan_search(&g_ctx, p, NULL, top, top_n, &n, &total)) die("dt_plan_search");
    printf("  dt's plan: %d layouts fit %.1f GB a GPU; the first %d (search %.3f s):\n", total,
           (mc->mem_bytes - mc->reserved_bytes) / 1e9, n, now_s() - t0);
    for (i = 0; i < n; i++) line(&top[i], mc->flops);
    free(p);
}

int main(int argc, char **argv) {
    const char *dir = "docs/machines", *only = NULL, *mfile = NULL;
    dt_plan_model m;
    int world = 0, top_n = 5, i;
    memset(&m, 0, sizeof m);
    m.dtype = DT_BF16;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "plan_paper: %s needs a value (or is unknown)\n", a); return 2; }
        i++;
        if (!strcmp(a, "--machines")) dir = v;
        else if (!strcmp(a, "--case")) only = v;
        else if (!strcmp(a, "--top")) top_n = atoi(v);
        else if (!strcmp(a, "--machine")) mfile = v;
        else if (!strcmp(a, "--world")) world = atoi(v);
        else if (!strcmp(a, "--layers")) m.layers = atoi(v);
        else if (!strcmp(a, "--width")) m.width = atoi(v);
        else if (!strcmp(a, "--heads")) m.heads = atoi(v);
        else if (!strcmp(a, "--kv-heads")) m.kv_heads = atoi(v);
        else if (!strcmp(a, "--ffn")) m.ffn = atoi(v);
        else if (!strcmp(a, "--gated")) m.gated = atoi(v);
        else if (!strcmp(a, "--vocab")) m.vocab = atoll(v);
        else if (!strcmp(a, "--seq")) m.seq = atoll(v);
        else if (!strcmp(a, "--batch")) m.batch = atoll(v);
        else { fprintf(stderr, "plan_paper: unknown flag %s\n", a); return 2; }
    }
    if (top_n < 1 || top_n > 16) { fprintf(stderr, "plan_paper: --top %d, expected 1 .. 16\n", top_n); return 2; }
    if (dt_ctx_init(&g_ctx, NULL)) return 1;
    if (mfile) { /* one model of the user's */
        dt_plan_machine mc;
        if (dt_plan_machine_load(&g_ctx, &mc, mfile)) die("--machine");
        printf("%s, %d GPUs: %d layers, width %d, heads %d / %d, ffn %d%s, vocab %lld, seq %lld, batch %lld\n", mc.name,
               world, m.layers, m.width, m.heads, m.kv_heads, m.ffn, m.gated ? " gated" : "", (long long)m.vocab,
               (long long)m.seq, (long long)m.batch);
        plan(&mc, &m, world, top_n, NULL);
    }
    for (i = 0; !mfile && i < N_CASES; i++) {
        const pcase *c = &CASES[i];
        dt_plan_machine mc;
        char path[512];
        if (only && strcmp(only, c->name)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, c->machine);
        if (dt_plan_machine_load(&g_ctx, &mc, path)) die(path);
        printf("%s: %s, %d GPUs (%s)\n", c->name, mc.name, c->world, path);
        plan(&mc, &c->m, c->world, top_n, c);
    }
    if (g_n_err) { /* one line: how far the model is from what was published */
        double worst = 0, sum = 0;
        for (i = 0; i < g_n_err; i++) {
            sum += g_err[i];
            if (fabs(g_err[i]) > fabs(worst)) worst = g_err[i];
        }
        printf("plan on paper: %d published runs, mean error %+.1f%%, worst %+.1f%% (predicted model TFLOP/s per GPU "
               "against the published)\n", g_n_err, 100 * sum / g_n_err, 100 * worst);
    }
    dt_ctx_shutdown(&g_ctx);
    return 0;
}
