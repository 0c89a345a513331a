"""Project-wide constants. Loopback is one constant: never '', 0.0.0.0 or localhost."""

LOOPBACK = "127.0.0.1"
DEFAULT_RPC_PORT = 50052
DEFAULT_TUNNEL_PORT = 15052
DEFAULT_HTTP_PORT = 8080
DEFAULT_FORKS = 20
STATE_DIR = "/var/lib/tunnelspec"
OPT_DIR = "/opt/tunnelspec"
ETC_DIR = "/etc/tunnelspec"
# On main: the RPC device map the rpc_devices task discovered (read by `tunnelspec status` too).
DEVICES_CACHE = f"{STATE_DIR}/rpc-devices.json"
# On main, with llama_server_public_bind=true: llama-server's TLS key (0600, its user's) and
# certificate, in a directory 0750 root:<llama user> (docs/tls.md).
TLS_DIR = f"{ETC_DIR}/tls"
TLS_KEY = f"{TLS_DIR}/llama-server.key"
TLS_CERT = f"{TLS_DIR}/llama-server.crt"
