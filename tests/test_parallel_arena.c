/* tests/test_parallel_arena.c - the flat parameter and gradient arena of dt_parallel.h: moving a
   parameter set into it keeps every value and grad bitwise (compared with copies taken before),
   values become views laid out back to back per dtype and grads back to back in one f32
   buffer, in registration order (checked against offsets summed here by hand), units and
   unit_first follow desc.units, writes through the flat buffers are seen by the params, and
   freeing the arena and the set in either order leaks nothing (the ctx's byte count returns to
   where it was; ASan sees any double free). Bad units are named and leave the set as it was. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_test.h"

static dt_ctx C;

#define NP 6
static const char *names[NP] = {"w1", "b1", "emb", "empty", "w2", "norm"};
static const dt_dtype dtypes[NP] = {DT_F32, DT_F32, DT_BF16, DT_F32, DT_F32, DT_BF16};
static const int64_t shapes[NP][2] = {{3, 5}, {5, 0}, {4, 2}, {0, 4}, {2, 3}, {3, 0}};
static const int ndims[NP] = {2, 1, 2, 2, 2, 1};

static void make_set(dt_params *ps) {
    int i;
    int64_t k;
    memset(ps, 0, sizeof *ps);
    for (i = 0; i < NP; i++) {
        dt_param_desc d;
        dt_param *p;
        memset(&d, 0, sizeof d);
        d.name = names[i];
        d.dtype = dtypes[i];
        d.shape[0] = shapes[i][0];
        d.shape[1] = shapes[i][1];
        d.ndim = ndims[i];
        d.init.kind = DT_INIT_NORMAL;
        d.init.std = 1.0;
        d.init.seed = 5;
        if (dt_params_add(&C, ps, &p, &d)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); exit(2); }
        for (k = 0; k < p->grad.numel; k++) ((float *)p->grad.data)[k] = (float)(i * 100 + k) + 0.25f;
    }
}

/* A copy of every value and grad, as bytes, back to back. */
static unsigned char *snapshot(const dt_params *ps, size_t *n) {
    size_t total = 0, at = 0;
    unsigned char *b;
    int i;
    for (i = 0; i < ps->count; i++) total += dt_tensor_bytes(&ps->items[i]->value) + dt_tensor_bytes(&ps->items[i]->grad);
    b = (unsigned char *)malloc(total + 1);
    for (i = 0; i < ps->count; i++) {
        memcpy(b + at, ps->items[i]->value.data, dt_tensor_bytes(&ps->items[i]->value));
        at += dt_tensor_bytes(&ps->items[i]->value);
        memcpy(b + at, ps->items[i]->grad.data, dt_tensor_bytes(&ps->items[i]->grad));
        at += dt_tensor_bytes(&ps->items[i]->grad);
    }
    *n = total;
    return b;
}

