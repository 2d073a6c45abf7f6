"""Differentially private continual release for Apache Beam.

`transforms.mechanisms` (numpy) is Beam-free and importable on its own.
"""
