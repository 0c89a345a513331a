"""What a client needs to use the deployed API: base URL, the CA file to pin, where the API key lives.

Pure: built from inventory-derived values (the wiring passes cluster.main and the inventory's CA
directory); nothing is read from a host. The API key is never part of it — only its path on main.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from tunnelspec.core.constants import LOOPBACK


def _url_host(name: str) -> str:
    bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        return name.lower().rstrip(".")
    return f"[{ip}]" if ip.version == 6 else str(ip)


def client_config(
    *,
    main: str,
    port: int,
    public_bind: bool,
    tls_names=(),
    ca_file: str | Path | None = None,
    ca_fingerprint: str | None = None,
    api_key_file: str | None = None,
) -> dict:
    """The client configuration as a JSON-able dict.

    public_bind: https://<first TLS name>:<port>/v1, the CA file on the controller to pin, and the key
    file on main. Without it llama-server listens on main's 127.0.0.1 only: the URL is the loopback
    one, reachable on main or through an SSH forward (`ssh -L <port>:127.0.0.1:<port> main`).
    """
    if not 0 < int(port) < 65536:
        raise ValueError(f"bad port {port!r}")
    port = int(port)
    if public_bind:
        names = [n for n in tls_names if n]
        if not names:
            raise ValueError("public bind needs at least one TLS name (llama_server_tls_names)")
        if ca_file is None:
            raise ValueError("public bind needs the CA file clients pin")
        host = _url_host(names[0])
        cfg = {
            "reach": "network",
            "scheme": "https",
            "host": host,
            "port": port,
            "base_url": f"https://{host}:{port}/v1",
            "server_url": f"https://{host}:{port}",
            "tls_names": list(names),
            "ca_file": str(Path(ca_file).expanduser().absolute()),
            "ca_sha256": ca_fingerprint,
        }
    else:
        cfg = {
            "reach": "main-loopback",
            "scheme": "http",
            "host": LOOPBACK,
            "port": port,
            "base_url": f"http://{LOOPBACK}:{port}/v1",
            "server_url": f"http://{LOOPBACK}:{port}",
            "tls_names": [],
            "ca_file": None,
            "ca_sha256": None,
            "ssh_forward": f"ssh -N -L {port}:{LOOPBACK}:{port} {main}",
        }
    cfg["main"] = main
    cfg["api_key"] = (
        {"host": main, "path": api_key_file, "read_with": f"export LLAMA_API_KEY=$(ssh {main} sudo cat {api_key_file})"}
        if api_key_file
        else None
    )
    return cfg


def render(cfg: dict) -> str:
    """Human form of client_config(): what to set, and one curl and one `openai` example."""
    key = cfg.get("api_key")
    lines = [f"base URL (OpenAI-compatible): {cfg['base_url']}"]
    if cfg["scheme"] == "https":
        lines += [f"CA file to pin:               {cfg['ca_file']}"]
        if cfg.get("ca_sha256"):
            lines += [f"CA fingerprint:               {cfg['ca_sha256']}"]
        lines += [f"certificate names:            {', '.join(cfg['tls_names'])}"]
    else:
        lines += [f"reachable only on {cfg['main']} (127.0.0.1); from elsewhere: {cfg['ssh_forward']}"]
    if key:
        lines += [
            f"API key:                      in {key['path']} on {key['host']} (not shown; e.g. {key['read_with']})"
        ]
    else:
        lines += ["API key:                      none configured"]
    auth = ' -H "Authorization: Bearer $LLAMA_API_KEY"' if key else ""
    cacert = f" --cacert {cfg['ca_file']}" if cfg["scheme"] == "https" else ""
    lines += [
        "",
        "examples:",
        f"  curl{cacert}{auth} {cfg['server_url']}/health",
        "  python: import os, ssl, httpx, openai",
        "          client = openai.OpenAI(base_url="
        + repr(cfg["base_url"])
        + ", api_key=os.environ['LLAMA_API_KEY']"
        + (
            f",\n              http_client=httpx.Client(verify=ssl.create_default_context(cafile={cfg['ca_file']!r}))"
            if cfg["scheme"] == "https"
            else ""
        )
        + ")",
    ]
    return "\n".join(lines) + "\n"
