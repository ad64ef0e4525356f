"""Figures 3-5, measured."""
