// emu-tsan: skip (no kernel of its own beyond fill and the range check, which run in every mode)
// tests/cuda_emu/k_core.cpp - the CUDA core of dt_tensor.h that a device-resident step builds on
// (">>ctx": CUDA memory and waits), on the emulator:
//   - ctx->counters count every allocation, free, copy by direction and wait that dt makes, and
//     agree with what the runtime itself saw (dt_emu_get_counters) over the same calls;
//   - dt_tensor_fill runs on the device for every dtype (no copy, no wait) and gives the CPU fill's
//     bits; dt_tensor_copy device->device and host->device do not wait, device->host waits once;
//   - the stream-ordered scratch: 256-byte aligned, nested ops, growth during a first "step", one
//     block and no allocation in the next identical step, misuse named;
//   - the device range check: a bad id is reported by the next dt_ctx_sync as DT_ERR_RANGE naming
//     the op, the argument, the smallest bad index and its value; the first failure is kept; it is
//     reported once; skip values pass;
//   - dt_cuda_read_loss reads the loss slot in one copy and one wait;
//   - a copy CUDA refuses is named, and leaves no error for the next kernel;
//   - dt_ctx_init names a bad device ordinal.
#define DT_CUDA
#include "dt_tensor.h"
#include "k_common.h"

#include <string>
#include <vector>

static dt_ctx ctx;

// The difference of two snapshots, as one struct for both sources.
struct counts {
    long long syncs, allocs, frees, h2d_bytes, h2d_calls, d2h_bytes, d2h_calls;
};
static counts from_ctx(void) {
    const dt_cuda_counters &c = ctx.counters;
    counts r = {c.syncs, c.allocs, c.frees, c.h2d_bytes, c.h2d_calls, c.d2h_bytes, c.d2h_calls};
    return r;
}
static counts from_emu(void) {
    dt_emu_counters c;
    dt_emu_get_counters(&c);
    counts r = {c.syncs, c.allocs, c.frees, c.h2d_bytes, c.h2d_calls, c.d2h_bytes, c.d2h_calls};
    return r;
}
static counts minus(counts a, counts b) {
    counts r = {a.syncs - b.syncs, a.allocs - b.allocs, a.frees - b.frees, a.h2d_bytes - b.h2d_bytes,
                a.h2d_calls - b.h2d_calls, a.d2h_bytes - b.d2h_bytes, a.d2h_calls - b.d2h_calls};
    return r;
}
static std::string str(counts c) {
    char b[256];
    snprintf(b, sizeof b, "syncs %lld allocs %lld frees %lld h2d_bytes %lld h2d_calls %lld d2h_bytes %lld d2h_calls %lld",
             c.syncs, c.allocs, c.frees, c.h2d_bytes, c.h2d_calls, c.d2h_bytes, c.d2h_calls);
    return b;
}

// Runs f; checks the ctx counted exactly `want` and the runtime saw the same.
template <typename F> static void expect_counts(const char *name, counts want, F f) {
    counts c0 = from_ctx(), e0 = from_emu();
    f();
    counts dc = minus(from_ctx(), c0), de = minus(from_emu(), e0);
    std::string sw = str(want), sc = str(dc), se = str(de);
#ifdef DT_EMU_STUBS /* a real GPU: the runtime does not count for us; the ctx's counts are checked alone */
    se = sw;
#endif
    if (sc == sw && se == sw) dt_test_pass(name);
    else dt_test_fail(name, "expected %s; ctx counted %s; the runtime saw %s", sw.c_str(), sc.c_str(), se.c_str());
}

static dt_tensor make(dt_dtype dt, dt_device dev, int64_t n) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.device = dev;
    d.shape[0] = n;
    d.ndim = 1;
    if (dt_tensor_create(&ctx, &t, &d)) {
        fprintf(stderr, "dt_tensor_create: %s\n", dt_ctx_error(&ctx));
        exit(2);
    }
    return t;
}

