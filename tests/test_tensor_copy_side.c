/* tests/test_tensor_copy_side.c - dt_tensor_copy_side / dt_side_wait on the CPU: without a CUDA
   tensor the copy is dt_tensor_copy's, done at once (ticket 0, its wait returns at once), with
   dt_tensor_copy's checks (dtype, element count) as named errors; a NULL ticket and a ticket no
   copy gave are DT_ERR_ARG. The side stream itself (CUDA) is checked on the emulator by
   tests/cuda_emu/mpi_gpt.cpp (activation offload bit for bit, deferred streams). */
#define DT_STATIC
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_test.h"

static dt_ctx C;

static dt_tensor mk(dt_dtype t, int64_t n) {
    dt_tensor x;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = t; d.shape[0] = n;
    if (dt_tensor_create(&C, &x, &d)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); exit(2); }
    return x;
}

int main(void) {
    dt_tensor a, b, c, i;
    uint64_t t = 77;
    int k, same = 1;
    dt_ctx_init(&C, NULL);
    a = mk(DT_F32, 5); b = mk(DT_F32, 5); c = mk(DT_F32, 4); i = mk(DT_I32, 5);
    for (k = 0; k < 5; k++) ((float *)a.data)[k] = (float)k + 0.5f;
    DT_TEST_CHECK("copy_side_cpu_ok", dt_tensor_copy_side(&C, &b, &a, &t) == DT_OK);
    for (k = 0; k < 5; k++) same &= ((float *)b.data)[k] == (float)k + 0.5f;
    DT_TEST_CHECK("copy_side_cpu_copies_at_once", same);
    DT_TEST_CHECK("copy_side_cpu_ticket_0", t == 0);
    DT_TEST_CHECK("side_wait_ticket_0_ok", dt_side_wait(&C, 0) == DT_OK);
    DT_TEST_CHECK("copy_side_null_ticket_is_arg", dt_tensor_copy_side(&C, &b, &a, NULL) == DT_ERR_ARG &&
                                                      strstr(dt_ctx_error(&C), "ticket is NULL"));
    DT_TEST_CHECK("copy_side_count_mismatch_is_shape", dt_tensor_copy_side(&C, &c, &a, &t) == DT_ERR_SHAPE);
    DT_TEST_CHECK("copy_side_dtype_mismatch_is_dtype", dt_tensor_copy_side(&C, &i, &a, &t) == DT_ERR_DTYPE);
    DT_TEST_CHECK("copy_side_null_tensor_is_arg", dt_tensor_copy_side(&C, NULL, &a, &t) == DT_ERR_ARG);
    DT_TEST_CHECK("side_wait_unissued_ticket_is_arg", dt_side_wait(&C, 3) == DT_ERR_ARG &&
                                                          strstr(dt_ctx_error(&C), "ticket 3"));
    DT_TEST_CHECK("null_ctx_is_arg", dt_tensor_copy_side(NULL, &b, &a, &t) == DT_ERR_ARG && dt_side_wait(NULL, 1) == DT_ERR_ARG);
    dt_tensor_free(&C, &a); dt_tensor_free(&C, &b); dt_tensor_free(&C, &c); dt_tensor_free(&C, &i);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
