"""The GPU runbook's two halves agree: every server that scripts/gpu/up.sh or up-sgl.sh can start is a target of
the matching kvqual config, on the same port and with the KV dtype the server is started with (docs/gpu.md). A
mismatch would send kvqual to a port nobody serves, or judge a server under another dtype's name; no GPU is needed
to see it."""

import re
from pathlib import Path
from urllib.parse import urlparse

import pytest

from kvqual.config import load_config

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "scripts" / "gpu"
# what each script's KVDTYPE word starts (vLLM: --kv-cache-dtype auto|fp8; SGLang: auto|fp8_e4m3), as kvqual names it
DTYPE = {"auto": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8_e4m3"}


def specs(script: Path) -> dict[str, tuple[int, str, str]]:
    """NAME -> (port, KV dtype word, the rest) from the script's `declare -A SPEC=([NAME]="PORT KVDTYPE ..." ...)`."""
    text = script.read_text(encoding="utf-8")
    block = re.search(r"declare -A SPEC=\((.*?)\)\n", text, re.S)
    assert block, f"no SPEC array in {script}"
    found = re.findall(r'\[(\w+)\]="(\d+) ([^\s"]+)([^"]*)"', block.group(1))
    return {name: (int(port), kv, rest.strip()) for name, port, kv, rest in found}


@pytest.mark.parametrize(("script", "toml"), [("up.sh", "kvqual-gpu.toml"), ("up-sgl.sh", "kvqual-sgl.toml")])
def test_every_server_a_script_starts_is_a_target_on_its_port_with_its_dtype(script, toml):
    servers = specs(GPU / script)
    targets = load_config(GPU / toml).targets
    assert len(servers) >= 4
    for name, (port, kv, _) in servers.items():
        assert name in targets, f"{script} starts {name}, which {toml} does not name"
        url = targets[name].base_url
        urls = url if isinstance(url, (list, tuple)) else [url]
        assert [urlparse(u).port for u in urls] == [port], (name, urls, port)
        assert targets[name].kv_cache_dtype == DTYPE[kv], (name, targets[name].kv_cache_dtype, kv)
    ports = [p for p, _, _ in servers.values()]
    assert len(set(ports)) == len(ports), f"two servers of {script} share a port"


def test_the_fa3_servers_mirror_the_triton_ones():
    servers = specs(GPU / "up-sgl.sh")
    fa3 = {n: s for n, s in servers.items() if n.startswith("fa3_")}
    assert set(fa3) == {"fa3_bf16", "fa3_bf16b", "fa3_fp8", "fa3_bf16_hi", "fa3_fp8_hi"}
    for name, (_, kv, rest) in fa3.items():
        twin = servers["sgl_" + name.removeprefix("fa3_")]
        assert kv == twin[1] and rest == f"--attention-backend fa3 {twin[2]}".strip(), (name, rest, twin)
