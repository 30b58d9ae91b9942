/* tests/test_tensor_limits.c - adversarial tests of dt_tensor.h at its limits: shapes whose
   sizes overflow, empty tensors through every op, float-to-integer conversions, structs that are
   not live tensors, the string builder on bad input, NaN and -0 in relu, backward passes with
   NULL gradients, and hand-written safetensors files with impossible shapes.

   Every size check must give a named status, never a wrap: the run under ASan+UBSan
   (run.sh's "asan:" run) is part of the test. Huge requests go through a ctx whose allocator
   refuses more than 64 MiB, so that a size that passes the checks fails as DT_ERR_OOM instead
   of stopping ASan (which aborts on a malloc beyond its limit). The checks that exercise
   products of huge dims inside empty tensors run last, since a UBSan report ends the asan run. */
#include "dt_tensor.h"
#include "dt_test.h"

static dt_ctx C;   /* malloc / free */
static dt_ctx CAP; /* refuses blocks over 64 MiB */

#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define P2(k) ((int64_t)1 << (k))

static void *cap_alloc(size_t n, void *u) { (void)u; return n > ((size_t)64 << 20) ? NULL : malloc(n); }
static void cap_release(void *p, void *u) { (void)u; free(p); }

/* ---------------------------------------------------------------- helpers */

/* A tensor of `nd` dims (zeros allowed); the test stops when it cannot be made. */
static dt_tensor mk(dt_dtype dt, int nd, const int64_t *shape) {
    dt_tensor t;
    dt_tensor_desc d;
    int i;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.ndim = nd;
    for (i = 0; i < nd; i++) d.shape[i] = shape[i];
    if (dt_tensor_create(&C, &t, &d)) {
        dt_test_fail("setup_create", "dt_tensor_create(ndim %d): %s", nd, dt_ctx_error(&C));
        exit(1);
    }
    return t;
}
static float *F(const dt_tensor *t) { return (float *)t->data; }

/* Deterministic non-trivial values (distinct per name). */
static void rnd(dt_tensor *t, const char *name) {
    dt_init_desc d;
    memset(&d, 0, sizeof d);
    d.kind = DT_INIT_NORMAL; d.seed = 99; d.name = name; d.std = 1.0;
    if (dt_tensor_init(&C, t, &d)) { dt_test_fail("setup_init", "%s", dt_ctx_error(&C)); exit(1); }
}

static void setf(dt_tensor *t, const float *v) { memcpy(t->data, v, dt_tensor_bytes(t)); }

/* PASS iff st == want (want < 0: any error) and the ctx message contains every non-NULL word. */
static int expect_err(const char *name, dt_ctx *ctx, dt_status st, int want, const char *w1, const char *w2) {
    const char *msg = dt_ctx_error(ctx);
    if (st == DT_OK)
        return dt_test_fail(name, "status 0 (ok), want %s mentioning \"%s\"%s%s%s",
                            want < 0 ? "an error" : dt_status_name((dt_status)want), w1 ? w1 : "",
                            w2 ? " and \"" : "", w2 ? w2 : "", w2 ? "\"" : "");
    if (want >= 0 && (int)st != want)
        return dt_test_fail(name, "status %d (%s), want %d (%s); message \"%s\"", (int)st, dt_status_name(st), want,
                            dt_status_name((dt_status)want), msg);
    if ((w1 && !strstr(msg, w1)) || (w2 && !strstr(msg, w2)))
        return dt_test_fail(name, "status %d (%s), message \"%s\", want it to mention \"%s\"%s%s%s", (int)st,
                            dt_status_name(st), msg, w1 ? w1 : "", w2 ? " and \"" : "", w2 ? w2 : "", w2 ? "\"" : "");
    return dt_test_pass(name);
}

static int expect_ok(const char *name, dt_ctx *ctx, dt_status st) {
    if (st == DT_OK) return dt_test_pass(name);
    return dt_test_fail(name, "status %d (%s): %s", (int)st, dt_status_name(st), dt_ctx_error(ctx));
}

/* PASS iff every float equals v (bitwise for NaN-free v). */
static int all_eq(const char *name, const dt_tensor *t, float v) {
    int64_t i;
    for (i = 0; i < t->numel; i++)
        if (F(t)[i] != v)
            return dt_test_fail(name, "element %lld of %lld = %.9g, want %.9g", (long long)i, (long long)t->numel,
                                (double)F(t)[i], (double)v);
    return dt_test_pass(name);
}

static int file_exists(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (fp) fclose(fp);
    return fp != NULL;
}

/* Writes a safetensors file by hand: the 8-byte little-endian length, the header, the data. */
static void write_st(const char *path, const char *header, const void *data, size_t n) {
    unsigned char len8[8];
    uint64_t hl = strlen(header);
    int k;
    FILE *fp = fopen(path, "wb");
    if (!fp) { dt_test_fail("setup_write", "cannot write %s", path); exit(1); }
    for (k = 0; k < 8; k++) len8[k] = (unsigned char)(hl >> (8 * k));
    fwrite(len8, 1, 8, fp);
    fwrite(header, 1, (size_t)hl, fp);
    if (n) fwrite(data, 1, n, fp);
    fclose(fp);
}

static void tmp_path(char *buf, size_t n, const char *file) { snprintf(buf, n, "%s/%s", dt_test_tmpdir(), file); }

/* ---------------------------------------------------------------- 1. sizes that overflow */

static void test_mul_ok_and_numel(void) {
    int64_t out = 12345, r;
    DT_TEST_CHECK("mul_ok_int64_max_times_one", dt_mul_ok(INT64_MAX, 1, &out) == 1 && out == INT64_MAX);
    out = 12345;
    DT_TEST_CHECK("mul_ok_int64_max_times_two_fails_and_leaves_out", dt_mul_ok(INT64_MAX, 2, &out) == 0 && out == 12345);
    DT_TEST_CHECK("mul_ok_two_times_int64_max_fails", dt_mul_ok(2, INT64_MAX, &out) == 0 && out == 12345);
    DT_TEST_CHECK("mul_ok_zero_times_int64_max_is_zero", dt_mul_ok(0, INT64_MAX, &out) == 1 && out == 0);
    DT_TEST_CHECK("mul_ok_int64_max_times_zero_is_zero", dt_mul_ok(INT64_MAX, 0, &out) == 1 && out == 0);
    out = 12345;
    DT_TEST_CHECK("mul_ok_negative_fails", dt_mul_ok(-1, 0, &out) == 0 && dt_mul_ok(0, -1, &out) == 0 &&
                                               dt_mul_ok(-3, -3, &out) == 0 && dt_mul_ok(INT64_MIN, 1, &out) == 0 &&
                                               out == 12345);
    DT_TEST_CHECK("mul_ok_2p31_times_2p32_overflows", dt_mul_ok(P2(31), P2(32), &out) == 0);
    DT_TEST_CHECK("mul_ok_largest_square_fits", dt_mul_ok(3037000499LL, 3037000499LL, &out) == 1 &&
                                                    out == 9223372030926249001LL);
    DT_TEST_CHECK("mul_ok_next_square_overflows", dt_mul_ok(3037000500LL, 3037000500LL, &out) == 0);
    DT_TEST_CHECK("mul_ok_2p62_times_2_overflows", dt_mul_ok(P2(62), 2, &out) == 0);

    r = dt_shape_numel(0, NULL);
    DT_TEST_CHECK("shape_numel_scalar_is_one", r == 1);
    DT_TEST_CHECK("shape_numel_bad_ndim", dt_shape_numel(-1, SH(1)) == -1 && dt_shape_numel(9, SH(1, 1, 1, 1, 1, 1, 1, 1, 1)) == -1);
    DT_TEST_CHECK("shape_numel_null_shape_with_dims", dt_shape_numel(2, NULL) == -1);
    DT_TEST_CHECK("shape_numel_negative_dim", dt_shape_numel(2, SH(4, -1)) == -1 && dt_shape_numel(2, SH(-4, -1)) == -1);
    DT_TEST_CHECK("shape_numel_int64_max", dt_shape_numel(2, SH(INT64_MAX, 1)) == INT64_MAX);
    DT_TEST_CHECK("shape_numel_overflow", dt_shape_numel(3, SH(P2(32), P2(32), P2(32))) == -1 &&
                                              dt_shape_numel(3, SH(3, P2(62), 4)) == -1);
    DT_TEST_CHECK("shape_numel_zero_dim_first", dt_shape_numel(3, SH(0, 64, 7)) == 0);
    {
        /* The product of [2^62, 2^62, 0] is 0, which fits; and it is the product of [0, 2^62, 2^62]
           in another order. The answer may be 0 for both or -1 for both, but not depend on the
           order of the dims (the ops multiply the dims in other orders and groupings). */
        int64_t a = dt_shape_numel(3, SH(0, P2(62), P2(62))), b = dt_shape_numel(3, SH(P2(62), P2(62), 0));
        int64_t c = dt_shape_numel(3, SH(P2(62), 0, P2(62)));
        if (a == b && b == c) dt_test_pass("shape_numel_independent_of_dim_order");
        else dt_test_fail("shape_numel_independent_of_dim_order", "numel [0,2^62,2^62] = %lld, [2^62,0,2^62] = %lld, "
                          "[2^62,2^62,0] = %lld; want one answer", (long long)a, (long long)c, (long long)b);
    }
}

static void test_overflow_shapes(void) {
    dt_tensor t, v, big;
    dt_tensor_desc d;
    dt_status st;
    size_t before;

    memset(&d, 0, sizeof d);
    d.shape[0] = P2(62);
    st = dt_tensor_create(&C, &t, &d);
    expect_err("create_f32_2p62_bytes_overflow_is_named", &C, st, DT_ERR_ARG, "too large", "4611686018427387904");
    DT_TEST_CHECK("create_failure_leaves_tensor_empty", t.data == NULL && t.numel == 0 && t.owns == 0);

    memset(&d, 0, sizeof d);
    d.shape[0] = P2(32); d.shape[1] = P2(32); d.shape[2] = P2(32);
    st = dt_tensor_create(&C, &t, &d);
    expect_err("create_2p32_cubed_is_named", &C, st, DT_ERR_ARG, "too large", "overflows int64");

    memset(&d, 0, sizeof d);
    d.shape[0] = 3; d.shape[1] = P2(62); d.shape[2] = 4;
    st = dt_tensor_create(&C, &t, &d);
    expect_err("create_3_2p62_4_is_named", &C, st, DT_ERR_ARG, "too large", "overflows int64");

    memset(&d, 0, sizeof d);
    d.dtype = DT_I64; d.shape[0] = P2(61);
    st = dt_tensor_create(&C, &t, &d);
    expect_err("create_i64_2p61_bytes_overflow_is_named", &C, st, DT_ERR_ARG, "too large", "i64");

    memset(&d, 0, sizeof d);
    d.shape[0] = P2(61); /* 2^63 bytes: beyond PTRDIFF_MAX */
    st = dt_tensor_create(&C, &t, &d);
    expect_err("create_f32_2p61_beyond_ptrdiff_is_named", &C, st, DT_ERR_ARG, "too large", NULL);

    memset(&d, 0, sizeof d);
    d.shape[0] = INT64_MAX; d.dtype = DT_U8;
    st = dt_tensor_create(&CAP, &t, &d); /* fits the checks (INT64_MAX bytes), the allocator says no */
    expect_err("create_u8_int64_max_is_oom_not_crash", &CAP, st, DT_ERR_OOM, NULL, NULL);
    DT_TEST_CHECK("create_oom_leaves_no_bytes", CAP.bytes_in_use == 0 && t.data == NULL);

    big = mk(DT_F32, 2, SH(4, 4));
    st = dt_tensor_view(&C, &v, &big, 0, 2, SH(P2(62), 4));
    expect_err("view_overflowing_shape_is_named", &C, st, DT_ERR_ARG, "dt_tensor_view", "overflows");
    st = dt_tensor_view(&C, &v, &big, 0, 3, SH(P2(32), P2(32), P2(32)));
    expect_err("view_2p32_cubed_is_named", &C, st, DT_ERR_ARG, "dt_tensor_view", "overflows");
    st = dt_tensor_view(&C, &v, &big, INT64_MAX, 1, SH(1));
    expect_err("view_offset_int64_max_is_range", &C, st, DT_ERR_RANGE, "exceeds", NULL);
    st = dt_tensor_view(&C, &v, &big, -1, 1, SH(1));
    expect_err("view_negative_offset_is_range", &C, st, DT_ERR_RANGE, "offset -1", NULL);
    st = dt_tensor_view(&C, &v, &big, 15, 1, SH(INT64_MAX));
    expect_err("view_int64_max_elements_at_offset_is_range", &C, st, DT_ERR_RANGE, "exceeds", NULL);
    st = dt_tensor_reshape(&C, &v, &big, 2, SH(P2(32), P2(32)));
    expect_err("reshape_2p32_squared_is_named", &C, st, DT_ERR_SHAPE, "dt_tensor_reshape", "overflowing");
    st = dt_tensor_reshape(&C, &v, &big, 3, SH(P2(62), P2(62), 4));
    expect_err("reshape_overflowing_shape_is_named", &C, st, DT_ERR_SHAPE, "overflowing", NULL);
    st = dt_tensor_reshape(&C, &v, &big, 2, SH(-4, -4));
    expect_err("reshape_two_negative_dims_is_named", &C, st, DT_ERR_SHAPE, "negative", NULL);

    {   /* dt_params_add: the failed add leaves the set and the ctx's bytes as they were */
        dt_params ps;
        dt_param_desc pd;
        memset(&ps, 0, sizeof ps);
        memset(&pd, 0, sizeof pd);
        pd.name = "ok"; pd.shape[0] = 2;
        dt_params_add(&C, &ps, NULL, &pd);
        before = C.bytes_in_use;
        memset(&pd, 0, sizeof pd);
        pd.name = "huge"; pd.shape[0] = P2(62); pd.shape[1] = 4;
        st = dt_params_add(&C, &ps, NULL, &pd);
        expect_err("params_add_overflowing_shape_is_named", &C, st, DT_ERR_ARG, "too large", NULL);
        DT_TEST_CHECK("params_add_failure_leaves_set_and_bytes", ps.count == 1 && C.bytes_in_use == before);
        memset(&pd, 0, sizeof pd);
        pd.name = "huge_global"; pd.shape[0] = 2; pd.shape[1] = 2;
        pd.global_shape[0] = P2(62); pd.global_shape[1] = P2(62);
        st = dt_params_add(&C, &ps, NULL, &pd);
        expect_err("params_add_overflowing_global_shape_is_named", &C, st, DT_ERR_ARG, "global_shape", "overflows");
        DT_TEST_CHECK("params_add_global_failure_leaves_set_and_bytes", ps.count == 1 && C.bytes_in_use == before);
        dt_params_free(&C, &ps);
    }
    {   /* dt_tensor_init with an overflowing global_shape */
        dt_init_desc id;
        memset(&id, 0, sizeof id);
        id.kind = DT_INIT_NORMAL; id.std = 1; id.name = "g";
        id.global_shape[0] = P2(40); id.global_shape[1] = P2(40);
        st = dt_tensor_init(&C, &big, &id);
        expect_err("init_overflowing_global_shape_is_named", &C, st, DT_ERR_ARG, "global_shape", "overflows");
        id.global_shape[0] = P2(62); id.global_shape[1] = 4;
        st = dt_tensor_init(&C, &big, &id);
        expect_err("init_global_2p62_by_4_is_named", &C, st, DT_ERR_ARG, "overflows", NULL);
    }
    dt_tensor_free(&C, &big);

    {   /* dt_grow: need * elem beyond int64, and a need the allocator refuses */
        void *items = NULL;
        int64_t cap = 0;
        st = dt_grow(&C, &items, &cap, INT64_MAX / 8 + 1, 16, "things");
        expect_err("grow_need_times_elem_overflow_is_named", &C, st, DT_ERR_ARG, "things", "do not fit");
        DT_TEST_CHECK("grow_overflow_leaves_items", items == NULL && cap == 0);
        st = dt_grow(&CAP, &items, &cap, INT64_MAX, 1, "bytes"); /* fits ptrdiff: the allocator refuses */
        expect_err("grow_int64_max_bytes_is_named", &CAP, st, DT_ERR_OOM, "bytes", NULL);
        DT_TEST_CHECK("grow_int64_max_leaves_items", items == NULL && cap == 0);
        st = dt_grow(&C, &items, &cap, -1, 4, "neg");
        expect_err("grow_negative_need_is_named", &C, st, DT_ERR_ARG, "need = -1", NULL);
        st = dt_grow(&C, &items, &cap, 4, 0, "zero");
        expect_err("grow_zero_elem_is_named", &C, st, DT_ERR_ARG, "elem 0", NULL);
        st = dt_grow(&CAP, &items, &cap, 10, 8, "small");
        expect_ok("grow_small_works", &CAP, st);
        if (items) memset(items, 0x5a, 80);
        st = dt_grow(&CAP, &items, &cap, P2(40), 1, "big");
        expect_err("grow_refused_allocation_is_oom", &CAP, st, DT_ERR_OOM, "big", NULL);
        DT_TEST_CHECK("grow_oom_keeps_items", items != NULL && cap >= 10 && ((unsigned char *)items)[79] == 0x5a);
        dt_release(&CAP, items);
    }
    {   /* dt_grow's rule: the need and an eighth more (at least 8), the contents kept; no growth
           within the capacity */
        unsigned char *items = NULL, *was;
        int64_t cap = 0, i;
        int kept = 1;
        st = dt_grow(&C, (void **)&items, &cap, 3, 1, "few");
        dt_test_check_all("grow_small_need_takes_8", st == DT_OK && cap == 8, "cap %lld after a need of 3; expected 8",
                          (long long)cap);
        st = dt_grow(&C, (void **)&items, &cap, 1000, 1, "bytes");
        dt_test_check_all("grow_adds_an_eighth", st == DT_OK && cap == 1125, "cap %lld after a need of 1000; expected 1125",
                          (long long)cap);
        for (i = 0; items && i < cap; i++) items[i] = (unsigned char)(i * 7);
        was = items;
        st = dt_grow(&C, (void **)&items, &cap, 1125, 1, "bytes");
        DT_TEST_CHECK("grow_within_capacity_keeps_the_array", st == DT_OK && items == was && cap == 1125);
        st = dt_grow(&C, (void **)&items, &cap, 1126, 1, "bytes");
        for (i = 0; items && i < 1125; i++) kept &= items[i] == (unsigned char)(i * 7);
        dt_test_check_all("grow_keeps_the_contents", st == DT_OK && kept && cap == 1126 + 1126 / 8,
                          "cap %lld (expected %d), contents %s", (long long)cap, 1126 + 1126 / 8, kept ? "kept" : "changed");
        dt_release(&C, items);
    }
}

