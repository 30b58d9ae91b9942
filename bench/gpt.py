"""bench/gpt.py - examples/gpt against an independent GPT-2 written in PyTorch.

  build/peers/bin/python bench/gpt.py      speed: tokens/s of build/examples/gpt (1 rank, fp32)
                                           and of the same model, batches and AdamW step in
                                           PyTorch, eager and torch.compile (inductor, CPU),
                                           with the same threads, from the same weights (dt's
                                           after its first step: the same first loss printed);
                                           rounds interleaved, medians; prints the ratios
                                           (./build.sh bench makes build/peers: pinned torch)
  /usr/bin/python3 bench/gpt.py --check    correctness: trains 3 steps of a tiny model with
                                           examples/gpt, loads its step-2 checkpoint (plain
                                           safetensors, read with numpy), draws step 2's batch
                                           from the same text with dt's Philox (re-implemented
                                           below), and computes the loss in PyTorch: it must
                                           equal the loss dt logged for step 3 within 1e-5

The PyTorch model is written from GPT-2's definition (nanoGPT's layout), not from dt's code:
wte [Vp, C] tied with the head, wpe, pre-LN blocks, tanh GELU, causal attention with
1/sqrt(head size), cross entropy over the real vocab (dt pads it as llm.c does). Without
PyTorch it prints one SKIP line and exits 0 (./build.sh bench runs every bench/*.py).
"""
import argparse, glob, json, math, os, statistics, struct, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT_BIN = os.path.join(ROOT, "build", "examples", "gpt")

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 - any import failure means: no peer here
    print(f"SKIP bench/gpt.py: PyTorch or numpy not importable ({e.__class__.__name__}: {e})")
    sys.exit(0)

sys.path.insert(0, os.path.join(ROOT, "tests"))
import safetensors_numpy  # noqa: E402  (the repo's numpy reader of safetensors)

# ---------------------------------------------------------------- dt's RNG and data windows

M32 = 0xFFFFFFFF


def philox4x32(ctr, key):
    """Philox4x32-10 (Salmon et al.), as dt_philox4x32."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        n0 = ((p1 >> 32) ^ c1 ^ k0) & M32
        n2 = ((p0 >> 32) ^ c3 ^ k1) & M32
        c1, c3, c0, c2 = p1 & M32, p0 & M32, n0, n2
        k0 = (k0 + 0x9E3779B9) & M32
        k1 = (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def rng_uniform(seed, stream, i):
    """dt_rng_uniform: counter (i, stream), key seed; 24 bits of the first word."""
    r = philox4x32((i & M32, i >> 32, stream & M32, stream >> 32), (seed & M32, seed >> 32))
    return (r[0] >> 8) / 16777216.0


STREAM = 0x67707464617461  # DT_GPT_DATA_STREAM


def window(tokens, T, seed, sample):
    """gpt_data.h's window of global sample i (one text file: one stream)."""
    starts = len(tokens) - T
    hi = int(rng_uniform(seed, STREAM, 2 * sample) * 16777216.0)
    lo = int(rng_uniform(seed, STREAM, 2 * sample + 1) * 16777216.0)
    p = ((hi << 24) | lo) % starts
    return tokens[p:p + T], tokens[p + 1:p + T + 1]


# ---------------------------------------------------------------- GPT-2 in PyTorch


