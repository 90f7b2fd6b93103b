"""Faults between kvqual and its servers (tests/faultproxy.py in front of tests/fakeserver.py):
connection resets, 503s, 429s, stalls past the request timeout, bodies cut mid-JSON and a server
restart must cost retries, never an answer: every unit once, the same answers and the same report
as on clean servers. Faults beyond the retries are an infrastructure failure (exit 4), never a
verdict, a crash or a traceback."""

from __future__ import annotations

import asyncio
import json
import re
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kvqual.forced import FAILED, Forced, load_forced
from kvqual.forcing.teacher import force_all
from kvqual.records import Item, Sample, TokenLogprobs
from kvtest import free_port, write_suite

PROXY = Path(__file__).with_name("faultproxy.py")
RATES = ("--reset", "0.10", "--http503", "0.05", "--http429", "0.02", "--stall", "0.02", "--truncate", "0.02")
REQUESTS = r"^/v1/(chat/)?completions$|^/tokenize$"  # what the runner and teacher forcing send (and retry)
SERVER_INFO = r"^/v1/models$|^/get_server_info$|^/metrics$"  # what the probe asks before each run
ECHO = r'"echo": ?true'  # a teacher-forcing request
# a small timeout, so a stall costs little; retries enough to absorb the rates above; fixed-n (one round)
# and the share of broken prompts at 2%, which these suites' few hundred prompts can bound (1% takes ~400)
RUN = "[run]\ntimeout = 2\nretries = 8\nconcurrency = 16\nmax_tokens = 8\n[gate]\nlooks = 1\nmax_broken_share = 0.02\n"
N = 100


# ---------------------------------------------------------------- teacher forcing resumes (no server)

class StubForcer:
    """Answers `force` at once, except for ids in `hold` (never answered until cancelled) and ids
    in `fail` (a request that failed for good); records what it was asked."""

    def __init__(self, hold: set[str] = frozenset(), fail: set[str] = frozenset()) -> None:
        self.hold, self.fail, self.asked = hold, fail, []

    async def force(self, item: Item, sample: Sample) -> Forced:
        self.asked.append(sample.id)
        if sample.id in self.hold:
            await asyncio.Event().wait()
        if sample.id in self.fail:
            return Forced(sample.suite, sample.id, sample.repeat, False, f"{FAILED}: HTTP 503", None)
        await asyncio.sleep(0)
        lp = TokenLogprobs(tokens=(" x",), token_logprobs=(-0.5,), top_logprobs=({" x": -0.5},))
        return Forced(sample.suite, sample.id, sample.repeat, True, None, lp, "text")


def _forcing_inputs(n: int) -> tuple[list[str], dict[tuple[str, str], Item], list[Sample]]:
    """n completions items q0…q(n−1) and a one-token baseline answer for each."""
    ids = [f"q{i}" for i in range(n)]
    items = {("s", i): Item(id=i, suite="s", prompt=f"{i}?") for i in ids}
    samples = [Sample(id=i, suite="s", repeat=0, text=" x", finish_reason="stop", completion_tokens=1, error=None)
               for i in ids]
    return ids, items, samples


def test_an_interrupted_forcing_pass_keeps_what_it_scored(tmp_path):
    ids, items, samples = _forcing_inputs(6)
    out = tmp_path / "teacher.jsonl"

    async def interrupted() -> None:
        task = asyncio.ensure_future(force_all(StubForcer(hold={"q4", "q5"}), items, samples, out))
        deadline = time.monotonic() + 5
        while len(load_forced(out)) < 4:  # each result is on disk as soon as it is scored
            assert time.monotonic() < deadline, "scored results were not written while the pass ran"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(interrupted())
    assert sorted(load_forced(out)) == [("s", i, 0) for i in ids[:4]]
    with out.open("a") as fh:
        fh.write('{"suite": "s", "id": "q4", "rep')  # a line torn by a kill
    second = StubForcer(fail={"q5"})
    got = asyncio.run(force_all(second, items, samples, out))
    assert sorted(second.asked) == ["q4", "q5"]  # only what the first pass did not finish
    assert [f.id for f in got] == ids and got[5].reason.startswith(FAILED)
    third = StubForcer()
    got = asyncio.run(force_all(third, items, samples, out))
    assert third.asked == ["q5"] and all(f.aligned for f in got)  # a failed one is asked again
    assert sorted(load_forced(out)) == [("s", i, 0) for i in ids]  # the torn line did not swallow the next


