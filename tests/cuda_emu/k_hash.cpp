// tests/cuda_emu/k_hash.cpp - kernels/dt_hash.cu (the GPU id -> slot table of dynamic tables) on the
// emulator against the host semantics, over many batches under capacity pressure, admit_after 1
// and 3: (1) a plain host reimplementation of dt_embed.h's "dynamic tables" rules (LRU list,
// sightings map) gives the same slot for every id, the same admitted / evicted / rejected counts
// and the same id in every slot after every batch; (2) dt_embed's own host dynamic table (one
// hash shard, one rank) fed the same stream counts the same admitted / evicted / rejected per
// batch. Then the bad arguments and a too-small sightings table (overflow flag).
#include <cuda_runtime.h>
#include <algorithm>
#include <list>
#include <map>
#include <unordered_map>
#include <vector>
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "kernels/dt_kernels.h"
#include "tests/dt_test.h"

// The rules, written from dt_embed.h's top comment, with a std::list as the LRU order.
struct host_ref {
    int64_t cap, stamp = 0;
    int admit_after;
    std::unordered_map<int64_t, int64_t> map, seen; // id -> slot, id -> sightings
    std::vector<int64_t> slot_id, slot_stamp;
    std::list<int64_t> lru;                            // front = least recently used
    std::vector<std::list<int64_t>::iterator> where;
    int64_t counts[3] = {0, 0, 0};
    host_ref(int64_t c, int a) : cap(c), admit_after(a), slot_id(c, 0), slot_stamp(c, 0), where(c) {}
    void batch(const std::vector<int64_t> &ids, std::vector<int64_t> *out) {
        int64_t step_stamp = stamp;
        out->clear();
        for (int64_t id : ids) {
            int64_t x;
            auto it = map.find(id);
            if (it == map.end()) {
                int64_t s = ++seen[id];
                bool full = (int64_t)map.size() == cap;
                if (s < admit_after || (full && slot_stamp[lru.front()] > step_stamp)) {
                    counts[2]++;
                    out->push_back(-1);
                    continue;
                }
                if (!full) x = (int64_t)map.size();
                else {
                    x = lru.front();
                    lru.pop_front();
                    map.erase(slot_id[x]);
                    counts[1]++;
                }
                seen.erase(id);
                map[id] = x;
                slot_id[x] = id;
                counts[0]++;
            } else {
                x = it->second;
                lru.erase(where[x]);
            }
            lru.push_back(x);
            where[x] = std::prev(lru.end());
            slot_stamp[x] = ++stamp;
            out->push_back(x);
        }
    }
};

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t next_u(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

// A skewed stream: half the ids from a hot set of 12, the rest from 200 (so most batches need
// evictions of a 16-slot table), ids spread over the int64 range (and a negative one).
static std::vector<int64_t> make_batch(int n) {
    std::vector<int64_t> v;
    for (int i = 0; i < n; i++) {
        uint64_t r = next_u();
        int64_t k = (r & 1) ? (int64_t)((r >> 8) % 12) : (int64_t)((r >> 8) % 200);
        v.push_back(k == 7 ? -123456789012345LL : k * 0x10000000001LL + 5);
    }
    return v;
}

static void check_stream(int admit_after, int batches, int n, int64_t cap) {
    char name[160];
    dt_k_hash h;
    host_ref ref(cap, admit_after);
    int64_t *d_ids = NULL, *d_slots = NULL, *d_counts = NULL;
    int *d_over = NULL;
    int bad_batch = -1, counts_bad = -1, ids_bad = -1, emb_bad = -1;
    std::vector<int64_t> got_c(3), want_slots;
    dt_ctx ctx;
    dt_embed *emb = NULL;
    dt_embed_table_desc td;
    dt_embed_desc ed;
    dt_ctx_init(&ctx, NULL);
    memset(&td, 0, sizeof td);
    td.name = "dyn"; td.rows = cap; td.dim = 2; td.dynamic = 1; td.admit_after = admit_after; td.hash_shards = 1;
    memset(&ed, 0, sizeof ed);
    ed.tables = &td; ed.n_tables = 1; ed.seed = 3;
    snprintf(name, sizeof name, "hash_host_dynamic_table_created_capacity_%lld", (long long)cap);
    if (!DT_TEST_CHECK(name, dt_embed_create(&ctx, &emb, &ed) == 0)) emb = NULL;
    snprintf(name, sizeof name, "hash_create_capacity_%lld_admit_after_%d", (long long)cap, admit_after);
    if (!DT_TEST_CHECK(name, dt_k_hash_create(&h, cap, 1024) == 0)) return;
    cudaMalloc((void **)&d_ids, sizeof(int64_t) * (size_t)n);
    cudaMalloc((void **)&d_slots, sizeof(int64_t) * (size_t)n);
    cudaMalloc((void **)&d_counts, sizeof(int64_t) * 3);
    cudaMalloc((void **)&d_over, sizeof(int));
    int64_t *d_adm = NULL;
    cudaMalloc((void **)&d_adm, sizeof(int64_t) * (size_t)(2 * n));
    std::vector<int64_t> prev_sid(cap, 0), prev_sst(cap, 0);
    int adm_bad = -1;
    cudaMemset(d_counts, 0, sizeof(int64_t) * 3);
    cudaMemset(d_over, 0, sizeof(int));
    int64_t prev_c[3] = {0, 0, 0};
    for (int b = 0; b < batches; b++) {
        std::vector<int64_t> ids = make_batch(n), got(n);
        ref.batch(ids, &want_slots);
        cudaMemcpy(d_ids, ids.data(), sizeof(int64_t) * (size_t)n, cudaMemcpyHostToDevice);
        int st = dt_k_hash_lookup(&h, d_slots, d_counts, d_over, d_adm, d_ids, n, admit_after, NULL);
        if (st) { dt_test_fail("hash_lookup_runs", "batch %d: %s", b, dt_k_error_string(st)); break; }
        cudaMemcpy(got.data(), d_slots, sizeof(int64_t) * (size_t)n, cudaMemcpyDeviceToHost);
        cudaMemcpy(got_c.data(), d_counts, sizeof(int64_t) * 3, cudaMemcpyDeviceToHost);
        if (bad_batch < 0 && got != want_slots) {
            bad_batch = b;
            for (int i = 0; i < n; i++)
                if (got[i] != want_slots[i]) {
                    snprintf(name, sizeof name, "hash_slots_equal_host_rules_admit_after_%d", admit_after);
                    dt_test_fail(name, "batch %d id %d (%lld): gpu slot %lld, host %lld", b, i, (long long)ids[i],
                                 (long long)got[i], (long long)want_slots[i]);
                    break;
                }
        }
        if (counts_bad < 0 && (got_c[0] != ref.counts[0] || got_c[1] != ref.counts[1] || got_c[2] != ref.counts[2])) {
            counts_bad = b;
            snprintf(name, sizeof name, "hash_counts_equal_host_rules_admit_after_%d", admit_after);
            dt_test_fail(name, "after batch %d: gpu %lld/%lld/%lld, host %lld/%lld/%lld (admitted/evicted/rejected)", b,
                         (long long)got_c[0], (long long)got_c[1], (long long)got_c[2], (long long)ref.counts[0],
                         (long long)ref.counts[1], (long long)ref.counts[2]);
        }
        std::vector<int64_t> sid(cap), sst(cap);
        cudaMemcpy(sid.data(), h.slot_id, sizeof(int64_t) * (size_t)cap, cudaMemcpyDeviceToHost);
        cudaMemcpy(sst.data(), h.slot_stamp, sizeof(int64_t) * (size_t)cap, cudaMemcpyDeviceToHost);
        { /* the admitted (slot, id) pairs: exactly the slots that took a new id this batch */
            int64_t na = got_c[0] - prev_c[0];
            std::vector<int64_t> adm((size_t)(2 * na > 0 ? 2 * na : 1)), want, gotp;
            if (na > 0) cudaMemcpy(adm.data(), d_adm, sizeof(int64_t) * (size_t)(2 * na), cudaMemcpyDeviceToHost);
            for (int64_t x = 0; x < cap; x++)
                if (sst[x] != 0 && (prev_sst[x] == 0 || prev_sid[x] != sid[x])) { want.push_back(x); want.push_back(sid[x]); }
            std::vector<std::pair<int64_t, int64_t> > pr;
            for (int64_t k = 0; k < na; k++) pr.push_back(std::make_pair(adm[2 * k], adm[2 * k + 1]));
            std::sort(pr.begin(), pr.end());
            for (size_t k = 0; k < pr.size(); k++) { gotp.push_back(pr[k].first); gotp.push_back(pr[k].second); }
            if (adm_bad < 0 && gotp != want) {
                adm_bad = b;
                snprintf(name, sizeof name, "hash_admitted_pairs_are_the_slots_with_new_ids_admit_after_%d", admit_after);
                dt_test_fail(name, "batch %d: %zu pairs listed, %zu slots took a new id", b, gotp.size() / 2,
                             want.size() / 2);
            }
            prev_sid = sid; prev_sst = sst;
        }
        if (ids_bad < 0 && (sid != ref.slot_id || sst != ref.slot_stamp)) {
            ids_bad = b;
            snprintf(name, sizeof name, "hash_ids_in_slots_equal_host_rules_admit_after_%d", admit_after);
            for (int64_t x = 0; x < cap; x++)
                if (sid[x] != ref.slot_id[x] || sst[x] != ref.slot_stamp[x]) {
                    dt_test_fail(name, "after batch %d slot %lld: gpu id %lld stamp %lld, host id %lld stamp %lld", b,
                                 (long long)x, (long long)sid[x], (long long)sst[x], (long long)ref.slot_id[x],
                                 (long long)ref.slot_stamp[x]);
                    break;
                }
        }
        if (emb) { /* dt_embed's host table: one feature, one id per sample, in batch order */
            std::vector<int64_t> lengths(n, 1);
            dt_kjt k;
            dt_tensor out;
            dt_tensor_desc od;
            dt_embed_stats es;
            memset(&k, 0, sizeof k);
            k.n_features = 1; k.batch = n; k.lengths = lengths.data(); k.ids = ids.data();
            memset(&od, 0, sizeof od);
            od.dtype = DT_F32; od.ndim = 2; od.shape[0] = n; od.shape[1] = 2;
            dt_tensor_create(&ctx, &out, &od);
            if (dt_embed_forward(emb, &out, &k) || dt_embed_stats_get(emb, &es)) emb_bad = b;
            else if (emb_bad < 0 && (es.step_admitted != got_c[0] - prev_c[0] || es.step_evicted != got_c[1] - prev_c[1] ||
                                     es.step_rejected != got_c[2] - prev_c[2])) {
                emb_bad = b;
                snprintf(name, sizeof name, "hash_counts_equal_dt_embed_host_table_admit_after_%d", admit_after);
                dt_test_fail(name, "batch %d: gpu %lld/%lld/%lld, dt_embed %lld/%lld/%lld (admitted/evicted/rejected)", b,
                             (long long)(got_c[0] - prev_c[0]), (long long)(got_c[1] - prev_c[1]),
                             (long long)(got_c[2] - prev_c[2]), (long long)es.step_admitted, (long long)es.step_evicted,
                             (long long)es.step_rejected);
            }
            dt_tensor_free(&ctx, &out);
        }
        for (int c = 0; c < 3; c++) prev_c[c] = got_c[c];
    }
    int over = 0;
    cudaMemcpy(&over, d_over, sizeof over, cudaMemcpyDeviceToHost);
    snprintf(name, sizeof name, "hash_slots_equal_host_rules_admit_after_%d_%d_batches_of_%d_capacity_%lld", admit_after,
             batches, n, (long long)cap);
    if (bad_batch < 0) dt_test_pass(name);
    snprintf(name, sizeof name, "hash_counts_equal_host_rules_admit_after_%d (%lld/%lld/%lld)", admit_after,
             (long long)ref.counts[0], (long long)ref.counts[1], (long long)ref.counts[2]);
    if (counts_bad < 0) dt_test_pass(name);
    snprintf(name, sizeof name, "hash_ids_and_stamps_in_slots_equal_host_rules_admit_after_%d", admit_after);
    if (ids_bad < 0) dt_test_pass(name);
    snprintf(name, sizeof name, "hash_admitted_pairs_are_the_slots_with_new_ids_admit_after_%d", admit_after);
    if (adm_bad < 0) dt_test_pass(name);
    snprintf(name, sizeof name, "hash_counts_equal_dt_embed_host_table_admit_after_%d", admit_after);
    if (emb && emb_bad < 0) dt_test_pass(name);
    snprintf(name, sizeof name, "hash_stream_exercised_evictions%s_admit_after_%d_capacity_%lld",
             cap < n ? "_and_rejections" : "", admit_after, (long long)cap);
    dt_test_check_all(name, ref.counts[1] > 0 && (ref.counts[2] > 0 || cap >= n) && !over, "evicted %lld, rejected %lld, overflow %d",
                      (long long)ref.counts[1], (long long)ref.counts[2], over);
    cudaFree(d_ids); cudaFree(d_slots); cudaFree(d_counts); cudaFree(d_over); cudaFree(d_adm);
    dt_k_hash_free(&h);
    dt_embed_free(emb);
    dt_ctx_shutdown(&ctx);
}

static void check_bad(void) {
    dt_k_hash h;
    DT_TEST_CHECK("hash_create_seen_cap_not_power_of_two_is_invalid_value",
                  dt_k_hash_create(&h, 8, 100) == (int)cudaErrorInvalidValue);
    DT_TEST_CHECK("hash_create_capacity_0_is_invalid_value", dt_k_hash_create(&h, 0, 64) == (int)cudaErrorInvalidValue);
    /* 2^62 cells of 8 bytes wrapped to 0: the allocations succeeded and a lookup wrote past them */
    DT_TEST_CHECK("hash_create_seen_cap_bytes_past_int64_is_invalid_value",
                  dt_k_hash_create(&h, 4, (int64_t)1 << 62) == (int)cudaErrorInvalidValue);
    DT_TEST_CHECK("hash_lookup_NULL_table_is_invalid_value",
                  dt_k_hash_lookup(NULL, NULL, NULL, NULL, NULL, NULL, 4, 1, NULL) == (int)cudaErrorInvalidValue);
    if (!DT_TEST_CHECK("hash_create_small", dt_k_hash_create(&h, 4, 4) == 0)) return;
    int64_t *d = NULL;
    int *over = NULL, o = 0;
    cudaMalloc((void **)&d, 64 * sizeof(int64_t));
    cudaMalloc((void **)&over, sizeof(int));
    cudaMemset(over, 0, sizeof(int));
    cudaMemset(d, 0, 64 * sizeof(int64_t));
    DT_TEST_CHECK("hash_lookup_admit_after_0_is_invalid_value",
                  dt_k_hash_lookup(&h, d, d + 40, over, NULL, d + 20, 4, 0, NULL) == (int)cudaErrorInvalidValue);
    { /* admit_after 5: 8 distinct ids seen once each fill a 4-cell sightings table */
        std::vector<int64_t> ids = {11, 12, 13, 14, 15, 16, 17, 18};
        cudaMemcpy(d + 20, ids.data(), ids.size() * sizeof(int64_t), cudaMemcpyHostToDevice);
        DT_TEST_CHECK("hash_lookup_sightings_overflow_runs", dt_k_hash_lookup(&h, d, d + 40, over, NULL, d + 20, 8, 5, NULL) == 0);
        cudaMemcpy(&o, over, sizeof o, cudaMemcpyDeviceToHost);
        DT_TEST_CHECK("hash_lookup_sightings_table_full_sets_overflow", o == 1);
    }
    cudaFree(d); cudaFree(over);
    dt_k_hash_free(&h);
}

int main(int argc, char **argv) {
    int tsan = argc > 1 && !strcmp(argv[1], "tsan");
    check_stream(1, tsan ? 6 : 40, 24, 16);
    check_stream(3, tsan ? 14 : 40, 24, 16); /* admit_after 3 fills the table later */
    if (!tsan) check_stream(1, 10, 64, 64); /* most ids fit: mostly hits */
    check_bad();
    return dt_test_finish();
}
