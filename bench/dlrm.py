#!/usr/bin/env python3
"""bench/dlrm.py - DLRM training throughput of examples/dlrm against TorchRec's
DistributedModelParallel on the same model, tables, ids and batches, at the same ranks, global
batch and threads (one per rank), interleaved in one script, so each ratio compares runs on the
same machine at the same moment. Prints samples/s, dt / TorchRec ratios (against TorchRec's
best plan), scaling from 1 rank to N, and the machine's load while it ran.

    build/peers/bin/python bench/dlrm.py [--ranks 1,2,4] [--steps 200] [--batch 2048]
                                         [--repeat 3] [--plans planner,table_wise,data_parallel]

Model (both): bottom MLP 13-64-32-16, 26 tables of dim 16 (Criteo Kaggle's row counts capped at
16384, as examples/dlrm's default), one id per feature and sample, sum pooling, dot interaction
(16 + 27*26/2 = 367 wide), top MLP 64-32-1, BCE with logits, Adagrad (lr 0.05) on dense and
sparse parameters. dt shards the tables with its own planner and all-reduces the dense grads.
TorchRec (torchrec.models.dlrm.DLRM, ./build.sh bench's pinned 1.9 with fbgemm-gpu-cpu): the
tables in one EmbeddingBagCollection, Adagrad fused into the backward
(apply_optimizer_in_backward: FBGEMM's CPU TBE kernel applies it), dense Adagrad through
CombinedOptimizer, process group gloo; each --plans entry is one plan: "planner" is
EmbeddingShardingPlanner's own choice, the others constrain every table to that sharding type
(a plan equal to one already measured is measured once). The ratio is against the fastest.

Data (both): one file in examples/dlrm's binary form (dlrm_data.h: labels u8, dense f32
[N, 13], ids i32 [N, 26]), written once by this script before any timing: dense values
log(1 + a Lomax count), labels 1 with probability 0.25, feature f's ids a power law over its
rows (exponent 1.05, as dt's synthetic generator) through a per-feature bijection. Step s
trains on samples [s B, (s + 1) B); rank r of W reads its slice [s B + r B / W, s B + (r + 1) B / W)
from the mapped file inside the timed loop (dt: --data FILE.bin; TorchRec: numpy memmap into a
KeyedJaggedTensor). Timing: both from the first step to the last (dt's samples_per_s excludes its
evaluation; TorchRec's loop has none), after each side's setup. Medians of --repeat runs.
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
NF = len(ROWS)
EVAL = 1024  # held-out samples at the file's end (dt evaluates them once, outside its timing)
LR = 0.05


def mpirun_cmd():
    env = subprocess.run(["bash", os.path.join(ROOT, "build.sh"), "env"], capture_output=True, text=True,
                         check=True).stdout
    for line in env.splitlines():
        if line.startswith("export DT_MPIRUN="):
            return shlex.split(shlex.split(line[len("export DT_MPIRUN="):])[0])
    return ["mpirun", "--oversubscribe"]


# ---------------------------------------------------------------- the shared data file


def write_data(path, n, seed=7):
    """n samples in dlrm_data.h's binary form (version 1; header 256 bytes, then labels u8,
    dense f32 [n, 13] and ids i32 [n, 26], each at the next multiple of 64)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    labels = (rng.random(n) < 0.25).astype(np.uint8)
    counts = np.floor(8.0 * (rng.random((n, 13)) ** (-1 / 1.2) - 1.0))
    counts[rng.random((n, 13)) < 0.2] = 0  # missing
    dense = np.log1p(counts).astype(np.float32)
    ids = np.empty((n, NF), dtype=np.int32)
    s = 1.05
    for f, rows in enumerate(ROWS):  # continuous power law over ranks k, then a bijection
        u = rng.random(n)
        a = (rows + 1.0) ** (1.0 - s) - 1.0
        k = np.floor((1.0 + u * a) ** (1.0 / (1.0 - s))) - 1.0
        k = np.clip(k, 0, rows - 1).astype(np.int64)
        mult = 2654435761 % rows or 1
        while np.gcd(mult, rows) != 1:
            mult += 1
        ids[:, f] = ((k * mult + 17 * f) % rows).astype(np.int32)
    header = bytearray(256)
    header[0:8] = b"DTDLRMB\0"
    np.frombuffer(header, dtype=np.uint8)  # (a view check: bytearray is writable)
    import struct
    struct.pack_into("<IIQIIIIQ", header, 8, 1, 256, n, 13, NF, 1, 4, 0)
    struct.pack_into(f"<{NF}Q", header, 48, *ROWS)

    def pad(f):
        f.write(b"\0" * ((-f.tell()) % 64))
    with open(path, "wb") as f:
        f.write(header)
        f.write(labels.tobytes())
        pad(f)
        f.write(dense.tobytes())
        pad(f)
        f.write(ids.tobytes())