static void test_safetensors_overflow(void) {
    static const struct { const char *shape, *dtype, *why; } bad[] = {
        {"[1125899906842624,4000000000000000]", "F32", "2p50_by_4e15"},
        {"[4000000000000000,4000000000000000]", "F32", "4e15_squared"},
        {"[65536,65536,65536,65536]", "U8", "2p64_elements"},
        {"[2305843009213693952]", "I64", "2p61_i64_bytes"},
        {"[1152921504606846976,8]", "U8", "2p60_by_8_bytes"},
        {"[4000000000000001]", "U8", "dim_above_4e15"},
        {"[1e300]", "F32", "dim_1e300"},
        {"[-1]", "F32", "negative_dim"},
        {"[1.5]", "F32", "fractional_dim"},
        {"[1,1,1,1,1,1,1,1,1]", "F32", "nine_dims"},
    };
    char header[512], path[512], name[128];
    size_t i;
    dt_st_file f;
    dt_status st;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(header, sizeof header, "{\"x\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[0,0]}}", bad[i].dtype,
                 bad[i].shape);
        st = dt_safetensors_parse(&C, &f, header, strlen(header), 0, "mem");
        snprintf(name, sizeof name, "st_parse_%s_is_format", bad[i].why);
        expect_err(name, &C, st, DT_ERR_FORMAT, "\"x\"", NULL);
        if (!st) dt_safetensors_close(&C, &f);
        tmp_path(path, sizeof path, "overflow.safetensors");
        write_st(path, header, NULL, 0);
        st = dt_safetensors_open(&C, &f, path);
        snprintf(name, sizeof name, "st_open_%s_is_format", bad[i].why);
        expect_err(name, &C, st, DT_ERR_FORMAT, "\"x\"", NULL);
        if (!st) dt_safetensors_close(&C, &f);
    }
    DT_TEST_CHECK("st_failed_opens_leave_no_bytes", C.bytes_in_use == 0 || C.bytes_in_use == C.scratch_floats * 4);

    {   /* the header length */
        unsigned char b8[8];
        uint64_t len = 777;
        int k;
#define SETLEN(v) do { uint64_t v_ = (v); for (k = 0; k < 8; k++) b8[k] = (unsigned char)(v_ >> (8 * k)); } while (0)
        SETLEN(1000);
        expect_err("st_header_len_beyond_file_is_format", &C, dt_safetensors_header_len(&C, &len, b8, 100, "f.st"),
                   DT_ERR_FORMAT, "f.st", "1000-byte header");
        SETLEN((uint64_t)200 << 20);
        expect_err("st_header_len_beyond_100mib_is_format", &C,
                   dt_safetensors_header_len(&C, &len, b8, (uint64_t)1 << 40, "f.st"), DT_ERR_FORMAT, "limit", NULL);
        SETLEN(DT_SAFETENSORS_MAX_HEADER + 1);
        expect_err("st_header_len_100mib_plus_one_is_format", &C,
                   dt_safetensors_header_len(&C, &len, b8, (uint64_t)1 << 40, NULL), DT_ERR_FORMAT, "(memory)", NULL);
        SETLEN(UINT64_MAX);
        expect_err("st_header_len_uint64_max_is_format", &C,
                   dt_safetensors_header_len(&C, &len, b8, UINT64_MAX, "f.st"), DT_ERR_FORMAT, NULL, NULL);
        SETLEN(1);
        expect_err("st_header_len_one_is_format", &C, dt_safetensors_header_len(&C, &len, b8, 100, "f.st"),
                   DT_ERR_FORMAT, NULL, NULL);
        SETLEN(16);
        expect_err("st_file_shorter_than_8_is_format", &C, dt_safetensors_header_len(&C, &len, b8, 7, "f.st"),
                   DT_ERR_FORMAT, "7 bytes", NULL);
        DT_TEST_CHECK("st_header_len_failures_write_len_0", len == 0); /* outputs are written on every path */
        st = dt_safetensors_header_len(&C, &len, b8, 24, "f.st");
        DT_TEST_CHECK("st_header_len_exact_fit_ok", st == DT_OK && len == 16);
        SETLEN(DT_SAFETENSORS_MAX_HEADER);
        st = dt_safetensors_header_len(&C, &len, b8, (uint64_t)1 << 40, "f.st");
        DT_TEST_CHECK("st_header_len_exactly_100mib_ok", st == DT_OK && len == DT_SAFETENSORS_MAX_HEADER);
#undef SETLEN
    }
    {   /* on disk: a file that claims a 2^40-byte header, and one that claims 1 MiB but has 60 bytes */
        unsigned char raw[68];
        FILE *fp;
        memset(raw, ' ', sizeof raw);
        memset(raw, 0, 8);
        raw[5] = 1; /* 2^40 */
        tmp_path(path, sizeof path, "hugeheader.safetensors");
        fp = fopen(path, "wb");
        fwrite(raw, 1, sizeof raw, fp);
        fclose(fp);
        expect_err("st_open_2p40_header_is_format", &C, dt_safetensors_open(&C, &f, path), DT_ERR_FORMAT,
                   "hugeheader", NULL);
        memset(raw, 0, 8);
        raw[2] = 0x10; /* 2^20 */
        fp = fopen(path, "wb");
        fwrite(raw, 1, sizeof raw, fp);
        fclose(fp);
        expect_err("st_open_header_beyond_file_is_format", &C, dt_safetensors_open(&C, &f, path), DT_ERR_FORMAT,
                   "1048576-byte header", NULL);
    }
}

/* ---------------------------------------------------------------- 2. empty tensors */

static void test_empty_create(void) {
    dt_tensor t;
    dt_tensor_desc d;
    dt_status st;
    memset(&d, 0, sizeof d);
    d.shape[0] = 0; d.shape[1] = 64; d.ndim = 2;
    st = dt_tensor_create(&C, &t, &d);
    DT_TEST_CHECK("empty_0x64_creates", st == DT_OK && t.ndim == 2 && t.shape[0] == 0 && t.shape[1] == 64 &&
                                            t.numel == 0 && t.data != NULL && t.owns == 1 && dt_tensor_bytes(&t) == 0);
    dt_tensor_free(&C, &t);
    memset(&d, 0, sizeof d);
    d.ndim = 1;
    st = dt_tensor_create(&C, &t, &d);
    DT_TEST_CHECK("empty_1d_creates", st == DT_OK && t.ndim == 1 && t.shape[0] == 0 && t.numel == 0 && t.data != NULL);
    dt_tensor_free(&C, &t);
    memset(&d, 0, sizeof d);
    d.shape[0] = 64; d.ndim = 2; /* [64, 0] */
    st = dt_tensor_create(&C, &t, &d);
    DT_TEST_CHECK("empty_64x0_creates", st == DT_OK && t.ndim == 2 && t.shape[0] == 64 && t.shape[1] == 0 && t.numel == 0);
    dt_tensor_free(&C, &t);

    memset(&d, 0, sizeof d);
    d.shape[0] = 2; d.ndim = 9;
    expect_err("create_ndim_9_is_named", &C, dt_tensor_create(&C, &t, &d), DT_ERR_ARG, "ndim = 9", NULL);
    DT_TEST_CHECK("create_ndim_9_leaves_tensor_empty", t.data == NULL);
    d.ndim = -1;
    expect_err("create_ndim_minus_1_is_named", &C, dt_tensor_create(&C, &t, &d), DT_ERR_ARG, "ndim = -1", NULL);
    memset(&d, 0, sizeof d);
    d.shape[0] = 0; d.shape[1] = 64; d.shape[2] = 5; d.ndim = 2;
    expect_err("create_entry_after_ndim_is_named", &C, dt_tensor_create(&C, &t, &d), DT_ERR_SHAPE, "desc.shape[2] = 5",
               "comes after the 2 dims");
    memset(&d, 0, sizeof d);
    d.shape[7] = 1; d.ndim = 1;
    expect_err("create_last_entry_after_ndim_is_named", &C, dt_tensor_create(&C, &t, &d), DT_ERR_SHAPE,
               "desc.shape[7] = 1", NULL);
    memset(&d, 0, sizeof d);
    d.shape[0] = 0; d.shape[1] = -3; d.ndim = 2;
    expect_err("create_negative_with_ndim_is_named", &C, dt_tensor_create(&C, &t, &d), DT_ERR_SHAPE, "desc.shape[1] = -3",
               NULL);

    /* the old rule: ndim 0 counts the leading non-zero dims */
    memset(&d, 0, sizeof d);
    d.shape[0] = 2; d.shape[1] = 3;
    st = dt_tensor_create(&C, &t, &d);
    DT_TEST_CHECK("ndim0_counts_leading_dims", st == DT_OK && t.ndim == 2 && t.numel == 6);
    dt_tensor_free(&C, &t);
    memset(&d, 0, sizeof d);
    st = dt_tensor_create(&C, &t, &d);
    DT_TEST_CHECK("ndim0_all_zero_is_scalar", st == DT_OK && t.ndim == 0 && t.numel == 1 && dt_tensor_bytes(&t) == 4);
    dt_tensor_free(&C, &t);
    memset(&d, 0, sizeof d);
    d.shape[0] = 5; d.shape[2] = 3;
    expect_err("ndim0_gap_is_named", &C, dt_tensor_create(&C, &t, &d), DT_ERR_SHAPE, "comes after the 1 dims", NULL);
    memset(&d, 0, sizeof d);
    d.shape[0] = 1; d.shape[1] = 1; d.shape[2] = 1; d.shape[3] = 1; d.shape[4] = 1; d.shape[5] = 1; d.shape[6] = 1; d.shape[7] = 2;
    st = dt_tensor_create(&C, &t, &d);
    DT_TEST_CHECK("ndim0_eight_dims", st == DT_OK && t.ndim == 8 && t.numel == 2);
    dt_tensor_free(&C, &t);
}

