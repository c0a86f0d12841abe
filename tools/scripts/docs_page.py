"""What the generated reference pages share: joining their lines and
writing the page (tools/scripts/c_reference.py, python_reference.py)."""

import os
import sys


def join(lines):
    """The page's text: the lines, trailing blank ones dropped, one final
    newline."""
    lines = list(lines)
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def write(render, default_out):
    """Writes render()'s text to argv[1] (- for stdout), else default_out,
    atomically (a temporary file, then a rename)."""
    out = sys.argv[1] if len(sys.argv) > 1 else default_out
    text = render()
    if out == "-":
        sys.stdout.write(text)
        return
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".tmp", "w") as f:
        f.write(text)
    os.replace(out + ".tmp", out)
