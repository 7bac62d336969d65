#!/usr/bin/env python3
"""Checks the documentation's relative links: every link in README.md and docs/**/*.md that is not
a URL must name a file or folder that exists, and a link with a #fragment into a Markdown file
(or into its own page) must name a heading of that file, as GitHub turns headings into anchors.
Also fails when README.md is longer than the README's budget (400 lines).

    python3 scripts/check_docs_links.py [--root DIR]   # exit 1 and one line per problem
    python3 scripts/check_docs_links.py --self-test    # proves it catches each kind of problem

Standard library only.
"""
import argparse
import os
import re
import sys
import tempfile
import unicodedata

README_MAX_LINES = 400

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SETEXT = re.compile(r"^\s{0,3}(=+|-+)\s*$")
HTML_ANCHOR = re.compile(r"""<a\s+[^>]*?(?:name|id)\s*=\s*["']([^"']+)["']""", re.I)
# [text](target) and ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def slugify(heading):
    """GitHub's anchor for a heading's text: its rendered text, lower case, punctuation dropped
    (letters, digits, spaces, '-' and '_' kept), each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "")
    text = re.sub(r"(\*\*|__|\*|_)(?=\S)(.+?)(?<=\S)\1", r"\2", text)  # emphasis markers
    out = []
    for ch in text.lower():
        if ch in " -_" or unicodedata.category(ch)[0] in "LN":
            out.append(ch)
    return "".join(out).replace(" ", "-")


def markdown_lines(text):
    """(line number, line) for every line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            continue
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        yield number, line


def anchors_of(text):
    """Every anchor the page defines: its headings' slugs (repeats numbered -1, -2, ... as
    GitHub numbers them) and explicit <a name/id> anchors."""
    anchors = set()
    seen = {}
    previous = None
    for _, line in markdown_lines(text):
        for name in HTML_ANCHOR.findall(line):
            anchors.add(name)
        title = None
        m = HEADING.match(line)
        if m:
            title = m.group(2)
        elif previous is not None and previous.strip() and SETEXT.match(line) and \
                not HEADING.match(previous) and not previous.lstrip().startswith(("|", "-", "*")):
            title = previous.strip()
        previous = line
        if title is None:
            continue
        slug = slugify(title)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else "%s-%d" % (slug, count))
    return anchors


def links_of(text):
    """(line number, target) for every link outside code."""
    for number, line in markdown_lines(text):
        bare = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        m = REFERENCE_DEF.match(bare)
        if m:
            yield number, m.group(1)
            continue
        for m in INLINE_LINK.finditer(bare):
            yield number, m.group(1)


def documents(root):
    """README.md and every Markdown file under docs/, relative to root."""
    found = []
    if os.path.isfile(os.path.join(root, "README.md")):
        found.append("README.md")
    for folder, dirs, files in os.walk(os.path.join(root, "docs")):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".md"):
                found.append(os.path.relpath(os.path.join(folder, name), root))
    return found


def check(root):
    problems = []
    cache = {}

    def anchors(path):
        if path not in cache:
            with open(path, encoding="utf-8") as f:
                cache[path] = anchors_of(f.read())
        return cache[path]

    readme = os.path.join(root, "README.md")
    if not os.path.isfile(readme):
        problems.append("README.md: missing")
    else:
        with open(readme, encoding="utf-8") as f:
            lines = f.read().count("\n")
        if lines > README_MAX_LINES:
            problems.append("README.md: %d lines, more than %d" % (lines, README_MAX_LINES))

    for doc in documents(root):
        source = os.path.join(root, doc)
        with open(source, encoding="utf-8") as f:
            text = f.read()
        for number, target in links_of(text):
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            path, _, fragment = target.partition("#")
            path = re.sub(r"%20", " ", path)
            where = "%s:%d: %s" % (doc, number, target)
            if path:
                resolved = os.path.normpath(os.path.join(os.path.dirname(source), path))
                if os.path.relpath(resolved, root).split(os.sep)[0] == "..":
                    problems.append("%s: points outside the repository" % where)
                    continue
                if not os.path.exists(resolved):
                    problems.append("%s: no such file" % where)
                    continue
            else:
                resolved = source
            if fragment and resolved.endswith(".md") and os.path.isfile(resolved):
                if fragment.lower() not in anchors(resolved) and fragment not in anchors(resolved):
                    problems.append("%s: no heading with anchor '#%s' in %s" %
                                    (where, fragment, os.path.relpath(resolved, root)))
    return problems


def self_test():
    """Plants one problem of each kind in a temporary tree and checks that each is reported."""
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs", "guide"))
        good = (
            "# Title\n\nSee [a](docs/guide/page.md#a-heading-with-code), [b](#title),\n"
            "[c](docs/guide/page.md#repeated-1), [d](https://example.com/x.md#nothing),\n"
            "[e](docs/guide/page.md#sluices-parameters), [dir](docs/guide).\n\n"
            "```\n[not a link](missing-in-code.md)\n```\n\n`[nor](this.md)`\n")
        page = (
            "# Page\n\n## A heading with `code`\n\n## Repeated\n\n## Repeated\n\n"
            "## Sluice's parameters\n\nBack to the [README](../../README.md#title).\n")
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write(good)
        with open(os.path.join(root, "docs", "guide", "page.md"), "w") as f:
            f.write(page)
        clean = check(root)
        if clean:
            print("self-test: a clean tree reported problems:\n  " + "\n  ".join(clean))
            return 1
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write(good + "[x](docs/missing.md) [y](docs/guide/page.md#no-such-heading) [z](#nope)\n"
                    + "line\n" * README_MAX_LINES)
        found = check(root)
        expected = ["no such file", "anchor '#no-such-heading'", "anchor '#nope'", "lines, more than"]
        missing = [e for e in expected if not any(e in p for p in found)]
        if missing or len(found) != len(expected):
            print("self-test failed: expected %s, got:\n  %s" % (expected, "\n  ".join(found)))
            return 1
    print("self-test passed")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=".", help="the repository's root (default: .)")
    parser.add_argument("--self-test", action="store_true", help="check the checker")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    problems = check(os.path.abspath(args.root))
    for problem in problems:
        print(problem)
    if problems:
        print("%d documentation link problem(s)" % len(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
