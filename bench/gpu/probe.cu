// bench/gpu/probe.cu - dt's kernels on a real GPU, each beside the figure it is judged against,
// measured in the same run (part of `./build.sh gpu`; bench/gpu/run.sh builds and runs it):
//   memory-bound ops   dt_tensor.h / dt_parallel.h / dt_opt.h calls on CUDA tensors at GPT-2 124M
//                      shapes (B 8, T 1024: N = 8192 rows, C 768, padded vocab 50304), in GB/s of
//                      the bytes the op must move at least, and that as a fraction of a
//                      device-to-device cudaMemcpyAsync (bytes read + bytes written) timed here
//                      first. The issue's target for these: >= 0.7.
//   linear_gelu        dt_linear_gelu_fwd's fused cuBLASLt GEMM against the separate ops (bf16 w)
//   GEMM               dt_k_matmul_fwd (what dt_matmul_fwd / dt_linear_fwd launch), f32 and TF32,
//                      against cublasSgemm / cublasGemmEx called directly on the same handle,
//                      stream, buffers and shapes; the ratio of their times (target >= 0.97 in
//                      f32) and the largest difference of their outputs.
//   attention          the fused (flash) forward and backward in TFLOP/s (information), and the
//                      tensor-core kernels (bf16 qkv) beside cuBLAS's bf16 GEMM TFLOP/s (target: the
//                      attention >= 50% of the GEMM).
// Every figure is the median of event-timed repetitions after two warm-ups (cudaEventElapsedTime
// on the stream the work runs on), over buffers much larger than the L2.
//
// The ops go through the public API, not the launchers, so the probe measures what a trainer gets
// (checks, scratch, the launch configuration the op picks) and keeps building when a launcher's
// arguments change. Gradients accumulate (+=), so a backward's bytes count reading its output too.
//
// Output: one tab-separated line per figure (bench/gpu/run.sh turns them into the summary):
//   copy  <ms> <GB/s>                                          the reference
//   bw    <name> <ms> <GB/s> <fraction of copy>
//   gemm  <name> <MxNxK> <dt ms> <dt TFLOP/s> <cublas ms> <cublas TFLOP/s> <cublas ms / dt ms> <max |dt - cublas| / max |cublas|>
//   flops <name> <ms> <TFLOP/s>
//   skip  <name> <why>          fail <name> <why>
// Exit 0 when every row ran, 1 when one failed, 3 when there is no usable device.
// Environment: PROBE_ONLY=substring (rows whose name contains it), PROBE_BUDGET_S (150: later rows
// are skipped once spent).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <vector>

#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_kernels.h"

static int g_failures;
static double g_copy_gbs;
static double g_budget_s = 150, g_t0;
static const char *g_only;
static dt_ctx g_ctx;
static cudaStream_t g_stream; // the ctx's stream: every dt op and every event runs on it

static double wall(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec - g_t0;
}

