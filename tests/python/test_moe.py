"""Mixture-of-experts engine layouts: TP=2 x EP=2 workers in four
processes. A small Qwen2-MoE-shaped model (8 routed experts, a shared
expert, GQA attention; tests/python/moe_model.py) trained by AdamW
publishes every step; each rank pulls into its engine's tensors through
pulse.Mapping(experts=vLLM's expert params mapping): its 4 experts of each
layer stacked in experts.w13_weight [4, 2*I/2, H] and experts.w2_weight
[4, H, I/2], qkv_proj and the shared expert's gate_up_proj fused, o_proj
and down_proj split on columns. After every step every tensor of every
rank equals the trainer's BF16 weights sliced the engine's way by plain
torch. Bad mappings (expert ids out of range or listed twice, an ep_size
that does not divide E, a stack of the wrong shape, an intermediate size
that does not split, experts the publisher does not have) are refused
with pulse.Error and the reason, before anything is written. Each rank
fetches less than the whole patch at every step: the sections of the
tensors it holds (issue 34). Exit 77: no torch."""

import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("skipped: python3-torch is not installed")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import moe_model  # noqa: E402
import llama  # noqa: E402  (moe_model put python/examples on the path)
import pulse  # noqa: E402

TP, EP = 2, 2
STEPS = 3
CONFIG = moe_model.Config()
EXPERTS = moe_model.make_expert_params_mapping("gate_proj", "down_proj", "up_proj", CONFIG.experts)


def mapping(tp_rank, ep_rank, **kw):
    return pulse.Mapping(stacked=moe_model.STACKED, tp_rank=tp_rank, tp_size=TP,
                         head_dim=CONFIG.head_dim, experts=kw.pop("experts", EXPERTS),
                         ep_rank=ep_rank, ep_size=kw.pop("ep_size", EP), **kw)


def expected(sd, tp_rank, ep_rank, **kw):
    return moe_model.engine_tensors(sd, tp_rank, TP, ep_rank, EP, CONFIG.experts, **kw)


def zeros_like(tensors):
    return {n: torch.zeros(t.shape, dtype=torch.bfloat16) for n, t in tensors.items()}


def rank_main(tp_rank, ep_rank, url, key, work):
    """One rank: engine tensors (zeros, shapes from the layout), a pull on
    each 'pull STEP' line, then every tensor compared with the trainer's
    state of that step sliced by plain torch."""
    engine = zeros_like(expected(moe_model.Moe(CONFIG).state_dict(), tp_rank, ep_rank))
    layout = mapping(tp_rank, ep_rank)
    who = f"rank tp={tp_rank} ep={ep_rank}"
    with pulse.Subscriber(url, key=key, retries=1) as sub:
        for line in sys.stdin:
            step = int(line.split()[1])
            before = sub.figures()['bytes_downloaded']
            held = sub.pull(engine, mapping=layout, timeout=60)
            assert held == step, f"{who}: pulled {held}, published {step}"
            want = expected(torch.load(os.path.join(work, f"state-{step}.pt")), tp_rank, ep_rank)
            assert want.keys() == engine.keys(), f"{who}: {sorted(want.keys() ^ engine.keys())}"
            for name, t in engine.items():
                assert torch.equal(t.view(torch.int16), want[name].view(torch.int16)), \
                    f"{who} step {step}: '{name}' differs from the trainer's slice"
            stacks = sum(1 for n in engine if ".experts.w" in n)
            fetched = sub.figures()['bytes_downloaded'] - before
            print(f"ok {step} {len(engine)} {stacks} {fetched}", flush=True)


def refused(what, sub, engine, layout, needle, status=None):
    """A pull that must fail with pulse.Error naming `needle`, writing nothing."""
    try:
        sub.pull(engine, mapping=layout, timeout=60)
    except pulse.Error as e:
        assert needle in str(e), f"{what}: {e}"
        assert status is None or e.status == status, f"{what}: {e.status} {e}"
        assert all(not t.any() for t in engine.values()), f"{what}: a target was written"
        print(f"{what}: pulse.Error {e}")
        return
    raise AssertionError(f"{what} was not refused")


def constructor_refused(what, needle, **kw):
    try:
        mapping(0, 0, **kw)
    except pulse.Error as e:
        assert needle in str(e), f"{what}: {e}"
        print(f"{what}: pulse.Error {e}")
        return
    raise AssertionError(f"{what} was not refused")


