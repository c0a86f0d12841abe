"""pulse.loco.DiLoCo over the coordinator exchange (transport=
pulse.loco.Coordinator, loco/pulse_loco_coord.h): 3 processes on
127.0.0.1, each with its own node (port 0), meeting once through a
torch.distributed TCPStore, on the byte model of test_loco.py.

- rounds: signed (every trainer's key pinned by the others), 6 outer
  rounds; after every outer.step() the trainers' parameters and theta_g
  are bit for bit the same, the held-out loss falls, and the bytes each
  reports received are the payloads of the round that the HTTP exchange
  moved: the coordinator fetched exactly the others' payloads, the others
  the coordinator's and each other's plus one manifest (under 1 KiB,
  authenticated: plus the signatures the exchange counts in auth_bytes).
  Then trainer 2 leaves (its last round flushes), and the two left run on
  with every replica identical.
- join: a trainer whose key is not pinned joins a running group through a
  member's URL with that member's admission; every replica ends the same.
- udp: contributions as datagrams, 3 rounds, every payload counted.
- mismatch: a trainer with another parameter count, or another alpha,
  makes every founding trainer raise pulse.Error before any payload.
- dead: a member that dies is left out of the next round (the others go
  on); a coordinator that dies makes the others raise PULSE_ERR_IO within
  the manifest timeout, never hang.
- options refused in this process, before anything is sent.
Exit 77: no torch."""

import ast
import datetime
import os
import socket
import sys
import tempfile
import time

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
from test_loco import INNER, ByteModel, digest, text_batches  # noqa: E402

WORLD = 3
ROUNDS = 6
MANIFEST_TIMEOUT = 4.0
JOIN_ROUNDS = 8


class Meeting:
    """The test's own bookkeeping between the trainers, over the store the
    founding meeting used (keys under "test/"): what each trainer saw."""

    def __init__(self, store, rank):
        self.store, self.rank = store, rank

    def share(self, name, value, ranks=range(WORLD)):
        self.store.set(f"test/{name}/{self.rank}", repr(value))
        return {r: ast.literal_eval(self.store.get(f"test/{name}/{r}").decode()) for r in ranks}

    def leave(self):
        """Trainer 0 holds the store: it waits until the others are done
        with it."""
        self.store.set(f"test/bye/{self.rank}", "1")
        if self.rank == 0:
            self.store.wait([f"test/bye/{r}" for r in range(WORLD)])


def make_store(rank, port):
    return dist.TCPStore("127.0.0.1", port, WORLD, rank == 0,
                         timeout=datetime.timedelta(seconds=30))


def check_bytes(info, shared, rank):
    """The HTTP exchange's bodies: the coordinator fetches every other
    contributor's payload; a member fetches the manifest and the others'."""
    others = sum(b for r, b in shared.items() if r != rank)
    got = info["bytes_received"]
    if info["coordinator"] == rank:
        assert got == others, (info, shared)
    else:
        assert 0 < got - others < 1024, (info, shared)  # one manifest


def run_rounds(rank, port, keydir):
    torch.manual_seed(50 + rank)  # different starts: trainer 0's state wins
    model = ByteModel()
    store = make_store(rank, port)
    meet = Meeting(store, rank)
    keys = {r: open(os.path.join(keydir, f"{r}.pub")).read() for r in range(WORLD)}
    coord = pulse.loco.Coordinator(rank, WORLD, store, deadline=10, manifest_timeout=30,
                                   key=os.path.join(keydir, f"{rank}.pem"), member_keys=keys,
                                   auth="on")
    outer = pulse.loco.DiLoCo(model.parameters(), transport=coord)
    assert coord.public_key == keys[rank]
    assert sorted(coord.members()) == list(range(WORLD)), coord.members()
    start = meet.share("start", digest(list(model.parameters())))
    assert len(set(start.values())) == 1, f"trainers start apart: {start}"
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    next_batch, (hx, hy) = text_batches(rank)
    loss_fn = torch.nn.CrossEntropyLoss()
    with torch.no_grad():
        first = loss_fn(model(hx), hy).item()
    alive = list(range(WORLD))
    sent = 0
    paid = 0  # this trainer's payloads, each fetched by the others of its round
    early = 0  # of them, those of the rounds before the last two
    for r in range(ROUNDS):
        for _ in range(INNER):
            x, y = next_batch()
            loss_fn(model(x), y).backward()
            inner.step()
            inner.zero_grad()
        leaving = r == ROUNDS - 3 and rank == 2
        info = outer.step(leaving=leaving)
        assert info["round"] == r and info["contributors"] == len(alive), info
        assert info["exchange"]["auth"]["accepted"] > 0 and info["self_included"], info
        seen = meet.share(f"round{r}", (digest(list(model.parameters())), outer.global_digest(),
                                        info["payload_bytes"]), alive)
        assert len({s[:2] for s in seen.values()}) == 1, f"round {r}: replicas differ {seen}"
        check_bytes(info, {t: s[2] for t, s in seen.items()}, rank)
        assert isinstance(info["bytes_sent"], int) and info["entries"] == info["exchange"]["sent"]
        if r < ROUNDS - 3:  # answered by the end of its next step
            early += info["payload_bytes"] * (len(alive) - 1)
        paid += info["payload_bytes"] * (len(alive) - 1)
        sent += info["bytes_sent"]
        if r == ROUNDS - 3:
            alive = [0, 1]
            if leaving:
                break
    with torch.no_grad():
        last = loss_fn(model(hx), hy).item()
    if rank != 2:
        assert last < first * 0.95, f"held-out loss {first:.4f} -> {last:.4f}: not falling"
        assert sorted(coord.members()) == [0, 1], coord.members()
        coord.linger()
    meet.share("done", True)  # every node up until all are done
    # What this node's server sent: every payload once to each other
    # trainer of its round, plus manifests and the 404s of polls. The
    # steps (bytes_sent, counted in C) counted what had completed by their
    # end: everything of a round by the end of the next step.
    total = coord.served_bytes()
    assert early <= sent <= total and paid <= total <= paid + 4096 * ROUNDS, \
        (early, paid, sent, total)
    outer.close()
    meet.leave()
    return f"loss {first:.4f} -> {last:.4f} density {info['density']:.3f} payload " \
           f"{info['payload_bytes']} received {info['bytes_received']} sent {total} (payloads " \
           f"{paid})"


