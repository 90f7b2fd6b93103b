"""capacity: a KV capacity ratio split into the KV dtype's share and the memory budgets' share."""

import json
from pathlib import Path

from kvqual.capacity import kv_dtype, kv_memory_gib, sentence, split

FIXTURE = Path(__file__).parent / "fixtures" / "sglang-0.5.17" / "server_info.json"


def test_the_three_vllm_servers_started_together_are_not_credited_to_fp8():
    """Measured on the H200: capacities 40,912 (bf16) and 2,889,904 (fp8) tokens, printed as ×70.6."""
    cap = split(40_912, "bf16", 2_889_904, "fp8")
    assert cap["ratio"] == 70.64 and cap["dtype_share"] == 2.0 and cap["memory_share"] == 35.32
    assert cap["same_budget"] is False
    line = sentence(cap)
    assert line.startswith("KV capacity: 40,912 tokens → 2,889,904 tokens (×70.6): the KV dtype explains ×2 "
                           "(bf16 → fp8, 2 → 1 bytes a value); the other ×35.3 is the memory")
    assert "not of the dtype" in line


def test_the_same_kv_memory_is_all_the_dtype():
    """SGLang with --max-total-tokens for the same 737,280,000 bytes: 32,000 bf16 / 64,000 fp8."""
    cap = split(32_000, "bfloat16", 64_000, "fp8_e4m3", 0.687, 0.687)
    assert (cap["dtype_share"], cap["memory_share"], cap["same_budget"]) == (2.0, 1.0, True)
    assert sentence(cap) == ("KV capacity: 32,000 tokens → 64,000 tokens (×2: the KV dtype, bfloat16 → fp8_e4m3, "
                             "2 → 1 bytes a value)")


def test_the_same_dtype_and_memory_say_so():
    assert sentence(split(32_000, "bf16", 32_000, "bf16", 0.687, 0.687)) == (
        "KV capacity: 32,000 tokens → 32,000 tokens (the same KV dtype, bf16, and the same KV memory)")


def test_vllm_block_rounding_is_the_same_budget_but_a_reported_budget_change_is_named():
    assert split(40_000, "bf16", 80_016, "fp8")["same_budget"] is True  # one 16-token block more
    line = sentence(split(32_000, "bf16", 96_000, "fp8", 0.687, 1.03))
    assert "the other ×1.5 is the memory" in line and "0.687 GiB → 1.03 GiB as the servers report" in line


def test_unknown_dtypes_say_so_and_no_capacity_is_no_line():
    cap = split(1000, "auto", 2000, "fp8")
    assert cap["dtype_share"] is None and cap["memory_share"] is None
    assert "how much of it is the dtype is not known" in sentence(cap)
    assert split(None, "bf16", None, "fp8") is None
    assert sentence(split(1000, "bf16", None, "fp8")) == "KV capacity: 1,000 tokens → not reported"


def test_what_the_real_sglang_reports_sizes_its_tokens():
    body = json.loads(FIXTURE.read_text())["body"]
    info = {"server_info": body, "kv_cache_dtype": "auto"}
    assert kv_dtype("auto", info) == "bfloat16"  # its --dtype, as /get_server_info lists it
    assert kv_dtype("bf16", info) == "bf16"
    assert kv_memory_gib(info) == 0.687  # memory_usage.kvcache: 737,280,000 B = 0.6866 GiB
    assert kv_memory_gib({"vllm_kv_cache_memory_bytes": 737_280_000}) == 0.6866
    assert kv_memory_gib({}) is None