def bad_mappings(url, key, sd):
    constructor_refused("an expert id out of range", "expert id 8 is out of range [0, 8)",
                        experts=EXPERTS[:-3] + [(p, w, 8, s) for p, w, _, s in EXPERTS[-3:]])
    constructor_refused("an expert listed twice", "listed twice", experts=EXPERTS + EXPERTS[:1])
    constructor_refused("ep_size 3 for 8 experts", "ep_size 3 does not divide the 8 experts",
                        ep_size=3)
    constructor_refused("an expert id beyond num_experts", "out of range [0, 4)", num_experts=4)
    with pulse.Subscriber(url, key=key) as sub:
        good = expected(sd, 1, 1)
        w13 = "model.layers.1.mlp.experts.w13_weight"
        engine = zeros_like(good)
        engine[w13] = torch.zeros(good[w13].shape[0] + 1, *good[w13].shape[1:], dtype=torch.bfloat16)
        refused("a w13 stack of the wrong shape", sub, engine, mapping(1, 1), w13,
                "PULSE_ERR_SIZE_MISMATCH")
        w2 = "model.layers.0.mlp.experts.w2_weight"
        engine = zeros_like(good)
        engine[w2] = torch.zeros(good[w2].shape[0], good[w2].shape[2], good[w2].shape[1],
                                 dtype=torch.bfloat16)
        refused("a transposed w2 stack", sub, engine, mapping(1, 1), w2, "PULSE_ERR_SIZE_MISMATCH")
        refused("an intermediate size that does not split", sub, zeros_like(good),
                mapping(1, 1, moe_tp_rank=0, moe_tp_size=3), "does not split over 3",
                "PULSE_ERR_UNSUPPORTED")
        # A mapping of 16 experts over a model of 8: rank 0 holds experts
        # 0..7, which exist, and the stacks have its shape; the 8 the
        # publisher does not have are still found missing.
        sixteen = moe_model.make_expert_params_mapping("gate_proj", "down_proj", "up_proj", 16)
        engine = zeros_like(moe_model.engine_tensors(sd, 0, TP, 0, 1, CONFIG.experts))
        refused("experts the publisher does not have", sub, engine,
                mapping(0, 0, experts=sixteen), "expert 8's w1", "PULSE_ERR_NOT_FOUND")


