"""Suite-wide settings. One intra-op thread: the tensors here are small, and with more threads
than idle cores torch's thread pool spins and is several times slower, not faster."""
import torch

torch.set_num_threads(1)
