"""The declarations of the main host's variables: the models, llama-server and its API, TLS,
speculative decoding and the target's placement, the front and the metrics. What a declaration
holds is in vardecl.py."""

from __future__ import annotations

from tunnelspec.cluster.vardecl import Var
from tunnelspec.core.constants import DEFAULT_HTTP_PORT, DRAFT_TYPES, LOOPBACK

SPLIT_MODES = ("none", "layer", "row", "tensor")
DEFAULT_INTERNAL_PORT = 18080
DEFAULT_HOLD_TIMEOUT = 180
DEFAULT_REJOIN_AFTER = 20
DEFAULT_FRONT_USER = "tunnelspec-front"
DEFAULT_METRICS_PORT = 9466


def _main(name: str, kind: str, doc: str, **kw) -> Var:
    return Var(name, kind, doc, hosts="main", **kw)


MAIN_VARS: tuple[Var, ...] = (
    # ---- models and llama-server ----------------------------------------------------------------------
    _main("llama_model", "model", "The target model: a path on main, a controller file, or hf://…@<sha> (required)."),
    _main("llama_draft_model", "model", "The draft model, as llama_model (exactly when a node is the draft node)."),
    _main(
        "llama_server_host",
        "address",
        "The API's address (anything but 127.0.0.1 needs public bind and a key).",
        default=LOOPBACK,
    ),
    _main("llama_server_port", "service_port", "The API's port (the front listens there).", default=DEFAULT_HTTP_PORT),
    _main("llama_server_public_bind", "bool", "Serve the API on llama_server_host, over TLS.", default=False),
    _main("llama_server_api_key_file", "credential_file", "A 0600 file on main holding the API key (one line)."),
    _main(
        "llama_server_extra_args", "server_args", "Extra llama-server arguments (a shell line or a list).", default=[]
    ),
    _main(
        "llama_server_start_timeout",
        "int",
        "Seconds verify waits for /health after a (re)start.",
        minimum=10,
        derived="180 + 15 per GiB of the models",
    ),
    _main(
        "llama_target_devices",
        "devices",
        "main's devices for the target model (-dev); none: the CPU.",
        derived="the backend's first device; none with cpu",
    ),
    # ---- speculative decoding and placement ------------------------------------------------------------
    _main(
        "spec_type",
        "choice",
        "The kind of draft, as the pinned build's --help lists them.",
        choices=DRAFT_TYPES,
        derived="draft-simple where the build has it",
    ),
    _main("spec_draft_n_max", "int", "Tokens drafted per step.", minimum=1, derived="the build's own"),
    _main("spec_draft_ngl", "layers", "Draft layers offloaded to the draft node: all or a number.", default="all"),
    _main("spec_draft_p_min", "probability", "Minimum draft token probability (0..1).", derived="the build's own"),
    _main(
        "llama_split_mode",
        "choice",
        "How the target is split: none, layer, row or tensor.",
        choices=SPLIT_MODES,
        derived="the build's own (layer)",
    ),
    _main(
        "llama_tensor_split",
        "tensor_split",
        "The target's proportions by name (rpc-a=1,CUDA0=2,CPU=1).",
        derived="llama.cpp splits by free memory",
    ),
    # ---- TLS (llama_server_public_bind=true) ---------------------------------------------------------------
    _main(
        "llama_server_tls_names",
        "list",
        "The names and addresses clients use (the first is checked).",
        derived="main's ansible_host and inventory name",
    ),
    _main("llama_server_tls_cert_file", "file", "Your own certificate (chain), a controller path."),
    _main("llama_server_tls_key_file", "file", "Its key, unencrypted and 0600, a controller path."),
    _main("llama_server_tls_ca_file", "file", "The CA clients pin for your own certificate, a controller path."),
    _main(
        "tunnelspec_tls_dir",
        "string",
        "Where the inventory's CA lives on the controller.",
        derived="<inventory file>.tls",
    ),
    # ---- the front (docs/degraded.md) and the metrics (docs/metrics.md) --------------------------------------
    _main(
        "llama_server_internal_port",
        "service_port",
        "llama-server's own port on 127.0.0.1, behind the front.",
        default=DEFAULT_INTERNAL_PORT,
    ),
    _main(
        "llama_server_hold_timeout",
        "int",
        "Seconds the front holds a request while llama-server (re)starts.",
        default=DEFAULT_HOLD_TIMEOUT,
        minimum=5,
    ),
    _main(
        "draft_rejoin_after",
        "int",
        "Seconds a returning draft node must answer before it is used again.",
        default=DEFAULT_REJOIN_AFTER,
        minimum=1,
    ),
    _main("front_user", "user", "The front's system user.", default=DEFAULT_FRONT_USER),
    _main(
        "bench_port",
        "service_port",
        "bench's baseline llama-server port on 127.0.0.1.",
        derived="the first port above llama_server_internal_port the front does not take",
    ),
    _main(
        "tunnelspec_keep_generations", "int", "Generations kept on main (docs/generations.md).", default=3, minimum=1
    ),
    _main("metrics", "bool", "Run the Prometheus exporter.", default=False),
    _main("metrics_port", "service_port", "The exporter's port on 127.0.0.1.", default=DEFAULT_METRICS_PORT),
    _main("metrics_token_file", "credential_file", "With public bind: a file on main holding the scrape token."),
    _main("metrics_readers", "users", "Users besides root and the front that may connect to metrics_port.", default=[]),
)
