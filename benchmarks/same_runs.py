"""Are two pipelines' training runs the same? Every run under both roots, tick by tick and weight by weight.

A speed-up must not change what a run computes: run the pipeline before and after it (same machine, seeds
and threads), then compare the two ``results/runs`` trees. For each run present in both: every logged value
of ``metrics.jsonl`` except the keys under ``--ignore`` (wall-clock times by default) must be equal to the
last bit, and every tensor of ``final/model.safetensors`` equal. Keys under ``--sparse`` may be logged at
fewer ticks by one side (a diagnostic measured less often); where both logged them they must be equal.

    .venv/bin/python benchmarks/same_runs.py /elsewhere/results/runs results/runs --sparse anchor/grad_cosine

Exit status 0 when every common run is the same, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def differences(
    base: Path, other: Path, a: list[dict], b: list[dict], ignore: tuple[str, ...], sparse: tuple[str, ...]
) -> list[str]:
    """What differs between two runs (folders ``base`` and ``other``, their ``metrics.jsonl`` rows ``a`` and
    ``b``) in the logged values and the final weights (empty: the same)."""
    found = []
    if [r["step"] for r in a] != [r["step"] for r in b]:
        return ["logged steps differ"]
    for ra, rb in zip(a, b, strict=True):
        keys = {k for k in ra.keys() | rb.keys() if not k.startswith(ignore)}
        for key in sorted(keys):
            if key.startswith(sparse) and (key not in ra or key not in rb):
                continue
            if ra.get(key) != rb.get(key):
                found.append(f"step {ra['step']} {key}: {ra.get(key)!r} != {rb.get(key)!r}")
    wa, wb = load_file(base / "final" / "model.safetensors"), load_file(other / "final" / "model.safetensors")
    if wa.keys() != wb.keys() or not all(torch.equal(wa[k], wb[k]) for k in wa):
        found.append("final weights differ")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("base", type=Path, help="a results/runs folder")
    parser.add_argument("other", type=Path, help="another results/runs folder")
    parser.add_argument(
        "--ignore", action="append", default=["time/"], help="key prefix left out (repeatable)"
    )
    parser.add_argument(
        "--sparse", action="append", default=[], help="key prefix one side may log less often"
    )
    args = parser.parse_args(argv)
    runs = sorted(p.parent.relative_to(args.base) for p in args.base.rglob("metrics.jsonl"))
    common = [r for r in runs if (args.other / r / "metrics.jsonl").is_file()]
    differing = 0
    sparse_ticks = [0, 0]  # ticks logging a --sparse key, in base and in other
    ignore, sparse = tuple(args.ignore), tuple(args.sparse)
    for run in common:
        logged = [rows(root / run / "metrics.jsonl") for root in (args.base, args.other)]
        found = differences(args.base / run, args.other / run, *logged, ignore, sparse)
        for side, side_rows in enumerate(logged):
            sparse_ticks[side] += sum(any(k.startswith(sparse) for k in r) for r in side_rows)
        if found:
            differing += 1
            more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
            print(f"{run}: {found[0]}{more}")
    print(
        f"{len(common)} runs in both ({len(runs)} in {args.base}); {len(common) - differing} the same in "
        f"every logged value but {', '.join(args.ignore)} and in their final weights, {differing} not"
    )
    if args.sparse:
        print(
            f"ticks logging {', '.join(args.sparse)}: {sparse_ticks[0]} in base, {sparse_ticks[1]} in other"
        )
    return 1 if differing or not common else 0


if __name__ == "__main__":
    sys.exit(main())
