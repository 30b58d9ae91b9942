/* tests/fuzz/fuzz_plan.c - libFuzzer target for dt_plan.h's three JSON file readers:
   dt_plan_profile_load, dt_plan_machine_load and dt_plan_dlrm_profile_load.

   Build and run (tests/fuzz/run.sh 240 plan does both):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_plan.c -o build/fuzz/fuzz_plan -lm -lpthread
       build/fuzz/fuzz_plan -max_total_time=240 build/fuzz/corpus_plan tests/fuzz/corpus_plan
   tests/test_fuzz_files_replay.c runs every file of tests/fuzz/corpus_plan through the same
   function without libFuzzer (gcc, plain and ASan+UBSan), as a normal test.

   Input: the file, as is. Each input is written to a scratch file and read by all three
   readers (each refuses the others' files by their first key, after parsing the JSON). Beyond
   "no crash, no sanitizer report", it checks what must hold for any input:
     - a failed load returns DT_ERR_FORMAT with a message that starts with the reader's name,
       names the file (and holds the JSON parser's message when it is not JSON), keeps no
       memory and leaves the struct zeroed;
     - a loaded profile holds counts within the header's limits and finite, non-negative
       figures; saving it and loading that again gives it back (bit for bit; measure_s is
       written to the millisecond);
     - a loaded machine is one dt_plan_profile_paper takes, and the data-parallel layout of a
       small model on one of its hosts predicts a finite, positive step;
     - a loaded profile predicts the data-parallel layout to a finite step or refuses it with
       a named DT_ERR_ARG / DT_ERR_STATE; a DLRM profile, likewise its plan of every table
       row-wise. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#endif
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_embed.h"
#include "dt_plan.h"
#include "tests/fuzz/fuzz_files.h"
#include <math.h>

/* every one of n doubles finite and >= 0 */
static int dt_fuzz_plan_finite(const double *v, int n) {
    int i;
    for (i = 0; i < n; i++)
        if (!isfinite(v[i]) || v[i] < 0) return 0;
    return 1;
}
/* the header's own lists of each struct's figures (what save writes and load reads) */
#define DT_FUZZ_PLAN_PAIR(f) && dt_fuzz_plan_finite(s->f, 2)
#define DT_FUZZ_PLAN_ONE(f) && dt_fuzz_plan_finite(&p.f, 1)
#define DT_FUZZ_PLAN_KINDS(f) && dt_fuzz_plan_finite(p.f, DT_SHARD_COUNT)

