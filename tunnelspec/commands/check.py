"""`tunnelspec check INVENTORY`: the inventory validated offline, every mistake at once, and the
plan of what systemd will run on each host — in seconds, before anything is contacted (Terraform's
`validate` and `plan`). `deploy` runs the same checks first.

Errors come from the one set of rules the commands use (the parsers, then the cluster model read
again past each error: cluster/collect.py); this module adds only what a run would not stop on —
warnings (unknown variables, arguments that look mis-quoted) — and what needs the controller's own
files (a patch file against the pinned tree). Errors and warnings are data; no click here.
"""

from __future__ import annotations

import copy
import difflib
import json
import shlex
import subprocess
from typing import Any
from dataclasses import dataclass, field

from tunnelspec.core.errors import ClusterError, EXIT_OK, EXIT_USAGE, InventoryError, SourceError
from tunnelspec.core.gitenv import git_env
from tunnelspec.cluster.fields import KNOWN_VARS, USER_VAR_PREFIX, cluster_error, is_unknown_var, nearest_var
from tunnelspec.components.source.controller_repo import check_controller_source
from tunnelspec.inventory import load_inventory
from tunnelspec.inventory.model import ANSIBLE_INTERNAL_VARS, Group
from tunnelspec.cluster import schema
from tunnelspec.cluster.collect import collect_cluster_errors
from tunnelspec.commands.check_patches import patches_problem
from tunnelspec.commands.plan import Plan, build_plan, mark_unknown, stand_ins
from tunnelspec.components.server import preflight
from tunnelspec.components.source import controller_repo
from tunnelspec.llama import versions

TUNNELSPEC_GROUPS = ("main", "rpc")
SCHEMA = 1


@dataclass(frozen=True)
class Finding:
    severity: str  # "error" or "warning"
    message: str  # the whole text, `file:line:` first when the line is known
    file: str | None = None
    line: int | None = None
    host: str | None = None
    var: str | None = None

    def as_dict(self) -> dict:
        return {"message": self.message, "file": self.file, "line": self.line, "host": self.host, "var": self.var}


def _from_error(severity: str, err: SourceError | ClusterError) -> Finding:
    return Finding(
        severity,
        str(err),
        getattr(err, "file", None),
        getattr(err, "line", None),
        getattr(err, "host", None),
        getattr(err, "var", None),
    )


@dataclass
class Report:
    inventory: str
    findings: list[Finding] = field(default_factory=list)
    plan: Plan | None = None  # when the cluster could be read
    settings: str | None = None  # the llama-server settings' check against the recorded build, when one is
    loaded: Any = None  # the Inventory read (with -e), when it could be: a deploy runs on this one
    cluster: Any = None  # the Cluster built from it (models required), when it has no error

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def add(self, finding: Finding) -> None:
        if all(f.message != finding.message for f in self.findings):
            self.findings.append(finding)

    def exit_code(self) -> int:
        return EXIT_USAGE if self.errors else EXIT_OK

    def error_text(self) -> str:
        """Every error, one per line (what deploy stops with)."""
        lines = [f.message for f in self.errors]
        return (
            "\n".join(lines) + f"\n{len(lines)} error(s) in {self.inventory}; no host was contacted "
            f"(tunnelspec check {self.inventory} shows them with the plan)"
        )

    def as_json(self) -> dict:
        plan = self.plan
        return {
            "schema": SCHEMA,
            "inventory": self.inventory,
            "ok": not self.errors,
            "errors": [f.as_dict() for f in self.errors],
            "warnings": [f.as_dict() for f in self.warnings],
            "plan": None
            if plan is None
            else {
                "spelling": plan.spelling,
                "notes": list(plan.notes),
                "hosts": _by_host([c.as_dict() for c in plan.commands]),
                "setup": {host: list(lines) for host, lines in plan.hosts.items()},
            },
        }

    def diagnostics(self) -> str:
        """The ERROR and WARNING lines, for stderr (docs/cli.md: every error on stderr)."""
        return "\n".join(
            [f"ERROR: {f.message}" for f in self.errors] + [f"WARNING: {f.message}" for f in self.warnings]
        )

    def render(self) -> str:
        """The plan and the summary line, for stdout (the ERROR and WARNING lines: diagnostics())."""
        out = []
        if self.plan is not None:
            out.append(f"Plan ({self.plan.spelling}):")
            hosts = list(dict.fromkeys([*self.plan.hosts, *(c.host for c in self.plan.commands)]))
            for host in hosts:
                out.append(f"  {host}:")
                out += [f"    {line}" for line in self.plan.hosts.get(host, [])]
                for c in self.plan.commands:
                    if c.host == host:
                        out.append(f"    {c.unit} ({c.what}):")
                        out.append(f"      {shlex.join(c.argv)}")
            out += [f"  note: {n}" for n in self.plan.notes]
            if self.errors:
                out.append("  (the plan as it stands with the erroneous lines left out)")
        out.append(
            f"{len(self.errors)} error(s), {len(self.warnings)} warning(s) in {self.inventory}"
            + ("" if self.errors else ": ok")
        )
        return "\n".join(out)


