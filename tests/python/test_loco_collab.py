"""pulse.loco.DiLoCo over the collaboration (transport=
pulse.loco.Collaboration, loco/pulse_loco_collab.h): 3 processes on
127.0.0.1, each peer with its own server (port 0), meeting once through a
torch.distributed TCPStore, on the byte model of test_loco.py. The round
runs the local steps (outer.step(samples=B, inner=fn)) until the round's
samples over all peers reach the target.

- rounds: signed (every peer's key pinned by the others), 6 rounds of a
  768-sample target in steps of 64; after every
  round the peers' parameters and theta_g are bit for bit the same, the
  round's samples are in [target, target + the largest step), each peer's
  steps times 64 are its own samples, each peer received the others'
  payloads and at most a manifest, the bytes all peers' servers report
  sent over the run are what all peers received (less at most a payload
  a server whose last answers completed after its call returned), and
  the held-out loss falls. Peer 2 leaves
  in round 3 (its flush goes out); the two left go on with 2 contributors.
- join: peers 0 and 1 found a signed, partitioned collaboration (members
  reduce disjoint ranges), peer 2, whose key nobody pinned, joins through
  peer 0's URL with peer 1's admission (Collaboration.admit) after 2
  rounds; all three end at round 8 with the same bits, peer 2 among the
  contributors, nothing refused, the founders counting one admission.
- dead: a peer that dies between rounds is left out of the next round
  after the round timeout (2 s), and the others go on.
- in this process: a lone peer runs target / step local steps a round;
  an exception in the inner step comes back out of step(); options refused
  before anything is sent.
Exit 77: no torch."""

import os
import socket
import sys
import tempfile
import time
import urllib.request

try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("skipped: python3-torch is not installed")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
import pulse  # noqa: E402
from ranks_testutil import spawn_ranks  # noqa: E402
from test_loco import ByteModel, digest, text_batches  # noqa: E402
from test_loco_coord import Meeting, WORLD, make_store  # noqa: E402

ROUNDS = 6
STEP = 64
TARGET = WORLD * 4 * STEP
LEAVE_AT = 3
JOIN_ROUNDS = 8


def trainer(rank):
    torch.manual_seed(40 + rank)  # different starts: peer 0's state wins
    model = ByteModel()
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data, (hx, hy) = text_batches(rank)  # batches of 64 = STEP
    loss_fn = torch.nn.CrossEntropyLoss()

    def step_fn(samples):
        x, y = data()
        loss_fn(model(x[:samples]), y[:samples]).backward()
        inner.step()
        inner.zero_grad()

    def held_out():
        with torch.no_grad():
            return loss_fn(model(hx), hy).item()

    return model, step_fn, held_out


def run_rounds(rank, port, keydir):
    model, step_fn, held_out = trainer(rank)
    store = make_store(rank, port)
    meet = Meeting(store, rank)
    keys = {r: open(os.path.join(keydir, f"{r}.pub")).read() for r in range(WORLD)}
    collab = pulse.loco.Collaboration(rank, WORLD, store, target_batch=TARGET,
                                      round_timeout=30, claim_timeout=10,
                                      key=os.path.join(keydir, f"{rank}.pem"), member_keys=keys)
    outer = pulse.loco.DiLoCo(model.parameters(), transport=collab)
    first = held_out()
    alive = list(range(WORLD))
    sent = received = largest = 0
    for r in range(ROUNDS):
        leaving = rank == 2 and r == LEAVE_AT
        info = outer.step(samples=STEP, inner=step_fn, leaving=leaving)
        ex = info["exchange"]
        assert info["round"] == r and info["contributors"] == len(alive), info
        assert TARGET <= info["samples"] < TARGET + ex["max_step"] + 1, info
        assert ex["own_samples"] == info["steps"] * STEP and info["steps"] > 0, info
        assert ex["auth_bytes"] > 0, info  # signed and checked
        # The entries of its payload, counted in C (pulse_loco_collab_figures.sent).
        assert isinstance(info["entries"], int) and 0 <= info["entries"] <= outer.param_count
        assert info["entries"] == ex["sent"] and info["payload_bytes"] > 0, info
        assert info["density"] == info["entries"] / outer.param_count, info
        seen = meet.share(f"round{r}", (digest(list(model.parameters())), outer.global_digest(),
                                        info["bytes_sent"], info["bytes_received"],
                                        info["payload_bytes"]), alive)
        # All to all: every peer fetches the others' payloads, and the
        # round's manifest unless it wrote it.
        others = sum(v[4] for t, v in seen.items() if t != rank)
        assert 0 <= info["bytes_received"] - others < 2048, (info, seen)
        largest = max(largest, *(v[4] for v in seen.values()))
        assert len({s[:2] for s in seen.values()}) == 1, f"round {r}: replicas differ {seen}"
        sent += sum(s[2] for s in seen.values())
        received += sum(s[3] for s in seen.values())
        if r == LEAVE_AT:
            alive = [0, 1]
            if leaving:
                assert info["left"], info
                break
    last = held_out()
    if rank != 2:
        assert last < first * 0.95, f"held-out loss {first:.4f} -> {last:.4f}: not falling"
        assert sorted(collab.members()) == [0, 1], collab.members()
        # Every body one peer's server answered another fetched; a server
        # counts a body once its answer completed, which may be after that
        # peer's call returned (then in its next call, or never for the
        # last round): at most a payload per server short; more only by
        # what a poll answered (a few hundred bytes a round at most).
        assert received - WORLD * largest <= sent <= received + 1024 * ROUNDS, \
            (sent, received, largest)
    meet.share("done", True)
    outer.close()
    meet.leave()
    return f"loss {first:.4f} -> {last:.4f} steps {info['steps']} samples {info['samples']} " \
           f"payload {info['payload_bytes']} all peers sent {sent} received {received}"


