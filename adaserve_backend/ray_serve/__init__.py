"""Engine replicas on Ray Serve behind an SLO-aware request router (`make serve-ray`); needs the `ray`
extra (requirements-ray.txt). The Triton model repository stays the single-node default."""
