"""A deeper copy of a DFlash drafter: extra decoder layers on top with zero output projections (o_proj, down_proj),
so it drafts exactly as the original at step 0 (checked here).

    python results/wip_run8/deepen.py SRC OUT EXTRA_LAYERS
"""
import sys, torch
from dflash_retrace import DFlashDrafter
src, out, extra = sys.argv[1], sys.argv[2], int(sys.argv[3])
base = DFlashDrafter.from_pretrained(src, dtype=torch.float32)
cfg = base.config.__class__.from_dict(base.config.to_dict())
n = cfg.num_hidden_layers
cfg.num_hidden_layers = n + extra
torch.manual_seed(0)
deep = DFlashDrafter(cfg).float()
missing, unexpected = deep.load_state_dict(base.state_dict(), strict=False)
assert not unexpected and all(k.startswith(tuple(f"layers.{i}." for i in range(n, n + extra))) for k in missing), (missing, unexpected)
with torch.no_grad():
    for layer in deep.layers[n:]:
        layer.self_attn.o_proj.weight.zero_(); layer.mlp.down_proj.weight.zero_()
# check: same block outputs as the base on random inputs
H = cfg.hidden_size
torch.manual_seed(1)
kw = dict(noise_embeds=torch.randn(1, 8, H), context_hidden_states=torch.randn(1, 20, len(cfg.feature_layer_ids) * H),
          position_ids=torch.arange(28)[None])
a = base(**kw).last_hidden_state; b = deep(**kw).last_hidden_state
print("max diff", (a - b).abs().max().item()); assert torch.equal(a, b)
deep.to(torch.bfloat16).save_pretrained(out)
print("saved", out, cfg.num_hidden_layers, "layers")
