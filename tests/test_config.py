import shlex
import sys
from pathlib import Path

import pytest

from kvqual.config import Overrides, builtin_targets, load_config
from kvqual.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "kvqual.toml"
    p.write_text(text, encoding="utf-8")
    return p


GOOD = """
[run]
concurrency = 8
suites = ["suites/example.jsonl"]

[targets.bf16]
base_url = "http://127.0.0.1:30000/v1"
kv_cache_dtype = "bf16"

[targets.fp8]
base_url = ["http://127.0.0.1:30001/v1", "http://127.0.0.1:30002/v1/"]
model = "m"
api_key_env = "MY_KEY"
kv_cache_dtype = "fp8_e4m3"

[targets.launched]
base_url = "http://127.0.0.1:{port}/v1"
launch = "python -m sglang.launch_server --port {port} --kv-cache-dtype fp8_e4m3"
"""


def test_good_config_loads(tmp_path):
    cfg = load_config(write(tmp_path, GOOD))
    assert cfg.run.concurrency == 8 and cfg.run.suites == ("suites/example.jsonl",)
    assert cfg.target("fp8").base_urls == ("http://127.0.0.1:30001/v1", "http://127.0.0.1:30002/v1")
    assert cfg.target("bf16").model is None
    filled = cfg.target("launched").with_port(4321)
    assert filled.base_url == "http://127.0.0.1:4321/v1" and "--port 4321" in filled.launch


def test_api_key_comes_from_env_only(tmp_path, monkeypatch):
    cfg = load_config(write(tmp_path, GOOD))
    monkeypatch.setenv("MY_KEY", "sk-secret")
    assert cfg.target("fp8").api_key() == "sk-secret"
    assert "sk-secret" not in str(cfg.target("fp8").identity())


def test_openai_api_key_goes_to_openai_alone(tmp_path, monkeypatch):
    """Without `api_key_env` a target gets OPENAI_API_KEY only on api.openai.com; any other server
    (a local vLLM, a colleague's SGLang) gets the no-key placeholder, not the user's key."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-user-openai-key")
    monkeypatch.setenv("MY_KEY", "sk-named")
    cfg = load_config(write(tmp_path, GOOD + """
[targets.openai]
base_url = "https://api.openai.com/v1"
model = "gpt-4o-mini"

[targets.lookalike]
base_url = "https://api.openai.com.evil.example/v1"

