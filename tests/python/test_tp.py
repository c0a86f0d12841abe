"""Engine layouts: a TP=2 fused worker in two processes. A small
Llama-shaped model trained by AdamW publishes every step; each rank pulls
into its engine's tensors (qkv_proj and gate_up_proj fused, split on dim 0
per part; o_proj and down_proj split on dim 1; the rest whole) through
pulse.Mapping, and after every step holds exactly the trainer's BF16
weights concatenated and sliced by plain torch here. Layouts that cannot
be split (fewer KV heads than ranks) and targets of the wrong shape are
refused with pulse.Error before anything is written, and so is a damaged
patch. The publisher is the default one (class-model positions): each rank
decodes its part from the bits it keeps around it. Exit 77: no torch."""

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
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "examples"))
import llama  # noqa: E402
import pulse  # noqa: E402

TP = 2
STEPS = 4
STACKED = llama.STACKED


def expected_shards(sd, rank, tp):
    """The rank's engine tensors from the trainer's BF16 state, by plain torch."""
    out = {}
    for name, t in sd.items():
        t = t.to(torch.bfloat16)
        if ".q_proj." in name:
            k, v = sd[name.replace("q_proj", "k_proj")], sd[name.replace("q_proj", "v_proj")]
            parts = [t, k.to(torch.bfloat16), v.to(torch.bfloat16)]
            out[name.replace("q_proj", "qkv_proj")] = torch.cat([p.chunk(tp, 0)[rank] for p in parts])
        elif ".gate_proj." in name:
            up = sd[name.replace("gate_proj", "up_proj")].to(torch.bfloat16)
            out[name.replace("gate_proj", "gate_up_proj")] = torch.cat([p.chunk(tp, 0)[rank] for p in (t, up)])
        elif any(f".{p}." in name for p in ("k_proj", "v_proj", "up_proj")):
            continue
        elif ".o_proj." in name or ".down_proj." in name:
            out[name] = t.chunk(tp, 1)[rank].contiguous()
        else:
            out[name] = t.clone()
    return out


def rank_main(rank, url, key, work):
    """One rank: engine tensors (shapes from the layout, zeros), pulls on
    each 'pull STEP' line and compares with the trainer's state file."""
    config = llama.Config()
    shapes = {n: t.shape for n, t in expected_shards(llama.Llama(config).state_dict(), rank, TP).items()}
    engine = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in shapes.items()}
    mapping = pulse.Mapping(stacked=STACKED, tp_rank=rank, tp_size=TP, head_dim=config.head_dim)
    sub = pulse.Subscriber(url, key=key, retries=1)
    for line in sys.stdin:
        step = int(line.split()[1])
        held = sub.pull(engine, mapping=mapping, timeout=60)
        assert held == step, f"rank {rank}: pulled {held}, published {step}"
        want = expected_shards(torch.load(os.path.join(work, f"state-{step}.pt")), rank, TP)
        assert want.keys() == engine.keys()
        for name, t in engine.items():
            assert torch.equal(t.view(torch.int16), want[name].view(torch.int16)), \
                f"rank {rank} step {step}: '{name}' differs from the trainer's slice"
        print(f"ok {step} {len(engine)}", flush=True)
    sub.close()


def check_block_digests():
    """pulse_digest_bf16_block: blocks that tile a tensor add up to its
    digest (pulse_digest_bf16), and a block's digest sees a flipped bit."""
    import ctypes
    from pulse._lib import TensorDigest, check, lib

    lib.pulse_digest_bf16.restype = TensorDigest
    lib.pulse_digest_bf16.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    g = torch.Generator().manual_seed(3)
    t = torch.randn(37, 50, generator=g).to(torch.bfloat16)
    full = lib.pulse_digest_bf16(t.data_ptr(), t.numel())
    a = b = 0
    for r0, r1 in ((0, 20), (20, 37)):
        for c0, c1 in ((0, 13), (13, 50)):
            block = t[r0:r1, c0:c1].contiguous()  # in other memory, as a shard is
            d = TensorDigest()
            check(lib.pulse_digest_bf16_block(block.data_ptr(), r1 - r0, c1 - c0, c1 - c0,
                                              r0 * 50 + c0, 50, ctypes.byref(d)))
            a, b = (a + d.a) % 2**64, (b + d.b) % 2**64
            block.view(torch.int16)[0, 0] ^= 1
            e = TensorDigest()
            check(lib.pulse_digest_bf16_block(block.data_ptr(), r1 - r0, c1 - c0, c1 - c0,
                                              r0 * 50 + c0, 50, ctypes.byref(e)))
            assert (e.a, e.b) != (d.a, d.b), "a flipped bit left the block's digest as it was"
    assert (a, b) == (full.a, full.b), "block digests do not add up to the tensor's"
    print("block digests add up to the tensor digest")


