"""Utilization physics: the per-step cost model (FLOPs, bytes), device peaks (spec table or calibration)
and the NVML GPU sampler. May import model."""
