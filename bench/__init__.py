"""Benchmarks (not tests): ``python -m bench [NAME …]`` runs ``bench/bench_<NAME>.py`` modules."""
