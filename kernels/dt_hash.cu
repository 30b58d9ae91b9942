/* kernels/dt_hash.cu - a GPU id -> slot table for dt_embed.h's dynamic tables (one id-hash shard),
   with the host map's semantics ("dynamic tables" in dt_embed.h): the ids of a batch taken in
   order; an id with a slot uses it and becomes the most recently used; otherwise its sightings
   go up by one and it is rejected below admit_after; at admit_after it takes a free slot, or
   evicts the least recently used slot, unless that slot was used by this same batch (then it is
   rejected and keeps the sighting). Slots, counts and the ids held are the host map's for the
   same id stream (tests/cuda_emu/k_hash.cpp).

   How: two open-addressing tables (linear probing, splitmix64 of the id as dt_embed_hash_id):
   id -> slot and id -> sightings; the LRU order as a doubly linked list over the slots with a
   stamp per slot (the host's structure). Two launches per batch:
     1. probe (one thread per id, in parallel, read-only): the slot each id held when the batch
        began, or -1;
     2. commit (ONE thread, the ids in batch order): the decisions. A probed slot still holding
        its id is a hit at once (O(1)); the rest (new ids, and ids evicted earlier in the batch)
        re-probe and are admitted or rejected there. Deletions shift the probe run back (no
        tombstones), so a table never fills with dead entries. Each admission is also listed as
        a (slot, id) pair, so dt_embed.h initialises the new rows without reading the slot
        table back.
   The commit is sequential on purpose: each decision depends on every earlier one (an eviction
   can remove an id the batch uses later), and the host's order is the contract. Its cost is
   O(batch) on one thread: fine for the few thousand ids a shard sees per step, not a design for
   millions (a parallel commit: first-occurrence dedup + a scan of admissions + a sort of victims
   by stamp, with the eviction-then-reuse cases fixed up; not written yet).
                                                                      MIT licence (see dt_tensor.h) */
#include "dt_cuda.cuh"
#include <stdint.h>
#include <string.h>

