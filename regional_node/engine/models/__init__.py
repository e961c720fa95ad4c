"""Model code (ours, PyTorch) for the supported Hugging Face architectures."""
