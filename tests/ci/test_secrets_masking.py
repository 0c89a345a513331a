"""Secrets never reach the output: values of variables named *_password, *_secret, *_token,
*api_key (inventory or -e) are masked in messages, --diff and JSON; no_log hides a whole result."""

from __future__ import annotations

from support.ci_cli import ci_env, cli

DB_PASSWORD = "hunter2-Xq9-not-a-real-password"
API_KEY = "sk-live-4f1b0c9e7d2a-TESTONLY"

PLAYBOOK = """
- hosts: all
  tasks:
    - name: app config with secrets
      copy:
        dest: "{{ root }}/app.env"
        content: "DB_PASSWORD={{ db_password }}\\nAPI_KEY={{ openai_api_key }}\\nPORT=8080\\n"
        mode: "0600"
    - name: hidden result
      no_log: true
      command: {argv: [sh, -c, "echo the-token-is-{{ inventory_hostname }}; exit 3"]}
"""


def test_secrets_are_masked_everywhere(sshd_target, tmp_path):
    t = sshd_target
    inv = tmp_path / "secret.ini"
    inv.write_text(t.inventory.read_text() + f"db_password={DB_PASSWORD}\n")
    pb = tmp_path / "secret.yml"
    pb.write_text(PLAYBOOK)
    env = ci_env(tmp_path / "home", TUNNELSPEC_SSH_KEY=t.key_text, TUNNELSPEC_KNOWN_HOSTS=t.known_hosts_text)
    runs = [cli("play", str(inv), str(pb), "--check", "--diff", "--format", "json", "-e", f"openai_api_key={API_KEY}",
                env=env),
            cli("play", str(inv), str(pb), "--diff", "-e", f"openai_api_key={API_KEY}", "-v", env=env)]
    for res in runs:
        out = res.stdout + res.stderr
        assert DB_PASSWORD not in out and API_KEY not in out, out
        assert "DB_PASSWORD=***" in out and "API_KEY=***" in out and "PORT=8080" in out, out
        assert "the-token-is" not in out and "output hidden (no_log: true)" in out
    assert runs[1].rc == 1  # the no_log command failed, and its failure is hidden too
    app_env = next(p for p in (tmp_path.glob("sshd-*/ci0/root/app.env")))
    assert f"DB_PASSWORD={DB_PASSWORD}" in app_env.read_text()  # the host got the real value
