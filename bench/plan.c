/* (no "np:" line: it starts its own mpirun for each layout, so ./build.sh bench runs it directly) */
/* bench/plan.c - the planner (dt_plan.h) against the steps it predicts: examples/gpt at >= 12
   layouts on 1, 2 and 4 ranks, each predicted (gpt --plan, from a profile measured once per world
   size) and then run, in rounds, interleaved; and examples/dlrm's table plans (--shard table,
   row, column, data, auto = dt_embed's own planner, plan = dt_plan's first-ranked) on 1, 2 and 4
   ranks, each predicted by dlrm --plan and run (--shard plan prints the prediction of the plan it
   chose), all from one profile per world size, as the gpt rows. Prints per
   layout the predicted and measured step time (median over the steps after the third, then the
   median over rounds) and peak memory per rank (the largest rank's dt_peak_bytes), with the
   errors. A row's time error is the median over rounds of each round's prediction over that
   round's run (the two measured minutes apart at most, so a slow stretch of the machine is in
   both), not the medians' ratio. Per model and world size the planner's first choice (gpt
   --layout auto, dlrm --shard plan) is compared with the best layout measured: unpaired (its
   median against the best median) and round by round (against each other row, the median over
   rounds of their ratio in a round, the rows of a group run seconds apart; the largest is the
   summary's R: a noisy minute that favours one row's run no longer decides it). Where `auto`
   chose a layout another row runs too, the two medians are printed: the machine's own spread in
   this run. Ends with

       planner: layouts N, median error E%, max error M%, memory max error P%, first-ranked within R% of best

   build/bench/plan [--rounds 3] [--steps 10] [--gpt build/examples/gpt] [--dlrm build/examples/dlrm]
                    [--only gpt|dlrm] [--np N] [--quick] [--once]
   The mpirun command comes from $DT_MPIRUN (./build.sh env), else "mpirun --oversubscribe"; the
   bench adds "--map-by core --bind-to core:overload-allowed" (BIND): 4 ranks on 2 cores left to
   the OS move between the cores, and their steps ran 18% slower and spread over 19% between runs
   (bound: 3%), which the planner's profile, measured minutes apart, cannot predict.
   Each round measures each model's profile at each world size afresh and runs that model's rows
   at that size right after it: this VM's speed drifts by 10% over minutes (a layout's steps
   measured 362 ms in one run and 404 ms minutes later), which a profile measured minutes before
   its runs turns into error (median 9.7% with the profiles measured once, before the first round,
   against 4.0% measured per round, on the same quiet machine). --once measures them once.
   The MoE rows: the profile's router spreads tokens evenly, a trained one does not (at capacity
   1.25 the run drops rows; at ep 2 one rank's experts are busier). Each round runs the MoE group's
   first row (dp 2) first, reads the loads it prints (`moe: --moe-load ...`: per block and ep, the
   busiest ep rank's kept rows over its uniform share, a step's mean), and predicts every MoE row
   again with them (--moe-load; `auto` trains the layout the planner ranks first with them): the
   pilot run a user would make,
   whose routing is every layout's (a run equals the one-process run). The table holds those
   predictions; a line per MoE row after it prints the even router's prediction and its error.
   Its time (the bound: 15 minutes): the --plan runs that measure the profiles take some
   110 s a round (5, 27, 46-53 and 30 s for gpt at np 1, 2, 4 and MoE at 2 on two cores), a round
   of training runs some 125-185 s (gpt's 110-162, dlrm's 15-22): 713 s on a quiet machine, 976 s
   on session 30's noisy one; the last line before the summary prints the split. */
#define _POSIX_C_SOURCE 200809L
#define DT_TENSOR_IMPLEMENTATION
#include "../dt_tensor.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>
#include <sys/stat.h>
#include "bench.h"

/* the model: large enough that a step is compute (not launch overhead), small enough for the
   whole bench in minutes on two cores */
