"""The front's TLS certificate and key on main (llama_server_public_bind=true; docs/tls.md).

TLS terminates in the front (HAProxy, tunnelspec-front.service, its own user): its `bind ... ssl crt
<cert>` reads the certificate (and any intermediates) from `<cert>` and the key from `<cert>.key`
beside it; llama-server stays plain HTTP on 127.0.0.1 behind it. The certificate comes from the
inventory's CA on the controller (components/tls/ca.py: created on the first deploy, issued with
llama_server_tls_names, renewed 30 days before its end, re-issued after `certs rotate` or when the
names change) or from the user's own files (components/tls/own.py: checked, installed as they are, a warning
near their end). The key is made in the controller's memory and written only on main, through stdin
(never an argument: no process list shows it), 0600 and owned by the front's user; it is never read
back — the decision reads main's certificate, which is public. A new pair is taken up by a reload of
the front (the playbook's handler): llama-server is not restarted. Without public bind the files are
removed (nothing in the front's configuration names them then).
"""

from __future__ import annotations

import asyncio
import posixpath
from typing import Any

from tunnelspec.core.constants import TLS_CERT, TLS_DIR
from tunnelspec.core.errors import TaskFailed
from tunnelspec.modules.base import Arg, Diff, Task, change, ok, register_task
from tunnelspec.components.tls import ca as C
from tunnelspec.components.tls.own import load_own
from tunnelspec.components.tls.reach import ApiTls, Seen, api_opener

KEY_SUFFIX = ".key"  # HAProxy (ssl-load-extra-files, default all) reads `crt FILE`'s key from FILE.key
PENDING = ".new"  # the certificate is written here first, renamed last: a leftover means "interrupted"
# What the directory held while llama-server terminated TLS itself (before the front): removed, so
# no second private key is left on main.
EARLIER = ("llama-server.key", "llama-server.crt", "llama-server.crt.new")
# One read-only round trip: directory and key metadata, an interrupted install, the earlier layout's
# files, the certificate.
_STATE = r"""
d=$1 key=$2 crt=$3; shift 3
stat -c 'dir %a %U %G' -- "$d" 2>/dev/null || echo "dir none"
stat -c 'key %a %U %s' -- "$key" 2>/dev/null || echo "key none"
if [ -e "$crt.new" ]; then echo "pending yes"; else echo "pending no"; fi
for f in "$@"; do [ -e "$d/$f" ] && echo "earlier $f"; done
echo "--- cert"
cat -- "$crt" 2>/dev/null
exit 0
"""


def _parse(stdout: str) -> dict:
    head, _, cert = stdout.partition("--- cert\n")
    earlier: list[str] = []
    out: dict[str, Any] = {"dir": None, "key": None, "pending": False, "earlier": earlier, "cert": cert.strip() or None}
    for line in head.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("dir", "key"):
            out[word] = None if rest == "none" else rest.split()
        elif word == "pending":
            out["pending"] = rest == "yes"
        elif word == "earlier" and rest in EARLIER:
            earlier.append(rest)
    return out


def _lines(cert_pem: str | None) -> str:
    if not cert_pem:
        return "(no certificate)\n"
    try:
        d = C.describe(cert_pem)
    except ValueError:
        return "(not a PEM certificate)\n"
    return (
        f"names: {', '.join(d['names'])}\nnot_after: {d['not_after']}\nissuer: {d['issuer']}\nsha256: {d['sha256']}\n"
    )


def _ca_or_none(d) -> C.CA | None:
    """The inventory's CA when it exists (read-only apart from its lock file); None: not created yet."""
    if not ((d / C.CA_KEY).exists() or (d / C.CA_CERT).exists() or (d / (C.CA_CERT + C.NEW)).exists()):
        return None
    return C.load_ca(d)


