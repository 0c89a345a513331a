#!/usr/bin/python3
# Part of tunnelspec-metrics (installed next to it as tunnelspec-metrics-sources; Python 3 standard
# library only): one scrape — the documented metrics, the sources it reads (the mode file, the watcher's
# HELLO file, the generation record, systemd, the certificate, llama-server's and the front's own
# figures) and their rendering in Prometheus' text format. Nothing is cached, nothing is written.
import json
import os
import socket
import ssl
import stat
import subprocess
import time

MODES = ("speculative", "degraded", "split-degraded", "waiting", "plain")

# The documented set (docs/metrics.md; the alert rules and the dashboard use only these and llama-server's).
METRICS = {
    "tunnelspec_serving_mode": (
        "gauge",
        "1 for the mode llama-server was last launched in (speculative, degraded, split-degraded, waiting, plain), else 0",
    ),
    "tunnelspec_serving_mode_seconds_total": ("counter", "Seconds spent in each serving mode since main booted"),
    "tunnelspec_serving_mode_entered_total": ("counter", "Times serving switched into each mode since main booted"),
    "tunnelspec_serving_mode_since_timestamp_seconds": ("gauge", "Unix time the current serving mode began"),
    "tunnelspec_llama_server_starts_total": (
        "counter",
        "llama-server starts by the launcher since main booted (mode switches, crashes, deploys)",
    ),
    "tunnelspec_llama_server_up": ("gauge", "1 while tunnelspec-llama-server.service is active"),
    "tunnelspec_tunnel_up": ("gauge", "1 while the node's tunnel unit is active"),
    "tunnelspec_tunnel_restarts_total": (
        "counter",
        "Automatic restarts of the node's tunnel unit (systemd NRestarts: reconnects)",
    ),
    "tunnelspec_node_rpc_hello_ok": (
        "gauge",
        "1 when the node's RPC server last answered the HELLO through its tunnel with main's protocol version",
    ),
    "tunnelspec_node_rpc_hello_timestamp_seconds": ("gauge", "Unix time of the node's last HELLO probe"),
    "tunnelspec_node_rpc_info": ("gauge", "The RPC protocol version the node last answered (always 1)"),
    "tunnelspec_tls_certificate_expiry_timestamp_seconds": (
        "gauge",
        "Unix time the front's certificate ends (public bind only)",
    ),
    "tunnelspec_generation": (
        "gauge",
        "The generation main serves (the last verified deploy, or the one a rollback returned to)",
    ),
    "tunnelspec_generation_since_timestamp_seconds": ("gauge", "Unix time that generation became the current one"),
    "tunnelspec_rollbacks_total": (
        "counter",
        "Returns to a kept generation: a failed deploy's automatic rollback, or `tunnelspec rollback` to another generation",
    ),
    "tunnelspec_last_rollback_timestamp_seconds": ("gauge", "Unix time of the last return to a kept generation"),
    "tunnelspec_front_requests_dropped_twice_total": (
        "counter",
        "Requests llama-server dropped twice without answering (most likely crashing on them): answered 502 by the front, not sent again; since the front's last start or reload",
    ),
    "tunnelspec_exporter_source_up": (
        "gauge",
        "1 when the exporter could read this source at this scrape (state, generation, systemd, llama_server, front, certificate)",
    ),
}
SOURCES = ("state", "generation", "systemd", "llama_server", "front", "certificate")


def load_config(path):
    with open(path) as f:
        return json.load(f)


# The files it reads lie in other services' runtime directories (mode.json in llama-server's): never
# through a link, never blocking on a FIFO, only a regular file of one name and a few hundred KiB —
# whoever runs it (the front's user for `serve`, a person on main for `show`; SECURITY.md, invariant A).
READ_CAP = 256 * 1024


