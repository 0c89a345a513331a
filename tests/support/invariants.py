"""The checkers of SECURITY.md's invariants A and B, for tests/invariants/: each takes text (a rendered
unit, a module's source, a program) and returns what breaks the invariant, so that the same function
runs on the real tree and on a planted case.

(A) Root never follows, reads, writes, chmods, chowns or executes a path inside a directory a service
    user can write (tunnelspec/core/writable.py declares them).
(B) Every TCP listener tunnelspec starts is in the registry (tunnelspec/cluster/ports.py).
"""

from __future__ import annotations

import ast
import functools
import json
import re
import shlex
from dataclasses import dataclass

from tunnelspec.cluster import ports
from tunnelspec.core import writable

# ---- units -----------------------------------------------------------------------------------------
EXEC_KEYS = ("ExecCondition", "ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload", "ExecStop",
             "ExecStopPost")
# Paths systemd itself (PID 1, root) opens for the service before it runs.
ROOT_READ_KEYS = ("LoadCredential", "LoadCredentialEncrypted", "EnvironmentFile", "ImportCredential")
# The directories systemd makes for a unit, owned by its User=: each a place that user can write.
DIR_KEYS = {"RuntimeDirectory": "/run", "StateDirectory": "/var/lib", "CacheDirectory": "/var/cache",
            "LogsDirectory": "/var/log", "ConfigurationDirectory": "/etc"}
# More places a unit's user can write.
WRITABLE_KEYS = ("ReadWritePaths",)
SPECIFIERS = {"%t": "/run", "%S": "/var/lib", "%C": "/var/cache", "%L": "/var/log", "%E": "/etc",
              "%T": "/tmp", "%V": "/var/tmp"}
# Commands that read, write, change or run what they are given (named in a finding).
RISKY = {"chmod", "chown", "chgrp", "cat", "install", "cp", "mv", "rm", "ln", "python", "python3", "tee",
         "touch", "mkdir", "truncate", "sh", "bash", "dd", "find", "setfacl", "rsync", "tar", "head", "tail"}


@dataclass(frozen=True)
class UnitLine:
    line: int
    section: str
    key: str
    value: str


def unit_lines(text: str) -> list[UnitLine]:
    """key=value lines of a unit with their section (continuations joined, comments dropped)."""
    out, section, pending, start = [], "", "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if pending:
            line = pending + " " + line
        else:
            start = n
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        pending = ""
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif "=" in line:
            key, value = line.split("=", 1)
            out.append(UnitLine(start, section, key.strip(), value.strip()))
    return out


def unit_user(lines: list[UnitLine]) -> str:
    """The account the unit's commands run as ('root' without User=)."""
    users = [x.value for x in lines if x.section == "Service" and x.key == "User" and x.value]
    return users[-1] if users else "root"


def _expand(token: str) -> str:
    for spec, path in SPECIFIERS.items():
        token = token.replace(spec, path)
    return token.replace("%%", "%").replace("/var/run/", "/run/")


def exec_argv(value: str) -> tuple[str, list[str]]:
    """(prefixes, argv) of an Exec*= value: systemd's special prefixes (@-:+!) and its words."""
    m = re.match(r"^([@\-:+!|]*)(.*)$", value)
    prefixes, rest = (m.group(1), m.group(2)) if m else ("", value)
    try:
        words = shlex.split(rest)
    except ValueError:
        words = rest.split()
    return prefixes, [_expand(w) for w in words]


def root_exec_lines(text: str) -> list[tuple[UnitLine, list[str]]]:
    """Each Exec*= line root runs: every one of a unit without User= (or User=root), and those with
    the `+` (full privileges) or `!` (User= not applied) prefix in any unit."""
    lines = unit_lines(text)
    as_root = unit_user(lines) in ("root", "0")
    out = []
    for x in lines:
        if x.section == "Service" and x.key in EXEC_KEYS and x.value:
            prefixes, argv = exec_argv(x.value)
            if as_root or "+" in prefixes or "!" in prefixes:
                out.append((x, argv))
    return out


