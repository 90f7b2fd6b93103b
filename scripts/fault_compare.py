"""A compare through faults at the size of the reliability issue (34): `compare --fixed-n` over 1,000 items
against the fake servers, clean, then through tests/faultproxy.py on both servers (resets 10%, 503 5%,
429 2%, stalls 2%, cut bodies 2% of generation and teacher-forcing requests) with three fault draws,
the retries at their default (5), a 2 s request timeout (so a 30 s stall costs 2 s). Prints one JSON line a compare: verdict, whether every figure equals the clean
compare's, per arm (lines, unique keys, errors, attempts), the faults injected, teacher forcing's cost.

    .venv/bin/python scripts/fault_compare.py /tmp/fault-compare     (~3 min on 2 cores)
"""
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from kvtest import start_fake
import test_fault_injection as T

root = Path(sys.argv[1]); root.mkdir(parents=True, exist_ok=True)
n = 1000
base = start_fake("--kv-cache-dtype", "bf16")
cand = start_fake("--kv-cache-dtype", "fp8_e4m3", "--logprob-noise", "0.05")
proxies = []
flags = ("compare", "base", "cand", "--suite", "s.jsonl", "--fixed-n", "--retries", "5")
try:
    t0 = time.monotonic()
    clean = T.workdir(root / "clean", base.base_url, cand.base_url, n=n)
    proc = T.start(clean, *flags); out, err = proc.communicate(timeout=1800); rc_clean = proc.returncode
    want = T.figures(T.report_of(clean))
    print(json.dumps({"run": "clean", "rc": rc_clean, "verdict": want["verdict"], "s": round(time.monotonic() - t0, 1)}), flush=True)
    for seed in (21, 22, 23):
        t0 = time.monotonic()
        pb = T.Proxy(base.port, "--seed", str(seed), *T.RATES, "--paths", T.REQUESTS); proxies.append(pb)
        pc = T.Proxy(cand.port, "--seed", str(seed + 100), *T.RATES, "--paths", T.REQUESTS); proxies.append(pc)
        faulty = T.workdir(root / f"faulty-{seed}", pb.base_url, pc.base_url, n=n)
        proc = T.start(faulty, *flags); out, err = proc.communicate(timeout=1800)
        rep = T.report_of(faulty)
        lost_dup = []
        for arm in ("baseline", "candidate", "aa"):
            lines = T.rows(faulty / "results" / rep["runs"][arm]["run_id"])
            keys = [(r["suite"], r["id"], r["repeat"]) for r in lines]
            lost_dup.append((arm, len(keys), len(set(keys)), sum(r["error"] is not None for r in lines),
                             sum(r["attempts"] for r in lines)))
        tf = [l for l in err.splitlines() if "teacher forcing" in l and "requests" in l]
        print(json.dumps({"run": f"faulty-{seed}", "rc": proc.returncode, "verdict": rep["verdict"]["verdict"],
                          "figures_equal_clean": T.figures(rep) == want, "arms(n,unique,errors,attempts)": lost_dup,
                          "faults": [pb.faults()["faults"], pc.faults()["faults"]], "teacher_lines": tf,
                          "s": round(time.monotonic() - t0, 1)}), flush=True)
finally:
    for p in proxies: p.stop()
    base.stop(); cand.stop()