def _read_json(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (OSError, TypeError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > READ_CAP:
            return None
        return json.loads(os.read(fd, READ_CAP + 1).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def connect_unix_nofollow(s, path):
    """Connect to the unix socket at `path` through an O_PATH|O_NOFOLLOW descriptor: a link there (the
    front's user owns the directory) is refused, never followed."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a socket")
        s.connect(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def _label(v):
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Out:
    """Samples grouped by metric, each family once with its HELP and TYPE."""

    def __init__(self):
        self.samples = {}

    def add(self, name, value, **labels):
        self.samples.setdefault(name, []).append((labels, value))

    def text(self):
        lines = []
        for name in METRICS:
            if name not in self.samples:
                continue
            kind, help_ = METRICS[name]
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            for labels, value in self.samples[name]:
                ls = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(labels.items()))
                lines.append("{}{} {}".format(name, "{" + ls + "}" if ls else "", _num(value)))
        return "\n".join(lines) + "\n"


def _num(v):
    v = float(v)
    return repr(int(v)) if v.is_integer() and abs(v) < 2**53 else repr(v)


# ---- sources ---------------------------------------------------------------------------------------
def mode_figures(out, state, now):
    """Mode gauges and counters from the launcher's state file (older files without counters count
    from what they say: the current mode since `since`)."""
    mode = state.get("mode")
    for m in MODES:
        out.add("tunnelspec_serving_mode", 1 if m == mode else 0, mode=m)
    seconds = dict(state.get("seconds") or {})
    at = float(state.get("at") or now)
    if mode in MODES:
        if not state.get("seconds"):
            at = float(state.get("since") or at)
        seconds[mode] = float(seconds.get(mode, 0.0)) + max(0.0, now - at)
    entered = state.get("entered") or ({mode: 1} if mode in MODES else {})
    for m in MODES:
        out.add("tunnelspec_serving_mode_seconds_total", round(float(seconds.get(m, 0.0)), 3), mode=m)
        out.add("tunnelspec_serving_mode_entered_total", int(entered.get(m, 0)), mode=m)
    if state.get("since") is not None:
        out.add("tunnelspec_serving_mode_since_timestamp_seconds", round(float(state["since"]), 3))
    out.add("tunnelspec_llama_server_starts_total", int(state.get("starts", 0)))


def generation_figures(out, doc):
    """The current generation and the returns to one, from the deploy's status file."""
    out.add("tunnelspec_generation", doc["generation"])
    if doc.get("since") is not None:
        out.add("tunnelspec_generation_since_timestamp_seconds", round(float(doc["since"]), 3))
    out.add("tunnelspec_rollbacks_total", int(doc.get("rollbacks") or 0))
    if doc.get("last_rollback") is not None:
        out.add("tunnelspec_last_rollback_timestamp_seconds", round(float(doc["last_rollback"]), 3))


def unit_props(units):
    """{unit: {ActiveState, NRestarts}} in one systemctl call (readable by any user over the bus)."""
    if not units:
        return {}
    res = subprocess.run(
        ["systemctl", "show", "-p", "Id", "-p", "ActiveState", "-p", "NRestarts", "--"] + list(units),
        capture_output=True,
        text=True,
        timeout=5,
    )
    if res.returncode != 0:
        raise OSError(res.stderr.strip() or "systemctl show failed")
    found: dict = {}
    cur: dict = {}
    for line in res.stdout.splitlines() + [""]:
        if not line.strip():
            if cur.get("Id"):
                found[cur["Id"]] = cur
            cur = {}
            continue
        k, _, v = line.partition("=")
        cur[k] = v
    return found


def node_figures(out, cfg, state, watch):
    """The nodes' last HELLO: the launcher's (at each start) or the watcher's (while degraded), newest wins."""
    nodes = dict((state or {}).get("nodes") or {})
    for name, rec in ((watch or {}).get("nodes") or {}).items():
        if float(rec.get("at", 0)) >= float(nodes.get(name, {}).get("at", 0)):
            nodes[name] = rec
    for name in cfg.get("nodes", []):
        rec = nodes.get(name)
        if not rec:
            continue
        out.add("tunnelspec_node_rpc_hello_ok", 1 if rec.get("ok") else 0, node=name)
        out.add("tunnelspec_node_rpc_hello_timestamp_seconds", round(float(rec.get("at", 0)), 3), node=name)
        if rec.get("version"):
            out.add("tunnelspec_node_rpc_info", 1, node=name, version=rec["version"])


def cert_end(path):
    """Unix time the certificate ends; stdlib first, openssl as a fallback."""
    try:
        # The stdlib's only X.509 reader is private: typeshed does not list ssl._ssl (mypy is wrong here).
        info = ssl._ssl._test_decode_cert(path)  # type: ignore[attr-defined]
        return float(ssl.cert_time_to_seconds(info["notAfter"]))
    except (AttributeError, KeyError, ValueError, ssl.SSLError):
        pass
    res = subprocess.run(
        ["openssl", "x509", "-noout", "-enddate", "-in", path], capture_output=True, text=True, timeout=10
    )
    if res.returncode != 0 or "=" not in res.stdout:
        raise OSError("cannot read the certificate's end date")
    return float(ssl.cert_time_to_seconds(res.stdout.split("=", 1)[1].strip()))


# Each source gets this long (seconds): a scrape must answer within Prometheus' scrape_timeout even when
# llama-server is busy (its /metrics waits for its main loop) — then that source is a 0, not the scrape.
SOURCE_TIMEOUT = 1.5


def _http_get(connect, host, path, headers=None, timeout=SOURCE_TIMEOUT):
    """GET over an already connected stream socket; the body on 200, else OSError (also past `timeout`
    in all)."""
    deadline = time.monotonic() + timeout
    s = connect()
    try:
        s.settimeout(timeout)
        req = f"GET {path} HTTP/1.0\r\nHost: {host}\r\n"
        for k, v in (headers or {}).items():
            req += f"{k}: {v}\r\n"
        s.sendall((req + "\r\n").encode())
        data = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError(f"no complete answer within {timeout:g}s")
            s.settimeout(left)
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if len(data) > 8 * 1024 * 1024:
                raise OSError("answer too large")
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or status[1] != b"200":
        raise OSError("HTTP %s" % (status[1].decode(errors="replace") if len(status) > 1 else "?"))
    return body.decode("utf-8", errors="replace")


def llama_metrics(cfg):
    server = cfg.get("llama_server") or {}
    headers = {}
    key_path = os.path.join(os.environ.get("CREDENTIALS_DIRECTORY", ""), "api-key") if server.get("api_key") else None
    if key_path:
        with open(key_path) as f:
            headers["Authorization"] = "Bearer " + f.read().strip()
    host, port = server["address"].rsplit(":", 1)
    return _http_get(
        lambda: socket.create_connection((host, int(port)), timeout=SOURCE_TIMEOUT), host, "/metrics", headers
    )


def front_metrics(cfg):
    path = (cfg.get("front") or {}).get("socket")

    def connect():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(SOURCE_TIMEOUT)
        connect_unix_nofollow(s, path)
        return s

    return _http_get(connect, "front", "/metrics?scope=frontend&scope=backend&scope=server")


def dropped_twice(text, backend):
    """The front's 502 answers to requests llama-server dropped twice: the responses its outer backend
    denied (templates/tunnelspec-front.cfg.j2, `retry_backend`). None for a front without that backend
    (configured before it) or a configuration without its name."""
    if not backend:
        return None
    # Concatenated, not an f-string: doubled braces would be a template's (this file is installed with one).
    want = 'haproxy_backend_responses_denied_total{proxy="' + backend + '"} '
    for line in text.splitlines():
        if line.startswith(want):
            return float(line[len(want) :])
    return None


def _only_samples(text, prefixes):
    """Another exporter's text, kept to the families named by `prefixes` (comments included)."""
    keep = []
    for line in text.splitlines():
        name = line.split()[2] if line.startswith("# ") and len(line.split()) > 2 else line.split("{")[0].split(" ")[0]
        if name.startswith(prefixes):
            keep.append(line)
    return "\n".join(keep) + ("\n" if keep else "")


def scrape(cfg, now=None):
    now = time.time() if now is None else now
    out, extra, up = Out(), [], {}
    state = _read_json(cfg["state"])
    up["state"] = state is not None
    if state is not None:
        mode_figures(out, state, now)
    node_figures(out, cfg, state, _read_json(cfg.get("watch_state") or ""))
    if cfg.get("generation"):
        doc = _read_json(cfg["generation"])
        up["generation"] = isinstance(doc, dict) and isinstance(doc.get("generation"), int)
        if up["generation"]:
            generation_figures(out, doc)
    units = dict(cfg.get("tunnels") or {})
    try:
        props = unit_props([cfg["llama_unit"]] + list(units.values()))
        up["systemd"] = True
    except (OSError, subprocess.SubprocessError):
        props, up["systemd"] = {}, False
    if props:
        out.add(
            "tunnelspec_llama_server_up", 1 if props.get(cfg["llama_unit"], {}).get("ActiveState") == "active" else 0
        )
        for node, unit in sorted(units.items()):
            p = props.get(unit, {})
            out.add("tunnelspec_tunnel_up", 1 if p.get("ActiveState") == "active" else 0, node=node)
            if p.get("NRestarts", "").isdigit():
                out.add("tunnelspec_tunnel_restarts_total", int(p["NRestarts"]), node=node)
    if cfg.get("certificate"):
        try:
            out.add("tunnelspec_tls_certificate_expiry_timestamp_seconds", cert_end(cfg["certificate"]))
            up["certificate"] = True
        except (OSError, subprocess.SubprocessError, ValueError):
            up["certificate"] = False
    if cfg.get("llama_server"):
        try:
            extra.append(_only_samples(llama_metrics(cfg), ("llamacpp:",)))
            up["llama_server"] = True
        except (OSError, ValueError):
            up["llama_server"] = False
    if cfg.get("front"):
        try:
            front = front_metrics(cfg)
            extra.append(_only_samples(front, ("haproxy_",)))
            up["front"] = True
            dropped = dropped_twice(front, cfg["front"].get("retry_backend"))
            if dropped is not None:
                out.add("tunnelspec_front_requests_dropped_twice_total", dropped)
        except (OSError, ValueError):
            up["front"] = False
    for source in SOURCES:
        if source in up:
            out.add("tunnelspec_exporter_source_up", 1 if up[source] else 0, source=source)
    return out.text() + "".join(extra)