def read_data(path):
    """(labels u8 [N], dense f32 [N, 13], ids i32 [N, 26]) mapped from write_data's file."""
    import numpy as np
    import struct
    with open(path, "rb") as f:
        n = struct.unpack_from("<Q", f.read(24), 16)[0]
    up = lambda x: (x + 63) // 64 * 64  # noqa: E731
    o_dense = up(256 + n)
    o_ids = up(o_dense + 4 * 13 * n)
    labels = np.memmap(path, dtype=np.uint8, mode="r", offset=256, shape=(n,))
    dense = np.memmap(path, dtype=np.float32, mode="r", offset=o_dense, shape=(n, 13))
    ids = np.memmap(path, dtype=np.int32, mode="r", offset=o_ids, shape=(n, NF))
    return labels, dense, ids


# ---------------------------------------------------------------- dt


def dt_run(np_, steps, batch, data):
    exe = os.path.join(ROOT, "build", "examples", "dlrm")
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "m.jsonl")
        cmd = mpirun_cmd() + ["-np", str(np_), exe, "--data", data, "--steps", str(steps), "--batch", str(batch),
                              "--quiet", "--opt", "adagrad", "--lr", str(LR), "--emb-lr", str(LR), "--eval-every",
                              str(10 * steps), "--eval-samples", str(EVAL), "--print-every", str(steps),
                              "--log", log]
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        with open(log) as f:
            lines = [json.loads(x) for x in f.read().splitlines()]
        return lines[-1]["samples_per_s"], lines[0]["loss"]


# ---------------------------------------------------------------- TorchRec