@dataclass(frozen=True)
class Protected:
    path: str
    what: str
    directory: bool  # a directory (anything inside is protected) or one file


def protected_paths(cluster) -> list[Protected]:
    """The service-writable places (core/writable.py) and the files a service user owns, with the
    cluster's own paths for the ones the inventory names (the API key, the scrape token)."""
    out = [Protected(p.path, f"{p.user}'s {p.directive or 'shared directory'}", True) for p in writable.PLACES]
    main = cluster.main
    named = {writable.API_KEY.var: main.api_key_file,
             writable.METRICS_TOKEN.var: main.front.metrics.token_file if main.front.metrics else None}
    for f in writable.SERVICE_FILES:
        path = named.get(f.var) if f.var else f.path
        if path:
            out.append(Protected(path, f"{f.user}'s file ({f.var or 'fixed'})", False))
    return out


def _mentions(token: str, p: Protected) -> bool:
    i = token.find(p.path)
    while i >= 0:
        after = token[i + len(p.path):i + len(p.path) + 1]
        if after == "" or after == "/" or not (after.isalnum() or after in "-_."):
            return True
        i = token.find(p.path, i + 1)
    return False


def root_path_findings(text: str, protected: list[Protected]) -> list[str]:
    """Each root-run line of a unit that names a protected path, and each path systemd opens as
    root for the unit (LoadCredential=, EnvironmentFile=) inside a service-writable directory."""
    out = []
    for x, argv in root_exec_lines(text):
        for p in protected:
            hits = [w for w in argv if _mentions(w, p)]
            if hits:
                inner = unwrapped(argv) or argv
                cmd = inner[0].rsplit("/", 1)[-1] if inner else "?"
                verb = f"runs {cmd}" if cmd in RISKY else f"runs {cmd or '?'} with"
                out.append(f"line {x.line}: {x.key}={x.value}: root {verb} {hits[0]} — inside {p.path}, {p.what}")
    for x in unit_lines(text):
        if x.section == "Service" and x.key in ROOT_READ_KEYS:
            path = _expand(x.value.split(":", 1)[1] if x.key.startswith(("LoadCredential", "ImportCredential"))
                           and ":" in x.value else x.value.lstrip("-"))
            for p in protected:
                if p.directory and _mentions(path, p):
                    out.append(f"line {x.line}: {x.key}={x.value}: systemd (root) opens {path} — inside {p.path}, {p.what}")
    return out


def service_writable_dirs(text: str) -> list[tuple[str, str, str]]:
    """(user, directive, path) of each place a unit's (non-root) user can write by the unit's own
    directives: RuntimeDirectory= and the like, ReadWritePaths=."""
    lines = unit_lines(text)
    user = unit_user(lines)
    if user in ("root", "0"):
        return []
    out = []
    for x in lines:
        if x.section != "Service":
            continue
        if x.key in DIR_KEYS:
            out += [(user, x.key, f"{DIR_KEYS[x.key]}/{_expand(v).strip('/')}") for v in x.value.split()]
        elif x.key in WRITABLE_KEYS:
            out += [(user, x.key, _expand(v).lstrip("-")) for v in x.value.split()]
    return out


# ---- code that sends commands to hosts -------------------------------------------------------------
@functools.lru_cache(maxsize=512)
def parsed(source: str) -> ast.Module:
    """A module's tree, parsed once per distinct source (the checks walk every module several times)."""
    return ast.parse(source)


def needles() -> tuple[str, ...]:
    """How a service-writable place is spelled in code: its path, and its systemd specifier form."""
    out = [p.path for p in writable.PLACES]
    for spec, base in SPECIFIERS.items():
        out += [spec + p.path[len(base):] for p in writable.PLACES if p.path.startswith(base + "/")]
    return tuple(out)


# The declaration's own names: a reference to one of these is a reference to the places.
DECLARED = frozenset({"LLAMA_RUN", "FRONT_RUN", "RPC_CACHE", "SHARED_SHM", "SERVICE_DIRS", "PLACES"})


