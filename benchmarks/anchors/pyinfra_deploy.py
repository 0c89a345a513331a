"""The generic 8-task playbook as a pyinfra 3 deploy (benchmarks/noop.py --anchors).
Host data (root, repo, commit) comes from the inventory noop.py writes."""

from io import StringIO

from pyinfra import host
from pyinfra.operations import files, git, server

root = host.data.root
files.directory(name="app directory", path=f"{root}/app", mode="755")
files.template(name="config file", src="app.conf.j2", dest=f"{root}/app/app.conf", mode="644",
               inventory_hostname=host.data.name)
git.repo(name="source checkout", src=host.data.repo, dest=f"{root}/src", branch=host.data.commit, pull=False)
files.line(name="setting line", path=f"{root}/app/settings.conf", line="^tuned =", replace="tuned = yes")
server.shell(name="one-off init", commands=[f"test -e {root}/app/initialised || touch {root}/app/initialised"])
files.put(name="unit file", src=StringIO("[Unit]\nDescription=demo\n"), dest=f"{root}/app/demo.service", mode="644")
files.put(name="script", src=StringIO("#!/bin/sh\necho hi\n"), dest=f"{root}/app/run.sh", mode="755")
files.link(name="current link", path=f"{root}/current", target=f"{root}/app")