__device__ static uint64_t dt_k__hmix(int64_t id) { /* dt_embed_hash_id: the splitmix64 finaliser */
    uint64_t z = (uint64_t)id;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The cell of key, or -1 (absent). */
__device__ static int64_t dt_k__hfind(const int64_t *key, const int *full, int64_t cap, int64_t k) {
    uint64_t mask = (uint64_t)cap - 1, i = dt_k__hmix(k) & mask;
    int64_t probes;
    for (probes = 0; probes < cap; probes++, i = (i + 1) & mask) {
        if (!full[i]) return -1;
        if (key[i] == k) return (int64_t)i;
    }
    return -1;
}

/* Inserts (k, v), k absent; 0, or 1 when the table is full. */
__device__ static int dt_k__hput(int64_t *key, int64_t *val, int *full, int64_t cap, int64_t *count, int64_t k,
                                 int64_t v) {
    uint64_t mask = (uint64_t)cap - 1, i = dt_k__hmix(k) & mask;
    if (*count + 1 >= cap) return 1; /* keep one empty cell: lookups stop there */
    while (full[i]) i = (i + 1) & mask;
    key[i] = k; val[i] = v; full[i] = 1;
    (*count)++;
    return 0;
}

/* Removes cell c, moving later entries of its probe run back into the hole (linear probing's
   deletion without tombstones). */
__device__ static void dt_k__hdel(int64_t *key, int64_t *val, int *full, int64_t cap, int64_t *count, int64_t c) {
    uint64_t mask = (uint64_t)cap - 1, hole = (uint64_t)c, j = (uint64_t)c;
    full[hole] = 0;
    (*count)--;
    for (;;) {
        uint64_t home;
        j = (j + 1) & mask;
        if (!full[j]) return;
        home = dt_k__hmix(key[j]) & mask;
        /* j's entry may move to the hole iff its home is not in (hole, j] cyclically */
        if ((j > hole && (home <= hole || home > j)) || (j < hole && home <= hole && home > j)) {
            key[hole] = key[j]; val[hole] = val[j]; full[hole] = 1;
            full[j] = 0;
            hole = j;
        }
    }
}

static __global__ void dt_k__hash_probe(int64_t *pre, const int64_t *mkey, const int64_t *mval, const int *mfull,
                                        int64_t mcap, const int64_t *ids, int64_t n) {
    int64_t i;
    for (i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = dt_k__hfind(mkey, mfull, mcap, ids[i]);
        pre[i] = c < 0 ? -1 : mval[c];
    }
}

/* hdr: [0] used, [1] head, [2] tail, [3] stamp, [4] map entries, [5] seen entries. */
static __global__ void dt_k__hash_commit(int64_t *slots, int64_t *counts, int *overflow, int64_t *admitted,
                                         dt_k_hash h, const int64_t *ids, int64_t n, int admit_after) {
    int64_t *hd = h.hdr, i, step_stamp = h.hdr[3];
    int64_t adm = 0, ev = 0, rej = 0;
    for (i = 0; i < n; i++) {
        int64_t id = ids[i], x = slots[i], c, seen;
        if (x < 0 || h.slot_id[x] != id || h.slot_stamp[x] == 0) { /* not a hit as probed: decide */
            c = dt_k__hfind(h.map_key, h.map_full, h.map_cap, id);
            x = c < 0 ? -1 : h.map_val[c];
        }
        if (x < 0) {
            int64_t sc = dt_k__hfind(h.seen_key, h.seen_full, h.seen_cap, id);
            seen = (sc < 0 ? 0 : h.seen_val[sc]) + 1;
            if (seen < admit_after || (hd[0] == h.capacity && h.slot_stamp[hd[1]] > step_stamp)) {
                if (sc >= 0) h.seen_val[sc] = seen;
                else if (dt_k__hput(h.seen_key, h.seen_val, h.seen_full, h.seen_cap, &hd[5], id, seen)) *overflow = 1;
                rej++;
                slots[i] = -1;
                continue;
            }
            if (hd[0] < h.capacity) {
                x = hd[0]++;
            } else { /* evict the head */
                x = hd[1];
                c = dt_k__hfind(h.map_key, h.map_full, h.map_cap, h.slot_id[x]);
                if (c >= 0) dt_k__hdel(h.map_key, h.map_val, h.map_full, h.map_cap, &hd[4], c);
                if (h.prev[x] >= 0) h.next[h.prev[x]] = h.next[x]; else hd[1] = h.next[x];
                if (h.next[x] >= 0) h.prev[h.next[x]] = h.prev[x]; else hd[2] = h.prev[x];
                ev++;
            }
            if (sc >= 0) dt_k__hdel(h.seen_key, h.seen_val, h.seen_full, h.seen_cap, &hd[5], sc);
            if (dt_k__hput(h.map_key, h.map_val, h.map_full, h.map_cap, &hd[4], id, x)) *overflow = 1;
            h.slot_id[x] = id;
            h.prev[x] = hd[2]; h.next[x] = -1; /* append at the tail */
            if (hd[2] >= 0) h.next[hd[2]] = x; else hd[1] = x;
            hd[2] = x;
            if (admitted) { admitted[2 * adm] = x; admitted[2 * adm + 1] = id; }
            adm++;
        }
        h.slot_stamp[x] = ++hd[3];
        if (hd[2] != x) { /* to the tail: the most recently used */
            if (h.prev[x] >= 0) h.next[h.prev[x]] = h.next[x]; else hd[1] = h.next[x];
            if (h.next[x] >= 0) h.prev[h.next[x]] = h.prev[x]; else hd[2] = h.prev[x];
            h.prev[x] = hd[2]; h.next[x] = -1;
            if (hd[2] >= 0) h.next[hd[2]] = x; else hd[1] = x;
            hd[2] = x;
        }
        slots[i] = x;
    }
    counts[0] += adm; counts[1] += ev; counts[2] += rej;
}

static int dt_k__pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

extern "C" int dt_k_hash_create(dt_k_hash *h, int64_t capacity, int64_t seen_cap) {
    int64_t mcap = 2;
    cudaError_t e = cudaSuccess;
    /* seen_cap * 8 bytes must fit: 2^62 wrapped to 0, the allocations "succeeded" and a lookup wrote past them */
    if (!h || capacity < 1 || capacity > ((int64_t)1 << 40) || !dt_k__pow2(seen_cap) || seen_cap > INT64_MAX / 8)
        return (int)cudaErrorInvalidValue;
    while (mcap < 2 * capacity) mcap *= 2;
    memset(h, 0, sizeof *h);
    h->capacity = capacity; h->map_cap = mcap; h->seen_cap = seen_cap;
#define DT_K__HALLOC(p, n, T) if (e == cudaSuccess) { e = cudaMalloc((void **)&(p), (size_t)(n) * sizeof(T)); \
                                  if (e == cudaSuccess) e = cudaMemset((p), 0, (size_t)(n) * sizeof(T)); }
    DT_K__HALLOC(h->map_key, mcap, int64_t) DT_K__HALLOC(h->map_val, mcap, int64_t) DT_K__HALLOC(h->map_full, mcap, int)
    DT_K__HALLOC(h->seen_key, seen_cap, int64_t) DT_K__HALLOC(h->seen_val, seen_cap, int64_t)
    DT_K__HALLOC(h->seen_full, seen_cap, int)
    DT_K__HALLOC(h->slot_id, capacity, int64_t) DT_K__HALLOC(h->slot_stamp, capacity, int64_t)
    DT_K__HALLOC(h->prev, capacity, int64_t) DT_K__HALLOC(h->next, capacity, int64_t)
    DT_K__HALLOC(h->hdr, 8, int64_t)
#undef DT_K__HALLOC
    if (e == cudaSuccess) { /* head = tail = -1 */
        int64_t hdr[8] = {0, -1, -1, 0, 0, 0, 0, 0};
        e = cudaMemcpy(h->hdr, hdr, sizeof hdr, cudaMemcpyHostToDevice);
    }
    if (e != cudaSuccess) dt_k_hash_free(h);
    return (int)e;
}

extern "C" void dt_k_hash_free(dt_k_hash *h) {
    if (!h) return;
    cudaFree(h->map_key); cudaFree(h->map_val); cudaFree(h->map_full);
    cudaFree(h->seen_key); cudaFree(h->seen_val); cudaFree(h->seen_full);
    cudaFree(h->slot_id); cudaFree(h->slot_stamp); cudaFree(h->prev); cudaFree(h->next); cudaFree(h->hdr);
    memset(h, 0, sizeof *h);
}

extern "C" int dt_k_hash_lookup(const dt_k_hash *h, int64_t *slots, int64_t *counts, int *overflow, int64_t *admitted,
                                const int64_t *ids, int64_t n, int admit_after, void *stream) {
    int threads = 128;
    if (!h || !h->hdr || n < 0 || admit_after < 1 || (n > 0 && (!slots || !counts || !overflow || !ids)))
        return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    DT_K_LAUNCH(dt_k__hash_probe, dt_k__blocks(n, threads, 1024), threads, 0, stream, slots, h->map_key, h->map_val,
                h->map_full, h->map_cap, ids, n);
    DT_K_LAUNCH(dt_k__hash_commit, 1, 1, 0, stream, slots, counts, overflow, admitted, *h, ids, n, admit_after);
    return DT_K_CHECK();
}