def run_join(rank, port, keydir):
    """Peers 0 and 1 found a signed, partitioned collaboration (each
    pinning the other's key); peer 2, whose key nobody pinned, joins it
    through peer 0's URL with peer 1's admission once they ran 2 rounds
    (it pins the founders' keys); all three end at round JOIN_ROUNDS with
    the same bits, the joiner having contributed, and nobody refused
    anything."""
    model, step_fn, _ = trainer(rank)
    store = make_store(rank, port)
    meet = Meeting(store, rank)
    keys = {r: open(os.path.join(keydir, f"{r}.pub")).read() for r in range(WORLD)}
    opts = dict(target_batch=TARGET, partitioned=True, round_timeout=30, claim_timeout=10,
                key=os.path.join(keydir, f"{rank}.pem"),
                member_keys={r: keys[r] for r in range(2)})
    if rank < 2:
        collab = pulse.loco.Collaboration(rank, 2, store, **opts)
    else:
        store.wait(["test/seed", "test/admission"])
        collab = pulse.loco.Collaboration(2, seed_url=store.get("test/seed").decode(),
                                          admission=store.get("test/admission"), **opts)
    outer = pulse.loco.DiLoCo(model.parameters(), transport=collab)
    if rank == 2:
        store.add("test/joined", 1 + outer.round)
    most = partitioned = 0
    while outer.round < JOIN_ROUNDS:
        if rank < 2 and store.add("test/joined", 0) == 0:
            time.sleep(0.2)  # slow enough for the joiner to be admitted
        info = outer.step(samples=STEP, inner=step_fn)
        most = max(most, info["contributors"])
        partitioned += info["exchange"]["partitioned"]
        if rank == 1 and info["round"] == 1:
            store.set("test/admission", collab.admit(keys[2], JOIN_ROUNDS))
        if rank == 0 and info["round"] == 1:
            store.set("test/seed", collab.url)
    seen = meet.share("end", (outer.round, digest(list(model.parameters())),
                              outer.global_digest()))
    assert len(set(seen.values())) == 1, f"replicas differ after the join: {seen}"
    assert most == WORLD, f"the joiner never contributed (at most {most} contributors)"
    assert partitioned > 0, "no round ran partitioned"
    metrics = urllib.request.urlopen(collab.url + "/metrics", timeout=10).read().decode()
    refusals = [line for line in metrics.splitlines()
                if line.startswith("pulse_loco_auth_refused_total") and not line.endswith(" 0")]
    assert not refusals, refusals
    admitted = [line for line in metrics.splitlines()
                if line.startswith("pulse_loco_auth_admitted_total ")]
    # The founders took the joiner's join on its admission.
    assert rank == 2 or admitted == ["pulse_loco_auth_admitted_total 1"], admitted
    meet.share("done", True)
    end = outer.round
    # Read while every rank is still here: rank 0 hosts the store and may be
    # gone once the meeting is left.
    joined = store.add("test/joined", 0) - 1
    outer.close()
    meet.leave()
    return f"joined at round {joined}, all at round {end}, {partitioned} rounds partitioned here"


def run_dead(rank, port):
    model, step_fn, _ = trainer(rank)
    store = make_store(rank, port)
    collab = pulse.loco.Collaboration(rank, WORLD, store, target_batch=TARGET, round_timeout=2,
                                      claim_timeout=2)
    outer = pulse.loco.DiLoCo(model.parameters(), transport=collab)
    info = outer.step(samples=STEP, inner=step_fn)
    assert info["contributors"] == WORLD, info
    store.set(f"test/round0/{rank}", "1")
    store.wait([f"test/round0/{r}" for r in range(WORLD)])
    if rank == 2:
        os._exit(3)  # dies between rounds
    began = time.monotonic()
    counts = []
    for _ in range(3):
        info = outer.step(samples=STEP, inner=step_fn)
        counts.append(info["contributors"])
    took = time.monotonic() - began
    assert counts[-1] == 2, counts
    store.set(f"test/bye/{rank}", "1")
    if rank == 0:
        store.wait(["test/bye/1"])
    outer.close()
    return f"contributors after the death {counts} in {took:.1f} s"


