#!/usr/bin/env python3
"""Checks that the crate's imports point down: no path inside `src/` names a module above its
own (in the order of LEVELS below, lowest first), no file imports a file that imports it back
(directly or around a cycle), and no top-level folder imports one that imports it back.

What counts as an import: every `crate::`, `super::` and child-module path in code outside
comments and `#[cfg(test)] mod tests` (a `use`, a re-export or a path inline). A path through
the crate root (`crate::Mamba2`, a re-export in `lib.rs`) counts as upward. Prints the counts
and exits with 1 when any is not zero.

    python3 scripts/layering.py [-v]
"""

import glob
import os
import re
import sys

# Lowest first. A module may use those before it; within `layers`, the order of its files.
LEVELS = [
    "error", "precision", "cubecl_setup", "init", "ssd",
    "layers::activation", "layers::norm", "layers::documents", "layers::state", "layers::lora",
    "layers::mamba3", "layers::mixer", "layers::rope", "layers::attention", "layers::mlp", "layers::moe", "layers::block", "layers::backbone", "layers",
    "models", "sampling", "tokenizer", "recurrent", "generate", "checkpoint", "data", "train",
]
RANK = {name: i for i, name in enumerate(LEVELS)}
EXTERNAL = {"crate", "super", "self", "std", "core", "alloc"}

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(path):
    parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return "::".join(parts)


def rank_of(module):
    segs = module.split("::")
    for n in (2, 1):
        key = "::".join(segs[:n])
        if key in RANK:
            return RANK[key]
    return len(LEVELS)  # the crate root


def code_of(path):
    text = re.sub(r"//[^\n]*", "", open(path, encoding="utf-8").read())
    return re.split(r"#\[cfg\([^\n]*test[^\n]*\)\]\s*(?:pub(?:\(crate\))? )?mod tests", text)[0]


def main():
    verbose = "-v" in sys.argv
    files = {module_of(f): f for f in glob.glob(os.path.join(ROOT, "**", "*.rs"), recursive=True)}

    def resolve(path):
        segs = path.split("::")
        for n in range(len(segs), -1, -1):
            key = "::".join(segs[:n])
            if key in files:
                return key
        return None

    upward, edges = [], {m: set() for m in files}
    for module, path in files.items():
        code = code_of(path)
        is_dir = os.path.basename(path) in ("mod.rs", "lib.rs")
        own = module.split("::") if module else []
        parent = own if is_dir else own[:-1]
        for target in re.findall(r"\bcrate::([A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)", code):
            if module and rank_of(target) > rank_of(module):
                upward.append((module, "crate::" + target))
            found = resolve(target)
            if found is not None and found != module:
                edges[module].add(found)
        for supers, target in re.findall(
                r"\b((?:super::)+)([A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)", code):
            # each `super::` one level up from the file's own module
            base = own[:len(own) - supers.count("super::")]
            found = resolve("::".join(base + target.split("::")))
            if found is not None and found != module:
                edges[module].add(found)
        for child in re.findall(r"^\s*(?:pub(?:\([a-z]+\))? )?use ([a-z_]\w*)::", code, re.M):
            full = "::".join((own if is_dir else parent) + [child])
            if child not in EXTERNAL and full in files and full != module:
                edges[module].add(full)

    # strongly connected components of the file graph (Tarjan)
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)

    top = lambda m: m.split("::")[0] if m else "lib"
    folders = {}
    for a, targets in edges.items():
        for b in targets:
            if a and top(a) != top(b):
                folders.setdefault(top(a), set()).add(top(b))
    folder_cycles = sorted({tuple(sorted((a, b))) for a in folders for b in folders[a]
                            if a in folders.get(b, set())})

    print(f"{len(files)} files: {len(upward)} upward paths, {len(cycles)} file cycles, "
          f"{len(folder_cycles)} folder cycles")
    for module, target in upward:
        print(f"  upward: {module} -> {target}")
    for cycle in cycles:
        print("  file cycle:", " <-> ".join(cycle))
    for cycle in folder_cycles:
        print("  folder cycle:", " <-> ".join(cycle))
    if verbose:
        for a in sorted(folders):
            print(f"  {a} -> {', '.join(sorted(folders[a]))}")
    return 1 if upward or cycles or folder_cycles else 0


if __name__ == "__main__":
    sys.exit(main())