static const char *MODEL = "--layers 4 --width 256 --heads 4 --seq 128 --batch 16";
/* the same with a MoE MLP in every block (4 experts, top 2, capacity 1.25, the aux loss): expert
   parallel's rows, and a model of its own for the planner's first choice */
static const char *MOE_MODEL = "--layers 4 --width 256 --heads 4 --seq 128 --batch 16 --moe-experts 4";
/* DLRM: the example's default model (26 tables of up to 16384 rows, dim 16, Adagrad), batch 2048:
   a step of milliseconds, tables of 30 MB */
static const char *DLRM_MODEL = "--batch 2048 --eval-every 100000";
#define DLRM_STEPS 40

typedef struct row {
    int dlrm;                /* 1: examples/dlrm, flags = its --shard */
    int np;
    const char *flags;       /* the layout's flags; "auto": --layout auto */
    double pred_s, pred_mb;  /* from --plan, this round's */
    double preds[8];         /* per round: the predicted step (the same but under --fresh) */
    double meas[8];          /* per round: the median step */
    int rounds;
    double meas_mb;
    char layout[160];        /* the planner's name of it */
    int moe;                 /* examples/gpt with MOE_MODEL (a profile of its own) */
    double evens[8];         /* MoE: per round, the prediction without the run's --moe-load (an even router) */
} row;

