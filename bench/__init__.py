"""Benchmarks: the Redis engine against the naive design, and the cost per fire (issue #5).

``python -m bench.engine`` and ``python -m bench.cost`` each merge their section into
``bench/results/latest.json``; ``QUICK=1`` runs the short variant.
"""