class GPT(torch.nn.Module):
    def __init__(self, L, H, C, T, Vp):
        super().__init__()
        self.L, self.H, self.C = L, H, C
        self.sdpa = False  # the check spells attention out; the speed runs use the fused one
        P = lambda *s: torch.nn.Parameter(torch.zeros(*s))  # noqa: E731
        self.wte, self.wpe = P(Vp, C), P(T, C)
        self.lnf_w, self.lnf_b = P(C), P(C)
        self.blocks = torch.nn.ModuleList()
        for _ in range(L):
            b = torch.nn.Module()
            b.ln1_w, b.ln1_b, b.ln2_w, b.ln2_b = P(C), P(C), P(C), P(C)
            b.attn_w, b.attn_b = P(3 * C, C), P(3 * C)   # c_attn: q, k, v stacked
            b.proj_w, b.proj_b = P(C, C), P(C)
            b.fc_w, b.fc_b = P(4 * C, C), P(4 * C)
            b.mproj_w, b.mproj_b = P(C, 4 * C), P(C)
            self.blocks.append(b)

    def load_dt(self, params):
        """params: name -> numpy array, dt's names (q, k, v are three tensors there)."""
        g = lambda n: torch.from_numpy(np.array(params[n], dtype=np.float32))  # noqa: E731
        with torch.no_grad():
            self.wte.copy_(g("wte")); self.wpe.copy_(g("wpe"))
            self.lnf_w.copy_(g("ln_f.w")); self.lnf_b.copy_(g("ln_f.b"))
            for l, b in enumerate(self.blocks):
                h = f"h.{l}."
                b.ln1_w.copy_(g(h + "ln1.w")); b.ln1_b.copy_(g(h + "ln1.b"))
                b.ln2_w.copy_(g(h + "ln2.w")); b.ln2_b.copy_(g(h + "ln2.b"))
                b.attn_w.copy_(torch.cat([g(h + "attn.q.w"), g(h + "attn.k.w"), g(h + "attn.v.w")]))
                b.attn_b.copy_(torch.cat([g(h + "attn.q.b"), g(h + "attn.k.b"), g(h + "attn.v.b")]))
                b.proj_w.copy_(g(h + "attn.proj.w")); b.proj_b.copy_(g(h + "attn.proj.b"))
                b.fc_w.copy_(g(h + "mlp.fc.w")); b.fc_b.copy_(g(h + "mlp.fc.b"))
                b.mproj_w.copy_(g(h + "mlp.proj.w")); b.mproj_b.copy_(g(h + "mlp.proj.b"))

    def forward(self, idx, targets, V):
        B, T = idx.shape
        C, H = self.C, self.H
        x = self.wte[idx] + self.wpe[:T]
        for b in self.blocks:
            h = F.layer_norm(x, (C,), b.ln1_w, b.ln1_b, 1e-5)
            q, k, v = F.linear(h, b.attn_w, b.attn_b).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            if self.sdpa:  # what a user of torch 2.x writes (nanoGPT): the fused causal attention
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            else:
                att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
                att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
                y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, b.proj_w, b.proj_b)
            h = F.layer_norm(x, (C,), b.ln2_w, b.ln2_b, 1e-5)
            x = x + F.linear(F.gelu(F.linear(h, b.fc_w, b.fc_b), approximate="tanh"), b.mproj_w, b.mproj_b)
        x = F.layer_norm(x, (C,), self.lnf_w, self.lnf_b, 1e-5)
        logits = x @ self.wte.t()
        return F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))


# ---------------------------------------------------------------- the two modes


def run_dt(args, env_threads, workdir, np_=1):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(env_threads), OMP_NUM_THREADS=str(env_threads))
    pre = []
    if np_ > 1:
        pre = (os.environ.get("DT_MPIRUN") or "mpirun --oversubscribe --allow-run-as-root").split() + ["-np", str(np_)]
    r = subprocess.run(pre + [GPT_BIN] + args, cwd=workdir, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-2000:])
        sys.exit(f"bench/gpt.py: {GPT_BIN} {' '.join(args)} failed ({r.returncode})")
    return r.stdout


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load_checkpoint(step_dir, prefix="param/"):
    """name -> array of the entries under prefix ("param/", or "state/" for name/slot)."""
    params = {}
    for f in sorted(glob.glob(os.path.join(step_dir, "rank_*.safetensors"))):
        _, tensors = safetensors_numpy.load(f)
        for name, (_, a) in tensors.items():
            if name.startswith(prefix):
                params[name[len(prefix):]] = a
    return params