@dataclass(frozen=True)
class Ref:
    module: str
    scope: str     # the function (dotted), or the module-level name assigned, or <module>
    line: int
    what: str


def _text_of(node) -> str | None:
    """A string expression's text with `{}` for what is computed: constants, f-strings, `+` of
    strings, os.path.join / posixpath.join of strings."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant)
                       else v.value.value if isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Constant)
                       and isinstance(v.value.value, str) and v.conversion == -1 and v.format_spec is None
                       else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text_of(node.left), _text_of(node.right)
        if left is not None or right is not None:
            return (left if left is not None else "{}") + (right if right is not None else "{}")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" \
            and not (isinstance(node.func.value, ast.Constant)):
        parts = [_text_of(a) for a in node.args]
        if any(p is not None for p in parts):
            return "/".join(p if p is not None else "{}" for p in parts)
    return None


def _has_needle(text: str, found: tuple[str, ...]) -> str | None:
    for n in found:
        i = text.find(n)
        while i >= 0:
            after = text[i + len(n):i + len(n) + 1]
            if after in ("", "/", "{") or not (after.isalnum() or after in "-_."):
                return n
            i = text.find(n, i + 1)
    return None


class _Scoper(ast.NodeVisitor):
    def __init__(self, module: str, names: frozenset[str], spelled: tuple[str, ...]):
        self.module, self.names, self.spelled = module, names, spelled
        self.stack: list[str] = []
        self.assign: str | None = None
        self.refs: list[Ref] = []

    def scope(self) -> str:
        if self.stack:
            return ".".join(self.stack)
        return self.assign or "<module>"

    def _def(self, node):
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _def

    def _assign(self, node, targets):
        if not self.stack:
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            self.assign = names[0] if names else None
            self.generic_visit(node)
            self.assign = None
        else:
            self.generic_visit(node)

    def visit_Assign(self, node):
        self._assign(node, node.targets)

    def visit_AnnAssign(self, node):
        self._assign(node, [node.target])

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring: words, not a command
        self.generic_visit(node)

    def _add(self, node, what: str):
        self.refs.append(Ref(self.module, self.scope(), node.lineno, what))

    def generic_visit(self, node):
        text = _text_of(node) if isinstance(node, (ast.JoinedStr, ast.BinOp, ast.Call, ast.Constant)) else None
        if text is not None:
            hit = _has_needle(text, self.spelled)
            if hit:
                self._add(node, f"{hit!r} in {text[:80]!r}")
                return  # its parts are the same reference
        if isinstance(node, ast.Name) and node.id in self.names and not isinstance(node.ctx, ast.Store):
            self._add(node, f"name {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in self.names:
            self._add(node, f"name {node.attr}")
        elif isinstance(node, ast.ImportFrom) or isinstance(node, ast.Import):
            return  # importing a name is no use of it
        super().generic_visit(node)


def path_refs(module: str, source: str, names: frozenset[str] = DECLARED) -> list[Ref]:
    """Each place in a module's source that spells a service-writable place or names a constant that
    holds one (`names`), with its scope."""
    v = _Scoper(module, names, needles())
    v.visit(parsed(source))
    # One finding per scope and line (an f-string's parts, a name inside a join).
    seen, out = set(), []
    for r in v.refs:
        if (r.scope, r.line) not in seen:
            seen.add((r.scope, r.line))
            out.append(r)
    return out


def holding_names(sources: dict[str, str]) -> frozenset[str]:
    """The module-level constants (over all `sources`) whose value refers to a service-writable place,
    directly or through another such name; with the declaration's own. These are what a reference
    through a constant looks like (`front.STATE_PATH`, `FRONT_STATS`)."""
    spelled = needles()
    assigned = []  # (name, the names its value uses, whether its value spells a place)
    for source in sources.values():
        for node in parsed(source).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) and node.value is not None else []
            for t in targets:
                if isinstance(t, ast.Name) and t.id.isupper():
                    used = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)} | \
                           {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)}
                    texts = [_text_of(n) for n in ast.walk(node.value)]
                    assigned.append((t.id, used, any(x is not None and _has_needle(x, spelled) for x in texts)))
    names = set(DECLARED)
    while True:
        more = {name for name, used, spells in assigned if spells or used & names}
        if more <= names:
            return frozenset(names)
        names |= more


def yaml_refs(name: str, text: str) -> list[Ref]:
    """A playbook's lines that spell a service-writable place, each with its task's name."""
    out, task = [], "<play>"
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s*-\s+name:\s*(.+?)\s*$", line)
        if m:
            task = m.group(1).strip("\"'")
        if not line.lstrip().startswith("#") and (hit := _has_needle(line, needles())):
            out.append(Ref(name, task, n, f"{hit!r} in {line.strip()[:80]!r}"))
    return out


# ---- programs root runs on main (tunnelspec/hostprogs/) ----------------------------------------------------
def program_modes(source: str) -> dict[str, str]:
    """mode -> its header line's words (`#   tunnelspec-x MODE CONFIG   who runs it: what`)."""
    out = {}
    for line in source.splitlines():
        if not line.startswith("#"):
            if line.strip():
                break
            continue
        m = re.match(r"^#\s+tunnelspec-[\w-]+ ([a-z]+) [A-Z]+\s+(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _functions(tree) -> dict[str, ast.AST]:
    return {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def reachable(source: str, entries: list[str]) -> set[str]:
    """The module's functions an entry calls, directly or not (by name, within the module)."""
    fns = _functions(parsed(source))
    seen, todo = set(), [e for e in entries if e in fns]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        for n in ast.walk(fns[f]):
            if isinstance(n, ast.Name) and n.id in fns:
                todo.append(n.id)
    return seen


def config_keys(doc, holds=writable.place_of) -> set[str]:
    """The keys of a configuration document (JSON) whose value is a path in a service-writable place."""
    out = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            if isinstance(v, str) and holds(v):
                out.add(k)
            out |= config_keys(v, holds)
    elif isinstance(doc, list):
        for v in doc:
            out |= config_keys(v, holds)
    return out


def key_uses(source: str, keys: set[str]) -> dict[str, set[str]]:
    """function -> the `keys` it reads from a configuration (`cfg["state"]`, `f.get("stats")`)."""
    out: dict[str, set[str]] = {}
    for name, fn in _functions(parsed(source)).items():
        for n in ast.walk(fn):
            key = None
            if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant):
                key = n.slice.value
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" \
                    and n.args and isinstance(n.args[0], ast.Constant):
                key = n.args[0].value
            if key in keys:
                out.setdefault(name, set()).add(key)
    return out


def root_key_uses(source: str, entries: list[str], keys: set[str]) -> set[tuple[str, str]]:
    """(function, key) for each function root's `entries` reach that reads a service-writable path
    from the configuration."""
    reach = reachable(source, entries)
    return {(f, k) for f, ks in key_uses(source, keys).items() if f in reach for k in ks}


def opens_only_without_following(source: str, function: str) -> tuple[bool, str]:
    """(True, '') when `function` opens files only with os.open(…, …O_NOFOLLOW…), never with open()
    or a socket's connect (both follow a link); else (False, why)."""
    fn = _functions(parsed(source)).get(function)
    if fn is None:
        return False, f"no function {function}"
    os_opens = 0
    for n in ast.walk(fn):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if name == "open" and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "os":
            flags = ast.unparse(n.args[1]) if len(n.args) > 1 else ""
            if "O_NOFOLLOW" not in flags:
                return False, f"line {n.lineno}: os.open without O_NOFOLLOW ({flags})"
            os_opens += 1
        elif name in ("open", "connect", "readlink", "realpath"):
            return False, f"line {n.lineno}: {ast.unparse(n)[:60]}"
    return (os_opens > 0, "" if os_opens else "opens nothing with os.open")


# ---- (B) listeners ---------------------------------------------------------------------------------
def _port(value: str) -> int | None:
    return int(value) if value.isdigit() else None


WRAPPERS = ("stdbuf", "env", "nice", "ionice", "setpriv", "timeout", "chrt", "taskset")


def unwrapped(argv: list[str]) -> list[str]:
    """The command a wrapper (stdbuf -oL, env A=B, setpriv --reuid=…) runs."""
    argv = list(argv)
    while argv and argv[0].rsplit("/", 1)[-1] in WRAPPERS:
        argv = argv[1:]
        while argv and (argv[0].startswith("-") or "=" in argv[0]):
            argv = argv[1:]
    return argv


def argv_listens(argv: list[str]) -> list[tuple[int, str]]:
    """(port, how) each TCP listener a command line starts: ssh's -L/-D (local) and -R (the far side),
    a server's --port/-p (ssh's own -p is where it connects), --listen."""
    out = []
    argv = unwrapped(argv)
    is_ssh = bool(argv) and argv[0].rsplit("/", 1)[-1] == "ssh"
    for i, a in enumerate(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if is_ssh:
            if a in ("-L", "-D", "-R"):
                parts = nxt.split(":")
                # [bind:]port:host:hostport (-L, -R) or [bind:]port (-D)
                p = parts[-3] if a != "-D" and len(parts) >= 3 else parts[-1]
                if (port := _port(p)) is not None:
                    out.append((port, f"ssh {a} {nxt}" + (" (listens on the far host)" if a == "-R" else "")))
            continue
        if a in ("--port", "-p", "--listen", "--http-port") and (port := _port(nxt.rsplit(":", 1)[-1])) is not None:
            out.append((port, f"{argv[0].rsplit('/', 1)[-1]} {a} {nxt}"))
        elif a.startswith("--port=") and (port := _port(a.split("=", 1)[1])) is not None:
            out.append((port, a))
    return out


def _argvs(doc) -> list[list[str]]:
    """Command lines inside a configuration document: lists of strings whose first is a path."""
    if isinstance(doc, list):
        if doc and all(isinstance(x, str) for x in doc) and doc[0].startswith("/"):
            return [doc]
        return [a for v in doc for a in _argvs(v)]
    if isinstance(doc, dict):
        return [a for v in doc.values() for a in _argvs(v)]
    return []


def listens(dest: str, text: str) -> list[tuple[int, str]]:
    """(port, how) of every TCP listener a rendered file starts or configures: a unit's command
    lines, the front's `bind` lines, a JSON configuration's command lines and `listen`, sshd's Port."""
    out: list[tuple[int, str]] = []
    if dest.endswith(".service"):
        for x in unit_lines(text):
            if x.section == "Service" and x.key in EXEC_KEYS:
                out += argv_listens(exec_argv(x.value)[1])
    elif dest.endswith(".json"):
        doc = json.loads(text)
        for argv in _argvs(doc):
            out += argv_listens(argv)
        if isinstance(doc, dict) and isinstance(doc.get("listen"), list) and len(doc["listen"]) == 2:
            out.append((int(doc["listen"][1]), f"listen {doc['listen']}"))
    elif dest.endswith(".cfg"):  # HAProxy
        for line in text.splitlines():
            m = re.match(r"^\s*bind\s+(\S+)", line)
            if m and not m.group(1).startswith(("unix@", "/", "abns@")):
                port = _port(m.group(1).rsplit(":", 1)[-1])
                out.append((port if port is not None else -1, line.strip()))
    elif "sshd_config" in dest:
        for line in text.splitlines():
            m = re.match(r"^\s*(Port|ListenAddress)\s+(\S+)", line)
            if m:
                out.append((_port(m.group(2).rsplit(":", 1)[-1]) or -1, line.strip()))
    return out


def front_connects(text: str) -> list[tuple[int, str]]:
    """(port, line) of every TCP server the front (HAProxy) connects to."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^\s*server\s+\S+\s+(\S+)", line)
        if m and not m.group(1).startswith(("unix@", "/")):
            out.append((_port(m.group(1).rsplit(":", 1)[-1]) or -1, line.strip()))
    return out


def unregistered(cluster, host: str, found: list[tuple[int, str]]) -> list[str]:
    registered = {x.port for x in ports.on_host(cluster, host)}
    return [f"{host}: port {p} ({how}) is not in cluster/ports.py's listeners for {host} "
            f"({sorted(registered)})" for p, how in found if p not in registered]


_PORT_HUNT = re.compile(r"(free|unused|pick|find|spare|next|open|available)_?(tcp_?)?ports?$", re.I)
_SERVER_CLASSES = re.compile(r"(HTTPServer|TCPServer|UDPServer)$")
# String constants that ask a program to listen: llama-server's and most servers' port flag, the
# standard library's HTTP server, socat. (ssh's -L/-R/-D are recognised with their value.)
_LISTEN_WORDS = ("--port", "--listen", "http.server")


class _Listeners(_Scoper):
    def __init__(self, module: str):
        super().__init__(module, frozenset(), ())

    def _def(self, node):
        where = ".".join(self.stack + [node.name])
        if not isinstance(node, ast.ClassDef) and _PORT_HUNT.search(node.name):
            self.refs.append(Ref(self.module, where, node.lineno, f"picks a port: def {node.name}"))
        if isinstance(node, ast.ClassDef):
            for b in node.bases:
                if _SERVER_CLASSES.search(ast.unparse(b)):
                    self.refs.append(Ref(self.module, where, node.lineno,
                                         f"a listener: class {node.name}({ast.unparse(b)})"))
        super()._def(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _def

    def visit_Call(self, node):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        what = None
        if name == "range" and "port" in (src := ast.unparse(node)).lower():
            what = f"hunts a port: {src[:70]}"
        elif name == "bind" and node.args and isinstance(node.args[0], ast.Tuple) and len(node.args[0].elts) == 2:
            what = f"a listener: {ast.unparse(node)[:70]}"
        elif name in ("listen", "create_server", "start_server") or _SERVER_CLASSES.search(name):
            what = f"a listener: {ast.unparse(node)[:70]}"
        if what:
            self._add(node, what)
        self.generic_visit(node)

    def visit_For(self, node):
        it = node.iter
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range" \
                and "port" in ast.unparse(node.target).lower() and "port" not in ast.unparse(it).lower():
            self._add(it, f"hunts a port: for {ast.unparse(node.target)} in {ast.unparse(it)[:60]}")
        self.generic_visit(node)

    def visit_List(self, node):
        for i, e in enumerate(node.elts):
            nxt = _text_of(node.elts[i + 1]) if i + 1 < len(node.elts) else None
            if isinstance(e, ast.Constant) and e.value in ("-L", "-R", "-D") and nxt is not None and ":" in nxt:
                self._add(node, f"ssh forward: {e.value} {nxt}")
            # A server's host and port pair (rpc-server's -H … -p …).
            if isinstance(e, ast.Constant) and e.value == "-p" and any(
                    isinstance(x, ast.Constant) and x.value in ("-H", "--host") for x in node.elts):
                self._add(node, f"asks a program to listen: {ast.unparse(node)[:70]}")
        self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str) and (node.value in _LISTEN_WORDS or node.value.startswith("TCP-LISTEN")):
            self._add(node, f"asks a program to listen: {node.value!r}")


def listener_sites(module: str, source: str) -> list[Ref]:
    """Code that picks a port or opens a listener: a function named like `_free_port`, a `range()`
    over ports, a socket's bind/listen, an HTTP/TCP server (a class or a call), an asyncio server,
    and argv that asks a program to listen (ssh -L/-R/-D, --port, --listen, http.server, socat)."""
    v = _Listeners(module)
    v.visit(parsed(source))
    seen, out = set(), []
    for r in v.refs:
        if (r.scope, r.line, r.what) not in seen:
            seen.add((r.scope, r.line, r.what))
            out.append(r)
    return out
