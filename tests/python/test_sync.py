"""pulse from PyTorch, end to end on the CPU: a small Llama-shaped model
trained by AdamW publishes every step (pulse.Publisher on its FP32 state
dict) through pulse.Server; an unfused BF16 worker pulls each step into its
own tensors (pulse.Subscriber.pull), which then equal the trainer's weights
cast to BF16 bit for bit, and its logits equal the trainer's BF16 model's
exactly. Then every bad input of the issue raises pulse.Error naming the
tensor or object and leaves every target exactly as it was; and follow()
yields the steps a publisher makes meanwhile. Exit 77: no torch."""

import copy
import http.server
import os
import shutil
import sys
import tempfile
import threading
import urllib.request

try:
    import torch
except ImportError:
    print("skipped: python3-torch is not installed")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "examples"))
import llama  # noqa: E402
import pulse  # noqa: E402

torch.manual_seed(0)
STEPS = 5


def bits(t):
    return t.detach().contiguous().view(torch.int16)


def bf16_worker(config, seed):
    torch.manual_seed(seed)  # other weights than the trainer's
    return llama.Llama(config).to(torch.bfloat16)


def expect_error(what, fn, *names):
    try:
        fn()
    except pulse.Error as exc:
        text = str(exc)
        for name in names:
            assert name in text, f"{what}: the error does not name '{name}': {text}"
        print(f"  {what}: pulse.Error {text[:110]}")
        return exc
    raise AssertionError(f"{what}: no pulse.Error")


def snapshot(targets):
    return {name: t.clone() for name, t in targets.items()}


def unchanged(what, targets, before):
    for name, t in targets.items():
        assert torch.equal(bits(t), bits(before[name])), f"{what}: target '{name}' was written"


