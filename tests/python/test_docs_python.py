"""The Python documentation says what the code does:
- docs/reference/python.md is what tools/scripts/python_reference.py
  writes from the package now (signatures by inspect.signature,
  docstrings);
- every call to the package in a Python block of README.md, python/README.md
  and docs/**/*.md fits the signature it calls: `pulse.X(...)`,
  `pulse.loco.X(...)`, and methods called on a name bound to one of them
  (`sub = pulse.Subscriber(...)`, `with pulse.Server(...) as server`) are
  bound with inspect.signature(...).bind, so a keyword that does not exist
  or a wrong count of positional arguments fails, naming page and line."""

import ast
import glob
import importlib.util
import inspect
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
import pulse  # noqa: E402


def load_generator():
    path = os.path.join(ROOT, "tools", "scripts", "python_reference.py")
    spec = importlib.util.spec_from_file_location("python_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pages():
    found = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "python", "README.md")]
    found += glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    return [p for p in found if os.path.exists(p)]


def python_blocks(path):
    """(first line number, code) of each ```python block."""
    text = open(path).read().splitlines()
    blocks, start, lines = [], None, []
    for i, line in enumerate(text, 1):
        if start is None and re.match(r"^\s*```(python|py)\s*$", line):
            start, lines = i + 1, []
        elif start is not None and re.match(r"^\s*```\s*$", line):
            blocks.append((start, "\n".join(lines)))
            start = None
        elif start is not None:
            lines.append(line)
    return blocks


def resolve(node):
    """The package object a dotted name pulse.X[.Y] names, or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id != "pulse":
        return None
    obj = pulse
    for part in reversed(parts):
        obj = getattr(obj, part, None)
        if obj is None:
            return False  # a name the package does not have
    return obj


def check_call(call, fn, where, errors, bound_self=False):
    if any(isinstance(a, ast.Starred) for a in call.args) or \
            any(k.arg is None for k in call.keywords):
        return  # *args / **kwargs: nothing to check
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    if bound_self:
        params = list(sig.parameters.values())[1:]
        sig = sig.replace(parameters=params)
    try:
        sig.bind(*range(len(call.args)), **{k.arg: None for k in call.keywords})
    except TypeError as exc:
        errors.append(f"{where}: {ast.unparse(call)[:120]} does not fit {sig}: {exc}")


def check_block(code, where, errors):
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return 0  # a fragment (e.g. with "..." lines that are not Python)
    classes = {}  # name -> the package class bound to it
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            cls = resolve(node.value.func)
            if inspect.isclass(cls):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        classes[target.id] = cls
        if isinstance(node, ast.withitem) and isinstance(node.context_expr, ast.Call):
            cls = resolve(node.context_expr.func)
            if inspect.isclass(cls) and isinstance(node.optional_vars, ast.Name):
                classes[node.optional_vars.id] = cls
    checked = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        line = f"{where}+{getattr(node, 'lineno', 1) - 1}"
        target = resolve(node.func)
        if target is False:
            errors.append(f"{line}: {ast.unparse(node.func)} is not in the package")
        elif target is not None and callable(target):
            # pulse.Class.method(...), as the reference writes a method:
            # the call it stands for is on an instance.
            owner = resolve(node.func.value) if isinstance(node.func, ast.Attribute) else None
            on_instance = inspect.isclass(owner) and inspect.isfunction(target)
            check_call(node, target, line, errors, bound_self=on_instance)
            checked += 1
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) and \
                node.func.value.id in classes:
            cls = classes[node.func.value.id]
            method = getattr(cls, node.func.attr, None)
            if method is None:
                errors.append(f"{line}: {cls.__name__} has no {node.func.attr}")
            elif inspect.isfunction(method):
                check_call(node, method, line, errors, bound_self=True)
                checked += 1
    return checked


def main():
    errors = []
    generator = load_generator()
    want = generator.render()
    page = os.path.join(ROOT, "docs", "reference", "python.md")
    have = open(page).read() if os.path.exists(page) else ""
    if have != want:
        diff = [l for l in set(want.splitlines()) ^ set(have.splitlines())][:10]
        errors.append("docs/reference/python.md differs from the code (run PYTHONPATH=python "
                      "/usr/bin/python3 tools/scripts/python_reference.py); lines such as: "
                      + " | ".join(diff))
    checked = 0
    for path in pages():
        rel = os.path.relpath(path, ROOT)
        for start, code in python_blocks(path):
            checked += check_block(code, f"{rel}:{start}", errors)
    for error in errors:
        print("FAIL:", error)
    if errors:
        sys.exit(1)
    assert checked >= 5, f"only {checked} calls found in the docs' Python blocks"
    print(f"ok: the reference is the code's; {checked} calls in the docs fit their signatures")


if __name__ == "__main__":
    main()
