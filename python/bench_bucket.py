"""The bucket exchange's bench: N processes, each a rank of a sharded
trainer that shares no folder and no process group with the others
(pulse.Publisher(folder, rank=r, world=N, upload="s3://...")), publish S
steps through the bucket (pulse_pub_shard_step with a bucket:
docs/protocols/sync.md, "Exchange through the bucket"), against s3rver on
127.0.0.1 behind a proxy that delays every piece of data by half the round
trip each way, and a new connection's first request by a whole round trip
(TCP's handshake; no TLS here): the latency a job across sites sees, which
s3rver on the same machine does not have.

    PYTHONPATH=python python3 python/bench_bucket.py [--ranks 4] [--steps 8]
        [--rtt-ms 20] [--params 262144] [--density 0.01]

Each rank holds 1/N of one FP32 tensor; each step moves `density` of the
elements. Per rank: the seconds of each publish() call (step 1 makes the
first anchor). The summary: rank 0's median over the steps after the first,
and the slowest rank's. Prints one JSON object; exit 0 when the bench ran.
Set PULSE_LIBRARY to time another build of the library on the same setup.
s3rver writes objects in place: a GET that meets a rewrite of head.json can
hang until s3rver closes it (about 6 s), a step's outlier that S3 does not
have, and one the medians are not moved by."""

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4, help="processes (default 4)")
    p.add_argument("--steps", type=int, default=8, help="steps, the first an anchor (default 8)")
    p.add_argument("--rtt-ms", type=float, default=20.0,
                   help="round trip the proxy adds (default 20; 0: no proxy)")
    p.add_argument("--params", type=int, default=262144,
                   help="elements of the tensor (default 262144; a multiple of --ranks)")
    p.add_argument("--density", type=float, default=0.01,
                   help="share of the elements each step moves (default 0.01)")
    args = p.parse_args(argv)
    if args.ranks < 1 or args.steps < 2 or args.rtt_ms < 0 or args.params < args.ranks \
            or args.params % args.ranks or not 0 < args.density <= 1:
        p.error("--ranks >= 1, --steps >= 2, --rtt-ms >= 0, --params a multiple of --ranks, "
                "0 < --density <= 1")
    return args


# ------------------------------------------------------------------ proxy

def start_proxy(upstream, rtt_s):
    """A TCP proxy on 127.0.0.1 (its port returned) to 127.0.0.1:upstream,
    in a thread of this process: each piece of data forwarded rtt_s / 2
    late, a new connection's first request rtt_s late."""
    ready = threading.Event()
    port = []

    async def pipe(reader, writer):
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                await asyncio.sleep(rtt_s / 2)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def handle(client_r, client_w):
        await asyncio.sleep(rtt_s)
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))

    async def serve():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port.append(server.sockets[0].getsockname()[1])
        ready.set()
        await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(serve()), daemon=True,
                     name="bench-bucket-proxy").start()
    if not ready.wait(10):
        raise SystemExit("bench_bucket: the proxy did not start")
    return port[0]


# ------------------------------------------------------------------ ranks

def worker(rank, world, endpoint, prefix, work, steps, params, density):
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="S3RVER",
                      AWS_SECRET_ACCESS_KEY="S3RVER", AWS_REGION="us-east-1")
    import torch

    import pulse

    gen = torch.Generator().manual_seed(5)  # every rank the same weights
    w = (torch.rand(params, generator=gen) - 0.5) * 0.08
    n = params // world
    pub = pulse.Publisher(os.path.join(work, f"rank-{rank}"), rank=rank, world=world,
                          upload=f"s3://bkt/{prefix}", anchor_every=1 << 30, timeout=300)
    times = []
    for step in range(1, steps + 1):
        if step > 1:
            moved = torch.rand(params, generator=gen) < density
            w += moved * (torch.rand(params, generator=gen) - 0.5) * 1e-2
        mine = {"w": pulse.Block(w[rank * n:(rank + 1) * n].clone(), (params,), rank * n)}
        t0 = time.monotonic()
        got = pub.publish(mine)
        times.append(time.monotonic() - t0)
        if got != step:
            raise SystemExit(f"rank {rank}: publish returned {got}, not {step}")
    print(json.dumps({"rank": rank, "times_s": times}), flush=True)


def main(argv=None):
    args = parse_args(argv)
    sys.path.insert(0, HERE)
    from bench_shard import start_s3rver

    work = tempfile.mkdtemp(prefix="bench-bucket-")
    s3 = None
    try:
        s3 = start_s3rver(work)
        endpoint = os.environ["AWS_ENDPOINT_URL"]
        if args.rtt_ms > 0:
            endpoint = f"http://127.0.0.1:{start_proxy(int(endpoint.rsplit(':', 1)[1]), args.rtt_ms / 1e3)}"
        env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker", str(r),
                                   str(args.ranks), endpoint, "runs/bench", work, str(args.steps),
                                   str(args.params), str(args.density)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for r in range(args.ranks)]
        ranks = []
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=600 + 60 * args.steps)
            if p.returncode != 0:
                raise SystemExit(f"bench_bucket: rank {r} exited {p.returncode}: {err[-2000:]}")
            ranks.append(json.loads(out.strip().splitlines()[-1]))
        later = [r["times_s"][1:] for r in ranks]
        summary = {
            "ranks": args.ranks, "steps": args.steps, "rtt_ms": args.rtt_ms,
            "params": args.params, "density": args.density,
            "library": os.environ.get("PULSE_LIBRARY", "(the package's)"),
            "rank0_median_s": statistics.median(later[0]),
            "slowest_rank_median_s": max(statistics.median(t) for t in later),
            "per_rank": ranks,
        }
        print(json.dumps(summary, indent=1))
    finally:
        if s3 is not None:
            s3.kill()
            s3.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        a = sys.argv[2:]
        worker(int(a[0]), int(a[1]), a[2], a[3], a[4], int(a[5]), int(a[6]), float(a[7]))
    else:
        main()
