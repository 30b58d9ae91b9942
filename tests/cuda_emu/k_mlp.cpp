// emu-modes: parallel (end to end through kernels whose own k_*.cpp runs every thread order)
// emu-tsan: skip (the kernels it runs have their own TSan runs in k_*.cpp)
// tests/cuda_emu/k_mlp.cpp - the CUDA build of examples/mlp end to end on the emulator: train() on
// a ctx whose device is cuda (parameters, activations and grads are CUDA tensors, every op goes
// through kernels/, the SGD step is dt_axpy's kernel) gives the losses of the same train() on a
// cpu ctx, step by step, within 1e-5 relative (fp32 rounding: cuBLAS-on-OpenBLAS GEMMs and
// the kernels' exp). One rank (dt_comm without MPI). Small sizes: the emulator runs one host
// thread per CUDA thread. With the argument "tsan" (the ThreadSanitizer run) it trains 3 steps.
#include <math.h>
#include <cuda_runtime.h>
#define DT_CUDA
#define MLP_NO_MAIN
#define MLP_EVAL_N 64 /* the eval forward's softmax is one block per row: 1024 rows cost 20 s emulated */
#include "examples/mlp/mlp.c"
#include "tests/dt_test.h"

enum { STEPS = 20 };

// One training run of examples/mlp on a fresh ctx of the given device: per-step losses, the
// eval loss, and the final weights copied to the host (in registration order).
static float run(dt_device dev, const opts *o, float *losses, std::vector<std::vector<float>> *weights) {
    dt_ctx ctx_storage, *ctx = &ctx_storage;
    dt_ctx_desc cd;
    dt_comm *world = NULL;
    dt_params ps;
    model m;
    float eval;
    memset(&cd, 0, sizeof cd);
    memset(&ps, 0, sizeof ps);
    cd.device = dev;
    CHECK(dt_ctx_init(ctx, &cd));
    CHECK(dt_comm_create_world(ctx, &world, NULL));
    eval = train(ctx, world, o, &ps, &m, losses);
    for (int i = 0; i < ps.count; i++) {
        dt_tensor *v = &ps.items[i]->value, h;
        CHECK(dt_tensor_create_like(ctx, &h, v, DT_DTYPE_DEFAULT, DT_CPU));
        CHECK(dt_tensor_copy(ctx, &h, v));
        weights->push_back(std::vector<float>((float *)h.data, (float *)h.data + h.numel));
        dt_tensor_free(ctx, &h);
    }
    dt_params_free(ctx, &ps);
    dt_comm_free(world);
    dt_ctx_shutdown(ctx);
    return eval;
}

int main(int argc, char **argv) {
    int steps = argc > 1 && !strcmp(argv[1], "tsan") ? 3 : STEPS, at = 0;
    opts o = {steps, 8, 16, 7, 0.2f, NULL, 1}; /* batch 8, hidden 16: grids of a few hundred threads */
    float l_cpu[STEPS], l_cuda[STEPS], e_cpu, e_cuda;
    std::vector<std::vector<float>> w_cpu, w_cuda;
    double worst = 0;
    e_cpu = run(DT_CPU, &o, l_cpu, &w_cpu);
    e_cuda = run(DT_CUDA_DEVICE, &o, l_cuda, &w_cuda);
    for (int i = 0; i < steps; i++) {
        double d = fabs((double)l_cuda[i] - l_cpu[i]) / fabs((double)l_cpu[i]);
        if (!(d <= worst)) worst = d, at = i; /* a NaN is the worst */
    }
    printf("mlp on cuda vs cpu, %d steps: loss %.9g / %.9g at step 1, %.9g / %.9g at step %d; largest relative "
           "difference %.3g (step %d); eval %.9g / %.9g\n", steps, (double)l_cuda[0], (double)l_cpu[0],
           (double)l_cuda[steps - 1], (double)l_cpu[steps - 1], steps, worst, at + 1, (double)e_cuda, (double)e_cpu);
    dt_test_check_all("mlp_cuda_losses_equal_cpu_run", worst <= 1e-5,
                      "step %d of %d: loss %.9g on cuda, %.9g on cpu (rel diff %.3g > 1e-5)", at + 1, steps,
                      (double)l_cuda[at], (double)l_cpu[at], worst);
    dt_test_close("mlp_cuda_eval_loss_equals_cpu_run", e_cuda, e_cpu, 1e-5 * fabs((double)e_cpu));
    if (DT_TEST_CHECK("mlp_cuda_has_the_cpu_run_parameters", w_cpu.size() == 6 && w_cuda.size() == 6)) {
        const char *names[6] = {"fc1.w", "fc1.b", "fc2.w", "fc2.b", "fc3.w", "fc3.b"};
        for (int i = 0; i < 6; i++) {
            char name[96];
            snprintf(name, sizeof name, "mlp_cuda_final_%s_equals_cpu_run", names[i]);
            dt_test_allclose(name, w_cuda[i].data(), w_cpu[i].data(), w_cpu[i].size(), 1e-6, 1e-5);
        }
    }
    if (steps == STEPS)
        dt_test_check_all("mlp_cuda_learns", l_cuda[STEPS - 1] < 0.95f * l_cuda[0], "loss %.4f at step 1, %.4f at step %d",
                          (double)l_cuda[0], (double)l_cuda[STEPS - 1], STEPS);
    return dt_test_finish();
}