[targets.mixed]
base_url = ["https://api.openai.com/v1", "http://127.0.0.1:8000/v1"]
"""))
    assert cfg.target("openai").api_key() == "sk-user-openai-key"
    assert cfg.target("bf16").api_key() == "EMPTY"  # 127.0.0.1, no api_key_env
    assert cfg.target("lookalike").api_key() == "EMPTY" and cfg.target("mixed").api_key() == "EMPTY"
    assert cfg.target("fp8").api_key() == "sk-named"  # named: sent wherever the target is
    monkeypatch.delenv("OPENAI_API_KEY")
    assert cfg.target("openai").api_key() == "EMPTY"


def test_a_resolved_key_is_redacted_from_messages(tmp_path, monkeypatch):
    from kvqual.errors import redact

    monkeypatch.setenv("MY_KEY", "sk-resolved-0123456789")
    load_config(write(tmp_path, GOOD)).target("fp8").api_key()
    assert redact("401: bad key sk-resolved-0123456789.") == "401: bad key ***."


@pytest.mark.parametrize("text, key, words", [
    ('[targets.a]\nbase_url = "http://x/v1"\nbogus = 1\n', "targets.a.bogus", "unknown key"),
    ('[targets.a]\nbase_url = 5\n', "targets.a.base_url", "expected"),
    ('[targets.a]\nbase_url = "ftp://x/v1"\n', "targets.a.base_url", "not an http"),
    ('[targets.a]\nbase_url = "http://x:99999999/v1"\n', "targets.a.base_url", "port"),
    ('[targets.a]\nmodel = "m"\n', "targets.a.base_url", "missing"),
    ('[targets.a]\nbase_url = "http://x/v1"\nkv_cache_dtype = "fp8 e4m3"\n', "targets.a.kv_cache_dtype", "not a KV dtype name"),
    ('[targets.a]\nbase_url = "http://x/v1"\n[run]\nconcurrency = "many"\n', "run.concurrency", "expected an integer"),
    ('[targets.a]\nbase_url = "http://x/v1"\n[run]\nconcurrency = 0\n', "run.concurrency", "at least 1"),
    ('[targets.a]\nbase_url = "http://x/v1"\n[run]\ntop_logprobs = 50\n', "run.top_logprobs", "20"),
    ('[targets.a]\nbase_url = "http://x/v1"\n[run]\nspeed = 1\n', "run.speed", "unknown key"),
    ('[targets.a]\nbase_url = "http://x/v1"\n[run]\nstall_seconds = -1\n', "run.stall_seconds", "0: never ask"),
    ('[targets.a]\nbase_url = "http://x/v1"\n[gate]\nbogus = 1\n', "gate.bogus", ""),
    ('[targets.a]\nbase_url = "http://127.0.0.1:{port}/v1"\n', "targets.a.base_url", "launch"),
    ('[targetz.a]\nbase_url = "http://x/v1"\n', "targetz", "unknown table"),
    ('[targets.a\nbase_url = "x"\n', "-", "TOML"),
])
def test_bad_config_names_file_and_key(tmp_path, text, key, words):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == key
    assert str(path) in str(info.value) and words in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_target_is_named(tmp_path):
    cfg = load_config(write(tmp_path, GOOD))
    with pytest.raises(ConfigError, match=r"targets\.nope: no such target \(known: bf16, fp8, launched\)"):
        cfg.target("nope")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.toml")


def test_builtin_targets_when_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None)
    assert cfg.builtin and set(cfg.targets) == {"bf16", "fp8", "fp8_e5m2", "fp8_broken", "bf16_prefix",
                                                "bf16_hicache", "fp8_hicache", "bf16_prefix_broken"}
    assert cfg.target("fp8").kv_cache_dtype == "fp8_e4m3"
    assert "--kv-cache-dtype fp8_e4m3" in builtin_targets()["fp8"].launch


def test_builtin_fp8_broken_launches_the_ignore_scale_fault():
    t = builtin_targets()["fp8_broken"]
    assert t.kv_cache_dtype == "fp8_e4m3"  # what the server reports too: the fault is silent
    argv = shlex.split(t.with_port(31234).launch)
    assert argv[0] == sys.executable and argv[1:4] == ["-m", "kvqual", "serve"]
    assert argv[4:] == ["--kv-cache-dtype", "fp8_e4m3", "--kv-fault", "ignore-scale-on-read", "--port", "31234"]
    assert t.identity()["builtin"] == "kvqual serve --kv-cache-dtype fp8_e4m3 --kv-fault ignore-scale-on-read"
    assert t.identity() != builtin_targets()["fp8"].identity()  # never shares finished runs with fp8


def test_builtin_identity_does_not_depend_on_the_interpreter_path(monkeypatch):
    before = builtin_targets()["bf16"]
    monkeypatch.setattr("sys.executable", "/elsewhere/venv/bin/python")
    after = builtin_targets()["bf16"]
    assert after.launch != before.launch and after.identity() == before.identity()
    assert after.with_port(31234).identity() == before.identity()


def test_overrides_validate(tmp_path):
    cfg = load_config(write(tmp_path, GOOD))
    run = Overrides({"concurrency": 3, "limit": None}).apply(cfg.run)
    assert run.concurrency == 3 and run.suites == ("suites/example.jsonl",)
    with pytest.raises(ConfigError, match="--concurrency"):
        Overrides({"concurrency": -1}).apply(cfg.run)


def test_a_config_that_names_no_suites_runs_the_default_mix(tmp_path, monkeypatch):
    from kvqual.commands import DEFAULT_PROFILE, prepare

    (tmp_path / "kvqual.toml").write_text('[targets.a]\nbase_url = "http://127.0.0.1:1/v1"\nkv_cache_dtype = "q8_0"\n')
    monkeypatch.chdir(tmp_path)
    config, run, suites = prepare(None, {}, None)
    assert not config.builtin and config.target("a").kv_cache_dtype == "q8_0"  # llama.cpp's name is accepted
    assert {s.ref.name for s in suites} == {s.ref.name for s in prepare(None, {"suites": [DEFAULT_PROFILE]}, None)[2]}
    assert sum(len(s.items) for s in suites) == 2108  # the default pool (profile:quick is 124)


def test_builtin_cache_targets_launch_the_cache_paths():
    argv = lambda name: shlex.split(builtin_targets()[name].with_port(1).launch)[4:]  # noqa: E731
    assert argv("bf16_prefix") == ["--kv-cache-dtype", "bf16", "--enable-prefix-caching", "--kv-budget-mb", "1024",
                                   "--port", "1"]
    assert "--enable-hierarchical-cache" in argv("fp8_hicache") and "fp8_e4m3" in argv("fp8_hicache")
    assert argv("bf16_prefix_broken")[-4:-2] == ["--kv-fault", "stale-cache-block"]
    assert builtin_targets()["bf16_hicache"].kv_cache_dtype == "bf16"


def test_cold_is_a_boolean_target_key(tmp_path):
    path = tmp_path / "k.toml"
    path.write_text('[targets.a]\nbase_url = "http://127.0.0.1:8000/v1"\ncold = true\n')
    assert load_config(path).target("a").cold
    path.write_text('[targets.a]\nbase_url = "http://127.0.0.1:8000/v1"\ncold = "yes"\n')
    with pytest.raises(ConfigError, match="targets.a.cold.*true or false"):
        load_config(path)