@register_task
class ServerTls(Task):
    """The front's (HAProxy's) TLS certificate and key on main for llama_server_public_bind=true: issued by the inventory's CA on the controller (or the user's own files), renewed before they end, removed without public bind. The key is `<cert>.key`, where HAProxy's `crt <cert>` looks for it."""

    module = "server_tls"
    reads_cluster = True
    args = {
        "owner": Arg(
            str,
            required=True,
            help="The front's user (HAProxy runs as it): owns the key (0600) and is the directory's group.",
        ),
        "dir": Arg(str, default=TLS_DIR, help="The directory on main (0750 root:owner)."),
        "cert": Arg(
            str,
            default=TLS_CERT,
            help="The certificate on main: what the front's `bind ... ssl crt` names; the key goes to "
            "`<cert>.key` beside it (0600), where HAProxy loads it from.",
        ),
        "days": Arg(int, default=C.SERVER_DAYS, help="Validity of a certificate tunnelspec issues, in days."),
        "renew_days": Arg(
            int,
            default=C.RENEW_MARGIN_DAYS,
            help="A certificate ending within this many days is renewed (own files: a warning).",
        ),
    }

    @property
    def key(self) -> str:
        """HAProxy's rule: a `crt` file without a key in it has its key in `<file>.key`."""
        return self.p["cert"] + KEY_SUFFIX

    def probes(self) -> list[list[str]]:
        return [["sh", "-c", _STATE, "sh", self.p["dir"], self.key, self.p["cert"], *EARLIER]]

    async def check(self, ctx):
        tls = ctx.require_cluster().main.tls
        st = _parse((await ctx.conn.probe(self.probes()[0])).stdout)
        if tls is None:
            if st["dir"] is not None:
                return change(
                    f"remove {self.p['dir']}: the API stays on 127.0.0.1 (no public bind), nothing uses a TLS key",
                    remove=True,
                )
            return ok("API on 127.0.0.1: no TLS")
        try:
            reason, want, note = self._decide(tls, st)
        except C.CertError as e:
            raise TaskFailed(str(e)) from None
        earlier = [posixpath.join(self.p["dir"], f) for f in st["earlier"]]
        if reason is not None:
            return change(
                f"{'install your' if tls.own else 'issue the'} server certificate ({reason})",
                Diff(_lines(st["cert"]), want, self.p["cert"]),
                issue=True,
                earlier=earlier,
            )
        owner = self.p["owner"]
        fixes = []
        if earlier:
            fixes.append(f"remove {', '.join(earlier)} (llama-server's own TLS files: TLS terminates in the front)")
        if st["dir"] != ["750", "root", owner]:
            fixes.append(f"{self.p['dir']} {' '.join(st['dir'] or ['?'])} → 750 root {owner}")
        if st["key"][:2] != ["600", owner]:
            fixes.append(f"{self.key} {' '.join(st['key'][:2])} → 600 {owner}")
        if fixes:
            return change("; ".join(fixes), meta=True, earlier=earlier)
        d = C.describe(st["cert"])
        ctx.register(
            "llama_server_tls",
            {"names": list(tls.names), "ca_file": tls.ca_file, "not_after": d["not_after"], "sha256": d["sha256"]},
        )
        return ok(
            f"certificate for {', '.join(d['names'])}, ends {d['not_after'][:10]} "
            f"({'your own, ' if tls.own else ''}CA {tls.ca_file}){note}"
        )

    def _decide(self, tls, st) -> tuple[str | None, str, str]:
        """(why the pair must be (re)installed or None, what --diff shows as the new state, a warning)."""
        cert = st["cert"]
        note = ""
        if tls.own:
            own = load_own(tls.own_cert, tls.own_key, tls.own_ca, tls.names)
            want = _lines(own.cert_pem) + "key: *** (your key file, 0600 on main)\n"
            if C.needs_renewal(own.cert_pem, margin_days=self.p["renew_days"]):
                note = (
                    f"; WARNING your certificate {tls.own_cert} ends within {self.p['renew_days']} days: "
                    "renew it in your PKI"
                )
            reason = (
                None
                if cert == own.cert_pem.strip()
                else "none on main"
                if not cert
                else "your certificate file changed"
            )
        else:
            ca = _ca_or_none(tls.ca_dir)
            want = (
                f"names: {', '.join(tls.names)}\nvalid: {self.p['days']} days\n"
                f"issuer: {ca.cert.subject.rfc4514_string() if ca else 'the new CA'}\n"
                "key: *** (a new P-256 key, 0600 on main)\n"
            )
            if ca is None:
                reason = f"the inventory's CA is created first, in {tls.ca_dir}"
            else:
                reason = C.needs_issue(cert, ca, tls.names, margin_days=self.p["renew_days"])
        if reason is None and st["pending"]:
            reason = "an earlier installation was interrupted"
        if reason is None and st["key"] is None:
            reason = "no key on main"
        return reason, want, note

    async def apply(self, ctx, ch):
        run = ctx.conn.run
        owner = self.p["owner"]
        if ch.data.get("remove"):
            await run(["rm", "-rf", "--", self.p["dir"]], check=True)
            return
        await run(["mkdir", "-p", "--", posixpath.dirname(self.p["dir"])], check=True)
        await run(["install", "-d", "-m", "750", "-o", "root", "-g", owner, "--", self.p["dir"]], check=True)
        if ch.data.get("earlier"):
            await run(["rm", "-f", "--", *ch.data["earlier"]], check=True)
        if ch.data.get("meta"):
            await run(["chown", f"{owner}:{owner}", "--", self.key], check=True)
            await run(["chmod", "600", "--", self.key], check=True)
            return
        tls = ctx.require_cluster().main.tls
        try:
            cert_pem, key_pem = self._material(ctx, tls)
        except C.CertError as e:
            raise TaskFailed(str(e)) from None
        ctx.add_secret(key_pem.reveal())
        # Certificate aside first, key in place, certificate renamed last: a run killed in between
        # leaves the `.new` file, and the next check installs a new pair (never a key with another's
        # certificate). Each write is a temporary file renamed (conn.put).
        await ctx.conn.put(cert_pem, self.p["cert"] + PENDING, 0o644)
        await ctx.conn.put(key_pem.reveal(), self.key, 0o600, owner)
        await run(["mv", "-f", "--", self.p["cert"] + PENDING, self.p["cert"]], check=True)

    def _material(self, ctx, tls):
        if tls.own:
            own = load_own(tls.own_cert, tls.own_key, tls.own_ca, tls.names)
            return own.cert_pem, own.key_pem
        ca, created = C.ensure_ca(tls.ca_dir)
        if created:
            ctx.progress(f"created the inventory's CA {ca.cert_file} ({C.fingerprint(ca.cert)}): clients pin this file")
        issued = C.issue_server_cert(ca, tls.names, self.p["days"])
        return issued.cert_pem, issued.key_pem


