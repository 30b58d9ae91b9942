"""bench/embed_torch.py - the PyTorch peers of bench/embed.c: the same tables (T tables of R rows
x D, f32), the same batch shape (B samples, bags of 1..2L-1 ids, L on average, power-law ids
floor(u^2 R)) and one thread. PEER bag: torch.nn.EmbeddingBag(mode="sum", sparse=True) forward,
backward of a fixed output gradient, and torch.optim.Adagrad (OPT adagrad: dt_embed's
DT_EMBED_ADAGRAD) or torch.optim.SGD (sgd) on the sparse gradients. PEER tbe: FBGEMM's
table-batched embedding (SplitTableBatchedEmbeddingBagsCodegen, fbgemm-gpu-cpu: all T tables in
one op, the host's kernels, EXACT_ADAGRAD / EXACT_SGD fused into its backward), what TorchRec
runs on a CPU. Index tensors are built before the timed steps; two warm-up steps are not
counted. Times are the thread's CPU time (time.thread_time(), as bench/embed.c uses
CLOCK_THREAD_CPUTIME_ID): one thread does all the work. Prints one line: "torch samples/s X"
(median of the timed steps), or a line saying why the peer did not run.

    build/peers/bin/python bench/embed_torch.py [T R D B L steps [adagrad|sgd [bag|tbe]]]
    (./build.sh bench makes build/peers)"""
import sys, time
import numpy as np
try:
    import torch
except ImportError:  # ./build.sh bench runs every bench/*.py; PyTorch is for peers only
    print("bench/embed_torch.py: PyTorch is not installed here (./build.sh bench runs this with build/peers, a venv of the pinned peers); skipped")
    sys.exit(0)

def main():
    a = [int(x) for x in sys.argv[1:7]]
    T, R, D, B, L, steps = (a + [8, 100000, 64, 2048, 4, 20][len(a):])[:6]
    kind = sys.argv[7] if len(sys.argv) > 7 else "adagrad"
    peer = sys.argv[8] if len(sys.argv) > 8 else "bag"
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if peer == "tbe":
        return tbe(T, R, D, B, L, steps, kind, rng)
    bags = [torch.nn.EmbeddingBag(R, D, mode="sum", sparse=True) for _ in range(T)]
    params = [p for b in bags for p in b.parameters()]
    opt = torch.optim.SGD(params, lr=0.01) if kind == "sgd" else torch.optim.Adagrad(params, lr=0.01)
    batches = []
    for s in range(4):
        per = []
        for t in range(T):
            lengths = rng.integers(1, 2 * L, size=B)
            u = rng.random(int(lengths.sum()))
            ids = np.minimum((u * u * R).astype(np.int64), R - 1)
            offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            per.append((torch.from_numpy(ids), torch.from_numpy(offsets)))
        batches.append(per)
    dout = torch.randn(B, D)
    times = []
    for s in range(steps + 2):  # the first two are warm-up
        per = batches[s % len(batches)]
        t0 = time.thread_time()
        opt.zero_grad(set_to_none=True)
        for t in range(T):
            out = bags[t](per[t][0], per[t][1])
            out.backward(dout)
        opt.step()
        times.append(time.thread_time() - t0)
    times = sorted(times[2:])
    med = times[len(times) // 2]
    print("torch samples/s %.1f" % (B / med))

def tbe(T, R, D, B, L, steps, kind, rng):
    try:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
    except ImportError as e:
        print(f"bench/embed_torch.py: FBGEMM (fbgemm-gpu-cpu) is not importable here ({e}); skipped")
        return
    opt = EmbOptimType.EXACT_SGD if kind == "sgd" else EmbOptimType.EXACT_ADAGRAD
    emb = SplitTableBatchedEmbeddingBagsCodegen([(R, D, EmbeddingLocation.HOST, ComputeDevice.CPU)] * T,
                                                optimizer=opt, learning_rate=0.01, eps=1e-8,
                                                pooling_mode=PoolingMode.SUM)
    batches = []
    for s in range(4):  # the tables' ids one after another (table-major), T x B bags
        lengths = rng.integers(1, 2 * L, size=T * B)
        u = rng.random(int(lengths.sum()))
        ids = np.minimum((u * u * R).astype(np.int64), R - 1)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        batches.append((torch.from_numpy(ids), torch.from_numpy(offsets)))
    dout = torch.randn(B, T * D)
    times = []
    for s in range(steps + 2):  # the first two are warm-up
        ids, offsets = batches[s % len(batches)]
        t0 = time.thread_time()
        out = emb(ids, offsets)
        out.backward(dout)  # the update runs inside (fused)
        times.append(time.thread_time() - t0)
    times = sorted(times[2:])
    print("torch samples/s %.1f" % (B / times[len(times) // 2]))


if __name__ == "__main__":
    main()
