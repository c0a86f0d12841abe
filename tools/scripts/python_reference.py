"""Writes the Python API reference (docs/reference/python.md) from the
package itself: every name of pulse.__all__ and of its submodules'
__all__, with its signature (inspect.signature) and its docstring, so that
the page says what the code does. tests/python/test_docs_python.py fails
when the page and the code differ.

    PYTHONPATH=python /usr/bin/python3 tools/scripts/python_reference.py [OUT|-]
"""

import inspect
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docs_page  # noqa: E402
import types

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_OUT = os.path.join(ROOT, "docs", "reference", "python.md")

HEADER = """# Python API reference

The package `pulse` (`pip install ./python`, see the
[worker](../guides/inference-worker.md) and [trainer](../guides/trainer.md)
guides). Generated from the code by `tools/scripts/python_reference.py`:
each signature is `inspect.signature`'s and each text the docstring;
`tests/python/test_docs_python.py` fails when this page and the code
differ, and when a call to the package written in any page of the docs does
not fit the signature it calls.

Every failure is a `pulse.Error` (`status`: the C status name, e.g.
`PULSE_ERR_CORRUPT`; `detail`: the library's text). Tensors are PyTorch
tensors; `import pulse` needs no torch, the calls that take tensors do.
"""


def doc(obj):
    text = inspect.getdoc(obj)
    return text.strip() if text else "(undocumented)"


def signature(obj):
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def members(cls):
    """Public methods and properties of the class, in source order: its
    own, then those it inherits from the package's own base classes (a
    user calls both alike)."""
    out, seen = [], set()
    for klass in cls.__mro__:
        if klass is cls or (klass.__module__ or "").startswith("pulse."):
            out += own_members(klass, seen)
    return out


def own_members(cls, seen):
    """Public methods and properties defined by `cls` itself, less the
    names in `seen` (overridden below), which it extends."""
    out = []
    for name, value in cls.__dict__.items():
        if name.startswith("_") or name in seen:
            continue
        seen.add(name)
        if isinstance(value, property):
            out.append((name, "property", value.fget))
        elif isinstance(value, (staticmethod, classmethod)):
            out.append((name, "method", value.__func__))
        elif inspect.isfunction(value):
            out.append((name, "method", value))
    return out


def render_class(prefix, name, cls):
    lines = [f"### `{prefix}{name}`", "", "```python", f"{prefix}{name}{signature(cls)}", "```", "",
             doc(cls), ""]
    if cls.__init__ is not object.__init__ and cls.__init__.__doc__ and \
            cls.__init__.__doc__ != object.__init__.__doc__:
        lines += [doc(cls.__init__), ""]
    for mname, kind, fn in members(cls):
        if kind == "property":
            lines += [f"#### `{prefix}{name}.{mname}` (property)", "", doc(fn), ""]
        else:
            lines += [f"#### `{prefix}{name}.{mname}`", "", "```python",
                      f"{prefix}{name}.{mname}{signature_bound(fn)}", "```", "", doc(fn), ""]
    return lines


def signature_bound(fn):
    """A method's signature without self."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "(...)"
    params = list(sig.parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    return str(sig.replace(parameters=params))


def render_function(prefix, name, fn):
    return [f"### `{prefix}{name}`", "", "```python", f"{prefix}{name}{signature(fn)}", "```", "",
            doc(fn), ""]


def render_module(prefix, module):
    lines = []
    for name in module.__all__:
        obj = getattr(module, name)
        if name == "__version__":
            lines += [f"### `{prefix}__version__`", "",
                      f"The package's version, the library's too (`\"{obj}\"` here): the "
                      "package loads only a libpulse of the same version.", ""]
        elif isinstance(obj, types.ModuleType):
            continue
        elif inspect.isclass(obj):
            lines += render_class(prefix, name, obj)
        elif callable(obj):
            lines += render_function(prefix, name, obj)
    return lines


def render():
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import pulse

    lines = HEADER.splitlines() + [""]
    lines += ["## `pulse`", "", doc(pulse), ""]
    lines += render_module("pulse.", pulse)
    for name in pulse.__all__:
        obj = getattr(pulse, name)
        if isinstance(obj, types.ModuleType):
            lines += [f"## `pulse.{name}`", "", doc(obj), ""]
            lines += render_module(f"pulse.{name}.", obj)
    return docs_page.join(lines)


def main():
    docs_page.write(render, DEFAULT_OUT)


if __name__ == "__main__":
    main()
