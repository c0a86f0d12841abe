"""Builds the package with the libpulse it loads (pyproject.toml has the
metadata; this file only finds or builds the library).

Where the library comes from (PULSE_LIBPULSE chooses; default: build in a
checkout, else pkg-config):
  build       this folder is python/ of a pulse checkout: CMake builds the
              libpulse target (PULSE_CMAKE_ARGS adds configure arguments,
              e.g. "-DPULSE_CUDA=OFF"), and the library is copied into the
              package, so that it works outside the checkout.
  pkg-config  an installed libpulse (cmake --install) of this package's
              version, found through pkg-config (PKG_CONFIG_PATH for a
              prefix of your own): the package records its path.
Either way the package writes pulse/_installed.py, which the loader
(pulse/_lib.py) reads, and at import refuses a library of another version.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(HERE)


def package_version():
    with open(os.path.join(HERE, "pulse", "_version.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def say(text):
    print(f"pulse setup: {text}", file=sys.stderr, flush=True)


def is_checkout():
    return os.path.exists(os.path.join(CHECKOUT, "CMakeLists.txt")) and \
        os.path.isdir(os.path.join(CHECKOUT, "codec"))


def build_with_cmake(out_dir):
    """Builds libpulse from the checkout; copies it to out_dir as its
    SONAME (libpulse.so.<ABI>); returns that file name."""
    if shutil.which("cmake") is None:
        raise SystemExit("pulse setup: cmake is not installed (apt-get install cmake); "
                         "tools/install-deps.sh installs everything libpulse needs")
    build = os.environ.get("PULSE_CMAKE_BUILD_DIR") or tempfile.mkdtemp(prefix="pulse-pip-build-")
    jobs = str(os.cpu_count() or 1)
    args = ["cmake", "-S", CHECKOUT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DPULSE_TESTS=OFF"]
    args += os.environ.get("PULSE_CMAKE_ARGS", "").split()
    say("building libpulse with CMake in " + build)
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build, "--target", "pulse", "-j", jobs], check=True,
                   stdout=subprocess.DEVNULL)
    real = [p for p in glob.glob(os.path.join(build, "libpulse.so.*.*.*")) if not os.path.islink(p)]
    if len(real) != 1:
        raise SystemExit(f"pulse setup: the build left {len(real)} libpulse.so.X.Y.Z in {build}")
    soname = subprocess.run(["objdump", "-p", real[0]], check=True, capture_output=True,
                            text=True).stdout
    match = re.search(r"SONAME\s+(\S+)", soname)
    name = match.group(1) if match else "libpulse.so"
    shutil.copyfile(real[0], os.path.join(out_dir, name))
    if not os.environ.get("PULSE_CMAKE_BUILD_DIR"):
        shutil.rmtree(build, ignore_errors=True)
    return name


def find_with_pkg_config():
    """The installed libpulse of this version: its absolute path."""
    version = package_version()
    if shutil.which("pkg-config") is None:
        raise SystemExit("pulse setup: not a checkout, and pkg-config is not installed to find "
                         "an installed libpulse")
    probe = subprocess.run(["pkg-config", "--modversion", "pulse"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise SystemExit("pulse setup: no installed libpulse found by pkg-config (install it with "
                         "cmake --install, set PKG_CONFIG_PATH to its lib/pkgconfig, or pip install "
                         "from a checkout's python/ folder, which builds it)")
    found = probe.stdout.strip()
    if found != version:
        raise SystemExit(f"pulse setup: pkg-config finds libpulse {found}; this package is "
                         f"{version}: they must be one version")
    libdir = subprocess.run(["pkg-config", "--variable=libdir", "pulse"], check=True,
                            capture_output=True, text=True).stdout.strip()
    libs = sorted(glob.glob(os.path.join(libdir, "libpulse.so.[0-9]*")), key=len)
    if not libs:
        raise SystemExit(f"pulse setup: pkg-config's libdir {libdir} holds no libpulse.so.N")
    return os.path.realpath(os.path.join(libdir, os.path.basename(libs[0])))


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        package_dir = os.path.join(self.build_lib, "pulse")
        source = os.environ.get("PULSE_LIBPULSE") or ("build" if is_checkout() else "pkg-config")
        if source == "build":
            if not is_checkout():
                raise SystemExit("pulse setup: PULSE_LIBPULSE=build needs python/ inside a pulse "
                                 "checkout")
            library = build_with_cmake(package_dir)
            how = "built from the checkout and copied beside this file"
        elif source == "pkg-config":
            library = find_with_pkg_config()
            how = "an installed libpulse found through pkg-config"
        else:
            raise SystemExit(f"pulse setup: PULSE_LIBPULSE={source!r}: use build or pkg-config")
        with open(os.path.join(package_dir, "_installed.py"), "w") as f:
            f.write(f"# Written by pip install (python/setup.py): {how}.\n"
                    f"LIBRARY = {library!r}\n")
        say(f"libpulse: {library}")


class BinaryDistribution(Distribution):
    """The wheel holds a native library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