def dt_view(m):
    """The torch model's tensors under dt's names (q, k, v split back out of c_attn)."""
    C, out = m.C, {"wte": m.wte, "wpe": m.wpe, "ln_f.w": m.lnf_w, "ln_f.b": m.lnf_b}
    for l, b in enumerate(m.blocks):
        h = f"h.{l}."
        out.update({h + "ln1.w": b.ln1_w, h + "ln1.b": b.ln1_b, h + "ln2.w": b.ln2_w, h + "ln2.b": b.ln2_b,
                    h + "attn.proj.w": b.proj_w, h + "attn.proj.b": b.proj_b, h + "mlp.fc.w": b.fc_w,
                    h + "mlp.fc.b": b.fc_b, h + "mlp.proj.w": b.mproj_w, h + "mlp.proj.b": b.mproj_b})
        for i, n in enumerate("qkv"):
            out[h + f"attn.{n}.w"] = b.attn_w[i * C:(i + 1) * C]
            out[h + f"attn.{n}.b"] = b.attn_b[i * C:(i + 1) * C]
    return out


def check(a):
    os.makedirs(a.workdir, exist_ok=True)
    L, H, C, T, B, seed = 2, 4, 32, 16, 8, 3
    ck, log = os.path.join(a.workdir, "gpt_check_ckpt"), os.path.join(a.workdir, "gpt_check.jsonl")
    data = a.data
    run_dt(["--steps", "3", "--seed", str(seed), "--layers", str(L), "--heads", str(H), "--width", str(C), "--seq",
            str(T), "--batch", str(B), "--ckpt", ck, "--ckpt-every", "2", "--log", log, "--data", data, "--quiet"], 1, ROOT)
    dt_loss = read_log(log)[2]["loss"]  # step 3: the weights after 2 updates, step index 2's batch
    params = load_checkpoint(os.path.join(ck, "step_00000002"))
    tokens = np.frombuffer(open(data, "rb").read(), dtype=np.uint8).astype(np.int64)
    xs, ys = zip(*(window(tokens, T, seed, 2 * B + i) for i in range(B)))
    torch.set_num_threads(1)
    m = GPT(L, H, C, T, 256)
    m.load_dt(params)
    with torch.no_grad():
        loss32 = m(torch.tensor(np.stack(xs)), torch.tensor(np.stack(ys)), 256).item()
        loss64 = m.double()(torch.tensor(np.stack(xs)), torch.tensor(np.stack(ys)), 256).item()
    rel = abs(dt_loss - loss64) / abs(loss64)
    print(f"dt loss {dt_loss:.9g}   torch fp32 {loss32:.9g}   torch fp64 {loss64:.9g}   relative (dt vs fp64) {rel:.3g}")
    print(("check: same loss" if rel <= 1e-5 else "check: DIFFERENT loss") + f" (tolerance 1e-5, relative {rel:.3g})")
    # The backward and the update: from the step-2 weights and Adam state, one torch.optim.AdamW
    # step (dt's lr of that update, betas 0.9/0.95, weight decay 0.1 on matrices, clip 1.0) in
    # fp64 must land on dt's step-3 weights. The key biases are left out: their exact gradient
    # is zero (softmax ignores a shift of a row's scores), so both sides update them by noise.
    m = GPT(L, H, C, T, 256).double()
    m.load_dt(params)
    view, state = dt_view(m), load_checkpoint(os.path.join(ck, "step_00000002"), "state/")
    loss = m(torch.tensor(np.stack(xs)), torch.tensor(np.stack(ys)), 256)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    lr = read_log(log)[2]["lr"]
    with torch.no_grad():  # AdamW by hand on dt's tensors (c_attn's q, k, v rows have their own state)
        for name, p in view.items():
            g = p.grad if p.is_leaf else None
            if g is None:  # a slice of c_attn: its grad is the same slice of c_attn's
                blk = m.blocks[int(name.split(".")[1])]
                i = "qkv".index(name.split(".")[3])
                g = (blk.attn_w.grad if name.endswith(".w") else blk.attn_b.grad)[i * C:(i + 1) * C]
            ea = torch.from_numpy(state[name + "/exp_avg"].astype(np.float64)) * 0.9 + 0.1 * g
            eas = torch.from_numpy(state[name + "/exp_avg_sq"].astype(np.float64)) * 0.95 + 0.05 * g * g
            t = 3
            w = p * (1 - lr * (0.1 if p.dim() == 2 else 0.0))
            p.copy_(w - lr / (1 - 0.9 ** t) * ea / (eas.sqrt() / math.sqrt(1 - 0.95 ** t) + 1e-8))
    after = load_checkpoint(os.path.join(ck, "step_00000003"))
    worst, which = 0.0, ""
    for name, p in view.items():
        if name.endswith("attn.k.b"):
            continue
        d = np.abs(p.detach().numpy() - after[name]).max() / max(np.abs(after[name]).max(), 1e-30)
        if d > worst:
            worst, which = d, name
    ok = worst <= 1e-5
    print(("check: same weights" if ok else "check: DIFFERENT weights") + f" after one more AdamW step (worst "
          f"{which}: {worst:.3g} of its largest value, tolerance 1e-5)")
    return 0 if rel <= 1e-5 and ok else 1