def check_alone():
    def refused(fn, what, status="PULSE_ERR_ARG"):
        try:
            fn()
        except pulse.Error as e:
            assert e.status == status, (what, e)
            return
        raise AssertionError(f"{what}: not refused")

    C = pulse.loco.Collaboration
    store = dist.HashStore()
    p = [torch.zeros(8)]
    refused(lambda: C(0, 1, store, target_batch=0), "a target of 0")
    refused(lambda: C(0, 1, store, target_batch=8, partition_check="some"), "an unknown check")
    refused(lambda: C(0, 1, store, target_batch=8, client_of="x"), "client_of not a URL")
    refused(lambda: C(0, 1, store, target_batch=8, client_of="http://127.0.0.1:1",
                      partitioned=True), "a partitioned client")
    refused(lambda: pulse.loco.DiLoCo(p, rule="drop", transport=C(0, 1, store, target_batch=8)),
            "the drop rule")
    refused(lambda: C(0, 1, store, target_batch=8, admission=b"x", seed_url="http://127.0.0.1:1"),
            "an admission of another size")
    refused(lambda: C(0, 1, store, target_batch=8, admission=bytes(136)),
            "an admission without a seed_url")
    refused(lambda: C(0, 1, store, target_batch=8).admit("00" * 32, 5), "admit before running")
    refused(lambda: C(0, 1, store, target_batch=8, port=70000), "a port past 65535")
    refused(lambda: C(0, 1, store, target_batch=8, port=-1), "a negative port")
    refused(lambda: C(0, 1, store, target_batch=8, client_of="http://127.0.0.1:1", port=1),
            "a port for a client-mode peer")
    # The port asked for is the one it listens on; a second peer there is
    # refused with a clear error.
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    free = probe.getsockname()[1]
    probe.close()
    first = pulse.loco.DiLoCo([torch.zeros(8)], transport=C(0, 1, dist.HashStore(),
                                                            target_batch=8, port=free))
    assert first._member.url == f"http://127.0.0.1:{free}", first._member.url
    refused(lambda: pulse.loco.DiLoCo([torch.zeros(8)], transport=C(
        0, 1, dist.HashStore(), target_batch=8, port=free)), "a port in use", "PULSE_ERR_IO")
    first.close()
    assert store.num_keys() == 0, store.num_keys()  # nothing was sent
    outer = pulse.loco.DiLoCo([torch.zeros(8)], transport=C(0, 1, dist.HashStore(),
                                                            target_batch=5 * STEP))
    refused(lambda: outer.step(samples=STEP), "a Collaboration's step without inner")
    calls = []

    def add_one(samples):
        calls.append(samples)
        with torch.no_grad():
            outer.params[0].add_(1.0)

    info = outer.step(samples=STEP, inner=add_one)
    assert calls == [STEP] * 5 and info["steps"] == 5 and info["samples"] == 5 * STEP, info
    # Every parameter moved by 5: all 8 entries pass the gate.
    assert info["entries"] == 8 and info["density"] == 1.0, info
    # Alone, the mean is its own pseudo-gradient: theta_g moved toward 5.
    assert 0 < outer.params[0][0].item() <= 5 * (1 + 0.9) * 0.7 + 1e-5, outer.params[0]

    def broken(samples):
        raise ValueError("the inner step broke")

    try:
        outer.step(samples=STEP, inner=broken)
        raise AssertionError("an inner step's exception was swallowed")
    except ValueError as e:
        assert "broke" in str(e)
    outer.close()
    group = pulse.loco.DiLoCo([torch.zeros(8)])
    refused(lambda: group.step(inner=add_one), "inner over a torch group")


def worker(rank, port, phase, keydir):
    torch.set_num_threads(1)
    if phase == "rounds":
        print(f"ok rounds rank {rank}: {run_rounds(rank, port, keydir)}", flush=True)
    elif phase == "join":
        print(f"ok join rank {rank}: {run_join(rank, port, keydir)}", flush=True)
    else:
        print(f"ok dead rank {rank}: {run_dead(rank, port)}", flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    failed = []
    try:
        check_alone()
        print("ok alone")
    except AssertionError as e:
        failed.append(f"alone: {e}")
    with tempfile.TemporaryDirectory() as keydir:
        for r in range(WORLD):
            with open(os.path.join(keydir, f"{r}.pub"), "w") as f:
                f.write(pulse.loco.new_key(os.path.join(keydir, f"{r}.pem")))
        for phase in ("rounds", "join", "dead"):
            outs = spawn_ranks(__file__, WORLD, [phase, keydir], 300, f"phase {phase}: a peer")
            for rank, (rc, out) in enumerate(outs):
                print(out.strip()[-1500:])
                want = 3 if phase == "dead" and rank == 2 else 0
                if rc != want or (want == 0 and f"ok {phase}" not in out):
                    failed.append(f"{phase}: rank {rank} exited {rc} (want {want})")
    for f in failed:
        print("FAIL:", f)
    print("4 passed, 0 failed" if not failed else f"{len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
