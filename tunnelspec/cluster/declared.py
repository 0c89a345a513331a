"""Every variable tunnelspec reads, declared once (vardecl.Var): Ansible's connection variables,
every host's, the main host's. Validation (`tunnelspec check`, the cluster model), the defaults the
playbooks see (schema.settled), the known names (fields.KNOWN_VARS) and the docs' variable table
(`python -m tunnelspec.cluster.schema --markdown`) are all read from here."""

from __future__ import annotations

from tunnelspec.cluster.vardecl import Var
from tunnelspec.cluster.vars_ansible import ANSIBLE_VARS
from tunnelspec.cluster.vars_hosts import HOST_VARS
from tunnelspec.cluster.vars_main import MAIN_VARS

DECLARED: dict[str, Var] = {v.name: v for v in (*ANSIBLE_VARS, *HOST_VARS, *MAIN_VARS)}
