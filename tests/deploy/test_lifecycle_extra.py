"""More of the lifecycle in the lab (real hosts, real systemd, real llama.cpp build, tiny model):
a model uploaded from the controller, `teardown --purge`, `deploy --check` as a pull-request gate,
CI credentials with the real deploy, and the public-bind opt-out with an API key.

Another engineer may use the same lab at the same time (stopping llama-server, redeploying), so
every test first establishes the state it needs with a deploy, and ends with the lab's own
inventory deployed again (the default: loopback bind, the fixture models).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shutil
import time
from pathlib import Path

import pytest

from support.ci_cli import ci_env, cli
from support.cli import tunnelspec
from support.labdeploy import (DEPLOY_TIMEOUT, FRONT_CONFIG, MODELS_DIR, UNIT, configured_cmdline, converge, deploy, failures, inventory_copy,
                               main_pid, sh, task, verify_stats)

pytestmark = pytest.mark.lab

RPC_UNIT = "tunnelspec-rpc.service"


def file_identity(lab, host: str, path: str) -> tuple[str, str, str]:
    """(inode, mtime in ns, sha256) of a file on a host; ('', '', '') when absent."""
    out = sh(lab, host, "sh", "-c", '[ -f "$1" ] || exit 0; stat -c "%i %.9Y" -- "$1"; sha256sum < "$1"', "sh", path)
    parts = out.split()
    return (parts[0], parts[1], parts[2]) if len(parts) >= 3 else ("", "", "")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- 1. a model that exists only on the controller is uploaded once ---------------------------------
def test_model_only_on_the_controller_is_uploaded_once(lab, tmp_path, llama_fixtures):
    converge(lab.inventory)  # the plan below is read against a deployed lab (binaries, tunnels)
    local = tmp_path / "controller-models" / "ts-upload-draft.gguf"
    local.parent.mkdir()
    shutil.copyfile(llama_fixtures.model_local, local)
    dest = f"{MODELS_DIR}/{local.name}"
    inv = inventory_copy(lab, tmp_path, main_vars={"llama_draft_model": str(local)})
    # The controller's path does not exist on main (the lab hosts have their own file systems), so
    # the rule "an absolute path present on the host is used in place" does not apply here.
    assert sh(lab, "main", "sh", "-c", '[ -e "$1" ] && echo present || :', "sh", str(local)).strip() == ""
    sh(lab, "main", "rm", "-f", "--", dest)
    try:
        plan = deploy(inv, "--check")
        assert plan.rc == 3, failures(plan)
        assert task(plan, "draft model").get("would_change") and file_identity(lab, "main", dest) == ("", "", "")
        first = deploy(inv)
        assert first.rc == 0, failures(first)
        up = task(first, "draft model")
        assert up["status"] == "changed" and "upload" in up["msg"], up
        assert file_identity(lab, "main", dest)[2] == sha256_of(local)
        unit = configured_cmdline(lab)
        assert f"--spec-draft-model {dest}" in unit, unit
        draft_n, accepted = verify_stats(first)
        assert draft_n > 0 and accepted == draft_n  # draft = target (same tiny model): all accepted
        ver = tunnelspec("verify", str(inv), "--format", "json", timeout=600)
        assert ver.rc == 0, failures(ver)
        assert verify_stats(ver)[1] > 0
        # No temp file left beside the model (the upload goes to a temp name, then is renamed).
        assert "tunnelspec-upload" not in sh(lab, "main", "ls", "-a", MODELS_DIR)

        before = file_identity(lab, "main", dest)
        pid = main_pid(lab)
        second = deploy(inv)
        assert second.rc == 0, failures(second)
        again = task(second, "draft model")
        assert again["status"] == "ok" and "up to date" in again["msg"], again
        # Only "llama-server running" may change: a benchmark sharing the lab stops the server at times.
        changed = {e["task"] for e in second.results("changed")}
        assert changed <= {"llama-server running"}, changed
        assert file_identity(lab, "main", dest) == before  # same inode, same mtime: not re-uploaded

        # A changed file on the controller (trailing bytes after the tensor data: still a valid GGUF)
        # is uploaded again, and llama-server restarted so that it serves the new file.
        with local.open("ab") as f:
            f.write(b"\0" * 64)
        third = deploy(inv)
        assert third.rc == 0, failures(third)
        assert task(third, "draft model")["status"] == "changed"
        assert task(third, "llama-server restart")["status"] == "changed"
        assert file_identity(lab, "main", dest)[2] == sha256_of(local) != before[2]
        assert main_pid(lab) not in (0, pid)
        assert verify_stats(third)[1] > 0

        # Back to the lab's own draft: the uploaded file is no longer named by the inventory, so it
        # goes (after the unit names the other model); a second deploy has nothing left to remove.
        back = deploy(lab.inventory)
        assert back.rc == 0, failures(back)
        pruned = task(back, "uploaded models no longer used")
        assert pruned["status"] == "changed" and dest in pruned["msg"], pruned
        assert file_identity(lab, "main", dest) == ("", "", "")
        assert f"--spec-draft-model {dest}" not in configured_cmdline(lab)
        assert verify_stats(back)[1] > 0
        again = deploy(lab.inventory)
        assert again.rc == 0 and task(again, "uploaded models no longer used")["status"] == "ok", failures(again)
    finally:
        converge(lab.inventory)


def test_two_controller_models_with_one_name_are_refused(lab, tmp_path, llama_fixtures):
    """Both would land in the same upload path and overwrite each other on every deploy."""
    paths = []
    for d in ("target", "draft"):
        (tmp_path / d).mkdir()
        paths.append(tmp_path / d / "ts-same-name.gguf")
        shutil.copyfile(llama_fixtures.model_local, paths[-1])
    with paths[1].open("ab") as f:
        f.write(b"\0" * 64)  # different content, same name
    inv = inventory_copy(lab, tmp_path, main_vars={"llama_model": str(paths[0]), "llama_draft_model": str(paths[1])})
    try:
        r = deploy(inv)
        assert r.rc == 1, failures(r)
        (failed,) = r.results("failed")
        assert failed["task"] == "draft model" and "different file names" in failed["msg"], failed
        assert str(paths[0]) in failed["msg"] and str(paths[1]) in failed["msg"]
        assert "ts-same-name.gguf" not in configured_cmdline(lab)
    finally:
        converge(lab.inventory)


# --- 2. teardown --purge, then deploy again -------------------------------------------------------
def _listeners(lab) -> dict:
    found = {}
    for host, ports in (("main", (8080, 15052, 15053)), ("rpc-a", (50052,)), ("rpc-b", (50052,))):
        listen = sh(lab, host, "ss", "-Hltn")
        hits = [p for p in ports if re.search(rf":{p}\s", listen)]
        if hits:
            found[host] = hits
    return found


def test_purge_removes_everything_and_deploy_rebuilds(lab, tmp_path, llama_fixtures):
    # Establish: deployed, with an uploaded model on main (so the purge has one to remove).
    local = tmp_path / "ts-purge-draft.gguf"
    shutil.copyfile(llama_fixtures.model_local, local)
    converge(inventory_copy(lab, tmp_path, main_vars={"llama_draft_model": str(local)}))
    purged = {"main": ["/opt/tunnelspec/src", "/opt/tunnelspec/build", "/opt/tunnelspec/current",
                       "/opt/tunnelspec", f"{MODELS_DIR}/{local.name}", MODELS_DIR],
              "rpc-a": ["/opt/tunnelspec/src", "/opt/tunnelspec/build", "/opt/tunnelspec", "/var/cache/tunnelspec-rpc"],
              "rpc-b": ["/opt/tunnelspec/src", "/opt/tunnelspec/build", "/opt/tunnelspec", "/var/cache/tunnelspec-rpc"]}
    for host, paths in purged.items():
        present = sh(lab, host, "sh", "-c", 'for p; do [ -e "$p" ] && echo "$p"; done; :', "sh", *paths).split()
        assert present, (host, "nothing to purge: the deploy did not create its files?")
    try:
        r = tunnelspec("teardown", str(lab.inventory), "--purge", "--format", "json", timeout=600)
        assert r.rc == 0, failures(r)
        for host, paths in purged.items():
            left = sh(lab, host, "sh", "-c", 'for p; do [ -e "$p" ] && echo "$p"; done; :', "sh", *paths).split()
            assert left == [], (host, left)
            # The shared ccache is not tunnelspec's to remove: it is what makes the redeploy cheap.
            assert sh(lab, host, "sh", "-c", '[ -d /var/cache/ccache ] && echo yes || :').strip() == "yes"
        assert _listeners(lab) == {}
        assert sh(lab, "main", "sh", "-c", "pgrep -l -x 'llama-server|ggml-rpc-server|rpc-server' || :").strip() == ""
        again = tunnelspec("teardown", str(lab.inventory), "--purge", "--format", "json", timeout=600)
        assert again.rc == 0 and all(c["changed"] == 0 for c in again.recap.values()), again.results("changed")
    finally:
        hits_before = _ccache_stats(lab)
        started = time.monotonic()
        r = deploy(lab.inventory)
        seconds = time.monotonic() - started
        hits_after = _ccache_stats(lab)
    assert r.rc == 0, failures(r)
    draft_n, accepted = verify_stats(r)
    assert draft_n > 0 and accepted == draft_n
    for host in purged:  # sources and builds came back on every host
        assert task(r, "llama.cpp source at the pinned commit with the patch stack", host)["status"] == "changed"
        assert task(r, "llama.cpp binaries for the host's role", host)["status"] == "changed"
    # The builds came back from the shared ccache (the lab mounts one cache into every host).
    hits, misses = (hits_after[k] - hits_before[k] for k in ("hit", "miss"))
    assert hits > 0 and misses < hits, (hits, misses)
    print(f"redeploy after purge: {seconds:.0f} s, ccache {hits} hits / {misses} misses")


def _ccache_stats(lab) -> dict:
    out = sh(lab, "main", "ccache", "--print-stats")
    stats = dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)
    return {"hit": int(stats.get("direct_cache_hit", 0)) + int(stats.get("preprocessed_cache_hit", 0)),
            "miss": int(stats.get("cache_miss", 0))}


# --- 3. deploy --check: the pull-request gate -----------------------------------------------------
def test_check_gate_reports_a_changed_unit_option_and_changes_nothing(lab, tmp_path):
    converge(lab.inventory)
    clean = deploy(lab.inventory, "--check")
    assert clean.rc == 0, failures(clean)
    assert all(c["changed"] == 0 for c in clean.recap.values()), clean.results("changed")
    assert not [e for e in clean.results() if e.get("would_change")]

    unit_path = f"/etc/systemd/system/{RPC_UNIT}"
    before = (sh(lab, "rpc-a", "cat", unit_path), file_identity(lab, "rpc-a", unit_path))
    pid = sh(lab, "rpc-a", "systemctl", "show", "-p", "MainPID", "--value", RPC_UNIT).strip()
    edited = inventory_copy(lab, tmp_path, host_vars={"rpc-a": "rpc_threads=1"})
    plan = tunnelspec("deploy", str(edited), "--check", "--diff", timeout=600)
    assert plan.rc == 3, (plan.stdout[-4000:], plan.stderr[-2000:])
    # The unit's diff names the option: the ExecStart line gains `-t 1`.
    added = [l.strip() for l in plan.stdout.splitlines() if l.strip().startswith("+ExecStart=")]
    assert added and all(" -t 1" in l for l in added), plan.stdout[-4000:]
    assert "would change" in plan.stdout
    as_json = deploy(edited, "--check")
    assert as_json.rc == 3
    would = {(e["host"], e["task"]) for e in as_json.results() if e.get("would_change")}
    assert would and {h for h, _ in would} == {"rpc-a"}, would
    # Nothing on the host changed.
    assert (sh(lab, "rpc-a", "cat", unit_path), file_identity(lab, "rpc-a", unit_path)) == before
    assert sh(lab, "rpc-a", "systemctl", "show", "-p", "MainPID", "--value", RPC_UNIT).strip() == pid
    assert "-t 1" not in sh(lab, "rpc-a", "systemctl", "show", "-p", "ExecStart", "--value", RPC_UNIT)


# --- 4. CI credentials with the real deploy ---------------------------------------------------------
def test_ci_credentials_with_the_real_deploy(lab, tmp_path):
    converge(lab.inventory)
    pinned = tmp_path / "pinned_known_hosts"
    inv = inventory_copy(lab, tmp_path, "ci.ini", drop=("ansible_ssh_private_key_file=", "tunnelspec_known_hosts="),
                         extra=(f"tunnelspec_known_hosts={pinned}",))
    key, known = lab.key_file.read_text(), lab.known_hosts.read_text()
    home = tmp_path / "home"
    env = ci_env(home, TUNNELSPEC_SSH_KEY=key, TUNNELSPEC_KNOWN_HOSTS=known)
    assert "SSH_AUTH_SOCK" not in env
    r = cli("deploy", str(inv), "--format", "json", env=env, timeout=DEPLOY_TIMEOUT)
    assert r.rc == 0, failures(r)
    assert sorted(r.recap) == ["main", "rpc-a", "rpc-b"]
    assert all(c["changed"] == 0 for c in r.recap.values()), [e for e in r.events if e.get("status") == "changed"]
    assert list(home.iterdir()) == [] and not pinned.exists()
    assert key not in r.stdout + r.stderr

    # Known hosts withheld: every host unreachable with its real fingerprint, nothing pinned.
    env = ci_env(tmp_path / "home2", TUNNELSPEC_SSH_KEY=key)
    r = cli("deploy", str(inv), "--format", "json", env=env, timeout=600)
    assert r.rc == 4, failures(r)
    msgs = {e["host"]: e["msg"] for e in r.of("unreachable")}
    assert sorted(msgs) == ["main", "rpc-a", "rpc-b"], msgs
    fps = _fingerprints(lab, known)
    for host, msg in msgs.items():
        assert "unknown host key" in msg and fps[host] in msg, msg
    assert not pinned.exists()

    # Accepted explicitly into an empty pinned file: the deploy passes and the real keys are pinned.
    pinned.write_text("")
    r = cli("deploy", str(inv), "--format", "json", "--accept-new-host-keys", env=env, timeout=DEPLOY_TIMEOUT)
    assert r.rc == 0, failures(r)
    assert sorted(e["host"] for e in r.of("host_key_pinned")) == ["main", "rpc-a", "rpc-b"]
    assert {l.split()[2] for l in pinned.read_text().splitlines() if l.strip()} == \
        {l.split()[2] for l in known.splitlines() if l.strip()}
    r = cli("deploy", str(inv), "--format", "json", env=env, timeout=DEPLOY_TIMEOUT)
    assert r.rc == 0 and r.of("host_key_pinned") == [], r.stdout[-3000:]
    assert all(c["changed"] == 0 for c in r.recap.values())


def _fingerprints(lab, known_text: str) -> dict:
    import asyncssh

    by_ip = {l.split()[0]: asyncssh.import_public_key(" ".join(l.split()[1:3])).get_fingerprint("sha256")
             for l in known_text.splitlines() if l.strip()}
    return {name: by_ip[ip] for name, ip in lab.hosts.items()}


# --- 5. public bind with an API key -----------------------------------------------------------------
KEY_FILE = "/etc/tunnelspec/llama-api-key"


def _http_from(lab, host: str, url: str, key: str | None, ca: Path | None = None) -> int:
    """HTTP status of a request sent from another lab host (its own python3): a tiny completion for
    /completion, else a GET. `ca`: the CA (a controller file) the client pins for https."""
    if ca is not None:
        lab.exec(host, ["sh", "-c", "cat > /tmp/tunnelspec-test-ca.crt"], input=ca.read_text(), timeout=30)
    script = (
        "import json,ssl,sys,urllib.request,urllib.error\n"
        "h={'Content-Type':'application/json'}\n"
        "if len(sys.argv)>2 and sys.argv[2]: h['Authorization']='Bearer '+sys.argv[2]\n"
        "ctx=ssl.create_default_context(cafile='/tmp/tunnelspec-test-ca.crt') if len(sys.argv)>3 else None\n"
        "body=json.dumps({'prompt':'Hi','n_predict':2}).encode() if sys.argv[1].endswith('/completion') else None\n"
        "req=urllib.request.Request(sys.argv[1],data=body,headers=h)\n"
        "try:\n print(urllib.request.urlopen(req,timeout=30,context=ctx).status)\n"
        "except urllib.error.HTTPError as e:\n print(e.code)\n"
        "except Exception as e:\n print(0)\n")
    args = [url, key or ""] + (["ca"] if ca is not None else [])
    out = sh(lab, host, "python3", "-c", script, *args).strip()
    return int(out.splitlines()[-1]) if out else 0


def test_public_bind_with_api_key(lab, tmp_path):
    converge(lab.inventory)
    main_ip = lab.hosts["main"]
    key = secrets.token_hex(24)
    public = {"llama_server_host": main_ip, "llama_server_public_bind": "true"}
    refused = inventory_copy(lab, tmp_path, "no-key.ini", main_vars=public)
    r = deploy(refused)
    assert r.rc == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert "llama_server_api_key_file" in r.stdout + r.stderr

    converge(lab.inventory)
    # The key file lives on the main host (an absolute path there), written by the operator:
    # world-readable here on purpose, so the deploy has to fix owner and mode.
    sh(lab, "main", "sh", "-c", 'umask 022; mkdir -p "$(dirname "$2")"; printf "%s\\n" "$1" > "$2"', "sh", key, KEY_FILE)
    inv = inventory_copy(lab, tmp_path, "public.ini", main_vars={**public, "llama_server_api_key_file": KEY_FILE})
    # A key file the llama user cannot reach (a parent directory closed to it) fails at once, by
    # name, instead of a server that never becomes healthy.
    closed_dir = "/etc/tunnelspec-test-closed"
    sh(lab, "main", "sh", "-c", 'mkdir -p -m 700 "$2" && printf "%s\\n" "$1" > "$2/key"', "sh", key, closed_dir)
    try:
        closed = inventory_copy(lab, tmp_path, "closed.ini",
                                main_vars={**public, "llama_server_api_key_file": f"{closed_dir}/key"})
        r = deploy(closed)
        assert r.rc == 1, failures(r)
        (failed,) = r.results("failed")
        assert failed["task"] == "api key file" and "cannot read" in failed["msg"], failed
        assert key not in r.stdout + r.stderr
        assert "bind 127.0.0.1:8080" in sh(lab, "main", "cat", FRONT_CONFIG)  # stopped before the front
    finally:
        sh(lab, "main", "rm", "-rf", "--", closed_dir)
    try:
        r = tunnelspec("deploy", str(inv), "--diff", "-v", timeout=DEPLOY_TIMEOUT)
        assert r.rc == 0, failures(r)
        assert key not in r.stdout + r.stderr
        assert "--api-key-file" in r.stdout  # the unit diff shows the flag, never the key
        # The key is checked by llama-server (on loopback, behind the front); the front binds main's address.
        unit = configured_cmdline(lab)
        assert f"--api-key-file {KEY_FILE}" in unit and "--host 127.0.0.1" in unit, unit
        assert f"bind {main_ip}:8080 ssl crt" in sh(lab, "main", "cat", FRONT_CONFIG)
        assert key not in unit
        assert sh(lab, "main", "stat", "-c", "%a %U", KEY_FILE).split() == ["600", "tunnelspec-llama"]
        ver = tunnelspec("verify", str(inv), "--format", "json", "-v", timeout=600)
        assert ver.rc == 0, failures(ver)
        assert verify_stats(ver)[1] > 0
        assert key not in ver.stdout + ver.stderr
        # A public bind serves TLS (the inventory's CA, pinned by the client; tests/deploy/test_tls_lab.py
        # has the rest): the key is checked on every path.
        ca = tmp_path / "public.ini.tls" / "ca.crt"
        url = f"https://{main_ip}:8080/completion"
        assert _http_from(lab, "rpc-b", url, None, ca) == 401
        assert _http_from(lab, "rpc-b", url, "wrong-" + key[:8], ca) == 401
        assert _http_from(lab, "rpc-b", url, key, ca) == 200
        # --metrics is on: the counters and the slots (prompts) need the key too.
        for path in ("/metrics", "/slots", "/props"):
            assert _http_from(lab, "rpc-b", f"https://{main_ip}:8080{path}", None, ca) == 401, path
        again = deploy(inv)
        assert again.rc == 0 and again.recap["main"]["changed"] == 0, again.results("changed")
        assert key not in again.stdout + again.stderr
        st = tunnelspec("status", str(inv), "--format", "json", timeout=120)
        assert st.rc == 0 and json.loads(st.stdout)["hosts"]["main"]["llama_server"]["health"] == "ok", st.stdout
    finally:
        converge(lab.inventory)
        sh(lab, "main", "rm", "-f", "--", KEY_FILE)
    unit = configured_cmdline(lab)
    assert "--host 127.0.0.1" in unit and "--api-key-file" not in unit
    assert "IPAddressDeny=any" in sh(lab, "main", "systemctl", "cat", UNIT)
    assert "bind 127.0.0.1:8080\n" in sh(lab, "main", "cat", FRONT_CONFIG)
    assert _http_from(lab, "rpc-b", f"http://{main_ip}:8080/completion", None) == 0  # nothing listens there