def main():
    check_block_digests()
    config = llama.Config()
    trainer = llama.Llama(config)
    with tempfile.TemporaryDirectory(prefix="pulse-tp-") as work:
        store = os.path.join(work, "store")
        # The default publisher (class-model positions): each rank decodes
        # its part of a tensor from the bits it keeps around it (pulse_region.h).
        pub = pulse.Publisher(store)
        server = pulse.Server(store)
        ranks = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), server.url,
                                   pub.public_key, work], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True) for r in range(TP)]

        def publish():
            step = pub.publish(trainer.state_dict())
            torch.save({n: t.detach().clone() for n, t in trainer.state_dict().items()},
                       os.path.join(work, f"state-{step}.pt"))
            for p in ranks:
                p.stdin.write(f"pull {step}\n")
                p.stdin.flush()
            for r, p in enumerate(ranks):
                line = p.stdout.readline()
                assert line.startswith(f"ok {step}"), f"rank {r} at step {step}: {line!r}"
            print(f"step {step}: both ranks hold the trainer's BF16 weights, fused and sliced")

        publish()
        for _ in llama.train_steps(trainer, STEPS):
            publish()
        for p in ranks:
            p.stdin.close()
            assert p.wait(60) == 0

        # Refused layouts, before anything is written.
        engine = {n: torch.zeros(s.shape, dtype=torch.bfloat16)
                  for n, s in expected_shards(trainer.state_dict(), 0, 4).items()}
        sub = pulse.Subscriber(server.url, key=pub.public_key)
        four = pulse.Mapping(stacked=STACKED, tp_rank=0, tp_size=4, head_dim=config.head_dim)
        try:
            sub.pull(engine, mapping=four)
            raise AssertionError("TP=4 with 2 KV heads was not refused")
        except pulse.Error as e:
            assert e.status == "PULSE_ERR_UNSUPPORTED" and "k_proj" in str(e), str(e)
            print(f"TP=4 with 2 KV heads: pulse.Error {e}")
        assert all(not t.any() for t in engine.values()), "a refused layout wrote a target"
        two = pulse.Mapping(stacked=STACKED, tp_rank=1, tp_size=2, head_dim=config.head_dim)
        engine = {n: torch.zeros(t.shape, dtype=torch.bfloat16)
                  for n, t in expected_shards(trainer.state_dict(), 1, 2).items()}
        bad = "model.layers.0.self_attn.qkv_proj.weight"
        engine[bad] = torch.zeros(engine[bad].shape[0] + 8, engine[bad].shape[1], dtype=torch.bfloat16)
        try:
            sub.pull(engine, mapping=two)
            raise AssertionError("a fused target of the wrong shape was not refused")
        except pulse.Error as e:
            assert bad in str(e), str(e)
            print(f"wrong fused shape: pulse.Error {e}")
        assert all(not t.any() for t in engine.values()), "a refused pull wrote a target"
        sub.close()
        server.close()
        pub.close()
        corrupt_patch_refused(work, trainer, config)
    print("ok")


def corrupt_patch_refused(work, trainer, config):
    """A rank at step 1 and a damaged patch to step 2: refused naming the
    object, the rank's tensors exactly as they were; once the object is
    whole again the same rank applies it and holds the trainer's slices."""
    store = os.path.join(work, "store-corrupt")
    with pulse.Publisher(store) as pub, pulse.Server(store) as server:
        pub.publish(trainer.state_dict())
        mapping = pulse.Mapping(stacked=STACKED, tp_rank=1, tp_size=TP, head_dim=config.head_dim)
        engine = {n: torch.zeros(t.shape, dtype=torch.bfloat16)
                  for n, t in expected_shards(trainer.state_dict(), 1, TP).items()}
        with pulse.Subscriber(server.url, key=pub.public_key, retries=0) as sub:
            assert sub.pull(engine, mapping=mapping, timeout=60) == 1
            objects = os.path.join(store, "objects")
            old = set(os.listdir(objects))
            next(llama.train_steps(trainer, 1))
            assert pub.publish(trainer.state_dict()) == 2
            new = sorted(set(os.listdir(objects)) - old)
            assert new, "the step wrote no object"
            whole = {}
            for name in new:
                path = os.path.join(objects, name)
                whole[path] = open(path, "rb").read()
                data = bytearray(whole[path])
                data[len(data) // 2] ^= 0x55
                open(path, "wb").write(bytes(data))
            before = {n: t.clone() for n, t in engine.items()}
            try:
                sub.pull(engine, mapping=mapping, timeout=60)
                raise AssertionError("a damaged patch into a shard was applied")
            except pulse.Error as e:
                assert "objects/" in str(e), str(e)
                print(f"damaged patch into a shard: pulse.Error {e}")
            for n, t in engine.items():
                assert torch.equal(t.view(torch.int16), before[n].view(torch.int16)), \
                    f"a refused patch wrote '{n}'"
            for path, data in whole.items():
                open(path, "wb").write(data)
            assert sub.pull(engine, mapping=mapping, timeout=60) == 2
            want = expected_shards(trainer.state_dict(), 1, TP)
            for n, t in engine.items():
                assert torch.equal(t.view(torch.int16), want[n].view(torch.int16)), \
                    f"'{n}' differs after the repaired patch"
            print("the repaired patch applied into the shard")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        main()