def _by_host(commands: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for c in commands:
        out.setdefault(c.pop("host"), []).append(c)
    return out


def usage_finding(message: str) -> Finding:
    """A command-line mistake (`-e =x`, no inventory), reported like the inventory's own errors."""
    return Finding("error", message)


# ---- the checks --------------------------------------------------------------------------------
def check_inventory(path: str, extra_vars: dict | None = None, *, controller_git: bool = True) -> Report:
    """Everything that can be told about the inventory without a connection. `controller_git`:
    read the controller's llama.cpp repository when llama_repo names one (deploy and check)."""
    report = Report(str(path))
    parse_errors: list[InventoryError] = []
    try:
        inv = load_inventory(path, parse_errors)
    except InventoryError as err:  # YAML, an unreadable file: one error, nothing more to read
        report.add(_from_error("error", err))
        return report
    for parse_error in parse_errors:
        report.add(_from_error("error", parse_error))
    inv = inv.with_extra_vars(extra_vars or {})
    report.loaded = inv
    meant = _check_groups(inv, report)
    collected = collect_cluster_errors(
        _as_meant(inv, meant), models=True, source_check=check_controller_source if controller_git else None
    )
    for cluster_err in collected.errors:
        if (parse_errors or meant) and not cluster_err.var:
            continue  # "no host in [rpc]" after a header that could not be read says nothing new
        report.add(_from_error("error", cluster_err))
    _check_unknown_vars(inv, report)
    cluster = collected.cluster
    if cluster is None:
        return report
    if not meant:  # read as the typo groups meant, it is not the inventory a run would use
        report.cluster = cluster
    _check_extra_args(cluster, report)
    set_aside = {v for _, v in collected.set_aside}
    if "llama_build_number" not in set_aside:  # else its error said it: no "not known" for the line left out
        for warning in cluster.known_issue_warnings():  # refusals came with the model's errors
            report.add(_from_error("warning", warning))
    _check_recorded_build(cluster, report)
    _check_tls_files(cluster, report)
    if controller_git and "llama_patches" not in set_aside:
        _check_patches_apply(cluster, report)

    report.plan = build_plan(cluster, _rpc_server_name(cluster) if controller_git else None)
    mark_unknown(report.plan, stand_ins(cluster, collected.set_aside))
    return report


def _rpc_server_name(cluster) -> str | None:
    """The RPC server's binary name in the pinned tree, when the controller holds it (renamed
    ≈b98xx); None: not known offline."""
    source = cluster.source
    if not controller_repo.is_controller_repo(source.repo):
        return None
    repo = controller_repo.path_of(source.repo, cluster.inventory.path.parent)
    for name in (versions.RPC_TOOL_CMAKELISTS, versions.RPC_TOOL_CMAKELISTS_OLD):
        res = subprocess.run(
            ["git", "-C", str(repo), "show", f"{source.commit}:{name}"],
            capture_output=True,
            text=True,
            timeout=60,
            env=git_env(),
        )
        if res.returncode == 0:
            try:
                return versions.rpc_server_target(res.stdout)
            except Exception:  # noqa: BLE001 - a tree we cannot read says nothing; the host will
                return None
    return None


def _check_groups(inv, report: Report) -> dict[str, str]:
    """Groups that look like a typo of [main] or [rpc]: an error where the group meant is missing or
    empty (returned, typo -> meant), else a warning."""
    meant: dict[str, str] = {}
    for name, group in inv.groups.items():
        if name in ("all", "ungrouped", *TUNNELSPEC_GROUPS) or name in inv.hosts:
            continue
        close = difflib.get_close_matches(name, TUNNELSPEC_GROUPS, n=1, cutoff=0.6)
        if not close:
            continue  # a group of the user's own (e.g. to share variables): fine
        # With [rpc] missing or empty it is surely the typo; next to a real [rpc] it may be meant.
        severity = "warning" if close[0] in inv.groups and inv.group_hosts(close[0]) else "error"
        if severity == "error":
            meant[name] = close[0]
        report.add(
            Finding(
                severity,
                f"{inv.path}:{group.line or 1}: group [{name}] is not a tunnelspec group: "
                f"did you mean [{close[0]}]? (tunnelspec reads [main], one host, and [rpc], the nodes)",
                str(inv.path),
                group.line or 1,
            )
        )
    if "rpc" not in meant.values() and not ("rpc" in inv.groups and inv.group_hosts("rpc")):
        # No [rpc] and no typo of it: a single group of the user's own holding the nodes ([workers])
        # is surely where they went.
        mains = set(inv.group_hosts("main")) if "main" in inv.groups else set()
        own = [
            n
            for n, g in inv.groups.items()
            if n not in ("all", "ungrouped", *TUNNELSPEC_GROUPS, *meant)
            and n not in inv.hosts
            and set(inv.group_hosts(n)) - mains
        ]
        if len(own) == 1:
            name, line = own[0], inv.groups[own[0]].line or 1
            meant[name] = "rpc"
            report.add(
                Finding(
                    "error",
                    f"{inv.path}:{line}: group [{name}] is not a tunnelspec group and [rpc] has "
                    f"no host: the nodes go in [rpc] (rename [{name}] to [rpc], or keep it and add "
                    f"[rpc:children] with {name})",
                    str(inv.path),
                    line,
                )
            )
    return meant


def _as_meant(inv, meant: dict[str, str]):
    """The inventory read as the typo groups meant: each made a child of the group it is a typo of,
    so its hosts and variables are checked as that group's (the typo itself is reported apart)."""
    if not meant:
        return inv
    inv = copy.deepcopy(inv)
    for name, target in meant.items():
        if target not in inv.groups:
            inv.groups[target] = Group(target, parents=["all"], line=inv.groups[name].line)
            inv.groups["all"].children.append(target)
        if target in inv.ancestors(name) or name in inv.ancestors(target):
            continue  # already linked one way or the other: leave the graph acyclic
        inv.groups[target].children.append(name)
        inv.groups[name].parents.append(target)
    return inv


def _check_unknown_vars(inv, report: Report) -> None:
    layers = [(None, g.vars, g.origins) for g in inv.groups.values()]
    layers += [(h.name, h.vars, h.origins) for h in inv.hosts.values()]
    for host, values, origins in layers:
        for name in values:
            file, line = origins.get(name, (str(inv.path), None))
            if _ansible_not_read(name):
                report.add(
                    Finding(
                        "warning",
                        f"{file}:{line}: variable {name}: Ansible's, and tunnelspec does not read it: it has "
                        "no effect here (inventory.example.ini lists the Ansible variables tunnelspec reads)",
                        file,
                        line,
                        host,
                        name,
                    )
                )
                continue
            if not is_unknown_var(name) or nearest_var(name):
                continue  # known, yours, or so close to a known name that the model calls it an error
            hint = difflib.get_close_matches(name, KNOWN_VARS, n=1, cutoff=0.6)
            near = f" (the nearest tunnelspec variable is {hint[0]})" if hint else ""
            report.add(
                Finding(
                    "warning",
                    f"{file}:{line}: variable {name}: unknown, tunnelspec does not read it{near}; "
                    f"remove it, or keep it as your own by naming it {USER_VAR_PREFIX}{name}",
                    file,
                    line,
                    host,
                    name,
                )
            )


def _ansible_not_read(name: str) -> bool:
    """An `ansible_*` variable that is neither declared (cluster/schema.py: read or refused) nor a typo
    of a declared one (the model's error) nor one Ansible computes itself."""
    return (
        name.startswith("ansible_")
        and name not in schema.DECLARED
        and not schema.ansible_typo(name)
        and name not in ANSIBLE_INTERNAL_VARS
    )


def _check_extra_args(cluster, report: Report) -> None:
    """Arguments that look mis-quoted: a JSON value that is not JSON, a quote left inside an
    argument after the shell-like split (`"a b"` written where the INI value was already split)."""
    main = cluster.main
    for arg in main.extra_args:
        text = arg.strip()
        problem = None
        if text[:1] in "{[":
            try:
                json.loads(text)
            except json.JSONDecodeError as err:
                problem = (
                    f"the argument {arg!r} looks like JSON but is not valid JSON ({err.msg}); "
                    "quote it as one argument, e.g. a list: "
                    'llama_server_extra_args=["--chat-template-kwargs", \'{"key": true}\']'
                )
        elif ('"' in arg or "'" in arg) and not _is_json(text):
            problem = (
                f"the argument {arg!r} still holds a quote character after splitting; "
                "check the quoting (a list literal, one element per argument, needs none)"
            )
        if problem:
            warning = cluster_error(cluster.inventory, main.name, "llama_server_extra_args", problem)
            report.add(
                Finding("warning", str(warning), warning.file, warning.line, main.name, "llama_server_extra_args")
            )


def _check_recorded_build(cluster, report: Report) -> None:
    """The llama-server settings against the controller's record of the pinned build's --help, when
    it holds one (components/server/preflight.py; without one, deploy's preflight play asks main)."""
    try:
        result = preflight.check_recorded(cluster)
    except ClusterError as err:
        report.add(_from_error("error", err))
        return
    if result is not None:
        report.settings = result.line()


def _check_tls_files(cluster, report: Report) -> None:
    """A public bind's TLS files usable: your own, or the inventory's CA when it exists (commands/certs.py)."""
    if cluster.main.tls is None:
        return
    from tunnelspec.commands.certs import check_tls_files  # lazy: the x509 library, for a public bind only

    try:
        check_tls_files(cluster)
    except ClusterError as err:
        report.add(_from_error("error", err))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


# ---- patch files against the pinned tree (commands/check_patches.py) --------------------------------
def _check_patches_apply(cluster, report: Report) -> None:
    problem = patches_problem(cluster)
    if problem:
        err = cluster_error(cluster.inventory, cluster.main.name, "llama_patches", problem)
        report.add(Finding("error", str(err), err.file, err.line, cluster.main.name, "llama_patches"))
