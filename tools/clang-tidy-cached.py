#!/usr/bin/env python3
"""clang-tidy over the given sources, skipping those already found clean.

Usage: tools/clang-tidy-cached.py [-j N] [--clang-tidy BIN] -p BUILD_DIR FILE...

What ccache does for the compiler, for clang-tidy: a file whose translation
unit, flags, checks and clang-tidy version are byte for byte those of an
earlier clean run is not checked again. The key is a SHA-256 over

  - the clang-tidy version text and the .clang-tidy files that apply,
  - the file's path and compile flags, relative to the source and build dirs,
  - its preprocessed text (the compiler's -E with line markers, so every
    header it includes, and where each one lives, is part of the key),

with the source and build directories replaced by fixed names, so a fresh
clone elsewhere hits the entries an earlier clone left. Only clean results
are remembered: a file with findings is checked, and its findings printed,
every time. The entries live in $SHARDLOCK_TIDY_CACHE, else
$XDG_CACHE_HOME/shardlock-clang-tidy, else ~/.cache/shardlock-clang-tidy;
SHARDLOCK_TIDY_CACHE=off checks every file.

Exit status: 0 when every file is clean, 1 when any has findings or cannot
be checked, 2 for a usage error.
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path


def cache_dir() -> Path | None:
    chosen = os.environ.get("SHARDLOCK_TIDY_CACHE")
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shardlock-clang-tidy"


def compile_commands(build_dir: Path) -> dict[str, dict]:
    with open(build_dir / "compile_commands.json", encoding="utf-8") as f:
        return {os.path.realpath(e["file"]): e for e in json.load(f)}


def preprocess_args(entry: dict) -> list[str]:
    """The entry's compile command, writing its -E output to stdout."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a == "-c":
            continue
        out.append(a)
    return out + ["-E", "-o", "-"]


def tidy_configs(source: Path, root: Path) -> bytes:
    """Every .clang-tidy from the file's directory up to the source root."""
    text = b""
    d = source.parent
    while True:
        f = d / ".clang-tidy"
        if f.is_file():
            text += str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0"
        if d == root or d == d.parent:
            return text
        d = d.parent


def key_of(source: Path, entry: dict, root: Path, build: Path, version: bytes) -> str | None:
    pre = subprocess.run(preprocess_args(entry), cwd=entry["directory"], capture_output=True,
                         check=False)
    if pre.returncode != 0:
        return None  # let clang-tidy report why it does not compile

    def normal(b: bytes) -> bytes:
        return b.replace(str(build).encode(), b"@BUILD@").replace(str(root).encode(), b"@SRC@")

    h = hashlib.sha256()
    for part in (version, tidy_configs(source, root), str(source.relative_to(root)).encode(),
                 normal(" ".join(preprocess_args(entry)).encode()), normal(pre.stdout)):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def check(source: Path, args, commands, root: Path, build: Path, version: bytes,
          cache: Path | None) -> tuple[bool, str, bool]:
    entry = commands.get(os.path.realpath(source))
    key = None
    if cache is not None and entry is not None:
        key = key_of(source, entry, root, build, version)
        if key is not None and (cache / key[:2] / key).exists():
            return True, "", True
    run = subprocess.run([args.clang_tidy, "-p", str(build), "--quiet", "--warnings-as-errors=*",
                          str(source)], capture_output=True, text=True, check=False)
    # clang-tidy prints "N warnings generated." to stderr even when none is
    # ours (they were in headers outside the filter): that is not a finding.
    findings = run.stdout.strip()
    clean = run.returncode == 0 and not findings
    if clean and key is not None:
        entry_path = cache / key[:2] / key
        entry_path.parent.mkdir(parents=True, exist_ok=True)
        entry_path.write_text(str(source.relative_to(root)) + "\n", encoding="utf-8")
    report = "" if clean else f"{findings}\n{run.stderr.strip()}".strip()
    return clean, report, False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-p", dest="build", required=True, help="build dir with compile_commands.json")
    parser.add_argument("-j", dest="jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--clang-tidy", default="clang-tidy-14")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    root = Path(os.path.realpath(Path(__file__).resolve().parent.parent))
    build = Path(os.path.realpath(args.build))
    try:
        commands = compile_commands(build)
        version = subprocess.run([args.clang_tidy, "--version"], capture_output=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError, json.JSONDecodeError) as e:
        print(f"clang-tidy-cached: {e}", file=sys.stderr)
        return 2
    cache = cache_dir()
    sources = [Path(os.path.realpath(f)) for f in args.files]
    failed = 0
    hits = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(check, s, args, commands, root, build, version, cache): s
                   for s in sources}
        for future in concurrent.futures.as_completed(futures):
            clean, report, hit = future.result()
            hits += hit
            if not clean:
                failed += 1
                print(f"{futures[future].relative_to(root)}:\n{report}", flush=True)
    print(f"clang-tidy: {len(sources) - failed} of {len(sources)} files clean, "
          + (f"{hits} of them unchanged since a clean run" if cache is not None else "cache off"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
