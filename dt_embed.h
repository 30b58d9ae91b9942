/* dt_embed.h - sharded sparse embedding tables for the dt toolkit: tables partitioned over ranks
   (table-wise, row-wise, column-wise, data-parallel), lookups through all-to-all, sum / mean /
   sequence pooling, fused sparse optimizers, a sharding planner, checkpoints by logical row and an
   incremental export of the rows changed since the last one.          v0.1, MIT licence

   The lesson. A table too large for one rank is cut over the ranks. A lookup sends each id to
   the rank that owns its row, the owner gathers and pools, and the vectors come back (TorchRec's
   sharded EmbeddingBag); the backward sends the gradients the same way and the owner updates
   only the rows that were touched:
        rank r (its local batch)                     owner k (its block of rows)
        ids --bucketize by owner--> [for 0][for 1]..
                  ====== all-to-all: ids (+ weights) ======>  gather the rows, pool each bag
        out [B, dims]  <====== all-to-all: pooled vectors ======
        dout [B, dims] ====== all-to-all: gradients ============>  sum each row's gradient in
                                                                   (sample, feature, position)
                                                                   order; sparse update of the
                                                                   touched rows only
   Sums run in a fixed order (a bag in bag order; a row-wise bag's rows come back one by one and
   the requester sums them), so any world size and any plan give the single-rank result bit for
   bit. forward_begin posts the id exchange and forward_end finishes it, so the ids can travel
   while the dense model computes ("overlap").

   Contents. Each marker finds this line, its section in the declarations and the same section
   in the implementation (which starts at >>implementation):
       >>types      pooling, sharding, optimizers, the descs, the batch (dt_kjt), stats
       >>ids        the fixed id hash
       >>create     create, free, the plan
       >>forward    the forward: begin (ids posted), end (rows gathered, pooled, returned),
                    progress, sequence views; the general path of every table
       >>backward   gradients to the owners, the sparse update, accumulation (set_sync)
       >>tier       tiered tables: prefetch, flush, counters; in the implementation also
                    the slow tier and the cache of hot rows                  (before forward)
       >>ckpt       checkpoints, the export of changed rows, stats, the local shard
     and in the implementation only:
       >>requests   the forward's requests: batch checks, pooling loops     (before forward)
       >>dynamic    dynamic tables: admission, LRU / LFU eviction, moves    (before forward)
       >>cuda       CUDA tables                                             (last)
   After the options and an example, this comment holds the reference: the batch, shardings and
   exactness, ids, dynamic tables, tiered tables, sparse optimizers, the planner, checkpoints and
   export, overlap, CUDA, then memory, errors and threads.

   API in one breath, in the order a training program calls it:
       dt_embed_create                 tables + features + the plan (collective);
                                       dt_embed_plan_print shows it
       dt_embed_pooled_dim / _feature_offset   where each feature lands in the output
       dt_embed_checkpoint_load        resume
       each step                       dt_embed_forward (or dt_embed_forward_begin, the caller's
                                       work with dt_embed_progress between layers, then
                                       dt_embed_forward_end); dt_embed_sequence for pooling NONE
                                       features; the dense model; dt_embed_sequence_grad;
                                       dt_embed_backward (after dt_embed_set_sync(0) to
                                       accumulate micro-batches)
       dt_embed_checkpoint_save, dt_embed_export_changed, dt_embed_stats_get
       dt_embed_free
     tiered tables (tier DISK): dt_embed_prefetch(next batch) after each forward,
       dt_embed_flush, dt_embed_tier_stats_get
     also: dt_embed_table_sharding, dt_embed_local_shard, dt_embed_hash_id

   Do this:
       #define DT_EMBED_IMPLEMENTATION       (or DT_IMPLEMENTATION for every dt header)
   before you include this file in *one* C or C++ file to create the implementation.
   Include order: dt_tensor.h, dt_comm.h, dt_opt.h, dt_embed.h.

   Compile-time options:
     in every file:
       DT_STATIC, DT_API   as in dt_tensor.h.
     in the implementation file only:
       DT_MPI              (seen by dt_comm.h) tables sharded over the ranks of desc.comm; without
                           it every comm is a world of one and everything still runs.
       DT_EMBED_NO_SIMD    plain C loops instead of SSE2 in pooling and in the sums of a row's
                           gradient (same results, bit for bit: tests/test_embed_simd.c). Rows are
                           prefetched a few ids ahead with __builtin_prefetch (gcc, clang; a hint
                           that changes no value, a no-op elsewhere).
       DT_EMBED_NO_HUGEPAGE  no huge-page advice on large shards (see "Memory" below).
       DT_EMBED_NO_THREADS   dt_embed_prefetch looks up and copies rows in the calling thread
                           instead of a helper thread (see "tiered tables").
       DT_STB_DS_H         the stb_ds header to include (default <stb/stb_ds.h>, Debian libstb-dev).
       DT_EMBED_NO_STB_DS_IMPLEMENTATION   stb_ds's implementation (STB_DS_IMPLEMENTATION) must be
                           compiled exactly once per program: dt_embed.h's implementation compiles
                           it unless this is defined (or STB_DS_IMPLEMENTATION already is). Define
                           it when another file of your program defines STB_DS_IMPLEMENTATION.
                           Under DT_STATIC it is not compiled (stb_ds's functions are always
                           extern): define STB_DS_IMPLEMENTATION in one file of the program, or
                           DT_EMBED_STB_DS_IMPLEMENTATION to compile it here anyway.

   A training step (DLRM):

       dt_embed_table_desc tabs[2] = {{0}};
       tabs[0].name = "user"; tabs[0].rows = 1000000; tabs[0].dim = 16; tabs[0].optim.kind = DT_EMBED_ADAGRAD;
       tabs[1].name = "ad";   tabs[1].rows = 1000;    tabs[1].dim = 16;
       dt_embed_desc ed = {0}; ed.tables = tabs; ed.n_tables = 2; ed.comm = world; ed.seed = 7;
       dt_embed_create(&ctx, &emb, &ed);                 // planner: row-wise user, data-parallel ad
       for each step:
           dt_embed_forward(emb, &pooled, &kjt);         // pooled [B_local, 32]
           ... dense forward, loss, dense backward into dpooled ...
           dt_embed_backward(emb, &dpooled);            // sparse update of the touched rows

   ---------------------------------------------------------------- the batch

   A dt_kjt (TorchRec's KeyedJaggedTensor) holds this rank's local batch of B samples:
   lengths[f * B + b] ids of feature f for sample b, the ids feature-major (all of feature 0's
   bags, then feature 1's), each bag's ids in order, optional per-id weights. B = 0, empty bags
   and empty features are valid. The ranks' local batches form the global batch in rank order:
   rank r's sample b is global sample (B_0 + ... + B_(r-1)) + b. ids are int64 (int32 accepted).

   ---------------------------------------------------------------- shardings, and exactness

   table-wise (DT_SHARD_TABLE)   the whole table on one rank; bags pooled there.
   row-wise   (DT_SHARD_ROW)     contiguous row blocks, rank k holds rows [k*R/W, (k+1)*R/W)
                                 (rounded as R = q*W + m: the first m ranks one more row).
   column-wise (DT_SHARD_COLUMN) contiguous column blocks [k*D/W, (k+1)*D/W); bags pooled on every
                                 owner over its columns, the columns joined on return.
   data-parallel (DT_SHARD_DATA) every rank holds the table; lookups are local; the backward
                                 gathers every rank's (row, gradient) pairs on every rank, which
                                 all apply the same update (a sparse all-reduce).
   table-row (DT_SHARD_TABLE_ROW) TorchRec's table-wise-row-wise: row-wise (the same blocks and
                                 rounding) over one group of G = group_size consecutive ranks,
                                 [g*G, (g+1)*G); G = 0: the ranks of one host as the comm sees
                                 hosts (dt_comm_ranks_per_host: desc.host_size's where set; every
                                 host must hold G ranks, consecutive), so a table's lookup
                                 traffic stays inside a host. G must divide the world (DT_ERR_ARG
                                 naming group_size). The group is the planner's (least loaded),
                                 or pin_owner = 1 pins it: the group holding rank `owner`.
   AUTO (the default)            the planner chooses (below).
   On one rank every resident cpu table with rows of up to 512 bytes (dim 128 f32) is whole whatever
   its sharding, and runs the data-parallel path (pooled in place, gradients read where they lie):
   no requests, the same sums in the same order; the plan still reports the sharding chosen.

   Exactness: the parallel result equals the single-rank result bit for bit, at any world size
   and under any plan. How: a pooled bag is always summed in bag order, starting from 0, in f32:
   pooled = ((0 + w_0 row_0) + w_1 row_1) + ... (w = 1 unweighted; mean divides by the length
   last). Table-wise, column-wise and data-parallel tables pool the whole bag on one rank. A
   row-wise (or table-row) bag is split over owners, and partial sums reduced in rank order
   would depend on the world size, so row-wise owners return each looked-up (weighted) row and
   the requesting rank sums them in bag order: the bytes of one row per id instead of one row
   per (bag, owner): the same for one-hot features (Criteo: one id per bag), more for long bags.
   The sparse update of a row sums its gradient contributions in one fixed order: by (global
   sample, feature, position in the bag), sorted on the owner (the sort also deduplicates the
   ids), whatever rank they came from. So training at any world size gives the single-rank
   rows and outputs bit for bit.

   ---------------------------------------------------------------- ids

   DT_IDS_CHECK (default): an id outside [0, rows) is DT_ERR_RANGE naming the table, feature,
   sample and id, on the rank that has it; the other ranks get DT_ERR_RANGE naming that rank.
   Nothing is exchanged or updated. DT_IDS_HASH: row = dt_embed_hash_id(id) mod rows, any id.
   dt_embed_hash_id is one splitmix64 step: the id read as a uint64, plus 0x9e3779b97f4a7c15
   (mod 2^64), then the splitmix64 finaliser: z ^= z >> 30, z *= 0xbf58476d1ce4e5b9, z ^= z >> 27,
   z *= 0x94d049bb133111eb, z ^= z >> 31 (fixed: a model trained with it keeps its meaning across
   versions; tests/test_embed.c pins values).

   ---------------------------------------------------------------- dynamic tables

   table desc dynamic = 1: any 64-bit id gets a row (a slot) when it is admitted; rows is the
   capacity. The id space is cut into S = hash_shards (default 16) id-hash shards, shard(id) =
   dt_embed_hash_id(id) mod S, and the capacity into S blocks of slots (R = q*S + m as for
   row-wise). Rank k owns shards [k*S/W, (k+1)*S/W), so a shard's slots, capacity and history
   are the same at every world size (a world larger than S leaves ranks without shards). Each
   shard keeps a stb_ds hash map id -> slot and a map id -> sightings of ids not admitted yet.
   On the owner, the ids of a forward are taken in the global (sample, feature, position) order:
     - an id with a slot uses it and becomes the most recently used;
     - otherwise its sightings go up by one; below admit_after (default 1) it is rejected;
     - at admit_after it is admitted: into a free slot, or by evicting the least recently used
       slot of its shard (eviction LRU, the default; O(1): a list per shard) or, with eviction
       DT_EVICT_LFU, the least frequently used one: the fewest uses since its id was admitted
       (an admission counts 1, each later occurrence 1 more), ties to the least recently used
       (O(log n): a heap per shard ordered by (count, last use)). A slot used by the same
       forward (with dt_embed_set_sync 0: by any forward since the last update, so by the
       union batch) is never evicted: if the victim is, the new id is rejected and counts the
       sighting (under LFU a fresh admission, count 1, is often that victim: the rest of the
       batch's new ids of that shard wait for the next forward).
     - an admitted (or re-admitted) row is initialised from (seed, "<table>#<id>") and its
       optimizer state zeroed, so values never depend on which rank or slot holds the id.
   A rejected id looks up zeros and its gradient is dropped. dt_embed_stats counts admitted,
   evicted and rejected ids on this rank's shards (the sum over ranks equals a single-rank run).
   Checkpoints hold the slots ("weight" and state by slot, "slot_id", "slot_stamp" = last use,
   and under LFU "slot_count"), so they reshard like row-wise tables (any world size or plan:
   a shard's slots are the same) and a resumed run evicts the same ids. Loaded into another
   hash_shards (same rows), every saved id moves, with its row, optimizer state and LFU count,
   to the shard that owns it now (an all-to-all), filling it least recent first by (saved last
   use, id): each saved shard's order is kept, but two saved shards' uses come from different
   clocks, so their interleaving is that convention, and evictions after the load may differ
   from an uninterrupted run's (which had other shards). A shard given more ids than slots:
   DT_ERR_UNSUPPORTED on every rank naming it (the table then holds what was read: load another
   checkpoint or recreate it). cuda tables: another hash_shards is DT_ERR_UNSUPPORTED, naming a
   misplaced id. The sightings of ids not yet admitted are not saved
   (a resumed run admits such an id later than an uninterrupted one would).

   ---------------------------------------------------------------- tiered tables

   table desc tier = DT_TIER_DISK (cpu tables): each rank's shard and its optimizer state live in
   a file (the slow tier), and cache_rows of its rows in memory (the fast tier):
        fast tier (memory)    cache: cache_rows slots (row + state), a map row -> slot,
                              LRU or LFU (cache_eviction) over the slots not pinned
               | fetch on a miss (or ahead: prefetch)   ^ write-back of a changed row it evicts
        slow tier (a file)    the whole shard: rows, then state, then a log of written-back rows,
                              page-aligned regions of one file mapped MAP_SHARED (desc.tier_dir,
                              else $TMPDIR, else /tmp; unlinked at once: scratch, gone with the
                              process; checkpoints are the copy that lasts)
   A write-back appends the row and its state to the log (sequential: 15 rows of 260 bytes fill
   a page the disk writes once) instead of rewriting its 4 KiB page in place; reads follow the
   row to its latest copy. The log has two halves (log_rows records in all, default the shard's
   rows); a full half is folded on a thread of its own while the other fills: its rows copied
   home in row order, each page of the table written once. So the file takes up to twice the
   shard's bytes, and memory 4 bytes a row to find the logged ones. (In place, past the
   kernel's dirty-page thresholds, each eviction cost a page of disk write: 0.28 of the resident
   rate at 8 GiB; see >>tier.)
   Ids follow a power law, so a cache of a few percent of the rows serves most lookups. Every
   row a forward reads and every row an update writes goes through the cache; the bytes of a row
   are only copied between the tiers, so training equals the resident table bit for bit, under
   every sharding, optimizer, dtype and pooling, dynamic tables (their slots are the rows) and
   accumulation too (tests/mpi_embed_tier.c, np 1-4). A row the batch in flight uses is pinned
   from its lookup until the next batch's lookups start (after the backward): the cache must
   hold one step's distinct rows on each rank (an owner's rows of the global batch; a data-
   parallel table's rows of the local batch), else the forward is DT_ERR_RANGE on every rank
   naming cache_rows; with dt_embed_prefetch, two steps' for the prefetch to find room. With
   cache_rows 0 the cache is cache_fraction (default 1/8) of the local shard, never below two
   batches' ids (2 x ids_per_batch, else desc.batch_hint). An update whose row finds no slot
   (a data-parallel table's rows of other ranks' samples, the micro-batches of an accumulation)
   is applied in the slow tier directly. Forwards without a backward (evaluation) release their
   rows at the next forward.
   Prefetch: dt_embed_prefetch(e, next) after forward(s), before backward(s), begins batch s+1
   (its ids go to the owners, as dt_embed_forward_begin: collective) and each owner looks its ids
   up, reserving a slot for every row not cached (pinned through batch s+1: never evicted for
   batch s's sake, FBGEMM's known bug when they are) and copying the misses in. Static LRU
   tables that are not data-parallel are looked up by a helper thread, which then copies,
   while the caller does batch s's dense work and backward (the update writes only batch s's
   own pinned slots meanwhile):
        caller:  forward(s) | prefetch(s+1): ids | dense(s), backward(s)        | forward(s+1)
        helper:                 look up s+1, reserve, copy its misses .. (done) |
   (LFU, dynamic and data-parallel tiered tables: looked up in dt_embed_prefetch, the copies
   still on the helper; DT_EMBED_PREFETCH_SYNC=1 in the environment at dt_embed_create:
   every lookup there.)
   forward(s+1) must pass the same batch (checked: its lengths, ids and weights hashed; else
   DT_ERR_ARG on every rank) and waits for what is not done yet (tier stats seconds_wait). Rows
   no slot was found for are fetched by the forward. Cuda tables (tier HOST): the copies run on
   a copy stream instead (see "CUDA").
   dt_embed_flush writes every changed cached row back: the slow tier then equals the resident
   table (dt_embed_local_shard of a tiered table flushes and views the slow tier). Checkpoints
   flush first and save from the slow tier: the same files as a resident table's (load either
   way, reshard as usual); a load writes the slow tier and empties the caches.
   dt_embed_tier_stats_get: per table and rank, hits and misses (ids whose row was / was not
   cached at their first lookup), rows fetched at use and prefetched, evicted and written back,
   bytes each way, seconds waited for prefetched rows, the log's folds (rows folded, seconds).
   Memory per slot besides the row and its
   state: 64 bytes (its books in one cache line) + the map's ~34 (open addressing, load <= 1/2).
   When to use it: the shards do not fit in memory (or should not: a host's memory shared by
   other work) and ids are skewed enough that cache_rows rows serve most lookups; bench/embed
   --tiers measures both on this machine (bench/RESULTS.md). The slow tier's speed is the page
   cache's while the file fits in it, the disk's beyond. Cuda tables take tier = DT_TIER_HOST:
   pinned host memory under a device cache, the same cache (see "CUDA").

   ---------------------------------------------------------------- sparse optimizers

   Applied on the owner, to each touched row only, once per dt_embed_backward, with g the row's
   gradient summed as above (g += w * dpooled for each occurrence; dpooled / length for mean).
   Rows never touched are never read or written: a step costs O(ids), never O(rows). t is the
   table's backward count (1, 2, ...), the same on every rank.
   SGD (lr 0.01):                       w = w - lr * g                       (dt_sgd_update)
       = torch.optim.SGD on a sparse gradient.
   Adagrad (lr 0.01, eps 1e-10):        s = s + g * g; w = w - lr * g / (sqrt(s) + eps)
       = torch.optim.Adagrad with sparse gradients (dt_adagrad_update; s starts at 0).
   Row-wise Adagrad (lr 0.01, eps 1e-10), FBGEMM's EXACT_ROWWISE_ADAGRAD, one state per row:
       s = s + (sum_c g_c^2) / dim  (the sum in double, rounded once); w = w - (lr / (sqrt(s) + eps)) * g
       Not with column-wise sharding (a shard sees only its columns): DT_ERR_UNSUPPORTED.
   Adam (lr 1e-3, betas 0.9 / 0.999, eps 1e-8), lazy: only the touched rows' m and v move:
       m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g g; w = w - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
       = torch.optim.Adam's formula (step_size = lr / bc1, denom = sqrt(v) / sqrt(bc2) + eps, with
       bc1 = 1 - b1^t, bc2 = 1 - b2^t) applied to the touched rows only, and FBGEMM's (TorchRec's)
       EmbOptimType.ADAM (dt_adam_update; t counts every backward of the table, as a sparse
       optimizer's step counts every step() in which the table has a gradient). Not quite
       torch.optim.SparseAdam, which is as lazy but puts eps elsewhere: step_size = lr sqrt(bc2) / bc1,
       denom = sqrt(v) + eps, i.e. this formula with eps / sqrt(bc2) for eps. The two differ where
       sqrt(v) is not >> eps: small gradients, early steps (about 1e-2 relative at gradients near
       1e-4, several times at 1e-8).
   bf16 / f16 tables: the row is widened to f32, updated, and rounded back (nearest even);
   state is f32. Write DT_OPT_ZERO for a real 0 in a field whose default is not 0.

   ---------------------------------------------------------------- the planner

   For tables with sharding AUTO, from the table's bytes (rows x dim x dtype + optimizer state),
   its expected ids per global batch (table desc ids_per_batch; 0 = one per sample of
   desc.batch_hint) and the world size: tables of at most desc.dp_max_bytes (default 1 MiB) are
   data-parallel; tables bigger than a rank's fair share of all sharded bytes are row-wise, or
   column-wise when their bags are long (ids per sample > 2, where joining pooled columns moves
   fewer bytes than rows) and the optimizer allows it; a would-be row-wise table that fits in a
   group's share (at most all sharded bytes x G / W, with 1 < G < W) is table-row, on the group
   whose ranks hold the least so far (memory balance across groups, lookups inside one); the rest
   are table-wise, largest first, each on the rank with the least (bytes + lookup bytes) so far. A
   pinned table (sharding not AUTO, or pin_owner = 1) is placed first. dt_embed_plan_print shows
   per table: kind, ranks ("table-row", "4-7"), bytes per rank, estimated lookup bytes per step.

   ---------------------------------------------------------------- checkpoints and export

   dt_embed_checkpoint_save/load go through dt_checkpoint_save/load: each local shard is one
   slice of the logical tensors "embed/<table>/weight" [rows, dim] and its optimizer state
   ("embed/<table>/sum" [rows, dim] for Adagrad, "embed/<table>/rowsum" [rows] for row-wise
   Adagrad, "embed/<table>/exp_avg" and "exp_avg_sq" for Adam) plus "embed/steps" (each table's
   t), so a checkpoint saved at one world size or plan loads at any other: dt_opt.h's resharding
   finds each slice.
   dt_embed_export_changed(e, prefix) writes prefix.rank_NNNNN.safetensors on every rank with
   entries "<table>.ids" (i64 [n], the global rows changed since the last export, ascending; for a
   dynamic table the ids of the changed slots) and
   "<table>.values" (f32 [n, cols]) for the tables it owns, and metadata "<table>.cols" = "c0:c1"
   (its column range). Replicas (data-parallel) are written by rank 0 only. Collective.

   ---------------------------------------------------------------- overlap

   dt_embed_forward = dt_embed_forward_begin + dt_embed_forward_end. begin validates the batch
   (one small all-reduce: batch sizes and errors), builds the requests, exchanges their counts
   (a small all-to-all), then POSTS the exchange of ids and weights as point-to-point
   dt_comm_irecv / dt_comm_isend and returns, after the data-parallel lookups (local). end waits
   for the ids, admits dynamic ids, gathers and pools the rows this rank owns, returns the
   pooled vectors (blocking all-to-allv) and scatters them.
   Two orders: (1) begin(s), the caller's work, end(s), backward(s): the ids of batch s travel
   during, say, its bottom MLP. (2) Ahead: end(s), begin(s + 1), the caller's dense forward
   and backward of s, backward(s), end(s + 1): the ids of the next batch travel during all of
   this batch's dense work. begin(s + 1) keeps batch s's state aside for backward(s) (two
   sets of request buffers) and defers its data-parallel lookups to end(s + 1).
   What overlaps: only what does not depend on the rows: reading and bucketing the ids and
   the id (+ weight) all-to-allv. What does not: the gather and pooling (end, after the
   update of batch s, so batch s + 1 sees the rows backward(s) wrote: exactness, bit for bit
   the plain order), the pooled-vector exchange and the backward's gradient exchange (dt_comm
   has no asynchronous all-to-allv), and begin's two small collectives. MPI builds without a
   progress thread (Open MPI's default) move a posted message only inside MPI calls: call
   dt_embed_progress between layers (examples/dlrm --overlap 1 does). stats.seconds_wait
   is the time end spent waiting for the ids: the exchange not hidden.

   ---------------------------------------------------------------- CUDA

   desc.device = DT_CUDA_DEVICE (a DT_CUDA build; link kernels/dt_embed.cu, dt_embed_copies.cu):
   each rank's shards and optimizer state are CUDA tensors; forward takes a cuda `out`, backward
   a cuda `dout` (a cpu one is DT_ERR_DEVICE). The batch (dt_kjt) is read and validated on the
   host, which also counts its requests (per destination and table: these counts, exchanged
   between the hosts, size every buffer and all-to-all); forward_begin then sends the batch up
   once (lengths, ids, weights: the only bytes of a step that cross PCIe) and everything else
   runs on the device from it: the data-parallel bags (dt_k_embed_bags), the requests in the
   host's generation order (dt_k_embed_requests), their all-to-alls (dt_comm on device tensors:
   NCCL, or its staged path), the owners' per-table layout (dt_k_embed_serve_layout) and pooling,
   the return all-to-all, the bag-order sums into `out` (dt_k_embed_gather_sum), the gradients
   taken from dout, their all-to-all to the owners, the per-row sums (dt_k_embed_pool_bwd,
   dt_k_embed_dedup: a stable sort, so each row's contributions are summed in the CPU's (global
   sample, feature, position) order) and the fused sparse update of every optimizer. A step
   reads nothing back and waits for nothing
   (tests/cuda_emu/k_embed_tables.cpp counts it), except with dynamic tables (below). The
   outputs and rows are the cpu path's bit for bit on the emulator (row-wise Adagrad within
   1e-6: its sum of squares is a tree on the device; a real GPU may fuse a multiply-add, ~1 ulp).
   Accumulation (dt_embed_set_sync(e, 0)) stays on the device too: each backward's rows and
   gradient rows wait in a device window, and the next sync-1 backward puts a table's pieces
   before its own contributions and updates once (the CPU's pending sums, bit for bit). One case
   keeps the host round trip of earlier versions: a sequence feature (pooling NONE: its views,
   dt_embed_sequence, are host tensors, so the returned rows come down and dout's gradients are
   summed on the host). Device buffers start at twice the first step's need (an owner's share of
   a batch varies), the accumulation window at twice the first window's. dt_embed_local_shard gives a cuda view; checkpoints go through dt_opt.h's
   host copies (saved on cuda, they load on cpu and back). Dynamic tables (LRU): each local
   id-hash shard's id -> slot map is a GPU table (kernels/dt_hash.cu; link it too): a forward's
   ids go through it per shard in the host's order, so slots, admitted / evicted / rejected
   counts and rows equal the cpu run's. With a dynamic table the requests are the host's (its
   index arrays go up each step): the host builds the owners' request rows from the
   slots, so a forward copies down one block for all dynamic tables (each id's slot, each
   shard's counts, the (slot, id) pairs admitted: (3 ids + 4 shards) x 8 bytes, one wait);
   admitted rows are initialised on the host from (seed, "<table>#<id>") and go up in one copy,
   their optimizer state zeroed on the device. slot_id / slot_stamp stay on the device and come
   down when a checkpoint is saved, so checkpoints load into cpu dynamic tables and back. The
   id table's decisions run on one GPU thread per shard in batch order (each depends on the
   earlier ones; see kernels/dt_hash.cu). A shard's ids seen and not admitted are bounded (8 x
   its slots, at least 4096): beyond, forward is DT_ERR_RANGE. Tier HOST (table desc tier =
   DT_TIER_HOST): the shard and its optimizer state live in pinned host memory (cudaHostAlloc,
   mapped for kernels), cache_rows of its rows in a device cache. The host keeps the cache's
   books (the same code as tier DISK: LRU or LFU, the rows of the batch in flight pinned), so a
   tiered table's requests are the host's (as with dynamic tables: the owner's index arrays go
   up each step, holding cache slots), and the kernels gather, pool and update by slot. A step's
   missing rows come in stream order before the kernels that read them (changed rows leaving the
   cache are written back first), one dt_k_embed_copies per array between the mapped host memory
   and the cache: no host wait. dt_embed_prefetch runs its copies on a copy stream that the next
   forward's stream waits for (an event). Rows an update wrote are written back when they leave
   the cache, and at dt_embed_flush, checkpoints and dt_embed_local_shard (a host view of the
   slow tier), which wait for the device. A dynamic table's slots (the GPU id table's) are its
   rows here: an admitted row is initialised into its cache slot. Training equals the resident
   cuda tables bit for bit (tests/cuda_emu/mpi_embed_tier_cuda.cpp); checkpoints are the same
   files. Tier HOST with sharding DATA (asked for: the planner never replicates a tier HOST
   table) has no cache: its lookups and updates are made on the device from the batch, so the
   kernels read and update the host memory itself over the bus (every rank holds the whole
   table there; TorchRec's UVM kernels without caching work so); cache_rows or cache_fraction
   is then DT_ERR_ARG. Tier DISK on cuda: DT_ERR_UNSUPPORTED. Not yet: dt_embed_export_changed of cuda tables
   (DT_ERR_UNSUPPORTED).

   Memory: tables, optimizer state and every buffer come from the ctx allocator; buffers are
   kept and grown (dt_grow) so steps do not allocate after the first ones. The change tracking
   of the export costs one bit per local row. On Linux, a host table or optimizer state of 4 MiB
   or more is then advised into 2 MiB pages (madvise MADV_HUGEPAGE + MADV_COLLAPSE on its
   2 MiB-aligned part; errors ignored, values unchanged): random rows in 4 KiB pages miss the TLB
   on nearly every id. Opt out with DT_EMBED_NO_HUGEPAGE. Exception: the hash maps of dynamic
   tables are stb_ds's, which allocate with realloc / free (STBDS_REALLOC / STBDS_FREE; define
   them before this file's implementation to change that), not with the ctx allocator. A
   dynamic table's slots cost 2 x 8 bytes (id, stamp) + 2 x 8 (LRU links, or LFU heap) (+ 8,
   LFU count) per slot besides the row; the map of sightings grows with the distinct ids seen
   and not admitted (use admit_after 1 to keep it empty).

   Errors: every function returns dt_status with dt_ctx_error naming the argument, the value
   and what was expected. Collective functions (create, forward, backward, checkpoints, export)
   return an error on every rank when one rank's input is bad.

   Threads: a dt_embed belongs to one thread at a time, like its comm.

   The licence (MIT) is at the end of this file.
*/
#ifndef DT_EMBED_H
#define DT_EMBED_H

#if !defined(DT_TENSOR_H) || !defined(DT_COMM_H) || !defined(DT_OPT_H)
#error "dt_embed.h needs dt_tensor.h, dt_comm.h and dt_opt.h included before it"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ==== >>types: pooling, sharding, optimizers, descs, the batch, stats ========================= */

typedef enum dt_embed_pooling {
    DT_POOL_DEFAULT = 0, /* = DT_POOL_SUM */
    DT_POOL_SUM,
    DT_POOL_MEAN,        /* sum / bag length (an empty bag gives 0) */
    DT_POOL_NONE,        /* sequence: one row per id, see dt_embed_sequence */
    DT_POOL_COUNT
} dt_embed_pooling;

typedef enum dt_embed_sharding {
    DT_SHARD_DEFAULT = 0, /* = DT_SHARD_AUTO */
    DT_SHARD_AUTO,
    DT_SHARD_TABLE,
    DT_SHARD_ROW,
    DT_SHARD_COLUMN,
    DT_SHARD_DATA,
    DT_SHARD_TABLE_ROW,   /* row-wise over one group of group_size consecutive ranks (a host) */
    DT_SHARD_COUNT
} dt_embed_sharding;

typedef enum dt_embed_optim {
    DT_EMBED_OPT_DEFAULT = 0, /* = DT_EMBED_SGD */
    DT_EMBED_SGD,
    DT_EMBED_ADAGRAD,
    DT_EMBED_ROWWISE_ADAGRAD,
    DT_EMBED_ADAM,
    DT_EMBED_OPT_COUNT
} dt_embed_optim;

typedef enum dt_embed_ids {
    DT_IDS_DEFAULT = 0, /* = DT_IDS_CHECK */
    DT_IDS_CHECK,
    DT_IDS_HASH,
    DT_IDS_COUNT
} dt_embed_ids;

typedef enum dt_embed_eviction { /* dynamic tables: which slot a new id takes when its shard is full */
    DT_EVICT_DEFAULT = 0, /* = DT_EVICT_LRU */
    DT_EVICT_LRU,         /* least recently used */
    DT_EVICT_LFU,         /* least frequently used (uses since admission); ties: least recently used */
    DT_EVICT_COUNT
} dt_embed_eviction;

typedef enum dt_embed_tier { /* where a table's rows live (see "tiered tables") */
    DT_TIER_DEFAULT = 0, /* = DT_TIER_NONE */
    DT_TIER_NONE,        /* resident: the whole shard in memory (host, or device for cuda tables) */
    DT_TIER_DISK,        /* cpu tables: the shard in a file, a host cache of cache_rows hot rows */
    DT_TIER_HOST,        /* cuda tables: the shard in pinned host memory, a device cache of cache_rows hot rows */
    DT_TIER_COUNT
} dt_embed_tier;

typedef struct dt_embed_optim_desc {
    dt_embed_optim kind;
    double lr;           /* 0 = 0.01 (SGD, Adagrad, row-wise Adagrad), 1e-3 (Adam) */
    double eps;          /* 0 = 1e-10 (Adagrads), 1e-8 (Adam) */
    double beta1, beta2; /* Adam; 0 = 0.9, 0.999 */
} dt_embed_optim_desc;

typedef struct dt_embed_table_desc {
    const char *name;             /* unique, names the init stream and the checkpoint tensors */
    int64_t rows;                 /* >= 1; up to 2^62 */
    int dim;                      /* >= 1 */
    dt_dtype dtype;               /* storage: DEFAULT = f32, bf16, f16 */
    dt_embed_pooling pooling;
    int weighted;                 /* 1: the batch's per-id weights scale the rows */
    dt_init_desc init;            /* kind DEFAULT = U(-1/sqrt(rows), 1/sqrt(rows)) (TorchRec's);
                                     name, seed (0 = desc.seed) and shard fields are filled in */
    dt_embed_optim_desc optim;
    dt_embed_ids ids;
    dt_embed_sharding sharding;   /* AUTO: the planner decides */
    int pin_owner;                /* 1: table-wise on rank `owner` (sharding AUTO or TABLE) */
    int owner;
    double ids_per_batch;         /* planner: expected ids per global batch; 0 = desc.batch_hint */
    int dynamic;                  /* 1: any 64-bit id gets a row on admission; rows = capacity (see
                                     "dynamic tables"); row-wise over id-hash shards */
    int admit_after;              /* dynamic: sightings before an id gets a row; 0 = 1 (at once) */
    int hash_shards;              /* dynamic: id-hash shards, fixed whatever the world size; 0 = 16 */
    dt_embed_eviction eviction;   /* dynamic: LRU (DEFAULT) or LFU */
    int group_size;               /* table-row sharding (chosen or planned): ranks per group, dividing
                                     the world; 0 = the ranks of a host (dt_comm_ranks_per_host) */
    dt_embed_tier tier;           /* NONE (default): resident; DISK (cpu tables): the shard and its optimizer
                                     state in a file, a cache of hot rows in memory; HOST (cuda tables):
                                     in pinned host memory, a cache on the device (see "tiered tables") */
    int64_t cache_rows;           /* tiered: rows in the fast tier per rank, at least the distinct rows one
                                     step touches there; 0 = cache_fraction of the local shard; more than
                                     the shard = the shard */
    double cache_fraction;        /* tiered, with cache_rows 0: that fraction (0, 1] of the local shard's
                                     rows, rounded up; 0 = 1/8; never fewer than two batches' ids
                                     (2 x ids_per_batch: the batch in flight and the prefetched one) */
    dt_embed_eviction cache_eviction; /* tiered: which cached row makes room: LRU (DEFAULT) or LFU */
    int64_t log_rows;             /* tier DISK: records in the log of written-back rows (two halves: a full
                                     one folds into the table in the background while the other fills;
                                     see >>tier); 0 = the local shard's rows (the file then takes up to
                                     twice the shard's bytes); fewer fold more often */
} dt_embed_table_desc;

typedef struct dt_embed_feature_desc {
    const char *name;
    int table;                    /* index into desc.tables; several features may share a table */
    int input;                    /* with desc.n_inputs > 0: the kjt feature whose ids (and weights) this
                                     feature looks up; several features may read one input, i.e. several
                                     tables share one feature's ids (each its own output columns) */
} dt_embed_feature_desc;

typedef struct dt_embed_desc {
    const dt_embed_table_desc *tables;
    int n_tables;
    const dt_embed_feature_desc *features; /* NULL = feature i is table i (n_features = n_tables) */
    int n_features;
    int n_inputs;                 /* 0: the kjt holds one input per feature (feature f reads kjt feature f);
                                     > 0: the kjt holds n_inputs features, feature f reads features[f].input */
    dt_comm *comm;                /* the ranks the tables are sharded over; NULL = this process */
    uint64_t seed;                /* init seed of tables whose init.seed is 0 */
    int64_t batch_hint;           /* planner: global batch size; 0 = 1024 */
    double dp_max_bytes;          /* planner: largest data-parallel table; 0 = 1 MiB, < 0 = none */
    int print_plan;               /* 1: rank 0 prints the plan after creation */
    dt_device device;             /* DEFAULT / DT_CPU; DT_CUDA_DEVICE (DT_CUDA builds): shards and
                                     optimizer state on the GPU, see "CUDA" */
    const char *tier_dir;         /* tier DISK: the directory of each rank's slow-tier files (scratch,
                                     unlinked at once); NULL = $TMPDIR, else /tmp. May differ per rank */
} dt_embed_desc;

/* The local batch: see "the batch" above. */
typedef struct dt_kjt {
    int n_features;               /* must equal the dt_embed's inputs (desc.n_inputs, else its features) */
    int64_t batch;                /* local samples B >= 0 */
    const int64_t *lengths;       /* [n_features * B] */
    const void *ids;              /* sum(lengths) ids */
    dt_dtype ids_dtype;           /* DEFAULT = DT_I64; DT_I32 accepted */
    const float *weights;         /* sum(lengths) or NULL (needed by weighted tables); finite */
} dt_kjt;

typedef struct dt_embed_stats {
    int64_t forwards, backwards;
    int64_t ids;                  /* ids of the local batches looked up */
    int64_t ids_sent;             /* ids sent to other ranks' shards */
    int64_t rows_updated;         /* unique rows updated on this rank */
    double bytes_sent_fwd, bytes_sent_bwd; /* by this rank, to other ranks, all-to-alls */
    double seconds_fwd, seconds_bwd;
    double seconds_wait;          /* in forward_end, waiting for the id exchange (what was not hidden) */
    int64_t admitted, evicted, rejected;            /* dynamic tables, on this rank's shards, total */
    int64_t step_admitted, step_evicted, step_rejected; /* the same, in the last forward */
} dt_embed_stats;

/* A tiered table's counters on this rank (dt_embed_tier_stats_get), totals since creation. */
typedef struct dt_embed_tier_stats {
    int64_t cache_rows, cached;   /* slots in the fast tier; slots filled */
    int64_t hits, misses;         /* ids whose row was / was not in the fast tier when the id was first looked
                                     up (by dt_embed_prefetch, or by the forward of a batch not prefetched) */
    int64_t fetched, prefetched;  /* rows read from the slow tier by a forward or backward that needed them
                                     (the caller waited) / by dt_embed_prefetch's helper thread */
    int64_t evicted, written_back; /* rows that left the cache; those written back (changed since fetched) */
    double bytes_in, bytes_out;   /* slow -> fast tier (rows + optimizer state), fast -> slow */
    double seconds_wait;          /* forwards and backwards waiting for prefetched rows not yet arrived (the
                                     helper's lookups of several tables: each counts the whole wait) */
    int64_t folds, folded;        /* tier DISK: folds of its log of written-back rows into the table (a half
                                     in the background, or all at a flush); rows they copied home */
    double seconds_fold;          /* the caller's time in folds: at flushes, and waiting for a background one */
} dt_embed_tier_stats;

typedef struct dt_embed dt_embed; /* opaque */

/* ==== >>ids: the fixed id hash (DT_IDS_HASH, dynamic tables) ================================== */

DT_API uint64_t dt_embed_hash_id(int64_t id);

/* ==== >>create: create, free, the plan ======================================================== */

/* Collective over desc->comm: every rank passes the same tables and features (checked: a digest
   of every field, all-reduced; on a difference DT_ERR_ARG on every rank naming the first
   differing field, e.g. tables[3] ("C4").dim = 16 on rank 0 but 32 on rank 1). */
DT_API dt_status dt_embed_create(dt_ctx *ctx, dt_embed **out, const dt_embed_desc *desc);
DT_API void dt_embed_free(dt_embed *e);
/* Width of the pooled output (sum of the dims of features whose table pools), and the column
   where feature f starts in it (-1 for a sequence feature). */
DT_API int64_t dt_embed_pooled_dim(const dt_embed *e);
DT_API int64_t dt_embed_feature_offset(const dt_embed *e, int feature);
DT_API size_t dt_embed_plan_format(const dt_embed *e, char *buf, size_t n);
DT_API void dt_embed_plan_print(const dt_embed *e);
/* "table", "row", "column", "data", "table-row"; "auto" for AUTO and anything else */
DT_API const char *dt_embed_sharding_name(dt_embed_sharding k);
/* The plan of table t: its kind and, for table-wise, its rank (table-row: its group's first rank). */
DT_API dt_embed_sharding dt_embed_table_sharding(const dt_embed *e, int table, int *owner);

/* ==== >>forward: ids to owners, rows gathered and pooled, vectors back ======================== */

/* Collective. out: f32 [kjt->batch, pooled_dim] (overwritten). out and the batch are checked
   before anything changes: bad on any rank, the call fails on every rank, no id admitted. */
DT_API dt_status dt_embed_forward(dt_embed *e, dt_tensor *out, const dt_kjt *kjt);
/* begin may also come right after the previous batch's end, before its backward: that batch's
   state is kept aside, its backward runs as usual, and the next end gathers the new batch's rows
   then, after the previous update (see "overlap"). Collective, like end. An end whose out is bad
   still serves the ids the other ranks sent at begin (admitting dynamic ones), then fails. */
DT_API dt_status dt_embed_forward_begin(dt_embed *e, const dt_kjt *kjt);
DT_API dt_status dt_embed_forward_end(dt_embed *e, dt_tensor *out);
/* Not collective: tests the id exchange in flight (begun, not ended), so that it moves while the
   caller computes (MPI libraries without a progress thread move messages only inside calls).
   Cheap: call it between layers. */
DT_API dt_status dt_embed_progress(dt_embed *e);
/* After a forward: a view of the rows of sequence feature f, f32 [ids of f in the local batch,
   dim], and of their gradient (zeroed by each forward; add into it before the backward). */
DT_API dt_status dt_embed_sequence(dt_embed *e, dt_tensor *view, int feature);
DT_API dt_status dt_embed_sequence_grad(dt_embed *e, dt_tensor *view, int feature);

/* ==== >>backward: gradients to owners, sparse update, accumulation ============================ */

/* Collective. dout: f32 [batch, pooled_dim] of the last forward (may be NULL when every
   feature is a sequence). Applies each table's sparse optimizer to its touched rows.
   dout (and the sequence gradients) must be finite: a NaN or inf is not checked here and lands
   in every row its sample touched, and in Adagrad / Adam state, for good (unlike a per-sample
   weight, which forward checks). Checking would take a pass over dout of its own (it is read in
   several places, the first after the ranks agree to go on; on cuda on the device), so the
   caller checks, as dt_opt's loss scaler does on the dense side (dt_loss_scaler_unscale's
   found_inf skips the step): a dout that is not finite must not be passed here. */
DT_API dt_status dt_embed_backward(dt_embed *e, const dt_tensor *dout);
/* Gradient accumulation, as dt_bucketer_set_sync: with sync 0 a backward sends its gradients to
   the owners, which add them to each row's gradient so far and update nothing; the next backward
   with sync 1 (the default) adds its own and applies the optimizer once to every row touched
   since the last update. Each row's gradient is summed in the order of one backward over all
   the micro-batches (they hold consecutive global samples), so N micro-batches update the rows
   exactly as one batch of all their samples would. Dynamic tables too: the micro-batches' ids
   reach each id-hash shard in the order of the one batch (sample-major), and a slot used by any
   micro-batch since the last update is protected from eviction as a slot used by the one
   batch is ("dynamic tables"): admissions, evictions, rejections (stats totals) and rows equal
   the one batch's, and no pending gradient lands on another id. Not collective, but every rank
   must set the same value. A checkpoint saved while gradients are pending does not hold them;
   a load drops them (a failed one keeps them). sync 0 with dynamic tables on cuda: DT_ERR_UNSUPPORTED. */
DT_API dt_status dt_embed_set_sync(dt_embed *e, int sync);

/* ==== >>tier: tiered tables: prefetch, flush, counters ======================================= */

/* Collective. Begins the forward of `next` (as dt_embed_forward_begin: its ids go to their owners,
   which wait for them), and each owner starts fetching the rows of tiered tables that `next` needs
   and its fast tier lacks, on a helper thread (cuda tables: a copy stream), while the caller runs
   the current step. Call it after a forward and before its backward (or between steps); the next
   dt_embed_forward must pass the same batch (checked: DT_ERR_ARG on every rank otherwise) and
   waits only for rows not yet arrived. Rows the current batch uses are never evicted for it.
   Tables not tiered: the same as forward_begin. */
DT_API dt_status dt_embed_prefetch(dt_embed *e, const dt_kjt *next);
/* Not collective. Waits for the prefetch in flight and writes every changed cached row back, so
   that the slow tier holds the table (dt_embed_local_shard views it). */
DT_API dt_status dt_embed_flush(dt_embed *e);
/* Table `table`'s tier counters on this rank (zeros for a table that is not tiered). */
DT_API dt_status dt_embed_tier_stats_get(const dt_embed *e, int table, dt_embed_tier_stats *out);

/* ==== >>ckpt: checkpoints, export, stats, local shard ========================================= */

/* Collective. Through dt_checkpoint_save / _load (desc->comm must be the dt_embed's comm or
   NULL for it); state as there (may be NULL). A load that fails on any rank (a missing or
   truncated file, a corrupt slot record) changes nothing on every rank: tables, optimizer
   state, *state, a forward awaiting its backward, pending gradients. */
DT_API dt_status dt_embed_checkpoint_save(dt_embed *e, const dt_train_state *state, const dt_checkpoint_desc *desc);
DT_API dt_status dt_embed_checkpoint_load(dt_embed *e, dt_train_state *state, const dt_checkpoint_desc *desc);
/* The local shard of table t as a view (storage dtype, [local rows, local cols]), its first
   global row and column; a rank without a shard gets an empty view. For tests and exports. */
DT_API dt_status dt_embed_local_shard(dt_embed *e, dt_tensor *view, int64_t *row0, int64_t *col0, int table);
DT_API dt_status dt_embed_export_changed(dt_embed *e, const char *prefix);
DT_API dt_status dt_embed_stats_get(const dt_embed *e, dt_embed_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* DT_EMBED_H */

/* ============================================================================================
   Implementation                                                              >>implementation
   ============================================================================================ */

#if defined(DT_IMPLEMENTATION) && !defined(DT_EMBED_IMPLEMENTATION)
#define DT_EMBED_IMPLEMENTATION
#endif

#ifdef DT_EMBED_IMPLEMENTATION
#ifndef DT_EMBED_IMPLEMENTATION_DONE
#define DT_EMBED_IMPLEMENTATION_DONE

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/time.h>
#ifdef DT_CUDA
#include <cuda_runtime.h>
#include "kernels/dt_kernels.h" /* the CUDA tables' kernels (kernels/dt_embed.cu) */
#endif
#if defined(__SSE2__) && !defined(DT_EMBED_NO_SIMD)
#include <emmintrin.h>
#define DT__EM_SSE2
#endif
/* Huge pages for large shards (dt__em_hugepage): madvise from <sys/mman.h>. Strict -std=c99
   hides it and MADV_* unless _DEFAULT_SOURCE came before the first system include; on Linux they
   are declared here instead (14 and 25 are the Linux ABI's MADV_HUGEPAGE and MADV_COLLAPSE). */
#if defined(__linux__) && !defined(DT_EMBED_NO_HUGEPAGE)
#include <sys/mman.h>
#if defined(MADV_HUGEPAGE)
#define DT__EM_MADV_HUGE MADV_HUGEPAGE
#elif !defined(__cplusplus)
extern int madvise(void *addr, size_t len, int advice);
#define DT__EM_MADV_HUGE 14
#endif
#if defined(MADV_COLLAPSE)
#define DT__EM_MADV_COLLAPSE MADV_COLLAPSE
#else
#define DT__EM_MADV_COLLAPSE 25
#endif
#if defined(MADV_RANDOM) /* tiered tables' files: rows are read at random, readahead would only waste I/O */
#define DT__EM_MADV_RANDOM MADV_RANDOM
#else
#define DT__EM_MADV_RANDOM 1
#endif
#endif

/* Tiered tables (>>tier): the slow tier is a file mapped into memory (open, ftruncate, mmap), and
   dt_embed_prefetch looks up and copies rows on one helper thread (POSIX threads;
   DT_EMBED_NO_THREADS: in the calling thread). These headers declare them even under strict -std=c99. Elsewhere tier DISK
   is DT_ERR_UNSUPPORTED. */
#if defined(__unix__) || defined(__APPLE__)
#define DT__EM_POSIX 1
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#ifndef DT_EMBED_NO_THREADS
#define DT__EM_THREADS 1
#include <pthread.h>
#ifdef __linux__
#include <sys/resource.h> /* the fold's thread lowers its own priority (Linux: a thread's nice) */
#endif
#endif
#endif

/* stb_ds: the host hash maps of dynamic tables. Its implementation is compiled here unless
   DT_EMBED_NO_STB_DS_IMPLEMENTATION (define it when another file of the program already has
   STB_DS_IMPLEMENTATION). Under DT_STATIC stb_ds is not used at all (it has no static mode: its
   functions are always extern, and two libraries that each vendor dt must not both define
   them): a small private open-addressing map of the same semantics takes its place, unless
   DT_EMBED_STB_DS_IMPLEMENTATION asks for stb_ds anyway. gcc's strict C modes lack the
   `typeof` stb_ds uses: it is mapped to __typeof__ for this header's implementation only. */
#if defined(DT_STATIC) && !defined(DT_EMBED_STB_DS_IMPLEMENTATION)
#define DT__EM_PRIVATE_MAP
#else
#if defined(__GNUC__) && !defined(__cplusplus) && !defined(typeof)
#define typeof __typeof__
#define DT__EM_TYPEOF
#endif
#ifndef DT_STB_DS_H
#define DT_STB_DS_H <stb/stb_ds.h>
#endif
#if !defined(DT_EMBED_NO_STB_DS_IMPLEMENTATION) && !defined(STB_DS_IMPLEMENTATION)
#define STB_DS_IMPLEMENTATION
#endif
#include DT_STB_DS_H
#endif

DT__STATIC_QUIET_BEGIN

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__cplusplus) && (defined(__GNUC__) || defined(__clang__))
#define DT__EM_RESTRICT __restrict__
#elif defined(__cplusplus)
#define DT__EM_RESTRICT
#else
#define DT__EM_RESTRICT restrict
#endif

#define DT__EM_HDR 4 /* a request segment: feature, global sample, first position, length; then ids */
/* how a tiered table's row gets into its cache slot (dt__em_tier_slot) */
#define DT__EM_NOW 0   /* fetched from the slow tier now */
#define DT__EM_LATER 1 /* its copies queued for the helper thread (dt_embed_prefetch) */
#define DT__EM_NONE 2  /* not read: the caller writes the whole row (a dynamic admission) */

/* ==== >>types: internal types ================================================================= */

typedef struct dt__em_tab {
    char name[DT_NAME_MAX];
    int64_t rows, dim;
    dt_dtype dtype;
    dt_embed_pooling pooling;
    int weighted;
    dt_init_desc init;
    dt_embed_optim kind;
    double lr, eps, b1, b2;
    dt_embed_ids ids;
    dt_embed_sharding shard;
    int owner;                   /* table-wise */
    int gfirst, gsize;           /* table-row: its group, ranks [gfirst, gfirst + gsize) */
    dt_embed_eviction evict;     /* dynamic */
    double ids_per_batch;
    double plan_bytes, plan_lookup; /* planner estimates (per rank holding it) */
    int64_t r0, r1, c0, c1;      /* this rank's shard; empty when r0 == r1 or c0 == c1 */
    dt_tensor w, s1, s2;         /* rows, optimizer state (f32) */
    int64_t t;                   /* backward count */
    unsigned char *dirty;        /* one bit per local row: changed since the last export (no list of
                                    them: it grew by the rows a run touched, a step's memory that
                                    rose over the run; the export walks the bits in row order) */
    int64_t n_dirty;             /* the bits set */
    /* dynamic tables */
    int dynamic, admit_after, n_hs;
    int cu_stale;                /* cuda: the GPU id tables moved on since slot_id / slot_stamp were copied down */
    int *hs_owner;               /* id-hash shard -> rank */
    struct dt__em_dyn *hs;       /* this rank's shards (first hs_first) */
    int hs_first, hs_count;
    dt_tensor slot_id, slot_stamp; /* [local rows] i64: the id in each slot; its last use (0 = empty) */
    dt_tensor slot_count;        /* LFU: [local rows] i64, the uses of each slot's id since admission */
    int64_t *prev, *next;        /* LRU: list of the local slots, per shard. LFU: prev[x0 + i] is
                                    the shard's min-heap by (count, stamp), next[x] slot x's place */
    /* tiered tables: w, s1, s2 view the slow tier; the cache of hot rows (see >>tier) */
    struct dt__em_tier *tier;
    dt_embed_tier tier_kind;
    int local;                   /* looked up and updated in place here, no requests: data-parallel, or
                                    (one rank) a resident cpu table whose shard is the whole table */
    int64_t cache_rows;
    double cache_fraction;
    dt_embed_eviction cache_evict;
    int64_t log_rows;
} dt__em_tab;

typedef struct dt__em_kv { int64_t key, value; } dt__em_kv;
typedef struct dt__em_map {      /* int64 -> int64: stb_ds's hm, or the open-addressing one (see >>ids) */
    dt__em_kv *hm;
    dt__em_kv *slots;            /* open: linear probing; value -1 marks an empty slot (values are >= 0) */
    int64_t cap, n;
    int open;                    /* 1: the open-addressing map (always under DT_STATIC) */
} dt__em_map;
typedef struct dt__em_dyn {      /* one id-hash shard of a dynamic table */
    dt__em_map map;              /* id -> local slot */
    dt__em_map seen;             /* id -> sightings, for ids not admitted yet */
    int64_t x0, n, used;         /* its local slots [x0, x0 + n), the first `used` filled */
    int64_t head, tail;          /* LRU list: head = least recently used; -1 = empty */
    int64_t stamp, step_stamp;   /* last stamp given; the stamp when this forward began */
} dt__em_dyn;

typedef struct dt__em_seg {      /* one request of the last forward, in generation order */
    int dest;                    /* owner rank */
    int f;
    int64_t b, pos;              /* sample, position in the bag (-1: the whole bag) */
    int64_t c0, nc;              /* the columns the owner returns */
    int64_t res;                 /* offset of its result in the response buffer (floats) */
} dt__em_seg;

typedef struct dt__em_contrib {  /* one gradient contribution to a row, for the sorted update: 32 bytes */
    int t;                       /* the table */
    float w;                     /* the id's weight (1: unweighted) */
    int64_t row;                 /* local to the shard */
    int64_t slot;                /* tiered tables: the row's cache slot at the forward, or -1 */
    const float *g;              /* its gradient (the shard's columns) */
} dt__em_contrib; /* (its (sample, feature, position) is its place in the list: they arrive in that order) */

typedef struct dt__em_pend { int t; int64_t row, off; } dt__em_pend;

/* The state of one batch from its forward_begin to its backward: two of them when a batch is
   begun while the previous one awaits its backward (dt__em_swap exchanges the live one). */
typedef struct dt__em_bst {
    int phase, dp_late;
    int64_t B, g0, n_ids, offs_cap, rows_cap, wts_cap, n_segs, segs_cap, seq_cap, rbuf_n;
    int64_t *offs, *rows, *cnt, *seq_off;
    float *wts, *seq, *seq_grad;
    dt__em_seg *segs;
    dt_tensor sbuf_i, sbuf_f, rbuf_i, rbuf_f, pooled;
    dt_comm_req **reqs;
    dt_tensor *rviews;
    int n_reqs;
    dt_tensor cu_kl, cu_kid, cu_kw, cu_rq, cu_rqf, cu_smeta, cu_smetaf;
    int cu_k64, cu_devreq;
    int64_t cu_fR, cu_fS, cu_fmax, cu_bmax, *cu_cx, cu_cx_cap;
    int tier_pf;
    int64_t *tslot, tslot_cap;
} dt__em_bst;

/* a piece of the device's accumulation window: table t's rows [r, r + n) and floats from f */
typedef struct dt__em_accp { int64_t t, r, f, n; } dt__em_accp;

struct dt_embed {
    dt_ctx *ctx;
    dt_comm *comm;
    int rank, size;
    dt__em_tab *tabs;
    int n_tabs;
    int n_feat;
    int *feat_tab;
    int *feat_in;                /* the kjt feature each feature reads */
    int n_in;                    /* the kjt's features */
    int64_t *in_offs, in_offs_cap; /* [n_in * B + 1]: the kjt's bags, prefix sums */
    int64_t *feat_off;           /* column in the pooled output, -1 for sequence features */
    int64_t pooled_dim;
    int any_weighted, any_dp, any_dyn, any_tier;
    /* tiered tables (>>tier): the epoch (the batches whose lookups have started: a cached row a
       batch reads is pinned until the next batch's lookups start, after its backward), the
       prefetch helper, the forward's deferred error
       (the owner still joins the return all-to-all), the batch given to dt_embed_prefetch */
    int64_t epoch, pfq_seen, batch_hint;
    int pfq_wb;                  /* the helper's queue holds write-backs (see dt__em_tier_queue_row) */
    struct dt__em_pfq *pfq;
    dt_status tier_st;
    char tier_msg[DT_ERROR_MAX];
    char tier_dir[1024];
    int tier_pf;                 /* the live batch was looked up by dt_embed_prefetch (its hits are counted) */
    int64_t *tslot, tslot_cap;   /* per int of rbuf_i: the cache slot its id's row had when last looked up
                                    (-1: none), so the forward and the update need not look again */
    int pf_pending;              /* a batch begun by dt_embed_prefetch awaits its forward */
    int pf_ahead;                /* it was begun ahead of the previous batch's backward */
    int pf_sync;                 /* DT_EMBED_PREFETCH_SYNC=1 at creation: every lookup in the caller */
    int pfj;                     /* its lookups run on the helper thread until dt__em_pf_join (dt__em_pf_post): */
    const int64_t *pfj_rin;      /* the requests served (its rbuf_i), pfj_n ints, their slots into pfj_slot */
    int64_t pfj_n, *pfj_slot;
    int64_t pf_B, pf_nids;
    int pf_nf;
    uint64_t pf_hl, pf_hi;       /* hashes of its lengths, and of its ids and weights */
    /* the last forward */
    int phase;                   /* 0 none, 1 begun, 2 forward done, 3 backward done */
    int64_t B, g0, n_ids;
    int64_t *offs, offs_cap;     /* [F*B + 1], feature-major */
    int64_t *rows, rows_cap;     /* global row of every id */
    float *wts;
    int64_t wts_cap;
    dt__em_seg *segs;
    int64_t n_segs, segs_cap;
    int64_t *cnt;                /* 6 x size: send ints, send floats, results expected, owner: recv ints, recv floats, resp floats */
    dt_tensor sbuf_i, sbuf_f, rbuf_i, rbuf_f, resp, res, grad_in, pooled, dp_i, dp_f, dp_ri, dp_rf;
    float *seq, *seq_grad;
    int64_t seq_cap, *seq_off;   /* per feature: float offset of its rows in seq */
    dt__em_contrib *con, *con2;
    int64_t con_cap, con2_cap;
    float *gtmp, *wtmp;
    int64_t gtmp_cap;
    struct dt__em_src *src;      /* the owner's pass: every requested id's row (dt__em_serve) */
    int64_t src_cap;
    /* accumulation (dt_embed_set_sync(e, 0)): each touched row's gradient so far, sorted by
       (table, row); the floats of entry k at pvals + pend[k].off */
    int sync;
    int acc_open;                /* a sync-0 backward since the last update: dynamic tables keep the
                                    slots used since then (the window's) from eviction */
    dt__em_pend *pend, *pend2;
    int64_t n_pend, pend_cap, pend2_cap;
    float *pvals, *pvals2;
    int64_t pv_cap, pv2_cap;
    int64_t steps_store[1];
    dt_comm_req **reqs;          /* the id exchange in flight between begin and end */
    dt_tensor *rviews;           /* the slices those requests read and write */
    int n_reqs;
    int64_t rbuf_n;              /* ints received by the id exchange */
    int dp_late;                 /* begun ahead: the data-parallel lookups wait for the end */
    dt__em_bst aside;            /* the other batch (see dt__em_bst) */
    dt_embed_stats stats;
    /* CUDA tables (desc.device cuda): device scratch, host staging (see "CUDA tables") */
    int cuda;
    dt_tensor cu_i, cu_f, cu_tmp, cu_resp, cu_res;
    int64_t *cu_hi, cu_hi_cap, cu_st_n, cu_st_cap, cu_hf_cap, cu_stg_cap, cu_stg_n;
    float *cu_hf, *cu_stg;
    int *cu_st_t;
    int64_t *cu_st_row;
    struct dt_k_hash *cu_hs;     /* the dynamic tables' GPU id tables, one per local shard, in table order */
    int64_t cu_hs_n;
    /* the device path (no sequence feature; see "CUDA tables"): the pooled output, each step's
       index arrays (the owner's requests kept from forward to backward, the scatter of the
       returned rows, the requests' gradient layout, the data-parallel bags) and the gradients
       received */
    dt_tensor cu_pooled, cu_meta, cu_metaf, cu_smeta, cu_smetaf, cu_dmeta, cu_dmetaf, cu_dtmp, cu_gin;
    struct dt__em_cutab *cu_tm;  /* per table: its requests' arrays in cu_meta (the last forward) */
    int64_t cu_tm_cap, cu_fR, cu_fS, cu_fmax, cu_bmax, cu_seen_cap;
    unsigned char *cu_seen;      /* a bit per local row: the unique rows of a table's requests */
    int64_t *cu_dyn_hi, cu_dyn_cap; /* the admitted rows' copies (dt__em_cuda_dyn_fill) */
    /* the batch on the device (dt__em_cuda_batch): lengths [n_in B] then their prefix sums
       [n_in B + 1]; the ids as given (i64 when cu_k64, else i32); the weights. Per table its
       data-parallel features (kjt input, pooled column) then every table's dim, uploaded once
       (cu_tdesc; cu_tdo[t] its first pair, cu_tdm[t] how many). The unique rows updated by the
       data-parallel backward, counted on the device (cu_uniq; read by dt_embed_stats_get). */
    dt_tensor cu_kl, cu_kid, cu_kw, cu_tdesc, cu_uniq;
    int cu_k64;
    int64_t *cu_tdo, *cu_tdm;
    /* the requests made on the device (dt__em_cuda_requests: static tables, every feature
       pooled): sent then received headers and rows (cu_rq), weights (cu_rqf); the features'
       descriptors (cu_fdesc, once); per source the counts received at begin (cu_cx: ints,
       floats, requests, results, then per table ids and requests) */
    dt_tensor cu_rq, cu_rqf, cu_fdesc;
    int64_t *cu_cx, cu_cx_cap;
    int cu_devreq;               /* this batch's requests were made on the device */
    /* accumulation on the device (dt_embed_set_sync(e, 0), dt__em_cuda_apply): the contributions
       kept since the last update, in one window for every table: rows (cu_accr) and gradient rows
       (cu_accg), piece after piece (a piece: one table's of one backward; cu_accp on the host:
       table, first row, first float, rows), cu_accn rows and cu_accf floats used; cu_accw the
       windows closed so far (the first sizes the buffers for the rest, dt__em_cuda_acc_close) */
    dt_tensor cu_accr, cu_accg;
    dt__em_accp *cu_accp;
    int64_t cu_naccp, cu_accp_cap, cu_accn, cu_accf, cu_accw;
    /* tier HOST (dt__em_cuda_tier_run): the cache copies' index arrays, staged on the host
       (cu_tih) and on the device (cu_tix: the compute stream's; cu_tixp: the prefetch's, read by
       the copy stream cu_cs); cu_evc orders the copy stream after the compute stream, cu_evp the
       compute stream after the prefetch's copies (cu_pf_wait: not waited for yet) */
    int64_t *cu_tih, cu_tih_cap;
    dt_tensor cu_tix, cu_tixp;
    void *cu_cs, *cu_evc, *cu_evp;
    int cu_pf_wait;
};

/* One table's requests of the last forward on the device path: n ids (rows, weights), nb
   requests (offsets, response offsets); element offsets into cu_meta / cu_metaf / cu_tmp, and
   the unique rows among them (stats.rows_updated). */
typedef struct dt__em_cutab { int64_t n, nb, rows, offs, dst, src, len, w, tmp, uniq; } dt__em_cutab;

/* The CUDA tables (their section is at the end): stubs returning DT_ERR_DEVICE without DT_CUDA. */
static dt_status dt__em_cuda_check_desc(dt_ctx *ctx, const dt_embed_desc *desc);
static dt_status dt__em_tier_create(dt_embed *e, dt__em_tab *t);
static void dt__em_tier_free(dt_embed *e, dt__em_tab *t);
static void dt__em_tier_dirty(dt__em_tab *t, int64_t k);
static void dt__em_pfq_free(dt_embed *e);
static void dt__em_pf_join(dt_embed *e, int count);
static dt_status dt__em_cuda_to_device(dt_embed *e, dt__em_tab *t);
static dt_status dt__em_cuda_dp_pool(dt_embed *e);
static dt_status dt__em_cuda_batch(dt_embed *e, const dt_kjt *k);
static int dt__em_cuda_devreq(const dt_embed *e);
static dt_status dt__em_cuda_requests(dt_embed *e);
static dt_status dt__em_cuda_serve_dev(dt_embed *e, int64_t tot_res);
#ifdef DT_CUDA
static dt_status dt__em_cuda_get(dt_embed *e, void *dst, const void *src, size_t bytes);
#endif
static dt_status dt__em_cuda_serve(dt_embed *e, int64_t tot_res);
static dt_status dt__em_cuda_return(dt_embed *e, int64_t tot);
static dt_status dt__em_cuda_check(dt_embed *e, const dt_tensor *t, const char *fn, const char *arg);
static dt_status dt__em_cuda_put(dt_embed *e, void *dst, const void *src, size_t bytes);
static dt_status dt__em_cuda_host_dout(dt_embed *e, const float **dd, const dt_tensor *dout);
static dt_status dt__em_cuda_stage(dt_embed *e, int t, int64_t row, const float *g, int64_t nc);
static dt_status dt__em_cuda_flush(dt_embed *e);
static void dt__em_cuda_free(dt_embed *e);
static dt_status dt__em_cuda_tier_create(dt_embed *e, dt__em_tab *t, size_t b0, size_t b1);
static void dt__em_cuda_tier_free(dt_embed *e, struct dt__em_tier *c);
static dt_status dt__em_cuda_tier_run(dt_embed *e, int wait);
static dt_status dt__em_cuda_tier_prefetch(dt_embed *e);
static dt_status dt__em_cuda_dyn_translate(dt_embed *e, int64_t *rin, int64_t total);
static dt_status dt__em_cuda_dyn_restore(dt_embed *e, int ti);
static int dt__em_cuda_dev(const dt_embed *e);
static dt_status dt__em_cuda_dyn_pull(dt_embed *e);
static dt_status dt__em_cuda_end(dt_embed *e, dt_tensor *out, int64_t tot);
static dt_status dt__em_cuda_backward(dt_embed *e, const dt_tensor *dout, int64_t *ncon);

/* ==== >>ids: id maps, the id hash, owners, exchange helpers =================================== */

/* The id maps. Two implementations behind one interface: stb_ds's hm (the default), and a small
   open-addressing map (linear probing, load <= 1/2, backward-shift deletion) that DT_STATIC
   builds use for every map (stb_ds has no static mode) and every build uses for the caches of
   tiered tables (m->open = 1: one probe on int64 keys, where stb_ds compares keys with memcmp;
   the cache looks up every id of every step). */
/* A hint: the line where key k's probe starts (the prefetch walks look a few ids ahead). */
static void dt__em_pf_map(const dt__em_map *m, int64_t k) {
    if (m->cap) {
        uint64_t i = dt_embed_hash_id(k) & ((uint64_t)m->cap - 1);
#if defined(__GNUC__) || defined(__clang__)
        __builtin_prefetch(&m->slots[i], 0, 1);
#endif
    }
}

static int64_t dt__em_mfind(const dt__em_map *m, int64_t k) { /* slot of k, or of the hole it would take */
    uint64_t mask = (uint64_t)m->cap - 1, i = dt_embed_hash_id(k) & mask;
    while (m->slots[i].value >= 0 && m->slots[i].key != k) i = (i + 1) & mask; /* value -1: an empty slot */
    return (int64_t)i;
}

#ifdef DT__EM_PRIVATE_MAP
#define DT__EM_OPEN(m) 1
#else
#define DT__EM_OPEN(m) ((m)->open)
#endif

static int dt__em_get(const dt__em_map *m, int64_t k, int64_t *v) {
    if (DT__EM_OPEN(m)) {
        int64_t i;
        if (!m->cap) return 0;
        i = dt__em_mfind(m, k);
        if (m->slots[i].value < 0) return 0;
        *v = m->slots[i].value;
        return 1;
    }
#ifndef DT__EM_PRIVATE_MAP
    {
        ptrdiff_t i = hmgeti(((dt__em_map *)m)->hm, k);
        if (i < 0) return 0;
        *v = m->hm[i].value;
        return 1;
    }
#endif
}

static void dt__em_hugepage(void *p, size_t bytes);
/* An open map with room for n keys at a load of at most 1/2 (rehashed into more slots, doubling,
   if it has less): puts of up to n keys then allocate nothing. */
static dt_status dt__em_map_fit(dt_ctx *ctx, dt__em_map *m, int64_t n) {
    dt__em_map g;
    int64_t j, cap = m->cap ? m->cap : 16;
    if (2 * n <= m->cap) return DT_OK;
    while (2 * n > cap) cap *= 2;
    memset(&g, 0, sizeof g);
    g.cap = cap;
    g.open = m->open;
    g.slots = (dt__em_kv *)dt_alloc(ctx, sizeof(dt__em_kv) * (size_t)cap);
    if (!g.slots) return DT_ERR_OOM;
    dt__em_hugepage(g.slots, sizeof(dt__em_kv) * (size_t)cap); /* probes are random: fewer TLB misses */
    for (j = 0; j < cap; j++) g.slots[j].value = -1;
    for (j = 0; j < m->cap; j++)
        if (m->slots[j].value >= 0) {
            int64_t x = dt__em_mfind(&g, m->slots[j].key);
            g.slots[x] = m->slots[j]; g.n++;
        }
    dt_release(ctx, m->slots);
    *m = g;
    return DT_OK;
}

static dt_status dt__em_put(dt_ctx *ctx, dt__em_map *m, int64_t k, int64_t v) {
    if (DT__EM_OPEN(m)) {
        int64_t i;
        if (2 * (m->n + 1) > m->cap) /* the load kept at most 1/2: rehashed into twice the slots */
            DT__TRY(dt__em_map_fit(ctx, m, m->cap ? m->cap : 8));
        i = dt__em_mfind(m, k);
        if (m->slots[i].value < 0) m->n++;
        m->slots[i].key = k;
        m->slots[i].value = v;
        return DT_OK;
    }
#ifndef DT__EM_PRIVATE_MAP
    (void)ctx;
    hmput(m->hm, k, v);
    return DT_OK;
#endif
}

static void dt__em_del(dt__em_map *m, int64_t k) {
    if (DT__EM_OPEN(m)) {
        uint64_t mask, i, j;
        if (!m->cap) return;
        mask = (uint64_t)m->cap - 1;
        i = (uint64_t)dt__em_mfind(m, k);
        if (m->slots[i].value < 0) return;
        /* backward-shift deletion: move later members of the probe run into the hole */
        for (j = (i + 1) & mask; m->slots[j].value >= 0; j = (j + 1) & mask) {
            uint64_t home = dt_embed_hash_id(m->slots[j].key) & mask;
            if (((j - home) & mask) >= ((j - i) & mask)) { m->slots[i] = m->slots[j]; i = j; }
        }
        m->slots[i].value = -1;
        m->n--;
        return;
    }
#ifndef DT__EM_PRIVATE_MAP
    (void)hmdel(m->hm, k);
#endif
}

static void dt__em_mfree(dt_ctx *ctx, dt__em_map *m) {
    int open = m->open;
    if (DT__EM_OPEN(m)) {
        dt_release(ctx, m->slots);
    }
#ifndef DT__EM_PRIVATE_MAP
    else hmfree(m->hm);
#endif
    (void)ctx;
    memset(m, 0, sizeof *m);
    m->open = open; /* what kind of map it is stays */
}

static double dt__em_now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

DT_API uint64_t dt_embed_hash_id(int64_t id) {
    uint64_t z = (uint64_t)id + 0x9e3779b97f4a7c15ull; /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

DT_API const char *dt_embed_sharding_name(dt_embed_sharding k) {
    switch (k) {
    case DT_SHARD_TABLE: return "table";
    case DT_SHARD_ROW: return "row";
    case DT_SHARD_COLUMN: return "column";
    case DT_SHARD_DATA: return "data";
    case DT_SHARD_TABLE_ROW: return "table-row";
    default: return "auto";
    }
}

/* Row-wise blocks: R = q*W + m, the first m ranks one row more. */
static int64_t dt__em_row_start(int64_t rows, int W, int k) {
    int64_t q = rows / W, m = rows % W;
    return q * k + (k < m ? k : m);
}
static int dt__em_row_owner(int64_t rows, int W, int64_t x) {
    int64_t q = rows / W, m = rows % W, big = m * (q + 1);
    if (x < big) return (int)(x / (q + 1));
    return (int)(m + (x - big) / q);
}
static int64_t dt__em_col_start(int64_t dim, int W, int k) { return dim * k / W; }

/* Grows a buffer tensor on `device` to at least n elements (contents not kept): the first time to
   n, later with 1/8 of n more for the next batches' spread. What a step holds is then within 1/8
   of its need, not up to twice it as a doubling left it (which made a plan's peak depend on the
   order its batches came in). */
static dt_status dt__em_need_on(dt_embed *e, dt_tensor *t, dt_dtype dtype, int64_t n, dt_device device) {
    dt_tensor_desc d;
    int64_t cap;
    if (t->data && t->numel >= n) return DT_OK;
    cap = t->data ? n + n / 8 : n;
    if (cap < 16) cap = 16;
    dt_tensor_free(e->ctx, t);
    memset(&d, 0, sizeof d);
    d.dtype = dtype;
    d.device = device;
    d.shape[0] = cap;
    d.ndim = 1;
    return dt_tensor_create(e->ctx, t, &d);
}
static dt_status dt__em_need(dt_embed *e, dt_tensor *t, dt_dtype dtype, int64_t n) {
    return dt__em_need_on(e, t, dtype, n, DT_CPU);
}

static dt_status dt__em_a2av(dt_embed *e, dt_tensor *out, const dt_tensor *in, const int64_t *send,
                             const int64_t *recv) {
    if (!e->comm) {
        memcpy(out->data, in->data, (size_t)send[0] * dt_dtype_size(in->dtype));
        return DT_OK;
    }
    return dt_comm_alltoallv(e->comm, out, recv, in, send);
}

static dt_status dt__em_sum_f64(dt_embed *e, double *v, int n) {
    return e->comm ? dt_comm_allreduce_f64(e->comm, v, n, DT_REDUCE_SUM) : DT_OK;
}

/* ==== >>create: create, free, the planner ===================================================== */

static dt_status dt__em_check_table(dt_ctx *ctx, const dt_embed_table_desc *d, int i, int W) {
    const char *fn = "dt_embed_create";
    int64_t n;
    if (!d->name || !d->name[0] || strlen(d->name) >= DT_NAME_MAX - 32)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d].name is %s; expected a non-empty name shorter than %d",
                                fn, i, d->name ? "too long or empty" : "NULL", DT_NAME_MAX - 32);
    if (d->rows < 1 || d->rows > ((int64_t)1 << 62))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").rows = %lld; expected 1 <= rows <= 2^62", fn, i,
                                d->name, (long long)d->rows);
    if (d->dim < 1 || d->dim > (1 << 20))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").dim = %d; expected 1 <= dim <= 2^20", fn, i,
                                d->name, d->dim);
    if (!dt_mul_ok(d->rows, d->dim, &n) || !dt_mul_ok(n, 8, &n))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\"): rows %lld x dim %d overflows int64 bytes", fn,
                                i, d->name, (long long)d->rows, d->dim);
    if (d->dtype != DT_DTYPE_DEFAULT && d->dtype != DT_F32 && d->dtype != DT_BF16 && d->dtype != DT_F16)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").dtype = %d; expected DEFAULT, f32, bf16 or f16",
                                fn, i, d->name, (int)d->dtype);
    if ((int)d->pooling < 0 || d->pooling >= DT_POOL_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").pooling = %d; expected a dt_embed_pooling", fn,
                                i, d->name, (int)d->pooling);
    if (d->weighted != 0 && d->weighted != 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").weighted = %d; expected 0 or 1", fn, i, d->name,
                                d->weighted);
    if (d->pin_owner != 0 && d->pin_owner != 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").pin_owner = %d; expected 0 or 1", fn, i,
                                d->name, d->pin_owner);
    if ((int)d->optim.kind < 0 || d->optim.kind >= DT_EMBED_OPT_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").optim.kind = %d; expected a dt_embed_optim", fn,
                                i, d->name, (int)d->optim.kind);
    if (!(d->optim.lr >= 0) || !(d->optim.eps >= 0) || !(d->optim.beta1 >= 0 && d->optim.beta1 < 1) ||
        !(d->optim.beta2 >= 0 && d->optim.beta2 < 1) || d->optim.lr > 1e30 || d->optim.eps > 1e30)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").optim: lr %g, eps %g, beta1 %g, beta2 %g; "
                                "expected lr, eps >= 0 and finite, 0 <= betas < 1", fn, i, d->name, d->optim.lr,
                                d->optim.eps, d->optim.beta1, d->optim.beta2);
    if ((int)d->ids < 0 || d->ids >= DT_IDS_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").ids = %d; expected a dt_embed_ids", fn, i,
                                d->name, (int)d->ids);
    if ((int)d->sharding < 0 || d->sharding >= DT_SHARD_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").sharding = %d; expected a dt_embed_sharding",
                                fn, i, d->name, (int)d->sharding);
    if (d->pin_owner && (d->owner < 0 || d->owner >= W))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").owner = %d; expected a rank in [0, %d)", fn, i,
                                d->name, d->owner, W);
    if (d->pin_owner && d->sharding != DT_SHARD_DEFAULT && d->sharding != DT_SHARD_AUTO && d->sharding != DT_SHARD_TABLE &&
        d->sharding != DT_SHARD_TABLE_ROW)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\"): pin_owner = 1 with sharding %s; an owner "
                                "is for table-wise and table-row tables", fn, i, d->name, dt_embed_sharding_name(d->sharding));
    if (d->group_size < 0 || (d->group_size > 0 && W % d->group_size != 0))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").group_size = %d; expected 0 (the ranks of a "
                                "host) or a divisor of the world size %d", fn, i, d->name, d->group_size, W);
    if ((int)d->eviction < 0 || d->eviction >= DT_EVICT_COUNT || (d->eviction != DT_EVICT_DEFAULT && !d->dynamic))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").eviction = %d; expected a dt_embed_eviction, "
                                "and DEFAULT unless the table is dynamic", fn, i, d->name, (int)d->eviction);
    if (d->sharding == DT_SHARD_COLUMN && d->optim.kind == DT_EMBED_ROWWISE_ADAGRAD)
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: tables[%d] (\"%s\"): column-wise sharding with row-wise "
                                "Adagrad; its per-row state needs whole rows (use row-wise or table-wise)", fn, i,
                                d->name);
    if (d->dynamic != 0 && d->dynamic != 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").dynamic = %d; expected 0 or 1", fn, i, d->name,
                                d->dynamic);
    if (d->admit_after < 0 || d->admit_after > (1 << 30) || (d->admit_after != 0 && !d->dynamic))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").admit_after = %d; expected 0 .. 2^30, and 0 "
                                "unless the table is dynamic", fn, i, d->name, d->admit_after);
    if (d->hash_shards != 0 && !d->dynamic)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").hash_shards = %d; expected 0 unless the table "
                                "is dynamic", fn, i, d->name, d->hash_shards);
    if (d->hash_shards < 0 || d->hash_shards > 65536 || (d->dynamic && d->rows < (d->hash_shards ? d->hash_shards : 16)))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").hash_shards = %d with rows %lld; expected 0 .. "
                                "65536 (0 = 16) and at least one row per shard", fn, i, d->name, d->hash_shards,
                                (long long)d->rows);
    if (d->dynamic && (d->pin_owner || (d->sharding != DT_SHARD_DEFAULT && d->sharding != DT_SHARD_AUTO &&
                                        d->sharding != DT_SHARD_ROW)))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\"): a dynamic table is sharded row-wise over its "
                                "id-hash shards; sharding %s%s is not possible", fn, i, d->name,
                                dt_embed_sharding_name(d->sharding), d->pin_owner ? " with pin_owner" : "");
    if (!(d->ids_per_batch >= 0) || d->ids_per_batch > 1e18)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").ids_per_batch = %g; expected >= 0", fn, i,
                                d->name, d->ids_per_batch);
    if ((int)d->tier < 0 || d->tier >= DT_TIER_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").tier = %d; expected a dt_embed_tier", fn, i,
                                d->name, (int)d->tier);
    {
        int tiered = d->tier == DT_TIER_DISK || d->tier == DT_TIER_HOST;
        if (d->cache_rows < 0 || (d->cache_rows > 0 && !tiered))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").cache_rows = %lld; expected >= 0, and 0 "
                                    "unless the table is tiered", fn, i, d->name, (long long)d->cache_rows);
        if (!(d->cache_fraction >= 0 && d->cache_fraction <= 1) || (d->cache_fraction > 0 && !tiered))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").cache_fraction = %g; expected 0 .. 1, "
                                    "and 0 unless the table is tiered", fn, i, d->name, d->cache_fraction);
        if ((int)d->cache_eviction < 0 || d->cache_eviction >= DT_EVICT_COUNT ||
            (d->cache_eviction != DT_EVICT_DEFAULT && !tiered))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").cache_eviction = %d; expected a "
                                    "dt_embed_eviction, and DEFAULT unless the table is tiered", fn, i, d->name,
                                    (int)d->cache_eviction);
        if (d->log_rows < 0 || d->log_rows > INT32_MAX || (d->log_rows > 0 && d->tier != DT_TIER_DISK))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").log_rows = %lld; expected 0 .. 2^31 - 1, "
                                    "and 0 unless the table's tier is DISK", fn, i, d->name, (long long)d->log_rows);
#ifndef DT__EM_POSIX
        if (d->tier == DT_TIER_DISK)
            return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: tables[%d] (\"%s\").tier = DISK needs POSIX files "
                                    "(mmap); this build has none", fn, i, d->name);
#endif
    }
    return DT_OK;
}

static double dt__em_state_per_row(const dt__em_tab *t) {
    switch (t->kind) {
    case DT_EMBED_ADAGRAD: return 4.0 * (double)t->dim;
    case DT_EMBED_ROWWISE_ADAGRAD: return 4.0;
    case DT_EMBED_ADAM: return 8.0 * (double)t->dim;
    default: return 0;
    }
}

/* Bytes each kind moves per step for a table with `ids` ids in `bags` bags per global batch
   (requests + responses + gradients, summed over ranks), the estimates the plan prints. */
static double dt__em_lookup_bytes(const dt__em_tab *t, double ids, double bags, int W) {
    double d = (double)t->dim, hdr = 8.0 * DT__EM_HDR;
    switch (t->shard) {
    case DT_SHARD_ROW: case DT_SHARD_TABLE_ROW: return ids * (hdr + 8 + 2 * 4 * d);
    case DT_SHARD_COLUMN: return bags * W * hdr + ids * 8 * W + bags * 2 * 4 * d;
    case DT_SHARD_DATA: return W > 1 ? ids * (40 + 4 + 4 * d) * W : 0;
    default: return bags * hdr + ids * 8 + bags * 2 * 4 * d;
    }
}

/* Group sizes of tables that may be table-row: group_size, or 0 = the ranks of a host (all hosts
   must hold the same number, dividing the world; collective when a table asks for it). */
static dt_status dt__em_groups(dt_embed *e, const dt_embed_table_desc *td) {
    int i, W = e->size, need = 0, host = 1;
    for (i = 0; i < e->n_tabs; i++)
        if (!td[i].group_size && (e->tabs[i].shard == DT_SHARD_AUTO || e->tabs[i].shard == DT_SHARD_TABLE_ROW)) need = 1;
    if (need && e->comm) { /* the hosts as the group sees them (desc.host_size's where set, as the
                              planner's and the two-level exchanges'; by host name once read the
                              machine's, and table-row at --host-size 2 on one machine spanned the
                              world); the same on every rank */
        int rph = dt_comm_ranks_per_host(e->comm);
        host = rph > 0 && W % rph == 0 ? rph : -rph; /* 0: hosts of different sizes */
    }
    for (i = 0; i < e->n_tabs; i++) {
        dt__em_tab *t = &e->tabs[i];
        if (t->gsize) continue;
        if (host > 0) { t->gsize = host; continue; }
        t->gsize = W; /* AUTO: no host groups to plan with */
        if (t->shard == DT_SHARD_TABLE_ROW)
            return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "dt_embed_create: tables[%d] (\"%s\").group_size = 0 (the ranks "
                                    "of a host): %s; expected hosts of equal size dividing the world size %d, or set "
                                    "group_size", i, t->name, host == 0 ? "the hosts hold different numbers of ranks"
                                    : "this host's rank count does not divide it", W);
    }
    return DT_OK;
}

/* A cuda table over pinned host memory is never replicated: its data-parallel lookups would read
   the device cache by rows made on the device (dt_k_embed_bags), which has no cache slots. */
static int dt__em_no_dp(const dt_embed *e, const dt__em_tab *t) { return e->cuda && t->tier_kind == DT_TIER_HOST; }

static dt_status dt__em_plan(dt_embed *e, const dt_embed_desc *desc, const dt_embed_table_desc *td) {
    int W = e->size, i, k, n = e->n_tabs;
    double batch = desc->batch_hint > 0 ? (double)desc->batch_hint : 1024.0;
    double dp_max = desc->dp_max_bytes == 0 ? 1048576.0 : desc->dp_max_bytes, total = 0;
    double *load = (double *)dt_alloc(e->ctx, sizeof(double) * (size_t)(W + 3 * n + 1));
    int *order, *nfeat;
    if (!load) return DT_ERR_OOM;
    memset(load, 0, sizeof(double) * (size_t)(W + 3 * n + 1));
    order = (int *)(load + W);
    nfeat = order + n;
    for (i = 0; i < e->n_feat; i++) nfeat[e->feat_tab[i]]++;
    for (i = 0; i < n; i++) {
        dt__em_tab *t = &e->tabs[i];
        t->plan_bytes = (double)t->rows * ((double)t->dim * (double)dt_dtype_size(t->dtype) + dt__em_state_per_row(t));
        if (t->ids_per_batch == 0) t->ids_per_batch = batch * (nfeat[i] ? nfeat[i] : 1);
        if (t->shard == DT_SHARD_AUTO && td[i].pin_owner) t->shard = DT_SHARD_TABLE;
        if (t->dynamic) t->shard = DT_SHARD_ROW; /* over its id-hash shards */
        if (t->shard == DT_SHARD_AUTO && !(dp_max > 0 && t->plan_bytes <= dp_max && !dt__em_no_dp(e, t)))
            total += t->plan_bytes;
    }
    for (i = 0; i < n; i++) order[i] = i;
    for (i = 1; i < n; i++) { /* largest first, stable: every rank computes the same plan */
        int x = order[i];
        for (k = i; k > 0 && e->tabs[order[k - 1]].plan_bytes < e->tabs[x].plan_bytes; k--) order[k] = order[k - 1];
        order[k] = x;
    }
    for (k = 0; k < 2; k++) { /* pinned tables first, so the others balance around them */
        for (i = 0; i < n; i++) {
            int ti = order[i], r, best = 0;
            dt__em_tab *t = &e->tabs[ti];
            double bags = batch * (nfeat[ti] ? nfeat[ti] : 1), per_sample = t->ids_per_batch / bags;
            int pinned = t->shard != DT_SHARD_AUTO;
            if ((k == 0) != pinned) continue;
            if (!pinned) {
                if (dp_max > 0 && t->plan_bytes <= dp_max && !dt__em_no_dp(e, t)) t->shard = DT_SHARD_DATA;
                else if (W > 1 && t->plan_bytes > total / W) {
                    t->shard = per_sample > 2 && t->kind != DT_EMBED_ROWWISE_ADAGRAD && t->dim >= W ? DT_SHARD_COLUMN
                                                                                                    : DT_SHARD_ROW;
                    /* fits in a group's share: row-wise inside one group (a host), so its lookups
                       stay there and the groups balance */
                    if (t->shard == DT_SHARD_ROW && !t->dynamic && t->gsize > 1 && t->gsize < W &&
                        t->plan_bytes <= total * t->gsize / W)
                        t->shard = DT_SHARD_TABLE_ROW;
                } else t->shard = DT_SHARD_TABLE;
            }
            t->plan_lookup = dt__em_lookup_bytes(t, t->ids_per_batch, bags, W);
            if (t->shard == DT_SHARD_TABLE_ROW) { /* the group with the least load, or the pinned one */
                int G = t->gsize, g, bg = 0;
                double bl = -1;
                if (td[ti].pin_owner) bg = td[ti].owner / G;
                else
                    for (g = 0; g < W / G; g++) {
                        double l = 0;
                        for (r = g * G; r < (g + 1) * G; r++) l += load[r];
                        if (bl < 0 || l < bl) { bl = l; bg = g; }
                    }
                t->gfirst = bg * G;
                for (r = t->gfirst; r < t->gfirst + G; r++) load[r] += (t->plan_bytes + t->plan_lookup) / G;
            } else if (t->shard == DT_SHARD_TABLE) {
                if (td[ti].pin_owner) best = td[ti].owner;
                else
                    for (r = 1; r < W; r++)
                        if (load[r] < load[best]) best = r;
                t->owner = best;
                load[best] += t->plan_bytes + t->plan_lookup;
            } else {
                for (r = 0; r < W; r++)
                    load[r] += (t->shard == DT_SHARD_DATA ? t->plan_bytes : t->plan_bytes / W) + t->plan_lookup / W;
            }
        }
    }
    dt_release(e->ctx, load);
    return DT_OK;
}

static void dt__em_shard_bounds(dt_embed *e, dt__em_tab *t) {
    int W = e->size, k = e->rank;
    t->r0 = 0; t->r1 = 0; t->c0 = 0; t->c1 = 0;
    switch (t->shard) {
    case DT_SHARD_TABLE:
        if (t->owner == k) { t->r1 = t->rows; t->c1 = t->dim; }
        break;
    case DT_SHARD_ROW:
        if (t->dynamic) { /* rank k: id-hash shards [k*S/W, (k+1)*S/W), each a block of slots */
            int S = t->n_hs;
            t->hs_first = (int)((int64_t)k * S / W);
            t->hs_count = (int)((int64_t)(k + 1) * S / W) - t->hs_first;
            t->r0 = dt__em_row_start(t->rows, S, t->hs_first);
            t->r1 = dt__em_row_start(t->rows, S, t->hs_first + t->hs_count);
        } else {
            t->r0 = dt__em_row_start(t->rows, W, k); t->r1 = dt__em_row_start(t->rows, W, k + 1);
        }
        t->c1 = t->dim;
        break;
    case DT_SHARD_TABLE_ROW: /* row-wise blocks over the group, the same rounding */
        if (k >= t->gfirst && k < t->gfirst + t->gsize) {
            t->r0 = dt__em_row_start(t->rows, t->gsize, k - t->gfirst);
            t->r1 = dt__em_row_start(t->rows, t->gsize, k - t->gfirst + 1);
            t->c1 = t->dim;
        }
        break;
    case DT_SHARD_COLUMN:
        t->r1 = t->rows;
        t->c0 = dt__em_col_start(t->dim, W, k); t->c1 = dt__em_col_start(t->dim, W, k + 1);
        break;
    default: /* data-parallel */
        t->r1 = t->rows; t->c1 = t->dim;
        break;
    }
    if (t->r0 == t->r1 || t->c0 == t->c1) { t->r0 = t->r1 = 0; t->c0 = t->c1 = 0; }
}

/* Advice to back a large host buffer (>= 4 MiB) with 2 MiB pages: random rows in 4 KiB pages
   miss the TLB on nearly every id. Its 2 MiB-aligned middle gets MADV_HUGEPAGE and, the buffer
   being already touched (dt_tensor_create zeroes it), MADV_COLLAPSE (Linux >= 6.1: copies it into
   huge pages now). Errors are ignored: advice only, no value changes. No-op elsewhere. */
static void dt__em_hugepage(void *p, size_t bytes) {
#ifdef DT__EM_MADV_HUGE
    const uintptr_t H = (uintptr_t)2 << 20;
    uintptr_t a = ((uintptr_t)p + H - 1) & ~(H - 1), b = ((uintptr_t)p + bytes) & ~(H - 1);
    if (bytes < (size_t)4 << 20 || b <= a) return;
    if (madvise((void *)a, (size_t)(b - a), DT__EM_MADV_HUGE) == 0)
        (void)madvise((void *)a, (size_t)(b - a), DT__EM_MADV_COLLAPSE);
#else
    (void)p; (void)bytes;
#endif
}

static dt_status dt__em_alloc_shard(dt_embed *e, dt__em_tab *t, uint64_t seed) {
    dt_tensor_desc d;
    dt_init_desc in;
    int64_t nr = t->r1 - t->r0, nc = t->c1 - t->c0, nbits;
    if (nr == 0) return DT_OK;
    memset(&d, 0, sizeof d);
    d.dtype = t->dtype; d.device = DT_CPU; d.shape[0] = nr; d.shape[1] = nc; d.ndim = 2;
    if (t->tier_kind != DT_TIER_NONE) DT__TRY(dt__em_tier_create(e, t)); /* w, s1, s2: the slow tier's views */
    else {
        DT__TRY(dt_tensor_create(e->ctx, &t->w, &d));
        dt__em_hugepage(t->w.data, dt_tensor_bytes(&t->w));
    }
    in = t->init;
    if (in.kind == DT_INIT_DEFAULT) { /* TorchRec's default: U(-sqrt(1/rows), sqrt(1/rows)) */
        in.kind = DT_INIT_UNIFORM;
        in.low = -sqrt(1.0 / (double)t->rows);
        in.high = sqrt(1.0 / (double)t->rows);
    }
    if (in.seed == 0) in.seed = seed;
    t->init = in; /* resolved: dynamic rows are initialised from it later */
    in.name = t->name;
    memset(in.global_shape, 0, sizeof in.global_shape);
    memset(in.start, 0, sizeof in.start);
    in.global_shape[0] = t->rows; in.global_shape[1] = t->dim;
    in.start[0] = t->r0; in.start[1] = t->c0;
    DT__TRY(dt_tensor_init(e->ctx, &t->w, &in));
    d.dtype = DT_F32;
    if (!t->tier && (t->kind == DT_EMBED_ADAGRAD || t->kind == DT_EMBED_ADAM)) DT__TRY(dt_tensor_create(e->ctx, &t->s1, &d));
    if (!t->tier && t->kind == DT_EMBED_ADAM) DT__TRY(dt_tensor_create(e->ctx, &t->s2, &d));
    if (t->s1.data && !t->tier) dt__em_hugepage(t->s1.data, dt_tensor_bytes(&t->s1));
    if (t->s2.data && !t->tier) dt__em_hugepage(t->s2.data, dt_tensor_bytes(&t->s2));
    if (t->kind == DT_EMBED_ROWWISE_ADAGRAD && !t->tier) {
        d.shape[1] = 0; d.ndim = 1;
        DT__TRY(dt_tensor_create(e->ctx, &t->s1, &d));
    }
    if (t->dynamic) {
        int h;
        d.dtype = DT_I64; d.shape[1] = 0; d.ndim = 1;
        DT__TRY(dt_tensor_create(e->ctx, &t->slot_id, &d));
        DT__TRY(dt_tensor_create(e->ctx, &t->slot_stamp, &d));
        if (t->evict == DT_EVICT_LFU) DT__TRY(dt_tensor_create(e->ctx, &t->slot_count, &d));
        t->prev = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)nr);
        t->next = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)nr);
        t->hs = (dt__em_dyn *)dt_alloc(e->ctx, sizeof(dt__em_dyn) * (size_t)t->hs_count);
        if (!t->prev || !t->next || !t->hs) return DT_ERR_OOM;
        memset(t->hs, 0, sizeof(dt__em_dyn) * (size_t)t->hs_count);
        for (h = 0; h < t->hs_count; h++) {
            dt__em_dyn *y = &t->hs[h];
            y->x0 = dt__em_row_start(t->rows, t->n_hs, t->hs_first + h) - t->r0;
            y->n = dt__em_row_start(t->rows, t->n_hs, t->hs_first + h + 1) - t->r0 - y->x0;
            y->head = y->tail = -1;
        }
    }
    nbits = (nr + 7) / 8;
    t->dirty = (unsigned char *)dt_alloc(e->ctx, (size_t)nbits);
    if (!t->dirty) return DT_ERR_OOM;
    memset(t->dirty, 0, (size_t)nbits);
    return DT_OK;
}

DT_API void dt_embed_free(dt_embed *e) {
    dt_ctx *ctx;
    int i;
    if (!e) return;
    ctx = e->ctx;
    dt__em_pf_join(e, 0);
    dt__em_pfq_free(e); /* the helper thread ends before the caches go */
    if (e->cuda && e->any_tier) (void)dt__em_cuda_tier_run(e, 1); /* and the device's copies, tier HOST */
    for (i = 0; e->tabs && i < e->n_tabs; i++) {
        dt__em_tab *t = &e->tabs[i];
        dt__em_tier_free(e, t);
        dt_tensor_free(ctx, &t->w); dt_tensor_free(ctx, &t->s1); dt_tensor_free(ctx, &t->s2);
        dt_release(ctx, t->dirty);
        dt_tensor_free(ctx, &t->slot_id); dt_tensor_free(ctx, &t->slot_stamp); dt_tensor_free(ctx, &t->slot_count);
        dt_release(ctx, t->prev); dt_release(ctx, t->next); dt_release(ctx, t->hs_owner);
        if (t->hs) {
            int h;
            for (h = 0; h < t->hs_count; h++) { dt__em_mfree(ctx, &t->hs[h].map); dt__em_mfree(ctx, &t->hs[h].seen); }
            dt_release(ctx, t->hs);
        }
    }
    dt_release(ctx, e->tabs); dt_release(ctx, e->feat_tab); dt_release(ctx, e->feat_off);
    dt_release(ctx, e->feat_in); dt_release(ctx, e->in_offs);
    dt_release(ctx, e->offs); dt_release(ctx, e->rows); dt_release(ctx, e->wts); dt_release(ctx, e->segs);
    if (e->reqs) { /* a begin without its end: finish what is in flight before the buffers go */
        int i;
        for (i = 0; i < e->n_reqs; i++) (void)dt_comm_wait(e->reqs[i]);
    }
    dt_release(ctx, e->reqs); dt_release(ctx, e->rviews);
    {   /* the batch kept aside, and its requests */
        dt__em_bst *a = &e->aside;
        int i;
        for (i = 0; a->reqs && i < a->n_reqs; i++) (void)dt_comm_wait(a->reqs[i]);
        dt_release(ctx, a->reqs); dt_release(ctx, a->rviews); dt_release(ctx, a->offs); dt_release(ctx, a->rows);
        dt_release(ctx, a->wts); dt_release(ctx, a->segs); dt_release(ctx, a->cnt); dt_release(ctx, a->seq);
        dt_release(ctx, a->seq_grad); dt_release(ctx, a->seq_off);
        dt_tensor_free(ctx, &a->sbuf_i); dt_tensor_free(ctx, &a->sbuf_f); dt_tensor_free(ctx, &a->rbuf_i);
        dt_tensor_free(ctx, &a->rbuf_f); dt_tensor_free(ctx, &a->pooled);
    }
    dt_release(ctx, e->cnt); dt_release(ctx, e->seq); dt_release(ctx, e->seq_grad); dt_release(ctx, e->seq_off);
    dt_release(ctx, e->con); dt_release(ctx, e->con2); dt_release(ctx, e->gtmp); dt_release(ctx, e->src);
    dt_release(ctx, e->tslot); dt_release(ctx, e->aside.tslot);
    dt_release(ctx, e->pend); dt_release(ctx, e->pend2); dt_release(ctx, e->pvals); dt_release(ctx, e->pvals2);
    dt_tensor_free(ctx, &e->sbuf_i); dt_tensor_free(ctx, &e->sbuf_f); dt_tensor_free(ctx, &e->rbuf_i);
    dt_tensor_free(ctx, &e->rbuf_f); dt_tensor_free(ctx, &e->resp); dt_tensor_free(ctx, &e->res);
    dt_tensor_free(ctx, &e->grad_in); dt_tensor_free(ctx, &e->pooled); dt_tensor_free(ctx, &e->dp_i);
    dt_tensor_free(ctx, &e->dp_f); dt_tensor_free(ctx, &e->dp_ri); dt_tensor_free(ctx, &e->dp_rf);
    dt__em_cuda_free(e);
    memset(e, 0, sizeof *e);
    dt_release(ctx, e);
}

/* Every rank must pass the same tables and features (sizes, kinds, optimizers, pins, dynamic
   parameters, seeds): a rank with another dim or rows would plan, allocate and exchange other
   sizes and return wrong values without an error. dt_comm_check_same compares the fields (and
   tells the others when this rank's desc failed its checks, so they do not wait); the message
   names the first differing field and the first rank that differs from rank 0. Returns on every
   rank alike. */
typedef struct dt__em_fld { const char *what; int table, feature, kind; uint64_t v; } dt__em_fld; /* kind 0 int, 1 double, 2 text */

static uint64_t dt__em_text_hash(const char *s) { /* FNV-1a; NULL hashes apart from "" */
    uint64_t h = 1469598103934665603ull;
    if (!s) return 0x6e756c6cull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}
static uint64_t dt__em_dbl_bits(double x) { uint64_t u; memcpy(&u, &x, sizeof u); return u; }

/* The fields compared, in message order: fl may be NULL (count only). */
static int dt__em_desc_fields(const dt_embed_desc *desc, dt__em_fld *fl) {
    int n = 0, i = -1;
#define DT__EM_F(w_, t_, f_, k_, v_) do { if (fl) { fl[n].what = (w_); fl[n].table = (t_); fl[n].feature = (f_); \
                                                  fl[n].kind = (k_); fl[n].v = (v_); } n++; } while (0)
#define DT__EM_FI(w_, x_) DT__EM_F(w_, i, -1, 0, (uint64_t)(int64_t)(x_))
#define DT__EM_FD(w_, x_) DT__EM_F(w_, i, -1, 1, dt__em_dbl_bits(x_))
    /* the counts first: where they differ, the fields after them are not comparable */
    DT__EM_FI("n_tables", desc->n_tables);
    DT__EM_FI("n_features", desc->features ? desc->n_features : 0);
    for (i = 0; i < desc->n_tables; i++) {
        const dt_embed_table_desc *d = &desc->tables[i];
        DT__EM_F("name", i, -1, 2, dt__em_text_hash(d->name));
        DT__EM_FI("rows", d->rows); DT__EM_FI("dim", d->dim); DT__EM_FI("dtype", d->dtype);
        DT__EM_FI("pooling", d->pooling); DT__EM_FI("weighted", d->weighted);
        DT__EM_FI("init.kind", d->init.kind); DT__EM_FI("init.seed", d->init.seed);
        DT__EM_FD("init.value", d->init.value); DT__EM_FD("init.low", d->init.low); DT__EM_FD("init.high", d->init.high);
        DT__EM_FD("init.mean", d->init.mean); DT__EM_FD("init.std", d->init.std); DT__EM_FD("init.gain", d->init.gain);
        DT__EM_FI("optim.kind", d->optim.kind); DT__EM_FD("optim.lr", d->optim.lr); DT__EM_FD("optim.eps", d->optim.eps);
        DT__EM_FD("optim.beta1", d->optim.beta1); DT__EM_FD("optim.beta2", d->optim.beta2);
        DT__EM_FI("ids", d->ids); DT__EM_FI("sharding", d->sharding); DT__EM_FI("pin_owner", d->pin_owner);
        DT__EM_FI("owner", d->owner); DT__EM_FD("ids_per_batch", d->ids_per_batch); DT__EM_FI("dynamic", d->dynamic);
        DT__EM_FI("admit_after", d->admit_after); DT__EM_FI("hash_shards", d->hash_shards);
        DT__EM_FI("eviction", d->eviction); DT__EM_FI("group_size", d->group_size);
        DT__EM_FI("tier", d->tier); DT__EM_FI("cache_rows", d->cache_rows);
        DT__EM_FD("cache_fraction", d->cache_fraction);
        DT__EM_FI("cache_eviction", d->cache_eviction); DT__EM_FI("log_rows", d->log_rows);
    }
    for (i = 0; desc->features && i < desc->n_features; i++) {
        DT__EM_F("name", -1, i, 2, dt__em_text_hash(desc->features[i].name));
        DT__EM_F("table", -1, i, 0, (uint64_t)(int64_t)desc->features[i].table);
        DT__EM_F("input", -1, i, 0, (uint64_t)(int64_t)(desc->n_inputs > 0 ? desc->features[i].input : i));
    }
    i = -1;
    DT__EM_FI("n_inputs", desc->n_inputs);
    DT__EM_FI("seed", desc->seed); DT__EM_FI("batch_hint", desc->batch_hint);
    DT__EM_FD("dp_max_bytes", desc->dp_max_bytes); DT__EM_FI("device", desc->device);
#undef DT__EM_FD
#undef DT__EM_FI
#undef DT__EM_F
    return n;
}

static void dt__em_fld_str(const dt__em_fld *f, uint64_t v, char *buf, size_t n) {
    double x;
    if (f->kind == 0) { snprintf(buf, n, "%lld", (long long)(int64_t)v); return; }
    if (f->kind == 2) { snprintf(buf, n, "text hashing to %016llx", (unsigned long long)v); return; }
    memcpy(&x, &v, sizeof x);
    snprintf(buf, n, "%.17g", x);
}

static dt_status dt__em_check_same(dt_ctx *ctx, const dt_embed_desc *desc, dt_status st) {
    const char *fn = "dt_embed_create";
    dt__em_fld *fl = NULL;
    uint64_t *v = NULL;
    dt_comm_same_diff df;
    dt_status own;
    int n = 0, k, me = dt_comm_rank(desc->comm);
    if (!st) {
        n = dt__em_desc_fields(desc, NULL);
        fl = (dt__em_fld *)dt_alloc(ctx, sizeof(dt__em_fld) * (size_t)n);
        v = (uint64_t *)dt_alloc(ctx, sizeof(uint64_t) * (size_t)n);
        if (!fl || !v) st = DT_ERR_OOM;
        else dt__em_desc_fields(desc, fl);
        for (k = 0; !st && k < n; k++) v[k] = fl[k].v;
    }
    own = st;
    st = dt_comm_check_same(desc->comm, v, st ? 0 : n, st, &df);
    if (st && st == own) { /* this rank's own error, already named */
        dt_release(ctx, fl);
        dt_release(ctx, v);
        return st;
    }
    if (st && df.failed)
        st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: a bad desc on another rank; see its message", fn);
    else if (st == DT_ERR_ARG && df.field >= 0) {
        const dt__em_fld *f = &fl[df.field];
        int r = df.rank;
        char s0[64], sr[64], obj[DT_NAME_MAX + 48];
        dt__em_fld_str(f, df.value0, s0, sizeof s0);
        dt__em_fld_str(f, df.value, sr, sizeof sr);
        if (f->table >= 0) snprintf(obj, sizeof obj, "tables[%d] (\"%.63s\").", f->table, desc->tables[f->table].name ?
                                    desc->tables[f->table].name : "");
        else if (f->feature >= 0) snprintf(obj, sizeof obj, "features[%d].", f->feature);
        else snprintf(obj, sizeof obj, "desc.");
        if (f->kind == 2) /* a name: this rank's text, the others' only as a hash */
            st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s%s differs between rank 0 and rank %d (\"%.63s\" on this rank, "
                                  "%d); expected every rank to pass the same tables and features", fn, obj, f->what,
                                  r, f->table >= 0 ? (desc->tables[f->table].name ? desc->tables[f->table].name
                                  : "(NULL)") : desc->features[f->feature].name ? desc->features[f->feature].name : "(NULL)", me);
        else
            st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s%s = %s on rank 0 but %s on rank %d; expected every rank to "
                                  "pass the same tables and features", fn, obj, f->what, s0, sr, r);
    }
    dt_release(ctx, fl);
    dt_release(ctx, v);
    return st;
}

/* dt_embed_create in three steps (check, resolve, build). The check is local; dt_embed_create then
   shares its verdict in dt__em_check_same, so a rank whose desc is bad still reaches that
   collective and the others do not wait for it. */
static dt_status dt__em_check_desc(dt_ctx *ctx, const dt_embed_desc *desc, int W) {
    const char *fn = "dt_embed_create";
    dt_status st = DT_OK;
    int i, j;
    if (desc->n_tables < 1 || !desc->tables)
        st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.n_tables = %d with tables %s; expected >= 1 tables", fn,
                              desc->n_tables, desc->tables ? "set" : "NULL");
    else if (desc->features ? desc->n_features < 1 : desc->n_features != 0)
        st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.n_features = %d with features %s; expected >= 1 with "
                              "features, 0 without", fn, desc->n_features, desc->features ? "set" : "NULL");
    else if (desc->print_plan != 0 && desc->print_plan != 1)
        st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.print_plan = %d; expected 0 or 1", fn, desc->print_plan);
    else if (desc->batch_hint < 0)
        st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.batch_hint = %lld; expected >= 0", fn,
                              (long long)desc->batch_hint);
    else if (!(desc->dp_max_bytes == desc->dp_max_bytes))
        st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.dp_max_bytes = %g; expected a number (0 = 1 MiB, < 0 = no "
                              "data-parallel tables)", fn, desc->dp_max_bytes);
    else if (desc->tier_dir && (!desc->tier_dir[0] || strlen(desc->tier_dir) > 900))
        st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.tier_dir is %s; expected NULL or a directory shorter than 900",
                              fn, desc->tier_dir[0] ? "too long" : "empty");
    if (!st) st = dt__em_cuda_check_desc(ctx, desc);
    for (i = 0; !st && i < desc->n_tables; i++) {
        st = dt__em_check_table(ctx, &desc->tables[i], i, W);
        if (!st && desc->tables[i].tier == DT_TIER_HOST && desc->device != DT_CUDA_DEVICE)
            st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] (\"%s\").tier = HOST: the tier of cuda tables; "
                                  "expected DISK (or NONE) for cpu tables", fn, i, desc->tables[i].name);
        if (!st && desc->tables[i].tier == DT_TIER_DISK && desc->device == DT_CUDA_DEVICE)
            st = dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: tables[%d] (\"%s\").tier = DISK on cuda (desc.device); "
                                  "expected HOST (pinned host memory under a device cache) or NONE for cuda tables",
                                  fn, i, desc->tables[i].name);
        for (j = 0; !st && j < i; j++)
            if (strcmp(desc->tables[j].name, desc->tables[i].name) == 0)
                st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tables[%d] and tables[%d] are both named \"%s\"; "
                                      "expected unique names", fn, j, i, desc->tables[i].name);
    }
    for (i = 0; !st && desc->features && i < desc->n_features; i++)
        if (desc->features[i].table < 0 || desc->features[i].table >= desc->n_tables)
            st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: features[%d].table = %d; expected a table in [0, %d)", fn, i,
                                  desc->features[i].table, desc->n_tables);
    if (!st && (desc->n_inputs < 0 || (desc->n_inputs > 0 && !desc->features)))
        st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.n_inputs = %d with features %s; expected 0, or > 0 with "
                              "features (each names its input)", fn, desc->n_inputs, desc->features ? "set" : "NULL");
    for (i = 0; !st && desc->n_inputs > 0 && i < desc->n_features; i++)
        if (desc->features[i].input < 0 || desc->features[i].input >= desc->n_inputs)
            st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: features[%d].input = %d; expected a kjt feature in [0, %d) "
                                  "(desc.n_inputs)", fn, i, desc->features[i].input, desc->n_inputs);
    return st;
}

/* A table desc's zeros become the documented defaults (DT_OPT_ZERO: a real 0). */
static void dt__em_resolve_table(dt__em_tab *t, const dt_embed_table_desc *d) {
    snprintf(t->name, sizeof t->name, "%s", d->name);
    t->rows = d->rows; t->dim = d->dim;
    t->dtype = d->dtype == DT_DTYPE_DEFAULT ? DT_F32 : d->dtype;
    t->pooling = d->pooling == DT_POOL_DEFAULT ? DT_POOL_SUM : d->pooling;
    t->weighted = d->weighted;
    t->init = d->init;
    t->kind = d->optim.kind == DT_EMBED_OPT_DEFAULT ? DT_EMBED_SGD : d->optim.kind;
    t->lr = d->optim.lr == 0 ? (t->kind == DT_EMBED_ADAM ? 1e-3 : 0.01) : d->optim.lr;
    t->eps = d->optim.eps == 0 ? (t->kind == DT_EMBED_ADAM ? 1e-8 : 1e-10) : d->optim.eps;
    t->b1 = d->optim.beta1 == 0 ? 0.9 : d->optim.beta1;
    t->b2 = d->optim.beta2 == 0 ? 0.999 : d->optim.beta2;
    if (t->lr == DT_OPT_ZERO) t->lr = 0;
    if (t->eps == DT_OPT_ZERO) t->eps = 0;
    if (t->b1 == DT_OPT_ZERO) t->b1 = 0;
    if (t->b2 == DT_OPT_ZERO) t->b2 = 0;
    t->ids = d->ids == DT_IDS_DEFAULT ? DT_IDS_CHECK : d->ids;
    t->shard = d->sharding == DT_SHARD_DEFAULT ? DT_SHARD_AUTO : d->sharding;
    t->owner = d->pin_owner ? d->owner : 0;
    t->ids_per_batch = d->ids_per_batch;
    t->dynamic = d->dynamic;
    t->admit_after = d->admit_after ? d->admit_after : 1;
    t->n_hs = d->hash_shards ? d->hash_shards : 16;
    t->evict = d->eviction == DT_EVICT_DEFAULT ? DT_EVICT_LRU : d->eviction;
    t->gsize = d->group_size;
    t->tier_kind = d->tier == DT_TIER_DEFAULT ? DT_TIER_NONE : d->tier;
    t->cache_rows = d->cache_rows;
    t->cache_fraction = d->cache_fraction;
    t->cache_evict = d->cache_eviction == DT_EVICT_DEFAULT ? DT_EVICT_LRU : d->cache_eviction;
    t->log_rows = d->log_rows;
}

/* The object with its per-rank arrays and resolved tables; NULL (everything freed) when out of memory. */
static dt_embed *dt__em_new(dt_ctx *ctx, const dt_embed_desc *desc, int W) {
    dt_embed *e;
    int i;
    if (!(e = (dt_embed *)dt_alloc_zeroed(ctx, sizeof *e))) return NULL;
    e->sync = 1;
    e->cuda = desc->device == DT_CUDA_DEVICE;
    e->ctx = ctx;
    e->batch_hint = desc->batch_hint > 0 ? desc->batch_hint : 1024;
    {   /* tier DISK: where the slow tiers go */
        const char *dir = desc->tier_dir ? desc->tier_dir : getenv("TMPDIR");
        snprintf(e->tier_dir, sizeof e->tier_dir, "%s", dir && dir[0] ? dir : "/tmp");
        e->pf_sync = getenv("DT_EMBED_PREFETCH_SYNC") != NULL; /* (read once, not each prefetch) */
    }
    e->comm = desc->comm;
    e->rank = desc->comm ? dt_comm_rank(desc->comm) : 0;
    e->size = W;
    e->n_tabs = desc->n_tables;
    e->n_feat = desc->features ? desc->n_features : desc->n_tables;
    e->tabs = (dt__em_tab *)dt_alloc(ctx, sizeof(dt__em_tab) * (size_t)e->n_tabs);
    e->feat_tab = (int *)dt_alloc(ctx, sizeof(int) * (size_t)e->n_feat);
    e->feat_in = (int *)dt_alloc(ctx, sizeof(int) * (size_t)e->n_feat);
    e->n_in = desc->n_inputs > 0 ? desc->n_inputs : e->n_feat;
    e->feat_off = (int64_t *)dt_alloc(ctx, sizeof(int64_t) * (size_t)e->n_feat);
    e->seq_off = (int64_t *)dt_alloc(ctx, sizeof(int64_t) * (size_t)(e->n_feat + 1));
    e->cnt = (int64_t *)dt_alloc(ctx, sizeof(int64_t) * (size_t)(6 * W + 1));
    e->reqs = (dt_comm_req **)dt_alloc(ctx, sizeof(dt_comm_req *) * (size_t)(4 * W));
    e->rviews = (dt_tensor *)dt_alloc(ctx, sizeof(dt_tensor) * (size_t)(4 * W));
    e->aside.seq_off = (int64_t *)dt_alloc(ctx, sizeof(int64_t) * (size_t)(e->n_feat + 1));
    e->aside.cnt = (int64_t *)dt_alloc(ctx, sizeof(int64_t) * (size_t)(6 * W + 1));
    e->aside.reqs = (dt_comm_req **)dt_alloc(ctx, sizeof(dt_comm_req *) * (size_t)(4 * W));
    e->aside.rviews = (dt_tensor *)dt_alloc(ctx, sizeof(dt_tensor) * (size_t)(4 * W));
    if (!e->tabs || !e->feat_tab || !e->feat_in || !e->feat_off || !e->seq_off || !e->cnt || !e->reqs || !e->rviews ||
        !e->aside.seq_off || !e->aside.cnt || !e->aside.reqs || !e->aside.rviews) {
        dt_embed_free(e);
        return NULL;
    }
    memset(e->tabs, 0, sizeof(dt__em_tab) * (size_t)e->n_tabs);
    for (i = 0; i < e->n_tabs; i++) {
        dt__em_resolve_table(&e->tabs[i], &desc->tables[i]);
        if (e->tabs[i].weighted) e->any_weighted = 1;
    }
    return e;
}

/* Each table's shard: placed by the plan, allocated, initialised (and moved to the device). */
static dt_status dt__em_build_shards(dt_embed *e, const dt_embed_desc *desc) {
    const char *fn = "dt_embed_create";
    dt_ctx *ctx = e->ctx;
    dt_status st = dt__em_plan(e, desc, desc->tables);
    int i, W = e->size;
    for (i = 0; !st && i < e->n_tabs; i++) {
        dt__em_tab *t = &e->tabs[i];
        if (t->dynamic) e->any_dyn = 1;
        if (t->tier_kind != DT_TIER_NONE) e->any_tier = 1; /* on every rank: its collectives are every rank's */
        dt__em_shard_bounds(e, t);
        /* One rank holds every table whole, whatever the plan says of it: its lookups pool straight
           from the shard and its gradients are read where they lie (the data-parallel path), with the
           same sums in the same order, so the results are the requests' bits; the requests and
           responses, their copies and the gradients' copy are skipped (bench/RESULTS.md, issue 25:
           a 100k x 16 SGD step ~17% faster). For rows of up to 512 bytes (dim 128 f32): faster
           at dims 16, 64 and 128 on an Emerald Rapids core (100k x 128 SGD 1.49 -> 1.13 ms,
           8 x 100k x 64 Adagrad 180k -> 214-245k samples/s); an AMD EPYC (Zen 3) measured dim 16
           faster, dim 128 level and dim 64 slower (2.3 -> 2.9 ms a 100k-row Adagrad step, its
           gradient sums stalling on their reads; not understood). Wider rows were not measured
           and keep the requests. Not for tiered tables (their prefetch serves the requests' path) nor dynamic ones (ids
           hashed to slots) nor cuda (its own paths). */
        t->local = t->shard == DT_SHARD_DATA ||
                   (W == 1 && !e->cuda && !t->dynamic && t->tier_kind == DT_TIER_NONE && t->r0 == 0 && t->r1 == t->rows &&
                    t->c0 == 0 && t->c1 == t->dim && t->dim * (int64_t)dt_dtype_size(t->dtype) <= 512);
        if (t->local) e->any_dp = 1;
        if (t->dynamic) {
            int h, k;
            if (!(t->hs_owner = (int *)dt_alloc(ctx, sizeof(int) * (size_t)t->n_hs))) { st = DT_ERR_OOM; break; }
            for (k = 0; k < W; k++)
                for (h = (int)((int64_t)k * t->n_hs / W); h < (int)((int64_t)(k + 1) * t->n_hs / W); h++) t->hs_owner[h] = k;
        }
        st = dt__em_alloc_shard(e, t, desc->seed);
        if (st == DT_ERR_OOM) { /* name the table: the allocator's message names only bytes */
            char why[160];
            snprintf(why, sizeof why, "%.150s", dt_ctx_error(ctx));
            st = dt_ctx_set_error(ctx, DT_ERR_OOM, "%s: tables[%d] (\"%s\"): this rank's shard, %lld rows x %lld "
                                  "columns of %s plus optimizer state, could not be allocated (%s); expected fewer "
                                  "rows, more ranks or another sharding", fn, i, t->name, (long long)(t->r1 - t->r0),
                                  (long long)(t->c1 - t->c0), dt_dtype_name(t->dtype), why);
        }
        if (!st && e->cuda) st = dt__em_cuda_to_device(e, t);
    }
    if (e->comm) { /* every rank must have succeeded (and agree on the tables: same count) */
        double v[2];
        v[0] = st ? 1 : 0;
        v[1] = (double)e->n_tabs + (double)e->n_feat * 1e6;
        if (dt_comm_allreduce_f64(e->comm, v, 2, DT_REDUCE_SUM)) st = st ? st : DT_ERR_COMM;
        else if (!st && v[0] > 0) st = dt_ctx_set_error(ctx, DT_ERR_COMM, "%s: failed on another rank", fn);
        else if (!st && v[1] != W * ((double)e->n_tabs + (double)e->n_feat * 1e6))
            st = dt_ctx_set_error(ctx, DT_ERR_COMM, "%s: the ranks passed different numbers of tables or features", fn);
    }
    return st;
}

DT_API dt_status dt_embed_create(dt_ctx *ctx, dt_embed **out, const dt_embed_desc *desc) {
    const char *fn = "dt_embed_create";
    dt_embed *e;
    dt_status st;
    int i, W;
    if (out) *out = NULL;
    if (!ctx) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    if (!desc) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc is NULL", fn);
    W = desc->comm ? dt_comm_size(desc->comm) : 1;
    st = dt__em_check_desc(ctx, desc, W);
    if (desc->comm) DT__TRY(dt__em_check_same(ctx, desc, st)); /* collective: every rank returns alike */
    else if (st) return st;
    if (!(e = dt__em_new(ctx, desc, W))) return DT_ERR_OOM;
    st = dt__em_groups(e, desc->tables);
    if (st) { dt_embed_free(e); return st; }
    e->pooled_dim = 0;
    for (i = 0; i < e->n_feat; i++) {
        e->feat_tab[i] = desc->features ? desc->features[i].table : i;
        e->feat_in[i] = desc->n_inputs > 0 ? desc->features[i].input : i;
        if (e->tabs[e->feat_tab[i]].pooling == DT_POOL_NONE) e->feat_off[i] = -1;
        else { e->feat_off[i] = e->pooled_dim; e->pooled_dim += e->tabs[e->feat_tab[i]].dim; }
    }
    if ((st = dt__em_build_shards(e, desc)) != DT_OK) { dt_embed_free(e); return st; }
    if (desc->print_plan && e->rank == 0) dt_embed_plan_print(e);
    *out = e;
    return DT_OK;
}

DT_API int64_t dt_embed_pooled_dim(const dt_embed *e) { return e ? e->pooled_dim : 0; }
DT_API int64_t dt_embed_feature_offset(const dt_embed *e, int f) {
    return e && f >= 0 && f < e->n_feat ? e->feat_off[f] : -1;
}
DT_API dt_embed_sharding dt_embed_table_sharding(const dt_embed *e, int table, int *owner) {
    if (owner) *owner = -1;
    if (!e || table < 0 || table >= e->n_tabs) return DT_SHARD_DEFAULT;
    if (owner) *owner = e->tabs[table].shard == DT_SHARD_TABLE ? e->tabs[table].owner
                      : e->tabs[table].shard == DT_SHARD_TABLE_ROW ? e->tabs[table].gfirst : -1;
    return e->tabs[table].shard;
}

DT_API size_t dt_embed_plan_format(const dt_embed *e, char *buf, size_t n) {
    size_t used = 0;
    int i;
    char line[256];
    if (buf && n) buf[0] = 0; /* first: a NULL e still leaves buf a string */
    if (!e) return 0;
#define DT__EM_PUT(...) do { int k_ = snprintf(line, sizeof line, __VA_ARGS__); \
        if (k_ > 0) { if (buf && used + (size_t)k_ < n) memcpy(buf + used, line, (size_t)k_ + 1); used += (size_t)k_; } } while (0)
    DT__EM_PUT("%-20s %-9s %-9s %14s %16s\n", "table", "kind", "ranks", "bytes/rank", "lookup B/step");
    for (i = 0; i < e->n_tabs; i++) {
        const dt__em_tab *t = &e->tabs[i];
        char ranks[32];
        double per = t->plan_bytes;
        if (t->shard == DT_SHARD_TABLE) snprintf(ranks, sizeof ranks, "%d", t->owner);
        else if (t->shard == DT_SHARD_TABLE_ROW) snprintf(ranks, sizeof ranks, "%d-%d", t->gfirst, t->gfirst + t->gsize - 1);
        else snprintf(ranks, sizeof ranks, "0-%d", e->size - 1);
        if (t->shard == DT_SHARD_ROW || t->shard == DT_SHARD_COLUMN) per /= e->size;
        if (t->shard == DT_SHARD_TABLE_ROW) per /= t->gsize;
        DT__EM_PUT("%-20.20s %-9s %-9s %14.0f %16.0f\n", t->name, dt_embed_sharding_name(t->shard), ranks, per, t->plan_lookup);
    }
#undef DT__EM_PUT
    return used;
}

DT_API void dt_embed_plan_print(const dt_embed *e) {
    char buf[8192];
    size_t n;
    if (!e) return;
    n = dt_embed_plan_format(e, buf, sizeof buf);
    if (n >= sizeof buf) {
        char *big = (char *)dt_alloc(e->ctx, n + 1);
        if (big) { dt_embed_plan_format(e, big, n + 1); fputs(big, stdout); dt_release(e->ctx, big); }
    } else fputs(buf, stdout);
    fflush(stdout);
}

/* ==== >>requests: the forward's requests: batch checks, pooling, segments ===================== */

/* Checks the batch and turns every id into its global row (check or hash). Local: the first bad
   id is named in the ctx error and *bad set. */
/* Whether any of n floats is NaN or infinite. Two floats per 64-bit word: a float's exponent
   field plus one carries into its sign bit exactly when it is all ones; no branch, no float
   compare, so the check costs next to nothing beside the lookups. */
static int dt__em_nonfinite(const float *w, int64_t n) {
    const uint64_t M = 0x7f8000007f800000ull, A = 0x0080000000800000ull;
    uint64_t a0 = 0, a1 = 0, u0, u1;
    uint32_t u;
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        memcpy(&u0, w + j, 8);
        memcpy(&u1, w + j + 2, 8);
        a0 |= (u0 & M) + A;
        a1 |= (u1 & M) + A;
    }
    for (; j < n; j++) {
        memcpy(&u, w + j, 4);
        a0 |= (uint64_t)((u & 0x7f800000u) + 0x00800000u);
    }
    return ((a0 | a1) & 0x8000000080000000ull) != 0;
}

/* Reads and checks the batch. *bad: the status of the first bad id or weight (its message set). */
static dt_status dt__em_read_batch(dt_embed *e, const dt_kjt *k, int *bad) {
    const char *fn = "dt_embed_forward";
    int64_t F = e->n_feat, B, nb, ni, total = 0, in_total = 0, i, f, b;
    *bad = 0;
    if (!k) return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: kjt is NULL", fn);
    if (k->n_features != e->n_in)
        return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: kjt.n_features = %d; expected %d (the %s of the dt_embed)", fn,
                                k->n_features, e->n_in, e->n_in == e->n_feat && e->feat_in[0] == 0 ? "features" : "inputs");
    B = k->batch;
    if (B < 0 || !dt_mul_ok(F > e->n_in ? F : e->n_in, B, &nb) || nb > ((int64_t)1 << 40))
        return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: kjt.batch = %lld; expected 0 <= batch and features x batch "
                                "<= 2^40", fn, (long long)B);
    ni = (int64_t)e->n_in * B;
    nb = F * B;
    if (ni > 0 && !k->lengths) return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: kjt.lengths is NULL with batch %lld",
                                                       fn, (long long)B);
    if (k->ids_dtype != DT_DTYPE_DEFAULT && k->ids_dtype != DT_I64 && k->ids_dtype != DT_I32)
        return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: kjt.ids_dtype = %s; expected i64 (DEFAULT) or i32", fn,
                                dt_dtype_name(k->ids_dtype));
    DT__TRY(dt_grow(e->ctx, (void **)&e->in_offs, &e->in_offs_cap, ni + 1, sizeof(int64_t), "dt_embed offsets"));
    DT__TRY(dt_grow(e->ctx, (void **)&e->offs, &e->offs_cap, nb + 1, sizeof(int64_t), "dt_embed offsets"));
    e->in_offs[0] = 0;
    for (i = 0; i < ni; i++) {
        if (k->lengths[i] < 0 || k->lengths[i] > ((int64_t)1 << 40) - in_total)
            return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: kjt.lengths[%lld] (feature %lld, sample %lld) = %lld; "
                                    "expected >= 0 and a total <= 2^40", fn, (long long)i, (long long)(i / (B ? B : 1)),
                                    (long long)(i % (B ? B : 1)), (long long)k->lengths[i]);
        in_total += k->lengths[i];
        e->in_offs[i + 1] = in_total;
    }
    if (in_total > 0 && !k->ids) return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: kjt.ids is NULL with %lld ids", fn,
                                                         (long long)in_total);
    e->offs[0] = 0; /* every feature's bags (a copy of its input's), feature-major */
    for (f = 0; f < F; f++)
        for (b = 0; b < B; b++) {
            int64_t j = (int64_t)e->feat_in[f] * B + b, n = e->in_offs[j + 1] - e->in_offs[j];
            if (n > ((int64_t)1 << 40) - total)
                return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: the features' ids total more than 2^40 (inputs read by "
                                        "several features count once per feature)", fn);
            total += n;
            e->offs[f * B + b + 1] = total;
        }
    DT__TRY(dt_grow(e->ctx, (void **)&e->rows, &e->rows_cap, total + 1, sizeof(int64_t), "dt_embed rows"));
    DT__TRY(dt_grow(e->ctx, (void **)&e->wts, &e->wts_cap, total + 1, sizeof(float), "dt_embed weights"));
    e->B = B;
    e->n_ids = total;
    for (f = 0; f < F; f++) {
        const dt__em_tab *t = &e->tabs[e->feat_tab[f]];
        int64_t fin = e->feat_in[f];
        if (t->weighted && !k->weights && e->offs[(f + 1) * B] > e->offs[f * B])
            return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: kjt.weights is NULL; feature %lld's table \"%s\" is weighted",
                                    fn, (long long)f, t->name);
        if (t->weighted && !*bad) { /* a NaN or inf would poison the pooled rows and, in backward, the table */
            int64_t j0 = e->in_offs[fin * B], j = j0, n = e->in_offs[(fin + 1) * B] - j0;
            if (n > 0 && dt__em_nonfinite(k->weights + j0, n)) {
                while (!dt__em_nonfinite(k->weights + j, 1)) j++;
                for (b = 0; e->in_offs[fin * B + b + 1] <= j; b++) {}
                dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: kjt.weights[%lld] = %g (table \"%s\", feature %lld, local "
                                 "sample %lld); expected a finite weight", fn, (long long)j, (double)k->weights[j],
                                 t->name, (long long)f, (long long)b);
                *bad = DT_ERR_ARG;
            }
        }
        for (b = 0; b < B; b++) {
            int64_t src = e->in_offs[fin * B + b]; /* the kjt's index of this bag's first id */
            for (i = e->offs[f * B + b]; i < e->offs[f * B + b + 1]; i++, src++) {
                int64_t id = k->ids_dtype == DT_I32 ? (int64_t)((const int32_t *)k->ids)[src] : ((const int64_t *)k->ids)[src];
                e->wts[i] = t->weighted ? k->weights[src] : 1.0f;
                if (t->dynamic) e->rows[i] = id; /* the owner maps it to a slot */
                else if (t->ids == DT_IDS_HASH) e->rows[i] = (int64_t)(dt_embed_hash_id(id) % (uint64_t)t->rows);
                else if (id < 0 || id >= t->rows) {
                    if (!*bad)
                        dt_ctx_set_error(e->ctx, DT_ERR_RANGE, "%s: table \"%s\", feature %lld, local sample %lld, id %lld is out of range; expected 0 <= id < %lld (or ids = "
                                         "DT_IDS_HASH)", fn, t->name, (long long)f, (long long)b, (long long)id, (long long)t->rows);
                    if (!*bad) *bad = DT_ERR_RANGE;
                    e->rows[i] = 0;
                } else e->rows[i] = id;
            }
        }
    }
    return DT_OK;
}

/* acc += r and acc += w * r: restrict lets the compiler vectorize them (acc never aliases a row). */
static void dt__em_add(float *DT__EM_RESTRICT acc, const float *DT__EM_RESTRICT r, int64_t n) {
    int64_t c = 0;
#ifdef DT__EM_SSE2 /* the same f32 adds, four lanes at a time: bitwise equal to the loop */
    for (; c + 4 <= n; c += 4) _mm_storeu_ps(acc + c, _mm_add_ps(_mm_loadu_ps(acc + c), _mm_loadu_ps(r + c)));
#endif
    for (; c < n; c++) acc[c] += r[c];
}
static void dt__em_axpy(float *DT__EM_RESTRICT acc, const float *DT__EM_RESTRICT r, float w, int64_t n) {
    int64_t c = 0;
#ifdef DT__EM_SSE2
    __m128 wv = _mm_set1_ps(w);
    for (; c + 4 <= n; c += 4)
        _mm_storeu_ps(acc + c, _mm_add_ps(_mm_loadu_ps(acc + c), _mm_mul_ps(wv, _mm_loadu_ps(r + c))));
#endif
    for (; c < n; c++) acc[c] += w * r[c];
}

/* Software prefetch of a row's cache lines (all of them: a 64-wide f32 row is four lines, and
   the hardware prefetchers do not follow random rows). The gathers and the update are bound by
   the latency of rows in DRAM (random ids in tables larger than the cache): asking a few ids
   ahead keeps several misses in flight. A hint only: it changes no value. Other compilers: no-op.
   Reads ask for locality 2 (prefetcht1: into L2, not L1): the gather pass moves more bytes per
   second than with prefetcht0, because L1's fill buffers stop being the limit. */
#if defined(__GNUC__) || defined(__clang__)
#define DT__EM_PF_R(p) __builtin_prefetch((p), 0, 2)
#define DT__EM_PF_W(p) __builtin_prefetch((p), 1, 3)
/* always inlined: gcc deems a function that only prefetches free of side effects and drops
   the calls to it (gcc 12 -O2 leaves no prefetch in the pooling otherwise) */
#define DT__EM_PF_FN static inline __attribute__((always_inline))
#else
#define DT__EM_PF_R(p) ((void)(p))
#define DT__EM_PF_W(p) ((void)(p))
#define DT__EM_PF_FN static
#endif
#define DT__EM_PF_IDS 8 /* how many ids ahead (not critical: 4 to 16 do about as well) */
DT__EM_PF_FN void dt__em_pf_row(const dt__em_tab *t, int64_t row, int write) {
    size_t es = dt_dtype_size(t->dtype), bytes, o;
    const char *p;
    if (row < t->r0 || row >= t->r1 || t->tier) return; /* a rejected dynamic id (-1), nothing to read, or
                                                           a tiered table (its rows are in the cache) */
    bytes = (size_t)(t->c1 - t->c0) * es;
    p = (const char *)t->w.data + (size_t)(row - t->r0) * bytes;
    for (o = 0; o < bytes; o += 64) {
        if (write) DT__EM_PF_W(p + o);
        else DT__EM_PF_R(p + o);
    }
    if (bytes > 0 && ((uintptr_t)(p + bytes - 1) & 63) < ((uintptr_t)p & 63)) { /* a line the loop missed */
        if (write) DT__EM_PF_W(p + bytes - 1);
        else DT__EM_PF_R(p + bytes - 1);
    }
}

/* Pools ids [i0, i1) of the batch (global rows in rows[], weights in w[]) over the shard's
   columns [c0, c0 + nc) into acc: acc = ((0 + w0 row0) + w1 row1) + ... in f32, bag order.
   pf: prefetch the rows 2 ids ahead (long bags; dt__em_serve passes 0: its cursor looks further
   ahead, and a second prefetch of the same lines only costs instructions). */
static void dt__em_pool(const dt__em_tab *t, float *acc, const int64_t *rows, const float *w, int64_t n,
                        int64_t c0, int64_t nc, int pf) {
    int64_t j, c, ld = t->c1 - t->c0;
    for (c = 0; c < nc; c++) acc[c] = 0.0f;
    if (t->dtype == DT_F32) {
        const float *base = (const float *)t->w.data + (c0 - t->c0);
        for (j = 0; j < n; j++) {
            if (rows[j] < 0) continue; /* a dynamic id that was not admitted: zeros */
            if (pf && j + 2 < n) dt__em_pf_row(t, rows[j + 2], 0);
            if (t->weighted) dt__em_axpy(acc, base + (rows[j] - t->r0) * ld, w ? w[j] : 1.0f, nc);
            else dt__em_add(acc, base + (rows[j] - t->r0) * ld, nc);
        }
        return;
    }
    for (j = 0; j < n; j++) {
        int64_t x = rows[j] - t->r0;
        float wj = w ? w[j] : 1.0f;
        const uint16_t *r;
        if (rows[j] < 0) continue;
        r = (const uint16_t *)t->w.data + x * ld + (c0 - t->c0);
        if (pf && j + 2 < n) dt__em_pf_row(t, rows[j + 2], 0);
        for (c = 0; c < nc; c++) {
            float v = t->dtype == DT_BF16 ? dt_bf16_to_f32(r[c]) : dt_f16_to_f32(r[c]);
            acc[c] += t->weighted ? wj * v : v;
        }
    }
}

/* The segments of sample b, feature f: calls emit(dest, pos, c0, nc, i0, n) for each request. */
typedef struct dt__em_gen {
    int64_t *ni, *nf, *nr;       /* per dest: ints, floats, result floats (counting pass) */
    int fill;
    int64_t *nq;                 /* counting pass, or NULL: per dest requests, then per (dest, table) ids and
                                    requests (nq + W + 2 (dest T + table)); ids sent counted in the stats */
} dt__em_gen;

static dt_status dt__em_add_seg(dt_embed *e, dt__em_gen *g, int dest, int f, int64_t b, int64_t pos, int64_t c0,
                                int64_t nc, int64_t i0, int64_t n) {
    int64_t *ni = g->ni, *nf = g->nf, *nr = g->nr;
    if (g->fill) {
        int64_t *pi = (int64_t *)e->sbuf_i.data + ni[dest];
        dt__em_seg *s;
        pi[0] = f; pi[1] = e->g0 + b; pi[2] = pos < 0 ? 0 : pos; pi[3] = n;
        memcpy(pi + DT__EM_HDR, e->rows + i0, (size_t)n * sizeof(int64_t));
        if (e->any_weighted) memcpy((float *)e->sbuf_f.data + nf[dest], e->wts + i0, (size_t)n * sizeof(float));
        DT__TRY(dt_grow(e->ctx, (void **)&e->segs, &e->segs_cap, e->n_segs + 1, sizeof(dt__em_seg), "dt_embed segments"));
        s = &e->segs[e->n_segs++];
        s->dest = dest; s->f = f; s->b = b; s->pos = pos; s->c0 = c0; s->nc = nc; s->res = nr[dest];
        if (dest != e->rank) e->stats.ids_sent += n;
    }
    ni[dest] += DT__EM_HDR + n;
    if (e->any_weighted) nf[dest] += n;
    nr[dest] += nc;
    if (g->nq) {
        int64_t *pt = g->nq + e->size + 2 * ((int64_t)dest * e->n_tabs + e->feat_tab[f]);
        g->nq[dest]++;
        pt[0] += n; pt[1]++;
        if (dest != e->rank) e->stats.ids_sent += n;
    }
    return DT_OK;
}

static dt_status dt__em_generate(dt_embed *e, dt__em_gen *g) {
    int64_t B = e->B, b, j;
    int f, k, W = e->size;
    for (b = 0; b < B; b++) {           /* sample-major: requests follow the global sample order */
        for (f = 0; f < e->n_feat; f++) {
            const dt__em_tab *t = &e->tabs[e->feat_tab[f]];
            int64_t i0 = e->offs[(int64_t)f * B + b], n = e->offs[(int64_t)f * B + b + 1] - i0;
            int seq = t->pooling == DT_POOL_NONE;
            switch (t->local ? DT_SHARD_DATA : t->shard) {
            case DT_SHARD_TABLE:
                if (seq) for (j = 0; j < n; j++) DT__TRY(dt__em_add_seg(e, g, t->owner, f, b, j, 0, t->dim, i0 + j, 1));
                else DT__TRY(dt__em_add_seg(e, g, t->owner, f, b, -1, 0, t->dim, i0, n));
                break;
            case DT_SHARD_ROW: /* one request per id: the requester sums in bag order (exactness) */
                for (j = 0; j < n; j++) {
                    int64_t id = e->rows[i0 + j];
                    int dest = t->dynamic ? t->hs_owner[dt_embed_hash_id(id) % (uint64_t)t->n_hs]
                                          : dt__em_row_owner(t->rows, W, id);
                    DT__TRY(dt__em_add_seg(e, g, dest, f, b, j, 0, t->dim, i0 + j, 1));
                }
                break;
            case DT_SHARD_TABLE_ROW: /* the same, over the table's group */
                for (j = 0; j < n; j++)
                    DT__TRY(dt__em_add_seg(e, g, t->gfirst + dt__em_row_owner(t->rows, t->gsize, e->rows[i0 + j]), f, b,
                                            j, 0, t->dim, i0 + j, 1));
                break;
            case DT_SHARD_COLUMN:
                for (k = 0; k < W; k++) {
                    int64_t c0 = dt__em_col_start(t->dim, W, k), nc = dt__em_col_start(t->dim, W, k + 1) - c0;
                    if (nc == 0) continue;
                    if (seq) for (j = 0; j < n; j++) DT__TRY(dt__em_add_seg(e, g, k, f, b, j, c0, nc, i0 + j, 1));
                    else DT__TRY(dt__em_add_seg(e, g, k, f, b, -1, c0, nc, i0, n));
                }
                break;
            default: break; /* data-parallel: looked up locally */
            }
        }
    }
    return DT_OK;
}

/* ==== >>dynamic: dynamic tables: admission, LRU / LFU eviction, moves ========================= */

static void dt__em_mark(dt__em_tab *t, int64_t x);

/* The eviction policies, shared by the slots of a dynamic table's shard and the cache slots of a
   tiered table (>>tier). p names the per-slot arrays; y holds the list's ends, or the heap's
   place (p->prev + y->x0) and size (y->used). LRU: a doubly linked list, head = least recently
   used, a use moves a slot to the tail: O(1). */
typedef struct dt__em_pol {
    int64_t *prev, *next;
    const int64_t *count, *stamp;
    int64_t s;                   /* the arrays' stride: 1 (a dynamic table's), or a cache slot's 8 (dt__em_slot) */
} dt__em_pol;
#define DT__EM_PV(p, x) (p)->prev[(x) * (p)->s]
#define DT__EM_NX(p, x) (p)->next[(x) * (p)->s]
static dt__em_pol dt__em_dyn_pol(const dt__em_tab *t) {
    dt__em_pol p;
    p.prev = t->prev; p.next = t->next;
    p.count = (const int64_t *)t->slot_count.data; p.stamp = (const int64_t *)t->slot_stamp.data;
    p.s = 1;
    return p;
}
static void dt__em_lru_unlink(const dt__em_pol *p, dt__em_dyn *y, int64_t x) {
    int64_t a = DT__EM_PV(p, x), b = DT__EM_NX(p, x);
    if (a >= 0) DT__EM_NX(p, a) = b; else y->head = b;
    if (b >= 0) DT__EM_PV(p, b) = a; else y->tail = a;
}
static void dt__em_lru_append(const dt__em_pol *p, dt__em_dyn *y, int64_t x) {
    DT__EM_PV(p, x) = y->tail; DT__EM_NX(p, x) = -1;
    if (y->tail >= 0) DT__EM_NX(p, y->tail) = x; else y->head = x;
    y->tail = x;
}

/* LFU: the slots form a binary min-heap ordered by (count, stamp), so the root is the least
   frequently used slot and, among equals, the least recently used; a use raises a slot's key
   (sift down), an admission resets the root's or appends (sift up): O(log n). */
static int dt__em_lfu_less(const dt__em_pol *p, int64_t a, int64_t b) {
    int64_t ca = p->count[a * p->s], cb = p->count[b * p->s];
    return ca < cb || (ca == cb && p->stamp[a * p->s] < p->stamp[b * p->s]);
}
#define DT__EM_H(p, y, i) DT__EM_PV(p, (y)->x0 + (i)) /* the heap's place i */
static void dt__em_lfu_fix(const dt__em_pol *p, const dt__em_dyn *y, int64_t i) {
    int64_t n = y->used, x = DT__EM_H(p, y, i);
    while (i > 0 && dt__em_lfu_less(p, x, DT__EM_H(p, y, (i - 1) / 2))) { /* up */
        DT__EM_H(p, y, i) = DT__EM_H(p, y, (i - 1) / 2); DT__EM_NX(p, DT__EM_H(p, y, i)) = i;
        i = (i - 1) / 2;
    }
    for (;;) { /* down */
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && dt__em_lfu_less(p, DT__EM_H(p, y, c + 1), DT__EM_H(p, y, c))) c++;
        if (!dt__em_lfu_less(p, DT__EM_H(p, y, c), x)) break;
        DT__EM_H(p, y, i) = DT__EM_H(p, y, c); DT__EM_NX(p, DT__EM_H(p, y, i)) = i;
        i = c;
    }
    DT__EM_H(p, y, i) = x; DT__EM_NX(p, x) = i;
}
static void dt__em_lfu_push(const dt__em_pol *p, dt__em_dyn *y, int64_t x) {
    int64_t i = y->used++;
    DT__EM_H(p, y, i) = x; DT__EM_NX(p, x) = i;
    dt__em_lfu_fix(p, y, i);
}
static void dt__em_lfu_remove(const dt__em_pol *p, dt__em_dyn *y, int64_t x) {
    int64_t i = DT__EM_NX(p, x), last = DT__EM_H(p, y, --y->used);
    if (i == y->used) return;
    DT__EM_H(p, y, i) = last; DT__EM_NX(p, last) = i;
    dt__em_lfu_fix(p, y, i);
}

/* A new row for id in slot x: values from (seed, table, id), optimizer state zero. */
static dt_status dt__em_row_at(dt_embed *e, dt__em_tab *t, int64_t x, int mode, int64_t hint, char **w, float **s1,
                               float **s2, int64_t *k);
static void dt__em_tier_view(dt_tensor *v, void *data, dt_dtype dtype, int64_t rows, int64_t cols);

/* A new row for id in slot x: values from (seed, table, id), optimizer state zero (a tiered
   table's: in its cache slot, not read from the slow tier first). */
static dt_status dt__em_dyn_fill(dt_embed *e, dt__em_tab *t, int64_t x, int64_t id) {
    dt_tensor v;
    dt_init_desc in = t->init;
    char name[DT_NAME_MAX + 32], *w;
    float *s1, *s2;
    int64_t nc = t->c1 - t->c0, k;
    DT__TRY(dt__em_row_at(e, t, x, DT__EM_NONE, -1, &w, &s1, &s2, &k));
    dt__em_tier_view(&v, w, t->dtype, 1, nc);
    snprintf(name, sizeof name, "%s#%lld", t->name, (long long)id);
    in.name = name;
    memset(in.global_shape, 0, sizeof in.global_shape);
    memset(in.start, 0, sizeof in.start);
    DT__TRY(dt_tensor_init(e->ctx, &v, &in));
    if (s1) memset(s1, 0, (size_t)(t->kind == DT_EMBED_ROWWISE_ADAGRAD ? 1 : nc) * sizeof(float));
    if (s2) memset(s2, 0, (size_t)nc * sizeof(float));
    if (k >= 0) dt__em_tier_dirty(t, k);
    return DT_OK;
}

/* The slot of id in shard y (global row), or -1 when it is not admitted. Decisions depend only
   on the sequence of ids reaching the shard, which is the global (sample, feature, position)
   order at every world size. A row used in this forward is never evicted by it: a full shard
   whose least recent row is that fresh rejects the new id instead. */
static dt_status dt__em_dyn_slot(dt_embed *e, dt__em_tab *t, dt__em_dyn *y, int64_t id, int64_t *row) {
    int64_t *sid = (int64_t *)t->slot_id.data, *stamp = (int64_t *)t->slot_stamp.data, x, seen = 0;
    int lfu = t->evict == DT_EVICT_LFU;
    dt__em_pol pol = dt__em_dyn_pol(t);
    if (!dt__em_get(&y->map, id, &x)) {
        int64_t victim = lfu ? (y->used ? t->prev[y->x0] : -1) : y->head;
        (void)dt__em_get(&y->seen, id, &seen);
        seen++;
        if (seen < t->admit_after || (y->used == y->n && stamp[victim] > y->step_stamp)) {
            /* not seen often enough yet, or every slot is in use by this very batch */
            DT__TRY(dt__em_put(e->ctx, &y->seen, id, seen));
            e->stats.step_rejected++;
            *row = -1;
            return DT_OK;
        }
        if (y->used < y->n) {
            x = y->x0 + y->used++;
            if (lfu) { t->prev[x] = x; t->next[x] = y->used - 1; } /* appended: heap place = slot order */
        } else {
            x = victim;
            dt__em_del(&y->map, sid[x]);
            if (!lfu) dt__em_lru_unlink(&pol, y, x);
            e->stats.step_evicted++;
        }
        dt__em_del(&y->seen, id);
        DT__TRY(dt__em_put(e->ctx, &y->map, id, x));
        sid[x] = id;
        DT__TRY(dt__em_dyn_fill(e, t, x, id));
        dt__em_mark(t, x);
        if (lfu) ((int64_t *)t->slot_count.data)[x] = 0;
        else dt__em_lru_append(&pol, y, x);
        e->stats.step_admitted++;
    }
    stamp[x] = ++y->stamp;
    if (lfu) {
        ((int64_t *)t->slot_count.data)[x]++;
        dt__em_lfu_fix(&pol, y, t->next[x]);
    } else if (y->tail != x) { dt__em_lru_unlink(&pol, y, x); dt__em_lru_append(&pol, y, x); }
    *row = t->r0 + x;
    return DT_OK;
}

/* Owner side, before pooling: every id of a dynamic table in the received requests becomes its
   global slot (or -1), in the order the requests arrived (rank order = global sample order). */
static dt_status dt__em_dyn_translate(dt_embed *e, int64_t *rin, int64_t total) {
    int64_t p = 0, j;
    int i, h;
    /* step_stamp marks where the protected uses begin: this forward's, or with gradient
       accumulation those of every micro-batch since the last update (their union is one batch) */
    for (i = 0; !e->acc_open && i < e->n_tabs; i++)
        for (h = 0; e->tabs[i].dynamic && h < e->tabs[i].hs_count; h++) e->tabs[i].hs[h].step_stamp = e->tabs[i].hs[h].stamp;
    e->stats.step_admitted = e->stats.step_evicted = e->stats.step_rejected = 0;
    while (p < total) {
        int f = (int)rin[p];
        int64_t n = rin[p + 3];
        dt__em_tab *t = &e->tabs[e->feat_tab[f]];
        if (t->dynamic)
            for (j = 0; j < n; j++) {
                int64_t id = rin[p + DT__EM_HDR + j];
                int h2 = (int)(dt_embed_hash_id(id) % (uint64_t)t->n_hs) - t->hs_first;
                DT__TRY(dt__em_dyn_slot(e, t, &t->hs[h2], id, &rin[p + DT__EM_HDR + j]));
            }
        p += DT__EM_HDR + n;
    }
    e->stats.admitted += e->stats.step_admitted;
    e->stats.evicted += e->stats.step_evicted;
    e->stats.rejected += e->stats.step_rejected;
    return DT_OK;
}

static dt_status dt__em_dup_slot(dt_embed *e, const dt__em_tab *t, int64_t id, int64_t x1, int64_t x2) {
    return dt_ctx_set_error(e->ctx, DT_ERR_FORMAT, "dt_embed_checkpoint_load: table \"%s\": id %lld is in slots %lld "
                            "and %lld; expected each id in one slot (corrupt checkpoint)", t->name, (long long)id,
                            (long long)(t->r0 + x1), (long long)(t->r0 + x2));
}

/* After a checkpoint load: maps and LRU lists from the slots' ids and stamps; an id in two
   slots is DT_ERR_FORMAT (the lookups would find one and keep updating the other). */
static dt_status dt__em_dyn_rebuild(dt_embed *e, dt__em_tab *t) {
    int64_t *sid = (int64_t *)t->slot_id.data, *stamp = (int64_t *)t->slot_stamp.data, x, k, v;
    int h;
    dt__em_pol pol = dt__em_dyn_pol(t);
    for (h = 0; h < t->hs_count; h++) {
        dt__em_dyn *y = &t->hs[h];
        int64_t *order;
        dt__em_mfree(e->ctx, &y->map); dt__em_mfree(e->ctx, &y->seen);
        y->used = 0; y->stamp = 0; y->head = y->tail = -1;
        for (x = y->x0; x < y->x0 + y->n; x++) /* each id in the slots of its own shard: the saved layout */
            if (stamp[x] != 0 && (int64_t)(dt_embed_hash_id(sid[x]) % (uint64_t)t->n_hs) != t->hs_first + h)
                return dt_ctx_set_error(e->ctx, DT_ERR_UNSUPPORTED, "dt_embed_checkpoint_load: table \"%s\": slot %lld "
                                        "holds id %lld of id-hash shard %lld of %d, but the slot is shard %d's: the "
                                        "checkpoint was saved with another hash_shards; expected hash_shards = the "
                                        "saved table's (cuda tables do not move ids between shards yet)", t->name,
                                        (long long)(t->r0 + x), (long long)sid[x],
                                        (long long)(dt_embed_hash_id(sid[x]) % (uint64_t)t->n_hs), t->n_hs, t->hs_first + h);
        for (x = y->x0; x < y->x0 + y->n && stamp[x] > 0; x++) y->used++;
        for (x = y->x0 + y->used; x < y->x0 + y->n; x++)
            if (stamp[x] != 0)
                return dt_ctx_set_error(e->ctx, DT_ERR_FORMAT, "dt_embed_checkpoint_load: table \"%s\": slot %lld is filled "
                                        "after an empty one; the checkpoint's slot_stamp is corrupt", t->name,
                                        (long long)(t->r0 + x));
        if (!y->used) continue;
        if (t->evict == DT_EVICT_LFU) { /* the heap, one slot appended at a time */
            int64_t n = y->used;
            for (y->used = 1, x = y->x0; x < y->x0 + n; x++, y->used++) {
                if (dt__em_get(&y->map, sid[x], &v)) return dt__em_dup_slot(e, t, sid[x], v, x);
                DT__TRY(dt__em_put(e->ctx, &y->map, sid[x], x));
                t->prev[x] = x; t->next[x] = x - y->x0;
                dt__em_lfu_fix(&pol, y, x - y->x0);
                if (stamp[x] > y->stamp) y->stamp = stamp[x];
            }
            y->used = n;
            continue;
        }
        if (!(order = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)y->used))) return DT_ERR_OOM;
        for (k = 0; k < y->used; k++) order[k] = y->x0 + k;
        /* by stamp (insertion sort is fine for a restore; stamps are unique within a shard) */
        for (k = 1; k < y->used; k++) {
            int64_t v = order[k], m = k;
            while (m > 0 && stamp[order[m - 1]] > stamp[v]) { order[m] = order[m - 1]; m--; }
            order[m] = v;
        }
        for (k = 0; k < y->used; k++) {
            x = order[k];
            if (dt__em_get(&y->map, sid[x], &v)) {
                dt_release(e->ctx, order);
                return dt__em_dup_slot(e, t, sid[x], v, x);
            }
            DT__TRY(dt__em_put(e->ctx, &y->map, sid[x], x));
            dt__em_lru_append(&pol, y, x);
            if (stamp[x] > y->stamp) y->stamp = stamp[x];
        }
        dt_release(e->ctx, order);
    }
    return DT_OK;
}

/* A dynamic checkpoint loaded into another hash_shards: each rank read the saved slots of its
   global slot range, but an id's shard is now dt_embed_hash_id(id) mod the new count, so ids
   sit in other shards' slots. Every filled slot (id, last use, LFU count, row, optimizer state)
   goes to the rank owning its id's new shard (an all-to-all), which fills the shard's slots from
   its first, least recent first: by (saved stamp, id). Stamps of different saved shards come
   from different clocks, so the merged recency order is that convention, not a true history;
   each saved shard's own order is kept. A shard given more ids than it has slots cannot take
   them all: DT_ERR_UNSUPPORTED on every rank, naming it. Collective; cpu tables only. */
typedef struct dt__em_mv { int64_t stamp, id, k; } dt__em_mv;
static int dt__em_mv_cmp(const void *a, const void *b) {
    const dt__em_mv *x = (const dt__em_mv *)a, *y = (const dt__em_mv *)b;
    if (x->stamp != y->stamp) return x->stamp < y->stamp ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static dt_status dt__em_dyn_move(dt_embed *e, dt__em_tab *t) {
    const char *fn = "dt_embed_checkpoint_load";
    int W = e->size, r, h, lfu = t->evict == DT_EVICT_LFU;
    int64_t nc = t->c1 - t->c0, sf = t->kind == DT_EMBED_ROWWISE_ADAGRAD ? 1 : t->kind == DT_EMBED_ADAGRAD ? nc
               : t->kind == DT_EMBED_ADAM ? 2 * nc : 0, nf = nc + sf, nloc = t->r1 - t->r0, x, k, tr = 0, *cnt, *pos;
    int64_t *sid = (int64_t *)t->slot_id.data, *stamp = (int64_t *)t->slot_stamp.data;
    int64_t *scount = lfu ? (int64_t *)t->slot_count.data : NULL;
    size_t es = dt_dtype_size(t->dtype);
    dt__em_mv *mv = NULL;
    dt_status st = DT_OK;
    double flag[1];
    if (!(cnt = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)(4 * W + 1)))) return DT_ERR_OOM;
    memset(cnt, 0, sizeof(int64_t) * (size_t)(4 * W + 1));
    pos = cnt + 2 * W;
    for (x = 0; x < nloc; x++)
        if (stamp[x] != 0) cnt[t->hs_owner[dt_embed_hash_id(sid[x]) % (uint64_t)t->n_hs]]++;
    st = dt__em_need(e, &e->sbuf_i, DT_I64, 3 * nloc + 1);
    if (!st) st = dt__em_need(e, &e->sbuf_f, DT_F32, nf * nloc + 1);
    if (!st) st = dt__em_need(e, &e->dp_i, DT_I64, 2 * W);
    for (r = 1; r < W; r++) pos[r] = pos[r - 1] + cnt[r - 1];
    for (x = 0; !st && x < nloc; x++) { /* packed by destination, in slot order */
        int64_t q;
        float *pf;
        if (stamp[x] == 0) continue;
        q = pos[t->hs_owner[dt_embed_hash_id(sid[x]) % (uint64_t)t->n_hs]]++;
        ((int64_t *)e->sbuf_i.data)[3 * q] = sid[x];
        ((int64_t *)e->sbuf_i.data)[3 * q + 1] = stamp[x];
        ((int64_t *)e->sbuf_i.data)[3 * q + 2] = lfu ? scount[x] : 0;
        pf = (float *)e->sbuf_f.data + nf * q;
        st = dt_convert(e->ctx, pf, DT_F32, (const char *)t->w.data + (size_t)(x * nc) * es, t->dtype, nc);
        if (t->kind == DT_EMBED_ROWWISE_ADAGRAD) pf[nc] = ((float *)t->s1.data)[x];
        else if (sf) {
            memcpy(pf + nc, (float *)t->s1.data + x * nc, (size_t)nc * sizeof(float));
            if (t->s2.data) memcpy(pf + 2 * nc, (float *)t->s2.data + x * nc, (size_t)nc * sizeof(float));
        }
    }
    flag[0] = st ? 1 : 0;
    if (dt__em_sum_f64(e, flag, 1) && !st) st = DT_ERR_COMM;
    if (!st && flag[0] > 0) st = dt_ctx_set_error(e->ctx, DT_ERR_OOM, "%s: table \"%s\": moving its slots failed on "
                                                   "another rank", fn, t->name);
    if (st) { dt_release(e->ctx, cnt); return st; }
    /* counts (ids per destination), then the ints and the floats */
    for (r = 0; r < W; r++) ((int64_t *)e->dp_i.data)[r] = cnt[r];
    if (e->comm) {
        dt_tensor a, bb;
        int64_t sh[1];
        sh[0] = W;
        st = dt_tensor_view(e->ctx, &a, &e->dp_i, 0, 1, sh);
        if (!st) st = dt_tensor_view(e->ctx, &bb, &e->dp_i, W, 1, sh);
        if (!st) st = dt_comm_alltoall(e->comm, &bb, &a);
    } else ((int64_t *)e->dp_i.data)[1] = cnt[0];
    for (r = 0; !st && r < W; r++) {
        pos[r] = ((int64_t *)e->dp_i.data)[W + r]; /* ids from rank r */
        tr += pos[r];
    }
    if (!st) st = dt__em_need(e, &e->rbuf_i, DT_I64, 3 * tr + 1);
    if (!st) st = dt__em_need(e, &e->rbuf_f, DT_F32, nf * tr + 1);
    if (!st) {
        int64_t *si = cnt + W, *ri = cnt + 3 * W; /* element counts: ints, then floats */
        for (r = 0; r < W; r++) { si[r] = 3 * cnt[r]; ri[r] = 3 * pos[r]; }
        st = dt__em_a2av(e, &e->rbuf_i, &e->sbuf_i, si, ri);
        for (r = 0; !st && r < W; r++) { si[r] = nf * cnt[r]; ri[r] = nf * pos[r]; }
        if (!st) st = dt__em_a2av(e, &e->rbuf_f, &e->sbuf_f, si, ri);
    }
    /* place them: per local shard, least recent first, from the shard's first slot */
    if (!st && tr > 0 && !(mv = (dt__em_mv *)dt_alloc(e->ctx, sizeof(dt__em_mv) * (size_t)tr))) st = DT_ERR_OOM;
    for (x = 0; !st && x < nloc; x++) { stamp[x] = 0; sid[x] = 0; if (lfu) scount[x] = 0; }
    for (h = 0; !st && h < t->hs_count; h++) {
        dt__em_dyn *y = &t->hs[h];
        int64_t m = 0;
        for (k = 0; k < tr; k++) {
            const int64_t *pi = (const int64_t *)e->rbuf_i.data + 3 * k;
            if ((int64_t)(dt_embed_hash_id(pi[0]) % (uint64_t)t->n_hs) != t->hs_first + h) continue;
            mv[m].stamp = pi[1]; mv[m].id = pi[0]; mv[m].k = k; m++;
        }
        if (m > y->n) {
            st = dt_ctx_set_error(e->ctx, DT_ERR_UNSUPPORTED, "%s: table \"%s\": id-hash shard %d of %d gets %lld saved "
                                  "ids but has %lld slots (the checkpoint has another hash_shards); expected a layout "
                                  "where each shard's ids fit: more rows, or the saved hash_shards", fn, t->name,
                                  t->hs_first + h, t->n_hs, (long long)m, (long long)y->n);
            break;
        }
        if (m > 1) qsort(mv, (size_t)m, sizeof *mv, dt__em_mv_cmp);
        for (k = 0; !st && k < m; k++) {
            const float *pf = (const float *)e->rbuf_f.data + nf * mv[k].k;
            x = y->x0 + k;
            sid[x] = mv[k].id;
            stamp[x] = k + 1;
            if (lfu) scount[x] = ((const int64_t *)e->rbuf_i.data)[3 * mv[k].k + 2];
            st = dt_convert(e->ctx, (char *)t->w.data + (size_t)(x * nc) * es, t->dtype, pf, DT_F32, nc);
            if (t->kind == DT_EMBED_ROWWISE_ADAGRAD) ((float *)t->s1.data)[x] = pf[nc];
            else if (sf) {
                memcpy((float *)t->s1.data + x * nc, pf + nc, (size_t)nc * sizeof(float));
                if (t->s2.data) memcpy((float *)t->s2.data + x * nc, pf + 2 * nc, (size_t)nc * sizeof(float));
            }
            if (!st) dt__em_mark(t, x);
        }
    }
    dt_release(e->ctx, mv);
    dt_release(e->ctx, cnt);
    flag[0] = st ? 1 : 0;
    if (dt__em_sum_f64(e, flag, 1) && !st) st = DT_ERR_COMM;
    if (!st && flag[0] > 0) st = dt_ctx_set_error(e->ctx, DT_ERR_UNSUPPORTED, "%s: table \"%s\": its saved ids did not "
                                                   "fit the id-hash shards on another rank; see its message", fn, t->name);
    return st;
}

/* ==== >>tier: tiered tables: the slow tier, the cache of hot rows, prefetch ================== */

/* A tiered table's shard (its rows and optimizer state, t->w, t->s1, t->s2) lives in the slow
   tier: a file mapped into memory (MAP_SHARED, page-aligned regions; the kernel reads and writes
   its pages as needed, so it may be far larger than memory). The forward, the update and the
   dynamic admissions use the cache instead: cap slots of rows and state in host memory, a map
   local row -> slot, and an eviction policy (LRU or LFU, the dynamic tables' code) over the
   slots not pinned (LRU: its list holds every slot, and a use moves a slot to the tail, so the
   pinned ones, all used since the epoch began, are the tail: the head is evictable unless every
   slot is pinned; LFU: pinned slots leave its heap). A slot is pinned while the batch in flight
   uses it (pin >= e->epoch): from
   its lookup to the start of the next batch's lookups (dt__em_tier_advance: after the backward;
   with accumulation a micro-batch's rows are refetched by the update if they left), and from a
   dt_embed_prefetch's reservation through that batch; LFU's come back to its heap when their
   epoch ends. Forwards without a backward (evaluation) release their rows at
   the next forward, so the cache needs room for two batches at most. A row's bytes
   are only ever copied (slow -> cache at a fetch, cache -> slow when an evicted row changed), so
   a tiered table trains bit for bit as a resident one. The cold paths (checkpoints, export,
   dt_embed_local_shard) see t->w after dt__em_tier_settle has written every changed row back.

   The log (tier DISK): a changed row leaving the cache is not written to its home in the table
   region but appended to a log after it (row and state, one record), and loc[x] remembers which
   record holds local row x's latest copy; reads and in-place writes follow loc. Written home, a
   260-byte row would dirty a 4 KiB page: past the kernel's dirty thresholds (a table of several
   GiB) each eviction then costs a page written to disk, 16x the row (bench/embed --tiers 8 ran at
   0.28 of the resident rate so); appended, 15 rows share a page and the disk writes in order.
   The log has two halves of log_rows / 2 records (log_rows: by default as many as the shard
   has rows). When the active half is full it is folded on a thread of its own (every row whose
   latest copy is there copied home in row order, so each page of the region is written once
   per fold however many of its rows changed; loc through atomics) while write-backs fill the
   other half; a full half waits for the other's fold. dt__em_tier_settle folds everything in
   the caller's thread. So the file takes up to twice the table's bytes, loc 4 bytes a row of
   memory, and a fold about one pass over the table per log_rows / 2 write-backs, in the
   background (dt_embed_tier_stats: folds, rows folded, seconds the caller waited for them). An
   in-place write to a row in the folding half (an update that found no slot) waits for the
   fold first.

   Prefetch: the copies of the reserved rows, and the write-backs of the changed rows their slots
   held, go to one helper thread in order (a slot's write-back before its fetch; POSIX threads;
   without them, or DT_EMBED_NO_THREADS, the copies run in dt_embed_prefetch). The helper writes
   only the reserved slots and slow-tier rows no longer cached, and reads only those slots and
   slow-tier rows not cached; the caller's thread touches a reserved slot only once its copies
   are done (ready <= copies done, under the mutex), and no slow-tier row while write-backs are
   queued (e->pfq_wb: a fetch at use or a write-through first drains the queue), so the two never
   share a byte (tests/mpi_embed_tier.c runs clean under ThreadSanitizer, in the suite). Moving
   the write-backs off the caller's thread took bench/embed --tiers 0.25 from 0.63 to 0.72 of the
   resident rate. The lookups of most tables go there too (dt__em_pf_async, below >>tier: the
   rules of that overlap), which took --tiers 2 from 0.77 to 0.98.

   Tier HOST (cuda tables) keeps these books on the host as they are; only the bytes differ: the
   slow tier is pinned host memory, the cache is on the device, and a row's copies are queued
   (dt__em_tier_move) and run on the device in stream order by dt__em_cuda_tier_run (the
   forward, before its kernels; the cold paths, which then wait) or, for a prefetch, on a copy
   stream (dt__em_cuda_tier_prefetch). The update runs on the device, so the slots the forwards
   looked up are marked changed at the update (dt__em_tier_touched), not by it. */

typedef struct dt__em_slot {     /* a cache slot's books: 64 bytes, one line */
    int64_t row;                 /* its local row, -1 when empty */
    int64_t pin;                 /* -1 just filled (in no list); 0 <= pin < epoch: in the policy; >= epoch pinned */
    int64_t prev, next;          /* LRU: the list; LFU: prev of slot i is the heap's place i, next the slot's place */
    int64_t ready;               /* the prefetch copy after which its row is there (0: it is) */
    int64_t stamp, count;        /* LFU: last use, uses since fetched */
    int64_t dirty;               /* changed since it was fetched (written back at eviction) */
} dt__em_slot;

typedef struct dt__em_tier {
    int fd;                      /* the slow tier's file: unlinked at once, gone with the process */
    void *map;
    size_t map_bytes;
    /* tier DISK's log of written-back rows (see "The log" above): record r (row, state) at
       log + r rec; loc[x] is local row x's record, -1 when the table region holds it */
    char *log;
    int32_t *loc;
    int64_t rec, lcap, ln;       /* a record's bytes; records a half of the log holds; records in the active half */
    int64_t lact, fh;            /* the active half (0, 1); the half folding in the background (-1: none) */
    int64_t fold_rows;           /* rows the background fold copied home (read after its join) */
    int unfolded;                /* records written since the last full fold */
#ifdef DT__EM_THREADS
    pthread_t fth;
#endif
    int64_t cap, filled;         /* slots; slots filled so far (free slots are taken before any eviction) */
    int lfu;
    int pfa;                     /* a prefetch's lookups may run on the helper (static, LRU, not data-parallel) */
    int64_t rb, sn1, sn2;        /* a row's bytes; floats of its state in s1 (nc, 1 or 0) and in s2 (nc or 0) */
    char *cw;                    /* slot k: row at cw + k rb, state at cs1 + k sn1 and cs2 + k sn2 */
    float *cs1, *cs2;
    dt__em_map where;            /* local row -> slot */
    dt__em_slot *sl;             /* per slot, one cache line (a use reads one line, not one per array) */
    int64_t clock;
    int64_t *pins[2], n_pins[2], pins_cap[2]; /* slots pinned until this epoch's end [0], the next's [1] */
    dt__em_dyn lst;              /* the policy's list ends, or its heap's size (x0 0) */
    dt_embed_tier_stats st;
    /* tier HOST (cuda tables): the slow tier is pinned host memory (map), mapped for kernels at
       hw, hs1, hs2; cw, cs1, cs2 are device arrays. The rows to move, as (slot, local row) pairs:
       mv[0] write-backs (slot -> slow tier), mv[1] fetches (slow tier -> slot), queued by
       dt__em_tier_slot and run by dt__em_cuda_tier_run in stream order, write-backs first. */
    int dev;
    char *hw;
    float *hs1, *hs2;
    int64_t *mv[2], n_mv[2], mv_cap[2];
    unsigned char *used;         /* per slot: looked up by a forward since the last update ... */
    int64_t *ul, n_ul, ul_cap;   /* ... those slots (the update writes them on the device, unseen) */
} dt__em_tier;

/* A tiered table's slot: the lines dt__em_tier_use reads of it (row_of, pin, stamp, ready). */
DT__EM_PF_FN void dt__em_pf_slot(const dt__em_tier *c, int64_t k) {
    if (k < 0 || k >= c->cap) return;
    DT__EM_PF_W(&c->sl[k]);
}

typedef struct dt__em_cp {       /* one row's copies: its bytes, its state in s1 and s2 (n 0: none) */
    char *dst[3];
    const char *src[3];
    size_t n[3];
} dt__em_cp;
static void dt__em_cp_run(const dt__em_cp *c) {
    int k;
    for (k = 0; k < 3; k++)
        if (c->n[k]) memcpy(c->dst[k], c->src[k], c->n[k]);
}
typedef struct dt__em_pfq {      /* the prefetch's copies, numbered from the first ever (base + i) */
    dt__em_cp *q;
    int64_t n, cap, base;        /* the current list: copies base .. base + n - 1 */
    int64_t done;                /* copies finished (under mu when threaded) */
    int threaded;
    int inl;                     /* the helper runs a prefetch's lookups (dt__em_pf_job): the copies run
                                    there, in queue order, when published or waited for */
#ifdef DT__EM_THREADS
    int stop;
    int job;                     /* the lookups posted to the helper: 1 posted, 2 running, 0 done (under mu) */
    dt_status job_st;            /* their status */
    struct dt_embed *e;
    int64_t pub, taken;          /* copies published to the helper, taken by it (under mu) */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
#endif
} dt__em_pfq;

static dt__em_pol dt__em_tier_pol(const dt__em_tier *c) {
    dt__em_pol p;
    p.prev = &c->sl[0].prev; p.next = &c->sl[0].next; p.count = &c->sl[0].count; p.stamp = &c->sl[0].stamp;
    p.s = (int64_t)(sizeof(dt__em_slot) / sizeof(int64_t));
    return p;
}
static void dt__em_pol_out(dt__em_tier *c, int64_t k) { /* slot k leaves the policy */
    dt__em_pol p = dt__em_tier_pol(c);
    if (c->lfu) dt__em_lfu_remove(&p, &c->lst, k);
    else dt__em_lru_unlink(&p, &c->lst, k);
}
static void dt__em_pol_in(dt__em_tier *c, int64_t k) { /* slot k (re)joins it as the most recent */
    dt__em_pol p = dt__em_tier_pol(c);
    if (c->lfu) dt__em_lfu_push(&p, &c->lst, k);
    else dt__em_lru_append(&p, &c->lst, k);
}

#ifdef DT__EM_THREADS
static dt_status dt__em_pf_job(dt_embed *e);
static void *dt__em_pfq_main(void *arg) {
    dt__em_pfq *q = (dt__em_pfq *)arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        int64_t a, b, i;
        while (!q->stop && q->taken == q->pub && q->job != 1) pthread_cond_wait(&q->cv, &q->mu);
        if (q->stop) break;
        if (q->job == 1) { /* a prefetch's lookups (dt__em_pf_post), then their copies */
            dt_status st;
            q->job = 2;
            pthread_mutex_unlock(&q->mu);
            st = dt__em_pf_job(q->e);
            pthread_mutex_lock(&q->mu);
            q->job_st = st;
            q->job = 0; /* the forward may start: it waits per row for the copies, run next */
            q->taken = q->done;
            q->pub = q->base + q->n;
            pthread_cond_broadcast(&q->cv);
            continue;
        }
        a = q->taken;
        b = q->pub - a > 64 ? a + 64 : q->pub; /* a few rows at a time: the caller waits per row */
        q->taken = b;
        pthread_mutex_unlock(&q->mu);
        for (i = a; i < b; i++) {
            dt__em_cp_run(&q->q[i - q->base]);
        }
        pthread_mutex_lock(&q->mu);
        q->done = b;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}
#endif

static dt_status dt__em_pfq_get(dt_embed *e, dt__em_pfq **out) {
    dt__em_pfq *q = e->pfq;
    if (!q) {
        if (!(q = (dt__em_pfq *)dt_alloc_zeroed(e->ctx, sizeof *q))) return DT_ERR_OOM;
#ifdef DT__EM_THREADS
        q->e = e;
        if (pthread_mutex_init(&q->mu, NULL) == 0) {
            if (pthread_cond_init(&q->cv, NULL) != 0) pthread_mutex_destroy(&q->mu);
            else if (pthread_create(&q->th, NULL, dt__em_pfq_main, q) != 0) {
                pthread_cond_destroy(&q->cv);
                pthread_mutex_destroy(&q->mu);
            } else q->threaded = 1;
        }
#endif
        e->pfq = q;
    }
    *out = q;
    return DT_OK;
}

/* Whether copies queued may still be running (else no slot's ready needs a look). */
static int dt__em_pfq_open(const dt_embed *e) { return e->pfq && e->pfq_seen < e->pfq->base + e->pfq->n; }

static void dt__em_pfq_publish(dt__em_pfq *q);

/* Waits until the copies numbered below `upto` are done (e->pfq_seen: done, as last seen). */
static void dt__em_pfq_wait(dt_embed *e, int64_t upto) {
    dt__em_pfq *q = e->pfq;
    if (upto <= e->pfq_seen || !q) return;
    if (q->inl) dt__em_pfq_publish(q); /* on the helper, in a prefetch's lookups: the copies run here */
#ifdef DT__EM_THREADS
    else if (q->threaded) {
        pthread_mutex_lock(&q->mu);
        while (q->done < upto) pthread_cond_wait(&q->cv, &q->mu);
        e->pfq_seen = q->done;
        pthread_mutex_unlock(&q->mu);
        return;
    }
#endif
    e->pfq_seen = q->done;
}

/* Every copy queued so far is done (published first: a fold may drain in the middle of a
   prefetch): the helper is idle, the list may be reused. */
static void dt__em_pfq_drain(dt_embed *e) {
    dt__em_pfq *q = e->pfq;
    if (!q) return;
    if (q->n > 0) dt__em_pfq_publish(q);
    dt__em_pfq_wait(e, q->base + q->n);
    q->base += q->n;
    q->n = 0;
    e->pfq_wb = 0;
}

static void dt__em_pfq_publish(dt__em_pfq *q) {
#ifdef DT__EM_THREADS
    if (q->threaded && !q->inl) {
        pthread_mutex_lock(&q->mu);
        q->pub = q->base + q->n;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        return;
    }
#endif
    {
        int64_t i;
        for (i = q->done - q->base; i < q->n; i++) dt__em_cp_run(&q->q[i]); /* those not yet run */
        q->done = q->base + q->n;
    }
}

static void dt__em_pfq_free(dt_embed *e) {
    dt__em_pfq *q = e->pfq;
    if (!q) return;
#ifdef DT__EM_THREADS
    if (q->threaded) {
        pthread_mutex_lock(&q->mu);
        q->stop = 1;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->th, NULL);
        pthread_cond_destroy(&q->cv);
        pthread_mutex_destroy(&q->mu);
    }
#endif
    dt_release(e->ctx, q->q);
    dt_release(e->ctx, q);
    e->pfq = NULL;
}

#if defined(DT__EM_THREADS) && (defined(__GNUC__) || defined(__clang__))
#define DT__EM_BGFOLD 1
#define DT__EM_LOC_GET(c, x) __atomic_load_n(&(c)->loc[x], __ATOMIC_ACQUIRE)
#define DT__EM_LOC_SET(c, x, v) __atomic_store_n(&(c)->loc[x], (int32_t)(v), __ATOMIC_RELEASE)
#else
#define DT__EM_LOC_GET(c, x) ((c)->loc[x])
#define DT__EM_LOC_SET(c, x, v) ((c)->loc[x] = (int32_t)(v))
#endif

/* Slot k's row and state <-> the slow tier's local row x. */
static void dt__em_tier_ptrs(const dt__em_tab *t, int64_t x, char **w, float **s1, float **s2) {
    const dt__em_tier *c = t->tier;
    int32_t l = c->loc ? DT__EM_LOC_GET(c, x) : -1;
    if (l >= 0) { /* its latest copy is a record of the log */
        char *r = c->log + (size_t)l * (size_t)c->rec;
        int64_t o = (c->rb + 3) / 4 * 4;
        *w = r;
        *s1 = c->sn1 ? (float *)(r + o) : NULL;
        *s2 = c->sn2 ? (float *)(r + o) + c->sn1 : NULL;
        return;
    }
    *w = (char *)t->w.data + (size_t)(x * c->rb);
    *s1 = c->sn1 ? (float *)t->s1.data + x * c->sn1 : NULL;
    *s2 = c->sn2 ? (float *)t->s2.data + x * c->sn2 : NULL;
}

/* The log's two halves (see "The log" above): write-backs fill the active one (lact) while the
   other may be folding on a thread of its own (fh: the half folding, -1 none). loc[x] is read
   and written by both threads, so through atomics where they exist (else folds run in the
   caller's thread and plain accesses do). */

/* Copies home every row whose latest copy is a record in [lo, hi), in row order (so the kernel
   writes the table's pages back in order, each once however many of its rows changed), and
   points the row home (unless a newer record took it meanwhile). Returns the rows copied. */
static void dt__em_fold_sync(const dt__em_tab *t, int64_t x0, int64_t x1) {
    const dt__em_tier *c = t->tier;
    const uintptr_t pg = 4096;
    int k;
    for (k = 0; k < 3; k++) { /* the rows' pages of w, s1, s2: written out now (each region page-aligned) */
        int64_t b = k == 0 ? c->rb : 4 * (k == 1 ? c->sn1 : c->sn2);
        char *base = k == 0 ? (char *)t->w.data : k == 1 ? (char *)t->s1.data : (char *)t->s2.data;
        uintptr_t a, z;
        if (!base || b == 0) continue;
        a = (uintptr_t)(base + x0 * b) & ~(pg - 1);
        z = (uintptr_t)(base + x1 * b);
        (void)msync((void *)a, (size_t)(z - a), MS_SYNC);
    }
}

/* sync 1 (a fold in the background): every 64 MiB of the table's rows passed, their dirtied
   pages are written out and waited for (msync), by the folding thread: the dirty pages stay
   under the kernel's thresholds, so the training thread, which also dirties pages (the log's),
   is not throttled while a fold writes the table (a fold of an 8 GiB table that did not: the
   steps during it ran 1.7x slower). */
static int64_t dt__em_fold_range(const dt__em_tab *t, int64_t lo, int64_t hi, int sync) {
    const dt__em_tier *c = t->tier;
    int64_t x, nr = t->r1 - t->r0, o = (c->rb + 3) / 4 * 4, n = 0, xs = 0, chunk = ((int64_t)64 << 20) / c->rb + 1;
    for (x = 0; x < nr; x++) {
        int32_t r = DT__EM_LOC_GET(c, x);
        const char *q;
        if (sync && x - xs >= chunk) { dt__em_fold_sync(t, xs, x); xs = x; }
        if (r < lo || r >= hi) continue;
        q = c->log + (size_t)r * (size_t)c->rec;
        memcpy((char *)t->w.data + (size_t)(x * c->rb), q, (size_t)c->rb);
        if (c->sn1) memcpy((float *)t->s1.data + x * c->sn1, q + o, sizeof(float) * (size_t)c->sn1);
        if (c->sn2) memcpy((float *)t->s2.data + x * c->sn2, q + o + 4 * c->sn1, sizeof(float) * (size_t)c->sn2);
#ifdef DT__EM_BGFOLD
        (void)__atomic_compare_exchange_n(&t->tier->loc[x], &r, (int32_t)-1, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
#else
        t->tier->loc[x] = -1;
#endif
        n++;
    }
    return n;
}

#ifdef DT__EM_BGFOLD
static void *dt__em_fold_main(void *arg) {
    const dt__em_tab *t = (const dt__em_tab *)arg;
    dt__em_tier *c = t->tier;
#ifdef __linux__
    (void)setpriority(PRIO_PROCESS, 0, 10); /* this thread's (NPTL): training and the prefetch first */
#endif
    c->fold_rows = dt__em_fold_range(t, c->fh * c->lcap, (c->fh + 1) * c->lcap, 1);
    return NULL;
}
#endif

/* Waits for the fold running in the background, if any (the caller's wait is counted). */
static void dt__em_tier_fold_join(dt__em_tier *c) {
#ifdef DT__EM_BGFOLD
    if (c->fh >= 0) {
        double t0 = dt__em_now();
        pthread_join(c->fth, NULL);
        c->st.seconds_fold += dt__em_now() - t0;
        c->st.folded += c->fold_rows;
        c->fh = -1;
    }
#else
    (void)c;
#endif
}

/* The active half is full: the other's fold (if still running) is waited for, the full half
   starts folding on its own thread (or here, without threads), and write-backs go to the other
   half. The prefetch's copies are drained first: none may still read a record of the half that
   is about to be overwritten. */
static void dt__em_tier_fold_start(dt_embed *e, const dt__em_tab *t) {
    dt__em_tier *c = t->tier;
    double t0 = dt__em_now();
    dt__em_pfq_drain(e);
    dt__em_tier_fold_join(c);
    c->st.folds++;
    c->fh = c->lact;
#ifdef DT__EM_BGFOLD
    if (pthread_create(&c->fth, NULL, dt__em_fold_main, (void *)t) != 0)
#endif
    {
        c->st.folded += dt__em_fold_range(t, c->fh * c->lcap, (c->fh + 1) * c->lcap, 0);
        c->fh = -1;
    }
    c->lact ^= 1;
    c->ln = 0;
    c->st.seconds_fold += dt__em_now() - t0;
}

/* Folds the whole log (both halves) in the caller's thread: every row home, the log empty (the
   cold paths read the table region). */
static void dt__em_tier_fold(dt_embed *e, const dt__em_tab *t) {
    dt__em_tier *c = t->tier;
    double t0;
    if (!c->loc) return;
    dt__em_tier_fold_join(c);
    if (c->ln == 0 && !c->unfolded) return;
    t0 = dt__em_now();
    dt__em_pfq_drain(e);
    c->st.folded += dt__em_fold_range(t, 0, 2 * c->lcap, 0);
    c->ln = 0;
    c->unfolded = 0;
    c->st.folds++;
    c->st.seconds_fold += dt__em_now() - t0;
}

/* Where a write-back of local row x goes: the next record of the log's active half (the halves
   switched first when it is full), which becomes x's latest copy; tier HOST: x's home. */
static void dt__em_tier_wb_ptrs(dt_embed *e, const dt__em_tab *t, int64_t x, char **w, float **s1, float **s2) {
    dt__em_tier *c = t->tier;
    if (c->loc) {
        if (c->ln == c->lcap) dt__em_tier_fold_start(e, t);
        DT__EM_LOC_SET(c, x, c->lact * c->lcap + c->ln++);
        c->unfolded = 1;
    }
    dt__em_tier_ptrs(t, x, w, s1, s2);
}

static void dt__em_tier_copy(dt_embed *e, dt__em_tier *c, const dt__em_tab *t, int64_t k, int64_t x, int out) {
    char *w;
    float *s1, *s2;
    if (out) dt__em_tier_wb_ptrs(e, t, x, &w, &s1, &s2);
    else dt__em_tier_ptrs(t, x, &w, &s1, &s2);
    if (out) {
        memcpy(w, c->cw + k * c->rb, (size_t)c->rb);
        if (s1) memcpy(s1, c->cs1 + k * c->sn1, sizeof(float) * (size_t)c->sn1);
        if (s2) memcpy(s2, c->cs2 + k * c->sn2, sizeof(float) * (size_t)c->sn2);
    } else {
        memcpy(c->cw + k * c->rb, w, (size_t)c->rb);
        if (s1) memcpy(c->cs1 + k * c->sn1, s1, sizeof(float) * (size_t)c->sn1);
        if (s2) memcpy(c->cs2 + k * c->sn2, s2, sizeof(float) * (size_t)c->sn2);
    }
}
static void dt__em_tier_dirty(dt__em_tab *t, int64_t k) { t->tier->sl[k].dirty = 1; }
static double dt__em_tier_row_bytes(const dt__em_tier *c) { return (double)c->rb + 4.0 * (double)(c->sn1 + c->sn2); }

static dt_status dt__em_tier_queue(dt_embed *e, const dt__em_cp *c) {
    dt__em_pfq *q = e->pfq;
    DT__TRY(dt_grow(e->ctx, (void **)&q->q, &q->cap, q->n + 1, sizeof(dt__em_cp), "dt_embed prefetch copies"));
    q->q[q->n++] = *c;
    return DT_OK;
}
/* Slot k <-> the slow tier's local row x, by the helper (out 1: a write-back, queued before the
   fetch that reuses the slot, so it runs first). While write-backs are queued (e->pfq_wb) the
   caller's thread reads or writes no slow-tier row before the queue is drained. */
static dt_status dt__em_tier_queue_row(dt_embed *e, const dt__em_tab *t, int64_t k, int64_t x, int out) {
    dt__em_tier *c = t->tier;
    char *w, *cw = c->cw + k * c->rb, *c1 = (char *)(c->cs1 + k * c->sn1), *c2 = (char *)(c->cs2 + k * c->sn2);
    float *s1, *s2;
    dt__em_cp r;
    if (out) dt__em_tier_wb_ptrs(e, t, x, &w, &s1, &s2);
    else dt__em_tier_ptrs(t, x, &w, &s1, &s2);
    memset(&r, 0, sizeof r);
    r.dst[0] = out ? w : cw; r.src[0] = out ? cw : w; r.n[0] = (size_t)c->rb;
    if (s1) { r.dst[1] = out ? (char *)s1 : c1; r.src[1] = out ? c1 : (const char *)s1; r.n[1] = sizeof(float) * (size_t)c->sn1; }
    if (s2) { r.dst[2] = out ? (char *)s2 : c2; r.src[2] = out ? c2 : (const char *)s2; r.n[2] = sizeof(float) * (size_t)c->sn2; }
    DT__TRY(dt__em_tier_queue(e, &r));
    if (out) e->pfq_wb = 1;
    return DT_OK;
}

/* tier HOST: a row to move between slot k and the slow tier's local row x (in = 0: a write-back,
   slot -> slow tier; 1: a fetch), run later on the device (dt__em_cuda_tier_run). */
static dt_status dt__em_tier_move(dt_embed *e, dt__em_tier *c, int in, int64_t k, int64_t x) {
    DT__TRY(dt_grow(e->ctx, (void **)&c->mv[in], &c->mv_cap[in], 2 * (c->n_mv[in] + 1), sizeof(int64_t),
                    "dt_embed cache copies"));
    c->mv[in][2 * c->n_mv[in]] = k;
    c->mv[in][2 * c->n_mv[in] + 1] = x;
    c->n_mv[in]++;
    return DT_OK;
}

/* Pins slot k until the end of epoch `until` (e->epoch or e->epoch + 1). pin[k]: -1 a slot just
   filled (in no list), 0 <= pin < epoch in the policy, >= epoch pinned. */
static dt_status dt__em_tier_pin(dt_embed *e, dt__em_tier *c, int64_t k, int64_t until) {
    int which = until > e->epoch;
    if (c->sl[k].pin >= until) return DT_OK;
    if (!c->lfu) { /* LRU keeps every slot in its list, the pinned ones at the tail (see above) */
        dt__em_pol p = dt__em_tier_pol(c);
        if (c->sl[k].pin >= 0) dt__em_lru_unlink(&p, &c->lst, k);
        dt__em_lru_append(&p, &c->lst, k);
        c->sl[k].pin = until;
        return DT_OK;
    }
    if (c->sl[k].pin >= 0 && c->sl[k].pin < e->epoch) dt__em_pol_out(c, k);
    c->sl[k].pin = until;
    DT__TRY(dt_grow(e->ctx, (void **)&c->pins[which], &c->pins_cap[which], c->n_pins[which] + 1, sizeof(int64_t),
                    "dt_embed pinned rows"));
    c->pins[which][c->n_pins[which]++] = k;
    return DT_OK;
}

/* A batch's lookups start (its begin, or its end when begun ahead): the epoch of the batch before
   ends, its slots rejoin the policy in the order they were pinned, and those a prefetch reserved
   for this batch become the new epoch's. */
static void dt__em_tier_advance(dt_embed *e) {
    int i;
    for (i = 0; i < e->n_tabs; i++) {
        dt__em_tier *c = e->tabs[i].tier;
        int64_t j, *tp, tc;
        if (!c || !c->lfu) continue; /* LRU: its pinned slots are unpinned by the epoch alone */
        for (j = 0; j < c->n_pins[0]; j++) {
            int64_t k = c->pins[0][j];
            if (c->sl[k].pin == e->epoch) dt__em_pol_in(c, k); /* pin < the next epoch: in the policy */
        }
        tp = c->pins[0]; c->pins[0] = c->pins[1]; c->pins[1] = tp;
        tc = c->pins_cap[0]; c->pins_cap[0] = c->pins_cap[1]; c->pins_cap[1] = tc;
        c->n_pins[0] = c->n_pins[1]; c->n_pins[1] = 0;
    }
    e->epoch++;
}

/* tier HOST, at an update: the slots looked up by the forwards since the last one are the rows
   the update wrote, on the device (the host never sees which): changed, written back when they
   leave the cache. (Marked here, not at the lookup: a flush between a forward and its backward
   must not clear a mark the update still needs.) */
static void dt__em_tier_touched(dt_embed *e) {
    int i;
    int64_t j;
    for (i = 0; i < e->n_tabs; i++) {
        dt__em_tier *c = e->tabs[i].tier;
        if (!c || !c->dev) continue;
        for (j = 0; j < c->n_ul; j++) { c->sl[c->ul[j]].dirty = 1; c->used[c->ul[j]] = 0; }
        c->n_ul = 0;
    }
}

/* LRU evicts the list's head, then the next: while s goes, the lines the next two evictions
   will touch are fetched ahead (the one after next's slot; the next's map line and log index,
   its slot being here since the last eviction). Only hints: a use may move them meanwhile. */
static void dt__em_pf_victims(const dt__em_tier *c, int64_t s) {
    int64_t n1 = c->sl[s].next, n2, x;
    if (n1 < 0 || n1 >= c->cap) return;
    n2 = c->sl[n1].next;
    if (n2 >= 0 && n2 < c->cap) DT__EM_PF_W(&c->sl[n2]);
    x = c->sl[n1].row;
    if (x < 0) return;
    dt__em_pf_map(&c->where, x);
    if (c->loc) DT__EM_PF_W(&c->loc[x]);
}

/* The cache slot of local row x of tiered table t, pinned until the end of epoch `until`: a hit,
   or a slot made for it (a free one, else the policy's victim, written back first when it
   changed) and filled by `mode` (DT__EM_NOW, _LATER, _NONE). count: a first lookup of the id
   (hits and misses). *k = -1 when every slot is pinned: nothing changes. */
static dt_status dt__em_tier_slot(dt_embed *e, dt__em_tab *t, int64_t x, int64_t until, int mode, int count,
                                  int64_t *k) {
    dt__em_tier *c = t->tier;
    int64_t s;
    if (dt__em_get(&c->where, x, &s)) {
        if (count) c->st.hits++;
        if (mode != DT__EM_LATER && dt__em_pfq_open(e) && c->sl[s].ready > e->pfq_seen) { /* still on its way */
            double t0 = dt__em_now();
            dt__em_pfq_wait(e, c->sl[s].ready);
            c->st.seconds_wait += dt__em_now() - t0;
        }
    } else {
        if (c->filled < c->cap) s = c->filled++;
        else {
            s = c->lfu ? (c->lst.used ? c->sl[0].prev : -1) : c->lst.head;
            if (s >= 0 && !c->lfu && c->sl[s].pin >= e->epoch) s = -1; /* the least recent is pinned: all are */
            if (s < 0) { *k = -1; return DT_OK; }
            if (!c->lfu) dt__em_pf_victims(c, s);
            dt__em_pol_out(c, s);
            dt__em_pfq_wait(e, c->sl[s].ready); /* a prefetched row never used (its forward failed) */
            if (c->sl[s].dirty) {
                if (c->dev) DT__TRY(dt__em_tier_move(e, c, 0, s, c->sl[s].row));
                else if (mode == DT__EM_LATER) DT__TRY(dt__em_tier_queue_row(e, t, s, c->sl[s].row, 1));
                else dt__em_tier_copy(e, c, t, s, c->sl[s].row, 1);
                c->st.written_back++;
                c->st.bytes_out += dt__em_tier_row_bytes(c);
            }
            dt__em_del(&c->where, c->sl[s].row);
            c->st.evicted++;
        }
        c->sl[s].pin = -1;
        c->sl[s].row = x;
        c->sl[s].dirty = 0;
        c->sl[s].ready = 0;
        c->sl[s].count = 0;
        DT__TRY(dt__em_put(e->ctx, &c->where, x, s));
        if (count) c->st.misses++;
        if (mode != DT__EM_NONE) {
            c->st.bytes_in += dt__em_tier_row_bytes(c);
            if (c->dev) { /* a copy on the device, in stream order before the kernels that read the slot */
                DT__TRY(dt__em_tier_move(e, c, 1, s, x));
                if (mode == DT__EM_NOW) c->st.fetched++;
                else c->st.prefetched++;
            } else if (mode == DT__EM_NOW) {
                if (e->pfq_wb) dt__em_pfq_drain(e); /* x may be a row the helper is still writing back */
                dt__em_tier_copy(e, c, t, s, x, 0);
                c->st.fetched++;
            } else { /* the helper's copies; the slot is ready once they are done */
                DT__TRY(dt__em_tier_queue_row(e, t, s, x, 0));
                c->sl[s].ready = e->pfq->base + e->pfq->n;
                c->st.prefetched++;
            }
        }
    }
    if (c->lfu) { c->sl[s].stamp = ++c->clock; c->sl[s].count++; }
    DT__TRY(dt__em_tier_pin(e, c, s, until));
    *k = s;
    return DT_OK;
}

/* A forward's lookup that found no slot: remembered, and reported on every rank at the end of the
   forward (the owner still serves zeros and joins the return all-to-all). */
static void dt__em_tier_full(dt_embed *e, const dt__em_tab *t) {
    if (e->tier_st) return;
    e->tier_st = DT_ERR_RANGE;
    snprintf(e->tier_msg, sizeof e->tier_msg, "dt_embed_forward: table \"%s\": its cache_rows = %lld on rank %d is "
             "smaller than the distinct rows this step needs there (every slot holds a row of the batch in flight%s); "
             "expected cache_rows >= one step's distinct rows on each rank", t->name, (long long)t->tier->cap, e->rank,
             e->acc_open ? " or of the micro-batches accumulated since the last update" : "");
}

/* dt__em_tier_slot, first trying `hint`: the slot x had when it was last looked up (the
   prefetch, the forward), still x's if row_of says so: a hit without a map lookup. */
static dt_status dt__em_tier_use(dt_embed *e, dt__em_tab *t, int64_t x, int64_t hint, int64_t until, int mode, int count,
                                 int64_t *k) {
    dt__em_tier *c = t->tier;
    if (hint < 0 || hint >= c->filled || c->sl[hint].row != x) return dt__em_tier_slot(e, t, x, until, mode, count, k);
    if (count) c->st.hits++;
    if (mode != DT__EM_LATER && dt__em_pfq_open(e) && c->sl[hint].ready > e->pfq_seen) {
        double t0 = dt__em_now();
        dt__em_pfq_wait(e, c->sl[hint].ready);
        c->st.seconds_wait += dt__em_now() - t0;
    }
    if (c->lfu) { c->sl[hint].stamp = ++c->clock; c->sl[hint].count++; } /* (LRU's order is its list's) */
    DT__TRY(dt__em_tier_pin(e, c, hint, until));
    *k = hint;
    return DT_OK;
}

/* Where local row x of t is read and written by an update or an admission: its cache slot
   (pinned for this epoch; *k >= 0; hint: as dt__em_tier_use), else, when every slot is pinned
   (*k = -1), the slow tier itself. Resident tables: the shard. */
static dt_status dt__em_row_at(dt_embed *e, dt__em_tab *t, int64_t x, int mode, int64_t hint, char **w, float **s1,
                               float **s2, int64_t *k) {
    dt__em_tier *c = t->tier;
    int64_t nc = t->c1 - t->c0, sn1 = t->kind == DT_EMBED_ROWWISE_ADAGRAD ? 1 : nc;
    *k = -1;
    if (c && e->pfj) { /* a prefetch's lookups run on the helper: a row of the batch in flight is in the
                          slot its forward found (pinned); anything else waits for them (dt__em_pf_async) */
        if (hint >= 0 && hint < c->cap && c->sl[hint].row == x) { /* (as dt__em_tier_use: the pin holds) */
            if (c->lfu) { c->sl[hint].stamp = ++c->clock; c->sl[hint].count++; }
            *k = hint;
            *w = c->cw + hint * c->rb;
            *s1 = c->sn1 ? c->cs1 + hint * c->sn1 : NULL;
            *s2 = c->sn2 ? c->cs2 + hint * c->sn2 : NULL;
            return DT_OK;
        }
        dt__em_pf_join(e, 0);
    }
    if (c) {
        DT__TRY(dt__em_tier_use(e, t, x, hint, e->epoch, mode, 0, k));
        if (*k >= 0) {
            *w = c->cw + *k * c->rb;
            *s1 = c->sn1 ? c->cs1 + *k * c->sn1 : NULL;
            *s2 = c->sn2 ? c->cs2 + *k * c->sn2 : NULL;
        } else {
            if (e->pfq_wb) dt__em_pfq_drain(e); /* the slow tier itself: no write-back may be on its way */
            if (c->loc && c->fh >= 0) { /* written in place: not in a record the background fold copies */
                int32_t l = DT__EM_LOC_GET(c, x);
                if (l >= c->fh * c->lcap && l < (c->fh + 1) * c->lcap) dt__em_tier_fold_join(c);
            }
            dt__em_tier_ptrs(t, x, w, s1, s2);
        }
        return DT_OK;
    }
    *w = (char *)t->w.data + (size_t)(x * nc) * dt_dtype_size(t->dtype);
    *s1 = t->s1.data ? (float *)t->s1.data + x * sn1 : NULL;
    *s2 = t->s2.data ? (float *)t->s2.data + x * nc : NULL;
    return DT_OK;
}

/* Waits for the prefetch in flight and writes every changed cached row back: the slow tier then
   holds each tiered table (for checkpoints, the export, dt_embed_local_shard). */
static dt_status dt__em_tier_settle(dt_embed *e) {
    int i;
    int64_t k;
    dt__em_pfq_drain(e);
    for (i = 0; i < e->n_tabs; i++) {
        dt__em_tier *c = e->tabs[i].tier;
        for (k = 0; c && k < c->filled; k++)
            if (c->sl[k].dirty) {
                if (c->dev) DT__TRY(dt__em_tier_move(e, c, 0, k, c->sl[k].row));
                else dt__em_tier_copy(e, c, &e->tabs[i], k, c->sl[k].row, 1);
                c->sl[k].dirty = 0;
                c->st.written_back++;
                c->st.bytes_out += dt__em_tier_row_bytes(c);
            }
        if (c) dt__em_tier_fold(e, &e->tabs[i]); /* every row home */
    }
    /* tier HOST: the write-backs run on the device, and the host waits for them (a cold path) */
    return e->cuda && e->any_tier ? dt__em_cuda_tier_run(e, 1) : DT_OK;
}

/* After the slow tier changed under the cache (a checkpoint load): every slot empty. */
static void dt__em_tier_drop(dt_embed *e) {
    int i;
    for (i = 0; i < e->n_tabs; i++) {
        dt__em_tier *c = e->tabs[i].tier;
        if (!c) continue;
        dt__em_mfree(e->ctx, &c->where);
        if (c->loc) { /* (settled first: the log is empty) */
            int64_t x;
            dt__em_tier_fold_join(c);
            if (c->ln > 0 || c->unfolded)
                for (x = 0; x < e->tabs[i].r1 - e->tabs[i].r0; x++) DT__EM_LOC_SET(c, x, -1);
            c->ln = 0;
            c->unfolded = 0;
        }
        c->filled = 0;
        c->lst.head = c->lst.tail = -1;
        c->lst.used = 0;
        c->n_pins[0] = c->n_pins[1] = 0;
        for (; c->n_ul > 0; c->n_ul--) c->used[c->ul[c->n_ul - 1]] = 0; /* (the pending gradients go too) */
    }
}

static int dt__em_tier_open(dt_embed *e, const dt__em_tab *t, size_t bytes, void **map) {
    char path[1200], nm[DT_NAME_MAX];
    int fd = -1, tries, i;
    for (i = 0; t->name[i] && i < DT_NAME_MAX - 1; i++) { /* the name as a file name */
        char ch = t->name[i];
        nm[i] = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ? ch : '_';
    }
    nm[i] = 0;
    for (tries = 0; tries < 1000 && fd < 0; tries++) { /* unlinked at once: a name is busy only for a moment */
        snprintf(path, sizeof path, "%s/dt_embed.%ld.r%d.%s.%d.tier", e->tier_dir, (long)getpid(), e->rank, nm, tries);
        fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    }
    if (fd < 0) {
        dt_ctx_set_error(e->ctx, DT_ERR_IO, "dt_embed_create: table \"%s\": cannot create its slow tier in \"%s\" "
                         "(desc.tier_dir) on rank %d; expected a writable directory", t->name, e->tier_dir, e->rank);
        return -1;
    }
    (void)unlink(path); /* scratch: checkpoints are the durable copy */
    /* sized by its last byte (a sparse file: zeros until written; lseek + write, unlike ftruncate,
       are declared under strict -std=c99) */
    if ((off_t)(bytes - 1) != (off_t)(int64_t)(bytes - 1) || lseek(fd, (off_t)(bytes - 1), SEEK_SET) < 0 ||
        write(fd, "", 1) != 1 ||
        (*map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        dt_ctx_set_error(e->ctx, DT_ERR_IO, "dt_embed_create: table \"%s\": its slow tier (%.3g GiB) in \"%s\" "
                         "(desc.tier_dir) on rank %d could not be sized or mapped; expected that much free disk",
                         t->name, (double)bytes / 1073741824.0, e->tier_dir, e->rank);
        close(fd);
        return -1;
    }
    return fd;
}

static void dt__em_tier_view(dt_tensor *v, void *data, dt_dtype dtype, int64_t rows, int64_t cols) {
    memset(v, 0, sizeof *v);
    v->data = data; v->dtype = dtype; v->device = DT_CPU;
    v->shape[0] = rows; v->numel = rows * (cols ? cols : 1);
    if (cols) { v->shape[1] = cols; v->ndim = 2; } else v->ndim = 1;
}

/* The slow tier (a file, or for tier HOST pinned host memory: rows, then s1, then s2, each region
   page-aligned) viewed by t->w, t->s1, t->s2, and the cache. The rows' initial values are written
   by the caller (dt_tensor_init on t->w); the state starts at zero as the file does. */
static dt_status dt__em_tier_create(dt_embed *e, dt__em_tab *t) {
    dt__em_tier *c;
    int64_t nr = t->r1 - t->r0, nc = t->c1 - t->c0, k, b0, b1, b2, b3 = 0, bytes;
    const int64_t page = 1 << 16; /* a multiple of every page size in use (4 KiB, 16 KiB, 64 KiB) */
    if (!(c = (dt__em_tier *)dt_alloc_zeroed(e->ctx, sizeof *c))) return DT_ERR_OOM;
    t->tier = c;
    c->fd = -1;
    c->fh = -1; /* no fold running (tier HOST has no log) */
    c->lfu = t->cache_evict == DT_EVICT_LFU;
    c->pfa = !t->dynamic && !c->lfu && t->shard != DT_SHARD_DATA;
    c->rb = nc * (int64_t)dt_dtype_size(t->dtype);
    c->sn1 = t->kind == DT_EMBED_ROWWISE_ADAGRAD ? 1 : (t->kind == DT_EMBED_ADAGRAD || t->kind == DT_EMBED_ADAM) ? nc : 0;
    c->sn2 = t->kind == DT_EMBED_ADAM ? nc : 0;
    if (t->cache_rows > 0) c->cap = t->cache_rows < nr ? t->cache_rows : nr;
    else { /* a fraction, but room for the batch in flight and the next (2 x the planner's ids per batch) */
        double ids = t->ids_per_batch > 0 ? t->ids_per_batch : (double)e->batch_hint;
        c->cap = (int64_t)ceil((double)nr * (t->cache_fraction > 0 ? t->cache_fraction : 0.125));
        if ((double)c->cap < 2 * ids) c->cap = 2 * ids < (double)nr ? (int64_t)ceil(2 * ids) : nr;
    }
    if (c->cap < 1) c->cap = 1;
    if (c->cap > nr) c->cap = nr;
    if (t->tier_kind == DT_TIER_HOST && t->shard == DT_SHARD_DATA) c->cap = 1; /* no cache (dt__em_cuda_w): a slot */
    c->st.cache_rows = t->tier_kind == DT_TIER_HOST && t->shard == DT_SHARD_DATA ? 0 : c->cap;
    c->dev = t->tier_kind == DT_TIER_HOST;
    /* sizes: rows x bytes fit (dt__em_check_table checked rows x dim x 8) */
    b0 = ((nr * c->rb + page - 1) / page) * page;
    b1 = ((nr * c->sn1 * 4 + page - 1) / page) * page;
    b2 = ((nr * c->sn2 * 4 + page - 1) / page) * page;
    if (!c->dev) { /* tier DISK: the log after them, as many records as rows (sparse until written) */
        c->rec = (c->rb + 3) / 4 * 4 + 4 * (c->sn1 + c->sn2);
        int64_t L = t->log_rows > 0 ? t->log_rows : nr < INT32_MAX ? nr : INT32_MAX;
        c->lcap = (L + 1) / 2; /* two halves: one fills while the other folds */
        if (!dt_mul_ok(2 * c->lcap, c->rec, &b3) || b3 > INT64_MAX / 4 - page || b0 + b1 + b2 > INT64_MAX / 2)
            return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "dt_embed_create: table \"%s\": its slow tier (rows %lld x %lld "
                                    "bytes, and its log) overflows int64 bytes", t->name, (long long)nr, (long long)c->rec);
        b3 = (b3 + page - 1) / page * page;
    }
    bytes = b0 + b1 + b2 + b3;
    c->map_bytes = (size_t)bytes;
    if (c->dev) DT__TRY(dt__em_cuda_tier_create(e, t, (size_t)b0, (size_t)b1)); /* pinned; the device cache */
    else if ((c->fd = dt__em_tier_open(e, t, (size_t)bytes, &c->map)) < 0) return DT_ERR_IO;
#ifdef DT__EM_MADV_RANDOM
    if (!c->dev) (void)madvise(c->map, c->map_bytes, DT__EM_MADV_RANDOM); /* advice: a fault reads its page, no more */
#endif
    dt__em_tier_view(&t->w, c->map, t->dtype, nr, nc);
    if (c->sn1) dt__em_tier_view(&t->s1, (char *)c->map + b0, DT_F32, nr, t->kind == DT_EMBED_ROWWISE_ADAGRAD ? 0 : nc);
    if (c->sn2) dt__em_tier_view(&t->s2, (char *)c->map + b0 + b1, DT_F32, nr, nc);
    if (!c->dev) {
        c->log = (char *)c->map + b0 + b1 + b2;
        if (!(c->loc = (int32_t *)dt_alloc(e->ctx, sizeof(int32_t) * (size_t)nr))) return DT_ERR_OOM;
        dt__em_hugepage(c->loc, sizeof(int32_t) * (size_t)nr);
        for (k = 0; k < nr; k++) c->loc[k] = -1;
        c->cw = (char *)dt_alloc(e->ctx, (size_t)(c->cap * c->rb));
        c->cs1 = c->sn1 ? (float *)dt_alloc(e->ctx, sizeof(float) * (size_t)(c->cap * c->sn1)) : NULL;
        c->cs2 = c->sn2 ? (float *)dt_alloc(e->ctx, sizeof(float) * (size_t)(c->cap * c->sn2)) : NULL;
    }
    if (!dt_mul_ok(c->cap, (int64_t)sizeof(dt__em_slot), &k)) return DT_ERR_OOM; /* (bounded by the shard's bytes) */
    c->sl = (dt__em_slot *)dt_alloc(e->ctx, (size_t)k); /* (dt_alloc aligns to 64 bytes: a slot is a line) */
    c->used = c->dev ? (unsigned char *)dt_alloc_zeroed(e->ctx, (size_t)c->cap) : NULL;
    if ((c->dev && !c->used) || !c->cw || (c->sn1 && !c->cs1) || (c->sn2 && !c->cs2) || !c->sl) return DT_ERR_OOM;
    if (!c->dev) { /* read at random, a line a use: huge pages spare the TLB */
        dt__em_hugepage(c->cw, (size_t)(c->cap * c->rb));
        if (c->cs1) dt__em_hugepage(c->cs1, sizeof(float) * (size_t)(c->cap * c->sn1));
        if (c->cs2) dt__em_hugepage(c->cs2, sizeof(float) * (size_t)(c->cap * c->sn2));
    }
    dt__em_hugepage(c->sl, (size_t)k);
    for (k = 0; k < c->cap; k++) {
        memset(&c->sl[k], 0, sizeof c->sl[k]);
        c->sl[k].pin = -1; c->sl[k].row = -1;
    }
    c->lst.head = c->lst.tail = -1;
    c->where.open = 1;
    return DT_OK;
}

static void dt__em_tier_free(dt_embed *e, dt__em_tab *t) {
    dt__em_tier *c = t->tier;
    if (!c) return;
    if (c->dev) dt__em_cuda_tier_free(e, c);
    else {
        dt__em_tier_fold_join(c); /* (its thread reads the map) */
        if (c->map) (void)munmap(c->map, c->map_bytes);
        if (c->fd >= 0) (void)close(c->fd);
        dt_release(e->ctx, c->cw); dt_release(e->ctx, c->cs1); dt_release(e->ctx, c->cs2);
    }
    memset(&t->w, 0, sizeof t->w); memset(&t->s1, 0, sizeof t->s1); memset(&t->s2, 0, sizeof t->s2);
    dt__em_mfree(e->ctx, &c->where);
    dt_release(e->ctx, c->loc);
    dt_release(e->ctx, c->mv[0]); dt_release(e->ctx, c->mv[1]); dt_release(e->ctx, c->used); dt_release(e->ctx, c->ul);
    dt_release(e->ctx, c->sl);
    dt_release(e->ctx, c->pins[0]); dt_release(e->ctx, c->pins[1]);
    dt_release(e->ctx, c);
    t->tier = NULL;
}

/* ==== >>forward: serve, post, begin, end (the general path of every table) ==================== */

/* The owner's gather + pool pass (dt__em_serve) in two loops. The first walks the received
   requests (segments: header, then ids) and writes, for every id, where its row's columns start
   and how many bytes to prefetch (NULL: a rejected dynamic id, row -1, pooled as zeros); the
   second pools each request from that flat list, and prefetches every line of the row
   DT__EM_PF_IDS ids ahead (the rows are random places in tables larger than the cache: DRAM
   latency, which only misses in flight hide). The request headers and the table lookups stay out
   of the pooling loop. */
typedef struct dt__em_src {
    const char *row;
    int64_t bytes;
} dt__em_src;

DT__EM_PF_FN void dt__em_pf_src(const dt__em_src *s) {
    const char *q = s->row;
    int64_t o;
    if (!q) return;
    for (o = 0; o < s->bytes; o += 64) DT__EM_PF_R(q + o);
    if (s->bytes > 0 && ((uintptr_t)(q + s->bytes - 1) & 63) < ((uintptr_t)q & 63)) DT__EM_PF_R(q + s->bytes - 1);
}

/* Pools the n rows src[0..n) (nc columns of table t's dtype) into acc: acc = ((0 + w0 row0) +
   w1 row1) + ... in f32, bag order, as dt__em_pool; f32 rows 16 columns at a time in registers
   (each column's sum in the same order: the same bits as the loop over columns). pf: the rows
   DT__EM_PF_IDS ids ahead, pf_n of them left. */
static void dt__em_pool_src(const dt__em_tab *t, float *acc, const dt__em_src *src, const float *w, int64_t n,
                            int64_t nc, const dt__em_src *pf, int64_t pf_n) {
    int64_t j, c = 0;
    if (t->dtype != DT_F32 || nc < 32) for (j = 0; j < n && j < pf_n; j++) dt__em_pf_src(pf + j);
    if (t->dtype != DT_F32) {
        for (c = 0; c < nc; c++) acc[c] = 0.0f;
        for (j = 0; j < n; j++) {
            const uint16_t *r = (const uint16_t *)src[j].row;
            float wj = w ? w[j] : 1.0f;
            if (!r) continue;
            for (c = 0; c < nc; c++) {
                float v = t->dtype == DT_BF16 ? dt_bf16_to_f32(r[c]) : dt_f16_to_f32(r[c]);
                acc[c] += t->weighted ? wj * v : v;
            }
        }
        return;
    }
#ifdef DT__EM_SSE2
#define DT__EM_ACC8(OP)                                                                                              \
    do {                                                                                                           \
        a0 = _mm_add_ps(a0, OP(r)); a1 = _mm_add_ps(a1, OP(r + 4)); a2 = _mm_add_ps(a2, OP(r + 8));             \
        a3 = _mm_add_ps(a3, OP(r + 12)); a4 = _mm_add_ps(a4, OP(r + 16)); a5 = _mm_add_ps(a5, OP(r + 20));       \
        a6 = _mm_add_ps(a6, OP(r + 24)); a7 = _mm_add_ps(a7, OP(r + 28));                                        \
    } while (0)
#define DT__EM_LD(p) _mm_loadu_ps(p)
#define DT__EM_WLD(p) _mm_mul_ps(wv, _mm_loadu_ps(p))
    for (; c + 32 <= nc; c += 32) { /* 32 columns in eight registers */
        __m128 a0 = _mm_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (j = 0; j < n; j++) {
            const float *r = (const float *)src[j].row;
            if (c == 0 && j < pf_n) dt__em_pf_src(pf + j); /* between the loads, not in a burst */
            if (!r) continue;
            r += c;
            if (t->weighted) {
                __m128 wv = _mm_set1_ps(w ? w[j] : 1.0f);
                DT__EM_ACC8(DT__EM_WLD);
            } else DT__EM_ACC8(DT__EM_LD);
        }
        _mm_storeu_ps(acc + c, a0); _mm_storeu_ps(acc + c + 4, a1); _mm_storeu_ps(acc + c + 8, a2);
        _mm_storeu_ps(acc + c + 12, a3); _mm_storeu_ps(acc + c + 16, a4); _mm_storeu_ps(acc + c + 20, a5);
        _mm_storeu_ps(acc + c + 24, a6); _mm_storeu_ps(acc + c + 28, a7);
    }
#undef DT__EM_ACC8
#undef DT__EM_LD
#undef DT__EM_WLD
    for (; c + 4 <= nc; c += 4) {
        __m128 a0 = _mm_setzero_ps();
        for (j = 0; j < n; j++) {
            const float *r = (const float *)src[j].row;
            if (!r) continue;
            r += c;
            a0 = _mm_add_ps(a0, t->weighted ? _mm_mul_ps(_mm_set1_ps(w ? w[j] : 1.0f), _mm_loadu_ps(r)) : _mm_loadu_ps(r));
        }
        _mm_storeu_ps(acc + c, a0);
    }
#endif
    for (; c < nc; c++) {
        float a = 0.0f;
        for (j = 0; j < n; j++) {
            const float *r = (const float *)src[j].row;
            if (!r) continue;
            a += t->weighted ? (w ? w[j] : 1.0f) * r[c] : r[c];
        }
        acc[c] = a;
    }
}

/* Owner side: walks the received requests; with out != NULL pools each into out (counting
   the result floats per source rank in nres either way). */
static dt_status dt__em_serve(dt_embed *e, const int64_t *rin, const float *rfl, const int64_t *cnt_i, int64_t *nres,
                              float *out) {
    int64_t k;
    int s;
    int64_t p = 0, q = 0, o = 0, end = 0, n_src = 0;
    for (s = 0; s < e->size; s++) {
        int64_t e_s = p + cnt_i[s];
        nres[s] = 0;
        while (p < e_s) {
            const dt__em_tab *t = &e->tabs[e->feat_tab[rin[p]]];
            nres[s] += t->c1 - t->c0;
            p += DT__EM_HDR + rin[p + 3];
        }
    }
    if (!out) return DT_OK;
    end = p;
    DT__TRY(dt_grow(e->ctx, (void **)&e->src, &e->src_cap, end, sizeof(dt__em_src), "dt_embed gather list"));
    if (e->any_tier && !e->tier_pf) { /* no prefetch looked these ids up: no hints */
        DT__TRY(dt_grow(e->ctx, (void **)&e->tslot, &e->tslot_cap, end + 1, sizeof(int64_t), "dt_embed cache slots"));
        for (k = 0; k < end; k++) e->tslot[k] = -1;
    }
    for (p = 0; p < end;) { /* every id's row, in request order */
        dt__em_tab *t = &e->tabs[e->feat_tab[rin[p]]];
        int64_t n = rin[p + 3], j, bytes = (t->c1 - t->c0) * (int64_t)dt_dtype_size(t->dtype);
        const char *base = (const char *)t->w.data;
        for (j = 0; j < n; j++, n_src++) {
            int64_t row = rin[p + DT__EM_HDR + j];
            dt__em_src *d = &e->src[n_src];
            /* only a rejected dynamic id (-1) is outside the shard: the requester bucketized by owner */
            d->row = row >= t->r0 && row < t->r1 ? base + (row - t->r0) * bytes : NULL;
            d->bytes = bytes;
            if (t->tier && d->row) { /* its cache slot (fetched now, or waited for when prefetched) */
                int64_t *hint = &e->tslot[p + DT__EM_HDR + j];
                if (j + 8 < n) { /* a few ids ahead: the slot's lines, or the map's */
                    if (e->tier_pf && hint[8] >= 0) dt__em_pf_slot(t->tier, hint[8]);
                    else dt__em_pf_map(&t->tier->where, rin[p + DT__EM_HDR + j + 8] - t->r0);
                }
                DT__TRY(dt__em_tier_use(e, t, row - t->r0, e->tier_pf ? *hint : -1, e->epoch, DT__EM_NOW, !e->tier_pf, &k));
                if (k < 0) { dt__em_tier_full(e, t); d->row = NULL; }
                else d->row = t->tier->cw + k * bytes;
                *hint = k; /* for the update */
            }
        }
        p += DT__EM_HDR + n;
    }
    for (q = 0; q < DT__EM_PF_IDS && q < n_src; q++) dt__em_pf_src(e->src + q);
    for (p = 0, q = 0; p < end;) {
        const dt__em_tab *t = &e->tabs[e->feat_tab[rin[p]]];
        int64_t n = rin[p + 3], nc = t->c1 - t->c0, ahead = q + DT__EM_PF_IDS;
        dt__em_pool_src(t, out + o, e->src + q, e->any_weighted ? rfl + q : NULL, n, nc,
                        ahead < n_src ? e->src + ahead : NULL, ahead < n_src ? n_src - ahead : 0);
        o += nc;
        q += n;
        p += DT__EM_HDR + n;
    }
    return DT_OK;
}

static dt_status dt__em_seq_layout(dt_embed *e) {
    int64_t total = 0, B = e->B;
    int f;
    for (f = 0; f < e->n_feat; f++) {
        const dt__em_tab *t = &e->tabs[e->feat_tab[f]];
        e->seq_off[f] = total;
        if (t->pooling == DT_POOL_NONE) {
            int64_t n = e->offs[(int64_t)(f + 1) * B] - e->offs[(int64_t)f * B], nf;
            if (!dt_mul_ok(n, t->dim, &nf) || nf > INT64_MAX / 2 - total)
                return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "dt_embed_forward: feature %d: %lld ids x dim %lld is too "
                                        "large", f, (long long)n, (long long)t->dim);
            total += nf;
        }
    }
    e->seq_off[e->n_feat] = total;
    if (total + 1 > e->seq_cap) {
        int64_t c1 = e->seq_cap, c2 = e->seq_cap;
        DT__TRY(dt_grow(e->ctx, (void **)&e->seq, &c1, total + 1, sizeof(float), "dt_embed sequence rows"));
        DT__TRY(dt_grow(e->ctx, (void **)&e->seq_grad, &c2, total + 1, sizeof(float), "dt_embed sequence grads"));
        e->seq_cap = c1 < c2 ? c1 : c2;
    }
    memset(e->seq, 0, (size_t)(total + 1) * sizeof(float));
    memset(e->seq_grad, 0, (size_t)(total + 1) * sizeof(float));
    return DT_OK;
}

/* Where the result of (f, b, pos) goes: a row of the pooled output or of the sequence buffer. */
static float *dt__em_dst(dt_embed *e, int f, int64_t b, int64_t pos, float *pooled, float *seq) {
    const dt__em_tab *t = &e->tabs[e->feat_tab[f]];
    if (t->pooling != DT_POOL_NONE) return pooled + b * e->pooled_dim + e->feat_off[f];
    return seq + e->seq_off[f] + (e->offs[(int64_t)f * e->B + b] - e->offs[(int64_t)f * e->B] + pos) * t->dim;
}

/* Posts the id (and weight) exchange: a receive from and a send to every rank with something to
   say, point to point, so it runs while the caller computes; dt_embed_forward_end waits. */
#define DT__EM_TAG_IDS 0x3e1
#define DT__EM_TAG_WTS 0x3e2
static dt_status dt__em_post(dt_embed *e, dt_tensor *sbuf, dt_tensor *rbuf, const int64_t *scnt, const int64_t *rcnt,
                             int tag) {
    int64_t so = 0, ro = 0, r;
    size_t es = dt_dtype_size(sbuf->dtype);
    for (r = 0; r < e->size; r++) {
        if (r == e->rank) { /* to itself: a copy */
            if (scnt[r]) memcpy((char *)rbuf->data + (size_t)ro * es, (const char *)sbuf->data + (size_t)so * es,
                                (size_t)scnt[r] * es);
        } else {
            if (rcnt[r]) {
                dt_tensor *v = &e->rviews[e->n_reqs];
                DT__TRY(dt_tensor_view(e->ctx, v, rbuf, ro, 1, &rcnt[r]));
                DT__TRY(dt_comm_irecv(e->comm, v, (int)r, tag, &e->reqs[e->n_reqs]));
                e->n_reqs++;
            }
            if (scnt[r]) {
                dt_tensor *v = &e->rviews[e->n_reqs];
                DT__TRY(dt_tensor_view(e->ctx, v, sbuf, so, 1, &scnt[r]));
                DT__TRY(dt_comm_isend(e->comm, v, (int)r, tag, &e->reqs[e->n_reqs]));
                e->n_reqs++;
            }
        }
        so += scnt[r];
        ro += rcnt[r];
    }
    return DT_OK;
}

/* The id exchange's requests under one deadline: dt_comm_wait counts the comm's timeout from
   each call, so waiting for them one by one would let a peer that died cost a full timeout per
   request still waiting on it. The first failure is the one named (the receive from the peer
   that died); the requests after it are given what is left of the deadline, little or nothing. */
static dt_status dt__em_wait_all(dt_embed *e) {
    dt_status st = DT_OK;
    double to = e->comm && e->n_reqs ? dt_comm_timeout(e->comm) : 0, end = to > 0 ? dt_comm_now() + to : 0;
    char first[DT_ERROR_MAX];
    int i;
    first[0] = 0;
    for (i = 0; i < e->n_reqs; i++) {
        dt_status s2;
        if (to > 0) { /* what is left of the deadline (the setting is local to this rank) */
            double left = end - dt_comm_now();
            (void)dt_comm_set_timeout(e->comm, left > 1e-3 ? left : 1e-3);
        }
        s2 = dt_comm_wait(e->reqs[i]);
        if (s2 && !st) {
            st = s2;
            snprintf(first, sizeof first, "%s", dt_ctx_error(e->ctx));
        }
    }
    if (to > 0) (void)dt_comm_set_timeout(e->comm, to);
    e->n_reqs = 0;
    if (st)
        return dt_ctx_set_error(e->ctx, st, "dt_embed_forward: the id exchange (ids and weights between the ranks, "
                                "posted by dt_embed_forward_begin) failed after %.3g s: %s", to > 0 ? to : 0.0, first);
    return DT_OK;
}

#define DT__EM_SW(a, b) do { char t_[sizeof(a)]; memcpy(t_, &(a), sizeof(a)); memcpy(&(a), &(b), sizeof(a)); \
                                memcpy(&(b), t_, sizeof(a)); } while (0)
static void dt__em_swap(dt_embed *e) {
    dt__em_bst *a = &e->aside;
    DT__EM_SW(e->phase, a->phase); DT__EM_SW(e->dp_late, a->dp_late); DT__EM_SW(e->B, a->B);
    DT__EM_SW(e->g0, a->g0); DT__EM_SW(e->n_ids, a->n_ids); DT__EM_SW(e->rbuf_n, a->rbuf_n);
    DT__EM_SW(e->offs, a->offs); DT__EM_SW(e->offs_cap, a->offs_cap); DT__EM_SW(e->rows, a->rows);
    DT__EM_SW(e->rows_cap, a->rows_cap); DT__EM_SW(e->wts, a->wts); DT__EM_SW(e->wts_cap, a->wts_cap);
    DT__EM_SW(e->segs, a->segs); DT__EM_SW(e->n_segs, a->n_segs); DT__EM_SW(e->segs_cap, a->segs_cap);
    DT__EM_SW(e->cnt, a->cnt); DT__EM_SW(e->seq, a->seq); DT__EM_SW(e->seq_grad, a->seq_grad);
    DT__EM_SW(e->seq_cap, a->seq_cap); DT__EM_SW(e->seq_off, a->seq_off); DT__EM_SW(e->sbuf_i, a->sbuf_i);
    DT__EM_SW(e->sbuf_f, a->sbuf_f); DT__EM_SW(e->rbuf_i, a->rbuf_i); DT__EM_SW(e->rbuf_f, a->rbuf_f);
    DT__EM_SW(e->pooled, a->pooled); DT__EM_SW(e->reqs, a->reqs); DT__EM_SW(e->rviews, a->rviews);
    DT__EM_SW(e->n_reqs, a->n_reqs); DT__EM_SW(e->cu_kl, a->cu_kl); DT__EM_SW(e->cu_kid, a->cu_kid);
    DT__EM_SW(e->cu_kw, a->cu_kw); DT__EM_SW(e->cu_k64, a->cu_k64); DT__EM_SW(e->cu_rq, a->cu_rq);
    DT__EM_SW(e->cu_rqf, a->cu_rqf); DT__EM_SW(e->cu_smeta, a->cu_smeta); DT__EM_SW(e->cu_smetaf, a->cu_smetaf);
    DT__EM_SW(e->cu_fR, a->cu_fR); DT__EM_SW(e->cu_fS, a->cu_fS); DT__EM_SW(e->cu_fmax, a->cu_fmax);
    DT__EM_SW(e->cu_bmax, a->cu_bmax); DT__EM_SW(e->cu_cx, a->cu_cx); DT__EM_SW(e->cu_cx_cap, a->cu_cx_cap);
    DT__EM_SW(e->cu_devreq, a->cu_devreq); DT__EM_SW(e->tier_pf, a->tier_pf);
    DT__EM_SW(e->tslot, a->tslot); DT__EM_SW(e->tslot_cap, a->tslot_cap);
}
#undef DT__EM_SW

DT_API dt_status dt_embed_progress(dt_embed *e) {
    int k, i, done;
    if (!e) return DT_ERR_ARG;
    for (k = 0; k < 2; k++) {
        int ph = k ? e->aside.phase : e->phase, n = k ? e->aside.n_reqs : e->n_reqs;
        dt_comm_req **rq = k ? e->aside.reqs : e->reqs;
        if (ph != 1) continue;
        for (i = 0; i < n; i++) DT__TRY(dt_comm_test(rq[i], &done));
    }
    return DT_OK;
}

/* A tiered data-parallel table's bag: its rows' cache slots (as dt__em_serve), then the same pooling. */
static dt_status dt__em_dp_tier_bag(dt_embed *e, dt__em_tab *t, float *acc, const int64_t *rows, const float *w,
                                    int64_t n) {
    int64_t j, k, bytes = t->tier->rb;
    DT__TRY(dt_grow(e->ctx, (void **)&e->src, &e->src_cap, n + 1, sizeof(dt__em_src), "dt_embed gather list"));
    for (j = 0; j < n; j++) {
        DT__TRY(dt__em_tier_slot(e, t, rows[j], e->epoch, DT__EM_NOW, !e->tier_pf, &k));
        if (k < 0) dt__em_tier_full(e, t);
        e->src[j].row = k < 0 ? NULL : t->tier->cw + k * bytes;
        e->src[j].bytes = bytes;
    }
    dt__em_pool_src(t, acc, e->src, w, n, t->dim, NULL, 0);
    return DT_OK;
}

/* Data-parallel lookups: local, straight into the pooled buffer / sequence rows. */
static dt_status dt__em_dp_lookup(dt_embed *e) {
    int64_t b, j;
    int f;
    if (e->cuda) return dt__em_cuda_dp_pool(e);
    /* resident tables a feature at a time: its ids are contiguous, so a cursor prefetches the rows
       DT__EM_PF_IDS ids ahead across bags (bags are short: a prefetch inside one comes too late).
       Each bag is its own sum from 0, so their order changes no bits. */
    for (f = 0; f < e->n_feat; f++) {
        dt__em_tab *t = &e->tabs[e->feat_tab[f]];
        int64_t hi = e->offs[(int64_t)(f + 1) * e->B], pf = e->offs[(int64_t)f * e->B];
        if (!t->local || t->tier) continue;
        for (b = 0; b < e->B; b++) {
            int64_t i0 = e->offs[(int64_t)f * e->B + b], n = e->offs[(int64_t)f * e->B + b + 1] - i0;
            for (; pf < hi && pf < i0 + n + DT__EM_PF_IDS; pf++) dt__em_pf_row(t, e->rows[pf], 0);
            if (t->pooling == DT_POOL_NONE)
                for (j = 0; j < n; j++)
                    dt__em_pool(t, dt__em_dst(e, f, b, j, NULL, e->seq), e->rows + i0 + j, e->wts + i0 + j, 1, 0, t->dim, 0);
            else dt__em_pool(t, dt__em_dst(e, f, b, -1, (float *)e->pooled.data, NULL), e->rows + i0, e->wts + i0, n, 0,
                             t->dim, 0);
        }
    }
    /* tiered tables in the batch's order (their cache's recency follows it) */
    for (b = 0; b < e->B; b++)
        for (f = 0; f < e->n_feat; f++) {
            dt__em_tab *t = &e->tabs[e->feat_tab[f]];
            int64_t i0 = e->offs[(int64_t)f * e->B + b], n = e->offs[(int64_t)f * e->B + b + 1] - i0;
            if (!t->local || !t->tier) continue;
            if (t->pooling == DT_POOL_NONE)
                for (j = 0; j < n; j++)
                    DT__TRY(dt__em_dp_tier_bag(e, t, dt__em_dst(e, f, b, j, NULL, e->seq), e->rows + i0 + j, e->wts + i0 + j, 1));
            else
                DT__TRY(dt__em_dp_tier_bag(e, t, dt__em_dst(e, f, b, -1, (float *)e->pooled.data, NULL), e->rows + i0,
                                           e->wts + i0, n));
        }
    return DT_OK;
}

static dt_status dt__em_begin(dt_embed *e, const dt_kjt *kjt, dt_status pre);
static dt_status dt__em_end(dt_embed *e, dt_tensor *out);

/* pre: this rank's status of an argument checked before (dt_embed_forward's out): a failure on
   any rank fails begin on every rank before anything changes. */
static dt_status dt__em_fbegin(dt_embed *e, const dt_kjt *kjt, dt_status pre) {
    dt_status st;
    int ahead;
    if (e->phase == 1 || e->aside.phase == 1)
        return dt_ctx_set_error(e->ctx, DT_ERR_STATE, "dt_embed_forward_begin: the batch begun last has no "
                                "dt_embed_forward_end yet; expected begin, end, [backward], begin, ...");
    ahead = e->phase == 2; /* the previous batch still needs its state for its backward: keep it aside */
    if (ahead) dt__em_swap(e);
    e->dp_late = ahead;    /* its rows may change in that backward: read them at the end */
    st = dt__em_begin(e, kjt, pre);
    if (ahead) dt__em_swap(e);
    return st;
}

DT_API dt_status dt_embed_forward_begin(dt_embed *e, const dt_kjt *kjt) {
    if (!e) return DT_ERR_ARG;
    dt__em_pf_join(e, 0);
    return dt__em_fbegin(e, kjt, DT_OK);
}

DT_API dt_status dt_embed_forward_end(dt_embed *e, dt_tensor *out) {
    if (!e) return DT_ERR_ARG;
    dt__em_pf_join(e, 1); /* the prefetch's lookups (the forward waits for them: its prefetch wait) */
    e->pf_pending = 0;
    if (e->phase != 1 && e->aside.phase == 1) dt__em_swap(e); /* the batch begun ahead */
    return dt__em_end(e, out);
}

static dt_status dt__em_begin(dt_embed *e, const dt_kjt *kjt, dt_status pre) {
    const char *fn = "dt_embed_forward";
    int W, r, bad = 0, out_bad;
    int64_t *cnt, tot_i = 0, tot_f = 0, tot_r = 0, K;
    (void)tot_r;
    dt__em_gen g;
    dt_status st;
    double t0 = dt__em_now(), *v;
    if (!e) return DT_ERR_ARG;
    W = e->size;
    cnt = e->cnt;
    e->phase = 0;
    e->n_segs = 0;
    e->tier_pf = 0;
    e->tier_st = DT_OK;
    st = dt__em_read_batch(e, kjt, &bad);
    out_bad = !st && !bad && pre; /* the batch is fine, the argument checked before is not */
    if (out_bad) st = pre;        /* its message is set */
    if (st) bad = st;
    /* agree: every rank's batch size (for the global sample numbers), whether one failed, and
       whether every failure was an argument checked before (the others then say so, not "batch") */
    if (!(v = (double *)dt_alloc(e->ctx, sizeof(double) * (size_t)(W + 2)))) return DT_ERR_OOM;
    memset(v, 0, sizeof(double) * (size_t)(W + 2));
    v[e->rank] = st ? 0 : (double)e->B;
    v[W] = bad ? 1 : 0;
    v[W + 1] = out_bad ? 1 : 0;
    {
        dt_status cs = dt__em_sum_f64(e, v, W + 2);
        if (cs) { dt_release(e->ctx, v); return cs; }
    }
    if (v[W] > 0) {
        double nbad = v[W], nout = v[W + 1];
        dt_release(e->ctx, v);
        if (bad) return (dt_status)bad;
        if (nout == nbad)
            return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: out was refused on another rank (%g rank(s)); see its "
                                    "message", fn, nbad);
        return dt_ctx_set_error(e->ctx, DT_ERR_RANGE, "%s: a bad batch on another rank (%g rank(s)); see its message",
                                fn, nbad);
    }
    e->g0 = 0;
    for (r = 0; r < e->rank; r++) e->g0 += (int64_t)v[r];
    dt_release(e->ctx, v);
    /* requests: count, size the buffers, fill (on the device: dt__em_cuda_requests) */
    e->cu_devreq = e->cuda && dt__em_cuda_devreq(e);
    K = e->cu_devreq ? 4 + 2 * (int64_t)e->n_tabs : 2;
    memset(cnt, 0, sizeof(int64_t) * (size_t)(6 * W));
    g.ni = cnt; g.nf = cnt + W; g.nr = cnt + 2 * W; g.fill = 0; g.nq = NULL;
    if (e->cu_devreq) { /* requests per dest, ids and requests per (dest, table); then what arrives (K per rank) */
        int64_t nx = W + 2 * (int64_t)W * e->n_tabs;
        DT__TRY(dt_grow(e->ctx, (void **)&e->cu_cx, &e->cu_cx_cap, nx + K * W, sizeof(int64_t), "dt_embed counts"));
        memset(e->cu_cx, 0, sizeof(int64_t) * (size_t)nx);
        g.nq = e->cu_cx;
    }
    DT__TRY(dt__em_generate(e, &g));
    for (r = 0; r < W; r++) { tot_i += cnt[r]; tot_f += cnt[W + r]; tot_r += cnt[2 * W + r]; }
    if (!e->cu_devreq) {
        int64_t *di = cnt + 3 * W, *df = cnt + 4 * W, *dr = cnt + 5 * W, oi = 0, of = 0, orr = 0;
        DT__TRY(dt__em_need(e, &e->sbuf_i, DT_I64, tot_i + 1));
        DT__TRY(dt__em_need(e, &e->sbuf_f, DT_F32, tot_f + 1));
        for (r = 0; r < W; r++) { /* fill: per-dest cursors start at the dest's displacement */
            di[r] = oi; df[r] = of; dr[r] = orr;
            oi += cnt[r]; of += cnt[W + r]; orr += cnt[2 * W + r];
        }
        g.ni = di; g.nf = df; g.nr = dr; g.fill = 1;
        DT__TRY(dt__em_generate(e, &g));
    }
    e->stats.ids += e->n_ids;
    for (r = 0; r < W; r++)
        if (r != e->rank) e->stats.bytes_sent_fwd += 8.0 * (double)cnt[r] + 4.0 * (double)cnt[W + r];
    if (e->cuda) DT__TRY(dt__em_cuda_batch(e, kjt));
    /* exchange the requests: counts first (all-to-all of K per rank: ints, floats; with requests made
       on the device also requests, results, and per table ids and requests), then ids and weights */
    {
        int64_t *rc = cnt + 3 * W, *rf = cnt + 4 * W, tr_i = 0, tr_f = 0, *x;
        DT__TRY(dt__em_need(e, &e->dp_i, DT_I64, 2 * K * W));
        x = (int64_t *)e->dp_i.data;
        for (r = 0; r < W; r++) {
            x[K * r] = cnt[r];
            x[K * r + 1] = cnt[W + r];
            if (e->cu_devreq) {
                x[K * r + 2] = e->cu_cx[r];
                x[K * r + 3] = cnt[2 * W + r];
                memcpy(x + K * r + 4, e->cu_cx + W + 2 * (int64_t)r * e->n_tabs, sizeof(int64_t) * 2 * (size_t)e->n_tabs);
            }
        }
        if (e->comm) {
            dt_tensor a, bb;
            int64_t sh[1];
            sh[0] = K * W;
            DT__TRY(dt_tensor_view(e->ctx, &a, &e->dp_i, 0, 1, sh));
            DT__TRY(dt_tensor_view(e->ctx, &bb, &e->dp_i, K * W, 1, sh));
            DT__TRY(dt_comm_alltoall(e->comm, &bb, &a));
        } else memcpy(x + K, x, sizeof(int64_t) * (size_t)K);
        for (r = 0; r < W; r++) {
            rc[r] = x[K * W + K * r];
            rf[r] = x[K * W + K * r + 1];
            tr_i += rc[r]; tr_f += rf[r];
            if (e->cu_devreq) { /* what this rank serves; its responses' sizes are known now */
                memcpy(e->cu_cx + W + 2 * (int64_t)W * e->n_tabs + K * r, x + K * W + K * r, sizeof(int64_t) * (size_t)K);
                cnt[5 * W + r] = x[K * W + K * r + 3];
            }
        }
        e->n_reqs = 0;
        e->rbuf_n = tr_i;
        if (e->cu_devreq) DT__TRY(dt__em_cuda_requests(e));
        else {
            DT__TRY(dt__em_need(e, &e->rbuf_i, DT_I64, tr_i + 1));
            DT__TRY(dt__em_need(e, &e->rbuf_f, DT_F32, tr_f + 1));
            DT__TRY(dt__em_post(e, &e->sbuf_i, &e->rbuf_i, cnt, rc, DT__EM_TAG_IDS));
            if (e->any_weighted) DT__TRY(dt__em_post(e, &e->sbuf_f, &e->rbuf_f, cnt + W, rf, DT__EM_TAG_WTS));
        }
    }
    /* local: data-parallel lookups (at the end when begun ahead of a backward) */
    {
        int64_t nb;
        if (!dt_mul_ok(e->B, e->pooled_dim, &nb)) return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: batch x pooled dim overflows", fn);
        DT__TRY(dt__em_need(e, &e->pooled, DT_F32, nb + 1));
        memset(e->pooled.data, 0, (size_t)nb * sizeof(float));
        DT__TRY(dt__em_seq_layout(e));
        if (!e->dp_late && e->any_tier) dt__em_tier_advance(e); /* this batch's lookups start */
        if (!e->dp_late) DT__TRY(dt__em_dp_lookup(e));
    }
    e->phase = 1;
    e->stats.seconds_fwd += dt__em_now() - t0;
    return DT_OK;
}

/* The caller's out (forward) or dout (backward) apart from what the embed itself writes: every
   table's rows and optimizer state (a view from dt_embed_local_shard) and the sequence buffers
   (from dt_embed_sequence / _grad; seqs: the forward, which fills them before it writes out). The
   backward updates rows while it still reads dout (it only reads the sequence buffers). A tier
   HOST table's rows and state are pinned host memory that the kernels and copies reach at its
   device address (its host address under unified addressing): a cuda tensor there is checked
   too. The sequence buffers are two sets, the live batch's and the one kept aside: a forward
   after a forward (evaluation), or one begun ahead, fills the other set, which a view from the
   forward before the last still shows. Both sets, whole, so that dt_embed_forward's check
   before begin (on every rank together) covers the set the batch is about to fill. */
static dt_status dt__em_apart(dt_embed *e, const dt_tensor *x, int seqs, const char *fn, const char *xn) {
    static const char *what[3] = {"rows", "optimizer state", "optimizer state"};
    dt_tensor seq;
    int i, k;
    for (i = 0; i < e->n_tabs; i++) {
        const dt__em_tab *t = &e->tabs[i];
        const dt_tensor *own[3];
        own[0] = &t->w; own[1] = &t->s1; own[2] = &t->s2;
        for (k = 0; k < 3; k++) {
            dt_tensor mapped = *own[k];
            int hit = dt_tensor_overlap(x, own[k]);
            if (!hit && t->tier && t->tier->dev) { /* tier HOST: the kernels' address of the same memory */
                mapped.device = DT_CUDA_DEVICE;
                mapped.data = k == 0 ? (void *)t->tier->hw : k == 1 ? (void *)t->tier->hs1 : (void *)t->tier->hs2;
                hit = dt_tensor_overlap(x, &mapped);
            }
            if (hit)
                return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: %s shares memory with table \"%s\"'s %s; expected "
                                        "it apart (the embed reads one while it writes the other)", fn, xn, t->name, what[k]);
        }
    }
    memset(&seq, 0, sizeof seq);
    seq.dtype = DT_F32;
    seq.device = DT_CPU; /* as dt_embed_sequence's views */
    seq.ndim = 1;
    for (k = 0; seqs && k < 4; k++) {
        seq.data = k & 1 ? (k < 2 ? e->seq_grad : e->aside.seq_grad) : (k < 2 ? e->seq : e->aside.seq);
        seq.numel = seq.shape[0] = k < 2 ? e->seq_cap : e->aside.seq_cap;
        if (dt_tensor_overlap(x, &seq))
            return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: %s shares memory with the embed's sequence %s (a view from "
                                    "dt_embed_sequence%s); expected it apart", fn, xn, k & 1 ? "gradients" : "rows",
                                    k & 1 ? "_grad" : "");
    }
    return DT_OK;
}

static dt_status dt__em_check_out(dt_embed *e, const dt_tensor *out, int64_t B) {
    const char *fn = "dt_embed_forward";
    dt_status st = e->cuda ? dt__em_cuda_check(e, out, fn, "out") : dt_check_tensor(e->ctx, out, DT_F32, fn, "out");
    if (!st && (out->ndim != 2 || out->shape[0] != B || out->shape[1] != e->pooled_dim)) {
        char s1[64];
        st = dt_ctx_set_error(e->ctx, DT_ERR_SHAPE, "%s: out is %s; expected [%lld, %lld] (local batch, pooled dim)", fn,
                              dt_shape_str(out, s1, sizeof s1), (long long)B, (long long)e->pooled_dim);
    }
    if (!st) st = dt__em_apart(e, out, 1, fn, "out");
    return st;
}

static dt_status dt__em_end(dt_embed *e, dt_tensor *out) {
    const char *fn = "dt_embed_forward";
    int W, r, f;
    int64_t *cnt, k, c, b, tot = 0;
    double t0 = dt__em_now();
    dt_status st;
    if (!e) return DT_ERR_ARG;
    if (e->phase != 1) return dt_ctx_set_error(e->ctx, DT_ERR_STATE, "%s: no dt_embed_forward_begin before this end", fn);
    W = e->size;
    cnt = e->cnt;
    st = dt__em_check_out(e, out, e->B);
    /* the ids are in: serve (pool what was asked of this rank's shards, one pass), and every
       rank takes part in the return all-to-all even when its out is bad: the other ranks' ids
       were sent at begin and are admitted here (dt_embed_forward checks out before begin) */
    {
        double tw = dt__em_now();
        dt_status ws = dt__em_wait_all(e);
        int64_t tot_res = 0;
        e->stats.seconds_wait += dt__em_now() - tw;
        if (ws) { e->phase = 0; return ws; }
        if (e->dp_late) { /* begun ahead: its lookups start now, after the previous batch's backward */
            e->dp_late = 0;
            if (e->any_tier) dt__em_tier_advance(e);
            DT__TRY(dt__em_dp_lookup(e));
        }
        if (e->any_dyn) DT__TRY(e->cuda ? dt__em_cuda_dyn_translate(e, (int64_t *)e->rbuf_i.data, e->rbuf_n)
                                         : dt__em_dyn_translate(e, (int64_t *)e->rbuf_i.data, e->rbuf_n));
        if (!e->cu_devreq) /* (requests made on the device: the counts came at begin) */
            DT__TRY(dt__em_serve(e, (const int64_t *)e->rbuf_i.data, (const float *)e->rbuf_f.data, cnt + 3 * W,
                                  cnt + 5 * W, NULL)); /* counts only */
        for (r = 0; r < W; r++) tot_res += cnt[5 * W + r];
        DT__TRY(dt__em_need(e, &e->resp, DT_F32, tot_res + 1));
        if (e->cuda) /* pools into e->cu_resp on the device */
            DT__TRY(e->cu_devreq ? dt__em_cuda_serve_dev(e, tot_res) : dt__em_cuda_serve(e, tot_res));
        else DT__TRY(dt__em_serve(e, (const int64_t *)e->rbuf_i.data, (const float *)e->rbuf_f.data, cnt + 3 * W,
                                   cnt + 5 * W, (float *)e->resp.data));
    }
    for (r = 0; r < W; r++) tot += cnt[2 * W + r];
    DT__TRY(dt__em_need(e, &e->res, DT_F32, tot + 1));
    {
        dt_status cs = e->cuda ? dt__em_cuda_return(e, tot) : dt__em_a2av(e, &e->res, &e->resp, cnt + 5 * W, cnt + 2 * W);
        if (cs) return cs;
    }
    for (r = 0; r < W; r++)
        if (r != e->rank) e->stats.bytes_sent_fwd += 4.0 * (double)cnt[5 * W + r];
    if (e->any_tier) { /* a tiered table's cache too small for this step, on any rank: fails on all */
        double flag[1];
        flag[0] = e->tier_st ? 1 : 0;
        DT__TRY(dt__em_sum_f64(e, flag, 1));
        if (flag[0] > 0) {
            e->phase = 0;
            if (e->tier_st) return dt_ctx_set_error(e->ctx, e->tier_st, "%s", e->tier_msg);
            return dt_ctx_set_error(e->ctx, DT_ERR_RANGE, "%s: a tiered table's cache is too small on another rank; see "
                                    "its message", fn);
        }
    }
    if (st) { e->phase = 0; return st; }
    if (dt__em_cuda_dev(e)) { /* the same scatter on the device, into out */
        DT__TRY(dt__em_cuda_end(e, out, tot));
        e->phase = 2;
        e->stats.forwards++;
        e->stats.seconds_fwd += dt__em_now() - t0;
        return DT_OK;
    }
    /* scatter, in generation order: a row-wise bag adds its rows in bag order */
    for (k = 0; k < e->n_segs; k++) {
        const dt__em_seg *s = &e->segs[k];
        const float *src = (const float *)e->res.data + s->res;
        float *dst = dt__em_dst(e, s->f, s->b, s->pos < 0 ? 0 : s->pos, (float *)e->pooled.data, e->seq);
        dt__em_add(dst + s->c0, src, s->nc); /* the same f32 adds as dst[c] += src[c] */
    }
    for (f = 0; f < e->n_feat; f++) { /* mean: divide last, the same on every path */
        const dt__em_tab *t = &e->tabs[e->feat_tab[f]];
        if (t->pooling != DT_POOL_MEAN) continue;
        for (b = 0; b < e->B; b++) {
            int64_t n = e->offs[(int64_t)f * e->B + b + 1] - e->offs[(int64_t)f * e->B + b];
            float *dst = (float *)e->pooled.data + b * e->pooled_dim + e->feat_off[f];
            if (n > 0) for (c = 0; c < t->dim; c++) dst[c] /= (float)n;
        }
    }
    if (e->B * e->pooled_dim > 0) {
        if (e->cuda) DT__TRY(dt__em_cuda_put(e, out->data, e->pooled.data, (size_t)(e->B * e->pooled_dim) * sizeof(float)));
        else memcpy(out->data, e->pooled.data, (size_t)(e->B * e->pooled_dim) * sizeof(float));
    }
    e->phase = 2;
    e->stats.forwards++;
    e->stats.seconds_fwd += dt__em_now() - t0;
    return DT_OK;
}

/* out is checked before begin, on every rank together: a bad out admits and evicts no ids. */
static dt_status dt__em_pf_forward(dt_embed *e, dt_tensor *out, const dt_kjt *kjt);

DT_API dt_status dt_embed_forward(dt_embed *e, dt_tensor *out, const dt_kjt *kjt) {
    if (!e) return DT_ERR_ARG;
    dt__em_pf_join(e, 1);
    if (e->pf_pending) return dt__em_pf_forward(e, out, kjt); /* begun by dt_embed_prefetch */
    DT__TRY(dt__em_fbegin(e, kjt, dt__em_check_out(e, out, kjt ? kjt->batch : 0)));
    return dt_embed_forward_end(e, out);
}

static dt_status dt__em_seq_view(dt_embed *e, dt_tensor *view, int f, float *base, const char *fn) {
    const dt__em_tab *t;
    if (!e) return DT_ERR_ARG;
    if (!view) return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: view is NULL", fn);
    if (f < 0 || f >= e->n_feat) return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: feature = %d; expected [0, %d)", fn, f, e->n_feat);
    t = &e->tabs[e->feat_tab[f]];
    if (t->pooling != DT_POOL_NONE)
        return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: feature %d's table \"%s\" pools; expected a sequence (pooling NONE) feature", fn, f, t->name);
    if (e->phase < 1) return dt_ctx_set_error(e->ctx, DT_ERR_STATE, "%s: no forward yet", fn);
    memset(view, 0, sizeof *view);
    view->data = base + e->seq_off[f];
    view->dtype = DT_F32;
    view->device = DT_CPU;
    view->ndim = 2;
    view->shape[0] = (e->seq_off[f + 1] - e->seq_off[f]) / t->dim;
    view->shape[1] = t->dim;
    view->numel = e->seq_off[f + 1] - e->seq_off[f];
    return DT_OK;
}
DT_API dt_status dt_embed_sequence(dt_embed *e, dt_tensor *view, int f) {
    return dt__em_seq_view(e, view, f, e ? e->seq : NULL, "dt_embed_sequence");
}
DT_API dt_status dt_embed_sequence_grad(dt_embed *e, dt_tensor *view, int f) {
    return dt__em_seq_view(e, view, f, e ? e->seq_grad : NULL, "dt_embed_sequence_grad");
}

/* ==== >>backward: gradients to owners, sparse update ========================================== */

static dt_status dt__em_add_con(dt_embed *e, int t, int64_t row, float w, const float *g, int64_t *n) {
    dt__em_contrib *c;
    if (*n >= e->con_cap) /* (the test inline: one call a step, not one an id) */
        DT__TRY(dt_grow(e->ctx, (void **)&e->con, &e->con_cap, *n + 1, sizeof(dt__em_contrib), "dt_embed gradients"));
    c = &e->con[(*n)++];
    c->t = t; c->row = row; c->w = w; c->g = g; c->slot = -1;
    return DT_OK;
}

/* The one order of a row's gradient contributions is (table, row, global sample, feature,
   position). They are collected in (global sample, feature, position) order already: requests
   are generated sample-major and arrive in rank order (data-parallel pairs likewise, after the
   sharded ones, and of other tables). So a stable sort by (table, row) gives that order: an LSD
   radix sort, 11 bits of the row per pass, then one pass by table; O(ids) per step. */
static dt_status dt__em_sort(dt_embed *e, int64_t n) {
    int64_t cnt[4097], i, maxrow = 0, k, mask;
    int shift, bits = 1, passes, digit;
    dt__em_contrib *a, *b, *tmp;
    if (n < 2) return DT_OK;
    DT__TRY(dt_grow(e->ctx, (void **)&e->con2, &e->con2_cap, n, sizeof(dt__em_contrib), "dt_embed gradients"));
    a = e->con; b = e->con2;
    for (i = 0; i < n; i++) if (a[i].row > maxrow) maxrow = a[i].row;
    while (bits < 63 && (maxrow >> bits) != 0) bits++;
    /* LSD radix on the row: the fewest passes of at most 12 bits (4096 buckets: the counts stay
       in L1), the digits split evenly: 100k rows (17 bits) and 10M rows (24 bits) both take two
       passes over the contributions (11-bit digits took three for 10M), a third from 2^24 rows */
    passes = (bits + 11) / 12;
    digit = (bits + passes - 1) / passes;
    mask = ((int64_t)1 << digit) - 1;
    for (shift = 0; shift < bits; shift += digit) {
        memset(cnt, 0, sizeof(int64_t) * (size_t)(mask + 2));
        for (i = 0; i < n; i++) cnt[1 + ((a[i].row >> shift) & mask)]++;
        for (k = 1; k <= mask + 1; k++) cnt[k] += cnt[k - 1];
        for (i = 0; i < n; i++) b[cnt[(a[i].row >> shift) & mask]++] = a[i];
        tmp = a; a = b; b = tmp;
    }
    if (e->n_tabs > 1) { /* by table, stable: at most 2048 tables per pass is plenty; tables are few */
        int64_t *tc;
        if (!(tc = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)(e->n_tabs + 1)))) return DT_ERR_OOM;
        memset(tc, 0, sizeof(int64_t) * (size_t)(e->n_tabs + 1));
        for (i = 0; i < n; i++) tc[1 + a[i].t]++;
        for (k = 1; k <= e->n_tabs; k++) tc[k] += tc[k - 1];
        for (i = 0; i < n; i++) b[tc[a[i].t]++] = a[i];
        dt_release(e->ctx, tc);
        tmp = a; a = b; b = tmp;
    }
    if (a != e->con) memcpy(e->con, a, (size_t)n * sizeof(dt__em_contrib));
    return DT_OK;
}

static void dt__em_mark(dt__em_tab *t, int64_t x) {
    if (t->dirty[x >> 3] & (1u << (x & 7))) return;
    t->dirty[x >> 3] |= (unsigned char)(1u << (x & 7));
    t->n_dirty++;
}

/* The sparse optimizer on one row of t with gradient g (the columns of the shard): its values at
   row (storage dtype), its state at s1, s2 (dt__em_row_at: the shard's, or a tiered table's cache). */
static void dt__em_update(const dt__em_tab *t, char *row, float *s1, float *s2, const float *g, float *scratch) {
    int64_t nc = t->c1 - t->c0, c;
    float *w = t->dtype == DT_F32 ? (float *)row : scratch;
    uint16_t *w16 = (uint16_t *)row;
    if (t->dtype == DT_BF16) for (c = 0; c < nc; c++) w[c] = dt_bf16_to_f32(w16[c]);
    if (t->dtype == DT_F16) for (c = 0; c < nc; c++) w[c] = dt_f16_to_f32(w16[c]);
    switch (t->kind) {
    case DT_EMBED_ADAGRAD:
        dt_adagrad_update(w, g, s1, nc, t->lr, 0, 0, t->eps, t->t);
        break;
    case DT_EMBED_ROWWISE_ADAGRAD: {
        double ss = 0;
        float *s = s1, m;
        for (c = 0; c < nc; c++) ss += (double)g[c] * (double)g[c];
        *s = *s + (float)(ss / (double)t->dim);
        m = (float)(t->lr / (sqrt((double)*s) + t->eps));
        for (c = 0; c < nc; c++) w[c] -= m * g[c];
        break;
    }
    case DT_EMBED_ADAM:
        dt_adam_update(w, g, s1, s2, nc, t->lr, t->b1, t->b2, t->eps, 0, 0, t->t);
        break;
    default:
        dt_sgd_update(w, g, NULL, nc, t->lr, 0, 0, 0, 0, 1);
        break;
    }
    if (t->dtype == DT_BF16) for (c = 0; c < nc; c++) w16[c] = dt_f32_to_bf16(w[c]);
    if (t->dtype == DT_F16) for (c = 0; c < nc; c++) w16[c] = dt_f32_to_f16(w[c]);
}

/* The gradient of feature f's bag b (pooled) into g[0..dim): dout, / length for mean. */
static void dt__em_bag_grad(const dt_embed *e, const float *dout, int f, int64_t b, float *g) {
    const dt__em_tab *t = &e->tabs[e->feat_tab[f]];
    const float *src = dout + b * e->pooled_dim + e->feat_off[f];
    int64_t n = e->offs[(int64_t)f * e->B + b + 1] - e->offs[(int64_t)f * e->B + b], c;
    for (c = 0; c < t->dim; c++) g[c] = t->pooling == DT_POOL_MEAN && n > 0 ? src[c] / (float)n : src[c];
}

/* Data-parallel tables: every rank's (row, gradient) pairs go to every rank. */
static dt_status dt__em_dp_grads(dt_embed *e, const float *dout, int64_t *ncon) {
    int W = e->size, f, r;
    int64_t b, j, ni = 0, nf = 0, oi, of, tri = 0, trf = 0, *cnt = e->cnt;
    double *v;
    if (W == 1) { /* one rank: its own pairs, in the same order, each gradient read where it is (sum
                     pooling: the dout row itself; sequences: seq_grad; mean: scaled into dp_f once a bag) */
        for (f = 0; f < e->n_feat; f++) {
            const dt__em_tab *t = &e->tabs[e->feat_tab[f]];
            if (t->local && t->pooling == DT_POOL_MEAN) nf += t->dim * e->B;
        }
        DT__TRY(dt__em_need(e, &e->dp_f, DT_F32, nf + 1));
        of = 0;
        for (b = 0; b < e->B; b++)
            for (f = 0; f < e->n_feat; f++) {
                const dt__em_tab *t = &e->tabs[e->feat_tab[f]];
                int64_t i0 = e->offs[(int64_t)f * e->B + b], n = e->offs[(int64_t)f * e->B + b + 1] - i0;
                const float *g = dout ? dout + b * e->pooled_dim + e->feat_off[f] : NULL;
                if (!t->local || n == 0) continue;
                if (t->pooling == DT_POOL_MEAN) {
                    float *q = (float *)e->dp_f.data + of;
                    dt__em_bag_grad(e, dout, f, b, q);
                    g = q;
                    of += t->dim;
                }
                for (j = 0; j < n; j++)
                    DT__TRY(dt__em_add_con(e, e->feat_tab[f], e->rows[i0 + j], e->wts[i0 + j],
                                           t->pooling == DT_POOL_NONE ? dt__em_dst(e, f, b, j, NULL, e->seq_grad) : g,
                                           ncon));
            }
        return DT_OK;
    }
    for (f = 0; f < e->n_feat; f++) {
        const dt__em_tab *t = &e->tabs[e->feat_tab[f]];
        int64_t n = e->offs[(int64_t)(f + 1) * e->B] - e->offs[(int64_t)f * e->B];
        if (!t->local) continue;
        ni += 5 * n;
        nf += (1 + t->dim) * n;
    }
    DT__TRY(dt__em_need(e, &e->dp_i, DT_I64, ni * W + 1));
    DT__TRY(dt__em_need(e, &e->dp_f, DT_F32, nf * W + 1));
    oi = 0; of = 0;
    for (b = 0; b < e->B; b++)
        for (f = 0; f < e->n_feat; f++) {
            const dt__em_tab *t = &e->tabs[e->feat_tab[f]];
            int64_t i0 = e->offs[(int64_t)f * e->B + b], n = e->offs[(int64_t)f * e->B + b + 1] - i0;
            if (!t->local) continue;
            for (j = 0; j < n; j++) {
                int64_t *pi = (int64_t *)e->dp_i.data + oi;
                float *pf = (float *)e->dp_f.data + of;
                pi[0] = e->feat_tab[f]; pi[1] = e->rows[i0 + j]; pi[2] = e->g0 + b; pi[3] = f; pi[4] = j;
                pf[0] = e->wts[i0 + j];
                if (t->pooling == DT_POOL_NONE)
                    memcpy(pf + 1, dt__em_dst(e, f, b, j, NULL, e->seq_grad), (size_t)t->dim * sizeof(float));
                else dt__em_bag_grad(e, dout, f, b, pf + 1);
                oi += 5; of += 1 + t->dim;
            }
        }
    for (r = 1; r < W; r++) { /* the same block for every rank */
        memcpy((int64_t *)e->dp_i.data + r * ni, e->dp_i.data, (size_t)ni * sizeof(int64_t));
        memcpy((float *)e->dp_f.data + r * nf, e->dp_f.data, (size_t)nf * sizeof(float));
    }
    if (!(v = (double *)dt_alloc(e->ctx, sizeof(double) * (size_t)(2 * W)))) return DT_ERR_OOM;
    memset(v, 0, sizeof(double) * (size_t)(2 * W));
    v[2 * e->rank] = (double)ni; v[2 * e->rank + 1] = (double)nf;
    {
        dt_status st = dt__em_sum_f64(e, v, 2 * W);
        if (st) { dt_release(e->ctx, v); return st; }
    }
    for (r = 0; r < W; r++) {
        cnt[3 * W + r] = (int64_t)v[2 * r]; cnt[4 * W + r] = (int64_t)v[2 * r + 1];
        tri += cnt[3 * W + r]; trf += cnt[4 * W + r];
        cnt[r] = ni; cnt[W + r] = nf;
    }
    dt_release(e->ctx, v);
    DT__TRY(dt__em_need(e, &e->dp_ri, DT_I64, tri + 1));
    DT__TRY(dt__em_need(e, &e->dp_rf, DT_F32, trf + 1));
    DT__TRY(dt__em_a2av(e, &e->dp_ri, &e->dp_i, cnt, cnt + 3 * W));
    DT__TRY(dt__em_a2av(e, &e->dp_rf, &e->dp_f, cnt + W, cnt + 4 * W));
    for (r = 0; r < W; r++)
        if (r != e->rank) e->stats.bytes_sent_bwd += 8.0 * (double)ni + 4.0 * (double)nf;
    oi = 0; of = 0;
    while (oi < tri) {
        const int64_t *pi = (const int64_t *)e->dp_ri.data + oi;
        const float *pf = (const float *)e->dp_rf.data + of;
        DT__TRY(dt__em_add_con(e, (int)pi[0], pi[1], pf[0], pf + 1, ncon));
        oi += 5; of += 1 + e->tabs[pi[0]].dim;
    }
    return DT_OK;
}

/* One row: its gradient so far (a pending entry's floats, or zeros), plus this backward's
   contributions con[*k..] of the same (table, row), in their sorted order. */
static void dt__em_row_grad(dt_embed *e, int64_t *k, int64_t ncon, int t, int64_t row, const float *start,
                            float *g, int64_t nc) {
    const dt__em_tab *tab = &e->tabs[t];
    const dt__em_contrib *con = e->con;
    int64_t c, kk = *k;
    if (start) memcpy(g, start, (size_t)nc * sizeof(float));
    else for (c = 0; c < nc; c++) g[c] = 0.0f;
    for (; kk < ncon && con[kk].t == t && con[kk].row == row; kk++) {
        if (kk + DT__EM_PF_IDS < ncon) { /* the gradient rows sit in random order in the receive buffer */
            const char *q = (const char *)con[kk + DT__EM_PF_IDS].g;
            size_t bytes = (size_t)(e->tabs[con[kk + DT__EM_PF_IDS].t].c1 - e->tabs[con[kk + DT__EM_PF_IDS].t].c0) *
                           sizeof(float), o;
            for (o = 0; o < bytes; o += 64) DT__EM_PF_R(q + o);
            if (bytes) DT__EM_PF_R(q + bytes - 1);
        }
        if (tab->weighted) dt__em_axpy(g, con[kk].g, con[kk].w, nc); /* g += w * src, lane by lane */
        else dt__em_add(g, con[kk].g, nc);
    }
    *k = kk;
}

static int dt__em_before(int ta, int64_t ra, int tb, int64_t rb) { return ta < tb || (ta == tb && ra < rb); }

/* Prefetch (for writing) what dt__em_update will touch of local row x: the row and its state. */
DT__EM_PF_FN void dt__em_pf_lines(const char *p, size_t bytes) { /* for writing */
    size_t o;
    if (!p || !bytes) return;
    for (o = 0; o < bytes; o += 64) DT__EM_PF_W(p + o);
    DT__EM_PF_W(p + bytes - 1); /* the last line when it is not aligned */
}

/* Prefetch (for writing) what dt__em_update will touch of local row x: the row and its state; a
   tiered table's in its cache slot `slot` (the forward's; nothing when unknown). */
DT__EM_PF_FN void dt__em_pf_update(const dt__em_tab *t, int64_t x, int64_t slot) {
    const dt__em_tier *c = t->tier;
    size_t nc = (size_t)(t->c1 - t->c0), sb = (t->kind == DT_EMBED_ROWWISE_ADAGRAD ? 1 : nc) * sizeof(float);
    if (t->dirty) DT__EM_PF_W(&t->dirty[x >> 3]); /* its bit in the changed-rows map (dt__em_mark) */
    if (c) {
        if (slot < 0 || slot >= c->cap) return; /* (cap, not filled: the helper may be filling slots) */
        dt__em_pf_slot(c, slot);
        dt__em_pf_lines(c->cw + slot * c->rb, (size_t)c->rb);
        if (c->sn1) dt__em_pf_lines((const char *)(c->cs1 + slot * c->sn1), sizeof(float) * (size_t)c->sn1);
        if (c->sn2) dt__em_pf_lines((const char *)(c->cs2 + slot * c->sn2), sizeof(float) * (size_t)c->sn2);
        return;
    }
    dt__em_pf_row(t, x + t->r0, 1);
    if (t->s1.data) dt__em_pf_lines((const char *)t->s1.data + (size_t)x * sb, sb);
    if (t->s2.data) dt__em_pf_lines((const char *)t->s2.data + (size_t)x * nc * sizeof(float), nc * sizeof(float));
}

/* Merges this backward's sorted contributions with the pending rows (both sorted by (table,
   row)). sync 1: every merged row is updated and nothing stays pending; sync 0: the merged rows
   become the pending list. */
static dt_status dt__em_apply(dt_embed *e, int64_t ncon) {
    int64_t k = 0, j = 0, n2 = 0, fl = 0;
    if (!e->sync) { /* the new pending list holds at most every pending row + every new row */
        int64_t need = e->n_pend + ncon, floats = 0, i;
        for (i = 0; i < e->n_pend; i++) floats += e->tabs[e->pend[i].t].c1 - e->tabs[e->pend[i].t].c0;
        for (i = 0; i < ncon; i++) floats += e->tabs[e->con[i].t].c1 - e->tabs[e->con[i].t].c0;
        DT__TRY(dt_grow(e->ctx, (void **)&e->pend2, &e->pend2_cap, need + 1, sizeof(dt__em_pend), "dt_embed pending rows"));
        DT__TRY(dt_grow(e->ctx, (void **)&e->pvals2, &e->pv2_cap, floats + 1, sizeof(float), "dt_embed pending gradients"));
    }
    while (k < ncon || j < e->n_pend) {
        int from_pend = k >= ncon || (j < e->n_pend && !dt__em_before(e->con[k].t, e->con[k].row, e->pend[j].t, e->pend[j].row));
        int t = from_pend ? e->pend[j].t : e->con[k].t;
        int64_t row = from_pend ? e->pend[j].row : e->con[k].row;
        dt__em_tab *tab = &e->tabs[t];
        int64_t nc = tab->c1 - tab->c0;
        const float *start = NULL;
        float *g;
        int64_t k0 = k; /* this row's first contribution (its cache slot, for a tiered table) */
        if (from_pend) { start = e->pvals + e->pend[j].off; j++; }
        if (e->sync && k + DT__EM_PF_IDS < ncon) /* a row a few contributions ahead (often the next rows) */
            dt__em_pf_update(&e->tabs[e->con[k + DT__EM_PF_IDS].t], e->con[k + DT__EM_PF_IDS].row,
                             e->con[k + DT__EM_PF_IDS].slot);
        if (e->sync) {
            if (2 * nc > e->gtmp_cap)
                DT__TRY(dt_grow(e->ctx, (void **)&e->gtmp, &e->gtmp_cap, 2 * nc, sizeof(float), "dt_embed row gradient"));
            g = e->gtmp;
        } else {
            g = e->pvals2 + fl;
            e->pend2[n2].t = t; e->pend2[n2].row = row; e->pend2[n2].off = fl;
            n2++; fl += nc;
        }
        dt__em_row_grad(e, &k, ncon, t, row, start, g, nc);
        if (e->sync) {
            if (e->cuda) { /* updated on the device below (tier HOST: in its cache slot, held since its forward) */
                int64_t x = row;
                if (tab->tier && tab->shard != DT_SHARD_DATA && !dt__em_get(&tab->tier->where, row, &x)) /* (data-
                                                                       parallel: rows, in the host memory) */
                    return dt_ctx_set_error(e->ctx, DT_ERR_STATE, "dt_embed_backward: table \"%s\": local row %lld "
                                            "left the cache before its update", tab->name, (long long)row);
                DT__TRY(dt__em_cuda_stage(e, t, x, g, nc));
            }
            else {
                char *wr;
                float *p1, *p2;
                int64_t k;
                DT__TRY(dt__em_row_at(e, tab, row, DT__EM_NOW, from_pend ? -1 : e->con[k0].slot, &wr, &p1, &p2, &k));
                dt__em_update(tab, wr, p1, p2, g, e->gtmp + nc);
                if (k >= 0) tab->tier->sl[k].dirty = 1;
            }
            dt__em_mark(tab, row);
            e->stats.rows_updated++;
        }
    }
    if (e->sync && e->cuda) DT__TRY(dt__em_cuda_flush(e));
    if (e->sync) { e->n_pend = 0; return DT_OK; }
    { /* swap the lists */
        dt__em_pend *tp = e->pend; float *tv = e->pvals; int64_t c;
        e->pend = e->pend2; e->pend2 = tp;
        e->pvals = e->pvals2; e->pvals2 = tv;
        c = e->pend_cap; e->pend_cap = e->pend2_cap; e->pend2_cap = c;
        c = e->pv_cap; e->pv_cap = e->pv2_cap; e->pv2_cap = c;
        e->n_pend = n2;
    }
    return DT_OK;
}

DT_API dt_status dt_embed_set_sync(dt_embed *e, int sync) {
    if (!e) return DT_ERR_ARG;
    if (sync != 0 && sync != 1)
        return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "dt_embed_set_sync: sync = %d; expected 1 (update at this "
                                "backward) or 0 (accumulate)", sync);
    if (!sync && e->cuda && e->any_dyn)
        return dt_ctx_set_error(e->ctx, DT_ERR_UNSUPPORTED, "dt_embed_set_sync: sync = 0 with dynamic tables on cuda "
                                "(desc.device); the GPU id table (kernels/dt_hash.cu) protects one forward's slots "
                                "only, not an accumulation window's: accumulate on cpu tables");
    e->sync = sync;
    return DT_OK;
}

DT_API dt_status dt_embed_backward(dt_embed *e, const dt_tensor *dout) {
    const char *fn = "dt_embed_backward";
    int W, r, i;
    int64_t *cnt, k, c, tot = 0, ncon = 0, p = 0, q = 0, o = 0;
    const float *dd = NULL;
    dt_status st = DT_OK;
    double t0 = dt__em_now(), flag[1];
    int dev;
    if (!e) return DT_ERR_ARG;
    /* the device path (accumulating on the device too, dt__em_cuda_apply) */
    dev = e->n_pend == 0 && dt__em_cuda_dev(e);
    W = e->size;
    cnt = e->cnt;
    if (e->phase != 2) st = dt_ctx_set_error(e->ctx, DT_ERR_STATE, "%s: no dt_embed_forward since the last backward", fn);
    if (!st && e->pooled_dim > 0) {
        if (!dout) st = dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: dout is NULL; expected [%lld, %lld]", fn,
                                         (long long)e->B, (long long)e->pooled_dim);
        else st = e->cuda ? dt__em_cuda_check(e, dout, fn, "dout") : dt_check_tensor(e->ctx, dout, DT_F32, fn, "dout");
        if (!st && (dout->ndim != 2 || dout->shape[0] != e->B || dout->shape[1] != e->pooled_dim)) {
            char s1[64];
            st = dt_ctx_set_error(e->ctx, DT_ERR_SHAPE, "%s: dout is %s; expected [%lld, %lld] (local batch, pooled dim)",
                                  fn, dt_shape_str(dout, s1, sizeof s1), (long long)e->B, (long long)e->pooled_dim);
        }
        if (!st) st = dt__em_apart(e, dout, 0, fn, "dout"); /* before the flag: every rank stops together */
        if (!st && e->cuda && !dev) /* a host copy: the gradients are sorted there */
            st = dt__em_cuda_host_dout(e, &dd, dout);
        else if (!st) dd = (const float *)dout->data;
    }
    flag[0] = st ? 1 : 0;
    {
        dt_status cs = dt__em_sum_f64(e, flag, 1);
        if (cs) return cs;
    }
    if (flag[0] > 0) {
        if (st) return st;
        return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: a bad dout or call order on another rank; see its message", fn);
    }
    e->phase = 3; /* the sequence views stay readable until the next forward */
    if (e->sync) for (i = 0; i < e->n_tabs; i++) e->tabs[i].t++; /* t counts updates */
    e->acc_open = !e->sync;
    if (dev) {
        DT__TRY(dt__em_cuda_backward(e, dout, &ncon));
        if (e->sync && e->any_tier) dt__em_tier_touched(e); /* the slots the update changed */
        e->stats.backwards++;
        e->stats.seconds_bwd += dt__em_now() - t0;
        return DT_OK;
    }
    /* gradients of every request, laid out as its result was (the res buffer is free now) */
    for (k = 0; k < e->n_segs; k++) {
        const dt__em_seg *s = &e->segs[k];
        const dt__em_tab *t = &e->tabs[e->feat_tab[s->f]];
        float *g = (float *)e->res.data + s->res;
        if (t->pooling == DT_POOL_NONE) {
            const float *src = dt__em_dst(e, s->f, s->b, s->pos, NULL, e->seq_grad) + s->c0;
            memcpy(g, src, (size_t)s->nc * sizeof(float));
        } else {
            const float *src = dd + s->b * e->pooled_dim + e->feat_off[s->f] + s->c0;
            int64_t n = e->offs[(int64_t)s->f * e->B + s->b + 1] - e->offs[(int64_t)s->f * e->B + s->b];
            if (t->pooling == DT_POOL_MEAN && n > 0) for (c = 0; c < s->nc; c++) g[c] = src[c] / (float)n;
            else memcpy(g, src, (size_t)s->nc * sizeof(float));
        }
    }
    for (r = 0; r < W; r++) tot += cnt[5 * W + r];
    DT__TRY(dt__em_need(e, &e->grad_in, DT_F32, tot + 1));
    DT__TRY(dt__em_a2av(e, &e->grad_in, &e->res, cnt + 2 * W, cnt + 5 * W));
    for (r = 0; r < W; r++)
        if (r != e->rank) e->stats.bytes_sent_bwd += 4.0 * (double)cnt[2 * W + r];
    /* owner: one contribution per id of every request served */
    {
        const int64_t *rin = (const int64_t *)e->rbuf_i.data;
        const float *rfl = (const float *)e->rbuf_f.data, *gin = (const float *)e->grad_in.data;
        int64_t end = 0;
        for (r = 0; r < W; r++) end += cnt[3 * W + r];
        while (p < end) {
            int f = (int)rin[p];
            int64_t n = rin[p + 3], j;
            int ti = e->feat_tab[f];
            const dt__em_tab *t = &e->tabs[ti];
            for (j = 0; j < n; j++)
                if (rin[p + DT__EM_HDR + j] >= 0) { /* a dynamic id not admitted has no row to update */
                    DT__TRY(dt__em_add_con(e, ti, rin[p + DT__EM_HDR + j] - t->r0,
                                           e->any_weighted ? rfl[q + j] : 1.0f, gin + o, &ncon));
                    if (t->tier && !e->cuda) e->con[ncon - 1].slot = e->tslot[p + DT__EM_HDR + j];
                }
            o += t->c1 - t->c0;
            p += DT__EM_HDR + n;
            if (e->any_weighted) q += n;
        }
    }
    if (e->any_dp) DT__TRY(dt__em_dp_grads(e, dd, &ncon));
    /* dedup by sort, sum each row's contributions in the one order, update (or keep) */
    DT__TRY(dt__em_sort(e, ncon));
    DT__TRY(dt__em_apply(e, ncon));
    if (e->sync && e->any_tier && e->cuda) dt__em_tier_touched(e); /* the slots the update changed */
    e->stats.backwards++;
    e->stats.seconds_bwd += dt__em_now() - t0;
    return DT_OK;
}

/* ==== >>tier: prefetch, flush, counters (the cache itself: before >>forward) ================= */

/* The batch a prefetch began, as a few numbers, so that the forward can check it is given the
   same one: its shape, its lengths' hash, then (once the lengths agree, so the ids may be read)
   its ids' and weights' hash: FNV-1a's step over 8-byte words with a shift that mixes the high
   bits down (it catches a wrong batch passed by mistake; it is no defence against an adversary). */
static uint64_t dt__em_fnv(uint64_t h, const void *p, size_t n) { /* 8 bytes a round, then the tail */
    const unsigned char *b = (const unsigned char *)p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 1099511628211ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
static int dt__em_pf_same(const dt_embed *e, const dt_kjt *k) {
    int64_t nl, i, n = 0;
    uint64_t h = 1469598103934665603ull;
    if (!k || k->n_features != e->pf_nf || k->batch != e->pf_B || (k->batch > 0 && !k->lengths)) return 0;
    nl = (int64_t)k->n_features * k->batch;
    if (nl > 0 && dt__em_fnv(1469598103934665603ull, k->lengths, sizeof(int64_t) * (size_t)nl) != e->pf_hl) return 0;
    for (i = 0; i < nl; i++) n += k->lengths[i];
    if (n != e->pf_nids || (n > 0 && !k->ids)) return 0;
    if (n > 0) h = dt__em_fnv(h, k->ids, (size_t)n * (k->ids_dtype == DT_I32 ? 4u : 8u));
    if (n > 0 && k->weights) h = dt__em_fnv(h, k->weights, sizeof(float) * (size_t)n);
    return h == e->pf_hi;
}
static void dt__em_pf_remember(dt_embed *e, const dt_kjt *k) {
    int64_t nl = (int64_t)k->n_features * k->batch, i, n = 0;
    uint64_t h = 1469598103934665603ull;
    e->pf_nf = k->n_features; e->pf_B = k->batch;
    e->pf_hl = nl > 0 ? dt__em_fnv(h, k->lengths, sizeof(int64_t) * (size_t)nl) : 0;
    for (i = 0; i < nl; i++) n += k->lengths[i];
    e->pf_nids = n;
    if (n > 0) h = dt__em_fnv(h, k->ids, (size_t)n * (k->ids_dtype == DT_I32 ? 4u : 8u));
    if (n > 0 && k->weights) h = dt__em_fnv(h, k->weights, sizeof(float) * (size_t)n);
    e->pf_hi = h;
}

/* A prefetch's lookups of a static tiered table's rows ids[0, n) (global), their slots into
   slot[] (-1: none found; the forward fetches). Pipelined, as the lines each lookup touches are
   far apart in memory: the map's line is fetched 8 ids ahead; 4 ahead the map is probed and the
   slot's line fetched (a miss: its place in the log's index); 2 ahead the slot's LRU neighbours
   (a first use this epoch moves it to the tail). The slot probed ahead is only a hint (an
   eviction in between may take it): dt__em_tier_use checks it, and a hit already pinned for the
   batch stops there. One probe per hit. */
static dt_status dt__em_pf_lookups(dt_embed *e, dt__em_tab *t, const int64_t *ids, int64_t *slot, int64_t n) {
    dt__em_tier *c = t->tier;
    int64_t ring[8], j, s, k, until = e->epoch + e->pf_ahead;
    for (j = 0; j < n && j < 4; j++) ring[j] = dt__em_get(&c->where, ids[j] - t->r0, &s) ? s : -1;
    for (j = 0; j < n; j++) {
        int64_t x = ids[j] - t->r0, h = ring[j & 7];
        if (j + 8 < n) dt__em_pf_map(&c->where, ids[j + 8] - t->r0);
        if (j + 4 < n) {
            int64_t y = ids[j + 4] - t->r0;
            ring[(j + 4) & 7] = dt__em_get(&c->where, y, &s) ? s : -1;
            if (ring[(j + 4) & 7] >= 0) DT__EM_PF_W(&c->sl[s]);
            else if (c->loc) DT__EM_PF_R(&c->loc[y]);
        }
        if (!c->lfu && j + 2 < n && ring[(j + 2) & 7] >= 0) {
            const dt__em_slot *q = &c->sl[ring[(j + 2) & 7]];
            if (q->prev >= 0 && q->prev < c->cap) DT__EM_PF_W(&c->sl[q->prev]);
            if (q->next >= 0 && q->next < c->cap) DT__EM_PF_W(&c->sl[q->next]);
        }
        if (!c->lfu && h >= 0 && h < c->filled && c->sl[h].row == x && c->sl[h].pin >= until) { /* pinned already */
            c->st.hits++;
            slot[j] = h;
            continue;
        }
        DT__TRY(dt__em_tier_use(e, t, x, h, until, DT__EM_LATER, 1, &k));
        if (k < 0) return DT_OK; /* every slot is held: the forward fetches the rest (or names it) */
        slot[j] = k;
    }
    return DT_OK;
}

/* The live batch (begun, its ids received): the rows of tiered tables it will read (skip_pfa: but
   those the helper looks up, dt__em_pf_post), reserved in the cache (pinned through the next
   epoch) and their copies queued. A row that finds no slot
   (the batch in flight holds them all) is left to the forward. Dynamic tables: ids that have a
   slot now (peeked, the policy untouched: admissions happen in the forward's order). */
static dt_status dt__em_pf_reserve(dt_embed *e, int skip_pfa) {
    const int64_t *rin = (const int64_t *)e->rbuf_i.data;
    int64_t p = 0, j, b, k, x;
    int f, full;
    DT__TRY(dt_grow(e->ctx, (void **)&e->tslot, &e->tslot_cap, e->rbuf_n + 1, sizeof(int64_t), "dt_embed cache slots"));
    for (j = 0; j < e->rbuf_n; j++) e->tslot[j] = -1;
    while (p < e->rbuf_n) {
        int ti = e->feat_tab[rin[p]];
        dt__em_tab *t = &e->tabs[ti];
        int64_t n = rin[p + 3];
        if (skip_pfa && t->tier && t->tier->pfa) { p += DT__EM_HDR + n; continue; } /* (the helper's: dt__em_pf_job) */
        /* (cuda: a dynamic table's id -> slot map is the GPU's, the host's is not kept: its rows
           come with the forward) */
        if (t->tier && !t->dynamic) { /* static rows: pipelined (dt__em_pf_lookups) */
            DT__TRY(dt__em_pf_lookups(e, t, rin + p + DT__EM_HDR, e->tslot + p + DT__EM_HDR, n));
            p += DT__EM_HDR + n;
            continue;
        }
        for (j = 0, full = 0; t->tier && !(t->dynamic && e->cuda) && !full && j < n; j++) {
            int64_t row = rin[p + DT__EM_HDR + j];
            int h = (int)(dt_embed_hash_id(row) % (uint64_t)t->n_hs) - t->hs_first;
            if (!dt__em_get(&t->hs[h].map, row, &x)) continue; /* admitted (and written) by the forward */
            DT__TRY(dt__em_tier_slot(e, t, x, e->epoch + e->pf_ahead, DT__EM_LATER, 1, &k));
            if (k < 0) full = 1; /* (a dynamic id's row is its slot's: its hint comes later) */
        }
        p += DT__EM_HDR + n;
    }
    for (f = 0; e->any_dp && !e->cuda && f < e->n_feat; f++) { /* data-parallel tables: this rank's own ids
                                                                    (cuda: no cache, see dt__em_cuda_w) */
        dt__em_tab *t = &e->tabs[e->feat_tab[f]];
        if (t->shard != DT_SHARD_DATA || !t->tier) continue;
        full = 0;
        for (b = 0; b < e->B && !full; b++)
            for (j = e->offs[(int64_t)f * e->B + b]; j < e->offs[(int64_t)f * e->B + b + 1]; j++) {
                DT__TRY(dt__em_tier_slot(e, t, e->rows[j], e->epoch + e->pf_ahead, DT__EM_LATER, 1, &k));
                if (k < 0) { full = 1; break; }
            }
    }
    return DT_OK;
}

/* The prefetch's lookups on the helper thread (dt__em_pf_post): with POSIX threads, on the CPU,
   those of the tiered tables that are static, LRU and not data-parallel (c->pfa; the others'
   stay in the caller's thread, dt__em_pf_reserve, before the post: LFU's pin lists allocate, a
   dynamic table's admissions are the forward's, a data-parallel table's ids are the live
   batch's books). The lookups and then every queued copy run while the caller computes the batch
   in flight. Until their join (dt__em_pf_join: the next forward, or any call but the backward)
   the caller touches no cache book but one line of each slot the forward of the batch in flight
   found, pinned, which the helper neither evicts nor fills: the update reads the slot's row and
   writes its bytes, its dirty mark (and LFU's use count, of a table the helper does not look up;
   dt__em_row_at: anything else joins first); the helper may read the slot's row and move its pin
   and list links (a hit of the next batch): other fields of the line. Nothing the helper does
   allocates (the map and the copy list are sized before) or reports an error (its status comes
   with the join). bench/embed --tiers: the prefetch's ~16 ms a step of lookups left the
   training thread. */
static int dt__em_pf_async(const dt_embed *e) {
#ifdef DT__EM_THREADS
    int i;
    if (e->cuda || !e->pfq || !e->pfq->threaded || e->pf_sync) return 0;
    for (i = 0; i < e->n_tabs; i++)
        if (e->tabs[i].tier && e->tabs[i].tier->pfa) return 1;
    return 0;
#else
    (void)e;
    return 0;
#endif
}

/* On the helper: the posted lookups (dt__em_pf_lookups of each tiered table's requests; q->inl:
   a drain in between, a fold's, runs the copies queued so far here). The copies queued are then
   published: the helper runs them after the join, while the forward waits per row. */
#ifdef DT__EM_THREADS
static dt_status dt__em_pf_job(dt_embed *e) {
    dt__em_pfq *q = e->pfq;
    const int64_t *rin = e->pfj_rin;
    int64_t p = 0;
    dt_status st = DT_OK;
    q->inl = 1;
    while (!st && p < e->pfj_n) {
        dt__em_tab *t = &e->tabs[e->feat_tab[rin[p]]];
        int64_t n = rin[p + 3];
        if (t->tier && t->tier->pfa) st = dt__em_pf_lookups(e, t, rin + p + DT__EM_HDR, e->pfj_slot + p + DT__EM_HDR, n);
        p += DT__EM_HDR + n;
    }
    q->inl = 0;
    return st;
}
#endif

/* The live batch's lookups of c->pfa tables posted to the helper (after dt__em_pf_reserve of the
   others): what they may allocate, allocated here first (each map room for a full cache, the
   copy list room for a write-back and a fetch per id). */
static dt_status dt__em_pf_post(dt_embed *e, dt__em_pfq *q) {
    int i;
    for (i = 0; i < e->n_tabs; i++)
        if (e->tabs[i].tier && e->tabs[i].tier->pfa) DT__TRY(dt__em_map_fit(e->ctx, &e->tabs[i].tier->where, e->tabs[i].tier->cap));
    DT__TRY(dt_grow(e->ctx, (void **)&q->q, &q->cap, q->n + 2 * e->rbuf_n + 1, sizeof(dt__em_cp), "dt_embed prefetch copies"));
    e->pfj_rin = (const int64_t *)e->rbuf_i.data;
    e->pfj_n = e->rbuf_n;
    e->pfj_slot = e->tslot;
#ifdef DT__EM_THREADS
    pthread_mutex_lock(&q->mu);
    q->job = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    e->pfj = 1;
#endif
    return DT_OK;
}

/* Waits for the lookups posted to the helper, if any; count 1 (a forward): the wait is each
   tiered table's prefetch wait. A failure (none is known: nothing there allocates) is the
   prefetched batch's forward's, on every rank (as a cache too small); the rows not reserved are
   looked up by the forward. */
static void dt__em_pf_join(dt_embed *e, int count) {
#ifdef DT__EM_THREADS
    dt__em_pfq *q = e->pfq;
    dt_status st;
    double t0, w;
    int i;
    if (!e->pfj) return;
    t0 = dt__em_now();
    pthread_mutex_lock(&q->mu);
    while (q->job) pthread_cond_wait(&q->cv, &q->mu);
    st = q->job_st;
    e->pfq_seen = q->done;
    pthread_mutex_unlock(&q->mu);
    e->pfj = 0;
    w = dt__em_now() - t0;
    for (i = 0; count && i < e->n_tabs; i++)
        if (e->tabs[i].tier) e->tabs[i].tier->st.seconds_wait += w;
    if (st && !e->tier_st) {
        e->tier_st = st;
        snprintf(e->tier_msg, sizeof e->tier_msg, "dt_embed_prefetch: its lookups on the helper thread failed (%s)",
                 dt_status_name(st));
    }
#else
    (void)e; (void)count;
#endif
}

DT_API dt_status dt_embed_prefetch(dt_embed *e, const dt_kjt *next) {
    int ahead;
    dt_status st;
    dt__em_pfq *q = NULL;
    if (!e) return DT_ERR_ARG;
    dt__em_pf_join(e, 0); /* the last prefetch's, when no forward came between */
    ahead = e->phase == 2;
    DT__TRY(dt__em_fbegin(e, next, DT_OK)); /* every rank fails alike on a bad batch */
    e->pf_pending = 1;
    dt__em_pf_remember(e, next);
    if (!e->any_tier) return DT_OK;
    if (!e->cuda) { /* cuda (tier HOST): the copies run on a copy stream instead (dt__em_cuda_tier_prefetch) */
        dt__em_pfq_drain(e); /* the last prefetch's copies are done (its forward waited for them) */
        DT__TRY(dt__em_pfq_get(e, &q));
    }
    e->pf_ahead = ahead; /* its rows are pinned from the next epoch (begun ahead), else from this one */
    if (ahead) dt__em_swap(e); /* the new batch is the live one for a moment */
    {
        double tw = dt__em_now();
        st = dt__em_wait_all(e); /* its ids, from every rank: the owners need them to know the rows */
        e->stats.seconds_wait += dt__em_now() - tw;
    }
    if (!st) {
        int a = dt__em_pf_async(e);
        st = dt__em_pf_reserve(e, a); /* (tslot set to -1: the job's tables are left to it) */
        if (!st && a) st = dt__em_pf_post(e, q);
    }
    e->tier_pf = 1;
    if (ahead) dt__em_swap(e);
    if (e->cuda) { /* what was queued runs, even after a failure (the slots hold its rows) */
        dt_status s2 = dt__em_cuda_tier_prefetch(e);
        if (!st) st = s2;
    } else if (!e->pfj) dt__em_pfq_publish(q);
    if (st) e->pf_pending = 0;
    return st;
}

/* dt_embed_forward of the batch a prefetch began: the same batch (every rank checks, then they
   agree), then its end. */
static dt_status dt__em_pf_forward(dt_embed *e, dt_tensor *out, const dt_kjt *kjt) {
    dt_status st = dt__em_check_out(e, out, kjt ? kjt->batch : 0);
    double flag[1];
    if (!st && !dt__em_pf_same(e, kjt))
        st = dt_ctx_set_error(e->ctx, DT_ERR_ARG, "dt_embed_forward: kjt is not the batch given to dt_embed_prefetch "
                              "(its batch size, lengths, ids or weights differ); expected the prefetched batch");
    flag[0] = st ? 1 : 0;
    DT__TRY(dt__em_sum_f64(e, flag, 1));
    e->pf_pending = 0;
    if (flag[0] > 0) { /* the begun batch is dropped on every rank (its ids all arrived at the prefetch) */
        if (e->phase == 1) e->phase = 0;
        else if (e->aside.phase == 1) e->aside.phase = 0;
        if (st) return st;
        return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "dt_embed_forward: a bad out or batch on another rank after "
                                "dt_embed_prefetch; see its message");
    }
    return dt_embed_forward_end(e, out);
}

DT_API dt_status dt_embed_flush(dt_embed *e) {
    if (!e) return DT_ERR_ARG;
    dt__em_pf_join(e, 0);
    return dt__em_tier_settle(e);
}

DT_API dt_status dt_embed_tier_stats_get(const dt_embed *e, int table, dt_embed_tier_stats *out) {
    if (!e || !out) return DT_ERR_ARG;
    dt__em_pf_join((dt_embed *)e, 0); /* (the counters the helper moves) */
    if (table < 0 || table >= e->n_tabs)
        return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "dt_embed_tier_stats_get: table = %d; expected a table in [0, %d)",
                                table, e->n_tabs);
    memset(out, 0, sizeof *out);
    if (e->tabs[table].tier) {
        *out = e->tabs[table].tier->st;
        out->cached = e->tabs[table].tier->filled;
    }
    return DT_OK;
}

/* ==== >>ckpt: checkpoints, export, stats, local shard ========================================= */

DT_API dt_status dt_embed_stats_get(const dt_embed *e, dt_embed_stats *out) {
    if (out) memset(out, 0, sizeof *out);
    if (!e || !out) return DT_ERR_ARG;
    *out = e->stats;
#ifdef DT_CUDA
    if (e->cu_uniq.data) { /* the data-parallel backward counts its unique rows on the device */
        int64_t u = 0;
        DT__TRY(dt__em_cuda_get((dt_embed *)e, &u, e->cu_uniq.data, sizeof u));
        out->rows_updated += u;
    }
#endif
    return DT_OK;
}

DT_API dt_status dt_embed_local_shard(dt_embed *e, dt_tensor *view, int64_t *row0, int64_t *col0, int table) {
    dt__em_tab *t;
    if (view) memset(view, 0, sizeof *view); /* the outputs are written on every path, errors too */
    if (row0) *row0 = 0;
    if (col0) *col0 = 0;
    if (!e) return DT_ERR_ARG;
    dt__em_pf_join(e, 0);
    if (!view) return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "dt_embed_local_shard: view is NULL");
    if (table < 0 || table >= e->n_tabs)
        return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "dt_embed_local_shard: table = %d; expected [0, %d)", table, e->n_tabs);
    t = &e->tabs[table];
    memset(view, 0, sizeof *view);
    if (t->tier) DT__TRY(dt__em_tier_settle(e)); /* the slow tier, holding every row (dt_embed_flush) */
    if (t->w.data) *view = t->w;
    else { view->dtype = t->dtype; view->device = DT_CPU; view->ndim = 2; view->shape[1] = 0; }
    view->owns = 0;
    if (row0) *row0 = t->r0;
    if (col0) *col0 = t->c0;
    return DT_OK;
}

/* ---------------------------------------------------------------- checkpoints, export */

/* The local shards as a parameter set of views (dt_checkpoint_* reshard by global_shape/start). */
static dt_status dt__em_params(dt_embed *e, dt_params *ps, dt_param **store, dt_tensor *steps) {
    dt_tensor_desc d;
    int i, k, n = 0;
    dt_param *p;
    memset(ps, 0, sizeof *ps);
    *store = NULL;
    memset(&d, 0, sizeof d);
    d.dtype = DT_I64; d.device = DT_CPU; d.shape[0] = e->n_tabs; d.ndim = 1;
    DT__TRY(dt_tensor_create(e->ctx, steps, &d));
    for (i = 0; i < e->n_tabs; i++) ((int64_t *)steps->data)[i] = e->tabs[i].t;
    p = (dt_param *)dt_alloc(e->ctx, sizeof(dt_param) * (size_t)(6 * e->n_tabs + 1));
    ps->items = (dt_param **)dt_alloc(e->ctx, sizeof(dt_param *) * (size_t)(6 * e->n_tabs + 1));
    if (!p || !ps->items) { dt_release(e->ctx, p); dt_release(e->ctx, ps->items); ps->items = NULL; return DT_ERR_OOM; }
    memset(p, 0, sizeof(dt_param) * (size_t)(6 * e->n_tabs + 1));
    *store = p;
    snprintf(p[0].name, DT_NAME_MAX, "embed/steps");
    p[0].value = *steps; p[0].value.owns = 0;
    p[0].global_shape[0] = e->n_tabs;
    ps->items[n++] = &p[0];
    for (i = 0; i < e->n_tabs; i++) {
        dt__em_tab *t = &e->tabs[i];
        const dt_tensor *ts[6];
        const char *nm[6];
        if (!t->w.data) continue;
        ts[0] = &t->w; nm[0] = "weight";
        ts[1] = t->s1.data ? &t->s1 : NULL; nm[1] = t->kind == DT_EMBED_ADAM ? "exp_avg" : t->kind == DT_EMBED_ADAGRAD ? "sum" : "rowsum";
        ts[2] = t->s2.data ? &t->s2 : NULL; nm[2] = "exp_avg_sq";
        ts[3] = t->dynamic ? &t->slot_id : NULL; nm[3] = "slot_id";       /* the id in each slot */
        ts[4] = t->dynamic ? &t->slot_stamp : NULL; nm[4] = "slot_stamp"; /* its last use */
        ts[5] = t->slot_count.data ? &t->slot_count : NULL; nm[5] = "slot_count"; /* LFU: its uses */
        for (k = 0; k < 6; k++) {
            dt_param *q = &p[n];
            if (!ts[k]) continue;
            snprintf(q->name, DT_NAME_MAX, "embed/%.63s/%.12s", t->name, nm[k]);
            q->value = *ts[k]; q->value.owns = 0;
            q->global_shape[0] = t->rows; q->start[0] = t->r0;
            if (ts[k]->ndim == 2) { q->global_shape[1] = t->dim; q->start[1] = t->c0; }
            q->sharded = t->r1 - t->r0 != t->rows || t->c1 - t->c0 != t->dim;
            ps->items[n++] = q;
        }
    }
    ps->count = ps->capacity = n;
    return DT_OK;
}

static dt_status dt__em_ckpt_desc(dt_embed *e, dt_checkpoint_desc *d, const dt_checkpoint_desc *desc, const char *fn) {
    if (!desc) return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: desc is NULL", fn);
    if (desc->comm && desc->comm != e->comm)
        return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: desc.comm is not the dt_embed's comm; expected it or NULL", fn);
    *d = *desc;
    d->comm = e->comm;
    return DT_OK;
}

DT_API dt_status dt_embed_checkpoint_save(dt_embed *e, const dt_train_state *state, const dt_checkpoint_desc *desc) {
    dt_params ps;
    dt_param *store = NULL;
    dt_tensor steps;
    dt_checkpoint_desc d;
    dt_status st;
    if (!e) return DT_ERR_ARG;
    dt__em_pf_join(e, 0);
    DT__TRY(dt__em_ckpt_desc(e, &d, desc, "dt_embed_checkpoint_save"));
    if (e->cuda) DT__TRY(dt__em_cuda_dyn_pull(e));
    memset(&ps, 0, sizeof ps);
    st = dt__em_tier_settle(e); /* tiered tables are saved from their slow tier */
    memset(&steps, 0, sizeof steps);
    if (!st) st = dt__em_params(e, &ps, &store, &steps);
    if (!st) st = dt_checkpoint_save(e->ctx, &ps, NULL, state, &d);
    dt_release(e->ctx, ps.items);
    dt_release(e->ctx, store);
    dt_tensor_free(e->ctx, &steps);
    return st;
}

static int dt__em_i64_cmp(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* A load's dynamic tables as they will be, built before anything changes (so a corrupt record
   fails the load with the tables, optimizer state, step and pending gradients untouched): per
   table the checkpoint's slots (ids, stamps, LFU counts), and the maps, lists and shards
   rebuilt from them, swapped in at the commit. A table whose ids sit in other shards' slots
   (saved with another hash_shards) is only checked here (each shard's ids fit, no id twice);
   its ids move after the commit. */
typedef struct dt__em_ldt {
    int64_t *buf;                /* [3 x local slots]: ids, stamps, LFU counts */
    int64_t *prev, *next;
    dt__em_dyn *hs;
    int move;                    /* saved with another hash_shards: dt__em_dyn_move at the commit */
} dt__em_ldt;
typedef struct dt__em_ld {
    dt_embed *e;
    dt_params *ps;
    dt__em_ldt *tb;              /* [n_tabs] */
} dt__em_ld;

static void dt__em_ld_free(dt_embed *e, dt__em_ld *ld) {
    int i, h;
    for (i = 0; ld->tb && i < e->n_tabs; i++) {
        dt__em_ldt *l = &ld->tb[i];
        for (h = 0; l->hs && h < e->tabs[i].hs_count; h++) {
            dt__em_mfree(e->ctx, &l->hs[h].map);
            dt__em_mfree(e->ctx, &l->hs[h].seen);
        }
        dt_release(e->ctx, l->hs); dt_release(e->ctx, l->buf); dt_release(e->ctx, l->prev); dt_release(e->ctx, l->next);
    }
    dt_release(e->ctx, ld->tb);
    ld->tb = NULL;
}

/* The checkpoint's values of the parameter that views data (a slot tensor), into dst. */
static dt_status dt__em_ld_peek(const dt__em_ld *ld, struct dt__ck_load *L, const void *data, int64_t *dst) {
    int i;
    for (i = 0; i < ld->ps->count; i++)
        if (ld->ps->items[i]->value.data == data) return dt__checkpoint_peek(ld->e->ctx, L, ld->ps->items[i], dst);
    return dt_ctx_set_error(ld->e->ctx, DT_ERR_STATE, "dt_embed_checkpoint_load: a slot tensor is not in the load");
}

/* st on every rank: its own failure, or DT_ERR_OOM naming another rank's (they only allocate). */
static dt_status dt__em_ld_agree(dt_embed *e, dt_status st) {
    double f[1];
    f[0] = st ? 1 : 0;
    if (dt__em_sum_f64(e, f, 1) && !st) return DT_ERR_COMM;
    if (!st && f[0] > 0)
        return dt_ctx_set_error(e->ctx, DT_ERR_OOM, "dt_embed_checkpoint_load: another rank could not allocate the "
                                "move of a dynamic table's ids; see its message");
    return st;
}

/* A table saved with another hash_shards: each filled slot's id goes to the rank of its new
   shard (ids only), which checks that its shards' ids fit their slots and that no id comes
   twice. Collective (every rank calls it for the same tables). */
static dt_status dt__em_ld_move_check(dt_embed *e, dt__em_tab *t, const int64_t *sid, const int64_t *stamp) {
    const char *fn = "dt_embed_checkpoint_load";
    int W = e->size, r, h;
    int64_t nloc = t->r1 - t->r0, x, k, tr = 0, *cnt, *pos, *ids;
    dt_tensor sb, rb, cc;
    dt_tensor_desc d;
    dt_status st = DT_OK;
    memset(&sb, 0, sizeof sb); memset(&rb, 0, sizeof rb); memset(&cc, 0, sizeof cc);
    memset(&d, 0, sizeof d);
    d.dtype = DT_I64; d.device = DT_CPU; d.ndim = 1;
    if (!(cnt = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)(3 * W)))) return DT_ERR_OOM;
    memset(cnt, 0, sizeof(int64_t) * (size_t)(3 * W));
    pos = cnt + W;
    for (x = 0; x < nloc; x++)
        if (stamp[x] != 0) cnt[t->hs_owner[dt_embed_hash_id(sid[x]) % (uint64_t)t->n_hs]]++;
    d.shape[0] = nloc + 1;
    st = dt_tensor_create(e->ctx, &sb, &d);
    d.shape[0] = 2 * W;
    if (!st) st = dt_tensor_create(e->ctx, &cc, &d);
    for (r = 1; r < W; r++) pos[r] = pos[r - 1] + cnt[r - 1];
    for (x = 0; !st && x < nloc; x++)
        if (stamp[x] != 0) ((int64_t *)sb.data)[pos[t->hs_owner[dt_embed_hash_id(sid[x]) % (uint64_t)t->n_hs]]++] = sid[x];
    st = dt__em_ld_agree(e, st); /* no rank leaves another waiting in the exchanges below */
    if (!st) {
        dt_tensor a, bb;
        int64_t sh[1];
        sh[0] = W;
        memcpy(cc.data, cnt, sizeof(int64_t) * (size_t)W);
        st = dt_tensor_view(e->ctx, &a, &cc, 0, 1, sh);
        if (!st) st = dt_tensor_view(e->ctx, &bb, &cc, W, 1, sh);
        if (!st) st = e->comm ? dt_comm_alltoall(e->comm, &bb, &a) : (((int64_t *)cc.data)[1] = cnt[0], DT_OK);
    }
    for (r = 0; !st && r < W; r++) { pos[r] = ((int64_t *)cc.data)[W + r]; tr += pos[r]; }
    d.shape[0] = tr + 1;
    if (!st) st = dt__em_ld_agree(e, dt_tensor_create(e->ctx, &rb, &d));
    if (!st) st = dt__em_a2av(e, &rb, &sb, cnt, pos);
    ids = (int64_t *)rb.data;
    for (h = 0; !st && h < t->hs_count; h++) {
        int64_t m = 0, *p = (int64_t *)sb.data; /* sb is free now: the shard's ids, once they fit */
        for (k = 0; k < tr; k++) m += (int64_t)(dt_embed_hash_id(ids[k]) % (uint64_t)t->n_hs) == t->hs_first + h;
        if (m > t->hs[h].n) {
            st = dt_ctx_set_error(e->ctx, DT_ERR_UNSUPPORTED, "%s: table \"%s\": id-hash shard %d of %d gets %lld saved "
                                  "ids but has %lld slots (the checkpoint has another hash_shards); expected a layout "
                                  "where each shard's ids fit: more rows, or the saved hash_shards", fn, t->name,
                                  t->hs_first + h, t->n_hs, (long long)m, (long long)t->hs[h].n);
            break;
        }
        for (m = 0, k = 0; k < tr; k++)
            if ((int64_t)(dt_embed_hash_id(ids[k]) % (uint64_t)t->n_hs) == t->hs_first + h) p[m++] = ids[k];
        if (m > 1) qsort(p, (size_t)m, sizeof(int64_t), dt__em_i64_cmp);
        for (k = 1; k < m; k++)
            if (p[k] == p[k - 1]) {
                st = dt_ctx_set_error(e->ctx, DT_ERR_FORMAT, "%s: table \"%s\": id %lld is in two saved slots; expected "
                                      "each id in one slot (corrupt checkpoint)", fn, t->name, (long long)p[k]);
                break;
            }
    }
    dt_tensor_free(e->ctx, &sb); dt_tensor_free(e->ctx, &rb); dt_tensor_free(e->ctx, &cc);
    dt_release(e->ctx, cnt);
    return st;
}

/* A static table takes a dynamic table's checkpoint without a word from the loader: the same
   name and shapes, and the extra slot_id / slot_stamp tensors are not asked for. But its rows are
   stored by slot, not by id (row k = whatever id sat in slot k), so it is refused here, by the
   slot_id tensor in the manifest the loader has read. (A dynamic table given a static table's
   checkpoint fails in the loader: no slot_id.) Local: every rank reads the same manifest. */
static dt_status dt__em_ld_kinds(dt_embed *e, const struct dt__ck_load *L) {
    char key[DT_NAME_MAX + 32];
    const char *dir;
    int i;
    for (i = 0; i < e->n_tabs; i++) {
        snprintf(key, sizeof key, "param/embed/%s/slot_id", e->tabs[i].name);
        if (!e->tabs[i].dynamic && dt__checkpoint_has(L, key, &dir))
            return dt_ctx_set_error(e->ctx, DT_ERR_FORMAT, "dt_embed_checkpoint_load: table \"%s\" is dynamic in the "
                                    "checkpoint %s (it holds %s: rows stored by slot, not by id) and static here; "
                                    "expected a checkpoint of a static table, or dynamic = 1", e->tabs[i].name, dir, key);
    }
    return DT_OK;
}

/* dt__checkpoint_load_checked's check: every file is validated on every rank; refuse a dynamic
   table's checkpoint for a static one, read each dynamic table's slots and build what the commit
   swaps in. Collective when a table is dynamic (a failure on one rank goes through its
   agreements, as a failed read of the slots does). */
static dt_status dt__em_ld_check(dt_ctx *ctx, struct dt__ck_load *L, void *user) {
    dt__em_ld *ld = (dt__em_ld *)user;
    dt_embed *e = ld->e;
    dt_status st = dt__em_ld_kinds(e, L);
    double *v, flag[1];
    int i, h, any_move = 0;
    (void)ctx;
    if (!e->any_dyn) return st; /* the loader agrees on it */
    if (!(v = (double *)dt_alloc(e->ctx, sizeof(double) * (size_t)(e->n_tabs + 1)))) st = DT_ERR_OOM;
    if (!st && !(ld->tb = (dt__em_ldt *)dt_alloc(e->ctx, sizeof(dt__em_ldt) * (size_t)e->n_tabs))) st = DT_ERR_OOM;
    if (ld->tb) memset(ld->tb, 0, sizeof(dt__em_ldt) * (size_t)e->n_tabs);
    if (v) memset(v, 0, sizeof(double) * (size_t)(e->n_tabs + 1));
    for (i = 0; !st && i < e->n_tabs; i++) { /* local: read the slots, find ids outside their shard */
        dt__em_tab *t = &e->tabs[i];
        dt__em_ldt *l = &ld->tb[i];
        int64_t nloc = t->r1 - t->r0, x, *sid, *stamp;
        if (!t->dynamic || !t->w.data) continue;
        l->buf = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)(3 * nloc));
        l->prev = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)nloc);
        l->next = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)nloc);
        l->hs = (dt__em_dyn *)dt_alloc(e->ctx, sizeof(dt__em_dyn) * (size_t)t->hs_count);
        if (!l->buf || !l->prev || !l->next || !l->hs) { st = DT_ERR_OOM; break; }
        memcpy(l->hs, t->hs, sizeof(dt__em_dyn) * (size_t)t->hs_count);
        for (h = 0; h < t->hs_count; h++) { /* the live maps stay the live table's */
            memset(&l->hs[h].map, 0, sizeof l->hs[h].map);
            memset(&l->hs[h].seen, 0, sizeof l->hs[h].seen);
        }
        sid = l->buf; stamp = l->buf + nloc;
        memset(l->buf, 0, sizeof(int64_t) * (size_t)(3 * nloc));
        if ((st = dt__em_ld_peek(ld, L, t->slot_id.data, sid))) break;
        if ((st = dt__em_ld_peek(ld, L, t->slot_stamp.data, stamp))) break;
        if (t->slot_count.data && (st = dt__em_ld_peek(ld, L, t->slot_count.data, l->buf + 2 * nloc))) break;
        for (h = 0; h < t->hs_count; h++)
            for (x = t->hs[h].x0; x < t->hs[h].x0 + t->hs[h].n; x++)
                if (stamp[x] != 0 && (int64_t)(dt_embed_hash_id(sid[x]) % (uint64_t)t->n_hs) != t->hs_first + h) v[1 + i] = 1;
    }
    flag[0] = st ? 1 : 0; /* every rank here: whether one failed, then (all with v) which tables moved */
    {
        dt_status cs = dt__em_sum_f64(e, flag, 1);
        if (!cs && flag[0] == 0) cs = dt__em_sum_f64(e, v + 1, e->n_tabs);
        if (cs && !st) st = cs;
        if (!st && flag[0] > 0) st = dt_ctx_set_error(e->ctx, DT_ERR_FORMAT, "dt_embed_checkpoint_load: another rank "
                                                       "failed to read a dynamic table's slots; see its message");
    }
    for (i = 0; !flag[0] && v && i < e->n_tabs; i++) { /* collective: every rank, whatever its status */
        dt__em_tab *t = &e->tabs[i];
        dt__em_ldt *l = &ld->tb[i];
        dt_status s2;
        l->move = v[1 + i] > 0 && !e->cuda; /* on cuda: the rebuild below names the moved id */
        if (!l->move) continue;
        s2 = dt__em_ld_move_check(e, t, l->buf, l->buf ? l->buf + (t->r1 - t->r0) : NULL);
        if (!st) st = s2;
        any_move = 1;
    }
    if (!flag[0] && any_move) { /* the failing rank named it; the others say so (its status when one failed) */
        double f2[2];
        f2[0] = st ? 1 : 0; f2[1] = (double)st;
        if (!dt__em_sum_f64(e, f2, 2) && !st && f2[0] > 0)
            st = dt_ctx_set_error(e->ctx, f2[0] == 1 ? (dt_status)(int)f2[1] : DT_ERR_UNSUPPORTED, "dt_embed_checkpoint_load: "
                                  "a dynamic table's saved ids do not fit its id-hash shards (or repeat) on another "
                                  "rank; see its message");
    }
    for (i = 0; !st && i < e->n_tabs; i++) {
        dt__em_tab *t = &e->tabs[i];
        dt__em_ldt *l = &ld->tb[i];
        if (!l->move && t->dynamic && t->w.data) {
            dt__em_tab sh = *t; /* the table with the checkpoint's slots, rebuilt into l's arrays */
            int64_t nl = t->r1 - t->r0;
            sh.slot_id.data = l->buf; sh.slot_stamp.data = l->buf + nl;
            sh.slot_count.data = t->slot_count.data ? (void *)(l->buf + 2 * nl) : NULL;
            sh.prev = l->prev; sh.next = l->next; sh.hs = l->hs;
            st = dt__em_dyn_rebuild(e, &sh);
        }
    }
    dt_release(e->ctx, v);
    return st;
}

/* Nothing changes unless every rank validated every file and record (dt_opt.h's load and
   dt__em_ld_check): a failed load leaves the tables, optimizer state, step, *state, the
   forward's phase and the accumulated gradients as they were. After the commit only moving ids
   between hash shards (another hash_shards) and the cuda id tables can fail (a lost peer, no
   memory, a broken device): then the tables are the checkpoint's, the maps incomplete, and the
   error is returned on every rank. */
DT_API dt_status dt_embed_checkpoint_load(dt_embed *e, dt_train_state *state, const dt_checkpoint_desc *desc) {
    dt_params ps;
    dt_param *store = NULL;
    dt_tensor steps;
    dt_checkpoint_desc d;
    dt__em_ld ld;
    dt_status st;
    int i, h;
    if (!e) return DT_ERR_ARG;
    dt__em_pf_join(e, 0);
    DT__TRY(dt__em_ckpt_desc(e, &d, desc, "dt_embed_checkpoint_load"));
    memset(&steps, 0, sizeof steps);
    memset(&ld, 0, sizeof ld);
    memset(&ps, 0, sizeof ps);
    st = dt__em_tier_settle(e); /* tiered tables load into their slow tier: first it holds every row */
    if (!st) st = dt__em_params(e, &ps, &store, &steps);
    ld.e = e; ld.ps = &ps;
    if (!st) st = dt__checkpoint_load_checked(e->ctx, &ps, NULL, state, &d, dt__em_ld_check, &ld);
    if (!st) {
        dt__em_tier_drop(e); /* the slow tier changed under the caches */
        e->pf_pending = 0;
        for (i = 0; i < e->n_tabs; i++) { /* the commit: the checkpoint's slots are in the live tensors now */
            dt__em_tab *t = &e->tabs[i];
            dt__em_ldt *l = ld.tb ? &ld.tb[i] : NULL;
            int64_t *tmp;
            t->t = ((int64_t *)steps.data)[i];
            if (!l || !t->dynamic || !t->w.data || l->move) continue;
            for (h = 0; h < t->hs_count; h++) {
                dt__em_mfree(e->ctx, &t->hs[h].map);
                dt__em_mfree(e->ctx, &t->hs[h].seen);
                t->hs[h] = l->hs[h];
                memset(&l->hs[h].map, 0, sizeof l->hs[h].map); /* now the table's */
                memset(&l->hs[h].seen, 0, sizeof l->hs[h].seen);
            }
            tmp = t->prev; t->prev = l->prev; l->prev = tmp;
            tmp = t->next; t->next = l->next; l->next = tmp;
        }
        e->phase = 0;
        e->n_pend = 0; e->acc_open = 0; /* pending gradients belonged to the slots before the load */
        e->cu_naccp = e->cu_accn = e->cu_accf = 0; /* so did the device's window (sync 0) */
        for (i = 0; e->any_dyn && i < e->n_tabs; i++) {
            dt__em_tab *t = &e->tabs[i];
            if (!t->dynamic) continue;
            if (ld.tb[i].move) { /* collective: every rank takes part */
                if (!st) st = dt__em_dyn_move(e, t);
                if (!st && t->w.data) st = dt__em_dyn_rebuild(e, t);
            } else if (t->w.data && e->cuda && !st) st = dt__em_cuda_dyn_restore(e, i);
        }
        if (e->any_dyn) { /* what failed after the commit fails on every rank */
            double flag[1];
            flag[0] = st ? 1 : 0;
            if (dt__em_sum_f64(e, flag, 1) && !st) st = DT_ERR_COMM;
            if (!st && flag[0] > 0)
                st = dt_ctx_set_error(e->ctx, DT_ERR_UNSUPPORTED, "dt_embed_checkpoint_load: a dynamic table's slots did "
                                      "not load on another rank; see its message");
        }
    }
    dt__em_ld_free(e, &ld);
    dt_release(e->ctx, ps.items);
    dt_release(e->ctx, store);
    dt_tensor_free(e->ctx, &steps);
    return st;
}

DT_API dt_status dt_embed_export_changed(dt_embed *e, const char *prefix) {
    const char *fn = "dt_embed_export_changed";
    dt_tensor *ts = NULL;
    const dt_tensor **tp = NULL;
    char (*names)[DT_NAME_MAX + 16] = NULL, (*meta)[64] = NULL, path[1024];
    const char **np_ = NULL, **mp = NULL;
    int i, n = 0, nm = 0, W;
    dt_status st = DT_OK;
    double flag[1];
    if (!e) return DT_ERR_ARG;
    dt__em_pf_join(e, 0);
    DT__TRY(dt__em_tier_settle(e)); /* the changed rows are read from the slow tier */
    W = e->size;
    (void)W;
    if (e->cuda) return dt_ctx_set_error(e->ctx, DT_ERR_UNSUPPORTED, "%s: tables on cuda (desc.device): not "
                                         "supported yet; save a checkpoint instead", fn);
    if (!prefix || !prefix[0] || strlen(prefix) > 900)
        st = dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: prefix is %s; expected a path prefix shorter than 900", fn,
                              prefix ? "empty or too long" : "NULL");
    ts = (dt_tensor *)dt_alloc(e->ctx, sizeof(dt_tensor) * (size_t)(2 * e->n_tabs + 1));
    tp = (const dt_tensor **)dt_alloc(e->ctx, sizeof(dt_tensor *) * (size_t)(2 * e->n_tabs + 1));
    names = (char (*)[DT_NAME_MAX + 16])dt_alloc(e->ctx, (size_t)(DT_NAME_MAX + 16) * (size_t)(2 * e->n_tabs + 1));
    meta = (char (*)[64])dt_alloc(e->ctx, (size_t)64 * (size_t)(2 * e->n_tabs + 1));
    np_ = (const char **)dt_alloc(e->ctx, sizeof(char *) * (size_t)(2 * e->n_tabs + 1));
    mp = (const char **)dt_alloc(e->ctx, sizeof(char *) * (size_t)(2 * e->n_tabs + 1));
    if (!st && (!ts || !tp || !names || !meta || !np_ || !mp)) st = DT_ERR_OOM;
    if (ts) memset(ts, 0, sizeof(dt_tensor) * (size_t)(2 * e->n_tabs + 1));
    for (i = 0; !st && i < e->n_tabs; i++) {
        dt__em_tab *t = &e->tabs[i];
        int64_t nc = t->c1 - t->c0, nr = t->r1 - t->r0, k, x;
        dt_tensor_desc d;
        if (!t->w.data || (t->shard == DT_SHARD_DATA && e->rank != 0)) continue;
        memset(&d, 0, sizeof d);
        d.dtype = DT_I64; d.device = DT_CPU; d.shape[0] = t->n_dirty; d.ndim = 1;
        if ((st = dt_tensor_create(e->ctx, &ts[n], &d))) break;
        d.dtype = DT_F32; d.shape[1] = nc; d.ndim = 2;
        if ((st = dt_tensor_create(e->ctx, &ts[n + 1], &d))) break;
        for (k = 0, x = 0; k < t->n_dirty && x < nr; x++) { /* the changed rows, in row order */
            if (!(t->dirty[x >> 3] & (1u << (x & 7)))) {
                if (!t->dirty[x >> 3]) x |= 7; /* a byte of none: its next */
                continue;
            }
            ((int64_t *)ts[n].data)[k] = t->dynamic ? ((int64_t *)t->slot_id.data)[x] : t->r0 + x;
            if ((st = dt_convert(e->ctx, (float *)ts[n + 1].data + k * nc, DT_F32,
                                 (const char *)t->w.data + (size_t)(x * nc) * dt_dtype_size(t->dtype), t->dtype, nc)))
                break;
            k++;
        }
        if (st) break;
        snprintf(names[n], DT_NAME_MAX + 16, "%s.ids", t->name);
        snprintf(names[n + 1], DT_NAME_MAX + 16, "%s.values", t->name);
        snprintf(meta[nm], 64, "%.50s.cols", t->name);
        snprintf(meta[nm + 1], 64, "%lld:%lld", (long long)t->c0, (long long)t->c1);
        tp[n] = &ts[n]; tp[n + 1] = &ts[n + 1];
        np_[n] = names[n]; np_[n + 1] = names[n + 1];
        mp[nm] = meta[nm]; mp[nm + 1] = meta[nm + 1];
        n += 2; nm += 2;
    }
    if (!st) {
        snprintf(path, sizeof path, "%s.rank_%05d.safetensors", prefix, e->rank);
        st = dt_safetensors_save(e->ctx, path, tp, np_, n, mp, nm / 2);
    }
    flag[0] = st ? 1 : 0;
    if (dt__em_sum_f64(e, flag, 1) && !st) st = DT_ERR_COMM;
    if (!st && flag[0] > 0) st = dt_ctx_set_error(e->ctx, DT_ERR_IO, "%s: failed on another rank", fn);
    if (!st) /* exported: start tracking afresh */
        for (i = 0; i < e->n_tabs; i++) {
            dt__em_tab *t = &e->tabs[i];
            if (t->dirty) memset(t->dirty, 0, (size_t)((t->r1 - t->r0 + 7) / 8));
            t->n_dirty = 0;
        }
    for (i = 0; ts && i < 2 * e->n_tabs; i++) dt_tensor_free(e->ctx, &ts[i]);
    dt_release(e->ctx, ts); dt_release(e->ctx, (void *)tp); dt_release(e->ctx, names); dt_release(e->ctx, meta);
    dt_release(e->ctx, (void *)np_); dt_release(e->ctx, (void *)mp);
    return st;
}

/* ==== >>cuda: CUDA tables (implementation only) =============================================== */

/* desc.device = DT_CUDA_DEVICE: each rank's shards (weights and optimizer state) are CUDA
   tensors, initialised on the host with the same Philox stream and copied up. The batch is read,
   validated and counted on the host, and goes up once (dt__em_cuda_batch); the device path
   (every feature pooled, dt__em_cuda_dev) then makes everything else from it: data-parallel bags
   (dt__em_cuda_dp_dev, _dp_backward), and with static tables (dt__em_cuda_devreq) the requests
   and the scatter's layout at begin (dt__em_cuda_requests), the owners' layout and pooling at
   end (dt__em_cuda_serve_dev), the return all-to-all and dt_k_embed_gather_sum into the output
   (dt__em_cuda_end). The backward reverses it (dt__em_cuda_backward): the requests' gradients
   gathered from dout, the all-to-all to the owners, then per table pool_bwd (w x the request's
   gradient, one row per id), dedup (a stable sort by row: the ids arrived in (global sample,
   feature, position) order, so each row's run is in the CPU's sum order) and the sparse
   optimizer kernel. So the kernels see the CPU's operands in the CPU's order: pooled outputs
   and SGD / Adagrad / Adam rows are the CPU path's bit for bit on the emulator; row-wise
   Adagrad's sum of squares is a tree in double on the device (a sequential loop on the CPU):
   within 1e-6 relative. On a real GPU nvcc may fuse a multiply-add (about 1 ulp). With a
   dynamic table the requests stay the host's (dt__em_cuda_serve sends the owner's index arrays
   up): the id -> slot decisions on the device (dt_k_hash_lookup, one per local shard per
   forward, one copy down for all of them), row initialisation on the host (see "CUDA" at the
   top). With a sequence feature the returned rows and dout come down and the CPU path sums them
   (dt__em_cuda_stage / _flush apply the rows on the device). Accumulation (sync 0): the
   device's window (dt__em_cuda_apply, dt__em_cuda_acc_close). Tier HOST: the host's requests
   (dt__em_cuda_serve) map each row to its device cache slot (dt__em_cuda_tier_row), the kernels
   read dt__em_cuda_w / _s1 / _s2 (the cache), and the cache's rows move by
   dt__em_cuda_tier_issue (see >>tier); a dynamic table's admitted rows are written into their
   cache slots (dt__em_cuda_dyn_fill).
   Export: DT_ERR_UNSUPPORTED. */
#ifdef DT_CUDA

static dt_status dt__em_cuda_err(dt_embed *e, int st, const char *what) {
    if (!st) return DT_OK;
    return dt_ctx_set_error(e->ctx, DT_ERR_CUDA, "dt_embed (cuda tables): %s failed: %s", what, dt_k_error_string(st));
}

static dt_status dt__em_cuda_check_desc(dt_ctx *ctx, const dt_embed_desc *desc) {
    int i;
    if (desc->device != DT_DEVICE_DEFAULT && desc->device != DT_CPU && desc->device != DT_CUDA_DEVICE)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_embed_create: desc.device = %d; expected DEFAULT, DT_CPU or "
                                "DT_CUDA_DEVICE", (int)desc->device);
    if (desc->device != DT_CUDA_DEVICE || !desc->tables || desc->n_tables < 1) return DT_OK; /* (checked later) */
    for (i = 0; i < desc->n_tables; i++) {
        const dt_embed_table_desc *d = &desc->tables[i];
        const char *nm = d->name ? d->name : "";
        if (d->dynamic && d->eviction == DT_EVICT_LFU)
            return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "dt_embed_create: tables[%d] (\"%s\").eviction = LFU with "
                                    "desc.device cuda; the GPU id table (kernels/dt_hash.cu) evicts LRU only", i, nm);
        /* tier HOST with sharding DATA: the kernels read and update the host memory itself (its
           lookups are made on the device, without the cache's slots): no cache to size */
        if (d->tier == DT_TIER_HOST && d->sharding == DT_SHARD_DATA && (d->cache_rows > 0 || d->cache_fraction > 0))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_embed_create: tables[%d] (\"%s\"): cache_rows = %lld, "
                                    "cache_fraction = %g with tier HOST and sharding DATA on cuda; expected 0: a "
                                    "replicated table in host memory is read and updated there by the kernels, "
                                    "without a cache (its lookups are made on the device)", i, nm,
                                    (long long)d->cache_rows, d->cache_fraction);
    }
    return DT_OK;
}

static dt_status dt__em_cuda_need(dt_embed *e, dt_tensor *t, dt_dtype dtype, int64_t n) {
    return dt__em_need_on(e, t, dtype, n, DT_CUDA_DEVICE);
}

/* The buffers of a step's requests (made on the device, or the host's with dynamic or tiered
   tables) and of a tiered table's cache copies start at twice the first step's need: how many
   requests, ids, results and missing rows reach an owner varies from batch to batch (row-wise
   tables), and a step that allocates waits for the device; doubling on growth
   (dt__em_need_on) makes later growth rare. */
static dt_status dt__em_cuda_need2(dt_embed *e, dt_tensor *t, dt_dtype dtype, int64_t n) {
    return dt__em_need_on(e, t, dtype, t->data || n > ((int64_t)1 << 50) ? n : 2 * n, DT_CUDA_DEVICE);
}

/* Copies through dt_tensor.h's counted calls: up and device to device in stream order without
   a wait (the bytes of a host buffer are taken when the copy is queued, so it can be reused
   at once); down waits (one sync), as the host reads the bytes next. */
static dt_status dt__em_cuda_put(dt_embed *e, void *dst, const void *src, size_t bytes) {
    return dt_cuda_memcpy(e->ctx, dst, DT_CUDA_DEVICE, src, DT_CPU, bytes, "dt_embed");
}
static dt_status dt__em_cuda_get(dt_embed *e, void *dst, const void *src, size_t bytes) {
    return dt_cuda_memcpy(e->ctx, dst, DT_CPU, src, DT_CUDA_DEVICE, bytes, "dt_embed");
}
static dt_status dt__em_cuda_d2d(dt_embed *e, void *dst, const void *src, size_t bytes) {
    return dt_cuda_memcpy(e->ctx, dst, DT_CUDA_DEVICE, src, DT_CUDA_DEVICE, bytes, "dt_embed");
}

/* The device path: every feature pooled (a sequence feature's rows are host views, so a batch
   with one keeps the host scatter: see "CUDA" at the top). */
static int dt__em_cuda_dev(const dt_embed *e) {
    int f;
    if (!e->cuda) return 0;
    for (f = 0; f < e->n_feat; f++)
        if (e->tabs[e->feat_tab[f]].pooling == DT_POOL_NONE) return 0;
    return 1;
}

/* A table's rows and optimizer state as the kernels see them: the shard on the device, or for
   tier HOST the device cache (the rows of the index arrays are then cache slots). */
/* Where the kernels read and write t: the shard; a tiered table's cache (its rows are slots); a
   tiered data-parallel table's host memory itself, mapped for kernels (no cache: see "CUDA"). */
static int dt__em_cuda_uva(const dt__em_tab *t) { return t->tier && t->shard == DT_SHARD_DATA; }
static void *dt__em_cuda_w(const dt__em_tab *t) {
    return dt__em_cuda_uva(t) ? (void *)t->tier->hw : t->tier ? (void *)t->tier->cw : t->w.data;
}
static float *dt__em_cuda_s1(const dt__em_tab *t) {
    return dt__em_cuda_uva(t) ? t->tier->hs1 : t->tier ? t->tier->cs1 : (float *)t->s1.data;
}
static float *dt__em_cuda_s2(const dt__em_tab *t) {
    return dt__em_cuda_uva(t) ? t->tier->hs2 : t->tier ? t->tier->cs2 : (float *)t->s2.data;
}

/* tier HOST: the slow tier in pinned host memory, mapped so that kernels read and write it
   (under unified addressing its device address is its host address), its optimizer state
   zeroed (the rows are initialised next, on the host); the cache on the device.
   The cache's rows move by kernels (dt_k_embed_copies between mapped host memory and the
   cache, one launch per array for every row of a step) rather than one cudaMemcpyAsync per
   row: a step misses thousands of rows, and each memcpy call costs microseconds of host time
   (FBGEMM's UVM-cached tables read mapped host memory from kernels in the same way). */
static dt_status dt__em_cuda_tier_create(dt_embed *e, dt__em_tab *t, size_t b0, size_t b1) {
    dt__em_tier *c = t->tier;
    void *dev = NULL;
    cudaError_t ce = cudaHostAlloc(&c->map, c->map_bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (ce != cudaSuccess) {
        c->map = NULL;
        (void)cudaGetLastError();
        return dt_ctx_set_error(e->ctx, DT_ERR_OOM, "dt_embed_create: table \"%s\": its slow tier (%.3g GiB of pinned "
                                "host memory, tier HOST) on rank %d: cudaHostAlloc failed: %s; expected that much "
                                "free host memory", t->name, (double)c->map_bytes / 1073741824.0, e->rank,
                                cudaGetErrorString(ce));
    }
    memset((char *)c->map + b0, 0, c->map_bytes - b0); /* the state (the rows are all written next) */
    ce = cudaHostGetDevicePointer(&dev, c->map, 0);
    if (ce != cudaSuccess) return dt__em_cuda_err(e, (int)ce, "cudaHostGetDevicePointer (tier HOST)");
    c->hw = (char *)dev;
    c->hs1 = c->sn1 ? (float *)(c->hw + b0) : NULL;
    c->hs2 = c->sn2 ? (float *)(c->hw + b0 + b1) : NULL;
    DT__TRY(dt_cuda_alloc(e->ctx, (void **)&c->cw, (size_t)(c->cap * c->rb), "dt_embed_create (cache rows)"));
    if (c->sn1) DT__TRY(dt_cuda_alloc(e->ctx, (void **)&c->cs1, sizeof(float) * (size_t)(c->cap * c->sn1),
                                      "dt_embed_create (cache state)"));
    if (c->sn2) DT__TRY(dt_cuda_alloc(e->ctx, (void **)&c->cs2, sizeof(float) * (size_t)(c->cap * c->sn2),
                                      "dt_embed_create (cache state)"));
    return DT_OK;
}

static void dt__em_cuda_tier_free(dt_embed *e, dt__em_tier *c) {
    if (c->map) (void)cudaFreeHost(c->map);
    dt_cuda_release(e->ctx, c->cw); dt_cuda_release(e->ctx, c->cs1); dt_cuda_release(e->ctx, c->cs2);
    c->map = NULL; c->cw = NULL; c->cs1 = c->cs2 = NULL;
}

/* The rows every tier HOST table queued (dt__em_tier_move), moved on `stream`: their index
   arrays up in one copy into buf (on the compute stream: the caller orders `stream` after it),
   then per table its write-backs (cache -> slow tier) before its fetches (slow tier -> cache),
   since a fetch may fill the slot a write-back empties, or read the row it writes. A move is
   one launch per array (rows, s1, s2): dt_k_embed_copies with (dst, src, length) in elements. */
static dt_status dt__em_cuda_tier_issue(dt_embed *e, dt_tensor *buf, void *stream) {
    int64_t tot = 0, o = 0, *h, *dv;
    int i, d;
    for (i = 0; i < e->n_tabs; i++) {
        dt__em_tier *c = e->tabs[i].tier;
        if (c && c->dev) tot += 6 * (c->n_mv[0] + c->n_mv[1]);
    }
    if (tot == 0) return DT_OK;
    DT__TRY(dt_grow(e->ctx, (void **)&e->cu_tih, &e->cu_tih_cap, tot, sizeof(int64_t), "dt_embed cache copies"));
    DT__TRY(dt__em_cuda_need2(e, buf, DT_I64, tot)); /* twice the first step's: a later step's misses vary */
    h = e->cu_tih;
    for (i = 0; i < e->n_tabs; i++) { /* per table and direction: rows dst, src, len; state dst, src, len */
        dt__em_tab *t = &e->tabs[i];
        dt__em_tier *c = t->tier;
        int64_t nc = t->c1 - t->c0, j;
        if (!c || !c->dev) continue;
        for (d = 0; d < 2; d++) {
            int64_t n = c->n_mv[d], *m = c->mv[d];
            for (j = 0; j < n; j++) {
                int64_t k = m[2 * j], x = m[2 * j + 1];
                h[o + j] = (d ? k : x) * nc; h[o + n + j] = (d ? x : k) * nc; h[o + 2 * n + j] = nc;
                h[o + 3 * n + j] = (d ? k : x) * c->sn1; h[o + 4 * n + j] = (d ? x : k) * c->sn1;
                h[o + 5 * n + j] = c->sn1;
            }
            o += 6 * n;
        }
    }
    DT__TRY(dt__em_cuda_put(e, buf->data, h, (size_t)tot * sizeof(int64_t)));
    if (stream != e->ctx->cuda_stream) { /* the copy stream: after the upload (and all the compute stream's work) */
        cudaError_t ce = cudaEventRecord((cudaEvent_t)e->cu_evc, (cudaStream_t)e->ctx->cuda_stream);
        if (ce == cudaSuccess) ce = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)e->cu_evc, 0);
        if (ce != cudaSuccess) return dt__em_cuda_err(e, (int)ce, "cudaStreamWaitEvent (tier HOST prefetch)");
    }
    dv = (int64_t *)buf->data;
    o = 0;
    for (i = 0; i < e->n_tabs; i++) {
        dt__em_tab *t = &e->tabs[i];
        dt__em_tier *c = t->tier;
        int64_t nc = t->c1 - t->c0;
        int es = (int)dt_dtype_size(t->dtype);
        if (!c || !c->dev) continue;
        for (d = 0; d < 2; d++) {
            int64_t n = c->n_mv[d], *x = dv + o;
            char *wd = d ? c->cw : c->hw, *ws = d ? c->hw : c->cw;
            float *s1d = d ? c->cs1 : c->hs1, *s1s = d ? c->hs1 : c->cs1;
            float *s2d = d ? c->cs2 : c->hs2, *s2s = d ? c->hs2 : c->cs2;
            o += 6 * n;
            c->n_mv[d] = 0;
            if (n == 0) continue;
            DT__TRY(dt__em_cuda_err(e, dt_k_embed_copies(wd, ws, x, x + n, x + 2 * n, (int)n, nc, es, stream),
                                    "dt_k_embed_copies (tier HOST rows)"));
            if (c->sn1)
                DT__TRY(dt__em_cuda_err(e, dt_k_embed_copies(s1d, s1s, x + 3 * n, x + 4 * n, x + 5 * n, (int)n, c->sn1,
                                                             4, stream), "dt_k_embed_copies (tier HOST state)"));
            if (c->sn2)
                DT__TRY(dt__em_cuda_err(e, dt_k_embed_copies(s2d, s2s, x, x + n, x + 2 * n, (int)n, nc, 4, stream),
                                        "dt_k_embed_copies (tier HOST state)"));
        }
    }
    return DT_OK;
}

/* The queued moves on the compute stream, after the prefetch's copies (the stream waits for
   them, the host does not); wait = 1 (cold paths): the host waits until all have run. */
static dt_status dt__em_cuda_tier_run(dt_embed *e, int wait) {
    if (e->cu_pf_wait) {
        cudaError_t ce = cudaStreamWaitEvent((cudaStream_t)e->ctx->cuda_stream, (cudaEvent_t)e->cu_evp, 0);
        if (ce != cudaSuccess) return dt__em_cuda_err(e, (int)ce, "cudaStreamWaitEvent (tier HOST prefetch)");
        e->cu_pf_wait = 0;
    }
    DT__TRY(dt__em_cuda_tier_issue(e, &e->cu_tix, e->ctx->cuda_stream));
    return wait ? dt_ctx_sync(e->ctx) : DT_OK;
}

/* dt_embed_prefetch's moves, on the copy stream (made at the first prefetch): they run while the
   compute stream runs the current step (whose rows they do not touch: a prefetch fills only
   unpinned slots and reads only rows not cached), and the next forward's compute stream waits
   for them (cu_evp) before it reads the cache. */
static dt_status dt__em_cuda_tier_prefetch(dt_embed *e) {
    cudaError_t ce = cudaSuccess;
    if (!e->cu_cs) {
        cudaStream_t cs = NULL;
        cudaEvent_t a = NULL, b = NULL;
        ce = cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
        if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&a, cudaEventDisableTiming);
        if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&b, cudaEventDisableTiming);
        if (ce != cudaSuccess) {
            if (b) cudaEventDestroy(b);
            if (a) cudaEventDestroy(a);
            if (cs) cudaStreamDestroy(cs);
            return dt__em_cuda_err(e, (int)ce, "cudaStreamCreateWithFlags (tier HOST prefetch)");
        }
        e->cu_cs = (void *)cs; e->cu_evc = (void *)a; e->cu_evp = (void *)b;
    }
    if (e->cu_pf_wait) { /* the previous prefetch's copies: before this one's (same buffer) */
        ce = cudaStreamWaitEvent((cudaStream_t)e->ctx->cuda_stream, (cudaEvent_t)e->cu_evp, 0);
        if (ce != cudaSuccess) return dt__em_cuda_err(e, (int)ce, "cudaStreamWaitEvent (tier HOST prefetch)");
        e->cu_pf_wait = 0;
    }
    DT__TRY(dt__em_cuda_tier_issue(e, &e->cu_tixp, e->cu_cs));
    ce = cudaEventRecord((cudaEvent_t)e->cu_evp, (cudaStream_t)e->cu_cs);
    if (ce != cudaSuccess) return dt__em_cuda_err(e, (int)ce, "cudaEventRecord (tier HOST prefetch)");
    e->cu_pf_wait = 1;
    return DT_OK;
}

/* A forward's lookup of local row *x of tier HOST table t (dt__em_cuda_serve): *x becomes its
   cache slot (a miss queues its fetch), or -1 (zeros) when every slot is held by the step. */
static dt_status dt__em_cuda_tier_row(dt_embed *e, dt__em_tab *t, int64_t *x) {
    dt__em_tier *c = t->tier;
    int64_t k;
    DT__TRY(dt__em_tier_slot(e, t, *x, e->epoch, DT__EM_NOW, !e->tier_pf, &k));
    if (k < 0) dt__em_tier_full(e, t);
    else if (!c->used[k]) { /* the next update writes it (dt__em_tier_touched) */
        DT__TRY(dt_grow(e->ctx, (void **)&c->ul, &c->ul_cap, c->n_ul + 1, sizeof(int64_t), "dt_embed cache rows"));
        c->used[k] = 1;
        c->ul[c->n_ul++] = k;
    }
    *x = k;
    return DT_OK;
}

/* The host shard, initialised by dt__em_alloc_shard, moves to the device. */
static dt_status dt__em_cuda_to_device(dt_embed *e, dt__em_tab *t) {
    dt_tensor *ts[3];
    int k;
    ts[0] = &t->w; ts[1] = &t->s1; ts[2] = &t->s2;
    for (k = 0; k < 3 && !t->tier; k++) { /* (tier HOST: the shard stays in pinned host memory) */
        dt_tensor d;
        dt_status st;
        if (!ts[k]->data) continue;
        DT__TRY(dt_tensor_create_like(e->ctx, &d, ts[k], DT_DTYPE_DEFAULT, DT_CUDA_DEVICE));
        st = dt_tensor_copy(e->ctx, &d, ts[k]);
        if (st) { dt_tensor_free(e->ctx, &d); return st; }
        dt_tensor_free(e->ctx, ts[k]);
        *ts[k] = d;
    }
    if (t->dynamic && t->hs_count > 0) { /* a GPU id table per local shard; slot_id / slot_stamp stay host mirrors */
        int64_t cap = e->cu_hs_n, h;
        DT__TRY(dt_grow(e->ctx, (void **)&e->cu_hs, &cap, e->cu_hs_n + t->hs_count, sizeof(dt_k_hash),
                         "dt_embed cuda id tables"));
        for (h = 0; h < t->hs_count; h++) {
            int64_t sc = 4096;
            while (sc < 8 * t->hs[h].n) sc *= 2;
            DT__TRY(dt__em_cuda_err(e, dt_k_hash_create(&e->cu_hs[e->cu_hs_n], t->hs[h].n, sc), "dt_k_hash_create"));
            e->cu_hs_n++;
        }
    }
    return DT_OK;
}

static dt_status dt__em_cuda_stage_buf(dt_embed *e, int64_t n, int64_t m);

/* The first GPU id table of dynamic table ti (the tables' shards in table order). */
static dt_k_hash *dt__em_cuda_hs(dt_embed *e, int ti) {
    int64_t b = 0;
    int i;
    for (i = 0; i < ti; i++)
        if (e->tabs[i].dynamic) b += e->tabs[i].hs_count;
    return &e->cu_hs[b];
}

/* dt__em_dyn_fill on the device for a batch's admitted rows (pairs [2 na]: local row, id): each
   row initialised on the host (the same Philox stream and name "<table>#<id>"), all of them up
   in one copy and moved into place by one dt_k_embed_copies; their optimizer state zeroed the
   same way (copies of a zeroed row). Tier HOST: "into place" is the row's cache slot. */
static dt_status dt__em_cuda_dyn_fill(dt_embed *e, dt__em_tab *t, const int64_t *pairs, int64_t na) {
    const char *fn = "dt_embed_forward";
    dt_tensor v;
    dt_tensor_desc d;
    dt_init_desc in = t->init;
    char name[DT_NAME_MAX + 32];
    int64_t nc = t->c1 - t->c0, k, *hm, *slot, s1n = t->kind == DT_EMBED_ROWWISE_ADAGRAD ? 1 : nc, ia = 0, ib, g;
    size_t es = dt_dtype_size(t->w.dtype), mark;
    char *vals, *dvals;
    int64_t *dm;
    float *zero;
    dt_status st;
    if (na == 0 || nc == 0) return DT_OK;
    DT__TRY(dt_grow(e->ctx, (void **)&e->cu_stg, &e->cu_stg_cap, (int64_t)(((size_t)(na * nc) * es + 3) / 4) + 1,
                     sizeof(float), "dt_embed cuda rows"));
    DT__TRY(dt_grow(e->ctx, (void **)&e->cu_dyn_hi, &e->cu_dyn_cap, 7 * na + 1, sizeof(int64_t), "dt_embed cuda rows"));
    vals = (char *)e->cu_stg; hm = e->cu_dyn_hi; slot = hm + 6 * na;
    /* tier HOST: each new row goes into its cache slot (taken without a fetch: the row is written
       whole), or into the slow tier when the step holds every slot (the forward then fails, but the
       id stays admitted); the slots' write-backs run first (they read what is overwritten) */
    for (k = 0; k < na; k++) {
        slot[k] = -1;
        if (t->tier) DT__TRY(dt__em_tier_slot(e, t, pairs[2 * k], e->epoch, DT__EM_NONE, 0, &slot[k]));
        if (slot[k] >= 0) { t->tier->sl[slot[k]].dirty = 1; ia++; }
    }
    if (t->tier) DT__TRY(dt__em_cuda_tier_run(e, 0));
    ib = ia; ia = 0; /* cached rows first [0, ia), then the others */
    memset(&d, 0, sizeof d);
    d.dtype = t->w.dtype; d.device = DT_CPU; d.ndim = 2; d.shape[0] = 1; d.shape[1] = nc;
    DT__TRY(dt_tensor_create(e->ctx, &v, &d));
    memset(in.global_shape, 0, sizeof in.global_shape);
    memset(in.start, 0, sizeof in.start);
    st = DT_OK;
    for (k = 0; !st && k < na; k++) {
        int64_t x = pairs[2 * k], at = slot[k] >= 0 ? slot[k] : x, j = slot[k] >= 0 || !t->tier ? ia++ : ib++;
        snprintf(name, sizeof name, "%s#%lld", t->name, (long long)pairs[2 * k + 1]);
        in.name = name;
        st = dt_tensor_init(e->ctx, &v, &in);
        if (!st) memcpy(vals + (size_t)(k * nc) * es, v.data, (size_t)nc * es);
        hm[j] = at * nc; hm[na + j] = k * nc; hm[2 * na + j] = nc; /* the row: dst, src, len */
        hm[3 * na + j] = at * s1n; hm[4 * na + j] = 0; hm[5 * na + j] = s1n; /* its state: dst (s1), src (zeros), len */
        if (!st) dt__em_mark(t, x);
    }
    dt_tensor_free(e->ctx, &v);
    if (st) return st;
    mark = dt_cuda_scratch_begin(e->ctx);
    dvals = (char *)dt_cuda_scratch(e->ctx, (size_t)(na * nc) * es, fn);
    dm = (int64_t *)dt_cuda_scratch(e->ctx, (size_t)(6 * na + 1) * sizeof(int64_t), fn);
    zero = (float *)dt_cuda_scratch(e->ctx, (size_t)nc * sizeof(float), fn);
    if (!dvals || !dm || !zero) st = DT_ERR_OOM;
    if (!st) st = dt__em_cuda_put(e, dvals, vals, (size_t)(na * nc) * es);
    if (!st) st = dt__em_cuda_put(e, dm, hm, (size_t)(6 * na) * sizeof(int64_t));
    if (!st) st = dt_cuda_memset(e->ctx, zero, 0, (size_t)nc * sizeof(float), fn);
    for (g = 0; g < 2 && !st; g++) { /* the device's rows (resident, or the cache), then the slow tier's */
        int64_t lo = g ? ia : 0, n = g ? na - ia : ia, *x = dm + lo;
        void *w = g ? (void *)(t->tier ? t->tier->hw : NULL) : dt__em_cuda_w(t);
        float *s1 = g ? (t->tier ? t->tier->hs1 : NULL) : dt__em_cuda_s1(t);
        float *s2 = g ? (t->tier ? t->tier->hs2 : NULL) : dt__em_cuda_s2(t);
        if (n == 0) continue;
        st = dt__em_cuda_err(e, dt_k_embed_copies(w, dvals, x, x + na, x + 2 * na, (int)n, nc, (int)es,
                                                  e->ctx->cuda_stream), "dt_k_embed_copies");
        if (!st && s1) /* row-wise Adagrad: one float per row */
            st = dt__em_cuda_err(e, dt_k_embed_copies(s1, zero, x + 3 * na, x + 4 * na, x + 5 * na, (int)n, s1n, 4,
                                                      e->ctx->cuda_stream), "dt_k_embed_copies");
        if (!st && s2)
            st = dt__em_cuda_err(e, dt_k_embed_copies(s2, zero, x, x + 4 * na, x + 2 * na, (int)n, nc, 4,
                                                      e->ctx->cuda_stream), "dt_k_embed_copies");
    }
    dt_cuda_scratch_end(e->ctx, mark);
    return st;
}

/* The host mirrors of the dynamic tables' slots (slot_id, slot_stamp), copied down from the GPU
   id tables when a checkpoint needs them (they change every forward; the step never reads them). */
static dt_status dt__em_cuda_dyn_pull(dt_embed *e) {
    int i, h;
    for (i = 0; e->cuda && i < e->n_tabs; i++) {
        dt__em_tab *t = &e->tabs[i];
        dt_k_hash *hs;
        if (!t->dynamic || !t->cu_stale || t->hs_count <= 0) continue;
        hs = dt__em_cuda_hs(e, i);
        for (h = 0; h < t->hs_count; h++) {
            dt__em_dyn *y = &t->hs[h];
            DT__TRY(dt__em_cuda_get(e, (int64_t *)t->slot_id.data + y->x0, hs[h].slot_id, (size_t)y->n * sizeof(int64_t)));
            DT__TRY(dt__em_cuda_get(e, (int64_t *)t->slot_stamp.data + y->x0, hs[h].slot_stamp,
                                    (size_t)y->n * sizeof(int64_t)));
        }
        t->cu_stale = 0;
    }
    return DT_OK;
}

/* dt__em_dyn_translate with the id tables on the device: each local shard's ids, in the order
   the requests arrived (the global (sample, feature, position) order), go through its GPU
   table in one batch; the decisions are the host map's (kernels/dt_hash.cu). Every shard of
   every dynamic table in one go: the ids up in one copy, one lookup per shard, then ONE copy
   down of what the host needs (each id's slot, each shard's counts and overflow flag, the
   admitted (slot, id) pairs): the slots make the owner's request rows (built on the host), the
   pairs say which rows to initialise. The slot table itself stays on the device (the host's
   slot_id / slot_stamp are refreshed only for a checkpoint: dt__em_cuda_dyn_pull). */
static dt_status dt__em_cuda_dyn_translate(dt_embed *e, int64_t *rin, int64_t total) {
    int64_t p, j, n_all = 0, m = 0, nsh = 0, *dv, *pos, *ids, *hb, k, na = 0;
    int i, h;
    dt_status st = DT_OK;
    e->stats.step_admitted = e->stats.step_evicted = e->stats.step_rejected = 0;
    for (p = 0; p < total; p += DT__EM_HDR + rin[p + 3])
        if (e->tabs[e->feat_tab[(int)rin[p]]].dynamic) n_all += rin[p + 3];
    for (i = 0; i < e->n_tabs; i++) if (e->tabs[i].dynamic) nsh += e->tabs[i].hs_count > 0 ? e->tabs[i].hs_count : 0;
    if (n_all == 0) return DT_OK;
    /* host: ids [n_all], their places in rin [n_all], each shard's first id [nsh + 1]; the copy down: slots
       [n_all], counts + overflow [4 nsh], admitted pairs [2 n_all] */
    DT__TRY(dt__em_cuda_stage_buf(e, 2 * n_all + nsh + 1 + 3 * n_all + 4 * nsh, 0));
    ids = e->cu_hi; pos = ids + n_all; hb = pos + n_all;
    k = 0;
    for (i = 0; i < e->n_tabs; i++) {
        dt__em_tab *t = &e->tabs[i];
        if (!t->dynamic || t->hs_count <= 0) continue;
        for (h = 0; h < t->hs_count; h++) {
            hb[k++] = m;
            for (p = 0; p < total; p += DT__EM_HDR + rin[p + 3]) {
                if (e->feat_tab[(int)rin[p]] != i) continue;
                for (j = 0; j < rin[p + 3]; j++) {
                    int64_t id = rin[p + DT__EM_HDR + j];
                    if ((int)(dt_embed_hash_id(id) % (uint64_t)t->n_hs) - t->hs_first != h) continue;
                    ids[m] = id;
                    pos[m++] = p + DT__EM_HDR + j;
                }
            }
        }
    }
    hb[k] = m;
    /* device: ids [m], then the block copied down: slots [m], counts [4 nsh], pairs [2 m] */
    DT__TRY(dt__em_cuda_need(e, &e->cu_i, DT_I64, 4 * m + 4 * nsh + 1));
    dv = (int64_t *)e->cu_i.data;
    DT__TRY(dt__em_cuda_put(e, dv, ids, (size_t)m * sizeof(int64_t)));
    DT__TRY(dt_cuda_memset(e->ctx, dv + 2 * m, 0, (size_t)(4 * nsh) * sizeof(int64_t), "dt_embed_forward"));
    k = 0;
    for (i = 0; i < e->n_tabs; i++) {
        dt__em_tab *t = &e->tabs[i];
        if (!t->dynamic || t->hs_count <= 0) continue;
        for (h = 0; h < t->hs_count; h++, k++) {
            int64_t a = hb[k], n = hb[k + 1] - hb[k], *c = dv + 2 * m + 4 * k;
            if (n == 0) continue;
            DT__TRY(dt__em_cuda_err(e, dt_k_hash_lookup(dt__em_cuda_hs(e, i) + h, dv + m + a, c, (int *)(c + 3),
                                                         dv + 2 * m + 4 * nsh + 2 * a, dv + a, n, t->admit_after,
                                                         e->ctx->cuda_stream), "dt_k_hash_lookup"));
        }
    }
    { /* the one copy down */
        int64_t *back = hb + nsh + 1, *sl = back, *cn = back + m, *pr = cn + 4 * nsh;
        DT__TRY(dt__em_cuda_get(e, back, dv + m, (size_t)(3 * m + 4 * nsh) * sizeof(int64_t)));
        k = 0;
        for (i = 0; i < e->n_tabs && !st; i++) {
            dt__em_tab *t = &e->tabs[i];
            if (!t->dynamic || t->hs_count <= 0) continue;
            for (h = 0; h < t->hs_count; h++, k++) {
                dt__em_dyn *y = &t->hs[h];
                int64_t *c = cn + 4 * k, a = hb[k], n = hb[k + 1] - hb[k];
                int ov = 0;
                memcpy(&ov, &c[3], sizeof ov);
                if (ov)
                    return dt_ctx_set_error(e->ctx, DT_ERR_RANGE, "dt_embed_forward: dynamic table \"%s\" on cuda: an "
                                            "id-hash shard saw more than %lld distinct ids not admitted (the GPU table's "
                                            "seen_cap); expected fewer (use a smaller admit_after or more rows)", t->name,
                                            (long long)dt__em_cuda_hs(e, i)[h].seen_cap);
                for (j = 0; j < n; j++) rin[pos[a + j]] = sl[a + j] < 0 ? -1 : t->r0 + y->x0 + sl[a + j];
                e->stats.step_admitted += c[0]; e->stats.step_evicted += c[1]; e->stats.step_rejected += c[2];
                for (j = 0; j < c[0]; j++) { /* the admitted pairs, as (local row, id) */
                    pr[2 * na] = y->x0 + pr[2 * (a + j)];
                    pr[2 * na + 1] = pr[2 * (a + j) + 1];
                    na++;
                }
                t->cu_stale = 1;
            }
            if (na > 0) { /* this table's new rows */
                st = dt__em_cuda_dyn_fill(e, t, pr, na);
                na = 0;
            }
        }
    }
    e->stats.admitted += e->stats.step_admitted;
    e->stats.evicted += e->stats.step_evicted;
    e->stats.rejected += e->stats.step_rejected;
    return st;
}

static uint64_t dt__em_cuda_hmix(int64_t id) { /* kernels/dt_hash.cu's dt_k__hmix */
    uint64_t z = (uint64_t)id;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* After a checkpoint load (dt__em_dyn_rebuild has rebuilt the host LRU lists from the loaded
   slot_id / slot_stamp): each GPU id table is rebuilt from them on the host and copied up; the
   sightings of ids not admitted start empty, as on the CPU. */
static dt_status dt__em_cuda_dyn_restore(dt_embed *e, int ti) {
    dt__em_tab *t = &e->tabs[ti];
    dt_k_hash *hs = dt__em_cuda_hs(e, ti);
    const int64_t *sid = (const int64_t *)t->slot_id.data, *stamp = (const int64_t *)t->slot_stamp.data;
    int h;
    for (h = 0; h < t->hs_count; h++) {
        dt__em_dyn *y = &t->hs[h];
        dt_k_hash *hh = &hs[h];
        int64_t mc = hh->map_cap, n = y->n, k, cnt = 0, hdr[8] = {0, -1, -1, 0, 0, 0, 0, 0};
        int64_t *key = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)(2 * mc + 2 * n));
        int *full = (int *)dt_alloc(e->ctx, sizeof(int) * (size_t)mc);
        dt_status st = DT_OK;
        if (!key || !full) { dt_release(e->ctx, key); dt_release(e->ctx, full); return DT_ERR_OOM; }
        memset(full, 0, sizeof(int) * (size_t)mc);
        for (k = 0; k < y->used; k++) {
            uint64_t i = dt__em_cuda_hmix(sid[y->x0 + k]) & (uint64_t)(mc - 1);
            while (full[i]) i = (i + 1) & (uint64_t)(mc - 1);
            key[i] = sid[y->x0 + k]; key[mc + i] = k; full[i] = 1; cnt++;
        }
        for (k = 0; k < n; k++) {
            int64_t pv = k < y->used ? t->prev[y->x0 + k] : -1, nx = k < y->used ? t->next[y->x0 + k] : -1;
            key[2 * mc + k] = pv >= 0 ? pv - y->x0 : -1;
            key[2 * mc + n + k] = nx >= 0 ? nx - y->x0 : -1;
        }
        hdr[0] = y->used; hdr[1] = y->head >= 0 ? y->head - y->x0 : -1; hdr[2] = y->tail >= 0 ? y->tail - y->x0 : -1;
        hdr[3] = y->stamp; hdr[4] = cnt;
        st = dt__em_cuda_put(e, hh->map_key, key, (size_t)mc * sizeof(int64_t));
        if (!st) st = dt__em_cuda_put(e, hh->map_val, key + mc, (size_t)mc * sizeof(int64_t));
        if (!st) st = dt__em_cuda_put(e, hh->map_full, full, (size_t)mc * sizeof(int));
        if (!st) st = dt__em_cuda_put(e, hh->prev, key + 2 * mc, (size_t)n * sizeof(int64_t));
        if (!st) st = dt__em_cuda_put(e, hh->next, key + 2 * mc + n, (size_t)n * sizeof(int64_t));
        if (!st) st = dt__em_cuda_put(e, hh->slot_id, sid + y->x0, (size_t)n * sizeof(int64_t));
        if (!st) st = dt__em_cuda_put(e, hh->slot_stamp, stamp + y->x0, (size_t)n * sizeof(int64_t));
        if (!st) st = dt__em_cuda_put(e, hh->hdr, hdr, sizeof hdr);
        dt_release(e->ctx, key); dt_release(e->ctx, full);
        if (st) return st;
        DT__TRY(dt_cuda_memset(e->ctx, hh->seen_full, 0, (size_t)hh->seen_cap * sizeof(int), "dt_embed_checkpoint_load"));
    }
    return DT_OK;
}

static dt_status dt__em_cuda_check(dt_embed *e, const dt_tensor *t, const char *fn, const char *arg) {
    if (!t) return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: %s is NULL", fn, arg);
    if (t->device != DT_CUDA_DEVICE)
        return dt_ctx_set_error(e->ctx, DT_ERR_DEVICE, "%s: %s is on %s; expected a cuda tensor (the dt_embed was "
                                "created with desc.device cuda)", fn, arg, dt_device_name(t->device));
    if (t->dtype != DT_F32)
        return dt_ctx_set_error(e->ctx, DT_ERR_DTYPE, "%s: %s has dtype %s; expected f32", fn, arg,
                                dt_dtype_name(t->dtype));
    if (!t->data && t->numel > 0) return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "%s: %s has no data", fn, arg);
    return DT_OK;
}

/* Host staging: n int64 and m floats. */
static dt_status dt__em_cuda_stage_buf(dt_embed *e, int64_t n, int64_t m) {
    DT__TRY(dt_grow(e->ctx, (void **)&e->cu_hi, &e->cu_hi_cap, n + 1, sizeof(int64_t), "dt_embed cuda staging"));
    return dt_grow(e->ctx, (void **)&e->cu_hf, &e->cu_hf_cap, m + 1, sizeof(float), "dt_embed cuda staging");
}

/* Pools n_bags bags of t (local rows rows[], bag offsets offs[n_bags + 1], weights or NULL; all
   host arrays) into e->cu_tmp [n_bags, nc] on the device (the path with a sequence feature). */
static dt_status dt__em_cuda_pool(dt_embed *e, const dt__em_tab *t, const int64_t *rows, const int64_t *offs,
                                  const float *w, int64_t n_bags, int64_t nc) {
    int64_t n = offs[n_bags], nt;
    if (!dt_mul_ok(n_bags, nc, &nt)) return dt_ctx_set_error(e->ctx, DT_ERR_ARG, "dt_embed_forward: %lld bags x %lld "
                                                             "columns overflows", (long long)n_bags, (long long)nc);
    DT__TRY(dt__em_cuda_need(e, &e->cu_i, DT_I64, n + n_bags + 1));
    DT__TRY(dt__em_cuda_need(e, &e->cu_f, DT_F32, n + 1));
    DT__TRY(dt__em_cuda_need(e, &e->cu_tmp, DT_F32, nt + 1));
    DT__TRY(dt__em_cuda_put(e, e->cu_i.data, rows, (size_t)n * sizeof(int64_t)));
    DT__TRY(dt__em_cuda_put(e, (int64_t *)e->cu_i.data + n, offs, (size_t)(n_bags + 1) * sizeof(int64_t)));
    if (w) DT__TRY(dt__em_cuda_put(e, e->cu_f.data, w, (size_t)n * sizeof(float)));
    return dt__em_cuda_err(e, dt_k_embed_pool_fwd((float *)e->cu_tmp.data, dt__em_cuda_w(t), (int)t->dtype,
                                                  (const int64_t *)e->cu_i.data, w ? (const float *)e->cu_f.data : NULL,
                                                  (const int64_t *)e->cu_i.data + n, n_bags, nc, t->c1 - t->c0, 0,
                                                  e->ctx->cuda_stream), "dt_k_embed_pool_fwd");
}

/* The features' descriptors for the requests made on the device (DT_K_EMBED_FD each, see
   kernels/dt_kernels.h), once. */
static dt_status dt__em_cuda_fdesc(dt_embed *e) {
    int F = e->n_feat, f;
    int64_t *h;
    dt_status st;
    if (!(h = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)(F * DT_K_EMBED_FD)))) return DT_ERR_OOM;
    memset(h, 0, sizeof(int64_t) * (size_t)(F * DT_K_EMBED_FD));
    for (f = 0; f < F; f++) {
        const dt__em_tab *t = &e->tabs[e->feat_tab[f]];
        int64_t *d = h + (int64_t)f * DT_K_EMBED_FD;
        d[0] = t->shard == DT_SHARD_TABLE ? 1 : t->shard == DT_SHARD_ROW ? 2 : t->shard == DT_SHARD_TABLE_ROW ? 3 :
               t->shard == DT_SHARD_COLUMN ? 4 : 0;
        d[1] = t->shard == DT_SHARD_TABLE ? t->owner : t->gfirst;
        d[2] = t->gsize; d[3] = t->rows; d[4] = t->dim; d[5] = t->ids == DT_IDS_HASH;
        d[6] = e->feat_in[f]; d[7] = e->feat_off[f]; d[8] = t->pooling == DT_POOL_MEAN; d[9] = t->weighted;
        d[10] = e->feat_tab[f]; d[11] = t->c1 - t->c0; d[12] = t->r0;
    }
    st = dt__em_cuda_need(e, &e->cu_fdesc, DT_I64, (int64_t)F * DT_K_EMBED_FD);
    if (!st) st = dt__em_cuda_put(e, e->cu_fdesc.data, h, sizeof(int64_t) * (size_t)(F * DT_K_EMBED_FD));
    dt_release(e->ctx, h);
    return st;
}

/* The feature lists of the data-parallel tables on the device (once): per table its features'
   (kjt input, pooled column) pairs, then every table's dim (dt_k_embed_bags, _dp_copies). */
static dt_status dt__em_cuda_tdesc(dt_embed *e) {
    int T = e->n_tabs, ti, f;
    int64_t n = 0, *h;
    dt_status st;
    if (e->cu_tdo) return DT_OK;
    if (!(e->cu_tdo = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)(2 * T)))) return DT_ERR_OOM;
    e->cu_tdm = e->cu_tdo + T;
    for (ti = 0; ti < T; ti++) {
        e->cu_tdo[ti] = n; e->cu_tdm[ti] = 0;
        for (f = 0; f < e->n_feat; f++)
            if (e->feat_tab[f] == ti && e->tabs[ti].shard == DT_SHARD_DATA) { n++; e->cu_tdm[ti]++; }
    }
    if (!(h = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)(2 * n + T + 1)))) return DT_ERR_OOM;
    for (ti = 0; ti < T; ti++) {
        int64_t k = e->cu_tdo[ti];
        for (f = 0; f < e->n_feat; f++)
            if (e->feat_tab[f] == ti && e->tabs[ti].shard == DT_SHARD_DATA) {
                h[2 * k] = e->feat_in[f]; h[2 * k + 1] = e->feat_off[f];
                k++;
            }
        h[2 * n + ti] = e->tabs[ti].dim;
    }
    st = dt__em_cuda_need(e, &e->cu_tdesc, DT_I64, 2 * n + T + 1);
    if (!st) st = dt__em_cuda_put(e, e->cu_tdesc.data, h, (size_t)(2 * n + T) * sizeof(int64_t));
    dt_release(e->ctx, h);
    if (!st) st = dt__em_cuda_fdesc(e);
    return st;
}

/* Whether a data-parallel table is weighted (its weights go up with the batch). */
static int dt__em_cuda_dp_weighted(const dt_embed *e) {
    int ti;
    for (ti = 0; ti < e->n_tabs; ti++)
        if (e->tabs[ti].shard == DT_SHARD_DATA && e->tabs[ti].weighted) return 1;
    return 0;
}

/* The batch up, for the device path's data-parallel tables: lengths, the ids as given and (a
   weighted data-parallel table) the weights, the only bytes of their step that cross PCIe (the
   ids were checked on the host as the batch was read, dt__em_read_batch); the kjt's bag offsets
   then on the device. Called at begin; the batch begun ahead keeps its own copy (dt__em_swap). */
static dt_status dt__em_cuda_batch(dt_embed *e, const dt_kjt *k) {
    int64_t ni = (int64_t)e->n_in * e->B, nid = ni > 0 ? e->in_offs[ni] : 0;
    size_t es;
    if (!dt__em_cuda_dev(e) || (!e->any_dp && !e->cu_devreq)) return DT_OK;
    DT__TRY(dt__em_cuda_tdesc(e));
    e->cu_k64 = k->ids_dtype != DT_I32;
    es = e->cu_k64 ? sizeof(int64_t) : sizeof(int32_t);
    DT__TRY(dt__em_cuda_need(e, &e->cu_kl, DT_I64, 2 * ni + 1));
    DT__TRY(dt__em_cuda_need(e, &e->cu_kid, DT_I64, nid + 1));
    if (ni > 0) DT__TRY(dt__em_cuda_put(e, e->cu_kl.data, k->lengths, (size_t)ni * sizeof(int64_t)));
    if (nid > 0) DT__TRY(dt__em_cuda_put(e, e->cu_kid.data, k->ids, (size_t)nid * es));
    if (nid > 0 && k->weights && (dt__em_cuda_dp_weighted(e) || (e->cu_devreq && e->any_weighted))) {
        DT__TRY(dt__em_cuda_need(e, &e->cu_kw, DT_F32, nid + 1));
        DT__TRY(dt__em_cuda_put(e, e->cu_kw.data, k->weights, (size_t)nid * sizeof(float)));
    }
    return dt__em_cuda_err(e, dt_k_embed_kjt_offsets((int64_t *)e->cu_kl.data + ni, (const int64_t *)e->cu_kl.data,
                                                      ni, e->ctx->cuda_stream), "dt_k_embed_kjt_offsets");
}

/* The ids of data-parallel table ti in this rank's batch (host, from the bag offsets). */
static int64_t dt__em_cuda_dp_ids(const dt_embed *e, int ti) {
    int64_t n = 0, B = e->B;
    int f;
    for (f = 0; f < e->n_feat; f++)
        if (e->feat_tab[f] == ti && e->tabs[ti].shard == DT_SHARD_DATA)
            n += e->offs[(int64_t)(f + 1) * B] - e->offs[(int64_t)f * B];
    return n;
}

/* Table ti's bags from the uploaded batch, in (sample, feature) order (dt_k_embed_bags): rows
   [n], weights [n] (a weighted table), offsets [m B + 1], places in the pooled output [m B]. */
static dt_status dt__em_cuda_dp_bags(dt_embed *e, int ti, int64_t *rows, float *w, int64_t *offs, int64_t *doff,
                                     int64_t *total) {
    const dt__em_tab *t = &e->tabs[ti];
    int64_t ni = (int64_t)e->n_in * e->B;
    return dt__em_cuda_err(e, dt_k_embed_bags(rows, t->weighted ? w : NULL, offs, doff, total,
                                               (const int64_t *)e->cu_kl.data + ni, e->cu_kid.data, e->cu_k64,
                                               t->weighted ? (const float *)e->cu_kw.data : NULL,
                                               (const int64_t *)e->cu_tdesc.data + 2 * e->cu_tdo[ti],
                                               (int)e->cu_tdm[ti], e->B, t->r0,
                                               t->ids == DT_IDS_HASH ? t->rows : 0, e->pooled_dim, e->ctx->cuda_stream),
                           "dt_k_embed_bags");
}

/* Data-parallel features on the device path, from the batch on the device: per table its bags
   (dt__em_cuda_dp_bags) pooled in one launch straight into their columns of the pooled output
   (divided there for mean), after the output is zeroed. Nothing goes up. */
static dt_status dt__em_cuda_dp_dev(dt_embed *e) {
    int64_t B = e->B, ni = 0, nf = 0, oi = 0, of = 0;
    int ti;
    DT__TRY(dt__em_cuda_need(e, &e->cu_pooled, DT_F32, B * e->pooled_dim + 1));
    DT__TRY(dt_cuda_memset(e->ctx, e->cu_pooled.data, 0, (size_t)(B * e->pooled_dim) * sizeof(float), "dt_embed_forward"));
    if (!e->any_dp || B == 0) return DT_OK;
    for (ti = 0; ti < e->n_tabs; ti++) {
        int64_t m = e->cu_tdm[ti], n = dt__em_cuda_dp_ids(e, ti);
        if (m == 0) continue;
        ni += n + 2 * m * B + 1; nf += n;
    }
    DT__TRY(dt__em_cuda_need(e, &e->cu_dmeta, DT_I64, ni + 1));
    DT__TRY(dt__em_cuda_need(e, &e->cu_dmetaf, DT_F32, nf + 1));
    for (ti = 0; ti < e->n_tabs; ti++) {
        const dt__em_tab *t = &e->tabs[ti];
        int64_t m = e->cu_tdm[ti], n = dt__em_cuda_dp_ids(e, ti);
        int64_t *rows = (int64_t *)e->cu_dmeta.data + oi, *offs = rows + n, *doff = offs + m * B + 1;
        float *w = (float *)e->cu_dmetaf.data + of;
        if (m == 0) continue;
        DT__TRY(dt__em_cuda_dp_bags(e, ti, rows, w, offs, doff, NULL));
        DT__TRY(dt__em_cuda_err(e, dt_k_embed_pool_fwd_at((float *)e->cu_pooled.data, doff, dt__em_cuda_w(t), (int)t->dtype,
                                                           rows, t->weighted ? w : NULL, offs, m * B, t->dim,
                                                           t->c1 - t->c0, t->pooling == DT_POOL_MEAN,
                                                           e->ctx->cuda_stream), "dt_k_embed_pool_fwd_at"));
        oi += n + 2 * m * B + 1; of += n;
    }
    return DT_OK;
}

/* Data-parallel features: each feature's bags in one launch, copied down into the pooled
   buffer (or the sequence rows) where the CPU path writes them; on the device path, into the
   device's pooled output (dt__em_cuda_dp_dev). */
static dt_status dt__em_cuda_dp_pool(dt_embed *e) {
    int f;
    int64_t B = e->B, b, j;
    if (dt__em_cuda_dev(e)) return dt__em_cuda_dp_dev(e);
    for (f = 0; f < e->n_feat; f++) {
        const dt__em_tab *t = &e->tabs[e->feat_tab[f]];
        int64_t i0 = e->offs[(int64_t)f * B], n = e->offs[(int64_t)(f + 1) * B] - i0;
        int seq = t->pooling == DT_POOL_NONE;
        int64_t nb = seq ? n : B;
        if (t->shard != DT_SHARD_DATA || nb == 0) continue;
        DT__TRY(dt__em_cuda_stage_buf(e, n + nb + 1, nb * t->dim));
        for (j = 0; j < n; j++) e->cu_hi[j] = e->rows[i0 + j] - t->r0;
        for (b = 0; b <= nb; b++) e->cu_hi[n + b] = seq ? b : e->offs[(int64_t)f * B + b] - i0;
        DT__TRY(dt__em_cuda_pool(e, t, e->cu_hi, e->cu_hi + n, t->weighted ? e->wts + i0 : NULL, nb, t->dim));
        if (seq) DT__TRY(dt__em_cuda_get(e, e->seq + e->seq_off[f], e->cu_tmp.data, (size_t)(n * t->dim) * sizeof(float)));
        else {
            DT__TRY(dt__em_cuda_get(e, e->cu_hf, e->cu_tmp.data, (size_t)(B * t->dim) * sizeof(float)));
            for (b = 0; b < B; b++)
                memcpy((float *)e->pooled.data + b * e->pooled_dim + e->feat_off[f], e->cu_hf + b * t->dim,
                       (size_t)t->dim * sizeof(float));
        }
    }
    return DT_OK;
}

/* Requests made on the device: the device path (every feature pooled) with static tables only
   (a dynamic table's ids become slots on the owner through the GPU id tables and a copy down:
   that path keeps the host's requests), none of them tiered (the host's cache bookkeeping maps
   an owner's rows to cache slots: the requests must be on the host). */
static int dt__em_cuda_devreq(const dt_embed *e) {
    return dt__em_cuda_dev(e) && !e->any_dyn && !e->any_tier;
}

/* Where the requests of this batch sit in cu_rq / cu_rqf: sent headers [4 S], rows [n]; received
   headers [4 Q], rows [m] (cnt: ints per dest, HDR + ids per request; cu_cx: what arrives). */
typedef struct dt__em_rqlay { int64_t S, n, Q, m; int64_t *sh, *sp, *rh, *rp; float *sf, *rf; } dt__em_rqlay;
static void dt__em_cuda_rqlay(dt_embed *e, dt__em_rqlay *l) {
    int W = e->size, r;
    int64_t K = 4 + 2 * (int64_t)e->n_tabs, *rx = e->cu_cx + W + 2 * (int64_t)W * e->n_tabs;
    l->S = l->n = l->Q = l->m = 0;
    for (r = 0; r < W; r++) {
        l->S += e->cu_cx[r]; l->n += e->cnt[r] - DT__EM_HDR * e->cu_cx[r];
        l->Q += rx[K * r + 2]; l->m += rx[K * r] - DT__EM_HDR * rx[K * r + 2];
    }
    l->sh = (int64_t *)e->cu_rq.data; l->sp = l->sh + 4 * l->S; l->rh = l->sp + l->n; l->rp = l->rh + 4 * l->Q;
    l->sf = e->any_weighted ? (float *)e->cu_rqf.data : NULL; l->rf = l->sf ? l->sf + l->n : NULL;
}

/* The requester side of a forward on the device (dt_k_embed_requests: the host's generation,
   rule for rule, from the uploaded batch): the requests, destination-major, and this batch's
   scatter (runs, segments, divisors: kept to its backward); then the id exchange on device
   tensors (headers, rows, weights: three all-to-alls, NCCL or dt_comm's staged path). The host
   counted the same requests (dt__em_generate's counting pass), which sizes everything. */
static dt_status dt__em_cuda_requests(dt_embed *e) {
    int W = e->size, f, r, k;
    int64_t K = 4 + 2 * (int64_t)e->n_tabs, *rx = e->cu_cx + W + 2 * (int64_t)W * e->n_tabs, B = e->B, R = e->n_feat * B;
    int64_t maxd = 0, *c, ni = (int64_t)e->n_in * B;
    dt__em_rqlay l;
    dt_status st = DT_OK;
    for (f = 0; f < e->n_feat; f++) if (e->tabs[e->feat_tab[f]].dim > maxd) maxd = e->tabs[e->feat_tab[f]].dim;
    dt__em_cuda_rqlay(e, &l); /* sizes (the pointers are set again below, once the buffers exist) */
    DT__TRY(dt__em_cuda_need2(e, &e->cu_rq, DT_I64, 4 * (l.S + l.Q) + l.n + l.m + 1));
    DT__TRY(dt__em_cuda_need2(e, &e->cu_rqf, DT_F32, e->any_weighted ? l.n + l.m + 1 : 1));
    DT__TRY(dt__em_cuda_need2(e, &e->cu_smeta, DT_I64, 3 * R + 9 * l.S + 1));
    DT__TRY(dt__em_cuda_need2(e, &e->cu_smetaf, DT_F32, R + l.S + 1));
    dt__em_cuda_rqlay(e, &l);
    e->cu_fR = R; e->cu_fS = l.S; e->cu_fmax = e->cu_bmax = maxd;
    if (B > 0) {
        int64_t *sm = (int64_t *)e->cu_smeta.data;
        DT__TRY(dt__em_cuda_err(e, dt_k_embed_requests(l.sh, l.sp, l.sf, sm, sm + 3 * R, sm + 3 * R + 3 * l.S,
                                                        sm + 3 * R + 6 * l.S, (float *)e->cu_smetaf.data,
                                                        (const int64_t *)e->cu_kl.data + ni, e->cu_kid.data, e->cu_k64,
                                                        e->cu_kw.data ? (const float *)e->cu_kw.data : NULL,
                                                        (const int64_t *)e->cu_fdesc.data, e->n_feat, B, W, e->g0,
                                                        e->pooled_dim, e->ctx->cuda_stream), "dt_k_embed_requests"));
    }
    if (!e->comm) { /* a world of one: received = sent */
        DT__TRY(dt__em_cuda_d2d(e, l.rh, l.sh, (size_t)(4 * l.S) * sizeof(int64_t)));
        DT__TRY(dt__em_cuda_d2d(e, l.rp, l.sp, (size_t)l.n * sizeof(int64_t)));
        if (l.sf) DT__TRY(dt__em_cuda_d2d(e, l.rf, l.sf, (size_t)l.n * sizeof(float)));
        return DT_OK;
    }
    if (!(c = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)(2 * W)))) return DT_ERR_OOM;
    for (k = 0; k < 3 && !st; k++) {
        dt_tensor sv, rv;
        dt_tensor *buf = k == 2 ? &e->cu_rqf : &e->cu_rq;
        int64_t so = k == 0 ? 0 : k == 1 ? 4 * l.S : 0, ro, sn = 0, rn = 0, sh[1];
        if (k == 2 && !l.sf) break;
        for (r = 0; r < W; r++) {
            int64_t q = e->cu_cx[r], rq = rx[K * r + 2];
            c[r] = k == 0 ? 4 * q : k == 1 ? e->cnt[r] - DT__EM_HDR * q : e->cnt[W + r];
            c[W + r] = k == 0 ? 4 * rq : k == 1 ? rx[K * r] - DT__EM_HDR * rq : rx[K * r + 1];
            sn += c[r]; rn += c[W + r];
        }
        ro = k == 0 ? 4 * l.S + l.n : k == 1 ? 4 * (l.S + l.Q) + l.n : l.n;
        sh[0] = sn;
        st = dt_tensor_view(e->ctx, &sv, buf, so, 1, sh);
        sh[0] = rn;
        if (!st) st = dt_tensor_view(e->ctx, &rv, buf, ro, 1, sh);
        if (!st) st = dt_comm_alltoallv(e->comm, &rv, c + W, &sv, c);
    }
    dt_release(e->ctx, c);
    return st;
}

/* The owner side of a forward whose requests were made on the device: the received requests
   laid out per table (dt_k_embed_serve_layout: rows, bag offsets, the results' places; the
   sizes per table came with the counts at begin), then each table's bags pooled in one launch
   straight into their places in the response. Nothing crosses PCIe. */
static dt_status dt__em_cuda_serve_dev(dt_embed *e, int64_t tot_res) {
    int W = e->size, T = e->n_tabs, r, ti;
    int64_t K = 4 + 2 * (int64_t)T, *rx = e->cu_cx + W + 2 * (int64_t)W * T, ni = 0, nf = 0, any = 0;
    dt__em_cutab *tm;
    dt__em_rqlay l;
    size_t mark;
    int64_t *scr;
    dt_status st = DT_OK;
    DT__TRY(dt__em_cuda_need2(e, &e->cu_resp, DT_F32, tot_res + 1));
    DT__TRY(dt_grow(e->ctx, (void **)&e->cu_tm, &e->cu_tm_cap, T + 1, sizeof(dt__em_cutab), "dt_embed cuda tables"));
    tm = e->cu_tm;
    for (ti = 0; ti < T; ti++) {
        memset(&tm[ti], 0, sizeof tm[ti]);
        for (r = 0; r < W; r++) { tm[ti].n += rx[K * r + 4 + 2 * ti]; tm[ti].nb += rx[K * r + 5 + 2 * ti]; }
        tm[ti].rows = ni; tm[ti].offs = ni + tm[ti].n; tm[ti].dst = tm[ti].offs + tm[ti].nb + 1; tm[ti].w = nf;
        ni += tm[ti].n + 2 * tm[ti].nb + 1; nf += tm[ti].n;
        any += tm[ti].nb;
    }
    if (any == 0) return DT_OK;
    DT__TRY(dt__em_cuda_need2(e, &e->cu_meta, DT_I64, ni + 1));
    DT__TRY(dt__em_cuda_need2(e, &e->cu_metaf, DT_F32, nf + 1));
    dt__em_cuda_rqlay(e, &l);
    mark = dt_cuda_scratch_begin(e->ctx);
    scr = (int64_t *)dt_cuda_scratch(e->ctx, (size_t)(4 * l.Q + 1) * sizeof(int64_t), "dt_embed_forward"); /* x 2: headroom */
    if (!scr) st = DT_ERR_OOM;
    if (!st)
        st = dt__em_cuda_err(e, dt_k_embed_serve_layout((int64_t *)e->cu_meta.data, (float *)e->cu_metaf.data, scr, l.rh,
                                                         l.rp, l.rf, (const int64_t *)e->cu_fdesc.data, l.Q, T,
                                                         e->ctx->cuda_stream), "dt_k_embed_serve_layout");
    dt_cuda_scratch_end(e->ctx, mark);
    for (ti = 0; !st && ti < T; ti++) {
        const dt__em_tab *t = &e->tabs[ti];
        const dt__em_cutab *c = &tm[ti];
        const int64_t *dm = (const int64_t *)e->cu_meta.data;
        int64_t nc = t->c1 - t->c0;
        if (c->nb == 0) continue;
        st = dt__em_cuda_err(e, dt_k_embed_pool_fwd_at((float *)e->cu_resp.data, dm + c->dst, t->w.data, (int)t->dtype,
                                                        dm + c->rows,
                                                        t->weighted ? (const float *)e->cu_metaf.data + c->w : NULL,
                                                        dm + c->offs, c->nb, nc, nc, 0, e->ctx->cuda_stream),
                             "dt_k_embed_pool_fwd_at");
    }
    return st;
}

/* Owner side of the forward (dt__em_serve's walk). Every table's requests as index arrays on
   the host: local rows [n] (-1: a dynamic id not admitted), request offsets [nb + 1], and the
   copies into the response: destination [nb] (where the request's result goes, which is also
   where its gradient arrives in the backward), source [nb], length [nb]; weights [n]. They go
   up in one copy (and one for the weights), stay on the device for the backward (e->cu_tm says
   where), and each table is pooled in one launch into its part of cu_tmp, then moved into the
   response (e->cu_resp, tot_res floats) by one dt_k_embed_copies. */
static dt_status dt__em_cuda_serve(dt_embed *e, int64_t tot_res) {
    const int64_t *rin = (const int64_t *)e->rbuf_i.data, *cnt_i = e->cnt + 3 * e->size;
    const float *rfl = (const float *)e->rbuf_f.data;
    int64_t end = 0, ti, ni = 0, nf = 0, nt = 0, maxrows = 0;
    dt__em_cutab *tm;
    int s;
    for (s = 0; s < e->size; s++) end += cnt_i[s];
    DT__TRY(dt__em_cuda_need2(e, &e->cu_resp, DT_F32, tot_res + 1));
    DT__TRY(dt_grow(e->ctx, (void **)&e->cu_tm, &e->cu_tm_cap, e->n_tabs + 1, sizeof(dt__em_cutab), "dt_embed cuda tables"));
    tm = e->cu_tm;
    for (ti = 0; ti < e->n_tabs; ti++) { /* count: ids and requests of each table */
        int64_t p = 0;
        memset(&tm[ti], 0, sizeof tm[ti]);
        while (p < end) {
            if (e->feat_tab[rin[p]] == ti) { tm[ti].nb++; tm[ti].n += rin[p + 3]; }
            p += DT__EM_HDR + rin[p + 3];
        }
        if (tm[ti].nb > 2147483647) return dt_ctx_set_error(e->ctx, DT_ERR_UNSUPPORTED, "dt_embed_forward: %lld "
                                                            "requests for table %s in one forward (cuda: at most "
                                                            "2^31 - 1)", (long long)tm[ti].nb, e->tabs[ti].name);
        tm[ti].rows = ni; tm[ti].offs = ni + tm[ti].n; tm[ti].dst = tm[ti].offs + tm[ti].nb + 1;
        tm[ti].src = tm[ti].dst + tm[ti].nb; tm[ti].len = tm[ti].src + tm[ti].nb; tm[ti].w = nf; tm[ti].tmp = nt;
        ni = tm[ti].len + tm[ti].nb;
        nf += tm[ti].n;
        nt += tm[ti].nb * (e->tabs[ti].c1 - e->tabs[ti].c0);
        if (e->tabs[ti].r1 - e->tabs[ti].r0 > maxrows) maxrows = e->tabs[ti].r1 - e->tabs[ti].r0;
    }
    for (ti = 0; ti < e->n_tabs && tm[ti].nb == 0; ti++) {}
    if (ti == e->n_tabs) return DT_OK; /* no requests (every table data-parallel): nothing to send up */
    DT__TRY(dt__em_cuda_stage_buf(e, ni, nf));
    DT__TRY(dt__em_cuda_need2(e, &e->cu_meta, DT_I64, ni + 1));
    DT__TRY(dt__em_cuda_need2(e, &e->cu_metaf, DT_F32, nf + 1));
    DT__TRY(dt__em_cuda_need2(e, &e->cu_tmp, DT_F32, nt + 1));
    { /* dt_grow leaves the new bytes as they come: the bits start clear */
        int64_t had = e->cu_seen ? e->cu_seen_cap : 0;
        DT__TRY(dt_grow(e->ctx, (void **)&e->cu_seen, &e->cu_seen_cap, maxrows / 8 + 1, 1, "dt_embed cuda rows"));
        memset(e->cu_seen + had, 0, (size_t)(e->cu_seen_cap - had));
    }
    { /* fill, in one walk over the requests (the order of each table's ids: the backward's order) */
        int64_t p = 0, q = 0, o = 0, *jn, *jb;
        if (!(jn = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)(2 * e->n_tabs)))) return DT_ERR_OOM;
        jb = jn + e->n_tabs;
        for (ti = 0; ti < e->n_tabs; ti++) { jn[ti] = 0; jb[ti] = 0; e->cu_hi[tm[ti].offs] = 0; }
        while (p < end) {
            int f = (int)rin[p];
            int64_t m = rin[p + 3], j, nc;
            dt__em_tab *t;
            dt__em_cutab *c;
            ti = e->feat_tab[f];
            t = &e->tabs[ti]; c = &tm[ti];
            nc = t->c1 - t->c0;
            for (j = 0; j < m; j++) {
                int64_t r = rin[p + DT__EM_HDR + j], x = r < 0 ? -1 : r - t->r0;
                dt_status st = t->tier && x >= 0 ? dt__em_cuda_tier_row(e, t, &x) : DT_OK; /* its cache slot */
                if (st) { dt_release(e->ctx, jn); return st; }
                e->cu_hi[c->rows + jn[ti]] = x;
                e->cu_hf[c->w + jn[ti]] = e->any_weighted ? rfl[q + j] : 1.0f;
                jn[ti]++;
            }
            e->cu_hi[c->offs + jb[ti] + 1] = jn[ti];
            e->cu_hi[c->dst + jb[ti]] = o; e->cu_hi[c->src + jb[ti]] = jb[ti] * nc; e->cu_hi[c->len + jb[ti]] = nc;
            jb[ti]++;
            o += nc;
            p += DT__EM_HDR + m;
            if (e->any_weighted) q += m;
        }
        dt_release(e->ctx, jn);
    }
    for (ti = 0; ti < e->n_tabs; ti++) { /* the unique rows of each table (stats.rows_updated at the backward) */
        const int64_t *r = e->cu_hi + tm[ti].rows;
        int64_t j;
        for (j = 0; j < tm[ti].n; j++)
            if (r[j] >= 0 && !(e->cu_seen[r[j] >> 3] & (1u << (r[j] & 7)))) {
                e->cu_seen[r[j] >> 3] |= (unsigned char)(1u << (r[j] & 7));
                tm[ti].uniq++;
            }
        for (j = 0; j < tm[ti].n; j++) if (r[j] >= 0) e->cu_seen[r[j] >> 3] = 0;
    }
    DT__TRY(dt__em_cuda_put(e, e->cu_meta.data, e->cu_hi, (size_t)ni * sizeof(int64_t)));
    if (e->any_weighted) DT__TRY(dt__em_cuda_put(e, e->cu_metaf.data, e->cu_hf, (size_t)nf * sizeof(float)));
    if (e->any_tier) DT__TRY(dt__em_cuda_tier_run(e, 0)); /* the missing rows into their slots, first */
    for (ti = 0; ti < e->n_tabs; ti++) {
        const dt__em_tab *t = &e->tabs[ti];
        const dt__em_cutab *c = &tm[ti];
        const int64_t *dm = (const int64_t *)e->cu_meta.data;
        int64_t nc = t->c1 - t->c0;
        float *tmp = (float *)e->cu_tmp.data + c->tmp;
        if (c->nb == 0) continue;
        DT__TRY(dt__em_cuda_err(e, dt_k_embed_pool_fwd(tmp, dt__em_cuda_w(t), (int)t->dtype, dm + c->rows,
                                                        t->weighted ? (const float *)e->cu_metaf.data + c->w : NULL,
                                                        dm + c->offs, c->nb, nc, nc, 0, e->ctx->cuda_stream),
                                "dt_k_embed_pool_fwd"));
        DT__TRY(dt__em_cuda_err(e, dt_k_embed_copies(e->cu_resp.data, tmp, dm + c->dst, dm + c->src, dm + c->len,
                                                      (int)c->nb, nc, 4, e->ctx->cuda_stream), "dt_k_embed_copies"));
    }
    return DT_OK;
}

/* The return all-to-all on device tensors (NCCL, or dt_comm's staged path), then, with a
   sequence feature, the rows copied down into e->res (tot floats), where the CPU path's
   bag-order scatter reads them; on the device path they stay (dt__em_cuda_end). */
static dt_status dt__em_cuda_return(dt_embed *e, int64_t tot) {
    int W = e->size;
    int64_t *cnt = e->cnt;
    DT__TRY(dt__em_cuda_need2(e, &e->cu_res, DT_F32, tot + 1));
    if (!e->comm) DT__TRY(dt__em_cuda_d2d(e, e->cu_res.data, e->cu_resp.data, (size_t)cnt[5 * W] * sizeof(float)));
    else DT__TRY(dt_comm_alltoallv(e->comm, &e->cu_res, cnt + 2 * W, &e->cu_resp, cnt + 5 * W));
    if (dt__em_cuda_dev(e)) return DT_OK;
    return dt__em_cuda_get(e, e->res.data, e->cu_res.data, (size_t)tot * sizeof(float));
}

/* The end of a forward on the device path: the returned rows (cu_res) added into the pooled
   output in the CPU's order (every bag's results in generation order: a row-wise bag's rows in
   bag order) and divided by the length for mean, by one dt_k_embed_gather_sum; then copied
   into out. The index arrays of this scatter and of the backward's (each request's gradient:
   its slice of dout, / length for mean, laid out as its result was) go up in one copy, and
   one for the divisors. */
static dt_status dt__em_cuda_end(dt_embed *e, dt_tensor *out, int64_t tot) {
    int64_t B = e->B, F = e->n_feat, S = e->n_segs, R = F * B, k, r, *h, *start, ni, maxd = 0, maxnc = 0;
    float *dv;
    int f;
    (void)tot;
    if (!e->cu_devreq) e->cu_fR = e->cu_fS = 0; /* the backward's layout: none unless set below (or at begin) */
    if (B == 0 || e->pooled_dim == 0) return DT_OK;
    for (f = 0; f < F && e->tabs[e->feat_tab[f]].shard == DT_SHARD_DATA; f++) {}
    if (f == F) /* data-parallel only: pooled (and divided) on the device already */
        return dt__em_cuda_d2d(e, out->data, e->cu_pooled.data, (size_t)(B * e->pooled_dim) * sizeof(float));
    if (e->cu_devreq) { /* the scatter's layout was made with the requests (dt__em_cuda_requests) */
        S = e->cu_fS;
        DT__TRY(dt__em_cuda_err(e, dt_k_embed_gather_sum((float *)e->cu_pooled.data, (const float *)e->cu_res.data,
                                                          (const int64_t *)e->cu_smeta.data,
                                                          (const int64_t *)e->cu_smeta.data + 3 * R,
                                                          (const float *)e->cu_smetaf.data, R, S, e->cu_fmax, 1,
                                                          e->ctx->cuda_stream), "dt_k_embed_gather_sum"));
        return dt__em_cuda_d2d(e, out->data, e->cu_pooled.data, (size_t)(B * e->pooled_dim) * sizeof(float));
    }
    ni = 3 * R + 9 * S;
    DT__TRY(dt__em_cuda_stage_buf(e, ni + R + 1, R + S));
    DT__TRY(dt__em_cuda_need2(e, &e->cu_smeta, DT_I64, ni + 1));
    DT__TRY(dt__em_cuda_need2(e, &e->cu_smetaf, DT_F32, R + S + 1));
    h = e->cu_hi; dv = e->cu_hf;
    start = h + ni; /* R + 1 counts: each run's first segment (a stable counting sort by (f, b)) */
    for (r = 0; r <= R; r++) start[r] = 0;
    for (k = 0; k < S; k++) start[(int64_t)e->segs[k].f * B + e->segs[k].b + 1]++;
    for (r = 0; r < R; r++) start[r + 1] += start[r];
    for (f = 0; f < F; f++) {
        const dt__em_tab *t = &e->tabs[e->feat_tab[f]];
        int64_t b;
        if (t->dim > maxd) maxd = t->dim;
        for (b = 0; b < B; b++) {
            int64_t n = e->offs[(int64_t)f * B + b + 1] - e->offs[(int64_t)f * B + b];
            r = (int64_t)f * B + b;
            h[3 * r] = b * e->pooled_dim + e->feat_off[f]; h[3 * r + 1] = t->dim; h[3 * r + 2] = start[r];
            dv[r] = t->pooling == DT_POOL_MEAN && n > 0 && t->shard != DT_SHARD_DATA ? (float)n : 1.0f;
        }
    }
    for (k = 0; k < S; k++) {
        const dt__em_seg *sg = &e->segs[k];
        const dt__em_tab *t = &e->tabs[e->feat_tab[sg->f]];
        int64_t n = e->offs[(int64_t)sg->f * B + sg->b + 1] - e->offs[(int64_t)sg->f * B + sg->b];
        int64_t *fs = h + 3 * R + 3 * start[(int64_t)sg->f * B + sg->b]++; /* forward segment */
        int64_t *br = h + 3 * R + 3 * S + 3 * k, *bs = h + 3 * R + 6 * S + 3 * k; /* backward run, segment */
        fs[0] = sg->res; fs[1] = sg->c0; fs[2] = sg->nc;
        br[0] = sg->res; br[1] = sg->nc; br[2] = k;
        bs[0] = sg->b * e->pooled_dim + e->feat_off[sg->f] + sg->c0; bs[1] = 0; bs[2] = sg->nc;
        dv[R + k] = t->pooling == DT_POOL_MEAN && n > 0 ? (float)n : 1.0f;
        if (sg->nc > maxnc) maxnc = sg->nc;
    }
    e->cu_fR = R; e->cu_fS = S; e->cu_fmax = maxd; e->cu_bmax = maxnc;
    DT__TRY(dt__em_cuda_put(e, e->cu_smeta.data, h, (size_t)ni * sizeof(int64_t)));
    DT__TRY(dt__em_cuda_put(e, e->cu_smetaf.data, dv, (size_t)(R + S) * sizeof(float)));
    DT__TRY(dt__em_cuda_err(e, dt_k_embed_gather_sum((float *)e->cu_pooled.data, (const float *)e->cu_res.data,
                                                      (const int64_t *)e->cu_smeta.data,
                                                      (const int64_t *)e->cu_smeta.data + 3 * R,
                                                      (const float *)e->cu_smetaf.data, R, S, maxd, 1,
                                                      e->ctx->cuda_stream), "dt_k_embed_gather_sum"));
    return dt__em_cuda_d2d(e, out->data, e->cu_pooled.data, (size_t)(B * e->pooled_dim) * sizeof(float));
}

/* Grows a device buffer to hold n elements, keeping its first `keep` (the window's pieces so far). */
static dt_status dt__em_cuda_keep_grow(dt_embed *e, dt_tensor *t, dt_dtype dtype, int64_t keep, int64_t n) {
    dt_tensor old = *t;
    dt_status st;
    if (t->data && t->numel >= n) return DT_OK;
    memset(t, 0, sizeof *t);
    st = dt__em_need_on(e, t, dtype, old.numel * 2 > n ? old.numel * 2 : n, DT_CUDA_DEVICE);
    if (!st && keep > 0) st = dt__em_cuda_d2d(e, t->data, old.data, (size_t)keep * dt_dtype_size(dtype));
    if (st) { dt_tensor_free(e->ctx, t); *t = old; return st; }
    dt_tensor_free(e->ctx, &old);
    return DT_OK;
}

/* Whether the window holds a piece of table ti. */
static int dt__em_cuda_acc_has(const dt_embed *e, int ti) {
    int64_t i;
    for (i = 0; i < e->cu_naccp; i++) if (e->cu_accp[i].t == ti) return 1;
    return 0;
}

/* Table ti's gradient contributions of this backward on the device (rows [n] local, gradient
   rows g [n, nc], in the CPU's sum order). sync 0 appends them to the window as a piece. sync 1
   puts the window's pieces of ti before them (one copy each, in order) and then deduplicates
   (dt_k_embed_dedup, a stable sort: each row's run in order) and applies the sparse optimizer.
   The CPU's pending row starts from the earlier micro-batches' sum and adds this one's
   contributions in order: the same adds as one run over the pieces, so the same bits. count:
   the unique rows go into the device's stats counter (cu_uniq; always for a window's update). */
static dt_status dt__em_cuda_apply(dt_embed *e, int ti, const int64_t *rows, const float *g, int64_t n, int64_t nc,
                                   int count) {
    const char *fn = "dt_embed_backward";
    dt__em_tab *t = &e->tabs[ti];
    int64_t *order, *seg, *nu, N = n, i;
    size_t mark;
    void *scr;
    dt_status st = DT_OK;
    if (!e->sync) { /* a piece of the window */
        if (n == 0) return DT_OK;
        DT__TRY(dt_grow(e->ctx, (void **)&e->cu_accp, &e->cu_accp_cap, e->cu_naccp + 1, sizeof *e->cu_accp,
                        "dt_embed accumulation pieces"));
        DT__TRY(dt__em_cuda_keep_grow(e, &e->cu_accr, DT_I64, e->cu_accn, e->cu_accn + n));
        DT__TRY(dt__em_cuda_keep_grow(e, &e->cu_accg, DT_F32, e->cu_accf, e->cu_accf + n * nc));
        DT__TRY(dt__em_cuda_d2d(e, (int64_t *)e->cu_accr.data + e->cu_accn, rows, (size_t)n * sizeof(int64_t)));
        DT__TRY(dt__em_cuda_d2d(e, (float *)e->cu_accg.data + e->cu_accf, g, (size_t)(n * nc) * sizeof(float)));
        e->cu_accp[e->cu_naccp].t = ti; e->cu_accp[e->cu_naccp].r = e->cu_accn;
        e->cu_accp[e->cu_naccp].f = e->cu_accf; e->cu_accp[e->cu_naccp].n = n;
        e->cu_naccp++; e->cu_accn += n; e->cu_accf += n * nc;
        return DT_OK;
    }
    for (i = 0; i < e->cu_naccp; i++) if (e->cu_accp[i].t == ti) N += e->cu_accp[i].n;
    if (N == 0) return DT_OK;
    if (N > n) count = 1; /* a window's unique rows are known only after its dedup */
    mark = dt_cuda_scratch_begin(e->ctx); /* twice the need: an owner's ids vary by batch (dt__em_cuda_need) */
    if (N > n) { /* the window's pieces of ti, then this backward's */
        int64_t *wr = (int64_t *)dt_cuda_scratch(e->ctx, (size_t)N * sizeof(int64_t), fn), o = 0;
        float *wg = (float *)dt_cuda_scratch(e->ctx, (size_t)(N * nc) * sizeof(float), fn);
        if (!wr || !wg) st = DT_ERR_OOM;
        for (i = 0; !st && i <= e->cu_naccp; i++) {
            const dt__em_accp *pc = i < e->cu_naccp ? &e->cu_accp[i] : NULL;
            const int64_t *r = pc ? (const int64_t *)e->cu_accr.data + pc->r : rows;
            const float *gs = pc ? (const float *)e->cu_accg.data + pc->f : g;
            int64_t m = pc ? pc->n : n;
            if ((pc && pc->t != ti) || m == 0) continue;
            st = dt__em_cuda_d2d(e, wr + o, r, (size_t)m * sizeof(int64_t));
            if (!st) st = dt__em_cuda_d2d(e, wg + o * nc, gs, (size_t)(m * nc) * sizeof(float));
            o += m;
        }
        rows = wr; g = wg; n = N;
    }
    order = (int64_t *)dt_cuda_scratch(e->ctx, (size_t)(4 * n + 2) * sizeof(int64_t), fn);
    scr = dt_cuda_scratch(e->ctx, dt_k_embed_dedup_scratch(2 * n), fn);
    if (!st && (!order || !scr)) st = DT_ERR_OOM;
    if (!st && count && !e->cu_uniq.data) {
        st = dt__em_cuda_need(e, &e->cu_uniq, DT_I64, 1);
        if (!st) st = dt_cuda_memset(e->ctx, e->cu_uniq.data, 0, e->cu_uniq.numel * sizeof(int64_t), fn);
    }
    seg = order + n; nu = seg + n + 1;
    if (!st)
        st = dt__em_cuda_err(e, dt_k_embed_dedup(order, seg, nu, rows, n, t->r1 - t->r0, scr, e->ctx->cuda_stream),
                             "dt_k_embed_dedup");
    if (!st && t->kind == DT_EMBED_ADAM)
        st = dt__em_cuda_err(e, dt_k_embed_sparse_adam(dt__em_cuda_w(t), (int)t->dtype, dt__em_cuda_s1(t),
                                                       dt__em_cuda_s2(t), g, rows, order, seg, nu, n, nc, nc, t->lr,
                                                       t->b1, t->b2, t->eps, t->t, e->ctx->cuda_stream),
                             "dt_k_embed_sparse_adam");
    else if (!st)
        st = dt__em_cuda_err(e, dt_k_embed_sparse_update(dt__em_cuda_w(t), (int)t->dtype, dt__em_cuda_s1(t), g, rows,
                                                         order, seg, nu, n, nc, nc,
                                                         t->kind == DT_EMBED_ADAGRAD ? 2 :
                                                         t->kind == DT_EMBED_ROWWISE_ADAGRAD ? 3 : 1,
                                                         t->lr, t->eps, e->ctx->cuda_stream), "dt_k_embed_sparse_update");
    if (!st && count) /* the unique rows (stats), counted on the device */
        st = dt__em_cuda_err(e, dt_k_embed_add_i64((int64_t *)e->cu_uniq.data, nu, e->ctx->cuda_stream),
                             "dt_k_embed_add_i64");
    dt_cuda_scratch_end(e->ctx, mark);
    return st;
}

/* After a sync-1 backward: the window is spent. The first one to close sizes the buffers at
   twice what it used (contents spent: nothing to copy), as the request buffers are sized at
   twice their first need (dt__em_cuda_need2), so the windows that follow, whose pieces vary
   with the batches, fit without allocating inside a step. */
static dt_status dt__em_cuda_acc_close(dt_embed *e) {
    int64_t nr = e->cu_accn, nf = e->cu_accf;
    dt_status st = DT_OK;
    if (e->cu_naccp == 0 && e->cu_accw > 0) return DT_OK;
    e->cu_naccp = e->cu_accn = e->cu_accf = 0;
    if (nr == 0 || e->cu_accw++ > 0) return DT_OK;
    if (e->cu_accr.numel < 2 * nr) {
        dt_tensor_free(e->ctx, &e->cu_accr);
        st = dt__em_need_on(e, &e->cu_accr, DT_I64, 2 * nr, DT_CUDA_DEVICE);
    }
    if (!st && e->cu_accg.numel < 2 * nf) {
        dt_tensor_free(e->ctx, &e->cu_accg);
        st = dt__em_need_on(e, &e->cu_accg, DT_F32, 2 * nf, DT_CUDA_DEVICE);
    }
    return st;
}

/* Data-parallel tables on the device path: every rank applies every rank's gradients (a sparse
   all-reduce), in the CPU's order (rank, then (sample, feature, position)). Each rank's
   contributions, table by table (a table's in (sample, feature, position) order), built on the
   device from its uploaded batch: the rows and each id's gradient row (w x its bag's, / length
   for mean, dt_k_embed_pool_bwd). The counts per (rank, table) are known on the host too (one
   host all-reduce: they size the buffers and the exchange), but the device reads its own: each
   rank's int block is [its T counts][its rows], sent to every rank with its gradient rows by two
   device all-to-alls; dt_k_embed_dp_copies derives from the received counts the copies that put
   them table-major (two dt_k_embed_copies), and each table is deduplicated and updated as the
   sharded ones. Nothing crosses PCIe; the unique rows are counted on the device (cu_uniq). */
static dt_status dt__em_cuda_dp_backward(dt_embed *e, const dt_tensor *dout) {
    const char *fn = "dt_embed_backward";
    int W = e->size, f, r, T = e->n_tabs, ti;
    int64_t B = e->B, nl = 0, fl = 0, nb2 = 0, ni, N = 0, FN = 0, k, *cnt = e->cnt, *nrt, *ot, *ft, mr = 0, mf = 0;
    int64_t *snd, *rcv, *rtm, *desc, *bag;
    double *v;
    dt_status st = DT_OK;
    size_t mark;
    float *gl, *gt, *gr;
    /* every rank's ids per table (host: sizes) */
    if (!(v = (double *)dt_alloc(e->ctx, sizeof(double) * (size_t)(W * T)))) return DT_ERR_OOM;
    memset(v, 0, sizeof(double) * (size_t)(W * T));
    for (f = 0; f < e->n_feat; f++)
        if (e->tabs[e->feat_tab[f]].shard == DT_SHARD_DATA)
            v[e->rank * T + e->feat_tab[f]] += (double)(e->offs[(int64_t)(f + 1) * B] - e->offs[(int64_t)f * B]);
    st = dt__em_sum_f64(e, v, W * T);
    /* nrt[r * T + t]: rank r's ids of table t; ot / ft: table t's first id / float, table-major */
    if (!st && !(nrt = (int64_t *)dt_alloc(e->ctx, sizeof(int64_t) * (size_t)(W * T + 2 * T + 2)))) st = DT_ERR_OOM;
    if (st) { dt_release(e->ctx, v); return st; }
    ot = nrt + W * T; ft = ot + T + 1;
    for (k = 0; k < W * T; k++) nrt[k] = (int64_t)v[k];
    dt_release(e->ctx, v);
    for (ti = 0; ti < T; ti++) {
        ot[ti] = N; ft[ti] = FN;
        for (r = 0; r < W; r++) {
            int64_t c = nrt[r * T + ti];
            N += c; FN += c * e->tabs[ti].dim;
            if (c > mr) mr = c;
            if (c * e->tabs[ti].dim > mf) mf = c * e->tabs[ti].dim;
        }
        nl += nrt[e->rank * T + ti]; fl += nrt[e->rank * T + ti] * e->tabs[ti].dim;
        nb2 += 2 * e->cu_tdm[ti] * B + 1;
    }
    ot[T] = N;
    /* ints: this rank's block x W (sent), the received blocks, rows table-major, the copies, the bags */
    ni = (T + nl) * W + (W * T + N) + N + 6 * W * T + nb2;
    st = dt__em_cuda_need(e, &e->cu_dmeta, DT_I64, ni + 1);
    if (!st) st = dt__em_cuda_need(e, &e->cu_dmetaf, DT_F32, nl + 1);
    if (!st) st = dt__em_cuda_need(e, &e->cu_dtmp, DT_F32, fl * W + FN + 1); /* W copies of this rank's block, then received */
    if (!st && !e->cu_uniq.data) {
        st = dt__em_cuda_need(e, &e->cu_uniq, DT_I64, 1);
        if (!st) st = dt_cuda_memset(e->ctx, e->cu_uniq.data, 0, e->cu_uniq.numel * sizeof(int64_t), fn);
    }
    if (st) { dt_release(e->ctx, nrt); return st; }
    snd = (int64_t *)e->cu_dmeta.data; rcv = snd + (T + nl) * W; rtm = rcv + W * T + N; desc = rtm + N; bag = desc + 6 * W * T;
    gl = (float *)e->cu_dtmp.data; gr = W > 1 ? gl + fl * W : gl;
    st = dt_cuda_memset(e->ctx, snd, 0, (size_t)T * sizeof(int64_t), fn); /* counts of the tables with no such feature */
    { /* this rank's block: per table its counts, rows and gradient rows */
        int64_t o = 0, fo = 0;
        for (ti = 0; !st && ti < T; ti++) {
            const dt__em_tab *t = &e->tabs[ti];
            int64_t m = e->cu_tdm[ti], *offs = bag, *doff = offs + m * B + 1;
            if (m == 0) continue;
            st = dt__em_cuda_dp_bags(e, ti, snd + T + o, (float *)e->cu_dmetaf.data + o, offs, doff, snd + ti);
            if (!st)
                st = dt__em_cuda_err(e, dt_k_embed_pool_bwd(gl + fo, (const float *)dout->data, doff,
                                                            t->weighted ? (const float *)e->cu_dmetaf.data + o : NULL,
                                                            offs, m * B, t->dim, t->pooling == DT_POOL_MEAN,
                                                            e->ctx->cuda_stream), "dt_k_embed_pool_bwd");
            bag += 2 * m * B + 1; o += nrt[e->rank * T + ti]; fo += nrt[e->rank * T + ti] * t->dim;
        }
    }
    if (!st && W > 1) { /* both blocks to every rank (cnt's send counts are free in the backward) */
        int64_t *sc = cnt, *rc = cnt + W, rt = 0;
        dt_tensor sv, rv;
        int64_t sh[1];
        for (r = 1; !st && r < W; r++) st = dt__em_cuda_d2d(e, snd + r * (T + nl), snd, (size_t)(T + nl) * sizeof(int64_t));
        for (r = 1; !st && r < W; r++) st = dt__em_cuda_d2d(e, gl + r * fl, gl, (size_t)fl * sizeof(float));
        for (r = 0; r < W; r++) {
            sc[r] = T + nl;
            rc[r] = T;
            for (ti = 0; ti < T; ti++) rc[r] += nrt[r * T + ti];
            rt += rc[r];
        }
        sh[0] = (T + nl) * W;
        if (!st) st = dt_tensor_view(e->ctx, &sv, &e->cu_dmeta, 0, 1, sh);
        sh[0] = rt;
        if (!st) st = dt_tensor_view(e->ctx, &rv, &e->cu_dmeta, (T + nl) * W, 1, sh);
        if (!st) st = dt_comm_alltoallv(e->comm, &rv, rc, &sv, sc);
        rt = 0;
        for (r = 0; r < W; r++) {
            sc[r] = fl;
            rc[r] = 0;
            for (ti = 0; ti < T; ti++) rc[r] += nrt[r * T + ti] * e->tabs[ti].dim;
            rt += rc[r];
        }
        sh[0] = fl * W;
        if (!st) st = dt_tensor_view(e->ctx, &sv, &e->cu_dtmp, 0, 1, sh);
        sh[0] = rt;
        if (!st) st = dt_tensor_view(e->ctx, &rv, &e->cu_dtmp, fl * W, 1, sh);
        if (!st) st = dt_comm_alltoallv(e->comm, &rv, rc, &sv, sc);
        for (r = 0; r < W; r++)
            if (r != e->rank) e->stats.bytes_sent_bwd += 8.0 * (double)(T + nl) + 4.0 * (double)fl;
    } else if (!st) rcv = snd; /* one rank: its own block */
    mark = dt_cuda_scratch_begin(e->ctx);
    gt = (float *)dt_cuda_scratch(e->ctx, (size_t)(FN + 1) * sizeof(float), fn);
    if (!st && !gt) st = DT_ERR_OOM;
    if (!st) /* table-major */
        st = dt__em_cuda_err(e, dt_k_embed_dp_copies(desc, rcv, (const int64_t *)e->cu_tdesc.data +
                                                     2 * (e->cu_tdo[T - 1] + e->cu_tdm[T - 1]), W, T,
                                                     e->ctx->cuda_stream), "dt_k_embed_dp_copies");
    if (!st)
        st = dt__em_cuda_err(e, dt_k_embed_copies(rtm, rcv, desc, desc + W * T, desc + 2 * W * T, W * T, mr, 8,
                                                   e->ctx->cuda_stream), "dt_k_embed_copies");
    if (!st)
        st = dt__em_cuda_err(e, dt_k_embed_copies(gt, gr, desc + 3 * W * T, desc + 4 * W * T, desc + 5 * W * T, W * T,
                                                   mf, 4, e->ctx->cuda_stream), "dt_k_embed_copies");
    for (ti = 0; !st && ti < T; ti++) /* dedup and update (or keep, sync 0) */
        if (e->tabs[ti].shard == DT_SHARD_DATA)
            st = dt__em_cuda_apply(e, ti, rtm + ot[ti], gt + ft[ti], ot[ti + 1] - ot[ti], e->tabs[ti].dim, 1);
    dt_cuda_scratch_end(e->ctx, mark);
    dt_release(e->ctx, nrt);
    return st;
}

/* The backward on the device path (sync 0 keeps the contributions in the window): each request's gradient
   gathered from dout on the device (dt_k_embed_gather_sum with the layout dt__em_cuda_end sent
   up), the all-to-all to the owners on device tensors; each owner, per table: every id's
   gradient row (w x its request's, dt_k_embed_pool_bwd), sorted by row stably
   (dt_k_embed_dedup: the ids arrive in (global sample, feature, position) order, so each row's
   run is in the CPU's sum order), summed and applied by the sparse optimizer kernel. Nothing
   is read back. Data-parallel tables: dt__em_cuda_dp_backward. */
static dt_status dt__em_cuda_backward(dt_embed *e, const dt_tensor *dout, int64_t *ncon) {
    int W = e->size, r;
    int64_t *cnt = e->cnt, tot_in = 0, S = e->cu_fS, R = e->cu_fR, ti;
    const char *fn = "dt_embed_backward";
    (void)ncon;
    for (r = 0; r < W; r++) tot_in += cnt[5 * W + r];
    if (e->cu_devreq && !e->cu_uniq.data) {
        DT__TRY(dt__em_cuda_need(e, &e->cu_uniq, DT_I64, 1));
        DT__TRY(dt_cuda_memset(e->ctx, e->cu_uniq.data, 0, sizeof(int64_t), fn));
    }
    if (S > 0) {
        const int64_t *sm = (const int64_t *)e->cu_smeta.data;
        DT__TRY(dt__em_cuda_err(e, dt_k_embed_gather_sum((float *)e->cu_res.data, (const float *)dout->data,
                                                          sm + 3 * R + 3 * S, sm + 3 * R + 6 * S,
                                                          (const float *)e->cu_smetaf.data + R, S, S, e->cu_bmax, 0,
                                                          e->ctx->cuda_stream), "dt_k_embed_gather_sum"));
    }
    DT__TRY(dt__em_cuda_need2(e, &e->cu_gin, DT_F32, tot_in + 1));
    if (!e->comm) DT__TRY(dt__em_cuda_d2d(e, e->cu_gin.data, e->cu_res.data, (size_t)tot_in * sizeof(float)));
    else DT__TRY(dt_comm_alltoallv(e->comm, &e->cu_gin, cnt + 5 * W, &e->cu_res, cnt + 2 * W));
    for (r = 0; r < W; r++)
        if (r != e->rank) e->stats.bytes_sent_bwd += 4.0 * (double)cnt[2 * W + r];
    for (ti = 0; ti < e->n_tabs && e->cu_tm; ti++) {
        dt__em_tab *t = &e->tabs[ti];
        const dt__em_cutab *c = &e->cu_tm[ti];
        const int64_t *dm = (const int64_t *)e->cu_meta.data;
        int64_t nc = t->c1 - t->c0, n = c->n;
        size_t mark;
        float *g;
        dt_status st = DT_OK;
        int win = e->sync && dt__em_cuda_acc_has(e, (int)ti);
        if (nc == 0 || t->shard == DT_SHARD_DATA || (n == 0 && !win)) continue;
        mark = dt_cuda_scratch_begin(e->ctx); /* twice the need: an owner's ids vary by batch (dt__em_cuda_need) */
        g = (float *)dt_cuda_scratch(e->ctx, (size_t)(2 * n * nc + 1) * sizeof(float), fn);
        if (!g) st = DT_ERR_OOM;
        if (!st && n > 0)
            st = dt__em_cuda_err(e, dt_k_embed_pool_bwd(g, (const float *)e->cu_gin.data, dm + c->dst,
                                                        t->weighted ? (const float *)e->cu_metaf.data + c->w : NULL,
                                                        dm + c->offs, c->nb, nc, 0, e->ctx->cuda_stream),
                                 "dt_k_embed_pool_bwd");
        if (!st) st = dt__em_cuda_apply(e, (int)ti, dm + c->rows, g, n, nc, e->cu_devreq);
        dt_cuda_scratch_end(e->ctx, mark);
        if (st) return st;
        if (e->sync && !e->cu_devreq && !win) e->stats.rows_updated += c->uniq; /* else counted on the device */
    }
    if (e->any_dp) DT__TRY(dt__em_cuda_dp_backward(e, dout));
    return e->sync ? dt__em_cuda_acc_close(e) : DT_OK;
}

static dt_status dt__em_cuda_host_dout(dt_embed *e, const float **dd, const dt_tensor *dout) {
    int64_t n = dout->numel;
    DT__TRY(dt__em_cuda_stage_buf(e, 0, n));
    DT__TRY(dt__em_cuda_get(e, e->cu_hf, dout->data, (size_t)n * sizeof(float)));
    *dd = e->cu_hf;
    return DT_OK;
}

/* dt__em_apply hands over each updated row (table t, local row, its summed gradient g [nc]) in
   (table, row) order; dt__em_cuda_flush updates them on the device, one launch per table. */
static dt_status dt__em_cuda_stage(dt_embed *e, int t, int64_t row, const float *g, int64_t nc) {
    if (e->cu_st_n + 1 > e->cu_st_cap) {
        int64_t c1 = e->cu_st_cap, c2 = e->cu_st_cap;
        DT__TRY(dt_grow(e->ctx, (void **)&e->cu_st_t, &c1, e->cu_st_n + 1, sizeof(int), "dt_embed cuda rows"));
        DT__TRY(dt_grow(e->ctx, (void **)&e->cu_st_row, &c2, e->cu_st_n + 1, sizeof(int64_t), "dt_embed cuda rows"));
        e->cu_st_cap = c1 < c2 ? c1 : c2;
    }
    DT__TRY(dt_grow(e->ctx, (void **)&e->cu_stg, &e->cu_stg_cap, e->cu_stg_n + nc + 1, sizeof(float),
                     "dt_embed cuda gradients"));
    e->cu_st_t[e->cu_st_n] = t;
    e->cu_st_row[e->cu_st_n] = row;
    e->cu_st_n++;
    memcpy(e->cu_stg + e->cu_stg_n, g, (size_t)nc * sizeof(float));
    e->cu_stg_n += nc;
    return DT_OK;
}

/* Each table's staged rows: rows [n], order = 0..n-1, seg = 0..n, n_uniq = n (every row is
   already one summed gradient, so the kernel's run sum is 0 + g = g), grads [n, nc]. */
static dt_status dt__em_cuda_flush(dt_embed *e) {
    int64_t i = 0, fo = 0;
    dt_status st = DT_OK;
    while (!st && i < e->cu_st_n) {
        int ti = e->cu_st_t[i];
        dt__em_tab *t = &e->tabs[ti];
        int64_t nc = t->c1 - t->c0, n = 0, k, *h;
        const int64_t *d;
        while (i + n < e->cu_st_n && e->cu_st_t[i + n] == ti) n++;
        st = dt__em_cuda_stage_buf(e, 3 * n + 2, 0);
        if (!st) st = dt__em_cuda_need(e, &e->cu_i, DT_I64, 3 * n + 2);
        if (!st) st = dt__em_cuda_need(e, &e->cu_f, DT_F32, n * nc + 1);
        if (st) break;
        h = e->cu_hi;
        for (k = 0; k < n; k++) { h[k] = e->cu_st_row[i + k]; h[n + k] = k; h[2 * n + k] = k; }
        h[3 * n] = n; h[3 * n + 1] = n;
        st = dt__em_cuda_put(e, e->cu_i.data, h, (size_t)(3 * n + 2) * sizeof(int64_t));
        if (!st) st = dt__em_cuda_put(e, e->cu_f.data, e->cu_stg + fo, (size_t)(n * nc) * sizeof(float));
        if (st) break;
        d = (const int64_t *)e->cu_i.data;
        if (t->kind == DT_EMBED_ADAM)
            st = dt__em_cuda_err(e, dt_k_embed_sparse_adam(dt__em_cuda_w(t), (int)t->dtype, dt__em_cuda_s1(t),
                                                           dt__em_cuda_s2(t), (const float *)e->cu_f.data, d, d + n,
                                                           d + 2 * n, d + 3 * n + 1, n, nc, nc, t->lr, t->b1, t->b2,
                                                           t->eps, t->t, e->ctx->cuda_stream), "dt_k_embed_sparse_adam");
        else
            st = dt__em_cuda_err(e, dt_k_embed_sparse_update(dt__em_cuda_w(t), (int)t->dtype, dt__em_cuda_s1(t),
                                                             (const float *)e->cu_f.data, d, d + n, d + 2 * n,
                                                             d + 3 * n + 1, n, nc, nc,
                                                             t->kind == DT_EMBED_ADAGRAD ? 2 :
                                                             t->kind == DT_EMBED_ROWWISE_ADAGRAD ? 3 : 1,
                                                             t->lr, t->eps, e->ctx->cuda_stream),
                                 "dt_k_embed_sparse_update");
        i += n;
        fo += n * nc;
    }
    e->cu_st_n = 0;
    e->cu_stg_n = 0;
    return st;
}

static void dt__em_cuda_free(dt_embed *e) {
    dt_tensor_free(e->ctx, &e->cu_i); dt_tensor_free(e->ctx, &e->cu_f); dt_tensor_free(e->ctx, &e->cu_tmp);
    dt_tensor_free(e->ctx, &e->cu_resp); dt_tensor_free(e->ctx, &e->cu_res);
    dt_release(e->ctx, e->cu_hi); dt_release(e->ctx, e->cu_hf); dt_release(e->ctx, e->cu_stg);
    dt_release(e->ctx, e->cu_st_t); dt_release(e->ctx, e->cu_st_row);
    while (e->cu_hs && e->cu_hs_n > 0) dt_k_hash_free(&e->cu_hs[--e->cu_hs_n]);
    dt_release(e->ctx, e->cu_hs);
    dt_tensor_free(e->ctx, &e->cu_pooled); dt_tensor_free(e->ctx, &e->cu_meta); dt_tensor_free(e->ctx, &e->cu_metaf);
    dt_tensor_free(e->ctx, &e->cu_smeta); dt_tensor_free(e->ctx, &e->cu_smetaf); dt_tensor_free(e->ctx, &e->cu_dmeta);
    dt_tensor_free(e->ctx, &e->cu_dmetaf); dt_tensor_free(e->ctx, &e->cu_dtmp); dt_tensor_free(e->ctx, &e->cu_gin);
    dt_release(e->ctx, e->cu_tm); dt_release(e->ctx, e->cu_seen); dt_release(e->ctx, e->cu_dyn_hi);
    dt_tensor_free(e->ctx, &e->cu_kl); dt_tensor_free(e->ctx, &e->cu_kid); dt_tensor_free(e->ctx, &e->cu_kw);
    dt_tensor_free(e->ctx, &e->aside.cu_kl); dt_tensor_free(e->ctx, &e->aside.cu_kid);
    dt_tensor_free(e->ctx, &e->aside.cu_kw); dt_tensor_free(e->ctx, &e->cu_tdesc); dt_tensor_free(e->ctx, &e->cu_uniq);
    dt_release(e->ctx, e->cu_tdo);
    dt_tensor_free(e->ctx, &e->cu_rq); dt_tensor_free(e->ctx, &e->cu_rqf); dt_tensor_free(e->ctx, &e->cu_fdesc);
    dt_tensor_free(e->ctx, &e->aside.cu_rq); dt_tensor_free(e->ctx, &e->aside.cu_rqf);
    dt_tensor_free(e->ctx, &e->aside.cu_smeta); dt_tensor_free(e->ctx, &e->aside.cu_smetaf);
    dt_release(e->ctx, e->cu_cx); dt_release(e->ctx, e->aside.cu_cx);
    dt_tensor_free(e->ctx, &e->cu_accr); dt_tensor_free(e->ctx, &e->cu_accg); dt_release(e->ctx, e->cu_accp);
    if (e->cu_evp) cudaEventDestroy((cudaEvent_t)e->cu_evp);
    if (e->cu_evc) cudaEventDestroy((cudaEvent_t)e->cu_evc);
    if (e->cu_cs) cudaStreamDestroy((cudaStream_t)e->cu_cs);
    dt_release(e->ctx, e->cu_tih); dt_tensor_free(e->ctx, &e->cu_tix); dt_tensor_free(e->ctx, &e->cu_tixp);
}

#else /* without DT_CUDA: desc.device cuda is refused at create, so only the first and last run */

static dt_status dt__em_cuda_check_desc(dt_ctx *ctx, const dt_embed_desc *desc) {
    if (desc->device == DT_CUDA_DEVICE)
        return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "dt_embed_create: desc.device is cuda, but dt was built without "
                                "DT_CUDA");
    if (desc->device != DT_DEVICE_DEFAULT && desc->device != DT_CPU)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_embed_create: desc.device = %d; expected DEFAULT, DT_CPU or "
                                "DT_CUDA_DEVICE", (int)desc->device);
    return DT_OK;
}
static dt_status dt__em_cuda_off(dt_embed *e) {
    return dt_ctx_set_error(e->ctx, DT_ERR_DEVICE, "dt_embed: cuda tables, but dt was built without DT_CUDA");
}
static dt_status dt__em_cuda_to_device(dt_embed *e, dt__em_tab *t) { (void)t; return dt__em_cuda_off(e); }
static dt_status dt__em_cuda_dp_pool(dt_embed *e) { return dt__em_cuda_off(e); }
static dt_status dt__em_cuda_batch(dt_embed *e, const dt_kjt *k) { (void)k; return dt__em_cuda_off(e); }
static int dt__em_cuda_devreq(const dt_embed *e) { (void)e; return 0; }
static dt_status dt__em_cuda_requests(dt_embed *e) { return dt__em_cuda_off(e); }
static dt_status dt__em_cuda_serve_dev(dt_embed *e, int64_t tot_res) { (void)tot_res; return dt__em_cuda_off(e); }
static dt_status dt__em_cuda_serve(dt_embed *e, int64_t tot_res) { (void)tot_res; return dt__em_cuda_off(e); }
static dt_status dt__em_cuda_return(dt_embed *e, int64_t tot) { (void)tot; return dt__em_cuda_off(e); }
static dt_status dt__em_cuda_check(dt_embed *e, const dt_tensor *t, const char *fn, const char *arg) {
    (void)t; (void)fn; (void)arg;
    return dt__em_cuda_off(e);
}
static dt_status dt__em_cuda_put(dt_embed *e, void *dst, const void *src, size_t bytes) {
    (void)dst; (void)src; (void)bytes;
    return dt__em_cuda_off(e);
}
static dt_status dt__em_cuda_host_dout(dt_embed *e, const float **dd, const dt_tensor *dout) {
    (void)dd; (void)dout;
    return dt__em_cuda_off(e);
}
static dt_status dt__em_cuda_stage(dt_embed *e, int t, int64_t row, const float *g, int64_t nc) {
    (void)t; (void)row; (void)g; (void)nc;
    return dt__em_cuda_off(e);
}
static dt_status dt__em_cuda_flush(dt_embed *e) { return dt__em_cuda_off(e); }
static void dt__em_cuda_free(dt_embed *e) { (void)e; }
static dt_status dt__em_cuda_tier_create(dt_embed *e, dt__em_tab *t, size_t b0, size_t b1) {
    (void)t; (void)b0; (void)b1;
    return dt__em_cuda_off(e);
}
static void dt__em_cuda_tier_free(dt_embed *e, struct dt__em_tier *c) { (void)e; (void)c; }
static dt_status dt__em_cuda_tier_run(dt_embed *e, int wait) { (void)wait; return dt__em_cuda_off(e); }
static dt_status dt__em_cuda_tier_prefetch(dt_embed *e) { return dt__em_cuda_off(e); }
static dt_status dt__em_cuda_dyn_translate(dt_embed *e, int64_t *rin, int64_t total) {
    (void)rin; (void)total;
    return dt__em_cuda_off(e);
}
static dt_status dt__em_cuda_dyn_restore(dt_embed *e, int ti) { (void)ti; return dt__em_cuda_off(e); }
static int dt__em_cuda_dev(const dt_embed *e) { (void)e; return 0; }
static dt_status dt__em_cuda_dyn_pull(dt_embed *e) { return dt__em_cuda_off(e); }
static dt_status dt__em_cuda_end(dt_embed *e, dt_tensor *out, int64_t tot) {
    (void)out; (void)tot;
    return dt__em_cuda_off(e);
}
static dt_status dt__em_cuda_backward(dt_embed *e, const dt_tensor *dout, int64_t *ncon) {
    (void)dout; (void)ncon;
    return dt__em_cuda_off(e);
}

#endif /* DT_CUDA */

#ifdef __cplusplus
}
#endif

DT__STATIC_QUIET_END

#ifdef DT__EM_TYPEOF
#undef typeof
#undef DT__EM_TYPEOF
#endif

#endif /* DT_EMBED_IMPLEMENTATION_DONE */
#endif /* DT_EMBED_IMPLEMENTATION */

/*
   ------------------------------------------------------------------------------------------------
   MIT License

   Copyright (c) 2026 the dt authors

   Permission is hereby granted, free of charge, to any person obtaining a copy of this software
   and associated documentation files (the "Software"), to deal in the Software without
   restriction, including without limitation the rights to use, copy, modify, merge, publish,
   distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
   Software is furnished to do so, subject to the following conditions:

   The above copyright notice and this permission notice shall be included in all copies or
   substantial portions of the Software.

   THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING
   BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
   NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
   DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
   OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
