"""GET /metrics: vLLM's metric names with the model_name label, moving as requests are served."""

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from runtime_tests.helpers.fakes import MODEL, asgi_client
from neuronmodel_runtime.engine.outputs import EngineStats

REQUIRED = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:time_to_first_token_seconds_count",
    "vllm:time_per_output_token_seconds_count",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
]


async def scrape(client) -> dict:
    """{(sample name, frozenset of labels): value}."""
    r = await client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset({"model_name": MODEL, **labels}.items())), 0.0)


async def test_metrics_are_present_and_move_after_requests():
    async with asgi_client() as (client, app):
        before = await scrape(client)
        for name in REQUIRED:
            assert (name, frozenset({"model_name": MODEL}.items())) in before, name
        info = {"framework": "fake", "framework_version": "0.0", "model_name": MODEL}
        assert before[("neuronmodel_info", frozenset(info.items()))] == 1
        await client.post("/v1/completions", json={"prompt": "hello", "temperature": 0})  # 5 in, 6 out, stop
        await client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2, "n": 2, "temperature": 0})
        after = await scrape(client)
        assert value(after, "vllm:prompt_tokens_total") - value(before, "vllm:prompt_tokens_total") == 5 + 3 + 3
        assert value(after, "vllm:generation_tokens_total") - value(before, "vllm:generation_tokens_total") == 10
        assert value(after, "vllm:request_success_total", finished_reason="stop") == 1
        assert value(after, "vllm:request_success_total", finished_reason="length") == 2
        assert value(after, "vllm:time_to_first_token_seconds_count") == 3
        assert value(after, "vllm:e2e_request_latency_seconds_count") == 3
        assert value(after, "vllm:time_per_output_token_seconds_count") == 3
        assert value(after, "vllm:num_requests_running") == 0


async def test_the_step_breakdown_counts_what_the_engine_did():
    """One request of 4 tokens alone: 4 steps with work (a prefill, then 3 decodes of one row), the runner's
    seconds within the steps' seconds. A step counts itself once its outputs are out, so the response may come
    before its last step is counted: the scrape waits for the step loop to go idle."""
    async with asgi_client() as (client, app):
        before = await scrape(client)
        await client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 4, "temperature": 0})
        steps = app.state.serving.engine.steps
        for _ in range(500):
            if steps.idle:
                break
            await asyncio.sleep(0.01)
        after = await scrape(client)

        def moved(name: str) -> float:
            return value(after, f"neuronmodel:{name}_total") - value(before, f"neuronmodel:{name}_total")

        assert (moved("engine_steps"), moved("prefill_calls"), moved("prefill_rows")) == (4, 1, 1)
        assert (moved("decode_calls"), moved("decode_rows")) == (3, 3)
        assert 0 < moved("runner_seconds") <= moved("engine_step_seconds")


async def test_gauges_and_speculation_counters_read_engine_stats_at_scrape_time():
    async with asgi_client() as (client, app):
        snapshot = EngineStats(
            num_running=1, num_waiting=2, num_slots=4, spec_drafts_total=3, spec_draft_tokens_total=12,
            spec_accepted_tokens_total=7, spec_accepted_per_position=[3, 2, 2],
        )
        app.state.serving.engine.stats = lambda: snapshot
        samples = await scrape(client)
        assert value(samples, "vllm:num_requests_running") == 1
        assert value(samples, "vllm:num_requests_waiting") == 2
        assert value(samples, "vllm:kv_cache_usage_perc") == 0.25
        assert value(samples, "vllm:spec_decode_num_drafts_total") == 3
        assert value(samples, "vllm:spec_decode_num_draft_tokens_total") == 12
        assert value(samples, "vllm:spec_decode_num_accepted_tokens_total") == 7
        assert value(samples, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="1") == 2


async def test_each_app_has_its_own_registry():
    async with asgi_client() as (a, _), asgi_client() as (b, _):
        await a.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert value(await scrape(a), "vllm:e2e_request_latency_seconds_count") == 1
        assert value(await scrape(b), "vllm:e2e_request_latency_seconds_count") == 0
