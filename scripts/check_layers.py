#!/usr/bin/env python3
"""Keeps server/'s layering strict: each folder includes only the folders below it (the allowed
lists here), no header or source file reaches itself through includes (no cycles), and each
folder's library links only the libraries of the folders it may include (CMake's link graph:
target_link_libraries in server/<folder>/CMakeLists.txt), the generated protobuf messages only
where a wire format is read, and gRPC only in grpc/.

    python3 scripts/check_layers.py [--root DIR]   # exit 1 and one line per problem
    python3 scripts/check_layers.py --self-test    # proves it catches both kinds of problem

The layers follow the request path (see the house style guide): os (what Sluice asks of the
operating system) and core at the bottom; repository,
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
    "os": set(),
    "core": {"os"},
    "repository": {"os", "core"},
    "batching": {"os", "core"},
    "runtime": {"os", "core"},
    "manager": {"os", "core", "batching"},
    "tracing": {"os", "core"},
    "metrics": {"os", "core", "manager", "tracing"},
    "frontend": {"os", "core", "batching", "manager", "tracing"},
    "grpc": {"os", "core", "batching", "manager", "frontend", "tracing"},
    "http": {"os", "core", "batching", "manager", "frontend", "tracing"},
}
# Libraries that are not a folder's: the generated messages (where a wire format or a
# configuration is read) and their gRPC services; sluice_warnings is flags only.
EXTRA_LINKS = {
    "sluice_proto": {"repository", "tracing", "frontend", "grpc", "http"},
    "sluice_proto_grpc": {"grpc"},
    "sluice_warnings": set(ALLOWED),
}
# Libraries of gRPC itself: only grpc/ links them.
GRPC_LINK = re.compile(r"\bgRPC::[\w+]+")
LINKS = re.compile(r"target_link_libraries\(\s*(sluice_\w+)([^)]*)\)", re.S)
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
    problems += check_links(server)
    return problems, len(files)


def check_links(server):
    """The link graph: each folder's library links only what its includes may reach."""
    problems = []
    for folder in sorted(os.listdir(server)):
        path = os.path.join(server, folder, "CMakeLists.txt")
        if folder not in ALLOWED or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            text = re.sub(r"#[^\n]*", "", f.read())
        for target, arguments in LINKS.findall(text):
            if target != f"sluice_{folder}":
                continue
            for linked in re.findall(r"\bsluice_\w+", arguments):
                theirs = linked[len("sluice_"):]
                if linked in EXTRA_LINKS:
                    allowed = folder in EXTRA_LINKS[linked]
                else:
                    allowed = theirs == folder or theirs in ALLOWED[folder]
                if not allowed:
                    problems.append(f"server/{folder}/CMakeLists.txt: {target} links {linked}")
            if folder != "grpc" and GRPC_LINK.search(arguments):
                problems.append(f"server/{folder}/CMakeLists.txt: {target} links "
                                f"{GRPC_LINK.search(arguments).group(0)}: only grpc/ links gRPC")
    return problems


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

        def cmake(folder, text):
            with open(os.path.join(root, "server", folder, "CMakeLists.txt"), "w") as f:
                f.write(text)
        cmake("http", "# a comment naming sluice_grpc is not a link\n"
                      "target_link_libraries(sluice_http PUBLIC sluice_frontend sluice_proto_grpc\n"
                      "                      PRIVATE gRPC::grpc++ sluice_warnings)\n")
        cmake("manager", "target_link_libraries(sluice_manager PUBLIC sluice_core sluice_metrics)\n")
        cmake("frontend", "target_link_libraries(sluice_frontend PUBLIC sluice_core sluice_proto)\n")
        problems, _ = check(root)
    expected = ["server/grpc/b.h includes server/http/c.h", "server/core/f.h includes server/manager/g.h",
                "include cycle: server/frontend/d.h -> server/frontend/e.h -> server/frontend/d.h",
                "server/http/CMakeLists.txt: sluice_http links sluice_proto_grpc",
                "server/http/CMakeLists.txt: sluice_http links gRPC::grpc++",
                "server/manager/CMakeLists.txt: sluice_manager links sluice_metrics"]
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