/* Every op on numel-0 tensors: OK, and the result the empty case defines. */
static void test_empty_ops(void) {
    dt_status st;
    {   /* matmul: M = 0, N = 0, K = 0 */
        dt_tensor a = mk(DT_F32, 2, SH(0, 5)), b = mk(DT_F32, 2, SH(5, 3)), o = mk(DT_F32, 2, SH(0, 3));
        dt_tensor da = mk(DT_F32, 2, SH(0, 5)), db = mk(DT_F32, 2, SH(5, 3));
        rnd(&b, "b");
        expect_ok("matmul_m0_ok", &C, dt_matmul_fwd(&C, &o, &a, &b, 0, 0, 1, 0));
        dt_tensor_fill(&C, &db, 0.5);
        expect_ok("matmul_bwd_m0_ok", &C, dt_matmul_bwd(&C, &da, &db, &o, &a, &b, 0, 0, 1));
        all_eq("matmul_bwd_m0_db_unchanged", &db, 0.5f);
        dt_tensor_free(&C, &a); dt_tensor_free(&C, &b); dt_tensor_free(&C, &o); dt_tensor_free(&C, &da); dt_tensor_free(&C, &db);

        a = mk(DT_F32, 2, SH(4, 5)); b = mk(DT_F32, 2, SH(5, 0)); o = mk(DT_F32, 2, SH(4, 0));
        da = mk(DT_F32, 2, SH(4, 5)); db = mk(DT_F32, 2, SH(5, 0));
        rnd(&a, "a");
        expect_ok("matmul_n0_ok", &C, dt_matmul_fwd(&C, &o, &a, &b, 0, 0, 1, 0));
        dt_tensor_fill(&C, &da, 0.5);
        expect_ok("matmul_bwd_n0_ok", &C, dt_matmul_bwd(&C, &da, &db, &o, &a, &b, 0, 0, 1));
        all_eq("matmul_bwd_n0_da_unchanged", &da, 0.5f);
        dt_tensor_free(&C, &a); dt_tensor_free(&C, &b); dt_tensor_free(&C, &o); dt_tensor_free(&C, &da); dt_tensor_free(&C, &db);
    }
    {   /* K = 0: out = beta * out, for each transpose */
        int ta, tb;
        char name[96];
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++) {
                dt_tensor a = ta ? mk(DT_F32, 2, SH(0, 4)) : mk(DT_F32, 2, SH(4, 0));
                dt_tensor b = tb ? mk(DT_F32, 2, SH(3, 0)) : mk(DT_F32, 2, SH(0, 3));
                dt_tensor o = mk(DT_F32, 2, SH(4, 3)), da, db;
                dt_tensor_fill(&C, &o, 2.0);
                st = dt_matmul_fwd(&C, &o, &a, &b, ta, tb, 1.0f, 0.5f);
                snprintf(name, sizeof name, "matmul_k0_is_beta_times_out_ta%d_tb%d", ta, tb);
                if (expect_ok(name, &C, st)) {
                    snprintf(name, sizeof name, "matmul_k0_value_ta%d_tb%d", ta, tb);
                    all_eq(name, &o, 1.0f);
                }
                F(&o)[0] = NAN;
                st = dt_matmul_fwd(&C, &o, &a, &b, ta, tb, 1.0f, 0.0f);
                snprintf(name, sizeof name, "matmul_k0_beta0_zeroes_out_ta%d_tb%d", ta, tb);
                if (st) expect_ok(name, &C, st); else all_eq(name, &o, 0.0f);
                da = ta ? mk(DT_F32, 2, SH(0, 4)) : mk(DT_F32, 2, SH(4, 0));
                db = tb ? mk(DT_F32, 2, SH(3, 0)) : mk(DT_F32, 2, SH(0, 3));
                rnd(&o, "dout");
                snprintf(name, sizeof name, "matmul_bwd_k0_ok_ta%d_tb%d", ta, tb);
                expect_ok(name, &C, dt_matmul_bwd(&C, &da, &db, &o, &a, &b, ta, tb, 1));
                dt_tensor_free(&C, &a); dt_tensor_free(&C, &b); dt_tensor_free(&C, &o);
                dt_tensor_free(&C, &da); dt_tensor_free(&C, &db);
            }
    }
    {   /* the portable GEMM, same K = 0 rule */
        float A[1] = {0}, B[1] = {0}, Cm[6] = {2, 2, 2, 2, 2, 2};
        int i, ok = 1;
        st = dt_gemm_portable(&C, 0, 0, 2, 3, 0, 1.0f, A, 1, B, 3, 0.5f, Cm, 3);
        for (i = 0; i < 6; i++) ok &= Cm[i] == 1.0f;
        DT_TEST_CHECK("gemm_portable_k0_is_beta_times_c", st == DT_OK && ok);
        Cm[0] = NAN;
        st = dt_gemm_portable(&C, 0, 0, 2, 3, 0, 1.0f, A, 1, B, 3, 0.0f, Cm, 3);
        DT_TEST_CHECK("gemm_portable_k0_beta0_zeroes_c", st == DT_OK && Cm[0] == 0.0f && Cm[5] == 0.0f);
    }
    {   /* the portable GEMM's leading dimensions: at least the row length of the matrix as stored
           (and 1), rows x ld inside int64; M 2, N 3, K 4 into buffers far larger than any of it,
           so that a missing check shows as DT_OK, not as a crash */
        static float A[64], B[64], Cm[64];
        const int64_t big = INT64_MAX / 2;
        expect_ok("gemm_portable_exact_lds_ok", &C, dt_gemm_portable(&C, 0, 0, 2, 3, 4, 1, A, 4, B, 3, 0, Cm, 3));
        expect_ok("gemm_portable_transposed_exact_lds_ok", &C,
                  dt_gemm_portable(&C, 1, 1, 2, 3, 4, 1, A, 2, B, 4, 0, Cm, 3));
        expect_err("gemm_portable_lda_below_k_is_named", &C, dt_gemm_portable(&C, 0, 0, 2, 3, 4, 1, A, 3, B, 3, 0, Cm, 3),
                   DT_ERR_ARG, "lda = 3, expected >= 4", "K = 4");
        expect_err("gemm_portable_lda_below_m_when_transposed_is_named", &C,
                   dt_gemm_portable(&C, 1, 0, 2, 3, 4, 1, A, 1, B, 3, 0, Cm, 3), DT_ERR_ARG, "lda = 1, expected >= 2",
                   "M = 2");
        expect_err("gemm_portable_ldb_below_n_is_named", &C, dt_gemm_portable(&C, 0, 0, 2, 3, 4, 1, A, 4, B, 2, 0, Cm, 3),
                   DT_ERR_ARG, "ldb = 2, expected >= 3", "N = 3");
        expect_err("gemm_portable_ldb_below_k_when_transposed_is_named", &C,
                   dt_gemm_portable(&C, 0, 1, 2, 3, 4, 1, A, 4, B, 3, 0, Cm, 3), DT_ERR_ARG, "ldb = 3, expected >= 4",
                   "K = 4");
        expect_err("gemm_portable_ldc_below_n_is_named", &C, dt_gemm_portable(&C, 0, 0, 2, 3, 4, 1, A, 4, B, 3, 0, Cm, 2),
                   DT_ERR_ARG, "ldc = 2, expected >= 3", "N = 3");
        expect_err("gemm_portable_negative_lda_is_named", &C,
                   dt_gemm_portable(&C, 0, 0, 2, 3, 4, 1, A, -4, B, 3, 0, Cm, 3), DT_ERR_ARG, "lda = -4", NULL);
        expect_err("gemm_portable_zero_ldc_is_named", &C, dt_gemm_portable(&C, 0, 0, 2, 3, 4, 1, A, 4, B, 3, 0, Cm, 0),
                   DT_ERR_ARG, "ldc = 0, expected >= 3", NULL);
        /* an empty row still needs ld >= 1, as BLAS has it */
        expect_err("gemm_portable_zero_lda_at_k0_is_named", &C,
                   dt_gemm_portable(&C, 0, 0, 2, 3, 0, 1, A, 0, B, 3, 0, Cm, 3), DT_ERR_ARG, "lda = 0, expected >= 1",
                   NULL);
        expect_err("gemm_portable_ld_times_rows_overflow_is_named", &C,
                   dt_gemm_portable(&C, 0, 0, 4, 3, 4, 1, A, big, B, 3, 0, Cm, 3), DT_ERR_ARG, "overflows int64",
                   "M = 4 rows of A");
        expect_err("gemm_portable_negative_k_is_named", &C, dt_gemm_portable(&C, 0, 0, 2, 3, -1, 1, A, 4, B, 3, 0, Cm, 3),
                   DT_ERR_ARG, "K = -1, expected >= 0", NULL);
        expect_err("gemm_portable_tb_2_is_named", &C, dt_gemm_portable(&C, 0, 2, 2, 3, 4, 1, A, 4, B, 3, 0, Cm, 3),
                   DT_ERR_ARG, "tb = 2, expected 0 or 1", NULL);
        expect_err("gemm_portable_null_b_is_named", &C, dt_gemm_portable(&C, 0, 0, 2, 3, 4, 1, A, 4, NULL, 3, 0, Cm, 3),
                   DT_ERR_ARG, "B is NULL", NULL);
    }
    {   /* batched with B = 0 */
        dt_tensor a = mk(DT_F32, 3, SH(0, 2, 3)), b = mk(DT_F32, 3, SH(0, 3, 4)), o = mk(DT_F32, 3, SH(0, 2, 4));
        dt_tensor da = mk(DT_F32, 3, SH(0, 2, 3)), db = mk(DT_F32, 3, SH(0, 3, 4));
        expect_ok("matmul_batch0_ok", &C, dt_matmul_fwd(&C, &o, &a, &b, 0, 0, 1, 0));
        expect_ok("matmul_bwd_batch0_ok", &C, dt_matmul_bwd(&C, &da, &db, &o, &a, &b, 0, 0, 1));
        dt_tensor_free(&C, &a); dt_tensor_free(&C, &b); dt_tensor_free(&C, &o); dt_tensor_free(&C, &da); dt_tensor_free(&C, &db);
    }
    {   /* linear with 0 rows, and with 0 in features (out = bias) */
        dt_tensor x = mk(DT_F32, 2, SH(0, 3)), w = mk(DT_F32, 2, SH(2, 3)), bias = mk(DT_F32, 1, SH(2));
        dt_tensor o = mk(DT_F32, 2, SH(0, 2)), dx = mk(DT_F32, 2, SH(0, 3)), dw = mk(DT_F32, 2, SH(2, 3));
        dt_tensor dbias = mk(DT_F32, 1, SH(2));
        rnd(&w, "w"); rnd(&bias, "bias");
        expect_ok("linear_0_rows_ok", &C, dt_linear_fwd(&C, &o, &x, &w, &bias));
        dt_tensor_fill(&C, &dw, 0.25); dt_tensor_fill(&C, &dbias, 0.25);
        expect_ok("linear_bwd_0_rows_ok", &C, dt_linear_bwd(&C, &dx, &dw, &dbias, &o, &x, &w));
        all_eq("linear_bwd_0_rows_dw_unchanged", &dw, 0.25f);
        all_eq("linear_bwd_0_rows_dbias_unchanged", &dbias, 0.25f);
        expect_ok("bias_add_0_rows_ok", &C, dt_bias_add_fwd(&C, &o, &bias));
        expect_ok("bias_add_bwd_0_rows_ok", &C, dt_bias_add_bwd(&C, &dbias, &o));
        all_eq("bias_add_bwd_0_rows_unchanged", &dbias, 0.25f);
        dt_tensor_free(&C, &x); dt_tensor_free(&C, &w); dt_tensor_free(&C, &o); dt_tensor_free(&C, &dx);
        dt_tensor_free(&C, &dw);
        x = mk(DT_F32, 2, SH(3, 0)); w = mk(DT_F32, 2, SH(2, 0)); o = mk(DT_F32, 2, SH(3, 2));
        dt_tensor_fill(&C, &o, 9.0);
        st = dt_linear_fwd(&C, &o, &x, &w, &bias);
        if (expect_ok("linear_0_in_features_ok", &C, st)) {
            float want[6];
            int i;
            for (i = 0; i < 6; i++) want[i] = F(&bias)[i % 2];
            dt_test_equal_bytes("linear_0_in_features_is_bias", o.data, want, sizeof want);
        }
        dx = mk(DT_F32, 2, SH(3, 0)); dw = mk(DT_F32, 2, SH(2, 0));
        dt_tensor_fill(&C, &o, 1.0); dt_tensor_fill(&C, &dbias, 0.0);
        expect_ok("linear_bwd_0_in_features_ok", &C, dt_linear_bwd(&C, &dx, &dw, &dbias, &o, &x, &w));
        all_eq("linear_bwd_0_in_features_dbias_is_row_count", &dbias, 3.0f);
        dt_tensor_free(&C, &x); dt_tensor_free(&C, &w); dt_tensor_free(&C, &o); dt_tensor_free(&C, &dx);
        dt_tensor_free(&C, &dw); dt_tensor_free(&C, &bias); dt_tensor_free(&C, &dbias);
    }
    {   /* relu / gelu, add / scale / axpy / sum / sumsq on [0] and [0, 64] */
        dt_tensor x = mk(DT_F32, 2, SH(0, 64)), o = mk(DT_F32, 2, SH(0, 64)), dx = mk(DT_F32, 1, SH(0));
        double s = 7;
        expect_ok("relu_empty_ok", &C, dt_relu_fwd(&C, &o, &x));
        expect_ok("relu_bwd_empty_ok", &C, dt_relu_bwd(&C, &dx, &o, &x));
        expect_ok("gelu_empty_ok", &C, dt_gelu_fwd(&C, &o, &x));
        expect_ok("gelu_bwd_empty_ok", &C, dt_gelu_bwd(&C, &dx, &o, &x));
        expect_ok("add_empty_ok", &C, dt_add(&C, &o, &x, &dx));
        expect_ok("scale_empty_ok", &C, dt_scale(&C, &o, 3));
        expect_ok("axpy_empty_ok", &C, dt_axpy(&C, &o, 3, &x));
        st = dt_sum(&C, &s, &x);
        DT_TEST_CHECK("sum_empty_is_zero", st == DT_OK && s == 0.0);
        s = 7;
        st = dt_sumsq(&C, &s, &x);
        DT_TEST_CHECK("sumsq_empty_is_zero", st == DT_OK && s == 0.0);
        dt_tensor_free(&C, &x); dt_tensor_free(&C, &o); dt_tensor_free(&C, &dx);
    }
    {   /* layernorm with 0 rows, and with C = 0 */
        dt_tensor x = mk(DT_F32, 2, SH(0, 4)), o = mk(DT_F32, 2, SH(0, 4)), w = mk(DT_F32, 1, SH(4)), b = mk(DT_F32, 1, SH(4));
        dt_tensor mean = mk(DT_F32, 1, SH(0)), rstd = mk(DT_F32, 1, SH(0)), dx = mk(DT_F32, 2, SH(0, 4));
        dt_tensor dw = mk(DT_F32, 1, SH(4)), db = mk(DT_F32, 1, SH(4));
        rnd(&w, "w"); rnd(&b, "b");
        expect_ok("layernorm_0_rows_ok", &C, dt_layernorm_fwd(&C, &o, &mean, &rstd, &x, &w, &b, 1e-5f));
        dt_tensor_fill(&C, &dw, 0.5); dt_tensor_fill(&C, &db, 0.5);
        expect_ok("layernorm_bwd_0_rows_ok", &C, dt_layernorm_bwd(&C, &dx, &dw, &db, &o, &x, &w, &mean, &rstd));
        DT_TEST_CHECK("layernorm_bwd_0_rows_leaves_dw_db", F(&dw)[3] == 0.5f && F(&db)[0] == 0.5f);
        dt_tensor_free(&C, &x); dt_tensor_free(&C, &o); dt_tensor_free(&C, &w); dt_tensor_free(&C, &b);
        dt_tensor_free(&C, &mean); dt_tensor_free(&C, &rstd); dt_tensor_free(&C, &dx); dt_tensor_free(&C, &dw);
        dt_tensor_free(&C, &db);
        x = mk(DT_F32, 2, SH(3, 0)); o = mk(DT_F32, 2, SH(3, 0)); w = mk(DT_F32, 1, SH(0));
        mean = mk(DT_F32, 1, SH(3)); rstd = mk(DT_F32, 1, SH(3)); dx = mk(DT_F32, 2, SH(3, 0));
        dt_tensor_fill(&C, &mean, 9);
        st = dt_layernorm_fwd(&C, &o, &mean, &rstd, &x, &w, NULL, 0.25f);
        DT_TEST_CHECK("layernorm_c0_mean_0_rstd_inv_sqrt_eps", st == DT_OK && F(&mean)[2] == 0.0f && F(&rstd)[1] == 2.0f);
        expect_ok("layernorm_bwd_c0_ok", &C, dt_layernorm_bwd(&C, &dx, NULL, NULL, &o, &x, &w, &mean, &rstd));
        dt_tensor_free(&C, &x); dt_tensor_free(&C, &o); dt_tensor_free(&C, &w);
        dt_tensor_free(&C, &mean); dt_tensor_free(&C, &rstd); dt_tensor_free(&C, &dx);
    }
    {   /* softmax + cross entropy, BCE with 0 rows */
        dt_tensor z = mk(DT_F32, 2, SH(0, 10)), p = mk(DT_F32, 2, SH(0, 10)), t = mk(DT_I32, 1, SH(0));
        dt_tensor y = mk(DT_F32, 2, SH(0, 10)), dz = mk(DT_F32, 2, SH(0, 10));
        float loss = 7;
        int64_t nv = 7;
        st = dt_softmax_xent_fwd(&C, &loss, &nv, &p, &z, &t, -100);
        DT_TEST_CHECK("softmax_xent_0_rows_loss_0_nvalid_0", st == DT_OK && loss == 0.0f && nv == 0);
        expect_ok("softmax_xent_bwd_0_rows_ok", &C, dt_softmax_xent_bwd(&C, &dz, &p, &t, -100, 1.0f));
        loss = 7;
        st = dt_bce_logits_fwd(&C, &loss, &z, &y);
        DT_TEST_CHECK("bce_empty_loss_0", st == DT_OK && loss == 0.0f);
        expect_ok("bce_bwd_empty_ok", &C, dt_bce_logits_bwd(&C, &dz, &z, &y, 1.0f));
        dt_tensor_free(&C, &z); dt_tensor_free(&C, &p); dt_tensor_free(&C, &t); dt_tensor_free(&C, &y);
        dt_tensor_free(&C, &dz);
        /* V = 0 with every target ignored */
        z = mk(DT_F32, 2, SH(2, 0)); p = mk(DT_F32, 2, SH(2, 0)); t = mk(DT_I32, 1, SH(2));
        dt_tensor_fill(&C, &t, -100);
        loss = 7; nv = 7;
        st = dt_softmax_xent_fwd(&C, &loss, &nv, &p, &z, &t, -100);
        DT_TEST_CHECK("softmax_xent_v0_all_ignored_loss_0", st == DT_OK && loss == 0.0f && nv == 0);
        dt_tensor_free(&C, &z); dt_tensor_free(&C, &p); dt_tensor_free(&C, &t);
    }
    {   /* embedding with 0 ids (i32 and i64), and an empty table */
        dt_tensor tab = mk(DT_F32, 2, SH(5, 3)), dtab = mk(DT_F32, 2, SH(5, 3)), o = mk(DT_F32, 2, SH(0, 3));
        dt_tensor ids = mk(DT_I32, 1, SH(0)), ids64 = mk(DT_I64, 2, SH(2, 0));
        dt_tensor_fill(&C, &dtab, 0.5);
        expect_ok("embedding_0_ids_ok", &C, dt_embedding_fwd(&C, &o, &tab, &ids));
        expect_ok("embedding_bwd_0_ids_ok", &C, dt_embedding_bwd(&C, &dtab, &o, &ids));
        expect_ok("embedding_0_ids_i64_2d_ok", &C, dt_embedding_fwd(&C, &o, &tab, &ids64));
        all_eq("embedding_bwd_0_ids_leaves_dtable", &dtab, 0.5f);
        dt_tensor_free(&C, &tab); dt_tensor_free(&C, &dtab);
        tab = mk(DT_F32, 2, SH(0, 3));
        expect_ok("embedding_empty_table_0_ids_ok", &C, dt_embedding_fwd(&C, &o, &tab, &ids));
        dt_tensor_free(&C, &tab); dt_tensor_free(&C, &o); dt_tensor_free(&C, &ids); dt_tensor_free(&C, &ids64);
    }
    {   /* attention with B = 0 and with T = 0 */
        dt_tensor qkv = mk(DT_F32, 3, SH(0, 4, 12)), o = mk(DT_F32, 3, SH(0, 4, 4)), att = mk(DT_F32, 4, SH(0, 2, 4, 4));
        dt_tensor dq = mk(DT_F32, 3, SH(0, 4, 12));
        expect_ok("attention_b0_ok", &C, dt_attention_fwd(&C, &o, &att, &qkv, 2));
        expect_ok("attention_bwd_b0_ok", &C, dt_attention_bwd(&C, &dq, &o, &qkv, &att, 2));
        dt_tensor_free(&C, &qkv); dt_tensor_free(&C, &o); dt_tensor_free(&C, &att); dt_tensor_free(&C, &dq);
        qkv = mk(DT_F32, 3, SH(2, 0, 12)); o = mk(DT_F32, 3, SH(2, 0, 4)); att = mk(DT_F32, 4, SH(2, 2, 0, 0));
        dq = mk(DT_F32, 3, SH(2, 0, 12));
        expect_ok("attention_t0_ok", &C, dt_attention_fwd(&C, &o, &att, &qkv, 2));
        expect_ok("attention_bwd_t0_ok", &C, dt_attention_bwd(&C, &dq, &o, &qkv, &att, 2));
        dt_tensor_free(&C, &qkv); dt_tensor_free(&C, &o); dt_tensor_free(&C, &att); dt_tensor_free(&C, &dq);
    }
    {   /* dot interaction with B = 0, and with F = 0 (out = dense) */
        dt_tensor dense = mk(DT_F32, 2, SH(0, 4)), emb = mk(DT_F32, 3, SH(0, 3, 4)), o = mk(DT_F32, 2, SH(0, 10));
        dt_tensor dd = mk(DT_F32, 2, SH(0, 4)), de = mk(DT_F32, 3, SH(0, 3, 4));
        expect_ok("dot_interaction_b0_ok", &C, dt_dot_interaction_fwd(&C, &o, &dense, &emb));
        expect_ok("dot_interaction_bwd_b0_ok", &C, dt_dot_interaction_bwd(&C, &dd, &de, &o, &dense, &emb));
        dt_tensor_free(&C, &dense); dt_tensor_free(&C, &emb); dt_tensor_free(&C, &o); dt_tensor_free(&C, &dd);
        dt_tensor_free(&C, &de);
        dense = mk(DT_F32, 2, SH(2, 4)); emb = mk(DT_F32, 3, SH(2, 0, 4)); o = mk(DT_F32, 2, SH(2, 4));
        dd = mk(DT_F32, 2, SH(2, 4)); de = mk(DT_F32, 3, SH(2, 0, 4));
        rnd(&dense, "dense");
        st = dt_dot_interaction_fwd(&C, &o, &dense, &emb);
        if (expect_ok("dot_interaction_f0_ok", &C, st))
            dt_test_equal_bytes("dot_interaction_f0_is_dense", o.data, dense.data, 32);
        st = dt_dot_interaction_bwd(&C, &dd, &de, &o, &dense, &emb);
        if (expect_ok("dot_interaction_bwd_f0_ok", &C, st))
            dt_test_equal_bytes("dot_interaction_bwd_f0_ddense_is_dout", dd.data, o.data, 32);
        dt_tensor_free(&C, &dense); dt_tensor_free(&C, &emb); dt_tensor_free(&C, &o); dt_tensor_free(&C, &dd);
        dt_tensor_free(&C, &de);
    }
    {   /* concat / split with 0 rows, and with a 0-wide part */
        dt_tensor p0 = mk(DT_F32, 2, SH(0, 2)), p1 = mk(DT_F32, 2, SH(0, 3)), w = mk(DT_F32, 2, SH(0, 5));
        const dt_tensor *ins[2];
        dt_tensor *outs[2];
        ins[0] = &p0; ins[1] = &p1; outs[0] = &p0; outs[1] = &p1;
        expect_ok("concat_0_rows_ok", &C, dt_concat_fwd(&C, &w, ins, 2));
        expect_ok("concat_bwd_0_rows_ok", &C, dt_concat_bwd(&C, outs, 2, &w));
        expect_ok("split_0_rows_ok", &C, dt_split_fwd(&C, outs, 2, &w));
        expect_ok("split_bwd_0_rows_ok", &C, dt_split_bwd(&C, &w, ins, 2));
        dt_tensor_free(&C, &p0); dt_tensor_free(&C, &p1); dt_tensor_free(&C, &w);
        p0 = mk(DT_F32, 2, SH(2, 0)); p1 = mk(DT_F32, 2, SH(2, 3)); w = mk(DT_F32, 2, SH(2, 3));
        rnd(&p1, "p1");
        st = dt_concat_fwd(&C, &w, ins, 2);
        if (expect_ok("concat_zero_width_part_ok", &C, st))
            dt_test_equal_bytes("concat_zero_width_part_values", w.data, p1.data, 24);
        dt_tensor_free(&C, &p0); dt_tensor_free(&C, &p1); dt_tensor_free(&C, &w);
    }
    {   /* copy / fill / cast / view / reshape / create_like of an empty tensor */
        dt_tensor e = mk(DT_F32, 2, SH(0, 64)), e2 = mk(DT_F32, 2, SH(64, 0)), ei = mk(DT_I32, 2, SH(0, 64)), v, l;
        expect_ok("copy_empty_ok", &C, dt_tensor_copy(&C, &e, &e2));
        expect_ok("fill_empty_ok", &C, dt_tensor_fill(&C, &e, 1.0));
        expect_ok("fill_empty_i32_ok", &C, dt_tensor_fill(&C, &ei, 1.0));
        expect_ok("cast_empty_ok", &C, dt_tensor_cast(&C, &ei, &e));
        st = dt_tensor_view(&C, &v, &e, 0, 2, SH(0, 64));
        DT_TEST_CHECK("view_empty_ok", st == DT_OK && v.numel == 0 && v.ndim == 2 && v.shape[1] == 64 && !v.owns);
        st = dt_tensor_reshape(&C, &v, &e, 3, SH(8, 0, 8));
        DT_TEST_CHECK("reshape_empty_ok", st == DT_OK && v.numel == 0 && v.ndim == 3 && v.shape[2] == 8);
        expect_err("reshape_empty_to_1_is_named", &C, dt_tensor_reshape(&C, &v, &e, 1, SH(1)), DT_ERR_SHAPE,
                   "1 elements, t has 0", NULL);
        expect_err("view_scalar_of_empty_is_range", &C, dt_tensor_view(&C, &v, &e, 0, 0, NULL), DT_ERR_RANGE, NULL, NULL);
        st = dt_tensor_create_like(&C, &l, &e, DT_DTYPE_DEFAULT, DT_DEVICE_DEFAULT);
        DT_TEST_CHECK("create_like_empty_keeps_shape", st == DT_OK && dt_tensor_same_shape(&l, &e) && l.numel == 0 &&
                                                           l.data != NULL);
        dt_tensor_free(&C, &l);
        {   /* init of an empty tensor (every kind) */
            dt_init_desc id;
            memset(&id, 0, sizeof id);
            id.kind = DT_INIT_SCALED_NORMAL; id.name = "e";
            expect_ok("init_empty_scaled_normal_ok", &C, dt_tensor_init(&C, &e2, &id));
        }
        dt_tensor_free(&C, &e); dt_tensor_free(&C, &e2); dt_tensor_free(&C, &ei);
    }
}