def plan_of_sixteen_experts():
    """The plan alone (no network) for 16 experts, where expert 1's
    weight_name 'experts.1.gate_proj.' must not catch expert 11's tensors:
    rank (tp 1, ep 1) holds experts 8..15, each block where vLLM's
    weight_loader puts it, and no block of another rank's expert."""
    hidden, inter, layers = 64, 32, 2
    mapping16 = moe_model.make_expert_params_mapping("gate_proj", "down_proj", "up_proj", 16)
    table = {}
    for layer in range(layers):
        for e in range(16):
            for p in ("gate_proj", "up_proj", "down_proj"):
                shape = (hidden, inter) if p == "down_proj" else (inter, hidden)
                table[f"model.layers.{layer}.mlp.experts.{e}.{p}.weight"] = shape
    targets = {}
    for layer in range(layers):
        targets[f"model.layers.{layer}.mlp.experts.w13_weight"] = (8, inter, hidden)
        targets[f"model.layers.{layer}.mlp.experts.w2_weight"] = (8, hidden, inter // 2)
    copies = mapping(1, 1, experts=mapping16).plan(table, targets)
    assert len(copies) == layers * 8 * 3, f"{len(copies)} blocks, not one per held expert tensor"
    half = inter // 2
    for c in copies:
        e = int(c.source.split(".experts.")[1].split(".")[0])
        assert 8 <= e < 16, f"'{c.source}' is another rank's expert"
        local = e - 8
        if ".down_proj." in c.source:
            want = (0, half, local * hidden, 0, hidden, half, half)  # columns [16, 32)
        else:
            row = local * inter + (0 if ".gate_proj." in c.source else half)
            want = (half, 0, row, 0, half, hidden, hidden)  # rows [16, 32)
        assert (c.src_row0, c.src_col0, c.dst_row0, c.dst_col0, c.rows, c.cols, c.dst_cols) == want, \
            f"'{c.source}': {c}"
    print(f"plan of 16 experts for rank (tp 1, ep 1): {len(copies)} blocks, experts 8..15 only")


def device_plan():
    """CUDA targets take whole published tensors only (no device regions in
    the C library): at tp_size 1 every block of an EP=2 rank's plan (fused
    qkv and gate_up, expert stacks) is a whole tensor at the offset where
    the engine keeps it, its rows one after the other; at tp_size 2 the
    plan is refused, naming a split tensor, before anything is attached.
    (A pull into CUDA targets through such a plan: tests/gpu/moe_pull.py.)"""
    from pulse.mapping import device_targets
    sd = moe_model.Moe(CONFIG).state_dict()
    table = {n: tuple(t.shape) for n, t in sd.items()}
    want = moe_model.engine_tensors(sd, 0, 1, 1, EP, CONFIG.experts)
    layout = pulse.Mapping(stacked=moe_model.STACKED, tp_rank=0, tp_size=1,
                           head_dim=CONFIG.head_dim, experts=EXPERTS, ep_rank=1, ep_size=EP)
    blocks = device_targets(layout.plan(table, {n: tuple(t.shape) for n, t in want.items()}),
                            table)
    covered = {}
    for d in blocks:
        whole = want[d.target].reshape(-1)
        got = whole[d.offset:d.offset + sd[d.source].numel()].view(d.shape)
        assert torch.equal(got.view(torch.int16), sd[d.source].to(torch.bfloat16).view(torch.int16)), \
            f"'{d.source}' is not at element {d.offset} of '{d.target}'"
        covered[d.target] = covered.get(d.target, 0) + sd[d.source].numel()
    for name, t in want.items():
        assert covered.get(name) == t.numel(), f"'{name}' is not covered by whole tensors"
    try:
        device_targets(mapping(0, 1).plan(table, {n: tuple(t.shape) for n, t in
                                                 expected(sd, 0, 1).items()}), table)
        raise AssertionError("a tensor-parallel split into CUDA targets was not refused")
    except pulse.Error as e:
        assert e.status == "PULSE_ERR_UNSUPPORTED" and "no device regions" in str(e), str(e)
    print(f"device plan at tp 1, ep 1 of 2: {len(blocks)} whole tensors; at tp 2 refused")


def unsplit_experts(url, key, sd, step):
    """vLLM's own expert parallelism keeps each expert whole (its MoE
    tensor-parallel size is 1) while attention stays split: one rank of
    that layout, in this process."""
    want = expected(sd, 1, 1, moe_tp=(0, 1))
    engine = zeros_like(want)
    with pulse.Subscriber(url, key=key) as sub:
        assert sub.pull(engine, mapping=mapping(1, 1, moe_tp_size=1), timeout=60) == step
    for name, t in engine.items():
        assert torch.equal(t.view(torch.int16), want[name].view(torch.int16)), f"'{name}' differs"
    print(f"experts whole under EP=2, attention at TP=2: {len(engine)} tensors equal")


def main():
    plan_of_sixteen_experts()
    device_plan()
    torch.manual_seed(0)
    trainer = moe_model.Moe(CONFIG)
    with tempfile.TemporaryDirectory(prefix="pulse-moe-") as work:
        store = os.path.join(work, "store")
        pub = pulse.Publisher(store)
        server = pulse.Server(store)
        ranks = {(t, e): subprocess.Popen([sys.executable, __file__, "--rank", str(t), str(e),
                                           server.url, pub.public_key, work],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for e in range(EP) for t in range(TP)}

        def publish():
            step = pub.publish(trainer.state_dict())
            torch.save({n: t.detach().clone() for n, t in trainer.state_dict().items()},
                       os.path.join(work, f"state-{step}.pt"))
            for p in ranks.values():
                p.stdin.write(f"pull {step}\n")
                p.stdin.flush()
            fetched = {}
            for who, p in ranks.items():
                line = p.stdout.readline()
                assert line.startswith(f"ok {step}"), f"rank (tp, ep) {who} at step {step}: {line!r}"
                fetched[who] = int(line.split()[4])
            print(f"step {step}: 4 ranks (TP=2 x EP=2) hold the trainer's BF16 weights, "
                  f"experts stacked; {line.split()[3]} of their tensors are expert stacks")
            patch = pub.last_figures["patch_bytes"]
            if patch:
                # Each rank fetches the sections of its tensors (issue 34):
                # less than the whole patch, head and section index included.
                for who, n in fetched.items():
                    assert n < patch, f"rank (tp, ep) {who} fetched {n} bytes, the patch is {patch}"
                print(f"step {step}: bytes fetched per rank " +
                      ", ".join(f"{n}" for n in fetched.values()) + f" against the whole patch {patch}")
            return step

        publish()
        for _ in llama.train_steps(trainer, STEPS):
            step = publish()
        for p in ranks.values():
            p.stdin.close()
            assert p.wait(60) == 0
        sd = trainer.state_dict()
        unsplit_experts(server.url, pub.public_key, sd, step)
        bad_mappings(server.url, pub.public_key, sd)
        server.close()
        pub.close()
    print("ok")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6])
    else:
        main()
