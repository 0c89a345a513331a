"""The lab: N real hosts (systemd-nspawn + real systemd + real sshd) on a private bridge.

lab = Lab("lab")                     # files land in ./lab; state in /var/lib/tunnelspec-lab/
lab.up(["main", "rpc-a", "rpc-b"])   # idempotent: keeps running hosts, restarts dead ones
lab.hosts                            # {"main": "10.77.0.10", ...}
lab.exec("rpc-a", ["systemctl", "is-system-running"])
lab.link("rpc-a", up=False)          # cut its cable; up=True restores it
lab.down()                           # nothing left behind
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from tunnelspec.core.errors import LabError
from tunnelspec.lab import aptrepo, cgroups, host, network, nspawn, outputs, prereq, state
from tunnelspec.lab.host import HostSpec, HostStatus, LoginUser
from tunnelspec.lab.keys import ensure_keypair
from tunnelspec.lab.network import LabNet
from tunnelspec.lab.image import DEFAULT_RELEASE, RELEASES, content_key, ensure_image, prune_images

DEFAULT_HOSTS = ("main", "rpc-a", "rpc-b")
DEFAULT_SUBNET = "10.77.0.0/24"
DEFAULT_BRIDGE = "tslab0"
HOST_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
POLL_S = 0.2
POWEROFF_S = 30.0


class Lab:
    def __init__(
        self,
        dir: str | Path = "lab",
        subnet: str | None = None,
        bridge: str | None = None,
        log: Callable[[str], None] = print,
    ):
        self.dir = Path(dir).resolve()
        self.log = log
        known = state.find_by_dir(self.dir)
        bridge = bridge or (known["bridge"] if known else DEFAULT_BRIDGE)
        subnet = subnet or (known["subnet"] if known else DEFAULT_SUBNET)
        if not re.fullmatch(r"[a-z][a-z0-9]{1,9}", bridge):
            raise LabError(f"invalid bridge name {bridge!r} (lowercase letters/digits, ≤10)")
        self.net = LabNet(bridge, network.parse_subnet(subnet))

    # ---- files the lab writes -----------------------------------------------------------------
    @property
    def key_file(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.dir / "ssh_config"

    @property
    def inventory(self) -> Path:
        return self.dir / "inventory.ini"

    @property
    def hosts(self) -> dict[str, str]:
        st = state.load(self.net.bridge)
        return {n: h["ip"] for n, h in st["hosts"].items()} if st else {}

    # ---- up -------------------------------------------------------------------------------------
    def up(
        self,
        hosts: list[str] | tuple[str, ...] = DEFAULT_HOSTS,
        deadline_s: float = 180.0,
        releases: dict[str, str] | None = None,
        login_user: str | None = None,
        login_password: str | None = None,
    ) -> dict[str, float]:
        """Bring the lab up; returns timings in seconds (image, fixtures, boot, total).

        `releases`: host -> Debian codename (default bookworm for every host); `login_user`: a
        sudoer the inventory logs in as (with `login_password` for sudo, else NOPASSWD)."""
        prereq.check_platform()
        prereq.check_tools()
        login = LoginUser(login_user, login_password) if login_user else None
        with state.locked():
            return self._up(list(hosts), deadline_s, dict(releases or {}), login)

    def _up(
        self, hosts: list[str], deadline_s: float, releases: dict[str, str], login: LoginUser | None
    ) -> dict[str, float]:
        self._validate_hosts(hosts)
        for name, rel in releases.items():
            if name not in hosts:
                raise LabError(f"--release names {name!r}, which is not a lab host ({', '.join(hosts)})")
            if rel not in RELEASES:
                raise LabError(f"--release {name}={rel}: the lab offers {', '.join(RELEASES)}")
        releases = {h: releases.get(h, DEFAULT_RELEASE) for h in hosts}
        st = self._load_or_new(hosts, releases, login)
        t0 = time.monotonic()
        images = {rel: ensure_image(self.log, rel) for rel in dict.fromkeys(releases.values())}
        t_image = time.monotonic() - t0
        fixtures = _fixtures()
        t_fix = time.monotonic() - t0 - t_image
        st["images"] = {rel: str(p) for rel, p in images.items()}
        state.save(self.net.bridge, st)
        # Kept: this recipe's image of every release (another lab, or the next test, boots them) and
        # every image a lab still mounts; removed: images of older recipes.
        prune_images(
            {content_key(r) for r in RELEASES}
            | {Path(h["image"]).name for s in state.all_labs() for h in s["hosts"].values() if h.get("image")},
            self.log,
        )

        self.dir.mkdir(parents=True, exist_ok=True)
        client_pub = ensure_keypair(self.key_file, "tunnelspec-lab-client")
        for d in (host.CCACHE_DIR, host.FIXTURES_DIR):
            d.mkdir(parents=True, exist_ok=True)
        nspawn.ensure_runtime_tmpfs()
        network.ensure_bridge(self.net)
        st["repo_pid"] = aptrepo.serve(
            self.net.gateway, st.get("repo_pid"), state.state_dir(self.net.bridge) / "apt-repo.log"
        )
        state.save(self.net.bridge, st)

        t_boot0 = time.monotonic()
        host_keys = {}
        for spec in self._specs(hosts):
            rel = releases[spec.name]
            source = aptrepo.source_line(self.net.gateway, images[rel].name, rel)
            host_keys[spec.ip] = self._ensure_host(st, spec, images[rel], client_pub, source, login)
        self._write_files(host_keys, fixtures, login)
        self._wait_ready(hosts, deadline_s)
        t_boot = time.monotonic() - t_boot0
        timings = {"image": t_image, "fixtures": t_fix, "boot": t_boot, "total": time.monotonic() - t0}
        self.log(
            f"lab: {len(hosts)} hosts up on {self.net.bridge} ({self.net.subnet}) — image "
            f"{t_image:.1f} s, fixtures {t_fix:.1f} s, boot {t_boot:.1f} s, total "
            f"{timings['total']:.1f} s; files in {self.dir}"
        )
        return timings

    def _validate_hosts(self, hosts: list[str]) -> None:
        if not hosts:
            raise LabError("the lab needs at least one host")
        for name in hosts:
            if not HOST_NAME_RE.match(name):
                raise LabError(f"invalid lab host name {name!r} (lowercase, digits, '-')")
        if len(set(hosts)) != len(hosts):
            raise LabError(f"duplicate lab host names in {hosts}")

    def _load_or_new(self, hosts: list[str], releases: dict[str, str], login: LoginUser | None) -> dict:
        st = state.load(self.net.bridge)
        login_rec = {"user": login.name, "password": login.password is not None} if login else None
        if st is None:
            st = {
                "dir": str(self.dir),
                "bridge": self.net.bridge,
                "subnet": str(self.net.subnet),
                "order": hosts,
                "hosts": {},
                "releases": releases,
                "login": login_rec,
            }
            state.save(self.net.bridge, st)
            return st
        if st.get("releases", {h: "bookworm" for h in st["order"]}) != releases and st["order"] == hosts:
            raise LabError(
                f"the lab in {self.dir} runs releases "
                f"{','.join(f'{h}={r}' for h, r in st.get('releases', {}).items())}, not "
                f"{','.join(f'{h}={r}' for h, r in releases.items())}: run `tunnelspec lab down` first"
            )
        if st.get("login") != login_rec and st["order"] == hosts:
            raise LabError(
                f"the lab in {self.dir} logs in as {(st.get('login') or {}).get('user', 'root')}, not "
                f"{login.name if login else 'root'}: run `tunnelspec lab down` first"
            )
        if st["dir"] != str(self.dir):
            raise LabError(
                f"bridge {self.net.bridge} is used by the lab in {st['dir']}: take it "
                f"down first or pass another bridge and subnet"
            )
        if st["subnet"] != str(self.net.subnet):
            raise LabError(
                f"the lab in {self.dir} runs on {st['subnet']}, not {self.net.subnet}: run `tunnelspec lab down` first"
            )
        if st["order"] != hosts:
            raise LabError(
                f"the lab in {self.dir} has hosts {','.join(st['order'])}, not "
                f"{','.join(hosts)}: run `tunnelspec lab down` first"
            )
        return st

    def _specs(self, hosts: list[str]) -> list[HostSpec]:
        home = state.state_dir(self.net.bridge)
        return [
            HostSpec(
                name=n,
                index=i,
                ip=self.net.host_ip(i),
                netns=self.net.netns(n),
                machine=self._machine(n),
                home=home / n,
            )
            for i, n in enumerate(hosts)
        ]

    def _ensure_host(
        self, st: dict, spec: HostSpec, image: Path, client_pub: str, apt_source: str, login: LoginUser | None
    ) -> str:
        rec = st["hosts"].setdefault(
            spec.name, {"ip": spec.ip, "index": spec.index, "pid": None, "netns": spec.netns, "cgroups": []}
        )
        state.save(self.net.bridge, st)  # recorded before anything is created
        network.ensure_host_link(self.net, spec.index, spec.name)
        if host.supervisor_alive(rec["pid"], spec.machine):
            return (spec.home / "ssh_host_ed25519_key.pub").read_text().strip()
        # Dead or never started: clear what a crashed run left in its cgroups, then boot.
        host.stop(None, rec["cgroups"])  # no deadline: there is nothing to wait for
        cgroups.remove(rec["cgroups"])
        rec["cgroups"] = [str(p) for p in cgroups.create(spec.machine)]
        rec["root"] = str(spec.home / "root")
        state.save(self.net.bridge, st)
        if not host.is_mounted(spec.home / "root"):
            rec["image"] = str(image)  # the lowerdir this host's overlay is mounted on
            state.save(self.net.bridge, st)
        root = host.mount_overlay(spec, Path(rec.get("image", image)))
        host_pub = host.personalise(spec, root, client_pub, apt_source, login)
        rec["pid"] = host.start(spec, root, [Path(p) for p in rec["cgroups"]])
        state.save(self.net.bridge, st)
        self.log(f"lab: {spec.name} ({spec.ip}) booting, nspawn supervisor pid {rec['pid']}")
        return host_pub

    def _write_files(self, host_keys: dict[str, str], fixtures, login: LoginUser | None) -> None:
        hosts = self.hosts
        self.known_hosts.write_text(outputs.known_hosts_text(host_keys))
        self.ssh_config.write_text(outputs.ssh_config_text(hosts, self.key_file, self.known_hosts))
        self.inventory.write_text(
            outputs.inventory_text(hosts, self.key_file, self.known_hosts, fixtures, login.name if login else None)
        )

    def _wait_ready(self, hosts: list[str], deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        pending = set(hosts)
        states: dict[str, str] = {}
        while pending and time.monotonic() < end:
            for name in sorted(pending):
                rec = self._record(name)
                if not host.supervisor_alive(rec["pid"], self._machine(name)):
                    raise LabError(
                        f"lab host {name} stopped while booting; see "
                        f"{state.state_dir(self.net.bridge) / name / 'nspawn.log'}"
                    )
                states[name] = self._system_state(name)
                if states[name] in ("running", "degraded") and self._ssh_ok(name):
                    pending.discard(name)
            if pending:
                time.sleep(POLL_S)
        if pending:
            raise LabError(
                f"lab hosts not ready after {deadline_s:.0f} s: "
                + ", ".join(f"{n} ({states.get(n, 'unknown')})" for n in sorted(pending))
            )
        for name in hosts:
            if states[name] == "degraded":
                failed = self.exec(name, ["systemctl", "--failed", "--plain", "--no-legend"])
                self.log(f"lab: WARNING {name} is degraded; failed units:\n{failed.stdout}")

    def _system_state(self, name: str) -> str:
        try:
            res = self.exec(name, ["systemctl", "is-system-running"], timeout=10)
        except (LabError, subprocess.TimeoutExpired):
            return "unknown"
        return res.stdout.strip() or "unknown"

    def _ssh_ok(self, name: str) -> bool:
        """sshd answers and accepts our key, with strict host-key checking against our file."""
        res = subprocess.run(
            ["ssh", "-F", str(self.ssh_config), name, "true"], stdin=subprocess.DEVNULL, capture_output=True, timeout=20
        )
        return res.returncode == 0

    # ---- status / helpers -------------------------------------------------------------------
    def status(self) -> list[HostStatus]:
        st = state.load(self.net.bridge)
        if st is None:
            return []
        out = []
        for name in st["order"]:
            rec = st["hosts"].get(name)
            if rec is None:
                continue
            running = host.supervisor_alive(rec["pid"], self._machine(name))
            out.append(
                HostStatus(
                    name,
                    rec["ip"],
                    rec["pid"],
                    running,
                    self._system_state(name) if running else "-",
                    network.link_is_up(self.net, rec["index"]),
                )
            )
        return out

    def _machine(self, name: str) -> str:
        return f"{self.net.bridge}-{name}"

    def _record(self, name: str) -> dict:
        st = state.load(self.net.bridge)
        if st is None or name not in st["hosts"]:
            raise LabError(
                f"no lab host {name!r} in {self.dir} (hosts: "
                f"{', '.join(self.hosts) or 'none, run `tunnelspec lab up`'})"
            )
        return st["hosts"][name]

    def exec(
        self,
        name: str,
        argv: list[str],
        input: bytes | str | None = None,
        timeout: float | None = None,
        capture: bool = True,
    ) -> subprocess.CompletedProcess:
        """Run argv inside a host through its namespaces (works even with its link cut)."""
        rec = self._record(name)
        init = None
        if host.supervisor_alive(rec["pid"], self._machine(name)):
            init = host.container_init(rec["pid"])
        if init is None:
            raise LabError(f"lab host {name} is not running")
        # A host's output is decoded leniently: journals hold whatever a process printed (a model
        # emitting byte tokens writes invalid UTF-8 into llama-server's journal).
        kw: dict[str, Any] = {"capture_output": True, "text": True, "errors": "replace"} if capture else {}
        if isinstance(input, bytes) and capture:
            kw["text"] = False
            kw.pop("errors")
        return subprocess.run(host.enter_argv(init, argv), input=input, timeout=timeout, **kw)

    def link(self, name: str, up: bool) -> None:
        network.set_link(self.net, self._record(name)["index"], up)

    # ---- down -------------------------------------------------------------------------------
    def down(self) -> None:
        prereq.check_platform()
        with state.locked():
            self._down()

    def _down(self) -> None:
        st = state.load(self.net.bridge)
        if st is not None:
            pids = {
                name: rec["pid"] if host.supervisor_alive(rec["pid"], self._machine(name)) else None
                for name, rec in st["hosts"].items()
            }
            for pid in pids.values():
                host.request_poweroff(pid)
            deadline = time.monotonic() + POWEROFF_S  # one deadline for all hosts
            for name, rec in st["hosts"].items():
                host.stop(pids[name], rec["cgroups"], deadline)
                host.unmount(Path(rec.get("root", state.state_dir(self.net.bridge) / name / "root")))
                busy = cgroups.remove(rec["cgroups"])
                if busy:
                    raise LabError(f"lab host {name}: cgroups still busy: {', '.join(busy)}")
                nspawn.remove_runtime(self._machine(name))
                network.remove_host_link(self.net, rec["index"], name)
                rec["pid"] = None
                state.save(self.net.bridge, st)
        if st is not None:
            aptrepo.stop(st.get("repo_pid"), self.net.gateway)
        network.remove_bridge(self.net)
        shutil.rmtree(state.state_dir(self.net.bridge), ignore_errors=True)
        for path in (self.inventory, self.known_hosts, self.ssh_config):
            path.unlink(missing_ok=True)
        if not state.all_labs():
            nspawn.release_runtime_tmpfs()
        self.log(f"lab: {self.dir} down ({self.net.bridge} removed)")


def _fixtures():
    try:
        from tunnelspec.lab.fixtures import ensure_fixtures  # lazy: optional; an ImportError becomes a LabError
    except ImportError as err:
        raise LabError(f"lab fixtures unavailable (tunnelspec.lab.fixtures: {err})") from None
    return ensure_fixtures(str(host.FIXTURES_DIR))