static void test_counters_and_copies(void) {
    const int64_t n = 1000;
    const counts none = {0, 0, 0, 0, 0, 0, 0};
    dt_tensor h = make(DT_F32, DT_CPU, n), d, d2;
    for (int64_t i = 0; i < n; i++) ((float *)h.data)[i] = (float)i - 3.5f;
    counts one_alloc = {0, 1, 0, 0, 0, 0, 0};
    expect_counts("create_cuda_tensor_counts_one_alloc", one_alloc, [&] { d = make(DT_F32, DT_CUDA_DEVICE, n); });
    d2 = make(DT_F32, DT_CUDA_DEVICE, n);
    counts up = {0, 0, 0, n * 4, 1, 0, 0};
    expect_counts("copy_host_to_device_counts_bytes_and_does_not_wait", up, [&] { dt_tensor_copy(&ctx, &d, &h); });
    expect_counts("copy_device_to_device_counts_nothing", none, [&] { dt_tensor_copy(&ctx, &d2, &d); });
    dt_tensor back = make(DT_F32, DT_CPU, n);
    counts down = {1, 0, 0, n * 4, 0, 0, 0};
    down.h2d_bytes = 0, down.d2h_bytes = n * 4, down.d2h_calls = 1;
    expect_counts("copy_device_to_host_counts_bytes_and_one_wait", down, [&] { dt_tensor_copy(&ctx, &back, &d2); });
    DT_TEST_CHECK("copies_round_trip_the_values", memcmp(back.data, h.data, n * 4) == 0);
    counts one_free = {0, 0, 1, 0, 0, 0, 0};
    expect_counts("free_cuda_tensor_counts_one_free", one_free, [&] { dt_tensor_free(&ctx, &d2); });
    dt_ctx_counters_reset(&ctx);
    counts zero = from_ctx();
    DT_TEST_CHECK("counters_reset_zeroes_every_field", str(zero) == str(none));
    dt_tensor_free(&ctx, &d);
    dt_tensor_free(&ctx, &h);
    dt_tensor_free(&ctx, &back);
}

