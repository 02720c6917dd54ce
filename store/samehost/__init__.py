"""The same-host data plane: shared-memory and CUDA-IPC columns, slots, both sides' paths."""
