"""The chunked SDPA variant of the block-local training attention that attn_bench.py and profile_step.py measure."""
import torch
import torch.nn.functional as F


def chunked_attend(anchors, B, query, key, value, scaling, groups, chunk=32):
    bsz, heads, q_len, dim = query.shape
    N, T = q_len // B, key.shape[2] - q_len
    key = key.repeat_interleave(groups, dim=1); value = value.repeat_interleave(groups, dim=1)
    limit = anchors.to(query.device).clamp_min(0)
    outs = []
    for n0 in range(0, N, chunk):
        n1 = min(N, n0 + chunk)
        c = int(limit[:, n0:n1].max())
        blk = torch.arange(n0, n1, device=query.device).repeat_interleave(B)
        ctx = torch.arange(c, device=query.device)[None, None, :] < limit[:, blk][:, :, None]
        own = (blk[:, None] == blk[None, :]).expand(bsz, -1, -1)
        mask = torch.cat([ctx, own], dim=2)[:, None]
        k = torch.cat([key[:, :, :c], key[:, :, T + n0 * B:T + n1 * B]], dim=2)
        v = torch.cat([value[:, :, :c], value[:, :, T + n0 * B:T + n1 * B]], dim=2)
        outs.append(F.scaled_dot_product_attention(query[:, :, n0 * B:n1 * B], k, v, attn_mask=mask, scale=scaling))
    return torch.cat(outs, dim=2).transpose(1, 2)