// Every dtype: the device fill gives the CPU fill's bytes, and moves nothing.
static void test_fill(void) {
    const counts none = {0, 0, 0, 0, 0, 0, 0};
    struct { dt_dtype dt; double v; const char *tag; } cases[] = {
        {DT_F32, 1.5, "f32"}, {DT_F32, -0.0, "f32_negative_zero"}, {DT_F32, 0.0, "f32_zero"}, {DT_BF16, -3.25, "bf16"},
        {DT_F16, 0.1, "f16"}, {DT_I32, -7, "i32"}, {DT_I64, 1e15, "i64"}, {DT_U8, 200, "u8"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int64_t n = 777;
        char name[128];
        dt_tensor d = make(cases[k].dt, DT_CUDA_DEVICE, n), c = make(cases[k].dt, DT_CPU, n),
                  back = make(cases[k].dt, DT_CPU, n);
        dt_tensor_fill(&ctx, &d, 99); // something else first: the fill must overwrite
        snprintf(name, sizeof name, "fill_on_device_moves_nothing_%s", cases[k].tag);
        expect_counts(name, none, [&] { dt_tensor_fill(&ctx, &d, cases[k].v); });
        dt_tensor_fill(&ctx, &c, cases[k].v);
        dt_tensor_copy(&ctx, &back, &d);
        snprintf(name, sizeof name, "fill_on_device_gives_the_cpu_bits_%s", cases[k].tag);
        if (memcmp(back.data, c.data, dt_tensor_bytes(&c)) == 0) dt_test_pass(name);
        else {
            unsigned long long gb = 0, wb = 0;
            memcpy(&gb, back.data, dt_dtype_size(c.dtype));
            memcpy(&wb, c.data, dt_dtype_size(c.dtype));
            dt_test_fail(name, "element 0: device bits %#llx, cpu bits %#llx", gb, wb);
        }
        dt_tensor_free(&ctx, &d), dt_tensor_free(&ctx, &c), dt_tensor_free(&ctx, &back);
    }
    dt_tensor i8 = make(DT_U8, DT_CUDA_DEVICE, 4);
    dt_status st = dt_tensor_fill(&ctx, &i8, 300);
    DT_TEST_CHECK("fill_out_of_range_on_device_is_named", st == DT_ERR_RANGE && strstr(dt_ctx_error(&ctx), "300"));
    dt_tensor_free(&ctx, &i8);
}

// A "step" of three ops, one nested in another, each taking scratch.
static int step_ops(size_t big, void **seen) {
    size_t m0 = dt_cuda_scratch_begin(&ctx);
    void *a = dt_cuda_scratch(&ctx, 1000, "op_a");
    size_t m1 = dt_cuda_scratch_begin(&ctx); // a nested op
    void *b = dt_cuda_scratch(&ctx, big, "op_b");
    void *c = dt_cuda_scratch(&ctx, 10, "op_b");
    dt_cuda_scratch_end(&ctx, m1);
    dt_cuda_scratch_end(&ctx, m0);
    size_t m2 = dt_cuda_scratch_begin(&ctx);
    void *d = dt_cuda_scratch(&ctx, 3 * big, "op_c");
    dt_cuda_scratch_end(&ctx, m2);
    seen[0] = a, seen[1] = b, seen[2] = c, seen[3] = d;
    int ok = a && b && c && d;
    for (int i = 0; i < 4; i++) ok = ok && ((uintptr_t)seen[i] % 256) == 0;
    // the live ones do not overlap
    ok = ok && ((char *)b >= (char *)a + 1000 || (char *)b + big <= (char *)a);
    ok = ok && ((char *)c >= (char *)b + big || (char *)c + 10 <= (char *)b);
    return ok;
}

static void test_scratch(void) {
    void *seen[4];
    const counts none = {0, 0, 0, 0, 0, 0, 0};
    const size_t big = (size_t)3 << 20; // more than the first block: growth while op_a holds scratch
    int ok1 = 0, ok2 = 0, ok3 = 0;
    counts c0 = from_ctx();
    ok1 = step_ops(big, seen);
    counts first = minus(from_ctx(), c0);
    DT_TEST_CHECK("scratch_is_aligned_and_live_pieces_do_not_overlap", ok1);
    if (first.allocs >= 1 && first.allocs <= 4) dt_test_pass("scratch_first_step_allocates_a_few_blocks");
    else dt_test_fail("scratch_first_step_allocates_a_few_blocks", "allocs %lld; expected 1..4", first.allocs);
    // the second step merges what the first used into one block (a free per old block, one alloc) ...
    ok2 = step_ops(big, seen);
    DT_TEST_CHECK("scratch_second_step_has_one_block", ok2 && ctx.cuda_scratch_chunks == 1);
    // ... and from then on nothing is allocated or freed
    expect_counts("scratch_third_step_allocates_nothing", none, [&] { ok3 = step_ops(big, seen); });
    DT_TEST_CHECK("scratch_third_step_still_correct", ok3);
    // misuse: outside begin/end, and an absurd size
    void *p = dt_cuda_scratch(&ctx, 16, "lonely_op");
    DT_TEST_CHECK("scratch_outside_begin_is_named",
                  !p && ctx.last_status == DT_ERR_ARG && strstr(dt_ctx_error(&ctx), "lonely_op"));
    size_t m = dt_cuda_scratch_begin(&ctx);
    p = dt_cuda_scratch(&ctx, (size_t)1 << 60, "greedy_op");
    dt_cuda_scratch_end(&ctx, m);
    DT_TEST_CHECK("scratch_too_large_is_named",
                  !p && ctx.last_status == DT_ERR_OOM && strstr(dt_ctx_error(&ctx), "greedy_op"));
    DT_TEST_CHECK("scratch_depth_back_to_zero", ctx.cuda_scratch_depth == 0);
}

static void test_range_checks(void) {
    const counts none = {0, 0, 0, 0, 0, 0, 0};
    std::vector<int32_t> good(3000), bad(3000);
    for (int i = 0; i < 3000; i++) good[i] = bad[i] = i % 50;
    bad[2999] = 77, bad[1234] = -5, bad[2500] = 50; // smallest bad index: 1234
    int32_t *dg = k_upload(good), *db = k_upload(bad);
    std::vector<int64_t> bad64(70, 3);
    bad64[69] = (int64_t)1 << 40;
    int64_t *db64 = k_upload(bad64);
    dt_ctx_clear_error(&ctx);
    expect_counts("range_check_queues_without_waiting", none, [&] {
        dt_cuda_check_range(&ctx, dg, DT_I32, 3000, 0, 50, 0, 0, "dt_embedding_fwd", "ids");
    });
    dt_status st = dt_ctx_sync(&ctx);
    DT_TEST_CHECK("range_check_of_good_ids_syncs_clean", st == DT_OK);
    dt_cuda_check_range(&ctx, db, DT_I32, 3000, 0, 50, 0, 0, "dt_embedding_fwd", "ids");
    dt_cuda_check_range(&ctx, db64, DT_I64, 70, 0, 50, 0, 0, "dt_tp_xent_fwd", "targets"); // later: not reported
    counts one_read = {1, 0, 0, 0, 0, 64, 1};
    expect_counts("sync_with_pending_checks_reads_the_word_once", one_read, [&] { st = dt_ctx_sync(&ctx); });
    const char *msg = dt_ctx_error(&ctx);
    if (st == DT_ERR_RANGE && strstr(msg, "dt_embedding_fwd: ids[1234] = -5 is outside [0, 50)"))
        dt_test_pass("range_check_names_op_arg_smallest_index_and_value");
    else dt_test_fail("range_check_names_op_arg_smallest_index_and_value", "status %s, message \"%s\"",
                      dt_status_name(st), msg);
    st = dt_ctx_sync(&ctx);
    DT_TEST_CHECK("range_check_failure_is_reported_once", st == DT_OK);
    dt_cuda_check_range(&ctx, db64, DT_I64, 70, 0, 50, 0, 0, "dt_tp_xent_fwd", "targets");
    st = dt_ctx_sync(&ctx);
    DT_TEST_CHECK("range_check_i64_names_the_value",
                  st == DT_ERR_RANGE && strstr(dt_ctx_error(&ctx), "targets[69] = 1099511627776"));
    std::vector<int32_t> skip(40, 2);
    skip[7] = -100;
    int32_t *ds = k_upload(skip);
    dt_cuda_check_range(&ctx, ds, DT_I32, 40, 0, 50, 1, -100, "dt_softmax_xent_fwd", "targets");
    DT_TEST_CHECK("range_check_lets_the_skip_value_pass", dt_ctx_sync(&ctx) == DT_OK);
    st = dt_cuda_check_range(&ctx, ds, DT_F32, 40, 0, 50, 0, 0, "dt_embedding_fwd", "ids");
    DT_TEST_CHECK("range_check_of_float_ids_is_named", st == DT_ERR_DTYPE && strstr(dt_ctx_error(&ctx), "f32"));
    // a failed check is also reported by the loss read
    dt_cuda_check_range(&ctx, db, DT_I32, 3000, 0, 50, 0, 0, "dt_embedding_bwd", "ids");
    float loss = 0;
    st = dt_cuda_read_loss(&ctx, &loss, NULL, "test");
    DT_TEST_CHECK("loss_read_reports_a_failed_check",
                  st == DT_ERR_RANGE && strstr(dt_ctx_error(&ctx), "dt_embedding_bwd: ids[1234] = -5"));
}

static void test_loss_slot(void) {
    double v[2] = {2.75, 12};
    cudaMemcpy(dt_cuda_loss_slot(&ctx), v, sizeof v, cudaMemcpyHostToDevice);
    float loss = 0;
    int64_t n = 0;
    counts one_read = {1, 0, 0, 0, 0, 64, 1};
    dt_status st = DT_OK;
    expect_counts("loss_read_is_one_copy_and_one_wait", one_read, [&] { st = dt_cuda_read_loss(&ctx, &loss, &n, "t"); });
    if (st == DT_OK && loss == 2.75f && n == 12) dt_test_pass("loss_read_gives_the_slot");
    else dt_test_fail("loss_read_gives_the_slot", "status %s, loss %g (want 2.75), n_valid %lld (want 12)",
                      dt_status_name(st), loss, (long long)n);
}

/* A copy CUDA refuses (here a host buffer given as the device end) is named once, to its caller:
   it leaves no error behind for the next kernel launch's check to report as its own (a tier HOST
   table's rows passed as a device out made every later dt call of the process fail so). */
static void test_failed_copy(void) {
    dt_tensor d = make(DT_F32, DT_CUDA_DEVICE, 16);
    std::vector<float> host(16, 1.0f);
    int before = dt_emu_report_count();
    dt_status st = dt_cuda_memcpy(&ctx, host.data(), DT_CUDA_DEVICE, d.data, DT_CUDA_DEVICE, 64, "k_core");
    dt_test_error("failed_copy_is_named", st == DT_ERR_CUDA ? st : DT_OK, dt_ctx_error(&ctx), "k_core: cudaMemcpyAsync");
    DT_TEST_CHECK("failed_copy_reaches_the_emulator", dt_emu_report_count() > before);
    st = dt_tensor_fill(&ctx, &d, 2.0f);
    if (st == DT_OK) dt_test_pass("failed_copy_leaves_no_error_for_the_next_kernel");
    else dt_test_fail("failed_copy_leaves_no_error_for_the_next_kernel", "dt_tensor_fill: %s: %s", dt_status_name(st),
                      dt_ctx_error(&ctx));
    dt_tensor_free(&ctx, &d);
}

static void test_init_errors(void) {
    dt_ctx c;
    dt_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.device = DT_CUDA_DEVICE;
    d.cuda_device = 7;
    dt_status st = dt_ctx_init(&c, &d);
    if (st == DT_ERR_ARG && strstr(dt_ctx_error(&c), "desc.cuda_device = 7"))
        dt_test_pass("ctx_init_names_a_missing_device_ordinal");
    else dt_test_fail("ctx_init_names_a_missing_device_ordinal", "status %s, \"%s\"", dt_status_name(st),
                      dt_ctx_error(&c));
    dt_ctx_shutdown(&c);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    dt_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.device = DT_CUDA_DEVICE;
    if (dt_ctx_init(&ctx, &d)) {
        fprintf(stderr, "dt_ctx_init: %s\n", dt_ctx_error(&ctx));
        return 2;
    }
    test_counters_and_copies();
    test_fill();
    test_scratch();
    test_range_checks();
    test_loss_slot();
    test_failed_copy();
    test_init_errors();
    k_free_all();
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
