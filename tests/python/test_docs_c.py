"""docs/reference/c.md is what tools/scripts/c_reference.py writes from
the public headers now: a header added, removed, renamed or re-documented,
or a function declared or dropped, without the page following, fails
here (run /usr/bin/python3 tools/scripts/c_reference.py)."""

import difflib
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def main():
    path = os.path.join(ROOT, "tools", "scripts", "c_reference.py")
    spec = importlib.util.spec_from_file_location("c_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    want = module.render()
    page = os.path.join(ROOT, "docs", "reference", "c.md")
    have = open(page).read() if os.path.exists(page) else ""
    if have != want:
        diff = difflib.unified_diff(have.splitlines(), want.splitlines(), "docs/reference/c.md",
                                    "the headers now", lineterm="", n=1)
        print("\n".join(list(diff)[:40]))
        print("FAIL: docs/reference/c.md differs from the public headers: run "
              "/usr/bin/python3 tools/scripts/c_reference.py")
        sys.exit(1)
    assert want.count("\n### `pulse_") >= 15, "fewer public headers than expected"
    print("ok: the C reference is the public headers'")


if __name__ == "__main__":
    main()
