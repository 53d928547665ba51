"""jaxnoise ops: one folder per op family (reference, kernels, configs, API)."""
