"""Every relative link in the project's Markdown resolves: the file or
folder exists in the checkout, and a #fragment names a heading of the
target page (GitHub's anchors: lower case, punctuation dropped, spaces to
hyphens, -1, -2 for repeats). Links to the web (http:, https:, mailto:) are
not followed. Pages: every *.md of the repository outside build folders."""

import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
LINK = re.compile(r"(?<!\!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^()\s]+)\)")


def markdown_files():
    listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard", "*.md"],
                            capture_output=True, text=True)
    if listed.returncode == 0:
        return [os.path.join(ROOT, p) for p in listed.stdout.split() if os.path.exists(os.path.join(ROOT, p))]
    found = []
    for base, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith((".", "build"))]
        found += [os.path.join(base, f) for f in files if f.endswith(".md")]
    return found


def slug(heading):
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, found, fence = {}, set(), False
        for line in open(path, encoding="utf-8"):
            if line.lstrip().startswith("```"):
                fence = not fence
                continue
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m and not fence:
                base = slug(m.group(1))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def links(path):
    fence = False
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence:
            continue
        line = re.sub(r"`[^`]*`", "", line)  # code spans are not links
        for m in list(LINK.finditer(line)) + list(IMAGE.finditer(line)):
            yield number, m.group(1)


def main():
    errors, count = [], 0
    for page in sorted(markdown_files()):
        rel = os.path.relpath(page, ROOT)
        for number, target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            count += 1
            path, _, fragment = target.partition("#")
            resolved = page if not path else os.path.normpath(os.path.join(os.path.dirname(page), path))
            if not resolved.startswith(ROOT):
                errors.append(f"{rel}:{number}: {target} leaves the repository")
            elif not os.path.exists(resolved):
                errors.append(f"{rel}:{number}: {target}: no such file")
            elif fragment and resolved.endswith(".md") and fragment not in anchors(resolved):
                errors.append(f"{rel}:{number}: {target}: no heading #{fragment} in "
                              f"{os.path.relpath(resolved, ROOT)}")
    for error in errors:
        print("FAIL:", error)
    if errors:
        sys.exit(1)
    assert count > 20, f"only {count} relative links found: is the docs tree there?"
    print(f"ok: {count} relative links resolve")


if __name__ == "__main__":
    main()
