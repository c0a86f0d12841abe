"""A mapped pull into CUDA torch tensors equals a mapped CPU pull
(tests/gpu/check.sh, "moe"): the Qwen2-MoE-shaped model of
tests/python/moe_model.py, trained by AdamW, publishes from the CPU; one
rank of an EP=2 engine at tp_size 1 (qkv and gate_up fused, experts 4..7
of each layer stacked in experts.w13_weight and experts.w2_weight) pulls
every step through pulse.Mapping into BF16 tensors on cuda:0 (each
published tensor a whole device target inside the engine's tensor:
pulse.mapping.device_targets), another into CPU tensors; both equal the
trainer's weights sliced the engine's way by plain torch, bit for bit. The
same layout at tp_size 2 (tensor-parallel splits: no device regions in the
C library) is refused with PULSE_ERR_UNSUPPORTED and nothing written.
Usage: moe_pull.py BUILD_DIR. Exit 77: torch without CUDA or no device."""

import os
import sys
import tempfile

build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PULSE_LIBRARY", os.path.join(build, "libpulse.so"))
sys.path.insert(0, os.path.join(root, "python"))
sys.path.insert(0, os.path.join(root, "tests", "python"))

try:
    import torch
except ImportError:
    print("skipped: python3-torch is not installed")
    sys.exit(77)
if not torch.cuda.is_available():
    print("skipped: this torch has no CUDA device (torch.cuda.is_available() is False)")
    sys.exit(77)

import moe_model  # noqa: E402  (puts python/examples on the path)
import llama  # noqa: E402
import pulse  # noqa: E402

STEPS = 3
EP, EP_RANK = 2, 1


def main():
    dev = torch.device("cuda", 0)
    config = moe_model.Config()
    experts = moe_model.make_expert_params_mapping("gate_proj", "down_proj", "up_proj",
                                                   config.experts)
    torch.manual_seed(0)
    trainer = moe_model.Moe(config)

    def layout(tp_size, tp_rank=0):
        return pulse.Mapping(stacked=moe_model.STACKED, tp_rank=tp_rank, tp_size=tp_size,
                             head_dim=config.head_dim, experts=experts, ep_rank=EP_RANK,
                             ep_size=EP)

    def engine(sd):
        return moe_model.engine_tensors(sd, 0, 1, EP_RANK, EP, config.experts)

    shapes = engine(trainer.state_dict())
    cpu = {n: torch.zeros(t.shape, dtype=torch.bfloat16) for n, t in shapes.items()}
    gpu = {n: torch.zeros(t.shape, dtype=torch.bfloat16, device=dev) for n, t in shapes.items()}
    with tempfile.TemporaryDirectory(prefix="pulse-gpu-moe-") as work:
        store = os.path.join(work, "store")
        with pulse.Publisher(store) as pub, pulse.Server(store) as server, \
                pulse.Subscriber(server.url, key=pub.public_key) as sub_cpu, \
                pulse.Subscriber(server.url, key=pub.public_key) as sub_gpu:

            def step_once():
                step = pub.publish(trainer.state_dict())
                want = engine(trainer.state_dict())
                assert sub_cpu.pull(cpu, mapping=layout(1), timeout=60) == step
                assert sub_gpu.pull(gpu, mapping=layout(1), timeout=60) == step
                for n, t in gpu.items():
                    back = t.cpu()
                    for other, what in ((cpu[n], "the CPU pull"), (want[n], "the trainer's")):
                        assert torch.equal(back.view(torch.int16), other.view(torch.int16)), \
                            f"step {step}: '{n}' on the device differs from {what}"
                print(f"moe pull: step {step}: {len(gpu)} CUDA tensors (expert stacks of experts "
                      f"{EP_RANK * config.experts // EP}..{(EP_RANK + 1) * config.experts // EP - 1}) "
                      f"equal the CPU pull and the trainer's")

            step_once()
            for _ in llama.train_steps(trainer, STEPS):
                step_once()
            engine_split = moe_model.engine_tensors(trainer.state_dict(), 0, 2, EP_RANK, EP,
                                                            config.experts)
            split = {n: torch.full(t.shape, 7, dtype=torch.bfloat16, device=dev)
                     for n, t in engine_split.items()}
            with pulse.Subscriber(server.url, key=pub.public_key) as sub_split:
                try:
                    sub_split.pull(split, mapping=layout(2), timeout=60)
                    raise AssertionError("a tensor-parallel split into CUDA targets was taken")
                except pulse.Error as e:
                    assert e.status == "PULSE_ERR_UNSUPPORTED", str(e)
                    assert "no device regions" in str(e), str(e)
            assert all(bool((t == 7).all()) for t in split.values()), "a refused layout was written"
            print("moe pull: tp_size 2 into CUDA targets refused, nothing written")
    print("ok")


if __name__ == "__main__":
    main()
