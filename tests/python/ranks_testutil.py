"""What the multi-process Python tests share: starting WORLD processes of a
test script as the ranks of one torch.distributed job on 127.0.0.1."""

import os
import socket
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def spawn_ranks(script, world, args, timeout, what):
    """Runs `script worker RANK PORT ARGS...` in `world` processes (PORT: a
    free one, for the job's rendezvous) and returns [(returncode, output)]
    in rank order. One that runs past `timeout` seconds kills them all:
    AssertionError "WHAT hung past T s"."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    procs = [subprocess.Popen([sys.executable, script, "worker", str(r), str(port), *args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(world)]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"{what} hung past {timeout} s")
        outs.append((p.returncode, out))
    return outs
