"""Chapter 01: check the environment (versions, lint, collectives, matmul rate) before training anything.

The package re-exports nothing, so a run that asks only for the precision choice does not load the other checks.
"""
