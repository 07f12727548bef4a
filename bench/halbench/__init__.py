"""halformer benchmark harness (bench/run). See bench/halbench/__main__.py and docs/bench.md."""
