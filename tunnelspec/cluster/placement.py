"""Where the target model's layers go, as the inventory says it: a split mode and proportions by
*name* (rpc node names, the main host's own device names), never by position — the position of an
RPC device in llama-server's list is tunnelspec's business (tunnel order), not the user's.

Two spellings, one meaning (choose one):
- per rpc node: `rpc_target_share=3` on the node's line;
- on the main host: `llama_tensor_split="rpc-a=1,rpc-b=3,CUDA0=2"`, where main's own devices may be
  named too, its CPU included: `CPU=2`. llama.cpp's `-dev` refuses the CPU as an offload device and
  `-ts` covers offload devices only; what stays on the CPU is set by `-ngl` (the layers that leave
  it), so a CPU share becomes `-ngl` from the GGUF's block count (components/server/args.py).
A node with a share carries target layers, even the draft node (the draft and some target layers
then share its rpc-server). With proportions given, every target device needs one (0 = none).
"""

from __future__ import annotations

from dataclasses import dataclass

from tunnelspec.cluster.fields import cluster_error, HostVars
from tunnelspec.cluster.vars_main import SPLIT_MODES

__all__ = ["SPLIT_MODES"]

# llama-server's -ngl, every spelling: set by tunnelspec when main's CPU keeps a share.
NGL_FLAGS = ("-ngl", "--gpu-layers", "--n-gpu-layers")


@dataclass(frozen=True)
class TargetPlacement:
    split_mode: str | None  # None: the build's default (layer)
    weights: tuple[tuple[str, float], ...] | None  # (node or local device name, weight); None: by free memory
    source: str | None  # the variable the weights came from, for error messages

    def weight_of(self, name: str) -> float | None:
        return dict(self.weights).get(name) if self.weights is not None else None


def node_share(hv: HostVars) -> float | None:
    return hv.get("rpc_target_share")


def parse_placement(
    main: HostVars, nodes: list[tuple[HostVars, str, float | None]], local_devices: tuple[str, ...]
) -> TargetPlacement:
    """`nodes`: (node vars, role, rpc_target_share) in [rpc] order."""
    mode = main.get("llama_split_mode")
    shared = [(hv, share) for hv, _, share in nodes if share is not None]
    pairs = _pairs(main)
    names = {hv.host for hv, _, _ in nodes}
    if pairs is not None and shared:
        raise shared[0][0].fail(
            "rpc_target_share",
            f"proportions are already given by llama_tensor_split on {main.host}; use one of the two (remove one)",
        )
    if pairs is None and not shared:
        return TargetPlacement(mode, None, None)
    if pairs is None:
        weights = [(hv.host, share) for hv, share in shared]
        source = "rpc_target_share"
        # A draft node without a share stays draft-only; a target node without one is an omission.
        missing = [hv.host for hv, role, share in nodes if role == "target" and share is None]
        if missing:
            # At the line of the first target node without a share: that is where one is missing.
            raise cluster_error(
                main.inv,
                main.host,
                None,
                f"rpc_target_share is set on {', '.join(h for h, _ in weights)} but not on "
                f"target node(s) {', '.join(missing)}; give every target node a share (0 = no layers)",
                line=main.inv.hosts[missing[0]].line,
            )
        missing_local = list(local_devices)
        if missing_local:
            raise main.fail(
                "llama_target_devices",
                f"with rpc_target_share the main host's own devices ({', '.join(missing_local)}) need "
                'a share too: use llama_tensor_split="<device>=W,<node>=W,..." instead',
            )
    else:
        source = "llama_tensor_split"
        weights = []
        seen = set()
        for name, weight in pairs:
            if name in seen:
                raise main.fail(source, f"{name} is given twice")
            seen.add(name)
            if name == "CPU":
                if weight > 0:
                    weights.append((name, weight))  # main's CPU keeps this share: -ngl, not -ts
                    ngl = next(
                        (a for a in main.get("llama_server_extra_args") if a.split("=", 1)[0] in NGL_FLAGS), None
                    )
                    if ngl is not None:
                        raise main.fail(
                            source,
                            f"CPU={weight:g} sets how many layers leave main's CPU (-ngl), "
                            f"and llama_server_extra_args has {ngl} too: keep one of the two",
                        )
                continue
            if name not in names and name not in local_devices:
                known = ", ".join([*sorted(names), *local_devices]) or "none"
                raise main.fail(
                    source, f"{name!r} is neither an rpc node nor a device in llama_target_devices (known: {known})"
                )
            weights.append((name, weight))
        given = {n for n, _ in weights}
        missing = [hv.host for hv, role, _ in nodes if role == "target" and hv.host not in given]
        missing += [d for d in local_devices if d not in given]
        if missing:
            raise main.fail(
                source,
                f"no proportion for target device(s) {', '.join(missing)}; give each "
                "one (0 = no layers), e.g. " + ",".join(f"{m}=1" for m in missing),
            )
    if not any(w > 0 for _, w in weights):
        raise main.fail(source, "every proportion is 0: give at least one target device a positive share")
    return TargetPlacement(mode, tuple(weights), source)


def _pairs(main: HostVars) -> list[tuple[str, float]] | None:
    return main.get("llama_tensor_split")
