/* tests/test_embed_hugepage.c - dt_embed.h's huge-page advice on large shards (dt__em_hugepage:
   MADV_HUGEPAGE + MADV_COLLAPSE on tables and optimizer state of 4 MiB or more) changes no value:
   (1) a 40000 x 64 f32 table (10 MB, Adagrad state as large) holds, after dt_embed_create, the
   bits dt_tensor_init gives a separate tensor with the same init (the collapse copied the pages);
   (2) the pooled sums of a batch equal a hand f32 sum in bag order over those rows, bitwise;
   (3) on Linux >= 6.1 (MADV_COLLAPSE), where transparent huge pages are not "never", at least
   2 MiB of the table's mapping is in huge pages (AnonHugePages of /proc/self/smaps).
   A table under 4 MiB is not advised (no check beyond its values: the same path as before). */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "dt_test.h"

static dt_ctx C;

enum { R = 40000, D = 64, B = 256 };

/* PASS iff got and want hold the same bits; else the first difference, both values. */
static int same_bits(const char *name, const float *got, const float *want, int64_t n) {
    int64_t i, bad = 0, first = -1;
    for (i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float))) { if (first < 0) first = i; bad++; }
    if (!bad) return dt_test_pass(name);
    return dt_test_fail(name, "%lld of %lld floats differ; first at %lld: got %.9g, want %.9g", (long long)bad,
                        (long long)n, (long long)first, (double)got[first], (double)want[first]);
}

/* kB in huge pages of the mappings that overlap [p, p + bytes), from /proc/self/smaps (the
   advice splits the buffer's mapping in three); -1 if unknown. */
static long huge_kb(const void *p, size_t bytes) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int in = 0;
    long kb, sum = -1;
    uintptr_t lo = (uintptr_t)p, hi = (uintptr_t)p + bytes;
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        char *dash = strchr(line, '-'), *sp = strchr(line, ' ');
        if (dash && sp && dash < sp && sscanf(line, "%lx-%lx ", &a, &b) == 2) {
            in = a < hi && b > lo;
            continue;
        }
        if (in && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) sum = (sum < 0 ? 0 : sum) + kb;
    }
    fclose(f);
    return sum;
}

static int thp_never(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128] = {0};
    if (!f) return 1;
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    fclose(f);
    return strstr(line, "[never]") != NULL || !line[0];
}

/* Linux >= 6.1 (MADV_COLLAPSE) */
static int kernel_collapses(void) {
    FILE *f = fopen("/proc/sys/kernel/osrelease", "r");
    int major = 0, minor = 0;
    if (!f) return 0;
    if (fscanf(f, "%d.%d", &major, &minor) != 2) major = 0;
    fclose(f);
    return major > 6 || (major == 6 && minor >= 1);
}

static void test_large_table(void) {
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    dt_init_desc in;
    dt_tensor_desc td;
    dt_tensor ref, w, out;
    dt_tensor_desc od;
    dt_kjt k;
    int64_t lengths[B], ids[B * 5], n = 0, i, j, c, r0, c0;
    float *want = (float *)malloc(sizeof(float) * B * D);
    long kb;
    memset(&t, 0, sizeof t);
    t.name = "big"; t.rows = R; t.dim = D; t.optim.kind = DT_EMBED_ADAGRAD;
    t.init.kind = DT_INIT_NORMAL; t.init.std = 1; t.init.seed = 11;
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.seed = 3;
    if (!want || dt_embed_create(&C, &e, &d)) { dt_test_fail("hugepage_create", "%s", dt_ctx_error(&C)); free(want); return; }
    /* the same init on a tensor of its own (a 10 MB malloc block: advised by nobody) */
    memset(&td, 0, sizeof td);
    td.shape[0] = R; td.shape[1] = D; td.ndim = 2;
    memset(&od, 0, sizeof od);
    od.shape[0] = B; od.shape[1] = D; od.ndim = 2;
    if (dt_tensor_create(&C, &ref, &td) || dt_tensor_create(&C, &out, &od)) exit(2);
    memset(&in, 0, sizeof in);
    in.kind = DT_INIT_NORMAL; in.std = 1; in.seed = 11; in.name = "big";
    in.global_shape[0] = R; in.global_shape[1] = D;
    if (dt_tensor_init(&C, &ref, &in)) { dt_test_fail("hugepage_ref_init", "%s", dt_ctx_error(&C)); exit(2); }
    dt_embed_local_shard(e, &w, &r0, &c0, 0);
    DT_TEST_CHECK("hugepage_table_is_whole_shard", r0 == 0 && c0 == 0 && w.numel == (int64_t)R * D);
    same_bits("hugepage_table_values_equal_dt_tensor_init", (const float *)w.data, (const float *)ref.data,
              (int64_t)R * D);
    for (i = 0; i < B; i++) {
        lengths[i] = 1 + (int64_t)(dt_rng_uniform(5, 0, (uint64_t)i) * 5.0f) % 5;
        for (j = 0; j < lengths[i]; j++, n++) ids[n] = (int64_t)(dt_rng_uniform(5, 1, (uint64_t)n) * (float)R) % R;
    }
    for (i = 0, n = 0; i < B; i++) { /* acc = ((0 + row_0) + row_1) + ..., f32, bag order */
        for (c = 0; c < D; c++) want[i * D + c] = 0.0f;
        for (j = 0; j < lengths[i]; j++, n++)
            for (c = 0; c < D; c++) want[i * D + c] += ((const float *)ref.data)[ids[n] * D + c];
    }
    memset(&k, 0, sizeof k);
    k.n_features = 1; k.batch = B; k.lengths = lengths; k.ids = ids;
    if (dt_embed_forward(e, &out, &k)) dt_test_fail("hugepage_forward", "%s", dt_ctx_error(&C));
    else same_bits("hugepage_pooled_sums_equal_hand_f32_sum", (const float *)out.data, want, (int64_t)B * D);
#ifdef __linux__
    kb = huge_kb(w.data, dt_tensor_bytes(&w));
    if (thp_never()) dt_test_skip("hugepage_table_in_huge_pages", "transparent huge pages are off here");
    else if (kb <= 0 && !kernel_collapses())
        dt_test_skip("hugepage_table_in_huge_pages", "no huge page (AnonHugePages %ld kB); Linux < 6.1 has no "
                     "MADV_COLLAPSE, and the table was touched before the advice", kb);
    else if (kb >= 2048) dt_test_pass("hugepage_table_in_huge_pages");
    else dt_test_fail("hugepage_table_in_huge_pages", "%ld kB of the %d kB table in huge pages; want >= 2048", kb,
                      R * D * 4 / 1024);
#else
    (void)kb; (void)huge_kb; (void)thp_never; (void)kernel_collapses;
    dt_test_skip("hugepage_table_in_huge_pages", "not Linux");
#endif
    dt_tensor_free(&C, &ref); dt_tensor_free(&C, &out);
    dt_embed_free(e);
    free(want);
}

int main(void) {
    dt_ctx_init(&C, NULL);
    test_large_table();
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
