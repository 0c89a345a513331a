"""tunnelspec: llama.cpp distributed inference over SSH tunnels, deployed idempotently."""

__version__ = "0.1.0"
