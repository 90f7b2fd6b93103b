"""`kvqual report` at scale: wall, CPU and peak RSS of the offline judge on N synthetic items.

Issue 15's bar: 20,000 items x 256 tokens x top-5 (baseline, candidate, a 25% A/A replicate and
the three teacher-forced files) judged in <= 20 s and <= 2 GB peak RSS on one core, growing
linearly or better from 2k to 20k. The data is written only through the library's writers
(runner.new_manifest, store.RunStore, forced.save_forced), so it follows whatever
format they write; a cached data folder (--keep) is keyed by the source of kvqual's writing side.

    .venv/bin/python benchmarks/bench_judge.py --sizes 2000 5000 [--keep /tmp/kvqual-judge]
    .venv/bin/python benchmarks/bench_judge.py --sizes 2000 5000 20000 --data /tmp/kvqual-judge
        (judge folders generated earlier, when the writers changed but not what they write)
    .venv/bin/python -m pytest benchmarks/bench_judge.py --benchmark-enable -s -q
        (sizes from KVQUAL_BENCH_JUDGE_SIZES, default "500,2000"; cache in KVQUAL_BENCH_JUDGE_KEEP)

Each `kvqual report` runs in a child pinned to one core under an address-space cap; its CPU time
and peak RSS are that child's own (os.wait4). Prints a table; asserts the report judged every
item, never a time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

import kvqual
from kvqual.forced import teacher_file
from kvqual.forced import Forced, save_forced
from kvqual.config import Target
from kvqual.records import GenerationParams, Item, Sample, SuiteRef, TokenLogprobs
from kvqual.plan import RunPlan, in_fraction
from kvqual.runner import new_manifest
from kvqual.store import RunStore
from kvqual.suites import LoadedSuite, suite_hash

SUITES = (("math", True, 0.4), ("mcq", True, 0.3), ("chat", False, 0.3))  # name, scored, share of items
AA_FRACTION = 0.25
VOCAB = 32 ** 3  # token ids; each id is a distinct three-syllable word piece
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"][:32]
PIECES = [" " + SYLLABLES[i >> 10] + SYLLABLES[(i >> 5) & 31] + SYLLABLES[i & 31] for i in range(VOCAB)]
ID_NAMES = np.array([f"token_id:{i}" for i in range(VOCAB)], dtype=object)  # vLLM's return_tokens_as_token_ids
PIECE_NAMES = np.array(PIECES, dtype=object)
CHUNK = 256  # items generated per numpy batch
NOT_WRITERS = ("client.py", "cli.py", "commands.py", "options.py")  # modules no run is written through


@dataclass(frozen=True)
class Spec:
    """What one synthetic comparison holds."""

    items: int
    tokens: int = 256
    topk: int = 5
    token_format: str = "ids"  # "ids": tokens as "token_id:N" (exact teacher forcing); "text": word pieces
    seed: int = 0

    def key(self) -> str:
        """Cache key: the spec, this file and the source of kvqual but the parts that never write a
        run (the judge: judge/, gate/, report/; the compare's orchestration, compare/; the
        transport, the CLI, the reference server and the load driver): any change to how runs or
        teacher-forced files are written regenerates the data, a change to the judge or the client
        does not."""
        h = hashlib.sha256(repr(self).encode() + Path(__file__).read_bytes())
        package = Path(kvqual.__file__).parent
        for path in sorted(package.rglob("*.py")):
            part = path.relative_to(package).parts
            if part[0] in ("gate", "report", "serve", "load", "judge", "compare") or part[0] in NOT_WRITERS:
                continue
            h.update(str(part).encode() + path.read_bytes())
        return f"n{self.items}-t{self.tokens}-k{self.topk}-{self.token_format}-{h.hexdigest()[:12]}"


@dataclass(frozen=True)
class Folders:
    base: Path
    cand: Path
    aa: Path


# ---------------------------------------------------------------- synthetic logprobs (numpy)

def _fresh(rng: np.random.Generator, c: int, t: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(log-probs (c, t, k+1): k listed tokens + the unlisted tail, top-1 first; ids (c, t, k),
    distinct per position, column 0 the generated token). Gamma(0.3) mass: mostly peaked."""
    g = rng.gamma(0.3, size=(c, t, k + 1)) + 1e-12
    p = g / g.sum(-1, keepdims=True)
    p[..., :k] = -np.sort(-p[..., :k], axis=-1)
    first = rng.integers(0, VOCAB, size=(c, t, 1))
    steps = rng.integers(1, VOCAB // (k + 1), size=(c, t, k - 1))  # distinct ids: offsets sum below VOCAB
    ids = np.concatenate([first, (first + np.cumsum(steps, -1)) % VOCAB], -1)
    return np.log(p), ids


def _perturb(rng: np.random.Generator, lp: np.ndarray, sigma: float) -> np.ndarray:
    """The same tokens' log-probs with log-normal noise, renormalized over listed + tail."""
    x = lp + rng.normal(0.0, sigma, lp.shape)
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


def _listed(lp: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the scored token's log-prob (column 0), top-k log-probs sorted as a server lists them, their ids)."""
    order = np.argsort(-lp[..., :k], axis=-1)
    return lp[..., 0], np.take_along_axis(lp[..., :k], order, -1), np.take_along_axis(ids, order, -1)


def _logprobs(tok_ids: np.ndarray, tok_lp: np.ndarray, top_lp: np.ndarray, top_ids: np.ndarray,
              fmt: str) -> TokenLogprobs:
    """One position list as a server returns it: logprobs are float32 values widened to doubles."""
    names = ID_NAMES if fmt == "ids" else PIECE_NAMES  # object arrays: one fancy index names every token
    top_lp, tok_lp = (x.astype(np.float32).astype(np.float64) for x in (top_lp, tok_lp))
    tops = tuple(map(dict, map(zip, names[top_ids].tolist(), top_lp.tolist())))
    return TokenLogprobs(tuple(names[tok_ids].tolist()), tuple(tok_lp.tolist()), tops,
                         token_ids=tuple(tok_ids.tolist()) if fmt == "ids" else None)


# ---------------------------------------------------------------- the runs, through the library's writers

def _items(spec: Spec) -> tuple[LoadedSuite, ...]:
    suites, start = [], 0
    for n, (name, scored, share) in enumerate(SUITES):
        count = spec.items - start if n == len(SUITES) - 1 else round(spec.items * share)
        items = tuple(Item(id=f"{name}-{i:06d}", suite=name, prompt=f"Question {i} of {name}: explain, then answer.",
                           answer="42" if scored else None) for i in range(start, start + count))
        suites.append(LoadedSuite(SuiteRef(name, f"synthetic:{name}", suite_hash(items), count), items))
        start += count
    return tuple(suites)


def _plans(spec: Spec) -> tuple[RunPlan, RunPlan, RunPlan]:
    suites = _items(spec)
    params = GenerationParams(max_tokens=spec.tokens, top_logprobs=spec.topk, token_ids=spec.token_format == "ids")
    base_t = Target("bf16", ("http://127.0.0.1:8001/v1",), model="bench-model", kv_cache_dtype="auto")
    cand_t = Target("fp8", ("http://127.0.0.1:8002/v1",), model="bench-model", kv_cache_dtype="fp8")
    return (RunPlan(base_t, "bench-model", suites, params), RunPlan(cand_t, "bench-model", suites, params),
            RunPlan(base_t, "bench-model", suites, params, replicate=1, fraction=AA_FRACTION))


def _open(results: Path, plan: RunPlan, kv: str) -> RunStore:
    info = {"engine": "vllm", "models": [plan.model], "kv_cache_dtype": kv}
    return RunStore.open(results, new_manifest(plan, 64, info))


def _complete(s: RunStore, units: int, tokens: int) -> None:
    """Mark a run answered in full, as runner.execute does at the end of a run."""
    counts = {"units": units, "ok": units, "failed": 0, "completion_tokens_this_session": tokens,
              "plan_units": units, "retries": 0, "reconnects": 0}
    s.manifest = replace(s.manifest, status="complete", finished_at=time.time(), counts=counts)
    s.write_manifest()
    s.close()


class _Arm:
    """One generation run being written: its store and running totals."""

    def __init__(self, s: RunStore, clock: float) -> None:
        self.store, self.units, self.tokens, self.clock = s, 0, 0, clock

    def add(self, item: Item, ids: np.ndarray, lp: TokenLogprobs, score: float | None, finish: str,
            rng: np.random.Generator) -> None:
        length, text = len(ids), "".join(PIECE_NAMES[ids].tolist())
        latency = length / 45.0 * float(rng.uniform(0.8, 1.25))
        self.store.append(Sample(id=item.id, suite=item.suite, repeat=0, text=text, finish_reason=finish,
                                 completion_tokens=length, error=None, prompt_tokens=int(rng.integers(60, 400)),
                                 latency_s=latency, started_at=self.clock, logprobs=lp, score=score,
                                 base_url=self.store.manifest.base_urls[0]))
        self.clock += latency / 64  # 64 requests in flight
        self.units += 1
        self.tokens += length


def generate(spec: Spec, results: Path) -> Folders:
    """Write the three runs and the three teacher-forced files of `spec` under `results`."""
    base_p, cand_p, aa_p = _plans(spec)
    items = [i for s in base_p.suites for i in s.items]
    scored = {name for name, is_scored, _ in SUITES if is_scored}
    rng = np.random.default_rng(spec.seed)
    t0 = time.time() - 3600
    arms = [_Arm(_open(results, p, kv), t0) for p, kv in ((base_p, "auto"), (cand_p, "fp8"), (aa_p, "auto"))]
    base, cand, aa = arms
    folders = Folders(base.store.run_dir, cand.store.run_dir, aa.store.run_dir)
    forced_paths = (teacher_file(folders.base, base_p.run_id), teacher_file(folders.base, base_p.run_id, True),
                    teacher_file(folders.base, cand_p.run_id))
    T, K, fmt = spec.tokens, spec.topk, spec.token_format
    for lo in range(0, len(items), CHUNK):
        chunk = items[lo: lo + CHUNK]
        c = len(chunk)
        b_lp, b_ids = _fresh(rng, c, T, K)
        loops = rng.random(c) < 0.01  # a few baseline outputs end in a repetition loop
        b_ids[loops, T - 64:, :] = np.tile(b_ids[loops, T - 72: T - 64, :], (1, 8, 1))
        # free generation of the candidate and the A/A replicate: the baseline's tokens up to a divergence
        gens = []
        for p_div, sigma in ((0.3, 0.1), (0.1, 0.02)):
            f_lp, f_ids = _fresh(rng, c, T, K)
            div = np.where(rng.random(c) < p_div, rng.integers(0, T, c), T)
            same = (np.arange(T)[None, :] < div[:, None])[..., None]
            lengths = np.where(div < T, T - rng.integers(0, 33, c), T)
            gens.append((np.where(same, _perturb(rng, b_lp, sigma), f_lp), np.where(same, b_ids, f_ids), div, lengths))
        # teacher forcing of the baseline's tokens: on its own server (twice, near bit-identical) and the candidate's
        ff = [_perturb(rng, b_lp, s) for s in (0.01, 0.002, 0.1)]
        c_ids = b_ids.copy()
        swap = rng.random((c, T)) < 0.02  # the candidate's 5th token is another one at a few positions
        c_ids[swap, K - 1] = (c_ids[swap, 0] - 1) % VOCAB
        forced: list[list[Forced]] = [[], [], []]
        base_lists = _listed(b_lp, b_ids, K)
        gen_lists = [_listed(g[0], g[1], K) for g in gens]
        f_lists = [_listed(ff[0], b_ids, K), _listed(ff[1], b_ids, K), _listed(ff[2], c_ids, K)]
        for j, item in enumerate(chunk):
            truncated = rng.random() < 0.1
            score = float(rng.random() < 0.6) if item.suite in scored else None
            tok = b_ids[j, :, 0]
            base.add(item, tok, _logprobs(tok, *(a[j] for a in base_lists), fmt), score,
                     "length" if truncated else "stop", rng)
            for arm, (g_lp, g_ids, div, lengths), lists, wanted in (
                    (cand, gens[0], gen_lists[0], True),
                    (aa, gens[1], gen_lists[1], in_fraction(item.suite, item.id, AA_FRACTION))):
                if not wanted:
                    continue
                n = int(lengths[j])
                s = score if score is None or div[j] == T or rng.random() > 0.15 else 1.0 - score
                arm.add(item, g_ids[j, :n, 0], _logprobs(g_ids[j, :n, 0], *(a[j, :n] for a in lists), fmt), s,
                        "length" if n == T and truncated else "stop", rng)
            for out, lists in zip(forced, f_lists):
                out.append(Forced(item.suite, item.id, 0, True, None, _logprobs(tok, *(a[j] for a in lists), fmt),
                                  "ids" if fmt == "ids" else "text"))
        for path, out in zip(forced_paths, forced):
            save_forced(path, out)
    for arm in arms:
        _complete(arm.store, arm.units, arm.tokens)
    return folders


def cached(spec: Spec, root: Path) -> tuple[Folders, str]:
    """The data of `spec` under `root` (generated once; the marker is written last), and how long
    generating it took, in words."""
    done = root / spec.key()
    marker = done / "folders.json"
    if marker.is_file():
        print(f"{spec.items} items: reusing {done}", flush=True)
        paths = json.loads(marker.read_text())
        return Folders(*(done / paths[k] for k in ("base", "cand", "aa"))), "reused (cached)"
    partial = root / f"{spec.key()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    t0, c0 = time.perf_counter(), time.process_time()
    folders = generate(spec, partial / "results")
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    size = sum(f.stat().st_size for f in partial.rglob("*") if f.is_file()) / 2**20
    took = f"{wall:.1f} s wall, {cpu:.1f} s CPU, {size:,.0f} MiB on disk"
    print(f"generated {spec.items} items x {spec.tokens} tokens x top-{spec.topk}: {took}", flush=True)
    rel = {k: str(getattr(folders, k).relative_to(partial)) for k in ("base", "cand", "aa")}
    shutil.rmtree(done, ignore_errors=True)
    os.replace(partial, done)
    marker.write_text(json.dumps(rel))
    return Folders(*(done / rel[k] for k in ("base", "cand", "aa"))), took


# ---------------------------------------------------------------- measuring `kvqual report`

@dataclass(frozen=True)
class Measured:
    items: int
    wall_s: float
    cpu_s: float
    rss_mb: float
    rc: int
    error: str | None  # MemoryError, a traceback's last line, ...
    report: dict | None


# A fresh interpreter that runs the command and reports its rusage. Not measured from this process:
# a child's ru_maxrss starts from its parent's peak RSS (execve keeps the old address space's high
# water mark), and this process has just generated the data.
_LAUNCHER = """
import json, os, resource, sys, time
cpu, cap, log, cmd = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.sched_setaffinity(0, {cpu})
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.execv(cmd[0], cmd)
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": ru.ru_utime + ru.ru_stime,
                  "maxrss_kb": ru.ru_maxrss, "rc": os.waitstatus_to_exitcode(status)}))
"""


def judge(folders: Folders, out: Path, items: int, *, cpu: int, mem_gb: float, extra: list[str]) -> Measured:
    """`kvqual report` on the folders in a child pinned to core `cpu`, its address space capped at
    `mem_gb`: that child's own wall, CPU time and peak RSS (os.wait4 in a bare launcher)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "kvqual", "report", str(folders.base), str(folders.cand), "--aa", str(folders.aa),
           "--out", str(out / "report"), *extra]
    log = out / "kvqual-report.log"
    # cwd: no kvqual.toml there, so the built-in [gate] policy judges
    launched = subprocess.run([sys.executable, "-I", "-c", _LAUNCHER, str(cpu), str(int(mem_gb * 2**30)), str(log),
                               *cmd], cwd=out, capture_output=True, text=True, check=True)
    u = json.loads(launched.stdout)
    rc, text = u["rc"], log.read_text(errors="replace")
    error = None
    if "MemoryError" in text:
        error = f"MemoryError (address space capped at {mem_gb:g} GB)"
    elif rc < 0:
        error = f"killed by signal {-rc}"
    elif rc not in (0, 1, 3):  # pass, fail, inconclusive are verdicts; anything else is not
        error = (text.strip().splitlines() or [f"exit {rc}"])[-1][:200]
    path = out / "report" / "report.json"
    report = json.loads(path.read_text()) if path.is_file() else None
    return Measured(items, u["wall"], u["cpu"], u["maxrss_kb"] / 1024, rc, error, report)


def judged_everything(m: Measured, spec: Spec) -> list[str]:
    """What the report failed to judge (empty: accuracy, lengths, A/A and teacher-forced metrics
    over every item)."""
    r = m.report
    if r is None:
        return ["no report.json"]
    problems = []
    tf = r["teacher_forcing"]
    if not tf["enabled"] or tf["usable"] != spec.items:
        problems.append(f"teacher forcing: {tf['usable']} of {spec.items} usable ({tf['left_out']})")
    overall = r["suites"]["overall"]
    if (overall["generation"]["ab"] or {}).get("n") != spec.items:
        problems.append("length/generation pairs do not cover every item")
    if not overall["generation"]["aa"] or not overall["teacher"]["aa"] or r["runs"]["aa"] is None:
        problems.append("no A/A replicate or A/A teacher-forced floor")
    for name, scored, _ in SUITES:
        if scored and not (r["suites"].get(name) or {}).get("task", {}).get("ab"):
            problems.append(f"no accuracy for suite {name}")
    return problems


def table(rows: list[Measured]) -> str:
    lines = [f"{'items':>7} {'wall s':>8} {'CPU s':>8} {'peak RSS MB':>12} {'ms/item':>8} {'KB/item':>8}  exit",
             "-" * 66]
    for m in rows:
        lines.append(f"{m.items:>7} {m.wall_s:>8.1f} {m.cpu_s:>8.1f} {m.rss_mb:>12.0f} "
                     f"{1e3 * m.cpu_s / m.items:>8.2f} {1024 * m.rss_mb / m.items:>8.0f}  {m.rc}"
                     + (f"  {m.error}" if m.error else ""))
    ok = [m for m in rows if m.error is None]
    if len(ok) >= 2:
        a, b = ok[0], ok[-1]
        k = b.items / a.items
        lines.append(f"growth {a.items} -> {b.items} items (x{k:g}): CPU x{b.cpu_s / a.cpu_s:.2f} "
                     f"(exponent {np.log(b.cpu_s / a.cpu_s) / np.log(k):.2f}), peak RSS x{b.rss_mb / a.rss_mb:.2f}, "
                     f"marginal RSS {1024 * (b.rss_mb - a.rss_mb) / (b.items - a.items):.0f} KB/item "
                     "(linear: exponent 1.00)")
    return "\n".join(lines)


def given(spec: Spec, data: Path) -> tuple[Folders, str]:
    """The folder of `spec` under `data` whatever its key (`--data`): one generated by an earlier
    tree, for a tree whose writers changed without changing what they write."""
    found = sorted(d for d in data.glob(f"n{spec.items}-t{spec.tokens}-k{spec.topk}-{spec.token_format}-*")
                   if (d / "folders.json").is_file())
    if not found:
        raise SystemExit(f"{data}: no generated folder for {spec.items} items (run once with --keep {data})")
    paths = json.loads((found[-1] / "folders.json").read_text())
    print(f"{spec.items} items: reusing {found[-1]} (--data: its key is not checked)", flush=True)
    return Folders(*(found[-1] / paths[k] for k in ("base", "cand", "aa"))), f"reused ({found[-1].name}, --data)"


def run(sizes: list[int], keep: Path | None, *, tokens: int = 256, topk: int = 5, token_format: str = "ids",
        cpu: int = 0, mem_gb: float = 14.0, extra: list[str] | None = None, data: Path | None = None) -> list[Measured]:
    """Generate (or reuse) each size, judge it once, print the table; returns the measurements."""
    with tempfile.TemporaryDirectory(prefix="kvqual-judge-") as tmp:
        root = keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        rows, generation = [], []
        for n in sizes:
            spec = Spec(n, tokens, topk, token_format)
            folders, took = given(spec, data) if data is not None else cached(spec, root)
            generation.append(f"{n}: {took}")
            m = judge(folders, Path(tmp) / f"judge-{n}", n, cpu=cpu, mem_gb=mem_gb, extra=extra or [])
            problems = judged_everything(m, spec) if m.error is None else []
            print(f"{n} items: {m.wall_s:.1f} s wall, {m.cpu_s:.1f} s CPU, {m.rss_mb:.0f} MB peak RSS, exit {m.rc}"
                  + (f", {m.error}" if m.error else "") + (f"; NOT JUDGED: {'; '.join(problems)}" if problems else ""),
                  flush=True)
            rows.append(replace(m, error=m.error or ("; ".join(problems) or None)))
        cmd = f"kvqual report BASE CAND --aa AA --out OUT {shlex.join(extra or [])}".strip()
        print(f"\n`{cmd}` pinned to core {cpu}, address space <= {mem_gb:g} GB; "
              f"{tokens} tokens x top-{topk} ({token_format}), A/A on {AA_FRACTION:.0%} of items\n{table(rows)}\n"
              f"data generation (not in the figures above): {'; '.join(generation)}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[2000, 5000, 20000], help="items per comparison")
    p.add_argument("--tokens", type=int, default=256, help="completion tokens per item")
    p.add_argument("--topk", type=int, default=5)
    p.add_argument("--token-format", choices=("ids", "text"), default="ids",
                   help='"ids": vLLM token_id:N strings (exact teacher forcing); "text": word pieces')
    p.add_argument("--keep", type=Path, help="cache the generated folders here (reused while the writers are unchanged)")
    p.add_argument("--data", type=Path, help="judge the folders generated earlier under this --keep folder, "
                   "whatever the writers' source now (when they changed without changing what they write)")
    p.add_argument("--cpu", type=int, default=0, help="the core the judge is pinned to")
    p.add_argument("--mem-gb", type=float, default=14.0, help="address-space cap of the judge (a MemoryError beyond)")
    p.add_argument("--report-args", default="", help='extra `kvqual report` arguments, e.g. "--fixed-n"')
    a = p.parse_args(argv)
    rows = run(a.sizes, a.keep, tokens=a.tokens, topk=a.topk, token_format=a.token_format, cpu=a.cpu,
               mem_gb=a.mem_gb, extra=shlex.split(a.report_args), data=a.data)
    return 0 if all(m.error is None for m in rows) else 1


def test_judge_scaling(benchmark) -> None:
    sizes = [int(s) for s in os.environ.get("KVQUAL_BENCH_JUDGE_SIZES", "500,2000").split(",")]
    keep = os.environ.get("KVQUAL_BENCH_JUDGE_KEEP")
    rows = benchmark.pedantic(run, args=(sizes, Path(keep) if keep else None), rounds=1, iterations=1)
    assert [m.error for m in rows] == [None] * len(rows)  # every size judged in full (timings are only printed)


if __name__ == "__main__":
    sys.exit(main())
