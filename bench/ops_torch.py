"""bench/ops_torch.py - the PyTorch peer of bench/ops.c, section 1: gelu (tanh), layer_norm and
cross entropy, forward and backward, on the same shapes, one thread, f32, each the aten op a
training step runs (gelu / gelu_backward, native_layer_norm / native_layer_norm_backward,
_log_softmax + nll_loss_forward / nll_loss_backward + _log_softmax_backward_data). When
build/bench/ops exists it runs `build/bench/ops --tsv` right after, in the same process tree, and
prints dt's time (after and before vectorising) and the ratio torch ms / dt ms (> 1: dt faster).
What differs: torch allocates its outputs, dt writes into buffers it is given and accumulates its
gradients (+=, one more read); dt's softmax_xent writes the probabilities, torch the log-softmax.
Times are the thread's CPU time (time.thread_time), as bench/ops.c's: the machine is shared.

    build/peers/bin/python bench/ops_torch.py [reps]   (./build.sh bench makes build/peers)"""
import os, subprocess, sys, time
try:
    import torch
except ImportError:  # ./build.sh bench runs every bench/*.py; PyTorch is for peers only
    print("bench/ops_torch.py: PyTorch is not installed here (./build.sh bench runs this with build/peers, a venv of the pinned peers); skipped")
    sys.exit(0)

# (op, rows, cols) as bench/ops.c section 1 prints them
SHAPES = [
    ("gelu", 2048, 1024), ("layernorm", 2048, 256), ("softmax_xent", 2048, 256),
    ("gelu", 1024, 3072), ("layernorm", 1024, 768), ("softmax_xent", 128, 50257),
]


def median_ms(fn, reps):
    fn()
    t = []
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        t.append(time.thread_time() - t0)
    t.sort()
    return 1e3 * t[len(t) // 2]


def torch_times(op, R, C, reps):
    g = torch.Generator().manual_seed(5)
    x = 2 * torch.randn(R, C, generator=g)
    dout = torch.randn(R, C, generator=g)
    aten = torch.ops.aten
    if op == "gelu":
        return (median_ms(lambda: aten.gelu(x, approximate="tanh"), reps),
                median_ms(lambda: aten.gelu_backward(dout, x, approximate="tanh"), reps))
    if op == "layernorm":
        w, b = torch.randn(C, generator=g), torch.randn(C, generator=g)
        _, mean, rstd = aten.native_layer_norm(x, [C], w, b, 1e-5)
        return (median_ms(lambda: aten.native_layer_norm(x, [C], w, b, 1e-5), reps),
                median_ms(lambda: aten.native_layer_norm_backward(dout, x, [C], mean, rstd, w, b,
                                                                  [True, True, True]), reps))
    t = torch.tensor([(r * 7919) % C for r in range(R)], dtype=torch.int64)
    ls = aten._log_softmax(x, 1, False)
    _, tw = aten.nll_loss_forward(ls, t, None, 1, -100)
    one = torch.tensor(1.0)

    def fwd():
        l = aten._log_softmax(x, 1, False)
        return aten.nll_loss_forward(l, t, None, 1, -100)

    def bwd():
        gl = aten.nll_loss_backward(one, ls, t, None, 1, -100, tw)
        return aten._log_softmax_backward_data(gl, ls, 1, torch.float32)
    return median_ms(fwd, reps), median_ms(bwd, reps)


def dt_times():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bench", "ops")
    if not os.access(exe, os.X_OK):
        return {}
    out = subprocess.run([exe, "--tsv"], capture_output=True, text=True, check=True).stdout
    res = {}
    for line in out.splitlines():
        op, R, C, after, before, _memcpy = line.split("\t")
        res[(op, int(R), int(C))] = (float(after), float(before))
    return res


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    torch.set_num_threads(1)
    rows = []
    for op, R, C in SHAPES:
        f, b = torch_times(op, R, C, reps)
        rows += [(op + "_fwd", R, C, f), (op + "_bwd", R, C, b)]
    dt = dt_times()
    print("bench/ops_torch.py: PyTorch %s, 1 thread, median of %d (thread CPU time); dt from build/bench/ops --tsv%s"
          % (torch.__version__, reps, "" if dt else " (not built: run ./build.sh first)"))
    print("%-17s %-13s %9s %9s %9s %12s %12s" % ("op", "rows x cols", "torch ms", "dt ms", "dt old", "torch/dt",
                                                  "torch/dt old"))
    for name, R, C, ms in rows:
        a, b = dt.get((name, R, C), (float("nan"), float("nan")))
        print("%-17s %-13s %9.3f %9.3f %9.3f %12.2f %12.2f" % (name, "%d x %d" % (R, C), ms, a, b, ms / a, ms / b))


if __name__ == "__main__":
    main()