static void test_empty_params_and_safetensors(void) {
    char path[512];
    dt_status st;
    {   /* a [0, 8] parameter: add, save, load */
        dt_params ps, qs;
        dt_param_desc pd;
        dt_param *p = NULL;
        memset(&ps, 0, sizeof ps);
        memset(&qs, 0, sizeof qs);
        memset(&pd, 0, sizeof pd);
        pd.name = "empty"; pd.shape[1] = 8; pd.ndim = 2;
        pd.init.kind = DT_INIT_SCALED_NORMAL;
        st = dt_params_add(&C, &ps, &p, &pd);
        DT_TEST_CHECK("params_add_0x8_ok", st == DT_OK && p && p->value.ndim == 2 && p->value.shape[0] == 0 &&
                                              p->value.shape[1] == 8 && p->grad.numel == 0 && !p->sharded);
        if (st) printf("  (%s)\n", dt_ctx_error(&C));
        memset(&pd, 0, sizeof pd);
        pd.name = "w"; pd.shape[0] = 3; pd.init.kind = DT_INIT_NORMAL; pd.init.std = 1;
        dt_params_add(&C, &ps, NULL, &pd);
        tmp_path(path, sizeof path, "empty_params.safetensors");
        expect_ok("params_save_with_empty_ok", &C, dt_params_save(&C, &ps, path));
        memset(&pd, 0, sizeof pd);
        pd.name = "empty"; pd.shape[1] = 8; pd.ndim = 2;
        dt_params_add(&C, &qs, NULL, &pd);
        memset(&pd, 0, sizeof pd);
        pd.name = "w"; pd.shape[0] = 3;
        dt_params_add(&C, &qs, NULL, &pd);
        st = dt_params_load(&C, &qs, path);
        DT_TEST_CHECK("params_load_with_empty_round_trips",
                      st == DT_OK && qs.count == 2 && memcmp(qs.items[1]->value.data, ps.items[1]->value.data, 12) == 0);
        if (st) printf("  (%s)\n", dt_ctx_error(&C));
        memset(&pd, 0, sizeof pd);
        pd.name = "empty_global"; pd.shape[1] = 8; pd.ndim = 2; pd.global_shape[0] = 4; pd.global_shape[1] = 8;
        st = dt_params_add(&C, &qs, &p, &pd);
        DT_TEST_CHECK("params_add_empty_shard_of_4x8_ok", st == DT_OK && p && p->sharded == 1 && p->value.numel == 0);
        if (st) printf("  (%s)\n", dt_ctx_error(&C));
        dt_params_free(&C, &ps);
        dt_params_free(&C, &qs);
    }
    {   /* safetensors of an empty [0, 64] tensor next to a full one */
        dt_tensor e = mk(DT_F32, 2, SH(0, 64)), w = mk(DT_F32, 2, SH(2, 2)), e2, w2;
        const dt_tensor *ts[2];
        const char *names[2] = {"e", "w"};
        dt_st_file f;
        ts[0] = &e; ts[1] = &w;
        rnd(&w, "w");
        tmp_path(path, sizeof path, "empty.safetensors");
        st = dt_safetensors_save(&C, path, ts, names, 2, NULL, 0);
        expect_ok("st_save_empty_ok", &C, st);
        st = dt_safetensors_open(&C, &f, path);
        if (expect_ok("st_open_empty_ok", &C, st)) {
            const dt_st_entry *en = dt_safetensors_find(&f, "e");
            DT_TEST_CHECK("st_entry_empty_shape", en && en->ndim == 2 && en->shape[0] == 0 && en->shape[1] == 64 &&
                                                      en->begin == en->end);
            e2 = mk(DT_F32, 2, SH(0, 64));
            w2 = mk(DT_F32, 2, SH(2, 2));
            expect_ok("st_read_empty_ok", &C, dt_safetensors_read(&C, &f, &e2, "e"));
            st = dt_safetensors_read(&C, &f, &w2, "w");
            DT_TEST_CHECK("st_read_after_empty_round_trips", st == DT_OK && memcmp(w2.data, w.data, 16) == 0);
            expect_err("st_read_full_into_empty_is_named", &C,
                       dt_safetensors_read(&C, &f, &e2, "w"), DT_ERR_SHAPE, "\"w\"", NULL);
            dt_tensor_free(&C, &e2); dt_tensor_free(&C, &w2);
            dt_safetensors_close(&C, &f);
        }
        {   /* the bytes: "e" has data_offsets [a, a]; the file is 8 + header + 16 bytes */
            FILE *fp = fopen(path, "rb");
            unsigned char b8[8];
            char *hdr = NULL, *at;
            uint64_t hl = 0, o0 = 1, o1 = 2;
            long size = -1;
            int k;
            if (fp && fread(b8, 1, 8, fp) == 8) {
                for (k = 7; k >= 0; k--) hl = (hl << 8) | b8[k];
                if (hl < 4096) {
                    hdr = (char *)calloc(1, (size_t)hl + 1);
                    if (fread(hdr, 1, (size_t)hl, fp) != hl) hdr[0] = 0;
                }
                fseek(fp, 0, SEEK_END);
                size = ftell(fp);
            }
            if (fp) fclose(fp);
            at = hdr ? strstr(hdr, "\"e\":") : NULL;
            at = at ? strstr(at, "\"data_offsets\":[") : NULL;
            if (at) {
                char *end;
                at += strlen("\"data_offsets\":[");
                o0 = strtoull(at, &end, 10);
                if (*end == ',') o1 = strtoull(end + 1, NULL, 10);
            }
            DT_TEST_CHECK("st_file_empty_data_offsets_equal", at != NULL && o0 == o1);
            DT_TEST_CHECK("st_file_empty_shape_in_header", hdr && strstr(hdr, "[0,64]") != NULL);
            DT_TEST_CHECK("st_file_size_is_header_plus_16", size == (long)(8 + hl + 16) && hl % 8 == 0);
            free(hdr);
        }
        {   /* an empty tensor listed after a full one at the same offset: the reference sorts by
               (begin, end), so [0, 0] comes before [0, 8]: a valid file */
            static const char *h1 = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                    "\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}";
            static const char *h2 = "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
            static const char *h3 = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                    "\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}";
            float data[2] = {1.5f, -2.0f};
            tmp_path(path, sizeof path, "tie.safetensors");
            write_st(path, h2, data, 8);
            st = dt_safetensors_open(&C, &f, path);
            expect_ok("st_open_empty_first_at_shared_offset_ok", &C, st);
            if (!st) dt_safetensors_close(&C, &f);
            write_st(path, h3, data, 8);
            st = dt_safetensors_open(&C, &f, path);
            expect_ok("st_open_empty_at_end_ok", &C, st);
            if (!st) dt_safetensors_close(&C, &f);
            write_st(path, h1, data, 8);
            st = dt_safetensors_open(&C, &f, path);
            expect_ok("st_open_empty_listed_after_full_at_shared_offset_ok", &C, st);
            if (!st) dt_safetensors_close(&C, &f);
            st = dt_safetensors_parse(&C, &f, h1, strlen(h1), 8, "h1");
            expect_ok("st_parse_empty_listed_after_full_at_shared_offset_ok", &C, st);
            if (!st) dt_safetensors_close(&C, &f);
        }
        dt_tensor_free(&C, &e); dt_tensor_free(&C, &w);
    }
}

/* ---------------------------------------------------------------- 3. float to integer */

static void test_float_to_int(void) {
    static const float src[9] = {3e9f, -3e9f, NAN, INFINITY, -INFINITY, 1.5f, -1.5f, 255.5f, 300.0f};
    static const int32_t want32[9] = {INT32_MAX, INT32_MIN, 0, INT32_MAX, INT32_MIN, 1, -1, 255, 300};
    static const int64_t want64[9] = {3000000000LL, -3000000000LL, 0, INT64_MAX, INT64_MIN, 1, -1, 255, 300};
    static const uint8_t want8[9] = {255, 0, 0, 255, 0, 1, 0, 255, 255};
    dt_tensor s = mk(DT_F32, 1, SH(9)), i32 = mk(DT_I32, 1, SH(9)), i64 = mk(DT_I64, 1, SH(9)), u8 = mk(DT_U8, 1, SH(9));
    dt_status st;
    int i;
    setf(&s, src);
    st = dt_tensor_cast(&C, &i32, &s);
    if (expect_ok("cast_f32_to_i32_ok", &C, st)) {
        int bad = -1;
        for (i = 0; i < 9 && bad < 0; i++) if (((int32_t *)i32.data)[i] != want32[i]) bad = i;
        if (bad < 0) dt_test_pass("cast_f32_to_i32_saturates");
        else dt_test_fail("cast_f32_to_i32_saturates", "[%d] %g -> %d, want %d", bad, (double)src[bad],
                          ((int32_t *)i32.data)[bad], want32[bad]);
    }
    st = dt_tensor_cast(&C, &i64, &s);
    if (expect_ok("cast_f32_to_i64_ok", &C, st)) {
        int bad = -1;
        for (i = 0; i < 9 && bad < 0; i++) if (((int64_t *)i64.data)[i] != want64[i]) bad = i;
        if (bad < 0) dt_test_pass("cast_f32_to_i64_saturates");
        else dt_test_fail("cast_f32_to_i64_saturates", "[%d] %g -> %lld, want %lld", bad, (double)src[bad],
                          (long long)((int64_t *)i64.data)[bad], (long long)want64[bad]);
    }
    st = dt_tensor_cast(&C, &u8, &s);
    if (expect_ok("cast_f32_to_u8_ok", &C, st)) {
        int bad = -1;
        for (i = 0; i < 9 && bad < 0; i++) if (((uint8_t *)u8.data)[i] != want8[i]) bad = i;
        if (bad < 0) dt_test_pass("cast_f32_to_u8_saturates");
        else dt_test_fail("cast_f32_to_u8_saturates", "[%d] %g -> %d, want %d", bad, (double)src[bad],
                          ((uint8_t *)u8.data)[bad], want8[bad]);
    }
    {   /* the exact edges: 2^31, -2^31, the largest float below 2^31, 2^63, -2^63 */
        float e[6] = {2147483648.0f, -2147483648.0f, 2147483520.0f, -2147483904.0f, 9223372036854775808.0f,
                      -9223372036854775808.0f};
        int32_t w32[6] = {INT32_MAX, INT32_MIN, 2147483520, INT32_MIN, INT32_MAX, INT32_MIN};
        int64_t w64[6] = {2147483648LL, -2147483648LL, 2147483520LL, -2147483904LL, INT64_MAX, INT64_MIN};
        int32_t g32[6];
        int64_t g64[6];
        dt_convert(&C, g32, DT_I32, e, DT_F32, 6);
        dt_convert(&C, g64, DT_I64, e, DT_F32, 6);
        DT_TEST_CHECK("convert_i32_edges", memcmp(g32, w32, sizeof w32) == 0);
        DT_TEST_CHECK("convert_i64_edges", memcmp(g64, w64, sizeof w64) == 0);
    }
    {   /* integer to integer saturates too */
        int64_t a[5] = {5000000000LL, -5000000000LL, 7, -1, 256};
        int32_t w32[5] = {INT32_MAX, INT32_MIN, 7, -1, 256}, g32[5];
        uint8_t w8[5] = {255, 0, 7, 0, 255}, g8[5];
        st = dt_convert(&C, g32, DT_I32, a, DT_I64, 5);
        DT_TEST_CHECK("convert_i64_to_i32_saturates", st == DT_OK && memcmp(g32, w32, sizeof w32) == 0);
        st = dt_convert(&C, g8, DT_U8, a, DT_I64, 5);
        DT_TEST_CHECK("convert_i64_to_u8_saturates", st == DT_OK && memcmp(g8, w8, sizeof w8) == 0);
    }

    /* fill: an integer tensor cannot hold the value: DT_ERR_RANGE, tensor unchanged */
    dt_tensor_fill(&C, &i32, 7);
    expect_err("fill_i32_1e20_is_range", &C, dt_tensor_fill(&C, &i32, 1e20), DT_ERR_RANGE, "1e+20", "i32");
    expect_err("fill_i32_nan_is_range", &C, dt_tensor_fill(&C, &i32, NAN), DT_ERR_RANGE, "nan", "i32");
    expect_err("fill_i32_inf_is_range", &C, dt_tensor_fill(&C, &i32, INFINITY), DT_ERR_RANGE, "i32", NULL);
    expect_err("fill_i32_below_min_is_range", &C, dt_tensor_fill(&C, &i32, -2147483649.0), DT_ERR_RANGE, "i32", NULL);
    expect_err("fill_i32_half_above_max_is_range", &C, dt_tensor_fill(&C, &i32, 2147483647.5), DT_ERR_RANGE, "i32", NULL);
    {
        int ok = 1;
        for (i = 0; i < 9; i++) ok &= ((int32_t *)i32.data)[i] == 7;
        DT_TEST_CHECK("fill_i32_failures_leave_tensor", ok);
    }
    st = dt_tensor_fill(&C, &i32, 2147483647.0);
    DT_TEST_CHECK("fill_i32_max_ok", st == DT_OK && ((int32_t *)i32.data)[8] == INT32_MAX);
    st = dt_tensor_fill(&C, &i32, -2147483648.0);
    DT_TEST_CHECK("fill_i32_min_ok", st == DT_OK && ((int32_t *)i32.data)[0] == INT32_MIN);
    dt_tensor_fill(&C, &u8, 9);
    expect_err("fill_u8_minus_1_is_range", &C, dt_tensor_fill(&C, &u8, -1), DT_ERR_RANGE, "-1", "u8");
    expect_err("fill_u8_256_is_range", &C, dt_tensor_fill(&C, &u8, 256), DT_ERR_RANGE, "u8", NULL);
    expect_err("fill_u8_nan_is_range", &C, dt_tensor_fill(&C, &u8, NAN), DT_ERR_RANGE, "u8", NULL);
    {
        int ok = 1;
        for (i = 0; i < 9; i++) ok &= ((uint8_t *)u8.data)[i] == 9;
        DT_TEST_CHECK("fill_u8_failures_leave_tensor", ok);
    }
    st = dt_tensor_fill(&C, &u8, 255);
    DT_TEST_CHECK("fill_u8_255_ok", st == DT_OK && ((uint8_t *)u8.data)[3] == 255);
    dt_tensor_fill(&C, &i64, 3);
    expect_err("fill_i64_9p3e18_is_range", &C, dt_tensor_fill(&C, &i64, 9.3e18), DT_ERR_RANGE, "i64", NULL);
    expect_err("fill_i64_nan_is_range", &C, dt_tensor_fill(&C, &i64, NAN), DT_ERR_RANGE, "i64", NULL);
    DT_TEST_CHECK("fill_i64_failures_leave_tensor", ((int64_t *)i64.data)[4] == 3);
    st = dt_tensor_fill(&C, &i64, -9223372036854775808.0);
    DT_TEST_CHECK("fill_i64_min_ok", st == DT_OK && ((int64_t *)i64.data)[0] == INT64_MIN);
    st = dt_tensor_fill(&C, &i64, 9223372036854775807.0); /* this double is 2^63: saturates */
    DT_TEST_CHECK("fill_i64_2p63_saturates", st == DT_OK && ((int64_t *)i64.data)[0] == INT64_MAX);
    st = dt_tensor_fill(&C, &s, 1e300);
    DT_TEST_CHECK("fill_f32_1e300_is_inf", st == DT_OK && isinf(F(&s)[0]) && F(&s)[0] > 0);

    {   /* casts dt_tensor_cast refuses write nothing */
        dt_tensor b = mk(DT_BF16, 1, SH(9));
        dt_tensor_fill(&C, &i32, 5);
        expect_err("cast_bf16_to_i32_is_dtype", &C, dt_tensor_cast(&C, &i32, &b), DT_ERR_DTYPE, "bf16", "i32");
        DT_TEST_CHECK("cast_bf16_to_i32_writes_nothing", ((int32_t *)i32.data)[0] == 5 && ((int32_t *)i32.data)[8] == 5);
        expect_err("cast_i32_to_bf16_is_dtype", &C, dt_tensor_cast(&C, &b, &i32), DT_ERR_DTYPE, "i32", "bf16");
        dt_tensor_free(&C, &b);
    }
    dt_tensor_free(&C, &s); dt_tensor_free(&C, &i32); dt_tensor_free(&C, &i64); dt_tensor_free(&C, &u8);
}

