"""CUDA tensors where libpulse cannot use CUDA (a build without it, or no
usable device, as on the CPU test machines): Subscriber.pull into CUDA
targets and Publisher.publish of CUDA tensors raise pulse.Error with
PULSE_ERR_NOT_BUILT or PULSE_ERR_CUDA, naming the tensor and the library's
reason, before torch's CUDA is touched, and the targets stay as they were.
The tensors here only say they are on cuda:0 (torch without CUDA cannot
make real ones); the real pull into CUDA tensors is tests/gpu/torch_pull.py
(tests/gpu/check.sh). Exit 77: no torch, or a usable device (then the GPU
check covers it)."""

import os
import sys
import tempfile

try:
    import torch
except ImportError:
    print("skipped: python3-torch is not installed")
    sys.exit(77)

import pulse  # noqa: E402
from pulse._lib import lib  # noqa: E402

if lib.pulse_cuda_available():
    print("skipped: libpulse has a usable CUDA device (tests/gpu/torch_pull.py covers it)")
    sys.exit(77)


class SaysCuda(torch.Tensor):
    """A CPU tensor that reports cuda:0, as a real CUDA tensor would."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def expect_cuda_error(what, fn, name):
    try:
        fn()
    except pulse.Error as e:
        assert e.status in ("PULSE_ERR_NOT_BUILT", "PULSE_ERR_CUDA"), f"{what}: {e}"
        assert name in str(e) and "CUDA" in str(e), f"{what}: {e}"
        print(f"{what}: pulse.Error {e}")
        return
    raise AssertionError(f"{what}: no pulse.Error")


def main():
    with tempfile.TemporaryDirectory(prefix="pulse-cuda-") as work:
        store = os.path.join(work, "store")
        host = {"w": torch.randn(8, 16), "b": torch.randn(16)}
        with pulse.Publisher(store) as pub, pulse.Server(store) as server:
            pub.publish(host)
            fake = {n: t.as_subclass(SaysCuda) for n, t in host.items()}
            expect_cuda_error("publish of CUDA tensors", lambda: pub.publish(fake), "'w'")
            assert pub.step == 1, "a refused publish made a step"
            targets = {"w": torch.full((8, 16), 3.0, dtype=torch.bfloat16).as_subclass(SaysCuda),
                       "b": torch.full((16,), 3.0, dtype=torch.bfloat16).as_subclass(SaysCuda)}
            with pulse.Subscriber(server.url, key=pub.public_key) as sub:
                expect_cuda_error("pull into CUDA targets", lambda: sub.pull(targets), "'w'")
                for n, t in targets.items():
                    assert bool((t.as_subclass(torch.Tensor) == 3.0).all()), f"target '{n}' was written"
                # The same subscriber then pulls into host tensors.
                cpu = {n: torch.zeros(t.shape, dtype=torch.bfloat16) for n, t in host.items()}
                assert sub.pull(cpu, timeout=60) == 1
                for n, t in host.items():
                    assert torch.equal(cpu[n], t.to(torch.bfloat16)), n
    print("ok")


if __name__ == "__main__":
    main()
