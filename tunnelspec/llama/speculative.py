"""Which speculative-decoding type a build offers, the argv that selects it, and which
llama-server flags tunnelspec owns (so `llama_server_extra_args` may not repeat them). Pure: it
reads a parsed `--help` (`flags.ServerHelp`) and nothing else.

Builds differ (see docs/speculative.md):
- recent builds list `--spec-type none,draft-simple,draft-eagle3,draft-mtp,draft-dflash,…`, and a
  draft model without `--spec-type draft-simple` is loaded and then silently freed;
- older builds (≈b9093) have a `--spec-type` for the ngram kinds only, reject `draft-simple`, and the
  draft model alone turns speculation on: there "draft-simple" is implicit and no flag is passed.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunnelspec.core.constants import DRAFT_TYPES
from tunnelspec.llama.flags import ServerHelp, _is_number

# The draft-model kinds tunnelspec deploys (a draft on the remote device). The ngram kinds need no
# draft model and are not tunnelspec's job.
DEFAULT_TYPE = "draft-simple"
SPEC_TYPE_FLAGS = ("--spec-type",)

# Every spelling (in any known build) of a flag tunnelspec sets itself → the inventory variable to
# use instead. At plan time the build's own alias groups extend this: a new alias of an owned flag
# is owned too.
OWNED_FLAGS: dict[str, str] = {}
for _var, _names in (
    ("the [rpc] group (tunnels)", ("--rpc",)),
    ("llama_server_host", ("--host",)),
    ("llama_server_port", ("--port",)),
    ("llama_model", ("-m", "--model")),
    ("llama_target_devices", ("-dev", "--device")),
    ("llama_draft_model", ("-md", "--model-draft", "--spec-draft-model")),
    ("rpc_role=draft on the draft node", ("-devd", "--device-draft", "--spec-draft-device")),
    ("spec_draft_ngl", ("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl")),
    ("spec_draft_n_max", ("--spec-draft-n-max", "--draft-max", "--draft", "--draft-n")),
    ("spec_type", ("--spec-type",)),
    ("llama_split_mode", ("-sm", "--split-mode")),
    ("llama_tensor_split or rpc_target_share", ("-ts", "--tensor-split")),
    ("llama_server_api_key_file", ("--api-key", "--api-key-file")),
    ("llama_server_public_bind (TLS, always) and llama_server_tls_*", ("--ssl-key-file", "--ssl-cert-file")),
):
    for _n in _names:
        OWNED_FLAGS[_n] = _var


class SpecError(Exception):
    """A request the build cannot serve; the caller turns it into the right error kind."""


@dataclass(frozen=True)
class SpecSupport:
    build: str
    flag: str | None  # the --spec-type spelling to pass, None when the draft model alone speculates
    types: tuple[str, ...]  # the draft types this build offers
    implicit: bool  # True: draft-simple is what `-md` alone does (no flag passed)

    def describe(self) -> str:
        if self.implicit:
            return "draft-simple only (the draft model alone turns speculation on; no --spec-type draft value)"
        return ", ".join(self.types)


def spec_support(h: ServerHelp) -> SpecSupport:
    flag = h.pick(*SPEC_TYPE_FLAGS)
    values = h.values(flag) if flag else []
    offered = tuple(t for t in DRAFT_TYPES if t in values)
    if DEFAULT_TYPE in offered:
        return SpecSupport(h.build, flag, offered, implicit=False)
    # No --spec-type, or one for ngram kinds only: -md alone enables (simple) speculation.
    return SpecSupport(h.build, None, (DEFAULT_TYPE,), implicit=True)


def spec_type_argv(h: ServerHelp, spec_type: str | None) -> list[str]:
    """`["--spec-type", T]`, or [] where the draft model alone speculates; SpecError naming the
    build and the types it has when it lacks `spec_type`."""
    want = spec_type or DEFAULT_TYPE
    s = spec_support(h)
    if want not in s.types:
        raise SpecError(
            f"spec_type {want} is not offered by this llama-server build ({s.build}); it has: {s.describe()}"
        )
    return [] if s.implicit or s.flag is None else [s.flag, want]  # not implicit: the build names its flag


def owned_variable(h: ServerHelp | None, flag: str) -> str | None:
    """The inventory variable that sets `flag` (any alias the build lists for it), or None."""
    names = [flag]
    if h is not None:
        opt = h._by_name().get(flag)
        if opt is not None:
            names += list(opt.names)
    return next((OWNED_FLAGS[n] for n in names if n in OWNED_FLAGS), None)


def check_extra_args(h: ServerHelp, extra: list[str]) -> None:
    """Every flag of `llama_server_extra_args` exists in this build and is not one tunnelspec sets."""
    for arg in extra:
        if not arg.startswith("-") or _is_number(arg):
            continue
        flag = arg.split("=", 1)[0]
        var = owned_variable(h, flag)
        if var is not None:
            raise SpecError(f"{flag} is set by tunnelspec; use {var} instead")
        if not h.supports(flag):
            opt = h._by_name().get(flag)
            why = "removed in" if opt is not None else "not supported by"
            raise SpecError(f"{flag} is {why} this llama-server build ({h.build})")


def split_modes(h: ServerHelp) -> list[str]:
    flag = h.pick("-sm", "--split-mode")
    return h.values(flag) if flag else []


# ---- draft-mtp: is the draft file an MTP head of this target? -------------------------------------
# An MTP head reads its own target's last hidden state (`h_nextn`) one position later. llama.cpp
# loads a separate MTP file given with `-md` as its own model (`convert_hf_to_gguf.py --mtp` writes
# one: the target's architecture, `<arch>.nextn_predict_layers` > 0, the MTP block without the
# trunk; Gemma 4's assistant is its own architecture, `gemma4-assistant`) and runs it as the MTP
# draft context on the draft device. What goes wrong otherwise, read in b11434
# (common/speculative.cpp, src/llama-context.cpp) and run with the lab's tiny models:
# - no MTP block: `llama_init_from_model` refuses the MTP context ("context type MTP requested but
#   model doesn't contain MTP layers"), llama-server exits at every start — a restart loop;
# - another hidden width than the target's: GGML_ASSERT "MTP input row width must match the target
#   h_nextn width" aborts it at start, as often;
# - another architecture of the same width: it serves, and the head proposes from a hidden state it
#   was not made for (0 of 39 drafted tokens accepted with the tiny llama target).
MTP_LAYERS_KEY = "nextn_predict_layers"
MTP_TRUNK_PROBE = "blk.0.attn_norm.weight"  # llama.cpp's own test for an MTP-only file


def _width(h) -> int | None:
    """llama_model_n_embd_out: `<arch>.embedding_length_out` when the file has it, else the width."""
    return h.arch_int("embedding_length_out") or h.arch_int("embedding_length")


def mtp_draft_refusal(target, draft, build: str, target_path: str, draft_path: str) -> str | None:
    """Why `draft` (llama/gguf_header.Header of llama_draft_model) cannot be the MTP draft of
    `target` on this build — llama-server would exit or abort at every start — or None."""
    if (draft.arch_int(MTP_LAYERS_KEY) or 0) <= 0:
        return (
            f"spec_type draft-mtp needs an MTP head as llama_draft_model, and {draft_path} has none "
            f"(architecture {draft.arch or '?'}, no {draft.arch or '<arch>'}.{MTP_LAYERS_KEY} in its header): "
            f"llama-server ({build}) would exit at every start with 'failed to create MTP context'. "
            "Give the separate MTP file of this target (convert_hf_to_gguf.py --mtp writes one), or "
            "another spec_type (draft-simple for an ordinary draft model)"
        )
    wd, wt = _width(draft), _width(target)
    if wd and wt and wd != wt:
        return (
            f"the MTP draft {draft_path} reads hidden states {wd} wide and the target {target_path} "
            f"({target.arch}) makes them {wt} wide: llama-server ({build}) would abort at every start "
            "(GGML_ASSERT: MTP input row width must match the target h_nextn width). Give the MTP file "
            "converted from this target"
        )
    return None


def mtp_draft_warnings(target, draft, draft_path: str) -> list[str]:
    """A draft-mtp draft that would serve, badly: a head of another architecture (it accepts next to
    nothing), or the whole model rather than its MTP block (all of it goes to the draft device)."""
    out = []
    if draft.arch and target.arch and draft.arch not in (target.arch, f"{target.arch}-assistant"):
        out.append(
            f"the MTP draft {draft_path} is a {draft.arch} head and the target is {target.arch}: an MTP "
            "head reads its own target's hidden state, so few drafted tokens, if any, will be accepted"
        )
    if draft.tensors is not None and MTP_TRUNK_PROBE in draft.tensors:
        out.append(
            f"{draft_path} holds the whole model and its MTP block, not the MTP block alone: llama-server "
            "loads all of it onto the draft device (the trunk unused there); an MTP-only file "
            "(convert_hf_to_gguf.py --mtp) carries the head alone"
        )
    return out