/* Writes value v as dtype t at p[i]. */
static void put(void *p, dt_dtype t, int i, double v) {
    switch (t) {
    case DT_F32: ((float *)p)[i] = (float)v; break;
    case DT_BF16: ((uint16_t *)p)[i] = dt_f32_to_bf16((float)v); break;
    case DT_F16: ((uint16_t *)p)[i] = dt_f32_to_f16((float)v); break;
    case DT_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case DT_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    default: break;
    }
}

static int is_flt(dt_dtype t) { return t == DT_F32 || t == DT_BF16 || t == DT_F16; }

static void test_convert_pairs(void) {
    static const double base[] = {0, 1, 2, 7, 100, 128, 255};
    static const double neg[] = {-3, -128, 1024};
    static const double wide[] = {-70000, 16777216};
    char name[96];
    int s, d, bad_support = 0, bad_values = 0, pairs = 0, refused = 0;
    for (s = DT_F32; s < DT_DTYPE_COUNT; s++)
        for (d = DT_F32; d < DT_DTYPE_COUNT; d++) {
            dt_dtype ts = (dt_dtype)s, td = (dt_dtype)d;
            int supported = (is_flt(ts) && is_flt(td)) || ts == DT_F32 || td == DT_F32 || (!is_flt(ts) && !is_flt(td));
            unsigned char a[128], b[128], back[128], want_b[128];
            double vals[16];
            int n = 0, k;
            dt_status st;
            for (k = 0; k < 7; k++) vals[n++] = base[k];
            if (ts != DT_U8 && td != DT_U8)
                for (k = 0; k < 3; k++) vals[n++] = neg[k];
            if (!is_flt(ts) || ts == DT_F32)
                if ((!is_flt(td) || td == DT_F32) && ts != DT_U8 && td != DT_U8)
                    for (k = 0; k < 2; k++) vals[n++] = wide[k];
            memset(a, 0, sizeof a); memset(want_b, 0, sizeof want_b);
            for (k = 0; k < n; k++) { put(a, ts, k, vals[k]); put(want_b, td, k, vals[k]); }
            memset(b, 0xA5, sizeof b);
            st = dt_convert(&C, b, td, a, ts, n);
            if (!supported) {
                int untouched = 1;
                for (k = 0; k < (int)sizeof b; k++) untouched &= b[k] == 0xA5;
                refused++;
                snprintf(name, sizeof name, "convert_%s_to_%s_refused_writes_nothing", dt_dtype_name(ts), dt_dtype_name(td));
                if (st == DT_ERR_DTYPE && untouched && strstr(dt_ctx_error(&C), dt_dtype_name(ts))) dt_test_pass(name);
                else { bad_support++; dt_test_fail(name, "status %d, dst untouched %d, message \"%s\"", (int)st, untouched, dt_ctx_error(&C)); }
                continue;
            }
            pairs++;
            if (st) {
                bad_support++;
                dt_test_fail("convert_supported_pair_ok", "%s -> %s: status %d: %s", dt_dtype_name(ts), dt_dtype_name(td),
                             (int)st, dt_ctx_error(&C));
                continue;
            }
            memset(back, 0, sizeof back);
            st = dt_convert(&C, back, ts, b, td, n);
            if (st || memcmp(b, want_b, (size_t)n * dt_dtype_size(td)) != 0 ||
                memcmp(back, a, (size_t)n * dt_dtype_size(ts)) != 0) {
                bad_values++;
                dt_test_fail("convert_pairs_round_trip", "%s -> %s -> %s: status %d, forward %s, back %s", dt_dtype_name(ts),
                             dt_dtype_name(td), dt_dtype_name(ts), (int)st,
                             memcmp(b, want_b, (size_t)n * dt_dtype_size(td)) ? "differs" : "ok",
                             memcmp(back, a, (size_t)n * dt_dtype_size(ts)) ? "differs" : "ok");
            }
        }
    if (!bad_values && !bad_support) dt_test_pass("convert_pairs_round_trip");
    DT_TEST_CHECK("convert_supported_pair_count", pairs == 24 && refused == 12);
    {
        uint16_t h[2] = {0x3F80, 0x4000};
        int32_t out[2] = {11, 12};
        dt_status st = dt_convert(&C, out, DT_I32, h, DT_BF16, 2);
        expect_err("convert_bf16_to_i32_is_dtype", &C, st, DT_ERR_DTYPE, "bf16 -> i32", NULL);
        DT_TEST_CHECK("convert_bf16_to_i32_writes_nothing", out[0] == 11 && out[1] == 12);
        expect_err("convert_dtype_42_is_dtype", &C, dt_convert(&C, out, DT_I32, h, (dt_dtype)42, 2), DT_ERR_DTYPE, "42", NULL);
        expect_err("convert_default_dtype_is_dtype", &C, dt_convert(&C, out, DT_DTYPE_DEFAULT, h, DT_F32, 2), DT_ERR_DTYPE, NULL, NULL);
        expect_err("convert_negative_n_is_arg", &C, dt_convert(&C, out, DT_I32, h, DT_F32, -1), DT_ERR_ARG, "n = -1", NULL);
        expect_err("convert_null_dst_is_arg", &C, dt_convert(&C, NULL, DT_I32, h, DT_F32, 2), DT_ERR_ARG, "dst NULL", NULL);
        expect_ok("convert_zero_null_ok", &C, dt_convert(&C, NULL, DT_I32, NULL, DT_F32, 0));
    }
}

/* ---------------------------------------------------------------- 4. bad tensor structs */

typedef dt_status (*probe_fn)(dt_tensor *bad, dt_tensor *good, dt_tensor *scratch);

static dt_status p_copy_dst(dt_tensor *bad, dt_tensor *good, dt_tensor *s) { (void)s; return dt_tensor_copy(&C, bad, good); }
static dt_status p_copy_src(dt_tensor *bad, dt_tensor *good, dt_tensor *s) { (void)s; return dt_tensor_copy(&C, good, bad); }
static dt_status p_fill(dt_tensor *bad, dt_tensor *good, dt_tensor *s) { (void)good; (void)s; return dt_tensor_fill(&C, bad, 1); }
static dt_status p_view(dt_tensor *bad, dt_tensor *good, dt_tensor *s) { (void)good; return dt_tensor_view(&C, s, bad, 0, 1, SH(1)); }
static dt_status p_reshape(dt_tensor *bad, dt_tensor *good, dt_tensor *s) { (void)good; return dt_tensor_reshape(&C, s, bad, 1, SH(4)); }
static dt_status p_cast_dst(dt_tensor *bad, dt_tensor *good, dt_tensor *s) { (void)s; return dt_tensor_cast(&C, bad, good); }
static dt_status p_cast_src(dt_tensor *bad, dt_tensor *good, dt_tensor *s) { (void)s; return dt_tensor_cast(&C, good, bad); }
static dt_status p_matmul_a(dt_tensor *bad, dt_tensor *good, dt_tensor *s) { (void)s; return dt_matmul_fwd(&C, good, bad, good, 0, 0, 1, 0); }
static dt_status p_matmul_out(dt_tensor *bad, dt_tensor *good, dt_tensor *s) { (void)s; return dt_matmul_fwd(&C, bad, good, good, 0, 0, 1, 0); }
static dt_status p_add_b(dt_tensor *bad, dt_tensor *good, dt_tensor *s) { (void)s; return dt_add(&C, good, good, bad); }
static dt_status p_sum(dt_tensor *bad, dt_tensor *good, dt_tensor *s) { double r; (void)good; (void)s; return dt_sum(&C, &r, bad); }
static dt_status p_init(dt_tensor *bad, dt_tensor *good, dt_tensor *s) {
    dt_init_desc d;
    (void)good; (void)s;
    memset(&d, 0, sizeof d);
    d.kind = DT_INIT_CONST; d.value = 1;
    return dt_tensor_init(&C, bad, &d);
}
static dt_status p_like(dt_tensor *bad, dt_tensor *good, dt_tensor *s) {
    dt_status st = dt_tensor_create_like(&C, s, bad, DT_DTYPE_DEFAULT, DT_DEVICE_DEFAULT);
    (void)good;
    if (!st) dt_tensor_free(&C, s);
    return st;
}
static dt_status p_save(dt_tensor *bad, dt_tensor *good, dt_tensor *s) {
    char path[512];
    const dt_tensor *ts[2];
    const char *names[2] = {"good", "victim"};
    dt_status st;
    (void)s;
    ts[0] = good; ts[1] = bad;
    tmp_path(path, sizeof path, "bad_struct.safetensors");
    remove(path);
    st = dt_safetensors_save(&C, path, ts, names, 2, NULL, 0);
    if (st && file_exists(path)) return DT_OK; /* a failed save must leave no file: count it as not named */
    return st;
}

static void test_bad_structs(void) {
    static const struct { probe_fn fn; const char *name, *arg; } probes[] = {
        {p_copy_dst, "copy_dst", "dst"}, {p_copy_src, "copy_src", "src"}, {p_fill, "fill", "t"},
        {p_view, "view", "t"}, {p_reshape, "reshape", "t"}, {p_cast_dst, "cast_dst", "dst"},
        {p_cast_src, "cast_src", "src"}, {p_matmul_a, "matmul_a", "a"}, {p_matmul_out, "matmul_out", "out"},
        {p_add_b, "add_b", "b"}, {p_sum, "sum", "x"}, {p_init, "init", "t"}, {p_like, "create_like", "t"},
        {p_save, "safetensors_save", "victim"},
    };
    enum { NV = 9 };
    static const char *vname[NV] = {"freed", "dtype42", "device42", "ndim9", "ndim_minus1", "numel_mismatch",
                                    "data_null", "dtype_default_with_data", "negative_numel"};
    static const char *vword[NV] = {"not a live tensor", "dtype = 42", "device = 42", "ndim = 9", "ndim = -1",
                                    "does not match its shape", "no data", "dtype = 0", "numel = -4"};
    static const int vstatus[NV] = {DT_ERR_STATE, DT_ERR_DTYPE, DT_ERR_DEVICE, DT_ERR_SHAPE, DT_ERR_SHAPE,
                                    DT_ERR_SHAPE, DT_ERR_STATE, DT_ERR_DTYPE, DT_ERR_SHAPE};
    dt_tensor good = mk(DT_F32, 2, SH(2, 2)), live = mk(DT_F32, 2, SH(2, 2)), bad, scratch;
    int v;
    size_t p;
    char name[128], word[64];
    rnd(&good, "good");
    for (v = 0; v < NV; v++) {
        for (p = 0; p < sizeof probes / sizeof probes[0]; p++) {
            float before[4];
            dt_status st;
            bad = live;
            switch (v) {
            case 0: memset(&bad, 0, sizeof bad); break;
            case 1: bad.dtype = (dt_dtype)42; break;
            case 2: bad.device = (dt_device)42; break;
            case 3: bad.ndim = 9; break;
            case 4: bad.ndim = -1; break;
            case 5: bad.numel = 5; break;
            case 6: bad.data = NULL; break;
            case 7: bad.dtype = DT_DTYPE_DEFAULT; break;
            case 8: bad.numel = -4; break;
            }
            memcpy(before, live.data, sizeof before);
            memset(&scratch, 0, sizeof scratch);
            dt_ctx_clear_error(&C);
            st = probes[p].fn(&bad, &good, &scratch);
            snprintf(name, sizeof name, "bad_struct_%s_in_%s_is_named", vname[v], probes[p].name);
            /* the message names the argument: "fn: arg ..." */
            snprintf(word, sizeof word, ": %s", probes[p].arg);
            if (expect_err(name, &C, st, vstatus[v], word, vword[v]))
                if (memcmp(before, live.data, sizeof before) != 0)
                    dt_test_fail(name, "the call wrote into the data the bad struct points at");
        }
    }
    {   /* copy(freed, freed) */
        dt_tensor f1, f2;
        dt_tensor t = mk(DT_F32, 1, SH(3));
        f1 = t;
        dt_tensor_free(&C, &t);
        f2 = t;
        expect_err("copy_freed_freed_is_state", &C, dt_tensor_copy(&C, &t, &f2), DT_ERR_STATE, "dst", "not a live tensor");
        DT_TEST_CHECK("free_zeroes_the_struct", t.data == NULL && t.dtype == 0 && t.numel == 0 && f1.data != NULL);
        dt_tensor_free(&C, &t); /* a second free is a no-op */
        DT_TEST_CHECK("double_free_is_no_op", t.data == NULL);
    }
    {   /* a view of a bad struct writes nothing into *view */
        dt_tensor v2;
        memset(&v2, 0x11, sizeof v2);
        bad = live; bad.ndim = 9;
        dt_tensor_view(&C, &v2, &bad, 0, 1, SH(1));
        DT_TEST_CHECK("failed_view_leaves_out", v2.ndim == 0x11111111);
    }
    dt_tensor_free(&C, &good); dt_tensor_free(&C, &live);
}

/* ---------------------------------------------------------------- 5. the string builder */

static void test_strbuf(void) {
    dt_strbuf b;
    char big[1200];
    size_t len;
    memset(big, 'x', sizeof big);
    big[sizeof big - 1] = 0;
    big[10] = '"';
    big[20] = '\n';

    dt_strbuf_str(NULL, "abc");
    dt_strbuf_add(NULL, "abc", 3);
    dt_strbuf_add(NULL, NULL, (size_t)-1);
    dt_strbuf_json(NULL, big);
    dt_strbuf_printf(NULL, "%s %d", big, 5);
    dt_strbuf_free(NULL);
    dt_test_pass("strbuf_null_b_is_no_op");

    memset(&b, 0, sizeof b);
    b.ctx = &C;
    dt_strbuf_str(&b, "ab");
    dt_strbuf_str(&b, NULL);
    DT_TEST_CHECK("strbuf_str_null_sets_failed", b.failed == 1 && b.len == 2 && strcmp(b.text, "ab") == 0);
    dt_strbuf_str(&b, "cd");
    DT_TEST_CHECK("strbuf_failed_makes_appends_no_ops", b.len == 2 && strcmp(b.text, "ab") == 0);
    dt_strbuf_free(&b);

    memset(&b, 0, sizeof b);
    b.ctx = &C;
    dt_strbuf_json(&b, NULL);
    DT_TEST_CHECK("strbuf_json_null_sets_failed", b.failed == 1 && b.len == 0);
    dt_strbuf_free(&b);

    memset(&b, 0, sizeof b);
    b.ctx = &C;
    dt_strbuf_json(&b, big);
    {
        size_t need = dt_json_escape(NULL, 0, big);
        char *want = (char *)malloc(need + 1);
        dt_json_escape(want, need + 1, big);
        DT_TEST_CHECK("strbuf_json_long_string", !b.failed && b.len == need && b.len == sizeof big - 1 + 2 + 2 &&
                                                     strcmp(b.text, want) == 0);
        free(want);
    }
    len = b.len;
    dt_strbuf_printf(&b, "%s|%d", big, 42);
    DT_TEST_CHECK("strbuf_printf_long", !b.failed && b.len == len + sizeof big - 1 + 3 &&
                                            strcmp(b.text + b.len - 3, "|42") == 0);
    dt_strbuf_add(&b, "abc", (size_t)-1);
    DT_TEST_CHECK("strbuf_add_size_max_sets_failed", b.failed == 1 && b.len == len + sizeof big - 1 + 3);
    dt_strbuf_free(&b);
    DT_TEST_CHECK("strbuf_free_resets", b.text == NULL && b.len == 0 && b.cap == 0);

    memset(&b, 0, sizeof b);
    b.ctx = &CAP;
    dt_strbuf_str(&b, "abc");
    dt_strbuf_add(&b, "abc", (size_t)PTRDIFF_MAX - 10); /* passes the size check; the allocator refuses */
    DT_TEST_CHECK("strbuf_add_huge_n_sets_failed", b.failed == 1 && b.len == 3 && strcmp(b.text, "abc") == 0);
    dt_strbuf_free(&b);
    memset(&b, 0, sizeof b);
    b.ctx = &CAP;
    dt_strbuf_add(&b, "abc", (size_t)PTRDIFF_MAX);
    DT_TEST_CHECK("strbuf_add_ptrdiff_max_sets_failed", b.failed == 1 && b.len == 0);
    dt_strbuf_free(&b);

    memset(&b, 0, sizeof b); /* no ctx */
    dt_strbuf_str(&b, "abc");
    DT_TEST_CHECK("strbuf_without_ctx_sets_failed", b.failed == 1 && b.text == NULL);
    dt_strbuf_printf(&b, "%d", 1);
    dt_strbuf_json(&b, "x");
    DT_TEST_CHECK("strbuf_without_ctx_stays_failed", b.failed == 1 && b.len == 0);
    dt_strbuf_free(&b);
    memset(&b, 0, sizeof b);
    dt_strbuf_printf(&b, "%d", 1);
    DT_TEST_CHECK("strbuf_printf_without_ctx_sets_failed", b.failed == 1);
    memset(&b, 0, sizeof b);
    dt_strbuf_json(&b, "x");
    DT_TEST_CHECK("strbuf_json_without_ctx_sets_failed", b.failed == 1);
    DT_TEST_CHECK("strbuf_checks_leave_no_bytes", CAP.bytes_in_use == 0);
}

