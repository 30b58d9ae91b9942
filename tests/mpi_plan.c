// np: 1 2
/* tests/mpi_plan.c - dt_plan_profile_measure on real ranks: the figures are there and sane (every
   time positive, a larger micro-batch no faster, the collectives' latency and bandwidth
   positive), every rank holds the same profile (so every rank's search picks the same layout,
   which --layout auto relies on), and a profile that has been saved and read back plans alike. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_plan.h"
#include "dt_test.h"

/* FNV-1a over the whole profile but its host name and the time measuring took (rank 0's) */
static double digest(const dt_plan_profile *p) {
    dt_plan_profile c = *p;
    const unsigned char *b = (const unsigned char *)&c;
    size_t i;
    uint64_t h = 1469598103934665603ULL;
    memset(c.machine, 0, sizeof c.machine);
    c.measure_s = 0;
    for (i = 0; i < sizeof c; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return (double)(h >> 12);
}

int main(void) {
    dt_ctx ctx;
    dt_comm *w = NULL;
    dt_plan_model m;
    dt_plan_profile *p = (dt_plan_profile *)calloc(1, sizeof *p), *q = (dt_plan_profile *)calloc(1, sizeof *q);
    dt_plan_prediction top[3], top2[3];
    int n = 0, total = 0, n2 = 0, i, ok;
    double d[2], t0;
    char path[512];
    dt_ctx_init(&ctx, NULL);
    if (dt_comm_create_world(&ctx, &w, NULL) || !p || !q) { printf("FAIL plan_world: %s\n", dt_ctx_error(&ctx)); return 1; }
    memset(&m, 0, sizeof m);
    m.layers = 2; m.width = 64; m.heads = 4; m.vocab = 256; m.seq = 32; m.batch = 8;
    t0 = dt_comm_now();
    if (!DT_TEST_CHECK("plan_profile_measures", dt_plan_profile_measure(w, &m, NULL, p) == DT_OK)) {
        if (dt_comm_rank(w) == 0) printf("  %s\n", dt_ctx_error(&ctx));
        return dt_test_finish();
    }
    if (dt_comm_rank(w) == 0) printf("  (measured %d splits, %d collectives, %d pipes in %.2f s)\n", p->n_splits,
                                     p->n_colls, p->n_pipes, dt_comm_now() - t0);
    DT_TEST_CHECK("plan_profile_knows_its_world", p->world == dt_comm_size(w) && p->hosts >= 1 && p->cores >= 1);
    for (i = 0, ok = p->n_splits > 0; i < p->n_splits; i++) {
        const dt_plan_split *s = &p->splits[i];
        ok = ok && s->rows[0] >= 1 && s->rows[1] >= s->rows[0] && s->fwd[0] > 0 && s->bwd[0] > 0 && s->head_bwd[0] > 0 &&
             s->extra[0] > 0 && s->fwd[1] >= 0.5 * s->fwd[0] && s->bwd[1] >= 0.5 * s->bwd[0];
    }
    DT_TEST_CHECK("plan_profile_block_times_are_positive_and_grow_with_rows", ok);
    if (dt_comm_size(w) == 2) { /* cp 2 both ways: the ring (lse) and Ulysses (4 heads over 2: [T, T]) */
        int ring = 0, uly = 0;
        for (i = 0; i < p->n_splits; i++)
            if (p->splits[i].cp == 2) {
                ring += p->splits[i].lse && !p->splits[i].ulysses;
                uly += p->splits[i].ulysses && !p->splits[i].lse;
            }
        DT_TEST_CHECK("plan_profile_times_cp_by_the_ring_and_by_ulysses", ring == 1 && uly == 1);
    }
    for (i = 0, ok = 1; i < p->n_colls; i++) ok = ok && p->colls[i].alpha >= 0 && p->colls[i].beta >= 0 && p->colls[i].alpha + p->colls[i].beta > 0;
    DT_TEST_CHECK("plan_profile_collectives_are_measured", ok && p->n_colls == (dt_comm_size(w) > 1 ? 4 : 0));
    DT_TEST_CHECK("plan_profile_optimizer_is_measured", p->opt_s_per_param > 0 && p->copy_s_per_byte > 0);
    { /* a GPU machine's figures need a CUDA build (tests/cuda_emu/k_plan.cpp measures them) */
        dt_plan_machine mc;
        dt_test_error("plan_machine_measure_without_cuda_is_named", dt_plan_machine_measure(w, &m, NULL, &mc),
                      dt_ctx_error(&ctx), "built without DT_CUDA");
    }
    d[0] = digest(p); d[1] = -d[0];
    dt_comm_allreduce_f64(w, d, 2, DT_REDUCE_MAX);
    DT_TEST_CHECK("plan_profile_is_the_same_on_every_rank", d[0] == -d[1]);
    dt_plan_search(&ctx, p, NULL, top, 3, &n, &total);
    {
        double e[4];
        e[0] = top[0].step_s; e[1] = -top[0].step_s;
        e[2] = top[0].layout.tp + 64.0 * (top[0].layout.pp + 64.0 * (top[0].layout.micro + 64.0 * (top[0].layout.zero +
               4.0 * (top[0].layout.recompute + 4.0 * (top[0].layout.sp + 2.0 * top[0].layout.schedule)))));
        e[3] = -e[2];
        dt_comm_allreduce_f64(w, e, 4, DT_REDUCE_MAX);
        DT_TEST_CHECK("plan_search_picks_the_same_layout_on_every_rank", n > 0 && e[0] == -e[1] && e[2] == -e[3]);
    }
    snprintf(path, sizeof path, "%s/profile_%d.json", dt_test_tmpdir(), dt_comm_rank(w));
    if (dt_plan_profile_save(&ctx, p, path) || dt_plan_profile_load(&ctx, q, path)) {
        dt_test_fail("plan_profile_file_plans_alike", "%s", dt_ctx_error(&ctx));
    } else {
        dt_plan_search(&ctx, q, NULL, top2, 3, &n2, NULL);
        ok = n2 == n;
        for (i = 0; ok && i < n; i++)
            ok = !memcmp(&top[i].layout, &top2[i].layout, sizeof top[i].layout) &&
                 fabs(top[i].step_s - top2[i].step_s) <= 1e-8 * top[i].step_s;
        DT_TEST_CHECK("plan_profile_file_plans_alike", ok);
    }
    {   /* a MoE model: its layer timed at every (tp, sp, ep) (np 2: ep 1 and 2), slower than the dense
           MLP it replaces (each token visits 2 of 4 experts, each as wide as that MLP), its routed
           rows held (xin, hidden and GELU values: 9 C floats a row and choice, at least half of the
           rows' 2 choices kept under capacity 1.25) */
        dt_plan_model mm = m;
        int eps = 0;
        mm.experts = 4; mm.top_k = 2; mm.capacity = 1.25; mm.balance = DT_MOE_BIAS;
        if (!DT_TEST_CHECK("plan_moe_profile_measures", dt_plan_profile_measure(w, &mm, NULL, p) == DT_OK)) {
            if (dt_comm_rank(w) == 0) printf("  %s\n", dt_ctx_error(&ctx));
        } else {
            for (i = 0, ok = p->n_moes > 0; i < p->n_moes; i++) {
                const dt_plan_moe *x = &p->moes[i];
                double want = 0.5 * (double)x->rows[1] * 2 * 9 * mm.width * 4;
                eps |= 1 << x->ep;
                ok = ok && x->fwd[0] > 0 && x->bwd[0] > 0 && x->fwd[1] > x->mlp_fwd[1] && x->bwd[1] > x->mlp_bwd[1] &&
                     x->mlp_fwd[0] > 0 && x->acts[1] >= want && x->layer[1] >= 0;
                if (!ok && dt_comm_rank(w) == 0)
                    printf("  moes[%d] tp %d sp %d ep %d rows %lld: fwd %g (mlp %g), bwd %g (mlp %g), acts %g (want >= %g)\n",
                           i, x->tp, x->sp, x->ep, (long long)x->rows[1], x->fwd[1], x->mlp_fwd[1], x->bwd[1],
                           x->mlp_bwd[1], x->acts[1], want);
            }
            DT_TEST_CHECK("plan_moe_profile_times_the_layer", ok);
            {
                int want = 0, e;
                for (e = 1; e <= dt_comm_size(w) && e <= 4; e++)
                    if (dt_comm_size(w) % e == 0 && 4 % e == 0) want |= 1 << e; /* ep divides dp x cp and the experts */
                DT_TEST_CHECK("plan_moe_profile_has_every_ep", eps == want);
            }
            d[0] = digest(p); d[1] = -d[0];
            dt_comm_allreduce_f64(w, d, 2, DT_REDUCE_MAX);
            DT_TEST_CHECK("plan_moe_profile_is_the_same_on_every_rank", d[0] == -d[1]);
            DT_TEST_CHECK("plan_moe_search_finds_layouts", dt_plan_search(&ctx, p, NULL, top, 3, &n, &total) == DT_OK &&
                          n > 0);
        }
    }
    free(p);
    free(q);
    ok = dt_test_finish();
    dt_comm_free(w);
    dt_ctx_shutdown(&ctx);
    return ok;
}
