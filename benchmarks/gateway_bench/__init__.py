"""Parts of benchmarks/gateway_overhead.py: a fixed-response upstream, the systems under test, a load
generator, and the statistics and table built from what it measured."""