/* ---------------------------------------------------------------- 6. relu and NULL gradients */

static void test_relu_nan(void) {
    float x[11] = {NAN, 1.0f, -1.0f, 0.0f, -0.0f, INFINITY, -INFINITY, 2.5f, -NAN, 1e-30f, -1e-30f};
    float dout[11] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    dt_tensor tx = mk(DT_F32, 1, SH(11)), to = mk(DT_F32, 1, SH(11)), td = mk(DT_F32, 1, SH(11)), tdx = mk(DT_F32, 1, SH(11));
    int i, bad = -1;
    setf(&tx, x); setf(&td, dout);
    dt_relu_fwd(&C, &to, &tx);
    for (i = 0; i < 11 && bad < 0; i++) {
        float want = (x[i] > 0 || isnan(x[i])) ? x[i] : 0.0f;
        if (isnan(want) ? !isnan(F(&to)[i]) : F(&to)[i] != want) bad = i;
    }
    if (bad < 0) dt_test_pass("relu_nan_in_nan_out");
    else dt_test_fail("relu_nan_in_nan_out", "x[%d] = %g -> %g", bad, (double)x[bad], (double)F(&to)[bad]);
    DT_TEST_CHECK("relu_minus_zero_is_zero", F(&to)[4] == 0.0f && F(&to)[3] == 0.0f && F(&to)[10] == 0.0f);
    DT_TEST_CHECK("relu_minus_zero_gives_plus_zero", !signbit(F(&to)[4]));
    dt_tensor_fill(&C, &tdx, 0.5);
    dt_relu_bwd(&C, &tdx, &td, &tx);
    for (bad = -1, i = 0; i < 11 && bad < 0; i++) {
        float want = 0.5f + ((x[i] > 0 || isnan(x[i])) ? dout[i] : 0.0f);
        if (F(&tdx)[i] != want) bad = i;
    }
    if (bad < 0) dt_test_pass("relu_bwd_passes_nan_and_positive_masks_nonpositive");
    else dt_test_fail("relu_bwd_passes_nan_and_positive_masks_nonpositive", "x[%d] = %g: dx = %g", bad,
                      (double)x[bad], (double)F(&tdx)[bad]);
    /* in place */
    dt_relu_fwd(&C, &tx, &tx);
    DT_TEST_CHECK("relu_in_place", isnan(F(&tx)[0]) && F(&tx)[1] == 1.0f && F(&tx)[2] == 0.0f && F(&tx)[6] == 0.0f &&
                                       F(&tx)[5] == INFINITY);
    dt_tensor_free(&C, &tx); dt_tensor_free(&C, &to); dt_tensor_free(&C, &td); dt_tensor_free(&C, &tdx);
}

static int same_bytes(const char *name, const dt_tensor *got, const dt_tensor *want) {
    if (got->numel != want->numel) return dt_test_fail(name, "numel %lld vs %lld", (long long)got->numel, (long long)want->numel);
    return dt_test_equal_bytes(name, got->data, want->data, dt_tensor_bytes(want));
}

static dt_tensor like(const dt_tensor *t, float v) {
    dt_tensor o;
    if (dt_tensor_create_like(&C, &o, t, DT_DTYPE_DEFAULT, DT_DEVICE_DEFAULT)) { dt_test_fail("setup_like", "%s", dt_ctx_error(&C)); exit(1); }
    dt_tensor_fill(&C, &o, v);
    return o;
}

static void test_null_grads(void) {
    dt_status st;
    {   /* matmul: da, db */
        int ta, tb;
        char name[96];
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++) {
                dt_tensor a = ta ? mk(DT_F32, 2, SH(4, 3)) : mk(DT_F32, 2, SH(3, 4));
                dt_tensor b = tb ? mk(DT_F32, 2, SH(5, 4)) : mk(DT_F32, 2, SH(4, 5)), g = mk(DT_F32, 2, SH(3, 5));
                dt_tensor da, db, da1, db1;
                rnd(&a, "a"); rnd(&b, "b"); rnd(&g, "g");
                da = like(&a, 0.25f); db = like(&b, 0.25f); da1 = like(&a, 0.25f); db1 = like(&b, 0.25f);
                dt_matmul_bwd(&C, &da, &db, &g, &a, &b, ta, tb, 0.5f);
                st = dt_matmul_bwd(&C, &da1, NULL, &g, &a, &b, ta, tb, 0.5f);
                st |= dt_matmul_bwd(&C, NULL, &db1, &g, &a, &b, ta, tb, 0.5f);
                st |= dt_matmul_bwd(&C, NULL, NULL, &g, &a, &b, ta, tb, 0.5f);
                snprintf(name, sizeof name, "matmul_bwd_null_grads_ok_ta%d_tb%d", ta, tb);
                expect_ok(name, &C, st);
                snprintf(name, sizeof name, "matmul_bwd_da_alone_equals_both_ta%d_tb%d", ta, tb);
                same_bytes(name, &da1, &da);
                snprintf(name, sizeof name, "matmul_bwd_db_alone_equals_both_ta%d_tb%d", ta, tb);
                same_bytes(name, &db1, &db);
                dt_tensor_free(&C, &a); dt_tensor_free(&C, &b); dt_tensor_free(&C, &g); dt_tensor_free(&C, &da);
                dt_tensor_free(&C, &db); dt_tensor_free(&C, &da1); dt_tensor_free(&C, &db1);
            }
    }
    {   /* linear: dx, dw, dbias, each alone */
        dt_tensor x = mk(DT_F32, 3, SH(2, 3, 6)), w = mk(DT_F32, 2, SH(5, 6)), g = mk(DT_F32, 3, SH(2, 3, 5));
        dt_tensor bias = mk(DT_F32, 1, SH(5));
        dt_tensor dx, dw, dbias, dx1, dw1, dbias1;
        rnd(&x, "x"); rnd(&w, "w"); rnd(&g, "g");
        dx = like(&x, 0.25f); dw = like(&w, 0.25f); dbias = like(&bias, 0.25f);
        dx1 = like(&x, 0.25f); dw1 = like(&w, 0.25f); dbias1 = like(&bias, 0.25f);
        dt_linear_bwd(&C, &dx, &dw, &dbias, &g, &x, &w);
        st = dt_linear_bwd(&C, &dx1, NULL, NULL, &g, &x, &w);
        st |= dt_linear_bwd(&C, NULL, &dw1, NULL, &g, &x, &w);
        st |= dt_linear_bwd(&C, NULL, NULL, &dbias1, &g, &x, &w);
        st |= dt_linear_bwd(&C, NULL, NULL, NULL, &g, &x, &w);
        expect_ok("linear_bwd_null_grads_ok", &C, st);
        same_bytes("linear_bwd_dx_alone_equals_all", &dx1, &dx);
        same_bytes("linear_bwd_dw_alone_equals_all", &dw1, &dw);
        same_bytes("linear_bwd_dbias_alone_equals_all", &dbias1, &dbias);
        expect_ok("bias_add_bwd_null_ok", &C, dt_bias_add_bwd(&C, NULL, &g));
        dt_tensor_free(&C, &x); dt_tensor_free(&C, &w); dt_tensor_free(&C, &g); dt_tensor_free(&C, &bias);
        dt_tensor_free(&C, &dx); dt_tensor_free(&C, &dw); dt_tensor_free(&C, &dbias);
        dt_tensor_free(&C, &dx1); dt_tensor_free(&C, &dw1); dt_tensor_free(&C, &dbias1);
    }
    {   /* layernorm: dx, dw, db, each alone */
        dt_tensor x = mk(DT_F32, 2, SH(3, 7)), o = mk(DT_F32, 2, SH(3, 7)), w = mk(DT_F32, 1, SH(7)), b = mk(DT_F32, 1, SH(7));
        dt_tensor mean = mk(DT_F32, 1, SH(3)), rstd = mk(DT_F32, 1, SH(3)), g = mk(DT_F32, 2, SH(3, 7));
        dt_tensor dx, dw, db, dx1, dw1, db1;
        rnd(&x, "x"); rnd(&w, "w"); rnd(&b, "b"); rnd(&g, "g");
        dt_layernorm_fwd(&C, &o, &mean, &rstd, &x, &w, &b, 1e-5f);
        dx = like(&x, 0.25f); dw = like(&w, 0.25f); db = like(&b, 0.25f);
        dx1 = like(&x, 0.25f); dw1 = like(&w, 0.25f); db1 = like(&b, 0.25f);
        dt_layernorm_bwd(&C, &dx, &dw, &db, &g, &x, &w, &mean, &rstd);
        st = dt_layernorm_bwd(&C, &dx1, NULL, NULL, &g, &x, &w, &mean, &rstd);
        st |= dt_layernorm_bwd(&C, NULL, &dw1, NULL, &g, &x, &w, &mean, &rstd);
        st |= dt_layernorm_bwd(&C, NULL, NULL, &db1, &g, &x, &w, &mean, &rstd);
        st |= dt_layernorm_bwd(&C, NULL, NULL, NULL, &g, &x, &w, &mean, &rstd);
        expect_ok("layernorm_bwd_null_grads_ok", &C, st);
        same_bytes("layernorm_bwd_dx_alone_equals_all", &dx1, &dx);
        same_bytes("layernorm_bwd_dw_alone_equals_all", &dw1, &dw);
        same_bytes("layernorm_bwd_db_alone_equals_all", &db1, &db);
        dt_tensor_free(&C, &x); dt_tensor_free(&C, &o); dt_tensor_free(&C, &w); dt_tensor_free(&C, &b);
        dt_tensor_free(&C, &mean); dt_tensor_free(&C, &rstd); dt_tensor_free(&C, &g);
        dt_tensor_free(&C, &dx); dt_tensor_free(&C, &dw); dt_tensor_free(&C, &db);
        dt_tensor_free(&C, &dx1); dt_tensor_free(&C, &dw1); dt_tensor_free(&C, &db1);
    }
    {   /* dot interaction: ddense, demb, each alone (D 21: the 16-, 4- and 1-wide paths; F 4: vectors in pairs
           and one alone either way) */
        dt_tensor dense = mk(DT_F32, 2, SH(2, 21)), emb = mk(DT_F32, 3, SH(2, 4, 21)), g = mk(DT_F32, 2, SH(2, 31));
        dt_tensor dd, de, dd1, de1;
        rnd(&dense, "dense"); rnd(&emb, "emb"); rnd(&g, "g");
        dd = like(&dense, 0.25f); de = like(&emb, 0.25f); dd1 = like(&dense, 0.25f); de1 = like(&emb, 0.25f);
        dt_dot_interaction_bwd(&C, &dd, &de, &g, &dense, &emb);
        st = dt_dot_interaction_bwd(&C, &dd1, NULL, &g, &dense, &emb);
        st |= dt_dot_interaction_bwd(&C, NULL, &de1, &g, &dense, &emb);
        st |= dt_dot_interaction_bwd(&C, NULL, NULL, &g, &dense, &emb);
        expect_ok("dot_interaction_bwd_null_grads_ok", &C, st);
        same_bytes("dot_interaction_bwd_ddense_alone_equals_all", &dd1, &dd);
        same_bytes("dot_interaction_bwd_demb_alone_equals_all", &de1, &de);
        dt_tensor_free(&C, &dense); dt_tensor_free(&C, &emb); dt_tensor_free(&C, &g);
        dt_tensor_free(&C, &dd); dt_tensor_free(&C, &de); dt_tensor_free(&C, &dd1); dt_tensor_free(&C, &de1);
    }
    {   /* single-gradient backwards with NULL: OK and nothing written */
        dt_tensor x = mk(DT_F32, 2, SH(4, 6)), g = mk(DT_F32, 2, SH(4, 6)), xc, t = mk(DT_I32, 1, SH(4));
        dt_tensor qkv = mk(DT_F32, 3, SH(2, 3, 12)), ao = mk(DT_F32, 3, SH(2, 3, 4)), att = mk(DT_F32, 4, SH(2, 2, 3, 3));
        dt_tensor tab = mk(DT_F32, 2, SH(5, 6)), ids = mk(DT_I64, 1, SH(4)), qc, attc;
        rnd(&x, "x"); rnd(&g, "g"); rnd(&qkv, "qkv"); rnd(&tab, "tab");
        dt_tensor_fill(&C, &t, 2); dt_tensor_fill(&C, &ids, 4);
        xc = like(&x, 0); dt_tensor_copy(&C, &xc, &x);
        expect_ok("relu_bwd_null_dx_ok", &C, dt_relu_bwd(&C, NULL, &g, &x));
        expect_ok("gelu_bwd_null_dx_ok", &C, dt_gelu_bwd(&C, NULL, &g, &x));
        expect_ok("softmax_xent_bwd_null_ok", &C, dt_softmax_xent_bwd(&C, NULL, &x, &t, -1, 1.0f));
        expect_ok("bce_bwd_null_ok", &C, dt_bce_logits_bwd(&C, NULL, &x, &g, 1.0f));
        expect_ok("embedding_bwd_null_ok", &C, dt_embedding_bwd(&C, NULL, &g, &ids));
        dt_attention_fwd(&C, &ao, &att, &qkv, 2);
        qc = like(&qkv, 0); dt_tensor_copy(&C, &qc, &qkv);
        attc = like(&att, 0); dt_tensor_copy(&C, &attc, &att);
        expect_ok("attention_bwd_null_ok", &C, dt_attention_bwd(&C, NULL, &ao, &qkv, &att, 2));
        DT_TEST_CHECK("null_grad_bwds_write_nothing", memcmp(xc.data, x.data, dt_tensor_bytes(&x)) == 0 &&
                                                          memcmp(qc.data, qkv.data, dt_tensor_bytes(&qkv)) == 0 &&
                                                          memcmp(attc.data, att.data, dt_tensor_bytes(&att)) == 0);
        expect_err("layernorm_bwd_null_mean_is_named", &C, dt_layernorm_bwd(&C, NULL, NULL, NULL, &g, &x, &x, NULL, NULL),
                   DT_ERR_ARG, "mean and rstd", NULL);
        dt_tensor_free(&C, &x); dt_tensor_free(&C, &g); dt_tensor_free(&C, &xc); dt_tensor_free(&C, &t);
        dt_tensor_free(&C, &qkv); dt_tensor_free(&C, &ao); dt_tensor_free(&C, &att); dt_tensor_free(&C, &tab);
        dt_tensor_free(&C, &ids); dt_tensor_free(&C, &qc); dt_tensor_free(&C, &attc);
    }
}

/* ---------------------------------------------------------------- 7. create_like */

