"""Slurm, through its command-line tools: one small client (client.py), pure parsers of what the
tools print (parse.py), and a real cluster on one host for development and tests (devcluster.py).

This package may import the pure core and the error tree only (docs/ARCHITECTURE.md, "Layers").
"""
