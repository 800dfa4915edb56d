"""One LM-head chunk (512 slots x 8,192 draft rows, width 576), forward + backward: the eager cross-entropy and
argmax of `_ce_and_argmax`, a hand-written autograd function (one max pass gives the argmax, backward writes
softmax - onehot in place), and the eager function under `torch.compile(dynamic=False)`.

    OMP_NUM_THREADS=1 python results/training_profile/ce_bench.py
"""
import time, torch, torch.nn.functional as F
torch.manual_seed(0)
n, H, V = 512, 576, 8192
W = torch.randn(V, H) * 0.05
h0 = torch.randn(n, H, requires_grad=True)
lab = torch.randint(0, V, (n,))
def head(h):
    """The chunk's logits, bf16 under autocast as in training."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return F.linear(h, W)
def ce_part(logits, labels):
    logits = logits.float()
    ce = F.cross_entropy(logits, labels, reduction="none")
    return ce, logits.argmax(-1)
def eager(h):
    return ce_part(head(h), lab)

class FusedCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels):
        m, idx = logits.max(-1)
        z = logits.float() - m.float()[:, None]
        e = z.exp_()
        s = e.sum(-1)
        lse = s.log()
        ce = lse - (logits.gather(1, labels[:, None])[:, 0].float() - m.float())
        e.div_(s[:, None])
        ctx.save_for_backward(e, labels)
        ctx.dtype = logits.dtype
        return ce, idx
    @staticmethod
    def backward(ctx, g, _):
        p, labels = ctx.saved_tensors
        p.mul_(g[:, None])
        p.scatter_add_(1, labels[:, None], -g[:, None])
        return p.to(ctx.dtype), None
def custom(h):
    return FusedCE.apply(head(h), lab)
cpart = torch.compile(ce_part, dynamic=False)
def compiled(h):
    return cpart(head(h), lab)
def bench(f, k=20):
    for _ in range(3):
        ce, p = f(h0); ce.sum().backward(); h0.grad = None
    t = time.perf_counter()
    for _ in range(k):
        ce, p = f(h0); ce.sum().backward(); h0.grad = None
    return (time.perf_counter() - t) / k * 1e3
ce1, p1 = eager(h0); ce2, p2 = custom(h0)
print("diff", (ce1 - ce2).abs().max().item(), (p1 == p2).float().mean().item())
t0 = time.perf_counter(); ce3, p3 = compiled(h0); ce3.sum().backward(); h0.grad=None; print("compile s", time.perf_counter() - t0)
print("diff c", (ce1 - ce3).abs().max().item(), (p1 == p3).float().mean().item())
for name, f in [("eager", eager), ("custom", custom), ("compiled", compiled), ("eager", eager), ("custom", custom), ("compiled", compiled)]:
    print(name, f"{bench(f):.1f} ms")