int main(void) {
    dt_params ps;
    dt_arena *a = NULL;
    dt_arena_desc ad;
    unsigned char *before, *after;
    size_t nb, na, base;
    int units[NP] = {0, 0, 1, 1, 1, 2};
    int i, ok;
    dt_status st;
    dt_ctx_init(&C, NULL);
    base = C.bytes_in_use;

    /* values and grads kept, layout by hand */
    make_set(&ps);
    before = snapshot(&ps, &nb);
    memset(&ad, 0, sizeof ad);
    ad.units = units;
    st = dt_arena_create(&C, &a, &ps, &ad);
    if (!DT_TEST_CHECK("arena_create_succeeds", st == DT_OK)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 1; }
    after = snapshot(&ps, &na);
    if (DT_TEST_CHECK("arena_keeps_byte_count", na == nb))
        dt_test_equal_bytes("arena_keeps_values_and_grads_bitwise", after, before, nb);
    free(before);
    free(after);
    {
        int64_t at[DT_DTYPE_COUNT] = {0}, gat = 0;
        char why[200] = "";
        ok = 1;
        for (i = 0; i < NP && ok; i++) {
            dt_param *p = ps.items[i];
            dt_dtype t = dtypes[i];
            char *want_v = (char *)a->values[t].data + (size_t)at[t] * dt_dtype_size(t);
            char *want_g = (char *)a->grads.data + (size_t)gat * 4;
            if (p->value.data != (void *)want_v || p->grad.data != (void *)want_g || a->value_offset[i] != at[t] ||
                a->grad_offset[i] != gat || p->value.owns || p->grad.owns || p->value.ndim != ndims[i] ||
                p->value.shape[0] != shapes[i][0]) {
                snprintf(why, sizeof why, "param %d (%s): value at %lld (want %lld), grad at %lld (want %lld), owns %d %d",
                         i, names[i], (long long)a->value_offset[i], (long long)at[t], (long long)a->grad_offset[i],
                         (long long)gat, p->value.owns, p->grad.owns);
                ok = 0;
            }
            at[t] += p->value.numel;
            gat += p->value.numel;
        }
        if (ok && (a->values[DT_F32].numel != at[DT_F32] || a->values[DT_BF16].numel != at[DT_BF16] ||
                   a->grads.numel != gat || a->values[DT_I32].data || a->values[DT_F16].data)) {
            snprintf(why, sizeof why, "buffers hold %lld f32, %lld bf16, %lld grads; want %lld %lld %lld, no i32/f16",
                     (long long)a->values[DT_F32].numel, (long long)a->values[DT_BF16].numel,
                     (long long)a->grads.numel, (long long)at[DT_F32], (long long)at[DT_BF16], (long long)gat);
            ok = 0;
        }
        if (!ok) dt_test_fail("arena_views_back_to_back_in_registration_order", "%s", why);
        else dt_test_pass("arena_views_back_to_back_in_registration_order");
    }
    DT_TEST_CHECK("arena_units_follow_desc", a->n_units == 3 && a->unit[0] == 0 && a->unit[1] == 0 && a->unit[2] == 1 &&
                  a->unit[4] == 1 && a->unit[5] == 2 && a->unit_first[0] == 0 && a->unit_first[1] == 2 &&
                  a->unit_first[2] == 5 && a->unit_first[3] == NP);
    /* the flat buffers are the params' memory */
    ((float *)a->grads.data)[a->grad_offset[4] + 1] = 42.0f;
    ((float *)a->values[DT_F32].data)[a->value_offset[1] + 2] = -7.0f;
    DT_TEST_CHECK("arena_writes_through_flat_buffers_reach_params",
                  ((float *)ps.items[4]->grad.data)[1] == 42.0f && ((float *)ps.items[1]->value.data)[2] == -7.0f);
    dt_params_zero_grad(&C, &ps);
    {
        int64_t k;
        for (k = 0, ok = 1; k < a->grads.numel; k++) if (((float *)a->grads.data)[k] != 0.0f) ok = 0;
        DT_TEST_CHECK("params_zero_grad_zeroes_the_arena", ok);
    }
    /* free the arena first, then the set */
    dt_arena_free(a);
    dt_params_free(&C, &ps);
    DT_TEST_CHECK("free_arena_then_params_gives_every_byte_back", C.bytes_in_use == base);

    /* the other order, and NULL units: one unit per parameter */
    make_set(&ps);
    st = dt_arena_create(&C, &a, &ps, NULL);
    DT_TEST_CHECK("arena_null_desc_is_one_unit_per_param", st == DT_OK && a->n_units == NP && a->unit[3] == 3 &&
                  a->unit_first[3] == 3 && a->unit_first[NP] == NP);
    dt_params_free(&C, &ps);
    dt_arena_free(a);
    DT_TEST_CHECK("free_params_then_arena_gives_every_byte_back", C.bytes_in_use == base);
    dt_arena_free(NULL); /* a no-op */

    /* an empty set */
    memset(&ps, 0, sizeof ps);
    st = dt_arena_create(&C, &a, &ps, NULL);
    DT_TEST_CHECK("arena_of_empty_set", st == DT_OK && a->n_units == 0 && a->grads.numel == 0 && a->unit_first[0] == 0);
    dt_arena_free(a);
    DT_TEST_CHECK("empty_arena_gives_every_byte_back", C.bytes_in_use == base);

    /* bad input: named, and the set untouched */
    make_set(&ps);
    {
        int gap[NP] = {0, 0, 2, 2, 3, 3}, late[NP] = {1, 1, 1, 1, 1, 1}, down[NP] = {0, 1, 1, 0, 1, 2};
        a = NULL;
        ad.units = gap;
        st = dt_arena_create(&C, &a, &ps, &ad);
        dt_test_error("units_with_a_gap_are_named", st, dt_ctx_error(&C), "desc.units[2] = 2");
        DT_TEST_CHECK("failed_create_leaves_params_owning", a == NULL && ps.items[0]->value.owns == 1 &&
                      ps.items[0]->grad.owns == 1);
        ad.units = late;
        st = dt_arena_create(&C, &a, &ps, &ad);
        dt_test_error("units_not_from_zero_are_named", st, dt_ctx_error(&C), "desc.units[0] = 1");
        ad.units = down;
        st = dt_arena_create(&C, &a, &ps, &ad);
        dt_test_error("decreasing_units_are_named", st, dt_ctx_error(&C), "desc.units[3] = 0");
        st = dt_arena_create(&C, &a, NULL, NULL);
        dt_test_error("null_ps_is_named", st, dt_ctx_error(&C), "ps is NULL");
        st = dt_arena_create(&C, NULL, &ps, NULL);
        dt_test_error("null_out_is_named", st, dt_ctx_error(&C), "out is NULL");
        DT_TEST_CHECK("null_ctx_is_arg_error", dt_arena_create(NULL, &a, &ps, NULL) == DT_ERR_ARG);
    }
    dt_params_free(&C, &ps);
    DT_TEST_CHECK("failed_creates_leak_nothing", C.bytes_in_use == base);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