static void test_create_like(void) {
    dt_tensor t = mk(DT_BF16, 3, SH(2, 0, 5)), s = mk(DT_I64, 0, NULL), o, v;
    dt_status st;
    st = dt_tensor_create_like(&C, &o, &t, DT_DTYPE_DEFAULT, DT_DEVICE_DEFAULT);
    DT_TEST_CHECK("create_like_default_keeps_all", st == DT_OK && o.dtype == DT_BF16 && o.device == DT_CPU && o.ndim == 3 &&
                                                       o.shape[0] == 2 && o.shape[1] == 0 && o.shape[2] == 5 &&
                                                       o.numel == 0 && o.owns == 1 && o.data != t.data);
    dt_tensor_free(&C, &o);
    st = dt_tensor_create_like(&C, &o, &t, DT_I32, DT_CPU);
    DT_TEST_CHECK("create_like_explicit_dtype", st == DT_OK && o.dtype == DT_I32 && dt_tensor_same_shape(&o, &t));
    dt_tensor_free(&C, &o);
    st = dt_tensor_create_like(&C, &o, &s, DT_DTYPE_DEFAULT, DT_DEVICE_DEFAULT);
    DT_TEST_CHECK("create_like_scalar", st == DT_OK && o.ndim == 0 && o.numel == 1 && o.dtype == DT_I64 &&
                                            dt_tensor_bytes(&o) == 8);
    dt_tensor_free(&C, &o);
    {   /* of a view: the view's shape, fresh memory, zero-filled */
        dt_tensor w = mk(DT_F32, 2, SH(4, 6));
        dt_tensor_fill(&C, &w, 3);
        dt_tensor_view(&C, &v, &w, 6, 2, SH(3, 2));
        st = dt_tensor_create_like(&C, &o, &v, DT_DTYPE_DEFAULT, DT_DEVICE_DEFAULT);
        DT_TEST_CHECK("create_like_view", st == DT_OK && o.ndim == 2 && o.shape[0] == 3 && o.shape[1] == 2 && o.owns == 1 &&
                                              F(&o)[5] == 0.0f && o.data != v.data);
        dt_tensor_free(&C, &o);
        dt_tensor_free(&C, &w);
    }
#ifndef DT_CUDA
    expect_err("create_like_cuda_without_cuda_is_named", &C, dt_tensor_create_like(&C, &o, &t, DT_DTYPE_DEFAULT, DT_CUDA_DEVICE),
               DT_ERR_DEVICE, "built without DT_CUDA", NULL);
    DT_TEST_CHECK("create_like_failure_leaves_out_empty", o.data == NULL);
#endif
    expect_err("create_like_dtype_42_is_named", &C, dt_tensor_create_like(&C, &o, &t, (dt_dtype)42, DT_DEVICE_DEFAULT),
               DT_ERR_DTYPE, "dtype = 42", NULL);
    expect_err("create_like_device_42_is_named", &C, dt_tensor_create_like(&C, &o, &t, DT_DTYPE_DEFAULT, (dt_device)42),
               DT_ERR_DEVICE, "device = 42", NULL);
    expect_err("create_like_out_is_t_is_named", &C, dt_tensor_create_like(&C, &t, &t, DT_DTYPE_DEFAULT, DT_DEVICE_DEFAULT),
               DT_ERR_ARG, "out is t", NULL);
    expect_err("create_like_null_out_is_named", &C, dt_tensor_create_like(&C, NULL, &t, DT_DTYPE_DEFAULT, DT_DEVICE_DEFAULT),
               DT_ERR_ARG, "out is NULL", NULL);
    DT_TEST_CHECK("create_like_failures_keep_t", t.data != NULL && t.dtype == DT_BF16 && t.owns == 1);
    dt_tensor_free(&C, &t); dt_tensor_free(&C, &s);
}

/* ---------------------------------------------------------------- last: huge dims inside empty tensors

   [0, 2^40, 2^40] has 0 elements, so it passes every size check (its element count is 0); the
   ops must then not multiply its other dims in int64 (signed overflow: UB, which UBSan reports)
   nor size buffers from them. Either answer is fine: a named error at creation, or the op's
   empty result. */

static int make_or_named(const char *name, dt_tensor *t, int nd, const int64_t *shape) {
    dt_tensor_desc d;
    dt_status st;
    int i;
    memset(&d, 0, sizeof d);
    d.ndim = nd;
    for (i = 0; i < nd; i++) d.shape[i] = shape[i];
    st = dt_tensor_create(&C, t, &d);
    if (st == DT_OK) return 1;
    expect_err(name, &C, st, DT_ERR_ARG, "too large", NULL); /* rejected: fine if named */
    return 0;
}

static void test_huge_dims_in_empty_tensors(void) {
    dt_status st;
    {   /* attention bwd sizes its row buffer from T: with B = 0, T = 2^62 is allowed, and
           T * sizeof(float) wraps to 0 bytes while the ctx records 2^62 floats */
        dt_ctx c2;
        dt_tensor qkv, o, att, dq;
        dt_ctx_desc cd;
        int made;
        memset(&cd, 0, sizeof cd);
        cd.allocator.alloc_fn = cap_alloc;
        cd.allocator.release_fn = cap_release;
        dt_ctx_init(&c2, &cd);
        made = make_or_named("attention_huge_t_rejected_is_named", &qkv, 3, SH(0, P2(62), 3));
        if (made) {
            o = mk(DT_F32, 3, SH(0, P2(62), 1));
            att = mk(DT_F32, 4, SH(0, 1, P2(62), P2(62)));
            dq = mk(DT_F32, 3, SH(0, P2(62), 3));
            expect_ok("attention_fwd_b0_huge_t_ok", &c2, dt_attention_fwd(&c2, &o, &att, &qkv, 1));
            st = dt_attention_bwd(&c2, &dq, &o, &qkv, &att, 1);
            if (st == DT_OK || st == DT_ERR_OOM) dt_test_pass("attention_bwd_b0_huge_t_ok_or_oom");
            else dt_test_fail("attention_bwd_b0_huge_t_ok_or_oom", "status %d: %s", (int)st, dt_ctx_error(&c2));
            /* the scratch the ctx believes it holds must be memory it holds */
            if (c2.scratch_floats <= c2.bytes_in_use / sizeof(float)) dt_test_pass("scratch_size_matches_its_memory");
            else dt_test_fail("scratch_size_matches_its_memory", "ctx.scratch_floats = %zu, but the ctx holds %zu bytes: "
                              "a later attention bwd or portable GEMM writes past the block", c2.scratch_floats,
                              c2.bytes_in_use);
            dt_tensor_free(&C, &o); dt_tensor_free(&C, &att); dt_tensor_free(&C, &dq); dt_tensor_free(&C, &qkv);
        }
        dt_ctx_shutdown(&c2);
    }
    {   /* concat of 0 rows whose widths sum past int64 */
        dt_tensor p0, p1, w;
        if (make_or_named("concat_huge_width_rejected_is_named", &p0, 2, SH(0, P2(62)))) {
            const dt_tensor *ins[3];
            p1 = mk(DT_F32, 2, SH(0, P2(62)));
            w = mk(DT_F32, 2, SH(0, 8));
            ins[0] = &p0; ins[1] = &p1; ins[2] = &p1;
            st = dt_concat_fwd(&C, &w, ins, 3);
            expect_err("concat_widths_overflow_is_shape", &C, st, DT_ERR_SHAPE, NULL, NULL);
            dt_tensor_free(&C, &p0); dt_tensor_free(&C, &p1); dt_tensor_free(&C, &w);
        }
    }
    {   /* dot interaction with B = 0 and F = 2^32: (F+1)F overflows */
        dt_tensor dense, emb, o;
        if (make_or_named("dot_huge_f_rejected_is_named", &emb, 3, SH(0, P2(32), 4))) {
            dense = mk(DT_F32, 2, SH(0, 4));
            o = mk(DT_F32, 2, SH(0, 4));
            st = dt_dot_interaction_fwd(&C, &o, &dense, &emb);
            expect_err("dot_interaction_huge_f_is_shape", &C, st, DT_ERR_SHAPE, "emb.shape[1]", NULL);
            dt_tensor_free(&C, &dense); dt_tensor_free(&C, &emb); dt_tensor_free(&C, &o);
        }
    }
    {   /* batched matmul with batch 0 and [2^40, 2^40] matrices: per-batch strides overflow */
        dt_tensor a, b, o;
        if (make_or_named("matmul_huge_batch0_rejected_is_named", &a, 3, SH(0, P2(40), P2(40)))) {
            b = mk(DT_F32, 2, SH(P2(40), 0));
            o = mk(DT_F32, 3, SH(0, P2(40), 0));
            expect_ok("matmul_batch0_huge_matrices_ok", &C, dt_matmul_fwd(&C, &o, &a, &b, 0, 0, 1, 0));
            dt_tensor_free(&C, &a); dt_tensor_free(&C, &b); dt_tensor_free(&C, &o);
        }
    }
    {   /* init of [0, 2^40, 2^40]: fan_in and the global strides overflow */
        dt_tensor t;
        if (make_or_named("init_huge_empty_rejected_is_named", &t, 3, SH(0, P2(40), P2(40)))) {
            dt_init_desc id;
            memset(&id, 0, sizeof id);
            id.kind = DT_INIT_SCALED_NORMAL; id.name = "e";
            expect_ok("init_empty_huge_dims_ok", &C, dt_tensor_init(&C, &t, &id));
            dt_tensor_free(&C, &t);
        }
    }
    {   /* a shard start near INT64_MAX: start + extent overflows, which must be DT_ERR_RANGE */
        dt_tensor t = mk(DT_F32, 1, SH(4));
        dt_init_desc id;
        dt_params ps;
        dt_param_desc pd;
        memset(&id, 0, sizeof id);
        id.kind = DT_INIT_ZEROS; id.name = "s";
        id.global_shape[0] = INT64_MAX; id.start[0] = INT64_MAX - 1;
        st = dt_tensor_init(&C, &t, &id);
        expect_err("init_start_near_int64_max_is_range", &C, st, DT_ERR_RANGE, "outside the global extent", NULL);
        dt_tensor_free(&C, &t);
        memset(&ps, 0, sizeof ps);
        memset(&pd, 0, sizeof pd);
        pd.name = "s"; pd.shape[0] = 4; pd.global_shape[0] = INT64_MAX; pd.start[0] = INT64_MAX - 1;
        st = dt_params_add(&C, &ps, NULL, &pd);
        expect_err("params_add_start_near_int64_max_is_range", &C, st, DT_ERR_RANGE, "outside the global extent", NULL);
        dt_params_free(&C, &ps);
    }
}

/* An op's output that shares memory with one of its inputs is a named error (before anything is
   written; memcpy between overlapping views would be undefined, a GEMM into its own operand
   garbage), while outputs next to their inputs in one buffer are fine. */
static void test_aliasing(void) {
    dt_tensor buf = mk(DT_F32, 1, SH(64)), a, b, out, w, x, ids, part[2], whole, tab;
    const dt_tensor *ins[2];
    dt_tensor *outs[2];
    dt_status st;
    float want[9];
    rnd(&buf, "alias");
    dt_tensor_view(&C, &a, &buf, 0, 2, SH(3, 3));
    dt_tensor_view(&C, &b, &buf, 9, 2, SH(3, 3));
    dt_tensor_view(&C, &out, &buf, 4, 2, SH(3, 3)); /* overlaps a's last 5 and b's first 4 */
    st = dt_matmul_fwd(&C, &a, &a, &b, 0, 0, 1.0f, 0.0f);
    dt_test_error("matmul_out_aliasing_a_is_named", st, dt_ctx_error(&C), "dt_matmul_fwd: out shares memory with a");
    st = dt_matmul_fwd(&C, &out, &a, &b, 0, 0, 1.0f, 0.0f);
    dt_test_error("matmul_out_overlapping_a_is_named", st, dt_ctx_error(&C), "out shares memory with a");
    dt_tensor_view(&C, &out, &buf, 18, 2, SH(3, 3)); /* right after b: apart */
    st = dt_matmul_bwd(&C, &b, NULL, &out, &a, &b, 0, 0, 1.0f);
    dt_test_error("matmul_bwd_da_aliasing_b_is_named", st, dt_ctx_error(&C), "dt_matmul_bwd: da shares memory with b");
    st = dt_matmul_fwd(&C, &out, &a, &b, 0, 0, 1.0f, 0.0f);
    if (DT_TEST_CHECK("matmul_out_adjacent_to_inputs_runs", st == DT_OK)) {
        dt_tensor wa = mk(DT_F32, 2, SH(3, 3)), wb = mk(DT_F32, 2, SH(3, 3)), wo = mk(DT_F32, 2, SH(3, 3));
        memcpy(wa.data, a.data, 36); memcpy(wb.data, b.data, 36);
        dt_matmul_fwd(&C, &wo, &wa, &wb, 0, 0, 1.0f, 0.0f);
        memcpy(want, wo.data, 36);
        dt_test_allclose("matmul_out_adjacent_equals_separate_buffers", F(&out), want, 9, 0, 0);
        dt_tensor_free(&C, &wa); dt_tensor_free(&C, &wb); dt_tensor_free(&C, &wo);
    }
    dt_tensor_view(&C, &w, &buf, 27, 2, SH(3, 3));
    dt_tensor_view(&C, &x, &buf, 36, 2, SH(3, 3));
    st = dt_linear_fwd(&C, &x, &x, &w, NULL);
    dt_test_error("linear_out_aliasing_x_is_named", st, dt_ctx_error(&C), "dt_linear_fwd: out shares memory with x");
    st = dt_linear_bwd(&C, &w, NULL, NULL, &a, &x, &w);
    dt_test_error("linear_bwd_dx_aliasing_w_is_named", st, dt_ctx_error(&C), "dt_linear_bwd: dx shares memory with w");
    { /* dbias over dw (both added into): named */
        dt_tensor dw3 = mk(DT_F32, 2, SH(3, 3)), db3;
        dt_tensor_view(&C, &db3, &dw3, 3, 1, SH(3));
        st = dt_linear_bwd(&C, NULL, &dw3, &db3, &a, &x, &w);
        dt_test_error("linear_bwd_dbias_inside_dw_is_named", st, dt_ctx_error(&C), "dt_linear_bwd: dbias shares memory with dw");
        dt_tensor_free(&C, &dw3);
    }
    { /* dt_linear_gelu_fwd: pre is the GELU's input, kept for the backward: out may not overlap it */
        dt_tensor o2 = mk(DT_F32, 2, SH(3, 3)), p2 = mk(DT_F32, 2, SH(3, 3)), p4 = mk(DT_F32, 2, SH(3, 4)), pi;
        st = dt_linear_gelu_fwd(&C, &x, &o2, &x, &w, NULL);
        dt_test_error("linear_gelu_out_aliasing_x_is_named", st, dt_ctx_error(&C),
                      "dt_linear_gelu_fwd: out shares memory with x");
        st = dt_linear_gelu_fwd(&C, &o2, &w, &x, &w, NULL);
        dt_test_error("linear_gelu_pre_aliasing_w_is_named", st, dt_ctx_error(&C),
                      "dt_linear_gelu_fwd: pre shares memory with w");
        st = dt_linear_gelu_fwd(&C, &o2, &o2, &x, &w, NULL);
        dt_test_error("linear_gelu_out_is_pre_is_named", st, dt_ctx_error(&C), "dt_linear_gelu_fwd: out shares memory with pre");
        st = dt_linear_gelu_fwd(&C, &o2, NULL, &x, &w, NULL);
        dt_test_error("linear_gelu_pre_null_is_named", st, dt_ctx_error(&C), "dt_linear_gelu_fwd: pre is NULL");
        st = dt_linear_gelu_fwd(&C, &o2, &p2, NULL, &w, NULL);
        dt_test_error("linear_gelu_x_null_is_named", st, dt_ctx_error(&C), "dt_linear_gelu_fwd");
        st = dt_linear_gelu_fwd(&C, &o2, &p4, &x, &w, NULL);
        dt_test_error("linear_gelu_pre_of_wrong_shape_is_named", st, dt_ctx_error(&C), "dt_linear_gelu_fwd: pre");
        st = dt_linear_gelu_fwd(&C, &p4, &p2, &x, &w, NULL);
        dt_test_error("linear_gelu_out_of_wrong_shape_is_named", st, dt_ctx_error(&C), "dt_linear_gelu_fwd: out");
        pi = mk(DT_I32, 2, SH(3, 3));
        st = dt_linear_gelu_fwd(&C, &pi, &p2, &x, &w, NULL);
        dt_test_error("linear_gelu_int_out_is_named", st, dt_ctx_error(&C), "dt_linear_gelu_fwd: out");
        DT_TEST_CHECK("linear_gelu_null_ctx_is_an_error", dt_linear_gelu_fwd(NULL, &o2, &p2, &x, &w, NULL) == DT_ERR_ARG);
        dt_tensor_free(&C, &o2); dt_tensor_free(&C, &p2); dt_tensor_free(&C, &p4); dt_tensor_free(&C, &pi);
    }
    /* concat / split: a part that is a view of the whole */
    whole = mk(DT_F32, 2, SH(2, 5));
    rnd(&whole, "whole");
    dt_tensor_view(&C, &part[0], &whole, 0, 2, SH(2, 3));
    part[1] = mk(DT_F32, 2, SH(2, 2));
    ins[0] = &part[0]; ins[1] = &part[1];
    st = dt_concat_fwd(&C, &whole, ins, 2);
    dt_test_error("concat_part_inside_out_is_named", st, dt_ctx_error(&C), "shares memory with part 0");
    dt_tensor_view(&C, &part[0], &whole, 2, 2, SH(2, 3));
    outs[0] = &part[0]; outs[1] = &part[1];
    st = dt_split_fwd(&C, outs, 2, &whole);
    dt_test_error("split_part_inside_in_is_named", st, dt_ctx_error(&C), "dt_split_fwd");
    /* embedding: out a view of the table */
    tab = mk(DT_F32, 2, SH(5, 2));
    rnd(&tab, "tab");
    ids = mk(DT_I32, 1, SH(2));
    ((int32_t *)ids.data)[0] = ((int32_t *)ids.data)[1] = 0;
    dt_tensor_view(&C, &out, &tab, 1, 2, SH(2, 2));
    st = dt_embedding_fwd(&C, &out, &tab, &ids);
    dt_test_error("embedding_out_inside_table_is_named", st, dt_ctx_error(&C), "dt_embedding_fwd: out shares memory with table");
    dt_tensor_free(&C, &part[1]); dt_tensor_free(&C, &whole); dt_tensor_free(&C, &tab); dt_tensor_free(&C, &ids);
    { /* layernorm: mean and rstd are written while x is read, the backward adds into dx, dw, db
         while it reads the rest (on CUDA the dw / db pass reads x after the dx pass: dx over x
         gave wrong dw there); out may be x itself (in place, tests/test_tensor_ops_simd.c) */
        dt_tensor lb = mk(DT_F32, 1, SH(40)), lx, lo, lm, lr, lw, ld, dw2, db2;
        rnd(&lb, "ln");
        dt_tensor_view(&C, &lx, &lb, 0, 2, SH(3, 4));
        dt_tensor_view(&C, &lo, &lb, 12, 2, SH(3, 4));
        dt_tensor_view(&C, &lw, &lb, 24, 1, SH(4));
        dt_tensor_view(&C, &lm, &lb, 28, 1, SH(3));
        dt_tensor_view(&C, &lr, &lb, 31, 1, SH(3));
        dt_tensor_view(&C, &ld, &lb, 34, 1, SH(3));
        st = dt_layernorm_fwd(&C, &lo, &lm, &lr, &lx, &lw, NULL, 1e-5f);
        DT_TEST_CHECK("layernorm_outputs_beside_inputs_in_one_buffer_run", st == DT_OK);
        dt_tensor_view(&C, &ld, &lb, 10, 1, SH(3)); /* x's last row */
        st = dt_layernorm_fwd(&C, &lo, &ld, &lr, &lx, &lw, NULL, 1e-5f);
        dt_test_error("layernorm_mean_inside_x_is_named", st, dt_ctx_error(&C), "dt_layernorm_fwd: mean shares memory with x");
        dt_tensor_view(&C, &ld, &lb, 29, 1, SH(3)); /* over mean */
        st = dt_layernorm_fwd(&C, &lo, &lm, &ld, &lx, &lw, NULL, 1e-5f);
        dt_test_error("layernorm_rstd_over_mean_is_named", st, dt_ctx_error(&C), "dt_layernorm_fwd: mean shares memory with rstd");
        dt_tensor_view(&C, &ld, &lb, 2, 2, SH(3, 4)); /* x shifted by two: not x itself */
        st = dt_layernorm_fwd(&C, &ld, &lm, &lr, &lx, &lw, NULL, 1e-5f);
        dt_test_error("layernorm_out_overlapping_x_is_named", st, dt_ctx_error(&C), "dt_layernorm_fwd: out shares memory with x");
        st = dt_layernorm_fwd(&C, &lo, &lm, &lr, &lx, &lw, NULL, 1e-5f);
        if (DT_TEST_CHECK("layernorm_forward_for_the_backward_runs", st == DT_OK)) {
            st = dt_layernorm_bwd(&C, &lx, NULL, NULL, &lo, &lx, &lw, &lm, &lr);
            dt_test_error("layernorm_bwd_dx_is_x_is_named", st, dt_ctx_error(&C), "dt_layernorm_bwd: dx shares memory with x");
            st = dt_layernorm_bwd(&C, &lo, NULL, NULL, &lo, &lx, &lw, &lm, &lr);
            dt_test_error("layernorm_bwd_dx_is_dout_is_named", st, dt_ctx_error(&C), "dt_layernorm_bwd: dx shares memory with dout");
            dw2 = mk(DT_F32, 1, SH(4));
            dt_tensor_view(&C, &db2, &dw2, 0, 1, SH(4));
            st = dt_layernorm_bwd(&C, NULL, &dw2, &db2, &lo, &lx, &lw, &lm, &lr);
            dt_test_error("layernorm_bwd_db_over_dw_is_named", st, dt_ctx_error(&C), "dt_layernorm_bwd: dw shares memory with db");
            st = dt_layernorm_bwd(&C, NULL, &lw, NULL, &lo, &lx, &lw, &lm, &lr);
            dt_test_error("layernorm_bwd_dw_is_w_is_named", st, dt_ctx_error(&C), "dt_layernorm_bwd: dw shares memory with w");
            dt_tensor_free(&C, &dw2);
        }
        dt_tensor_free(&C, &lb);
    }
    { /* attention backward: dqkv accumulates while qkv, dout and att are read (f32, the CPU) */
        dt_tensor qkv = mk(DT_F32, 3, SH(1, 4, 6)), ao = mk(DT_F32, 3, SH(1, 4, 2)), att = mk(DT_F32, 4, SH(1, 1, 4, 4)),
                  dq = mk(DT_F32, 3, SH(1, 4, 6)), dout;
        rnd(&qkv, "qkv");
        st = dt_attention_fwd(&C, &ao, &att, &qkv, 1);
        if (DT_TEST_CHECK("attention_forward_for_the_backward_runs", st == DT_OK)) {
            st = dt_attention_bwd(&C, &qkv, &ao, &qkv, &att, 1);
            dt_test_error("attention_bwd_dqkv_is_qkv_is_named", st, dt_ctx_error(&C), "dt_attention_bwd: dqkv shares memory with qkv");
            dt_tensor_view(&C, &dout, &dq, 0, 3, SH(1, 4, 2));
            st = dt_attention_bwd(&C, &dq, &dout, &qkv, &att, 1);
            dt_test_error("attention_bwd_dout_inside_dqkv_is_named", st, dt_ctx_error(&C), "dt_attention_bwd: dqkv shares memory with dout");
            st = dt_attention_bwd(&C, &dq, &ao, &qkv, &att, 1);
            DT_TEST_CHECK("attention_bwd_apart_runs", st == DT_OK);
        }
        dt_tensor_free(&C, &qkv); dt_tensor_free(&C, &ao); dt_tensor_free(&C, &att); dt_tensor_free(&C, &dq);
    }
    dt_tensor_free(&C, &buf);
}

