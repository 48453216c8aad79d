"""Profile one benchmark model with minfer: a Chrome trace file and the top op types.

    .venv/bin/python -m bench.profile resnet50 --batch 8 --out trace.json
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from bench.benchmark import random_feeds
from bench.models import build, models


def main(argv: Sequence[str] | None = None) -> int:
    import minfer_core
    from minfer_core.profile import summarize

    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("model", choices=models())
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=lambda t: t if t == "auto" else int(t), default=2, help="a count or auto")
    parser.add_argument("--out", default="trace.json")
    args = parser.parse_args(argv)
    model = build(args.model, args.batch)
    sess = minfer_core.InferenceSession(model, threads=args.threads)
    trace = sess.profile(random_feeds(model), args.out, repeat=args.repeat)
    print(f"{args.out}: {len(trace['traceEvents'])} events; per run:")
    for op, count, ms, share in summarize(trace):
        print(f"  {op:<24} {count // args.repeat:5d} nodes {ms / args.repeat:9.2f} ms {share:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
