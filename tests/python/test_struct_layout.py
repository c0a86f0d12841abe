"""Every ctypes structure of the Python package against its C struct: the C
compiler says, from offsetof and sizeof over the installed-style public
headers of the build, where each field lies and how large each struct is;
any drift (a field added, moved, renamed or resized in C and not in Python,
or the other way) fails here. Then the version: the package's, the
library's and CMakeLists.txt's are one number, and a library of another
version is refused with a pulse.Error.

Needs PULSE_LIBRARY (ctest sets it to the build's libpulse.so; the public
headers are in include/ beside it) and a C compiler."""

import ctypes
import glob
import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import pulse  # noqa: E402
from pulse import _lib  # noqa: E402

failures = []


def expect(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def structures():
    """Every ctypes structure of the package's modules, each naming its C
    struct."""
    found = {}
    modules = [importlib.import_module(f"pulse.{m.name}")
               for m in pkgutil.iter_modules(pulse.__path__)]
    for module in modules:
        for name in dir(module):
            cls = getattr(module, name)
            if isinstance(cls, type) and issubclass(cls, ctypes.Structure) \
                    and cls.__module__ == module.__name__:
                expect(hasattr(cls, "_c_name_"),
                       f"{module.__name__}.{name} does not name its C struct (_c_name_)")
                if hasattr(cls, "_c_name_"):
                    found[cls._c_name_] = cls
    return found


def c_layouts(structs, include_dirs):
    """{c_name: (size, {field: (offset, size)})} from the C compiler."""
    lines = ["#include <stddef.h>", "#include <stdio.h>"]
    for header in sorted({os.path.basename(h) for d in include_dirs
                          for h in glob.glob(os.path.join(d, "pulse_*.h"))}):
        lines.append(f'#include "{header}"')
    lines.append("int main(void) {")
    for c_name, cls in structs.items():
        lines.append(f'  printf("%s %zu\\n", "{c_name}", sizeof({c_name}));')
        for field, _ in cls._fields_:
            lines.append(f'  printf("%s.%s %zu %zu\\n", "{c_name}", "{field}", '
                         f"offsetof({c_name}, {field}), sizeof((({c_name} *)0)->{field}));")
    lines += ["  return 0;", "}"]
    work = tempfile.mkdtemp()
    try:
        src = os.path.join(work, "layout.c")
        exe = os.path.join(work, "layout")
        with open(src, "w") as f:
            f.write("\n".join(lines) + "\n")
        cc = os.environ.get("CC", "cc")
        cmd = [cc, "-std=c11", "-o", exe, src] + [f"-I{d}" for d in include_dirs]
        built = subprocess.run(cmd, capture_output=True, text=True)
        if built.returncode != 0:
            # A field the C struct does not have (renamed, removed) ends here.
            print(built.stderr[-4000:])
            expect(False, "the layout program does not compile against the headers "
                   "(a field of a ctypes structure that its C struct lacks?)")
            return None
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    finally:
        shutil.rmtree(work)
    layouts = {}
    for line in out.splitlines():
        key, *nums = line.split()
        if "." in key:
            struct, field = key.split(".", 1)
            layouts[struct][1][field] = (int(nums[0]), int(nums[1]))
        else:
            layouts[key] = (int(nums[0]), {})
    return layouts


def check_layouts():
    library = os.environ.get("PULSE_LIBRARY")
    if not library or not os.path.exists(library):
        print("skipped: PULSE_LIBRARY does not name a built libpulse.so")
        sys.exit(77)
    if shutil.which(os.environ.get("CC", "cc")) is None:
        print("skipped: no C compiler")
        sys.exit(77)
    include_dirs = sorted(glob.glob(os.path.join(os.path.dirname(library), "include", "pulse_*")))
    expect(include_dirs, f"no public headers beside {library} (include/pulse_*/)")
    structs = structures()
    expect(len(structs) >= 10, f"only {len(structs)} ctypes structures found")
    layouts = c_layouts(structs, include_dirs)
    if layouts is None:
        return
    for c_name, cls in structs.items():
        size, fields = layouts[c_name]
        expect(ctypes.sizeof(cls) == size,
               f"{cls.__name__}: {ctypes.sizeof(cls)} bytes, {c_name}: {size}")
        for field, _ in cls._fields_:
            descriptor = getattr(cls, field)
            offset, fsize = fields[field]
            expect((descriptor.offset, descriptor.size) == (offset, fsize),
                   f"{cls.__name__}.{field}: offset {descriptor.offset} size {descriptor.size}; "
                   f"{c_name}.{field}: offset {offset} size {fsize}")
        # Fields in C that Python lacks: between consecutive fields (or at
        # the end) the C struct would have bytes Python does not name. Only
        # padding may be there.
        spans = sorted(fields.values())
        end = 0
        for offset, fsize in spans:
            expect(offset - end < 8, f"{c_name}: {offset - end} unnamed bytes before offset "
                   f"{offset} (a C field the ctypes mirror lacks?)")
            end = max(end, offset + fsize)
        expect(size - end < 8, f"{c_name}: {size - end} unnamed bytes at the end "
               "(a C field the ctypes mirror lacks?)")
    print(f"{len(structs)} structures checked against their C structs field by field")


def check_version():
    # One number: CMakeLists.txt reads project(VERSION) from _version.py.
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        cmake = f.read()
    expect("project(pulse VERSION ${pulse_version}" in cmake and "python/pulse/_version.py" in cmake,
           "CMakeLists.txt does not take its version from python/pulse/_version.py")
    expect(_lib.lib.pulse_version().decode() == pulse.__version__,
           "the library loaded is of another version")
    # A library of another version is refused: the package pretends to be
    # another version and loads the same library anew.
    saved = _lib.__version__
    _lib.__version__ = "999.0.0"
    try:
        fresh = _lib._Library()
        fresh.pulse_status_name
        expect(False, "a library of another version was loaded")
    except pulse.Error as e:
        expect(e.status == "PULSE_ERR_VERSION" and "999.0.0" in e.detail, str(e))
    finally:
        _lib.__version__ = saved
    # Options come from the library: every default as C set it.
    opts = _lib.SubOpts()
    expect(opts.struct_version > 0 and opts.retries == 6 and opts.min_bytes_per_s == 262144,
           "SubOpts() does not hold the library's defaults")


check_layouts()
check_version()
if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
print("1 passed, 0 failed")
