"""PULSELoCo from PyTorch against DiLoCo's dense all-reduce, over the same
torch.distributed (gloo) group, in one run: N processes fine-tune copies of
a byte-level model of a text file (a pretraining phase first, then an
RL-like rate), each method from the same start, and report per outer
round the bytes each trainer sent and the time of the outer step.

    python3 python/bench_loco.py --procs 4 --rounds 20 --inner 10

PULSELoCo: pulse.loco.DiLoCo (BF16 gate, FP32 error feedback, coded
payloads; a trainer sends its payload to the N-1 others). DiLoCo: the
FP32 pseudo-gradients averaged by dist.all_reduce (a ring all-reduce moves
2 (N-1)/N x 4P bytes per trainer) and the same Nesterov outer step in
torch. Bytes are counted from what each method hands the group.

--transport coordinator runs PULSELoCo over the project's coordinator
exchange instead (pulse.loco.Coordinator: every trainer's own HTTP server
on 127.0.0.1, the founding meeting through the job's TCPStore); its bytes
sent are the HTTP bodies each trainer's server answered in the round
(payloads, manifests, polls), received the bodies it fetched. The dense
baseline stays on the gloo group. --transport collaboration runs it over
pulse.loco.Collaboration (rounds of procs x inner x 64 samples, the local
steps granted by the round's writer: a faster trainer runs more of them);
its outer step time is the round's less its local steps'.
"""

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CONTEXT = 8


def model_factory(torch, hidden):
    class ByteModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(256, 32)
            self.hidden = torch.nn.Linear(32 * CONTEXT, hidden)
            self.out = torch.nn.Linear(hidden, 256)

        def forward(self, x):
            h = self.embed(x).reshape(x.shape[0], -1)
            return self.out(torch.tanh(self.hidden(h)))

    return ByteModel


def worker(rank, port, args):
    import torch
    import torch.distributed as dist

    import pulse

    torch.set_num_threads(1)
    # One TCPStore: the gloo group's rendezvous and the coordinator's
    # founding meeting.
    store = dist.TCPStore("127.0.0.1", port, args.procs, rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore("gloo", store), rank=rank,
                            world_size=args.procs, timeout=datetime.timedelta(seconds=60))
    with open(args.text, "rb") as f:
        data = torch.tensor(list(f.read()[:200000]), dtype=torch.long)
    n = data.numel() - CONTEXT - 1
    gen = torch.Generator().manual_seed(7 + rank)

    def batch():
        idx = torch.randint(0, n, (64,), generator=gen)
        return torch.stack([data[i:i + CONTEXT] for i in idx.tolist()]), data[idx + CONTEXT]

    loss_fn = torch.nn.CrossEntropyLoss()
    torch.manual_seed(args.seed)
    model = model_factory(torch, args.hidden)()
    # A short pretraining (the same on every rank: same seed, rank 0's data)
    # so that the fine-tuning below is in the post-training regime.
    pre = torch.optim.Adam(model.parameters(), lr=2e-3)
    g0 = torch.Generator().manual_seed(7)
    for _ in range(args.pretrain):
        idx = torch.randint(0, n, (64,), generator=g0)
        x, y = torch.stack([data[i:i + CONTEXT] for i in idx.tolist()]), data[idx + CONTEXT]
        loss_fn(model(x), y).backward()
        pre.step()
        pre.zero_grad()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    P = sum(p.numel() for p in model.parameters())
    results = {}
    for method in ("pulseloco", "diloco"):
        model.load_state_dict(start)
        inner = torch.optim.Adam(model.parameters(), lr=args.lr)
        params = list(model.parameters())
        if method == "pulseloco" and args.transport == "coordinator":
            coord = pulse.loco.Coordinator(rank, args.procs, dist.PrefixStore("loco", store),
                                           deadline=30, manifest_timeout=60)
            outer = pulse.loco.DiLoCo(params, transport=coord)
        elif method == "pulseloco" and args.transport == "collaboration":
            collab = pulse.loco.Collaboration(rank, args.procs, dist.PrefixStore("loco", store),
                                              target_batch=args.procs * args.inner * 64,
                                              round_timeout=60, claim_timeout=30)
            outer = pulse.loco.DiLoCo(params, transport=collab)
        elif method == "pulseloco":
            outer = pulse.loco.DiLoCo(params)
        else:
            theta_g = [p.detach().clone() for p in params]
            b = [torch.zeros_like(p) for p in params]
        rows = []

        def local_step(samples):
            x, y = batch()
            loss_fn(model(x), y).backward()
            inner.step()
            inner.zero_grad()

        for r in range(args.rounds):
            if method == "pulseloco" and args.transport == "collaboration":
                # The round runs the local steps: its outer time is the
                # call's less its steps'.
                dist.barrier()
                info = outer.step(samples=64, inner=local_step)
                assert info["contributors"] == args.procs, info
                ex = info["exchange"]
                rows.append((info["bytes_sent"], (ex["wall_ms"] - ex["busy_ms"]) / 1000))
                continue
            for _ in range(args.inner):
                x, y = batch()
                loss_fn(model(x), y).backward()
                inner.step()
                inner.zero_grad()
            dist.barrier()
            t0 = time.perf_counter()
            if method == "pulseloco":
                info = outer.step()
                sent = info["bytes_sent"]
                assert info["contributors"] == args.procs, info
            else:
                with torch.no_grad():
                    flat = torch.cat([(g - p.detach()).reshape(-1) for g, p in zip(theta_g, params)])
                    dist.all_reduce(flat)
                    flat /= args.procs
                    at = 0
                    for g, bb, p in zip(theta_g, b, params):
                        k = p.numel()
                        avg = flat[at:at + k].view_as(p)
                        at += k
                        bb.mul_(0.9).add_(avg)
                        g.sub_(0.7 * (avg + 0.9 * bb))
                        p.copy_(g)
                sent = int(2 * (args.procs - 1) / args.procs * 4 * P)
            rows.append((sent, time.perf_counter() - t0))
        with torch.no_grad():
            idx = torch.arange(4096) * (n // 4096)
            x = torch.stack([data[i:i + CONTEXT] for i in idx.tolist()])
            y = data[idx + CONTEXT]
            final = loss_fn(model(x), y).item()
        results[method] = {"bytes_per_round": statistics.mean(s for s, _ in rows),
                           "outer_step_ms_median": 1000 * statistics.median(t for _, t in rows),
                           "final_loss": final}
        if method == "pulseloco":
            if args.transport == "coordinator":
                coord.linger()
            dist.barrier()  # every server up until all are done
            outer.close()
    if rank == 0:
        print(json.dumps({"procs": args.procs, "transport": args.transport, "params": P,
                          "rounds": args.rounds, "inner": args.inner, "lr": args.lr, "pretrain": args.pretrain,
                          **{f"{m}_{k}": v for m, r in results.items() for k, v in r.items()},
                          "bytes_ratio_diloco_over_pulseloco":
                              results["diloco"]["bytes_per_round"]
                              / max(1.0, results["pulseloco"]["bytes_per_round"])}),
              flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--lr", type=float, default=5e-6, help="fine-tuning Adam rate")
    ap.add_argument("--pretrain", type=int, default=300, help="pretraining Adam steps")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--transport", choices=("torch", "coordinator", "collaboration"),
                    default="torch", help="PULSELoCo's exchange: the gloo group, "
                    "pulse.loco.Coordinator or pulse.loco.Collaboration")
    ap.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker >= 0:
        worker(args.worker, args.port, args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:]
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen(base + ["--worker", str(r), "--port", str(port)], env=env)
             for r in range(args.procs)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