def run_join(rank, port, keydir):
    """Trainers 0 and 1 found the group; trainer 2, whose key is not
    pinned, joins through trainer 0's URL with trainer 0's admission once
    they ran 2 rounds; all three end at round JOIN_ROUNDS with the same
    bits."""
    torch.manual_seed(20 + rank)
    model = ByteModel()
    store = make_store(rank, port)
    meet = Meeting(store, rank)
    keys = {r: open(os.path.join(keydir, f"{r}.pub")).read() for r in range(WORLD)}
    key = os.path.join(keydir, f"{rank}.pem")
    if rank < 2:
        coord = pulse.loco.Coordinator(rank, 2, store, deadline=10, manifest_timeout=30, key=key,
                                       member_keys={r: keys[r] for r in range(2)})
    else:
        store.wait(["test/seed"])
        coord = pulse.loco.Coordinator(2, seed_url=store.get("test/seed").decode(),
                                       admission=store.get("test/admission"), key=key,
                                       member_keys={r: keys[r] for r in range(2)},
                                       deadline=10, manifest_timeout=30)
    outer = pulse.loco.DiLoCo(model.parameters(), transport=coord)
    joined_at = outer.round
    if rank == 2:
        store.add("test/joined", 1 + joined_at)
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    next_batch, _ = text_batches(rank)
    loss_fn = torch.nn.CrossEntropyLoss()
    most = 0
    while outer.round < JOIN_ROUNDS:
        for _ in range(INNER):
            x, y = next_batch()
            loss_fn(model(x), y).backward()
            inner.step()
            inner.zero_grad()
        if rank < 2 and store.add("test/joined", 0) == 0:
            time.sleep(0.2)  # slow enough for the joiner to be admitted
        info = outer.step()
        assert not info["rejoined"], info
        most = max(most, info["contributors"])
        if rank == 0 and info["round"] == 1:
            store.set("test/admission", coord.admit(keys[2], JOIN_ROUNDS))
            store.set("test/seed", coord.url)
    seen = meet.share("end", (outer.round, digest(list(model.parameters())),
                              outer.global_digest()))
    assert len(set(seen.values())) == 1, f"replicas differ after the join: {seen}"
    assert most == WORLD, f"the joiner never contributed (at most {most} contributors)"
    if rank < 2:
        coord.linger()
    meet.share("done", True)
    end = outer.round
    outer.close()
    meet.leave()
    return f"joined at round {store.add('test/joined', 0) - 1}, all at round {end}"