@register_task
class ServerTlsServed(Task):
    """Read-only: the front serves the certificate installed on main, seen through a TLS handshake with the inventory's CA pinned (after a reload HAProxy's new workers take over a moment later: this waits for them). Without public bind: nothing to check."""

    module = "server_tls_served"
    reads_cluster = True
    read_only = True
    args = {
        "cert": Arg(str, default=TLS_CERT, help="The certificate on main the front must serve."),
        "timeout": Arg(int, default=30, help="Seconds to wait for the front to serve it."),
    }

    async def check(self, ctx):
        main = ctx.require_cluster().main
        if main.tls is None:
            return ok("API on 127.0.0.1: no TLS")
        res = await ctx.conn.probe(["cat", "--", self.p["cert"]])
        try:
            want = C.fingerprint(res.stdout)  # the first certificate: the server's (intermediates follow)
        except ValueError:
            raise TaskFailed(f"{self.p['cert']} on {ctx.host} holds no certificate: deploy installs it") from None
        tls = ApiTls(main.tls.ca_file, main.tls.server_name)
        loop = asyncio.get_running_loop()
        end = loop.time() + self.p["timeout"]
        last = "no handshake"
        for _ in range(self.p["timeout"] * 5 + 2):  # one try per 0.2 s poll interval, up to the deadline
            seen = Seen()
            try:
                _, writer = await api_opener(ctx.conn, main.server_port, main.server_host, tls, seen)()
                writer.close()
            except (OSError, ConnectionError) as e:
                last = str(e)
            shown = seen.describe()
            if shown is not None:
                got = shown["sha256"]
                if got == want:
                    return ok(
                        f"the front on {main.server_host}:{main.server_port} serves {want} "
                        f"(CA {tls.ca_file} pinned, name {tls.server_name})"
                    )
                last = f"it serves {got}"
            if loop.time() >= end:
                break
            await asyncio.sleep(0.2)  # poll interval of the deadline loop
        raise TaskFailed(
            f"the front on {main.server_host}:{main.server_port} does not serve the certificate "
            f"installed on main ({self.p['cert']}, {want}) after {self.p['timeout']} s: {last}; "
            "see `journalctl -u tunnelspec-front.service`"
        )
