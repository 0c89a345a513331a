"""llama_source: the llama.cpp checkout of a host at `{root}/src/llama.cpp`: the pinned commit,
detached, plus the patch stack applied reproducibly, and its tree hash recorded.

check (read-only, one command): compares the stored stack fingerprint and HEAD with what the
inventory asks for and refuses to touch local modifications unless `force_clean`.
apply: clone/fetch, check out the base, then each patch in order — one commit of a PR
(`{pr, commit}`), a whole PR up to its pinned head (`{pr, head}`: every commit from the merge base
with the base commit, oldest first; merges refused), one commit of another remote, a patch file
shipped from the controller (`git apply --index`) — committed with a fixed identity and date.
A patch that does not apply is aborted, so the checkout stays clean for the next run.

Registers `llama_src` = {commit, head, tree, dir, repo, patches: [{id, commit, tree}],
build_number, build_number_source}; the `tree_hash` gate compares it across hosts.
"""

from __future__ import annotations

import posixpath

import tunnelspec.components.source.gate  # noqa: F401 - registers the tree_hash gate with the playbooks
from tunnelspec.core.errors import TaskFailed
from tunnelspec.components.source import controller_repo as cr
from tunnelspec.llama import source_stack as ss
from tunnelspec.modules.base import Arg, Diff, Task, change, ok, register_task

_SHOW_DIRTY = 8


def _git(d: str, *args: str, env: bool = False) -> list[str]:
    pre = ["env", *(f"{k}={v}" for k, v in ss.GIT_IDENTITY_ENV.items())] if env else []
    return [*pre, "git", *ss.GIT_CONFIG_ARGS, "-C", d, *args]


