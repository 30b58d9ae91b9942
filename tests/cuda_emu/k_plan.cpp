// emu-modes: parallel (end to end through kernels whose own k_*.cpp runs every thread order)
// emu-tsan: skip (the kernels it runs have their own TSan runs in k_*.cpp)
// tests/cuda_emu/k_plan.cpp - the planner on CUDA, on the emulator: dt_plan_machine_measure times
// the block's pieces on the device (the four linears with bf16 weights, the tensor-core attention,
// a device copy, pinned host memory to the device and back) and reads the device's memory. The
// emulator's times say nothing of a GPU's, so what is checked is what does not depend on them:
//   - the memory figures, exactly: cudaMemGetInfo's total, and what was held at the call (a 1 MB
//     tensor taken before it; the emulator counts every cudaMalloc);
//   - the rates are rates (positive, finite), each efficiency at most 1 over a peak that is the
//     fastest measured rate (no given machine) or given's (then kept where the measurement is
//     below it), and given's unmeasured figures kept; dt's own: act_bytes 4 (f32 activations);
//   - a world of one rank: the links stand in (the device copy), ranks_per_host 1;
//   - the machine saved and loaded back is the same machine, byte for byte;
//   - a paper profile from it plans (a search at 8 ranks of this machine, its offload costed);
//   - what it refuses, named: a CPU ctx (and the CPU profile refuses a CUDA ctx), a head size the
//     tensor-core attention does not take, a MoE model, a bad given machine.
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <vector>
#define DT_CUDA
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_plan.h"
#include "tests/dt_test.h"

#define check(name, ok, ...) ((ok) ? dt_test_pass(name) : dt_test_fail(name, __VA_ARGS__))

static dt_plan_model tiny(void) {
    dt_plan_model m;
    memset(&m, 0, sizeof m);
    m.layers = 2; m.width = 64; m.heads = 4; m.vocab = 256; m.seq = 32; m.batch = 8; m.dtype = DT_BF16;
    return m;
}

static int finite_pos(double v) { return v > 0 && isfinite(v); }

