"""A small mixture-of-experts model in plain torch for test_moe.py and
python/bench_moe.py, with the checkpoint names of Qwen2-MoE
(model.layers.N.mlp.experts.E.gate_proj.weight, mlp.shared_expert.*,
mlp.shared_expert_gate.weight, mlp.gate.weight for the router) and the
attention of python/examples/llama.py (grouped KV heads). Also the layout
an engine keeps it in, sliced by plain torch: what a worker's tensors must
equal, bit for bit."""

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "python", "examples"))
import llama  # noqa: E402

STACKED = llama.STACKED  # qkv_proj, gate_up_proj (the shared expert's too)


class Config:
    def __init__(self, vocab=96, dim=64, layers=2, heads=4, kv_heads=2, experts=8, top_k=2,
                 expert_hidden=32, shared_hidden=64):
        self.vocab, self.dim, self.layers = vocab, dim, layers
        self.heads, self.kv_heads = heads, kv_heads
        self.head_dim = dim // heads
        self.experts, self.top_k = experts, top_k
        self.expert_hidden, self.shared_hidden = expert_hidden, shared_hidden


def make_expert_params_mapping(gate, down, up, num_experts):
    """(param_name, weight_name, expert_id, shard_id) as vLLM's
    FusedMoE.make_expert_params_mapping lists them (no redundant experts)."""
    return [("experts.w13_" if weight in (gate, up) else "experts.w2_",
             f"experts.{e}.{weight}.", e, shard)
            for e in range(num_experts)
            for shard, weight in (("w1", gate), ("w2", down), ("w3", up))]


class Expert(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoe(nn.Module):
    """Top-k routed experts plus a shared expert behind a sigmoid gate."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.gate = nn.Linear(c.dim, c.experts, bias=False)
        self.experts = nn.ModuleList([Expert(c.dim, c.expert_hidden) for _ in range(c.experts)])
        self.shared_expert = Expert(c.dim, c.shared_hidden)
        self.shared_expert_gate = nn.Linear(c.dim, 1, bias=False)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, chosen = probs.topk(self.c.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel():
                out[rows] += expert(x[rows]) * weights[rows, slot, None]
        out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.reshape(shape)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = llama.RMSNorm(c.dim)
        self.self_attn = llama.Attention(c)
        self.post_attention_layernorm = llama.RMSNorm(c.dim)
        self.mlp = SparseMoe(c)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList([Layer(c) for _ in range(c.layers)])
        self.norm = llama.RMSNorm(c.dim)


class Moe(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Inner(c)
        self.lm_head = nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, tokens):
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def engine_tensors(sd, tp_rank, tp_size, ep_rank, ep_size, num_experts, moe_tp=None):
    """The rank's engine tensors from a BF16 state by plain torch, as vLLM
    loads them: q/k/v and the shared expert's gate/up fused and split on
    rows, o_proj and down_proj split on columns, the router and norms whole;
    each layer's experts [ep_rank*E/ep, +E/ep) stacked in
    mlp.experts.w13_weight [E_local, 2*I_tp, H] (gate rows then up rows)
    and mlp.experts.w2_weight [E_local, H, I_tp]. moe_tp: (rank, size) of
    the split inside the experts (default the tensor-parallel one)."""
    mrank, msize = moe_tp if moe_tp is not None else (tp_rank, tp_size)
    sd = {n: t.detach().to(torch.bfloat16) for n, t in sd.items()}
    local = num_experts // ep_size
    out = {}
    prefixes = sorted({n.split(".experts.")[0] for n in sd if ".mlp.experts." in n})
    for prefix in prefixes:
        ids = range(ep_rank * local, (ep_rank + 1) * local)
        w13, w2 = [], []
        for e in ids:
            gate, up, down = (sd[f"{prefix}.experts.{e}.{p}.weight"]
                              for p in ("gate_proj", "up_proj", "down_proj"))
            w13.append(torch.cat([gate.chunk(msize, 0)[mrank], up.chunk(msize, 0)[mrank]]))
            w2.append(down.chunk(msize, 1)[mrank])
        out[f"{prefix}.experts.w13_weight"] = torch.stack(w13).contiguous()
        out[f"{prefix}.experts.w2_weight"] = torch.stack(w2).contiguous()
    for name, t in sd.items():
        if ".mlp.experts." in name:
            continue
        if ".q_proj." in name:
            parts = [t, sd[name.replace("q_proj", "k_proj")], sd[name.replace("q_proj", "v_proj")]]
            out[name.replace("q_proj", "qkv_proj")] = torch.cat([p.chunk(tp_size, 0)[tp_rank] for p in parts])
        elif ".gate_proj." in name:
            up = sd[name.replace("gate_proj", "up_proj")]
            out[name.replace("gate_proj", "gate_up_proj")] = torch.cat(
                [p.chunk(tp_size, 0)[tp_rank] for p in (t, up)])
        elif any(f".{p}." in name for p in ("k_proj", "v_proj", "up_proj")):
            continue
        elif ".o_proj." in name or ".down_proj." in name:
            out[name] = t.chunk(tp_size, 1)[tp_rank].contiguous()
        else:
            out[name] = t.clone()
    return out
