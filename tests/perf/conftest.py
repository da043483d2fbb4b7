# Benchmarks and peer scripts, not tests: the default `python -m pytest` run never collects anything here.
collect_ignore_glob = ["*"]
