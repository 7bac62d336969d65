#!/usr/bin/env python3
"""Keeps server/'s layering strict: each folder includes only the folders below it (the allowed
lists here), and no header or source file reaches itself through includes (no cycles).

    python3 scripts/check_layers.py [--root DIR]   # exit 1 and one line per problem
    python3 scripts/check_layers.py --self-test    # proves it catches both kinds of problem

The layers follow the request path (see the house style guide): core at the bottom; repository,
batching, runtime and tracing on it; the manager on batching; metrics beside the front ends; the shared
front-end code (frontend/) below gRPC and HTTP, which never include each other; server.cc and
main.cc at the top.
"""
import argparse
import os
import re
import sys
import tempfile

ALLOWED = {
    "core": set(),
    "repository": {"core"},
    "batching": {"core"},
    "runtime": {"core"},
    "manager": {"core", "batching"},
    "tracing": {"core"},
    "metrics": {"core", "manager", "tracing"},
    "frontend": {"core", "batching", "manager", "tracing"},
    "grpc": {"core", "batching", "manager", "frontend", "tracing"},
    "http": {"core", "batching", "manager", "frontend", "tracing"},
}
TOP = ""  # server/*.cc, server/*.h: may include every folder
INCLUDE = re.compile(r'^\s*#\s*include\s+"server/([^"]+)"', re.M)


def folder_of(relative):
    """'grpc/grpc_codec.h' -> 'grpc'; 'server.h' -> TOP."""
    return relative.split("/", 1)[0] if "/" in relative else TOP


def check(root):
    server = os.path.join(root, "server")
    files = {}
    for directory, _, names in os.walk(server):
        for name in names:
            if name.endswith((".h", ".cc")):
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, server)
                with open(path, encoding="utf-8") as f:
                    files[relative] = INCLUDE.findall(f.read())
    problems = []
    for relative, includes in sorted(files.items()):
        mine = folder_of(relative)
        if mine != TOP and mine not in ALLOWED:
            problems.append(f"server/{relative}: folder '{mine}' has no place in the layers (add it to ALLOWED)")
            continue
        for included in includes:
            theirs = folder_of(included)
            if mine == TOP or theirs == mine:
                continue
            if theirs == TOP or theirs not in ALLOWED[mine]:
                problems.append(f"server/{relative} includes server/{included}: '{mine}' may include only "
                                f"{', '.join(sorted(ALLOWED[mine])) or 'nothing outside itself'}")
    # Cycles: depth-first search over file-level includes.
    state = {}  # 1: on the stack, 2: done

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in files.get(node, []):
            if nxt not in files:
                continue
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                problems.append("include cycle: " + " -> ".join(f"server/{each}" for each in cycle))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(files):
        if node not in state:
            visit(node, [])
    return problems, len(files)


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def write(relative, *includes):
            path = os.path.join(root, "server", relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write("".join(f'#include "server/{each}"\n' for each in includes))
        write("core/a.h")
        write("grpc/b.h", "core/a.h", "http/c.h")  # a sibling front end: not allowed
        write("http/c.h", "frontend/d.h")
        write("frontend/d.h", "frontend/e.h")
        write("frontend/e.h", "frontend/d.h")  # a cycle
        write("core/f.h", "manager/g.h")       # upwards: not allowed
        write("manager/g.h")
        problems, _ = check(root)
    expected = ["server/grpc/b.h includes server/http/c.h", "server/core/f.h includes server/manager/g.h",
                "include cycle: server/frontend/d.h -> server/frontend/e.h -> server/frontend/d.h"]
    missing = [each for each in expected if not any(problem.startswith(each) for problem in problems)]
    if missing or len(problems) != len(expected):
        print("self-test FAILED; expected:\n  " + "\n  ".join(expected) + "\ngot:\n  " + "\n  ".join(problems))
        return 1
    print(f"self-test passed: {len(problems)} planted problems found")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    problems, count = check(args.root)
    for problem in problems:
        print(problem)
    print(f"{count} files under server/: {'layering clean' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
