"""Where the time goes in a py-spy profile (`--format raw`: collapsed stacks, one per line).

    python -m load.profile_summary load/results/profile/gate-every-stage-cache-hits.txt [--top 30]

Prints, as shares of all samples, the functions that hold the most time including what
they call (inclusive) and the ones where it is spent (self). `bench_gate --profile DIR`
writes the files.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

# py-spy names a frame "function (path/to/file.py:line)"; the line number is dropped so a
# function is one row.
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """`func (…/site-packages/grpc/aio/_server.py:12)` → `grpc/aio/_server.py:func`."""
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    path = match["file"]
    for marker in ("site-packages/", "/lib/python3", "/work/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{match['func']}"


def read_stacks(text: str) -> Counter[tuple[str, ...]]:
    """Each distinct stack (outermost first) and its sample count."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        stacks[tuple(frame_name(f) for f in stack.split(";"))] += int(count)
    return stacks


def shares(stacks: Counter[tuple[str, ...]]) -> tuple[int, Counter[str], Counter[str]]:
    """Total samples, samples per function with its callees (once per stack), and without."""
    total, inclusive, own = 0, Counter[str](), Counter[str]()
    for stack, count in stacks.items():
        total += count
        for name in set(stack):
            inclusive[name] += count
        if stack:
            own[stack[-1]] += count
    return total, inclusive, own


def summary(text: str, top: int = 30) -> str:
    total, inclusive, own = shares(read_stacks(text))
    if total == 0:
        return "no samples\n"
    lines = [f"{total} samples", "", "inclusive  function"]
    lines += [f"{100 * n / total:8.1f}%  {name}" for name, n in inclusive.most_common(top)]
    lines += ["", "self       function"]
    lines += [f"{100 * n / total:8.1f}%  {name}" for name, n in own.most_common(top)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    print(summary(args.file.read_text(), args.top), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
