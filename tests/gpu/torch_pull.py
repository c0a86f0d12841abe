"""A pull into CUDA torch tensors equals a CPU pull (tests/gpu/check.sh,
"torch"): a small Llama-shaped model trained by AdamW publishes from the
CPU; one subscriber pulls every step into BF16 tensors on cuda:0 on a
stream of the caller's (and, for the last steps, on another one, which the
binding orders against the stream the library was given), another into
CPU tensors, and the device tensors copied back equal the CPU ones bit for
bit. A publisher fed the same weights as CUDA tensors commits the same
state digests as the CPU one. A pull through pulse.Mapping into CUDA
tensors (whole tensors) equals it too. Usage: torch_pull.py BUILD_DIR. Exit 77:
torch without CUDA or no device (a skip, with the reason)."""

import os
import sys
import tempfile

build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PULSE_LIBRARY", os.path.join(build, "libpulse.so"))
sys.path.insert(0, os.path.join(root, "python"))
sys.path.insert(0, os.path.join(root, "python", "examples"))

try:
    import torch
except ImportError:
    print("skipped: python3-torch is not installed")
    sys.exit(77)
if not torch.cuda.is_available():
    print("skipped: this torch has no CUDA device (torch.cuda.is_available() is False)")
    sys.exit(77)

import llama  # noqa: E402
import pulse  # noqa: E402
from pulse._lib import lib  # noqa: E402

if not lib.pulse_cuda_available():
    print("FAIL: torch sees a device, libpulse does not: "
          + lib.pulse_cuda_unavailable_reason().decode())
    sys.exit(1)

STEPS = 4


def main():
    dev = torch.device("cuda", 0)
    trainer = llama.Llama(llama.Config())
    sd = trainer.state_dict()
    with tempfile.TemporaryDirectory(prefix="pulse-gpu-torch-") as work:
        store, store_d = os.path.join(work, "store"), os.path.join(work, "store-d")
        with pulse.Publisher(store) as pub, pulse.Publisher(store_d) as pub_d, \
                pulse.Server(store) as server, \
                pulse.Subscriber(server.url, key=pub.public_key) as sub_cpu, \
                pulse.Subscriber(server.url, key=pub.public_key) as sub_gpu:
            cpu = {n: torch.zeros(t.shape, dtype=torch.bfloat16) for n, t in sd.items()}
            gpu = {n: torch.zeros(t.shape, dtype=torch.bfloat16, device=dev) for n, t in sd.items()}
            streams = [torch.cuda.Stream(dev), torch.cuda.Stream(dev)]

            def step_once(k):
                step = pub.publish(trainer.state_dict())
                on_device = {n: t.detach().to(dev) for n, t in trainer.state_dict().items()}
                torch.cuda.synchronize(dev)
                pub_d.publish(on_device)
                assert pub_d.last_figures["state_digest"] == pub.last_figures["state_digest"], \
                    f"step {step}: the device publisher's state differs from the host one's"
                assert sub_cpu.pull(cpu, timeout=60) == step
                stream = streams[0 if k < 2 else 1]
                with torch.cuda.stream(stream):
                    assert sub_gpu.pull(gpu, timeout=60) == step
                    back = {n: t.cpu() for n, t in gpu.items()}  # on the caller's stream
                for n in cpu:
                    assert torch.equal(back[n].view(torch.int16), cpu[n].view(torch.int16)), \
                        f"step {step}: '{n}' on the device differs from the CPU pull"
                print(f"step {step}: CUDA targets equal the CPU pull (stream {0 if k < 2 else 1})")

            step_once(0)
            for k, _ in enumerate(llama.train_steps(trainer, STEPS)):
                step_once(k + 1)
            # Through a mapping (whole tensors: device targets at their
            # places; splits are refused, tests/gpu/moe_pull.py).
            assert sub_gpu.pull(gpu, mapping=pulse.Mapping(tp_size=1), timeout=60) == sub_cpu.step
            for n, t in gpu.items():
                assert torch.equal(t.cpu().view(torch.int16), cpu[n].view(torch.int16)), \
                    f"'{n}' pulled through a mapping differs from the CPU pull"
            print("a pull through pulse.Mapping into CUDA targets equals the CPU pull")
    print("ok")


if __name__ == "__main__":
    main()
