"""Plots the notebooks show. ``common`` holds the shared ones; chapters add a module each."""

from ecomlab.plots.common import plot_loss_curves, plot_throughput_bars

__all__ = ["plot_loss_curves", "plot_throughput_bars"]
