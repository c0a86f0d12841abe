"""pulse.Subscriber(class_index=..., memory_budget=...): the class index
rule seen from Python (inference_side/apply/sub_index.c). Workers that keep
the index and workers that do not pull the same bits at every step; the
default keeps none (it never fits a tenth of the targets' bytes), a
sparse run with room keeps one, a dense one does not; figures() says what
was chosen and why; bad values raise. Exit 77: no torch."""

import os
import shutil
import sys
import tempfile
import time

try:
    import torch
except ImportError:
    print("skipped: python3-torch is not installed")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import pulse  # noqa: E402


def bits(t):
    return t.contiguous().view(torch.int16)


def step(state, density, gen):
    """Moves about `density` of the weights by a BF16 ulp or so."""
    for t in state.values():
        flat = t.view(-1)
        idx = torch.randint(0, flat.numel(), (max(1, int(flat.numel() * density)),), generator=gen)
        flat[idx] *= 1.0 + 2.0 ** -6


def wait_built(sub, tensors):
    for _ in range(2000):
        if sub.figures()["class_index_builds"] >= tensors:
            return
        time.sleep(0.01)
    raise AssertionError("no class index built within 20 s")


def run(density, workers, steps=3):
    """Publishes `steps` steps of `density`; each worker (kwargs of
    Subscriber) pulls each into its own BF16 tensors, which must equal the
    trainer's cast at every step. Returns each worker's last figures."""
    gen = torch.Generator().manual_seed(1)
    state = {f"layers.{i}.weight": torch.randn(64, 1024, generator=gen) * 0.02 for i in range(4)}
    pub_dir = tempfile.mkdtemp(prefix="pulse-class-index-")
    pub = pulse.Publisher(pub_dir, anchor_every=1000)
    server = pulse.Server(pub_dir)
    subs = [pulse.Subscriber(server.url, key=pub.public_key, **kw) for kw in workers]
    targets = [{n: torch.zeros(t.shape, dtype=torch.bfloat16) for n, t in state.items()} for _ in subs]
    figures = []
    try:
        pub.publish(state)
        for sub, tg in zip(subs, targets):
            sub.pull(tg)  # the anchor
        for _ in range(steps):
            step(state, density, gen)
            pub.publish(state)
            for k, (sub, tg) in enumerate(zip(subs, targets)):
                sub.pull(tg)
                for name, t in state.items():
                    assert torch.equal(bits(tg[name]), bits(t.to(torch.bfloat16))), \
                        f"worker {workers[k]}: '{name}' differs from the trainer's"
                if workers[k].get("class_index") is True or workers[k].get("memory_budget"):
                    if sub.figures()["class_index_kept"]:
                        wait_built(sub, len(state))  # so that the next step uses it
        figures = [sub.figures() for sub in subs]
    finally:
        for sub in subs:
            sub.close()
        server.close()
        pub.close()
        shutil.rmtree(pub_dir, ignore_errors=True)
    return figures


def main():
    big = 1 << 40
    default, room, on, off = run(0.01, [{}, {"memory_budget": big}, {"class_index": True},
                                       {"class_index": False}])
    assert default["class_index_kept"] == 0 and default["class_index_bytes"] == 0, default
    assert "a tenth of the targets' bytes" in default["class_index_why"], default["class_index_why"]
    assert room["class_index_kept"] == 1 and room["class_index_bytes"] > 0, room["class_index_why"]
    assert room["class_index_why"].startswith("class index on:"), room["class_index_why"]
    assert on["class_index_kept"] == 1 and on["class_index_bytes"] == room["class_index_bytes"]
    assert off["class_index_kept"] == 0 and off["class_index_builds"] == 0
    print("sparse: default", default["class_index_why"][:60], "| with room", room["class_index_why"][:40])

    (dense,) = run(0.3, [{"memory_budget": big}])
    assert dense["class_index_kept"] == 0 and dense["class_index_builds"] == 0, dense["class_index_why"]
    assert "above 5%" in dense["class_index_why"], dense["class_index_why"]
    print("dense with room:", dense["class_index_why"][:70])

    for bad in ({"class_index": "on"}, {"class_index": 1}, {"memory_budget": 0},
                {"memory_budget": -5}, {"memory_budget": 1.5}, {"memory_budget": True}):
        try:
            pulse.Subscriber("http://127.0.0.1:9", key="00" * 32, **bad)
        except pulse.Error as exc:
            assert "class_index" in str(exc) or "memory_budget" in str(exc), str(exc)
            continue
        raise AssertionError(f"Subscriber({bad}) was accepted")
    print("ok: the class index rule from Python, bit-identical either way")


if __name__ == "__main__":
    main()
