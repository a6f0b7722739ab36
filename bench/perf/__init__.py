"""Speed benchmarks and the GPU checks (kernel parity, compile cost, gpucheck)."""