def _tail(text: str, n: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


@register_task
class LlamaSource(Task):
    """The pinned llama.cpp commit with its patch stack applied, on a tunnelspec branch; registers `llama_src` (commit, tree hash, patches)."""

    module = "llama_source"
    args = {
        "repo": Arg(
            str, required=True, help="Where to fetch llama.cpp from (URL, path, or `controller:PATH` to push a bundle)."
        ),
        "commit": Arg(str, required=True, help="The pinned commit: a full 40-hex SHA."),
        "root": Arg(
            str, required=True, help="tunnelspec's directory on the host: the checkout is `<root>/src/llama.cpp`."
        ),
        "patches": Arg(
            list,
            default=[],
            help="The patch stack (`llama_patches`), applied in order: one commit of a PR `{pr, commit}`, "
            "a whole PR up to its head `{pr, head}`, one commit of another remote "
            "`{remote, ref, commit}`, a patch file `{file}` (git apply). SHAs: full 40 hex.",
        ),
        "force_clean": Arg(bool, default=False, help="Reset a modified checkout instead of failing."),
        "build_number": Arg(int, help="Override the build number derived from the source (`llama_build_number`)."),
    }

    @property
    def dir(self) -> str:
        return posixpath.join(self.p["root"], "src", "llama.cpp")

    def _base_dir(self, ctx):
        return ctx.inventory_dir

    def _patches(self, ctx) -> list[ss.PatchSpec]:
        return ss.parse_patches(self.p["patches"], self._base_dir(ctx))

    @property
    def pushed(self) -> bool:
        """llama_repo=controller:PATH: hosts get the commits as a bundle and never fetch."""
        return cr.is_controller_repo(self.p["repo"])

    def _origin(self, ctx) -> str:
        return cr.canonical(self.p["repo"], self._base_dir(ctx)) if self.pushed else self.p["repo"]

    def _needed(self, patches) -> list[str]:
        return [self.p["commit"], *(p.commit for p in patches if p.kind != "file")]

    async def _refuse_non_sha(self, ctx) -> None:
        # The Cluster model refuses this at validation; kept here for playbooks run without one.
        ref = self.p["commit"]
        res = await ctx.conn.probe(["git", "ls-remote", "--", self.p["repo"], ref], timeout=60)
        shas = sorted({line.split()[0] for line in res.stdout.splitlines() if line.strip()})
        hint = (
            f'pin the full SHA: llama_commit="{shas[0]}"'
            if len(shas) == 1
            else f"it resolves to {', '.join(shas)}; pin one full SHA"
            if shas
            else f"resolve it with `git rev-parse '{ref}^{{commit}}'` and pin the full SHA"
        )
        raise TaskFailed(f"llama_commit {ref!r} is not a full 40-hex commit SHA (tags and branches move); {hint}")

    def _state_argv(self, commit: str) -> list[str]:
        return ["sh", "-c", ss.STATE_SCRIPT, "sh", self.dir, commit]

    def probes(self) -> list[list[str]]:
        commit = str(self.p["commit"]).strip().lower()
        return [self._state_argv(commit)] if ss.FULL_SHA.match(commit) else []

    async def check(self, ctx):
        commit = str(self.p["commit"]).strip().lower()
        if not ss.FULL_SHA.match(commit):
            if self.pushed:
                raise TaskFailed(
                    f"llama_commit {commit!r} is not a full 40-hex commit SHA; pin one "
                    "(git rev-parse '<ref>^{commit}' in the controller repository)"
                )
            await self._refuse_non_sha(ctx)
        self.p["commit"] = commit
        patches = self._patches(ctx)
        fp = ss.fingerprint(commit, patches)
        res = await ctx.conn.probe(self._state_argv(commit), check=True)
        st = ss.parse_state(res.stdout)
        wanted = f"{commit[:12]} + {len(patches)} patch(es)"
        self._register(ctx, commit, patches, st, pending=True)
        origin = self._origin(ctx)
        if self.pushed:
            missing = (
                self._needed(patches)
                if st.absent
                else await cr.missing_on_host(ctx.conn, self.dir, self._needed(patches))
            )
            if missing:
                wanted += f", sending a git bundle from the controller ({len(missing)} commit(s) missing)"
        if st.absent:
            how = "create" if self.pushed else "clone"
            return change(f"{how} {origin} and check out {wanted}", Diff("", wanted, self.dir))
        if st.operation:
            return change(
                f"abort the interrupted {st.operation} and check out {wanted}", Diff(st.operation, wanted), abort=True
            )
        if st.dirty:
            shown = "\n".join(f"  {line}" for line in st.dirty[:_SHOW_DIRTY])
            if not self.p["force_clean"]:
                raise TaskFailed(
                    f"{self.dir} has local modifications:\n{shown}\nnothing was discarded: commit or "
                    "remove them on the host, or set llama_force_clean=true to discard them"
                )
            return change(
                f"discard local modifications (llama_force_clean) and check out {wanted}",
                Diff("\n".join(st.dirty), wanted),
                discard=True,
            )
        rec = st.stack or {}
        before = f"{(st.head or 'none')[:12]}"
        if st.origin != origin:
            return change(
                f"set origin to {origin} (was {st.origin}) and check out {wanted}", Diff(str(st.origin), origin)
            )
        if rec.get("fingerprint") != fp or rec.get("head") != st.head or rec.get("tree") != st.tree:
            return change(f"check out {wanted} (was {before})", Diff(before, wanted))
        self._register(ctx, commit, patches, st, pending=False)
        return ok(f"at {commit[:12]} + {len(patches)} patch(es), tree {(st.tree or 'none')[:12]}")

    def _register(self, ctx, commit, patches, st: ss.SourceState, pending: bool) -> None:
        number = self.p["build_number"]
        source: str | None = "inventory"
        if number is None:
            number = ss.build_number_from_describe(st.describe)
            source = f"git tag ({st.describe})" if number is not None else None
        rec = st.stack or {}
        steps = rec.get("patches", []) if not pending else [{"id": p.id} for p in patches]
        ctx.register(
            "llama_src",
            {
                "commit": commit,
                "head": None if pending else st.head,
                "tree": None if pending else st.tree,
                "dir": self.dir,
                "repo": self.p["repo"],
                "patches": steps,
                "pending": pending,
                "build_number": number,
                "build_number_source": source,
            },
        )

    # ---- apply -------------------------------------------------------------------------------
    async def apply(self, ctx, ch):
        run, d, commit = ctx.conn.run, self.dir, self.p["commit"]
        patches = self._patches(ctx)
        if ch.data.get("abort") or ch.data.get("discard"):
            await run(
                [
                    "sh",
                    "-c",
                    'cd -- "$1" && { git cherry-pick --abort || true; git rebase --abort || true; '
                    "git am --abort || true; } 2>/dev/null; "
                    # No HEAD yet: a repo made by a killed run before its first commit arrived.
                    "{ ! git rev-parse -q --verify HEAD >/dev/null || git reset -q --hard; } && git clean -fdq",
                    "sh",
                    d,
                ],
                check=True,
            )
        st = ss.parse_state((await run(["sh", "-c", ss.STATE_SCRIPT, "sh", d, commit], check=True)).stdout)
        origin = self._origin(ctx)
        applying = posixpath.join(d, ss.APPLYING_FILE)
        if st.absent:
            await run(["mkdir", "-p", posixpath.dirname(d)], check=True)
            if self.pushed:
                # The origin URL only records where the source came from: the host never fetches it.
                make, arg = 'git init --quiet -- "$2" && git -C "$2" remote add origin "$1"', origin
            else:
                make, arg = 'git clone --quiet --no-checkout -- "$1" "$2"', self.p["repo"]
            # Made beside and renamed into place with its "applying" mark: a killed clone leaves only
            # the scratch dir (removed next time), never a checkout without its files.
            async with ctx.heartbeat(f"git clone {self.p['repo']}" if not self.pushed else f"git init {d}"):
                await run(
                    [
                        "sh",
                        "-c",
                        f'rm -rf -- "$2" && {make} && touch -- "$2/.git/tunnelspec-applying" && '
                        '{ rmdir -- "$3" 2>/dev/null; mv -T -- "$2" "$3"; }',
                        "sh",
                        arg,
                        d + ".tunnelspec-clone",
                        d,
                    ],
                    check=True,
                    timeout=3600,
                )
        else:
            await run(["touch", "--", applying], check=True)
            if st.origin != origin:
                await run(_git(d, "remote", "set-url", "origin", origin), check=True)
        # A half-applied stack must never look finished: drop the record first.
        await run(["rm", "-f", "--", posixpath.join(d, ss.STACK_FILE)], check=True)
        if self.pushed:
            await self._push_commits(ctx, patches)
        else:
            await self._ensure_commit(ctx, commit)
        await run(_git(d, "checkout", "--quiet", "--detach", "--force", commit), check=True)
        steps = []
        for patch in patches:
            await self._apply_patch(ctx, patch)
            head, tree = await self._head_tree(ctx)
            steps.append({"id": patch.id, "commit": head, "tree": tree})
        head, tree = await self._head_tree(ctx)
        # A ref keeps the patched commits from being garbage-collected while detached.
        await run(_git(d, "update-ref", "refs/tunnelspec/stack", head), check=True)
        record = ss.stack_record(ss.fingerprint(commit, patches), commit, head, tree, steps)
        await ctx.conn.put(record, posixpath.join(d, ss.STACK_FILE), mode=0o644)
        await run(["rm", "-f", "--", applying], check=True)

    async def _push_commits(self, ctx, patches) -> None:
        needed = self._needed(patches)
        if not await cr.missing_on_host(ctx.conn, self.dir, needed):
            return
        path = cr.path_of(self.p["repo"], self._base_dir(ctx))
        try:
            cr.check(path, self.p["commit"], needed[1:])
            size, basis = await cr.send_bundle(
                ctx.conn,
                self.dir,
                path,
                self.p["commit"],
                needed[1:],
                progress=lambda msg, pct: ctx.progress(msg, percent=pct),
            )
        except (cr.ControllerRepoError, RuntimeError) as err:
            raise TaskFailed(f"llama_repo {self.p['repo']}: {err}") from None
        ctx.progress(
            f"git bundle sent ({size / 2**20:.1f} MiB"
            + (f", on top of {basis} commit(s) the host has)" if basis else ")")
        )

    async def _head_tree(self, ctx) -> tuple[str, str]:
        res = await ctx.conn.probe(_git(self.dir, "rev-parse", "HEAD", "HEAD^{tree}"), check=True)
        head, tree = res.stdout.split()
        return head, tree

    async def _ensure_commit(self, ctx, sha: str, remote: str = "origin", refspec: str | None = None) -> None:
        d, run = self.dir, ctx.conn.run
        if (await run(_git(d, "cat-file", "-e", f"{sha}^{{commit}}"))).rc == 0:
            return
        async with ctx.heartbeat(f"git fetch {remote} (branches and tags) for {sha[:12]}"):
            await run(
                _git(d, "fetch", "--quiet", "--tags", "--", remote, "+refs/heads/*:refs/remotes/origin/*"),
                check=True,
                timeout=3600,
            )
        if (await run(_git(d, "cat-file", "-e", f"{sha}^{{commit}}"))).rc == 0:
            return
        async with ctx.heartbeat(f"git fetch {remote} {sha[:12]}"):
            res = await run(_git(d, "fetch", "--quiet", "--", remote, sha), timeout=3600)
        if res.rc != 0:
            raise TaskFailed(
                f"commit {sha} is not in {self.p['repo']} (fetched all branches and tags): {_tail(res.stderr)}"
            )

    async def _apply_patch(self, ctx, patch: ss.PatchSpec) -> None:
        d, run = self.dir, ctx.conn.run
        if patch.kind == "file":
            path = posixpath.join(d, ss.PATCH_DIR, f"{patch.sha256}.patch")
            await run(["mkdir", "-p", posixpath.dirname(path)], check=True)
            await ctx.conn.put(patch.data, path, mode=0o644)
            res = await run(_git(d, "apply", "--index", "--whitespace=nowarn", path))
            if res.rc != 0:
                # `git apply` is atomic, but reset anyway so the index is exactly HEAD's.
                await run(_git(d, "reset", "-q", "--hard"), check=True)
                raise TaskFailed(
                    f"patch {patch.id} does not apply on {ctx.host}:\n{_tail(res.stderr)}\n"
                    f"the checkout was reset to the last good step; fix or remove the patch"
                )
            res = await run(
                _git(
                    d,
                    "commit",
                    "--quiet",
                    "--no-verify",
                    "-m",
                    f"tunnelspec: apply {patch.name}\n\nsha256: {patch.sha256}",
                    env=True,
                )
            )
            if res.rc != 0:
                await run(_git(d, "reset", "-q", "--hard"), check=True)
                raise TaskFailed(
                    f"patch {patch.id} changes nothing on {ctx.host} (already in the tree?); "
                    f"remove it from llama_patches\n{_tail(res.stdout + res.stderr)}"
                )
            return
        if self.pushed:
            # The commit came in the bundle (checked on the controller); nothing to fetch.
            res = await run(_git(d, "rev-parse", "--verify", "-q", f"{patch.commit}^{{commit}}"))
            if res.rc != 0:
                raise TaskFailed(f"patch {patch.id}: commit {patch.commit} did not arrive in the bundle on {ctx.host}")
            return await self._pick(ctx, patch, res.stdout.strip())
        if patch.kind == "pr":
            source, ref = "origin", f"refs/pull/{patch.pr}/head"
        else:
            assert patch.remote and patch.ref, patch  # parse_patches requires both for a remote patch
            source, ref = patch.remote, patch.ref
        async with ctx.heartbeat(f"git fetch {source} {ref} (patch {patch.id})"):
            res = await run(_git(d, "fetch", "--quiet", "--", source, ref), timeout=3600)
        if res.rc != 0:
            raise TaskFailed(f"patch {patch.id}: cannot fetch {ref} from {source} on {ctx.host}: {_tail(res.stderr)}")
        res = await run(_git(d, "rev-parse", "--verify", "-q", f"{patch.commit}^{{commit}}"))
        if res.rc != 0:
            raise TaskFailed(
                f"patch {patch.id}: commit {patch.commit} is not in {ref} of {source} (fetched on "
                f"{ctx.host}); check the SHA against `git ls-remote {source} {ref}`"
            )
        full = res.stdout.strip()
        # The pinned commit must belong to the ref it is said to come from.
        if (await run(_git(d, "merge-base", "--is-ancestor", full, "FETCH_HEAD"))).rc != 0:
            moved = (
                " (was the PR force-pushed? review its current head and pin that)"
                if patch.whole
                else "; pin a commit of that ref"
            )
            raise TaskFailed(
                f"patch {patch.id}: commit {full[:12]} is not on {ref} of {source} (fetched on {ctx.host}){moved}"
            )
        await self._pick(ctx, patch, full)

    async def _pick(self, ctx, patch: ss.PatchSpec, full: str) -> None:
        """One commit, or for a whole-PR entry every commit from llama_commit up to the PR's head."""
        if not patch.whole:
            return await self._cherry_pick(ctx, patch, [full])
        res = await ctx.conn.probe(
            _git(self.dir, "rev-list", "--reverse", "--topo-order", "--parents", f"{self.p['commit']}..{full}"),
            check=True,
            timeout=600,
        )
        commits = ss.pr_commits(res.stdout, patch, self.p["commit"], ctx.host)
        await self._cherry_pick(ctx, patch, commits)
        ctx.progress(
            f"{patch.id}: {len(commits)} commit(s) cherry-picked in order, {commits[0][:12]}..{commits[-1][:12]}"
        )

    async def _cherry_pick(self, ctx, patch: ss.PatchSpec, commits: list[str]) -> None:
        d, run = self.dir, ctx.conn.run
        res = await run(_git(d, "cherry-pick", "--allow-empty-message", *commits, env=True), timeout=1800)
        if res.rc != 0:
            # CHERRY_PICK_HEAD names the commit that stopped the sequence; read it before the abort.
            stopped = (await run(_git(d, "rev-parse", "-q", "--verify", "CHERRY_PICK_HEAD"))).stdout.strip()
            await run(
                ["sh", "-c", 'cd -- "$1" && { git cherry-pick --abort 2>/dev/null; git reset -q --hard; }', "sh", d],
                check=True,
            )
            which = stopped or commits[0]
            at = (
                f" (commit {commits.index(which) + 1} of {len(commits)})"
                if len(commits) > 1 and which in commits
                else ""
            )
            raise TaskFailed(
                f"patch {patch.id} does not apply on {ctx.host} (cherry-pick of {which[:12]}{at} "
                f"failed):\n{_tail(res.stdout + res.stderr)}\nthe cherry-pick was aborted and the "
                "checkout is clean; fix or remove the patch"
            )
