"""Server-side figures from Prometheus text: names mapped per server family, deltas, summaries."""

import pytest

from kvqual.probe import parse_prometheus
from kvqual.telemetry import snapshot, source_of, summarize

SGLANG = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 8.128902e+06
sglang:generation_tokens_total{model_name="m"} 7.557572e+06
sglang:token_usage{model_name="m"} 0.28
sglang:num_running_reqs{model_name="m"} 12
sglang:time_to_first_token_seconds_sum{model_name="m"} 30.5
sglang:time_to_first_token_seconds_count{model_name="m"} 100
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 3
"""

VLLM_TWO_ENGINES = """\
vllm:generation_tokens_total{engine="0",model_name="m"} 100
vllm:generation_tokens_total{engine="1",model_name="m"} 50
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:time_per_output_token_seconds_sum{model_name="m"} 2.0
vllm:time_per_output_token_seconds_count{model_name="m"} 100
"""


def test_sglang_names_map_to_our_vocabulary():
    parsed = parse_prometheus(SGLANG)
    assert source_of(parsed) == "sglang"
    assert snapshot(parsed) == {"prompt_tokens": 8128902.0, "generation_tokens": 7557572.0, "kv_usage": 0.28,
                                "running": 12.0, "ttft_sum": 30.5, "ttft_count": 100.0}


def test_vllm_label_sets_are_summed_and_older_names_are_read():
    snap = snapshot(parse_prometheus(VLLM_TWO_ENGINES))
    assert snap == {"generation_tokens": 150.0, "kv_usage": 0.75, "itl_sum": 2.0, "itl_count": 100.0}


def test_summary_is_deltas_over_the_run():
    first = {"generation_tokens": 1000.0, "prompt_tokens": 50.0, "ttft_sum": 10.0, "ttft_count": 10.0}
    last = {"generation_tokens": 1600.0, "prompt_tokens": 250.0, "ttft_sum": 16.0, "ttft_count": 30.0}
    out = summarize(first, last, {"kv_usage": [0.1, 0.4, 0.1], "running": [0, 8, 4]}, wall_s=4.0,
                    source="sglang", scrapes=3)
    assert out["generation_tokens"] == 600 and out["prompt_tokens"] == 200 and out["gen_tok_s"] == 150.0
    assert out["kv_usage_peak"] == 0.4 and out["kv_usage_mean"] == pytest.approx(0.2)
    assert out["running_peak"] == 8 and out["running_mean"] == 4
    assert out["ttft_mean_s"] == pytest.approx(0.3)  # 6 s over 20 requests
    assert out["itl_mean_s"] is None


def test_a_counter_that_went_down_means_a_restart_and_is_not_reported():
    out = summarize({"generation_tokens": 500.0}, {"generation_tokens": 20.0}, {}, wall_s=1.0, source="vllm", scrapes=2)
    assert out["generation_tokens"] is None and out["gen_tok_s"] is None and out["kv_usage_peak"] is None


def test_unknown_server_has_no_source():
    assert source_of(parse_prometheus("process_cpu_seconds_total 3\n")) is None
    assert snapshot(parse_prometheus("process_cpu_seconds_total 3\n")) == {}


def test_llama_cpp_names_and_the_queue_are_read():
    from kvqual.probe import parse_prometheus
    from kvqual.telemetry import snapshot, source_of

    text = ("llamacpp:prompt_tokens_total 120\nllamacpp:tokens_predicted_total 39080\n"
            "llamacpp:requests_processing 1\nllamacpp:requests_deferred 31\n")
    parsed = parse_prometheus(text)
    assert source_of(parsed) == "llamacpp"
    assert snapshot(parsed) == {"prompt_tokens": 120, "generation_tokens": 39080, "running": 1, "waiting": 31}


def test_a_server_that_queues_makes_speed_a_queue_figure():
    from kvqual.judge.speed import queueing

    serial = {"waiting_mean": 30.2, "running_peak": 1.0}
    note = queueing(serial, 32)
    assert note is not None and "ran at most 1 at once" in note and "30.2" in note
    assert queueing({"waiting_mean": 0.3, "running_peak": 32.0}, 32) is None  # a brief queue is not the figure
    assert queueing({"running_peak": 4.0}, 32) is None  # no waiting gauge: not seen (docs/speed.md)
    assert queueing(None, 32) is None


def test_prefix_cache_figures_are_token_deltas_and_a_hit_rate():
    first = snapshot(parse_prometheus("vllm:prefix_cache_queries_total 100\nvllm:prefix_cache_hits_total 10\n"))
    last = snapshot(parse_prometheus("vllm:prefix_cache_queries_total 1100\nvllm:prefix_cache_hits_total 760\n"))
    out = summarize(first, last, {}, wall_s=1.0, source="vllm", scrapes=2)
    assert out["prefix_cache_queries"] == 1000 and out["prefix_cache_hits"] == 750 and out["prefix_hit_rate"] == 0.75
    assert out["host_hits"] is None  # vLLM has no host tier figure
    plain = summarize({}, {}, {}, wall_s=1.0, source="vllm", scrapes=2)
    assert plain["prefix_hit_rate"] is None and plain["prefix_cache_hits"] is None  # no prefix cache: no row


def test_a_cancellation_arriving_while_the_scraper_stops_is_not_swallowed(fake_server):
    """`Scraper.stop` cancels its poller and waits for it; a cancellation of the caller arriving in
    that wait is the caller's, not the poller's, and must end the caller (swallowed, a run cancelled
    at asyncio.run's shutdown went on and raised its own error as an unhandled one)."""
    import asyncio

    from kvqual.telemetry import Scraper

    server = fake_server("--metrics")

    async def main() -> bool:
        scraper = Scraper((server.base_url,))
        await scraper.start()
        assert scraper._task is not None  # the server answers /metrics: a poller runs
        stopping = asyncio.create_task(scraper.stop())
        await asyncio.sleep(0)  # stop() has cancelled the poller and waits for it
        stopping.cancel()
        try:
            await stopping
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(main())


def test_a_brace_or_comma_inside_a_label_value_keeps_the_line() -> None:
    """The hand-written parser dropped a line whose label value held a `}`; prometheus-client's keeps
    it, unescaped, and one line no parser can read costs only itself."""
    text = ('vllm:cache_config_info{cache_dtype="fp8",note="a}b, \\"c\\""} 1\n'
            'this is not a sample line\n'
            'sglang:num_running_reqs{model_name="smollm2"} 3.0\n'
            'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 7\n')
    parsed = parse_prometheus(text)
    assert parsed["vllm:cache_config_info"] == [({"cache_dtype": "fp8", "note": 'a}b, "c"'}, 1.0)]
    assert parsed["sglang:num_running_reqs"] == [({"model_name": "smollm2"}, 3.0)]
    assert parsed["vllm:e2e_request_latency_seconds_bucket"] == [({"le": "+Inf"}, 7.0)]