class Cutter(http.server.BaseHTTPRequestHandler):
    """A server that goes away mid-pull: heads come from the real server,
    objects are cut off halfway through their body."""
    upstream = None
    store = None

    def do_GET(self):
        if self.path.startswith("/v1/objects/"):
            path = os.path.join(self.store, "objects", os.path.basename(self.path))
            data = open(path, "rb").read()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if not self.path.startswith("/v1/head"):
            self.send_error(404)
            return
        with urllib.request.urlopen(self.upstream + self.path) as r:
            body, headers = r.read(), r.getheaders()
        self.send_response(200)
        for k, v in headers:
            if k.lower() not in ("content-length", "connection", "transfer-encoding", "date", "server"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    work = tempfile.mkdtemp(prefix="pulse-pytest-")
    try:
        run(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work):
    config = llama.Config()
    trainer = llama.Llama(config)
    store = os.path.join(work, "store")
    pub = pulse.Publisher(store)
    assert len(pub.public_key) == 64
    server = pulse.Server(store)
    worker = bf16_worker(config, seed=1)
    targets = dict(worker.state_dict())
    sub = pulse.Subscriber(server.url, key=pub.public_key, retries=1)
    tokens = torch.randint(0, config.vocab, (2, 12))

    # Step 0: the initial weights (an anchor). named_parameters() works too.
    assert pub.publish(trainer.named_parameters()) == 1
    for step, loss in llama.train_steps(trainer, STEPS):
        published = pub.publish(trainer.state_dict())
        assert published == step + 1, (published, step)
        held = sub.pull(targets, timeout=60)
        assert held == published, f"pulled step {held}, published {published}"
        want = trainer.state_dict()
        for name, t in targets.items():
            assert torch.equal(bits(t), bits(want[name].to(torch.bfloat16))), \
                f"step {published}: '{name}' differs from the trainer's BF16 weights"
        with torch.no_grad():
            reference = copy.deepcopy(trainer).to(torch.bfloat16)(tokens)
            logits = worker(tokens)
        assert torch.equal(logits, reference), f"step {published}: logits differ"
        print(f"step {published}: loss {loss:.4f}, {len(targets)} tensors and the logits "
              f"equal the trainer's BF16 model's")
    head = pub.step

    print("bad input leaves every target as it was:")
    before = snapshot(targets)
    k_name = "model.layers.1.self_attn.k_proj.weight"

    def with_extra(name, tensor):
        bad = dict(targets)
        bad[name] = tensor
        return bad

    # A publish that fails publishes nothing (the next pull finds no new step).
    expect_error("publish with a missing tensor",
                 lambda: pub.publish({n: t for n, t in trainer.state_dict().items() if n != k_name}),
                 k_name)
    expect_error("publish with an unknown tensor",
                 lambda: pub.publish(dict(trainer.state_dict(), extra=torch.zeros(3))), "extra")
    expect_error("publish of an FP16 tensor",
                 lambda: pub.publish(dict(trainer.state_dict(), **{k_name: torch.zeros(32, 64, dtype=torch.float16)})), k_name)
    assert pub.step == head
    extra = torch.zeros(4, dtype=torch.bfloat16)
    expect_error("unknown target name", lambda: sub.pull(with_extra("model.nope.weight", extra)),
                 "model.nope.weight")
    unchanged("unknown target name", targets, before)
    wrong_shape = torch.zeros(8, 64, dtype=torch.bfloat16)
    expect_error("target of the wrong shape", lambda: sub.pull(with_extra(k_name, wrong_shape)), k_name)
    unchanged("target of the wrong shape", targets, before)
    for dtype in (torch.float16, torch.float32):
        e = expect_error(f"{dtype} target", lambda: sub.pull(
            with_extra(k_name, targets[k_name].to(dtype))), k_name)
        assert e.status == "PULSE_ERR_DTYPE", e.status
    unchanged("dtype", targets, before)
    square = "model.layers.0.self_attn.q_proj.weight"
    expect_error("non-contiguous target", lambda: sub.pull(with_extra(square, targets[square].t())), square)
    unchanged("non-contiguous target", targets, before)

    # A new step for the remaining cases: they must not bring the targets to it.
    for step, _ in llama.train_steps(trainer, 1, seed=7):
        pub.publish(trainer.state_dict())
    new_head = pub.step
    other = pulse.Publisher(os.path.join(work, "other")).public_key
    wrong = pulse.Subscriber(server.url, key=other, retries=0)
    expect_error("wrong key", lambda: wrong.pull(targets), "pinned key")
    unchanged("wrong key", targets, before)
    wrong.close()
    expect_error("no key (and no trust on first use)",
                 lambda: pulse.Subscriber(server.url).pull(targets), "key=", "trust_first_use")
    tofu = pulse.Subscriber(server.url, trust_first_use=True, retries=0)
    assert tofu.pull({n: t.clone() for n, t in targets.items()}, timeout=60) == new_head
    tofu.close()

    # A corrupted copy of the store: every object damaged.
    bad_store = os.path.join(work, "corrupt")
    shutil.copytree(store, bad_store)
    objects = os.path.join(bad_store, "objects")
    for name in os.listdir(objects):
        path = os.path.join(objects, name)
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0x55
        open(path, "wb").write(bytes(data))
    with pulse.Server(bad_store) as bad_server:
        corrupt = pulse.Subscriber(bad_server.url, key=pub.public_key, retries=0)
        expect_error("corrupted objects", lambda: corrupt.pull(targets), "objects/")
        unchanged("corrupted objects", targets, before)
        corrupt.close()

    # A server that goes away mid-pull (objects cut off halfway).
    Cutter.upstream, Cutter.store = server.url, store
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Cutter)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    cut = pulse.Subscriber(f"http://127.0.0.1:{httpd.server_address[1]}", key=pub.public_key,
                           retries=1)
    expect_error("server gone mid-pull", lambda: cut.pull(targets, timeout=60), "objects/")
    unchanged("server gone mid-pull", targets, before)
    cut.close()
    httpd.shutdown()
    # A server that is gone altogether.
    gone = pulse.Server(store)
    url = gone.url
    gone.close()
    expect_error("server gone", lambda: pulse.Subscriber(url, key=pub.public_key, retries=0).pull(targets))
    unchanged("server gone", targets, before)

    # The good server still brings the same targets to the new head.
    assert sub.pull(targets) == new_head
    want = trainer.state_dict()
    for name, t in targets.items():
        assert torch.equal(bits(t), bits(want[name].to(torch.bfloat16))), name
    print(f"after the bad inputs: pulled step {new_head}, equal")

    # follow(): yields each step a publisher thread makes, targets equal at each.
    states = {}
    done = threading.Event()

    def trainer_thread():
        for _ in llama.train_steps(trainer, 3, seed=9):
            sd = trainer.state_dict()
            s = pub.publish(sd)
            states[s] = {n: bits(t.to(torch.bfloat16)).clone() for n, t in sd.items()}
        done.set()

    threading.Thread(target=trainer_thread).start()
    seen = []
    for step in sub.follow():
        if step == new_head:
            continue
        want = states.get(step)
        if want is None:  # published but not yet recorded: wait for the thread
            done.wait(60)
            want = states[step]
        for name, t in targets.items():
            assert torch.equal(bits(t), want[name]), f"follow step {step}: '{name}' differs"
        seen.append(step)
        if step == new_head + 3:
            break
    assert seen and seen[-1] == new_head + 3, seen
    print(f"follow yielded steps {seen}, each equal to the trainer's")
    sub.close()
    server.close()
    pub.close()
    format_3(work, config)
    print("ok")


def format_3(work, config):
    """A publisher of format version 3 writes version 3 patches, which a
    subscriber applies bit for bit."""
    trainer = llama.Llama(config)
    store = os.path.join(work, "store3")
    pub = pulse.Publisher(store, format_version=3)
    server = pulse.Server(store)
    targets = dict(bf16_worker(config, seed=2).state_dict())
    sub = pulse.Subscriber(server.url, key=pub.public_key, retries=1)
    pub.publish(trainer.state_dict())
    for step, _ in llama.train_steps(trainer, 2):
        published = pub.publish(trainer.state_dict())
        assert sub.pull(targets, timeout=60) == published
        want = trainer.state_dict()
        for name, t in targets.items():
            assert torch.equal(bits(t), bits(want[name].to(torch.bfloat16))), \
                f"format 3, step {published}: '{name}' differs"
    objects = os.path.join(store, "objects")
    versions = set()
    for name in os.listdir(objects):
        if name.endswith(".pulse"):
            with open(os.path.join(objects, name), "rb") as f:
                head = f.read(10)
            versions.add(int.from_bytes(head[8:10], "little"))
    assert versions == {3}, versions
    expect_error("format_version 4", lambda: pulse.Publisher(os.path.join(work, "store4"),
                                                             format_version=4).publish(
        trainer.state_dict()), "PULSE_ERR_ARG")
    sub.close()
    server.close()
    pub.close()
    print("format 3: patches of version 3, pulled bit for bit")


if __name__ == "__main__":
    main()
