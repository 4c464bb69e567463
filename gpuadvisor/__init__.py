"""gpuadvisor: GPU profiling and optimization advisor for PyTorch."""

__version__ = "0.1.0"
