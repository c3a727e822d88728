"""Agents whose graph grows at run time: a trace-driven simulation, plain vs Teola."""
