"""Held-out replay of run 29 (draft_vocab_context on) with lookup_threshold 0.6 under other n-gram orders than the
default (3, 2): patches the generator's ContextLookup. LK folders from heldout.sh; the held-out files in /work/ho.

    OMP_NUM_THREADS=1 python results/context_lookup/orders.py 4,3,2
"""
import functools, json, sys
import dflash_retrace.generation_dflash as g
from dflash_retrace.lookup_dflash import ContextLookup
from dflash_retrace.evaluation.replay import run_replay

orders = tuple(int(x) for x in sys.argv[1].split(","))
g.ContextLookup = functools.partial(ContextLookup, orders=orders)
out = {}
for name, suffix in (("solve", "_solve"), ("first", ""), ("math", "_math")):
    r = run_replay("smollm2-135m-instruct", "/tmp/lk/t0.6", dataset=f"/work/ho/heldout{suffix}.jsonl", max_samples=64,
                   source_order=True, max_new_tokens=64, dtype="float32", references=f"/work/ho/refs{suffix}.jsonl",
                   seed=4, progress=False, output=None)
    out[name] = r["summary"]["methods"]["main"]["tau_pooled"]
    print(orders, name, round(out[name], 3), flush=True)
print(orders, "mean", round(sum(out.values()) / 3, 3))
json.dump({"orders": orders, "tau": out}, open(f"/work/pld/orders_{sys.argv[1].replace(',', '')}.json", "w"))
