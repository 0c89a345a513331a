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
# On main, with llama_server_public_bind=true: the front's TLS certificate and key (0600, the front
# user's), in a directory 0750 root:<front user> (docs/tls.md). HAProxy's `crt <file>` loads the key
# from `<file>.key`.
TLS_DIR = f"{ETC_DIR}/tls"
TLS_CERT = f"{TLS_DIR}/front.crt"
TLS_KEY = f"{TLS_CERT}.key"
# The comment (GECOS) of every account tunnelspec creates (modules/users.py): what marks it as ours.
SERVICE_USER_MARK = "tunnelspec service user"

# The draft kinds of llama-server's --spec-type that tunnelspec deploys (llama/speculative.py reads a
# build's own list against these; the declarations offer them for spec_type).
DRAFT_TYPES = ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