#define CK(x)                                                                                              \
    do {                                                                                                   \
        cudaError_t e_ = (x);                                                                              \
        if (e_ != cudaSuccess) {                                                                           \
            printf("fail\t%s:%d\t%s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));               \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)
#define DT(x)                                                                                              \
    do {                                                                                                   \
        if ((x) != DT_OK) {                                                                                \
            printf("fail\t%s:%d\t%s: %s\n", __FILE__, __LINE__, #x, dt_ctx_error(&g_ctx));                 \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

// Uniform values in [lo, hi) from a hash of the index: fresh data, never zeros (zeros can run
// faster than real data and hide unwritten outputs).
__global__ void fill_uniform(float *p, int64_t n, float lo, float hi, uint32_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
        p[i] = lo + (hi - lo) * (float)(x >> 8) * (1.0f / 16777216.0f);
    }
}
__global__ void fill_ids(int32_t *p, int64_t n, int32_t mod, uint32_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15;
        p[i] = (int32_t)(x % (uint32_t)mod);
    }
}
// out[0] = max |a - b|, out[1] = max |b| as float bits (non-negative floats order as their bits).
__global__ void max_diff(unsigned int *out, const float *a, const float *b, int64_t n) {
    float d = 0, m = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        d = fmaxf(d, fabsf(a[i] - b[i]));
        m = fmaxf(m, fabsf(b[i]));
    }
    atomicMax(&out[0], __float_as_uint(d));
    atomicMax(&out[1], __float_as_uint(m));
}

static uint32_t g_seed = 1;
static void uniform(float *p, int64_t n, float lo = -1.0f, float hi = 1.0f) {
    fill_uniform<<<1024, 256, 0, g_stream>>>(p, n, lo, hi, g_seed++ * 0x9e3779b9u);
    CK(cudaGetLastError());
}

// A CUDA tensor of the ctx, f32 (or dtype) [d0, d1, d2] (trailing zeros: fewer dims), filled
// with uniform values.
static dt_tensor tensor(int64_t d0, int64_t d1 = 0, dt_dtype dtype = DT_F32, int64_t d2 = 0) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dtype;
    d.device = DT_CUDA_DEVICE;
    d.shape[0] = d0;
    d.shape[1] = d1;
    d.shape[2] = d2;
    d.ndim = d2 ? 3 : d1 ? 2 : 1;
    DT(dt_tensor_create(&g_ctx, &t, &d));
    if (dtype == DT_F32) uniform((float *)t.data, t.numel);
    return t;
}

static bool selected(const char *name) {
    if (g_only && !strstr(name, g_only)) return false;
    if (wall() > g_budget_s) {
        printf("skip\t%s\tthe probe's budget of %.0f s is spent (PROBE_BUDGET_S)\n", name, g_budget_s);
        return false;
    }
    return true;
}

// Median milliseconds of fn (which returns 0 or a status), two warm-ups, then repetitions until
// 25 or ~0.5 s. -1 when a call failed (reported as a fail row).
template <typename F> static double time_ms(const char *name, F fn) {
    cudaEvent_t a, b;
    std::vector<float> ms;
    float t = 0, total = 0;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int r = -2; r < 25 && total < 500.0f; r++) {
        CK(cudaEventRecord(a, g_stream));
        int st = fn();
        CK(cudaEventRecord(b, g_stream));
        cudaError_t e = cudaEventSynchronize(b);
        if (st || e != cudaSuccess) {
            // st: a dt_status (its message printed by DTF), a cudaError_t or 1000 + a cublasStatus_t
            printf("fail\t%s\tstatus %d, event %s\n", name, st, cudaGetErrorString(e));
            g_failures++;
            cudaGetLastError();
            cudaEventDestroy(a);
            cudaEventDestroy(b);
            return -1;
        }
        CK(cudaEventElapsedTime(&t, a, b));
        if (r >= 0) ms.push_back(t), total += t;
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

// A dt call as a timed function: its status, with the ctx's message printed when it fails.
#define DTF(call) [&]() -> int { dt_status s_ = (call); if (s_) printf("# %s: %s\n", #call, dt_ctx_error(&g_ctx)); return (int)s_; }

static void bw_row(const char *name, double bytes, double ms) {
    if (ms < 0) return;
    double gbs = bytes / (ms * 1e-3) / 1e9;
    printf("bw\t%s\t%.4f\t%.1f\t%.3f\n", name, ms, gbs, gbs / g_copy_gbs);
    fflush(stdout);
}

int main(int argc, char **argv) {
    const int64_t B = 8, T = 1024, C = 768, H = 12, V = 50257, Vp = 50304, N = B * T;
    int ndev = 0;
    (void)argc, (void)argv;
    g_t0 = 0, g_t0 = wall();
    if (getenv("PROBE_BUDGET_S")) g_budget_s = atof(getenv("PROBE_BUDGET_S"));
    g_only = getenv("PROBE_ONLY");
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev < 1) {
        printf("probe: no usable CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return 3;
    }
    dt_ctx_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.device = DT_CUDA_DEVICE;
    if (dt_ctx_init(&g_ctx, &cd) != DT_OK) {
        printf("probe: dt_ctx_init on CUDA failed: %s\n", dt_ctx_error(&g_ctx));
        return 3;
    }
    g_stream = (cudaStream_t)g_ctx.cuda_stream;
    printf("# GPT-2 124M shapes: B %lld, T %lld, N %lld rows, C %lld, H %lld, vocab %lld (padded %lld)\n", (long long)B,
           (long long)T, (long long)N, (long long)C, (long long)H, (long long)V, (long long)Vp);

    // ---------------------------------------------------------------- the reference: a d2d copy
    {
        size_t bytes = (size_t)1 << 30;
        void *a = NULL, *b = NULL;
        CK(cudaMalloc(&a, bytes));
        CK(cudaMalloc(&b, bytes));
        uniform((float *)a, (int64_t)(bytes / 4));
        double ms = time_ms("copy", [&] { return (int)cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_stream); });
        if (ms <= 0) return 1;
        g_copy_gbs = 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
        printf("copy\t%.4f\t%.1f\n", ms, g_copy_gbs);
        CK(cudaFree(a));
        CK(cudaFree(b));
    }

    // ---------------------------------------------------------------- memory-bound ops
    {
        dt_tensor x = tensor(N, 4 * C), y = tensor(N, 4 * C), dy = tensor(N, 4 * C), bias = tensor(4 * C), dbias = tensor(4 * C);
        double big = 4.0 * (double)x.numel; // bytes of one [N, 4C] f32 tensor
        if (selected("fill 0 [N,4C]")) bw_row("fill 0 [N,4C]", big, time_ms("fill 0", DTF(dt_tensor_fill(&g_ctx, &y, 0.0))));
        if (selected("fill 0.5 [N,4C]")) bw_row("fill 0.5 [N,4C]", big, time_ms("fill 0.5", DTF(dt_tensor_fill(&g_ctx, &y, 0.5))));
        if (selected("copy d2d [N,4C]")) bw_row("copy d2d [N,4C]", 2 * big, time_ms("copy d2d", DTF(dt_tensor_copy(&g_ctx, &y, &x))));
        if (selected("gelu_fwd [N,4C]")) bw_row("gelu_fwd [N,4C]", 2 * big, time_ms("gelu_fwd", DTF(dt_gelu_fwd(&g_ctx, &y, &x))));
        if (selected("gelu_bwd [N,4C]")) bw_row("gelu_bwd [N,4C]", 4 * big, time_ms("gelu_bwd", DTF(dt_gelu_bwd(&g_ctx, &dy, &y, &x))));
        if (selected("gelu_bwd bf16 x [N,4C]")) { // gpt --dtype bf16: the pre-activation kept in bf16
            dt_tensor x16 = tensor(N, 4 * C, DT_BF16);
            DT(dt_tensor_cast(&g_ctx, &x16, &x));
            bw_row("gelu_bwd bf16 x [N,4C]", 3.5 * big, time_ms("gelu_bwd bf16 x", DTF(dt_gelu_bwd(&g_ctx, &dy, &y, &x16))));
            dt_tensor_free(&g_ctx, &x16);
        }
        if (selected("gelu_bwd bf16 dx dout x [N,4C]")) { // gpt --dtype bf16's MLP gradients: 2 + 2 + 2 + 2 bytes
            dt_tensor x16 = tensor(N, 4 * C, DT_BF16), g16 = tensor(N, 4 * C, DT_BF16), d16 = tensor(N, 4 * C, DT_BF16);
            DT(dt_tensor_cast(&g_ctx, &x16, &x));
            DT(dt_tensor_cast(&g_ctx, &g16, &y));
            DT(dt_tensor_fill(&g_ctx, &d16, 0.0));
            bw_row("gelu_bwd bf16 dx dout x [N,4C]", 2 * big,
                   time_ms("gelu_bwd bf16 dx dout x", DTF(dt_gelu_bwd(&g_ctx, &d16, &g16, &x16))));
            dt_tensor_free(&g_ctx, &x16), dt_tensor_free(&g_ctx, &g16), dt_tensor_free(&g_ctx, &d16);
        }
        if (selected("bias_add_fwd [N,4C]")) bw_row("bias_add_fwd [N,4C]", 2 * big, time_ms("bias_add_fwd", DTF(dt_bias_add_fwd(&g_ctx, &y, &bias))));
        if (selected("bias_add_bwd [N,4C]")) bw_row("bias_add_bwd [N,4C]", big, time_ms("bias_add_bwd", DTF(dt_bias_add_bwd(&g_ctx, &dbias, &y))));
        dt_tensor_free(&g_ctx, &x), dt_tensor_free(&g_ctx, &y), dt_tensor_free(&g_ctx, &dy);
        dt_tensor_free(&g_ctx, &bias), dt_tensor_free(&g_ctx, &dbias);
    }
    {
        dt_tensor x = tensor(N, C), y = tensor(N, C), dx = tensor(N, C), dy = tensor(N, C), w = tensor(C), b = tensor(C);
        dt_tensor dw = tensor(C), db = tensor(C), mean = tensor(N), rstd = tensor(N);
        double one = 4.0 * (double)x.numel;
        if (selected("layernorm_fwd [N,C]")) bw_row("layernorm_fwd [N,C]", 2 * one, time_ms("layernorm_fwd", DTF(dt_layernorm_fwd(&g_ctx, &y, &mean, &rstd, &x, &w, &b, 1e-5f))));
        if (selected("layernorm_fwd bf16 out [N,C]")) { // gpt --dtype bf16: ln1, ln2 in bf16
            dt_tensor y16 = tensor(N, C, DT_BF16);
            bw_row("layernorm_fwd bf16 out [N,C]", 1.5 * one, time_ms("layernorm_fwd bf16 out", DTF(dt_layernorm_fwd(&g_ctx, &y16, &mean, &rstd, &x, &w, &b, 1e-5f))));
            dt_tensor_free(&g_ctx, &y16);
        }
        if (selected("layernorm_bwd [N,C]")) bw_row("layernorm_bwd [N,C]", 4 * one, time_ms("layernorm_bwd", DTF(dt_layernorm_bwd(&g_ctx, &dx, &dw, &db, &dy, &x, &w, &mean, &rstd))));
        if (selected("add [N,C]")) bw_row("add [N,C]", 3 * one, time_ms("add", DTF(dt_add(&g_ctx, &y, &x, &dx))));
        if (selected("axpy [N,C]")) bw_row("axpy [N,C]", 3 * one, time_ms("axpy", DTF(dt_axpy(&g_ctx, &y, 0.5f, &x))));
        dt_tensor wte = tensor(Vp, C), dwte = tensor(Vp, C), ids = tensor(N, 0, DT_I32);
        fill_ids<<<256, 256, 0, g_stream>>>((int32_t *)ids.data, N, (int32_t)V, 7);
        CK(cudaGetLastError());
        if (selected("embedding_fwd [N,C]")) bw_row("embedding_fwd [N,C]", 2 * one, time_ms("embedding_fwd", DTF(dt_embedding_fwd(&g_ctx, &y, &wte, &ids))));
        if (selected("embedding_bwd [N,C]")) bw_row("embedding_bwd [N,C]", 3 * one, time_ms("embedding_bwd", DTF(dt_embedding_bwd(&g_ctx, &dwte, &dy, &ids))));
        dt_tensor_free(&g_ctx, &wte), dt_tensor_free(&g_ctx, &dwte);
        // cross entropy over the padded vocab: dt_softmax_xent (probs kept) and gpt's own path,
        // dt_tp_xent on a layout of one rank (stats [N, 2]; the logits never leave the device)
        dt_tensor logits = tensor(N, Vp), dlogits = tensor(N, Vp), stats = tensor(N, 2);
        uniform((float *)logits.data, logits.numel, -4.0f, 4.0f);
        double lb = 4.0 * (double)logits.numel;
        float loss = 0;
        int64_t nv = 0;
        dt_comm *world = NULL;
        dt_layout *lay = NULL;
        dt_layout_desc ld;
        memset(&ld, 0, sizeof ld);
        DT(dt_comm_create_world(&g_ctx, &world, NULL));
        DT(dt_layout_create(world, &lay, &ld));
        // the forward reads the logits once; the loss (read to the host: a wait) is a few bytes
        if (selected("tp_xent_fwd [N,Vp]")) bw_row("tp_xent_fwd [N,Vp]", lb, time_ms("tp_xent_fwd", DTF(dt_tp_xent_fwd(lay, &loss, &nv, &stats, &logits, &ids, 0, V, -1))));
        if (selected("tp_xent_bwd [N,Vp]")) bw_row("tp_xent_bwd [N,Vp]", 3 * lb, time_ms("tp_xent_bwd", DTF(dt_tp_xent_bwd(lay, &dlogits, &logits, &stats, &ids, 0, V, -1, 1.0f))));
        if (selected("softmax_xent_fwd [N,Vp]")) bw_row("softmax_xent_fwd [N,Vp] (probs out)", 2 * lb, time_ms("softmax_xent_fwd", DTF(dt_softmax_xent_fwd(&g_ctx, &loss, &nv, &dlogits, &logits, &ids, -1))));
        if (selected("softmax_xent_bwd [N,Vp]")) bw_row("softmax_xent_bwd [N,Vp] (in place)", 2 * lb, time_ms("softmax_xent_bwd", DTF(dt_softmax_xent_bwd(&g_ctx, &dlogits, &dlogits, &ids, -1, 1.0f))));
        dt_layout_free(lay);
        dt_comm_free(world);
        dt_tensor_free(&g_ctx, &logits), dt_tensor_free(&g_ctx, &dlogits), dt_tensor_free(&g_ctx, &stats);
        dt_tensor_free(&g_ctx, &x), dt_tensor_free(&g_ctx, &y), dt_tensor_free(&g_ctx, &dx), dt_tensor_free(&g_ctx, &dy);
        dt_tensor_free(&g_ctx, &w), dt_tensor_free(&g_ctx, &b), dt_tensor_free(&g_ctx, &dw), dt_tensor_free(&g_ctx, &db);
        dt_tensor_free(&g_ctx, &mean), dt_tensor_free(&g_ctx, &rstd), dt_tensor_free(&g_ctx, &ids);
    }
    // AdamW through the optimizer object over GPT-2 124M's parameter count in one tensor: param,
    // grad, exp_avg, exp_avg_sq read, param, exp_avg, exp_avg_sq written (28 bytes a parameter)
    if (selected("adamw dt_opt_step 124M")) {
        const int64_t n = Vp * C + T * C + 12 * (12 * C * C + 13 * C) + 2 * C;
        dt_params ps;
        dt_param *p = NULL;
        dt_param_desc pd;
        dt_opt_desc od;
        dt_optimizer *opt = NULL;
        memset(&ps, 0, sizeof ps);
        memset(&pd, 0, sizeof pd);
        memset(&od, 0, sizeof od);
        pd.name = "w";
        pd.device = DT_CUDA_DEVICE;
        pd.shape[0] = n;
        DT(dt_params_add(&g_ctx, &ps, &p, &pd));
        uniform((float *)p->value.data, n);
        uniform((float *)p->grad.data, n, -1e-3f, 1e-3f);
        od.kind = DT_OPT_ADAMW;
        DT(dt_opt_create(&g_ctx, &opt, &ps, &od));
        bw_row("adamw dt_opt_step 124M", 28.0 * (double)n, time_ms("adamw", DTF(dt_opt_step(opt, NULL))));
        dt_opt_free(opt);
        dt_params_free(&g_ctx, &ps);
    }
    // attention, fused (att NULL): causal useful FLOPs, QK^T and PV over the lower triangle
    {
        dt_tensor qkv = tensor(B, T, DT_F32, 3 * C), out = tensor(B, T, DT_F32, C), dout = tensor(B, T, DT_F32, C);
        dt_tensor dqkv = tensor(B, T, DT_F32, 3 * C);
        double fl = 4.0 * (double)B * (double)C * (double)T * (double)(T + 1) / 2;
        if (selected("attention_fwd flash")) {
            double ms = time_ms("attention_fwd", DTF(dt_attention_fwd(&g_ctx, &out, NULL, &qkv, (int)H)));
            if (ms > 0) printf("flops\tattention_fwd flash\t%.4f\t%.2f\n", ms, fl / (ms * 1e-3) / 1e12);
        }
        if (selected("attention_bwd flash")) {
            double ms = time_ms("attention_bwd", DTF(dt_attention_bwd(&g_ctx, &dqkv, &dout, &qkv, NULL, (int)H)));
            if (ms > 0) printf("flops\tattention_bwd flash\t%.4f\t%.2f\n", ms, 2 * fl / (ms * 1e-3) / 1e12);
        }
        // the tensor cores (kernels/dt_flash.cu): the same shapes with a bf16 qkv, what gpt --dtype bf16 runs
        dt_tensor q16 = tensor(B, T, DT_BF16, 3 * C);
        DT(dt_tensor_cast(&g_ctx, &q16, &qkv));
        if (selected("attention_fwd tensor cores bf16")) {
            double ms = time_ms("attention_fwd_tc", DTF(dt_attention_fwd(&g_ctx, &out, NULL, &q16, (int)H)));
            if (ms > 0) printf("flops\tattention_fwd tensor cores bf16\t%.4f\t%.2f\n", ms, fl / (ms * 1e-3) / 1e12);
        }
        if (selected("attention_bwd tensor cores bf16")) { // the backward reruns the forward: 3 x its FLOPs
            double ms = time_ms("attention_bwd_tc", DTF(dt_attention_bwd(&g_ctx, &dqkv, &dout, &q16, NULL, (int)H)));
            if (ms > 0) printf("flops\tattention_bwd tensor cores bf16 (+ its forward)\t%.4f\t%.2f\n", ms,
                               3 * fl / (ms * 1e-3) / 1e12);
        }
        dt_tensor_free(&g_ctx, &q16);
        dt_tensor_free(&g_ctx, &qkv), dt_tensor_free(&g_ctx, &out), dt_tensor_free(&g_ctx, &dout), dt_tensor_free(&g_ctx, &dqkv);
    }
    // what the tensor-core attention is judged against (issue 19: >= 50%): cuBLAS's bf16 GEMM
    // (bf16 in, f32 accumulate and out) at the MLP's shape [N, C] x [C, 4C]
    if (selected("cublas bf16 gemm")) {
        cublasHandle_t hb;
        void *A = NULL, *Bm = NULL, *Cm = NULL;
        const int64_t M = N, Nn = 4 * C, K = C;
        float one = 1.0f, zero = 0.0f;
        if (cublasCreate(&hb) != CUBLAS_STATUS_SUCCESS || cublasSetStream(hb, g_stream) != CUBLAS_STATUS_SUCCESS) {
            printf("fail\tcublas bf16 gemm\tno cuBLAS handle\n");
            g_failures++;
        } else {
            CK(cudaMalloc(&A, (size_t)(M * K) * 2));
            CK(cudaMalloc(&Bm, (size_t)(K * Nn) * 2));
            CK(cudaMalloc(&Cm, (size_t)(M * Nn) * 4));
            CK(cudaMemsetAsync(A, 0x3c, (size_t)(M * K) * 2, g_stream)); // bf16 0x3c3c: ~0.0115
            CK(cudaMemsetAsync(Bm, 0x3c, (size_t)(K * Nn) * 2, g_stream));
            double ms = time_ms("cublas bf16 gemm", [&] {
                return (int)cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, (int)Nn, (int)M, (int)K, &one, Bm, CUDA_R_16BF,
                                         (int)Nn, A, CUDA_R_16BF, (int)K, &zero, Cm, CUDA_R_32F, (int)Nn,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            });
            if (ms > 0)
                printf("flops\tcublas bf16 gemm [N,C]x[C,4C] (f32 out)\t%.4f\t%.2f\n", ms,
                       2.0 * (double)M * (double)Nn * (double)K / (ms * 1e-3) / 1e12);
            CK(cudaFree(A));
            CK(cudaFree(Bm));
            CK(cudaFree(Cm));
            cublasDestroy(hb);
        }
    }

    // gpt's MLP up-projection with a bf16 weight: dt_linear_gelu_fwd (one cuBLASLt GEMM whose
    // epilogue adds the bias, applies the GELU and writes its input) against the ops it replaces
    // (dt_linear_fwd's GEMM then its bias, then dt_gelu_fwd), both in TFLOP/s of the GEMM's 2 N C 4C
    if (selected("linear_gelu")) {
        dt_tensor x = tensor(N, C), w32 = tensor(4 * C, C), w = tensor(4 * C, C, DT_BF16), b = tensor(4 * C);
        dt_tensor pre = tensor(N, 4 * C), out = tensor(N, 4 * C);
        double fl = 2.0 * (double)N * (double)C * 4.0 * (double)C;
        DT(dt_tensor_cast(&g_ctx, &w, &w32));
        double sep = time_ms("linear + gelu separate", [&]() -> int {
            dt_status st = dt_linear_fwd(&g_ctx, &pre, &x, &w, &b);
            if (!st) st = dt_gelu_fwd(&g_ctx, &out, &pre);
            if (st) printf("# linear + gelu: %s\n", dt_ctx_error(&g_ctx));
            return (int)st;
        });
        double fused = time_ms("linear_gelu fused", DTF(dt_linear_gelu_fwd(&g_ctx, &out, &pre, &x, &w, &b)));
        if (sep > 0) printf("flops\tlinear + bias + gelu separate, bf16 w [N,C]x[C,4C]\t%.4f\t%.2f\n", sep, fl / (sep * 1e-3) / 1e12);
        if (fused > 0) printf("flops\tlinear_gelu fused epilogue, bf16 w [N,C]x[C,4C]\t%.4f\t%.2f\n", fused, fl / (fused * 1e-3) / 1e12);
        { // gpt --dtype bf16's own call: bf16 x, and out and pre written in bf16 (half the epilogue's bytes)
            dt_tensor x16 = tensor(N, C, DT_BF16), pre16 = tensor(N, 4 * C, DT_BF16), out16 = tensor(N, 4 * C, DT_BF16);
            DT(dt_tensor_cast(&g_ctx, &x16, &x));
            double f16 = time_ms("linear_gelu bf16 activations", DTF(dt_linear_gelu_fwd(&g_ctx, &out16, &pre16, &x16, &w, &b)));
            if (f16 > 0) printf("flops\tlinear_gelu fused epilogue, bf16 w, x, out, pre [N,C]x[C,4C]\t%.4f\t%.2f\n", f16, fl / (f16 * 1e-3) / 1e12);
            dt_tensor_free(&g_ctx, &x16), dt_tensor_free(&g_ctx, &pre16), dt_tensor_free(&g_ctx, &out16);
        }
        dt_tensor *all[] = {&x, &w32, &w, &b, &pre, &out};
        for (dt_tensor *t : all) dt_tensor_free(&g_ctx, t);
    }

    // ---------------------------------------------------------------- GEMM: dt against cuBLAS direct
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasSetStream(h, g_stream) != CUBLAS_STATUS_SUCCESS) {
        printf("fail\tcublasCreate\tno cuBLAS handle\n");
        return 1;
    }
    struct shape { const char *name; int64_t M, N, K; int trans_b; } shapes[] = {
        {"qkv fwd [N,C]x[C,3C]", N, 3 * C, C, 0},
        {"fc fwd [N,C]x[C,4C]", N, 4 * C, C, 0},
        {"proj fwd [N,4C]x[4C,C]", N, C, 4 * C, 0},
        {"lm head [N,C]x[Vp,C]^T", N, Vp, C, 1},
    };
    unsigned int *dmax = NULL;
    CK(cudaMalloc(&dmax, 2 * sizeof(unsigned int)));
    for (const shape &s : shapes) {
        for (int tf32 = 0; tf32 <= 1; tf32++) {
            char nm[96];
            snprintf(nm, sizeof nm, "%s %s", tf32 ? "tf32" : "f32", s.name);
            if (!selected(nm)) continue;
            float *A = NULL, *Bm = NULL, *Cd = NULL, *Cc = NULL, one = 1.0f, zero = 0.0f;
            CK(cudaMalloc(&A, (size_t)(s.M * s.K) * 4));
            CK(cudaMalloc(&Bm, (size_t)(s.K * s.N) * 4));
            CK(cudaMalloc(&Cd, (size_t)(s.M * s.N) * 4));
            CK(cudaMalloc(&Cc, (size_t)(s.M * s.N) * 4));
            uniform(A, s.M * s.K);
            uniform(Bm, s.K * s.N);
            double dt_ms = time_ms(nm, [&] {
                return dt_k_matmul_fwd(h, Cd, A, Bm, 1, 1, s.M, s.N, s.K, 0, s.trans_b, 0, 0, 0, 1.0f, 0.0f, tf32, g_stream);
            });
            // row-major out[M,N] = A[M,K] B[K,N] (or A B^T with B [N,K]) is column-major
            // out^T = B^T A^T: cuBLAS computes [N,M] from B (ld N, or K transposed) and A (ld K)
            cublasOperation_t ob = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
            int ldb = s.trans_b ? (int)s.K : (int)s.N;
            double cb_ms = time_ms(nm, [&] {
                if (!tf32)
                    return (int)cublasSgemm(h, ob, CUBLAS_OP_N, (int)s.N, (int)s.M, (int)s.K, &one, Bm, ldb, A, (int)s.K, &zero,
                                            Cc, (int)s.N);
                return (int)cublasGemmEx(h, ob, CUBLAS_OP_N, (int)s.N, (int)s.M, (int)s.K, &one, Bm, CUDA_R_32F, ldb, A, CUDA_R_32F,
                                         (int)s.K, &zero, Cc, CUDA_R_32F, (int)s.N, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
            });
            unsigned int mx[2] = {0, 0};
            CK(cudaMemsetAsync(dmax, 0, 2 * sizeof(unsigned int), g_stream));
            max_diff<<<1024, 256, 0, g_stream>>>(dmax, Cd, Cc, s.M * s.N);
            CK(cudaGetLastError());
            CK(cudaMemcpyAsync(mx, dmax, sizeof mx, cudaMemcpyDeviceToHost, g_stream));
            CK(cudaStreamSynchronize(g_stream));
            float d, m;
            memcpy(&d, &mx[0], 4);
            memcpy(&m, &mx[1], 4);
            if (dt_ms > 0 && cb_ms > 0) {
                double fl = 2.0 * (double)s.M * (double)s.N * (double)s.K;
                printf("gemm\t%s\t%lldx%lldx%lld\t%.4f\t%.2f\t%.4f\t%.2f\t%.3f\t%.2g\n", nm, (long long)s.M, (long long)s.N,
                       (long long)s.K, dt_ms, fl / (dt_ms * 1e-3) / 1e12, cb_ms, fl / (cb_ms * 1e-3) / 1e12, cb_ms / dt_ms,
                       m > 0 ? (double)d / m : (double)d);
                fflush(stdout);
            }
            CK(cudaFree(A));
            CK(cudaFree(Bm));
            CK(cudaFree(Cd));
            CK(cudaFree(Cc));
        }
    }
    CK(cudaFree(dmax));
    cublasDestroy(h);
    dt_ctx_shutdown(&g_ctx);
    printf("# probe: done in %.1f s, %d failure(s)\n", wall(), g_failures);
    return g_failures ? 1 : 0;
}
