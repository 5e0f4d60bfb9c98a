"""The core's measured constants, derived from the benchmark artifacts they were measured in.

The core keeps each constant (``ecomkit`` reads no artifact); a test holds it equal to the derivation here on the
newest artifact, so a new measurement that moves it fails until the constant is updated.
"""
