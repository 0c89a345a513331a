"""llama.cpp knowledge: RPC wire protocol, build-aware flags, versions, advisories, test models."""