def test_two_passes_into_one_teacher_file_are_refused_not_interleaved(tmp_path):
    """Two compares that reuse one baseline force into the same file: the second is refused (exit 2)
    while the first holds it, and the first's lines are all there, once each."""
    from kvqual.errors import UsageError

    ids, items, samples = _forcing_inputs(4)
    out = tmp_path / "teacher.jsonl"

    async def both() -> None:
        first = asyncio.ensure_future(force_all(StubForcer(hold={"q3"}), items, samples, out))
        while len(load_forced(out)) < 3:
            await asyncio.sleep(0.01)
        with pytest.raises(UsageError, match="another kvqual process is teacher-forcing"):
            await force_all(StubForcer(), items, samples, out)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first

    asyncio.run(both())
    lines = [ln for ln in out.read_text().splitlines() if ln.strip()]
    assert len(lines) == 3 and sorted(load_forced(out)) == [("s", i, 0) for i in ids[:3]]
    assert [f.id for f in asyncio.run(force_all(StubForcer(), items, samples, out))] == ids  # freed with the pass


# ---------------------------------------------------------------- the proxy and the runs through it

class Proxy:
    def __init__(self, upstream_port: int, *flags: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, str(PROXY), "--port", str(self.port), "--upstream",
                                      f"http://127.0.0.1:{upstream_port}", "--stall-s", "30", *flags],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.faults()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"fault proxy exited with {self.proc.returncode}")
                time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError("fault proxy did not start")

    def faults(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/__faults", timeout=5) as r:
            return json.load(r)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def proxy():
    """Factory: `proxy(upstream_port, "--reset", "0.1")` starts one; all are stopped after the test."""
    started: list[Proxy] = []

    def factory(upstream_port: int, *flags: str) -> Proxy:
        p = Proxy(upstream_port, *flags)
        started.append(p)
        return p

    yield factory
    for p in started:
        p.stop()


def items(n: int) -> list[dict]:
    """Completions items, and every fifth a chat item (both request paths)."""
    out = []
    for i in range(n):
        prompt = f"Question {i}: [[answer={i}]] A:"
        out.append({"id": f"q{i}", "answer": str(i), "scorer": "exact",
                    **({"messages": [{"role": "user", "content": prompt}]} if i % 5 == 4 else {"prompt": prompt})})
    return out


def workdir(path: Path, base_url: str, cand_url: str, n: int = N) -> Path:
    path.mkdir()
    write_suite(path / "s.jsonl", items(n))
    (path / "kvqual.toml").write_text(
        f'[targets.base]\nbase_url = "{base_url}"\nkv_cache_dtype = "bf16"\n'
        f'[targets.cand]\nbase_url = "{cand_url}"\nkv_cache_dtype = "fp8_e4m3"\n' + RUN)
    return path


def start(cwd: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kvqual", *args], cwd=cwd, env={**os.environ, "CI": "true"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def answers(lines: list[dict]) -> dict:
    return {(r["suite"], r["id"], r["repeat"]): (r["text"], r["finish_reason"], r["completion_tokens"],
                                                 r["logprobs"], r["error"]) for r in lines}


def teacher_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def report_of(path: Path) -> dict:
    report, = path.glob("results/compare-*/report.json")
    return json.loads(report.read_text())


def figures(report: dict) -> dict:
    """What must not move when faults cost only retries: the verdict, every criterion's status,
    estimate and interval, the per-suite metrics, and the teacher-forcing counts."""
    v = report["verdict"]
    return {"verdict": v["verdict"],
            "criteria": [{k: c.get(k) for k in ("name", "suite", "status", "estimate", "ci_low", "ci_high", "n")}
                         for c in v["criteria"]],
            "suites": report["suites"],  # teacher forcing's counts, not what the faults cost it (its `cost`)
            "teacher_forcing": {k: v for k, v in report["teacher_forcing"].items() if k != "cost"}}


def test_faults_cost_retries_never_answers(tmp_path, fake_server, proxy):
    base = fake_server("--kv-cache-dtype", "bf16")
    cand = fake_server("--kv-cache-dtype", "fp8_e4m3", "--logprob-noise", "0.05")
    pb = proxy(base.port, "--seed", "1", *RATES, "--paths", REQUESTS, "--restart-after", "60")
    pc = proxy(cand.port, "--seed", "2", *RATES, "--paths", REQUESTS)
    faulty = workdir(tmp_path / "faulty", pb.base_url, pc.base_url)
    clean = workdir(tmp_path / "clean", base.base_url, cand.base_url)
    t0 = time.monotonic()

    # the clean compare runs beside the faulty run and the faulty compare; that compare reuses the run as
    # its baseline, and sends the A/A replicate, the candidate's answers and teacher forcing through the proxies
    clean_compare = start(clean, "compare", "base", "cand", "--suite", "s.jsonl")
    rc, _, err = finish(start(faulty, "run", "base", "--suite", "s.jsonl"))
    assert rc == 0 and "Traceback" not in err, err
    t1 = time.monotonic()
    faulty_compare = start(faulty, "compare", "base", "cand", "--suite", "s.jsonl")
    rc_clean, out_clean, err_clean = finish(clean_compare)
    assert rc_clean in (0, 1, 3), out_clean + err_clean
    rep_clean = report_of(clean)
    run_dir, = (faulty / "results").glob("base-*")
    lines = rows(run_dir)
    assert sorted(r["id"] for r in lines) == sorted(i["id"] for i in items(N))  # every id exactly once
    assert all(r["error"] is None for r in lines)
    assert answers(lines) == answers(rows(clean / "results" / rep_clean["runs"]["baseline"]["run_id"]))
    attempts_run = sum(r["attempts"] for r in lines)
    assert attempts_run > N  # the faults were retried (else the proxy did nothing)

    rc, out, err = finish(faulty_compare)
    t_compare = time.monotonic() - t1
    assert rc == rc_clean and "Traceback" not in err, out + err
    rep = report_of(faulty)
    assert figures(rep) == figures(rep_clean)
    # what the faults cost teacher forcing is said, not hidden (the clean compare's passes cost nothing)
    assert re.search(r"teacher forcing .* on cand: \d+ s, \d+ requests \(\d+ attempts after a failure", err), err
    assert not re.search(r"\([1-9]\d* attempts after a failure", err_clean), err_clean
    cost, clean_cost = rep["teacher_forcing"]["cost"], rep_clean["teacher_forcing"]["cost"]
    assert cost["candidate"]["retried"] > 0 and cost["baseline"]["retried"] > 0, cost  # report.json says it too
    assert clean_cost["candidate"]["retried"] == clean_cost["baseline"]["retried"] == 0, clean_cost
    assert cost["candidate"]["requests"] >= N * 4 // 5, cost
    assert rep["teacher_forcing"]["usable"] == N * 4 // 5  # completions items forced; chat ones counted apart
    attempts = {}
    for arm in ("baseline", "candidate", "aa"):
        lines = rows(faulty / "results" / rep["runs"][arm]["run_id"])
        keys = [(r["suite"], r["id"], r["repeat"]) for r in lines]
        assert len(keys) == len(set(keys))  # every unit once
        assert answers(lines) == answers(rows(clean / "results" / rep_clean["runs"][arm]["run_id"]))
        attempts[arm] = sum(r["attempts"] for r in lines)
    base_id, cand_id = (rep["runs"][a]["run_id"] for a in ("baseline", "candidate"))
    clean_base, clean_cand = (rep_clean["runs"][a]["run_id"] for a in ("baseline", "candidate"))
    for scorer, clean_scorer, again in ((base_id, clean_base, ""), (base_id, clean_base, "-again"),
                                        (cand_id, clean_cand, "")):
        forced = teacher_lines(faulty / "results" / base_id / f"teacher-by-{scorer}{again}.jsonl")
        keys = [(f["suite"], f["id"], f["repeat"]) for f in forced]
        assert len(keys) == len(set(keys)) == N  # each forced once, no failed line left to ask again
        clean_forced = teacher_lines(clean / "results" / clean_base / f"teacher-by-{clean_scorer}{again}.jsonl")
        assert {k: f for k, f in zip(keys, forced)} == {(f["suite"], f["id"], f["repeat"]): f for f in clean_forced}
    injected = {"base": pb.faults(), "cand": pc.faults()}
    assert injected["base"]["restarts"] == 1 and all(p["faults"].get(k) for p in injected.values()
                                                      for k in ("reset", "http503", "http429"))
    print(json.dumps({"seconds": round(time.monotonic() - t0, 1), "faulty_compare_s": round(t_compare, 1),
                      "attempts": {"run": attempts_run, **attempts},
                      "proxies": {k: {"requests": v["requests"], "restarts": v["restarts"], "faults": v["faults"]}
                                  for k, v in injected.items()}}))  # figures for the record (pytest -s)


def beyond_the_retries(tmp_path: Path, fake_server, proxy, name: str, arm: str, *flags: str) -> subprocess.Popen:
    """A compare of 20 items with `--retries 1`, the `arm` server behind a proxy with `flags`."""
    servers = {"base": fake_server("--kv-cache-dtype", "bf16"), "cand": fake_server("--kv-cache-dtype", "fp8_e4m3")}
    urls = {k: v.base_url for k, v in servers.items()}
    urls[arm] = proxy(servers[arm].port, "--seed", "3", *flags).base_url
    work = workdir(tmp_path / name, urls["base"], urls["cand"], n=20)
    return start(work, "compare", "base", "cand", "--suite", "s.jsonl", "--retries", "1")


def test_faults_beyond_the_retries_are_infrastructure(tmp_path, fake_server, proxy):
    """Exit 4 with a one-line message: every answer failed, or so many resets in a row that the
    server is taken for down."""
    cases = {"503 on the candidate's requests": ("cand", "--http503", "1.0", "--paths", REQUESTS),
             "resets on the baseline's requests": ("base", "--reset", "1.0", "--paths", REQUESTS)}
    procs = {name: beyond_the_retries(tmp_path, fake_server, proxy, f"w{i}", *case)
             for i, (name, case) in enumerate(cases.items())}  # at once: each waits mostly on its own start-up
    for name, proc in procs.items():
        rc, out, err = finish(proc)
        assert "Traceback" not in err + out, name
        assert rc == 4, f"{name}: exit {rc}\n{out}{err}"
        assert err.strip().splitlines()[-1].startswith("kvqual: error: "), name


def test_teacher_forcing_failing_beyond_the_retries_is_infrastructure(tmp_path, fake_server, proxy):
    rc, out, err = finish(beyond_the_retries(tmp_path, fake_server, proxy, "w", "cand", "--http503", "1.0",
                                             "--body", ECHO))
    assert "Traceback" not in err + out
    assert rc == 4, out + err


def test_probe_retries_transient_faults(tmp_path, fake_server, proxy):
    base = fake_server("--kv-cache-dtype", "bf16", "--metrics")
    # seed 7: /v1/models answers at the 3rd ask (503, reset), /get_server_info at the 2nd, /metrics at the 3rd
    pb = proxy(base.port, "--seed", "7", "--reset", "0.2", "--http503", "0.3", "--paths", SERVER_INFO)
    work = workdir(tmp_path / "w", pb.base_url, pb.base_url, n=10)
    rc, out, err = finish(start(work, "run", "base", "--suite", "s.jsonl"))
    assert rc == 0, out + err
    manifest = json.loads(next((work / "results").glob("base-*/manifest.json")).read_text())
    assert manifest["server_info"]["kv_cache_dtype"] == "bf16"  # from /get_server_info
    assert manifest["server_info"]["engine"] == "vllm"  # from /metrics; it decides token_ids, part of the run's key
    by_path = pb.faults()["by_path"]
    assert by_path["/v1/models"] == {"http503": 1, "reset": 1} and by_path["/get_server_info"] == {"reset": 1}


@pytest.mark.parametrize("mode", [("--looks", "3"), ("--fixed-n",)], ids=["sequential", "fixed-n"])
def test_a_whole_compare_through_faults_equals_the_clean_one_three_times(tmp_path, fake_server, proxy, mode):
    """The reliability issue's bar: a full compare — baseline, A/A replicate, candidate, teacher forcing,
    every look — with resets, 503s, 429s, stalls and cut bodies between kvqual and both servers gives
    the clean compare's verdict and figures, three times in a row with three fault draws. (Before one
    retry policy, a teacher-forcing request lost to disconnects turned a PASS into INCONCLUSIVE.)"""
    n = 300  # two looks or more: 124, then the pool
    base = fake_server("--kv-cache-dtype", "bf16")
    cand = fake_server("--kv-cache-dtype", "fp8_e4m3", "--logprob-noise", "0.05")
    flags = ("compare", "base", "cand", "--suite", "s.jsonl", *mode)
    clean = workdir(tmp_path / "clean", base.base_url, cand.base_url, n=n)
    rc_clean, out_clean, err_clean = finish(start(clean, *flags))
    assert rc_clean in (0, 1, 3) and "Traceback" not in err_clean, out_clean + err_clean
    want = figures(report_of(clean))
    looks = len(report_of(clean)["verdict"]["sequential"]["looks"])
    assert looks >= 2 if "--looks" in mode else looks == 1  # the sequential compare judged two looks (PASS at 300)
    for seed in (11, 12, 13):
        pb = proxy(base.port, "--seed", str(seed), *RATES, "--paths", REQUESTS)
        pc = proxy(cand.port, "--seed", str(seed + 100), *RATES, "--paths", REQUESTS)
        faulty = workdir(tmp_path / f"faulty-{seed}", pb.base_url, pc.base_url, n=n)
        rc, out, err = finish(start(faulty, *flags))
        assert rc == rc_clean and "Traceback" not in err, out + err
        rep = report_of(faulty)
        assert figures(rep) == want, seed
        assert len(rep["verdict"]["sequential"]["looks"]) == looks
        injected = pb.faults()["faults"], pc.faults()["faults"]
        assert all(sum(f.values()) > 0 for f in injected), injected  # faults were injected on both sides
        for arm in ("baseline", "candidate", "aa"):
            lines = rows(faulty / "results" / rep["runs"][arm]["run_id"])
            keys = [(r["suite"], r["id"], r["repeat"]) for r in lines]
            assert len(keys) == len(set(keys)) and all(r["error"] is None for r in lines)  # 0 lost, 0 duplicated


def test_a_hung_server_is_an_infrastructure_fault_in_seconds_not_an_hour(tmp_path, fake_server, proxy):
    """After 40 requests every request to the candidate hangs, /health too, under the default
    timeout (600 s) and retries (5): about an hour before the first failure counted, without the
    liveness check. With `--stall-seconds 3` the compare stops with exit 4 within seconds, one line
    naming the server, and keeps what was answered."""
    base, cand = fake_server("--kv-cache-dtype", "bf16"), fake_server("--kv-cache-dtype", "fp8_e4m3")
    hung = proxy(cand.port, "--hang-after", "40")
    work = workdir(tmp_path / "w", base.base_url, hung.base_url)
    t0 = time.monotonic()
    rc, out, err = finish(start(work, "compare", "base", "cand", "--suite", "s.jsonl", "--timeout", "600",
                                "--retries", "5", "--stall-seconds", "3"))
    took = time.monotonic() - t0
    assert rc == 4, out + err
    assert took < 60, took
    last = err.strip().splitlines()[-1]
    print(json.dumps({"seconds": round(took, 1), "last_line": last}))  # for the record (pytest -s)
    assert last.startswith("kvqual: error: cand") and "did not answer its health check 3 times" in last, last
    assert "Traceback" not in out + err
    cand_run, = [d for d in (work / "results").iterdir() if d.name.startswith("cand-")]
    kept = [r for r in rows(cand_run) if not r.get("error")]
    assert kept and all(r["text"] for r in kept)  # what was answered before the hang is on disk
    assert json.loads((cand_run / "manifest.json").read_text())["status"] == "incomplete"


def test_a_server_that_hangs_during_teacher_forcing_is_an_infrastructure_fault_in_seconds(tmp_path, fake_server,
                                                                                          proxy):
    base, cand = fake_server("--kv-cache-dtype", "bf16"), fake_server("--kv-cache-dtype", "fp8_e4m3")
    hung = proxy(cand.port, "--hang-after", "125")  # the candidate's answers (100 and its probes) get through
    work = workdir(tmp_path / "w", base.base_url, hung.base_url)
    rc, out, err = finish(start(work, "compare", "base", "cand", "--suite", "s.jsonl", "--timeout", "600",
                                "--retries", "5", "--stall-seconds", "3"))
    assert rc == 4, out + err
    last = err.strip().splitlines()[-1]
    assert last.startswith("kvqual: error: cand: teacher forcing: no answer for"), last


def test_one_answer_refused_for_good_at_the_coverage_minimum_is_infrastructure_never_more_items(
        tmp_path, fake_server, proxy):
    """Issue 53: a fifth of the items are chat (no token ids: no token metrics), so token coverage sits
    at its 80% minimum; one baseline answer refused for good (1%, inside max_failed_rate) left 79/99 and
    the gate asked for "~1 more items" from a spent pool (exit 3). The shortfall is the failure's: exit 4,
    one short line that says to run again, and no note that would judge the same files again."""
    base = fake_server("--kv-cache-dtype", "bf16")
    cand = fake_server("--kv-cache-dtype", "fp8_e4m3", "--echo-noise", "1e-6")  # as good, its scoring not blind
    refuse = proxy(base.port, "--http503", "1.0", "--paths", REQUESTS, "--body", r"Question 0: \[\[")
    work = workdir(tmp_path / "w", refuse.base_url, cand.base_url)
    rc, out, err = finish(start(work, "compare", "base", "cand", "--suite", "s.jsonl", "--retries", "1"))
    assert rc == 4 and "Traceback" not in err, out + err
    tf = report_of(work)["teacher_forcing"]
    assert (tf["pairs"], tf["usable"]) == (N - 1, N * 4 // 5 - 1), tf  # the refused pair is out of the coverage
    first = out.splitlines()[0]
    assert "infrastructure" in first and "run the same command again" in first and len(first) < 300, first
    assert out.splitlines()[1].startswith("next: Run the same command again"), out
    assert "token metrics on 79 of 99 pairs (79.7%)" in out  # it read "(80%)" beside the gate's 79.7% < 80%
    assert not list((work / "results" / ".compares").glob("*.json"))  # run again, it asks the servers again


def test_one_deadline_for_every_request_flush_cache_included(tmp_path, fake_server, proxy):
    """Issue 53: `/flush_cache` was asked with a fixed 30 s timeout while `--timeout 3` held elsewhere
    (a run took 35.6 s, 30 of them silent). A server that never answers it costs the run's timeout."""
    server = fake_server("--kv-cache-dtype", "bf16")
    hangs = proxy(server.port, "--stall", "1.0", "--paths", r"^/flush_cache$")
    work = workdir(tmp_path / "w", hangs.base_url, hangs.base_url, n=10)
    t0 = time.monotonic()
    rc, out, err = finish(start(work, "run", "base", "--suite", "s.jsonl", "--timeout", "2"))
    took = time.monotonic() - t0
    assert rc == 0, out + err
    assert hangs.faults()["by_path"] == {"/flush_cache": {"stall": 1}}  # it was asked, and never answered
    assert took < 28, took  # the fixed 30 s alone was more