int main(void) {
    dt_ctx ctx, cpu;
    dt_ctx_desc cd;
    dt_comm *world = NULL, *cworld = NULL;
    dt_plan_model m = tiny();
    dt_plan_machine mc, again, given;
    dt_plan_profile *p = (dt_plan_profile *)calloc(1, sizeof *p);
    dt_tensor held;
    dt_tensor_desc td;
    dt_status st;
    size_t fr = 0, tot = 0;
    char path[512];
    setenv("DT_EMU_DEVICE_BYTES", "8000000000", 1);
    memset(&cd, 0, sizeof cd);
    cd.device = DT_CUDA_DEVICE;
    if (!p || dt_ctx_init(&ctx, &cd) || dt_comm_create_world(&ctx, &world, NULL) || dt_ctx_init(&cpu, NULL) ||
        dt_comm_create_world(&cpu, &cworld, NULL)) {
        fprintf(stderr, "setup: %s %s\n", dt_ctx_error(&ctx), dt_ctx_error(&cpu));
        return 2;
    }
    memset(&td, 0, sizeof td);
    td.dtype = DT_F32; td.device = DT_CUDA_DEVICE; td.shape[0] = 1 << 18; /* 1 MB held before the call */
    if (dt_tensor_create(&ctx, &held, &td)) return 2;
    cudaMemGetInfo(&fr, &tot);

    st = dt_plan_machine_measure(world, &m, NULL, &mc);
    if (!check("plan_machine_measure_on_cuda", st == DT_OK, "%s", dt_ctx_error(&ctx))) return dt_test_finish();
    check("plan_machine_measure_reads_the_device_memory", mc.mem_bytes == 8e9 && mc.reserved_bytes == (double)(tot - fr),
          "mem_bytes %.17g (want 8e9), reserved %.17g (want %zu, what was held at the call)", mc.mem_bytes,
          mc.reserved_bytes, tot - fr);
    check("plan_machine_measure_reserved_counts_what_was_held", mc.reserved_bytes >= 1 << 20, "reserved %.17g < 1 MB",
          mc.reserved_bytes);
    check("plan_machine_measure_rates_are_rates",
          finite_pos(mc.flops) && finite_pos(mc.mem_bw) && finite_pos(mc.h2d_bw) && finite_pos(mc.intra_bw) &&
              finite_pos(mc.p2p_intra_bw),
          "flops %g, mem_bw %g, h2d_bw %g, intra_bw %g, p2p %g", mc.flops, mc.mem_bw, mc.h2d_bw, mc.intra_bw,
          mc.p2p_intra_bw);
    check("plan_machine_measure_peaks_are_the_fastest_measured",
          mc.mem_eff == 1 && mc.gemm_eff <= 1 && mc.attn_fwd_eff <= 1 && mc.attn_bwd_eff <= 1 &&
              (mc.gemm_eff == 1 || mc.attn_fwd_eff == 1 || mc.attn_bwd_eff == 1) && mc.gemm_eff > 0 &&
              mc.attn_fwd_eff > 0 && mc.attn_bwd_eff > 0,
          "effs gemm %g attn %g / %g, mem %g", mc.gemm_eff, mc.attn_fwd_eff, mc.attn_bwd_eff, mc.mem_eff);
    check("plan_machine_measure_one_rank_links_stand_in",
          mc.ranks_per_host == 1 && mc.intra_bw == mc.mem_bw && mc.nic_bw == mc.intra_bw && mc.intra_alpha == 0,
          "ranks_per_host %d, intra_bw %g, nic_bw %g, mem_bw %g", mc.ranks_per_host, mc.intra_bw, mc.nic_bw, mc.mem_bw);
    check("plan_machine_measure_dt_figures", mc.act_bytes == 4 && mc.overlap == 0.9 && mc.tp_overlap == 0,
          "act_bytes %g, overlap %g, tp_overlap %g", mc.act_bytes, mc.overlap, mc.tp_overlap);
    check("plan_machine_measure_names_itself", strstr(mc.name, "measured") != NULL, "name %s", mc.name);

    /* a given machine: its peaks kept (above the emulator's rates), its assumptions kept */
    given = mc;
    given.flops = 8 * mc.flops; given.mem_bw = 8 * mc.mem_bw; given.overlap = 0.5; given.tp_overlap = 0.25;
    given.h2d_bw = 0;
    st = dt_plan_machine_measure(world, &m, &given, &again);
    check("plan_machine_measure_with_given_peaks",
          st == DT_OK && again.flops == given.flops && again.mem_bw == given.mem_bw && again.overlap == 0.5 &&
              again.tp_overlap == 0.25 && again.gemm_eff < 1 && again.mem_eff < 1 && finite_pos(again.h2d_bw),
          "%s: flops %g, mem_bw %g, overlap %g, tp_overlap %g, gemm_eff %g, h2d_bw %g", st ? dt_ctx_error(&ctx) : "ok",
          again.flops, again.mem_bw, again.overlap, again.tp_overlap, again.gemm_eff, again.h2d_bw);

    /* saved and loaded back */
    snprintf(path, sizeof path, "%s/k_plan_machine.json", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    st = dt_plan_machine_save(&ctx, &mc, path, "k_plan.cpp");
    if (!st) st = dt_plan_machine_load(&ctx, &again, path);
    check("plan_machine_saved_loads_back_the_same", st == DT_OK && !memcmp(&again, &mc, sizeof mc), "%s",
          st ? dt_ctx_error(&ctx) : "fields differ");
    remove(path);
    st = dt_plan_machine_save(&ctx, &mc, "/nonexistent/dir/m.json", NULL);
    dt_test_error("plan_machine_save_unwritable_is_named", st, dt_ctx_error(&ctx), "cannot write /nonexistent");

    /* it plans: 8 ranks of this machine (one rank a host: the NICs are the device copy's rate) for
       a model of 8 blocks, whose offload (5 of them off the device) is costed at the host link */
    {
        dt_plan_prediction top[4], none, off;
        dt_plan_layout l;
        dt_plan_search_desc sd;
        dt_plan_model m8 = m;
        int n = 0, total = 0;
        m8.layers = 8;
        st = dt_plan_profile_paper(&ctx, &mc, &m8, 8, p);
        memset(&sd, 0, sizeof sd);
        sd.max_cp = 1;
        if (!st) st = dt_plan_search(&ctx, p, &sd, top, 4, &n, &total);
        check("plan_measured_machine_plans", st == DT_OK && n == 4 && top[0].layout.cp == 1 && top[0].step_s > 0,
              "%s (n %d)", st ? dt_ctx_error(&ctx) : "", n);
        memset(&l, 0, sizeof l);
        l.dp = 8;
        st = dt_plan_predict(&ctx, p, &l, &none);
        l.offload = 1;
        if (!st) st = dt_plan_predict(&ctx, p, &l, &off);
        check("plan_measured_machine_costs_offload", st == DT_OK && off.mem_total < none.mem_total &&
                                                         off.step_s >= none.step_s,
              "%s: memory %g -> %g, step %g -> %g", st ? dt_ctx_error(&ctx) : "ok", none.mem_total, off.mem_total,
              none.step_s, off.step_s);
    }

    /* refusals */
    st = dt_plan_machine_measure(cworld, &m, NULL, &again);
    dt_test_error("plan_machine_measure_cpu_ctx_is_named", st, dt_ctx_error(&cpu), "ctx is on cpu, expected cuda");
    st = dt_plan_profile_measure(world, &m, NULL, p);
    dt_test_error("plan_profile_measure_cuda_ctx_is_named", st, dt_ctx_error(&ctx), "world's ctx is on cuda");
    {
        dt_plan_model bad = m;
        bad.width = 48; bad.heads = 2;
        st = dt_plan_machine_measure(world, &bad, NULL, &again);
        dt_test_error("plan_machine_measure_head_size_is_named", st, dt_ctx_error(&ctx), "head size width / heads = 24");
        bad = m;
        bad.experts = 4;
        st = dt_plan_machine_measure(world, &bad, NULL, &again);
        dt_test_error("plan_machine_measure_moe_is_named", st, dt_ctx_error(&ctx), "model->experts = 4");
        given = mc;
        given.gemm_eff = 2;
        st = dt_plan_machine_measure(world, &m, &given, &again);
        dt_test_error("plan_machine_measure_bad_given_is_named", st, dt_ctx_error(&ctx), "gemm_eff = 2");
    }
    dt_tensor_free(&ctx, &held);
    free(p);
    {
        int rc = dt_test_finish();
        dt_comm_free(cworld);
        dt_comm_free(world);
        dt_ctx_shutdown(&cpu);
        dt_ctx_shutdown(&ctx);
        return rc;
    }
}
