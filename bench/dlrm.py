#!/usr/bin/env python3
"""bench/dlrm.py - DLRM training throughput of examples/dlrm against the same model in PyTorch
(DistributedDataParallel over gloo, nn.EmbeddingBag with sparse gradients, Adagrad), at the same
ranks, global batch and threads (one per rank), in one script, so the ratio compares runs on the
same machine at the same moment. Prints samples/s, the dt/PyTorch ratio and the scaling efficiency
from 1 rank to N.

    python3 bench/dlrm.py [--ranks 1,2,4] [--steps 200] [--batch 2048] [--repeat 3]

Model (both): bottom MLP 13-64-32-16, 26 tables of dim 16 (Criteo Kaggle's row counts capped at
16384, as examples/dlrm's default), sum pooling, dot interaction (367 wide), top MLP 64-32-1, BCE
with logits, Adagrad (lr 0.05) on dense and sparse parameters. dt shards the tables with its
planner (model parallel) and all-reduces only the dense grads; PyTorch DDP replicates the tables
and all-reduces their sparse grads, as TorchRec-less PyTorch does. Data: dt's built-in synthetic
generator runs inside its timed training loop; so PyTorch generates each of its batches inside
its timed loop too (numpy: uniform dense features and labels, ids floor(u^2 x rows), a power law
that is cheap to draw: 0.5 ms of CPU a batch of 2048 here, against 1.8 ms for dt's generator;
numpy's zipf(1.05) took 114 ms and would have measured numpy). Each side pays for making its own batches; neither gets pre-made ones. Needs PyTorch (./build.sh bench: build/peers)
(Debian) and ./build.sh having built build/examples/dlrm. Medians of --repeat runs.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KAGGLE = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
          27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
ROWS = [min(c, 16384) for c in KAGGLE]
DIM = 16


def mpirun_cmd():
    env = subprocess.run(["bash", os.path.join(ROOT, "build.sh"), "env"], capture_output=True, text=True,
                         check=True).stdout
    for line in env.splitlines():
        if line.startswith("export DT_MPIRUN="):
            return shlex.split(shlex.split(line[len("export DT_MPIRUN="):])[0])
    return ["mpirun", "--oversubscribe"]


def dt_run(np_, steps, batch):
    exe = os.path.join(ROOT, "build", "examples", "dlrm")
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "m.jsonl")
        cmd = mpirun_cmd() + ["-np", str(np_), exe, "--steps", str(steps), "--batch", str(batch), "--quiet",
                              "--opt", "adagrad", "--lr", "0.05", "--emb-lr", "0.05", "--eval-every",
                              str(10 * steps), "--eval-samples", "1024", "--print-every", str(steps), "--log", log]
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        with open(log) as f:
            return json.loads(f.read().splitlines()[-1])["samples_per_s"]


def torch_worker(rank, world, steps, batch, port, out):
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(7)

    def mlp(sizes, relu_last):
        layers = []
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i + 2 < len(sizes) or relu_last:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    class DLRM(nn.Module):
        def __init__(self):
            super().__init__()
            self.bot = mlp([13, 64, 32, DIM], True)
            self.emb = nn.ModuleList([nn.EmbeddingBag(r, DIM, mode="sum", sparse=True) for r in ROWS])
            f = len(ROWS) + 1
            self.li, self.lj = torch.tril_indices(f, f, offset=-1)
            self.top = mlp([DIM + f * (f - 1) // 2, 64, 32, 1], False)

        def forward(self, dense, ids, offsets):
            z = self.bot(dense)
            es = [e(ids[k], offsets[k]) for k, e in enumerate(self.emb)]
            t = torch.stack([z] + es, dim=1)
            inter = torch.bmm(t, t.transpose(1, 2))[:, self.li, self.lj]
            return self.top(torch.cat([z, inter], dim=1)).squeeze(1)

    model = nn.parallel.DistributedDataParallel(DLRM())
    dense_params = [p for n, p in model.named_parameters() if ".emb." not in n]
    sparse_params = [p for n, p in model.named_parameters() if ".emb." in n]
    opt_d = torch.optim.Adagrad(dense_params, lr=0.05)
    opt_s = torch.optim.Adagrad(sparse_params, lr=0.05)
    local = batch // world
    rng = np.random.default_rng(100 + rank)
    offs = [torch.arange(local, dtype=torch.int64) for _ in ROWS]  # one id per bag: fixed offsets

    def make_batch():  # inside the timed loop, as dt's generator is inside its own
        dense = torch.from_numpy(rng.random((local, 13), dtype=np.float32))
        label = torch.from_numpy((rng.random(local) < 0.25).astype(np.float32))
        ids = []
        for r in ROWS:
            u = rng.random(local)
            ids.append(torch.from_numpy(np.minimum((u * u * r).astype(np.int64), r - 1)))
        return dense, label, ids

    loss_fn = nn.BCEWithLogitsLoss()
    dist.barrier()
    t0 = time.perf_counter()
    for s in range(steps):
        dense, label, ids = make_batch()
        opt_d.zero_grad()
        opt_s.zero_grad()
        loss = loss_fn(model(dense, ids, offs), label)
        loss.backward()
        opt_d.step()
        opt_s.step()
    dist.barrier()
    el = time.perf_counter() - t0
    if rank == 0:
        out.put(steps * local * world / el)
    dist.destroy_process_group()


def torch_run(np_, steps, batch):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + (os.getpid() + np_) % 2000
    procs = [ctx.Process(target=torch_worker, args=(r, np_, steps, batch, port, q)) for r in range(np_)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"bench/dlrm.py: a PyTorch rank exited with {p.exitcode}")
    return q.get()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench/dlrm.py: PyTorch is not installed here (./build.sh bench runs this with build/peers, a venv of the pinned peers); skipped")
        return 0
    if not os.path.exists(os.path.join(ROOT, "build", "examples", "dlrm")):
        print("bench/dlrm.py: build/examples/dlrm is missing; run ./build.sh first")
        return 1
    ranks = [int(x) for x in a.ranks.split(",")]
    print(f"DLRM training, global batch {a.batch}, {a.steps} steps, 1 thread per rank, medians of {a.repeat}")
    print(f"{'ranks':>5} {'dt samples/s':>14} {'torch samples/s':>16} {'dt/torch':>9}")
    res = {}
    for n in ranks:
        d, t = [], []
        for _ in range(a.repeat):  # interleaved, so a noisy moment hits both
            d.append(dt_run(n, a.steps, a.batch))
            t.append(torch_run(n, a.steps, a.batch))
        res[n] = (statistics.median(d), statistics.median(t))
        print(f"{n:>5} {res[n][0]:>14.0f} {res[n][1]:>16.0f} {res[n][0] / res[n][1]:>9.2f}"
              f"   (dt {min(d):.0f}-{max(d):.0f}, torch {min(t):.0f}-{max(t):.0f})", flush=True)
    if 1 in res and len(res) > 1:
        for n in ranks:
            if n > 1:
                print(f"scaling efficiency 1 -> {n} ranks: dt {res[n][0] / (n * res[1][0]):.2f}, "
                      f"torch {res[n][1] / (n * res[1][1]):.2f} (ideal 1.00; {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