/* The ops that read one tensor while they write another, each with an output over an input (an
   audit found each returning DT_OK with numbers off by up to units): named, and the in-place ops
   still run in place exactly (the same tensor) but not over a shifted view of it. */
static void test_aliasing_ops(void) {
    dt_tensor buf = mk(DT_F32, 1, SH(256)), a, b, c, d, e;
    dt_status st;
    float sep[16];
    int i;
    rnd(&buf, "alias_ops");
#define V(t, off, ...) dt_tensor_view(&C, &t, &buf, off, (int)(sizeof(SH(__VA_ARGS__)) / sizeof(int64_t)), SH(__VA_ARGS__))
    /* matmul / linear backward: da over a (the dw GEMM then reads the new x) */
    V(a, 0, 4, 4); V(b, 16, 4, 4); V(c, 32, 4, 4); V(d, 48, 4, 4);
    st = dt_matmul_bwd(&C, &a, &d, &c, &a, &b, 0, 0, 1.0f);
    dt_test_error("matmul_bwd_da_over_a_is_named", st, dt_ctx_error(&C), "dt_matmul_bwd: da shares memory with a");
    st = dt_linear_bwd(&C, &a, &d, NULL, &c, &a, &b);
    dt_test_error("linear_bwd_dx_over_x_is_named", st, dt_ctx_error(&C), "dt_linear_bwd: dx shares memory with x");
    st = dt_matmul_bwd(&C, &d, &b, &c, &a, &b, 0, 0, 1.0f);
    dt_test_error("matmul_bwd_db_over_b_is_named", st, dt_ctx_error(&C), "dt_matmul_bwd: db shares memory with b");
    /* bias */
    V(d, 0, 4);
    dt_test_error("bias_add_bias_in_out_is_named", dt_bias_add_fwd(&C, &a, &d), dt_ctx_error(&C),
                  "dt_bias_add_fwd: out shares memory with bias");
    dt_test_error("bias_add_bwd_dbias_in_dout_is_named", dt_bias_add_bwd(&C, &d, &a), dt_ctx_error(&C),
                  "dt_bias_add_bwd: dbias shares memory with dout");
    /* the in-place ops: the same tensor runs (and equals separate buffers); a shifted view is named */
    V(a, 0, 16); V(b, 2, 16); V(c, 32, 16); V(e, 64, 16);
    dt_gelu_fwd(&C, &e, &a);
    memcpy(sep, F(&e), sizeof sep);
    memcpy(F(&c), F(&a), sizeof sep);
    st = dt_gelu_fwd(&C, &c, &c);
    if (DT_TEST_CHECK("gelu_in_place_runs", st == DT_OK))
        dt_test_allclose("gelu_in_place_equals_separate_buffers", F(&c), sep, 16, 0, 0);
    dt_test_error("gelu_out_shifted_over_x_is_named", dt_gelu_fwd(&C, &b, &a), dt_ctx_error(&C),
                  "dt_gelu_fwd: out shares memory with x");
    dt_test_error("relu_out_shifted_over_x_is_named", dt_relu_fwd(&C, &b, &a), dt_ctx_error(&C),
                  "dt_relu_fwd: out shares memory with x");
    dt_test_error("gelu_bwd_dx_shifted_over_dout_is_named", dt_gelu_bwd(&C, &b, &a, &c), dt_ctx_error(&C),
                  "dt_gelu_bwd: dx shares memory with dout");
    dt_test_error("relu_bwd_dx_shifted_over_x_is_named", dt_relu_bwd(&C, &b, &c, &a), dt_ctx_error(&C),
                  "dt_relu_bwd: dx shares memory with x");
    dt_test_error("add_out_shifted_over_a_is_named", dt_add(&C, &b, &a, &c), dt_ctx_error(&C),
                  "dt_add: out shares memory with a");
    DT_TEST_CHECK("add_in_place_runs", dt_add(&C, &c, &c, &e) == DT_OK);
    dt_test_error("mul_out_shifted_over_b_is_named", dt_mul_fwd(&C, &b, &c, &a), dt_ctx_error(&C),
                  "dt_mul_fwd: out shares memory with b");
    dt_test_error("axpy_y_shifted_over_x_is_named", dt_axpy(&C, &b, 0.5f, &a), dt_ctx_error(&C),
                  "dt_axpy: y shares memory with x");
    DT_TEST_CHECK("axpy_in_place_runs", dt_axpy(&C, &c, 0.5f, &c) == DT_OK);
    dt_test_error("mul_bwd_da_over_dout_is_named", dt_mul_bwd(&C, &a, &e, &a, &c, &e), dt_ctx_error(&C),
                  "dt_mul_bwd: da shares memory with dout");
    DT_TEST_CHECK("mul_bwd_da_is_db_runs", dt_mul_bwd(&C, &e, &e, &c, &a, &a) == DT_OK); /* x * x */
    /* softmax cross entropy: probs over a shifted logits */
    {
        dt_tensor tg = mk(DT_I32, 1, SH(2));
        float loss;
        ((int32_t *)tg.data)[0] = 1; ((int32_t *)tg.data)[1] = 2;
        V(a, 0, 2, 8); V(b, 4, 2, 8);
        dt_test_error("softmax_xent_probs_shifted_over_logits_is_named",
                      dt_softmax_xent_fwd(&C, &loss, NULL, &b, &a, &tg, -1), dt_ctx_error(&C),
                      "dt_softmax_xent_fwd: probs shares memory with logits");
        dt_test_error("softmax_xent_bwd_dlogits_shifted_over_probs_is_named",
                      dt_softmax_xent_bwd(&C, &b, &a, &tg, -1, 1.0f), dt_ctx_error(&C),
                      "dt_softmax_xent_bwd: dlogits shares memory with probs");
        V(c, 32, 2, 8);
        memcpy(F(&c), F(&a), 16 * sizeof(float));
        DT_TEST_CHECK("softmax_xent_in_place_runs", dt_softmax_xent_fwd(&C, &loss, NULL, &c, &c, &tg, -1) == DT_OK);
        dt_tensor_free(&C, &tg);
    }
    /* embedding backward: dtable over dout */
    {
        dt_tensor ids = mk(DT_I32, 1, SH(4));
        for (i = 0; i < 4; i++) ((int32_t *)ids.data)[i] = 3 - i;
        V(a, 0, 4, 4); V(b, 8, 4, 4);
        dt_test_error("embedding_bwd_dtable_over_dout_is_named", dt_embedding_bwd(&C, &a, &b, &ids), dt_ctx_error(&C),
                      "dt_embedding_bwd: dtable shares memory with dout");
        dt_tensor_free(&C, &ids);
    }
    /* dot interaction backward: demb is emb */
    {
        V(a, 0, 2, 3); V(b, 8, 2, 2, 3); V(c, 32, 2, 6);
        dt_test_error("dot_interaction_bwd_demb_is_emb_is_named", dt_dot_interaction_bwd(&C, NULL, &b, &c, &a, &b),
                      dt_ctx_error(&C), "dt_dot_interaction_bwd: demb shares memory with emb");
    }
    /* split: two parts over each other */
    {
        dt_tensor *outs[2];
        V(a, 0, 2, 6); V(b, 32, 2, 3); V(c, 33, 2, 3);
        outs[0] = &b; outs[1] = &c;
        dt_test_error("split_parts_over_each_other_are_named", dt_split_fwd(&C, outs, 2, &a), dt_ctx_error(&C),
                      "dt_split_fwd: part 1 shares memory with part 0");
    }
    /* attention block: out over kv */
    {
        dt_attn_block ab;
        memset(&ab, 0, sizeof ab);
        ab.n_head = 1; ab.q_rows = 4; ab.k_rows = 4;
        V(a, 0, 1, 4, 2); V(b, 16, 1, 4, 4); V(c, 18, 1, 4, 2); V(d, 64, 1, 1, 4);
        dt_test_error("attention_block_out_over_kv_is_named", dt_attention_block_fwd(&C, &c, &d, &a, &b, &ab),
                      dt_ctx_error(&C), "dt_attention_block_fwd: out shares memory with kv");
    }
    /* the predicate the checks share */
    V(a, 0, 4, 4); V(b, 0, 16); V(c, 2, 16); V(d, 16, 4);
    DT_TEST_CHECK("tensor_overlap_same_elements_is_2", dt_tensor_overlap(&a, &b) == 2);
    DT_TEST_CHECK("tensor_overlap_shifted_view_is_1", dt_tensor_overlap(&b, &c) == 1 && dt_tensor_overlap(&c, &b) == 1);
    DT_TEST_CHECK("tensor_overlap_adjacent_is_0", dt_tensor_overlap(&b, &d) == 0 && dt_tensor_overlap(&d, &b) == 0);
    DT_TEST_CHECK("tensor_overlap_null_is_0", dt_tensor_overlap(NULL, &b) == 0 && dt_tensor_overlap(&b, NULL) == 0);
#undef V
    dt_tensor_free(&C, &buf);
}

/* Messages that name what is wrong: a ctx never initialised, a directory given as a safetensors
   file, metadata without a key or repeating one, dt_grow's arguments, layernorm's eps. */
static void test_messages(void) {
    dt_ctx z;
    dt_tensor t, x, wln, bln, y;
    dt_tensor_desc d;
    dt_st_file f;
    dt_status st;
    void *items = NULL;
    int64_t cap = -5;
    char path[1200];
    const char *meta_null[2] = {"k", NULL}, *meta_dup[4] = {"k", "v", "k", "w"};
    const dt_tensor *ts[1];
    const char *names[1] = {"t"};
    memset(&z, 0, sizeof z);
    memset(&d, 0, sizeof d);
    d.dtype = DT_F32; d.shape[0] = 4;
    st = dt_tensor_create(&z, &t, &d);
    dt_test_error("create_on_a_zeroed_ctx_is_named", st, dt_ctx_error(&z), "the ctx is not initialised");
    DT_TEST_CHECK("create_on_a_zeroed_ctx_is_a_state_error", st == DT_ERR_STATE);
    st = dt_safetensors_open(&C, &f, dt_test_tmpdir());
    dt_test_error("safetensors_open_of_a_directory_is_named", st, dt_ctx_error(&C), "Is a directory");
    x = mk(DT_F32, 1, SH(2));
    ts[0] = &x;
    tmp_path(path, sizeof path, "meta.safetensors");
    st = dt_safetensors_save(&C, path, ts, names, 1, meta_null, 1);
    dt_test_error("safetensors_meta_null_value_is_named", st, dt_ctx_error(&C), "meta pair 0 has a NULL value");
    st = dt_safetensors_save(&C, path, ts, names, 1, meta_dup, 2);
    dt_test_error("safetensors_meta_repeated_key_is_named", st, dt_ctx_error(&C), "meta key 1 \"k\" repeats key 0");
    st = dt_safetensors_save(&C, path, ts, names, 1, NULL, 3);
    dt_test_error("safetensors_meta_null_is_named", st, dt_ctx_error(&C), "n_meta = 3 pairs but meta is NULL");
    st = dt_grow(&C, &items, &cap, 4, 4, "rows");
    dt_test_error("grow_negative_cap_is_named", st, dt_ctx_error(&C), "dt_grow: rows: *cap = -5; expected >= 0");
    y = mk(DT_F32, 2, SH(2, 4));
    wln = mk(DT_F32, 1, SH(4));
    bln = mk(DT_F32, 1, SH(4));
    {
        dt_tensor xin = mk(DT_F32, 2, SH(2, 4));
        rnd(&xin, "ln");
        st = dt_layernorm_fwd(&C, &y, NULL, NULL, &xin, &wln, &bln, INFINITY);
        dt_test_error("layernorm_inf_eps_is_named", st, dt_ctx_error(&C), "eps = inf; expected a finite eps > 0");
        dt_tensor_free(&C, &xin);
    }
    dt_tensor_free(&C, &x); dt_tensor_free(&C, &y); dt_tensor_free(&C, &wln); dt_tensor_free(&C, &bln);
}

int main(void) {
    dt_ctx_desc cd;
    dt_ctx_init(&C, NULL);
    memset(&cd, 0, sizeof cd);
    cd.allocator.alloc_fn = cap_alloc;
    cd.allocator.release_fn = cap_release;
    dt_ctx_init(&CAP, &cd);

    test_mul_ok_and_numel();
    test_overflow_shapes();
    test_safetensors_overflow();
    test_empty_create();
    test_empty_ops();
    test_empty_params_and_safetensors();
    test_float_to_int();
    test_convert_pairs();
    test_bad_structs();
    test_strbuf();
    test_relu_nan();
    test_null_grads();
    test_create_like();
    test_aliasing();
    test_aliasing_ops();
    test_messages();
    dt_ctx_shutdown(&CAP);
    test_huge_dims_in_empty_tensors(); /* last: a UBSan report here ends the asan run */

    dt_ctx_shutdown(&C);
    DT_TEST_CHECK("all_bytes_returned", C.bytes_in_use == 0 && CAP.bytes_in_use == 0);
    return dt_test_finish();
}
