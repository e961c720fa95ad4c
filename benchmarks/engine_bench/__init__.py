"""Parts of benchmarks/engine_throughput.py: workloads, timing summaries, and one runner per system."""
