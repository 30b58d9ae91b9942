/* tests/test_dlrm_data.c - the DLRM example's data side (examples/dlrm/dlrm_data.h): synthetic
   samples (determinism, sharding invariance, power law, click rate, learnability, multi-hot),
   the Criteo TSV reader (hand-written lines, every malformed case, skip mode, file = memory =
   tiny reads), the binary form (round trip, truncated and foreign files), AUC and logloss
   against hand-computed values and a brute-force pair count. */
#define DT_DLRM_DATA_IMPLEMENTATION
#include "dt_tensor.h"
#include "examples/dlrm/dlrm_data.h"
#include "dt_test.h"

static dt_ctx ctx;

/* ---------------------------------------------------------------- helpers */

/* splitmix64's finalizer, written again from the documented constants (the reference the
   reader's ids are checked against) */
static uint64_t ref_hash(uint64_t v) {
    uint64_t z = v + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int64_t ref_id(uint64_t raw, int64_t size) { return size == 1 ? 0 : 1 + (int64_t)(ref_hash(raw) % (uint64_t)(size - 1)); }

static float ref_dense(long long x) { return x <= 0 ? 0.0f : (float)log((double)x + 1.0); }

static void path_in_tmp(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dt_test_tmpdir(), name); }

static int write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(p, 1, n, f) == n;
    if (f) fclose(f);
    return ok;
}

static long file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (f) fclose(f);
    return n;
}

static unsigned char *read_bytes(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    unsigned char *p;
    *n = file_size(path);
    if (!f || *n < 0) { if (f) fclose(f); return NULL; }
    p = (unsigned char *)malloc((size_t)*n + 1);
    if (fread(p, 1, (size_t)*n, f) != (size_t)*n) { free(p); p = NULL; }
    fclose(f);
    return p;
}

/* A Criteo line from its parts: dense[j] < -1000 means an empty field, hex[f] NULL empty. */
static int make_line(char *buf, size_t cap, const char *label, const long long *dense, const char *const *hex) {
    size_t o = 0;
    int j;
    o += (size_t)snprintf(buf + o, cap - o, "%s", label);
    for (j = 0; j < DT_DLRM_DENSE; j++) {
        if (dense[j] < -1000) o += (size_t)snprintf(buf + o, cap - o, "\t");
        else o += (size_t)snprintf(buf + o, cap - o, "\t%lld", dense[j]);
    }
    for (j = 0; j < DT_DLRM_SPARSE; j++) o += (size_t)snprintf(buf + o, cap - o, "\t%s", hex[j] ? hex[j] : "");
    return (int)o;
}

/* A deterministic pseudo-random TSV of n lines (mixed empty fields, negatives, upper case,
   \r\n on every 7th line, no newline after the last line). Caller frees. */
static char *random_tsv(int n, size_t *len) {
    size_t cap = (size_t)n * 400 + 1, o = 0;
    char *t = (char *)malloc(cap), line[512], hexs[DT_DLRM_SPARSE][20];
    const char *hex[DT_DLRM_SPARSE];
    long long dense[DT_DLRM_DENSE];
    int i, j;
    for (i = 0; i < n; i++) {
        uint32_t r[4], c[4] = {0, 0, 77, 0}, k[2] = {5, 6};
        c[0] = (uint32_t)i;
        for (j = 0; j < DT_DLRM_DENSE; j++) {
            c[1] = (uint32_t)j;
            dt_philox4x32(c, k, r);
            dense[j] = r[0] % 5 == 0 ? -100000 : (long long)(r[1] % 3000) - 3;
        }
        for (j = 0; j < DT_DLRM_SPARSE; j++) {
            c[1] = 100u + (uint32_t)j;
            dt_philox4x32(c, k, r);
            if (r[0] % 6 == 0) hex[j] = NULL;
            else {
                snprintf(hexs[j], sizeof hexs[j], r[2] % 2 ? "%08x" : "%08X", (unsigned)(r[1] % 5000u));
                hex[j] = hexs[j];
            }
        }
        make_line(line, sizeof line, i % 4 == 1 ? "1" : "0", dense, hex);
        o += (size_t)snprintf(t + o, cap - o, "%s%s", line, i == n - 1 ? "" : i % 7 == 3 ? "\r\n" : "\n");
    }
    *len = o;
    return t;
}

/* Every sample of a reader (stops at the first error; returns its status). */
static dt_status read_all(dt_dlrm_tsv *r, dt_dlrm_sample *out, int cap, int *n) {
    int got = 1;
    dt_status st = DT_OK;
    *n = 0;
    while (*n < cap && !(st = dt_dlrm_tsv_next(&ctx, r, &out[*n], &got)) && got) (*n)++;
    return st;
}

/* The samples as a batch would hold them: labels, dense rows, ids feature-major. */
static int batch_equals_samples(const dt_dlrm_batch *b, const dt_dlrm_sample *s, char *why, size_t n) {
    int64_t i, k, B = b->size;
    const float *dense = (const float *)b->dense.data, *lab = (const float *)b->labels.data;
    const int64_t *ids = (const int64_t *)b->ids.data;
    const int32_t *len = (const int32_t *)b->lengths.data;
    for (i = 0; i < B; i++) {
        if (lab[i] != s[i].label) { snprintf(why, n, "label %lld: %g vs %g", (long long)i, lab[i], s[i].label); return 0; }
        if (memcmp(dense + i * DT_DLRM_DENSE, s[i].dense, sizeof s[i].dense)) { snprintf(why, n, "dense row %lld", (long long)i); return 0; }
        for (k = 0; k < DT_DLRM_SPARSE; k++)
            if (ids[k * B + i] != s[i].ids[k] || len[k * B + i] != 1) {
                snprintf(why, n, "sample %lld feature %lld: id %lld vs %lld", (long long)i, (long long)k,
                         (long long)ids[k * B + i], (long long)s[i].ids[k]);
                return 0;
            }
    }
    return 1;
}

/* Rebuilds the global batch from rank slices (dense / labels concatenated, the KJT per feature)
   and compares it bitwise with the 1-rank batch. */
static int slices_equal_whole(const dt_dlrm_batch *whole, const dt_dlrm_batch *parts, int W, char *why, size_t n) {
    int64_t B = whole->size, at = 0, f, b;
    int r;
    const int32_t *wl = (const int32_t *)whole->lengths.data;
    const int64_t *wo = (const int64_t *)whole->offsets.data, *wi = (const int64_t *)whole->ids.data;
    for (r = 0; r < W; r++) {
        const dt_dlrm_batch *p = &parts[r];
        int64_t Br = p->size;
        const int32_t *pl = (const int32_t *)p->lengths.data;
        const int64_t *po = (const int64_t *)p->offsets.data, *pi = (const int64_t *)p->ids.data;
        if (p->start != whole->start + at) { snprintf(why, n, "rank %d starts at %lld, want %lld", r, (long long)p->start, (long long)(whole->start + at)); return 0; }
        if (Br && memcmp((const float *)p->dense.data, (const float *)whole->dense.data + at * DT_DLRM_DENSE, (size_t)Br * DT_DLRM_DENSE * 4)) { snprintf(why, n, "rank %d dense differs", r); return 0; }
        if (Br && memcmp(p->labels.data, (const float *)whole->labels.data + at, (size_t)Br * 4)) { snprintf(why, n, "rank %d labels differ", r); return 0; }
        for (f = 0; f < DT_DLRM_SPARSE; f++)
            for (b = 0; b < Br; b++) {
                int64_t g = f * B + at + b, l = f * Br + b;
                if (pl[l] != wl[g]) { snprintf(why, n, "rank %d feature %lld sample %lld: length %d vs %d", r, (long long)f, (long long)b, pl[l], wl[g]); return 0; }
                if (pl[l] && memcmp(pi + po[l], wi + wo[g], (size_t)pl[l] * 8)) { snprintf(why, n, "rank %d feature %lld sample %lld: ids differ", r, (long long)f, (long long)b); return 0; }
            }
        at += Br;
    }
    if (at != B) { snprintf(why, n, "slices hold %lld samples, the batch %lld", (long long)at, (long long)B); return 0; }
    return 1;
}

/* ---------------------------------------------------------------- synthetic data */

