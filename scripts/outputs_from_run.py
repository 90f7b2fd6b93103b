"""Write a kvqual run's answers as an outputs file `kvqual audit` reads (docs/audit.md).

    .venv/bin/python scripts/outputs_from_run.py results/<run-id> outputs.jsonl

One line per answered sample: the item's prompt (or messages), the completion, its token ids where the run
recorded them, its finish reason and the max_tokens it was generated with; `category` where the item has one.
The run's suites are loaded again from its manifest (same seed), so the prompts are the ones it sent.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvqual.records import RunManifest, dumps_line
from kvqual.store import load_samples
from kvqual.suites import load_suites


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("out")
    args = p.parse_args(argv)
    run = Path(args.run_dir)
    manifest = RunManifest.from_json(json.loads((run / "manifest.json").read_text(encoding="utf-8")))
    specs = [f"{s.source.split('?seed=')[0]}@{s.n_items}" if s.source.startswith("builtin:") else s.source
             for s in manifest.suites]  # a built-in suite as the run drew it: its seed, its first n_items
    suites = load_suites(specs, seed=manifest.params.seed, limit=manifest.limit)
    items = {(i.suite, i.id): i for s in suites for i in s.items}
    written = 0
    with open(args.out, "w", encoding="utf-8") as fh:
        for s in load_samples(run, "tokens").values():
            item = items.get((s.suite, s.id))
            if not s.ok or item is None:
                continue
            line = {"id": f"{s.suite}/{s.id}/{s.repeat}", **item.to_json(), "completion": s.text,
                    "finish_reason": s.finish_reason, "max_tokens": item.max_tokens or manifest.params.max_tokens}
            line["id"] = f"{s.suite}/{s.id}/{s.repeat}"
            for key in ("answer", "scorer", "scorer_params", "meta"):
                line.pop(key, None)
            if s.logprobs is not None and s.logprobs.token_ids is not None:
                line["completion_token_ids"] = list(s.logprobs.token_ids)
            if item.category is None:
                line["category"] = s.suite
            fh.write(dumps_line(line))
            written += 1
    print(f"{written} outputs of {manifest.run_id} ({manifest.target}) written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
