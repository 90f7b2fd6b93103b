"""`kvqual audit`'s judge at scale: wall, CPU and peak RSS of `judge.audit.judge_audit` on N synthetic outputs of
T tokens with top-5 (the audited outputs scored by the reference, and the reference's own outputs scored by it),
written through the library's writer (forced.ForcedWriter) and read back as the audit reads them.

    .venv/bin/python benchmarks/bench_audit_judge.py --outputs 2000 --tokens 1000

Issue 36's bar: an audit of 2,000 outputs x 1,000 tokens judges in seconds. Prints the figures; asserts that
every output was judged, never a time.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_judge import _fresh, _listed, _logprobs, _perturb  # noqa: E402  (the same synthetic distributions)

from kvqual.forced import Forced, ForcedWriter  # noqa: E402
from kvqual.gate import GatePolicy  # noqa: E402
from kvqual.judge.arms import forcing_of  # noqa: E402
from kvqual.judge.audit import judge_audit  # noqa: E402
from kvqual.records import Item, Sample  # noqa: E402
from kvqual.suites.outputs import SUITE  # noqa: E402

CHUNK = 50


def write(root: Path, n: int, t: int, k: int, seed: int = 0) -> tuple[dict, dict, dict, Path, Path]:
    rng = np.random.default_rng(seed)
    items, audited, floor = {}, {}, {}
    on_ref, own = root / "forced-reference.jsonl", root / "floor-forced.jsonl"
    with ForcedWriter(on_ref) as wa, ForcedWriter(own) as wf:
        for lo in range(0, n, CHUNK):
            c = min(CHUNK, n - lo)
            f_lp, f_ids = _fresh(rng, c, t, k)  # the reference's own outputs: its top-1 at most positions
            a_lp = _perturb(rng, f_lp, 0.05)
            a_ids = f_ids.copy()
            swap = rng.random((c, t)) < 0.03  # the audited text takes the 2nd choice at 3% of positions
            a_ids[swap, 0], a_ids[swap, 1] = f_ids[swap, 1], f_ids[swap, 0]
            a_lists, f_lists = _listed(a_lp, a_ids, k), _listed(f_lp, f_ids, k)
            for j in range(c):
                i = f"o{lo + j:05d}"
                key = (SUITE, i, 0)
                items[(SUITE, i)] = Item(i, SUITE, prompt=f"prompt {i}", max_tokens=t)
                for out, samples, ids, lists in ((wa, audited, a_ids, a_lists), (wf, floor, f_ids, f_lists)):
                    tok = ids[j, :, 0]
                    samples[key] = Sample(i, SUITE, 0, " ".join(f"w{x % 997}" for x in tok[:200]), "length", t, None,
                                          prompt_hash=i)
                    out.write(Forced(SUITE, i, 0, True, None, _logprobs(tok, *(a[j] for a in lists), "ids"), "ids"))
    return items, audited, floor, on_ref, own


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--outputs", type=int, default=2000)
    p.add_argument("--tokens", type=int, default=1000)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        items, audited, floor, on_ref, own = write(Path(tmp), a.outputs, a.tokens, 5)
        built = time.perf_counter() - t0
        order = sorted(audited)
        w0, c0 = time.perf_counter(), time.process_time()
        verdict, figures = judge_audit(items, audited, floor, forcing_of(on_ref), forcing_of(own), None, None,
                                       order, [len(order)], [len(order)], GatePolicy(looks=1), 1234)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert figures["scored"] == a.outputs and figures["floor_scored"] == a.outputs, figures
    print(f"{a.outputs} outputs x {a.tokens} tokens x top-5 (+ the floor's as many): written in {built:.1f} s; "
          f"judged in {wall:.2f} s wall, {cpu:.2f} s CPU; peak RSS {rss:,.0f} MB (the writing included); "
          f"{figures['tokens_scored']:,} audited tokens; verdict {verdict.verdict} "
          f"(top-1 {figures['same_top1_with_reference']['audited']:.2%} vs floor "
          f"{figures['same_top1_with_reference']['floor']:.2%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