static void test_synth_deterministic(void) {
    dt_dlrm_synth g, g2;
    dt_dlrm_synth_desc d;
    dt_dlrm_batch a, b;
    int same;
    memset(&d, 0, sizeof d);
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    d.seed = 42;
    dt_dlrm_synth_init(&ctx, &g, &d);
    dt_dlrm_synth_range(&ctx, &g, &a, 1000, 257);
    dt_dlrm_synth_range(&ctx, &g, &b, 5, 3); /* reuse: different size first */
    dt_dlrm_synth_range(&ctx, &g, &b, 1000, 257);
    same = a.nnz == b.nnz && !memcmp(a.dense.data, b.dense.data, 257 * 13 * 4) && !memcmp(a.labels.data, b.labels.data, 257 * 4) &&
           !memcmp(a.ids.data, b.ids.data, (size_t)a.nnz * 8);
    DT_TEST_CHECK("synth_same_seed_and_index_give_the_same_bits", same);
    d.seed = 43;
    dt_dlrm_synth_init(&ctx, &g2, &d);
    dt_dlrm_synth_range(&ctx, &g2, &b, 1000, 257);
    DT_TEST_CHECK("synth_other_seed_gives_other_samples", memcmp(a.ids.data, b.ids.data, (size_t)a.nnz * 8) != 0);
    dt_dlrm_batch_free(&ctx, &a);
    dt_dlrm_batch_free(&ctx, &b);
}

static void check_sharding(const char *name, const dt_dlrm_synth_desc *d) {
    static const int64_t sizes[] = {10, 7, 2, 1};
    dt_dlrm_synth g;
    dt_dlrm_batch whole, parts[4];
    char why[1024] = "";
    int ok = 1, W, r, k;
    memset(&whole, 0, sizeof whole);
    memset(parts, 0, sizeof parts);
    dt_dlrm_synth_init(&ctx, &g, d);
    for (k = 0; k < 4 && ok; k++)
        for (W = 1; W <= 4 && ok; W++) {
            if (dt_dlrm_synth_batch(&ctx, &g, &whole, 3, sizes[k], 0, 1)) { ok = 0; snprintf(why, sizeof why, "%s", dt_ctx_error(&ctx)); break; }
            for (r = 0; r < W; r++)
                if (dt_dlrm_synth_batch(&ctx, &g, &parts[r], 3, sizes[k], r, W)) { ok = 0; snprintf(why, sizeof why, "%s", dt_ctx_error(&ctx)); }
            if (ok && !slices_equal_whole(&whole, parts, W, why, sizeof why)) {
                ok = 0;
                snprintf(why + strlen(why), sizeof why - strlen(why), " (B = %lld, W = %d)", (long long)sizes[k], W);
            }
        }
    if (ok) dt_test_pass(name);
    else dt_test_fail(name, "%s", why);
    dt_dlrm_batch_free(&ctx, &whole);
    for (r = 0; r < 4; r++) dt_dlrm_batch_free(&ctx, &parts[r]);
}

static void test_synth_sharding(void) {
    dt_dlrm_synth_desc d;
    memset(&d, 0, sizeof d);
    d.seed = 7;
    check_sharding("synth_rank_slices_at_w1_to_4_concatenate_to_the_w1_batch", &d);
    d.multi_hot_mean = 1.5;
    d.max_bag = 6;
    check_sharding("synth_multi_hot_rank_slices_concatenate_to_the_w1_batch", &d);
}

static void test_split(void) {
    int64_t s, c, want[4] = {2, 3, 2, 3}, got[4];
    int r, ok = 1;
    dt_dlrm_synth g;
    dt_dlrm_batch b;
    char shape[64];
    for (r = 0; r < 4; r++) {
        ok &= dt_dlrm_split(&ctx, &s, &c, 5, 10, r, 4, -1) == DT_OK;
        got[r] = c;
        ok &= s == 50 + (int64_t)r * 10 / 4;
    }
    if (ok && !memcmp(got, want, sizeof got)) dt_test_pass("split_uneven_batch_gives_sizes_2_3_2_3");
    else dt_test_fail("split_uneven_batch_gives_sizes_2_3_2_3", "got %lld %lld %lld %lld, want 2 3 2 3", (long long)got[0],
                      (long long)got[1], (long long)got[2], (long long)got[3]);
    dt_dlrm_split(&ctx, &s, &c, 0, 2, 2, 4, -1);
    DT_TEST_CHECK("split_more_ranks_than_samples_gives_an_empty_slice", c == 0 && s == 1);
    dt_dlrm_split(&ctx, &s, &c, 2, 10, 3, 4, 25); /* batch 2 = [20, 30) clipped at 25: rank 3 gets [27, 30) -> none */
    DT_TEST_CHECK("split_last_partial_batch_is_clipped_at_n", s == 25 && c == 0);
    dt_dlrm_split(&ctx, &s, &c, 2, 10, 1, 4, 25); /* rank 1: [22, 25) */
    DT_TEST_CHECK("split_last_partial_batch_keeps_its_head", s == 22 && c == 3);
    dt_test_error("split_batch_past_the_end_is_named", dt_dlrm_split(&ctx, &s, &c, 3, 10, 0, 4, 25), dt_ctx_error(&ctx),
                  "global_batch = 3");
    dt_test_error("split_rank_outside_world_is_named", dt_dlrm_split(&ctx, &s, &c, 0, 10, 4, 4, -1), dt_ctx_error(&ctx),
                  "rank = 4");
    dt_test_error("split_world_zero_is_named", dt_dlrm_split(&ctx, &s, &c, 0, 10, 0, 0, -1), dt_ctx_error(&ctx), "world = 0");
    dt_test_error("split_batch_size_zero_is_named", dt_dlrm_split(&ctx, &s, &c, 0, 0, 0, 1, -1), dt_ctx_error(&ctx),
                  "batch_size = 0");
    dt_test_error("split_overflowing_batch_index_is_named",
                  dt_dlrm_split(&ctx, &s, &c, INT64_MAX / 2, 1000, 0, 1, -1), dt_ctx_error(&ctx), "overflows");

    memset(&b, 0, sizeof b);
    dt_dlrm_synth_init(&ctx, &g, NULL);
    ok = dt_dlrm_synth_batch(&ctx, &g, &b, 0, 2, 0, 4) == DT_OK;
    ok = ok && b.size == 0 && b.nnz == 0 && b.dense.ndim == 2 && b.dense.shape[0] == 0 && b.dense.shape[1] == 13 &&
         b.dense.numel == 0 && b.dense.data && b.labels.numel == 0 && b.ids.numel == 0 && b.offsets.numel == 1 &&
         ((int64_t *)b.offsets.data)[0] == 0;
    if (ok) dt_test_pass("synth_empty_local_batch_is_valid");
    else dt_test_fail("synth_empty_local_batch_is_valid", "size %lld nnz %lld dense %s offsets %lld",
                      (long long)b.size, (long long)b.nnz, dt_shape_str(&b.dense, shape, sizeof shape), (long long)b.offsets.numel);
    dt_dlrm_batch_free(&ctx, &b);
}