static row ROWS[] = {
    {0, 1, "", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 1, "--recompute full", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 1, "--recompute selective --micro 2", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 1, "--micro 4 --offload-activations 1", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 1, "auto", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 2, "", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 2, "--tp 2", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 2, "--tp 2 --sp 1", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 2, "--pp 2 --micro 4", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 2, "--pp 2 --micro 4 --schedule gpipe", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 2, "--pp 2 --micro 4 --offload-activations 1", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 2, "--zero 1", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 2, "--zero 3", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 2, "--zero 3 --micro 4", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 2, "--cp 2", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 2, "--cp 2 --cp-kind ulysses", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 2, "auto", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 4, "", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 4, "--tp 2", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 4, "--tp 2 --pp 2 --micro 4", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 4, "--pp 2 --micro 4 --schedule zb", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 4, "--zero 2 --micro 2", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 4, "--tp 2 --cp 2 --cp-kind ulysses", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 4, "auto", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {0, 2, "", 0, 0, {0}, {0}, 0, 0, "", 1, {0}},
    {0, 2, "--ep 2", 0, 0, {0}, {0}, 0, 0, "", 1, {0}},
    {0, 2, "--tp 2", 0, 0, {0}, {0}, 0, 0, "", 1, {0}},
    {0, 2, "--zero 2", 0, 0, {0}, {0}, 0, 0, "", 1, {0}},
    {0, 2, "--zero 3 --ep 2", 0, 0, {0}, {0}, 0, 0, "", 1, {0}},
    {0, 2, "auto", 0, 0, {0}, {0}, 0, 0, "", 1, {0}},
    {1, 1, "auto", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {1, 1, "plan", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {1, 2, "table", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {1, 2, "row", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {1, 2, "column", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {1, 2, "data", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {1, 2, "auto", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {1, 2, "plan", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {1, 4, "table", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {1, 4, "row", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {1, 4, "column", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {1, 4, "data", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {1, 4, "auto", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
    {1, 4, "plan", 0, 0, {0}, {0}, 0, 0, "", 0, {0}},
};
#define NROWS ((int)(sizeof ROWS / sizeof ROWS[0]))

static char g_mpirun[640], g_gpt[512], g_dlrm[512];
static double g_plan_s, g_gpt_s, g_dlrm_s; /* where the bench's time went: --plan runs (the profiles
                                               measured within), gpt's and dlrm's training runs */
#define BIND "--map-by core --bind-to core:overload-allowed" /* Open MPI's: a rank a core, in turn */
static int g_only = -1; /* --only gpt (0) or dlrm (1): that model's rows alone */
static int g_np = 0;    /* --np N: the rows of that world size alone */
/* the MoE rows' " --moe-load L": per block and ep, the busiest ep rank's kept rows over its uniform
   share, as this round's first MoE run printed them (the router's skew and drops after its steps, which the profile's even
   router does not show). Every layout routes the same tokens to the same experts (a run equals the
   one-process run), so one run's loads are every layout's: a pilot run, as a user would make. */
static char g_moe_load[2048];
static int g_even;      /* predict() without g_moe_load, into evens */
static int g_pilot;     /* measure() reads g_moe_load from its run (the group's first); the others' runs
                           are compared with it: g_load_rows of them, g_load_differ printed other loads */
static int g_load_rows, g_load_differ;

static int wanted(const row *r) { return g_only != !r->dlrm && (!g_np || r->np == g_np); }

/* runs cmd, returns its output (malloc'd, NUL-terminated) and *rc */
static char *run(const char *cmd, int *rc) {
    FILE *p = popen(cmd, "r");
    size_t n = 0, cap = 1 << 16;
    char *out = (char *)malloc(cap);
    if (!p || !out) { fprintf(stderr, "plan: cannot run %s\n", cmd); exit(1); }
    for (;;) {
        size_t k;
        if (n + 4096 > cap && !(out = (char *)realloc(out, cap *= 2))) exit(1);
        k = fread(out + n, 1, cap - n - 1, p);
        if (!k) break;
        n += k;
    }
    out[n] = '\0';
    *rc = pclose(p);
    return out;
}

static double num_after(const char *text, const char *key) {
    const char *s = strstr(text, key);
    return s ? atof(s + strlen(key)) : NAN;
}

static void layout_flags(const row *r, char *buf, size_t n) {
    snprintf(buf, n, "%s", !strcmp(r->flags, "auto") ? "--layout auto" : r->flags);
}

/* The prediction a dlrm run printed ("plan: --shard X: predicted step S s, ..., memory M MB a rank") */
static int dlrm_prediction(row *r, const char *out) {
    r->pred_s = num_after(out, "predicted step ");
    r->pred_mb = num_after(out, "), memory ");
    snprintf(r->layout, sizeof r->layout, "dlrm --shard %s", r->flags);
    return r->pred_s > 0 && r->pred_mb > 0;
}

static const char *model_of(const row *r) { return r->moe ? MOE_MODEL : MODEL; }
static const char *load_of(const row *r) { return r->moe && !g_even ? g_moe_load : ""; }

/* the profile file of a row's model and world */
static void profile_path(const row *r, const char *logdir, char *buf, size_t n) {
    snprintf(buf, n, "%s/profile_%snp%d%s.json", logdir, r->dlrm ? "dlrm_" : "", r->np, r->moe ? "_moe" : "");
}

/* --plan: the prediction for the row's layout (auto: for the planner's first choice) */
static void predict(row *r, const char *profile) {
    char cmd[8192], fl[256];
    double t0;
    const char *s;
    char *out;
    int rc;
    if (r->dlrm) { /* the first dlrm --plan of a world measures the profile, the others read it; --shard
                      plan's row is predicted by its run */
        if (!strcmp(r->flags, "plan")) return;
        snprintf(cmd, sizeof cmd, "%s -np %d %s %s --shard %s --plan --plan-profile %s --quiet 2>&1", g_mpirun, r->np, g_dlrm,
                 DLRM_MODEL, r->flags, profile);
        t0 = now_s();
        out = run(cmd, &rc);
        g_plan_s += now_s() - t0;
        if (rc || !dlrm_prediction(r, out)) {
            fprintf(stderr, "plan: no prediction for dlrm np %d --shard %s (rc %d):\n%s\n", r->np, r->flags, rc, out);
            exit(1);
        }
        free(out);
        return;
    }
    layout_flags(r, fl, sizeof fl);
    snprintf(cmd, sizeof cmd, "%s -np %d %s %s%s %s --plan --plan-profile %s 2>&1", g_mpirun, r->np, g_gpt, model_of(r),
             load_of(r), fl, profile);
    t0 = now_s();
    out = run(cmd, &rc);
    g_plan_s += now_s() - t0;
    r->pred_s = num_after(out, "predicted step ");
    r->pred_mb = num_after(out, "), memory ");
    s = strstr(out, "plan: the layout ");
    s = s ? strchr(s, '(') : NULL;
    if (s) {
        const char *e = strstr(s, "): predicted");
        int k = e ? (int)(e - s - 1) : 0;
        if (k > (int)sizeof r->layout - 1) k = (int)sizeof r->layout - 1;
        if (k < 0) k = 0;
        memcpy(r->layout, s + 1, (size_t)k);
        r->layout[k] = '\0';
    }
    if (rc || !(r->pred_s > 0)) {
        fprintf(stderr, "plan: no prediction for np %d %s (rc %d):\n%s\n", r->np, r->flags, rc, out);
        exit(1);
    }
    free(out);
}

/* one training run: the median of step_s after the third step, and the peak memory */
static void measure(row *r, int steps, const char *logdir) {
    char cmd[8192], fl[256], log[600], line[4096], prof[640];
    char *out;
    int rc, n = 0;
    double t[1024], t0;
    FILE *f;
    dt_ctx ctx;
    layout_flags(r, fl, sizeof fl);
    snprintf(log, sizeof log, "%s/np%d_%d.jsonl", logdir, r->np, (int)(r - ROWS));
    profile_path(r, logdir, prof, sizeof prof);
    if (r->dlrm) /* --shard plan plans from the profile and prints its prediction, then trains */
        snprintf(cmd, sizeof cmd, "%s -np %d %s %s --shard %s --steps %d --print-every 0 --log %s%s%s 2>&1", g_mpirun,
                 r->np, g_dlrm, DLRM_MODEL, r->flags, DLRM_STEPS, log, strcmp(r->flags, "plan") ? "" : " --plan-profile ",
                 strcmp(r->flags, "plan") ? "" : prof);
    else { /* --layout auto reads the profile the prediction used */
        snprintf(cmd, sizeof cmd, "%s -np %d %s %s%s %s --steps %d --print-every 0 --log %s --plan-profile %s 2>&1",
                 g_mpirun, r->np, g_gpt, model_of(r), load_of(r), fl, steps, log, prof);
    }
    t0 = now_s();
    out = run(cmd, &rc);
    *(r->dlrm ? &g_dlrm_s : &g_gpt_s) += now_s() - t0;
    if (rc) { fprintf(stderr, "plan: np %d %s failed (rc %d):\n%s\n", r->np, r->flags, rc, out); exit(1); }
    if (r->dlrm && !strcmp(r->flags, "plan") && !dlrm_prediction(r, out)) {
        fprintf(stderr, "plan: dlrm np %d --shard plan printed no prediction:\n%s\n", r->np, out);
        exit(1);
    }
    r->meas_mb = num_after(out, "peak memory per rank: ");
    if (r->moe) { /* its loads: the pilot's for the rows after it, or the same as the pilot's */
        const char *ml = strstr(out, "moe: --moe-load ");
        size_t len = ml ? strcspn(ml + 4, "\n") : 0;
        if (!ml || len + 2 > sizeof g_moe_load) {
            fprintf(stderr, "plan: np %d %s printed no --moe-load:\n%s\n", r->np, r->flags, out);
            exit(1);
        }
        if (g_pilot) {
            g_moe_load[0] = ' ';
            memcpy(g_moe_load + 1, ml + 4, len);
            g_moe_load[len + 1] = '\0';
        } else {
            g_load_rows++;
            g_load_differ += strlen(g_moe_load) != len + 1 || memcmp(g_moe_load + 1, ml + 4, len);
        }
    }
    free(out);
    memset(&ctx, 0, sizeof ctx);
    dt_ctx_init(&ctx, NULL);
    f = fopen(log, "r");
    while (f && fgets(line, sizeof line, f) && n < 1024) {
        dt_json *j = NULL;
        if (dt_json_parse(&ctx, &j, line, strlen(line)) == DT_OK) {
            const dt_json *st = dt_json_get(j, "step"), *s = dt_json_get(j, "step_s");
            if (st && s && st->number > 3) t[n++] = s->number;
            dt_json_free(&ctx, j);
        }
    }
    if (f) fclose(f);
    dt_ctx_shutdown(&ctx);
    if (!n) { fprintf(stderr, "plan: np %d %s: no steps in %s\n", r->np, r->flags, log); exit(1); }
    r->preds[r->rounds] = r->pred_s;
    r->meas[r->rounds++] = median(t, n);
}

/* the median of a row's rounds, left in round order (median() sorts what it is given) */
static double med(const double *x, int n) {
    double t[8];
    memcpy(t, x, (size_t)n * sizeof *t);
    return median(t, n);
}

int main(int argc, char **argv) {
    int rounds = 3, steps = 10, i, k, np, kind, quick = 0, nl = 0, fresh = 1;
    const char *logdir = "build/bench/plan_logs", *mr = getenv("DT_MPIRUN");
    double err[NROWS], merr[NROWS], emax = 0, mmax = 0, first_gap = 0, t0 = now_s();
    snprintf(g_gpt, sizeof g_gpt, "build/examples/gpt");
    snprintf(g_dlrm, sizeof g_dlrm, "build/examples/dlrm");
    snprintf(g_mpirun, sizeof g_mpirun, "%.500s %s", mr && *mr ? mr : "mpirun --oversubscribe", BIND);
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--once")) fresh = 0;
        else if (!strcmp(argv[i], "--fresh")) fresh = 1; /* the default; kept for older command lines */
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gpt") && i + 1 < argc) snprintf(g_gpt, sizeof g_gpt, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--dlrm") && i + 1 < argc) snprintf(g_dlrm, sizeof g_dlrm, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--np") && i + 1 < argc) g_np = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && (!strcmp(argv[i + 1], "gpt") || !strcmp(argv[i + 1], "dlrm")))
            g_only = !strcmp(argv[++i], "dlrm");
        else {
            fprintf(stderr, "usage: plan [--rounds N (3)] [--steps N (10)] [--gpt PATH] [--dlrm PATH] [--only gpt|dlrm] [--np N] [--quick] [--once]\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > 8 || steps < 6 || steps > 1000) {
        fprintf(stderr, "plan: --rounds 1..8 and --steps 6..1000, got %d and %d\n", rounds, steps);
        return 2;
    }
    if (quick) rounds = 1;
    mkdir("build", 0755); mkdir("build/bench", 0755); mkdir(logdir, 0755);
    /* rounds of every layout in turn: a slow minute hits all alike. Per world size and model (gpt,
       its MoE twin, dlrm), the profile is measured and that group's rows run right after it, so a
       machine whose speed drifts over minutes is predicted from what it was while those steps ran
       (--once: the profiles of the first round serve them all) */
    for (k = 0; k < rounds; k++)
        for (np = 1; np <= 4; np *= 2)
            for (kind = 0; kind < 3; kind++) {
                char path[640];
#define BENCH_KIND(r) ((r)->dlrm ? 2 : (r)->moe ? 1 : 0)
                int first = -1;
                for (i = 0; i < NROWS && first < 0; i++)
                    if (ROWS[i].np == np && BENCH_KIND(&ROWS[i]) == kind && wanted(&ROWS[i])) first = i;
                if (first < 0) continue;
                g_even = kind == 1; /* MoE: first as the profile's even router sees it */
                if (k == 0 || fresh) {
                    for (i = 0; i < NROWS; i++) /* the model's profile measured afresh, by its first row */
                        if (ROWS[i].np == np && BENCH_KIND(&ROWS[i]) == kind) {
                            profile_path(&ROWS[i], logdir, path, sizeof path);
                            remove(path);
                        }
                    for (i = 0; i < NROWS; i++)
                        if (ROWS[i].np == np && BENCH_KIND(&ROWS[i]) == kind && wanted(&ROWS[i])) {
                            profile_path(&ROWS[i], logdir, path, sizeof path);
                            predict(&ROWS[i], path);
                            if (kind == 1) ROWS[i].evens[ROWS[i].rounds] = ROWS[i].pred_s;
                        }
                } else if (kind == 1) /* --once: the first round's profile */
                    for (i = 0; i < NROWS; i++) ROWS[i].evens[ROWS[i].rounds] = ROWS[i].evens[0];
                g_pilot = 1;
                measure(&ROWS[first], steps, logdir);
                g_pilot = 0;
                if (kind == 1) { /* then every MoE row predicted with the loads its first run printed */
                    g_even = 0;
                    for (i = 0; i < NROWS; i++)
                        if (ROWS[i].np == np && BENCH_KIND(&ROWS[i]) == kind && wanted(&ROWS[i])) {
                            profile_path(&ROWS[i], logdir, path, sizeof path);
                            predict(&ROWS[i], path);
                        }
                    ROWS[first].preds[ROWS[first].rounds - 1] = ROWS[first].pred_s;
                }
                for (i = first + 1; i < NROWS; i++)
                    if (ROWS[i].np == np && BENCH_KIND(&ROWS[i]) == kind && wanted(&ROWS[i]))
                        measure(&ROWS[i], steps, logdir);
#undef BENCH_KIND
            }
    printf("planner check: %s; examples/gpt %s, %d rounds of %d steps (median step of steps 4..%d, median over rounds; the "
           "profiles measured %s); examples/dlrm %s, %d steps (steps 4..%d; its profile measured by a world's first "
           "prediction); the MoE rows %s\n", g_mpirun, MODEL, rounds, steps, steps,
           fresh ? "per round, each just before its model's rows at that world size" : "once, before the first round", DLRM_MODEL, DLRM_STEPS, DLRM_STEPS, MOE_MODEL);
    /* (the time's err is round by round: not the two medians' ratio, see above) */
    printf("%-3s %-80s %10s %10s %7s %9s %9s %7s\n", "np", "layout", "pred ms", "meas ms", "rnd err", "pred MB", "meas MB",
           "err");
    for (i = 0; i < NROWS; i++) {
        row *r = &ROWS[i];
        double m, ratio[8];
        char name[200];
        if (!wanted(r)) continue;
        for (k = 0; k < r->rounds; k++) ratio[k] = r->preds[k] / r->meas[k];
        m = med(r->meas, r->rounds);
        r->pred_s = med(r->preds, r->rounds);
        snprintf(name, sizeof name, "%s%s%s", r->moe ? "moe " : "", !r->dlrm && !strcmp(r->flags, "auto") ? "auto: " : "",
                 r->layout);
        /* the error of each round's prediction against that round's run, the median over rounds: a
           round the machine ran slow in is slow in both (its profile was measured beside its runs) */
        err[nl] = 100.0 * fabs(med(ratio, r->rounds) - 1.0);
        merr[nl] = 100.0 * fabs(r->pred_mb - r->meas_mb) / r->meas_mb;
        printf("%-3d %-80s %10.2f %10.2f %6.1f%% %9.2f %9.2f %6.1f%%\n", r->np, name, r->pred_s * 1e3, m * 1e3, err[nl],
               r->pred_mb, r->meas_mb, merr[nl]);
        if (err[nl] > emax) emax = err[nl];
        if (merr[nl] > mmax) mmax = merr[nl];
        nl++;
    }
    /* the planner's first choice against the best measured, per model and world. Paired: each round
       runs a group's rows back to back, seconds apart, so the first choice is compared with every
       other row by the median over rounds of their ratio in a round (the machine's pace over minutes
       cancels); the largest of those is the gap. The unpaired figure (median against median) is
       printed beside it. */
    for (k = 0; k < 3; k++)
        for (np = 1; np <= 4; np *= 2) {
            double best = 1e30, mine = 0, gap = -1e30;
            const char *first = k == 1 ? "plan" : "auto";
            const row *f = NULL, *worst = NULL;
            int have = 0, j;
            for (i = 0; i < NROWS; i++)
                if (ROWS[i].np == np && ROWS[i].dlrm == (k == 1) && ROWS[i].moe == (k == 2) && wanted(&ROWS[i]) &&
                    !strcmp(ROWS[i].flags, first))
                    f = &ROWS[i];
            for (i = 0; i < NROWS; i++) {
                double m, ratio[8], g;
                const row *r = &ROWS[i];
                if (r->np != np || r->dlrm != (k == 1) || r->moe != (k == 2) || !wanted(r)) continue;
                have = 1;
                m = med(r->meas, r->rounds);
                if (m < best) best = m;
                if (r == f) mine = m;
                if (!f || r == f || r->rounds != f->rounds) continue;
                for (j = 0; j < r->rounds; j++) ratio[j] = f->meas[j] / r->meas[j];
                g = med(ratio, r->rounds) - 1.0;
                if (g > gap) { gap = g; worst = r; }
            }
            if (!have || !f || !worst) continue;
            printf("%s np %d: the first-ranked layout measured %.2f ms, the best measured %.2f ms (%.1f%% slower); "
                   "round by round, %s %.1f%% %s %s%s\n", k == 1 ? "dlrm" : k == 2 ? "gpt moe" : "gpt", np, mine * 1e3,
                   best * 1e3, 100.0 * (mine - best) / best, gap > 0 ? "at most" : "at least", 100.0 * fabs(gap),
                   gap > 0 ? "slower than" : "faster than every other row, the closest", worst->dlrm ? "--shard " : "",
                   worst->dlrm ? worst->flags : worst->layout);
            if (100.0 * gap > first_gap) first_gap = 100.0 * gap;
        }
    /* MoE: what the loads changed (the same profile, the router taken as even) */
    for (i = 0; i < NROWS; i++) {
        row *r = &ROWS[i];
        double ratio[8];
        if (!r->moe || !wanted(r) || !r->rounds || !(r->evens[0] > 0) || !strcmp(r->flags, "auto"))
            continue; /* (auto's even-router choice is another layout) */
        for (k = 0; k < r->rounds; k++) ratio[k] = r->evens[k] / r->meas[k];
        printf("gpt moe np %d %s: predicted %.2f ms with an even router (error %.1f%%), %.2f with the run's --moe-load\n",
               r->np, r->layout, med(r->evens, r->rounds) * 1e3,
               100.0 * fabs(med(ratio, r->rounds) - 1.0), med(r->preds, r->rounds) * 1e3);
    }
    if (g_load_rows) /* a run equals the one-process run: the same tokens dropped, the same loads */
        printf("gpt moe: %d of %d MoE runs after each round's first printed other --moe-load figures than it\n",
               g_load_differ, g_load_rows);
    /* the machine's own spread: an auto row runs a layout that another row runs too */
    for (i = 0; i < NROWS; i++) {
        row *a = &ROWS[i];
        int j;
        if (a->dlrm || strcmp(a->flags, "auto") || !wanted(a)) continue;
        for (j = 0; j < NROWS; j++) {
            row *b = &ROWS[j];
            double x, y;
            if (j == i || b->dlrm || b->np != a->np || b->moe != a->moe || !wanted(b) || strcmp(a->layout, b->layout))
                continue;
            x = med(b->meas, b->rounds);
            y = med(a->meas, a->rounds);
            printf("gpt%s np %d: the same layout measured by two rows, %.2f and %.2f ms (%.1f%% apart): this run's "
                   "spread between runs\n", a->moe ? " moe" : "", a->np, x * 1e3, y * 1e3,
                   100.0 * fabs(x - y) / (x < y ? x : y));
            break;
        }
    }
    printf("(%.0f s: --plan runs with the profiles %.0f s, gpt's training runs %.0f s, dlrm's %.0f s)\n", now_s() - t0,
           g_plan_s, g_gpt_s, g_dlrm_s);
    printf("planner: layouts %d, median error %.1f%%, max error %.1f%%, memory max error %.1f%%, first-ranked within "
           "%.1f%% of best\n", nl, median(err, nl), emax, mmax, first_gap);
    return 0;
}
