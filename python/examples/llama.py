"""A small Llama-shaped model in plain torch for the tests, the example and
the bench: embeddings, RMSNorm, rotary attention with grouped KV heads,
SiLU-gated MLP, untied LM head, with the checkpoint names of Llama
(model.layers.N.self_attn.q_proj.weight, ...). Deterministic on the CPU:
the same weights in the same dtype give the same logits bit for bit."""

import torch
from torch import nn


class Config:
    def __init__(self, vocab=96, dim=64, layers=2, heads=4, kv_heads=2, hidden=128):
        self.vocab, self.dim, self.layers = vocab, dim, layers
        self.heads, self.kv_heads, self.hidden = heads, kv_heads, hidden
        self.head_dim = dim // heads


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + 1e-6)).to(x.dtype) * self.weight


def rotary(x, pos):
    half = x.shape[-1] // 2
    freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    angle = pos[:, None].float() * freq[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, c, fused=False):
        super().__init__()
        self.c = c
        q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
        if fused:  # an engine's layout: q, k and v rows in one weight
            self.qkv_proj = nn.Linear(c.dim, q + 2 * kv, bias=False)
        else:
            self.q_proj = nn.Linear(c.dim, q, bias=False)
            self.k_proj = nn.Linear(c.dim, kv, bias=False)
            self.v_proj = nn.Linear(c.dim, kv, bias=False)
        self.o_proj = nn.Linear(q, c.dim, bias=False)

    def forward(self, x):
        c = self.c
        b, t, _ = x.shape
        if hasattr(self, "qkv_proj"):
            q, k, v = self.qkv_proj(x).split([c.heads * c.head_dim, c.kv_heads * c.head_dim,
                                              c.kv_heads * c.head_dim], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.reshape(b, t, c.heads, c.head_dim).transpose(1, 2)
        k = k.reshape(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        v = v.reshape(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        pos = torch.arange(t)
        q, k = rotary(q, pos), rotary(k, pos)
        rep = c.heads // c.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-1, -2)) / (c.head_dim ** 0.5)
        mask = torch.full((t, t), float("-inf")).triu(1).to(scores.dtype)
        attn = torch.softmax((scores + mask).float(), dim=-1).to(x.dtype)
        out = (attn @ v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, c, fused=False):
        super().__init__()
        if fused:  # gate rows then up rows in one weight
            self.gate_up_proj = nn.Linear(c.dim, 2 * c.hidden, bias=False)
        else:
            self.gate_proj = nn.Linear(c.dim, c.hidden, bias=False)
            self.up_proj = nn.Linear(c.dim, c.hidden, bias=False)
        self.down_proj = nn.Linear(c.hidden, c.dim, bias=False)

    def forward(self, x):
        if hasattr(self, "gate_up_proj"):
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(nn.functional.silu(gate) * up)


class Layer(nn.Module):
    def __init__(self, c, fused=False):
        super().__init__()
        self.input_layernorm = RMSNorm(c.dim)
        self.self_attn = Attention(c, fused)
        self.post_attention_layernorm = RMSNorm(c.dim)
        self.mlp = MLP(c, fused)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, c, fused=False):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList([Layer(c, fused) for _ in range(c.layers)])
        self.norm = RMSNorm(c.dim)


# How an engine fuses the checkpoint's projections (pulse.Mapping(stacked=...)).
STACKED = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
           ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]


class Llama(nn.Module):
    """fused=True: the inference engine's layout (qkv_proj, gate_up_proj)."""

    def __init__(self, c, fused=False):
        super().__init__()
        self.c = c
        self.model = Inner(c, fused)
        self.lm_head = nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, tokens):
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def train_steps(model, steps, seed=0, lr=3e-3, batch=4, seq=16):
    """Yields after each AdamW step on random next-token data."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    for step in range(1, steps + 1):
        tokens = torch.randint(0, model.c.vocab, (batch, seq + 1), generator=g)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, model.c.vocab),
                                           tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        yield step, float(loss)


# A text for the example to learn, and its characters as the vocabulary.
TEXT = ("pulse sends only the weights that changed, bit for bit, from the trainer "
        "to every inference worker. ")
CHARS = sorted(set(TEXT))


def text_config():
    return Config(vocab=len(CHARS), dim=64, layers=2, heads=4, kv_heads=2, hidden=128)


def encode(text):
    return torch.tensor([CHARS.index(c) for c in text], dtype=torch.long)


def train_text_steps(model, steps, seed=0, lr=1e-2, batch=8, seq=32):
    """Yields after each AdamW step on windows of TEXT (repeated)."""
    g = torch.Generator().manual_seed(seed)
    data = encode(TEXT * 4)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    for step in range(1, steps + 1):
        start = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        window = torch.stack([data[s:s + seq + 1] for s in start.tolist()])
        logits = model(window[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, model.c.vocab),
                                           window[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        yield step, float(loss)


@torch.no_grad()
def generate(model, prompt, count=40):
    """Greedy continuation of `prompt`."""
    tokens = encode(prompt)[None, :]
    for _ in range(count):
        nxt = model(tokens[:, -64:])[0, -1].float().argmax()
        tokens = torch.cat([tokens, nxt.view(1, 1)], dim=1)
    return "".join(CHARS[i] for i in tokens[0].tolist())
