"""mnnbuild: turn an MNN LLM into a Qualcomm NPU (QNN/HTP) deployment bundle and prove it works."""

__version__ = "0.1.0"
