"""One intra-op thread: the suite's tensors are small, and on a shared 2-core machine a second
thread makes them slower, not faster. Results do not depend on it."""
import torch

torch.set_num_threads(1)
