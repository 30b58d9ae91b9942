/* tests/test_safetensors_py.c - a file dt writes is read back by an independent reader:
   tests/safetensors_numpy.py (numpy alone, 20 lines). Sums of every tensor must agree.
   Skipped when python3 with numpy is absent (./build.sh installs Debian's python3-numpy). */
#include "dt_tensor.h"
#include "dt_test.h"

#ifndef __cplusplus
extern FILE *popen(const char *command, const char *type); /* POSIX; hidden by strict -std=c99 */
extern int pclose(FILE *stream);
#endif

static dt_ctx C;

static dt_tensor make(dt_dtype dt, int64_t d0, int64_t d1) {
    dt_tensor t;
    dt_tensor_desc d;
    int64_t i;
    memset(&d, 0, sizeof d);
    d.dtype = dt; d.shape[0] = d0; d.shape[1] = d1;
    dt_tensor_create(&C, &t, &d);
    for (i = 0; i < t.numel; i++) { /* values exact in every dtype: small integers and halves */
        double v = (double)((i * 7) % 11) - 5.0 + (dt == DT_I32 || dt == DT_I64 || dt == DT_U8 ? 0 : 0.5);
        if (dt == DT_U8) v = (double)(i * 13 % 256);
        if (dt == DT_F32) ((float *)t.data)[i] = (float)v;
        else if (dt == DT_BF16) ((uint16_t *)t.data)[i] = dt_f32_to_bf16((float)v);
        else if (dt == DT_F16) ((uint16_t *)t.data)[i] = dt_f32_to_f16((float)v);
        else if (dt == DT_I32) ((int32_t *)t.data)[i] = (int32_t)v;
        else if (dt == DT_I64) ((int64_t *)t.data)[i] = (int64_t)v * 1000000000000LL;
        else ((uint8_t *)t.data)[i] = (uint8_t)v;
    }
    return t;
}

/* Debian's interpreter first: that is where python3-numpy installs. */
static const char *access_python(void) {
    FILE *f = fopen("/usr/bin/python3", "rb");
    if (f) { fclose(f); return "/usr/bin/python3"; }
    return "python3";
}

static double sum_of(const dt_tensor *t) {
    double s = 0;
    int64_t i;
    for (i = 0; i < t->numel; i++) {
        switch (t->dtype) {
        case DT_F32: s += ((float *)t->data)[i]; break;
        case DT_BF16: s += dt_bf16_to_f32(((uint16_t *)t->data)[i]); break;
        case DT_F16: s += dt_f16_to_f32(((uint16_t *)t->data)[i]); break;
        case DT_I32: s += ((int32_t *)t->data)[i]; break;
        case DT_I64: s += (double)((int64_t *)t->data)[i]; break;
        default: s += ((uint8_t *)t->data)[i]; break;
        }
    }
    return s;
}

int main(void) {
    static const char *names[6] = {"w.f32", "w.bf16", "w.f16", "ids.i32", "ids.i64", "mask.u8"};
    const char *meta[4] = {"format", "dt-test", "note", "quote \" and backslash \\"};
    const char *py = access_python();
    dt_tensor t[6];
    const dt_tensor *tp[6];
    char path[512], cmd[1200], line[512];
    FILE *out;
    int i, seen = 0, ok = 1, meta_ok = 0;
    dt_ctx_init(&C, NULL);
    t[0] = make(DT_F32, 3, 4); t[1] = make(DT_BF16, 5, 0); t[2] = make(DT_F16, 2, 2);
    t[3] = make(DT_I32, 7, 0); t[4] = make(DT_I64, 2, 3); t[5] = make(DT_U8, 9, 0);
    for (i = 0; i < 6; i++) tp[i] = &t[i];
    snprintf(path, sizeof path, "%s/py.safetensors", dt_test_tmpdir());
    if (!DT_TEST_CHECK("safetensors_save_all_dtypes", dt_safetensors_save(&C, path, tp, names, 6, meta, 2) == 0))
        return dt_test_finish();
    snprintf(cmd, sizeof cmd, "%s -c 'import numpy' 2>/dev/null && %s tests/safetensors_numpy.py '%s' 2>&1", py, py, path);
    out = popen(cmd, "r");
    while (out && fgets(line, sizeof line, out)) {
        char name[64], dt[16], shape[64];
        double s;
        if (strncmp(line, "meta note quote \" and backslash \\", 33) == 0) meta_ok = 1;
        if (sscanf(line, "%63s %15s %63s %lf", name, dt, shape, &s) != 4) continue;
        for (i = 0; i < 6; i++)
            if (strcmp(name, names[i]) == 0) {
                seen++;
                if (s != sum_of(&t[i])) {
                    ok = 0;
                    dt_test_fail("numpy_reader_sums_match", "%s: numpy sum %.17g, dt sum %.17g", name, s, sum_of(&t[i]));
                }
            }
    }
    if (!out || pclose(out) != 0 || seen == 0) {
        dt_test_skip("numpy_reader_sums_match", "%s with numpy not available (apt-get install python3-numpy)", py);
    } else {
        if (ok && DT_TEST_CHECK("numpy_reader_sees_all_tensors", seen == 6)) dt_test_pass("numpy_reader_sums_match");
        DT_TEST_CHECK("numpy_reader_sees_escaped_metadata", meta_ok);
    }
    for (i = 0; i < 6; i++) dt_tensor_free(&C, &t[i]);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
