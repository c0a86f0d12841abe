"""pip installs the package from a clean clone, and it works outside the
checkout: a clone of this repository's HEAD (its commit: what a user
gets; changes not committed are not in it), a virtual environment
(--system-site-packages, for Debian's torch), `pip install
--no-build-isolation --no-index CLONE/python` (no package index needed: it
builds libpulse with CMake and puts it in the package); then, from /, with
no PYTHONPATH or PULSE_LIBRARY, `import pulse` finds its own library and
version, and the README's trainer and worker examples run from the
environment (tests/python/test_example.py, run by its python). Exit 77: no
venv, pip or torch."""

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


def run(args, **kw):
    print("+", " ".join(args), flush=True)
    return subprocess.run(args, check=True, **kw)


def main():
    try:
        import torch  # noqa: F401
    except ImportError:
        skip("python3-torch is not installed")
    if subprocess.run([sys.executable, "-c", "import venv, ensurepip"],
                      capture_output=True).returncode != 0:
        skip("python3-venv is not installed")
    if shutil.which("git") is None:
        skip("git is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PULSE_LIBRARY")}
    # CUDA kernels take minutes to compile and are checked elsewhere.
    env["PULSE_CMAKE_ARGS"] = "-DPULSE_CUDA=OFF"
    with tempfile.TemporaryDirectory(prefix="pulse-pip-") as work:
        clone = os.path.join(work, "clone")
        run(["git", "clone", "--quiet", "--no-hardlinks", ROOT, clone])
        venv = os.path.join(work, "venv")
        run([sys.executable, "-m", "venv", "--system-site-packages", venv])
        python = os.path.join(venv, "bin", "python")
        run([python, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-index",
             os.path.join(clone, "python")], env=env)
        # Outside the checkout, no help from the environment.
        shutil.rmtree(clone)
        probe = run([python, "-c", "import pulse, pulse._lib as l; print(pulse.__version__); "
                     "print(l.lib.path)"], cwd="/", env=env, capture_output=True, text=True)
        version, path = probe.stdout.split()
        with open(os.path.join(ROOT, "python", "pulse", "_version.py")) as f:
            assert f'__version__ = "{version}"' in f.read(), version
        assert os.path.realpath(path).startswith(os.path.realpath(venv)), \
            f"pulse loaded {path}, not the library pip installed in {venv}"
        print(f"pulse {version} from {path}")
        run([python, os.path.join(HERE, "test_example.py")], cwd="/", env=env)
    print("ok")


if __name__ == "__main__":
    main()
