"""`tunnelspec certs rotate|show` and `tunnelspec client-config`: the controller side of TLS for the
API, which the front (HAProxy) on main terminates (docs/tls.md). No click here, and never a key in
anything returned."""

from __future__ import annotations

from tunnelspec.commands.client_config import client_config
from tunnelspec.core.errors import UsageError
from tunnelspec.inventory.addresses import ssh_host
from tunnelspec.components.tls import ca as C
from tunnelspec.cluster.fields import cluster_error
from tunnelspec.components.tls.own import load_own


def _tls(cluster, what: str):
    tls = cluster.main.tls
    if tls is None:
        raise UsageError(
            f"{what}: the API listens on 127.0.0.1 only (llama_server_public_bind is not true); "
            "there is no TLS to manage"
        )
    return tls


def check_tls_files(cluster) -> None:
    """Offline, in `tunnelspec check` and so before a deploy contacts any host: your own files are
    usable, or the inventory's CA (when it exists) loads — a CA key others may read is refused as ssh
    refuses such a key. ClusterError (exit 2), by name."""
    tls = cluster.main.tls
    if tls is None:
        return

    try:
        if tls.own:
            load_own(tls.own_cert, tls.own_key, tls.own_ca, tls.names)
        elif (tls.ca_dir / C.CA_KEY).exists() or (tls.ca_dir / C.CA_CERT).exists():
            C.load_ca(tls.ca_dir)
    except C.CertError as e:
        var = (
            "llama_server_tls_key_file"
            if tls.own and e.file == str(tls.own_key)
            else (
                "llama_server_tls_ca_file"
                if tls.own and e.file == str(tls.own_ca)
                else ("llama_server_tls_cert_file" if tls.own else "llama_server_public_bind")
            )
        )
        raise cluster_error(cluster.inventory, cluster.main.name, var, f"{e} (no host was changed)") from None


def rotate(cluster) -> tuple[str | None, str]:
    """Replace the inventory's CA (the old key is deleted); returns (old, new) fingerprints. The caller
    then runs the certs-rotate playbook: main's certificate is re-issued and the front reloads it
    (llama-server is not restarted)."""
    tls = _tls(cluster, "certs rotate")
    if tls.own:
        raise UsageError(
            "certs rotate: this inventory uses your own certificate files (llama_server_tls_cert_file, "
            "…): rotate them in your PKI, then deploy"
        )
    old = C.load_cert(tls.ca_dir / C.CA_CERT) if (tls.ca_dir / C.CA_CERT).exists() else None
    new = C.rotate_ca(tls.ca_dir)
    return (C.fingerprint(old) if old is not None else None), C.fingerprint(new.cert)


def show(cluster) -> dict:
    """The CA and where main's certificate is; certificates only (public), never a key."""
    tls = _tls(cluster, "certs show")
    out = {
        "names": list(tls.names),
        "own": tls.own,
        "ca_file": tls.ca_file,
        "server_cert_on_main": tls.cert_path,
        "server_key_on_main": tls.key_path,
        "ca": None,
        "previous_ca": None,
    }
    try:
        out["ca"] = C.describe(C.load_cert(tls.ca_file))
    except C.CertError:
        pass
    prev = tls.ca_dir / C.CA_PREVIOUS
    if not tls.own and prev.exists():
        out["previous_ca"] = C.describe(C.load_cert(prev))
    return out


def render_show(d: dict) -> str:
    lines = [
        f"names clients use:   {', '.join(d['names'])}",
        f"CA file (pin this):  {d['ca_file']}{' (your own)' if d['own'] else ''}",
    ]
    if d["ca"]:
        lines += [f"CA:                  {d['ca']['subject']}, ends {d['ca']['not_after'][:10]}, {d['ca']['sha256']}"]
    else:
        lines += ["CA:                  not created yet (the next deploy creates it)"]
    if d["previous_ca"]:
        lines += [f"previous CA:         {d['previous_ca']['sha256']} (rotated away; its key is deleted)"]
    lines += [
        f"on main:             {d['server_cert_on_main']} (certificate), {d['server_key_on_main']} "
        "(key, 0600, the front's user; never shown), served by the front (HAProxy); "
        "`tunnelspec status` shows the served certificate"
    ]
    return "\n".join(lines) + "\n"


def config_for(cluster) -> dict:
    """client_config() for this inventory's main host."""
    main = cluster.main
    hv = cluster.inventory.host_vars(main.name)
    where = ssh_host(main.name, hv)
    user = hv.get("ansible_user")
    ssh_target = f"{user}@{where}" if user else where
    if main.tls is None:
        return client_config(main=ssh_target, port=main.server_port, public_bind=False, api_key_file=main.api_key_file)
    fp = None
    try:
        fp = C.fingerprint(C.load_cert(main.tls.ca_file))
    except C.CertError:
        pass  # not created yet: the path is still where it will be
    return client_config(
        main=ssh_target,
        port=main.server_port,
        public_bind=True,
        tls_names=main.tls.names,
        ca_file=main.tls.ca_file,
        ca_fingerprint=fp,
        api_key_file=main.api_key_file,
    )