def run_udp(rank, port):
    torch.manual_seed(7)
    model = ByteModel()
    store = make_store(rank, port)
    meet = Meeting(store, rank)
    coord = pulse.loco.Coordinator(rank, WORLD, store, datagrams=True, deadline=10,
                                   manifest_timeout=30, max_datagram=1200, quiet=0.05)
    outer = pulse.loco.DiLoCo(model.parameters(), transport=coord)
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    next_batch, _ = text_batches(rank)
    loss_fn = torch.nn.CrossEntropyLoss()
    for r in range(3):
        for _ in range(INNER):
            x, y = next_batch()
            loss_fn(model(x), y).backward()
            inner.step()
            inner.zero_grad()
        info = outer.step()
        ex = info["exchange"]
        assert info["round"] == r and ex["datagrams_sent"] > 0, info
        assert ex["chunks"]["accepted"] > 0, info
        # Datagrams count where they leave: each at least an end marker's
        # 36 bytes; received, each chunk as taken.
        assert info["bytes_sent"] >= 36 * ex["datagrams_sent"], info
        assert info["bytes_received"] >= 36 * ex["datagrams_received"], info
    coord.linger()
    meet.share("done", True)
    outer.close()
    meet.leave()
    return f"datagrams sent {ex['datagrams_sent']} received {ex['datagrams_received']}"


def run_mismatch(rank, port, what):
    store = make_store(rank, port)
    size = 100 + (rank == 2 and what == "count")
    alpha = 0.5 if rank == 1 and what == "alpha" else 0.7
    coord = pulse.loco.Coordinator(rank, WORLD, store, deadline=5, manifest_timeout=5)
    try:
        pulse.loco.DiLoCo([torch.zeros(size)], alpha=alpha, transport=coord)
    except pulse.Error as e:
        assert e.status == "PULSE_ERR_ARG" and "disagree" in e.detail, e
        Meeting(store, rank).leave()
        return f"refused {what}: {e.detail[:100]}"
    raise AssertionError(f"a founding trainer with another {what} was not refused")


def run_dead(rank, port):
    torch.manual_seed(3)
    model = ByteModel()
    store = make_store(rank, port)
    coord = pulse.loco.Coordinator(rank, WORLD, store, deadline=1,
                                   manifest_timeout=MANIFEST_TIMEOUT)
    outer = pulse.loco.DiLoCo(model.parameters(), transport=coord)
    info = outer.step()
    assert info["contributors"] == WORLD, info
    store.set(f"test/round0/{rank}", "1")
    store.wait([f"test/round0/{r}" for r in range(WORLD)])
    if rank == 2:
        os._exit(3)  # a member dies: the others go on without it
    info = outer.step()
    assert info["contributors"] == 2, info
    if rank == 1:
        store.set("test/round1", "1")  # its last use of the store
    if rank == 0:
        store.wait(["test/round1"])
        os._exit(4)  # the coordinator (and the store) dies: no manifest
    began = time.monotonic()
    try:
        outer.step()
    except pulse.Error as e:
        waited = time.monotonic() - began
        assert e.status == "PULSE_ERR_IO", e
        assert waited < MANIFEST_TIMEOUT * 3, f"failed after {waited:.1f} s"
        return f"dead coordinator: {e.status} after {waited:.1f} s: {e.detail[:80]}"
    raise AssertionError("a round without its coordinator did not fail")


