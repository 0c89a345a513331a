"""tunnelspec: llama.cpp distributed inference over SSH tunnels, deployed idempotently."""

import warnings

__version__ = "0.1.0"

# cryptography 51 deprecates DSA, and asyncssh names DSA types in its annotations: each import of
# asyncssh printed five CryptographyDeprecationWarning blocks to stderr, before any output of ours.
# Nothing a user can act on (tunnelspec offers no DSA key); only those, only from asyncssh.
warnings.filterwarnings("ignore", message=r"DSA is deprecated", module=r"asyncssh(\.|$)")