def speed(a):
    """dt against torch eager and torch.compile (inductor, CPU) on the same model, batches and AdamW
    step, rounds interleaved (dt, eager, compiled; --repeat of them), medians. Both sides start
    from dt's weights after its first step (its checkpoint) and train on dt's batches (its data
    windows, re-drawn here), so the first loss each prints is the same number."""
    os.makedirs(a.workdir, exist_ok=True)
    L, H, C, T, B, steps = a.layers, a.heads, a.width, a.seq, a.batch, a.steps
    seed, load0 = 1, os.getloadavg()[0]
    log, ck = os.path.join(a.workdir, "gpt_speed.jsonl"), os.path.join(a.workdir, "gpt_speed_ckpt")
    model = ["--layers", str(L), "--heads", str(H), "--width", str(C), "--seq", str(T), "--batch", str(B),
             "--warmup", "2", "--seed", str(seed), "--data", a.data, "--dtype", a.dtype]
    amp = a.dtype == "bf16"
    # dt's step 1 -> its weights; dt's step-2 loss is the first loss both sides print
    run_dt(model + ["--steps", "2", "--ckpt", ck, "--ckpt-every", "1", "--log", log, "--quiet"], 1, ROOT)
    dt_first = read_log(log)[1]["loss"]
    params = load_checkpoint(os.path.join(ck, "step_00000001"))
    tokens = np.frombuffer(open(a.data, "rb").read(), dtype=np.uint8).astype(np.int64)
    batches = []
    for s_ in range(1, 1 + steps + 3):  # dt's batches of steps 2, 3, ...: windows s B .. s B + B - 1
        xs, ys = zip(*(window(tokens, T, seed, s_ * B + i) for i in range(B)))
        batches.append((torch.tensor(np.stack(xs)), torch.tensor(np.stack(ys))))
    torch.set_num_threads(a.threads)
    peers = {}
    for name in ("eager", "compile"):
        m = GPT(L, H, C, T, 256)
        m.sdpa = True
        m.load_dt(params)
        decay = [p for p in m.parameters() if p.dim() == 2]
        rest = [p for p in m.parameters() if p.dim() != 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                lr=1e-3, betas=(0.9, 0.95))
        fwd = torch.compile(m) if name == "compile" else m
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=amp):
            first = fwd(batches[0][0], batches[0][1], 256).item()
        peers[name] = (m, opt, fwd, first)

    def torch_run(name):
        m, opt, fwd, _ = peers[name]
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", torch.bfloat16, enabled=amp):
                loss = fwd(x, y, 256)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
        for i in range(3):  # warm-up (and the compiler's first graphs)
            step(*batches[i])
        t = time.perf_counter()
        for i in range(steps):
            step(*batches[3 + i])
        return steps * B * T / (time.perf_counter() - t)

    runs = {"dt": [], "eager": [], "compile": []}
    for r in range(a.repeat):
        run_dt(model + ["--steps", str(steps), "--log", log, "--print-every", "0"], a.threads, ROOT)
        runs["dt"].append(read_log(log)[-1]["tokens_per_s"])
        for name in ("eager", "compile"):
            runs[name].append(torch_run(name))
    med = {k: statistics.median(v) for k, v in runs.items()}
    best = max(med["eager"], med["compile"])
    amp_note = " (torch: autocast to bfloat16)" if amp else ""
    print(f"GPT L{L} C{C} H{H} T{T} B{B}, {a.dtype}{amp_note}, 1 rank, {a.threads} thread(s), {steps} steps a run, "
          f"{a.repeat} rounds interleaved (dt, eager, compile), torch {torch.__version__}")
    print(f"first loss (dt's weights after step 1, its step-2 batch): dt {dt_first:.6f}   torch eager "
          f"{peers['eager'][3]:.6f}   torch.compile {peers['compile'][3]:.6f}")
    print(f"{'':14s} {'tokens/s (median)':>18s}   runs")
    for k in ("dt", "eager", "compile"):
        print(f"{k if k == 'dt' else 'torch ' + k:14s} {med[k]:18.0f}   {', '.join(f'{v:.0f}' for v in runs[k])}")
    print(f"ratio dt / torch eager {med['dt'] / med['eager']:.2f}x, dt / torch.compile {med['dt'] / med['compile']:.2f}x, "
          f"dt / the faster {med['dt'] / best:.2f}x (target >= {1.5 if amp else 1.3}x)")
    print(f"machine load (1-min average) before {load0:.2f}, after {os.getloadavg()[0]:.2f}")
    if not a.no_scaling and a.threads == 1:  # np 2 (one BLAS thread per rank): tp 2, dp 2
        for name, flags in (("tp 2", ["--tp", "2"]), ("dp 2", ["--tp", "1"])):
            log2 = os.path.join(a.workdir, "gpt_speed_np2.jsonl")
            run_dt(model + ["--steps", str(steps), "--log", log2, "--quiet"] + flags, 1, ROOT, 2)
            tps = read_log(log2)[-1]["tokens_per_s"]
            print(f"np 2, {name}: {tps:.0f} tokens/s, scaling efficiency {tps / (2 * med['dt']):.2f} (vs 2 x np 1)")
    prof = run_dt(model + ["--steps", str(steps), "--log", log, "--print-every", "0", "--profile"], a.threads, ROOT)
    print("where a dt step goes (examples/gpt --profile, 1 rank, a run of its own):")
    print("".join(line + "\n" for line in prof.splitlines() if line.startswith("  ")), end="")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="the loss check instead of the speed run")
    ap.add_argument("--workdir", default=os.path.join(ROOT, "build", "bench"))
    ap.add_argument("--data", default="/usr/share/common-licenses/GPL-3" if os.path.exists(
        "/usr/share/common-licenses/GPL-3") else os.path.join(ROOT, "README.md"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="rounds (dt, eager, compile), interleaved; medians")
    ap.add_argument("--no-scaling", action="store_true", help="skip the np 2 runs")
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                    help="bf16: dt --dtype bf16 against torch.autocast(cpu, bfloat16) (f32 masters on both sides)")
    a = ap.parse_args()
    if not os.path.exists(GPT_BIN):
        sys.exit(f"bench/gpt.py: {GPT_BIN} is missing: run ./build.sh first")
    return check(a) if a.check else speed(a)


if __name__ == "__main__":
    sys.exit(main())