def check_refusals():
    def refused(fn, what, status="PULSE_ERR_ARG"):
        try:
            fn()
        except pulse.Error as e:
            assert e.status == status, (what, e)
            return
        raise AssertionError(f"{what}: not refused")

    C = pulse.loco.Coordinator
    store = dist.HashStore()
    refused(lambda: C(0, 2), "founding without a store")
    refused(lambda: C(2, 2, store), "a founding id past the count")
    refused(lambda: C(0, 2, store, seed_url="http://127.0.0.1:1"), "founding and joining")
    refused(lambda: C(0, seed_url="ftp://x"), "a seed that is not http")
    refused(lambda: C(0, 2, store, auth="on"), "auth on without a key")
    refused(lambda: C(0, 2, store, auth="maybe"), "an unknown auth mode")
    refused(lambda: C(0, 2, store, deadline=0), "a deadline of 0")
    refused(lambda: C(0, 2, store, max_misses=0), "max_misses 0")
    refused(lambda: C(0, 2, store, member_keys={1: "zz" * 32}), "a key that is not hex")
    refused(lambda: C(0, 2, store, member_keys={1: "ab"}), "a short key")
    refused(lambda: C(0, 2, store, key="/nonexistent/key.pem"), "a missing key file",
            "PULSE_ERR_NOT_FOUND")
    refused(lambda: C(0, 2, store, quiet=0.1), "a datagram option over HTTP")
    refused(lambda: C(0, 2, store, udp_port=5000), "a datagram port over HTTP")
    refused(lambda: C(0, seed_url="http://127.0.0.1:1", admission=b"x"),
            "an admission of another size")
    refused(lambda: C(0, 2, store, admission=bytes(136)), "an admission without a seed_url")
    refused(lambda: C(0, 2, store, port=65536), "a port past 65535")
    refused(lambda: C(0, 2, store, port="80"), "a port that is not an integer")
    refused(lambda: C(0, 2, store, datagrams=True, drift_budget=-1), "a negative drift budget")
    p = [torch.zeros(8)]
    refused(lambda: pulse.loco.DiLoCo(p, rule="keep", transport=C(0, 1, store, datagrams=True)),
            "datagrams with the keep rule")
    # What only the library knows: a datagram below a chunk, a range that
    # is not whole cells; refused at create, before the meeting.
    refused(lambda: pulse.loco.DiLoCo(p, transport=C(0, 1, store, datagrams=True,
                                                     max_datagram=64)), "a 64-byte datagram")
    refused(lambda: pulse.loco.DiLoCo(p, transport=C(0, 1, store, datagrams=True,
                                                     resync_range=100)), "a range of 100")
    refused(lambda: pulse.loco.DiLoCo(p, transport=C(0, 1, store), group=object()),
            "a group beside a Coordinator")
    refused(lambda: pulse.loco.DiLoCo(p, transport="collab"), "an unknown transport")
    refused(lambda: pulse.loco.DiLoCo(p).step(leaving=True), "leaving a torch group",
            "PULSE_ERR_UNSUPPORTED")
    refused(lambda: pulse.loco.DiLoCo(p).step(samples=0), "0 samples")
    closed = pulse.loco.DiLoCo(p)
    closed.close()
    refused(lambda: closed.round, "a closed optimizer's round")
    refused(lambda: closed.step(), "a closed optimizer's step")
    # Nothing was sent: a store no founder wrote to holds no key of ours.
    assert store.num_keys() == 0, store.num_keys()
    # A single founding trainer runs rounds alone: its own mean.
    outer = pulse.loco.DiLoCo([torch.zeros(8)], transport=C(0, 1, dist.HashStore()))
    with torch.no_grad():
        outer.params[0].add_(1.0)
    info = outer.step()
    assert info["contributors"] == 1 and info["entries"] == 8, info
    assert isinstance(info["bytes_sent"], int), info
    outer.close()
    # The ports asked for are the ones it listens on; a second node on the
    # same port is refused with a clear error.
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    free = probe.getsockname()[1]
    probe.close()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    free_udp = udp.getsockname()[1]
    udp.close()
    first = pulse.loco.DiLoCo([torch.zeros(8)], transport=C(0, 1, dist.HashStore(), port=free,
                                                            datagrams=True, udp_port=free_udp))
    assert first._member.url == f"http://127.0.0.1:{free}", first._member.url
    for what, kw in (("an HTTP port in use", dict(port=free)),
                     ("a datagram port in use", dict(datagrams=True, udp_port=free_udp))):
        refused(lambda: pulse.loco.DiLoCo([torch.zeros(8)], transport=C(0, 1, dist.HashStore(),
                                                                       **kw)),
                what, "PULSE_ERR_IO")
    first.close()


def worker(rank, port, phase, arg):
    torch.set_num_threads(1)
    if phase == "rounds":
        print(f"ok rounds rank {rank}: {run_rounds(rank, port, arg)}", flush=True)
    elif phase == "join":
        print(f"ok join rank {rank}: {run_join(rank, port, arg)}", flush=True)
    elif phase == "udp":
        print(f"ok udp rank {rank}: {run_udp(rank, port)}", flush=True)
    elif phase == "mismatch":
        print(f"ok mismatch rank {rank}: {run_mismatch(rank, port, arg)}", flush=True)
    else:
        print(f"ok dead rank {rank}: {run_dead(rank, port)}", flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    failed = []
    try:
        check_refusals()
        print("ok refusals")
    except AssertionError as e:
        failed.append(f"refusals: {e}")
    with tempfile.TemporaryDirectory() as keydir:
        for r in range(WORLD):
            pub = pulse.loco.new_key(os.path.join(keydir, f"{r}.pem"))
            with open(os.path.join(keydir, f"{r}.pub"), "w") as f:
                f.write(pub)
        runs = [("rounds", keydir), ("join", keydir), ("udp", "-"), ("mismatch", "count"),
                ("mismatch", "alpha"), ("dead", "-")]
        for phase, arg in runs:
            outs = spawn_ranks(__file__, WORLD, [phase, arg], 300, f"phase {phase}: a trainer")
            for rank, (rc, out) in enumerate(outs):
                print(out.strip()[-1500:])
                want = {2: 3, 0: 4}.get(rank, 0) if phase == "dead" else 0
                if rc != want or (want == 0 and f"ok {phase}" not in out):
                    failed.append(f"{phase} {arg}: rank {rank} exited {rc} (want {want})")
    for f in failed:
        print("FAIL:", f)
    print(f"{1 + len(runs)} passed, {len(failed)} failed" if not failed
          else f"{len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
