#!/usr/bin/env python3
"""CI's Wgpu stage starts from a recorded CubeCL autotune cache (.ci/cubecl-autotune).

usage: scripts/autotune_seed.py CACHE_DIR [OUT_DIR]

CACHE_DIR is the `autotune` folder that a Wgpu stage wrote (`target/ci-cubecl-cache/autotune`
after `.ci/run`'s stage 4, or any run with `MAMBA2_BURN_CUBECL_CACHE=DIR`: `DIR/autotune`).
Each of its files holds one JSON line a tuned key: the key, the checksum of the candidates'
set, the index of the fastest candidate and every candidate's timing. CubeCL reads only the
key, the checksum and the index back (cubecl-runtime's `TuneCache::load`); this keeps those and
the winner's own timing (its name says which kernel runs), sorted, in OUT_DIR (default
.ci/cubecl-autotune), replacing what was there.

With the recorded choice, a key is not tuned again: the candidates that lost are neither
compiled nor timed, which on lavapipe is most of a new shape's cost. A key whose candidates'
set changed (another checksum, a CubeCL upgrade: the version is a folder) or that the record
lacks is tuned as before, so a stale record costs time, never a result.
"""
import json
import pathlib
import shutil
import sys


def trim(line):
    entry = json.loads(line)
    value = entry["value"]
    fastest = value["fastest_index"]
    winners = [
        r for r in value["results"] if r["outcome"].get("Ok", {}).get("index") == fastest
    ]
    entry["value"] = {"fastest_index": fastest, "results": winners}
    return json.dumps(entry, separators=(",", ":"))


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    source = pathlib.Path(sys.argv[1])
    out = pathlib.Path(sys.argv[2] if len(sys.argv) == 3 else ".ci/cubecl-autotune")
    files = sorted(source.rglob("*.json.log"))
    if not files:
        sys.exit(f"{source}: no autotune files (*.json.log) under it")
    if out.exists():
        shutil.rmtree(out)
    total = 0
    for file in files:
        lines = sorted({trim(l) for l in file.read_text().splitlines() if l.strip()})
        target = out / file.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(l + "\n" for l in lines))
        total += len(lines)
        print(f"{target}: {len(lines)} keys")
    print(f"{total} keys in {len(files)} files")


if __name__ == "__main__":
    main()
