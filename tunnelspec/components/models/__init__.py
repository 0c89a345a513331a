"""Where model files come from: the controller disk, the host itself, or a pinned Hugging Face revision."""