def torchrec_model(world, plan_name, pg):
    """torchrec.models.dlrm.DLRM sharded by DMP under plan `plan_name`; returns (dmp, optimizer,
    plan text)."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.models.dlrm import DLRM
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    tables = [EmbeddingBagConfig(name=f"t{f}", embedding_dim=DIM, num_embeddings=r, feature_names=[f"f{f}"])
              for f, r in enumerate(ROWS)]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = DLRM(embedding_bag_collection=ebc, dense_in_features=13, dense_arch_layer_sizes=[64, 32, DIM],
                 over_arch_layer_sizes=[64, 32, 1])
    apply_optimizer_in_backward(torch.optim.Adagrad, model.sparse_arch.parameters(), {"lr": LR})
    constraints = None
    if plan_name != "planner":
        constraints = {f"t{f}": ParameterConstraints(sharding_types=[plan_name]) for f in range(NF)}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"),
                                       constraints=constraints)
    plan = planner.collective_plan(model, [EmbeddingBagCollectionSharder()], pg)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda params: torch.optim.Adagrad(params, lr=LR))
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense]), plan


def plan_key(plan):
    """(table, sharding type, ranks) of every table: two plans with the same key are one plan."""
    out = []
    for _, mod in sorted(plan.plan.items()):
        for t, p in sorted(mod.items()):
            ranks = tuple(p.ranks) if p.ranks else ()
            out.append((t, p.sharding_type, p.compute_kernel, ranks))
    return tuple(out)


def torchrec_worker(rank, world, steps, batch, port, plan_name, data, out):
    import warnings
    import logging
    warnings.filterwarnings("ignore")  # TorchRec 1.9's deprecation notes, once per rank and run
    logging.disable(logging.WARNING)
    import numpy as np
    import torch
    import torch.distributed as dist
    from torchrec import KeyedJaggedTensor
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(7)
    dmp, opt, plan = torchrec_model(world, plan_name, dist.GroupMember.WORLD)
    labels, dense, ids = read_data(data)
    keys = [f"f{f}" for f in range(NF)]
    lo_r, hi_r = rank * batch // world, (rank + 1) * batch // world
    lengths = torch.ones(NF * (hi_r - lo_r), dtype=torch.int32)
    loss_fn = torch.nn.BCEWithLogitsLoss(reduction="sum")  # sum / B: the global batch's mean, as dt
    first = None
    dist.barrier()
    t0 = time.perf_counter()
    for s in range(steps):
        lo, hi = s * batch + lo_r, s * batch + hi_r
        x = torch.from_numpy(np.array(dense[lo:hi]))  # (a copy: torch wants writable memory)
        y = torch.from_numpy(labels[lo:hi].astype(np.float32))
        v = torch.from_numpy(np.ascontiguousarray(ids[lo:hi].T).reshape(-1).astype(np.int64))
        kjt = KeyedJaggedTensor(keys=keys, values=v, lengths=lengths)
        opt.zero_grad()
        loss = loss_fn(dmp(x, kjt).squeeze(-1), y) / batch
        loss.backward()
        opt.step()
        if s == 0:
            first = loss.detach().clone()
    dist.barrier()
    el = time.perf_counter() - t0
    dist.all_reduce(first)  # the global batch's mean loss of step 1
    if rank == 0:
        out.put((steps * batch / el, float(first), plan_key(plan), str(plan)))
    dist.destroy_process_group()


def torchrec_run(np_, steps, batch, plan_name, data):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + (os.getpid() * 7 + np_ * 131 + hash(plan_name)) % 20000
    procs = [ctx.Process(target=torchrec_worker, args=(r, np_, steps, batch, port, plan_name, data, q))
             for r in range(np_)]
    for p in procs:
        p.start()
    res = q.get()  # before join: a queue's feeder thread must drain before its process can end
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"bench/dlrm.py: a TorchRec rank (plan {plan_name}) exited with {p.exitcode}")
    return res


# ----------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--plans", default="planner,table_wise,data_parallel",
                    help="TorchRec plans: planner (its own) and/or sharding types every table is held to")
    a = ap.parse_args()
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
        import torchrec  # noqa: F401
    except ImportError as e:
        print(f"SKIP bench/dlrm.py: no TorchRec here ({e}); ./build.sh bench runs this with build/peers, "
              "the venv of the pinned peers")
        return 0
    if not os.path.exists(os.path.join(ROOT, "build", "examples", "dlrm")):
        print("bench/dlrm.py: build/examples/dlrm is missing; run ./build.sh first")
        return 1
    ranks = [int(x) for x in a.ranks.split(",")]
    plans = a.plans.split(",")
    print(f"DLRM training: global batch {a.batch}, {a.steps} steps, 1 thread per rank, medians of {a.repeat} "
          f"interleaved runs; torch {torch.__version__}, torchrec {torchrec.__version__}; "
          f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f} at the start", flush=True)
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "dlrm.bin")
        write_data(data, a.steps * a.batch + EVAL)
        for n in ranks:
            d, t, keys, first = [], {}, {}, {}
            loads = []
            for rep in range(a.repeat):  # interleaved, so a noisy moment hits both
                sps, first["dt"] = dt_run(n, a.steps, a.batch, data)
                d.append(sps)
                for p in plans:
                    if rep > 0 and p not in t:
                        continue  # a duplicate plan, found in the first round
                    sps, loss, key, text = torchrec_run(n, a.steps, a.batch, p, data)
                    if rep == 0:
                        dup = [q for q in t if keys[q] == key]
                        if dup:
                            print(f"  np {n}: TorchRec plan '{p}' is plan '{dup[0]}'; measured once", flush=True)
                            continue
                        keys[p] = key
                        t[p] = []
                        if p == "planner":
                            kinds = sorted({k[1] for k in key})
                            print(f"  np {n}: TorchRec's planner chose {', '.join(kinds)}", flush=True)
                    t[p].append(sps)
                    first[p] = loss
                loads.append(os.getloadavg()[0])
            md = statistics.median(d)
            mt = {p: statistics.median(v) for p, v in t.items()}
            best = max(mt, key=mt.get)
            res[n] = (md, mt[best])
            print(f"np {n}: dt {md:.0f} samples/s ({min(d):.0f}-{max(d):.0f}); TorchRec " +
                  ", ".join(f"{p} {mt[p]:.0f} ({min(t[p]):.0f}-{max(t[p]):.0f})" for p in t) +
                  f"; dt / TorchRec best ({best}) {md / mt[best]:.2f}x; first losses " +
                  ", ".join(f"{k} {v:.4f}" for k, v in first.items()) +
                  f"; load {min(loads):.2f}-{max(loads):.2f}", flush=True)
    print(f"{'ranks':>5} {'dt samples/s':>13} {'TorchRec best':>14} {'dt/TorchRec':>12}")
    for n in ranks:
        print(f"{n:>5} {res[n][0]:>13.0f} {res[n][1]:>14.0f} {res[n][0] / res[n][1]:>12.2f}")
    if 1 in res:
        for n in ranks:
            if n > 1:
                print(f"scaling 1 -> {n} ranks: dt {res[n][0] / res[1][0]:.2f}x, TorchRec {res[n][1] / res[1][1]:.2f}x "
                      f"({os.cpu_count()} cpus)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