/* P(rank k <= K) of the generator's continuous power law: y = (1 + u A)^(1/(1-s)), k = floor(y) - 1 */
static double zipf_cdf(int64_t K, int64_t n, double s) {
    double A = pow((double)n + 1.0, 1.0 - s) - 1.0;
    return (pow((double)K + 2.0, 1.0 - s) - 1.0) / A;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

static void test_synth_power_law(void) {
    enum { N = 200000 };
    dt_dlrm_synth g;
    dt_dlrm_synth_desc d;
    dt_dlrm_batch b;
    int64_t *count, i, n0 = 1460, n2 = 16384, top = 0, le[3] = {0, 0, 0}, Ks[3] = {0, 9, 99}, bad = 0;
    double worst = 0.0;
    int k, worst_k = 0;
    memset(&d, 0, sizeof d);
    memset(&b, 0, sizeof b);
    d.seed = 3;
    d.ordered_ids = 1;
    dt_dlrm_synth_init(&ctx, &g, &d);
    dt_dlrm_synth_range(&ctx, &g, &b, 0, N);
    for (i = 0; i < N; i++) {
        int64_t id = ((int64_t *)b.ids.data)[0 * N + i]; /* feature 0, one-hot: ids[f*B + b] */
        for (k = 0; k < 3; k++) le[k] += id <= Ks[k];
    }
    for (k = 0; k < 3; k++) {
        double diff = fabs((double)le[k] / N - zipf_cdf(Ks[k], n0, 1.05));
        if (diff > worst) { worst = diff; worst_k = k; }
    }
    /* the standard error of a proportion of 200000 is <= 0.0011: 0.006 is > 5 sigma */
    if (worst <= 0.006) dt_test_pass("synth_ordered_ids_follow_the_power_law");
    else dt_test_fail("synth_ordered_ids_follow_the_power_law", "P(id <= %lld) = %.4f, theory %.4f", (long long)Ks[worst_k],
                      (double)le[worst_k] / N, zipf_cdf(Ks[worst_k], n0, 1.05));

    /* scrambled ids (the default): the sorted histogram of feature 2 is the same power law */
    d.ordered_ids = 0;
    dt_dlrm_synth_init(&ctx, &g, &d);
    dt_dlrm_synth_range(&ctx, &g, &b, 0, N);
    count = (int64_t *)calloc((size_t)n2, sizeof *count);
    for (i = 0; i < N; i++) {
        int64_t id = ((int64_t *)b.ids.data)[2 * N + i];
        if (id < 0 || id >= n2) bad++;
        else count[id]++;
    }
    qsort(count, (size_t)n2, sizeof *count, cmp_desc);
    for (i = 0; i < n2 / 100; i++) top += count[i];
    {
        double got = (double)top / N, want = zipf_cdf(n2 / 100 - 1, n2, 1.05);
        if (bad == 0 && fabs(got - want) <= 0.01 && got > 0.3)
            dt_test_pass("synth_top_1pct_of_ids_take_their_power_law_share");
        else dt_test_fail("synth_top_1pct_of_ids_take_their_power_law_share", "top 1%% of ids: %.4f of samples, theory %.4f; "
                          "%lld ids out of range", got, want, (long long)bad);
    }
    DT_TEST_CHECK("synth_scrambled_hot_id_is_not_id_0", ((int64_t *)b.ids.data)[2 * N] != 0 || ((int64_t *)b.ids.data)[2 * N + 1] != 0);
    free(count);
    dt_dlrm_batch_free(&ctx, &b);
}

/* Scrambling maps each power-law rank to an id one to one: the same samples drawn with
   ordered_ids = 1 (id = rank) and 0 give a function rank -> id that is injective, on a table
   of even size (where a multiplier sharing a factor with it would fold ranks together). */
static void test_synth_scramble_is_a_bijection(void) {
    enum { N = 20000, CARD = 64 };
    dt_dlrm_synth go, gs;
    dt_dlrm_synth_desc d;
    dt_dlrm_batch bo, bs;
    int64_t map[CARD], i, seen = 0, clash = 0, f = 0;
    int used[CARD];
    memset(&d, 0, sizeof d);
    memset(&bo, 0, sizeof bo);
    memset(&bs, 0, sizeof bs);
    for (i = 0; i < CARD; i++) { map[i] = -1; used[i] = 0; }
    d.seed = 8;
    d.cardinality[0] = CARD;
    d.zipf = 0.3; /* flat enough that every rank shows up */
    d.ordered_ids = 1;
    dt_dlrm_synth_init(&ctx, &go, &d);
    d.ordered_ids = 0;
    dt_dlrm_synth_init(&ctx, &gs, &d);
    dt_dlrm_synth_range(&ctx, &go, &bo, 0, N);
    dt_dlrm_synth_range(&ctx, &gs, &bs, 0, N);
    for (i = 0; i < N; i++) {
        int64_t k = ((int64_t *)bo.ids.data)[f * N + i], id = ((int64_t *)bs.ids.data)[f * N + i];
        if (map[k] < 0) {
            map[k] = id;
            seen++;
            if (used[id]++) clash++;
        } else if (map[k] != id) clash++;
    }
    if (seen == CARD && clash == 0) dt_test_pass("synth_scrambled_ids_are_a_bijection_of_ranks");
    else dt_test_fail("synth_scrambled_ids_are_a_bijection_of_ranks", "%lld of %d ranks seen, %lld clashes", (long long)seen,
                      CARD, (long long)clash);
    dt_dlrm_batch_free(&ctx, &bo);
    dt_dlrm_batch_free(&ctx, &bs);
}

static void test_synth_clicks_and_learnability(void) {
    enum { NTRAIN = 200000, NTEST = 50000, TF = 4, BINS = 24 };
    dt_dlrm_synth g;
    dt_dlrm_synth_desc d;
    dt_dlrm_batch b;
    float *logit, *score, *score_ids;
    double rate = 0.0, auc = 0.0, auc_nb = 0.0, auc_ids = 0.0;
    int64_t i, f, *clicks[TF + 4], *total[TF + 4], card[TF + 4];
    memset(&d, 0, sizeof d);
    memset(&b, 0, sizeof b);
    d.seed = 11;
    dt_dlrm_synth_init(&ctx, &g, &d);
    dt_dlrm_synth_range(&ctx, &g, &b, 0, NTRAIN);
    for (i = 0; i < NTRAIN; i++) rate += ((float *)b.labels.data)[i];
    rate /= NTRAIN;
    if (rate >= 0.22 && rate <= 0.28) dt_test_pass("synth_click_rate_is_near_25pct");
    else dt_test_fail("synth_click_rate_is_near_25pct", "click rate %.4f, want [0.22, 0.28]", rate);

    /* a naive-Bayes model counted on the training samples: per id of categorical 0..3 and per
       bucket of dense 0..3, smoothed log-odds of a click, summed */
    for (f = 0; f < TF + 4; f++) {
        card[f] = f < TF ? g.card[f] : BINS;
        clicks[f] = (int64_t *)calloc((size_t)card[f], 8);
        total[f] = (int64_t *)calloc((size_t)card[f], 8);
    }
    for (i = 0; i < NTRAIN; i++) {
        float y = ((float *)b.labels.data)[i];
        for (f = 0; f < TF + 4; f++) {
            int64_t key = f < TF ? ((int64_t *)b.ids.data)[f * NTRAIN + i]
                                 : (int64_t)(((float *)b.dense.data)[i * 13 + (f - TF)] * 2.0f);
            if (key >= card[f]) key = card[f] - 1;
            clicks[f][key] += y == 1.0f;
            total[f][key]++;
        }
    }
    dt_dlrm_synth_range(&ctx, &g, &b, (int64_t)1 << 40, NTEST); /* held out: never trained on */
    logit = (float *)malloc(sizeof(float) * NTEST);
    score = (float *)malloc(sizeof(float) * NTEST);
    score_ids = (float *)malloc(sizeof(float) * NTEST);
    dt_dlrm_synth_logits(&ctx, &g, logit, &b);
    for (i = 0; i < NTEST; i++) {
        double s = 0.0;
        for (f = 0; f < TF + 4; f++) {
            if (f == TF) score_ids[i] = (float)s;
            int64_t key = f < TF ? ((int64_t *)b.ids.data)[f * NTEST + i]
                                 : (int64_t)(((float *)b.dense.data)[i * 13 + (f - TF)] * 2.0f);
            if (key >= card[f]) key = card[f] - 1;
            s += log((clicks[f][key] + rate * 4.0) / (total[f][key] - clicks[f][key] + (1.0 - rate) * 4.0));
        }
        score[i] = (float)s;
    }
    dt_dlrm_auc(&ctx, &auc, logit, (const float *)b.labels.data, NTEST);
    dt_dlrm_auc(&ctx, &auc_nb, score, (const float *)b.labels.data, NTEST);
    dt_dlrm_auc(&ctx, &auc_ids, score_ids, (const float *)b.labels.data, NTEST);
    /* the ids alone carry signal an embedding can learn (the per-id latent effects) */
    if (auc_ids > 0.7) dt_test_pass("synth_ids_alone_give_held_out_auc_above_0_7");
    else dt_test_fail("synth_ids_alone_give_held_out_auc_above_0_7", "naive-Bayes AUC from categorical 0..3 alone %.4f", auc_ids);
    if (auc > 0.75) dt_test_pass("synth_teacher_logits_have_auc_above_0_75");
    else dt_test_fail("synth_teacher_logits_have_auc_above_0_75", "teacher AUC %.4f <= 0.75", auc);
    if (auc_nb > 0.7 && auc_nb <= auc + 0.01) dt_test_pass("synth_naive_model_learns_held_out_auc_above_0_7");
    else dt_test_fail("synth_naive_model_learns_held_out_auc_above_0_7", "naive-Bayes AUC %.4f (teacher %.4f), want > 0.7",
                      auc_nb, auc);
    for (f = 0; f < TF + 4; f++) { free(clicks[f]); free(total[f]); }
    free(logit);
    free(score);
    free(score_ids);
    dt_dlrm_batch_free(&ctx, &b);
}

static void test_synth_multi_hot(void) {
    enum { N = 20000 };
    dt_dlrm_synth g;
    dt_dlrm_synth_desc d;
    dt_dlrm_batch b;
    int64_t i, bags = (int64_t)N * DT_DLRM_SPARSE, empty = 0, sum = 0, maxlen = 0, bad = 0, k;
    double q = 2.0 / 3.0, want_mean = 0.0, got_mean, got_empty;
    memset(&d, 0, sizeof d);
    memset(&b, 0, sizeof b);
    d.seed = 5;
    d.multi_hot_mean = 2.0;
    d.max_bag = 8;
    dt_dlrm_synth_init(&ctx, &g, &d);
    dt_dlrm_synth_range(&ctx, &g, &b, 77, N);
    for (i = 0; i < bags; i++) {
        int32_t l = ((int32_t *)b.lengths.data)[i];
        sum += l;
        empty += l == 0;
        if (l > maxlen) maxlen = l;
        if (((int64_t *)b.offsets.data)[i + 1] != ((int64_t *)b.offsets.data)[i] + l) bad++;
    }
    for (i = 0; i < b.nnz; i++) {
        /* the feature of id i: the bag whose offsets hold it (ids are feature-major) */
        int64_t id = ((int64_t *)b.ids.data)[i];
        if (id < 0) bad++;
    }
    for (k = 1; k <= 8; k++) want_mean += pow(q, (double)k); /* E[min(G, 8)] = sum P(G >= k) */
    got_mean = (double)sum / bags;
    got_empty = (double)empty / bags;
    if (fabs(got_mean - want_mean) < 0.02 && fabs(got_empty - (1.0 - q)) < 0.01 && maxlen <= 8 && bad == 0 &&
        sum == b.nnz && ((int64_t *)b.offsets.data)[bags] == b.nnz)
        dt_test_pass("synth_multi_hot_bags_have_the_configured_lengths");
    else dt_test_fail("synth_multi_hot_bags_have_the_configured_lengths", "mean length %.4f (theory %.4f), empty %.4f "
                      "(theory %.4f), longest %lld (cap 8), %lld bad offsets, nnz %lld vs sum %lld", got_mean, want_mean,
                      got_empty, 1.0 - q, (long long)maxlen, (long long)bad, (long long)b.nnz, (long long)sum);
    dt_dlrm_batch_free(&ctx, &b);
}

static void test_synth_bad_args(void) {
    dt_dlrm_synth g, blank;
    dt_dlrm_synth_desc d;
    dt_dlrm_batch b;
    memset(&b, 0, sizeof b);
    memset(&d, 0, sizeof d);
    memset(&blank, 0, sizeof blank);
    d.ordered_ids = 2;
    dt_test_error("synth_flag_other_than_0_or_1_is_named", dt_dlrm_synth_init(&ctx, &g, &d), dt_ctx_error(&ctx),
                  "desc.ordered_ids = 2");
    memset(&d, 0, sizeof d);
    d.cardinality[5] = -3;
    dt_test_error("synth_negative_cardinality_is_named", dt_dlrm_synth_init(&ctx, &g, &d), dt_ctx_error(&ctx),
                  "desc.cardinality[5] = -3");
    memset(&d, 0, sizeof d);
    d.cardinality[0] = ((int64_t)1 << 31) + 1;
    dt_test_error("synth_too_large_cardinality_is_named", dt_dlrm_synth_init(&ctx, &g, &d), dt_ctx_error(&ctx),
                  "desc.cardinality[0]");
    memset(&d, 0, sizeof d);
    d.zipf = 5.0;
    dt_test_error("synth_zipf_out_of_range_is_named", dt_dlrm_synth_init(&ctx, &g, &d), dt_ctx_error(&ctx), "desc.zipf = 5");
    memset(&d, 0, sizeof d);
    d.multi_hot_mean = -1.0;
    dt_test_error("synth_negative_bag_mean_is_named", dt_dlrm_synth_init(&ctx, &g, &d), dt_ctx_error(&ctx),
                  "desc.multi_hot_mean = -1");
    dt_test_error("synth_uninitialised_generator_is_named", dt_dlrm_synth_range(&ctx, &blank, &b, 0, 4), dt_ctx_error(&ctx),
                  "dt_dlrm_synth_init");
    dt_dlrm_synth_init(&ctx, &g, NULL);
    dt_test_error("synth_negative_start_is_named", dt_dlrm_synth_range(&ctx, &g, &b, -1, 4), dt_ctx_error(&ctx), "[-1");
    dt_test_error("synth_huge_count_is_named", dt_dlrm_synth_range(&ctx, &g, &b, 0, INT64_MAX / 4), dt_ctx_error(&ctx),
                  "too large");
    dt_test_error("synth_batch_rank_outside_world_is_named", dt_dlrm_synth_batch(&ctx, &g, &b, 0, 8, -1, 2),
                  dt_ctx_error(&ctx), "rank = -1");
    dt_dlrm_batch_free(&ctx, &b);
}

/* ---------------------------------------------------------------- TSV */

static void test_tsv_hand_lines(void) {
    static const long long dense1[13] = {5, -3, -100000, 0, 100, 1, 2, 3, 4, 5, 6, 7, 1234567};
    const char *hex1[26] = {"68fd1e64", "80E26C9B", NULL, "0", "ffffffffffffffff", "a", "b", "c", "d", "e", "f", "10",
                            "11", "12", "13", "14", "15", "16", "17", "18", "19", "1a", "1b", "1c", "1d", "1e"};
    char text[2048];
    dt_dlrm_tsv_desc d;
    dt_dlrm_tsv r;
    dt_dlrm_sample s[4];
    int n = 0, o, j, ok;
    dt_status st;
    char why[1024] = "";
    memset(&d, 0, sizeof d);
    d.table_size[1] = 1; /* every id of a 1-row table is 0 */
    d.table_size[0] = 1000;
    o = make_line(text, sizeof text, "1", dense1, hex1);
    o += snprintf(text + o, sizeof text - (size_t)o, "\n0");
    for (j = 0; j < 39; j++) text[o++] = '\t'; /* every field empty */
    text[o++] = '\n';
    text[o] = '\0';
    dt_dlrm_tsv_open_mem(&ctx, &r, text, (size_t)o, "hand.tsv", &d);
    st = read_all(&r, s, 4, &n);
    ok = st == DT_OK && n == 2;
    if (!ok) snprintf(why, sizeof why, "status %d, %d samples: %s", (int)st, n, dt_ctx_error(&ctx));
    /* hand values: log(1 + 5) = 1.791759469, log(1 + 100) = 4.615120517, log(1 + 1234567) = 14.02623... */
    if (ok && (fabs(s[0].dense[0] - 1.791759469) > 1e-6 || fabs(s[0].dense[4] - 4.615120517) > 1e-6 ||
               fabs(s[0].dense[12] - 14.026236) > 1e-5 || s[0].dense[1] != 0.0f || s[0].dense[2] != 0.0f || s[0].label != 1.0f)) {
        ok = 0;
        snprintf(why, sizeof why, "dense %.9g %.9g %.9g %g %g, label %g; want 1.791759469 4.615120517 14.026236 0 0, 1",
                 s[0].dense[0], s[0].dense[4], s[0].dense[12], s[0].dense[1], s[0].dense[2], s[0].label);
    }
    for (j = 0; ok && j < 13; j++)
        if (s[0].dense[j] != ref_dense(dense1[j] < -1000 ? 0 : dense1[j])) {
            ok = 0;
            snprintf(why, sizeof why, "dense %d = %.9g, want %.9g", j, s[0].dense[j], ref_dense(dense1[j]));
        }
    for (j = 0; ok && j < 26; j++) {
        int64_t size = d.table_size[j] ? d.table_size[j] : dt_dlrm_default_cardinality(j);
        int64_t want = hex1[j] ? ref_id(strtoull(hex1[j], NULL, 16), size) : 0;
        if (s[0].ids[j] != want) {
            ok = 0;
            snprintf(why, sizeof why, "C%d (%s) -> %lld, want %lld", j + 1, hex1[j] ? hex1[j] : "empty", (long long)s[0].ids[j],
                     (long long)want);
        }
    }
    if (ok) dt_test_pass("tsv_hand_written_line_parses_to_hand_values");
    else dt_test_fail("tsv_hand_written_line_parses_to_hand_values", "%s", why);
    ok = n == 2 && s[1].label == 0.0f;
    for (j = 0; ok && j < 13; j++) ok = s[1].dense[j] == 0.0f;
    for (j = 0; ok && j < 26; j++) ok = s[1].ids[j] == 0;
    DT_TEST_CHECK("tsv_empty_fields_are_dense_0_and_missing_id_0", ok);
    DT_TEST_CHECK("tsv_hex_id_68fd1e64_hashes_to_the_documented_row",
                  n >= 1 && s[0].ids[0] == 1 + (int64_t)(ref_hash(0x68fd1e64ull) % 999));
    dt_dlrm_tsv_close(&ctx, &r);
}

/* One malformed line after `good` valid lines must fail with a message holding `want`. */
static void check_bad(const char *name, const char *bad_line, int good, const char *want, int64_t max_line) {
    static const long long dense[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    const char *hex[26] = {"1", "2", "3", "4", "5", "6", "7", "8", "9", "a", "b", "c", "d", "e", "f", "10", "11", "12",
                           "13", "14", "15", "16", "17", "18", "19", "1a"};
    char text[20000], line[600];
    size_t o = 0;
    int i, n;
    dt_dlrm_tsv_desc d;
    dt_dlrm_tsv r;
    dt_dlrm_sample s[8];
    dt_status st;
    memset(&d, 0, sizeof d);
    d.max_line = max_line;
    make_line(line, sizeof line, "0", dense, hex);
    for (i = 0; i < good; i++) o += (size_t)snprintf(text + o, sizeof text - o, "%s\n", line);
    o += (size_t)snprintf(text + o, sizeof text - o, "%s\n", bad_line);
    dt_dlrm_tsv_open_mem(&ctx, &r, text, o, "bad.tsv", &d);
    st = read_all(&r, s, 8, &n);
    if (n != good) dt_test_fail(name, "%d samples before the error, want %d", n, good);
    else dt_test_error(name, st, dt_ctx_error(&ctx), want);
    dt_dlrm_tsv_close(&ctx, &r);
}

/* The valid line with field k (0 = label) replaced by `text`, or with `extra` appended. */
static void line_with(char *out, size_t cap, int k, const char *text) {
    static const long long dense[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    const char *hex[26] = {"1", "2", "3", "4", "5", "6", "7", "8", "9", "a", "b", "c", "d", "e", "f", "10", "11", "12",
                           "13", "14", "15", "16", "17", "18", "19", "1a"};
    char tmp[40][40];
    const char *field[40];
    size_t o = 0;
    int j;
    for (j = 0; j < 40; j++) {
        if (j == 0) snprintf(tmp[j], sizeof tmp[j], "0");
        else if (j <= 13) snprintf(tmp[j], sizeof tmp[j], "%lld", dense[j - 1]);
        else snprintf(tmp[j], sizeof tmp[j], "%s", hex[j - 14]);
        field[j] = j == k ? text : tmp[j];
    }
    for (j = 0; j < 40; j++) o += (size_t)snprintf(out + o, cap - o, j ? "\t%s" : "%s", field[j]);
}

static void test_tsv_malformed(void) {
    char line[1200], longhex[32];
    int j;
    line_with(line, sizeof line, 3, "12a");
    check_bad("tsv_bad_integer_names_line_field_and_text", line, 2, "bad.tsv: line 3, field 4 (I3): bad integer \"12a\"", 0);
    line_with(line, sizeof line, 1, "-");
    check_bad("tsv_lone_minus_is_a_bad_integer", line, 0, "line 1, field 2 (I1): bad integer \"-\"", 0);
    line_with(line, sizeof line, 13, "99999999999999999999");
    check_bad("tsv_integer_beyond_int64_is_named", line, 1, "field 14 (I13): integer out of the int64 range", 0);
    line_with(line, sizeof line, 18, "zz");
    check_bad("tsv_bad_hex_names_line_field_and_text", line, 1, "line 2, field 19 (C5): bad hex id \"zz\"", 0);
    memset(longhex, 'a', 17);
    longhex[17] = '\0';
    line_with(line, sizeof line, 39, longhex);
    check_bad("tsv_hex_of_17_digits_is_named", line, 0, "field 40 (C26): bad hex id (more than 16 digits)", 0);
    line_with(line, sizeof line, 0, "2");
    check_bad("tsv_label_2_is_named", line, 0, "field 1 (label): label is not 0 or 1: \"2\"", 0);
    line_with(line, sizeof line, 0, "");
    check_bad("tsv_empty_label_is_named", line, 0, "field 1 (label): label is not 0 or 1", 0);
    line_with(line, sizeof line, 0, "0.5");
    check_bad("tsv_fractional_label_is_named", line, 0, "label is not 0 or 1: \"0.5\"", 0);
    line_with(line, sizeof line, 5, "\001x");
    check_bad("tsv_control_bytes_are_escaped_in_the_message", line, 0, "bad integer \"\\x01x\"", 0);
    line_with(line, sizeof line, 39, "1a");
    line[strlen(line) - 3] = '\0'; /* drop the last field and its tab */
    check_bad("tsv_39_fields_is_a_wrong_field_count", line, 1, "line 2 has 39 fields; expected 40", 0);
    line_with(line, sizeof line, 39, "1a\t7\t8");
    check_bad("tsv_42_fields_is_a_wrong_field_count", line, 0, "line 1 has 42 fields; expected 40", 0);
    check_bad("tsv_empty_line_is_a_wrong_field_count", "", 1, "line 2 has 0 fields", 0);
    check_bad("tsv_one_field_line_is_a_wrong_field_count", "1", 0, "line 1 has 1 fields", 0);
    line_with(line, sizeof line, 1, "1");
    for (j = 0; j < 30; j++) strcat(line, "x"); /* the last field grows: 2 bytes of the 64 limit... */
    check_bad("tsv_overlong_line_is_named", line, 0, "line 1 is longer than max_line = 64 bytes", 64);
}

/* max_line is exact: a line of max_line bytes (plus \r\n) reads, one byte more does not, from
   memory and through a stream read 5 bytes at a time. */
static void test_tsv_max_line_boundary(void) {
    char line[600], text[1300];
    dt_dlrm_tsv_desc d;
    dt_dlrm_tsv r;
    dt_dlrm_sample s[4];
    int n, src, ok = 1, len;
    dt_status st;
    char why[1024] = "";
    line_with(line, sizeof line, 0, "1");
    len = (int)strlen(line);
    snprintf(text, sizeof text, "%s\n%s\r\n", line, line); /* without and with the \r */
    for (src = 0; src < 2 && ok; src++) {
        FILE *f = NULL;
        memset(&d, 0, sizeof d);
        d.max_line = len;
        d.read_chunk = 5;
        if (src) {
            f = tmpfile();
            fputs(text, f);
            rewind(f);
            dt_dlrm_tsv_open_stream(&ctx, &r, f, "exact.tsv", &d);
        } else dt_dlrm_tsv_open_mem(&ctx, &r, text, strlen(text), "exact.tsv", &d);
        st = read_all(&r, s, 4, &n);
        dt_dlrm_tsv_close(&ctx, &r);
        if (st || n != 2) { ok = 0; snprintf(why, sizeof why, "max_line = length %d (source %d): %d samples, %s", len, src, n, dt_ctx_error(&ctx)); }
        d.max_line = len - 1;
        if (f) {
            rewind(f);
            dt_dlrm_tsv_open_stream(&ctx, &r, f, "exact.tsv", &d);
        } else dt_dlrm_tsv_open_mem(&ctx, &r, text, strlen(text), "exact.tsv", &d);
        st = read_all(&r, s, 4, &n);
        dt_dlrm_tsv_close(&ctx, &r);
        if (ok && (n != 0 || !strstr(dt_ctx_error(&ctx), "line 1 is longer than max_line"))) {
            ok = 0;
            snprintf(why, sizeof why, "max_line = length - 1 (source %d): %d samples, \"%s\"", src, n, dt_ctx_error(&ctx));
        }
        if (f) fclose(f);
    }
    if (ok) dt_test_pass("tsv_line_of_exactly_max_line_bytes_reads_and_one_more_does_not");
    else dt_test_fail("tsv_line_of_exactly_max_line_bytes_reads_and_one_more_does_not", "%s", why);
}

static void test_tsv_skip_mode(void) {
    static const long long dense[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    const char *hex[26] = {"1", "2", "3", "4", "5", "6", "7", "8", "9", "a", "b", "c", "d", "e", "f", "10", "11", "12",
                           "13", "14", "15", "16", "17", "18", "19", "1a"};
    char text[8000], good[600], bad[600], longline[9000];
    size_t o = 0;
    int n = 0, i;
    dt_dlrm_tsv_desc d;
    dt_dlrm_tsv r;
    dt_dlrm_sample s[16];
    dt_status st;
    memset(&d, 0, sizeof d);
    d.skip_bad = 1;
    d.max_line = 300;
    make_line(good, sizeof good, "1", dense, hex);
    for (i = 0; i < 9; i++) {
        if (i % 2 == 1) {
            line_with(bad, sizeof bad, i, "q");
            o += (size_t)snprintf(text + o, sizeof text - o, "%s\n", bad); /* lines 2, 4, 6, 8 */
        } else o += (size_t)snprintf(text + o, sizeof text - o, "%s\n", good);
    }
    dt_dlrm_tsv_open_mem(&ctx, &r, text, o, "skip.tsv", &d);
    st = read_all(&r, s, 16, &n);
    if (st == DT_OK && n == 5 && r.skipped == 4 && r.line == 9 && strstr(r.first_skip, "line 2"))
        dt_test_pass("tsv_skip_mode_counts_bad_lines_and_keeps_the_good");
    else dt_test_fail("tsv_skip_mode_counts_bad_lines_and_keeps_the_good", "status %d, %d samples, %lld skipped, %lld lines, "
                      "first \"%s\"; want 0, 5, 4, 9, line 2", (int)st, n, (long long)r.skipped, (long long)r.line, r.first_skip);
    dt_dlrm_tsv_close(&ctx, &r);

    /* an overlong line through a stream with 7-byte reads: skipped whole, the next line read */
    memset(longline, '7', 5000);
    longline[5000] = '\0';
    o = (size_t)snprintf(text, sizeof text, "%s\n", good);
    {
        FILE *f = tmpfile();
        fwrite(text, 1, o, f);
        fwrite(longline, 1, 5000, f);
        fputc('\n', f);
        fwrite(text, 1, o, f);
        rewind(f);
        d.read_chunk = 7;
        dt_dlrm_tsv_open_stream(&ctx, &r, f, "long.tsv", &d);
        st = read_all(&r, s, 16, &n);
        if (st == DT_OK && n == 2 && r.skipped == 1 && r.line == 3 && strstr(r.first_skip, "line 2 is longer"))
            dt_test_pass("tsv_skip_mode_skips_an_overlong_line_in_a_stream");
        else dt_test_fail("tsv_skip_mode_skips_an_overlong_line_in_a_stream", "status %d, %d samples, %lld skipped, %lld "
                          "lines, first \"%s\"", (int)st, n, (long long)r.skipped, (long long)r.line, r.first_skip);
        dt_dlrm_tsv_close(&ctx, &r);
        fclose(f);
    }
    memset(&d, 0, sizeof d);
    d.skip_bad = 3;
    dt_test_error("tsv_skip_bad_flag_3_is_named", dt_dlrm_tsv_open_mem(&ctx, &r, text, o, NULL, &d), dt_ctx_error(&ctx),
                  "desc.skip_bad = 3");
    memset(&d, 0, sizeof d);
    d.table_size[7] = -1;
    dt_test_error("tsv_negative_table_size_is_named", dt_dlrm_tsv_open_mem(&ctx, &r, text, o, NULL, &d), dt_ctx_error(&ctx),
                  "desc.table_size[7] = -1");
    dt_test_error("tsv_missing_file_is_named", dt_dlrm_tsv_open(&ctx, &r, "/nonexistent/x.tsv", NULL), dt_ctx_error(&ctx),
                  "/nonexistent/x.tsv");
}

static void test_tsv_sources_agree(void) {
    enum { N = 300 };
    size_t len;
    char *text = random_tsv(N, &len), path[512], why[1024] = "";
    dt_dlrm_sample *a = (dt_dlrm_sample *)calloc(N + 1, sizeof *a), *b = (dt_dlrm_sample *)calloc(N + 1, sizeof *b);
    dt_dlrm_tsv r;
    dt_dlrm_tsv_desc d;
    int na = 0, nb = 0, nc = 0, ok;
    dt_status sa, sb, sc;
    memset(&d, 0, sizeof d);
    path_in_tmp(path, sizeof path, "random.tsv");
    write_bytes(path, text, len);
    dt_dlrm_tsv_open_mem(&ctx, &r, text, len, NULL, NULL);
    sa = read_all(&r, a, N + 1, &na);
    dt_dlrm_tsv_close(&ctx, &r);
    dt_dlrm_tsv_open(&ctx, &r, path, NULL);
    sb = read_all(&r, b, N + 1, &nb);
    dt_dlrm_tsv_close(&ctx, &r);
    ok = !sa && !sb && na == N && nb == N && !memcmp(a, b, sizeof *a * N);
    if (!ok) snprintf(why, sizeof why, "memory: %d samples (status %d), file: %d (status %d)", na, (int)sa, nb, (int)sb);
    d.read_chunk = 3; /* every line is split across reads */
    dt_dlrm_tsv_open(&ctx, &r, path, &d);
    memset(b, 0, sizeof *b * N);
    sc = read_all(&r, b, N + 1, &nc);
    dt_dlrm_tsv_close(&ctx, &r);
    if (ok && (sc || nc != N || memcmp(a, b, sizeof *a * N))) {
        ok = 0;
        snprintf(why, sizeof why, "3-byte reads: %d samples (status %d) differ", nc, (int)sc);
    }
    if (ok) dt_test_pass("tsv_file_memory_and_3_byte_reads_give_the_same_samples");
    else dt_test_fail("tsv_file_memory_and_3_byte_reads_give_the_same_samples", "%s: %s", why, dt_ctx_error(&ctx));
    free(text);
    free(a);
    free(b);
}

/* ---------------------------------------------------------------- binary form */

static void test_bin_round_trip(void) {
    enum { N = 300 };
    size_t len;
    char *text = random_tsv(N, &len), tsv[512], bin[512], why[1024] = "";
    dt_dlrm_sample *s = (dt_dlrm_sample *)calloc(N, sizeof *s);
    dt_dlrm_bin_desc bd;
    dt_dlrm_bin_open_desc od;
    dt_dlrm_tsv r;
    dt_dlrm_tsv_stats stats;
    dt_dlrm_bin f;
    dt_dlrm_batch whole, parts[3];
    int n = 0, variant, ok = 1, rk;
    memset(&whole, 0, sizeof whole);
    memset(parts, 0, sizeof parts);
    memset(&bd, 0, sizeof bd);
    path_in_tmp(tsv, sizeof tsv, "rt.tsv");
    path_in_tmp(bin, sizeof bin, "rt.bin");
    write_bytes(tsv, text, len);
    bd.tsv.table_size[0] = 3;
    bd.tsv.table_size[25] = 100000;
    dt_dlrm_tsv_open_mem(&ctx, &r, text, len, NULL, &bd.tsv);
    read_all(&r, s, N, &n);
    dt_dlrm_tsv_close(&ctx, &r);
    for (variant = 0; variant < 8 && ok; variant++) {
        /* bit 0: f32 labels, bit 1: i64 ids, bit 2: read instead of mmap */
        bd.label_f32 = variant & 1;
        bd.ids_i64 = (variant >> 1) & 1;
        od.no_mmap = (variant >> 2) & 1;
        if (dt_dlrm_bin_convert(&ctx, bin, &stats, tsv, &bd) || dt_dlrm_bin_open(&ctx, &f, bin, &od)) {
            ok = 0;
            snprintf(why, sizeof why, "variant %d: %s", variant, dt_ctx_error(&ctx));
            break;
        }
        if (stats.samples != N || f.n != N || stats.skipped != 0 || f.table_size[25] != 100000 ||
            file_size(bin) != (long)(256 + ((N * (bd.label_f32 ? 4 : 1) + 63) / 64 * 64) + ((N * 52 + 63) / 64 * 64) +
                                     N * 26 * (bd.ids_i64 ? 8 : 4))) {
            ok = 0;
            snprintf(why, sizeof why, "variant %d: %lld samples, file %ld bytes", variant, (long long)f.n, file_size(bin));
        } else if (dt_dlrm_bin_range(&ctx, &f, &whole, 0, N) || !batch_equals_samples(&whole, s, why, sizeof why)) {
            ok = 0;
            snprintf(why + strlen(why), sizeof why - strlen(why), " (variant %d) %s", variant, dt_ctx_error(&ctx));
        } else {
            /* global batch 4 of 64 = samples [256, 300): a partial batch, split over 3 ranks */
            dt_dlrm_bin_batch(&ctx, &f, &whole, 4, 64, 0, 1);
            for (rk = 0; rk < 3; rk++) dt_dlrm_bin_batch(&ctx, &f, &parts[rk], 4, 64, rk, 3);
            if (whole.size != 44 || !batch_equals_samples(&whole, s + 256, why, sizeof why) ||
                !slices_equal_whole(&whole, parts, 3, why, sizeof why)) {
                ok = 0;
                snprintf(why + strlen(why), sizeof why - strlen(why), " (variant %d, partial batch of %lld)", variant,
                         (long long)whole.size);
            }
        }
        dt_dlrm_bin_close(&ctx, &f);
    }
    if (ok) dt_test_pass("bin_round_trip_equals_direct_parse_in_every_layout");
    else dt_test_fail("bin_round_trip_equals_direct_parse_in_every_layout", "%s", why);
    dt_dlrm_batch_free(&ctx, &whole);
    for (rk = 0; rk < 3; rk++) dt_dlrm_batch_free(&ctx, &parts[rk]);
    free(text);
    free(s);
}

static void test_bin_convert_errors(void) {
    char tsv[512], bin[512], tmp[600], line[600], text[2000];
    dt_dlrm_bin_desc bd;
    dt_dlrm_tsv_stats stats;
    dt_dlrm_bin f;
    size_t o = 0;
    int i;
    memset(&bd, 0, sizeof bd);
    path_in_tmp(tsv, sizeof tsv, "bad.tsv");
    path_in_tmp(bin, sizeof bin, "bad.bin");
    snprintf(tmp, sizeof tmp, "%s.tmp", bin);
    for (i = 0; i < 3; i++) {
        line_with(line, sizeof line, i == 1 ? 20 : 0, i == 1 ? "nothex" : "1");
        o += (size_t)snprintf(text + o, sizeof text - o, "%s\n", line);
    }
    write_bytes(tsv, text, o);
    remove(bin); /* a file from an earlier run must not pass the check below */
    dt_test_error("bin_convert_of_a_bad_line_is_named", dt_dlrm_bin_convert(&ctx, bin, &stats, tsv, &bd), dt_ctx_error(&ctx),
                  "line 2, field 21 (C7): bad hex id \"nothex\"");
    DT_TEST_CHECK("bin_convert_failure_leaves_no_file", file_size(bin) < 0 && file_size(tmp) < 0);
    bd.tsv.skip_bad = 1;
    if (dt_dlrm_bin_convert(&ctx, bin, &stats, tsv, &bd) == DT_OK && dt_dlrm_bin_open(&ctx, &f, bin, NULL) == DT_OK) {
        if (stats.samples == 2 && stats.skipped == 1 && f.n == 2 && f.skipped == 1) dt_test_pass("bin_convert_skip_mode_counts_bad_lines");
        else dt_test_fail("bin_convert_skip_mode_counts_bad_lines", "%lld samples, %lld skipped (header %lld, %lld); want 2, 1",
                          (long long)stats.samples, (long long)stats.skipped, (long long)f.n, (long long)f.skipped);
        dt_dlrm_bin_close(&ctx, &f);
    } else dt_test_fail("bin_convert_skip_mode_counts_bad_lines", "%s", dt_ctx_error(&ctx));
    bd.tsv.table_size[3] = ((int64_t)1 << 31) + 1;
    dt_test_error("bin_convert_i32_ids_of_a_huge_table_is_named", dt_dlrm_bin_convert(&ctx, bin, &stats, tsv, &bd),
                  dt_ctx_error(&ctx), "desc.tsv.table_size[3] = 2147483649 does not fit i32 ids");
    bd.tsv.table_size[3] = 0;
    bd.ids_i64 = 7;
    dt_test_error("bin_convert_flag_7_is_named", dt_dlrm_bin_convert(&ctx, bin, &stats, tsv, &bd), dt_ctx_error(&ctx),
                  "desc.ids_i64 = 7");
}

/* Writes bytes [0, n) of src (patched at `at` with `patch` of plen bytes when plen > 0) to
   path and opens it both ways; both must fail with `want` in the message. */
static void check_bad_bin(const char *name, const unsigned char *src, long n, long at, const void *patch, size_t plen,
                          const char *want) {
    char path[512];
    unsigned char *b = (unsigned char *)malloc((size_t)n + 1);
    dt_dlrm_bin f;
    dt_dlrm_bin_open_desc od;
    dt_status s1, s2;
    char m1[DT_ERROR_MAX];
    memcpy(b, src, (size_t)n);
    if (plen) memcpy(b + at, patch, plen);
    path_in_tmp(path, sizeof path, "corrupt.bin");
    write_bytes(path, b, (size_t)n);
    od.no_mmap = 0;
    s1 = dt_dlrm_bin_open(&ctx, &f, path, &od);
    snprintf(m1, sizeof m1, "%s", dt_ctx_error(&ctx));
    od.no_mmap = 1;
    s2 = dt_dlrm_bin_open(&ctx, &f, path, &od);
    if (s1 != DT_ERR_FORMAT) dt_test_fail(name, "mmap open: status %d \"%s\", want DT_ERR_FORMAT with \"%s\"", (int)s1, m1, want);
    else if (!strstr(m1, want)) dt_test_fail(name, "mmap open: \"%s\" does not mention \"%s\"", m1, want);
    else dt_test_error(name, s2 == DT_ERR_FORMAT ? 1 : 0, dt_ctx_error(&ctx), want);
    free(b);
}

/* A value corrupted inside the arrays: open succeeds, the batch fill names the sample. */
static void check_bad_value(const char *name, const unsigned char *src, long n, long at, const void *patch, size_t plen,
                            const char *want) {
    char path[512];
    unsigned char *b = (unsigned char *)malloc((size_t)n);
    dt_dlrm_bin f;
    dt_dlrm_batch batch;
    dt_status st;
    memset(&batch, 0, sizeof batch);
    memcpy(b, src, (size_t)n);
    memcpy(b + at, patch, plen);
    path_in_tmp(path, sizeof path, "corrupt_value.bin");
    write_bytes(path, b, (size_t)n);
    if ((st = dt_dlrm_bin_open(&ctx, &f, path, NULL)) != DT_OK) dt_test_fail(name, "open failed: %s", dt_ctx_error(&ctx));
    else {
        st = dt_dlrm_bin_batch(&ctx, &f, &batch, 0, 300, 0, 1);
        dt_test_error(name, st, dt_ctx_error(&ctx), want);
        dt_dlrm_bin_close(&ctx, &f);
    }
    dt_dlrm_batch_free(&ctx, &batch);
    free(b);
}

static void test_bin_rejects_bad_files(void) {
    enum { N = 300 };
    size_t len;
    char *text = random_tsv(N, &len), tsv[512], bin[512];
    unsigned char *good, v32[4], v64[8];
    long n;
    uint64_t big = (uint64_t)1 << 60;
    uint32_t u;
    int64_t id;
    float nan_v = (float)NAN;
    dt_dlrm_bin_desc bd;
    memset(&bd, 0, sizeof bd);
    path_in_tmp(tsv, sizeof tsv, "good.tsv");
    path_in_tmp(bin, sizeof bin, "good.bin");
    write_bytes(tsv, text, len);
    bd.ids_i64 = 1;
    if (dt_dlrm_bin_convert(&ctx, bin, NULL, tsv, &bd) || !(good = read_bytes(bin, &n))) {
        dt_test_fail("bin_fixture", "%s", dt_ctx_error(&ctx));
        free(text);
        return;
    }
    check_bad_bin("bin_truncated_by_one_byte_is_rejected", good, n - 1, 0, NULL, 0, "truncated");
    check_bad_bin("bin_cut_inside_the_dense_array_is_rejected", good, 1000, 0, NULL, 0, "needs");
    check_bad_bin("bin_header_only_is_rejected", good, 256, 0, NULL, 0, "(300 samples) needs");
    check_bad_bin("bin_shorter_than_the_header_is_rejected", good, 255, 0, NULL, 0, "shorter than the 256-byte header");
    check_bad_bin("bin_empty_file_is_rejected", good, 0, 0, NULL, 0, "is 0 bytes");
    check_bad_bin("bin_foreign_file_is_rejected", (const unsigned char *)text, (long)len, 0, NULL, 0, "magic");
    u = 2;
    memcpy(v32, &u, 4);
    check_bad_bin("bin_version_2_is_rejected", good, n, 8, v32, 4, "version 2");
    u = 3;
    memcpy(v32, &u, 4);
    check_bad_bin("bin_label_bytes_3_is_rejected", good, n, 32, v32, 4, "label bytes 3");
    memcpy(v64, &big, 8);
    check_bad_bin("bin_huge_sample_count_is_rejected", good, n, 16, v64, 8, "overflow a file's byte size");
    memset(v64, 0, 8);
    check_bad_bin("bin_table_size_0_is_rejected", good, n, 48 + 8 * 4, v64, 8, "table size 4 = 0");
    u = 14;
    memcpy(v32, &u, 4);
    check_bad_bin("bin_dense_count_14_is_rejected", good, n, 24, v32, 4, "14 dense");

    /* values: label 7 at sample 5; an id beyond its table at sample 9 feature 2; a NaN dense */
    v32[0] = 7;
    check_bad_value("bin_label_7_is_named_at_fill", good, n, 256 + 5, v32, 1, "sample 5 has a label that is not 0 or 1");
    id = 1 << 20;
    {
        long ids_at = 256 + (N + 63) / 64 * 64 + (N * 52 + 63) / 64 * 64;
        check_bad_value("bin_id_outside_its_table_is_named_at_fill", good, n, ids_at + (9 * 26 + 2) * 8, &id, 8,
                        "sample 9 feature 2: id 1048576 outside [0, 16384)");
        check_bad_value("bin_nan_dense_is_named_at_fill", good, n, 256 + (N + 63) / 64 * 64 + (3 * 13 + 4) * 4, &nan_v, 4,
                        "sample 3 dense 4");
    }
    free(good);
    free(text);
}

/* ---------------------------------------------------------------- evaluation */

static double brute_auc(const float *s, const float *y, int n) {
    double u = 0.0, p = 0.0, q = 0.0;
    int i, j;
    for (i = 0; i < n; i++) {
        if (y[i] != 1.0f) continue;
        for (j = 0; j < n; j++)
            if (y[j] == 0.0f) u += s[i] > s[j] ? 1.0 : s[i] == s[j] ? 0.5 : 0.0;
    }
    for (i = 0; i < n; i++) { p += y[i] == 1.0f; q += y[i] == 0.0f; }
    return u / (p * q);
}

static void test_auc_and_logloss(void) {
    static const float s1[4] = {0.1f, 0.4f, 0.35f, 0.8f}, y1[4] = {0, 0, 1, 1};
    static const float s2[5] = {0.3f, 0.3f, 0.3f, 0.3f, 0.3f}, y2[5] = {1, 0, 1, 0, 0};
    /* ties across classes: positives 0.5 and 0.9, negatives 0.2, 0.5, 0.5.
       pairs: 0.5 vs 0.2 -> 1, 0.5 vs 0.5 -> 1/2 twice, 0.9 vs each -> 1 x 3: U = 5 of 2 x 3 = 6 */
    static const float s3[5] = {0.2f, 0.5f, 0.5f, 0.5f, 0.9f}, y3[5] = {0, 1, 0, 0, 1};
    static const float p4[3] = {0.9f, 0.2f, 0.6f}, y4[3] = {1, 0, 1};
    static const float p5[2] = {0.0f, 1.0f}, y5[2] = {1, 0};
    enum { N = 2000 };
    float *s = (float *)malloc(N * 4), *y = (float *)malloc(N * 4), *rs = (float *)malloc(N * 4), *ry = (float *)malloc(N * 4);
    double auc = -1, auc_r = -1, loss = -1;
    float bad[2] = {0.5f, 0.0f};
    int i;
    dt_dlrm_auc(&ctx, &auc, s1, y1, 4);
    dt_test_close("auc_of_the_four_sample_case_is_0_75", auc, 0.75, 1e-15);
    dt_dlrm_auc(&ctx, &auc, s2, y2, 5);
    dt_test_close("auc_of_all_tied_scores_is_0_5", auc, 0.5, 1e-15);
    dt_dlrm_auc(&ctx, &auc, s3, y3, 5);
    dt_test_close("auc_with_ties_across_classes_is_5_6", auc, 5.0 / 6.0, 1e-15);
    for (i = 0; i < N; i++) { /* 10 score levels: many ties */
        s[i] = (float)(dt_rng_uniform(9, 0, (uint64_t)i) < 0.5f ? (int)(dt_rng_uniform(9, 1, (uint64_t)i) * 10) : (int)(dt_rng_uniform(9, 2, (uint64_t)i) * 7) + 3) / 10.0f;
        y[i] = dt_rng_uniform(9, 3, (uint64_t)i) < 0.2f + 0.05f * s[i] * 10 ? 1.0f : 0.0f;
        rs[N - 1 - i] = s[i];
        ry[N - 1 - i] = y[i];
    }
    dt_dlrm_auc(&ctx, &auc, s, y, N);
    dt_test_close("auc_equals_the_brute_force_pair_count_with_ties", auc, brute_auc(s, y, N), 1e-12);
    dt_dlrm_auc(&ctx, &auc_r, rs, ry, N);
    dt_test_equal_bytes("auc_does_not_depend_on_sample_order", &auc_r, &auc, sizeof auc);
    dt_test_error("auc_of_one_class_is_named", dt_dlrm_auc(&ctx, &auc, s1, y1 + 2, 2), dt_ctx_error(&ctx), "both classes");
    bad[0] = (float)NAN;
    dt_test_error("auc_nan_score_is_named", dt_dlrm_auc(&ctx, &auc, bad, y1 + 1, 2), dt_ctx_error(&ctx), "scores[0] is NaN");
    bad[0] = 0.5f;
    dt_test_error("auc_label_0_5_is_named", dt_dlrm_auc(&ctx, &auc, s1, bad, 2), dt_ctx_error(&ctx), "labels[0] = 0.5");
    dt_test_error("auc_of_no_samples_is_named", dt_dlrm_auc(&ctx, &auc, s1, y1, 0), dt_ctx_error(&ctx), "n = 0");

    /* -(ln 0.9 + ln 0.8 + ln 0.6) / 3 = (0.105360516 + 0.223143551 + 0.510825624) / 3 */
    dt_dlrm_logloss(&ctx, &loss, p4, y4, 3, 0.0);
    dt_test_close("logloss_matches_the_hand_value", loss, 0.279776564, 1e-8);
    dt_dlrm_logloss(&ctx, &loss, p5, y5, 2, 0.0); /* both certain and wrong: -ln(1e-7) each */
    dt_test_close("logloss_clamps_certain_wrong_predictions_at_eps", loss, 16.118095651, 1e-6);
    dt_test_error("logloss_eps_0_7_is_named", dt_dlrm_logloss(&ctx, &loss, p4, y4, 3, 0.7), dt_ctx_error(&ctx), "eps = 0.7");
    free(s);
    free(y);
    free(rs);
    free(ry);
}

int main(void) {
    dt_ctx_init(&ctx, NULL);
    test_synth_deterministic();
    test_synth_sharding();
    test_split();
    test_synth_power_law();
    test_synth_scramble_is_a_bijection();
    test_synth_clicks_and_learnability();
    test_synth_multi_hot();
    test_synth_bad_args();
    test_tsv_hand_lines();
    test_tsv_malformed();
    test_tsv_max_line_boundary();
    test_tsv_skip_mode();
    test_tsv_sources_agree();
    test_bin_round_trip();
    test_bin_convert_errors();
    test_bin_rejects_bad_files();
    test_auc_and_logloss();
    DT_TEST_CHECK("no_bytes_leak_from_the_ctx", ctx.bytes_in_use == 0);
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
