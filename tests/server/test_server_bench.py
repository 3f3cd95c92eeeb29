"""`ember bench` end to end against the test server: a sweep, the JSON result, the plot, a dataset file."""
from __future__ import annotations

import json

import pytest

from ember.cli import bench


def run_cli(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", *argv])
    return args.func(args)


def test_bench_sweep_writes_json_and_plot(served, tmp_path, capsys):
    out, png = tmp_path / "result.json", tmp_path / "sweep.png"
    rc = run_cli(["--base-url", served.url, "--num-requests", "6", "--concurrency-sweep", "1,3", "--input-len", "8",
                  "--output-len", "4", "--endpoint", "chat", "--result-json", str(out), "--plot", str(png),
                  "--no-progress"])
    assert rc == 0
    result = json.loads(out.read_text())
    assert [run["concurrency"] for run in result["runs"]] == [1, 3]
    assert all(run["num_ok"] == 6 and run["output_tokens"] == 24 for run in result["runs"])
    assert set(result["runs"][0]["ttft_ms"]) == {"mean", "p50", "p90", "p99"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "concurrency 3: 6/6 ok" in capsys.readouterr().out


def test_bench_dataset_and_request_rate(served, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "The river", "output_len": 3}\n\n'
                    '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}\n')
    requests = bench.load_dataset(data, 5, output_len=9)
    assert [r.output_len for r in requests] == [3, 5, 3, 5, 3] and requests[1].prompt == "hi"
    cfg = bench.BenchConfig(served.url, request_rate=50.0, concurrency=None)
    summary = bench.run_benchmark(cfg, requests)
    assert summary.num_ok == 5 and summary.output_tokens == 19


def test_bench_reports_failures(served):
    requests = bench.random_requests(2, input_len=4, output_len=100000)  # beyond the context window
    summary = bench.run_benchmark(bench.BenchConfig(served.url, concurrency=2), requests)
    assert summary.num_ok == 0 and "HTTP 400" in summary.errors[0]


@pytest.mark.parametrize("bad", [{"endpoint": "embeddings"}, {"concurrency": 0}, {"request_rate": -1.0}])
def test_bench_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        bench.BenchConfig("http://x", **bad)