static int dt_fuzz_plan_zero(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

/* The JSON parser's message about the input, or "" when it parses. */
static char dt_fuzz_plan_parse_error[DT_ERROR_MAX];

/* A refused file: DT_ERR_FORMAT and a message that says why (the parser's, when it is not
   JSON), nothing kept. */
static void dt_fuzz_plan_failed(dt_ctx *ctx, dt_status st, size_t before, const char *fn, const char *path,
                                const void *obj, size_t n) {
    DT_FUZZ_CHECK(st == DT_ERR_FORMAT, "a bad file is DT_ERR_FORMAT");
    dt_fuzz_check_failure(ctx, st, before, fn, path, NULL);
    DT_FUZZ_CHECK(!dt_fuzz_plan_parse_error[0] || strstr(dt_ctx_error(ctx), dt_fuzz_plan_parse_error),
                  "a file that is not JSON is refused with the parser's message");
    DT_FUZZ_CHECK(dt_fuzz_plan_zero(obj, n), "a failed load leaves the struct zeroed");
}

/* A layout the profile cannot take: a status and a message that says why. */
static void dt_fuzz_plan_refused(dt_ctx *ctx, dt_status st) {
    DT_FUZZ_CHECK(st == DT_ERR_ARG || st == DT_ERR_STATE, "a layout the profile cannot take is a named refusal");
    DT_FUZZ_CHECK(dt_ctx_error(ctx)[0] != 0, "the refusal says why");
}

static int dt_fuzz_plan_profile(dt_ctx *ctx, const char *path, const char *again) {
    static dt_plan_profile p, q;
    dt_plan_layout l;
    dt_plan_prediction pr;
    size_t before = ctx->bytes_in_use;
    dt_status st = dt_plan_profile_load(ctx, &p, path);
    int i;
    if (st) {
        dt_fuzz_plan_failed(ctx, st, before, "dt_plan_profile_load", path, &p, sizeof p);
        return 0;
    }
    DT_FUZZ_CHECK(ctx->bytes_in_use == before, "a loaded profile holds no memory");
    DT_FUZZ_CHECK(p.n_splits >= 1 && p.n_splits <= DT_PLAN_MAX_SPLITS && p.n_colls >= 0 &&
                      p.n_colls <= DT_PLAN_MAX_COLLS && p.n_pipes >= 0 && p.n_pipes <= DT_PLAN_MAX_PIPES &&
                      p.n_moes >= 0 && p.n_moes <= DT_PLAN_MAX_MOES && !p.paper,
                  "the profile's counts are within the limits");
    DT_FUZZ_CHECK(p.world >= 1 && p.hosts >= 1 && p.cores >= 1 && p.model.layers >= 1 && p.model.seq >= 2,
                  "the profile's sizes are positive");
    DT_FUZZ_CHECK(dt_fuzz_plan_finite(&p.opt_s_per_param, 1) && dt_fuzz_plan_finite(&p.copy_s_per_byte, 1) &&
                      dt_fuzz_plan_finite(&p.overlap, 1) && dt_fuzz_plan_finite(&p.measure_s, 1),
                  "the profile's rates are finite");
    for (i = 0; i < p.n_splits; i++) {
        const dt_plan_split *s = &p.splits[i];
        DT_FUZZ_CHECK(1 DT__PLAN_SPLIT_FIELDS(DT_FUZZ_PLAN_PAIR), "a split's times are finite");
        DT_FUZZ_CHECK(s->tp >= 1 && s->cp >= 1 && s->rows[0] >= 1 && s->rows[1] >= s->rows[0], "a split's sizes hold");
    }
    for (i = 0; i < p.n_colls; i++)
        DT_FUZZ_CHECK(p.colls[i].kind >= 0 && p.colls[i].kind < DT_PLAN_COLL_KINDS && p.colls[i].size >= 2 &&
                          dt_fuzz_plan_finite(&p.colls[i].alpha, 1) && dt_fuzz_plan_finite(&p.colls[i].beta, 1),
                      "a collective is a kind with finite figures");
    for (i = 0; i < p.n_pipes; i++)
        DT_FUZZ_CHECK(p.pipes[i].pp >= 2 && dt_fuzz_plan_finite(p.pipes[i].bytes, 2) &&
                          dt_fuzz_plan_finite(p.pipes[i].delay, 2),
                      "a pipe's figures are finite");
    for (i = 0; i < p.n_moes; i++) {
        const dt_plan_moe *s = &p.moes[i];
        DT_FUZZ_CHECK(s->ep >= 1 DT__PLAN_MOE_FIELDS(DT_FUZZ_PLAN_PAIR), "a MoE split's figures are finite");
    }
    /* what load takes, save writes and load takes back */
    DT_FUZZ_CHECK(dt_plan_profile_save(ctx, &p, again) == DT_OK, "a loaded profile saves");
    st = dt_plan_profile_load(ctx, &q, again);
    DT_FUZZ_CHECK(st == DT_OK, "a saved profile loads");
    if (!st) {
        DT_FUZZ_CHECK(fabs(q.measure_s - p.measure_s) <= 1e-3 + 1e-15 * p.measure_s, "measure_s comes back");
        q.measure_s = p.measure_s;
        DT_FUZZ_CHECK(!memcmp(&p, &q, sizeof p), "the profile comes back bit for bit");
    }
    memset(&l, 0, sizeof l);
    st = dt_plan_predict(ctx, &p, &l, &pr);
    if (st) dt_fuzz_plan_refused(ctx, st);
    else DT_FUZZ_CHECK(isfinite(pr.step_s) && pr.step_s >= 0 && isfinite(pr.mem_total), "a prediction is finite");
    DT_FUZZ_CHECK(ctx->bytes_in_use == before, "predict keeps no memory");
    return 1;
}

static int dt_fuzz_plan_machine(dt_ctx *ctx, const char *path) {
    static dt_plan_machine mc;
    static dt_plan_profile p;
    dt_plan_model m;
    dt_plan_layout l;
    dt_plan_prediction pr;
    size_t before = ctx->bytes_in_use;
    dt_status st = dt_plan_machine_load(ctx, &mc, path);
    int i;
    if (st) {
        dt_fuzz_plan_failed(ctx, st, before, "dt_plan_machine_load", path, &mc, sizeof mc);
        return 0;
    }
    DT_FUZZ_CHECK(mc.name[0] && memchr(mc.name, 0, sizeof mc.name), "a machine has a name");
    for (i = 0; i < DT__PLAN_NMF; i++) {
        double v;
        memcpy(&v, (const char *)&mc + dt__plan_mfields[i].off, sizeof v);
        DT_FUZZ_CHECK(v >= dt__plan_mfields[i].lo && v <= dt__plan_mfields[i].hi, "a machine's figure is in its range");
    }
    /* a small model over one host: every figure the file gave is used */
    memset(&m, 0, sizeof m);
    m.layers = 2; m.width = 64; m.heads = 4; m.vocab = 256; m.seq = 32; m.batch = 2 * mc.ranks_per_host;
    st = dt_plan_profile_paper(ctx, &mc, &m, mc.ranks_per_host, &p);
    if (st) fprintf(stderr, "fuzz: dt_plan_profile_paper: %s\n", dt_ctx_error(ctx));
    DT_FUZZ_CHECK(st == DT_OK, "a loaded machine is one dt_plan_profile_paper takes");
    if (st) return 1;
    memset(&l, 0, sizeof l);
    st = dt_plan_predict(ctx, &p, &l, &pr);
    if (st) fprintf(stderr, "fuzz: dt_plan_predict: %s\n", dt_ctx_error(ctx));
    DT_FUZZ_CHECK(st == DT_OK, "a paper profile predicts data parallelism");
    DT_FUZZ_CHECK(!st && isfinite(pr.step_s) && pr.step_s > 0 && isfinite(pr.tokens_per_s) && isfinite(pr.mem_total),
                  "a paper prediction is finite");
    DT_FUZZ_CHECK(ctx->bytes_in_use == before, "paper and predict keep no memory");
    return 1;
}

static int dt_fuzz_plan_dlrm(dt_ctx *ctx, const char *path, const char *again) {
    static dt_plan_dlrm_profile p, q;
    dt_plan_dlrm_plan pl;
    dt_plan_dlrm_prediction pr;
    size_t before = ctx->bytes_in_use;
    dt_status st = dt_plan_dlrm_profile_load(ctx, &p, path);
    int t, k;
    if (st) {
        dt_fuzz_plan_failed(ctx, st, before, "dt_plan_dlrm_profile_load", path, &p, sizeof p);
        return 0;
    }
    DT_FUZZ_CHECK(p.world >= 1 && p.n_tables >= 1 && p.n_tables <= DT_PLAN_MAX_TABLES && p.batch >= 1,
                  "the DLRM profile's sizes hold");
    DT_FUZZ_CHECK(1 DT__PLAN_DLRM_SCALARS(DT_FUZZ_PLAN_ONE), "the DLRM profile's scalars are finite");
    DT_FUZZ_CHECK(1 DT__PLAN_DLRM_KIND_ARRAYS(DT_FUZZ_PLAN_KINDS), "the DLRM profile's kinds are finite");
    for (t = 0; t < p.n_tables; t++) {
        DT_FUZZ_CHECK(p.auto_kind[t] >= DT_SHARD_TABLE && p.auto_kind[t] < DT_SHARD_COUNT &&
                          p.auto_owner[t] >= -1 && p.auto_owner[t] < p.world,
                      "a table's plan is a kind and a rank");
        for (k = 0; k < DT_SHARD_COUNT; k++) {
            const dt_plan_table_cost *s = &p.cost[t][k];
            DT_FUZZ_CHECK((s->ok == 0 || s->ok == 1) DT__PLAN_COST_PAIRS(DT_FUZZ_PLAN_PAIR),
                          "a table's costs are finite");
        }
    }
    DT_FUZZ_CHECK(dt_plan_dlrm_profile_save(ctx, &p, again) == DT_OK, "a loaded DLRM profile saves");
    st = dt_plan_dlrm_profile_load(ctx, &q, again);
    DT_FUZZ_CHECK(st == DT_OK && !memcmp(&p, &q, sizeof p), "the DLRM profile comes back bit for bit");
    memset(&pl, 0, sizeof pl);
    pl.n_tables = p.n_tables;
    for (t = 0; t < p.n_tables; t++) pl.kind[t] = DT_SHARD_ROW;
    st = dt_plan_dlrm_predict(ctx, &p, &pl, &pr);
    if (st) dt_fuzz_plan_refused(ctx, st);
    else DT_FUZZ_CHECK(isfinite(pr.step_s) && pr.step_s >= 0 && isfinite(pr.mem_total), "a DLRM prediction is finite");
    DT_FUZZ_CHECK(ctx->bytes_in_use == before, "DLRM predict keeps no memory");
    return 1;
}

/* The check of one input; returns how many of the three readers took it. */
static int dt_fuzz_plan_one(const uint8_t *data, size_t size) {
    char path[1024], again[1024];
    dt_ctx ctx;
    dt_json *json = NULL;
    int took;
    dt_fuzz_input = data;
    dt_fuzz_input_size = size;
    dt_fuzz_path(path, sizeof path, "plan.json");
    dt_fuzz_path(again, sizeof again, "plan_again.json");
    dt_fuzz_write(path, data, size);
    dt_ctx_init(&ctx, NULL);
    dt_fuzz_plan_parse_error[0] = 0;
    if (dt_json_parse(&ctx, &json, (const char *)data, size))
        snprintf(dt_fuzz_plan_parse_error, sizeof dt_fuzz_plan_parse_error, "%s", dt_ctx_error(&ctx));
    dt_json_free(&ctx, json);
    took = dt_fuzz_plan_profile(&ctx, path, again);
    took += dt_fuzz_plan_machine(&ctx, path);
    took += dt_fuzz_plan_dlrm(&ctx, path, again);
    DT_FUZZ_CHECK(ctx.bytes_in_use == 0, "the readers give back their memory");
    dt_ctx_shutdown(&ctx);
    return took;
}

#ifndef DT_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_fuzz_plan_one(data, size);
    return 0;
}
#endif
